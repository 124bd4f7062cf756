// bench_quant_mxfp8: the fused MXFP8 cast (BF16 in; E4M3 rowwise and columnwise codes and E8M0
// scales out) on the shapes of tools/bench.h, dense and grouped, against the device copy.
//
// Bytes counted are the minimum any implementation moves: the input read once, both code
// tensors and both scale tensors written once. The input is bench_inputs, filled once before the
// timed program, so the timed graph holds the cast alone.
#include "tools/bench.h"
#include "runtime/ops/op_quant_mxfp8.h"  // op_mxfp8_quantize

// Uneven members whose padded sizes are multiples of 32 and sum to `rows`: pairs of
// base + d and base - d rows, d = 32 * (pair % (base / 32)); each member's last i % 17 rows are
// padding. The kernel still reads padding rows, so the byte count of the whole matrix holds.
static void mxfp8_bench_members(uint32_t rows, uint32_t members, uint32_t *offsets,
                                uint32_t *first_dims) {
    uint32_t base = rows / members;
    offsets[0] = 0;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t d = 32u * ((i / 2) % (base / 32u));
        uint32_t size = i % 2 == 0 ? base + d : base - d;
        offsets[i + 1] = offsets[i] + size;
        first_dims[i] = size - (i % 17 < size ? i % 17 : 0);
    }
}

static void mxfp8_bench_case(bench_env *env, const bench_cast_case *c) {
    static bench_inputs input;
    prog_ref x = bench_inputs_cast(&input, "mxfp8", c, mxfp8_bench_members);
    if (!bench_inputs_ready(env, &input)) return;
    bench_case_begin(env);
    op_mxfp8_quantize_desc d = {0};
    d.in = x;
    d.dtype = QT_DTYPE_BF16;
    d.rows = c->rows;
    d.cols = c->cols;
    d.elem = QT_ELEM_E4M3;
    d.tile_2d = c->two_d;
    uint64_t codes = op_mxfp8_codes_bytes(c->rows, c->cols);
    uint64_t row_scales = op_mxfp8_row_scales_bytes(c->rows, c->cols);
    uint64_t col_scales = op_mxfp8_col_scales_bytes(c->rows, c->cols);
    d.rowwise.codes = bench_reserve(env, "row_codes", codes);
    d.rowwise.scales = bench_reserve(env, "row_scales", row_scales);
    d.colwise.codes = bench_reserve(env, "col_codes", codes);
    d.colwise.scales = bench_reserve(env, "col_scales", col_scales);
    d.group = (op_group){c->members, input.row_offsets, input.first_dims};
    double ms = bench_case_finish(env, &input, op_mxfp8_quantize(&env->prog, "mxfp8_cast", &d));
    double bytes = (double)c->rows * c->cols * 2 + 2.0 * (double)codes + (double)row_scales +
                   (double)col_scales;
    const char *suffix = c->two_d ? " 2d" : "";
    bench_print_cast_row(env, c, "mxfp8", "mxfp8_e4m3 bf16 row+col", suffix, ms, bytes);
}

void bench_quant_mxfp8(bench_env *env) {
    static const bench_cast_case cases[] = {
        {8192, 8192, 0, false},  {16384, 4096, 0, false}, {8192, 8192, 64, false},
        {16384, 4096, 64, false}, {8192, 8192, 0, true},
    };
    bench_run_casts(env, cases, sizeof cases / sizeof cases[0], mxfp8_bench_case);
}
