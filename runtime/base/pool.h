// pool: a fixed set of worker threads, started once, that run the tasks of one job at a time
// beside the calling thread.
//
// Owns the workers (pthreads) and their job slot, all static, from pool_start to pool_stop (or
// the end of the process). Nothing is allocated per job: a job is a function, a context and a
// task count, and pool_run returns when every task has run.
//
// Who calls it: the reference backend runs its C twins' work through it (backend_open_ref starts
// it), data_load generates synthetic sources on it (data_load starts it too, since it runs
// before, or beside, the backend's opening), and data_feed_next gathers each batch into its
// staging slot on it (backend_open_gpu starts it for that). All start at start-up, so the threads
// exist before the first step. Any thread may call pool_run; calls from several threads take turns.
//
// Determinism, the contract every caller keeps: a job's tasks write disjoint outputs (or merge into
// a shared one with an operation whose result does not depend on the order, a maximum) and each
// task's result is a function of its index alone, never of the thread that ran it or of the order
// in which tasks ran. Threads take the next task as they become idle (a thread that the machine
// slows down takes fewer), so the same job gives the same bytes on any number of threads, one
// included. A task knows the index of the thread running it (0: the caller) for scratch memory of
// its own.
#ifndef QT_POOL_H
#define QT_POOL_H

#include <stdint.h>

// Threads a pool may have, the calling thread included.
#define POOL_THREADS_MAX 16

typedef void pool_task_fn(void *ctx, uint32_t task, uint32_t thread);

// Starts the pool, unless it runs already: `threads` threads in all (the caller and threads - 1
// workers), 0 for one per online processor; at most POOL_THREADS_MAX. A worker the system refuses
// to start is left out (the pool runs with fewer; results are the same). Thread-safe.
void pool_start(uint32_t threads);

// Joins the workers; pool_run then runs every task on the calling thread until the next
// pool_start. Tests restart the pool with other thread counts through it.
void pool_stop(void);

// Threads that run a job's tasks: 1 + the started workers (1 before pool_start).
uint32_t pool_threads(void);

// The machine's online processors, 1 to POOL_THREADS_MAX: pool_start(0)'s count.
uint32_t pool_threads_default(void);

// fn(ctx, task, thread) for every task in [0, tasks), on the workers and the calling thread;
// returns when all have run. `thread` is below pool_threads() at the call.
void pool_run(uint32_t tasks, pool_task_fn *fn, void *ctx);

// [begin, end) of part `part` of [0, count) cut into `parts` near-equal contiguous ranges.
void pool_range(uint64_t count, uint32_t parts, uint32_t part, uint64_t *begin, uint64_t *end);

typedef void pool_range_fn(void *ctx, uint64_t begin, uint64_t end);

// fn(ctx, begin, end) over [0, count) cut into `parts` ranges (pool_range), one task each.
void pool_run_ranges(uint64_t count, uint32_t parts, pool_range_fn *fn, void *ctx);

// The same in ranges of at least `grain` items (parts = count / grain, 1 to POOL_RANGES_MAX): the
// cut depends on the count alone, never on the machine.
#define POOL_RANGES_MAX 64u
void pool_for(uint64_t count, uint64_t grain, pool_range_fn *fn, void *ctx);

// The tasks' hot loops (the reference backend's twins, synthetic data) are compiled twice, for
// x86-64-v3 (AVX2 and FMA) and for the baseline x86-64 that every machine runs, and the loader
// picks one for the processor. On x86-64-v3 qt_fmaf is one instruction instead of a call into
// libm, and 8-wide vector arithmetic one instruction instead of two SSE halves. Both clones give
// the same bits: -ffp-contract=off keeps every rounding where the source puts it, and fmaf is
// correctly rounded either way. flatten inlines the callees, so that they are cloned too.
#if defined(__x86_64__)
#define POOL_CPU_CLONES __attribute__((flatten, target_clones("arch=x86-64-v3", "default")))
#else
#define POOL_CPU_CLONES
#endif

#endif  // QT_POOL_H
