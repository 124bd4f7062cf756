// C twins of ptx/quant_block.cu: plain loops over the blocks, with the per-block arithmetic of
// ptx/quant_block.h, so that they produce the kernels' bits. Rows (1-D rowwise) and 128-row
// blocks (1-D columnwise, 2-D), which own their codes and scales, are tasks of the thread pool.
#include "runtime/base/pool.h"  // pool_for, POOL_CPU_CLONES
#include "runtime/ref/ref.h"

#define REF_BLOCK QT_BLOCK_LEN

static uint32_t ref_block_min(uint32_t a, uint32_t b) { return a < b ? a : b; }
static uint32_t ref_block_count(uint32_t n) { return (n + REF_BLOCK - 1) / REF_BLOCK; }

// Element (m, k) as FP32; padding rows read as zeros.
static float ref_block_elem(const quant_block_args *a, uint32_t dtype, uint32_t state, uint32_t m,
                            uint32_t k) {
    if (state != QT_BLOCK_ROW_VALID) return 0.0f;
    uint64_t i = (uint64_t)m * a->cols + k;
    if (dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(REF_PTR(const uint16_t, a->input)[i]);
    return REF_PTR(const float, a->input)[i];
}

// Row states of block mb (rows m0 .. m1-1 below `active`), looked up once per block.
static uint32_t ref_block_states(const quant_block_args *a, uint32_t active, uint32_t mb,
                                 uint8_t states[REF_BLOCK]) {
    uint32_t m0 = mb * REF_BLOCK, m1 = ref_block_min(m0 + REF_BLOCK, active);
    for (uint32_t m = m0; m < m1; m++) {
        states[m - m0] = (uint8_t)qt_block_row_state(&a->group, active, m);
    }
    return m1;
}

typedef struct ref_block_job {
    const quant_block_args *a;
    uint32_t dtype;
    uint32_t active;                 // active rows
    const quant_block_act_args *act;  // the activation casts: y of a->input (and act->dy)
    bool backward;
} ref_block_job;

// Element (m, k) of what the job casts: the input's, or with an activation y as the activation
// ops store it (qt_act_forward / qt_act_backward rounded to BF16).
static float ref_block_value(const ref_block_job *job, uint32_t state, uint32_t m, uint32_t k) {
    const quant_block_args *a = job->a;
    if (!job->act) return ref_block_elem(a, job->dtype, state, m, k);
    if (state != QT_BLOCK_ROW_VALID) return 0.0f;
    uint64_t i = (uint64_t)m * a->cols + k;
    float x = qt_bf16_to_f32(REF_PTR(const uint16_t, a->input)[i]);
    float y;
    if (job->backward) {
        float dy = qt_bf16_to_f32(REF_PTR(const uint16_t, job->act->dy)[i]);
        y = qt_act_backward(job->act->act, x, dy);
    } else {
        y = qt_act_forward(job->act->act, x);
    }
    return qt_bf16_to_f32(qt_f32_to_bf16(y));
}

// Rows [m_begin, m_end).
POOL_CPU_CLONES static void ref_block_cast_1d_rowwise(void *ctx, uint64_t m_begin,
                                                      uint64_t m_end) {
    const ref_block_job *job = ctx;
    const quant_block_args *a = job->a;
    uint32_t dtype = job->dtype, active = job->active;
    uint8_t *codes = REF_PTR(uint8_t, a->row_codes);
    float *scale_inv = REF_PTR(float, a->row_scale_inv);
    for (uint32_t m = (uint32_t)m_begin; m < m_end; m++) {
        uint32_t state = qt_block_row_state(&a->group, active, m);
        for (uint32_t kb = 0; kb < ref_block_count(a->cols); kb++) {
            uint32_t k0 = kb * REF_BLOCK, k1 = ref_block_min(k0 + REF_BLOCK, a->cols);
            float amax = 0.0f;
            for (uint32_t k = k0; k < k1; k++) {
                amax = qt_block_amax_step(amax, ref_block_value(job, state, m, k));
            }
            float scale = qt_block_scale(amax, a->fp8, a->pow2, a->eps, dtype);
            scale_inv[(uint64_t)kb * a->rows + m] = qt_block_scale_inv(scale);
            for (uint32_t k = k0; k < k1; k++) {
                codes[(uint64_t)m * a->cols + k] =
                    qt_block_quantize(ref_block_value(job, state, m, k), scale, a->fp8);
            }
        }
    }
}

// The 128-row blocks [b_begin, b_end).
POOL_CPU_CLONES static void ref_block_cast_1d_colwise(void *ctx, uint64_t b_begin,
                                                      uint64_t b_end) {
    const ref_block_job *job = ctx;
    const quant_block_args *a = job->a;
    uint32_t dtype = job->dtype, active = job->active;
    uint8_t *codes = REF_PTR(uint8_t, a->col_codes);
    float *scale_inv = REF_PTR(float, a->col_scale_inv);
    uint8_t states[REF_BLOCK];
    for (uint32_t mb = (uint32_t)b_begin; mb < b_end; mb++) {
        uint32_t m0 = mb * REF_BLOCK, m1 = ref_block_states(a, active, mb, states);
        for (uint32_t k = 0; k < a->cols; k++) {
            float amax = 0.0f;
            for (uint32_t m = m0; m < m1; m++) {
                amax = qt_block_amax_step(amax, ref_block_value(job, states[m - m0], m, k));
            }
            float scale = qt_block_scale(amax, a->fp8, a->pow2, a->eps, dtype);
            scale_inv[(uint64_t)mb * a->cols + k] = qt_block_scale_inv(scale);
            for (uint32_t m = m0; m < m1; m++) {
                float x = ref_block_value(job, states[m - m0], m, k);
                codes[(uint64_t)k * a->rows + m] = qt_block_quantize(x, scale, a->fp8);
            }
        }
    }
}

static void ref_block_cast_1d(const quant_block_args *a, uint32_t dtype,
                              const quant_block_act_args *act, bool backward) {
    ref_block_job job = {a, dtype, qt_block_active_rows(&a->group, a->rows), act, backward};
    if (a->directions & QT_BLOCK_ROWWISE) {
        pool_for(job.active, ref_task_rows(a->cols), ref_block_cast_1d_rowwise, &job);
    }
    if (a->directions & QT_BLOCK_COLWISE) {
        pool_for(ref_block_count(job.active), ref_task_rows((uint64_t)REF_BLOCK * a->cols),
                 ref_block_cast_1d_colwise, &job);
    }
}

// One 128 x 128 tile: one scale; the same code goes to both outputs.
static void ref_block_cast_2d_tile(const quant_block_args *a, uint32_t dtype, uint32_t mb,
                                   uint32_t kb, uint32_t m1, const uint8_t *states) {
    uint32_t m0 = mb * REF_BLOCK, k0 = kb * REF_BLOCK, k1 = ref_block_min(k0 + REF_BLOCK, a->cols);
    float amax = 0.0f;
    for (uint32_t m = m0; m < m1; m++) {
        for (uint32_t k = k0; k < k1; k++) {
            amax = qt_block_amax_step(amax, ref_block_elem(a, dtype, states[m - m0], m, k));
        }
    }
    float scale = qt_block_scale(amax, a->fp8, a->pow2, a->eps, dtype);
    float scale_inv = qt_block_scale_inv(scale);
    bool rowwise = (a->directions & QT_BLOCK_ROWWISE) != 0;
    bool colwise = (a->directions & QT_BLOCK_COLWISE) != 0;
    if (rowwise) {
        REF_PTR(float, a->row_scale_inv)[(uint64_t)mb * ref_block_count(a->cols) + kb] = scale_inv;
    }
    if (colwise) {
        REF_PTR(float, a->col_scale_inv)[(uint64_t)kb * ref_block_count(a->rows) + mb] = scale_inv;
    }
    for (uint32_t m = m0; m < m1; m++) {
        for (uint32_t k = k0; k < k1; k++) {
            uint8_t q = qt_block_quantize(ref_block_elem(a, dtype, states[m - m0], m, k), scale,
                                          a->fp8);
            if (rowwise) REF_PTR(uint8_t, a->row_codes)[(uint64_t)m * a->cols + k] = q;
            if (colwise) REF_PTR(uint8_t, a->col_codes)[(uint64_t)k * a->rows + m] = q;
        }
    }
}

// The tiles of the 128-row blocks [b_begin, b_end).
POOL_CPU_CLONES static void ref_block_cast_2d_rows(void *ctx, uint64_t b_begin, uint64_t b_end) {
    const ref_block_job *job = ctx;
    uint8_t states[REF_BLOCK];
    for (uint32_t mb = (uint32_t)b_begin; mb < b_end; mb++) {
        uint32_t m1 = ref_block_states(job->a, job->active, mb, states);
        for (uint32_t kb = 0; kb < ref_block_count(job->a->cols); kb++) {
            ref_block_cast_2d_tile(job->a, job->dtype, mb, kb, m1, states);
        }
    }
}

static void ref_block_cast_2d(const quant_block_args *a, uint32_t dtype) {
    ref_block_job job = {a, dtype, qt_block_active_rows(&a->group, a->rows), NULL, false};
    pool_for(ref_block_count(job.active), ref_task_rows((uint64_t)REF_BLOCK * a->cols),
             ref_block_cast_2d_rows, &job);
}

void ref_qt_quant_block_1d_bf16(const quant_block_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_cast_1d(a, QT_DTYPE_BF16, NULL, false);
}

void ref_qt_quant_block_1d_f32(const quant_block_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_cast_1d(a, QT_DTYPE_F32, NULL, false);
}

void ref_qt_quant_block_act_fwd(const quant_block_act_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_cast_1d(&a->cast, QT_DTYPE_BF16, a, false);
}

void ref_qt_quant_block_act_bwd(const quant_block_act_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_cast_1d(&a->cast, QT_DTYPE_BF16, a, true);
}

void ref_qt_quant_block_2d_bf16(const quant_block_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_cast_2d(a, QT_DTYPE_BF16);
}

void ref_qt_quant_block_2d_f32(const quant_block_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_cast_2d(a, QT_DTYPE_F32);
}

// Scale_inv of element (m, k) in the layouts of ptx/quant_block.h.
static float ref_block_dequant_scale(const dequant_block_args *a, bool two_d, uint32_t m,
                                     uint32_t k) {
    const float *s = REF_PTR(const float, a->scale_inv);
    uint32_t mb = m / REF_BLOCK, kb = k / REF_BLOCK;
    if (two_d) {
        return a->colwise ? s[(uint64_t)kb * ref_block_count(a->rows) + mb]
                          : s[(uint64_t)mb * ref_block_count(a->cols) + kb];
    }
    return a->colwise ? s[(uint64_t)mb * a->cols + k] : s[(uint64_t)kb * a->rows + m];
}

typedef struct ref_dequant_job {
    const dequant_block_args *a;
    bool two_d;
} ref_dequant_job;

// Rows [m_begin, m_end).
POOL_CPU_CLONES static void ref_block_dequant_rows(void *ctx, uint64_t m_begin, uint64_t m_end) {
    const dequant_block_args *a = ((const ref_dequant_job *)ctx)->a;
    bool two_d = ((const ref_dequant_job *)ctx)->two_d;
    const uint8_t *codes = REF_PTR(const uint8_t, a->codes);
    for (uint32_t m = (uint32_t)m_begin; m < m_end; m++) {
        for (uint32_t k = 0; k < a->cols; k++) {
            uint64_t at = a->colwise ? (uint64_t)k * a->rows + m : (uint64_t)m * a->cols + k;
            float v = qt_block_dequantize(qt_block_decode(codes[at], a->fp8),
                                          ref_block_dequant_scale(a, two_d, m, k));
            uint64_t out = (uint64_t)m * a->cols + k;
            if (a->out_dtype == QT_DTYPE_BF16) {
                REF_PTR(uint16_t, a->out)[out] = qt_f32_to_bf16(v);
            } else {
                REF_PTR(float, a->out)[out] = v;
            }
        }
    }
}

static void ref_block_dequant(const dequant_block_args *a, bool two_d) {
    ref_dequant_job job = {a, two_d};
    pool_for(qt_block_active_rows(&a->group, a->rows), ref_task_rows(a->cols),
             ref_block_dequant_rows, &job);
}

void ref_qt_dequant_block_1d(const dequant_block_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_dequant(a, false);
}

void ref_qt_dequant_block_2d(const dequant_block_args *a, const launch_shape *shape) {
    (void)shape;
    ref_block_dequant(a, true);
}
