// launch: the launcher's wait for its workers and a worker's failure report (launch.h).
#include "tools/launch.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// The first report: its code and sender (0: none yet). Written by the handler only.
static volatile sig_atomic_t reported_code;
static volatile sig_atomic_t reported_pid;

static void on_report(int signal_number, siginfo_t *info, void *context) {
    (void)signal_number;
    (void)context;
    if (reported_code != 0 || info->si_code != SI_QUEUE) return;
    int code = info->si_value.sival_int;
    reported_pid = (sig_atomic_t)info->si_pid;
    reported_code = code >= 1 && code <= 255 ? code : 1;
}

int launch_prepare(void) {
    reported_code = 0;
    reported_pid = 0;
    struct sigaction sa;
    sa.sa_sigaction = on_report;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return -1;
    char pid[24];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    return setenv(LAUNCH_PARENT_ENV, pid, 1);
}

void launch_report_failure(int code) {
    const char *launcher = getenv(LAUNCH_PARENT_ENV);
    if (launcher == NULL) return;
    char *end = NULL;
    long pid = strtol(launcher, &end, 10);
    if (end == launcher || *end != '\0' || pid <= 1 || (pid_t)pid != getppid()) return;
    union sigval value;
    value.sival_int = code >= 1 && code <= 255 ? code : 1;
    sigqueue((pid_t)pid, SIGUSR1, value);
}

static double launch_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The workers being waited for, and the run's first failure.
typedef struct launch_run {
    const pid_t *pids;
    uint32_t count, left;             // workers, and those still running
    bool running[LAUNCH_WORKERS_MAX];
    int rc;                           // the first failure's code (0: no failure yet)
    double kill_at;                   // after a failure: when the workers left get SIGKILL
} launch_run;

// Sends `signal_number` to every worker still there but `except` (0: none).
static void launch_signal(const launch_run *w, pid_t except, int signal_number) {
    for (uint32_t r = 0; r < w->count; r++) {
        if (w->running[r] && w->pids[r] != except) kill(w->pids[r], signal_number);
    }
}

// A failure with exit code `code`: the first one ends the workers left but `except` (the one that
// reported it, which gets the grace to close) and sets the time to kill those still there.
static void launch_fail(launch_run *w, int code, pid_t except, double grace_seconds) {
    if (w->rc != 0) return;
    w->rc = code;
    launch_signal(w, except, SIGTERM);
    w->kill_at = launch_now() + grace_seconds;
}

// A 10 ms tick: the loop polls, so that a report, an exit and the grace's end are all seen
// without a signal-safe wait on several sources.
#define LAUNCH_TICK_NS 10000000L

int launch_wait(const pid_t *pids, uint32_t count, double grace_seconds) {
    // The terminal's Ctrl-C reaches the workers (the default action ends them); the launcher
    // stays to collect them.
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    if (count > LAUNCH_WORKERS_MAX) abort();  // the command line allows no more
    launch_run w = {.pids = pids, .count = count};
    for (uint32_t r = 0; r < count; r++) {
        w.running[r] = pids[r] > 0;
        w.left += w.running[r];
    }
    // The others would wait for a missing rank in their first collective.
    if (w.left < count) launch_fail(&w, 1, 0, grace_seconds);
    bool killed = false;
    while (w.left > 0) {
        int st = 0;
        pid_t done = waitpid(-1, &st, WNOHANG);
        if (done < 0 && errno != EINTR) break;  // no child left to wait for
        if (done > 0) {
            for (uint32_t r = 0; r < count; r++) {
                if (pids[r] != done || !w.running[r]) continue;
                w.running[r] = false;
                w.left--;
                int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                if (code != 0) launch_fail(&w, code, 0, grace_seconds);
            }
            continue;
        }
        if (reported_code != 0) {
            launch_fail(&w, (int)reported_code, (pid_t)reported_pid, grace_seconds);
        }
        if (w.rc != 0 && !killed && launch_now() >= w.kill_at) {
            launch_signal(&w, 0, SIGKILL);
            killed = true;
        }
        struct timespec tick = {0, LAUNCH_TICK_NS};
        nanosleep(&tick, NULL);
    }
    return w.rc;
}
