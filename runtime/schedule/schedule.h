// schedule: the schedule table and the host loop that runs it.
//
// Owns the table (rows of {mode, steps, dataset} and the device's learning-rate rows) inside the
// caller's sched_table and memory (sized from the recipe: a counting build first, which stores
// no row), and nothing during the loop but its locals: the programs, graphs, feeds and trace
// belong to the caller (runtime/run/run.c). One thread.
//
// The table comes from the recipe's [schedule], its repeats expanded in order: `eval all` and
// `infer all` become one pass over their dataset (data_batches_per_epoch), every train row adds
// one optim_lr_row (start = the train steps before it, so one graph serves every row: the device
// picks the row from its step counter, ptx/optim.h; a repeated train row gets one per
// repetition). --steps N cuts the table after N train steps and keeps the eval and infer rows
// that follow the cut up to the next train row; the learning-rate rows are those of the whole
// recipe, so a cut run follows the same curve. A train row's warmup clause adds a learning-rate
// row before its rule's; its eval clause (or sched_build.eval_every, the eval-interleaving
// regression) splits it into pieces, each followed by an eval row.
//
// The loop runs global steps s0, s0 + 1, ... (train, eval and infer steps share one index, as
// the device counter of ptx/sched_ops.h does; s0 is the state's step: 0 for a fresh run, a
// checkpoint's for a resumed one). Before step s0 the priming copy stages step s0's batch as
// below; then per step s:
//
//   s >= s0 + 2:  wait for the event of step s - 2 (the only synchronizing call), read its
//            record from the pinned ring, write it to the trace, update the summary and the
//            progress
//   the compute stream waits for the event of step s's batch copy (cuStreamWaitEvent: the host
//            does not wait); launch the mode's graph (or its ops, eager); after every
//            `checksum_every`-th train step the checksum program; record the event of step s
//   save points and stops (below)
//   stage step s + 1 (none after the last step, so no batch past the table is read): the host
//            fills pinned host slot (s + 1) % 3 with the next batch of that step's row's feed
//            (the first step of an eval or infer row starts its dataset over); then, on the
//            copy stream, after the event of step s - 1 (when s - 1 >= s0), one
//            cuMemcpyHtoDAsync of the whole slot into device slot (s + 1) % 2, and that
//            copy's event
//   then drain the last two steps.
//
// So the batch of step s + 1 crosses PCIe on the copy engine while step s computes, and step
// s + 1's first op (ptx/sched_ops.h) turns device slot (s + 1) % 2, picked by the device counter's
// parity, into its FP32 batch with a device-to-device pass. Slots follow the global step, so a
// resumed run stages step s0 where the uninterrupted run would have. Why the slots are never
// overwritten too early:
//
//   - device slot (s + 1) % 2 was last read by step s - 1 (its first op): the copy waits for step
//     s - 1's event, and step s + 1 waits for the copy's, so the copy neither overwrites a slot
//     being read nor is read before it lands
//   - host slot (s + 1) % 3 was last read by the copy of step s - 2; the host fills it after
//     the wait for step s - 2's event at the start of step s, and step s - 2 began only after
//     its copy had ended (the compute stream waited for it), so that copy is done. Two host
//     slots would not do: the copy of step s - 1 runs beside step s - 2 and may not be done
//   - an event is recorded again only after every wait that uses it was queued (a stream wait
//     takes the event's latest record at the time of the call): copy events two steps apart,
//     step events two steps apart (schedule.c asserts these counts)
//   - steps before s0 ran in an earlier loop, which drained: neither their copies nor their
//     reads are in flight, so the first two steps wait for nothing of theirs
//
// Reading a record also checks it against the golden trace, if there is one (the first
// difference ends the loop), and hands an infer step's outputs (the pinned slot its program
// copied them into) to the row's output file, if it has one (runtime/io/infer_out.h): the read
// needs no synchronization of its own.
//
// Eager runs take the same path with launches instead of graph replays. On the reference backend
// a launch completes before it returns and the copy is a memcpy at the same point of the loop,
// so each record is read right after its step and every backend stages the same bytes for the
// same step. The loop makes no allocation and no other synchronizing call, which the backend's
// driver_syncs prove (sched_summary.lagged_reads is the number of waits); saves are the
// exception (they drain, and the checkpoint's copies wait). A loop that ends early (an error)
// first makes the compute stream wait for the last copy, then waits for the stream, so no copy
// outlives the run's memory.
//
// Position and stops. The loop starts from a sched_state (zero: the beginning; a checkpoint's:
// where that run stopped) and leaves it where it ended. After a step and before the next step's
// batch is staged it may save or stop; both first drain (read the records of the steps in
// flight):
//
//   save   after every `save_every`-th train step (counted over the whole run, resumed parts
//          included), after the last train step of a table that --steps cut, at a stop, and at
//          the end of a table that was not cut; never twice at the same step
//   stop   when *interrupt becomes non-zero (a signal handler sets it) or after stop_at steps;
//          inside an infer row that writes a file, at the end of that row (files are whole)
//
// Coming before the staging of the next step, they find the feeds' cursors at the state's
// position (the batches of the steps done read, none ahead), and the last launched step waited
// for its own batch copy, so once the drain has read its record neither stream has work: the
// device is idle, every record is in the trace and the state describes the device exactly. A
// resumed loop primes its first step from those cursors. A save changes nothing the device
// computes, so a run with saves gives the trace of the run without them. Why a cut table saves
// after its last train step and not at its end: the eval and infer rows that follow the cut run
// early (in the uncut table they follow the whole train row), so the position before them is
// the one a longer run passes through.
#ifndef QT_SCHEDULE_H
#define QT_SCHEDULE_H

#include <stdatomic.h>  // atomic_int: lock-free, so a signal handler may set it

#include "runtime/backend/backend.h"  // backend, backend_graph
#include "runtime/io/data.h"          // data_feed, data_info
#include "runtime/io/infer_out.h"     // infer_out
#include "runtime/model/model.h"      // model, model_mode
#include "ptx/optim.h"                // optim_lr_row
#include "recipes/recipe.h"
#include "runtime/io/trace.h"         // trace_writer

// Rows of a table with its repeats and eval clauses expanded: more is refused, naming the
// recipe line, so the counting build bounds the table's memory.
#define SCHED_ROWS_MAX RECIPE_EXPANDED_ROWS_MAX
#define SCHED_ROW_STEPS_MAX (UINT64_C(1) << 40)  // a train row's steps, epochs counted
#define SCHED_LAG 2  // steps between a launch and the read of its record (= host slots - 1)
#define SCHED_STEP_TIMES 4096  // train-step intervals a summary keeps (the most recent)

typedef struct sched_row {
    model_mode mode;
    uint64_t steps;
    recipe_dataset dataset;  // eval and infer rows
    uint32_t line;           // the recipe line it came from (0: added by sched_build.eval_every)
    uint32_t output;         // infer rows that write a file: 1 + its index in sched_env.outputs
                             // (the recipe row's index); 0: none
} sched_row;

typedef struct sched_table {
    uint32_t row_count, row_capacity;  // capacity 0: a counting table (no rows stored)
    sched_row *rows;                   // [row_capacity], the caller's
    uint32_t lr_count, lr_capacity;    // a train row's warmup and rule: two at most
    optim_lr_row *lr;                  // [lr_capacity], the caller's
    uint64_t steps[MODEL_MODE_COUNT];  // steps of each mode in the table
    uint64_t epoch_steps;              // train steps of one epoch (batches of the train set)
    bool modes[MODEL_MODE_COUNT];      // modes of the recipe's table (before any cut)
    bool cut;                          // --steps removed train steps of the recipe
    bool outputs;                      // some row writes an output file
} sched_table;

// How the recipe's rows become the table.
typedef struct sched_build {
    uint64_t train_samples, eval_samples;  // eval_samples 0 without an eval set
    uint32_t batch;
    uint64_t steps_limit;  // cut after this many train steps; 0: none
    uint64_t eval_every;   // > 0: train rows without an eval clause in pieces of this many
    uint64_t eval_steps;   // steps, each followed by an eval row of eval_steps steps on the
                           // eval set (tests)
    bool drop_eval;        // only the train rows (the reference of that regression)
} sched_build;

// Where a run stands between two steps, and what its summary carries over: everything of the
// host loop that a checkpoint keeps (runtime/run/checkpoint.h stores it as it is, little-endian).
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

// Memory of a table of `rows` rows and `lr_rows` learning-rate rows (8-byte aligned).
uint64_t sched_table_bytes(uint32_t rows, uint32_t lr_rows);
// An empty table over `storage` (the caller's, sched_table_bytes), or NULL (0, 0): counting.
void sched_table_init(sched_table *t, void *storage, uint32_t rows, uint32_t lr_rows);

// The table of r (t from sched_table_init). A counting table ends with the counts a table of
// storage needs; one with storage asserts they fit. Fails (naming the recipe line) on epochs
// or a warmup that do not fit their row, and beyond SCHED_ROWS_MAX rows.
qt_status sched_table_build(const recipe *r, const sched_build *b, sched_table *t);

// Hash of rows [0, count) (mode, steps, dataset): a checkpoint keeps it to recognize the table
// that it may continue.
uint64_t sched_rows_hash(const sched_table *t, uint32_t count);

// Whether a run with table t can continue from s: the rows before s->row are t's, the row of
// s has t's mode and dataset and at least s->row_step steps in t (it may be longer: the saving
// run's --steps cut it). saved_rows_hash / saved_row are the saving run's (sched_rows_hash of
// rows [0, s->row), and its row s->row, steps ignored). QT_ERR_MISMATCH naming the difference.
qt_status sched_check_position(const sched_table *t, const sched_state *s,
                               uint64_t saved_rows_hash, sched_row saved_row);

// `qtrain infer`: one infer row of one pass over the (train) dataset, writing outputs[0] (a
// table of one row, or counting).
void sched_table_infer(uint64_t samples, uint32_t batch, sched_table *t);

// Appends a learning-rate row of the constant rate lr from step 0, for a train program outside
// the table's rows (an embedder's steps; counted like the table's own rows).
void sched_add_constant_lr(sched_table *t, float lr);

// What the loop tells its caller after each record it reads.
typedef struct sched_progress {
    const qt_trace_record *record;
    model_mode mode;
    uint32_t row;             // index into the table
    uint64_t row_step;        // 1-based step within the row
    uint64_t row_steps;
    recipe_dataset dataset;   // eval and infer rows
    uint64_t done, total;     // steps of this loop: read so far, and all it runs
    uint64_t left[MODEL_MODE_COUNT];  // steps of each mode this loop runs after this one
    uint64_t train_steps;     // train steps of the run up to this step (this one included)
    uint64_t epoch_steps;     // train steps of an epoch (sched_table.epoch_steps)
    uint32_t rows_valid;      // real rows of the step's batch
    // Eval rows: the pass so far (this step included; the whole pass at its last step), as the
    // summary counts it: the mean loss over its real rows, correct / real rows, the real rows.
    double pass_loss, pass_accuracy;
    uint64_t pass_samples;
    const uint16_t *outputs;  // infer: bf16 [batch][outputs], valid during the call
    double elapsed_s;         // since the loop started
} sched_progress;

typedef void (*sched_progress_fn)(void *ctx, const sched_progress *p);
// A consumer of every record that can fail (the metrics file): its error ends the loop.
typedef qt_status (*sched_record_fn)(void *ctx, const sched_progress *p);

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
    infer_out *outputs;       // the files of infer rows with an output (sched_row.output);
                              // NULL: none written (a data-parallel rank but rank 0)
    sched_progress_fn progress;
    void *progress_ctx;
    sched_record_fn record;   // NULL: none; called before progress
    void *record_ctx;
    // Checkpoints: save (NULL: none) is called at the save points above with the state after
    // the drain; save_every 0 = no periodic saves.
    qt_status (*save)(void *ctx, const sched_state *state);
    void *save_ctx;
    uint64_t save_every;
    const atomic_int *interrupt;  // NULL: never; non-zero: stop at the next boundary
    uint64_t stop_at;                         // stop once this many steps are done; 0 = never
    // The embedder's batches: fills the host slot (model_io.slot's layout) of global step `step`
    // in place of the feed and sets *rows_valid to its real rows, or leaves it 0 for the feed's
    // batch. NULL: the feeds alone. A step whose feed is NULL (the recipe names no source for
    // its dataset) must get its batch here.
    qt_status (*fill)(void *ctx, model_mode mode, uint64_t step, void *slot,
                      uint32_t *rows_valid);
    void *fill_ctx;
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
    // Step times without a synchronizing call of their own: the host clock when the record of a
    // train step is read (on the GPU right after the wait for its event) minus when that of the
    // step before it was, for consecutive train steps with no save between them. A GPU-bound loop
    // waits for every step, so an interval is one step of the device; a host-bound one reads
    // finished records, so it is the host's pace: either way the steady state's time per step. The
    // last SCHED_STEP_TIMES are kept, interval i at step_ms[i % SCHED_STEP_TIMES].
    uint64_t step_time_count;    // intervals measured (the kept ones: min(count, TIMES))
    float step_ms[SCHED_STEP_TIMES];
    uint64_t batch_copies;       // batches staged host to device (one per step)
} sched_summary;

// Runs t from *state (a position sched_check_position accepts) to its end or a stop, and
// leaves *state there. Feeds must stand at the state's cursors (data_feed_seek).
qt_status sched_run(const sched_env *env, const sched_table *t, sched_state *state,
                    sched_summary *out);

// sched_progress.row of a step outside the table.
#define SCHED_ROW_NONE UINT32_MAX

// One step of `mode` outside the table, at the state's step, waited for: its batch from the
// fill hook, else the mode's feed (train: the shuffled one; eval and infer: the eval set's, or
// the train set's in file order without one), copied into its device slot through the compute
// stream, the program (and the checksum after every checksum_every-th train step) launched and
// finished, the record read from the ring (into *record), traced, checked and reported as
// progress (row SCHED_ROW_NONE). The state's step and train steps move on, its row does not;
// the summary's carry keeps the last train loss. Nothing is in flight before or after.
qt_status sched_step_outside(const sched_env *env, model_mode mode, sched_state *state,
                             qt_trace_record *record, uint32_t *rows_valid);

#endif  // QT_SCHEDULE_H
