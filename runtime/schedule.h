// schedule: the schedule table (DESIGN.md 2.8) and the host loop that runs it.
//
// Owns the table (rows of {mode, steps, dataset} and the device's learning-rate rows) inside the
// caller's sched_table, and nothing during the loop but its locals: the programs, graphs, feeds
// and trace belong to the caller (runtime/run.c). One thread.
//
// The table comes from the recipe's [schedule]: `eval all` and `infer all` become one pass over
// their dataset (data_batches_per_epoch), every train row adds one optim_lr_row (start = the
// train steps before it, so one graph serves every row: the device picks the row from its step
// counter, ptx/optim.h). --steps N cuts the table after N train steps and keeps the eval and
// infer rows that follow the cut up to the next train row; the learning-rate rows are those of
// the whole recipe, so a cut run follows the same curve. sched_interleave_eval splits train rows
// and puts an eval row after every k train steps (the eval-interleaving regression).
//
// The loop, per global step s (train, eval and infer steps share one index, as the device
// counter of ptx/sched.h does):
//
//   s >= 2:  wait for the event of step s - 2 (the only synchronizing call), read its record
//            from the pinned ring, write it to the trace, update the summary and the progress
//   fill staging slot s % 2 with the next batch of the row's feed (the device finished reading
//            it: it was step s - 2's)
//   launch the mode's graph (or its ops, eager); after every `checksum_every`-th train step the
//            checksum program; record the event of step s
//   then drain the last two steps.
//
// On the reference backend a launch completes before it returns, so each record is read right
// after its step. The loop makes no allocation and no other synchronizing call, which
// driver_sync_counts prove (sched_summary.lagged_reads is the number of waits).
//
// Position and stops. The loop starts from a sched_state (zero: the beginning; a checkpoint's:
// where that run stopped) and leaves it where it ended. Between two steps it may stop or save;
// both first drain (read the records of the steps in flight), so the device is idle, every
// record is in the trace and the state describes the device exactly:
//
//   save   after every `save_every`-th train step (counted over the whole run, resumed parts
//          included), after the last train step of a table that --steps cut, at a stop, and at
//          the end of a table that was not cut; never twice at the same step
//   stop   when *interrupt becomes non-zero (a signal handler sets it) or after stop_at steps
//
// A save changes nothing the device computes, so a run with saves gives the trace of the run
// without them. Why a cut table saves after its last train step and not at its end: the eval
// and infer rows that follow the cut run early (in the uncut table they follow the whole train
// row), so the position before them is the one a longer run passes through.
#ifndef QT_SCHEDULE_H
#define QT_SCHEDULE_H

#include <signal.h>   // sig_atomic_t

#include "backend.h"  // backend, backend_graph
#include "data.h"     // data_feed, data_info
#include "model.h"    // model, model_mode
#include "optim.h"    // optim_lr_row
#include "recipe.h"
#include "trace.h"    // trace_writer

#define SCHED_ROWS_MAX 4096
#define SCHED_LAG 2  // steps between a launch and the read of its record (= staging slots)

typedef struct sched_row {
    model_mode mode;
    uint64_t steps;
    recipe_dataset dataset;  // eval and infer rows
    uint32_t line;           // the recipe line it came from (0: added by sched_interleave_eval)
} sched_row;

typedef struct sched_table {
    uint32_t row_count;
    sched_row rows[SCHED_ROWS_MAX];
    uint32_t lr_count;
    optim_lr_row lr[RECIPE_SCHEDULE_ROWS_MAX];
    uint64_t steps[MODEL_MODE_COUNT];  // steps of each mode in the table
    bool modes[MODEL_MODE_COUNT];      // modes of the recipe's table (before any cut)
    bool cut;                          // --steps removed train steps of the recipe
} sched_table;

// Where a run stands between two steps, and what its summary carries over: everything of the
// host loop that a checkpoint keeps (runtime/checkpoint.h stores it as it is, little-endian).
typedef struct sched_state {
    uint64_t step;            // steps done, every mode (= the device step counter)
    uint64_t train_steps;     // train steps done (checksum_every and save_every count them)
    uint32_t row;             // table row of the next step; row_count when the table is done
    uint32_t reserved;
    uint64_t row_step;        // steps of that row already done
    data_cursor train;        // the shuffled train feed
    data_cursor train_plain;  // the train set in file order (eval and infer rows on it)
    data_cursor eval;         // the eval set
    float last_train_loss;    // the summary's carry: the last train record's loss,
    uint32_t has_eval;        // whether an eval row has ended, and that row's results
    double eval_loss, eval_accuracy;
    uint64_t eval_samples;
    double eval_loss_sum;     // the eval row under way
    uint64_t eval_correct, eval_valid;
} sched_state;
QT_STATIC_ASSERT(sizeof(sched_state) == 136, "sched_state is saved in checkpoints");

// The table of r for datasets of the given sizes (eval_samples 0 without an eval set), cut after
// steps_limit train steps (0: no cut).
qt_status sched_table_build(const recipe *r, uint64_t train_samples, uint64_t eval_samples,
                            uint32_t batch, uint64_t steps_limit, sched_table *t);

// Splits every train row into pieces of `every` steps, each followed by an eval row of
// eval_steps steps on the eval dataset. QT_ERR_CAPACITY beyond SCHED_ROWS_MAX rows.
qt_status sched_interleave_eval(sched_table *t, uint64_t every, uint64_t eval_steps);

// Removes every eval and infer row (the reference run of the interleaving regression).
void sched_drop_eval(sched_table *t);

// Hash of rows [0, count) (mode, steps, dataset): a checkpoint keeps it to recognize the table
// that it may continue.
uint64_t sched_rows_hash(const sched_table *t, uint32_t count);

// Whether a run with table t can continue from s: the rows before s->row are t's, the row of
// s has t's mode and dataset and at least s->row_step steps in t (it may be longer: the saving
// run's --steps cut it). saved_rows_hash / saved_row are the saving run's (sched_rows_hash of
// rows [0, s->row), and its row s->row, steps ignored). QT_ERR_MISMATCH naming the difference.
qt_status sched_check_position(const sched_table *t, const sched_state *s,
                               uint64_t saved_rows_hash, sched_row saved_row);

// What the loop tells its caller after each record it reads.
typedef struct sched_progress {
    const qt_trace_record *record;
    model_mode mode;
    uint32_t row;             // index into the table
    uint64_t row_step;        // 1-based step within the row
    uint64_t row_steps;
    uint64_t done, total;     // steps of the whole table
    uint32_t rows_valid;      // real rows of the step's batch
    const uint16_t *outputs;  // infer: bf16 [batch][outputs], valid during the call
    double elapsed_s;         // since the loop started
} sched_progress;

typedef void (*sched_progress_fn)(void *ctx, const sched_progress *p);

typedef struct sched_env {
    backend *backend;
    model *model;
    const program *programs[MODEL_MODE_COUNT];
    const backend_graph *graphs[MODEL_MODE_COUNT];  // used unless eager
    const program *checksum_program;
    const backend_graph *checksum_graph;
    bool eager;
    uint32_t checksum_every;  // train steps between checksums; 0 = none
    data_feed *train_feed;    // shuffled, for train rows
    data_feed *train_plain;   // the train set in file order (eval / infer rows on it)
    data_feed *eval_feed;     // the eval set in file order, or NULL
    trace_writer *trace;      // NULL: no trace
    sched_progress_fn progress;
    void *progress_ctx;
    // Checkpoints: save (NULL: none) is called at the save points above with the state after
    // the drain; save_every 0 = no periodic saves.
    qt_status (*save)(void *ctx, const sched_state *state);
    void *save_ctx;
    uint64_t save_every;
    const volatile sig_atomic_t *interrupt;  // NULL: never; non-zero: stop at the next boundary
    uint64_t stop_at;                         // stop once this many steps are done; 0 = never
} sched_env;

// Of the steps this loop ran (a resumed run counts its own); the last train loss and eval
// results carry over from the starting state.
typedef struct sched_summary {
    uint64_t steps[MODEL_MODE_COUNT];
    uint64_t skipped;            // train steps the optimizer skipped (non-finite gradients)
    bool stopped;                // an interrupt or stop_at ended the loop before the table
    float last_train_loss;
    bool has_eval;
    double eval_loss;            // the last eval row: mean over its samples
    double eval_accuracy;        // correct / samples of the last eval row (classification)
    uint64_t eval_samples;
    double seconds;              // the loop's wall time
    double train_seconds;        // wall time of the train rows
    uint64_t lagged_reads;       // synchronizing waits the loop made
} sched_summary;

// Runs t from *state (a position sched_check_position accepts) to its end or a stop, and
// leaves *state there. Feeds must stand at the state's cursors (data_feed_seek).
qt_status sched_run(const sched_env *env, const sched_table *t, sched_state *state,
                    sched_summary *out);

#endif  // QT_SCHEDULE_H
