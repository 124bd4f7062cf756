// core kernels: fill_random, copy, checksum (ABI and shared arithmetic in core.h).
#include "ptx/core.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

// Grid-stride over elements; each element is an independent Philox draw, so the grid shape never
// changes a value.
extern "C" __global__ void qt_fill_random(const __grid_constant__ fill_random_args args) {
    qt_grid_enter();
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < args.count;
         i += stride) {
        float value = qt_fill_value(args.seed, args.offset + i, args.dist, args.a, args.b);
        uint64_t at = qt_fill_index(&args, i);
        if (args.dtype == QT_DTYPE_BF16) {
            ((uint16_t *)args.out)[at] = qt_f32_to_bf16(value);
        } else {
            ((float *)args.out)[at] = value;
        }
    }
}

// 16-byte vectors when both ends and the length allow it, bytes otherwise.
extern "C" __global__ void qt_copy(const __grid_constant__ copy_args args) {
    qt_grid_enter();
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (((args.dst | args.src | args.bytes) & 15u) == 0) {
        const uint4 *src = (const uint4 *)args.src;
        uint4 *dst = (uint4 *)args.dst;
        for (uint64_t i = first; i < args.bytes / 16; i += stride) dst[i] = src[i];
    } else {
        const uint8_t *src = (const uint8_t *)args.src;
        uint8_t *dst = (uint8_t *)args.dst;
        for (uint64_t i = first; i < args.bytes; i += stride) dst[i] = src[i];
    }
}

#define QT_CHECKSUM_THREADS 256

// Fixed-shape tree over the block: the sum is exact mod 2^64, the tree just keeps it parallel.
__device__ uint64_t qt_block_sum_u64(uint64_t value) {
    __shared__ uint64_t partial[QT_CHECKSUM_THREADS];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned width = QT_CHECKSUM_THREADS / 2; width > 0; width /= 2) {
        if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
        __syncthreads();
    }
    return partial[0];
}

__device__ uint64_t qt_load_word(const uint8_t *src, uint64_t bytes, uint64_t word_index) {
    uint64_t first_byte = word_index * 8;
    if (first_byte + 8 <= bytes) return ((const uint64_t *)src)[word_index];
    uint64_t word = 0;
    for (uint64_t b = first_byte; b < bytes; b++) {
        word |= (uint64_t)src[b] << (8 * (b - first_byte));
    }
    return word;
}

extern "C" __global__ void __launch_bounds__(QT_CHECKSUM_THREADS)
    qt_checksum_partial(const __grid_constant__ checksum_args args) {
    qt_grid_enter();
    const uint8_t *src = (const uint8_t *)args.src;
    uint64_t words = (args.bytes + 7) / 8;
    uint64_t stride = (uint64_t)args.blocks * QT_CHECKSUM_THREADS;
    uint64_t sum = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * QT_CHECKSUM_THREADS + threadIdx.x; i < words;
         i += stride) {
        sum += qt_checksum_word(qt_load_word(src, args.bytes, i), i);
    }
    uint64_t block_sum = qt_block_sum_u64(sum);
    if (threadIdx.x == 0) ((uint64_t *)args.partials)[blockIdx.x] = block_sum;
}

extern "C" __global__ void __launch_bounds__(QT_CHECKSUM_THREADS)
    qt_checksum_final(const __grid_constant__ checksum_args args) {
    qt_grid_enter();
    const uint64_t *partials = (const uint64_t *)args.partials;
    uint64_t sum = 0;
    for (uint32_t i = threadIdx.x; i < args.blocks; i += QT_CHECKSUM_THREADS) sum += partials[i];
    uint64_t total = qt_block_sum_u64(sum);
    if (threadIdx.x == 0) *(uint64_t *)args.out = qt_checksum_finish(total, args.bytes);
}
