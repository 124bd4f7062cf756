// bench: the benchmark harness behind `qtrain bench ...`. Benchmarks are programs, not tests:
// they time graph replays of a program on the GPU with events and report medians, next to a
// comparison measured in the same run (a plain device copy for memory-bound kernels).
//
// Owns one GPU backend and one scratch device arena per case (bench_case_begin/end); tool code,
// so it may allocate.
#ifndef QT_BENCH_H
#define QT_BENCH_H

#include <stdio.h>

#include "backend.h"

typedef struct bench_env {
    backend gpu;
    arena dev;
    arena host;
    program prog;
    FILE *out;
    int repeats;              // timed graph replays per measurement
    int warmup;               // untimed replays before them
    double copy_gbps;         // plain device copy, measured at start (bytes read + written)
} bench_env;

// Starts a case: fresh arenas and an empty program (reserve regions, append ops, then time).
void bench_case_begin(bench_env *env);
// Binds, resolves, captures the program as one graph and returns the median milliseconds per
// replay over env->repeats replays (after warm-up). Returns a negative value on failure, with
// the reason printed.
double bench_time_program(bench_env *env);
void bench_case_end(bench_env *env);

// Region helpers for cases.
prog_ref bench_reserve(bench_env *env, const char *name, uint64_t bytes);

// GB/s of a plain device copy of `bytes` (read) + `bytes` (written), timed like a case; it uses
// its own case arenas, so call it between cases. Negative on failure.
double bench_copy_gbps(bench_env *env, uint64_t bytes);

// The families' common table: a header, and one row per case with the time, the bandwidth of
// `bytes` (the minimal bytes moved) and its ratio to the 1 GiB copy and to a copy of the same
// size measured right then (bench_copy_gbps of bytes / 2). Call the row between cases.
void bench_print_header(bench_env *env);
void bench_print_row(bench_env *env, const char *format, const char *shape, const char *layout,
                     double ms, double bytes);

// GB/s from bytes moved and milliseconds.
static inline double bench_gbps(double bytes, double ms) { return bytes / (ms * 1e6); }

// The families' benchmarks; each prints its own table rows.
void bench_quant_fp8(bench_env *env);
void bench_quant_mxfp8(bench_env *env);
void bench_quant_block(bench_env *env);
void bench_quant_nvfp4(bench_env *env);
void bench_gemm(bench_env *env);

int bench_main(int argc, char **argv);

#endif  // QT_BENCH_H
