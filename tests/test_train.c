// Training end to end (runtime/run/run.h): synthetic recipes trained on the reference backend
// (convergence, determinism, the same traces on one and three threads, the step timing before
// the loop, the eval-interleaving regression with every scheme, the plan report, refusals, every
// step staged with its own batch), and with a GPU: eager vs graphs,
// determinism, no synchronization inside the step loop, the staging copies beside the steps,
// GPU vs reference, constant device memory.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/driver/driver.h"  // driver_sync_total, drv
#include "tests/files.h"  // tmp_dir_make, tmp_path, command_output
#include "tests/plan.h"  // test_run_plan
#include "runtime/backend/capture.h"  // capture_begin, capture_next: the norm beside backward
#include "runtime/base/pool.h"  // pool_start, pool_stop: the reference backend on 1 and 3 threads
#include "runtime/run/run.h"
#include "tests/test.h"

#define RECIPE_TEXT_MAX 8192

static run the_run;
static recipe the_recipe;

// ---------------------------------------------------------------------------------------------
// Helpers

static bool read_file(const char *path, char *buf, size_t bytes, size_t *used) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    *used = fread(buf, 1, bytes - 1, f);
    buf[*used] = '\0';
    fclose(f);
    return true;
}

// The recipe file's text with its `recipe = bf16` line replaced by `recipe = SCHEME` and an
// optional rule line after it (scheme NULL: the text as it is).
static bool recipe_text_rule(const char *path, const char *scheme, const char *rule, char *out,
                             size_t bytes) {
    static char text[RECIPE_TEXT_MAX];
    size_t used = 0;
    if (!read_file(path, text, sizeof text, &used)) return false;
    const char *key = "\nrecipe = bf16\n";  // the line, not a mention in a comment
    const char *at = strstr(text, key);
    if (!scheme) {
        snprintf(out, bytes, "%s", text);
        return true;
    }
    if (!at) return false;
    at++;  // past the newline
    key++;
    snprintf(out, bytes, "%.*srecipe = %s\n%s%s%s%s", (int)(at - text), text, scheme,
             rule ? "rule = " : "", rule ? rule : "", rule ? "\n" : "", at + strlen(key));
    return true;
}

static bool recipe_text_for(const char *path, const char *scheme, char *out, size_t bytes) {
    return recipe_text_rule(path, scheme, NULL, out, bytes);
}

// The recipe last trained used built-in recipe `scheme` (the text substitution took).
static void check_scheme(const char *scheme) {
    qt_scheme expected;
    if (!scheme || !rules_scheme_from_name(scheme, &expected)) return;
    CHECK(the_recipe.quant.has_builtin && the_recipe.quant.builtin == expected,
          "the recipe trained was not '%s'", scheme);
}

typedef struct train_case {
    const char *name;        // file name for messages
    const char *text;
    backend_kind kind;
    run_options options;
    sched_progress_fn progress;
    void *ctx;
    // After the loop, before the run closes: a look at the bound run (weights, memory).
    void (*inspect)(run *r, backend *b, void *ctx);
    // After run_bind, before the loop.
    void (*before_loop)(run *r, void *ctx);
    void *before_ctx;
    double free_bytes_before, free_bytes_after;  // GPU: device free memory around the loop
    double free_bytes_first;                     // and after the first step (a progress hook)
    uint64_t syncs;                              // synchronizing driver calls in the loop
} train_case;

// A case that trains the recipe file at `path` (its `recipe = bf16` line made `recipe = SCHEME`;
// NULL: as it is) on a backend of the kind; its text lives in `text`.
static train_case recipe_case(const char *path, const char *scheme, backend_kind kind, char *text,
                              size_t bytes) {
    CHECK(recipe_text_for(path, scheme, text, bytes), "cannot read %s", path);
    const char *slash = strrchr(path, '/');
    train_case c = {.name = slash ? slash + 1 : path, .text = text, .kind = kind};
    return c;
}

static void *arena_memory(uint64_t bytes) {
    return aligned_alloc(256, ((bytes + 255) / 256 + 1) * 256);
}

static qt_status train_on(train_case *c, backend *b, sched_summary *sum) {
    QT_TRY(recipe_parse(c->text, strlen(c->text), c->name, &the_recipe));
    QT_TRY(test_run_plan(&the_run, &the_recipe, c->text, strlen(c->text), &c->options));
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
    if (status == QT_OK && b->kind == BACKEND_GPU) {
        size_t free_bytes = 0, total = 0;
        drv.cuMemGetInfo(&free_bytes, &total);
        c->free_bytes_before = (double)free_bytes;
    }
    if (status == QT_OK && c->before_loop) c->before_loop(&the_run, c->before_ctx);
    uint64_t syncs = driver_sync_total(&b->syncs);
    if (status == QT_OK) status = run_execute(&the_run, c->progress, c->ctx, sum);
    c->syncs = driver_sync_total(&b->syncs) - syncs;
    if (status == QT_OK && b->kind == BACKEND_GPU) {
        size_t free_bytes = 0, total = 0;
        drv.cuMemGetInfo(&free_bytes, &total);
        c->free_bytes_after = (double)free_bytes;
    }
    if (status == QT_OK && c->inspect) c->inspect(&the_run, b, c->ctx);
    run_close(&the_run);
    free(dev);
    free(host);
    free(data);
    return status;
}

// Trains on the case's backend; false (with *why) when it cannot be opened.
static bool train(train_case *c, sched_summary *sum, const char **why) {
    static backend b;
    memset(&b, 0, sizeof b);
    if (c->kind == BACKEND_GPU) {
        if (backend_open_gpu(&b, 0) != QT_OK) {
            *why = qt_error_message();
            backend_close(&b);
            return false;
        }
    } else {
        backend_open_ref(&b);
    }
    qt_status status = train_on(c, &b, sum);
    CHECK(status == QT_OK, "%s: %s: %s", c->name, qt_status_name(status), qt_error_message());
    backend_close(&b);
    return true;
}

// Trains `text` (`label` in messages) on the backend into `trace`, with checksums every
// `checksum_every` steps (0: none); false, with the case `test` marked skipped, when the backend
// cannot be opened.
static bool train_traced(const char *test, const char *label, const char *text, backend_kind kind,
                         uint32_t checksum_every, const char *trace) {
    train_case c = {.name = label, .text = text, .kind = kind};
    c.options.checksum_every = checksum_every;
    c.options.trace_path = trace;
    sched_summary sum;
    const char *why = NULL;
    if (train(&c, &sum, &why)) return true;
    test_skip(test, why);
    return false;
}

// A path in the temporary folder, copied out (files.h keeps only its last 16).
static void tmp_path_copy(char *out, size_t bytes, const char *name) {
    snprintf(out, bytes, "%s", tmp_path(name));
}

static void trace_path(char *out, size_t bytes, const char *name) {
    snprintf(out, bytes, "%s.trace", tmp_path(name));
}

// Compares two files byte for byte; on a difference reports `qtrain diff`'s first field.
static void check_identical(const char *a, const char *b) {
    static char ta[1 << 22], tb[1 << 22];
    size_t na = 0, nb = 0;
    CHECK(read_file(a, ta, sizeof ta, &na) && read_file(b, tb, sizeof tb, &nb),
          "cannot read %s or %s", a, b);
    if (na == nb && memcmp(ta, tb, na) == 0) return;
    bool identical = false;
    char *report = NULL;
    size_t report_bytes = 0;
    FILE *out = open_memstream(&report, &report_bytes);
    trace_diff(a, b, out, &identical);
    fclose(out);
    CHECK(false, "traces differ (%zu vs %zu bytes):\n%s", na, nb, report ? report : "");
    free(report);
}

// ---------------------------------------------------------------------------------------------
// CPU: the reference backend

static void test_bf16_converges(void) {
    test_begin("train_bf16_synthetic_converges");
    static char text[RECIPE_TEXT_MAX];
    train_case c = recipe_case("tests/recipes/synthetic_bf16.recipe", NULL, BACKEND_REF, text,
                               sizeof text);
    sched_summary sum;
    const char *why = NULL;
    train(&c, &sum, &why);
    // Four well-separated classes (data.c: centers 4.2 noise deviations apart): the initial
    // loss is ln 4 = 1.39; 200 AdamW steps get the batch loss well below 0.25 and the eval
    // set (a subset of the training samples) above 95%.
    CHECK(sum.steps[MODEL_MODE_TRAIN] == 200, "train steps %llu, expected 200",
          (unsigned long long)sum.steps[MODEL_MODE_TRAIN]);
    CHECK(sum.last_train_loss < 0.25f, "final train loss %g, expected < 0.25",
          (double)sum.last_train_loss);
    CHECK(sum.has_eval && sum.eval_accuracy > 0.95, "eval accuracy %g, expected > 0.95",
          sum.eval_accuracy);
    CHECK(sum.skipped == 0, "%llu skipped steps", (unsigned long long)sum.skipped);
    test_end();
}

// The teacher regression through every layer kind: the loss must at least halve.
static void layers_progress(void *ctx, const sched_progress *p) {
    float *first_last = ctx;
    if (p->mode != MODEL_MODE_TRAIN) return;
    if (p->done == 1) first_last[0] = p->record->loss;
    first_last[1] = p->record->loss;
}

static void test_layers_train(void) {
    test_begin("train_every_layer_kind_mse");
    static char text[RECIPE_TEXT_MAX];
    CHECK(recipe_text_for("tests/recipes/synthetic_layers.recipe", NULL, text, sizeof text),
          "cannot read tests/recipes/synthetic_layers.recipe");
    float first_last[2] = {0, 0};
    train_case c = {.name = "synthetic_layers.recipe", .text = text, .kind = BACKEND_REF,
                    .progress = layers_progress, .ctx = first_last};
    sched_summary sum;
    const char *why = NULL;
    train(&c, &sum, &why);
    CHECK(first_last[1] < 0.5f * first_last[0], "loss %g -> %g, expected to halve at least",
          (double)first_last[0], (double)first_last[1]);
    CHECK(sum.steps[MODEL_MODE_INFER] == 2, "infer steps %llu, expected 2",
          (unsigned long long)sum.steps[MODEL_MODE_INFER]);
    test_end();
}

// The case `<name>_<scheme>`: the recipe at `path` (its `recipe = bf16` line made `scheme`)
// trained twice on the reference backend, on pools of threads_a and threads_b threads (0: the
// pool as it is), gives the same trace byte for byte. Two runs (determinism), and one thread
// against three: the reference backend's twins cut their work into tasks of the thread pool whose
// results do not depend on the thread that runs them, checksums of every weight, master,
// optimizer and scaling region included.
static void test_two_runs(const char *name, const char *path, const char *scheme,
                          uint32_t checksum_every, uint32_t threads_a, uint32_t threads_b) {
    char case_name[96];
    snprintf(case_name, sizeof case_name, "%s_%s", name, scheme);
    test_begin(case_name);
    static char text[RECIPE_TEXT_MAX];
    char traces[2][128];
    const uint32_t threads[2] = {threads_a, threads_b};
    train_case c = recipe_case(path, scheme, BACKEND_REF, text, sizeof text);
    c.options.checksum_every = checksum_every;
    for (int i = 0; i < 2; i++) {
        trace_path(traces[i], sizeof traces[i], i == 0 ? "run_a" : "run_b");
        if (threads[i]) {
            pool_stop();
            pool_start(threads[i]);
            CHECK(pool_threads() == threads[i], "a pool of %u threads has %u", threads[i],
                  pool_threads());
        }
        sched_summary sum;
        const char *why = NULL;
        c.options.trace_path = traces[i];
        train(&c, &sum, &why);
        if (i == 0) check_scheme(scheme);
    }
    if (threads_a || threads_b) {
        pool_stop();
        pool_start(0);
    }
    check_identical(traces[0], traces[1]);
    test_end();
}

// run_time_steps times each mode's step on the bound run and leaves it as it was: the run that
// was timed before its loop gives the trace of one that was not.
static void time_steps(run *r, void *ctx) {
    double *ms = ctx;
    uint64_t dev_bytes, host_bytes, left[MODEL_MODE_COUNT];
    run_memory_bytes(r, &dev_bytes, &host_bytes);
    void *scratch = arena_memory(dev_bytes + host_bytes);
    run_time_steps(r, scratch, dev_bytes + host_bytes, ms);
    free(scratch);
    run_steps_left(r, left);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        CHECK(left[mode] == r->table.steps[mode], "%s: %llu steps left, the table has %llu",
              model_mode_name((model_mode)mode), (unsigned long long)left[mode],
              (unsigned long long)r->table.steps[mode]);
        CHECK((ms[mode] > 0) == (left[mode] > 0), "%s: %g ms for %llu steps",
              model_mode_name((model_mode)mode), ms[mode], (unsigned long long)left[mode]);
    }
}

static void test_time_steps(void) {
    test_begin("train_time_steps_leaves_the_run_as_it_was");
    static char text[RECIPE_TEXT_MAX];
    char a[128], b[128];
    trace_path(a, sizeof a, "untimed");
    trace_path(b, sizeof b, "timed");
    train_case c = recipe_case("tests/recipes/synthetic_wide.recipe", "nvfp4", BACKEND_REF, text,
                               sizeof text);
    c.options.checksum_every = 4;
    sched_summary sum;
    const char *why = NULL;
    c.options.trace_path = a;
    train(&c, &sum, &why);
    double ms[MODEL_MODE_COUNT] = {0};
    c.options.trace_path = b;
    c.before_loop = time_steps;
    c.before_ctx = ms;
    train(&c, &sum, &why);
    check_identical(a, b);
    CHECK(ms[MODEL_MODE_TRAIN] > 0 && ms[MODEL_MODE_EVAL] > 0, "train %g ms, eval %g ms",
          ms[MODEL_MODE_TRAIN], ms[MODEL_MODE_EVAL]);
    test_end();
}

// A profile the reference backend refuses (it times GPU kernels) is a failed call: it marks the
// run apart (run.h), as a failed step does, and the run then trains as it would have.
static void profile_refused(run *r, void *ctx) {
    qt_status *status = ctx;
    CHECK(!r->apart, "the run is apart before any call failed");
    FILE *out = fopen("/dev/null", "w");
    CHECK(out != NULL, "cannot open /dev/null");
    if (!out) return;
    *status = run_profile(r, 1, out);
    fclose(out);
    CHECK(r->apart, "a failed profile left the run's apart flag clear");
}

static void test_profile_refused_marks_apart(void) {
    test_begin("train_refused_profile_marks_the_run_apart");
    static char text[RECIPE_TEXT_MAX];
    train_case c = recipe_case("tests/recipes/synthetic_tiny.recipe", "bf16", BACKEND_REF, text,
                               sizeof text);
    qt_status profiled = QT_OK;
    c.before_loop = profile_refused;
    c.before_ctx = &profiled;
    sched_summary sum;
    const char *why = NULL;
    train(&c, &sum, &why);
    CHECK(profiled == QT_ERR_INPUT, "profile on the reference backend: %s, not %s",
          qt_status_name(profiled), qt_status_name(QT_ERR_INPUT));
    CHECK(sum.steps[MODEL_MODE_TRAIN] == 200, "%llu train steps after the refused profile",
          (unsigned long long)sum.steps[MODEL_MODE_TRAIN]);
    test_end();
}

// MXFP8 and NVFP4 GEMMs in the format's kernels and through BF16 copies (model.c's choice of
// path) compute the same products in the same order: the traces, checksums included, are
// identical. On the reference backend, and on the GPU, where the copies take the sm_90a BF16
// kernel and the formats' kernels the portable and emulated sm_90a tiers.
static void test_emulated_paths(backend_kind kind, const char *scheme) {
    char name[96];
    snprintf(name, sizeof name, "%s_%s_kernel_and_bf16_copies_identical",
             kind == BACKEND_GPU ? "gpu" : "train", scheme);
    static char text[RECIPE_TEXT_MAX];
    char a[128], b[128];
    trace_path(a, sizeof a, "emulated_kernel");
    trace_path(b, sizeof b, "emulated_copies");
    train_case c = recipe_case("tests/recipes/synthetic_tiny.recipe", scheme, kind, text,
                               sizeof text);
    c.options.checksum_every = 25;
    c.options.trace_path = a;
    c.options.emulated_gemm = MODEL_EMULATED_KERNEL;
    sched_summary sum;
    const char *why = NULL;
    test_begin(name);
    if (!train(&c, &sum, &why)) {
        test_skip(name, why);
        return;
    }
    uint32_t mixed = 0;
    for (uint32_t i = 0; i < the_run.model.linear_count; i++) {
        for (int g = 0; g < MODEL_GEMM_COUNT; g++) {
            mixed += the_run.model.linears[i].path[g] == MODEL_GEMM_MIXED;
        }
    }
    CHECK(mixed == 0, "--emulated-gemm kernel planned %u GEMMs through copies", mixed);
    c.options.trace_path = b;
    c.options.emulated_gemm = MODEL_EMULATED_COPIES;
    train(&c, &sum, &why);
    for (uint32_t i = 0; i < the_run.model.linear_count; i++) {
        for (int g = 0; g < MODEL_GEMM_COUNT; g++) {
            CHECK(the_run.model.linears[i].path[g] == MODEL_GEMM_MIXED,
                  "--emulated-gemm copies left linear %u GEMM %d native", i, g);
        }
    }
    // Copies that only these GEMMs read come from the casts as values (the casts' *_VALUES
    // flags), not from a decode pass.
    const program *p = &the_run.programs[MODEL_MODE_TRAIN];
    uint32_t values = 0;
    for (uint32_t j = 0; j < p->op_count; j++) {
        const prog_op *op = &p->ops[j];
        if (op->kernel == KERNEL_NVFP4_QUANTIZE_BF16 ||
            op->kernel == KERNEL_NVFP4_QUANTIZE_BF16_SR) {
            const nvfp4_quantize_args *q = (const nvfp4_quantize_args *)op->args;
            values += (q->flags & (QT_NVFP4_ROW_VALUES | QT_NVFP4_COL_VALUES)) != 0;
        }
        if (op->kernel == KERNEL_MXFP8_QUANTIZE_BF16 || op->kernel == KERNEL_MXFP8_QUANTIZE_F32) {
            const mxfp8_quantize_args *q = (const mxfp8_quantize_args *)op->args;
            values += (q->flags & (QT_MXFP8_FLAG_ROW_VALUES | QT_MXFP8_FLAG_COL_VALUES)) != 0;
        }
    }
    CHECK(values > 0, "no cast of the copies path writes values");
    check_identical(a, b);
    test_end();
}

// The lines of a trace's train records without their step index (which counts eval steps too).
static size_t train_lines(const char *path, char *out, size_t bytes) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    static char line[TRACE_LINE_BYTES_MAX];
    size_t used = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, " mode=train ")) continue;
        const char *rest = strchr(line, ' ');
        size_t n = strlen(rest);
        if (used + n + 1 >= bytes) break;
        memcpy(out + used, rest, n);
        used += n;
    }
    out[used] = '\0';
    fclose(f);
    return used;
}

// Evaluation between training steps must not change training (an eval pass that configured a
// weight's quantizer without its columnwise usage would leave a stale columnwise copy for the
// next dgrad). 200 train steps with an eval step after each one against the same 200
// steps alone: the train records (loss, accuracy, grad norm, lr, amaxes, scales, the
// persistent-state checksum every 20 steps) must be identical.
static void test_interleave(const char *path, const char *scheme, const char *rule,
                            const char *label) {
    char name[96];
    snprintf(name, sizeof name, "train_eval_interleaved_same_trajectory_%s", label);
    test_begin(name);
    static char text[RECIPE_TEXT_MAX];
    CHECK(recipe_text_rule(path, scheme, rule, text, sizeof text), "cannot read %s", path);
    char a[128], b[128];
    trace_path(a, sizeof a, "interleaved");
    trace_path(b, sizeof b, "train_only");
    train_case c = {.name = path, .text = text, .kind = BACKEND_REF};
    c.options.checksum_every = 20;
    c.options.eval_every = 1;
    c.options.eval_steps = 1;
    c.options.trace_path = a;
    sched_summary sum;
    const char *why = NULL;
    train(&c, &sum, &why);
    CHECK(sum.steps[MODEL_MODE_TRAIN] == 200 && sum.steps[MODEL_MODE_EVAL] >= 200,
          "interleaved run: %llu train, %llu eval steps",
          (unsigned long long)sum.steps[MODEL_MODE_TRAIN],
          (unsigned long long)sum.steps[MODEL_MODE_EVAL]);
    check_scheme(scheme);
    c.options.drop_eval = true;
    c.options.trace_path = b;
    train(&c, &sum, &why);
    static char la[1 << 21], lb[1 << 21];
    size_t na = train_lines(a, la, sizeof la), nb = train_lines(b, lb, sizeof lb);
    CHECK(na > 0 && na == nb && memcmp(la, lb, na) == 0,
          "train records differ with eval steps interleaved (%zu vs %zu bytes)", na, nb);
    if (na != nb || memcmp(la, lb, na < nb ? na : nb) != 0) {
        size_t i = 0;
        while (i < na && i < nb && la[i] == lb[i]) i++;
        size_t line_start = i;
        while (line_start > 0 && la[line_start - 1] != '\n') line_start--;
        printf("  first difference in:\n  interleaved:%.200s\n  train only: %.200s\n",
               la + line_start, lb + line_start);
    }
    test_end();
}

// The summary's step times: one interval per pair of consecutive train steps, none across an
// eval row, every one measured (> 0 on the reference backend, where a step takes microseconds).
static void test_step_times(void) {
    test_begin("train_step_times_between_consecutive_train_steps");
    static char text[RECIPE_TEXT_MAX];
    train_case c = recipe_case("tests/recipes/synthetic_tiny.recipe", NULL, BACKEND_REF, text,
                               sizeof text);
    sched_summary sum;
    const char *why = NULL;
    train(&c, &sum, &why);
    CHECK(sum.step_time_count == 199, "%llu intervals for one row of 200 train steps",
          (unsigned long long)sum.step_time_count);
    for (uint64_t i = 0; i < sum.step_time_count && i < SCHED_STEP_TIMES; i++) {
        if (!(sum.step_ms[i] > 0.0f)) {
            CHECK(false, "interval %llu is %g ms", (unsigned long long)i, (double)sum.step_ms[i]);
            break;
        }
    }
    // Four pieces of 50 train steps, each followed by an eval row: 4 x 49 intervals.
    c.options.eval_every = 50;
    c.options.eval_steps = 1;
    train(&c, &sum, &why);
    CHECK(sum.step_time_count == 196, "%llu intervals for 4 x 50 train steps between evals",
          (unsigned long long)sum.step_time_count);
    test_end();
}

// The metrics file (runtime/run/metrics.h): a train line every N train steps and at every train
// row's end, over the steps since the previous one; an eval line per pass, the pass's whole
// loss and accuracy. Every value is checked against the records the loop handed out.
typedef struct metrics_expect {
    char lines[64][METRICS_LINE_BYTES];
    uint32_t count;
    double loss_sum;
    uint64_t rows, correct, steps;
    float lr;
    uint64_t every;
    bool passes_match;  // each eval row's last progress said the summary's way of counting
} metrics_expect;

static void metrics_expect_progress(void *ctx, const sched_progress *p) {
    metrics_expect *e = ctx;
    const qt_trace_record *rec = p->record;
    char *line = e->lines[e->count < 64 ? e->count : 63];
    if (p->mode == MODEL_MODE_TRAIN) {
        e->loss_sum += (double)rec->loss * p->rows_valid;
        e->rows += p->rows_valid;
        e->correct += (uint64_t)((double)rec->accuracy * p->rows_valid + 0.5);
        e->steps++;
        e->lr = rec->lr;
        if (p->train_steps % e->every != 0 && p->row_step != p->row_steps) return;
        snprintf(line, METRICS_LINE_BYTES, "{\"kind\":\"train\",\"step\":%llu,\"epoch\":%.4f,"
                 "\"loss\":%.9g,\"accuracy\":%.9g,\"lr\":%.9g,", (unsigned long long)p->train_steps,
                 (double)p->train_steps / (double)p->epoch_steps, e->loss_sum / (double)e->rows,
                 (double)e->correct / (double)e->rows, (double)e->lr);
        snprintf(line + strlen(line), 64, "steps=%llu", (unsigned long long)e->steps);
        e->count++;
        e->loss_sum = 0;
        e->rows = e->correct = e->steps = 0;
        return;
    }
    if (p->mode != MODEL_MODE_EVAL || p->row_step != p->row_steps) return;
    snprintf(line, METRICS_LINE_BYTES, "{\"kind\":\"eval\",\"step\":%llu,\"epoch\":%.4f,"
             "\"loss\":%.9g,\"accuracy\":%.9g,\"lr\":%.9g,", (unsigned long long)p->train_steps,
             (double)p->train_steps / (double)p->epoch_steps, p->pass_loss, p->pass_accuracy,
             (double)e->lr);
    snprintf(line + strlen(line), 64, "steps=%llu,samples=%llu", (unsigned long long)p->row_steps,
             (unsigned long long)p->pass_samples);
    e->count++;
}

// run.apart, which decides whether run_close aborts the communicators (a rank that failed must not
// wait for ranks that wait for it): clear after a run that went through; set after a failure of
// run_execute (its trace cannot open), of run_step and of run_resume; kept by a later success.
// And a run whose plan failed closes.
static void test_failure_marks_apart(void) {
    test_begin("train_failure_marks_the_run_apart");
    static char text[RECIPE_TEXT_MAX];
    train_case c = recipe_case("tests/recipes/synthetic_tiny.recipe", NULL, BACKEND_REF, text,
                               sizeof text);
    static backend b;
    memset(&b, 0, sizeof b);
    backend_open_ref(&b);
    sched_summary sum;
    c.options.steps_limit = 2;
    CHECK(train_on(&c, &b, &sum) == QT_OK && !the_run.apart, "a run that went through: apart %d",
          (int)the_run.apart);
    char trace[200];
    tmp_path_copy(trace, sizeof trace, "no_such_folder/t.trace");
    c.options.trace_path = trace;
    CHECK(train_on(&c, &b, &sum) != QT_OK && the_run.apart,
          "run_execute failed (no folder for its trace): apart %d", (int)the_run.apart);
    // One run, call by call: a failed step, then a step that runs.
    c.options.trace_path = NULL;
    c.options.checkpoints = true;
    qt_status st = recipe_parse(c.text, strlen(c.text), c.name, &the_recipe);
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, c.text, strlen(c.text), &c.options);
    bool planned = st == QT_OK;  // run_close wants a planned run
    uint64_t dev_bytes = 0, host_bytes = 0;
    if (st == QT_OK) run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
    void *dev = arena_memory(dev_bytes), *host = arena_memory(host_bytes);
    uint64_t data_bytes = st == QT_OK ? run_data_bytes(&the_run) : 0;
    void *data = arena_memory(data_bytes);
    if (st == QT_OK) st = run_load(&the_run, data, data_bytes);
    if (st == QT_OK) st = run_bind(&the_run, &b, dev, host);
    CHECK(st == QT_OK && !the_run.apart, "bind: %s: %s", qt_status_name(st), qt_error_message());
    if (st == QT_OK) {
        the_run.options.trace_path = trace;  // the step's trace cannot open
        CHECK(run_step(&the_run, NULL, NULL, &sum) != QT_OK && the_run.apart,
              "a failed run_step: apart %d", (int)the_run.apart);
        the_run.options.trace_path = NULL;
        CHECK(run_step(&the_run, NULL, NULL, &sum) == QT_OK && the_run.apart,
              "a step that ran after the failed one cleared apart");
    }
    if (planned) run_close(&the_run);
    // Another run of the same plan: a checkpoint that is not there.
    st = planned ? test_run_plan(&the_run, &the_recipe, c.text, strlen(c.text), &c.options)
                 : QT_ERR_INPUT;
    planned = st == QT_OK;
    if (st == QT_OK) st = run_load(&the_run, data, data_bytes);
    if (st == QT_OK) st = run_bind(&the_run, &b, dev, host);
    CHECK(st == QT_OK && !the_run.apart, "bind again: %s: %s", qt_status_name(st),
          qt_error_message());
    if (st == QT_OK) {
        char missing[200];
        tmp_path_copy(missing, sizeof missing, "no_such_checkpoint");
        CHECK(run_resume(&the_run, missing) != QT_OK && the_run.apart,
              "a failed run_resume: apart %d", (int)the_run.apart);
    }
    if (planned) run_close(&the_run);
    // A plan that fails (the weights to start from are not a checkpoint): the run closes all the
    // same, as a caller's error path does.
    char junk[200];
    tmp_path_copy(junk, sizeof junk, "junk_weights");
    FILE *f = fopen(junk, "wb");
    CHECK(f != NULL && fputs("not a checkpoint\n", f) >= 0 && fclose(f) == 0, "cannot write %s",
          junk);
    c.options.from_path = junk;
    CHECK(test_run_plan(&the_run, &the_recipe, c.text, strlen(c.text), &c.options) != QT_OK,
          "a plan from a file that is not a checkpoint went through");
    run_close(&the_run);
    backend_close(&b);
    free(dev);
    free(host);
    free(data);
    test_end();
}

static void test_metrics_file(void) {
    test_begin("metrics_file_lines_from_the_records");
    static char text[RECIPE_TEXT_MAX];
    train_case c = recipe_case("tests/recipes/synthetic_tiny.recipe", NULL, BACKEND_REF, text,
                               sizeof text);
    // Three epochs of 512 / 16 = 32 steps with an eval pass after each; a train line every 20
    // train steps and at each epoch's end: 20, 32 | 40, 60, 64 | 80, 96.
    char *rows = strstr(text, "[schedule]");
    CHECK(rows != NULL, "no [schedule]");
    if (rows) snprintf(rows, 200, "[schedule]\ntrain 3 epochs cosine 1e-2 -> 1e-3 warmup 8 steps "
                       "eval every epoch\n");
    static metrics_expect e;
    memset(&e, 0, sizeof e);
    e.every = 20;
    c.progress = metrics_expect_progress;
    c.ctx = &e;
    char path[200];
    tmp_path_copy(path, sizeof path, "m.jsonl");
    c.options.metrics_path = path;
    c.options.metrics_every = 20;
    sched_summary sum;
    const char *why = NULL;
    train(&c, &sum, &why);
    size_t size = 0;
    char *file = file_read(path, &size);
    CHECK(file != NULL, "no metrics file %s", path);
    CHECK(e.count == 10, "%u lines expected", e.count);
    uint32_t n = 0;
    for (char *line = file; line && *line && n < 64; n++) {
        char *end = strchr(line, '\n');
        CHECK(end != NULL, "line %u is not ended", n + 1);
        if (!end) break;
        *end = '\0';
        // The expected line's start is its first keys verbatim; the rest is checked by value.
        const char *want = e.lines[n < 64 ? n : 63];
        const char *steps_key = strstr(want, "steps=");
        size_t prefix = steps_key ? (size_t)(steps_key - want) : strlen(want);
        CHECK(n < e.count && strncmp(line, want, prefix) == 0, "line %u:\n    got      %s\n    "
              "expected %.*s", n + 1, line, (int)prefix, want);
        unsigned long long steps = 0, samples = 0;
        const char *s = strstr(line, "\"steps\":");
        CHECK(s && sscanf(s, "\"steps\":%llu", &steps) == 1 && steps_key &&
              steps == strtoull(steps_key + 6, NULL, 10), "line %u: steps", n + 1);
        if (strstr(want, "samples=")) {
            const char *sa = strstr(line, "\"samples\":");
            CHECK(sa && sscanf(sa, "\"samples\":%llu", &samples) == 1 &&
                  samples == strtoull(strstr(want, "samples=") + 8, NULL, 10) &&
                  strstr(line, "\"dataset\":\"eval\"}") != NULL, "line %u: samples", n + 1);
        } else {
            CHECK(strstr(line, ",\"skipped\":0}") != NULL, "line %u: skipped", n + 1);
        }
        CHECK(strstr(line, "\"steps_per_s\":") != NULL, "line %u: steps_per_s", n + 1);
        line = end + 1;
    }
    CHECK(n == e.count, "%u lines in the file, %u expected", n, e.count);
    // The last eval line is the summary's last eval row.
    char summary[160];
    snprintf(summary, sizeof summary, "\"loss\":%.9g,\"accuracy\":%.9g,", sum.eval_loss,
             sum.eval_accuracy);
    CHECK(e.count > 0 && strstr(e.lines[e.count - 1], summary) != NULL, "summary %s", summary);
    free(file);
    // The file exists now: a second run is refused before any data is read, unless replacing
    // files is allowed (then the new file takes its place).
    run_options o = c.options;
    CHECK(recipe_parse(text, strlen(text), "m.recipe", &the_recipe) == QT_OK &&
          test_run_plan(&the_run, &the_recipe, text, strlen(text), &o) == QT_OK, "%s",
          qt_error_message());
    static char data[1 << 20] __attribute__((aligned(256)));
    qt_status status = run_data_bytes(&the_run) <= sizeof data
                           ? run_load(&the_run, data, sizeof data) : QT_ERR_CAPACITY;
    CHECK(status == QT_ERR_INPUT && strstr(qt_error_message(), "m.jsonl exists; qtrain does not "
          "replace files") && strstr(qt_error_message(), "--force"), "%s: %s",
          qt_status_name(status), qt_error_message());
    run_close(&the_run);
    c.options.replace_outputs = true;
    e.count = 0;
    train(&c, &sum, &why);
    file = file_read(path, &size);
    CHECK(file && strchr(file, '\n') && strncmp(file, e.lines[0], 20) == 0, "replaced file");
    free(file);
    test_end();
}

static void test_plan_report(void) {
    const char *path = "recipes/fashion_mnist_nvfp4.recipe";
    if (access(".data/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        test_skip("plan_fashion_mnist_memory_map", "Fashion-MNIST not unpacked under .data/");
        return;
    }
    test_begin("plan_fashion_mnist_memory_map");
    static char text[RECIPE_TEXT_MAX];
    size_t used = 0;
    CHECK(read_file(path, text, sizeof text, &used), "cannot read %s", path);
    qt_status status = recipe_parse(text, used, path, &the_recipe);
    CHECK(status == QT_OK, "%s", qt_error_message());
    run_options o = {0};
    if (status == QT_OK) status = test_run_plan(&the_run, &the_recipe, text, used, &o);
    CHECK(status == QT_OK, "%s", qt_error_message());
    char *report = NULL;
    size_t bytes = 0;
    FILE *out = open_memstream(&report, &bytes);
    if (status == QT_OK) run_print_plan(&the_run, out);
    fclose(out);
    // Both memory maps with their totals and the device's peak, the programs, the quantizers and
    // the padding note.
    const char *needles[] = {"arena 'device'", "arena 'host'", "lower bound", "program train",
                             "peak of arena 'device': at op ", "its largest transient regions:",
                             "program eval", "program init",
                             "linear.grad_output@fc1", "nvfp4", "padded to 800", "weights",
                             "master", "optim", "activations"};
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++) {
        CHECK(strstr(report, needles[i]) != NULL, "plan report lacks '%s'", needles[i]);
    }
    int totals = 0;
    for (const char *p = report; (p = strstr(p, "\n  total ")) != NULL; p++) totals++;
    CHECK(totals >= 2, "%d memory-map total lines, expected one per arena", totals);
    free(report);
    test_end();
}

// An moe layer whose experts' weights have rows the weight format cannot stack (FP8 block
// scaling's 128-row blocks against 2 x 96 rows of a SwiGLU expert) is refused at planning,
// naming the layer and the fix.
static void test_refusals(void) {
    test_begin("plan_refuses_expert_rows_the_weight_format_cannot_stack");
    static char text[RECIPE_TEXT_MAX];
    char *line = NULL;
    const char *path = "tests/recipes/moe_residual.recipe";
    size_t used = 0;
    CHECK(read_file(path, text, sizeof text, &used), "cannot read %s", path);
    line = strstr(text, "-> current pow2=1 eps=1e-12");
    CHECK(line != NULL, "%s: the experts' weight rule is not there", path);
    if (line) memcpy(line, "-> block  ", 10);  // the rest of the line reads as block's options
    used = strlen(text);
    qt_status status = recipe_parse(text, used, path, &the_recipe);
    CHECK(status == QT_OK, "%s", qt_error_message());
    run_options o = {0};
    if (status == QT_OK) status = test_run_plan(&the_run, &the_recipe, text, used, &o);
    CHECK(status == QT_ERR_INPUT, "status %s, expected QT_ERR_INPUT", qt_status_name(status));
    const char *msg = qt_error_message();
    CHECK(strstr(msg, "moe_residual.recipe:14:9:") &&
              strstr(msg, "each expert's fc1 weight has 192 rows, which block weights take in "
                     "multiples of 128; expected 2 x hidden (swiglu) a multiple of it"),
          "message '%s'", msg);
    test_end();
}

// Whether the arena has a region of that name (and whether it is persistent).
static bool region_named(const arena *a, const char *name, bool *persistent) {
    for (uint32_t h = 0; h < a->region_count; h++) {
        const arena_region *r = arena_region_get(a, h);
        if (strcmp(r->name, name) != 0) continue;
        if (persistent) *persistent = r->persistent;
        return true;
    }
    return false;
}

static uint32_t columnwise_regions(const arena *a, bool weights_only) {
    uint32_t n = 0;
    for (uint32_t h = 0; h < a->region_count; h++) {
        const arena_region *r = arena_region_get(a, h);
        if (weights_only && r->category != ARENA_CAT_WEIGHTS) continue;
        n += strstr(r->name, ".col_") != NULL;
    }
    return n;
}

// Usages are the union over the schedule: training keeps both copies of every weight with a
// dgrad (the tiny model's head; fc1, the first layer, has none); a schedule of eval and infer
// rows only allocates no columnwise data at all.
static void test_usage_union(void) {
    test_begin("plan_usages_union_over_schedule");
    for (size_t i = 0; i < 5; i++) {
        static const char *const quantized[] = {"delayed", "current", "mxfp8", "block", "nvfp4"};
        static char text[RECIPE_TEXT_MAX], eval_only[RECIPE_TEXT_MAX];
        recipe_text_for("tests/recipes/synthetic_tiny.recipe", quantized[i], text, sizeof text);
        run_options o = {0};
        qt_status st = recipe_parse(text, strlen(text), "tiny", &the_recipe);
        if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), &o);
        CHECK(st == QT_OK, "%s: %s", quantized[i], qt_error_message());
        char msg[256] = "";
        CHECK(st == QT_OK && arena_check(&the_run.dev, msg, sizeof msg) &&
                  arena_check(&the_run.host, msg, sizeof msg),
              "%s: packed arenas: %s", quantized[i], msg);
        uint32_t train_weights = columnwise_regions(&the_run.dev, true);
        CHECK(train_weights >= 1 && !region_named(&the_run.dev, "fc1.weight.col_data", NULL),
              "%s: %u columnwise weight regions with training (fc1's: %d)", quantized[i],
              train_weights, region_named(&the_run.dev, "fc1.weight.col_data", NULL));
        const char *row = "train 200 cosine 1e-2 -> 1e-3";
        const char *at = strstr(text, row);
        CHECK(at != NULL, "no train row in the tiny recipe");
        if (!at) break;
        snprintf(eval_only, sizeof eval_only, "%.*sinfer 3%s", (int)(at - text), text,
                 at + strlen(row));
        st = recipe_parse(eval_only, strlen(eval_only), "tiny_eval", &the_recipe);
        if (st == QT_OK) {
            st = test_run_plan(&the_run, &the_recipe, eval_only, strlen(eval_only), &o);
        }
        CHECK(st == QT_OK, "%s eval only: %s", quantized[i], qt_error_message());
        uint32_t any = columnwise_regions(&the_run.dev, false);
        CHECK(any == 0, "%s: %u columnwise regions without training", quantized[i], any);
    }
    test_end();
}

// The text with every line `from` (whole lines) made `to`; false when there is none.
static bool text_lines_replaced(const char *in, const char *from, const char *to, char *out,
                                size_t bytes) {
    size_t used = 0, n = strlen(from), count = 0;
    for (const char *at = in; *at != '\0';) {
        const char *end = strchr(at, '\n');
        size_t len = end ? (size_t)(end - at) : strlen(at);
        bool hit = len == n && memcmp(at, from, n) == 0;
        int w = snprintf(out + used, bytes - used, "%.*s%s", hit ? (int)strlen(to) : (int)len,
                         hit ? to : at, end ? "\n" : "");
        if (w < 0 || (size_t)w >= bytes - used) return false;
        used += (size_t)w;
        count += hit;
        at += len + (end != NULL);
    }
    return count > 0;
}

// `recompute` on the activations named by `from` (a layer line, e.g. "layer = relu"): the
// training records, loss to the persistent-state checksums, are those of the recipe without it,
// bit for bit (the op that makes the output again is the forward's), on either backend. Where
// the next linear's input is BF16 the train program holds the copy ("train.<act>.y_again");
// where it is quantized the flag changes nothing and the plan notes it.
static void test_recompute(backend_kind kind, const char *path, const char *scheme,
                           const char *from, const char *copy_region, const char *label) {
    char name[96];
    snprintf(name, sizeof name, "%s_recompute_same_training_records_%s",
             kind == BACKEND_GPU ? "gpu" : "train", label);
    test_begin(name);
    static char text[RECIPE_TEXT_MAX], again[RECIPE_TEXT_MAX];
    char to[64];
    snprintf(to, sizeof to, "%s recompute", from);
    CHECK(recipe_text_for(path, scheme, text, sizeof text) &&
              text_lines_replaced(text, from, to, again, sizeof again),
          "%s: no '%s' line to mark", path, from);
    qt_status st = recipe_parse(again, strlen(again), path, &the_recipe);
    run_options o = {0};
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, again, strlen(again), &o);
    CHECK(st == QT_OK, "%s with recompute: %s", path, qt_error_message());
    bool copies = st == QT_OK && region_named(&the_run.dev, copy_region, NULL);
    bool quantized = scheme && strcmp(scheme, "bf16") != 0;
    CHECK(copies != quantized, "%s: region %s %s", label, copy_region,
          copies ? "planned for a quantized input" : "missing");
    char traces[2][128];
    trace_path(traces[0], sizeof traces[0], "kept");
    trace_path(traces[1], sizeof traces[1], "recomputed");
    for (int i = 0; i < 2; i++) {
        if (!train_traced(name, path, i ? again : text, kind, 10, traces[i])) return;
    }
    size_t line = file_differs_after_first_line(traces[0], traces[1]);
    CHECK(line == 0, "%s: the traces differ with recompute from line %zu", label, line);
    test_end();
}

// The bench model in BF16: with its GELU outputs recomputed, the device arena drops by at least
// the three 256 MiB outputs that the first blocks no longer keep through backward, less the
// copy that lives while a block's wgrad runs. And the flag takes no effect where it cannot save.
// The captured train program of a bench recipe (plan only, no GPU): the gradient norm reads its
// groups in `min_beside` launches or more beside the backward pass, each on the stream that holds
// nothing else, and no other op before the norm's fold waits for one of them, directly or through
// other ops: the backward pass never queues behind the norm (runtime/backend/capture.h).
// With the weights' norm units (the default) the norm reads a few MiB and its groups are few;
// `elements` reads every gradient's elements (run_options.norm_elements), in more groups.
static void test_norm_beside_capture(const char *path, uint32_t min_beside, bool elements) {
    char name[128];
    const char *slash = strrchr(path, '/');
    snprintf(name, sizeof name, "plan_norm_beside_the_backward_pass_%s%s",
             slash ? slash + 1 : path, elements ? "_elements" : "");
    test_begin(name);
    static char text[RECIPE_TEXT_MAX];
    CHECK(recipe_text_for(path, NULL, text, sizeof text), "cannot read %s", path);
    run_options o = {.norm_elements = elements};
    qt_status st = recipe_parse(text, strlen(text), path, &the_recipe);
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), &o);
    CHECK(st == QT_OK, "%s: %s", path, qt_error_message());
    if (st != QT_OK) return;
    const program *p = &the_run.programs[MODEL_MODE_TRAIN];
    uint32_t fold = 0, beside = 0, misplaced = 0, queued = 0;
    uint64_t read = 0, units_ops = 0;  // bytes the norm reads; GEMMs that write norm units
    for (uint32_t j = 0; j < p->op_count; j++) {
        const prog_op *op = &p->ops[j];
        if (op->kernel == KERNEL_GNORM && !op->beside) fold = j;
        if (op->kernel == KERNEL_GNORM) {
            gnorm_args a;
            memcpy(&a, op->args, sizeof a);
            for (uint32_t r = 0; r < a.regions; r++) {
                read += a.count[r] * ((a.units >> r) & 1u ? 8 : 4);
            }
        }
        // A GEMM's units are a use of its args' norm_units field (the address lands at bind).
        for (uint32_t r = 0; op->args_bytes == sizeof(gemm_args) && r < op->ref_count; r++) {
            units_ops += op->refs[r].args_offset == offsetof(gemm_args, norm_units);
        }
    }
    // What the norm must read: a weight's units (gemm.h: 8 bytes per 16 x 64 unit of its
    // gradient, of each member's for a stacked expert weight) unless `elements`, every other
    // gradient's elements.
    uint64_t grad_bytes = 0, want = 0, with_units = 0;
    const model *mdl = &the_run.model;
    for (uint32_t i = 0; i < mdl->param_count; i++) {
        grad_bytes += (uint64_t)mdl->params[i].rows * mdl->params[i].cols * 4;
    }
    want = grad_bytes;
    for (uint32_t li = 0; li < mdl->linear_count && !elements; li++) {
        const model_param *w = &mdl->params[mdl->linears[li].weight];
        uint32_t members = mdl->linears[li].members ? mdl->linears[li].members : 1u;
        want -= (uint64_t)w->rows * w->cols * 4;
        want += members * qt_gemm_norm_unit_count(w->rows / members, w->cols) * 8;
        with_units++;
    }
    CHECK(read == want && units_ops == with_units, "the norm reads %llu bytes (expected %llu of "
          "the gradients' %llu); %llu wgrad GEMMs write units (expected %llu)",
          (unsigned long long)read, (unsigned long long)want, (unsigned long long)grad_bytes,
          (unsigned long long)units_ops, (unsigned long long)with_units);
    // waits_beside[j]: op j starts only after some beside op ends.
    bool *waits_beside = calloc(p->op_count, sizeof *waits_beside);
    int32_t last[CAPTURE_STREAMS];
    for (int s = 0; s < CAPTURE_STREAMS; s++) last[s] = CAPTURE_NONE;
    static capture_plan c;
    capture_begin(&c, p, false);
    for (uint32_t j = 0; waits_beside && j < p->op_count; j++) {
        capture_step step;
        capture_next(&c, j, &step);
        bool on_beside = step.stream == c.beside_stream;
        beside += p->ops[j].beside;
        misplaced += p->ops[j].beside != on_beside;
        int32_t before[CAPTURE_STREAMS + 1];
        uint32_t n = 0;
        if (last[step.stream] != CAPTURE_NONE) before[n++] = last[step.stream];
        for (uint32_t w = 0; w < step.wait_count; w++) {
            const capture_wait *wt = &step.waits[w];
            before[n++] = wt->mark != CAPTURE_NONE ? wt->op : last[wt->stream];
        }
        for (uint32_t k = 0; k < n; k++) {
            waits_beside[j] |= p->ops[before[k]].beside || waits_beside[before[k]];
        }
        if (!p->ops[j].beside && j < fold && waits_beside[j] && queued++ < 4) {
            CHECK(false, "op %u (%s) waits for a norm launch beside the backward pass", j,
                  p->ops[j].name);
        }
        last[step.stream] = (int32_t)j;
    }
    CHECK(waits_beside != NULL, "out of memory");
    CHECK(beside >= min_beside && misplaced == 0 && queued == 0,
          "%u norm launches beside (expected %u or more), %u on the wrong stream, %u ops of the "
          "main line behind one", beside, min_beside, misplaced, queued);
    free(waits_beside);
    test_end();
}

static void test_recompute_plan(void) {
    test_begin("plan_recompute_shrinks_the_bf16_bench_arena_and_not_below_the_first_weights");
    static char text[RECIPE_TEXT_MAX], again[RECIPE_TEXT_MAX];
    const char *path = "recipes/bench/resmlp_bf16.recipe";
    CHECK(recipe_text_for(path, NULL, text, sizeof text) &&
              text_lines_replaced(text, "layer = gelu", "layer = gelu recompute", again,
                                  sizeof again),
          "cannot read %s or it has no gelu", path);
    uint64_t dev[2] = {0, 0}, host[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        const char *t = i ? again : text;
        run_options o = {0};
        qt_status st = recipe_parse(t, strlen(t), path, &the_recipe);
        if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, t, strlen(t), &o);
        CHECK(st == QT_OK, "%s: %s", path, qt_error_message());
        if (st == QT_OK) run_memory_bytes(&the_run, &dev[i], &host[i]);
    }
    uint64_t mib = 1u << 20;
    CHECK(dev[1] + 256 * mib <= dev[0], "device arena %llu MiB with recompute, %llu without",
          (unsigned long long)(dev[1] / mib), (unsigned long long)(dev[0] / mib));
    CHECK(host[0] == host[1], "host arena changed: %llu -> %llu", (unsigned long long)host[0],
          (unsigned long long)host[1]);
    // An activation below every layer with parameters has no backward pass: the flag would keep
    // its input (the FP32 batch) alive for the copy alone, so it takes no effect, and says so.
    CHECK(recipe_text_for("tests/recipes/synthetic_tiny.recipe", NULL, text, sizeof text) &&
              text_lines_replaced(text, "layer = linear fc1 32 bias",
                                  "layer = gelu recompute\nlayer = linear fc1 32 bias", again,
                                  sizeof again),
          "cannot make the tiny recipe's first layer a gelu");
    run_options o = {0};
    qt_status st = recipe_parse(again, strlen(again), "first_gelu", &the_recipe);
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, again, strlen(again), &o);
    CHECK(st == QT_OK, "first gelu: %s", qt_error_message());
    bool noted = false;
    for (uint32_t i = 0; st == QT_OK && i < the_run.model.note_count; i++) {
        noted = noted || strstr(the_run.model.notes[i], "no layer below it has parameters");
    }
    CHECK(st == QT_OK && noted && !the_run.model.recompute[0] &&
              !region_named(&the_run.dev, "train.gelu#0.y_again", NULL),
          "a first-layer gelu recomputes (noted %d)", noted);
    test_end();
}

// `resident = on` keeps the train set on the device (data.train), and the eval set (data.eval)
// only where an eval or infer program reads it; `resident = off` keeps neither.
static void test_resident_plan(void) {
    test_begin("plan_resident_keeps_the_eval_set_only_for_its_readers");
    static char text[RECIPE_TEXT_MAX], again[RECIPE_TEXT_MAX], rows[RECIPE_TEXT_MAX],
        last[RECIPE_TEXT_MAX];
    const char *path = "tests/recipes/synthetic_tiny.recipe";
    static const struct {
        const char *resident, *schedule;
        bool train, eval;
    } cases[] = {
        {"on", "train 20\neval all", true, true},
        {"on", "train 20", true, false},
        {"on", "infer 2", true, true},
        {"off", "train 20\neval all", false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char resident[64];
        snprintf(resident, sizeof resident, "seed = 11\nresident = %s", cases[i].resident);
        bool made = recipe_text_for(path, NULL, text, sizeof text) &&
                    text_lines_replaced(text, "seed = 11", resident, again, sizeof again) &&
                    text_lines_replaced(again, "eval all", "", rows, sizeof rows) &&
                    text_lines_replaced(rows, "train 200 cosine 1e-2 -> 1e-3", cases[i].schedule,
                                        last, sizeof last);
        CHECK(made, "cannot make case %zu of %s", i, path);
        if (!made) continue;
        run_options o = {0};
        qt_status st = recipe_parse(last, strlen(last), path, &the_recipe);
        if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, last, strlen(last), &o);
        CHECK(st == QT_OK, "case %zu: %s", i, qt_error_message());
        if (st != QT_OK) continue;
        const model_io *io = &the_run.model.io;
        bool train = region_named(&the_run.dev, "data.train", NULL);
        bool eval = region_named(&the_run.dev, "data.eval", NULL);
        CHECK(train == cases[i].train && eval == cases[i].eval &&
                  io->datasets[DATA_DATASET_TRAIN].present == train &&
                  io->datasets[DATA_DATASET_EVAL].present == eval,
              "resident = %s, schedule '%s': data.train %d, data.eval %d (expected %d %d)",
              cases[i].resident, cases[i].schedule, train, eval, cases[i].train, cases[i].eval);
    }
    test_end();
}

// `weight_transpose`: with per_step a weight with a dgrad keeps no columnwise copy and the
// train program holds its transpose ("train.<layer>.weight_t"); with stored the copy is
// persistent; the first layer's weight (no dgrad) has none either way. The traces of both are
// identical, bit for bit (the transposed bytes are the ones the cast writes), on the reference
// backend and on the GPU, where an eager per_step run (checksums on) also equals its graph run.
// A label SCHEME_mxfp8_grads adds MXFP8 gradients, whose dgrads then run on BF16 copies of both
// operands (the transposed weight dequantized).
static void transpose_text(const char *label, const char *where, char *out, size_t bytes) {
    const char *suffix = "_mxfp8_grads";
    size_t n = strlen(label), k = strlen(suffix);
    bool mixed = n > k && strcmp(label + n - k, suffix) == 0;
    snprintf(out, bytes, "[model]\ninput = 16\nlayer = linear fc1 32\nlayer = relu\n"
             "layer = linear fc2 48\nlayer = relu\nlayer = linear head 4\n"
             "loss = softmax_xent\n[quant]\nrecipe = %.*s\n%sweight_transpose = %s\n"
             "[optim]\nadamw lr=1e-2 wd=0.01 clip=1.0\n[data]\n"
             "train = synthetic classes inputs=16 classes=4 samples=512 seed=3\n"
             "eval = synthetic classes inputs=16 classes=4 samples=64 seed=3\nbatch = 16\n"
             "seed = 5\n[schedule]\ntrain 40 cosine 1e-2 -> 1e-3\neval all\ninfer 2\n",
             (int)(mixed ? n - k : n), label,
             mixed ? "rule = linear.grad_output@* -> mxfp8 e5m2\n" : "", where);
}

static void transpose_check_plan(const char *scheme, const char *where) {
    static char text[RECIPE_TEXT_MAX];
    transpose_text(scheme, where, text, sizeof text);
    run_options o = {0};
    qt_status st = recipe_parse(text, strlen(text), "transpose", &the_recipe);
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), &o);
    CHECK(st == QT_OK, "%s %s: %s", scheme, where, qt_error_message());
    if (st != QT_OK) return;
    bool per_step = strcmp(where, "per_step") == 0;
    CHECK(!region_named(&the_run.dev, "fc1.weight.col_data", NULL),
          "%s %s: the first layer's weight has a columnwise copy", scheme, where);
    static const char *const layers[] = {"fc2", "head"};
    for (int i = 0; i < 2; i++) {
        char stored[64], step[64];
        snprintf(stored, sizeof stored, "%s.weight.col_data", layers[i]);
        snprintf(step, sizeof step, "train.%s.weight_t", layers[i]);
        bool persistent = false;
        bool has_stored = region_named(&the_run.dev, stored, &persistent);
        bool has_step = region_named(&the_run.dev, step, NULL);
        CHECK(has_stored == !per_step && (!has_stored || persistent) && has_step == per_step,
              "%s %s: %s %s (persistent %d), %s %s", scheme, where, stored,
              has_stored ? "reserved" : "absent", persistent, step,
              has_step ? "reserved" : "absent");
    }
    // The plan's summary names the choice on the layers that transpose per step.
    char *report = NULL;
    size_t bytes = 0;
    FILE *out = open_memstream(&report, &bytes);
    model_print_summary(&the_run.model, out);
    fclose(out);
    const char *head = report ? strstr(report, "\n  head ") : NULL;
    const char *end = head ? strchr(head + 1, '\n') : NULL;
    const char *mark = head ? strstr(head, "W^T per step") : NULL;
    bool marked = mark && (!end || mark < end);
    CHECK(marked == per_step, "%s %s: the summary's head line %s 'W^T per step':\n%s", scheme,
          where, marked ? "says" : "lacks", report ? report : "");
    free(report);
    run_close(&the_run);
}

static void test_weight_transpose(backend_kind kind, const char *scheme) {
    char name[96];
    snprintf(name, sizeof name, "%sweight_transpose_per_step_equals_stored_%s",
             kind == BACKEND_GPU ? "gpu_" : "", scheme);
    static char texts[2][RECIPE_TEXT_MAX];
    static const char *const wheres[2] = {"stored", "per_step"};
    char traces[3][128];
    for (int i = 0; i < 2; i++) transpose_text(scheme, wheres[i], texts[i], sizeof texts[i]);
    for (int i = 0; i < 3; i++) {
        char base[32];
        snprintf(base, sizeof base, "transpose_%d", i);
        trace_path(traces[i], sizeof traces[i], base);
    }
    test_begin(name);
    if (kind == BACKEND_REF) {
        transpose_check_plan(scheme, "stored");
        transpose_check_plan(scheme, "per_step");
    }
    for (int i = 0; i < 2; i++) {
        if (!train_traced(name, wheres[i], texts[i], kind, 0, traces[i])) return;
    }
    size_t line = file_differs_after_first_line(traces[0], traces[1]);
    CHECK(line == 0, "%s: the traces of stored and per_step differ from line %zu", scheme, line);
    if (kind == BACKEND_GPU) {
        train_case c = {.name = "per_step", .text = texts[1], .kind = kind};
        c.options.checksum_every = 10;
        sched_summary sum;
        const char *why = NULL;
        c.options.trace_path = traces[1];
        train(&c, &sum, &why);
        c.options.trace_path = traces[2];
        c.options.eager = true;
        train(&c, &sum, &why);
        check_identical(traces[1], traces[2]);
    }
    test_end();
}

// The command-line tool: run (its trace equals the API's), plan, and a refusal.
static void test_cli(void) {
    test_begin("cli_run_plan_and_refusal");
    static char out[1 << 16];
    char a[128], b[128], cmd[512];
    trace_path(a, sizeof a, "cli");
    trace_path(b, sizeof b, "api");
    snprintf(cmd, sizeof cmd, "build/qtrain run tests/recipes/synthetic_tiny.recipe --ref "
             "--trace %s", a);
    int rc = command_output(cmd, out, sizeof out);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    const char *needles[] = {"reference backend", "train loss", "eval         accuracy",
                             "wall time", "arena bytes", "steps/s",
                             "step time    median "};
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++) {
        CHECK(strstr(out, needles[i]) != NULL, "run output lacks '%s':\n%s", needles[i], out);
    }
    static char text[RECIPE_TEXT_MAX];
    recipe_text_for("tests/recipes/synthetic_tiny.recipe", NULL, text, sizeof text);
    train_case c = {.name = "tests/recipes/synthetic_tiny.recipe", .text = text,
                    .kind = BACKEND_REF};
    c.options.checksum_every = 100;  // the CLI's default
    c.options.trace_path = b;
    sched_summary sum;
    const char *why = NULL;
    train(&c, &sum, &why);
    check_identical(a, b);
    rc = command_output("build/qtrain plan tests/recipes/synthetic_custom.recipe", out,
                        sizeof out);
    CHECK(rc == 0 && strstr(out, "mixed(bf16)") && strstr(out, "RHT off for both") &&
              strstr(out, "\n  total ") && strstr(out, "program checksum"),
          "plan exit %d:\n%.2000s", rc, out);
    // The plan's head (the whole plan is larger than the buffer): the model and the first
    // program.
    rc = command_output("build/qtrain plan tests/recipes/moe_residual.recipe | head -c 30000", out,
                        sizeof out);
    CHECK(rc == 0 && strstr(out, "8 experts, top-2, hidden 96 (swiglu)") &&
              strstr(out, "memory: router ") && strstr(out, " MiB, experts ") &&
              strstr(out, "grouped_linear.weight@experts.fc1") && strstr(out, "qt_moe_permute"),
          "moe plan exit %d:\n%.2000s", rc, out);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Staging: each step computes on its own batch

// What every step of a run put out: infer outputs (bf16 [batch][outputs]), eval loss and
// accuracy bits.
#define STAGE_STEPS_MAX 16
#define STAGE_OUTPUTS 6
#define STAGE_BATCH_MAX 256

typedef struct stage_log {
    uint32_t steps;
    uint32_t output_bytes;  // of one infer step
    model_mode mode[STAGE_STEPS_MAX];
    uint32_t loss[STAGE_STEPS_MAX], accuracy[STAGE_STEPS_MAX];
    uint16_t outputs[STAGE_STEPS_MAX][STAGE_BATCH_MAX * STAGE_OUTPUTS];
} stage_log;

static void stage_record(void *ctx, const sched_progress *p) {
    stage_log *log = ctx;
    uint32_t i = log->steps++;
    if (i >= STAGE_STEPS_MAX) return;
    log->mode[i] = p->mode;
    memcpy(&log->loss[i], &p->record->loss, 4);
    memcpy(&log->accuracy[i], &p->record->accuracy, 4);
    if (p->mode == MODEL_MODE_INFER) memcpy(log->outputs[i], p->outputs, log->output_bytes);
}

// Steps a and b of two logs put out the same bits.
static bool stage_same(const stage_log *x, uint32_t a, const stage_log *y, uint32_t b) {
    if (a >= x->steps || b >= y->steps || x->mode[a] != y->mode[b]) return false;
    if (x->mode[a] == MODEL_MODE_INFER) {
        return memcmp(x->outputs[a], y->outputs[b], x->output_bytes) == 0;
    }
    return x->loss[a] == y->loss[b] && x->accuracy[a] == y->accuracy[b];
}

// An IDX pair of `samples` images rows x cols and labels below STAGE_OUTPUTS: sample i of the
// files is sample first + i of one fixed pseudo-random sequence, so a file of a batch's samples
// holds exactly that batch.
static void stage_write_idx(const char *images, const char *labels, uint32_t first,
                            uint32_t samples, uint32_t rows, uint32_t cols) {
    FILE *fi = fopen(images, "wb"), *fl = fopen(labels, "wb");
    CHECK(fi && fl, "cannot write %s or %s", images, labels);
    if (!fi || !fl) return;
    uint8_t hi[16] = {0, 0, 8, 3}, hl[8] = {0, 0, 8, 1};
    uint32_t dims[3] = {samples, rows, cols};
    for (int d = 0; d < 3; d++) {
        for (int k = 0; k < 4; k++) hi[4 + 4 * d + k] = (uint8_t)(dims[d] >> (24 - 8 * k));
    }
    memcpy(hl + 4, hi + 4, 4);
    fwrite(hi, 1, sizeof hi, fi);
    fwrite(hl, 1, sizeof hl, fl);
    for (uint32_t i = first; i < first + samples; i++) {
        for (uint32_t j = 0; j < rows * cols; j++) {
            fputc((int)(qt_mix64((uint64_t)i * 0x10000 + j) >> 56), fi);
        }
        fputc((int)(qt_mix64(~(uint64_t)i) % STAGE_OUTPUTS), fl);
    }
    fclose(fi);
    fclose(fl);
}

typedef struct stage_setup {
    backend_kind kind;
    bool eager;
    bool idx;               // u8 pixels (IDX files), else synthetic FP32 inputs
    uint32_t side;          // IDX images side x side; synthetic inputs side * side
    uint32_t hidden;        // width of the model's two hidden layers
    uint32_t batch;
    uint32_t eval_samples;  // the last batch is partial
    const char *label;
    bool resident;          // `resident = on`: the device gathers each batch from its indices
} stage_setup;

// The run is resident as asked: both datasets on the device and a gather before every staging
// op (or neither).
static bool stage_resident_expected;

static void stage_inspect(run *r, backend *b, void *ctx) {
    (void)b;
    (void)ctx;
    bool want = stage_resident_expected;
    const model_io *io = &r->model.io;
    CHECK(io->slot.resident == want && io->datasets[DATA_DATASET_TRAIN].present == want &&
              io->datasets[DATA_DATASET_EVAL].present == want,
          "resident %d: the slot's %d, datasets %d %d", want, io->slot.resident,
          io->datasets[DATA_DATASET_TRAIN].present, io->datasets[DATA_DATASET_EVAL].present);
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        const program *p = &r->programs[mode];
        if (!r->model.modes[mode] || p->op_count == 0) continue;
        bool gather = p->ops[0].kernel == KERNEL_SCHED_GATHER;
        CHECK(gather == want, "%s program: first op %s", model_mode_name((model_mode)mode),
              p->ops[0].name);
    }
}

// Trains nothing: runs `schedule` of the stage recipe on the given eval source into *log.
static bool stage_run(const stage_setup *su, const char *eval_source, const char *schedule,
                      stage_log *log, const char **why) {
    static char text[RECIPE_TEXT_MAX], train_source[320];
    char images[128], labels[128];
    tmp_path_copy(images, sizeof images, "stage_train_images");
    tmp_path_copy(labels, sizeof labels, "stage_train_labels");
    uint32_t features = su->side * su->side;
    if (su->idx) {
        snprintf(train_source, sizeof train_source, "idx %s %s", images, labels);
    } else {
        snprintf(train_source, sizeof train_source, "synthetic classes inputs=%u classes=%u "
                 "samples=%u seed=8", features, STAGE_OUTPUTS, 3 * su->batch);
    }
    snprintf(text, sizeof text, "[model]\ninput = %u\nlayer = linear fc1 %u bias\n"
             "layer = gelu\nlayer = linear fc2 %u\nlayer = gelu\n"
             "layer = linear head %u bias\nloss = softmax_xent\n"
             "[quant]\nrecipe = bf16\n[optim]\nadamw\n"
             "[data]\ntrain = %s\neval = %s\nbatch = %u\nseed = 5\nresident = %s\n"
             "[schedule]\n%s\n",
             features, su->hidden, su->hidden, STAGE_OUTPUTS, train_source, eval_source,
             su->batch, su->resident ? "on" : "off", schedule);
    memset(log, 0, sizeof *log);
    log->output_bytes = su->batch * STAGE_OUTPUTS * 2;
    train_case c = {.name = "stage.recipe", .text = text, .kind = su->kind,
                    .progress = stage_record, .ctx = log, .inspect = stage_inspect};
    stage_resident_expected = su->resident;
    c.options.eager = su->eager;
    sched_summary sum;
    if (!train(&c, &sum, why)) return false;
    uint64_t steps = sum.steps[0] + sum.steps[1] + sum.steps[2];
    CHECK(log->steps == steps && sum.batch_copies == steps,
          "%s: %u records and %llu batch copies for %llu steps", su->label, log->steps,
          (unsigned long long)sum.batch_copies, (unsigned long long)steps);
    return true;
}

// Infer and eval passes over an eval set whose batches all differ, after 0, 1 and 2 steps on
// the train set (so every batch meets every host slot and both device slots), must put out the
// same bits for each batch; with IDX data each batch must also match a run that has that batch
// alone as its whole eval set (staged by the first copy of a fresh run). A step that read
// another step's slot, or a slot whose copy had not landed, would differ. The weights are the
// seeded initial ones in every run, since nothing trains. `other` (or NULL): the log of another
// execution of the same passes (graphs, for eager launches), which must match bit for bit when
// it holds one; it is given this run's log.
static void stage_case(const stage_setup *su, stage_log *other) {
    char name[96];
    snprintf(name, sizeof name, "%s_each_step_stages_its_own_batch_%s",
             su->kind == BACKEND_GPU ? "gpu" : "train", su->label);
    static char eval_source[320];
    char images[128], labels[128];
    tmp_path_copy(images, sizeof images, "stage_eval_images");
    tmp_path_copy(labels, sizeof labels, "stage_eval_labels");
    if (su->idx) {
        char train_images[128], train_labels[128];
        tmp_path_copy(train_images, sizeof train_images, "stage_train_images");
        tmp_path_copy(train_labels, sizeof train_labels, "stage_train_labels");
        stage_write_idx(train_images, train_labels, 1u << 20, 3 * su->batch, su->side,
                        su->side);
        stage_write_idx(images, labels, 0, su->eval_samples, su->side, su->side);
        snprintf(eval_source, sizeof eval_source, "idx %s %s", images, labels);
    } else {
        snprintf(eval_source, sizeof eval_source, "synthetic classes inputs=%u classes=%u "
                 "samples=%u seed=9", su->side * su->side, STAGE_OUTPUTS, su->eval_samples);
    }
    static stage_log logs[3], alone;
    static const char *const schedules[3] = {"infer all\neval all",
                                             "infer 1 train\ninfer all\neval all",
                                             "infer 2 train\ninfer all\neval all"};
    const char *why = NULL;
    test_begin(name);
    for (uint32_t shift = 0; shift < 3; shift++) {
        if (!stage_run(su, eval_source, schedules[shift], &logs[shift], &why)) {
            test_skip(name, why);
            return;
        }
    }
    uint32_t batches = (su->eval_samples + su->batch - 1) / su->batch;
    QT_ASSERT(2 + 2 * batches <= STAGE_STEPS_MAX && su->batch <= STAGE_BATCH_MAX);
    for (uint32_t k = 0; k < batches; k++) {
        for (uint32_t shift = 1; shift < 3; shift++) {
            CHECK(stage_same(&logs[0], k, &logs[shift], shift + k),
                  "infer of batch %u differs after %u train-set steps", k, shift);
            CHECK(stage_same(&logs[0], batches + k, &logs[shift], shift + batches + k),
                  "eval of batch %u differs after %u train-set steps", k, shift);
        }
        CHECK(k == 0 || !stage_same(&logs[0], k - 1, &logs[0], k),
              "batches %u and %u put out the same outputs: the test data cannot tell them apart",
              k - 1, k);
    }
    for (uint32_t i = 0; other && other->steps > 0 && i < logs[0].steps; i++) {
        CHECK(stage_same(&logs[0], i, other, i), "step %u differs from the other execution", i);
    }
    if (other) *other = logs[0];
    for (uint32_t k = 0; su->idx && k < batches; k++) {
        uint32_t first = k * su->batch;
        uint32_t rows = su->eval_samples - first < su->batch ? su->eval_samples - first
                                                             : su->batch;
        char one_images[128], one_labels[128];
        tmp_path_copy(one_images, sizeof one_images, "stage_one_images");
        tmp_path_copy(one_labels, sizeof one_labels, "stage_one_labels");
        stage_write_idx(one_images, one_labels, first, rows, su->side, su->side);
        snprintf(eval_source, sizeof eval_source, "idx %s %s", one_images, one_labels);
        stage_run(su, eval_source, schedules[0], &alone, &why);
        CHECK(stage_same(&logs[0], k, &alone, 0) && stage_same(&logs[0], batches + k, &alone, 1),
              "batch %u: the full pass and a run of that batch alone differ", k);
    }
    test_end();
}

// Each with the batches staged from the host and gathered on the device from resident datasets
// (the second run must put out the first one's bits).
static void test_stage_ref(void) {
    // Rows of 25 pixels (a partial 16-pixel chunk), 7 batches, the last one of 5 rows.
    static stage_log staged;
    static const char *const labels[4] = {"idx_ref", "idx_resident_ref", "synthetic_ref",
                                           "synthetic_resident_ref"};
    for (int i = 0; i < 4; i++) {
        stage_setup su = {BACKEND_REF, false, i < 2, 5, 24, 8, 53, labels[i], i % 2 == 1};
        if (i % 2 == 0) staged.steps = 0;
        stage_case(&su, &staged);
    }
}

// A whole run with resident datasets gives the records of the same run staging its rows, in the
// formats whose first cast takes the staging op's amax (current, NVFP4) and the others, with
// partial batches in both datasets (batch 24 of 512 train and 64 eval samples): the traces are
// the same past their first line (which holds the recipe's hash).
static bool same_past_first_line(const char *a, const char *b) {
    static char ta[1 << 20], tb[1 << 20];
    size_t na = 0, nb = 0;
    if (!read_file(a, ta, sizeof ta, &na) || !read_file(b, tb, sizeof tb, &nb)) return false;
    const char *xa = memchr(ta, '\n', na), *xb = memchr(tb, '\n', nb);
    return xa && xb && na - (size_t)(xa - ta) == nb - (size_t)(xb - tb) &&
           memcmp(xa, xb, na - (size_t)(xa - ta)) == 0 && na > (size_t)(xa - ta) + 1;
}

static void test_resident_traces(backend_kind kind) {
    static const char *const schemes[] = {"bf16", "current", "delayed", "nvfp4", "mxfp8"};
    char name[80];
    snprintf(name, sizeof name, "%sresident_datasets_train_like_staged_rows",
             kind == BACKEND_GPU ? "gpu_" : "");
    test_begin(name);
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        static char base[RECIPE_TEXT_MAX], text[2][RECIPE_TEXT_MAX];
        char traces[2][160];
        CHECK(recipe_text_for("tests/recipes/synthetic_tiny.recipe", schemes[i], base,
                              sizeof base), "cannot read synthetic_tiny.recipe");
        bool ok = text_lines_replaced(base, "batch = 16", "batch = 24", text[0],
                                      sizeof text[0]) &&
                  text_lines_replaced(text[0], "seed = 11", "seed = 11\nresident = on", text[1],
                                      sizeof text[1]);
        CHECK(ok, "cannot make the resident recipe");
        if (!ok) break;
        for (int r = 0; r < 2; r++) {
            trace_path(traces[r], sizeof traces[r], r ? "resident" : "staged");
            if (!train_traced(name, "synthetic_tiny.recipe", text[r], kind, 50, traces[r])) {
                return;
            }
        }
        CHECK(same_past_first_line(traces[0], traces[1]), "%s: the resident run's records "
              "differ", schemes[i]);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The step's amax slots (runtime/model/model.h, model_amax_slots)

// A train, eval and infer schedule for the slot runs, in place of the recipe's.
static void slots_text(const char *path, const char *scheme, char *out, size_t bytes) {
    CHECK(recipe_text_for(path, scheme, out, bytes), "cannot read %s", path);
    char *schedule = strstr(out, "[schedule]");
    QT_ASSERT(schedule != NULL);
    snprintf(schedule, bytes - (size_t)(schedule - out),
             "[schedule]\ntrain 12\neval all\ninfer 2\ntrain 3\neval 2\n");
}

// Ops of the given kernels in the program of `mode` (0 when the run has none).
static uint32_t slots_count_ops(const run *r, int mode, const kernel_id *kernels,
                                uint32_t count) {
    uint32_t n = 0;
    const program *p = &r->programs[mode];
    for (uint32_t i = 0; r->model.modes[mode] && i < p->op_count; i++) {
        for (uint32_t k = 0; k < count; k++) n += p->ops[i].kernel == kernels[k];
    }
    return n;
}

// Ops of kernels that zero amaxes of their own (the slots' first op and the optimizer's begin
// take them all) in the train, eval and infer programs.
static uint32_t slots_zero_ops(const run *r) {
    static const kernel_id zeroing[] = {KERNEL_FP8_AMAX_ZERO, KERNEL_NVFP4_AMAX_ZERO,
                                        KERNEL_OPTIM_AMAX_ZERO};
    uint32_t n = 0;
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) n += slots_count_ops(r, mode, zeroing, 3);
    return n;
}

// Every step's amax slots ("<mode>.step#amax") filled with a huge amax, as a step would find
// them if the previous step's larger amaxes carried over. Returns the regions filled.
#define SLOTS_POISON 0x7F000000u  // 1.7e38: scales from it take nearly every value to 0

static uint32_t slots_poison(run *r, backend *b) {
    uint32_t filled = 0;
    for (uint32_t h = 0; h < r->dev.region_count; h++) {
        const arena_region *reg = arena_region_get(&r->dev, h);
        size_t n = strlen(reg->name), tail = strlen(".step#amax");
        if (n < tail || strcmp(reg->name + n - tail, ".step#amax") != 0) continue;
        uint32_t *words = malloc(reg->bytes);
        QT_ASSERT(words != NULL);
        for (uint64_t i = 0; i < reg->bytes / 4; i++) words[i] = SLOTS_POISON;
        CHECK(backend_write(b, (prog_ref){&r->dev, h, 0}, words, reg->bytes) == QT_OK, "%s",
              qt_error_message());
        free(words);
        filled++;
    }
    return filled;
}

// How slots_run runs a recipe, and what it saw.
typedef struct slots_setup {
    backend_kind kind;
    bool eager;
    bool poison;       // the slots filled with SLOTS_POISON before every step
    bool amax_passes;  // run_options.amax_passes: no producer takes an amax
    uint64_t norm_group_elems;  // run_options.norm_group_elems
    uint64_t act_cast_elems;    // run_options.act_cast_elems
} slots_setup;

typedef struct slots_seen {
    uint32_t regions;                   // the slot regions the run has (when poisoned)
    uint32_t zero_ops;                  // slots_zero_ops
    uint32_t passes[MODEL_MODE_COUNT];  // each program's amax passes (qt_fp8_amax, qt_nvfp4_amax)
    uint32_t norm_ops, norm_beside;     // the train program's norm launches, and those beside
    uint32_t act_casts[MODEL_MODE_COUNT];  // each program's activation casts (qt_fp8_act_cast_*,
                                           // qt_quant_block_act_*, qt_mxfp8_act_*)
    uint32_t from_max[MODEL_MODE_COUNT];   // those of them that read a GEMM's maximum slot
} slots_seen;

// The activation casts of a program that read their input's maximum slot (fp8_act_cast_args
// x_max, which the fprop before fills: ptx/gemm.h, gemm_args.d_max).
static uint32_t slots_from_max_ops(const run *r, int mode) {
    uint32_t n = 0;
    const program *p = &r->programs[mode];
    for (uint32_t i = 0; r->model.modes[mode] && i < p->op_count; i++) {
        const prog_op *op = &p->ops[i];
        if (op->kernel != KERNEL_FP8_ACT_CAST_FWD) continue;
        for (uint32_t u = 0; u < op->ref_count; u++) {
            n += op->refs[u].args_offset == offsetof(fp8_act_cast_args, x_max);
        }
    }
    return n;
}

// Runs the text's schedule step by step into `trace` (checksums every train step) as `su` says.
// False (with *why) when the backend cannot be opened.
static bool slots_run(const char *text, const slots_setup *su, const char *trace,
                      slots_seen *seen, const char **why) {
    backend_kind kind = su->kind;
    static backend b;
    memset(&b, 0, sizeof b);
    if (kind == BACKEND_GPU && backend_open_gpu(&b, 0) != QT_OK) {
        *why = qt_error_message();
        backend_close(&b);
        return false;
    }
    if (kind == BACKEND_REF) backend_open_ref(&b);
    run_options o = {0};
    o.trace_path = trace;
    o.checksum_every = 1;
    o.eager = su->eager;
    o.amax_passes = su->amax_passes;
    o.norm_group_elems = su->norm_group_elems;
    o.act_cast_elems = su->act_cast_elems;
    uint64_t dev_bytes = 0, host_bytes = 0, steps[MODEL_MODE_COUNT];
    void *dev = NULL, *host = NULL, *data = NULL;
    qt_status st = recipe_parse(text, strlen(text), "slots.recipe", &the_recipe);
    if (st == QT_OK) st = test_run_plan(&the_run, &the_recipe, text, strlen(text), &o);
    if (st == QT_OK) {
        run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
        if (kind == BACKEND_REF) {
            dev = arena_memory(dev_bytes);
            host = arena_memory(host_bytes);
        }
        data = arena_memory(run_data_bytes(&the_run));
        st = run_load(&the_run, data, run_data_bytes(&the_run));
    }
    if (st == QT_OK) st = run_bind(&the_run, &b, dev, host);
    memset(seen, 0, sizeof *seen);
    static const kernel_id passes[] = {KERNEL_FP8_AMAX, KERNEL_NVFP4_AMAX};
    static const kernel_id act_casts[] = {KERNEL_FP8_ACT_CAST_FWD, KERNEL_FP8_ACT_CAST_BWD,
                                          KERNEL_QUANT_BLOCK_ACT_FWD, KERNEL_QUANT_BLOCK_ACT_BWD,
                                          KERNEL_MXFP8_ACT_FWD, KERNEL_MXFP8_ACT_BWD};
    const uint32_t act_kinds = (uint32_t)(sizeof act_casts / sizeof act_casts[0]);
    for (int mode = 0; st == QT_OK && mode < MODEL_MODE_COUNT; mode++) {
        seen->passes[mode] = slots_count_ops(&the_run, mode, passes, 2);
        seen->act_casts[mode] = slots_count_ops(&the_run, mode, act_casts, act_kinds);
        seen->from_max[mode] = slots_from_max_ops(&the_run, mode);
    }
    seen->zero_ops = st == QT_OK ? slots_zero_ops(&the_run) : 0;
    const program *train = &the_run.programs[MODEL_MODE_TRAIN];
    for (uint32_t i = 0; st == QT_OK && i < train->op_count; i++) {
        seen->norm_ops += train->ops[i].kernel == KERNEL_GNORM;
        seen->norm_beside += train->ops[i].kernel == KERNEL_GNORM && train->ops[i].beside;
    }
    for (;;) {
        if (st != QT_OK) break;
        run_steps_left(&the_run, steps);
        if (steps[0] + steps[1] + steps[2] == 0) break;
        if (su->poison) seen->regions = slots_poison(&the_run, &b);
        sched_summary sum;
        st = run_step(&the_run, NULL, NULL, &sum);
    }
    if (st == QT_OK) st = run_end_trace(&the_run);
    CHECK(st == QT_OK, "%s: %s", qt_status_name(st), qt_error_message());
    run_close(&the_run);
    free(dev);
    free(host);
    free(data);
    backend_close(&b);
    return true;
}

// Every train, eval and infer program zeroes the step's amax slots in its first op and has no
// zeroing launch of its own (nor has the optimizer, whose begin zeroes its workspaces), and a
// step's amaxes never carry over: a run whose slots hold a huge amax before every step (as a
// step that found the previous one's larger amax would) gives the trace of a run without, byte
// for byte, checksums of every weight, master, optimizer and scaling region after every train
// step included. On the GPU an eager run and a graph run, each poisoned, give the graph trace.
static void test_amax_slots(backend_kind kind, const char *path, const char *scheme,
                            const char *label) {
    char name[96];
    snprintf(name, sizeof name, "%samax_slots_zeroed_every_step_%s",
             kind == BACKEND_GPU ? "gpu_" : "", label);
    static char text[RECIPE_TEXT_MAX];
    slots_text(path, scheme, text, sizeof text);
    char clean[128], poisoned[128], eager[128];
    trace_path(clean, sizeof clean, "slots_clean");
    trace_path(poisoned, sizeof poisoned, "slots_poisoned");
    trace_path(eager, sizeof eager, "slots_eager");
    slots_seen seen;
    const char *why = NULL;
    test_begin(name);
    slots_setup su = {kind, false, false, false, 0, 0};
    if (!slots_run(text, &su, clean, &seen, &why)) {
        test_skip(name, why);
        return;
    }
    CHECK(seen.zero_ops == 0, "%u ops zero amaxes of their own", seen.zero_ops);
    su.poison = true;
    slots_run(text, &su, poisoned, &seen, &why);
    // train, eval and infer: each has slots.
    CHECK(seen.regions == 3, "%u programs with amax slots, expected 3", seen.regions);
    check_identical(clean, poisoned);
    if (kind == BACKEND_GPU) {
        su.eager = true;
        slots_run(text, &su, eager, &seen, &why);
        check_identical(clean, eager);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Producers' amaxes (runtime/model/model_build.c, mb_producer_serves)

// A residual model that puts a producer of every kind in front of a quantized linear: forward,
// the staging op (the input of `in`), an rmsnorm (of `up`), an activation (of `down`) and a
// residual end (of `head`); backward, the loss gradient (of `head`), an activation's gradient
// (of `up`) and a residual begin's sum (of `in`). head's dgrad, a GEMM, leaves down's gradient
// to a pass of its own. Or a recipe file (path) with the slot runs' schedule.
typedef struct producer_case {
    const char *label;
    const char *path;    // NULL: the residual model
    const char *scheme;  // the built-in recipe
    const char *rule;    // the residual model's extra rule line, or ""
    const char *loss;    // the residual model's: softmax_xent or mse
    bool idx;            // the residual model's inputs: u8 pixels of IDX files, else FP32
    // Amax passes of the train, eval and infer programs: with the producers', with none.
    uint32_t passes[2][MODEL_MODE_COUNT];
    // The residual model's activation casts at any size (run_options.act_cast_elems 1, up
    // without a bias so that the backward pass takes one too), and their launches in the train,
    // eval and infer programs; the runs with every amax a pass of their own store y and dx.
    bool act_cast;
    uint32_t act_casts[MODEL_MODE_COUNT];
} producer_case;

#define PRODUCER_SIDE 4u  // IDX images 4 x 4: 16 inputs
#define PRODUCER_EVAL 40u  // eval samples: two batches of 16 and one of 8

static void producer_text(const producer_case *pc, char *out, size_t bytes) {
    if (pc->path) {
        slots_text(pc->path, pc->scheme, out, bytes);
        return;
    }
    static char train_source[320], eval_source[320];
    uint32_t inputs = PRODUCER_SIDE * PRODUCER_SIDE;
    if (pc->idx) {
        char images[128], labels[128];
        tmp_path_copy(images, sizeof images, "producer_train_images");
        tmp_path_copy(labels, sizeof labels, "producer_train_labels");
        stage_write_idx(images, labels, 0, 48, PRODUCER_SIDE, PRODUCER_SIDE);
        snprintf(train_source, sizeof train_source, "idx %s %s", images, labels);
        tmp_path_copy(images, sizeof images, "producer_eval_images");
        tmp_path_copy(labels, sizeof labels, "producer_eval_labels");
        stage_write_idx(images, labels, 48, PRODUCER_EVAL, PRODUCER_SIDE, PRODUCER_SIDE);
        snprintf(eval_source, sizeof eval_source, "idx %s %s", images, labels);
    } else {
        bool classes = strcmp(pc->loss, "softmax_xent") == 0;
        const char *kind = classes ? "classes" : "teacher";
        const char *outputs = classes ? "classes" : "outputs";
        snprintf(train_source, sizeof train_source,
                 "synthetic %s inputs=%u %s=%u samples=256 seed=3", kind, inputs, outputs,
                 STAGE_OUTPUTS);
        snprintf(eval_source, sizeof eval_source, "synthetic %s inputs=%u %s=%u samples=%u seed=4",
                 kind, inputs, outputs, STAGE_OUTPUTS, PRODUCER_EVAL);
    }
    snprintf(out, bytes,
             "[model]\ninput = %u\nlayer = linear in 32\nlayer = residual begin\n"
             "layer = rmsnorm\nlayer = linear up 64%s\nlayer = gelu\nlayer = linear down 32\n"
             "layer = residual end\nlayer = linear head %u\nloss = %s\n"
             "[quant]\nrecipe = %s\n%s\n[optim]\nadamw lr=1e-2 wd=0.01 clip=1.0\n"
             "[data]\ntrain = %s\neval = %s\nbatch = 16\nseed = 11\n"
             "[schedule]\ntrain 12\neval all\ninfer 2\ntrain 3\neval 2\n",
             inputs, pc->act_cast ? "" : " bias", STAGE_OUTPUTS, pc->loss, pc->scheme, pc->rule,
             train_source, eval_source);
}

// A test of a producer case: its name (`what`, the case's label, gpu_ first on the GPU) and its
// recipe text (one buffer, rewritten by the next call).
static const char *producer_test(backend_kind kind, const producer_case *pc, const char *what,
                                 char *name, size_t name_bytes) {
    snprintf(name, name_bytes, "%s%s_%s", kind == BACKEND_GPU ? "gpu_" : "", what, pc->label);
    static char text[RECIPE_TEXT_MAX];
    producer_text(pc, text, sizeof text);
    return text;
}

// A run whose producers take the amaxes that the casts after them read gives the trace of a run
// whose every amax comes from a pass of its own (run_options.amax_passes), byte for byte,
// checksums of every weight, master, optimizer and scaling region after every train step
// included, with the passes the case expects (fewer); on the GPU an eager run gives the graph
// run's trace too.
static void test_producer_amax(backend_kind kind, const producer_case *pc) {
    char name[96];
    const char *text = producer_test(kind, pc, "producer_amaxes_match_separate_passes", name,
                                     sizeof name);
    char merged[128], passes[128], eager[128];
    trace_path(merged, sizeof merged, "producer_merged");
    trace_path(passes, sizeof passes, "producer_passes");
    trace_path(eager, sizeof eager, "producer_eager");
    slots_seen seen[2];
    const char *why = NULL;
    test_begin(name);
    slots_setup su = {kind, false, false, false, 0, pc->act_cast ? 1 : 0};
    if (!slots_run(text, &su, merged, &seen[0], &why)) {
        test_skip(name, why);
        return;
    }
    su.amax_passes = true;
    slots_run(text, &su, passes, &seen[1], &why);
    check_identical(passes, merged);
    static const char *const way[2] = {"producers", "passes"};
    for (int w = 0; w < 2; w++) {
        for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
            CHECK(seen[w].passes[mode] == pc->passes[w][mode], "%s, %s program: %u amax "
                  "passes, expected %u", way[w], model_mode_name((model_mode)mode),
                  seen[w].passes[mode], pc->passes[w][mode]);
            uint32_t casts = w == 0 ? pc->act_casts[mode] : 0;
            CHECK(seen[w].act_casts[mode] == casts, "%s, %s program: %u activation casts, "
                  "expected %u", way[w], model_mode_name((model_mode)mode),
                  seen[w].act_casts[mode], casts);
            // Current scaling's forward amax reads the fprop's maximum slot (one per program).
            uint32_t from_max = w == 0 && casts && strcmp(pc->scheme, "current") == 0 ? 1 : 0;
            CHECK(seen[w].from_max[mode] == from_max, "%s, %s program: %u amaxes from the "
                  "fprop's maximum, expected %u", way[w], model_mode_name((model_mode)mode),
                  seen[w].from_max[mode], from_max);
        }
    }
    if (pc->act_cast) {
        // The fprops' maximum slots are slots of the step: a huge value left in them before
        // every step (test_amax_slots) would give a huge amax, unless the step zeroes them.
        char poisoned[128];
        trace_path(poisoned, sizeof poisoned, "producer_poisoned");
        su.amax_passes = false;
        su.poison = true;
        slots_run(text, &su, poisoned, &seen[0], &why);
        check_identical(merged, poisoned);
        su.poison = false;
    }
    if (kind == BACKEND_GPU) {
        su.amax_passes = false;
        su.eager = true;
        slots_run(text, &su, eager, &seen[0], &why);
        check_identical(merged, eager);
    }
    test_end();
}

// Current scaling: every producer serves (head's dgrad, a GEMM, does not); NVFP4 with RHT:
// eval and infer only (training stores RHT columnwise copies, whose amax is the transform's);
// NVFP4 without RHT: as current scaling; an moe layer in a residual block, whose own producers
// (gather, grouped activations, combine backward) are switched off too (the experts' stacked
// weights keep their passes after the optimizer either way).
static const producer_case producer_cases[] = {
    {"current_xent_fp32", NULL, "current", "", "softmax_xent", false, {{1, 0, 0}, {8, 4, 4}},
     false, {0, 0, 0}},
    {"current_mse_fp32", NULL, "current", "", "mse", false, {{1, 0, 0}, {8, 4, 4}},
     false, {0, 0, 0}},
    {"current_xent_u8", NULL, "current", "", "softmax_xent", true, {{1, 0, 0}, {8, 4, 4}},
     false, {0, 0, 0}},
    {"nvfp4_rht", NULL, "nvfp4", "", "softmax_xent", false, {{8, 0, 0}, {8, 4, 4}},
     false, {0, 0, 0}},
    {"nvfp4_no_rht", NULL, "nvfp4", "rule = linear.*@* -> nvfp4 rht=0", "softmax_xent", false,
     {{1, 0, 0}, {8, 4, 4}}, false, {0, 0, 0}},
    {"moe_current", "tests/recipes/synthetic_moe.recipe", "current", "", "", false,
     {{2, 0, 0}, {10, 4, 4}}, false, {0, 0, 0}},
    // The activation's output and its input gradient straight into the casts: current scaling
    // forward (y's amax, then the cast; in every program), delayed scaling forward and backward.
    {"current_act_cast", NULL, "current", "", "softmax_xent", false, {{1, 0, 0}, {8, 4, 4}},
     true, {2, 2, 2}},
    {"delayed_act_cast", NULL, "delayed", "", "softmax_xent", false, {{0, 0, 0}, {0, 0, 0}},
     true, {2, 1, 1}},
    // FP8 block scaling (1x128 activations and gradients) and MXFP8 (1 x 32 blocks; the copies
    // that BF16 GEMMs read as values): both ways, no amax anywhere.
    {"block_act_cast", NULL, "block", "", "softmax_xent", false, {{0, 0, 0}, {0, 0, 0}}, true,
     {2, 1, 1}},
    {"mxfp8_act_cast", NULL, "mxfp8", "", "softmax_xent", false, {{0, 0, 0}, {0, 0, 0}}, true,
     {2, 1, 1}},
};

// The gradient norm read group by group during the backward pass (model_build.c,
// mb_norm_ready) gives the trace of the norm in one pass after it, byte for byte, checksums of
// every persistent region after every train step included: with every parameter a group of its
// own (a launch beside the backward pass each, but the last), and with the usual groups (one
// launch for these small models). A launch placed before the last write of a gradient it reads
// would change the norm, the clip factor and every update after it. On the GPU the graph's
// streams run the launches beside the backward pass, and an eager run gives the same trace.
static void test_norm_groups(backend_kind kind, const producer_case *pc) {
    char name[96];
    const char *text = producer_test(kind, pc, "norm_during_backward_matches_one_pass", name,
                                     sizeof name);
    char one_pass[128], groups[128], usual[128], eager[128];
    trace_path(one_pass, sizeof one_pass, "norm_one_pass");
    trace_path(groups, sizeof groups, "norm_groups");
    trace_path(usual, sizeof usual, "norm_usual");
    trace_path(eager, sizeof eager, "norm_eager");
    slots_seen seen;
    const char *why = NULL;
    test_begin(name);
    slots_setup su = {kind, false, false, false, UINT64_MAX, pc->act_cast ? 1 : 0};
    if (!slots_run(text, &su, one_pass, &seen, &why)) {
        test_skip(name, why);
        return;
    }
    CHECK(seen.norm_ops >= 1 && seen.norm_beside == 0, "one pass: %u norm launches, %u beside",
          seen.norm_ops, seen.norm_beside);
    uint32_t one_pass_ops = seen.norm_ops;
    su.norm_group_elems = 1;
    slots_run(text, &su, groups, &seen, &why);
    check_identical(one_pass, groups);
    CHECK(seen.norm_ops >= 3 && seen.norm_beside == seen.norm_ops - 1,
          "groups of one parameter: %u norm launches, %u beside (expected all but the last)",
          seen.norm_ops, seen.norm_beside);
    su.norm_group_elems = 0;
    slots_run(text, &su, usual, &seen, &why);
    check_identical(one_pass, usual);
    CHECK(seen.norm_ops == one_pass_ops && seen.norm_beside == 0,
          "usual groups: %u norm launches, %u beside (expected %u, 0: the model is small)",
          seen.norm_ops, seen.norm_beside, one_pass_ops);
    if (kind == BACKEND_GPU) {
        su.norm_group_elems = 1;
        su.eager = true;
        slots_run(text, &su, eager, &seen, &why);
        check_identical(one_pass, eager);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU

static const char *const schemes[] = {"bf16", "delayed", "current", "mxfp8", "block", "nvfp4"};
#define SCHEMES_COUNT (sizeof schemes / sizeof schemes[0])

static void test_gpu_eager_graph(const char *path, const char *scheme, const char *label) {
    char name[80];
    snprintf(name, sizeof name, "gpu_eager_graph_serial_and_two_graph_runs_identical_%s", label);
    static char text[RECIPE_TEXT_MAX];
    recipe_text_for(path, scheme, text, sizeof text);
    char a[128], b[128], e[128], serial[128];
    trace_path(a, sizeof a, "graph_a");
    trace_path(b, sizeof b, "graph_b");
    trace_path(e, sizeof e, "eager");
    trace_path(serial, sizeof serial, "graph_serial");
    train_case c = {.name = "synthetic_tiny.recipe", .text = text, .kind = BACKEND_GPU};
    c.options.checksum_every = 25;
    c.options.trace_path = a;
    sched_summary sum;
    const char *why = NULL;
    test_begin(name);
    if (!train(&c, &sum, &why)) {
        test_skip(name, why);
        return;
    }
    c.options.trace_path = b;
    train(&c, &sum, &why);
    c.options.trace_path = e;
    c.options.eager = true;
    train(&c, &sum, &why);
    // Kernels that overlap the tail of the one ahead (compute capability 9.0) must give the bits
    // of plain stream order: a kernel that read before its griddepcontrol.wait would not. The
    // same run waits on each branch's last op (QTRAIN_CAPTURE_STREAM_WAITS), where the others
    // wait on the very ops they need: a wait aimed too early would show here too.
    setenv("QTRAIN_SERIAL_LAUNCH", "1", 1);
    setenv("QTRAIN_CAPTURE_STREAM_WAITS", "1", 1);
    c.options.trace_path = serial;
    c.options.eager = false;
    train(&c, &sum, &why);
    unsetenv("QTRAIN_SERIAL_LAUNCH");
    unsetenv("QTRAIN_CAPTURE_STREAM_WAITS");
    check_identical(a, b);
    check_identical(a, e);
    check_identical(a, serial);
    test_end();
}

static void test_gpu_no_sync(void) {
    const char *name = "gpu_step_loop_synchronizes_only_for_lagged_reads";
    static char text[RECIPE_TEXT_MAX];
    recipe_text_for("tests/recipes/synthetic_tiny.recipe", "nvfp4", text, sizeof text);
    train_case c = {.name = "synthetic_tiny.recipe", .text = text, .kind = BACKEND_GPU};
    c.options.checksum_every = 25;
    sched_summary sum;
    const char *why = NULL;
    test_begin(name);
    if (!train(&c, &sum, &why)) {
        test_skip(name, why);
        return;
    }
    uint64_t steps = sum.steps[0] + sum.steps[1] + sum.steps[2];
    // One event wait per step (its record, two steps later) and nothing else.
    CHECK(c.syncs == sum.lagged_reads, "%llu synchronizing calls, %llu lagged reads",
          (unsigned long long)c.syncs, (unsigned long long)sum.lagged_reads);
    CHECK(sum.lagged_reads == steps, "%llu lagged reads for %llu steps",
          (unsigned long long)sum.lagged_reads, (unsigned long long)steps);
    // The step times come from those reads: one interval per pair of consecutive train steps.
    CHECK(sum.step_time_count == sum.steps[MODEL_MODE_TRAIN] - 1, "%llu step intervals",
          (unsigned long long)sum.step_time_count);
    // One batch copy per step, queued beside the compute without a host wait.
    CHECK(sum.batch_copies == steps, "%llu batch copies for %llu steps",
          (unsigned long long)sum.batch_copies, (unsigned long long)steps);
    test_end();
}

// Batches of 256 x 4096 inputs (1 or 4 MiB) and hidden layers of 8192: a step computes about as
// long as the host takes to fill the next slot and the copy engine to move it, so steps and
// copies overlap and queue up. A step that did not wait for its copy, or a copy that overwrote a
// slot still being read, would put out another batch's bits; graphs and eager launches alike,
// and the two give the same bits.
static void test_gpu_stage(void) {
    static stage_log graphs;
    for (int i = 0; i < 8; i++) {
        static const char *const labels[8] = {
            "idx_graph",          "idx_eager",          "idx_resident_graph",
            "idx_resident_eager", "synthetic_graph",    "synthetic_eager",
            "synthetic_resident_graph", "synthetic_resident_eager"};
        bool eager = i % 2 == 1, resident = i % 4 >= 2;
        stage_setup su = {BACKEND_GPU, eager,      i < 4,     64,      8192,
                          256,         5 * 256 - 37, labels[i], resident};
        if (i % 4 == 0) graphs.steps = 0;  // graphs, eager, resident graphs and eager agree
        stage_case(&su, &graphs);
    }
}

static void memory_after_first_step(void *ctx, const sched_progress *p) {
    train_case *c = ctx;
    if (p->done != 1) return;
    size_t free_bytes = 0, total = 0;
    drv.cuMemGetInfo(&free_bytes, &total);
    c->free_bytes_first = (double)free_bytes;
}

static void test_gpu_memory_constant(void) {
    const char *name = "gpu_device_memory_constant_over_5000_steps";
    static char base[RECIPE_TEXT_MAX], text[RECIPE_TEXT_MAX];
    recipe_text_for("tests/recipes/synthetic_tiny.recipe", "mxfp8", base, sizeof base);
    const char *row = "train 200 cosine";
    const char *at = strstr(base, row);
    snprintf(text, sizeof text, "%.*strain 5000 cosine%s", (int)(at - base), base,
             at + strlen(row));
    // Lazy module loading may place kernel code on the first launches: the reference point is
    // the free memory after the first step's record came back.
    train_case c = {.name = "synthetic_tiny.recipe", .text = text, .kind = BACKEND_GPU,
                    .progress = memory_after_first_step};
    c.ctx = &c;
    c.options.checksum_every = 500;
    sched_summary sum;
    const char *why = NULL;
    if (test_sanitizer()) {
        test_skip(name, "under compute-sanitizer, whose own device allocations move the free "
                        "memory this case samples");
        return;
    }
    test_begin(name);
    if (!train(&c, &sum, &why)) {
        test_skip(name, why);
        return;
    }
    CHECK(sum.steps[MODEL_MODE_TRAIN] == 5000, "%llu train steps",
          (unsigned long long)sum.steps[MODEL_MODE_TRAIN]);
    CHECK(c.free_bytes_after == c.free_bytes_first, "free device memory %.0f after the first "
          "step, %.0f after the last (%.0f before the loop)", c.free_bytes_first,
          c.free_bytes_after, c.free_bytes_before);
    test_end();
}

// The bytes of every persistent weight region (quantized data and scales) of a bound run.
typedef struct weights_copy {
    uint32_t count;
    char names[64][ARENA_NAME_MAX];
    uint8_t *bytes[64];
    uint64_t sizes[64];
    float losses[32];
    uint32_t loss_count;
} weights_copy;

static void weights_read(run *r, backend *b, void *ctx) {
    weights_copy *w = ctx;
    for (uint32_t h = 0; h < r->dev.region_count && w->count < 64; h++) {
        const arena_region *reg = arena_region_get(&r->dev, h);
        if (!reg->persistent || reg->category != ARENA_CAT_WEIGHTS || reg->bytes == 0) continue;
        uint32_t i = w->count++;
        snprintf(w->names[i], ARENA_NAME_MAX, "%s", reg->name);
        w->sizes[i] = reg->bytes;
        w->bytes[i] = malloc(reg->bytes);
        if (backend_read(b, w->bytes[i], (prog_ref){&r->dev, h, 0}, reg->bytes) != QT_OK) {
            CHECK(false, "read %s: %s", reg->name, qt_error_message());
        }
    }
}

static void losses_record(void *ctx, const sched_progress *p) {
    weights_copy *w = ctx;
    if (p->mode == MODEL_MODE_TRAIN && w->loss_count < 32) {
        w->losses[w->loss_count++] = p->record->loss;
    }
}

static void weights_free(weights_copy *w) {
    for (uint32_t i = 0; i < w->count; i++) free(w->bytes[i]);
    memset(w, 0, sizeof *w);
}

static void test_gpu_vs_ref(const char *scheme) {
    char name[80];
    snprintf(name, sizeof name, "gpu_vs_ref_weights_after_step1_and_losses_%s", scheme);
    static char text[RECIPE_TEXT_MAX];
    recipe_text_for("tests/recipes/synthetic_tiny.recipe", scheme, text, sizeof text);
    static weights_copy gw, rw;
    train_case c = {.name = "synthetic_tiny.recipe", .text = text, .kind = BACKEND_GPU,
                    .inspect = weights_read, .ctx = &gw};
    c.options.steps_limit = 1;
    sched_summary sum;
    const char *why = NULL;
    test_begin(name);
    if (!train(&c, &sum, &why)) {
        test_skip(name, why);
        return;
    }
    c.kind = BACKEND_REF;
    c.ctx = &rw;
    train(&c, &sum, &why);
    // After one step the master moved by lr * m/(sqrt(v) + eps) = lr * g/(|g| + eps), which
    // does not depend on the GEMMs' accumulation order: the requantized weights must be equal.
    CHECK(gw.count == rw.count && gw.count > 0, "%u vs %u weight regions", gw.count, rw.count);
    for (uint32_t i = 0; i < gw.count && i < rw.count; i++) {
        uint64_t first = UINT64_MAX, diffs = 0;
        for (uint64_t j = 0; j < gw.sizes[i]; j++) {
            if (gw.bytes[i][j] == rw.bytes[i][j]) continue;
            if (first == UINT64_MAX) first = j;
            diffs++;
        }
        CHECK(diffs == 0, "%s: %llu bytes differ, first at %llu: gpu 0x%02x ref 0x%02x",
              gw.names[i], (unsigned long long)diffs, (unsigned long long)first,
              first == UINT64_MAX ? 0 : gw.bytes[i][first],
              first == UINT64_MAX ? 0 : rw.bytes[i][first]);
    }
    weights_free(&gw);
    weights_free(&rw);
    // Losses of the first 20 steps: the GEMMs differ only in FP32 accumulation order, and the
    // activations round to BF16 (relative step 2^-8); a flipped rounding moves a loss by far
    // less than 2% over 20 steps of a network this size, a wrong kernel by far more.
    c.inspect = NULL;
    c.progress = losses_record;
    c.options.steps_limit = 20;
    c.kind = BACKEND_GPU;
    c.ctx = &gw;
    train(&c, &sum, &why);
    c.kind = BACKEND_REF;
    c.ctx = &rw;
    train(&c, &sum, &why);
    CHECK(gw.loss_count == 20 && rw.loss_count == 20, "%u / %u losses", gw.loss_count,
          rw.loss_count);
    for (uint32_t i = 0; i < gw.loss_count && i < rw.loss_count; i++) {
        double d = fabs((double)gw.losses[i] - (double)rw.losses[i]);
        CHECK(d <= 0.02 * fabs((double)rw.losses[i]) + 1e-4,
              "step %u: loss gpu %.9g ref %.9g", i, (double)gw.losses[i],
              (double)rw.losses[i]);
    }
    test_end();
}

// The recipes whose steps have amax slots: current scaling (a producer's slot after each
// activation), NVFP4 (global amaxes of activations and gradients), the mixed custom recipe, and
// an moe layer's grouped NVFP4 expert inputs (a slot of one amax per expert).
static const char *const slot_cases[][3] = {
    {"tests/recipes/synthetic_tiny.recipe", "current", "current"},
    {"tests/recipes/synthetic_tiny.recipe", "nvfp4", "nvfp4"},
    {"tests/recipes/synthetic_custom.recipe", NULL, "custom"},
    {"tests/recipes/synthetic_moe.recipe", "nvfp4", "moe_nvfp4"},
};

int main(void) {
    if (!tmp_dir_make("train")) {
        printf("FAIL test_train: cannot create a temporary directory\n");
        return 1;
    }
    TEST_UNIT(test_bf16_converges());
    TEST_UNIT(test_layers_train());
    const char *tiny = "tests/recipes/synthetic_tiny.recipe";
    TEST_UNIT(test_two_runs("train_two_runs_identical_traces", tiny, "nvfp4", 50, 0, 0));
    TEST_UNIT(test_two_runs("train_two_runs_identical_traces", tiny, "delayed", 50, 0, 0));
    for (size_t i = 0; i < SCHEMES_COUNT; i++) {
        TEST_UNIT(test_two_runs("train_one_and_three_threads_identical",
                                "tests/recipes/synthetic_wide.recipe", schemes[i], 4, 1, 3));
    }
    TEST_UNIT(test_time_steps());
    TEST_UNIT(test_profile_refused_marks_apart());
    TEST_UNIT(test_emulated_paths(BACKEND_REF, "mxfp8"));
    TEST_UNIT(test_emulated_paths(BACKEND_REF, "nvfp4"));
    for (size_t i = 0; i < SCHEMES_COUNT; i++) {
        TEST_UNIT(test_interleave(tiny, schemes[i], NULL, schemes[i]));
    }
    // A one-step window makes the next scale the max of whatever entered history row 0, so an
    // eval cast that recorded its amax would show at once.
    TEST_UNIT(test_interleave(tiny, "delayed", "*.*@* -> delayed history=1 algo=most_recent",
                              "delayed_history1"));
    TEST_UNIT(test_interleave("tests/recipes/synthetic_custom.recipe", NULL, NULL, "custom_mixed"));
    TEST_UNIT(test_interleave("tests/recipes/synthetic_layers.recipe", NULL, NULL,
                              "layers_delayed"));
    TEST_UNIT(test_recompute(BACKEND_REF, tiny, "bf16", "layer = relu", "train.relu#1.y_again",
                             "tiny_bf16"));
    TEST_UNIT(test_recompute(BACKEND_REF, tiny, "current", "layer = relu",
                             "train.relu#1.y_again", "tiny_current"));
    TEST_UNIT(test_recompute(BACKEND_REF, "tests/recipes/synthetic_recompute.recipe", "bf16",
                             "layer = swiglu", "train.swiglu#4.y_again", "swiglu_bf16"));
    TEST_UNIT(test_recompute(BACKEND_REF, "tests/recipes/synthetic_recompute.recipe", "bf16",
                             "layer = gelu", "train.gelu#10.y_again", "gelu_bf16"));
    TEST_UNIT(test_norm_beside_capture("recipes/bench/resmlp_current.recipe", 1, false));
    TEST_UNIT(test_norm_beside_capture("recipes/bench/resmlp_current.recipe", 8, true));
    TEST_UNIT(test_norm_beside_capture("recipes/bench/swiglu_bf16.recipe", 4, true));
    TEST_UNIT(test_norm_beside_capture("recipes/bench/moe8_current.recipe", 0, false));
    TEST_UNIT(test_norm_beside_capture("recipes/bench/moe8_current.recipe", 2, true));
    TEST_UNIT(test_recompute_plan());
    TEST_UNIT(test_resident_plan());
    TEST_UNIT(test_step_times());
    TEST_UNIT(test_metrics_file());
    TEST_UNIT(test_failure_marks_apart());
    TEST_UNIT(test_plan_report());
    TEST_UNIT(test_refusals());
    TEST_UNIT(test_cli());
    TEST_UNIT(test_usage_union());
    TEST_UNIT(test_weight_transpose(BACKEND_REF, "current"));
    TEST_UNIT(test_weight_transpose(BACKEND_REF, "delayed"));
    TEST_UNIT(test_weight_transpose(BACKEND_REF, "block"));
    TEST_UNIT(test_weight_transpose(BACKEND_REF, "current_mxfp8_grads"));
    TEST_UNIT(test_weight_transpose(BACKEND_REF, "block_mxfp8_grads"));
    TEST_UNIT(test_weight_transpose(BACKEND_REF, "mxfp8"));
    TEST_UNIT(test_stage_ref());
    TEST_UNIT(test_resident_traces(BACKEND_REF));
    for (size_t i = 0; i < sizeof slot_cases / sizeof slot_cases[0]; i++) {
        TEST_UNIT(test_amax_slots(BACKEND_REF, slot_cases[i][0], slot_cases[i][1],
                                  slot_cases[i][2]));
    }
    for (size_t i = 0; i < sizeof producer_cases / sizeof producer_cases[0]; i++) {
        TEST_UNIT(test_producer_amax(BACKEND_REF, &producer_cases[i]));
    }
    for (size_t i = 0; i < sizeof producer_cases / sizeof producer_cases[0]; i++) {
        TEST_UNIT(test_norm_groups(BACKEND_REF, &producer_cases[i]));
    }
    for (size_t i = 0; i < SCHEMES_COUNT; i++) {
        TEST_UNIT(test_gpu_eager_graph("tests/recipes/synthetic_tiny.recipe", schemes[i],
                                       schemes[i]));
    }
    TEST_UNIT(test_gpu_eager_graph("tests/recipes/synthetic_custom.recipe", NULL, "custom_mixed"));
    TEST_UNIT(test_emulated_paths(BACKEND_GPU, "mxfp8"));
    TEST_UNIT(test_emulated_paths(BACKEND_GPU, "nvfp4"));
    TEST_UNIT(test_recompute(BACKEND_GPU, tiny, "bf16", "layer = relu", "train.relu#1.y_again",
                             "tiny_bf16"));
    TEST_UNIT(test_recompute(BACKEND_GPU, "tests/recipes/synthetic_recompute.recipe", "bf16",
                             "layer = gelu", "train.gelu#10.y_again", "gelu_bf16"));
    TEST_UNIT(test_gpu_no_sync());
    TEST_UNIT(test_gpu_stage());
    TEST_UNIT(test_resident_traces(BACKEND_GPU));
    TEST_UNIT(test_gpu_memory_constant());
    TEST_UNIT(test_weight_transpose(BACKEND_GPU, "current"));
    TEST_UNIT(test_weight_transpose(BACKEND_GPU, "delayed"));
    TEST_UNIT(test_weight_transpose(BACKEND_GPU, "block"));
    TEST_UNIT(test_weight_transpose(BACKEND_GPU, "mxfp8"));
    TEST_UNIT(test_weight_transpose(BACKEND_GPU, "current_mxfp8_grads"));
    for (size_t i = 0; i < SCHEMES_COUNT; i++) TEST_UNIT(test_gpu_vs_ref(schemes[i]));
    for (size_t i = 0; i < sizeof slot_cases / sizeof slot_cases[0]; i++) {
        TEST_UNIT(test_amax_slots(BACKEND_GPU, slot_cases[i][0], slot_cases[i][1],
                                  slot_cases[i][2]));
    }
    for (size_t i = 0; i < sizeof producer_cases / sizeof producer_cases[0]; i++) {
        TEST_UNIT(test_producer_amax(BACKEND_GPU, &producer_cases[i]));
    }
    for (size_t i = 0; i < sizeof producer_cases / sizeof producer_cases[0]; i++) {
        TEST_UNIT(test_norm_groups(BACKEND_GPU, &producer_cases[i]));
    }
    tmp_dir_remove();
    return test_exit_code();
}
