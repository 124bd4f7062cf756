// Mixture-of-experts tests. The routing kernels' C twins against plain C of their definitions
// (softmax, the top-k order, a stable sort by expert with padded offsets, gather, combine and
// their gradients) for expert counts 1, 4, 8, 16, 64, 65, 256 and 1024 with uneven, empty and
// all-in-one experts, and the per-member amaxes that the producers of grouped tensors (gather,
// the grouped activations and their gradients, combine_bwd) merge against separate qt_fp8_amax
// passes over what they stored, bit for bit; with a GPU, the same programs on both backends
// compared bit for bit, eager and as a graph. Then the layer: its gradients on the reference
// backend against a double-precision model of the same network, and training runs (convergence,
// two runs identical, eval steps interleaved, every token routed to one expert, every format;
// with a GPU: weights after step 1 and losses against the reference backend, eager == graph, no
// synchronization in the loop).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/driver/driver.h"  // driver_sync_total
#include "tests/files.h"            // tmp_dir_make, tmp_path
#include "runtime/backend/gemm_tier.h"  // gemm_tier_takes
#include "tests/npy_save.h"
#include "runtime/ops/op_act.h"
#include "runtime/ops/op_gemm.h"
#include "runtime/ops/op_moe.h"
#include "runtime/ops/op_quant_block.h"
#include "runtime/ops/op_quant_fp8.h"
#include "runtime/ops/op_quant_mxfp8.h"
#include "runtime/ops/op_quant_nvfp4.h"
#include "tests/plan.h"             // test_run_plan
#include "tests/rig.h"
#include "runtime/run/run.h"
#include "tests/test.h"

// ---------------------------------------------------------------------------------------------
// Routing kernels

typedef enum routing_logits {
    LOGITS_RANDOM,      // normal(0, 2) logits
    LOGITS_ONE_EXPERT,  // expert `hot` far above the rest: every token's first choice
    LOGITS_EQUAL        // every logit equal: the ties go to the lowest indices
} routing_logits;

typedef struct routing_case {
    uint32_t tokens, experts, topk, cols, row_align;
    routing_logits logits;
    uint32_t hot;
    float aux;
} routing_case;

// The grouped tensors whose producers merge per-member amaxes (slots of the routing's amax
// region, which the scan zeroes): xp (gather), GELU of xp and its gradient (dy = yp), SwiGLU of
// xp and its gradient (dy = the SwiGLU output; even cols only) and dyp (combine_bwd).
enum { AMAX_XP, AMAX_GELU, AMAX_DGELU, AMAX_SWIGLU, AMAX_DSWIGLU, AMAX_DYP, AMAX_SLOTS };

// Every region of the routing program, and the host copies of inputs and outputs.
typedef struct routing_run {
    routing_case c;
    uint32_t capacity, assignments, chunks;
    op_moe_routing r;
    arena_handle h_logits, h_probs, h_expert, h_gate, h_counts, h_base, h_row_of, h_assign_of,
        h_dims, h_offsets, h_x, h_xp, h_yp, h_y, h_y2, h_y3, h_dy, h_dyp, h_dgate, h_dlogits,
        h_amax, h_pass, h_gelu, h_dgelu, h_swiglu, h_dswiglu, h_skip, h_dlb, h_rw, h_y4;
    float *logits, *probs, *gate, *dgate, *dlogits;
    float *skip;  // [tokens][cols] FP32: the residual combine's addend (a staged FP32 input's type)
    float *amax, *pass;  // [AMAX_SLOTS][experts]: the producers' and the separate passes'
    uint32_t *expert, *row_of, *assign_of, *dims, *offsets, *chunk_base;
    uint16_t *x, *xp, *yp, *y, *y2, *y3, *dy, *dyp, *gelu, *dgelu, *swiglu, *dswiglu;
    // The un-permute with a BF16 router's input gradient folded in (op_moe_router_term):
    // dlb [tokens][experts] and rw [experts][ROUTER_W_PAD + cols] BF16, y4 its output.
    uint16_t *dlb, *rw, *y4;
} routing_run;

// The router weight's row stride beyond cols: a stride other than the output's row.
#define ROUTER_W_PAD 8u

// Bytes that no kernel writes into the rows of a grouped output past its active end.
#define UNTOUCHED 0x5Au

static uint64_t rng_state;

static uint32_t rng_next(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static float rng_normal(void) {
    double u1 = (rng_next() + 1.0) / 2147483649.0, u2 = rng_next() / 2147483648.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static uint16_t rng_bf16(void) { return qt_f32_to_bf16(rng_normal()); }

static void *zalloc(uint64_t bytes) { return calloc(1, bytes ? bytes : 1); }

static void routing_alloc(routing_run *w) {
    const routing_case *c = &w->c;
    uint64_t te = (uint64_t)c->tokens * c->experts, td = (uint64_t)c->tokens * c->cols;
    uint64_t cd = (uint64_t)w->capacity * c->cols;
    w->logits = zalloc(te * 4);
    w->probs = zalloc(te * 4);
    w->dlogits = zalloc(te * 4);
    w->gate = zalloc(w->assignments * 4ull);
    w->dgate = zalloc(w->assignments * 4ull);
    w->expert = zalloc(w->assignments * 4ull);
    w->row_of = zalloc(w->assignments * 4ull);
    w->assign_of = zalloc(w->capacity * 4ull);
    w->dims = zalloc(c->experts * 4ull);
    w->offsets = zalloc((c->experts + 1) * 4ull);
    w->chunk_base = zalloc((uint64_t)w->chunks * c->experts * 4);
    w->x = zalloc(td * 2);
    w->y = zalloc(td * 2);
    w->y2 = zalloc(td * 2);
    w->y3 = zalloc(td * 2);
    w->skip = zalloc(td * 4);
    w->dlb = zalloc(te * 2);
    w->rw = zalloc((uint64_t)c->experts * (c->cols + ROUTER_W_PAD) * 2);
    w->y4 = zalloc(td * 2);
    w->dy = zalloc(td * 2);
    w->xp = zalloc(cd * 2);
    w->yp = zalloc(cd * 2);
    w->dyp = zalloc(cd * 2);
    w->gelu = zalloc(cd * 2);
    w->dgelu = zalloc(cd * 2);
    w->swiglu = zalloc(cd);
    w->dswiglu = zalloc(cd * 2);
    w->amax = zalloc(AMAX_SLOTS * c->experts * 4ull);
    w->pass = zalloc(AMAX_SLOTS * c->experts * 4ull);
}

static void routing_free(routing_run *w) {
    void *all[] = {w->logits, w->probs, w->dlogits, w->gate, w->dgate, w->expert, w->row_of,
                   w->assign_of, w->dims, w->offsets, w->x, w->y, w->y2, w->y3, w->skip, w->dy,
                   w->xp, w->yp, w->dyp, w->gelu, w->dgelu, w->swiglu, w->dswiglu, w->amax,
                   w->pass, w->chunk_base, w->dlb, w->rw, w->y4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

// Inputs from the case's seed: the same on every backend.
static void routing_inputs(routing_run *w, uint64_t seed) {
    const routing_case *c = &w->c;
    rng_state = seed;
    for (uint64_t i = 0; i < (uint64_t)c->tokens * c->experts; i++) {
        uint32_t e = (uint32_t)(i % c->experts);
        float v = 2.0f * rng_normal();
        if (c->logits == LOGITS_ONE_EXPERT && e == c->hot) v = 40.0f;
        if (c->logits == LOGITS_EQUAL) v = 0.5f;
        w->logits[i] = v;
    }
    for (uint64_t i = 0; i < (uint64_t)c->tokens * c->cols; i++) {
        w->x[i] = rng_bf16();
        w->dy[i] = rng_bf16();
    }
    for (uint64_t i = 0; i < (uint64_t)w->capacity * c->cols; i++) w->yp[i] = rng_bf16();
    for (uint64_t i = 0; i < (uint64_t)c->tokens * c->cols; i++) w->skip[i] = rng_normal();
    for (uint64_t i = 0; i < (uint64_t)c->tokens * c->experts; i++) w->dlb[i] = rng_bf16();
    for (uint64_t i = 0; i < (uint64_t)c->experts * (c->cols + ROUTER_W_PAD); i++) {
        w->rw[i] = rng_bf16();
    }
}

static prog_ref rr(rig *g, arena_handle h) { return rig_ref(g, h, 0); }

static prog_ref amax_slot(rig *g, arena_handle h, const routing_case *c, uint32_t slot) {
    return rig_ref(g, h, 4ull * slot * c->experts);
}

// The grouped activations of xp with their amaxes, then a separate qt_fp8_amax pass (its own
// zeroing op) over every tensor that took a fused amax.
static void routing_build_amaxes(rig *g, routing_run *w) {
    const routing_case *c = &w->c;
    program *p = &g->prog;
    const op_group *group = &w->r.group;
    op_act_tensor xp = {rr(g, w->h_xp), QT_DTYPE_BF16}, yp = {rr(g, w->h_yp), QT_DTYPE_BF16};
    op_act_tensor gelu = {rr(g, w->h_gelu), QT_DTYPE_BF16};
    op_act_tensor dgelu = {rr(g, w->h_dgelu), QT_DTYPE_BF16};
    op_act_tensor swiglu = {rr(g, w->h_swiglu), QT_DTYPE_BF16};
    op_act_tensor dswiglu = {rr(g, w->h_dswiglu), QT_DTYPE_BF16};
    RIG_OK(op_act_grouped(p, "gelu", false, QT_ACT_GELU, w->capacity, c->cols, xp, OP_ACT_NONE,
                          gelu, group, amax_slot(g, w->h_amax, c, AMAX_GELU)));
    RIG_OK(op_act_grouped(p, "dgelu", true, QT_ACT_GELU, w->capacity, c->cols, xp, yp, dgelu,
                          group, amax_slot(g, w->h_amax, c, AMAX_DGELU)));
    bool even = c->cols % 2 == 0;
    if (even) {
        RIG_OK(op_act_grouped(p, "swiglu", false, QT_ACT_SWIGLU, w->capacity, c->cols, xp,
                              OP_ACT_NONE, swiglu, group,
                              amax_slot(g, w->h_amax, c, AMAX_SWIGLU)));
        RIG_OK(op_act_grouped(p, "dswiglu", true, QT_ACT_SWIGLU, w->capacity, c->cols, xp,
                              swiglu, dswiglu, group, amax_slot(g, w->h_amax, c, AMAX_DSWIGLU)));
    }
    struct {
        arena_handle h;
        uint32_t cols;
    } tensors[AMAX_SLOTS] = {{w->h_xp, c->cols},     {w->h_gelu, c->cols},
                             {w->h_dgelu, c->cols},  {w->h_swiglu, c->cols / 2},
                             {w->h_dswiglu, c->cols}, {w->h_dyp, c->cols}};
    for (uint32_t s = 0; s < AMAX_SLOTS; s++) {
        if (!even && (s == AMAX_SWIGLU || s == AMAX_DSWIGLU)) continue;
        op_fp8_input in = {rr(g, tensors[s].h), QT_DTYPE_BF16, w->capacity, tensors[s].cols,
                           *group};
        RIG_OK(op_fp8_amax(p, "pass", &in, amax_slot(g, w->h_pass, c, s)));
    }
}

static void routing_build(rig *g, routing_run *w) {
    const routing_case *c = &w->c;
    uint64_t te = (uint64_t)c->tokens * c->experts, td = (uint64_t)c->tokens * c->cols;
    uint64_t cd = (uint64_t)w->capacity * c->cols, a = w->assignments;
    w->h_logits = rig_reserve(g, "logits", te * 4);
    w->h_probs = rig_reserve(g, "probs", te * 4);
    w->h_expert = rig_reserve(g, "expert", a * 4);
    w->h_gate = rig_reserve(g, "gate", a * 4);
    w->h_counts = rig_reserve(g, "chunk_counts", (uint64_t)w->chunks * c->experts * 4);
    w->h_base = rig_reserve(g, "chunk_base", (uint64_t)w->chunks * c->experts * 4);
    w->h_row_of = rig_reserve(g, "row_of", a * 4);
    w->h_assign_of = rig_reserve(g, "assign_of", w->capacity * 4ull);
    w->h_dims = rig_reserve(g, "first_dims", c->experts * 4ull);
    w->h_offsets = rig_reserve(g, "row_offsets", (c->experts + 1) * 4ull);
    w->h_x = rig_reserve(g, "x", td * 2);
    w->h_xp = rig_reserve(g, "xp", cd * 2);
    w->h_yp = rig_reserve(g, "yp", cd * 2);
    w->h_y = rig_reserve(g, "y", td * 2);
    w->h_y2 = rig_reserve(g, "y2", td * 2);
    w->h_y3 = rig_reserve(g, "y3", td * 2);
    w->h_skip = rig_reserve(g, "skip", td * 4);
    w->h_dlb = rig_reserve(g, "dlogits_bf16", te * 2);
    w->h_rw = rig_reserve(g, "router_w", (uint64_t)c->experts * (c->cols + ROUTER_W_PAD) * 2);
    w->h_y4 = rig_reserve(g, "y4", td * 2);
    w->h_dy = rig_reserve(g, "dy", td * 2);
    w->h_dyp = rig_reserve(g, "dyp", cd * 2);
    w->h_dgate = rig_reserve(g, "dgate", a * 4);
    w->h_dlogits = rig_reserve(g, "dlogits", te * 4);
    w->h_amax = rig_reserve(g, "amax", AMAX_SLOTS * c->experts * 4ull);
    w->h_pass = rig_reserve(g, "amax_pass", AMAX_SLOTS * c->experts * 4ull);
    w->h_gelu = rig_reserve(g, "gelu", cd * 2);
    w->h_dgelu = rig_reserve(g, "dgelu", cd * 2);
    w->h_swiglu = rig_reserve(g, "swiglu", cd);
    w->h_dswiglu = rig_reserve(g, "dswiglu", cd * 2);
    op_moe_routing *r = &w->r;
    memset(r, 0, sizeof *r);
    r->tokens = c->tokens;
    r->experts = c->experts;
    r->topk = c->topk;
    r->row_align = c->row_align;
    r->capacity = w->capacity;
    r->logits = rr(g, w->h_logits);
    r->probs = rr(g, w->h_probs);
    r->expert = rr(g, w->h_expert);
    r->gate = rr(g, w->h_gate);
    r->chunk_counts = rr(g, w->h_counts);
    r->chunk_base = rr(g, w->h_base);
    r->row_of = rr(g, w->h_row_of);
    r->assign_of = rr(g, w->h_assign_of);
    r->group = (op_group){c->experts, rr(g, w->h_offsets), rr(g, w->h_dims)};
    r->amax = rr(g, w->h_amax);
    r->amax_slots = AMAX_SLOTS;
    program *p = &g->prog;
    op_moe_tensor yp = {rr(g, w->h_yp), QT_DTYPE_BF16}, y = {rr(g, w->h_y), QT_DTYPE_BF16};
    op_moe_tensor y2 = {rr(g, w->h_y2), QT_DTYPE_BF16}, x = {rr(g, w->h_x), QT_DTYPE_BF16};
    op_moe_tensor dy = {rr(g, w->h_dy), QT_DTYPE_BF16}, dyp = {rr(g, w->h_dyp), QT_DTYPE_BF16};
    op_moe_tensor none = {{NULL, 0, 0}, QT_DTYPE_F32};
    op_moe_tensor dlogits = {rr(g, w->h_dlogits), QT_DTYPE_F32};
    float aux = op_moe_aux_scale(c->aux, c->experts, c->tokens, c->topk);
    RIG_OK(op_moe_route_and_permute(p, "moe", r));
    RIG_OK(op_moe_gather(p, "gather", r, x, c->cols, rr(g, w->h_xp),
                         amax_slot(g, w->h_amax, c, AMAX_XP)));
    RIG_OK(op_moe_combine(p, "combine", r, c->cols, yp, r->gate, none, NULL, y));
    RIG_OK(op_moe_combine(p, "unpermute", r, c->cols, yp, (prog_ref){NULL, 0, 0}, x, NULL, y2));
    // The un-permute of the model's backward pass with a BF16 router (model_moe_router_dx_folded).
    op_moe_router_term term = {{rr(g, w->h_dlb), QT_DTYPE_BF16}, rr(g, w->h_rw),
                               c->cols + ROUTER_W_PAD};
    op_moe_tensor y4 = {rr(g, w->h_y4), QT_DTYPE_BF16};
    RIG_OK(op_moe_combine(p, "unpermute_router", r, c->cols, yp, (prog_ref){NULL, 0, 0}, none,
                          &term, y4));
    // The combine that ends a residual block (model_build.c's mb_moe_residual): gates and the
    // skip path as addend, FP32 as the bench recipes' staged input (the un-permute's is BF16).
    op_moe_tensor y3 = {rr(g, w->h_y3), QT_DTYPE_BF16}, skip = {rr(g, w->h_skip), QT_DTYPE_F32};
    RIG_OK(op_moe_combine(p, "residual", r, c->cols, yp, r->gate, skip, NULL, y3));
    RIG_OK(op_moe_combine_backward(p, "combine_bwd", r, c->cols, dy, yp, dyp,
                                   rr(g, w->h_dgate), amax_slot(g, w->h_amax, c, AMAX_DYP)));
    RIG_OK(op_moe_router_backward(p, "router_bwd", r, rr(g, w->h_dgate), aux, dlogits));
    routing_build_amaxes(g, w);
    rig_bind(g);
}

static void routing_write(rig *g, const routing_run *w) {
    const routing_case *c = &w->c;
    uint64_t te = (uint64_t)c->tokens * c->experts, td = (uint64_t)c->tokens * c->cols;
    RIG_OK(backend_write(&g->be, rr(g, w->h_logits), w->logits, te * 4));
    RIG_OK(backend_write(&g->be, rr(g, w->h_x), w->x, td * 2));
    RIG_OK(backend_write(&g->be, rr(g, w->h_skip), w->skip, td * 4));
    RIG_OK(backend_write(&g->be, rr(g, w->h_dlb), w->dlb, te * 2));
    RIG_OK(backend_write(&g->be, rr(g, w->h_rw), w->rw,
                         (uint64_t)c->experts * (c->cols + ROUTER_W_PAD) * 2));
    RIG_OK(backend_write(&g->be, rr(g, w->h_dy), w->dy, td * 2));
    RIG_OK(backend_write(&g->be, rr(g, w->h_yp), w->yp, (uint64_t)w->capacity * c->cols * 2));
    // The outputs of grouped producers start as UNTOUCHED bytes, so that rows past the active
    // end show whether anything wrote there (and the slots of the skipped SwiGLU stay zero).
    uint64_t cd = (uint64_t)w->capacity * c->cols * 2;
    uint8_t *fill = malloc(cd);
    memset(fill, UNTOUCHED, cd);
    arena_handle outs[] = {w->h_xp, w->h_gelu, w->h_dgelu, w->h_swiglu, w->h_dswiglu, w->h_dyp};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        RIG_OK(backend_write(&g->be, rr(g, outs[i]), fill, outs[i] == w->h_swiglu ? cd / 2 : cd));
    }
    memset(fill, 0, cd);
    RIG_OK(backend_write(&g->be, rr(g, w->h_pass), fill, AMAX_SLOTS * c->experts * 4ull));
    free(fill);
}

static void routing_read(rig *g, routing_run *w) {
    const routing_case *c = &w->c;
    uint64_t te = (uint64_t)c->tokens * c->experts, td = (uint64_t)c->tokens * c->cols;
    uint64_t cd = (uint64_t)w->capacity * c->cols, a = w->assignments;
    struct {
        arena_handle h;
        void *to;
        uint64_t bytes;
    } outs[] = {{w->h_probs, w->probs, te * 4},       {w->h_expert, w->expert, a * 4},
                {w->h_gate, w->gate, a * 4},          {w->h_row_of, w->row_of, a * 4},
                {w->h_assign_of, w->assign_of, w->capacity * 4ull},
                {w->h_dims, w->dims, c->experts * 4ull},
                {w->h_offsets, w->offsets, (c->experts + 1) * 4ull},
                {w->h_xp, w->xp, cd * 2},             {w->h_y, w->y, td * 2},
                {w->h_y2, w->y2, td * 2},             {w->h_y3, w->y3, td * 2},
                {w->h_y4, w->y4, td * 2},
                {w->h_dyp, w->dyp, cd * 2},
                {w->h_dgate, w->dgate, a * 4},        {w->h_dlogits, w->dlogits, te * 4},
                {w->h_gelu, w->gelu, cd * 2},         {w->h_dgelu, w->dgelu, cd * 2},
                {w->h_swiglu, w->swiglu, cd},         {w->h_dswiglu, w->dswiglu, cd * 2},
                {w->h_amax, w->amax, AMAX_SLOTS * c->experts * 4ull},
                {w->h_base, w->chunk_base, (uint64_t)w->chunks * c->experts * 4},
                {w->h_pass, w->pass, AMAX_SLOTS * c->experts * 4ull}};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        RIG_OK(backend_read(&g->be, outs[i].to, rr(g, outs[i].h), outs[i].bytes));
    }
}

static void routing_setup(routing_run *w, const routing_case *c) {
    memset(w, 0, sizeof *w);
    w->c = *c;
    w->assignments = c->tokens * c->topk;
    w->chunks = op_moe_chunks(w->assignments);
    w->capacity = (uint32_t)op_moe_capacity(c->tokens, c->topk, c->experts, c->row_align);
    routing_alloc(w);
    routing_inputs(w, 1000 + c->tokens * 31 + c->experts);
}

// ---------------------------------------------------------------------------------------------
// The definitions, in plain C

static bool member_valid(const routing_run *w, uint32_t r, uint32_t *member) {
    for (uint32_t e = 0; e < w->c.experts; e++) {
        if (r >= w->offsets[e] && r < w->offsets[e + 1]) {
            *member = e;
            return r < w->offsets[e] + w->dims[e];
        }
    }
    *member = UINT32_MAX;
    return false;
}

static void check_softmax_topk(const routing_run *w) {
    const routing_case *c = &w->c;
    uint32_t bad = 0;
    for (uint32_t t = 0; t < c->tokens; t++) {
        const float *l = w->logits + (uint64_t)t * c->experts;
        const float *p = w->probs + (uint64_t)t * c->experts;
        double m = -INFINITY, s = 0;
        for (uint32_t e = 0; e < c->experts; e++) m = l[e] > m ? l[e] : m;
        for (uint32_t e = 0; e < c->experts; e++) s += exp((double)l[e] - m);
        for (uint32_t e = 0; e < c->experts; e++) {
            double x = (double)l[e] - m, ref = exp(x) / s;
            // The FP32 difference l - m rounds by |x| 2^-24 (a relative error of e^x of that
            // size), qt_expf is within 1 ulp, the sum of E terms within E/2 ulp, one division.
            double rel = 4e-7 + c->experts * 6e-8 + fabs(x) * 6e-8;
            if (fabs(p[e] - ref) > rel * ref + 1e-37 && bad++ < 4) {
                CHECK(false, "token %u expert %u: prob %.9g, softmax %.9g", t, e, p[e], ref);
            }
        }
        const uint32_t *ch = w->expert + (uint64_t)t * c->topk;
        for (uint32_t j = 0; j < c->topk; j++) {
            CHECK(ch[j] < c->experts, "token %u choice %u: expert %u", t, j, ch[j]);
            if (ch[j] >= c->experts) return;
            CHECK(w->gate[(uint64_t)t * c->topk + j] == p[ch[j]], "token %u: gate is not prob",
                  t);
            // Each choice comes strictly after the previous one in the order.
            if (j > 0) {
                float pa = p[ch[j - 1]], pb = p[ch[j]];
                CHECK(pa > pb || (pa == pb && ch[j - 1] < ch[j]), "token %u: choices %u, %u "
                      "out of order (%g, %g)", t, ch[j - 1], ch[j], pa, pb);
            }
        }
        // Every expert not chosen comes after the last choice.
        float pl = p[ch[c->topk - 1]];
        for (uint32_t e = 0; e < c->experts; e++) {
            bool chosen = false;
            for (uint32_t j = 0; j < c->topk; j++) chosen |= ch[j] == e;
            if (chosen) continue;
            bool after = p[e] < pl || (p[e] == pl && e > ch[c->topk - 1]);
            if (!after && bad++ < 4) CHECK(false, "token %u: expert %u left out before", t, e);
        }
    }
}

static void check_permutation(const routing_run *w) {
    const routing_case *c = &w->c;
    uint32_t *count = zalloc(c->experts * 4ull);
    // The scan's prefix: each chunk's base is the expert's assignments in the chunks before it.
    for (uint32_t a = 0; a < w->assignments; a++) {
        uint32_t e = w->expert[a];
        if (a % QT_MOE_CHUNK == 0) {
            for (uint32_t f = 0; f < c->experts; f++) {
                uint32_t got = w->chunk_base[(uint64_t)(a / QT_MOE_CHUNK) * c->experts + f];
                CHECK(got == count[f], "chunk %u expert %u: base %u, %u before it",
                      a / QT_MOE_CHUNK, f, got, count[f]);
                if (got != count[f]) break;
            }
        }
        count[e]++;
    }
    CHECK(w->offsets[0] == 0, "row_offsets[0] = %u", w->offsets[0]);
    for (uint32_t e = 0; e < c->experts; e++) {
        CHECK(w->dims[e] == count[e], "expert %u: first_dims %u, %u assignments", e, w->dims[e],
              count[e]);
        uint32_t padded = (count[e] + c->row_align - 1) / c->row_align * c->row_align;
        CHECK(w->offsets[e + 1] == w->offsets[e] + padded, "expert %u: offsets %u -> %u, padded "
              "%u", e, w->offsets[e], w->offsets[e + 1], padded);
    }
    CHECK(w->offsets[c->experts] <= w->capacity, "active rows %u beyond capacity %u",
          w->offsets[c->experts], w->capacity);
    uint32_t bad = 0;
    for (uint32_t a = 0; a < w->assignments; a++) {
        uint32_t r = w->row_of[a], e = w->expert[a], member;
        bool ok = r < w->capacity && w->assign_of[r] == a && member_valid(w, r, &member) &&
                  member == e;
        if (!ok && bad++ < 4) CHECK(false, "assignment %u (expert %u): row %u", a, e, r);
    }
    // Stable: each expert's rows hold its assignments in increasing order.
    for (uint32_t e = 0; e < c->experts; e++) {
        for (uint32_t r = w->offsets[e] + 1; r < w->offsets[e] + w->dims[e]; r++) {
            if (w->assign_of[r] <= w->assign_of[r - 1] && bad++ < 4) {
                CHECK(false, "expert %u rows %u, %u: assignments %u, %u", e, r - 1, r,
                      w->assign_of[r - 1], w->assign_of[r]);
            }
        }
    }
    free(count);
}

static float bf(uint16_t v) { return qt_bf16_to_f32(v); }

static void check_gather_combine(const routing_run *w) {
    const routing_case *c = &w->c;
    uint32_t bad = 0, active = w->offsets[c->experts];
    for (uint32_t r = 0; r < active; r++) {
        uint32_t member;
        bool valid = member_valid(w, r, &member);
        const uint16_t *row = w->xp + (uint64_t)r * c->cols;
        const uint16_t *dyp = w->dyp + (uint64_t)r * c->cols;
        uint32_t t = valid ? w->assign_of[r] / c->topk : 0;
        float g = valid ? w->gate[w->assign_of[r]] : 0.0f;
        double dot = 0, mag = 0;
        for (uint32_t i = 0; i < c->cols; i++) {
            uint16_t want = valid ? w->x[(uint64_t)t * c->cols + i] : 0;
            uint16_t dwant = valid ? qt_f32_to_bf16(g * bf(w->dy[(uint64_t)t * c->cols + i])) : 0;
            if ((row[i] != want || dyp[i] != dwant) && bad++ < 4) {
                CHECK(false, "row %u col %u: xp %04x (want %04x), dyp %04x (want %04x)", r, i,
                      row[i], want, dyp[i], dwant);
            }
            double term = (double)bf(w->dy[(uint64_t)t * c->cols + i]) *
                          bf(w->yp[(uint64_t)r * c->cols + i]);
            dot += term;
            mag += fabs(term);
        }
        // FP32 accumulation of cols products: within cols * 2^-24 of their magnitude.
        if (valid && fabs(w->dgate[w->assign_of[r]] - dot) > 1e-7 * c->cols * mag + 1e-30 &&
            bad++ < 4) {
            CHECK(false, "row %u: dgate %g, dot %g", r, w->dgate[w->assign_of[r]], dot);
        }
    }
    // combine: the FP32 fma chain over the choices in order from 0 (or from the addend), one
    // rounding to BF16.
    for (uint32_t t = 0; t < c->tokens; t++) {
        for (uint32_t i = 0; i < c->cols; i++) {
            float acc = 0.0f, acc2 = bf(w->x[(uint64_t)t * c->cols + i]);
            float acc3 = w->skip[(uint64_t)t * c->cols + i];
            // The router term first: dlogits . W[:, i] in expert order, then the choices.
            float acc4 = 0.0f;
            for (uint32_t e = 0; e < c->experts; e++) {
                acc4 = fmaf(bf(w->dlb[(uint64_t)t * c->experts + e]),
                            bf(w->rw[(uint64_t)e * (c->cols + ROUTER_W_PAD) + i]), acc4);
            }
            for (uint32_t j = 0; j < c->topk; j++) {
                uint32_t a = t * c->topk + j;
                float v = bf(w->yp[(uint64_t)w->row_of[a] * c->cols + i]);
                acc = fmaf(w->gate[a], v, acc);
                acc2 = acc2 + v;
                acc3 = fmaf(w->gate[a], v, acc3);
                acc4 = acc4 + v;
            }
            uint64_t k = (uint64_t)t * c->cols + i;
            if ((w->y[k] != qt_f32_to_bf16(acc) || w->y2[k] != qt_f32_to_bf16(acc2) ||
                 w->y3[k] != qt_f32_to_bf16(acc3) || w->y4[k] != qt_f32_to_bf16(acc4)) &&
                bad++ < 4) {
                CHECK(false, "token %u col %u: combine %04x (want %04x), un-permute %04x (want "
                      "%04x), residual %04x (want %04x), with the router %04x (want %04x)", t,
                      i, w->y[k], qt_f32_to_bf16(acc), w->y2[k], qt_f32_to_bf16(acc2), w->y3[k],
                      qt_f32_to_bf16(acc3), w->y4[k], qt_f32_to_bf16(acc4));
            }
        }
    }
}

// The producers' amaxes are the separate passes' bits; each member with rows has a positive one
// and an empty member 0; the rows past the active end of every grouped output kept their bytes.
static void check_amaxes(const routing_run *w) {
    const routing_case *c = &w->c;
    static const char *const what[AMAX_SLOTS] = {"xp", "gelu", "dgelu", "swiglu", "dswiglu",
                                                 "dyp"};
    uint32_t bad = 0;
    for (uint32_t s = 0; s < AMAX_SLOTS; s++) {
        if (c->cols % 2 != 0 && (s == AMAX_SWIGLU || s == AMAX_DSWIGLU)) continue;
        for (uint32_t e = 0; e < c->experts; e++) {
            float got = w->amax[s * c->experts + e], want = w->pass[s * c->experts + e];
            bool ok = memcmp(&got, &want, 4) == 0 && (w->dims[e] > 0 ? want > 0.0f : want == 0.0f);
            if (!ok && bad++ < 4) {
                CHECK(false, "%s amax of expert %u (%u rows): %a, separate pass %a", what[s], e,
                      w->dims[e], got, want);
            }
        }
    }
    uint32_t active = w->offsets[c->experts];
    const uint16_t *outs[] = {w->xp, w->gelu, w->dgelu, w->swiglu, w->dswiglu, w->dyp};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        uint64_t cols = outs[i] == w->swiglu ? c->cols / 2 : c->cols;
        const uint8_t *tail = (const uint8_t *)(outs[i] + active * cols);
        for (uint64_t b = 0; b < (w->capacity - active) * cols * 2; b++) {
            if (tail[b] != UNTOUCHED && bad++ < 4) {
                CHECK(false, "%s: byte %llu past the active end (row %u) was written", what[i],
                      (unsigned long long)b, active);
                break;
            }
        }
    }
}

static void check_router_grad(const routing_run *w) {
    const routing_case *c = &w->c;
    double aux = (double)c->aux * c->experts / ((double)c->tokens * c->tokens * c->topk);
    uint32_t bad = 0;
    double *g = zalloc(c->experts * 8ull);
    for (uint32_t t = 0; t < c->tokens; t++) {
        const float *p = w->probs + (uint64_t)t * c->experts;
        double s = 0, mag = 0;
        for (uint32_t e = 0; e < c->experts; e++) g[e] = aux * w->dims[e];
        for (uint32_t j = 0; j < c->topk; j++) {
            g[w->expert[t * c->topk + j]] += w->dgate[t * c->topk + j];
        }
        for (uint32_t e = 0; e < c->experts; e++) {
            s += p[e] * g[e];
            mag += fabs(p[e] * g[e]);
        }
        for (uint32_t e = 0; e < c->experts; e++) {
            double want = p[e] * (g[e] - s);
            double got = w->dlogits[(uint64_t)t * c->experts + e];
            // s sums E products in FP32 (E ulps of their magnitudes), g - s one more rounding.
            double tol = (c->experts + 4) * 1.2e-7 * (p[e] * (fabs(g[e]) + mag)) + 1e-37;
            if (fabs(got - want) > tol && bad++ < 4) {
                CHECK(false, "token %u expert %u: dlogit %g, want %g", t, e, got, want);
            }
        }
    }
    free(g);
}

static const routing_case routing_cases[] = {
    {37, 1, 1, 24, 16, LOGITS_RANDOM, 0, 0.01f},
    {64, 8, 2, 32, 16, LOGITS_RANDOM, 0, 0.01f},
    {100, 64, 2, 40, 32, LOGITS_RANDOM, 0, 0.1f},     // most experts empty
    {50, 65, 3, 16, 16, LOGITS_RANDOM, 0, 0.01f},
    {300, 256, 2, 8, 128, LOGITS_RANDOM, 0, 0.01f},   // several chunks, 128-row members
    {20, 8, 8, 16, 16, LOGITS_RANDOM, 0, 0.01f},      // topk = experts
    {600, 8, 2, 16, 32, LOGITS_ONE_EXPERT, 5, 0.01f},  // every token's first choice is 5
    {530, 8, 1, 24, 16, LOGITS_ONE_EXPERT, 7, 0.01f},  // every token in expert 7 alone
    {130, 4, 2, 16, 16, LOGITS_EQUAL, 0, 0.0f},       // ties: experts 0 and 1 for every token
    {70, 8, 2, 13, 16, LOGITS_RANDOM, 0, 0.01f},      // odd rows: the element paths
    {1000, 8, 2, 264, 16, LOGITS_RANDOM, 0, 0.01f},   // 8 chunks; rows of 33 vectors
    {300, 16, 5, 24, 16, LOGITS_RANDOM, 0, 0.01f},    // top-5: two rounds of loads in combine
    {2500, 64, 4, 16, 16, LOGITS_RANDOM, 0, 0.01f},   // 40 chunks: several per warp of the scan
    {400, 1024, 2, 8, 16, LOGITS_RANDOM, 0, 0.01f},   // the most experts: 32 blocks of the scan
    // 2^21 SwiGLU outputs and more: the grouped table kernels (op_act.c, op_swiglu_lut_takes).
    {8200, 8, 2, 512, 16, LOGITS_RANDOM, 0, 0.01f},
};
#define ROUTING_CASES (sizeof routing_cases / sizeof routing_cases[0])

// The same programs on the GPU, eagerly and as a graph, against the reference backend: every
// output byte for byte (rows past the active end are never written and are not compared).
static bool same_bytes(const void *a, const void *b, uint64_t bytes, const char *what,
                       size_t i) {
    if (memcmp(a, b, bytes) == 0) return true;
    uint64_t first = 0;
    while (((const uint8_t *)a)[first] == ((const uint8_t *)b)[first]) first++;
    CHECK(false, "case %zu: %s differs at byte %llu", i, what, (unsigned long long)first);
    return false;
}

static void routing_compare(const routing_run *gw, const routing_run *rw, size_t i) {
    const routing_case *c = &rw->c;
    uint64_t te = (uint64_t)c->tokens * c->experts * 4, td = (uint64_t)c->tokens * c->cols * 2;
    uint64_t a = rw->assignments * 4ull;
    uint64_t active_rows = rw->offsets[c->experts];
    same_bytes(gw->probs, rw->probs, te, "probs", i);
    same_bytes(gw->expert, rw->expert, a, "expert", i);
    same_bytes(gw->gate, rw->gate, a, "gate", i);
    same_bytes(gw->dims, rw->dims, c->experts * 4ull, "first_dims", i);
    same_bytes(gw->offsets, rw->offsets, (c->experts + 1) * 4ull, "row_offsets", i);
    same_bytes(gw->row_of, rw->row_of, a, "row_of", i);
    same_bytes(gw->chunk_base, rw->chunk_base, (uint64_t)rw->chunks * c->experts * 4,
               "chunk_base", i);
    same_bytes(gw->xp, rw->xp, active_rows * c->cols * 2, "xp", i);
    same_bytes(gw->y, rw->y, td, "combine", i);
    same_bytes(gw->y2, rw->y2, td, "un-permute", i);
    same_bytes(gw->y3, rw->y3, td, "residual combine", i);
    same_bytes(gw->y4, rw->y4, td, "un-permute with the router's gradient", i);
    same_bytes(gw->dyp, rw->dyp, active_rows * c->cols * 2, "dyp", i);
    same_bytes(gw->dgate, rw->dgate, a, "dgate", i);
    same_bytes(gw->dlogits, rw->dlogits, te, "dlogits", i);
    same_bytes(gw->gelu, rw->gelu, active_rows * c->cols * 2, "gelu", i);
    same_bytes(gw->dgelu, rw->dgelu, active_rows * c->cols * 2, "dgelu", i);
    same_bytes(gw->swiglu, rw->swiglu, active_rows * c->cols, "swiglu", i);
    same_bytes(gw->dswiglu, rw->dswiglu, active_rows * c->cols * 2, "dswiglu", i);
    same_bytes(gw->amax, rw->amax, AMAX_SLOTS * c->experts * 4ull, "amax", i);
    same_bytes(gw->pass, rw->pass, AMAX_SLOTS * c->experts * 4ull, "amax pass", i);
}

static void test_routing_ref(void) {
    test_begin("moe_routing_twins_against_definitions");
    for (size_t i = 0; i < ROUTING_CASES; i++) {
        static rig g;
        const char *why = NULL;
        rig_open(&g, BACKEND_REF, &why);
        routing_run w;
        routing_setup(&w, &routing_cases[i]);
        routing_build(&g, &w);
        routing_write(&g, &w);
        RIG_OK(backend_run(&g.be, &g.prog));
        routing_read(&g, &w);
        int before = test_case_failures;
        check_softmax_topk(&w);
        check_permutation(&w);
        check_gather_combine(&w);
        check_router_grad(&w);
        check_amaxes(&w);
        const routing_case *c = &routing_cases[i];
        if (c->logits == LOGITS_ONE_EXPERT && c->topk == 1) {
            CHECK(w.dims[c->hot] == c->tokens, "expert %u holds %u of %u tokens", c->hot,
                  w.dims[c->hot], c->tokens);
        }
        if (c->logits == LOGITS_EQUAL) {
            CHECK(w.dims[0] == c->tokens && w.dims[1] == c->tokens && w.dims[2] == 0,
                  "ties: counts %u %u %u", w.dims[0], w.dims[1], w.dims[2]);
        }
        // Every op once more, each twice in a row (what `qtrain run --profile` does to time
        // it): the routing's ops are idempotent, so the outputs stay those of one run.
        routing_run again = w;
        routing_alloc(&again);
        for (uint32_t j = 0; j < g.prog.op_count; j++) {
            backend_ref_op(&g.prog.ops[j]);
            backend_ref_op(&g.prog.ops[j]);
        }
        routing_read(&g, &again);
        routing_compare(&again, &w, i);
        routing_free(&again);
        if (test_case_failures != before) {
            printf("  in case %zu: %u tokens, %u experts, top-%u\n", i, c->tokens, c->experts,
                   c->topk);
        }
        routing_free(&w);
        rig_close(&g);
    }
    test_end();
}

static void test_routing_gpu(void) {
    const char *name = "gpu_moe_routing_equals_ref_eager_and_graph";
    for (size_t i = 0; i < ROUTING_CASES; i++) {
        static rig gpu, ref;
        const char *why = NULL;
        if (i == 0) test_begin(name);
        if (!rig_open(&gpu, BACKEND_GPU, &why)) {
            test_skip(name, why);
            return;
        }
        rig_open(&ref, BACKEND_REF, &why);
        routing_run gw, rw;
        routing_setup(&gw, &routing_cases[i]);
        routing_setup(&rw, &routing_cases[i]);
        routing_build(&gpu, &gw);
        routing_build(&ref, &rw);
        routing_write(&ref, &rw);
        RIG_OK(backend_run(&ref.be, &ref.prog));
        routing_read(&ref, &rw);
        for (int graph = 0; graph < 2; graph++) {
            routing_write(&gpu, &gw);
            if (graph) {
                backend_graph bg;
                RIG_OK(backend_capture(&gpu.be, &gpu.prog, &bg));
                RIG_OK(backend_launch(&gpu.be, &bg));
                RIG_OK(backend_finish(&gpu.be));
                backend_graph_destroy(&gpu.be, &bg);
            } else {
                RIG_OK(backend_run(&gpu.be, &gpu.prog));
                RIG_OK(backend_finish(&gpu.be));
            }
            routing_read(&gpu, &gw);
            routing_compare(&gw, &rw, i);
            check_amaxes(&gw);
        }
        routing_free(&gw);
        routing_free(&rw);
        rig_close(&gpu);
        rig_close(&ref);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Expert GEMMs: grouped tensors and stacked weights against per-expert dense GEMMs

typedef enum stack_format { STACK_CURRENT, STACK_MXFP8, STACK_BLOCK, STACK_NVFP4 } stack_format;

// One quantized tensor, both directions (the layouts of ptx/quant.h).
typedef struct stack_q {
    uint32_t rows, cols;
    prog_ref row_data, row_scale, col_data, col_scale, tensor_scale, amax_col;
} stack_q;

static prog_ref stack_region(rig *g, const char *name, uint64_t bytes) {
    return rr(g, rig_reserve(g, name, bytes ? (bytes + 15) / 16 * 16 : 16));
}

// Expert e's region "<what><e>".
static prog_ref stack_expert_region(rig *g, const char *what, int e, uint64_t bytes) {
    char name[32];
    snprintf(name, sizeof name, "%s%d", what, e);
    return stack_region(g, name, bytes);
}

// Quantizes x [rows][cols] (f32 for weights, bf16 otherwise) in format f; `group` count 0:
// dense. Weights use the 2-D tiles of the built-in recipes, activations NVFP4's RHT.
static stack_q stack_quantize(rig *g, const char *name, stack_format f, prog_ref x,
                              uint32_t dtype, uint32_t rows, uint32_t cols, op_group group,
                              bool weight) {
    stack_q q = {rows, cols, {0}, {0}, {0}, {0}, {0}, {0}};
    program *p = &g->prog;
    uint32_t tensors = group.count ? group.count : 1;
    uint64_t elems = (uint64_t)rows * cols;
    char part[64];
    snprintf(part, sizeof part, "%s.row_data", name);
    q.row_data = stack_region(g, part, f == STACK_NVFP4 ? op_nvfp4_sizes_of(rows, cols, 0)
                                                              .row_data : elems);
    snprintf(part, sizeof part, "%s.col_data", name);
    q.col_data = stack_region(g, part, f == STACK_NVFP4 ? op_nvfp4_sizes_of(rows, cols, 0)
                                                              .col_data : elems);
    snprintf(part, sizeof part, "%s.tensor", name);
    q.tensor_scale = stack_region(g, part, 4ull * tensors);
    snprintf(part, sizeof part, "%s.row_scale", name);
    switch (f) {
    case STACK_CURRENT: {
        snprintf(part, sizeof part, "%s.amax", name);
        prog_ref amax = stack_region(g, part, 4ull * tensors);
        op_fp8_input in = {x, dtype, rows, cols, group};
        op_fp8_output out = {QT_FP8_E4M3, q.row_data, q.col_data, q.tensor_scale};
        RIG_OK(op_fp8_quantize_current(p, name, &in, &out, amax, OP_FP8_NONE, false, 0.0f));
        break;
    }
    case STACK_MXFP8: {
        q.row_scale = stack_region(g, part, op_mxfp8_row_scales_bytes(rows, cols));
        snprintf(part, sizeof part, "%s.col_scale", name);
        q.col_scale = stack_region(g, part, op_mxfp8_col_scales_bytes(rows, cols));
        op_mxfp8_quantize_desc d = {x,     dtype, rows,  cols, QT_ELEM_E4M3,
                                    weight, false, false, {q.row_data, q.row_scale},
                                    {q.col_data, q.col_scale}, group};
        RIG_OK(op_mxfp8_quantize(p, name, &d));
        break;
    }
    case STACK_BLOCK: {
        q.row_scale = stack_region(g, part, 4 * op_block_scale_count(rows, cols, weight, false));
        snprintf(part, sizeof part, "%s.col_scale", name);
        q.col_scale = stack_region(g, part, 4 * op_block_scale_count(rows, cols, weight, true));
        op_block_tensor t = {rows, cols, weight, QT_BLOCK_E4M3, true, true, q.row_data,
                             q.row_scale, q.col_data, q.col_scale, group};
        RIG_OK(op_quant_block(p, name, x, dtype, &t, NULL));
        break;
    }
    case STACK_NVFP4: {
        op_nvfp4_sizes z = op_nvfp4_sizes_of(rows, cols, 0);
        q.row_scale = stack_region(g, part, z.row_scales);
        snprintf(part, sizeof part, "%s.col_scale", name);
        q.col_scale = stack_region(g, part, z.col_scales);
        snprintf(part, sizeof part, "%s.amax_col", name);
        q.amax_col = stack_region(g, part, 4ull * tensors);
        op_nvfp4_input in = {x, dtype, rows, cols, group};
        op_nvfp4_amax_out amax = {q.tensor_scale, q.amax_col, !weight, QT_NVFP4_RHT_SIGNS_TE};
        RIG_OK(op_nvfp4_amax(p, name, &in, &amax));
        op_nvfp4_quant nq = {0};
        nq.rowwise = nq.colwise = true;
        nq.rht = !weight;
        nq.rht_signs = QT_NVFP4_RHT_SIGNS_TE;
        nq.two_d = weight;
        nq.amax_row = q.tensor_scale;
        nq.amax_col = q.amax_col;
        nq.row_data = q.row_data;
        nq.row_scales = q.row_scale;
        nq.col_data = q.col_data;
        nq.col_scales = q.col_scale;
        RIG_OK(op_nvfp4_quantize(p, name, &in, &nq));
        break;
    }
    }
    return q;
}

static const uint32_t stack_gemm_formats[4] = {GEMM_FORMAT_FP8, GEMM_FORMAT_MXFP8,
                                               GEMM_FORMAT_FP8_BLOCK, GEMM_FORMAT_NVFP4};

// The operand of q read in one direction; stacked: q holds `stacked` members of q.rows /
// stacked rows; per_member: tensor scales per member.
static op_gemm_operand stack_operand(const stack_q *q, stack_format f, bool colwise,
                                     bool weight, uint32_t stacked, bool per_member) {
    uint32_t gf = stack_gemm_formats[f];
    bool scaled = f != STACK_CURRENT;
    prog_ref tensor = f == STACK_CURRENT || f == STACK_NVFP4
                          ? (colwise && f == STACK_NVFP4 ? q->amax_col : q->tensor_scale)
                          : (prog_ref){0};
    op_gemm_operand o = op_gemm_operand_of(gf, f == STACK_NVFP4 ? GEMM_ELEM_E2M1
                                                                : GEMM_ELEM_E4M3,
                                           q->rows, q->cols, colwise,
                                           f == STACK_BLOCK && weight,
                                           colwise ? q->col_data : q->row_data,
                                           scaled ? (colwise ? q->col_scale : q->row_scale)
                                                  : (prog_ref){0},
                                           tensor);
    if (stacked) {
        op_gemm_operand_stack(&o, gf, f == STACK_BLOCK && weight, colwise, q->rows / stacked,
                              q->cols);
    }
    if (per_member && prog_ref_present(tensor)) o.flags |= GEMM_OPERAND_TENSOR_PER_MEMBER;
    return o;
}

static op_gemm_desc stack_gemm(stack_format f, uint32_t grouping, op_group group, uint32_t m,
                               uint32_t n, uint32_t k, op_gemm_operand a, op_gemm_operand b,
                               prog_ref d, uint32_t d_dtype, bool fprop) {
    op_gemm_desc g = {0};
    g.format = stack_gemm_formats[f];
    g.grouping = grouping;
    g.flags = f == STACK_CURRENT && !fprop ? GEMM_FLAG_SPLIT_ACCUMULATE : 0u;
    g.m = m, g.n = n, g.k = k;
    g.a = a, g.b = b;
    g.alpha = 1.0f;
    g.d = d;
    g.d_dtype = d_dtype;
    if (grouping != GEMM_DENSE) {
        g.count = group.count;
        g.row_offsets = group.row_offsets;
        g.first_dims = group.first_dims;
    }
    return g;
}

#define STACK_EXPERTS 3

// The sm_90a tier's rule (plain C over the args, so checked without a GPU too) takes the
// grouped GEMMs of the formats whose expert GEMMs are all K-major: M-grouped B with its members
// side by side in the rows of the weights' columnwise copy, K-grouped wgrad. On the GPU every
// GEMM then runs on the tier: the grouped ones must give the bits of the dense ones, which the
// tier computes over the same stages.
static void stack_check_tier(rig *g, stack_format f, const uint32_t grouped_ops[3], bool gpu) {
    static const char *const grouped_names[3] = {"fprop", "dgrad", "wgrad"};
    for (int i = 0; i < 3 && (f == STACK_CURRENT || f == STACK_BLOCK); i++) {
        gemm_args args;
        memcpy(&args, g->prog.ops[grouped_ops[i]].args, sizeof args);
        CHECK(gemm_tier_sm90a_supports(&args), "the sm_90a tier's rule refuses the grouped %s",
              grouped_names[i]);
    }
    if (!gpu) return;
    g->be.gemm_tier = BACKEND_GEMM_TIER_SM90A;
    gemm_tier_device tier = backend_gemm_device(&g->be);
    for (int i = 0; i < 3; i++) {
        CHECK(gemm_tier_takes(&tier, &g->prog.ops[grouped_ops[i]]),
              "the sm_90a tier did not take the grouped %s", grouped_names[i]);
    }
}

// Each expert's rows of the grouped fprop and dgrad outputs, and its weight gradient, against
// the dense GEMMs of that expert alone (one[i][e]); an empty expert's weight gradient is zero.
static void stack_compare(rig *g, const uint32_t *off, const uint32_t *dims, uint32_t n,
                          uint32_t k, const prog_ref all[3], const prog_ref *const one[3]) {
    static const char *const what[3] = {"fprop", "dgrad", "wgrad"};
    uint8_t *got = zalloc((uint64_t)STACK_EXPERTS * n * k * 4);
    for (int e = 0; e < STACK_EXPERTS; e++) {
        uint32_t rows = off[e + 1] - off[e];
        uint64_t offset[3] = {(uint64_t)off[e] * n * 2, (uint64_t)off[e] * k * 2,
                              (uint64_t)e * n * k * 4};
        uint64_t bytes[3] = {(uint64_t)rows * n * 2, (uint64_t)rows * k * 2,
                             (uint64_t)n * k * 4};
        for (int i = 0; i < 3; i++) {
            if (rows == 0 && i < 2) continue;
            uint8_t *want = zalloc(bytes[i]);
            prog_ref at = all[i];
            at.offset += offset[i];
            RIG_OK(backend_read(&g->be, got, at, bytes[i]));
            if (rows > 0) RIG_OK(backend_read(&g->be, want, one[i][e], bytes[i]));
            CHECK(memcmp(got, want, bytes[i]) == 0, "expert %d (%u rows): %s differs", e,
                  dims[e], what[i]);
            free(want);
        }
    }
    free(got);
}

static void test_stacked_gemms(stack_format f, const char *label, bool gpu) {
    char name[112];
    snprintf(name, sizeof name, "%smoe_expert_gemms_equal_per_expert_dense_gemms_%s",
             gpu ? "gpu_sm90a_" : "", label);
    test_begin(name);
    bool block = f == STACK_BLOCK;
    uint32_t align = block ? 128 : 32, n = block ? 128 : 32, k = block ? 160 : 48;
    uint32_t dims[STACK_EXPERTS] = {7, 0, block ? 130 : 45}, off[STACK_EXPERTS + 1] = {0};
    uint32_t whole[STACK_EXPERTS];
    for (int e = 0; e < STACK_EXPERTS; e++) {
        off[e + 1] = off[e] + (dims[e] + align - 1) / align * align;
        whole[e] = (dims[e] + 15) / 16 * 16;
    }
    uint32_t cap = off[STACK_EXPERTS] + align;  // a spare member's rows past the active end
    static rig ref_rig, gpu_rig;
    rig *g = gpu ? &gpu_rig : &ref_rig;
    const char *why = NULL;
    if (!rig_open(g, gpu ? BACKEND_GPU : BACKEND_REF, &why)) {
        test_skip(name, why);
        return;
    }
    if (gpu && (g->be.info.cc_major != 9 || g->be.info.cc_minor != 0)) {
        rig_close(g);
        test_skip(name, "the sm_90a GEMM tier needs a compute capability 9.0 GPU");
        return;
    }
    rng_state = 77 + f;
    float *w = zalloc((uint64_t)STACK_EXPERTS * n * k * 4);
    uint16_t *x = zalloc((uint64_t)cap * k * 2), *dy = zalloc((uint64_t)cap * n * 2);
    for (uint64_t i = 0; i < (uint64_t)STACK_EXPERTS * n * k; i++) w[i] = rng_normal() * 0.2f;
    for (int e = 0; e < STACK_EXPERTS; e++) {
        for (uint32_t r = off[e]; r < off[e] + dims[e]; r++) {
            for (uint32_t c = 0; c < k; c++) x[(uint64_t)r * k + c] = rng_bf16();
            for (uint32_t c = 0; c < n; c++) dy[(uint64_t)r * n + c] = rng_bf16();
        }
    }
    prog_ref hw = stack_region(g, "w", (uint64_t)STACK_EXPERTS * n * k * 4);
    prog_ref hx = stack_region(g, "x", (uint64_t)cap * k * 2);
    prog_ref hdy = stack_region(g, "dy", (uint64_t)cap * n * 2);
    prog_ref hoff = stack_region(g, "off", sizeof off), hdims = stack_region(g, "dims", 12);
    prog_ref hwhole = stack_region(g, "whole", 12);
    prog_ref woff = stack_region(g, "woff", 16), wdims = stack_region(g, "wdims", 12);
    op_group routing = {STACK_EXPERTS, hoff, hdims}, stack = {STACK_EXPERTS, woff, wdims};
    op_group contraction = {STACK_EXPERTS, hoff, f == STACK_NVFP4 ? hwhole : hdims};
    RIG_OK(op_moe_uniform_group(&g->prog, "stack", &stack, n));
    stack_q qw = stack_quantize(g, "qw", f, hw, QT_DTYPE_F32, STACK_EXPERTS * n, k, stack,
                                true);
    stack_q qx = stack_quantize(g, "qx", f, hx, QT_DTYPE_BF16, cap, k, routing, false);
    stack_q qdy = stack_quantize(g, "qdy", f, hdy, QT_DTYPE_BF16, cap, n, routing, false);
    prog_ref y = stack_region(g, "y", (uint64_t)cap * n * 2);
    prog_ref dx = stack_region(g, "dx", (uint64_t)cap * k * 2);
    prog_ref dw = stack_region(g, "dw", (uint64_t)STACK_EXPERTS * n * k * 4);
    op_gemm_desc gd;
    gd = stack_gemm(f, GEMM_GROUP_M, routing, cap, n, k,
                    stack_operand(&qx, f, false, false, 0, true),
                    stack_operand(&qw, f, false, true, STACK_EXPERTS, true), y, QT_DTYPE_BF16,
                    true);
    RIG_OK(op_gemm(&g->prog, "fprop", &gd));
    uint32_t grouped_ops[3];  // the op of each grouped GEMM
    grouped_ops[0] = g->prog.op_count - 1;
    gd = stack_gemm(f, GEMM_GROUP_M, routing, cap, k, n,
                    stack_operand(&qdy, f, false, false, 0, true),
                    stack_operand(&qw, f, true, true, STACK_EXPERTS, true), dx, QT_DTYPE_BF16,
                    false);
    RIG_OK(op_gemm(&g->prog, "dgrad", &gd));
    grouped_ops[1] = g->prog.op_count - 1;
    gd = stack_gemm(f, GEMM_GROUP_K, contraction, n, k, cap,
                    stack_operand(&qdy, f, true, false, 0, true),
                    stack_operand(&qx, f, true, false, 0, true), dw, QT_DTYPE_F32, false);
    RIG_OK(op_gemm(&g->prog, "wgrad", &gd));
    grouped_ops[2] = g->prog.op_count - 1;
    // Each non-empty expert alone: its weight, and its padded rows as dense tensors.
    prog_ref ew[STACK_EXPERTS], ex[STACK_EXPERTS], edy[STACK_EXPERTS];
    prog_ref ey[STACK_EXPERTS], edx[STACK_EXPERTS], edw[STACK_EXPERTS];
    for (int e = 0; e < STACK_EXPERTS; e++) {
        uint32_t rows = off[e + 1] - off[e];
        if (rows == 0) continue;
        ew[e] = stack_expert_region(g, "w", e, (uint64_t)n * k * 4);
        ex[e] = stack_expert_region(g, "x", e, (uint64_t)rows * k * 2);
        edy[e] = stack_expert_region(g, "dy", e, (uint64_t)rows * n * 2);
        ey[e] = stack_expert_region(g, "y", e, (uint64_t)rows * n * 2);
        edx[e] = stack_expert_region(g, "dx", e, (uint64_t)rows * k * 2);
        edw[e] = stack_expert_region(g, "dw", e, (uint64_t)n * k * 4);
        char part[32];
        snprintf(part, sizeof part, "qw%d", e);
        stack_q dw_q = stack_quantize(g, part, f, ew[e], QT_DTYPE_F32, n, k, op_group_dense(),
                                      true);
        snprintf(part, sizeof part, "qx%d", e);
        stack_q dx_q = stack_quantize(g, part, f, ex[e], QT_DTYPE_BF16, rows, k,
                                      op_group_dense(), false);
        snprintf(part, sizeof part, "qdy%d", e);
        stack_q ddy_q = stack_quantize(g, part, f, edy[e], QT_DTYPE_BF16, rows, n,
                                       op_group_dense(), false);
        op_group none = op_group_dense();
        gd = stack_gemm(f, GEMM_DENSE, none, rows, n, k, stack_operand(&dx_q, f, false, false,
                        0, false), stack_operand(&dw_q, f, false, true, 0, false), ey[e],
                        QT_DTYPE_BF16, true);
        RIG_OK(op_gemm(&g->prog, "fprop_e", &gd));
        gd = stack_gemm(f, GEMM_DENSE, none, rows, k, n, stack_operand(&ddy_q, f, false, false,
                        0, false), stack_operand(&dw_q, f, true, true, 0, false), edx[e],
                        QT_DTYPE_BF16, false);
        RIG_OK(op_gemm(&g->prog, "dgrad_e", &gd));
        gd = stack_gemm(f, GEMM_DENSE, none, n, k, rows, stack_operand(&ddy_q, f, true, false,
                        0, false), stack_operand(&dx_q, f, true, false, 0, false), edw[e],
                        QT_DTYPE_F32, false);
        RIG_OK(op_gemm(&g->prog, "wgrad_e", &gd));
    }
    rig_bind(g);
    RIG_OK(backend_write(&g->be, hw, w, (uint64_t)STACK_EXPERTS * n * k * 4));
    RIG_OK(backend_write(&g->be, hx, x, (uint64_t)cap * k * 2));
    RIG_OK(backend_write(&g->be, hdy, dy, (uint64_t)cap * n * 2));
    RIG_OK(backend_write(&g->be, hoff, off, sizeof off));
    RIG_OK(backend_write(&g->be, hdims, dims, sizeof dims));
    RIG_OK(backend_write(&g->be, hwhole, whole, sizeof whole));
    for (int e = 0; e < STACK_EXPERTS; e++) {
        uint32_t rows = off[e + 1] - off[e];
        if (rows == 0) continue;
        RIG_OK(backend_write(&g->be, ew[e], w + (uint64_t)e * n * k, (uint64_t)n * k * 4));
        RIG_OK(backend_write(&g->be, ex[e], x + (uint64_t)off[e] * k, (uint64_t)rows * k * 2));
        RIG_OK(backend_write(&g->be, edy[e], dy + (uint64_t)off[e] * n, (uint64_t)rows * n * 2));
    }
    stack_check_tier(g, f, grouped_ops, gpu);
    RIG_OK(backend_run(&g->be, &g->prog));
    stack_compare(g, off, dims, n, k, (prog_ref[3]){y, dx, dw},
                  (const prog_ref *const[3]){ey, edx, edw});
    free(w);
    free(x);
    free(dy);
    rig_close(g);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The layer's gradients against a double-precision model

#define GRAD_TEXT_MAX 4096

static run the_run;
static recipe the_recipe;

typedef struct grad_net {
    const char *name;
    const char *model;      // the [model] lines
    uint32_t inputs, width, experts, topk, hidden, classes;
    bool fc0;               // a linear fc0 (inputs -> width) before the moe layer m
    uint32_t act;           // QT_ACT_GELU | QT_ACT_SWIGLU | QT_ACT_RELU
    float aux;
} grad_net;

// What the inspection reads from the bound run.
typedef struct grad_seen {
    uint32_t batch;
    float *x;               // [batch][inputs]
    int32_t *labels;
    uint32_t *expert;       // [batch][topk], the run's choices
    float *w[4], *g[4];     // weights (bf16 copies, widened) and gradients: fc0, router,
                            // fc1, fc2 (stacked), head
    float *wh, *gh;
    bool ok;
} grad_seen;

static const arena_region *region_named(const arena *a, const char *name, arena_handle *h) {
    for (uint32_t i = 0; i < a->region_count; i++) {
        const arena_region *r = arena_region_get(a, i);
        if (strcmp(r->name, name) == 0) {
            *h = i;
            return r;
        }
    }
    return NULL;
}

static float *read_f32(run *r, backend *b, const char *name, uint64_t count, bool bf16) {
    arena_handle h = 0;
    const arena_region *reg = region_named(&r->dev, name, &h);
    CHECK(reg != NULL, "no region %s", name);
    float *out = zalloc(count * 4);
    if (!reg) return out;
    uint64_t bytes = count * (bf16 ? 2 : 4);
    CHECK(reg->bytes >= bytes, "%s: %llu bytes, expected %llu", name,
          (unsigned long long)reg->bytes, (unsigned long long)bytes);
    void *raw = zalloc(bytes);
    RIG_OK(backend_read(b, raw, (prog_ref){&r->dev, h, 0}, bytes));
    for (uint64_t i = 0; i < count; i++) {
        out[i] = bf16 ? qt_bf16_to_f32(((uint16_t *)raw)[i]) : ((float *)raw)[i];
    }
    free(raw);
    return out;
}

static const grad_net *grad_current;
static bool grad_bf16;  // the weights the forward pass used are the masters rounded to BF16

// Runs the train program's ops up to the gradient norm (every gradient is then complete and
// nothing has read it yet), taking the batch and the routing as they are produced, and reads
// the weights the forward pass used and the gradients.
static void grad_inspect(run *r, backend *b, void *ctx) {
    grad_seen *seen = ctx;
    const grad_net *n = grad_current;
    const program *p = &r->programs[MODEL_MODE_TRAIN];
    const data_slot_layout *layout = &r->model.io.batch;
    uint32_t batch = r->model.batch;
    seen->batch = batch;
    arena_handle hb = 0, he = 0;
    const arena_region *rb = region_named(&r->dev, "train.batch", &hb);
    const arena_region *re = region_named(&r->dev, "train.m.expert", &he);
    CHECK(rb && re && layout->stride == n->inputs, "batch or routing regions not found");
    if (!rb || !re || layout->stride != n->inputs) return;
    seen->x = zalloc((uint64_t)batch * n->inputs * 4);
    seen->labels = zalloc(batch * 4ull);
    seen->expert = zalloc((uint64_t)batch * n->topk * 4);
    uint32_t op = 0;
    for (; op < p->op_count && strncmp(p->ops[op].name, "grad_norm", 9) != 0; op++) {
        backend_ref_op(&p->ops[op]);
        if (strcmp(p->ops[op].name, "stage") == 0) {
            RIG_OK(backend_read(b, seen->x, (prog_ref){&r->dev, hb, layout->inputs_offset},
                                (uint64_t)batch * n->inputs * 4));
            RIG_OK(backend_read(b, seen->labels, (prog_ref){&r->dev, hb,
                                layout->targets_offset}, batch * 4ull));
        }
        if (strcmp(p->ops[op].name, "m.route") == 0) {
            RIG_OK(backend_read(b, seen->expert, (prog_ref){&r->dev, he, 0},
                                (uint64_t)batch * n->topk * 4));
        }
    }
    CHECK(op < p->op_count, "the train program has no grad_norm op");
    uint32_t f1 = n->act == QT_ACT_SWIGLU ? 2 * n->hidden : n->hidden;
    uint32_t in = n->fc0 ? n->width : n->inputs;
    const char *names[4] = {"fc0.weight", "m.router.weight", "m.fc1.weight", "m.fc2.weight"};
    uint64_t counts[4] = {(uint64_t)n->width * n->inputs, (uint64_t)n->experts * in,
                          (uint64_t)n->experts * f1 * in, (uint64_t)n->experts * in * n->hidden};
    char buf[96];
    for (int i = n->fc0 ? 0 : 1; i < 4; i++) {
        snprintf(buf, sizeof buf, "%s.master", names[i]);
        seen->w[i] = read_f32(r, b, buf, counts[i], false);
        snprintf(buf, sizeof buf, "%s.grad", names[i]);
        seen->g[i] = read_f32(r, b, buf, counts[i], false);
    }
    seen->wh = read_f32(r, b, "head.weight.master", (uint64_t)n->classes * in, false);
    for (int i = 0; grad_bf16 && i < 5; i++) {
        float *w = i < 4 ? seen->w[i] : seen->wh;
        uint64_t count = i < 4 ? counts[i] : (uint64_t)n->classes * in;
        for (uint64_t j = 0; w && j < count; j++) w[j] = qt_bf16_to_f32(qt_f32_to_bf16(w[j]));
    }
    seen->gh = read_f32(r, b, "head.weight.grad", (uint64_t)n->classes * in, false);
    seen->ok = true;
}

static double rb16(double v) { return qt_bf16_to_f32(qt_f32_to_bf16((float)v)); }


static double gelu_d(double x, double *grad) {
    double k0 = 0.7978845608028654, k1 = 0.044715;
    double t = tanh(k0 * (x + k1 * x * x * x));
    *grad = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k0 * (1 + 3 * k1 * x * x);
    return 0.5 * x * (1 + t);
}

static double silu_d(double x, double *grad) {
    double s = 1 / (1 + exp(-x));
    *grad = s * (1 + x * (1 - s));
    return x * s;
}

// One token's expert e: u = bf16(h W1_e^T), a = bf16(act(u)), v = bf16(a W2_e^T); with dv given,
// accumulates dW1_e, dW2_e, dh and returns nothing else. The activations round to BF16 like the
// runtime's tensors (dv and the gradients stay in double).
typedef struct grad_expert {
    const grad_net *n;
    const float *w1, *w2;   // the expert's [f1][in], [in][hidden]
    double *g1, *g2;        // their gradients
    uint32_t in, f1;
} grad_expert;

static void expert_forward(const grad_expert *x, const double *h, double *u, double *a,
                           double *v) {
    const grad_net *n = x->n;
    for (uint32_t o = 0; o < x->f1; o++) {
        double s = 0;
        for (uint32_t k = 0; k < x->in; k++) s += h[k] * x->w1[(uint64_t)o * x->in + k];
        u[o] = rb16(s);
    }
    for (uint32_t o = 0; o < n->hidden; o++) {
        double d;
        if (n->act == QT_ACT_SWIGLU) {
            a[o] = rb16(silu_d(u[o], &d) * u[n->hidden + o]);
        } else if (n->act == QT_ACT_GELU) {
            a[o] = rb16(gelu_d(u[o], &d));
        } else {
            a[o] = u[o] > 0 ? u[o] : 0;
        }
    }
    for (uint32_t o = 0; o < x->in; o++) {
        double s = 0;
        for (uint32_t k = 0; k < n->hidden; k++) s += a[k] * x->w2[(uint64_t)o * n->hidden + k];
        v[o] = rb16(s);
    }
}

static void expert_backward(const grad_expert *x, const double *h, const double *u,
                            const double *a, const double *dv, double *dh) {
    const grad_net *n = x->n;
    double da[256], du[512];
    for (uint32_t k = 0; k < n->hidden; k++) {
        da[k] = 0;
        for (uint32_t o = 0; o < x->in; o++) {
            da[k] += dv[o] * x->w2[(uint64_t)o * n->hidden + k];
            x->g2[(uint64_t)o * n->hidden + k] += dv[o] * a[k];
        }
    }
    for (uint32_t k = 0; k < n->hidden; k++) {
        double d;
        if (n->act == QT_ACT_SWIGLU) {
            double s = silu_d(u[k], &d);
            du[k] = da[k] * u[n->hidden + k] * d;
            du[n->hidden + k] = da[k] * s;
        } else if (n->act == QT_ACT_GELU) {
            gelu_d(u[k], &d);
            du[k] = da[k] * d;
        } else {
            du[k] = u[k] > 0 ? da[k] : 0;
        }
    }
    for (uint32_t o = 0; o < x->f1; o++) {
        for (uint32_t k = 0; k < x->in; k++) {
            x->g1[(uint64_t)o * x->in + k] += du[o] * h[k];
            dh[k] += du[o] * x->w1[(uint64_t)o * x->in + k];
        }
    }
}

static double rel_error(const float *got, const double *want, uint64_t count) {
    double diff = 0, norm = 0;
    for (uint64_t i = 0; i < count; i++) {
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
    }
    return norm > 0 ? sqrt(diff / norm) : (diff > 0 ? INFINITY : 0);
}

// The model in double: fc0 (optional), the moe layer with the run's choices, the head, softmax
// cross-entropy over the batch; returns the gradients' relative errors (fc0, router, fc1, fc2,
// head).
static void grad_reference(const grad_net *n, const grad_seen *s, double err[5]) {
    uint32_t T = s->batch, in = n->fc0 ? n->width : n->inputs, E = n->experts, K = n->topk;
    uint32_t f1 = n->act == QT_ACT_SWIGLU ? 2 * n->hidden : n->hidden, C = n->classes;
    double *h = zalloc((uint64_t)T * in * 8), *dh = zalloc((uint64_t)T * in * 8);
    double *g[5];
    uint64_t counts[5] = {(uint64_t)n->width * n->inputs, (uint64_t)E * in,
                          (uint64_t)E * f1 * in, (uint64_t)E * in * n->hidden, (uint64_t)C * in};
    for (int i = 0; i < 5; i++) g[i] = zalloc(counts[i] * 8);
    uint32_t *count = zalloc(E * 4ull);
    for (uint64_t i = 0; i < (uint64_t)T * K; i++) count[s->expert[i]]++;
    double aux = (double)n->aux * E / ((double)T * T * K);
    static double u[64][512], a[64][256], v[64][256], p[64];
    for (uint32_t t = 0; t < T; t++) {
        const float *x = s->x + (uint64_t)t * n->inputs;
        double *ht = h + (uint64_t)t * in;
        for (uint32_t o = 0; o < in; o++) {
            double acc = 0;
            if (!n->fc0) acc = rb16(x[o]);
            for (uint32_t k = 0; n->fc0 && k < n->inputs; k++) {
                acc += rb16(x[k]) * s->w[0][(uint64_t)o * n->inputs + k];
            }
            ht[o] = n->fc0 ? rb16(acc) : acc;
        }
        double m = -INFINITY, sum = 0;
        for (uint32_t e = 0; e < E; e++) {
            double l = 0;
            for (uint32_t k = 0; k < in; k++) l += ht[k] * s->w[1][(uint64_t)e * in + k];
            p[e] = (float)l;
            m = p[e] > m ? p[e] : m;
        }
        for (uint32_t e = 0; e < E; e++) sum += exp(p[e] - m);
        for (uint32_t e = 0; e < E; e++) p[e] = exp(p[e] - m) / sum;
        double y[256] = {0}, z[16], dz[16], dy[256] = {0}, dg[16];
        for (uint32_t j = 0; j < K; j++) {
            uint32_t e = s->expert[t * K + j];
            grad_expert ex = {n, s->w[2] + (uint64_t)e * f1 * in,
                              s->w[3] + (uint64_t)e * in * n->hidden,
                              g[2] + (uint64_t)e * f1 * in, g[3] + (uint64_t)e * in * n->hidden,
                              in, f1};
            expert_forward(&ex, ht, u[j], a[j], v[j]);
            for (uint32_t o = 0; o < in; o++) y[o] += (float)p[e] * v[j][o];
        }
        for (uint32_t o = 0; o < in; o++) y[o] = rb16(y[o]);
        double zm = -INFINITY, zs = 0;
        for (uint32_t c = 0; c < C; c++) {
            double acc = 0;
            for (uint32_t k = 0; k < in; k++) acc += y[k] * s->wh[(uint64_t)c * in + k];
            z[c] = rb16(acc);
            zm = z[c] > zm ? z[c] : zm;
        }
        for (uint32_t c = 0; c < C; c++) zs += exp(z[c] - zm);
        for (uint32_t c = 0; c < C; c++) {
            dz[c] = (exp(z[c] - zm) / zs - (c == (uint32_t)s->labels[t])) / T;
            for (uint32_t k = 0; k < in; k++) {
                g[4][(uint64_t)c * in + k] += dz[c] * y[k];
                dy[k] += dz[c] * s->wh[(uint64_t)c * in + k];
            }
        }
        double *dht = dh + (uint64_t)t * in;
        for (uint32_t j = 0; j < K; j++) {
            uint32_t e = s->expert[t * K + j];
            grad_expert ex = {n, s->w[2] + (uint64_t)e * f1 * in,
                              s->w[3] + (uint64_t)e * in * n->hidden,
                              g[2] + (uint64_t)e * f1 * in, g[3] + (uint64_t)e * in * n->hidden,
                              in, f1};
            double dv[256];
            dg[j] = 0;
            for (uint32_t o = 0; o < in; o++) {
                dv[o] = (float)p[e] * dy[o];
                dg[j] += dy[o] * v[j][o];
            }
            expert_backward(&ex, ht, u[j], a[j], dv, dht);
        }
        double dp[64], sp = 0;
        for (uint32_t e = 0; e < E; e++) {
            dp[e] = aux * count[e];
            for (uint32_t j = 0; j < K; j++) dp[e] += s->expert[t * K + j] == e ? dg[j] : 0;
            sp += p[e] * dp[e];
        }
        for (uint32_t e = 0; e < E; e++) {
            double dl = p[e] * (dp[e] - sp);
            for (uint32_t k = 0; k < in; k++) {
                g[1][(uint64_t)e * in + k] += dl * ht[k];
                dht[k] += dl * s->w[1][(uint64_t)e * in + k];
            }
        }
        for (uint32_t o = 0; n->fc0 && o < n->width; o++) {
            for (uint32_t k = 0; k < n->inputs; k++) {
                g[0][(uint64_t)o * n->inputs + k] += dht[o] * rb16(x[k]);
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        err[i] = (i == 0 && !n->fc0) ? 0 : rel_error(s->g[i], g[i], counts[i]);
    }
    err[4] = rel_error(s->gh, g[4], counts[4]);
    for (int i = 0; i < 5; i++) free(g[i]);
    free(h);
    free(dh);
    free(count);
}

// BF16: the formats' quantization errors would hide a wrong term (test_one_expert_dense checks
// them against the dense layers instead).
static void grad_case(const grad_net *n) {
    const char *scheme = "bf16";
    char name[96];
    snprintf(name, sizeof name, "moe_layer_gradients_against_double_%s", n->name);
    test_begin(name);
    static char text[GRAD_TEXT_MAX];
    snprintf(text, sizeof text, "[model]\ninput = %u\n%sloss = softmax_xent\n[quant]\n"
             "recipe = %s\n[optim]\nadamw lr=1e-2\n[data]\ntrain = synthetic classes "
             "inputs=%u classes=%u samples=256 seed=3\nbatch = 32\nseed = 5\n[schedule]\n"
             "train 3\n", n->inputs, n->model, scheme, n->inputs, n->classes);
    grad_bf16 = true;
    static grad_seen seen;
    memset(&seen, 0, sizeof seen);
    grad_current = n;
    run_options o = {0};
    qt_status st = recipe_parse(text, strlen(text), name, &the_recipe);
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), &o);
    CHECK(st == QT_OK, "%s", qt_error_message());
    if (st != QT_OK) {
        test_end();
        return;
    }
    static backend b;
    backend_open_ref(&b);
    uint64_t dev_bytes, host_bytes;
    run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
    void *dev = aligned_alloc(256, (dev_bytes + 511) / 256 * 256);
    void *host = aligned_alloc(256, (host_bytes + 511) / 256 * 256);
    void *data = aligned_alloc(256, (run_data_bytes(&the_run) + 511) / 256 * 256);
    st = run_load(&the_run, data, run_data_bytes(&the_run));
    if (st == QT_OK) st = run_bind(&the_run, &b, dev, host);
    sched_summary sum;
    if (st == QT_OK) st = run_execute(&the_run, NULL, NULL, &sum);
    CHECK(st == QT_OK, "%s", qt_error_message());
    if (st == QT_OK) grad_inspect(&the_run, &b, &seen);
    run_close(&the_run);
    backend_close(&b);
    if (seen.ok) {
        double err[5];
        grad_reference(n, &seen, err);
        static const char *const what[5] = {"fc0", "router", "fc1", "fc2", "head"};
        // Activations round to BF16 (2^-9 relative) between layers in both computations, but
        // the runtime also rounds every gradient tensor (dy, dyp, dact, the GEMM outputs) to
        // BF16 and accumulates in FP32: the errors measured 0.1% to 0.4%. A missing term is
        // off by far more (without the load-balancing loss the router's gradient is 3.6% off
        // in the first case, and 100% with top-1).
        for (int i = 0; i < 5; i++) {
            CHECK(err[i] < 0.01, "%s gradient: relative error %.4g", what[i], err[i]);
        }
    }
    free(seen.x);
    free(seen.labels);
    free(seen.expert);
    for (int i = 0; i < 4; i++) {
        free(seen.w[i]);
        free(seen.g[i]);
    }
    free(seen.wh);
    free(seen.gh);
    free(dev);
    free(host);
    free(data);
    test_end();
}

static void test_layer_gradients(void) {
    static const grad_net nets[] = {
        {"gelu_top2_after_linear",
         "layer = linear fc0 24\nlayer = moe m experts=4 topk=2 hidden=16 act=gelu aux=0.05\n"
         "layer = linear head 4\n", 16, 24, 4, 2, 16, 4, true, QT_ACT_GELU, 0.05f},
        {"swiglu_top2_first_layer",
         "layer = moe m experts=5 topk=2 hidden=8 act=swiglu aux=0.05\nlayer = linear head 4\n",
         16, 16, 5, 2, 8, 4, false, QT_ACT_SWIGLU, 0.05f},
        {"relu_top1_after_linear",
         "layer = linear fc0 16\nlayer = moe m experts=3 topk=1 hidden=24 act=relu aux=0.5\n"
         "layer = linear head 4\n", 16, 16, 3, 1, 24, 4, true, QT_ACT_RELU, 0.5f},
    };
    for (size_t i = 0; i < sizeof nets / sizeof nets[0]; i++) grad_case(&nets[i]);
}

// ---------------------------------------------------------------------------------------------
// Training runs

#define TRAIN_TEXT_MAX 8192
#define TRAIN_STEPS_LOGGED 512

// Every record of a run (loss, accuracy, gradient norm, learning rate), and the bytes of the
// persistent weight regions whose names start with `weights_prefix`.
typedef struct train_log train_log;
struct train_log {
    uint32_t count;
    float values[TRAIN_STEPS_LOGGED][4];
    uint32_t modes[TRAIN_STEPS_LOGGED];
    const char *weights_prefix;
    uint32_t weights;
    char names[16][ARENA_NAME_MAX];
    uint8_t *bytes[16];
    uint64_t sizes[16];
    uint64_t syncs, lagged_reads;
    void (*inspect)(run *r, backend *b, struct train_log *l);  // before the run closes
    uint32_t first_dims[8];  // test_one_expert_takes_all's look into a step
    uint32_t loads[8];       // and run_expert_loads after the run (its last train step)
    bool loads_kept;         // first_dims lives from the scan to the last op of every program
};

static void log_record(void *ctx, const sched_progress *p) {
    train_log *l = ctx;
    if (l->count == TRAIN_STEPS_LOGGED) return;
    const qt_trace_record *r = p->record;
    float *v = l->values[l->count];
    v[0] = r->loss, v[1] = r->accuracy, v[2] = r->grad_norm, v[3] = r->lr;
    l->modes[l->count++] = p->mode;
}

static void log_weights(run *r, backend *b, train_log *l) {
    size_t n = strlen(l->weights_prefix);
    for (uint32_t h = 0; h < r->dev.region_count && l->weights < 16; h++) {
        const arena_region *reg = arena_region_get(&r->dev, h);
        if (!reg->persistent || reg->category != ARENA_CAT_WEIGHTS) continue;
        if (strncmp(reg->name, l->weights_prefix, n) != 0 || strstr(reg->name, ".group_")) {
            continue;
        }
        uint32_t i = l->weights++;
        snprintf(l->names[i], ARENA_NAME_MAX, "%s", reg->name + n);
        l->sizes[i] = reg->bytes;
        l->bytes[i] = malloc(reg->bytes);
        RIG_OK(backend_read(b, l->bytes[i], (prog_ref){&r->dev, h, 0}, reg->bytes));
    }
}

static void log_free(train_log *l) {
    for (uint32_t i = 0; i < l->weights; i++) free(l->bytes[i]);
}

// Trains `text` on a backend of the kind into *l (options as given); false when the backend
// cannot be opened (no GPU).
static bool train_text(const char *text, backend_kind kind, const run_options *options,
                       train_log *l, const char **why) {
    static backend b;
    memset(&b, 0, sizeof b);
    if (kind == BACKEND_GPU) {
        if (backend_open_gpu(&b, 0) != QT_OK) {
            *why = qt_error_message();
            backend_close(&b);
            return false;
        }
    } else {
        backend_open_ref(&b);
    }
    qt_status st = recipe_parse(text, strlen(text), "moe.recipe", &the_recipe);
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), options);
    void *dev = NULL, *host = NULL, *data = NULL;
    if (st == QT_OK) {
        if (kind == BACKEND_REF) {
            uint64_t dev_bytes, host_bytes;
            run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
            dev = aligned_alloc(256, (dev_bytes + 511) / 256 * 256);
            host = aligned_alloc(256, (host_bytes + 511) / 256 * 256);
        }
        data = aligned_alloc(256, (run_data_bytes(&the_run) + 511) / 256 * 256);
        st = run_load(&the_run, data, run_data_bytes(&the_run));
        if (st == QT_OK) st = run_bind(&the_run, &b, dev, host);
        uint64_t syncs = driver_sync_total(&b.syncs);
        sched_summary sum;
        if (st == QT_OK) st = run_execute(&the_run, log_record, l, &sum);
        l->syncs = driver_sync_total(&b.syncs) - syncs;
        l->lagged_reads = sum.lagged_reads;
        if (st == QT_OK && l->weights_prefix) log_weights(&the_run, &b, l);
        if (st == QT_OK && l->inspect) l->inspect(&the_run, &b, l);
        run_close(&the_run);
    }
    CHECK(st == QT_OK, "%s", qt_error_message());
    free(dev);
    free(host);
    free(data);
    backend_close(&b);
    return true;
}

static bool same_records(const train_log *a, const train_log *b, const char *what) {
    CHECK(a->count == b->count && a->count > 0, "%s: %u and %u records", what, a->count,
          b->count);
    for (uint32_t i = 0; i < a->count && i < b->count; i++) {
        if (memcmp(a->values[i], b->values[i], sizeof a->values[i]) == 0) continue;
        CHECK(false, "%s: record %u (%s) differs: loss %.9g / %.9g, accuracy %g / %g, grad norm "
              "%.9g / %.9g", what, i, model_mode_name(a->modes[i]), a->values[i][0],
              b->values[i][0], a->values[i][1], b->values[i][1], a->values[i][2],
              b->values[i][2]);
        return false;
    }
    return a->count == b->count;
}

// The weight regions of two runs, byte for byte; except that a BF16 weight (a ".bf16" region)
// may differ in at most bf16_ulps_max elements by one unit in the last place (0: none).
static void same_weights(const train_log *a, const train_log *b, uint32_t bf16_ulps_max) {
    CHECK(a->weights == b->weights && a->weights > 0, "%u and %u weight regions", a->weights,
          b->weights);
    for (uint32_t i = 0; i < a->weights && i < b->weights; i++) {
        bool same_shape = strcmp(a->names[i], b->names[i]) == 0 && a->sizes[i] == b->sizes[i];
        CHECK(same_shape, "weight regions %s (%llu bytes) and %s (%llu bytes)", a->names[i],
              (unsigned long long)a->sizes[i], b->names[i], (unsigned long long)b->sizes[i]);
        if (!same_shape || memcmp(a->bytes[i], b->bytes[i], a->sizes[i]) == 0) continue;
        const char *dot = strrchr(a->names[i], '.');
        bool bf16 = dot != NULL && strcmp(dot, ".bf16") == 0;
        CHECK(bf16 && bf16_ulps_max > 0, "weight region %s (%llu bytes) differs", a->names[i],
              (unsigned long long)a->sizes[i]);
        if (!bf16 || bf16_ulps_max == 0) continue;
        const uint16_t *x = (const uint16_t *)(const void *)a->bytes[i];
        const uint16_t *y = (const uint16_t *)(const void *)b->bytes[i];
        uint64_t words = a->sizes[i] / 2, ulps = 0, far = 0;
        for (uint64_t k = 0; k < words; k++) {
            if (x[k] == y[k]) continue;
            bool adjacent = (x[k] ^ y[k]) >> 15 == 0 && (x[k] - y[k] == 1 || y[k] - x[k] == 1);
            if (adjacent) ulps++;
            if (!adjacent && far++ < 4) {
                CHECK(false, "%s[%llu]: %04x (%g) and %04x (%g)", a->names[i],
                      (unsigned long long)k, x[k], (double)qt_bf16_to_f32(x[k]), y[k],
                      (double)qt_bf16_to_f32(y[k]));
            }
        }
        CHECK(ulps <= bf16_ulps_max, "%s: %llu of %llu elements one ulp apart", a->names[i],
              (unsigned long long)ulps, (unsigned long long)words);
    }
}

// One expert, top-1: the gate is softmax of one logit, exactly 1, every token is the expert's,
// the router's gradient is exactly 0, and the grouped tensors have one member of the batch's
// rows. So the layer computes what a dense linear -> activation -> linear block does, bit for
// bit, in every format: the same GEMMs over the same rows, each grouped cast equal to the dense
// one, each stacked expert weight to the dense weight (both initialized from the same seed: the
// moe layer's fc1 and fc2 are the model's first two parameters, like the dense fc1 and fc2). A
// wrong member offset, scale array or grouped cast breaks the equality at the first step.
// Stochastic rounding is off (it is keyed by the quantizer's index, which differs).
static void test_one_expert_dense(const char *scheme, bool block_sized) {
    char name[96];
    snprintf(name, sizeof name, "moe_one_expert_trains_like_the_dense_block_%s", scheme);
    test_begin(name);
    uint32_t width = block_sized ? 128 : 32, hidden = block_sized ? 128 : 64;
    static char moe[TRAIN_TEXT_MAX], dense[TRAIN_TEXT_MAX];
    const char *tail_fmt = "loss = mse\n[quant]\nrecipe = %s\n%s[optim]\n"
                           "adamw lr=3e-3 wd=0.01 clip=1.0\n[data]\ntrain = synthetic teacher "
                           "inputs=%u outputs=%u samples=256 seed=5\neval = synthetic teacher "
                           "inputs=%u outputs=%u samples=64 seed=6\nbatch = 32\nseed = 9\n"
                           "[schedule]\ntrain 12 cosine 3e-3 -> 3e-4\neval all\ntrain 8\n";
    char tail[1024];
    const char *rule = strcmp(scheme, "nvfp4") == 0 ? "rule = *.grad_output@* -> nvfp4 sr=0\n"
                                                    : "";
    snprintf(tail, sizeof tail, tail_fmt, scheme, rule, width, width, width, width);
    snprintf(moe, sizeof moe, "[model]\ninput = %u\nlayer = moe m experts=1 topk=1 hidden=%u "
             "act=swiglu aux=0.01\n%s", width, hidden, tail);
    snprintf(dense, sizeof dense, "[model]\ninput = %u\nlayer = linear fc1 %u\nlayer = swiglu\n"
             "layer = linear fc2 %u\n%s", width, 2 * hidden, width, tail);
    static train_log a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.weights_prefix = "m.";
    b.weights_prefix = "";
    // Both norms from the gradients' elements: the dense GEMMs' norm units sum them in another
    // order than the experts' grouped GEMMs, which have none.
    run_options o = {.norm_elements = true};
    const char *why = NULL;
    train_text(moe, BACKEND_REF, &o, &a, &why);
    // The dense model's weight regions are all fc1's and fc2's.
    train_text(dense, BACKEND_REF, &o, &b, &why);
    // The moe model's router (BF16 in every built-in recipe) has no dense counterpart.
    uint32_t kept = 0;
    for (uint32_t i = 0; i < a.weights; i++) {
        if (strncmp(a.names[i], "router.", 7) == 0) {
            free(a.bytes[i]);
            continue;
        }
        memmove(a.names[kept], a.names[i], ARENA_NAME_MAX);
        a.bytes[kept] = a.bytes[i];
        a.sizes[kept++] = a.sizes[i];
    }
    a.weights = kept;
    same_records(&a, &b, "moe and dense");
    same_weights(&a, &b, 0);
    log_free(&a);
    log_free(&b);
    test_end();
}

// Replaces the first `from` in text (of capacity bytes) by `to`.
static void replace_once(char *text, size_t bytes, const char *from, const char *to) {
    char *at = strstr(text, from);
    QT_ASSERT(at && strlen(text) - strlen(from) + strlen(to) < bytes);
    memmove(at + strlen(to), at + strlen(from), strlen(at + strlen(from)) + 1);
    memcpy(at, to, strlen(to));
}

// The recipe tests/recipes/synthetic_moe.recipe with its `recipe = bf16` line made `recipe =
// SCHEME`; with block scaling the widths become 128 (its 128-row blocks), and `schedule`
// replaces the schedule when given.
static void moe_recipe(const char *scheme, const char *schedule, char *out, size_t bytes) {
    size_t size = 0;
    char *text = file_read("tests/recipes/synthetic_moe.recipe", &size);
    CHECK(text != NULL, "cannot read tests/recipes/synthetic_moe.recipe");
    if (!text) {
        out[0] = '\0';
        return;
    }
    char *rec = strstr(text, "\nrecipe = bf16\n"), *sched = strstr(text, "[schedule]\n");
    QT_ASSERT(rec && sched && rec < sched);
    *rec = '\0';
    *sched = '\0';
    const char *body = rec + strlen("\nrecipe = bf16\n");
    snprintf(out, bytes, "%s\nrecipe = %s\n%s[schedule]\n%s", text, scheme, body,
             schedule ? schedule : sched + strlen("[schedule]\n"));
    if (strcmp(scheme, "block") == 0) {
        replace_once(out, bytes, "linear fc1 32", "linear fc1 128");
        replace_once(out, bytes, "hidden=32", "hidden=128");
    }
    free(text);
}

static void test_converges(void) {
    test_begin("moe_train_synthetic_converges");
    static char text[TRAIN_TEXT_MAX];
    moe_recipe("bf16", NULL, text, sizeof text);
    static train_log l;
    memset(&l, 0, sizeof l);
    run_options o = {0};
    const char *why = NULL;
    train_text(text, BACKEND_REF, &o, &l, &why);
    // Four separated classes (data.c's synthetic classes): ln 4 = 1.39 at the start; 200 AdamW
    // steps take the batch loss well below 0.25 and the eval set above 90%.
    float last_train = -1, last_eval_acc = -1;
    for (uint32_t i = 0; i < l.count; i++) {
        if (l.modes[i] == MODEL_MODE_TRAIN) last_train = l.values[i][0];
        if (l.modes[i] == MODEL_MODE_EVAL) last_eval_acc = l.values[i][1];
    }
    CHECK(last_train >= 0 && last_train < 0.25f, "last train loss %g", last_train);
    CHECK(last_eval_acc > 0.9f, "last eval batch accuracy %g", last_eval_acc);
    test_end();
}

static bool same_files(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *ta = file_read(a, &na), *tb = file_read(b, &nb);
    bool same = ta && tb && na == nb && memcmp(ta, tb, na) == 0;
    CHECK(same, "%s and %s differ (%zu and %zu bytes)", a, b, na, nb);
    free(ta);
    free(tb);
    return same;
}

// The train records of a trace without their step index (eval and infer steps count too).
static char *train_lines(const char *path) {
    size_t n = 0;
    char *text = file_read(path, &n);
    if (!text) return NULL;
    char *out = calloc(1, n + 1), *at = out;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, " mode=train ")) continue;
        at += sprintf(at, "%s\n", strchr(line, ' '));
    }
    free(text);
    return out;
}

// Two runs, one trace; then the same schedule with an eval step after every train step and an
// infer step every 20: the train records (losses, gradient norms, every delayed-scaling slot
// the trace carries, the checksum of every weight, master, optimizer and scaling region every
// 20 steps) must not change: evaluation and inference read the weights (both usages stay) and
// never write them, nor the scales or histories. A train step that reads anything an eval or
// infer step left behind (an NVFP4 amax array zeroed for one member of several did) shows here.
static void test_determinism_interleave(const char *scheme, uint32_t steps) {
    char name[96];
    snprintf(name, sizeof name, "moe_two_runs_and_eval_infer_interleaved_identical_%s", scheme);
    test_begin(name);
    static char mixed[TRAIN_TEXT_MAX], sched[2048];
    // Constant rates (a cosine row per piece would restart its curve); the runs without the
    // eval and infer steps drop those rows (drop_eval), so both have the same learning-rate
    // rows, which the checksums cover.
    int n = 0;
    for (uint32_t done = 0; done < steps; done += 20) {
        n += snprintf(sched + n, sizeof sched - (size_t)n, "train %u constant 3e-3\n"
                      "infer 1\n", steps - done < 20 ? steps - done : 20);
    }
    moe_recipe(scheme, sched, mixed, sizeof mixed);
    char a[160], b[160], c[160];
    snprintf(a, sizeof a, "%s", tmp_path("moe_a.trace"));
    snprintf(b, sizeof b, "%s", tmp_path("moe_b.trace"));
    snprintf(c, sizeof c, "%s", tmp_path("moe_mixed.trace"));
    static train_log l;
    run_options o = {0};
    o.checksum_every = 20;
    const char *why = NULL;
    o.trace_path = a;
    o.drop_eval = true;
    memset(&l, 0, sizeof l);
    train_text(mixed, BACKEND_REF, &o, &l, &why);
    o.trace_path = b;
    memset(&l, 0, sizeof l);
    train_text(mixed, BACKEND_REF, &o, &l, &why);
    same_files(a, b);
    o.trace_path = c;
    o.drop_eval = false;
    o.eval_every = 1;
    o.eval_steps = 1;
    memset(&l, 0, sizeof l);
    train_text(mixed, BACKEND_REF, &o, &l, &why);
    uint32_t evals = 0, infers = 0;
    for (uint32_t i = 0; i < l.count; i++) {
        evals += l.modes[i] == MODEL_MODE_EVAL;
        infers += l.modes[i] == MODEL_MODE_INFER;
    }
    CHECK(evals >= steps && infers == (steps + 19) / 20, "%u eval and %u infer steps", evals,
          infers);
    char *la = train_lines(a), *lc = train_lines(c);
    CHECK(la && lc && strlen(la) > 0 && strcmp(la, lc) == 0,
          "train records differ with eval and infer steps between them");
    if (la && lc && strcmp(la, lc) != 0) {
        size_t i = 0;
        while (la[i] && la[i] == lc[i]) i++;
        while (i > 0 && la[i - 1] != '\n') i--;
        uint32_t line = 0;
        for (size_t j = 0; j < i; j++) line += la[j] == '\n';
        printf("  train record %u differs:\n  train alone:%.160s\n  interleaved:%.160s\n", line,
               la + i, lc + i);
    }
    free(la);
    free(lc);
    test_end();
}

// Runs the train program's ops up to the routing's scan and reads the experts' token counts.
static void routing_inspect(run *r, backend *b, train_log *l) {
    const program *p = &r->programs[MODEL_MODE_TRAIN];
    arena_handle h = 0;
    const arena_region *reg = region_named(&r->dev, "train.m.first_dims", &h);
    CHECK(reg != NULL, "no region train.m.first_dims");
    // After the run (an eval pass followed the last train step): the last train step's counts,
    // which no later op of any program may have overwritten.
    RIG_OK(run_expert_loads(r, 0, l->loads));
    const program *last = &r->checksum;
    l->loads_kept = reg && last->op_count > 0 &&
                    reg->last_op == last->op_base + (int32_t)last->op_count - 1;
    for (uint32_t op = 0; reg && op < p->op_count; op++) {
        backend_ref_op(&p->ops[op]);
        if (strcmp(p->ops[op].name, "m.scan") != 0) continue;
        RIG_OK(backend_read(b, l->first_dims, (prog_ref){&r->dev, h, 0}, 6 * 4));
        return;
    }
    CHECK(false, "no op m.scan in the train program");
}

// Every sample the same features (labels differ): every token's logits are the same, so every
// token picks the same expert, step after step, and the other experts get no row. The run
// trains (the loss falls to the labels' entropy), twice to the same trace, and a look into the
// step shows one expert with the whole batch.
static void test_one_expert_takes_all(void) {
    test_begin("moe_every_token_routed_to_one_expert");
    uint32_t samples = 256, features = 16;
    float *x = malloc((size_t)samples * features * 4);
    uint8_t *y = malloc(samples);
    rng_state = 5;
    float row[16];
    for (uint32_t f = 0; f < features; f++) row[f] = rng_normal();
    for (uint32_t i = 0; i < samples; i++) {
        memcpy(x + (size_t)i * features, row, sizeof row);
        y[i] = (uint8_t)(rng_next() % 4);
    }
    char xs[160], ys[160], a[160], b[160];
    snprintf(xs, sizeof xs, "%s", tmp_path("same_x.npy"));
    snprintf(ys, sizeof ys, "%s", tmp_path("same_y.npy"));
    snprintf(a, sizeof a, "%s", tmp_path("same_a.trace"));
    snprintf(b, sizeof b, "%s", tmp_path("same_b.trace"));
    npy_save(xs, NPY_DTYPE_F32, 2, samples, features, x);
    npy_save(ys, NPY_DTYPE_U8, 1, samples, 1, y);
    static char text[TRAIN_TEXT_MAX];
    snprintf(text, sizeof text, "[model]\ninput = 16\nlayer = moe m experts=6 topk=1 hidden=32 "
             "act=silu aux=0.01\nlayer = linear head 4\nloss = softmax_xent\n[quant]\n"
             "recipe = delayed\n[optim]\nadamw lr=1e-2\n[data]\ntrain = npy %s %s\n"
             "eval = npy %s %s\nbatch = 64\nseed = 3\n[schedule]\ntrain 60\neval all\n", xs, ys,
             xs, ys);
    static train_log l;
    run_options o = {0};
    o.trace_path = a;
    const char *why = NULL;
    memset(&l, 0, sizeof l);
    l.inspect = routing_inspect;
    train_text(text, BACKEND_REF, &o, &l, &why);
    // Labels drawn uniformly from 4 classes: the loss of the best constant prediction is ln 4.
    CHECK(l.count > 60 && fabsf(l.values[l.count - 1][0] - 1.3863f) < 0.05f,
          "eval loss %g, expected about ln 4", l.values[l.count - 1][0]);
    uint32_t hot = 0;
    for (uint32_t e = 0; e < 6; e++) hot += l.first_dims[e] == 64;
    CHECK(hot == 1 && l.first_dims[0] + l.first_dims[1] + l.first_dims[2] + l.first_dims[3] +
                              l.first_dims[4] + l.first_dims[5] == 64,
          "tokens per expert %u %u %u %u %u %u", l.first_dims[0], l.first_dims[1],
          l.first_dims[2], l.first_dims[3], l.first_dims[4], l.first_dims[5]);
    // The last train step's counts, read after the eval pass that followed it: one expert took
    // the batch (which one may differ from the look above, which routes with the weights that
    // step updated).
    uint32_t hot_after = 0, sum_after = 0;
    for (uint32_t e = 0; e < 6; e++) hot_after += l.loads[e] == 64, sum_after += l.loads[e];
    CHECK(hot_after == 1 && sum_after == 64 && l.loads_kept,
          "run_expert_loads after the run: %u %u %u %u %u %u (kept to the last op: %d)",
          l.loads[0], l.loads[1], l.loads[2], l.loads[3], l.loads[4], l.loads[5], l.loads_kept);
    o.trace_path = b;
    memset(&l, 0, sizeof l);
    train_text(text, BACKEND_REF, &o, &l, &why);
    same_files(a, b);
    free(x);
    free(y);
    test_end();
}

// Many experts (64, 65, 256: more than a trace record's 64 delayed-scaling slots, members
// past any fixed per-launch array) with a batch that leaves most of them empty: the runs train,
// twice to the same trace (the checksums cover the slots the trace does not carry).
static void test_many_experts(uint32_t experts, const char *scheme) {
    char name[96];
    snprintf(name, sizeof name, "moe_%u_experts_train_and_repeat_%s", experts, scheme);
    test_begin(name);
    static char text[TRAIN_TEXT_MAX];
    snprintf(text, sizeof text, "[model]\ninput = 16\nlayer = linear fc1 32\nlayer = moe m "
             "experts=%u topk=2 hidden=32 act=gelu aux=0.01\nlayer = linear head 4\n"
             "loss = softmax_xent\n[quant]\nrecipe = %s\n[optim]\nadamw lr=1e-2\n[data]\n"
             "train = synthetic classes inputs=16 classes=4 samples=512 seed=3\nbatch = 48\n"
             "seed = 2\n[schedule]\ntrain 30\n", experts, scheme);
    char a[160], b[160];
    snprintf(a, sizeof a, "%s", tmp_path("many_a.trace"));
    snprintf(b, sizeof b, "%s", tmp_path("many_b.trace"));
    static train_log l;
    run_options o = {0};
    o.checksum_every = 10;
    o.trace_path = a;
    const char *why = NULL;
    memset(&l, 0, sizeof l);
    train_text(text, BACKEND_REF, &o, &l, &why);
    CHECK(l.count == 30 && isfinite(l.values[29][0]) && l.values[29][0] < l.values[0][0],
          "%u records, loss %g -> %g", l.count, l.values[0][0], l.values[l.count ? l.count - 1
                                                                          : 0][0]);
    o.trace_path = b;
    memset(&l, 0, sizeof l);
    train_text(text, BACKEND_REF, &o, &l, &why);
    same_files(a, b);
    test_end();
}

// A checkpoint in the middle, resumed, gives the uninterrupted run's trace; the checkpoint
// (per-expert scales, amaxes and delayed-scaling slots included) exports.
static void test_checkpoint(const char *scheme) {
    char name[96];
    snprintf(name, sizeof name, "moe_checkpoint_resume_identical_and_export_%s", scheme);
    test_begin(name);
    static char text[TRAIN_TEXT_MAX];
    moe_recipe(scheme, NULL, text, sizeof text);
    char recipe_path[100], full[100], part[100], ckpt[100], out[100], cmd[2048];
    snprintf(recipe_path, sizeof recipe_path, "%s", tmp_path("ckpt.recipe"));
    snprintf(full, sizeof full, "%s", tmp_path("ckpt_full.trace"));
    snprintf(part, sizeof part, "%s", tmp_path("ckpt_part.trace"));
    snprintf(ckpt, sizeof ckpt, "%s", tmp_path("moe.ckpt"));
    snprintf(out, sizeof out, "%s", tmp_path("moe.safetensors"));
    file_write(recipe_path, text, strlen(text));
    remove(full);
    remove(part);
    remove(ckpt);
    remove(out);
    static char output[1 << 16];
    char log[100];
    snprintf(log, sizeof log, "%s", tmp_path("ckpt.log"));
    snprintf(cmd, sizeof cmd, "build/qtrain run %s --ref --trace %s > %s 2>&1 && build/qtrain "
             "run %s --ref --steps 90 --save %s --trace %s >> %s 2>&1 && build/qtrain run %s "
             "--ref --resume %s --save %s --trace %s >> %s 2>&1 && build/qtrain diff %s %s && "
             "build/qtrain export %s %s --quantized",
             recipe_path, full, log, recipe_path, ckpt, part, log, recipe_path, ckpt, ckpt, part,
             log, full, part, ckpt, out);
    int rc = command_output(cmd, output, sizeof output);
    bool ok = rc == 0 && strstr(output, "identical: 204 records") &&
              strstr(output, "5 parameters with their quantized copies");
    size_t log_bytes = 0;
    char *runs = ok ? NULL : file_read(log, &log_bytes);
    CHECK(ok, "exit %d:\n%s\nthe runs:\n%.3000s", rc, output, runs ? runs : "");
    free(runs);
    test_end();
}

// A recipe of one moe layer (`experts` experts, top-`topk`, width and hidden `width`) in
// `scheme`, at `batch` rows.
static void line_recipe(char *text, size_t bytes, const char *scheme, uint32_t experts,
                        uint32_t topk, uint32_t width, uint32_t batch) {
    snprintf(text, bytes, "[model]\ninput = %u\nlayer = residual begin\nlayer = moe m experts=%u "
             "topk=%u hidden=%u act=gelu aux=0.01\nlayer = residual end\nlayer = linear head 4\n"
             "loss = softmax_xent\n[quant]\nrecipe = %s\n[optim]\nadamw lr=1e-3\n[data]\n"
             "train = synthetic classes inputs=%u classes=4 samples=%u seed=3\nbatch = %u\n"
             "seed = 2\n[schedule]\ntrain 4\n", width, experts, topk, width, scheme,
             width, 2 * batch, batch);
}

// The experts' rows start on 128 (whole 128-byte lines of the per-tensor FP8 columnwise copies)
// where that padding stays within 1/16 of the routed rows, and at the formats' own alignment
// elsewhere (BF16, MXFP8, NVFP4; FP8 block scaling's own is 128 already).
static void test_line_aligned_members(void) {
    test_begin("moe_members_padded_to_lines_where_cheap");
    static const struct {
        const char *scheme;
        uint32_t experts, topk, batch, align;
    } cases[] = {
        // 8 experts: up to 8 x 127 = 1016 padding rows, within 1/16 of 16256 routed rows.
        {"current", 2, 1, 4096, 128}, {"delayed", 8, 2, 8128, 128},  {"current", 8, 2, 8120, 16},
        {"current", 64, 2, 16384, 16}, {"bf16", 2, 1, 4096, 16},     {"mxfp8", 2, 1, 4096, 32},
        {"nvfp4", 2, 1, 4096, 16},     {"block", 2, 1, 64, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static char text[TRAIN_TEXT_MAX];
        line_recipe(text, sizeof text, cases[i].scheme, cases[i].experts, cases[i].topk, 128,
                    cases[i].batch);
        run_options o = {0};
        qt_status st = recipe_parse(text, strlen(text), "lines.recipe", &the_recipe);
        if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), &o);
        CHECK(st == QT_OK, "%s: %s", cases[i].scheme, qt_error_message());
        if (st != QT_OK) continue;
        const model_moe *mo = &the_run.model.moes[0];
        CHECK(mo->row_align == cases[i].align && mo->capacity % mo->row_align == 0,
              "%s, %u experts, top-%u, batch %u: rows aligned to %u (capacity %u), expected %u",
              cases[i].scheme, cases[i].experts, cases[i].topk, cases[i].batch, mo->row_align,
              mo->capacity, cases[i].align);
        run_close(&the_run);
    }
    test_end();
}

// Where the router's input gradient is folded into the un-permute (model_moe_router_dx_folded):
// a BF16 router (gradient and weight) of at most MODEL_MOE_ROUTER_FOLD_EXPERTS experts in a
// layer that needs its input's gradient. Then the train program has no router dgrad GEMM and no
// router.dx tensor; elsewhere the GEMM stays (or, in the first layer with parameters, no input
// gradient at all).
static void test_router_dx_folded_where_bf16_and_few(void) {
    test_begin("moe_router_dgrad_folded_where_bf16_and_few_experts");
    static const struct {
        const char *scheme, *rule;
        uint32_t experts;
        bool first, folded;
    } cases[] = {
        {"bf16", "", 8, false, true},
        {"current", "", 8, false, true},  // the built-in recipes keep the router BF16
        {"current", "", 16, false, true},
        {"current", "", 17, false, false},
        {"current", "", 64, false, false},
        {"current", "rule = router.*@m.router -> current\n", 8, false, false},
        {"bf16", "", 8, true, false},  // the first layer with parameters: no input gradient
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static char text[TRAIN_TEXT_MAX];
        snprintf(text, sizeof text, "[model]\ninput = 64\n%slayer = residual begin\nlayer = moe m "
                 "experts=%u topk=2 hidden=64 act=gelu aux=0.01\nlayer = residual end\n"
                 "layer = linear head 4\nloss = softmax_xent\n[quant]\nrecipe = %s\n%s"
                 "[optim]\nadamw lr=1e-3\n[data]\ntrain = synthetic classes inputs=64 "
                 "classes=4 samples=512 seed=3\nbatch = 128\nseed = 2\n[schedule]\ntrain 2\n",
                 cases[i].first ? "" : "layer = linear fc0 64\n", cases[i].experts,
                 cases[i].scheme, cases[i].rule);
        run_options o = {0};
        qt_status st = recipe_parse(text, strlen(text), "fold.recipe", &the_recipe);
        if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), &o);
        CHECK(st == QT_OK, "case %zu: %s", i, qt_error_message());
        if (st != QT_OK) continue;
        const model *m = &the_run.model;
        const model_moe *mo = &m->moes[0];
        const model_linear *router = &m->linears[mo->router];
        bool bf16 = m->quantizers[router->q_grad].q.format == QT_FORMAT_BF16 &&
                    m->quantizers[router->q_weight].q.format == QT_FORMAT_BF16;
        CHECK(bf16 == (cases[i].rule[0] == '\0'), "case %zu: the router is %sBF16", i,
              bf16 ? "" : "not ");
        bool folded = model_moe_router_dx_folded(m, mo);
        CHECK(folded == cases[i].folded, "case %zu (%s, %u experts): folded %d, expected %d", i,
              cases[i].scheme, cases[i].experts, folded, cases[i].folded);
        const program *p = &the_run.programs[MODEL_MODE_TRAIN];
        bool gemm = false, unpermute = false;
        for (uint32_t j = 0; j < p->op_count; j++) {
            gemm |= strcmp(p->ops[j].name, "m.router.dgrad") == 0;
            unpermute |= strcmp(p->ops[j].name, "m.dx") == 0;
        }
        arena_handle h;
        bool tensor = region_named(&the_run.dev, "train.m.router.dx", &h) != NULL;
        bool needs_dx = !cases[i].first;
        CHECK(gemm == (needs_dx && !cases[i].folded) && tensor == gemm && unpermute == needs_dx,
              "case %zu: router dgrad GEMM %d, router.dx tensor %d, un-permute %d", i, gemm,
              tensor, unpermute);
        run_close(&the_run);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU

// The GPU's training losses (g) against the reference backend's (r), at least `records`
// records each: within 2% (the GEMMs differ only in the order of their FP32 sums and the
// activations round to BF16; a wrong kernel is off by far more).
static void losses_near(const train_log *g, const train_log *r, uint32_t records) {
    CHECK(g->count == r->count && g->count >= records, "%u and %u records", g->count, r->count);
    for (uint32_t i = 0; i < g->count && i < r->count; i++) {
        if (g->modes[i] != MODEL_MODE_TRAIN) continue;
        float x = g->values[i][0], y = r->values[i][0];
        CHECK(fabsf(x - y) <= 0.02f * fabsf(y) + 1e-3f, "step %u: loss %g on the GPU, %g on the "
              "reference backend", i, x, y);
    }
}

// The weights after one step on the GPU and on the reference backend. The first AdamW step
// moves a master by lr m^/(sqrt(v^) + eps), about lr sign(g) whatever g's size, so GEMMs that
// differ in the order of their FP32 sums still give the same weights, except where the gradient
// norm (the clip's input) differs in its last bit: the update's quotient may then move by an ulp
// of lr, and a master that lands near zero (w0 close to lr) shows that ulp in its BF16 rounding.
// So a BF16 weight may differ in a few elements by one unit in the last place, all else byte for
// byte; a wrong kernel moves many elements by far more.
#define ONE_STEP_BF16_ULPS_MAX 4u

// Every format on the GPU: two graph runs and an eager run give one trace; the step loop
// synchronizes only for its lagged reads of the records (the experts' counts never reach the
// host); after one step the quantized weights equal the reference backend's
// (within ONE_STEP_BF16_ULPS_MAX), and 20 steps' losses agree within 2% (the GEMMs differ only in
// the order of their FP32 sums and the activations round to BF16; a wrong kernel is off by far
// more).
static void test_gpu_train(const char *scheme) {
    char name[96];
    snprintf(name, sizeof name, "gpu_moe_eager_graph_sync_and_ref_%s", scheme);
    static char text[TRAIN_TEXT_MAX];
    // Under a sanitizer (tools/sanitize.sh) 20 train steps: every kernel and launch of the step
    // is checked in the first one, and racecheck's 60-step runs outlast the device time.
    moe_recipe(scheme, test_sanitizer() ? "train 20 cosine 1e-2 -> 1e-3\neval all\ninfer 2\n"
                                        : "train 60 cosine 1e-2 -> 1e-3\neval all\ninfer 2\n",
               text, sizeof text);
    char a[160], b[160], c[160];
    snprintf(a, sizeof a, "%s", tmp_path("gpu_a.trace"));
    snprintf(b, sizeof b, "%s", tmp_path("gpu_b.trace"));
    snprintf(c, sizeof c, "%s", tmp_path("gpu_eager.trace"));
    static train_log g, r;
    run_options o = {0};
    o.checksum_every = 20;
    o.trace_path = a;
    const char *why = NULL;
    memset(&g, 0, sizeof g);
    test_begin(name);
    if (!train_text(text, BACKEND_GPU, &o, &g, &why)) {
        test_skip(name, why);
        return;
    }
    uint64_t steps = g.count;
    CHECK(g.syncs == g.lagged_reads && g.lagged_reads == steps, "%llu synchronizing calls, %llu "
          "lagged reads, %llu steps", (unsigned long long)g.syncs,
          (unsigned long long)g.lagged_reads, (unsigned long long)steps);
    o.trace_path = b;
    memset(&g, 0, sizeof g);
    train_text(text, BACKEND_GPU, &o, &g, &why);
    o.trace_path = c;
    o.eager = true;
    memset(&g, 0, sizeof g);
    train_text(text, BACKEND_GPU, &o, &g, &why);
    same_files(a, b);
    same_files(a, c);
    o.eager = false;
    o.trace_path = NULL;
    o.steps_limit = 1;
    memset(&g, 0, sizeof g);
    memset(&r, 0, sizeof r);
    g.weights_prefix = r.weights_prefix = "moe1.";
    train_text(text, BACKEND_GPU, &o, &g, &why);
    train_text(text, BACKEND_REF, &o, &r, &why);
    same_weights(&g, &r, ONE_STEP_BF16_ULPS_MAX);
    log_free(&g);
    log_free(&r);
    o.steps_limit = 20;
    memset(&g, 0, sizeof g);
    memset(&r, 0, sizeof r);
    train_text(text, BACKEND_GPU, &o, &g, &why);
    train_text(text, BACKEND_REF, &o, &r, &why);
    losses_near(&g, &r, 20);
    test_end();
}

// Experts on 128-row lines train to the bytes of the same model at the formats' own alignment
// (run_options.moe_own_align): the padding moves no value. On the reference backend (small
// experts), and on the GPU (two experts of about 2048 rows, K-grouped weight gradients of 48
// tiles, enough for the sm_90a tier), where four steps' losses also agree with the reference
// backend's within 2%.
static void line_aligned_case(backend_kind kind, uint32_t width) {
    char name[96];
    snprintf(name, sizeof name, "%smoe_line_aligned_members_train_like_unpadded_current",
             kind == BACKEND_GPU ? "gpu_" : "");
    static char text[TRAIN_TEXT_MAX];
    line_recipe(text, sizeof text, "current", 2, 1, width, 4096);
    char a[160], b[160];
    snprintf(a, sizeof a, "%s", tmp_path("lines_a.trace"));
    snprintf(b, sizeof b, "%s", tmp_path("lines_b.trace"));
    static train_log g, r;
    run_options o = {0};
    o.checksum_every = 2;
    o.trace_path = a;
    const char *why = NULL;
    memset(&g, 0, sizeof g);
    test_begin(name);
    if (!train_text(text, kind, &o, &g, &why)) {
        test_skip(name, why);
        return;
    }
    CHECK(the_run.model.moes[0].row_align == 128, "rows aligned to %u, expected 128",
          the_run.model.moes[0].row_align);
    o.trace_path = b;
    o.moe_own_align = true;
    memset(&r, 0, sizeof r);
    train_text(text, kind, &o, &r, &why);
    CHECK(the_run.model.moes[0].row_align == 16, "rows aligned to %u with the formats' own, "
          "expected 16", the_run.model.moes[0].row_align);
    same_files(a, b);
    if (kind == BACKEND_GPU) {
        o.trace_path = NULL;
        o.moe_own_align = false;
        memset(&r, 0, sizeof r);
        train_text(text, BACKEND_REF, &o, &r, &why);
        losses_near(&g, &r, 4);
    }
    test_end();
}

int main(void) {
    if (!tmp_dir_make("moe")) {
        printf("FAIL moe_temporary_folder: cannot make one under /tmp\n");
        return 1;
    }
    TEST_UNIT(test_routing_ref());
    TEST_UNIT(test_routing_gpu());
    TEST_UNIT(test_stacked_gemms(STACK_CURRENT, "current", false));
    TEST_UNIT(test_stacked_gemms(STACK_MXFP8, "mxfp8", false));
    TEST_UNIT(test_stacked_gemms(STACK_BLOCK, "block", false));
    TEST_UNIT(test_stacked_gemms(STACK_NVFP4, "nvfp4", false));
    // On the sm_90a tier, the formats whose every expert GEMM it takes (MXFP8's columnwise
    // copies are outer-major and NVFP4's wgrad K-grouped: those stay portable, whose bits differ
    // from the tier's).
    TEST_UNIT(test_stacked_gemms(STACK_CURRENT, "current", true));
    TEST_UNIT(test_stacked_gemms(STACK_BLOCK, "block", true));
    TEST_UNIT(test_layer_gradients());
    static const char *const schemes[] = {"bf16", "delayed", "current", "mxfp8", "block",
                                          "nvfp4"};
    for (size_t i = 0; i < 6; i++) {
        TEST_UNIT(test_one_expert_dense(schemes[i], strcmp(schemes[i], "block") == 0));
    }
    TEST_UNIT(test_converges());
    for (size_t i = 0; i < 6; i++) {
        uint32_t steps = strcmp(schemes[i], "block") == 0 ? 40 : 200;
        TEST_UNIT(test_determinism_interleave(schemes[i], steps));
    }
    TEST_UNIT(test_one_expert_takes_all());
    TEST_UNIT(test_many_experts(64, "current"));
    TEST_UNIT(test_many_experts(65, "delayed"));
    TEST_UNIT(test_many_experts(256, "nvfp4"));
    TEST_UNIT(test_checkpoint("delayed"));
    TEST_UNIT(test_checkpoint("nvfp4"));
    TEST_UNIT(test_line_aligned_members());
    TEST_UNIT(line_aligned_case(BACKEND_REF, 64));
    for (size_t i = 0; i < 6; i++) TEST_UNIT(test_gpu_train(schemes[i]));
    TEST_UNIT(line_aligned_case(BACKEND_GPU, 768));
    TEST_UNIT(test_router_dx_folded_where_bf16_and_few());
    tmp_dir_remove();
    return test_exit_code();
}
