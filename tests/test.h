// test: the tiny harness every test program includes.
//
// Owns the per-program pass/fail counters. A test program runs cases in order; each case prints
// exactly one line, `PASS name`, `FAIL name: first failure` or `SKIP name: why`, which the runner
// (tests/runner.c) counts. Test programs may allocate (they are not the library).
#ifndef QT_TEST_H
#define QT_TEST_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static const char *test_case_name;
static int test_case_failures;
static int test_program_failures;

static inline void test_begin(const char *name) {
    test_case_name = name;
    test_case_failures = 0;
}

// Prints the first few failures of a case in full; later ones are only counted, so that a broken
// kernel does not flood the log.
static inline void test_fail_at(const char *file, int line, const char *expr, const char *fmt,
                                ...) {
    test_case_failures++;
    if (test_case_failures > 8) return;
    fprintf(stdout, "  %s:%d: %s: ", file, line, expr);
    va_list args;
    va_start(args, fmt);
    vfprintf(stdout, fmt, args);
    va_end(args);
    fputc('\n', stdout);
}

#define CHECK(cond, ...) \
    ((cond) ? (void)0 : test_fail_at(__FILE__, __LINE__, #cond, __VA_ARGS__))

static inline bool test_end(void) {
    if (test_case_failures == 0) {
        printf("PASS %s\n", test_case_name);
    } else {
        printf("FAIL %s: %d check(s) failed\n", test_case_name, test_case_failures);
        test_program_failures++;
    }
    fflush(stdout);
    return test_case_failures == 0;
}

static inline void test_skip(const char *name, const char *why) {
    printf("SKIP %s: %s\n", name, why);
    fflush(stdout);
}

// QT_TEST_SHARD=i/n runs the i-th of n interleaved shares of a program's units (the calls its
// main wraps in TEST_UNIT, in a fixed order), so that n processes together run every unit
// exactly once: tools/sanitize.sh spreads a program that takes hours under a sanitizer over a
// machine's cores. Unset: one share, everything. A malformed value ends the program (exit 2).
static unsigned test_shard_index, test_shard_count, test_shard_units;

static inline bool test_shard_take(void) {
    if (test_shard_count == 0) {
        const char *text = getenv("QT_TEST_SHARD");
        unsigned index = 0, count = 1;
        char tail = 0;
        if (text && (sscanf(text, "%u/%u%c", &index, &count, &tail) != 2 || count == 0 ||
                     index >= count)) {
            fprintf(stderr, "QT_TEST_SHARD='%s': expected i/n with 0 <= i < n, e.g. 0/4\n",
                    text);
            exit(2);
        }
        test_shard_index = index;
        test_shard_count = count;
    }
    return test_shard_units++ % test_shard_count == test_shard_index;
}

#define TEST_UNIT(call)                 \
    do {                                \
        if (test_shard_take()) { call; } \
    } while (0)

// QT_TEST_SANITIZER names the compute-sanitizer tool a program runs under (tools/sanitize.sh
// sets it): a case whose check the tool itself defeats (free device memory sampled while the
// tool allocates its own) skips, saying why, instead of failing for the tool's sake.
static inline const char *test_sanitizer(void) {
    const char *tool = getenv("QT_TEST_SANITIZER");
    return tool && *tool ? tool : NULL;
}

// Exit status of a test program: non-zero when any case failed.
static inline int test_exit_code(void) { return test_program_failures ? 1 : 0; }

#endif  // QT_TEST_H
