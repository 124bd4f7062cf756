// bench_quant_mxfp8: the fused MXFP8 cast (BF16 in; E4M3 rowwise and columnwise codes and E8M0
// scales out) on the shapes of tools/bench.h, dense and grouped, against the device copy.
//
// Bytes counted are the minimum any implementation moves: the input read once, both code
// tensors and both scale tensors written once. The input lives in its own arena, filled by a
// program run once before the timed program, so the timed graph holds the cast alone.
#include <stdlib.h>

#include "bench.h"
#include "op_core.h"         // op_fill_random
#include "op_quant_mxfp8.h"  // op_mxfp8_quantize

typedef struct mxfp8_bench_input {
    arena arena;
    prog_ref in, row_offsets, first_dims;
} mxfp8_bench_input;

static prog_ref mxfp8_bench_region(arena *a, const char *name, uint64_t bytes) {
    arena_handle h;
    if (arena_reserve(a, name, bytes ? bytes : 4, 256, ARENA_CAT_WORKSPACE,
                      ARENA_LIFETIME_PERSISTENT, 0, &h) != QT_OK) {
        fprintf(stderr, "bench mxfp8: %s\n", qt_error_message());
        exit(1);
    }
    return (prog_ref){a, h, 0};
}

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

static bool mxfp8_bench_fill(bench_env *env, mxfp8_bench_input *input, uint32_t rows,
                             uint32_t cols, uint32_t members) {
    static program fill;  // large: keep it off the stack
    arena_init(&input->arena, ARENA_KIND_DEVICE, "mxfp8-bench-input");
    input->in = mxfp8_bench_region(&input->arena, "in", (uint64_t)rows * cols * 2);
    input->row_offsets = mxfp8_bench_region(&input->arena, "row_offsets", (members + 1) * 4);
    input->first_dims = mxfp8_bench_region(&input->arena, "first_dims", members * 4);
    prog_init(&fill, "mxfp8-fill", 0);
    if (op_fill_random(&fill, "fill", input->in, (uint64_t)rows * cols, QT_DTYPE_BF16,
                       QT_FILL_NORMAL, 7, 0, 0.0f, 1.0f) != QT_OK ||
        backend_bind(&env->gpu, &input->arena, NULL, 0) != QT_OK) {
        fprintf(stderr, "bench mxfp8: %s\n", qt_error_message());
        return false;
    }
    prog_resolve(&fill);
    bool ok = backend_run(&env->gpu, &fill) == QT_OK;
    if (ok && members > 0) {
        uint32_t *offsets = malloc((members + 1) * sizeof *offsets);
        uint32_t *first_dims = malloc(members * sizeof *first_dims);
        mxfp8_bench_members(rows, members, offsets, first_dims);
        ok = backend_write(&env->gpu, input->row_offsets, offsets, (members + 1) * 4) == QT_OK &&
             backend_write(&env->gpu, input->first_dims, first_dims, members * 4) == QT_OK;
        free(offsets);
        free(first_dims);
    }
    ok = ok && backend_finish(&env->gpu) == QT_OK;
    if (!ok) fprintf(stderr, "bench mxfp8: %s\n", qt_error_message());
    return ok;
}

static void mxfp8_bench_case(bench_env *env, uint32_t rows, uint32_t cols, uint32_t members,
                             bool tile_2d) {
    static mxfp8_bench_input input;
    if (!mxfp8_bench_fill(env, &input, rows, cols, members)) return;
    bench_case_begin(env);
    op_mxfp8_quantize_desc d = {0};
    d.in = input.in;
    d.dtype = QT_DTYPE_BF16;
    d.rows = rows;
    d.cols = cols;
    d.elem = QT_ELEM_E4M3;
    d.tile_2d = tile_2d;
    uint64_t codes = op_mxfp8_codes_bytes(rows, cols);
    uint64_t row_scales = op_mxfp8_row_scales_bytes(rows, cols);
    uint64_t col_scales = op_mxfp8_col_scales_bytes(rows, cols);
    d.rowwise.codes = bench_reserve(env, "row_codes", codes);
    d.rowwise.scales = bench_reserve(env, "row_scales", row_scales);
    d.colwise.codes = bench_reserve(env, "col_codes", codes);
    d.colwise.scales = bench_reserve(env, "col_scales", col_scales);
    d.group = (op_mxfp8_group){input.row_offsets, input.first_dims, members};
    double ms = -1;
    if (op_mxfp8_quantize(&env->prog, "mxfp8_cast", &d) == QT_OK) ms = bench_time_program(env);
    bench_case_end(env);
    backend_release(&env->gpu, &input.arena);
    if (ms <= 0) {
        fprintf(env->out, "mxfp8 %ux%u: failed\n", rows, cols);
        return;
    }
    double bytes = (double)rows * cols * 2 + 2.0 * (double)codes + (double)row_scales +
                   (double)col_scales;
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%u%s", rows, cols, tile_2d ? " 2d" : "");
    char group[32] = "dense";
    if (members) snprintf(group, sizeof group, "grouped%u", members);
    bench_print_row(env, "mxfp8_e4m3 bf16 row+col", shape, group, ms, bytes);
}

void bench_quant_mxfp8(bench_env *env) {
    bench_print_header(env);
    static const struct {
        uint32_t rows, cols, members;
        bool tile_2d;
    } cases[] = {
        {8192, 8192, 0, false},  {16384, 4096, 0, false}, {8192, 8192, 64, false},
        {16384, 4096, 64, false}, {8192, 8192, 0, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mxfp8_bench_case(env, cases[i].rows, cases[i].cols, cases[i].members,
                         cases[i].tile_2d);
    }
}
