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

qt_status op_optim_zeroes_use(program *p, uint32_t op, uint32_t entries_field,
                              const op_optim_zeroes *z) {
    QT_ASSERT(z->count >= 1 && z->target_count >= 1 && z->target_count <= OP_OPTIM_ZEROES_MAX);
    QT_TRY(prog_use_span(p, op, entries_field, z->entries,
                         op_optim_table_bytes(z->count), PROG_READ));
    for (uint32_t t = 0; t < z->target_count; t++) {
        QT_TRY(prog_use_span(p, op, PROG_ARGS_FIELD_NONE, z->targets[t], z->target_bytes[t],
                             PROG_WRITE));
    }
    return QT_OK;
}

// Its own refs and OP_OPTIM_ZEROES_MAX targets fit one op.
_Static_assert(5 + OP_OPTIM_ZEROES_MAX <= PROG_OP_REFS_MAX, "op_optim_begin's regions");

qt_status op_optim_begin(program *p, const char *name, prog_ref steps, prog_ref state,
                         prog_ref grad_norm, prog_ref lr_rows, uint32_t row_count,
                         const op_optim_zeroes *zeroes) {
    QT_ASSERT(row_count >= 1);
    optim_begin_args args = {0};
    args.row_count = row_count;
    args.zero_count = zeroes ? zeroes->count : 0;
    launch_shape shape = {{1, 1, 1}, {QT_OPTIM_BEGIN_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_OPTIM_BEGIN, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(optim_begin_args, steps), steps, 8, PROG_READ_WRITE));
    QT_TRY(prog_use_span(p, op, offsetof(optim_begin_args, state), state, sizeof(optim_state),
                        PROG_WRITE));
    QT_TRY(prog_use_optional(p, op, offsetof(optim_begin_args, grad_norm), grad_norm,
                            sizeof(optim_grad_norm), PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(optim_begin_args, lr_rows), lr_rows,
                         (uint64_t)row_count * sizeof(optim_lr_row), PROG_READ));
    if (!zeroes) return QT_OK;
    return op_optim_zeroes_use(p, op, offsetof(optim_begin_args, zero), zeroes);
}

// amax[0, words) = +0 before an update maxes into it: the per-tensor FP8 family's zeroing kernel.
static qt_status op_optim_zero(program *p, const char *name, prog_ref amax, uint32_t words) {
    fp8_amax_zero_args args = {0, words, 0};
    launch_shape shape = op_shape_1d(words, 32);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FP8_AMAX_ZERO, name, &shape, &args, sizeof args, &op));
    return prog_use_span(p, op, offsetof(fp8_amax_zero_args, amax), amax, 4ull * words,
                         PROG_WRITE);
}

// What one qt_optim_adamw op writes besides master, m and v.
typedef struct op_optim_outputs {
    uint32_t out;               // QT_OPTIM_OUT_*
    prog_ref amax0, amax1;      // optional
    bool amax_on_skip;          // the amax targets are a workspace zeroed before the update
    uint32_t amax_member_rows;  // optim_adamw_args.amax_member_rows: 0, or a stacked weight's
} op_optim_outputs;

// The words of each amax target of o.
static uint32_t op_optim_amax_words(const optim_param_desc *d, const op_optim_outputs *o) {
    return o->amax_member_rows != 0 ? d->rows / o->amax_member_rows : 1u;
}

// A stacked weight's members, when the update can take each member's amax of the new master
// itself (a member's rows are whole update tiles, so each tile's maximum has one member): the
// rows of one member; else 0, and the cast takes the amaxes in a pass of its own.
static uint32_t op_optim_member_rows(const optim_param_desc *d) {
    if (d->group.count == 0 || d->rows % d->group.count != 0) return 0;
    uint32_t rows = d->rows / d->group.count;
    return rows % QT_OPTIM_TILE == 0 ? rows : 0;
}

// Whether the update of an MXFP8 weight writes it (QT_OPTIM_OUT_MXFP8): a dense weight whose
// only copy is the rowwise one in codes, 1 x 32 blocks (a columnwise copy or 32 x 32 tiles need
// 32 rows of the master at once, which the update's 4-row threads do not hold: the family cast
// writes those).
static bool op_optim_mxfp8_fused(const optim_param_desc *d) {
    const op_mxfp8_quantize_desc *q = &d->mxfp8;
    return d->weight == OPTIM_WEIGHT_MXFP8 && d->group.count == 0 && q->group.count == 0 &&
           !q->tile_2d && !q->row_values && prog_ref_present(q->rowwise.codes) &&
           prog_ref_present(q->rowwise.scales) && !prog_ref_present(q->colwise.codes);
}

// The fused outputs of the update of d (the table in op_optim.h): what the formats without a
// cast kernel of their own write, and the amaxes a following cast needs.
static op_optim_outputs op_optim_outputs_of(const optim_param_desc *d) {
    op_optim_outputs o = {QT_OPTIM_OUT_NONE, {0}, {0}, false, 0};
    switch (d->weight) {
    case OPTIM_WEIGHT_NONE:
    case OPTIM_WEIGHT_FP8_BLOCK:
        return o;
    case OPTIM_WEIGHT_MXFP8:
        if (op_optim_mxfp8_fused(d)) o.out = QT_OPTIM_OUT_MXFP8;
        return o;
    case OPTIM_WEIGHT_BF16:
        o.out = QT_OPTIM_OUT_BF16;
        return o;
    case OPTIM_WEIGHT_FP8_DELAYED:
        QT_ASSERT(d->fp8.fp8 == QT_FP8_E4M3 || d->fp8.fp8 == QT_FP8_E5M2);
        if (d->group.count > 0) return o;
        o.out = QT_OPTIM_OUT_FP8;
        o.amax0 = d->fp8_amax;
        return o;
    case OPTIM_WEIGHT_FP8_CURRENT:
        // A stacked weight's per-member amaxes too, where its members are whole tiles.
        if (d->group.count > 0 && op_optim_member_rows(d) == 0) return o;
        o.amax_member_rows = op_optim_member_rows(d);
        QT_ASSERT(prog_ref_present(d->fp8_amax));
        o.amax0 = d->fp8_amax;
        o.amax_on_skip = true;
        return o;
    case OPTIM_WEIGHT_NVFP4: {
        // Fused unless RHT needs the post-transform columnwise amax (or the weight is stacked
        // with members that are not whole tiles; a stacked one takes an amax per member).
        const op_nvfp4_quant *q = &d->nvfp4;
        QT_ASSERT(q->rowwise || q->colwise);
        if (q->rht || (d->group.count > 0 && op_optim_member_rows(d) == 0)) return o;
        o.amax_member_rows = op_optim_member_rows(d);
        o.amax_on_skip = true;
        if (q->rowwise) o.amax0 = q->amax_row;
        if (q->colwise) o.amax1 = q->amax_col;
        if (prog_ref_present(o.amax0) && prog_ref_present(o.amax1) &&
            op_optim_same(o.amax0, o.amax1)) {
            o.amax1 = (prog_ref){0};
        }
        return o;
    }
    }
    QT_ASSERT(!"unknown optim_weight");
    return o;
}

// Whether an update op of d has anything to do: a quantize-only one without outputs has not.
static bool op_optim_updates(const op_optim_outputs *o, bool quantize_only) {
    return !quantize_only || o->out != QT_OPTIM_OUT_NONE || prog_ref_present(o->amax0) ||
           prog_ref_present(o->amax1);
}

// One region an update reads or writes, at its optim_adamw_args field.
typedef struct op_optim_use {
    uint32_t field;
    prog_ref ref;
    uint64_t bytes;
    prog_access access;
} op_optim_use;
#define OP_OPTIM_USES_MAX 11

// Every region of d's update with outputs o, in args order (state first, where present and not
// quantize_only).
static uint32_t op_optim_uses(const optim_param_desc *d, const op_optim_outputs *o,
                              prog_ref state, bool quantize_only, op_optim_use *u) {
    uint32_t n = 0;
    uint64_t elems = (uint64_t)d->rows * d->cols;
#define OP_OPTIM_USE(f, r, b, acc)                                              \
    do {                                                                        \
        if (prog_ref_present(r)) {                                              \
            u[n++] = (op_optim_use){offsetof(optim_adamw_args, f), r, b, acc};  \
        }                                                                       \
    } while (0)
    QT_ASSERT(prog_ref_present(d->master));
    if (quantize_only) {
        OP_OPTIM_USE(master, d->master, elems * 4, PROG_READ);
    } else {
        uint64_t grad_bytes = elems * (d->grad_dtype == QT_DTYPE_BF16 ? 2 : 4);
        QT_ASSERT(prog_ref_present(d->grad) && prog_ref_present(d->m) && prog_ref_present(d->v));
        OP_OPTIM_USE(state, state, sizeof(optim_state), PROG_READ);
        OP_OPTIM_USE(grad, d->grad, grad_bytes, PROG_READ);
        OP_OPTIM_USE(master, d->master, elems * 4, PROG_READ_WRITE);
        OP_OPTIM_USE(m, d->m, elems * 4, PROG_READ_WRITE);
        OP_OPTIM_USE(v, d->v, elems * 4, PROG_READ_WRITE);
    }
    if (o->out == QT_OPTIM_OUT_BF16) {
        QT_ASSERT(prog_ref_present(d->bf16));
        OP_OPTIM_USE(weight, d->bf16, elems * 2, PROG_WRITE);
    } else if (o->out == QT_OPTIM_OUT_FP8) {
        QT_ASSERT(prog_ref_present(d->fp8_scale) && prog_ref_present(d->fp8.scale_inv));
        OP_OPTIM_USE(weight, d->fp8.rowwise, elems, PROG_WRITE);
        OP_OPTIM_USE(weight_t, d->fp8.colwise, elems, PROG_WRITE);
        OP_OPTIM_USE(scale, d->fp8_scale, 4, PROG_READ);
        OP_OPTIM_USE(scale_inv, d->fp8.scale_inv, 4, PROG_WRITE);
    } else if (o->out == QT_OPTIM_OUT_MXFP8) {
        OP_OPTIM_USE(weight, d->mxfp8.rowwise.codes, op_mxfp8_codes_bytes(d->rows, d->cols),
                     PROG_WRITE);
        OP_OPTIM_USE(scale_inv, d->mxfp8.rowwise.scales,
                     op_mxfp8_row_scales_bytes(d->rows, d->cols), PROG_WRITE);
    }
    // An atomic max reads and writes its target.
    uint64_t amax_bytes = 4ull * op_optim_amax_words(d, o);
    OP_OPTIM_USE(amax0, o->amax0, amax_bytes, PROG_READ_WRITE);
    OP_OPTIM_USE(amax1, o->amax1, amax_bytes, PROG_READ_WRITE);
#undef OP_OPTIM_USE
    QT_ASSERT(n <= OP_OPTIM_USES_MAX);
    return n;
}

// The args of d's update with outputs o (addresses left 0, as prog_append wants them).
static optim_adamw_args op_optim_args(const optim_param_desc *d, const op_optim_outputs *o,
                                      bool quantize_only) {
    optim_adamw_args args = {0};
    args.rows = d->rows;
    args.cols = d->cols;
    args.grad_dtype = d->grad_dtype;
    args.out = o->out;
    args.fp8 = o->out == QT_OPTIM_OUT_FP8 ? d->fp8.fp8 : 0u;
    if (o->out == QT_OPTIM_OUT_MXFP8) {
        args.fp8 = d->mxfp8.elem == QT_ELEM_E5M2 ? QT_MXFP8_E5M2 : QT_MXFP8_E4M3;
    }
    args.flags = (d->hp.bias_correction ? QT_OPTIM_FLAG_BIAS_CORRECTION : 0u) |
                 (o->amax_on_skip ? QT_OPTIM_FLAG_AMAX_ON_SKIP : 0u) |
                 (quantize_only ? QT_OPTIM_FLAG_QUANTIZE_ONLY : 0u);
    args.beta1 = d->hp.beta1;
    args.beta2 = d->hp.beta2;
    args.eps = d->hp.eps;
    args.weight_decay = d->hp.weight_decay;
    args.lr_scale = d->hp.lr_scale;
    args.amax_member_rows = o->amax_member_rows;
    return args;
}

// The 64 x 64 tiles of d: the blocks of its update.
static uint32_t op_optim_tiles(const optim_param_desc *d) {
    uint64_t tiles = (uint64_t)((d->rows + QT_OPTIM_TILE - 1) / QT_OPTIM_TILE) *
                     ((d->cols + QT_OPTIM_TILE - 1) / QT_OPTIM_TILE);
    QT_ASSERT(tiles >= 1 && tiles <= 0x7FFFFFFFu);
    return (uint32_t)tiles;
}

// One qt_optim_adamw op: the update (or, quantize_only, none) with the outputs o.
static qt_status op_optim_update(program *p, const optim_param_desc *d, prog_ref state,
                                 bool quantize_only, const op_optim_outputs *o) {
    QT_ASSERT(quantize_only || prog_ref_present(state));
    optim_adamw_args args = op_optim_args(d, o, quantize_only);
    launch_shape shape = {{op_optim_tiles(d), 1, 1}, {QT_OPTIM_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_OPTIM_ADAMW, d->name, &shape, &args, sizeof args, &op));
    op_optim_use uses[OP_OPTIM_USES_MAX];
    uint32_t n = op_optim_uses(d, o, state, quantize_only, uses);
    for (uint32_t i = 0; i < n; i++) {
        QT_TRY(prog_use_span(p, op, uses[i].field, uses[i].ref, uses[i].bytes, uses[i].access));
    }
    return QT_OK;
}

// The amax arrays that the cast kernel after d's update merges into (optim_multi_entry
// .cast_amax), f32 [*words] each: a stacked weight's per-member amaxes (FP8 current scaling,
// NVFP4) and NVFP4's pair with RHT. Returns how many (0: the cast takes no amax of its own).
static uint32_t op_optim_cast_amaxes(const optim_param_desc *d, prog_ref out[2],
                                     uint32_t *words) {
    out[0] = out[1] = (prog_ref){0};
    *words = d->group.count ? d->group.count : 1u;
    switch (d->weight) {
    case OPTIM_WEIGHT_NONE:
    case OPTIM_WEIGHT_BF16:
    case OPTIM_WEIGHT_FP8_DELAYED:
    case OPTIM_WEIGHT_MXFP8:
    case OPTIM_WEIGHT_FP8_BLOCK:
        return 0;
    case OPTIM_WEIGHT_FP8_CURRENT:
        if (d->group.count == 0 || op_optim_member_rows(d) != 0) return 0;  // the update's
        out[0] = d->fp8_amax;
        return 1;
    case OPTIM_WEIGHT_NVFP4:
        if (!d->nvfp4.rht && (d->group.count == 0 || op_optim_member_rows(d) != 0)) return 0;
        out[0] = d->nvfp4.amax_row;
        if (!d->nvfp4.rht) return 1;
        out[1] = d->nvfp4.amax_col;
        return 2;
    }
    QT_ASSERT(!"unknown optim_weight");
    return 0;
}

// The casts that follow the update of d (the formats whose weight the update does not write).
// zeroed: the step's begin zeroed the amaxes they merge into (op_optim_cast_amaxes), so the
// casts take no zeroing launch of their own.
static qt_status op_optim_casts(program *p, const optim_param_desc *d, bool zeroed) {
    switch (d->weight) {
    case OPTIM_WEIGHT_NONE:
    case OPTIM_WEIGHT_BF16:
        return QT_OK;
    case OPTIM_WEIGHT_FP8_DELAYED:
    case OPTIM_WEIGHT_FP8_CURRENT: {
        // A stacked weight's per-tensor FP8: the grouped cast from the new master.
        op_fp8_input in = {d->master, QT_DTYPE_F32, d->rows, d->cols, d->group};
        if (d->group.count > 0) {
            if (d->weight == OPTIM_WEIGHT_FP8_DELAYED) {
                return op_fp8_cast_delayed(p, d->name, &in, &d->fp8, d->fp8_scale, d->fp8_amax);
            }
            if (op_optim_member_rows(d) == 0) {  // else the update took the members' amaxes
                QT_TRY((zeroed ? op_fp8_amax_merge : op_fp8_amax)(p, d->name, &in, d->fp8_amax));
            }
            return op_fp8_cast_current(p, d->name, &in, &d->fp8, d->fp8_amax, d->fp8_scale,
                                       d->fp8_pow2, d->fp8_eps);
        }
        if (d->weight == OPTIM_WEIGHT_FP8_DELAYED) return QT_OK;
        in.group = op_group_dense();
        return op_fp8_cast_current(p, d->name, &in, &d->fp8, d->fp8_amax, d->fp8_scale,
                                   d->fp8_pow2, d->fp8_eps);
    }
    case OPTIM_WEIGHT_MXFP8: {
        QT_ASSERT(d->mxfp8.group.count == 0);
        if (op_optim_mxfp8_fused(d)) return QT_OK;  // the update wrote it
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
        return op_quant_block(p, d->name, d->master, QT_DTYPE_F32, &d->block,
                              &d->block_options);
    case OPTIM_WEIGHT_NVFP4: {
        const op_nvfp4_quant *q = &d->nvfp4;
        op_nvfp4_input in = {d->master, QT_DTYPE_F32, d->rows, d->cols, d->group};
        if (q->rht || (d->group.count > 0 && op_optim_member_rows(d) == 0)) {
            op_nvfp4_amax_out amax = {q->amax_row, q->rht ? q->amax_col : (prog_ref){0}, q->rht,
                                      q->rht_signs};
            QT_TRY((zeroed ? op_nvfp4_amax_merge : op_nvfp4_amax)(p, d->name, &in, &amax));
        }
        return op_nvfp4_quantize(p, d->name, &in, q);
    }
    }
    QT_ASSERT(!"unknown optim_weight");
    return QT_OK;
}

static bool op_optim_empty(const optim_param_desc *d) {
    QT_ASSERT(d->name != NULL);
    QT_ASSERT(d->grad_dtype == QT_DTYPE_BF16 || d->grad_dtype == QT_DTYPE_F32);
    return d->rows == 0 || d->cols == 0;
}

// One parameter on its own: the zeroing of its amax workspace, the update, the casts.
static qt_status op_optim_param(program *p, const optim_param_desc *d, prog_ref state,
                                bool quantize_only) {
    if (op_optim_empty(d)) return QT_OK;
    op_optim_outputs o = op_optim_outputs_of(d);
    if (o.amax_on_skip) {
        uint32_t words = op_optim_amax_words(d, &o);
        if (prog_ref_present(o.amax0)) QT_TRY(op_optim_zero(p, d->name, o.amax0, words));
        if (prog_ref_present(o.amax1)) QT_TRY(op_optim_zero(p, d->name, o.amax1, words));
    }
    if (op_optim_updates(&o, quantize_only)) {
        QT_TRY(op_optim_update(p, d, state, quantize_only, &o));
    }
    return op_optim_casts(p, d, false);
}

qt_status op_optim_adamw(program *p, const optim_param_desc *d, prog_ref state) {
    return op_optim_param(p, d, state, false);
}

qt_status op_optim_adamw_list(program *p, const optim_param_desc *list, uint32_t count,
                              prog_ref state) {
    for (uint32_t i = 0; i < count; i++) QT_TRY(op_optim_param(p, &list[i], state, false));
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Multi-tensor launches

uint64_t op_optim_table_bytes(uint32_t count) {
    return (uint64_t)count * sizeof(optim_multi_entry);
}

// The regions of d's update in a multi-tensor launch, which has the state (and the table) of
// its own.
static uint32_t op_optim_multi_uses(const optim_param_desc *d, const op_optim_outputs *o,
                                    op_optim_use *u) {
    return op_optim_uses(d, o, (prog_ref){0}, false, u);
}

// The end of the launch that starts at list[first]: the parameters after it while their
// regions, the state's and the table's fit one op and their tiles one grid (at least one), and
// at most per_launch non-empty ones (0: no such limit).
static uint32_t op_optim_launch_end(const optim_param_desc *list, uint32_t count,
                                    uint32_t first, uint32_t per_launch) {
    uint32_t refs = 2, end = first, taken = 0;
    uint64_t blocks = 0;
    for (; end < count; end++) {
        const optim_param_desc *d = &list[end];
        if (op_optim_empty(d)) continue;
        if (per_launch != 0 && taken == per_launch) break;
        taken++;
        op_optim_outputs o = op_optim_outputs_of(d);
        op_optim_use uses[OP_OPTIM_USES_MAX];
        uint32_t n = op_optim_multi_uses(d, &o, uses);
        uint32_t tiles = op_optim_tiles(d);
        if (end > first && (refs + n > PROG_OP_REFS_MAX || blocks + tiles > 0x7FFFFFFFu)) break;
        refs += n;
        blocks += tiles;
    }
    return end;
}

static prog_ref op_optim_entry_ref(prog_ref table, uint32_t entry) {
    table.offset += (uint64_t)entry * sizeof(optim_multi_entry);
    return table;
}

// The entry's cast_amax (op_optim_cast_amaxes), in the describe op's args.
static qt_status op_optim_describe_cast_amaxes(program *p, uint32_t op,
                                               const optim_param_desc *d) {
    prog_ref amax[2];
    uint32_t words;
    uint32_t n = op_optim_cast_amaxes(d, amax, &words);
    if (n == 0) return QT_OK;
    uint32_t at = (uint32_t)(offsetof(optim_describe_args, value) +
                             offsetof(optim_multi_entry, cast_amax_words));
    prog_args_set(p, op, at, &words, sizeof words);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t field = (uint32_t)(offsetof(optim_describe_args, value) +
                                    offsetof(optim_multi_entry, cast_amax) + 8 * k);
        QT_TRY(prog_use_span(p, op, field, amax[k], 4ull * words, PROG_ADDRESS));
    }
    return QT_OK;
}

qt_status op_optim_describe(program *p, const optim_param_desc *list, uint32_t count,
                            prog_ref table, uint32_t per_launch) {
    uint32_t entry = 0;
    for (uint32_t first = 0; first < count;) {
        uint32_t end = op_optim_launch_end(list, count, first, per_launch);
        uint32_t block = 0;
        for (uint32_t i = first; i < end; i++) {
            const optim_param_desc *d = &list[i];
            if (op_optim_empty(d)) continue;
            op_optim_outputs o = op_optim_outputs_of(d);
            optim_describe_args args = {0};
            args.value.args = op_optim_args(d, &o, false);
            args.value.first_block = block;
            args.value.blocks = op_optim_tiles(d);
            block += args.value.blocks;
            launch_shape shape = {{1, 1, 1}, {QT_OPTIM_DESCRIBE_THREADS, 1, 1}, 0};
            uint32_t op;
            QT_TRY(prog_append(p, KERNEL_OPTIM_DESCRIBE, d->name, &shape, &args, sizeof args,
                               &op));
            QT_TRY(prog_use_span(p, op, offsetof(optim_describe_args, entry),
                                 op_optim_entry_ref(table, entry), sizeof(optim_multi_entry),
                                 PROG_WRITE));
            op_optim_use uses[OP_OPTIM_USES_MAX];
            uint32_t n = op_optim_multi_uses(d, &o, uses);
            for (uint32_t u = 0; u < n; u++) {
                uint32_t field = (uint32_t)(offsetof(optim_describe_args, value) +
                                            offsetof(optim_multi_entry, args) + uses[u].field);
                QT_TRY(prog_use_span(p, op, field, uses[u].ref, uses[u].bytes, PROG_ADDRESS));
            }
            QT_TRY(op_optim_describe_cast_amaxes(p, op, d));
            entry++;
        }
        first = end;
    }
    return QT_OK;
}

// Adds a target of `bytes` to z; false when z is full.
static bool op_optim_zeroes_add(op_optim_zeroes *z, prog_ref target, uint64_t bytes) {
    if (!prog_ref_present(target)) return true;
    if (z->target_count == OP_OPTIM_ZEROES_MAX) return false;
    z->targets[z->target_count] = target;
    z->target_bytes[z->target_count++] = bytes;
    return true;
}

bool op_optim_zeroes_of(const optim_param_desc *list, uint32_t count, prog_ref table,
                        op_optim_zeroes *z) {
    *z = (op_optim_zeroes){table, 0, 0, {{0}}, {0}};
    for (uint32_t i = 0; i < count; i++) {
        const optim_param_desc *d = &list[i];
        if (op_optim_empty(d)) continue;
        z->count++;
        op_optim_outputs o = op_optim_outputs_of(d);
        uint64_t bytes = 4ull * op_optim_amax_words(d, &o);
        if (o.amax_on_skip &&
            (!op_optim_zeroes_add(z, o.amax0, bytes) || !op_optim_zeroes_add(z, o.amax1, bytes))) {
            return false;
        }
        prog_ref amax[2];
        uint32_t words;
        uint32_t n = op_optim_cast_amaxes(d, amax, &words);
        for (uint32_t k = 0; k < n; k++) {
            if (!op_optim_zeroes_add(z, amax[k], 4ull * words)) return false;
        }
    }
    return z->target_count > 0;
}

// One launch's zeroing of the amax workspaces of its entries, when one of them has any.
static qt_status op_optim_multi_zero(program *p, const char *name, const optim_param_desc *list,
                                     uint32_t first, uint32_t end, prog_ref entries,
                                     uint32_t count) {
    bool any = false;
    for (uint32_t i = first; i < end; i++) {
        any = any || (!op_optim_empty(&list[i]) && op_optim_outputs_of(&list[i]).amax_on_skip);
    }
    if (!any) return QT_OK;
    optim_multi_args args = {0, 0, count, 0};
    launch_shape shape = {{1, 1, 1}, {QT_OPTIM_ZERO_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_OPTIM_AMAX_ZERO, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(optim_multi_args, entries), entries,
                         (uint64_t)count * sizeof(optim_multi_entry), PROG_READ));
    for (uint32_t i = first; i < end; i++) {
        if (op_optim_empty(&list[i])) continue;
        op_optim_outputs o = op_optim_outputs_of(&list[i]);
        if (!o.amax_on_skip) continue;
        uint64_t bytes = 4ull * op_optim_amax_words(&list[i], &o);
        QT_TRY(prog_use_optional(p, op, PROG_ARGS_FIELD_NONE, o.amax0, bytes, PROG_WRITE));
        QT_TRY(prog_use_optional(p, op, PROG_ARGS_FIELD_NONE, o.amax1, bytes, PROG_WRITE));
    }
    return QT_OK;
}

// The casts of the non-empty parameters list[first, end), in order.
static qt_status op_optim_casts_of(program *p, const optim_param_desc *list, uint32_t first,
                                   uint32_t end, bool zeroed) {
    for (uint32_t i = first; i < end; i++) {
        if (!op_optim_empty(&list[i])) QT_TRY(op_optim_casts(p, &list[i], zeroed));
    }
    return QT_OK;
}

qt_status op_optim_adamw_multi(program *p, const char *name, const optim_param_desc *list,
                               uint32_t count, prog_ref state, prog_ref table,
                               uint32_t per_launch, prog_ref chain,
                               const op_optim_zeroes *zeroed) {
    QT_ASSERT(prog_ref_present(state) && prog_ref_present(table));
    QT_ASSERT(!zeroed || op_optim_same(zeroed->entries, table));
    uint32_t entry = 0;
    for (uint32_t first = 0; first < count;) {
        uint32_t end = op_optim_launch_end(list, count, first, per_launch);
        uint32_t n = 0;
        uint64_t blocks = 0;
        for (uint32_t i = first; i < end; i++) {
            if (op_optim_empty(&list[i])) continue;
            n++;
            blocks += op_optim_tiles(&list[i]);
        }
        if (n == 0) {
            first = end;
            continue;
        }
        prog_ref entries = op_optim_entry_ref(table, entry);
        if (!zeroed) QT_TRY(op_optim_multi_zero(p, name, list, first, end, entries, n));
        optim_multi_args args = {0, 0, n, 0};
        launch_shape shape = {{(uint32_t)blocks, 1, 1}, {QT_OPTIM_THREADS, 1, 1}, 0};
        uint32_t op;
        QT_TRY(prog_append(p, KERNEL_OPTIM_ADAMW_MULTI, name, &shape, &args, sizeof args, &op));
        QT_TRY(prog_use_span(p, op, offsetof(optim_multi_args, state), state,
                             sizeof(optim_state), PROG_READ));
        QT_TRY(prog_use_span(p, op, offsetof(optim_multi_args, entries), entries,
                             (uint64_t)n * sizeof(optim_multi_entry), PROG_READ));
        if (prog_ref_present(chain)) {
            QT_TRY(prog_use(p, op, PROG_ARGS_FIELD_NONE, chain, PROG_READ_WRITE));
        }
        for (uint32_t i = first; i < end; i++) {
            const optim_param_desc *d = &list[i];
            if (op_optim_empty(d)) continue;
            op_optim_outputs o = op_optim_outputs_of(d);
            op_optim_use uses[OP_OPTIM_USES_MAX];
            uint32_t k = op_optim_multi_uses(d, &o, uses);
            for (uint32_t u = 0; u < k; u++) {
                QT_TRY(prog_use_span(p, op, PROG_ARGS_FIELD_NONE, uses[u].ref, uses[u].bytes,
                                     uses[u].access));
            }
        }
        entry += n;
        // Capped launches: this launch's casts before the next launch.
        if (per_launch != 0) QT_TRY(op_optim_casts_of(p, list, first, end, zeroed != NULL));
        first = end;
    }
    QT_ASSERT(!zeroed || zeroed->count == entry);
    return per_launch == 0 ? op_optim_casts_of(p, list, 0, count, zeroed != NULL) : QT_OK;
}

qt_status op_optim_quantize(program *p, const optim_param_desc *d) {
    return op_optim_param(p, d, (prog_ref){0}, true);
}
