// qtrain: the command-line tool. `qtrain info` reports the driver, the GPU and the loaded
// kernels, or says that the reference backend will be used; `qtrain diff A B` compares traces.
#include <stdio.h>
#include <string.h>

#include "backend.h"  // backend_open_gpu, kernel attributes
#include "bench.h"    // bench_main
#include "trace.h"    // trace_diff

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: qtrain COMMAND\n"
            "  info    driver, GPU and kernel report (registers, shared memory, local memory)\n"
            "  bench [quant|copy|quant_FAMILY]\n"
            "          benchmarks on the GPU: medians of graph replays, next to a device copy\n"
            "  diff A B\n"
            "          compare two trace files: the first differing step and field; exit 0 when\n"
            "          identical, 1 when they differ, 2 on error\n");
}

static int command_info(void) {
    static backend gpu;  // large (module tables): keep it off the stack
    qt_status status = backend_open_gpu(&gpu, 0);
    if (status == QT_ERR_NO_DRIVER || status == QT_ERR_NO_DEVICE) {
        printf("no CUDA driver / no GPU: the reference backend will be used\n  (%s)\n",
               qt_error_message());
        return 0;
    }
    if (status != QT_OK) {
        fprintf(stderr, "qtrain info: %s: %s\n", qt_status_name(status), qt_error_message());
        return 1;
    }
    const backend_device_info *info = &gpu.info;
    printf("driver      CUDA %d.%d\n", info->driver_version / 1000,
           info->driver_version % 1000 / 10);
    printf("device      %s\n", info->name);
    printf("compute     %d.%d, %d SMs\n", info->cc_major, info->cc_minor, info->sm_count);
    printf("memory      %.1f GiB total, %.1f GiB free\n",
           (double)info->memory_bytes / (1 << 30), (double)info->free_bytes / (1 << 30));
    printf("kernels     %d loaded from %d modules\n", KERNEL_COUNT, MODULE_COUNT);
    printf("  %-32s %-12s %5s %10s %8s\n", "kernel", "module", "regs", "smem", "local");
    for (int k = 0; k < KERNEL_COUNT; k++) {
        const kernel_attributes *a = &gpu.modules.attributes[k];
        printf("  %-32s %-12s %5d %10d %8d\n", kernel_table[k].symbol,
               module_names[kernel_table[k].module], a->registers, a->static_smem_bytes,
               a->local_bytes);
    }
    backend_close(&gpu);
    return 0;
}

// Exit codes follow diff(1): 0 identical, 1 different, 2 trouble.
static int command_diff(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: qtrain diff A.trace B.trace\n");
        return 2;
    }
    bool identical = false;
    qt_status status = trace_diff(argv[2], argv[3], stdout, &identical);
    if (status != QT_OK) {
        fprintf(stderr, "qtrain diff: %s: %s\n", qt_status_name(status), qt_error_message());
        return 2;
    }
    return identical ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "info") == 0) return command_info();
    if (strcmp(argv[1], "bench") == 0) return bench_main(argc, argv);
    if (strcmp(argv[1], "diff") == 0) return command_diff(argc, argv);
    fprintf(stderr, "qtrain: unknown command '%s'\n", argv[1]);
    print_usage(stderr);
    return 2;
}
