#include "recipes/recipe.h"

#include <float.h>     // FLT_MAX
#include <inttypes.h>  // PRIu64
#include <locale.h>    // localeconv: strtof reads the decimal point of the current locale
#include <math.h>      // isfinite
#include <stdarg.h>
#include <stdio.h>     // vsnprintf, snprintf
#include <stdlib.h>    // strtof
#include <string.h>

#include "runtime/base/input_file.h"  // input_file_read: regular files only

_Static_assert(RECIPE_SCHEDULE_ROWS_MAX <= 64, "rows_lr_given and rows_dataset_given are uint64_t");
_Static_assert(RECIPE_NAME_MAX + 8 <= QT_ROLE_NAME_MAX, "role names are layer names + a suffix");

// ---------------------------------------------------------------------------------------------
// Positions, messages, tokens

// Where the words being parsed come from. end_col is the column just past the line's content
// (comment and trailing blanks removed), where "found end of line" errors point.
typedef struct line_ctx {
    const char *file;
    uint32_t line;
    uint32_t end_col;
} line_ctx;

// A word of the line, NUL-terminated in place inside the parser's copy of the line.
typedef struct token {
    const char *text;
    uint32_t bytes;
    uint32_t col;
} token;

// Words are quoted in messages up to this many bytes, so that one long word cannot push the
// position and the expectation out of the message buffer.
#define QUOTE_BYTES 64

static qt_status fail_v(qt_status status, const char *file, uint32_t line, uint32_t col,
                        const char *fmt, va_list args) {
    char message[QT_ERROR_MESSAGE_MAX];
    vsnprintf(message, sizeof message, fmt, args);
    return qt_fail(status, "%s:%u:%u: %s", file, line, col, message);
}

qt_status recipe_fail_at(qt_status status, const char *file, uint32_t line, uint32_t col,
                         const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    qt_status s = fail_v(status, file, line, col, fmt, args);
    va_end(args);
    return s;
}

__attribute__((format(printf, 3, 4)))
static qt_status fail(const line_ctx *at, uint32_t col, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    qt_status s = fail_v(QT_ERR_INPUT, at->file, at->line, col, fmt, args);
    va_end(args);
    return s;
}

__attribute__((format(printf, 3, 4)))
static qt_status fail_capacity(const line_ctx *at, uint32_t col, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    qt_status s = fail_v(QT_ERR_CAPACITY, at->file, at->line, col, fmt, args);
    va_end(args);
    return s;
}

static bool is_blank(char c) { return c == ' ' || c == '\t'; }

// Splits buf[begin, end) at blanks into tokens[*count ..], terminating each word in place: the
// byte after a word (a blank, or buf[end]) becomes NUL, so buf[end] must be writable.
static qt_status tokenize(const line_ctx *at, char *buf, uint32_t begin, uint32_t end,
                          uint32_t col_base, token *tokens, uint32_t *count) {
    uint32_t i = begin;
    while (i < end) {
        if (is_blank(buf[i])) {
            i++;
            continue;
        }
        uint32_t start = i;
        while (i < end && !is_blank(buf[i])) i++;
        if (*count == RECIPE_LINE_TOKENS_MAX) {
            return fail_capacity(at, col_base + start,
                                 "too many words on one line: line_tokens_max is %d",
                                 RECIPE_LINE_TOKENS_MAX);
        }
        tokens[*count] = (token){buf + start, i - start, col_base + start};
        (*count)++;
        buf[i] = '\0';
        i++;
    }
    return QT_OK;
}

// "a, b, c or d" into buf.
static const char *join_names(const char *const *names, uint32_t count, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < count && used < size; i++) {
        const char *sep = i == 0 ? "" : i + 1 == count ? " or " : ", ";
        int n = snprintf(buf + used, size - used, "%s%s", sep, names[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
    return buf;
}

// Index of word in names, or -1.
static int find_name(const char *const *names, uint32_t count, const char *word) {
    for (uint32_t i = 0; i < count; i++) {
        if (strcmp(names[i], word) == 0) return (int)i;
    }
    return -1;
}

// Fails unless the line has no words after tokens[used - 1].
static qt_status expect_end(const line_ctx *at, const token *tokens, uint32_t count,
                            uint32_t used) {
    if (count <= used) return QT_OK;
    return fail(at, tokens[used].col, "unexpected '%.*s'; expected end of line", QUOTE_BYTES,
                tokens[used].text);
}

// "expected X, found 'word'" or "expected X, found end of line" for tokens[index].
static qt_status fail_expected(const line_ctx *at, const token *tokens, uint32_t count,
                               uint32_t index, const char *expected) {
    if (index >= count) return fail(at, at->end_col, "expected %s, found end of line", expected);
    return fail(at, tokens[index].col, "expected %s, found '%.*s'", expected, QUOTE_BYTES,
                tokens[index].text);
}

// ---------------------------------------------------------------------------------------------
// Numbers

typedef enum range_kind { RANGE_CLOSED, RANGE_LO_OPEN, RANGE_HI_OPEN } range_kind;

static qt_status parse_u64(const line_ctx *at, const token *t, const char *what, uint64_t lo,
                           uint64_t hi, uint64_t *out) {
    uint64_t value = 0;
    bool overflow = false;
    for (uint32_t i = 0; i < t->bytes; i++) {
        char c = t->text[i];
        if (c < '0' || c > '9') {
            return fail(at, t->col, "bad number: expected an integer for %s, found '%.*s'", what,
                        QUOTE_BYTES, t->text);
        }
        uint64_t digit = (uint64_t)(c - '0');
        if (value > (UINT64_MAX - digit) / 10) overflow = true;
        value = value * 10 + digit;
    }
    if (t->bytes == 0) {
        return fail(at, t->col, "bad number: expected an integer for %s, found nothing", what);
    }
    if (overflow || value < lo || value > hi) {
        return fail(at, t->col,
                    "number out of range: expected %s in [%" PRIu64 ", %" PRIu64 "], found %.*s",
                    what, lo, hi, QUOTE_BYTES, t->text);
    }
    *out = value;
    return QT_OK;
}

static qt_status parse_u32(const line_ctx *at, const token *t, const char *what, uint32_t lo,
                           uint32_t hi, uint32_t *out) {
    uint64_t value;
    QT_TRY(parse_u64(at, t, what, lo, hi, &value));
    *out = (uint32_t)value;
    return QT_OK;
}

// [+-]digits[.digits][e[+-]digits], or [+-].digits[...]: what strtof reads, minus hex, inf and
// nan, which a recipe never needs and which would hide typos.
static bool is_decimal_real(const char *s) {
    uint32_t digits = 0;
    if (*s == '+' || *s == '-') s++;
    for (; *s >= '0' && *s <= '9'; s++) digits++;
    if (*s == '.') {
        for (s++; *s >= '0' && *s <= '9'; s++) digits++;
    }
    if (digits == 0) return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!(*s >= '0' && *s <= '9')) return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    return *s == '\0';
}

// Parses with strtof, which rounds correctly to FP32 (so `1e-3` is the float PyTorch uses too).
// strtof reads the current locale's decimal point, which an embedding program may have changed:
// the '.' is replaced by it in a copy. Long words are refused before strtof sees them.
static qt_status parse_f32(const line_ctx *at, const token *t, const char *what, float lo,
                           float hi, range_kind range, float *out) {
    char copy[96];
    if (t->bytes > 40 || !is_decimal_real(t->text)) {
        return fail(at, t->col, "bad number: expected a decimal number for %s, found '%.*s'",
                    what, QUOTE_BYTES, t->text);
    }
    const char *point = localeconv()->decimal_point;
    size_t used = 0;
    for (const char *s = t->text; *s != '\0'; s++) {
        const char *piece = *s == '.' && point[0] != '\0' ? point : s;
        size_t piece_bytes = piece == s ? 1 : strlen(point);
        if (used + piece_bytes >= sizeof copy) break;  // refused above: 40 bytes at most
        memcpy(copy + used, piece, piece_bytes);
        used += piece_bytes;
    }
    copy[used] = '\0';
    char *end = NULL;
    float value = strtof(copy, &end);
    bool ok = end != NULL && *end == '\0' && isfinite(value) &&
              (range == RANGE_LO_OPEN ? value > lo : value >= lo) &&
              (range == RANGE_HI_OPEN ? value < hi : value <= hi);
    if (!ok) {
        return fail(at, t->col, "number out of range: expected %s in %c%g, %g%c, found %.*s",
                    what, range == RANGE_LO_OPEN ? '(' : '[', (double)lo, (double)hi,
                    range == RANGE_HI_OPEN ? ')' : ']', QUOTE_BYTES, t->text);
    }
    *out = value;
    return QT_OK;
}

static qt_status parse_bool(const line_ctx *at, const token *t, const char *what, bool *out) {
    if (strcmp(t->text, "0") != 0 && strcmp(t->text, "1") != 0) {
        return fail(at, t->col, "expected 0 or 1 for %s, found '%.*s'", what, QUOTE_BYTES,
                    t->text);
    }
    *out = t->text[0] == '1';
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Options: `name=value` words

// Splits an option word, finds its name in names[] and rejects unknown or repeated names. owner
// names the thing the options belong to in messages ("moe", "adamw").
static qt_status option_split(const line_ctx *at, const token *t, const char *const *names,
                              uint32_t names_count, const char *owner, uint32_t *seen,
                              uint32_t *index, token *value) {
    const char *eq = strchr(t->text, '=');
    char expected[256];
    join_names(names, names_count, expected, sizeof expected);
    if (eq == NULL || eq == t->text) {
        return fail(at, t->col, "expected an option NAME=VALUE for %s (%s), found '%.*s'", owner,
                    expected, QUOTE_BYTES, t->text);
    }
    uint32_t name_bytes = (uint32_t)(eq - t->text);
    int found = -1;
    for (uint32_t i = 0; i < names_count && found < 0; i++) {
        if (strlen(names[i]) == name_bytes && memcmp(names[i], t->text, name_bytes) == 0) {
            found = (int)i;
        }
    }
    if (found < 0) {
        return fail(at, t->col, "unknown option '%.*s' for %s; expected %s", (int)name_bytes,
                    t->text, owner, expected);
    }
    if (*seen & (1u << found)) {
        return fail(at, t->col, "option '%s' given twice", names[found]);
    }
    if (eq[1] == '\0') {
        return fail(at, t->col + name_bytes + 1, "expected a value after '%s=', found nothing",
                    names[found]);
    }
    *seen |= 1u << found;
    *index = (uint32_t)found;
    *value = (token){eq + 1, t->bytes - name_bytes - 1, t->col + name_bytes + 1};
    return QT_OK;
}

// Fails if a required option (bit of `required`) is missing from `seen`.
static qt_status option_require(const line_ctx *at, const char *const *names, uint32_t required,
                                uint32_t seen, const char *owner) {
    for (uint32_t i = 0; i < 32; i++) {
        if ((required & (1u << i)) && !(seen & (1u << i))) {
            return fail(at, at->end_col, "%s needs %s=N; found no %s= option", owner, names[i],
                        names[i]);
        }
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Rules (the syntax is in rules.h; the meaning of each option in rules.c)

static const char *const option_names[] = {
    [QT_OPTION_ELEM] = "e4m3|e5m2", [QT_OPTION_MARGIN] = "margin", [QT_OPTION_HISTORY] = "history",
    [QT_OPTION_ALGO] = "algo", [QT_OPTION_POW2] = "pow2", [QT_OPTION_EPS] = "eps",
    [QT_OPTION_SR] = "sr", [QT_OPTION_2D] = "2d", [QT_OPTION_RHT] = "rht",
};
_Static_assert(sizeof option_names / sizeof option_names[0] == QT_OPTION_COUNT,
               "a name per qt_rule_option");

static bool is_glob_char(char c, bool in_name) {
    if ((c >= 'a' && c <= 'z') || c == '_' || c == '*' || c == '?') return true;
    return in_name && ((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.');
}

// Copies one field of a pattern, checking its characters and length.
static qt_status glob_copy(const line_ctx *at, const token *t, uint32_t begin, uint32_t end,
                           bool in_name, char *out, uint32_t out_bytes) {
    static const char *const field_names[2] = {"module or tensor", "name"};
    if (begin == end) {
        return fail(at, t->col + begin, "expected a role pattern MODULE.TENSOR@NAME (globs * and "
                    "?), found an empty %s field in '%.*s'", field_names[in_name], QUOTE_BYTES,
                    t->text);
    }
    if (end - begin >= out_bytes) {
        return fail(at, t->col + begin, "%s field of the pattern too long: expected at most %u "
                    "bytes, found %u", field_names[in_name], out_bytes - 1, end - begin);
    }
    for (uint32_t i = begin; i < end; i++) {
        if (!is_glob_char(t->text[i], in_name)) {
            return fail(at, t->col + i, "unexpected '%c' in the role pattern; expected %s",
                        t->text[i], in_name ? "letters, digits, '_', '.', '*' or '?'"
                                            : "lower-case letters, '_', '*' or '?'");
        }
    }
    memcpy(out, t->text + begin, end - begin);
    out[end - begin] = '\0';
    return QT_OK;
}

static qt_status rule_parse_pattern(const line_ctx *at, const token *t, qt_rule *rule) {
    const char *dot = strchr(t->text, '.');
    const char *at_sign = dot ? strchr(dot, '@') : NULL;
    if (dot == NULL || at_sign == NULL) {
        return fail(at, t->col, "expected a role pattern MODULE.TENSOR@NAME (globs * and ?), "
                    "found '%.*s'", QUOTE_BYTES, t->text);
    }
    uint32_t dot_index = (uint32_t)(dot - t->text), at_index = (uint32_t)(at_sign - t->text);
    QT_TRY(glob_copy(at, t, 0, dot_index, false, rule->module_glob, RULES_GLOB_MAX));
    QT_TRY(glob_copy(at, t, dot_index + 1, at_index, false, rule->tensor_glob, RULES_GLOB_MAX));
    QT_TRY(glob_copy(at, t, at_index + 1, t->bytes, true, rule->name_glob, QT_ROLE_NAME_MAX));
    // A module or tensor field that matches nothing is a typo ("liner"): say so now rather than
    // let the rule silently never apply.
    bool module_ok = false, tensor_ok = false;
    for (int m = 0; m < QT_MODULE_COUNT; m++) {
        module_ok |= rules_glob_match(rule->module_glob, rules_module_type_name(m));
    }
    for (int k = 0; k < QT_TENSOR_COUNT; k++) {
        tensor_ok |= rules_glob_match(rule->tensor_glob, rules_tensor_type_name(k));
    }
    if (!module_ok) {
        return fail(at, t->col, "pattern '%s' matches no module type; expected linear, "
                    "grouped_linear or router (globs * and ?)", rule->module_glob);
    }
    if (!tensor_ok) {
        return fail(at, t->col + dot_index + 1, "pattern '%s' matches no tensor type; expected "
                    "input, weight or grad_output (globs * and ?)", rule->tensor_glob);
    }
    return QT_OK;
}

// Which option a word names; the element type is a bare word, the others NAME=VALUE.
static qt_status rule_option_of(const line_ctx *at, const token *t, qt_rule_option *opt,
                                token *value) {
    if (strcmp(t->text, "e4m3") == 0 || strcmp(t->text, "e5m2") == 0) {
        *opt = QT_OPTION_ELEM;
        *value = *t;
        return QT_OK;
    }
    const char *eq = strchr(t->text, '=');
    uint32_t name_bytes = eq ? (uint32_t)(eq - t->text) : t->bytes;
    for (int o = QT_OPTION_ELEM + 1; o < QT_OPTION_COUNT; o++) {
        if (eq && strlen(option_names[o]) == name_bytes &&
            memcmp(option_names[o], t->text, name_bytes) == 0) {
            if (eq[1] == '\0') {
                return fail(at, t->col + name_bytes + 1,
                            "expected a value after '%s=', found nothing", option_names[o]);
            }
            *opt = (qt_rule_option)o;
            *value = (token){eq + 1, t->bytes - name_bytes - 1, t->col + name_bytes + 1};
            return QT_OK;
        }
    }
    return fail(at, t->col, "unknown option '%.*s'; expected e4m3, e5m2, margin=, history=, "
                "algo=, pow2=, eps=, sr=, 2d= or rht=", QUOTE_BYTES, t->text);
}

static qt_status rule_option_value(const line_ctx *at, qt_rule_option opt, const token *v,
                                   qt_quantizer *q) {
    static const char *const algo_names[2] = {"max", "most_recent"};
    switch (opt) {
    case QT_OPTION_ELEM:
        q->elem = strcmp(v->text, "e5m2") == 0 ? QT_ELEM_E5M2 : QT_ELEM_E4M3;
        return QT_OK;
    case QT_OPTION_MARGIN:
        return parse_u32(at, v, "margin", 0, RULES_MARGIN_MAX, &q->margin);
    case QT_OPTION_HISTORY:
        return parse_u32(at, v, "history", 1, RULES_HISTORY_MAX, &q->history_len);
    case QT_OPTION_ALGO: {
        int a = find_name(algo_names, 2, v->text);
        if (a < 0) {
            return fail(at, v->col, "unknown algo '%.*s'; expected max or most_recent",
                        QUOTE_BYTES, v->text);
        }
        q->amax_algo = a == 0 ? QT_AMAX_MAX : QT_AMAX_MOST_RECENT;
        return QT_OK;
    }
    case QT_OPTION_POW2: return parse_bool(at, v, "pow2", &q->pow2);
    case QT_OPTION_EPS: return parse_f32(at, v, "eps", 0.0f, FLT_MAX, RANGE_CLOSED, &q->amax_eps);
    case QT_OPTION_SR: return parse_bool(at, v, "sr", &q->sr);
    case QT_OPTION_2D: return parse_bool(at, v, "2d", &q->two_d);
    case QT_OPTION_RHT: return parse_bool(at, v, "rht", &q->rht);
    case QT_OPTION_COUNT: break;
    }
    QT_ASSERT(!"unreachable");
    return QT_ERR_INPUT;
}

static qt_status rule_parse_option(const line_ctx *at, const token *t, qt_rule *rule) {
    qt_rule_option opt = QT_OPTION_COUNT;
    token value;
    QT_TRY(rule_option_of(at, t, &opt, &value));
    if (!rules_option_applies(opt, rule->scheme)) {
        char schemes[128];
        return fail(at, t->col, "unsupported combination: %s applies to %s, found with %s",
                    opt == QT_OPTION_ELEM ? t->text : option_names[opt],
                    rules_option_schemes(opt, schemes, sizeof schemes),
                    rules_scheme_name(rule->scheme));
    }
    if (rule->set & (1u << opt)) {
        return fail(at, t->col, "option '%s' given twice", option_names[opt]);
    }
    QT_TRY(rule_option_value(at, opt, &value, &rule->values));
    rule->set |= 1u << opt;
    rule->option_col[opt] = t->col;
    return QT_OK;
}

static qt_status rule_parse_tokens(const line_ctx *at, const token *v, uint32_t n,
                                   qt_rule *rule) {
    QT_ASSERT(n >= 1);
    memset(rule, 0, sizeof *rule);
    rule->line = at->line;
    rule->col = v[0].col;
    QT_TRY(rule_parse_pattern(at, &v[0], rule));
    if (n < 2) {
        return fail(at, at->end_col, "expected '->' after the role pattern, found end of line");
    }
    if (strcmp(v[1].text, "->") != 0) {
        return fail(at, v[1].col, "expected '->' after the role pattern, found '%.*s'",
                    QUOTE_BYTES, v[1].text);
    }
    if (n < 3) return fail(at, at->end_col, "expected a scheme after '->', found end of line");
    qt_scheme scheme;
    if (!rules_scheme_from_name(v[2].text, &scheme)) {
        return fail(at, v[2].col, "unknown scheme '%.*s'; expected one of bf16, delayed, "
                    "current, mxfp8, block, nvfp4", QUOTE_BYTES, v[2].text);
    }
    rule->scheme = scheme;
    rule->values.scheme = scheme;
    for (uint32_t i = 3; i < n; i++) QT_TRY(rule_parse_option(at, &v[i], rule));
    return QT_OK;
}

qt_status recipe_rule_parse(const char *text, size_t bytes, const char *file, uint32_t line,
                            uint32_t col, qt_rule *out) {
    QT_ASSERT(text != NULL && file != NULL && out != NULL);
    char buf[RECIPE_LINE_BYTES_MAX + 1];
    line_ctx at = {file, line, col + (uint32_t)bytes};
    if (bytes > RECIPE_LINE_BYTES_MAX) {
        return fail(&at, col, "rule too long: expected at most %d bytes, found %zu",
                    RECIPE_LINE_BYTES_MAX, bytes);
    }
    memcpy(buf, text, bytes);
    buf[bytes] = '\0';
    token tokens[RECIPE_LINE_TOKENS_MAX];
    uint32_t count = 0;
    QT_TRY(tokenize(&at, buf, 0, (uint32_t)bytes, col, tokens, &count));
    if (count == 0) return fail(&at, col, "expected a rule PATTERN -> FORMAT, found nothing");
    return rule_parse_tokens(&at, tokens, count, out);
}

// ---------------------------------------------------------------------------------------------
// The parser

typedef enum key_id {
    KEY_INPUT, KEY_LAYER, KEY_LOSS,         // [model]
    KEY_RECIPE, KEY_RULE, KEY_WEIGHT_T,     // [quant]
    KEY_TRAIN, KEY_EVAL, KEY_BATCH, KEY_SEED, KEY_RESIDENT,  // [data]
    KEY_COUNT
} key_id;

typedef struct key_spec {
    const char *name;
    recipe_section section;
    bool repeats;
    bool required;
    const char *usage;  // what a missing key should look like
} key_spec;

static const key_spec key_specs[KEY_COUNT] = {
    [KEY_INPUT] = {"input", RECIPE_SECTION_MODEL, false, true, "input = N"},
    [KEY_LAYER] = {"layer", RECIPE_SECTION_MODEL, true, false, "layer = KIND ..."},
    [KEY_LOSS] = {"loss", RECIPE_SECTION_MODEL, false, true, "loss = softmax_xent | mse"},
    [KEY_RECIPE] = {"recipe", RECIPE_SECTION_QUANT, false, true,
                    "recipe = bf16 | delayed | current | mxfp8 | block | nvfp4 | none"},
    [KEY_RULE] = {"rule", RECIPE_SECTION_QUANT, true, false, "rule = PATTERN -> FORMAT"},
    [KEY_WEIGHT_T] = {"weight_transpose", RECIPE_SECTION_QUANT, false, false,
                      "weight_transpose = auto | stored | per_step"},
    // Optional: without it the embedder gives the batches (runtime/qtrain.h).
    [KEY_TRAIN] = {"train", RECIPE_SECTION_DATA, false, false, "train = SOURCE"},
    [KEY_EVAL] = {"eval", RECIPE_SECTION_DATA, false, false, "eval = SOURCE"},
    [KEY_BATCH] = {"batch", RECIPE_SECTION_DATA, false, true, "batch = N"},
    [KEY_SEED] = {"seed", RECIPE_SECTION_DATA, false, false, "seed = N"},
    [KEY_RESIDENT] = {"resident", RECIPE_SECTION_DATA, false, false, "resident = off | on"},
};

static const char *const section_names[] = {
    "model", "quant", "optim", "data", "schedule",
};
_Static_assert(sizeof section_names / sizeof section_names[0] == RECIPE_SECTION_COUNT,
               "a name per recipe_section");

typedef struct parser {
    line_ctx at;
    recipe *r;
    int section;                                   // recipe_section; -1 before the first header
    uint32_t section_line[RECIPE_SECTION_COUNT];   // 0 = not given
    uint32_t key_line[KEY_COUNT];                  // first line of each key; 0 = not given
    uint32_t optim_line;
    uint32_t residual_open[RECIPE_RESIDUAL_DEPTH_MAX];  // layer indices of open `residual begin`
    uint32_t residual_depth;
    uint32_t rmsnorm_count;
    uint64_t rows_lr_given;                        // bit per schedule row
    uint64_t rows_dataset_given;
    char buf[RECIPE_LINE_BYTES_MAX + 1];           // the current line, split into tokens
    token tokens[RECIPE_LINE_TOKENS_MAX];
    uint32_t tokens_count;
} parser;

const recipe_layer *recipe_layer_find(const recipe *r, const char *name, size_t name_bytes) {
    QT_ASSERT(r != NULL && name != NULL);
    for (uint32_t i = 0; i < r->model.layers_count; i++) {
        const recipe_layer *l = &r->model.layers[i];
        if (name_bytes > 0 && name_bytes < RECIPE_NAME_MAX &&
            strncmp(l->name, name, name_bytes) == 0 && l->name[name_bytes] == '\0') {
            return l;
        }
    }
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// [model]

static const char *const layer_kind_names[] = {
    "linear", "relu", "gelu", "silu", "swiglu", "rmsnorm", "residual begin", "residual end",
    "moe",
};
_Static_assert(sizeof layer_kind_names / sizeof layer_kind_names[0] == RECIPE_LAYER_KIND_COUNT,
               "a name per recipe_layer_kind");

const char *recipe_layer_kind_name(recipe_layer_kind kind) {
    QT_ASSERT((unsigned)kind < RECIPE_LAYER_KIND_COUNT);
    return layer_kind_names[kind];
}

// The first word of a layer line ("residual" takes begin or end after it).
static const char *const layer_names[] = {
    "linear", "relu", "gelu", "silu", "swiglu", "rmsnorm", "residual", "moe",
};
static const recipe_layer_kind layer_kinds[] = {
    RECIPE_LAYER_LINEAR, RECIPE_LAYER_RELU, RECIPE_LAYER_GELU, RECIPE_LAYER_SILU,
    RECIPE_LAYER_SWIGLU, RECIPE_LAYER_RMSNORM, RECIPE_LAYER_RESIDUAL_BEGIN, RECIPE_LAYER_MOE,
};
#define LAYER_NAMES_COUNT (sizeof layer_names / sizeof layer_names[0])

static bool is_name(const char *s) {
    bool first = true;
    for (; *s != '\0'; s++, first = false) {
        char c = *s;
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        if (!alpha && (first || c < '0' || c > '9')) return false;
    }
    return !first;
}

static qt_status layer_name_set(const parser *p, const token *t, recipe_layer *l) {
    if (!is_name(t->text)) {
        return fail(&p->at, t->col, "expected a layer name [A-Za-z_][A-Za-z0-9_]*, found '%.*s'",
                    QUOTE_BYTES, t->text);
    }
    if (t->bytes >= RECIPE_NAME_MAX) {
        return fail(&p->at, t->col, "layer name too long: expected at most %d bytes, found %u",
                    RECIPE_NAME_MAX - 1, t->bytes);
    }
    const recipe_layer *other = recipe_layer_find(p->r, t->text, t->bytes);
    if (other != NULL) {
        return fail(&p->at, t->col, "duplicate layer name '%s'; first declared at line %u",
                    t->text, other->line);
    }
    memcpy(l->name, t->text, t->bytes + 1);
    return QT_OK;
}

// The optional last word of a layer line, v[at] (`bias`, `recompute`): *flag set when present,
// anything else refused.
static qt_status parse_last_word(const parser *p, const token *v, uint32_t n, uint32_t at,
                                 const char *word, bool *flag) {
    if (n > at) {
        if (strcmp(v[at].text, word) != 0) {
            return fail(&p->at, v[at].col, "expected '%s' or end of line, found '%.*s'", word,
                        QUOTE_BYTES, v[at].text);
        }
        *flag = true;
    }
    return expect_end(&p->at, v, n, at + 1);
}

static qt_status parse_linear(parser *p, const token *v, uint32_t n, recipe_layer *l) {
    if (n < 3) {
        return fail(&p->at, p->at.end_col, "expected 'linear NAME OUT [bias]', found end of line");
    }
    QT_TRY(layer_name_set(p, &v[1], l));
    QT_TRY(parse_u32(&p->at, &v[2], "OUT", 1, RECIPE_FEATURES_MAX, &l->out_features));
    return parse_last_word(p, v, n, 3, "bias", &l->bias);
}

static qt_status parse_rmsnorm(parser *p, const token *v, uint32_t n, recipe_layer *l) {
    static const char *const names[] = {"eps"};
    uint32_t first_option = 1;
    p->rmsnorm_count++;
    if (n >= 2 && strchr(v[1].text, '=') == NULL) {
        QT_TRY(layer_name_set(p, &v[1], l));
        first_option = 2;
    } else {
        // Unnamed norms still need unique names (checkpoints and exports key tensors by name).
        char name[RECIPE_NAME_MAX];
        int bytes = snprintf(name, sizeof name, "rmsnorm%u", p->rmsnorm_count);
        token t = {name, (uint32_t)bytes, v[0].col};
        QT_TRY(layer_name_set(p, &t, l));
    }
    l->eps = 1e-5f;  // TransformerEngine's RMSNorm default
    uint32_t seen = 0;
    for (uint32_t i = first_option; i < n; i++) {
        uint32_t index;
        token value;
        QT_TRY(option_split(&p->at, &v[i], names, 1, "rmsnorm", &seen, &index, &value));
        QT_TRY(parse_f32(&p->at, &value, "eps", 0.0f, 1.0f, RANGE_LO_OPEN, &l->eps));
    }
    return QT_OK;
}

static qt_status parse_residual(parser *p, const token *v, uint32_t n, recipe_layer *l) {
    uint32_t index = p->r->model.layers_count;
    if (n < 2 || (strcmp(v[1].text, "begin") != 0 && strcmp(v[1].text, "end") != 0)) {
        return fail_expected(&p->at, v, n, 1, "'residual begin' or 'residual end'");
    }
    QT_TRY(expect_end(&p->at, v, n, 2));
    if (strcmp(v[1].text, "begin") == 0) {
        if (p->residual_depth == RECIPE_RESIDUAL_DEPTH_MAX) {
            return fail_capacity(&p->at, v[0].col, "residual blocks nested too deep: "
                                 "residual_depth_max is %d", RECIPE_RESIDUAL_DEPTH_MAX);
        }
        l->kind = RECIPE_LAYER_RESIDUAL_BEGIN;
        p->residual_open[p->residual_depth++] = index;
        return QT_OK;
    }
    if (p->residual_depth == 0) {
        return fail(&p->at, v[0].col, "unexpected 'residual end'; expected a 'residual begin' "
                    "before it");
    }
    uint32_t begin = p->residual_open[--p->residual_depth];
    if (begin + 1 == index) {
        return fail(&p->at, v[0].col, "empty residual block (begin at line %u); expected at "
                    "least one layer inside", p->r->model.layers[begin].line);
    }
    l->kind = RECIPE_LAYER_RESIDUAL_END;
    l->match = begin;
    p->r->model.layers[begin].match = index;
    return QT_OK;
}

static qt_status moe_option(parser *p, uint32_t index, const token *value, recipe_layer *l) {
    static const char *const acts[] = {"relu", "gelu", "silu", "swiglu"};
    static const recipe_layer_kind act_kinds[] = {
        RECIPE_LAYER_RELU, RECIPE_LAYER_GELU, RECIPE_LAYER_SILU, RECIPE_LAYER_SWIGLU,
    };
    switch (index) {
    case 0: return parse_u32(&p->at, value, "experts", 1, RECIPE_EXPERTS_MAX, &l->experts);
    case 1: return parse_u32(&p->at, value, "topk", 1, RECIPE_EXPERTS_MAX, &l->topk);
    // fc1 of a swiglu expert has 2 * hidden outputs, which must fit the width limit too.
    case 2: return parse_u32(&p->at, value, "hidden", 1, RECIPE_FEATURES_MAX / 2, &l->hidden);
    case 3: {
        int a = find_name(acts, 4, value->text);
        if (a < 0) {
            return fail(&p->at, value->col, "unknown activation '%.*s'; expected relu, gelu, "
                        "silu or swiglu", QUOTE_BYTES, value->text);
        }
        l->act = act_kinds[a];
        return QT_OK;
    }
    default: return parse_f32(&p->at, value, "aux", 0.0f, 1.0f, RANGE_CLOSED, &l->aux);
    }
}

static qt_status parse_moe(parser *p, const token *v, uint32_t n, recipe_layer *l) {
    static const char *const names[] = {"experts", "topk", "hidden", "act", "aux"};
    if (n < 2) {
        return fail(&p->at, p->at.end_col, "expected 'moe NAME experts=E topk=K hidden=H', "
                    "found end of line");
    }
    QT_TRY(layer_name_set(p, &v[1], l));
    l->act = RECIPE_LAYER_GELU;
    l->aux = 0.01f;
    uint32_t seen = 0, topk_col = 0;
    for (uint32_t i = 2; i < n; i++) {
        uint32_t index;
        token value;
        QT_TRY(option_split(&p->at, &v[i], names, 5, "moe", &seen, &index, &value));
        QT_TRY(moe_option(p, index, &value, l));
        if (index == 1) topk_col = value.col;
    }
    QT_TRY(option_require(&p->at, names, 0x7u, seen, "moe"));
    if (l->topk > l->experts) {
        return fail(&p->at, topk_col, "topk=%u exceeds experts=%u; expected topk <= experts",
                    l->topk, l->experts);
    }
    return QT_OK;
}

static qt_status parse_layer(parser *p, const token *v, uint32_t n) {
    recipe_model *m = &p->r->model;
    if (m->layers_count == RECIPE_LAYERS_MAX) {
        return fail_capacity(&p->at, v[0].col, "too many layers: layers_max is %d",
                             RECIPE_LAYERS_MAX);
    }
    recipe_layer *l = &m->layers[m->layers_count];
    memset(l, 0, sizeof *l);
    l->line = p->at.line;
    l->col = v[0].col;
    int k = find_name(layer_names, LAYER_NAMES_COUNT, v[0].text);
    if (k < 0) {
        return fail(&p->at, v[0].col, "unknown layer '%.*s'; expected linear, relu, gelu, silu, "
                    "swiglu, rmsnorm, residual or moe", QUOTE_BYTES, v[0].text);
    }
    l->kind = layer_kinds[k];
    switch (l->kind) {
    case RECIPE_LAYER_LINEAR: QT_TRY(parse_linear(p, v, n, l)); break;
    case RECIPE_LAYER_RMSNORM: QT_TRY(parse_rmsnorm(p, v, n, l)); break;
    case RECIPE_LAYER_RESIDUAL_BEGIN: QT_TRY(parse_residual(p, v, n, l)); break;
    case RECIPE_LAYER_MOE: QT_TRY(parse_moe(p, v, n, l)); break;
    case RECIPE_LAYER_RELU:
    case RECIPE_LAYER_GELU:
    case RECIPE_LAYER_SILU:
    case RECIPE_LAYER_SWIGLU:
        QT_TRY(parse_last_word(p, v, n, 1, "recompute", &l->recompute));
        break;
    case RECIPE_LAYER_RESIDUAL_END:  // parse_residual's, never a first word
    case RECIPE_LAYER_KIND_COUNT: QT_TRY(expect_end(&p->at, v, n, 1)); break;
    }
    m->layers_count++;
    return QT_OK;
}

static qt_status parse_loss(parser *p, const token *v, uint32_t n) {
    static const char *const names[] = {"softmax_xent", "mse"};
    int k = find_name(names, 2, v[0].text);
    if (k < 0) {
        return fail(&p->at, v[0].col, "unknown loss '%.*s'; expected softmax_xent or mse",
                    QUOTE_BYTES, v[0].text);
    }
    p->r->model.loss = k == 0 ? RECIPE_LOSS_SOFTMAX_XENT : RECIPE_LOSS_MSE;
    return expect_end(&p->at, v, n, 1);
}

// ---------------------------------------------------------------------------------------------
// [quant]

static qt_status parse_recipe_key(parser *p, const token *v, uint32_t n) {
    recipe_quant *q = &p->r->quant;
    if (rules_scheme_from_name(v[0].text, &q->builtin)) {
        q->has_builtin = true;
    } else if (strcmp(v[0].text, "none") == 0) {
        q->has_builtin = false;
    } else {
        return fail(&p->at, v[0].col, "unknown built-in recipe '%.*s'; expected one of bf16, "
                    "delayed, current, mxfp8, block, nvfp4, none", QUOTE_BYTES, v[0].text);
    }
    return expect_end(&p->at, v, n, 1);
}

static qt_status parse_weight_transpose_key(parser *p, const token *v, uint32_t n) {
    static const char *const names[RECIPE_WEIGHT_T_COUNT] = {"auto", "stored", "per_step"};
    for (uint32_t i = 0; i < RECIPE_WEIGHT_T_COUNT; i++) {
        if (strcmp(v[0].text, names[i]) == 0) {
            p->r->quant.weight_transpose = (recipe_weight_transpose)i;
            return expect_end(&p->at, v, n, 1);
        }
    }
    return fail(&p->at, v[0].col, "unknown weight_transpose '%.*s'; expected auto, stored or "
                "per_step", QUOTE_BYTES, v[0].text);
}

static qt_status parse_rule_key(parser *p, const token *v, uint32_t n) {
    recipe_quant *q = &p->r->quant;
    if (q->rules_count == RECIPE_RULES_MAX) {
        return fail_capacity(&p->at, v[0].col, "too many rules: rules_max is %d",
                             RECIPE_RULES_MAX);
    }
    QT_TRY(rule_parse_tokens(&p->at, v, n, &q->rules[q->rules_count]));
    q->rules_count++;
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// [data]

static qt_status path_copy(const parser *p, const token *t, char *out) {
    if (t->bytes >= RECIPE_PATH_MAX) {
        return fail(&p->at, t->col, "path too long: expected at most %d bytes, found %u",
                    RECIPE_PATH_MAX - 1, t->bytes);
    }
    memcpy(out, t->text, t->bytes + 1);
    return QT_OK;
}

static qt_status parse_synthetic(parser *p, const token *v, uint32_t n, recipe_source *s) {
    static const char *const teacher[] = {"inputs", "outputs", "samples", "seed", "task"};
    static const char *const classes[] = {"inputs", "classes", "samples", "seed", "task",
                                          "zipf", "spread"};
    if (n < 2 || (strcmp(v[1].text, "teacher") != 0 && strcmp(v[1].text, "classes") != 0)) {
        return fail_expected(&p->at, v, n, 1, "'synthetic teacher' or 'synthetic classes'");
    }
    bool is_teacher = v[1].text[0] == 't';
    const char *const *names = is_teacher ? teacher : classes;
    const char *owner = is_teacher ? "synthetic teacher" : "synthetic classes";
    s->kind = is_teacher ? RECIPE_SOURCE_TEACHER : RECIPE_SOURCE_CLASSES;
    uint32_t seen = 0;
    for (uint32_t i = 2; i < n; i++) {
        uint32_t index;
        token value;
        QT_TRY(option_split(&p->at, &v[i], names, is_teacher ? 5 : 7, owner, &seen, &index,
                            &value));
        if (index == 0) {
            QT_TRY(parse_u32(&p->at, &value, "inputs", 1, RECIPE_FEATURES_MAX, &s->inputs));
        } else if (index == 1) {
            // One class cannot be learned; a teacher may have a single output.
            QT_TRY(parse_u32(&p->at, &value, names[1], is_teacher ? 1 : 2, RECIPE_FEATURES_MAX,
                             &s->outputs));
        } else if (index == 2) {
            QT_TRY(parse_u64(&p->at, &value, "samples", 1, RECIPE_SAMPLES_MAX, &s->samples));
        } else if (index == 3) {
            QT_TRY(parse_u64(&p->at, &value, "seed", 0, UINT64_MAX, &s->seed));
        } else if (index == 4) {
            QT_TRY(parse_u64(&p->at, &value, "task", 0, UINT64_MAX, &s->task));
        } else if (index == 5) {
            QT_TRY(parse_f32(&p->at, &value, "zipf", 0.0f, RECIPE_ZIPF_MAX, RANGE_CLOSED,
                             &s->zipf));
        } else {
            QT_TRY(parse_f32(&p->at, &value, "spread", 0.0f, RECIPE_SPREAD_MAX, RANGE_LO_OPEN,
                             &s->spread));
        }
    }
    // Without task= the seed draws the task too, as it did before the two were separate.
    if (!(seen & (1u << 4))) s->task = s->seed;
    return option_require(&p->at, names, 0x7u, seen, owner);
}

// `idx IMAGES LABELS` and `npy FEATURES LABELS_OR_TARGETS`: two paths.
static qt_status parse_paths(parser *p, const token *v, uint32_t n, const char *usage,
                             recipe_source *s) {
    if (n < 3) return fail(&p->at, p->at.end_col, "expected '%s', found end of line", usage);
    QT_TRY(path_copy(p, &v[1], s->images));
    QT_TRY(path_copy(p, &v[2], s->labels));
    return expect_end(&p->at, v, n, 3);
}

static qt_status parse_source(parser *p, const token *v, uint32_t n, recipe_source *s) {
    memset(s, 0, sizeof *s);
    s->line = p->at.line;
    s->col = v[0].col;
    if (strcmp(v[0].text, "idx") == 0) {
        s->kind = RECIPE_SOURCE_IDX;
        return parse_paths(p, v, n, "idx IMAGES LABELS", s);
    }
    if (strcmp(v[0].text, "npy") == 0) {
        s->kind = RECIPE_SOURCE_NPY;
        return parse_paths(p, v, n, "npy FEATURES LABELS_OR_TARGETS", s);
    }
    if (strcmp(v[0].text, "synthetic") == 0) return parse_synthetic(p, v, n, s);
    return fail(&p->at, v[0].col, "unknown data source '%.*s'; expected idx, npy or synthetic",
                QUOTE_BYTES, v[0].text);
}

// ---------------------------------------------------------------------------------------------
// Lines

static qt_status parse_key_value(parser *p, key_id key, const token *v, uint32_t n) {
    recipe *r = p->r;
    const line_ctx *at = &p->at;
    switch (key) {
    case KEY_INPUT:
        QT_TRY(parse_u32(at, &v[0], "input", 1, RECIPE_FEATURES_MAX, &r->model.input_features));
        return expect_end(at, v, n, 1);
    case KEY_LAYER: return parse_layer(p, v, n);
    case KEY_LOSS: return parse_loss(p, v, n);
    case KEY_RECIPE: return parse_recipe_key(p, v, n);
    case KEY_RULE: return parse_rule_key(p, v, n);
    case KEY_WEIGHT_T: return parse_weight_transpose_key(p, v, n);
    case KEY_TRAIN: return parse_source(p, v, n, &r->data.train);
    case KEY_EVAL: return parse_source(p, v, n, &r->data.eval);
    case KEY_BATCH:
        QT_TRY(parse_u32(at, &v[0], "batch", 1, RECIPE_BATCH_MAX, &r->data.batch));
        return expect_end(at, v, n, 1);
    case KEY_SEED:
        QT_TRY(parse_u64(at, &v[0], "seed", 0, UINT64_MAX, &r->data.seed));
        return expect_end(at, v, n, 1);
    case KEY_RESIDENT:
        if (strcmp(v[0].text, "on") != 0 && strcmp(v[0].text, "off") != 0) {
            return fail(at, v[0].col, "unknown resident '%.*s'; expected off or on",
                        QUOTE_BYTES, v[0].text);
        }
        r->data.resident = strcmp(v[0].text, "on") == 0;
        return expect_end(at, v, n, 1);
    case KEY_COUNT: break;
    }
    QT_ASSERT(!"unreachable");
    return QT_ERR_INPUT;
}

static key_id key_find(const parser *p, const token *t) {
    for (int k = 0; k < KEY_COUNT; k++) {
        if ((int)key_specs[k].section == p->section && strcmp(key_specs[k].name, t->text) == 0) {
            return (key_id)k;
        }
    }
    return KEY_COUNT;
}

static qt_status unknown_key(const parser *p, const token *t) {
    const char *names[KEY_COUNT];
    uint32_t count = 0;
    for (int k = 0; k < KEY_COUNT; k++) {
        if ((int)key_specs[k].section == p->section) names[count++] = key_specs[k].name;
    }
    char expected[128];
    return fail(&p->at, t->col, "unknown key '%.*s' in [%s]; expected %s", QUOTE_BYTES, t->text,
                section_names[p->section], join_names(names, count, expected, sizeof expected));
}

// `key = value...` in [model], [quant] and [data]; the first '=' ends the key.
static qt_status parse_key_line(parser *p, uint32_t first, uint32_t end) {
    char *eq = memchr(p->buf + first, '=', end - first);
    token *t = p->tokens;
    uint32_t eq_index = eq ? (uint32_t)(eq - p->buf) : end;
    QT_TRY(tokenize(&p->at, p->buf, first, eq_index, 1, t, &p->tokens_count));
    if (eq == NULL) {
        return fail(&p->at, t[0].col, "expected 'key = value', found '%.*s'", QUOTE_BYTES,
                    t[0].text);
    }
    if (p->tokens_count == 0) return fail(&p->at, eq_index + 1, "expected a key before '='");
    if (p->tokens_count > 1) {
        return fail(&p->at, t[1].col, "expected one key before '=', found '%.*s' after '%.*s'",
                    QUOTE_BYTES, t[1].text, QUOTE_BYTES, t[0].text);
    }
    QT_TRY(tokenize(&p->at, p->buf, eq_index + 1, end, 1, t, &p->tokens_count));
    key_id key = key_find(p, &t[0]);
    if (key == KEY_COUNT) return unknown_key(p, &t[0]);
    if (!key_specs[key].repeats && p->key_line[key] != 0) {
        return fail(&p->at, t[0].col, "duplicate key '%s'; first given at line %u",
                    key_specs[key].name, p->key_line[key]);
    }
    if (p->tokens_count == 1) {
        return fail(&p->at, p->at.end_col, "expected a value after '%s =', found end of line",
                    key_specs[key].name);
    }
    if (p->key_line[key] == 0) p->key_line[key] = p->at.line;
    return parse_key_value(p, key, t + 1, p->tokens_count - 1);
}

// betas=B1,B2: two numbers in one word.
static qt_status parse_betas(const line_ctx *at, const token *v, recipe_optim *o) {
    const char *comma = strchr(v->text, ',');
    char first[48];
    uint32_t first_bytes = comma ? (uint32_t)(comma - v->text) : 0;
    if (comma == NULL || first_bytes >= sizeof first) {
        return fail(at, v->col, "expected betas=B1,B2, found '%.*s'", QUOTE_BYTES, v->text);
    }
    memcpy(first, v->text, first_bytes);
    first[first_bytes] = '\0';
    token b1 = {first, first_bytes, v->col};
    token b2 = {comma + 1, v->bytes - first_bytes - 1, v->col + first_bytes + 1};
    QT_TRY(parse_f32(at, &b1, "beta1", 0.0f, 1.0f, RANGE_HI_OPEN, &o->beta1));
    return parse_f32(at, &b2, "beta2", 0.0f, 1.0f, RANGE_HI_OPEN, &o->beta2);
}

static qt_status parse_optim_line(parser *p) {
    static const char *const names[] = {"lr", "betas", "eps", "wd", "clip"};
    const token *t = p->tokens;
    recipe_optim *o = &p->r->optim;
    if (p->optim_line != 0) {
        return fail(&p->at, t[0].col, "duplicate optimizer; [optim] takes one line, first at "
                    "line %u", p->optim_line);
    }
    if (strcmp(t[0].text, "adamw") != 0) {
        return fail(&p->at, t[0].col, "unknown optimizer '%.*s'; expected adamw", QUOTE_BYTES,
                    t[0].text);
    }
    p->optim_line = p->at.line;
    uint32_t seen = 0;
    for (uint32_t i = 1; i < p->tokens_count; i++) {
        uint32_t index;
        token v;
        QT_TRY(option_split(&p->at, &t[i], names, 5, "adamw", &seen, &index, &v));
        if (index == 0) QT_TRY(parse_f32(&p->at, &v, "lr", 0.0f, 1e3f, RANGE_CLOSED, &o->lr));
        if (index == 2) QT_TRY(parse_f32(&p->at, &v, "eps", 0.0f, 1.0f, RANGE_LO_OPEN, &o->eps));
        if (index == 3) {
            QT_TRY(parse_f32(&p->at, &v, "wd", 0.0f, 1e3f, RANGE_CLOSED, &o->weight_decay));
        }
        if (index == 4) QT_TRY(parse_f32(&p->at, &v, "clip", 0.0f, 1e30f, RANGE_CLOSED, &o->clip));
        if (index != 1) continue;
        QT_TRY(parse_betas(&p->at, &v, o));
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// [schedule]

// A count's unit at tokens[*i], if there is one: `step`, `steps`, `epoch` or `epochs`.
static bool parse_unit(const parser *p, uint32_t *i, recipe_unit *unit) {
    static const char *const units[] = {"step", "steps", "epoch", "epochs"};
    if (*i >= p->tokens_count) return false;
    int u = find_name(units, 4, p->tokens[*i].text);
    if (u < 0) return false;
    *unit = u < 2 ? RECIPE_UNIT_STEPS : RECIPE_UNIT_EPOCHS;
    (*i)++;
    return true;
}

// Whether tokens[i] starts a learning-rate rule. `warmup` also starts the warmup clause
// (`warmup N steps`); the rule is the form with '->' after its first rate.
static bool is_rule_start(const parser *p, uint32_t i) {
    static const char *const kinds[] = {"constant", "cosine", "decay"};
    const token *t = p->tokens;
    if (i >= p->tokens_count) return false;
    if (find_name(kinds, 3, t[i].text) >= 0) return true;
    return strcmp(t[i].text, "warmup") == 0 && i + 2 < p->tokens_count &&
           strcmp(t[i + 2].text, "->") == 0;
}

// `constant LR`, or `warmup|decay|cosine FROM -> TO`, from tokens[*i].
static qt_status parse_row_rule(parser *p, recipe_row *row, uint32_t *i) {
    const token *t = p->tokens;
    uint32_t n = p->tokens_count, k = *i;
    if (strcmp(t[k].text, "constant") == 0) {
        row->lr_kind = RECIPE_LR_CONSTANT;
        if (k + 1 >= n) return fail_expected(&p->at, t, n, k + 1, "a learning rate after "
                                             "'constant'");
        QT_TRY(parse_f32(&p->at, &t[k + 1], "lr", 0.0f, 1e3f, RANGE_CLOSED, &row->lr_from));
        row->lr_to = row->lr_from;
        *i = k + 2;
        return QT_OK;
    }
    row->lr_kind = t[k].text[0] == 'w' ? RECIPE_LR_WARMUP
                   : t[k].text[0] == 'd' ? RECIPE_LR_DECAY : RECIPE_LR_COSINE;
    if (k + 1 >= n) return fail_expected(&p->at, t, n, k + 1, "a learning rate");
    QT_TRY(parse_f32(&p->at, &t[k + 1], "lr", 0.0f, 1e3f, RANGE_CLOSED, &row->lr_from));
    if (k + 2 >= n || strcmp(t[k + 2].text, "->") != 0) {
        return fail_expected(&p->at, t, n, k + 2, "'->' between the learning rates");
    }
    if (k + 3 >= n) return fail_expected(&p->at, t, n, k + 3, "a learning rate after '->'");
    QT_TRY(parse_f32(&p->at, &t[k + 3], "lr", 0.0f, 1e3f, RANGE_CLOSED, &row->lr_to));
    // The names say the direction, so that a rule reads as what it does.
    if (row->lr_kind == RECIPE_LR_WARMUP && row->lr_from > row->lr_to) {
        return fail(&p->at, t[k].col, "warmup raises the learning rate: expected FROM <= TO, "
                    "found %s -> %s; a falling ramp is 'decay %s -> %s'", t[k + 1].text,
                    t[k + 3].text, t[k + 1].text, t[k + 3].text);
    }
    if (row->lr_kind == RECIPE_LR_DECAY && row->lr_from < row->lr_to) {
        return fail(&p->at, t[k].col, "decay lowers the learning rate: expected FROM >= TO, "
                    "found %s -> %s; a rising ramp is 'warmup %s -> %s'", t[k + 1].text,
                    t[k + 3].text, t[k + 1].text, t[k + 3].text);
    }
    *i = k + 4;
    return QT_OK;
}

// `warmup N [steps|epochs]` from tokens[*i] (the word `warmup` itself).
static qt_status parse_row_warmup(parser *p, recipe_row *row, uint32_t *i) {
    const token *t = p->tokens;
    uint32_t n = p->tokens_count, k = *i + 1;
    if (row->warmup) return fail(&p->at, t[*i].col, "the row has a warmup already");
    row->warmup_col = t[*i].col;
    if (k >= n) return fail_expected(&p->at, t, n, k, "the warmup's length N [steps|epochs]");
    QT_TRY(parse_u32(&p->at, &t[k], "warmup", 1, RECIPE_STEPS_MAX, &row->warmup));
    k++;
    parse_unit(p, &k, &row->warmup_unit);
    if (row->unit == RECIPE_UNIT_STEPS && row->warmup_unit == RECIPE_UNIT_STEPS &&
        row->warmup >= row->steps) {
        return fail(&p->at, t[*i + 1].col, "a warmup of %u steps in a row of %u; expected a "
                    "warmup shorter than its row", row->warmup, row->steps);
    }
    *i = k;
    return QT_OK;
}

// `eval [STEPS|all] [train|eval] every [N] steps|epochs` from tokens[*i] (the word `eval`).
static qt_status parse_row_eval(parser *p, recipe_row *row, uint32_t index, uint32_t *i) {
    static const char *const datasets[] = {"train", "eval"};
    const token *t = p->tokens;
    uint32_t n = p->tokens_count, k = *i + 1;
    if (row->eval_every) return fail(&p->at, t[*i].col, "the row has an eval clause already");
    if (k < n && strcmp(t[k].text, "all") == 0) {
        row->eval_all = true;
        k++;
    } else if (k < n && t[k].text[0] >= '0' && t[k].text[0] <= '9') {
        QT_TRY(parse_u32(&p->at, &t[k], "eval steps", 1, RECIPE_STEPS_MAX, &row->eval_steps));
        k++;
    } else {
        row->eval_all = true;  // one pass over the eval set, like `eval all`
    }
    int d = k < n ? find_name(datasets, 2, t[k].text) : -1;
    if (d >= 0) {
        row->dataset = d == 0 ? RECIPE_DATASET_TRAIN : RECIPE_DATASET_EVAL;
        p->rows_dataset_given |= UINT64_C(1) << index;
        k++;
    }
    if (k >= n || strcmp(t[k].text, "every") != 0) {
        return fail_expected(&p->at, t, n, k, "'every' in 'eval [STEPS|all] [train|eval] every "
                             "[N] steps|epochs'");
    }
    k++;
    row->eval_every = 1;
    if (k < n && t[k].text[0] >= '0' && t[k].text[0] <= '9') {
        QT_TRY(parse_u32(&p->at, &t[k], "eval interval", 1, RECIPE_STEPS_MAX,
                         &row->eval_every));
        k++;
    }
    if (!parse_unit(p, &k, &row->eval_unit)) {
        return fail_expected(&p->at, t, n, k, "steps or epochs after 'every'");
    }
    *i = k;
    return QT_OK;
}

// `train N [steps|epochs] [RULE] [warmup N [steps|epochs]] [eval ... every ...]`, from
// tokens[2]; the clauses after the rule come in any order.
static qt_status parse_train_row(parser *p, recipe_row *row, uint32_t index) {
    const token *t = p->tokens;
    uint32_t n = p->tokens_count, i = 2;
    row->col = t[1].col;
    parse_unit(p, &i, &row->unit);
    if (is_rule_start(p, i)) {
        p->rows_lr_given |= UINT64_C(1) << index;
        QT_TRY(parse_row_rule(p, row, &i));
    }
    while (i < n) {
        if (strcmp(t[i].text, "warmup") == 0) {
            QT_TRY(parse_row_warmup(p, row, &i));
        } else if (strcmp(t[i].text, "eval") == 0) {
            QT_TRY(parse_row_eval(p, row, index, &i));
        } else {
            bool ruled = p->rows_lr_given & (UINT64_C(1) << index);
            return fail_expected(&p->at, t, n, i, ruled ? "a warmup clause (warmup N steps), "
                                 "an eval clause (eval every N epochs) or end of line"
                                 : "a learning-rate rule (constant, warmup, decay, cosine), a "
                                 "warmup clause, an eval clause or end of line");
        }
    }
    return QT_OK;
}

// An infer row's `output=FILE` and `argmax`, from tokens[first]: the file gets the row's outputs.
static qt_status parse_row_output(parser *p, recipe_row *row, uint32_t first) {
    static const char *const names[] = {"output"};
    const token *t = p->tokens;
    uint32_t n = p->tokens_count, seen = 0, argmax_col = 0;
    for (uint32_t i = first; i < n; i++) {
        if (strcmp(t[i].text, "argmax") == 0) {
            if (row->argmax) return fail(&p->at, t[i].col, "option 'argmax' given twice");
            row->argmax = true;
            argmax_col = t[i].col;
            continue;
        }
        if (strchr(t[i].text, '=') == NULL) {
            return fail_expected(&p->at, t, n, i, first == 2 ? "train, eval, output=FILE, argmax "
                                 "or end of line" : "output=FILE, argmax or end of line");
        }
        uint32_t index;
        token value;
        QT_TRY(option_split(&p->at, &t[i], names, 1, "infer", &seen, &index, &value));
        QT_TRY(path_copy(p, &value, row->output));
        for (uint32_t j = 0; j < p->r->rows_count; j++) {
            if (strcmp(p->r->rows[j].output, row->output) == 0) {
                return fail(&p->at, value.col, "output file '%s' is also written by the infer "
                            "row of line %u; expected one file per row", row->output,
                            p->r->rows[j].line);
            }
        }
    }
    if (row->argmax && row->output[0] == '\0') {
        return fail(&p->at, argmax_col, "argmax applies to the file of output=FILE; expected "
                    "output=FILE on this row");
    }
    return QT_OK;
}

// `repeat N`: the rows since the previous repeat run N times in all. An infer row that writes a
// file cannot repeat (each time would replace the file), and the expanded schedule keeps within
// RECIPE_EXPANDED_ROWS_MAX rows (the run's table is sized from it).
static qt_status parse_repeat(parser *p) {
    recipe *r = p->r;
    const token *t = p->tokens;
    uint32_t n = p->tokens_count;
    if (r->repeats_count == RECIPE_SCHEDULE_ROWS_MAX) {
        return fail_capacity(&p->at, t[0].col, "too many repeats: schedule_rows_max is %d",
                             RECIPE_SCHEDULE_ROWS_MAX);
    }
    uint32_t first = 0;
    if (r->repeats_count > 0) {
        const recipe_repeat *last = &r->repeats[r->repeats_count - 1];
        first = last->first_row + last->row_count;
    }
    if (first == r->rows_count) {
        return fail(&p->at, t[0].col, "repeat has no rows to repeat; expected train, eval or "
                    "infer rows since the start of [schedule] or the previous repeat");
    }
    if (n < 2) return fail_expected(&p->at, t, n, 1, "the number of times");
    uint32_t times = 0;
    QT_TRY(parse_u32(&p->at, &t[1], "times", 1, RECIPE_EXPANDED_ROWS_MAX, &times));
    QT_TRY(expect_end(&p->at, t, n, 2));
    for (uint32_t i = first; i < r->rows_count && times > 1; i++) {
        if (r->rows[i].output[0] != '\0') {
            return fail(&p->at, t[1].col, "the infer row of line %u writes output=FILE, which "
                        "%u repeats would write %u times; expected no output= in a repeated "
                        "row", r->rows[i].line, times, times);
        }
    }
    uint32_t block = r->rows_count - first;
    uint64_t expanded = (uint64_t)r->expanded_rows + (uint64_t)block * (times - 1);
    if (expanded > RECIPE_EXPANDED_ROWS_MAX) {
        return fail_capacity(&p->at, t[1].col, "the schedule repeats to %llu rows: "
                             "expanded_rows_max is %u", (unsigned long long)expanded,
                             RECIPE_EXPANDED_ROWS_MAX);
    }
    r->expanded_rows = (uint32_t)expanded;
    r->repeats[r->repeats_count++] = (recipe_repeat){first, block, times, p->at.line};
    return QT_OK;
}

static qt_status parse_row(parser *p) {
    static const char *const modes[] = {"train", "eval", "infer"};
    static const char *const datasets[] = {"train", "eval"};
    recipe *r = p->r;
    const token *t = p->tokens;
    uint32_t n = p->tokens_count, index = r->rows_count;
    if (strcmp(t[0].text, "repeat") == 0) return parse_repeat(p);
    if (index == RECIPE_SCHEDULE_ROWS_MAX) {
        return fail_capacity(&p->at, t[0].col, "too many schedule rows: schedule_rows_max is %d",
                             RECIPE_SCHEDULE_ROWS_MAX);
    }
    int m = find_name(modes, 3, t[0].text);
    if (m < 0) {
        return fail(&p->at, t[0].col, "unknown schedule row '%.*s'; expected train, eval, "
                    "infer or repeat", QUOTE_BYTES, t[0].text);
    }
    if (r->expanded_rows == RECIPE_EXPANDED_ROWS_MAX) {
        return fail_capacity(&p->at, t[0].col, "the schedule has %u rows with its repeats: "
                             "expanded_rows_max is %u", r->expanded_rows,
                             RECIPE_EXPANDED_ROWS_MAX);
    }
    recipe_row *row = &r->rows[index];
    memset(row, 0, sizeof *row);
    row->mode = (recipe_mode)m;
    row->line = p->at.line;
    if (n < 2) {
        return fail_expected(&p->at, t, n, 1, m == 0 ? "the number of steps or epochs"
                                                       : "the number of steps or 'all'");
    }
    if (m != RECIPE_MODE_TRAIN && strcmp(t[1].text, "all") == 0) {
        row->all = true;
    } else {
        QT_TRY(parse_u32(&p->at, &t[1], "steps", 1, RECIPE_STEPS_MAX, &row->steps));
    }
    if (m == RECIPE_MODE_TRAIN) {
        QT_TRY(parse_train_row(p, row, index));
    } else {
        uint32_t next = 2;
        int d = n > 2 ? find_name(datasets, 2, t[2].text) : -1;
        if (d >= 0) {
            row->dataset = d == 0 ? RECIPE_DATASET_TRAIN : RECIPE_DATASET_EVAL;
            p->rows_dataset_given |= UINT64_C(1) << index;
            next = 3;
        }
        if (m == RECIPE_MODE_INFER) QT_TRY(parse_row_output(p, row, next));
        if (m == RECIPE_MODE_EVAL && next < n) {
            if (d >= 0) return expect_end(&p->at, t, n, next);
            return fail_expected(&p->at, t, n, next, "train, eval or end of line");
        }
    }
    r->rows_count++;
    r->expanded_rows++;
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Lines

static qt_status parse_header(parser *p, uint32_t first, uint32_t end) {
    char *buf = p->buf;
    uint32_t close = first + 1;
    while (close < end && buf[close] != ']') close++;
    if (close == end) {
        return fail(&p->at, p->at.end_col, "expected ']' to end the section header, found end "
                    "of line");
    }
    if (close + 1 < end) {
        QT_TRY(tokenize(&p->at, buf, close + 1, end, 1, p->tokens, &p->tokens_count));
        return expect_end(&p->at, p->tokens, p->tokens_count, 0);
    }
    buf[close] = '\0';
    const char *name = buf + first + 1;
    int s = find_name(section_names, RECIPE_SECTION_COUNT, name);
    if (s < 0) {
        return fail(&p->at, first + 1, "unknown section [%.*s]; expected [model], [quant], "
                    "[optim], [data] or [schedule]", QUOTE_BYTES, name);
    }
    if (p->section_line[s] != 0) {
        return fail(&p->at, first + 1, "duplicate section [%s]; first given at line %u", name,
                    p->section_line[s]);
    }
    p->section = s;
    p->section_line[s] = p->at.line;
    return QT_OK;
}

// Length of the line without its comment and trailing blanks. '#' starts a comment at the start
// of a line or after a blank, so that paths and names may contain it.
static uint32_t content_end(const char *buf, uint32_t bytes) {
    uint32_t end = bytes;
    for (uint32_t i = 0; i < bytes; i++) {
        if (buf[i] == '#' && (i == 0 || is_blank(buf[i - 1]))) {
            end = i;
            break;
        }
    }
    while (end > 0 && is_blank(buf[end - 1])) end--;
    return end;
}

static qt_status parse_line(parser *p, const char *raw, size_t bytes) {
    if (bytes > 0 && raw[bytes - 1] == '\r') bytes--;
    if (bytes > RECIPE_LINE_BYTES_MAX) {
        return fail(&p->at, RECIPE_LINE_BYTES_MAX + 1, "line too long: expected at most %d "
                    "bytes, found %zu", RECIPE_LINE_BYTES_MAX, bytes);
    }
    for (size_t i = 0; i < bytes; i++) {
        unsigned char c = (unsigned char)raw[i];
        if ((c < 0x20 && c != '\t') || c == 0x7F) {
            return fail(&p->at, (uint32_t)i + 1, "unexpected control byte 0x%02X; expected text",
                        c);
        }
    }
    memcpy(p->buf, raw, bytes);
    uint32_t end = content_end(p->buf, (uint32_t)bytes);
    p->buf[end] = '\0';
    p->at.end_col = end + 1;
    p->tokens_count = 0;
    uint32_t first = 0;
    while (first < end && is_blank(p->buf[first])) first++;
    if (first == end) return QT_OK;
    if (p->buf[first] == '[') return parse_header(p, first, end);
    if (p->section < 0 || p->section == RECIPE_SECTION_OPTIM ||
        p->section == RECIPE_SECTION_SCHEDULE) {
        QT_TRY(tokenize(&p->at, p->buf, first, end, 1, p->tokens, &p->tokens_count));
    }
    if (p->section < 0) {
        return fail(&p->at, p->tokens[0].col, "expected a section header such as [model], "
                    "found '%.*s'", QUOTE_BYTES, p->tokens[0].text);
    }
    if (p->section == RECIPE_SECTION_OPTIM) return parse_optim_line(p);
    if (p->section == RECIPE_SECTION_SCHEDULE) return parse_row(p);
    return parse_key_line(p, first, end);
}

// ---------------------------------------------------------------------------------------------
// Whole-file checks, once every line is read

static qt_status fail_layer(const parser *p, const recipe_layer *l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static qt_status fail_layer(const parser *p, const recipe_layer *l, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    qt_status s = fail_v(QT_ERR_INPUT, p->at.file, l->line, l->col, fmt, args);
    va_end(args);
    return s;
}

static qt_status finish_sections(const parser *p) {
    for (int s = 0; s < RECIPE_SECTION_COUNT; s++) {
        if (p->section_line[s] == 0) {
            return fail(&p->at, p->at.end_col, "missing section [%s]; expected [model], [quant], "
                        "[optim], [data] and [schedule], found no [%s]", section_names[s],
                        section_names[s]);
        }
    }
    for (int k = 0; k < KEY_COUNT; k++) {
        const key_spec *spec = &key_specs[k];
        if (spec->required && p->key_line[k] == 0) {
            return recipe_fail_at(QT_ERR_INPUT, p->at.file, p->section_line[spec->section], 1,
                                  "[%s] has no '%s'; expected %s", section_names[spec->section],
                                  spec->name, spec->usage);
        }
    }
    if (p->optim_line == 0) {
        return recipe_fail_at(QT_ERR_INPUT, p->at.file, p->section_line[RECIPE_SECTION_OPTIM],
                              1, "[optim] has no optimizer; expected adamw [lr=F] [betas=F,F] "
                              "[eps=F] [wd=F] [clip=F]");
    }
    if (p->r->rows_count == 0) {
        return recipe_fail_at(QT_ERR_INPUT, p->at.file,
                              p->section_line[RECIPE_SECTION_SCHEDULE], 1, "[schedule] has no "
                              "rows; expected train N, eval N or infer N");
    }
    return QT_OK;
}

// Widths of every layer, residual blocks, and the number of quantized tensors.
static qt_status finish_model(const parser *p) {
    recipe_model *m = &p->r->model;
    if (p->residual_depth > 0) {
        return fail_layer(p, &m->layers[p->residual_open[p->residual_depth - 1]],
                          "residual begin has no matching 'residual end'; expected one before "
                          "the end of [model]");
    }
    uint32_t width = m->input_features, roles = 0, gemms = 0;
    for (uint32_t i = 0; i < m->layers_count; i++) {
        recipe_layer *l = &m->layers[i];
        l->in_features = width;
        if (l->kind == RECIPE_LAYER_LINEAR) width = l->out_features;
        if (l->kind == RECIPE_LAYER_SWIGLU) {
            if (width % 2 != 0) {
                return fail_layer(p, l, "swiglu halves its input: expected an even width, "
                                  "found %u", width);
            }
            width /= 2;
        }
        if (l->kind == RECIPE_LAYER_RESIDUAL_END && m->layers[l->match].in_features != width) {
            return fail_layer(p, l, "residual block (begin at line %u) changes the width from %u "
                              "to %u; expected the same width at its end",
                              m->layers[l->match].line, m->layers[l->match].in_features, width);
        }
        if (l->recompute && (i + 1 == m->layers_count ||
                             m->layers[i + 1].kind != RECIPE_LAYER_LINEAR)) {
            return fail_layer(p, l, "'recompute' makes the output again for the weight gradient "
                              "of the linear right after the activation; expected a linear "
                              "next, found %s", i + 1 == m->layers_count ? "the end of [model]"
                              : recipe_layer_kind_name(m->layers[i + 1].kind));
        }
        l->out_features = width;
        roles += l->kind == RECIPE_LAYER_LINEAR ? 3 : l->kind == RECIPE_LAYER_MOE ? 9 : 0;
        gemms += l->kind == RECIPE_LAYER_LINEAR || l->kind == RECIPE_LAYER_MOE;
        if (roles > RECIPE_ROLES_MAX) {
            return recipe_fail_at(QT_ERR_CAPACITY, p->at.file, l->line, l->col, "too many "
                                  "quantized tensors: roles_max is %d (3 per linear, 9 per moe)",
                                  RECIPE_ROLES_MAX);
        }
    }
    m->output_features = width;
    if (gemms == 0) {
        return recipe_fail_at(QT_ERR_INPUT, p->at.file, p->section_line[RECIPE_SECTION_MODEL], 1,
                              "[model] has no linear or moe layer; expected at least one layer "
                              "with weights");
    }
    return QT_OK;
}

static qt_status check_source(const parser *p, const recipe_source *s) {
    static const char *const kinds[] = {"none", "idx", "synthetic teacher", "synthetic classes",
                                        "npy"};
    const recipe_model *m = &p->r->model;
    const char *file = p->at.file;
    // An .npy pair holds labels or targets, and its widths, as its files say: runtime/io/data.c
    // checks them against the model and the loss when it reads the headers.
    if (s->kind == RECIPE_SOURCE_NPY) return QT_OK;
    bool labels = s->kind == RECIPE_SOURCE_IDX || s->kind == RECIPE_SOURCE_CLASSES;
    if (m->loss == RECIPE_LOSS_SOFTMAX_XENT && !labels) {
        return recipe_fail_at(QT_ERR_INPUT, file, s->line, s->col, "loss softmax_xent needs class "
                              "labels (idx, npy or synthetic classes), found %s", kinds[s->kind]);
    }
    if (m->loss == RECIPE_LOSS_MSE && labels) {
        return recipe_fail_at(QT_ERR_INPUT, file, s->line, s->col, "loss mse needs regression "
                              "targets (npy or synthetic teacher), found %s", kinds[s->kind]);
    }
    if (s->kind == RECIPE_SOURCE_IDX) return QT_OK;  // widths are known once the files are read
    if (s->inputs != m->input_features) {
        return recipe_fail_at(QT_ERR_INPUT, file, s->line, s->col, "%s gives %u inputs; expected "
                              "%u, the model's input", kinds[s->kind], s->inputs,
                              m->input_features);
    }
    if (s->outputs != m->output_features) {
        return recipe_fail_at(QT_ERR_INPUT, file, s->line, s->col, "%s gives %u %s; expected %u, "
                              "the width of the last layer", kinds[s->kind], s->outputs,
                              s->kind == RECIPE_SOURCE_TEACHER ? "outputs" : "classes",
                              m->output_features);
    }
    return QT_OK;
}

static qt_status finish_data(const parser *p) {
    const recipe *r = p->r;
    if (r->model.loss == RECIPE_LOSS_SOFTMAX_XENT && r->model.output_features < 2) {
        return recipe_fail_at(QT_ERR_INPUT, p->at.file, p->key_line[KEY_LOSS], 1, "softmax_xent "
                              "needs at least 2 classes; expected a last layer of width >= 2, "
                              "found %u", r->model.output_features);
    }
    if (r->data.train.kind != RECIPE_SOURCE_NONE) QT_TRY(check_source(p, &r->data.train));
    if (r->data.eval.kind != RECIPE_SOURCE_NONE) QT_TRY(check_source(p, &r->data.eval));
    // The device gathers a step's rows by the train feed's indices: without a train source the
    // embedder gives every training batch whole, and the key would change nothing.
    if (r->data.resident && r->data.train.kind == RECIPE_SOURCE_NONE) {
        return recipe_fail_at(QT_ERR_INPUT, p->at.file, p->key_line[KEY_RESIDENT], 1,
                              "resident = on keeps the train and eval datasets on the device, "
                              "but [data] names no train source (the embedder gives the "
                              "batches); expected 'train = SOURCE' or no resident line");
    }
    return QT_OK;
}

// Without a train source the embedder gives the batches, and nothing measures the train set:
// a pass over it (`all`) and an epoch of it have no length, so a row must count steps.
static qt_status check_train_size(const parser *p, const recipe_row *row) {
    const recipe *r = p->r;
    if (r->data.train.kind != RECIPE_SOURCE_NONE) return QT_OK;
    bool train = row->mode == RECIPE_MODE_TRAIN;
    bool epochs = train && (row->unit == RECIPE_UNIT_EPOCHS ||
                            (row->warmup && row->warmup_unit == RECIPE_UNIT_EPOCHS) ||
                            (row->eval_every && row->eval_unit == RECIPE_UNIT_EPOCHS));
    bool pass = (train ? row->eval_every && row->eval_all : row->all) &&
                row->dataset == RECIPE_DATASET_TRAIN;
    if (!epochs && !pass) return QT_OK;
    return recipe_fail_at(QT_ERR_INPUT, p->at.file, row->line, 1, "the row %s the train "
                          "dataset, which [data] does not name (the embedder gives the "
                          "batches); expected 'train = SOURCE' or a length in steps",
                          epochs ? "counts epochs of" : "makes a pass (all) over");
}

// Fills in the defaults that depend on other sections and checks eval rows have data.
static qt_status finish_schedule(const parser *p) {
    recipe *r = p->r;
    bool has_eval = r->data.eval.kind != RECIPE_SOURCE_NONE;
    for (uint32_t i = 0; i < r->rows_count; i++) {
        recipe_row *row = &r->rows[i];
        uint64_t bit = UINT64_C(1) << i;
        if (row->mode == RECIPE_MODE_TRAIN) {
            if (!(p->rows_lr_given & bit)) {
                row->lr_kind = RECIPE_LR_CONSTANT;
                row->lr_from = row->lr_to = r->optim.lr;
            }
            if (!row->eval_every) {
                QT_TRY(check_train_size(p, row));
                continue;
            }
        }
        if (!(p->rows_dataset_given & bit)) {
            bool eval_set = has_eval || row->mode != RECIPE_MODE_INFER;
            row->dataset = eval_set ? RECIPE_DATASET_EVAL : RECIPE_DATASET_TRAIN;
        }
        if (row->dataset == RECIPE_DATASET_EVAL && !has_eval) {
            if (row->mode == RECIPE_MODE_TRAIN) {
                return recipe_fail_at(QT_ERR_INPUT, p->at.file, row->line, 1, "the row's eval "
                                      "clause reads the eval dataset; expected 'eval = SOURCE' "
                                      "in [data] or 'eval ... train every ...', found no eval "
                                      "source");
            }
            const char *mode = row->mode == RECIPE_MODE_EVAL ? "eval" : "infer";
            return recipe_fail_at(QT_ERR_INPUT, p->at.file, row->line, 1, "%s row reads the eval "
                                  "dataset; expected 'eval = SOURCE' in [data] or '%s N train', "
                                  "found no eval source", mode, mode);
        }
        QT_TRY(check_train_size(p, row));
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Entry points

qt_status recipe_parse(const char *text, size_t bytes, const char *file_name, recipe *out) {
    QT_ASSERT(out != NULL && file_name != NULL && (text != NULL || bytes == 0));
    memset(out, 0, sizeof *out);
    snprintf(out->file_name, sizeof out->file_name, "%s", file_name);
    out->optim = (recipe_optim){RECIPE_OPTIM_ADAMW, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.0f};
    parser p;
    memset(&p, 0, sizeof p);
    p.at.file = out->file_name;
    p.r = out;
    p.section = -1;
    size_t pos = 0, last_bytes = 0;
    bool ended_with_newline = true;
    while (pos < bytes) {
        if (p.at.line == UINT32_MAX - 1) {
            return fail(&p.at, 1, "too many lines: expected at most %u", UINT32_MAX - 1);
        }
        p.at.line++;
        const char *start = text + pos;
        const char *newline = memchr(start, '\n', bytes - pos);
        last_bytes = newline ? (size_t)(newline - start) : bytes - pos;
        ended_with_newline = newline != NULL;
        QT_TRY(parse_line(&p, start, last_bytes));
        pos += last_bytes + (newline ? 1 : 0);
    }
    // "Missing" errors point at the end of the file.
    if (ended_with_newline) {
        p.at.line++;
        p.at.end_col = 1;
    } else {
        p.at.end_col = (uint32_t)last_bytes + 1;
    }
    QT_TRY(finish_sections(&p));
    QT_TRY(finish_model(&p));
    QT_TRY(finish_data(&p));
    QT_TRY(finish_schedule(&p));
    return recipe_check_roles(out);
}

qt_status recipe_load(const char *path, char *buffer, size_t buffer_bytes, recipe *out) {
    QT_ASSERT(path != NULL && buffer != NULL && out != NULL);
    size_t used = 0;
    QT_TRY(input_file_read(path, "recipe", buffer, buffer_bytes, &used));
    return recipe_parse(buffer, used, path, out);
}

// ---------------------------------------------------------------------------------------------
// Roles: each GEMM's quantized tensors resolved through the recipe's rules and its built-in
// recipe (recipes/rules.h holds the rules' tables and matching; the parse checks every role).

// Appends to a message being built in buf, never past its end.
static void roles_append(char *buf, size_t buf_bytes, size_t *used, const char *fmt, ...) {
    if (*used >= buf_bytes) return;
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(buf + *used, buf_bytes - *used, fmt, args);
    va_end(args);
    if (n > 0) *used += (size_t)n;
}

// A built-in rule, parsed. The lists are constants that test_recipe parses one by one, so a
// failure here is a programmer error.
static void builtin_rule(qt_scheme scheme, size_t index, qt_rule *rule) {
    const char *text = rules_builtin_text(scheme, index);
    qt_status status = recipe_rule_parse(text, strlen(text), "built-in", (uint32_t)index + 1, 1,
                                         rule);
    QT_ASSERT(status == QT_OK);
    rule->line = 0;
}

// The position of the layer that owns a role: the name up to its first '.'.
static const recipe_layer *role_layer(const recipe *r, const qt_role *role) {
    const char *dot = strchr(role->name, '.');
    size_t bytes = dot ? (size_t)(dot - role->name) : strlen(role->name);
    return recipe_layer_find(r, role->name, bytes);
}

// Fails at the option's position in the file, or, for a built-in rule, at the role's layer.
static qt_status fail_option(const recipe *r, const qt_rule *rule, qt_rule_option opt,
                             const qt_role *role, const char *what) {
    char role_text[96];
    rules_role_format(role, role_text, sizeof role_text);
    uint32_t line = rule->line, col = rule->option_col[opt];
    const recipe_layer *l = role_layer(r, role);
    if (line == 0 && l != NULL) {
        line = l->line;
        col = l->col;
    }
    return recipe_fail_at(QT_ERR_INPUT, r->file_name, line, col, "unsupported combination: %s, "
                          "found on %s (rule %s.%s@%s)", what, role_text, rule->module_glob,
                          rule->tensor_glob, rule->name_glob);
}

// A matched rule applied to a role: the scheme's defaults for the tensor type, the rule's options
// over them, then the checks that need the role.
static qt_status rule_apply(const recipe *r, const qt_rule *rule, uint32_t index,
                            const qt_role *role, qt_quantizer *out) {
    qt_quantizer q = rules_scheme_defaults(rule->scheme, role->tensor_type);
    const qt_quantizer *v = &rule->values;
    uint32_t set = rule->set;
    if (set & (1u << QT_OPTION_ELEM)) q.elem = v->elem;
    if (set & (1u << QT_OPTION_MARGIN)) q.margin = v->margin;
    if (set & (1u << QT_OPTION_HISTORY)) q.history_len = v->history_len;
    if (set & (1u << QT_OPTION_ALGO)) q.amax_algo = v->amax_algo;
    if (set & (1u << QT_OPTION_POW2)) q.pow2 = v->pow2;
    if (set & (1u << QT_OPTION_EPS)) q.amax_eps = v->amax_eps;
    if (set & (1u << QT_OPTION_SR)) q.sr = v->sr;
    if (set & (1u << QT_OPTION_2D)) q.two_d = v->two_d;
    if (set & (1u << QT_OPTION_RHT)) q.rht = v->rht;
    rules_quantizer_finish(&q);
    q.rule_line = rule->line;
    q.rule_index = index;
    // 2-D tiles serve W and its transpose alike; activations and
    // gradients are 1-D in every reference recipe, and 2-D x 2-D block GEMMs are refused there.
    if (q.two_d && role->tensor_type != QT_TENSOR_WEIGHT) {
        return fail_option(r, rule, QT_OPTION_2D, role, "2d=1 applies to weights");
    }
    // RHT cancels only in the wgrad GEMM, whose operands are the columnwise copies of input and
    // grad_output; a weight's columnwise copy feeds dgrad, where it would not.
    if (q.rht && role->tensor_type == QT_TENSOR_WEIGHT) {
        return fail_option(r, rule, QT_OPTION_RHT, role,
                           "rht=1 applies to input and grad_output (the wgrad operands)");
    }
    *out = q;
    return QT_OK;
}

static qt_status unresolved(const recipe *r, const qt_role *role) {
    char role_text[96], tried[640];
    rules_role_format(role, role_text, sizeof role_text);
    size_t used = 0;
    tried[0] = '\0';
    for (uint32_t i = 0; i < r->quant.rules_count; i++) {
        const qt_rule *rule = &r->quant.rules[i];
        if (used + 160 > sizeof tried) {
            roles_append(tried, sizeof tried, &used, ", ... (%u rules in all)",
                         r->quant.rules_count);
            break;
        }
        roles_append(tried, sizeof tried, &used, "%s%s.%s@%s (line %u)", i == 0 ? "" : ", ",
               rule->module_glob, rule->tensor_glob, rule->name_glob, rule->line);
    }
    if (r->quant.rules_count == 0) roles_append(tried, sizeof tried, &used, "no rules of the file");
    char builtin_text[64];
    if (r->quant.has_builtin) {
        snprintf(builtin_text, sizeof builtin_text, "the built-in recipe %s",
                 rules_scheme_name(r->quant.builtin));
    } else {
        snprintf(builtin_text, sizeof builtin_text, "no built-in rules (recipe = none)");
    }
    const recipe_layer *l = role_layer(r, role);
    if (l == NULL) {  // a role the caller made up: there is no layer to point at
        return qt_fail(QT_ERR_INPUT, "%s: no rule matches role %s; expected a rule for it, "
                       "tried %s and %s", r->file_name, role_text, tried, builtin_text);
    }
    return recipe_fail_at(QT_ERR_INPUT, r->file_name, l->line, l->col, "no rule matches role %s; "
                          "expected a rule for it, tried %s and %s", role_text, tried,
                          builtin_text);
}

qt_status recipe_resolve_role(const recipe *r, qt_role role, qt_quantizer *out) {
    QT_ASSERT(r != NULL && out != NULL);
    QT_ASSERT((unsigned)role.module_type < QT_MODULE_COUNT);
    QT_ASSERT((unsigned)role.tensor_type < QT_TENSOR_COUNT);
    QT_ASSERT(memchr(role.name, '\0', sizeof role.name) != NULL);
    for (uint32_t i = 0; i < r->quant.rules_count; i++) {
        if (rules_match(&r->quant.rules[i], &role)) {
            return rule_apply(r, &r->quant.rules[i], i, &role, out);
        }
    }
    if (r->quant.has_builtin) {
        for (size_t i = 0; i < rules_builtin_count(r->quant.builtin); i++) {
            qt_rule rule;
            builtin_rule(r->quant.builtin, i, &rule);
            if (rules_match(&rule, &role)) return rule_apply(r, &rule, (uint32_t)i, &role, out);
        }
    }
    return unresolved(r, &role);
}

// ---------------------------------------------------------------------------------------------
// The roles of a model

static uint32_t layer_roles(const recipe_layer *l) {
    if (l->kind == RECIPE_LAYER_LINEAR) return 3;
    if (l->kind == RECIPE_LAYER_MOE) return 9;
    return 0;
}

bool recipe_roles_next(const recipe *r, recipe_role_iter *iter, qt_role *role,
                      uint32_t *layer_index) {
    QT_ASSERT(r != NULL && iter != NULL && role != NULL);
    static const char *const moe_gemms[3] = {"router", "fc1", "fc2"};
    while (iter->layer_index < r->model.layers_count) {
        const recipe_layer *l = &r->model.layers[iter->layer_index];
        if (iter->role_index >= layer_roles(l)) {
            iter->layer_index++;
            iter->role_index = 0;
            continue;
        }
        uint32_t gemm = iter->role_index / 3;
        memset(role, 0, sizeof *role);
        role->tensor_type = (qt_tensor_type)(iter->role_index % 3);
        if (l->kind == RECIPE_LAYER_LINEAR) {
            role->module_type = QT_MODULE_LINEAR;
            snprintf(role->name, sizeof role->name, "%s", l->name);
        } else {
            role->module_type = gemm == 0 ? QT_MODULE_ROUTER : QT_MODULE_GROUPED_LINEAR;
            snprintf(role->name, sizeof role->name, "%s.%s", l->name, moe_gemms[gemm]);
        }
        if (layer_index != NULL) *layer_index = iter->layer_index;
        iter->role_index++;
        return true;
    }
    return false;
}

size_t recipe_roles_count(const recipe *r) {
    QT_ASSERT(r != NULL);
    size_t count = 0;
    for (uint32_t i = 0; i < r->model.layers_count; i++) count += layer_roles(&r->model.layers[i]);
    return count;
}

// A rule of the file that matches no role of the model is a mistake (a misspelt layer name, a
// layer that was removed) that would otherwise pass silently while another rule quantizes the
// layer it meant.
static qt_status recipe_check_rules_used(const recipe *r) {
    for (uint32_t i = 0; i < r->quant.rules_count; i++) {
        const qt_rule *rule = &r->quant.rules[i];
        recipe_role_iter iter = {0, 0};
        qt_role role;
        bool used = false;
        while (!used && recipe_roles_next(r, &iter, &role, NULL)) used = rules_match(rule, &role);
        if (used) continue;
        char roles[512];
        size_t n = 0;
        roles[0] = '\0';
        iter = (recipe_role_iter){0, 0};
        while (recipe_roles_next(r, &iter, &role, NULL)) {
            if (role.tensor_type != QT_TENSOR_INPUT) continue;  // one entry per GEMM
            if (n + 80 > sizeof roles) {
                roles_append(roles, sizeof roles, &n, ", ...");
                break;
            }
            roles_append(roles, sizeof roles, &n, "%s%s.*@%s", n ? ", " : "",
                   rules_module_type_name(role.module_type), role.name);
        }
        return recipe_fail_at(QT_ERR_INPUT, r->file_name, rule->line, rule->col, "rule %s.%s@%s "
                              "-> %s matches no role of the model; expected a pattern that "
                              "matches one of its roles (%s), or no such rule",
                              rule->module_glob, rule->tensor_glob, rule->name_glob,
                              rules_scheme_name(rule->scheme), roles);
    }
    return QT_OK;
}

qt_status recipe_check_roles(const recipe *r) {
    QT_ASSERT(r != NULL);
    QT_TRY(recipe_check_rules_used(r));
    recipe_role_iter iter = {0, 0};
    qt_role role;
    while (recipe_roles_next(r, &iter, &role, NULL)) {
        qt_quantizer q;
        QT_TRY(recipe_resolve_role(r, role, &q));
    }
    return QT_OK;
}

qt_status recipe_resolve_roles(const recipe *r, qt_role_quantizer *out, size_t out_max,
                              size_t *out_count) {
    QT_ASSERT(r != NULL && out_count != NULL && (out != NULL || out_max == 0));
    recipe_role_iter iter = {0, 0};
    qt_role role;
    uint32_t layer_index;
    *out_count = 0;
    while (recipe_roles_next(r, &iter, &role, &layer_index)) {
        if (*out_count == out_max) {
            return qt_fail(QT_ERR_CAPACITY, "%s: the model has %zu roles; the table given holds "
                           "%zu", r->file_name, recipe_roles_count(r), out_max);
        }
        qt_role_quantizer *entry = &out[*out_count];
        entry->role = role;
        entry->layer_index = layer_index;
        QT_TRY(recipe_resolve_role(r, role, &entry->quantizer));
        (*out_count)++;
    }
    return QT_OK;
}
