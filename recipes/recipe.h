// recipe: the parser of recipe files, their data model and the resolution of the model's quantizer
// roles through the recipe's rules. A recipe is one complete training plan: model, quantization
// rules, optimizer, data and schedule.
//
// Owns nothing but the caller's `recipe` struct, which recipe_parse fills and which then lives as
// long as the caller keeps it (the runtime keeps it for the whole run). No allocation: every list
// is a fixed array with a named `*_max` limit, and the text is given by the caller (recipe_load
// reads a file into a caller buffer). Not thread-safe per recipe; separate recipes are
// independent. Callers: tools/qtrain and the embedding API, once, at start-up.
//
// The text is untrusted. recipe_parse validates all of it once: syntax, numbers and their ranges,
// names, layer widths, data against the model and the loss, the schedule against the data, and
// that every quantizer role of the model resolves (recipes/rules.h). Later stages do not check
// again. Every failure is a message `file:line:col: what was expected, what was found`.
//
// Syntax. Line oriented; blanks are spaces and tabs; `#` starts a comment at the start of a line
// or after a blank; lines end with \n or \r\n and hold at most RECIPE_LINE_BYTES_MAX bytes. Numbers
// are decimal: integers are digits only, reals are [+-]digits[.digits][e[+-]digits]. Names are
// [A-Za-z_][A-Za-z0-9_]*. Options are `key=value` tokens in any order, each at most once.
//
//   [model]                                  sections appear once each, in any order
//   input = N                                features of one sample
//   layer = linear NAME OUT [bias]           layers run in file order
//   layer = relu | gelu | silu [recompute]   keep the width (gelu: tanh form)
//   layer = swiglu [recompute]               halves the width: silu(first half) * second half
//                                            recompute: the linear right after it keeps no copy
//                                            of this output for its weight gradient; backward
//                                            makes it again from the activation's input (where
//                                            that linear's input is BF16 and a layer below has
//                                            weights; elsewhere the flag changes nothing)
//   layer = rmsnorm [NAME] [eps=F]           eps 1e-5; NAME defaults to rmsnorm1, rmsnorm2, ...
//   layer = residual begin                   x + f(x), f = the layers up to the matching end;
//   layer = residual end                     f keeps the width; blocks nest
//   layer = moe NAME experts=E topk=K hidden=H [act=gelu|relu|silu|swiglu] [aux=F]
//                                            act gelu, aux (load-balancing loss weight) 0.01
//   loss = softmax_xent | mse
//   [quant]
//   recipe = bf16 | delayed | current | mxfp8 | block | nvfp4 | none
//   rule = MODULE.TENSOR@NAME -> SCHEME [e4m3|e5m2] [margin=N] [history=N]
//          [algo=max|most_recent] [pow2=0|1] [eps=F] [sr=0|1] [2d=0|1] [rht=0|1]
//   [optim]                                  one line
//   adamw [lr=F] [betas=F,F] [eps=F] [wd=F] [clip=F]      1e-3, 0.9,0.999, 1e-8, 0.01, 0 (off)
//   [data]
//   train = SOURCE                           optional: without it the embedder gives every
//                                            batch (runtime/qtrain.h)
//   eval = SOURCE                            optional
//   batch = N
//   seed = N                                 optional, 0 (the shuffle seed)
//   resident = off | on                      optional, off: on keeps the datasets in the
//                                            device arena, and a step's batch is gathered
//                                            there from its rows' indices (runtime/io/data.h)
//     SOURCE = idx IMAGES LABELS             paths without blanks; .gz is read through zlib
//            | npy FEATURES LABELS_OR_TARGETS   .npy files: features 2-D float32 or uint8;
//                                           labels 1-D integers or targets 2-D float32
//            | synthetic teacher inputs=N outputs=N samples=N [seed=N] [task=N]
//            | synthetic classes inputs=N classes=N samples=N [seed=N] [task=N] [zipf=S]
//                                [spread=F]
//                                           task= draws the task (class centers, teacher
//                                           weights), seed= the samples; task defaults to seed;
//                                           zipf= (0 to 16, default 0: uniform) draws class c
//                                           with probability proportional to 1 / (c + 1)^S;
//                                           spread= (default 3) is the centers' distance from
//                                           the origin in noise deviations (the noise's length
//                                           is sqrt(inputs))
//   [schedule]                               rows run in order
//   train N [steps|epochs] [RULE] [warmup N [steps|epochs]]
//         [eval [STEPS|all] [train|eval] every [N] steps|epochs]
//     RULE = constant LR | warmup LR -> LR | decay LR -> LR | cosine LR -> LR
//                                            default rule: constant optim lr; warmup rises,
//                                            decay falls (both linear); `step`, `epoch` too
//   eval STEPS|all [train|eval]              default dataset: eval
//   infer STEPS|all [train|eval] [output=FILE] [argmax]
//                                            default dataset: eval if given, else train; FILE
//                                            (.npy) gets the logits, or with argmax the classes
//   repeat N                                 the rows since the previous repeat (or the start of
//                                            [schedule]) run N times in all; none may write an
//                                            output file (N > 1)
//
// Layer names (linear, moe, rmsnorm) are unique in the whole model. The roles of a moe layer NAME
// are NAME.router (module router) and NAME.fc1, NAME.fc2 (module grouped_linear). softmax_xent
// needs class labels (idx, npy labels or synthetic classes) and mse regression targets (npy
// targets or synthetic teacher); an npy pair is checked against the loss when its files are read.
#ifndef QT_RECIPE_H
#define QT_RECIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "recipes/rules.h"        // qt_rule, qt_scheme
#include "runtime/base/status.h"  // qt_status

#define RECIPE_LINE_BYTES_MAX 512
#define RECIPE_LINE_TOKENS_MAX 64
#define RECIPE_FILE_NAME_MAX 256
#define RECIPE_NAME_MAX 32           // layer names, terminator included
#define RECIPE_PATH_MAX 256          // data file paths, terminator included
#define RECIPE_LAYERS_MAX 256
#define RECIPE_RULES_MAX 64
#define RECIPE_SCHEDULE_ROWS_MAX 64
#define RECIPE_EXPANDED_ROWS_MAX (1u << 20)  // schedule rows with every repeat expanded
#define RECIPE_RESIDUAL_DEPTH_MAX 16
#define RECIPE_ROLES_MAX 1024        // quantized tensors of the model (3 per linear, 9 per moe)
#define RECIPE_FEATURES_MAX 1048576  // widths of layers and samples
#define RECIPE_EXPERTS_MAX 1024
#define RECIPE_BATCH_MAX 65536
#define RECIPE_STEPS_MAX 2147483647u
// Synthetic samples: the shuffle order indexes samples with 32 bits (runtime/io/data.h), so a
// larger count is refused where the recipe gives it.
#define RECIPE_SAMPLES_MAX UINT64_C(4294967295)
// `synthetic classes ... zipf=S`: beyond 16 the first class takes all but 2^-16 of the samples
// whatever the class count, which is no longer a mixture worth drawing.
#define RECIPE_ZIPF_MAX 16.0f
// `spread=F`: class centers of length F (noise: sqrt(inputs)); far beyond any width's noise.
#define RECIPE_SPREAD_MAX 1e4f

typedef enum recipe_section {
    RECIPE_SECTION_MODEL,
    RECIPE_SECTION_QUANT,
    RECIPE_SECTION_OPTIM,
    RECIPE_SECTION_DATA,
    RECIPE_SECTION_SCHEDULE,
    RECIPE_SECTION_COUNT
} recipe_section;

typedef enum recipe_layer_kind {
    RECIPE_LAYER_LINEAR,
    RECIPE_LAYER_RELU,
    RECIPE_LAYER_GELU,
    RECIPE_LAYER_SILU,
    RECIPE_LAYER_SWIGLU,
    RECIPE_LAYER_RMSNORM,
    RECIPE_LAYER_RESIDUAL_BEGIN,
    RECIPE_LAYER_RESIDUAL_END,
    RECIPE_LAYER_MOE,
    RECIPE_LAYER_KIND_COUNT
} recipe_layer_kind;

typedef struct recipe_layer {
    recipe_layer_kind kind;
    char name[RECIPE_NAME_MAX];  // linear, moe, rmsnorm; "" for the others
    uint32_t in_features;        // width entering the layer (set for every layer)
    uint32_t out_features;       // width leaving it
    bool bias;                   // linear
    bool recompute;              // relu, gelu, silu, swiglu: output made again in backward
    float eps;                   // rmsnorm
    uint32_t experts;            // moe
    uint32_t topk;               // moe
    uint32_t hidden;             // moe: per-expert hidden width (after the activation)
    recipe_layer_kind act;       // moe: RELU, GELU, SILU or SWIGLU (fc1: 2 * hidden outputs)
    float aux;                   // moe: weight of the load-balancing loss
    uint32_t match;              // residual begin/end: index of the matching end/begin
    uint32_t line;               // where it was declared, for messages of later stages
    uint32_t col;
} recipe_layer;

typedef enum recipe_loss { RECIPE_LOSS_SOFTMAX_XENT, RECIPE_LOSS_MSE } recipe_loss;

typedef struct recipe_model {
    uint32_t input_features;
    recipe_loss loss;
    uint32_t output_features;    // width of the last layer
    uint32_t layers_count;
    recipe_layer layers[RECIPE_LAYERS_MAX];
} recipe_model;

// Where a weight's columnwise copy (the dgrad GEMM's operand) lives when each step can make it:
// the rowwise copy transposed (per-tensor FP8 scaling, 128 x 128 block tiles) or MXFP8's 1-D
// columnwise cast from the master (one GPU): `weight_transpose = auto | stored | per_step` in
// [quant].
typedef enum recipe_weight_transpose {
    RECIPE_WEIGHT_T_AUTO,      // per step for the large weights of large batches (model.c)
    RECIPE_WEIGHT_T_STORED,    // written by the optimizer beside the rowwise copy, kept
    RECIPE_WEIGHT_T_PER_STEP,  // made by each train step before the weight's dgrad
    RECIPE_WEIGHT_T_COUNT
} recipe_weight_transpose;

typedef struct recipe_quant {
    bool has_builtin;            // false for `recipe = none`: the rules must cover every role
    qt_scheme builtin;
    recipe_weight_transpose weight_transpose;
    uint32_t rules_count;
    qt_rule rules[RECIPE_RULES_MAX];  // the file's rules, in file order
} recipe_quant;

typedef enum recipe_optimizer { RECIPE_OPTIM_ADAMW } recipe_optimizer;

typedef struct recipe_optim {
    recipe_optimizer kind;
    float lr;                    // constant rate of train rows that give none
    float beta1;
    float beta2;
    float eps;                   // added after the square root
    float weight_decay;          // decoupled
    float clip;                  // global gradient norm limit; 0 = no clipping
} recipe_optim;

typedef enum recipe_source_kind {
    RECIPE_SOURCE_NONE,
    RECIPE_SOURCE_IDX,
    RECIPE_SOURCE_TEACHER,       // synthetic regression: targets from a seeded teacher network
    RECIPE_SOURCE_CLASSES,       // synthetic classification: seeded random samples and labels
    RECIPE_SOURCE_NPY            // .npy features and labels (1-D) or regression targets (2-D)
} recipe_source_kind;

typedef struct recipe_source {
    recipe_source_kind kind;
    char images[RECIPE_PATH_MAX];  // idx: the images; npy: the features
    char labels[RECIPE_PATH_MAX];  // idx: the labels; npy: labels or targets; "": inputs only
    uint32_t inputs;             // synthetic
    uint32_t outputs;            // teacher: target width; classes: number of classes
    uint64_t samples;            // synthetic
    uint64_t seed;               // synthetic: the samples (inputs, labels, noise)
    uint64_t task;               // synthetic: the task (class centers, teacher weights); the
                                 // seed when the recipe gives no task=
    float zipf;                  // classes: label c drawn with weight 1 / (c + 1)^zipf; 0:
                                 // uniform (the draw of every recipe without zipf=)
    float spread;                // classes: the centers' length; 0: the default, 3
    uint32_t line;               // where it was given, for messages of later stages
    uint32_t col;
} recipe_source;

typedef struct recipe_data {
    recipe_source train;
    recipe_source eval;          // kind NONE when not given
    uint32_t batch;
    uint64_t seed;
    bool resident;               // `resident = on`
} recipe_data;

typedef enum recipe_mode { RECIPE_MODE_TRAIN, RECIPE_MODE_EVAL, RECIPE_MODE_INFER } recipe_mode;
typedef enum recipe_lr_kind {
    RECIPE_LR_CONSTANT,          // lr_from throughout
    RECIPE_LR_WARMUP,            // linear from lr_from up to lr_to over the rule's steps
    RECIPE_LR_COSINE,            // half cosine from lr_from to lr_to
    RECIPE_LR_DECAY              // linear from lr_from down to lr_to
} recipe_lr_kind;
typedef enum recipe_dataset { RECIPE_DATASET_TRAIN, RECIPE_DATASET_EVAL } recipe_dataset;
// What a train row's counts count: steps, or epochs of the train set (one epoch is
// data_batches_per_epoch steps, known once the data is probed: runtime/schedule/schedule.c
// converts).
typedef enum recipe_unit { RECIPE_UNIT_STEPS, RECIPE_UNIT_EPOCHS } recipe_unit;

typedef struct recipe_row {
    recipe_mode mode;
    uint32_t steps;              // train: the row's length in `unit`; eval/infer: steps, 0 with
                                 // `all`
    recipe_unit unit;            // train rows
    bool all;                    // eval/infer: one pass over the dataset
    recipe_lr_kind lr_kind;      // train rows: the rule, after the warmup if there is one
    float lr_from;
    float lr_to;
    uint32_t warmup;             // train: the first `warmup` (in warmup_unit) of the row ramp
    recipe_unit warmup_unit;     // linearly from 0 to lr_from; 0: no warmup
    uint32_t warmup_col;
    uint32_t eval_every;         // train: an eval after every eval_every (eval_unit) train steps
    recipe_unit eval_unit;       // of the row and after its last; 0: none
    uint32_t eval_steps;         // the eval's steps; 0 with eval_all (one pass)
    bool eval_all;
    recipe_dataset dataset;      // eval/infer rows, and the eval of a train row's eval clause
    char output[RECIPE_PATH_MAX];  // infer rows: the .npy file of the outputs, or ""
    bool argmax;                 // infer rows with an output: predicted classes, not logits
    uint32_t line;
    uint32_t col;                // train: where the row's length is (for the table's errors)
} recipe_row;

// `repeat N`: rows [first_row, first_row + row_count) run `times` times in all, in order.
typedef struct recipe_repeat {
    uint32_t first_row, row_count;
    uint32_t times;              // >= 1
    uint32_t line;
} recipe_repeat;

typedef struct recipe {
    char file_name[RECIPE_FILE_NAME_MAX];  // for messages of later stages
    recipe_model model;
    recipe_quant quant;
    recipe_optim optim;
    recipe_data data;
    uint32_t rows_count;
    recipe_row rows[RECIPE_SCHEDULE_ROWS_MAX];
    uint32_t repeats_count;      // in row order, disjoint
    recipe_repeat repeats[RECIPE_SCHEDULE_ROWS_MAX];
    uint32_t expanded_rows;      // rows of the schedule with the repeats expanded
} recipe;

// Parses and validates `bytes` bytes of text (no terminator needed; a NUL byte is an error).
// file_name is only used in messages. On failure *out is unspecified and the message is set.
qt_status recipe_parse(const char *text, size_t bytes, const char *file_name, recipe *out);

// Reads the file at path into buffer (QT_ERR_INPUT if it is not a regular file, e.g. a FIFO:
// runtime/base/input_file.h; QT_ERR_IO if it cannot; QT_ERR_CAPACITY if it holds more than
// buffer_bytes) and parses it.
qt_status recipe_load(const char *path, char *buffer, size_t buffer_bytes, recipe *out);

// The layer called name (linear, moe or rmsnorm), or NULL.
const recipe_layer *recipe_layer_find(const recipe *r, const char *name, size_t name_bytes);

// How a recipe file spells a layer kind: "linear", ..., "residual begin", "residual end", "moe".
const char *recipe_layer_kind_name(recipe_layer_kind kind);

// Parses one rule, "PATTERN -> SCHEME [OPTIONS]", from text[0 .. bytes) whose first byte is at
// (line, col) of file (errors name that position). Used for the file's rules and for the
// built-in lists of rules.c.
qt_status recipe_rule_parse(const char *text, size_t bytes, const char *file, uint32_t line,
                            uint32_t col, qt_rule *out);

// Formats "file:line:col: " followed by the message and records it (qt_fail).
qt_status recipe_fail_at(qt_status status, const char *file, uint32_t line, uint32_t col,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

// Roles (the resolution through the rules, recipes/rules.h).

// Walks the roles of a model in a fixed order: layers in file order; per layer its GEMMs (linear:
// itself; moe: router, fc1, fc2); per GEMM input, weight, grad_output. Start from {0}.
typedef struct recipe_role_iter {
    uint32_t layer_index;
    uint32_t role_index;      // within the layer
} recipe_role_iter;

// The quantizer of one role: the recipe's rules, then its built-in recipe; first match wins.
// Fails (QT_ERR_INPUT) if no rule matches, listing the role and the rules tried, or if the rule
// that matched gives the role an option it cannot take (2d=1 on a tensor that is not a weight,
// rht=1 on a weight); the message points at the layer or at the offending option.
qt_status recipe_resolve_role(const recipe *r, qt_role role, qt_quantizer *out);

// Next role of the model; false after the last one.
bool recipe_roles_next(const recipe *r, recipe_role_iter *iter, qt_role *role,
                      uint32_t *layer_index);
// Number of roles of the model (3 per linear, 9 per moe layer).
size_t recipe_roles_count(const recipe *r);

// Fails on the first rule of the file that matches no role of the model (naming the rule and
// the model's roles), then resolves every role of the model and fails on the first that does not
// resolve.
qt_status recipe_check_roles(const recipe *r);
// The same, listing each role and its quantizer in out[0 .. *out_count).
qt_status recipe_resolve_roles(const recipe *r, qt_role_quantizer *out, size_t out_max,
                              size_t *out_count);

#endif  // QT_RECIPE_H
