// moe kernels: routing, the stable counting sort of assignments by expert, gather, combine and
// the router's gradient (ABI, orders and per-token arithmetic in moe.h).
//
// Every count is an integer: the per-chunk histograms use shared-memory integer atomics (their
// sums do not depend on the order), and the places within a chunk come from one warp walking the
// chunk in assignment order, so the permutation is the same on every run and every GPU.
//
// gather and combine_bwd take dynamic shared memory only with an amax output: the per-member
// table of ptx/act.h, 4 x experts bytes.
#include "ptx/moe.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

#include "ptx/quant_group.h"  // qt_group_find_warp, qt_group_active_rows

#define MOE_FULL_MASK 0xFFFFFFFFu

// One token per thread: softmax, then the K choices.
extern "C" __global__ void __launch_bounds__(QT_MOE_TOKEN_THREADS)
    qt_moe_route(const __grid_constant__ moe_route_args args) {
    qt_grid_enter();
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
    qt_grid_enter();
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

// Block b takes experts [32 b, 32 b + 32), one per lane; warp w takes chunks [w P, (w + 1) P),
// P = ceil(chunks / 32). Each thread sums its chunks' counts, adds the sums of the warps before
// its own (shared memory) and walks its chunks again writing the running prefix; warp 31 ends
// with the totals. The sums are integers, so the prefixes are the sequential walk's (the C
// twin's), and the loads of a pass are independent of each other: one thread per expert walking
// every chunk waited out one dependent load per chunk (21 us for 128 chunks on an H200).
extern "C" __global__ void __launch_bounds__(QT_MOE_SCAN_THREADS)
    qt_moe_scan(const __grid_constant__ moe_scan_args args) {
    qt_grid_enter();
    __shared__ uint32_t warp_sums[QT_MOE_SCAN_THREADS / 32][QT_MOE_SCAN_EXPERTS];
    uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x / 32u;
    uint32_t e = blockIdx.x * QT_MOE_SCAN_EXPERTS + lane;
    uint32_t per_warp = (args.chunks + 31u) / 32u;
    uint32_t c0 = min(warp * per_warp, args.chunks), c1 = min(c0 + per_warp, args.chunks);
    bool live = e < args.experts;
    const uint32_t *counts = (const uint32_t *)args.chunk_counts;
    uint32_t sum = 0;
    for (uint32_t c = c0; live && c < c1; c++) sum += counts[(uint64_t)c * args.experts + e];
    warp_sums[warp][lane] = sum;
    __syncthreads();
    if (!live) return;
    uint32_t run = 0;
    for (uint32_t w = 0; w < warp; w++) run += warp_sums[w][lane];
    uint32_t *base = (uint32_t *)args.chunk_base;
    for (uint32_t c = c0; c < c1; c++) {
        uint64_t slot = (uint64_t)c * args.experts + e;
        base[slot] = run;
        run += counts[slot];
    }
    for (uint32_t slot = warp; args.amax && slot < args.amax_slots; slot += 32u) {
        ((float *)args.amax)[(uint64_t)slot * args.experts + e] = 0.0f;
    }
    if (warp != QT_MOE_SCAN_THREADS / 32u - 1u) return;
    ((uint32_t *)args.first_dims)[e] = run;
    if (args.whole_dims) {
        ((uint32_t *)args.whole_dims)[e] = qt_group_roundup(run, QT_MOE_WHOLE_ROWS);
    }
}

// One warp per chunk (a block of 32 threads): `next` (dynamic shared memory, 4 * experts bytes)
// holds each expert's next row; 32 assignments at a time, the lanes of one expert take
// consecutive rows in lane order (match_any gives the group, its lanes below give the rank), and
// the group's last lane advances the expert's row after every lane has read it.
extern "C" __global__ void __launch_bounds__(32)
    qt_moe_permute(const __grid_constant__ moe_permute_args args) {
    qt_grid_enter();
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

// max |v| over the elements of one 16-byte word (8 BF16 or 4 FP32), NaN skipped.
__device__ __forceinline__ float moe_max16(float m, uint4 w, uint32_t dtype) {
    uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (uint32_t q = 0; q < 4; q++) {
        if (dtype == QT_DTYPE_BF16) {
            m = fmaxf(m, fabsf(__uint_as_float(words[q] << 16)));
            m = fmaxf(m, fabsf(__uint_as_float(words[q] & 0xFFFF0000u)));
        } else {
            m = fmaxf(m, fabsf(__uint_as_float(words[q])));
        }
    }
    return m;
}

__device__ __forceinline__ float moe_warp_max(float m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(MOE_FULL_MASK, m, o));
    return m;
}

// Zeros over one row of `bytes` (a multiple of 2) by one warp.
__device__ __forceinline__ void moe_zero_row(uint64_t dst, uint32_t bytes, uint32_t lane) {
    if (bytes % 16u == 0 && act_aligned16(dst)) {
        for (uint32_t i = lane; i < bytes / 16u; i += 32) {
            ((uint4 *)dst)[i] = make_uint4(0, 0, 0, 0);
        }
        return;
    }
    for (uint32_t i = lane; i < bytes / 2u; i += 32) ((uint16_t *)dst)[i] = 0;
}

// Warp of token t: x[t] to the token's K permuted rows, 16-byte vectors read once into registers
// and stored K times; returns the row's max |x| (amax only; every lane gets it).
__device__ __forceinline__ float moe_gather_token(const moe_gather_args &a, uint32_t t,
                                                  uint32_t lane) {
    const uint32_t *row_of = (const uint32_t *)a.row_of + (uint64_t)t * a.topk;
    uint64_t src = a.x + (uint64_t)t * a.row_bytes;
    float m = 0.0f;
    if (a.row_bytes % 16u == 0 && act_aligned16(a.x | a.out)) {
        uint32_t n = a.row_bytes / 16u;
        for (uint32_t i0 = lane; i0 < n; i0 += 32u * QT_MOE_GATHER_UNROLL) {
            uint4 v[QT_MOE_GATHER_UNROLL];
#pragma unroll
            for (uint32_t u = 0; u < QT_MOE_GATHER_UNROLL; u++) {
                uint32_t i = i0 + 32u * u;
                v[u] = i < n ? __ldg((const uint4 *)src + i) : make_uint4(0, 0, 0, 0);
            }
            for (uint32_t j = 0; j < a.topk; j++) {
                uint4 *dst = (uint4 *)(a.out + (uint64_t)row_of[j] * a.row_bytes);
#pragma unroll
                for (uint32_t u = 0; u < QT_MOE_GATHER_UNROLL; u++) {
                    if (i0 + 32u * u < n) dst[i0 + 32u * u] = v[u];
                }
            }
#pragma unroll
            for (uint32_t u = 0; u < QT_MOE_GATHER_UNROLL; u++) m = moe_max16(m, v[u], a.dtype);
        }
    } else if (a.dtype == QT_DTYPE_F32) {
        for (uint32_t i = lane; i < a.row_bytes / 4u; i += 32) {
            uint32_t v = ((const uint32_t *)src)[i];
            for (uint32_t j = 0; j < a.topk; j++) {
                ((uint32_t *)(a.out + (uint64_t)row_of[j] * a.row_bytes))[i] = v;
            }
            m = fmaxf(m, fabsf(__uint_as_float(v)));
        }
    } else {
        for (uint32_t i = lane; i < a.row_bytes / 2u; i += 32) {
            uint16_t v = ((const uint16_t *)src)[i];
            for (uint32_t j = 0; j < a.topk; j++) {
                ((uint16_t *)(a.out + (uint64_t)row_of[j] * a.row_bytes))[i] = v;
            }
            m = fmaxf(m, fabsf(__uint_as_float((uint32_t)v << 16)));
        }
    }
    return moe_warp_max(m);
}

// Warp w: token w (when w < tokens), then permuted row w when it is a padding row.
extern "C" __global__ void __launch_bounds__(QT_MOE_ROW_THREADS)
    qt_moe_gather(const __grid_constant__ moe_gather_args args) {
    qt_grid_enter();
    extern __shared__ uint32_t moe_member_amax[];
    uint32_t w = blockIdx.x * QT_MOE_ROWS_PER_BLOCK + threadIdx.x / 32u;
    uint32_t lane = threadIdx.x & 31u;
    if (args.amax) act_amax_table_zero(moe_member_amax, args.group.count);
    if (w < args.tokens) {
        float m = moe_gather_token(args, w, lane);
        const uint32_t *expert = (const uint32_t *)args.expert + (uint64_t)w * args.topk;
        for (uint32_t j = lane; args.amax && j < args.topk; j += 32) {
            act_amax_table_merge(moe_member_amax, expert[j], m, args.dtype);
        }
    }
    if (w < qt_group_active_rows(args.group, args.capacity)) {
        uint32_t member = qt_group_find_warp(args.group, w);
        if (!qt_moe_row_valid(args.group, member, w)) {
            moe_zero_row(args.out + (uint64_t)w * args.row_bytes, args.row_bytes, lane);
        }
    }
    if (args.amax) act_amax_table_flush(moe_member_amax, args.group.count, args.amax);
}

// One thread per chunk of 8 columns of a token where every row is whole chunks and every tensor
// 16-byte aligned: the K rows' chunks (QT_MOE_COMBINE_UNROLL at a time: top-2 in one round) are
// loaded before the FP32 fmas fold them in choice order, qt_moe_combine_value's arithmetic per
// element.
__device__ __forceinline__ void moe_combine_chunks(const moe_combine_args &a) {
    uint32_t per_row = a.cols / QT_ACT_CHUNK;
    uint64_t count = (uint64_t)a.tokens * per_row;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint32_t *row_of = (const uint32_t *)a.row_of;
    const float *gate = (const float *)a.gate;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        uint64_t t = i / per_row;
        uint64_t col = (i - t * per_row) * QT_ACT_CHUNK;
        float acc[8];
        if (a.addend) {
            act_load8(a.addend, i * QT_ACT_CHUNK, a.addend_dtype, acc);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] = 0.0f;
        }
        // The router term: E scalars of the token's gradient (one broadcast load a warp) and
        // E chunks of the weight (E x cols BF16, L1-resident at the few experts it is used for).
        for (uint32_t e = 0; a.dlogits && e < a.experts; e++) {
            float d = qt_act_load(a.dlogits, t * a.experts + e, a.dlogits_dtype), wv[8];
            act_load8(a.router_w, (uint64_t)e * a.router_w_cols + col, QT_DTYPE_BF16, wv);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] = qt_fmaf(d, wv[k], acc[k]);
        }
        for (uint32_t j0 = 0; j0 < a.topk; j0 += QT_MOE_COMBINE_UNROLL) {
            float v[QT_MOE_COMBINE_UNROLL][8], w[QT_MOE_COMBINE_UNROLL];
#pragma unroll
            for (uint32_t u = 0; u < QT_MOE_COMBINE_UNROLL; u++) {
                uint64_t assignment = t * a.topk + j0 + u;
                if (j0 + u >= a.topk) continue;
                w[u] = gate ? gate[assignment] : 1.0f;
                act_load8(a.src, (uint64_t)row_of[assignment] * a.cols + col, a.src_dtype, v[u]);
            }
#pragma unroll
            for (uint32_t u = 0; u < QT_MOE_COMBINE_UNROLL; u++) {
                if (j0 + u >= a.topk) continue;
#pragma unroll
                for (int k = 0; k < 8; k++) acc[k] = qt_fmaf(w[u], v[u][k], acc[k]);
            }
        }
        act_store8(a.out, i * QT_ACT_CHUNK, a.out_dtype, acc);
    }
}

// Chunks where the shape allows, else one element per step of a grid-stride loop.
extern "C" __global__ void __launch_bounds__(QT_MOE_FLAT_THREADS)
    qt_moe_combine(const __grid_constant__ moe_combine_args args) {
    qt_grid_enter();
    if (args.cols % QT_ACT_CHUNK == 0 && args.router_w_cols % QT_ACT_CHUNK == 0 &&
        act_aligned16(args.src | args.addend | args.out | args.router_w)) {
        moe_combine_chunks(args);
        return;
    }
    uint64_t count = (uint64_t)args.tokens * args.cols;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        uint32_t t = (uint32_t)(i / args.cols), c = (uint32_t)(i % args.cols);
        qt_act_store(args.out, i, args.out_dtype, qt_moe_combine_value(&args, t, c));
    }
}

// One assignment's row by its token's warp: dyp[r] = g dy[t] and the lanes' shares of
// dgate = dy[t] . yp[r] in the row order of act.h (lane l folds chunks l, l + 32, ... in index
// order; QT_MOE_COMBINE_BWD_UNROLL chunks of both inputs are loaded before they are used).
// Returns the lane's max |g dy| (amax) and leaves its dot product share in *acc.
__device__ __forceinline__ float moe_combine_bwd_row(const moe_combine_bwd_args &a, uint64_t in,
                                                     uint64_t out, float g, uint32_t lane,
                                                     float *acc) {
    float m = 0.0f, sum = 0.0f;
    if (a.cols % QT_ACT_CHUNK == 0 && act_aligned16(a.dy | a.yp | a.dyp)) {
        uint32_t chunks = a.cols / QT_ACT_CHUNK;
        for (uint32_t c0 = lane; c0 < chunks; c0 += 32u * QT_MOE_COMBINE_BWD_UNROLL) {
            float dy[QT_MOE_COMBINE_BWD_UNROLL][8], yp[QT_MOE_COMBINE_BWD_UNROLL][8];
#pragma unroll
            for (uint32_t u = 0; u < QT_MOE_COMBINE_BWD_UNROLL; u++) {
                uint64_t first = (uint64_t)(c0 + 32u * u) * QT_ACT_CHUNK;
                if (c0 + 32u * u >= chunks) continue;
                act_load8(a.dy, in + first, a.dy_dtype, dy[u]);
                act_load8(a.yp, out + first, a.yp_dtype, yp[u]);
            }
#pragma unroll
            for (uint32_t u = 0; u < QT_MOE_COMBINE_BWD_UNROLL; u++) {
                uint64_t first = (uint64_t)(c0 + 32u * u) * QT_ACT_CHUNK;
                if (c0 + 32u * u >= chunks) continue;
                float o[8];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    sum = qt_fmaf(dy[u][k], yp[u][k], sum);
                    o[k] = g * dy[u][k];
                }
                m = fmaxf(m, act_max8(o));
                act_store8(a.dyp, out + first, a.dyp_dtype, o);
            }
        }
    } else {
        for (uint32_t c0 = lane * QT_ACT_CHUNK; c0 < a.cols; c0 += 32u * QT_ACT_CHUNK) {
            uint32_t c1 = min(c0 + QT_ACT_CHUNK, a.cols);
            for (uint32_t c = c0; c < c1; c++) {
                float dy = qt_act_load(a.dy, in + c, a.dy_dtype);
                sum = qt_fmaf(dy, qt_act_load(a.yp, out + c, a.yp_dtype), sum);
                m = fmaxf(m, fabsf(g * dy));
                qt_act_store(a.dyp, out + c, a.dyp_dtype, g * dy);
            }
        }
    }
    *acc = sum;
    return m;
}

// Warp w: token w's K rows (dy[w] comes from DRAM once, the later rows read it from the caches),
// then permuted row w when it is a padding row (zeros).
extern "C" __global__ void __launch_bounds__(QT_MOE_ROW_THREADS)
    qt_moe_combine_bwd(const __grid_constant__ moe_combine_bwd_args args) {
    qt_grid_enter();
    extern __shared__ uint32_t moe_member_amax[];
    uint32_t w = blockIdx.x * QT_MOE_ROWS_PER_BLOCK + threadIdx.x / 32u;
    uint32_t lane = threadIdx.x & 31u;
    if (args.amax) act_amax_table_zero(moe_member_amax, args.group.count);
    for (uint32_t j = 0; w < args.tokens && j < args.topk; j++) {
        uint64_t a = (uint64_t)w * args.topk + j;
        uint64_t out = (uint64_t)((const uint32_t *)args.row_of)[a] * args.cols;
        float acc;
        float m = moe_combine_bwd_row(args, (uint64_t)w * args.cols, out,
                                      ((const float *)args.gate)[a], lane, &acc);
        for (uint32_t o = 16; o > 0; o >>= 1) acc = acc + __shfl_down_sync(MOE_FULL_MASK, acc, o);
        if (lane == 0) ((float *)args.dgate)[a] = qt_act_canonical(acc);
        m = moe_warp_max(m);
        if (args.amax && lane == 0) {
            act_amax_table_merge(moe_member_amax, ((const uint32_t *)args.expert)[a], m,
                                 args.dyp_dtype);
        }
    }
    if (w < qt_group_active_rows(args.group, args.capacity)) {
        uint32_t member = qt_group_find_warp(args.group, w);
        if (!qt_moe_row_valid(args.group, member, w)) {
            moe_zero_row(args.dyp + (uint64_t)w * args.cols * qt_act_dtype_bytes(args.dyp_dtype),
                         args.cols * qt_act_dtype_bytes(args.dyp_dtype), lane);
        }
    }
    if (args.amax) act_amax_table_flush(moe_member_amax, args.group.count, args.amax);
}

// One token per thread.
extern "C" __global__ void __launch_bounds__(QT_MOE_TOKEN_THREADS)
    qt_moe_router_bwd(const __grid_constant__ moe_router_bwd_args args) {
    qt_grid_enter();
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < args.tokens) qt_moe_router_grad(&args, t);
}

extern "C" __global__ void __launch_bounds__(256)
    qt_moe_uniform_group(const __grid_constant__ moe_uniform_group_args args) {
    qt_grid_enter();
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= args.count) ((uint32_t *)args.row_offsets)[i] = i * args.rows;
    if (i < args.count) ((uint32_t *)args.first_dims)[i] = args.rows;
}
