#include "runtime/schedule/schedule.h"

#include <string.h>
#include <time.h>  // clock_gettime

#include "runtime/driver/driver.h"  // drv, QT_CU, driver_sync_event

// ---------------------------------------------------------------------------------------------
// The table

static uint32_t sched_lr_rule(recipe_lr_kind k) {
    switch (k) {
    case RECIPE_LR_CONSTANT: return QT_OPTIM_LR_CONSTANT;
    case RECIPE_LR_WARMUP: return QT_OPTIM_LR_LINEAR;
    case RECIPE_LR_DECAY: return QT_OPTIM_LR_LINEAR;
    case RECIPE_LR_COSINE: return QT_OPTIM_LR_COSINE;
    }
    QT_ASSERT(false);
    return 0;
}

uint64_t sched_table_bytes(uint32_t rows, uint32_t lr_rows) {
    return (uint64_t)rows * sizeof(sched_row) + (uint64_t)lr_rows * sizeof(optim_lr_row);
}

void sched_table_init(sched_table *t, void *storage, uint32_t rows, uint32_t lr_rows) {
    QT_ASSERT((storage == NULL) == (rows == 0) && (uintptr_t)storage % 8 == 0);
    memset(t, 0, sizeof *t);
    if (storage == NULL) return;
    t->rows = storage;
    t->row_capacity = rows;
    t->lr = (optim_lr_row *)(void *)(t->rows + rows);
    t->lr_capacity = lr_rows;
}

static void sched_push(sched_table *t, sched_row row) {
    if (t->rows) {
        QT_ASSERT(t->row_count < t->row_capacity);  // the counting build sized it
        t->rows[t->row_count] = row;
    }
    t->row_count++;
    t->steps[row.mode] += row.steps;
    if (row.output) t->outputs = true;
}

static void sched_push_lr(sched_table *t, optim_lr_row lr) {
    if (t->lr) {
        QT_ASSERT(t->lr_count < t->lr_capacity);
        t->lr[t->lr_count] = lr;
    }
    t->lr_count++;
}

void sched_add_constant_lr(sched_table *t, float lr) {
    sched_push_lr(t, (optim_lr_row){0, 1, QT_OPTIM_LR_CONSTANT, lr, lr, 0});
}

static const model_mode sched_modes[] = {MODEL_MODE_TRAIN, MODEL_MODE_EVAL, MODEL_MODE_INFER};

// The recipe's rows in schedule order, every repeat expanded: next row index, or false at the
// end.
typedef struct sched_rows_iter {
    uint32_t row;     // the next recipe row
    uint32_t repeat;  // the repeat block at or after it
    uint32_t round;   // repetitions of that block done
} sched_rows_iter;

static bool sched_rows_next(const recipe *r, sched_rows_iter *it, uint32_t *out) {
    if (it->row >= r->rows_count) return false;
    *out = it->row++;
    if (it->repeat >= r->repeats_count) return true;
    const recipe_repeat *rep = &r->repeats[it->repeat];
    if (it->row != rep->first_row + rep->row_count) return true;
    if (++it->round < rep->times) {  // the block again
        it->row = rep->first_row;
    } else {
        it->round = 0;
        it->repeat++;
    }
    return true;
}

// Building the table: the recipe's rows expanded, and the --steps cut applied as they come.
typedef struct sched_builder {
    const recipe *r;
    const sched_build *options;
    sched_table *t;
    uint64_t epoch;          // train steps of one epoch
    uint64_t pass[2];        // steps of one pass over the train and the eval set
    uint64_t left;           // train steps the cut leaves; UINT64_MAX: no cut
    bool done;               // the cut was reached at a train row: no more rows
} sched_builder;

// Appends a row unless the cut has ended the table (or it is an eval or infer row and
// drop_eval is set). A train row takes what the cut leaves of it; eval and infer rows after the
// cut stay until the next train row (schedule.h).
static qt_status sched_add(sched_builder *b, const recipe_row *rr, sched_row row) {
    if (b->done) return QT_OK;
    if (row.mode == MODEL_MODE_TRAIN) {
        if (b->left == 0) {  // the cut: later rows belong to training yet to come
            b->t->cut = true;
            b->done = true;
            return QT_OK;
        }
        if (row.steps > b->left) {
            row.steps = b->left;
            b->t->cut = true;
        }
        b->left -= row.steps;
    } else if (b->options->drop_eval) {
        return QT_OK;
    }
    if (row.steps == 0) return QT_OK;
    if (b->t->row_count == SCHED_ROWS_MAX) {  // a counting build stops here: memory stays bounded
        return recipe_fail_at(QT_ERR_CAPACITY, b->r->file_name, rr->line, 1, "the schedule "
                              "expands to more than %u rows (an eval clause adds a row after "
                              "every interval, a repeat repeats its rows); expected a longer "
                              "interval or fewer rows", SCHED_ROWS_MAX);
    }
    sched_push(b->t, row);
    return QT_OK;
}

// count in unit as steps; false when it does not fit a row's length.
static bool sched_steps_of(const sched_builder *b, uint64_t count, recipe_unit unit,
                           uint64_t *steps) {
    uint64_t per = unit == RECIPE_UNIT_EPOCHS ? b->epoch : 1;
    // A train set has samples (data_probe); without one the parser allows no epochs.
    QT_ASSERT(per > 0);
    if (count > SCHED_ROW_STEPS_MAX / per) return false;
    *steps = count * per;
    return true;
}

// A train row's learning-rate rows: the warmup's (linear from 0 to the rule's first rate), then
// the rule's over the rest of the row. One graph serves them all (schedule.h).
static void sched_add_lr(sched_builder *b, const recipe_row *rr, uint64_t start,
                         uint64_t steps, uint64_t warmup) {
    if (warmup > 0) {
        sched_push_lr(b->t, (optim_lr_row){start, warmup, QT_OPTIM_LR_LINEAR, 0.0f,
                                           rr->lr_from, 0});
    }
    sched_push_lr(b->t, (optim_lr_row){start + warmup, steps - warmup,
                                       sched_lr_rule(rr->lr_kind), rr->lr_from, rr->lr_to, 0});
}

// A train row: its learning-rate rows, then its steps, in pieces of the eval clause's interval
// (or the build's eval_every) with an eval row after each (the last piece's too).
static qt_status sched_add_train(sched_builder *b, const recipe_row *rr, uint64_t *start) {
    const char *file = b->r->file_name;
    uint64_t steps, warmup = 0, every;
    if (!sched_steps_of(b, rr->steps, rr->unit, &steps)) {
        return recipe_fail_at(QT_ERR_INPUT, file, rr->line, rr->col, "%u epochs of %llu steps "
                              "exceed a row's %llu steps; expected fewer epochs", rr->steps,
                              (unsigned long long)b->epoch,
                              (unsigned long long)SCHED_ROW_STEPS_MAX);
    }
    if (rr->warmup && (!sched_steps_of(b, rr->warmup, rr->warmup_unit, &warmup) ||
                       warmup >= steps)) {
        return recipe_fail_at(QT_ERR_INPUT, file, rr->line, rr->warmup_col, "a warmup of %u "
                              "%s in a row of %llu steps (an epoch is %llu steps); expected a "
                              "warmup shorter than its row", rr->warmup,
                              rr->warmup_unit == RECIPE_UNIT_EPOCHS ? "epochs" : "steps",
                              (unsigned long long)steps, (unsigned long long)b->epoch);
    }
    sched_add_lr(b, rr, *start, steps, warmup);
    *start += steps;
    sched_row eval;
    if (rr->eval_every) {
        // An interval too long to count in steps is longer than the row: one eval, at its end.
        if (!sched_steps_of(b, rr->eval_every, rr->eval_unit, &every)) every = steps;
        eval = (sched_row){MODEL_MODE_EVAL, rr->eval_all ? b->pass[rr->dataset] : rr->eval_steps,
                           rr->dataset, rr->line, 0};
    } else if (b->options->eval_every) {
        every = b->options->eval_every;
        eval = (sched_row){MODEL_MODE_EVAL, b->options->eval_steps, RECIPE_DATASET_EVAL, 0, 0};
    } else {
        return sched_add(b, rr, (sched_row){MODEL_MODE_TRAIN, steps, RECIPE_DATASET_TRAIN,
                                            rr->line, 0});
    }
    for (uint64_t done = 0; done < steps; done += every) {
        uint64_t piece = steps - done < every ? steps - done : every;
        QT_TRY(sched_add(b, rr, (sched_row){MODEL_MODE_TRAIN, piece, RECIPE_DATASET_TRAIN,
                                            rr->line, 0}));
        QT_TRY(sched_add(b, rr, eval));
    }
    return QT_OK;
}

qt_status sched_table_build(const recipe *r, const sched_build *options, sched_table *t) {
    QT_ASSERT(options->eval_every == 0 || options->eval_steps >= 1);
    t->row_count = t->lr_count = 0;
    memset(t->steps, 0, sizeof t->steps);
    memset(t->modes, 0, sizeof t->modes);
    t->cut = t->outputs = false;
    sched_builder b = {r, options, t, data_batches_per_epoch(options->train_samples,
                                                             options->batch),
                       {data_batches_per_epoch(options->train_samples, options->batch),
                        data_batches_per_epoch(options->eval_samples, options->batch)},
                       options->steps_limit ? options->steps_limit : UINT64_MAX, false};
    t->epoch_steps = b.epoch;
    if (options->eval_every > 0) t->modes[MODEL_MODE_EVAL] = true;
    uint64_t start = 0;
    sched_rows_iter it = {0, 0, 0};
    uint32_t i;
    while (sched_rows_next(r, &it, &i)) {
        const recipe_row *rr = &r->rows[i];
        t->modes[sched_modes[rr->mode]] = true;
        if (rr->mode == RECIPE_MODE_TRAIN) {
            if (rr->eval_every) t->modes[MODEL_MODE_EVAL] = true;
            QT_TRY(sched_add_train(&b, rr, &start));
            continue;
        }
        sched_row row = {sched_modes[rr->mode], rr->all ? b.pass[rr->dataset] : rr->steps,
                         rr->dataset, rr->line, rr->output[0] != '\0' ? i + 1 : 0};
        QT_TRY(sched_add(&b, rr, row));
    }
    return QT_OK;
}

uint64_t sched_rows_hash(const sched_table *t, uint32_t count) {
    QT_ASSERT(count <= t->row_count);
    uint64_t h = trace_hash(NULL, 0);
    for (uint32_t i = 0; i < count; i++) {
        const sched_row *row = &t->rows[i];
        uint64_t fields[3] = {(uint64_t)row->mode, row->steps, (uint64_t)row->dataset};
        h = trace_hash_more(h, fields, sizeof fields);
    }
    return h;
}

static const char *sched_dataset_name(const sched_row *row) {
    if (row->mode == MODEL_MODE_TRAIN) return "shuffled train set";
    return row->dataset == RECIPE_DATASET_EVAL ? "eval set" : "train set";
}

qt_status sched_check_position(const sched_table *t, const sched_state *s,
                               uint64_t saved_rows_hash, sched_row saved_row) {
    if (s->row > t->row_count || sched_rows_hash(t, s->row) != saved_rows_hash) {
        return qt_fail(QT_ERR_MISMATCH, "schedule: the checkpoint stands at row %u step %llu "
                       "(step %llu) of a schedule whose rows before it differ from this run's "
                       "(%u rows); resume with the --steps of the run that saved it, or more",
                       s->row, (unsigned long long)s->row_step, (unsigned long long)s->step,
                       t->row_count);
    }
    if (s->row == t->row_count) {
        if (s->row_step == 0) return QT_OK;  // the end of this table: nothing left to run
        return qt_fail(QT_ERR_MISMATCH, "schedule: the checkpoint stands at step %llu of row "
                       "%u, which this run's schedule does not have (%u rows); resume with a "
                       "larger --steps", (unsigned long long)s->row_step, s->row, t->row_count);
    }
    const sched_row *row = &t->rows[s->row];
    if (row->mode != saved_row.mode || row->dataset != saved_row.dataset) {
        return qt_fail(QT_ERR_MISMATCH, "schedule: row %u is %s on the %s in the checkpoint, "
                       "%s on the %s in this run", s->row, model_mode_name(saved_row.mode),
                       sched_dataset_name(&saved_row), model_mode_name(row->mode),
                       sched_dataset_name(row));
    }
    if (row->steps < s->row_step) {
        return qt_fail(QT_ERR_MISMATCH, "schedule: the checkpoint stands at step %llu of row %u "
                       "(train step %llu), beyond this run's %llu steps of that row; resume "
                       "with a larger --steps (or none)", (unsigned long long)s->row_step,
                       s->row, (unsigned long long)s->train_steps,
                       (unsigned long long)row->steps);
    }
    return QT_OK;
}

void sched_table_infer(uint64_t samples, uint32_t batch, sched_table *t) {
    t->row_count = t->lr_count = 0;
    memset(t->steps, 0, sizeof t->steps);
    memset(t->modes, 0, sizeof t->modes);
    t->cut = t->outputs = false;
    t->modes[MODEL_MODE_INFER] = true;
    sched_row row = {MODEL_MODE_INFER, data_batches_per_epoch(samples, batch),
                     RECIPE_DATASET_TRAIN, 0, 1};
    sched_push(t, row);
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
    uint64_t row_step;  // 1-based
    uint32_t rows_valid;
    double row_start;   // when the row's first step (in this loop) was launched
    uint64_t train_steps;  // the run's train steps up to this step, this one included
} sched_pending;

// The proof in schedule.h needs a host slot for each step in flight plus the one being filled,
// and each device slot's last reader among the steps whose events are still held.
QT_STATIC_ASSERT(MODEL_HOST_SLOTS == SCHED_LAG + 1, "host slots: steps in flight + 1");
QT_STATIC_ASSERT(MODEL_DEVICE_SLOTS == 2 && SCHED_LAG >= MODEL_DEVICE_SLOTS,
                 "device slots: by parity, their last reader's event still held");

// A step's place in the table: its row and its 1-based step within the row.
typedef struct sched_at {
    uint32_t row;
    uint64_t row_step;
} sched_at;

typedef struct sched_loop {
    const sched_env *env;
    const sched_table *t;
    sched_state *state;
    sched_summary *sum;
    bool gpu;
    CUevent events[SCHED_LAG];            // compute stream: behind step s at s % SCHED_LAG
    CUevent copied[MODEL_DEVICE_SLOTS];   // copy stream: behind step s's batch copy
    sched_pending pending[SCHED_LAG];
    uint64_t first;          // the loop's first step (the steps before it are not in flight)
    uint64_t retired;        // steps whose records have been read: [first, retired)
    uint64_t staged;         // steps whose batch copy has been queued: [first, staged)
    uint32_t staged_valid;   // real rows of the last batch staged
    uint64_t saved_at;       // the step of the last save; UINT64_MAX: none yet
    double start, row_start;
    uint64_t total, done;    // steps of this loop
    uint64_t mode_total[MODEL_MODE_COUNT];  // steps of each mode this loop runs
    uint64_t next_train_read;  // the step after the last train record read (0: none yet)
    double last_train_read;    // when that record was read
} sched_loop;

static data_feed *sched_feed(const sched_env *env, const sched_row *row) {
    if (row->mode == MODEL_MODE_TRAIN) return env->train_feed;
    if (row->dataset == RECIPE_DATASET_EVAL) return env->eval_feed;
    return env->train_plain;
}

// Adds an eval step to the pass under way and tells the pass so far (*p's pass_*); at the
// row's end the pass becomes the summary's last eval row.
static void sched_eval_accumulate(sched_loop *l, const qt_trace_record *rec, uint32_t valid,
                                  bool row_end, sched_progress *p) {
    sched_state *s = l->state;
    // accuracy = RN(correct / valid) with valid < 2^24, so RN(accuracy * valid) is correct.
    s->eval_correct += (uint64_t)((double)rec->accuracy * valid + 0.5);
    s->eval_valid += valid;
    s->eval_loss_sum += (double)rec->loss * valid;
    p->pass_samples = s->eval_valid;
    p->pass_loss = s->eval_valid ? s->eval_loss_sum / (double)s->eval_valid : 0.0;
    p->pass_accuracy = s->eval_valid ? (double)s->eval_correct / (double)s->eval_valid : 0.0;
    if (!row_end) return;
    s->has_eval = 1;
    s->eval_samples = s->eval_valid;
    s->eval_loss = s->eval_valid ? s->eval_loss_sum / (double)s->eval_valid : 0.0;
    s->eval_accuracy = s->eval_valid ? (double)s->eval_correct / (double)s->eval_valid : 0.0;
    s->eval_loss_sum = 0;
    s->eval_correct = 0;
    s->eval_valid = 0;
}

// The interval since the last train record, when that was the step before (schedule.h).
static void sched_time_train_step(sched_loop *l, uint64_t step, double now) {
    if (l->next_train_read != 0 && l->next_train_read == step) {
        sched_summary *s = l->sum;
        s->step_ms[s->step_time_count++ % SCHED_STEP_TIMES] =
            (float)(1e3 * (now - l->last_train_read));
    }
    l->next_train_read = step + 1;
    l->last_train_read = now;
}

// The record of finished step `step` from the pinned ring, checked against the host's count.
static qt_status sched_read_record(const model *m, uint64_t step, qt_trace_record *rec) {
    uint64_t ring = (uint64_t)(uintptr_t)arena_host_pointer(m->host, m->io.ring);
    qt_trace_ring_unpack(qt_trace_ring_at(ring, step % MODEL_RING_LEN, m->delayed_count),
                         m->delayed_count, rec);
    if (rec->step != step) {
        return qt_fail(QT_ERR_MISMATCH, "step %llu: its record says step %llu; the device "
                       "counter and the host loop disagree", (unsigned long long)step,
                       (unsigned long long)rec->step);
    }
    return QT_OK;
}

// Reads the record of a finished step and hands it on.
static qt_status sched_consume(sched_loop *l, const sched_pending *pd) {
    const sched_env *env = l->env;
    model *m = env->model;
    qt_trace_record rec;
    QT_TRY(sched_read_record(m, pd->step, &rec));
    if (env->trace) QT_TRY(trace_write(env->trace, &rec));
    if (env->check) QT_TRY(trace_check_record(env->check, &rec));
    const sched_row *row = &l->t->rows[pd->row];
    bool row_end = pd->row_step == row->steps;
    l->done++;
    l->sum->steps[row->mode]++;
    sched_progress p;
    memset(&p, 0, sizeof p);
    if (row->mode == MODEL_MODE_TRAIN) {
        double now = sched_now();
        sched_time_train_step(l, pd->step, now);
        l->state->last_train_loss = rec.loss;
        if (rec.flags & QT_TRACE_FLAG_SKIPPED) l->sum->skipped++;
        if (row_end) l->sum->train_seconds += now - pd->row_start;
    }
    if (row->mode == MODEL_MODE_EVAL) {
        sched_eval_accumulate(l, &rec, pd->rows_valid, row_end, &p);
    }
    if (row->mode == MODEL_MODE_INFER) {
        const uint8_t *slots = arena_host_pointer(m->host, m->io.outputs);
        p.outputs = (const uint16_t *)(slots + (pd->step % MODEL_OUTPUT_SLOTS) *
                                                   m->io.outputs_bytes);
        if (row->output && env->outputs) {
            QT_TRY(infer_out_write(&env->outputs[row->output - 1], p.outputs, pd->rows_valid));
        }
    }
    if (!env->progress && !env->record) return QT_OK;
    p.record = &rec;
    p.mode = row->mode;
    p.row = pd->row;
    p.row_step = pd->row_step;
    p.row_steps = row->steps;
    p.dataset = row->dataset;
    p.done = l->done;
    p.total = l->total;
    for (int mode = 0; mode < MODEL_MODE_COUNT; mode++) {
        p.left[mode] = l->mode_total[mode] - l->sum->steps[mode];
    }
    p.train_steps = pd->train_steps;
    p.epoch_steps = l->t->epoch_steps;
    p.rows_valid = pd->rows_valid;
    p.elapsed_s = sched_now() - l->start;
    if (env->record) QT_TRY(env->record(env->record_ctx, &p));
    if (env->progress) env->progress(env->progress_ctx, &p);
    return QT_OK;
}

// Waits for the oldest unread step (GPU) and consumes its record.
static qt_status sched_retire(sched_loop *l) {
    uint64_t step = l->retired;
    uint32_t k = (uint32_t)(step % SCHED_LAG);
    QT_ASSERT(l->pending[k].step == step);
    if (l->gpu) {
        QT_TRY(driver_sync_event(&l->env->backend->syncs, l->events[k]));
        l->sum->lagged_reads++;
    }
    l->retired++;
    return sched_consume(l, &l->pending[k]);
}

// Reads every record still in flight: afterwards both streams are idle. Drains come between a
// step's launch and the next step's staging, so no batch copy is queued past the launched steps
// and the last one waited for its own: its event covers every copy.
static qt_status sched_drain(sched_loop *l) {
    QT_ASSERT(l->staged == l->state->step);
    while (l->retired < l->state->step) QT_TRY(sched_retire(l));
    return QT_OK;
}

static qt_status sched_save(sched_loop *l) {
    if (!l->env->save || l->saved_at == l->state->step) return QT_OK;
    QT_TRY(sched_drain(l));
    l->saved_at = l->state->step;
    l->next_train_read = 0;  // the save's time is no step's
    return l->env->save(l->env->save_ctx, l->state);
}

static qt_status sched_launch(const sched_env *env, model_mode mode, bool checksum) {
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

// The place of the state's next step; false at the table's end. A row whose steps are done
// moves the state to the start of the next row (row_count at the end).
static bool sched_next_at(const sched_table *t, sched_state *s, sched_at *at) {
    while (s->row < t->row_count && s->row_step >= t->rows[s->row].steps) {
        s->row++;
        s->row_step = 0;
    }
    if (s->row == t->row_count) return false;
    *at = (sched_at){s->row, s->row_step + 1};
    return true;
}

// The batch of global step `step` into its host slot: the fill hook's, else the feed's.
static qt_status sched_fill(const sched_env *env, model_mode mode, data_feed *feed,
                            uint64_t step, uint8_t *slot, uint32_t *rows_valid) {
    *rows_valid = 0;
    if (env->fill) QT_TRY(env->fill(env->fill_ctx, mode, step, slot, rows_valid));
    if (*rows_valid > 0) return QT_OK;
    if (!feed) {
        return qt_fail(QT_ERR_INPUT, "step %llu (%s): no batch: the recipe names no data source "
                       "for it, and none was pushed (qt_push_batch) or given by the data "
                       "callback (qt_on_data)", (unsigned long long)step, model_mode_name(mode));
    }
    // The real rows of the whole batch: a data-parallel rank's record (its loss, its accuracy)
    // is the global batch's, and an eval pass weighs it by them.
    data_feed_next(feed, &env->model->io.slot, slot);
    *rows_valid = ((const data_slot_header *)(const void *)slot)->rows_global;
    return QT_OK;
}

// Fills host slot s % MODEL_HOST_SLOTS with the batch of the state's next step s (at `at`) and
// queues its copy into device slot s % MODEL_DEVICE_SLOTS after the last step that read that
// device slot, when this loop launched it (the steps before the loop are done).
static qt_status sched_stage(sched_loop *l, sched_at at) {
    const sched_env *env = l->env;
    const sched_row *row = &l->t->rows[at.row];
    uint64_t step = l->state->step;
    QT_ASSERT(l->staged == step);
    model *m = env->model;
    data_feed *feed = sched_feed(env, row);
    QT_ASSERT(env->programs[row->mode] != NULL);
    // Eval and infer rows start at the beginning of their dataset, in file order; a row
    // resumed in its middle continues from its feed's cursor.
    if (feed && row->mode != MODEL_MODE_TRAIN && at.row_step == 1) {
        QT_TRY(data_feed_seek(feed, (data_cursor){0, 0}));
    }
    uint64_t bytes = m->io.slot.bytes;
    prog_ref host = {m->host, m->io.staging, (step % MODEL_HOST_SLOTS) * bytes};
    prog_ref dev = {m->dev, m->io.staged, (step % MODEL_DEVICE_SLOTS) * bytes};
    uint8_t *slot = (uint8_t *)arena_host_pointer(m->host, m->io.staging) + host.offset;
    QT_TRY(sched_fill(env, row->mode, feed, step, slot, &l->staged_valid));
    CUevent last_reader = step >= l->first + MODEL_DEVICE_SLOTS
                              ? l->events[(step - MODEL_DEVICE_SLOTS) % SCHED_LAG] : NULL;
    // A slot of indices crosses as its header and indices; the step gathers the rows.
    QT_TRY(backend_copy_beside(env->backend, dev, host, data_slot_copy_bytes(&m->io.slot, slot),
                               last_reader, l->copied[step % MODEL_DEVICE_SLOTS]));
    l->staged = step + 1;
    l->sum->batch_copies++;
    return QT_OK;
}

// One step, the state's next (at `at`): the record of step - SCHED_LAG, the wait for this
// step's batch copy, the launch, the event; the state moves past the step.
static qt_status sched_step(sched_loop *l, sched_at at) {
    const sched_env *env = l->env;
    sched_state *s = l->state;
    const sched_row *row = &l->t->rows[at.row];
    uint64_t step = s->step;
    QT_ASSERT(l->staged == step + 1 && at.row == s->row && at.row_step == s->row_step + 1);
    if (at.row_step == 1 || step == l->first) l->row_start = sched_now();
    if (l->gpu && step >= l->retired + SCHED_LAG) QT_TRY(sched_retire(l));
    bool checksum = false;
    if (row->mode == MODEL_MODE_TRAIN) {
        s->train_steps++;
        checksum = env->checksum_every && s->train_steps % env->checksum_every == 0;
    }
    QT_TRY(backend_wait(env->backend, l->copied[step % MODEL_DEVICE_SLOTS]));
    QT_TRY(sched_launch(env, row->mode, checksum));
    s->step++;
    s->row_step++;
    uint32_t k = (uint32_t)(step % SCHED_LAG);
    l->pending[k] = (sched_pending){step, at.row, at.row_step, l->staged_valid, l->row_start,
                                    s->train_steps};
    if (l->gpu) {
        QT_CU(cuEventRecord(l->events[k], env->backend->stream));
        return QT_OK;
    }
    return sched_retire(l);
}

// After a train step: the periodic save, and the one at a cut table's last train step.
static qt_status sched_train_saves(sched_loop *l) {
    const sched_state *s = l->state;
    bool periodic = l->env->save_every && s->train_steps % l->env->save_every == 0;
    bool cut_end = l->t->cut && s->train_steps == l->t->steps[MODEL_MODE_TRAIN];
    return periodic || cut_end ? sched_save(l) : QT_OK;
}

// Whether to stop before the state's next step, at `at` (the summary says so). An infer row that
// writes a file runs whole, so that the file is complete: a stop inside it waits for its end.
static bool sched_stopping(sched_loop *l, sched_at at) {
    if (l->t->rows[at.row].output && at.row_step > 1) return false;
    const sched_env *env = l->env;
    bool stop = (env->interrupt && *env->interrupt) ||
                (env->stop_at && l->state->step >= env->stop_at);
    if (stop) l->sum->stopped = true;
    return stop;
}

// Stops and saves come after a step and before the next one's batch is staged, so the feeds
// stand at the state's position whenever a checkpoint is taken (schedule.h).
static qt_status sched_rows(sched_loop *l) {
    sched_at at;
    if (!sched_next_at(l->t, l->state, &at) || sched_stopping(l, at)) return QT_OK;
    QT_TRY(sched_stage(l, at));  // the first step's batch: the priming copy
    for (;;) {
        model_mode mode = l->t->rows[at.row].mode;
        QT_TRY(sched_step(l, at));
        if (mode == MODEL_MODE_TRAIN) QT_TRY(sched_train_saves(l));
        if (!sched_next_at(l->t, l->state, &at) || sched_stopping(l, at)) return QT_OK;
        QT_TRY(sched_stage(l, at));
    }
}

// Steps the table has from the state's position on, in all and of each mode.
static uint64_t sched_steps_left(const sched_table *t, const sched_state *s,
                                 uint64_t mode_total[MODEL_MODE_COUNT]) {
    uint64_t total = 0;
    for (uint32_t r = s->row; r < t->row_count; r++) {
        uint64_t steps = t->rows[r].steps - (r == s->row ? s->row_step : 0);
        mode_total[t->rows[r].mode] += steps;
        total += steps;
    }
    return total;
}

// The summary's carried fields come from the state (a resumed run reports the last eval row
// even when it runs none).
static void sched_summarize(const sched_state *s, sched_summary *out) {
    out->last_train_loss = s->last_train_loss;
    out->has_eval = s->has_eval != 0;
    out->eval_loss = s->eval_loss;
    out->eval_accuracy = s->eval_accuracy;
    out->eval_samples = s->eval_samples;
}

qt_status sched_run(const sched_env *env, const sched_table *t, sched_state *state,
                    sched_summary *out) {
    memset(out, 0, sizeof *out);
    sched_loop l;
    memset(&l, 0, sizeof l);
    l.env = env;
    l.t = t;
    l.state = state;
    l.sum = out;
    l.gpu = env->backend->kind == BACKEND_GPU;
    l.first = state->step;
    l.retired = state->step;
    l.staged = state->step;
    l.saved_at = UINT64_MAX;
    QT_ASSERT(state->row <= t->row_count);
    l.total = sched_steps_left(t, state, l.mode_total);
    for (int k = 0; l.gpu && k < SCHED_LAG; k++) {
        QT_CU(cuEventCreate(&l.events[k], CU_EVENT_DISABLE_TIMING));
    }
    for (int k = 0; l.gpu && k < MODEL_DEVICE_SLOTS; k++) {
        QT_CU(cuEventCreate(&l.copied[k], CU_EVENT_DISABLE_TIMING));
    }
    l.start = sched_now();
    qt_status status = sched_rows(&l);
    if (status == QT_OK) status = sched_drain(&l);
    if (out->stopped && state->row < t->row_count && state->row_step > 0 &&
        t->rows[state->row].mode == MODEL_MODE_TRAIN) {
        out->train_seconds += sched_now() - l.row_start;  // the row's part that ran
    }
    // The end of a table that --steps did not cut, or a stop; a cut table saved at its cut.
    if (status == QT_OK && (out->stopped || !t->cut)) status = sched_save(&l);
    // After an error work may still be in flight on either stream (a batch staged for a step
    // that never launched, too): none outlives the loop (the last copy covers the earlier
    // ones). A loop that ends well has drained, and makes no such call.
    if (l.gpu && status != QT_OK) {
        CUevent last_copy = l.copied[(l.staged + MODEL_DEVICE_SLOTS - 1) % MODEL_DEVICE_SLOTS];
        if (l.staged > l.first) (void)backend_wait(env->backend, last_copy);
        (void)backend_finish(env->backend);  // the error stands
    }
    for (int k = 0; l.gpu && k < SCHED_LAG; k++) {
        if (l.events[k]) drv.cuEventDestroy(l.events[k]);
    }
    for (int k = 0; l.gpu && k < MODEL_DEVICE_SLOTS; k++) {
        if (l.copied[k]) drv.cuEventDestroy(l.copied[k]);
    }
    out->seconds = sched_now() - l.start;
    sched_summarize(state, out);
    return status;
}

// ---------------------------------------------------------------------------------------------
// A step outside the table

qt_status sched_step_outside(const sched_env *env, model_mode mode, sched_state *state,
                             qt_trace_record *record, uint32_t *rows_valid) {
    model *m = env->model;
    backend *b = env->backend;
    QT_ASSERT(env->programs[mode] != NULL);
    double start = sched_now();
    uint64_t step = state->step;
    data_feed *feed = mode == MODEL_MODE_TRAIN ? env->train_feed
                      : env->eval_feed         ? env->eval_feed
                                               : env->train_plain;
    uint64_t bytes = m->io.slot.bytes;
    uint8_t *slot = (uint8_t *)arena_host_pointer(m->host, m->io.staging) +
                    (step % MODEL_HOST_SLOTS) * bytes;
    QT_TRY(sched_fill(env, mode, feed, step, slot, rows_valid));
    // The device slot the program reads at this step (by the counter's parity), through the
    // compute stream: nothing is in flight, so a copy that waits costs this step alone.
    prog_ref dev = {m->dev, m->io.staged, (step % MODEL_DEVICE_SLOTS) * bytes};
    QT_TRY(backend_write(b, dev, slot, data_slot_copy_bytes(&m->io.slot, slot)));
    bool checksum = mode == MODEL_MODE_TRAIN && env->checksum_every &&
                    (state->train_steps + 1) % env->checksum_every == 0;
    QT_TRY(sched_launch(env, mode, checksum));
    QT_TRY(backend_finish(b));
    QT_TRY(sched_read_record(m, step, record));
    state->step++;
    if (mode == MODEL_MODE_TRAIN) {
        state->train_steps++;
        state->last_train_loss = record->loss;
    }
    if (env->trace) QT_TRY(trace_write(env->trace, record));
    if (env->check) QT_TRY(trace_check_record(env->check, record));
    if (!env->progress) return QT_OK;
    const uint16_t *outputs = NULL;
    if (mode == MODEL_MODE_INFER) {
        const uint8_t *slots = arena_host_pointer(m->host, m->io.outputs);
        outputs = (const uint16_t *)(slots + (step % MODEL_OUTPUT_SLOTS) * m->io.outputs_bytes);
    }
    sched_progress p;
    memset(&p, 0, sizeof p);
    p.record = record;
    p.mode = mode;
    p.row = SCHED_ROW_NONE;
    p.row_step = p.row_steps = 1;
    p.dataset = feed == env->eval_feed && mode != MODEL_MODE_TRAIN ? RECIPE_DATASET_EVAL
                                                                    : RECIPE_DATASET_TRAIN;
    p.done = p.total = 1;
    p.train_steps = state->train_steps;
    p.rows_valid = *rows_valid;
    if (mode == MODEL_MODE_EVAL) {  // a pass of one step
        p.pass_loss = record->loss;
        p.pass_accuracy = record->accuracy;
        p.pass_samples = *rows_valid;
    }
    p.outputs = outputs;
    p.elapsed_s = sched_now() - start;
    env->progress(env->progress_ctx, &p);
    return QT_OK;
}
