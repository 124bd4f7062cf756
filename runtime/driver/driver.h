// driver: the CUDA Driver API, loaded at run time.
//
// Owns the process-wide table of driver entry points, filled once by driver_load() (under
// pthread_once, so runtimes that open GPUs on several threads load it once) and read-only from
// then until exit: it describes the one libcuda.so.1 of the process, not any runtime. The
// binaries link no CUDA library: libcuda.so.1 is opened with dlopen and every entry point is
// resolved through cuGetProcAddress, so qtrain starts on machines without a driver and says so.
// Every module that talks to the GPU calls through `drv` with QT_CU; synchronizing calls go
// through the driver_sync_* / driver_copy_* wrappers, which count them in the caller's
// driver_syncs (each backend has its own), so that tests can prove a step loop does not
// synchronize.
#ifndef QT_DRIVER_H
#define QT_DRIVER_H

#include <cuda.h>  // types and prototypes only; nothing is linked

#include "runtime/base/status.h"  // qt_status, qt_fail

// Entry points the runtime uses. The names are the API names; cuda.h maps some of them to
// versioned symbols (cuMemAlloc -> cuMemAlloc_v2), and the table's fields follow that mapping.
#define QT_DRIVER_ENTRY_POINTS(X)                                                           \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                   \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute)           \
    X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)            \
    X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuMemGetInfo)                                  \
    X(cuMemAlloc) X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost)                           \
    X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemHostGetDevicePointer)                \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)               \
    X(cuMemcpyDtoDAsync) X(cuMemsetD8Async)                                                 \
    X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuCtxGetStreamPriorityRange)          \
    X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent)         \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventRecordWithFlags)           \
    X(cuEventSynchronize)                                                                   \
    X(cuEventQuery) X(cuEventElapsedTime)                                                   \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                            \
    X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)       \
    X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags)            \
    X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy)                               \
    X(cuTensorMapEncodeTiled)

#define QT_DRIVER_FIELD(name) __typeof__(name) *name;
typedef struct driver_table {
    QT_DRIVER_ENTRY_POINTS(QT_DRIVER_FIELD)
} driver_table;
#undef QT_DRIVER_FIELD

extern driver_table drv;

// The driver ABI version requested from cuGetProcAddress: 12.8 is the oldest driver whose
// entry points all match this header's prototypes (cuEventElapsedTime became _v2 in 12.8).
#define QT_DRIVER_VERSION_MIN 12080

// Loads libcuda.so.1, resolves every entry point and calls cuInit, once per process (every call
// after the first returns the first one's result, and its message on a failure). Returns
// QT_ERR_NO_DRIVER with the reason when the library or an entry point is missing, and
// QT_ERR_NO_DEVICE when the driver reports no GPU. Any thread.
qt_status driver_load(void);
// Whether the process's driver_load succeeded (the first call of either loads it).
bool driver_loaded(void);

// Formats a failed driver call into the status message and returns QT_ERR_DRIVER.
qt_status driver_fail(CUresult result, const char *call, const char *file, int line);

// Checks one driver call: QT_CU(cuMemAlloc(&ptr, bytes)) returns QT_ERR_DRIVER from the enclosing
// function with the call's text, the error's name and its description.
#define QT_CU(call)                                                                \
    do {                                                                           \
        CUresult qt_cu_result_ = drv.call;                                         \
        if (qt_cu_result_ != CUDA_SUCCESS)                                         \
            return driver_fail(qt_cu_result_, #call, __FILE__, __LINE__);          \
    } while (0)

// Calls that make the host wait for the device. Each is counted in the caller's driver_syncs, so
// a test can assert that a step loop made none beyond its lagged statistics reads.
typedef enum driver_sync_kind {
    DRIVER_SYNC_STREAM,
    DRIVER_SYNC_EVENT,
    DRIVER_SYNC_CONTEXT,
    DRIVER_SYNC_COPY_BLOCKING,
    DRIVER_SYNC_KIND_COUNT
} driver_sync_kind;

typedef struct driver_syncs {
    uint64_t counts[DRIVER_SYNC_KIND_COUNT];
} driver_syncs;

uint64_t driver_sync_total(const driver_syncs *s);

qt_status driver_sync_stream(driver_syncs *s, CUstream stream);
qt_status driver_sync_event(driver_syncs *s, CUevent event);
qt_status driver_sync_context(driver_syncs *s);
// Blocking copies through `stream` (after the stream's earlier work; complete on return).
qt_status driver_copy_to_device(driver_syncs *s, CUdeviceptr dst, const void *src, size_t bytes,
                                CUstream stream);
qt_status driver_copy_to_host(driver_syncs *s, void *dst, CUdeviceptr src, size_t bytes,
                              CUstream stream);

#endif  // QT_DRIVER_H
