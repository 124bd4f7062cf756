// Faults survived: a NaN or an infinity planted in a weight gradient at a chosen train step
// (run_options.inject, `qtrain run --inject-nonfinite`) makes the optimizer skip that step, and
// the skipped step leaves every persistent region of the device arena bit-identical (weights in
// every usage, masters, moments, the counted steps, the delayed-scaling histories and scales),
// with every scheme: the region bytes are read back before and after it, and the trace's
// checksums of the two steps are equal; the next step trains again. With a GPU the same runs
// replay their graphs, skip the same step and keep the reference backend's losses.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/driver/driver.h"  // drv
#include "tests/files.h"            // tmp_dir_make, tmp_path, file_read, command_output
#include "tests/plan.h"             // test_run_plan
#include "runtime/run/run.h"
#include "tests/test.h"

static run the_run;
static recipe the_recipe;

static const char *const formats[] = {"bf16", "delayed", "current", "mxfp8", "block", "nvfp4"};
#define FORMATS (sizeof formats / sizeof formats[0])

#define INJECT_STEP 4  // the trace's step that gets the fault
#define TRAIN_STEPS 8

static const char *recipe_for(const char *format) {
    static char text[2048];
    snprintf(text, sizeof text,
             "[model]\ninput = 48\nlayer = linear fc1 64 bias\nlayer = gelu\n"
             "layer = rmsnorm\nlayer = linear fc2 32\nlayer = relu\nlayer = linear head 4\n"
             "loss = softmax_xent\n[quant]\nrecipe = %s\n[optim]\nadamw lr=1e-2 clip=1.0\n"
             "[data]\ntrain = synthetic classes inputs=48 classes=4 samples=256 seed=5\n"
             "eval = synthetic classes inputs=48 classes=4 samples=64 seed=5\nbatch = 32\n"
             "[schedule]\ntrain %d\neval 2\ninfer 1\n",
             format, TRAIN_STEPS);
    return text;
}

// Every persistent device region but the staging ones (the step counter and the batch slots,
// which move every step by design), concatenated; *bytes gets the total.
static uint8_t *read_state(run *r, uint64_t *bytes) {
    const arena *dev = &r->dev;
    uint64_t total = 0;
    for (uint32_t h = 0; h < dev->region_count; h++) {
        const arena_region *g = arena_region_get(dev, h);
        if (g->persistent && g->category != ARENA_CAT_STAGING) total += g->bytes;
    }
    uint8_t *out = malloc(total ? total : 1), *at = out;
    for (uint32_t h = 0; h < dev->region_count; h++) {
        const arena_region *g = arena_region_get(dev, h);
        if (!g->persistent || g->category == ARENA_CAT_STAGING) continue;
        qt_status s = backend_read(r->backend, at, (prog_ref){&r->dev, h, 0}, g->bytes);
        CHECK(s == QT_OK, "read %s: %s", g->name, qt_error_message());
        at += g->bytes;
    }
    *bytes = total;
    return out;
}

// The first region whose bytes differ between two read_state snapshots, or NULL.
static const char *state_difference(run *r, const uint8_t *a, const uint8_t *b) {
    const arena *dev = &r->dev;
    uint64_t at = 0;
    for (uint32_t h = 0; h < dev->region_count; h++) {
        const arena_region *g = arena_region_get(dev, h);
        if (!g->persistent || g->category == ARENA_CAT_STAGING) continue;
        if (memcmp(a + at, b + at, g->bytes) != 0) return g->name;
        at += g->bytes;
    }
    return NULL;
}

// One run with the fault: stopped after the step before it, after it and after the next one,
// the state read back each time, then run to the end. Returns the status of the run.
typedef struct fault_result {
    uint8_t *state[3];
    uint64_t bytes;
    const char *skip_changed;  // a region the skipped step changed, or NULL
    bool next_trained;         // the step after it changed the state
    uint64_t skipped;          // the summaries' skipped steps, over the run's four pieces
} fault_result;

// groups: run_options.norm_group_elems (1: the norm reads every parameter's gradient in a launch
// of its own during the backward pass, so the fault must land before its own launch).
static qt_status fault_run(backend *b, const char *format, const char *layer, uint32_t bits,
                           uint64_t groups, const char *trace, fault_result *out) {
    const char *text = recipe_for(format);
    run_options o;
    memset(&o, 0, sizeof o);
    o.checksum_every = 1;
    o.trace_path = trace;
    o.replace_outputs = true;
    o.inject = (run_inject){true, INJECT_STEP, layer, bits};
    o.norm_group_elems = groups;
    QT_TRY(recipe_parse(text, strlen(text), "faults.recipe", &the_recipe));
    QT_TRY(test_run_plan(&the_run, &the_recipe, text, strlen(text), &o));
    uint64_t dev_bytes = 0, host_bytes = 0;
    run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
    bool ref = b->kind == BACKEND_REF;
    void *dev = ref ? aligned_alloc(256, (dev_bytes + 511) / 256 * 256) : NULL;
    void *host = ref ? aligned_alloc(256, (host_bytes + 511) / 256 * 256) : NULL;
    void *data = aligned_alloc(256, (run_data_bytes(&the_run) + 511) / 256 * 256);
    qt_status s = run_load(&the_run, data, run_data_bytes(&the_run));
    if (s == QT_OK) s = run_bind(&the_run, b, dev, host);
    sched_summary sum;
    for (int k = 0; k < 3 && s == QT_OK; k++) {
        the_run.options.stop_at = INJECT_STEP + (uint64_t)k;  // steps done in all
        s = run_execute(&the_run, NULL, NULL, &sum);
        out->skipped += sum.skipped;
        if (s == QT_OK) out->state[k] = read_state(&the_run, &out->bytes);
    }
    if (s == QT_OK) {
        out->skip_changed = state_difference(&the_run, out->state[0], out->state[1]);
        out->next_trained = state_difference(&the_run, out->state[1], out->state[2]) != NULL;
        the_run.options.stop_at = 0;
        s = run_execute(&the_run, NULL, NULL, &sum);
        out->skipped += sum.skipped;
    }
    run_close(&the_run);
    free(dev), free(host), free(data);
    return s;
}

static void fault_free(fault_result *f) {
    for (int k = 0; k < 3; k++) free(f->state[k]);
    memset(f, 0, sizeof *f);
}

// The trace's train records: the skipped flag at the fault's step alone, its checksum equal to
// the step before's, the next one's not.
static void check_trace(const char *path, const char *what) {
    static trace_reader reader;
    static qt_trace_record rec;
    uint64_t checksum[TRAIN_STEPS] = {0};
    uint32_t skipped = 0, train = 0;
    bool have = trace_reader_open(&reader, path) == QT_OK;
    CHECK(have, "%s: %s", what, qt_error_message());
    while (have && trace_reader_next(&reader, &rec, &have) == QT_OK && have) {
        if (rec.mode != QT_TRACE_MODE_TRAIN) continue;
        train++;
        if (rec.step < TRAIN_STEPS) checksum[rec.step] = rec.checksum;
        bool skip = (rec.flags & QT_TRACE_FLAG_SKIPPED) != 0;
        skipped += skip;
        CHECK(skip == (rec.step == INJECT_STEP), "%s: step %llu skipped %d", what,
              (unsigned long long)rec.step, skip);
    }
    trace_reader_close(&reader);
    CHECK(train == TRAIN_STEPS && skipped == 1, "%s: %u train records, %u skipped", what, train,
          skipped);
    CHECK(checksum[INJECT_STEP] == checksum[INJECT_STEP - 1] &&
              checksum[INJECT_STEP + 1] != checksum[INJECT_STEP],
          "%s: checksums %016llx %016llx %016llx around the skipped step", what,
          (unsigned long long)checksum[INJECT_STEP - 1],
          (unsigned long long)checksum[INJECT_STEP], (unsigned long long)checksum[INJECT_STEP + 1]);
}

// The fault's value and layer alternate over the cases, so every scheme meets a NaN and an
// infinity, in the first layer (whose input gradient is not computed) and in a later one; the
// fault in fc2 meets the norm's groups of one parameter, read during the backward pass.
static const struct {
    uint32_t bits;
    const char *layer;
    const char *name;
    uint64_t groups;  // run_options.norm_group_elems
} faults[] = {{0x7FC00000u, "fc1", "nan", 0}, {0x7F800000u, "fc2", "inf", 1},
              {0xFF800000u, NULL, "-inf", 1}};
#define FAULTS (sizeof faults / sizeof faults[0])

static void check_result(const fault_result *f, const char *what) {
    CHECK(f->skip_changed == NULL, "%s: the skipped step changed region '%s'", what,
          f->skip_changed);
    CHECK(f->next_trained, "%s: the step after the skipped one changed nothing", what);
    CHECK(f->skipped == 1, "%s: the summaries count %llu skipped steps", what,
          (unsigned long long)f->skipped);
}

// Fault k in format i on backend b, its trace into `trace`: the run, its state and its trace
// checked. Returns whether the run went through (its trace is then complete).
static bool fault_case(backend *b, size_t i, size_t k, const char *trace, const char *what) {
    fault_result f = {0};
    qt_status s = fault_run(b, formats[i], faults[k].layer, faults[k].bits, faults[k].groups,
                            tmp_path(trace), &f);
    CHECK(s == QT_OK, "%s: %s", what, qt_error_message());
    if (s == QT_OK) {
        check_result(&f, what);
        check_trace(tmp_path(trace), what);
    }
    fault_free(&f);
    return s == QT_OK;
}

static void test_ref(void) {
    static backend b;
    backend_open_ref(&b);
    for (size_t i = 0; i < FORMATS; i++) {
        char name[96];
        snprintf(name, sizeof name, "nonfinite_gradient_skipped_state_unchanged_%s", formats[i]);
        test_begin(name);
        for (size_t k = 0; k < FAULTS; k++) {
            char what[64], trace[64];
            snprintf(what, sizeof what, "%s, %s in %s", formats[i], faults[k].name,
                     faults[k].layer ? faults[k].layer : "the first layer");
            snprintf(trace, sizeof trace, "ref_%s_%zu.trace", formats[i], k);
            fault_case(&b, i, k, trace, what);
        }
        test_end();
    }
    backend_close(&b);
}

// The GPU's train records against the reference backend's: the same steps, the same one skipped,
// and losses within 2% (the backends' GEMMs accumulate in different orders, so the traces are not
// byte-equal past the first step; the bound is test_train's, which a wrong kernel exceeds by far).
static void check_against_ref(const char *gpu_path, const char *ref_path, const char *what) {
    static trace_reader gpu, ref;
    static qt_trace_record g, r;
    bool open_g = trace_reader_open(&gpu, gpu_path) == QT_OK;
    bool open_r = open_g && trace_reader_open(&ref, ref_path) == QT_OK;
    CHECK(open_g && open_r, "%s: %s", what, qt_error_message());
    bool have_g = open_g && open_r, have_r = have_g;
    uint32_t compared = 0;
    while (have_g && have_r) {
        if (trace_reader_next(&gpu, &g, &have_g) != QT_OK ||
            trace_reader_next(&ref, &r, &have_r) != QT_OK || have_g != have_r) {
            CHECK(false, "%s: the traces have different record counts", what);
            break;
        }
        if (!have_g) break;
        CHECK(g.step == r.step && g.mode == r.mode && g.flags == r.flags,
              "%s: record %u: step %llu mode %u flags %u on the GPU, %llu %u %u on the reference",
              what, compared, (unsigned long long)g.step, g.mode, g.flags,
              (unsigned long long)r.step, r.mode, r.flags);
        double d = fabs((double)g.loss - (double)r.loss);
        CHECK(d <= 0.02 * fabs((double)r.loss) + 1e-4, "%s: step %llu: loss gpu %.9g ref %.9g",
              what, (unsigned long long)g.step, (double)g.loss, (double)r.loss);
        compared++;
    }
    if (open_r) trace_reader_close(&ref);
    if (open_g) trace_reader_close(&gpu);
    CHECK(compared > TRAIN_STEPS, "%s: %u records compared", what, compared);
}

static void test_gpu(void) {
    static backend b;
    if (backend_open_gpu(&b, 0) != QT_OK) {
        test_skip("gpu_nonfinite_gradient_skipped_every_format", qt_error_message());
        backend_close(&b);
        return;
    }
    test_begin("gpu_nonfinite_gradient_skipped_every_format");
    for (size_t i = 0; i < FORMATS; i++) {
        for (size_t k = 0; k < FAULTS; k++) {
            char what[64], trace[64], ref_trace[64];
            snprintf(what, sizeof what, "gpu %s, %s", formats[i], faults[k].name);
            snprintf(trace, sizeof trace, "gpu_%s_%zu.trace", formats[i], k);
            snprintf(ref_trace, sizeof ref_trace, "ref_%s_%zu.trace", formats[i], k);
            if (fault_case(&b, i, k, trace, what)) {
                check_against_ref(tmp_path(trace), tmp_path(ref_trace), what);
            }
        }
    }
    backend_close(&b);
    test_end();
}

// The CLI's flag: the summary counts the skipped step, the trace holds it, and a step that is
// not a train step or a layer the model lacks is refused before the run.
static void test_cli(void) {
    test_begin("cli_inject_nonfinite");
    static char out[16384], cmd[1024];
    const char *path = tmp_path("cli.recipe");
    const char *text = recipe_for("delayed");
    file_write(path, text, strlen(text));
    snprintf(cmd, sizeof cmd, "build/qtrain run %s --ref --checksum-every 1 --trace %s "
             "--inject-nonfinite 3:fc2=inf", path, tmp_path("cli.trace"));
    int rc = command_output(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "8 train (1 skipped)"), "exit %d: %s", rc, out);
    size_t n = 0;
    char *trace = file_read(tmp_path("cli.trace"), &n);
    CHECK(trace && strstr(trace, "step=3 mode=train flags=0x3:skipped,checksum"), "trace");
    free(trace);
    snprintf(cmd, sizeof cmd, "build/qtrain run %s --ref --inject-nonfinite 9", path);
    rc = command_output(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "step 9 is an eval step (row 1 of the schedule); expected a "
                                 "train step"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "build/qtrain run %s --ref --inject-nonfinite 2:fc9", path);
    rc = command_output(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "no linear layer 'fc9'; name one of its linear layers (fc1, "
                                 "fc2, head)"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "build/qtrain run %s --ref --inject-nonfinite 2=zero", path);
    rc = command_output(cmd, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--inject-nonfinite takes STEP[:LAYER][=nan|inf|-inf]"),
          "exit %d: %s", rc, out);
    test_end();
}

int main(void) {
    if (!tmp_dir_make("faults")) {
        printf("FAIL faults: cannot make a temporary folder\n");
        return 1;
    }
    test_ref();
    test_gpu();
    test_cli();
    tmp_dir_remove();
    return test_exit_code();
}
