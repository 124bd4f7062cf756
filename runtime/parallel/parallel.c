#include "runtime/parallel/parallel.h"

#include <stdio.h>   // snprintf
#include <stdlib.h>  // setenv
#include <string.h>

#include "ptx/kernels.h"  // KERNEL_DP_*

// ---------------------------------------------------------------------------------------------
// Communicators.

qt_status dp_ref_group_init(dp_ref_group *g, uint32_t world) {
    QT_ASSERT(world >= 1 && world <= DP_RANKS_MAX);
    memset(g, 0, sizeof *g);
    g->world = world;
    if (pthread_barrier_init(&g->barrier, NULL, world) != 0) {
        return qt_fail(QT_ERR_MEMORY, "cannot make a barrier for %u ranks", world);
    }
    return QT_OK;
}

void dp_ref_group_destroy(dp_ref_group *g) { pthread_barrier_destroy(&g->barrier); }

void dp_comm_single(dp_comm *c) {
    memset(c, 0, sizeof *c);
    c->world = 1;
}

static nccl_config dp_nccl_config(uint32_t max_ctas) {
    return (nccl_config){sizeof(nccl_config), QT_NCCL_CONFIG_MAGIC, QT_NCCL_CONFIG_VERSION,
                         QT_NCCL_CONFIG_UNSET, QT_NCCL_CONFIG_UNSET, QT_NCCL_CONFIG_UNSET,
                         max_ctas > 0 ? (int)max_ctas : QT_NCCL_CONFIG_UNSET, NULL};
}

qt_status dp_comm_open_gpu(dp_comm *c, const ncclUniqueId *id, uint32_t rank, uint32_t world,
                           uint32_t max_ctas, dp_wide wide_setting) {
    QT_ASSERT(world >= 1 && world <= DP_RANKS_MAX && rank < world);
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->world = world;
    c->gpu = true;
    // Loading reads no NCCL setting: NCCL_MAX_CTAS below still comes before the first
    // communicator, which is where NCCL reads it.
    QT_TRY(nccl_load());
    bool able = nccl.ncclCommInitRankConfig && nccl.ncclCommSplit;
    if (wide_setting == DP_WIDE_REQUIRED && !able) {
        return qt_fail(QT_ERR_NO_DRIVER, "QTRAIN_COMM_WIDE=1 needs NCCL 2.18 or newer "
                       "(ncclCommInitRankConfig, ncclCommSplit), and %s lacks them: install a "
                       "newer NCCL or unset QTRAIN_COMM_WIDE", nccl_loaded_path());
    }
    bool wide = wide_setting != DP_WIDE_OFF && able;
    if (max_ctas > 0 && !wide) {
        char value[16];
        snprintf(value, sizeof value, "%u", max_ctas);
        setenv("NCCL_MAX_CTAS", value, 0);
    }
    ncclComm_t comm = NULL;
    nccl_config capped = dp_nccl_config(max_ctas);
    ncclResult_t result = wide ? nccl.ncclCommInitRankConfig(&comm, (int)world, *id, (int)rank,
                                                             &capped)
                               : nccl.ncclCommInitRank(&comm, (int)world, *id, (int)rank);
    if (result != ncclSuccess) {
        nccl_fail(result, wide ? "ncclCommInitRankConfig" : "ncclCommInitRank", __FILE__,
                  __LINE__);
        return qt_fail(QT_ERR_DRIVER, "rank %u of %u could not join the NCCL communicator "
                       "(every rank must start with the same id, each on its own GPU): %s",
                       rank, world, qt_error_message());
    }
    c->nccl = comm;
    if (!wide) return QT_OK;
    // Every rank in one group (color 0), in its own order (key: the rank).
    nccl_config uncapped = dp_nccl_config(0);
    result = nccl.ncclCommSplit(comm, 0, (int)rank, &c->nccl_wide, &uncapped);
    if (result != ncclSuccess) {
        c->nccl_wide = NULL;
        nccl_fail(result, "ncclCommSplit", __FILE__, __LINE__);
        dp_comm_close(c, true);  // the caller closes only what opened
        return QT_ERR_DRIVER;
    }
    return QT_OK;
}

void dp_comm_open_ref(dp_comm *c, dp_ref_group *g, uint32_t rank) {
    QT_ASSERT(rank < g->world);
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->world = g->world;
    c->group = g;
}

void dp_comm_close(dp_comm *c, bool abort) {
    ncclComm_t *comms[] = {&c->nccl_wide, &c->nccl};  // the split one first
    for (int k = 0; k < 2; k++) {
        if (c->gpu && *comms[k]) {
            if (abort) {
                nccl.ncclCommAbort(*comms[k]);
            } else {
                nccl.ncclCommDestroy(*comms[k]);
            }
        }
        *comms[k] = NULL;
    }
}

// ---------------------------------------------------------------------------------------------
// The GPU launch.

static ncclDataType_t dp_nccl_type(uint32_t dtype) {
    return dtype == DP_DTYPE_F32 ? ncclFloat32 : ncclUint8;
}

static ncclRedOp_t dp_nccl_op(uint32_t op) { return op == DP_OP_MAX ? ncclMax : ncclSum; }

static qt_status dp_launch_item(ncclComm_t comm, const dp_item *it, CUstream stream) {
    const void *send = (const void *)(uintptr_t)it->send;
    void *recv = (void *)(uintptr_t)it->recv;
    ncclDataType_t type = dp_nccl_type(it->dtype);
    switch ((dp_coll_kind)it->kind) {
    case DP_COLL_REDUCE:
        QT_NCCL(ncclReduce(send, recv, it->count, type, dp_nccl_op(it->op), (int)it->root,
                           comm, stream));
        return QT_OK;
    case DP_COLL_BROADCAST:
        QT_NCCL(ncclBroadcast(send, recv, it->count, type, (int)it->root, comm, stream));
        return QT_OK;
    case DP_COLL_ALL_GATHER:
        QT_NCCL(ncclAllGather(send, recv, it->count, type, comm, stream));
        return QT_OK;
    case DP_COLL_ALL_REDUCE:
        QT_NCCL(ncclAllReduce(send, recv, it->count, type, dp_nccl_op(it->op), comm,
                              stream));
        return QT_OK;
    }
    QT_ASSERT(false);
    return QT_ERR_INPUT;
}

qt_status dp_launch(const dp_collective_args *a, CUstream stream, bool alone) {
    const dp_comm *c = (const dp_comm *)(uintptr_t)a->comm;
    QT_ASSERT(c->gpu && c->nccl && a->items >= 1 && a->items <= DP_ITEMS_MAX);
    ncclComm_t comm = alone && c->nccl_wide ? c->nccl_wide : c->nccl;
    QT_NCCL(ncclGroupStart());
    qt_status status = QT_OK;
    for (uint32_t i = 0; i < a->items && status == QT_OK; i++) {
        status = dp_launch_item(comm, &a->item[i], stream);
    }
    // The group is closed whatever happened, so NCCL is left in no open group.
    ncclResult_t end = nccl.ncclGroupEnd();
    if (status != QT_OK) return status;
    if (end != ncclSuccess) return nccl_fail(end, "ncclGroupEnd", __FILE__, __LINE__);
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Partition.

void dp_partition(const uint64_t *elems, uint32_t count, uint32_t world, uint32_t *owner) {
    QT_ASSERT(world >= 1 && world <= DP_RANKS_MAX && count >= world);
    uint64_t load[DP_RANKS_MAX] = {0};
    // Largest first, ties by index: a selection over the parameters not yet placed (a model has
    // at most a few hundred, and no sort may allocate).
    for (uint32_t i = 0; i < count; i++) owner[i] = UINT32_MAX;
    for (uint32_t placed = 0; placed < count; placed++) {
        uint32_t pick = UINT32_MAX;
        for (uint32_t i = 0; i < count; i++) {
            if (owner[i] != UINT32_MAX) continue;
            if (pick == UINT32_MAX || elems[i] > elems[pick]) pick = i;
        }
        uint32_t rank = 0;
        for (uint32_t r = 1; r < world; r++) {
            if (load[r] < load[rank]) rank = r;
        }
        owner[pick] = rank;
        load[rank] += elems[pick];
    }
}

// ---------------------------------------------------------------------------------------------
// Builders.

static uint64_t dp_elem_bytes(dp_coll_dtype dtype) { return dtype == DP_DTYPE_F32 ? 4 : 1; }

qt_status op_dp_collective(program *p, const char *name, const dp_comm *comm, prog_ref order,
                           const op_dp_item *items, uint32_t count) {
    QT_ASSERT(count >= 1 && count <= DP_ITEMS_MAX && comm->world > 1);
    dp_collective_args args;
    memset(&args, 0, sizeof args);
    args.comm = (uint64_t)(uintptr_t)comm;
    args.items = count;
    for (uint32_t i = 0; i < count; i++) {
        const op_dp_item *it = &items[i];
        QT_ASSERT(it->root < comm->world && it->count > 0);
        QT_ASSERT((it->kind == DP_COLL_REDUCE || it->kind == DP_COLL_ALL_REDUCE) ==
                  (it->op != DP_OP_NONE));
        args.item[i] = (dp_item){0, 0, it->count, (uint8_t)it->kind, (uint8_t)it->dtype,
                                 (uint8_t)it->op, 0, it->root};
    }
    // No launch shape: NCCL picks its own.
    launch_shape shape = {{1, 1, 1}, {1, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_DP_COLLECTIVE, name, &shape, &args, sizeof args, &op));
    for (uint32_t i = 0; i < count; i++) {
        const op_dp_item *it = &items[i];
        uint64_t bytes = it->count * dp_elem_bytes(it->dtype);
        uint64_t recv_bytes = it->kind == DP_COLL_ALL_GATHER ? bytes * comm->world : bytes;
        uint32_t at = (uint32_t)(offsetof(dp_collective_args, item) + i * sizeof(dp_item));
        // An in-place item declares its region twice (one field each); both get its address.
        QT_TRY(prog_use_span(p, op, at + (uint32_t)offsetof(dp_item, send), it->send, bytes,
                             PROG_READ));
        QT_TRY(prog_use_span(p, op, at + (uint32_t)offsetof(dp_item, recv), it->recv,
                             recv_bytes, PROG_READ_WRITE));
    }
    return prog_use(p, op, PROG_ARGS_FIELD_NONE, order, PROG_READ_WRITE);
}

qt_status op_dp_loss_share(program *p, const char *name, prog_ref grad, uint32_t grad_dtype,
                           uint64_t count, prog_ref header) {
    dp_loss_share_args args = {0, 0, count, grad_dtype, 0};
    uint64_t blocks = (count + QT_DP_THREADS - 1) / QT_DP_THREADS;
    if (blocks > 1024) blocks = 1024;
    if (blocks == 0) blocks = 1;
    launch_shape shape = {{(uint32_t)blocks, 1, 1}, {QT_DP_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_DP_LOSS_SHARE, name, &shape, &args, sizeof args, &op));
    uint64_t elem = grad_dtype == QT_DTYPE_BF16 ? 2 : 4;
    QT_TRY(prog_use_span(p, op, offsetof(dp_loss_share_args, grad), grad, count * elem,
                         PROG_READ_WRITE));
    return prog_use_span(p, op, offsetof(dp_loss_share_args, header), header,
                         QT_DP_ROWS_GLOBAL_OFFSET + 4, PROG_READ);
}

static qt_status dp_fold(program *p, kernel_id kernel, const char *name, const void *args,
                         size_t args_bytes, prog_ref gathered, uint64_t gathered_bytes,
                         prog_ref out, uint64_t out_bytes) {
    launch_shape shape = {{1, 1, 1}, {1, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, kernel, name, &shape, args, args_bytes, &op));
    // Both folds' args start with gathered, then out.
    QT_TRY(prog_use_span(p, op, 0, gathered, gathered_bytes, PROG_READ));
    return prog_use_span(p, op, 8, out, out_bytes, PROG_WRITE);
}

qt_status op_dp_stats_fold(program *p, const char *name, prog_ref gathered, uint32_t world,
                           uint32_t cols, prog_ref out) {
    dp_stats_fold_args args = {0, 0, world, cols};
    return dp_fold(p, KERNEL_DP_STATS_FOLD, name, &args, sizeof args, gathered,
                   (uint64_t)world * sizeof(qt_loss_stats), out, sizeof(qt_loss_stats));
}

qt_status op_dp_gnorm_fold(program *p, const char *name, prog_ref gathered, uint32_t world,
                           float clip, prog_ref out) {
    dp_gnorm_fold_args args = {0, 0, world, clip};
    return dp_fold(p, KERNEL_DP_GNORM_FOLD, name, &args, sizeof args, gathered,
                   (uint64_t)world * sizeof(qt_gnorm_result), out, sizeof(qt_gnorm_result));
}
