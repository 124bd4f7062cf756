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

// Sends `signal_number` to every worker still there but `except` (0: none).
static void launch_signal(const pid_t *pids, const bool *running, uint32_t count, pid_t except,
                          int signal_number) {
    for (uint32_t r = 0; r < count; r++) {
        if (running[r] && pids[r] != except) kill(pids[r], signal_number);
    }
}

// A 10 ms tick: the loop polls, so that a report, an exit and the grace's end are all seen
// without a signal-safe wait on several sources.
#define LAUNCH_TICK_NS 10000000L

int launch_wait(const pid_t *pids, uint32_t count, double grace_seconds) {
    // The terminal's Ctrl-C reaches the workers (the default action ends them); the launcher
    // stays to collect them.
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    bool running[LAUNCH_WORKERS_MAX];
    if (count > LAUNCH_WORKERS_MAX) abort();  // the command line allows no more
    int rc = 0;
    uint32_t left = 0;
    for (uint32_t r = 0; r < count; r++) {
        running[r] = pids[r] > 0;
        left += running[r];
    }
    double kill_at = -1.0;  // when the workers still there get SIGKILL (-1: no failure yet)
    bool killed = false;
    if (left < count) {  // the others would wait for the missing rank in their first collective
        rc = 1;
        launch_signal(pids, running, count, 0, SIGTERM);
        kill_at = launch_now() + grace_seconds;
    }
    while (left > 0) {
        int st = 0;
        pid_t done = waitpid(-1, &st, WNOHANG);
        if (done < 0 && errno != EINTR) break;  // no child left to wait for
        if (done > 0) {
            for (uint32_t r = 0; r < count; r++) {
                if (pids[r] != done || !running[r]) continue;
                running[r] = false;
                left--;
                int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                if (code != 0 && kill_at < 0) {
                    rc = rc ? rc : code;
                    launch_signal(pids, running, count, 0, SIGTERM);
                    kill_at = launch_now() + grace_seconds;
                }
            }
            continue;
        }
        if (reported_code != 0 && kill_at < 0) {
            rc = rc ? rc : (int)reported_code;
            launch_signal(pids, running, count, (pid_t)reported_pid, SIGTERM);
            kill_at = launch_now() + grace_seconds;
        }
        if (kill_at >= 0 && !killed && launch_now() >= kill_at) {
            launch_signal(pids, running, count, 0, SIGKILL);
            killed = true;
        }
        struct timespec tick = {0, LAUNCH_TICK_NS};
        nanosleep(&tick, NULL);
    }
    return rc;
}
