// Thread pool tests (runtime/base/pool.c): every task runs once, on a thread index below the pool's
// size, for any pool size and task count; jobs from several threads take turns; ranges cover
// their count exactly.
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "runtime/base/pool.h"
#include "tests/test.h"

#define TASKS_MAX 4099

typedef struct count_job {
    atomic_uint runs[TASKS_MAX];    // per task
    atomic_uint by_thread[POOL_THREADS_MAX];
    atomic_uint bad_thread;         // tasks that were told a thread index out of range
    uint32_t threads;               // pool_threads() at the call
    uint32_t sleep_every;           // every this many tasks sleeps 100 us (0: none)
} count_job;

static void count_task(void *ctx, uint32_t task, uint32_t thread) {
    count_job *job = ctx;
    atomic_fetch_add(&job->runs[task], 1u);
    if (thread >= job->threads) {
        atomic_fetch_add(&job->bad_thread, 1u);
    } else {
        atomic_fetch_add(&job->by_thread[thread], 1u);
    }
    if (job->sleep_every && task % job->sleep_every == 0) {
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
}

// Runs `tasks` tasks; every task ran exactly once and the threads' counts add up.
static void run_counted(count_job *job, uint32_t tasks, const char *what) {
    memset(job, 0, sizeof *job);
    job->threads = pool_threads();
    job->sleep_every = 7;
    pool_run(tasks, count_task, job);
    uint32_t wrong = 0, first_wrong = 0, total = 0;
    for (uint32_t t = 0; t < tasks; t++) {
        if (atomic_load(&job->runs[t]) != 1 && wrong++ == 0) first_wrong = t;
    }
    for (uint32_t t = 0; t < POOL_THREADS_MAX; t++) total += atomic_load(&job->by_thread[t]);
    CHECK(wrong == 0, "%s: %u of %u tasks did not run exactly once (first: task %u, %u runs)",
          what, wrong, tasks, first_wrong, atomic_load(&job->runs[first_wrong]));
    CHECK(atomic_load(&job->bad_thread) == 0 && total == tasks,
          "%s: %u tasks with a thread index >= %u; %u counted of %u", what,
          atomic_load(&job->bad_thread), job->threads, total, tasks);
}

static count_job job_a, job_b;

static void test_every_task_once(void) {
    test_begin("pool_every_task_once");
    const uint32_t sizes[] = {1, 2, 3, 5, POOL_THREADS_MAX};
    const uint32_t task_counts[] = {1, 2, 3, 17, 256, TASKS_MAX};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        pool_stop();
        pool_start(sizes[s]);
        CHECK(pool_threads() >= 1 && pool_threads() <= sizes[s], "pool of %u has %u threads",
              sizes[s], pool_threads());
        for (size_t c = 0; c < sizeof task_counts / sizeof task_counts[0]; c++) {
            char what[64];
            snprintf(what, sizeof what, "%u threads, %u tasks", sizes[s], task_counts[c]);
            run_counted(&job_a, task_counts[c], what);
        }
        // Starting a running pool changes nothing.
        uint32_t before = pool_threads();
        pool_start(sizes[s] == 1 ? 2 : 1);
        CHECK(pool_threads() == before, "pool_start on a running pool: %u threads, was %u",
              pool_threads(), before);
    }
    pool_stop();
    CHECK(pool_threads() == 1, "stopped pool: %u threads", pool_threads());
    run_counted(&job_a, 33, "stopped pool");
    CHECK(atomic_load(&job_a.by_thread[0]) == 33, "a stopped pool runs tasks on the caller");
    pool_start(0);
    CHECK(pool_threads() == pool_threads_default(), "pool_start(0): %u threads, default %u",
          pool_threads(), pool_threads_default());
    pool_run(0, count_task, &job_a);  // no tasks: returns at once
    test_end();
}

// Two threads submit jobs at once, many times: each job still runs each of its tasks once.
static void *submit_many(void *arg) {
    count_job *job = arg;
    for (int i = 0; i < 50; i++) run_counted(job, 97, "concurrent caller");
    return NULL;
}

static void test_concurrent_callers(void) {
    test_begin("pool_concurrent_callers");
    pool_stop();
    pool_start(3);
    pthread_t other;
    int created = pthread_create(&other, NULL, submit_many, &job_b);
    CHECK(created == 0, "pthread_create");
    submit_many(&job_a);
    if (created == 0) pthread_join(other, NULL);
    test_end();
}

static void test_ranges(void) {
    test_begin("pool_ranges_cover_count");
    const uint64_t counts[] = {0, 1, 5, 16, 1000, UINT64_MAX / 3};
    const uint32_t parts[] = {1, 2, 3, 7, 16, 61};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
            uint64_t expect = 0, smallest = UINT64_MAX, largest = 0;
            for (uint32_t i = 0; i < parts[p]; i++) {
                uint64_t begin, end;
                pool_range(counts[c], parts[p], i, &begin, &end);
                CHECK(begin == expect && end >= begin, "count %llu parts %u: part %u is "
                      "[%llu, %llu), expected to start at %llu", (unsigned long long)counts[c],
                      parts[p], i, (unsigned long long)begin, (unsigned long long)end,
                      (unsigned long long)expect);
                expect = end;
                if (end - begin < smallest) smallest = end - begin;
                if (end - begin > largest) largest = end - begin;
            }
            CHECK(expect == counts[c] && largest - smallest <= 1,
                  "count %llu parts %u: ends at %llu, sizes %llu..%llu",
                  (unsigned long long)counts[c], parts[p], (unsigned long long)expect,
                  (unsigned long long)smallest, (unsigned long long)largest);
        }
    }
    test_end();
}

// pool_for and pool_run_ranges: every index in exactly one range, whatever the count and grain.
typedef struct ranges_job {
    atomic_uint hits[TASKS_MAX];
    atomic_uint calls;
} ranges_job;

static void mark_range(void *ctx, uint64_t begin, uint64_t end) {
    ranges_job *job = ctx;
    atomic_fetch_add(&job->calls, 1u);
    for (uint64_t i = begin; i < end; i++) atomic_fetch_add(&job->hits[i], 1u);
}

static ranges_job job_r;

static void check_marked(uint64_t count, uint32_t calls_max, const char *what) {
    uint32_t wrong = 0;
    for (uint64_t i = 0; i < count; i++) wrong += atomic_load(&job_r.hits[i]) != 1;
    CHECK(wrong == 0 && atomic_load(&job_r.calls) >= 1 && atomic_load(&job_r.calls) <= calls_max,
          "%s: count %llu: %u indices not covered once, %u calls (at most %u)", what,
          (unsigned long long)count, wrong, atomic_load(&job_r.calls), calls_max);
}

static void test_ranges_run(void) {
    test_begin("pool_for_covers_every_index");
    pool_stop();
    pool_start(3);
    const uint64_t counts[] = {0, 1, 63, 64, 1000, TASKS_MAX};
    const uint64_t grains[] = {1, 7, 64, 5000};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++) {
            memset(&job_r, 0, sizeof job_r);
            pool_for(counts[c], grains[g], mark_range, &job_r);
            uint64_t parts = counts[c] / grains[g];
            check_marked(counts[c], parts > POOL_RANGES_MAX ? POOL_RANGES_MAX
                                    : parts > 1             ? (uint32_t)parts
                                                            : 1u, "pool_for");
        }
        memset(&job_r, 0, sizeof job_r);
        pool_run_ranges(counts[c], 5, mark_range, &job_r);
        check_marked(counts[c], 5, "pool_run_ranges");
    }
    test_end();
}

int main(void) {
    test_every_task_once();
    test_concurrent_callers();
    test_ranges();
    test_ranges_run();
    return test_exit_code();
}
