// gemm_mma: the device primitives of the mma.sync GEMM kernels (ptx/gemm_portable.cu,
// ptx/gemm_skinny.cu): the PTX of shared-memory fragment loads, asynchronous copies and the
// tensor-core instruction, guarded global loads, and the per-element epilogue, so that both
// files walk the same instructions and write D the same way. Device code only; the arithmetic
// of the epilogue is gemm.h's (qt_gemm_epilogue), which the C twins compute.
#ifndef QT_GEMM_MMA_H
#define QT_GEMM_MMA_H

#include "ptx/gemm.h"

// Each module's blocks take their stages from dynamic shared memory.
extern __shared__ __align__(16) uint8_t gemm_dynamic_smem[];

__device__ __forceinline__ uint32_t gemm_smem_address(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// Four 8 x 8 matrices of 16-bit values; lane 8 j + i gives the address of row i of matrix j, and
// register j of lane l holds elements 2 (l % 4), 2 (l % 4) + 1 of row l / 4 of matrix j.
__device__ __forceinline__ void gemm_ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

// The same, transposed: register j of lane l holds elements (rows 2 (l % 4), 2 (l % 4) + 1) of
// column l / 4 of matrix j, so an outer-major tile ([k][r] in shared memory) gives the fragments
// that gemm_ldmatrix_x4 gives of a K-major one.
__device__ __forceinline__ void gemm_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

// Asynchronous global -> shared copies (sm_80+). src_bytes < size zero-fills the rest of the
// destination; the source address must be aligned to `size` even then.
__device__ __forceinline__ void gemm_cp_async16(void *dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(gemm_smem_address(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void gemm_cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(gemm_smem_address(dst)),
                 "l"(src)
                 : "memory");
}

__device__ __forceinline__ void gemm_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void gemm_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The BF16 tensor-core instruction, D += A x B on one 16 x 8 output fragment.
struct gemm_mma_bf16 {
    static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// Loads the first n_valid (0..N) bytes at p into a zeroed N-byte vector (N = 4, 8 or 16).
// Whole, aligned vectors take one load; row edges, the k tail and misaligned rows take one byte
// load per valid byte, all issued before any is used, so that a partial piece (a 10-row operand,
// a contraction of 10) waits for one memory latency, not one per byte.
template <int N>
__device__ __forceinline__ uint4 gemm_load_bytes(const uint8_t *p, uint32_t n_valid) {
    if (n_valid >= (uint32_t)N && ((uintptr_t)p & (uintptr_t)(N - 1)) == 0) {
        if constexpr (N == 16) {
            return __ldg(reinterpret_cast<const uint4 *>(p));
        } else if constexpr (N == 8) {
            uint2 h = __ldg(reinterpret_cast<const uint2 *>(p));
            return make_uint4(h.x, h.y, 0u, 0u);
        } else {
            return make_uint4(__ldg(reinterpret_cast<const uint32_t *>(p)), 0u, 0u, 0u);
        }
    }
    uint32_t bytes[N];
#pragma unroll
    for (int j = 0; j < N; j++) bytes[j] = (uint32_t)j < n_valid ? (uint32_t)__ldg(p + j) : 0u;
    uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int j = 0; j < N; j++) w[j / 4] |= bytes[j] << (8 * (j % 4));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// One 16-byte chunk of a shared stage: the first n_bytes at p, zeros after. An aligned source is
// an asynchronous copy (the stage's commit group covers it); a chunk with nothing to read, or of
// a misaligned row (a leading dimension that is not a multiple of 16 bytes), is loaded and
// stored synchronously (correct, slow; planners keep rows whole 16-byte pieces).
__device__ __forceinline__ void gemm_copy_chunk(uint8_t *dst, const uint8_t *p, uint32_t n_bytes) {
    if (n_bytes != 0 && ((uintptr_t)p & 15u) == 0) {
        gemm_cp_async16(dst, p, n_bytes);
    } else {
        *reinterpret_cast<uint4 *>(dst) = gemm_load_bytes<16>(p, n_bytes);
    }
}

// ---------------------------------------------------------------------------------------------
// Epilogue of one element (gemm.h): alpha', then beta C and the bias where the args have them.

__device__ __forceinline__ float gemm_load_value(const uint8_t *base, uint64_t index,
                                                 uint32_t dtype) {
    if (dtype == QT_DTYPE_BF16) {
        return qt_bf16_to_f32(reinterpret_cast<const uint16_t *>(base)[index]);
    }
    return reinterpret_cast<const float *>(base)[index];
}

__device__ __forceinline__ void gemm_store_value(uint8_t *base, uint64_t index, uint32_t dtype,
                                                 float v) {
    if (dtype == QT_DTYPE_BF16) {
        reinterpret_cast<uint16_t *>(base)[index] = qt_f32_to_bf16(v);
    } else {
        reinterpret_cast<float *>(base)[index] = v;
    }
}

// D's value at `index` (row * ldd + col) from the accumulator; c and bias are the member's.
__device__ __forceinline__ float gemm_epilogue_value(const gemm_args &args, const uint8_t *c,
                                                     const uint8_t *bias, float alpha,
                                                     uint64_t index, uint32_t col, float acc) {
    int has_c = args.c != 0 && args.beta != 0.0f;
    int has_bias = args.bias != 0;
    float cv = has_c ? gemm_load_value(c, index, args.d_dtype) : 0.0f;
    float bv = has_bias ? gemm_load_value(bias, col, args.bias_dtype) : 0.0f;
    return qt_gemm_epilogue(acc, alpha, has_c, args.beta, cv, has_bias, bv);
}

#endif  // QT_GEMM_MMA_H
