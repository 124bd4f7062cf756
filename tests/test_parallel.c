// Data parallelism (runtime/parallel/parallel.h): the partition, the collectives' reference twin
// over threads (rank-order sums, in-place gathers), the batch split, the folds, and whole runs of N
// ranks as N threads on the reference backend: a 2-rank run against the 1-rank run of the same
// recipe in every format (within the stated tolerance per step), two 2-rank runs (identical
// records), the same weights on every rank, the skip decision on every rank, each rank's smaller
// arena, eval rows (alone on 1, 2 and 4 ranks, and between train steps) and infer rows (rank 0's
// files of the whole batch) against one rank, and the refusals. With 2 GPUs (and NCCL): the same
// runs as processes, one per GPU (this program re-executed as its workers), graphs and eager,
// and no synchronization added.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/backend/capture.h"  // capture_collective_alone: the ranks agree
#include "runtime/driver/driver.h"    // driver_load, driver_sync_total
#include "tests/files.h"              // tmp_dir_make, tmp_path, file_read
#include "runtime/driver/nccl_lib.h"  // nccl_load, ncclGetUniqueId: the workers' id
#include "runtime/ref/ref.h"          // ref_qt_dp_collective
#include "tests/rig.h"                // rig: a backend, its arenas and one program
#include "runtime/run/checkpoint.h"   // ckpt_open: the tables of two checkpoints
#include "runtime/run/run.h"
#include "tests/test.h"

#define RECIPE_TEXT_MAX 8192
#define STEPS_MAX 512

// ---------------------------------------------------------------------------------------------
// Partition

static void test_partition(void) {
    test_begin("partition_balances_whole_tensors_by_elements");
    const uint64_t elems[] = {100, 50, 50, 10, 10, 7};
    uint32_t owner[6];
    dp_partition(elems, 6, 2, owner);
    const uint32_t expected[6] = {0, 1, 1, 0, 1, 0};  // largest first, ties to the lower rank
    uint64_t load[2] = {0, 0};
    for (int i = 0; i < 6; i++) {
        CHECK(owner[i] == expected[i], "param %d owned by %u, expected %u", i, owner[i],
              expected[i]);
        load[owner[i]] += elems[i];
    }
    CHECK(load[0] == 117 && load[1] == 110, "loads %llu %llu", (unsigned long long)load[0],
          (unsigned long long)load[1]);
    // Every rank owns one when there are exactly as many tensors as ranks, whatever the sizes.
    const uint64_t skewed[] = {1000000, 1, 1};
    uint32_t o3[3];
    dp_partition(skewed, 3, 3, o3);
    CHECK(o3[0] != o3[1] && o3[1] != o3[2] && o3[0] != o3[2], "owners %u %u %u", o3[0], o3[1],
          o3[2]);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The collectives' twin: one program per rank, run by one thread per rank

#define COLL_RANKS 3
#define COLL_N 4

typedef struct coll_rank {
    rig rig;
    dp_comm comm;
    arena_handle a, b, gathered, order;
} coll_rank;

static coll_rank coll[COLL_RANKS];

static void *coll_thread(void *ctx) {
    coll_rank *c = ctx;
    if (backend_run(&c->rig.be, &c->rig.prog) != QT_OK) abort();
    return NULL;
}

static float *coll_f32(coll_rank *c, arena_handle h) {
    return (float *)(uintptr_t)arena_address(&c->rig.dev, h);
}

static void test_collectives(void) {
    test_begin("collectives_twin_reduces_in_rank_order_on_threads");
    dp_ref_group group;
    CHECK(dp_ref_group_init(&group, COLL_RANKS) == QT_OK, "%s", qt_error_message());
    const char *why = NULL;
    for (uint32_t r = 0; r < COLL_RANKS; r++) {
        coll_rank *c = &coll[r];
        CHECK(rig_open(&c->rig, BACKEND_REF, &why), "%s", why ? why : "");
        dp_comm_open_ref(&c->comm, &group, r);
        c->a = rig_reserve(&c->rig, "a", COLL_N * 4);
        c->b = rig_reserve(&c->rig, "b", COLL_N * 4);
        c->gathered = rig_reserve(&c->rig, "gathered", COLL_RANKS * COLL_N * 4);
        c->order = rig_reserve(&c->rig, "order", 16);
        prog_ref a = rig_ref(&c->rig, c->a, 0), b = rig_ref(&c->rig, c->b, 0);
        prog_ref g = rig_ref(&c->rig, c->gathered, 0);
        prog_ref mine = rig_ref(&c->rig, c->gathered, (uint64_t)r * COLL_N * 4);
        prog_ref order = rig_ref(&c->rig, c->order, 0);
        // 1. a: sum into rank 1; b: max over all, in place, in one group.
        op_dp_item first[2] = {
            {DP_COLL_REDUCE, DP_DTYPE_F32, DP_OP_SUM, 1, a, a, COLL_N},
            {DP_COLL_ALL_REDUCE, DP_DTYPE_F32, DP_OP_MAX, 0, b, b, COLL_N}};
        CHECK(op_dp_collective(&c->rig.prog, "first", &c->comm, order, first, 2) == QT_OK, "%s",
              qt_error_message());
        // 2. every rank's share gathered in place; 3. rank 2's b broadcast into a.
        op_dp_item gather = {DP_COLL_ALL_GATHER, DP_DTYPE_F32, DP_OP_NONE, 0, mine, g, COLL_N};
        CHECK(op_dp_collective(&c->rig.prog, "gather", &c->comm, order, &gather, 1) == QT_OK,
              "%s", qt_error_message());
        op_dp_item bcast = {DP_COLL_BROADCAST, DP_DTYPE_U8, DP_OP_NONE, 2, b, a, COLL_N * 4};
        CHECK(op_dp_collective(&c->rig.prog, "broadcast", &c->comm, order, &bcast, 1) == QT_OK,
              "%s", qt_error_message());
        rig_bind(&c->rig);
        float *va = coll_f32(c, c->a), *vb = coll_f32(c, c->b), *vg = coll_f32(c, c->gathered);
        // Element 0 of the sum is 1e8 + 1 - 1e8: 0 in rank order, 1 in any order that adds
        // rank 2's term before rank 1's.
        const float terms[COLL_RANKS] = {1e8f, 1.0f, -1e8f};
        for (int i = 0; i < COLL_N; i++) {
            va[i] = i == 0 ? terms[r] : (float)(r + 1) * (float)(i + 1);
            vb[i] = (float)((r * 7 + (uint32_t)i * 3) % 5);
            vg[r * COLL_N + (uint32_t)i] = (float)(100 * r + (uint32_t)i);
        }
    }
    pthread_t threads[COLL_RANKS];
    for (uint32_t r = 0; r < COLL_RANKS; r++) {
        pthread_create(&threads[r], NULL, coll_thread, &coll[r]);
    }
    for (uint32_t r = 0; r < COLL_RANKS; r++) pthread_join(threads[r], NULL);
    for (uint32_t r = 0; r < COLL_RANKS; r++) {
        coll_rank *c = &coll[r];
        float *va = coll_f32(c, c->a), *vb = coll_f32(c, c->b), *vg = coll_f32(c, c->gathered);
        for (int i = 0; i < COLL_N; i++) {
            float max = 0;
            for (uint32_t q = 0; q < COLL_RANKS; q++) {
                float x = (float)((q * 7 + (uint32_t)i * 3) % 5);
                max = x > max ? x : max;
            }
            CHECK(vb[i] == max, "rank %u: max[%d] %g, expected %g", r, i, (double)vb[i],
                  (double)max);
            // a was overwritten by the broadcast of rank 2's b (the maxima) on every rank.
            CHECK(va[i] == max, "rank %u: broadcast[%d] %g, expected %g", r, i, (double)va[i],
                  (double)max);
            for (uint32_t q = 0; q < COLL_RANKS; q++) {
                CHECK(vg[q * COLL_N + (uint32_t)i] == (float)(100 * q + (uint32_t)i),
                      "rank %u: gathered[%u][%d] %g", r, q, i, (double)vg[q * COLL_N + i]);
            }
        }
    }
    for (uint32_t r = 0; r < COLL_RANKS; r++) rig_close(&coll[r].rig);
    dp_ref_group_destroy(&group);
    test_end();
}

// The reduce alone, whose result the broadcast above overwrites: sums in rank order.
static void test_reduce_order(void) {
    test_begin("collectives_twin_sum_is_in_rank_order");
    dp_ref_group group;
    CHECK(dp_ref_group_init(&group, COLL_RANKS) == QT_OK, "%s", qt_error_message());
    const char *why = NULL;
    const float terms[COLL_RANKS] = {1e8f, 1.0f, -1e8f};
    for (uint32_t r = 0; r < COLL_RANKS; r++) {
        coll_rank *c = &coll[r];
        CHECK(rig_open(&c->rig, BACKEND_REF, &why), "%s", why ? why : "");
        dp_comm_open_ref(&c->comm, &group, r);
        c->a = rig_reserve(&c->rig, "a", COLL_N * 4);
        c->order = rig_reserve(&c->rig, "order", 16);
        prog_ref a = rig_ref(&c->rig, c->a, 0);
        op_dp_item sum = {DP_COLL_ALL_REDUCE, DP_DTYPE_F32, DP_OP_SUM, 0, a, a, COLL_N};
        CHECK(op_dp_collective(&c->rig.prog, "sum", &c->comm, rig_ref(&c->rig, c->order, 0),
                               &sum, 1) == QT_OK, "%s", qt_error_message());
        rig_bind(&c->rig);
        float *va = coll_f32(c, c->a);
        for (int i = 0; i < COLL_N; i++) va[i] = i == 0 ? terms[r] : (float)(r + i);
    }
    pthread_t threads[COLL_RANKS];
    for (uint32_t r = 0; r < COLL_RANKS; r++) {
        pthread_create(&threads[r], NULL, coll_thread, &coll[r]);
    }
    for (uint32_t r = 0; r < COLL_RANKS; r++) pthread_join(threads[r], NULL);
    for (uint32_t r = 0; r < COLL_RANKS; r++) {
        float *va = coll_f32(&coll[r], coll[r].a);
        CHECK(va[0] == 0.0f, "rank %u: (1e8 + 1) - 1e8 gave %g: not rank order", r,
              (double)va[0]);
        for (int i = 1; i < COLL_N; i++) {
            CHECK(va[i] == (float)(3 * i + 3), "rank %u: sum[%d] %g", r, i, (double)va[i]);
        }
    }
    for (uint32_t r = 0; r < COLL_RANKS; r++) rig_close(&coll[r].rig);
    dp_ref_group_destroy(&group);
    test_end();
}

// One rank: every collective is a copy (the twin called on its args directly).
static void test_single_rank(void) {
    test_begin("collectives_twin_one_rank_copies");
    dp_comm one;
    dp_comm_single(&one);
    float send[4] = {1, 2, 3, 4}, recv[4] = {0};
    dp_collective_args a;
    memset(&a, 0, sizeof a);
    a.comm = (uint64_t)(uintptr_t)&one;
    a.items = 1;
    for (uint8_t kind = DP_COLL_REDUCE; kind <= DP_COLL_ALL_REDUCE; kind++) {
        memset(recv, 0, sizeof recv);
        a.item[0] = (dp_item){(uint64_t)(uintptr_t)send, (uint64_t)(uintptr_t)recv, 4, kind,
                              DP_DTYPE_F32, DP_OP_SUM, 0, 0};
        launch_shape shape = {{1, 1, 1}, {1, 1, 1}, 0};
        ref_qt_dp_collective(&a, &shape);
        CHECK(memcmp(send, recv, sizeof send) == 0, "kind %u: not a copy", kind);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Folds and the batch split

static void test_folds(void) {
    test_begin("folds_norm_stats_and_loss_share");
    qt_gnorm_result one[1] = {{3.0e-3f, 0, 0, 0}}, out;
    qt_dp_gnorm_fold(one, 1, 1.0f, &out);
    CHECK(out.norm == one[0].norm && out.clip_factor == 1.0f && out.nonfinite == 0,
          "one rank: norm %a (expected %a), clip %g", (double)out.norm, (double)one[0].norm,
          (double)out.clip_factor);
    qt_gnorm_result two[2] = {{3.0f, 0, 0, 0}, {4.0f, 0, 1, 0}};
    qt_dp_gnorm_fold(two, 2, 1.0f, &out);
    CHECK(out.norm == 5.0f && out.nonfinite == 1, "norm %g nonfinite %u", (double)out.norm,
          out.nonfinite);
    CHECK(out.clip_factor == qt_gnorm_clip_factor(5.0f, 1.0f), "clip %g",
          (double)out.clip_factor);
    qt_loss_stats stats[2] = {{0, 6.0f, 4, 3}, {0, 2.0f, 1, 1}}, folded;
    qt_dp_stats_fold(stats, 2, 1, &folded);
    CHECK(folded.loss_sum == 8.0f && folded.valid == 5 && folded.correct == 4 &&
          folded.loss_mean == 8.0f / 5.0f, "stats %g %g %u %u", (double)folded.loss_mean,
          (double)folded.loss_sum, folded.valid, folded.correct);
    qt_dp_stats_fold(stats, 2, 3, &folded);  // mse: the mean over valid rows x cols
    CHECK(folded.loss_mean == 8.0f / 15.0f, "mse mean %g", (double)folded.loss_mean);
    CHECK(qt_dp_share(4, 8) == 0.5f && qt_dp_share(1, 5) == 0.2f && qt_dp_share(0, 0) == 0.0f,
          "shares");
    test_end();
}

static void test_batch_split(void) {
    test_begin("batch_split_takes_contiguous_shares_of_one_shuffle");
    enum { SAMPLES = 13, FEATURES = 3, BATCH = 8, WORLD = 2 };
    static float inputs[SAMPLES * FEATURES];
    static int32_t labels[SAMPLES];
    for (int i = 0; i < SAMPLES * FEATURES; i++) inputs[i] = (float)i;
    for (int i = 0; i < SAMPLES; i++) labels[i] = i % 4;
    data_set set = {0};
    set.info.samples = SAMPLES;
    set.info.features = FEATURES;
    set.info.outputs = 4;
    set.info.input_type = DATA_INPUT_F32;
    set.info.target_type = DATA_TARGET_LABEL;
    set.inputs_f32 = inputs;
    set.labels = labels;
    data_slot_layout whole = data_slot_plan(&set.info, BATCH, 0, false);
    data_slot_layout share = data_slot_plan(&set.info, BATCH / WORLD, 0, false);
    static uint32_t order[WORLD + 1][SAMPLES];
    data_feed plain, feeds[WORLD];
    data_feed_init(&plain, &set, BATCH, true, 5, order[WORLD]);
    for (uint32_t r = 0; r < WORLD; r++) {
        data_feed_init(&feeds[r], &set, BATCH, true, 5, order[r]);
        data_feed_share(&feeds[r], r, WORLD);
    }
    uint8_t *slot = aligned_alloc(256, whole.bytes), *part = aligned_alloc(256, share.bytes);
    // Two epochs: batches of 8 and 5 real rows each.
    for (int step = 0; step < 4; step++) {
        uint32_t rows = data_feed_next(&plain, &whole, slot);
        const data_slot_header *h = (const data_slot_header *)(void *)slot;
        CHECK(h->rows_global == rows, "step %d: plain rows_global %u, rows %u", step,
              h->rows_global, rows);
        for (uint32_t r = 0; r < WORLD; r++) {
            uint32_t got = data_feed_next(&feeds[r], &share, part);
            const data_slot_header *hp = (const data_slot_header *)(void *)part;
            uint32_t first = r * (BATCH / WORLD);
            uint32_t expect = rows <= first ? 0 : rows - first;
            if (expect > BATCH / WORLD) expect = BATCH / WORLD;
            CHECK(got == expect && hp->rows_valid == expect && hp->rows_global == rows,
                  "step %d rank %u: %u rows (header %u of %u), expected %u of %u", step, r, got,
                  hp->rows_valid, hp->rows_global, expect, rows);
            for (uint32_t i = 0; i < BATCH / WORLD; i++) {
                const float *x = (const float *)(void *)(part + share.inputs_offset) +
                                 i * share.stride;
                const float *y = (const float *)(void *)(slot + whole.inputs_offset) +
                                 (first + i) * whole.stride;
                int32_t lx = ((const int32_t *)(void *)(part + share.targets_offset))[i];
                int32_t ly = ((const int32_t *)(void *)(slot + whole.targets_offset))[first + i];
                CHECK(memcmp(x, y, FEATURES * sizeof(float)) == 0 && lx == ly,
                      "step %d rank %u row %u differs from row %u of the whole batch", step, r,
                      i, first + i);
            }
            CHECK(feeds[r].cursor.epoch == plain.cursor.epoch &&
                  feeds[r].cursor.position == plain.cursor.position, "cursors differ");
        }
    }
    free(slot);
    free(part);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Whole runs: ranks as threads on the reference backend

#define PASSES_MAX 8

// Rank 0's records: every train step's, every eval step's, and each eval pass as the summary
// counts it (its mean loss over the real rows, correct / real rows, the real rows).
typedef struct step_log {
    uint32_t count, evals, passes;
    float loss[STEPS_MAX], norm[STEPS_MAX];
    bool skipped[STEPS_MAX];
    float eval_loss[STEPS_MAX], eval_accuracy[STEPS_MAX];
    double pass_loss[PASSES_MAX], pass_accuracy[PASSES_MAX];
    uint64_t pass_samples[PASSES_MAX];
} step_log;

typedef struct rank_job {
    const char *name, *text;
    uint32_t rank, world;
    dp_ref_group *group;
    run_options options;
    const char *resume;                 // a checkpoint to resume from after run_bind
    step_log log;
    qt_status status;
    char message[QT_ERROR_MESSAGE_MAX];
    uint64_t weights_hash;              // every persistent weight region's bytes, FNV-1a
    uint64_t dev_bytes, master_optim_bytes;
} rank_job;

static void job_progress(void *ctx, const sched_progress *p) {
    step_log *log = ctx;
    if (p->mode == MODEL_MODE_EVAL && log->evals < STEPS_MAX) {
        log->eval_loss[log->evals] = p->record->loss;
        log->eval_accuracy[log->evals++] = p->record->accuracy;
        if (p->row_step == p->row_steps && log->passes < PASSES_MAX) {
            log->pass_loss[log->passes] = p->pass_loss;
            log->pass_accuracy[log->passes] = p->pass_accuracy;
            log->pass_samples[log->passes++] = p->pass_samples;
        }
    }
    if (p->mode != MODEL_MODE_TRAIN || log->count >= STEPS_MAX) return;
    log->loss[log->count] = p->record->loss;
    log->norm[log->count] = p->record->grad_norm;
    log->skipped[log->count] = (p->record->flags & QT_TRACE_FLAG_SKIPPED) != 0;
    log->count++;
}

static uint64_t fnv(uint64_t h, const uint8_t *bytes, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) h = (h ^ bytes[i]) * 0x100000001B3ull;
    return h;
}

static void *aligned(uint64_t bytes) { return aligned_alloc(256, (bytes / 256 + 1) * 256); }

static qt_status job_run(rank_job *j, run *r, recipe *rc, backend *b) {
    QT_TRY(recipe_parse(j->text, strlen(j->text), j->name, rc));
    run_options o = j->options;
    if (j->rank != 0) o.trace_path = NULL;  // rank 0 writes the files
    o.rank = j->rank;
    o.world = j->world;
    o.ref_group = j->group;
    uint64_t need = 0;
    QT_TRY(run_measure(r, rc, j->text, strlen(j->text), &o, &need));
    void *tables = aligned(need);
    qt_status status = run_plan(r, tables, need);
    uint64_t dev_bytes = 0, host_bytes = 0;
    run_memory_bytes(r, &dev_bytes, &host_bytes);
    void *dev = aligned(dev_bytes), *host = aligned(host_bytes);
    void *data = aligned(run_data_bytes(r));
    if (status == QT_OK) status = run_load(r, data, run_data_bytes(r));
    if (status == QT_OK) status = run_bind(r, b, dev, host);
    if (status == QT_OK && j->resume) status = run_resume(r, j->resume);
    if (status == QT_OK) {
        sched_summary sum;
        status = run_execute(r, j->rank == 0 ? job_progress : NULL, &j->log, &sum);
    }
    if (status == QT_OK && o.trace_path) status = run_end_trace(r);
    if (status == QT_OK) {
        j->dev_bytes = r->dev.bytes_total;
        uint64_t h = 0xCBF29CE484222325ull;
        for (arena_handle k = 0; k < r->dev.region_count; k++) {
            const arena_region *g = arena_region_get(&r->dev, k);
            if (!g->persistent) continue;
            if (g->category == ARENA_CAT_MASTER || g->category == ARENA_CAT_OPTIM) {
                j->master_optim_bytes += g->bytes;
            }
            if (g->category != ARENA_CAT_WEIGHTS) continue;
            h = fnv(h, (const uint8_t *)(uintptr_t)arena_address(&r->dev, k), g->bytes);
        }
        j->weights_hash = h;
    }
    run_close(r);
    free(tables);
    free(dev);
    free(host);
    free(data);
    return status;
}

static void *job_thread(void *ctx) {
    rank_job *j = ctx;
    run *r = aligned(sizeof(run));
    recipe *rc = aligned(sizeof(recipe));
    backend *b = aligned(sizeof(backend));
    backend_open_ref(b);
    j->status = job_run(j, r, rc, b);
    if (j->status != QT_OK) snprintf(j->message, sizeof j->message, "%s", qt_error_message());
    backend_close(b);
    free(r);
    free(rc);
    free(b);
    return NULL;
}

// The recipe run on `world` ranks (threads); jobs[0..world) get each rank's results.
static bool run_ranks_from(const char *name, const char *text, uint32_t world,
                           const run_options *options, const char *resume, rank_job *jobs) {
    dp_ref_group group;
    if (dp_ref_group_init(&group, world) != QT_OK) return false;
    pthread_t threads[DP_RANKS_MAX];
    for (uint32_t r = 0; r < world; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r] = (rank_job){.name = name, .text = text, .rank = r, .world = world,
                             .group = &group, .options = *options, .resume = resume};
        pthread_create(&threads[r], NULL, job_thread, &jobs[r]);
    }
    bool ok = true;
    for (uint32_t r = 0; r < world; r++) pthread_join(threads[r], NULL);
    for (uint32_t r = 0; r < world; r++) {
        CHECK(jobs[r].status == QT_OK, "%s rank %u of %u: %s: %s", name, r, world,
              qt_status_name(jobs[r].status), jobs[r].message);
        ok &= jobs[r].status == QT_OK;
    }
    dp_ref_group_destroy(&group);
    return ok;
}

static bool run_ranks(const char *name, const char *text, uint32_t world,
                      const run_options *options, rank_job *jobs) {
    return run_ranks_from(name, text, world, options, NULL, jobs);
}

// The recipe file's text with its `recipe = bf16` line made `recipe = SCHEME` (NULL: as it is);
// false when the file cannot be read or has no such line.
static bool recipe_text(const char *path, const char *scheme, char *out, size_t bytes) {
    size_t size = 0;
    char *text = file_read(path, &size);
    if (!text) return false;
    const char *line = strstr(text, "\nrecipe = bf16\n");  // the line, not a comment's words
    if (scheme && line) {
        snprintf(out, bytes, "%.*s\nrecipe = %s\n%s", (int)(line - text), text, scheme,
                 line + strlen("\nrecipe = bf16\n"));
    } else {
        snprintf(out, bytes, "%s", text);
    }
    free(text);
    return line != NULL || scheme == NULL;
}

// The tiny recipe in `scheme` with `weight_transpose = per_step`: its head's columnwise weight
// (the first layer has none) transposed in every step instead of stored.
static bool per_step_text(const char *scheme, char *out, size_t bytes) {
    static char tiny[RECIPE_TEXT_MAX];
    if (!recipe_text("tests/recipes/synthetic_tiny.recipe", scheme, tiny, sizeof tiny)) {
        return false;
    }
    const char *quant = strstr(tiny, "\n[quant]\n");
    if (!quant) return false;
    size_t head = (size_t)(quant - tiny) + strlen("\n[quant]\n");
    snprintf(out, bytes, "%.*sweight_transpose = per_step\n%s", (int)head, tiny, tiny + head);
    return true;
}

// The tolerance of a 2-rank run against the 1-rank run, per step, on the training loss relative
// to max(1, |loss|) (README.md states these numbers). The ranks' gradients are summed in another
// order than one GEMM over the whole batch, so the weights drift apart by rounding steps; where
// the forward pass of a share is the whole batch's rows (BF16, delayed scaling with the amaxes'
// maximum over the ranks, MXFP8 and FP8 block scaling, whose scales are local to rows or
// blocks) the loss stays within 1e-3 (the 1-rank norm also sums its dense weights' GEMM norm
// units, ptx/gemm.h, in another order than the ranks' shards). Per-tensor current scaling
// takes each rank's own amax of its activations, NVFP4 that and stochastic rounding keyed by the
// row's position in the rank's share, so their forward passes differ from the first step on.
static double tolerance_of(const char *scheme) {
    if (strcmp(scheme, "current") == 0) return 0.05;
    if (strcmp(scheme, "nvfp4") == 0) return 0.2;
    return 1e-3;
}

// |loss - reference| relative to max(1, |reference|): the measure the tolerances bound.
static double loss_difference(float loss, float reference) {
    return fabs((double)loss - reference) / fmax(1.0, fabs((double)reference));
}

static rank_job jobs_a[DP_RANKS_MAX], jobs_b[DP_RANKS_MAX], jobs_c[DP_RANKS_MAX], jobs_1[1];

// Begins case `what`_`scheme` with synthetic_tiny.recipe in that scheme read into text.
static void begin_scheme_case(const char *what, const char *scheme, char *text, size_t bytes) {
    static char name[96];
    snprintf(name, sizeof name, "%s_%s", what, scheme);
    test_begin(name);
    CHECK(recipe_text("tests/recipes/synthetic_tiny.recipe", scheme, text, bytes),
          "cannot read the recipe");
}

// The options of a run of `steps` train steps without the recipe's eval and infer rows.
static run_options train_steps_only(uint64_t steps) {
    run_options o = {0};
    o.steps_limit = steps;
    o.drop_eval = true;
    return o;
}

static void test_two_ranks(const char *scheme) {
    static char text[RECIPE_TEXT_MAX];
    begin_scheme_case("two_ranks_match_one_rank_and_repeat", scheme, text, sizeof text);
    run_options o = train_steps_only(60);
    if (!run_ranks("synthetic_tiny.recipe", text, 1, &o, jobs_1) ||
        !run_ranks("synthetic_tiny.recipe", text, 2, &o, jobs_a) ||
        !run_ranks("synthetic_tiny.recipe", text, 2, &o, jobs_b)) {
        test_end();
        return;
    }
    const step_log *one = &jobs_1[0].log, *a = &jobs_a[0].log, *b = &jobs_b[0].log;
    CHECK(one->count == 60 && a->count == 60 && b->count == 60, "steps %u %u %u", one->count,
          a->count, b->count);
    CHECK(memcmp(a, b, sizeof *a) == 0, "two 2-rank runs gave different records");
    double tol = tolerance_of(scheme), worst = 0;
    for (uint32_t s = 0; s < a->count && s < one->count; s++) {
        double rel = loss_difference(a->loss[s], one->loss[s]);
        worst = rel > worst ? rel : worst;
        CHECK(rel <= tol, "step %u: loss %.7g on 2 ranks, %.7g on 1 (%.3g > %.3g)", s,
              (double)a->loss[s], (double)one->loss[s], rel, tol);
        CHECK(a->skipped[s] == one->skipped[s], "step %u: skip differs", s);
    }
    CHECK(a->loss[0] == a->loss[0] && one->loss[0] != 0, "no losses");
    printf("  %s: worst relative loss difference 2 vs 1 rank %.3g (tolerance %.3g)\n", scheme,
           worst, tol);
    // Every rank ends with the same weights, in every usage (the owners' broadcasts).
    CHECK(jobs_a[0].weights_hash == jobs_a[1].weights_hash, "the ranks' weights differ");
    // ZeRO-1: each rank holds about half the masters and moments of the single rank.
    uint64_t ranks = jobs_a[0].master_optim_bytes + jobs_a[1].master_optim_bytes;
    CHECK(jobs_a[0].master_optim_bytes < jobs_1[0].master_optim_bytes &&
          jobs_a[1].master_optim_bytes < jobs_1[0].master_optim_bytes &&
          ranks >= jobs_1[0].master_optim_bytes,
          "masters and moments: ranks %llu + %llu, one rank %llu",
          (unsigned long long)jobs_a[0].master_optim_bytes,
          (unsigned long long)jobs_a[1].master_optim_bytes,
          (unsigned long long)jobs_1[0].master_optim_bytes);
    test_end();
}

// The index of the parameter named `name`, or UINT32_MAX.
static uint32_t param_index(const model *m, const char *name) {
    for (uint32_t i = 0; i < m->param_count; i++) {
        if (strcmp(m->params[i].name, name) == 0) return i;
    }
    return UINT32_MAX;
}

// What rank `rank` of 2 plans for its train step, checked without running it: every gradient's
// reduction is placed in the backward pass right after the layer that writes it (a graph starts
// its nodes about in capture order, so reductions placed after the backward pass started late),
// each reduction of an owned parameter followed by the norm's part over it; the optimizer's
// launches ordered one after another (each launch conflicts with the one before, so a graph
// cannot run them as parallel branches that all end together; rank 1 of the deeper model has
// four); weights broadcast in groups in which both ranks send (a group splits where its items
// exceed one NCCL group's); and no collective between the loss and the first reduction (the
// loss statistics are gathered with the gradient norms, one collective of two items: a gather
// after the loss waited for every rank's loss and held the ops captured after it). With
// largest_first the updates run the most elements first, else in parameter order. Into alone,
// one character per collective of the train program: '1' where it runs after the last wide GEMM
// (capture_collective_alone, which picks its communicator), else '0'.
#define PLAN_ALONE_MAX 256
static void plan_check(const char *text, uint32_t rank, bool largest_first, char *alone) {
    alone[0] = '\0';
    run *r = aligned(sizeof(run));
    recipe *rc = aligned(sizeof(recipe));
    memset(r, 0, sizeof *r);
    run_options o = {0};
    o.rank = rank;
    o.world = 2;
    o.update_order = largest_first ? RUN_UPDATE_ORDER_LARGEST_FIRST : RUN_UPDATE_ORDER_PARAMETERS;
    uint64_t need = 0;
    void *tables = NULL;
    qt_status status = recipe_parse(text, strlen(text), "synthetic_tiny.recipe", rc);
    if (status == QT_OK) status = run_measure(r, rc, text, strlen(text), &o, &need);
    if (status == QT_OK) status = run_plan(r, tables = aligned(need), need);
    CHECK(status == QT_OK, "rank %u: plan: %s", rank, qt_error_message());
    if (status == QT_OK) {
        const program *p = &r->programs[MODEL_MODE_TRAIN];
        uint32_t reduces = 0, norm_parts = 0, last_gemm = 0, first_reduce = UINT32_MAX;
        uint32_t adamw = 0, chained = 0, prev_adamw = UINT32_MAX, broadcasts = 0, both = 0;
        const char *first_collective = "";
        uint32_t norm_gather_items = 0;
        for (uint32_t i = 0; i < p->op_count; i++) {
            const prog_op *op = &p->ops[i];
            if (op->kernel == KERNEL_DP_COLLECTIVE) {
                const dp_collective_args *a = (const dp_collective_args *)(const void *)op->args;
                if (!*first_collective) first_collective = op->name;
                if (strcmp(op->name, "dp.grad_norm") == 0) norm_gather_items = a->items;
            }
            if (strstr(op->name, ".wgrad") || strstr(op->name, ".dgrad")) last_gemm = i;
            if (strncmp(op->name, "dp.reduce.", 10) == 0) {
                reduces++;
                if (first_reduce == UINT32_MAX) first_reduce = i;
            }
            norm_parts += strcmp(op->name, "grad_norm") == 0 && reduces > 0;
            if (op->kernel == KERNEL_OPTIM_ADAMW_MULTI) {
                adamw++;
                if (prev_adamw != UINT32_MAX) {
                    chained += prog_ops_conflict(&p->ops[prev_adamw], op);
                }
                prev_adamw = i;
            }
            if (strncmp(op->name, "dp.broadcast.", 13) != 0) continue;
            const dp_collective_args *a = (const dp_collective_args *)(const void *)op->args;
            bool roots[2] = {false, false};
            for (uint32_t k = 0; k < a->items; k++) roots[a->item[k].root & 1] = true;
            broadcasts++;
            both += roots[0] && roots[1];
        }
        const model *m = &r->model;
        uint32_t owned = 0;
        for (uint32_t i = 0; i < m->param_count; i++) owned += model_param_owned(m, i);
        // The updates' order: the init program describes each launch's parameter, in the
        // order of the launches (one parameter each).
        uint32_t described = 0, before = UINT32_MAX;
        for (uint32_t i = 0; i < r->init.op_count; i++) {
            const prog_op *op = &r->init.ops[i];
            if (op->kernel != KERNEL_OPTIM_DESCRIBE) continue;
            uint32_t param = param_index(m, op->name);
            CHECK(param != UINT32_MAX && model_param_owned(m, param), "rank %u: describes %s",
                  rank, op->name);
            if (param == UINT32_MAX) continue;
            if (before != UINT32_MAX) {
                uint64_t elems_before = (uint64_t)m->params[before].rows * m->params[before].cols;
                uint64_t elems = (uint64_t)m->params[param].rows * m->params[param].cols;
                bool ordered = largest_first ? elems_before >= elems : before < param;
                CHECK(ordered, "rank %u: update %u (%s) after %s: %s", rank, described,
                      op->name, m->params[before].name,
                      largest_first ? "not largest first" : "not in parameter order");
            }
            before = param;
            described++;
        }
        CHECK(described == owned && adamw == owned, "rank %u: %u updates described, %u "
              "launches, %u owned", rank, described, adamw, owned);
        CHECK(reduces == m->param_count && first_reduce < last_gemm,
              "rank %u: %u reductions of %u parameters, the first at op %u, the last backward "
              "GEMM at op %u", rank, reduces, m->param_count, first_reduce, last_gemm);
        CHECK(norm_parts == owned, "rank %u: %u norm parts after reductions, %u owned", rank,
              norm_parts, owned);
        CHECK(adamw >= 1 && chained == adamw - 1, "rank %u: %u of %u optimizer launches follow "
              "the one before", rank, chained, adamw - 1);
        CHECK(both >= 1, "rank %u: none of %u broadcast groups with both ranks sending", rank,
              broadcasts);
        CHECK(strncmp(first_collective, "dp.reduce.", 10) == 0 && norm_gather_items == 2,
              "rank %u: the first collective is %s, the norms' gather has %u items (the loss "
              "statistics belong in it)", rank, first_collective, norm_gather_items);
        capture_plan plan;
        capture_begin(&plan, p, true);
        uint32_t n = 0;
        for (uint32_t i = 0; i < p->op_count && n + 1 < PLAN_ALONE_MAX; i++) {
            if (capture_collective(&p->ops[i])) {
                alone[n++] = capture_collective_alone(&plan, i) ? '1' : '0';
            }
        }
        alone[n] = '\0';
        printf("  rank %u: %u ops, %u reductions (the first at op %u, the last backward GEMM "
               "at op %u), %u optimizer launches, %u broadcast groups, collectives alone %s\n",
               rank, p->op_count, reduces, first_reduce, last_gemm, adamw, broadcasts, alone);
    }
    run_close(r);
    free(tables);
    free(r);
    free(rc);
}

static void test_two_ranks_plan(void) {
    static char text[RECIPE_TEXT_MAX], deeper[RECIPE_TEXT_MAX];
    begin_scheme_case("two_ranks_overlap_their_collectives", "current", text, sizeof text);
    // Two hidden layers: five parameters, so that each rank updates at least two.
    const char *relu = strstr(text, "layer = relu\n");
    QT_ASSERT(relu != NULL);
    size_t head = (size_t)(relu - text) + strlen("layer = relu\n");
    snprintf(deeper, sizeof deeper, "%.*slayer = linear fc2 32 bias\nlayer = relu\n%s",
             (int)head, text, text + head);
    memcpy(text, deeper, sizeof text);
    for (int largest_first = 0; largest_first < 2; largest_first++) {
        // Both ranks send each collective through the same communicator, or they wait forever:
        // the same collectives run alone on both, and some do (the norm's gather at least).
        char alone[2][PLAN_ALONE_MAX];
        plan_check(text, 0, largest_first, alone[0]);
        plan_check(text, 1, largest_first, alone[1]);
        CHECK(strcmp(alone[0], alone[1]) == 0 && strchr(alone[0], '1') != NULL,
              "collectives alone: rank 0 '%s', rank 1 '%s'", alone[0], alone[1]);
    }
    test_end();
}

// Updates largest first, the broadcasts in the order the updates end (QTRAIN_UPDATE_ORDER, 1 by
// default), against parameter order (=0): another schedule of the same arithmetic, so the same
// records and weights.
static void test_largest_first(const char *scheme) {
    static char text[RECIPE_TEXT_MAX];
    begin_scheme_case("two_ranks_largest_first_same_bits", scheme, text, sizeof text);
    run_options o = train_steps_only(30);
    o.update_order = RUN_UPDATE_ORDER_PARAMETERS;
    run_options largest = o;
    largest.update_order = RUN_UPDATE_ORDER_LARGEST_FIRST;
    if (run_ranks("synthetic_tiny.recipe", text, 2, &o, jobs_a) &&
        run_ranks("synthetic_tiny.recipe", text, 2, &largest, jobs_b)) {
        CHECK(jobs_a[0].log.count == 30, "%u steps", jobs_a[0].log.count);
        CHECK(memcmp(&jobs_a[0].log, &jobs_b[0].log, sizeof jobs_a[0].log) == 0,
              "the records differ with the updates largest first");
        CHECK(jobs_a[0].weights_hash == jobs_b[0].weights_hash &&
                  jobs_a[1].weights_hash == jobs_b[1].weights_hash,
              "the weights differ with the updates largest first");
    }
    test_end();
}

// Two ranks whose batches the device gathers from resident datasets (`resident = on`: each rank
// stages its share's sample indices) train and evaluate as two that stage their rows: the same
// records, every eval pass alike, bit for bit, and the same weights. The last batch of the
// train set and of the eval set is partial, so a later rank's share holds padding only.
static void test_two_ranks_resident(void) {
    static char text[RECIPE_TEXT_MAX], resident[RECIPE_TEXT_MAX + 32];
    begin_scheme_case("two_ranks_resident_like_staged", "bf16", text, sizeof text);
    const char *seed = strstr(text, "\nseed = 11\n");
    CHECK(seed != NULL, "no seed line in synthetic_tiny.recipe");
    if (seed == NULL) {
        test_end();
        return;
    }
    size_t head = (size_t)(seed - text) + strlen("\nseed = 11\n");
    snprintf(resident, sizeof resident, "%.*sresident = on\n%s", (int)head, text, text + head);
    run_options o = {0};
    o.steps_limit = 40;
    if (!run_ranks("synthetic_tiny.recipe", text, 2, &o, jobs_a) ||
        !run_ranks("synthetic_tiny.recipe", resident, 2, &o, jobs_b)) {
        test_end();
        return;
    }
    const step_log *a = &jobs_a[0].log, *b = &jobs_b[0].log;
    CHECK(a->count == 40 && a->passes > 0, "%u train steps, %u eval passes", a->count,
          a->passes);
    CHECK(memcmp(a, b, sizeof *a) == 0, "resident and staged records differ");
    CHECK(jobs_a[0].weights_hash == jobs_b[0].weights_hash &&
              jobs_a[1].weights_hash == jobs_b[1].weights_hash,
          "resident and staged weights differ");
    CHECK(jobs_b[0].dev_bytes > jobs_a[0].dev_bytes, "the resident run's arena is no larger: "
          "%llu bytes against %llu", (unsigned long long)jobs_b[0].dev_bytes,
          (unsigned long long)jobs_a[0].dev_bytes);
    test_end();
}

// Two ranks with the head's weight transposed per step train as two with the stored copy: the
// same records, bit for bit, and every rank ends with the same weights.
static void test_two_ranks_per_step(void) {
    test_begin("two_ranks_weight_transpose_per_step_equals_stored_current");
    static char stored[RECIPE_TEXT_MAX], per_step[RECIPE_TEXT_MAX];
    CHECK(recipe_text("tests/recipes/synthetic_tiny.recipe", "current", stored, sizeof stored) &&
              per_step_text("current", per_step, sizeof per_step),
          "cannot read the recipe");
    run_options o = {0};
    o.steps_limit = 60;
    o.drop_eval = true;
    if (!run_ranks("synthetic_tiny.recipe", stored, 2, &o, jobs_a) ||
        !run_ranks("per_step.recipe", per_step, 2, &o, jobs_c)) {
        test_end();
        return;
    }
    const step_log *a = &jobs_a[0].log, *c = &jobs_c[0].log;
    CHECK(a->count == 60 && memcmp(a, c, sizeof *a) == 0,
          "%u and %u steps: the per_step run's records differ from the stored copy's", a->count,
          c->count);
    CHECK(jobs_c[0].weights_hash == jobs_c[1].weights_hash, "the per_step ranks' weights differ");
    test_end();
}

// A NaN planted in one gradient: every rank skips the step (the owners' flags travel with the
// gathered norms), the run goes on with equal weights everywhere.
static void test_skip_together(void) {
    test_begin("two_ranks_skip_a_nonfinite_step_together");
    static char text[RECIPE_TEXT_MAX];
    CHECK(recipe_text("tests/recipes/synthetic_tiny.recipe", "current", text, sizeof text),
          "cannot read the recipe");
    run_options o = {0};
    o.steps_limit = 12;
    o.drop_eval = true;
    o.inject = (run_inject){true, 5, "head", 0x7FC00000u};
    if (run_ranks("synthetic_tiny.recipe", text, 2, &o, jobs_a)) {
        const step_log *a = &jobs_a[0].log;
        for (uint32_t s = 0; s < a->count; s++) {
            CHECK(a->skipped[s] == (s == 5), "step %u skipped %d", s, (int)a->skipped[s]);
        }
        CHECK(jobs_a[0].weights_hash == jobs_a[1].weights_hash, "the ranks' weights differ");
    }
    test_end();
}


// Checkpoints: rank 0 writes the table of the run on one GPU (the other ranks' masters and
// moments gathered into it), and a run on any count resumes from it.
// Whether two checkpoints have the same table (regions, parameters, sizes); with `crcs` the same
// bytes in every region too.
static bool same_tables_of(const char *a, const char *b, bool crcs) {
    static uint8_t sa[1 << 20], sb[1 << 20];
    static ckpt_reader ra, rb;
    ckpt_reader_init(&ra, sa, 256, 64);
    ckpt_reader_init(&rb, sb, 256, 64);
    if (ckpt_open(&ra, a) != QT_OK || ckpt_open(&rb, b) != QT_OK) return false;
    const ckpt_table *x = &ra.table, *y = &rb.table;
    bool same = x->header.region_count == y->header.region_count &&
                x->header.param_count == y->header.param_count &&
                x->header.file_bytes == y->header.file_bytes;
    for (uint32_t i = 0; same && i < x->header.region_count; i++) {
        const ckpt_region *p = &x->regions[i], *q = &y->regions[i];
        same = strcmp(p->name, q->name) == 0 && p->offset == q->offset &&
               p->bytes == q->bytes && p->format == q->format && p->usage == q->usage &&
               p->param == q->param && p->category == q->category &&
               (!crcs || p->crc == q->crc);
    }
    for (uint32_t i = 0; same && i < x->header.param_count; i++) {
        same = memcmp(&x->params[i], &y->params[i], sizeof x->params[i]) == 0;
    }
    ckpt_close(&ra);
    ckpt_close(&rb);
    return same;
}

static bool same_tables(const char *a, const char *b) { return same_tables_of(a, b, false); }

static void check_tail(const char *what, const step_log *resumed, const step_log *whole,
                       uint32_t from, double tol) {
    CHECK(resumed->count + from == whole->count, "%s: %u steps after step %u, expected %u",
          what, resumed->count, from, whole->count - from);
    for (uint32_t s = 0; s < resumed->count && from + s < whole->count; s++) {
        double rel = loss_difference(resumed->loss[s], whole->loss[from + s]);
        CHECK(tol == 0 ? resumed->loss[s] == whole->loss[from + s] &&
                             resumed->norm[s] == whole->norm[from + s]
                       : rel <= tol,
              "%s: step %u: loss %.7g, uninterrupted %.7g", what, from + s,
              (double)resumed->loss[s], (double)whole->loss[from + s]);
    }
}

static void test_checkpoints(const char *scheme) {
    static char text[RECIPE_TEXT_MAX];
    begin_scheme_case("checkpoints_of_two_ranks_resume_on_any_count", scheme, text, sizeof text);
    char two[200], one[200];
    snprintf(two, sizeof two, "%s", tmp_path("two.ckpt"));
    snprintf(one, sizeof one, "%s", tmp_path("one.ckpt"));
    remove(two);
    remove(one);
    run_options whole = {0};
    whole.steps_limit = 40;
    whole.drop_eval = true;
    run_options half = whole;
    half.steps_limit = 20;
    half.save_path = NULL;
    run_options resumed = whole;
    resumed.checkpoints = true;
    const char *n = "synthetic_tiny.recipe";
    // The uninterrupted runs on 2 ranks and on 1.
    if (!run_ranks(n, text, 2, &whole, jobs_a) || !run_ranks(n, text, 1, &whole, jobs_1)) {
        test_end();
        return;
    }
    half.save_path = two;
    bool ok = run_ranks(n, text, 2, &half, jobs_b);
    half.save_path = one;
    ok = ok && run_ranks(n, text, 1, &half, jobs_c);
    CHECK(ok && same_tables(two, one), "the 2-rank checkpoint's table is not the 1-rank one's");
    // 2 -> 2: bit for bit; 2 -> 1 and 1 -> 2: within the tolerance of another rank count.
    if (ok && run_ranks_from(n, text, 2, &resumed, two, jobs_b)) {
        check_tail("2 ranks resumed from 2", &jobs_b[0].log, &jobs_a[0].log, 20, 0);
        CHECK(jobs_b[0].weights_hash == jobs_a[0].weights_hash, "2 -> 2: weights differ");
    }
    if (ok && run_ranks_from(n, text, 1, &resumed, two, jobs_c)) {
        check_tail("1 rank resumed from 2", &jobs_c[0].log, &jobs_a[0].log, 20,
                   tolerance_of(scheme));
    }
    if (ok && run_ranks_from(n, text, 2, &resumed, one, jobs_b)) {
        check_tail("2 ranks resumed from 1", &jobs_b[0].log, &jobs_1[0].log, 20,
                   tolerance_of(scheme));
        CHECK(jobs_b[0].weights_hash == jobs_b[1].weights_hash, "1 -> 2: ranks' weights differ");
    }
    if (ok && run_ranks_from(n, text, 1, &resumed, one, jobs_c)) {
        check_tail("1 rank resumed from 1", &jobs_c[0].log, &jobs_1[0].log, 20, 0);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Eval rows on several ranks

// synthetic_tiny.recipe in `scheme` with `schedule` for its [schedule], a bias in its head and an
// eval set of 70 samples: a pass's last batch has 6 real rows of 16, so on 2 ranks the second
// share and on 4 the last two hold padding only.
static bool eval_recipe_text(const char *scheme, const char *schedule, char *out, size_t bytes) {
    static char text[RECIPE_TEXT_MAX];
    if (!recipe_text("tests/recipes/synthetic_tiny.recipe", scheme, text, sizeof text)) {
        return false;
    }
    char *samples = strstr(text, "samples=64"), *rows = strstr(text, "[schedule]\n");
    if (!samples || !rows) return false;
    samples[strlen("samples=")] = '7';
    samples[strlen("samples=") + 1] = '0';
    rows[strlen("[schedule]\n")] = '\0';
    // The head's bias makes 4 parameter tensors, an owner for each of 4 ranks.
    char *head = strstr(text, "linear head 4\n");
    if (!head) return false;
    head[strlen("linear head 4")] = '\0';
    int n = snprintf(out, bytes, "%s bias\n%s%s", text, head + strlen("linear head 4") + 1,
                     schedule);
    return n > 0 && (size_t)n < bytes;
}

// The eval records of an N-rank run against the 1-rank run's: each step's and each pass's
// accuracy to the bit where the forward pass of a share gives the whole batch's rows (`exact`:
// the accuracy is a count of correct rows over the real rows, summed in integers), else each
// pass's within `accuracy_tol` (a step's may differ by a row: 1/16); the losses within `tol`
// relative to max(1, |loss|) (the same rows' losses summed in another order, or rows of other
// weights).
static void check_evals(const char *what, const step_log *n, const step_log *one, bool exact,
                        double tol, double accuracy_tol) {
    CHECK(n->evals == one->evals && n->passes == one->passes && n->evals > 0,
          "%s: %u eval steps in %u passes, 1 rank %u in %u", what, n->evals, n->passes,
          one->evals, one->passes);
    double worst = 0;
    for (uint32_t s = 0; s < n->evals && s < one->evals; s++) {
        double rel = loss_difference(n->eval_loss[s], one->eval_loss[s]);
        worst = rel > worst ? rel : worst;
        CHECK(rel <= tol, "%s: eval step %u: loss %.9g, 1 rank %.9g", what, s,
              (double)n->eval_loss[s], (double)one->eval_loss[s]);
        CHECK(!exact || n->eval_accuracy[s] == one->eval_accuracy[s],
              "%s: eval step %u: accuracy %.9g, 1 rank %.9g", what, s,
              (double)n->eval_accuracy[s], (double)one->eval_accuracy[s]);
    }
    for (uint32_t k = 0; k < n->passes && k < one->passes; k++) {
        CHECK(n->pass_samples[k] == one->pass_samples[k], "%s: pass %u: %llu samples, 1 rank "
              "%llu", what, k, (unsigned long long)n->pass_samples[k],
              (unsigned long long)one->pass_samples[k]);
        CHECK(loss_difference((float)n->pass_loss[k], (float)one->pass_loss[k]) <= tol,
              "%s: pass %u: loss %.9g, 1 rank %.9g", what, k, n->pass_loss[k],
              one->pass_loss[k]);
        CHECK(exact ? n->pass_accuracy[k] == one->pass_accuracy[k]
                    : fabs(n->pass_accuracy[k] - one->pass_accuracy[k]) <= accuracy_tol,
              "%s: pass %u: accuracy %.9g, 1 rank %.9g", what, k, n->pass_accuracy[k],
              one->pass_accuracy[k]);
    }
    printf("  %s: worst relative eval loss difference %.3g (tolerance %.3g)\n", what, worst, tol);
}

// Whether a share's forward pass gives the whole batch's rows bit for bit (README.md, "Data
// parallelism"): not per-tensor current scaling (each rank's own amax) nor NVFP4.
static bool rows_exact(const char *scheme) {
    return strcmp(scheme, "current") != 0 && strcmp(scheme, "nvfp4") != 0;
}

// The tolerance of an eval record's loss on N ranks against 1 rank's, relative to max(1, |loss|),
// with the same weights: the per-row losses are the same, summed in another order.
#define EVAL_SUM_TOLERANCE 1e-6

static rank_job jobs_4[4];

// Eval rows alone: two passes over the eval set and one over part of the train set.
#define EVAL_ONLY_SCHEDULE "eval all\neval 7 train\neval all\n"
// Train, eval and infer rows alternating: 40 train steps, 3 eval passes, an infer row between.
#define MIXED_SCHEDULE                                                                         \
    "train 20 cosine 1e-2 -> 1e-3 eval all every 10 steps\ninfer 3\ntrain 20 constant 1e-3\n" \
    "eval 3 train\n"

// A schedule of eval rows alone (the recipe's initial weights, the same on every rank count):
// 1, 2 and 4 ranks give the same eval records, and two 2-rank runs the same trace.
static void test_eval_only(const char *scheme) {
    static char text[RECIPE_TEXT_MAX];
    char name[96], t1[200], t2[200], c1[200], c2[200];
    snprintf(name, sizeof name, "eval_only_schedule_on_ranks_matches_one_rank_%s", scheme);
    test_begin(name);
    CHECK(eval_recipe_text(scheme, EVAL_ONLY_SCHEDULE, text, sizeof text),
          "cannot read the recipe");
    snprintf(t1, sizeof t1, "%s", tmp_path("eval_a.trace"));
    snprintf(t2, sizeof t2, "%s", tmp_path("eval_b.trace"));
    snprintf(c1, sizeof c1, "%s", tmp_path("eval_one.ckpt"));
    snprintf(c2, sizeof c2, "%s", tmp_path("eval_two.ckpt"));
    run_options o = {0};
    o.replace_outputs = true;
    const char *n = "synthetic_tiny.recipe";
    o.save_path = c1;
    bool ok = run_ranks(n, text, 1, &o, jobs_1);
    o.trace_path = t1;
    o.save_path = c2;
    ok = ok && run_ranks(n, text, 2, &o, jobs_a);
    o.trace_path = t2;
    o.save_path = NULL;
    ok = ok && run_ranks(n, text, 2, &o, jobs_b);
    o.trace_path = NULL;
    ok = ok && run_ranks(n, text, 4, &o, jobs_4);
    if (ok) {
        CHECK(jobs_1[0].log.passes == 3 && jobs_1[0].log.pass_samples[0] == 70 &&
              jobs_1[0].log.pass_samples[1] == 7 * 16, "1 rank: %u passes",
              jobs_1[0].log.passes);
        double tol = rows_exact(scheme) ? EVAL_SUM_TOLERANCE : tolerance_of(scheme);
        char what[64];
        snprintf(what, sizeof what, "%s, 2 ranks", scheme);
        check_evals(what, &jobs_a[0].log, &jobs_1[0].log, rows_exact(scheme), tol, tol);
        snprintf(what, sizeof what, "%s, 4 ranks", scheme);
        check_evals(what, &jobs_4[0].log, &jobs_1[0].log, rows_exact(scheme), tol, tol);
        CHECK(file_same(t1, t2), "two 2-rank runs wrote different traces");
        // Without training every rank holds every master: rank 0 saves the 1-rank file's
        // regions, byte for byte.
        CHECK(same_tables_of(c2, c1, true), "the 2-rank checkpoint differs from the 1-rank one");
    }
    test_end();
}

// Train, eval and infer rows alternating on 2 ranks: the eval and infer rows change nothing of
// the training (the train records are those of the run without them, bit for bit), two runs give
// the same trace, and the eval records follow the 1-rank run's within the scheme's tolerance.
static void test_train_eval(const char *scheme) {
    static char text[RECIPE_TEXT_MAX];
    char name[96], t1[200], t2[200];
    snprintf(name, sizeof name, "train_eval_alternation_on_ranks_%s", scheme);
    test_begin(name);
    CHECK(eval_recipe_text(scheme, MIXED_SCHEDULE, text, sizeof text), "cannot read the recipe");
    snprintf(t1, sizeof t1, "%s", tmp_path("mixed_a.trace"));
    snprintf(t2, sizeof t2, "%s", tmp_path("mixed_b.trace"));
    run_options o = {0};
    o.replace_outputs = true;
    const char *n = "synthetic_tiny.recipe";
    run_options plain = o;
    plain.drop_eval = true;
    bool ok = run_ranks(n, text, 1, &o, jobs_1) && run_ranks(n, text, 2, &plain, jobs_c);
    o.trace_path = t1;
    ok = ok && run_ranks(n, text, 2, &o, jobs_a);
    o.trace_path = t2;
    ok = ok && run_ranks(n, text, 2, &o, jobs_b);
    if (ok) {
        const step_log *a = &jobs_a[0].log, *c = &jobs_c[0].log;
        CHECK(a->passes == 3 && a->count == 40 && c->evals == 0, "%u passes, %u train steps",
              a->passes, a->count);
        CHECK(memcmp(a->loss, c->loss, sizeof a->loss) == 0 &&
              memcmp(a->norm, c->norm, sizeof a->norm) == 0,
              "the eval rows changed the training of 2 ranks");
        CHECK(jobs_a[0].weights_hash == jobs_c[0].weights_hash &&
              jobs_a[0].weights_hash == jobs_a[1].weights_hash, "weights differ");
        CHECK(file_same(t1, t2), "two 2-rank runs wrote different traces");
        char what[64];
        snprintf(what, sizeof what, "%s, 2 ranks after training", scheme);
        check_evals(what, a, &jobs_1[0].log, false, tolerance_of(scheme), tolerance_of(scheme));
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Infer rows on several ranks

// The float32 or int32 values of an .npy file that qtrain wrote (format 1.0: a 10-byte preamble
// whose last two bytes are the header's length), or NULL; *count gets how many.
static void *npy_values(const char *path, size_t *count, char **file) {
    size_t size = 0;
    *file = file_read(path, &size);
    if (!*file || size < 10) return NULL;
    const uint8_t *b = (const uint8_t *)*file;
    size_t data = 10 + (size_t)(b[8] | b[9] << 8);
    if (data > size || (size - data) % 4 != 0) return NULL;
    *count = (size - data) / 4;
    return *file + data;
}

// Two infer files of the same rows: byte for byte (`tol` 0), else the same length and header,
// and the logits' difference within tol of the reference's L2 norm (a logit of an FP8 forward
// pass of other scales moves by a step of its format), or (`classes`) at most a share tol of the
// rows predicted otherwise.
static bool same_outputs(const char *a, const char *b, bool classes, double tol) {
    if (tol == 0) return file_same(a, b);
    size_t na = 0, nb = 0;
    char *fa = NULL, *fb = NULL;
    const void *va = npy_values(a, &na, &fa), *vb = npy_values(b, &nb, &fb);
    bool same = va && vb && na == nb && na > 0 &&
                (const char *)va - fa == (const char *)vb - fb &&
                memcmp(fa, fb, (size_t)((const char *)va - fa)) == 0;
    size_t differ = 0;
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; same && i < na; i++) {
        if (classes) {
            differ += ((const int32_t *)va)[i] != ((const int32_t *)vb)[i];
        } else {
            double x = ((const float *)va)[i], y = ((const float *)vb)[i];
            diff2 += (x - y) * (x - y);
            ref2 += y * y;
        }
    }
    same = same && (double)differ <= tol * (double)na && diff2 <= tol * tol * ref2;
    free(fa);
    free(fb);
    return same;
}

// Where keep_outputs puts a run's file of `kind` (logits or classes): `label`_`kind` in the
// temporary folder.
static void kept_path(char out[200], const char *label, const char *kind) {
    char name[64];
    snprintf(name, sizeof name, "%s_%s", label, kind);
    snprintf(out, 200, "%s", tmp_path(name));
}

// The files of a run (logits.npy, classes.npy in the temporary folder) renamed to
// `label`_logits.npy and `label`_classes.npy, so that the next run of the same recipe writes anew.
static bool keep_outputs(const char *label) {
    static const char *const kinds[] = {"logits", "classes"};
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        char from[200], to[200];
        snprintf(from, sizeof from, "%s", tmp_path(kinds[k]));
        kept_path(to, label, kinds[k]);
        ok &= rename(from, to) == 0;
    }
    return ok;
}

static bool outputs_match(const char *label, const char *reference, double tol) {
    char a[200], b[200], c[200], d[200];
    kept_path(a, label, "logits");
    kept_path(b, reference, "logits");
    kept_path(c, label, "classes");
    kept_path(d, reference, "classes");
    return same_outputs(a, b, false, tol) && same_outputs(c, d, true, tol);
}

// The schedule of the infer tests: `prefix`, then a pass of logits over the eval set (70 samples:
// the last batch's padding fills the later shares), an eval pass and 3 steps of classes over the
// train set, into logits and classes in `folder`.
static bool infer_recipe_text(const char *scheme, const char *prefix, const char *folder,
                              char *out, size_t bytes) {
    char schedule[1024];
    int n = snprintf(schedule, sizeof schedule, "%sinfer all output=%s/logits\neval all\n"
                     "infer 3 train argmax output=%s/classes\n", prefix, folder, folder);
    return n > 0 && (size_t)n < sizeof schedule &&
           eval_recipe_text(scheme, schedule, out, bytes);
}

// Infer rows with the recipe's initial weights on 1, 2 and 4 ranks: rank 0 writes the whole
// batch's outputs in sample order (the shares gathered in rank order), the files of the run on
// one rank byte for byte where a share's rows are the whole batch's; and after train steps, two
// 2-rank runs write the same files and the same trace.
static void test_infer_rows(const char *scheme) {
    static char text[RECIPE_TEXT_MAX];
    char name[96], t1[200], t2[200];
    snprintf(name, sizeof name, "infer_rows_on_ranks_write_the_whole_batch_%s", scheme);
    test_begin(name);
    CHECK(infer_recipe_text(scheme, "", tmp_dir, text, sizeof text), "cannot read the recipe");
    snprintf(t1, sizeof t1, "%s", tmp_path("infer_a.trace"));
    snprintf(t2, sizeof t2, "%s", tmp_path("infer_b.trace"));
    run_options o = {0};
    const char *n = "synthetic_tiny.recipe";
    double tol = rows_exact(scheme) ? 0 : tolerance_of(scheme);
    bool ok = run_ranks(n, text, 1, &o, jobs_1) && keep_outputs("one") &&
              run_ranks(n, text, 2, &o, jobs_a) && keep_outputs("two") &&
              run_ranks(n, text, 4, &o, jobs_4) && keep_outputs("four");
    CHECK(ok, "a run failed");
    if (ok) {
        CHECK(outputs_match("two", "one", tol), "2 ranks' files differ from 1 rank's");
        CHECK(outputs_match("four", "one", tol), "4 ranks' files differ from 1 rank's");
        char what[64];
        snprintf(what, sizeof what, "%s, infer schedule on 2 ranks", scheme);
        double eval_tol = rows_exact(scheme) ? EVAL_SUM_TOLERANCE : tolerance_of(scheme);
        check_evals(what, &jobs_a[0].log, &jobs_1[0].log, rows_exact(scheme), eval_tol,
                    eval_tol);
    }
    CHECK(infer_recipe_text(scheme, "train 30 cosine 1e-2 -> 1e-3\n", tmp_dir, text,
                            sizeof text), "cannot read the recipe");
    o.trace_path = t1;
    ok = ok && run_ranks(n, text, 2, &o, jobs_a) && keep_outputs("trained_a");
    o.trace_path = t2;
    ok = ok && run_ranks(n, text, 2, &o, jobs_b) && keep_outputs("trained_b");
    o.trace_path = NULL;
    ok = ok && run_ranks(n, text, 1, &o, jobs_1) && keep_outputs("trained_one");
    CHECK(ok, "a run after training failed");
    if (ok) {
        CHECK(file_same(t1, t2) && outputs_match("trained_a", "trained_b", 0),
              "two 2-rank runs wrote different traces or files");
        CHECK(outputs_match("trained_a", "trained_one", tolerance_of(scheme)),
              "after training, 2 ranks' files are beyond the tolerance of 1 rank's");
    }
    test_end();
}

static void test_refusals(void) {
    test_begin("two_ranks_refuse_what_they_cannot_do");
    static char text[RECIPE_TEXT_MAX];
    static run r;
    static recipe rc;
    CHECK(recipe_text("tests/recipes/synthetic_tiny.recipe", NULL, text, sizeof text),
          "cannot read the recipe");
    CHECK(recipe_parse(text, strlen(text), "synthetic_tiny.recipe", &rc) == QT_OK, "%s",
          qt_error_message());
    uint64_t need = 0;
    run_options o = {0};
    o.world = 3;  // batch 16
    CHECK(run_measure(&r, &rc, text, strlen(text), &o, &need) == QT_ERR_INPUT &&
          strstr(qt_error_message(), "divisible by 3"), "batch: %s", qt_error_message());
    o.world = 2;
    o.from_path = tmp_path("never.ckpt");
    CHECK(run_measure(&r, &rc, text, strlen(text), &o, &need) == QT_ERR_INPUT &&
          strstr(qt_error_message(), "--from"), "from: %s", qt_error_message());
    o.from_path = NULL;
    o.infer_input = tmp_path("never.npy");
    o.infer_output = tmp_path("never_out.npy");
    CHECK(run_measure(&r, &rc, text, strlen(text), &o, &need) == QT_ERR_INPUT &&
          strstr(qt_error_message(), "does not take qtrain infer; run it on one GPU"),
          "infer: %s", qt_error_message());
    o.infer_input = o.infer_output = NULL;
    o.world = 8;  // 2 layers, 4 tensors with biases... fewer than 8
    rc.data.batch = 64;
    CHECK(run_measure(&r, &rc, text, strlen(text), &o, &need) == QT_ERR_INPUT &&
          strstr(qt_error_message(), "parameter tensors"), "owners: %s", qt_error_message());
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The NCCL loader: once per process, so each case runs in this program re-executed with --loader
// (it prints nccl_load's result) under its own QTRAIN_NCCL.

static int loader_main(void) {
    qt_status status = nccl_load();
    printf("%s|%s|%s\n", qt_status_name(status), status == QT_OK ? "" : qt_error_message(),
           nccl_loaded_path());
    return 0;
}

// A stand-in libnccl.so.2 built with the C compiler: every entry point, ncclGetVersion giving
// `version`; `missing` left out.
static bool fake_nccl(const char *dir, int version, const char *missing) {
    static const char *const entries[] = {"ncclGetUniqueId", "ncclCommInitRank",
        "ncclCommDestroy", "ncclCommAbort", "ncclGetErrorString", "ncclGroupStart",
        "ncclGroupEnd", "ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclAllGather",
        "ncclReduceScatter"};
    char source[256], command[1024];
    snprintf(source, sizeof source, "%s/fake.c", dir);
    FILE *f = fopen(source, "w");
    if (!f) return false;
    fprintf(f, "int ncclGetVersion(int *v) { *v = %d; return 0; }\n", version);
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        if (missing && strcmp(entries[i], missing) == 0) continue;
        fprintf(f, "int %s(void) { return 0; }\n", entries[i]);
    }
    fclose(f);
    snprintf(command, sizeof command, "cc -shared -fPIC -o '%s/libnccl.so.2' '%s'", dir, source);
    char out[512];
    return command_output(command, out, sizeof out) == 0;
}

static void loader_case(const char *self, const char *given, const char *expect_status,
                        const char *expect_text) {
    char command[1024], out[2048];
    snprintf(command, sizeof command, "QTRAIN_NCCL='%s' '%s' --loader", given, self);
    int code = command_output(command, out, sizeof out);
    CHECK(code == 0 && strncmp(out, expect_status, strlen(expect_status)) == 0 &&
          strstr(out, expect_text), "QTRAIN_NCCL=%s: got '%s', expected %s naming '%s'", given,
          out, expect_status, expect_text);
}

static void test_loader(const char *self) {
    test_begin("nccl_loader_takes_QTRAIN_NCCL_first_and_names_what_is_wrong");
    char old_dir[200], missing_dir[200], file[240];
    snprintf(old_dir, sizeof old_dir, "%s", tmp_path("nccl_old"));
    snprintf(missing_dir, sizeof missing_dir, "%s", tmp_path("nccl_missing"));
    char out[256];
    char command[512];
    snprintf(command, sizeof command, "mkdir -p '%s' '%s'", old_dir, missing_dir);
    CHECK(command_output(command, out, sizeof out) == 0, "mkdir");
    if (!fake_nccl(old_dir, 20900, NULL) || !fake_nccl(missing_dir, 22000, "ncclReduce")) {
        test_skip("nccl_loader_takes_QTRAIN_NCCL_first_and_names_what_is_wrong",
                  "no C compiler (cc) to build a stand-in libnccl.so.2");
        return;
    }
    // A folder, and the file itself: both are taken before any other place.
    loader_case(self, old_dir, "QT_ERR_NO_DRIVER", "needs 2.10");
    snprintf(file, sizeof file, "%s/libnccl.so.2", old_dir);
    loader_case(self, file, "QT_ERR_NO_DRIVER", old_dir);
    loader_case(self, missing_dir, "QT_ERR_NO_DRIVER", "no entry point ncclReduce");
    // A path that is not there is tried, and named when nothing else loads.
    snprintf(command, sizeof command, "QTRAIN_NCCL=/nonexistent/libnccl.so.2 '%s' --loader",
             self);
    static char text[2048];
    CHECK(command_output(command, text, sizeof text) == 0, "%s", text);
    CHECK(strncmp(text, "QT_OK", 5) == 0 || strstr(text, "/nonexistent/libnccl.so.2"),
          "the missing QTRAIN_NCCL is not named: %s", text);
    test_end();
}

// The communicators of a wide rank (QTRAIN_COMM_WIDE) against a stand-in libnccl.so.2 that
// prints the configuration each call is given, laid out as NCCL 2.17's ncclConfig_t (written
// here from NCCL's header, apart from runtime/driver/nccl_lib.h): run in this program
// re-executed with --comm-open WIDE (off, if-able or required), which opens rank 0 of 2 with a
// 16-CTA cap, then closes it.
static int comm_open_main(const char *wide) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    dp_comm c;
    dp_wide setting = strcmp(wide, "required") == 0 ? DP_WIDE_REQUIRED
                      : strcmp(wide, "if-able") == 0 ? DP_WIDE_IF_ABLE
                                                     : DP_WIDE_OFF;
    qt_status status = dp_comm_open_gpu(&c, &id, 0, 2, 16, setting);
    printf("open %s|%s|NCCL_MAX_CTAS=%s\n", qt_status_name(status),
           status == QT_OK ? "" : qt_error_message(),
           getenv("NCCL_MAX_CTAS") ? getenv("NCCL_MAX_CTAS") : "unset");
    fflush(stdout);
    if (status == QT_OK) dp_comm_close(&c, false);
    return 0;
}

static bool fake_nccl_configs(const char *dir, bool split) {
    char source[256], command[1024], out[512];
    snprintf(source, sizeof source, "%s/fake.c", dir);
    FILE *f = fopen(source, "w");
    if (!f) return false;
    fprintf(f, "#include <stdio.h>\n#include <stddef.h>\n"
            "typedef struct { size_t size; unsigned magic, version; int blocking, cga, min_ctas, "
            "max_ctas; const char *net; } config;\n"
            "typedef struct { char internal[128]; } uid;\n"
            "static void show(const char *call, const config *c) { printf(\"%%s size %%zu "
            "magic %%x version %%u blocking %%d cga %%d min %%d max %%d net %%s\\n\", call, "
            "c->size, c->magic, c->version, c->blocking, c->cga, c->min_ctas, c->max_ctas, "
            "c->net ? c->net : \"null\"); fflush(stdout); }\n"
            "int ncclGetVersion(int *v) { *v = 22800; return 0; }\n"
            "int ncclCommInitRank(void **c, int n, uid id, int r) { *c = (void *)1; "
            "printf(\"ncclCommInitRank\\n\"); return 0; }\n"
            "int ncclCommInitRankConfig(void **c, int n, uid id, int r, config *k) { "
            "*c = (void *)1; show(\"ncclCommInitRankConfig\", k); return 0; }\n"
            "int ncclCommDestroy(void *c) { printf(\"destroy %%p\\n\", c); return 0; }\n");
    if (split) {
        fprintf(f, "int ncclCommSplit(void *c, int color, int key, void **n, config *k) { "
                "*n = (void *)2; printf(\"split color %%d key %%d\\n\", color, key); "
                "show(\"ncclCommSplit\", k); return 0; }\n");
    }
    static const char *const rest[] = {"ncclGetUniqueId", "ncclCommAbort",
        "ncclGetErrorString", "ncclGroupStart", "ncclGroupEnd", "ncclAllReduce", "ncclReduce",
        "ncclBroadcast", "ncclAllGather", "ncclReduceScatter"};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) {
        fprintf(f, "int %s(void) { return 0; }\n", rest[i]);
    }
    fclose(f);
    snprintf(command, sizeof command, "cc -shared -fPIC -o '%s/libnccl.so.2' '%s'", dir, source);
    return command_output(command, out, sizeof out) == 0;
}

static void test_comm_configs(const char *self) {
    const char *name = "wide_rank_configures_both_communicators";
    char with_split[200], without[200], command[1024];
    static char out[4096];
    snprintf(with_split, sizeof with_split, "%s", tmp_path("nccl_split"));
    snprintf(without, sizeof without, "%s", tmp_path("nccl_nosplit"));
    snprintf(command, sizeof command, "mkdir -p '%s' '%s'", with_split, without);
    if (command_output(command, out, sizeof out) != 0 || !fake_nccl_configs(with_split, true) ||
        !fake_nccl_configs(without, false)) {
        test_skip(name, "no C compiler (cc) to build a stand-in libnccl.so.2");
        return;
    }
    test_begin(name);
    // Wide (unset or required): the cap in the first communicator's configuration
    // (NCCL_MAX_CTAS left unset), the split one uncapped, every other field unset (INT_MIN,
    // NULL), both destroyed.
    const char *unset = "blocking -2147483648 cga -2147483648 min -2147483648";
    char capped[256], uncapped[256];
    snprintf(capped, sizeof capped, "ncclCommInitRankConfig size 40 magic cafebeef version "
             "21700 %s max 16 net null", unset);
    snprintf(uncapped, sizeof uncapped, "ncclCommSplit size 40 magic cafebeef version 21700 "
             "%s max -2147483648 net null", unset);
    static const char *const wide_settings[] = {"if-able", "required"};
    for (int w = 0; w < 2; w++) {
        snprintf(command, sizeof command, "env -u NCCL_MAX_CTAS QTRAIN_NCCL='%s' '%s' "
                 "--comm-open %s", with_split, self, wide_settings[w]);
        CHECK(command_output(command, out, sizeof out) == 0, "%s", out);
        CHECK(strstr(out, capped) && strstr(out, "split color 0 key 0") &&
                  strstr(out, uncapped) && strstr(out, "open QT_OK||NCCL_MAX_CTAS=unset") &&
                  strstr(out, "destroy 0x2") && strstr(out, "destroy 0x1") &&
                  strstr(out, "destroy 0x2") < strstr(out, "destroy 0x1"),
              "wide (%s): %s", wide_settings[w], out);
    }
    // Not wide (QTRAIN_COMM_WIDE=0), or unset with a library without ncclCommSplit: the plain
    // call and NCCL_MAX_CTAS.
    const char *plain_libs[] = {with_split, without}, *plain_settings[] = {"off", "if-able"};
    for (int k = 0; k < 2; k++) {
        snprintf(command, sizeof command, "env -u NCCL_MAX_CTAS QTRAIN_NCCL='%s' '%s' "
                 "--comm-open %s", plain_libs[k], self, plain_settings[k]);
        CHECK(command_output(command, out, sizeof out) == 0 && strstr(out, "ncclCommInitRank\n") &&
                  !strstr(out, "Config") && !strstr(out, "split") &&
                  strstr(out, "open QT_OK||NCCL_MAX_CTAS=16"),
              "not wide (%s): %s", plain_settings[k], out);
    }
    // Required from a library without ncclCommSplit: the fix named.
    snprintf(command, sizeof command, "env -u NCCL_MAX_CTAS QTRAIN_NCCL='%s' '%s' --comm-open "
             "required", without, self);
    CHECK(command_output(command, out, sizeof out) == 0 &&
              strstr(out, "open QT_ERR_NO_DRIVER|QTRAIN_COMM_WIDE=1 needs NCCL 2.18"),
          "without ncclCommSplit: %s", out);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// With two GPUs: the ranks as processes (this program re-executed with --worker), one per GPU,
// as `qtrain run --gpus 2` starts them.

#define GPU_STEPS 40

// The worker's recipe for `kind`: train (synthetic_tiny.recipe's train rows), eval
// (EVAL_ONLY_SCHEDULE), mixed (MIXED_SCHEDULE) or infer (infer_recipe_text's rows, their files in
// `folder`).
static bool worker_text(const char *kind, const char *scheme, const char *folder, char *text) {
    if (strcmp(kind, "eval") == 0) {
        return eval_recipe_text(scheme, EVAL_ONLY_SCHEDULE, text, RECIPE_TEXT_MAX);
    }
    if (strcmp(kind, "mixed") == 0) {
        return eval_recipe_text(scheme, MIXED_SCHEDULE, text, RECIPE_TEXT_MAX);
    }
    if (strcmp(kind, "infer") == 0) {
        return infer_recipe_text(scheme, "", folder, text, RECIPE_TEXT_MAX);
    }
    if (strcmp(kind, "per_step") == 0) return per_step_text(scheme, text, RECIPE_TEXT_MAX);
    return recipe_text("tests/recipes/synthetic_tiny.recipe", scheme, text, RECIPE_TEXT_MAX);
}

// Rank 0's records for the parent: each train loss (%a per line), then each eval step's loss and
// accuracy (`e`) and each pass's loss, accuracy and samples (`p`).
static bool worker_records(const char *path, const step_log *log) {
    FILE *f = fopen(path, "w");
    for (uint32_t i = 0; f && i < log->count; i++) fprintf(f, "%a\n", (double)log->loss[i]);
    for (uint32_t i = 0; f && i < log->evals; i++) {
        fprintf(f, "e %a %a\n", (double)log->eval_loss[i], (double)log->eval_accuracy[i]);
    }
    for (uint32_t i = 0; f && i < log->passes; i++) {
        fprintf(f, "p %a %a %llu\n", log->pass_loss[i], log->pass_accuracy[i],
                (unsigned long long)log->pass_samples[i]);
    }
    return f && fclose(f) == 0;
}

// A worker: rank `rank` of `world` on GPU `rank`, the recipe of `kind` in `scheme`, `steps` train
// steps, saving to `save` or resuming from `resume` ("-": not); rank 0 writes the trace and its
// records to `losses` (worker_records) and the infer rows' files beside it. Checks that the loop
// made no synchronizing call beyond its lagged statistics reads (a run without saves). Exit 0
// when everything held.
static int worker_main(char **argv) {
    uint32_t rank = (uint32_t)atoi(argv[0]), world = (uint32_t)atoi(argv[1]);
    const char *id_hex = argv[2], *scheme = argv[3], *trace = argv[4], *losses = argv[5];
    bool eager = strcmp(argv[6], "eager") == 0;
    const char *save = strcmp(argv[7], "-") == 0 ? NULL : argv[7];
    const char *resume = strcmp(argv[8], "-") == 0 ? NULL : argv[8];
    uint64_t steps = strtoull(argv[9], NULL, 10);
    const char *kind = argv[10];
    char folder[200];
    snprintf(folder, sizeof folder, "%s", losses);
    char *slash = strrchr(folder, '/');
    if (slash) *slash = '\0';
    static char text[RECIPE_TEXT_MAX];
    if (!worker_text(kind, scheme, slash ? folder : ".", text)) {
        printf("worker %u: cannot read the recipe\n", rank);
        return 1;
    }
    uint8_t id[QT_NCCL_UNIQUE_ID_BYTES];
    for (int i = 0; i < QT_NCCL_UNIQUE_ID_BYTES && world > 1; i++) {
        unsigned byte = 0;
        if (sscanf(id_hex + 2 * i, "%2x", &byte) != 1) return 1;
        id[i] = (uint8_t)byte;
    }
    static backend b;
    static run r;
    static recipe rc;
    static step_log log;
    qt_status status = backend_open_gpu(&b, (int)rank);
    run_options o = {0};
    o.steps_limit = steps;
    o.drop_eval = strcmp(kind, "train") == 0 || strcmp(kind, "per_step") == 0;
    o.eager = eager;
    o.save_path = save;
    o.checkpoints = resume != NULL;
    o.rank = rank;
    o.world = world;
    o.nccl_id = id;
    o.trace_path = rank == 0 && strcmp(trace, "-") != 0 ? trace : NULL;
    o.replace_outputs = true;
    uint64_t need = 0;
    void *tables = NULL, *data = NULL;
    if (status == QT_OK) status = recipe_parse(text, strlen(text), "synthetic_tiny.recipe", &rc);
    if (status == QT_OK) status = run_measure(&r, &rc, text, strlen(text), &o, &need);
    if (status == QT_OK) status = run_plan(&r, tables = aligned(need), need);
    if (status == QT_OK) status = run_load(&r, data = aligned(run_data_bytes(&r)),
                                           run_data_bytes(&r));
    if (status == QT_OK) status = run_bind(&r, &b, NULL, NULL);
    if (status == QT_OK && resume) status = run_resume(&r, resume);
    sched_summary sum = {0};
    uint64_t syncs = driver_sync_total(&b.syncs);
    if (status == QT_OK) status = run_execute(&r, job_progress, &log, &sum);
    syncs = driver_sync_total(&b.syncs) - syncs;
    if (status == QT_OK) status = run_end_trace(&r);
    int code = 0;
    if (status != QT_OK) {
        printf("worker %u of %u: %s: %s\n", rank, world, qt_status_name(status),
               qt_error_message());
        code = 1;
    } else if (!save && syncs != sum.lagged_reads) {
        printf("worker %u of %u: %llu synchronizing calls in the loop, %llu lagged reads\n", rank,
               world, (unsigned long long)syncs, (unsigned long long)sum.lagged_reads);
        code = 1;
    }
    if (code == 0 && rank == 0 && !worker_records(losses, &log)) code = 1;
    run_close(&r);
    backend_close(&b);
    free(tables);
    free(data);
    return code;
}

// Starts `world` workers (one per GPU) and waits for them; false when any failed.
static bool gpu_run_kind(const char *self, const char *kind, uint32_t world, const char *scheme,
                         const char *trace, const char *losses, bool eager, const char *save,
                         const char *resume, uint32_t steps) {
    // Every run of several ranks meets under a fresh id.
    ncclUniqueId id;
    char id_hex[2 * QT_NCCL_UNIQUE_ID_BYTES + 1];
    if (nccl.ncclGetUniqueId(&id) != ncclSuccess) return false;
    for (int i = 0; i < QT_NCCL_UNIQUE_ID_BYTES; i++) {
        snprintf(id_hex + 2 * i, 3, "%02x", (unsigned)(uint8_t)id.internal[i]);
    }
    char count_steps[24];
    snprintf(count_steps, sizeof count_steps, "%u", steps);
    pid_t pids[DP_RANKS_MAX];
    for (uint32_t r = 0; r < world; r++) {
        char rank[16], count[16];
        snprintf(rank, sizeof rank, "%u", r);
        snprintf(count, sizeof count, "%u", world);
        pids[r] = fork();
        if (pids[r] == 0) {
            char *args[] = {(char *)self, "--worker", rank, count, id_hex, (char *)scheme,
                            (char *)trace, (char *)losses, eager ? "eager" : "graphs",
                            save ? (char *)save : "-", resume ? (char *)resume : "-",
                            count_steps, (char *)kind, NULL};
            setenv("NCCL_NVLS_ENABLE", "0", 1);
            setenv("NCCL_ALGO", "Ring", 0);
            setenv("NCCL_PROTO", "Simple", 0);
            setenv("NCCL_RUNTIME_CONNECT", "0", 0);
            execv("/proc/self/exe", args);
            _exit(127);
        }
    }
    bool ok = true;
    for (uint32_t r = 0; r < world; r++) {
        int st = 0;
        ok &= pids[r] > 0 && waitpid(pids[r], &st, 0) == pids[r] && WIFEXITED(st) &&
              WEXITSTATUS(st) == 0;
    }
    return ok;
}

static bool gpu_run(const char *self, uint32_t world, const char *scheme, const char *trace,
                    const char *losses, bool eager, const char *save, const char *resume,
                    uint32_t steps) {
    return gpu_run_kind(self, "train", world, scheme, trace, losses, eager, save, resume, steps);
}

static bool gpu_losses(const char *path, float *loss, uint32_t *count) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    double v;
    *count = 0;
    while (*count < STEPS_MAX && fscanf(f, "%la", &v) == 1) loss[(*count)++] = (float)v;
    fclose(f);
    return true;
}

// Checkpoints on the GPUs: 2 -> 2 bit for bit, 2 -> 1 and 1 -> 2 within the tolerance, against
// the uninterrupted runs' losses (two: 2 GPUs, one: 1 GPU).
static void gpu_checkpoints(const char *self, const char *scheme, const char *two,
                            const char *one) {
    char name[96], p2[200], p1[200], lr[200];
    snprintf(name, sizeof name, "gpus2_checkpoints_resume_on_any_count_%s", scheme);
    test_begin(name);
    snprintf(p2, sizeof p2, "%s", tmp_path("two.ckpt"));
    snprintf(p1, sizeof p1, "%s", tmp_path("one.ckpt"));
    snprintf(lr, sizeof lr, "%s", tmp_path("resumed.losses"));
    remove(p2);
    remove(p1);
    static float whole2[STEPS_MAX], whole1[STEPS_MAX], part[STEPS_MAX];
    uint32_t n2 = 0, n1 = 0, n = 0;
    CHECK(gpu_losses(two, whole2, &n2) && gpu_losses(one, whole1, &n1), "no uninterrupted runs");
    // No traces: a resumed run would continue the saving run's.
    bool saved2 = gpu_run(self, 2, scheme, "-", lr, false, p2, NULL, GPU_STEPS / 2);
    bool saved1 = gpu_run(self, 1, scheme, "-", lr, false, p1, NULL, GPU_STEPS / 2);
    CHECK(saved2 && saved1, "a save failed");
    static const struct { uint32_t world; bool from_two; } cases[] = {{2, true}, {1, true},
                                                                       {2, false}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && saved1 && saved2; c++) {
        bool ok = gpu_run(self, cases[c].world, scheme, "-", lr, false, NULL,
                          cases[c].from_two ? p2 : p1, GPU_STEPS) &&
                  gpu_losses(lr, part, &n);
        CHECK(ok && n == GPU_STEPS / 2, "%u GPUs from %s: failed or %u steps", cases[c].world,
              cases[c].from_two ? "2" : "1", n);
        const float *whole = cases[c].from_two ? whole2 : whole1;
        bool exact = cases[c].world == (cases[c].from_two ? 2u : 1u);
        for (uint32_t i = 0; ok && i < n; i++) {
            float w = whole[GPU_STEPS / 2 + i];
            double rel = loss_difference(part[i], w);
            CHECK(exact ? part[i] == w : rel <= tolerance_of(scheme),
                  "%u GPUs from %s GPUs' checkpoint, step %u: %.7g, uninterrupted %.7g",
                  cases[c].world, cases[c].from_two ? "2" : "1", GPU_STEPS / 2 + i,
                  (double)part[i], (double)w);
        }
    }
    test_end();
}

// rank 0's records of a worker (worker_records) into a step log; false when the file is missing.
static bool gpu_log(const char *path, step_log *log) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    memset(log, 0, sizeof *log);
    char line[200];
    while (fgets(line, sizeof line, f)) {
        double loss = 0, accuracy = 0;
        unsigned long long samples = 0;
        if (line[0] == 'e' && log->evals < STEPS_MAX &&
            sscanf(line + 1, "%la %la", &loss, &accuracy) == 2) {
            log->eval_loss[log->evals] = (float)loss;
            log->eval_accuracy[log->evals++] = (float)accuracy;
        } else if (line[0] == 'p' && log->passes < PASSES_MAX &&
                   sscanf(line + 1, "%la %la %llu", &loss, &accuracy, &samples) == 3) {
            log->pass_loss[log->passes] = loss;
            log->pass_accuracy[log->passes] = accuracy;
            log->pass_samples[log->passes++] = samples;
        } else if (log->count < STEPS_MAX && sscanf(line, "%la", &loss) == 1) {
            log->loss[log->count++] = (float)loss;
        }
    }
    fclose(f);
    return true;
}

// The pass accuracy of 2 GPUs against 1 with the same weights where a share's rows are the whole
// batch's: a share's GEMMs may take another kernel (M picks it) and round a near tie the other
// way, so two of a pass's 70 rows.
#define GPU_EVAL_ACCURACY_TOLERANCE (2.0 / 70.0)

// Eval and infer rows on 2 GPUs: eval rows alone against 1 GPU (two runs, graphs and eager giving
// one trace), train, eval and infer rows alternating (two runs, one trace; the eval records
// within the training tolerance of 1 GPU's), and infer rows' files against 1 GPU's. Every worker
// checks that its loop added no synchronization.
static void gpu_rows(const char *self, const char *scheme) {
    char name[96], ta[200], tb[200], te[200], la[200], lb[200], l1[200], what[64];
    snprintf(ta, sizeof ta, "%s", tmp_path("rows_a.trace"));
    snprintf(tb, sizeof tb, "%s", tmp_path("rows_b.trace"));
    snprintf(te, sizeof te, "%s", tmp_path("rows_eager.trace"));
    snprintf(la, sizeof la, "%s", tmp_path("rows_a.records"));
    snprintf(lb, sizeof lb, "%s", tmp_path("rows_b.records"));
    snprintf(l1, sizeof l1, "%s", tmp_path("rows_one.records"));
    static step_log two, one;
    bool exact = rows_exact(scheme);
    double tol = tolerance_of(scheme);
    snprintf(name, sizeof name, "gpus2_eval_only_matches_one_gpu_%s", scheme);
    test_begin(name);
    bool ok = gpu_run_kind(self, "eval", 1, scheme, "-", l1, false, NULL, NULL, 0) &&
              gpu_run_kind(self, "eval", 2, scheme, ta, la, false, NULL, NULL, 0) &&
              gpu_run_kind(self, "eval", 2, scheme, tb, lb, false, NULL, NULL, 0) &&
              gpu_run_kind(self, "eval", 2, scheme, te, lb, true, NULL, NULL, 0);
    CHECK(ok && gpu_log(la, &two) && gpu_log(l1, &one),
          "a worker failed or found synchronizing calls (its output above)");
    if (ok) {
        CHECK(file_same(ta, tb) && file_same(ta, te), "traces differ (two runs, or eager)");
        snprintf(what, sizeof what, "%s, 2 GPUs", scheme);
        check_evals(what, &two, &one, false, exact ? 1e-3 : tol,
                    exact ? GPU_EVAL_ACCURACY_TOLERANCE : tol);
    }
    test_end();
    snprintf(name, sizeof name, "gpus2_train_eval_infer_rows_follow_one_gpu_%s", scheme);
    test_begin(name);
    ok = gpu_run_kind(self, "mixed", 1, scheme, "-", l1, false, NULL, NULL, 0) &&
         gpu_run_kind(self, "mixed", 2, scheme, ta, la, false, NULL, NULL, 0) &&
         gpu_run_kind(self, "mixed", 2, scheme, tb, lb, false, NULL, NULL, 0);
    CHECK(ok && gpu_log(la, &two) && gpu_log(l1, &one),
          "a worker failed or found synchronizing calls (its output above)");
    if (ok) {
        CHECK(file_same(ta, tb), "two 2-GPU runs wrote different traces");
        CHECK(two.count == 40 && one.count == 40, "%u and %u train steps", two.count, one.count);
        for (uint32_t i = 0; i < two.count && i < one.count; i++) {
            CHECK(loss_difference(two.loss[i], one.loss[i]) <= tol, "step %u: %.7g on 2 GPUs, "
                  "%.7g on 1", i, (double)two.loss[i], (double)one.loss[i]);
        }
        snprintf(what, sizeof what, "%s, 2 GPUs after training", scheme);
        check_evals(what, &two, &one, false, tol, tol);
    }
    test_end();
    snprintf(name, sizeof name, "gpus2_infer_rows_write_the_whole_batch_%s", scheme);
    test_begin(name);
    ok = gpu_run_kind(self, "infer", 1, scheme, "-", l1, false, NULL, NULL, 0) &&
         keep_outputs("gpu_one") &&
         gpu_run_kind(self, "infer", 2, scheme, "-", la, false, NULL, NULL, 0) &&
         keep_outputs("gpu_two");
    CHECK(ok, "a worker failed or found synchronizing calls (its output above)");
    CHECK(!ok || outputs_match("gpu_two", "gpu_one", exact ? 1e-3 : tol),
          "the files of 2 GPUs are beyond the tolerance of 1 GPU's");
    test_end();
}

// On two ranks too, a weight transposed per step (weight_transpose = per_step: the head's) trains
// to the trace of the stored columnwise copy (`stored`, the tiny recipe's choice), after the
// header's recipe hash: each rank transposes the rowwise codes its owner broadcast.
static void gpu_per_step(const char *self, const char *stored_trace) {
    const char *name = "gpus2_weight_transpose_per_step_equals_stored_current";
    char trace[200], losses[200];
    snprintf(trace, sizeof trace, "%s", tmp_path("per_step.trace"));
    snprintf(losses, sizeof losses, "%s", tmp_path("per_step.losses"));
    bool ran = gpu_run_kind(self, "per_step", 2, "current", trace, losses, false, NULL, NULL,
                            GPU_STEPS);
    test_begin(name);
    size_t line = ran ? file_differs_after_first_line(stored_trace, trace) : 0;
    CHECK(ran && line == 0, "per_step on 2 GPUs: %s (line %zu)",
          ran ? "the trace differs from the stored copy's" : "a worker failed", line);
    test_end();
}

// QTRAIN_COMM_WIDE and QTRAIN_UPDATE_ORDER (both on by default: the collectives after the last
// wide GEMM on a second, uncapped communicator; updates largest first) change only the schedule:
// two ranks' sums are the same whichever channels NCCL splits them over, so with both set to 0
// the trace is `plain`'s, byte for byte. The workers inherit the settings.
static void gpu_settings(const char *self, const char *plain) {
    const char *name = "gpus2_comm_wide_and_update_order_off_keep_the_trace_current";
    char trace[200], losses[200];
    snprintf(trace, sizeof trace, "%s", tmp_path("settings.trace"));
    snprintf(losses, sizeof losses, "%s", tmp_path("settings.losses"));
    setenv("QTRAIN_COMM_WIDE", "0", 1);
    setenv("QTRAIN_UPDATE_ORDER", "0", 1);
    bool ran = gpu_run(self, 2, "current", trace, losses, false, NULL, NULL, GPU_STEPS);
    unsetenv("QTRAIN_COMM_WIDE");
    unsetenv("QTRAIN_UPDATE_ORDER");
    test_begin(name);
    CHECK(ran && file_same(plain, trace), "%s", ran ? "the trace differs from the run's "
          "with the settings on" : "a worker failed (its output above)");
    test_end();
}

static void test_gpus(const char *self) {
    static const char *const names[] = {
        "gpus2_traces_identical_across_runs", "gpus2_graphs_match_eager",
        "gpus2_match_one_gpu_within_tolerance", "gpus2_no_synchronization_added",
        "gpus2_checkpoints_resume_on_any_count", "gpus2_eval_only_matches_one_gpu",
        "gpus2_train_eval_infer_rows_follow_one_gpu", "gpus2_infer_rows_write_the_whole_batch",
        "gpus2_weight_transpose_per_step_equals_stored_current",
        "gpus2_comm_wide_and_update_order_off_keep_the_trace_current"};
    const char *why = NULL;
    int count = 0;
    char reason[QT_ERROR_MESSAGE_MAX + 64];
    if (driver_load() != QT_OK) {
        why = qt_error_message();
    } else if (drv.cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 2) {
        snprintf(reason, sizeof reason, "the run needs 2 GPUs; this machine has %d (NCCL runs "
                 "no 2 ranks on one GPU)", count);
        why = reason;
    } else if (nccl_load() != QT_OK) {
        snprintf(reason, sizeof reason, "%s", qt_error_message());
        why = reason;
    }
    if (why) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) test_skip(names[i], why);
        return;
    }
    static const char *const schemes[] = {"bf16", "current", "mxfp8", "nvfp4"};
    for (size_t k = 0; k < sizeof schemes / sizeof schemes[0]; k++) {
        const char *scheme = schemes[k];
        char t1[200], t2[200], t3[200], t4[200], l1[200], l2[200], l3[200], l4[200];
        snprintf(t1, sizeof t1, "%s", tmp_path("a.trace"));
        snprintf(t2, sizeof t2, "%s", tmp_path("b.trace"));
        snprintf(t3, sizeof t3, "%s", tmp_path("eager.trace"));
        snprintf(t4, sizeof t4, "%s", tmp_path("one.trace"));
        snprintf(l1, sizeof l1, "%s", tmp_path("a.losses"));
        snprintf(l2, sizeof l2, "%s", tmp_path("b.losses"));
        snprintf(l3, sizeof l3, "%s", tmp_path("eager.losses"));
        snprintf(l4, sizeof l4, "%s", tmp_path("one.losses"));
        bool ran[4];
        const char *traces[4] = {t1, t2, t3, t4}, *losses[4] = {l1, l2, l3, l4};
        for (int run_index = 0; run_index < 4; run_index++) {
            ran[run_index] = gpu_run(self, run_index == 3 ? 1 : 2, scheme, traces[run_index],
                                     losses[run_index], run_index == 2, NULL, NULL, GPU_STEPS);
        }
        char name[96];
        snprintf(name, sizeof name, "%s_%s", names[0], scheme);
        test_begin(name);
        CHECK(ran[0] && ran[1] && file_same(t1, t2), "%s: two 2-GPU runs: %s", scheme,
              ran[0] && ran[1] ? "traces differ" : "a worker failed (its output above)");
        test_end();
        snprintf(name, sizeof name, "%s_%s", names[1], scheme);
        test_begin(name);
        CHECK(ran[0] && ran[2] && file_same(t1, t3), "%s: graphs vs eager: %s", scheme,
              ran[2] ? "traces differ" : "a worker failed");
        test_end();
        snprintf(name, sizeof name, "%s_%s", names[2], scheme);
        test_begin(name);
        static float two[STEPS_MAX], one[STEPS_MAX];
        uint32_t n2 = 0, n1 = 0;
        CHECK(ran[0] && ran[3] && gpu_losses(l1, two, &n2) && gpu_losses(l4, one, &n1) &&
              n1 == GPU_STEPS && n2 == GPU_STEPS, "%s: losses missing", scheme);
        for (uint32_t i = 0; i < n1 && i < n2; i++) {
            double rel = loss_difference(two[i], one[i]);
            CHECK(rel <= tolerance_of(scheme), "%s step %u: %.7g on 2 GPUs, %.7g on 1", scheme,
                  i, (double)two[i], (double)one[i]);
        }
        test_end();
        snprintf(name, sizeof name, "%s_%s", names[3], scheme);
        test_begin(name);
        CHECK(ran[0] && ran[1] && ran[2], "%s: a worker found synchronizing calls or failed",
              scheme);
        test_end();
        gpu_checkpoints(self, scheme, l1, l4);
        gpu_rows(self, scheme);
        if (strcmp(scheme, "current") == 0) {
            gpu_per_step(self, t1);
            gpu_settings(self, t1);
        }
    }
}

int main(int argc, char **argv) {
    if (argc == 13 && strcmp(argv[1], "--worker") == 0) return worker_main(argv + 2);
    if (argc == 2 && strcmp(argv[1], "--loader") == 0) return loader_main();
    if (argc == 3 && strcmp(argv[1], "--comm-open") == 0) return comm_open_main(argv[2]);
    if (!tmp_dir_make("parallel")) {
        printf("FAIL parallel: cannot make a temporary folder\n");
        return 1;
    }
    test_loader(argv[0]);
    test_comm_configs(argv[0]);
    test_partition();
    test_collectives();
    test_reduce_order();
    test_single_rank();
    test_folds();
    test_batch_split();
    static const char *const schemes[] = {"bf16", "current", "delayed", "mxfp8", "block",
                                          "nvfp4"};
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) test_two_ranks(schemes[i]);
    test_skip_together();
    test_two_ranks_plan();
    test_largest_first("delayed");
    test_largest_first("nvfp4");
    test_two_ranks_per_step();
    test_two_ranks_resident();
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        test_eval_only(schemes[i]);
        test_train_eval(schemes[i]);
        test_infer_rows(schemes[i]);
    }
    test_checkpoints("current");
    test_checkpoints("mxfp8");
    test_refusals();
    test_gpus(argv[0]);
    (void)argc;
    tmp_dir_remove();
    return test_exit_code();
}
