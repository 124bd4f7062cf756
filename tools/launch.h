// launch: the process side of `qtrain run --gpus N`. The launcher starts one worker process per
// GPU (tools/qtrain.c) and waits for them here; a worker that fails tells its launcher at once,
// before it closes its runtime.
//
// Why a worker tells: the other ranks wait for a failed one in their next collective, and a
// failed worker may itself block in its close (a GPU sync behind a collective whose peer is
// gone). The launcher would learn of the failure only when that worker exits, so the run could
// hang for good. With the report, the launcher ends the other workers at once, gives the one that
// failed LAUNCH_GRACE_SECONDS to finish its close and exit, then ends it too.
//
// Signals: the report is SIGUSR1 with the exit code as its value (sigqueue), sent only to a parent
// whose process id the launcher put in LAUNCH_PARENT_ENV, so that a worker started by hand never
// signals a shell. Workers are ended with SIGTERM (their default action: a worker has no stop
// handler, since ranks stopped at different steps could not save together), and with SIGKILL
// those still there LAUNCH_GRACE_SECONDS later.
#ifndef QT_LAUNCH_H
#define QT_LAUNCH_H

#include <stdint.h>
#include <sys/types.h>

#define LAUNCH_PARENT_ENV "QTRAIN_LAUNCHER_PID"
#define LAUNCH_GRACE_SECONDS 10.0
#define LAUNCH_WORKERS_MAX 16

// Launcher, before it starts the workers: names this process in LAUNCH_PARENT_ENV (inherited by
// the workers) and takes the workers' reports. 0, or -1 with errno.
int launch_prepare(void);

// Launcher: waits for the `count` workers (at most LAUNCH_WORKERS_MAX; pids[r] <= 0: rank r did
// not start). The first failure (a worker that did not start, a worker's report, or a worker that
// exits with a nonzero status or is killed) ends the others (SIGTERM); the reporting worker, and
// any that outlive their SIGTERM, get grace_seconds before SIGKILL.
// Returns the first failure's code (the reported code, or the exit status, 128 + the signal of a
// killed worker), 1 when a worker did not start, else 0. Ctrl-C and SIGTERM are ignored here:
// they reach the workers, which end, and the launcher collects them.
int launch_wait(const pid_t *pids, uint32_t count, double grace_seconds);

// Worker: tells its launcher that it failed with exit code `code` (1 to 255); nothing when the
// parent is not the launcher named in LAUNCH_PARENT_ENV.
void launch_report_failure(int code);

#endif  // QT_LAUNCH_H
