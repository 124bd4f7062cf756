// model: a parsed recipe's model turned into quantizers, parameters, arena regions and the
// programs of a run: init, train, eval, infer, checksum.
//
// Owns the model table (layers' linears, quantizers, parameters, delayed-scaling states, the
// planning notes) inside the caller's `model` struct, from model_plan for as long as the run
// lives. The regions it reserves belong to the caller's arenas; the programs to the caller.
// Callers: runtime/run/run.c, once, at start-up, in the arenas' PLAN phase. No allocation.
//
// Planning (model_plan), in order:
//
//   1. every role (linear.{input,weight,grad_output}@NAME, and per moe layer NAME its router
//      router.*@NAME.router and its experts grouped_linear.*@NAME.fc1, NAME.fc2) resolved
//      through the recipe's rules (recipes/rules.h); an moe layer is three GEMMs (model_moe)
//   2. usages fixed for the whole run as the union over the modes of the schedule table:
//      a weight has rowwise data, plus columnwise data when any train row
//      exists (the optimizer rewrites both every step); activations and gradients of the train
//      program have both directions, those of eval and infer programs rowwise only
//   3. the model input's inner dimension padded with zero columns when the first layer's
//      formats cannot take it (16-byte rows of codes, whole scaling blocks along K), e.g.
//      784 -> 800 for mxfp8 and nvfp4, 896 for fp8 block scaling; the weight's padding columns
//      start at zero and stay zero (zero gradient, so AdamW leaves them at zero)
//   4. per GEMM: the native kernel when both operands share a GEMM format that it takes,
//      else both operands are dequantized to BF16 and meet in the BF16 GEMM ("mixed")
//   5. NVFP4 random Hadamard transform: the wgrad GEMM needs it on both of its operands or on
//      neither, so a layer whose input and grad_output disagree (or whose batch is not a
//      multiple of 16) gets none
//   6. delayed-scaling states: quantizers with equal (history, algo, format, margin) share one
//      state, history f32 [history][slots] and scale f32 [slots] (an moe layer's expert
//      quantizers take one slot per expert, consecutive); their order is the trace's quantizer
//      order
//   7. persistent regions (weights, master, optimizer, scaling) in the device arena
//
// Programs (model_build_*), one per mode, each a complete step:
//
//   train  stage copy (and the step's amax slots zeroed, model_amax_slots) -> forward -> loss
//          -> backward (dgrad, wgrad, bias grad) -> grad norm -> optimizer begin (and the
//          optimizer's amaxes zeroed, op_optim_zeroes) -> AdamW + requantization per parameter
//          -> delayed-scaling snapshot and update -> record
//   eval   stage copy -> forward -> loss and accuracy -> record (no state is written: delayed
//          casts read the scale and record no amax)
//   infer  stage copy -> forward -> outputs to the pinned host slot -> record
//   init   master fill (normal, std 1/sqrt(fan_in); biases 0; RMSNorm gains 1), delayed states
//          scale 1, history 0, then every weight quantized from its master
//   checksum  a hash of every persistent weight, master, optimizer and scaling region, folded
//          into the last record
//
// Tensors between layers are BF16 ([batch][width], row-major); the model input (the batch that
// the stage op writes from the step's device slot) and every gradient of a parameter are FP32.
#ifndef QT_MODEL_H
#define QT_MODEL_H

#include <stdio.h>  // FILE

#include "arena/arena.h"
#include "runtime/io/data.h"  // data_slot_layout
#include "runtime/ops/op_act.h"  // op_gnorm_set, the gradient norm the train program's builder
                                 // spreads over the backward pass
#include "runtime/ops/op_moe.h"  // op_moe_routing, which the program builders keep per moe layer
#include "runtime/ops/op_optim.h"  // optim_param_desc, the list the train program's builder keeps
// op_fp8_delayed_state, which the train program's builder keeps
#include "runtime/ops/op_quant_fp8.h"
#include "runtime/parallel/parallel.h"  // dp_comm: the ranks of a data-parallel run
#include "runtime/program/program.h"
#include "recipes/recipe.h"  // recipe, recipe_layer
#include "recipes/rules.h"  // qt_quantizer, qt_role

// The model's tables hold the largest model the parser accepts (recipes/recipe.h: layers,
// roles, widths), so every recipe that parses fits them and planning has no limit of its own.
#define MODEL_LINEARS_MAX (3 * RECIPE_LAYERS_MAX)  // an moe layer has three: router, fc1, fc2
#define MODEL_MOES_MAX RECIPE_LAYERS_MAX
#define MODEL_QUANTIZERS_MAX RECIPE_ROLES_MAX      // input, weight, grad_output per linear
#define MODEL_PARAMS_MAX (3 * RECIPE_LAYERS_MAX)   // a linear's weight and bias, a gain, an moe
                                                   // layer's three weights
#define MODEL_STATES_MAX MODEL_QUANTIZERS_MAX      // a state has at least one quantizer
#define MODEL_NOTES_MAX 64            // the plan report's notes; more are counted, not kept
#define MODEL_NOTE_BYTES 200
#define MODEL_NAME_MAX 48
#define MODEL_RING_LEN 4  // records in the pinned ring (the host reads 2 steps behind)
// Batch staging (runtime/schedule/schedule.h proves the counts): step s's batch is filled into
// pinned host slot s % MODEL_HOST_SLOTS one step ahead, copied by the copy engine into device slot
// s % MODEL_DEVICE_SLOTS beside step s - 1, and the step's first op turns that device slot into
// the program's FP32 batch. Infer outputs go to pinned host slot s % MODEL_OUTPUT_SLOTS.
#define MODEL_HOST_SLOTS 3
#define MODEL_DEVICE_SLOTS 2
#define MODEL_OUTPUT_SLOTS 2

typedef enum model_mode {
    MODEL_MODE_TRAIN,
    MODEL_MODE_EVAL,
    MODEL_MODE_INFER,
    MODEL_MODE_COUNT
} model_mode;

const char *model_mode_name(model_mode mode);

// A high-precision tensor [rows][cols].
typedef struct model_tensor {
    prog_ref ref;
    uint32_t dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t rows, cols;
    prog_ref amax;   // f32 [1] holding max |x| when the producer computed it (else absent);
                     // a grouped tensor's (an moe layer's permuted rows): f32 [members], each
                     // member's over its valid rows
} model_tensor;

// The stored copies of one quantized tensor (layouts: ptx/quant.h). Which fields are used
// depends on the scheme; a direction that is off has no regions.
typedef struct model_qstore {
    bool rowwise, colwise;
    // MXFP8: row_data (col_data) holds the direction's BF16 values [rows][cols] instead of its
    // codes, and it has no scales: the quantize decoded each code with its scale, the bits a
    // dequantize to BF16 would give (QT_MXFP8_FLAG_ROW_VALUES, _COL_VALUES). Only for a
    // direction that BF16 GEMMs alone read (model_gemm_path MIXED).
    bool row_values, col_values;
    prog_ref row_data, row_scale;  // codes and block scales of the rowwise copy
    prog_ref col_data, col_scale;  // the same of the columnwise copy
    prog_ref scale_inv;            // per-tensor fp8: f32 [1], both copies
    prog_ref amax_row, amax_col;   // nvfp4: global amaxes (the same ref without RHT);
                                   // per-tensor current: amax_row is the amax workspace
    model_tensor bf16;             // bf16 scheme: the tensor itself serves both directions
} model_qstore;

// model_qstore_reserve's `values`: the directions stored as BF16 values (MXFP8).
#define MODEL_QSTORE_ROW_VALUES 1u
#define MODEL_QSTORE_COL_VALUES 2u

typedef enum model_gemm_path {
    MODEL_GEMM_NATIVE,  // the kernel of the operands' common format
    MODEL_GEMM_MIXED    // both operands dequantized to BF16, BF16 GEMM
} model_gemm_path;

typedef enum model_gemm { MODEL_FPROP, MODEL_DGRAD, MODEL_WGRAD, MODEL_GEMM_COUNT } model_gemm;

typedef struct model_quantizer {
    qt_role role;
    qt_quantizer q;
    uint32_t linear;        // index into model.linears
    bool rht;               // nvfp4: the columnwise copy is RHT(x^T) (after step 5)
    int32_t state;          // delayed: index into model.states, else -1
    uint32_t slot;          // delayed: (first) slot within the state; grouped: one per member
    uint32_t trace_index;   // delayed: position in the trace's quantizer list
} model_quantizer;

typedef struct model_state {
    uint32_t history_len;
    uint32_t algo;          // QT_FP8_AMAX_ALGO_*
    uint32_t fp8;           // QT_FP8_E4M3 | QT_FP8_E5M2
    uint32_t margin;
    uint32_t slots;
    uint32_t trace_first;   // trace index of slot 0
    arena_handle history;   // f32 [history_len][slots]
    arena_handle scale;     // f32 [slots]
} model_state;

// A region a rank does not hold (a data-parallel run's masters and moments of other ranks).
#define MODEL_REGION_NONE UINT32_MAX

typedef enum model_init { MODEL_INIT_NORMAL, MODEL_INIT_ZERO, MODEL_INIT_ONE } model_init;

// A quantized weight's columnwise copy, the dgrad GEMM's operand (model.c decides).
typedef enum model_weight_t {
    MODEL_WEIGHT_T_NONE,      // no train step, or no dgrad (the model's first layer): no copy
    MODEL_WEIGHT_T_STORED,    // persistent, written with the rowwise copy (init, optimizer)
    MODEL_WEIGHT_T_PER_STEP   // per-tensor FP8, FP8 block 128 x 128: transient regions of the
                              // train program, the rowwise codes (and tile scales) transposed
                              // (op_fp8_transpose) before the dgrad
} model_weight_t;

typedef struct model_param {
    char name[MODEL_NAME_MAX];  // "fc1.weight", "fc1.bias", "rmsnorm1.gamma"
    uint32_t layer;             // its layer, index into recipe.model.layers (ascending with
                                // the parameter's index)
    uint32_t rows, cols;        // stored shape (cols include the padding columns)
    uint32_t cols_valid;        // columns that are filled at init; the rest stay zero
    model_init init;
    float init_std;             // NORMAL: 1/sqrt(fan_in)
    arena_handle master, m, v;  // f32 [rows][cols]; MODEL_REGION_NONE on a rank that does
                                // not hold them (data parallelism: model_param_master_here)
    arena_handle grad;          // f32 [rows][cols], transient in the train program
    int32_t quantizer;          // the weight's quantizer, or -1: the master is the parameter
    model_qstore weight;        // quantized copies (quantizer >= 0)
    model_weight_t weight_t;    // where the columnwise copy comes from (quantizer >= 0)
    // Stacked expert weights: `members` members of rows / members rows each, quantized as one
    // grouped tensor (per-member scales, amaxes and delayed slots); group_offsets u32
    // [members + 1] and group_dims u32 [members] are written once by the init program.
    uint32_t members;           // 0: a plain parameter
    arena_handle group_offsets, group_dims;
} model_param;

// A mixture-of-experts layer (ptx/moe.h draws its routing): three GEMMs, the router (dense,
// experts outputs) and the experts' fc1 and fc2 (grouped by expert), and the permuted tensors'
// shape. Every member count lives on the device; only capacity, a bound, is known here.
typedef struct model_moe {
    uint32_t layer;              // index into recipe.model.layers
    uint32_t router, fc1, fc2;   // indices into model.linears
    uint32_t experts, topk;
    uint32_t width;              // the layer's input and output width
    uint32_t hidden;             // per expert, after the activation
    recipe_layer_kind act;       // RELU, GELU, SILU or SWIGLU (fc1 then has 2 hidden outputs)
    uint32_t row_align;          // member padding of the permuted tensors: the largest
                                 // row_align of their formats
    uint32_t capacity;           // rows of the permuted tensors (op_moe_capacity)
    float aux_scale;             // the load-balancing loss's factor (op_moe_aux_scale)
    // The train program's first_dims (u32 [experts]: each expert's tokens in the step), set by
    // model_build_train; model_keep_expert_loads keeps its bytes from the routing's scan to the
    // end of every program, so that after a run they hold the last train step's counts.
    bool has_loads;
    arena_handle loads;
} model_moe;

typedef struct model_linear {
    uint32_t layer;          // index into recipe.model.layers
    uint32_t in, in_padded;  // K before and after padding
    uint32_t out;            // N (of one member for an moe layer's experts)
    uint32_t members;        // 0: dense; an moe layer's fc1, fc2: its experts (grouped GEMMs)
    uint32_t moe;            // index into model.moes, or UINT32_MAX
    bool bias;
    uint32_t q_input, q_weight, q_grad;  // indices into model.quantizers
    uint32_t weight, bias_param;         // indices into model.params (bias_param if bias)
    bool needs_dx;           // some layer before it has parameters
    model_gemm_path path[MODEL_GEMM_COUNT];
} model_linear;

// The persistent plumbing of the step programs, reserved by model_plan.
// A dataset the device keeps (recipe `resident = on`, runtime/io/data.h): its inputs and targets
// as data_load laid them out, the first `bytes` of the dataset region, uploaded at bind.
typedef struct model_dataset {
    bool present;
    arena_handle region;        // device, persistent, "data.train" or "data.eval"
    uint64_t samples;
    uint64_t targets_offset;    // data_info.targets_offset
    uint64_t bytes;             // targets_offset + targets_bytes
} model_dataset;

typedef struct model_io {
    data_slot_layout slot;       // staging slot layout (data.h): inputs as the dataset has them
    data_slot_layout batch;      // the device batch the slot is staged into: FP32 inputs
    arena_handle staging;        // host: MODEL_HOST_SLOTS slots, the host fills them
    arena_handle staged;         // device: MODEL_DEVICE_SLOTS slots, the copy engine fills them
    arena_handle ring;           // host: MODEL_RING_LEN ring records (ptx/trace_record.h)
    arena_handle outputs;        // host: MODEL_OUTPUT_SLOTS slots of infer outputs (bf16)
    uint64_t outputs_bytes;      // one slot: [batch x world][outputs] bf16 (the whole batch's,
                                 // every rank's share gathered), rounded up to 16
    arena_handle counter;        // device: u64 step counter (ptx/sched_ops.h)
    arena_handle optim_steps;    // device: u64, the counted train steps (ptx/optim.h)
    arena_handle lr_rows;        // device: optim_lr_row [lr_row_count]
    arena_handle gnorm_ticket;   // device: u32 of the gradient norm's fold (op_grad_norm)
    arena_handle optim_table;    // device: the multi-tensor optimizer's table (op_optim.h),
                                 // written by the init program; holds addresses, so no
                                 // checkpoint holds it
    // device: u32 [2] of the staging ops' amax fold (op_sched_amax), reserved by the first
    // program whose staging op takes its inputs' amax; zero from bind on and between launches,
    // so no checkpoint holds it
    bool has_stage_fold;
    arena_handle stage_fold;
    uint32_t lr_row_count;
    // Resident datasets (DATA_DATASET_TRAIN, DATA_DATASET_EVAL); slot.resident says whether any.
    model_dataset datasets[DATA_DATASETS];
} model_io;

// Where MXFP8 and NVFP4 GEMMs run (the bits are the same either way: model.c,
// model_emulated_copies).
typedef enum model_emulated_gemm {
    MODEL_EMULATED_AUTO,    // BF16 copies for MXFP8 dgrad and wgrad and for large GEMMs
    MODEL_EMULATED_KERNEL,  // always the format's kernels (decode inside the GEMM)
    MODEL_EMULATED_COPIES   // always BF16 copies and a BF16 GEMM
} model_emulated_gemm;

// A fault planted in a gradient (tests, soaks): at global step `step` the train program writes
// `bits` into element 0 of the weight gradient of linear layer `layer` (NULL: the first).
typedef struct model_inject {
    bool on;
    uint64_t step;
    const char *layer;
    uint32_t bits;
} model_inject;

typedef struct model_options {
    uint32_t batch;
    model_emulated_gemm emulated_gemm;
    uint64_t seed;                   // initialization and stochastic rounding
    bool modes[MODEL_MODE_COUNT];    // modes in the schedule table
    uint32_t lr_row_count;           // >= 1
    const data_info *data;           // the training set (widths)
    const data_info *eval_data;      // the eval set, or NULL
    bool resident;                   // keep the datasets on the device (data.h)
    model_inject inject;
    // Data parallelism (runtime/parallel/parallel.h): this rank's communicator (NULL: one rank);
    // batch is then this rank's share of the global batch.
    const dp_comm *comm;
    // Every per-tensor amax of a step from a pass of its own over the stored tensor, none taken
    // by the tensor's producer as it writes (model_build.c, mb_producer_serves), and every
    // activation's output stored before its cast (no act_cast_elems): the same bits with more
    // launches, for tests that compare the two.
    bool amax_passes;
    // The gradient norm's groups during the backward pass (model_build.c, MB_NORM_GROUP_ELEMS):
    // 0, the usual size; another count, groups of at least that many elements; UINT64_MAX, no
    // groups (the norm in one pass after the backward pass). The same bits every way, for tests
    // that compare them.
    uint64_t norm_group_elems;
    // The gradient norm reads every gradient's elements, none through its wgrad GEMM's norm
    // units (model_build.c, mb_grad_units): other bits (another order of the sums), for tests
    // that compare a dense layer with one the GEMM cannot give units for.
    bool norm_elements;
    // An moe layer's experts start at their formats' own row alignment, never on 128-row lines
    // (model.c, model_moe_line_align): the same bits, for tests that compare the two.
    bool moe_own_align;
    // Activations whose output only a per-tensor FP8 cast reads, and that cast, in one pass
    // (model_build.c, mb_act_casts): 0, for activations of MB_ACT_CAST_ELEMS_MIN elements and
    // more; another count, from that many; UINT64_MAX, never. The same bits every way, for tests
    // that compare them on small models.
    uint64_t act_cast_elems;
    // Several ranks: each rank updates the parameters it owns largest first (ties by index), not
    // in parameter order, and the weights' broadcast groups follow the order in which the ranks'
    // updates end (model_build.c, mb_update_order): the same bits, another schedule. Ignored on
    // one rank.
    bool largest_first;
} model_options;

// The tensors of one moe layer's forward pass that its backward pass reads.
typedef struct model_build_moe {
    op_moe_routing routing;  // probs, choices, gates, the permutation and its member counts
    model_tensor xp;         // the permuted input [capacity][width] (the input's dtype)
    model_tensor h;          // fc1's output [capacity][fc1 outputs], bf16
    model_tensor yp;         // fc2's output [capacity][width], bf16
} model_build_moe;

// A step's amax slots: the per-tensor amaxes that the step's producers merge maxima into with
// atomics (current scaling's amax before its cast, the one a producer takes for the
// current-scaling cast after it, NVFP4's global amaxes of activations and gradients), each a
// part of one region of the program, "<mode>.step#amax" ('#' is never part of a recipe's
// names), reserved as the builder meets them. The step's first op zeroes the whole region
// (op_sched_zero), in place of a zeroing launch per slot.
typedef struct model_amax_slots {
    arena *arena;
    const char *mode;     // the program's: the region's name prefix
    bool reserved;        // the region exists (a program without slots has none)
    arena_handle region;
} model_amax_slots;

// What one program's builder knows while it appends ops (runtime/model/model_build.c), about 120
// KiB. It lives in the model, not on the stack or in a static, so that models never share it.
typedef struct model_builder {
    struct model *m;
    program *p;
    model_mode mode;
    bool train;
    model_tensor input;     // the batch's model input, f32 [batch][stride]
    prog_ref targets;       // i32 labels [batch] or f32 targets [batch][outputs]
    prog_ref rows_valid;    // u32 (the staging header)
    model_tensor acts[RECIPE_LAYERS_MAX + 1];  // acts[i]: input of layer i; acts[n]: output
    model_qstore xq[MODEL_LINEARS_MAX];        // quantized inputs of the linears
    // Output gradients' copies that an activation's cast made before the backward pass of the
    // linear that reads them was built (model_build.c, mb_act_casts).
    model_qstore dyq[MODEL_LINEARS_MAX];
    model_build_moe moes[MODEL_MOES_MAX];
    prog_ref inv_rms[RECIPE_LAYERS_MAX];
    prog_ref stats;         // qt_loss_stats
    model_tensor dlogits;   // train: gradient of the output
    prog_ref gnorm;         // train: qt_gnorm_result
    prog_ref optim;         // train: this step's optim_state
    prog_ref snap_amax, snap_scale;  // f32 [delayed_slots]; the record copies delayed_count
    prog_ref grads[MODEL_PARAMS_MAX];        // the optimizer's gradients, and their elements
    uint64_t grad_counts[MODEL_PARAMS_MAX];
    // The gradient norm's regions (model_build.c, mb_grad_list): a gradient's elements, or the
    // norm units (ptx/gemm.h) that its wgrad GEMM writes with it, and how many.
    prog_ref norm_srcs[MODEL_PARAMS_MAX];
    uint64_t norm_counts[MODEL_PARAMS_MAX];
    bool norm_units[MODEL_PARAMS_MAX];
    optim_param_desc optim_list[MODEL_PARAMS_MAX];  // the parameters the optimizer updates
    uint32_t optim_updated;                         // entries of optim_list
    op_optim_zeroes optim_zeroes;  // their amax workspaces, which the step's begin zeroes
    // The gradient norm read during the backward pass (model_build.c, mb_norm_during_backward;
    // with several ranks, over the sums this rank owns, mb_dp_norm_begin): its set, the begin its
    // fold does, and, on one rank, the parameters whose gradients it has not read yet (those
    // below norm_left).
    op_gnorm_set norm;
    op_gnorm_begin norm_begin;
    uint32_t norm_left;
    prog_ref dp_order;      // data parallelism: the region every collective op writes
    // Data parallelism, train: the norm's regions, the gradients this rank owns in parameter
    // order, each read right after its reduction; the parameters not reduced yet (those below
    // reduce_left) and the owned ones among them (owned_left).
    prog_ref owned_grads[MODEL_PARAMS_MAX];
    uint64_t owned_counts[MODEL_PARAMS_MAX];
    bool owned_units[MODEL_PARAMS_MAX];
    uint32_t reduce_left, owned_left;
    // Data parallelism, train: this rank's loss statistics (qt_loss_stats), gathered with the
    // gradient norm after the backward pass (mb_optimizer) rather than right after the loss,
    // where the collective's wait for every rank held up the backward pass.
    prog_ref dp_loss_local;
    model_amax_slots amax_slots;  // train, eval, infer: the step's amax slots
    uint32_t stage_op;      // train, eval, infer: the step's first op, which zeroes them
    op_fp8_delayed_state states[MODEL_STATES_MAX];  // the end of step's delayed-scaling states
} model_builder;

typedef struct model {
    const recipe *recipe;
    arena *dev, *host;
    uint32_t batch;
    uint64_t seed;
    model_emulated_gemm emulated_gemm;
    bool amax_passes;             // model_options.amax_passes
    uint64_t norm_group_elems;    // model_options.norm_group_elems
    bool norm_elements;           // model_options.norm_elements
    bool moe_own_align;           // model_options.moe_own_align
    uint64_t act_cast_elems;      // model_options.act_cast_elems
    bool largest_first;           // model_options.largest_first, with several ranks
    bool modes[MODEL_MODE_COUNT];
    bool classification;          // softmax_xent (else mse)
    uint32_t input_features;      // the dataset's
    uint32_t input_stride;        // padded width of the model input (>= input_features)
    uint32_t outputs;
    uint32_t first_param_layer;   // backward stops after this layer
    uint32_t layer_linear[RECIPE_LAYERS_MAX];  // linear index of a layer (an moe layer: its
                                               // router; fc1 and fc2 follow), or UINT32_MAX
    uint32_t layer_param[RECIPE_LAYERS_MAX];   // rmsnorm: its gamma's param index
    uint32_t layer_moe[RECIPE_LAYERS_MAX];     // moe: its index into moes, or UINT32_MAX
    // An activation whose output train steps make again in backward (`recompute`, taking
    // effect: the linear after it keeps its input as BF16, that very output, and a layer below
    // has parameters; model.c's model_plan_recompute): the linear's wgrad reads the copy made
    // just before it, and the forward's output dies with its fprop.
    bool recompute[RECIPE_LAYERS_MAX];
    uint32_t linear_count;
    model_linear linears[MODEL_LINEARS_MAX];
    uint32_t moe_count;
    model_moe moes[MODEL_MOES_MAX];
    uint32_t quantizer_count;
    model_quantizer quantizers[MODEL_QUANTIZERS_MAX];
    uint32_t param_count;
    model_param params[MODEL_PARAMS_MAX];
    uint32_t state_count;
    model_state states[MODEL_STATES_MAX];
    uint32_t delayed_slots;       // delayed-scaling slots: one per quantizer, one per member of
                                  // an moe layer's grouped quantizers (experts' tensors)
    uint32_t delayed_count;       // the first slots, which the trace records (at most
                                  // QT_TRACE_QUANTIZERS_MAX)
    model_io io;
    // Data parallelism: the rank, the world, the communicator the collective ops name, and each
    // parameter's owner (dp_partition; all 0 with one rank).
    uint32_t rank, world;
    const dp_comm *comm;
    uint32_t param_owner[MODEL_PARAMS_MAX];
    model_inject inject;
    uint32_t inject_param;        // with inject.on: the parameter whose gradient gets the fault
    uint32_t note_count;          // planning decisions for `qtrain plan`
    uint32_t notes_dropped;       // beyond MODEL_NOTES_MAX (the report says how many)
    char notes[MODEL_NOTES_MAX][MODEL_NOTE_BYTES];
    model_builder builder;        // model_build_*'s working state
} model;

// Whether a checkpoint keeps persistent device region h (one with bytes): every one but the
// batch slots (the inputs of steps already done; the loop stages every step's batch before the
// step reads it), the staging ops' amax fold (zero between steps) and the optimizer's table
// (this process's addresses, which the init program writes at every start).
bool model_region_saved(const model *m, arena_handle h);

// Plans the model of r into the two arenas (both in PLAN, or both counting: the pass that
// sizes their tables). Fails (QT_ERR_INPUT, naming the recipe file, line and column) on what
// the runtime cannot do yet.
qt_status model_plan(model *m, const recipe *r, arena *dev, arena *host,
                     const model_options *options);

// Appends the program of one mode (arenas still in PLAN).
qt_status model_build_train(model *m, program *p);
qt_status model_build_eval(model *m, program *p);
qt_status model_build_infer(model *m, program *p);
qt_status model_build_init(model *m, program *p);
qt_status model_build_checksum(model *m, program *p);
// After every program is built (last_op: the last op index of all of them): widens the lifetime
// of each moe layer's train first_dims (model_moe.loads) to last_op, so that no later op of any
// program shares its bytes and the counts of the last train step stay readable after the loop
// (`qtrain run`'s summary; nothing in the step reads them back).
void model_keep_expert_loads(model *m, int32_t last_op);

// Whether this rank owns parameter i (updates it, holds its moments), and whether it holds its
// master: an owned one's, and every rank a master that is the weight itself (no quantizer) and
// every master of a run that does not train.
bool model_param_owned(const model *m, uint32_t i);
// Whether layer i is an activation whose output train steps keep through backward and whose
// `recompute` would take effect but is not set (model.c's model_plan_recompute): what to suggest
// to a run that does not fit.
bool model_recompute_would_help(const model *m, uint32_t i);
bool model_param_master_here(const model *m, uint32_t i);

// Whether an moe layer's router takes no dgrad GEMM: its input gradient is folded into the
// un-permute of the experts' input gradients (op_moe_router_term), where the router is BF16 in
// both the gradient and the weight and has at most MODEL_MOE_ROUTER_FOLD_EXPERTS experts (the
// weight's rows stay in L1 as every chunk of the un-permute reads them). A GEMM of K = experts
// would write a [batch][width] tensor for the un-permute to read back.
#define MODEL_MOE_ROUTER_FOLD_EXPERTS 16u
bool model_moe_router_dx_folded(const model *m, const model_moe *mo);

// Tensors of one quantizer: an moe layer's experts (fc1, fc2) have one per expert, each with its
// own scale, amax and delayed-scaling slot; every other quantizer has one.
uint32_t model_quantizer_tensors(const model *m, const model_quantizer *mq);

// The trace names of the delayed-scaling slots, in trace order ("linear.input@fc1", and per
// expert "grouped_linear.input@moe1.fc1[3]").
void model_trace_name(const model *m, uint32_t trace_index, char *buf, size_t buf_bytes);

// Writes the plan: layers with their widths, padding, quantizers (scheme and options), GEMM
// paths, RHT decisions and the notes.
void model_print(const model *m, FILE *out);
// The same in brief, at most 25 lines for any model: the layers with weights (their GEMM paths),
// the quantizers grouped by tensor type, quantizer and the rule that chose it (with the layers of
// each group), and the parameter count.
void model_print_summary(const model *m, FILE *out);

#endif  // QT_MODEL_H
