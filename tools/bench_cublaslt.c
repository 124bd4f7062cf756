#include "tools/bench_cublaslt.h"

#include <dlfcn.h>   // dlopen, dlsym
#include <stdlib.h>  // getenv
#include <string.h>

// Types and prototypes only: nothing is linked. The header declares one function without a
// prototype (cublasLtLoggerForceDisable()), which -Wstrict-prototypes would reject.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

// The few entry points the comparator needs, typed from the header's own prototypes.
#define BENCH_LT_ENTRY_POINTS(X)                                                            \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetVersion) X(cublasLtGetStatusName)     \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                                \
    X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate)                         \
    X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulPreferenceCreate)                        \
    X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)              \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)

#define BENCH_LT_FIELD(name) __typeof__(name) *name;
typedef struct bench_lt_library {
    BENCH_LT_ENTRY_POINTS(BENCH_LT_FIELD)
} bench_lt_library;
#undef BENCH_LT_FIELD

static struct {
    bool tried, ready;
    void *library;
    cublasLtHandle_t handle;
    bench_lt_library fn;
    char describe[320];
} lt;

static const char *bench_lt_status(cublasStatus_t s) {
    static char unknown[32];
    if (lt.fn.cublasLtGetStatusName) return lt.fn.cublasLtGetStatusName(s);
    snprintf(unknown, sizeof unknown, "cublasStatus %d", (int)s);
    return unknown;
}

// dlopen in the documented order; the first library that loads is the one used.
static void *bench_lt_dlopen(const char **name, char *error, size_t error_bytes) {
    const char *names[] = {getenv("QTRAIN_CUBLASLT"), "libcublasLt.so.13", "libcublasLt.so"};
    error[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!names[i] || !names[i][0]) continue;
        void *library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (library) {
            *name = names[i];
            return library;
        }
        snprintf(error, error_bytes, "%s", dlerror());
    }
    return NULL;
}

static bool bench_lt_resolve(void) {
    typedef struct entry {
        const char *name;
        void **slot;
    } entry;
#define BENCH_LT_ENTRY(name) {#name, (void **)&lt.fn.name},
    const entry entries[] = {BENCH_LT_ENTRY_POINTS(BENCH_LT_ENTRY)};
#undef BENCH_LT_ENTRY
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        *entries[i].slot = dlsym(lt.library, entries[i].name);
        if (!*entries[i].slot) {
            snprintf(lt.describe, sizeof lt.describe, "cuBLASLt n/a (the library has no %s)",
                     entries[i].name);
            return false;
        }
    }
    return true;
}

bool bench_lt_open(void) {
    if (lt.tried) return lt.ready;
    lt.tried = true;
    const char *name = NULL;
    char error[256];
    lt.library = bench_lt_dlopen(&name, error, sizeof error);
    if (!lt.library) {
        snprintf(lt.describe, sizeof lt.describe, "cuBLASLt n/a (cannot load it: %s)", error);
        return false;
    }
    if (!bench_lt_resolve()) return false;
    // cuBLASLt runs on the CUDA runtime, which adopts the context current on this thread: the
    // backend's (the device's primary context), so both libraries share streams and memory.
    cublasStatus_t s = lt.fn.cublasLtCreate(&lt.handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(lt.describe, sizeof lt.describe, "cuBLASLt n/a (cublasLtCreate: %s)",
                 bench_lt_status(s));
        return false;
    }
    size_t v = lt.fn.cublasLtGetVersion();
    snprintf(lt.describe, sizeof lt.describe, "cuBLASLt %zu.%zu.%zu (%s)", v / 10000,
             v / 100 % 100, v % 100, name);
    lt.ready = true;
    return true;
}

void bench_lt_close(void) {
    if (lt.ready) lt.fn.cublasLtDestroy(lt.handle);
    lt.ready = false;
    // The library stays loaded: the CUDA runtime inside it may still hold process-wide state.
}

const char *bench_lt_describe(void) { return lt.describe; }

const char *bench_lt_mode_name(bench_lt_mode mode, bool fast_accum) {
    switch (mode) {
    case BENCH_LT_BF16:
        return "bf16";
    case BENCH_LT_FP8:
        return fast_accum ? "fp8 fast-acc" : "fp8 no fast-acc";
    case BENCH_LT_FP8_BLOCK:
        return "fp8 1x128x128";
    default:
        return "?";
    }
}

// One GEMM's descriptors and algorithm, from bench_lt_plan to bench_lt_unplan.
typedef struct bench_lt_call {
    const bench_lt_gemm *g;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;  // cuBLASLt's A (qtrain's B), B (qtrain's A), C = D
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heuristic;
} bench_lt_call;

// Records the first failing cuBLASLt call of a plan in `why` and leaves the plan.
#define BENCH_LT_CHECK(entry, ...)                                                        \
    do {                                                                                  \
        cublasStatus_t bench_lt_s_ = lt.fn.entry(__VA_ARGS__);                            \
        if (bench_lt_s_ != CUBLAS_STATUS_SUCCESS) {                                       \
            snprintf(why, why_bytes, "%s: %s", #entry, bench_lt_status(bench_lt_s_));     \
            return false;                                                                 \
        }                                                                                 \
    } while (0)

#define BENCH_LT_SET(c, attr, value) \
    BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute, (c)->op, attr, &(value), sizeof(value))

static bool bench_lt_set_scales(bench_lt_call *c, char *why, size_t why_bytes) {
    const bench_lt_gemm *g = c->g;
    if (g->mode == BENCH_LT_BF16) return true;
    // cuBLASLt's A is qtrain's B: the scale pointers swap with the operands.
    const void *lt_a_scale = (const void *)(uintptr_t)g->b_scale;
    const void *lt_b_scale = (const void *)(uintptr_t)g->a_scale;
    BENCH_LT_SET(c, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, lt_a_scale);
    BENCH_LT_SET(c, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lt_b_scale);
    int8_t fast = g->mode == BENCH_LT_FP8 && g->fast_accum ? 1 : 0;
    BENCH_LT_SET(c, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    if (g->mode == BENCH_LT_FP8_BLOCK) {
        int32_t lt_a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;  // qtrain's B
        int32_t lt_b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;      // qtrain's A
        BENCH_LT_SET(c, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_a_mode);
        BENCH_LT_SET(c, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_b_mode);
    }
    return true;
}

static bool bench_lt_plan(bench_lt_call *c, char *why, size_t why_bytes) {
    const bench_lt_gemm *g = c->g;
    cudaDataType_t in = g->mode == BENCH_LT_BF16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
    BENCH_LT_CHECK(cublasLtMatmulDescCreate, &c->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    BENCH_LT_SET(c, CUBLASLT_MATMUL_DESC_TRANSA, transa);
    BENCH_LT_SET(c, CUBLASLT_MATMUL_DESC_TRANSB, transb);
    if (!bench_lt_set_scales(c, why, why_bytes)) return false;
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate, &c->a, in, g->k, g->n, g->k);
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate, &c->b, in, g->k, g->m, g->k);
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate, &c->d, CUDA_R_16BF, g->n, g->m, g->n);
    BENCH_LT_CHECK(cublasLtMatmulPreferenceCreate, &c->pref);
    uint64_t workspace_bytes = BENCH_LT_WORKSPACE_BYTES;
    BENCH_LT_CHECK(cublasLtMatmulPreferenceSetAttribute, c->pref,
                   CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                   sizeof workspace_bytes);
    int found = 0;
    BENCH_LT_CHECK(cublasLtMatmulAlgoGetHeuristic, lt.handle, c->op, c->a, c->b, c->d, c->d,
                   c->pref, 1, &c->heuristic, &found);
    if (found < 1) {
        snprintf(why, why_bytes, "the heuristic returned no algorithm");
        return false;
    }
    return true;
}

static void bench_lt_unplan(bench_lt_call *c) {
    if (c->pref) lt.fn.cublasLtMatmulPreferenceDestroy(c->pref);
    if (c->d) lt.fn.cublasLtMatrixLayoutDestroy(c->d);
    if (c->b) lt.fn.cublasLtMatrixLayoutDestroy(c->b);
    if (c->a) lt.fn.cublasLtMatrixLayoutDestroy(c->a);
    if (c->op) lt.fn.cublasLtMatmulDescDestroy(c->op);
}

// bench_enqueue: the GEMM on `stream`; C is D with beta 0 (cuBLASLt reads no C then).
static qt_status bench_lt_enqueue(void *ctx, CUstream stream) {
    const bench_lt_call *c = ctx;
    const bench_lt_gemm *g = c->g;
    const float alpha = 1.0f, beta = 0.0f;
    void *d = (void *)(uintptr_t)g->d;
    cublasStatus_t s = lt.fn.cublasLtMatmul(
        lt.handle, c->op, &alpha, (const void *)(uintptr_t)g->b, c->a,
        (const void *)(uintptr_t)g->a, c->b, &beta, d, c->d, d, c->d, &c->heuristic.algo,
        (void *)(uintptr_t)g->workspace, BENCH_LT_WORKSPACE_BYTES, (cudaStream_t)stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        return qt_fail(QT_ERR_DRIVER, "cublasLtMatmul: %s", bench_lt_status(s));
    }
    return QT_OK;
}

double bench_lt_time(bench_env *env, const bench_lt_gemm *g, char *why, size_t why_bytes) {
    if (!bench_lt_open()) {
        snprintf(why, why_bytes, "%s", lt.describe);
        return -1;
    }
    bench_lt_call c = {.g = g};
    double ms = -1;
    if (bench_lt_plan(&c, why, why_bytes)) {
        // One eager call first: it loads the kernel outside the capture and proves the
        // configuration runs, so a capture failure cannot hide an unsupported mode.
        qt_status st = bench_lt_enqueue(&c, env->gpu.stream);
        if (st == QT_OK) st = backend_finish(&env->gpu);
        if (st == QT_OK) ms = bench_time_captured(env, bench_lt_enqueue, &c);
        if (st != QT_OK || ms < 0) snprintf(why, why_bytes, "%s", qt_error_message());
    }
    bench_lt_unplan(&c);
    return ms;
}
