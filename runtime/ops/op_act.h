// op_act: builders that append the act kernels (ptx/act.cu) to a program: activations (ReLU,
// GELU tanh form, SiLU, SwiGLU) forward and backward, RMSNorm forward and backward, residual add,
// softmax cross-entropy and MSE losses, and the global gradient norm for clipping.
//
// Owns nothing; each builder picks the launch shapes, fills the args structs and declares every
// region its ops read and write. Numerics and reduction orders: ptx/act.h.
//
// Workspaces (caller-reserved, any alignment of 16 bytes or more, contents not needed between
// ops of different builders):
//
//   op_rmsnorm_backward   f32 [parts][cols] dgamma partials      op_rmsnorm_workspace_bytes
//   op_xent               f32 [blocks] loss sums | u32 [blocks]   op_xent_workspace_bytes
//   op_mse                f32 [blocks]                            op_mse_workspace_bytes
//                         (none, 0 bytes, for shapes that take the one-block kernel)
//   op_grad_norm          f32 [P] sums | u32 [P] flags            op_grad_norm_workspace_bytes
#ifndef QT_OP_ACT_H
#define QT_OP_ACT_H

#include "runtime/ops/op_optim.h"        // op_optim_zeroes, which the norm's fold may take
#include "runtime/ops/op_quant_group.h"  // op_group
#include "runtime/program/program.h"

// A tensor operand: where it is and how its elements are stored. Optional operands are absent
// when ref.arena is NULL (OP_ACT_NONE).
typedef struct op_act_tensor {
    prog_ref ref;
    uint32_t dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
} op_act_tensor;

#define OP_ACT_NONE ((op_act_tensor){{NULL, 0, 0}, QT_DTYPE_F32})
#define OP_REF_NONE ((prog_ref){NULL, 0, 0})

// y = act(x + bias[col]) for act = QT_ACT_RELU | GELU | SILU: x, y [rows][cols];
// act = QT_ACT_SWIGLU: x [rows][cols] with cols = 2H even, y [rows][H]. bias (optional) has the
// columns of x. amax (optional, f32 [1]): max |y| over the stored values is
// merged into it (act_args.amax), so that a per-tensor current-scaling cast of y can skip its
// amax pass; the caller zeroes it before this op.
qt_status op_act_forward(program *p, const char *name, uint32_t act, uint32_t rows,
                         uint32_t cols, op_act_tensor x, op_act_tensor bias, op_act_tensor y,
                         prog_ref amax);
// dx = dL/d(x + bias) from the saved forward input x (and the same bias) and dy (the shape of y);
// dx has the shape of x. The bias gradient is the column sum of dx (GEMM family). amax: max |dx|,
// as for the forward pass.
qt_status op_act_backward(program *p, const char *name, uint32_t act, uint32_t rows,
                          uint32_t cols, op_act_tensor x, op_act_tensor bias, op_act_tensor dy,
                          op_act_tensor dx, prog_ref amax);

// The activation (backward: its gradient, from dy) of a grouped tensor without bias: rows is the
// capacity of x, dy and out, group their members (an moe layer's permuted rows,
// ptx/quant_group.h). Rows from the active end on are neither read nor written; amax (optional,
// f32 [group->count], zeroed by the caller) gets each member's max |out| over its valid rows
// (padding rows count for none), so that the members' current-scaling cast needs no amax pass.
// Each block keeps a table of the members' maxima in shared memory, 4 bytes a member: at most
// OP_ACT_GROUP_MEMBERS_MAX members (16 KiB, a quarter of what a block may take by default).
#define OP_ACT_GROUP_MEMBERS_MAX 4096u
qt_status op_act_grouped(program *p, const char *name, bool backward, uint32_t act,
                         uint32_t rows, uint32_t cols, op_act_tensor x, op_act_tensor dy,
                         op_act_tensor out, const op_group *group, prog_ref amax);

// y = x / sqrt(mean(x^2) + eps) * gamma; inv_rms: f32 [rows] saved for the backward pass.
// amax (optional, f32 [1]): max |y| over the stored values, merged as op_act_forward's.
qt_status op_rmsnorm_forward(program *p, const char *name, uint32_t rows, uint32_t cols,
                             float eps, op_act_tensor x, op_act_tensor gamma, op_act_tensor y,
                             prog_ref inv_rms, prog_ref amax);

typedef struct op_rmsnorm_grads {
    op_act_tensor dx;  // [rows][cols]; ref absent: not computed (no skip, no amax then)
    prog_ref dgamma;   // f32 [cols]
    bool accumulate;   // dgamma += this batch's gradient (dx is always overwritten)
    prog_ref workspace;
    // Optional: the gradient of a residual block's skip path ([rows][cols], ref absent: none).
    // With it dx receives skip + dx, the residual add that would follow, with that add's bits
    // (rmsnorm_args.skip): one pass over dx fewer.
    op_act_tensor skip;
    prog_ref amax;  // optional, f32 [1]: max |dx| over the stored values, merged as the forward's
} op_rmsnorm_grads;

// Three ops: dx (one warp per row; none without dx), dgamma partials over fixed row ranges,
// dgamma final.
qt_status op_rmsnorm_backward(program *p, const char *name, uint32_t rows, uint32_t cols,
                              op_act_tensor x, op_act_tensor gamma, prog_ref inv_rms,
                              op_act_tensor dy, const op_rmsnorm_grads *grads);
// Rows of one dgamma part: max(64, ceil(rows / 256)), so there are at most 256 parts. A function
// of rows alone, so dgamma does not depend on anything but the data and the shape.
uint32_t op_rmsnorm_rows_per_part(uint32_t rows);
uint64_t op_rmsnorm_workspace_bytes(uint32_t rows, uint32_t cols);

// y = x + f (count elements). amax (optional, f32 [1]): max |y| over the stored values, merged
// as op_act_forward's.
qt_status op_residual_forward(program *p, const char *name, uint64_t count, op_act_tensor x,
                              op_act_tensor f, op_act_tensor y, prog_ref amax);
// The residual's backward pass hands dy to both branches: dx = dy (a copy, converting the
// dtype), or dx = dx + dy with accumulate (dx already holds the other branch's gradient).
qt_status op_residual_backward(program *p, const char *name, uint64_t count, op_act_tensor dy,
                               op_act_tensor dx, bool accumulate);

// Softmax cross-entropy of logits [rows][classes] with i32 labels [rows]; rows whose label is
// not a class (-1) are ignored. loss (optional): f32 [rows]; dlogits (optional, training):
// (softmax - onehot) / valid rows; dlogits_amax (optional, with dlogits, f32 [1]): max |dlogits|
// over the stored values, merged as op_act_forward's; stats: qt_loss_stats. Three ops (count,
// rows, final), or one when qt_loss_one_block(rows, classes) (ptx/act.h), with the same results
// bit for bit; the workspace is then not used and may be OP_REF_NONE.
qt_status op_xent(program *p, const char *name, uint32_t rows, uint32_t classes,
                  op_act_tensor logits, prog_ref labels, prog_ref loss, op_act_tensor dlogits,
                  prog_ref dlogits_amax, prog_ref workspace, prog_ref stats);
uint64_t op_xent_workspace_bytes(uint32_t rows, uint32_t classes);

// Mean squared error over the first valid rows (valid_rows: optional u32 on the device, written
// by the data pipeline; absent = all rows): loss = mean((p - t)^2), dpred (optional) =
// 2 (p - t) / (valid * cols), 0 on padding rows; dpred_amax as op_xent's dlogits_amax. Two ops
// (rows, final), or one as op_xent.
qt_status op_mse(program *p, const char *name, uint32_t rows, uint32_t cols, op_act_tensor pred,
                 op_act_tensor target, prog_ref valid_rows, op_act_tensor dpred,
                 prog_ref dpred_amax, prog_ref workspace, prog_ref stats);
uint64_t op_mse_workspace_bytes(uint32_t rows, uint32_t cols);

// What op_optim_begin (runtime/ops/op_optim.h) does with the norm, done by the folding block of
// the norm's last op instead: one launch fewer in a step whose norm needs no folding across
// ranks. The regions are op_optim_begin's.
typedef struct op_gnorm_begin {
    prog_ref steps, state, lr_rows;
    uint32_t lr_row_count;
    const op_optim_zeroes *zeroes;  // the amax targets zeroed too, or NULL
} op_gnorm_begin;

// Global L2 norm of `regions` FP32 gradient regions (grads[i]: counts[i] elements), the clip
// factor min(1, clip / (norm + 1e-6)) (clip <= 0: 1) and a non-finite flag, into out
// (qt_gnorm_result). One op per QT_GNORM_REGIONS regions; the last block of the last op folds
// (ptx/act.h), then begins the optimizer step on out when `begin` is given (else NULL). ticket:
// a u32 that is zero at bind and never written by anything else (a persistent region: the fold
// leaves it zero for the next step).
qt_status op_grad_norm(program *p, const char *name, uint32_t regions, const prog_ref *grads,
                       const uint64_t *counts, float clip, prog_ref workspace, prog_ref ticket,
                       prog_ref out, const op_gnorm_begin *begin);
uint64_t op_grad_norm_workspace_bytes(uint32_t regions, const uint64_t *counts);

// The same norm in parts: op_grad_norm's arguments as one set, and the launches of regions
// first .. first + count - 1 alone, their partials where op_grad_norm puts them. A program can
// then read each group of gradients as soon as the backward pass has written it, beside the
// rest of the backward pass. Every region must be in exactly one part, and the part with `fold`
// must come last in program order: its last launch folds every partial (then begins, with the
// set's begin). The bits equal op_grad_norm's however the regions are split (the fold sums the
// partials in region order).
typedef struct op_gnorm_set {
    uint32_t regions;
    const prog_ref *grads;
    const uint64_t *counts;
    float clip;
    prog_ref workspace, ticket, out;
    const op_gnorm_begin *begin;  // or NULL
    // NULL, or per region: grads[i] is the norm units (ptx/gemm.h) of the GEMM that wrote the
    // gradient, counts[i] of them, instead of its elements.
    const bool *units;
} op_gnorm_set;
qt_status op_grad_norm_part(program *p, const char *name, const op_gnorm_set *set,
                            uint32_t first, uint32_t count, bool fold);

#endif  // QT_OP_ACT_H
