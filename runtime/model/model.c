// model planning: roles -> quantizers, padding, GEMM paths, RHT, delayed-scaling states,
// parameters and the persistent regions (model.h). The programs are built in model_build.c.
#include "runtime/model/model.h"

#include <inttypes.h>  // PRIu64
#include <math.h>    // sqrtf
#include <stdarg.h>
#include <string.h>

#include "ptx/gemm.h"                    // GEMM_FORMAT_*
#include "runtime/model/model_impl.h"    // model_qstore_reserve
#include "runtime/ops/op_moe.h"          // op_moe_capacity, op_moe_aux_scale
#include "runtime/ops/op_quant_block.h"  // op_block_scale_count
#include "runtime/ops/op_quant_mxfp8.h"  // op_mxfp8_*_bytes
#include "runtime/ops/op_quant_nvfp4.h"  // op_nvfp4_sizes_of
#include "ptx/optim.h"                   // optim_state, optim_lr_row
#include "ptx/quant_fp8.h"               // QT_FP8_*
#include "ptx/trace_record.h"            // qt_trace_ring_bytes, QT_TRACE_QUANTIZERS_MAX

// Every delayed-scaling quantizer of a model the parser accepts has a slot in a trace record
// (an moe layer's per-expert slots past the record's end are noted, model_plan_states).
QT_STATIC_ASSERT(QT_TRACE_QUANTIZERS_MAX >= MODEL_QUANTIZERS_MAX, "trace records hold a model");

bool model_region_saved(const model *m, arena_handle h) {
    if (h == m->io.staged) return false;
    for (uint32_t k = 0; k < DATA_DATASETS; k++) {  // the data, which the run loads itself
        if (m->io.datasets[k].present && h == m->io.datasets[k].region) return false;
    }
    if (m->io.has_stage_fold && h == m->io.stage_fold) return false;  // zero between steps
    return !(m->modes[MODEL_MODE_TRAIN] && h == m->io.optim_table);
}

const char *model_mode_name(model_mode mode) {
    static const char *const names[] = {"train", "eval", "infer"};
    _Static_assert(sizeof names / sizeof names[0] == MODEL_MODE_COUNT, "a name per model_mode");
    QT_ASSERT((unsigned)mode < MODEL_MODE_COUNT);
    return names[mode];
}

static void model_note(model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void model_note(model *m, const char *fmt, ...) {
    if (m->note_count == MODEL_NOTES_MAX) {  // notes are a report; the plan stands
        m->notes_dropped++;
        return;
    }
    va_list args;
    va_start(args, fmt);
    vsnprintf(m->notes[m->note_count++], MODEL_NOTE_BYTES, fmt, args);
    va_end(args);
}

static uint32_t model_roundup(uint32_t value, uint32_t unit) {
    return (value + unit - 1) / unit * unit;
}

// ---------------------------------------------------------------------------------------------
// Layers and quantizers

static qt_status model_add_linear(model *m, uint32_t layer, uint32_t in, uint32_t out,
                                  uint32_t members, bool needs_dx) {
    const recipe_layer *l = &m->recipe->model.layers[layer];
    QT_ASSERT(m->linear_count < MODEL_LINEARS_MAX);  // the parser's layers_max bounds it
    model_linear *lin = &m->linears[m->linear_count];
    memset(lin, 0, sizeof *lin);
    lin->layer = layer;
    lin->in = in;
    lin->in_padded = in;
    lin->out = out;
    lin->members = members;
    lin->moe = UINT32_MAX;
    lin->bias = l->kind == RECIPE_LAYER_LINEAR && l->bias;
    lin->needs_dx = needs_dx;
    m->layer_linear[layer] = m->linear_count++;
    return QT_OK;
}

// The router (dense, one output per expert), then fc1 and fc2 grouped by expert. fc2 always
// needs its input's gradient (the activation's); the router and fc1 when a layer with
// parameters comes before.
static qt_status model_add_moe(model *m, uint32_t layer) {
    const recipe_layer *l = &m->recipe->model.layers[layer];
    QT_ASSERT(m->moe_count < MODEL_MOES_MAX);  // the parser's layers_max bounds it
    model_moe *mo = &m->moes[m->moe_count];
    memset(mo, 0, sizeof *mo);
    mo->layer = layer;
    mo->experts = l->experts;
    mo->topk = l->topk;
    mo->width = l->in_features;
    mo->hidden = l->hidden;
    mo->act = l->act;
    uint32_t fc1_out = l->act == RECIPE_LAYER_SWIGLU ? 2 * l->hidden : l->hidden;
    bool needs_dx = layer > m->first_param_layer;
    mo->router = m->linear_count;
    QT_TRY(model_add_linear(m, layer, mo->width, mo->experts, 0, needs_dx));
    mo->fc1 = m->linear_count;
    QT_TRY(model_add_linear(m, layer, mo->width, fc1_out, mo->experts, needs_dx));
    mo->fc2 = m->linear_count;
    QT_TRY(model_add_linear(m, layer, mo->hidden, mo->width, mo->experts, true));
    m->linears[mo->router].moe = m->linears[mo->fc1].moe = m->linears[mo->fc2].moe =
        m->moe_count;
    m->layer_linear[layer] = mo->router;
    m->layer_moe[layer] = m->moe_count++;
    return QT_OK;
}

// Every role of the model, in the order of recipe_roles_next: per linear input, weight,
// grad_output.
static qt_status model_plan_quantizers(model *m) {
    const recipe *r = m->recipe;
    for (uint32_t i = 0; i < RECIPE_LAYERS_MAX; i++) m->layer_linear[i] = UINT32_MAX;
    for (uint32_t i = 0; i < RECIPE_LAYERS_MAX; i++) m->layer_param[i] = UINT32_MAX;
    for (uint32_t i = 0; i < RECIPE_LAYERS_MAX; i++) m->layer_moe[i] = UINT32_MAX;
    m->first_param_layer = UINT32_MAX;
    for (uint32_t i = 0; i < r->model.layers_count; i++) {
        recipe_layer_kind k = r->model.layers[i].kind;
        if ((k == RECIPE_LAYER_LINEAR || k == RECIPE_LAYER_RMSNORM || k == RECIPE_LAYER_MOE) &&
            m->first_param_layer == UINT32_MAX) {
            m->first_param_layer = i;
        }
        const recipe_layer *l = &r->model.layers[i];
        if (k == RECIPE_LAYER_LINEAR) {
            QT_TRY(model_add_linear(m, i, l->in_features, l->out_features, 0,
                                    i > m->first_param_layer));
        }
        if (k == RECIPE_LAYER_MOE) QT_TRY(model_add_moe(m, i));
    }
    QT_ASSERT(m->first_param_layer != UINT32_MAX);  // the parser requires a linear layer
    recipe_role_iter iter = {0, 0};
    qt_role role;
    uint32_t layer, previous = UINT32_MAX, role_in_layer = 0;
    while (recipe_roles_next(r, &iter, &role, &layer)) {
        QT_ASSERT(m->quantizer_count < MODEL_QUANTIZERS_MAX);
        QT_ASSERT(m->layer_linear[layer] != UINT32_MAX);
        // Roles come per layer, three per GEMM (recipe_roles_next): an moe layer's router,
        // fc1, fc2 are its consecutive linears.
        role_in_layer = layer == previous ? role_in_layer + 1 : 0;
        previous = layer;
        uint32_t index = m->quantizer_count++;
        model_quantizer *mq = &m->quantizers[index];
        memset(mq, 0, sizeof *mq);
        mq->role = role;
        mq->linear = m->layer_linear[layer] + role_in_layer / 3;
        QT_ASSERT((role.module_type == QT_MODULE_GROUPED_LINEAR) ==
                  (m->linears[mq->linear].members > 0));
        mq->state = -1;
        QT_TRY(recipe_resolve_role(r, role, &mq->q));
        mq->rht = mq->q.scheme == QT_SCHEME_NVFP4 && mq->q.rht;
        model_linear *lin = &m->linears[mq->linear];
        if (role.tensor_type == QT_TENSOR_INPUT) lin->q_input = index;
        if (role.tensor_type == QT_TENSOR_WEIGHT) lin->q_weight = index;
        if (role.tensor_type == QT_TENSOR_GRAD_OUTPUT) lin->q_grad = index;
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Mixture-of-experts layers

static uint32_t model_row_align(const model *m, uint32_t quantizer) {
    return qt_format_get(m->quantizers[quantizer].q.format)->row_align;
}

// Each expert's weight is one member of a grouped tensor stored back to back, so its rows must
// be whole members of the format's row_align (no padding rows between experts' masters); BF16
// weights are not quantized and take any rows.
static qt_status model_check_expert_rows(const model *m, const model_moe *mo,
                                         const model_linear *lin, const char *which,
                                         const char *fix) {
    const recipe_layer *l = &m->recipe->model.layers[mo->layer];
    const qt_quantizer *q = &m->quantizers[lin->q_weight].q;
    uint32_t align = model_row_align(m, lin->q_weight);
    if (q->scheme == QT_SCHEME_BF16 || lin->out % align == 0) return QT_OK;
    return recipe_fail_at(QT_ERR_INPUT, m->recipe->file_name, l->line, l->col,
                          "layer 'moe %s': each expert's %s weight has %u rows, which %s weights "
                          "take in multiples of %u; expected %s", l->name, which, lin->out,
                          rules_scheme_name(q->scheme), align, fix);
}

// Members padded to whole 128-byte lines of the quantized formats' columnwise copies. The
// K-grouped weight gradients read each expert's tokens from those copies (tokens along the
// contiguous dimension) from the expert's first row on; at the formats' own alignment (16 rows)
// every 128-byte TMA row of a stage starts inside a line and touches two. On an H100
// (moe8_current, 8 experts of 4096 tokens) the two FP8 weight gradients took 561 and 290 us at
// 16 rows and 393 and 212 us at 128, the grouped casts' columnwise stores 93 us less, the step
// 4.99 -> 4.63 ms; the padding rows cost the activations about 70 us. A member starts on a
// line only where that padding (up to 127 rows an expert) stays within 1/16 of the routed rows:
// 64 experts of 512 tokens would pad the activations by a quarter (moe64_current: no gain).
// Per-tensor FP8 only: BF16 operands are read in rows (outer-major), whose member offsets move
// no line; FP8 block scaling's own alignment is 128 rows; MXFP8's and NVFP4's expert weight
// gradients run on the portable tier, which loads no TMA rows.
#define MODEL_MOE_LINE_ROWS 128u
#define MODEL_MOE_LINE_PADDING_SHARE 16u

static uint32_t model_moe_line_align(const model *m, const model_moe *mo,
                                     const uint32_t tensors[4], uint32_t align) {
    bool columnwise = false;
    for (int i = 0; i < 4; i++) {
        uint32_t format = m->quantizers[tensors[i]].q.format;
        columnwise = columnwise || format == QT_FORMAT_FP8_E4M3 || format == QT_FORMAT_FP8_E5M2;
    }
    uint64_t padding = (uint64_t)mo->experts * (MODEL_MOE_LINE_ROWS - 1);
    uint64_t routed = (uint64_t)m->batch * mo->topk;
    if (!columnwise || m->moe_own_align || align >= MODEL_MOE_LINE_ROWS ||
        padding * MODEL_MOE_LINE_PADDING_SHARE > routed) {
        return align;
    }
    return MODEL_MOE_LINE_ROWS;
}

// The permuted tensors' padding (one row_align for the layer, so the four grouped tensors share
// the routing's row offsets), their capacity and the load-balancing factor.
static qt_status model_plan_moe(model *m, model_moe *mo) {
    const recipe_layer *l = &m->recipe->model.layers[mo->layer];
    const model_linear *fc1 = &m->linears[mo->fc1], *fc2 = &m->linears[mo->fc2];
    uint32_t tensors[4] = {fc1->q_input, fc1->q_grad, fc2->q_input, fc2->q_grad};
    mo->row_align = 1;
    for (int i = 0; i < 4; i++) {
        uint32_t a = model_row_align(m, tensors[i]);
        mo->row_align = a > mo->row_align ? a : mo->row_align;
    }
    mo->row_align = model_moe_line_align(m, mo, tensors, mo->row_align);
    uint64_t capacity = op_moe_capacity(m->batch, mo->topk, mo->experts, mo->row_align);
    if (capacity == 0) {
        return recipe_fail_at(QT_ERR_INPUT, m->recipe->file_name, l->line, l->col,
                              "layer 'moe %s': batch %u x topk %u rows (padded per expert) do "
                              "not fit 32-bit row indices; expected a smaller batch or topk",
                              l->name, m->batch, mo->topk);
    }
    mo->capacity = (uint32_t)capacity;
    mo->aux_scale = op_moe_aux_scale(l->aux, mo->experts, m->batch, mo->topk);
    QT_TRY(model_check_expert_rows(m, mo, fc1, "fc1", mo->act == RECIPE_LAYER_SWIGLU
                                   ? "2 x hidden (swiglu) a multiple of it"
                                   : "hidden a multiple of it"));
    return model_check_expert_rows(m, mo, fc2, "fc2", "the layer's width a multiple of it");
}

// ---------------------------------------------------------------------------------------------
// Padding, GEMM paths, RHT

// Columns of K one row of codes needs (recipes/format.c: whole 16-byte vectors and scaling
// blocks along K).
static uint32_t model_k_unit(const qt_quantizer *q) { return qt_format_get(q->format)->k_unit; }

static void model_plan_padding(model *m) {
    m->input_stride = m->input_features;
    const recipe_layer *first = &m->recipe->model.layers[0];
    if (first->kind != RECIPE_LAYER_LINEAR) return;  // only a linear's K can take zero columns
    model_linear *lin = &m->linears[0];
    const qt_quantizer *qi = &m->quantizers[lin->q_input].q;
    const qt_quantizer *qw = &m->quantizers[lin->q_weight].q;
    uint32_t unit = model_k_unit(qi) > model_k_unit(qw) ? model_k_unit(qi) : model_k_unit(qw);
    uint32_t padded = model_roundup(lin->in, unit);
    if (padded == lin->in) return;
    lin->in_padded = padded;
    m->input_stride = padded;
    model_note(m, "%s: input features %u padded to %u with zero columns (%s x %s need K in "
               "multiples of %u); the weight's padding columns stay zero", first->name, lin->in,
               padded, rules_scheme_name(qi->scheme), rules_scheme_name(qw->scheme), unit);
}

// Whether `recompute` on layer i takes effect: an activation right before a linear that keeps
// its input as BF16, the activation's own output, in a run that trains, with a layer below it
// that has parameters (so the activation's backward runs and keeps its input anyway). A
// quantized input is kept as its codes (half or a quarter of the bytes), which the linear's
// wgrad reads; making the output again would not free them. Below the first layer with
// parameters the input would be kept for the copy alone (the model's input: the FP32 batch,
// twice the output's bytes).
static bool model_recompute_takes(const model *m, uint32_t i) {
    const recipe_model *rm = &m->recipe->model;
    recipe_layer_kind k = rm->layers[i].kind;
    bool act = k == RECIPE_LAYER_RELU || k == RECIPE_LAYER_GELU || k == RECIPE_LAYER_SILU ||
               k == RECIPE_LAYER_SWIGLU;
    if (!act || !m->modes[MODEL_MODE_TRAIN] || i < m->first_param_layer ||
        i + 1 == rm->layers_count || rm->layers[i + 1].kind != RECIPE_LAYER_LINEAR) {
        return false;
    }
    const model_linear *next = &m->linears[m->layer_linear[i + 1]];
    return m->quantizers[next->q_input].q.format == QT_FORMAT_BF16;
}

// The recipe's flags where they take effect; where the model rules them out, a note says why
// (a run without train steps has no backward pass to change, and needs none).
static void model_plan_recompute(model *m) {
    const recipe_model *rm = &m->recipe->model;
    for (uint32_t i = 0; i < rm->layers_count; i++) {
        m->recompute[i] = rm->layers[i].recompute && model_recompute_takes(m, i);
        if (!rm->layers[i].recompute || m->recompute[i]) continue;
        QT_ASSERT(i + 1 < rm->layers_count && m->layer_linear[i + 1] != UINT32_MAX);
        const char *kind = recipe_layer_kind_name(rm->layers[i].kind);
        if (i < m->first_param_layer) {
            model_note(m, "%s (layer %u, line %u): recompute changes nothing: no layer below it "
                       "has parameters, so its backward does not run, and its input would be "
                       "kept for the copy alone; %s keeps this output", kind, i,
                       rm->layers[i].line, rm->layers[i + 1].name);
            continue;
        }
        const model_quantizer *mq = &m->quantizers[m->linears[m->layer_linear[i + 1]].q_input];
        if (mq->q.format == QT_FORMAT_BF16) continue;  // no train steps
        char role[96];
        rules_role_format(&mq->role, role, sizeof role);
        model_note(m, "%s (layer %u, line %u): recompute changes nothing: %s is %s, so %s keeps "
                   "its quantized input for the weight gradient, not this output", kind, i,
                   rm->layers[i].line, role, rules_scheme_name(mq->q.scheme),
                   rm->layers[i + 1].name);
    }
}

bool model_recompute_would_help(const model *m, uint32_t i) {
    QT_ASSERT(i < m->recipe->model.layers_count);
    return !m->recompute[i] && model_recompute_takes(m, i);
}

bool model_moe_router_dx_folded(const model *m, const model_moe *mo) {
    const model_linear *router = &m->linears[mo->router];
    return router->needs_dx && mo->experts <= MODEL_MOE_ROUTER_FOLD_EXPERTS &&
           m->quantizers[router->q_grad].q.format == QT_FORMAT_BF16 &&
           m->quantizers[router->q_weight].q.format == QT_FORMAT_BF16;
}

uint32_t model_gemm_format_of(qt_format f) { return qt_format_get(f)->gemm_format; }

// Whether A x B runs on the kernel of their format (runtime/ops/op_gemm.c's rules): one format,
// and for the FP8 tensor-core kinds an E4M3 B (the kernels take E4M3 x E4M3 and E5M2 x E4M3).
static bool model_gemm_native(const qt_quantizer *a, const qt_quantizer *b) {
    uint32_t f = model_gemm_format_of(a->format);
    if (f != model_gemm_format_of(b->format)) return false;
    if (f == GEMM_FORMAT_FP8 || f == GEMM_FORMAT_FP8_BLOCK) return b->elem == QT_ELEM_E4M3;
    return true;
}

static const char *const model_gemm_names[] = {"fprop", "dgrad", "wgrad"};
_Static_assert(sizeof model_gemm_names / sizeof model_gemm_names[0] == MODEL_GEMM_COUNT,
               "a name per model_gemm");

// MXFP8 and NVFP4 GEMMs through BF16 copies. The emulated formats decode every element to BF16
// (gemm.h), and the dequantize kernels write exactly those values (NVFP4: the raw decode, its
// global amaxes applied in the BF16 GEMM's alpha, GEMM_FLAG_ALPHA_NVFP4), so BF16 copies and a
// BF16 GEMM compute the same products in the same k order: the choice moves no bit, only time
// and workspace (tests/test_train.c compares the traces). An MXFP8 copy that only such GEMMs
// read is written by the cast itself as those values (model_build.c, mb_values).
// - MXFP8 dgrad and wgrad read a columnwise (outer-major) copy and usually E5M2 gradients: the
//   emulated sm_90a kernel takes K-major E4M3 only, and the portable MXFP8 kernel ran them at
//   about a sixth of the sm_90a BF16 kernel's rate, which reads outer-major BF16 directly.
// - Large GEMMs of either format: the emulated kernels decode each B tile again for every
//   128-row tile of D; one pass per operand is cheaper from MODEL_EMULATED_COPIES_MACS
//   multiply-adds (batch x out x in). Smaller GEMMs keep the kernels: two more launches would
//   cost more than the decode they save. The rule reads the shape only, so every GPU builds the
//   same program.
#define MODEL_EMULATED_COPIES_MACS (1ull << 32)

static bool model_emulated_copies(const model *m, const model_linear *lin, int g,
                                  const qt_quantizer *a) {
    uint32_t f = model_gemm_format_of(a->format);
    if (f != GEMM_FORMAT_MXFP8 && f != GEMM_FORMAT_NVFP4) return false;
    if (m->emulated_gemm != MODEL_EMULATED_AUTO) return m->emulated_gemm == MODEL_EMULATED_COPIES;
    uint64_t rows = lin->members ? m->moes[lin->moe].capacity : m->batch;
    uint64_t macs = rows * lin->out * lin->in_padded;
    return (f == GEMM_FORMAT_MXFP8 && g != MODEL_FPROP) || macs >= MODEL_EMULATED_COPIES_MACS;
}

static void model_plan_linear_paths(model *m, model_linear *lin) {
    const char *name = m->quantizers[lin->q_input].role.name;  // "fc1", "moe1.fc1"
    model_quantizer *qi = &m->quantizers[lin->q_input];
    model_quantizer *qw = &m->quantizers[lin->q_weight];
    model_quantizer *qg = &m->quantizers[lin->q_grad];
    // RHT: both wgrad operands or neither (the transform cancels only in pairs), and over whole
    // 16-row groups of the batch.
    // An moe layer's experts pad every member to a multiple of row_align (at least 16).
    bool whole_groups = lin->members > 0 || m->batch % 16 == 0;
    bool both = qi->rht && qg->rht && whole_groups;
    if ((qi->rht || qg->rht) && !both) {
        model_note(m, "%s: RHT off for both wgrad operands (input %s rht=%d, grad_output %s "
                   "rht=%d, batch %u): the transform must apply to both or neither", name,
                   rules_scheme_name(qi->q.scheme), qi->rht, rules_scheme_name(qg->q.scheme),
                   qg->rht, m->batch);
        qi->rht = false;
        qg->rht = false;
    }
    const qt_quantizer *ops[MODEL_GEMM_COUNT][2] = {
        {&qi->q, &qw->q}, {&qg->q, &qw->q}, {&qg->q, &qi->q}};
    for (int g = 0; g < MODEL_GEMM_COUNT; g++) {
        bool native = model_gemm_native(ops[g][0], ops[g][1]);
        bool copies = native && model_emulated_copies(m, lin, g, ops[g][0]);
        lin->path[g] = native && !copies ? MODEL_GEMM_NATIVE : MODEL_GEMM_MIXED;
        bool used = g == MODEL_FPROP || (m->modes[MODEL_MODE_TRAIN] &&
                                         (g == MODEL_WGRAD || lin->needs_dx));
        // Copies of a native pair are a choice of speed (the plan's GEMM line says mixed(bf16)),
        // not a mismatch of formats to warn about.
        if (!used || native) continue;
        model_note(m, "%s %s: %s x %s have no common GEMM kernel; both operands are dequantized "
                   "to BF16 for a BF16 GEMM", name, model_gemm_names[g],
                   rules_scheme_name(ops[g][0]->scheme), rules_scheme_name(ops[g][1]->scheme));
    }
}

// ---------------------------------------------------------------------------------------------
// Delayed-scaling states

uint32_t model_fp8_code(qt_elem e) {
    QT_ASSERT(e == QT_ELEM_E4M3 || e == QT_ELEM_E5M2);
    return e == QT_ELEM_E5M2 ? QT_FP8_E5M2 : QT_FP8_E4M3;
}

uint32_t model_gemm_elem_of(qt_elem e) {
    switch (e) {
    case QT_ELEM_BF16: return GEMM_ELEM_BF16;
    case QT_ELEM_E4M3: return GEMM_ELEM_E4M3;
    case QT_ELEM_E5M2: return GEMM_ELEM_E5M2;
    case QT_ELEM_E2M1: return GEMM_ELEM_E2M1;
    case QT_ELEM_FP32:
    case QT_ELEM_E8M0:
    case QT_ELEM_COUNT: break;  // scale types, never codes
    }
    QT_ASSERT(!"not a code type");
    return 0;
}

uint32_t model_quantizer_tensors(const model *m, const model_quantizer *mq) {
    uint32_t members = m->linears[mq->linear].members;
    return members ? members : 1;
}

static qt_status model_plan_states(model *m) {
    for (uint32_t i = 0; i < m->quantizer_count; i++) {
        model_quantizer *mq = &m->quantizers[i];
        if (mq->q.scheme != QT_SCHEME_DELAYED) continue;
        uint32_t algo = mq->q.amax_algo == QT_AMAX_MOST_RECENT ? QT_FP8_AMAX_ALGO_MOST_RECENT
                                                               : QT_FP8_AMAX_ALGO_MAX;
        uint32_t fp8 = model_fp8_code(mq->q.elem);
        uint32_t s = 0;
        while (s < m->state_count &&
               !(m->states[s].history_len == mq->q.history_len && m->states[s].algo == algo &&
                 m->states[s].fp8 == fp8 && m->states[s].margin == mq->q.margin)) {
            s++;
        }
        if (s == m->state_count) {
            QT_ASSERT(s < MODEL_STATES_MAX);  // at most one state per quantizer
            m->states[s] = (model_state){mq->q.history_len, algo, fp8, mq->q.margin, 0, 0, 0, 0};
            m->state_count++;
        }
        mq->state = (int32_t)s;
        mq->slot = m->states[s].slots;
        m->states[s].slots += model_quantizer_tensors(m, mq);
    }
    uint32_t next = 0;
    for (uint32_t s = 0; s < m->state_count; s++) {
        m->states[s].trace_first = next;
        next += m->states[s].slots;
    }
    m->delayed_slots = next;
    m->delayed_count = next < QT_TRACE_QUANTIZERS_MAX ? next : QT_TRACE_QUANTIZERS_MAX;
    if (next > QT_TRACE_QUANTIZERS_MAX) {
        model_note(m, "%u delayed-scaling slots (one per expert of a grouped quantizer); the "
                   "trace records the first %d, the state checksums cover every one", next,
                   QT_TRACE_QUANTIZERS_MAX);
    }
    for (uint32_t i = 0; i < m->quantizer_count; i++) {
        model_quantizer *mq = &m->quantizers[i];
        if (mq->state >= 0) mq->trace_index = m->states[mq->state].trace_first + mq->slot;
    }
    return QT_OK;
}

void model_trace_name(const model *m, uint32_t trace_index, char *buf, size_t buf_bytes) {
    for (uint32_t i = 0; i < m->quantizer_count; i++) {
        const model_quantizer *mq = &m->quantizers[i];
        uint32_t tensors = model_quantizer_tensors(m, mq);
        if (mq->state < 0 || trace_index < mq->trace_index ||
            trace_index - mq->trace_index >= tensors) {
            continue;
        }
        char role[96];
        rules_role_format(&mq->role, role, sizeof role);
        if (m->linears[mq->linear].members == 0) {
            snprintf(buf, buf_bytes, "%s", role);
        } else {
            snprintf(buf, buf_bytes, "%s[%u]", role, trace_index - mq->trace_index);
        }
        return;
    }
    QT_ASSERT(!"no quantizer with this trace index");
}

// ---------------------------------------------------------------------------------------------
// Regions

// "<prefix>.<part>" into name (ARENA_NAME_MAX + 16 bytes), or the error of a name too long.
static qt_status model_region_name(const char *prefix, const char *part, char *name) {
    int n = snprintf(name, ARENA_NAME_MAX + 16, "%s.%s", prefix, part);
    if (n < 0 || n >= ARENA_NAME_MAX) {
        return qt_fail(QT_ERR_INPUT, "region name '%s' is longer than %d bytes; expected shorter "
                       "layer names", name, ARENA_NAME_MAX - 1);
    }
    return QT_OK;
}

qt_status model_region(const model_place *place, const char *part, uint64_t bytes,
                       arena_category category, prog_ref *out) {
    char name[ARENA_NAME_MAX + 16];
    QT_TRY(model_region_name(place->prefix, part, name));
    bytes = (bytes + 15) / 16 * 16;
    int32_t first = place->persistent ? ARENA_LIFETIME_PERSISTENT : 1;
    arena_handle h;
    QT_TRY(arena_reserve(place->arena, name, bytes, 256, category, first, 0, &h));
    *out = (prog_ref){place->arena, h, 0};
    return QT_OK;
}

qt_status model_region_part(const model_place *place, prog_ref whole, const char *part,
                            uint64_t bytes, prog_ref *out) {
    QT_ASSERT(whole.arena == place->arena && !place->persistent);
    char name[ARENA_NAME_MAX + 16];
    QT_TRY(model_region_name(place->prefix, part, name));
    arena_handle h;
    QT_TRY(arena_reserve_part(place->arena, whole.region, name, (bytes + 15) / 16 * 16, 256, &h));
    *out = (prog_ref){place->arena, h, 0};
    return QT_OK;
}

qt_status model_amax(const model_place *place, const char *part, uint64_t bytes,
                     arena_category category, prog_ref *out) {
    model_amax_slots *slots = place->amax_slots;
    if (slots == NULL) return model_region(place, part, bytes, category, out);
    QT_ASSERT(!place->persistent && slots->arena == place->arena);
    if (!slots->reserved) {
        model_place whole = {slots->arena, slots->mode, false, ARENA_CAT_WORKSPACE, NULL};
        prog_ref ref;
        QT_TRY(model_region(&whole, "step#amax", 0, ARENA_CAT_WORKSPACE, &ref));
        slots->region = ref.region;
        slots->reserved = true;
    }
    return model_region_part(place, (prog_ref){slots->arena, slots->region, 0}, part, bytes, out);
}

static qt_status model_qstore_fp8(const model_place *pl, const model_quantizer *mq,
                                  uint64_t elems, uint32_t tensors, model_qstore *s) {
    if (s->rowwise) QT_TRY(model_region(pl, "row_data", elems, pl->category, &s->row_data));
    if (s->colwise) QT_TRY(model_region(pl, "col_data", elems, pl->category, &s->col_data));
    QT_TRY(model_region(pl, "scale_inv", 4ull * tensors, pl->category, &s->scale_inv));
    if (mq->q.scheme == QT_SCHEME_CURRENT) {
        QT_TRY(model_amax(pl, "amax", 4ull * tensors, ARENA_CAT_WORKSPACE, &s->amax_row));
    }
    return QT_OK;
}

// FP8 codes with block scales of row_scale and col_scale bytes (MXFP8, FP8 block); a direction
// of BF16 values (s->row_values, col_values) has twice the bytes and no scales.
static qt_status model_qstore_blocks(const model_place *pl, uint32_t rows, uint32_t cols,
                                     uint64_t row_scale, uint64_t col_scale, model_qstore *s) {
    uint64_t elems = (uint64_t)rows * cols;
    if (s->rowwise) {
        QT_TRY(model_region(pl, "row_data", s->row_values ? 2 * elems : elems, pl->category,
                            &s->row_data));
        if (!s->row_values) {
            QT_TRY(model_region(pl, "row_scale", row_scale, pl->category, &s->row_scale));
        }
    }
    if (s->colwise) {
        QT_TRY(model_region(pl, "col_data", s->col_values ? 2 * elems : elems, pl->category,
                            &s->col_data));
        if (!s->col_values) {
            QT_TRY(model_region(pl, "col_scale", col_scale, pl->category, &s->col_scale));
        }
    }
    return QT_OK;
}

static qt_status model_qstore_nvfp4(const model_place *pl, const model_quantizer *mq,
                                    uint32_t rows, uint32_t cols, uint32_t members,
                                    model_qstore *s) {
    op_nvfp4_sizes z = op_nvfp4_sizes_of(rows, cols, members);
    uint64_t values = 2ull * rows * cols;  // a direction's BF16 values (*_values): no scales
    if (s->rowwise) {
        QT_TRY(model_region(pl, "row_data", s->row_values ? values : z.row_data, pl->category,
                            &s->row_data));
        if (!s->row_values) {
            QT_TRY(model_region(pl, "row_scale", z.row_scales, pl->category, &s->row_scale));
        }
    }
    if (s->colwise) {
        QT_TRY(model_region(pl, "col_data", s->col_values ? values : z.col_data, pl->category,
                            &s->col_data));
        if (!s->col_values) {
            QT_TRY(model_region(pl, "col_scale", z.col_scales, pl->category, &s->col_scale));
        }
    }
    QT_TRY(model_amax(pl, "amax", z.amax, pl->category, &s->amax_row));
    s->amax_col = s->amax_row;  // without RHT both directions have the tensor's amax
    if (s->colwise && mq->rht) {
        QT_TRY(model_amax(pl, "amax_col", z.amax, pl->category, &s->amax_col));
    }
    return QT_OK;
}

qt_status model_qstore_reserve(const model_place *place, const model_quantizer *mq,
                               uint32_t rows, uint32_t cols, uint32_t members, bool rowwise,
                               bool colwise, uint32_t values, bool bf16_region,
                               model_qstore *out) {
    memset(out, 0, sizeof *out);
    out->rowwise = rowwise;
    out->colwise = colwise;
    out->row_values = rowwise && (values & MODEL_QSTORE_ROW_VALUES);
    out->col_values = colwise && (values & MODEL_QSTORE_COL_VALUES);
    QT_ASSERT(rowwise || colwise);
    QT_ASSERT(values == 0 || mq->q.format == QT_FORMAT_MXFP8 || mq->q.format == QT_FORMAT_NVFP4);
    switch (mq->q.format) {
    case QT_FORMAT_BF16:
        if (!bf16_region) return QT_OK;
        QT_TRY(model_region(place, "bf16", (uint64_t)rows * cols * 2, place->category,
                            &out->bf16.ref));
        out->bf16.dtype = QT_DTYPE_BF16;
        out->bf16.rows = rows;
        out->bf16.cols = cols;
        return QT_OK;
    case QT_FORMAT_FP8_E4M3:
    case QT_FORMAT_FP8_E5M2:
        return model_qstore_fp8(place, mq, (uint64_t)rows * cols, members ? members : 1, out);
    case QT_FORMAT_MXFP8:
        return model_qstore_blocks(place, rows, cols, op_mxfp8_row_scales_bytes(rows, cols),
                                   op_mxfp8_col_scales_bytes(rows, cols), out);
    case QT_FORMAT_FP8_BLOCK_1D:
    case QT_FORMAT_FP8_BLOCK_2D:
        return model_qstore_blocks(place, rows, cols,
                                   op_block_scale_count(rows, cols, mq->q.two_d, false) * 4,
                                   op_block_scale_count(rows, cols, mq->q.two_d, true) * 4, out);
    case QT_FORMAT_NVFP4:
        return model_qstore_nvfp4(place, mq, rows, cols, members, out);
    case QT_FORMAT_COUNT: break;
    }
    QT_ASSERT(!"unknown format");
    return QT_ERR_INPUT;
}

// ---------------------------------------------------------------------------------------------
// Parameters

static qt_status model_add_param(model *m, uint32_t layer_index, const char *layer,
                                 const char *what, uint32_t rows, uint32_t cols, model_init init,
                                 int32_t quantizer, uint32_t *index) {
    QT_ASSERT(m->param_count < MODEL_PARAMS_MAX);  // two per layer at most
    model_param *p = &m->params[m->param_count];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s.%s", layer, what);
    // Layers add their parameters in order (model_plan_params).
    QT_ASSERT(m->param_count == 0 || m->params[m->param_count - 1].layer <= layer_index);
    p->layer = layer_index;
    p->rows = rows;
    p->cols = cols;
    p->cols_valid = cols;
    p->init = init;
    p->quantizer = quantizer;
    *index = m->param_count++;
    return QT_OK;
}

// master, m, v (persistent) and the gradient (transient in the train program); the quantized
// weight with rowwise data, plus columnwise data when the schedule trains.
bool model_param_owned(const model *m, uint32_t i) {
    QT_ASSERT(i < m->param_count);
    return m->param_owner[i] == m->rank;
}

// A run without train steps (eval and infer rows alone) has no moments to split and no gradient
// regions, through which a save gathers the masters that a rank lacks: every rank then draws
// every master (the same values) and a checkpoint finds them all on rank 0.
bool model_param_master_here(const model *m, uint32_t i) {
    return model_param_owned(m, i) || m->params[i].quantizer < 0 ||
           !m->modes[MODEL_MODE_TRAIN];
}

// Each parameter's owner among the ranks (runtime/parallel/parallel.h's partition by elements).
static qt_status model_plan_owners(model *m) {
    if (m->world == 1) return QT_OK;  // param_owner is all 0: rank 0 owns everything
    if (m->param_count < m->world) {
        return qt_fail(QT_ERR_INPUT, "%s: the model has %u parameter tensors; a run on %u GPUs "
                       "gives each GPU at least one to own: use at most %u GPUs",
                       m->recipe->file_name, m->param_count, m->world, m->param_count);
    }
    uint64_t elems[MODEL_PARAMS_MAX];
    for (uint32_t i = 0; i < m->param_count; i++) {
        elems[i] = (uint64_t)m->params[i].rows * m->params[i].cols;
    }
    dp_partition(elems, m->param_count, m->world, m->param_owner);
    return QT_OK;
}

// A data-parallel rank reserves the master and moments of the parameters it owns only (and
// every master that is the weight itself), which is what ZeRO-1 takes off each rank's arena.
static qt_status model_param_regions(model *m, uint32_t index) {
    model_param *p = &m->params[index];
    bool train = m->modes[MODEL_MODE_TRAIN];
    uint64_t bytes = (uint64_t)p->rows * p->cols * 4;
    model_place pl = {m->dev, p->name, true, ARENA_CAT_MASTER, NULL};
    prog_ref ref;
    p->master = p->m = p->v = MODEL_REGION_NONE;
    if (model_param_master_here(m, index)) {
        QT_TRY(model_region(&pl, "master", bytes, ARENA_CAT_MASTER, &ref));
        p->master = ref.region;
    }
    if (train) {
        if (model_param_owned(m, index)) {
            QT_TRY(model_region(&pl, "m", bytes, ARENA_CAT_OPTIM, &ref));
            p->m = ref.region;
            QT_TRY(model_region(&pl, "v", bytes, ARENA_CAT_OPTIM, &ref));
            p->v = ref.region;
        }
        model_place grads = {m->dev, p->name, false, ARENA_CAT_GRADS, NULL};
        QT_TRY(model_region(&grads, "grad", bytes, ARENA_CAT_GRADS, &ref));
        p->grad = ref.region;
    }
    if (p->quantizer < 0) return QT_OK;
    model_place wp = {m->dev, p->name, true, ARENA_CAT_WEIGHTS, NULL};
    if (p->members) {
        QT_TRY(model_region(&wp, "group_offsets", 4ull * (p->members + 1), ARENA_CAT_WEIGHTS,
                            &ref));
        p->group_offsets = ref.region;
        QT_TRY(model_region(&wp, "group_dims", 4ull * p->members, ARENA_CAT_WEIGHTS, &ref));
        p->group_dims = ref.region;
    }
    return model_qstore_reserve(&wp, &m->quantizers[p->quantizer], p->rows, p->cols,
                                p->members, true, p->weight_t == MODEL_WEIGHT_T_STORED, 0, true,
                                &p->weight);
}

// `weight_transpose = auto` makes a dense FP8 or MXFP8 weight's columnwise copy per step when the
// weight has at least MODEL_WEIGHT_T_ELEMS_MIN elements and the step at least
// MODEL_WEIGHT_T_ROWS_MIN rows. The transpose moves 2 bytes per element where the dgrad GEMM
// does 2 x rows FLOPs per element: from 4096 rows on it costs under 10% of it (about 3 TB/s
// against 1000 TFLOP/s on an H100) and under 4% of the weight's three GEMMs, while the arena's
// peak, which falls in the backward pass, loses the copy's bytes (one per element). MXFP8's
// columnwise cast from the master moves 5 bytes per element (FP32 in, codes out, a scale per 32)
// against a dgrad that Hopper runs at about half the FP8 rate: the same share of it.
#define MODEL_WEIGHT_T_ELEMS_MIN (1u << 22)
#define MODEL_WEIGHT_T_ROWS_MIN 4096u

static model_weight_t model_weight_t_of(const model *m, const model_linear *lin,
                                        const model_param *w) {
    if (!m->modes[MODEL_MODE_TRAIN] || !lin->needs_dx) return MODEL_WEIGHT_T_NONE;
    const qt_quantizer *q = &m->quantizers[lin->q_weight].q;
    qt_format f = q->format;
    // The columnwise copy is the rowwise one transposed where one scale covers the tensor
    // (per-tensor FP8) or square tiles (FP8 block scaling's 128 x 128 weights). MXFP8's 1-D
    // columnwise blocks run along the other dimension, so its copy is cast again from the FP32
    // master, which only a run on one GPU holds for every weight (ZeRO-1 gives each rank the
    // masters it owns). NVFP4's columnwise copy is stored.
    bool per_step_able = ((f == QT_FORMAT_FP8_E4M3 || f == QT_FORMAT_FP8_E5M2 ||
                           f == QT_FORMAT_FP8_BLOCK_2D) ||
                          (f == QT_FORMAT_MXFP8 && !q->two_d && m->world == 1)) &&
                         !lin->members;
    switch (m->recipe->quant.weight_transpose) {
    case RECIPE_WEIGHT_T_STORED: return MODEL_WEIGHT_T_STORED;
    case RECIPE_WEIGHT_T_PER_STEP:
        return per_step_able ? MODEL_WEIGHT_T_PER_STEP : MODEL_WEIGHT_T_STORED;
    case RECIPE_WEIGHT_T_AUTO: {
        bool large = (uint64_t)w->rows * w->cols >= MODEL_WEIGHT_T_ELEMS_MIN &&
                     m->batch >= MODEL_WEIGHT_T_ROWS_MIN;
        return per_step_able && large ? MODEL_WEIGHT_T_PER_STEP : MODEL_WEIGHT_T_STORED;
    }
    case RECIPE_WEIGHT_T_COUNT: break;
    }
    QT_ASSERT(!"unknown weight_transpose");
    return MODEL_WEIGHT_T_STORED;
}

// A linear's weight [out (x members)][in_padded], normal(0, 1/sqrt(in)); the padding columns
// stay zero.
static qt_status model_add_weight(model *m, const char *name, model_linear *lin) {
    uint32_t members = lin->members ? lin->members : 1;
    QT_TRY(model_add_param(m, lin->layer, name, "weight", lin->out * members, lin->in_padded,
                           MODEL_INIT_NORMAL, (int32_t)lin->q_weight, &lin->weight));
    model_param *w = &m->params[lin->weight];
    w->cols_valid = lin->in;
    w->init_std = 1.0f / sqrtf((float)lin->in);
    w->members = lin->members;
    w->weight_t = model_weight_t_of(m, lin, w);
    return QT_OK;
}

static qt_status model_plan_params(model *m) {
    const recipe_model *rm = &m->recipe->model;
    for (uint32_t i = 0; i < rm->layers_count; i++) {
        const recipe_layer *l = &rm->layers[i];
        if (l->kind == RECIPE_LAYER_RMSNORM) {
            QT_TRY(model_add_param(m, i, l->name, "gamma", 1, l->in_features, MODEL_INIT_ONE,
                                   -1, &m->layer_param[i]));
            continue;
        }
        if (l->kind == RECIPE_LAYER_MOE) {
            // The experts first: a one-expert layer then draws the initial weights of the dense
            // fc1 and fc2 it stands for (each parameter's fill is keyed by its index).
            const model_moe *mo = &m->moes[m->layer_moe[i]];
            uint32_t gemms[3] = {mo->fc1, mo->fc2, mo->router};
            for (int g = 0; g < 3; g++) {
                model_linear *lin = &m->linears[gemms[g]];
                QT_TRY(model_add_weight(m, m->quantizers[lin->q_weight].role.name, lin));
            }
            continue;
        }
        if (l->kind != RECIPE_LAYER_LINEAR) continue;
        model_linear *lin = &m->linears[m->layer_linear[i]];
        QT_TRY(model_add_weight(m, l->name, lin));
        if (lin->bias) {
            QT_TRY(model_add_param(m, lin->layer, l->name, "bias", 1, lin->out,
                                   MODEL_INIT_ZERO, -1, &lin->bias_param));
        }
    }
    QT_TRY(model_plan_owners(m));
    for (uint32_t i = 0; i < m->param_count; i++) QT_TRY(model_param_regions(m, i));
    for (uint32_t s = 0; s < m->state_count; s++) {
        model_state *st = &m->states[s];
        char prefix[32];
        snprintf(prefix, sizeof prefix, "delayed%u", s);
        model_place pl = {m->dev, prefix, true, ARENA_CAT_SCALING, NULL};
        prog_ref ref;
        QT_TRY(model_region(&pl, "history", (uint64_t)st->history_len * st->slots * 4,
                            ARENA_CAT_SCALING, &ref));
        st->history = ref.region;
        QT_TRY(model_region(&pl, "scale", (uint64_t)st->slots * 4, ARENA_CAT_SCALING, &ref));
        st->scale = ref.region;
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// The step plumbing

static qt_status model_plan_io(model *m, const model_options *o) {
    model_io *io = &m->io;
    io->slot = data_slot_plan(o->data, m->batch, m->input_stride, o->resident);
    io->batch = data_batch_plan(o->data, m->batch, m->input_stride, o->resident);
    io->lr_row_count = o->lr_row_count;
    model_place host = {m->host, "host", true, ARENA_CAT_STAGING, NULL};
    model_place dev = {m->dev, "step", true, ARENA_CAT_STAGING, NULL};
    prog_ref ref;
    QT_TRY(model_region(&host, "staging", MODEL_HOST_SLOTS * io->slot.bytes, ARENA_CAT_STAGING,
                        &ref));
    io->staging = ref.region;
    QT_TRY(model_region(&dev, "staged", MODEL_DEVICE_SLOTS * io->slot.bytes, ARENA_CAT_STAGING,
                        &ref));
    io->staged = ref.region;
    const data_info *sets[DATA_DATASETS] = {o->data, o->eval_data};
    // The eval set is read by the eval and infer programs only: a run that builds neither
    // leaves it in host memory.
    bool eval_read = m->modes[MODEL_MODE_EVAL] || m->modes[MODEL_MODE_INFER];
    for (uint32_t k = 0; o->resident && k < DATA_DATASETS; k++) {
        if (sets[k] == NULL || (k == DATA_DATASET_EVAL && !eval_read)) continue;
        model_dataset *d = &io->datasets[k];
        d->present = true;
        d->samples = sets[k]->samples;
        d->targets_offset = sets[k]->targets_offset;
        d->bytes = sets[k]->targets_offset + sets[k]->targets_bytes;
        model_place data = {m->dev, "data", true, ARENA_CAT_STAGING, NULL};
        QT_TRY(model_region(&data, k == DATA_DATASET_TRAIN ? "train" : "eval", d->bytes,
                            ARENA_CAT_STAGING, &ref));
        d->region = ref.region;
    }
    QT_TRY(model_region(&host, "records", MODEL_RING_LEN * qt_trace_ring_bytes(m->delayed_count),
                        ARENA_CAT_STAGING, &ref));
    io->ring = ref.region;
    // The whole batch's outputs: a data-parallel rank's infer program gathers every share.
    io->outputs_bytes = ((uint64_t)m->batch * m->world * m->outputs * 2 + 15) / 16 * 16;
    if (m->modes[MODEL_MODE_INFER]) {
        QT_TRY(model_region(&host, "outputs", MODEL_OUTPUT_SLOTS * io->outputs_bytes,
                            ARENA_CAT_STAGING, &ref));
        io->outputs = ref.region;
    }
    QT_TRY(model_region(&dev, "counter", 8, ARENA_CAT_STAGING, &ref));
    io->counter = ref.region;
    QT_TRY(model_region(&dev, "optim_steps", 8, ARENA_CAT_OPTIM, &ref));
    io->optim_steps = ref.region;
    if (m->modes[MODEL_MODE_TRAIN]) {
        QT_ASSERT(io->lr_row_count >= 1);
        QT_TRY(model_region(&dev, "lr_rows", io->lr_row_count * sizeof(optim_lr_row),
                            ARENA_CAT_OPTIM, &ref));
        io->lr_rows = ref.region;
        // Zero from bind on; only the norm's fold writes it, and leaves it zero.
        QT_TRY(model_region(&dev, "gnorm_ticket", 4, ARENA_CAT_WORKSPACE, &ref));
        io->gnorm_ticket = ref.region;
        QT_TRY(model_region(&dev, "optim_table", op_optim_table_bytes(m->param_count),
                            ARENA_CAT_STAGING, &ref));
        io->optim_table = ref.region;
    }
    return QT_OK;
}

// The parameter whose gradient gets the planted fault: the weight of the named linear layer.
static qt_status model_plan_inject(model *m) {
    if (!m->inject.on) return QT_OK;
    for (uint32_t i = 0; i < m->linear_count; i++) {
        const model_linear *lin = &m->linears[i];
        const char *name = m->recipe->model.layers[lin->layer].name;
        if (m->inject.layer == NULL || strcmp(m->inject.layer, name) == 0) {
            m->inject_param = lin->weight;
            return QT_OK;
        }
    }
    char names[160] = "";
    uint32_t used = 0, i = 0;
    for (; i < m->linear_count && used < sizeof names - 48; i++) {
        used += (uint32_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                   m->recipe->model.layers[m->linears[i].layer].name);
    }
    if (i < m->linear_count) snprintf(names + used, sizeof names - used, ", ...");
    return qt_fail(QT_ERR_INPUT, "%s: the fault goes into a linear layer's weight gradient, and "
                   "the model has no linear layer '%s'; name one of its linear layers (%s)",
                   m->recipe->file_name, m->inject.layer, names);
}

qt_status model_plan(model *m, const recipe *r, arena *dev, arena *host,
                     const model_options *options) {
    memset(m, 0, sizeof *m);
    m->recipe = r;
    m->dev = dev;
    m->host = host;
    m->batch = options->batch;
    m->emulated_gemm = options->emulated_gemm;
    m->amax_passes = options->amax_passes;
    m->norm_group_elems = options->norm_group_elems;
    m->norm_elements = options->norm_elements;
    m->moe_own_align = options->moe_own_align;
    m->act_cast_elems = options->act_cast_elems;
    m->seed = options->seed;
    m->comm = options->comm;
    m->rank = options->comm ? options->comm->rank : 0;
    m->world = options->comm ? options->comm->world : 1;
    m->largest_first = options->largest_first && m->world > 1;
    memcpy(m->modes, options->modes, sizeof m->modes);
    m->classification = r->model.loss == RECIPE_LOSS_SOFTMAX_XENT;
    m->input_features = r->model.input_features;
    m->outputs = r->model.output_features;
    QT_ASSERT(options->data->features == m->input_features);
    QT_TRY(model_plan_quantizers(m));
    for (uint32_t i = 0; i < m->moe_count; i++) QT_TRY(model_plan_moe(m, &m->moes[i]));
    model_plan_padding(m);
    model_plan_recompute(m);
    for (uint32_t i = 0; i < m->linear_count; i++) model_plan_linear_paths(m, &m->linears[i]);
    QT_TRY(model_plan_states(m));
    QT_TRY(model_plan_params(m));
    m->inject = options->inject;
    QT_TRY(model_plan_inject(m));
    return model_plan_io(m, options);
}

// ---------------------------------------------------------------------------------------------
// Report

// "rule at line N" or "built-in SCHEME": where a quantizer came from.
static void model_quantizer_source(const model *m, const model_quantizer *mq, char *buf,
                                   size_t buf_bytes) {
    if (mq->q.rule_line > 0) {
        snprintf(buf, buf_bytes, "rule at line %u", mq->q.rule_line);
    } else {
        snprintf(buf, buf_bytes, "built-in %s", rules_scheme_name(m->recipe->quant.builtin));
    }
}

// The role column's width: 30, or the model's longest role (a MoE layer's
// grouped_linear.grad_output@NAME.fc1 is longer), so the quantizer column stays aligned.
static int model_role_width(const model *m) {
    int width = 30;
    for (uint32_t i = 0; i < m->quantizer_count; i++) {
        char role[96];
        rules_role_format(&m->quantizers[i].role, role, sizeof role);
        int len = (int)strlen(role);
        if (len > width) width = len;
    }
    return width;
}

static void model_print_quantizer(const model *m, uint32_t index, int role_width, FILE *out) {
    const model_quantizer *mq = &m->quantizers[index];
    char role[96], q[160];
    rules_role_format(&mq->role, role, sizeof role);
    rules_quantizer_format(&mq->q, q, sizeof q);
    char from[64];
    model_quantizer_source(m, mq, from, sizeof from);
    fprintf(out, "      %-*s %-44s (%s)", role_width, role, q, from);
    if (mq->q.scheme == QT_SCHEME_NVFP4 && mq->role.tensor_type != QT_TENSOR_WEIGHT) {
        fprintf(out, " rht %s", mq->rht ? "on" : "off");
    }
    if (mq->state >= 0) fprintf(out, " [delayed%d slot %u]", mq->state, mq->slot);
    fputc('\n', out);
}

static const char *model_weight_t_name(const model *m, const model_linear *lin) {
    switch (m->params[lin->weight].weight_t) {
    case MODEL_WEIGHT_T_NONE: return "none";
    case MODEL_WEIGHT_T_STORED: return "stored";
    case MODEL_WEIGHT_T_PER_STEP:
        return m->quantizers[lin->q_weight].q.format == QT_FORMAT_MXFP8
                   ? "cast per step from the master"
                   : "transposed per step";
    }
    QT_ASSERT(!"unknown model_weight_t");
    return "?";
}

static void model_print_linear(const model *m, const model_linear *lin, const char *label,
                               int role_width, FILE *out) {
    fprintf(out, "      %sK %u", label, lin->in);
    if (lin->in_padded != lin->in) fprintf(out, " padded to %u", lin->in_padded);
    const char *dgrad = !lin->needs_dx ? "no (first)" : "yes";
    const model_moe *mo = lin->moe != UINT32_MAX ? &m->moes[lin->moe] : NULL;
    if (mo && mo->router == (uint32_t)(lin - m->linears) && model_moe_router_dx_folded(m, mo)) {
        dgrad = "in the un-permute (no GEMM)";
    }
    fprintf(out, ", N %u, dgrad %s; GEMMs:", lin->out, dgrad);
    for (int g = 0; g < MODEL_GEMM_COUNT; g++) {
        fprintf(out, " %s %s", model_gemm_names[g],
                lin->path[g] == MODEL_GEMM_NATIVE ? "native" : "mixed(bf16)");
    }
    fprintf(out, "; columnwise weight %s\n", model_weight_t_name(m, lin));
    model_print_quantizer(m, lin->q_input, role_width, out);
    model_print_quantizer(m, lin->q_weight, role_width, out);
    model_print_quantizer(m, lin->q_grad, role_width, out);
}

// Bytes of the device regions whose names start with `prefix`.
static uint64_t model_region_bytes(const model *m, const char *prefix) {
    uint64_t bytes = 0;
    for (uint32_t h = 0; h < m->dev->region_count; h++) {
        const arena_region *r = arena_region_get(m->dev, h);
        if (strncmp(r->name, prefix, strlen(prefix)) == 0) bytes += r->bytes;
    }
    return bytes;
}

static double model_mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

// An moe layer: its routing, the three GEMMs, and where its memory goes: the router's and the
// experts' persistent regions (weights in every usage, masters, optimizer state) and the
// routing and expert tensors of one step of the first mode the schedule has.
static void model_print_moe(const model *m, const model_moe *mo, int role_width, FILE *out) {
    const recipe_layer *l = &m->recipe->model.layers[mo->layer];
    fprintf(out, "      %u experts, top-%u, hidden %u (%s), aux %g; permuted rows: capacity %u "
            "(batch %u x %u, each expert padded to a multiple of %u)\n", mo->experts, mo->topk,
            mo->hidden, recipe_layer_kind_name(mo->act), (double)l->aux, mo->capacity, m->batch,
            mo->topk, mo->row_align);
    model_print_linear(m, &m->linears[mo->router], "router: ", role_width, out);
    model_print_linear(m, &m->linears[mo->fc1], "fc1 (per expert): ", role_width, out);
    model_print_linear(m, &m->linears[mo->fc2], "fc2 (per expert): ", role_width, out);
    char prefix[ARENA_NAME_MAX + 16];
    snprintf(prefix, sizeof prefix, "%s.router.", l->name);
    uint64_t router = model_region_bytes(m, prefix);
    snprintf(prefix, sizeof prefix, "%s.fc1.", l->name);
    uint64_t experts = model_region_bytes(m, prefix);
    snprintf(prefix, sizeof prefix, "%s.fc2.", l->name);
    experts += model_region_bytes(m, prefix);
    model_mode mode = MODEL_MODE_TRAIN;
    while (!m->modes[mode]) mode++;
    snprintf(prefix, sizeof prefix, "%s.%s.", model_mode_name(mode), l->name);
    fprintf(out, "      memory: router %.3f MiB, experts %.3f MiB (weights in every usage, "
            "masters, optimizer state); one %s step's routing and expert tensors %.3f MiB\n",
            model_mib(router), model_mib(experts), model_mode_name(mode),
            model_mib(model_region_bytes(m, prefix)));
}

void model_print(const model *m, FILE *out) {
    const recipe_model *rm = &m->recipe->model;
    fprintf(out, "model: %u layers, input %u (stride %u), %u outputs, loss %s, batch %u\n",
            rm->layers_count, m->input_features, m->input_stride, m->outputs,
            m->classification ? "softmax_xent" : "mse", m->batch);
    int role_width = model_role_width(m);
    for (uint32_t i = 0; i < rm->layers_count; i++) {
        const recipe_layer *l = &rm->layers[i];
        fprintf(out, "  %3u %-14s %-16s %6u -> %-6u%s\n", i, recipe_layer_kind_name(l->kind),
                l->name, l->in_features, l->out_features,
                l->bias           ? " bias"
                : m->recompute[i] ? " recomputed in backward for the next linear's wgrad"
                                  : "");
        if (l->kind == RECIPE_LAYER_LINEAR) {
            model_print_linear(m, &m->linears[m->layer_linear[i]], "", role_width, out);
        }
        if (l->kind == RECIPE_LAYER_MOE) {
            model_print_moe(m, &m->moes[m->layer_moe[i]], role_width, out);
        }
    }
    fprintf(out, "parameters: %u\n", m->param_count);
    for (uint32_t i = 0; i < m->param_count; i++) {
        const model_param *p = &m->params[i];
        fprintf(out, "  %-28s %6u x %-6u init %s\n", p->name, p->rows, p->cols,
                p->init == MODEL_INIT_NORMAL ? "normal" : p->init == MODEL_INIT_ONE ? "one"
                                                                                   : "zero");
    }
    for (uint32_t s = 0; s < m->state_count; s++) {
        const model_state *st = &m->states[s];
        fprintf(out, "delayed%u: %u slots, history %u, algo %s, %s, margin %u\n", s, st->slots,
                st->history_len, st->algo == QT_FP8_AMAX_ALGO_MAX ? "max" : "most_recent",
                st->fp8 == QT_FP8_E5M2 ? "e5m2" : "e4m3", st->margin);
    }
    fprintf(out, "notes:%s\n", m->note_count ? "" : " none");
    for (uint32_t i = 0; i < m->note_count; i++) fprintf(out, "  %s\n", m->notes[i]);
    if (m->notes_dropped) fprintf(out, "  ... and %u more notes\n", m->notes_dropped);
}

// ---------------------------------------------------------------------------------------------
// Summary (`qtrain plan --summary`): a bounded number of lines whatever the model's size.

#define MODEL_SUMMARY_LAYERS 10   // layers with weights listed one per line; the rest counted
#define MODEL_SUMMARY_GROUPS 10   // quantizer groups listed; the rest counted
#define MODEL_SUMMARY_NAMES 40    // bytes of layer names listed per group before "+N"

// Roles with the same tensor type, quantizer, RHT decision and source, and their layers.
typedef struct model_qgroup {
    qt_tensor_type tensor;
    char q[160];
    char from[64];
    bool rht;
    uint32_t count;
    char names[MODEL_SUMMARY_NAMES + 1];
    uint32_t names_left;          // layers in the group that names does not list
} model_qgroup;

static void model_qgroup_add_name(model_qgroup *g, const char *name) {
    size_t used = strlen(g->names), need = strlen(name) + (used ? 1 : 0);
    if (g->names_left == 0 && used + need <= MODEL_SUMMARY_NAMES) {
        if (used) g->names[used++] = ' ';
        memcpy(g->names + used, name, strlen(name) + 1);
    } else {
        g->names_left++;
    }
}

static void model_qgroup_key(const model *m, uint32_t i, model_qgroup *key) {
    const model_quantizer *mq = &m->quantizers[i];
    memset(key, 0, sizeof *key);
    key->tensor = mq->role.tensor_type;
    rules_quantizer_format(&mq->q, key->q, sizeof key->q);
    model_quantizer_source(m, mq, key->from, sizeof key->from);
    key->rht = mq->rht;
}

static bool model_qgroup_same(const model_qgroup *a, const model_qgroup *b) {
    return a->tensor == b->tensor && a->rht == b->rht && strcmp(a->q, b->q) == 0 &&
           strcmp(a->from, b->from) == 0;
}

// The groups in order of their first quantizer: the first `max` of them into groups (their
// counts and layer names), and how many there are. Each quantizer's key is compared with the
// earlier ones' again rather than kept, so a summary needs no table as large as the model's.
static uint32_t model_qgroups(const model *m, model_qgroup *groups, uint32_t max) {
    uint32_t count = 0;
    for (uint32_t i = 0; i < m->quantizer_count; i++) {
        model_qgroup key, other;
        model_qgroup_key(m, i, &key);
        bool first = true;
        for (uint32_t j = 0; j < i && first; j++) {
            model_qgroup_key(m, j, &other);
            first = !model_qgroup_same(&key, &other);
        }
        if (!first) continue;
        if (count < max) {
            model_qgroup *g = &groups[count];
            *g = key;
            for (uint32_t k = i; k < m->quantizer_count; k++) {
                if (k > i) model_qgroup_key(m, k, &other);
                if (k > i && !model_qgroup_same(&key, &other)) continue;
                g->count++;
                model_qgroup_add_name(g, m->quantizers[k].role.name);
            }
        }
        count++;
    }
    return count;
}

static int model_digits(uint32_t v) {
    int digits = 1;
    while (v >= 10) {
        v /= 10;
        digits++;
    }
    return digits;
}

void model_print_summary(const model *m, FILE *out) {
    const recipe_model *rm = &m->recipe->model;
    uint32_t weighted = 0;
    uint64_t values = 0;
    for (uint32_t i = 0; i < m->param_count; i++) {
        values += (uint64_t)m->params[i].rows * m->params[i].cols_valid;
    }
    fprintf(out, "model        %u layers, input %u", rm->layers_count, m->input_features);
    if (m->input_stride != m->input_features) fprintf(out, " (padded to %u)", m->input_stride);
    fprintf(out, ", %u outputs, loss %s, batch %u\n", m->outputs,
            m->classification ? "softmax_xent" : "mse", m->batch);
    for (uint32_t i = 0; i < rm->layers_count; i++) {
        const recipe_layer *l = &rm->layers[i];
        if (l->name[0] == '\0') continue;
        if (++weighted > MODEL_SUMMARY_LAYERS) continue;
        fprintf(out, "  %-16s %-8s %6u -> %u", l->name, recipe_layer_kind_name(l->kind),
                l->in_features, l->out_features);
        if (l->kind == RECIPE_LAYER_LINEAR) {
            const model_linear *lin = &m->linears[m->layer_linear[i]];
            fprintf(out, "%*s%-4s GEMMs", 7 - model_digits(l->out_features), "",
                    l->bias ? "bias" : "");
            for (int g = 0; g < MODEL_GEMM_COUNT; g++) {
                bool runs = g != MODEL_DGRAD || lin->needs_dx;
                fprintf(out, " %s %s", model_gemm_names[g],
                        !runs ? "-" : lin->path[g] == MODEL_GEMM_NATIVE ? "native" : "mixed");
            }
            if (m->params[lin->weight].weight_t == MODEL_WEIGHT_T_PER_STEP) {
                fprintf(out, ", W^T per step");
            }
        }
        fputc('\n', out);
    }
    if (weighted > MODEL_SUMMARY_LAYERS) {
        fprintf(out, "  ... %u more layers with weights (qtrain plan lists them all)\n",
                weighted - MODEL_SUMMARY_LAYERS);
    }
    model_qgroup groups[MODEL_SUMMARY_GROUPS];
    uint32_t group_count = model_qgroups(m, groups, MODEL_SUMMARY_GROUPS);
    fprintf(out, "quantizers   %u roles in %u groups: tensor, quantizer (source): layers\n",
            m->quantizer_count, group_count);
    for (uint32_t g = 0; g < group_count && g < MODEL_SUMMARY_GROUPS; g++) {
        const model_qgroup *q = &groups[g];
        char layers[MODEL_SUMMARY_NAMES + 24];
        snprintf(layers, sizeof layers, "%s", q->names);
        if (q->names_left) {
            size_t used = strlen(layers);
            snprintf(layers + used, sizeof layers - used, " +%u", q->names_left);
        }
        fprintf(out, "  %-11s  %s (%s%s): %s\n", rules_tensor_type_name(q->tensor), q->q,
                q->from, q->rht ? ", rht on" : "", layers);
    }
    if (group_count > MODEL_SUMMARY_GROUPS) {
        fprintf(out, "  ... %u more groups (qtrain plan lists every role)\n",
                group_count - MODEL_SUMMARY_GROUPS);
    }
    fprintf(out, "parameters   %u tensors, %" PRIu64 " values; %u delayed-scaling states\n",
            m->param_count, values, m->state_count);
}
