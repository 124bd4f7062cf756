#include "runtime/base/pool.h"

#include <pthread.h>
#include <signal.h>  // pthread_sigmask: signals go to the threads that handle them
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>  // sysconf

#include "runtime/base/status.h"  // QT_ASSERT

// One job at a time. `lock` guards everything but `next`, which the threads take tasks from.
// `busy` counts the threads inside the current job: a worker joins it under the lock (copying
// fn, ctx and tasks) and leaves it under the lock, so pool_run knows when the last task has
// returned, and a worker that wakes late (after the job's tasks were all taken) finds none left.
// A new job's `next` is reset only once `busy` is zero, so such a late worker can never take a
// task of the next job with the previous job's function.
static struct {
    pthread_mutex_t turn;  // pool_run callers and pool_start/pool_stop take turns
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    bool started, stopping;
    uint32_t workers;  // started workers; thread indices 1..workers
    pthread_t ids[POOL_THREADS_MAX];
    uint64_t generation;  // one per job
    pool_task_fn *fn;
    void *ctx;
    uint32_t tasks;
    uint32_t busy;
    atomic_uint next;
} pool = {
    .turn = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .work = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

static void pool_take_tasks(pool_task_fn *fn, void *ctx, uint32_t tasks, uint32_t thread) {
    for (;;) {
        uint32_t task = atomic_fetch_add_explicit(&pool.next, 1u, memory_order_relaxed);
        if (task >= tasks) return;
        fn(ctx, task, thread);
    }
}

static void *pool_worker(void *arg) {
    uint32_t thread = (uint32_t)(uintptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    uint64_t seen = pool.generation;
    for (;;) {
        while (pool.generation == seen && !pool.stopping) pthread_cond_wait(&pool.work, &pool.lock);
        if (pool.stopping) break;
        seen = pool.generation;
        pool_task_fn *fn = pool.fn;
        void *ctx = pool.ctx;
        uint32_t tasks = pool.tasks;
        pool.busy++;
        pthread_mutex_unlock(&pool.lock);
        pool_take_tasks(fn, ctx, tasks, thread);
        pthread_mutex_lock(&pool.lock);
        if (--pool.busy == 0) pthread_cond_signal(&pool.done);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

uint32_t pool_threads_default(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) return 1;
    return online < POOL_THREADS_MAX ? (uint32_t)online : POOL_THREADS_MAX;
}

void pool_start(uint32_t threads) {
    QT_ASSERT(threads <= POOL_THREADS_MAX);
    if (threads == 0) threads = pool_threads_default();
    pthread_mutex_lock(&pool.turn);
    pthread_mutex_lock(&pool.lock);
    if (!pool.started) {
        pool.started = true;
        // Workers start with every signal blocked, so SIGINT and SIGTERM reach the thread that
        // installed their handlers (qtrain's loop), never a worker in the middle of a task.
        sigset_t all, previous;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &previous);
        while (pool.workers + 1 < threads &&
               pthread_create(&pool.ids[pool.workers + 1], NULL, pool_worker,
                              (void *)(uintptr_t)(pool.workers + 1)) == 0) {
            pool.workers++;
        }
        pthread_sigmask(SIG_SETMASK, &previous, NULL);
    }
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.turn);
}

void pool_stop(void) {
    pthread_mutex_lock(&pool.turn);
    pthread_mutex_lock(&pool.lock);
    pool.stopping = true;
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.lock);
    for (uint32_t t = 1; t <= pool.workers; t++) pthread_join(pool.ids[t], NULL);
    pthread_mutex_lock(&pool.lock);
    pool.workers = 0;
    pool.started = false;
    pool.stopping = false;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.turn);
}

uint32_t pool_threads(void) {
    pthread_mutex_lock(&pool.lock);
    uint32_t threads = 1 + pool.workers;
    pthread_mutex_unlock(&pool.lock);
    return threads;
}

void pool_run(uint32_t tasks, pool_task_fn *fn, void *ctx) {
    if (tasks == 0) return;
    pthread_mutex_lock(&pool.turn);
    pthread_mutex_lock(&pool.lock);
    while (pool.busy > 0) pthread_cond_wait(&pool.done, &pool.lock);  // late joiners of the last
    // The job is published whole even when no worker is woken for it: a worker still on its way
    // to an earlier job copies whatever job is current, and must find its function beside `next`.
    pool.fn = fn;
    pool.ctx = ctx;
    pool.tasks = tasks;
    pool.generation++;
    atomic_store_explicit(&pool.next, 0u, memory_order_relaxed);
    if (pool.workers > 0 && tasks > 1) pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.lock);
    pool_take_tasks(fn, ctx, tasks, 0);
    pthread_mutex_lock(&pool.lock);
    while (pool.busy > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.turn);
}

void pool_range(uint64_t count, uint32_t parts, uint32_t part, uint64_t *begin, uint64_t *end) {
    QT_ASSERT(parts >= 1 && part < parts);
    // count * part / parts, written so that nothing overflows.
    *begin = count / parts * part + count % parts * part / parts;
    *end = part + 1 < parts ? count / parts * (part + 1) + count % parts * (part + 1) / parts
                            : count;
}

typedef struct pool_ranges {
    pool_range_fn *fn;
    void *ctx;
    uint64_t count;
    uint32_t parts;
} pool_ranges;

static void pool_range_task(void *ctx, uint32_t task, uint32_t thread) {
    (void)thread;
    const pool_ranges *r = ctx;
    uint64_t begin, end;
    pool_range(r->count, r->parts, task, &begin, &end);
    r->fn(r->ctx, begin, end);
}

void pool_run_ranges(uint64_t count, uint32_t parts, pool_range_fn *fn, void *ctx) {
    QT_ASSERT(parts >= 1);
    if (parts > count) parts = count > 0 ? (uint32_t)count : 1;
    pool_ranges ranges = {fn, ctx, count, parts};
    pool_run(parts, pool_range_task, &ranges);
}

void pool_for(uint64_t count, uint64_t grain, pool_range_fn *fn, void *ctx) {
    QT_ASSERT(grain >= 1);
    uint64_t parts = count / grain;
    if (parts > POOL_RANGES_MAX) parts = POOL_RANGES_MAX;
    pool_run_ranges(count, parts > 1 ? (uint32_t)parts : 1u, fn, ctx);
}
