// bench: the benchmark harness behind `qtrain bench ...`. Benchmarks are programs, not tests:
// they time graph replays of a program on the GPU with events and report medians, next to a
// comparison measured in the same run (a plain device copy for memory-bound kernels).
//
// Owns one GPU backend and one scratch device arena per case (bench_case_begin/end); tool code,
// so it may allocate.
#ifndef QT_BENCH_H
#define QT_BENCH_H

#include <stdio.h>

#include "runtime/backend/backend.h"
#include "tools/bench_main.h"  // bench_main

// Tables of benchmark programs and arenas: fixed sizes that any case fits (a case has a few
// ops and regions), from malloc; the caller frees the storage these return (NULL: out of
// memory, after a message).
#define BENCH_OPS 256
#define BENCH_REGIONS 256
void *bench_program_init(program *p, const char *name);
void *bench_arena_init(arena *a, arena_kind kind, const char *name);

typedef struct bench_env {
    backend gpu;
    arena dev;
    arena host;
    program prog;
    void *tables[3];          // of dev, host and prog: made by the first case, kept
    FILE *out;
    int repeats;              // timed graph replays per measurement
    int warmup;               // untimed replays before them
    double copy_gbps;         // plain device copy, measured at start (bytes read + written)
    bool quick;               // --quick: a family's short case list (gemm: the square shapes)
} bench_env;

// Starts a case: fresh arenas and an empty program (reserve regions, append ops, then time).
void bench_case_begin(bench_env *env);
// Binds the case arenas, resolves env->prog and times it with bench_time_graph.
double bench_time_program(bench_env *env);
// Captures a resolved program whose arenas are bound as one graph and returns the median
// milliseconds per replay over env->repeats replays (after env->warmup untimed ones). Returns a
// negative value on failure, with the reason printed.
double bench_time_graph(bench_env *env, const program *p);
// Work of a library outside qtrain (the GEMM comparator), issued on `stream`.
typedef qt_status (*bench_enqueue)(void *ctx, CUstream stream);
// Captures what `enqueue` issues on the bench stream as one graph and times it exactly like
// bench_time_graph, so a comparator is measured the way qtrain's own kernels are.
double bench_time_captured(bench_env *env, bench_enqueue enqueue, void *ctx);
void bench_case_end(bench_env *env);

// Region helpers for cases.
prog_ref bench_reserve(bench_env *env, const char *name, uint64_t bytes);

// A case's inputs: device regions in an arena of their own, filled once before the timed program
// runs. They cannot live in the case arenas: bench_time_program binds those itself and times all
// of env->prog, so a fill there would be timed with the kernel. Use: bench_inputs_begin, declare
// regions, bench_inputs_ready (binds and fills), then the case (bench_case_begin ... end), then
// bench_inputs_release. Keep it static: the arena is large.
#define BENCH_INPUT_FILLS_MAX 8

// Member sizes of a grouped tensor of `rows` rows: row_offsets[0..members] (padded, summing to
// rows) and first_dims[0..members) (the real rows of each member). The rules differ per family.
typedef void (*bench_member_sizes)(uint32_t rows, uint32_t members, uint32_t *row_offsets,
                                   uint32_t *first_dims);

// A declared fill, appended by bench_inputs_ready: building the (large) fill program there keeps
// it out of bench_inputs and out of the families.
typedef struct bench_input_fill {
    const char *name;
    prog_ref ref;
    uint64_t count;
    uint32_t dtype, dist;
    uint64_t seed;
    float a, b;
} bench_input_fill;

typedef struct bench_inputs {
    arena arena;
    void *table;  // the arena's, from bench_inputs_begin to bench_inputs_release
    char who[32];  // "bench <label>", the prefix of its messages
    bench_input_fill fills[BENCH_INPUT_FILLS_MAX];
    uint32_t fill_count;
    prog_ref row_offsets, first_dims;  // bench_inputs_group's arrays
    uint32_t rows, members;
    bench_member_sizes member_sizes;
} bench_inputs;

// `label` names the arena ("<label>-bench-input") and the messages ("bench <label>: ...").
void bench_inputs_begin(bench_inputs *in, const char *label);
// A region left as bind leaves it (zeroed); 0 bytes reserve 4, so every ref is a real region.
prog_ref bench_inputs_region(bench_inputs *in, const char *name, uint64_t bytes);
// A region filled with BF16 normal(0, 1) values, (bytes + 1) / 2 of them; none for 0 bytes.
prog_ref bench_inputs_bf16(bench_inputs *in, const char *name, uint64_t bytes, uint64_t seed);
// A region filled with FP32 uniform values in [lo, hi), bytes / 4 of them (lo == hi: constant).
prog_ref bench_inputs_f32(bench_inputs *in, const char *name, uint64_t bytes, uint64_t seed,
                          float lo, float hi);
// The group arrays row_offsets ((members + 1) words) and first_dims (members words), reserved
// even for a dense tensor (members 0) and written from `sizes` when members > 0.
void bench_inputs_group(bench_inputs *in, uint32_t rows, uint32_t members,
                        bench_member_sizes sizes);
// Binds the arena, writes the group arrays, runs the fills and waits. False on failure, with the
// reason printed and the arena released.
bool bench_inputs_ready(bench_env *env, bench_inputs *in);
void bench_inputs_release(bench_env *env, bench_inputs *in);

// Ends a case that reads `in`: times env->prog when `appended` (the status of appending the
// case's ops) is QT_OK, else prints the reason; then bench_case_end and bench_inputs_release.
// Returns the median milliseconds, negative on failure.
double bench_case_finish(bench_env *env, bench_inputs *in, qt_status appended);

// GB/s of a plain device copy of `bytes` (read) + `bytes` (written), timed like a case; it uses
// its own case arenas, so call it between cases. Negative on failure.
double bench_copy_gbps(bench_env *env, uint64_t bytes);

// The families' common table: a header, and one row per case with the time, the bandwidth of
// `bytes` (the minimal bytes moved) and its ratio to the 1 GiB copy and to a copy of the same
// size measured right then (bench_copy_gbps of bytes / 2). Call the row between cases.
void bench_print_header(bench_env *env);
void bench_print_row(bench_env *env, const char *format, const char *shape, const char *layout,
                     double ms, double bytes);

// The cast families (fp8, block, mxfp8): a case is a rows x cols BF16 input, dense (members 0)
// or grouped, with 2D scaling tiles where the family has them.
typedef struct bench_cast_case {
    uint32_t rows, cols, members;
    bool two_d;
} bench_cast_case;
typedef void (*bench_cast_run)(bench_env *env, const bench_cast_case *c);
// Prints the table header, then runs each case.
void bench_run_casts(bench_env *env, const bench_cast_case *cases, size_t count,
                     bench_cast_run run);
// Starts the case's inputs: bench_inputs_begin, then the rows x cols matrix "x" (BF16 normals of
// seed 7, the same values in every family) and its group arrays. Returns x.
prog_ref bench_inputs_cast(bench_inputs *in, const char *label, const bench_cast_case *c,
                           bench_member_sizes sizes);
// The case's row: shape "<rows>x<cols><suffix>" and layout "dense" or "grouped<members>"; a
// failed case (ms <= 0) prints "<name> <rows>x<cols>: failed" instead.
void bench_print_cast_row(bench_env *env, const bench_cast_case *c, const char *name,
                          const char *format, const char *suffix, double ms, double bytes);

// GB/s from bytes moved and milliseconds.
static inline double bench_gbps(double bytes, double ms) { return bytes / (ms * 1e6); }

// The families' benchmarks; each prints its own table rows.
void bench_quant_fp8(bench_env *env);
void bench_quant_mxfp8(bench_env *env);
void bench_quant_block(bench_env *env);
void bench_quant_nvfp4(bench_env *env);
void bench_gemm(bench_env *env);

#endif  // QT_BENCH_H
