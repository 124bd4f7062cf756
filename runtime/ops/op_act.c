#include "runtime/ops/op_act.h"

#include <stddef.h>  // offsetof

#include "runtime/ops/op_core.h"  // op_shape_1d_capped, OP_PLAN_SMS

static void op_act_check_tensor(op_act_tensor t) {
    QT_ASSERT(prog_ref_present(t.ref));
    QT_ASSERT(t.dtype == QT_DTYPE_BF16 || t.dtype == QT_DTYPE_F32);
}

// One warp per row, QT_ACT_ROWS_PER_BLOCK rows per block.
static launch_shape op_act_row_shape(uint32_t rows) {
    uint32_t blocks = (rows + QT_ACT_ROWS_PER_BLOCK - 1) / QT_ACT_ROWS_PER_BLOCK;
    return (launch_shape){{blocks, 1, 1}, {QT_ACT_THREADS, 1, 1}, 0};
}

static const launch_shape op_act_one_block = {{1, 1, 1}, {QT_ACT_THREADS, 1, 1}, 0};

// Grid-stride element kernels: one thread per chunk of 8, each chunk its own thread up to
// OP_ACT_FLAT_BLOCKS_MAX blocks (values never depend on the grid). op_core's cap of
// OP_GRID_BLOCKS_MAX blocks made a large activation two waves with a short second one (GELU at
// 40 registers: 6 resident blocks per SM, 792 of 1024 in the first wave on 132 SMs), while a
// grid of one chunk per thread leaves only the last blocks' tail.
#define OP_ACT_FLAT_BLOCKS_MAX (1u << 20)

static launch_shape op_act_flat_shape(uint64_t count) {
    return op_shape_1d_capped((count + QT_ACT_CHUNK - 1) / QT_ACT_CHUNK, QT_ACT_THREADS,
                              OP_ACT_FLAT_BLOCKS_MAX);
}

// The table kernels (qt_act_fwd_lut, qt_act_bwd_lut; ptx/act.h, QT_ACT_LUT_*): one block of
// QT_ACT_LUT_THREADS an SM of the GPUs the programs are planned for (OP_PLAN_SMS; the grid
// changes no value), fewer for a tensor of fewer chunks. Each block computes the 4096-entry
// table first, 4 exact evaluations a thread, which tensors from OP_ACT_LUT_ITEMS_MIN elements
// (1024 a block and more) repay many times; smaller ones keep the flat kernels.
#define OP_ACT_LUT_ITEMS_MIN (1ull << 21)

static bool op_act_lut_takes(uint32_t act, bool grouped, op_act_tensor x, op_act_tensor bias,
                             uint64_t items) {
    return (act == QT_ACT_GELU || act == QT_ACT_SILU) && !grouped &&
           x.dtype == QT_DTYPE_BF16 && !prog_ref_present(bias.ref) &&
           items >= OP_ACT_LUT_ITEMS_MIN;
}

// SwiGLU's table kernels (qt_swiglu_*_lut, dense and grouped) from the same size, for a BF16 x
// without a bias, a BF16 dy, and whole 16-byte vectors (rows of a and b of whole chunks, every
// tensor at a 16-byte offset), which is all they load.
static bool op_swiglu_lut_takes(bool backward, uint32_t cols, op_act_tensor x, op_act_tensor bias,
                                op_act_tensor dy, op_act_tensor out, uint64_t items) {
    uint64_t offsets = x.ref.offset | out.ref.offset | (backward ? dy.ref.offset : 0u);
    return x.dtype == QT_DTYPE_BF16 && !prog_ref_present(bias.ref) &&
           (!backward || dy.dtype == QT_DTYPE_BF16) && (cols / 2) % QT_ACT_CHUNK == 0 &&
           offsets % 16 == 0 && items >= OP_ACT_LUT_ITEMS_MIN;
}

static launch_shape op_act_lut_shape(uint64_t items) {
    return op_shape_1d_capped((items + QT_ACT_CHUNK - 1) / QT_ACT_CHUNK, QT_ACT_LUT_THREADS,
                              OP_PLAN_SMS);
}

// ---------------------------------------------------------------------------------------------
// Activations.

// group: NULL for a dense tensor; a grouped one gets the per-member amax table (act_args.group).
static qt_status op_act_append(program *p, const char *name, bool backward, uint32_t act,
                               uint32_t rows, uint32_t cols, op_act_tensor x, op_act_tensor bias,
                               op_act_tensor dy, op_act_tensor out, const op_group *group,
                               prog_ref amax) {
    QT_ASSERT(act <= QT_ACT_SWIGLU);
    QT_ASSERT(rows >= 1 && cols >= 1);
    // The kernels read x through the non-coherent path, so out never shares its bytes. A
    // backward's dx may be written over dy (act_args.out): the very same bytes in the same dtype,
    // one output per input; any other overlap would race.
    QT_ASSERT(!prog_ref_same_region(x.ref, out.ref));
    if (backward && prog_ref_same_region(dy.ref, out.ref)) {
        QT_ASSERT(dy.ref.offset == out.ref.offset && dy.dtype == out.dtype &&
                  act != QT_ACT_SWIGLU);
    }
    QT_ASSERT(act != QT_ACT_SWIGLU || cols % 2 == 0);
    op_act_check_tensor(x);
    op_act_check_tensor(out);
    if (prog_ref_present(bias.ref)) op_act_check_tensor(bias);
    if (backward) op_act_check_tensor(dy);
    act_args args = {0};
    args.rows = rows;
    args.cols = cols;
    args.act = act;
    args.x_dtype = x.dtype;
    args.bias_dtype = bias.dtype;
    args.dy_dtype = dy.dtype;
    args.out_dtype = out.dtype;
    bool swiglu = act == QT_ACT_SWIGLU;
    bool grouped = group != NULL && group->count > 0;
    kernel_id kernel = swiglu ? (backward ? KERNEL_SWIGLU_BWD : KERNEL_SWIGLU_FWD)
                              : (backward ? KERNEL_ACT_BWD : KERNEL_ACT_FWD);
    if (grouped) {
        kernel = swiglu ? (backward ? KERNEL_SWIGLU_BWD_GROUPED : KERNEL_SWIGLU_FWD_GROUPED)
                        : (backward ? KERNEL_ACT_BWD_GROUPED : KERNEL_ACT_FWD_GROUPED);
    }
    uint64_t items = (uint64_t)rows * (swiglu ? cols / 2 : cols);
    launch_shape shape = op_act_flat_shape(items);
    if (op_act_lut_takes(act, grouped, x, bias, items)) {
        kernel = backward ? KERNEL_ACT_BWD_LUT : KERNEL_ACT_FWD_LUT;
        shape = op_act_lut_shape(items);
    }
    if (swiglu && op_swiglu_lut_takes(backward, cols, x, bias, dy, out, items)) {
        if (grouped) {
            kernel = backward ? KERNEL_SWIGLU_BWD_LUT_GROUPED : KERNEL_SWIGLU_FWD_LUT_GROUPED;
        } else {
            kernel = backward ? KERNEL_SWIGLU_BWD_LUT : KERNEL_SWIGLU_FWD_LUT;
        }
        shape = op_act_lut_shape(items);
    }
    if (grouped && prog_ref_present(amax)) shape.smem_bytes = 4 * group->count;
    uint32_t op;
    QT_TRY(prog_append(p, kernel, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(act_args, x), x.ref, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(act_args, bias), bias.ref, 0, PROG_READ));
    if (backward) QT_TRY(prog_use(p, op, offsetof(act_args, dy), dy.ref, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(act_args, amax), amax,
                             grouped ? 4ull * group->count : 0, PROG_READ_WRITE));
    if (grouped) QT_TRY(op_group_use(p, op, offsetof(act_args, group), group));
    return prog_use(p, op, offsetof(act_args, out), out.ref, PROG_WRITE);
}

qt_status op_act_forward(program *p, const char *name, uint32_t act, uint32_t rows,
                         uint32_t cols, op_act_tensor x, op_act_tensor bias, op_act_tensor y,
                         prog_ref amax) {
    return op_act_append(p, name, false, act, rows, cols, x, bias, OP_ACT_NONE, y, NULL, amax);
}

qt_status op_act_backward(program *p, const char *name, uint32_t act, uint32_t rows,
                          uint32_t cols, op_act_tensor x, op_act_tensor bias, op_act_tensor dy,
                          op_act_tensor dx, prog_ref amax) {
    return op_act_append(p, name, true, act, rows, cols, x, bias, dy, dx, NULL, amax);
}

qt_status op_act_grouped(program *p, const char *name, bool backward, uint32_t act,
                         uint32_t rows, uint32_t cols, op_act_tensor x, op_act_tensor dy,
                         op_act_tensor out, const op_group *group, prog_ref amax) {
    QT_ASSERT(group->count >= 1 && group->count <= OP_ACT_GROUP_MEMBERS_MAX);
    return op_act_append(p, name, backward, act, rows, cols, x, OP_ACT_NONE,
                         backward ? dy : OP_ACT_NONE, out, group, amax);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm.

uint32_t op_rmsnorm_rows_per_part(uint32_t rows) {
    uint32_t per_part = (uint32_t)(((uint64_t)rows + QT_RMSNORM_PARTS_MAX - 1) /
                                   QT_RMSNORM_PARTS_MAX);
    return per_part > QT_RMSNORM_PART_ROWS_MIN ? per_part : QT_RMSNORM_PART_ROWS_MIN;
}

static uint32_t op_rmsnorm_parts(uint32_t rows) {
    uint32_t per_part = op_rmsnorm_rows_per_part(rows);
    return (uint32_t)(((uint64_t)rows + per_part - 1) / per_part);
}

uint64_t op_rmsnorm_workspace_bytes(uint32_t rows, uint32_t cols) {
    return (uint64_t)op_rmsnorm_parts(rows) * cols * 4;
}

static void op_rmsnorm_check(uint32_t rows, uint32_t cols, op_act_tensor x, op_act_tensor gamma,
                             prog_ref inv_rms) {
    QT_ASSERT(rows >= 1 && cols >= 1);
    QT_ASSERT(cols < (1u << 24));  // (float)cols is exact
    op_act_check_tensor(x);
    op_act_check_tensor(gamma);
    QT_ASSERT(prog_ref_present(inv_rms));
}

// The forward kernel: qt_rmsnorm_fwd_regs (the row in registers from the sum of squares to y)
// for rows of whole chunks at 16-byte offsets, of BF16 x up to QT_RMSNORM_REGS_COLS_MAX columns
// (as the dx kernel below) or FP32 x up to QT_RMSNORM_REGS_COLS_MAX_F32; the same bits either
// way.
static kernel_id op_rmsnorm_fwd_kernel(uint32_t cols, op_act_tensor x, op_act_tensor gamma,
                                       op_act_tensor y) {
    bool aligned = (x.ref.offset | gamma.ref.offset | y.ref.offset) % 16 == 0;
    uint32_t cols_max = x.dtype == QT_DTYPE_BF16 ? QT_RMSNORM_REGS_COLS_MAX
                                                 : QT_RMSNORM_REGS_COLS_MAX_F32;
    bool fits = cols % QT_ACT_CHUNK == 0 && cols <= cols_max;
    return aligned && fits ? KERNEL_RMSNORM_FWD_REGS : KERNEL_RMSNORM_FWD;
}

qt_status op_rmsnorm_forward(program *p, const char *name, uint32_t rows, uint32_t cols,
                             float eps, op_act_tensor x, op_act_tensor gamma, op_act_tensor y,
                             prog_ref inv_rms, prog_ref amax) {
    op_rmsnorm_check(rows, cols, x, gamma, inv_rms);
    op_act_check_tensor(y);
    rmsnorm_args args = {0};
    args.rows = rows;
    args.cols = cols;
    args.eps = eps;
    args.x_dtype = x.dtype;
    args.gamma_dtype = gamma.dtype;
    args.out_dtype = y.dtype;
    launch_shape shape = op_act_row_shape(rows);
    uint32_t op;
    QT_TRY(prog_append(p, op_rmsnorm_fwd_kernel(cols, x, gamma, y), name, &shape, &args,
                       sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, x), x.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, gamma), gamma.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, out), y.ref, PROG_WRITE));
    QT_TRY(prog_use_optional(p, op, offsetof(rmsnorm_args, amax), amax, 4, PROG_READ_WRITE));
    return prog_use(p, op, offsetof(rmsnorm_args, inv_rms), inv_rms, PROG_WRITE);
}

// The dx kernel: qt_rmsnorm_bwd_dx_regs (the row in registers between its two passes) where its
// 16-byte loads and stores fit, BF16 x and dy, rows of whole chunks up to
// QT_RMSNORM_REGS_COLS_MAX (regions start 256-byte aligned, so the offsets decide), and with a
// skip gradient (op_rmsnorm_grads.skip) BF16 skip and dx; the same bits either way.
static kernel_id op_rmsnorm_dx_kernel(uint32_t cols, op_act_tensor x, op_act_tensor gamma,
                                      op_act_tensor dy, op_act_tensor dx, op_act_tensor skip) {
    bool has_skip = prog_ref_present(skip.ref);
    uint64_t offsets = x.ref.offset | gamma.ref.offset | dy.ref.offset | dx.ref.offset |
                       (has_skip ? skip.ref.offset : 0u);
    // With a skip gradient, the kernel packs dx to BF16 and reads skip as BF16.
    bool skip_fits = !has_skip || (skip.dtype == QT_DTYPE_BF16 && dx.dtype == QT_DTYPE_BF16);
    bool aligned = offsets % 16 == 0;
    bool fits = x.dtype == QT_DTYPE_BF16 && dy.dtype == QT_DTYPE_BF16 && skip_fits &&
                cols % QT_ACT_CHUNK == 0 && cols <= QT_RMSNORM_REGS_COLS_MAX;
    return aligned && fits ? KERNEL_RMSNORM_BWD_DX_REGS : KERNEL_RMSNORM_BWD_DX;
}

qt_status op_rmsnorm_backward(program *p, const char *name, uint32_t rows, uint32_t cols,
                              op_act_tensor x, op_act_tensor gamma, prog_ref inv_rms,
                              op_act_tensor dy, const op_rmsnorm_grads *grads) {
    op_rmsnorm_check(rows, cols, x, gamma, inv_rms);
    op_act_check_tensor(dy);
    bool has_dx = prog_ref_present(grads->dx.ref);
    if (has_dx) op_act_check_tensor(grads->dx);
    QT_ASSERT(has_dx || (!prog_ref_present(grads->skip.ref) && !prog_ref_present(grads->amax)));
    QT_ASSERT(prog_ref_present(grads->dgamma) && prog_ref_present(grads->workspace));
    rmsnorm_args args = {0};
    args.rows = rows;
    args.cols = cols;
    args.rows_per_part = op_rmsnorm_rows_per_part(rows);
    args.parts = op_rmsnorm_parts(rows);
    args.accumulate = grads->accumulate ? 1u : 0u;
    args.x_dtype = x.dtype;
    args.gamma_dtype = gamma.dtype;
    args.dy_dtype = dy.dtype;
    args.out_dtype = has_dx ? grads->dx.dtype : 0u;
    bool skip = prog_ref_present(grads->skip.ref);
    if (skip) op_act_check_tensor(grads->skip);
    args.skip_dtype = skip ? grads->skip.dtype : 0u;
    uint32_t op;
    if (has_dx) {
        launch_shape shape = op_act_row_shape(rows);
        kernel_id dx_kernel = op_rmsnorm_dx_kernel(cols, x, gamma, dy, grads->dx, grads->skip);
        QT_TRY(prog_append(p, dx_kernel, name, &shape, &args, sizeof args, &op));
        QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, x), x.ref, PROG_READ));
        QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, gamma), gamma.ref, PROG_READ));
        QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, inv_rms), inv_rms, PROG_READ));
        QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, dy), dy.ref, PROG_READ));
        QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, out), grads->dx.ref, PROG_WRITE));
        if (skip) {
            QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, skip), grads->skip.ref, PROG_READ));
        }
        QT_TRY(prog_use_optional(p, op, offsetof(rmsnorm_args, amax), grads->amax, 4,
                                 PROG_READ_WRITE));
    }

    uint32_t col_blocks = (cols + QT_ACT_THREADS - 1) / QT_ACT_THREADS;
    launch_shape partial_shape = {{col_blocks, args.parts, 1}, {QT_ACT_THREADS, 1, 1}, 0};
    QT_TRY(prog_append(p, KERNEL_RMSNORM_DGAMMA_PARTIAL, name, &partial_shape, &args,
                       sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, x), x.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, inv_rms), inv_rms, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, dy), dy.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, partials), grads->workspace, PROG_WRITE));

    launch_shape final_shape = {{col_blocks, 1, 1}, {QT_ACT_THREADS, 1, 1}, 0};
    QT_TRY(prog_append(p, KERNEL_RMSNORM_DGAMMA_FINAL, name, &final_shape, &args, sizeof args,
                       &op));
    QT_TRY(prog_use(p, op, offsetof(rmsnorm_args, partials), grads->workspace, PROG_READ));
    return prog_use(p, op, offsetof(rmsnorm_args, dgamma), grads->dgamma,
                    grads->accumulate ? PROG_READ_WRITE : PROG_WRITE);
}

// ---------------------------------------------------------------------------------------------
// Residual add.

static qt_status op_residual_append(program *p, const char *name, uint64_t count,
                                    op_act_tensor a, op_act_tensor b, op_act_tensor y,
                                    prog_ref amax) {
    QT_ASSERT(count >= 1);
    op_act_check_tensor(a);
    op_act_check_tensor(y);
    if (prog_ref_present(b.ref)) op_act_check_tensor(b);
    residual_args args = {0, 0, 0, count, a.dtype, b.dtype, y.dtype, 0, 0};
    launch_shape shape = op_act_flat_shape(count);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_RESIDUAL_ADD, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(residual_args, a), a.ref, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(residual_args, b), b.ref, 0, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(residual_args, amax), amax, 4, PROG_READ_WRITE));
    return prog_use(p, op, offsetof(residual_args, y), y.ref, PROG_WRITE);
}

qt_status op_residual_forward(program *p, const char *name, uint64_t count, op_act_tensor x,
                              op_act_tensor f, op_act_tensor y, prog_ref amax) {
    op_act_check_tensor(f);
    return op_residual_append(p, name, count, x, f, y, amax);
}

qt_status op_residual_backward(program *p, const char *name, uint64_t count, op_act_tensor dy,
                               op_act_tensor dx, bool accumulate) {
    // accumulate: dx = dx + dy, reading dx through the kernel's `a` and writing it through `y`.
    if (accumulate) return op_residual_append(p, name, count, dx, dy, dx, OP_REF_NONE);
    return op_residual_append(p, name, count, dy, OP_ACT_NONE, dx, OP_REF_NONE);
}

// ---------------------------------------------------------------------------------------------
// Losses.

static uint32_t op_act_row_blocks(uint32_t rows) {
    return (rows + QT_ACT_ROWS_PER_BLOCK - 1) / QT_ACT_ROWS_PER_BLOCK;
}

uint64_t op_xent_workspace_bytes(uint32_t rows, uint32_t classes) {
    return qt_loss_one_block(rows, classes) ? 0 : (uint64_t)op_act_row_blocks(rows) * 8;
}

uint64_t op_mse_workspace_bytes(uint32_t rows, uint32_t cols) {
    return qt_loss_one_block(rows, cols) ? 0 : (uint64_t)op_act_row_blocks(rows) * 4;
}

// A loss gradient's amax slot, written by the op that stores the gradient.
static qt_status op_loss_use_amax(program *p, uint32_t op, uint32_t field, op_act_tensor grad,
                                  prog_ref amax) {
    QT_ASSERT(!prog_ref_present(amax) || prog_ref_present(grad.ref));
    return prog_use_optional(p, op, field, amax, 4, PROG_READ_WRITE);
}

// What the row pass (and the one-block kernel) of xent reads and writes.
static qt_status op_xent_use_rows(program *p, uint32_t op, op_act_tensor logits, prog_ref labels,
                                  prog_ref loss, op_act_tensor dlogits, prog_ref dlogits_amax) {
    QT_TRY(prog_use(p, op, offsetof(xent_args, logits), logits.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(xent_args, labels), labels, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(xent_args, loss), loss, 0, PROG_WRITE));
    QT_TRY(op_loss_use_amax(p, op, offsetof(xent_args, dlogits_amax), dlogits, dlogits_amax));
    return prog_use_optional(p, op, offsetof(xent_args, dlogits), dlogits.ref, 0, PROG_WRITE);
}

qt_status op_xent(program *p, const char *name, uint32_t rows, uint32_t classes,
                  op_act_tensor logits, prog_ref labels, prog_ref loss, op_act_tensor dlogits,
                  prog_ref dlogits_amax, prog_ref workspace, prog_ref stats) {
    QT_ASSERT(rows >= 1 && classes >= 1);
    QT_ASSERT(classes < 0x7FFFFFFFu);  // labels are i32
    op_act_check_tensor(logits);
    if (prog_ref_present(dlogits.ref)) op_act_check_tensor(dlogits);
    QT_ASSERT(prog_ref_present(labels) && prog_ref_present(stats));
    xent_args args = {0};
    args.rows = rows;
    args.classes = classes;
    args.blocks = op_act_row_blocks(rows);
    args.logits_dtype = logits.dtype;
    args.dlogits_dtype = dlogits.dtype;
    uint32_t op;
    if (qt_loss_one_block(rows, classes)) {
        QT_TRY(prog_append(p, KERNEL_XENT_SMALL, name, &op_act_one_block, &args, sizeof args,
                           &op));
        QT_TRY(op_xent_use_rows(p, op, logits, labels, loss, dlogits, dlogits_amax));
        return prog_use(p, op, offsetof(xent_args, stats), stats, PROG_WRITE);
    }
    QT_ASSERT(prog_ref_present(workspace));
    QT_TRY(prog_append(p, KERNEL_XENT_COUNT, name, &op_act_one_block, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(xent_args, labels), labels, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(xent_args, stats), stats, PROG_WRITE));

    launch_shape shape = op_act_row_shape(rows);
    QT_TRY(prog_append(p, KERNEL_XENT_ROWS, name, &shape, &args, sizeof args, &op));
    QT_TRY(op_xent_use_rows(p, op, logits, labels, loss, dlogits, dlogits_amax));
    QT_TRY(prog_use(p, op, offsetof(xent_args, partials), workspace, PROG_WRITE));
    QT_TRY(prog_use(p, op, offsetof(xent_args, stats), stats, PROG_READ));

    QT_TRY(prog_append(p, KERNEL_XENT_FINAL, name, &op_act_one_block, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(xent_args, partials), workspace, PROG_READ));
    return prog_use(p, op, offsetof(xent_args, stats), stats, PROG_READ_WRITE);
}

// What the row pass (and the one-block kernel) of mse reads and writes.
static qt_status op_mse_use_rows(program *p, uint32_t op, op_act_tensor pred,
                                 op_act_tensor target, prog_ref valid_rows,
                                 op_act_tensor dpred, prog_ref dpred_amax) {
    QT_TRY(prog_use(p, op, offsetof(mse_args, pred), pred.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(mse_args, target), target.ref, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(mse_args, valid_rows), valid_rows, 0, PROG_READ));
    QT_TRY(op_loss_use_amax(p, op, offsetof(mse_args, dpred_amax), dpred, dpred_amax));
    return prog_use_optional(p, op, offsetof(mse_args, dpred), dpred.ref, 0, PROG_WRITE);
}

qt_status op_mse(program *p, const char *name, uint32_t rows, uint32_t cols, op_act_tensor pred,
                 op_act_tensor target, prog_ref valid_rows, op_act_tensor dpred,
                 prog_ref dpred_amax, prog_ref workspace, prog_ref stats) {
    QT_ASSERT(rows >= 1 && cols >= 1);
    op_act_check_tensor(pred);
    op_act_check_tensor(target);
    if (prog_ref_present(dpred.ref)) op_act_check_tensor(dpred);
    QT_ASSERT(prog_ref_present(stats));
    mse_args args = {0};
    args.rows = rows;
    args.cols = cols;
    args.blocks = op_act_row_blocks(rows);
    args.pred_dtype = pred.dtype;
    args.target_dtype = target.dtype;
    args.dpred_dtype = dpred.dtype;
    uint32_t op;
    if (qt_loss_one_block(rows, cols)) {
        QT_TRY(prog_append(p, KERNEL_MSE_SMALL, name, &op_act_one_block, &args, sizeof args,
                           &op));
        QT_TRY(op_mse_use_rows(p, op, pred, target, valid_rows, dpred, dpred_amax));
        return prog_use(p, op, offsetof(mse_args, stats), stats, PROG_WRITE);
    }
    QT_ASSERT(prog_ref_present(workspace));
    launch_shape shape = op_act_row_shape(rows);
    QT_TRY(prog_append(p, KERNEL_MSE_ROWS, name, &shape, &args, sizeof args, &op));
    QT_TRY(op_mse_use_rows(p, op, pred, target, valid_rows, dpred, dpred_amax));
    QT_TRY(prog_use(p, op, offsetof(mse_args, partials), workspace, PROG_WRITE));

    QT_TRY(prog_append(p, KERNEL_MSE_FINAL, name, &op_act_one_block, &args, sizeof args, &op));
    QT_TRY(prog_use_optional(p, op, offsetof(mse_args, valid_rows), valid_rows, 0, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(mse_args, partials), workspace, PROG_READ));
    return prog_use(p, op, offsetof(mse_args, stats), stats, PROG_WRITE);
}

// ---------------------------------------------------------------------------------------------
// Global gradient norm.

static uint32_t op_gnorm_blocks(uint64_t count) {
    uint64_t blocks = (count + QT_GNORM_BLOCK_ELEMS - 1) / QT_GNORM_BLOCK_ELEMS;
    QT_ASSERT(blocks <= 0x7FFFFFFFu);
    return blocks ? (uint32_t)blocks : 1u;
}

static uint64_t op_gnorm_partials(uint32_t regions, const uint64_t *counts) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < regions; i++) total += op_gnorm_blocks(counts[i]);
    return total;
}

uint64_t op_grad_norm_workspace_bytes(uint32_t regions, const uint64_t *counts) {
    return op_gnorm_partials(regions, counts) * 8;
}

// The norm's last op: its sources, partials, ticket and out, the begin's three regions and the
// table, and the targets of the zeroes.
_Static_assert(QT_GNORM_REGIONS + 7 + OP_OPTIM_ZEROES_MAX <= PROG_OP_REFS_MAX,
               "the norm's last op with the begin's regions");

// The begin's regions, as op_optim_begin declares them (its grad_norm is the norm's out).
static qt_status op_gnorm_begin_use(program *p, uint32_t op, const op_gnorm_begin *begin) {
    QT_ASSERT(begin->lr_row_count >= 1);
    QT_TRY(prog_use_span(p, op, offsetof(gnorm_args, begin_steps), begin->steps, 8,
                         PROG_READ_WRITE));
    QT_TRY(prog_use_span(p, op, offsetof(gnorm_args, begin_state), begin->state,
                         sizeof(optim_state), PROG_WRITE));
    QT_TRY(prog_use_span(p, op, offsetof(gnorm_args, begin_lr_rows), begin->lr_rows,
                         (uint64_t)begin->lr_row_count * sizeof(optim_lr_row), PROG_READ));
    if (!begin->zeroes) return QT_OK;
    return op_optim_zeroes_use(p, op, offsetof(gnorm_args, begin_zero), begin->zeroes);
}

qt_status op_grad_norm_part(program *p, const char *name, const op_gnorm_set *set,
                            uint32_t first, uint32_t count, bool fold) {
    QT_ASSERT(set->regions >= 1 && count >= 1 && first + count <= set->regions);
    QT_ASSERT(prog_ref_present(set->workspace) && prog_ref_present(set->ticket) &&
              prog_ref_present(set->out));
    uint64_t total = op_gnorm_partials(set->regions, set->counts);
    QT_ASSERT(total <= 0x7FFFFFFFu);
    // Region i's partials follow those of regions 0..i-1 whichever launch writes them: the fold
    // takes them in that order, so the norm's bits do not depend on how the regions are split.
    uint32_t base = (uint32_t)op_gnorm_partials(first, set->counts);
    const op_gnorm_begin *begin = set->begin;
    for (uint32_t at = first; at < first + count; at += QT_GNORM_REGIONS) {
        uint32_t left = first + count - at;
        uint32_t n = left < QT_GNORM_REGIONS ? left : QT_GNORM_REGIONS;
        bool last = fold && at + n == first + count;
        gnorm_args args = {0};
        args.regions = n;
        args.base = base;
        args.total = (uint32_t)total;
        args.clip = set->clip;
        args.begin_rows = last && begin ? begin->lr_row_count : 0;
        args.begin_zero_count = last && begin && begin->zeroes ? begin->zeroes->count : 0;
        uint32_t blocks = 0;
        for (uint32_t r = 0; r < n; r++) {
            QT_ASSERT(prog_ref_present(set->grads[at + r]));
            if (set->units && set->units[at + r]) args.units |= 1u << r;
            args.count[r] = set->counts[at + r];
            args.first_block[r] = blocks;
            blocks += op_gnorm_blocks(set->counts[at + r]);
        }
        launch_shape shape = {{blocks, 1, 1}, {QT_ACT_THREADS, 1, 1}, 0};
        uint32_t op;
        QT_TRY(prog_append(p, KERNEL_GNORM, name, &shape, &args, sizeof args, &op));
        // Partial sums alone, which only the later launches wait for, run beside the rest.
        if (!fold) prog_set_beside(p, op);
        for (uint32_t r = 0; r < n; r++) {
            uint64_t bytes = set->counts[at + r] * ((args.units >> r) & 1u ? 8u : 4u);
            QT_TRY(prog_use_span(p, op, (uint32_t)(offsetof(gnorm_args, src) + 8 * r),
                                 set->grads[at + r], bytes, PROG_READ));
        }
        // Earlier launches write their partials (each launch after the one before it, in
        // program order); the folding one also reads all of them.
        QT_TRY(prog_use_span(p, op, offsetof(gnorm_args, partials), set->workspace, total * 8,
                             last ? PROG_READ_WRITE : PROG_WRITE));
        if (last) {
            QT_TRY(prog_use_span(p, op, offsetof(gnorm_args, ticket), set->ticket, 4,
                                 PROG_READ_WRITE));
            QT_TRY(prog_use_span(p, op, offsetof(gnorm_args, out), set->out,
                                 sizeof(qt_gnorm_result), PROG_WRITE));
            if (begin) QT_TRY(op_gnorm_begin_use(p, op, begin));
        }
        base += blocks;
    }
    return QT_OK;
}

qt_status op_grad_norm(program *p, const char *name, uint32_t regions, const prog_ref *grads,
                       const uint64_t *counts, float clip, prog_ref workspace, prog_ref ticket,
                       prog_ref out, const op_gnorm_begin *begin) {
    op_gnorm_set set = {regions, grads, counts, clip, workspace, ticket, out, begin, NULL};
    return op_grad_norm_part(p, name, &set, 0, regions, true);
}
