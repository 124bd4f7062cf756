// parallel: data parallelism. A run on `world` ranks (one process per GPU, `qtrain run --gpus
// N`; on the reference backend one thread per rank, in tests) trains one model on every rank's
// share of the global batch, ZeRO-1 style: every parameter has one owning rank, which alone
// holds its FP32 master (unless the master is the weight itself: biases, gains) and its Adam
// moments, updates it and requantizes its weight; the weight's copies then travel from the
// owner to every rank in their stored form (FP8 codes and scales, every usage), never as BF16.
//
// Owns the communicator (dp_comm: the rank, the world, the NCCL communicator or the reference
// backend's in-process group) from dp_comm_open_* to dp_comm_close, in the caller's memory (the
// run struct). Collectives are ops of the programs (ptx/dp.h, kernel qt_dp_collective, module
// "host"): op_dp_collective appends one NCCL group of up to DP_ITEMS_MAX items; the GPU backend
// enqueues it on the op's stream through dp_launch, so a step's graph captures it like any
// other op; the reference backend runs its twin, which exchanges through the group's slots
// between barriers and reduces in rank order. Every collective op of a program also declares
// the program's `order` region as written, so the collectives of a captured graph stay in
// program order on every rank (NCCL needs the same order of collectives on every rank).
//
// One step of the train program on `world` > 1 ranks (runtime/model/model_build.c):
//
//   forward, loss (this rank's share)   -> loss statistics all-gathered, folded in rank order
//   qt_dp_loss_share                     the loss gradient scaled by valid_rank / valid_global
//   backward                            -> every parameter's gradient reduced (sum) to its owner
//   gradient norm over owned parameters -> all-gathered, folded in rank order (FP64), the same
//                                          norm, clip factor and skip decision on every rank
//   AdamW + requantization, owned only  -> each owner broadcasts its parameter's weight copies
//   delayed-scaling amaxes              -> all-reduced (max) before the states roll
//
// An eval step gathers and folds its loss statistics as a train step does; an infer step gathers
// every rank's outputs in rank order (the shares are contiguous: the whole batch in sample
// order), which rank 0 writes. The init program, after the owners' casts, all-reduces (max) the
// delayed-scaling amaxes and broadcasts the weights.
//
// With world 1 no program has a collective op: the programs, their bits and the checkpoints of
// a run on one GPU are those of a run without data parallelism.
#ifndef QT_PARALLEL_H
#define QT_PARALLEL_H

#include <pthread.h>  // pthread_barrier_t

#include "ptx/dp.h"  // ptx/dp.h (runtime/ has no dp.h): dp_item, dp_collective_args
#include "runtime/driver/nccl_lib.h"  // ncclComm_t, ncclUniqueId
#include "runtime/program/program.h"  // program, prog_ref

#define DP_RANKS_MAX 16

// N ranks as N threads of one process, on the reference backend: each collective item is met at
// a barrier with every rank's item posted in `posted`, computed in rank order, and left at a
// second barrier, so no rank changes a buffer another still reads. The caller's memory, shared
// by the ranks' runs; dp_ref_group_init before the threads start.
typedef struct dp_ref_group {
    pthread_barrier_t barrier;
    uint32_t world;
    const dp_item *posted[DP_RANKS_MAX];
} dp_ref_group;

qt_status dp_ref_group_init(dp_ref_group *g, uint32_t world);
void dp_ref_group_destroy(dp_ref_group *g);

typedef struct dp_comm {
    uint32_t rank, world;  // world 1: no collectives
    bool gpu;
    ncclComm_t nccl;       // GPU
    // GPU, when opened wide: the same ranks without the CTA cap, for the collectives that no
    // GEMM runs beside (dp_launch's `alone`); NULL otherwise.
    ncclComm_t nccl_wide;
    dp_ref_group *group;   // reference backend
} dp_comm;

// Rank 0 of 1.
void dp_comm_single(dp_comm *c);
// The NCCL communicator of rank `rank` of `world`, on the calling thread's current context (the
// GPU of ordinal `rank`); every rank must call it with the same id (ncclGetUniqueId of one of
// them), and it returns when all have. Loads NCCL first (nccl_load). max_ctas (0: NCCL's choice)
// caps the CTAs of NCCL's kernels through NCCL_MAX_CTAS (NCCL 2.17 and newer), unless the
// environment sets it (setenv; NCCL reads it at its first communicator). A rank is a process
// (qtrain run --gpus); a program that runs ranks as threads of one process sets NCCL_MAX_CTAS
// itself before it starts them, since setenv beside another thread's getenv is a race.
// wide (DP_WIDE_IF_ABLE, DP_WIDE_REQUIRED): the cap goes into the communicator's configuration
// instead (ncclCommInitRankConfig), and a second communicator of the same ranks without it
// (ncclCommSplit; NCCL 2.18 or newer) takes the collectives that run alone; NCCL_MAX_CTAS, when
// the environment sets it, caps both. A library without those calls: DP_WIDE_IF_ABLE opens one
// communicator as DP_WIDE_OFF does, DP_WIDE_REQUIRED fails naming the version.
typedef enum { DP_WIDE_OFF, DP_WIDE_IF_ABLE, DP_WIDE_REQUIRED } dp_wide;
qt_status dp_comm_open_gpu(dp_comm *c, const ncclUniqueId *id, uint32_t rank, uint32_t world,
                           uint32_t max_ctas, dp_wide wide);
void dp_comm_open_ref(dp_comm *c, dp_ref_group *g, uint32_t rank);
// Destroys the NCCL communicator (abort: without waiting for the other ranks, after a failure).
void dp_comm_close(dp_comm *c, bool abort);

// The GPU backend's launch of a collective op: its items in one NCCL group on `stream`, through
// the wide communicator when `alone` (no GEMM runs beside the op) and the rank has one. Every
// rank must give the same `alone` for the same op.
qt_status dp_launch(const dp_collective_args *a, CUstream stream, bool alone);
// The reference backend's twin of one item (runtime/ref/ref_dp.c): every rank's thread calls it
// with its own item at the same point.
void dp_ref_item(const dp_comm *c, const dp_item *it);

// The owner of each of `count` parameters of `elems[i]` elements each: the largest first
// (ties: the lower index), each to the rank that holds the fewest elements so far (ties: the
// lower rank), which balances masters and moments by bytes. Whole tensors: a shard inside a
// tensor would cut the block formats' 32-, 128- and 16x16-element blocks and the columnwise
// copies made from the master. count >= world, so every rank owns at least one.
void dp_partition(const uint64_t *elems, uint32_t count, uint32_t world, uint32_t *owner);

// One item of a collective op (ptx/dp.h's dp_item with regions instead of addresses).
typedef struct op_dp_item {
    dp_coll_kind kind;
    dp_coll_dtype dtype;
    dp_coll_op op;     // REDUCE, ALL_REDUCE: SUM or MAX
    uint32_t root;     // REDUCE, BROADCAST
    prog_ref send, recv;
    uint64_t count;    // elements of send (ALL_GATHER: recv holds world * count)
} op_dp_item;

// Appends one collective op of `count` items (1 .. DP_ITEMS_MAX). comm: the run's communicator
// (its address goes into the args; it must outlive the program); order: a region every
// collective op of the program declares as written.
qt_status op_dp_collective(program *p, const char *name, const dp_comm *comm, prog_ref order,
                           const op_dp_item *items, uint32_t count);
// qt_dp_loss_share over `count` elements of grad (grad_dtype) with the device batch's header.
qt_status op_dp_loss_share(program *p, const char *name, prog_ref grad, uint32_t grad_dtype,
                           uint64_t count, prog_ref header);
qt_status op_dp_stats_fold(program *p, const char *name, prog_ref gathered, uint32_t world,
                           uint32_t cols, prog_ref out);
qt_status op_dp_gnorm_fold(program *p, const char *name, prog_ref gathered, uint32_t world,
                           float clip, prog_ref out);

#endif  // QT_PARALLEL_H
