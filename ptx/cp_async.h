// cp_async: the element kernels' asynchronous global -> shared copies (sm_80 and up). A kernel
// that stages its input this way holds no registers for the bytes in flight, which lets it keep
// more warps resident than loads into registers would (quant_block.cu, quant_mxfp8.cu).
#ifndef QT_CP_ASYNC_H
#define QT_CP_ASYNC_H

#if defined(__CUDACC__)
#include <stdint.h>

// 16 bytes global -> shared (cp.async, cached in L2 only); bytes past src_bytes are zero-filled
// and not read. src must be 16-byte aligned even when src_bytes is 0.
__device__ __forceinline__ void qt_cp_async16(void *dst, const void *src, uint32_t src_bytes) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// Waits until every cp.async this thread issued has landed (and is visible to this thread).
__device__ __forceinline__ void qt_cp_async_wait_all(void) {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}
#endif  // __CUDACC__

#endif  // QT_CP_ASYNC_H
