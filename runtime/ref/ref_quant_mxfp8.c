// C twins of ptx/quant_mxfp8.cu: plain loops over the MXFP8 blocks, with the per-element
// arithmetic of ptx/quant_mxfp8.h, so the bits are the kernels' bits. Rows (rowwise) and 32-row
// blocks (columnwise, 2-D), which own their codes and scales, are tasks of the thread pool.
#include "runtime/base/pool.h"    // pool_for, POOL_CPU_CLONES
#include "runtime/ref/ref.h"
#include "runtime/base/status.h"  // QT_ASSERT

// 1 when active row `row` holds data (not padding); the reference backend's group arrays are
// host memory, so the descriptor's addresses are used as they are.
static uint32_t mxfp8_ref_state(const mxfp8_quantize_args *a, uint32_t row) {
    return (uint32_t)qt_mxfp8_row_valid(a->group, a->rows, row);
}

typedef struct mxfp8_ref_job {
    const mxfp8_quantize_args *a;
    uint32_t end;                // active rows
    const mxfp8_act_args *act;  // the activation casts: y of a->in (and act->dy), else NULL
    bool backward;
} mxfp8_ref_job;

// Element (row, col) as the kernel sees it: zero in padding rows; with an activation, y as the
// activation ops store it (qt_act_forward / qt_act_backward rounded to BF16).
static float mxfp8_ref_x(const mxfp8_ref_job *job, uint32_t row, uint32_t state, uint32_t col) {
    const mxfp8_quantize_args *a = job->a;
    if (!state) return 0.0f;
    uint64_t i = (uint64_t)row * a->cols + col;
    float x = qt_mxfp8_load(REF_PTR(const void, a->in), a->dtype, i);
    if (!job->act) return x;
    float y = job->backward
                  ? qt_act_backward(job->act->act, x,
                                    qt_bf16_to_f32(REF_PTR(const uint16_t, job->act->dy)[i]))
                  : qt_act_forward(job->act->act, x);
    return qt_bf16_to_f32(qt_f32_to_bf16(y));
}

// Element `index` of one direction's output: the code, or with that direction's VALUES flag
// its BF16 value (whose scale is then not stored: mxfp8_ref_scale).
static void mxfp8_ref_out(const mxfp8_quantize_args *a, uint64_t out, uint32_t values_flag,
                          uint64_t index, uint8_t code, uint8_t e) {
    if (a->flags & values_flag) {
        REF_PTR(uint16_t, out)[index] = qt_mxfp8_value_bf16(code, e, a->elem);
    } else {
        REF_PTR(uint8_t, out)[index] = code;
    }
}

static void mxfp8_ref_scale(const mxfp8_quantize_args *a, uint64_t scales, uint32_t values_flag,
                            uint64_t index, uint8_t e) {
    if (!(a->flags & values_flag)) REF_PTR(uint8_t, scales)[index] = e;
}

// Rows [r_begin, r_end).
POOL_CPU_CLONES static void mxfp8_ref_rowwise(void *ctx, uint64_t r_begin, uint64_t r_end) {
    const mxfp8_ref_job *job = ctx;
    const mxfp8_quantize_args *a = job->a;
    const uint32_t values = QT_MXFP8_FLAG_ROW_VALUES;
    uint32_t blocks = (a->cols + QT_MXFP8_BLOCK - 1) / QT_MXFP8_BLOCK;
    for (uint32_t r = (uint32_t)r_begin; r < r_end; r++) {
        uint32_t state = mxfp8_ref_state(a, r);
        for (uint32_t b = 0; b < blocks; b++) {
            uint32_t k0 = b * QT_MXFP8_BLOCK;
            uint32_t k1 = k0 + QT_MXFP8_BLOCK < a->cols ? k0 + QT_MXFP8_BLOCK : a->cols;
            float amax = 0.0f;
            for (uint32_t k = k0; k < k1; k++) {
                amax = qt_mxfp8_amax_step(amax, mxfp8_ref_x(job, r, state, k));
            }
            uint8_t e = qt_mxfp8_scale_e8m0(amax, a->elem);
            float mult = qt_e8m0_inv_f32(e);
            mxfp8_ref_scale(a, a->row_scales, values, (uint64_t)r * blocks + b, e);
            for (uint32_t k = k0; k < k1; k++) {
                float x = mxfp8_ref_x(job, r, state, k);
                mxfp8_ref_out(a, a->row_codes, values, (uint64_t)r * a->cols + k,
                              qt_mxfp8_encode(x, mult, a->elem), e);
            }
        }
    }
}

// The 32-row blocks [b_begin, b_end) of the active rows.
POOL_CPU_CLONES static void mxfp8_ref_colwise(void *ctx, uint64_t b_begin, uint64_t b_end) {
    const mxfp8_ref_job *job = ctx;
    const mxfp8_quantize_args *a = job->a;
    uint32_t end = job->end;
    const uint32_t values = QT_MXFP8_FLAG_COL_VALUES;
    uint32_t state[QT_MXFP8_BLOCK];
    for (uint32_t m0 = (uint32_t)b_begin * QT_MXFP8_BLOCK; m0 < b_end * QT_MXFP8_BLOCK;
         m0 += QT_MXFP8_BLOCK) {
        uint32_t m1 = m0 + QT_MXFP8_BLOCK < end ? m0 + QT_MXFP8_BLOCK : end;
        for (uint32_t r = m0; r < m1; r++) state[r - m0] = mxfp8_ref_state(a, r);
        for (uint32_t k = 0; k < a->cols; k++) {
            float amax = 0.0f;
            for (uint32_t r = m0; r < m1; r++) {
                amax = qt_mxfp8_amax_step(amax, mxfp8_ref_x(job, r, state[r - m0], k));
            }
            uint8_t e = qt_mxfp8_scale_e8m0(amax, a->elem);
            float mult = qt_e8m0_inv_f32(e);
            uint64_t scale_at = (uint64_t)(m0 / QT_MXFP8_BLOCK) * a->cols + k;
            mxfp8_ref_scale(a, a->col_scales, values, scale_at, e);
            for (uint32_t r = m0; r < m1; r++) {
                float x = mxfp8_ref_x(job, r, state[r - m0], k);
                mxfp8_ref_out(a, a->col_codes, values, (uint64_t)r * a->cols + k,
                              qt_mxfp8_encode(x, mult, a->elem), e);
            }
        }
    }
}

// One 32 x 32 tile (rows [m0, m1), columns [k0, k1)): one scale for both directions, written in
// both layouts.
static void mxfp8_ref_tile_2d(const mxfp8_ref_job *job, const uint32_t *state, uint32_t m0,
                              uint32_t m1, uint32_t k0, uint32_t k1) {
    const mxfp8_quantize_args *a = job->a;
    uint32_t blocks = (a->cols + QT_MXFP8_BLOCK - 1) / QT_MXFP8_BLOCK;
    float amax = 0.0f;
    for (uint32_t r = m0; r < m1; r++) {
        for (uint32_t k = k0; k < k1; k++) {
            amax = qt_mxfp8_amax_step(amax, mxfp8_ref_x(job, r, state[r - m0], k));
        }
    }
    uint8_t e = qt_mxfp8_scale_e8m0(amax, a->elem);
    float mult = qt_e8m0_inv_f32(e);
    const uint32_t row_values = QT_MXFP8_FLAG_ROW_VALUES, col_values = QT_MXFP8_FLAG_COL_VALUES;
    for (uint32_t r = m0; r < m1; r++) {
        if (a->row_codes) {
            mxfp8_ref_scale(a, a->row_scales, row_values, (uint64_t)r * blocks + k0 / 32, e);
        }
        for (uint32_t k = k0; k < k1; k++) {
            uint8_t q = qt_mxfp8_encode(mxfp8_ref_x(job, r, state[r - m0], k), mult, a->elem);
            uint64_t index = (uint64_t)r * a->cols + k;
            if (a->row_codes) mxfp8_ref_out(a, a->row_codes, row_values, index, q, e);
            if (a->col_codes) mxfp8_ref_out(a, a->col_codes, col_values, index, q, e);
        }
    }
    if (a->col_codes) {
        for (uint32_t k = k0; k < k1; k++) {
            mxfp8_ref_scale(a, a->col_scales, col_values, (uint64_t)(m0 / 32) * a->cols + k, e);
        }
    }
}

// The 32 x 32 tiles of the 32-row blocks [b_begin, b_end).
POOL_CPU_CLONES static void mxfp8_ref_2d(void *ctx, uint64_t b_begin, uint64_t b_end) {
    const mxfp8_ref_job *job = ctx;
    const mxfp8_quantize_args *a = job->a;
    uint32_t end = job->end;
    uint32_t state[QT_MXFP8_BLOCK];
    for (uint32_t m0 = (uint32_t)b_begin * QT_MXFP8_BLOCK; m0 < b_end * QT_MXFP8_BLOCK;
         m0 += QT_MXFP8_BLOCK) {
        uint32_t m1 = m0 + QT_MXFP8_BLOCK < end ? m0 + QT_MXFP8_BLOCK : end;
        for (uint32_t r = m0; r < m1; r++) state[r - m0] = mxfp8_ref_state(a, r);
        for (uint32_t k0 = 0; k0 < a->cols; k0 += QT_MXFP8_BLOCK) {
            uint32_t k1 = k0 + QT_MXFP8_BLOCK < a->cols ? k0 + QT_MXFP8_BLOCK : a->cols;
            mxfp8_ref_tile_2d(job, state, m0, m1, k0, k1);
        }
    }
}

// act: the activation casts (y of a->in, and backward act->dy), else NULL.
static void mxfp8_ref_quantize(const mxfp8_quantize_args *a, const mxfp8_act_args *act,
                               bool backward) {
    mxfp8_ref_job job = {a, qt_group_active_rows(a->group, a->rows), act, backward};
    uint64_t blocks = (job.end + QT_MXFP8_BLOCK - 1) / QT_MXFP8_BLOCK;
    uint64_t block_rows = ref_task_rows((uint64_t)QT_MXFP8_BLOCK * a->cols);
    if (a->flags & QT_MXFP8_FLAG_2D) {
        if (a->row_codes || a->col_codes) pool_for(blocks, block_rows, mxfp8_ref_2d, &job);
        return;
    }
    if (a->row_codes) pool_for(job.end, ref_task_rows(a->cols), mxfp8_ref_rowwise, &job);
    if (a->col_codes) pool_for(blocks, block_rows, mxfp8_ref_colwise, &job);
}

void ref_qt_mxfp8_quantize_bf16(const mxfp8_quantize_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->dtype == QT_DTYPE_BF16);
    mxfp8_ref_quantize(a, NULL, false);
}

void ref_qt_mxfp8_quantize_f32(const mxfp8_quantize_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->dtype == QT_DTYPE_F32);
    mxfp8_ref_quantize(a, NULL, false);
}

void ref_qt_mxfp8_act_fwd(const mxfp8_act_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->cast.dtype == QT_DTYPE_BF16 && a->cast.group.count == 0);
    mxfp8_ref_quantize(&a->cast, a, false);
}

void ref_qt_mxfp8_act_bwd(const mxfp8_act_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->cast.dtype == QT_DTYPE_BF16 && a->cast.group.count == 0);
    mxfp8_ref_quantize(&a->cast, a, true);
}

POOL_CPU_CLONES static void mxfp8_ref_dequantize_rows(void *ctx, uint64_t r_begin,
                                                      uint64_t r_end) {
    const mxfp8_dequantize_args *a = ctx;
    const uint8_t *codes = REF_PTR(const uint8_t, a->codes);
    const uint8_t *scales = REF_PTR(const uint8_t, a->scales);
    uint32_t blocks = (a->cols + QT_MXFP8_BLOCK - 1) / QT_MXFP8_BLOCK;
    for (uint32_t r = (uint32_t)r_begin; r < r_end; r++) {
        for (uint32_t k = 0; k < a->cols; k++) {
            uint64_t index = (uint64_t)r * a->cols + k;
            uint8_t e = a->colwise ? scales[(uint64_t)(r / QT_MXFP8_BLOCK) * a->cols + k]
                                   : scales[(uint64_t)r * blocks + k / QT_MXFP8_BLOCK];
            qt_mxfp8_store(REF_PTR(void, a->out), a->dtype, index,
                           qt_mxfp8_decode(codes[index], e, a->elem));
        }
    }
}

void ref_qt_mxfp8_dequantize(const mxfp8_dequantize_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(qt_group_active_rows(a->group, a->rows), ref_task_rows(a->cols),
             mxfp8_ref_dequantize_rows, (void *)a);
}
