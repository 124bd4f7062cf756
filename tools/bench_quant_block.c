// bench_quant_block: the FP8 block-scaling casts (BF16 in; E4M3 rowwise and transposed columnwise
// codes and FP32 scale_inv out), 1x128 and 128x128, dense and grouped (64 members), against the
// device copy.
//
// Bytes counted are the minimum any implementation moves: the input read once, both code
// tensors and both scale tensors written once. The input lives in its own arena, filled by a
// program run once before the timed program, so the timed graph holds the cast alone.
#include <stdlib.h>

#include "bench.h"
#include "op_core.h"         // op_fill_random
#include "op_quant_block.h"  // op_quant_block, op_block_scale_count

typedef struct block_bench_input {
    arena arena;
    prog_ref in, row_offsets, first_dims;
} block_bench_input;

static prog_ref block_bench_region(arena *a, const char *name, uint64_t bytes) {
    arena_handle h;
    if (arena_reserve(a, name, bytes ? bytes : 4, 256, ARENA_CAT_WORKSPACE,
                      ARENA_LIFETIME_PERSISTENT, 0, &h) != QT_OK) {
        fprintf(stderr, "bench block: %s\n", qt_error_message());
        exit(1);
    }
    return (prog_ref){a, h, 0};
}

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

static bool block_bench_fill(bench_env *env, block_bench_input *input, uint32_t rows,
                             uint32_t cols, uint32_t members) {
    static program fill;  // large: keep it off the stack
    arena_init(&input->arena, ARENA_KIND_DEVICE, "block-bench-input");
    input->in = block_bench_region(&input->arena, "in", (uint64_t)rows * cols * 2);
    input->row_offsets = block_bench_region(&input->arena, "row_offsets", (members + 1) * 4);
    input->first_dims = block_bench_region(&input->arena, "first_dims", members * 4);
    prog_init(&fill, "block-fill", 0);
    if (op_fill_random(&fill, "fill", input->in, (uint64_t)rows * cols, QT_DTYPE_BF16,
                       QT_FILL_NORMAL, 7, 0, 0.0f, 1.0f) != QT_OK ||
        backend_bind(&env->gpu, &input->arena, NULL, 0) != QT_OK) {
        fprintf(stderr, "bench block: %s\n", qt_error_message());
        return false;
    }
    prog_resolve(&fill);
    bool ok = backend_run(&env->gpu, &fill) == QT_OK;
    if (ok && members > 0) {
        uint32_t *offsets = malloc((members + 1) * sizeof *offsets);
        uint32_t *first_dims = malloc(members * sizeof *first_dims);
        block_bench_members(rows, members, offsets, first_dims);
        ok = backend_write(&env->gpu, input->row_offsets, offsets, (members + 1) * 4) == QT_OK &&
             backend_write(&env->gpu, input->first_dims, first_dims, members * 4) == QT_OK;
        free(offsets);
        free(first_dims);
    }
    ok = ok && backend_finish(&env->gpu) == QT_OK;
    if (!ok) fprintf(stderr, "bench block: %s\n", qt_error_message());
    return ok;
}

static void block_bench_case(bench_env *env, uint32_t rows, uint32_t cols, uint32_t members,
                             bool two_d) {
    static block_bench_input input;
    if (!block_bench_fill(env, &input, rows, cols, members)) return;
    bench_case_begin(env);
    uint64_t codes = (uint64_t)rows * cols;
    uint64_t row_scales = 4 * op_block_scale_count(rows, cols, two_d, false);
    uint64_t col_scales = 4 * op_block_scale_count(rows, cols, two_d, true);
    op_block_tensor t = {0};
    t.rows = rows;
    t.cols = cols;
    t.two_d = two_d;
    t.fp8 = QT_BLOCK_E4M3;
    t.rowwise = true;
    t.colwise = true;
    t.row_codes = bench_reserve(env, "row_codes", codes);
    t.row_scale_inv = bench_reserve(env, "row_scale_inv", row_scales);
    t.col_codes = bench_reserve(env, "col_codes", codes);
    t.col_scale_inv = bench_reserve(env, "col_scale_inv", col_scales);
    t.group = (op_block_group){members, input.row_offsets, input.first_dims};
    double ms = -1;
    if (op_quant_block(&env->prog, "block_cast", input.in, QT_DTYPE_BF16, &t, NULL) == QT_OK) {
        ms = bench_time_program(env);
    }
    bench_case_end(env);
    backend_release(&env->gpu, &input.arena);
    if (ms <= 0) {
        fprintf(env->out, "fp8_block %ux%u: failed\n", rows, cols);
        return;
    }
    double bytes = (double)rows * cols * 2 + 2.0 * (double)codes + (double)row_scales +
                   (double)col_scales;
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%u", rows, cols);
    char group[32] = "dense";
    if (members) snprintf(group, sizeof group, "grouped%u", members);
    bench_print_row(env, two_d ? "fp8_block_2d bf16 row+col" : "fp8_block_1d bf16 row+col", shape,
                    group, ms, bytes);
}

void bench_quant_block(bench_env *env) {
    bench_print_header(env);
    static const struct {
        uint32_t rows, cols, members;
        bool two_d;
    } cases[] = {
        {8192, 8192, 0, false},  {16384, 4096, 0, false}, {8192, 8192, 64, false},
        {16384, 4096, 64, false}, {8192, 8192, 0, true},   {16384, 4096, 0, true},
        {8192, 8192, 64, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        block_bench_case(env, cases[i].rows, cases[i].cols, cases[i].members, cases[i].two_d);
    }
}
