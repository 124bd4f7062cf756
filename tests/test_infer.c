// test_infer: what a run takes from and gives to files, end to end on the reference backend.
//
// .npy training data: a synthetic dataset saved as float32 features and int32 labels trains to
// the byte-identical trace of the synthetic source itself, and IDX images saved as uint8 features
// with uint8 labels to that of the IDX files (both input paths of the staging slot); a run
// refuses .npy data that does not fit the model or the loss, by file name.
// Run from the repository root.
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>  // WEXITSTATUS
#include <unistd.h>

#include "npy.h"
#include "run.h"
#include "test.h"

static run the_run;
static recipe the_recipe;
static char tmp_dir[64];

// ---------------------------------------------------------------------------------------------
// Helpers

static const char *tmp_path(const char *name) {
    static char paths[16][160];
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, 160, "%s/%s", tmp_dir, name);
    return p;
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)n + 1);
    *size = fread(data, 1, (size_t)n, f);
    data[*size] = '\0';
    fclose(f);
    return data;
}

// Two traces of different recipe texts: the same records (the header's recipe hash differs).
static void check_same_records(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *ta = slurp(a, &na), *tb = slurp(b, &nb);
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

// Plans, loads, binds and runs a recipe text on the reference backend.
static qt_status run_text(const char *text, const run_options *o, sched_summary *sum) {
    static backend b;
    backend_open_ref(&b);
    QT_TRY(recipe_parse(text, strlen(text), "t.recipe", &the_recipe));
    QT_TRY(run_plan(&the_run, &the_recipe, text, strlen(text), o));
    uint64_t dev_bytes, host_bytes;
    run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
    void *dev = arena_memory(dev_bytes), *host = arena_memory(host_bytes);
    void *data = arena_memory(run_data_bytes(&the_run));
    qt_status status = run_load(&the_run, data, run_data_bytes(&the_run));
    if (status == QT_OK) status = run_bind(&the_run, &b, dev, host);
    if (status == QT_OK) status = run_execute(&the_run, NULL, NULL, sum);
    run_close(&the_run);
    backend_close(&b);
    free(dev);
    free(host);
    free(data);
    return status;
}

#define RUN_OK(text, options, sum)                                                          \
    do {                                                                                    \
        qt_status run_status_ = run_text((text), (options), (sum));                         \
        CHECK(run_status_ == QT_OK, "%s: %s", qt_status_name(run_status_),                  \
              qt_error_message());                                                          \
    } while (0)

static void write_npy(const char *path, npy_dtype dtype, uint32_t rank, uint64_t rows,
                      uint64_t cols, const void *data) {
    npy_writer w;
    uint64_t shape[2] = {rows, cols};
    qt_status s = npy_create(&w, path, dtype, rank, shape, true, "--force");
    if (s == QT_OK) s = npy_write(&w, data, rows * cols * npy_dtype_bytes(dtype));
    if (s == QT_OK) s = npy_commit(&w);
    if (s != QT_OK) {
        printf("  cannot write %s: %s\n", path, qt_error_message());
        abort();
    }
}

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
    data_info info;
    data_set set;
    qt_status s = data_probe(&src, 16, 4, &info);
    void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
    if (s == QT_OK) s = data_load(&src, &info, memory, info.bytes, &set);
    if (s != QT_OK) {
        printf("  synthetic data: %s\n", qt_error_message());
        abort();
    }
    write_npy(tmp_path(x_name), NPY_DTYPE_F32, 2, info.samples, 16, set.inputs_f32);
    write_npy(tmp_path(y_name), NPY_DTYPE_I32, 1, info.samples, 1, set.labels);
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
    write_npy(tmp_path(name), NPY_DTYPE_U8, 2, count, 16, im + 16);
    snprintf(name, sizeof name, "%s-y.npy", stem);
    write_npy(tmp_path(name), NPY_DTYPE_U8, 1, count, 1, lb + 8);
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
    write_npy(tmp_path("targets.npy"), NPY_DTYPE_F32, 2, 64, 4, targets);
    save_synthetic(64, 5, "x64.npy", "y64.npy");
    expect_run_refusal(recipe_with(pair("npy", "x64.npy", "targets.npy"), NULL, rows),
                       "regression targets (2-D float32), but the recipe's loss is softmax_xent",
                       "targets.npy");
    expect_run_refusal(recipe_with(pair("npy", "tr-x.npy", "tr-y.npy"),
                                   pair("npy", "x64.npy", "y64.npy"), rows),
                       "the train data has uint8 (IDX, npy uint8) inputs but the eval data "
                       "float32", NULL);
    float wide[64 * 17] = {0};
    write_npy(tmp_path("wide.npy"), NPY_DTYPE_F32, 2, 64, 17, wide);
    expect_run_refusal(recipe_with(pair("npy", "wide.npy", "y64.npy"), NULL, rows),
                       "17 features per sample; the model's input is 16", "wide.npy");
    // Truncated: the last byte of the features is missing.
    size_t n = 0;
    char *bytes = slurp(tmp_path("x64.npy"), &n);
    FILE *f = fopen(tmp_path("cut.npy"), "wb");
    fwrite(bytes, 1, n - 1, f);
    fclose(f);
    free(bytes);
    expect_run_refusal(recipe_with(pair("npy", "cut.npy", "y64.npy"), NULL, rows), "truncated",
                       "cut.npy");
    test_end();
}

// ---------------------------------------------------------------------------------------------

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qt_test_infer_XXXXXX");
    if (mkdtemp(tmp_dir) == NULL) {
        printf("FAIL test_infer: cannot create a temporary folder\n");
        return 1;
    }
    test_npy_f32_like_synthetic();
    test_npy_u8_like_idx();
    test_npy_run_refusals();
    char command[128];
    snprintf(command, sizeof command, "rm -rf '%s'", tmp_dir);
    if (system(command) != 0) printf("  could not remove %s\n", tmp_dir);
    return test_exit_code();
}
