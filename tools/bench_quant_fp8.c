// bench_quant_fp8: the fused per-tensor FP8 cast + transpose with delayed scaling (BF16 in; E4M3
// rowwise and columnwise codes out, amax into the history slot), dense and grouped, against the
// device copy.
//
// Bytes counted are the minimum any implementation moves: the input read once and both code
// tensors written once (the per-member scale_inv and amax words are noise). The input, member
// sizes and scaling state live in their own arena, prepared by a program run once before the
// timed program, so the timed graph holds the cast alone.
#include <stdlib.h>

#include "bench.h"
#include "op_core.h"          // op_fill_random
#include "op_quant_fp8.h"     // op_fp8_cast_delayed
#include "op_quant_group.h"   // op_group_offsets

#define FP8_BENCH_ROW_ALIGN 16  // recipes/format.c: per-tensor FP8 members pad to 16 rows

typedef struct fp8_bench_input {
    arena arena;
    prog_ref x, row_offsets, first_dims, scale, amax;
} fp8_bench_input;

static prog_ref fp8_bench_region(arena *a, const char *name, uint64_t bytes) {
    arena_handle h;
    if (arena_reserve(a, name, bytes ? bytes : 4, 256, ARENA_CAT_WORKSPACE,
                      ARENA_LIFETIME_PERSISTENT, 0, &h) != QT_OK) {
        fprintf(stderr, "bench fp8: %s\n", qt_error_message());
        exit(1);
    }
    return (prog_ref){a, h, 0};
}

// Uneven members whose padded sizes are multiples of 16 and sum to `rows`: pairs of base + d and
// base - d rows (d = 16 * (pair % 4)), the last i % 5 rows of each member being padding. Tiles of
// 64 rows then often straddle two members, as they do in a real MoE layer.
static void fp8_bench_members(uint32_t rows, uint32_t members, uint32_t *first_dims) {
    uint32_t base = rows / members;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t d = 16u * ((i / 2) % 4u);
        uint32_t size = i % 2 == 0 ? base + d : base - d;
        first_dims[i] = size - i % 5;
    }
}

static bool fp8_bench_prepare(bench_env *env, fp8_bench_input *in, uint32_t rows, uint32_t cols,
                              uint32_t members) {
    static program prep;  // large: keep it off the stack
    uint32_t n = members ? members : 1;
    arena_init(&in->arena, ARENA_KIND_DEVICE, "fp8-bench-input");
    in->x = fp8_bench_region(&in->arena, "x", (uint64_t)rows * cols * 2);
    in->row_offsets = fp8_bench_region(&in->arena, "row_offsets", (members + 1) * 4);
    in->first_dims = fp8_bench_region(&in->arena, "first_dims", members * 4);
    in->scale = fp8_bench_region(&in->arena, "scale", n * 4);
    in->amax = fp8_bench_region(&in->arena, "amax_history_row0", n * 4);
    prog_init(&prep, "fp8-prepare", 0);
    op_group g = {members, in->row_offsets, in->first_dims};
    bool ok = op_fill_random(&prep, "fill", in->x, (uint64_t)rows * cols, QT_DTYPE_BF16,
                             QT_FILL_NORMAL, 7, 0, 0.0f, 1.0f) == QT_OK &&
              (members == 0 || op_group_offsets(&prep, "offsets", &g, FP8_BENCH_ROW_ALIGN) ==
                                   QT_OK) &&
              backend_bind(&env->gpu, &in->arena, NULL, 0) == QT_OK;
    if (ok) {
        prog_resolve(&prep);
        uint32_t *first_dims = malloc(n * sizeof *first_dims);
        float *scale = malloc(n * sizeof *scale);
        for (uint32_t i = 0; i < n; i++) scale[i] = 16.0f;  // |x| < ~5 stays below 448
        if (members) fp8_bench_members(rows, members, first_dims);
        ok = (members == 0 ||
              backend_write(&env->gpu, in->first_dims, first_dims, members * 4) == QT_OK) &&
             backend_write(&env->gpu, in->scale, scale, n * 4) == QT_OK &&
             backend_run(&env->gpu, &prep) == QT_OK && backend_finish(&env->gpu) == QT_OK;
        free(first_dims);
        free(scale);
    }
    if (!ok) fprintf(stderr, "bench fp8: %s\n", qt_error_message());
    return ok;
}

static void fp8_bench_case(bench_env *env, uint32_t rows, uint32_t cols, uint32_t members) {
    static fp8_bench_input in;
    if (!fp8_bench_prepare(env, &in, rows, cols, members)) return;
    bench_case_begin(env);
    uint64_t codes = (uint64_t)rows * cols;
    op_fp8_input x = {in.x, QT_DTYPE_BF16, rows, cols, {members, in.row_offsets, in.first_dims}};
    op_fp8_output out = {QT_FP8_E4M3, bench_reserve(env, "rowwise", codes),
                         bench_reserve(env, "colwise", codes),
                         bench_reserve(env, "scale_inv", (members ? members : 1) * 4)};
    double ms = -1;
    if (op_fp8_cast_delayed(&env->prog, "fp8_cast", &x, &out, in.scale, in.amax) == QT_OK) {
        ms = bench_time_program(env);
    }
    bench_case_end(env);
    backend_release(&env->gpu, &in.arena);
    if (ms <= 0) {
        fprintf(env->out, "fp8 %ux%u: failed\n", rows, cols);
        return;
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%u", rows, cols);
    char group[32] = "dense";
    if (members) snprintf(group, sizeof group, "grouped%u", members);
    bench_print_row(env, "fp8_e4m3 delayed bf16 r+c", shape, group, ms,
                    (double)rows * cols * 2 + 2.0 * (double)codes);
}

void bench_quant_fp8(bench_env *env) {
    bench_print_header(env);
    static const struct {
        uint32_t rows, cols, members;
    } cases[] = {
        {8192, 8192, 0}, {16384, 4096, 0}, {8192, 8192, 64}, {16384, 4096, 64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fp8_bench_case(env, cases[i].rows, cases[i].cols, cases[i].members);
    }
}
