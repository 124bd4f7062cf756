// bench_quant_fp8: the fused per-tensor FP8 cast + transpose with delayed scaling (BF16 in; E4M3
// rowwise and columnwise codes out, amax into the history slot), dense and grouped, against the
// device copy.
//
// Bytes counted are the minimum any implementation moves: the input read once and both code
// tensors written once (the per-member scale_inv and amax words are noise). The input, member
// sizes and scaling state are bench_inputs, prepared once before the timed program, so the timed
// graph holds the cast alone.
#include "tools/bench.h"
#include "runtime/ops/op_quant_fp8.h"  // op_fp8_cast_delayed

typedef struct fp8_bench_input {
    bench_inputs inputs;
    prog_ref x, scale, amax;
} fp8_bench_input;

// Uneven members whose padded sizes are multiples of 16 (recipes/format.c: per-tensor FP8 members
// pad to 16 rows) and sum to `rows`: pairs of base + d and base - d rows (d = 16 * (pair % 4)),
// the last i % 5 rows of each member being padding. Tiles of 64 rows then often straddle two
// members, as they do in a real MoE layer. The offsets are what op_group_offsets(16) computes
// from first_dims (i % 5 < 16), written from the host like the other families'.
static void fp8_bench_members(uint32_t rows, uint32_t members, uint32_t *offsets,
                              uint32_t *first_dims) {
    uint32_t base = rows / members;
    offsets[0] = 0;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t d = 16u * ((i / 2) % 4u);
        uint32_t size = i % 2 == 0 ? base + d : base - d;
        offsets[i + 1] = offsets[i] + size;
        first_dims[i] = size - i % 5;
    }
}

static bool fp8_bench_prepare(bench_env *env, fp8_bench_input *in, const bench_cast_case *c) {
    uint32_t n = c->members ? c->members : 1;
    in->x = bench_inputs_cast(&in->inputs, "fp8", c, fp8_bench_members);
    // A constant 16: |x| < ~5 stays below 448.
    in->scale = bench_inputs_f32(&in->inputs, "scale", n * 4, 8, 16.0f, 16.0f);
    in->amax = bench_inputs_region(&in->inputs, "amax_history_row0", n * 4);
    return bench_inputs_ready(env, &in->inputs);
}

static void fp8_bench_case(bench_env *env, const bench_cast_case *c) {
    static fp8_bench_input in;
    if (!fp8_bench_prepare(env, &in, c)) return;
    bench_case_begin(env);
    uint64_t codes = (uint64_t)c->rows * c->cols;
    op_fp8_input x = {in.x, QT_DTYPE_BF16, c->rows, c->cols,
                      {c->members, in.inputs.row_offsets, in.inputs.first_dims}};
    op_fp8_output out = {QT_FP8_E4M3, bench_reserve(env, "rowwise", codes),
                         bench_reserve(env, "colwise", codes),
                         bench_reserve(env, "scale_inv", (c->members ? c->members : 1) * 4)};
    qt_status st = op_fp8_cast_delayed(&env->prog, "fp8_cast", &x, &out, in.scale, in.amax);
    double ms = bench_case_finish(env, &in.inputs, st);
    double bytes = (double)c->rows * c->cols * 2 + 2.0 * (double)codes;
    bench_print_cast_row(env, c, "fp8", "fp8_e4m3 delayed bf16 r+c", "", ms, bytes);
}

void bench_quant_fp8(bench_env *env) {
    static const bench_cast_case cases[] = {
        {8192, 8192, 0, false}, {16384, 4096, 0, false}, {8192, 8192, 64, false},
        {16384, 4096, 64, false},
    };
    bench_run_casts(env, cases, sizeof cases / sizeof cases[0], fp8_bench_case);
}
