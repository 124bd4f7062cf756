#include "schedule.h"

#include <string.h>
#include <time.h>  // clock_gettime

#include "driver.h"  // drv, QT_CU, driver_sync_event

// ---------------------------------------------------------------------------------------------
// The table

static uint32_t sched_lr_rule(recipe_lr_kind k) {
    switch (k) {
    case RECIPE_LR_CONSTANT: return QT_OPTIM_LR_CONSTANT;
    case RECIPE_LR_WARMUP: return QT_OPTIM_LR_LINEAR;
    case RECIPE_LR_COSINE: return QT_OPTIM_LR_COSINE;
    }
    QT_ASSERT(false);
    return 0;
}

static qt_status sched_push(sched_table *t, sched_row row) {
    if (t->row_count == SCHED_ROWS_MAX) {
        return qt_fail(QT_ERR_CAPACITY, "schedule table full: rows_max is %d", SCHED_ROWS_MAX);
    }
    t->rows[t->row_count++] = row;
    t->steps[row.mode] += row.steps;
    return QT_OK;
}

static const model_mode sched_modes[] = {MODEL_MODE_TRAIN, MODEL_MODE_EVAL, MODEL_MODE_INFER};

qt_status sched_table_build(const recipe *r, uint64_t train_samples, uint64_t eval_samples,
                            uint32_t batch, uint64_t steps_limit, sched_table *t) {
    memset(t, 0, sizeof *t);
    uint64_t start = 0;
    for (uint32_t i = 0; i < r->rows_count; i++) {
        const recipe_row *rr = &r->rows[i];
        t->modes[sched_modes[rr->mode]] = true;
        if (rr->mode != RECIPE_MODE_TRAIN) continue;
        optim_lr_row *lr = &t->lr[t->lr_count++];
        *lr = (optim_lr_row){start, rr->steps, sched_lr_rule(rr->lr_kind), rr->lr_from,
                             rr->lr_to, 0};
        start += rr->steps;
    }
    uint64_t left = steps_limit ? steps_limit : UINT64_MAX;
    for (uint32_t i = 0; i < r->rows_count; i++) {
        const recipe_row *rr = &r->rows[i];
        sched_row row = {sched_modes[rr->mode], rr->steps, rr->dataset, rr->line,
                         rr->output[0] != '\0' ? i + 1 : 0};
        if (rr->mode == RECIPE_MODE_TRAIN) {
            if (left == 0) break;  // the cut: later rows belong to training yet to come
            if (row.steps > left) row.steps = left;
            left -= row.steps;
        } else if (rr->all) {
            uint64_t samples = rr->dataset == RECIPE_DATASET_EVAL ? eval_samples : train_samples;
            row.steps = data_batches_per_epoch(samples, batch);
        }
        if (row.steps > 0) QT_TRY(sched_push(t, row));
    }
    return QT_OK;
}

qt_status sched_interleave_eval(sched_table *t, uint64_t every, uint64_t eval_steps) {
    QT_ASSERT(every >= 1 && eval_steps >= 1);
    static sched_table old;  // the copy being split (a table is too large for the stack)
    old = *t;
    memset(t->rows, 0, sizeof t->rows);
    t->row_count = 0;
    memset(t->steps, 0, sizeof t->steps);
    for (uint32_t i = 0; i < old.row_count; i++) {
        sched_row row = old.rows[i];
        if (row.mode != MODEL_MODE_TRAIN) {
            QT_TRY(sched_push(t, row));
            continue;
        }
        for (uint64_t done = 0; done < row.steps; done += every) {
            sched_row piece = row;
            piece.steps = row.steps - done < every ? row.steps - done : every;
            QT_TRY(sched_push(t, piece));
            QT_TRY(sched_push(t, (sched_row){MODEL_MODE_EVAL, eval_steps, RECIPE_DATASET_EVAL,
                                             0, 0}));
        }
    }
    return QT_OK;
}

void sched_drop_eval(sched_table *t) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < t->row_count; i++) {
        if (t->rows[i].mode == MODEL_MODE_TRAIN) t->rows[kept++] = t->rows[i];
    }
    t->row_count = kept;
    t->steps[MODEL_MODE_EVAL] = 0;
    t->steps[MODEL_MODE_INFER] = 0;
}

void sched_table_infer(uint64_t samples, uint32_t batch, sched_table *t) {
    memset(t, 0, sizeof *t);
    t->modes[MODEL_MODE_INFER] = true;
    sched_row row = {MODEL_MODE_INFER, data_batches_per_epoch(samples, batch),
                     RECIPE_DATASET_TRAIN, 0, 1};
    qt_status pushed = sched_push(t, row);  // the first row of an empty table always fits
    QT_ASSERT(pushed == QT_OK);
}

// ---------------------------------------------------------------------------------------------
// The loop

static double sched_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// What the host remembers about a step between its launch and the read of its record.
typedef struct sched_pending {
    uint64_t step;
    uint32_t row;
    uint64_t row_step;
    uint32_t rows_valid;
    double row_start;  // when the row's first step was launched
} sched_pending;

typedef struct sched_loop {
    const sched_env *env;
    const sched_table *t;
    sched_summary *sum;
    CUevent events[SCHED_LAG];
    sched_pending pending[SCHED_LAG];
    double start, row_start;
    uint64_t total, done;
    double eval_loss_sum;        // of the current eval row
    uint64_t eval_correct, eval_valid;
} sched_loop;

static data_feed *sched_feed(const sched_env *env, const sched_row *row) {
    if (row->mode == MODEL_MODE_TRAIN) return env->train_feed;
    if (row->dataset == RECIPE_DATASET_EVAL) return env->eval_feed;
    return env->train_plain;
}

static void sched_eval_accumulate(sched_loop *l, const qt_trace_record *rec, uint32_t valid,
                                  bool row_end) {
    // accuracy = RN(correct / valid) with valid < 2^24, so RN(accuracy * valid) is correct.
    l->eval_correct += (uint64_t)((double)rec->accuracy * valid + 0.5);
    l->eval_valid += valid;
    l->eval_loss_sum += (double)rec->loss * valid;
    if (!row_end) return;
    sched_summary *s = l->sum;
    s->has_eval = true;
    s->eval_samples = l->eval_valid;
    s->eval_loss = l->eval_valid ? l->eval_loss_sum / (double)l->eval_valid : 0.0;
    s->eval_accuracy = l->eval_valid ? (double)l->eval_correct / (double)l->eval_valid : 0.0;
    l->eval_loss_sum = 0;
    l->eval_correct = 0;
    l->eval_valid = 0;
}

// Reads the record of a finished step and hands it on.
static qt_status sched_consume(sched_loop *l, const sched_pending *pd) {
    const sched_env *env = l->env;
    model *m = env->model;
    const qt_trace_record *ring = arena_host_pointer(m->host, m->io.ring);
    qt_trace_record rec = ring[pd->step % MODEL_RING_LEN];
    if (rec.step != pd->step) {
        return qt_fail(QT_ERR_MISMATCH, "step %llu: its record says step %llu; the device "
                       "counter and the host loop disagree", (unsigned long long)pd->step,
                       (unsigned long long)rec.step);
    }
    if (env->trace) QT_TRY(trace_write(env->trace, &rec));
    if (env->check) QT_TRY(trace_check_record(env->check, &rec));
    const sched_row *row = &l->t->rows[pd->row];
    bool row_end = pd->row_step == row->steps;
    l->done++;
    if (row->mode == MODEL_MODE_TRAIN) {
        l->sum->last_train_loss = rec.loss;
        if (rec.flags & QT_TRACE_FLAG_SKIPPED) l->sum->skipped++;
        if (row_end) l->sum->train_seconds += sched_now() - pd->row_start;
    }
    if (row->mode == MODEL_MODE_EVAL) sched_eval_accumulate(l, &rec, pd->rows_valid, row_end);
    const uint16_t *outputs = NULL;
    if (row->mode == MODEL_MODE_INFER) {
        const uint8_t *slots = arena_host_pointer(m->host, m->io.outputs);
        outputs = (const uint16_t *)(slots + (pd->step % MODEL_STAGE_SLOTS) *
                                                 m->io.outputs_bytes);
        if (row->output) QT_TRY(infer_out_write(&env->outputs[row->output - 1], outputs,
                                                pd->rows_valid));
    }
    if (!env->progress) return QT_OK;
    sched_progress p = {&rec, row->mode, pd->row, pd->row_step, row->steps, l->done, l->total,
                        pd->rows_valid, outputs, sched_now() - l->start};
    env->progress(env->progress_ctx, &p);
    return QT_OK;
}

// Waits for step `step` (GPU) and consumes its record.
static qt_status sched_retire(sched_loop *l, uint64_t step) {
    uint32_t k = (uint32_t)(step % SCHED_LAG);
    QT_ASSERT(l->pending[k].step == step);
    if (l->env->backend->kind == BACKEND_GPU) {
        QT_TRY(driver_sync_event(l->events[k]));
        l->sum->lagged_reads++;
    }
    return sched_consume(l, &l->pending[k]);
}

static qt_status sched_launch(sched_loop *l, model_mode mode, bool checksum) {
    const sched_env *env = l->env;
    backend *b = env->backend;
    if (env->eager) {
        QT_TRY(backend_run(b, env->programs[mode]));
        if (checksum) QT_TRY(backend_run(b, env->checksum_program));
    } else {
        QT_TRY(backend_launch(b, env->graphs[mode]));
        if (checksum) QT_TRY(backend_launch(b, env->checksum_graph));
    }
    return QT_OK;
}

// One step: the record of step - SCHED_LAG, the batch, the launch, the event.
static qt_status sched_step(sched_loop *l, uint64_t step, uint32_t row_index, uint64_t row_step,
                            uint64_t *train_count) {
    const sched_env *env = l->env;
    const sched_row *row = &l->t->rows[row_index];
    model *m = env->model;
    bool gpu = env->backend->kind == BACKEND_GPU;
    if (gpu && step >= SCHED_LAG) QT_TRY(sched_retire(l, step - SCHED_LAG));
    uint8_t *staging = arena_host_pointer(m->host, m->io.staging);
    uint8_t *slot = staging + (step % MODEL_STAGE_SLOTS) * m->io.slot.bytes;
    uint32_t valid = data_feed_next(sched_feed(env, row), &m->io.slot, slot);
    bool checksum = false;
    if (row->mode == MODEL_MODE_TRAIN) {
        ++*train_count;
        checksum = env->checksum_every && *train_count % env->checksum_every == 0;
    }
    QT_TRY(sched_launch(l, row->mode, checksum));
    uint32_t k = (uint32_t)(step % SCHED_LAG);
    l->pending[k] = (sched_pending){step, row_index, row_step, valid, l->row_start};
    if (gpu) {
        QT_CU(cuEventRecord(l->events[k], env->backend->stream));
        return QT_OK;
    }
    return sched_consume(l, &l->pending[k]);
}

static qt_status sched_rows(sched_loop *l, uint64_t *step) {
    const sched_env *env = l->env;
    uint64_t train_count = 0;
    for (uint32_t r = 0; r < l->t->row_count; r++) {
        const sched_row *row = &l->t->rows[r];
        data_feed *feed = sched_feed(env, row);
        QT_ASSERT(feed != NULL && env->programs[row->mode] != NULL);
        // Eval and infer rows start at the beginning of their dataset, in file order.
        if (row->mode != MODEL_MODE_TRAIN) QT_TRY(data_feed_seek(feed, (data_cursor){0, 0}));
        l->row_start = sched_now();
        for (uint64_t i = 0; i < row->steps; i++) {
            QT_TRY(sched_step(l, *step, r, i + 1, &train_count));
            ++*step;
        }
    }
    return QT_OK;
}

qt_status sched_run(const sched_env *env, const sched_table *t, sched_summary *out) {
    memset(out, 0, sizeof *out);
    sched_loop l;
    memset(&l, 0, sizeof l);
    l.env = env;
    l.t = t;
    l.sum = out;
    for (uint32_t r = 0; r < t->row_count; r++) l.total += t->rows[r].steps;
    bool gpu = env->backend->kind == BACKEND_GPU;
    for (int k = 0; gpu && k < SCHED_LAG; k++) {
        QT_CU(cuEventCreate(&l.events[k], CU_EVENT_DISABLE_TIMING));
    }
    l.start = sched_now();
    uint64_t step = 0;
    qt_status status = sched_rows(&l, &step);
    if (status == QT_OK) {
        // Drain: the records of the steps still in flight.
        uint64_t first = step > SCHED_LAG ? step - SCHED_LAG : 0;
        for (uint64_t s = first; gpu && s < step && status == QT_OK; s++) {
            status = sched_retire(&l, s);
        }
    } else if (gpu) {
        (void)backend_finish(env->backend);  // no launch outlives the loop; the error stands
    }
    for (int k = 0; gpu && k < SCHED_LAG; k++) {
        if (l.events[k]) drv.cuEventDestroy(l.events[k]);
    }
    out->seconds = sched_now() - l.start;
    for (uint32_t r = 0; r < t->row_count; r++) out->steps[t->rows[r].mode] += t->rows[r].steps;
    return status;
}
