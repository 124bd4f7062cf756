// op_quant_fp8: builders that append the per-tensor FP8 kernels (ptx/quant_fp8.cu) to a program:
// amax, fused cast + transpose with delayed or current scaling, the delayed-scaling update, and
// dequantize.
//
// Owns nothing; each builder picks the launch shape, fills the args struct and declares every
// region the op reads and writes. Optional regions are given as OP_FP8_NONE.
//
// Delayed scaling, per step:  cast (reads scale[j], atomically maxes |x| into history[0][j],
//                             writes scale_inv[j]) ... then op_fp8_delayed_update (roll, scale)
//                             of one state, or op_fp8_delayed_states for all of a model's
//                             states with the snapshots a step's record needs.
// Current scaling:            op_fp8_quantize_current = zero amax, amax kernel, cast whose blocks
//                             each derive the scale from the amax (qt_codec.h's scale_from_amax);
//                             in a step, whose first op zeroes its amax slots: op_fp8_amax_merge
//                             and op_fp8_cast_current.
// Grouped tensors: scale, scale_inv and amax are arrays of n = group.count members (1 if dense).
#ifndef QT_OP_QUANT_FP8_H
#define QT_OP_QUANT_FP8_H

#include "runtime/ops/op_quant_group.h"  // op_group
#include "runtime/program/program.h"
#include "ptx/quant_fp8.h"

#define OP_FP8_NONE ((prog_ref){0})

// A high-precision M x K tensor: the input of a cast, or the output of a dequantize.
typedef struct op_fp8_input {
    prog_ref x;      // (rows, cols) bf16 | f32
    uint32_t dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t rows;   // a grouped tensor's row capacity
    uint32_t cols;
    op_group group;  // count 0 = dense
} op_fp8_input;

// The quantized side.
typedef struct op_fp8_output {
    uint32_t fp8;        // QT_FP8_E4M3 | QT_FP8_E5M2
    prog_ref rowwise;    // u8 (rows, cols), or OP_FP8_NONE
    prog_ref colwise;    // u8 (cols, rows), the byte transpose, or OP_FP8_NONE
    prog_ref scale_inv;  // f32 [n], shared by both
} op_fp8_output;

// One op: amax[0..slots) = +0, before ops that merge maxima into them.
qt_status op_fp8_amax_zero(program *p, const char *name, prog_ref amax, uint32_t slots);

// Two ops: amax[0..n) = 0, then amax[i] = max |x| over member i's valid rows.
qt_status op_fp8_amax(program *p, const char *name, const op_fp8_input *in, prog_ref amax);

// The second of them alone, amax[i] = max(amax[i], max |x| over member i's valid rows), for
// slots that are +0 already: a step's amax slots, which the step's first op zeroes
// (op_sched_zero).
qt_status op_fp8_amax_merge(program *p, const char *name, const op_fp8_input *in,
                            prog_ref amax);

// Delayed scaling cast: q = satFP8(RN(x * scale[i])). amax_slots (f32 [n], history row 0 of the
// members' slots) receives the atomic max of |x| unless OP_FP8_NONE.
qt_status op_fp8_cast_delayed(program *p, const char *name, const op_fp8_input *in,
                              const op_fp8_output *out, prog_ref scale, prog_ref amax_slots);

// Current scaling cast from an amax computed earlier in the program (op_fp8_amax): every block
// derives scale = scale_from_amax(amax[i], qmax, pow2, eps, FLT_MAX); `scale` receives it unless
// OP_FP8_NONE.
qt_status op_fp8_cast_current(program *p, const char *name, const op_fp8_input *in,
                              const op_fp8_output *out, prog_ref amax, prog_ref scale, bool pow2,
                              float eps);

// op_fp8_amax followed by op_fp8_cast_current: three ops.
qt_status op_fp8_quantize_current(program *p, const char *name, const op_fp8_input *in,
                                  const op_fp8_output *out, prog_ref amax, prog_ref scale,
                                  bool pow2, float eps);

// Delayed-scaling update of `slots` slots of one state (history f32 [history_len][slots],
// scale f32 [slots]); `reduced` (f32 [slots]) holds all-reduced amaxes or is OP_FP8_NONE.
// qmax is the state's format's (fp8), scaled by 2^-margin.
qt_status op_fp8_delayed_update(program *p, const char *name, prog_ref history, prog_ref scale,
                                prog_ref reduced, uint32_t slots, uint32_t history_len,
                                uint32_t algo, uint32_t fp8, int margin);

// One delayed-scaling state as op_fp8_delayed_states sees it.
typedef struct op_fp8_delayed_state {
    prog_ref history;      // f32 [history_len][slots]; not read when the op only snapshots
    prog_ref scale;        // f32 [slots]
    uint32_t slots, history_len;
    uint32_t algo;         // QT_FP8_AMAX_ALGO_*
    uint32_t fp8;          // QT_FP8_E4M3 | QT_FP8_E5M2: qmax, scaled by 2^-margin
    int margin;
    uint32_t first;        // snapshot entry of slot 0
} op_fp8_delayed_state;

// What the end of a step does with the states: update (training) or only snapshot the scales.
typedef struct op_fp8_delayed_end {
    bool update;
    prog_ref amax_out;   // f32 [entries], or OP_FP8_NONE; update only
    prog_ref scale_out;  // f32 [entries], or OP_FP8_NONE
    prog_ref skip;       // u32, update only: the optimizer's skip flag of this step (optim_state),
                         // or OP_FP8_NONE: never skipped
    uint32_t entries;
} op_fp8_delayed_end;

// The end of a step for `count` states (ptx/quant_fp8.h, qt_fp8_delayed_states), one op per
// QT_FP8_STATES_PER_OP states. update (training): amax_out gets each slot's amax before the roll,
// then every state rolls and updates as op_fp8_delayed_update does (a skipped step: only drops
// its amaxes, so the state stays as it was); scale_out gets the scales after it. Without update
// (eval, infer) only scale_out is written. Every slot's entry must lie below `entries`.
qt_status op_fp8_delayed_states(program *p, const char *name, const op_fp8_delayed_state *states,
                                uint32_t count, const op_fp8_delayed_end *end);

// An optional f32 grid of block scales, [rows][cols], for op_fp8_transpose.
typedef struct op_fp8_scale_grid {
    prog_ref scales, out;  // scales OP_REF_NONE: no grid
    uint32_t rows, cols;
} op_fp8_scale_grid;

// out [cols][rows] = the byte transpose of codes [rows][cols], and the grid's out its scales
// transposed: a per-tensor FP8 tensor's columnwise copy from its rowwise one (one scale serves
// both) or an FP8 block-scaled one's with 128 x 128 tiles (the grid: its tile scales); the bytes
// equal the cast's columnwise output.
qt_status op_fp8_transpose(program *p, const char *name, uint32_t rows, uint32_t cols,
                           prog_ref codes, prog_ref out, const op_fp8_scale_grid *grid);

// hp->x = codes * scale_inv, in the [M][K] orientation of hp; `colwise` picks the transposed
// codes. Padding rows of a grouped tensor are written as zeros.
qt_status op_fp8_dequantize(program *p, const char *name, const op_fp8_input *hp,
                            const op_fp8_output *codes, bool colwise);

// An activation's input, whose output y a cast takes without y being stored
// (ptx/quant_fp8.h, fp8_act_cast_args): y = act(x) forward, dy * act'(x) backward, in BF16.
typedef struct op_fp8_act_input {
    uint32_t act;  // QT_ACT_GELU | QT_ACT_SILU
    bool backward;
    prog_ref x;    // BF16 (rows, cols), the activation's input
    prog_ref dy;   // backward: BF16 (rows, cols), the gradient at its output; else OP_FP8_NONE
    uint32_t rows, cols;  // cols % 8 == 0
    // Forward, optional (OP_FP8_NONE: none): x's maximum slot, which the GEMM that wrote x fills
    // (op_gemm_desc.d_max); op_fp8_act_amax_merge then takes the amax from it where it can.
    prog_ref x_max;
} op_fp8_act_input;

// amax = max(amax, max |y|) (NaN skipped) for a slot that is +0 already (a step's amax slot):
// what op_fp8_amax_merge would take from a stored y, without reading x where in->x_max gives it
// (fp8_act_cast_args.x_max). One op.
qt_status op_fp8_act_amax_merge(program *p, const char *name, const op_fp8_act_input *in,
                                prog_ref amax);

// y's codes with delayed scaling: op_fp8_cast_delayed's bits for the stored y. One op.
qt_status op_fp8_act_cast_delayed(program *p, const char *name, const op_fp8_act_input *in,
                                  const op_fp8_output *out, prog_ref scale, prog_ref amax_slots);

// y's codes with current scaling from y's amax (op_fp8_act_amax_merge): op_fp8_cast_current's
// bits for the stored y. One op.
qt_status op_fp8_act_cast_current(program *p, const char *name, const op_fp8_act_input *in,
                                  const op_fp8_output *out, prog_ref amax, bool pow2, float eps);

#endif  // QT_OP_QUANT_FP8_H
