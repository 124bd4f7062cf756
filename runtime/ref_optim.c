// C twins of ptx/optim.cu: the same per-step and per-element functions of optim.h, in plain
// loops over the parameter's elements.
#include "ref.h"

void ref_qt_optim_begin(const optim_begin_args *a, const launch_shape *shape) {
    (void)shape;
    const optim_grad_norm *norm = REF_PTR(const optim_grad_norm, a->grad_norm);
    const optim_lr_row *rows = REF_PTR(const optim_lr_row, a->lr_rows);
    qt_optim_begin_apply(REF_PTR(uint64_t, a->steps), REF_PTR(optim_state, a->state), norm, rows,
                         a->row_count);
}

static float ref_optim_grad(const optim_adamw_args *a, uint64_t i) {
    if (a->grad_dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(REF_PTR(const uint16_t, a->grad)[i]);
    return REF_PTR(const float, a->grad)[i];
}

// The fused outputs of element (r, k) with master value p.
static void ref_optim_out(const optim_adamw_args *a, const qt_optim_coef *c, uint32_t r,
                          uint32_t k, float p) {
    uint64_t i = (uint64_t)r * a->cols + k;
    if (a->out == QT_OPTIM_OUT_BF16) {
        REF_PTR(uint16_t, a->weight)[i] = qt_f32_to_bf16(p);
        return;
    }
    uint8_t code = (uint8_t)(qt_optim_fp8_pair(p, 0.0f, c->scale, a->fp8) & 0xFFu);
    if (a->weight) REF_PTR(uint8_t, a->weight)[i] = code;
    if (a->weight_t) REF_PTR(uint8_t, a->weight_t)[(uint64_t)k * a->rows + r] = code;
}

void ref_qt_optim_adamw(const optim_adamw_args *a, const launch_shape *shape) {
    (void)shape;
    qt_optim_coef c;
    uint32_t mode = qt_optim_prepare(a, &c);
    if (mode == 0) return;
    float *master = REF_PTR(float, a->master);
    float amax = 0.0f;
    for (uint32_t r = 0; r < a->rows; r++) {
        for (uint32_t k = 0; k < a->cols; k++) {
            uint64_t i = (uint64_t)r * a->cols + k;
            float p = master[i];
            if (mode & QT_OPTIM_DO_UPDATE) {
                qt_optim_adamw_elem(&c, ref_optim_grad(a, i), &p, REF_PTR(float, a->m) + i,
                                    REF_PTR(float, a->v) + i);
                master[i] = p;
            }
            if (mode & QT_OPTIM_DO_AMAX) amax = qt_fp8_amax_step(amax, p);
            if (mode & QT_OPTIM_DO_OUT) ref_optim_out(a, &c, r, k, p);
        }
    }
    if ((mode & QT_OPTIM_DO_OUT) && a->out == QT_OPTIM_OUT_FP8 && a->scale_inv) {
        *REF_PTR(float, a->scale_inv) = qt_fp8_scale_inv(c.scale);
    }
    // The GPU maxes per-block maxima into the targets; the maximum of all of them is this.
    if (mode & QT_OPTIM_DO_AMAX) {
        if (a->amax0) qt_fp8_amax_merge(REF_PTR(float, a->amax0), amax);
        if (a->amax1) qt_fp8_amax_merge(REF_PTR(float, a->amax1), amax);
    }
}
