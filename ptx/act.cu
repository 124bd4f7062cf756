// act kernels: activations, RMSNorm, residual add, softmax cross-entropy, MSE, global gradient
// norm (ABI, launch constants, per-element arithmetic and the reduction orders in act.h).
//
// Element kernels work on chunks of 8 elements (one 16-byte BF16 vector, two FP32 ones) where
// every address is 16-byte aligned and no chunk straddles a row, and element by element
// otherwise; the arithmetic per element is the same, so the path never changes a result.
//
// Traffic: the row kernels read a row once per pass (RMSNorm 2, xent 3); the later passes hit
// L1/L2 for any row up to tens of KB. The dgamma partial pass reads x and dy once more, column
// by column over fixed row ranges, so RMSNorm's backward moves about 5/3 of its minimal bytes;
// fusing dgamma into the dx pass would need per-column accumulators in a row-split layout.
// Rows whose length is not a multiple of 8 (or tensors at unaligned offsets) take the element
// path, which is correct but slower: pad vocabularies to a multiple of 8.
#include "ptx/act.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement
#include "ptx/quant_group.h"  // qt_group_find, qt_group_member_rows, qt_group_active_rows

#define ACT_FULL_MASK 0xFFFFFFFFu

// ---------------------------------------------------------------------------------------------
// Chunks of 8 elements (the 16-byte loads and stores themselves: ptx/act.h).

// Elements [first, first + n), n <= 8, zeros after; one vector load when vec (then n == 8).
__device__ __forceinline__ void act_load_chunk(uint64_t base, uint64_t first, uint32_t n,
                                               uint32_t dtype, bool vec, float v[8]) {
    if (vec) {
        act_load8(base, first, dtype, v);
        return;
    }
#pragma unroll
    for (uint32_t k = 0; k < 8; k++) v[k] = k < n ? qt_act_load(base, first + k, dtype) : 0.0f;
}

__device__ __forceinline__ void act_store_chunk(uint64_t base, uint64_t first, uint32_t n,
                                                uint32_t dtype, bool vec, const float v[8]) {
    if (vec) {
        act_store8(base, first, dtype, v);
        return;
    }
#pragma unroll
    for (uint32_t k = 0; k < 8; k++) {
        if (k < n) qt_act_store(base, first + k, dtype, v[k]);
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions in the fixed orders of act.h.

// Lane tree: lane i < m takes own + lane (i + m), m = 16 .. 1; lane 0's sum is broadcast.
__device__ __forceinline__ float act_warp_sum(float v) {
#pragma unroll
    for (uint32_t m = 16; m > 0; m >>= 1) v = v + __shfl_down_sync(ACT_FULL_MASK, v, m);
    return __shfl_sync(ACT_FULL_MASK, v, 0);
}

__device__ __forceinline__ qt_xent_best act_warp_best(qt_xent_best b) {
#pragma unroll
    for (uint32_t m = 16; m > 0; m >>= 1) {
        qt_xent_best other;
        other.value = __shfl_down_sync(ACT_FULL_MASK, b.value, m);
        other.index = __shfl_down_sync(ACT_FULL_MASK, b.index, m);
        b = qt_xent_best_combine(b, other);
    }
    b.value = __shfl_sync(ACT_FULL_MASK, b.value, 0);
    b.index = __shfl_sync(ACT_FULL_MASK, b.index, 0);
    return b;
}

// Block of 256 values: a lane tree per warp, then warps 0..7 in order. Every thread gets the
// total. Called by every thread of the block.
__device__ float act_block_sum(float v) {
    __shared__ float warp_sums[QT_ACT_WARPS];
#pragma unroll
    for (uint32_t m = 16; m > 0; m >>= 1) v = v + __shfl_down_sync(ACT_FULL_MASK, v, m);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    float total = warp_sums[0];
    for (uint32_t w = 1; w < QT_ACT_WARPS; w++) total = total + warp_sums[w];
    __syncthreads();  // warp_sums may be written again by a later call
    return total;
}

// Exact integer sum over the block; order is irrelevant.
__device__ uint32_t act_block_count(uint32_t v) {
    __shared__ uint32_t warp_counts[QT_ACT_WARPS];
    for (uint32_t m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(ACT_FULL_MASK, v, m);
    if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = v;
    __syncthreads();
    uint32_t total = 0;
    for (uint32_t w = 0; w < QT_ACT_WARPS; w++) total += warp_counts[w];
    __syncthreads();
    return total;
}

// Final pass over `count` float partials: thread t folds t, t + 256, ... from +0, then the block
// sum. Launched as one block of QT_ACT_THREADS.
__device__ float act_final_sum(uint64_t partials, uint32_t count) {
    const float *p = (const float *)(uintptr_t)partials;
    float acc = 0.0f;
    for (uint32_t i = threadIdx.x; i < count; i += QT_ACT_THREADS) acc = acc + p[i];
    return act_block_sum(acc);
}

// Row r of a row kernel: one warp per row, QT_ACT_ROWS_PER_BLOCK rows per block.
__device__ __forceinline__ uint64_t act_row(void) {
    return (uint64_t)blockIdx.x * QT_ACT_ROWS_PER_BLOCK + threadIdx.x / 32;
}

__device__ __forceinline__ uint32_t act_chunk_len(uint32_t c, uint32_t cols) {
    uint32_t left = cols - c * QT_ACT_CHUNK;
    return left < QT_ACT_CHUNK ? left : QT_ACT_CHUNK;
}

// ---------------------------------------------------------------------------------------------
// Activations.

// Flat kernels take 8-element chunks of the whole tensor where the addresses allow (and, with a
// bias or a grouped output, rows are whole chunks, so that a chunk lies in one row); the last
// count % 8 elements go to the first threads.
__device__ __forceinline__ bool act_flat_vec(const act_args &a) {
    return act_aligned16(a.x | a.bias | a.dy | a.out) &&
           ((a.bias == 0 && a.group.count == 0) || a.cols % 8 == 0);
}

__device__ __forceinline__ float act_pre(const act_args &a, uint64_t i, float x) {
    return a.bias ? x + qt_act_load(a.bias, i % a.cols, a.bias_dtype) : x;
}

__device__ __forceinline__ void act_pre8(const act_args &a, uint64_t first, float v[8]) {
    if (!a.bias) return;
    float b[8];
    act_load8(a.bias, first % a.cols, a.bias_dtype, b);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = v[k] + b[k];
}

// The amax of a dense output (act.h): the block's max |v| over the FP32 values it stored in
// dtype (NaN skipped, as fmaxf does), rounded as they were, merged into the slot by one atomic
// per block. Blocks whose maximum does not beat what the slot already holds skip the atomic, so
// that a grid of many small blocks does not queue one per block on a single address; a stale
// read only costs an atomic that changes nothing. Every thread of the block calls it (a barrier).
// kWarps: the block's warps.
template <uint32_t kWarps = QT_ACT_WARPS>
__device__ __forceinline__ void act_amax_flush_slot(uint64_t amax, uint32_t dtype, float m) {
    __shared__ float warp_max[kWarps];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (uint32_t w = 1; w < kWarps; w++) m = fmaxf(m, warp_max[w]);
    m = qt_act_stored_amax(fmaxf(m, warp_max[0]), dtype);
    unsigned int *slot = (unsigned int *)(uintptr_t)amax;
    if (m > 0.0f && __float_as_uint(m) > *(volatile unsigned int *)slot) {
        atomicMax(slot, __float_as_uint(m));
    }
}

// act_args.amax of a dense output.
__device__ __forceinline__ void act_amax_flush(const act_args &a, float m) {
    act_amax_flush_slot(a.amax, a.out_dtype, m);
}

// act_args.amax as one thread sees it: the max |v| of the values it stored so far and, for a
// grouped output, the member they belong to, with that member's elements of out [begin, end) and
// the end of its valid rows. kGrouped is a template parameter of the kernels, so the dense ones
// keep their registers and code.
struct act_amax_state {
    float m;
    uint32_t member;
    uint64_t begin, valid_end, end;
};

// The rows a kernel walks: a grouped tensor's stop at its active end.
template <bool kGrouped>
__device__ __forceinline__ uint64_t act_rows(const act_args &a) {
    return kGrouped ? qt_group_active_rows(a.group, a.rows) : a.rows;
}

// Every thread of the block, before its first store.
template <bool kGrouped>
__device__ __forceinline__ act_amax_state act_amax_start(const act_args &a, uint32_t *table) {
    act_amax_state s = {0.0f, 0, 0, 0, 0};
    if (kGrouped && a.amax) act_amax_table_zero(table, a.group.count);
    return s;
}

// Element i of out (rows of out_cols; a chunk's first element for a chunk in one row) was stored
// from values of magnitude up to m. A grouped output's other member merges the running maximum
// into the block's table and looks the new one up.
template <bool kGrouped>
__device__ __forceinline__ void act_amax_note(const act_args &a, act_amax_state &s,
                                              uint32_t *table, uint64_t i, uint32_t out_cols,
                                              float m) {
    if (!kGrouped) {
        s.m = fmaxf(s.m, m);
        return;
    }
    if (i < s.begin || i >= s.end) {
        act_amax_table_merge(table, s.member, s.m, a.out_dtype);
        s.member = qt_group_find(a.group, 0, a.group.count, (uint32_t)(i / out_cols));
        qt_group_rows r = qt_group_member_rows(a.group, a.rows, s.member);
        s.begin = (uint64_t)r.begin * out_cols;
        s.valid_end = (uint64_t)r.valid_end * out_cols;
        s.end = (uint64_t)r.end * out_cols;
        s.m = 0.0f;
    }
    if (i < s.valid_end) s.m = fmaxf(s.m, m);  // padding rows count for no amax
}

// Every thread of the block, after its last store.
template <bool kGrouped>
__device__ __forceinline__ void act_amax_finish(const act_args &a, const act_amax_state &s,
                                                uint32_t *table) {
    if (!a.amax) return;
    if (!kGrouped) {
        act_amax_flush(a, s.m);
        return;
    }
    act_amax_table_merge_warp(table, s.member, s.m, a.out_dtype);
    act_amax_table_flush(table, a.group.count, a.amax);
}

// The flat kernels' loops for one activation, so that each element's code is that activation's
// alone: with the activation a run-time value the compiler if-converted the dispatch and every
// element paid for GELU and SiLU together (GELU on 8192 x 16384 was compute-bound at 0.6 ms on
// an H200, 18% of DRAM bandwidth).
template <uint32_t kAct, bool kGrouped>
__device__ __forceinline__ void act_fwd_flat(const act_args &args, uint32_t *table) {
    uint64_t count = act_rows<kGrouped>(args) * args.cols;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t scalar_first = 0;
    act_amax_state s = act_amax_start<kGrouped>(args, table);
    if (act_flat_vec(args)) {
        for (uint64_t c = tid; c < count / 8; c += stride) {
            float v[8];
            act_load8(args.x, c * 8, args.x_dtype, v);
            act_pre8(args, c * 8, v);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = qt_act_forward(kAct, v[k]);
            if (args.amax) act_amax_note<kGrouped>(args, s, table, c * 8, args.cols, act_max8(v));
            act_store8(args.out, c * 8, args.out_dtype, v);
        }
        scalar_first = count / 8 * 8;
    }
    for (uint64_t i = scalar_first + tid; i < count; i += stride) {
        float v = qt_act_forward(kAct, act_pre(args, i, qt_act_load(args.x, i, args.x_dtype)));
        if (args.amax) act_amax_note<kGrouped>(args, s, table, i, args.cols, fabsf(v));
        qt_act_store(args.out, i, args.out_dtype, v);
    }
    act_amax_finish<kGrouped>(args, s, table);
}

template <uint32_t kAct, bool kGrouped>
__device__ __forceinline__ void act_bwd_flat(const act_args &args, uint32_t *table) {
    uint64_t count = act_rows<kGrouped>(args) * args.cols;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t scalar_first = 0;
    act_amax_state s = act_amax_start<kGrouped>(args, table);
    if (act_flat_vec(args)) {
        for (uint64_t c = tid; c < count / 8; c += stride) {
            float v[8], dy[8];
            act_load8(args.x, c * 8, args.x_dtype, v);
            act_load8<false>(args.dy, c * 8, args.dy_dtype, dy);  // out may be dy
            act_pre8(args, c * 8, v);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = qt_act_backward(kAct, v[k], dy[k]);
            if (args.amax) act_amax_note<kGrouped>(args, s, table, c * 8, args.cols, act_max8(v));
            act_store8(args.out, c * 8, args.out_dtype, v);
        }
        scalar_first = count / 8 * 8;
    }
    for (uint64_t i = scalar_first + tid; i < count; i += stride) {
        float v = act_pre(args, i, qt_act_load(args.x, i, args.x_dtype));
        v = qt_act_backward(kAct, v, qt_act_load(args.dy, i, args.dy_dtype));
        if (args.amax) act_amax_note<kGrouped>(args, s, table, i, args.cols, fabsf(v));
        qt_act_store(args.out, i, args.out_dtype, v);
    }
    act_amax_finish<kGrouped>(args, s, table);
}

template <bool kGrouped>
__device__ __forceinline__ void act_fwd_of_kind(const act_args &args, uint32_t *table) {
    if (args.act == QT_ACT_GELU) {
        act_fwd_flat<QT_ACT_GELU, kGrouped>(args, table);
    } else if (args.act == QT_ACT_SILU) {
        act_fwd_flat<QT_ACT_SILU, kGrouped>(args, table);
    } else {
        act_fwd_flat<QT_ACT_RELU, kGrouped>(args, table);
    }
}

template <bool kGrouped>
__device__ __forceinline__ void act_bwd_of_kind(const act_args &args, uint32_t *table) {
    if (args.act == QT_ACT_GELU) {
        act_bwd_flat<QT_ACT_GELU, kGrouped>(args, table);
    } else if (args.act == QT_ACT_SILU) {
        act_bwd_flat<QT_ACT_SILU, kGrouped>(args, table);
    } else {
        act_bwd_flat<QT_ACT_RELU, kGrouped>(args, table);
    }
}

// SwiGLU: output element (r, j), j < H, reads a = x[r][j] and b = x[r][H + j]. Chunks of the
// output need H % 8 == 0 so that both halves start chunk-aligned.
__device__ __forceinline__ bool act_swiglu_vec(const act_args &a) {
    return act_aligned16(a.x | a.bias | a.dy | a.out) && (a.cols / 2) % 8 == 0;
}

// a and b of output element (r, j) with their biases: first = r * 2H + j.
__device__ __forceinline__ void act_swiglu_ab(const act_args &a, uint64_t first, uint32_t j,
                                              bool vec, float va[8], float vb[8]) {
    uint32_t h = a.cols / 2;
    act_load_chunk(a.x, first, 8, a.x_dtype, vec, va);
    act_load_chunk(a.x, first + h, 8, a.x_dtype, vec, vb);
    if (!a.bias) return;
    float ba[8], bb[8];
    act_load_chunk(a.bias, j, 8, a.bias_dtype, vec, ba);
    act_load_chunk(a.bias, j + h, 8, a.bias_dtype, vec, bb);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        va[k] = va[k] + ba[k];
        vb[k] = vb[k] + bb[k];
    }
}

template <bool kGrouped>
__device__ __forceinline__ void act_swiglu_fwd(const act_args &args, uint32_t *table) {
    uint32_t h = args.cols / 2;
    uint64_t count = act_rows<kGrouped>(args) * h;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    act_amax_state s = act_amax_start<kGrouped>(args, table);
    if (act_swiglu_vec(args)) {
        for (uint64_t c = tid; c < count / 8; c += stride) {
            uint64_t r = c * 8 / h;
            uint32_t j = (uint32_t)(c * 8 - r * h);
            float a[8], b[8];
            act_swiglu_ab(args, r * args.cols + j, j, true, a, b);
#pragma unroll
            for (int k = 0; k < 8; k++) a[k] = qt_swiglu_forward(a[k], b[k]);
            if (args.amax) act_amax_note<kGrouped>(args, s, table, c * 8, h, act_max8(a));
            act_store8(args.out, c * 8, args.out_dtype, a);
        }
    } else {
        for (uint64_t i = tid; i < count; i += stride) {
            uint64_t r = i / h;
            uint32_t j = (uint32_t)(i - r * h);
            float a, b;
            qt_swiglu_ab(&args, r, j, &a, &b);
            float y = qt_swiglu_forward(a, b);
            if (args.amax) act_amax_note<kGrouped>(args, s, table, i, h, fabsf(y));
            qt_act_store(args.out, i, args.out_dtype, y);
        }
    }
    act_amax_finish<kGrouped>(args, s, table);
}

template <bool kGrouped>
__device__ __forceinline__ void act_swiglu_bwd(const act_args &args, uint32_t *table) {
    uint32_t h = args.cols / 2;
    uint64_t count = act_rows<kGrouped>(args) * h;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    act_amax_state s = act_amax_start<kGrouped>(args, table);
    if (act_swiglu_vec(args)) {
        for (uint64_t c = tid; c < count / 8; c += stride) {
            uint64_t r = c * 8 / h;
            uint32_t j = (uint32_t)(c * 8 - r * h);
            float a[8], b[8], dy[8], da[8], db[8];
            act_swiglu_ab(args, r * args.cols + j, j, true, a, b);
            act_load8(args.dy, c * 8, args.dy_dtype, dy);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                da[k] = qt_swiglu_da(a[k], b[k], dy[k]);
                db[k] = qt_swiglu_db(a[k], dy[k]);
            }
            if (args.amax) {
                act_amax_note<kGrouped>(args, s, table, r * args.cols + j, args.cols,
                                        fmaxf(act_max8(da), act_max8(db)));
            }
            act_store8(args.out, r * args.cols + j, args.out_dtype, da);
            act_store8(args.out, r * args.cols + h + j, args.out_dtype, db);
        }
    } else {
        for (uint64_t i = tid; i < count; i += stride) {
            uint64_t r = i / h;
            uint32_t j = (uint32_t)(i - r * h);
            float a, b;
            qt_swiglu_ab(&args, r, j, &a, &b);
            float dy = qt_act_load(args.dy, i, args.dy_dtype);
            float da = qt_swiglu_da(a, b, dy), db = qt_swiglu_db(a, dy);
            if (args.amax) {
                act_amax_note<kGrouped>(args, s, table, r * args.cols + j, args.cols,
                                        fmaxf(fabsf(da), fabsf(db)));
            }
            qt_act_store(args.out, r * args.cols + j, args.out_dtype, da);
            qt_act_store(args.out, r * args.cols + h + j, args.out_dtype, db);
        }
    }
    act_amax_finish<kGrouped>(args, s, table);
}

// Dense and grouped outputs have kernels of their own, so that the dense ones keep the registers
// (and the occupancy) they had before grouped outputs came. The grouped ones take dynamic shared
// memory with an amax output: the per-member table (ptx/act.h), 4 x group.count bytes.
#define ACT_KERNEL(symbol, body, grouped)                                   \
    extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)            \
        symbol(const __grid_constant__ act_args args) {                     \
        qt_grid_enter();                                                    \
        extern __shared__ uint32_t act_member_amax[];                       \
        body<grouped>(args, act_member_amax);                               \
    }

// ---------------------------------------------------------------------------------------------
// GELU and SiLU of a BF16 input without a bias through a table (act.h, QT_ACT_LUT_*): dense,
// one block of QT_ACT_LUT_THREADS an SM (op_act picks them for large tensors, whose elements
// repay the table), several chunks a thread in flight (QT_ACT_LUT_UNROLL) so that one block an
// SM keeps enough loads outstanding. Values, amax and element order are the flat kernels'
// (act_fwd_flat, act_bwd_flat). A chunk of aligned BF16 words takes its entries from the words
// with one test for all eight (act_lut_chunk_words); inputs outside the table call the functions
// themselves, out of line (act_lut_miss), so that the table's path stays a few integer
// operations and a shared-memory load an element.

// Chunks a thread loads at once, 96 bytes either way: 6 forward, 3 backward (x and dy). One more
// spills at the 64 registers of 1024-thread blocks.
#define QT_ACT_LUT_UNROLL(backward) ((backward) ? 3u : 6u)

template <uint32_t kAct, bool kBackward>
__device__ __noinline__ float act_lut_miss(float v) {
    return qt_act_lut_value(kAct, kBackward, v);
}

// The table's value at v (a BF16 value), or the function's outside the table.
template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ float act_lut_lookup(const float *table, float v) {
    uint32_t e = qt_act_lut_entry(v);
    return e < QT_ACT_LUT_ENTRIES ? table[e] : act_lut_miss<kAct, kBackward>(v);
}

// Element v forward, or its dx with dy backward.
template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ float act_lut_apply(const float *table, float v, float dy) {
    float f = act_lut_lookup<kAct, kBackward>(table, v);
    return kBackward ? dy * f : f;
}

// A block's table of kAct's values (kBackward: its derivative's) at the table's inputs; the
// caller's barrier publishes it.
template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ void act_lut_fill(float *table) {
    qt_act_table_fill(table, kAct, kBackward, QT_ACT_LUT_THREADS);
}

// The table's values of a chunk of eight BF16 inputs as loaded (xw): the eight entries straight
// from the words with one test for the chunk, and the per-element lookup, with the function
// itself outside the table, only for a chunk with an input outside it.
template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ void act_lut_chunk_values(const float *table, uint4 xw, float f[8]) {
    const uint32_t w[4] = {xw.x, xw.y, xw.z, xw.w};
    uint32_t bytes[4], test = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) test |= qt_act_lut_pair(w[k], &bytes[k]);
    if (test == 0) {  // every input has its entry
#pragma unroll
        for (int k = 0; k < 4; k++) {
            f[2 * k] = qt_act_table_at(table, bytes[k] & 0xFFFFu);
            f[2 * k + 1] = qt_act_table_at(table, bytes[k] >> 16);
        }
        return;
    }
    float v[8];
    act_unpack8_bf16(xw, v);
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = act_lut_lookup<kAct, kBackward>(table, v[k]);
}

// One chunk at element `first`: applies, stores, and merges max |out| of its values into m.
__device__ __forceinline__ void act_lut_store(const act_args &args, const float out[8],
                                              uint64_t first, float &m) {
    m = fmaxf(m, act_max8(out));
    act_store8(args.out, first, args.out_dtype, out);
}

template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ void act_lut_chunk(const act_args &args, const float *table,
                                              const float v[8], const float dy[8],
                                              uint64_t first, float &m) {
    float out[8];
#pragma unroll
    for (int k = 0; k < 8; k++) out[k] = act_lut_apply<kAct, kBackward>(table, v[k], dy[k]);
    act_lut_store(args, out, first, m);
}

// The same for a chunk of BF16 inputs as loaded (xw), through act_lut_chunk_values.
template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ void act_lut_chunk_words(const act_args &args, const float *table,
                                                    uint4 xw, const float dy[8], uint64_t first,
                                                    float &m) {
    float out[8];
    act_lut_chunk_values<kAct, kBackward>(table, xw, out);
    if (kBackward) {
#pragma unroll
        for (int k = 0; k < 8; k++) out[k] = dy[k] * out[k];
    }
    act_lut_store(args, out, first, m);
}

template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ void act_lut_flat(const act_args &args, float *table) {
    act_lut_fill<kAct, kBackward>(table);
    __syncthreads();
    uint64_t count = (uint64_t)args.rows * args.cols;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t scalar_first = 0;
    float m = 0.0f;  // max |out| (NaN skipped); merged only with an amax slot
    bool dy_bf16 = !kBackward || args.dy_dtype == QT_DTYPE_BF16;
    if (act_aligned16(args.x | args.dy | args.out) && dy_bf16) {
        // BF16 inputs: QT_ACT_LUT_UNROLL chunks' loads issued before any of their arithmetic,
        // kept as the loaded words (4 registers a chunk).
        uint64_t chunks = count / 8;
        const uint4 *x = (const uint4 *)(uintptr_t)args.x;
        const uint4 *dy = (const uint4 *)(uintptr_t)args.dy;
        for (uint64_t c = tid; c < chunks; c += QT_ACT_LUT_UNROLL(kBackward) * stride) {
            uint4 xw[QT_ACT_LUT_UNROLL(kBackward)], dw[QT_ACT_LUT_UNROLL(kBackward)];
#pragma unroll
            for (uint32_t u = 0; u < QT_ACT_LUT_UNROLL(kBackward); u++) {
                uint64_t cu = c + u * stride;
                if (cu >= chunks) continue;
                xw[u] = __ldg(x + cu);
                if (kBackward) dw[u] = act_ld16<false>(dy + cu);  // out may be dy
            }
#pragma unroll
            for (uint32_t u = 0; u < QT_ACT_LUT_UNROLL(kBackward); u++) {
                uint64_t cu = c + u * stride;
                if (cu >= chunks) continue;
                float dv[8] = {0};
                if (kBackward) act_unpack8_bf16(dw[u], dv);
                act_lut_chunk_words<kAct, kBackward>(args, table, xw[u], dv, cu * 8, m);
            }
        }
        scalar_first = chunks * 8;
    } else if (act_aligned16(args.x | args.dy | args.out)) {  // FP32 dy
        uint64_t chunks = count / 8;
        for (uint64_t c = tid; c < chunks; c += 2 * stride) {
            uint64_t c2 = c + stride;
            bool two = c2 < chunks;
            float v[8], w[8], dv[8] = {0}, dw[8] = {0};
            act_load8(args.x, c * 8, QT_DTYPE_BF16, v);
            if (two) act_load8(args.x, c2 * 8, QT_DTYPE_BF16, w);
            if (kBackward) {
                act_load8<false>(args.dy, c * 8, args.dy_dtype, dv);
                if (two) act_load8<false>(args.dy, c2 * 8, args.dy_dtype, dw);
            }
            act_lut_chunk<kAct, kBackward>(args, table, v, dv, c * 8, m);
            if (two) act_lut_chunk<kAct, kBackward>(args, table, w, dw, c2 * 8, m);
        }
        scalar_first = chunks * 8;
    }
    for (uint64_t i = scalar_first + tid; i < count; i += stride) {
        float dy = kBackward ? qt_act_load(args.dy, i, args.dy_dtype) : 0.0f;
        float v = act_lut_apply<kAct, kBackward>(table, qt_act_load(args.x, i, QT_DTYPE_BF16), dy);
        m = fmaxf(m, fabsf(v));
        qt_act_store(args.out, i, args.out_dtype, v);
    }
    if (args.amax) act_amax_flush_slot<QT_ACT_LUT_WARPS>(args.amax, args.out_dtype, m);
}

#define ACT_LUT_KERNEL(symbol, backward)                                                  \
    extern "C" __global__ void __launch_bounds__(QT_ACT_LUT_THREADS, 1)                   \
        symbol(const __grid_constant__ act_args args) {                                   \
        qt_grid_enter();                                                                  \
        __shared__ float act_lut_table[QT_ACT_LUT_ENTRIES];                               \
        if (args.act == QT_ACT_GELU) {                                                    \
            act_lut_flat<QT_ACT_GELU, backward>(args, act_lut_table);                     \
        } else {                                                                          \
            act_lut_flat<QT_ACT_SILU, backward>(args, act_lut_table);                     \
        }                                                                                 \
    }

ACT_LUT_KERNEL(qt_act_fwd_lut, false)
ACT_LUT_KERNEL(qt_act_bwd_lut, true)

// SwiGLU of a BF16 input without a bias through SiLU's tables: silu(a) from the forward table
// (y = silu(a) b, db = dy silu(a)) and silu'(a) from the backward one (da = (dy b) silu'(a)), the
// products of qt_swiglu_forward, _da and _db on the tables' values, so the bits are the flat
// kernels' (act_swiglu_fwd, act_swiglu_bwd), amaxes included. The flat kernels evaluate SiLU
// exactly for each element (60 to 70 instructions) and ran at about half of DRAM's bandwidth
// (H100: 175 us forward and 301 us backward on 16384 x 5632, against about 90 and 150 for their
// bytes). One block of QT_ACT_LUT_THREADS an SM, as qt_act_fwd_lut; each thread walks output
// chunks of 8 (a's and b's words, and dy's backward, all loaded before any arithmetic, two
// chunks at a time). op_act takes them for vector-aligned tensors (act_swiglu_vec), a BF16 dy.

// Chunks a thread loads at once: two, one for the grouped backward kernel (two spill its 64
// registers of 1024-thread blocks).
#define QT_ACT_SWIGLU_LUT_UNROLL(backward, grouped) ((backward) && (grouped) ? 1u : 2u)

template <bool kBackward, bool kGrouped>
__device__ __forceinline__ void act_swiglu_lut(const act_args &args, float *silu, float *grad,
                                               uint32_t *amax_table) {
    act_lut_fill<QT_ACT_SILU, false>(silu);
    if (kBackward) act_lut_fill<QT_ACT_SILU, true>(grad);
    __syncthreads();
    act_amax_state s = act_amax_start<kGrouped>(args, amax_table);
    uint32_t h = args.cols / 2;
    uint64_t chunks = act_rows<kGrouped>(args) * h / 8;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint4 *x = (const uint4 *)(uintptr_t)args.x;
    const uint4 *dy = (const uint4 *)(uintptr_t)args.dy;
    constexpr uint32_t kUnroll = QT_ACT_SWIGLU_LUT_UNROLL(kBackward, kGrouped);
    for (uint64_t c = tid; c < chunks; c += kUnroll * stride) {
        uint4 aw[kUnroll], bw[kUnroll], dw[kUnroll];
        uint64_t a_first[kUnroll];  // a's first element in x: row r's columns [0, h)
#pragma unroll
        for (uint32_t u = 0; u < kUnroll; u++) {
            uint64_t cu = c + u * stride;
            if (cu >= chunks) continue;
            uint64_t r = cu * 8 / h;
            a_first[u] = r * args.cols + (cu * 8 - r * h);
            aw[u] = __ldg(x + a_first[u] / 8);
            bw[u] = __ldg(x + (a_first[u] + h) / 8);
            if (kBackward) dw[u] = __ldg(dy + cu);
        }
#pragma unroll
        for (uint32_t u = 0; u < kUnroll; u++) {
            uint64_t cu = c + u * stride;
            if (cu >= chunks) continue;
            uint64_t first = a_first[u];
            float f[8], b[8];
            act_lut_chunk_values<QT_ACT_SILU, false>(silu, aw[u], f);
            act_unpack8_bf16(bw[u], b);
            if (!kBackward) {
                float y[8];
#pragma unroll
                for (int k = 0; k < 8; k++) y[k] = f[k] * b[k];  // qt_swiglu_forward
                if (args.amax) act_amax_note<kGrouped>(args, s, amax_table, cu * 8, h, act_max8(y));
                act_store8(args.out, cu * 8, args.out_dtype, y);
                continue;
            }
            float g[8], d[8], da[8], db[8];
            act_lut_chunk_values<QT_ACT_SILU, true>(grad, aw[u], g);
            act_unpack8_bf16(dw[u], d);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                da[k] = (d[k] * b[k]) * g[k];  // qt_swiglu_da
                db[k] = d[k] * f[k];           // qt_swiglu_db
            }
            if (args.amax) {
                act_amax_note<kGrouped>(args, s, amax_table, first, args.cols,
                                        fmaxf(act_max8(da), act_max8(db)));
            }
            act_store8(args.out, first, args.out_dtype, da);
            act_store8(args.out, first + h, args.out_dtype, db);
        }
    }
    if (!args.amax) return;
    if (kGrouped) {
        act_amax_finish<true>(args, s, amax_table);
    } else {
        act_amax_flush_slot<QT_ACT_LUT_WARPS>(args.amax, args.out_dtype, s.m);
    }
}

// The grouped ones take the per-member amax table as dynamic shared memory (4 x group.count
// bytes), as the flat grouped kernels.
#define ACT_SWIGLU_LUT_KERNEL(symbol, backward, grouped)                                  \
    extern "C" __global__ void __launch_bounds__(QT_ACT_LUT_THREADS, 1)                   \
        symbol(const __grid_constant__ act_args args) {                                   \
        qt_grid_enter();                                                                  \
        __shared__ float act_silu_table[QT_ACT_LUT_ENTRIES];                              \
        __shared__ float act_silu_grad_table[(backward) ? QT_ACT_LUT_ENTRIES : 1];        \
        extern __shared__ uint32_t act_amax_table[];                                      \
        act_swiglu_lut<backward, grouped>(args, act_silu_table, act_silu_grad_table,      \
                                          act_amax_table);                                \
    }

ACT_SWIGLU_LUT_KERNEL(qt_swiglu_fwd_lut, false, false)
ACT_SWIGLU_LUT_KERNEL(qt_swiglu_bwd_lut, true, false)
ACT_SWIGLU_LUT_KERNEL(qt_swiglu_fwd_lut_grouped, false, true)
ACT_SWIGLU_LUT_KERNEL(qt_swiglu_bwd_lut_grouped, true, true)

ACT_KERNEL(qt_act_fwd, act_fwd_of_kind, false)
ACT_KERNEL(qt_act_bwd, act_bwd_of_kind, false)
ACT_KERNEL(qt_swiglu_fwd, act_swiglu_fwd, false)
ACT_KERNEL(qt_swiglu_bwd, act_swiglu_bwd, false)
ACT_KERNEL(qt_act_fwd_grouped, act_fwd_of_kind, true)
ACT_KERNEL(qt_act_bwd_grouped, act_bwd_of_kind, true)
ACT_KERNEL(qt_swiglu_fwd_grouped, act_swiglu_fwd, true)
ACT_KERNEL(qt_swiglu_bwd_grouped, act_swiglu_bwd, true)

// ---------------------------------------------------------------------------------------------
// A split-K GEMM's reduction fused with the activation of its D (act.h, gemm_act_args): thread i
// of the grid takes element i, as qt_gemm_split_reduce does, stores D, and runs the dense
// activation kernels' per-element code on the stored value, so that the pair's two launches
// become one with the same bits (act_pre adds the activation's own bias; the amax is the dense
// kernels' block flush). One element a thread, unlike the chunked act kernels: the parts' loads
// dominate, and the launch is the reduction's. kAct as in act_fwd_flat.
template <uint32_t kAct, bool kBackward>
__device__ __forceinline__ void act_split_reduce(const gemm_act_args &args) {
    const gemm_args &g = args.gemm;
    const act_args &a = args.act;
    const uint64_t elems = (uint64_t)g.m * g.n;
    float alpha = qt_gemm_alpha(&g, 0);
    float amax = 0.0f;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < elems;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float d = qt_gemm_split_element(&g, alpha, i);
        qt_gemm_store_value(g.d, i, g.d_dtype, d);  // ldd = n
        d = qt_gemm_stored_value(d, g.d_dtype);
        float v = kBackward
                      ? qt_act_backward(kAct, act_pre(a, i, qt_act_load(a.x, i, a.x_dtype)), d)
                      : qt_act_forward(kAct, act_pre(a, i, d));
        if (a.amax) amax = fmaxf(amax, fabsf(v));
        qt_act_store(a.out, i, a.out_dtype, v);
    }
    if (a.amax) act_amax_flush(a, amax);
}

template <bool kBackward>
__device__ __forceinline__ void act_split_reduce_of_kind(const gemm_act_args &args) {
    if (args.act.act == QT_ACT_GELU) {
        act_split_reduce<QT_ACT_GELU, kBackward>(args);
    } else if (args.act.act == QT_ACT_SILU) {
        act_split_reduce<QT_ACT_SILU, kBackward>(args);
    } else {
        act_split_reduce<QT_ACT_RELU, kBackward>(args);
    }
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_gemm_split_reduce_act_fwd(const __grid_constant__ gemm_act_args args) {
    qt_grid_enter();
    act_split_reduce_of_kind<false>(args);
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_gemm_split_reduce_act_bwd(const __grid_constant__ gemm_act_args args) {
    qt_grid_enter();
    act_split_reduce_of_kind<true>(args);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm.

__device__ __forceinline__ bool act_rows_vec(uint64_t addresses, uint32_t cols) {
    return act_aligned16(addresses) && cols % QT_ACT_CHUNK == 0;
}

// One warp per row: sum of squares (lane chunks, lane tree), inv, then y from a second read of
// the row (which the first pass left in L1/L2). Returns the max |y| this lane stored.
__device__ __forceinline__ float act_rmsnorm_fwd_row(const rmsnorm_args &args, uint64_t row) {
    uint32_t lane = threadIdx.x % 32, cols = args.cols;
    uint32_t chunks = (cols + QT_ACT_CHUNK - 1) / QT_ACT_CHUNK;
    bool vec = act_rows_vec(args.x | args.gamma | args.out, cols);
    uint64_t base = row * cols;
    float acc = 0.0f;
    for (uint32_t c = lane; c < chunks; c += 32) {
        uint32_t n = act_chunk_len(c, cols);
        float v[8];
        act_load_chunk(args.x, base + c * 8, n, args.x_dtype, vec, v);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) {
            if (k < n) acc = qt_fmaf(v[k], v[k], acc);
        }
    }
    float inv = qt_rmsnorm_inv(act_warp_sum(acc), cols, args.eps);
    if (lane == 0) ((float *)(uintptr_t)args.inv_rms)[row] = qt_act_canonical(inv);
    float m = 0.0f;
    for (uint32_t c = lane; c < chunks; c += 32) {
        uint32_t n = act_chunk_len(c, cols);
        float v[8], g[8];
        act_load_chunk(args.x, base + c * 8, n, args.x_dtype, vec, v);
        act_load_chunk(args.gamma, (uint64_t)c * 8, n, args.gamma_dtype, vec, g);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) v[k] = qt_rmsnorm_y(v[k], inv, g[k]);
        act_store_chunk(args.out, base + c * 8, n, args.out_dtype, vec, v);
        m = act_max_chunk(m, v, n);
    }
    return m;
}

// Rows past the end leave their warps idle rather than return: the amax's flush is a block
// barrier.
extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_rmsnorm_fwd(const __grid_constant__ rmsnorm_args args) {
    qt_grid_enter();
    uint64_t row = act_row();
    float m = row < args.rows ? act_rmsnorm_fwd_row(args, row) : 0.0f;  // warp-uniform
    if (args.amax) act_amax_flush_slot(args.amax, args.out_dtype, m);
}

// The register kernels' row: lane's chunks c = lane + 32 i (c < chunks) of kWords 16-byte words
// each at src (1 for BF16, 2 for FP32), loaded into w[kWords i ...] together.
template <uint32_t kWords = 1>
__device__ __forceinline__ void act_rmsnorm_hold(const uint4 *src, uint32_t lane, uint32_t chunks,
                                                 uint4 (&w)[QT_RMSNORM_REGS_CHUNKS]) {
#pragma unroll
    for (uint32_t i = 0; i < QT_RMSNORM_REGS_CHUNKS / kWords; i++) {
        uint32_t c = lane + 32u * i;
#pragma unroll
        for (uint32_t j = 0; j < kWords; j++) {
            if (c < chunks) w[kWords * i + j] = act_ld16<true>(src + kWords * c + j);
        }
    }
}

// Chunk i of a lane's held row: one word of BF16 x, or (kF32) words 2 i and 2 i + 1 of FP32 x.
template <bool kF32>
__device__ __forceinline__ void act_rmsnorm_held(const uint4 (&w)[QT_RMSNORM_REGS_CHUNKS],
                                                 uint32_t i, float v[8]) {
    if constexpr (kF32) {
        const uint4 a = w[2u * i], b = w[2u * i + 1u];
        v[0] = __uint_as_float(a.x), v[1] = __uint_as_float(a.y);
        v[2] = __uint_as_float(a.z), v[3] = __uint_as_float(a.w);
        v[4] = __uint_as_float(b.x), v[5] = __uint_as_float(b.y);
        v[6] = __uint_as_float(b.z), v[7] = __uint_as_float(b.w);
    } else {
        act_unpack8_bf16(w[i], v);
    }
}

// One row of qt_rmsnorm_fwd_regs. A lane's chunks c = lane + 32 i, i < kChunks, are held as
// the 16-byte words of x: 8 BF16 values a word, or 8 FP32 values in two, so an FP32 row holds
// half the columns. Returns the max |y| this lane stored.
template <bool kF32>
__device__ __forceinline__ float act_rmsnorm_fwd_regs_row(const rmsnorm_args &args,
                                                          uint64_t row) {
    constexpr uint32_t kWords = kF32 ? 2u : 1u;  // 16-byte words a chunk
    constexpr uint32_t kChunks = QT_RMSNORM_REGS_CHUNKS / kWords;
    uint32_t lane = threadIdx.x % 32, cols = args.cols;
    uint32_t chunks = cols / QT_ACT_CHUNK;
    uint64_t base = row * cols;
    const uint4 *x = (const uint4 *)(uintptr_t)args.x + base / QT_ACT_CHUNK * kWords;
    uint4 xw[QT_RMSNORM_REGS_CHUNKS];
    act_rmsnorm_hold<kWords>(x, lane, chunks, xw);
    float acc = 0.0f;
#pragma unroll
    for (uint32_t i = 0; i < kChunks; i++) {
        if (lane + 32u * i >= chunks) break;
        float v[8];
        act_rmsnorm_held<kF32>(xw, i, v);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) acc = qt_fmaf(v[k], v[k], acc);
    }
    float inv = qt_rmsnorm_inv(act_warp_sum(acc), cols, args.eps);
    if (lane == 0) ((float *)(uintptr_t)args.inv_rms)[row] = qt_act_canonical(inv);
    float m = 0.0f;
#pragma unroll
    for (uint32_t i = 0; i < kChunks; i++) {
        uint32_t c = lane + 32u * i;
        if (c >= chunks) break;
        float v[8], g[8];
        act_rmsnorm_held<kF32>(xw, i, v);
        act_load8(args.gamma, (uint64_t)c * 8, args.gamma_dtype, g);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) v[k] = qt_rmsnorm_y(v[k], inv, g[k]);
        act_store8(args.out, base + (uint64_t)c * 8, args.out_dtype, v);
        m = act_max_chunk(m, v, 8);
    }
    return m;
}

// qt_rmsnorm_fwd for rows of whole chunks of BF16 x (at most QT_RMSNORM_REGS_COLS_MAX columns)
// or FP32 x (at most QT_RMSNORM_REGS_COLS_MAX_F32) (op_rmsnorm_forward picks it): each lane
// holds its chunks of x in registers from the sum of squares to y, so DRAM sees each row once;
// the generic kernel reads the row again for y and ran at about half the DRAM bandwidth on 8192 x
// 4096. The same lanes fold the same chunks in the same order, so the bits (y, inv_rms, the
// amax) are the generic kernel's.
extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_rmsnorm_fwd_regs(const __grid_constant__ rmsnorm_args args) {
    qt_grid_enter();
    uint64_t row = act_row();
    float m = 0.0f;  // max |y| this lane stored
    if (row < args.rows) {  // warp-uniform; idle warps still meet the amax flush's barrier
        m = args.x_dtype == QT_DTYPE_F32 ? act_rmsnorm_fwd_regs_row<true>(args, row)
                                         : act_rmsnorm_fwd_regs_row<false>(args, row);
    }
    if (args.amax) act_amax_flush_slot(args.amax, args.out_dtype, m);
}

// Eight values as the BF16 words act_store8 stores (act_unpack8_bf16's inverse).
__device__ __forceinline__ uint4 act_pack8_bf16(const float v[8]) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(w[k]) : "f"(v[2 * k + 1]), "f"(v[2 * k]));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// v[k] as a store of dtype would keep it (act_store8's conversion, qt_act_stored's bits).
__device__ __forceinline__ void act_round8(uint32_t dtype, float v[8]) {
    if (dtype != QT_DTYPE_BF16) {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = qt_act_canonical(v[k]);
        return;
    }
    act_unpack8_bf16(act_pack8_bf16(v), v);
}

// A dx chunk's values v[0 .. n) as the dx kernels store them: dx itself, or with args.skip the
// residual add after it (rmsnorm_args.skip); merges max |out| into m.
__device__ __forceinline__ void act_rmsnorm_dx_out(const rmsnorm_args &args, uint64_t first,
                                                   uint32_t n, bool vec, float v[8], float &m) {
    if (args.skip) {
        float s[8];
        act_round8(args.out_dtype, v);
        act_load_chunk(args.skip, first, n, args.skip_dtype, vec, s);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) v[k] = s[k] + v[k];
    }
    act_store_chunk(args.out, first, n, args.out_dtype, vec, v);
    m = act_max_chunk(m, v, n);
}

// Chunk c (n elements) of a row's x and dy at element base, and gamma's chunk c.
__device__ __forceinline__ void act_rmsnorm_bwd_chunk(const rmsnorm_args &args, uint64_t base,
                                                      uint32_t c, uint32_t n, bool vec,
                                                      float v[8], float dy[8], float g[8]) {
    act_load_chunk(args.x, base + c * 8, n, args.x_dtype, vec, v);
    act_load_chunk(args.dy, base + c * 8, n, args.dy_dtype, vec, dy);
    act_load_chunk(args.gamma, (uint64_t)c * 8, n, args.gamma_dtype, vec, g);
}

// Rows past the end leave their warps idle rather than return: the amax's flush is a block
// barrier.
extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_rmsnorm_bwd_dx(const __grid_constant__ rmsnorm_args args) {
    qt_grid_enter();
    uint64_t row = act_row();
    float m = 0.0f;  // max |out| this lane stored
    if (row < args.rows) {  // warp-uniform
        uint32_t lane = threadIdx.x % 32, cols = args.cols;
        uint32_t chunks = (cols + QT_ACT_CHUNK - 1) / QT_ACT_CHUNK;
        bool vec = act_rows_vec(args.x | args.gamma | args.dy | args.out | args.skip, cols);
        uint64_t base = row * cols;
        float inv = ((const float *)(uintptr_t)args.inv_rms)[row];
        float acc = 0.0f;
        for (uint32_t c = lane; c < chunks; c += 32) {
            uint32_t n = act_chunk_len(c, cols);
            float v[8], dy[8], g[8];
            act_rmsnorm_bwd_chunk(args, base, c, n, vec, v, dy, g);
#pragma unroll
            for (uint32_t k = 0; k < 8; k++) {
                if (k < n) acc = qt_rmsnorm_dot(v[k], dy[k], g[k], inv, acc);
            }
        }
        float mean_dot = qt_rmsnorm_mean_dot(act_warp_sum(acc), cols);
        for (uint32_t c = lane; c < chunks; c += 32) {
            uint32_t n = act_chunk_len(c, cols);
            float v[8], dy[8], g[8];
            act_rmsnorm_bwd_chunk(args, base, c, n, vec, v, dy, g);
#pragma unroll
            for (uint32_t k = 0; k < 8; k++) {
                v[k] = qt_rmsnorm_dx(v[k], dy[k], g[k], inv, mean_dot);
            }
            act_rmsnorm_dx_out(args, base + c * 8, n, vec, v, m);
        }
    }
    if (args.amax) act_amax_flush_slot(args.amax, args.out_dtype, m);
}

// Chunk c of a row held in registers (x and dy as loaded) and gamma's chunk c, as floats.
__device__ __forceinline__ void act_rmsnorm_held_chunk(const rmsnorm_args &args, uint4 xw,
                                                       uint4 dw, uint32_t c, float v[8],
                                                       float d[8], float g[8]) {
    act_unpack8_bf16(xw, v);
    act_unpack8_bf16(dw, d);
    act_load8(args.gamma, (uint64_t)c * 8, args.gamma_dtype, g);
}

// dx of held chunk c (act_rmsnorm_held_chunk) into v.
__device__ __forceinline__ void act_rmsnorm_held_dx(const rmsnorm_args &args, uint4 xw, uint4 dw,
                                                    uint32_t c, float inv, float mean_dot,
                                                    float v[8]) {
    float d[8], g[8];
    act_rmsnorm_held_chunk(args, xw, dw, c, v, d, g);
#pragma unroll
    for (uint32_t k = 0; k < 8; k++) v[k] = qt_rmsnorm_dx(v[k], d[k], g[k], inv, mean_dot);
}

// qt_rmsnorm_bwd_dx for rows of whole chunks of BF16 x and dy, at most QT_RMSNORM_REGS_COLS_MAX
// columns (op_rmsnorm_backward picks it): each lane holds its chunks of x and dy in registers
// from the first pass to the second, so DRAM sees each row once. The generic kernel reads the
// row again for the second pass, from L2 at best: on 8192 x 4096 it ran at about a third of the
// DRAM bandwidth. The same lanes fold the same chunks in the same order (act.h), so the bits are
// the generic kernel's.
extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_rmsnorm_bwd_dx_regs(const __grid_constant__ rmsnorm_args args) {
    qt_grid_enter();
    uint64_t row = act_row();
    float m = 0.0f;  // max |out| this lane stored
    if (row < args.rows) {  // warp-uniform; idle warps still meet the amax flush's barrier
        uint32_t lane = threadIdx.x % 32, cols = args.cols;
        uint32_t chunks = cols / QT_ACT_CHUNK;
        uint64_t base = row * cols;
        float inv = ((const float *)(uintptr_t)args.inv_rms)[row];
        const uint4 *x = (const uint4 *)(uintptr_t)args.x + base / QT_ACT_CHUNK;
        const uint4 *dy = (const uint4 *)(uintptr_t)args.dy + base / QT_ACT_CHUNK;
        uint4 xw[QT_RMSNORM_REGS_CHUNKS], dw[QT_RMSNORM_REGS_CHUNKS];
#pragma unroll
        for (uint32_t i = 0; i < QT_RMSNORM_REGS_CHUNKS; i++) {
            uint32_t c = lane + 32u * i;
            if (c < chunks) {
                xw[i] = act_ld16<true>(x + c);
                dw[i] = act_ld16<true>(dy + c);
            }
        }
        float acc = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < QT_RMSNORM_REGS_CHUNKS; i++) {
            uint32_t c = lane + 32u * i;
            if (c >= chunks) break;
            float v[8], d[8], g[8];
            act_rmsnorm_held_chunk(args, xw[i], dw[i], c, v, d, g);
#pragma unroll
            for (uint32_t k = 0; k < 8; k++) acc = qt_rmsnorm_dot(v[k], d[k], g[k], inv, acc);
        }
        float mean_dot = qt_rmsnorm_mean_dot(act_warp_sum(acc), cols);
        if (!args.skip) {
#pragma unroll
            for (uint32_t i = 0; i < QT_RMSNORM_REGS_CHUNKS; i++) {
                uint32_t c = lane + 32u * i;
                if (c >= chunks) break;
                float v[8];
                act_rmsnorm_held_dx(args, xw[i], dw[i], c, inv, mean_dot, v);
                act_rmsnorm_dx_out(args, base + (uint64_t)c * 8, 8, true, v, m);
            }
        } else {
            // With the skip gradient (BF16, as out: op_rmsnorm_dx_kernel): every chunk's dx,
            // rounded to BF16 as its tensor would hold it, packed over x's words; then every
            // chunk's skip loaded over dy's, so that those loads are in flight together, as
            // the row's were; then the sums.
#pragma unroll
            for (uint32_t i = 0; i < QT_RMSNORM_REGS_CHUNKS; i++) {
                uint32_t c = lane + 32u * i;
                if (c >= chunks) break;
                float v[8];
                act_rmsnorm_held_dx(args, xw[i], dw[i], c, inv, mean_dot, v);
                xw[i] = act_pack8_bf16(v);
            }
            const uint4 *skip = (const uint4 *)(uintptr_t)args.skip + base / QT_ACT_CHUNK;
            act_rmsnorm_hold(skip, lane, chunks, dw);
#pragma unroll
            for (uint32_t i = 0; i < QT_RMSNORM_REGS_CHUNKS; i++) {
                uint32_t c = lane + 32u * i;
                if (c >= chunks) break;
                float v[8], s[8];
                act_unpack8_bf16(xw[i], v);
                act_unpack8_bf16(dw[i], s);
#pragma unroll
                for (uint32_t k = 0; k < 8; k++) v[k] = s[k] + v[k];
                act_store8(args.out, base + (uint64_t)c * 8, QT_DTYPE_BF16, v);
                m = act_max_chunk(m, v, 8);
            }
        }
    }
    if (args.amax) act_amax_flush_slot(args.amax, args.out_dtype, m);
}

// Column c of part p (blockIdx.y): rows in order from +0. Consecutive threads read consecutive
// columns of a row, so each row's loads coalesce.
extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_rmsnorm_dgamma_partial(const __grid_constant__ rmsnorm_args args) {
    qt_grid_enter();
    uint32_t col = blockIdx.x * QT_ACT_THREADS + threadIdx.x;
    if (col >= args.cols) return;
    uint64_t first = (uint64_t)blockIdx.y * args.rows_per_part;
    uint64_t end = first + args.rows_per_part;
    if (end > args.rows) end = args.rows;
    const float *inv = (const float *)(uintptr_t)args.inv_rms;
    float acc = 0.0f;
    for (uint64_t r = first; r < end; r++) {
        uint64_t i = r * args.cols + col;
        float x = qt_act_load(args.x, i, args.x_dtype);
        float dy = qt_act_load(args.dy, i, args.dy_dtype);
        acc = qt_rmsnorm_dgamma_step(x, dy, inv[r], acc);
    }
    float *partials = (float *)(uintptr_t)args.partials;
    partials[(uint64_t)blockIdx.y * args.cols + col] = qt_act_canonical(acc);
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_rmsnorm_dgamma_final(const __grid_constant__ rmsnorm_args args) {
    qt_grid_enter();
    uint32_t col = blockIdx.x * QT_ACT_THREADS + threadIdx.x;
    if (col >= args.cols) return;
    const float *partials = (const float *)(uintptr_t)args.partials;
    float *dgamma = (float *)(uintptr_t)args.dgamma;
    float acc = partials[col];
    for (uint32_t p = 1; p < args.parts; p++) acc = acc + partials[(uint64_t)p * args.cols + col];
    if (args.accumulate) acc = dgamma[col] + acc;
    dgamma[col] = qt_act_canonical(acc);
}

// ---------------------------------------------------------------------------------------------
// Residual add.

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_residual_add(const __grid_constant__ residual_args args) {
    qt_grid_enter();
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t scalar_first = 0;
    float m = 0.0f;  // max |y| this thread stored (residual_args.amax)
    if (act_aligned16(args.a | args.b | args.y)) {
        for (uint64_t c = tid; c < args.count / 8; c += stride) {
            float a[8], b[8];
            act_load8(args.a, c * 8, args.a_dtype, a);
            if (args.b) {
                act_load8(args.b, c * 8, args.b_dtype, b);
#pragma unroll
                for (int k = 0; k < 8; k++) a[k] = a[k] + b[k];
            }
            act_store8(args.y, c * 8, args.y_dtype, a);
            m = act_max_chunk(m, a, 8);
        }
        scalar_first = args.count / 8 * 8;
    }
    for (uint64_t i = scalar_first + tid; i < args.count; i += stride) {
        float a = qt_act_load(args.a, i, args.a_dtype);
        if (args.b) a = a + qt_act_load(args.b, i, args.b_dtype);
        qt_act_store(args.y, i, args.y_dtype, a);
        m = fmaxf(m, fabsf(a));
    }
    if (args.amax) act_amax_flush_slot(args.amax, args.y_dtype, m);
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy.

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_xent_count(const __grid_constant__ xent_args args) {
    qt_grid_enter();
    uint32_t valid = 0;
    for (uint32_t r = threadIdx.x; r < args.rows; r += QT_ACT_THREADS) {
        valid += qt_xent_label(args.labels, r, args.classes) >= 0;
    }
    valid = act_block_count(valid);
    if (threadIdx.x == 0) ((qt_loss_stats *)(uintptr_t)args.stats)->valid = valid;
}

// One row by one warp: (max, argmax), then the sum of exponentials, then dlogits. Returns the
// row's loss (0 when ignored); *correct says whether the argmax is the label, *dmax is raised to
// the max |dlogit| this lane stored.
__device__ float act_xent_row(const xent_args &a, uint64_t row, uint32_t *correct,
                              float *dmax) {
    uint32_t lane = threadIdx.x % 32, classes = a.classes;
    int32_t label = qt_xent_label(a.labels, row, classes);
    *correct = 0;
    if (label < 0) {  // ignored row: zero gradient, no loss
        float zero[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        uint32_t chunks = (classes + QT_ACT_CHUNK - 1) / QT_ACT_CHUNK;
        bool vec = act_rows_vec(a.dlogits, classes);
        for (uint32_t c = lane; a.dlogits && c < chunks; c += 32) {
            uint64_t first = row * classes + (uint64_t)c * 8;
            act_store_chunk(a.dlogits, first, act_chunk_len(c, classes), a.dlogits_dtype, vec,
                            zero);
        }
        return 0.0f;
    }
    uint32_t chunks = (classes + QT_ACT_CHUNK - 1) / QT_ACT_CHUNK;
    bool vec = act_rows_vec(a.logits | a.dlogits, classes);
    uint64_t base = row * classes;
    qt_xent_best best = {QT_ACT_NEG_INF, QT_XENT_NONE};
    for (uint32_t c = lane; c < chunks; c += 32) {
        uint32_t n = act_chunk_len(c, classes);
        float v[8];
        act_load_chunk(a.logits, base + c * 8, n, a.logits_dtype, vec, v);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) {
            qt_xent_best e = {v[k], c * 8 + k};
            if (k < n) best = qt_xent_best_combine(best, e);
        }
    }
    best = act_warp_best(best);
    float acc = 0.0f;
    for (uint32_t c = lane; c < chunks; c += 32) {
        uint32_t n = act_chunk_len(c, classes);
        float v[8];
        act_load_chunk(a.logits, base + c * 8, n, a.logits_dtype, vec, v);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) {
            if (k < n) acc = acc + qt_expf(v[k] - best.value);
        }
    }
    float sum_exp = act_warp_sum(acc);
    float z_label = qt_act_load(a.logits, base + (uint32_t)label, a.logits_dtype);
    *correct = best.index == (uint32_t)label;
    if (a.dlogits) {
        float valid = (float)((const qt_loss_stats *)(uintptr_t)a.stats)->valid;
        for (uint32_t c = lane; c < chunks; c += 32) {
            uint32_t n = act_chunk_len(c, classes);
            float v[8];
            act_load_chunk(a.logits, base + c * 8, n, a.logits_dtype, vec, v);
#pragma unroll
            for (uint32_t k = 0; k < 8; k++) {
                int is_label = c * 8 + k == (uint32_t)label;
                v[k] = qt_xent_dlogit(v[k], best.value, sum_exp, is_label, valid);
            }
            act_store_chunk(a.dlogits, base + c * 8, n, a.dlogits_dtype, vec, v);
            *dmax = act_max_chunk(*dmax, v, n);
        }
    }
    return qt_xent_row_loss(best.value, z_label, sum_exp);
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_xent_rows(const __grid_constant__ xent_args args) {
    qt_grid_enter();
    __shared__ float row_loss[QT_ACT_ROWS_PER_BLOCK];
    __shared__ uint32_t row_correct[QT_ACT_ROWS_PER_BLOCK];
    uint64_t row = act_row();
    uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float loss = 0.0f, dmax = 0.0f;
    uint32_t correct = 0;
    if (row < args.rows) {  // warp-uniform
        loss = act_xent_row(args, row, &correct, &dmax);
        if (args.loss && lane == 0) ((float *)(uintptr_t)args.loss)[row] = qt_act_canonical(loss);
    }
    if (args.dlogits_amax) act_amax_flush_slot(args.dlogits_amax, args.dlogits_dtype, dmax);
    if (lane == 0) {
        row_loss[warp] = loss;
        row_correct[warp] = correct;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    float sum = row_loss[0];
    uint32_t hits = row_correct[0];
    for (uint32_t w = 1; w < QT_ACT_ROWS_PER_BLOCK; w++) {
        sum = sum + row_loss[w];
        hits += row_correct[w];
    }
    ((float *)(uintptr_t)args.partials)[blockIdx.x] = qt_act_canonical(sum);
    ((uint32_t *)(uintptr_t)args.partials)[args.blocks + blockIdx.x] = hits;
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_xent_final(const __grid_constant__ xent_args args) {
    qt_grid_enter();
    float sum = act_final_sum(args.partials, args.blocks);
    const uint32_t *hits = (const uint32_t *)(uintptr_t)args.partials + args.blocks;
    uint32_t correct = 0;
    for (uint32_t i = threadIdx.x; i < args.blocks; i += QT_ACT_THREADS) correct += hits[i];
    correct = act_block_count(correct);
    if (threadIdx.x != 0) return;
    qt_loss_stats *stats = (qt_loss_stats *)(uintptr_t)args.stats;
    stats->loss_sum = qt_act_canonical(sum);
    stats->loss_mean = qt_act_canonical(qt_loss_mean(sum, (float)stats->valid));
    stats->correct = correct;
}

// ---------------------------------------------------------------------------------------------
// Mean squared error.

// *dmax is raised to the max |dpred| this lane stored.
__device__ float act_mse_row(const mse_args &a, uint64_t row, uint32_t valid, float *dmax) {
    uint32_t lane = threadIdx.x % 32, cols = a.cols;
    uint32_t chunks = (cols + QT_ACT_CHUNK - 1) / QT_ACT_CHUNK;
    bool vec = act_rows_vec(a.pred | a.target | a.dpred, cols);
    bool is_valid = row < valid;
    float n = (float)((uint64_t)valid * cols);
    uint64_t base = row * cols;
    float acc = 0.0f;
    for (uint32_t c = lane; c < chunks; c += 32) {
        uint32_t len = act_chunk_len(c, cols);
        float p[8], t[8];
        act_load_chunk(a.pred, base + c * 8, len, a.pred_dtype, vec, p);
        act_load_chunk(a.target, base + c * 8, len, a.target_dtype, vec, t);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) {
            float d = p[k] - t[k];
            if (k < len && is_valid) acc = qt_fmaf(d, d, acc);
            p[k] = is_valid ? qt_mse_dpred(d, n) : 0.0f;
        }
        if (a.dpred) {
            act_store_chunk(a.dpred, base + c * 8, len, a.dpred_dtype, vec, p);
            *dmax = act_max_chunk(*dmax, p, len);
        }
    }
    return act_warp_sum(acc);
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_mse_rows(const __grid_constant__ mse_args args) {
    qt_grid_enter();
    __shared__ float row_sum[QT_ACT_ROWS_PER_BLOCK];
    uint64_t row = act_row();
    uint32_t valid = qt_mse_valid(args.valid_rows, args.rows);
    float sum = 0.0f, dmax = 0.0f;
    if (row < args.rows) sum = act_mse_row(args, row, valid, &dmax);  // warp-uniform
    if (args.dpred_amax) act_amax_flush_slot(args.dpred_amax, args.dpred_dtype, dmax);
    if (threadIdx.x % 32 == 0) row_sum[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x != 0) return;
    float acc = row_sum[0];
    for (uint32_t w = 1; w < QT_ACT_ROWS_PER_BLOCK; w++) acc = acc + row_sum[w];
    ((float *)(uintptr_t)args.partials)[blockIdx.x] = qt_act_canonical(acc);
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_mse_final(const __grid_constant__ mse_args args) {
    qt_grid_enter();
    float sum = act_final_sum(args.partials, args.blocks);
    if (threadIdx.x != 0) return;
    uint32_t valid = qt_mse_valid(args.valid_rows, args.rows);
    qt_loss_stats *stats = (qt_loss_stats *)(uintptr_t)args.stats;
    stats->loss_sum = qt_act_canonical(sum);
    stats->loss_mean = qt_act_canonical(qt_loss_mean(sum, (float)((uint64_t)valid * args.cols)));
    stats->valid = valid;
    stats->correct = 0;
}

// ---------------------------------------------------------------------------------------------
// One-block losses: a row per thread, the values of the split kernels in their orders (act.h).

#define ACT_SMALL_LANES (QT_LOSS_SMALL_COLS_MAX / QT_ACT_CHUNK)
QT_STATIC_ASSERT(ACT_SMALL_LANES <= QT_ACT_LANES, "a lane owns one chunk of a small row");

// The lane tree of act_warp_sum on the 8 lanes of a small row. Lanes 8..31 hold +0, so the
// levels m = 16 and 8 add +0 to lanes 0..7 (kept: the warp adds them, and x + 0 is not x for
// x = -0); levels 4, 2, 1 pair the lanes as the warp does.
QT_STATIC_ASSERT(ACT_SMALL_LANES == 8, "the tree below is written out for 8 lanes");
__device__ __forceinline__ float act_small_tree_sum(float l0, float l1, float l2, float l3,
                                                    float l4, float l5, float l6, float l7) {
    const float zero = 0.0f;
    l0 = (l0 + zero) + zero, l1 = (l1 + zero) + zero, l2 = (l2 + zero) + zero;
    l3 = (l3 + zero) + zero, l4 = (l4 + zero) + zero, l5 = (l5 + zero) + zero;
    l6 = (l6 + zero) + zero, l7 = (l7 + zero) + zero;
    l0 = l0 + l4, l1 = l1 + l5, l2 = l2 + l6, l3 = l3 + l7;
    l0 = l0 + l2, l1 = l1 + l3;
    return l0 + l1;
}

// The split path's block and final reductions over per-row values in shared memory: block b of
// the row pass adds rows 8b..8b+7 in order (rows past the end hold +0, as idle warps give), its
// partial is stored canonical, and the final pass folds partials t, t + 256, ... from +0 per
// thread, then act_block_sum. Called by every thread; the total is valid in every thread.
__device__ float act_small_total(const float *row_value, uint32_t blocks) {
    float acc = 0.0f;
    for (uint32_t b = threadIdx.x; b < blocks; b += QT_ACT_THREADS) {
        const float *r = row_value + b * QT_ACT_ROWS_PER_BLOCK;
        float sum = r[0];
        for (uint32_t w = 1; w < QT_ACT_ROWS_PER_BLOCK; w++) sum = sum + r[w];
        acc = acc + qt_act_canonical(sum);
    }
    return act_block_sum(acc);
}

// The softmax terms of one row as act_xent_row has them, by one thread: (max, argmax) in index
// order (the combination is order-free), the exponentials per lane, then the lane tree.
struct act_xent_terms {
    qt_xent_best best;
    float sum_exp;
};

__device__ act_xent_terms act_xent_terms_thread(const xent_args &a, uint64_t base) {
    act_xent_terms t = {{QT_ACT_NEG_INF, QT_XENT_NONE}, 0.0f};
    for (uint32_t j = 0; j < a.classes; j++) {
        qt_xent_best e = {qt_act_load(a.logits, base + j, a.logits_dtype), j};
        t.best = qt_xent_best_combine(t.best, e);
    }
    float lane[ACT_SMALL_LANES];
#pragma unroll
    for (uint32_t l = 0; l < ACT_SMALL_LANES; l++) {
        float acc = 0.0f;
        for (uint32_t j = l * QT_ACT_CHUNK; j < (l + 1) * QT_ACT_CHUNK && j < a.classes; j++) {
            acc = acc + qt_expf(qt_act_load(a.logits, base + j, a.logits_dtype) - t.best.value);
        }
        lane[l] = acc;
    }
    t.sum_exp = act_small_tree_sum(lane[0], lane[1], lane[2], lane[3], lane[4], lane[5],
                                   lane[6], lane[7]);
    return t;
}

// Per-row results of qt_xent_small's row phase.
struct act_xent_small_rows {
    float loss[QT_LOSS_SMALL_ROWS_MAX];     // 0 for ignored rows and rows past the end
    float max[QT_LOSS_SMALL_ROWS_MAX];
    float sum_exp[QT_LOSS_SMALL_ROWS_MAX];
    int32_t label[QT_LOSS_SMALL_ROWS_MAX];  // -1: ignored
    uint8_t correct[QT_LOSS_SMALL_ROWS_MAX];
};

// Row r's loss, softmax terms and hit, by one thread (act_xent_row without the dlogits).
__device__ void act_xent_row_thread(const xent_args &a, uint32_t r, act_xent_small_rows &rows) {
    float loss = 0.0f;
    int32_t label = -1;
    uint32_t correct = 0;
    if (r < a.rows) label = qt_xent_label(a.labels, r, a.classes);
    if (label >= 0) {
        uint64_t base = (uint64_t)r * a.classes;
        act_xent_terms t = act_xent_terms_thread(a, base);
        float z_label = qt_act_load(a.logits, base + (uint32_t)label, a.logits_dtype);
        correct = t.best.index == (uint32_t)label;
        loss = qt_xent_row_loss(t.best.value, z_label, t.sum_exp);
        rows.max[r] = t.best.value;
        rows.sum_exp[r] = t.sum_exp;
    }
    if (a.loss && r < a.rows) ((float *)(uintptr_t)a.loss)[r] = qt_act_canonical(loss);
    rows.loss[r] = loss;
    rows.label[r] = label;
    rows.correct[r] = (uint8_t)correct;
}

// Thread t takes rows t, t + 256, ...; then the block writes dlogits element by element (every
// thread busy whatever the row count) and reduces the per-row values in the orders of
// qt_xent_rows and qt_xent_final.
extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_xent_small(const __grid_constant__ xent_args args) {
    qt_grid_enter();
    __shared__ act_xent_small_rows rows;
    uint32_t valid = 0;
    for (uint32_t r = threadIdx.x; r < args.rows; r += QT_ACT_THREADS) {
        valid += qt_xent_label(args.labels, r, args.classes) >= 0;
    }
    valid = act_block_count(valid);
    for (uint32_t r = threadIdx.x; r < args.blocks * QT_ACT_ROWS_PER_BLOCK;
         r += QT_ACT_THREADS) {
        act_xent_row_thread(args, r, rows);
    }
    __syncthreads();
    uint32_t count = args.rows * args.classes;
    float dmax = 0.0f;
    for (uint32_t e = threadIdx.x; args.dlogits && e < count; e += QT_ACT_THREADS) {
        uint32_t r = e / args.classes, j = e - r * args.classes;
        int32_t label = rows.label[r];
        float d = 0.0f;  // ignored row: zero gradient
        if (label >= 0) {
            float z = qt_act_load(args.logits, e, args.logits_dtype);
            d = qt_xent_dlogit(z, rows.max[r], rows.sum_exp[r], j == (uint32_t)label,
                               (float)valid);
        }
        qt_act_store(args.dlogits, e, args.dlogits_dtype, d);
        dmax = fmaxf(dmax, fabsf(d));
    }
    if (args.dlogits_amax) act_amax_flush_slot(args.dlogits_amax, args.dlogits_dtype, dmax);
    float sum = act_small_total(rows.loss, args.blocks);
    uint32_t hits = 0;
    for (uint32_t r = threadIdx.x; r < args.rows; r += QT_ACT_THREADS) hits += rows.correct[r];
    hits = act_block_count(hits);
    if (threadIdx.x != 0) return;
    qt_loss_stats *stats = (qt_loss_stats *)(uintptr_t)args.stats;
    stats->valid = valid;
    stats->loss_sum = qt_act_canonical(sum);
    stats->loss_mean = qt_act_canonical(qt_loss_mean(sum, (float)valid));
    stats->correct = hits;
}

// act_mse_row by one thread.
__device__ float act_mse_row_thread(const mse_args &a, uint32_t row, uint32_t valid,
                                    float *dmax) {
    uint32_t cols = a.cols;
    bool is_valid = row < valid;
    float n = (float)((uint64_t)valid * cols);
    uint64_t base = (uint64_t)row * cols;
    float lane[ACT_SMALL_LANES];
#pragma unroll
    for (uint32_t l = 0; l < ACT_SMALL_LANES; l++) {
        float acc = 0.0f;
        for (uint32_t j = l * QT_ACT_CHUNK; j < (l + 1) * QT_ACT_CHUNK && j < cols; j++) {
            float d = qt_act_load(a.pred, base + j, a.pred_dtype) -
                      qt_act_load(a.target, base + j, a.target_dtype);
            if (is_valid) acc = qt_fmaf(d, d, acc);
            if (a.dpred) {
                float g = is_valid ? qt_mse_dpred(d, n) : 0.0f;
                qt_act_store(a.dpred, base + j, a.dpred_dtype, g);
                *dmax = fmaxf(*dmax, fabsf(g));
            }
        }
        lane[l] = acc;
    }
    return act_small_tree_sum(lane[0], lane[1], lane[2], lane[3], lane[4], lane[5], lane[6],
                              lane[7]);
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_mse_small(const __grid_constant__ mse_args args) {
    qt_grid_enter();
    __shared__ float row_sum[QT_LOSS_SMALL_ROWS_MAX];
    uint32_t valid = qt_mse_valid(args.valid_rows, args.rows);
    float dmax = 0.0f;
    for (uint32_t r = threadIdx.x; r < args.blocks * QT_ACT_ROWS_PER_BLOCK;
         r += QT_ACT_THREADS) {
        row_sum[r] = r < args.rows ? act_mse_row_thread(args, r, valid, &dmax) : 0.0f;
    }
    if (args.dpred_amax) act_amax_flush_slot(args.dpred_amax, args.dpred_dtype, dmax);
    __syncthreads();
    float sum = act_small_total(row_sum, args.blocks);
    if (threadIdx.x != 0) return;
    qt_loss_stats *stats = (qt_loss_stats *)(uintptr_t)args.stats;
    stats->loss_sum = qt_act_canonical(sum);
    stats->loss_mean = qt_act_canonical(qt_loss_mean(sum, (float)((uint64_t)valid * args.cols)));
    stats->valid = valid;
    stats->correct = 0;
}

// ---------------------------------------------------------------------------------------------
// Global gradient norm.

// act_final_sum's order, loading around L1: the partials were written by other blocks of this
// launch, and L1 is not coherent across SMs.
__device__ float act_final_sum_cg(uint64_t partials, uint32_t count) {
    const float *p = (const float *)(uintptr_t)partials;
    float acc = 0.0f;
    for (uint32_t i = threadIdx.x; i < count; i += QT_ACT_THREADS) acc = acc + __ldcg(p + i);
    return act_block_sum(acc);
}

extern "C" __global__ void __launch_bounds__(QT_ACT_THREADS)
    qt_gnorm(const __grid_constant__ gnorm_args args) {
    qt_grid_enter();
    uint32_t region = qt_gnorm_region(&args, blockIdx.x);
    uint64_t count = args.count[region];
    uint64_t block_first = (uint64_t)(blockIdx.x - args.first_block[region]) *
                           QT_GNORM_BLOCK_ELEMS;
    bool vec = act_aligned16(args.src[region]);
    const float *src = (const float *)(uintptr_t)args.src[region];
    float acc = 0.0f;
    uint32_t nonfinite = 0;
    if ((args.units >> region) & 1u) {
        // A region of norm units: sums, then flags (whole units, so no square and no test).
        const uint32_t *unit_flags = (const uint32_t *)(src + count);
        for (uint32_t k = 0; k < QT_GNORM_BLOCK_ELEMS / (QT_ACT_THREADS * 4); k++) {
            uint64_t first = block_first + ((uint64_t)k * QT_ACT_THREADS + threadIdx.x) * 4;
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
                if (first + e < count) {
                    acc = acc + src[first + e];
                    nonfinite |= unit_flags[first + e];
                }
            }
        }
    } else {
#pragma unroll 2
        for (uint32_t k = 0; k < QT_GNORM_BLOCK_ELEMS / (QT_ACT_THREADS * 4); k++) {
            uint64_t first = block_first + ((uint64_t)k * QT_ACT_THREADS + threadIdx.x) * 4;
            float v[4];
            uint64_t left = first < count ? count - first : 0;
            uint32_t n = left < 4 ? (uint32_t)left : 4u;
            if (vec && n == 4) {
                float4 q = __ldg((const float4 *)(src + first));
                v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
            } else {
#pragma unroll
                for (uint32_t e = 0; e < 4; e++) v[e] = e < n ? src[first + e] : 0.0f;
            }
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
                if (e < n) {
                    acc = qt_fmaf(v[e], v[e], acc);
                    nonfinite |= qt_f32_nonfinite(v[e]);
                }
            }
        }
    }
    float sum = act_block_sum(acc);
    nonfinite = __syncthreads_or(nonfinite);
    float *partials = (float *)(uintptr_t)args.partials;
    uint32_t *flags = (uint32_t *)(partials + args.total);
    __shared__ uint32_t folds;
    if (threadIdx.x == 0) {
        partials[args.base + blockIdx.x] = qt_act_canonical(sum);
        flags[args.base + blockIdx.x] = nonfinite ? 1u : 0u;
        folds = 0;
        if (args.out != 0) {
            __threadfence();  // this block's partial before its ticket
            uint32_t ticket = atomicAdd((uint32_t *)(uintptr_t)args.ticket, 1u);
            folds = ticket == gridDim.x - 1 ? 1u : 0u;
        }
    }
    __syncthreads();
    if (!folds) return;
    __threadfence();  // every other block's partial, published before its ticket, is visible
    float total = act_final_sum_cg(args.partials, args.total);
    uint32_t any = 0;
    for (uint32_t i = threadIdx.x; i < args.total; i += QT_ACT_THREADS) any |= __ldcg(flags + i);
    any = __syncthreads_or(any);
    if (threadIdx.x != 0) return;
    float norm = qt_sqrtf(total);
    qt_gnorm_result *out = (qt_gnorm_result *)(uintptr_t)args.out;
    out->norm = qt_act_canonical(norm);
    out->clip_factor = qt_act_canonical(qt_gnorm_clip_factor(norm, args.clip));
    out->nonfinite = any ? 1u : 0u;
    out->reserved = 0;
    *(uint32_t *)(uintptr_t)args.ticket = 0;  // the next step's launch starts from 0
    if (args.begin_state != 0) {  // this thread wrote out: it reads its own stores
        qt_optim_begin_apply((uint64_t *)(uintptr_t)args.begin_steps,
                             (optim_state *)(uintptr_t)args.begin_state,
                             (const optim_grad_norm *)out,
                             (const optim_lr_row *)(uintptr_t)args.begin_lr_rows, args.begin_rows);
        if (args.begin_zero != 0) {
            qt_optim_zero_amaxes((const optim_multi_entry *)(uintptr_t)args.begin_zero,
                                 args.begin_zero_count);
        }
    }
}
