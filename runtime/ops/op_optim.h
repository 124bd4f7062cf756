// op_optim: builders that append the fused AdamW optimizer (ptx/optim.cu) to a program, together
// with the requantization of each parameter's weight from its updated FP32 master
// (every format, every step, inside the captured graph).
//
// Owns nothing; each builder picks the launch shapes, fills the args structs and declares every
// region each op reads and writes. Device state and numerics: ptx/optim.h.
//
// One training step's optimizer part:
//
//   op_optim_begin        once: skip flag, lr of this step, step += 1 (unless skipped), and
//                         the updates' amax workspaces zeroed (op_optim_zeroes)
//   op_optim_adamw        per parameter, after it; ops by weight format (op_optim_adamw_multi
//                         runs the same ops for a list, the updates and the amax zeroing as
//                         multi-tensor launches, then the casts):
//
//   weight        ops (in order)                                       cast by
//   NONE          adamw                                                -
//   BF16          adamw (writes the BF16 copy)                         fused
//   FP8_DELAYED   adamw (codes rowwise + transposed, scale_inv,        fused
//                 atomic amax into the history's row 0 slot)
//   FP8_CURRENT   fp8_amax_zero, adamw (+ amax), op_fp8_cast_current   quant_fp8
//   MXFP8         adamw (writes the rowwise codes and scales), where   fused
//                 the weight has that copy alone, 1 x 32 blocks;
//                 else adamw, op_mxfp8_quantize                        quant_mxfp8
//   FP8_BLOCK     adamw, op_quant_block (1x128 or 128x128)             quant_block
//   NVFP4         fp8_amax_zero per global amax, adamw (+ amax into     quant_nvfp4
//                 both), op_nvfp4_quantize; with RHT: adamw,
//                 op_nvfp4_amax (post-RHT columnwise amax), quantize
//
// A stacked expert weight (`group`: members of an moe layer's experts, back to back) has one
// scale, amax and delayed-scaling slot per member, which a fused cast of the whole tensor cannot
// give: its update is the plain adamw, then the family's grouped cast from the new master
// (FP8_DELAYED: op_fp8_cast_delayed, FP8_CURRENT: op_fp8_quantize_current, NVFP4:
// op_nvfp4_amax and op_nvfp4_quantize, all with the group). MXFP8 and FP8 block scales are local
// to blocks that never straddle two members (model.c keeps member rows whole blocks), so their
// casts are the dense ones, which give the grouped casts' bits.
//
// Why two kernels for the other formats: per-tensor current scaling and NVFP4 need the amax of
// the whole new master before the first code is written, which one kernel cannot have without a
// grid-wide barrier. MXFP8 and FP8 block scales are local, so a fused cast is possible. MXFP8's
// rowwise 1 x 32 blocks lie in one row of the update's tile, so the update writes that copy
// (its cast after the update was one more FP32 read of the master and a launch a weight: about
// 80 us for a 4096 x 16384 weight on an H200). A columnwise copy and 2-D tiles need the
// families' 32- and 128-row tiles in the update kernel; for them (and FP8 block) the family's
// cast follows the update, which keeps one implementation of those casts. The zeroing op is the
// per-tensor FP8 family's qt_fp8_amax_zero (one slot); in a step of multi-tensor launches the
// step's begin zeroes every such amax instead (op_optim_zeroes), and the stacked weights' and
// RHT casts merge into arrays it zeroed (op_fp8_amax_merge, op_nvfp4_amax_merge).
//
// The weight is always the cast of its master: op_optim_quantize appends the same casts without
// the update (start-up, after the master is initialized; a delayed-scaling weight's amax goes to
// its history row 0 as with any cast), and a skipped step recasts an unchanged master into the
// same bytes (ptx/optim.h).
#ifndef QT_OP_OPTIM_H
#define QT_OP_OPTIM_H

#include "runtime/ops/op_quant_block.h"  // op_block_tensor, op_block_options
#include "runtime/ops/op_quant_fp8.h"    // op_fp8_output
#include "runtime/ops/op_quant_mxfp8.h"  // op_mxfp8_quantize_desc
#include "runtime/ops/op_quant_nvfp4.h"  // op_nvfp4_quant
#include "ptx/optim.h"
#include "runtime/program/program.h"

typedef enum optim_weight {
    OPTIM_WEIGHT_NONE,         // FP32 parameter: the master is the weight
    OPTIM_WEIGHT_BF16,
    OPTIM_WEIGHT_FP8_DELAYED,  // per-tensor FP8, delayed scaling
    OPTIM_WEIGHT_FP8_CURRENT,  // per-tensor FP8, current scaling
    OPTIM_WEIGHT_MXFP8,
    OPTIM_WEIGHT_FP8_BLOCK,
    OPTIM_WEIGHT_NVFP4,
} optim_weight;

// AdamW hyper-parameters of one parameter group.
typedef struct optim_hparams {
    float beta1, beta2, eps, weight_decay;
    float lr_scale;        // the group's lr = schedule lr * lr_scale
    bool bias_correction;
} optim_hparams;

// TE FusedAdam's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay, bias correction.
optim_hparams optim_hparams_default(void);

// One parameter. Only the fields of the chosen weight format are read; a prog_ref whose arena is
// NULL is absent.
typedef struct optim_param_desc {
    const char *name;
    uint32_t rows, cols;   // the weight's M x K (a vector is 1 x n)
    prog_ref grad;         // [rows][cols] of grad_dtype
    uint32_t grad_dtype;   // QT_DTYPE_BF16 | QT_DTYPE_F32
    prog_ref master, m, v; // f32 [rows][cols]
    optim_hparams hp;
    optim_weight weight;

    prog_ref bf16;         // BF16: u16 [rows][cols]

    // FP8_DELAYED and FP8_CURRENT: codes (rowwise [rows][cols], columnwise [cols][rows]; either
    // may be absent) and the shared scale_inv.
    op_fp8_output fp8;
    prog_ref fp8_scale;    // DELAYED: f32, read; CURRENT: f32, written (optional)
    prog_ref fp8_amax;     // DELAYED: the history's row 0 slot (optional); CURRENT: f32 workspace
    bool fp8_pow2;         // CURRENT: scales rounded down to powers of two
    float fp8_eps;         // CURRENT: amax epsilon

    // MXFP8: elem, tile_2d, rowwise, colwise (in, dtype, rows, cols are the master's; dense).
    op_mxfp8_quantize_desc mxfp8;

    // FP8_BLOCK: rows and cols equal the parameter's; dense. NULL-equivalent options: recipe's.
    op_block_tensor block;
    op_block_options block_options;

    // NVFP4: amax_row / amax_col are written by the update (f32 each); the rest as the family.
    op_nvfp4_quant nvfp4;

    // A stacked weight's members (count 0: one tensor); per-tensor quantities are [count].
    op_group group;
} optim_param_desc;

// The amaxes that a list's multi-tensor step merges into from +0: the workspaces its updates
// max the new masters into for a cast that follows (QT_OPTIM_FLAG_AMAX_ON_SKIP; FP8 current
// scaling's amax, NVFP4's global amax), and the amax arrays of the cast kernels that take their
// own pass over a new master (a stacked weight's per-member amaxes, NVFP4's pair with RHT). The
// step's begin zeroes them (op_optim_begin, or the norm's fold that does its work: op_grad_norm
// with a begin), in place of the zeroing launches of the updates and casts, when one op can
// declare them all: the table's entries [0, count) (the kernel finds the amaxes there,
// ptx/optim.h qt_optim_zero_amaxes) and every target, written.
#define OP_OPTIM_ZEROES_MAX 48
typedef struct op_optim_zeroes {
    prog_ref entries;       // optim_multi_entry [count]: op_optim_adamw_multi's table
    uint32_t count;         // the list's non-empty parameters
    uint32_t target_count;  // 1 ..= OP_OPTIM_ZEROES_MAX
    prog_ref targets[OP_OPTIM_ZEROES_MAX];
    uint64_t target_bytes[OP_OPTIM_ZEROES_MAX];  // f32 each, or f32 [members]
} op_optim_zeroes;

// The zeroes of op_optim_adamw_multi(list, count, table): true with *z filled, false when the
// list has no target or more than OP_OPTIM_ZEROES_MAX (its launches and casts then zero their
// own).
bool op_optim_zeroes_of(const optim_param_desc *list, uint32_t count, prog_ref table,
                        op_optim_zeroes *z);
// Declares z on op, whose args field `entries_field` takes the table's address: the table read,
// every target written (no args field: the kernel reads their addresses from the table).
qt_status op_optim_zeroes_use(program *p, uint32_t op, uint32_t entries_field,
                              const op_optim_zeroes *z);

// skip, lr and step of this step (steps: the persistent u64 of counted steps; state: this
// step's optim_state; grad_norm: optim_grad_norm or absent; lr_rows: optim_lr_row [row_count],
// sorted by start), and the amax targets of zeroes set to +0 (NULL: none).
qt_status op_optim_begin(program *p, const char *name, prog_ref steps, prog_ref state,
                         prog_ref grad_norm, prog_ref lr_rows, uint32_t row_count,
                         const op_optim_zeroes *zeroes);

// The AdamW update of one parameter and its requantization (table above). `state` is the
// optim_state that op_optim_begin wrote earlier in the same program.
qt_status op_optim_adamw(program *p, const optim_param_desc *d, prog_ref state);

// op_optim_adamw over a list of parameters, in order.
qt_status op_optim_adamw_list(program *p, const optim_param_desc *list, uint32_t count,
                              prog_ref state);

// The multi-tensor update of a list of parameters (ptx/optim.h): the same ops' results as
// op_optim_adamw_list, bit for bit, in few launches. The parameters' update args live in a
// device table of op_optim_table_bytes(count) bytes (a persistent region that no checkpoint
// holds: it holds addresses), which op_optim_describe writes once, in the init program (one
// small op per parameter, its addresses resolved as any op's args); every step then runs, per
// run of consecutive parameters whose regions fit one op (PROG_OP_REFS_MAX), one
// qt_optim_amax_zero (when a parameter's cast needs an amax workspace zeroed and the step's
// begin did not zero it: `zeroed` NULL) and one qt_optim_adamw_multi, and after them the casts
// of the formats that have one, parameter by parameter (with zeroing launches of their own
// where they take an amax pass, unless `zeroed`). zeroed: the zeroes of the list
// (op_optim_zeroes_of) that the step's begin took. The list is a plain array: a caller updates
// any subset of its parameters by passing that subset, to op_optim_describe and
// op_optim_adamw_multi alike.
// per_launch (the same in both calls; 0: as many as fit) caps the parameters of one launch and
// puts each launch's casts right after it, so that what waits for a parameter's update (a
// data-parallel step's broadcast of its weight) starts while the next launch runs. The bits do
// not depend on it. chain (optional; a prog_ref without an arena: none): a region that every
// launch declares it writes (no bytes are touched), so that a captured graph runs the launches
// one after another, each with the whole GPU, instead of as parallel branches that all finish
// together at the end: the first parameters' casts and broadcasts then overlap the later
// launches.
uint64_t op_optim_table_bytes(uint32_t count);
qt_status op_optim_describe(program *init, const optim_param_desc *list, uint32_t count,
                            prog_ref table, uint32_t per_launch);
qt_status op_optim_adamw_multi(program *p, const char *name, const optim_param_desc *list,
                               uint32_t count, prog_ref state, prog_ref table,
                               uint32_t per_launch, prog_ref chain,
                               const op_optim_zeroes *zeroed);

// The weight's quantization from its master as it is (no update, no state): start-up, and any
// time the master is written from outside (checkpoint load).
qt_status op_optim_quantize(program *p, const optim_param_desc *d);

#endif  // QT_OP_OPTIM_H
