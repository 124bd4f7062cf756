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

// Exit status of a test program: non-zero when any case failed.
static inline int test_exit_code(void) { return test_program_failures ? 1 : 0; }

#endif  // QT_TEST_H
