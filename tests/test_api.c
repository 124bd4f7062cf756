// The public API (runtime/qtrain.h) as an embedder uses it: the lifecycle and its refusals, the
// plan's queries, the schedule run whole or step by step (the same trace), several runtimes at
// once with their steps interleaved (each trace as when it runs alone), batches pushed or given
// by a callback (the same trace either way), inference on a caller's batch (the infer row's
// outputs), checkpoints saved and resumed through the API; with a GPU, arenas given by the
// caller against the driver's, and steps against the whole run.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/qtrain.h"

#include "runtime/driver/driver.h"  // drv: device memory the GPU cases give as an arena
#include "tests/files.h"            // tmp_dir_make, tmp_path, file_read
#include "tests/npy_save.h"         // npy_save
#include "tests/test.h"

// ---------------------------------------------------------------------------------------------
// A runtime with everything it needs, in memory of the test's own

typedef struct session {
    void *runtime_memory, *device_memory, *tables, *data, *arena_device, *arena_host;
    qt_runtime *rt;
    qt_device *device;
    bool gpu_arenas_given;  // GPU: the test gives both arenas (else the driver allocates them)
    CUdeviceptr given_device;
} session;

static void *memory(uint64_t bytes) {
    uint64_t rounded = (bytes + QT_MEMORY_ALIGN - 1) / QT_MEMORY_ALIGN * QT_MEMORY_ALIGN;
    return aligned_alloc(QT_MEMORY_ALIGN, rounded ? rounded : QT_MEMORY_ALIGN);
}

static qt_status session_arenas(session *s, const qt_plan_info *info, qt_arenas *arenas) {
    memset(arenas, 0, sizeof *arenas);
    qt_device_info d;
    qt_device_describe(s->device, &d);
    if (d.gpu && !s->gpu_arenas_given) return QT_OK;
    arenas->device_bytes = info->device_bytes;
    arenas->host_bytes = info->host_bytes;
    s->arena_host = memory(info->host_bytes);
    arenas->host = s->arena_host;
    if (d.gpu) {
        if (drv.cuMemAlloc(&s->given_device, info->device_bytes) != CUDA_SUCCESS) {
            return qt_fail(QT_ERR_DRIVER, "the test's cuMemAlloc failed");
        }
        arenas->device = (void *)(uintptr_t)s->given_device;
    } else {
        s->arena_device = memory(info->device_bytes);
        arenas->device = s->arena_device;
    }
    return QT_OK;
}

// Opens (a recipe file when path is set, else text), plans, loads and binds on a new device.
static qt_status session_open(session *s, const char *path, const char *text,
                              const qt_options *o, qt_device_kind kind) {
    s->runtime_memory = memory(qt_runtime_bytes());
    s->device_memory = memory(qt_device_bytes());
    QT_TRY(qt_device_open(s->device_memory, qt_device_bytes(), kind, 0, &s->device));
    if (path) {
        QT_TRY(qt_open_file(s->runtime_memory, qt_runtime_bytes(), path, &s->rt));
    } else {
        QT_TRY(qt_open_text(s->runtime_memory, qt_runtime_bytes(), text, strlen(text),
                            "embedded.recipe", &s->rt));
    }
    uint64_t table_bytes = 0;
    QT_TRY(qt_measure(s->rt, o, &table_bytes));
    s->tables = memory(table_bytes);
    QT_TRY(qt_plan(s->rt, s->tables, table_bytes));
    qt_plan_info info;
    QT_TRY(qt_plan_info_get(s->rt, &info));
    s->data = info.data_bytes ? memory(info.data_bytes) : NULL;
    QT_TRY(qt_load(s->rt, s->data, info.data_bytes));
    qt_arenas arenas;
    QT_TRY(session_arenas(s, &info, &arenas));
    return qt_bind(s->rt, s->device, &arenas);
}

static void session_close(session *s) {
    qt_status ended = qt_close(s->rt);
    CHECK(ended == QT_OK, "qt_close: %s", qt_error_message());
    // Before the device closes: its context (the allocation's) may end with it.
    if (s->given_device) drv.cuMemFree(s->given_device);
    qt_status closed = qt_device_close(s->device);
    CHECK(closed == QT_OK, "qt_device_close: %s", qt_error_message());
    free(s->runtime_memory);
    free(s->device_memory);
    free(s->tables);
    free(s->data);
    free(s->arena_device);
    free(s->arena_host);
    memset(s, 0, sizeof *s);
}

static bool session_ok(qt_status status, const char *what) {
    CHECK(status == QT_OK, "%s: %s: %s", what, qt_status_name(status), qt_error_message());
    return status == QT_OK;
}

static bool same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = file_read(a, &na), *y = file_read(b, &nb);
    bool same = x && y && na == nb && na > 0 && memcmp(x, y, na) == 0;
    if (!same) {
        bool identical = false;
        qt_trace_diff(a, b, stdout, &identical);
    }
    free(x);
    free(y);
    return same;
}

static qt_options trace_options(const char *trace) {
    qt_options o;
    memset(&o, 0, sizeof o);
    o.trace_path = trace;
    o.checksum_every = 10;
    return o;
}

// The whole schedule of a recipe file in one qt_run, into `trace`.
static bool run_alone(const char *path, const char *trace, qt_device_kind kind) {
    session s = {0};
    qt_options o = trace_options(trace);
    bool ok = session_ok(session_open(&s, path, NULL, &o, kind), path);
    qt_summary sum;
    if (ok) ok = session_ok(qt_run(s.rt, &sum), "qt_run");
    session_close(&s);
    return ok;
}

// Whether a GPU device opens (else *why says why not).
static bool gpu_available(const char **why) {
    void *m = memory(qt_device_bytes());
    qt_device *d = NULL;
    bool ok = qt_device_open(m, qt_device_bytes(), QT_DEVICE_GPU, 0, &d) == QT_OK;
    *why = qt_error_message();
    if (ok) qt_device_close(d);
    free(m);
    return ok;
}

#define TINY "tests/recipes/synthetic_tiny.recipe"
#define SMALL "tests/recipes/synthetic_bf16.recipe"

// ---------------------------------------------------------------------------------------------
// The lifecycle

static void test_lifecycle_refusals(void) {
    test_begin("api_calls_out_of_order_are_refused_with_a_status");
    char *rt_memory = memory(qt_runtime_bytes());
    char *dev_memory = memory(qt_device_bytes());
    qt_runtime *rt = NULL;
    qt_device *dev = NULL;
    CHECK(qt_open_file(rt_memory + 8, qt_runtime_bytes(), TINY, &rt) == QT_ERR_MEMORY &&
              strstr(qt_error_message(), "multiple of 256"), "misaligned: %s",
          qt_error_message());
    CHECK(qt_open_file(rt_memory, 1024, TINY, &rt) == QT_ERR_MEMORY, "too small");
    CHECK(qt_open_file(rt_memory, qt_runtime_bytes(), "tests/recipes/none.recipe", &rt) ==
              QT_ERR_IO && rt == NULL, "missing file: %s", qt_error_message());
    CHECK(qt_open_text(rt_memory, qt_runtime_bytes(), "[model]\n", 8, "bad", &rt) ==
              QT_ERR_INPUT && strncmp(qt_error_message(), "bad:", 4) == 0,
          "bad text: %s", qt_error_message());
    qt_step_stats st;
    CHECK(qt_step(NULL, &st) == QT_ERR_STATE, "a NULL runtime");
    if (session_ok(qt_open_file(rt_memory, qt_runtime_bytes(), TINY, &rt), "open")) {
        CHECK(qt_load(rt, NULL, 0) == QT_ERR_STATE && strstr(qt_error_message(), "qt_measure"),
              "load before measure: %s", qt_error_message());
        CHECK(qt_run(rt, NULL) == QT_ERR_STATE, "run before bind");
        uint64_t table_bytes = 0;
        session_ok(qt_measure(rt, NULL, &table_bytes), "measure");
        char *tables = memory(table_bytes);
        CHECK(table_bytes > 0 && qt_plan(rt, tables, table_bytes - 1) == QT_ERR_MEMORY,
              "tables of %llu bytes less one", (unsigned long long)table_bytes);
        session_ok(qt_plan(rt, tables, table_bytes), "plan");
        CHECK(qt_plan(rt, tables, table_bytes) == QT_ERR_STATE, "plan twice");
        CHECK(qt_measure(rt, NULL, &table_bytes) == QT_ERR_STATE, "measure after the plan");
        CHECK(qt_step(rt, &st) == QT_ERR_STATE && strstr(qt_error_message(), "qt_load"),
              "step before load: %s", qt_error_message());
        qt_plan_info info;
        session_ok(qt_plan_info_get(rt, &info), "info");
        char *data = memory(info.data_bytes);
        CHECK(qt_load(rt, data + 16, info.data_bytes) == QT_ERR_MEMORY, "misaligned data");
        session_ok(qt_load(rt, data, info.data_bytes), "load");
        session_ok(qt_device_open(dev_memory, qt_device_bytes(), QT_DEVICE_REFERENCE, 0, &dev),
                   "device");
        CHECK(qt_bind(rt, dev, NULL) == QT_ERR_MEMORY &&
                  strstr(qt_error_message(), "reference backend needs"),
              "reference arenas are the caller's: %s", qt_error_message());
        char *a = memory(info.device_bytes), *h = memory(info.host_bytes);
        qt_arenas arenas = {a, info.device_bytes, h, info.host_bytes};
        session_ok(qt_bind(rt, dev, &arenas), "bind after a refused bind");
        CHECK(qt_device_close(dev) == QT_ERR_STATE, "a bound device stays open");
        CHECK(qt_resume(rt, "x.ckpt") == QT_ERR_STATE &&
                  strstr(qt_error_message(), "checkpoints"), "resume unplanned: %s",
              qt_error_message());
        CHECK(qt_step_mode(rt, QT_MODE_INFER, &st) == QT_ERR_STATE &&
                  strstr(qt_error_message(), "options.modes"), "no infer program: %s",
              qt_error_message());
        CHECK(qt_last_step(rt, &st) == QT_ERR_STATE, "no step yet");
        session_ok(qt_step(rt, &st), "a step");
        CHECK(st.step == 0 && st.mode == QT_MODE_TRAIN && st.in_schedule && st.row_step == 1,
              "first step: %llu %d", (unsigned long long)st.step, (int)st.mode);
        qt_close(rt);
        CHECK(qt_step(rt, &st) == QT_ERR_STATE, "closed");
        session_ok(qt_device_close(dev), "device close after the runtime's");
        free(data);
        free(a);
        free(h);
        free(tables);
    }
    free(rt_memory);
    free(dev_memory);
    test_end();
}

static void test_plan_queries(void) {
    test_begin("api_plan_info_regions_and_report");
    char *rt_memory = memory(qt_runtime_bytes()), *tables = NULL;
    qt_runtime *rt = NULL;
    uint64_t table_bytes = 0;
    if (session_ok(qt_open_file(rt_memory, qt_runtime_bytes(), SMALL, &rt), "open") &&
        session_ok(qt_measure(rt, NULL, &table_bytes), "measure") &&
        session_ok(qt_plan(rt, tables = memory(table_bytes), table_bytes), "plan")) {
        qt_plan_info info;
        session_ok(qt_plan_info_get(rt, &info), "info");
        CHECK(info.batch == 32 && info.input_features == 32 && info.outputs == 4 &&
                  info.classification && info.inputs == QT_INPUTS_F32 && info.train_source &&
                  info.eval_source && info.modes[QT_MODE_TRAIN] && info.modes[QT_MODE_EVAL] &&
                  !info.modes[QT_MODE_INFER] && info.steps[QT_MODE_TRAIN] == 200 &&
                  info.steps[QT_MODE_EVAL] == 16 && info.rows == 4,
              "info: batch %u, features %u, outputs %u, rows %u", info.batch,
              info.input_features, info.outputs, info.rows);
        for (int a = 0; a < 2; a++) {
            uint32_t n = a == 0 ? info.device_regions : info.host_regions;
            uint64_t total = a == 0 ? info.device_bytes : info.host_bytes, persistent = 0;
            for (uint32_t i = 0; i < n; i++) {
                qt_region r;
                session_ok(qt_plan_region(rt, (qt_arena)a, i, &r), "region");
                CHECK(r.name && r.name[0] && r.category && r.offset + r.bytes <= total,
                      "region %u of arena %d: %s at %llu + %llu of %llu", i, a,
                      r.name ? r.name : "?", (unsigned long long)r.offset,
                      (unsigned long long)r.bytes, (unsigned long long)total);
                persistent += r.persistent ? r.bytes : 0;
            }
            CHECK(n > 0 && persistent <= total, "arena %d: %u regions", a, n);
            qt_region r;
            CHECK(qt_plan_region(rt, (qt_arena)a, n, &r) == QT_ERR_INPUT, "past the end");
        }
        CHECK(info.device_lower_bound <= info.device_bytes && info.data_bytes > 0,
              "lower bound %llu, total %llu", (unsigned long long)info.device_lower_bound,
              (unsigned long long)info.device_bytes);
        char *report = NULL;
        size_t report_bytes = 0;
        FILE *out = open_memstream(&report, &report_bytes);
        session_ok(qt_plan_print(rt, out), "print");
        fclose(out);
        CHECK(report && strstr(report, "program train") && strstr(report, "lr row 1"),
              "the plan report");
        free(report);
        qt_close(rt);
    }
    free(rt_memory);
    free(tables);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Whole runs, steps, several runtimes

static void test_steps_match_run(qt_device_kind kind, const char *name) {
    char whole[160], stepped[160];
    snprintf(whole, sizeof whole, "%s", tmp_path("whole.trace"));
    snprintf(stepped, sizeof stepped, "%s", tmp_path("stepped.trace"));
    session s = {0};
    qt_options o = trace_options(stepped);
    const char *why = NULL;
    if (kind == QT_DEVICE_GPU && !gpu_available(&why)) {
        test_skip(name, why);
        return;
    }
    test_begin(name);
    run_alone(SMALL, whole, kind);
    if (session_ok(session_open(&s, SMALL, NULL, &o, kind), "open")) {
        qt_position at;
        uint64_t steps = 0;
        qt_step_stats st;
        if (kind == QT_DEVICE_REFERENCE) {  // timing steps leaves the run as it was
            qt_plan_info info;
            qt_plan_info_get(s.rt, &info);
            uint64_t bytes = info.device_bytes + info.host_bytes;
            void *scratch = memory(bytes);
            double ms[QT_MODE_COUNT];
            CHECK(qt_time_steps(s.rt, scratch, bytes - 1, ms) == QT_ERR_MEMORY, "short scratch");
            session_ok(qt_time_steps(s.rt, scratch, bytes, ms), "qt_time_steps");
            CHECK(ms[QT_MODE_TRAIN] > 0 && ms[QT_MODE_EVAL] > 0 && ms[QT_MODE_INFER] == 0,
                  "step times %g %g %g ms", ms[0], ms[1], ms[2]);
            free(scratch);
        }
        while (qt_position_get(s.rt, &at) == QT_OK && !at.done) {
            if (!session_ok(qt_step(s.rt, &st), "qt_step")) break;
            CHECK(st.step == steps, "step %llu reported as %llu", (unsigned long long)steps,
                  (unsigned long long)st.step);
            steps++;
        }
        CHECK(steps == 216 && at.has_eval && at.eval_samples == 256, "%llu steps; eval %d",
              (unsigned long long)steps, at.has_eval);
        CHECK(qt_step(s.rt, &st) == QT_ERR_STATE && strstr(qt_error_message(), "complete"),
              "a step past the end: %s", qt_error_message());
    }
    session_close(&s);
    CHECK(same_file(whole, stepped), "qt_step's trace differs from qt_run's");
    test_end();
}

// Runtimes whose steps interleave, each with its own device: A and B are one recipe, C another.
static void test_interleaved_runtimes(void) {
    test_begin("api_three_runtimes_interleaved_each_trace_as_alone");
    char alone_tiny[160], alone_small[160], t[3][160];
    snprintf(alone_tiny, sizeof alone_tiny, "%s", tmp_path("alone_tiny.trace"));
    snprintf(alone_small, sizeof alone_small, "%s", tmp_path("alone_small.trace"));
    bool ok = run_alone(TINY, alone_tiny, QT_DEVICE_REFERENCE) &&
              run_alone(SMALL, alone_small, QT_DEVICE_REFERENCE);
    session s[3] = {{0}};
    const char *paths[3] = {TINY, TINY, SMALL};
    for (int i = 0; i < 3 && ok; i++) {
        snprintf(t[i], sizeof t[i], "%s", tmp_path(i == 0 ? "a.trace" : i == 1 ? "b.trace"
                                                                               : "c.trace"));
        qt_options o = trace_options(t[i]);
        ok = session_ok(session_open(&s[i], paths[i], NULL, &o, QT_DEVICE_REFERENCE), "open");
    }
    for (bool any = ok; any;) {
        any = false;
        for (int i = 0; i < 3; i++) {
            qt_position at;
            qt_step_stats st;
            if (qt_position_get(s[i].rt, &at) != QT_OK || at.done) continue;
            any = session_ok(qt_step(s[i].rt, &st), "interleaved step") || any;
        }
    }
    for (int i = 0; i < 3; i++) {
        if (s[i].rt) session_close(&s[i]);
    }
    CHECK(ok && same_file(alone_tiny, t[0]) && same_file(alone_tiny, t[1]) &&
              same_file(alone_small, t[2]),
          "an interleaved runtime's trace differs from its run alone");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The embedder's data

// A recipe without data sources: every batch comes from the embedder.
static const char embedded_recipe[] =
    "[model]\n"
    "input = 8\n"
    "layer = linear fc1 16 bias\n"
    "layer = relu\n"
    "layer = linear head 3\n"
    "loss = softmax_xent\n"
    "[quant]\n"
    "recipe = bf16\n"
    "[optim]\n"
    "adamw lr=1e-2\n"
    "[data]\n"
    "batch = 8\n"
    "[schedule]\n"
    "train 60\n"
    "eval 3 train\n";

#define EMB_BATCH 8
#define EMB_FEATURES 8

// Batch k of the embedder's stream: three separable classes; the third eval batch is short.
static void embedded_batch(uint64_t k, float *x, int32_t *y, qt_batch *b) {
    uint32_t state = (uint32_t)(k * 2654435761u + 12345u);
    for (int r = 0; r < EMB_BATCH; r++) {
        int cls = (int)((k + (uint64_t)r) % 3);
        y[r] = cls;
        for (int j = 0; j < EMB_FEATURES; j++) {
            state = state * 1664525u + 1013904223u;
            float noise = (float)(state >> 8) / 16777216.0f - 0.5f;
            x[r * EMB_FEATURES + j] = (j % 3 == cls ? 2.0f : 0.0f) + noise;
        }
    }
    memset(b, 0, sizeof *b);
    b->rows = k == 62 ? 5 : EMB_BATCH;
    b->inputs_f32 = x;
    b->labels = y;
}

typedef struct feeder {
    float x[EMB_BATCH * EMB_FEATURES];
    int32_t y[EMB_BATCH];
    uint64_t calls;
} feeder;

static qt_status feed_callback(void *ctx, qt_mode mode, uint64_t step, qt_batch *batch) {
    feeder *f = ctx;
    (void)mode;
    f->calls++;
    embedded_batch(step, f->x, f->y, batch);
    return QT_OK;
}

static void count_steps(void *ctx, const qt_step_stats *st) {
    uint64_t *n = ctx;
    (*n)++;
    (void)st;
}

static void test_pushed_and_callback_batches(void) {
    test_begin("api_pushed_batches_and_the_data_callback_train_alike");
    char pushed[160], called[160];
    snprintf(pushed, sizeof pushed, "%s", tmp_path("pushed.trace"));
    snprintf(called, sizeof called, "%s", tmp_path("called.trace"));
    session s = {0};
    qt_options o = trace_options(pushed);
    float first = 0, last = 0;
    if (session_ok(session_open(&s, NULL, embedded_recipe, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_plan_info info;
        qt_plan_info_get(s.rt, &info);
        CHECK(!info.train_source && info.data_bytes == 0 && info.inputs == QT_INPUTS_F32,
              "no source: data bytes %llu", (unsigned long long)info.data_bytes);
        qt_step_stats st;
        CHECK(qt_step(s.rt, &st) == QT_ERR_INPUT && strstr(qt_error_message(), "no batch"),
              "a step without data: %s", qt_error_message());
        feeder f;
        for (uint64_t k = 0; k < 63; k++) {
            qt_batch b;
            embedded_batch(k, f.x, f.y, &b);
            if (!session_ok(qt_push_batch(s.rt, &b), "push")) break;
            CHECK(qt_push_batch(s.rt, &b) == QT_ERR_STATE, "a second push waits");
            if (!session_ok(qt_step(s.rt, &st), "step")) break;
            if (k == 0) first = st.loss;
            if (k == 59) last = st.loss;
        }
        CHECK(st.mode == QT_MODE_EVAL && st.rows_valid == 5, "the last step: %s of %u rows",
              qt_mode_name(st.mode), st.rows_valid);
    }
    session_close(&s);
    CHECK(last < 0.5f * first, "the loss went from %g to %g", (double)first, (double)last);
    o = trace_options(called);
    feeder f = {.calls = 0};
    uint64_t steps = 0;
    if (session_ok(session_open(&s, NULL, embedded_recipe, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_on_data(s.rt, feed_callback, &f);
        qt_on_step(s.rt, count_steps, &steps);
        qt_summary sum;
        session_ok(qt_run(s.rt, &sum), "qt_run with the callback");
        CHECK(sum.steps[QT_MODE_TRAIN] == 60 && sum.steps[QT_MODE_EVAL] == 3,
              "%llu train, %llu eval steps", (unsigned long long)sum.steps[QT_MODE_TRAIN],
              (unsigned long long)sum.steps[QT_MODE_EVAL]);
    }
    session_close(&s);
    CHECK(f.calls == 63 && steps == 63, "%llu callbacks, %llu step reports",
          (unsigned long long)f.calls, (unsigned long long)steps);
    CHECK(same_file(pushed, called), "the callback's run differs from the pushed one");
    test_end();
}

// A callback that declines (rows 0) leaves every step to the recipe's own sources.
static qt_status decline(void *ctx, qt_mode mode, uint64_t step, qt_batch *batch) {
    (void)mode;
    (void)step;
    (void)batch;
    (*(uint64_t *)ctx)++;
    return QT_OK;
}

static void test_declining_callback(void) {
    test_begin("api_a_declining_callback_leaves_the_recipe_sources");
    char alone[160], declined[160];
    snprintf(alone, sizeof alone, "%s", tmp_path("tiny_alone.trace"));
    snprintf(declined, sizeof declined, "%s", tmp_path("declined.trace"));
    bool ok = run_alone(TINY, alone, QT_DEVICE_REFERENCE);
    session s = {0};
    qt_options o = trace_options(declined);
    uint64_t calls = 0;
    if (ok && session_ok(session_open(&s, TINY, NULL, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_on_data(s.rt, decline, &calls);
        session_ok(qt_run(s.rt, NULL), "run");
    }
    session_close(&s);
    CHECK(ok && calls == 204 && same_file(alone, declined), "%llu calls",
          (unsigned long long)calls);
    test_end();
}

// Resident datasets (`resident = on`) and batches an embedder gives on some steps: the given
// batches are copied whole and the gather leaves them, the others are gathered on the device
// from the recipe's datasets; the run's records are those of the same run without resident
// datasets (the traces alike past their first line, which holds the recipe's hash).
static qt_status every_third(void *ctx, qt_mode mode, uint64_t step, qt_batch *batch) {
    feeder *f = ctx;
    (void)mode;
    f->calls++;
    if (step % 3 == 0) embedded_batch(step, f->x, f->y, batch);
    return QT_OK;
}

static bool same_records(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = file_read(a, &na), *y = file_read(b, &nb);
    const char *xa = x ? strchr(x, '\n') : NULL, *yb = y ? strchr(y, '\n') : NULL;
    bool same = xa && yb && na - (size_t)(xa - x) == nb - (size_t)(yb - y) &&
                memcmp(xa, yb, na - (size_t)(xa - x)) == 0 && na > (size_t)(xa - x) + 1;
    free(x);
    free(y);
    return same;
}

static void test_resident_with_pushed_batches(void) {
    test_begin("api_resident_datasets_and_given_batches_train_as_staged");
    static char text[2][1024];
    char traces[2][160];
    for (int resident = 0; resident < 2; resident++) {
        snprintf(traces[resident], sizeof traces[resident], "%s",
                 tmp_path(resident ? "resident_given.trace" : "staged_given.trace"));
        const char *cut = strstr(embedded_recipe, "batch = 8\n");
        snprintf(text[resident], sizeof text[resident], "%.*strain = synthetic classes inputs=8 "
                 "classes=3 samples=36 seed=3\neval = synthetic classes inputs=8 classes=3 "
                 "samples=20 seed=4\nresident = %s\n%s", (int)(cut - embedded_recipe),
                 embedded_recipe, resident ? "on" : "off", cut);
        session s = {0};
        qt_options o = trace_options(traces[resident]);
        feeder f = {.calls = 0};
        if (session_ok(session_open(&s, NULL, text[resident], &o, QT_DEVICE_REFERENCE),
                       "open")) {
            qt_on_data(s.rt, every_third, &f);
            session_ok(qt_run(s.rt, NULL), "run");
        }
        session_close(&s);
        CHECK(f.calls == 63, "%llu callbacks", (unsigned long long)f.calls);
    }
    CHECK(same_records(traces[0], traces[1]), "the resident run's records differ");
    test_end();
}

static void test_batch_refusals(void) {
    test_begin("api_bad_batches_are_refused_by_name");
    session s = {0};
    qt_options o;
    memset(&o, 0, sizeof o);
    if (session_ok(session_open(&s, NULL, embedded_recipe, &o, QT_DEVICE_REFERENCE), "open")) {
        feeder f;
        qt_batch b;
        embedded_batch(0, f.x, f.y, &b);
        f.y[3] = 3;
        CHECK(qt_push_batch(s.rt, &b) == QT_ERR_INPUT && strstr(qt_error_message(),
                                                                "label 3 in row 3"),
              "label out of range: %s", qt_error_message());
        f.y[3] = 0;
        f.x[9] = NAN;
        CHECK(qt_push_batch(s.rt, &b) == QT_ERR_INPUT && strstr(qt_error_message(), "finite"),
              "NaN input: %s", qt_error_message());
        f.x[9] = 0;
        b.rows = 9;
        CHECK(qt_push_batch(s.rt, &b) == QT_ERR_INPUT && strstr(qt_error_message(), "1 to 8"),
              "too many rows: %s", qt_error_message());
        b.rows = 8;
        b.inputs_f32 = NULL;
        b.inputs_u8 = (const uint8_t *)f.x;
        CHECK(qt_push_batch(s.rt, &b) == QT_ERR_INPUT &&
                  strstr(qt_error_message(), "inputs_f32"), "uint8 inputs for float32: %s",
              qt_error_message());
        b.inputs_f32 = f.x;
        b.inputs_u8 = NULL;
        b.labels = NULL;
        qt_step_stats st;
        session_ok(qt_push_batch(s.rt, &b), "an inputs-only batch");
        CHECK(qt_step(s.rt, &st) == QT_ERR_INPUT && strstr(qt_error_message(), "labels"),
              "a train step on an inputs-only batch: %s", qt_error_message());
    }
    session_close(&s);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Inference on a caller's batch

#define INF_SAMPLES 37
#define INF_FEATURES 8

// A small MXFP8 classifier on the .npy pair, trained 20 steps, then (output set) an infer row
// over the eval set into `output`.
static void infer_recipe(char *text, size_t bytes, const char *features, const char *labels,
                         const char *output) {
    int n = snprintf(text, bytes,
                     "[model]\ninput = 8\nlayer = linear fc1 16 bias\nlayer = gelu\n"
                     "layer = linear head 3\nloss = softmax_xent\n[quant]\nrecipe = mxfp8\n"
                     "[optim]\nadamw lr=1e-2\n[data]\ntrain = npy %s %s\neval = npy %s %s\n"
                     "batch = 16\n[schedule]\ntrain 20\n", features, labels, features, labels);
    if (output) snprintf(text + n, bytes - (size_t)n, "infer all eval output=%s\n", output);
}

static void test_infer_matches_infer_row(void) {
    test_begin("api_infer_on_a_caller_batch_gives_the_infer_rows_outputs");
    static float x[INF_SAMPLES * INF_FEATURES];
    int32_t y[INF_SAMPLES];
    for (int i = 0; i < INF_SAMPLES * INF_FEATURES; i++) x[i] = (float)((i * 37) % 17) / 8.0f - 1;
    for (int i = 0; i < INF_SAMPLES; i++) y[i] = i % 3;
    char features[160], labels[160], outputs[160], stepped[160], text[2048];
    snprintf(features, sizeof features, "%s", tmp_path("f.npy"));
    snprintf(labels, sizeof labels, "%s", tmp_path("l.npy"));
    snprintf(outputs, sizeof outputs, "%s", tmp_path("out.npy"));
    snprintf(stepped, sizeof stepped, "%s", tmp_path("out_stepped.npy"));
    npy_save(features, NPY_DTYPE_F32, 2, INF_SAMPLES, INF_FEATURES, x);
    npy_save(labels, NPY_DTYPE_I32, 1, INF_SAMPLES, 1, y);
    unlink(outputs);
    unlink(stepped);
    infer_recipe(text, sizeof text, features, labels, outputs);
    session s = {0};
    qt_options o;
    memset(&o, 0, sizeof o);
    if (session_ok(session_open(&s, NULL, text, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_summary sum;
        session_ok(qt_run(s.rt, &sum), "run");
        qt_output_file f;
        CHECK(sum.output_files == 1 && qt_output_file_get(s.rt, 0, &f) == QT_OK &&
                  f.rows == INF_SAMPLES && f.outputs == 3 && !f.argmax &&
                  strcmp(f.path, outputs) == 0, "%u output files", sum.output_files);
    }
    session_close(&s);
    size_t bytes = 0;
    char *file = file_read(outputs, &bytes);
    // The .npy file: 10 bytes, then its header's length (little-endian u16) of header text.
    size_t data = file && bytes >= 10 ? 10 + (size_t)(uint8_t)file[8] +
                                            256 * (size_t)(uint8_t)file[9] : 0;
    const float *expected = file ? (const float *)(void *)(file + data) : NULL;
    CHECK(file && bytes == data + INF_SAMPLES * 3 * sizeof(float), "%s: %zu bytes", outputs,
          bytes);
    // The same schedule one qt_step at a time writes the same file (the infer row runs whole).
    infer_recipe(text, sizeof text, features, labels, stepped);
    if (session_ok(session_open(&s, NULL, text, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_position at;
        qt_step_stats st;
        uint32_t calls = 0;
        while (qt_position_get(s.rt, &at) == QT_OK && !at.done && calls++ < 100) {
            if (!session_ok(qt_step(s.rt, &st), "qt_step")) break;
        }
        CHECK(calls == 21 && at.step == 23, "%u calls, %llu steps", calls,
              (unsigned long long)at.step);
    }
    session_close(&s);
    CHECK(same_file(outputs, stepped), "the stepped run's output file differs");
    o.modes[QT_MODE_INFER] = true;
    infer_recipe(text, sizeof text, features, labels, NULL);  // the schedule: train 20
    if (file && session_ok(session_open(&s, NULL, text, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_step_stats st;
        for (int k = 0; k < 20; k++) session_ok(qt_step(s.rt, &st), "train step");
        float logits[16 * 3];
        int32_t classes[16];
        for (int first = 0; first < INF_SAMPLES; first += 16) {
            qt_batch b = {(uint32_t)(INF_SAMPLES - first < 16 ? INF_SAMPLES - first : 16),
                          x + first * INF_FEATURES, NULL, NULL, NULL};
            if (!session_ok(qt_infer(s.rt, &b, logits, classes), "qt_infer")) break;
            CHECK(memcmp(logits, expected + first * 3, b.rows * 3 * sizeof(float)) == 0,
                  "logits of rows %d..%u differ from the infer row's", first, first + b.rows);
            for (uint32_t r = 0; r < b.rows; r++) {
                const float *l = logits + r * 3;
                int32_t best = l[1] > l[0] ? 1 : 0;
                best = l[2] > l[best] ? 2 : best;
                CHECK(classes[r] == best, "row %u: class %d, largest logit %d", first + r,
                      classes[r], best);
            }
        }
        qt_last_step(s.rt, &st);
        CHECK(st.mode == QT_MODE_INFER && !st.in_schedule && st.step == 22,
              "the last step: %s %llu", qt_mode_name(st.mode), (unsigned long long)st.step);
    }
    session_close(&s);
    free(file);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

static void test_save_and_resume(void) {
    test_begin("api_save_between_steps_and_resume_continue_the_trace");
    char whole[160], first[160], second[160], ckpt[160];
    snprintf(whole, sizeof whole, "%s", tmp_path("ck_whole.trace"));
    snprintf(first, sizeof first, "%s", tmp_path("ck_first.trace"));
    snprintf(second, sizeof second, "%s", tmp_path("ck_second.trace"));
    snprintf(ckpt, sizeof ckpt, "%s", tmp_path("api.ckpt"));
    bool ok = run_alone(SMALL, whole, QT_DEVICE_REFERENCE);
    session s = {0};
    qt_options o = trace_options(first);
    o.checkpoints = true;
    if (ok && session_ok(session_open(&s, SMALL, NULL, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_step_stats st;
        for (int k = 0; k < 107; k++) session_ok(qt_step(s.rt, &st), "step");
        session_ok(qt_save(s.rt, ckpt), "qt_save");
    }
    session_close(&s);
    size_t bytes = 0;
    char *text = file_read(first, &bytes);
    const char *end = "\nend status=stopped records=107\n";
    CHECK(text && bytes > 40 && strcmp(text + bytes - strlen(end), end) == 0,
          "a trace closed before the schedule's end: %s", text ? text + bytes - 40 : "");
    free(text);
    o.trace_path = second;
    if (ok && session_ok(session_open(&s, SMALL, NULL, &o, QT_DEVICE_REFERENCE), "open")) {
        session_ok(qt_resume(s.rt, ckpt), "qt_resume");
        uint64_t step = 0, train = 0;
        CHECK(qt_resumed(s.rt, &step, &train) && step == 107 && train == 100,
              "resumed at %llu (train %llu)", (unsigned long long)step,
              (unsigned long long)train);
        session_ok(qt_run(s.rt, NULL), "run to the end");
    }
    session_close(&s);
    // A failed resume may have moved the run's state: the runtime takes qt_close alone.
    o.trace_path = NULL;
    if (ok && session_ok(session_open(&s, SMALL, NULL, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_step_stats st;
        CHECK(qt_resume(s.rt, tmp_path("missing.ckpt")) == QT_ERR_IO, "a missing checkpoint");
        CHECK(qt_step(s.rt, &st) == QT_ERR_STATE &&
                  strstr(qt_error_message(), "qt_resume failed"), "a step after it: %s",
              qt_error_message());
    }
    session_close(&s);
    bool identical = false;
    char *report = NULL;
    size_t report_bytes = 0;
    FILE *out = open_memstream(&report, &report_bytes);
    qt_status diffed = qt_trace_diff(whole, second, out, &identical);
    fclose(out);
    CHECK(diffed == QT_OK && identical && strstr(report, "from step 107"),
          "the resumed trace against the whole: %s", report ? report : "");
    free(report);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU

static void test_gpu_given_arenas(void) {
    const char *name = "gpu_api_caller_arenas_and_steps_match_the_drivers_and_the_run";
    char whole[160], given[160];
    snprintf(whole, sizeof whole, "%s", tmp_path("gpu_whole.trace"));
    snprintf(given, sizeof given, "%s", tmp_path("gpu_given.trace"));
    const char *why = NULL;
    if (!gpu_available(&why)) {
        test_skip(name, why);
        return;
    }
    test_begin(name);
    run_alone(SMALL, whole, QT_DEVICE_GPU);
    session s = {.gpu_arenas_given = true};
    qt_options o = trace_options(given);
    if (session_ok(session_open(&s, SMALL, NULL, &o, QT_DEVICE_GPU), "open")) {
        qt_step_stats st;
        for (int k = 0; k < 50; k++) session_ok(qt_step(s.rt, &st), "step");
        session_ok(qt_run(s.rt, NULL), "the rest");
    }
    session_close(&s);
    CHECK(same_file(whole, given), "caller arenas and steps: another trace");
    test_end();
}

// qt_expert_loads_get: nothing before a train step, then the last train step's counts (one
// qt_step_mode train step, then an eval step, which must not disturb them), summing to batch x
// topk; refusals name the layer count and the experts.
static void test_expert_loads(void) {
    test_begin("api_expert_loads");
    const char *text = "[model]\ninput = 16\nlayer = moe m experts=5 topk=2 hidden=8\n"
                       "layer = linear head 4\nloss = softmax_xent\n[quant]\nrecipe = bf16\n"
                       "[optim]\nadamw\n[data]\ntrain = synthetic classes inputs=16 classes=4 "
                       "samples=256 zipf=1\nbatch = 32\n[schedule]\ntrain 3\neval 1 train\n";
    session s = {0};
    qt_options o;
    memset(&o, 0, sizeof o);
    if (session_ok(session_open(&s, NULL, text, &o, QT_DEVICE_REFERENCE), "open")) {
        qt_plan_info info;
        qt_plan_info_get(s.rt, &info);
        CHECK(info.moe_layers == 1, "%u moe layers", info.moe_layers);
        uint32_t counts[QT_EXPERTS_MAX];
        qt_expert_loads l;
        CHECK(qt_expert_loads_get(s.rt, 0, counts, QT_EXPERTS_MAX, &l) == QT_ERR_STATE &&
              strstr(qt_error_message(), "no train step has run"), "before a step: %s",
              qt_error_message());
        qt_step_stats st;
        session_ok(qt_step_mode(s.rt, QT_MODE_EVAL, &st), "eval step");
        CHECK(qt_expert_loads_get(s.rt, 0, NULL, 0, &l) == QT_ERR_STATE, "after an eval step");
        session_ok(qt_step_mode(s.rt, QT_MODE_TRAIN, &st), "train step");
        session_ok(qt_step_mode(s.rt, QT_MODE_EVAL, &st), "eval step");
        uint32_t sum = 0, max = 0;
        if (session_ok(qt_expert_loads_get(s.rt, 0, counts, 5, &l), "qt_expert_loads_get")) {
            for (uint32_t e = 0; e < 5; e++) {
                sum += counts[e];
                if (counts[e] > max) max = counts[e];
            }
        }
        CHECK(l.layer && strcmp(l.layer, "m") == 0 && l.experts == 5 && l.topk == 2 &&
              l.tokens == 32 && sum == 64 && l.max == max && l.mean == 12.8,
              "layer %s: %u experts, top-%u, %u tokens, sum %u, max %u (%u), mean %g",
              l.layer ? l.layer : "(none)", l.experts, l.topk, l.tokens, sum, l.max, max, l.mean);
        CHECK(qt_expert_loads_get(s.rt, 1, NULL, 0, &l) == QT_ERR_INPUT &&
              strstr(qt_error_message(), "moe layer 1; the model has 1"), "index past: %s",
              qt_error_message());
        CHECK(qt_expert_loads_get(s.rt, 0, counts, 4, &l) == QT_ERR_INPUT &&
              strstr(qt_error_message(), "counts holds 4; layer m has 5 experts"), "short: %s",
              qt_error_message());
    }
    session_close(&s);
    test_end();
}

int main(void) {
    if (!tmp_dir_make("api")) {
        printf("FAIL api_temporary_folder: cannot create one\n");
        return 1;
    }
    test_lifecycle_refusals();
    test_plan_queries();
    test_steps_match_run(QT_DEVICE_REFERENCE, "api_steps_one_by_one_give_the_runs_trace");
    test_interleaved_runtimes();
    test_pushed_and_callback_batches();
    test_declining_callback();
    test_resident_with_pushed_batches();
    test_batch_refusals();
    test_infer_matches_infer_row();
    test_save_and_resume();
    test_expert_loads();
    test_steps_match_run(QT_DEVICE_GPU, "gpu_api_steps_one_by_one_give_the_runs_trace");
    test_gpu_given_arenas();
    tmp_dir_remove();
    return test_exit_code();
}
