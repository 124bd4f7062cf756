// rules: quantizer roles, quantization rules, the built-in recipes, matching.
//
// Owns the built-in rule lists (const text, for the whole program) and nothing else: rules live in
// the caller's `recipe` (recipes/recipe.h), quantizers in the caller's storage. Pure functions of
// their arguments; any thread may call them. They read no recipe: resolving a model's roles
// through a parsed recipe's rules is the recipe's (recipe_resolve_role and the rest in
// recipes/recipe.h), which recipe_parse runs over every role, so later stages never see an
// unresolved role.
//
// A role names one quantized tensor of one GEMM:
//
//   module_type . tensor_type @ name        e.g.  linear.weight@fc1
//   linear          input                          grouped_linear.grad_output@moe1.fc2
//   grouped_linear  weight                         router.input@moe1.router
//   router          grad_output
//
// A rule maps a role pattern (globs `*` and `?` on each of the three fields, matched against the
// whole field) to a scheme and options:
//
//   linear.*@head -> bf16
//   *.grad_output@* -> mxfp8 e5m2
//   linear.weight@fc* -> delayed margin=0 history=1024 algo=max
//
// Resolution: the recipe's own rules in file order, then the rules of its built-in recipe; the
// first match wins. Every rule of the file must match some role of the model (recipe_check_roles).
// Options a rule leaves out take the scheme's defaults for the role's tensor
// type (rules_scheme_defaults), which are exactly the built-in recipe of the same name, so
// `-> nvfp4` gives a weight 2-D blocks and a gradient RHT and stochastic rounding.
#ifndef QT_RULES_H
#define QT_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "recipes/format.h"       // qt_format, qt_elem
#include "runtime/base/status.h"  // qt_status


// Role names are layer paths: a layer name (RECIPE_NAME_MAX - 1 bytes at most) plus a suffix of at
// most 7 bytes (".router").
#define QT_ROLE_NAME_MAX 48
// Module and tensor fields of a rule pattern ("grouped_linear" is the longest name, 14 bytes).
#define RULES_GLOB_MAX 24
// Longest built-in rule list; the lists are in rules.c.
#define RULES_BUILTIN_MAX 4
// Delayed scaling history rows. The history lives in device memory, [history_len, tensors] FP32;
// 65536 rows is far beyond any useful window (TE's default is 1024).
#define RULES_HISTORY_MAX 65536
#define RULES_MARGIN_MAX 64
// The fixed sign vector of the random Hadamard transform, bit i <-> index i.
#define RULES_RHT_MASK 0xD7E8u

// How a tensor's scales are chosen. The built-in recipes have the same names.
typedef enum qt_scheme {
    QT_SCHEME_BF16,     // not quantized
    QT_SCHEME_DELAYED,  // per-tensor FP8, scale from an amax history
    QT_SCHEME_CURRENT,  // per-tensor FP8, scale from this tensor's amax
    QT_SCHEME_MXFP8,    // 1x32 blocks, E8M0 scales
    QT_SCHEME_BLOCK,    // FP8 1x128 or 128x128 blocks, FP32 scales
    QT_SCHEME_NVFP4,    // E2M1 1x16 or 16x16 blocks, E4M3 scales + FP32 global
    QT_SCHEME_COUNT
} qt_scheme;

typedef enum qt_module_type {
    QT_MODULE_LINEAR,
    QT_MODULE_GROUPED_LINEAR,
    QT_MODULE_ROUTER,
    QT_MODULE_COUNT
} qt_module_type;

typedef enum qt_tensor_type {
    QT_TENSOR_INPUT,
    QT_TENSOR_WEIGHT,
    QT_TENSOR_GRAD_OUTPUT,
    QT_TENSOR_COUNT
} qt_tensor_type;

typedef enum qt_amax_algo { QT_AMAX_MAX, QT_AMAX_MOST_RECENT } qt_amax_algo;

typedef struct qt_role {
    qt_module_type module_type;
    qt_tensor_type tensor_type;
    char name[QT_ROLE_NAME_MAX];  // layer path: "fc1", "moe1.router", "moe1.fc2"
} qt_role;

// Everything a quantize kernel and its scaling state need to know about one tensor. Options that
// do not apply to the scheme hold neutral values (0, false) so that two quantizers compare equal
// field by field exactly when they quantize alike.
typedef struct qt_quantizer {
    qt_scheme scheme;
    qt_format format;         // storage row of recipes/format.h: block shape and scale type
    qt_elem elem;             // code type: BF16, E4M3, E5M2 or E2M1
    uint32_t margin;          // delayed: scale = qmax / amax / 2^margin
    uint32_t history_len;     // delayed: amax history rows
    qt_amax_algo amax_algo;   // delayed
    bool pow2;                // current, block: scales rounded down to a power of two
    float amax_eps;           // current, block: amax floor (scale_from_amax)
    bool sr;                  // nvfp4: stochastic rounding
    bool two_d;               // mxfp8 32x32, block 128x128, nvfp4 16x16 tiles (weights only)
    bool rht;                 // nvfp4: random Hadamard transform of the columnwise copy
    uint16_t rht_mask;        // RULES_RHT_MASK when rht, else 0
    // Where it came from, for `qtrain plan` and messages: the rule's line in the recipe file
    // (0 for a built-in rule) and its index in the recipe's rules or in the built-in list.
    uint32_t rule_line;
    uint32_t rule_index;
} qt_quantizer;

// Rule options; bit (1u << option) of qt_rule.set says the rule gave it explicitly.
typedef enum qt_rule_option {
    QT_OPTION_ELEM,     // bare token e4m3 | e5m2
    QT_OPTION_MARGIN,   // margin=N
    QT_OPTION_HISTORY,  // history=N
    QT_OPTION_ALGO,     // algo=max|most_recent
    QT_OPTION_POW2,     // pow2=0|1
    QT_OPTION_EPS,      // eps=F
    QT_OPTION_SR,       // sr=0|1
    QT_OPTION_2D,       // 2d=0|1
    QT_OPTION_RHT,      // rht=0|1
    QT_OPTION_COUNT
} qt_rule_option;

typedef struct qt_rule {
    char module_glob[RULES_GLOB_MAX];
    char tensor_glob[RULES_GLOB_MAX];
    char name_glob[QT_ROLE_NAME_MAX];
    qt_scheme scheme;
    uint32_t set;             // bit per qt_rule_option given in the rule
    qt_quantizer values;      // the options given; fields whose bit is clear are unused
    uint32_t line;            // position of the pattern in the recipe file; 0 for built-ins
    uint32_t col;
    uint32_t option_col[QT_OPTION_COUNT];  // column of each option given, for later errors
} qt_rule;

// One resolved role of a model, as recipe_resolve_roles lists them.
typedef struct qt_role_quantizer {
    qt_role role;
    qt_quantizer quantizer;
    uint32_t layer_index;     // the layer in recipe.model.layers that owns the GEMM
} qt_role_quantizer;

const char *rules_scheme_name(qt_scheme scheme);
const char *rules_module_type_name(qt_module_type module_type);
const char *rules_tensor_type_name(qt_tensor_type tensor_type);
bool rules_scheme_from_name(const char *name, qt_scheme *out);

// Glob over the whole text: `*` any run of bytes (dots included), `?` any one byte.
bool rules_glob_match(const char *pattern, const char *text);
bool rules_match(const qt_rule *rule, const qt_role *role);

// "linear.weight@fc1" into buf (always terminated, truncated to buf_bytes).
void rules_role_format(const qt_role *role, char *buf, size_t buf_bytes);
// "nvfp4 2d=1 rht=0 sr=0", every option that applies to the scheme, into buf.
void rules_quantizer_format(const qt_quantizer *q, char *buf, size_t buf_bytes);

// Whether a rule for `scheme` may give option `opt` (e.g. history only for delayed, rht and sr
// only for nvfp4), and the list of schemes it applies to ("current and block") for messages.
bool rules_option_applies(qt_rule_option opt, qt_scheme scheme);
const char *rules_option_schemes(qt_rule_option opt, char *buf, size_t buf_bytes);

// Derives what follows from a quantizer's options: its format and its RHT sign mask.
void rules_quantizer_finish(qt_quantizer *q);

// The scheme's defaults for one tensor type (the built-in recipe's values), with format derived.
qt_quantizer rules_scheme_defaults(qt_scheme scheme, qt_tensor_type tensor_type);

// Built-in recipe `scheme` as rule text, e.g. "*.weight@* -> nvfp4 2d=1 rht=0 sr=0".
size_t rules_builtin_count(qt_scheme scheme);
const char *rules_builtin_text(qt_scheme scheme, size_t index);

#endif  // QT_RULES_H
