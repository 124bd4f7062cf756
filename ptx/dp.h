// dp: the ops of data parallelism (runtime/parallel/parallel.h): the collective op, which no kernel
// runs (the GPU backend hands it to NCCL on the op's stream, the reference backend to its twin over
// the ranks' threads), and the three small kernels that turn per-rank results into the global
// ones.
//
//   kernel               what                                                launch
//   qt_dp_collective     (host) one NCCL group of up to DP_ITEMS_MAX reduces,  none: NCCL's
//                        broadcasts, all-gathers or all-reduces
//   qt_dp_loss_share     scales this rank's loss gradient by its share of the  grid-stride
//                        global batch's real rows (valid_rank / valid_global),
//                        so that the sum over ranks is the global-batch mean's
//                        gradient
//   qt_dp_stats_fold     the loss statistics of every rank (all-gathered,      1 thread
//                        qt_loss_stats [world]) summed in rank order into the
//                        global batch's
//   qt_dp_gnorm_fold     every rank's partial gradient norm (all-gathered,     1 thread
//                        qt_gnorm_result [world]) into the global norm, its
//                        clip factor and the non-finite flag: sum of squares
//                        in rank order in FP64, so every rank takes the same
//                        decision and one rank gives the plain norm's bits
#ifndef QT_DP_H
#define QT_DP_H

#include "ptx/act.h"    // qt_loss_stats, qt_gnorm_result, qt_loss_mean, qt_gnorm_clip_factor
#include "ptx/qt_hd.h"

#define QT_DP_THREADS 256u

// What one item of a collective does (NCCL's collectives; rank order in the twin).
typedef enum dp_coll_kind {
    DP_COLL_REDUCE = 1,      // recv (on root) = sum or max over ranks of send
    DP_COLL_BROADCAST = 2,   // recv (every rank) = root's send
    DP_COLL_ALL_GATHER = 3,  // recv[rank * count ..] = send of rank (recv holds world * count)
    DP_COLL_ALL_REDUCE = 4   // recv (every rank) = sum or max over ranks of send
} dp_coll_kind;
typedef enum dp_coll_dtype { DP_DTYPE_U8 = 1, DP_DTYPE_F32 = 2 } dp_coll_dtype;
typedef enum dp_coll_op { DP_OP_NONE = 0, DP_OP_SUM = 1, DP_OP_MAX = 2 } dp_coll_op;

typedef struct dp_item {
    uint64_t send, recv;  // device addresses (equal: in place)
    uint64_t count;       // elements of send
    uint8_t kind, dtype, op, reserved;
    uint32_t root;
} dp_item;
QT_STATIC_ASSERT(sizeof(dp_item) == 32, "dp_item layout");

// Items of one collective op: one NCCL group (ncclGroupStart ... ncclGroupEnd).
#define DP_ITEMS_MAX 7

typedef struct dp_collective_args {
    uint64_t comm;    // host address of the run's dp_comm (runtime/parallel/parallel.h)
    uint32_t items;   // 1 .. DP_ITEMS_MAX
    uint32_t reserved;
    dp_item item[DP_ITEMS_MAX];
} dp_collective_args;
QT_STATIC_ASSERT(sizeof(dp_collective_args) == 240, "dp_collective_args layout");

typedef struct dp_loss_share_args {
    uint64_t grad;        // (count) grad_dtype, scaled in place
    uint64_t header;      // the device batch's data_slot_header: rows_valid at 0,
                          // rows_global at QT_DP_ROWS_GLOBAL_OFFSET
    uint64_t count;
    uint32_t grad_dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t reserved;
} dp_loss_share_args;
QT_STATIC_ASSERT(sizeof(dp_loss_share_args) == 32, "dp_loss_share_args layout");

// runtime/io/data.h's data_slot_header.rows_global (asserted there).
#define QT_DP_ROWS_GLOBAL_OFFSET 40u

typedef struct dp_stats_fold_args {
    uint64_t gathered;  // qt_loss_stats [world], rank order
    uint64_t out;       // qt_loss_stats
    uint32_t world;
    uint32_t cols;      // the mean's count per valid row: 1 (xent) or the outputs (mse)
} dp_stats_fold_args;
QT_STATIC_ASSERT(sizeof(dp_stats_fold_args) == 24, "dp_stats_fold_args layout");

typedef struct dp_gnorm_fold_args {
    uint64_t gathered;  // qt_gnorm_result [world], rank order: each rank's norm over its share
    uint64_t out;       // qt_gnorm_result of the whole model
    uint32_t world;
    float clip;         // as gnorm_args.clip
} dp_gnorm_fold_args;
QT_STATIC_ASSERT(sizeof(dp_gnorm_fold_args) == 24, "dp_gnorm_fold_args layout");

#define QT_KERNELS_DP(X)                                                      \
    X(KERNEL_DP_COLLECTIVE, host, qt_dp_collective, dp_collective_args)       \
    X(KERNEL_DP_LOSS_SHARE, dp, qt_dp_loss_share, dp_loss_share_args)         \
    X(KERNEL_DP_STATS_FOLD, dp, qt_dp_stats_fold, dp_stats_fold_args)         \
    X(KERNEL_DP_GNORM_FOLD, dp, qt_dp_gnorm_fold, dp_gnorm_fold_args)

// The factor of a rank's loss gradient: its real rows over the global batch's (0 when the global
// batch has none). With equal shares of a power-of-two world it is exactly 1 / world.
QT_HD float qt_dp_share(uint32_t rows_valid, uint32_t rows_global) {
    return rows_global > 0 ? (float)rows_valid / (float)rows_global : 0.0f;
}

QT_HD void qt_dp_stats_fold(const qt_loss_stats *gathered, uint32_t world, uint32_t cols,
                            qt_loss_stats *out) {
    float sum = 0.0f;
    uint32_t valid = 0, correct = 0;
    for (uint32_t r = 0; r < world; r++) {
        sum += gathered[r].loss_sum;
        valid += gathered[r].valid;
        correct += gathered[r].correct;
    }
    out->loss_mean = qt_act_canonical(qt_loss_mean(sum, (float)((uint64_t)valid * cols)));
    out->loss_sum = qt_act_canonical(sum);
    out->valid = valid;
    out->correct = correct;
}

// FP64 keeps each partial's square exact, so one rank gives back its norm's bits.
QT_HD void qt_dp_gnorm_fold(const qt_gnorm_result *gathered, uint32_t world, float clip,
                            qt_gnorm_result *out) {
    double sum = 0.0;
    uint32_t nonfinite = 0;
    for (uint32_t r = 0; r < world; r++) {
        double n = (double)gathered[r].norm;
        sum += n * n;
        nonfinite |= gathered[r].nonfinite;
    }
    float norm = (float)qt_sqrt(sum);
    out->norm = qt_act_canonical(norm);
    out->clip_factor = qt_act_canonical(qt_gnorm_clip_factor(norm, clip));
    out->nonfinite = nonfinite ? 1u : 0u;
    out->reserved = 0;
}

#endif  // QT_DP_H
