// test_recipe: the recipe parser and the quantization rules (recipes/recipe.c, recipes/rules.c).
//
// Every section parses into the expected struct (the example files of tests/recipes), every kind
// of error gives its exact `file:line:col: message`, rules resolve in order with globs, the
// built-in recipes resolve every role of a small model to TE's recipe defaults, and a round of
// random, truncated and mutated files fails cleanly. Run from the repository root.
#include <locale.h>
#include <string.h>
#include <time.h>

#include "recipes/recipe.h"
#include "recipes/rules.h"
#include "runtime/schedule/schedule.h"  // sched_table_build: the table a [schedule] expands to
#include "tests/test.h"

static recipe R;  // about 37 KB: static, not on the stack

static qt_status parse(const char *text) {
    return recipe_parse(text, strlen(text), "r.recipe", &R);
}

static bool quantizer_equal(const qt_quantizer *a, const qt_quantizer *b) {
    return a->scheme == b->scheme && a->format == b->format && a->elem == b->elem &&
           a->margin == b->margin && a->history_len == b->history_len &&
           a->amax_algo == b->amax_algo && a->pow2 == b->pow2 && a->amax_eps == b->amax_eps &&
           a->sr == b->sr && a->two_d == b->two_d && a->rht == b->rht &&
           a->rht_mask == b->rht_mask;
}

static qt_role role_of(qt_module_type m, qt_tensor_type t, const char *name) {
    qt_role role;
    memset(&role, 0, sizeof role);
    role.module_type = m;
    role.tensor_type = t;
    snprintf(role.name, sizeof role.name, "%s", name);
    return role;
}

// Resolves one role of R; fails the check (and returns a zeroed quantizer) if it does not.
static qt_quantizer resolve(qt_module_type m, qt_tensor_type t, const char *name) {
    qt_quantizer q;
    memset(&q, 0, sizeof q);
    qt_status s = recipe_resolve_role(&R, role_of(m, t, name), &q);
    CHECK(s == QT_OK, "resolve %s: %s", name, qt_error_message());
    return q;
}

// ---------------------------------------------------------------------------------------------
// Sections

static void test_example_mlp(void) {
    test_begin("parse_example_mlp_all_sections");
    static char buffer[1 << 16];
    qt_status s = recipe_load("tests/recipes/mlp_fashion.recipe", buffer, sizeof buffer, &R);
    CHECK(s == QT_OK, "%s", qt_error_message());
    const recipe_model *m = &R.model;
    CHECK(strcmp(R.file_name, "tests/recipes/mlp_fashion.recipe") == 0, "%s", R.file_name);
    CHECK(m->input_features == 784 && m->layers_count == 5, "%u %u", m->input_features,
          m->layers_count);
    static const recipe_layer_kind kinds[5] = {
        RECIPE_LAYER_LINEAR, RECIPE_LAYER_GELU, RECIPE_LAYER_LINEAR, RECIPE_LAYER_GELU,
        RECIPE_LAYER_LINEAR,
    };
    static const uint32_t in[5] = {784, 1024, 1024, 1024, 1024}, out[5] = {1024, 1024, 1024, 1024,
                                                                          10};
    static const char *const names[5] = {"fc1", "", "fc2", "", "head"};
    for (int i = 0; i < 5; i++) {
        const recipe_layer *l = &m->layers[i];
        CHECK(l->kind == kinds[i] && strcmp(l->name, names[i]) == 0, "layer %d: %d %s", i,
              l->kind, l->name);
        CHECK(l->in_features == in[i] && l->out_features == out[i], "layer %d: %u -> %u", i,
              l->in_features, l->out_features);
        CHECK(l->bias == (kinds[i] == RECIPE_LAYER_LINEAR), "layer %d bias", i);
        CHECK(l->line == (uint32_t)(4 + i) && l->col == 9, "layer %d at %u:%u", i, l->line,
              l->col);
    }
    CHECK(m->loss == RECIPE_LOSS_SOFTMAX_XENT && m->output_features == 10, "loss");
    const recipe_quant *q = &R.quant;
    CHECK(q->has_builtin && q->builtin == QT_SCHEME_NVFP4 && q->rules_count == 3, "quant");
    const qt_rule *r0 = &q->rules[0], *r1 = &q->rules[1], *r2 = &q->rules[2];
    CHECK(strcmp(r0->module_glob, "linear") == 0 && strcmp(r0->tensor_glob, "*") == 0 &&
          strcmp(r0->name_glob, "head") == 0 && r0->scheme == QT_SCHEME_BF16 && r0->set == 0,
          "rule 0");
    CHECK(r0->line == 13 && r0->col == 8, "rule 0 at %u:%u", r0->line, r0->col);
    CHECK(r1->scheme == QT_SCHEME_MXFP8 && r1->set == 1u << QT_OPTION_ELEM &&
          r1->values.elem == QT_ELEM_E5M2 && r1->option_col[QT_OPTION_ELEM] == 38, "rule 1");
    CHECK(r2->scheme == QT_SCHEME_DELAYED && r2->values.margin == 0 &&
          r2->values.history_len == 1024 && r2->values.amax_algo == QT_AMAX_MAX &&
          r2->set == ((1u << QT_OPTION_MARGIN) | (1u << QT_OPTION_HISTORY) |
                      (1u << QT_OPTION_ALGO)), "rule 2");
    const recipe_optim *o = &R.optim;
    CHECK(o->kind == RECIPE_OPTIM_ADAMW && o->lr == 1e-3f && o->beta1 == 0.9f &&
          o->beta2 == 0.999f && o->eps == 1e-8f && o->weight_decay == 0.01f && o->clip == 1.0f,
          "optim");
    const recipe_data *d = &R.data;
    CHECK(d->train.kind == RECIPE_SOURCE_IDX && d->eval.kind == RECIPE_SOURCE_IDX, "sources");
    CHECK(strcmp(d->train.images,
                 "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") == 0 &&
          strcmp(d->eval.labels,
                 "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz") == 0, "paths");
    CHECK(d->batch == 256 && d->seed == 1, "batch %u seed %llu", d->batch,
          (unsigned long long)d->seed);
    CHECK(R.rows_count == 4, "rows %u", R.rows_count);
    const recipe_row *w = R.rows;
    CHECK(w[0].mode == RECIPE_MODE_TRAIN && w[0].steps == 235 && w[0].lr_kind == RECIPE_LR_WARMUP
          && w[0].lr_from == 0.0f && w[0].lr_to == 1e-3f && w[0].line == 27, "row 0");
    CHECK(w[1].mode == RECIPE_MODE_EVAL && w[1].all && w[1].steps == 0 &&
          w[1].dataset == RECIPE_DATASET_EVAL, "row 1");
    CHECK(w[2].mode == RECIPE_MODE_TRAIN && w[2].steps == 2115 &&
          w[2].lr_kind == RECIPE_LR_COSINE && w[2].lr_from == 1e-3f && w[2].lr_to == 1e-5f,
          "row 2");
    CHECK(w[3].mode == RECIPE_MODE_INFER && w[3].steps == 1 && !w[3].all &&
          w[3].dataset == RECIPE_DATASET_EVAL, "row 3");
    test_end();
}

static void test_example_moe_residual(void) {
    test_begin("parse_layers_residual_moe_teacher");
    static char buffer[1 << 16];
    qt_status s = recipe_load("tests/recipes/moe_residual.recipe", buffer, sizeof buffer, &R);
    CHECK(s == QT_OK, "%s", qt_error_message());
    const recipe_model *m = &R.model;
    CHECK(m->input_features == 64 && m->layers_count == 17 && m->output_features == 16 &&
          m->loss == RECIPE_LOSS_MSE, "model %u %u %u", m->input_features, m->layers_count,
          m->output_features);
    const recipe_layer *l = m->layers;
    CHECK(l[1].kind == RECIPE_LAYER_RESIDUAL_BEGIN && l[1].match == 6 &&
          l[6].kind == RECIPE_LAYER_RESIDUAL_END && l[6].match == 1, "block 1");
    CHECK(l[7].match == 14 && l[14].match == 7 && l[10].match == 13 && l[13].match == 10,
          "nested blocks %u %u %u %u", l[7].match, l[14].match, l[10].match, l[13].match);
    CHECK(l[2].kind == RECIPE_LAYER_RMSNORM && strcmp(l[2].name, "rmsnorm1") == 0 &&
          l[2].eps == 1e-5f, "default norm %s", l[2].name);
    CHECK(strcmp(l[8].name, "norm_moe") == 0 && l[8].eps == 1e-6f, "named norm");
    CHECK(strcmp(l[15].name, "rmsnorm3") == 0, "third norm is %s", l[15].name);
    CHECK(l[4].kind == RECIPE_LAYER_SWIGLU && l[4].in_features == 512 &&
          l[4].out_features == 256, "swiglu");
    CHECK(l[3].bias && !l[5].bias, "bias flags");
    const recipe_layer *moe = &l[9];
    CHECK(moe->kind == RECIPE_LAYER_MOE && strcmp(moe->name, "experts") == 0 &&
          moe->experts == 8 && moe->topk == 2 && moe->hidden == 96 &&
          moe->act == RECIPE_LAYER_SWIGLU && moe->aux == 0.001f && moe->in_features == 128 &&
          moe->out_features == 128, "moe");
    CHECK(R.optim.lr == 3e-4f && R.optim.weight_decay == 0.0f && R.optim.beta2 == 0.999f &&
          R.optim.clip == 0.0f, "optim defaults");
    const recipe_source *t = &R.data.train;
    CHECK(t->kind == RECIPE_SOURCE_TEACHER && t->inputs == 64 && t->outputs == 16 &&
          t->samples == 4096 && t->seed == 7 && t->task == 7, "teacher (task = seed)");
    CHECK(R.data.eval.samples == 512 && R.data.seed == 0 && !R.data.resident,
          "eval source, default seed, datasets not resident");
    CHECK(R.rows[0].lr_kind == RECIPE_LR_CONSTANT && R.rows[0].lr_from == 3e-4f &&
          R.rows[0].lr_to == 3e-4f, "constant row");
    CHECK(R.rows[2].lr_kind == RECIPE_LR_CONSTANT && R.rows[2].lr_from == 3e-4f,
          "row without a rate takes the optimizer's");
    CHECK(R.rows[1].dataset == RECIPE_DATASET_EVAL && R.rows[3].all &&
          R.rows[3].dataset == RECIPE_DATASET_TRAIN, "datasets");
    CHECK(recipe_roles_count(&R) == 3 * 4 + 9, "roles %zu", recipe_roles_count(&R));
    test_end();
}

static void test_example_classes(void) {
    test_begin("parse_sections_in_any_order_classes");
    static char buffer[1 << 16];
    qt_status s = recipe_load("tests/recipes/classes_block.recipe", buffer, sizeof buffer, &R);
    CHECK(s == QT_OK, "%s", qt_error_message());
    const recipe_source *t = &R.data.train;
    CHECK(t->kind == RECIPE_SOURCE_CLASSES && t->inputs == 32 && t->outputs == 4 &&
          t->samples == 1000 && t->seed == 0 && t->task == 0, "classes");
    CHECK(R.data.batch == 32 && R.data.seed == 42, "data");
    CHECK(R.optim.lr == 1e-3f && R.optim.beta1 == 0.9f && R.optim.eps == 1e-8f &&
          R.optim.weight_decay == 0.01f, "optimizer defaults");
    CHECK(R.rows_count == 3 && R.rows[2].dataset == RECIPE_DATASET_EVAL, "infer default set");
    qt_quantizer q = resolve(QT_MODULE_LINEAR, QT_TENSOR_WEIGHT, "hidden");
    CHECK(q.format == QT_FORMAT_FP8_BLOCK_2D && q.pow2, "block weight");
    q = resolve(QT_MODULE_LINEAR, QT_TENSOR_WEIGHT, "logits");
    CHECK(q.format == QT_FORMAT_MXFP8 && !q.two_d && q.rule_line == 25, "mxfp8 override");
    test_end();
}

// The same recipe with CRLF line ends, tabs and comments everywhere parses to the same struct.
static void test_crlf_tabs_comments(void) {
    test_begin("parse_crlf_tabs_comments");
    const char *text =
        "# header comment\r\n"
        "[model]   # trailing comment\r\n"
        "\tinput\t=\t4\r\n"
        "layer=linear fc1 8 bias#not-a-comment-name?\r\n";
    qt_status s = parse(text);
    CHECK(s != QT_OK && strstr(qt_error_message(), "r.recipe:4:20: expected 'bias' or end of "
          "line, found 'bias#not-a-comment-name?'") != NULL, "%s", qt_error_message());
    const char *good =
        "[model]\r\ninput = 4 # four\r\nlayer = linear fc1 8\r\nloss = softmax_xent\r\n"
        "[quant]\r\nrecipe = bf16\r\n[optim]\r\nadamw\r\n[data]\r\n"
        "train = idx a#1.gz b.gz   # '#' inside a word is kept\r\n"
        "batch = 2\r\n[schedule]\r\ntrain 1";
    s = parse(good);
    CHECK(s == QT_OK, "%s", qt_error_message());
    CHECK(strcmp(R.data.train.images, "a#1.gz") == 0, "path %s", R.data.train.images);
    CHECK(R.rows_count == 1 && R.rows[0].steps == 1, "last line without newline");
    test_end();
}

// Numbers are read the same whatever LC_NUMERIC an embedding program has set.
static void test_locale(void) {
    test_begin("parse_numbers_independent_of_locale");
    const char *locales[] = {"de_DE.UTF-8", "fr_FR.UTF-8", "de_DE.utf8", "C.UTF-8"};
    const char *set = NULL;
    for (int i = 0; i < 4 && set == NULL; i++) set = setlocale(LC_NUMERIC, locales[i]);
    static char buffer[1 << 16];
    qt_status s = recipe_load("tests/recipes/mlp_fashion.recipe", buffer, sizeof buffer, &R);
    CHECK(s == QT_OK, "%s (locale %s)", qt_error_message(), set ? set : "C");
    CHECK(R.optim.beta1 == 0.9f && R.optim.lr == 1e-3f && R.rows[2].lr_to == 1e-5f,
          "numbers under locale %s", set ? set : "C");
    // Only a locale whose decimal point is not '.' tests anything; say which one ran.
    printf("  LC_NUMERIC %s, decimal point '%s'\n", set ? set : "C (no other locale installed)",
           localeconv()->decimal_point);
    setlocale(LC_NUMERIC, "C");
    test_end();
}

static void test_load_errors(void) {
    test_begin("load_missing_file_and_small_buffer");
    static char buffer[1 << 16];
    qt_status s = recipe_load("tests/recipes/does-not-exist.recipe", buffer, sizeof buffer, &R);
    CHECK(s == QT_ERR_IO, "status %s", qt_status_name(s));
    CHECK(strcmp(qt_error_message(), "tests/recipes/does-not-exist.recipe: cannot open the "
                 "recipe: No such file or directory") == 0, "%s", qt_error_message());
    s = recipe_load("tests/recipes/mlp_fashion.recipe", buffer, 100, &R);
    CHECK(s == QT_ERR_CAPACITY, "status %s", qt_status_name(s));
    CHECK(strcmp(qt_error_message(), "tests/recipes/mlp_fashion.recipe: file larger than the "
                 "100-byte buffer; expected a recipe of at most 100 bytes") == 0, "%s",
          qt_error_message());
    // Not a regular file: refused before it is opened (a FIFO would block the open).
    s = recipe_load("tests/recipes", buffer, sizeof buffer, &R);
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "tests/recipes is a directory, not a "
                 "regular file; qtrain reads a recipe from a regular file only (a pipe or a "
                 "device could block it, or give other bytes on a second read): save the data "
                 "to a file and name that") == 0, "%s", qt_error_message());
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Errors: one small valid recipe, changed one line at a time

static const char *const base_lines[] = {
    "[model]",                                                           // 1
    "input = 4",                                                         // 2
    "layer = linear fc1 8 bias",                                         // 3
    "layer = gelu",                                                      // 4
    "layer = linear head 3",                                             // 5
    "loss = softmax_xent",                                               // 6
    "[quant]",                                                           // 7
    "recipe = nvfp4",                                                    // 8
    "[optim]",                                                           // 9
    "adamw lr=1e-3",                                                     // 10
    "[data]",                                                            // 11
    "train = synthetic classes inputs=4 classes=3 samples=64 seed=5",    // 12
    "batch = 16",                                                        // 13
    "[schedule]",                                                        // 14
    "train 10",                                                          // 15
};
#define BASE_LINES 15

// The base recipe with line `line` replaced by `text` (mode 'R') or `text` inserted after it
// (mode 'I'; line 0 inserts at the top). `text` may hold several lines.
static char *build(int line, char mode, const char *text) {
    static char out[1 << 20];
    size_t used = 0;
    out[0] = '\0';
    if (mode == 'I' && line == 0) used += (size_t)snprintf(out + used, sizeof out - used, "%s\n",
                                                           text);
    for (int i = 1; i <= BASE_LINES; i++) {
        const char *content = mode == 'R' && i == line ? text : base_lines[i - 1];
        used += (size_t)snprintf(out + used, sizeof out - used, "%s\n", content);
        if (mode == 'I' && i == line) {
            used += (size_t)snprintf(out + used, sizeof out - used, "%s\n", text);
        }
    }
    return out;
}

// `npy FEATURES LABELS_OR_TARGETS` parses with either loss: whether the second file holds labels
// or targets is known once it is read (runtime/io/data.c checks it against the loss).
// `task=` draws the task apart from the samples' seed, which it defaults to.
static void test_synthetic_task(void) {
    test_begin("parse_synthetic_task_seed");
    CHECK(parse(build(12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 seed=5 "
                      "task=9")) == QT_OK, "%s", qt_error_message());
    CHECK(R.data.train.seed == 5 && R.data.train.task == 9, "seed %llu task %llu",
          (unsigned long long)R.data.train.seed, (unsigned long long)R.data.train.task);
    CHECK(parse(build(12, 'R', "train = synthetic classes task=2 inputs=4 classes=3 "
                      "samples=64")) == QT_OK, "%s", qt_error_message());
    CHECK(R.data.train.seed == 0 && R.data.train.task == 2, "task without a seed");
    CHECK(parse(build(0, 'N', "")) == QT_OK && R.data.train.task == 5, "default task %llu",
          (unsigned long long)R.data.train.task);
    test_end();
}

// `zipf=S` skews the labels of synthetic classes; without it the labels are uniform (0).
// `spread=F` sets the class centers' length.
static void test_synthetic_zipf(void) {
    test_begin("parse_synthetic_zipf_and_spread");
    CHECK(parse(build(0, 'N', "")) == QT_OK && R.data.train.zipf == 0.0f, "default zipf %g",
          (double)R.data.train.zipf);
    CHECK(parse(build(12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 "
                      "zipf=1.25 seed=5")) == QT_OK, "%s", qt_error_message());
    CHECK(R.data.train.zipf == 1.25f && R.data.train.seed == 5, "zipf %g",
          (double)R.data.train.zipf);
    CHECK(parse(build(12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 "
                      "zipf=0")) == QT_OK && R.data.train.zipf == 0.0f, "zipf=0: %s",
          qt_error_message());
    CHECK(parse(build(12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 "
                      "zipf=16")) == QT_OK && R.data.train.zipf == 16.0f, "zipf=16: %s",
          qt_error_message());
    // spread= (the centers' length): 0 stands for the default, 3.
    CHECK(R.data.train.spread == 0.0f, "default spread %g", (double)R.data.train.spread);
    CHECK(parse(build(12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 "
                      "spread=50 zipf=2")) == QT_OK && R.data.train.spread == 50.0f &&
          R.data.train.zipf == 2.0f, "spread=50: %s", qt_error_message());
    test_end();
}

static void test_npy_source(void) {
    test_begin("parse_npy_source_with_either_loss");
    const char *text = build(12, 'R', "train = npy data/x.npy data/y.npy");
    qt_status s = recipe_parse(text, strlen(text), "r.recipe", &R);
    CHECK(s == QT_OK, "%s", qt_error_message());
    CHECK(R.data.train.kind == RECIPE_SOURCE_NPY && strcmp(R.data.train.images, "data/x.npy") == 0
              && strcmp(R.data.train.labels, "data/y.npy") == 0 && R.data.train.line == 12,
          "source");
    static char mse[4096];
    snprintf(mse, sizeof mse, "%s", text);
    char *loss = strstr(mse, "loss = softmax_xent");
    CHECK(loss != NULL, "no loss line");
    if (loss) memcpy(loss, "loss = mse         ", strlen("loss = softmax_xent"));
    s = recipe_parse(mse, strlen(mse), "r.recipe", &R);
    CHECK(s == QT_OK && R.model.loss == RECIPE_LOSS_MSE, "mse: %s", qt_error_message());
    test_end();
}

// Without a train source the embedder gives the batches: rows of N steps parse on either
// dataset's name, a pass (`all`) over the unnamed train set does not.
static void test_no_train_source(void) {
    test_begin("parse_without_a_train_source");
    const char *text = build(12, 'R', "# the embedder's batches");
    qt_status s = recipe_parse(text, strlen(text), "r.recipe", &R);
    CHECK(s == QT_OK && R.data.train.kind == RECIPE_SOURCE_NONE && R.data.batch == 16,
          "%s", qt_error_message());
    static char rows[4096];
    snprintf(rows, sizeof rows, "%seval 2 train\ninfer 3\n", text);
    s = recipe_parse(rows, strlen(rows), "r.recipe", &R);
    CHECK(s == QT_OK && R.rows_count == 3 && R.rows[2].dataset == RECIPE_DATASET_TRAIN,
          "rows of N steps: %s", qt_error_message());
    snprintf(rows, sizeof rows, "%sinfer all\n", text);
    s = recipe_parse(rows, strlen(rows), "r.recipe", &R);
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "r.recipe:16:1: the row makes a pass "
          "(all) over the train dataset, which [data] does not name (the embedder gives the "
          "batches); expected 'train = SOURCE' or a length in steps") == 0, "%s",
          qt_error_message());
    snprintf(rows, sizeof rows, "%seval all train\n", text);
    s = recipe_parse(rows, strlen(rows), "r.recipe", &R);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "r.recipe:16:1: the row makes a pass"),
          "%s", qt_error_message());
    snprintf(rows, sizeof rows, "%strain 2 epochs\n", text);
    s = recipe_parse(rows, strlen(rows), "r.recipe", &R);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "r.recipe:16:1: the row counts epochs"),
          "epochs: %s", qt_error_message());
    test_end();
}

// Infer rows name their output file (and argmax) after the optional dataset.
static void test_infer_output(void) {
    test_begin("parse_infer_output_and_argmax");
    const char *text = build(15, 'I', "infer all train output=out/logits.npy\n"
                             "infer 3 output=preds.npy argmax\ninfer 2");
    qt_status s = recipe_parse(text, strlen(text), "r.recipe", &R);
    CHECK(s == QT_OK, "%s", qt_error_message());
    CHECK(R.rows_count == 4 && strcmp(R.rows[1].output, "out/logits.npy") == 0 &&
              !R.rows[1].argmax && R.rows[1].all && R.rows[1].dataset == RECIPE_DATASET_TRAIN,
          "row 1");
    CHECK(strcmp(R.rows[2].output, "preds.npy") == 0 && R.rows[2].argmax &&
              R.rows[2].steps == 3, "row 2");
    CHECK(R.rows[3].output[0] == '\0' && !R.rows[3].argmax, "row 3");
    test_end();
}

// `recompute` marks an activation right before a linear; the other layers keep it off.
static void test_recompute_flag(void) {
    test_begin("parse_recompute_flag");
    const char *text = build(4, 'R', "layer = gelu recompute");
    qt_status s = recipe_parse(text, strlen(text), "r.recipe", &R);
    CHECK(s == QT_OK, "%s", qt_error_message());
    CHECK(s == QT_OK && R.model.layers[1].kind == RECIPE_LAYER_GELU &&
              R.model.layers[1].recompute && !R.model.layers[0].recompute &&
              !R.model.layers[2].recompute,
          "the gelu's flag");
    text = build(4, 'R', "layer = swiglu recompute");
    s = recipe_parse(text, strlen(text), "r.recipe", &R);
    CHECK(s == QT_OK && R.model.layers[1].recompute && R.model.layers[2].in_features == 4,
          "swiglu recompute: %s", s == QT_OK ? "flag or width" : qt_error_message());
    text = build(4, 'R', "layer = gelu");
    s = recipe_parse(text, strlen(text), "r.recipe", &R);
    CHECK(s == QT_OK && !R.model.layers[1].recompute, "a plain gelu recomputes");
    test_end();
}

typedef struct error_case {
    int line;
    char mode;
    const char *text;
    qt_status status;
    const char *message;
} error_case;

#define IN QT_ERR_INPUT
static const error_case error_cases[] = {
    // sections and keys
    {9, 'R', "[optimizer]", IN, "r.recipe:9:1: unknown section [optimizer]; expected [model], "
     "[quant], [optim], [data] or [schedule]"},
    {10, 'I', "[model]", IN, "r.recipe:11:1: duplicate section [model]; first given at line 1"},
    {7, 'R', "[quant] x", IN, "r.recipe:7:9: unexpected 'x'; expected end of line"},
    {7, 'R', "[quant", IN, "r.recipe:7:7: expected ']' to end the section header, found end of "
     "line"},
    {0, 'I', "input = 4", IN, "r.recipe:1:1: expected a section header such as [model], found "
     "'input'"},
    {2, 'R', "inptu = 4", IN, "r.recipe:2:1: unknown key 'inptu' in [model]; expected input, "
     "layer or loss"},
    {2, 'I', "input = 5", IN, "r.recipe:3:1: duplicate key 'input'; first given at line 2"},
    {2, 'R', "input 4", IN, "r.recipe:2:1: expected 'key = value', found 'input'"},
    {2, 'R', "= 4", IN, "r.recipe:2:1: expected a key before '='"},
    {2, 'R', "input size = 4", IN, "r.recipe:2:7: expected one key before '=', found 'size' "
     "after 'input'"},
    {2, 'R', "input =", IN, "r.recipe:2:8: expected a value after 'input =', found end of line"},
    {2, 'R', "input = 4 5", IN, "r.recipe:2:11: unexpected '5'; expected end of line"},
    {4, 'R', "layer = gelu\x01", IN, "r.recipe:4:13: unexpected control byte 0x01; expected "
     "text"},
    {13, 'R', "", IN, "r.recipe:11:1: [data] has no 'batch'; expected batch = N"},
    {6, 'R', "", IN, "r.recipe:1:1: [model] has no 'loss'; expected loss = softmax_xent | mse"},
    {8, 'R', "", IN, "r.recipe:7:1: [quant] has no 'recipe'; expected recipe = bf16 | delayed | "
     "current | mxfp8 | block | nvfp4 | none"},
    {10, 'R', "", IN, "r.recipe:9:1: [optim] has no optimizer; expected adamw [lr=F] "
     "[betas=F,F] [eps=F] [wd=F] [clip=F]"},
    {15, 'R', "", IN, "r.recipe:14:1: [schedule] has no rows; expected train N, eval N or "
     "infer N"},
    // numbers
    {3, 'R', "layer = linear fc1 8x bias", IN, "r.recipe:3:20: bad number: expected an integer "
     "for OUT, found '8x'"},
    {2, 'R', "input = 0", IN, "r.recipe:2:9: number out of range: expected input in [1, "
     "1048576], found 0"},
    {13, 'I', "resident = yes", IN, "r.recipe:14:12: unknown resident 'yes'; expected off or "
     "on"},
    {13, 'I', "resident = on on", IN, "r.recipe:14:15: unexpected 'on'; expected end of line"},
    {12, 'R', "resident = on", IN, "r.recipe:12:1: resident = on keeps the train and eval "
     "datasets on the device, but [data] names no train source (the embedder gives the "
     "batches); expected 'train = SOURCE' or no resident line"},
    {13, 'R', "batch = 99999999999999999999999", IN, "r.recipe:13:9: number out of range: "
     "expected batch in [1, 65536], found 99999999999999999999999"},
    {10, 'R', "adamw lr=fast", IN, "r.recipe:10:10: bad number: expected a decimal number for "
     "lr, found 'fast'"},
    {10, 'R', "adamw lr=nan", IN, "r.recipe:10:10: bad number: expected a decimal number for "
     "lr, found 'nan'"},
    {10, 'R', "adamw betas=0.9,1", IN, "r.recipe:10:17: number out of range: expected beta2 in "
     "[0, 1), found 1"},
    {10, 'R', "adamw betas=0.9", IN, "r.recipe:10:13: expected betas=B1,B2, found '0.9'"},
    {10, 'R', "adamw eps=0", IN, "r.recipe:10:11: number out of range: expected eps in (0, 1], "
     "found 0"},
    {10, 'R', "adamw lr=1e39", IN, "r.recipe:10:10: number out of range: expected lr in [0, "
     "1000], found 1e39"},
    // model
    {4, 'R', "layer = conv", IN, "r.recipe:4:9: unknown layer 'conv'; expected linear, relu, "
     "gelu, silu, swiglu, rmsnorm, residual or moe"},
    {5, 'R', "layer = linear fc1 3", IN, "r.recipe:5:16: duplicate layer name 'fc1'; first "
     "declared at line 3"},
    {3, 'R', "layer = linear 1fc 8", IN, "r.recipe:3:16: expected a layer name "
     "[A-Za-z_][A-Za-z0-9_]*, found '1fc'"},
    {3, 'R', "layer = linear a_name_that_is_far_too_long_for_it 8", IN, "r.recipe:3:16: layer "
     "name too long: expected at most 31 bytes, found 34"},
    {3, 'R', "layer = linear fc1", IN, "r.recipe:3:19: expected 'linear NAME OUT [bias]', found "
     "end of line"},
    {3, 'R', "layer = linear fc1 8 biased", IN, "r.recipe:3:22: expected 'bias' or end of line, "
     "found 'biased'"},
    {4, 'R', "layer = gelu fast", IN, "r.recipe:4:14: expected 'recompute' or end of line, "
     "found 'fast'"},
    {4, 'R', "layer = gelu recompute fast", IN, "r.recipe:4:24: unexpected 'fast'; expected end "
     "of line"},
    {4, 'I', "layer = relu recompute\nlayer = residual begin\nlayer = silu\nlayer = residual end",
     IN, "r.recipe:5:9: 'recompute' makes the output again for the weight gradient of the linear "
     "right after the activation; expected a linear next, found residual begin"},
    {5, 'I', "layer = silu recompute", IN, "r.recipe:6:9: 'recompute' makes the output again for "
     "the weight gradient of the linear right after the activation; expected a linear next, found "
     "the end of [model]"},
    {6, 'R', "loss = hinge", IN, "r.recipe:6:8: unknown loss 'hinge'; expected softmax_xent or "
     "mse"},
    {4, 'R', "layer = residual end", IN, "r.recipe:4:9: unexpected 'residual end'; expected a "
     "'residual begin' before it"},
    {4, 'R', "layer = residual", IN, "r.recipe:4:17: expected 'residual begin' or 'residual "
     "end', found end of line"},
    {3, 'I', "layer = residual begin", IN, "r.recipe:4:9: residual begin has no matching "
     "'residual end'; expected one before the end of [model]"},
    {4, 'I', "layer = residual begin\nlayer = residual end", IN, "r.recipe:6:9: empty residual "
     "block (begin at line 5); expected at least one layer inside"},
    {3, 'R', "layer = residual begin\nlayer = linear fc1 8 bias\nlayer = residual end", IN,
     "r.recipe:5:9: residual block (begin at line 3) changes the width from 4 to 8; expected the "
     "same width at its end"},
    {3, 'R', "layer = linear fc1 7 bias\nlayer = swiglu", IN, "r.recipe:4:9: swiglu halves its "
     "input: expected an even width, found 7"},
    {4, 'R', "layer = rmsnorm rmsnorm2\nlayer = rmsnorm", IN, "r.recipe:5:9: "
     "duplicate layer name 'rmsnorm2'; first declared at line 4"},
    {4, 'R', "layer = rmsnorm eps=0", IN, "r.recipe:4:21: number out of range: expected eps in "
     "(0, 1], found 0"},
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 task=1 task=2", IN,
     "r.recipe:12:64: option 'task' given twice"},
    {12, 'R', "train = synthetic teacher inputs=4 outputs=3 samples=64 task=x", IN,
     "r.recipe:12:62: bad number: expected an integer for task, found 'x'"},
    {4, 'R', "layer = moe m experts=4 topk=1 hidden=8 gate=1", IN, "r.recipe:4:41: unknown "
     "option 'gate' for moe; expected experts, topk, hidden, act or aux"},
    {4, 'R', "layer = moe m experts=2 topk=3 hidden=8", IN, "r.recipe:4:30: topk=3 exceeds "
     "experts=2; expected topk <= experts"},
    {4, 'R', "layer = moe m experts=2 topk=1", IN, "r.recipe:4:31: moe needs hidden=N; found no "
     "hidden= option"},
    {4, 'R', "layer = moe m experts=2 experts=2", IN, "r.recipe:4:25: option 'experts' given "
     "twice"},
    {4, 'R', "layer = moe m experts=", IN, "r.recipe:4:23: expected a value after 'experts=', "
     "found nothing"},
    {4, 'R', "layer = moe m experts=4 topk=1 hidden=8 act=tanh", IN, "r.recipe:4:45: unknown "
     "activation 'tanh'; expected relu, gelu, silu or swiglu"},
    {5, 'R', "layer = linear head 1", IN, "r.recipe:6:1: softmax_xent needs at least 2 classes; "
     "expected a last layer of width >= 2, found 1"},
    // quant
    {8, 'R', "recipe = fp9", IN, "r.recipe:8:10: unknown built-in recipe 'fp9'; expected one of "
     "bf16, delayed, current, mxfp8, block, nvfp4, none"},
    {8, 'I', "weight_transpose = sideways", IN, "r.recipe:9:20: unknown weight_transpose "
     "'sideways'; expected auto, stored or per_step"},
    {8, 'I', "weight_transpose = stored stored", IN, "r.recipe:9:27: unexpected 'stored'; "
     "expected end of line"},
    {8, 'I', "rule = linear.*@head -> fp9", IN, "r.recipe:9:25: unknown scheme 'fp9'; expected "
     "one of bf16, delayed, current, mxfp8, block, nvfp4"},
    {8, 'R', "recipe = none\nrule = linear.*@head -> bf16\nrule = *.weight@* -> mxfp8", IN,
     "r.recipe:3:9: no rule matches role linear.input@fc1; expected a rule for it, tried "
     "linear.*@head (line 9), *.weight@* (line 10) and no built-in rules (recipe = none)"},
    {8, 'I', "rule = linear.*@fc9 -> bf16", IN, "r.recipe:9:8: rule linear.*@fc9 -> bf16 "
     "matches no role of the model; expected a pattern that matches one of its roles "
     "(linear.*@fc1, linear.*@head), or no such rule"},
    {8, 'I', "rule = linear.*@head -> bf16\nrule = grouped_linear.*@* -> block", IN,
     "r.recipe:10:8: rule grouped_linear.*@* -> block matches no role of the model; expected a "
     "pattern that matches one of its roles (linear.*@fc1, linear.*@head), or no such rule"},
    {8, 'I', "rule = *.*@* -> current history=16", IN, "r.recipe:9:25: unsupported combination: "
     "history applies to delayed, found with current"},
    {8, 'I', "rule = linear.input@* -> mxfp8 rht=1", IN, "r.recipe:9:32: unsupported "
     "combination: rht applies to nvfp4, found with mxfp8"},
    {8, 'I', "rule = *.*@* -> block sr=1", IN, "r.recipe:9:23: unsupported combination: sr "
     "applies to nvfp4, found with block"},
    {8, 'I', "rule = *.*@* -> nvfp4 e5m2", IN, "r.recipe:9:23: unsupported combination: e5m2 "
     "applies to delayed, current, mxfp8 and block, found with nvfp4"},
    {8, 'I', "rule = *.*@* -> delayed pow2=1", IN, "r.recipe:9:25: unsupported combination: "
     "pow2 applies to current and block, found with delayed"},
    {8, 'I', "rule = *.*@* -> bf16 2d=0", IN, "r.recipe:9:22: unsupported combination: 2d "
     "applies to mxfp8, block and nvfp4, found with bf16"},
    {8, 'I', "rule = *.input@* -> nvfp4 2d=1", IN, "r.recipe:9:27: unsupported combination: 2d=1 "
     "applies to weights, found on linear.input@fc1 (rule *.input@*)"},
    {8, 'I', "rule = linear.weight@fc1 -> nvfp4 rht=1", IN, "r.recipe:9:35: unsupported "
     "combination: rht=1 applies to input and grad_output (the wgrad operands), found on "
     "linear.weight@fc1 (rule linear.weight@fc1)"},
    {8, 'I', "rule = *.*@* -> nvfp4 sr=1 sr=0", IN, "r.recipe:9:28: option 'sr' given twice"},
    {8, 'I', "rule = *.*@* -> nvfp4 stochastic=1", IN, "r.recipe:9:23: unknown option "
     "'stochastic=1'; expected e4m3, e5m2, margin=, history=, algo=, pow2=, eps=, sr=, 2d= or "
     "rht="},
    {8, 'I', "rule = *.*@* -> nvfp4 sr=yes", IN, "r.recipe:9:26: expected 0 or 1 for sr, found "
     "'yes'"},
    {8, 'I', "rule = *.*@* -> nvfp4 sr=", IN, "r.recipe:9:26: expected a value after 'sr=', "
     "found nothing"},
    {8, 'I', "rule = *.*@* -> delayed algo=mean", IN, "r.recipe:9:30: unknown algo 'mean'; "
     "expected max or most_recent"},
    {8, 'I', "rule = *.*@* -> delayed history=0", IN, "r.recipe:9:33: number out of range: "
     "expected history in [1, 65536], found 0"},
    {8, 'I', "rule = *.*@* -> current eps=-1", IN, "r.recipe:9:29: number out of range: expected "
     "eps in [0, 3.40282e+38], found -1"},
    {8, 'I', "rule = *.*@* bf16", IN, "r.recipe:9:14: expected '->' after the role pattern, "
     "found 'bf16'"},
    {8, 'I', "rule = *.*@*", IN, "r.recipe:9:13: expected '->' after the role pattern, found end "
     "of line"},
    {8, 'I', "rule = *.*@* ->", IN, "r.recipe:9:16: expected a scheme after '->', found end of "
     "line"},
    {8, 'I', "rule = linear@fc1 -> bf16", IN, "r.recipe:9:8: expected a role pattern "
     "MODULE.TENSOR@NAME (globs * and ?), found 'linear@fc1'"},
    {8, 'I', "rule = linear.@fc1 -> bf16", IN, "r.recipe:9:15: expected a role pattern "
     "MODULE.TENSOR@NAME (globs * and ?), found an empty module or tensor field in "
     "'linear.@fc1'"},
    {8, 'I', "rule = liner.*@* -> bf16", IN, "r.recipe:9:8: pattern 'liner' matches no module "
     "type; expected linear, grouped_linear or router (globs * and ?)"},
    {8, 'I', "rule = linear.weights@* -> bf16", IN, "r.recipe:9:15: pattern 'weights' matches no "
     "tensor type; expected input, weight or grad_output (globs * and ?)"},
    {8, 'I', "rule = linear.*@fc-1 -> bf16", IN, "r.recipe:9:19: unexpected '-' in the role "
     "pattern; expected letters, digits, '_', '.', '*' or '?'"},
    {8, 'I', "rule = Linear.*@* -> bf16", IN, "r.recipe:9:8: unexpected 'L' in the role pattern; "
     "expected lower-case letters, '_', '*' or '?'"},
    // optim
    {10, 'R', "sgd lr=0.1", IN, "r.recipe:10:1: unknown optimizer 'sgd'; expected adamw"},
    {10, 'I', "adamw", IN, "r.recipe:11:1: duplicate optimizer; [optim] takes one line, first at "
     "line 10"},
    {10, 'R', "adamw momentum=0.9", IN, "r.recipe:10:7: unknown option 'momentum' for adamw; "
     "expected lr, betas, eps, wd or clip"},
    {10, 'R', "adamw 0.1", IN, "r.recipe:10:7: expected an option NAME=VALUE for adamw (lr, "
     "betas, eps, wd or clip), found '0.1'"},
    // data
    {6, 'R', "loss = mse", IN, "r.recipe:12:9: loss mse needs regression targets (npy or "
     "synthetic teacher), found synthetic classes"},
    {12, 'R', "train = synthetic teacher inputs=4 outputs=3 samples=64", IN, "r.recipe:12:9: loss "
     "softmax_xent needs class labels (idx, npy or synthetic classes), found synthetic teacher"},
    {12, 'R', "train = synthetic classes inputs=5 classes=3 samples=64", IN, "r.recipe:12:9: "
     "synthetic classes gives 5 inputs; expected 4, the model's input"},
    {12, 'R', "train = synthetic classes inputs=4 classes=4 samples=64", IN, "r.recipe:12:9: "
     "synthetic classes gives 4 classes; expected 3, the width of the last layer"},
    {12, 'R', "train = synthetic classes inputs=4 classes=3", IN, "r.recipe:12:45: synthetic "
     "classes needs samples=N; found no samples= option"},
    // The shuffle indexes samples with 32 bits: the parser holds the limit, not a later stage.
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=4294967296", IN,
     "r.recipe:12:54: number out of range: expected samples in [1, 4294967295], found "
     "4294967296"},
    {12, 'R', "train = synthetic classes inputs=4 outputs=3 samples=64", IN, "r.recipe:12:36: "
     "unknown option 'outputs' for synthetic classes; expected inputs, classes, samples, seed, "
     "task, zipf or spread"},
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 spread=0", IN,
     "r.recipe:12:64: number out of range: expected spread in (0, 10000], found 0"},
    // zipf= (the skew of the labels): a decimal in [0, 16], on classes only.
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 zipf=-0.5", IN,
     "r.recipe:12:62: number out of range: expected zipf in [0, 16], found -0.5"},
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 zipf=16.5", IN,
     "r.recipe:12:62: number out of range: expected zipf in [0, 16], found 16.5"},
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 zipf=1,5", IN,
     "r.recipe:12:62: bad number: expected a decimal number for zipf, found '1,5'"},
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 zipf=", IN,
     "r.recipe:12:62: expected a value after 'zipf=', found nothing"},
    {12, 'R', "train = synthetic classes inputs=4 classes=3 samples=64 zipf=1 zipf=2", IN,
     "r.recipe:12:64: option 'zipf' given twice"},
    {12, 'R', "train = synthetic teacher inputs=4 outputs=3 samples=64 zipf=1", IN,
     "r.recipe:12:57: unknown option 'zipf' for synthetic teacher; expected inputs, outputs, "
     "samples, seed or task"},
    {12, 'R', "train = synthetic", IN, "r.recipe:12:18: expected 'synthetic teacher' or "
     "'synthetic classes', found end of line"},
    {12, 'R', "train = idx images.gz", IN, "r.recipe:12:22: expected 'idx IMAGES LABELS', found "
     "end of line"},
    {12, 'R', "train = npy x.npy", IN, "r.recipe:12:18: expected 'npy FEATURES "
     "LABELS_OR_TARGETS', found end of line"},
    {12, 'R', "train = npy x.npy y.npy z.npy", IN, "r.recipe:12:25: unexpected 'z.npy'; expected "
     "end of line"},
    {12, 'R', "train = csv a.csv", IN, "r.recipe:12:9: unknown data source 'csv'; expected idx, "
     "npy or synthetic"},
    // schedule
    {15, 'R', "test 10", IN, "r.recipe:15:1: unknown schedule row 'test'; expected train, "
     "eval, infer or repeat"},
    {14, 'I', "repeat 3", IN, "r.recipe:15:1: repeat has no rows to repeat; expected train, "
     "eval or infer rows since the start of [schedule] or the previous repeat"},
    {15, 'I', "repeat 3\nrepeat 2", IN, "r.recipe:17:1: repeat has no rows to repeat; expected "
     "train, eval or infer rows since the start of [schedule] or the previous repeat"},
    {15, 'I', "repeat", IN, "r.recipe:16:7: expected the number of times, found end of line"},
    {15, 'I', "repeat 0", IN, "r.recipe:16:8: number out of range: expected times in [1, "
     "1048576], found 0"},
    {15, 'I', "repeat 2 more", IN, "r.recipe:16:10: unexpected 'more'; expected end of line"},
    {15, 'I', "infer 1 output=a.npy\nrepeat 2", IN, "r.recipe:17:8: the infer row of line 16 "
     "writes output=FILE, which 2 repeats would write 2 times; expected no output= in a "
     "repeated row"},
    // Two rows 2^19 times make the 2^20 rows of the largest expanded schedule: one more row, or
    // a larger repeat, is refused at its line.
    {15, 'I', "eval 1 train\nrepeat 524288\neval 1 train", QT_ERR_CAPACITY,
     "r.recipe:18:1: the schedule has 1048576 rows with its repeats: expanded_rows_max is "
     "1048576"},
    {15, 'I', "eval 1 train\nrepeat 1048576", QT_ERR_CAPACITY, "r.recipe:17:8: the schedule "
     "repeats to 2097152 rows: expanded_rows_max is 1048576"},
    {15, 'R', "train", IN, "r.recipe:15:6: expected the number of steps or epochs, found end "
     "of line"},
    {15, 'R', "train all", IN, "r.recipe:15:7: bad number: expected an integer for steps, found "
     "'all'"},
    {15, 'R', "train 10 cosine 1e-3 1e-5", IN, "r.recipe:15:22: expected '->' between the "
     "learning rates, found '1e-5'"},
    {15, 'R', "train 10 cosine 1e-3 ->", IN, "r.recipe:15:24: expected a learning rate after "
     "'->', found end of line"},
    {15, 'R', "train 10 step 1e-3", IN, "r.recipe:15:15: expected a learning-rate rule "
     "(constant, warmup, decay, cosine), a warmup clause, an eval clause or end of line, found "
     "'1e-3'"},
    {15, 'R', "train 10 epochs cosine 1 -> 0 hold 2", IN, "r.recipe:15:31: expected a warmup "
     "clause (warmup N steps), an eval clause (eval every N epochs) or end of line, found "
     "'hold'"},
    {15, 'R', "train 10 warmup 1e-3 -> 1e-5", IN, "r.recipe:15:10: warmup raises the learning "
     "rate: expected FROM <= TO, found 1e-3 -> 1e-5; a falling ramp is 'decay 1e-3 -> 1e-5'"},
    {15, 'R', "train 10 decay 0 -> 1e-3", IN, "r.recipe:15:10: decay lowers the learning rate: "
     "expected FROM >= TO, found 0 -> 1e-3; a rising ramp is 'warmup 0 -> 1e-3'"},
    {15, 'R', "train 10 warmup 10 steps", IN, "r.recipe:15:17: a warmup of 10 steps in a row of "
     "10; expected a warmup shorter than its row"},
    {15, 'R', "train 10 warmup 2 warmup 3", IN, "r.recipe:15:19: the row has a warmup already"},
    {15, 'R', "train 10 warmup", IN, "r.recipe:15:16: expected the warmup's length N "
     "[steps|epochs], found end of line"},
    {15, 'R', "train 2 epochs eval every epoch", IN, "r.recipe:15:1: the row's eval clause "
     "reads the eval dataset; expected 'eval = SOURCE' in [data] or 'eval ... train every ...', "
     "found no eval source"},
    {15, 'R', "train 2 epochs eval train every", IN, "r.recipe:15:32: expected steps or epochs "
     "after 'every', found end of line"},
    {15, 'R', "train 2 epochs eval all train each epoch", IN, "r.recipe:15:31: expected 'every' "
     "in 'eval [STEPS|all] [train|eval] every [N] steps|epochs', found 'each'"},
    {15, 'R', "train 2 epochs eval train every epoch eval train every epoch", IN,
     "r.recipe:15:39: the row has an eval clause already"},
    {15, 'R', "train 2 epochs eval 0 train every epoch", IN, "r.recipe:15:21: number out of "
     "range: expected eval steps in [1, 2147483647], found 0"},
    {15, 'R', "train 10 constant", IN, "r.recipe:15:18: expected a learning rate after "
     "'constant', found end of line"},
    {15, 'R', "eval 1 test", IN, "r.recipe:15:8: expected train, eval or end of line, found "
     "'test'"},
    {15, 'R', "eval 3", IN, "r.recipe:15:1: eval row reads the eval dataset; expected 'eval = "
     "SOURCE' in [data] or 'eval N train', found no eval source"},
    {15, 'R', "infer all eval", IN, "r.recipe:15:1: infer row reads the eval dataset; expected "
     "'eval = SOURCE' in [data] or 'infer N train', found no eval source"},
    {15, 'R', "infer all foo", IN, "r.recipe:15:11: expected train, eval, output=FILE, argmax or "
     "end of line, found 'foo'"},
    {15, 'R', "infer all argmax", IN, "r.recipe:15:11: argmax applies to the file of "
     "output=FILE; expected output=FILE on this row"},
    {15, 'R', "infer all train output=", IN, "r.recipe:15:24: expected a value after 'output=', "
     "found nothing"},
    {15, 'R', "infer all out=x.npy", IN, "r.recipe:15:11: unknown option 'out' for infer; "
     "expected output"},
    {15, 'R', "infer 5 train output=a.npy argmax argmax", IN, "r.recipe:15:35: option 'argmax' "
     "given twice"},
    {15, 'R', "infer 5 train output=a.npy train", IN, "r.recipe:15:28: expected output=FILE, "
     "argmax or end of line, found 'train'"},
    {15, 'R', "eval all output=a.npy", IN, "r.recipe:15:10: expected train, eval or end of line, "
     "found 'output=a.npy'"},
    {15, 'I', "infer 1 output=a.npy\ninfer 2 output=a.npy", IN, "r.recipe:17:16: output file "
     "'a.npy' is also written by the infer row of line 16; expected one file per row"},
};
#undef IN

static void test_error_messages(void) {
    test_begin("errors_exact_file_line_col_messages");
    for (size_t i = 0; i < sizeof error_cases / sizeof error_cases[0]; i++) {
        const error_case *c = &error_cases[i];
        qt_status s = parse(build(c->line, c->mode, c->text));
        CHECK(s == c->status, "case %zu: status %s, expected %s (%s)", i, qt_status_name(s),
              qt_status_name(c->status), qt_error_message());
        CHECK(strcmp(qt_error_message(), c->message) == 0, "case %zu:\n    got      %s\n    "
              "expected %s", i, qt_error_message(), c->message);
    }
    qt_status s = parse("[model]\ninput = 3\nlayer = relu\nloss = softmax_xent\n[quant]\n"
                        "recipe = bf16\n[optim]\nadamw\n[data]\ntrain = synthetic classes "
                        "inputs=3 classes=3 samples=9\nbatch = 3\n[schedule]\ntrain 1\n");
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "r.recipe:1:1: [model] has no linear "
          "or moe layer; expected at least one layer with weights") == 0, "%s",
          qt_error_message());
    s = parse("");
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "r.recipe:1:1: missing section "
          "[model]; expected [model], [quant], [optim], [data] and [schedule], found no "
          "[model]") == 0, "%s", qt_error_message());
    char *no_schedule = build(0, 'N', "");
    *strstr(no_schedule, "[schedule]") = '\0';
    s = parse(no_schedule);
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "r.recipe:14:1: missing section "
          "[schedule]; expected [model], [quant], [optim], [data] and [schedule], found no "
          "[schedule]") == 0, "%s", qt_error_message());
    no_schedule[strlen(no_schedule) - 1] = '\0';  // no newline at the end: the end is 13:11
    s = parse(no_schedule);
    CHECK(s == QT_ERR_INPUT && strncmp(qt_error_message(), "r.recipe:13:11: missing section "
          "[schedule]", 41) == 0, "%s", qt_error_message());
    // The base itself is valid, and so are the alternatives the messages offer.
    CHECK(parse(build(0, 'N', "")) == QT_OK, "base: %s", qt_error_message());
    CHECK(parse(build(15, 'R', "eval 3 train")) == QT_OK, "eval on train: %s",
          qt_error_message());
    CHECK(parse(build(12, 'R', "train = synthetic classes inputs=4 classes=3 samples=4294967295"))
          == QT_OK, "the most samples: %s", qt_error_message());
    // Two repeated blocks: train 10 and eval 2 three times, then infer 1 twice: 8 rows.
    s = parse(build(15, 'I', "eval 2 train\nrepeat 3\ninfer 1\nrepeat 2"));
    CHECK(s == QT_OK && R.rows_count == 3 && R.repeats_count == 2 && R.expanded_rows == 8 &&
              R.repeats[0].first_row == 0 && R.repeats[0].row_count == 2 &&
              R.repeats[0].times == 3 && R.repeats[0].line == 17 &&
              R.repeats[1].first_row == 2 && R.repeats[1].row_count == 1 &&
              R.repeats[1].times == 2,
          "repeats: %s", qt_error_message());
    test_end();
}

static void test_error_limits(void) {
    test_begin("errors_line_too_long_nul_byte_and_capacity");
    static char line[1024], many[1 << 16];
    memset(line, 0, sizeof line);
    memcpy(line, "# ", 2);
    memset(line + 2, 'x', 600);
    qt_status s = parse(build(4, 'R', line));
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "r.recipe:4:513: line too long: "
          "expected at most 512 bytes, found 602") == 0, "%s", qt_error_message());
    const char nul_text[] = "[model]\ninput = 4\0\n";
    s = recipe_parse(nul_text, sizeof nul_text - 1, "r.recipe", &R);
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "r.recipe:2:10: unexpected control "
          "byte 0x00; expected text") == 0, "%s", qt_error_message());
    struct { int line; const char *repeat; int count; const char *message; } caps[] = {
        {3, "layer = gelu", 254, "r.recipe:259:9: too many layers: layers_max is 256"},
        {8, "rule = *.*@* -> bf16", 65, "r.recipe:73:8: too many rules: rules_max is 64"},
        {15, "train 1", 64, "r.recipe:79:1: too many schedule rows: schedule_rows_max is 64"},
        {3, "layer = residual begin", 17, "r.recipe:20:9: residual blocks nested too deep: "
         "residual_depth_max is 16"},
    };
    for (int c = 0; c < 4; c++) {
        size_t used = 0;
        for (int i = 0; i < caps[c].count; i++) {
            used += (size_t)snprintf(many + used, sizeof many - used, "%s%s", i ? "\n" : "",
                                     caps[c].repeat);
        }
        s = parse(build(caps[c].line, 'I', many));
        CHECK(s == QT_ERR_CAPACITY && strcmp(qt_error_message(), caps[c].message) == 0,
              "case %d: %s %s", c, qt_status_name(s), qt_error_message());
    }
    size_t used = (size_t)snprintf(many, sizeof many, "layer = gelu");
    for (int i = 0; i < 70; i++) used += (size_t)snprintf(many + used, sizeof many - used, " x");
    s = parse(build(4, 'R', many));
    CHECK(s == QT_ERR_CAPACITY && strcmp(qt_error_message(), "r.recipe:4:138: too many words on "
          "one line: line_tokens_max is 64") == 0, "%s", qt_error_message());
    // 114 moe layers of 9 roles each pass roles_max (1024) at the last one.
    used = 0;
    for (int i = 0; i < 114; i++) {
        used += (size_t)snprintf(many + used, sizeof many - used,
                                 "%slayer = moe m%d experts=2 topk=1 hidden=4", i ? "\n" : "", i);
    }
    s = parse(build(3, 'I', many));
    CHECK(s == QT_ERR_CAPACITY && strcmp(qt_error_message(), "r.recipe:117:9: too many quantized "
          "tensors: roles_max is 1024 (3 per linear, 9 per moe)") == 0, "%s",
          qt_error_message());
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Rules

static void test_glob(void) {
    test_begin("rules_glob_matching");
    struct { const char *pattern, *text; bool match; } cases[] = {
        {"*", "", true},          {"", "", true},            {"", "a", false},
        {"fc?", "fc1", true},     {"fc?", "fc10", false},    {"fc?", "fc", false},
        {"fc*", "fc", true},      {"fc*", "fc10", true},     {"*.fc1", "moe.fc1", true},
        {"*.fc1", "fc1", false},  {"m*e.*", "moe.router", true}, {"a*b*c", "aXbYbZc", true},
        {"a*b*c", "aXbYbZ", false}, {"*a", "bbb", false},    {"**", "x", true},
        {"?", "", false},         {"*?*", "x", true},        {"head", "head", true},
        {"head", "heads", false}, {"*e*e*e*e*e*e*e*f", "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(rules_glob_match(cases[i].pattern, cases[i].text) == cases[i].match,
              "'%s' on '%s'", cases[i].pattern, cases[i].text);
    }
    test_end();
}

static const char precedence_recipe[] =
    "[model]\n"
    "input = 16\n"
    "layer = linear fc1 32\n"
    "layer = linear fc2 32\n"
    "layer = moe moe1 experts=4 topk=2 hidden=8\n"
    "layer = linear head 4\n"
    "loss = softmax_xent\n"
    "[quant]\n"
    "recipe = nvfp4\n"
    "rule = linear.*@head -> bf16\n"                    // line 10
    "rule = linear.weight@fc? -> delayed margin=2\n"    // line 11
    "rule = *.grad_output@* -> mxfp8 e5m2\n"            // line 12
    "rule = linear.*@fc* -> current\n"                  // line 13
    "rule = grouped_linear.*@moe?.fc2 -> block\n"       // line 14
    "[optim]\n"
    "adamw\n"
    "[data]\n"
    "train = synthetic classes inputs=16 classes=4 samples=100\n"
    "batch = 10\n"
    "[schedule]\n"
    "train 1\n";

static void test_precedence(void) {
    test_begin("rules_first_match_wins_then_builtin");
    CHECK(parse(precedence_recipe) == QT_OK, "%s", qt_error_message());
    const qt_module_type L = QT_MODULE_LINEAR, G = QT_MODULE_GROUPED_LINEAR;
    const qt_tensor_type I = QT_TENSOR_INPUT, W = QT_TENSOR_WEIGHT, D = QT_TENSOR_GRAD_OUTPUT;
    qt_quantizer q = resolve(L, I, "head");
    CHECK(q.scheme == QT_SCHEME_BF16 && q.rule_line == 10 && q.rule_index == 0, "head input");
    q = resolve(L, D, "head");
    CHECK(q.scheme == QT_SCHEME_BF16 && q.rule_line == 10, "head grad: first match, not line 12");
    q = resolve(L, W, "fc2");
    CHECK(q.scheme == QT_SCHEME_DELAYED && q.margin == 2 && q.history_len == 1024 &&
          q.amax_algo == QT_AMAX_MAX && q.elem == QT_ELEM_E4M3 &&
          q.format == QT_FORMAT_FP8_E4M3 && q.rule_line == 11 && q.rule_index == 1, "fc2 weight");
    q = resolve(L, D, "fc1");
    CHECK(q.scheme == QT_SCHEME_MXFP8 && q.elem == QT_ELEM_E5M2 && q.format == QT_FORMAT_MXFP8 &&
          q.rule_line == 12, "fc1 grad");
    q = resolve(L, I, "fc1");
    CHECK(q.scheme == QT_SCHEME_CURRENT && q.elem == QT_ELEM_E4M3 && !q.pow2 &&
          q.amax_eps == 0.0f && q.rule_line == 13, "fc1 input");
    q = resolve(G, W, "moe1.fc2");
    CHECK(q.scheme == QT_SCHEME_BLOCK && q.two_d && q.format == QT_FORMAT_FP8_BLOCK_2D &&
          q.pow2 && q.rule_line == 14, "expert fc2 weight");
    q = resolve(G, I, "moe1.fc2");
    CHECK(q.format == QT_FORMAT_FP8_BLOCK_1D && !q.two_d, "expert fc2 input");
    q = resolve(G, D, "moe1.fc2");
    CHECK(q.scheme == QT_SCHEME_MXFP8 && q.rule_line == 12, "expert fc2 grad: line 12 first");
    q = resolve(G, W, "moe1.fc1");
    CHECK(q.scheme == QT_SCHEME_NVFP4 && q.two_d && !q.rht && !q.sr && q.rule_line == 0 &&
          q.rule_index == 1, "expert fc1 weight from the built-in list");
    q = resolve(G, I, "moe1.fc1");
    CHECK(q.rht && q.rht_mask == 0xD7E8 && !q.sr && !q.two_d, "expert fc1 input");
    q = resolve(QT_MODULE_ROUTER, I, "moe1.router");
    CHECK(q.scheme == QT_SCHEME_BF16 && q.rule_line == 0 && q.rule_index == 0, "router");
    // A role the model does not have still resolves by the rules...
    q = resolve(L, W, "elsewhere");
    CHECK(q.scheme == QT_SCHEME_NVFP4, "foreign role");
    // ...and without a built-in recipe fails with a message that names no layer position.
    R.quant.has_builtin = false;
    qt_status s = recipe_resolve_role(&R, role_of(QT_MODULE_ROUTER, W, "elsewhere"), &q);
    CHECK(s == QT_ERR_INPUT && strcmp(qt_error_message(), "r.recipe: no rule matches role "
          "router.weight@elsewhere; expected a rule for it, tried linear.*@head (line 10), "
          "linear.weight@fc? (line 11), *.grad_output@* (line 12), linear.*@fc* (line 13), "
          "grouped_linear.*@moe?.fc2 (line 14) and no built-in rules (recipe = none)") == 0,
          "%s", qt_error_message());
    test_end();
}

static void test_role_enumeration(void) {
    test_begin("rules_roles_in_order_and_resolve_model");
    CHECK(parse(precedence_recipe) == QT_OK, "%s", qt_error_message());
    static const char *const expected[] = {
        "linear.input@fc1", "linear.weight@fc1", "linear.grad_output@fc1",
        "linear.input@fc2", "linear.weight@fc2", "linear.grad_output@fc2",
        "router.input@moe1.router", "router.weight@moe1.router",
        "router.grad_output@moe1.router", "grouped_linear.input@moe1.fc1",
        "grouped_linear.weight@moe1.fc1", "grouped_linear.grad_output@moe1.fc1",
        "grouped_linear.input@moe1.fc2", "grouped_linear.weight@moe1.fc2",
        "grouped_linear.grad_output@moe1.fc2", "linear.input@head", "linear.weight@head",
        "linear.grad_output@head",
    };
    static const uint32_t layers[] = {0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3};
    CHECK(recipe_roles_count(&R) == 18, "count %zu", recipe_roles_count(&R));
    static qt_role_quantizer table[RECIPE_ROLES_MAX];
    size_t count = 0;
    qt_status s = recipe_resolve_roles(&R, table, RECIPE_ROLES_MAX, &count);
    CHECK(s == QT_OK && count == 18, "%s %zu", qt_error_message(), count);
    for (size_t i = 0; i < count && i < 18; i++) {
        char text[96];
        rules_role_format(&table[i].role, text, sizeof text);
        CHECK(strcmp(text, expected[i]) == 0 && table[i].layer_index == layers[i],
              "role %zu: %s in layer %u", i, text, table[i].layer_index);
    }
    s = recipe_resolve_roles(&R, table, 5, &count);
    CHECK(s == QT_ERR_CAPACITY && strcmp(qt_error_message(), "r.recipe: the model has 18 roles; "
          "the table given holds 5") == 0, "%s", qt_error_message());
    test_end();
}

// The text after "->" of a rule.
static const char *rule_target(const char *text) {
    const char *arrow = strstr(text, "-> ");
    return arrow ? arrow + 3 : "";
}

// Every built-in recipe resolves every role of a model with a linear and a moe layer, to the
// defaults of TE's recipes; each quantizer prints back as the built-in rule that made it; and a
// bare `-> SCHEME` rule gives the same as the built-in recipe of that name.
static void test_builtins(void) {
    test_begin("builtin_recipes_resolve_every_role");
    for (int s = 0; s < QT_SCHEME_COUNT; s++) {
        char text[2048];
        snprintf(text, sizeof text, "[model]\ninput = 32\nlayer = linear fc1 64\nlayer = moe m "
                 "experts=4 topk=1 hidden=32\nlayer = linear head 4\nloss = softmax_xent\n"
                 "[quant]\nrecipe = %s\n[optim]\nadamw\n[data]\ntrain = synthetic classes "
                 "inputs=32 classes=4 samples=64\nbatch = 8\n[schedule]\ntrain 1\n",
                 rules_scheme_name((qt_scheme)s));
        CHECK(parse(text) == QT_OK, "%s: %s", rules_scheme_name((qt_scheme)s),
              qt_error_message());
        static qt_role_quantizer table[RECIPE_ROLES_MAX];
        size_t count = 0;
        CHECK(recipe_resolve_roles(&R, table, RECIPE_ROLES_MAX, &count) == QT_OK && count == 15,
              "%s: %zu roles", rules_scheme_name((qt_scheme)s), count);
        for (size_t i = 0; i < count; i++) {
            const qt_role *role = &table[i].role;
            const qt_quantizer *q = &table[i].quantizer;
            bool router = role->module_type == QT_MODULE_ROUTER;
            qt_quantizer expected = rules_scheme_defaults(router ? QT_SCHEME_BF16 : (qt_scheme)s,
                                                          role->tensor_type);
            char got[128];
            rules_quantizer_format(q, got, sizeof got);
            CHECK(quantizer_equal(q, &expected) && q->rule_line == 0, "%s %s: %s",
                  rules_scheme_name((qt_scheme)s), role->name, got);
            const char *builtin = rules_builtin_text((qt_scheme)s, q->rule_index);
            CHECK(strcmp(got, rule_target(builtin)) == 0, "'%s' printed as '%s'", builtin, got);
        }
    }
    test_end();
}

static void test_numerics_defaults(void) {
    test_begin("builtin_defaults_follow_numerics");
    const qt_tensor_type I = QT_TENSOR_INPUT, W = QT_TENSOR_WEIGHT, D = QT_TENSOR_GRAD_OUTPUT;
    qt_quantizer q = rules_scheme_defaults(QT_SCHEME_DELAYED, I);
    CHECK(q.elem == QT_ELEM_E4M3 && q.history_len == 1024 && q.margin == 0 &&
          q.amax_algo == QT_AMAX_MAX && q.format == QT_FORMAT_FP8_E4M3, "delayed input");
    q = rules_scheme_defaults(QT_SCHEME_DELAYED, D);
    CHECK(q.elem == QT_ELEM_E5M2 && q.format == QT_FORMAT_FP8_E5M2, "delayed grad: HYBRID");
    q = rules_scheme_defaults(QT_SCHEME_CURRENT, D);
    CHECK(q.elem == QT_ELEM_E5M2 && !q.pow2 && q.amax_eps == 0.0f && q.history_len == 0,
          "current grad");
    q = rules_scheme_defaults(QT_SCHEME_MXFP8, D);
    CHECK(q.elem == QT_ELEM_E4M3 && q.format == QT_FORMAT_MXFP8 && !q.two_d, "mxfp8 grad");
    q = rules_scheme_defaults(QT_SCHEME_BLOCK, W);
    CHECK(q.pow2 && q.two_d && q.format == QT_FORMAT_FP8_BLOCK_2D, "block weight 128x128");
    q = rules_scheme_defaults(QT_SCHEME_BLOCK, D);
    CHECK(q.pow2 && !q.two_d && q.format == QT_FORMAT_FP8_BLOCK_1D, "block grad 1x128");
    q = rules_scheme_defaults(QT_SCHEME_NVFP4, W);
    CHECK(q.two_d && !q.rht && !q.sr && q.rht_mask == 0 && q.elem == QT_ELEM_E2M1, "nvfp4 w");
    q = rules_scheme_defaults(QT_SCHEME_NVFP4, I);
    CHECK(!q.two_d && q.rht && !q.sr && q.rht_mask == 0xD7E8, "nvfp4 input");
    q = rules_scheme_defaults(QT_SCHEME_NVFP4, D);
    CHECK(!q.two_d && q.rht && q.sr, "nvfp4 grad");
    // Bare rules resolve like the built-in recipes (router aside, which those keep in BF16).
    for (int s = 0; s < QT_SCHEME_COUNT; s++) {
        char text[1024];
        snprintf(text, sizeof text, "[model]\ninput = 8\nlayer = linear fc1 8\nloss = mse\n"
                 "[quant]\nrecipe = none\nrule = *.*@* -> %s\n[optim]\nadamw\n[data]\n"
                 "train = synthetic teacher inputs=8 outputs=8 samples=8\nbatch = 8\n"
                 "[schedule]\ntrain 1\n", rules_scheme_name((qt_scheme)s));
        CHECK(parse(text) == QT_OK, "%s", qt_error_message());
        for (int t = 0; t < QT_TENSOR_COUNT; t++) {
            qt_quantizer got = resolve(QT_MODULE_LINEAR, (qt_tensor_type)t, "fc1");
            qt_quantizer want = rules_scheme_defaults((qt_scheme)s, (qt_tensor_type)t);
            CHECK(quantizer_equal(&got, &want) && got.rule_line == 7, "%s tensor %d",
                  rules_scheme_name((qt_scheme)s), t);
        }
    }
    // Every option of a rule lands in the quantizer, over the defaults.
    CHECK(parse(build(8, 'I', "rule = linear.*@fc1 -> nvfp4 sr=0 rht=0\n"
                     "rule = linear.*@head -> current e5m2 pow2=1 eps=1e-6\n"
                     "rule = *.weight@* -> mxfp8 e5m2 2d=1")) == QT_OK, "%s", qt_error_message());
    q = resolve(QT_MODULE_LINEAR, D, "fc1");
    CHECK(q.scheme == QT_SCHEME_NVFP4 && !q.sr && !q.rht && q.rht_mask == 0, "nvfp4 options");
    q = resolve(QT_MODULE_LINEAR, I, "head");
    CHECK(q.elem == QT_ELEM_E5M2 && q.format == QT_FORMAT_FP8_E5M2 && q.pow2 &&
          q.amax_eps == 1e-6f, "current options");
    q = resolve(QT_MODULE_LINEAR, W, "other");
    CHECK(q.two_d && q.elem == QT_ELEM_E5M2 && q.format == QT_FORMAT_MXFP8, "mxfp8 2-D weight");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Robustness: random, truncated and mutated files fail cleanly (or parse into a sane recipe)

// A sanitizer build may run a longer round: -DFUZZ_SCALE=20.
#ifndef FUZZ_SCALE
#define FUZZ_SCALE 1
#endif

static uint64_t rng_state;

static uint64_t rng_next(void) {  // splitmix64
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint32_t n) { return (uint32_t)(rng_next() % n); }

// Words that reach deep into the parser when spliced into a file.
static const char *const fuzz_words[] = {
    "[model]", "[quant]", "[optim]", "[data]", "[schedule]", "layer = ", "linear", "moe",
    "residual begin", "residual end", "=", "->", "*", "@", ".", "#", "\n", "\r\n", "\t", " ", "0",
    "1", "1e-3", "99999999999999999999", "-1", "nan", "inf", "0x10", "rule = *.*@* -> ", "nvfp4",
    "2d=1", "rht=1", "sr=1", "history=0", "swiglu", "all", "train ", "eval ", "infer ",
    "experts=", "topk=", "hidden=", "synthetic classes ", "idx a b", "recipe = none",
    "layer = rmsnorm", "\xff", "e5m2", "cosine 1 -> 0", "[", "]", "rule = linear.*@fc? -> bf16",
    " epochs", " steps", " eval every epoch", " warmup 2 steps", "decay 1 -> 0", " task=3",
};
#define FUZZ_WORDS (sizeof fuzz_words / sizeof fuzz_words[0])

typedef struct fuzz_stats {
    uint32_t cases;
    uint32_t parsed;
    uint32_t failed;
} fuzz_stats;

// One parse of text[0 .. bytes) from an exactly-sized heap copy (so a sanitizer sees any read
// past the end), checked for a clean outcome.
static void fuzz_one(const char *text, size_t bytes, fuzz_stats *stats) {
    char *copy = malloc(bytes ? bytes : 1);
    if (bytes) memcpy(copy, text, bytes);
    qt_status s = recipe_parse(copy, bytes, "r.recipe", &R);
    free(copy);
    stats->cases++;
    if (s != QT_OK) {
        stats->failed++;
        unsigned line = 0, col = 0;
        int fields = sscanf(qt_error_message(), "r.recipe:%u:%u: ", &line, &col);
        CHECK(s == QT_ERR_INPUT || s == QT_ERR_CAPACITY, "status %s", qt_status_name(s));
        CHECK(fields == 2 && line >= 1 && col >= 1, "message '%s'", qt_error_message());
        return;
    }
    stats->parsed++;
    CHECK(R.model.layers_count <= RECIPE_LAYERS_MAX && R.quant.rules_count <= RECIPE_RULES_MAX &&
          R.rows_count >= 1 && R.rows_count <= RECIPE_SCHEDULE_ROWS_MAX, "counts");
    for (uint32_t i = 0; i < R.model.layers_count; i++) {
        const recipe_layer *l = &R.model.layers[i];
        CHECK(l->in_features >= 1 && l->out_features >= 1 &&
              l->out_features <= RECIPE_FEATURES_MAX, "layer %u widths", i);
    }
    static qt_role_quantizer table[RECIPE_ROLES_MAX];
    size_t count;
    CHECK(recipe_resolve_roles(&R, table, RECIPE_ROLES_MAX, &count) == QT_OK, "resolve after "
          "parse: %s", qt_error_message());
}

static size_t mutate(const char *seed_text, size_t seed_bytes, char *out, size_t out_max) {
    size_t bytes = seed_bytes < out_max ? seed_bytes : out_max;
    memcpy(out, seed_text, bytes);
    uint32_t edits = 1 + rng_below(4);
    for (uint32_t e = 0; e < edits && bytes > 0; e++) {
        size_t at = rng_below((uint32_t)bytes);
        switch (rng_below(4)) {
        case 0: out[at] = (char)rng_next(); break;                       // any byte
        case 1: {                                                         // delete a run
            size_t run = 1 + rng_below(40);
            if (run > bytes - at) run = bytes - at;
            memmove(out + at, out + at + run, bytes - at - run);
            bytes -= run;
            break;
        }
        case 2: {                                                         // insert a word
            const char *w = fuzz_words[rng_below(FUZZ_WORDS)];
            size_t n = strlen(w);
            if (n == 0) n = 1;  // "\0"-like words are not in the list; keep it simple
            if (bytes + n > out_max) break;
            memmove(out + at + n, out + at, bytes - at);
            memcpy(out + at, w, n);
            bytes += n;
            break;
        }
        default: {                                                        // duplicate a run
            size_t run = 1 + rng_below(120);
            if (run > bytes - at) run = bytes - at;
            if (bytes + run > out_max) break;
            memmove(out + at + run, out + at, bytes - at);
            bytes += run;
            break;
        }
        }
    }
    return bytes;
}

static void test_fuzz(void) {
    test_begin("fuzz_random_truncated_mutated_fail_cleanly");
    static char seeds[3][1 << 14], out[1 << 15];
    static const char *const files[3] = {
        "tests/recipes/mlp_fashion.recipe", "tests/recipes/moe_residual.recipe",
        "tests/recipes/classes_block.recipe",
    };
    size_t seed_bytes[3] = {0, 0, 0};
    for (int f = 0; f < 3; f++) {
        FILE *file = fopen(files[f], "rb");
        CHECK(file != NULL, "open %s", files[f]);
        if (file) {
            seed_bytes[f] = fread(seeds[f], 1, sizeof seeds[f], file);
            fclose(file);
        }
    }
    clock_t start = clock();
    fuzz_stats stats = {0, 0, 0};
    rng_state = 12345;
    for (int f = 0; f < 3; f++) {                      // every prefix of every example
        for (size_t n = 0; n <= seed_bytes[f]; n++) fuzz_one(seeds[f], n, &stats);
    }
    for (int i = 0; i < 3000 * FUZZ_SCALE; i++) {      // random bytes
        size_t n = rng_below(700);
        for (size_t k = 0; k < n; k++) out[k] = (char)rng_next();
        fuzz_one(out, n, &stats);
    }
    for (int i = 0; i < 3000 * FUZZ_SCALE; i++) {      // random words
        size_t n = 0;
        for (uint32_t k = rng_below(80); k > 0; k--) {
            const char *w = fuzz_words[rng_below(FUZZ_WORDS)];
            size_t len = strlen(w);
            if (n + len >= sizeof out) break;
            memcpy(out + n, w, len);
            n += len;
        }
        fuzz_one(out, n, &stats);
    }
    for (int i = 0; i < 12000 * FUZZ_SCALE; i++) {     // mutations of the examples
        int f = (int)rng_below(3);
        size_t n = mutate(seeds[f], seed_bytes[f], out, sizeof out);
        fuzz_one(out, n, &stats);
    }
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    printf("  %u cases in %.2f s: %u parsed, %u failed cleanly\n", stats.cases, seconds,
           stats.parsed, stats.failed);
    CHECK(stats.cases >= 20000, "cases %u", stats.cases);
    CHECK(stats.parsed > 100, "mutations that still parse: %u", stats.parsed);
    CHECK(seconds < 5.0 * FUZZ_SCALE, "took %.2f s", seconds);  // the brief's budget for this round
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The schedule: the train row's units and clauses, and the fixed table they expand to

// The base recipe with an eval source and the given [schedule] rows (from line 16).
static const char *with_rows(const char *rows) {
    static char text[1 << 14];
    snprintf(text, sizeof text, "%.*seval = synthetic classes inputs=4 classes=3 samples=64 "
             "seed=6 task=5\nbatch = 16\n[schedule]\n%s\n", (int)(strstr(build(0, 'N', ""),
             "batch = 16") - build(0, 'N', "")), build(0, 'N', ""), rows);
    return text;
}

#define TABLE_ROWS 8192    // rows of the tables these tests build
#define TABLE_LR_ROWS 256
static sched_table T, U;
static uint64_t table_memory[2][(TABLE_ROWS * sizeof(sched_row) +
                                 TABLE_LR_ROWS * sizeof(optim_lr_row)) / 8 + 1];

// Builds R's table for a train set of 60000 and an eval set of 10000 samples in batches of
// `batch` into t (T or U), or counting only (no rows stored).
static qt_status table_build(sched_table *t, uint32_t batch, uint64_t steps_limit,
                             bool counting) {
    QT_ASSERT(sched_table_bytes(TABLE_ROWS, TABLE_LR_ROWS) <= sizeof table_memory[0]);
    if (counting) {
        sched_table_init(t, NULL, 0, 0);
    } else {
        sched_table_init(t, table_memory[t == &U], TABLE_ROWS, TABLE_LR_ROWS);
    }
    sched_build b = {60000, 10000, batch, steps_limit, 0, 0, false};
    return sched_table_build(&R, &b, t);
}

// Parses rows and builds their table in batches of 256 (Fashion-MNIST's sizes: an epoch is 235
// steps, an eval pass 40).
static qt_status table_of(const char *rows, uint64_t steps_limit, sched_table *t) {
    QT_TRY(parse(with_rows(rows)));
    return table_build(t, 256, steps_limit, false);
}

static bool lr_row_is(const optim_lr_row *lr, uint64_t start, uint64_t steps, uint32_t rule,
                      float a, float b) {
    return lr->start == start && lr->steps == steps && lr->rule == rule && lr->a == a &&
           lr->b == b;
}

// Row i of t with the rows after it that continue it (same mode and dataset) merged, from
// *next; false after the last.
static bool merged_row(const sched_table *t, uint32_t *next, sched_row *out) {
    if (*next >= t->row_count) return false;
    *out = t->rows[(*next)++];
    while (*next < t->row_count && t->rows[*next].mode == out->mode &&
           t->rows[*next].dataset == out->dataset) {
        out->steps += t->rows[(*next)++].steps;
    }
    return true;
}

// Both tables run the same steps: the same mode on the same dataset at every step (how the
// steps are split into rows does not show in a trace).
static bool same_rows(const sched_table *a, const sched_table *b) {
    uint32_t i = 0, j = 0;
    sched_row x, y;
    for (;;) {
        bool more_a = merged_row(a, &i, &x), more_b = merged_row(b, &j, &y);
        if (more_a != more_b) return false;
        if (!more_a) return true;
        if (x.mode != y.mode || x.steps != y.steps || x.dataset != y.dataset) return false;
    }
}

// Every train step gets the same learning rate, bit for bit, from both tables (what the device
// computes, ptx/optim.h).
static bool same_lr_curve(const sched_table *a, const sched_table *b) {
    for (uint64_t s = 0; s < a->steps[MODEL_MODE_TRAIN]; s++) {
        float x = qt_optim_lr_at(a->lr, a->lr_count, s), y = qt_optim_lr_at(b->lr, b->lr_count, s);
        if (memcmp(&x, &y, sizeof x) != 0) return false;
    }
    return a->steps[MODEL_MODE_TRAIN] == b->steps[MODEL_MODE_TRAIN];
}

static void test_schedule_parse(void) {
    test_begin("schedule_units_rules_and_clauses_parse");
    CHECK(parse(with_rows("train 10 epochs decay 1e-3 -> 1e-5 warmup 47 steps eval every epoch\n"
                          "train 2 epoch eval 5 train every 100 steps warmup 1 epoch\n"
                          "train 7 step cosine 1 -> 0\ntrain 300 warmup 0 -> 1e-3")) == QT_OK,
          "%s", qt_error_message());
    const recipe_row *a = &R.rows[0], *b = &R.rows[1], *c = &R.rows[2], *d = &R.rows[3];
    CHECK(a->steps == 10 && a->unit == RECIPE_UNIT_EPOCHS && a->lr_kind == RECIPE_LR_DECAY &&
          a->lr_from == 1e-3f && a->lr_to == 1e-5f && a->warmup == 47 &&
          a->warmup_unit == RECIPE_UNIT_STEPS && a->eval_every == 1 &&
          a->eval_unit == RECIPE_UNIT_EPOCHS && a->eval_all && a->dataset == RECIPE_DATASET_EVAL,
          "row 1");
    CHECK(b->steps == 2 && b->unit == RECIPE_UNIT_EPOCHS && b->lr_kind == RECIPE_LR_CONSTANT &&
          b->lr_from == 1e-3f && b->warmup == 1 && b->warmup_unit == RECIPE_UNIT_EPOCHS &&
          b->eval_every == 100 && b->eval_unit == RECIPE_UNIT_STEPS && !b->eval_all &&
          b->eval_steps == 5 && b->dataset == RECIPE_DATASET_TRAIN, "row 2");
    CHECK(c->unit == RECIPE_UNIT_STEPS && c->lr_kind == RECIPE_LR_COSINE && !c->eval_every &&
          !c->warmup, "row 3");
    CHECK(d->steps == 300 && d->lr_kind == RECIPE_LR_WARMUP && d->lr_from == 0.0f &&
          d->lr_to == 1e-3f, "row 4: warmup as the rule");
    test_end();
}

static void test_schedule_table(void) {
    test_begin("schedule_expands_to_one_fixed_table");
    // The shipped recipes' row: ten epochs, an eval pass after each, one learning-rate curve.
    const char *shipped = "train 10 epochs decay 1e-3 -> 1e-5 warmup 47 steps eval every epoch";
    CHECK(table_of(shipped, 0, &T) == QT_OK, "%s", qt_error_message());
    CHECK(T.row_count == 20 && T.steps[MODEL_MODE_TRAIN] == 2350 &&
          T.steps[MODEL_MODE_EVAL] == 400 && T.epoch_steps == 235 && !T.cut &&
          T.modes[MODEL_MODE_EVAL], "%u rows", T.row_count);
    for (uint32_t i = 0; i < T.row_count && i < 20; i++) {
        const sched_row *row = &T.rows[i];
        bool train = i % 2 == 0;
        CHECK(row->mode == (train ? MODEL_MODE_TRAIN : MODEL_MODE_EVAL) &&
              row->steps == (train ? 235u : 40u) && row->line == 16 &&
              (train || row->dataset == RECIPE_DATASET_EVAL), "row %u", i);
    }
    CHECK(T.lr_count == 2 && lr_row_is(&T.lr[0], 0, 47, QT_OPTIM_LR_LINEAR, 0.0f, 1e-3f) &&
          lr_row_is(&T.lr[1], 47, 2303, QT_OPTIM_LR_LINEAR, 1e-3f, 1e-5f), "lr rows");
    // --steps cuts the expanded rows; the eval after the cut still runs, the curve is whole.
    CHECK(table_of(shipped, 20, &T) == QT_OK && T.row_count == 2 && T.rows[0].steps == 20 &&
          T.rows[1].mode == MODEL_MODE_EVAL && T.cut && T.lr_count == 2, "cut at 20");
    CHECK(table_of(shipped, 300, &T) == QT_OK && T.row_count == 4 && T.rows[2].steps == 65 &&
          T.steps[MODEL_MODE_TRAIN] == 300 && T.steps[MODEL_MODE_EVAL] == 80, "cut at 300");
    // A warmup in epochs, an eval clause in steps on the train set: 4 x 100 + 70 train steps.
    CHECK(table_of("train 2 epochs cosine 1e-2 -> 0 warmup 1 epoch eval 3 train every 100 "
                   "steps", 0, &T) == QT_OK, "%s", qt_error_message());
    CHECK(T.row_count == 10 && T.rows[8].steps == 70 && T.rows[9].steps == 3 &&
          T.rows[5].dataset == RECIPE_DATASET_TRAIN && T.steps[MODEL_MODE_TRAIN] == 470 &&
          lr_row_is(&T.lr[0], 0, 235, QT_OPTIM_LR_LINEAR, 0.0f, 1e-2f) &&
          lr_row_is(&T.lr[1], 235, 235, QT_OPTIM_LR_COSINE, 1e-2f, 0.0f), "%u rows",
          T.row_count);
    // Errors that need the epoch's length name the row.
    CHECK(table_of("train 1 epoch warmup 2 epochs", 0, &T) == QT_ERR_INPUT &&
          strcmp(qt_error_message(), "r.recipe:16:15: a warmup of 2 epochs in a row of 235 "
                 "steps (an epoch is 235 steps); expected a warmup shorter than its row") == 0,
          "%s", qt_error_message());
    CHECK(parse(with_rows("train 2147483647 epochs")) == QT_OK &&
          table_build(&T, 1, 0, false) == QT_ERR_INPUT &&
          strcmp(qt_error_message(), "r.recipe:16:7: 2147483647 epochs of 60000 steps exceed a "
                 "row's 1099511627776 steps; expected fewer epochs") == 0, "%s",
          qt_error_message());
    // The table's memory is sized from a counting build, which stops at the rows' limit.
    CHECK(parse(with_rows("train 600000 eval 1 every 1 step")) == QT_OK &&
          table_build(&T, 256, 0, true) == QT_ERR_CAPACITY &&
          strstr(qt_error_message(), "r.recipe:16:1: the schedule expands to more than 1048576 "
                 "rows") == qt_error_message(), "%s", qt_error_message());
    test_end();
}

// The new syntax gives the table of the old rows it replaces wherever the learning rates are the
// same, so a recipe rewritten with it trains to the same bits (a run compares traces:
// tests/cli.sh).
static void test_schedule_same_table(void) {
    test_begin("schedule_new_syntax_same_table_as_old_rows");
    // A warmup clause is the old pair of rows: a `warmup` row, then the rule's row.
    CHECK(table_of("train 40 warmup 0 -> 1e-2\ntrain 430 cosine 1e-2 -> 1e-3\neval all", 0, &T) ==
          QT_OK, "%s", qt_error_message());
    CHECK(table_of("train 2 epochs cosine 1e-2 -> 1e-3 warmup 40 steps\neval all", 0, &U) ==
          QT_OK, "%s", qt_error_message());
    CHECK(same_rows(&T, &U) && T.lr_count == U.lr_count &&
          memcmp(T.lr, U.lr, T.lr_count * sizeof T.lr[0]) == 0, "warmup clause");
    // The shipped recipes' old form (a warmup, one constant epoch, nine per-epoch decays, an eval
    // pass after every epoch) in the new syntax: the same rows and learning-rate rows.
    static char old_rows[2048], new_rows[2048];
    static const char *const ends[] = {"0.001", "0.00089", "0.00078", "0.00067", "0.00056",
                                       "0.00045", "0.00034", "0.00023", "0.00012", "1e-05"};
    size_t o = (size_t)snprintf(old_rows, sizeof old_rows, "train 47 warmup 0 -> 1e-3\n"
                                "train 188 constant 1e-3\neval all\n");
    size_t n = (size_t)snprintf(new_rows, sizeof new_rows, "train 47 steps warmup 0 -> 1e-3\n"
                                "train 188 steps constant 1e-3 eval every epoch\n");
    for (int e = 0; e < 9; e++) {
        o += (size_t)snprintf(old_rows + o, sizeof old_rows - o, "train 235 warmup %s -> %s\n"
                              "eval all\n", ends[e], ends[e + 1]);
        n += (size_t)snprintf(new_rows + n, sizeof new_rows - n, "train 1 epoch decay %s -> %s "
                              "eval every epoch\n", ends[e], ends[e + 1]);
    }
    // The old form used `warmup` for the decays, which the parser now refuses: the old table is
    // built from the same text with the rule's new name for a falling ramp, which is the same
    // linear rule.
    for (char *w = strstr(old_rows + 20, "warmup"); w; w = strstr(w + 1, "warmup")) {
        memcpy(w, "decay ", 6);
    }
    CHECK(table_of(old_rows, 0, &T) == QT_OK, "old: %s", qt_error_message());
    CHECK(table_of(new_rows, 0, &U) == QT_OK, "new: %s", qt_error_message());
    CHECK(same_rows(&T, &U) && T.row_count == 21 && U.row_count == 21 && T.lr_count == 11 &&
          memcmp(T.lr, U.lr, T.lr_count * sizeof T.lr[0]) == 0, "shipped form: %u and %u rows",
          T.row_count, U.row_count);
    // The one-row form the shipped recipes use now runs the same steps on another curve: its
    // decay starts after the warmup instead of after the first epoch (so their traces changed).
    CHECK(table_of("train 10 epochs decay 1e-3 -> 1e-5 warmup 47 steps eval every epoch", 0,
                   &U) == QT_OK, "%s", qt_error_message());
    CHECK(same_rows(&T, &U) && !same_lr_curve(&T, &U), "one-row form");
    float old_lr = qt_optim_lr_at(T.lr, T.lr_count, 235), new_lr = qt_optim_lr_at(U.lr,
                                                                                 U.lr_count, 235);
    CHECK(old_lr == 1e-3f && new_lr < 1e-3f && new_lr > 0.9e-3f &&
          qt_optim_lr_at(U.lr, U.lr_count, 47) == 1e-3f &&
          qt_optim_lr_at(U.lr, U.lr_count, 0) == 0.0f, "step 235: %g and %g", (double)old_lr,
          (double)new_lr);
    // An eval clause is the old train rows with eval rows between: the rows are the same and so
    // is every step's learning rate (one rule row instead of one per piece).
    CHECK(table_of("train 235 constant 1e-2\neval all\ntrain 235 constant 1e-2\neval all\n"
                   "train 100 constant 1e-2\neval all", 0, &T) == QT_OK, "%s",
          qt_error_message());
    CHECK(table_of("train 570 steps constant 1e-2 eval every epoch", 0, &U) == QT_OK, "%s",
          qt_error_message());
    CHECK(same_rows(&T, &U) && same_lr_curve(&T, &U), "eval clause");
    test_end();
}

int main(void) {
    test_example_mlp();
    test_example_moe_residual();
    test_example_classes();
    test_crlf_tabs_comments();
    test_locale();
    test_load_errors();
    test_synthetic_task();
    test_synthetic_zipf();
    test_npy_source();
    test_infer_output();
    test_recompute_flag();
    test_no_train_source();
    test_schedule_parse();
    test_schedule_table();
    test_schedule_same_table();
    test_error_messages();
    test_error_limits();
    test_glob();
    test_precedence();
    test_role_enumeration();
    test_builtins();
    test_numerics_defaults();
    test_fuzz();
    return test_exit_code();
}
