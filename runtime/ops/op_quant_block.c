#include "runtime/ops/op_quant_block.h"

#include <stddef.h>  // offsetof

#include "runtime/ops/op_core.h"  // OP_PLAN_SMS

#define OP_BLOCK_THREADS 256u  // the kernels' QB_THREADS: one block per 128 x 128 tile

uint64_t op_block_tiles(uint64_t n) { return (n + QT_BLOCK_LEN - 1) / QT_BLOCK_LEN; }

uint64_t op_block_scale_count(uint32_t rows, uint32_t cols, bool two_d, bool colwise) {
    if (two_d) return op_block_tiles(rows) * op_block_tiles(cols);
    return colwise ? op_block_tiles(rows) * cols : op_block_tiles(cols) * rows;
}

// One block per tile; a grid is never empty, the kernels skip tiles past the matrix.
static launch_shape op_block_shape(uint32_t rows, uint32_t cols) {
    uint64_t tiles = op_block_tiles(rows) * op_block_tiles(cols);
    QT_ASSERT(tiles < (1ull << 31));
    if (tiles == 0) tiles = 1;
    return (launch_shape){{(uint32_t)tiles, 1, 1}, {OP_BLOCK_THREADS, 1, 1}, 0};
}

static kernel_id op_block_cast_kernel(bool two_d, uint32_t in_dtype) {
    if (two_d) {
        return in_dtype == QT_DTYPE_BF16 ? KERNEL_QUANT_BLOCK_2D_BF16 : KERNEL_QUANT_BLOCK_2D_F32;
    }
    return in_dtype == QT_DTYPE_BF16 ? KERNEL_QUANT_BLOCK_1D_BF16 : KERNEL_QUANT_BLOCK_1D_F32;
}

// Declares one direction's codes and scale_inv (at args bytes codes_at and scales_at) on op.
static qt_status op_block_use_direction(program *p, uint32_t op, const op_block_tensor *t,
                                        bool colwise, uint32_t codes_at, uint32_t scales_at) {
    QT_TRY(prog_use_span(p, op, codes_at, colwise ? t->col_codes : t->row_codes,
                         (uint64_t)t->rows * t->cols, PROG_WRITE));
    return prog_use_span(p, op, scales_at, colwise ? t->col_scale_inv : t->row_scale_inv,
                         4 * op_block_scale_count(t->rows, t->cols, t->two_d, colwise),
                         PROG_WRITE);
}

// Declares the enabled directions of t on op, whose args hold a quant_block_args at byte `at`.
static qt_status op_block_use_outputs(program *p, uint32_t op, uint32_t at,
                                      const op_block_tensor *t) {
    if (t->rowwise) {
        QT_TRY(op_block_use_direction(p, op, t, false,
                                      at + (uint32_t)offsetof(quant_block_args, row_codes),
                                      at + (uint32_t)offsetof(quant_block_args, row_scale_inv)));
    }
    if (t->colwise) {
        QT_TRY(op_block_use_direction(p, op, t, true,
                                      at + (uint32_t)offsetof(quant_block_args, col_codes),
                                      at + (uint32_t)offsetof(quant_block_args, col_scale_inv)));
    }
    return QT_OK;
}

qt_status op_quant_block(program *p, const char *name, prog_ref input, uint32_t in_dtype,
                         const op_block_tensor *t, const op_block_options *options) {
    QT_ASSERT(in_dtype == QT_DTYPE_BF16 || in_dtype == QT_DTYPE_F32);
    QT_ASSERT(t->fp8 == QT_BLOCK_E4M3 || t->fp8 == QT_BLOCK_E5M2);
    QT_ASSERT(t->rowwise || t->colwise);
    op_block_options defaults = {false, 0.0f};
    if (options == NULL) options = &defaults;
    quant_block_args args = {0};
    args.rows = t->rows;
    args.cols = t->cols;
    args.fp8 = t->fp8;
    args.directions = (t->rowwise ? QT_BLOCK_ROWWISE : 0u) | (t->colwise ? QT_BLOCK_COLWISE : 0u);
    args.pow2 = options->fp32_scales ? 0u : 1u;
    args.eps = options->eps;
    launch_shape shape = op_block_shape(t->rows, t->cols);
    uint32_t op;
    QT_TRY(prog_append(p, op_block_cast_kernel(t->two_d, in_dtype), name, &shape, &args,
                       sizeof args, &op));
    uint64_t elems = (uint64_t)t->rows * t->cols;
    QT_TRY(prog_use_span(p, op, offsetof(quant_block_args, input), input,
                        elems * (in_dtype == QT_DTYPE_BF16 ? 2 : 4), PROG_READ));
    QT_TRY(op_block_use_outputs(p, op, 0, t));
    return op_group_use(p, op, offsetof(quant_block_args, group), &t->group);
}

// Persistent: every tile its block up to QT_BLOCK_ACT_BLOCKS_PER_SM blocks an SM of the planned
// GPUs (OP_PLAN_SMS), each with the table in its dynamic shared memory.
qt_status op_quant_block_act(program *p, const char *name, uint32_t act, bool backward,
                             prog_ref x, prog_ref dy, const op_block_tensor *t,
                             const op_block_options *options) {
    QT_ASSERT(act == QT_ACT_GELU || act == QT_ACT_SILU);
    QT_ASSERT(!t->two_d && t->group.count == 0);
    QT_ASSERT(t->fp8 == QT_BLOCK_E4M3 || t->fp8 == QT_BLOCK_E5M2);
    QT_ASSERT(t->rowwise || t->colwise);
    QT_ASSERT(t->rows >= 1 && t->cols >= 1 && t->cols % 8 == 0);
    QT_ASSERT(prog_ref_present(x) && x.offset % 16 == 0);
    QT_ASSERT(!backward || (prog_ref_present(dy) && dy.offset % 16 == 0));
    op_block_options defaults = {false, 0.0f};
    if (options == NULL) options = &defaults;
    quant_block_act_args args = {0};
    args.cast.rows = t->rows;
    args.cast.cols = t->cols;
    args.cast.fp8 = t->fp8;
    args.cast.directions =
        (t->rowwise ? QT_BLOCK_ROWWISE : 0u) | (t->colwise ? QT_BLOCK_COLWISE : 0u);
    args.cast.pow2 = options->fp32_scales ? 0u : 1u;
    args.cast.eps = options->eps;
    args.act = act;
    uint64_t tiles = op_block_tiles(t->rows) * op_block_tiles(t->cols);
    uint64_t blocks = OP_PLAN_SMS * QT_BLOCK_ACT_BLOCKS_PER_SM;
    if (tiles < blocks) blocks = tiles;
    launch_shape shape = {{(uint32_t)blocks, 1, 1}, {OP_BLOCK_THREADS, 1, 1},
                          QT_BLOCK_ACT_TABLE_BYTES};
    uint32_t op;
    QT_TRY(prog_append(p, backward ? KERNEL_QUANT_BLOCK_ACT_BWD : KERNEL_QUANT_BLOCK_ACT_FWD, name,
                       &shape, &args, sizeof args, &op));
    uint64_t elems = (uint64_t)t->rows * t->cols;
    QT_TRY(prog_use_span(p, op, offsetof(quant_block_act_args, cast.input), x, 2 * elems,
                         PROG_READ));
    if (backward) {
        QT_TRY(prog_use_span(p, op, offsetof(quant_block_act_args, dy), dy, 2 * elems,
                             PROG_READ));
    }
    return op_block_use_outputs(p, op, (uint32_t)offsetof(quant_block_act_args, cast), t);
}

qt_status op_dequant_block(program *p, const char *name, const op_block_tensor *t, bool colwise,
                           prog_ref out, uint32_t out_dtype) {
    QT_ASSERT(out_dtype == QT_DTYPE_BF16 || out_dtype == QT_DTYPE_F32);
    QT_ASSERT(t->fp8 == QT_BLOCK_E4M3 || t->fp8 == QT_BLOCK_E5M2);
    QT_ASSERT(colwise ? t->colwise : t->rowwise);
    dequant_block_args args = {0};
    args.rows = t->rows;
    args.cols = t->cols;
    args.fp8 = t->fp8;
    args.colwise = colwise ? 1u : 0u;
    args.out_dtype = out_dtype;
    launch_shape shape = op_block_shape(t->rows, t->cols);
    uint32_t op;
    QT_TRY(prog_append(p, t->two_d ? KERNEL_DEQUANT_BLOCK_2D : KERNEL_DEQUANT_BLOCK_1D, name,
                       &shape, &args, sizeof args, &op));
    uint64_t elems = (uint64_t)t->rows * t->cols;
    QT_TRY(prog_use_span(p, op, offsetof(dequant_block_args, codes),
                        colwise ? t->col_codes : t->row_codes, elems, PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(dequant_block_args, scale_inv),
                        colwise ? t->col_scale_inv : t->row_scale_inv,
                        4 * op_block_scale_count(t->rows, t->cols, t->two_d, colwise), PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(dequant_block_args, out), out,
                        elems * (out_dtype == QT_DTYPE_BF16 ? 2 : 4), PROG_WRITE));
    return op_group_use(p, op, offsetof(dequant_block_args, group), &t->group);
}
