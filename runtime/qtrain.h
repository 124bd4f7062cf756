// qtrain.h: the public C API of the qtrain runtime, the only header an embedder includes.
//
// It needs the C standard library's headers only (no <cuda.h>, no internal types) and names every
// object through an opaque handle. Every function and type here starts with qt_ (QT_ for macros
// and constants); the library exports these functions and nothing else.
//
// Lifecycle of one runtime (each step fails with a status and a message, never aborts):
//
//   qt_device_open(memory, kind)            a GPU (or the reference backend), any thread
//   qt_open_file(memory, path)              the recipe read and validated
//     | qt_open_text(memory, text)
//   qt_measure(options)                     data headers read, the run counted: its table bytes
//   qt_plan(tables)                         schedule, model, every program, both arenas packed
//     |                                     in caller memory: qt_plan_info_get, qt_plan_region
//   qt_check_memory                         optional: the plan against the memory there is
//   qt_load(memory)                         the datasets read into caller memory (no device)
//   qt_bind(device, arenas)                 arenas allocated (or the caller's) and zeroed,
//     |                                     weights initialized, CUDA graphs captured
//   qt_resume(path)                         optional: a checkpoint's state and position
//   qt_run | qt_step | qt_step_mode | qt_infer | qt_save ...   any number, any order
//   qt_close                                graphs destroyed, driver memory freed, the trace
//                                           closed
//   qt_device_close
//
// Memory. The caller gives every block of host memory the library uses: the runtime
// (qt_runtime_bytes), the device (qt_device_bytes), the run's tables (qt_measure), the datasets
// (qt_plan_info.data_bytes) and an export's work area (qt_export_bytes), each aligned to
// QT_MEMORY_ALIGN, owned by the caller, and untouched by it until the matching close. The two
// arenas come from the caller too (qt_arenas) or, on a GPU, from the driver once at qt_bind
// (cuMemAlloc, cuMemHostAlloc; freed at qt_close). The library itself never calls malloc or free.
//
// Threads. A runtime or a device is used by one thread at a time; which thread may change from
// call to call (the device's CUDA context is made current on entry). Separate runtimes share
// nothing and may run on separate threads at once, each with its own device. Callbacks run on
// the thread of the call that invokes them. qt_request_stop may be called from any thread or a
// signal handler.
//
// Errors. Every fallible call returns a qt_status; on failure qt_error_message() holds a message
// for the calling thread (file:line:col for recipe errors, the driver's text for driver errors)
// that names the problem and the fix, valid until that thread's next failing call.
#ifndef QTRAIN_H
#define QTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>  // FILE, for the reports

#ifdef __cplusplus
extern "C" {
#endif

// The library is built with hidden visibility; this marks the functions it exports.
#define QT_API __attribute__((visibility("default")))

// The release, `qtrain --version`. The file formats carry versions of their own, which the
// version line also names: the trace's and the checkpoint's.
#define QTRAIN_VERSION "0.1.0"
#define QT_TRACE_FORMAT 2
#define QT_CHECKPOINT_FORMAT 1

// Operating errors: returned, never asserted.
typedef enum qt_status {
    QT_OK = 0,
    QT_ERR_INPUT,      // a recipe, an argument or a file's contents is malformed
    QT_ERR_IO,         // a file cannot be opened, read or written
    QT_ERR_NO_DRIVER,  // libcuda.so.1 cannot be loaded, or an entry point is missing
    QT_ERR_NO_DEVICE,  // the driver loaded but reports no usable GPU
    QT_ERR_DRIVER,     // a driver call failed
    QT_ERR_CAPACITY,   // a fixed-capacity table (a `*_max` limit) is full
    QT_ERR_MEMORY,     // an arena does not fit in the memory available
    QT_ERR_MISMATCH,   // loaded state (checkpoint, module, trace) does not match what is expected
    QT_ERR_STATE,      // a call out of its place in the lifecycle (qt_run before qt_bind, ...)
    QT_STATUS_COUNT
} qt_status;

// Short upper-case name of a status ("QT_ERR_INPUT").
QT_API const char *qt_status_name(qt_status status);
// Detail of the last failure on this thread; "" after success paths that cleared it.
QT_API const char *qt_error_message(void);
// User text (an argument, a file name) as the messages quote it: control bytes, bytes that are
// not UTF-8 and invisible or blank-looking characters escaped (\t, \xNN, <U+FEFF>), longer
// texts cut. The result is one of QT_SHOWN_BUFFERS buffers of this thread, used in turn, so one
// message may quote that many texts.
#define QT_SHOWN_BUFFERS 4
QT_API const char *qt_shown(const char *text);

// Every block of caller memory starts at a multiple of this.
#define QT_MEMORY_ALIGN 256

typedef struct qt_runtime qt_runtime;
typedef struct qt_device qt_device;

// ---------------------------------------------------------------------------------------------
// Devices

typedef enum qt_device_kind {
    QT_DEVICE_AUTO,       // the GPU when there is a usable one, else the reference backend
    QT_DEVICE_GPU,        // the GPU or QT_ERR_NO_DRIVER / QT_ERR_NO_DEVICE
    QT_DEVICE_REFERENCE   // the reference backend: every kernel's plain C twin, on the CPU
} qt_device_kind;

// Bytes of host memory one device needs (its kernel tables).
QT_API size_t qt_device_bytes(void);
// Opens a device in `memory` (qt_device_bytes, QT_MEMORY_ALIGN). GPU: loads the driver,
// retains the primary context of GPU `ordinal`, creates its streams and loads every kernel.
QT_API qt_status qt_device_open(void *memory, size_t bytes, qt_device_kind kind, int ordinal,
                                qt_device **out);
// QT_ERR_STATE while a runtime is bound to it (close that first).
QT_API qt_status qt_device_close(qt_device *device);

typedef struct qt_device_info {
    bool gpu;                 // false: the reference backend
    bool fell_back;           // QT_DEVICE_AUTO found no usable GPU; `reason` says why
    char reason[256];
    char name[128];
    int driver_version;       // e.g. 12080 (GPU)
    int cc_major, cc_minor;   // compute capability (GPU)
    int sm_count;
    uint64_t memory_bytes, free_bytes;  // when opened (GPU)
    uint32_t threads;         // threads that run the reference backend's work (the process's)
    char gemm_tier[384];      // which GEMM kernels run on this device (whole sentence)
    // Kernels are launched while the one ahead of them runs and wait for it themselves
    // (programmatic dependent launch, compute capability 9.0 unless QTRAIN_SERIAL_LAUNCH=1);
    // false: plain stream order. Same results.
    bool overlapping_launches;
    uint32_t kernels, kernels_loaded, modules;
} qt_device_info;

QT_API void qt_device_describe(const qt_device *device, qt_device_info *out);

typedef struct qt_kernel_info {
    const char *symbol, *module;  // static strings
    bool loaded;                  // false: this GPU cannot run the module's image
    int registers, static_smem_bytes, local_bytes;
} qt_kernel_info;

// Kernel `index` (< qt_device_info.kernels) of a GPU device; QT_ERR_INPUT past the end.
QT_API qt_status qt_device_kernel(const qt_device *device, uint32_t index, qt_kernel_info *out);

// ---------------------------------------------------------------------------------------------
// Opening and planning

typedef enum qt_mode { QT_MODE_TRAIN, QT_MODE_EVAL, QT_MODE_INFER, QT_MODE_COUNT } qt_mode;
QT_API const char *qt_mode_name(qt_mode mode);  // "train", "eval", "infer"

// Where MXFP8 and NVFP4 GEMMs run; the bits are the same either way.
typedef enum qt_emulated_gemm {
    QT_EMULATED_GEMM_AUTO,    // BF16 copies for MXFP8 dgrad and wgrad and for large GEMMs
    QT_EMULATED_GEMM_KERNEL,  // the format's kernels
    QT_EMULATED_GEMM_COPIES   // BF16 copies of both operands and a BF16 GEMM
} qt_emulated_gemm;

// Element type of a batch's inputs.
typedef enum qt_inputs {
    QT_INPUTS_F32,  // float32 values, used as they are
    QT_INPUTS_U8    // uint8 pixels, divided by 255 on the device
} qt_inputs;

// Bytes of host memory one runtime needs (its tables and a recipe file's text).
QT_API size_t qt_runtime_bytes(void);
// Opens a runtime in `memory` (qt_runtime_bytes, QT_MEMORY_ALIGN) from a recipe file, or from
// recipe text (`name` is used in messages and checkpoints; the text is not kept).
QT_API qt_status qt_open_file(void *memory, size_t bytes, const char *path, qt_runtime **out);
QT_API qt_status qt_open_text(void *memory, size_t bytes, const char *text, size_t text_bytes,
                              const char *name, qt_runtime **out);

// What a run does. Zero is the default of every field; paths are kept (not copied) and must
// stay valid until qt_close.
typedef struct qt_options {
    uint64_t steps;             // cut the schedule after this many train steps (0: none)
    bool seed_given;            // `seed` replaces the recipe's [data] seed
    uint64_t seed;
    qt_emulated_gemm emulated_gemm;
    bool eager;                 // launch each op instead of replaying each mode's CUDA graph
    const char *trace_path;     // the trace file of every step run (NULL: none)
    uint32_t checksum_every;    // train steps between checksums of the persistent state
    bool checkpoints;           // plan the staging qt_save and qt_resume need
    const char *save_path;      // qt_run saves here at the end, at a stop, every save_every
    uint64_t save_every;        // train steps (0: only at the end and at a stop)
    bool save_replaces;         // save_path may exist (it is the checkpoint resumed from)
    bool replace_outputs;       // output files (infer rows, infer_output, save_path) may
                                // replace existing files, and the trace a file not a trace
    const char *from_path;      // weights from this checkpoint after the initialization
    const char *golden_path;    // every record must equal this trace's (else QT_ERR_MISMATCH)
    // The metrics file of the first qt_run (JSON lines: one per metrics_every train steps, 0:
    // 100, and after every train row, one per eval row), named when that qt_run returns.
    const char *metrics_path;
    uint64_t metrics_every;
    // One pass of infer steps over this file (IDX images or .npy features) into infer_output
    // (.npy float32 logits, or int32 classes with infer_argmax), instead of the recipe's data
    // and schedule.
    const char *infer_input;
    const char *infer_output;
    bool infer_argmax;
    // A NaN or an infinity (inject_value) planted in the first element of a linear layer's
    // weight gradient (inject_layer; NULL: the first) at the train step whose trace index is
    // inject_step, which the optimizer must skip: fault tests and soaks.
    bool inject;
    uint64_t inject_step;
    const char *inject_layer;
    float inject_value;
    bool modes[QT_MODE_COUNT];  // programs to build beyond the schedule's (qt_step_mode, qt_infer)
    qt_inputs inputs;           // pushed inputs' type when the recipe names no data source
    // Data parallelism: this runtime is rank `rank` of `world` processes (0 or 1: alone), each on
    // GPU `rank` (qt_device_open's ordinal), that train one model on their shares of every batch
    // (the recipe's batch is the global batch, a multiple of world) and meet through NCCL under
    // `parallel_id` (QT_PARALLEL_ID_BYTES from qt_parallel_id, the same for every rank). Only
    // qt_measure and qt_plan are possible without parallel_id (a rank's plan). Several ranks
    // run train, eval and infer rows (a schedule of eval rows alone too; rank 0 writes the infer
    // files of the whole batch) and refuse infer_input and from_path; their checkpoints (rank 0
    // writes them) are those of the run on one GPU, and resume on any count.
    uint32_t rank, world;
    const void *parallel_id;
} qt_options;

#define QT_PARALLEL_ID_BYTES 128
// The id under which the ranks of one data-parallel run meet (NCCL's unique id): made once by
// the process that starts them and given to each. Loads NCCL (QT_ERR_NO_DRIVER naming the places
// tried when it cannot).
QT_API qt_status qt_parallel_id(void *out, size_t bytes);

// Measures the run (options NULL: all defaults): reads the data files' headers, builds the
// schedule table and plans the model and every program once with counting tables, which store
// nothing: *table_bytes is the memory of the run's tables (the schedule, the arenas' regions,
// the programs' ops, the checkpoint tables), sized from the recipe. May be repeated with other
// options until qt_plan.
QT_API qt_status qt_measure(qt_runtime *rt, const qt_options *options, uint64_t *table_bytes);
// Plans the run into `tables` (at least the measured bytes, QT_MEMORY_ALIGN aligned, the
// caller's until qt_close): the schedule table, the model, every program, both arenas packed.
// No device is needed.
QT_API qt_status qt_plan(qt_runtime *rt, void *tables, uint64_t table_bytes);

typedef struct qt_plan_info {
    uint32_t batch;              // rows of every step's batch
    uint32_t input_features;     // values per sample
    uint32_t outputs;            // logits per sample (classes, or regression targets)
    bool classification;         // softmax_xent: int32 labels; else mse: float32 targets
    qt_inputs inputs;            // the type of batches' inputs
    bool train_source, eval_source;  // the recipe (or infer_input) names them
    bool modes[QT_MODE_COUNT];   // the programs built
    uint32_t rows;               // rows of the schedule table
    uint64_t steps[QT_MODE_COUNT];   // steps of each mode in the table
    uint32_t quantizers;         // delayed-scaling quantizers in every step's statistics
    uint64_t data_bytes;         // memory qt_load needs (datasets, shuffle order, golden trace)
    uint64_t device_bytes, host_bytes;              // the arenas
    uint64_t device_lower_bound, host_lower_bound;  // no packing uses fewer bytes
    uint32_t device_regions, host_regions;
    uint32_t moe_layers;         // mixture-of-experts layers (qt_expert_loads_get)
} qt_plan_info;

QT_API qt_status qt_plan_info_get(const qt_runtime *rt, qt_plan_info *out);

typedef enum qt_arena { QT_ARENA_DEVICE, QT_ARENA_HOST } qt_arena;

// One region of an arena's memory map.
typedef struct qt_region {
    const char *name;            // valid until qt_close
    const char *category;        // "weights", "master", "optim", "scaling", "grads",
                                 // "activations", "workspace", "staging"
    uint64_t offset, bytes;      // from the arena's base
    bool persistent;             // live at every op; else over ops [first_op, last_op]
    int32_t first_op, last_op;
} qt_region;

// Region `index` (< qt_plan_info.*_regions) of an arena; QT_ERR_INPUT past the end.
QT_API qt_status qt_plan_region(const qt_runtime *rt, qt_arena arena, uint32_t index,
                                qt_region *out);
// The whole plan as `qtrain plan` prints it: layers, quantizers, GEMM paths, the schedule,
// every program and both memory maps; and in brief, as `qtrain plan --summary` prints it.
QT_API qt_status qt_plan_print(qt_runtime *rt, FILE *out);
QT_API qt_status qt_plan_print_summary(const qt_runtime *rt, FILE *out);
// The name of delayed-scaling quantizer `index` (< quantizers), e.g. "linear.input@fc1".
QT_API qt_status qt_quantizer_name(const qt_runtime *rt, uint32_t index, char *out,
                                   size_t out_bytes);

// ---------------------------------------------------------------------------------------------
// Data and binding

// Reads the datasets (and the golden trace) into `memory` (qt_plan_info.data_bytes; NULL when
// that is 0), which only the host reads. Needs no device, so it may run while another thread
// opens one. Refuses output files of infer rows that exist (unless replace_outputs).
QT_API qt_status qt_load(qt_runtime *rt, void *memory, uint64_t bytes);

// The arenas' memory. A NULL pointer: qtrain allocates that arena through the driver (GPU only).
// device: a device pointer of the device's primary context (CUdeviceptr cast to void *), or on
// the reference backend host memory; host: host memory, which qtrain pins (page-locks) on a GPU
// until qt_close. At least qt_plan_info.device_bytes / host_bytes, QT_MEMORY_ALIGN aligned.
typedef struct qt_arenas {
    void *device;
    uint64_t device_bytes;
    void *host;
    uint64_t host_bytes;
} qt_arenas;

// Binds the run to a device (arenas NULL: every arena from the driver): arenas zeroed, the
// learning-rate rows written, the init program run (and from_path's weights loaded), one CUDA
// graph captured per mode unless eager. After qt_load. A failure before any arena was bound
// (memory refused) may be retried; after one, the runtime takes qt_close alone.
QT_API qt_status qt_bind(qt_runtime *rt, qt_device *device, const qt_arenas *arenas);

// ---------------------------------------------------------------------------------------------
// Steps

// One batch from the embedder: rows (1 .. batch) of real samples; qtrain pads the rest of the
// batch, and padding rows count in neither loss nor accuracy. Inputs in the plan's type
// (inputs_f32 or inputs_u8, [rows][input_features]); labels [rows] in 0 .. outputs-1 for a
// classification, targets [rows][outputs] for a regression (neither for infer steps). Float
// values must be finite.
typedef struct qt_batch {
    uint32_t rows;
    const float *inputs_f32;
    const uint8_t *inputs_u8;
    const int32_t *labels;
    const float *targets;
} qt_batch;

// The next step that runs takes this batch instead of its data source's (copied now: the
// arrays may change once this returns). After qt_bind; one batch at a time. A data-parallel
// rank (world > 1) refuses pushed and callback batches (QT_ERR_INPUT): it takes its share of
// the recipe's sources.
QT_API qt_status qt_push_batch(qt_runtime *rt, const qt_batch *batch);

// The data callback: called for every step that has no pushed batch, before the step, with the
// step's mode and global index. It fills *batch (the arrays stay valid until it is called again
// or the call that invoked it returns), or leaves rows at 0 to take the recipe's source for the
// step; a status other than QT_OK ends the call that invoked it with that status.
typedef qt_status (*qt_data_fn)(void *ctx, qt_mode mode, uint64_t step, qt_batch *batch);
QT_API void qt_on_data(qt_runtime *rt, qt_data_fn fn, void *ctx);  // fn NULL: none

// What one step did, as its record says (the trace prints the same fields).
typedef struct qt_step_stats {
    uint64_t step;               // global index: train, eval and infer steps share it
    qt_mode mode;
    bool skipped;                // train: a non-finite gradient, the update was skipped
    float loss;
    float accuracy;              // correct / real rows (classification), else 0
    float grad_norm, lr;         // train, else 0
    bool has_checksum;           // checksum holds the persistent state's hash
    uint64_t checksum;
    uint32_t rows_valid;         // real rows of the batch
    bool in_schedule;            // a step of the schedule table (not qt_step_mode / qt_infer)
    uint32_t row;                // in_schedule: its table row and 1-based step in it
    uint64_t row_step, row_steps;
    bool eval_set;               // eval and infer steps: on the eval set (else the train set)
    uint64_t done, total;        // qt_run: steps read so far, and all that it runs
    uint64_t steps_left[QT_MODE_COUNT];  // qt_run: steps of each mode it runs after this one
    uint64_t train_steps;        // train steps of the run so far, this one included
    uint64_t epoch_steps;        // train steps of one epoch of the train set (0: unknown)
    // Eval rows: the pass so far (the whole pass at its last step) over its real rows: the mean
    // loss, correct / rows, the rows.
    double pass_loss, pass_accuracy;
    uint64_t pass_samples;
    double elapsed_s;            // since the call that ran it began
    uint32_t quantizers;         // delayed-scaling quantizers: [quantizers] of their amax of
    const float *amax, *scale;   // this step and scale after its update, valid until the
                                 // runtime's next step
} qt_step_stats;

// The statistics callback: called after every step, when qtrain reads its record (on a GPU, up
// to two steps after the step was launched).
typedef void (*qt_step_fn)(void *ctx, const qt_step_stats *stats);
QT_API void qt_on_step(qt_runtime *rt, qt_step_fn fn, void *ctx);  // fn NULL: none
// The last step's statistics (poll); QT_ERR_STATE before the first step.
QT_API qt_status qt_last_step(const qt_runtime *rt, qt_step_stats *out);

// Where the run stands between two calls.
typedef struct qt_position {
    uint64_t step;               // steps done (every mode, the qt_step_mode ones included)
    uint64_t train_steps;
    uint32_t row, rows;          // the schedule's next row and its row count
    uint64_t row_step;           // steps of that row already done
    uint64_t steps_left[QT_MODE_COUNT];  // steps of each mode the schedule has left
    bool done;                   // the schedule is complete
    float last_train_loss;       // the last train step's loss
    bool has_eval;               // an eval row has ended; its results:
    double eval_loss, eval_accuracy;
    uint64_t eval_samples;
} qt_position;

QT_API qt_status qt_position_get(const qt_runtime *rt, qt_position *out);

// What one qt_run did.
typedef struct qt_summary {
    uint64_t steps[QT_MODE_COUNT];  // of this call
    uint64_t skipped;            // train steps whose update was skipped
    bool stopped;                // qt_request_stop ended it before the schedule's end
    double seconds;              // the loop's wall time
    double train_seconds;        // of it, the train rows'
    uint64_t step_times;         // train-step intervals the median is over (the last 4096)
    double step_median_ms;       // their median: the host clock between consecutive train
                                 // steps' records (no synchronization of its own)
    uint64_t lagged_reads;       // synchronizing waits the loop made (one per step on a GPU)
    uint64_t batch_copies;       // batches staged host to device
    uint32_t saves;              // checkpoints written to save_path, and the last one's place
    uint64_t last_save_step, last_save_train_steps;
    double save_seconds;
    uint32_t output_files;       // infer rows' files written (qt_output_file)
} qt_summary;

// Runs the schedule from where the run stands to its end or a stop (qt_request_stop), pipelined
// (each step's batch crosses to the device beside the step before it), writing the trace,
// golden-trace checks, checkpoints (save_path) and the infer rows' output files.
QT_API qt_status qt_run(qt_runtime *rt, qt_summary *summary);
// Asks qt_run to stop after the current step (an infer row that writes a file: after the row);
// it then waits for the steps in flight, saves with save_path, and returns QT_OK with stopped.
// Safe from any thread and from a signal handler.
QT_API void qt_request_stop(qt_runtime *rt);

// The schedule's next step, waited for (an infer row that writes a file runs whole). The same
// records as qt_run gives, in the same trace. QT_ERR_STATE once the schedule is done.
QT_API qt_status qt_step(qt_runtime *rt, qt_step_stats *stats);
// One step of `mode` outside the schedule (its position stays), waited for. Its batch: the
// pushed one, else the data callback's, else the recipe's source (train: the shuffled train
// set; eval and infer: the eval set if there is one, else the train set, in file order).
QT_API qt_status qt_step_mode(qt_runtime *rt, qt_mode mode, qt_step_stats *stats);
// Inference on the caller's batch: one infer step (outside the schedule) whose outputs go to
// logits (float32 [rows][outputs], the model's BF16 outputs widened exactly; NULL: not wanted)
// and classes (int32 [rows]: the largest logit's index, the lower one on ties, -1 for a row of
// NaNs; NULL: not wanted). Needs the infer program (an infer row, or options.modes).
QT_API qt_status qt_infer(qt_runtime *rt, const qt_batch *batch, float *logits,
                          int32_t *classes);

// Output file `index` (< qt_summary.output_files) the last qt_run wrote.
typedef struct qt_output_file {
    const char *path;            // valid until qt_close
    uint64_t rows;
    uint32_t outputs;            // logits per row (argmax: 1)
    bool argmax;                 // int32 classes instead of float32 logits
} qt_output_file;

QT_API qt_status qt_output_file_get(const qt_runtime *rt, uint32_t index, qt_output_file *out);

// The most experts of one moe layer (a recipe's experts= is at most this).
#define QT_EXPERTS_MAX 1024

// How moe layer `index` (< qt_plan_info.moe_layers, in model order) spread the last train step's
// tokens over its experts.
typedef struct qt_expert_loads {
    const char *layer;           // the layer's name, valid until qt_close
    uint32_t experts, topk;
    uint32_t tokens;             // rows of the step's batch (this rank's share with world > 1)
    uint32_t max;                // the busiest expert's count
    double mean;                 // tokens x topk / experts, what each would take if balanced
} qt_expert_loads;

// The loads of moe layer `index` in the last train step that ran: counts[e] (counts_len >=
// experts; counts NULL: only *out) is how many of the step's token-expert pairs expert e took;
// they sum to tokens x topk. The counts live on the device and are read here, after the steps
// in flight finish: a call between qt_run calls, not a per-step query. QT_ERR_STATE before the
// first train step since qt_bind, QT_ERR_INPUT for an index past the layers or a short counts.
QT_API qt_status qt_expert_loads_get(qt_runtime *rt, uint32_t index, uint32_t *counts,
                                     uint32_t counts_len, qt_expert_loads *out);

// Before memory is allocated (after qt_plan): the device arena against a GPU device's free
// memory (cuMemGetInfo), and what lives in host memory against what this process can get (the
// least of MemAvailable, RLIMIT_AS, RLIMIT_DATA and the cgroup's limit): the host arena, the
// device arena when it is host memory (`reference`, or a reference device), and extra_host bytes
// the caller is about to allocate (the datasets). device NULL: host memory only. QT_ERR_MEMORY
// naming both numbers, the tightest limit, the largest regions and what to change in the recipe.
QT_API qt_status qt_check_memory(const qt_runtime *rt, qt_device *device, bool reference,
                                 uint64_t extra_host);

// Wall-clock seconds of the start-up phases (each has its own remedy).
typedef struct qt_timings {
    double load_s;     // qt_load: the datasets read (and inflated)
    double bind_s;     // arenas allocated and zeroed, resident datasets uploaded
    double init_s;     // the init program, and from_path's weights
    double capture_s;  // one graph captured and instantiated per mode
    double resume_s;   // qt_resume: the checkpoint checked and loaded
} qt_timings;

QT_API qt_status qt_timings_get(const qt_runtime *rt, qt_timings *out);

// On the reference backend, between steps: how long one step of each mode takes, in ms[mode]
// (0 for modes without steps left), each timed on the next batch of the recipe's source for it,
// so that a caller can say how long the run will take before it starts. Both arenas are copied
// into scratch (qt_plan_info's device_bytes + host_bytes) and back: the run goes on from the same
// bytes. QT_ERR_STATE on a GPU, for a recipe without a train source and with a pushed batch.
QT_API qt_status qt_time_steps(qt_runtime *rt, void *scratch, uint64_t bytes,
                               double ms[QT_MODE_COUNT]);

// After qt_run on a GPU with graphs: every mode's program op by op and as its graph, `reps`
// launches each, printed to out. It changes the run's state: nothing may follow but qt_close.
QT_API qt_status qt_profile(qt_runtime *rt, uint32_t reps, FILE *out);

// ---------------------------------------------------------------------------------------------
// Checkpoints and traces

// A checkpoint of where the run stands (needs options.checkpoints or save_path), written
// atomically: PATH.tmp, fsync, rename, fsync of the folder.
QT_API qt_status qt_save(qt_runtime *rt, const char *path);
// After qt_bind, before any step: the checkpoint's device state and position (the run continues
// bit for bit where the saving run stood). Refuses another recipe, seed or region layout and a
// damaged file, naming what differs; after a failure the runtime takes qt_close alone (its state
// may have moved). Needs options.checkpoints (or save_path).
QT_API qt_status qt_resume(qt_runtime *rt, const char *path);
// Where the run was resumed from (false: it was not).
QT_API bool qt_resumed(const qt_runtime *rt, uint64_t *step, uint64_t *train_steps);

typedef struct qt_export_info {
    char recipe_name[256];
    uint64_t step, train_steps;
    uint32_t params;
} qt_export_info;

// Bytes of qt_export's work area for the checkpoint at path (its table's size, read from the
// header).
QT_API qt_status qt_export_bytes(const char *checkpoint_path, uint64_t *bytes);
// A checkpoint's weights as a safetensors file (every CRC checked first): the FP32 masters, and
// with quantized the codes and scales of every usage. An existing out_path is refused unless
// force. Needs no runtime.
QT_API qt_status qt_export(void *memory, uint64_t bytes, const char *checkpoint_path,
                           const char *out_path, bool quantized, bool force,
                           qt_export_info *info);

// Compares two trace files field for field and prints `identical: N records` or the first
// difference to out. Needs no runtime.
QT_API qt_status qt_trace_diff(const char *path_a, const char *path_b, FILE *out,
                               bool *identical);

// Destroys the graphs, frees what qtrain allocated through the driver, unpins the caller's host
// arena, removes unfinished output files and closes a trace that steps left open with its
// completion record (failed when the last step failed, else complete when the schedule is done,
// stopped when it is not). The device is then free for another runtime and all memory is the
// caller's again, also when the status (the completion record's write) is not QT_OK. NULL is
// ignored.
QT_API qt_status qt_close(qt_runtime *rt);

#ifdef __cplusplus
}
#endif

#endif  // QTRAIN_H
