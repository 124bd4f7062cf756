// test_infer: what a run takes from and gives to files, end to end on the reference backend.
//
// .npy training data: a synthetic dataset saved as float32 features and int32 labels trains to
// the byte-identical trace of the synthetic source itself, and IDX images saved as uint8 features
// with uint8 labels to that of the IDX files (both input paths of the staging slot); a run
// refuses .npy data that does not fit the model or the loss, by file name.
//
// Outputs to files: a recipe's infer rows write .npy files whose argmax predictions reproduce
// the eval pass's accuracy exactly and whose logits give its loss, one row per sample (padding
// dropped, passes repeated in order); `qtrain infer` writes the logits of a one-layer model as a
// direct C computation from its weights gives them, reproduces the eval accuracy of the
// recipe's initial weights, reads IDX and .npy inputs alike, and refuses what it must (an
// existing output without --force, --from a missing checkpoint, inputs of another width);
// `qtrain infer --from CKPT` reproduces the eval accuracy of the run that saved CKPT in every
// format. Run from the repository root.
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>  // WEXITSTATUS
#include <unistd.h>

#include "runtime/driver/driver.h"  // driver_sync_total
#include "tests/files.h"            // tmp_path, file_read, command_output
#include "tests/npy_save.h"
#include "tests/plan.h"             // test_run_plan
#include "ptx/qt_codec.h"           // qt_bf16_to_f32, qt_f32_to_bf16
#include "runtime/run/run.h"
#include "tests/test.h"

static run the_run;
static recipe the_recipe;

// ---------------------------------------------------------------------------------------------
// Helpers

// Two traces of different recipe texts: the same records (the header's recipe hash differs).
static void check_same_records(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *ta = file_read(a, &na), *tb = file_read(b, &nb);
    const char *ra = ta ? strchr(ta, '\n') : NULL, *rb = tb ? strchr(tb, '\n') : NULL;
    CHECK(ra && rb && strlen(ra) > 1 && strcmp(ra, rb) == 0, "%s and %s have other records "
          "(%zu and %zu bytes)", a, b, na, nb);
    free(ta);
    free(tb);
}

// The tiny classifier of tests/recipes/synthetic_tiny.recipe with the given sources and rows.
static const char *recipe_with(const char *train, const char *eval, const char *rows) {
    static char text[4096];
    snprintf(text, sizeof text,
             "[model]\ninput = 16\nlayer = linear fc1 32 bias\nlayer = relu\n"
             "layer = linear head 4\nloss = softmax_xent\n[quant]\nrecipe = bf16\n"
             "[optim]\nadamw lr=1e-2 wd=0.01 clip=1.0\n[data]\ntrain = %s\n%s%s%s"
             "batch = 16\nseed = 11\n[schedule]\n%s",
             train, eval ? "eval = " : "", eval ? eval : "", eval ? "\n" : "", rows);
    return text;
}

static void *arena_memory(uint64_t bytes) {
    return aligned_alloc(256, ((bytes + 255) / 256 + 1) * 256);
}

// Called after the loop, before the run closes (a look at the weights).
typedef void (*inspect_fn)(run *r, backend *b, void *ctx);
static inspect_fn inspect;
static void *inspect_ctx;

static uint64_t loop_syncs;  // synchronizing driver calls during the last run's loop

// Plans, loads, binds and runs a recipe text on the backend b (open).
static qt_status run_on(backend *b, const char *text, const run_options *o, sched_summary *sum) {
    QT_TRY(recipe_parse(text, strlen(text), "t.recipe", &the_recipe));
    QT_TRY(test_run_plan(&the_run, &the_recipe, text, strlen(text), o));
    void *dev = NULL, *host = NULL;
    if (b->kind == BACKEND_REF) {
        uint64_t dev_bytes, host_bytes;
        run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
        dev = arena_memory(dev_bytes);
        host = arena_memory(host_bytes);
    }
    void *data = arena_memory(run_data_bytes(&the_run));
    qt_status status = run_load(&the_run, data, run_data_bytes(&the_run));
    if (status == QT_OK) status = run_bind(&the_run, b, dev, host);
    uint64_t syncs = driver_sync_total(&b->syncs);
    if (status == QT_OK) status = run_execute(&the_run, NULL, NULL, sum);
    loop_syncs = driver_sync_total(&b->syncs) - syncs;
    if (status == QT_OK && inspect) inspect(&the_run, b, inspect_ctx);
    run_close(&the_run);
    free(dev);
    free(host);
    free(data);
    return status;
}

// The same on the reference backend.
static qt_status run_text(const char *text, const run_options *o, sched_summary *sum) {
    static backend b;
    backend_open_ref(&b);
    qt_status status = run_on(&b, text, o, sum);
    backend_close(&b);
    return status;
}

#define RUN_OK(text, options, sum)                                                          \
    do {                                                                                    \
        qt_status run_status_ = run_text((text), (options), (sum));                         \
        CHECK(run_status_ == QT_OK, "%s: %s", qt_status_name(run_status_),                  \
              qt_error_message());                                                          \
    } while (0)

// A synthetic source's samples, as data_load makes them, saved as .npy features and labels.
static void save_synthetic(uint64_t samples, uint64_t seed, const char *x_name,
                           const char *y_name) {
    recipe_source src;
    memset(&src, 0, sizeof src);
    src.kind = RECIPE_SOURCE_CLASSES;
    src.inputs = 16;
    src.outputs = 4;
    src.samples = samples;
    src.seed = seed;
    src.task = seed;
    data_info info;
    data_set set;
    qt_status s = data_probe(&src, 16, 4, &info);
    void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
    if (s == QT_OK) s = data_load(&src, &info, memory, info.bytes, &set);
    if (s != QT_OK) {
        printf("  synthetic data: %s\n", qt_error_message());
        abort();
    }
    npy_save(tmp_path(x_name), NPY_DTYPE_F32, 2, info.samples, 16, set.inputs_f32);
    npy_save(tmp_path(y_name), NPY_DTYPE_I32, 1, info.samples, 1, set.labels);
    free(memory);
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

// `count` 4 x 4 images whose pixels depend on their label, as IDX files and as .npy files.
static void save_images(uint32_t count, uint32_t salt, const char *stem) {
    size_t pixels = (size_t)count * 16;
    uint8_t *im = malloc(16 + pixels), *lb = malloc(8 + count);
    put_be32(im, 0x803);
    put_be32(im + 4, count);
    put_be32(im + 8, 4);
    put_be32(im + 12, 4);
    put_be32(lb, 0x801);
    put_be32(lb + 4, count);
    for (uint32_t s = 0; s < count; s++) {
        uint8_t label = (uint8_t)((s * 7 + salt) % 4);
        lb[8 + s] = label;
        for (uint32_t p = 0; p < 16; p++) {
            im[16 + s * 16 + p] = (uint8_t)((p % 4 == label ? 160 : 20) + (s * 13 + p * 5) % 64);
        }
    }
    char name[64];
    const struct {
        const char *suffix;
        const uint8_t *bytes;
        size_t size;
    } files[] = {{"-images.idx", im, 16 + pixels}, {"-labels.idx", lb, 8 + count}};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s", stem, files[i].suffix);
        FILE *f = fopen(tmp_path(name), "wb");
        fwrite(files[i].bytes, 1, files[i].size, f);
        fclose(f);
    }
    snprintf(name, sizeof name, "%s-x.npy", stem);
    npy_save(tmp_path(name), NPY_DTYPE_U8, 2, count, 16, im + 16);
    snprintf(name, sizeof name, "%s-y.npy", stem);
    npy_save(tmp_path(name), NPY_DTYPE_U8, 1, count, 1, lb + 8);
    free(im);
    free(lb);
}

static const char *pair(const char *kind, const char *a, const char *b) {
    static char out[4][400];
    static int next;
    char *p = out[next++ % 4];
    snprintf(p, 400, "%s %s %s", kind, tmp_path(a), tmp_path(b));
    return p;
}

// ---------------------------------------------------------------------------------------------
// .npy as training data

static void test_npy_f32_like_synthetic(void) {
    test_begin("train_npy_float32_same_trace_as_synthetic");
    save_synthetic(512, 3, "train-x.npy", "train-y.npy");
    save_synthetic(64, 3, "eval-x.npy", "eval-y.npy");
    const char *rows = "train 60 cosine 1e-2 -> 1e-3\neval all\n";
    run_options o = {0};
    o.checksum_every = 20;
    o.trace_path = tmp_path("synthetic.trace");
    sched_summary a, b;
    RUN_OK(recipe_with("synthetic classes inputs=16 classes=4 samples=512 seed=3",
                       "synthetic classes inputs=16 classes=4 samples=64 seed=3", rows), &o, &a);
    o.trace_path = tmp_path("npy.trace");
    RUN_OK(recipe_with(pair("npy", "train-x.npy", "train-y.npy"),
                       pair("npy", "eval-x.npy", "eval-y.npy"), rows), &o, &b);
    check_same_records(tmp_path("synthetic.trace"), tmp_path("npy.trace"));
    CHECK(b.has_eval && b.eval_samples == 64 && b.eval_accuracy == a.eval_accuracy,
          "eval %" PRIu64 " samples, accuracy %g vs %g", b.eval_samples, b.eval_accuracy,
          a.eval_accuracy);
    test_end();
}

static void test_npy_u8_like_idx(void) {
    test_begin("train_npy_uint8_same_trace_as_idx");
    save_images(300, 0, "tr");
    save_images(50, 1, "ev");
    const char *rows = "train 40\neval all\n";
    run_options o = {0};
    o.checksum_every = 10;
    o.trace_path = tmp_path("idx.trace");
    sched_summary a, b;
    RUN_OK(recipe_with(pair("idx", "tr-images.idx", "tr-labels.idx"),
                       pair("idx", "ev-images.idx", "ev-labels.idx"), rows), &o, &a);
    o.trace_path = tmp_path("npy_u8.trace");
    RUN_OK(recipe_with(pair("npy", "tr-x.npy", "tr-y.npy"), pair("npy", "ev-x.npy", "ev-y.npy"),
                       rows), &o, &b);
    check_same_records(tmp_path("idx.trace"), tmp_path("npy_u8.trace"));
    CHECK(b.eval_accuracy > 0.5, "the images are learnable: eval accuracy %g", b.eval_accuracy);
    test_end();
}

// A run refuses .npy data that does not fit the model or the loss; the message names the file.
static void expect_run_refusal(const char *text, const char *fragment, const char *file) {
    run_options o = {0};
    sched_summary sum;
    qt_status s = run_text(text, &o, &sum);
    const char *m = qt_error_message();
    CHECK(s != QT_OK && strstr(m, fragment) && (!file || strstr(m, file)),
          "expected '%s' naming %s, got %s: %s", fragment, file ? file : "-", qt_status_name(s),
          m);
}

static void test_npy_run_refusals(void) {
    test_begin("train_npy_refusals");
    const char *rows = "train 2\n";
    float targets[64 * 4] = {0};
    npy_save(tmp_path("targets.npy"), NPY_DTYPE_F32, 2, 64, 4, targets);
    save_synthetic(64, 5, "x64.npy", "y64.npy");
    expect_run_refusal(recipe_with(pair("npy", "x64.npy", "targets.npy"), NULL, rows),
                       "regression targets (2-D float32), but the recipe's loss is softmax_xent",
                       "targets.npy");
    expect_run_refusal(recipe_with(pair("npy", "tr-x.npy", "tr-y.npy"),
                                   pair("npy", "x64.npy", "y64.npy"), rows),
                       "the train data has uint8 (IDX, npy uint8) inputs but the eval data "
                       "float32", NULL);
    float wide[64 * 17] = {0};
    npy_save(tmp_path("wide.npy"), NPY_DTYPE_F32, 2, 64, 17, wide);
    expect_run_refusal(recipe_with(pair("npy", "wide.npy", "y64.npy"), NULL, rows),
                       "17 features per sample; the model's input is 16", "wide.npy");
    // Each names the recipe line of the source first: train = on line 12, eval = on line 13.
    expect_run_refusal(recipe_with(pair("npy", "wide.npy", "y64.npy"), NULL, rows),
                       "t.recipe:12:9: ", "wide.npy");
    expect_run_refusal(recipe_with(pair("npy", "x64.npy", "targets.npy"), NULL, rows),
                       "t.recipe:12:9: ", "targets.npy");
    expect_run_refusal(recipe_with(pair("npy", "x64.npy", "y64.npy"),
                                   pair("npy", "absent.npy", "y64.npy"), rows),
                       "t.recipe:13:8: ", "absent.npy: cannot open");
    // Truncated: the last byte of the features is missing.
    size_t n = 0;
    char *bytes = file_read(tmp_path("x64.npy"), &n);
    FILE *f = fopen(tmp_path("cut.npy"), "wb");
    fwrite(bytes, 1, n - 1, f);
    fclose(f);
    free(bytes);
    expect_run_refusal(recipe_with(pair("npy", "cut.npy", "y64.npy"), NULL, rows), "truncated",
                       "cut.npy");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Outputs to files

// An .npy file read back whole (caller frees), with its shape.
static void *read_npy(const char *path, npy_dtype dtype, uint32_t rank, uint64_t *rows,
                      uint64_t *cols) {
    npy_expect e = {"output", {0, 0, 0}};
    e.dtypes[rank] = NPY_DTYPE_BIT(dtype);
    npy_reader r;
    if (npy_open(&r, path, &e) != QT_OK) {
        CHECK(false, "%s", qt_error_message());
        return NULL;
    }
    void *data = malloc(r.info.data_bytes + 1);
    qt_status s = npy_read(&r, data, r.info.data_bytes);
    npy_close(&r);
    CHECK(s == QT_OK, "%s", qt_error_message());
    *rows = r.info.shape[0];
    *cols = r.info.shape[1];
    return data;
}

static int32_t *read_labels(const char *path, uint64_t *rows) {
    uint64_t cols;
    return read_npy(path, NPY_DTYPE_I32, 1, rows, &cols);
}

// Correct predictions over the labels, as the device counts them.
static uint64_t count_correct(const int32_t *preds, const int32_t *labels, uint64_t n) {
    uint64_t correct = 0;
    for (uint64_t i = 0; i < n; i++) correct += preds[i] == labels[i];
    return correct;
}

static int32_t argmax_row(const float *row, uint64_t n) {
    int32_t best = 0;
    for (uint64_t j = 1; j < n; j++) best = row[j] > row[best] ? (int32_t)j : best;
    return best;
}

// Mean softmax cross-entropy of logits against labels, in double.
static double mean_xent(const float *logits, const int32_t *labels, uint64_t rows, uint64_t n) {
    double sum = 0.0;
    for (uint64_t i = 0; i < rows; i++) {
        const float *z = logits + i * n;
        double max = z[argmax_row(z, n)], exps = 0.0;
        for (uint64_t j = 0; j < n; j++) exps += exp((double)z[j] - max);
        sum += max + log(exps) - z[labels[i]];
    }
    return sum / (double)rows;
}

static void test_recipe_outputs(void) {
    test_begin("infer_rows_write_outputs_matching_eval");
    save_synthetic(512, 3, "train-x.npy", "train-y.npy");
    save_synthetic(70, 9, "ev70-x.npy", "ev70-y.npy");  // 5 batches of 16, the last has 6 rows
    char rows[1024];
    snprintf(rows, sizeof rows, "train 60\neval all\ninfer all eval output=%s argmax\n"
             "infer all output=%s\ninfer 12 output=%s\ninfer 5 train output=%s\n",
             tmp_path("preds.npy"), tmp_path("logits.npy"), tmp_path("wrap.npy"),
             tmp_path("train.npy"));
    run_options o = {0};
    sched_summary sum;
    RUN_OK(recipe_with(pair("npy", "train-x.npy", "train-y.npy"),
                       pair("npy", "ev70-x.npy", "ev70-y.npy"), rows), &o, &sum);
    uint64_t n = 0, nl = 0, cols = 0, nw = 0, nt = 0;
    int32_t *labels = read_labels(tmp_path("ev70-y.npy"), &nl);
    int32_t *preds = read_labels(tmp_path("preds.npy"), &n);
    float *logits = read_npy(tmp_path("logits.npy"), NPY_DTYPE_F32, 2, &n, &cols);
    float *wrap = read_npy(tmp_path("wrap.npy"), NPY_DTYPE_F32, 2, &nw, &cols);
    float *train = read_npy(tmp_path("train.npy"), NPY_DTYPE_F32, 2, &nt, &cols);
    CHECK(n == 70 && nl == 70 && cols == 4 && sum.eval_samples == 70, "%" PRIu64 " rows", n);
    if (preds && labels && logits && n == 70) {
        uint64_t correct = count_correct(preds, labels, n);
        CHECK((double)correct / 70.0 == sum.eval_accuracy, "predictions: %" PRIu64 "/70 correct, "
              "eval accuracy %.9g", correct, sum.eval_accuracy);
        int bad = 0;
        for (uint64_t i = 0; i < n; i++) bad += argmax_row(logits + i * 4, 4) != preds[i];
        CHECK(bad == 0, "%d rows whose logits' argmax is not the prediction", bad);
        // The device sums float losses per batch; 1e-5 covers the rounding of 5 batch means.
        double loss = mean_xent(logits, labels, n, 4);
        CHECK(fabs(loss - sum.eval_loss) <= 1e-5 * sum.eval_loss, "loss from the logits %.9g, "
              "eval loss %.9g", loss, sum.eval_loss);
    }
    // 12 steps of 5 per pass: two passes and two batches, 70 + 70 + 32 rows in order.
    CHECK(nw == 172 && wrap && logits && memcmp(wrap, logits, 70 * 16) == 0 &&
              memcmp(wrap + 70 * 4, logits, 70 * 16) == 0 &&
              memcmp(wrap + 140 * 4, logits, 32 * 16) == 0, "wrapped rows: %" PRIu64, nw);
    CHECK(nt == 80, "5 train steps: %" PRIu64 " rows", nt);
    free(labels);
    free(preds);
    free(logits);
    free(wrap);
    free(train);
    test_end();
}

static const char *write_recipe(const char *name, const char *text) {
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
    return path;
}

// The weight of a one-layer model, read from the bound run.
typedef struct weight_copy {
    float w[4 * 16];
} weight_copy;

static void read_weight(run *r, backend *b, void *ctx) {
    weight_copy *c = ctx;
    const model_param *pa = &r->model.params[0];
    CHECK(pa->rows == 4 && pa->cols == 16, "param %s is %u x %u", pa->name, pa->rows, pa->cols);
    prog_ref master = {&r->dev, pa->master, 0};
    qt_status s = backend_read(b, c->w, master, sizeof c->w);
    CHECK(s == QT_OK, "%s", qt_error_message());
}

static float bf16_round(float x) { return qt_bf16_to_f32(qt_f32_to_bf16(x)); }

// `qtrain infer` of a BF16 linear layer against logits computed here from the same weights.
static void test_infer_direct(void) {
    test_begin("qtrain_infer_logits_direct_computation");
    const char *layer = "[model]\ninput = 16\nlayer = linear head 4\nloss = softmax_xent\n"
                        "[quant]\nrecipe = bf16\n[optim]\nadamw\n[data]\n";
    char text[1024];
    snprintf(text, sizeof text, "%strain = %s\nbatch = 16\nseed = 5\n[schedule]\neval 1 train\n",
             layer, pair("npy", "ev70-x.npy", "ev70-y.npy"));
    const char *recipe_path = write_recipe("one.recipe", text);
    static weight_copy weights;
    inspect = read_weight;
    inspect_ctx = &weights;
    run_options o = {0};
    sched_summary sum;
    RUN_OK(text, &o, &sum);
    inspect = NULL;
    static char out[1 << 14];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "build/qtrain infer %s --ref --input %s --output %s", recipe_path,
             tmp_path("ev70-x.npy"), tmp_path("direct.npy"));
    int rc = command_output(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "70 x 4 float32 logits"), "exit %d: %s", rc, out);
    uint64_t rows = 0, cols = 0;
    float *x = read_npy(tmp_path("ev70-x.npy"), NPY_DTYPE_F32, 2, &rows, &cols);
    float *y = read_npy(tmp_path("direct.npy"), NPY_DTYPE_F32, 2, &rows, &cols);
    CHECK(rows == 70 && cols == 4, "shape %" PRIu64 " x %" PRIu64, rows, cols);
    int bad = 0;
    for (uint64_t i = 0; x && y && rows == 70 && i < rows * 4; i++) {
        uint64_t s = i / 4, j = i % 4;
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) {
            acc += bf16_round(x[s * 16 + k]) * bf16_round(weights.w[j * 16 + k]);
        }
        // The GEMM sums in another order: the FP32 sums differ by a few ulps, which the BF16
        // rounding of the output can turn into one BF16 ulp (2^-8 relative).
        float expected = bf16_round(acc);
        if (fabsf(y[i] - expected) > 0x1p-7f * fabsf(expected) + 1e-6f) {
            if (bad++ < 4) printf("  row %" PRIu64 " col %" PRIu64 ": %g, expected %g\n", s, j,
                                  (double)y[i], (double)expected);
        }
        bad += y[i] != bf16_round(y[i]);  // widened from BF16 exactly
    }
    CHECK(bad == 0, "%d logits differ from the direct computation", bad);
    free(x);
    free(y);
    test_end();
}

// `qtrain infer --argmax` from the recipe's initial weights reproduces the eval accuracy of the
// same weights; IDX and uint8 .npy inputs give the same file.
static void test_infer_cli(void) {
    test_begin("qtrain_infer_argmax_reproduces_eval_and_reads_idx");
    const char *text = recipe_with(pair("npy", "tr-x.npy", "tr-y.npy"),
                                   pair("npy", "ev-x.npy", "ev-y.npy"), "eval all\n");
    const char *recipe_path = write_recipe("init.recipe", text);
    run_options o = {0};
    sched_summary sum;
    RUN_OK(text, &o, &sum);
    static char out[1 << 14];
    char cmd[1024];
    const char *outputs[] = {"from-npy.npy", "from-idx.npy"};
    const char *inputs[] = {"ev-x.npy", "ev-images.idx"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "build/qtrain infer %s --ref --argmax --input %s --output %s",
                 recipe_path, tmp_path(inputs[i]), tmp_path(outputs[i]));
        int rc = command_output(cmd, out, sizeof out);
        CHECK(rc == 0 && strstr(out, "50 int32 classes (argmax)"), "%s: exit %d: %s", inputs[i],
              rc, out);
    }
    uint64_t n = 0, nl = 0;
    int32_t *preds = read_labels(tmp_path("from-npy.npy"), &n);
    uint64_t cols;
    uint8_t *labels = read_npy(tmp_path("ev-y.npy"), NPY_DTYPE_U8, 1, &nl, &cols);
    uint64_t correct = 0;
    for (uint64_t i = 0; preds && labels && n == 50 && nl == 50 && i < n; i++) {
        correct += preds[i] == labels[i];
    }
    CHECK(n == 50 && (double)correct / 50.0 == sum.eval_accuracy, "%" PRIu64 "/%" PRIu64
          " correct, eval accuracy %.9g", correct, n, sum.eval_accuracy);
    size_t na = 0, nb = 0;
    char *a = file_read(tmp_path("from-npy.npy"), &na);
    char *b = file_read(tmp_path("from-idx.npy"), &nb);
    CHECK(a && b && na == nb && memcmp(a, b, na) == 0, "IDX and .npy inputs differ");
    free(a);
    free(b);
    free(preds);
    free(labels);
    test_end();
}

static void expect_cli(const char *args, int rc_expected, const char *fragment) {
    static char out[1 << 14];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "build/qtrain %s", args);
    int rc = command_output(cmd, out, sizeof out);
    CHECK(rc == rc_expected && strstr(out, fragment), "qtrain %s: exit %d (expected %d), "
          "expected '%s' in: %s", args, rc, rc_expected, fragment, out);
}

static void test_infer_refusals(void) {
    test_begin("qtrain_infer_refusals");
    const char *recipe_path = tmp_path("init.recipe");
    char args[1024];
    snprintf(args, sizeof args, "infer %s --ref --input %s --output %s", recipe_path,
             tmp_path("ev-x.npy"), tmp_path("from-npy.npy"));
    expect_cli(args, 1, "from-npy.npy exists; qtrain does not replace files: remove it, choose "
               "another name, or pass --force");
    size_t before = 0;
    free(file_read(tmp_path("from-npy.npy"), &before));
    char forced[1100];
    snprintf(forced, sizeof forced, "%s --force", args);
    expect_cli(forced, 0, "50 x 4 float32 logits");
    snprintf(args, sizeof args, "infer %s --ref --input %s --output %s --from %s", recipe_path,
             tmp_path("ev-x.npy"), tmp_path("new.npy"), tmp_path("weights.ckpt"));
    expect_cli(args, 1, "weights.ckpt: cannot open the checkpoint");
    snprintf(args, sizeof args, "infer %s --ref --input %s --output %s", recipe_path,
             tmp_path("ev70-y.npy"), tmp_path("new.npy"));
    expect_cli(args, 1, "FEATURES takes a 2-D array");
    snprintf(args, sizeof args, "infer %s --ref --input %s --output %s", recipe_path,
             tmp_path("wide.npy"), tmp_path("new.npy"));
    expect_cli(args, 1, "17 features per sample; the model's input is 16");
    snprintf(args, sizeof args, "infer %s --input %s", recipe_path, tmp_path("ev-x.npy"));
    expect_cli(args, 2, "expected --input FILE and --output FILE.npy");
    CHECK(access(tmp_path("new.npy"), F_OK) != 0, "a refused run left new.npy");
    // A recipe's infer row is refused before training when its file exists.
    char rows[512];
    snprintf(rows, sizeof rows, "train 5\ninfer 1 output=%s\n", tmp_path("logits.npy"));
    expect_run_refusal(recipe_with(pair("npy", "tr-x.npy", "tr-y.npy"), NULL, rows),
                       "logits.npy exists", NULL);
    test_end();
}

// The tiny recipe on the saved synthetic data (test_recipe_outputs) in built-in recipe
// `scheme`, with the given rows.
static const char *trained_recipe(const char *scheme, const char *rows) {
    static char text[4096];
    const char *base = recipe_with(pair("npy", "train-x.npy", "train-y.npy"),
                                   pair("npy", "ev70-x.npy", "ev70-y.npy"), rows);
    const char *at = strstr(base, "recipe = bf16");
    snprintf(text, sizeof text, "%.*srecipe = %s%s", (int)(at - base), base, scheme,
             at + strlen("recipe = bf16"));
    return text;
}

static const char *const schemes[] = {"bf16", "delayed", "current", "mxfp8", "block", "nvfp4"};
#define SCHEMES_COUNT (sizeof schemes / sizeof schemes[0])

// `qtrain infer` of the eval inputs into `output` (argmax or logits); its exit status.
static int infer_cli(const char *recipe_path, const char *from, bool argmax, const char *output,
                     char *out, size_t out_bytes) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "build/qtrain infer %s --ref --input %s --output %s%s%s%s",
             recipe_path, tmp_path("ev70-x.npy"), tmp_path(output), argmax ? " --argmax" : "",
             from ? " --from " : "", from ? from : "");
    return command_output(cmd, out, out_bytes);
}

// `qtrain infer --from CKPT` runs the model a checkpoint holds: its predictions for the eval set
// reproduce the eval accuracy of the run that saved it, exactly, with every scheme (the infer-only
// run plans no columnwise copies, moments or learning-rate rows: only what the forward pass
// reads is loaded), and its logits are not those of the recipe's initial weights. A checkpoint
// of another format is refused by parameter.
static void test_infer_from_checkpoint(void) {
    test_begin("qtrain_infer_from_checkpoint_reproduces_eval");
    static char out[1 << 14];
    char ckpt[160], name[64];
    for (size_t f = 0; f < SCHEMES_COUNT; f++) {
        const char *text = trained_recipe(schemes[f], "train 60\neval all\n");
        snprintf(name, sizeof name, "%s.recipe", schemes[f]);
        const char *recipe_path = write_recipe(name, text);
        snprintf(name, sizeof name, "%s.ckpt", schemes[f]);
        snprintf(ckpt, sizeof ckpt, "%s", tmp_path(name));
        unlink(ckpt);
        run_options o = {0};
        o.save_path = ckpt;
        sched_summary sum;
        RUN_OK(text, &o, &sum);
        int rc = infer_cli(recipe_path, ckpt, true, "trained-preds.npy", out, sizeof out);
        CHECK(rc == 0 && strstr(out, "70 int32 classes (argmax)"), "%s: exit %d: %s",
              schemes[f], rc, out);
        uint64_t n = 0, nl = 0, cols = 0, ni = 0;
        int32_t *labels = read_labels(tmp_path("ev70-y.npy"), &nl);
        int32_t *preds = read_labels(tmp_path("trained-preds.npy"), &n);
        if (labels && preds && n == 70 && nl == 70) {
            uint64_t correct = count_correct(preds, labels, n);
            CHECK((double)correct / 70.0 == sum.eval_accuracy, "%s: %" PRIu64 "/70 correct, "
                  "eval accuracy %.9g", schemes[f], correct, sum.eval_accuracy);
        } else {
            CHECK(false, "%s: predictions of %" PRIu64 " rows", schemes[f], n);
        }
        rc = infer_cli(recipe_path, ckpt, false, "trained-logits.npy", out, sizeof out);
        rc |= infer_cli(recipe_path, NULL, false, "initial-logits.npy", out, sizeof out);
        float *trained = read_npy(tmp_path("trained-logits.npy"), NPY_DTYPE_F32, 2, &n, &cols);
        float *initial = read_npy(tmp_path("initial-logits.npy"), NPY_DTYPE_F32, 2, &ni, &cols);
        CHECK(rc == 0 && trained && initial && n == 70 && ni == 70 &&
                  memcmp(trained, initial, 70 * 4 * sizeof(float)) != 0,
              "%s: the logits with --from are the initial weights' (exit %d)", schemes[f], rc);
        unlink(tmp_path("trained-preds.npy"));
        unlink(tmp_path("trained-logits.npy"));
        unlink(tmp_path("initial-logits.npy"));
        free(labels);
        free(preds);
        free(trained);
        free(initial);
    }
    // The bf16 checkpoint into the nvfp4 recipe: the same shapes, other quantizers.
    snprintf(ckpt, sizeof ckpt, "%s", tmp_path("bf16.ckpt"));
    int rc = infer_cli(tmp_path("nvfp4.recipe"), ckpt, true, "refused.npy", out, sizeof out);
    CHECK(rc == 1 && strstr(out, "parameter 'fc1.weight' is [32][16]") &&
              strstr(out, "load a checkpoint of this recipe's model and quantizers") &&
              access(tmp_path("refused.npy"), F_OK) != 0, "bf16 checkpoint, nvfp4 recipe: "
          "exit %d: %s", rc, out);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU

// The tiny recipe in `scheme`, trained, evaluated, and its eval outputs written twice.
static const char *gpu_recipe(const char *scheme, const char *tag) {
    char rows[1024];
    snprintf(rows, sizeof rows, "train 60\neval all\ninfer all eval output=%s-%s-preds.npy "
             "argmax\ninfer all eval output=%s-%s-logits.npy\n", tmp_dir, tag, tmp_dir, tag);
    return trained_recipe(scheme, rows);
}

static void gpu_paths(const char *tag, char *preds, char *logits) {
    snprintf(preds, 200, "%s-%s-preds.npy", tmp_dir, tag);
    snprintf(logits, 200, "%s-%s-logits.npy", tmp_dir, tag);
}

// Graphs and eager launches write the same files; the predictions reproduce the eval accuracy
// and are the logits' argmax; the loop synchronizes only for its lagged reads.
static void test_gpu_outputs(const char *scheme) {
    char name[96];
    snprintf(name, sizeof name, "gpu_infer_outputs_to_files_%s", scheme);
    static backend b;
    memset(&b, 0, sizeof b);
    if (backend_open_gpu(&b, 0) != QT_OK) {
        test_skip(name, qt_error_message());
        backend_close(&b);
        return;
    }
    test_begin(name);
    static const char *const tags[] = {"graph", "eager"};
    sched_summary sum[2];
    for (int i = 0; i < 2; i++) {
        run_options o = {0};
        o.eager = i == 1;
        qt_status s = run_on(&b, gpu_recipe(scheme, tags[i]), &o, &sum[i]);
        CHECK(s == QT_OK, "%s: %s", tags[i], qt_error_message());
        uint64_t steps = sum[i].steps[0] + sum[i].steps[1] + sum[i].steps[2];
        CHECK(s != QT_OK || (loop_syncs == sum[i].lagged_reads && sum[i].lagged_reads == steps),
              "%s: %" PRIu64 " synchronizing calls, %" PRIu64 " lagged reads, %" PRIu64 " steps",
              tags[i], loop_syncs, sum[i].lagged_reads, steps);
    }
    char pa[200], la[200], pb[200], lb[200];
    gpu_paths("graph", pa, la);
    gpu_paths("eager", pb, lb);
    size_t n1 = 0, n2 = 0, n3 = 0, n4 = 0;
    char *fa = file_read(pa, &n1), *fb = file_read(pb, &n2);
    char *ga = file_read(la, &n3), *gb = file_read(lb, &n4);
    CHECK(fa && fb && n1 == n2 && memcmp(fa, fb, n1) == 0, "predictions: graph and eager differ");
    CHECK(ga && gb && n3 == n4 && memcmp(ga, gb, n3) == 0, "logits: graph and eager differ");
    free(fa);
    free(fb);
    free(ga);
    free(gb);
    uint64_t n = 0, nl = 0, cols = 0;
    int32_t *labels = read_labels(tmp_path("ev70-y.npy"), &nl);
    int32_t *preds = read_labels(pa, &n);
    float *logits = read_npy(la, NPY_DTYPE_F32, 2, &n, &cols);
    if (labels && preds && logits && n == 70 && nl == 70) {
        uint64_t correct = count_correct(preds, labels, n);
        CHECK((double)correct / 70.0 == sum[0].eval_accuracy, "%" PRIu64 "/70 correct, eval "
              "accuracy %.9g", correct, sum[0].eval_accuracy);
        int bad = 0;
        for (uint64_t i = 0; i < n; i++) bad += argmax_row(logits + i * 4, 4) != preds[i];
        CHECK(bad == 0, "%d rows whose logits' argmax is not the prediction", bad);
    } else {
        CHECK(false, "outputs of %" PRIu64 " rows", n);
    }
    for (int i = 0; i < 2; i++) {
        char p[200], l[200];
        gpu_paths(tags[i], p, l);
        unlink(p);
        unlink(l);
    }
    free(labels);
    free(preds);
    free(logits);
    backend_close(&b);
    test_end();
}

// ---------------------------------------------------------------------------------------------

int main(void) {
    if (!tmp_dir_make("infer")) {
        printf("FAIL test_infer: cannot create a temporary folder\n");
        return 1;
    }
    test_npy_f32_like_synthetic();
    test_npy_u8_like_idx();
    test_npy_run_refusals();
    test_recipe_outputs();
    test_infer_direct();
    test_infer_cli();
    test_infer_refusals();
    test_infer_from_checkpoint();
    for (size_t i = 0; i < SCHEMES_COUNT; i++) test_gpu_outputs(schemes[i]);
    tmp_dir_remove();
    return test_exit_code();
}
