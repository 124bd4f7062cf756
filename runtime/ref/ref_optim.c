// C twins of ptx/optim.cu: the same per-step and per-element functions of optim.h, in plain
// loops over ranges of the parameter's elements, tasks of the thread pool (ref.h): every element
// is updated on its own. The multi-tensor twins walk the same table as the kernels.
#include <string.h>  // memcpy

#include "runtime/base/pool.h"  // pool_for, POOL_CPU_CLONES
#include "runtime/ref/ref.h"

void ref_qt_optim_begin(const optim_begin_args *a, const launch_shape *shape) {
    (void)shape;
    const optim_grad_norm *norm = REF_PTR(const optim_grad_norm, a->grad_norm);
    const optim_lr_row *rows = REF_PTR(const optim_lr_row, a->lr_rows);
    qt_optim_begin_apply(REF_PTR(uint64_t, a->steps), REF_PTR(optim_state, a->state), norm, rows,
                         a->row_count);
    if (a->zero != 0) {
        qt_optim_zero_amaxes(REF_PTR(const optim_multi_entry, a->zero), a->zero_count);
    }
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

typedef struct ref_optim_job {
    const optim_adamw_args *a;
    qt_optim_coef c;
    uint32_t mode;
} ref_optim_job;

// Elements [begin, end) in row-major order, all of one amax word (a stacked weight's member);
// their amax merges into the targets as the GPU's per-block maxima do (a maximum: the order of
// the ranges never shows).
static void ref_optim_adamw_elems(const ref_optim_job *job, uint64_t begin, uint64_t end) {
    const optim_adamw_args *a = job->a;
    float *master = REF_PTR(float, a->master);
    float amax = 0.0f;
    for (uint64_t i = begin; i < end; i++) {
        float p = master[i];
        if (job->mode & QT_OPTIM_DO_UPDATE) {
            qt_optim_adamw_elem(&job->c, ref_optim_grad(a, i), &p, REF_PTR(float, a->m) + i,
                                REF_PTR(float, a->v) + i);
            master[i] = p;
        }
        if (job->mode & QT_OPTIM_DO_AMAX) amax = qt_fp8_amax_step(amax, p);
        if ((job->mode & QT_OPTIM_DO_OUT) && a->out != QT_OPTIM_OUT_MXFP8) {
            ref_optim_out(a, &job->c, (uint32_t)(i / a->cols), (uint32_t)(i % a->cols), p);
        }
    }
    if (job->mode & QT_OPTIM_DO_AMAX) {
        uint32_t word = qt_optim_amax_word(a, (uint32_t)(begin / a->cols));
        if (a->amax0) ref_amax_merge(REF_PTR(float, a->amax0) + word, amax);
        if (a->amax1) ref_amax_merge(REF_PTR(float, a->amax1) + word, amax);
    }
}

// A pool task: elements [begin, end), cut where a member ends (flatten inlines the runs).
POOL_CPU_CLONES static void ref_optim_adamw_range(void *ctx, uint64_t begin, uint64_t end) {
    const ref_optim_job *job = ctx;
    const optim_adamw_args *a = job->a;
    uint64_t member = a->amax_member_rows ? (uint64_t)a->amax_member_rows * a->cols : UINT64_MAX;
    for (uint64_t first = begin; first < end;) {
        uint64_t last = first / member * member + member;  // UINT64_MAX with no members
        if (last > end) last = end;
        ref_optim_adamw_elems(job, first, last);
        first = last;
    }
}

void ref_qt_optim_adamw(const optim_adamw_args *a, const launch_shape *shape) {
    ref_optim_job job = {.a = a};
    job.mode = qt_optim_prepare(a, &job.c);
    if (job.mode == 0) return;
    pool_for((uint64_t)a->rows * a->cols, REF_TASK_ELEMS, ref_optim_adamw_range, &job);
    if ((job.mode & QT_OPTIM_DO_OUT) && a->out == QT_OPTIM_OUT_FP8 && a->scale_inv) {
        *REF_PTR(float, a->scale_inv) = qt_fp8_scale_inv(job.c.scale);
    }
    if ((job.mode & QT_OPTIM_DO_OUT) && a->out == QT_OPTIM_OUT_MXFP8) {
        // The kernel's fused copy is the family cast of the new master, rowwise: the family's
        // twin writes it from the master as updated above.
        mxfp8_quantize_args q = {.in = a->master, .row_codes = a->weight,
                                 .row_scales = a->scale_inv, .rows = a->rows, .cols = a->cols,
                                 .dtype = QT_DTYPE_F32, .elem = a->fp8};
        ref_qt_mxfp8_quantize_f32(&q, shape);
    }
}

void ref_qt_optim_adamw_multi(const optim_multi_args *m, const launch_shape *shape) {
    const optim_multi_entry *entries = REF_PTR(const optim_multi_entry, m->entries);
    for (uint32_t i = 0; i < m->count; i++) {
        optim_adamw_args a = entries[i].args;
        a.state = m->state;
        ref_qt_optim_adamw(&a, shape);
    }
}

void ref_qt_optim_amax_zero(const optim_multi_args *m, const launch_shape *shape) {
    (void)shape;
    const optim_multi_entry *entries = REF_PTR(const optim_multi_entry, m->entries);
    for (uint32_t i = 0; i < m->count; i++) {
        const optim_multi_entry *e = &entries[i];
        if (!qt_optim_entry_zeroes(e)) continue;
        for (uint32_t w = 0; w < qt_optim_amax_words(&e->args); w++) {
            if (e->args.amax0) REF_PTR(float, e->args.amax0)[w] = 0.0f;
            if (e->args.amax1) REF_PTR(float, e->args.amax1)[w] = 0.0f;
        }
    }
}

void ref_qt_optim_describe(const optim_describe_args *a, const launch_shape *shape) {
    (void)shape;
    memcpy(REF_PTR(optim_multi_entry, a->entry), &a->value, sizeof a->value);
}
