#include "runtime/driver/driver.h"

#include <dlfcn.h>    // dlopen, dlsym
#include <pthread.h>  // pthread_once
#include <stdio.h>

// Written by the one driver_load_once of the process, read-only afterwards (driver.h).
driver_table drv;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static qt_status driver_status;
static char driver_message[QT_ERROR_MESSAGE_MAX];

typedef struct driver_entry {
    const char *name;  // API name as written in the docs, before cuda.h's version mapping
    void **slot;
} driver_entry;

// `#name` is the unexpanded API name (the # operator does not expand macros); `drv.name` expands
// to the versioned field, which is what cuGetProcAddress returns for that API name.
#define QT_DRIVER_ENTRY(name) {#name, (void **)&drv.name},
static const driver_entry driver_entries[] = {QT_DRIVER_ENTRY_POINTS(QT_DRIVER_ENTRY)};
#undef QT_DRIVER_ENTRY


static qt_status driver_resolve(void *library) {
    typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);
    typedef CUresult (*version_fn)(int *);
    get_proc_fn get_proc = (get_proc_fn)dlsym(library, "cuGetProcAddress_v2");
    version_fn get_version = (version_fn)dlsym(library, "cuDriverGetVersion");
    if (!get_proc || !get_version) {
        return qt_fail(QT_ERR_NO_DRIVER,
                       "libcuda.so.1 lacks cuGetProcAddress_v2: the CUDA driver is older than "
                       "12.0; install an NVIDIA driver for CUDA 12.8 or newer");
    }
    int version = 0;
    if (get_version(&version) != CUDA_SUCCESS || version < QT_DRIVER_VERSION_MIN) {
        return qt_fail(QT_ERR_NO_DRIVER,
                       "the CUDA driver supports CUDA %d.%d; qtrain needs 12.8 or newer "
                       "(install a newer NVIDIA driver)", version / 1000, version % 1000 / 10);
    }
    size_t count = sizeof driver_entries / sizeof driver_entries[0];
    for (size_t i = 0; i < count; i++) {
        CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult result = get_proc(driver_entries[i].name, driver_entries[i].slot,
                                   QT_DRIVER_VERSION_MIN, CU_GET_PROC_ADDRESS_DEFAULT, &found);
        if (result != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS ||
            !*driver_entries[i].slot) {
            return qt_fail(QT_ERR_NO_DRIVER,
                           "the CUDA driver has no entry point %s (query result %d); install an "
                           "NVIDIA driver for CUDA 12.8 or newer", driver_entries[i].name,
                           (int)found);
        }
    }
    return QT_OK;
}

static qt_status driver_load_now(void) {
    void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        return qt_fail(QT_ERR_NO_DRIVER, "no CUDA driver: cannot load libcuda.so.1 (%s)",
                       dlerror());
    }
    QT_TRY(driver_resolve(library));
    CUresult result = drv.cuInit(0);
    if (result == CUDA_ERROR_NO_DEVICE) {
        return qt_fail(QT_ERR_NO_DEVICE, "the CUDA driver loaded but reports no GPU");
    }
    if (result != CUDA_SUCCESS) return driver_fail(result, "cuInit(0)", __FILE__, __LINE__);
    int device_count = 0;
    QT_CU(cuDeviceGetCount(&device_count));
    if (device_count == 0) {
        return qt_fail(QT_ERR_NO_DEVICE, "the CUDA driver loaded but reports no GPU");
    }
    return QT_OK;
}

static void driver_load_once(void) {
    driver_status = driver_load_now();
    if (driver_status != QT_OK) {
        snprintf(driver_message, sizeof driver_message, "%s", qt_error_message());
    }
}

qt_status driver_load(void) {
    pthread_once(&driver_once, driver_load_once);
    if (driver_status != QT_OK) return qt_fail(driver_status, "%s", driver_message);
    return QT_OK;
}

bool driver_loaded(void) {
    pthread_once(&driver_once, driver_load_once);
    return driver_status == QT_OK;
}

qt_status driver_fail(CUresult result, const char *call, const char *file, int line) {
    const char *name = "?";
    const char *text = "?";
    // Error strings need the driver table; a failure before it is filled still gets the number.
    if (drv.cuGetErrorName) drv.cuGetErrorName(result, &name);
    if (drv.cuGetErrorString) drv.cuGetErrorString(result, &text);
    return qt_fail(QT_ERR_DRIVER, "%s:%d: %s failed: %s (%d): %s", file, line, call, name,
                   (int)result, text);
}

uint64_t driver_sync_total(const driver_syncs *s) {
    uint64_t total = 0;
    for (int i = 0; i < DRIVER_SYNC_KIND_COUNT; i++) total += s->counts[i];
    return total;
}

qt_status driver_sync_stream(driver_syncs *s, CUstream stream) {
    s->counts[DRIVER_SYNC_STREAM]++;
    QT_CU(cuStreamSynchronize(stream));
    return QT_OK;
}

qt_status driver_sync_event(driver_syncs *s, CUevent event) {
    s->counts[DRIVER_SYNC_EVENT]++;
    QT_CU(cuEventSynchronize(event));
    return QT_OK;
}

qt_status driver_sync_context(driver_syncs *s) {
    s->counts[DRIVER_SYNC_CONTEXT]++;
    QT_CU(cuCtxSynchronize());
    return QT_OK;
}

// The copies are ordered in the caller's stream and waited for, never issued on the legacy
// default stream: cuMemcpyHtoD from pageable memory returns once the data is staged, before its
// last DMA has landed, and kernels on a non-blocking stream are not ordered after it, so a kernel
// launched right after could read (or have its output overwritten by) the copy's tail.
qt_status driver_copy_to_device(driver_syncs *s, CUdeviceptr dst, const void *src, size_t bytes,
                                CUstream stream) {
    s->counts[DRIVER_SYNC_COPY_BLOCKING]++;
    QT_CU(cuMemcpyHtoDAsync(dst, src, bytes, stream));
    QT_CU(cuStreamSynchronize(stream));
    return QT_OK;
}

qt_status driver_copy_to_host(driver_syncs *s, void *dst, CUdeviceptr src, size_t bytes,
                              CUstream stream) {
    s->counts[DRIVER_SYNC_COPY_BLOCKING]++;
    QT_CU(cuMemcpyDtoHAsync(dst, src, bytes, stream));
    QT_CU(cuStreamSynchronize(stream));
    return QT_OK;
}
