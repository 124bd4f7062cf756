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
// Reading a record also checks it against the golden trace, if there is one (the first
// difference ends the loop), and hands an infer step's outputs (the pinned slot its program
// copied them into) to the row's output file, if it has one (runtime/infer_out.h): the read
// needs no synchronization of its own.
//
// On the reference backend a launch completes before it returns, so each record is read right
// after its step. The loop makes no allocation and no other synchronizing call, which
// driver_sync_counts prove (sched_summary.lagged_reads is the number of waits).
#ifndef QT_SCHEDULE_H
#define QT_SCHEDULE_H

#include "backend.h"  // backend, backend_graph
#include "data.h"     // data_feed, data_info
#include "infer_out.h"  // infer_out
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
    uint32_t output;         // infer rows that write a file: 1 + its index in sched_env.outputs
                             // (the recipe row's index); 0: none
} sched_row;

typedef struct sched_table {
    uint32_t row_count;
    sched_row rows[SCHED_ROWS_MAX];
    uint32_t lr_count;
    optim_lr_row lr[RECIPE_SCHEDULE_ROWS_MAX];
    uint64_t steps[MODEL_MODE_COUNT];  // steps of each mode in the table
    bool modes[MODEL_MODE_COUNT];      // modes of the recipe's table (before any cut)
} sched_table;

// The table of r for datasets of the given sizes (eval_samples 0 without an eval set), cut after
// steps_limit train steps (0: no cut).
qt_status sched_table_build(const recipe *r, uint64_t train_samples, uint64_t eval_samples,
                            uint32_t batch, uint64_t steps_limit, sched_table *t);

// Splits every train row into pieces of `every` steps, each followed by an eval row of
// eval_steps steps on the eval dataset. QT_ERR_CAPACITY beyond SCHED_ROWS_MAX rows.
qt_status sched_interleave_eval(sched_table *t, uint64_t every, uint64_t eval_steps);

// Removes every eval and infer row (the reference run of the interleaving regression).
void sched_drop_eval(sched_table *t);

// `qtrain infer`: one infer row of one pass over the (train) dataset, writing outputs[0].
void sched_table_infer(uint64_t samples, uint32_t batch, sched_table *t);

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
    trace_checker *check;     // NULL: no golden trace; else each record must match its own
    infer_out *outputs;       // the files of infer rows with an output (sched_row.output)
    sched_progress_fn progress;
    void *progress_ctx;
} sched_env;

typedef struct sched_summary {
    uint64_t steps[MODEL_MODE_COUNT];
    uint64_t skipped;            // train steps the optimizer skipped (non-finite gradients)
    float last_train_loss;
    bool has_eval;
    double eval_loss;            // the last eval row: mean over its samples
    double eval_accuracy;        // correct / samples of the last eval row (classification)
    uint64_t eval_samples;
    double seconds;              // the loop's wall time
    double train_seconds;        // wall time of the train rows
    uint64_t lagged_reads;       // synchronizing waits the loop made
} sched_summary;

qt_status sched_run(const sched_env *env, const sched_table *t, sched_summary *out);

#endif  // QT_SCHEDULE_H
