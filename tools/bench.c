#include "tools/bench.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/op_core.h"  // op_copy, op_fill_random

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *bench_table(uint64_t bytes) {
    void *storage = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!storage) fprintf(stderr, "bench: cannot allocate %llu bytes\n", (unsigned long long)bytes);
    return storage;
}

void *bench_program_init(program *p, const char *name) {
    void *storage = bench_table(prog_storage_bytes(BENCH_OPS));
    if (!storage) exit(1);
    prog_init(p, name, 0, storage, BENCH_OPS);
    return storage;
}

void *bench_arena_init(arena *a, arena_kind kind, const char *name) {
    void *storage = bench_table(arena_storage_bytes(BENCH_REGIONS));
    if (!storage) exit(1);
    arena_init(a, kind, name, storage, BENCH_REGIONS);
    return storage;
}

void bench_case_begin(bench_env *env) {
    if (!env->tables[0]) {
        env->tables[0] = bench_arena_init(&env->dev, ARENA_KIND_DEVICE, "bench-device");
        env->tables[1] = bench_arena_init(&env->host, ARENA_KIND_HOST, "bench-host");
        env->tables[2] = bench_program_init(&env->prog, "bench");
        return;
    }
    arena_init(&env->dev, ARENA_KIND_DEVICE, "bench-device", env->tables[0], BENCH_REGIONS);
    arena_init(&env->host, ARENA_KIND_HOST, "bench-host", env->tables[1], BENCH_REGIONS);
    prog_init(&env->prog, "bench", 0, env->tables[2], BENCH_OPS);
}

// Exits on failure: a region that does not fit is a bug in the benchmark, not a result.
static prog_ref bench_region(arena *a, const char *who, const char *name, uint64_t bytes) {
    arena_handle h;
    if (arena_reserve(a, name, bytes, 256, ARENA_CAT_WORKSPACE, ARENA_LIFETIME_PERSISTENT, 0,
                      &h) != QT_OK) {
        fprintf(stderr, "%s: %s\n", who, qt_error_message());
        exit(1);
    }
    return (prog_ref){a, h, 0};
}

prog_ref bench_reserve(bench_env *env, const char *name, uint64_t bytes) {
    return bench_region(&env->dev, "bench", name, bytes);
}

void bench_inputs_begin(bench_inputs *in, const char *label) {
    char name[ARENA_NAME_MAX];
    snprintf(name, sizeof name, "%s-bench-input", label);
    in->table = bench_arena_init(&in->arena, ARENA_KIND_DEVICE, name);
    snprintf(in->who, sizeof in->who, "bench %s", label);
    in->fill_count = 0;
    in->row_offsets = in->first_dims = (prog_ref){0};
    in->rows = in->members = 0;
    in->member_sizes = NULL;
}

prog_ref bench_inputs_region(bench_inputs *in, const char *name, uint64_t bytes) {
    return bench_region(&in->arena, in->who, name, bytes ? bytes : 4);
}

// Reserves the region and records its fill for bench_inputs_ready's program.
static prog_ref bench_inputs_fill(bench_inputs *in, const char *name, uint64_t bytes,
                                  bench_input_fill fill) {
    fill.name = name;
    fill.ref = bench_inputs_region(in, name, bytes);
    if (fill.count == 0) return fill.ref;
    if (in->fill_count == BENCH_INPUT_FILLS_MAX) {
        fprintf(stderr, "%s: more than BENCH_INPUT_FILLS_MAX fills\n", in->who);
        exit(1);
    }
    in->fills[in->fill_count++] = fill;
    return fill.ref;
}

prog_ref bench_inputs_bf16(bench_inputs *in, const char *name, uint64_t bytes, uint64_t seed) {
    bench_input_fill f = {.count = (bytes + 1) / 2, .dtype = QT_DTYPE_BF16,
                          .dist = QT_FILL_NORMAL, .seed = seed, .a = 0.0f, .b = 1.0f};
    return bench_inputs_fill(in, name, bytes, f);
}

prog_ref bench_inputs_f32(bench_inputs *in, const char *name, uint64_t bytes, uint64_t seed,
                          float lo, float hi) {
    bench_input_fill f = {.count = bytes / 4, .dtype = QT_DTYPE_F32, .dist = QT_FILL_UNIFORM,
                          .seed = seed, .a = lo, .b = hi};
    return bench_inputs_fill(in, name, bytes, f);
}

void bench_inputs_group(bench_inputs *in, uint32_t rows, uint32_t members,
                        bench_member_sizes sizes) {
    in->row_offsets = bench_inputs_region(in, "row_offsets", (members + 1) * 4ull);
    in->first_dims = bench_inputs_region(in, "first_dims", members * 4ull);
    in->rows = rows;
    in->members = members;
    in->member_sizes = sizes;
}

static qt_status bench_inputs_write_group(bench_env *env, const bench_inputs *in) {
    uint32_t members = in->members;
    uint32_t *offsets = malloc((members + 1) * sizeof *offsets);
    uint32_t *first_dims = malloc(members * sizeof *first_dims);
    in->member_sizes(in->rows, members, offsets, first_dims);
    qt_status st = backend_write(&env->gpu, in->row_offsets, offsets, (members + 1) * 4ull);
    if (st == QT_OK) st = backend_write(&env->gpu, in->first_dims, first_dims, members * 4ull);
    free(offsets);
    free(first_dims);
    return st;
}

bool bench_inputs_ready(bench_env *env, bench_inputs *in) {
    program fill;
    void *fill_table = bench_program_init(&fill, "bench-inputs");
    qt_status st = QT_OK;
    for (uint32_t i = 0; i < in->fill_count && st == QT_OK; i++) {
        const bench_input_fill *f = &in->fills[i];
        st = op_fill_random(&fill, f->name, f->ref, f->count, f->dtype, f->dist, f->seed, 0, f->a,
                            f->b);
    }
    if (st == QT_OK) st = backend_bind(&env->gpu, &in->arena, NULL, 0);
    if (st == QT_OK && in->members > 0) st = bench_inputs_write_group(env, in);
    if (st == QT_OK) {
        prog_resolve(&fill);
        st = backend_run(&env->gpu, &fill);
    }
    if (st == QT_OK) st = backend_finish(&env->gpu);
    free(fill_table);
    if (st != QT_OK) {
        fprintf(stderr, "%s: %s\n", in->who, qt_error_message());
        bench_inputs_release(env, in);
        return false;
    }
    return true;
}

void bench_inputs_release(bench_env *env, bench_inputs *in) {
    backend_release(&env->gpu, &in->arena);
    free(in->table);
    in->table = NULL;
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
        QT_TRY(driver_sync_event(&env->gpu.syncs, stop));
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

double bench_time_graph(bench_env *env, const program *p) {
    backend_graph graph;
    double median = -1;
    if (backend_capture(&env->gpu, p, &graph) != QT_OK) {
        fprintf(stderr, "bench: %s\n", qt_error_message());
        return -1;
    }
    if (bench_events_time(env, &graph, &median) != QT_OK) {
        fprintf(stderr, "bench: %s\n", qt_error_message());
        median = -1;
    }
    backend_graph_destroy(&env->gpu, &graph);
    return median;
}

// backend_capture's steps for work that is not a program.
static qt_status bench_capture(bench_env *env, bench_enqueue enqueue, void *ctx,
                               CUgraphExec *exec) {
    CUstream stream = env->gpu.stream;
    QT_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    qt_status status = enqueue(ctx, stream);
    CUgraph graph = NULL;
    CUresult end = drv.cuStreamEndCapture(stream, &graph);
    if (status != QT_OK) {
        if (graph) drv.cuGraphDestroy(graph);
        return status;
    }
    if (end != CUDA_SUCCESS) return driver_fail(end, "cuStreamEndCapture", __FILE__, __LINE__);
    CUresult inst = drv.cuGraphInstantiateWithFlags(exec, graph, 0);
    drv.cuGraphDestroy(graph);
    if (inst != CUDA_SUCCESS) {
        return driver_fail(inst, "cuGraphInstantiateWithFlags", __FILE__, __LINE__);
    }
    return QT_OK;
}

double bench_time_captured(bench_env *env, bench_enqueue enqueue, void *ctx) {
    backend_graph graph = {NULL, NULL};
    double median = -1;
    if (bench_capture(env, enqueue, ctx, &graph.exec) != QT_OK) {
        fprintf(stderr, "bench: %s\n", qt_error_message());
        return -1;
    }
    if (bench_events_time(env, &graph, &median) != QT_OK) {
        fprintf(stderr, "bench: %s\n", qt_error_message());
        median = -1;
    }
    backend_graph_destroy(&env->gpu, &graph);
    return median;
}

double bench_time_program(bench_env *env) {
    if (backend_bind(&env->gpu, &env->dev, NULL, 0) != QT_OK ||
        backend_bind(&env->gpu, &env->host, NULL, 0) != QT_OK) {
        fprintf(stderr, "bench: bind: %s\n", qt_error_message());
        return -1;
    }
    prog_resolve(&env->prog);
    return bench_time_graph(env, &env->prog);
}

void bench_case_end(bench_env *env) {
    backend_release(&env->gpu, &env->dev);
    backend_release(&env->gpu, &env->host);
}

double bench_case_finish(bench_env *env, bench_inputs *in, qt_status appended) {
    double ms = -1;
    if (appended == QT_OK) {
        ms = bench_time_program(env);
    } else {
        fprintf(stderr, "bench: %s\n", qt_error_message());
    }
    bench_case_end(env);
    bench_inputs_release(env, in);
    return ms;
}

// A plain device copy through qtrain's own copy kernel: `bytes` read and `bytes` written, timed
// like every case (graph replays, median); returns GB/s counting both. The 1 GiB copy is the
// ceiling every memory-bound figure is quoted against; a copy of a cast's own size carries the
// same launch latency, ramp and tail, so the ratio to it isolates the kernel's own efficiency.
double bench_copy_gbps(bench_env *env, uint64_t bytes) {
    static bench_inputs src;
    bytes = (bytes + 15) / 16 * 16;  // the vector path of qt_copy
    bench_inputs_begin(&src, "copy");
    prog_ref from = bench_inputs_f32(&src, "src", bytes, 1, 0.0f, 1.0f);
    if (!bench_inputs_ready(env, &src)) return -1;
    bench_case_begin(env);
    prog_ref to = bench_reserve(env, "dst", bytes);
    double ms = bench_case_finish(env, &src, op_copy(&env->prog, "copy", to, from, bytes));
    return ms > 0 ? bench_gbps(2.0 * (double)bytes, ms) : -1;
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

void bench_run_casts(bench_env *env, const bench_cast_case *cases, size_t count,
                     bench_cast_run run) {
    bench_print_header(env);
    for (size_t i = 0; i < count; i++) run(env, &cases[i]);
}

prog_ref bench_inputs_cast(bench_inputs *in, const char *label, const bench_cast_case *c,
                           bench_member_sizes sizes) {
    bench_inputs_begin(in, label);
    prog_ref x = bench_inputs_bf16(in, "x", (uint64_t)c->rows * c->cols * 2, 7);
    bench_inputs_group(in, c->rows, c->members, sizes);
    return x;
}

void bench_print_cast_row(bench_env *env, const bench_cast_case *c, const char *name,
                          const char *format, const char *suffix, double ms, double bytes) {
    if (ms <= 0) {
        fprintf(env->out, "%s %ux%u: failed\n", name, c->rows, c->cols);
        return;
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%u%s", c->rows, c->cols, suffix);
    char group[32] = "dense";
    if (c->members) snprintf(group, sizeof group, "grouped%u", c->members);
    bench_print_row(env, format, shape, group, ms, bytes);
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

// A count from the environment in [1, BENCH_ENV_MAX], or `fallback` when the variable is unset
// or empty; anything else (a sign, a suffix, zero, too large) is refused with a message, so a
// typo never silently measures something other than what was asked.
#define BENCH_ENV_MAX 1000000
static bool bench_env_int(const char *name, int fallback, int *out) {
    const char *v = getenv(name);
    *out = fallback;
    if (!v || !*v) return true;
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || !isdigit((unsigned char)v[0]) || n < 1 ||
        n > BENCH_ENV_MAX) {
        fprintf(stderr, "qtrain bench: %s='%s' is not a count from 1 to %d; set it to one, or "
                "unset it for %d\n", name, qt_shown(v), BENCH_ENV_MAX, fallback);
        return false;
    }
    *out = (int)n;
    return true;
}

int bench_main(int argc, char **argv) {
    static bench_env env;
    const char *what = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            env.quick = true;
        } else if (argv[i][0] != '-' && !what) {
            what = argv[i];
        } else {
            fprintf(stderr, "qtrain bench: unexpected argument '%s'\n", qt_shown(argv[i]));
            return 2;
        }
    }
    if (!what) what = "quant";
    // Overrides for studies (a profiler wants one replay; warm-up and order effects want more
    // of each): QT_BENCH_REPEATS timed replays, QT_BENCH_WARMUP untimed ones before them, and
    // QT_BENCH_ROUNDS passes over the selected families.
    int rounds = 1;
    if (!bench_env_int("QT_BENCH_REPEATS", 50, &env.repeats)) return 2;
    // 50 warm-up replays: with 3, the first case of each family measured several percent slow
    // (H200, 2026-11-22: 87% of copy in the first round, 94% in a second round of the same
    // process, and 94% in the first round after 50), a start-up effect that a training loop,
    // replaying the same graphs thousands of times, never sees.
    if (!bench_env_int("QT_BENCH_WARMUP", 50, &env.warmup)) return 2;
    if (!bench_env_int("QT_BENCH_ROUNDS", 1, &rounds)) return 2;
    if (backend_open_gpu(&env.gpu, 0) != QT_OK) {
        fprintf(stderr, "qtrain bench needs a GPU: %s\n", qt_error_message());
        return 1;
    }
    env.out = stdout;
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
        fprintf(stderr, "qtrain bench: unknown benchmark '%s'; expected quant, copy",
                qt_shown(what));
        for (size_t i = 1; i < sizeof bench_families / sizeof bench_families[0]; i++) {
            fprintf(stderr, ", %s", bench_families[i].name);
        }
        fprintf(stderr, "\n");
        return 2;
    }
    backend_close(&env.gpu);
    return 0;
}
