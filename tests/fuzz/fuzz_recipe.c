// Fuzz harness of the recipe parser (recipes/recipe.h), then of the planning it feeds: any bytes
// either parse or are refused with a status of the parser's and a message that starts with
// file:line:col; a recipe that parses resolves every role, and one on synthetic data that is not
// too large to plan quickly goes through run_measure and run_plan (the counting pass and the
// real one must agree, which run_plan asserts).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "recipes/recipe.h"
#include "runtime/run/run.h"

const char *const fuzz_words[] = {
    "[model]\n", "[quant]\n", "[optim]\n", "[data]\n", "[schedule]\n", "input = ", "layer = ",
    "linear fc1 16 bias\n", "linear head 4\n", "gelu\n", "relu\n", "silu\n", "swiglu\n",
    "rmsnorm", " eps=", "residual begin\n", "residual end\n", "moe m experts=2 topk=1 hidden=8",
    "loss = softmax_xent\n", "loss = mse\n", "recipe = ", "bf16", "delayed", "current", "mxfp8",
    "block", "nvfp4", "none", "rule = ", "linear.input@", "linear.weight@*", "linear.grad_output@",
    " -> ", " e5m2", " margin=", " history=", " algo=most_recent", " pow2=0", " sr=1", " 2d=1",
    " rht=1", "adamw", " lr=", " betas=0.9,0.99", " clip=", "train = ", "eval = ",
    "synthetic classes inputs=16 classes=4 samples=", "synthetic teacher inputs=16 outputs=4 ",
    "samples=", " seed=", "batch = ", "seed = ", "train ", "eval ", "infer ", " all", " train",
    " eval", " output=x.npy", " argmax", "warmup 1e-3 -> 1e-4", "cosine 1 -> 0", "constant 1",
    "repeat ", "4294967295", "4294967296", "1048576", "65536", "0", "-1", "1e-40", "nan", "inf",
    "\r\n", "\t", " # ", "\xef\xbb\xbf", "\xc2\xa0", "\r",
};
const size_t fuzz_words_count = sizeof fuzz_words / sizeof fuzz_words[0];

static recipe the_recipe;
static run the_run;

// Synthetic data (nothing to read) and a model small enough to plan in well under a second.
static bool plannable(const recipe *r) {
    if (r->data.train.kind != RECIPE_SOURCE_TEACHER &&
        r->data.train.kind != RECIPE_SOURCE_CLASSES) {
        return false;
    }
    if (r->data.eval.kind == RECIPE_SOURCE_IDX || r->data.eval.kind == RECIPE_SOURCE_NPY) {
        return false;
    }
    if (r->model.layers_count > 24 || r->expanded_rows > 4096) return false;
    for (uint32_t i = 0; i < r->rows_count; i++) {
        if (r->rows[i].output[0] != '\0') return false;  // plans check for existing files
    }
    return true;
}

static void plan(const char *text, size_t size) {
    run_options o;
    memset(&o, 0, sizeof o);
    o.checksum_every = 100;
    uint64_t bytes = 0;
    qt_status s = run_measure(&the_run, &the_recipe, text, size, &o, &bytes);
    if (s == QT_OK && bytes < (256u << 20)) {
        void *tables = aligned_alloc(64, (bytes + 63) / 64 * 64);
        s = run_plan(&the_run, tables, bytes);
        if (s == QT_OK && the_run.tables.bytes != bytes) fuzz_fail("planned tables differ");
        free(tables);
    }
    if (s != QT_OK && s != QT_ERR_INPUT && s != QT_ERR_CAPACITY) {
        fuzz_fail("planning: %s: %s", qt_status_name(s), qt_error_message());
    }
    if (s != QT_OK && qt_error_message()[0] == '\0') fuzz_fail("a refusal without a message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qt_status s = recipe_parse((const char *)data, size, "fuzz.recipe", &the_recipe);
    if (s != QT_OK) {
        unsigned line = 0, col = 0;
        if (s != QT_ERR_INPUT && s != QT_ERR_CAPACITY) {
            fuzz_fail("recipe_parse: %s", qt_status_name(s));
        }
        if (sscanf(qt_error_message(), "fuzz.recipe:%u:%u: ", &line, &col) != 2 || line == 0 ||
            col == 0) {
            fuzz_fail("a message without file:line:col: %s", qt_error_message());
        }
        return 0;
    }
    static qt_role_quantizer roles[RECIPE_ROLES_MAX];
    size_t count = 0;
    if (recipe_resolve_roles(&the_recipe, roles, RECIPE_ROLES_MAX, &count) != QT_OK) {
        fuzz_fail("a parsed recipe whose roles do not resolve: %s", qt_error_message());
    }
    if (plannable(&the_recipe)) plan((const char *)data, size);
    return 0;
}
