// model programs: the init, train, eval, infer and checksum programs of a planned model
// (model.h). Every region a program needs besides the persistent ones of model_plan is reserved
// here as a transient region of that program ("<mode>.<layer>.<part>"), so the planner packs
// the modes' activations into the same bytes.
#include <stdio.h>   // snprintf
#include <string.h>

#include "runtime/model/model_impl.h"
#include "runtime/ops/op_act.h"    // activations, losses, grad norm
#include "runtime/ops/op_core.h"   // op_fill_random, op_checksum
#include "runtime/ops/op_gemm.h"   // op_gemm, op_gemm_bias_grad
#include "runtime/ops/op_moe.h"    // routing, gather, combine
#include "runtime/ops/op_optim.h"  // op_optim_*
#include "runtime/ops/op_quant_block.h"
#include "runtime/ops/op_quant_fp8.h"
#include "runtime/ops/op_quant_mxfp8.h"
#include "runtime/ops/op_quant_nvfp4.h"
#include "runtime/ops/op_sched.h"  // op_sched_copy, op_sched_record, op_sched_checksum

// What one program's builder knows while it appends ops: the model's model_builder.
typedef model_builder mb;
typedef model_build_moe mb_moe;

static prog_ref mb_dev(const mb *b, arena_handle h) { return (prog_ref){b->m->dev, h, 0}; }

static prog_ref mb_at(prog_ref r, uint64_t offset) {
    r.offset += offset;
    return r;
}

static op_act_tensor mb_act(model_tensor t) { return (op_act_tensor){t.ref, t.dtype}; }

// The name of a layer in region and op names. Layers without a name (activations, residual
// ends) get the first word of their kind and their index joined by '#' ("residual#4"), which no
// recipe name can contain ([A-Za-z_][A-Za-z0-9_]*), so they never meet a user's layer name.
static const char *mb_layer_name(const mb *b, uint32_t layer, char *buf, size_t bytes) {
    const recipe_layer *l = &b->m->recipe->model.layers[layer];
    if (l->name[0]) return l->name;
    const char *kind = recipe_layer_kind_name(l->kind);
    snprintf(buf, bytes, "%.*s#%u", (int)strcspn(kind, " "), kind, layer);
    return buf;
}

// A transient region of this program, "<mode>.<what>".
static qt_status mb_region(mb *b, const char *what, uint64_t bytes, arena_category cat,
                           prog_ref *out) {
    model_place pl = {b->m->dev, model_mode_name(b->mode), false, cat, NULL};
    return model_region(&pl, what, bytes, cat, out);
}

// A tensor of this program [rows][cols] of dtype (BF16 or F32).
static qt_status mb_tensor_of(mb *b, const char *what, uint32_t rows, uint32_t cols,
                              uint32_t dtype, arena_category cat, model_tensor *out) {
    out->dtype = dtype;
    out->rows = rows;
    out->cols = cols;
    out->amax = OP_REF_NONE;
    uint64_t elem = dtype == QT_DTYPE_BF16 ? 2 : 4;
    return mb_region(b, what, (uint64_t)rows * cols * elem, cat, &out->ref);
}

static qt_status mb_tensor(mb *b, const char *what, uint32_t rows, uint32_t cols,
                           arena_category cat, model_tensor *out) {
    return mb_tensor_of(b, what, rows, cols, QT_DTYPE_BF16, cat, out);
}

// ---------------------------------------------------------------------------------------------
// Data parallelism (runtime/parallel/parallel.h): collective ops, only when the run has several
// ranks

QT_STATIC_ASSERT(offsetof(data_slot_header, rows_global) == QT_DP_ROWS_GLOBAL_OFFSET,
                 "ptx/dp.h reads rows_global at its offset in the device batch's header");

static bool mb_parallel(const mb *b) { return b->m->world > 1; }

// The region every collective op of the program writes, which keeps them in program order in a
// captured graph (NCCL needs the same order on every rank). prefix: the program's.
static qt_status mb_dp_begin(mb *b, const char *prefix) {
    if (!mb_parallel(b)) return QT_OK;
    model_place pl = {b->m->dev, prefix, false, ARENA_CAT_WORKSPACE, NULL};
    return model_region(&pl, "dp.order", 16, ARENA_CAT_WORKSPACE, &b->dp_order);
}

// Collective items appended as ops of at most DP_ITEMS_MAX items each (one NCCL group each).
typedef struct mb_items {
    op_dp_item item[DP_ITEMS_MAX];
    uint32_t count;
} mb_items;

static qt_status mb_items_flush(mb *b, const char *name, mb_items *items) {
    if (items->count == 0) return QT_OK;
    QT_TRY(op_dp_collective(b->p, name, b->m->comm, b->dp_order, items->item, items->count));
    items->count = 0;
    return QT_OK;
}

static qt_status mb_items_add(mb *b, const char *name, mb_items *items, op_dp_item item) {
    if (items->count == DP_ITEMS_MAX) QT_TRY(mb_items_flush(b, name, items));
    items->item[items->count++] = item;
    return QT_OK;
}

// A region's bytes from ref's offset to its end (a counting arena has no table: any size).
static uint64_t mb_bytes_to_end(prog_ref ref) {
    if (arena_counting(ref.arena)) return 16;
    return arena_region_get(ref.arena, ref.region)->bytes - ref.offset;
}

// Every stored copy of parameter i's weight (a quantized weight's codes, scales and amaxes in
// every usage; the master of one without a quantizer) broadcast from its owner, as stored:
// added to `items` under `name`.
static qt_status mb_dp_broadcast_param(mb *b, uint32_t i, const char *name, mb_items *items) {
    const model *m = b->m;
    const model_param *pa = &m->params[i];
    prog_ref refs[8];
    uint32_t n = 0;
    if (pa->quantizer < 0) {
        refs[n++] = mb_dev(b, pa->master);
    } else {
        const model_qstore *s = &pa->weight;
        const prog_ref all[] = {s->row_data, s->row_scale, s->col_data, s->col_scale,
                                s->scale_inv, s->amax_row, s->amax_col, s->bf16.ref};
        for (uint32_t k = 0; k < sizeof all / sizeof all[0]; k++) {
            if (!prog_ref_present(all[k])) continue;
            bool seen = false;  // amax_row and amax_col may be one region
            for (uint32_t j = 0; j < n; j++) {
                seen |= refs[j].arena == all[k].arena && refs[j].region == all[k].region;
            }
            if (!seen) refs[n++] = (prog_ref){all[k].arena, all[k].region, 0};
        }
    }
    for (uint32_t j = 0; j < n; j++) {
        op_dp_item it = {DP_COLL_BROADCAST, DP_DTYPE_U8, DP_OP_NONE, m->param_owner[i], refs[j],
                         refs[j], mb_bytes_to_end(refs[j])};
        QT_TRY(mb_items_add(b, name, items, it));
    }
    return QT_OK;
}

_Static_assert(MODEL_PARAMS_MAX <= 1024, "the update and broadcast orders live on the stack");

static uint64_t mb_param_elems(const model *m, uint32_t i) {
    return (uint64_t)m->params[i].rows * m->params[i].cols;
}

// Sorts `count` parameter indices by key[index], ascending or (descending) not, keeping the
// order of equal keys (an insertion sort: a model has at most a few hundred parameters, and no
// sort may allocate).
static void mb_sort_params(uint32_t *params, uint32_t count, const uint64_t *key,
                           bool descending) {
    for (uint32_t k = 1; k < count; k++) {
        uint32_t i = params[k], j = k;
        for (; j > 0 && (descending ? key[params[j - 1]] < key[i]
                                    : key[params[j - 1]] > key[i]); j--) {
            params[j] = params[j - 1];
        }
        params[j] = i;
    }
}

// The parameters that `rank` updates, in the order its launches run them, into order; returns
// their count. Parameter order, or with m->largest_first the most elements first (ties by
// index): a rank's last launches are then its smallest, and the broadcasts of its large weights
// run beside them instead of after the last large update, with nothing left to hide them.
static uint32_t mb_update_order(const model *m, uint32_t rank, uint32_t *order) {
    uint32_t count = 0;
    uint64_t elems[MODEL_PARAMS_MAX];
    for (uint32_t i = 0; i < m->param_count; i++) {
        elems[i] = mb_param_elems(m, i);
        if (m->param_owner[i] == rank) order[count++] = i;
    }
    if (m->largest_first) mb_sort_params(order, count, elems, true);
    return count;
}

// The order in which the weights go out, into sequence: parameter order, or with
// m->largest_first the order in which the owners' updates end, estimated as the elements each
// owner has updated by then (its launches run one after another at about the same rate per
// element; ties by index). Every rank computes the same sequence from the model.
static void mb_broadcast_sequence(const model *m, uint32_t *sequence) {
    for (uint32_t i = 0; i < m->param_count; i++) sequence[i] = i;
    if (!m->largest_first) return;
    uint64_t ready[MODEL_PARAMS_MAX];
    for (uint32_t rank = 0; rank < m->world; rank++) {
        uint32_t order[MODEL_PARAMS_MAX];
        uint32_t count = mb_update_order(m, rank, order);
        uint64_t updated = 0;
        for (uint32_t k = 0; k < count; k++) {
            updated += mb_param_elems(m, order[k]);
            ready[order[k]] = updated;
        }
    }
    mb_sort_params(sequence, m->param_count, ready, false);
}

// The weights broadcast in mb_broadcast_sequence's order, consecutive ones in one NCCL group
// until every rank sends in it: a broadcast moves bytes from its owner only, so a group with
// every rank's weights uses the links in all directions at once, where one op per parameter used
// one at a time. A group waits for the updates of all its parameters, which the ranks run at
// about the same pace.
static qt_status mb_dp_broadcast_weights(mb *b) {
    const model *m = b->m;
    mb_items items = {0};
    bool sends[DP_RANKS_MAX] = {false};
    uint32_t senders = 0, sequence[MODEL_PARAMS_MAX];
    char name[PROG_OP_NAME_MAX];
    mb_broadcast_sequence(m, sequence);
    for (uint32_t k = 0; k < m->param_count; k++) {
        uint32_t i = sequence[k];
        if (items.count == 0) snprintf(name, sizeof name, "dp.broadcast.%s", m->params[i].name);
        QT_TRY(mb_dp_broadcast_param(b, i, name, &items));
        senders += !sends[m->param_owner[i]];
        sends[m->param_owner[i]] = true;
        if (senders < m->world) continue;
        QT_TRY(mb_items_flush(b, name, &items));
        memset(sends, 0, sizeof sends);
        senders = 0;
    }
    return mb_items_flush(b, name, &items);
}

// Each parameter's gradient summed over the ranks into its owner's copy, one op per parameter,
// placed in the backward pass right after the layer that writes it (last layer first, the same
// order on every rank): a graph starts its nodes roughly in the order they were captured, so a
// reduce captured after the whole backward pass started late, however early its gradient was
// written. After the reduce of a parameter this rank owns, the norm's part over that sum
// (b->norm, over the owned gradients in parameter order); the part of the last one reduced,
// owned index 0, folds. Called after the backward pass has done layers `done` and above.
static qt_status mb_dp_reduce_ready(mb *b, uint32_t done) {
    const model *m = b->m;
    while (b->reduce_left > 0 && m->params[b->reduce_left - 1].layer >= done) {
        uint32_t i = --b->reduce_left;
        char name[PROG_OP_NAME_MAX];
        snprintf(name, sizeof name, "dp.reduce.%s", m->params[i].name);
        op_dp_item it = {DP_COLL_REDUCE, DP_DTYPE_F32, DP_OP_SUM, m->param_owner[i],
                         b->grads[i], b->grads[i], b->grad_counts[i]};
        QT_TRY(op_dp_collective(b->p, name, m->comm, b->dp_order, &it, 1));
        if (!model_param_owned(m, i)) continue;
        b->owned_left--;
        QT_TRY(op_grad_norm_part(b->p, "grad_norm", &b->norm, b->owned_left, 1,
                                 b->owned_left == 0));
    }
    return QT_OK;
}

// What one rank contributes to a gather: `bytes` of local, gathered in rank order into a new
// region [world][bytes] named `what` (f32 words, or bytes where `bytes` is no multiple of 4: the
// gather moves them as they are either way).
typedef struct mb_gather {
    const char *what;
    prog_ref local;
    uint64_t bytes;
    prog_ref *all;
} mb_gather;

// The gathers as one collective op named `name` (one NCCL group: one wait for every rank).
static qt_status mb_dp_gather_all(mb *b, const char *name, const mb_gather *g, uint32_t count) {
    mb_items items = {0};
    for (uint32_t k = 0; k < count; k++) {
        QT_TRY(mb_region(b, g[k].what, g[k].bytes * b->m->world, ARENA_CAT_STAGING, g[k].all));
        bool words = g[k].bytes % 4 == 0;
        op_dp_item it = {DP_COLL_ALL_GATHER, words ? DP_DTYPE_F32 : DP_DTYPE_U8, DP_OP_NONE, 0,
                         g[k].local, *g[k].all, words ? g[k].bytes / 4 : g[k].bytes};
        QT_TRY(mb_items_add(b, name, &items, it));
    }
    return mb_items_flush(b, name, &items);
}

static qt_status mb_dp_gather(mb *b, const char *what, prog_ref local, uint64_t bytes,
                              prog_ref *all) {
    mb_gather g = {what, local, bytes, all};
    return mb_dp_gather_all(b, what, &g, 1);
}

// This step's amaxes (row 0 of every delayed-scaling history) the maximum over the ranks, so
// the states roll the same values on every rank: the global batch's amaxes.
static qt_status mb_dp_amaxes(mb *b) {
    const model *m = b->m;
    mb_items items = {0};
    for (uint32_t s = 0; s < m->state_count; s++) {
        prog_ref row0 = mb_dev(b, m->states[s].history);
        op_dp_item it = {DP_COLL_ALL_REDUCE, DP_DTYPE_F32, DP_OP_MAX, 0, row0, row0,
                         m->states[s].slots};
        QT_TRY(mb_items_add(b, "dp.amax", &items, it));
    }
    return mb_items_flush(b, "dp.amax", &items);
}

// ---------------------------------------------------------------------------------------------
// Quantization of activations and gradients

static prog_ref mb_state_scale(const mb *b, const model_quantizer *mq) {
    return mb_at(mb_dev(b, b->m->states[mq->state].scale), (uint64_t)mq->slot * 4);
}

static prog_ref mb_state_amax(const mb *b, const model_quantizer *mq) {
    return mb_at(mb_dev(b, b->m->states[mq->state].history), (uint64_t)mq->slot * 4);
}

static qt_status mb_quantize_fp8(mb *b, const char *name, const model_quantizer *mq,
                                 model_tensor x, op_group group, bool record_amax,
                                 const model_qstore *s) {
    op_fp8_input in = {x.ref, x.dtype, x.rows, x.cols, group};
    op_fp8_output out = {model_fp8_code(mq->q.elem), s->row_data, s->col_data, s->scale_inv};
    if (mq->q.scheme == QT_SCHEME_DELAYED) {
        // Eval and infer read the scale and leave the history alone (no amax slot).
        prog_ref amax = record_amax ? mb_state_amax(b, mq) : OP_FP8_NONE;
        return op_fp8_cast_delayed(b->p, name, &in, &out, mb_state_scale(b, mq), amax);
    }
    // A producer that already took x's amax saves the pass over x (mb_producer_serves);
    // otherwise the pass merges into the store's amax, a slot of the step (zeroed by its first
    // op).
    prog_ref amax = x.amax;
    if (!prog_ref_present(amax)) {
        amax = s->amax_row;
        QT_TRY(op_fp8_amax_merge(b->p, name, &in, amax));
    }
    return op_fp8_cast_current(b->p, name, &in, &out, amax, OP_FP8_NONE, mq->q.pow2,
                               mq->q.amax_eps);
}

static op_nvfp4_quant mb_nvfp4_quant(const mb *b, const model_quantizer *mq,
                                     const model_qstore *s) {
    op_nvfp4_quant q = {0};
    q.rowwise = s->rowwise;
    q.colwise = s->colwise;
    q.rht = s->colwise && mq->rht;
    q.rht_signs = QT_NVFP4_RHT_SIGNS_TE;
    q.two_d = mq->q.two_d;
    q.stochastic = mq->q.sr;
    q.seed = b->m->seed;
    q.tensor_id = (uint32_t)(mq - b->m->quantizers);
    q.step = mb_dev(b, b->m->io.optim_steps);  // the counted train steps
    q.amax_row = s->amax_row;
    q.amax_col = s->amax_col;
    q.row_data = s->row_data;
    q.row_scales = s->row_scale;
    q.col_data = s->col_data;
    q.col_scales = s->col_scale;
    q.row_values = s->row_values;
    q.col_values = s->col_values;
    return q;
}

static op_block_tensor mb_block_tensor(const model_quantizer *mq, uint32_t rows, uint32_t cols,
                                       const model_qstore *s) {
    op_block_tensor t = {0};
    t.rows = rows;
    t.cols = cols;
    t.two_d = mq->q.two_d;
    t.fp8 = model_fp8_code(mq->q.elem);
    t.rowwise = s->rowwise;
    t.colwise = s->colwise;
    t.row_codes = s->row_data;
    t.row_scale_inv = s->row_scale;
    t.col_codes = s->col_data;
    t.col_scale_inv = s->col_scale;
    return t;
}

static op_mxfp8_quantize_desc mb_mxfp8_desc(const model_quantizer *mq, model_tensor x,
                                            const model_qstore *s) {
    op_mxfp8_quantize_desc d = {0};
    d.in = x.ref;
    d.dtype = x.dtype;
    d.rows = x.rows;
    d.cols = x.cols;
    d.elem = mq->q.elem;
    d.tile_2d = mq->q.two_d;
    if (s->rowwise) d.rowwise = (op_mxfp8_dir){s->row_data, s->row_scale};
    if (s->colwise) d.colwise = (op_mxfp8_dir){s->col_data, s->col_scale};
    d.row_values = s->row_values;
    d.col_values = s->col_values;
    return d;
}

// Quantizes x with the role's quantizer into new regions "<mode>.<what>.*" of the directions
// asked for; a grouped x (group.count members: an moe layer's permuted rows) gets per-member
// scales. record_amax: delayed scaling adds this cast's amax to the history (train only). The
// amaxes it merges into are slots of the step (model_amax_slots); where the producer of x took
// x's amax already, the store's own amax is not used. mb_qstore_values reserves the store alone,
// for a producer that fills it itself (mb_act_cast).
// values (MODEL_QSTORE_*_VALUES, mb_values): the directions stored as BF16 values.
static qt_status mb_qstore_values(mb *b, const char *what, const model_quantizer *mq,
                                  model_tensor x, op_group group, bool rowwise, bool colwise,
                                  uint32_t values, model_qstore *s) {
    char prefix[ARENA_NAME_MAX];
    snprintf(prefix, sizeof prefix, "%s.%s", model_mode_name(b->mode), what);
    model_place pl = {b->m->dev, prefix, false, ARENA_CAT_ACTIVATIONS,
                      prog_ref_present(x.amax) ? NULL : &b->amax_slots};
    bool convert = mq->q.format == QT_FORMAT_BF16 && x.dtype != QT_DTYPE_BF16;
    return model_qstore_reserve(&pl, mq, x.rows, x.cols, group.count, rowwise, colwise, values,
                                convert, s);
}

// MXFP8 copies that only BF16 GEMMs read (model_gemm_path MIXED: model.c's
// model_emulated_copies, or a second operand of another format) are stored as the codes' BF16
// values: the quantize writes what the dequantize before each such GEMM would, so the codes are
// never stored and that pass is gone (2 bytes an element less traffic, a launch less). Dense
// tensors of one pass only: an input's rowwise copy (fprop), a gradient's two (dgrad, wgrad) and
// a weight's per-step columnwise copy (dgrad). The input's columnwise copy waits from the
// forward to the wgrad, so it stays in codes (half the bytes held across the step).
static bool mb_values(const model_quantizer *mq, const model_linear *lin, model_gemm g) {
    return mq->q.format == QT_FORMAT_MXFP8 && lin->members == 0 &&
           lin->path[g] == MODEL_GEMM_MIXED;
}

// The same for NVFP4: a dense layer's BF16 input x (fprop) and its gradient (dgrad, wgrad),
// where the GEMM runs on the raw decodes of two NVFP4 operands (mb_gemm_nvfp4_copies: the
// partner, the weight or the input, is NVFP4 too; against another format the copy would carry
// the global factor). The cast writes what qt_nvfp4_decode would (QT_NVFP4_ROW_VALUES,
// _COL_VALUES): the fast BF16 kernels' whole blocks, so no 2-D and both dimensions multiples of 16.
static bool mb_values_nvfp4(const mb *b, const model_quantizer *mq, const model_linear *lin,
                            model_gemm g, model_tensor x) {
    const model_quantizer *partner =
        &b->m->quantizers[g == MODEL_WGRAD ? lin->q_input : lin->q_weight];
    return mq->q.format == QT_FORMAT_NVFP4 && partner->q.format == QT_FORMAT_NVFP4 &&
           lin->members == 0 && lin->path[g] == MODEL_GEMM_MIXED && !mq->q.two_d &&
           x.dtype == QT_DTYPE_BF16 && x.rows % 16 == 0 && x.cols % 16 == 0;
}

// The copies of x that the cast of x writes as values (MODEL_QSTORE_*_VALUES): the rowwise one
// for `row_gemm`, the columnwise one for `col_gemm` (MODEL_GEMM_COUNT: none).
static uint32_t mb_values_of(const mb *b, const model_quantizer *mq, const model_linear *lin,
                             model_tensor x, model_gemm row_gemm, model_gemm col_gemm) {
    uint32_t values = 0;
    if (row_gemm != MODEL_GEMM_COUNT &&
        (mb_values(mq, lin, row_gemm) || mb_values_nvfp4(b, mq, lin, row_gemm, x))) {
        values |= MODEL_QSTORE_ROW_VALUES;
    }
    if (col_gemm != MODEL_GEMM_COUNT &&
        (mb_values(mq, lin, col_gemm) || mb_values_nvfp4(b, mq, lin, col_gemm, x))) {
        values |= MODEL_QSTORE_COL_VALUES;
    }
    return values;
}

// The copies of a linear's input x that its cast stores as values: the rowwise one, for fprop
// (the columnwise one waits for the wgrad in codes). The same whether the linear's own cast or
// the activation before it (mb_act_cast_forward) writes them.
static uint32_t mb_input_values(const mb *b, const model_linear *lin, model_tensor x) {
    return mb_values_of(b, &b->m->quantizers[lin->q_input], lin, x, MODEL_FPROP,
                        MODEL_GEMM_COUNT);
}

// The copies of the gradient dy at a linear's output that its cast stores as values: the
// rowwise one for dgrad, the columnwise one for wgrad (mb_linear_backward's cast, or the
// activation's, mb_act_cast_backward).
static uint32_t mb_grad_values(const mb *b, const model_linear *lin, model_tensor dy) {
    return mb_values_of(b, &b->m->quantizers[lin->q_grad], lin, dy, MODEL_DGRAD, MODEL_WGRAD);
}

static qt_status mb_quantize_values(mb *b, const char *what, const model_quantizer *mq,
                                    model_tensor x, op_group group, bool rowwise, bool colwise,
                                    uint32_t values, bool record_amax, model_qstore *s) {
    QT_TRY(mb_qstore_values(b, what, mq, x, group, rowwise, colwise, values, s));
    switch (mq->q.format) {
    case QT_FORMAT_BF16:
        if (!prog_ref_present(s->bf16.ref)) {  // x is BF16 already (nothing reserved)
            s->bf16 = x;
            return QT_OK;
        }
        // The residual kernel without its second operand is a converting copy.
        return op_residual_backward(b->p, what, (uint64_t)x.rows * x.cols, mb_act(x),
                                    mb_act(s->bf16), false);
    case QT_FORMAT_FP8_E4M3:
    case QT_FORMAT_FP8_E5M2:
        return mb_quantize_fp8(b, what, mq, x, group, record_amax, s);
    case QT_FORMAT_MXFP8: {
        op_mxfp8_quantize_desc d = mb_mxfp8_desc(mq, x, s);
        d.group = group;
        return op_mxfp8_quantize(b->p, what, &d);
    }
    case QT_FORMAT_FP8_BLOCK_1D:
    case QT_FORMAT_FP8_BLOCK_2D: {
        op_block_tensor t = mb_block_tensor(mq, x.rows, x.cols, s);
        t.group = group;
        op_block_options o = {!mq->q.pow2, mq->q.amax_eps};
        return op_quant_block(b->p, what, x.ref, x.dtype, &t, &o);
    }
    case QT_FORMAT_NVFP4: {
        op_nvfp4_input in = {x.ref, x.dtype, x.rows, x.cols, group};
        bool rht = s->colwise && mq->rht;
        if (prog_ref_present(x.amax)) {
            // The producer took max |x|, both directions' global amax without RHT
            // (mb_producer_serves); the GEMMs read it from the store.
            QT_ASSERT(!rht && group.count == 0);
            s->amax_row = s->amax_col = x.amax;
        } else {
            op_nvfp4_amax_out amax = {s->amax_row, rht ? s->amax_col : OP_REF_NONE, rht,
                                      QT_NVFP4_RHT_SIGNS_TE};
            QT_TRY(op_nvfp4_amax_merge(b->p, what, &in, &amax));
        }
        op_nvfp4_quant q = mb_nvfp4_quant(b, mq, s);
        return op_nvfp4_quantize(b->p, what, &in, &q);
    }
    case QT_FORMAT_COUNT: break;
    }
    QT_ASSERT(!"unknown format");
    return QT_ERR_INPUT;
}

static qt_status mb_quantize(mb *b, const char *what, const model_quantizer *mq, model_tensor x,
                             op_group group, bool rowwise, bool colwise, bool record_amax,
                             model_qstore *s) {
    return mb_quantize_values(b, what, mq, x, group, rowwise, colwise, 0, record_amax, s);
}

// ---------------------------------------------------------------------------------------------
// GEMMs

// One GEMM operand: a quantized tensor of logical shape rows x cols, read through one copy.
// A stacked expert weight (stacked = its members) is `stacked` such tensors back to back, one per
// member of an M-grouped GEMM; a grouped tensor (an moe layer's permuted rows, rows = its
// capacity) and a stacked weight carry their members in `group` (per-member scales).
typedef struct mb_operand {
    const model_quantizer *mq;
    const model_qstore *s;
    uint32_t rows, cols;
    bool colwise;
    uint32_t stacked;
    op_group group;
} mb_operand;

static mb_operand mb_dense(const model_quantizer *mq, const model_qstore *s, uint32_t rows,
                           uint32_t cols, bool colwise) {
    mb_operand o = {mq, s, rows, cols, colwise, 0, op_group_dense()};
    return o;
}

static uint32_t mb_stored_rows(const mb_operand *o) {
    return o->rows * (o->stacked ? o->stacked : 1u);
}

// Grouped and stacked operands' per-tensor factors (fp8 scale_inv, nvfp4 amax) are per member.
static void mb_operand_per_member(op_gemm_operand *op, const mb_operand *o) {
    if (o->group.count > 0 && prog_ref_present(op->tensor_scale)) {
        op->flags |= GEMM_OPERAND_TENSOR_PER_MEMBER;
    }
}

static op_gemm_operand mb_gemm_operand(const mb_operand *o) {
    const qt_quantizer *q = &o->mq->q;
    uint32_t f = model_gemm_format_of(q->format);
    const model_qstore *s = o->s;
    uint32_t rows = mb_stored_rows(o);
    op_gemm_operand op;
    if (f == GEMM_FORMAT_BF16) {
        op = op_gemm_operand_of(f, GEMM_ELEM_BF16, rows, o->cols, o->colwise, false, s->bf16.ref,
                                OP_REF_NONE, OP_REF_NONE);
    } else {
        QT_ASSERT(o->colwise ? s->colwise : s->rowwise);
        QT_ASSERT(!(o->colwise ? s->col_values : s->row_values));  // BF16 GEMMs only
        prog_ref data = o->colwise ? s->col_data : s->row_data;
        prog_ref scale = o->colwise ? s->col_scale : s->row_scale;
        prog_ref tensor_scale = OP_REF_NONE;
        if (f == GEMM_FORMAT_FP8) {
            scale = OP_REF_NONE;
            tensor_scale = s->scale_inv;
        } else if (f == GEMM_FORMAT_NVFP4) {
            tensor_scale = o->colwise ? s->amax_col : s->amax_row;
        }
        bool scale_2d = f == GEMM_FORMAT_FP8_BLOCK && q->two_d;
        op = op_gemm_operand_of(f, model_gemm_elem_of(q->elem), rows, o->cols, o->colwise,
                                scale_2d, data, scale, tensor_scale);
    }
    if (o->stacked) op_gemm_operand_stack(&op, f, q->two_d, o->colwise, o->rows, o->cols);
    mb_operand_per_member(&op, o);
    return op;
}

// The operand's values as a BF16 [stored rows][cols] tensor (for a mixed-format GEMM); a grouped
// tensor's rows past its active end are not written.
static qt_status mb_dequantize(mb *b, const char *what, const mb_operand *o,
                               model_tensor *out) {
    const qt_quantizer *q = &o->mq->q;
    const model_qstore *s = o->s;
    if (q->format == QT_FORMAT_BF16) {
        *out = s->bf16;
        return QT_OK;
    }
    uint32_t rows = mb_stored_rows(o);
    if (o->colwise ? s->col_values : s->row_values) {  // MXFP8: the quantize made the copy
        QT_ASSERT(o->group.count == 0 && !o->stacked);
        *out = (model_tensor){o->colwise ? s->col_data : s->row_data, QT_DTYPE_BF16, rows,
                              o->cols, OP_REF_NONE};
        return QT_OK;
    }
    QT_TRY(mb_tensor(b, what, rows, o->cols, ARENA_CAT_WORKSPACE, out));
    const char *name = what;
    switch (q->format) {
    case QT_FORMAT_FP8_E4M3:
    case QT_FORMAT_FP8_E5M2: {
        op_fp8_input hp = {out->ref, QT_DTYPE_BF16, rows, o->cols, o->group};
        op_fp8_output codes = {model_fp8_code(q->elem), s->row_data, s->col_data, s->scale_inv};
        if (!s->rowwise) codes.rowwise = OP_FP8_NONE;
        if (!s->colwise) codes.colwise = OP_FP8_NONE;
        return op_fp8_dequantize(b->p, name, &hp, &codes, o->colwise);
    }
    case QT_FORMAT_MXFP8: {
        op_mxfp8_dequantize_desc d = {0};
        d.src = o->colwise ? (op_mxfp8_dir){s->col_data, s->col_scale}
                           : (op_mxfp8_dir){s->row_data, s->row_scale};
        d.colwise = o->colwise;
        d.elem = q->elem;
        d.rows = rows;
        d.cols = o->cols;
        d.out = out->ref;
        d.dtype = QT_DTYPE_BF16;
        d.group = o->group;
        return op_mxfp8_dequantize(b->p, name, &d);
    }
    case QT_FORMAT_FP8_BLOCK_1D:
    case QT_FORMAT_FP8_BLOCK_2D: {
        op_block_tensor t = mb_block_tensor(o->mq, rows, o->cols, s);
        t.group = o->group;
        return op_dequant_block(b->p, name, &t, o->colwise, out->ref, QT_DTYPE_BF16);
    }
    case QT_FORMAT_NVFP4: {
        op_nvfp4_dequant d = {0};
        d.rows = rows;
        d.cols = o->cols;
        d.group = o->group;
        d.colwise = o->colwise;
        d.data = o->colwise ? s->col_data : s->row_data;
        d.scales = o->colwise ? s->col_scale : s->row_scale;
        d.amax = o->colwise ? s->amax_col : s->amax_row;
        d.out = out->ref;
        d.out_dtype = QT_DTYPE_BF16;
        return op_nvfp4_dequantize(b->p, name, &d);
    }
    case QT_FORMAT_BF16:  // the tensor itself, above
    case QT_FORMAT_COUNT: break;
    }
    QT_ASSERT(!"unknown format");
    return QT_ERR_INPUT;
}

// One NVFP4 operand as its stored copy decoded to BF16 in the copy's own orientation (rowwise
// [rows][cols], columnwise [cols][rows]: both K-major), without the global factor, and the
// operand of the BF16 GEMM that reads it, which carries the global amax for the GEMM's alpha.
static qt_status mb_nvfp4_decoded(mb *b, const char *what, const mb_operand *o,
                                  op_gemm_operand *out) {
    const model_qstore *s = o->s;
    uint32_t rows = o->colwise ? o->cols : mb_stored_rows(o);
    uint32_t k = o->colwise ? mb_stored_rows(o) : o->cols;
    model_tensor t;
    if (o->colwise ? s->col_values : s->row_values) {  // the cast wrote them (mb_values_nvfp4)
        QT_ASSERT(o->group.count == 0 && !o->stacked);
        t = (model_tensor){o->colwise ? s->col_data : s->row_data, QT_DTYPE_BF16, rows, k,
                           OP_REF_NONE};
    } else {
        QT_TRY(mb_tensor(b, what, rows, k, ARENA_CAT_WORKSPACE, &t));
        QT_TRY(op_nvfp4_decode(b->p, what, o->colwise ? s->col_data : s->row_data,
                               o->colwise ? s->col_scale : s->row_scale, t.ref, rows, k));
    }
    *out = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, rows, k, false, false, t.ref,
                              OP_REF_NONE, o->colwise ? s->amax_col : s->amax_row);
    if (o->stacked) {
        // A member's n rows of the rowwise decode, or its n columns of the columnwise one.
        out->data_member_bytes = o->colwise ? 2ull * o->rows : 2ull * o->rows * o->cols;
    }
    mb_operand_per_member(out, o);
    return QT_OK;
}

static uint32_t mb_act_kind(recipe_layer_kind k) {
    switch (k) {
    case RECIPE_LAYER_RELU: return QT_ACT_RELU;
    case RECIPE_LAYER_GELU: return QT_ACT_GELU;
    case RECIPE_LAYER_SILU: return QT_ACT_SILU;
    case RECIPE_LAYER_SWIGLU: return QT_ACT_SWIGLU;
    case RECIPE_LAYER_LINEAR:
    case RECIPE_LAYER_RMSNORM:
    case RECIPE_LAYER_RESIDUAL_BEGIN:
    case RECIPE_LAYER_RESIDUAL_END:
    case RECIPE_LAYER_MOE:
    case RECIPE_LAYER_KIND_COUNT: break;  // not activations
    }
    QT_ASSERT(!"not an activation");
    return 0;
}

// The quantizer that casts next the tensor entering layer j (forward: as its input; backward:
// as the gradient at its output), past residual markers that hand the tensor on unchanged: the
// input quantizer of a linear, or the gradient quantizer of one; NULL when another layer takes
// it first, or none does (past the end, or below the first layer with parameters backward).
static const model_quantizer *mb_next_cast(const mb *b, int64_t j, bool backward) {
    const model *m = b->m;
    const recipe_model *rm = &m->recipe->model;
    recipe_layer_kind pass = backward ? RECIPE_LAYER_RESIDUAL_END : RECIPE_LAYER_RESIDUAL_BEGIN;
    for (;; j += backward ? -1 : 1) {
        if (backward ? j < (int64_t)m->first_param_layer : j >= (int64_t)rm->layers_count) {
            return NULL;
        }
        if (rm->layers[j].kind != pass) break;
    }
    if (rm->layers[j].kind != RECIPE_LAYER_LINEAR) return NULL;
    const model_linear *lin = &m->linears[m->layer_linear[j]];
    return &m->quantizers[backward ? lin->q_grad : lin->q_input];
}

// Whether cast q (NULL: none) is of a scheme whose amax a producer may take (current scaling;
// NVFP4, depending on its columnwise copy), whatever the mode.
static bool mb_cast_may_take_amax(const model_quantizer *q) {
    return q != NULL && (q->q.scheme == QT_SCHEME_CURRENT || q->q.scheme == QT_SCHEME_NVFP4);
}

// Whether the producer of the tensor entering layer j (mb_next_cast) takes the amax that the
// cast reads, as it writes the tensor, so that the cast makes no pass of its own over it: a
// per-tensor current-scaling cast, or an NVFP4 one whose global amaxes are both max |x| (no RHT
// columnwise copy, whose amax is the transform's; forward casts store that copy in training,
// for wgrad, backward ones always). Never with model.amax_passes.
static bool mb_producer_serves(const mb *b, int64_t j, bool backward) {
    if (b->m->amax_passes) return false;
    const model_quantizer *q = mb_next_cast(b, j, backward);
    if (!mb_cast_may_take_amax(q)) return false;
    if (q->q.scheme == QT_SCHEME_CURRENT) return true;
    bool colwise = backward || b->train;
    return !(colwise && q->rht);
}

// A 4-byte slot "<mode>.<what>.<part>" among the step's amax slots (model_amax_slots): +0 when
// the step begins.
static qt_status mb_step_slot(mb *b, const char *what, const char *part, prog_ref *slot) {
    char prefix[ARENA_NAME_MAX];
    snprintf(prefix, sizeof prefix, "%s.%s", model_mode_name(b->mode), what);
    model_place pl = {b->m->dev, prefix, false, ARENA_CAT_WORKSPACE, &b->amax_slots};
    return model_amax(&pl, part, 4, ARENA_CAT_WORKSPACE, slot);
}

// The amax slot "<mode>.<what>.amax" of the tensor that layer i produces (forward: its output;
// backward: its input's gradient; i = the layer count backward: the loss gradient), when its
// producer serves the cast that reads it next (mb_producer_serves): a slot of the step, zeroed
// by its first op before the producer merges into it; absent otherwise.
static qt_status mb_producer_amax(mb *b, uint32_t i, bool backward, const char *what,
                                  prog_ref *amax) {
    *amax = OP_REF_NONE;
    if (!mb_producer_serves(b, backward ? (int64_t)i - 1 : (int64_t)i + 1, backward)) {
        return QT_OK;
    }
    return mb_step_slot(b, what, "amax", amax);
}

// The activation layer that reads a GEMM's D, built with it (op_gemm_act, which fuses it with
// a split GEMM's reduction): a linear's fprop followed by its activation, or the dgrad of a
// linear whose input an activation made.
typedef struct mb_then_act {
    uint32_t layer;     // the activation's layer
    bool backward;      // D is the gradient at its output (out = its input's gradient), which
                        // reads the activation's saved input b->acts[layer]
    model_tensor *out;  // its output (y) or input's gradient (dx), made by mb_gemm_act
} mb_then_act;

// The activation's tensor "<layer>.y" or "<layer>.dx" (with the amax of a current-scaling cast
// that reads it next, mb_producer_amax) and the GEMM with the activation after it. Backward, dx
// is written over D in place (act_args.out): D, the gradient at the activation's output, has
// no other reader, and a second tensor of its size would live beside it at the peak of a large
// model's train program (the end of its backward pass).
static qt_status mb_gemm_act(mb *b, const char *what, const op_gemm_desc *g,
                             const mb_then_act *then) {
    char buf[24], name[ARENA_NAME_MAX];
    snprintf(name, sizeof name, "%s.%s", mb_layer_name(b, then->layer, buf, sizeof buf),
             then->backward ? "dx" : "y");
    if (then->backward) {
        QT_ASSERT(g->d_dtype == QT_DTYPE_BF16 && g->ldd == 0);
        *then->out = (model_tensor){g->d, g->d_dtype, g->m, g->n, OP_REF_NONE};
    } else {
        QT_TRY(mb_tensor(b, name, g->m, g->n, ARENA_CAT_ACTIVATIONS, then->out));
    }
    QT_TRY(mb_producer_amax(b, then->layer, then->backward, name, &then->out->amax));
    model_tensor x = b->acts[then->layer];
    QT_ASSERT(!then->backward || (x.rows == g->m && x.cols == g->n));
    op_gemm_act_desc act = {.name = name,
                            .act = mb_act_kind(b->m->recipe->model.layers[then->layer].kind),
                            .backward = then->backward,
                            .x = then->backward ? mb_act(x) : OP_ACT_NONE,
                            .bias = OP_ACT_NONE,
                            .out = mb_act(*then->out),
                            .amax = then->out->amax};
    return op_gemm_act(b->p, what, g, &act);
}

// Appends the GEMM, split along k where its shape leaves most SMs idle (op_gemm_split_parts),
// with the parts' workspace a region of this program ("<what>.split"); then the activation
// `then` when there is one (else NULL).
static qt_status mb_op_gemm(mb *b, const char *what, op_gemm_desc *g, const mb_then_act *then) {
    g->split_parts = op_gemm_split_parts(g, OP_GEMM_SPLIT_SMS);
    if (g->split_parts > 1) {
        char part[ARENA_NAME_MAX];
        snprintf(part, sizeof part, "%s.split", what);
        QT_TRY(mb_region(b, part, op_gemm_workspace_bytes(g, g->split_parts),
                         ARENA_CAT_WORKSPACE, &g->workspace));
    }
    return then ? mb_gemm_act(b, what, g, then) : op_gemm(b->p, what, g);
}

// An NVFP4 x NVFP4 GEMM through BF16 copies (model.c, model_emulated_copies): the raw decodes
// and NVFP4's alpha (GEMM_FLAG_ALPHA_NVFP4) give the NVFP4 kernels' bits.
static qt_status mb_gemm_nvfp4_copies(mb *b, const char *what, op_gemm_desc *g,
                                      const mb_operand *a, const mb_operand *bo,
                                      const mb_then_act *then) {
    char part[ARENA_NAME_MAX];
    snprintf(part, sizeof part, "%s.a_bf16", what);
    QT_TRY(mb_nvfp4_decoded(b, part, a, &g->a));
    snprintf(part, sizeof part, "%s.b_bf16", what);
    QT_TRY(mb_nvfp4_decoded(b, part, bo, &g->b));
    g->format = GEMM_FORMAT_BF16;
    g->flags = GEMM_FLAG_ALPHA_NVFP4;
    return mb_op_gemm(b, what, g, then);
}

// A BF16 operand over a dequantized copy (mb_dequantize's layout).
static op_gemm_operand mb_bf16_operand(const mb_operand *o, model_tensor t) {
    op_gemm_operand op = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, mb_stored_rows(o),
                                            o->cols, o->colwise, false, t.ref, OP_REF_NONE,
                                            OP_REF_NONE);
    if (o->stacked) op_gemm_operand_stack(&op, GEMM_FORMAT_BF16, false, o->colwise, o->rows,
                                         o->cols);
    return op;
}

// D [m][n] = A (m x k) B (n x k)^T (+ bias). A's rows are D's rows: a->colwise reads the
// transposed view. path MIXED: both operands through BF16 copies. grouping GEMM_GROUP_M: A is
// grouped by `group` and B a stacked weight (D has A's rows); GEMM_GROUP_K: both are grouped by
// `group` along the contraction and D is one [m][n] per member, back to back. d_max: D's maximum
// slot (op_gemm_desc.d_max) or OP_REF_NONE. then: the activation that reads D, built with the
// GEMM (dense only), or NULL.
static qt_status mb_gemm(mb *b, const char *what, model_gemm kind, const model_linear *lin,
                         const mb_operand *a, const mb_operand *bo, model_tensor d,
                         prog_ref bias, prog_ref d_max, uint32_t grouping, op_group group,
                         const mb_then_act *then) {
    op_gemm_desc g = {0};
    g.grouping = grouping;
    g.alpha = 1.0f;
    g.m = a->colwise ? a->cols : a->rows;
    g.n = bo->colwise ? bo->cols : bo->rows;
    g.k = a->colwise ? a->rows : a->cols;
    g.d = d.ref;
    g.d_dtype = d.dtype;
    g.d_max = d_max;
    g.bias = bias;
    g.bias_dtype = QT_DTYPE_F32;
    QT_ASSERT(d.rows == g.m && d.cols == g.n);
    QT_ASSERT((grouping == GEMM_DENSE) == (group.count == 0));
    QT_ASSERT(then == NULL || grouping == GEMM_DENSE);
    if (grouping != GEMM_DENSE) {
        g.count = group.count;
        g.row_offsets = group.row_offsets;
        g.first_dims = group.first_dims;
    }
    if (kind == MODEL_WGRAD && grouping != GEMM_GROUP_M && b->norm_units[lin->weight]) {
        // The gradient's norm units with it (mb_grad_list); a stacked weight's from each
        // member's D (K-grouped).
        uint32_t members = grouping == GEMM_GROUP_K ? group.count : 1u;
        QT_ASSERT(g.m * members == b->m->params[lin->weight].rows &&
                  g.n == b->m->params[lin->weight].cols);
        g.norm_units = b->norm_srcs[lin->weight];
    }
    const char *name = what;
    if (lin->path[kind] == MODEL_GEMM_NATIVE) {
        g.format = model_gemm_format_of(a->mq->q.format);
        g.a = mb_gemm_operand(a);
        g.b = mb_gemm_operand(bo);
        // TE's per-tensor FP8 defaults: fast accumulation in fprop only, grouped or not (so one
        // expert computes what the dense layers would, bit for bit).
        if (g.format == GEMM_FORMAT_FP8 && kind != MODEL_FPROP) {
            g.flags = GEMM_FLAG_SPLIT_ACCUMULATE;
        }
        return mb_op_gemm(b, name, &g, then);
    }
    if (a->mq->q.format == QT_FORMAT_NVFP4 && bo->mq->q.format == QT_FORMAT_NVFP4) {
        return mb_gemm_nvfp4_copies(b, what, &g, a, bo, then);
    }
    char part[ARENA_NAME_MAX];
    model_tensor ta, tb;
    snprintf(part, sizeof part, "%s.a_bf16", what);
    QT_TRY(mb_dequantize(b, part, a, &ta));
    snprintf(part, sizeof part, "%s.b_bf16", what);
    QT_TRY(mb_dequantize(b, part, bo, &tb));
    g.format = GEMM_FORMAT_BF16;
    g.a = mb_bf16_operand(a, ta);
    g.b = mb_bf16_operand(bo, tb);
    return mb_op_gemm(b, name, &g, then);
}

// ---------------------------------------------------------------------------------------------
// Activations whose output only a cast reads (ptx/quant_fp8.h, fp8_act_cast_args): which ones.
// The ops come after the forward and backward passes of a linear (mb_act_cast).

static bool mb_linear(const mb *b, uint32_t i) {
    return b->m->recipe->model.layers[i].kind == RECIPE_LAYER_LINEAR;
}

// Smaller activations keep their stored output: a block's table (4096 exact evaluations) is
// repaid by large tensors only, and a small step's split GEMMs take their activation along in
// their reduction (op_gemm_act) at no launch of its own.
#define MB_ACT_CAST_ELEMS_MIN (1ull << 21)

// Whether activation layer `act`, between two linears, hands its output (forward: to the input
// cast of linear act + 1) or its input's gradient (backward: to the gradient cast of linear
// act - 1) to that cast without storing it, the cast reading the activation's own inputs
// instead (mb_act_cast_forward, mb_act_cast_backward). The cast must be a per-tensor FP8 one:
// forward with delayed or current scaling (current reads x once more for y's amax first, which
// still saves a pass, y's store and its read), backward with delayed scaling only (with current
// scaling the amax pass would read dy and x both: as many bytes as the stored dx); or FP8 block
// scaling with 1x128 blocks, or MXFP8 with 1 x 32 blocks (not 2-D), both ways (their scales are
// local to a tile, so no pass before). The stored tensor must have no other reader: no recompute
// (which re-makes y in BF16), and backward no bias gradient below (which sums the BF16 dx).
static bool mb_act_casts(const mb *b, uint32_t act, bool backward) {
    const model *m = b->m;
    const recipe_model *rm = &m->recipe->model;
    // act - 1 and act + 1 exist: 1 <= act <= layers_count - 2 (a model has a layer; a caller's
    // act may be layer 0's "layer - 1", wrapped around to UINT32_MAX, which this also refuses).
    if (act == 0 || act >= rm->layers_count - 1) return false;
    recipe_layer_kind kind = rm->layers[act].kind;
    if (m->amax_passes || m->act_cast_elems == UINT64_MAX) return false;
    if (kind != RECIPE_LAYER_GELU && kind != RECIPE_LAYER_SILU) return false;
    if (m->recompute[act]) return false;
    if (!mb_linear(b, act - 1) || !mb_linear(b, act + 1)) return false;
    const model_linear *below = &m->linears[m->layer_linear[act - 1]];
    const model_linear *above = &m->linears[m->layer_linear[act + 1]];
    const model_quantizer *q = backward ? &m->quantizers[below->q_grad]
                                        : &m->quantizers[above->q_input];
    bool fp8 = q->q.format == QT_FORMAT_FP8_E4M3 || q->q.format == QT_FORMAT_FP8_E5M2;
    bool scheme = q->q.scheme == QT_SCHEME_DELAYED ||
                  (!backward && q->q.scheme == QT_SCHEME_CURRENT);
    bool local = q->q.format == QT_FORMAT_FP8_BLOCK_1D ||
                 (q->q.format == QT_FORMAT_MXFP8 && !q->q.two_d);
    if (!((fp8 && scheme) || local) || above->in_padded != below->out || below->out % 8 != 0) {
        return false;
    }
    if (backward && below->bias) return false;
    uint64_t min = m->act_cast_elems ? m->act_cast_elems : MB_ACT_CAST_ELEMS_MIN;
    return (uint64_t)m->batch * below->out >= min;
}

// Whether activation layer `act`, whose output goes to its cast unstored (mb_act_casts,
// forward), takes that output's amax from the maximum of its input, which the GEMM before it
// gives (ptx/gemm.h, gemm_args.d_max; ptx/act_math.h, qt_act_amax_from_max): where the cast is a
// current-scaling one, which needs the amax before it.
static bool mb_act_amax_from_max(const mb *b, uint32_t act) {
    const model *m = b->m;
    QT_ASSERT(mb_act_casts(b, act, false));
    const model_linear *above = &m->linears[m->layer_linear[act + 1]];
    return m->quantizers[above->q_input].q.scheme == QT_SCHEME_CURRENT;
}

// ---------------------------------------------------------------------------------------------
// Forward

static const model_qstore *mb_weight(const mb *b, const model_linear *lin) {
    return &b->m->params[lin->weight].weight;
}

static prog_ref mb_bias(const mb *b, const model_linear *lin) {
    if (!lin->bias) return OP_REF_NONE;
    return mb_dev(b, b->m->params[lin->bias_param].master);
}

// y: the linear's output; then: the activation that reads it, or NULL; y_max: NULL, or where the
// maximum slot of y goes, which the fprop fills (mb_act_amax_from_max).
static qt_status mb_linear_forward(mb *b, uint32_t layer, model_tensor x, model_tensor *y,
                                   const mb_then_act *then, prog_ref *y_max) {
    model *m = b->m;
    uint32_t li = m->layer_linear[layer];
    const model_linear *lin = &m->linears[li];
    const char *name = m->recipe->model.layers[layer].name;
    QT_ASSERT(x.cols == lin->in_padded);
    char what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.x", name);
    // Training also keeps the columnwise copy for wgrad. The activation before may have made
    // both already, its cast reading its input (mb_act_cast_forward).
    if (!mb_act_casts(b, layer - 1, false)) {
        const model_quantizer *qi = &m->quantizers[lin->q_input];
        uint32_t values = mb_input_values(b, lin, x);
        QT_TRY(mb_quantize_values(b, what, qi, x, op_group_dense(), true, b->train, values,
                                  b->train, &b->xq[li]));
    }
    snprintf(what, sizeof what, "%s.y", name);
    QT_TRY(mb_tensor(b, what, x.rows, lin->out, ARENA_CAT_ACTIVATIONS, y));
    prog_ref d_max = OP_REF_NONE;  // y's maximum slot "<mode>.<name>.y.max", where asked for
    if (y_max) {
        QT_TRY(mb_step_slot(b, what, "max", &d_max));
        *y_max = d_max;
    }
    mb_operand a = mb_dense(&m->quantizers[lin->q_input], &b->xq[li], x.rows, lin->in_padded,
                            false);
    mb_operand w = mb_dense(&m->quantizers[lin->q_weight], mb_weight(b, lin), lin->out,
                            lin->in_padded, false);
    snprintf(what, sizeof what, "%s.fprop", name);
    return mb_gemm(b, what, MODEL_FPROP, lin, &a, &w, *y, mb_bias(b, lin), d_max, GEMM_DENSE,
                   op_group_dense(), then);
}

// ---------------------------------------------------------------------------------------------
// Mixture of experts (ptx/moe.h draws the routing, model.h's model_moe the plan)

static mb_moe *mb_moe_state(mb *b, uint32_t layer) { return &b->moes[b->m->layer_moe[layer]]; }

// One of the layer's permuted tensors (rows: the capacity, members: the experts).
static mb_operand mb_grouped(const model_quantizer *mq, const model_qstore *s, const mb_moe *st,
                             uint32_t cols, bool colwise) {
    mb_operand o = {mq, s, st->routing.capacity, cols, colwise, 0, st->routing.group};
    return o;
}

// A stacked expert weight, read rowwise (fprop) or columnwise (dgrad).
static mb_operand mb_stacked(const mb *b, const model_linear *lin, bool colwise) {
    const model_param *w = &b->m->params[lin->weight];
    op_group g = {lin->members, mb_dev(b, w->group_offsets), mb_dev(b, w->group_dims)};
    mb_operand o = {&b->m->quantizers[lin->q_weight], &w->weight, lin->out, lin->in_padded,
                    colwise, lin->members, g};
    return o;
}

// The region "<mode>.<layer>.<part>" of a u32 or f32 array.
static qt_status mb_moe_array(mb *b, const char *name, const char *part, uint64_t count,
                              arena_category cat, prog_ref *out) {
    char what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.%s", name, part);
    return mb_region(b, what, count * 4, cat, out);
}

// The layer's per-member amax slots (op_moe_routing.amax, which its scan zeroes): one for each
// grouped tensor whose producer (gather, activation, combine backward, activation backward) can
// take the amax that the tensor's cast reads next; the gradients' slots in training only.
typedef enum mb_moe_amax_slot {
    MB_MOE_AMAX_FC1_X,
    MB_MOE_AMAX_FC2_X,
    MB_MOE_AMAX_FC2_DY,
    MB_MOE_AMAX_FC1_DY,
    MB_MOE_AMAX_SLOTS
} mb_moe_amax_slot;

static bool mb_moe_amax_used(const mb *b, const model_moe *mo, mb_moe_amax_slot slot) {
    const model *m = b->m;
    if (m->amax_passes) return false;
    const model_linear *fc1 = &m->linears[mo->fc1], *fc2 = &m->linears[mo->fc2];
    if (!b->train && slot >= MB_MOE_AMAX_FC2_DY) return false;  // a gradient's
    uint32_t q = slot == MB_MOE_AMAX_FC1_X    ? fc1->q_input
                 : slot == MB_MOE_AMAX_FC2_X  ? fc2->q_input
                 : slot == MB_MOE_AMAX_FC2_DY ? fc2->q_grad
                                              : fc1->q_grad;
    return m->quantizers[q].q.scheme == QT_SCHEME_CURRENT;
}

// The amax of the slot's producer (f32 [experts]), absent when its tensor's cast is not a
// per-tensor current-scaling one.
static prog_ref mb_moe_amax(const mb *b, const model_moe *mo, const mb_moe *st,
                            mb_moe_amax_slot slot) {
    if (!mb_moe_amax_used(b, mo, slot)) return OP_REF_NONE;
    return mb_at(st->routing.amax, 4ull * slot * mo->experts);
}

// Softmax, top-k and the permutation by expert (op_moe_route_and_permute).
static qt_status mb_moe_route(mb *b, const char *name, const model_moe *mo, prog_ref logits,
                              op_moe_routing *r) {
    memset(r, 0, sizeof *r);
    r->tokens = b->m->batch;
    r->experts = mo->experts;
    r->topk = mo->topk;
    r->row_align = mo->row_align;
    r->capacity = mo->capacity;
    r->logits = logits;
    uint64_t assignments = (uint64_t)r->tokens * r->topk;
    arena_category keep = ARENA_CAT_ACTIVATIONS;
    QT_TRY(mb_moe_array(b, name, "probs", (uint64_t)r->tokens * r->experts, keep, &r->probs));
    QT_TRY(mb_moe_array(b, name, "expert", assignments, keep, &r->expert));
    QT_TRY(mb_moe_array(b, name, "gate", assignments, keep, &r->gate));
    QT_TRY(mb_moe_array(b, name, "chunk_counts",
                        (uint64_t)op_moe_chunks((uint32_t)assignments) * r->experts,
                        ARENA_CAT_WORKSPACE, &r->chunk_counts));
    QT_TRY(mb_moe_array(b, name, "chunk_base",
                        (uint64_t)op_moe_chunks((uint32_t)assignments) * r->experts,
                        ARENA_CAT_WORKSPACE, &r->chunk_base));
    QT_TRY(mb_moe_array(b, name, "row_of", assignments, keep, &r->row_of));
    QT_TRY(mb_moe_array(b, name, "assign_of", r->capacity, keep, &r->assign_of));
    r->group.count = r->experts;
    QT_TRY(mb_moe_array(b, name, "first_dims", r->experts, keep, &r->group.first_dims));
    QT_TRY(mb_moe_array(b, name, "row_offsets", r->experts + 1ull, keep,
                        &r->group.row_offsets));
    const model *m = b->m;
    bool rht = m->quantizers[m->linears[mo->fc1].q_input].rht ||
               m->quantizers[m->linears[mo->fc2].q_input].rht;
    if (b->train && rht) {
        QT_TRY(mb_moe_array(b, name, "whole_dims", r->experts, keep, &r->whole_dims));
    }
    bool amax = false;
    for (uint32_t slot = 0; slot < MB_MOE_AMAX_SLOTS; slot++) {
        amax |= mb_moe_amax_used(b, mo, (mb_moe_amax_slot)slot);
    }
    if (amax) {
        r->amax_slots = MB_MOE_AMAX_SLOTS;
        QT_TRY(mb_moe_array(b, name, "amax", (uint64_t)r->amax_slots * r->experts,
                            ARENA_CAT_WORKSPACE, &r->amax));
    }
    return op_moe_route_and_permute(b->p, name, r);
}

// An expert GEMM's fprop: y [capacity][out] = the grouped input (quantized into xq) times each
// expert's weight.
static qt_status mb_moe_expert_fprop(mb *b, const char *name, const char *gemm, uint32_t li,
                                     const mb_moe *st, model_tensor x, model_tensor *y) {
    model *m = b->m;
    const model_linear *lin = &m->linears[li];
    char what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.%s.x", name, gemm);
    QT_TRY(mb_quantize(b, what, &m->quantizers[lin->q_input], x, st->routing.group, true,
                       b->train, b->train, &b->xq[li]));
    snprintf(what, sizeof what, "%s.%s.y", name, gemm);
    QT_TRY(mb_tensor(b, what, x.rows, lin->out, ARENA_CAT_ACTIVATIONS, y));
    mb_operand a = mb_grouped(&m->quantizers[lin->q_input], &b->xq[li], st, lin->in, false);
    mb_operand w = mb_stacked(b, lin, false);
    snprintf(what, sizeof what, "%s.%s.fprop", name, gemm);
    return mb_gemm(b, what, MODEL_FPROP, lin, &a, &w, *y, OP_REF_NONE, OP_REF_NONE, GEMM_GROUP_M,
                   st->routing.group, NULL);
}

// router -> softmax -> top-k -> permutation -> gather -> fc1 -> activation -> fc2 -> combine.
// With a skip tensor (mb_moe_residual), y is the `residual end` after the layer: the combine
// adds the skip path as it sums the choices (op_moe_combine's addend), so the layer's own output
// is never stored.
static qt_status mb_moe_forward(mb *b, uint32_t layer, model_tensor x, const model_tensor *skip,
                                model_tensor *y) {
    model *m = b->m;
    const model_moe *mo = &m->moes[m->layer_moe[layer]];
    mb_moe *st = mb_moe_state(b, layer);
    const model_linear *router = &m->linears[mo->router];
    const char *name = m->recipe->model.layers[layer].name;
    QT_ASSERT(x.cols == mo->width && x.rows == m->batch);
    char what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.router.x", name);
    QT_TRY(mb_quantize(b, what, &m->quantizers[router->q_input], x, op_group_dense(), true,
                       b->train, b->train, &b->xq[mo->router]));
    model_tensor logits;
    snprintf(what, sizeof what, "%s.logits", name);
    QT_TRY(mb_tensor_of(b, what, x.rows, mo->experts, QT_DTYPE_F32, ARENA_CAT_ACTIVATIONS,
                        &logits));
    mb_operand a = mb_dense(&m->quantizers[router->q_input], &b->xq[mo->router], x.rows,
                            mo->width, false);
    mb_operand w = mb_dense(&m->quantizers[router->q_weight],
                            &m->params[router->weight].weight, mo->experts, mo->width, false);
    snprintf(what, sizeof what, "%s.router.fprop", name);
    QT_TRY(mb_gemm(b, what, MODEL_FPROP, router, &a, &w, logits, OP_REF_NONE, OP_REF_NONE,
                   GEMM_DENSE, op_group_dense(), NULL));
    QT_TRY(mb_moe_route(b, name, mo, logits.ref, &st->routing));
    if (b->train) {
        model_moe *loads = &m->moes[m->layer_moe[layer]];
        loads->has_loads = true;
        loads->loads = st->routing.group.first_dims.region;
    }
    snprintf(what, sizeof what, "%s.xp", name);
    QT_TRY(mb_tensor_of(b, what, mo->capacity, mo->width, x.dtype, ARENA_CAT_ACTIVATIONS,
                        &st->xp));
    snprintf(what, sizeof what, "%s.gather", name);
    op_moe_tensor tx = {x.ref, x.dtype};
    st->xp.amax = mb_moe_amax(b, mo, st, MB_MOE_AMAX_FC1_X);
    QT_TRY(op_moe_gather(b->p, what, &st->routing, tx, mo->width, st->xp.ref, st->xp.amax));
    QT_TRY(mb_moe_expert_fprop(b, name, "fc1", mo->fc1, st, st->xp, &st->h));
    model_tensor act;
    snprintf(what, sizeof what, "%s.act", name);
    QT_TRY(mb_tensor(b, what, mo->capacity, mo->hidden, ARENA_CAT_ACTIVATIONS, &act));
    act.amax = mb_moe_amax(b, mo, st, MB_MOE_AMAX_FC2_X);
    QT_TRY(op_act_grouped(b->p, what, false, mb_act_kind(mo->act), mo->capacity, st->h.cols,
                          mb_act(st->h), OP_ACT_NONE, mb_act(act), &st->routing.group,
                          act.amax));
    QT_TRY(mb_moe_expert_fprop(b, name, "fc2", mo->fc2, st, act, &st->yp));
    char buf[24];
    snprintf(what, sizeof what, "%s.y",
             skip != NULL ? mb_layer_name(b, layer + 1, buf, sizeof buf) : name);
    QT_TRY(mb_tensor(b, what, x.rows, mo->width, ARENA_CAT_ACTIVATIONS, y));
    op_moe_tensor src = {st->yp.ref, st->yp.dtype}, out = {y->ref, y->dtype};
    op_moe_tensor addend = {OP_REF_NONE, QT_DTYPE_F32};
    if (skip != NULL) addend = (op_moe_tensor){skip->ref, skip->dtype};
    return op_moe_combine(b->p, what, &st->routing, mo->width, src, st->routing.gate, addend,
                          NULL, out);
}

// Whether layer i is an moe layer that ends a residual block (layer i + 1 a `residual end`)
// whose sum no cast that may take a producer amax (mb_cast_may_take_amax) reads next, as
// op_moe_combine takes none: mb_forward builds the two as one combine. The sum then
// has one rounding, of skip + sum of the choices in FP32, where the two ops rounded the layer's
// output first. The choice depends on the recipe alone (not on model.amax_passes nor on the
// mode), so that every program computes the same sums.
static bool mb_moe_residual(const mb *b, uint32_t i) {
    const recipe_model *rm = &b->m->recipe->model;
    if (rm->layers[i].kind != RECIPE_LAYER_MOE || i + 1 >= rm->layers_count ||
        rm->layers[i + 1].kind != RECIPE_LAYER_RESIDUAL_END) {
        return false;
    }
    return !mb_cast_may_take_amax(mb_next_cast(b, (int64_t)i + 2, false));
}

static qt_status mb_layer_forward(mb *b, uint32_t i, model_tensor x, model_tensor *stack,
                                  uint32_t *depth, model_tensor *y) {
    const recipe_layer *l = &b->m->recipe->model.layers[i];
    char buf[24], what[ARENA_NAME_MAX];
    const char *name = mb_layer_name(b, i, buf, sizeof buf);
    snprintf(what, sizeof what, "%s.y", name);
    uint32_t rows = x.rows;
    switch (l->kind) {
    case RECIPE_LAYER_LINEAR:
        return mb_linear_forward(b, i, x, y, NULL, NULL);
    case RECIPE_LAYER_MOE:
        return mb_moe_forward(b, i, x, NULL, y);
    case RECIPE_LAYER_RELU:
    case RECIPE_LAYER_GELU:
    case RECIPE_LAYER_SILU:
    case RECIPE_LAYER_SWIGLU:
        QT_TRY(mb_tensor(b, what, rows, l->out_features, ARENA_CAT_ACTIVATIONS, y));
        QT_TRY(mb_producer_amax(b, i, false, what, &y->amax));
        return op_act_forward(b->p, what, mb_act_kind(l->kind), rows, x.cols, mb_act(x),
                              OP_ACT_NONE, mb_act(*y), y->amax);
    case RECIPE_LAYER_RMSNORM: {
        QT_TRY(mb_tensor(b, what, rows, x.cols, ARENA_CAT_ACTIVATIONS, y));
        QT_TRY(mb_producer_amax(b, i, false, what, &y->amax));
        snprintf(what, sizeof what, "%s.inv_rms", name);
        QT_TRY(mb_region(b, what, (uint64_t)rows * 4, ARENA_CAT_ACTIVATIONS, &b->inv_rms[i]));
        op_act_tensor gamma = {mb_dev(b, b->m->params[b->m->layer_param[i]].master),
                               QT_DTYPE_F32};
        return op_rmsnorm_forward(b->p, name, rows, x.cols, l->eps, mb_act(x), gamma,
                                  mb_act(*y), b->inv_rms[i], y->amax);
    }
    case RECIPE_LAYER_RESIDUAL_BEGIN:
        QT_ASSERT(*depth < RECIPE_RESIDUAL_DEPTH_MAX);
        stack[(*depth)++] = x;
        *y = x;
        return QT_OK;
    case RECIPE_LAYER_RESIDUAL_END:
        QT_ASSERT(*depth > 0);
        QT_TRY(mb_tensor(b, what, rows, x.cols, ARENA_CAT_ACTIVATIONS, y));
        QT_TRY(mb_producer_amax(b, i, false, what, &y->amax));
        return op_residual_forward(b->p, what, (uint64_t)rows * x.cols,
                                   mb_act(stack[--(*depth)]), mb_act(x), mb_act(*y), y->amax);
    case RECIPE_LAYER_KIND_COUNT: break;
    }
    QT_ASSERT(!"unknown layer kind");
    return QT_ERR_INPUT;
}

// Whether layer i is an activation that op_gemm_act takes (ReLU, GELU, SiLU: dense, one output
// per input).
static bool mb_dense_act(const mb *b, uint32_t i) {
    recipe_layer_kind k = b->m->recipe->model.layers[i].kind;
    return k == RECIPE_LAYER_RELU || k == RECIPE_LAYER_GELU || k == RECIPE_LAYER_SILU;
}

// ---------------------------------------------------------------------------------------------
// Activations whose output only a cast reads: the ops (mb_act_casts says which)

// The ops of one activation's cast into the store s of quantizer mq (mb_quantize_fp8's bits
// for the stored tensor): delayed scaling, one; current scaling, y's amax into the store's slot
// of the step and then the cast; FP8 block scaling (1x128) and MXFP8, one (mb_quantize's bits).
static qt_status mb_act_cast(mb *b, const char *name, const model_quantizer *mq,
                             const op_fp8_act_input *in, bool record_amax, const model_qstore *s) {
    if (mq->q.format == QT_FORMAT_MXFP8) {
        model_tensor x = {in->x, QT_DTYPE_BF16, in->rows, in->cols, OP_REF_NONE};
        op_mxfp8_quantize_desc d = mb_mxfp8_desc(mq, x, s);
        return op_mxfp8_act(b->p, name, in->act, in->backward, in->dy, &d);
    }
    if (mq->q.format == QT_FORMAT_FP8_BLOCK_1D) {
        op_block_tensor t = mb_block_tensor(mq, in->rows, in->cols, s);
        op_block_options o = {!mq->q.pow2, mq->q.amax_eps};
        return op_quant_block_act(b->p, name, in->act, in->backward, in->x, in->dy, &t, &o);
    }
    op_fp8_output out = {model_fp8_code(mq->q.elem), s->row_data, s->col_data, s->scale_inv};
    if (mq->q.scheme == QT_SCHEME_DELAYED) {
        prog_ref amax = record_amax ? mb_state_amax(b, mq) : OP_FP8_NONE;
        return op_fp8_act_cast_delayed(b->p, name, in, &out, mb_state_scale(b, mq), amax);
    }
    QT_TRY(op_fp8_act_amax_merge(b->p, name, in, s->amax_row));
    return op_fp8_act_cast_current(b->p, name, in, &out, s->amax_row, mq->q.pow2,
                                   mq->q.amax_eps);
}

// x, linear act - 1's output, through activation `act` into the input copies of linear act + 1
// (b->xq, which its forward then reads as they are); x_max: x's maximum slot where the fprop
// gave one (mb_act_amax_from_max), else OP_REF_NONE; *y: the activation's output by its shape
// alone (no region: nothing reads it).
static qt_status mb_act_cast_forward(mb *b, uint32_t act, model_tensor x, prog_ref x_max,
                                     model_tensor *y) {
    const model *m = b->m;
    const recipe_layer *layers = m->recipe->model.layers;
    uint32_t li = m->layer_linear[act + 1];
    const model_quantizer *mq = &m->quantizers[m->linears[li].q_input];
    QT_ASSERT(x.dtype == QT_DTYPE_BF16);
    *y = (model_tensor){OP_REF_NONE, QT_DTYPE_BF16, x.rows, x.cols, OP_REF_NONE};
    char what[ARENA_NAME_MAX], name[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.x", layers[act + 1].name);
    uint32_t values = mb_input_values(b, &m->linears[li], *y);
    QT_TRY(mb_qstore_values(b, what, mq, *y, op_group_dense(), true, b->train, values,
                            &b->xq[li]));
    char buf[24];
    snprintf(name, sizeof name, "%s.y", mb_layer_name(b, act, buf, sizeof buf));
    op_fp8_act_input in = {mb_act_kind(layers[act].kind), false, x.ref, OP_FP8_NONE, x.rows,
                           x.cols, x_max};
    return mb_act_cast(b, name, mq, &in, b->train, &b->xq[li]);
}

// dy, the gradient at activation act's output (linear act + 1's dgrad), through the
// activation's backward pass into the gradient copies of linear act - 1 (b->dyq, which its
// backward pass then reads as they are); *dx: the activation's input gradient by its shape alone.
static qt_status mb_act_cast_backward(mb *b, uint32_t act, model_tensor dy, model_tensor *dx) {
    const model *m = b->m;
    const recipe_layer *layers = m->recipe->model.layers;
    uint32_t li = m->layer_linear[act - 1];
    const model_linear *lin = &m->linears[li];
    const model_quantizer *qg = &m->quantizers[lin->q_grad];
    model_tensor x = b->acts[act];
    QT_ASSERT(dy.dtype == QT_DTYPE_BF16 && x.dtype == QT_DTYPE_BF16);
    QT_ASSERT(dy.rows == x.rows && dy.cols == x.cols);
    *dx = (model_tensor){OP_REF_NONE, QT_DTYPE_BF16, x.rows, x.cols, OP_REF_NONE};
    char what[ARENA_NAME_MAX], name[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.dy", layers[act - 1].name);
    uint32_t values = mb_grad_values(b, lin, *dx);
    QT_TRY(mb_qstore_values(b, what, qg, *dx, op_group_dense(), lin->needs_dx, true, values,
                            &b->dyq[li]));
    char buf[24];
    snprintf(name, sizeof name, "%s.dx", mb_layer_name(b, act, buf, sizeof buf));
    op_fp8_act_input in = {mb_act_kind(layers[act].kind), true, x.ref, dy.ref, x.rows, x.cols,
                           OP_FP8_NONE};
    return mb_act_cast(b, name, qg, &in, true, &b->dyq[li]);
}

static qt_status mb_forward(mb *b) {
    const recipe_model *rm = &b->m->recipe->model;
    model_tensor stack[RECIPE_RESIDUAL_DEPTH_MAX];
    uint32_t depth = 0;
    model_tensor x = b->input;
    // A model that does not start with a linear has no padding: its input is the data's width.
    x.cols = b->m->input_stride;
    for (uint32_t i = 0; i < rm->layers_count; i++) {
        b->acts[i] = x;
        model_tensor y;
        if (mb_linear(b, i) && i + 1 < rm->layers_count && mb_act_casts(b, i + 1, false)) {
            // The activation's output goes to the next linear's cast without being stored; with
            // current scaling its amax from the fprop's maximum.
            prog_ref x_max = OP_REF_NONE;
            bool from_max = mb_act_amax_from_max(b, i + 1);
            QT_TRY(mb_linear_forward(b, i, x, &b->acts[i + 1], NULL, from_max ? &x_max : NULL));
            QT_TRY(mb_act_cast_forward(b, i + 1, b->acts[i + 1], x_max, &y));
            i++;
        } else if (mb_linear(b, i) && i + 1 < rm->layers_count && mb_dense_act(b, i + 1)) {
            // A linear and its activation together, so that a split fprop's reduction takes
            // the activation along (op_gemm_act); the activation's input is the linear's y.
            mb_then_act then = {.layer = i + 1, .backward = false, .out = &y};
            QT_TRY(mb_linear_forward(b, i, x, &b->acts[i + 1], &then, NULL));
            i++;
        } else if (mb_moe_residual(b, i)) {
            // The moe layer and the residual end after it: one combine. The residual end's
            // input, the layer's output, is never stored.
            QT_ASSERT(depth > 0);
            QT_TRY(mb_moe_forward(b, i, x, &stack[--depth], &y));
            b->acts[i + 1] = (model_tensor){0};
            i++;
        } else {
            QT_TRY(mb_layer_forward(b, i, x, stack, &depth, &y));
        }
        x = y;
    }
    QT_ASSERT(depth == 0);
    b->acts[rm->layers_count] = x;
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Loss

// The columns the ranks' loss statistics fold counts: one per row for a classification, else
// each of the model's outputs.
static uint32_t mb_stats_cols(const model *m) { return m->classification ? 1 : m->outputs; }

// Several ranks: each rank's loss over its share, then the statistics of the global batch (the
// ranks' sums in rank order) and the loss gradient scaled to the rank's part of the global mean.
static qt_status mb_loss_parallel(mb *b, prog_ref local) {
    model *m = b->m;
    if (b->train) {
        QT_TRY(op_dp_loss_share(b->p, "dp.loss_share", b->dlogits.ref, b->dlogits.dtype,
                                (uint64_t)b->dlogits.rows * b->dlogits.cols, b->rows_valid));
        // Gathered with the gradient norm (mb_optimizer): nothing in the backward pass reads
        // the global statistics, and a collective here waits for the slowest rank's loss
        // before the ops captured after it on its stream.
        b->dp_loss_local = local;
        return QT_OK;
    }
    prog_ref all;
    QT_TRY(mb_dp_gather(b, "dp.loss_stats", local, sizeof(qt_loss_stats), &all));
    return op_dp_stats_fold(b->p, "dp.loss_stats.fold", all, m->world, mb_stats_cols(m),
                            b->stats);
}

static qt_status mb_loss(mb *b) {
    model *m = b->m;
    model_tensor out = b->acts[m->recipe->model.layers_count];
    uint32_t rows = out.rows, cols = out.cols;
    QT_TRY(mb_region(b, "loss.stats", sizeof(qt_loss_stats), ARENA_CAT_STAGING, &b->stats));
    prog_ref stats = b->stats;  // several ranks: this rank's, folded into b->stats after
    if (mb_parallel(b)) {
        QT_TRY(mb_region(b, "loss.stats_rank", sizeof(qt_loss_stats), ARENA_CAT_STAGING, &stats));
    }
    op_act_tensor grad = OP_ACT_NONE;
    if (b->train) {
        QT_TRY(mb_tensor(b, "loss.dy", rows, cols, ARENA_CAT_ACTIVATIONS, &b->dlogits));
        grad = mb_act(b->dlogits);
        // Several ranks scale the gradient after the loss (op_dp_loss_share): the cast's own
        // pass then reads the scaled values. "loss#dy": a linear named "loss" has "loss.dy".
        if (!mb_parallel(b)) {
            QT_TRY(mb_producer_amax(b, m->recipe->model.layers_count, true, "loss#dy",
                                    &b->dlogits.amax));
        }
    }
    // Small losses run in one kernel that needs no workspace (0 bytes).
    uint64_t ws_bytes = m->classification ? op_xent_workspace_bytes(rows, cols)
                                          : op_mse_workspace_bytes(rows, cols);
    prog_ref ws = OP_REF_NONE;
    if (ws_bytes) QT_TRY(mb_region(b, "loss.ws", ws_bytes, ARENA_CAT_WORKSPACE, &ws));
    if (m->classification) {
        QT_TRY(op_xent(b->p, "loss", rows, cols, mb_act(out), b->targets, OP_REF_NONE, grad,
                       b->dlogits.amax, ws, stats));
    } else {
        op_act_tensor target = {b->targets, QT_DTYPE_F32};
        QT_TRY(op_mse(b->p, "loss", rows, cols, mb_act(out), target, b->rows_valid, grad,
                      b->dlogits.amax, ws, stats));
    }
    QT_ASSERT(cols == m->outputs);
    return mb_parallel(b) ? mb_loss_parallel(b, stats) : QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Backward

// The weight's columnwise copy for its dgrad: the stored one, or (MODEL_WEIGHT_T_PER_STEP) regions
// of this program that a transpose of the rowwise codes (and of FP8 block scaling's tile scales)
// fills right before the dgrad, so that their bytes are taken only from there to the dgrad. An
// MXFP8 weight's copy is cast there from the master, the tensor that the optimizer's cast read
// (no write comes between): the stored copy's bytes; as BF16 values (mb_values) when the dgrad
// runs on BF16 copies.
static qt_status mb_weight_columns(mb *b, const model_param *w, const model_quantizer *mq,
                                   const model_linear *lin, const char *name, model_qstore *out) {
    *out = w->weight;
    if (w->weight_t != MODEL_WEIGHT_T_PER_STEP) return QT_OK;
    char what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.weight_t", name);
    bool values = mb_values(mq, lin, MODEL_DGRAD);
    QT_TRY(mb_region(b, what, (uint64_t)w->rows * w->cols * (values ? 2u : 1u),
                     ARENA_CAT_WEIGHTS, &out->col_data));
    out->colwise = true;
    out->col_values = values;
    if (mq->q.format == QT_FORMAT_MXFP8) {
        char scales[ARENA_NAME_MAX];
        snprintf(scales, sizeof scales, "%s.weight_t_scale", name);
        out->col_scale = OP_REF_NONE;
        if (!values) {
            QT_TRY(mb_region(b, scales, op_mxfp8_col_scales_bytes(w->rows, w->cols),
                             ARENA_CAT_WEIGHTS, &out->col_scale));
        }
        model_tensor master = {mb_dev(b, w->master), QT_DTYPE_F32, w->rows, w->cols,
                               OP_REF_NONE};
        model_qstore columns_only = *out;
        columns_only.rowwise = false;
        op_mxfp8_quantize_desc d = mb_mxfp8_desc(mq, master, &columns_only);
        return op_mxfp8_quantize(b->p, what, &d);
    }
    op_fp8_scale_grid grid = {OP_REF_NONE, OP_REF_NONE, 0, 0};
    if (prog_ref_present(w->weight.row_scale)) {  // 128 x 128 tiles, [rows/128][cols/128]
        char scales[ARENA_NAME_MAX];
        snprintf(scales, sizeof scales, "%s.weight_t_scale", name);
        grid.rows = (uint32_t)op_block_tiles(w->rows);
        grid.cols = (uint32_t)op_block_tiles(w->cols);
        QT_TRY(mb_region(b, scales, 4ull * grid.rows * grid.cols, ARENA_CAT_WEIGHTS,
                         &out->col_scale));
        grid.scales = w->weight.row_scale;
        grid.out = out->col_scale;
    }
    return op_fp8_transpose(b->p, what, w->rows, w->cols, w->weight.row_data, out->col_data,
                            &grid);
}

// The input of linear `layer` that its wgrad reads: the forward's copy, or, after an activation
// that recomputes (model.h), its output made again here from the activation's own input. The
// op is the forward's (op_gemm_act gives the bits of op_act_forward on D), so the copy holds
// the forward's bits, and it lives from here to the wgrad that follows.
static qt_status mb_wgrad_input(mb *b, uint32_t layer, model_qstore *x) {
    uint32_t li = b->m->layer_linear[layer];
    *x = b->xq[li];
    if (layer == 0 || !b->m->recompute[layer - 1]) return QT_OK;
    const recipe_layer *act = &b->m->recipe->model.layers[layer - 1];
    model_tensor in = b->acts[layer - 1], out = b->acts[layer];
    QT_ASSERT(x->bf16.ref.region == out.ref.region && out.dtype == QT_DTYPE_BF16);
    char buf[24], what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.y_again", mb_layer_name(b, layer - 1, buf, sizeof buf));
    QT_TRY(mb_tensor(b, what, out.rows, out.cols, ARENA_CAT_ACTIVATIONS, &x->bf16));
    return op_act_forward(b->p, what, mb_act_kind(act->kind), in.rows, in.cols, mb_act(in),
                          OP_ACT_NONE, mb_act(x->bf16), OP_REF_NONE);
}

// dx: the gradient at the linear's input; then: the activation that made that input, whose
// backward pass reads dx (or NULL).
static qt_status mb_linear_backward(mb *b, uint32_t layer, model_tensor dy, model_tensor *dx,
                                    const mb_then_act *then) {
    model *m = b->m;
    uint32_t li = m->layer_linear[layer];
    const model_linear *lin = &m->linears[li];
    const char *name = m->recipe->model.layers[layer].name;
    const model_quantizer *qg = &m->quantizers[lin->q_grad];
    QT_ASSERT(then == NULL || lin->needs_dx);
    char what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.dy", name);
    model_qstore dyq = b->dyq[li];
    // dgrad reads the rowwise copy, wgrad the columnwise one; the first layer has no dgrad. The
    // activation after may have made both already (mb_act_cast_backward).
    if (!mb_act_casts(b, layer + 1, true)) {
        uint32_t values = mb_grad_values(b, lin, dy);
        QT_TRY(mb_quantize_values(b, what, qg, dy, op_group_dense(), lin->needs_dx, true, values,
                                  true, &dyq));
    } else {
        QT_ASSERT(prog_ref_present(dyq.col_data));  // the wgrad's copy, which it always makes
    }
    uint32_t rows = dy.rows;
    const model_param *w = &m->params[lin->weight];
    model_tensor dw = {mb_dev(b, w->grad), QT_DTYPE_F32, lin->out, lin->in_padded,
                       OP_REF_NONE};
    mb_operand g_col = mb_dense(qg, &dyq, rows, lin->out, true);
    model_qstore xq;
    QT_TRY(mb_wgrad_input(b, layer, &xq));
    mb_operand x_col = mb_dense(&m->quantizers[lin->q_input], &xq, rows, lin->in_padded, true);
    snprintf(what, sizeof what, "%s.wgrad", name);
    QT_TRY(mb_gemm(b, what, MODEL_WGRAD, lin, &g_col, &x_col, dw, OP_REF_NONE, OP_REF_NONE,
                   GEMM_DENSE, op_group_dense(), NULL));
    if (lin->bias) {
        snprintf(what, sizeof what, "%s.bgrad", name);
        prog_ref db = mb_dev(b, m->params[lin->bias_param].grad);
        QT_TRY(op_gemm_bias_grad(b->p, what, dy.ref, dy.dtype, rows, lin->out, lin->out, 0,
                                 OP_REF_NONE, OP_REF_NONE, db));
    }
    if (!lin->needs_dx) return QT_OK;
    snprintf(what, sizeof what, "%s.dx", name);
    QT_TRY(mb_tensor(b, what, rows, lin->in_padded, ARENA_CAT_ACTIVATIONS, dx));
    mb_operand g_row = mb_dense(qg, &dyq, rows, lin->out, false);
    model_qstore wt;
    QT_TRY(mb_weight_columns(b, w, &m->quantizers[lin->q_weight], lin, name, &wt));
    mb_operand w_col = mb_dense(&m->quantizers[lin->q_weight], &wt, lin->out, lin->in_padded,
                                true);
    snprintf(what, sizeof what, "%s.dgrad", name);
    return mb_gemm(b, what, MODEL_DGRAD, lin, &g_row, &w_col, *dx, OP_REF_NONE, OP_REF_NONE,
                   GEMM_DENSE, op_group_dense(), then);
}

// skip (NULL: none): the gradient of the skip path of the residual block that layer i begins
// (layer i - 1 is its `residual begin`). Then dx is that layer's input gradient, the sum of both
// paths, which the RMSNorm's dx kernel adds as it stores (op_rmsnorm_grads.skip), named and
// measured as the residual's (its amax serves the cast that reads it).
// The first layer with parameters computes dgamma alone: its input's gradient is the data's,
// which nothing reads (mb_backward).
static qt_status mb_rmsnorm_backward(mb *b, uint32_t i, const char *name, model_tensor dy,
                                     const model_tensor *skip, model_tensor *dx) {
    model_tensor x = b->acts[i];
    char what[ARENA_NAME_MAX], buf[24];
    bool needs_dx = i > b->m->first_param_layer;
    QT_ASSERT(needs_dx || skip == NULL);
    *dx = (model_tensor){0};
    if (needs_dx) {
        const char *owner = skip != NULL ? mb_layer_name(b, i - 1, buf, sizeof buf) : name;
        snprintf(what, sizeof what, "%s.dx", owner);
        QT_TRY(mb_tensor(b, what, x.rows, x.cols, ARENA_CAT_ACTIVATIONS, dx));
        if (skip != NULL) QT_TRY(mb_producer_amax(b, i - 1, true, what, &dx->amax));
    }
    snprintf(what, sizeof what, "%s.dgamma_ws", name);
    op_rmsnorm_grads grads = {needs_dx ? mb_act(*dx) : OP_ACT_NONE,
                              mb_dev(b, b->m->params[b->m->layer_param[i]].grad), false,
                              OP_REF_NONE, skip != NULL ? mb_act(*skip) : OP_ACT_NONE,
                              dx->amax};
    QT_TRY(mb_region(b, what, op_rmsnorm_workspace_bytes(x.rows, x.cols), ARENA_CAT_WORKSPACE,
                     &grads.workspace));
    op_act_tensor gamma = {mb_dev(b, b->m->params[b->m->layer_param[i]].master), QT_DTYPE_F32};
    return op_rmsnorm_backward(b->p, name, x.rows, x.cols, mb_act(x), gamma, b->inv_rms[i],
                               mb_act(dy), &grads);
}

// An expert GEMM's gradients from dy [capacity][out]: dW (K-grouped: each expert's rows) and,
// when dx is given, dx [capacity][in] (M-grouped, each expert's columnwise weight).
static qt_status mb_moe_expert_backward(mb *b, const char *name, const char *gemm, uint32_t li,
                                        const mb_moe *st, model_tensor dy, model_tensor *dx) {
    model *m = b->m;
    const model_linear *lin = &m->linears[li];
    const model_quantizer *qg = &m->quantizers[lin->q_grad];
    char what[ARENA_NAME_MAX];
    snprintf(what, sizeof what, "%s.%s.dy", name, gemm);
    model_qstore dyq;
    QT_TRY(mb_quantize(b, what, qg, dy, st->routing.group, dx != NULL, true, true, &dyq));
    const model_param *w = &m->params[lin->weight];
    model_tensor dw = {mb_dev(b, w->grad), QT_DTYPE_F32, lin->out, lin->in_padded,
                       OP_REF_NONE};
    mb_operand g_col = mb_grouped(qg, &dyq, st, lin->out, true);
    mb_operand x_col = mb_grouped(&m->quantizers[lin->q_input], &b->xq[li], st, lin->in, true);
    // With RHT on both operands (model.c pairs them) the contraction covers whole 16-row groups,
    // where the transform cancels (op_moe_routing.whole_dims).
    op_group contraction = st->routing.group;
    if (m->quantizers[lin->q_input].rht) contraction.first_dims = st->routing.whole_dims;
    snprintf(what, sizeof what, "%s.%s.wgrad", name, gemm);
    QT_TRY(mb_gemm(b, what, MODEL_WGRAD, lin, &g_col, &x_col, dw, OP_REF_NONE, OP_REF_NONE,
                   GEMM_GROUP_K, contraction, NULL));
    if (dx == NULL) return QT_OK;
    snprintf(what, sizeof what, "%s.%s.dx", name, gemm);
    QT_TRY(mb_tensor(b, what, dy.rows, lin->in, ARENA_CAT_ACTIVATIONS, dx));
    mb_operand g_row = mb_grouped(qg, &dyq, st, lin->out, false);
    mb_operand w_col = mb_stacked(b, lin, true);
    snprintf(what, sizeof what, "%s.%s.dgrad", name, gemm);
    return mb_gemm(b, what, MODEL_DGRAD, lin, &g_row, &w_col, *dx, OP_REF_NONE, OP_REF_NONE,
                   GEMM_GROUP_M, st->routing.group, NULL);
}

// The router's gradients: dlogits through the softmax (the gates' gradient and the
// load-balancing loss), dW, and when the layer needs its input's gradient, dx [tokens][width],
// or where the un-permute folds it in (model_moe_router_dx_folded), *term for that.
static qt_status mb_moe_router_backward(mb *b, const char *name, const model_moe *mo,
                                        const mb_moe *st, prog_ref dgate, model_tensor *dx,
                                        op_moe_router_term *term) {
    model *m = b->m;
    const model_linear *router = &m->linears[mo->router];
    const model_quantizer *qg = &m->quantizers[router->q_grad];
    const model_quantizer *qi = &m->quantizers[router->q_input];
    char what[ARENA_NAME_MAX];
    model_tensor dlogits;
    snprintf(what, sizeof what, "%s.dlogits", name);
    QT_TRY(mb_tensor_of(b, what, m->batch, mo->experts, QT_DTYPE_F32, ARENA_CAT_ACTIVATIONS,
                        &dlogits));
    op_moe_tensor out = {dlogits.ref, dlogits.dtype};
    snprintf(what, sizeof what, "%s.router_bwd", name);
    QT_TRY(op_moe_router_backward(b->p, what, &st->routing, dgate, mo->aux_scale, out));
    snprintf(what, sizeof what, "%s.router.dy", name);
    model_qstore dlq;
    QT_TRY(mb_quantize(b, what, qg, dlogits, op_group_dense(), router->needs_dx, true, true,
                       &dlq));
    const model_param *w = &m->params[router->weight];
    model_tensor dw = {mb_dev(b, w->grad), QT_DTYPE_F32, mo->experts, mo->width, OP_REF_NONE};
    mb_operand g_col = mb_dense(qg, &dlq, m->batch, mo->experts, true);
    mb_operand x_col = mb_dense(qi, &b->xq[mo->router], m->batch, mo->width, true);
    snprintf(what, sizeof what, "%s.router.wgrad", name);
    QT_TRY(mb_gemm(b, what, MODEL_WGRAD, router, &g_col, &x_col, dw, OP_REF_NONE, OP_REF_NONE,
                   GEMM_DENSE, op_group_dense(), NULL));
    if (!router->needs_dx) return QT_OK;
    if (model_moe_router_dx_folded(m, mo)) {
        QT_ASSERT(prog_ref_present(dlq.bf16.ref) && prog_ref_present(w->weight.bf16.ref));
        *term = (op_moe_router_term){{dlq.bf16.ref, QT_DTYPE_BF16}, w->weight.bf16.ref,
                                     w->weight.bf16.cols};
        return QT_OK;
    }
    snprintf(what, sizeof what, "%s.router.dx", name);
    QT_TRY(mb_tensor(b, what, m->batch, mo->width, ARENA_CAT_ACTIVATIONS, dx));
    mb_operand g_row = mb_dense(qg, &dlq, m->batch, mo->experts, false);
    model_qstore wt;
    snprintf(what, sizeof what, "%s.router", name);
    QT_TRY(mb_weight_columns(b, w, &m->quantizers[router->q_weight], router, what, &wt));
    mb_operand w_col = mb_dense(&m->quantizers[router->q_weight], &wt, mo->experts, mo->width,
                                true);
    snprintf(what, sizeof what, "%s.router.dgrad", name);
    return mb_gemm(b, what, MODEL_DGRAD, router, &g_row, &w_col, *dx, OP_REF_NONE, OP_REF_NONE,
                   GEMM_DENSE, op_group_dense(), NULL);
}

// combine -> fc2 -> activation -> fc1 -> un-permute, and the router: every weight's gradient,
// and dx = the router's input gradient + each token's fc1 input gradients.
static qt_status mb_moe_backward(mb *b, uint32_t layer, model_tensor dy, model_tensor *dx) {
    model *m = b->m;
    const model_moe *mo = &m->moes[m->layer_moe[layer]];
    const mb_moe *st = mb_moe_state(b, layer);
    const char *name = m->recipe->model.layers[layer].name;
    char what[ARENA_NAME_MAX];
    model_tensor dyp;
    prog_ref dgate;
    snprintf(what, sizeof what, "%s.dyp", name);
    QT_TRY(mb_tensor(b, what, mo->capacity, mo->width, ARENA_CAT_ACTIVATIONS, &dyp));
    QT_TRY(mb_moe_array(b, name, "dgate", (uint64_t)m->batch * mo->topk, ARENA_CAT_ACTIVATIONS,
                        &dgate));
    snprintf(what, sizeof what, "%s.combine_bwd", name);
    op_moe_tensor tdy = {dy.ref, dy.dtype}, typ = {st->yp.ref, st->yp.dtype};
    op_moe_tensor tdyp = {dyp.ref, dyp.dtype};
    dyp.amax = mb_moe_amax(b, mo, st, MB_MOE_AMAX_FC2_DY);
    QT_TRY(op_moe_combine_backward(b->p, what, &st->routing, mo->width, tdy, typ, tdyp, dgate,
                                   dyp.amax));
    model_tensor dact, dh;
    QT_TRY(mb_moe_expert_backward(b, name, "fc2", mo->fc2, st, dyp, &dact));
    snprintf(what, sizeof what, "%s.dact", name);
    QT_TRY(mb_tensor(b, what, mo->capacity, st->h.cols, ARENA_CAT_ACTIVATIONS, &dh));
    dh.amax = mb_moe_amax(b, mo, st, MB_MOE_AMAX_FC1_DY);
    QT_TRY(op_act_grouped(b->p, what, true, mb_act_kind(mo->act), mo->capacity, st->h.cols,
                          mb_act(st->h), mb_act(dact), mb_act(dh), &st->routing.group,
                          dh.amax));
    bool needs_dx = m->linears[mo->fc1].needs_dx;
    model_tensor dxp = {0}, dxr = {0};
    op_moe_router_term term = {{OP_REF_NONE, QT_DTYPE_BF16}, OP_REF_NONE, 0};
    QT_TRY(mb_moe_expert_backward(b, name, "fc1", mo->fc1, st, dh, needs_dx ? &dxp : NULL));
    QT_TRY(mb_moe_router_backward(b, name, mo, st, dgate, &dxr, &term));
    if (!needs_dx) return QT_OK;
    snprintf(what, sizeof what, "%s.dx", name);
    QT_TRY(mb_tensor(b, what, m->batch, mo->width, ARENA_CAT_ACTIVATIONS, dx));
    // The router's input gradient: its own tensor as the addend, or its term (folded; dxr
    // then absent, so no addend).
    op_moe_tensor src = {dxp.ref, dxp.dtype}, add = {dxr.ref, dxr.dtype};
    op_moe_tensor out = {dx->ref, dx->dtype};
    return op_moe_combine(b->p, what, &st->routing, mo->width, src, OP_REF_NONE, add,
                          prog_ref_present(term.weight) ? &term : NULL, out);
}

static qt_status mb_layer_backward(mb *b, uint32_t i, model_tensor dy, model_tensor *stack,
                                   uint32_t *depth, model_tensor *dx) {
    const recipe_layer *l = &b->m->recipe->model.layers[i];
    char buf[24], what[ARENA_NAME_MAX];
    const char *name = mb_layer_name(b, i, buf, sizeof buf);
    snprintf(what, sizeof what, "%s.dx", name);
    model_tensor x = b->acts[i];
    switch (l->kind) {
    case RECIPE_LAYER_LINEAR:
        return mb_linear_backward(b, i, dy, dx, NULL);
    case RECIPE_LAYER_MOE:
        return mb_moe_backward(b, i, dy, dx);
    case RECIPE_LAYER_RELU:
    case RECIPE_LAYER_GELU:
    case RECIPE_LAYER_SILU:
    case RECIPE_LAYER_SWIGLU:
        QT_TRY(mb_tensor(b, what, x.rows, x.cols, ARENA_CAT_ACTIVATIONS, dx));
        QT_TRY(mb_producer_amax(b, i, true, what, &dx->amax));
        return op_act_backward(b->p, what, mb_act_kind(l->kind), x.rows, x.cols, mb_act(x),
                               OP_ACT_NONE, mb_act(dy), mb_act(*dx), dx->amax);
    case RECIPE_LAYER_RMSNORM:
        return mb_rmsnorm_backward(b, i, name, dy, NULL, dx);
    case RECIPE_LAYER_RESIDUAL_END:
        // The block's output gradient goes to its branch (dy, unchanged) and to the skip path.
        QT_ASSERT(*depth < RECIPE_RESIDUAL_DEPTH_MAX);
        stack[(*depth)++] = dy;
        *dx = dy;
        return QT_OK;
    case RECIPE_LAYER_RESIDUAL_BEGIN:
        // The input's gradient sums both paths, into a new tensor: the skip gradient may be the
        // very tensor of the branch (an empty block) or of an enclosing block's skip path.
        QT_ASSERT(*depth > 0);
        QT_TRY(mb_tensor(b, what, dy.rows, dy.cols, ARENA_CAT_ACTIVATIONS, dx));
        QT_TRY(mb_producer_amax(b, i, true, what, &dx->amax));
        return op_residual_forward(b->p, what, (uint64_t)dy.rows * dy.cols,
                                   mb_act(stack[--(*depth)]), mb_act(dy), mb_act(*dx),
                                   dx->amax);
    case RECIPE_LAYER_KIND_COUNT: break;
    }
    QT_ASSERT(!"unknown layer kind");
    return QT_ERR_INPUT;
}

// The gradient list and the norm's launches, which the backward pass places (Optimizer, below).
static qt_status mb_grad_list(mb *b);
static qt_status mb_norm_begin(mb *b);
static qt_status mb_norm_ready(mb *b, uint32_t done);

// The planted fault (run_options.inject): written into its gradient right after the backward
// pass of layers done ..= top, which wrote that gradient, so before anything reads it (the norm,
// a reduction to its owner), whatever the layout of the norm.
static qt_status mb_inject(mb *b, uint32_t done, uint32_t top) {
    const model *m = b->m;
    if (!m->inject.on) return QT_OK;
    uint32_t layer = m->params[m->inject_param].layer;
    if (layer < done || layer > top) return QT_OK;
    return op_sched_inject(b->p, "inject", mb_dev(b, m->io.counter), m->inject.step,
                           b->grads[m->inject_param], m->inject.bits);
}

// Whether layer i is an RMSNorm right after a `residual begin` whose input's gradient the
// backward pass computes (the residual begin lies at or above the first layer with parameters).
static bool mb_norm_after_residual(const mb *b, uint32_t i) {
    const recipe_layer *layers = b->m->recipe->model.layers;
    return i > b->m->first_param_layer && layers[i].kind == RECIPE_LAYER_RMSNORM &&
           layers[i - 1].kind == RECIPE_LAYER_RESIDUAL_BEGIN;
}

// From the loss gradient down to the first layer with parameters; its input's gradient is
// not needed. The gradient norm reads each group of gradients once they are all written.
static qt_status mb_backward(mb *b) {
    const recipe_model *rm = &b->m->recipe->model;
    model_tensor stack[RECIPE_RESIDUAL_DEPTH_MAX];
    uint32_t depth = 0;
    QT_TRY(mb_grad_list(b));
    QT_TRY(mb_norm_begin(b));
    model_tensor dy = b->dlogits;
    for (uint32_t i = rm->layers_count; i-- > b->m->first_param_layer;) {
        uint32_t top = i;  // with the activation below a linear, layers i - 1 ..= top go together
        model_tensor dx = {0};
        if (mb_linear(b, i) && i > b->m->first_param_layer && mb_act_casts(b, i - 1, true)) {
            // The activation's input gradient goes to the cast of the linear below without
            // being stored.
            model_tensor act_dy = {0};
            QT_TRY(mb_linear_backward(b, i, dy, &act_dy, NULL));
            QT_TRY(mb_act_cast_backward(b, i - 1, act_dy, &dx));
            i--;
        } else if (mb_linear(b, i) && i > b->m->first_param_layer && mb_dense_act(b, i - 1)) {
            // A linear's dgrad and the backward pass of the activation below, which reads it:
            // together, as in mb_forward.
            model_tensor act_dy = {0};
            mb_then_act then = {.layer = i - 1, .backward = true, .out = &dx};
            QT_TRY(mb_linear_backward(b, i, dy, &act_dy, &then));
            i--;
        } else if (mb_norm_after_residual(b, i)) {
            // An RMSNorm that begins a residual block, and the sum of the block's two paths:
            // one kernel (mb_rmsnorm_backward), the skip path's gradient taken off the stack.
            QT_ASSERT(depth > 0);
            model_tensor skip = stack[--depth];
            char buf[24];
            QT_TRY(mb_rmsnorm_backward(b, i, mb_layer_name(b, i, buf, sizeof buf), dy, &skip,
                                       &dx));
            i--;
        } else {
            QT_TRY(mb_layer_backward(b, i, dy, stack, &depth, &dx));
        }
        QT_TRY(mb_inject(b, i, top));
        QT_TRY(mb_norm_ready(b, i));
        QT_TRY(mb_dp_reduce_ready(b, i));
        dy = dx;
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Optimizer

// The optimizer's view of parameter i (op_optim.h): its update inputs and its weight's copies.
static void mb_param_desc(const mb *b, uint32_t i, optim_param_desc *d) {
    const model *m = b->m;
    const model_param *p = &m->params[i];
    const recipe_optim *o = &m->recipe->optim;
    memset(d, 0, sizeof *d);
    d->name = p->name;
    d->rows = p->rows;
    d->cols = p->cols;
    d->grad_dtype = QT_DTYPE_F32;
    d->master = mb_dev(b, p->master);
    if (m->modes[MODEL_MODE_TRAIN]) {
        d->grad = mb_dev(b, p->grad);
        d->m = mb_dev(b, p->m);
        d->v = mb_dev(b, p->v);
    }
    d->hp = (optim_hparams){o->beta1, o->beta2, o->eps, o->weight_decay, 1.0f, true};
    d->weight = OPTIM_WEIGHT_NONE;
    if (p->quantizer < 0) return;
    const model_quantizer *mq = &m->quantizers[p->quantizer];
    const model_qstore *s = &p->weight;
    if (p->members) {
        d->group = (op_group){p->members, mb_dev(b, p->group_offsets), mb_dev(b, p->group_dims)};
    }
    switch (mq->q.format) {
    case QT_FORMAT_BF16:
        d->weight = OPTIM_WEIGHT_BF16;
        d->bf16 = s->bf16.ref;
        return;
    case QT_FORMAT_FP8_E4M3:
    case QT_FORMAT_FP8_E5M2:
        d->fp8 = (op_fp8_output){model_fp8_code(mq->q.elem), s->row_data, s->col_data,
                                 s->scale_inv};
        if (mq->q.scheme == QT_SCHEME_DELAYED) {
            d->weight = OPTIM_WEIGHT_FP8_DELAYED;
            d->fp8_scale = mb_state_scale(b, mq);
            d->fp8_amax = mb_state_amax(b, mq);
        } else {
            d->weight = OPTIM_WEIGHT_FP8_CURRENT;
            d->fp8_amax = s->amax_row;
            d->fp8_pow2 = mq->q.pow2;
            d->fp8_eps = mq->q.amax_eps;
        }
        return;
    case QT_FORMAT_MXFP8: {
        model_tensor master = {d->master, QT_DTYPE_F32, p->rows, p->cols, OP_REF_NONE};
        d->weight = OPTIM_WEIGHT_MXFP8;
        d->mxfp8 = mb_mxfp8_desc(mq, master, s);
        return;
    }
    case QT_FORMAT_FP8_BLOCK_1D:
    case QT_FORMAT_FP8_BLOCK_2D:
        d->weight = OPTIM_WEIGHT_FP8_BLOCK;
        d->block = mb_block_tensor(mq, p->rows, p->cols, s);
        d->block_options = (op_block_options){!mq->q.pow2, mq->q.amax_eps};
        return;
    case QT_FORMAT_NVFP4:
        d->weight = OPTIM_WEIGHT_NVFP4;
        d->nvfp4 = mb_nvfp4_quant(b, mq, s);
        return;
    case QT_FORMAT_COUNT: break;
    }
    QT_ASSERT(!"unknown format");
}

// Several ranks: one parameter a multi-tensor launch, its casts right after it, so that the
// broadcast of each updated weight runs beside the next parameter's update.
static uint32_t mb_optim_per_launch(const mb *b) { return mb_parallel(b) ? 1 : 0; }

// The parameters this rank updates (every one on a single GPU; with data parallelism those it
// owns), in the order its launches run them (mb_update_order), into optim_list: the list the
// optimizer's launches cover. Returns their count.
static uint32_t mb_optim_list(mb *b) {
    uint32_t order[MODEL_PARAMS_MAX];
    uint32_t count = mb_update_order(b->m, b->m->rank, order);
    for (uint32_t k = 0; k < count; k++) mb_param_desc(b, order[k], &b->optim_list[k]);
    return count;
}

// Whether the norm reads weight w's gradient through the norm units its wgrad GEMM writes
// (ptx/gemm.h; a stacked expert weight's K-grouped GEMM, each member's): 1/1024 of the
// gradient's bytes instead of all of them. One rank only: with
// several the norm is taken over the owners' sums, which a collective writes after the GEMM.
// Not the gradient that gets a planted fault either, which is written after the GEMM too.
static bool mb_grad_units(const mb *b, uint32_t w) {
    const model *m = b->m;
    return !mb_parallel(b) && !m->norm_elements && !(m->inject.on && m->inject_param == w);
}

// The gradient regions in parameter order, and their elements; the norm's regions.
static qt_status mb_grad_list(mb *b) {
    model *m = b->m;
    for (uint32_t i = 0; i < m->param_count; i++) {
        b->grads[i] = mb_dev(b, m->params[i].grad);
        b->grad_counts[i] = (uint64_t)m->params[i].rows * m->params[i].cols;
        b->norm_srcs[i] = b->grads[i];
        b->norm_counts[i] = b->grad_counts[i];
        b->norm_units[i] = false;
    }
    // Every weight's units a part of one region (arena_reserve_part): the whole lives from the
    // first wgrad to the norm's fold, so no op of the backward pass reuses the bytes of units
    // that a launch beside it may still be reading (a region of their own would end at their
    // norm launch), and the parts, apart from each other, order no GEMM after another's read.
    prog_ref whole = OP_REF_NONE;
    model_place pl = {m->dev, model_mode_name(b->mode), false, ARENA_CAT_WORKSPACE, NULL};
    for (uint32_t li = 0; li < m->linear_count; li++) {
        uint32_t w = m->linears[li].weight;
        if (!mb_grad_units(b, w)) continue;
        if (!prog_ref_present(whole)) {
            QT_TRY(mb_region(b, "grad_norm.units", 0, ARENA_CAT_WORKSPACE, &whole));
        }
        // A stacked expert weight: each member's units (its K-grouped wgrad's Ds).
        uint32_t members = m->linears[li].members ? m->linears[li].members : 1u;
        uint64_t units = members * qt_gemm_norm_unit_count(m->params[w].rows / members,
                                                           m->params[w].cols);
        char what[ARENA_NAME_MAX];
        snprintf(what, sizeof what, "%s.norm_units", m->params[w].name);
        QT_TRY(model_region_part(&pl, whole, what, units * 8, &b->norm_srcs[w]));
        b->norm_counts[w] = units;
        b->norm_units[w] = true;
    }
    return QT_OK;
}

// The norm's regions (its partials' workspace for `set`'s regions and counts, its result, and
// on several ranks this rank's result before the fold), this step's optimizer state, and the
// begin that the norm's fold (one rank) or an op after it (several) does. `set` takes all but its
// gradients and begin, which the caller gives.
static qt_status mb_norm_regions(mb *b, op_gnorm_set *set) {
    model *m = b->m;
    prog_ref ws, norm;
    QT_TRY(mb_region(b, "grad_norm.ws", op_grad_norm_workspace_bytes(set->regions, set->counts),
                     ARENA_CAT_WORKSPACE, &ws));
    QT_TRY(mb_region(b, "grad_norm", sizeof(qt_gnorm_result), ARENA_CAT_STAGING, &b->gnorm));
    norm = b->gnorm;
    if (mb_parallel(b)) {
        QT_TRY(mb_region(b, "grad_norm_rank", sizeof(qt_gnorm_result), ARENA_CAT_STAGING,
                         &norm));
    }
    // This step's optimizer values: the updates, the delayed-scaling states and the record
    // read them; nothing persistent changes when the step is skipped (ptx/optim.h).
    QT_TRY(mb_region(b, "optim_state", sizeof(optim_state), ARENA_CAT_STAGING, &b->optim));
    // The begin zeroes the updates' amax workspaces too, when one op can declare them.
    b->optim_updated = mb_optim_list(b);
    op_optim_zeroes *zeroes = &b->optim_zeroes;
    if (!op_optim_zeroes_of(b->optim_list, b->optim_updated, mb_dev(b, m->io.optim_table),
                            zeroes)) {
        zeroes = NULL;
    }
    b->norm_begin = (op_gnorm_begin){mb_dev(b, m->io.optim_steps), b->optim,
                                     mb_dev(b, m->io.lr_rows), m->io.lr_row_count, zeroes};
    set->clip = m->recipe->optim.clip;
    set->workspace = ws;
    set->ticket = mb_dev(b, m->io.gnorm_ticket);
    set->out = norm;
    return QT_OK;
}

// The gradient norm during the backward pass (one rank): the parameters in
// groups of consecutive indices, from the last, each of at least MB_NORM_GROUP_ELEMS gradient
// elements (or QT_GNORM_REGIONS regions, or down to parameter 0). A group's launch comes right
// after the backward pass of its lowest layer, which writes the last of its gradients, so the
// captured graph reads those gradients beside the rest of the backward pass (in the tails of its
// GEMMs) instead of in one pass after it. Only the group of parameter 0, the last, folds; it
// reads the first layers' gradients alone after the backward pass. A model of fewer elements is
// one group, where the norm was before: small launches on their own cost more than they save.
// The partials sit in parameter order whatever the groups (op_grad_norm_part), so the bits are
// those of one norm after the backward pass (model_options.norm_group_elems lets tests compare).
#define MB_NORM_GROUP_ELEMS (16ull << 20)

static bool mb_norm_during_backward(const mb *b) {
    return !mb_parallel(b) && b->m->norm_group_elems != UINT64_MAX;
}

// Several ranks: the norm's set over the gradients this rank owns (the parameters it updates),
// in parameter order, for mb_dp_reduce_ready; every parameter still to reduce.
static qt_status mb_dp_norm_begin(mb *b) {
    const model *m = b->m;
    uint32_t owned = 0;
    for (uint32_t i = 0; i < m->param_count; i++) {
        QT_ASSERT(i == 0 || m->params[i].layer >= m->params[i - 1].layer);  // reduce order
        if (!model_param_owned(m, i)) continue;
        b->owned_grads[owned] = b->norm_srcs[i];
        b->owned_units[owned] = b->norm_units[i];
        b->owned_counts[owned++] = b->norm_counts[i];
    }
    b->norm = (op_gnorm_set){.regions = owned, .grads = b->owned_grads,
                             .counts = b->owned_counts, .units = b->owned_units};
    b->reduce_left = m->param_count;
    b->owned_left = owned;
    return mb_norm_regions(b, &b->norm);
}

// After mb_grad_list.
static qt_status mb_norm_begin(mb *b) {
    b->norm_left = 0;
    b->reduce_left = b->owned_left = 0;
    if (mb_parallel(b)) return mb_dp_norm_begin(b);
    if (!mb_norm_during_backward(b)) return QT_OK;
    b->norm = (op_gnorm_set){.regions = b->m->param_count, .counts = b->norm_counts};
    QT_TRY(mb_norm_regions(b, &b->norm));
    b->norm.grads = b->norm_srcs;
    b->norm.units = b->norm_units;
    b->norm.begin = &b->norm_begin;
    b->norm_left = b->m->param_count;
    return QT_OK;
}

// The norm's groups whose gradients are all written once the backward pass has done layers
// `done` and above.
static qt_status mb_norm_ready(mb *b, uint32_t done) {
    const model *m = b->m;
    uint64_t group = m->norm_group_elems ? m->norm_group_elems : MB_NORM_GROUP_ELEMS;
    while (b->norm_left > 0) {
        uint32_t first = b->norm_left;
        uint64_t elems = 0;
        while (first > 0 && elems < group &&
               b->norm_left - first < QT_GNORM_REGIONS) {
            elems += b->norm_counts[--first];
        }
        if (m->params[first].layer < done) return QT_OK;  // a gradient still to be written
        QT_TRY(op_grad_norm_part(b->p, "grad_norm", &b->norm, first, b->norm_left - first,
                                 first == 0));
        b->norm_left = first;
    }
    return QT_OK;
}

// After the backward pass: the whole norm where it is not read during the backward pass (several
// ranks, or model_options.norm_group_elems UINT64_MAX), then the optimizer's updates.
static qt_status mb_optimizer(mb *b) {
    model *m = b->m;
    if (mb_norm_during_backward(b)) {
        QT_ASSERT(b->norm_left == 0);  // every group read (mb_backward)
    } else if (mb_parallel(b)) {
        // Several ranks: every gradient reduced and the owned ones' norm taken during the
        // backward pass (mb_dp_reduce_ready); that norm folded with the other ranks', then the
        // begin, which needs the folded norm, as an op after the fold.
        QT_ASSERT(b->reduce_left == 0 && b->owned_left == 0);
        // The loss statistics (mb_loss_parallel) in the same group: one wait for every rank.
        prog_ref all, loss_all;
        const op_gnorm_begin *begin = &b->norm_begin;
        const mb_gather gathers[] = {
            {"dp.grad_norm", b->norm.out, sizeof(qt_gnorm_result), &all},
            {"dp.loss_stats", b->dp_loss_local, sizeof(qt_loss_stats), &loss_all}};
        QT_TRY(mb_dp_gather_all(b, "dp.grad_norm", gathers, 2));
        QT_TRY(op_dp_gnorm_fold(b->p, "dp.grad_norm.fold", all, m->world, b->norm.clip,
                                b->gnorm));
        QT_TRY(op_dp_stats_fold(b->p, "dp.loss_stats.fold", loss_all, m->world,
                                mb_stats_cols(m), b->stats));
        QT_TRY(op_optim_begin(b->p, "optim.begin", begin->steps, b->optim, b->gnorm,
                              begin->lr_rows, begin->lr_row_count, begin->zeroes));
    } else {
        // One rank whose norm is not read during the backward pass: all of it here, its
        // folding block also beginning the update (one launch fewer).
        op_gnorm_set set = {.regions = m->param_count, .grads = b->norm_srcs,
                            .counts = b->norm_counts, .units = b->norm_units};
        QT_TRY(mb_norm_regions(b, &set));
        set.begin = &b->norm_begin;
        QT_TRY(op_grad_norm_part(b->p, "grad_norm", &set, 0, m->param_count, true));
    }
    // Several ranks: the launches one after another (a region each writes), so that each
    // weight's broadcast overlaps the next launch rather than all of them waiting for the last.
    prog_ref chain = {0};
    if (mb_parallel(b)) QT_TRY(mb_region(b, "optim.order", 16, ARENA_CAT_WORKSPACE, &chain));
    QT_TRY(op_optim_adamw_multi(b->p, "optim.adamw", b->optim_list, b->optim_updated, b->optim,
                                mb_dev(b, m->io.optim_table), mb_optim_per_launch(b), chain,
                                b->norm_begin.zeroes));
    return mb_parallel(b) ? mb_dp_broadcast_weights(b) : QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Delayed scaling and the record

// The end of a step for every delayed-scaling state, in one op (QT_FP8_STATES_PER_OP states per
// op): training runs the roll and scale update of ptx/quant_fp8.h after every cast of the
// step (the optimizer's weight casts included), between a copy of this step's amaxes (history
// row 0 before the roll) and one of the updated scales; eval and infer copy the scales alone.
// The copies are in trace order, for the record.
static qt_status mb_delayed(mb *b) {
    model *m = b->m;
    if (m->state_count == 0) return QT_OK;
    uint64_t bytes = (uint64_t)m->delayed_slots * 4;
    if (b->train) {
        QT_TRY(mb_region(b, "record.amax", bytes, ARENA_CAT_STAGING, &b->snap_amax));
    }
    QT_TRY(mb_region(b, "record.scale", bytes, ARENA_CAT_STAGING, &b->snap_scale));
    if (b->train && mb_parallel(b)) QT_TRY(mb_dp_amaxes(b));
    op_fp8_delayed_state *states = b->states;
    for (uint32_t s = 0; s < m->state_count; s++) {
        const model_state *st = &m->states[s];
        states[s] = (op_fp8_delayed_state){mb_dev(b, st->history), mb_dev(b, st->scale),
                                           st->slots, st->history_len, st->algo, st->fp8,
                                           (int)st->margin, st->trace_first};
    }
    op_fp8_delayed_end end = {b->train, b->train ? b->snap_amax : OP_FP8_NONE, b->snap_scale,
                              b->train ? mb_at(b->optim, offsetof(optim_state, skip))
                                       : OP_FP8_NONE,
                              m->delayed_slots};
    return op_fp8_delayed_states(b->p, "delayed", states, m->state_count, &end);
}

static qt_status mb_record(mb *b) {
    model *m = b->m;
    op_sched_record_desc d = {0};
    d.counter = mb_dev(b, m->io.counter);
    d.ring = (prog_ref){m->host, m->io.ring, 0};
    d.ring_len = MODEL_RING_LEN;
    static const uint32_t modes[MODEL_MODE_COUNT] = {QT_TRACE_MODE_TRAIN, QT_TRACE_MODE_EVAL,
                                                     QT_TRACE_MODE_INFER};
    d.mode = modes[b->mode];
    if (b->mode != MODEL_MODE_INFER) {
        d.loss = b->stats;
        d.accuracy = m->classification;
    }
    if (b->train) {
        d.gnorm = b->gnorm;
        d.optim = b->optim;
        d.amax = b->snap_amax;
    }
    d.scale = b->snap_scale;
    d.quantizers = m->delayed_count;
    return op_sched_record(b->p, "record", &d);
}

// ---------------------------------------------------------------------------------------------
// Programs

// The staged inputs' amax, when the first linear's cast reads it from the staging op
// (mb_producer_serves): "<mode>.stage#amax", which the op writes (no slot of the step: those it
// zeroes in the same launch), folded through the model's "step.stage#fold" ('#' is never part
// of a recipe's names). *use: NULL when the cast makes its own pass.
static qt_status mb_stage_amax(mb *b, op_sched_amax *amax, const op_sched_amax **use) {
    *use = NULL;
    if (!mb_producer_serves(b, 0, false)) return QT_OK;
    model *m = b->m;
    prog_ref ref;
    if (!m->io.has_stage_fold) {
        model_place dev = {m->dev, "step", true, ARENA_CAT_WORKSPACE, NULL};
        QT_TRY(model_region(&dev, "stage#fold", 8, ARENA_CAT_WORKSPACE, &ref));
        m->io.stage_fold = ref.region;
        m->io.has_stage_fold = true;
    }
    QT_TRY(mb_region(b, "stage#amax", 4, ARENA_CAT_WORKSPACE, &ref));
    const data_slot_layout *layout = &m->io.batch;
    *amax = (op_sched_amax){ref, mb_dev(b, m->io.stage_fold), layout->inputs_offset,
                            (uint64_t)m->batch * layout->stride};
    *use = amax;
    return QT_OK;
}

QT_STATIC_ASSERT(offsetof(data_slot_header, dataset) == QT_SCHED_HEADER_DATASET &&
                     DATA_INDEX_PAD == QT_SCHED_INDEX_PAD && DATA_LABEL_PAD == QT_SCHED_LABEL_PAD &&
                     DATA_DATASETS == QT_SCHED_DATASETS,
                 "the gather (ptx/sched_ops.h) reads data.h's slots");

// The first op of every step: this step's device slot (the counter's parity picks it; the copy
// engine filled it from the pinned host slot, runtime/schedule/schedule.h) into the program's batch
// region, a device-to-device pass (IDX pixels become FP32 x / 255 on the way), which may take
// the inputs' amax on the way (mb_stage_amax).
static qt_status mb_begin(mb *b, model *m, program *p, model_mode mode) {
    memset(b, 0, sizeof *b);
    b->m = m;
    b->p = p;
    b->mode = mode;
    b->train = mode == MODEL_MODE_TRAIN;
    QT_ASSERT(m->modes[mode]);
    b->amax_slots = (model_amax_slots){m->dev, model_mode_name(mode), false, 0};
    QT_TRY(mb_dp_begin(b, model_mode_name(mode)));
    const data_slot_layout *slot = &m->io.slot, *layout = &m->io.batch;
    prog_ref batch;
    QT_TRY(mb_region(b, "batch", layout->bytes, ARENA_CAT_STAGING, &batch));
    op_sched_slots src = {mb_dev(b, m->io.staged), slot->bytes, MODEL_DEVICE_SLOTS};
    op_sched_amax amax_desc;
    const op_sched_amax *amax;
    QT_TRY(mb_stage_amax(b, &amax_desc, &amax));
    b->stage_op = p->op_count;
    if (slot->resident) {
        op_sched_gather_desc g = {0};
        g.counter = mb_dev(b, m->io.counter);
        g.slots = src;
        g.batch = batch;
        g.slot_bytes = slot->bytes;
        g.batch_bytes = layout->bytes;
        QT_ASSERT(slot->inputs_offset == layout->inputs_offset &&
                  slot->indices_offset == layout->indices_offset);
        g.inputs_offset = slot->inputs_offset;
        g.indices_offset = slot->indices_offset;
        g.slot_targets_offset = slot->targets_offset;
        g.batch_targets_offset = layout->targets_offset;
        g.rows = slot->batch;
        g.features = slot->features;
        g.stride = slot->stride;
        g.outputs = slot->outputs;
        g.target_type = slot->target_type == DATA_TARGET_LABEL ? 0 : 1;
        g.elem_bytes = slot->input_type == DATA_INPUT_U8 ? 1 : 4;
        for (uint32_t k = 0; k < QT_SCHED_DATASETS; k++) {
            const model_dataset *d = &m->io.datasets[k];
            if (!d->present) continue;
            prog_ref data = mb_dev(b, d->region);
            g.datasets[k] = (op_sched_gather_dataset){data, mb_at(data, d->targets_offset),
                                                      d->samples};
        }
        g.amax = amax;
        QT_TRY(op_sched_gather(p, "stage", &g));
    } else if (slot->input_type == DATA_INPUT_U8) {
        op_sched_stage_desc d = {0};
        d.counter = mb_dev(b, m->io.counter);
        d.dst = batch;
        d.src = src;
        d.dst_bytes = layout->bytes;
        d.src_bytes = slot->bytes;
        d.pixels = (uint64_t)slot->batch * slot->stride;
        d.inputs_offset = slot->inputs_offset;
        d.src_targets_offset = slot->targets_offset;
        d.dst_targets_offset = layout->targets_offset;
        d.targets_bytes = (uint32_t)(slot->bytes - slot->targets_offset);
        d.amax = amax;
        QT_TRY(op_sched_stage_u8(p, "stage", &d));
    } else {
        // FP32 inputs: the slot and the batch have one layout.
        QT_ASSERT(slot->inputs_offset == layout->inputs_offset);
        op_sched_slots dst = {batch, 0, 1};
        QT_TRY(op_sched_copy(p, "stage", mb_dev(b, m->io.counter), dst, src, slot->bytes,
                             amax));
    }
    b->input = (model_tensor){mb_at(batch, layout->inputs_offset), QT_DTYPE_F32, m->batch,
                              layout->stride, amax ? amax->out : OP_REF_NONE};
    b->targets = mb_at(batch, layout->targets_offset);
    b->rows_valid = batch;  // data_slot_header.rows_valid is its first field
    return QT_OK;
}

// The last of every step: its record, and the step's amax slots, now all reserved, zeroed by
// its first op.
static qt_status mb_end(mb *b) {
    QT_TRY(mb_record(b));
    if (!b->amax_slots.reserved) return QT_OK;
    prog_ref slots = mb_dev(b, b->amax_slots.region);
    return op_sched_zero(b->p, b->stage_op, slots, mb_bytes_to_end(slots));
}

qt_status model_build_train(model *m, program *p) {
    mb *b = &m->builder;
    QT_TRY(mb_begin(b, m, p, MODEL_MODE_TRAIN));
    QT_TRY(mb_forward(b));
    QT_TRY(mb_loss(b));
    QT_TRY(mb_backward(b));
    QT_TRY(mb_optimizer(b));
    QT_TRY(mb_delayed(b));
    return mb_end(b);
}

qt_status model_build_eval(model *m, program *p) {
    mb *b = &m->builder;
    QT_TRY(mb_begin(b, m, p, MODEL_MODE_EVAL));
    QT_TRY(mb_forward(b));
    QT_TRY(mb_loss(b));
    QT_TRY(mb_delayed(b));
    return mb_end(b);
}

qt_status model_build_infer(model *m, program *p) {
    mb *b = &m->builder;
    QT_TRY(mb_begin(b, m, p, MODEL_MODE_INFER));
    QT_TRY(mb_forward(b));
    model_tensor out = b->acts[m->recipe->model.layers_count];
    QT_ASSERT(out.dtype == QT_DTYPE_BF16 && out.cols == m->outputs);
    op_sched_slots dst = {(prog_ref){m->host, m->io.outputs, 0}, m->io.outputs_bytes,
                          MODEL_OUTPUT_SLOTS};
    op_sched_slots src = {out.ref, 0, 1};
    // Several ranks: the shares are contiguous rows of the batch in rank order, so the shares
    // gathered in rank order are the whole batch's outputs in sample order, as one rank's run
    // gives them; every rank's slot holds them, and rank 0 writes the files.
    if (mb_parallel(b)) {
        QT_TRY(mb_dp_gather(b, "dp.outputs", out.ref, (uint64_t)out.rows * out.cols * 2,
                            &src.ref));
    }
    QT_TRY(op_sched_copy(p, "outputs", mb_dev(b, m->io.counter), dst, src,
                         m->io.outputs_bytes, NULL));
    QT_TRY(mb_delayed(b));
    return mb_end(b);
}

// Start-up: every master from its seeded fill, delayed-scaling states at scale 1 with an empty
// history (the arena is zeroed at bind), then every weight cast from its master, so that the
// weights are the cast of their masters from the first step on (ptx/optim.h).
qt_status model_build_init(model *m, program *p) {
    mb *b = &m->builder;
    memset(b, 0, sizeof *b);
    b->m = m;
    b->p = p;
    QT_TRY(mb_dp_begin(b, "init"));
    for (uint32_t s = 0; s < m->state_count; s++) {
        const model_state *st = &m->states[s];
        // A uniform fill over [1, 1) is exactly 1: fma(u, 0, 1).
        QT_TRY(op_fill_random(p, "init.delayed_scale", mb_dev(b, st->scale), st->slots,
                              QT_DTYPE_F32, QT_FILL_UNIFORM, 0, 0, 1.0f, 1.0f));
    }
    for (uint32_t i = 0; i < m->param_count; i++) {
        const model_param *pa = &m->params[i];
        if (!model_param_master_here(m, i)) continue;  // another rank's (data parallelism)
        prog_ref master = mb_dev(b, pa->master);
        uint64_t seed = qt_mix64(m->seed ^ (0x9E3779B97F4A7C15ull * (i + 1)));
        if (pa->init == MODEL_INIT_ONE) {
            QT_TRY(op_fill_random(p, pa->name, master, (uint64_t)pa->rows * pa->cols,
                                  QT_DTYPE_F32, QT_FILL_UNIFORM, 0, 0, 1.0f, 1.0f));
        } else if (pa->init == MODEL_INIT_NORMAL) {
            // Padded columns stay zero: the valid columns of every row, in one op, draw the
            // values an unpadded weight would have, so padding never changes the initial model.
            QT_TRY(op_fill_random_rows(p, pa->name, master, pa->rows, pa->cols_valid, pa->cols,
                                       QT_DTYPE_F32, QT_FILL_NORMAL, seed, 0, 0.0f,
                                       pa->init_std));
        }
    }
    // Stacked expert weights: their members' rows, which every quantization of them reads.
    for (uint32_t i = 0; i < m->param_count; i++) {
        const model_param *pa = &m->params[i];
        if (!pa->members) continue;
        op_group g = {pa->members, mb_dev(b, pa->group_offsets), mb_dev(b, pa->group_dims)};
        QT_TRY(op_moe_uniform_group(p, pa->name, &g, pa->rows / pa->members));
    }
    for (uint32_t i = 0; i < m->param_count; i++) {
        if (m->params[i].quantizer < 0 || !model_param_owned(m, i)) continue;
        optim_param_desc d;
        mb_param_desc(b, i, &d);
        QT_TRY(op_optim_quantize(p, &d));
    }
    if (m->modes[MODEL_MODE_TRAIN]) {
        uint32_t updated = mb_optim_list(b);
        QT_TRY(op_optim_describe(p, b->optim_list, updated, mb_dev(b, m->io.optim_table),
                                 mb_optim_per_launch(b)));
    }
    if (!mb_parallel(b)) return QT_OK;
    // The owners' casts put the amaxes of their weights alone into the delayed-scaling histories'
    // row 0; their maximum over the ranks is the row that one rank's casts of every weight
    // leave, so a run without train steps (whose first step would take that maximum) holds and
    // saves the states of the run on one GPU.
    QT_TRY(mb_dp_amaxes(b));
    // Every rank starts from its owners' weights (they draw what one rank would draw).
    return mb_dp_broadcast_weights(b);
}

static bool mb_checksummed_category(arena_category c) {
    return c == ARENA_CAT_WEIGHTS || c == ARENA_CAT_MASTER || c == ARENA_CAT_OPTIM ||
           c == ARENA_CAT_SCALING;
}

static qt_status mb_checksum_region(program *p, const char *name, prog_ref region,
                                    uint64_t bytes, prog_ref partials, prog_ref hash) {
    uint64_t words = (bytes + 7) / 8;
    uint64_t blocks = (words + OP_CHECKSUM_THREADS - 1) / OP_CHECKSUM_THREADS;
    if (blocks > OP_GRID_BLOCKS_MAX) blocks = OP_GRID_BLOCKS_MAX;
    if (blocks == 0) blocks = 1;
    return op_checksum(p, name, region, bytes, partials, (uint32_t)blocks, hash);
}

void model_keep_expert_loads(model *m, int32_t last_op) {
    for (uint32_t i = 0; i < m->moe_count; i++) {
        if (m->moes[i].has_loads) arena_extend(m->dev, m->moes[i].loads, last_op);
    }
}

// One hash per persistent weight, master, optimizer and scaling region (in handle order),
// folded into the record of the step that just ran.
qt_status model_build_checksum(model *m, program *p) {
    arena *dev = m->dev;
    uint32_t count = 0;
    for (int c = 0; c < ARENA_CAT_COUNT; c++) {
        if (mb_checksummed_category((arena_category)c)) {
            count += arena_persistent_regions(dev, (arena_category)c);
        }
    }
    QT_ASSERT(count > 0);  // every model has a weight
    model_place pl = {dev, "checksum", false, ARENA_CAT_WORKSPACE, NULL};
    prog_ref hashes, partials;
    QT_TRY(model_region(&pl, "hashes", (uint64_t)count * 8, ARENA_CAT_WORKSPACE, &hashes));
    QT_TRY(model_region(&pl, "partials", OP_GRID_BLOCKS_MAX * 8ull, ARENA_CAT_WORKSPACE,
                        &partials));
    for (uint32_t h = 0, i = 0; i < count; h++) {
        prog_ref hash = mb_at(hashes, (uint64_t)i * 8);
        if (arena_counting(dev)) {  // the counting pass needs the ops, not the regions
            QT_TRY(mb_checksum_region(p, "checksum", (prog_ref){dev, 0, 0}, 8, partials, hash));
            i++;
            continue;
        }
        const arena_region *r = arena_region_get(dev, h);
        if (!r->persistent || r->bytes == 0 || !mb_checksummed_category(r->category)) continue;
        QT_TRY(mb_checksum_region(p, r->name, (prog_ref){dev, h, 0}, r->bytes, partials, hash));
        i++;
    }
    return op_sched_checksum(p, "checksum", (prog_ref){dev, m->io.counter, 0},
                             (prog_ref){m->host, m->io.ring, 0}, MODEL_RING_LEN,
                             m->delayed_count, hashes, count);
}
