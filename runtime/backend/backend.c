#include "runtime/backend/backend.h"

#include <stdlib.h>  // getenv
#include <string.h>

#include "runtime/backend/gemm_tier.h"  // gemm_tier_takes, gemm_tier_launch
#include "runtime/parallel/parallel.h"  // dp_launch: the collective op
// pool_start: the reference backend's and the staging gather's threads
#include "runtime/base/pool.h"
#include "runtime/ref/ref.h"  // ref_<symbol> twins

// ---------------------------------------------------------------------------------------------
// Reference dispatch: one table built from the kernel list, so a kernel without a twin does not
// link.
typedef void (*ref_fn)(const void *args, const launch_shape *shape);

#define QT_REF_ENTRY(id, module, symbol, args) [id] = (ref_fn)ref_##symbol,
static const ref_fn ref_table[KERNEL_COUNT] = {QT_KERNELS(QT_REF_ENTRY)};
#undef QT_REF_ENTRY

void backend_ref_op(const prog_op *op) {
    QT_ASSERT((unsigned)op->kernel < KERNEL_COUNT);
    ref_table[op->kernel](op->args, &op->shape);
    gemm_args g;
    launch_shape shape;
    if (gemm_tier_units_after(op, &g, &shape)) ref_qt_gemm_norm_units(&g, &shape);
}

// ---------------------------------------------------------------------------------------------
// Opening and closing.

static qt_status backend_read_info(backend *b) {
    backend_device_info *info = &b->info;
    QT_CU(cuDriverGetVersion(&info->driver_version));
    QT_CU(cuDeviceGetName(info->name, (int)sizeof info->name, b->device));
    QT_CU(cuDeviceGetAttribute(&info->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                               b->device));
    QT_CU(cuDeviceGetAttribute(&info->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                               b->device));
    QT_CU(cuDeviceGetAttribute(&info->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                               b->device));
    size_t total = 0, free_bytes = 0;
    QT_CU(cuMemGetInfo(&free_bytes, &total));
    info->memory_bytes = total;
    info->free_bytes = free_bytes;
    return QT_OK;
}

qt_status backend_open_gpu(backend *b, int device_ordinal) {
    memset(b, 0, sizeof *b);
    b->kind = BACKEND_GPU;
    QT_TRY(driver_load());
    int count = 0;
    QT_CU(cuDeviceGetCount(&count));
    if (device_ordinal >= count) {
        // A data-parallel worker's ordinal is its rank: --gpus N needs N GPUs.
        return qt_fail(QT_ERR_NO_DEVICE, "GPU %d asked for, but the driver shows %d GPU%s (GPUs "
                       "count from 0; CUDA_VISIBLE_DEVICES may hide some): run on at most %d",
                       device_ordinal, count, count == 1 ? "" : "s", count);
    }
    QT_CU(cuDeviceGet(&b->device, device_ordinal));
    QT_CU(cuDevicePrimaryCtxRetain(&b->context, b->device));
    QT_CU(cuCtxSetCurrent(b->context));
    QT_TRY(backend_read_info(b));
    pool_start(0);  // the host's threads gather each batch into its staging slot (data_feed_next)
    if (b->info.cc_major * 10 + b->info.cc_minor < 89) {
        return qt_fail(QT_ERR_NO_DEVICE, "GPU '%s' has compute capability %d.%d; qtrain's kernels "
                       "need 8.9 or newer (Ada, Hopper, Blackwell)", b->info.name,
                       b->info.cc_major, b->info.cc_minor);
    }
    QT_CU(cuStreamCreate(&b->stream, CU_STREAM_NON_BLOCKING));
    QT_CU(cuStreamCreate(&b->copy_stream, CU_STREAM_NON_BLOCKING));
    b->capture_streams[0] = b->stream;
    for (int s = 1; s < CAPTURE_STREAMS - 1; s++) {
        QT_CU(cuStreamCreate(&b->capture_streams[s], CU_STREAM_NON_BLOCKING));
    }
    // The last stream carries a data-parallel step's collectives (capture_begin): at the
    // greatest priority, NCCL's CTAs take the next SM that frees up ahead of the waiting CTAs
    // of the kernels beside them, once a graph is instantiated to use its nodes' priorities
    // (backend_comm_priority). Launched into the graph's stream otherwise, its kernels run at
    // that stream's priority like every other node.
    int least_priority = 0, greatest_priority = 0;
    QT_CU(cuCtxGetStreamPriorityRange(&least_priority, &greatest_priority));
    QT_CU(cuStreamCreateWithPriority(&b->capture_streams[CAPTURE_STREAMS - 1],
                                     CU_STREAM_NON_BLOCKING, greatest_priority));
    for (int s = 0; s < CAPTURE_STREAMS; s++) {
        QT_CU(cuEventCreate(&b->capture_events[s], CU_EVENT_DISABLE_TIMING));
    }
    for (int k = 0; k < CAPTURE_MARKS; k++) {
        QT_CU(cuEventCreate(&b->capture_marks[k], CU_EVENT_DISABLE_TIMING));
    }
    QT_TRY(modules_load(&b->modules, b->device));
    b->comm_sms = BACKEND_COMM_SMS_DEFAULT;  // a data-parallel run reads QTRAIN_COMM_SMS
    return QT_OK;
}

qt_status backend_margin_beside(bool *on) {
    return qt_env_switch("QTRAIN_MARGIN_BESIDE", "1 (the SMs left to NCCL only by the GEMMs "
                         "that a collective may run beside) or 0 (by every GEMM between the "
                         "first and the last collective)", true, on);
}

qt_status backend_comm_wide(dp_wide *wide) {
    bool on = true;
    QT_TRY(qt_env_switch("QTRAIN_COMM_WIDE", "1 (a second NCCL communicator without the "
                         "CTA cap for the collectives after the last GEMM) or 0 (one "
                         "communicator)", true, &on));
    // Set to 1 it is asked for; unset, taken where NCCL has it.
    *wide = !on                                 ? DP_WIDE_OFF
            : getenv("QTRAIN_COMM_WIDE") != NULL ? DP_WIDE_REQUIRED
                                                 : DP_WIDE_IF_ABLE;
    return QT_OK;
}

qt_status backend_comm_priority(bool *on) {
    return qt_env_switch("QTRAIN_COMM_PRIORITY", "1 (the collectives' kernels at the "
                         "greatest stream priority) or 0 (at the step's)", true, on);
}

qt_status backend_comm_sms(uint32_t *sms) {
    return qt_env_u32("QTRAIN_COMM_SMS", "the SMs a data-parallel step leaves to NCCL beside its "
                      "GEMMs", BACKEND_COMM_SMS_DEFAULT, BACKEND_COMM_SMS_MAX, sms);
}

qt_status backend_attach_thread(backend *b) {
    if (b->kind != BACKEND_GPU) return QT_OK;
    QT_CU(cuCtxSetCurrent(b->context));
    return QT_OK;
}

qt_status backend_memory_free(backend *b, uint64_t *free_bytes, uint64_t *total_bytes) {
    QT_ASSERT(b->kind == BACKEND_GPU);
    size_t free_now = 0, total = 0;
    QT_CU(cuMemGetInfo(&free_now, &total));
    *free_bytes = free_now;
    *total_bytes = total;
    return QT_OK;
}

void backend_open_ref(backend *b) {
    memset(b, 0, sizeof *b);
    b->kind = BACKEND_REF;
    snprintf(b->info.name, sizeof b->info.name, "reference (CPU)");
    pool_start(0);  // the twins' threads, one per processor, before the first op runs
}

void backend_close(backend *b) {
    if (b->kind != BACKEND_GPU || !b->context) return;
    modules_unload(&b->modules);
    for (int s = 0; s < CAPTURE_STREAMS; s++) {
        if (b->capture_events[s]) drv.cuEventDestroy(b->capture_events[s]);
        if (s > 0 && b->capture_streams[s]) drv.cuStreamDestroy(b->capture_streams[s]);
        b->capture_events[s] = NULL;
        b->capture_streams[s] = NULL;
    }
    for (int k = 0; k < CAPTURE_MARKS; k++) {
        if (b->capture_marks[k]) drv.cuEventDestroy(b->capture_marks[k]);
        b->capture_marks[k] = NULL;
    }
    if (b->copy_stream) drv.cuStreamDestroy(b->copy_stream);
    if (b->stream) drv.cuStreamDestroy(b->stream);
    drv.cuDevicePrimaryCtxRelease(b->device);
    b->copy_stream = NULL;
    b->stream = NULL;
    b->context = NULL;
}

// ---------------------------------------------------------------------------------------------
// Arenas.

typedef struct bind_request {
    backend *backend;
    arena *arena;
    uint8_t *memory;  // the caller's, or NULL
    uint64_t memory_bytes;
} bind_request;

static qt_status backend_given(const bind_request *req, uint64_t bytes) {
    if (bytes <= req->memory_bytes && ((uintptr_t)req->memory % ARENA_DEVICE_ALIGN_MIN) == 0) {
        return QT_OK;
    }
    return qt_fail(QT_ERR_MEMORY, "the %s arena needs %llu bytes of 256-byte aligned memory; "
                   "%llu bytes at %p given", req->arena->name, (unsigned long long)bytes,
                   (unsigned long long)req->memory_bytes, (void *)req->memory);
}

// Memory the caller gave: the reference backend's arenas (plain memory), or on the GPU a device
// pointer of the context, or host memory that is pinned here for the copy engine and the
// device's direct reads.
static qt_status backend_alloc_given(bind_request *req, uint64_t bytes, uint64_t *base,
                                     uint8_t **host_base) {
    backend *b = req->backend;
    QT_TRY(backend_given(req, bytes));
    req->arena->external = true;
    *base = (uint64_t)(uintptr_t)req->memory;
    if (b->kind == BACKEND_GPU && req->arena->kind == ARENA_KIND_DEVICE) {
        if (bytes == 0) return QT_OK;
        QT_CU(cuMemsetD8Async(*base, 0, bytes, b->stream));
        return driver_sync_stream(&b->syncs, b->stream);
    }
    if (b->kind == BACKEND_GPU && bytes > 0) {
        QT_CU(cuMemHostRegister(req->memory, bytes, CU_MEMHOSTREGISTER_PORTABLE |
                                                       CU_MEMHOSTREGISTER_DEVICEMAP));
        // The kernels reach host regions at their host addresses, as with cuMemHostAlloc.
        CUdeviceptr mapped = 0;
        CUresult got = drv.cuMemHostGetDevicePointer(&mapped, req->memory, 0);
        if (got != CUDA_SUCCESS || mapped != (CUdeviceptr)(uintptr_t)req->memory) {
            drv.cuMemHostUnregister(req->memory);
            return qt_fail(QT_ERR_MEMORY, "this GPU maps the given host arena at another address "
                           "than the host's; let qtrain allocate the host arena (NULL)");
        }
    }
    memset(req->memory, 0, bytes);
    *host_base = req->memory;
    return QT_OK;
}

static qt_status backend_alloc(void *ctx, uint64_t bytes, uint64_t *base, uint8_t **host_base) {
    bind_request *req = ctx;
    backend *b = req->backend;
    *base = 0;
    *host_base = NULL;
    req->arena->external = false;
    if (req->memory) return backend_alloc_given(req, bytes, base, host_base);
    if (b->kind == BACKEND_REF) {
        return qt_fail(QT_ERR_MEMORY, "the reference backend needs %llu bytes of 256-byte "
                       "aligned memory for the %s arena; none given", (unsigned long long)bytes,
                       req->arena->name);
    }
    if (bytes == 0) return QT_OK;
    if (req->arena->kind == ARENA_KIND_DEVICE) {
        CUdeviceptr ptr = 0;
        QT_CU(cuMemAlloc(&ptr, bytes));
        *base = ptr;
        QT_CU(cuMemsetD8Async(ptr, 0, bytes, b->stream));
        return driver_sync_stream(&b->syncs, b->stream);
    }
    void *host = NULL;
    QT_CU(cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    memset(host, 0, bytes);
    *base = (uint64_t)(uintptr_t)host;
    *host_base = host;
    return QT_OK;
}

qt_status backend_bind(backend *b, arena *a, void *memory, uint64_t memory_bytes) {
    bind_request req = {b, a, memory, memory_bytes};
    return arena_bind(a, backend_alloc, &req);
}

void backend_release(backend *b, arena *a) {
    if (b->kind != BACKEND_GPU || a->phase != ARENA_PHASE_FROZEN || a->bytes_total == 0) return;
    if (a->external) {
        if (a->kind == ARENA_KIND_HOST) drv.cuMemHostUnregister(a->host_base);
    } else if (a->kind == ARENA_KIND_DEVICE) {
        drv.cuMemFree((CUdeviceptr)a->base_address);
    } else {
        drv.cuMemFreeHost(a->host_base);
    }
    a->base_address = 0;
    a->host_base = NULL;
}

// ---------------------------------------------------------------------------------------------
// Running. Collective ops (runtime/parallel/parallel.h) launch through the same path.

// The one place an op reaches the GPU: eager runs, captures and profiles all launch through it,
// so all of them take the same GEMM tier (and give the same bits). The program is never changed.
gemm_tier_device backend_gemm_device(const backend *b) {
    return (gemm_tier_device){b->kind == BACKEND_GPU, b->info.cc_major, b->info.cc_minor,
                              b->info.sm_count, b->gemm_tier, b->gemm_ctas_max, &b->modules};
}

// gemm_ctas: the sm_90a tier's persistent grid at most this many CTAs (0: the backend's own).
// collective_alone: a collective that no GEMM runs beside (capture_collective_alone).
static qt_status backend_launch_on(backend *b, const prog_op *op, CUstream stream,
                                   uint32_t gemm_ctas, bool collective_alone) {
    // The collective op is NCCL's, enqueued on the op's stream like a kernel (captured too).
    if (capture_collective(op)) {
        return dp_launch((const dp_collective_args *)op->args, stream, collective_alone);
    }
    gemm_tier_device tier = backend_gemm_device(b);
    if (gemm_ctas != 0 && (tier.ctas_max == 0 || gemm_ctas < tier.ctas_max)) {
        tier.ctas_max = gemm_ctas;
    }
    if (gemm_tier_takes(&tier, op)) return gemm_tier_launch(&tier, op, stream);
    QT_TRY(modules_launch(&b->modules, gemm_tier_portable_kernel(&tier, op), &op->shape, stream,
                          op->args, op->args_bytes));
    gemm_args g;
    launch_shape shape;
    if (!gemm_tier_units_after(op, &g, &shape)) return QT_OK;
    return modules_launch(&b->modules, KERNEL_GEMM_NORM_UNITS, &shape, stream, &g, sizeof g);
}

void backend_launched(const backend *b, const prog_op *op, kernel_id *kernel,
                      launch_shape *shape) {
    gemm_tier_device tier = backend_gemm_device(b);
    if (gemm_tier_takes(&tier, op)) {  // never a collective: those are no GEMMs
        gemm_tier_launched(&tier, op, kernel, shape);
        return;
    }
    *kernel = gemm_tier_portable_kernel(&tier, op);
    *shape = op->shape;
}

static qt_status backend_launch_op(backend *b, const prog_op *op) {
    return backend_launch_on(b, op, b->stream, 0, false);
}

qt_status backend_run(backend *b, const program *p) {
    QT_ASSERT(p->resolved);
    for (uint32_t i = 0; i < p->op_count; i++) {
        const prog_op *op = &p->ops[i];
        if (b->kind == BACKEND_REF) {
            backend_ref_op(op);
        } else {
            QT_TRY(backend_launch_op(b, op));
        }
    }
    return QT_OK;
}

// Milliseconds between two events around `reps` launches of one op (op != NULL) or of a graph.
static qt_status backend_time(backend *b, const prog_op *op, const backend_graph *g,
                              uint32_t reps, CUevent start, CUevent stop, float *ms) {
    QT_CU(cuEventRecord(start, b->stream));
    for (uint32_t r = 0; r < reps; r++) {
        if (op) {
            QT_TRY(backend_launch_op(b, op));
        } else {
            QT_TRY(backend_launch(b, g));
        }
    }
    QT_CU(cuEventRecord(stop, b->stream));
    QT_CU(cuEventSynchronize(stop));
    QT_CU(cuEventElapsedTime(ms, start, stop));
    return QT_OK;
}

static qt_status backend_profile_timed(backend *b, const program *p, const backend_graph *g,
                                       uint32_t reps, float *op_us, float *graph_us,
                                       CUevent start, CUevent stop) {
    float ms = 0.0f;
    QT_TRY(backend_time(b, NULL, g, reps, start, stop, &ms));  // warm-up
    for (uint32_t i = 0; i < p->op_count; i++) {
        QT_TRY(backend_time(b, &p->ops[i], NULL, reps, start, stop, &ms));
        op_us[i] = 1000.0f * ms / (float)reps;
    }
    QT_TRY(backend_time(b, NULL, g, reps, start, stop, &ms));
    *graph_us = 1000.0f * ms / (float)reps;
    return QT_OK;
}

qt_status backend_profile(backend *b, const program *p, const backend_graph *g, uint32_t reps,
                          float *op_us, float *graph_us) {
    QT_ASSERT(p->resolved && g->program == p && reps > 0);
    if (b->kind != BACKEND_GPU || !g->exec) {
        return qt_fail(QT_ERR_INPUT, "profiling times GPU kernels and graph replays; it needs "
                       "the GPU backend with graphs (drop --ref and --eager)");
    }
    CUevent start = NULL, stop = NULL;
    QT_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CUresult created = drv.cuEventCreate(&stop, CU_EVENT_DEFAULT);
    qt_status status = created == CUDA_SUCCESS
                           ? backend_profile_timed(b, p, g, reps, op_us, graph_us, start, stop)
                           : driver_fail(created, "cuEventCreate", __FILE__, __LINE__);
    drv.cuEventDestroy(start);
    if (stop) drv.cuEventDestroy(stop);
    return status;
}

// ---------------------------------------------------------------------------------------------
// Capture: the program's dependency graph, as runtime/backend/capture.h plans it.

// backend_timeline's events in a capture: before[k] and after[k] around op first + k, each an
// event node of the graph (CU_EVENT_RECORD_EXTERNAL: recorded when the replay reaches it, not a
// dependency of the capture); streams[k] gets that op's capture stream.
typedef struct backend_timed {
    uint32_t first, count;
    CUevent origin;
    CUevent *before, *after;
    uint32_t *streams;
} backend_timed;

static qt_status backend_timed_record(CUevent event, CUstream stream) {
    QT_CU(cuEventRecordWithFlags(event, stream, CU_EVENT_RECORD_EXTERNAL));
    return QT_OK;
}

// Captures p's ops into streams 0 ... CAPTURE_STREAMS - 1; *collectives tells whether the last
// stream carried collectives (whose kernel nodes then have its priority).
static qt_status backend_capture_ops(backend *b, const program *p, const backend_timed *timed,
                                     bool *collectives) {
    capture_plan c;
    bool margin_beside = false;
    QT_TRY(backend_margin_beside(&margin_beside));
    capture_begin(&c, p, margin_beside);
    *collectives = c.collective_stream != CAPTURE_NONE;
    QT_ASSERT(!*collectives || c.collective_stream == CAPTURE_STREAMS - 1);
    // QTRAIN_CAPTURE_STREAM_WAITS=1 (any other value: unset): every wait on the other stream's
    // last op, the marks unused; the plan's streams and wait list stay, so the run may wait
    // again where a mark would have covered less. The same traces, for A/B runs.
    const char *stream_waits = getenv("QTRAIN_CAPTURE_STREAM_WAITS");
    bool marks = !(stream_waits && strcmp(stream_waits, "1") == 0);
    CUstream *streams = b->capture_streams;
    CUevent *events = b->capture_events;
    // The GEMMs between the first collective and the last may run beside one: they leave
    // comm_sms SMs to NCCL (the bits do not depend on the grid). Which of them do is not known
    // here (a collective waits for its producer's mark on its own stream, whatever the program
    // order), and an estimate from bytes and FLOPs that capped only some measured slower than
    // no margin at all: a collective that meets an uncapped GEMM waits for its whole grid.
    // margin_beside (unless QTRAIN_MARGIN_BESIDE=0) uncaps the GEMMs that no collective can
    // meet: those that the next collective waits for and that wait for the one before
    // (capture_gemm_alone).
    uint32_t sms = (uint32_t)b->info.sm_count;
    uint32_t beside_ctas = b->comm_sms > 0 && b->comm_sms < sms ? sms - b->comm_sms : 0;
    // The side streams join the capture from stream 0's start.
    if (timed) QT_TRY(backend_timed_record(timed->origin, streams[0]));
    QT_CU(cuEventRecord(events[0], streams[0]));
    for (int s = 1; s < CAPTURE_STREAMS; s++) {
        QT_CU(cuStreamWaitEvent(streams[s], events[0], 0));
    }
    for (uint32_t j = 0; j < p->op_count; j++) {
        capture_step step;
        capture_next(&c, j, &step);
        CUstream stream = streams[step.stream];
        for (uint32_t w = 0; w < step.wait_count; w++) {
            const capture_wait *wait = &step.waits[w];
            // A mark was recorded right after the op waited for; a stream's event after its
            // last op, which is that op or later.
            CUevent after = marks && wait->mark != CAPTURE_NONE ? b->capture_marks[wait->mark]
                                                                : events[wait->stream];
            QT_CU(cuStreamWaitEvent(stream, after, 0));
        }
        bool beside = capture_leaves_margin(&c, j);
        bool timed_op = timed && j >= timed->first && j - timed->first < timed->count;
        if (timed_op) {
            timed->streams[j - timed->first] = (uint32_t)step.stream;
            QT_TRY(backend_timed_record(timed->before[j - timed->first], stream));
        }
        QT_TRY(backend_launch_on(b, &p->ops[j], stream, beside ? beside_ctas : 0,
                                 capture_collective_alone(&c, j)));
        if (timed_op) QT_TRY(backend_timed_record(timed->after[j - timed->first], stream));
        QT_CU(cuEventRecord(events[step.stream], stream));
        if (marks && step.mark != CAPTURE_NONE) {
            QT_CU(cuEventRecord(b->capture_marks[step.mark], stream));
        }
    }
    // Every side stream joins stream 0 again before the capture ends.
    for (int s = 1; s < CAPTURE_STREAMS; s++) {
        if (c.last[s] != CAPTURE_NONE) QT_CU(cuStreamWaitEvent(streams[0], events[s], 0));
    }
    return QT_OK;
}

static qt_status backend_capture_timed(backend *b, const program *p, backend_graph *g,
                                       const backend_timed *timed) {
    QT_ASSERT(p->resolved);
    g->program = p;
    g->exec = NULL;
    if (b->kind == BACKEND_REF) return QT_OK;
    bool comm_priority = false;
    QT_TRY(backend_comm_priority(&comm_priority));
    QT_CU(cuStreamBeginCapture(b->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    bool collectives = false;
    qt_status status = backend_capture_ops(b, p, timed, &collectives);
    CUgraph graph = NULL;
    CUresult end = drv.cuStreamEndCapture(b->stream, &graph);
    if (status != QT_OK) {
        if (graph) drv.cuGraphDestroy(graph);
        return status;
    }
    if (end != CUDA_SUCCESS) return driver_fail(end, "cuStreamEndCapture", __FILE__, __LINE__);
    // The kernel nodes keep the priorities of the streams they were captured from; only the
    // collectives' stream has another than the step's (backend_open_gpu).
    unsigned long long flags =
        comm_priority && collectives ? CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY : 0;
    CUresult inst = drv.cuGraphInstantiateWithFlags(&g->exec, graph, flags);
    drv.cuGraphDestroy(graph);
    if (inst != CUDA_SUCCESS) {
        return driver_fail(inst, "cuGraphInstantiateWithFlags", __FILE__, __LINE__);
    }
    return QT_OK;
}

qt_status backend_capture(backend *b, const program *p, backend_graph *g) {
    return backend_capture_timed(b, p, g, NULL);
}

// The median of n values (at most BACKEND_TIMELINE_REPS: an insertion sort; libc's qsort may
// allocate).
static float backend_median(float *values, uint32_t n) {
    for (uint32_t i = 1; i < n; i++) {
        float v = values[i];
        uint32_t j = i;
        for (; j > 0 && values[j - 1] > v; j--) values[j] = values[j - 1];
        values[j] = v;
    }
    return n % 2 ? values[n / 2] : 0.5f * (values[n / 2 - 1] + values[n / 2]);
}

// The timed graph replayed: samples[r][k][0 / 1] the microseconds from the origin to op
// first + k's events before and after it in replay r.
static qt_status backend_timed_replays(backend *b, const backend_graph *g,
                                       const backend_timed *t, uint32_t reps,
                                       float samples[][BACKEND_TIMELINE_OPS][2]) {
    QT_TRY(backend_launch(b, g));  // warm-up: the first replay of a graph uploads it
    for (uint32_t r = 0; r < reps; r++) {
        QT_TRY(backend_launch(b, g));
        QT_TRY(backend_finish(b));
        for (uint32_t k = 0; k < t->count; k++) {
            float ms[2];
            QT_CU(cuEventElapsedTime(&ms[0], t->origin, t->before[k]));
            QT_CU(cuEventElapsedTime(&ms[1], t->origin, t->after[k]));
            samples[r][k][0] = 1000.0f * ms[0];
            samples[r][k][1] = 1000.0f * ms[1];
        }
    }
    return QT_OK;
}

static qt_status backend_timeline_run(backend *b, const program *p, backend_timed *t,
                                      uint32_t reps, backend_op_span *spans) {
    backend_graph g;
    QT_TRY(backend_capture_timed(b, p, &g, t));
    float samples[BACKEND_TIMELINE_REPS][BACKEND_TIMELINE_OPS][2];
    qt_status status = backend_timed_replays(b, &g, t, reps, samples);
    backend_graph_destroy(b, &g);
    QT_TRY(status);
    for (uint32_t k = 0; k < t->count; k++) {
        float column[BACKEND_TIMELINE_REPS];
        for (int side = 0; side < 2; side++) {
            for (uint32_t r = 0; r < reps; r++) column[r] = samples[r][k][side];
            float us = backend_median(column, reps);
            if (side == 0) spans[k].start_us = us;
            if (side == 1) spans[k].end_us = us;
        }
        spans[k].stream = t->streams[k];
    }
    return QT_OK;
}

qt_status backend_timeline(backend *b, const program *p, uint32_t first, uint32_t count,
                           uint32_t reps, backend_op_span *spans) {
    QT_ASSERT(p->resolved && count > 0 && count <= BACKEND_TIMELINE_OPS &&
              first + count <= p->op_count && reps > 0 && reps <= BACKEND_TIMELINE_REPS);
    if (b->kind != BACKEND_GPU) {
        return qt_fail(QT_ERR_INPUT, "a graph's timeline needs the GPU backend (drop --ref)");
    }
    CUevent before[BACKEND_TIMELINE_OPS] = {0}, after[BACKEND_TIMELINE_OPS] = {0};
    uint32_t streams[BACKEND_TIMELINE_OPS];
    backend_timed t = {first, count, NULL, before, after, streams};
    CUresult made = drv.cuEventCreate(&t.origin, CU_EVENT_DEFAULT);
    for (uint32_t k = 0; k < count && made == CUDA_SUCCESS; k++) {
        made = drv.cuEventCreate(&before[k], CU_EVENT_DEFAULT);
        if (made == CUDA_SUCCESS) made = drv.cuEventCreate(&after[k], CU_EVENT_DEFAULT);
    }
    qt_status status = made == CUDA_SUCCESS ? backend_timeline_run(b, p, &t, reps, spans)
                                            : driver_fail(made, "cuEventCreate", __FILE__,
                                                          __LINE__);
    if (t.origin) drv.cuEventDestroy(t.origin);
    for (uint32_t k = 0; k < count; k++) {
        if (before[k]) drv.cuEventDestroy(before[k]);
        if (after[k]) drv.cuEventDestroy(after[k]);
    }
    return status;
}

qt_status backend_launch(backend *b, const backend_graph *g) {
    if (b->kind == BACKEND_REF) return backend_run(b, g->program);
    QT_CU(cuGraphLaunch(g->exec, b->stream));
    return QT_OK;
}

void backend_graph_destroy(backend *b, backend_graph *g) {
    if (b->kind == BACKEND_GPU && g->exec) drv.cuGraphExecDestroy(g->exec);
    g->exec = NULL;
}

qt_status backend_finish(backend *b) {
    if (b->kind == BACKEND_REF) return QT_OK;
    return driver_sync_stream(&b->syncs, b->stream);
}

static uint64_t backend_ref_address(prog_ref ref, uint64_t bytes) {
    const arena_region *region = arena_region_get(ref.arena, ref.region);
    QT_ASSERT(ref.offset + bytes <= region->bytes);
    return arena_address(ref.arena, ref.region) + ref.offset;
}

qt_status backend_copy_beside(backend *b, prog_ref dst, prog_ref src, uint64_t bytes,
                              CUevent after, CUevent done) {
    QT_ASSERT(src.arena->kind == ARENA_KIND_HOST && dst.arena->kind == ARENA_KIND_DEVICE);
    uint64_t to = backend_ref_address(dst, bytes), from = backend_ref_address(src, bytes);
    if (b->kind == BACKEND_REF) {
        memcpy((void *)(uintptr_t)to, (const void *)(uintptr_t)from, bytes);
        return QT_OK;
    }
    if (after) QT_CU(cuStreamWaitEvent(b->copy_stream, after, 0));
    // The host arena is pinned, so this is a DMA on the copy engine that returns at once.
    QT_CU(cuMemcpyHtoDAsync((CUdeviceptr)to, (const void *)(uintptr_t)from, bytes,
                            b->copy_stream));
    QT_CU(cuEventRecord(done, b->copy_stream));
    return QT_OK;
}

qt_status backend_wait(backend *b, CUevent event) {
    if (b->kind == BACKEND_REF) return QT_OK;
    QT_CU(cuStreamWaitEvent(b->stream, event, 0));
    return QT_OK;
}

qt_status backend_write(backend *b, prog_ref dst, const void *src, uint64_t bytes) {
    uint64_t address = backend_ref_address(dst, bytes);
    if (b->kind == BACKEND_REF || dst.arena->kind == ARENA_KIND_HOST) {
        QT_TRY(backend_finish(b));
        memcpy((void *)(uintptr_t)address, src, bytes);
        return QT_OK;
    }
    QT_TRY(backend_finish(b));
    return driver_copy_to_device(&b->syncs, address, src, bytes, b->stream);
}

qt_status backend_read(backend *b, void *dst, prog_ref src, uint64_t bytes) {
    uint64_t address = backend_ref_address(src, bytes);
    QT_TRY(backend_finish(b));
    if (b->kind == BACKEND_REF || src.arena->kind == ARENA_KIND_HOST) {
        memcpy(dst, (const void *)(uintptr_t)address, bytes);
        return QT_OK;
    }
    return driver_copy_to_host(&b->syncs, dst, address, bytes, b->stream);
}
