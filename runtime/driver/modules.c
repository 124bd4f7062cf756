#include "runtime/driver/modules.h"

#include <stdio.h>
#include <stdlib.h>  // getenv
#include <string.h>  // strcmp

#define QT_KERNEL_INFO(id, module, symbol, args) [id] = {#symbol, MODULE_##module, sizeof(args)},
const kernel_info kernel_table[KERNEL_COUNT] = {QT_KERNELS(QT_KERNEL_INFO)};
#undef QT_KERNEL_INFO

#define QT_MODULE_NAME(module) [MODULE_##module] = #module,
const char *const module_names[MODULE_COUNT] = {QT_MODULES(QT_MODULE_NAME)};
#undef QT_MODULE_NAME

// Images produced by tools/embed from build/ptx/<module>.fatbin.
#define QT_MODULE_IMAGE_DECL(module) extern const unsigned char qt_module_##module[];
QT_MODULES(QT_MODULE_IMAGE_DECL)
#undef QT_MODULE_IMAGE_DECL

#define QT_MODULE_IMAGE(module) [MODULE_##module] = qt_module_##module,
static const unsigned char *const module_images[MODULE_COUNT] = {QT_MODULES(QT_MODULE_IMAGE)};
#undef QT_MODULE_IMAGE

static qt_status modules_read_attributes(modules *m, kernel_id k) {
    CUfunction f = m->function[k];
    kernel_attributes *a = &m->attributes[k];
    QT_CU(cuFuncGetAttribute(&a->registers, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
    QT_CU(cuFuncGetAttribute(&a->static_smem_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f));
    QT_CU(cuFuncGetAttribute(&a->local_bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f));
    QT_CU(cuFuncGetAttribute(&a->max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
    int dynamic_max = m->dynamic_smem_max_bytes - a->static_smem_bytes;
    QT_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_max));
    return QT_OK;
}

// The sm_90a GEMM tier's image holds sm_90a SASS only (wgmma and setmaxnreg exist on no other
// target, so it carries no PTX to JIT): it loads on compute capability 9.0 alone. On other GPUs
// its kernels stay unresolved, and runtime/backend/gemm_tier.c never picks them.
static bool modules_wanted(module_id module, int cc_major, int cc_minor) {
    return module != MODULE_gemm_sm90a || (cc_major == 9 && cc_minor == 0);
}

qt_status modules_load(modules *m, CUdevice device) {
    QT_ASSERT(driver_loaded());
    *m = (modules){0};
    QT_CU(cuDeviceGetAttribute(&m->dynamic_smem_max_bytes,
                               CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device));
    int cc_major = 0, cc_minor = 0;
    QT_CU(cuDeviceGetAttribute(&cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device));
    QT_CU(cuDeviceGetAttribute(&cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device));
    // The JIT image of other GPUs is compute_89 PTX, which has no griddepcontrol.wait: there the
    // kernels run in plain stream order.
    const char *serial = getenv("QTRAIN_SERIAL_LAUNCH");
    m->overlap_launches = cc_major == 9 && cc_minor == 0 && !(serial && strcmp(serial, "1") == 0);
    for (int i = 0; i < MODULE_COUNT; i++) {
        if (!modules_wanted((module_id)i, cc_major, cc_minor)) continue;
        CUresult result = drv.cuModuleLoadData(&m->module[i], module_images[i]);
        if (result != CUDA_SUCCESS) {
            driver_fail(result, "cuModuleLoadData", __FILE__, __LINE__);
            return qt_fail(QT_ERR_DRIVER,
                           "cannot load kernel module '%s' (needs sm_90a, or sm_89+ through "
                           "PTX JIT): %s", module_names[i], qt_error_message());
        }
    }
    for (int k = 0; k < KERNEL_COUNT; k++) {
        const kernel_info *info = &kernel_table[k];
        if (info->module == MODULE_host || !m->module[info->module]) continue;
        CUresult result = drv.cuModuleGetFunction(&m->function[k], m->module[info->module],
                                                  info->symbol);
        if (result != CUDA_SUCCESS) {
            return qt_fail(QT_ERR_MISMATCH, "kernel '%s' is missing from module '%s' (%d): the "
                           "library was built from mismatched sources; rebuild with ninja",
                           info->symbol, module_names[info->module], (int)result);
        }
        QT_TRY(modules_read_attributes(m, (kernel_id)k));
    }
    return QT_OK;
}

bool modules_loaded(const modules *m, kernel_id kernel) {
    QT_ASSERT((unsigned)kernel < KERNEL_COUNT);
    return kernel_table[kernel].module == MODULE_host || m->function[kernel] != NULL;
}

const char *modules_name(module_id module) {
    QT_ASSERT((unsigned)module <= MODULE_host);
    return module == MODULE_host ? "host" : module_names[module];
}

void modules_unload(modules *m) {
    for (int i = 0; i < MODULE_COUNT; i++) {
        if (m->module[i]) drv.cuModuleUnload(m->module[i]);
        m->module[i] = NULL;
    }
}

qt_status modules_launch(const modules *m, kernel_id kernel, const launch_shape *shape,
                         CUstream stream, const void *args, size_t args_bytes) {
    QT_ASSERT((unsigned)kernel < KERNEL_COUNT);
    QT_ASSERT(args_bytes == kernel_table[kernel].args_bytes);
    QT_ASSERT(kernel_table[kernel].module != MODULE_host && modules_loaded(m, kernel));
    // kernelParams, not a raw parameter buffer: the driver places the struct at the parameter's
    // own alignment. NOTE: a parameter aligned beyond 16 bytes (the sm_90a GEMM args, 64 for
    // their TMA tensor maps) does not start at offset 0 of the parameter space, so a buffer
    // passed with CU_LAUNCH_PARAM_BUFFER_POINTER would reach the kernel shifted.
    void *params[] = {(void *)args};
    CUresult result;
    if (m->overlap_launches) {
        CUlaunchAttribute overlap = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
        overlap.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig config = {
            .gridDimX = shape->grid[0], .gridDimY = shape->grid[1], .gridDimZ = shape->grid[2],
            .blockDimX = shape->block[0], .blockDimY = shape->block[1],
            .blockDimZ = shape->block[2], .sharedMemBytes = shape->smem_bytes,
            .hStream = stream, .attrs = &overlap, .numAttrs = 1};
        result = drv.cuLaunchKernelEx(&config, m->function[kernel], params, NULL);
    } else {
        result = drv.cuLaunchKernel(m->function[kernel], shape->grid[0], shape->grid[1],
                                    shape->grid[2], shape->block[0], shape->block[1],
                                    shape->block[2], shape->smem_bytes, stream, params, NULL);
    }
    if (result != CUDA_SUCCESS) {
        char call[160];
        snprintf(call, sizeof call, "cuLaunchKernel(%s, grid %ux%ux%u, block %ux%ux%u, smem %u)",
                 kernel_table[kernel].symbol, shape->grid[0], shape->grid[1], shape->grid[2],
                 shape->block[0], shape->block[1], shape->block[2], shape->smem_bytes);
        return driver_fail(result, call, __FILE__, __LINE__);
    }
    return QT_OK;
}
