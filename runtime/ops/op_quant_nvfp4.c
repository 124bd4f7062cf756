#include "runtime/ops/op_quant_nvfp4.h"

#include <stddef.h>  // offsetof

#include "ptx/core.h"             // QT_DTYPE_*
#include "runtime/ops/op_core.h"  // op_shape_1d

#define OP_NVFP4_GRID_Y_MAX 65535u  // the kernels stride over row blocks beyond it
// The quantize kernels' CTAs stride over row tiles; about this many CTAs in all (three waves of
// four per SM on a 132-SM GPU), each taking several tiles.
#define OP_NVFP4_QUANT_CTAS 1584u

static uint32_t op_nvfp4_esize(uint32_t dtype) {
    QT_ASSERT(dtype == QT_DTYPE_BF16 || dtype == QT_DTYPE_F32);
    return dtype == QT_DTYPE_F32 ? 4u : 2u;
}

static uint32_t op_nvfp4_div_up(uint64_t n, uint64_t d) {
    uint64_t q = (n + d - 1) / d;
    return q == 0 ? 1u : (uint32_t)q;  // a grid dimension is at least 1; kernels skip the rest
}

static uint32_t op_nvfp4_grid_y(uint64_t row_tiles) {
    uint32_t y = op_nvfp4_div_up(row_tiles, 1);
    return y < OP_NVFP4_GRID_Y_MAX ? y : OP_NVFP4_GRID_Y_MAX;
}

// prog_use_span after checking that ref.offset is a multiple of `align`.
static qt_status op_nvfp4_use(program *p, uint32_t op, size_t field, prog_ref ref,
                              uint64_t bytes, uint64_t align, prog_access access) {
    QT_ASSERT(ref.offset % align == 0);
    return prog_use_span(p, op, (uint32_t)field, ref, bytes, access);
}

op_nvfp4_sizes op_nvfp4_sizes_of(uint32_t rows, uint32_t cols, uint32_t group_count) {
    op_nvfp4_sizes s;
    s.row_data = (uint64_t)rows * ((cols + 1ull) / 2);
    s.row_scales = (uint64_t)rows * ((cols + 15ull) / 16);
    s.col_data = (uint64_t)cols * ((rows + 1ull) / 2);
    s.col_scales = (uint64_t)cols * ((rows + 15ull) / 16);
    s.amax = 4ull * (group_count ? group_count : 1u);
    return s;
}

// The args of both amax kernels.
static nvfp4_amax_args op_nvfp4_amax_args_of(const op_nvfp4_input *in,
                                             const op_nvfp4_amax_out *out) {
    const bool colwise = prog_ref_present(out->amax_col);
    QT_ASSERT(!out->rht || colwise);
    nvfp4_amax_args args = {0};
    args.rows = in->rows;
    args.cols = in->cols;
    args.dtype = in->dtype;
    args.flags = (colwise ? QT_NVFP4_COLWISE : 0u) | (out->rht ? QT_NVFP4_RHT : 0u);
    args.rht_signs = out->rht_signs & 0xFFFFu;
    args.group.count = in->group.count;  // the zeroing reads the count alone of the group
    return args;
}

qt_status op_nvfp4_amax(program *p, const char *name, const op_nvfp4_input *in,
                        const op_nvfp4_amax_out *out) {
    const uint64_t amax_bytes = op_nvfp4_sizes_of(in->rows, in->cols, in->group.count).amax;
    nvfp4_amax_args args = op_nvfp4_amax_args_of(in, out);
    // Zeroing is its own launch: every CTA of the next one maxes into the arrays, so they must
    // be 0 before any of them starts, and stream order guarantees that. It zeroes one entry per
    // member.
    launch_shape zero_shape = {{1, 1, 1}, {QT_NVFP4_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_NVFP4_AMAX_ZERO, name, &zero_shape, &args, sizeof args, &op));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_amax_args, amax_row), out->amax_row, amax_bytes, 4,
                        PROG_WRITE));
    if (prog_ref_present(out->amax_col)) {
        QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_amax_args, amax_col), out->amax_col,
                            amax_bytes, 4, PROG_WRITE));
    }
    return op_nvfp4_amax_merge(p, name, in, out);
}

qt_status op_nvfp4_amax_merge(program *p, const char *name, const op_nvfp4_input *in,
                              const op_nvfp4_amax_out *out) {
    const uint32_t esize = op_nvfp4_esize(in->dtype);
    const bool colwise = prog_ref_present(out->amax_col);
    const uint64_t amax_bytes = op_nvfp4_sizes_of(in->rows, in->cols, in->group.count).amax;
    nvfp4_amax_args args = op_nvfp4_amax_args_of(in, out);
    uint32_t op;
    // grid.y: about QT_NVFP4_AMAX_CTAS CTAs in all, each striding over row blocks.
    const uint32_t grid_x = op_nvfp4_div_up(in->cols, QT_NVFP4_AMAX_COLS(esize));
    const uint64_t row_blocks = (in->rows + 15ull) / 16;
    const uint64_t per_x = QT_NVFP4_AMAX_CTAS / grid_x ? QT_NVFP4_AMAX_CTAS / grid_x : 1;
    launch_shape shape = {{grid_x, op_nvfp4_grid_y(row_blocks < per_x ? row_blocks : per_x), 1},
                          {QT_NVFP4_THREADS, 1, 1}, 0};
    QT_TRY(prog_append(p, KERNEL_NVFP4_AMAX, name, &shape, &args, sizeof args, &op));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_amax_args, x), in->x,
                        (uint64_t)in->rows * in->cols * esize, esize, PROG_READ));
    QT_TRY(op_group_use(p, op, offsetof(nvfp4_amax_args, group), &in->group));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_amax_args, amax_row), out->amax_row, amax_bytes, 4,
                        PROG_READ_WRITE));
    if (colwise) {
        QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_amax_args, amax_col), out->amax_col,
                            amax_bytes, 4, PROG_READ_WRITE));
    }
    return QT_OK;
}

static uint32_t op_nvfp4_quant_flags(const op_nvfp4_quant *q) {
    QT_ASSERT(q->rowwise || q->colwise);
    QT_ASSERT(!q->rht || q->colwise);
    QT_ASSERT(!(q->rht && q->two_d));  // TE never combines them; 2-D is for weights, RHT not
    QT_ASSERT(q->tensor_id < QT_QUANT_TENSOR_COLWISE);
    QT_ASSERT(!q->row_values || q->rowwise);
    QT_ASSERT(!q->col_values || q->colwise);
    return (q->rowwise ? QT_NVFP4_ROWWISE : 0u) | (q->colwise ? QT_NVFP4_COLWISE : 0u) |
           (q->rht ? QT_NVFP4_RHT : 0u) | (q->two_d ? QT_NVFP4_2D : 0u) |
           (q->stochastic ? QT_NVFP4_SR : 0u) | (q->row_values ? QT_NVFP4_ROW_VALUES : 0u) |
           (q->col_values ? QT_NVFP4_COL_VALUES : 0u);
}

// The output regions of the enabled directions: codes and scales, or (QT_NVFP4_*_VALUES) the
// codes' BF16 values, 16-byte aligned for the kernels' whole-block stores.
static qt_status op_nvfp4_quant_outputs(program *p, uint32_t op, const op_nvfp4_input *in,
                                        const op_nvfp4_quant *q) {
    const op_nvfp4_sizes s = op_nvfp4_sizes_of(in->rows, in->cols, in->group.count);
    const uint64_t values = 2ull * in->rows * in->cols;
    if (q->rowwise) {
        QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, amax_row), q->amax_row, s.amax,
                            4, PROG_READ));
        QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, row_data), q->row_data,
                            q->row_values ? values : s.row_data, q->row_values ? 16 : 1,
                            PROG_WRITE));
        if (!q->row_values) {
            QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, row_scales), q->row_scales,
                                s.row_scales, 1, PROG_WRITE));
        }
    }
    if (q->colwise) {
        QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, amax_col), q->amax_col, s.amax,
                            4, PROG_READ));
        QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, col_data), q->col_data,
                            q->col_values ? values : s.col_data, q->col_values ? 16 : 1,
                            PROG_WRITE));
        if (!q->col_values) {
            QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, col_scales), q->col_scales,
                                s.col_scales, 1, PROG_WRITE));
        }
    }
    return QT_OK;
}

qt_status op_nvfp4_quantize(program *p, const char *name, const op_nvfp4_input *in,
                            const op_nvfp4_quant *q) {
    const uint32_t esize = op_nvfp4_esize(in->dtype);
    nvfp4_quantize_args args = {0};
    args.seed = q->seed;
    args.rows = in->rows;
    args.cols = in->cols;
    args.dtype = in->dtype;
    args.flags = op_nvfp4_quant_flags(q);
    args.rht_signs = q->rht_signs & 0xFFFFu;
    args.tensor_id = q->tensor_id;
    // grid.y strides over row tiles: each CTA takes about total / OP_NVFP4_QUANT_CTAS tiles, so
    // that its per-CTA work (the multiplier table, the first load) is amortized and the next
    // tile's load overlaps this one's columnwise half.
    const uint32_t grid_x = op_nvfp4_div_up(in->cols, QT_NVFP4_QUANT_TILE_COLS);
    const uint64_t row_tiles = (in->rows + QT_NVFP4_QUANT_TILE_ROWS - 1ull) /
                               QT_NVFP4_QUANT_TILE_ROWS;
    const uint64_t per_cta = (uint64_t)grid_x * row_tiles / OP_NVFP4_QUANT_CTAS;
    const uint64_t grid_y = per_cta > 1 ? (row_tiles + per_cta - 1) / per_cta : row_tiles;
    // The fast casts have kernels of their own (one barrier per tile): BF16 without 2-D (four
    // CTAs per SM rounding to nearest, two with stochastic rounding) and FP32 with 2-D rounding
    // to nearest (the weights, three); all give the general kernel's bytes.
    const bool bf16_fast = in->dtype == QT_DTYPE_BF16 && !q->two_d;
    const bool f32_2d = in->dtype == QT_DTYPE_F32 && q->two_d && !q->stochastic;
    // Values are written by the BF16 fast kernels' whole-block stores only.
    QT_ASSERT(!(q->row_values || q->col_values) ||
              (bf16_fast && in->group.count == 0 && in->rows % 16 == 0 && in->cols % 16 == 0));
    launch_shape shape = {{grid_x, op_nvfp4_grid_y(grid_y), 1},
                          {QT_NVFP4_THREADS, 1, 1},
                          bf16_fast ? QT_NVFP4_QUANT_BF16_SMEM
                          : f32_2d  ? QT_NVFP4_QUANT_F32_SMEM
                                    : QT_NVFP4_QUANT_SMEM(esize)};
    const kernel_id kernel = f32_2d          ? KERNEL_NVFP4_QUANTIZE_F32_2D
                             : !bf16_fast    ? KERNEL_NVFP4_QUANTIZE
                             : q->stochastic ? KERNEL_NVFP4_QUANTIZE_BF16_SR
                                             : KERNEL_NVFP4_QUANTIZE_BF16;
    uint32_t op;
    QT_TRY(prog_append(p, kernel, name, &shape, &args, sizeof args, &op));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, x), in->x,
                        (uint64_t)in->rows * in->cols * esize, esize, PROG_READ));
    QT_TRY(op_group_use(p, op, offsetof(nvfp4_quantize_args, group), &in->group));
    if (q->stochastic) {
        QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_quantize_args, step), q->step, 8, 8,
                            PROG_READ));
    }
    return op_nvfp4_quant_outputs(p, op, in, q);
}

qt_status op_nvfp4_dequantize(program *p, const char *name, const op_nvfp4_dequant *d) {
    const uint32_t out_esize = op_nvfp4_esize(d->out_dtype);
    const op_nvfp4_sizes s = op_nvfp4_sizes_of(d->rows, d->cols, d->group.count);
    nvfp4_dequantize_args args = {0};
    args.rows = d->rows;
    args.cols = d->cols;
    args.out_dtype = d->out_dtype;
    args.colwise = d->colwise ? 1u : 0u;
    launch_shape shape = {{op_nvfp4_div_up(d->cols, QT_NVFP4_DEQUANT_COLS),
                           op_nvfp4_grid_y((d->rows + 15ull) / 16), 1},
                          {QT_NVFP4_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_NVFP4_DEQUANTIZE, name, &shape, &args, sizeof args, &op));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_dequantize_args, data), d->data,
                        d->colwise ? s.col_data : s.row_data, 1, PROG_READ));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_dequantize_args, scales), d->scales,
                        d->colwise ? s.col_scales : s.row_scales, 1, PROG_READ));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_dequantize_args, amax), d->amax, s.amax, 4,
                        PROG_READ));
    QT_TRY(op_group_use(p, op, offsetof(nvfp4_dequantize_args, group), &d->group));
    return op_nvfp4_use(p, op, offsetof(nvfp4_dequantize_args, out), d->out,
                        (uint64_t)d->rows * d->cols * out_esize, out_esize, PROG_WRITE);
}

qt_status op_nvfp4_decode(program *p, const char *name, prog_ref data, prog_ref scales,
                          prog_ref out, uint32_t rows, uint32_t k) {
    QT_ASSERT(rows >= 1 && k >= 1);
    nvfp4_decode_args args = {0};
    args.rows = rows;
    args.k = k;
    uint64_t blocks = (uint64_t)rows * ((k + 15) / 16);
    launch_shape shape = op_shape_1d(blocks, QT_NVFP4_THREADS);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_NVFP4_DECODE, name, &shape, &args, sizeof args, &op));
    // The vector path reads 8 code bytes and writes 32 bytes per block.
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_decode_args, data), data,
                        (uint64_t)rows * ((k + 1ull) / 2), k % 16 == 0 ? 8 : 1, PROG_READ));
    QT_TRY(op_nvfp4_use(p, op, offsetof(nvfp4_decode_args, scales), scales,
                        (uint64_t)rows * ((k + 15ull) / 16), 1, PROG_READ));
    return op_nvfp4_use(p, op, offsetof(nvfp4_decode_args, out), out, (uint64_t)rows * k * 2u,
                        k % 16 == 0 ? 16 : 2, PROG_WRITE);
}
