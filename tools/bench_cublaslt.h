// bench_cublaslt: cuBLASLt as the comparator of `qtrain bench gemm`, loaded at run time.
//
// Owns the library (dlopen) and one cuBLASLt handle from the first bench_lt_open to
// bench_lt_close. Only the benchmark calls it: libqtrain.a never depends on cuBLASLt, and the
// qtrain binary links no CUDA library, so without cuBLASLt every other benchmark still runs and
// the comparator's columns say "n/a" with the reason.
//
// The library is the one named by the environment variable QTRAIN_CUBLASLT when set, else
// libcublasLt.so.13, else libcublasLt.so. The toolkit's cublasLt.h is used for types only.
//
// A GEMM is given in qtrain's fprop layout (row-major; both operands K-major):
//
//   D [m][n] bf16 = A [m][k] . B [n][k]^T
//
// which column-major cuBLASLt computes as D^T (n x m, ld n) = op_T(B: k x n, ld k) . (A: k x m,
// ld k), "TN": cuBLASLt's A is qtrain's B and the other way round. TN is also the only layout
// FP8 tensor cores take on Hopper.
#ifndef QT_BENCH_CUBLASLT_H
#define QT_BENCH_CUBLASLT_H

#include "tools/bench.h"  // bench_env

typedef enum bench_lt_mode {
    BENCH_LT_BF16,       // bf16 operands
    BENCH_LT_FP8,        // e4m3 operands, f32 scale_inv [1] of each (qtrain's per-tensor FP8)
    BENCH_LT_FP8_BLOCK,  // e4m3 operands, A 1x128 and B 128x128 f32 block scales
    BENCH_LT_MODE_COUNT
} bench_lt_mode;

// Device memory a GEMM may use as cuBLASLt workspace (the heuristic is told so).
#define BENCH_LT_WORKSPACE_BYTES (32ull << 20)

// FP8 block scales in cuBLASLt's layouts; the values are dequantization factors, as qtrain's:
//
//   A, 1x128 (VEC128_32F):      [ceil(k/128)][roundup(m, 4)]   entry (row r, block kb) at
//                                                              kb * roundup(m, 4) + r
//   B, 128x128 (BLK128x128_32F): [ceil(n/128)][roundup(ceil(k/128), 4)]
//
// qtrain's compact layouts (ptx/gemm.h) are the same without the rounding up, so they coincide
// whenever m and ceil(k/128) are multiples of 4.
static inline uint32_t bench_lt_scale_ld(uint32_t entries) { return (entries + 3u) / 4u * 4u; }

typedef struct bench_lt_gemm {
    bench_lt_mode mode;
    bool fast_accum;            // FP8: CUBLASLT_MATMUL_DESC_FAST_ACCUM (block scaling: off)
    uint32_t m, n, k;
    uint64_t a, b, d;           // device addresses of qtrain's A [m][k], B [n][k], D [m][n]
    uint64_t a_scale, b_scale;  // FP8: scale_inv; FP8 block: the layouts above; else 0
    uint64_t workspace;         // BENCH_LT_WORKSPACE_BYTES of device memory
} bench_lt_gemm;

// Loads the library and creates the handle (once; later calls return the first answer). False
// when cuBLASLt cannot be used; bench_lt_describe then says why.
bool bench_lt_open(void);
void bench_lt_close(void);
// "cuBLASLt 13.1.0 (libcublasLt.so.13)", or "cuBLASLt n/a (<reason>)".
const char *bench_lt_describe(void);
const char *bench_lt_mode_name(bench_lt_mode mode, bool fast_accum);

// Times the GEMM like qtrain's (bench_time_captured: one call captured into a graph on the bench
// stream, medians of replays) with the heuristic's first algorithm. Returns the median
// milliseconds, or a negative value with the reason in `why` (the library is missing, the mode
// is unsupported on this GPU, no algorithm, ...).
double bench_lt_time(bench_env *env, const bench_lt_gemm *g, char *why, size_t why_bytes);

#endif  // QT_BENCH_CUBLASLT_H
