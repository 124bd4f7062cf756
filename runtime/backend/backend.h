// backend: where a program runs. GPU: one context, one stream (plus a copy stream for the
// schedule loop's batches), the loaded kernel modules, eager launches or one captured CUDA graph
// per program. Reference (ref): the same programs run by the plain C twin of every kernel
// (runtime/ref/ref_*.c), on the CPU.
//
// Owns the GPU context (primary context, retained), the streams and the modules from
// backend_open_* to backend_close, and the arena allocations from backend_bind to
// backend_release. The reference backend owns nothing: its arenas live in caller memory, since
// the library never allocates host memory itself.
//
// Contract: eager and graph execution of one program give bitwise identical results, and the
// reference backend gives the GPU's bits for every op but the GEMMs, whose FP32 accumulation
// order differs (recipes/NUMERICS.md "The two backends and what is bitwise").
#ifndef QT_BACKEND_H
#define QT_BACKEND_H

#include "runtime/driver/driver.h"    // CUstream, CUgraphExec
#include "runtime/driver/modules.h"   // modules
#include "runtime/program/program.h"  // program, prog_ref
#include "runtime/backend/capture.h"    // CAPTURE_STREAMS, CAPTURE_MARKS
#include "runtime/backend/gemm_tier.h"  // backend_gemm_tier, gemm_tier_device
#include "runtime/parallel/parallel.h"  // dp_wide

typedef enum backend_kind { BACKEND_REF, BACKEND_GPU } backend_kind;

typedef struct backend_device_info {
    char name[128];
    int driver_version;  // e.g. 13000
    int cc_major, cc_minor;
    int sm_count;
    uint64_t memory_bytes;
    uint64_t free_bytes;
} backend_device_info;

typedef struct backend {
    backend_kind kind;
    CUdevice device;
    CUcontext context;
    CUstream stream;
    // Side streams and one event per stream (stream 0 is `stream`): a capture forks and joins
    // through them so that independent ops become parallel branches of the graph.
    CUstream capture_streams[CAPTURE_STREAMS];
    CUevent capture_events[CAPTURE_STREAMS];
    CUevent capture_marks[CAPTURE_MARKS];  // events after the ops that other streams wait for
    // The next step's batch crosses PCIe on this stream, on the copy engine, beside the step
    // that runs on `stream` (backend_copy_beside).
    CUstream copy_stream;
    modules modules;
    backend_device_info info;
    backend_gemm_tier gemm_tier;  // AUTO after backend_open_*; set it before running or capturing
    // The sm_90a tier's persistent grid: at most this many CTAs (0: one per SM). Tests lower it
    // so that every CTA walks several tiles; results never depend on it.
    uint32_t gemm_ctas_max;
    // SMs that a captured step's GEMMs leave free while its collectives may run beside them
    // (backend_capture): a persistent GEMM holds every SM it is given to its end, so without
    // this margin NCCL's kernels wait for it and the communication does not overlap.
    uint32_t comm_sms;
    driver_syncs syncs;  // the synchronizing calls made through this backend (driver.h)
} backend;

// The SMs a data-parallel step leaves to NCCL beside its GEMMs (backend.comm_sms, the default
// from backend_open_gpu; a rank reads this before it opens its communicator): $QTRAIN_COMM_SMS
// when set (0 to BACKEND_COMM_SMS_MAX; 0 gives the GEMMs every SM), else the default. NCCL's
// CTAs are capped at the same count (NCCL_MAX_CTAS, unless set). QT_ERR_INPUT for a value that
// is no such number.
#define BACKEND_COMM_SMS_DEFAULT 16
#define BACKEND_COMM_SMS_MAX 64
qt_status backend_comm_sms(uint32_t *sms);
// Whether a captured step leaves the SM margin only beside the collectives
// (runtime/backend/capture.h, capture_begin's margin_beside): the GEMMs of the collective window
// that no collective can run beside take every SM, after the collectives before them. Read from
// $QTRAIN_MARGIN_BESIDE, 1 (unset) or 0 (every GEMM of the window leaves the margin), a setting
// for A/B runs with the same traces. QT_ERR_INPUT for another value.
qt_status backend_margin_beside(bool *on);
// Whether a data-parallel rank opens a second NCCL communicator without the CTA cap for the
// collectives that run after the step's last wide GEMM (capture_collective_alone: the last
// reductions, the norm's gather, the weights' broadcasts), read from $QTRAIN_COMM_WIDE: unset,
// DP_WIDE_IF_ABLE; 1, DP_WIDE_REQUIRED (an NCCL older than 2.18 fails the run instead of leaving
// one communicator); 0, DP_WIDE_OFF. A setting for A/B runs with the same traces on two ranks
// (NCCL's channels split a sum of more ranks another way). QT_ERR_INPUT for another value.
qt_status backend_comm_wide(dp_wide *wide);
// Whether a captured step with collectives runs their kernels at the greatest stream priority,
// so that NCCL's CTAs are placed ahead of the waiting CTAs of the kernels beside them: read from
// $QTRAIN_COMM_PRIORITY, 1 (unset) or 0, a setting for A/B runs with the same traces.
// QT_ERR_INPUT for another value.
qt_status backend_comm_priority(bool *on);

typedef struct backend_graph {
    const program *program;
    CUgraphExec exec;  // GPU only; the reference backend replays the op table
} backend_graph;

// Loads the driver, retains the device's primary context, creates the stream and loads every
// kernel module. QT_ERR_NO_DRIVER / QT_ERR_NO_DEVICE when there is no GPU to use.
qt_status backend_open_gpu(backend *b, int device_ordinal);
void backend_open_ref(backend *b);
// Makes the backend's context current on the calling thread (a backend opened on another thread
// is used from this one); nothing for the reference backend.
qt_status backend_attach_thread(backend *b);
void backend_close(backend *b);

// GPU: the device memory free now and in all (cuMemGetInfo, on the calling thread's context):
// what a run's device arena is compared with before it is allocated.
qt_status backend_memory_free(backend *b, uint64_t *free_bytes, uint64_t *total_bytes);

// Binds an arena to memory once and zeroes it, so every run starts from the same bytes. The
// memory: `memory` when given (at least memory_bytes >= the arena's bytes_total, 256-byte
// aligned: on the GPU a device arena takes it as a device pointer of the backend's context and a
// host arena pins it with cuMemHostRegister; the reference backend needs it), else on the GPU
// cuMemAlloc for device arenas and cuMemHostAlloc for pinned host arenas.
qt_status backend_bind(backend *b, arena *a, void *memory, uint64_t memory_bytes);
// Frees what backend_bind allocated, unpins what it pinned (given memory stays the caller's).
void backend_release(backend *b, arena *a);

// Eager: launches every op in order on the stream (returns without waiting).
qt_status backend_run(backend *b, const program *p);
// What the GEMM tier (runtime/backend/gemm_tier.h) needs of this backend's GPU and settings.
gemm_tier_device backend_gemm_device(const backend *b);
// The kernel and launch shape that running the op launches: the op's own, or the sm_90a GEMM
// tier's persistent kernel where the tier takes it (a profile names what ran).
void backend_launched(const backend *b, const prog_op *op, kernel_id *kernel,
                      launch_shape *shape);
// Captures the whole program into one CUDA graph; later launches replay it. The graph orders
// only what the ops' declared regions require: op j waits for every earlier op i whose regions
// overlap j's in memory with a write on either side (prog_use's contract is that every byte an
// op reads or writes is declared), and ops with no such chain between them run concurrently.
// Eager runs keep program order on one stream; both give the same bits.
qt_status backend_capture(backend *b, const program *p, backend_graph *g);
qt_status backend_launch(backend *b, const backend_graph *g);
void backend_graph_destroy(backend *b, backend_graph *g);
// Diagnostics after a run (GPU with graphs only): each op of p launched `reps` times back to
// back between two events (op_us[i]: microseconds per launch, the launch gaps of identical
// kernels included), then g, p's graph, replayed `reps` times (graph_us: per replay). The ops
// run on whatever state the arenas hold, so this is for a finished run only: it changes weights,
// optimizer state and statistics.
qt_status backend_profile(backend *b, const program *p, const backend_graph *g, uint32_t reps,
                          float *op_us, float *graph_us);
// Where ops run inside a graph replay, overlap included (what backend_profile's ops launched
// alone cannot show): p captured again with an event before and after each op of
// [first, first + count) (count <= BACKEND_TIMELINE_OPS; the event before follows the op's
// waits, so it marks when the op could start), that graph replayed `reps` times (at most
// BACKEND_TIMELINE_REPS), and per op the median over the replays of the microseconds from the
// replay's start to the op's start and end, and the capture stream it ran on. The extra graph
// nodes add a little to the replay. Like backend_profile, for a finished run only. The window
// holds the whole program of the bench recipes (137 ops on two ranks), since times from two
// windows come from two captures and their own replays: only ops of one window are comparable.
#define BACKEND_TIMELINE_OPS 256
#define BACKEND_TIMELINE_REPS 15
typedef struct backend_op_span {
    float start_us, end_us;
    uint32_t stream;
} backend_op_span;
qt_status backend_timeline(backend *b, const program *p, uint32_t first, uint32_t count,
                           uint32_t reps, backend_op_span *spans);
// Waits for the stream (a counted synchronization).
qt_status backend_finish(backend *b);

// The schedule loop's batch copy (runtime/schedule/schedule.h): `bytes` from a pinned host arena
// region to a device arena region, queued on the copy stream after `after` (an event recorded on
// the compute stream; NULL: nothing to wait for), then `done` recorded behind it for the compute
// stream to wait on (backend_wait). Neither call makes the host wait. The reference backend
// copies at once and ignores the events, so both backends see the same bytes at the same point
// of the loop.
qt_status backend_copy_beside(backend *b, prog_ref dst, prog_ref src, uint64_t bytes,
                              CUevent after, CUevent done);
// The compute stream's next launch waits for `event` (GPU; nothing on the reference backend).
qt_status backend_wait(backend *b, CUevent event);

// Set-up and test copies between caller memory and an arena; they wait for the stream first, go
// through it, and are complete when they return (so the next launch sees every byte).
qt_status backend_write(backend *b, prog_ref dst, const void *src, uint64_t bytes);
qt_status backend_read(backend *b, void *dst, prog_ref src, uint64_t bytes);

// Runs one op with its C twin (the reference backend's dispatch, also used by tests).
void backend_ref_op(const prog_op *op);

#endif  // QT_BACKEND_H
