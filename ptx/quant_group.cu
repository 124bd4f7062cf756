// quant_group kernels: grouped-tensor row offsets (ABI and helpers in quant_group.h).
#include "ptx/quant_group.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

#define QT_GROUP_WARPS (QT_GROUP_OFFSETS_THREADS / 32)

// Inclusive prefix sum over the block: a shuffle scan inside each warp, then the warp totals
// scanned by warp 0. Integer sums are exact, so the result is the sequential sum.
__device__ uint32_t qt_group_block_scan(uint32_t value, uint32_t *warp_totals, uint32_t *total) {
    uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (uint32_t d = 1; d < 32; d *= 2) {
        uint32_t up = __shfl_up_sync(0xFFFFFFFFu, value, d);
        if (lane >= d) value += up;
    }
    if (lane == 31) warp_totals[warp] = value;
    __syncthreads();
    if (warp == 0) {
        uint32_t t = lane < QT_GROUP_WARPS ? warp_totals[lane] : 0u;
        for (uint32_t d = 1; d < 32; d *= 2) {
            uint32_t up = __shfl_up_sync(0xFFFFFFFFu, t, d);
            if (lane >= d) t += up;
        }
        if (lane < QT_GROUP_WARPS) warp_totals[lane] = t;  // inclusive over warps
    }
    __syncthreads();
    uint32_t before = warp == 0 ? 0u : warp_totals[warp - 1];
    *total = warp_totals[QT_GROUP_WARPS - 1];
    // The next chunk rewrites warp_totals: every thread must have read it first.
    __syncthreads();
    return before + value;
}

// One block of QT_GROUP_OFFSETS_THREADS walks the members in chunks of that many, carrying the
// running total, so any count works with one launch and a deterministic order of sums.
extern "C" __global__ void __launch_bounds__(QT_GROUP_OFFSETS_THREADS)
    qt_group_offsets(const __grid_constant__ group_offsets_args args) {
    qt_grid_enter();
    __shared__ uint32_t warp_totals[QT_GROUP_WARPS];
    const uint32_t *dims = (const uint32_t *)args.first_dims;
    uint32_t *off = (uint32_t *)args.row_offsets;
    if (threadIdx.x == 0) off[0] = 0;
    uint32_t carry = 0;
    for (uint32_t base = 0; base < args.count; base += QT_GROUP_OFFSETS_THREADS) {
        uint32_t i = base + threadIdx.x;
        uint32_t rows = i < args.count ? qt_group_roundup(dims[i], args.row_align) : 0u;
        uint32_t total;
        uint32_t inclusive = qt_group_block_scan(rows, warp_totals, &total);
        if (i < args.count) off[i + 1] = carry + inclusive;
        carry += total;
    }
}
