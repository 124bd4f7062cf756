// modules: the kernel images embedded in the library, loaded into the current CUDA context.
//
// Owns one CUmodule per ptx/*.cu image and one CUfunction per kernel of ptx/kernels.h, from
// modules_load until modules_unload; the GPU backend holds the only instance. Launches go through
// modules_launch, which passes the kernel's single args struct (as its one kernelParams entry)
// after checking its size against the kernel table.
#ifndef QT_MODULES_H
#define QT_MODULES_H

#include "runtime/driver/driver.h"  // CUmodule, CUfunction, QT_CU
#include "ptx/kernels.h"            // kernel_id, module_id

typedef struct kernel_info {
    const char *symbol;
    module_id module;
    uint32_t args_bytes;
} kernel_info;

extern const kernel_info kernel_table[KERNEL_COUNT];
extern const char *const module_names[MODULE_COUNT];

typedef struct kernel_attributes {
    int registers;
    int static_smem_bytes;
    int local_bytes;  // per thread: non-zero means spills or stack arrays
    int max_threads;
} kernel_attributes;

typedef struct modules {
    CUmodule module[MODULE_COUNT];
    CUfunction function[KERNEL_COUNT];
    kernel_attributes attributes[KERNEL_COUNT];
    int dynamic_smem_max_bytes;  // opt-in limit applied to every kernel
    // Every launch carries programmatic stream serialization: a kernel is launched while the
    // kernel ahead of it runs, and waits for it itself (ptx/grid_order.h). On compute
    // capability 9.0 only, where the sm_90a SASS that holds that wait is what runs; the
    // environment variable QTRAIN_SERIAL_LAUNCH=1 turns it off (plain stream order, for
    // comparison). Results are the same bits either way.
    bool overlap_launches;
} modules;

// Loads every embedded image into the current context and resolves every kernel; fails naming
// the first missing symbol. Raises each kernel's dynamic shared memory limit to the device's
// opt-in maximum so launch shapes are the only thing that decides it. The sm_90a GEMM tier's
// image loads on compute capability 9.0 only; elsewhere its kernels stay unresolved. Decides
// overlap_launches once.
qt_status modules_load(modules *m, CUdevice device);
void modules_unload(modules *m);
// Whether the kernel was resolved (false only for kernels of an image the device cannot run);
// a host op (MODULE_host: no image holds it) always is.
bool modules_loaded(const modules *m, kernel_id kernel);
// A module's name; "host" for MODULE_host.
const char *modules_name(module_id module);

typedef struct launch_shape {
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t smem_bytes;
} launch_shape;

qt_status modules_launch(const modules *m, kernel_id kernel, const launch_shape *shape,
                         CUstream stream, const void *args, size_t args_bytes);

#endif  // QT_MODULES_H
