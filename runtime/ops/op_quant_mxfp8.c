#include "runtime/ops/op_quant_mxfp8.h"

#include <stddef.h>  // offsetof

#include "runtime/ops/op_core.h"  // op_shape_1d, OP_PLAN_SMS

uint64_t op_mxfp8_codes_bytes(uint32_t rows, uint32_t cols) { return (uint64_t)rows * cols; }

uint64_t op_mxfp8_row_scales_bytes(uint32_t rows, uint32_t cols) {
    return (uint64_t)rows * ((cols + QT_MXFP8_BLOCK - 1) / QT_MXFP8_BLOCK);
}

uint64_t op_mxfp8_col_scales_bytes(uint32_t rows, uint32_t cols) {
    return (uint64_t)((rows + QT_MXFP8_BLOCK - 1) / QT_MXFP8_BLOCK) * cols;
}

// Programmer errors: a region too small for the layout the kernel will touch.
static void op_mxfp8_assert_fits(prog_ref ref, uint64_t bytes) {
    QT_ASSERT(ref.arena != NULL);
    if (arena_counting(ref.arena)) return;  // checked when the plan is made for real
    const arena_region *region = arena_region_get(ref.arena, ref.region);
    QT_ASSERT(ref.offset <= region->bytes && region->bytes - ref.offset >= bytes);
}

static uint32_t op_mxfp8_elem(qt_elem elem) {
    QT_ASSERT(elem == QT_ELEM_E4M3 || elem == QT_ELEM_E5M2);
    return elem == QT_ELEM_E5M2 ? QT_MXFP8_E5M2 : QT_MXFP8_E4M3;
}

// values: the codes ref holds BF16 values (codes_bytes is then twice the codes') and there are
// no scales.
static qt_status op_mxfp8_use_dir(program *p, uint32_t op, size_t codes_offset,
                                  size_t scales_offset, const op_mxfp8_dir *dir,
                                  uint64_t codes_bytes, uint64_t scales_bytes, bool values,
                                  prog_access access) {
    op_mxfp8_assert_fits(dir->codes, codes_bytes);
    QT_TRY(prog_use(p, op, (uint32_t)codes_offset, dir->codes, access));
    if (values) {
        QT_ASSERT(dir->scales.arena == NULL);
        return QT_OK;
    }
    op_mxfp8_assert_fits(dir->scales, scales_bytes);
    return prog_use(p, op, (uint32_t)scales_offset, dir->scales, access);
}

// The cast's arguments for d.
static mxfp8_quantize_args op_mxfp8_quantize_fill(const op_mxfp8_quantize_desc *d) {
    bool row = d->rowwise.codes.arena != NULL, col = d->colwise.codes.arena != NULL;
    mxfp8_quantize_args args = {0};
    args.rows = d->rows;
    args.cols = d->cols;
    args.dtype = d->dtype;
    args.elem = op_mxfp8_elem(d->elem);
    QT_ASSERT((row || !d->row_values) && (col || !d->col_values));
    args.flags = (d->tile_2d ? QT_MXFP8_FLAG_2D : 0u) |
                 (d->row_values ? QT_MXFP8_FLAG_ROW_VALUES : 0u) |
                 (d->col_values ? QT_MXFP8_FLAG_COL_VALUES : 0u);
    return args;
}

// The cast's tiles, one block each: row tiles outer, so neighbouring blocks share rows.
static uint64_t op_mxfp8_quantize_tiles(const op_mxfp8_quantize_desc *d) {
    uint64_t tiles = (uint64_t)((d->rows + QT_MXFP8_TILE_ROWS - 1) / QT_MXFP8_TILE_ROWS) *
                     ((d->cols + QT_MXFP8_TILE_COLS - 1) / QT_MXFP8_TILE_COLS);
    QT_ASSERT(tiles <= 0x7FFFFFFFu);
    return tiles;
}

// The regions of op's cast arguments, which sit at byte `base` of its args (the input, the
// directions asked for, the group).
static qt_status op_mxfp8_quantize_use(program *p, uint32_t op, size_t base,
                                       const op_mxfp8_quantize_desc *d) {
    uint64_t elem_bytes = d->dtype == QT_DTYPE_BF16 ? 2 : 4;
    op_mxfp8_assert_fits(d->in, (uint64_t)d->rows * d->cols * elem_bytes);
    QT_TRY(prog_use(p, op, (uint32_t)(base + offsetof(mxfp8_quantize_args, in)), d->in,
                    PROG_READ));
    uint64_t codes = op_mxfp8_codes_bytes(d->rows, d->cols);
    if (d->rowwise.codes.arena != NULL) {
        QT_TRY(op_mxfp8_use_dir(p, op, base + offsetof(mxfp8_quantize_args, row_codes),
                                base + offsetof(mxfp8_quantize_args, row_scales), &d->rowwise,
                                d->row_values ? 2 * codes : codes,
                                op_mxfp8_row_scales_bytes(d->rows, d->cols), d->row_values,
                                PROG_WRITE));
    }
    if (d->colwise.codes.arena != NULL) {
        QT_TRY(op_mxfp8_use_dir(p, op, base + offsetof(mxfp8_quantize_args, col_codes),
                                base + offsetof(mxfp8_quantize_args, col_scales), &d->colwise,
                                d->col_values ? 2 * codes : codes,
                                op_mxfp8_col_scales_bytes(d->rows, d->cols), d->col_values,
                                PROG_WRITE));
    }
    return op_group_use(p, op, (uint32_t)(base + offsetof(mxfp8_quantize_args, group)),
                        &d->group);
}

qt_status op_mxfp8_quantize(program *p, const char *name, const op_mxfp8_quantize_desc *d) {
    QT_ASSERT(d->dtype == QT_DTYPE_BF16 || d->dtype == QT_DTYPE_F32);
    if (d->rows == 0 || d->cols == 0) return QT_OK;
    mxfp8_quantize_args args = op_mxfp8_quantize_fill(d);
    launch_shape shape = {{(uint32_t)op_mxfp8_quantize_tiles(d), 1, 1}, {QT_MXFP8_THREADS, 1, 1},
                          0};
    kernel_id kernel =
        d->dtype == QT_DTYPE_BF16 ? KERNEL_MXFP8_QUANTIZE_BF16 : KERNEL_MXFP8_QUANTIZE_F32;
    uint32_t op;
    QT_TRY(prog_append(p, kernel, name, &shape, &args, sizeof args, &op));
    return op_mxfp8_quantize_use(p, op, 0, d);
}

// Persistent: every tile its block, up to QT_MXFP8_ACT_FWD_BLOCKS_PER_SM (backward: _BWD_)
// blocks an SM of the planned GPUs (OP_PLAN_SMS), each with the table (backward: and a tile of
// dy) in its dynamic shared memory.
qt_status op_mxfp8_act(program *p, const char *name, uint32_t act, bool backward, prog_ref dy,
                       const op_mxfp8_quantize_desc *d) {
    QT_ASSERT(act == QT_ACT_GELU || act == QT_ACT_SILU);
    QT_ASSERT(d->dtype == QT_DTYPE_BF16 && !d->tile_2d && d->group.count == 0);
    QT_ASSERT(d->rowwise.codes.arena != NULL || d->colwise.codes.arena != NULL);
    QT_ASSERT(d->rows >= 1 && d->cols >= 1 && d->cols % 8 == 0 && d->in.offset % 16 == 0);
    QT_ASSERT(!backward || (prog_ref_present(dy) && dy.offset % 16 == 0));
    mxfp8_act_args args = {0};
    args.cast = op_mxfp8_quantize_fill(d);
    args.act = act;
    uint64_t per_sm = backward ? QT_MXFP8_ACT_BWD_BLOCKS_PER_SM : QT_MXFP8_ACT_FWD_BLOCKS_PER_SM;
    uint64_t blocks = OP_PLAN_SMS * per_sm, tiles = op_mxfp8_quantize_tiles(d);
    if (tiles < blocks) blocks = tiles;
    launch_shape shape = {{(uint32_t)blocks, 1, 1}, {QT_MXFP8_THREADS, 1, 1},
                          backward ? QT_MXFP8_ACT_BWD_SMEM_BYTES : QT_MXFP8_ACT_TABLE_BYTES};
    uint32_t op;
    QT_TRY(prog_append(p, backward ? KERNEL_MXFP8_ACT_BWD : KERNEL_MXFP8_ACT_FWD, name, &shape,
                       &args, sizeof args, &op));
    if (backward) {
        op_mxfp8_assert_fits(dy, (uint64_t)d->rows * d->cols * 2);
        QT_TRY(prog_use(p, op, offsetof(mxfp8_act_args, dy), dy, PROG_READ));
    }
    return op_mxfp8_quantize_use(p, op, offsetof(mxfp8_act_args, cast), d);
}

qt_status op_mxfp8_dequantize(program *p, const char *name, const op_mxfp8_dequantize_desc *d) {
    QT_ASSERT(d->dtype == QT_DTYPE_BF16 || d->dtype == QT_DTYPE_F32);
    if (d->rows == 0 || d->cols == 0) return QT_OK;
    mxfp8_dequantize_args args = {0};
    args.rows = d->rows;
    args.cols = d->cols;
    args.dtype = d->dtype;
    args.elem = op_mxfp8_elem(d->elem);
    args.colwise = d->colwise ? 1u : 0u;
    // Grid-stride over 16-element chunks of each row.
    uint64_t chunks = (uint64_t)d->rows * ((d->cols + 15) / 16);
    launch_shape shape = op_shape_1d(chunks, 256);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MXFP8_DEQUANTIZE, name, &shape, &args, sizeof args, &op));
    uint64_t scales = d->colwise ? op_mxfp8_col_scales_bytes(d->rows, d->cols)
                                 : op_mxfp8_row_scales_bytes(d->rows, d->cols);
    QT_TRY(op_mxfp8_use_dir(p, op, offsetof(mxfp8_dequantize_args, codes),
                            offsetof(mxfp8_dequantize_args, scales), &d->src,
                            op_mxfp8_codes_bytes(d->rows, d->cols), scales, false,
                            PROG_READ));
    uint64_t elem_bytes = d->dtype == QT_DTYPE_BF16 ? 2 : 4;
    op_mxfp8_assert_fits(d->out, (uint64_t)d->rows * d->cols * elem_bytes);
    QT_TRY(prog_use(p, op, offsetof(mxfp8_dequantize_args, out), d->out, PROG_WRITE));
    return op_group_use(p, op, offsetof(mxfp8_dequantize_args, group), &d->group);
}
