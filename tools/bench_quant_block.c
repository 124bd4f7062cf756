// bench_quant_block: the FP8 block-scaling casts (BF16 in; E4M3 rowwise and transposed columnwise
// codes and FP32 scale_inv out), 1x128 and 128x128, dense and grouped (64 members), against the
// device copy.
//
// Bytes counted are the minimum any implementation moves: the input read once, both code
// tensors and both scale tensors written once. The input is bench_inputs, filled once before the
// timed program, so the timed graph holds the cast alone.
#include "tools/bench.h"
#include "runtime/ops/op_quant_block.h"  // op_quant_block, op_block_scale_count

// Uneven members whose padded sizes are multiples of 128 and sum to `rows`: pairs of base + d
// and base - d rows, d = 128 * (pair % (base / 128 + 1)), so some members are empty; each
// member's last i % 17 rows are padding. The kernel reads padding rows too, so the byte count
// of the whole matrix holds.
static void block_bench_members(uint32_t rows, uint32_t members, uint32_t *offsets,
                                uint32_t *first_dims) {
    uint32_t base = rows / members;
    offsets[0] = 0;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t d = 128u * ((i / 2) % (base / 128u + 1u));
        uint32_t size = i % 2 == 0 ? base + d : base - d;
        offsets[i + 1] = offsets[i] + size;
        first_dims[i] = size > i % 17 ? size - i % 17 : size;
    }
}

static void block_bench_case(bench_env *env, const bench_cast_case *c) {
    static bench_inputs input;
    prog_ref x = bench_inputs_cast(&input, "block", c, block_bench_members);
    if (!bench_inputs_ready(env, &input)) return;
    bench_case_begin(env);
    uint64_t codes = (uint64_t)c->rows * c->cols;
    uint64_t row_scales = 4 * op_block_scale_count(c->rows, c->cols, c->two_d, false);
    uint64_t col_scales = 4 * op_block_scale_count(c->rows, c->cols, c->two_d, true);
    op_block_tensor t = {0};
    t.rows = c->rows;
    t.cols = c->cols;
    t.two_d = c->two_d;
    t.fp8 = QT_BLOCK_E4M3;
    t.rowwise = true;
    t.colwise = true;
    t.row_codes = bench_reserve(env, "row_codes", codes);
    t.row_scale_inv = bench_reserve(env, "row_scale_inv", row_scales);
    t.col_codes = bench_reserve(env, "col_codes", codes);
    t.col_scale_inv = bench_reserve(env, "col_scale_inv", col_scales);
    t.group = (op_group){c->members, input.row_offsets, input.first_dims};
    qt_status st = op_quant_block(&env->prog, "block_cast", x, QT_DTYPE_BF16, &t, NULL);
    double ms = bench_case_finish(env, &input, st);
    const char *format = c->two_d ? "fp8_block_2d bf16 row+col" : "fp8_block_1d bf16 row+col";
    double bytes = (double)c->rows * c->cols * 2 + 2.0 * (double)codes + (double)row_scales +
                   (double)col_scales;
    bench_print_cast_row(env, c, "fp8_block", format, "", ms, bytes);
}

void bench_quant_block(bench_env *env) {
    static const bench_cast_case cases[] = {
        {8192, 8192, 0, false},  {16384, 4096, 0, false}, {8192, 8192, 64, false},
        {16384, 4096, 64, false}, {8192, 8192, 0, true},   {16384, 4096, 0, true},
        {8192, 8192, 64, true},
    };
    bench_run_casts(env, cases, sizeof cases / sizeof cases[0], block_bench_case);
}
