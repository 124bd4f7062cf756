// The launcher's wait for its workers (tools/launch.c), with child processes that stand in for
// workers: they exit, fail, hang with SIGTERM ignored, or report a failure and then hang. Every
// case must end within a bound, so an alarm fails the whole test instead of letting it hang.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/test.h"
#include "tools/launch.h"

// What a stand-in worker does.
typedef enum {
    WORKER_EXIT_0,        // exits 0 after 50 ms
    WORKER_FAIL_3,        // exits 3 after 50 ms
    WORKER_SLEEP,         // sleeps 60 s (SIGTERM ends it)
    WORKER_HANG,          // ignores SIGTERM and sleeps 60 s (only SIGKILL ends it)
    WORKER_REPORT_7_HANG  // reports code 7 to its launcher, then as WORKER_HANG
} worker_kind;

static void nap(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

static pid_t start_worker(worker_kind kind) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    switch (kind) {
    case WORKER_EXIT_0: nap(50); _exit(0);
    case WORKER_FAIL_3: nap(50); _exit(3);
    case WORKER_SLEEP: nap(60000); _exit(0);
    case WORKER_REPORT_7_HANG:
        launch_report_failure(7);
        signal(SIGTERM, SIG_IGN);
        nap(60000);
        _exit(0);
    case WORKER_HANG:
        signal(SIGTERM, SIG_IGN);
        nap(60000);
        _exit(0);
    }
    _exit(99);
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Starts the workers (a kind of -1: a rank that did not start), waits with a grace of 0.5 s, and
// checks the code, the time taken, and that no worker is left behind. parent: what the workers
// read as their launcher's process id (NULL: this process, as launch_prepare names it).
static void wait_case(const char *what, const int *kinds, uint32_t count, int expect_rc,
                      double min_s, double max_s, const char *parent) {
    // Each case takes the reports afresh (launch_wait runs once in a launcher).
    CHECK(launch_prepare() == 0, "%s: launch_prepare", what);
    if (parent != NULL) setenv(LAUNCH_PARENT_ENV, parent, 1);
    // The workers start with SIGTERM's default action, as the launcher's do (launch_wait, which
    // ignores it in this process, runs after they start): a SIGTERM that came before a child's
    // own signal() call would otherwise be lost.
    signal(SIGTERM, SIG_DFL);
    pid_t pids[LAUNCH_WORKERS_MAX];
    for (uint32_t r = 0; r < count; r++) {
        pids[r] = kinds[r] < 0 ? -1 : start_worker((worker_kind)kinds[r]);
    }
    // A report sent before the wait starts is still seen: the handler is in place before any
    // worker starts.
    double start = seconds_now();
    int rc = launch_wait(pids, count, 0.5);
    double took = seconds_now() - start;
    uint32_t left = 0;
    for (uint32_t r = 0; r < count; r++) {
        if (pids[r] > 0 && kill(pids[r], 0) == 0) left++;
    }
    CHECK(rc == expect_rc, "%s: exit code %d, expected %d", what, rc, expect_rc);
    CHECK(took >= min_s && took <= max_s, "%s: took %.3f s, expected %.2f to %.2f s", what,
          took, min_s, max_s);
    CHECK(left == 0, "%s: %u workers left running", what, left);
    for (uint32_t r = 0; r < count; r++) {
        if (pids[r] > 0) kill(pids[r], SIGKILL);
    }
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static void on_alarm(int signal_number) {
    (void)signal_number;
    static const char message[] = "FAIL launch_wait: a case hung past 60 s\n";
    ssize_t ignored = write(1, message, sizeof message - 1);
    (void)ignored;
    _exit(1);
}

static void test_wait(void) {
    test_begin("launch_wait_ends_a_failed_run");
    signal(SIGALRM, on_alarm);
    alarm(60);
    const int all_done[] = {WORKER_EXIT_0, WORKER_EXIT_0, WORKER_EXIT_0};
    wait_case("every worker exits 0", all_done, 3, 0, 0.04, 2.0, NULL);
    // The others are ended at once (they would wait for the failed one).
    const int one_fails[] = {WORKER_SLEEP, WORKER_FAIL_3};
    wait_case("one fails, the other sleeps", one_fails, 2, 3, 0.04, 0.45, NULL);
    // A worker that outlives its SIGTERM is killed after the grace.
    const int one_hangs[] = {WORKER_HANG, WORKER_FAIL_3};
    wait_case("one fails, the other ignores SIGTERM", one_hangs, 2, 3, 0.5, 2.0, NULL);
    // The failed worker hangs in its close: its report ends the run, with its code.
    const int reports[] = {WORKER_SLEEP, WORKER_REPORT_7_HANG};
    wait_case("one reports a failure and hangs", reports, 2, 7, 0.5, 2.0, NULL);
    // A rank that did not start: the others are ended, not waited for.
    const int missing[] = {WORKER_SLEEP, -1};
    wait_case("one did not start", missing, 2, 1, 0.0, 0.45, NULL);
    alarm(0);
    test_end();
}

// A worker whose parent is not the launcher named in the environment signals nobody. The name
// is a live bystander process (SIGUSR1's default action would end it), not the workers' parent:
// no report is taken, the run ends by the other worker's exit code with the reporter killed after
// the grace, and the bystander is still there.
static void test_report_needs_the_launcher(void) {
    test_begin("launch_report_only_to_its_launcher");
    const int reports[] = {WORKER_REPORT_7_HANG, WORKER_FAIL_3};
    alarm(60);
    pid_t bystander = fork();
    if (bystander == 0) {
        signal(SIGUSR1, SIG_DFL);
        nap(60000);
        _exit(0);
    }
    if (bystander < 0) {  // kill(-1) and waitpid(-1) below would reach every process and child
        CHECK(false, "fork of the bystander: %s", strerror(errno));
        alarm(0);
        test_end();
        return;
    }
    char name[24];
    snprintf(name, sizeof name, "%ld", (long)bystander);
    wait_case("a report to a parent not named", reports, 2, 3, 0.5, 2.0, name);
    // wait_case reaped the other children only; the bystander is alive unless signalled.
    int st = 0;
    CHECK(waitpid(bystander, &st, WNOHANG) == 0, "the bystander was not signalled");
    kill(bystander, SIGKILL);
    waitpid(bystander, NULL, 0);
    alarm(0);
    test_end();
}

int main(void) {
    test_wait();
    test_report_needs_the_launcher();
    return test_exit_code();
}
