#include "runtime/ops/op_optim.h"

#include <stddef.h>  // offsetof

#include "runtime/ops/op_core.h"  // op_shape_1d

// op_optim_begin reads the act family's global-norm result (ptx/act.h) as an optim_grad_norm.
_Static_assert(sizeof(qt_gnorm_result) == sizeof(optim_grad_norm) &&
                   offsetof(qt_gnorm_result, norm) == offsetof(optim_grad_norm, norm) &&
                   offsetof(qt_gnorm_result, clip_factor) ==
                       offsetof(optim_grad_norm, clip_factor) &&
                   offsetof(qt_gnorm_result, nonfinite) == offsetof(optim_grad_norm, nonfinite),
               "qt_gnorm_result and optim_grad_norm must share their layout");

optim_hparams optim_hparams_default(void) {
    return (optim_hparams){0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, true};
}

static bool op_optim_same(prog_ref a, prog_ref b) {
    return a.arena == b.arena && a.region == b.region && a.offset == b.offset;
}

qt_status op_optim_begin(program *p, const char *name, prog_ref steps, prog_ref state,
                         prog_ref grad_norm, prog_ref lr_rows, uint32_t row_count) {
    QT_ASSERT(row_count >= 1);
    optim_begin_args args = {0, 0, 0, 0, row_count, 0};
    launch_shape shape = {{1, 1, 1}, {QT_OPTIM_BEGIN_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_OPTIM_BEGIN, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(optim_begin_args, steps), steps, 8, PROG_READ_WRITE));
    QT_TRY(prog_use_span(p, op, offsetof(optim_begin_args, state), state, sizeof(optim_state),
                        PROG_WRITE));
    QT_TRY(prog_use_optional(p, op, offsetof(optim_begin_args, grad_norm), grad_norm,
                            sizeof(optim_grad_norm), PROG_READ));
    return prog_use_span(p, op, offsetof(optim_begin_args, lr_rows), lr_rows,
                        (uint64_t)row_count * sizeof(optim_lr_row), PROG_READ);
}

// amax[0] = +0 before an update maxes into it: the per-tensor FP8 family's zeroing kernel.
static qt_status op_optim_zero(program *p, const char *name, prog_ref amax) {
    fp8_amax_zero_args args = {0, 1, 0};
    launch_shape shape = op_shape_1d(1, 32);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FP8_AMAX_ZERO, name, &shape, &args, sizeof args, &op));
    return prog_use_span(p, op, offsetof(fp8_amax_zero_args, amax), amax, 4, PROG_WRITE);
}

// What one qt_optim_adamw op writes besides master, m and v.
typedef struct op_optim_outputs {
    uint32_t out;             // QT_OPTIM_OUT_*
    prog_ref amax0, amax1;    // optional
    bool amax_on_skip;
} op_optim_outputs;

static qt_status op_optim_update_outputs(program *p, uint32_t op, const optim_param_desc *d,
                                         const op_optim_outputs *o) {
    uint64_t elems = (uint64_t)d->rows * d->cols;
    if (o->out == QT_OPTIM_OUT_BF16) {
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, weight), d->bf16, elems * 2,
                            PROG_WRITE));
    } else if (o->out == QT_OPTIM_OUT_FP8) {
        QT_TRY(prog_use_optional(p, op, offsetof(optim_adamw_args, weight), d->fp8.rowwise, elems,
                                PROG_WRITE));
        QT_TRY(prog_use_optional(p, op, offsetof(optim_adamw_args, weight_t), d->fp8.colwise,
                                elems, PROG_WRITE));
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, scale), d->fp8_scale, 4,
                            PROG_READ));
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, scale_inv), d->fp8.scale_inv, 4,
                            PROG_WRITE));
    }
    // An atomic max reads and writes its target.
    QT_TRY(prog_use_optional(p, op, offsetof(optim_adamw_args, amax0), o->amax0, 4,
                            PROG_READ_WRITE));
    return prog_use_optional(p, op, offsetof(optim_adamw_args, amax1), o->amax1, 4,
                            PROG_READ_WRITE);
}

// One qt_optim_adamw op: the update (or, quantize_only, none) with the outputs o.
static qt_status op_optim_update(program *p, const optim_param_desc *d, prog_ref state,
                                 bool quantize_only, const op_optim_outputs *o) {
    optim_adamw_args args = {0};
    args.rows = d->rows;
    args.cols = d->cols;
    args.grad_dtype = d->grad_dtype;
    args.out = o->out;
    args.fp8 = o->out == QT_OPTIM_OUT_FP8 ? d->fp8.fp8 : 0u;
    args.flags = (d->hp.bias_correction ? QT_OPTIM_FLAG_BIAS_CORRECTION : 0u) |
                 (o->amax_on_skip ? QT_OPTIM_FLAG_AMAX_ON_SKIP : 0u) |
                 (quantize_only ? QT_OPTIM_FLAG_QUANTIZE_ONLY : 0u);
    args.beta1 = d->hp.beta1;
    args.beta2 = d->hp.beta2;
    args.eps = d->hp.eps;
    args.weight_decay = d->hp.weight_decay;
    args.lr_scale = d->hp.lr_scale;
    uint64_t tiles = (uint64_t)((d->rows + QT_OPTIM_TILE - 1) / QT_OPTIM_TILE) *
                     ((d->cols + QT_OPTIM_TILE - 1) / QT_OPTIM_TILE);
    QT_ASSERT(tiles >= 1 && tiles <= 0x7FFFFFFFu);
    launch_shape shape = {{(uint32_t)tiles, 1, 1}, {QT_OPTIM_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_OPTIM_ADAMW, d->name, &shape, &args, sizeof args, &op));
    uint64_t elems = (uint64_t)d->rows * d->cols;
    if (quantize_only) {
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, master), d->master, elems * 4,
                            PROG_READ));
    } else {
        uint64_t grad_bytes = elems * (d->grad_dtype == QT_DTYPE_BF16 ? 2 : 4);
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, state), state,
                            sizeof(optim_state), PROG_READ));
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, grad), d->grad, grad_bytes,
                            PROG_READ));
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, master), d->master, elems * 4,
                            PROG_READ_WRITE));
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, m), d->m, elems * 4,
                            PROG_READ_WRITE));
        QT_TRY(prog_use_span(p, op, offsetof(optim_adamw_args, v), d->v, elems * 4,
                            PROG_READ_WRITE));
    }
    return op_optim_update_outputs(p, op, d, o);
}

// The update alone (no fused output, no amax), if there is one to do.
static qt_status op_optim_update_plain(program *p, const optim_param_desc *d, prog_ref state,
                                       bool quantize_only) {
    if (quantize_only) return QT_OK;
    op_optim_outputs o = {QT_OPTIM_OUT_NONE, {0}, {0}, false};
    return op_optim_update(p, d, state, false, &o);
}

// NVFP4: the global amaxes of the new master (fused into the update unless RHT needs the
// post-transform columnwise amax), then the family's cast.
static qt_status op_optim_nvfp4(program *p, const optim_param_desc *d, prog_ref state,
                                bool quantize_only) {
    const op_nvfp4_quant *q = &d->nvfp4;
    op_nvfp4_input in = {d->master, QT_DTYPE_F32, d->rows, d->cols, d->group};
    if (q->rht || d->group.count > 0) {
        QT_TRY(op_optim_update_plain(p, d, state, quantize_only));
        op_nvfp4_amax_out amax = {q->amax_row, q->rht ? q->amax_col : (prog_ref){0}, q->rht,
                                  q->rht_signs};
        QT_TRY(op_nvfp4_amax(p, d->name, &in, &amax));
    } else {
        op_optim_outputs o = {QT_OPTIM_OUT_NONE, {0}, {0}, true};
        if (q->rowwise) o.amax0 = q->amax_row;
        if (q->colwise) o.amax1 = q->amax_col;
        if (prog_ref_present(o.amax0) && prog_ref_present(o.amax1) &&
            op_optim_same(o.amax0, o.amax1)) {
            o.amax1 = (prog_ref){0};
        }
        if (prog_ref_present(o.amax0)) QT_TRY(op_optim_zero(p, d->name, o.amax0));
        if (prog_ref_present(o.amax1)) QT_TRY(op_optim_zero(p, d->name, o.amax1));
        QT_TRY(op_optim_update(p, d, state, quantize_only, &o));
    }
    return op_nvfp4_quantize(p, d->name, &in, q);
}

// A stacked weight's per-tensor FP8: the update, then the grouped cast from the new master.
static qt_status op_optim_fp8_grouped(program *p, const optim_param_desc *d, prog_ref state,
                                      bool quantize_only) {
    QT_TRY(op_optim_update_plain(p, d, state, quantize_only));
    op_fp8_input in = {d->master, QT_DTYPE_F32, d->rows, d->cols, d->group};
    if (d->weight == OPTIM_WEIGHT_FP8_DELAYED) {
        return op_fp8_cast_delayed(p, d->name, &in, &d->fp8, d->fp8_scale, d->fp8_amax);
    }
    return op_fp8_quantize_current(p, d->name, &in, &d->fp8, d->fp8_amax, d->fp8_scale,
                                   d->fp8_pow2, d->fp8_eps);
}

static qt_status op_optim_fp8_current(program *p, const optim_param_desc *d, prog_ref state,
                                      bool quantize_only) {
    QT_ASSERT(prog_ref_present(d->fp8_amax));
    QT_TRY(op_optim_zero(p, d->name, d->fp8_amax));
    op_optim_outputs o = {QT_OPTIM_OUT_NONE, d->fp8_amax, {0}, true};
    QT_TRY(op_optim_update(p, d, state, quantize_only, &o));
    op_fp8_input in = {d->master, QT_DTYPE_F32, d->rows, d->cols, op_group_dense()};
    return op_fp8_cast_current(p, d->name, &in, &d->fp8, d->fp8_amax, d->fp8_scale,
                               d->fp8_pow2, d->fp8_eps);
}

static qt_status op_optim_param(program *p, const optim_param_desc *d, prog_ref state,
                                bool quantize_only) {
    QT_ASSERT(d->name != NULL);
    QT_ASSERT(d->grad_dtype == QT_DTYPE_BF16 || d->grad_dtype == QT_DTYPE_F32);
    if (d->rows == 0 || d->cols == 0) return QT_OK;
    switch (d->weight) {
    case OPTIM_WEIGHT_NONE:
        return op_optim_update_plain(p, d, state, quantize_only);
    case OPTIM_WEIGHT_BF16: {
        op_optim_outputs o = {QT_OPTIM_OUT_BF16, {0}, {0}, false};
        return op_optim_update(p, d, state, quantize_only, &o);
    }
    case OPTIM_WEIGHT_FP8_DELAYED: {
        QT_ASSERT(d->fp8.fp8 == QT_FP8_E4M3 || d->fp8.fp8 == QT_FP8_E5M2);
        if (d->group.count > 0) return op_optim_fp8_grouped(p, d, state, quantize_only);
        op_optim_outputs o = {QT_OPTIM_OUT_FP8, d->fp8_amax, {0}, false};
        return op_optim_update(p, d, state, quantize_only, &o);
    }
    case OPTIM_WEIGHT_FP8_CURRENT:
        if (d->group.count > 0) return op_optim_fp8_grouped(p, d, state, quantize_only);
        return op_optim_fp8_current(p, d, state, quantize_only);
    case OPTIM_WEIGHT_MXFP8: {
        QT_ASSERT(d->mxfp8.group.count == 0);
        QT_TRY(op_optim_update_plain(p, d, state, quantize_only));
        op_mxfp8_quantize_desc q = d->mxfp8;
        q.in = d->master;
        q.dtype = QT_DTYPE_F32;
        q.rows = d->rows;
        q.cols = d->cols;
        return op_mxfp8_quantize(p, d->name, &q);
    }
    case OPTIM_WEIGHT_FP8_BLOCK:
        QT_ASSERT(d->block.rows == d->rows && d->block.cols == d->cols);
        QT_ASSERT(d->block.group.count == 0);
        QT_TRY(op_optim_update_plain(p, d, state, quantize_only));
        return op_quant_block(p, d->name, d->master, QT_DTYPE_F32, &d->block,
                              &d->block_options);
    case OPTIM_WEIGHT_NVFP4:
        QT_ASSERT(d->nvfp4.rowwise || d->nvfp4.colwise);
        return op_optim_nvfp4(p, d, state, quantize_only);
    }
    QT_ASSERT(!"unknown optim_weight");
    return QT_OK;
}

qt_status op_optim_adamw(program *p, const optim_param_desc *d, prog_ref state) {
    return op_optim_param(p, d, state, false);
}

qt_status op_optim_adamw_list(program *p, const optim_param_desc *list, uint32_t count,
                              prog_ref state) {
    for (uint32_t i = 0; i < count; i++) QT_TRY(op_optim_param(p, &list[i], state, false));
    return QT_OK;
}

qt_status op_optim_quantize(program *p, const optim_param_desc *d) {
    return op_optim_param(p, d, (prog_ref){0}, true);
}
