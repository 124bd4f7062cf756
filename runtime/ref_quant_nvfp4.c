// C twins of ptx/quant_nvfp4.cu: plain loops over 16-row blocks that call the same QT_HD
// arithmetic (ptx/quant_nvfp4.h), so every output matches the GPU bit for bit. The launch shape
// never changes a result and is ignored.
#include "ref.h"

// Element (row, col) of x as FP32, or 0 where the span says padding (row >= valid_end) and past
// the matrix, as the kernels zero-fill their tiles.
static float ref_nvfp4_x(const void *x, uint32_t dtype, uint32_t rows, uint32_t cols,
                         qt_nvfp4_span span, uint32_t row, uint32_t col) {
    if (row >= span.valid_end || row >= rows || col >= cols) return 0.0f;
    uint64_t index = (uint64_t)row * cols + col;
    if (dtype == QT_DTYPE_F32) return ((const float *)x)[index];
    return qt_bf16_to_f32(((const uint16_t *)x)[index]);
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

static void ref_nvfp4_amax_max(float *slot, float value) {
    if (qt_f32_bits(value) > qt_f32_bits(*slot)) *slot = value;  // the kernel's atomicMax
}

void ref_qt_nvfp4_amax_zero(const nvfp4_amax_args *a, const launch_shape *shape) {
    (void)shape;
    uint32_t n = a->group.count ? a->group.count : 1u;
    for (uint32_t i = 0; i < n; i++) {
        REF_PTR(float, a->amax_row)[i] = 0.0f;
        if (a->flags & QT_NVFP4_COLWISE) REF_PTR(float, a->amax_col)[i] = 0.0f;
    }
}

// The post-RHT amax of column `col` of the block at row0 (positions below store_end only).
static float ref_nvfp4_rht_amax(const nvfp4_amax_args *a, qt_nvfp4_span span, uint32_t row0,
                                uint32_t col) {
    float v[16];
    for (uint32_t j = 0; j < 16; j++) {
        v[j] = ref_nvfp4_x(REF_PTR(const void, a->x), a->dtype, a->rows, a->cols, span,
                           row0 + j, col);
    }
    ref_nvfp4_rht(v, a->dtype, a->rht_signs);
    float amax = 0.0f;
    for (uint32_t j = 0; j < 16 && row0 + j < span.store_end; j++) {
        amax = qt_nvfp4_absmax(amax, v[j]);
    }
    return amax;
}

void ref_qt_nvfp4_amax(const nvfp4_amax_args *a, const launch_shape *shape) {
    (void)shape;
    const void *x = REF_PTR(const void, a->x);
    for (uint32_t row0 = 0; row0 < a->rows; row0 += 16) {
        qt_nvfp4_span span = ref_nvfp4_span(&a->group, a->rows, row0);
        if (span.store_end <= row0) continue;
        float row_max = 0.0f;
        for (uint32_t r = row0; r < row0 + 16; r++) {
            for (uint32_t k = 0; k < a->cols; k++) {
                row_max = qt_nvfp4_absmax(row_max,
                                          ref_nvfp4_x(x, a->dtype, a->rows, a->cols, span, r, k));
            }
        }
        float col_max = row_max;
        if (a->flags & QT_NVFP4_RHT) {
            col_max = 0.0f;
            for (uint32_t k = 0; k < a->cols; k++) {
                col_max = qt_nvfp4_absmax(col_max, ref_nvfp4_rht_amax(a, span, row0, k));
            }
        }
        ref_nvfp4_amax_max(REF_PTR(float, a->amax_row) + span.member, row_max);
        if (a->flags & QT_NVFP4_COLWISE) {
            ref_nvfp4_amax_max(REF_PTR(float, a->amax_col) + span.member, col_max);
        }
    }
}

// max |x| over the 16x16 tile (row0, 16 * kb).
static float ref_nvfp4_tile_amax(const nvfp4_quantize_args *a, qt_nvfp4_span span,
                                 uint32_t row0, uint32_t kb) {
    float amax = 0.0f;
    for (uint32_t r = row0; r < row0 + 16; r++) {
        for (uint32_t k = kb * 16; k < kb * 16 + 16; k++) {
            amax = qt_nvfp4_absmax(amax, ref_nvfp4_x(REF_PTR(const void, a->x), a->dtype,
                                                     a->rows, a->cols, span, r, k));
        }
    }
    return amax;
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
        qt_nvfp4_encode16_sr(v, mult, qt_quant_random16(a->seed, step, tensor_id, row, block), q);
    } else {
        qt_nvfp4_encode16_rn(v, mult, sb, q);  // fast encoder where the kernel takes it
    }
    return sb;
}

static void ref_nvfp4_store_codes(uint8_t *dst, const uint32_t q[2], uint32_t nbytes) {
    for (uint32_t i = 0; i < nbytes; i++) dst[i] = (uint8_t)(q[i / 4] >> (8 * (i % 4)));
}

static void ref_nvfp4_rowwise(const nvfp4_quantize_args *a, qt_nvfp4_span span, uint32_t row0,
                              uint64_t step) {
    const uint32_t rpitch = (a->cols + 1) / 2, spitch = (a->cols + 15) / 16;
    qt_nvfp4_scale s = qt_nvfp4_scale_of(REF_PTR(const float, a->amax_row)[span.member]);
    for (uint32_t r = row0; r < row0 + 16 && r < span.store_end; r++) {
        for (uint32_t kb = 0; kb * 16 < a->cols; kb++) {
            float v[16];
            for (uint32_t j = 0; j < 16; j++) {
                v[j] = ref_nvfp4_x(REF_PTR(const void, a->x), a->dtype, a->rows, a->cols, span,
                                   r, kb * 16 + j);
            }
            float tile = (a->flags & QT_NVFP4_2D) ? ref_nvfp4_tile_amax(a, span, row0, kb) : 0;
            uint32_t q[2];
            uint8_t sb = ref_nvfp4_block(a, v, tile, s, a->tensor_id, r, kb, step, q);
            uint32_t nbytes = (a->cols - kb * 16 + 1) / 2;
            ref_nvfp4_store_codes(REF_PTR(uint8_t, a->row_data) + (uint64_t)r * rpitch + kb * 8,
                                  q, nbytes < 8 ? nbytes : 8);
            REF_PTR(uint8_t, a->row_scales)[(uint64_t)r * spitch + kb] = sb;
        }
    }
}

static void ref_nvfp4_colwise(const nvfp4_quantize_args *a, qt_nvfp4_span span, uint32_t row0,
                              uint64_t step) {
    const uint32_t cpitch = (a->rows + 1) / 2, cspitch = (a->rows + 15) / 16;
    const uint32_t n_store = span.store_end - row0 < 16 ? span.store_end - row0 : 16;
    qt_nvfp4_scale s = qt_nvfp4_scale_of(REF_PTR(const float, a->amax_col)[span.member]);
    for (uint32_t k = 0; k < a->cols; k++) {
        float v[16];
        for (uint32_t j = 0; j < 16; j++) {
            v[j] = ref_nvfp4_x(REF_PTR(const void, a->x), a->dtype, a->rows, a->cols, span,
                               row0 + j, k);
        }
        if (a->flags & QT_NVFP4_RHT) {
            ref_nvfp4_rht(v, a->dtype, a->rht_signs);
            for (uint32_t j = n_store; j < 16; j++) v[j] = 0.0f;
        }
        float tile = (a->flags & QT_NVFP4_2D) ? ref_nvfp4_tile_amax(a, span, row0, k / 16) : 0;
        uint32_t q[2];
        uint8_t sb = ref_nvfp4_block(a, v, tile, s, a->tensor_id | QT_QUANT_TENSOR_COLWISE, k,
                                     row0 / 16, step, q);
        ref_nvfp4_store_codes(REF_PTR(uint8_t, a->col_data) + (uint64_t)k * cpitch + row0 / 2, q,
                              (n_store + 1) / 2);
        REF_PTR(uint8_t, a->col_scales)[(uint64_t)k * cspitch + row0 / 16] = sb;
    }
}

void ref_qt_nvfp4_quantize(const nvfp4_quantize_args *a, const launch_shape *shape) {
    (void)shape;
    uint64_t step = (a->flags & QT_NVFP4_SR) ? *REF_PTR(const uint64_t, a->step) : 0;
    for (uint32_t row0 = 0; row0 < a->rows; row0 += 16) {
        qt_nvfp4_span span = ref_nvfp4_span(&a->group, a->rows, row0);
        if (span.store_end <= row0) continue;
        if (a->flags & QT_NVFP4_ROWWISE) ref_nvfp4_rowwise(a, span, row0, step);
        if (a->flags & QT_NVFP4_COLWISE) ref_nvfp4_colwise(a, span, row0, step);
    }
}

// The BF16 fast cast's kernel computes exactly what the general one does.
void ref_qt_nvfp4_quantize_bf16(const nvfp4_quantize_args *a, const launch_shape *shape) {
    ref_qt_nvfp4_quantize(a, shape);
}

void ref_qt_nvfp4_dequantize(const nvfp4_dequantize_args *a, const launch_shape *shape) {
    (void)shape;
    const uint8_t *data = REF_PTR(const uint8_t, a->data);
    const uint8_t *scales = REF_PTR(const uint8_t, a->scales);
    for (uint32_t row0 = 0; row0 < a->rows; row0 += 16) {
        qt_nvfp4_span span = ref_nvfp4_span(&a->group, a->rows, row0);
        if (span.store_end <= row0) continue;
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
}

void ref_qt_nvfp4_decode(const nvfp4_decode_args *a, const launch_shape *shape) {
    (void)shape;  // the reference backend's addresses are host pointers (REF_PTR)
    uint64_t blocks = (uint64_t)a->rows * ((a->k + 15) / 16);
    for (uint64_t b = 0; b < blocks; b++) qt_nvfp4_decode_block(a, b);
}
