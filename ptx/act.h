// act: the elementwise, normalization and loss ops of a training step (activations, RMSNorm,
// residual add, softmax cross-entropy, MSE, global gradient norm): the kernels' ABI (ptx/act.cu)
// and the per-element arithmetic they share with their C twins (runtime/ref/ref_act.c).
//
// Owns nothing. Tensors are row-major [rows][cols] of BF16 or FP32 (each tensor has its own
// dtype field); everything accumulated (inverse RMS, losses, norms, gradients of parameters) is
// FP32. Every FP32 result is computed in FP32 with the transcendentals of qt_math.h and explicit
// qt_fmaf, and every stored NaN is the canonical 0x7FFFFFFF (BF16: 0x7FFF), so the reference
// backend reproduces the GPU bit for bit for any input (x86 would otherwise keep NaN payloads).
//
//   kernel                    what                                          launch
//   qt_act_fwd / qt_act_bwd   y = act(x + bias[c]) / dx = dy * act'(x + b)  1-D grid-stride,
//   qt_swiglu_fwd / _bwd      x [rows][2H] -> y = silu(a) * b [rows][H]     8 elements a thread
//   qt_*_grouped              the four above over a grouped tensor (act_args.group): the active
//                             rows alone, the amax per member (dynamic shared memory)
//   qt_gemm_split_reduce_act_fwd / _bwd                                     1-D grid-stride,
//                             a split-K GEMM's reduction (gemm.h) and the   one element a
//                             dense qt_act_fwd / _bwd that reads its D, in  thread
//                             one launch (gemm_act_args below)
//   qt_rmsnorm_fwd            y = x * inv_rms * gamma, inv_rms [rows]       one warp per row,
//   qt_rmsnorm_fwd_regs       y, the row held in registers (whole chunks,   8 rows per block
//                             BF16 x of at most 4096 columns, FP32 x of     (every RMSNorm
//                             at most 2048)                                 row kernel)
//   qt_rmsnorm_bwd_dx         dx (+ skip: the residual add after it)
//   qt_rmsnorm_bwd_dx_regs    dx (+ skip), the row held in registers (BF16
//                             x and dy, whole chunks, at most 4096 columns)
//   qt_rmsnorm_dgamma_partial partials[p][c] = sum over rows of part p      256 columns x part
//   qt_rmsnorm_dgamma_final   dgamma[c] (+)= sum over p in order            256 columns a block
//   qt_residual_add           y = a + b (b absent: y = a)                   1-D grid-stride
//   qt_xent_count             stats.valid = rows whose label is a class     one block
//   qt_xent_rows              loss[r], dlogits, per-block partials          one warp per row
//   qt_xent_final             stats.loss_sum, loss_mean, correct            one block
//   qt_mse_rows / qt_mse_final  the same for mean squared error
//   qt_xent_small             count, rows and final of xent in one launch   one block, one
//   qt_mse_small              rows and final of mse in one launch           thread per row
//                             (op_xent, op_mse: shapes that pass
//                             qt_loss_one_block)
//   qt_gnorm                  partial sums of squares + non-finite flags,  one block per 8192
//                             then (last block) norm, clip factor, flag    elements, regions
//                                                                          batched per launch
//
// Reductions have one fixed order, which the twins perform operation for operation:
//
//   row (warp per row): the row is cut into chunks of 8 elements; lane j (0..31) owns chunks
//     j, j + 32, j + 64, ... and folds their elements in index order into its accumulator
//     (starting from +0, or from the identity of the reduction); then a tree over the lanes:
//     for m = 16, 8, 4, 2, 1: lane i < m takes op(own, lane i + m) (QT_ACT_TREE32 below);
//     lane 0's value is broadcast to the warp.
//   block of 8 row results (xent, mse): acc = r[0]; acc = acc + r[w] for w = 1..7.
//   block of 256 thread values (final passes, gnorm partials): a lane tree in each warp as
//     above, then acc = warp[0]; acc = acc + warp[w] for w = 1..7.
//   final pass over P partials: thread t folds p[t], p[t + 256], ... starting from +0, then the
//     block reduction above.
//   column partials (dgamma): part p sums rows [p R, (p + 1) R) in row order from +0; the final
//     pass folds parts 0..P-1 in order starting from part 0 (accumulate: old dgamma + that).
//   one-block losses: one thread walks a whole row and keeps what each lane of the row order
//     would hold in registers; rows of at most QT_LOSS_SMALL_COLS_MAX elements are at most 8
//     chunks, so lane l owns chunk l alone and lanes 8..31 hold the identity; then the same
//     lane tree. The 8-row block partials and the final pass run on the per-row values in
//     shared memory in the orders above, so both paths give the same bits.
// R is an args field chosen from rows alone (op_rmsnorm_rows_per_part); no result depends on a
// grid, a block count or the path (vector or element, split or one-block) a kernel takes.
// Integer reductions (counts) are exact, so their order does not matter.
//
// Amaxes of stored outputs: the activations (act_args.amax, the split-reduce pair's too),
// qt_rmsnorm_fwd (rmsnorm_args.amax), qt_residual_add (residual_args.amax) and the loss
// gradients of qt_xent_rows / qt_xent_small and qt_mse_rows / qt_mse_small merge max |out| over
// the values they store (rounded to the stored dtype, NaN skipped, -0 as +0: what qt_fp8_amax
// would read back) into an optional f32 slot that the caller zeroes first, so that the
// per-tensor cast that reads the tensor next needs no amax pass of its own. A maximum is exact
// and order-free: the slot gets the separate pass's bits whatever the grid.
#ifndef QT_ACT_H
#define QT_ACT_H

#include "ptx/act_math.h"  // the activation functions and their tables, QT_ACT_*
#include "ptx/core.h"      // QT_DTYPE_BF16, QT_DTYPE_F32
#include "ptx/gemm.h"      // gemm_args, qt_gemm_split_element, qt_gemm_stored_value
#include "ptx/optim.h"     // qt_optim_begin_apply: the norm's last block may begin the update
#include "ptx/qt_codec.h"  // qt_f32_to_bf16, qt_bf16_to_f32, qt_f32_is_nan
#include "ptx/qt_hd.h"
#include "ptx/qt_math.h"   // qt_expf, qt_logf, qt_math_exp_core
#include "ptx/quant.h"     // qt_group_desc

// Launch constants shared by the kernels, the op builders and the twins.
#define QT_ACT_THREADS 256         // every kernel's block size
#define QT_ACT_WARPS 8             // QT_ACT_THREADS / 32
#define QT_ACT_ROWS_PER_BLOCK 8    // row kernels: one warp per row
#define QT_ACT_CHUNK 8             // elements per chunk (one 16-byte BF16 vector)
#define QT_ACT_LANES 32
#define QT_GNORM_BLOCK_ELEMS 8192  // elements of one gnorm partial: 8 float4 per thread
#define QT_RMSNORM_PART_ROWS_MIN 64
// qt_rmsnorm_fwd_regs, qt_rmsnorm_bwd_dx_regs: chunks of x (and dy) a lane holds, so rows of at
// most 32 x 16 x 8 columns.
#define QT_RMSNORM_REGS_CHUNKS 16u
#define QT_RMSNORM_REGS_COLS_MAX (QT_ACT_LANES * QT_RMSNORM_REGS_CHUNKS * QT_ACT_CHUNK)
// qt_rmsnorm_fwd_regs holds FP32 x too, two 16-byte words a chunk: half the columns.
#define QT_RMSNORM_REGS_COLS_MAX_F32 (QT_RMSNORM_REGS_COLS_MAX / 2)
#define QT_RMSNORM_PARTS_MAX 256

// One-block losses (qt_xent_small, qt_mse_small) replace two or three launches whose fixed cost
// (3.5 to 4.5 us each on an H100) dwarfs the work of a small loss. One SM then does all of it,
// a row per thread, at about 1.8 + 0.66 us per element a thread (xent with dlogits, H100:
// 256 x 10 took 8.4 us, 256 x 64 and 1024 x 16 38 to 44 us, against 15 us for the three split
// kernels, 11 us of them on the step's critical path). They pay off up to about 15 elements a
// thread: op_xent and op_mse take them up to QT_LOSS_SMALL_THREAD_ELEMS_MAX (rows per thread
// x cols); the kernels themselves take any shape within the first two limits.
#define QT_LOSS_SMALL_ROWS_MAX 1024        // per-row values held in shared memory
#define QT_LOSS_SMALL_COLS_MAX 64          // 8 chunks: lane l of the row order owns chunk l
#define QT_LOSS_SMALL_THREAD_ELEMS_MAX 16

QT_STATIC_ASSERT(QT_ACT_THREADS == QT_ACT_WARPS * QT_ACT_LANES, "one warp per row");
QT_STATIC_ASSERT(QT_GNORM_BLOCK_ELEMS % (QT_ACT_THREADS * 4) == 0, "whole float4 rounds");

// Activations, forward and backward. Backward reads the saved forward input x (and the same
// bias), not the output, so that every activation has the same backward inputs.
typedef struct act_args {
    uint64_t x;     // (rows, cols) x_dtype; swiglu: cols = 2H, a = x[:, :H], b = x[:, H:]
    uint64_t bias;  // [cols] bias_dtype, 0 = none: the activation sees RN(x + bias[col])
    uint64_t dy;    // backward: (rows, out_cols) dy_dtype; forward: 0
    uint64_t out;   // forward: y (rows, out_cols); backward: dx (rows, cols); out_dtype
                    // ReLU, GELU, SiLU backward: out may be dy itself, of the same dtype (dx
                    // written in place): each thread reads an element's dy before it writes
                    // that element, with plain loads (act_ld16)
    uint32_t rows, cols;  // of x; out_cols = cols, or cols / 2 for swiglu
    uint32_t act;         // QT_ACT_RELU | GELU | SILU (qt_act_*); QT_ACT_SWIGLU (qt_swiglu_*)
    uint32_t x_dtype, bias_dtype, dy_dtype, out_dtype;
    uint32_t reserved;
    // f32 [max(group.count, 1)], 0 = none: max |out| over the stored values is merged in
    // (an unsigned maximum of the bit patterns, NaN skipped), so that a per-tensor FP8 cast of
    // out needs no amax pass of its own. The caller zeroes it first.
    uint64_t amax;
    // count 0: a dense tensor. Otherwise x, dy and out are grouped tensors of rows = the
    // capacity (an moe layer's permuted rows, ptx/quant_group.h): rows from the active end on are
    // neither read nor written, and amax[i] gets the maximum over member i's valid rows alone
    // (the launch's dynamic shared memory: 4 x count bytes, the per-member table below).
    qt_group_desc group;
} act_args;
QT_STATIC_ASSERT(sizeof(act_args) == 96, "act_args layout");

// A split-K GEMM's reduction fused with the activation that consumes its D, one launch in place
// of qt_gemm_split_reduce and qt_act_fwd (or qt_act_bwd) one after the other, with their bits.
// Element i of D (gemm.h "Split-K": the parts' sum in index order and the epilogue) is stored to
// D in d_dtype as the reduction stores it, and the activation then takes that stored (rounded)
// value as qt_act_fwd / qt_act_bwd would load it from D:
//   forward (_fwd):   out = act(D + act.bias), D the pre-activation the backward pass reads;
//   backward (_bwd):  D is the gradient at the activation's output (a dgrad), out = dx =
//                     D * act'(act.x + act.bias) from the saved pre-activation act.x; out may
//                     be D itself (a thread stores D's element, then out's over it).
// amax, NaN canonicalization and out's dtype are the activation's (act_args). Only dense GEMMs
// and activations of QT_ACT_RELU, GELU or SILU: gemm.split_parts > 1, gemm.ldd = n (D is the
// activation's [rows][cols] tensor), act.rows = m, act.cols = n, act.group.count = 0. The
// activation's own read of D is the store above, so act.x (forward) and act.dy (backward) are
// not read; their dtype fields equal d_dtype.
typedef struct gemm_act_args {
    gemm_args gemm;  // qt_gemm_split_reduce's args
    act_args act;    // qt_act_fwd's or qt_act_bwd's
} gemm_act_args;
QT_STATIC_ASSERT(sizeof(gemm_act_args) == 352, "gemm_act_args layout");
// Their launch is the reduction's (GEMM_SPLIT_REDUCE_THREADS a block), and the dense amax's
// block flush takes QT_ACT_THREADS.
QT_STATIC_ASSERT(GEMM_SPLIT_REDUCE_THREADS == QT_ACT_THREADS, "one block size");

// RMSNorm. Forward writes y and inv_rms; backward writes dx, the dgamma partials and dgamma.
typedef struct rmsnorm_args {
    uint64_t x;         // (rows, cols) x_dtype
    uint64_t gamma;     // [cols] gamma_dtype
    uint64_t inv_rms;   // f32 [rows]: written by the forward pass, read by the backward pass
    uint64_t dy;        // backward: (rows, cols) dy_dtype
    uint64_t out;       // forward: y; backward (dx kernel): dx; (rows, cols) out_dtype
    uint64_t partials;  // dgamma kernels: f32 [parts][cols] workspace
    uint64_t dgamma;    // dgamma final: f32 [cols]
    uint32_t rows, cols;
    float eps;
    uint32_t rows_per_part;  // dgamma: part p covers rows [p * rows_per_part, ...)
    uint32_t parts;          // ceil(rows / rows_per_part)
    uint32_t accumulate;     // dgamma final: 1 = dgamma += sum, 0 = dgamma = sum
    uint32_t x_dtype, gamma_dtype, dy_dtype, out_dtype;
    // f32 [1], 0 = none: max |out| over the stored values merged in, as act_args.amax (the
    // caller zeroes it first), for the per-tensor cast that follows: forward y, or backward the
    // sum with skip below.
    uint64_t amax;
    // Backward (dx kernels): (rows, cols) skip_dtype, 0 = none. With it out is the residual
    // add that would follow (qt_residual_add with a = skip, b = dx): RN_out(skip + RN_out(dx)),
    // dx rounded as a dx tensor of out_dtype would store it, so the bits are those of the two
    // kernels, without dx's write and second read.
    uint64_t skip;
    uint32_t skip_dtype;
    uint32_t reserved;
} rmsnorm_args;
QT_STATIC_ASSERT(sizeof(rmsnorm_args) == 120, "rmsnorm_args layout");

// y = a + b elementwise; b = 0: y = a (a copy with dtype conversion). y may alias a or b
// (each element is read before it is written, by the same thread).
typedef struct residual_args {
    uint64_t a, b, y;
    uint64_t count;
    uint32_t a_dtype, b_dtype, y_dtype;
    uint32_t reserved;
    uint64_t amax;  // f32 [1], 0 = none: max |y| over the stored values merged in (act_args.amax)
} residual_args;
QT_STATIC_ASSERT(sizeof(residual_args) == 56, "residual_args layout");

// Loss statistics written by the final pass of a loss (device memory, 16 bytes).
typedef struct qt_loss_stats {
    float loss_mean;   // loss_sum / (valid rows, times cols for mse); 0 when nothing is valid
    float loss_sum;    // sum of the per-row losses of valid rows
    uint32_t valid;    // rows counted (xent: label in [0, classes); mse: the valid row count)
    uint32_t correct;  // xent: valid rows whose argmax (ties to the lowest index) is the label
} qt_loss_stats;
QT_STATIC_ASSERT(sizeof(qt_loss_stats) == 16, "qt_loss_stats layout");

// Softmax cross-entropy. Rows whose label is outside [0, classes) (-1 pads a last partial batch)
// are ignored: loss 0, dlogits 0, not counted in the mean.
typedef struct xent_args {
    uint64_t logits;    // (rows, classes) logits_dtype
    uint64_t labels;    // i32 [rows]
    uint64_t loss;      // f32 [rows] per-row loss, 0 = not written
    uint64_t dlogits;   // (rows, classes) dlogits_dtype, 0 = not written (evaluation)
    uint64_t partials;  // f32 [blocks] loss sums, then u32 [blocks] correct counts
    uint64_t stats;     // qt_loss_stats
    uint32_t rows, classes;
    uint32_t blocks;    // ceil(rows / QT_ACT_ROWS_PER_BLOCK), the row pass's grid
    uint32_t logits_dtype, dlogits_dtype;
    uint32_t reserved;
    // f32 [1], 0 = none (needs dlogits): max |dlogits| over the stored values merged in
    // (act_args.amax) by the pass that writes them (qt_xent_rows, qt_xent_small).
    uint64_t dlogits_amax;
} xent_args;
QT_STATIC_ASSERT(sizeof(xent_args) == 80, "xent_args layout");

// Mean squared error over the first `valid` rows (the rest pad a last partial batch).
typedef struct mse_args {
    uint64_t pred, target;  // (rows, cols) pred_dtype, target_dtype
    uint64_t dpred;         // (rows, cols) dpred_dtype, 0 = not written
    uint64_t partials;      // f32 [blocks]
    uint64_t stats;         // qt_loss_stats
    uint64_t valid_rows;    // u32 on the device: valid = min(*valid_rows, rows); 0 = all rows
    uint32_t rows, cols;
    uint32_t blocks;        // ceil(rows / QT_ACT_ROWS_PER_BLOCK)
    uint32_t pred_dtype, target_dtype, dpred_dtype;
    uint64_t dpred_amax;    // f32 [1], 0 = none (needs dpred): as xent_args.dlogits_amax
} mse_args;
QT_STATIC_ASSERT(sizeof(mse_args) == 80, "mse_args layout");

// Result of the global gradient norm (device memory, 16 bytes).
typedef struct qt_gnorm_result {
    float norm;         // sqrt(sum of squares over every region)
    float clip_factor;  // min(1, clip / (norm + 1e-6)); 1 when clip <= 0 or the norm is NaN
    uint32_t nonfinite; // 1 when any gradient element is NaN or +-Inf
    uint32_t reserved;
} qt_gnorm_result;
QT_STATIC_ASSERT(sizeof(qt_gnorm_result) == 16, "qt_gnorm_result layout");

// The global norm in one launch per QT_GNORM_REGIONS regions, or per group of regions read during
// the backward pass (runtime/ops/op_act.h, op_grad_norm_part; one launch for a small model): block
// j of a launch belongs to the last region r with first_block[r] <= j and sums squares of that
// region's elements [b E, (b + 1) E), b = j - first_block[r], E = QT_GNORM_BLOCK_ELEMS; thread t
// folds float4 number k * 256 + t of the block for k = 0..7 (a region of a GEMM's norm units,
// gnorm_args.units: the same walk over its unit sums, added instead of squared). Partial j goes to
// partials[base + j] and its NaN/Inf flag to flags[base + j] (flags = partials + total). In the
// launch that has `out`, every block then takes a ticket (an integer atomic counter, which only
// decides who folds, never what); the block that takes the last one folds partials [0, total)
// in index order exactly like a single final block would (every earlier launch has finished:
// they write the partials it reads, so the program orders them before it, on its stream or
// another), writes out and resets the ticket to 0 for the next step.
#define QT_GNORM_REGIONS 8u

typedef struct gnorm_args {
    uint64_t partials;  // f32 [total], then u32 flags [total]: every region's blocks in order
    uint64_t out;       // qt_gnorm_result; 0 in every launch but the last
    uint64_t ticket;    // u32, 0 between steps (a persistent region); with out only
    uint64_t src[QT_GNORM_REGIONS];          // f32 [count[r]]
    uint64_t count[QT_GNORM_REGIONS];
    uint32_t first_block[QT_GNORM_REGIONS];  // within this launch; first_block[0] = 0
    uint32_t regions;   // 1 ..= QT_GNORM_REGIONS in this launch
    uint32_t base;      // partial index of this launch's block 0
    uint32_t total;     // partials of all launches
    float clip;         // max norm; <= 0 disables clipping (factor 1)
    // With out: after writing it, the folding block runs qt_optim_begin (ptx/optim.h) on it, so
    // that a step on one GPU spends no launch of its own on that one thread's work (0: the
    // program has a qt_optim_begin op, as with several ranks, whose norms are folded first):
    // the state, and the table's amaxes zeroed (qt_optim_zero_amaxes).
    uint64_t begin_steps;    // u64, read and written
    uint64_t begin_state;    // optim_state, written; 0: none
    uint64_t begin_lr_rows;  // optim_lr_row [begin_rows]
    uint64_t begin_zero;     // optim_multi_entry [begin_zero_count], read; 0: none
    uint32_t begin_rows;
    uint32_t begin_zero_count;
    // Bit r: region r is a GEMM's gradient-norm units (ptx/gemm.h), count[r] of them, their
    // sums then their flags; its blocks fold the sums, acc = acc + u, in the elements' order and
    // take the flags. Else src[r] holds the gradient's elements.
    uint32_t units;
    uint32_t reserved;
} gnorm_args;
QT_STATIC_ASSERT(sizeof(gnorm_args) == 248, "gnorm_args layout");

#define QT_KERNELS_ACT(X)                                                                    \
    X(KERNEL_ACT_FWD, act, qt_act_fwd, act_args)                                             \
    X(KERNEL_ACT_BWD, act, qt_act_bwd, act_args)                                             \
    X(KERNEL_ACT_FWD_LUT, act, qt_act_fwd_lut, act_args)                                     \
    X(KERNEL_ACT_BWD_LUT, act, qt_act_bwd_lut, act_args)                                     \
    X(KERNEL_SWIGLU_FWD, act, qt_swiglu_fwd, act_args)                                       \
    X(KERNEL_SWIGLU_BWD, act, qt_swiglu_bwd, act_args)                                       \
    X(KERNEL_ACT_FWD_GROUPED, act, qt_act_fwd_grouped, act_args)                             \
    X(KERNEL_ACT_BWD_GROUPED, act, qt_act_bwd_grouped, act_args)                             \
    X(KERNEL_SWIGLU_FWD_GROUPED, act, qt_swiglu_fwd_grouped, act_args)                       \
    X(KERNEL_SWIGLU_BWD_GROUPED, act, qt_swiglu_bwd_grouped, act_args)                       \
    X(KERNEL_SWIGLU_FWD_LUT, act, qt_swiglu_fwd_lut, act_args)                               \
    X(KERNEL_SWIGLU_BWD_LUT, act, qt_swiglu_bwd_lut, act_args)                               \
    X(KERNEL_SWIGLU_FWD_LUT_GROUPED, act, qt_swiglu_fwd_lut_grouped, act_args)               \
    X(KERNEL_SWIGLU_BWD_LUT_GROUPED, act, qt_swiglu_bwd_lut_grouped, act_args)               \
    X(KERNEL_RMSNORM_FWD, act, qt_rmsnorm_fwd, rmsnorm_args)                                 \
    X(KERNEL_RMSNORM_FWD_REGS, act, qt_rmsnorm_fwd_regs, rmsnorm_args)                       \
    X(KERNEL_RMSNORM_BWD_DX, act, qt_rmsnorm_bwd_dx, rmsnorm_args)                           \
    X(KERNEL_RMSNORM_BWD_DX_REGS, act, qt_rmsnorm_bwd_dx_regs, rmsnorm_args)                 \
    X(KERNEL_RMSNORM_DGAMMA_PARTIAL, act, qt_rmsnorm_dgamma_partial, rmsnorm_args)           \
    X(KERNEL_RMSNORM_DGAMMA_FINAL, act, qt_rmsnorm_dgamma_final, rmsnorm_args)               \
    X(KERNEL_RESIDUAL_ADD, act, qt_residual_add, residual_args)                              \
    X(KERNEL_XENT_COUNT, act, qt_xent_count, xent_args)                                      \
    X(KERNEL_XENT_ROWS, act, qt_xent_rows, xent_args)                                        \
    X(KERNEL_XENT_FINAL, act, qt_xent_final, xent_args)                                      \
    X(KERNEL_MSE_ROWS, act, qt_mse_rows, mse_args)                                           \
    X(KERNEL_MSE_FINAL, act, qt_mse_final, mse_args)                                         \
    X(KERNEL_XENT_SMALL, act, qt_xent_small, xent_args)                                      \
    X(KERNEL_MSE_SMALL, act, qt_mse_small, mse_args)                                         \
    X(KERNEL_GNORM, act, qt_gnorm, gnorm_args)                                               \
    X(KERNEL_GEMM_SPLIT_REDUCE_ACT_FWD, act, qt_gemm_split_reduce_act_fwd, gemm_act_args)    \
    X(KERNEL_GEMM_SPLIT_REDUCE_ACT_BWD, act, qt_gemm_split_reduce_act_bwd, gemm_act_args)

// ---------------------------------------------------------------------------------------------
// Loads and stores. Addresses are device addresses on the GPU and host addresses on the reference
// backend; both sides convert with the same code.

#define QT_ACT_NAN_BITS 0x7FFFFFFFu

// GPU arithmetic returns the canonical NaN 0x7FFFFFFF, x86 keeps an operand's payload and sign:
// every stored float goes through this, so stored NaNs agree whatever produced them.
QT_HD float qt_act_canonical(float v) {
    return qt_f32_is_nan(v) ? qt_bits_f32(QT_ACT_NAN_BITS) : v;
}

QT_HD float qt_act_load(uint64_t base, uint64_t i, uint32_t dtype) {
    if (dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(((const uint16_t *)(uintptr_t)base)[i]);
    return ((const float *)(uintptr_t)base)[i];
}

// BF16 stores round to nearest even (qt_f32_to_bf16); a NaN becomes 0x7FFF.
QT_HD void qt_act_store(uint64_t base, uint64_t i, uint32_t dtype, float v) {
    v = qt_act_canonical(v);
    if (dtype == QT_DTYPE_BF16) {
        ((uint16_t *)(uintptr_t)base)[i] = qt_f32_to_bf16(v);
    } else {
        ((float *)(uintptr_t)base)[i] = v;
    }
}

QT_HD uint32_t qt_act_dtype_bytes(uint32_t dtype) { return dtype == QT_DTYPE_BF16 ? 2u : 4u; }

// The value a load returns after qt_act_store stored v (a kernel that adds to a value it would
// have stored uses it, so that the sum is the one a later kernel would compute).
QT_HD float qt_act_stored(float v, uint32_t dtype) {
    v = qt_act_canonical(v);
    return dtype == QT_DTYPE_BF16 ? qt_bf16_to_f32(qt_f32_to_bf16(v)) : v;
}

// SwiGLU's a = x[r][j] and b = x[r][H + j] (H = cols / 2) with their biases, one element (the
// kernels' scalar path and the C twins).
QT_HD void qt_swiglu_ab(const act_args *a, uint64_t r, uint32_t j, float *va, float *vb) {
    uint32_t h = a->cols / 2;
    *va = qt_act_load(a->x, r * a->cols + j, a->x_dtype);
    *vb = qt_act_load(a->x, r * a->cols + h + j, a->x_dtype);
    if (a->bias) {
        *va = *va + qt_act_load(a->bias, j, a->bias_dtype);
        *vb = *vb + qt_act_load(a->bias, h + j, a->bias_dtype);
    }
}

// SwiGLU: y = silu(a) * b; da = (dy * b) * silu'(a); db = dy * silu(a).
QT_HD float qt_swiglu_forward(float a, float b) { return qt_act_silu(a) * b; }
QT_HD float qt_swiglu_da(float a, float b, float dy) { return (dy * b) * qt_act_silu_grad(a); }
QT_HD float qt_swiglu_db(float a, float dy) { return dy * qt_act_silu(a); }

// ---------------------------------------------------------------------------------------------
// Reductions' scalar steps.

// The lane tree of a warp reduction, as the twins run it: for m = 16 .. 1, a[i] = op(a[i],
// a[i + m]) for i < m (on the GPU: shfl_down by m, own value first). Returns a[0].
#define QT_ACT_TREE32(a, op)                                        \
    do {                                                            \
        for (uint32_t qt_m_ = 16; qt_m_ > 0; qt_m_ >>= 1) {         \
            for (uint32_t qt_i_ = 0; qt_i_ < qt_m_; qt_i_++) {      \
                (a)[qt_i_] = op((a)[qt_i_], (a)[qt_i_ + qt_m_]);    \
            }                                                       \
        }                                                           \
    } while (0)

QT_HD float qt_act_add(float a, float b) { return a + b; }

// RMSNorm: inv = 1 / sqrt(sum / cols + eps), three IEEE roundings after the sum (cols < 2^24 is
// exact in FP32).
QT_HD float qt_rmsnorm_inv(float sum_sq, uint32_t cols, float eps) {
    return 1.0f / qt_sqrtf(sum_sq / (float)cols + eps);
}

// y = (x inv) gamma.
QT_HD float qt_rmsnorm_y(float x, float inv, float gamma) { return (x * inv) * gamma; }

// Backward, with xhat = x inv (as the forward pass rounded it) and dxhat = dy gamma:
//   c = sum(dxhat xhat) / cols (qt_rmsnorm_dot folds one element; the sum is a row reduction)
//   dx = inv (dxhat - xhat c), the difference in one fma
//   dgamma = sum over rows of dy xhat (qt_rmsnorm_dgamma_step folds one row)
QT_HD float qt_rmsnorm_dot(float x, float dy, float gamma, float inv, float acc) {
    return qt_fmaf(dy * gamma, x * inv, acc);
}

QT_HD float qt_rmsnorm_mean_dot(float sum, uint32_t cols) { return sum / (float)cols; }

QT_HD float qt_rmsnorm_dx(float x, float dy, float gamma, float inv, float c) {
    return inv * qt_fmaf(-(x * inv), c, dy * gamma);
}

QT_HD float qt_rmsnorm_dgamma_step(float x, float dy, float inv, float acc) {
    return qt_fmaf(dy, x * inv, acc);
}

// Softmax cross-entropy's running (max, argmax) per lane and in the tree. The order is the
// value, then the lower index on ties (-0 == +0 ties too); NaN never wins a comparison, so NaNs
// never enter and the combination is associative and commutative: any tree gives the same pair.
// The identity is (-Inf, QT_XENT_NONE).
#define QT_XENT_NONE 0xFFFFFFFFu

typedef struct qt_xent_best {
    float value;
    uint32_t index;
} qt_xent_best;

QT_HD qt_xent_best qt_xent_best_combine(qt_xent_best own, qt_xent_best other) {
    int take = other.value > own.value || (other.value == own.value && other.index < own.index);
    return take ? other : own;
}

// Label of row r if it is a class, else -1 (ignored).
QT_HD int32_t qt_xent_label(uint64_t labels, uint64_t r, uint32_t classes) {
    int32_t label = ((const int32_t *)(uintptr_t)labels)[r];
    return label >= 0 && (uint32_t)label < classes ? label : -1;
}

// Row loss: (max - z_label) + log(sum of exp(z - max)). sum >= 1 (the max's own term), so the
// logarithm is >= 0 and the loss is never negative (NaN with any NaN logit).
QT_HD float qt_xent_row_loss(float max, float z_label, float sum_exp) {
    return (max - z_label) + qt_logf(sum_exp);
}

// dlogit = (softmax - onehot) / valid, each step one IEEE rounding.
QT_HD float qt_xent_dlogit(float z, float max, float sum_exp, int is_label, float valid) {
    float p = qt_expf(z - max) / sum_exp;
    return (is_label ? p - 1.0f : p) / valid;
}

QT_HD float qt_loss_mean(float sum, float count) { return count > 0.0f ? sum / count : 0.0f; }

// MSE: dpred = 2 (p - t) / n with n = valid rows * cols rounded once to FP32; 2 d is exact.
QT_HD float qt_mse_dpred(float d, float n) { return (d + d) / n; }

// Whether the one-block kernels (qt_xent_small, qt_mse_small) can take a loss over rows x cols.
QT_HD int qt_loss_small_fits(uint32_t rows, uint32_t cols) {
    return rows <= QT_LOSS_SMALL_ROWS_MAX && cols <= QT_LOSS_SMALL_COLS_MAX;
}

// Whether op_xent and op_mse take them: they fit, and they are faster than the split kernels.
QT_HD int qt_loss_one_block(uint32_t rows, uint32_t cols) {
    uint32_t rows_per_thread = (rows + QT_ACT_THREADS - 1) / QT_ACT_THREADS;
    return qt_loss_small_fits(rows, cols) &&
           rows_per_thread * cols <= QT_LOSS_SMALL_THREAD_ELEMS_MAX;
}

QT_HD uint32_t qt_mse_valid(uint64_t valid_rows, uint32_t rows) {
    if (valid_rows == 0) return rows;
    uint32_t v = *(const uint32_t *)(uintptr_t)valid_rows;
    return v < rows ? v : rows;
}

// Gradient clipping as PyTorch's clip_grad_norm_: clip / (norm + 1e-6), clamped to 1. A NaN
// quotient (NaN norm) compares false and gives 1; the non-finite flag skips that step anyway.
QT_HD float qt_gnorm_clip_factor(float norm, float clip) {
    if (!(clip > 0.0f)) return 1.0f;
    float q = clip / (norm + 0x1.0c6f7ap-20f);  // f32(1e-6)
    return q < 1.0f ? q : 1.0f;
}

// The region of block `block` of a qt_gnorm launch (first_block ascending).
QT_HD uint32_t qt_gnorm_region(const gnorm_args *a, uint32_t block) {
    uint32_t r = 0;
    for (uint32_t i = 1; i < a->regions; i++) {
        if (a->first_block[i] <= block) r = i;
    }
    return r;
}

// ---------------------------------------------------------------------------------------------
// Device code shared by the element kernels of ptx/act.cu and ptx/moe.cu: loads and stores of
// 8-element chunks of BF16 or FP32 tensors, and the per-member amax of a grouped output
// (ptx/quant_group.h) that its producer merges for the current-scaling cast that reads it next.
// The per-element arithmetic is the functions above (qt_act_load, qt_act_store,
// qt_act_stored_amax), which the C twins run; a chunk load or store gives exactly the values of
// eight of those calls.
//
// Per-member amax. A block keeps one maximum per member in dynamic shared memory (u32 bits,
// 4 x members bytes, zeroed when the block starts): every thread folds the magnitudes it stores
// into a running maximum (fmaxf: NaN skipped) and merges it, rounded to the stored dtype
// (qt_act_stored_amax: rounding is monotonic, so that is the largest stored magnitude), into its
// member's entry with a shared atomicMax on the bits (non-negative floats order like their bits);
// then the block merges each nonzero entry into the member's global slot with one atomicMax,
// skipped when the slot already holds as much. A maximum is exact and order-free, so the slots
// get the bits of a separate qt_fp8_amax pass over the stored tensor's valid rows.
#if defined(__CUDACC__)

__device__ __forceinline__ bool act_aligned16(uint64_t address) { return (address & 15u) == 0; }

// Eight BF16 values of one 16-byte load as FP32.
__device__ __forceinline__ void act_unpack8_bf16(uint4 u, float v[8]) {
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {  // element 2k is the low half of word k (little-endian)
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
}

// One 16-byte load: through the non-coherent path where the kernel never writes the tensor
// (kReadOnly), else a plain load. A backward's dy, which its dx may overwrite in place, takes
// plain loads: ld.global.nc is defined only for memory that no thread of the kernel writes.
template <bool kReadOnly, typename T>
__device__ __forceinline__ T act_ld16(const T *p) {
    if (kReadOnly) return __ldg(p);
    return *p;
}

// base[first .. first + 8), first % 8 == 0, base 16-byte aligned; kReadOnly as act_ld16's.
template <bool kReadOnly = true>
__device__ __forceinline__ void act_load8(uint64_t base, uint64_t first, uint32_t dtype,
                                          float v[8]) {
    if (dtype == QT_DTYPE_BF16) {
        act_unpack8_bf16(act_ld16<kReadOnly>((const uint4 *)(uintptr_t)(base + first * 2)), v);
    } else {
        const float4 *p = (const float4 *)(uintptr_t)(base + first * 4);
        float4 a = act_ld16<kReadOnly>(p), b = act_ld16<kReadOnly>(p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
}

// BF16 pairs go through cvt.rn.bf16x2, which gives qt_f32_to_bf16's bits for every input (RNE,
// subnormals kept, the canonical NaN 0x7FFF), so the bits match the reference backend's with a
// conversion instruction for two values where the bit arithmetic took about ten for each (the
// RMSNorm, residual and SwiGLU kernels issued 30 instructions an element with it).
__device__ __forceinline__ void act_store8(uint64_t base, uint64_t first, uint32_t dtype,
                                           const float v[8]) {
    if (dtype == QT_DTYPE_BF16) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(w[k]) : "f"(v[2 * k + 1]), "f"(v[2 * k]));
        }
        *(uint4 *)(uintptr_t)(base + first * 2) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
        float c[8];
#pragma unroll
        for (int k = 0; k < 8; k++) c[k] = qt_act_canonical(v[k]);
        float4 *p = (float4 *)(uintptr_t)(base + first * 4);
        p[0] = make_float4(c[0], c[1], c[2], c[3]);
        p[1] = make_float4(c[4], c[5], c[6], c[7]);
    }
}

// max(m, |v[k]|) over the first n of a chunk's values (NaN skipped, as fmaxf does).
__device__ __forceinline__ float act_max_chunk(float m, const float v[8], uint32_t n) {
#pragma unroll
    for (uint32_t k = 0; k < 8; k++) {
        if (k < n) m = fmaxf(m, fabsf(v[k]));
    }
    return m;
}

// max |v[k]| over a whole chunk.
__device__ __forceinline__ float act_max8(const float v[8]) { return act_max_chunk(0.0f, v, 8); }

// ---------------------------------------------------------------------------------------------
// Per-member amax tables (see the header comment). Every thread of the block calls the zero and
// flush steps; the table is the block's dynamic shared memory.

__device__ __forceinline__ void act_amax_table_zero(uint32_t *table, uint32_t members) {
    for (uint32_t e = threadIdx.x; e < members; e += blockDim.x) table[e] = 0;
    __syncthreads();
}

// m: max |v| over FP32 values before their stores to dtype.
__device__ __forceinline__ void act_amax_table_merge(uint32_t *table, uint32_t member, float m,
                                                     uint32_t dtype) {
    m = qt_act_stored_amax(m, dtype);
    if (m > 0.0f) atomicMax(table + member, __float_as_uint(m));
}

// act_amax_table_merge by a whole warp (all 32 lanes converged): when the lanes that hold a
// maximum share one member, they fold theirs first and send one shared atomic.
__device__ __forceinline__ void act_amax_table_merge_warp(uint32_t *table, uint32_t member,
                                                          float m, uint32_t dtype) {
    uint32_t live = __ballot_sync(0xFFFFFFFFu, m > 0.0f);
    if (live == 0) return;
    uint32_t lead = __shfl_sync(0xFFFFFFFFu, member, __ffs(live) - 1);
    if (!__all_sync(0xFFFFFFFFu, !(m > 0.0f) || member == lead)) {
        act_amax_table_merge(table, member, m, dtype);
        return;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if ((threadIdx.x & 31u) == 0) act_amax_table_merge(table, lead, m, dtype);
}

// The table's nonzero entries into the global slots (f32 [members]), once every thread of the
// block has merged its share.
__device__ __forceinline__ void act_amax_table_flush(const uint32_t *table, uint32_t members,
                                                     uint64_t slots) {
    __syncthreads();
    unsigned int *global = (unsigned int *)(uintptr_t)slots;
    for (uint32_t e = threadIdx.x; e < members; e += blockDim.x) {
        uint32_t v = table[e];
        if (v != 0 && v > *(volatile unsigned int *)(global + e)) atomicMax(global + e, v);
    }
}

#endif  // __CUDACC__

#endif  // QT_ACT_H
