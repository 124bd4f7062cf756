// moe kernels: routing, the stable counting sort of assignments by expert, gather, combine and
// the router's gradient (ABI, orders and per-token arithmetic in moe.h).
//
// Every count is an integer: the per-chunk histograms use shared-memory integer atomics (their
// sums do not depend on the order), and the places within a chunk come from one warp walking the
// chunk in assignment order, so the permutation is the same on every run and every GPU.
#include "ptx/moe.h"

#include "ptx/quant_group.h"  // qt_group_find_warp, qt_group_active_rows

#define MOE_FULL_MASK 0xFFFFFFFFu

// One token per thread: softmax, then the K choices.
extern "C" __global__ void __launch_bounds__(QT_MOE_TOKEN_THREADS)
    qt_moe_route(const __grid_constant__ moe_route_args args) {
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= args.tokens) return;
    const float *logits = (const float *)args.logits + (uint64_t)t * args.experts;
    float *probs = (float *)args.probs + (uint64_t)t * args.experts;
    qt_moe_softmax(logits, probs, args.experts);
    qt_moe_topk(probs, args.experts, args.topk, (uint32_t *)args.expert + (uint64_t)t * args.topk,
                (float *)args.gate + (uint64_t)t * args.topk);
}

// Block c: the histogram of chunk c's assignments over the experts (dynamic shared memory,
// 4 * experts bytes).
extern "C" __global__ void __launch_bounds__(QT_MOE_COUNT_THREADS)
    qt_moe_count(const __grid_constant__ moe_count_args args) {
    extern __shared__ uint32_t hist[];
    for (uint32_t e = threadIdx.x; e < args.experts; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    const uint32_t *expert = (const uint32_t *)args.expert;
    uint32_t begin = blockIdx.x * QT_MOE_CHUNK;
    uint32_t end = min(begin + QT_MOE_CHUNK, args.assignments);
    for (uint32_t a = begin + threadIdx.x; a < end; a += blockDim.x) {
        atomicAdd(&hist[expert[a]], 1u);
    }
    __syncthreads();
    uint32_t *out = (uint32_t *)args.chunk_counts + (uint64_t)blockIdx.x * args.experts;
    for (uint32_t e = threadIdx.x; e < args.experts; e += blockDim.x) out[e] = hist[e];
}

// One thread per expert walks the chunks in order: exclusive prefix in place, total out.
extern "C" __global__ void __launch_bounds__(QT_MOE_SCAN_THREADS)
    qt_moe_scan(const __grid_constant__ moe_scan_args args) {
    const uint32_t *counts = (const uint32_t *)args.chunk_counts;
    uint32_t *base = (uint32_t *)args.chunk_base;
    for (uint32_t e = threadIdx.x; e < args.experts; e += blockDim.x) {
        uint32_t run = 0;
        for (uint32_t c = 0; c < args.chunks; c++) {
            uint64_t slot = (uint64_t)c * args.experts + e;
            base[slot] = run;
            run += counts[slot];
        }
        ((uint32_t *)args.first_dims)[e] = run;
        if (args.whole_dims) {
            ((uint32_t *)args.whole_dims)[e] = qt_group_roundup(run, QT_MOE_WHOLE_ROWS);
        }
    }
}

// One warp per chunk (a block of 32 threads): `next` (dynamic shared memory, 4 * experts bytes)
// holds each expert's next row; 32 assignments at a time, the lanes of one expert take
// consecutive rows in lane order (match_any gives the group, its lanes below give the rank), and
// the group's last lane advances the expert's row after every lane has read it.
extern "C" __global__ void __launch_bounds__(32)
    qt_moe_permute(const __grid_constant__ moe_permute_args args) {
    extern __shared__ uint32_t next[];
    uint32_t lane = threadIdx.x;
    uint32_t chunk = blockIdx.x;
    const uint32_t *off = (const uint32_t *)args.row_offsets;
    const uint32_t *base = (const uint32_t *)args.chunk_base + (uint64_t)chunk * args.experts;
    for (uint32_t e = lane; e < args.experts; e += 32) next[e] = off[e] + base[e];
    __syncwarp();
    const uint32_t *expert = (const uint32_t *)args.expert;
    uint32_t *row_of = (uint32_t *)args.row_of;
    uint32_t *assign_of = (uint32_t *)args.assign_of;
    uint32_t begin = chunk * QT_MOE_CHUNK;
    uint32_t end = min(begin + QT_MOE_CHUNK, args.assignments);
    uint32_t below = (1u << lane) - 1u;
    for (uint32_t first = begin; first < end; first += 32) {
        uint32_t a = first + lane;
        bool active = a < end;
        uint32_t mask = __ballot_sync(MOE_FULL_MASK, active);
        uint32_t e = 0, peers = 0, row = 0;
        if (active) {
            e = expert[a];
            peers = __match_any_sync(mask, e);
            row = next[e] + (uint32_t)__popc(peers & below);
            row_of[a] = row;
            assign_of[row] = a;
        }
        __syncwarp();
        if (active && lane == 31u - (uint32_t)__clz(peers)) next[e] += (uint32_t)__popc(peers);
        __syncwarp();
    }
}

// Rows of 16-byte vectors when the row allows, else of 2-byte words.
__device__ __forceinline__ void moe_copy_row(uint64_t dst, uint64_t src, uint32_t bytes,
                                             uint32_t lane) {
    if (bytes % 16u == 0) {
        for (uint32_t i = lane; i < bytes / 16u; i += 32) {
            ((uint4 *)dst)[i] = src ? ((const uint4 *)src)[i] : make_uint4(0, 0, 0, 0);
        }
        return;
    }
    for (uint32_t i = lane; i < bytes / 2u; i += 32) {
        ((uint16_t *)dst)[i] = src ? ((const uint16_t *)src)[i] : (uint16_t)0;
    }
}

// One permuted row per warp.
extern "C" __global__ void __launch_bounds__(QT_MOE_ROW_THREADS)
    qt_moe_gather(const __grid_constant__ moe_gather_args args) {
    uint32_t r = blockIdx.x * QT_MOE_ROWS_PER_BLOCK + threadIdx.x / 32u;
    uint32_t lane = threadIdx.x & 31u;
    if (r >= qt_group_active_rows(args.group, args.capacity)) return;
    uint32_t member = qt_group_find_warp(args.group, r);
    uint64_t src = 0;
    if (qt_moe_row_valid(args.group, member, r)) {
        uint32_t token = ((const uint32_t *)args.assign_of)[r] / args.topk;
        src = args.x + (uint64_t)token * args.row_bytes;
    }
    moe_copy_row(args.out + (uint64_t)r * args.row_bytes, src, args.row_bytes, lane);
}

// One element per step of a grid-stride loop over tokens x cols.
extern "C" __global__ void __launch_bounds__(QT_MOE_FLAT_THREADS)
    qt_moe_combine(const __grid_constant__ moe_combine_args args) {
    uint64_t count = (uint64_t)args.tokens * args.cols;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        uint32_t t = (uint32_t)(i / args.cols), c = (uint32_t)(i % args.cols);
        qt_act_store(args.out, i, args.out_dtype, qt_moe_combine_value(&args, t, c));
    }
}

// One permuted row per warp: the gated gradient row and, from lane 0, the dot product.
extern "C" __global__ void __launch_bounds__(QT_MOE_ROW_THREADS)
    qt_moe_combine_bwd(const __grid_constant__ moe_combine_bwd_args args) {
    uint32_t r = blockIdx.x * QT_MOE_ROWS_PER_BLOCK + threadIdx.x / 32u;
    uint32_t lane = threadIdx.x & 31u;
    if (r >= qt_group_active_rows(args.group, args.capacity)) return;
    uint32_t member = qt_group_find_warp(args.group, r);
    uint64_t out = (uint64_t)r * args.cols;
    if (!qt_moe_row_valid(args.group, member, r)) {
        for (uint32_t c = lane; c < args.cols; c += 32) {
            qt_act_store(args.dyp, out + c, args.dyp_dtype, 0.0f);
        }
        return;
    }
    uint32_t a = ((const uint32_t *)args.assign_of)[r];
    uint64_t in = (uint64_t)(a / args.topk) * args.cols;
    float g = ((const float *)args.gate)[a];
    float acc = 0.0f;
    for (uint32_t c0 = lane * QT_ACT_CHUNK; c0 < args.cols; c0 += 32u * QT_ACT_CHUNK) {
        uint32_t c1 = min(c0 + QT_ACT_CHUNK, args.cols);
        for (uint32_t c = c0; c < c1; c++) {
            float dy = qt_act_load(args.dy, in + c, args.dy_dtype);
            acc = qt_fmaf(dy, qt_act_load(args.yp, out + c, args.yp_dtype), acc);
            qt_act_store(args.dyp, out + c, args.dyp_dtype, g * dy);
        }
    }
    for (uint32_t m = 16; m > 0; m >>= 1) acc = acc + __shfl_down_sync(MOE_FULL_MASK, acc, m);
    if (lane == 0) ((float *)args.dgate)[a] = qt_act_canonical(acc);
}

// One token per thread.
extern "C" __global__ void __launch_bounds__(QT_MOE_TOKEN_THREADS)
    qt_moe_router_bwd(const __grid_constant__ moe_router_bwd_args args) {
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < args.tokens) qt_moe_router_grad(&args, t);
}

extern "C" __global__ void __launch_bounds__(256)
    qt_moe_uniform_group(const __grid_constant__ moe_uniform_group_args args) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= args.count) ((uint32_t *)args.row_offsets)[i] = i * args.rows;
    if (i < args.count) ((uint32_t *)args.first_dims)[i] = args.rows;
}
