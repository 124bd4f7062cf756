#include "recipes/rules.h"

#include <stdarg.h>
#include <stdio.h>   // snprintf, vsnprintf
#include <string.h>


#define BIT(scheme) (1u << (scheme))
#define ARRAY_COUNT(a) (sizeof(a) / sizeof((a)[0]))

// The name tables (recipe-file spellings) take their size from their names, so that an enum
// value without a name fails the count assertion beside its table.
static const char *const scheme_names[] = {
    "bf16", "delayed", "current", "mxfp8", "block", "nvfp4",
};
_Static_assert(ARRAY_COUNT(scheme_names) == QT_SCHEME_COUNT, "a name per qt_scheme");
static const char *const module_names[] = {"linear", "grouped_linear", "router"};
_Static_assert(ARRAY_COUNT(module_names) == QT_MODULE_COUNT, "a name per qt_module_type");
static const char *const tensor_names[] = {"input", "weight", "grad_output"};
_Static_assert(ARRAY_COUNT(tensor_names) == QT_TENSOR_COUNT, "a name per qt_tensor_type");

// Which schemes take which option. An option outside its scheme would be silently meaningless
// (a history for current scaling, RHT for FP8), so the parser refuses it.
static const uint32_t option_schemes[QT_OPTION_COUNT] = {
    // nvfp4 codes are always E2M1 with E4M3 block scales; bf16 has no codes.
    [QT_OPTION_ELEM] = BIT(QT_SCHEME_DELAYED) | BIT(QT_SCHEME_CURRENT) | BIT(QT_SCHEME_MXFP8) |
                       BIT(QT_SCHEME_BLOCK),
    [QT_OPTION_MARGIN] = BIT(QT_SCHEME_DELAYED),
    [QT_OPTION_HISTORY] = BIT(QT_SCHEME_DELAYED),
    [QT_OPTION_ALGO] = BIT(QT_SCHEME_DELAYED),
    // The scale_from_amax options (ptx/qt_codec.h); MXFP8 scales are powers of two anyway.
    [QT_OPTION_POW2] = BIT(QT_SCHEME_CURRENT) | BIT(QT_SCHEME_BLOCK),
    [QT_OPTION_EPS] = BIT(QT_SCHEME_CURRENT) | BIT(QT_SCHEME_BLOCK),
    [QT_OPTION_SR] = BIT(QT_SCHEME_NVFP4),
    [QT_OPTION_2D] = BIT(QT_SCHEME_MXFP8) | BIT(QT_SCHEME_BLOCK) | BIT(QT_SCHEME_NVFP4),
    [QT_OPTION_RHT] = BIT(QT_SCHEME_NVFP4),
};

// Built-in recipes as rule text, parsed by the same parser as a file's rules. Options are listed in
// qt_rule_option order, every one that applies, so rules_quantizer_format of a resolved quantizer
// prints exactly the text after "->" (test_recipe checks it, and that the defaults agree).
//
// The router stays BF16 in every recipe: in the reference stack (Megatron-Core over TE) the router
// GEMM is a plain PyTorch linear that TE never quantizes (inferred), and its top-k decisions flip
// on small errors. A file's rule can still quantize it.
static const char *const builtin_bf16[] = {
    "*.*@* -> bf16",
};
// TE's DelayedScaling defaults: HYBRID (E4M3 forward, E5M2 grad_output), margin 0,
// history 1024, algo max.
static const char *const builtin_delayed[] = {
    "router.*@* -> bf16",
    "*.input@* -> delayed e4m3 margin=0 history=1024 algo=max",
    "*.weight@* -> delayed e4m3 margin=0 history=1024 algo=max",
    "*.grad_output@* -> delayed e5m2 margin=0 history=1024 algo=max",
};
// TE's Float8CurrentScaling defaults: HYBRID, power_2_scale False, amax_epsilon 0.
static const char *const builtin_current[] = {
    "router.*@* -> bf16",
    "*.input@* -> current e4m3 pow2=0 eps=0",
    "*.weight@* -> current e4m3 pow2=0 eps=0",
    "*.grad_output@* -> current e5m2 pow2=0 eps=0",
};
// TE's MXFP8BlockScaling defaults: E4M3 for every tensor, 1-D blocks.
static const char *const builtin_mxfp8[] = {
    "router.*@* -> bf16",
    "*.*@* -> mxfp8 e4m3 2d=0",
};
// TE's Float8BlockScaling defaults: E4M3 everywhere, 1x128 inputs and gradients, 128x128
// weights, pow2 scales.
static const char *const builtin_block[] = {
    "router.*@* -> bf16",
    "*.input@* -> block e4m3 pow2=1 eps=0 2d=0",
    "*.weight@* -> block e4m3 pow2=1 eps=0 2d=1",
    "*.grad_output@* -> block e4m3 pow2=1 eps=0 2d=0",
};
// TE's NVFP4BlockScaling defaults: weights 16x16 without RHT or SR; inputs RHT (columnwise
// copy); gradients RHT and stochastic rounding.
static const char *const builtin_nvfp4[] = {
    "router.*@* -> bf16",
    "*.weight@* -> nvfp4 sr=0 2d=1 rht=0",
    "*.input@* -> nvfp4 sr=0 2d=0 rht=1",
    "*.grad_output@* -> nvfp4 sr=1 2d=0 rht=1",
};

typedef struct builtin_list {
    const char *const *rules;
    size_t count;
} builtin_list;

static const builtin_list builtins[] = {
    [QT_SCHEME_BF16] = {builtin_bf16, ARRAY_COUNT(builtin_bf16)},
    [QT_SCHEME_DELAYED] = {builtin_delayed, ARRAY_COUNT(builtin_delayed)},
    [QT_SCHEME_CURRENT] = {builtin_current, ARRAY_COUNT(builtin_current)},
    [QT_SCHEME_MXFP8] = {builtin_mxfp8, ARRAY_COUNT(builtin_mxfp8)},
    [QT_SCHEME_BLOCK] = {builtin_block, ARRAY_COUNT(builtin_block)},
    [QT_SCHEME_NVFP4] = {builtin_nvfp4, ARRAY_COUNT(builtin_nvfp4)},
};
_Static_assert(ARRAY_COUNT(builtins) == QT_SCHEME_COUNT, "a built-in recipe per qt_scheme");
_Static_assert(ARRAY_COUNT(builtin_delayed) <= RULES_BUILTIN_MAX, "RULES_BUILTIN_MAX");
_Static_assert(ARRAY_COUNT(builtin_current) <= RULES_BUILTIN_MAX, "RULES_BUILTIN_MAX");
_Static_assert(ARRAY_COUNT(builtin_block) <= RULES_BUILTIN_MAX, "RULES_BUILTIN_MAX");
_Static_assert(ARRAY_COUNT(builtin_nvfp4) <= RULES_BUILTIN_MAX, "RULES_BUILTIN_MAX");

// ---------------------------------------------------------------------------------------------
// Names and text

const char *rules_scheme_name(qt_scheme scheme) {
    QT_ASSERT((unsigned)scheme < QT_SCHEME_COUNT);
    return scheme_names[scheme];
}

const char *rules_module_type_name(qt_module_type module_type) {
    QT_ASSERT((unsigned)module_type < QT_MODULE_COUNT);
    return module_names[module_type];
}

const char *rules_tensor_type_name(qt_tensor_type tensor_type) {
    QT_ASSERT((unsigned)tensor_type < QT_TENSOR_COUNT);
    return tensor_names[tensor_type];
}

bool rules_scheme_from_name(const char *name, qt_scheme *out) {
    QT_ASSERT(name != NULL && out != NULL);
    for (int s = 0; s < QT_SCHEME_COUNT; s++) {
        if (strcmp(scheme_names[s], name) == 0) {
            *out = (qt_scheme)s;
            return true;
        }
    }
    return false;
}

bool rules_option_applies(qt_rule_option opt, qt_scheme scheme) {
    QT_ASSERT((unsigned)opt < QT_OPTION_COUNT && (unsigned)scheme < QT_SCHEME_COUNT);
    return (option_schemes[opt] & BIT(scheme)) != 0;
}

const char *rules_option_schemes(qt_rule_option opt, char *buf, size_t buf_bytes) {
    QT_ASSERT((unsigned)opt < QT_OPTION_COUNT && buf != NULL && buf_bytes > 0);
    uint32_t mask = option_schemes[opt], left = 0;
    for (int s = 0; s < QT_SCHEME_COUNT; s++) left += (mask >> s) & 1u;
    size_t used = 0;
    buf[0] = '\0';
    for (int s = 0; s < QT_SCHEME_COUNT && used < buf_bytes; s++) {
        if (!(mask & BIT(s))) continue;
        left--;
        const char *sep = used == 0 ? "" : left == 0 ? " and " : ", ";
        int n = snprintf(buf + used, buf_bytes - used, "%s%s", sep, scheme_names[s]);
        if (n < 0) break;
        used += (size_t)n;
    }
    return buf;
}

// Iterative glob: on a mismatch, retry from the last `*` with one more byte swallowed. O(n * m)
// at worst and no recursion, so hostile patterns cannot blow the stack.
bool rules_glob_match(const char *pattern, const char *text) {
    QT_ASSERT(pattern != NULL && text != NULL);
    const char *star = NULL, *resume = NULL;
    while (*text != '\0') {
        if (*pattern == '*') {
            star = pattern++;
            resume = text;
        } else if (*pattern == '?' || *pattern == *text) {
            pattern++;
            text++;
        } else if (star != NULL) {
            pattern = star + 1;
            text = ++resume;
        } else {
            return false;
        }
    }
    while (*pattern == '*') pattern++;
    return *pattern == '\0';
}

bool rules_match(const qt_rule *rule, const qt_role *role) {
    QT_ASSERT(rule != NULL && role != NULL);
    return rules_glob_match(rule->module_glob, rules_module_type_name(role->module_type)) &&
           rules_glob_match(rule->tensor_glob, rules_tensor_type_name(role->tensor_type)) &&
           rules_glob_match(rule->name_glob, role->name);
}

void rules_role_format(const qt_role *role, char *buf, size_t buf_bytes) {
    QT_ASSERT(role != NULL && buf != NULL && buf_bytes > 0);
    snprintf(buf, buf_bytes, "%s.%s@%s", rules_module_type_name(role->module_type),
             rules_tensor_type_name(role->tensor_type), role->name);
}

__attribute__((format(printf, 4, 5)))
static void append(char *buf, size_t buf_bytes, size_t *used, const char *fmt, ...) {
    if (*used >= buf_bytes) return;
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(buf + *used, buf_bytes - *used, fmt, args);
    va_end(args);
    if (n > 0) *used += (size_t)n;
}

void rules_quantizer_format(const qt_quantizer *q, char *buf, size_t buf_bytes) {
    QT_ASSERT(q != NULL && buf != NULL && buf_bytes > 0);
    size_t used = 0;
    buf[0] = '\0';
    append(buf, buf_bytes, &used, "%s", rules_scheme_name(q->scheme));
    for (int o = 0; o < QT_OPTION_COUNT; o++) {
        if (!rules_option_applies((qt_rule_option)o, q->scheme)) continue;
        switch ((qt_rule_option)o) {
        case QT_OPTION_ELEM: append(buf, buf_bytes, &used, " %s", qt_elem_name(q->elem)); break;
        case QT_OPTION_MARGIN: append(buf, buf_bytes, &used, " margin=%u", q->margin); break;
        case QT_OPTION_HISTORY: append(buf, buf_bytes, &used, " history=%u", q->history_len);
            break;
        case QT_OPTION_ALGO:
            append(buf, buf_bytes, &used, " algo=%s",
                   q->amax_algo == QT_AMAX_MAX ? "max" : "most_recent");
            break;
        case QT_OPTION_POW2: append(buf, buf_bytes, &used, " pow2=%d", q->pow2); break;
        case QT_OPTION_EPS: append(buf, buf_bytes, &used, " eps=%g", (double)q->amax_eps); break;
        case QT_OPTION_SR: append(buf, buf_bytes, &used, " sr=%d", q->sr); break;
        case QT_OPTION_2D: append(buf, buf_bytes, &used, " 2d=%d", q->two_d); break;
        case QT_OPTION_RHT: append(buf, buf_bytes, &used, " rht=%d", q->rht); break;
        case QT_OPTION_COUNT: break;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Defaults and resolution

static qt_format format_of(const qt_quantizer *q) {
    switch (q->scheme) {
    case QT_SCHEME_BF16: return QT_FORMAT_BF16;
    case QT_SCHEME_DELAYED:
    case QT_SCHEME_CURRENT:
        return q->elem == QT_ELEM_E5M2 ? QT_FORMAT_FP8_E5M2 : QT_FORMAT_FP8_E4M3;
    case QT_SCHEME_MXFP8: return QT_FORMAT_MXFP8;
    case QT_SCHEME_BLOCK: return q->two_d ? QT_FORMAT_FP8_BLOCK_2D : QT_FORMAT_FP8_BLOCK_1D;
    case QT_SCHEME_NVFP4: return QT_FORMAT_NVFP4;
    case QT_SCHEME_COUNT: break;
    }
    QT_ASSERT(!"unknown scheme");
    return QT_FORMAT_BF16;
}

// The derived fields, once the options are final.
void rules_quantizer_finish(qt_quantizer *q) {
    q->rht_mask = q->rht ? (uint16_t)RULES_RHT_MASK : 0;
    q->format = format_of(q);
}

qt_quantizer rules_scheme_defaults(qt_scheme scheme, qt_tensor_type tensor_type) {
    QT_ASSERT((unsigned)scheme < QT_SCHEME_COUNT && (unsigned)tensor_type < QT_TENSOR_COUNT);
    bool weight = tensor_type == QT_TENSOR_WEIGHT, grad = tensor_type == QT_TENSOR_GRAD_OUTPUT;
    qt_quantizer q;
    memset(&q, 0, sizeof q);  // neutral values for the options that do not apply
    q.scheme = scheme;
    switch (scheme) {
    case QT_SCHEME_BF16: q.elem = QT_ELEM_BF16; break;
    case QT_SCHEME_DELAYED:
        q.elem = grad ? QT_ELEM_E5M2 : QT_ELEM_E4M3;
        q.history_len = 1024;
        q.amax_algo = QT_AMAX_MAX;
        break;
    case QT_SCHEME_CURRENT: q.elem = grad ? QT_ELEM_E5M2 : QT_ELEM_E4M3; break;
    case QT_SCHEME_MXFP8: q.elem = QT_ELEM_E4M3; break;
    case QT_SCHEME_BLOCK:
        q.elem = QT_ELEM_E4M3;
        q.pow2 = true;
        q.two_d = weight;
        break;
    case QT_SCHEME_NVFP4:
        q.elem = QT_ELEM_E2M1;
        q.two_d = weight;
        q.rht = !weight;
        q.sr = grad;
        break;
    case QT_SCHEME_COUNT: break;
    }
    rules_quantizer_finish(&q);
    return q;
}

size_t rules_builtin_count(qt_scheme scheme) {
    QT_ASSERT((unsigned)scheme < QT_SCHEME_COUNT);
    return builtins[scheme].count;
}

const char *rules_builtin_text(qt_scheme scheme, size_t index) {
    QT_ASSERT(index < rules_builtin_count(scheme));
    return builtins[scheme].rules[index];
}
