// Limits are part of the plan (runtime/run/run.h): the run's tables are sized from the model, so
// every model the parser accepts plans, with every scheme: a wide first layer (whose padded
// initialization once took an op per row), deep delayed-scaling models (once capped by the trace
// record and by a fixed count of scaling states), layer names that read like the names qtrain
// gives unnamed layers, and a model at the parser's layer limit. The tables are as large as the
// model needs, no more, and a delayed-scaling model of 30 linear layers trains with its trace.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/files.h"  // tmp_dir_make, tmp_path
#include "tests/plan.h"   // test_run_plan
#include "runtime/run/run.h"
#include "tests/test.h"

static run the_run;
static recipe the_recipe;

static const char *const formats[] = {"bf16", "delayed", "current", "mxfp8", "block", "nvfp4"};
#define FORMATS (sizeof formats / sizeof formats[0])

#define TEXT_MAX (1 << 16)

static qt_status plan_text(const char *text, const run_options *o) {
    QT_TRY(recipe_parse(text, strlen(text), "limits.recipe", &the_recipe));
    return test_run_plan(&the_run, &the_recipe, text, strlen(text), o);
}

static run_options options_default(void) {
    run_options o;
    memset(&o, 0, sizeof o);
    o.checksum_every = 100;
    return o;
}

// The counting pass and the real one agree: every table is exactly as large as what was built
// into it.
static void check_tables_exact(const char *what) {
    const run *r = &the_run;
    const run_tables *t = &r->tables;
    CHECK(t->dev_regions == r->dev.region_count && t->host_regions == r->host.region_count,
          "%s: regions %u %u, tables %u %u", what, r->dev.region_count, r->host.region_count,
          t->dev_regions, t->host_regions);
    CHECK(r->dev.region_capacity == t->dev_regions, "%s: device table %u entries for %u", what,
          r->dev.region_capacity, t->dev_regions);
    const program *programs[RUN_PROGRAM_COUNT] = {&r->init, &r->programs[MODEL_MODE_TRAIN],
                                                  &r->programs[MODEL_MODE_EVAL],
                                                  &r->programs[MODEL_MODE_INFER], &r->checksum};
    for (int i = 0; i < RUN_PROGRAM_COUNT; i++) {
        CHECK(programs[i]->op_count == t->ops[i] && programs[i]->op_capacity == t->ops[i],
              "%s: program %d: %u ops in a table of %u, counted %u", what, i,
              programs[i]->op_count, programs[i]->op_capacity, t->ops[i]);
    }
}

// ---------------------------------------------------------------------------------------------

static void wide_text(char *out, size_t bytes, const char *format, uint32_t width) {
    snprintf(out, bytes,
             "[model]\ninput = 784\nlayer = linear fc1 %u bias\nlayer = gelu\n"
             "layer = linear head 10\nloss = softmax_xent\n[quant]\nrecipe = %s\n[optim]\nadamw\n"
             "[data]\ntrain = synthetic classes inputs=784 classes=10 samples=512\n"
             "batch = 256\n[schedule]\ntrain 10\neval 2 train\n",
             width, format);
}

// Fashion-MNIST's shape with a first layer of 4092 and 8192 outputs: the formats that pad 784
// (mxfp8, nvfp4: 800; block: 896) once initialized the padded weight with one op per row and
// overflowed the init program's fixed table.
static void test_wide_first_layer(void) {
    test_begin("wide_first_layer_plans_in_every_format");
    static char text[TEXT_MAX];
    static const uint32_t widths[] = {4092, 8192};
    for (size_t w = 0; w < 2; w++) {
        for (size_t f = 0; f < FORMATS; f++) {
            wide_text(text, sizeof text, formats[f], widths[w]);
            run_options o = options_default();
            qt_status s = plan_text(text, &o);
            CHECK(s == QT_OK, "%s, %u outputs: %s", formats[f], widths[w], qt_error_message());
            if (s != QT_OK) continue;
            // Three fills (fc1's weight and bias, head's weight), the casts of two weights.
            CHECK(the_run.init.op_count <= 12, "%s: init has %u ops", formats[f],
                  the_run.init.op_count);
            check_tables_exact(formats[f]);
        }
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------

// `linears` linear layers of `width` with relu between them, delayed scaling with a rule of its
// own (margin) for each of the first `rules` layers, so the model has `rules` + 1 distinct
// scaling settings; then the schedule.
static void deep_text(char *out, size_t bytes, uint32_t linears, uint32_t width, uint32_t rules,
                      const char *format, const char *schedule) {
    size_t used = (size_t)snprintf(out, bytes, "[model]\ninput = %u\n", width);
    for (uint32_t i = 0; i < linears; i++) {
        used += (size_t)snprintf(out + used, bytes - used, "layer = linear fc%u %u bias\n%s", i,
                                 i + 1 == linears ? 4 : width,
                                 i + 1 == linears ? "" : "layer = relu\n");
    }
    used += (size_t)snprintf(out + used, bytes - used,
                             "loss = softmax_xent\n[quant]\nrecipe = %s\n", format);
    for (uint32_t i = 0; i < rules; i++) {
        used += (size_t)snprintf(out + used, bytes - used,
                                 "rule = linear.*@fc%u -> delayed margin=%u\n", i, i + 1);
    }
    snprintf(out + used, bytes - used,
             "[optim]\nadamw lr=1e-2\n[data]\ntrain = synthetic classes inputs=%u classes=4 "
             "samples=64 seed=3\nbatch = 16\n[schedule]\n%s",
             width, schedule);
}

// 30 linear layers in delayed scaling: 90 quantizers (a trace record held 64, with or without a
// trace) in 42 distinct scaling settings (at most 16 before), trained on the reference backend
// with a trace whose header names all 90.
// Loads, binds and runs the planned run to its end on the reference backend, then closes it
// (the trace, when the options name one, is complete then). Returns the run's status.
static qt_status run_planned_on_ref(sched_summary *sum) {
    uint64_t dev = 0, host = 0;
    run_memory_bytes(&the_run, &dev, &host);
    void *dev_memory = aligned_alloc(256, (dev + 511) / 256 * 256);
    void *host_memory = aligned_alloc(256, (host + 511) / 256 * 256);
    void *data = aligned_alloc(256, (run_data_bytes(&the_run) + 511) / 256 * 256);
    static backend b;
    backend_open_ref(&b);
    qt_status s = run_load(&the_run, data, run_data_bytes(&the_run));
    if (s == QT_OK) s = run_bind(&the_run, &b, dev_memory, host_memory);
    if (s == QT_OK) s = run_execute(&the_run, NULL, NULL, sum);
    run_close(&the_run);
    backend_close(&b);
    free(dev_memory), free(host_memory), free(data);
    return s;
}

static void test_deep_delayed(void) {
    test_begin("delayed_scaling_with_30_linear_layers_trains_with_a_trace");
    static char text[TEXT_MAX];
    deep_text(text, sizeof text, 30, 16, 20, "delayed", "train 4\neval 1 train\n");
    run_options o = options_default();
    o.trace_path = tmp_path("deep.trace");
    o.checksum_every = 2;
    qt_status s = plan_text(text, &o);
    CHECK(s == QT_OK, "plan: %s", qt_error_message());
    if (s != QT_OK) {
        test_end();
        return;
    }
    // A rule's margin makes two states (E4M3 input and weight, E5M2 gradient) of each layer.
    CHECK(the_run.model.delayed_count == 90 && the_run.model.state_count == 42,
          "%u quantizers in %u states", the_run.model.delayed_count, the_run.model.state_count);
    check_tables_exact("deep");
    sched_summary sum;
    s = run_planned_on_ref(&sum);
    CHECK(s == QT_OK, "run: %s", qt_error_message());
    static trace_reader reader;
    s = trace_reader_open(&reader, tmp_path("deep.trace"));
    CHECK(s == QT_OK && reader.header.quantizers_count == 90 &&
              strcmp(reader.header.quantizer_names[89], "linear.grad_output@fc29") == 0,
          "trace header: %s", s == QT_OK ? reader.header.quantizer_names[89] : "");
    uint32_t records = 0, scales = 0;
    static qt_trace_record rec;
    bool have = s == QT_OK;
    while (have && trace_reader_next(&reader, &rec, &have) == QT_OK && have) {
        records++;
        // The updated scales of every quantizer are in every record, the last one's too.
        scales += rec.scale[0] > 0.0f && rec.scale[89] > 0.0f;
    }
    if (s == QT_OK) trace_reader_close(&reader);
    CHECK(records == 5 && scales == 5, "%u records, %u with every scale", records, scales);
    test_end();
}

// ---------------------------------------------------------------------------------------------

// Layers named like the parts of the names qtrain makes itself: "l1" was once the name of layer
// 1 when it has none (its regions "train.l1.y"), and the programs' own regions are
// "<mode>.batch", "<mode>.loss.*", "<mode>.record.*", "step.*", "host.*", "checksum.*",
// "delayedN.*". Every mode runs (train, eval, infer rows), with every scheme.
static void test_names(void) {
    test_begin("layer_names_never_meet_internal_names");
    static const char *const names[] = {
        "l1", "l2", "batch", "loss", "record", "grad_norm", "step", "host", "delayed0",
        "checksum", "train", "eval", "infer", "gelu", "residual"};
    static char text[TEXT_MAX];
    for (size_t f = 0; f < FORMATS; f++) {
        size_t used = (size_t)snprintf(text, sizeof text, "[model]\ninput = 32\n");
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            // linear, then an unnamed layer (layer 2i + 1: "l3", ... in the old naming)
            used += (size_t)snprintf(text + used, sizeof text - used,
                                     "layer = linear %s 32 bias\nlayer = %s\n", names[i],
                                     i % 3 == 0 ? "gelu" : i % 3 == 1 ? "relu" : "silu");
        }
        snprintf(text + used, sizeof text - used,
                 "layer = residual begin\nlayer = rmsnorm\nlayer = residual end\n"
                 "layer = linear head 4\nloss = softmax_xent\n[quant]\nrecipe = %s\n[optim]\n"
                 "adamw\n[data]\ntrain = synthetic classes inputs=32 classes=4 samples=64\n"
                 "eval = synthetic classes inputs=32 classes=4 samples=32\nbatch = 16\n"
                 "[schedule]\ntrain 2\neval 1\ninfer 1\n",
                 formats[f]);
        run_options o = options_default();
        o.checkpoints = true;
        qt_status s = plan_text(text, &o);
        CHECK(s == QT_OK, "%s: %s", formats[f], qt_error_message());
        if (s == QT_OK) check_tables_exact(formats[f]);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------

// The parser's largest model: 256 layers (128 linears, 128 activations), every mode, checkpoints
// planned. It has several thousand regions per arena (2048 was once the fixed limit) and its
// tables are sized like any other model's.
static void test_largest_model(void) {
    test_begin("largest_parseable_model_plans");
    static char text[TEXT_MAX];
    static const char *const some[] = {"delayed", "nvfp4", "block"};
    for (size_t f = 0; f < 3; f++) {
        deep_text(text, sizeof text, 128, 32, 40, some[f], "train 2\neval 1 train\ninfer 1\n");
        // 128 linears and 127 relus: one more layer makes the parser's 256.
        char *head = strstr(text, "loss = ");
        memmove(head + 13, head, strlen(head) + 1);
        memcpy(head, "layer = relu\n", 13);
        run_options o = options_default();
        o.checkpoints = true;
        qt_status s = plan_text(text, &o);
        CHECK(s == QT_OK && the_recipe.model.layers_count == RECIPE_LAYERS_MAX, "%s: %s",
              some[f], qt_error_message());
        if (s != QT_OK) continue;
        CHECK(the_run.dev.region_count > 2048, "%s: %u device regions", some[f],
              the_run.dev.region_count);
        check_tables_exact(some[f]);
    }
    test_end();
}

// The parser's largest model of moe layers: 113 of them (9 roles each) and a head make 1020 of
// roles_max's 1024 quantized tensors, 340 linears (128 and 32 moe layers were once the model's
// limits). Their per-expert delayed-scaling slots (1359) pass a trace record's 1024: the record
// carries the first 1024 and the plan notes it.
static void test_largest_moe_model(void) {
    test_begin("largest_moe_model_plans_and_its_trace_records_the_first_slots");
    static char text[TEXT_MAX];
    size_t used = (size_t)snprintf(text, sizeof text, "[model]\ninput = 16\n");
    for (int i = 0; i < 113; i++) {
        used += (size_t)snprintf(text + used, sizeof text - used,
                                 "layer = moe m%d experts=2 topk=1 hidden=16\n", i);
    }
    snprintf(text + used, sizeof text - used, "layer = linear head 4\nloss = softmax_xent\n"
             "[quant]\nrecipe = delayed\n[optim]\nadamw\n[data]\ntrain = synthetic classes "
             "inputs=16 classes=4 samples=64 seed=3\nbatch = 16\n[schedule]\ntrain 2\n");
    run_options o = options_default();
    o.checkpoints = true;
    qt_status s = plan_text(text, &o);
    CHECK(s == QT_OK, "plan: %s", qt_error_message());
    if (s != QT_OK) {
        test_end();
        return;
    }
    const model *m = &the_run.model;
    CHECK(m->moe_count == 113 && m->linear_count == 340 && m->quantizer_count == 1020,
          "%u moe layers, %u linears, %u quantizers", m->moe_count, m->linear_count,
          m->quantizer_count);
    CHECK(m->delayed_slots == 1359 && m->delayed_count == QT_TRACE_QUANTIZERS_MAX,
          "%u slots, %u recorded", m->delayed_slots, m->delayed_count);
    bool noted = false;
    for (uint32_t i = 0; i < m->note_count; i++) {
        noted = noted || strstr(m->notes[i], "1359 delayed-scaling slots") != NULL;
    }
    CHECK(noted, "no note of the slots past the record");
    check_tables_exact("moe");
    test_end();
}

// ---------------------------------------------------------------------------------------------

// The run struct no longer holds worst-case tables (it was about 24 MB, each program 4.65 MB; what
// stays is the model's per-layer description, the program builders' state, which every run has
// its own of, and the trace's line buffers, under 3 MiB), and the tables grow with the model: a
// Fashion-MNIST MLP's take a few hundred KiB, a model four times as deep takes more.
static void test_tables_sized(void) {
    test_begin("tables_are_sized_from_the_model");
    static char text[TEXT_MAX];
    CHECK(sizeof(run) < (3u << 20), "sizeof(run) = %zu", sizeof(run));
    uint64_t shallow[FORMATS], deep[FORMATS];
    for (size_t f = 0; f < FORMATS; f++) {
        run_options o = options_default();
        wide_text(text, sizeof text, formats[f], 1024);
        qt_status s = plan_text(text, &o);
        shallow[f] = the_run.tables.bytes;
        CHECK(s == QT_OK && shallow[f] < (512u << 10), "%s: %llu bytes: %s", formats[f],
              (unsigned long long)shallow[f], qt_error_message());
        deep_text(text, sizeof text, 12, 64, 0, formats[f], "train 2\n");
        s = plan_text(text, &o);
        deep[f] = the_run.tables.bytes;
        CHECK(s == QT_OK && deep[f] > shallow[f], "%s: deep %llu, shallow %llu: %s",
              formats[f], (unsigned long long)deep[f], (unsigned long long)shallow[f],
              qt_error_message());
        const run_tables *t = &the_run.tables;
        CHECK(t->bytes == t->schedule_bytes + t->arena_bytes + t->program_bytes + t->ckpt_bytes,
              "%s: the parts add up", formats[f]);
    }
    // Too little table memory is refused with both numbers.
    run_options o = options_default();
    wide_text(text, sizeof text, "nvfp4", 64);
    uint64_t need = 0;
    CHECK(recipe_parse(text, strlen(text), "limits.recipe", &the_recipe) == QT_OK &&
              run_measure(&the_run, &the_recipe, text, strlen(text), &o, &need) == QT_OK,
          "measure: %s", qt_error_message());
    static uint8_t small[1024] __attribute__((aligned(64)));
    qt_status s = run_plan(&the_run, small, sizeof small);
    char expected[128];
    snprintf(expected, sizeof expected, "the run's tables need %llu bytes (run_measure), 1024 "
             "were given", (unsigned long long)need);
    CHECK(s == QT_ERR_CAPACITY && strstr(qt_error_message(), expected), "%s",
          qt_error_message());
    test_end();
}

// ---------------------------------------------------------------------------------------------

// `repeat N` expands into the table, sized from the recipe: three rows 400 times and a closing
// eval pass make 1201 rows and 400 learning-rate rows (a warm-up that starts over in every
// repetition), and the run's steps come in that order.
static void test_repeats(void) {
    test_begin("schedule_repeats_expand_into_a_table_sized_from_the_recipe");
    static char text[TEXT_MAX];
    deep_text(text, sizeof text, 2, 16, 0, "nvfp4",
              "train 3 warmup 1e-3 -> 1e-2\neval 1 train\ninfer 1 train\nrepeat 400\n"
              "eval all train\n");
    run_options o = options_default();
    o.trace_path = tmp_path("repeat.trace");
    qt_status s = plan_text(text, &o);
    const sched_table *t = &the_run.table;
    CHECK(s == QT_OK && t->row_count == 1201 && t->lr_count == 400 &&
              t->steps[MODEL_MODE_TRAIN] == 1200 && t->steps[MODEL_MODE_INFER] == 400 &&
              t->steps[MODEL_MODE_EVAL] == 404 && the_run.tables.sched_rows == 1201,
          "rows %u, lr rows %u, train steps %llu: %s", t->row_count, t->lr_count,
          (unsigned long long)t->steps[MODEL_MODE_TRAIN], qt_error_message());
    CHECK(s == QT_OK && t->lr[399].start == 1197 && t->lr[399].steps == 3 &&
              t->rows[1199].mode == MODEL_MODE_INFER && t->rows[1200].steps == 4,
          "the last repetition and the closing pass");
    if (s != QT_OK) {
        test_end();
        return;
    }
    sched_summary sum;
    s = run_planned_on_ref(&sum);
    CHECK(s == QT_OK && sum.steps[MODEL_MODE_TRAIN] == 1200 && sum.skipped == 0, "run: %s",
          qt_error_message());
    // Modes in order: train, train, train, eval, infer, ..., then the eval pass; the learning
    // rate starts every repetition over at the warm-up's first value.
    static trace_reader reader;
    static qt_trace_record rec;
    bool have = trace_reader_open(&reader, tmp_path("repeat.trace")) == QT_OK;
    uint32_t records = 0, out_of_order = 0, restarts = 0;
    while (have && trace_reader_next(&reader, &rec, &have) == QT_OK && have) {
        uint64_t k = rec.step % 5;
        uint32_t want = rec.step >= 2000 ? QT_TRACE_MODE_EVAL
                        : k < 3           ? QT_TRACE_MODE_TRAIN
                        : k == 3          ? QT_TRACE_MODE_EVAL
                                          : QT_TRACE_MODE_INFER;
        out_of_order += rec.mode != want;
        restarts += rec.mode == QT_TRACE_MODE_TRAIN && k == 0 && rec.lr == 1e-3f;
        records++;
    }
    trace_reader_close(&reader);
    CHECK(records == 2004 && out_of_order == 0 && restarts == 400,
          "%u records, %u out of order, %u warm-up starts", records, out_of_order, restarts);
    test_end();
}

int main(void) {
    if (!tmp_dir_make("limits")) {
        printf("FAIL limits: cannot make a temporary folder\n");
        return 1;
    }
    test_wide_first_layer();
    test_deep_delayed();
    test_names();
    test_largest_model();
    test_largest_moe_model();
    test_tables_sized();
    test_repeats();
    tmp_dir_remove();
    return test_exit_code();
}
