// api: the public C API (runtime/qtrain.h) over the runtime's modules: the runtime and device
// handles in caller memory, the lifecycle's order, the embedder's batches and the conversions
// between the public structs and the internal ones. Every function the library exports is here
// (or is one of status.c's two), and each checks its handle and its place in the lifecycle
// before it touches anything, so a misuse is a status, not a crash.
#include "runtime/qtrain.h"

#include <inttypes.h>
#include <math.h>    // isfinite
#include <string.h>

#include "runtime/run/export.h"         // export_safetensors
#include "runtime/backend/gemm_tier.h"  // gemm_tier_describe
#include "runtime/io/infer_out.h"       // infer_out_logits, infer_out_classes
#include "runtime/base/input_file.h"    // input_file_read: the recipe, a regular file
#include "runtime/base/pool.h"          // pool_threads: the reference backend's threads
#include "runtime/run/run.h"

#define API_RUNTIME_MAGIC 0x51545254u  // "QTRT" while open
#define API_DEVICE_MAGIC 0x51544456u   // "QTDV" while open
// A recipe file's text is read whole into the runtime (qt_open_file); the text is not needed
// after parsing, but the parser wants all of it at once.
#define API_RECIPE_BYTES_MAX (1u << 20)

QT_STATIC_ASSERT((int)QT_MODE_TRAIN == MODEL_MODE_TRAIN && (int)QT_MODE_EVAL == MODEL_MODE_EVAL &&
                     (int)QT_MODE_INFER == MODEL_MODE_INFER &&
                     (int)QT_MODE_COUNT == MODEL_MODE_COUNT,
                 "qt_mode mirrors model_mode");
QT_STATIC_ASSERT((int)QT_EMULATED_GEMM_AUTO == MODEL_EMULATED_AUTO &&
                     (int)QT_EMULATED_GEMM_KERNEL == MODEL_EMULATED_KERNEL &&
                     (int)QT_EMULATED_GEMM_COPIES == MODEL_EMULATED_COPIES,
                 "qt_emulated_gemm mirrors model_emulated_gemm");
QT_STATIC_ASSERT(QT_TRACE_FORMAT == TRACE_VERSION && QT_CHECKPOINT_FORMAT == CKPT_VERSION,
                 "the file formats' versions");
QT_STATIC_ASSERT(QT_MEMORY_ALIGN >= DATA_ALIGN && QT_MEMORY_ALIGN >= ARENA_DEVICE_ALIGN_MIN,
                 "one alignment serves every block");
// qt_request_stop may come from a signal handler: only a lock-free atomic is safe there.
QT_STATIC_ASSERT(ATOMIC_INT_LOCK_FREE == 2, "atomic_int is lock-free");

struct qt_device {
    uint32_t magic;
    backend backend;
    bool fell_back;
    char reason[256];
    qt_runtime *bound;  // the runtime bound to it, or NULL
};

typedef enum api_phase { API_OPENED, API_MEASURED, API_PLANNED, API_LOADED, API_BOUND } api_phase;

// The small fields first: qt_open zeroes them (api_open), the planner writes the tables after.
struct qt_runtime {
    uint32_t magic;
    api_phase phase;
    const char *broken;               // the call whose failure left the run unusable, or NULL
    uint64_t recipe_hash;
    qt_device *device;
    atomic_int stop;                  // qt_request_stop; qt_run reads it between steps
    qt_step_fn on_step;
    void *on_step_ctx;
    qt_data_fn on_data;
    void *on_data_ctx;
    bool pushed;                      // the host slot of the next step holds a pushed batch
    uint32_t pushed_rows;
    bool pushed_targets;              // it has labels or targets (else infer steps only)
    bool stepped;                     // a step ran since qt_bind
    bool has_last;
    qt_step_stats last;               // the last step's, for qt_last_step
    qt_trace_record last_record;      // its record, which last.amax and last.scale point into
    recipe recipe;                    // the tables: written by the parser and the planner
    run run;
    sched_summary loop;               // the last loop's (qt_run, qt_step)
    float step_times[SCHED_STEP_TIMES];  // the median's working copy
    char text[API_RECIPE_BYTES_MAX];  // qt_open_file's
};

static const char *const api_phase_calls[] = {
    [API_OPENED] = "qt_measure",
    [API_MEASURED] = "qt_plan",
    [API_PLANNED] = "qt_load",
    [API_LOADED] = "qt_bind",
    [API_BOUND] = "qt_close",
};

// ---------------------------------------------------------------------------------------------
// Handles and the lifecycle

static qt_status api_memory(const char *what, const void *memory, size_t bytes, size_t needed) {
    if (memory == NULL || bytes < needed || (uintptr_t)memory % QT_MEMORY_ALIGN != 0) {
        return qt_fail(QT_ERR_MEMORY, "%s needs %zu bytes at a multiple of %d; given %zu bytes at "
                       "%p", what, needed, QT_MEMORY_ALIGN, bytes, memory);
    }
    return QT_OK;
}

static qt_status api_runtime(const qt_runtime *rt, const char *call) {
    if (rt == NULL || rt->magic != API_RUNTIME_MAGIC) {
        return qt_fail(QT_ERR_STATE, "%s: not an open runtime (qt_open_file or qt_open_text "
                       "makes one; qt_close ends it)", call);
    }
    return QT_OK;
}

// The runtime is open and has reached `phase` (and, `exact`, no further).
static qt_status api_phase_is(const qt_runtime *rt, const char *call, api_phase phase,
                              bool exact) {
    QT_TRY(api_runtime(rt, call));
    if (rt->phase < phase) {
        return qt_fail(QT_ERR_STATE, "%s: call %s first", call, api_phase_calls[rt->phase]);
    }
    if (exact && rt->phase > phase) {
        return qt_fail(QT_ERR_STATE, "%s: the runtime is past this step (the lifecycle is "
                       "qt_measure, qt_plan, qt_load, qt_bind, in this order)", call);
    }
    return QT_OK;
}

// A bound runtime that may still run (queries work after a failure too).
static qt_status api_usable(const qt_runtime *rt, const char *call) {
    QT_TRY(api_phase_is(rt, call, API_BOUND, false));
    if (rt->broken) {
        return qt_fail(QT_ERR_STATE, "%s: %s failed after it had changed the run's memory; "
                       "qt_close this runtime and open another", call, rt->broken);
    }
    return QT_OK;
}

// A usable runtime, its device's context current on this thread.
static qt_status api_bound(qt_runtime *rt, const char *call) {
    QT_TRY(api_usable(rt, call));
    return backend_attach_thread(&rt->device->backend);
}

static qt_status api_device(const qt_device *d, const char *call) {
    if (d == NULL || d->magic != API_DEVICE_MAGIC) {
        return qt_fail(QT_ERR_STATE, "%s: not an open device (qt_device_open makes one)", call);
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Devices

size_t qt_device_bytes(void) { return sizeof(qt_device); }

static qt_status api_device_start(qt_device *d, qt_device_kind kind, int ordinal) {
    if (kind == QT_DEVICE_REFERENCE) {
        backend_open_ref(&d->backend);
        return QT_OK;
    }
    qt_status status = backend_open_gpu(&d->backend, ordinal);
    if (status == QT_OK) return QT_OK;
    backend_close(&d->backend);
    if (kind == QT_DEVICE_GPU || (status != QT_ERR_NO_DRIVER && status != QT_ERR_NO_DEVICE)) {
        return status;
    }
    d->fell_back = true;
    snprintf(d->reason, sizeof d->reason, "%s", qt_error_message());
    backend_open_ref(&d->backend);
    return QT_OK;
}

qt_status qt_device_open(void *memory, size_t bytes, qt_device_kind kind, int ordinal,
                         qt_device **out) {
    *out = NULL;
    QT_TRY(api_memory("a device", memory, bytes, sizeof(qt_device)));
    if ((unsigned)kind > QT_DEVICE_REFERENCE || ordinal < 0) {
        return qt_fail(QT_ERR_INPUT, "qt_device_open: kind %d, ordinal %d; expected "
                       "QT_DEVICE_AUTO, QT_DEVICE_GPU or QT_DEVICE_REFERENCE and an ordinal "
                       ">= 0", (int)kind, ordinal);
    }
    qt_device *d = memory;
    memset(d, 0, sizeof *d);
    QT_TRY(api_device_start(d, kind, ordinal));
    d->magic = API_DEVICE_MAGIC;
    *out = d;
    return QT_OK;
}

qt_status qt_device_close(qt_device *d) {
    if (d == NULL) return QT_OK;
    QT_TRY(api_device(d, "qt_device_close"));
    if (d->bound) {
        return qt_fail(QT_ERR_STATE, "qt_device_close: a runtime is bound to this device; "
                       "qt_close it first");
    }
    QT_TRY(backend_attach_thread(&d->backend));  // its streams and modules are its context's
    backend_close(&d->backend);
    d->magic = 0;
    return QT_OK;
}

void qt_device_describe(const qt_device *d, qt_device_info *out) {
    memset(out, 0, sizeof *out);
    if (api_device(d, "qt_device_describe") != QT_OK) return;
    const backend *b = &d->backend;
    const backend_device_info *info = &b->info;
    out->gpu = b->kind == BACKEND_GPU;
    out->fell_back = d->fell_back;
    snprintf(out->reason, sizeof out->reason, "%s", d->reason);
    snprintf(out->name, sizeof out->name, "%s", info->name);
    out->driver_version = info->driver_version;
    out->cc_major = info->cc_major;
    out->cc_minor = info->cc_minor;
    out->sm_count = info->sm_count;
    out->memory_bytes = info->memory_bytes;
    out->free_bytes = info->free_bytes;
    out->threads = pool_threads();
    if (!out->gpu) return;
    gemm_tier_device tier = backend_gemm_device(b);
    snprintf(out->gemm_tier, sizeof out->gemm_tier, "%s", gemm_tier_describe(&tier));
    out->overlapping_launches = b->modules.overlap_launches;
    out->kernels = KERNEL_COUNT;
    out->modules = MODULE_COUNT;
    for (int k = 0; k < KERNEL_COUNT; k++) {
        out->kernels_loaded += modules_loaded(&b->modules, (kernel_id)k) ? 1u : 0u;
    }
}

qt_status qt_device_kernel(const qt_device *d, uint32_t index, qt_kernel_info *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_device(d, "qt_device_kernel"));
    const backend *b = &d->backend;
    if (b->kind != BACKEND_GPU || index >= KERNEL_COUNT) {
        return qt_fail(QT_ERR_INPUT, "qt_device_kernel: kernel %u of %u on this device", index,
                       b->kind == BACKEND_GPU ? (unsigned)KERNEL_COUNT : 0u);
    }
    const kernel_attributes *a = &b->modules.attributes[index];
    out->symbol = kernel_table[index].symbol;
    out->module = modules_name(kernel_table[index].module);
    out->loaded = modules_loaded(&b->modules, (kernel_id)index);
    out->registers = a->registers;
    out->static_smem_bytes = a->static_smem_bytes;
    out->local_bytes = a->local_bytes;
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Opening and planning

const char *qt_mode_name(qt_mode mode) {
    if ((unsigned)mode >= QT_MODE_COUNT) return "?";
    return model_mode_name((model_mode)mode);
}

size_t qt_runtime_bytes(void) { return sizeof(qt_runtime); }

static qt_status api_open(void *memory, size_t bytes, qt_runtime **out) {
    *out = NULL;
    QT_TRY(api_memory("a runtime", memory, bytes, sizeof(qt_runtime)));
    qt_runtime *rt = memory;
    memset(rt, 0, offsetof(qt_runtime, recipe));  // the small fields (the struct's comment)
    return QT_OK;
}

static void api_opened(qt_runtime *rt, const char *text, size_t bytes, qt_runtime **out) {
    rt->recipe_hash = trace_hash(text, bytes);
    rt->phase = API_OPENED;
    atomic_init(&rt->stop, 0);
    rt->magic = API_RUNTIME_MAGIC;
    *out = rt;
}

qt_status qt_open_file(void *memory, size_t bytes, const char *path, qt_runtime **out) {
    QT_TRY(api_open(memory, bytes, out));
    qt_runtime *rt = memory;
    size_t used = 0;
    QT_TRY(input_file_read(path, "recipe", rt->text, sizeof rt->text, &used));
    QT_TRY(recipe_parse(rt->text, used, path, &rt->recipe));
    api_opened(rt, rt->text, used, out);
    return QT_OK;
}

qt_status qt_open_text(void *memory, size_t bytes, const char *text, size_t text_bytes,
                       const char *name, qt_runtime **out) {
    QT_TRY(api_open(memory, bytes, out));
    qt_runtime *rt = memory;
    QT_TRY(recipe_parse(text, text_bytes, name ? name : "recipe", &rt->recipe));
    api_opened(rt, text, text_bytes, out);
    return QT_OK;
}

static qt_status api_fill(void *ctx, model_mode mode, uint64_t step, void *slot,
                          uint32_t *rows_valid);

static qt_status api_options(qt_runtime *rt, const qt_options *o, run_options *ro) {
    memset(ro, 0, sizeof *ro);
    if ((unsigned)o->emulated_gemm > QT_EMULATED_GEMM_COPIES || (unsigned)o->inputs > 1) {
        return qt_fail(QT_ERR_INPUT, "qt_measure: emulated_gemm %d, inputs %d: not a value of "
                       "their enums", (int)o->emulated_gemm, (int)o->inputs);
    }
    if (o->infer_input && !o->infer_output) {
        return qt_fail(QT_ERR_INPUT, "qt_measure: infer_input needs infer_output (the .npy file "
                       "of the outputs)");
    }
    ro->eager = o->eager;
    ro->steps_limit = o->steps;
    ro->seed_given = o->seed_given;
    ro->seed = o->seed;
    ro->trace_path = o->trace_path;
    ro->checksum_every = o->checksum_every;
    ro->emulated_gemm = (model_emulated_gemm)o->emulated_gemm;
    ro->save_path = o->save_path;
    ro->save_replaces = o->save_replaces;
    ro->save_every = o->save_every;
    ro->checkpoints = o->checkpoints;
    ro->replace_outputs = o->replace_outputs;
    ro->infer_input = o->infer_input;
    ro->infer_output = o->infer_output;
    ro->infer_argmax = o->infer_argmax;
    ro->from_path = o->from_path;
    ro->golden_path = o->golden_path;
    ro->metrics_path = o->metrics_path;
    ro->metrics_every = o->metrics_every;
    if (o->inject) {
        if (!isnan(o->inject_value) && !isinf(o->inject_value)) {
            return qt_fail(QT_ERR_INPUT, "qt_measure: inject_value %g; expected a NaN or an "
                           "infinity", (double)o->inject_value);
        }
        uint32_t bits;
        memcpy(&bits, &o->inject_value, sizeof bits);
        ro->inject = (run_inject){true, o->inject_step, o->inject_layer, bits};
    }
    for (int mode = 0; mode < QT_MODE_COUNT; mode++) ro->modes[mode] = o->modes[mode];
    ro->inputs = o->inputs == QT_INPUTS_U8 ? DATA_INPUT_U8 : DATA_INPUT_F32;
    ro->rank = o->rank;
    ro->world = o->world;
    ro->nccl_id = o->parallel_id;
    ro->interrupt = &rt->stop;
    ro->fill = api_fill;
    ro->fill_ctx = rt;
    return QT_OK;
}

qt_status qt_parallel_id(void *out, size_t bytes) {
    if (!out || bytes < QT_PARALLEL_ID_BYTES) {
        return qt_fail(QT_ERR_INPUT, "qt_parallel_id: %zu bytes; expected %d",
                       out ? bytes : 0, QT_PARALLEL_ID_BYTES);
    }
    QT_STATIC_ASSERT(QT_PARALLEL_ID_BYTES == sizeof(ncclUniqueId), "the id is NCCL's");
    QT_TRY(nccl_load());
    ncclUniqueId id;
    QT_NCCL(ncclGetUniqueId(&id));
    memcpy(out, &id, sizeof id);
    return QT_OK;
}

qt_status qt_measure(qt_runtime *rt, const qt_options *options, uint64_t *table_bytes) {
    *table_bytes = 0;
    QT_TRY(api_phase_is(rt, "qt_measure", API_OPENED, false));
    if (rt->phase > API_MEASURED) {
        return qt_fail(QT_ERR_STATE, "qt_measure: the runtime is planned already (measure, "
                       "then plan, once)");
    }
    qt_options defaults;
    memset(&defaults, 0, sizeof defaults);
    run_options ro;
    QT_TRY(api_options(rt, options ? options : &defaults, &ro));
    rt->phase = API_OPENED;  // until this measure succeeds
    QT_TRY(run_measure_hashed(&rt->run, &rt->recipe, rt->recipe_hash, &ro, table_bytes));
    rt->phase = API_MEASURED;
    return QT_OK;
}

qt_status qt_plan(qt_runtime *rt, void *tables, uint64_t table_bytes) {
    QT_TRY(api_phase_is(rt, "qt_plan", API_MEASURED, true));
    QT_TRY(api_memory("the run's tables", tables, (size_t)table_bytes,
                      (size_t)rt->run.tables.bytes));
    QT_TRY(run_plan(&rt->run, tables, table_bytes));
    rt->phase = API_PLANNED;
    return QT_OK;
}

qt_status qt_plan_info_get(const qt_runtime *rt, qt_plan_info *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_phase_is(rt, "qt_plan_info_get", API_PLANNED, false));
    const run *r = &rt->run;
    const model *m = &r->model;
    out->batch = m->batch;
    out->input_features = m->input_features;
    out->outputs = m->outputs;
    out->classification = m->classification;
    out->inputs = m->io.slot.input_type == DATA_INPUT_U8 ? QT_INPUTS_U8 : QT_INPUTS_F32;
    out->train_source = r->has_train;
    out->eval_source = r->has_eval;
    for (int mode = 0; mode < QT_MODE_COUNT; mode++) {
        out->modes[mode] = m->modes[mode];
        out->steps[mode] = r->table.steps[mode];
    }
    out->rows = r->table.row_count;
    out->quantizers = m->delayed_count;
    out->data_bytes = run_data_bytes(r);
    out->device_bytes = r->dev.bytes_total;
    out->host_bytes = r->host.bytes_total;
    out->device_lower_bound = arena_lower_bound(&r->dev);
    out->host_lower_bound = arena_lower_bound(&r->host);
    out->device_regions = r->dev.region_count;
    out->host_regions = r->host.region_count;
    out->moe_layers = m->moe_count;
    return QT_OK;
}

qt_status qt_plan_region(const qt_runtime *rt, qt_arena which, uint32_t index, qt_region *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_phase_is(rt, "qt_plan_region", API_PLANNED, false));
    const arena *a = which == QT_ARENA_DEVICE ? &rt->run.dev
                     : which == QT_ARENA_HOST ? &rt->run.host
                                              : NULL;
    if (a == NULL || index >= a->region_count) {
        return qt_fail(QT_ERR_INPUT, "qt_plan_region: region %u of arena %d; the device arena "
                       "has %u regions, the host arena %u", index, (int)which,
                       rt->run.dev.region_count, rt->run.host.region_count);
    }
    const arena_region *r = arena_region_get(a, index);
    out->name = r->name;
    out->category = arena_category_name(r->category);
    out->offset = r->offset;
    out->bytes = r->bytes;
    out->persistent = r->persistent;
    out->first_op = r->first_op;
    out->last_op = r->last_op;
    return QT_OK;
}

qt_status qt_plan_print(qt_runtime *rt, FILE *out) {
    QT_TRY(api_phase_is(rt, "qt_plan_print", API_PLANNED, false));
    run_print_plan(&rt->run, out);
    return QT_OK;
}

qt_status qt_plan_print_summary(const qt_runtime *rt, FILE *out) {
    QT_TRY(api_phase_is(rt, "qt_plan_print_summary", API_PLANNED, false));
    run_print_summary(&rt->run, out);
    return QT_OK;
}

qt_status qt_quantizer_name(const qt_runtime *rt, uint32_t index, char *out, size_t out_bytes) {
    QT_TRY(api_phase_is(rt, "qt_quantizer_name", API_PLANNED, false));
    if (index >= rt->run.model.delayed_count || out_bytes == 0) {
        return qt_fail(QT_ERR_INPUT, "qt_quantizer_name: quantizer %u of %u", index,
                       rt->run.model.delayed_count);
    }
    model_trace_name(&rt->run.model, index, out, out_bytes);
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Data and binding

qt_status qt_load(qt_runtime *rt, void *memory, uint64_t bytes) {
    QT_TRY(api_phase_is(rt, "qt_load", API_PLANNED, true));
    uint64_t needed = run_data_bytes(&rt->run);
    if (needed > 0) QT_TRY(api_memory("the datasets", memory, (size_t)bytes, (size_t)needed));
    QT_TRY(run_load(&rt->run, memory, bytes));
    rt->phase = API_LOADED;
    return QT_OK;
}

qt_status qt_bind(qt_runtime *rt, qt_device *device, const qt_arenas *arenas) {
    QT_TRY(api_phase_is(rt, "qt_bind", API_LOADED, true));
    QT_TRY(api_device(device, "qt_bind"));
    if (device->bound) {
        return qt_fail(QT_ERR_STATE, "qt_bind: the device serves another runtime; open one "
                       "device per runtime");
    }
    qt_arenas none;
    memset(&none, 0, sizeof none);
    const qt_arenas *m = arenas ? arenas : &none;
    QT_TRY(backend_attach_thread(&device->backend));
    rt->device = device;
    device->bound = rt;
    qt_status status = run_bind_given(&rt->run, &device->backend, m->device, m->device_bytes,
                                      m->host, m->host_bytes);
    if (status != QT_OK) {
        // An arena that was bound cannot be bound again: the runtime is done.
        if (rt->run.dev.phase == ARENA_PHASE_FROZEN || rt->run.host.phase == ARENA_PHASE_FROZEN) {
            rt->broken = "qt_bind";
        }
        run_close(&rt->run);
        rt->device = NULL;
        device->bound = NULL;
        return status;
    }
    rt->phase = API_BOUND;
    return QT_OK;
}

// A batch for a step of `mode`: its shape and values against the plan. The message says what
// the step expects.
static qt_status api_batch_check(const qt_runtime *rt, const qt_batch *b, model_mode mode) {
    const data_slot_layout *l = &rt->run.model.io.slot;
    bool u8 = l->input_type == DATA_INPUT_U8;
    const void *inputs = u8 ? (const void *)b->inputs_u8 : (const void *)b->inputs_f32;
    if (b->rows < 1 || b->rows > l->batch || inputs == NULL) {
        return qt_fail(QT_ERR_INPUT, "batch of %u rows with%s %s inputs; expected 1 to %u rows "
                       "and inputs_%s [rows][%u]", b->rows, inputs ? "" : "out",
                       u8 ? "uint8" : "float32", l->batch, u8 ? "u8" : "f32", l->features);
    }
    bool labels = l->target_type == DATA_TARGET_LABEL;
    if (mode != MODEL_MODE_INFER && (labels ? b->labels == NULL : b->targets == NULL)) {
        return qt_fail(QT_ERR_INPUT, "a %s step's batch has no %s; expected %s", model_mode_name(
                       mode), labels ? "labels" : "targets", labels ? "labels [rows] (int32)"
                       : "targets [rows][outputs] (float32)");
    }
    for (uint64_t i = 0; !u8 && i < (uint64_t)b->rows * l->features; i++) {
        if (!isfinite(b->inputs_f32[i])) {
            return qt_fail(QT_ERR_INPUT, "batch: input %" PRIu64 " of row %" PRIu64 " is %g; "
                           "expected finite values", i % l->features, i / l->features,
                           (double)b->inputs_f32[i]);
        }
    }
    for (uint32_t r = 0; labels && b->labels && r < b->rows; r++) {
        if (b->labels[r] < 0 || (uint32_t)b->labels[r] >= l->outputs) {
            return qt_fail(QT_ERR_INPUT, "batch: label %d in row %u; expected 0 to %u (the "
                           "model's classes)", b->labels[r], r, l->outputs - 1);
        }
    }
    for (uint64_t i = 0; !labels && b->targets && i < (uint64_t)b->rows * l->outputs; i++) {
        if (!isfinite(b->targets[i])) {
            return qt_fail(QT_ERR_INPUT, "batch: target %" PRIu64 " of row %" PRIu64 " is %g; "
                           "expected finite values", i % l->outputs, i / l->outputs,
                           (double)b->targets[i]);
        }
    }
    return QT_OK;
}

static void api_stage(const qt_runtime *rt, const qt_batch *b, void *slot) {
    const data_slot_layout *l = &rt->run.model.io.slot;
    const void *inputs = l->input_type == DATA_INPUT_U8 ? (const void *)b->inputs_u8
                                                         : (const void *)b->inputs_f32;
    data_stage_rows(l, b->rows, inputs, b->labels, b->targets, slot);
}

// The host slot of the step that runs next (the schedule loop stages step s into slot
// s % MODEL_HOST_SLOTS; nothing reads it between two calls).
static void *api_next_slot(const qt_runtime *rt) {
    const model *m = &rt->run.model;
    uint8_t *slots = arena_host_pointer(m->host, m->io.staging);
    return slots + (rt->run.state.step % MODEL_HOST_SLOTS) * m->io.slot.bytes;
}

// A caller's batch is one runtime's whole batch, staged with itself as the global batch; a
// data-parallel rank's slot is its share of the recipe's global batch, whose real rows every rank
// must agree on (the loss is the global batch's mean). Several ranks therefore take the recipe's
// sources only: a pushed share would be weighed as the whole batch, silently.
static qt_status api_batches_one_rank(const qt_runtime *rt, const char *call) {
    if (rt->run.dp.world <= 1) return QT_OK;
    return qt_fail(QT_ERR_INPUT, "%s: rank %u of %u: a data-parallel rank takes its share of the "
                   "recipe's data sources, not batches of the caller; push batches (or give "
                   "them through qt_on_data) on one GPU", call, rt->run.dp.rank,
                   rt->run.dp.world);
}

qt_status qt_push_batch(qt_runtime *rt, const qt_batch *batch) {
    QT_TRY(api_usable(rt, "qt_push_batch"));
    QT_TRY(api_batches_one_rank(rt, "qt_push_batch"));
    if (rt->pushed) {
        return qt_fail(QT_ERR_STATE, "qt_push_batch: a pushed batch waits for its step; run a "
                       "step first");
    }
    // Infer steps read no targets, so a batch without them is checked as an infer batch; the
    // step that takes it checks that its mode is infer.
    bool targets = batch->labels != NULL || batch->targets != NULL;
    QT_TRY(api_batch_check(rt, batch, targets ? MODEL_MODE_TRAIN : MODEL_MODE_INFER));
    api_stage(rt, batch, api_next_slot(rt));
    rt->pushed = true;
    rt->pushed_rows = batch->rows;
    rt->pushed_targets = targets;
    return QT_OK;
}

void qt_on_data(qt_runtime *rt, qt_data_fn fn, void *ctx) {
    if (api_runtime(rt, "qt_on_data") != QT_OK) return;
    rt->on_data = fn;
    rt->on_data_ctx = ctx;
}

// sched_env.fill: the pushed batch (already in the slot), else the data callback's.
static qt_status api_fill(void *ctx, model_mode mode, uint64_t step, void *slot,
                          uint32_t *rows_valid) {
    qt_runtime *rt = ctx;
    if (rt->pushed) {
        QT_ASSERT(step == rt->run.state.step && slot == api_next_slot(rt));
        if (mode != MODEL_MODE_INFER && !rt->pushed_targets) {
            return qt_fail(QT_ERR_INPUT, "step %" PRIu64 " (%s): the pushed batch has no %s, "
                           "which this step needs; push one with them", step,
                           model_mode_name(mode), rt->run.model.classification ? "labels"
                                                                               : "targets");
        }
        rt->pushed = false;
        *rows_valid = rt->pushed_rows;
        return QT_OK;
    }
    if (!rt->on_data) return QT_OK;
    qt_batch b;
    memset(&b, 0, sizeof b);
    QT_TRY(rt->on_data(rt->on_data_ctx, (qt_mode)mode, step, &b));
    if (b.rows == 0) return QT_OK;  // the recipe's source
    QT_TRY(api_batches_one_rank(rt, "the data callback (qt_on_data)"));
    QT_TRY(api_batch_check(rt, &b, mode));
    api_stage(rt, &b, slot);
    *rows_valid = b.rows;
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Steps

void qt_on_step(qt_runtime *rt, qt_step_fn fn, void *ctx) {
    if (api_runtime(rt, "qt_on_step") != QT_OK) return;
    rt->on_step = fn;
    rt->on_step_ctx = ctx;
}

// Steps of the schedule left, in all.
static uint64_t api_steps_left(const run *r) {
    uint64_t left[MODEL_MODE_COUNT];
    run_steps_left(r, left);
    return left[MODEL_MODE_TRAIN] + left[MODEL_MODE_EVAL] + left[MODEL_MODE_INFER];
}

// sched_progress_fn: every record read becomes the last step's statistics, and the callback's.
static void api_progress(void *ctx, const sched_progress *p) {
    qt_runtime *rt = ctx;
    const qt_trace_record *rec = p->record;
    qt_step_stats *s = &rt->last;
    memset(s, 0, sizeof *s);
    s->step = rec->step;
    s->mode = (qt_mode)p->mode;
    s->skipped = (rec->flags & QT_TRACE_FLAG_SKIPPED) != 0;
    s->loss = rec->loss;
    s->accuracy = rec->accuracy;
    s->grad_norm = rec->grad_norm;
    s->lr = rec->lr;
    s->has_checksum = (rec->flags & QT_TRACE_FLAG_CHECKSUM) != 0;
    s->checksum = rec->checksum;
    s->rows_valid = p->rows_valid;
    s->in_schedule = p->row != SCHED_ROW_NONE;
    s->row = s->in_schedule ? p->row : 0;
    s->row_step = p->row_step;
    s->row_steps = p->row_steps;
    s->eval_set = p->mode != MODEL_MODE_TRAIN && p->dataset == RECIPE_DATASET_EVAL;
    s->done = p->done;
    s->total = p->total;
    for (int mode = 0; mode < QT_MODE_COUNT; mode++) s->steps_left[mode] = p->left[mode];
    s->train_steps = p->train_steps;
    s->epoch_steps = p->epoch_steps;
    s->pass_loss = p->pass_loss;
    s->pass_accuracy = p->pass_accuracy;
    s->pass_samples = p->pass_samples;
    s->elapsed_s = p->elapsed_s;
    s->quantizers = rt->run.model.delayed_count;
    rt->last_record = *rec;
    s->amax = rt->last_record.amax;
    s->scale = rt->last_record.scale;
    rt->has_last = true;
    if (rt->on_step) rt->on_step(rt->on_step_ctx, s);
}

qt_status qt_last_step(const qt_runtime *rt, qt_step_stats *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_runtime(rt, "qt_last_step"));
    if (!rt->has_last) return qt_fail(QT_ERR_STATE, "qt_last_step: no step has run yet");
    *out = rt->last;
    return QT_OK;
}

qt_status qt_position_get(const qt_runtime *rt, qt_position *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_phase_is(rt, "qt_position_get", API_PLANNED, false));
    const run *r = &rt->run;
    const sched_state *s = &r->state;
    out->step = s->step;
    out->train_steps = s->train_steps;
    out->row = s->row;
    out->rows = r->table.row_count;
    out->row_step = s->row_step;
    uint64_t left[MODEL_MODE_COUNT];
    run_steps_left(r, left);
    for (int mode = 0; mode < QT_MODE_COUNT; mode++) out->steps_left[mode] = left[mode];
    out->done = api_steps_left(r) == 0;
    out->last_train_loss = s->last_train_loss;
    out->has_eval = s->has_eval != 0;
    out->eval_loss = s->eval_loss;
    out->eval_accuracy = s->eval_accuracy;
    out->eval_samples = s->eval_samples;
    return QT_OK;
}

// Heapsort in place (no allocation, no qsort): the step times' median needs them in order.
static void api_sift(float *v, uint64_t root, uint64_t n) {
    for (;;) {
        uint64_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && v[child + 1] > v[child]) child++;
        if (v[root] >= v[child]) return;
        float t = v[root];
        v[root] = v[child];
        v[child] = t;
        root = child;
    }
}

static double api_median(float *v, uint64_t n) {
    if (n == 0) return 0.0;
    for (uint64_t i = n / 2; i-- > 0;) api_sift(v, i, n);
    for (uint64_t end = n; end-- > 1;) {
        float t = v[0];
        v[0] = v[end];
        v[end] = t;
        api_sift(v, 0, end);
    }
    return n % 2 ? v[n / 2] : 0.5 * ((double)v[n / 2 - 1] + v[n / 2]);
}

static uint32_t api_output_files(const run *r) {
    uint32_t count = 0;
    for (uint32_t i = 0; i < RECIPE_SCHEDULE_ROWS_MAX; i++) {
        count += r->outputs[i].rows_written > 0 ? 1u : 0u;
    }
    return count;
}

static void api_summary(qt_runtime *rt, qt_summary *out) {
    const sched_summary *s = &rt->loop;
    memset(out, 0, sizeof *out);
    for (int mode = 0; mode < QT_MODE_COUNT; mode++) out->steps[mode] = s->steps[mode];
    out->skipped = s->skipped;
    out->stopped = s->stopped;
    out->seconds = s->seconds;
    out->train_seconds = s->train_seconds;
    uint64_t kept = s->step_time_count < SCHED_STEP_TIMES ? s->step_time_count
                                                          : SCHED_STEP_TIMES;
    out->step_times = kept;
    memcpy(rt->step_times, s->step_ms, kept * sizeof(float));
    out->step_median_ms = api_median(rt->step_times, kept);
    out->lagged_reads = s->lagged_reads;
    out->batch_copies = s->batch_copies;
    const run_saves *sv = &rt->run.saves;
    out->saves = sv->count;
    out->last_save_step = sv->last_step;
    out->last_save_train_steps = sv->last_train_step;
    out->save_seconds = sv->seconds;
    out->output_files = api_output_files(&rt->run);
}

qt_status qt_run(qt_runtime *rt, qt_summary *summary) {
    QT_TRY(api_bound(rt, "qt_run"));
    rt->stepped = true;
    memset(&rt->loop, 0, sizeof rt->loop);  // a failure before the loop leaves it untouched
    qt_status status = run_execute(&rt->run, api_progress, rt, &rt->loop);
    if (rt->loop.stopped) atomic_store(&rt->stop, 0);  // the request is served
    if (summary) api_summary(rt, summary);
    return status;
}

void qt_request_stop(qt_runtime *rt) {
    // No status and no message: this may run in a signal handler.
    if (rt != NULL && rt->magic == API_RUNTIME_MAGIC) atomic_store(&rt->stop, 1);
}

qt_status qt_step(qt_runtime *rt, qt_step_stats *stats) {
    QT_TRY(api_bound(rt, "qt_step"));
    if (api_steps_left(&rt->run) == 0) {
        return qt_fail(QT_ERR_STATE, "qt_step: the schedule is complete (step %" PRIu64 "); "
                       "qt_step_mode runs steps outside it", rt->run.state.step);
    }
    rt->stepped = true;
    memset(&rt->loop, 0, sizeof rt->loop);
    QT_TRY(run_step(&rt->run, api_progress, rt, &rt->loop));
    if (stats) *stats = rt->last;
    return QT_OK;
}

static qt_status api_mode_built(const qt_runtime *rt, const char *call, qt_mode mode) {
    if ((unsigned)mode >= QT_MODE_COUNT) {
        return qt_fail(QT_ERR_INPUT, "%s: mode %d; expected QT_MODE_TRAIN, QT_MODE_EVAL or "
                       "QT_MODE_INFER", call, (int)mode);
    }
    if (!rt->run.model.modes[mode]) {
        return qt_fail(QT_ERR_STATE, "%s: the run has no %s program (the schedule has no %s "
                       "row); plan with options.modes[QT_MODE_%s]", call, qt_mode_name(mode),
                       qt_mode_name(mode), mode == QT_MODE_TRAIN  ? "TRAIN"
                                           : mode == QT_MODE_EVAL ? "EVAL"
                                                                  : "INFER");
    }
    return QT_OK;
}

qt_status qt_step_mode(qt_runtime *rt, qt_mode mode, qt_step_stats *stats) {
    QT_TRY(api_bound(rt, "qt_step_mode"));
    QT_TRY(api_mode_built(rt, "qt_step_mode", mode));
    rt->stepped = true;
    qt_trace_record record;
    uint32_t rows = 0;
    QT_TRY(run_step_outside(&rt->run, (model_mode)mode, api_progress, rt, &record, &rows));
    if (stats) *stats = rt->last;
    return QT_OK;
}

qt_status qt_infer(qt_runtime *rt, const qt_batch *batch, float *logits, int32_t *classes) {
    QT_TRY(api_bound(rt, "qt_infer"));
    QT_TRY(api_mode_built(rt, "qt_infer", QT_MODE_INFER));
    QT_TRY(qt_push_batch(rt, batch));
    uint64_t step = rt->run.state.step;
    qt_status status = qt_step_mode(rt, QT_MODE_INFER, NULL);
    if (status != QT_OK) {
        rt->pushed = false;  // the batch was this call's alone
        return status;
    }
    const model *m = &rt->run.model;
    const uint8_t *slots = arena_host_pointer(m->host, m->io.outputs);
    const uint16_t *bf16 = (const uint16_t *)(slots + (step % MODEL_OUTPUT_SLOTS) *
                                                          m->io.outputs_bytes);
    if (logits) infer_out_logits(bf16, batch->rows, m->outputs, logits);
    if (classes) infer_out_classes(bf16, batch->rows, m->outputs, classes);
    return QT_OK;
}

qt_status qt_output_file_get(const qt_runtime *rt, uint32_t index, qt_output_file *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_phase_is(rt, "qt_output_file_get", API_BOUND, false));
    uint32_t seen = 0;
    for (uint32_t i = 0; i < RECIPE_SCHEDULE_ROWS_MAX; i++) {
        const infer_out *o = &rt->run.outputs[i];
        if (o->rows_written == 0 || seen++ != index) continue;
        out->path = o->file.file.path;
        out->rows = o->rows_written;
        out->outputs = o->argmax ? 1 : o->outputs;
        out->argmax = o->argmax;
        return QT_OK;
    }
    return qt_fail(QT_ERR_INPUT, "qt_output_file_get: file %u of %u", index, seen);
}

QT_STATIC_ASSERT(QT_EXPERTS_MAX == RECIPE_EXPERTS_MAX, "the API's bound is the parser's");

qt_status qt_expert_loads_get(qt_runtime *rt, uint32_t index, uint32_t *counts,
                              uint32_t counts_len, qt_expert_loads *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_bound(rt, "qt_expert_loads_get"));
    const model *m = &rt->run.model;
    if (index >= m->moe_count) {
        return qt_fail(QT_ERR_INPUT, "qt_expert_loads_get: moe layer %u; the model has %u",
                       index, m->moe_count);
    }
    const model_moe *mo = &m->moes[index];
    if (counts && counts_len < mo->experts) {
        return qt_fail(QT_ERR_INPUT, "qt_expert_loads_get: counts holds %u; layer %s has %u "
                       "experts", counts_len, m->recipe->model.layers[mo->layer].name,
                       mo->experts);
    }
    uint32_t read[QT_EXPERTS_MAX];
    QT_TRY(run_expert_loads(&rt->run, index, read));
    out->layer = m->recipe->model.layers[mo->layer].name;
    out->experts = mo->experts;
    out->topk = mo->topk;
    out->tokens = m->batch;
    for (uint32_t e = 0; e < mo->experts; e++) {
        if (read[e] > out->max) out->max = read[e];
    }
    out->mean = (double)m->batch * mo->topk / mo->experts;
    if (counts) memcpy(counts, read, mo->experts * sizeof(uint32_t));
    return QT_OK;
}

qt_status qt_check_memory(const qt_runtime *rt, qt_device *device, bool reference,
                          uint64_t extra_host) {
    QT_TRY(api_phase_is(rt, "qt_check_memory", API_PLANNED, false));
    backend *b = NULL;
    if (device) {
        QT_TRY(api_device(device, "qt_check_memory"));
        b = &device->backend;
        QT_TRY(backend_attach_thread(b));  // cuMemGetInfo reads the current context's device
        reference = reference || b->kind == BACKEND_REF;
    }
    return run_check_memory(&rt->run, b, reference, extra_host);
}

qt_status qt_timings_get(const qt_runtime *rt, qt_timings *out) {
    memset(out, 0, sizeof *out);
    QT_TRY(api_phase_is(rt, "qt_timings_get", API_PLANNED, false));
    const run_timings *t = &rt->run.timings;
    out->load_s = t->data_s;
    out->bind_s = t->bind_s;
    out->init_s = t->init_s;
    out->capture_s = t->capture_s;
    out->resume_s = t->resume_s;
    return QT_OK;
}

qt_status qt_time_steps(qt_runtime *rt, void *scratch, uint64_t bytes, double ms[QT_MODE_COUNT]) {
    QT_TRY(api_bound(rt, "qt_time_steps"));
    run *r = &rt->run;
    if (rt->device->backend.kind != BACKEND_REF || !r->has_train || rt->pushed) {
        return qt_fail(QT_ERR_STATE, "qt_time_steps times the reference backend's steps on the "
                       "recipe's data, between steps; %s",
                       rt->device->backend.kind != BACKEND_REF ? "this runtime is on a GPU"
                       : rt->pushed ? "a pushed batch waits for its step"
                                    : "the recipe names no train source");
    }
    uint64_t needed = r->dev.bytes_total + r->host.bytes_total;
    if (bytes < needed || scratch == NULL) {
        return qt_fail(QT_ERR_MEMORY, "qt_time_steps needs %" PRIu64 " bytes of scratch (both "
                       "arenas); %" PRIu64 " given", needed, bytes);
    }
    double times[MODEL_MODE_COUNT];
    run_time_steps(r, scratch, bytes, times);
    for (int mode = 0; mode < QT_MODE_COUNT; mode++) ms[mode] = times[mode];
    return QT_OK;
}

qt_status qt_profile(qt_runtime *rt, uint32_t reps, FILE *out) {
    QT_TRY(api_bound(rt, "qt_profile"));
    if (reps == 0) return qt_fail(QT_ERR_INPUT, "qt_profile: reps must be at least 1");
    if (rt->device->backend.kind != BACKEND_GPU || rt->run.options.eager) {
        return qt_fail(QT_ERR_STATE, "qt_profile times GPU kernels and graph replays; it needs "
                       "a GPU device and a run with graphs (not eager)");
    }
    return run_profile(&rt->run, reps, out);
}

// ---------------------------------------------------------------------------------------------
// Checkpoints and traces

static qt_status api_checkpoints(const qt_runtime *rt, const char *call) {
    if (rt->run.ckpt_planned) return QT_OK;
    return qt_fail(QT_ERR_STATE, "%s: the run was planned without checkpoints; plan with "
                   "options.checkpoints (or a save_path)", call);
}

qt_status qt_save(qt_runtime *rt, const char *path) {
    QT_TRY(api_bound(rt, "qt_save"));
    QT_TRY(api_checkpoints(rt, "qt_save"));
    return run_save(&rt->run, path);
}

qt_status qt_resume(qt_runtime *rt, const char *path) {
    QT_TRY(api_bound(rt, "qt_resume"));
    QT_TRY(api_checkpoints(rt, "qt_resume"));
    if (rt->stepped || rt->run.resumed || rt->pushed) {
        return qt_fail(QT_ERR_STATE, "qt_resume: the run has %s; resume right after qt_bind "
                       "(and push batches after it)", rt->pushed ? "a pushed batch waiting"
                       : rt->stepped ? "run steps already" : "been resumed already");
    }
    qt_status status = run_resume(&rt->run, path);
    // The feeds' cursors or the device state may have moved before the failure.
    if (status != QT_OK) rt->broken = "qt_resume";
    return status;
}

bool qt_resumed(const qt_runtime *rt, uint64_t *step, uint64_t *train_steps) {
    if (api_runtime(rt, "qt_resumed") != QT_OK || !rt->run.resumed) return false;
    if (step) *step = rt->run.resumed_at.step;
    if (train_steps) *train_steps = rt->run.resumed_at.train_steps;
    return true;
}

// qt_export's work area: the checkpoint's reader, then export_safetensors's memory (sized from
// the checkpoint's table).
typedef struct api_export {
    ckpt_reader reader;
    _Alignas(QT_MEMORY_ALIGN) uint8_t memory[];
} api_export;

qt_status qt_export_bytes(const char *checkpoint_path, uint64_t *bytes) {
    *bytes = 0;
    uint32_t regions = 0, params = 0;
    QT_TRY(ckpt_peek(checkpoint_path, &regions, &params));
    *bytes = sizeof(api_export) + export_memory_bytes(regions, params);
    return QT_OK;
}

qt_status qt_export(void *memory, uint64_t bytes, const char *checkpoint_path,
                    const char *out_path, bool quantized, bool force, qt_export_info *info) {
    if (info) memset(info, 0, sizeof *info);
    QT_TRY(api_memory("qt_export's work area", memory, (size_t)bytes, sizeof(api_export)));
    api_export *x = memory;
    QT_TRY(export_safetensors(&x->reader, checkpoint_path, out_path, quantized, force,
                              x->memory, bytes - sizeof(api_export)));
    if (info) {
        const ckpt_header *h = &x->reader.table.header;
        snprintf(info->recipe_name, sizeof info->recipe_name, "%s", h->recipe_name);
        info->step = h->step;
        info->train_steps = h->train_steps;
        info->params = h->param_count;
    }
    return QT_OK;
}

qt_status qt_trace_diff(const char *path_a, const char *path_b, FILE *out, bool *identical) {
    return trace_diff(path_a, path_b, out, identical);
}

qt_status qt_close(qt_runtime *rt) {
    if (rt == NULL) return QT_OK;
    QT_TRY(api_runtime(rt, "qt_close"));
    qt_status status = QT_OK;
    if (rt->phase >= API_PLANNED) {
        if (rt->device) (void)backend_attach_thread(&rt->device->backend);
        status = run_end_trace(&rt->run);
        run_close(&rt->run);
    }
    if (rt->device) rt->device->bound = NULL;
    rt->device = NULL;
    rt->magic = 0;
    return status;
}
