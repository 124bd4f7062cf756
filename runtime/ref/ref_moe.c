// C twins of ptx/moe.cu. The counting sort is the sequential one (its result is the kernels': a
// stable sort by expert); dgate folds each row in the warp's lane order (moe.h) and then runs the
// same lane tree; the per-token loops are moe.h's own functions. gather and combine_bwd walk the
// tokens and then the padding rows, as the kernels' warps do; their amaxes are maxima (NaN
// skipped), merged per member with the kernels' atomicMax rule.
#include <string.h>  // memcpy, memset

#include "ptx/quant_group.h"      // qt_group_roundup
#include "runtime/ref/ref.h"
#include "runtime/base/status.h"  // QT_ASSERT

void ref_qt_moe_route(const moe_route_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint32_t t = 0; t < a->tokens; t++) {
        const float *logits = REF_PTR(const float, a->logits) + (uint64_t)t * a->experts;
        float *probs = REF_PTR(float, a->probs) + (uint64_t)t * a->experts;
        qt_moe_softmax(logits, probs, a->experts);
        qt_moe_topk(probs, a->experts, a->topk, REF_PTR(uint32_t, a->expert) +
                    (uint64_t)t * a->topk, REF_PTR(float, a->gate) + (uint64_t)t * a->topk);
    }
}

void ref_qt_moe_count(const moe_count_args *a, const launch_shape *shape) {
    (void)shape;
    const uint32_t *expert = REF_PTR(const uint32_t, a->expert);
    uint32_t *counts = REF_PTR(uint32_t, a->chunk_counts);
    for (uint64_t i = 0; i < (uint64_t)a->chunks * a->experts; i++) counts[i] = 0;
    for (uint32_t i = 0; i < a->assignments; i++) {
        QT_ASSERT(expert[i] < a->experts);
        counts[(uint64_t)(i / QT_MOE_CHUNK) * a->experts + expert[i]]++;
    }
}

void ref_qt_moe_scan(const moe_scan_args *a, const launch_shape *shape) {
    (void)shape;
    const uint32_t *counts = REF_PTR(const uint32_t, a->chunk_counts);
    uint32_t *base = REF_PTR(uint32_t, a->chunk_base);
    for (uint32_t e = 0; e < a->experts; e++) {
        uint32_t run = 0;
        for (uint32_t c = 0; c < a->chunks; c++) {
            uint64_t slot = (uint64_t)c * a->experts + e;
            base[slot] = run;
            run += counts[slot];
        }
        REF_PTR(uint32_t, a->first_dims)[e] = run;
        if (a->whole_dims) {
            REF_PTR(uint32_t, a->whole_dims)[e] = qt_group_roundup(run, QT_MOE_WHOLE_ROWS);
        }
    }
    for (uint64_t i = 0; a->amax && i < (uint64_t)a->amax_slots * a->experts; i++) {
        REF_PTR(float, a->amax)[i] = 0.0f;
    }
}

// Chunk by chunk, each expert's rows handed out in assignment order.
void ref_qt_moe_permute(const moe_permute_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->experts <= QT_MOE_EXPERTS_MAX);
    const uint32_t *expert = REF_PTR(const uint32_t, a->expert);
    const uint32_t *base = REF_PTR(const uint32_t, a->chunk_base);
    const uint32_t *off = REF_PTR(const uint32_t, a->row_offsets);
    uint32_t *row_of = REF_PTR(uint32_t, a->row_of);
    uint32_t *assign_of = REF_PTR(uint32_t, a->assign_of);
    uint32_t next[QT_MOE_EXPERTS_MAX];
    for (uint32_t c = 0; c < a->chunks; c++) {
        for (uint32_t e = 0; e < a->experts; e++) {
            next[e] = off[e] + base[(uint64_t)c * a->experts + e];
        }
        uint32_t begin = c * QT_MOE_CHUNK;
        uint32_t end = a->assignments - begin < QT_MOE_CHUNK ? a->assignments
                                                              : begin + QT_MOE_CHUNK;
        for (uint32_t i = begin; i < end; i++) {
            uint32_t row = next[expert[i]]++;
            row_of[i] = row;
            assign_of[row] = i;
        }
    }
}

// Padding rows of a grouped tensor of `capacity` rows (row_bytes each) set to zeros.
static void ref_moe_zero_padding(qt_group_desc g, uint32_t capacity, uint64_t base,
                                 uint64_t row_bytes) {
    uint32_t active = qt_group_active_rows(g, capacity);
    for (uint32_t r = 0; r < active; r++) {
        uint32_t member = qt_group_find(g, 0, g.count, r);
        if (!qt_moe_row_valid(g, member, r)) memset(REF_PTR(void, base + r * row_bytes), 0,
                                                    row_bytes);
    }
}

// The kernels' amax merge of a row's maximum into each member the row went to.
static void ref_moe_amax_merge(uint64_t amax, const uint32_t *expert, uint32_t topk, float m) {
    for (uint32_t j = 0; amax && j < topk; j++) ref_amax_merge(REF_PTR(float, amax) + expert[j], m);
}

void ref_qt_moe_gather(const moe_gather_args *a, const launch_shape *shape) {
    (void)shape;
    uint32_t elem = a->dtype == QT_DTYPE_F32 ? 4 : 2;
    for (uint32_t t = 0; t < a->tokens; t++) {
        const uint32_t *row_of = REF_PTR(const uint32_t, a->row_of) + (uint64_t)t * a->topk;
        uint64_t src = a->x + (uint64_t)t * a->row_bytes;
        for (uint32_t j = 0; j < a->topk; j++) {
            memcpy(REF_PTR(void, a->out + (uint64_t)row_of[j] * a->row_bytes),
                   REF_PTR(const void, src), a->row_bytes);
        }
        if (!a->amax) continue;
        float m = 0.0f;
        for (uint32_t i = 0; i < a->row_bytes / elem; i++) {
            m = qt_fp8_amax_step(m, qt_act_load(src, i, a->dtype));
        }
        ref_moe_amax_merge(a->amax, REF_PTR(const uint32_t, a->expert) + (uint64_t)t * a->topk,
                           a->topk, m);
    }
    ref_moe_zero_padding(a->group, a->capacity, a->out, a->row_bytes);
}

void ref_qt_moe_combine(const moe_combine_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint32_t t = 0; t < a->tokens; t++) {
        for (uint32_t c = 0; c < a->cols; c++) {
            qt_act_store(a->out, (uint64_t)t * a->cols + c, a->out_dtype,
                         qt_moe_combine_value(a, t, c));
        }
    }
}

// One assignment's row: dyp[r] = g dy[t] and dgate, folded in the kernels' lane order; returns
// max |g dy| over the row.
static float ref_moe_combine_bwd_row(const moe_combine_bwd_args *a, uint64_t assignment) {
    uint64_t in = assignment / a->topk * a->cols;
    uint64_t out = (uint64_t)REF_PTR(const uint32_t, a->row_of)[assignment] * a->cols;
    float g = REF_PTR(const float, a->gate)[assignment];
    float lanes[QT_ACT_LANES] = {0};
    float m = 0.0f;
    for (uint32_t c = 0; c < a->cols; c++) {
        float dy = qt_act_load(a->dy, in + c, a->dy_dtype);
        float *acc = &lanes[(c / QT_ACT_CHUNK) % QT_ACT_LANES];
        *acc = qt_fmaf(dy, qt_act_load(a->yp, out + c, a->yp_dtype), *acc);
        m = qt_fp8_amax_step(m, g * dy);
        qt_act_store(a->dyp, out + c, a->dyp_dtype, g * dy);
    }
    QT_ACT_TREE32(lanes, qt_act_add);
    REF_PTR(float, a->dgate)[assignment] = qt_act_canonical(lanes[0]);
    return m;
}

void ref_qt_moe_combine_bwd(const moe_combine_bwd_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint64_t i = 0; i < (uint64_t)a->tokens * a->topk; i++) {
        float m = qt_act_stored_amax(ref_moe_combine_bwd_row(a, i), a->dyp_dtype);
        ref_moe_amax_merge(a->amax, REF_PTR(const uint32_t, a->expert) + i, 1, m);
    }
    ref_moe_zero_padding(a->group, a->capacity, a->dyp,
                         (uint64_t)a->cols * qt_act_dtype_bytes(a->dyp_dtype));
}

void ref_qt_moe_router_bwd(const moe_router_bwd_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint32_t t = 0; t < a->tokens; t++) qt_moe_router_grad(a, t);
}

void ref_qt_moe_uniform_group(const moe_uniform_group_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint32_t i = 0; i <= a->count; i++) REF_PTR(uint32_t, a->row_offsets)[i] = i * a->rows;
    for (uint32_t i = 0; i < a->count; i++) REF_PTR(uint32_t, a->first_dims)[i] = a->rows;
}
