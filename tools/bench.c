#include "bench.h"

#include <stdlib.h>
#include <string.h>

#include "op_core.h"  // op_copy, op_fill_random

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_case_begin(bench_env *env) {
    arena_init(&env->dev, ARENA_KIND_DEVICE, "bench-device");
    arena_init(&env->host, ARENA_KIND_HOST, "bench-host");
    prog_init(&env->prog, "bench", 0);
}

prog_ref bench_reserve(bench_env *env, const char *name, uint64_t bytes) {
    arena_handle h;
    if (arena_reserve(&env->dev, name, bytes, 256, ARENA_CAT_WORKSPACE,
                      ARENA_LIFETIME_PERSISTENT, 0, &h) != QT_OK) {
        fprintf(stderr, "bench: %s\n", qt_error_message());
        exit(1);
    }
    return (prog_ref){&env->dev, h, 0};
}

static qt_status bench_events_time(bench_env *env, backend_graph *graph, double *median_ms) {
    CUevent start, stop;
    QT_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
    QT_CU(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    for (int i = 0; i < env->warmup; i++) QT_TRY(backend_launch(&env->gpu, graph));
    double *ms = calloc((size_t)env->repeats, sizeof *ms);
    for (int i = 0; i < env->repeats; i++) {
        QT_CU(cuEventRecord(start, env->gpu.stream));
        QT_TRY(backend_launch(&env->gpu, graph));
        QT_CU(cuEventRecord(stop, env->gpu.stream));
        QT_TRY(driver_sync_event(stop));
        float elapsed = 0;
        QT_CU(cuEventElapsedTime(&elapsed, start, stop));
        ms[i] = elapsed;
    }
    qsort(ms, (size_t)env->repeats, sizeof *ms, compare_doubles);
    *median_ms = ms[env->repeats / 2];
    free(ms);
    drv.cuEventDestroy(start);
    drv.cuEventDestroy(stop);
    return QT_OK;
}

double bench_time_program(bench_env *env) {
    backend_graph graph;
    double median = -1;
    if (backend_bind(&env->gpu, &env->dev, NULL, 0) != QT_OK ||
        backend_bind(&env->gpu, &env->host, NULL, 0) != QT_OK) {
        fprintf(stderr, "bench: bind: %s\n", qt_error_message());
        return -1;
    }
    prog_resolve(&env->prog);
    if (backend_capture(&env->gpu, &env->prog, &graph) != QT_OK ||
        bench_events_time(env, &graph, &median) != QT_OK) {
        fprintf(stderr, "bench: %s\n", qt_error_message());
        return -1;
    }
    backend_graph_destroy(&env->gpu, &graph);
    return median;
}

void bench_case_end(bench_env *env) {
    backend_release(&env->gpu, &env->dev);
    backend_release(&env->gpu, &env->host);
}

// A plain device copy through qtrain's own copy kernel: `bytes` read and `bytes` written, timed
// like every case (graph replays, median); returns GB/s counting both. The 1 GiB copy is the
// ceiling every memory-bound figure is quoted against; a copy of a cast's own size carries the
// same launch latency, ramp and tail, so the ratio to it isolates the kernel's own efficiency.
double bench_copy_gbps(bench_env *env, uint64_t bytes) {
    bytes = (bytes + 15) / 16 * 16;  // the vector path of qt_copy
    bench_case_begin(env);
    prog_ref src = bench_reserve(env, "src", bytes);
    prog_ref dst = bench_reserve(env, "dst", bytes);
    double ms = -1;
    if (op_fill_random(&env->prog, "fill", src, bytes / 4, QT_DTYPE_F32, QT_FILL_UNIFORM, 1, 0,
                       0, 1) == QT_OK &&
        backend_bind(&env->gpu, &env->dev, NULL, 0) == QT_OK &&
        backend_bind(&env->gpu, &env->host, NULL, 0) == QT_OK) {
        prog_resolve(&env->prog);
        backend_run(&env->gpu, &env->prog);  // fill once, outside the timing
        prog_init(&env->prog, "bench-copy", 0);
        op_copy(&env->prog, "copy", dst, src, bytes);
        prog_resolve(&env->prog);
        backend_graph graph;
        if (backend_capture(&env->gpu, &env->prog, &graph) == QT_OK) {
            if (bench_events_time(env, &graph, &ms) != QT_OK) ms = -1;
            backend_graph_destroy(&env->gpu, &graph);
        }
    }
    bench_case_end(env);
    if (ms <= 0) {
        fprintf(stderr, "bench copy: %s\n", qt_error_message());
        return -1;
    }
    return bench_gbps(2.0 * (double)bytes, ms);
}

void bench_print_header(bench_env *env) {
    fprintf(env->out, "%-28s %-16s %-10s %12s %13s %8s %22s\n", "format", "shape", "layout",
            "time", "bandwidth", "1GiB cp", "same-size copy");
}

void bench_print_row(bench_env *env, const char *format, const char *shape, const char *layout,
                     double ms, double bytes) {
    double gbps = bench_gbps(bytes, ms);
    // Half the cast's bytes each way: a copy that moves as many bytes in total.
    double same = bench_copy_gbps(env, (uint64_t)(bytes / 2));
    fprintf(env->out, "%-28s %-16s %-10s %9.4f ms %8.0f GB/s %7.1f%% %7.1f%% of %5.0f GB/s\n",
            format, shape, layout, ms, gbps, 100.0 * gbps / env->copy_gbps,
            same > 0 ? 100.0 * gbps / same : 0.0, same);
}

// Each family adds its benchmark here.
typedef struct bench_family {
    const char *name;
    void (*run)(bench_env *env);
} bench_family;

static const bench_family bench_families[] = {
    {"copy", NULL},
    {"gemm", bench_gemm},
    {"quant_nvfp4", bench_quant_nvfp4},
    {"quant_block", bench_quant_block},
    {"quant_fp8", bench_quant_fp8},
    {"quant_mxfp8", bench_quant_mxfp8},
};

// A positive integer from the environment, or `fallback`.
static int bench_env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    int n = v ? atoi(v) : 0;
    return n > 0 ? n : fallback;
}

int bench_main(int argc, char **argv) {
    static bench_env env;
    const char *what = argc > 2 ? argv[2] : "quant";
    if (backend_open_gpu(&env.gpu, 0) != QT_OK) {
        fprintf(stderr, "qtrain bench needs a GPU: %s\n", qt_error_message());
        return 1;
    }
    env.out = stdout;
    // Overrides for studies (a profiler wants one replay; warm-up and order effects want more
    // of each): QT_BENCH_REPEATS timed replays, QT_BENCH_WARMUP untimed ones before them, and
    // QT_BENCH_ROUNDS passes over the selected families.
    env.repeats = bench_env_int("QT_BENCH_REPEATS", 50);
    // 50 warm-up replays: with 3, the first case of each family measured several percent slow
    // (H200, 2026-11-22: 87% of copy in the first round, 94% in a second round of the same
    // process, and 94% in the first round after 50), a start-up effect that a training loop,
    // replaying the same graphs thousands of times, never sees.
    env.warmup = bench_env_int("QT_BENCH_WARMUP", 50);
    int rounds = bench_env_int("QT_BENCH_ROUNDS", 1);
    env.copy_gbps = bench_copy_gbps(&env, 1ull << 30);
    fprintf(env.out, "device %s, %d SMs; copy %.0f GB/s (1 GiB, read + write, median of %d after "
            "%d warm-up replays)\n", env.gpu.info.name, env.gpu.info.sm_count, env.copy_gbps,
            env.repeats, env.warmup);
    // `quant` runs every quantization family; a family's own name runs just that one.
    int ran = 0;
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < sizeof bench_families / sizeof bench_families[0]; i++) {
            const bench_family *f = &bench_families[i];
            bool selected = strcmp(what, f->name) == 0 ||
                            (strcmp(what, "quant") == 0 && strncmp(f->name, "quant_", 6) == 0);
            if (!selected) continue;
            ran++;
            if (f->run) f->run(&env);
        }
    }
    if (ran == 0) {
        fprintf(stderr, "qtrain bench: unknown benchmark '%s'; expected quant, copy", what);
        for (size_t i = 1; i < sizeof bench_families / sizeof bench_families[0]; i++) {
            fprintf(stderr, ", %s", bench_families[i].name);
        }
        fprintf(stderr, "\n");
        return 2;
    }
    backend_close(&env.gpu);
    return 0;
}
