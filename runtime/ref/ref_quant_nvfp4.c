// C twins of ptx/quant_nvfp4.cu: loops over 16-row blocks that call the same QT_HD arithmetic
// (ptx/quant_nvfp4.h), so every output matches the GPU bit for bit. The launch shape never
// changes a result and is ignored.
//
// Each 16-row block is a task of the thread pool (runtime/base/pool.h): a block writes only its own
// rows of the rowwise copy and its own 16-position run of every column of the columnwise copy,
// and every value is a function of the block's inputs (stochastic rounding keys its random bytes
// by tensor, row and block, never by order), so the bytes do not depend on which thread ran it.
// The amaxes are maxima, which do not depend on order either: blocks merge theirs as the GPU's
// atomicMax does. A block is read one 16 x 16 tile at a time, and every rowwise block, columnwise
// block and 2-D tile amax of the tile is computed from that copy.
#include "runtime/base/pool.h"  // pool_run, POOL_CPU_CLONES
#include "runtime/ref/ref.h"

// Element (row, col) of x as FP32, or 0 where the span says padding (row >= valid_end) and past
// the matrix, as the kernels zero-fill their tiles.
static float ref_nvfp4_x(const void *x, uint32_t dtype, uint32_t rows, uint32_t cols,
                         qt_nvfp4_span span, uint32_t row, uint32_t col) {
    if (row >= span.valid_end || row >= rows || col >= cols) return 0.0f;
    uint64_t index = (uint64_t)row * cols + col;
    if (dtype == QT_DTYPE_F32) return ((const float *)x)[index];
    return qt_bf16_to_f32(((const uint16_t *)x)[index]);
}

// The 16 x 16 tile of the block at row0 and column block kb: t[j][c] = element (row0 + j,
// 16 kb + c) as ref_nvfp4_x reads it.
static void ref_nvfp4_tile(const void *x, uint32_t dtype, uint32_t rows, uint32_t cols,
                           qt_nvfp4_span span, uint32_t row0, uint32_t kb, float t[16][16]) {
    for (uint32_t j = 0; j < 16; j++) {
        for (uint32_t c = 0; c < 16; c++) {
            t[j][c] = ref_nvfp4_x(x, dtype, rows, cols, span, row0 + j, kb * 16 + c);
        }
    }
}

static qt_nvfp4_span ref_nvfp4_span(const qt_group_desc *g, uint32_t rows, uint32_t row) {
    return qt_nvfp4_span_of(REF_PTR(const uint32_t, g->row_offsets),
                            REF_PTR(const uint32_t, g->first_dims), g->count, rows, row);
}

// The RHT as the kernels run it: BF16 groups through the fused first stage (same results).
static void ref_nvfp4_rht(float v[16], uint32_t dtype, uint32_t signs) {
    if (dtype == QT_DTYPE_BF16) {
        qt_nvfp4_rht16_bf16in(v, signs);
    } else {
        qt_nvfp4_rht16(v, signs);
    }
}

void ref_qt_nvfp4_amax_zero(const nvfp4_amax_args *a, const launch_shape *shape) {
    (void)shape;
    uint32_t n = a->group.count ? a->group.count : 1u;
    for (uint32_t i = 0; i < n; i++) {
        REF_PTR(float, a->amax_row)[i] = 0.0f;
        if (a->flags & QT_NVFP4_COLWISE) REF_PTR(float, a->amax_col)[i] = 0.0f;
    }
}

// Task: the row amax of one block (every element), and its column amax (positions below
// store_end of each column's transform with RHT; the row amax without).
POOL_CPU_CLONES static void ref_nvfp4_amax_block(void *ctx, uint32_t block, uint32_t thread) {
    (void)thread;
    const nvfp4_amax_args *a = ctx;
    uint32_t row0 = block * 16;
    qt_nvfp4_span span = ref_nvfp4_span(&a->group, a->rows, row0);
    if (span.store_end <= row0) return;
    float row_max = 0.0f, col_max = 0.0f;
    for (uint32_t kb = 0; kb * 16 < a->cols; kb++) {
        float t[16][16];
        ref_nvfp4_tile(REF_PTR(const void, a->x), a->dtype, a->rows, a->cols, span, row0, kb, t);
        for (uint32_t j = 0; j < 16; j++) {
            for (uint32_t c = 0; c < 16; c++) row_max = qt_nvfp4_absmax(row_max, t[j][c]);
        }
        if (!(a->flags & QT_NVFP4_RHT)) continue;
        for (uint32_t c = 0; c < 16 && kb * 16 + c < a->cols; c++) {
            float v[16];
            for (uint32_t j = 0; j < 16; j++) v[j] = t[j][c];
            ref_nvfp4_rht(v, a->dtype, a->rht_signs);
            for (uint32_t j = 0; j < 16 && row0 + j < span.store_end; j++) {
                col_max = qt_nvfp4_absmax(col_max, v[j]);
            }
        }
    }
    if (!(a->flags & QT_NVFP4_RHT)) col_max = row_max;
    ref_amax_merge(REF_PTR(float, a->amax_row) + span.member, row_max);
    if (a->flags & QT_NVFP4_COLWISE) {
        ref_amax_merge(REF_PTR(float, a->amax_col) + span.member, col_max);
    }
}

void ref_qt_nvfp4_amax(const nvfp4_amax_args *a, const launch_shape *shape) {
    (void)shape;
    pool_run((a->rows + 15) / 16, ref_nvfp4_amax_block, (void *)a);
}

// Block amax, scale byte, codes: what one kernel task computes for 16 values.
static uint8_t ref_nvfp4_block(const nvfp4_quantize_args *a, const float v[16], float amax_b,
                               qt_nvfp4_scale s, uint32_t tensor_id, uint32_t row,
                               uint32_t block, uint64_t step, uint32_t q[2]) {
    if (!(a->flags & QT_NVFP4_2D)) {
        amax_b = 0.0f;
        for (int j = 0; j < 16; j++) amax_b = qt_nvfp4_absmax(amax_b, v[j]);
    }
    uint8_t sb = qt_nvfp4_block_scale(amax_b, s);
    float mult = qt_nvfp4_block_mult(sb, s.s_dec);
    if (a->flags & QT_NVFP4_SR) {
        // The branch-free form of the kernels' encoder, the same codes (quant_nvfp4.h).
        qt_nvfp4_encode16_sr_select(v, mult,
                                    qt_quant_random16(a->seed, step, tensor_id, row, block), q);
    } else {
        qt_nvfp4_encode16_rn(v, mult, sb, q);  // fast encoder where the kernel takes it
    }
    return sb;
}

static void ref_nvfp4_store_codes(uint8_t *dst, const uint32_t q[2], uint32_t nbytes) {
    for (uint32_t i = 0; i < nbytes; i++) dst[i] = (uint8_t)(q[i / 4] >> (8 * (i % 4)));
}

// QT_NVFP4_*_VALUES: a whole block's codes as qt_nvfp4_decode_block writes them.
static void ref_nvfp4_store_values(uint16_t *dst, const uint32_t q[2], uint8_t sb) {
    for (uint32_t j = 0; j < 16; j++) {
        uint8_t nibble = (uint8_t)((q[j / 8] >> (4 * (j % 8))) & 0xFu);
        dst[j] = qt_f32_to_bf16(qt_nvfp4_raw_value(nibble, sb));
    }
}

// The rowwise blocks of tile (row0, kb): rows below store_end, 16 columns each.
static void ref_nvfp4_rowwise(const nvfp4_quantize_args *a, qt_nvfp4_span span, uint32_t row0,
                              uint32_t kb, float t[16][16], float tile_amax, uint64_t step) {
    const uint32_t rpitch = (a->cols + 1) / 2, spitch = (a->cols + 15) / 16;
    qt_nvfp4_scale s = qt_nvfp4_scale_of(REF_PTR(const float, a->amax_row)[span.member]);
    uint32_t nbytes = (a->cols - kb * 16 + 1) / 2;
    for (uint32_t r = row0; r < row0 + 16 && r < span.store_end; r++) {
        uint32_t q[2];
        uint8_t sb = ref_nvfp4_block(a, t[r - row0], tile_amax, s, a->tensor_id, r, kb, step, q);
        if (a->flags & QT_NVFP4_ROW_VALUES) {
            ref_nvfp4_store_values(REF_PTR(uint16_t, a->row_data) + (uint64_t)r * a->cols + kb * 16,
                                   q, sb);
            continue;
        }
        ref_nvfp4_store_codes(REF_PTR(uint8_t, a->row_data) + (uint64_t)r * rpitch + kb * 8, q,
                              nbytes < 8 ? nbytes : 8);
        REF_PTR(uint8_t, a->row_scales)[(uint64_t)r * spitch + kb] = sb;
    }
}

// The columnwise blocks of tile (row0, kb): its columns below cols, 16 positions each (the RHT
// of the column first, with RHT; positions from store_end on are neither stored nor counted).
static void ref_nvfp4_colwise(const nvfp4_quantize_args *a, qt_nvfp4_span span, uint32_t row0,
                              uint32_t kb, float t[16][16], float tile_amax, uint64_t step) {
    const uint32_t cpitch = (a->rows + 1) / 2, cspitch = (a->rows + 15) / 16;
    const uint32_t n_store = span.store_end - row0 < 16 ? span.store_end - row0 : 16;
    qt_nvfp4_scale s = qt_nvfp4_scale_of(REF_PTR(const float, a->amax_col)[span.member]);
    for (uint32_t k = kb * 16; k < kb * 16 + 16 && k < a->cols; k++) {
        float v[16];
        for (uint32_t j = 0; j < 16; j++) v[j] = t[j][k - kb * 16];
        if (a->flags & QT_NVFP4_RHT) {
            ref_nvfp4_rht(v, a->dtype, a->rht_signs);
            for (uint32_t j = n_store; j < 16; j++) v[j] = 0.0f;
        }
        uint32_t q[2];
        uint8_t sb = ref_nvfp4_block(a, v, tile_amax, s, a->tensor_id | QT_QUANT_TENSOR_COLWISE, k,
                                     row0 / 16, step, q);
        if (a->flags & QT_NVFP4_COL_VALUES) {
            ref_nvfp4_store_values(REF_PTR(uint16_t, a->col_data) + (uint64_t)k * a->rows + row0,
                                   q, sb);
            continue;
        }
        ref_nvfp4_store_codes(REF_PTR(uint8_t, a->col_data) + (uint64_t)k * cpitch + row0 / 2, q,
                              (n_store + 1) / 2);
        REF_PTR(uint8_t, a->col_scales)[(uint64_t)k * cspitch + row0 / 16] = sb;
    }
}

// Task: every tile of one 16-row block, in both enabled directions.
POOL_CPU_CLONES static void ref_nvfp4_quantize_block(void *ctx, uint32_t block,
                                                     uint32_t thread) {
    (void)thread;
    const nvfp4_quantize_args *a = ctx;
    uint32_t row0 = block * 16;
    qt_nvfp4_span span = ref_nvfp4_span(&a->group, a->rows, row0);
    if (span.store_end <= row0) return;
    uint64_t step = (a->flags & QT_NVFP4_SR) ? *REF_PTR(const uint64_t, a->step) : 0;
    for (uint32_t kb = 0; kb * 16 < a->cols; kb++) {
        float t[16][16];
        ref_nvfp4_tile(REF_PTR(const void, a->x), a->dtype, a->rows, a->cols, span, row0, kb, t);
        float tile_amax = 0.0f;  // the 2-D scale's amax: every element of the tile
        if (a->flags & QT_NVFP4_2D) {
            for (uint32_t j = 0; j < 16; j++) {
                for (uint32_t c = 0; c < 16; c++) tile_amax = qt_nvfp4_absmax(tile_amax, t[j][c]);
            }
        }
        if (a->flags & QT_NVFP4_ROWWISE) ref_nvfp4_rowwise(a, span, row0, kb, t, tile_amax, step);
        if (a->flags & QT_NVFP4_COLWISE) ref_nvfp4_colwise(a, span, row0, kb, t, tile_amax, step);
    }
}

void ref_qt_nvfp4_quantize(const nvfp4_quantize_args *a, const launch_shape *shape) {
    (void)shape;
    pool_run((a->rows + 15) / 16, ref_nvfp4_quantize_block, (void *)a);
}

// The fast casts' kernels (BF16 rounding to nearest or stochastically, FP32 with 16 x 16 tiles)
// compute exactly what the general one does.
void ref_qt_nvfp4_quantize_bf16(const nvfp4_quantize_args *a, const launch_shape *shape) {
    ref_qt_nvfp4_quantize(a, shape);
}

void ref_qt_nvfp4_quantize_bf16_sr(const nvfp4_quantize_args *a, const launch_shape *shape) {
    ref_qt_nvfp4_quantize(a, shape);
}

void ref_qt_nvfp4_quantize_f32_2d(const nvfp4_quantize_args *a, const launch_shape *shape) {
    ref_qt_nvfp4_quantize(a, shape);
}

// Task: the 16-row block `block`.
POOL_CPU_CLONES static void ref_nvfp4_dequantize_block(void *ctx, uint32_t block,
                                                       uint32_t thread) {
    (void)thread;
    const nvfp4_dequantize_args *a = ctx;
    const uint8_t *data = REF_PTR(const uint8_t, a->data);
    const uint8_t *scales = REF_PTR(const uint8_t, a->scales);
    uint32_t row0 = block * 16;
    qt_nvfp4_span span = ref_nvfp4_span(&a->group, a->rows, row0);
    if (span.store_end <= row0) return;
    float amax = REF_PTR(const float, a->amax)[span.member];
    for (uint32_t m = row0; m < row0 + 16 && m < span.store_end; m++) {
        for (uint32_t k = 0; k < a->cols; k++) {
            uint8_t byte, sb;
            if (a->colwise) {
                byte = data[(uint64_t)k * ((a->rows + 1) / 2) + m / 2];
                sb = scales[(uint64_t)k * ((a->rows + 15) / 16) + m / 16];
            } else {
                byte = data[(uint64_t)m * ((a->cols + 1) / 2) + k / 2];
                sb = scales[(uint64_t)m * ((a->cols + 15) / 16) + k / 16];
            }
            uint32_t pos = a->colwise ? m : k;
            uint8_t nibble = (uint8_t)((byte >> (4 * (pos & 1))) & 0xFu);
            float value = qt_nvfp4_dequant_value(nibble, sb, amax);
            uint64_t index = (uint64_t)m * a->cols + k;
            if (a->out_dtype == QT_DTYPE_F32) {
                REF_PTR(float, a->out)[index] = value;
            } else {
                REF_PTR(uint16_t, a->out)[index] = qt_f32_to_bf16(value);
            }
        }
    }
}

void ref_qt_nvfp4_dequantize(const nvfp4_dequantize_args *a, const launch_shape *shape) {
    (void)shape;
    pool_run((a->rows + 15) / 16, ref_nvfp4_dequantize_block, (void *)a);
}

POOL_CPU_CLONES static void ref_nvfp4_decode_blocks(void *ctx, uint64_t begin, uint64_t end) {
    for (uint64_t b = begin; b < end; b++) qt_nvfp4_decode_block(ctx, b);
}

void ref_qt_nvfp4_decode(const nvfp4_decode_args *a, const launch_shape *shape) {
    (void)shape;  // the reference backend's addresses are host pointers (REF_PTR)
    uint64_t blocks = (uint64_t)a->rows * ((a->k + 15) / 16);
    pool_for(blocks, REF_TASK_ELEMS / 16, ref_nvfp4_decode_blocks, (void *)a);
}
