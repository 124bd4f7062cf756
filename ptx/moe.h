// moe: the mixture-of-experts routing ops (ptx/moe.cu): the kernels' ABI, launch constants and the
// per-token arithmetic they share with their C twins (runtime/ref/ref_moe.c). The expert GEMMs are
// the GEMM family's M- and K-grouped GEMMs; the grouped quantization is each format's.
//
// Owns nothing. One MoE layer of T tokens (the batch rows), E experts, top-k K; an assignment is
// one (token t, choice j) pair, index a = t K + j, A = T K assignments in all:
//
//   logits f32 [T][E] --route--> probs f32 [T][E] (softmax), expert u32 [A], gate f32 [A]
//   expert --count--> chunk_counts u32 [C][E]  (C = ceil(A / QT_MOE_CHUNK) chunks of assignments)
//          --scan---> chunk_base u32 [C][E] (the exclusive prefix over chunks), first_dims u32 [E]
//                     (totals); out of place, so every op of the routing gives the same result
//                     when it runs again on the same inputs (`qtrain run --profile` repeats each).
//                     It also zeroes the layer's per-member amax slots (optional, f32
//                     [slots][E]), which later ops of the layer merge maxima into, so that those
//                     need no zeroing launch of their own.
//   first_dims --qt_group_offsets (quant_group.h, padded to the layer's row_align)--> row_offsets
//   expert, chunk_base, row_offsets --permute--> row_of u32 [A], assign_of u32 [capacity]
//
// The permutation is a stable counting sort: expert e's rows [off[e], off[e] + first_dims[e])
// hold its assignments in increasing a, so every row is a function of the routing alone (integer
// counts and prefix sums, no atomics on values, no order that depends on the grid). The permuted
// tensors are grouped tensors (ptx/quant.h) with row_offsets and first_dims as above: member e's
// padding rows [off[e] + first_dims[e], off[e + 1]) and the rows from off[E] on belong to no
// assignment, and the kernels that walk permuted rows find a row's member with
// qt_group_find(_warp), never from assign_of, whose entries outside valid rows are stale.
//
//   gather        x [T][cols] -> xp [capacity][cols]: valid row r = x[assign_of[r] / K], padding
//                 rows zero, rows from off[E] on untouched (dtype kept: a byte copy); optional
//                 amax[e] = max |x| over member e's valid rows
//   combine       out[t] = addend[t] + sum over j of w_j yp[row_of[a]], a = t K + j, w_j = gate[a]
//                 (forward; the addend, when given, a residual block's skip path) or 1 (the
//                 input gradient's un-permute); in FP32, one rounding at the store. The
//                 un-permute may also fold in the router's input gradient, dlogits[t] . W[:, c]
//                 over the experts in index order (a BF16 router's dgrad, whose K = E is too
//                 short for a GEMM to pay its launch and its [T][cols] output's round trip);
//                 the sum starts with it: router term, then the choices
//   combine_bwd   dyp[r] = gate[a] dy[t] (padding rows zero), dgate[a] = dy[t] . yp[r]; optional
//                 amax[e] = max |dyp| over member e's valid rows (the stored values)
//   router_bwd    dlogits[t][e] = p_e (g_e - sum_f p_f g_f), g_e = dgate of the choice of e
//                 (0 when e was not chosen) + aux_scale first_dims[e] (the load-balancing loss)
//
// Numerics. Softmax in FP32 with qt_expf: m = max of the row (NaN logits are skipped), s = the
// sum of exp(l - m) in index order, p = exp(l - m) / s. Top-k: choice j is the expert after
// choice j - 1 in the order "larger probability first, lower index on ties" (a NaN probability
// counts as -1, below every number), so the choices are distinct without a mark array and any
// K <= E works. The gate is the softmax probability itself (not renormalized over the K), so
// top-1 routing still passes a gradient to the router. Dot products (dgate) use the row order
// of ptx/act.h (lane j of a warp owns chunks j, j + 32, ... of 8 elements, folds them in index
// order with qt_fmaf, then QT_ACT_TREE32); the per-token loops of route, combine and router_bwd
// run in index order on one thread. So the twins give the kernels' bits.
//
// Amaxes. The optional amax outputs are what qt_fp8_amax gives over the stored tensor with the
// layer's group (NaN skipped, padding rows and rows past off[E] not counted): the
// current-scaling casts of xp and dyp read them instead of a pass of their own. Each block keeps
// one maximum per member in shared memory and merges them into the slots with atomicMax
// (ptx/act.h); a maximum is order-free, so the values are the separate pass's bits.
//
// Traffic. gather and combine_bwd walk tokens, one warp each: the warp reads x[t] (dy[t]) once
// and writes (and reads) its K permuted rows row_of[t K + j], so x (dy) comes from DRAM once and
// not once per choice; the warp of permuted row w also zeroes it when it is a padding row. All
// three kernels move 16-byte vectors where cols is a multiple of 8 and the tensors are 16-byte
// aligned (single elements otherwise, the same values), with several loads in flight per thread.
//
// Load-balancing loss (Switch Transformer's, with the top-k fraction): L_aux = alpha E sum_e f_e
// P_e, f_e = first_dims[e] / (T K), P_e = mean over t of p[t][e], f taken as a constant; so
// dL_aux / dp[t][e] = alpha E first_dims[e] / (T^2 K) = aux_scale first_dims[e], with aux_scale
// computed once on the host (op_moe_aux_scale), the same number on both backends.
#ifndef QT_MOE_H
#define QT_MOE_H

#include "ptx/act.h"      // qt_act_load, qt_act_store, QT_ACT_TREE32, QT_ACT_CHUNK
#include "ptx/qt_math.h"  // qt_expf
#include "ptx/quant.h"    // qt_group_desc

// Assignments per chunk of the counting sort: one block counts a chunk, one warp places it.
#define QT_MOE_CHUNK 256u
#define QT_MOE_COUNT_THREADS 256u
#define QT_MOE_SCAN_EXPERTS 32u     // scan: a block's experts, one per lane of each warp
#define QT_MOE_SCAN_THREADS 1024u   // scan: 32 warps, each over a 32nd of the chunks
#define QT_MOE_TOKEN_THREADS 128u   // route, router_bwd: one token per thread
#define QT_MOE_ROW_THREADS 256u     // gather, combine_bwd: one token and one permuted row per warp
#define QT_MOE_ROWS_PER_BLOCK 8u
#define QT_MOE_FLAT_THREADS 256u    // combine: one chunk of QT_ACT_CHUNK columns per thread
// 16-byte loads a thread issues before it uses them: gather, 4 vectors of its row (40 registers);
// combine_bwd, 2 chunks of dy and yp each (64 registers; 4 took 102, half the warps for the
// same bytes in flight); combine, the chunks of 2 choices (top-2 in one round).
#define QT_MOE_GATHER_UNROLL 4u
#define QT_MOE_COMBINE_BWD_UNROLL 2u
#define QT_MOE_COMBINE_UNROLL 2u
#define QT_MOE_NONE 0xFFFFFFFFu
#define QT_MOE_EXPERTS_MAX 1024u    // the recipe's experts_max; permute's shared memory
#define QT_MOE_WHOLE_ROWS 16u       // whole_dims: rows of the NVFP4 RHT's groups

typedef struct moe_route_args {
    uint64_t logits;  // f32 [tokens][experts]
    uint64_t probs;   // f32 [tokens][experts], written
    uint64_t expert;  // u32 [tokens][topk], written
    uint64_t gate;    // f32 [tokens][topk], written
    uint32_t tokens, experts, topk, reserved;
} moe_route_args;
QT_STATIC_ASSERT(sizeof(moe_route_args) == 48, "moe_route_args layout");

typedef struct moe_count_args {
    uint64_t expert;        // u32 [assignments]
    uint64_t chunk_counts;  // u32 [chunks][experts], written
    uint32_t assignments, experts, chunks, reserved;
} moe_count_args;
QT_STATIC_ASSERT(sizeof(moe_count_args) == 32, "moe_count_args layout");

typedef struct moe_scan_args {
    uint64_t chunk_counts;  // u32 [chunks][experts]: the counts, read
    uint64_t chunk_base;    // u32 [chunks][experts], written: the exclusive prefix over chunks
    uint64_t first_dims;    // u32 [experts], written: assignments of each expert
    uint64_t whole_dims;    // u32 [experts], written unless 0: first_dims rounded up to whole
                            // QT_MOE_WHOLE_ROWS (the NVFP4 RHT's 16-row groups, see op_moe.h)
    uint64_t amax;          // f32 [amax_slots][experts], set to +0 unless 0: the layer's
                            // per-member amax slots
    uint32_t experts, chunks;
    uint32_t amax_slots, reserved;
} moe_scan_args;
QT_STATIC_ASSERT(sizeof(moe_scan_args) == 56, "moe_scan_args layout");

typedef struct moe_permute_args {
    uint64_t expert;       // u32 [assignments]
    uint64_t chunk_base;   // u32 [chunks][experts]: the scan's exclusive prefix
    uint64_t row_offsets;  // u32 [experts + 1]
    uint64_t row_of;       // u32 [assignments], written
    uint64_t assign_of;    // u32 [capacity], written at valid rows
    uint32_t assignments, experts, chunks, reserved;
} moe_permute_args;
QT_STATIC_ASSERT(sizeof(moe_permute_args) == 56, "moe_permute_args layout");

typedef struct moe_gather_args {
    uint64_t x;           // [tokens][row_bytes]
    uint64_t out;         // [capacity][row_bytes]
    uint64_t row_of;      // u32 [tokens * topk]
    uint64_t expert;      // u32 [tokens * topk]: each choice's member; read with amax only
    uint64_t amax;        // f32 [experts], or 0: max |x| over each member's rows merged in
    qt_group_desc group;  // the experts' row_offsets and first_dims
    uint32_t tokens, capacity;
    uint32_t row_bytes;   // cols times the element's bytes
    uint32_t topk;
    uint32_t dtype;       // x's elements: QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t reserved;
} moe_gather_args;
QT_STATIC_ASSERT(sizeof(moe_gather_args) == 88, "moe_gather_args layout");

typedef struct moe_combine_args {
    uint64_t src;       // [capacity][cols] src_dtype: permuted rows
    uint64_t row_of;    // u32 [tokens * topk]
    uint64_t gate;      // f32 [tokens * topk], or 0: every weight 1
    uint64_t addend;    // [tokens][cols] addend_dtype, or 0
    uint64_t out;       // [tokens][cols] out_dtype, written
    uint64_t dlogits;   // [tokens][experts] dlogits_dtype: the router term's gradient, or 0
    uint64_t router_w;  // bf16 [experts][router_w_cols]: the router's weight (with dlogits)
    uint32_t tokens, cols, topk;
    uint32_t src_dtype, addend_dtype, out_dtype;
    uint32_t experts, dlogits_dtype, router_w_cols, reserved;
} moe_combine_args;
QT_STATIC_ASSERT(sizeof(moe_combine_args) == 96, "moe_combine_args layout");

typedef struct moe_combine_bwd_args {
    uint64_t dy;          // [tokens][cols] dy_dtype: the layer output's gradient
    uint64_t yp;          // [capacity][cols] yp_dtype: the experts' outputs (permuted)
    uint64_t gate;        // f32 [tokens * topk]
    uint64_t row_of;      // u32 [tokens * topk]
    uint64_t expert;      // u32 [tokens * topk]: each choice's member; read with amax only
    uint64_t dyp;         // [capacity][cols] dyp_dtype, written (padding rows zero)
    uint64_t dgate;       // f32 [tokens * topk], written
    uint64_t amax;        // f32 [experts], or 0: max |dyp| over each member's valid rows merged in
    qt_group_desc group;
    uint32_t tokens, capacity, cols, topk;
    uint32_t dy_dtype, yp_dtype, dyp_dtype;
    uint32_t reserved;
} moe_combine_bwd_args;
QT_STATIC_ASSERT(sizeof(moe_combine_bwd_args) == 120, "moe_combine_bwd_args layout");

typedef struct moe_router_bwd_args {
    uint64_t probs;       // f32 [tokens][experts]
    uint64_t expert;      // u32 [tokens][topk]
    uint64_t dgate;       // f32 [tokens][topk]
    uint64_t first_dims;  // u32 [experts]: assignments per expert (the aux loss's f_e)
    uint64_t dlogits;     // [tokens][experts] out_dtype, written
    float aux_scale;      // op_moe_aux_scale; 0: no load-balancing loss
    uint32_t tokens, experts, topk, out_dtype;
    uint32_t reserved;
} moe_router_bwd_args;
QT_STATIC_ASSERT(sizeof(moe_router_bwd_args) == 64, "moe_router_bwd_args layout");

// A grouped tensor of `count` members of `rows` rows each, back to back (stacked expert weights):
// row_offsets[i] = i rows, first_dims[i] = rows.
typedef struct moe_uniform_group_args {
    uint64_t row_offsets;  // u32 [count + 1], written
    uint64_t first_dims;   // u32 [count], written
    uint32_t count, rows;
} moe_uniform_group_args;
QT_STATIC_ASSERT(sizeof(moe_uniform_group_args) == 24, "moe_uniform_group_args layout");

#define QT_KERNELS_MOE(X)                                                         \
    X(KERNEL_MOE_ROUTE, moe, qt_moe_route, moe_route_args)                        \
    X(KERNEL_MOE_COUNT, moe, qt_moe_count, moe_count_args)                        \
    X(KERNEL_MOE_SCAN, moe, qt_moe_scan, moe_scan_args)                           \
    X(KERNEL_MOE_PERMUTE, moe, qt_moe_permute, moe_permute_args)                  \
    X(KERNEL_MOE_GATHER, moe, qt_moe_gather, moe_gather_args)                     \
    X(KERNEL_MOE_COMBINE, moe, qt_moe_combine, moe_combine_args)                  \
    X(KERNEL_MOE_COMBINE_BWD, moe, qt_moe_combine_bwd, moe_combine_bwd_args)      \
    X(KERNEL_MOE_ROUTER_BWD, moe, qt_moe_router_bwd, moe_router_bwd_args)         \
    X(KERNEL_MOE_UNIFORM_GROUP, moe, qt_moe_uniform_group, moe_uniform_group_args)

// ---------------------------------------------------------------------------------------------
// Per-token arithmetic, the same on both backends.

// Softmax of one row of logits into probs (see Numerics above).
QT_HD void qt_moe_softmax(const float *logits, float *probs, uint32_t experts) {
    float m = qt_bits_f32(0xFF800000u);  // -Inf: a row of -Inf logits gives NaN, like xent
    for (uint32_t e = 0; e < experts; e++) m = logits[e] > m ? logits[e] : m;
    float s = 0.0f;
    for (uint32_t e = 0; e < experts; e++) s = s + qt_expf(logits[e] - m);
    for (uint32_t e = 0; e < experts; e++) probs[e] = qt_act_canonical(qt_expf(logits[e] - m) / s);
}

// The ordering key of a probability: NaN below every number.
QT_HD float qt_moe_key(float p) { return qt_f32_is_nan(p) ? -1.0f : p; }

// Whether expert e (key k) comes after expert e0 (key k0) in the top-k order.
QT_HD int qt_moe_after(float k, uint32_t e, float k0, uint32_t e0) {
    return k < k0 || (k == k0 && e > e0);
}

// The K choices of one token: choice j is the first expert, in the order, after choice j - 1.
QT_HD void qt_moe_topk(const float *probs, uint32_t experts, uint32_t topk, uint32_t *expert,
                       float *gate) {
    float prev_key = 2.0f;  // above every probability: choice 0 may be any expert
    uint32_t prev = 0;
    for (uint32_t j = 0; j < topk; j++) {
        uint32_t best = QT_MOE_NONE;
        float best_key = 0.0f;
        for (uint32_t e = 0; e < experts; e++) {
            float k = qt_moe_key(probs[e]);
            if (j > 0 && !qt_moe_after(k, e, prev_key, prev)) continue;
            if (best == QT_MOE_NONE || qt_moe_after(best_key, best, k, e)) {
                best = e;
                best_key = k;
            }
        }
        expert[j] = best;
        gate[j] = probs[best];
        prev = best;
        prev_key = best_key;
    }
}

// g_e of router_bwd: the gradient of the loss with respect to p[t][e].
QT_HD float qt_moe_dprob(const uint32_t *expert, const float *dgate, uint32_t topk, uint32_t e,
                         float aux) {
    float g = aux;
    for (uint32_t j = 0; j < topk; j++) {
        if (expert[j] == e) g = g + dgate[j];
    }
    return g;
}

// One token's router gradient (see the header comment): two passes over the experts.
QT_HD void qt_moe_router_grad(const moe_router_bwd_args *a, uint32_t t) {
    const float *p = (const float *)(uintptr_t)a->probs + (uint64_t)t * a->experts;
    const uint32_t *expert = (const uint32_t *)(uintptr_t)a->expert + (uint64_t)t * a->topk;
    const float *dgate = (const float *)(uintptr_t)a->dgate + (uint64_t)t * a->topk;
    const uint32_t *counts = (const uint32_t *)(uintptr_t)a->first_dims;
    float s = 0.0f;
    for (uint32_t e = 0; e < a->experts; e++) {
        float g = qt_moe_dprob(expert, dgate, a->topk, e, a->aux_scale * (float)counts[e]);
        s = qt_fmaf(p[e], g, s);
    }
    for (uint32_t e = 0; e < a->experts; e++) {
        float g = qt_moe_dprob(expert, dgate, a->topk, e, a->aux_scale * (float)counts[e]);
        qt_act_store(a->dlogits, (uint64_t)t * a->experts + e, a->out_dtype, p[e] * (g - s));
    }
}

// One output element of combine: addend + (router term) + sum over j of w_j
// src[row_of[t K + j]][c], one FP32 fma chain in that order.
QT_HD float qt_moe_combine_value(const moe_combine_args *a, uint32_t t, uint32_t c) {
    float acc = a->addend ? qt_act_load(a->addend, (uint64_t)t * a->cols + c, a->addend_dtype)
                          : 0.0f;
    for (uint32_t e = 0; a->dlogits && e < a->experts; e++) {
        float d = qt_act_load(a->dlogits, (uint64_t)t * a->experts + e, a->dlogits_dtype);
        float wv = qt_act_load(a->router_w, (uint64_t)e * a->router_w_cols + c, QT_DTYPE_BF16);
        acc = qt_fmaf(d, wv, acc);
    }
    const uint32_t *row_of = (const uint32_t *)(uintptr_t)a->row_of;
    for (uint32_t j = 0; j < a->topk; j++) {
        uint64_t assignment = (uint64_t)t * a->topk + j;
        float w = a->gate ? ((const float *)(uintptr_t)a->gate)[assignment] : 1.0f;
        float v = qt_act_load(a->src, (uint64_t)row_of[assignment] * a->cols + c, a->src_dtype);
        acc = qt_fmaf(w, v, acc);
    }
    return acc;
}

// Whether permuted row r holds an assignment (member = its expert, found by the caller).
QT_HD int qt_moe_row_valid(qt_group_desc g, uint32_t member, uint32_t r) {
    const uint32_t *off = (const uint32_t *)(uintptr_t)g.row_offsets;
    const uint32_t *dims = (const uint32_t *)(uintptr_t)g.first_dims;
    return r - off[member] < dims[member];
}

#endif  // QT_MOE_H
