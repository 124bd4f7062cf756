// run: one training run of a recipe, end to end: data, schedule table, model, programs, arenas,
// backend, graphs, the schedule loop and the trace.
//
// Owns everything of the run inside the caller's `run` struct (about 2 MB whatever the model,
// the program builders' state included: keep it off the stack) and the caller's table memory:
// the schedule table, the two arenas' region tables, the programs' op tables and the checkpoint
// tables, each sized from the recipe and its model (run_measure counts them by planning once
// with a counting schedule table, arenas and programs, which store nothing; run_plan plans again
// into exactly that much). Also the captured graphs (from run_bind to run_close), the datasets'
// views and feeds, and the trace writer during run_execute. The memory behind the arenas comes
// from the backend (GPU) or from the caller (reference backend: run_memory_bytes tells how
// much). The recipe and its text are the caller's and must outlive the run. One thread.
//
//   run_measure   data headers probed, the plan counted (schedule table, model, programs): the
//                 table memory it needs
//   run_plan      model planned, every program built, arenas packed, in the caller's table
//                 memory: `qtrain plan` stops here (no backend, no data loaded)
//   run_load      datasets (and a golden trace) read into caller memory (no backend needed)
//   run_bind      arenas allocated and bound, programs resolved, learning-rate rows written,
//                 init program run, one graph captured per mode (unless eager)
//   run_resume    (optional) a checkpoint's device state and position loaded over the bound run
//   run_execute   the schedule loop (runtime/schedule/schedule.h) from the run's position to the
//                 end or a stop, with the trace file and the metrics file (runtime/run/metrics.h)
//                 if asked for, the golden trace's check,
//                 checkpoints if save_path is set, and the output files of the infer rows it runs
//                 (runtime/io/infer_out.h), committed at the end; called again after a stop, it
//                 continues (the trace too)
//   run_step      (instead, or between run_execute calls) the table's next step
//   run_step_outside  one step of a mode outside the table (embedders: qt_step_mode, qt_infer)
//   run_save      (optional, between run_execute calls) a checkpoint of where the run stands
//   run_close     graphs destroyed, arenas released
#ifndef QT_RUN_H
#define QT_RUN_H

#include <stdio.h>  // FILE

#include <stdatomic.h>  // atomic_int

#include "runtime/backend/backend.h"
#include "runtime/run/checkpoint.h"     // ckpt_layout, ckpt_reader, ckpt_hook_fn
#include "runtime/io/data.h"
#include "runtime/run/metrics.h"        // metrics_writer
#include "runtime/model/model.h"
#include "runtime/parallel/parallel.h"  // dp_comm, dp_ref_group
#include "runtime/program/program.h"
#include "recipes/recipe.h"
#include "runtime/schedule/schedule.h"
#include "runtime/io/trace.h"

// A fault planted in a gradient (`--inject-nonfinite`): the train program writes `bits` (a NaN
// or an infinity) into the first element of parameter `param`'s gradient at global step `step`,
// which the optimizer must skip (tests and soaks check that the state stays bit-identical).
typedef struct run_inject {
    bool on;
    uint64_t step;       // the trace's step index; it must be a train step of the schedule
    const char *layer;   // the layer whose weight gradient gets it; NULL: the first
    uint32_t bits;       // 0x7FC00000 NaN, 0x7F800000 +inf, 0xFF800000 -inf
} run_inject;

// The order of a data-parallel rank's updates: as QTRAIN_UPDATE_ORDER says (run_largest_first),
// or, for tests that compare both, fixed either way.
typedef enum {
    RUN_UPDATE_ORDER_SETTING,
    RUN_UPDATE_ORDER_PARAMETERS,
    RUN_UPDATE_ORDER_LARGEST_FIRST,
} run_update_order;

typedef struct run_options {
    bool eager;               // launch the programs' ops instead of replaying graphs
    uint64_t steps_limit;     // cut the table after this many train steps; 0 = none
    bool seed_given;          // seed replaces the recipe's [data] seed (shuffle and init)
    uint64_t seed;
    const char *trace_path;   // NULL: no trace file
    uint32_t checksum_every;  // train steps between persistent-state checksums; 0 = none
    uint64_t eval_every;      // > 0: an eval row of eval_steps steps after every k train steps
    uint64_t eval_steps;
    bool drop_eval;           // remove the table's eval and infer rows (after eval_every)
    model_emulated_gemm emulated_gemm;  // where MXFP8 and NVFP4 GEMMs run (same bits)
    bool amax_passes;         // tests: model_options.amax_passes (same bits, more launches)
    uint64_t norm_group_elems;  // tests: model_options.norm_group_elems (same bits)
    bool norm_elements;         // tests: model_options.norm_elements (other bits)
    bool moe_own_align;         // tests: model_options.moe_own_align (same bits)
    uint64_t act_cast_elems;    // tests: model_options.act_cast_elems (same bits)
    run_update_order update_order;  // tests: model_options.largest_first (same bits)
    // Checkpoints (runtime/run/checkpoint.h): save_path gets one at the save points of
    // schedule.h (every save_every train steps; 0: at the end or a stop only); `checkpoints`
    // plans their staging without save_path (for run_resume, run_save), and defers the check of
    // existing output files from run_load to run_resume (or the loop), which know the position.
    const char *save_path;
    bool save_replaces;       // save_path may exist (the checkpoint this run resumes from)
    uint64_t save_every;
    bool checkpoints;
    uint64_t ckpt_chunk_bytes;  // 0: CKPT_CHUNK_BYTES (tests use small chunks)
    ckpt_hook_fn ckpt_hook;     // tests: called as the writer goes
    void *ckpt_hook_ctx;
    const atomic_int *interrupt;  // non-zero (a signal handler, another thread): stop and save
    uint64_t stop_at;         // stop after this many steps in all (tests); 0 = none
    bool replace_outputs;     // output files (infer rows, infer_output, save_path) may replace
                              // files, and the trace a file that is not a trace (`--force`)
    // `qtrain infer`: one pass of infer steps over infer_input (IDX images or .npy features, no
    // targets) instead of the recipe's [data] and [schedule]; the outputs go to infer_output
    // (float32 logits, or int32 classes with infer_argmax). The recipe's data files are not read.
    const char *infer_input;
    const char *infer_output;
    bool infer_argmax;
    // Weights from a checkpoint instead of the recipe's initialization: after the init program
    // run_bind loads the model's regions of the checkpoint at from_path (ckpt_load_model: the
    // weights in every usage this run has, the masters, the scaling state).
    const char *from_path;
    // A golden trace that every record of the run must equal (`--check`): the first record
    // that differs stops the run with QT_ERR_MISMATCH naming the step, the field and both values.
    const char *golden_path;
    run_inject inject;
    // The metrics file (runtime/run/metrics.h, `--metrics`): a train line every metrics_every train
    // steps (0: 100) and after every train row, an eval line per eval row. An existing file is
    // refused at run_load unless replace_outputs. The first run_execute writes it and gives it
    // its name when it returns (after a stop or a failure too: its lines are of steps that
    // ran), so it covers that call's steps.
    const char *metrics_path;
    uint64_t metrics_every;
    // Embedders: programs to build beyond the table's modes (run_step_outside), the staged
    // inputs' type when the recipe names no data source, and the batches they give
    // (sched_env.fill), which every step asks for before its feed.
    bool modes[MODEL_MODE_COUNT];
    data_input_type inputs;
    qt_status (*fill)(void *ctx, model_mode mode, uint64_t step, void *slot,
                      uint32_t *rows_valid);
    void *fill_ctx;
    // Data parallelism (runtime/parallel/parallel.h): this run is rank `rank` of `world` (0 or 1:
    // one rank). The recipe's batch is the global batch; each rank takes its contiguous share of
    // every batch. The ranks meet through nccl_id on the GPU (the QT_NCCL_UNIQUE_ID_BYTES of
    // ncclGetUniqueId that every rank was given) or ref_group on the reference backend (the ranks
    // are threads of this process). Several ranks run train, eval and infer rows (eval rows alone
    // too; rank 0 writes the infer files of the whole batch) and refuse `qtrain infer` and
    // --from. Checkpoints are those of the run on one GPU: rank 0 writes them (ckpt_save
    // gathers the other ranks' masters and moments), every rank resumes from one and keeps what
    // it holds, whatever the GPU count that saved it.
    uint32_t rank, world;
    const void *nccl_id;
    dp_ref_group *ref_group;
} run_options;

// The programs of a run, in the order of their op indices.
typedef enum run_program {
    RUN_PROGRAM_INIT,
    RUN_PROGRAM_TRAIN,
    RUN_PROGRAM_EVAL,
    RUN_PROGRAM_INFER,
    RUN_PROGRAM_CHECKSUM,
    RUN_PROGRAM_COUNT
} run_program;

// The run's tables as run_measure counted them, and their bytes in the caller's memory.
typedef struct run_tables {
    uint32_t sched_rows, sched_lr_rows;      // the schedule table
    uint32_t dev_regions, host_regions;
    uint32_t ops[RUN_PROGRAM_COUNT];
    uint32_t ckpt_regions, ckpt_params;      // the checkpoint layout (0: no checkpoints)
    uint32_t reader_regions, reader_params;  // the checkpoint reader (resume, --from)
    uint64_t schedule_bytes, arena_bytes, program_bytes, ckpt_bytes;
    uint64_t bytes;                          // all of them
} run_tables;

// The checkpoints one run_execute wrote.
typedef struct run_saves {
    uint32_t count;
    uint64_t last_step, last_train_step;
    double seconds;  // in all
} run_saves;

// Start-up phases of run_bind, wall-clock seconds (the summary prints them: start-up is part of
// every run's wall time, and each phase has its own remedy).
typedef struct run_timings {
    double bind_s;     // arena allocation (device memory, pinned host memory) and zeroing
    double data_s;     // datasets read (and inflated) into the caller's memory (run_load)
    double init_s;     // the init program (weights drawn, first quantization), to completion,
                       // and --from's checkpoint loaded over it
    double capture_s;  // one graph captured and instantiated per mode
    double resume_s;   // run_resume: the checkpoint checked and loaded
} run_timings;

typedef struct run {
    run_tables tables;          // run_measure's counts
    bool measured, planned;
    uint8_t *table_memory;      // the caller's, from run_plan on
    const recipe *recipe;
    uint64_t recipe_hash;     // trace_hash of the recipe file's text
    run_options options;
    uint64_t seed;
    data_info train_info, eval_info;
    const recipe_source *train_source;  // the recipe's train source, or infer_source
    recipe_source infer_source;         // `qtrain infer`: the input file, inputs only
    bool has_train;           // a train source (without one the embedder gives the batches)
    bool has_eval;
    sched_table table;
    arena dev, host;
    model model;
    uint64_t data_bytes;  // caller memory for the datasets and the shuffle order (run_load)
    uint64_t data_train_offset, data_order_offset, data_eval_offset;
    uint64_t data_golden_offset, golden_bytes;  // the golden trace, read whole at run_load
    bool data_loaded;
    program programs[MODEL_MODE_COUNT];
    program init, checksum;
    bool bound;
    backend *backend;
    backend_graph graphs[MODEL_MODE_COUNT];
    backend_graph checksum_graph;
    data_set train_set, eval_set;
    data_feed train_feed, train_plain, eval_feed;
    trace_writer trace;
    bool trace_active;         // during run_execute
    bool trace_continues;      // the trace has records already: run_execute continues it
    bool step_failed;          // the last run_step or run_step_outside failed (the trace's
                               // end says so)
    uint64_t trace_bytes, trace_records, trace_hash;  // the trace file at the run's position
    trace_checker check;  // with options.golden_path
    infer_out outputs[RECIPE_SCHEDULE_ROWS_MAX];  // by sched_row.output - 1, during run_execute
    bool has_outputs;
    arena_handle outputs_scratch;  // host: the rows of one step, converted for the file
    run_timings timings;
    sched_state state;         // where the run stands (zero: the start)
    bool ckpt_planned;
    ckpt_layout ckpt;
    ckpt_reader reader;        // run_resume's
    bool resumed;
    sched_state resumed_at;    // the checkpoint's position
    run_saves saves;           // of the last run_execute
    bool saved_before;         // save_path holds this run's checkpoint (any run_execute)
    metrics_writer metrics;
    bool metrics_written;      // the first run_execute wrote the metrics file
    trace_header trace_head;   // the trace's header, as run_execute and the golden check use it
    bool trained;              // a train step ran since run_bind (run_expert_loads)
    dp_comm dp;                // this rank's communicator (one rank: world 1, no collectives)
    bool dp_open;              // from run_bind to run_close
    // A call since run_bind failed (run_bind, run_resume, run_save, run_execute, run_step,
    // run_profile, metrics or a trace write included): the other ranks may wait in a collective
    // that this rank will not join, so run_close aborts the communicators instead of meeting them
    // at a barrier.
    bool apart;
} run;

// Opens the GPU backend, or the reference backend when ref is set or when there is no usable
// GPU (then *fell_back is set and the reason is in qt_error_message()).
qt_status run_backend_open(backend *b, bool ref, bool *fell_back);

// The bytes of table memory run_plan needs for this recipe and these options: probes the data
// headers, builds the schedule table and plans once with counting tables (nothing is stored).
// text is the recipe file's text (for the trace's hash).
qt_status run_measure(run *r, const recipe *rc, const char *text, size_t text_bytes,
                      const run_options *options, uint64_t *table_bytes);
// The same with the text's hash (trace_hash) given instead of the text.
qt_status run_measure_hashed(run *r, const recipe *rc, uint64_t recipe_hash,
                             const run_options *options, uint64_t *table_bytes);

// After run_measure: everything up to packed arenas, the tables carved from `tables` (16-byte
// aligned, at least the measured bytes, the caller's until the run is closed).
qt_status run_plan(run *r, void *tables, uint64_t table_bytes);
// The device arena's pack_gap (arena.h) that run_plan packs with: $QTRAIN_PACK_GAP when set (0
// to RUN_PACK_GAP_MAX ops), else 0, the tightest packing. A setting for A/B runs: the bits do
// not depend on it (no kernel's result depends on where its buffers are), the arena's size and
// what a captured graph may run side by side do (`qtrain plan` shows both). QT_ERR_INPUT for a
// value that is no such number.
#define RUN_PACK_GAP_MAX 64
qt_status run_pack_gap(uint32_t *gap);
// Whether the ranks of a data-parallel run update their parameters largest first, with the
// weights' broadcast groups in the order the updates end (model_options.largest_first):
// $QTRAIN_UPDATE_ORDER, 1 (unset: largest first) or 0. A setting for A/B runs with the same
// bits (`qtrain plan --gpus N` shows each rank's order). QT_ERR_INPUT for another value.
qt_status run_largest_first(bool *on);

// Bytes the reference backend needs for the device and the host arena.
void run_memory_bytes(const run *r, uint64_t *dev_bytes, uint64_t *host_bytes);

// Before anything of the run is allocated: its memory against what there is (the file
// runtime/run/run_memory.c). b: the opened backend (GPU: the device arena against the free device
// memory, cuMemGetInfo), or NULL before it is open; ref: the device arena lives in host memory
// (the reference backend); extra_host: host memory the caller is about to allocate for the run
// besides the arenas (the datasets, run_data_bytes). Host needs are compared with the least of
// the limits of runtime/run/host_memory.h. QT_ERR_MEMORY naming both numbers, the tightest limit,
// the largest regions and what to change in the recipe (batch, widths, formats).
qt_status run_check_memory(const run *r, backend *b, bool ref, uint64_t extra_host);

// Caller memory (DATA_ALIGN aligned, pageable is fine) for the datasets and the golden trace,
// read by the host only.
uint64_t run_data_bytes(const run *r);
// Refuses output files that exist (unless replace_outputs; with `checkpoints` run_resume or the
// loop does), then reads the datasets into it and sets up the feeds. Needs no backend, so a
// caller may run it while another thread opens the GPU (qtrain does: the two take about as
// long). The memory must stay until run_close.
qt_status run_load(run *r, void *memory, uint64_t bytes);

// Binds and starts the run on b (ref_dev / ref_host: the reference backend's arena memory,
// 256-byte aligned, at least run_memory_bytes; NULL on the GPU). After run_load.
qt_status run_bind(run *r, backend *b, void *ref_dev, void *ref_host);
// run_bind with the arenas' memory given with its size (backend_bind: on the GPU too, where
// NULL has the driver allocate).
qt_status run_bind_given(run *r, backend *b, void *dev, uint64_t dev_bytes, void *host,
                         uint64_t host_bytes);

// After run_bind (checkpoint staging planned): loads the checkpoint at path over the run's
// device state and continues from its position (the feeds' cursors, the trace, the summary's
// carry). Refuses (QT_ERR_INPUT / QT_ERR_MISMATCH, naming the field) a damaged file, another
// recipe, seed or region layout, and a position this run's schedule does not pass through;
// then the existing output files of the infer rows after the position (run_load's check).
// A failure after the data began to load leaves the device state undefined: do not run then.
qt_status run_resume(run *r, const char *path);

qt_status run_execute(run *r, sched_progress_fn progress, void *ctx, sched_summary *out);

// The table's next step (an infer row that writes a file: the whole row), waited for: the loop of
// run_execute stopped after one step, so it gives the records run_execute gives, into the same
// trace (which stays open until run_execute or run_close, each record written through). No
// saves. *out describes this call.
qt_status run_step(run *r, sched_progress_fn progress, void *ctx, sched_summary *out);

// One step of `mode` outside the table (sched_step_outside), traced and checked like the
// others; the mode's program must be built (the table's modes or options.modes).
qt_status run_step_outside(run *r, model_mode mode, sched_progress_fn progress, void *ctx,
                           qt_trace_record *record, uint32_t *rows_valid);

// The experts' loads of moe layer `moe` (< model.moe_count) in the last train step that ran:
// counts u32 [experts], each expert's token-expert pairs of this rank's batch (they sum to batch
// x topk), read from the train program's first_dims (model_keep_expert_loads keeps them there
// after the step). A device read that waits for the steps in flight: call it after the loop,
// never between its steps. QT_ERR_STATE before the first train step of this bind.
qt_status run_expert_loads(run *r, uint32_t moe, uint32_t *counts);

// Closes a trace that steps left open, with its completion record: failed when the last step
// failed, complete when the table is done, stopped otherwise (nothing when no trace is open).
qt_status run_end_trace(run *r);

// A checkpoint of where the run stands, outside run_execute (which saves at its own points);
// it replaces a regular file at path.
qt_status run_save(run *r, const char *path);

// Steps of each mode from the run's position to the end of its table.
void run_steps_left(const run *r, uint64_t steps[MODEL_MODE_COUNT]);

// How long one step of each mode takes on the reference backend, measured before the loop (after
// run_bind and any run_resume), so that a run can say how long it will take before it starts:
// both arenas are copied into `scratch` (at least their bytes together, run_memory_bytes), each
// mode with steps left runs its program a few times (a cold run, then the median of up to three
// warm ones within about a second; a cold run of half a second or more alone), then the arenas
// are copied back, so the run goes on from the same bytes. Each mode runs on the next batch of
// its feed (the feed is left where it was). ms[mode] is 0 for the modes without steps left.
// Reference backend only.
void run_time_steps(run *r, void *scratch, uint64_t scratch_bytes, double ms[MODEL_MODE_COUNT]);

// `qtrain run --profile`: after run_execute, every mode's program op by op and as its graph
// (backend_profile; this changes the run's state, so nothing may follow but run_close).
qt_status run_profile(run *r, uint32_t reps, FILE *out);

void run_close(run *r);

// `qtrain plan`: the model, the schedule table, every program, the host memory of the run
// (its struct, its tables, the host arena, the datasets) and both memory maps.
void run_print_plan(const run *r, FILE *out);
// `qtrain plan --summary`: the same in under 40 lines (model_print_summary, the schedule's
// totals, the data, each program's op count and both arenas' totals).
void run_print_summary(const run *r, FILE *out);

#endif  // QT_RUN_H
