// C twins of ptx/dp.h: the three folds, and the collective op over the ranks' threads of one
// process (runtime/parallel/parallel.h's dp_ref_group).
#include <string.h>

#include "runtime/parallel/parallel.h"
#include "runtime/ref/ref.h"

static uint64_t ref_dp_elem_bytes(uint32_t dtype) { return dtype == DP_DTYPE_F32 ? 4 : 1; }

// out[i] = fold over ranks, in rank order, of each rank's send[i] (f32 sum or max; u8 sum
// wraps, u8 max). Only the calling rank's `out` is written.
static void ref_dp_reduce_into(const dp_ref_group *g, const dp_item *mine, void *out) {
    uint64_t n = mine->count;
    if (mine->dtype == DP_DTYPE_F32) {
        float *o = out;
        for (uint64_t i = 0; i < n; i++) {
            float acc = REF_PTR(const float, g->posted[0]->send)[i];
            for (uint32_t r = 1; r < g->world; r++) {
                float x = REF_PTR(const float, g->posted[r]->send)[i];
                acc = mine->op == DP_OP_MAX ? (x > acc || qt_f32_is_nan(x) ? x : acc) : acc + x;
            }
            o[i] = qt_act_canonical(acc);
        }
        return;
    }
    uint8_t *o = out;
    for (uint64_t i = 0; i < n; i++) {
        uint8_t acc = REF_PTR(const uint8_t, g->posted[0]->send)[i];
        for (uint32_t r = 1; r < g->world; r++) {
            uint8_t x = REF_PTR(const uint8_t, g->posted[r]->send)[i];
            acc = mine->op == DP_OP_MAX ? (x > acc ? x : acc) : (uint8_t)(acc + x);
        }
        o[i] = acc;
    }
}

// One item on every rank: posted, then (after the first barrier) computed by each rank into its
// own recv from the others' buffers, then a second barrier before any rank goes on to write
// them. An all-reduce is a reduce into rank 0 and a broadcast from it (a third barrier between),
// since an in-place rank may not write the buffer that the others still read.
void dp_ref_item(const dp_comm *c, const dp_item *it) {
    dp_ref_group *g = c->group;
    uint64_t bytes = it->count * ref_dp_elem_bytes(it->dtype);
    void *recv = REF_PTR(void, it->recv);
    g->posted[c->rank] = it;
    pthread_barrier_wait(&g->barrier);
    switch ((dp_coll_kind)it->kind) {
    case DP_COLL_REDUCE:
        if (c->rank == it->root) ref_dp_reduce_into(g, it, recv);
        break;
    case DP_COLL_BROADCAST:  // the root's recv too, as NCCL's (memmove: its send may be it)
        memmove(recv, REF_PTR(const void, g->posted[it->root]->send), bytes);
        break;
    case DP_COLL_ALL_GATHER:
        for (uint32_t r = 0; r < g->world; r++) {
            uint8_t *slot = (uint8_t *)recv + r * bytes;
            const void *src = REF_PTR(const void, g->posted[r]->send);
            if (slot != src) memmove(slot, src, bytes);
        }
        break;
    case DP_COLL_ALL_REDUCE:
        if (c->rank == 0) ref_dp_reduce_into(g, it, recv);
        pthread_barrier_wait(&g->barrier);
        if (c->rank != 0) memcpy(recv, REF_PTR(const void, g->posted[0]->recv), bytes);
        break;
    }
    pthread_barrier_wait(&g->barrier);
}

// One rank: every collective is a copy of send into recv (a reduce of one value, a broadcast
// from itself, a gather of one share).
static void ref_dp_item_single(const dp_item *it) {
    uint64_t bytes = it->count * ref_dp_elem_bytes(it->dtype);
    if (it->recv != it->send) {
        memmove(REF_PTR(void, it->recv), REF_PTR(const void, it->send), bytes);
    }
}

void ref_qt_dp_collective(const dp_collective_args *a, const launch_shape *shape) {
    (void)shape;
    const dp_comm *c = REF_PTR(const dp_comm, a->comm);
    QT_ASSERT(!c->gpu && a->items >= 1 && a->items <= DP_ITEMS_MAX);
    for (uint32_t i = 0; i < a->items; i++) {
        if (c->world == 1) {
            ref_dp_item_single(&a->item[i]);
        } else {
            dp_ref_item(c, &a->item[i]);
        }
    }
}

void ref_qt_dp_loss_share(const dp_loss_share_args *a, const launch_shape *shape) {
    (void)shape;
    const uint32_t *header = REF_PTR(const uint32_t, a->header);
    float share = qt_dp_share(header[0], header[QT_DP_ROWS_GLOBAL_OFFSET / 4]);
    for (uint64_t i = 0; i < a->count; i++) {
        qt_act_store(a->grad, i, a->grad_dtype, qt_act_load(a->grad, i, a->grad_dtype) * share);
    }
}

void ref_qt_dp_stats_fold(const dp_stats_fold_args *a, const launch_shape *shape) {
    (void)shape;
    qt_dp_stats_fold(REF_PTR(const qt_loss_stats, a->gathered), a->world, a->cols,
                     REF_PTR(qt_loss_stats, a->out));
}

void ref_qt_dp_gnorm_fold(const dp_gnorm_fold_args *a, const launch_shape *shape) {
    (void)shape;
    qt_dp_gnorm_fold(REF_PTR(const qt_gnorm_result, a->gathered), a->world, a->clip,
                     REF_PTR(qt_gnorm_result, a->out));
}
