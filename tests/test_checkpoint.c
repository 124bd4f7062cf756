// Checkpoints (runtime/run/checkpoint.h) and their export (runtime/run/export.h): a run stopped at
// every kind of schedule position, saved and resumed gives the uninterrupted run's trace and
// final state with every scheme (reference backend, and the GPU when there is one); saves change
// nothing; damaged and foreign files are refused with a message naming the field; a writer
// killed at any point leaves the previous checkpoint; the safetensors export follows the format.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, _exit, unlink

#include "runtime/driver/driver.h"  // driver_sync_total
#include "runtime/run/export.h"
#include "tests/plan.h"             // test_run_plan
#include "runtime/run/run.h"
#include "tests/test.h"

#define RECIPE_TEXT_MAX 8192
#define RESUME_RECIPE "tests/recipes/synthetic_resume.recipe"
#define RESUME_STEPS 140  // every row of synthetic_resume.recipe

static run the_run;
static recipe the_recipe;
static char tmp_dir[64];

// ---------------------------------------------------------------------------------------------
// Files

static uint8_t *file_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *bytes = malloc(size > 0 ? (size_t)size : 1);
    *n = fread(bytes, 1, (size_t)size, f);
    fclose(f);
    return bytes;
}

static bool file_put(const char *path, const uint8_t *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(bytes, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void temp_path(char *out, size_t bytes, const char *name) {
    snprintf(out, bytes, "%s/%s", tmp_dir, name);
}

static bool same_bytes(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    uint8_t *fa = file_bytes(a, &na), *fb = file_bytes(b, &nb);
    bool same = fa && fb && na == nb && memcmp(fa, fb, na) == 0;
    free(fa);
    free(fb);
    return same;
}

// Whether two traces hold the same bytes; the first difference is reported.
static bool same_file(const char *a, const char *b) {
    bool same = same_bytes(a, b);
    if (!same) {
        bool identical = false;
        printf("  %s and %s differ:\n  ", a, b);
        trace_diff(a, b, stdout, &identical);
    }
    return same;
}

// The resume recipe in built-in recipe `scheme`, with `rules` (lines, may be NULL) after it.
static const char *resume_text(const char *scheme, const char *rules) {
    static char text[RECIPE_TEXT_MAX], out[RECIPE_TEXT_MAX];
    size_t n = 0;
    uint8_t *bytes = file_bytes(RESUME_RECIPE, &n);
    if (!bytes || n >= sizeof text) {
        free(bytes);
        return "";
    }
    memcpy(text, bytes, n);
    text[n] = '\0';
    free(bytes);
    const char *key = "\nrecipe = bf16\n";
    const char *at = strstr(text, key);
    if (!at) return "";
    snprintf(out, sizeof out, "%.*s\nrecipe = %s\n%s%s", (int)(at - text), text, scheme,
             rules ? rules : "", at + strlen(key));
    return out;
}

// ---------------------------------------------------------------------------------------------
// Runs

static backend *backend_of(backend_kind kind) {
    static backend ref, gpu;
    static bool ref_open, gpu_tried, gpu_open;
    if (kind == BACKEND_REF) {
        if (!ref_open) backend_open_ref(&ref);
        ref_open = true;
        return &ref;
    }
    if (!gpu_tried) gpu_open = backend_open_gpu(&gpu, 0) == QT_OK;
    gpu_tried = true;
    return gpu_open ? &gpu : NULL;
}

typedef struct job {
    const char *text;
    backend_kind kind;
    run_options options;
    const char *resume;       // checkpoint to resume from, or NULL
    bool keep;                // leave the run bound (the caller closes it with job_close)
    // results
    qt_status status;
    char message[QT_ERROR_MESSAGE_MAX];
    sched_summary summary;
    uint64_t syncs;           // synchronizing driver calls of run_execute (saves included)
    uint64_t digest;          // hash of every persistent device region after the run
    void *memory[3];
} job;

// FNV-1a over every persistent device region a checkpoint keeps (model_region_saved): the run's
// final state.
static uint64_t state_digest(run *r) {
    uint64_t h = trace_hash(NULL, 0);
    for (uint32_t i = 0; i < r->dev.region_count; i++) {
        const arena_region *reg = arena_region_get(&r->dev, i);
        if (!reg->persistent || reg->bytes == 0 || !model_region_saved(&r->model, i)) continue;
        uint8_t *bytes = malloc(reg->bytes);
        if (backend_read(r->backend, bytes, (prog_ref){&r->dev, i, 0}, reg->bytes) == QT_OK) {
            h = trace_hash_more(h, bytes, reg->bytes);
        }
        free(bytes);
    }
    return h;
}

static void *arena_memory(uint64_t bytes) {
    return aligned_alloc(256, ((bytes + 255) / 256 + 1) * 256);
}

static void job_close(job *j) {
    run_close(&the_run);
    for (int i = 0; i < 3; i++) free(j->memory[i]);
    memset(j->memory, 0, sizeof j->memory);
}

static qt_status job_steps(job *j, backend *b) {
    if (j->resume) j->options.checkpoints = true;
    QT_TRY(recipe_parse(j->text, strlen(j->text), "resume.recipe", &the_recipe));
    QT_TRY(test_run_plan(&the_run, &the_recipe, j->text, strlen(j->text), &j->options));
    uint64_t dev_bytes, host_bytes;
    run_memory_bytes(&the_run, &dev_bytes, &host_bytes);
    if (b->kind == BACKEND_REF) {
        j->memory[0] = arena_memory(dev_bytes);
        j->memory[1] = arena_memory(host_bytes);
    }
    j->memory[2] = arena_memory(run_data_bytes(&the_run));
    QT_TRY(run_load(&the_run, j->memory[2], run_data_bytes(&the_run)));
    QT_TRY(run_bind(&the_run, b, j->memory[0], j->memory[1]));
    if (j->resume) QT_TRY(run_resume(&the_run, j->resume));
    uint64_t syncs = driver_sync_total(&b->syncs);
    QT_TRY(run_execute(&the_run, NULL, NULL, &j->summary));
    j->syncs = driver_sync_total(&b->syncs) - syncs;
    j->digest = state_digest(&the_run);
    return QT_OK;
}

// Runs the job; false when its backend cannot be opened (a GPU job without a GPU).
static bool job_run(job *j) {
    backend *b = backend_of(j->kind);
    if (!b) return false;
    j->status = job_steps(j, b);
    snprintf(j->message, sizeof j->message, "%s", j->status == QT_OK ? "" : qt_error_message());
    if (!j->keep || j->status != QT_OK) job_close(j);
    return true;
}

static void job_expect_ok(const job *j, const char *what) {
    CHECK(j->status == QT_OK, "%s: %s: %s", what, qt_status_name(j->status), j->message);
}

// A job that writes its trace (checksums every 10 train steps) to `trace`.
static job job_of(const char *text, backend_kind kind, const char *trace) {
    job j = {.text = text, .kind = kind};
    j.options.checksum_every = 10;
    j.options.trace_path = trace;
    return j;
}

// The uninterrupted run of a text: its trace (checksums every 10 train steps) and digest.
static bool full_run(const char *text, backend_kind kind, const char *trace, uint64_t *digest) {
    job j = job_of(text, kind, trace);
    unlink(trace);
    if (!job_run(&j)) return false;
    job_expect_ok(&j, "uninterrupted run");
    *digest = j.digest;
    return true;
}

// Paths "full.trace", "<tag>.trace" and "<tag>.ckpt" (the last two removed), and the
// uninterrupted reference run of the text on the reference backend; its final state's digest.
#define PATH_BYTES 128
static uint64_t prepare(const char *text, const char *tag, char *full, char *trace, char *ckpt) {
    char name[64];
    temp_path(full, PATH_BYTES, "full.trace");
    snprintf(name, sizeof name, "%s.trace", tag);
    temp_path(trace, PATH_BYTES, name);
    snprintf(name, sizeof name, "%s.ckpt", tag);
    temp_path(ckpt, PATH_BYTES, name);
    uint64_t digest = 0;
    full_run(text, BACKEND_REF, full, &digest);
    unlink(trace);
    unlink(ckpt);
    return digest;
}

// A run of text that saves to ckpt (every save_every train steps, stopping after stop steps,
// cut by steps_limit: 0 for none), left bound when it worked (close it with job_close).
static job run_saving(const char *text, backend_kind kind, const char *trace, const char *ckpt,
                      uint64_t save_every, uint64_t stop, uint64_t steps_limit) {
    job j = job_of(text, kind, trace);
    j.keep = true;
    j.options.save_path = ckpt;
    j.options.save_every = save_every;
    j.options.stop_at = stop;
    j.options.steps_limit = steps_limit;
    job_run(&j);
    job_expect_ok(&j, "the saving run");
    return j;
}

// The run resumed from ckpt, to its end, into trace.
static job run_resumed(const char *text, backend_kind kind, const char *trace,
                       const char *ckpt) {
    job j = job_of(text, kind, trace);
    j.resume = ckpt;
    job_run(&j);
    job_expect_ok(&j, ckpt);
    return j;
}

// The saves of the bound run's last run_execute.
static void check_saves(uint32_t count, uint64_t last_step) {
    CHECK(the_run.saves.count == count && the_run.saves.last_step == last_step,
          "%u saves, the last at step %llu; expected %u, the last at %llu", the_run.saves.count,
          (unsigned long long)the_run.saves.last_step, count, (unsigned long long)last_step);
}

// Stops the run after `stop` steps with a checkpoint, resumes it to the end into the same
// trace file and compares both the trace and the final state with the uninterrupted run's.
static void check_stop_resume(const char *text, backend_kind kind, uint64_t stop,
                              const char *full_trace, uint64_t full_digest) {
    char trace[128], ckpt[128];
    temp_path(trace, sizeof trace, "resumed.trace");
    temp_path(ckpt, sizeof ckpt, "resume.ckpt");
    unlink(trace);
    unlink(ckpt);
    job a = run_saving(text, kind, trace, ckpt, 0, stop, 0);
    if (a.status == QT_OK) job_close(&a);
    CHECK(a.summary.stopped == (stop < RESUME_STEPS), "stop after %llu: stopped %d",
          (unsigned long long)stop, a.summary.stopped);
    job b = run_resumed(text, kind, trace, ckpt);
    uint64_t ran = b.summary.steps[0] + b.summary.steps[1] + b.summary.steps[2];
    CHECK(ran == RESUME_STEPS - stop, "stop after %llu: the resumed run ran %llu steps",
          (unsigned long long)stop, (unsigned long long)ran);
    CHECK(same_file(full_trace, trace), "stop after %llu: traces differ",
          (unsigned long long)stop);
    CHECK(b.digest == full_digest, "stop after %llu: final state %016llx, uninterrupted %016llx",
          (unsigned long long)stop, (unsigned long long)b.digest,
          (unsigned long long)full_digest);
}

// Steps of synthetic_resume.recipe to stop after: inside the first train row (mid-epoch), at
// the boundary of two train rows, just before the eval row, inside it, between eval and infer,
// inside the infer row, between infer and train, inside the last eval row, at the end.
static const uint64_t stops[] = {17, 40, 100, 102, 104, 105, 106, 139, 140};
#define STOPS_COUNT (sizeof stops / sizeof stops[0])

typedef struct format_case {
    const char *label;
    const char *scheme;
    const char *rules;
} format_case;

static const format_case formats[] = {
    {"bf16", "bf16", NULL},
    {"delayed", "delayed", NULL},
    {"current", "current", NULL},
    {"mxfp8", "mxfp8", NULL},
    {"block", "block", NULL},
    {"nvfp4", "nvfp4", NULL},
    // The custom mix: a BF16 head, NVFP4 fc1, MXFP8 E5M2 gradients (mixed-format GEMMs).
    {"custom", "nvfp4",
     "rule = linear.*@head -> bf16\nrule = linear.grad_output@* -> mxfp8 e5m2\n"},
};
#define FORMATS_COUNT (sizeof formats / sizeof formats[0])

static void test_resume_bitwise(const format_case *f, backend_kind kind) {
    char name[96];
    snprintf(name, sizeof name, "%sresume_bitwise_at_every_row_kind_%s",
             kind == BACKEND_GPU ? "gpu_" : "", f->label);
    const char *text = resume_text(f->scheme, f->rules);
    char full[128];
    temp_path(full, sizeof full, "full.trace");
    uint64_t digest = 0;
    test_begin(name);
    if (!full_run(text, kind, full, &digest)) {
        test_skip(name, qt_error_message());
        return;
    }
    for (size_t i = 0; i < STOPS_COUNT; i++) check_stop_resume(text, kind, stops[i], full, digest);
    test_end();
}

// Resident datasets (`resident = on`): a stopped run resumes bit for bit at every row kind, as
// one that stages its rows (the datasets are no checkpoint's: the resumed run uploads its own).
static void test_resume_bitwise_resident(backend_kind kind) {
    char name[96];
    snprintf(name, sizeof name, "%sresume_bitwise_at_every_row_kind_resident",
             kind == BACKEND_GPU ? "gpu_" : "");
    static char text[RECIPE_TEXT_MAX + 32];
    const char *base = resume_text("bf16", NULL), *at = strstr(base, "\nseed = 11\n");
    test_begin(name);
    CHECK(at != NULL, "no seed line in %s", RESUME_RECIPE);
    if (at == NULL) {
        test_end();
        return;
    }
    size_t head = (size_t)(at - base) + strlen("\nseed = 11\n");
    snprintf(text, sizeof text, "%.*sresident = on\n%s", (int)head, base, base + head);
    char full[128];
    temp_path(full, sizeof full, "full_resident.trace");
    uint64_t digest = 0;
    if (!full_run(text, kind, full, &digest)) {
        test_skip(name, qt_error_message());
        return;
    }
    for (size_t i = 0; i < STOPS_COUNT; i++) check_stop_resume(text, kind, stops[i], full, digest);
    test_end();
}

// --save-every: the trace of the run with saves is the run's without them; the last save is at
// the end, and resuming from it runs nothing.
static void test_saves_change_nothing(void) {
    test_begin("save_every_changes_nothing");
    const char *text = resume_text("delayed", NULL);
    char full[PATH_BYTES], trace[PATH_BYTES], ckpt[PATH_BYTES];
    uint64_t digest = prepare(text, "saves", full, trace, ckpt);
    job a = run_saving(text, BACKEND_REF, trace, ckpt, 7, 0, 0);
    if (a.status == QT_OK) {
        check_saves(19, RESUME_STEPS);  // train steps 7, 14, ..., 126, and the end
        // Step times: 99 + 29 pairs of consecutive train steps, less the 18 a save divides.
        CHECK(a.summary.step_time_count == 128 - 18, "%llu step intervals, expected 110",
              (unsigned long long)a.summary.step_time_count);
        job_close(&a);
    }
    CHECK(same_file(full, trace), "the trace with saves differs");
    CHECK(a.digest == digest, "final state differs with saves");
    job b = run_resumed(text, BACKEND_REF, trace, ckpt);
    CHECK(b.summary.steps[0] + b.summary.steps[1] + b.summary.steps[2] == 0,
          "resumed at the end, yet steps ran");
    CHECK(b.summary.has_eval && b.summary.eval_samples == 64,
          "the summary lost the last eval row (%d, %llu samples)", b.summary.has_eval,
          (unsigned long long)b.summary.eval_samples);
    CHECK(same_file(full, trace), "the trace changed when nothing ran");
    test_end();
}

// --steps 50 cuts the second train row: the checkpoint is at train step 50 (the eval and infer
// rows after the cut run after it), and the full schedule continues from there with the same
// trace file, whose records after the checkpoint are cut off.
static void test_steps_cut(void) {
    test_begin("resume_after_steps_cut_continues_the_schedule");
    const char *text = resume_text("nvfp4", NULL);
    char full[PATH_BYTES], trace[PATH_BYTES], ckpt[PATH_BYTES];
    uint64_t digest = prepare(text, "cut", full, trace, ckpt);
    job a = run_saving(text, BACKEND_REF, trace, ckpt, 0, 0, 50);
    if (a.status == QT_OK) {
        check_saves(1, 50);
        CHECK(the_run.state.step == 56, "the cut run ended at step %llu, expected 56",
              (unsigned long long)the_run.state.step);
        job_close(&a);
    }
    job b = run_resumed(text, BACKEND_REF, trace, ckpt);
    CHECK(same_file(full, trace), "the continued trace differs from the uninterrupted one");
    CHECK(b.digest == digest, "final state differs");
    // A shorter cut than the checkpoint's position cannot continue from it.
    job c = {.text = text, .kind = BACKEND_REF, .resume = ckpt};
    c.options.steps_limit = 30;
    job_run(&c);
    CHECK(c.status == QT_ERR_MISMATCH && strstr(c.message, "schedule:") &&
              strstr(c.message, "--steps"), "steps 30: %s: %s", qt_status_name(c.status),
          c.message);
    test_end();
}

// Synchronizing calls inside saves: from the header's write (the drain before it is the loop's)
// to the end of the save.
typedef struct save_syncs {
    uint64_t at_header, inside;
    uint32_t saves;
} save_syncs;

static void count_save_syncs(void *ctx, ckpt_phase phase, uint64_t bytes) {
    save_syncs *c = ctx;
    if (phase == CKPT_PHASE_WRITTEN && bytes == CKPT_HEADER_BYTES) {
        c->at_header = driver_sync_total(&backend_of(BACKEND_GPU)->syncs);
    }
    if (phase != CKPT_PHASE_DONE) return;
    c->inside += driver_sync_total(&backend_of(BACKEND_GPU)->syncs) - c->at_header;
    c->saves++;
}

// The GPU loop with saves and the one resumed at an odd step (its first batch in device slot
// 1) synchronize only to read records (one per step; a save's drain reads the steps in flight
// early) and inside saves: staging and priming add no wait. Both stage one batch per step, and
// the resumed run ends with the uninterrupted run's trace.
static void test_gpu_syncs(void) {
    const char *name = "gpu_saving_and_resumed_loops_synchronize_only_for_records_and_saves";
    const char *text = resume_text("nvfp4", NULL);
    char full[PATH_BYTES], trace[PATH_BYTES], ckpt[PATH_BYTES];
    temp_path(full, sizeof full, "gpu_full.trace");
    temp_path(trace, sizeof trace, "gpu_syncs.trace");
    temp_path(ckpt, sizeof ckpt, "gpu_syncs.ckpt");
    uint64_t digest = 0;
    test_begin(name);
    if (!full_run(text, BACKEND_GPU, full, &digest)) {
        test_skip(name, qt_error_message());
        return;
    }
    unlink(trace);
    unlink(ckpt);
    save_syncs counted = {0, 0, 0};
    job a = job_of(text, BACKEND_GPU, trace);
    a.options.save_path = ckpt;
    a.options.save_every = 7;
    a.options.stop_at = 17;
    a.options.ckpt_hook = count_save_syncs;
    a.options.ckpt_hook_ctx = &counted;
    job_run(&a);
    job_expect_ok(&a, "the saving run");
    const sched_summary *sa = &a.summary;
    uint64_t ran = sa->steps[0] + sa->steps[1] + sa->steps[2];
    CHECK(ran == 17 && counted.saves == 3, "%llu steps, %u saves; expected 17 and 3 (train "
          "steps 7, 14 and the stop)", (unsigned long long)ran, counted.saves);
    CHECK(a.syncs - counted.inside == sa->lagged_reads && sa->lagged_reads == ran,
          "saving run: %llu synchronizing calls, %llu inside saves, %llu record reads, %llu steps",
          (unsigned long long)a.syncs, (unsigned long long)counted.inside,
          (unsigned long long)sa->lagged_reads, (unsigned long long)ran);
    CHECK(sa->batch_copies == ran, "saving run: %llu batch copies for %llu steps",
          (unsigned long long)sa->batch_copies, (unsigned long long)ran);
    job b = run_resumed(text, BACKEND_GPU, trace, ckpt);
    const sched_summary *sb = &b.summary;
    ran = sb->steps[0] + sb->steps[1] + sb->steps[2];
    CHECK(ran == RESUME_STEPS - 17 && b.syncs == sb->lagged_reads && sb->lagged_reads == ran &&
              sb->batch_copies == ran,
          "resumed run: %llu steps, %llu synchronizing calls, %llu record reads, %llu batch "
          "copies", (unsigned long long)ran, (unsigned long long)b.syncs,
          (unsigned long long)sb->lagged_reads, (unsigned long long)sb->batch_copies);
    CHECK(same_file(full, trace), "the resumed trace differs from the uninterrupted one");
    CHECK(b.digest == digest, "final state differs");
    test_end();
}

// --check across a stop: the stopped run matches the golden trace so far (the golden trace goes
// on), the run resumed from its checkpoint matches it from its first step (the records before are
// passed over), and a resumed run is still checked: against the trace of another seed it fails
// at its first record.
static void test_golden_resume(void) {
    test_begin("check_golden_trace_across_stop_and_resume");
    const char *text = resume_text("mxfp8", NULL);
    char full[PATH_BYTES], trace[PATH_BYTES], ckpt[PATH_BYTES], other[PATH_BYTES];
    prepare(text, "golden", full, trace, ckpt);
    job a = job_of(text, BACKEND_REF, trace);
    a.options.save_path = ckpt;
    a.options.stop_at = 57;
    a.options.golden_path = full;
    job_run(&a);
    job_expect_ok(&a, "the stopped run checked against the whole trace");
    job c = job_of(text, BACKEND_REF, NULL);
    c.resume = ckpt;
    c.options.golden_path = full;
    job_run(&c);
    job_expect_ok(&c, "the resumed run checked against the whole trace");
    CHECK(c.summary.steps[0] + c.summary.steps[1] + c.summary.steps[2] == RESUME_STEPS - 57,
          "the resumed run ran %llu steps", (unsigned long long)(c.summary.steps[0] +
          c.summary.steps[1] + c.summary.steps[2]));
    temp_path(other, sizeof other, "seed99.trace");
    job d = job_of(text, BACKEND_REF, other);
    d.options.seed_given = true;
    d.options.seed = 99;
    job_run(&d);
    job_expect_ok(&d, "the run of seed 99");
    job e = job_of(text, BACKEND_REF, NULL);
    e.resume = ckpt;
    e.options.golden_path = other;
    job_run(&e);
    CHECK(e.status == QT_ERR_MISMATCH && strstr(e.message, "diverges from the golden trace at "
          "step 57 "), "against another seed's trace: %s: %s", qt_status_name(e.status),
          e.message);
    test_end();
}

// The infer row of the resume recipe writes a file: a stop inside it waits for the row's end
// (the file is whole and committed), the run resumed after it leaves that file alone (no refusal
// of an existing file it will not write); a run stopped before the row writes no file, and the
// resumed one writes the uninterrupted run's bytes.
static void test_outputs_across_stops(void) {
    test_begin("infer_row_files_whole_across_stop_and_resume");
    char rows[PATH_BYTES], kept[PATH_BYTES], row[PATH_BYTES + 64];
    temp_path(rows, sizeof rows, "rows.npy");
    temp_path(kept, sizeof kept, "full_rows.npy");
    snprintf(row, sizeof row, "infer 2 train output=%s\n", rows);
    static char text[RECIPE_TEXT_MAX];
    const char *base = resume_text("bf16", NULL);
    const char *at = strstr(base, "infer 2 train\n");
    if (at) {
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - base), base, row,
                 at + strlen("infer 2 train\n"));
    }
    char full[PATH_BYTES], trace[PATH_BYTES], ckpt[PATH_BYTES];
    unlink(rows);
    prepare(text, "outputs", full, trace, ckpt);
    CHECK(at && rename(rows, kept) == 0, "the uninterrupted run wrote no %s", rows);
    static const uint64_t stop_at[2] = {105, 100};  // inside the infer row (104, 105), before it
    for (int i = 0; i < 2; i++) {
        unlink(ckpt);
        unlink(trace);
        job a = run_saving(text, BACKEND_REF, trace, ckpt, 0, stop_at[i], 0);
        if (a.status == QT_OK) {
            uint64_t expected = i == 0 ? 106 : 100;
            CHECK(the_run.state.step == expected, "stop at %llu: stopped at step %llu, expected "
                  "%llu", (unsigned long long)stop_at[i],
                  (unsigned long long)the_run.state.step, (unsigned long long)expected);
            job_close(&a);
        }
        bool written = access(rows, F_OK) == 0;
        CHECK(written == (i == 0) && (!written || same_bytes(rows, kept)), "stop at %llu: the "
              "file is %s", (unsigned long long)stop_at[i], written ? "not the whole run's" :
              "missing");
        run_resumed(text, BACKEND_REF, trace, ckpt);
        CHECK(same_file(full, trace), "stop at %llu: traces differ",
              (unsigned long long)stop_at[i]);
        CHECK(same_bytes(rows, kept), "stop at %llu: after the resumed run the file is not the "
              "whole run's", (unsigned long long)stop_at[i]);
        unlink(rows);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Refusals

// A checkpoint of the bf16 resume recipe after `stop` steps, at path.
static bool make_checkpoint(const char *path, uint64_t stop) {
    unlink(path);
    job a = {.text = resume_text("bf16", NULL), .kind = BACKEND_REF};
    a.options.save_path = path;
    a.options.stop_at = stop;
    job_run(&a);
    job_expect_ok(&a, "checkpoint");
    return a.status == QT_OK;
}

// Resumes the bf16 recipe from path; the status and message.
static qt_status try_resume(const char *text, const char *path, run_options *o, char *message,
                            size_t bytes) {
    job j = {.text = text ? text : resume_text("bf16", NULL), .kind = BACKEND_REF,
             .resume = path};
    if (o) j.options = *o;
    job_run(&j);
    snprintf(message, bytes, "%s", j.message);
    return j.status;
}

static void test_refuse_foreign(void) {
    test_begin("resume_refuses_other_recipe_format_seed_and_schedule");
    char ckpt[128], message[QT_ERROR_MESSAGE_MAX];
    temp_path(ckpt, sizeof ckpt, "foreign.ckpt");
    make_checkpoint(ckpt, 120);
    qt_status st = try_resume(resume_text("nvfp4", NULL), ckpt, NULL, message, sizeof message);
    CHECK(st == QT_ERR_MISMATCH && strstr(message, "another recipe") &&
              strstr(message, "other format") && strstr(message, "fc1.weight"),
          "nvfp4 run: %s", message);
    run_options o = {0};
    o.seed_given = true;
    o.seed = 99;
    st = try_resume(NULL, ckpt, &o, message, sizeof message);
    CHECK(st == QT_ERR_MISMATCH && strstr(message, "seed 11") && strstr(message, "--seed 11"),
          "seed 99: %s", message);
    memset(&o, 0, sizeof o);
    o.steps_limit = 100;
    st = try_resume(NULL, ckpt, &o, message, sizeof message);
    CHECK(st == QT_ERR_MISMATCH && strstr(message, "schedule:"), "steps 100: %s", message);
    st = try_resume(NULL, "/nonexistent/x.ckpt", NULL, message, sizeof message);
    CHECK(st == QT_ERR_IO && strstr(message, "cannot open"), "missing file: %s", message);
    test_end();
}

// The part of the file a byte belongs to, as the refusal names it.
static const char *expected_part(const ckpt_table *t, uint64_t at) {
    static char part[96];
    const ckpt_header *h = &t->header;
    if (at < 8) return "not a qtrain checkpoint";
    if (at < 12) return "checkpoint format version";
    if (at < CKPT_HEADER_BYTES) return "header: bad checksum";
    if (at >= h->table_offset && at < h->file_bytes - 12) return "region table: bad checksum";
    if (at >= h->file_bytes - 12 && at < h->file_bytes - 8) return "file: bad checksum";
    if (at >= h->file_bytes - 8) return "trailer:";
    for (uint32_t i = 0; i < h->region_count; i++) {
        const ckpt_region *e = &t->regions[i];
        if (at >= e->offset && at < e->offset + e->bytes) {
            snprintf(part, sizeof part, "region '%s': bad checksum", e->name);
            return part;
        }
    }
    return "file: bad checksum";  // the zero gaps between regions
}

// A reader with memory for the table of the checkpoint at path (test code: malloc, kept).
static qt_status reader_open(ckpt_reader *rd, const char *path) {
    static void *storage;
    static uint64_t capacity;
    uint32_t regions = 0, params = 0;
    QT_TRY(ckpt_peek(path, &regions, &params));
    uint64_t bytes = ckpt_reader_bytes(regions, params);
    if (bytes > capacity) {
        free(storage);
        storage = aligned_alloc(64, (bytes + 63) / 64 * 64);
        capacity = bytes;
    }
    ckpt_reader_init(rd, storage, regions, params);
    return ckpt_open(rd, path);
}

static void test_refuse_damage(void) {
    test_begin("resume_refuses_every_flipped_byte_truncation_and_version");
    char ckpt[128], bad[128];
    temp_path(ckpt, sizeof ckpt, "good.ckpt");
    temp_path(bad, sizeof bad, "bad.ckpt");
    make_checkpoint(ckpt, 102);
    size_t n = 0;
    uint8_t *good = file_bytes(ckpt, &n);
    static ckpt_reader rd;
    CHECK(good && reader_open(&rd, ckpt) == QT_OK, "cannot read %s: %s", ckpt,
          qt_error_message());
    ckpt_close(&rd);
    if (!good) {
        test_end();
        return;
    }
    // One bound run takes every damaged file in turn (a failed load leaves it unusable, and
    // nothing here runs it).
    job j = {.text = resume_text("bf16", NULL), .kind = BACKEND_REF, .keep = true};
    j.options.checkpoints = true;
    j.options.stop_at = 1;
    job_run(&j);
    job_expect_ok(&j, "the vehicle run");
    uint8_t *copy = malloc(n + 1);
    uint32_t wrong = 0;
    for (size_t at = 0; at < n && j.status == QT_OK; at++) {
        memcpy(copy, good, n);
        uint8_t flip = (uint8_t)(0x5a ^ (at & 0xff));
        copy[at] ^= flip ? flip : 1;
        file_put(bad, copy, n);
        qt_status st = run_resume(&the_run, bad);
        const char *want = expected_part(&rd.table, at);
        if (st == QT_OK || !strstr(qt_error_message(), want)) {
            if (++wrong <= 4) {
                CHECK(false, "byte %zu flipped: %s: '%s', expected '%s'", at,
                      qt_status_name(st), qt_error_message(), want);
            }
        }
    }
    CHECK(wrong == 0, "%u of %zu flipped bytes were not refused as expected", wrong, n);
    // Truncations (the magic alone cannot be told from other files) and appended bytes.
    const size_t lengths[] = {0, 5, 8, 100, 255, 256, 1000, n / 2, n - 16, n - 1};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0] && j.status == QT_OK; i++) {
        file_put(bad, good, lengths[i]);
        qt_status st = run_resume(&the_run, bad);
        const char *want = lengths[i] < 8 ? "not a qtrain checkpoint" : "truncated";
        CHECK(st == QT_ERR_INPUT && strstr(qt_error_message(), want),
              "%zu of %zu bytes: '%s', expected '%s'", lengths[i], n, qt_error_message(), want);
    }
    memcpy(copy, good, n);
    copy[n] = 0;
    file_put(bad, copy, n + 1);
    qt_status st = run_resume(&the_run, bad);
    CHECK(st == QT_ERR_INPUT && strstr(qt_error_message(), "bytes after the end"), "%s",
          qt_error_message());
    // Another version: a valid file of a format this qtrain does not read.
    memcpy(copy, good, n);
    uint32_t version = 2;
    memcpy(copy + 8, &version, 4);
    file_put(bad, copy, n);
    st = run_resume(&the_run, bad);
    CHECK(st == QT_ERR_INPUT && strstr(qt_error_message(), "version 2; this qtrain reads "
                                                           "version 1"), "%s",
          qt_error_message());
    if (j.status == QT_OK) job_close(&j);
    free(copy);
    free(good);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Crash safety

// In the child: dies (SIGKILL) at the kill_at-th write of the save, or at a phase.
typedef struct kill_point {
    uint32_t write_index;  // 1-based; 0 = a phase instead
    ckpt_phase phase;
    uint32_t writes;       // counted so far
} kill_point;

static void kill_hook(void *ctx, ckpt_phase phase, uint64_t bytes) {
    kill_point *k = ctx;
    (void)bytes;
    if (phase == CKPT_PHASE_WRITTEN && ++k->writes == k->write_index) kill(getpid(), SIGKILL);
    if (k->write_index == 0 && phase == k->phase) kill(getpid(), SIGKILL);
}

// Saves the bound run to path in a child killed at the point; true when it was killed. The
// child's temporary file is path.tmp-PID (runtime/io/atomic_file.h): its name goes to tmp.
static bool save_killed(const char *path, kill_point point, char *tmp, size_t tmp_bytes) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        the_run.options.ckpt_hook = kill_hook;
        the_run.options.ckpt_hook_ctx = &point;
        run_save(&the_run, path);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    snprintf(tmp, tmp_bytes, "%s.tmp-%ld", path, (long)pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// Whether path is a complete checkpoint at `step` (every CRC checked).
static bool loads_at(const char *path, uint64_t step) {
    static ckpt_reader rd;
    static uint8_t buffer[1 << 16];
    bool ok = reader_open(&rd, path) == QT_OK &&
              ckpt_read_data(&rd, buffer, sizeof buffer, NULL, NULL) == QT_OK;
    ckpt_close(&rd);
    return ok && rd.table.header.step == step;
}

static void test_killed_writer(void) {
    test_begin("save_killed_at_every_write_keeps_the_previous_checkpoint");
    const char *text = resume_text("mxfp8", NULL);
    char full[PATH_BYTES], trace[PATH_BYTES], ckpt[PATH_BYTES], tmp[PATH_BYTES + 32];
    uint64_t digest = prepare(text, "crash", full, trace, ckpt);
    // The previous checkpoint at step 30; small chunks make many writes.
    job a = job_of(text, BACKEND_REF, trace);
    a.options.save_path = ckpt;
    a.options.stop_at = 30;
    a.options.ckpt_chunk_bytes = 256;
    job_run(&a);
    job_expect_ok(&a, "the first run");
    size_t n = 0;
    uint8_t *previous = file_bytes(ckpt, &n);
    // On to step 70 without saving, then saves killed at every write.
    job b = {.text = text, .kind = BACKEND_REF, .resume = ckpt, .keep = true};
    b.options = a.options;
    b.options.save_path = NULL;
    b.options.checkpoints = true;
    b.options.stop_at = 70;
    job_run(&b);
    job_expect_ok(&b, "second run");
    uint32_t points = 0, tmp_complete_at = 0;
    for (uint32_t w = 1; b.status == QT_OK && previous; w++) {
        kill_point k = {w, CKPT_PHASE_WRITTEN, 0};
        if (!save_killed(ckpt, k, tmp, sizeof tmp)) {
            unlink(tmp);
            break;  // the save wrote fewer than w times and finished
        }
        points++;
        size_t m = 0;
        uint8_t *now = file_bytes(ckpt, &m);
        CHECK(now && m == n && memcmp(now, previous, n) == 0,
              "killed at write %u: the previous checkpoint changed", w);
        free(now);
        CHECK(loads_at(ckpt, 30), "killed at write %u: the previous checkpoint does not load",
              w);
        // The temporary file is complete only after the last write, and refused before.
        if (!tmp_complete_at && access(tmp, F_OK) == 0 && loads_at(tmp, 70)) {
            tmp_complete_at = w;
        }
        unlink(tmp);  // a killed save's leftover (each save makes its own)
    }
    CHECK(points > 40 && tmp_complete_at == points, "%u kill points; PATH.tmp-PID loaded after "
          "write %u", points, tmp_complete_at);
    if (previous) file_put(ckpt, previous, n);  // the save that was not killed replaced it
    // Killed after the fsync, before the rename: still the previous one.
    kill_point synced = {0, CKPT_PHASE_SYNCED, 0};
    CHECK(b.status == QT_OK && save_killed(ckpt, synced, tmp, sizeof tmp) && loads_at(ckpt, 30),
          "killed after the fsync: the previous checkpoint does not load");
    unlink(tmp);
    // Killed after the rename: the new one, complete.
    kill_point renamed = {0, CKPT_PHASE_DONE, 0};
    CHECK(b.status == QT_OK && save_killed(ckpt, renamed, tmp, sizeof tmp) && loads_at(ckpt, 70),
          "killed after the rename: the new checkpoint does not load");
    if (b.status == QT_OK) job_close(&b);
    // Both checkpoints resume bitwise, continuing the same trace file.
    char old_ckpt[128];
    temp_path(old_ckpt, sizeof old_ckpt, "crash_30.ckpt");
    file_put(old_ckpt, previous, n);
    const char *from[2] = {old_ckpt, ckpt};
    for (int i = 0; i < 2; i++) {
        job c = run_resumed(text, BACKEND_REF, trace, from[i]);
        CHECK(same_file(full, trace), "resumed from %s: traces differ", from[i]);
        CHECK(c.digest == digest, "resumed from %s: final state differs", from[i]);
    }
    free(previous);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Export

// A small JSON reader for the safetensors header: objects, arrays, strings, integers.
typedef enum json_type { JSON_OBJECT, JSON_ARRAY, JSON_STRING, JSON_NUMBER } json_type;

typedef struct json_node {
    json_type type;
    char key[128];      // inside an object
    char text[256];     // a string's value
    double number;
    int first, next;    // children, siblings; -1: none
} json_node;

#define JSON_NODES_MAX 4096
static json_node json_nodes[JSON_NODES_MAX];
static int json_count;

static void json_space(const char **p) {
    while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r') (*p)++;
}

static bool json_string(const char **p, char *out, size_t bytes) {
    if (**p != '"') return false;
    size_t n = 0;
    for ((*p)++; **p && **p != '"'; (*p)++) {
        char c = **p;
        if (c == '\\') {
            (*p)++;
            c = **p == 'n' ? '\n' : **p;
            if (**p == 'u') {  // the writer escapes control bytes only
                c = (char)strtol(*p + 1, NULL, 16);
                *p += 4;
            }
        }
        if (n + 1 < bytes) out[n++] = c;
    }
    out[n] = '\0';
    if (**p != '"') return false;
    (*p)++;
    return true;
}

static int json_value(const char **p);

static int json_children(const char **p, json_node *parent, char close, bool keys) {
    int last = -1;
    (*p)++;
    json_space(p);
    while (**p && **p != close) {
        char key[128] = "";
        if (keys) {
            if (!json_string(p, key, sizeof key)) return -1;
            json_space(p);
            if (*(*p)++ != ':') return -1;
        }
        int child = json_value(p);
        if (child < 0) return -1;
        snprintf(json_nodes[child].key, sizeof json_nodes[child].key, "%s", key);
        if (last < 0) parent->first = child;
        else json_nodes[last].next = child;
        last = child;
        json_space(p);
        if (**p == ',') (*p)++;
        json_space(p);
    }
    if (**p != close) return -1;
    (*p)++;
    return 0;
}

static int json_value(const char **p) {
    json_space(p);
    if (json_count == JSON_NODES_MAX) return -1;
    int index = json_count++;
    json_node *v = &json_nodes[index];
    memset(v, 0, sizeof *v);
    v->first = v->next = -1;
    if (**p == '{' || **p == '[') {
        v->type = **p == '{' ? JSON_OBJECT : JSON_ARRAY;
        return json_children(p, v, **p == '{' ? '}' : ']', v->type == JSON_OBJECT) < 0 ? -1
                                                                                      : index;
    }
    if (**p == '"') {
        v->type = JSON_STRING;
        return json_string(p, v->text, sizeof v->text) ? index : -1;
    }
    char *end = NULL;
    v->type = JSON_NUMBER;
    v->number = strtod(*p, &end);
    if (end == *p) return -1;
    *p = end;
    return index;
}

static const json_node *json_get(const json_node *object, const char *key) {
    for (int i = object->first; i >= 0; i = json_nodes[i].next) {
        if (strcmp(json_nodes[i].key, key) == 0) return &json_nodes[i];
    }
    return NULL;
}

typedef struct st_tensor {
    char name[128], dtype[256];
    uint64_t shape[4], rank, begin, end;
} st_tensor;

static uint64_t st_dtype_bytes(const char *dtype) {
    static const char *const names[] = {"F64", "I64", "U64", "F32", "I32", "U32", "BF16", "F16",
                                        "I16", "U16", "F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL"};
    static const uint64_t bytes[] = {8, 8, 8, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(dtype, names[i]) == 0) return bytes[i];
    }
    return 0;
}

// Checks a file against the safetensors layout: the 8-byte little-endian header length, the
// JSON header (padded with spaces to a multiple of 8), each tensor's dtype, shape and
// data_offsets, the offsets contiguous from 0 in order to the end of the file. Fills tensors
// (sorted by offset) and returns the metadata object, or NULL.
static const json_node *st_check(const uint8_t *file, size_t n, st_tensor *tensors,
                                 uint32_t *count, uint64_t *data_start) {
    static char header[1 << 20];
    uint64_t length = 0;
    for (int i = 7; i >= 0 && n >= 8; i--) length = length << 8 | file[i];
    CHECK(n >= 8 && length <= n - 8 && length < sizeof header && length % 8 == 0,
          "header length %llu in a file of %zu bytes", (unsigned long long)length, n);
    if (n < 8 || length > n - 8 || length >= sizeof header) return NULL;
    memcpy(header, file + 8, length);
    header[length] = '\0';
    const char *p = header;
    json_count = 0;
    int root = json_value(&p);
    while (*p == ' ') p++;  // the padding: spaces only
    CHECK(root == 0 && json_nodes[0].type == JSON_OBJECT && *p == '\0',
          "the header is not one JSON object padded with spaces");
    if (root != 0) return NULL;
    *count = 0;
    const json_node *metadata = NULL;
    for (int i = json_nodes[0].first; i >= 0; i = json_nodes[i].next) {
        const json_node *v = &json_nodes[i];
        if (strcmp(v->key, "__metadata__") == 0) {
            metadata = v;
            continue;
        }
        st_tensor *t = &tensors[(*count)++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", v->key);
        const json_node *dtype = json_get(v, "dtype"), *shape = json_get(v, "shape");
        const json_node *offsets = json_get(v, "data_offsets");
        CHECK(dtype && shape && offsets && st_dtype_bytes(dtype->text) > 0, "tensor %s: fields",
              t->name);
        if (!dtype || !shape || !offsets || offsets->first < 0) return NULL;
        snprintf(t->dtype, sizeof t->dtype, "%s", dtype->text);
        uint64_t elements = 1;
        for (int d = shape->first; d >= 0 && t->rank < 4; d = json_nodes[d].next) {
            t->shape[t->rank++] = (uint64_t)json_nodes[d].number;
            elements *= (uint64_t)json_nodes[d].number;
        }
        t->begin = (uint64_t)json_nodes[offsets->first].number;
        t->end = (uint64_t)json_nodes[json_nodes[offsets->first].next].number;
        CHECK(t->end - t->begin == elements * st_dtype_bytes(t->dtype),
              "tensor %s: %llu bytes for %llu elements of %s", t->name,
              (unsigned long long)(t->end - t->begin), (unsigned long long)elements, t->dtype);
    }
    for (uint32_t i = 1; i < *count; i++) {  // in order of their offsets
        for (uint32_t j = i; j > 0 && tensors[j].begin < tensors[j - 1].begin; j--) {
            st_tensor swap = tensors[j];
            tensors[j] = tensors[j - 1];
            tensors[j - 1] = swap;
        }
    }
    uint64_t at = 0;
    for (uint32_t i = 0; i < *count; i++) {
        CHECK(tensors[i].begin == at, "tensor %s starts at %llu, expected %llu", tensors[i].name,
              (unsigned long long)tensors[i].begin, (unsigned long long)at);
        at = tensors[i].end;
    }
    CHECK(8 + length + at == n, "the data ends at %llu, the file at %zu",
          (unsigned long long)(8 + length + at), n);
    *data_start = 8 + length;
    return metadata;
}

static const st_tensor *st_find(const st_tensor *tensors, uint32_t count, const char *name) {
    for (uint32_t i = 0; i < count; i++) {
        if (strcmp(tensors[i].name, name) == 0) return &tensors[i];
    }
    return NULL;
}

static const char *st_meta(const json_node *metadata, const char *key) {
    const json_node *v = metadata ? json_get(metadata, key) : NULL;
    return v && v->type == JSON_STRING ? v->text : "";
}

// The exported weights are the masters without their padding columns.
static void check_export_masters(const uint8_t *file, uint64_t data_start, const st_tensor *ts,
                                 uint32_t count) {
    const model *m = &the_run.model;
    for (uint32_t i = 0; i < m->param_count; i++) {
        const model_param *p = &m->params[i];
        char name[64];
        snprintf(name, sizeof name, "%s", p->name);
        const st_tensor *t = st_find(ts, count, name);
        CHECK(t && strcmp(t->dtype, "F32") == 0, "no F32 tensor %s", name);
        if (!t) continue;
        bool weight = p->quantizer >= 0;
        CHECK(weight ? t->rank == 2 && t->shape[0] == p->rows && t->shape[1] == p->cols_valid
                     : t->rank == 1 && t->shape[0] == p->cols,
              "%s: shape [%llu][%llu]", name, (unsigned long long)t->shape[0],
              (unsigned long long)t->shape[1]);
        float *master = malloc((uint64_t)p->rows * p->cols * 4);
        backend_read(the_run.backend, master, (prog_ref){&the_run.dev, p->master, 0},
                     (uint64_t)p->rows * p->cols * 4);
        for (uint32_t r = 0; r < p->rows; r++) {
            const uint8_t *row = file + data_start + t->begin + (uint64_t)r * p->cols_valid * 4;
            CHECK(memcmp(row, master + (uint64_t)r * p->cols, p->cols_valid * 4) == 0,
                  "%s: row %u differs from the master", name, r);
        }
        free(master);
    }
}

static void test_export(void) {
    test_begin("export_safetensors_layout_masters_and_quantized_copies");
    const char *text = resume_text("nvfp4", NULL);
    char ckpt[128], out[128], quant[128];
    temp_path(ckpt, sizeof ckpt, "export.ckpt");
    temp_path(out, sizeof out, "export.safetensors");
    temp_path(quant, sizeof quant, "export_q.safetensors");
    unlink(ckpt);
    unlink(out);
    unlink(quant);
    job j = {.text = text, .kind = BACKEND_REF, .keep = true};
    j.options.save_path = ckpt;
    job_run(&j);
    job_expect_ok(&j, "run");
    static ckpt_reader rd;
    uint32_t regions = 0, params = 0;
    CHECK(ckpt_peek(ckpt, &regions, &params) == QT_OK, "peek: %s", qt_error_message());
    uint64_t bytes = export_memory_bytes(regions, params);
    void *buffer = aligned_alloc(256, (bytes + 255) / 256 * 256);
    qt_status st = export_safetensors(&rd, ckpt, out, false, false, buffer, bytes);
    CHECK(st == QT_OK, "export: %s", qt_error_message());
    st = export_safetensors(&rd, ckpt, quant, true, false, buffer, bytes);
    CHECK(st == QT_OK, "export --quantized: %s", qt_error_message());
    static st_tensor tensors[256];
    uint32_t count = 0;
    uint64_t data_start = 0;
    size_t n = 0;
    uint8_t *file = file_bytes(out, &n);
    const json_node *meta = file ? st_check(file, n, tensors, &count, &data_start) : NULL;
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)the_run.recipe_hash);
    CHECK(meta && strcmp(st_meta(meta, "qtrain.recipe_hash"), hash) == 0 &&
              strcmp(st_meta(meta, "qtrain.recipe"), "resume.recipe") == 0 &&
              strcmp(st_meta(meta, "qtrain.step"), "140") == 0 &&
              strcmp(st_meta(meta, "qtrain.train_step"), "130") == 0 &&
              strcmp(st_meta(meta, "qtrain.quantizer.fc1.weight"), "nvfp4 sr=0 2d=1 rht=0") == 0,
          "metadata: recipe '%s' hash '%s' step '%s'", st_meta(meta, "qtrain.recipe"),
          st_meta(meta, "qtrain.recipe_hash"), st_meta(meta, "qtrain.step"));
    CHECK(count == the_run.model.param_count, "%u tensors for %u parameters", count,
          the_run.model.param_count);
    if (meta) check_export_masters(file, data_start, tensors, count);
    free(file);
    file = file_bytes(quant, &n);
    meta = file ? st_check(file, n, tensors, &count, &data_start) : NULL;
    // fc1's weight: 32 x 16 padded to 32 columns; NVFP4 codes two per byte, E4M3 scales per 16.
    const st_tensor *codes = st_find(tensors, count, "fc1.weight.row_data");
    const st_tensor *scales = st_find(tensors, count, "fc1.weight.row_scale");
    CHECK(codes && strcmp(codes->dtype, "U8") == 0 && codes->shape[0] == 32 &&
              codes->shape[1] == 16 && scales && strcmp(scales->dtype, "F8_E4M3") == 0 &&
              scales->shape[0] == 32 && scales->shape[1] == 2 &&
              st_find(tensors, count, "fc1.weight.amax") &&
              strstr(st_meta(meta, "qtrain.tensor.fc1.weight.row_data"), "e2m1x2 [32][32]"),
          "quantized copies of fc1.weight");
    // The head's dgrad reads a columnwise copy, which the checkpoint carries; fc1, the first
    // layer, has no dgrad and no columnwise copy.
    CHECK(st_find(tensors, count, "head.weight.col_data") &&
              st_find(tensors, count, "head.weight.col_scale") &&
              !st_find(tensors, count, "fc1.weight.col_data") &&
              !st_find(tensors, count, "fc1.weight.col_scale"),
          "columnwise copies: the head's exported, fc1's absent");
    if (codes && meta) {
        const model_qstore *q = &the_run.model.params[0].weight;
        uint8_t device[512];
        backend_read(the_run.backend, device, q->row_data, 512);
        CHECK(memcmp(file + data_start + codes->begin, device, 512) == 0,
              "fc1.weight.row_data differs from the device's codes");
    }
    free(file);
    // An existing file is kept unless --force; a damaged checkpoint exports nothing.
    st = export_safetensors(&rd, ckpt, out, false, false, buffer, bytes);
    CHECK(st == QT_ERR_INPUT && strstr(qt_error_message(), "--force"), "overwrite: %s",
          qt_error_message());
    st = export_safetensors(&rd, ckpt, out, true, true, buffer, bytes);
    CHECK(st == QT_OK, "--force: %s", qt_error_message());
    file = file_bytes(ckpt, &n);
    if (file) file[rd.table.regions[0].offset] ^= 1;
    if (file) file_put(ckpt, file, n);
    free(file);
    unlink(quant);
    st = export_safetensors(&rd, ckpt, quant, false, false, buffer, bytes);
    CHECK(st == QT_ERR_INPUT && strstr(qt_error_message(), "bad checksum") &&
              access(quant, F_OK) != 0, "damaged checkpoint: %s", qt_error_message());
    free(buffer);
    if (j.status == QT_OK) job_close(&j);
    test_end();
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qtrain_test_checkpoint_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        printf("FAIL test_checkpoint: cannot create a temporary directory\n");
        return 1;
    }
    for (size_t i = 0; i < FORMATS_COUNT; i++) {
        TEST_UNIT(test_resume_bitwise(&formats[i], BACKEND_REF));
    }
    TEST_UNIT(test_resume_bitwise_resident(BACKEND_REF));
    TEST_UNIT(test_saves_change_nothing());
    TEST_UNIT(test_steps_cut());
    TEST_UNIT(test_golden_resume());
    TEST_UNIT(test_outputs_across_stops());
    TEST_UNIT(test_refuse_foreign());
    TEST_UNIT(test_refuse_damage());
    TEST_UNIT(test_killed_writer());
    TEST_UNIT(test_export());
    for (size_t i = 0; i < FORMATS_COUNT; i++) {
        TEST_UNIT(test_resume_bitwise(&formats[i], BACKEND_GPU));
    }
    TEST_UNIT(test_resume_bitwise_resident(BACKEND_GPU));
    TEST_UNIT(test_gpu_syncs());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", tmp_dir);
    return test_exit_code();
}
