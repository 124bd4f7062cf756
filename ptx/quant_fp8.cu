// quant_fp8 kernels: amax, fused cast + transpose, transpose of codes, delayed-scaling updates,
// dequantize (ABI, launch constants and the arithmetic shared with the C twins in quant_fp8.h).
#include "ptx/quant_fp8.h"
#include "ptx/act_math.h"    // the activation tables of qt_fp8_act_cast_*
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

// 1 converts with the shared software codec instead of cvt.rn.satfinite. Both give the same
// bytes (checked bit for bit on H100); the switch exists to bisect a mismatch.
#ifndef QT_FP8_SOFTWARE_CVT
#define QT_FP8_SOFTWARE_CVT 0
#endif

#define QT_FP8_FULL_MASK 0xFFFFFFFFu

// ---------------------------------------------------------------------------------------------
// Element access: 8 consecutive input elements per item, 16-byte loads where possible.

// Two FP32 values -> two codes in the low 16 bits, `lo` in bits 7:0.
template <bool kE5M2>
__device__ __forceinline__ uint32_t qt_fp8_cvt2(float lo, float hi) {
#if QT_FP8_SOFTWARE_CVT
    uint32_t fp8 = kE5M2 ? QT_FP8_E5M2 : QT_FP8_E4M3;
    return (uint32_t)qt_fp8_encode(lo, fp8) | ((uint32_t)qt_fp8_encode(hi, fp8) << 8);
#else
    // NOTE: cvt's first source lands in the upper byte of the destination.
    unsigned short out;
    if (kE5M2) {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
    }
    return out;
#endif
}

template <typename In>
struct qt_fp8_vec8;

// 8 BF16 values in one 16-byte word; element j is the (j % 2) half of word j / 2. BF16 -> FP32
// is exact (a shift), so amaxes and products see the input values themselves. Loads go through
// __ldg: evict-first (__ldcs) and L1::no_allocate loads each made the cast 5% slower (H200).
template <>
struct qt_fp8_vec8<uint16_t> {
    uint4 w;
    __device__ __forceinline__ void zero() { w = make_uint4(0, 0, 0, 0); }
    __device__ __forceinline__ void load(const uint16_t *p) { w = __ldg((const uint4 *)p); }
    __device__ __forceinline__ void load_partial(const uint16_t *p, uint32_t n) {
        uint32_t h[8];
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) h[j] = j < n ? p[j] : 0u;
        w = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16,
                       h[6] | h[7] << 16);
    }
    __device__ __forceinline__ float get(uint32_t j) const {
        uint32_t word = j < 2 ? w.x : j < 4 ? w.y : j < 6 ? w.z : w.w;
        return __uint_as_float(j % 2 ? word & 0xFFFF0000u : word << 16);
    }
};

template <>
struct qt_fp8_vec8<float> {
    float4 a, b;
    __device__ __forceinline__ void zero() {
        a = make_float4(0, 0, 0, 0);
        b = a;
    }
    __device__ __forceinline__ void load(const float *p) {
        a = __ldg((const float4 *)p);
        b = __ldg((const float4 *)p + 1);
    }
    __device__ __forceinline__ void load_partial(const float *p, uint32_t n) {
        float f[8];
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) f[j] = j < n ? p[j] : 0.0f;
        a = make_float4(f[0], f[1], f[2], f[3]);
        b = make_float4(f[4], f[5], f[6], f[7]);
    }
    __device__ __forceinline__ float get(uint32_t j) const {
        float4 h = j < 4 ? a : b;
        uint32_t q = j % 4;
        return q == 0 ? h.x : q == 1 ? h.y : q == 2 ? h.z : h.w;
    }
};

__device__ __forceinline__ float qt_fp8_warp_max(float v) {
#pragma unroll
    for (uint32_t o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(QT_FP8_FULL_MASK, v, o));
    return v;
}

// Max over the block (blockDim.x = 8 warps); the result is valid in thread 0. `scratch` holds 8
// floats and is free again when this returns (the trailing barrier), so loops may reuse it.
__device__ float qt_fp8_block_max(float v, float *scratch) {
    v = qt_fp8_warp_max(v);
    if ((threadIdx.x & 31u) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = 0.0f;
    if (threadIdx.x == 0) {
        for (uint32_t w = 0; w < blockDim.x / 32; w++) m = fmaxf(m, scratch[w]);
    }
    __syncthreads();
    return m;
}

// atomicMax on the bit pattern: values are >= +0 and never NaN, so the integer order is the float
// order. A zero never changes a slot that starts at +0, so it is not sent.
__device__ __forceinline__ void qt_fp8_atomic_amax(uint64_t slots, uint32_t member, float v) {
    if (v > 0.0f) atomicMax((unsigned int *)slots + member, __float_as_uint(v));
}

// ---------------------------------------------------------------------------------------------
// Zeroing and amax.

extern "C" __global__ void qt_fp8_amax_zero(const __grid_constant__ fp8_amax_zero_args args) {
    qt_grid_enter();
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < args.slots) ((float *)args.amax)[i] = 0.0f;
}

// One element, for unaligned heads and tails.
__device__ __forceinline__ float qt_fp8_load1(const uint16_t *x, uint64_t i) {
    return __uint_as_float((uint32_t)x[i] << 16);
}
__device__ __forceinline__ float qt_fp8_load1(const float *x, uint64_t i) { return x[i]; }

// Folds the elements of one 16-byte word into an amax (8 BF16 or 4 FP32 values).
__device__ __forceinline__ float qt_fp8_amax16(float acc, uint4 w, const uint16_t *) {
    uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (uint32_t q = 0; q < 4; q++) {
        acc = qt_fp8_amax_step(acc, __uint_as_float(words[q] << 16));
        acc = qt_fp8_amax_step(acc, __uint_as_float(words[q] & 0xFFFF0000u));
    }
    return acc;
}
__device__ __forceinline__ float qt_fp8_amax16(float acc, uint4 w, const float *) {
    acc = qt_fp8_amax_step(acc, __uint_as_float(w.x));
    acc = qt_fp8_amax_step(acc, __uint_as_float(w.y));
    acc = qt_fp8_amax_step(acc, __uint_as_float(w.z));
    return qt_fp8_amax_step(acc, __uint_as_float(w.w));
}

// Max |x| over elements [s, e) of the flat tensor, by the whole block (each thread returns its
// share). 16-byte loads on the aligned middle, four in flight per thread; single elements on the
// unaligned head and tail (member boundaries need not be aligned when cols is odd).
template <typename In>
__device__ float qt_fp8_range_amax(const In *x, uint64_t s, uint64_t e, bool aligned) {
    constexpr uint32_t kVec = 16 / sizeof(In);
    constexpr uint32_t kUnroll = 4;
    uint64_t vs = (s + kVec - 1) / kVec * kVec;
    vs = vs < e ? vs : e;
    uint64_t ve = e / kVec * kVec;
    ve = ve > vs ? ve : vs;
    if (!aligned) vs = ve = e;
    float acc = 0.0f;
    for (uint64_t i = s + threadIdx.x; i < vs; i += QT_FP8_AMAX_THREADS) {
        acc = qt_fp8_amax_step(acc, qt_fp8_load1(x, i));
    }
    const uint4 *xv = (const uint4 *)x;
    uint64_t v_end = ve / kVec;
    for (uint64_t base = vs / kVec + threadIdx.x; base < v_end;
         base += kUnroll * QT_FP8_AMAX_THREADS) {
        uint4 buf[kUnroll];
#pragma unroll
        for (uint32_t u = 0; u < kUnroll; u++) {
            uint64_t idx = base + u * QT_FP8_AMAX_THREADS;
            buf[u] = idx < v_end ? __ldg(xv + idx) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (uint32_t u = 0; u < kUnroll; u++) acc = qt_fp8_amax16(acc, buf[u], x);
    }
    for (uint64_t i = ve + threadIdx.x; i < e; i += QT_FP8_AMAX_THREADS) {
        acc = qt_fp8_amax_step(acc, qt_fp8_load1(x, i));
    }
    return acc;
}

// Each block takes one contiguous slice of the active elements (total / blocks rounded up to a
// multiple of 8; the op builder sizes the grid so that a dense tensor gives every block at least
// QT_FP8_AMAX_BLOCK_ELEMS_MIN) and walks the members that the slice meets: per
// member, a block maximum over the member's valid rows inside the slice, one atomic, and the
// block_max barrier before the scratch is reused for the next member. A dense tensor is one
// member, so a block sends one atomic. The slice size comes from the device-side active row
// count, so over-allocated grouped buffers spread their real rows over every block.
template <typename In>
__device__ void qt_fp8_amax_body(const fp8_amax_args &a, float *scratch) {
    uint32_t active = qt_group_active_rows(a.group, a.rows);
    uint64_t total = (uint64_t)active * a.cols;
    uint64_t per_block = (total + gridDim.x - 1) / gridDim.x;
    per_block = (per_block + 7) / 8 * 8;
    uint64_t e0 = (uint64_t)blockIdx.x * per_block;
    if (e0 >= total) return;
    uint64_t e1 = e0 + per_block < total ? e0 + per_block : total;
    uint32_t lo = qt_group_find_warp(a.group, (uint32_t)(e0 / a.cols));
    uint32_t hi = qt_group_find_warp(a.group, (uint32_t)((e1 - 1) / a.cols));
    const In *x = (const In *)a.x;
    bool aligned = a.x % 16 == 0;
    for (uint32_t member = lo; member <= hi; member++) {
        qt_group_rows rows = qt_group_member_rows(a.group, a.rows, member);
        uint64_t s = (uint64_t)rows.begin * a.cols, e = (uint64_t)rows.valid_end * a.cols;
        s = s > e0 ? s : e0;
        e = e < e1 ? e : e1;
        if (s >= e) continue;  // uniform: an empty member, or only its padding is here
        float m = qt_fp8_block_max(qt_fp8_range_amax(x, s, e, aligned), scratch);
        if (threadIdx.x == 0) qt_fp8_atomic_amax(a.amax, member, m);
    }
}

extern "C" __global__ void __launch_bounds__(QT_FP8_AMAX_THREADS)
    qt_fp8_amax(const __grid_constant__ fp8_amax_args args) {
    qt_grid_enter();
    __shared__ float scratch[QT_FP8_AMAX_THREADS / 32];
    if (args.dtype == QT_DTYPE_BF16) {
        qt_fp8_amax_body<uint16_t>(args, scratch);
    } else {
        qt_fp8_amax_body<float>(args, scratch);
    }
}

// ---------------------------------------------------------------------------------------------
// Fused cast + transpose.
//
// One block, 256 threads, per 64 x 128 tile (rows m0.., cols k0..); the input is read once.
//
//   phase 1  thread t owns items (row t/16 + 16i, cols 8(t%16)..+7), i = 0..3: a warp reads two
//            rows of 256 B (BF16) per load. 8 codes per item go to the rowwise output (8-byte
//            stores, 128 B per row per warp) and to the shared tile as two words; per-row amaxes
//            are reduced over the row's 16 lanes.
//   phase 2  thread (mc, kw) reads words [8mc..8mc+7][kw] (rows x 4 cols), transposes the two
//            4 x 4 byte blocks in registers and writes 4 columnwise rows of 8 bytes. A warp
//            covers 4 mc x 8 kw: 32 B contiguous per columnwise row, and banks
//            (8mc + i) * 33 + kw = 8mc + kw + i (mod 32) are all distinct, so no conflicts.
//
//   shared tile (u32 words, 33 per row so that phase-1 writes 2v + r and phase-2 reads are
//   conflict-free):   word [r][w] = codes of cols 4w..4w+3 of tile row r, col 4w in bits 7:0
#define QT_FP8_TM QT_FP8_CAST_TILE_ROWS
#define QT_FP8_TK QT_FP8_CAST_TILE_COLS
#define QT_FP8_PITCH (QT_FP8_TK / 4 + 1)
#define QT_FP8_ITEMS (QT_FP8_TM * QT_FP8_TK / 8 / QT_FP8_CAST_THREADS)

struct qt_fp8_cast_smem {
    uint32_t tile[QT_FP8_TM][QT_FP8_PITCH];
    float row_amax[QT_FP8_TM];       // max |x| over the tile's valid part of each row
    // Tiles that cross a member boundary only: each row's member (rows past the active end:
    // hi), its scale and whether it holds data (not padding, below the active end).
    uint32_t row_member[QT_FP8_TM];
    float row_scale[QT_FP8_TM];
    uint32_t row_valid[QT_FP8_TM];
};

// Block 0 writes every member's scale_inv (and, for current scaling, the scale it derived), as
// TE's block 0 thread 0 does for one tensor. No block reads these, so there is no race.
__device__ void qt_fp8_cast_write_scales(const fp8_cast_args &a) {
    uint32_t n = a.group.count ? a.group.count : 1u;
    for (uint32_t i = threadIdx.x; i < n; i += QT_FP8_CAST_THREADS) {
        float scale = qt_fp8_member_scale(&a, i);
        if (a.scale_mode == QT_FP8_SCALE_CURRENT && a.scale) ((float *)a.scale)[i] = scale;
        ((float *)a.scale_inv)[i] = qt_fp8_scale_inv(scale);
    }
}

// 8 values -> 8 codes (c[0] = cols 0..3, c[1] = cols 4..7) and their amax.
template <typename In, bool kE5M2>
__device__ __forceinline__ float qt_fp8_convert8(const qt_fp8_vec8<In> &v, float scale,
                                                 uint32_t c[2]) {
    float f[8];
    float amax = 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < 8; j++) {
        f[j] = v.get(j);
        amax = qt_fp8_amax_step(amax, f[j]);
    }
#pragma unroll
    for (uint32_t h = 0; h < 2; h++) {
        uint32_t p0 = qt_fp8_cvt2<kE5M2>(f[4 * h] * scale, f[4 * h + 1] * scale);
        uint32_t p1 = qt_fp8_cvt2<kE5M2>(f[4 * h + 2] * scale, f[4 * h + 3] * scale);
        c[h] = p0 | p1 << 16;
    }
    return amax;
}

__device__ __forceinline__ void qt_fp8_store8(uint8_t *dst, uint32_t lo, uint32_t hi, bool vec,
                                              uint32_t n) {
    if (vec && n >= 8) {
        *(uint2 *)dst = make_uint2(lo, hi);
        return;
    }
    for (uint32_t j = 0; j < 8 && j < n; j++) {
        dst[j] = (uint8_t)((j < 4 ? lo : hi) >> (8 * (j % 4)));
    }
}

// A tile that crosses member boundaries (members pad to 16 rows, so many 64-row tiles do) looks
// its rows' members up once per row, 64 threads in parallel, instead of each thread once per
// item; the other threads wait at the barrier, as they would on the lookups themselves. With the
// flush below, this took the 64-member grouped cast from 88-89% to 92-93% of copy (H200).
__device__ __forceinline__ void qt_fp8_cast_row_members(const fp8_cast_args &a,
                                                        qt_fp8_cast_smem &sm, uint32_t m0,
                                                        uint32_t active, uint32_t last,
                                                        uint32_t lo, uint32_t hi) {
    const uint32_t t = threadIdx.x;
    if (t < QT_FP8_TM) {
        uint32_t r = m0 + t;
        uint32_t member = qt_group_find(a.group, lo, hi + 1, r < last ? r : last);
        qt_group_rows rows = qt_group_member_rows(a.group, a.rows, member);
        sm.row_member[t] = member;
        sm.row_scale[t] = qt_fp8_member_scale(&a, member);
        sm.row_valid[t] = r < active && r < rows.valid_end;
    }
    __syncthreads();
}

// Phase 1: loads, member lookup, codes to the rowwise output and the shared tile, row amaxes.
// Returns the members of the tile's first and last active rows in lo, hi.
template <typename In, bool kE5M2>
__device__ __forceinline__ void qt_fp8_cast_rows(const fp8_cast_args &a, qt_fp8_cast_smem &sm,
                                                 uint32_t m0, uint32_t k0, uint32_t active,
                                                 uint32_t *lo_out, uint32_t *hi_out) {
    const uint32_t t = threadIdx.x, v = t % 16, k = k0 + 8 * v;
    const In *x = (const In *)a.x;
    const bool vec_in = a.cols % 8 == 0 && a.x % 16 == 0;
    qt_fp8_vec8<In> raw[QT_FP8_ITEMS];
    // Loads first: nothing below them depends on the member lookup, which then overlaps them.
#pragma unroll
    for (uint32_t i = 0; i < QT_FP8_ITEMS; i++) {
        uint32_t r = m0 + t / 16 + 16 * i;
        if (r < active && k < a.cols) {
            const In *p = x + (uint64_t)r * a.cols + k;
            if (vec_in) {
                raw[i].load(p);
            } else {
                raw[i].load_partial(p, a.cols - k);
            }
        } else {
            raw[i].zero();
        }
    }
    uint32_t last = (m0 + QT_FP8_TM < active ? m0 + QT_FP8_TM : active) - 1;
    uint32_t lo = qt_group_find_warp(a.group, m0);
    uint32_t hi = qt_group_find_warp(a.group, last);
    *lo_out = lo;
    *hi_out = hi;
    uint32_t valid_end = qt_group_member_rows(a.group, a.rows, lo).valid_end;
    float scale = qt_fp8_member_scale(&a, lo);
    if (lo != hi) qt_fp8_cast_row_members(a, sm, m0, active, last, lo, hi);  // uniform
    const bool vec_row = a.cols % 8 == 0 && a.rowwise % 8 == 0;
#pragma unroll
    for (uint32_t i = 0; i < QT_FP8_ITEMS; i++) {
        uint32_t rl = t / 16 + 16 * i, r = m0 + rl;
        bool valid = r < active && r < valid_end;
        float row_scale = scale;
        if (lo != hi) {
            valid = sm.row_valid[rl] != 0;
            row_scale = sm.row_scale[rl];
        }
        // Padding rows get zero codes and no amax; rows past the active end are not written.
        uint32_t c[2] = {0u, 0u};
        float amax = 0.0f;
        if (valid) amax = qt_fp8_convert8<In, kE5M2>(raw[i], row_scale, c);
        if (a.rowwise && r < active && k < a.cols) {
            qt_fp8_store8((uint8_t *)a.rowwise + (uint64_t)r * a.cols + k, c[0], c[1], vec_row,
                          a.cols - k);
        }
        sm.tile[rl][2 * v] = c[0];
        sm.tile[rl][2 * v + 1] = c[1];
        // The row's 16 lanes are one aligned half-warp: xor offsets below 16 stay inside it.
#pragma unroll
        for (uint32_t o = 8; o > 0; o /= 2) {
            amax = fmaxf(amax, __shfl_xor_sync(QT_FP8_FULL_MASK, amax, o));
        }
        if (v == 0) sm.row_amax[rl] = amax;
    }
}

// Delayed scaling: this tile's amax into its members' slots (history row 0). One atomic for a
// tile inside one member; otherwise warp 0 walks the members present in the tile (row members
// never decrease, so each is one run of rows), one warp maximum and one atomic each.
__device__ __forceinline__ void qt_fp8_cast_flush_amax(const fp8_cast_args &a,
                                                       const qt_fp8_cast_smem &sm, uint32_t lo,
                                                       uint32_t hi) {
    if (!a.amax_out || threadIdx.x >= 32) return;
    uint32_t lane = threadIdx.x;
    float a0 = sm.row_amax[lane], a1 = sm.row_amax[lane + 32];
    if (lo == hi) {
        float m = qt_fp8_warp_max(fmaxf(a0, a1));
        if (lane == 0) qt_fp8_atomic_amax(a.amax_out, lo, m);
        return;
    }
    uint32_t m0 = sm.row_member[lane], m1 = sm.row_member[lane + 32];
    for (uint32_t member = lo;;) {  // uniform over the warp
        float m = qt_fp8_warp_max(fmaxf(m0 == member ? a0 : 0.0f, m1 == member ? a1 : 0.0f));
        if (lane == 0) qt_fp8_atomic_amax(a.amax_out, member, m);
        uint32_t next = min(m0 > member ? m0 : 0xFFFFFFFFu, m1 > member ? m1 : 0xFFFFFFFFu);
#pragma unroll
        for (uint32_t o = 16; o > 0; o /= 2) {
            next = min(next, __shfl_xor_sync(QT_FP8_FULL_MASK, next, o));
        }
        if (next == 0xFFFFFFFFu) break;
        member = next;
    }
}

// Phase 2: the columnwise (transposed) codes from the shared tile, into colwise [cols][rows]
// (its first `active` rows only).
__device__ __forceinline__ void qt_fp8_tile_columns(const uint32_t (*tile)[QT_FP8_PITCH],
                                                    uint32_t rows, uint32_t cols, uint64_t colwise,
                                                    uint32_t m0, uint32_t k0, uint32_t active) {
    uint32_t w = threadIdx.x / 32, l = threadIdx.x % 32;
    uint32_t mc = (w & 1u) * 4 + (l & 3u), kw = (w >> 1) * 8 + (l >> 2);
    uint32_t m = m0 + 8 * mc, kb = k0 + 4 * kw;
    if (m >= active || kb >= cols) return;
    uint32_t lo4[4], hi4[4];  // rows 8mc..8mc+3 and 8mc+4..8mc+7, cols 4kw..4kw+3
#pragma unroll
    for (uint32_t q = 0; q < 4; q++) {
        lo4[q] = tile[8 * mc + q][kw];
        hi4[q] = tile[8 * mc + 4 + q][kw];
    }
    qt_fp8_transpose4x4(lo4);  // now lo4[j] = col j, rows 0..3
    qt_fp8_transpose4x4(hi4);
    const bool vec = rows % 8 == 0 && colwise % 8 == 0;
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) {
        if (kb + j >= cols) break;
        uint8_t *dst = (uint8_t *)colwise + (uint64_t)(kb + j) * rows + m;
        qt_fp8_store8(dst, lo4[j], hi4[j], vec, active - m);
    }
}

QT_STATIC_ASSERT(QT_FP8_CAST_THREADS == 256 && QT_FP8_TM == 64 && QT_FP8_TK == 128,
                 "the thread <-> item maps above assume 256 threads on 64 x 128 tiles");

template <typename In, bool kE5M2>
__device__ __forceinline__ void qt_fp8_cast_tile(const fp8_cast_args &a, qt_fp8_cast_smem &sm) {
    if (blockIdx.x == 0) qt_fp8_cast_write_scales(a);
    uint32_t tiles_k = (a.cols + QT_FP8_TK - 1) / QT_FP8_TK;
    uint32_t m0 = blockIdx.x / tiles_k * QT_FP8_TM, k0 = blockIdx.x % tiles_k * QT_FP8_TK;
    uint32_t active = qt_group_active_rows(a.group, a.rows);
    if (m0 >= active) return;  // uniform over the block
    uint32_t lo, hi;
    qt_fp8_cast_rows<In, kE5M2>(a, sm, m0, k0, active, &lo, &hi);
    __syncthreads();  // the tile and the row amaxes are complete
    qt_fp8_cast_flush_amax(a, sm, lo, hi);
    if (a.colwise) qt_fp8_tile_columns(sm.tile, a.rows, a.cols, a.colwise, m0, k0, active);
}

// BF16: at most 48 registers, so that 5 blocks (40 warps) share an SM, as before the grouped
// row lookups below were added (uncapped, they take 52 and leave room for 4).
extern "C" __global__ void __launch_bounds__(QT_FP8_CAST_THREADS, 5)
    qt_fp8_cast_bf16(const __grid_constant__ fp8_cast_args args) {
    qt_grid_enter();
    __shared__ qt_fp8_cast_smem sm;
    if (args.fp8 == QT_FP8_E5M2) {
        qt_fp8_cast_tile<uint16_t, true>(args, sm);
    } else {
        qt_fp8_cast_tile<uint16_t, false>(args, sm);
    }
}

extern "C" __global__ void __launch_bounds__(QT_FP8_CAST_THREADS)
    qt_fp8_cast_f32(const __grid_constant__ fp8_cast_args args) {
    qt_grid_enter();
    __shared__ qt_fp8_cast_smem sm;
    if (args.fp8 == QT_FP8_E5M2) {
        qt_fp8_cast_tile<float, true>(args, sm);
    } else {
        qt_fp8_cast_tile<float, false>(args, sm);
    }
}

// ---------------------------------------------------------------------------------------------
// Transpose of FP8 codes (and of a block-scale grid): the cast's tiles and phase 2, with phase 1
// a copy of codes into the shared tile (thread t loads 8 bytes of row t/16 + 16i at column
// 8(t%16): a warp reads two rows of 128 B per load).
extern "C" __global__ void __launch_bounds__(QT_FP8_CAST_THREADS)
    qt_fp8_transpose(const __grid_constant__ fp8_transpose_args args) {
    qt_grid_enter();
    __shared__ uint32_t tile[QT_FP8_TM][QT_FP8_PITCH];
    if (args.scales) {
        uint64_t n = (uint64_t)args.scale_rows * args.scale_cols;
        uint64_t step = (uint64_t)gridDim.x * blockDim.x;
        for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
            uint64_t r = i / args.scale_cols, c = i % args.scale_cols;
            ((float *)args.scales_out)[c * args.scale_rows + r] = ((const float *)args.scales)[i];
        }
    }
    uint32_t tiles_k = (args.cols + QT_FP8_TK - 1) / QT_FP8_TK;
    uint32_t m0 = blockIdx.x / tiles_k * QT_FP8_TM, k0 = blockIdx.x % tiles_k * QT_FP8_TK;
    const uint32_t t = threadIdx.x, v = t % 16, k = k0 + 8 * v;
    const bool vec = args.cols % 8 == 0 && args.codes % 8 == 0;
    uint2 raw[QT_FP8_ITEMS];
#pragma unroll
    for (uint32_t i = 0; i < QT_FP8_ITEMS; i++) {
        uint32_t r = m0 + t / 16 + 16 * i;
        raw[i] = make_uint2(0u, 0u);
        if (r >= args.rows || k >= args.cols) continue;
        const uint8_t *p = (const uint8_t *)args.codes + (uint64_t)r * args.cols + k;
        if (vec) {
            raw[i] = __ldg((const uint2 *)p);
            continue;
        }
        uint32_t n = args.cols - k < 8 ? args.cols - k : 8;
        for (uint32_t j = 0; j < n; j++) {
            uint32_t byte = (uint32_t)__ldg(p + j) << (8 * (j % 4));
            if (j < 4) {
                raw[i].x |= byte;
            } else {
                raw[i].y |= byte;
            }
        }
    }
#pragma unroll
    for (uint32_t i = 0; i < QT_FP8_ITEMS; i++) {
        uint32_t rl = t / 16 + 16 * i;
        tile[rl][2 * v] = raw[i].x;
        tile[rl][2 * v + 1] = raw[i].y;
    }
    __syncthreads();
    qt_fp8_tile_columns(tile, args.rows, args.cols, args.out, m0, k0, args.rows);
}

// ---------------------------------------------------------------------------------------------
// Delayed scaling update: one thread per slot runs the shared per-slot rule; history rows are
// [L][slots], so consecutive threads touch consecutive words of each row.

extern "C" __global__ void __launch_bounds__(QT_FP8_UPDATE_THREADS)
    qt_fp8_delayed_update(const __grid_constant__ fp8_delayed_update_args args) {
    qt_grid_enter();
    uint32_t j = blockIdx.x * QT_FP8_UPDATE_THREADS + threadIdx.x;
    if (j < args.slots) qt_fp8_delayed_update_slot(&args, j);
}

// Every slot of up to QT_FP8_STATES_PER_OP states, one block each (slots counted over the states
// in order). A slot's history roll is a column of up to RULES_HISTORY_MAX words a row of the
// history apart: one thread walking it alone waits out the memory latency once per few rows
// (113 us for 1024 rows on an H200, more than the rest of a small model's step), so the block's
// threads share it. The block rolls QT_FP8_ROLL_BLOCK_ROWS rows at a time: every thread reads its
// rows' old[i + 1] into registers, the block synchronizes, then every thread writes its new[i].
// No write lands on a row that a later chunk reads (those are past the chunk's last row + 1), so
// the roll is in place, as in the one-thread rule (quant_fp8.h). The history's maximum is a
// maximum whatever the order (NaN rows skipped, as fmaxf does; zeros of either sign give no
// scale), so the block's tree (qt_fp8_block_max) gives the one-thread loop's scale bit for bit.
#define QT_FP8_ROLL_PER_THREAD 4u
#define QT_FP8_ROLL_BLOCK_ROWS (QT_FP8_UPDATE_THREADS * QT_FP8_ROLL_PER_THREAD)

// qt_fp8_delayed_update_slot (quant_fp8.h) by the whole block: the same history and scale.
__device__ __forceinline__ void qt_fp8_delayed_update_block(const fp8_delayed_state *st,
                                                            uint32_t j) {
    float *history = (float *)(uintptr_t)st->history;
    uint32_t slots = st->slots, len = st->history_len;
    // Every thread reads a_cur before any thread writes row 0 (the barrier in the first chunk).
    float a_cur = history[j];
    float amax = 0.0f;
    // a_cur == 0: nothing rolls and the update's amax is 0 (the scale rule still runs: an
    // infinite old scale becomes FLT_MAX).
    for (uint32_t c = 0; a_cur != 0.0f && c < len; c += QT_FP8_ROLL_BLOCK_ROWS) {
        float v[QT_FP8_ROLL_PER_THREAD];
#pragma unroll
        for (uint32_t q = 0; q < QT_FP8_ROLL_PER_THREAD; q++) {
            uint32_t i = c + q * QT_FP8_UPDATE_THREADS + threadIdx.x;
            v[q] = i + 1 < len ? history[(uint64_t)(i + 1) * slots + j] : a_cur;
        }
        __syncthreads();  // every read of the chunk before any of its writes
#pragma unroll
        for (uint32_t q = 0; q < QT_FP8_ROLL_PER_THREAD; q++) {
            uint32_t i = c + q * QT_FP8_UPDATE_THREADS + threadIdx.x;
            if (i >= len) continue;
            amax = fmaxf(amax, v[q]);
            history[(uint64_t)i * slots + j] = i > 0 ? v[q] : 0.0f;
        }
    }
    __shared__ float scratch[QT_FP8_UPDATE_THREADS / 32];
    amax = qt_fp8_block_max(amax, scratch);
    if (threadIdx.x != 0) return;
    if (st->algo == QT_FP8_AMAX_ALGO_MOST_RECENT) amax = a_cur;
    float *scale = (float *)(uintptr_t)st->scale;
    scale[j] = qt_fp8_delayed_scale(amax, st->scaled_max, scale[j]);
}

// One block per slot; its snapshots in qt_fp8_delayed_states_slot's order (quant_fp8.h).
extern "C" __global__ void __launch_bounds__(QT_FP8_UPDATE_THREADS)
    qt_fp8_delayed_states(const __grid_constant__ fp8_delayed_states_args args) {
    qt_grid_enter();
    uint32_t state, j;
    if (!qt_fp8_delayed_states_find(&args, blockIdx.x, &state, &j)) return;
    const fp8_delayed_state *st = &args.states[state];
    uint32_t entry = st->first + j;
    if (args.update) {
        uint32_t *history = (uint32_t *)(uintptr_t)st->history;
        if (threadIdx.x == 0 && args.amax_out) {
            ((uint32_t *)(uintptr_t)args.amax_out)[entry] = history[j];
        }
        if (args.skip != 0 && *(const uint32_t *)(uintptr_t)args.skip != 0) {
            if (threadIdx.x == 0) history[j] = 0u;  // after its snapshot, in thread order
        } else {
            qt_fp8_delayed_update_block(st, j);
        }
        __syncthreads();  // thread 0 wrote the scale that the snapshot reads
    }
    if (threadIdx.x == 0 && args.scale_out) {
        const uint32_t *scale = (const uint32_t *)(uintptr_t)st->scale;
        ((uint32_t *)(uintptr_t)args.scale_out)[entry] = scale[j];
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantize: 32 x 32 tiles of the [M][K] output, thread (tx, ty) writes cols k0 + tx of rows
// m0 + ty + 8i. Columnwise codes go through a shared tile so that both the [K][M] reads and the
// [M][K] writes are coalesced. Padding rows are written as zeros.

extern "C" __global__ void __launch_bounds__(QT_FP8_DEQ_THREADS)
    qt_fp8_dequantize(const __grid_constant__ fp8_dequantize_args args) {
    qt_grid_enter();
    __shared__ uint32_t tile[QT_FP8_DEQ_TILE][QT_FP8_DEQ_TILE + 1];
    const fp8_dequantize_args &a = args;
    uint32_t tiles_k = (a.cols + QT_FP8_DEQ_TILE - 1) / QT_FP8_DEQ_TILE;
    uint32_t m0 = blockIdx.x / tiles_k * QT_FP8_DEQ_TILE;
    uint32_t k0 = blockIdx.x % tiles_k * QT_FP8_DEQ_TILE;
    uint32_t active = qt_group_active_rows(a.group, a.rows);
    if (m0 >= active) return;
    uint32_t tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const uint8_t *codes = (const uint8_t *)a.codes;
    if (a.colwise) {
        for (uint32_t kk = ty; kk < QT_FP8_DEQ_TILE; kk += 8) {
            uint32_t k = k0 + kk, m = m0 + tx;
            tile[kk][tx] = k < a.cols && m < active ? codes[(uint64_t)k * a.rows + m] : 0u;
        }
        __syncthreads();
    }
    uint32_t last = (m0 + QT_FP8_DEQ_TILE < active ? m0 + QT_FP8_DEQ_TILE : active) - 1;
    uint32_t lo = qt_group_find_warp(a.group, m0);
    uint32_t hi = qt_group_find_warp(a.group, last);
    uint32_t k = k0 + tx;
    for (uint32_t ml = ty; ml < QT_FP8_DEQ_TILE; ml += 8) {
        uint32_t m = m0 + ml;
        if (m >= active || k >= a.cols) continue;
        uint8_t code = a.colwise ? (uint8_t)tile[tx][ml] : codes[(uint64_t)m * a.cols + k];
        uint32_t member = lo == hi ? lo : qt_group_find(a.group, lo, hi + 1, m);
        qt_group_rows rows = qt_group_member_rows(a.group, a.rows, member);
        float value = 0.0f;
        if (m < rows.valid_end) {
            value = qt_fp8_dequantize_value(code, a.fp8, ((const float *)a.scale_inv)[member]);
        }
        uint64_t at = (uint64_t)m * a.cols + k;
        if (a.dtype == QT_DTYPE_BF16) {
            ((uint16_t *)a.out)[at] = qt_f32_to_bf16(value);
        } else {
            ((float *)a.out)[at] = value;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// An activation and the cast of its output in one pass (fp8_act_cast_args). Per tile, phase 1
// is qt_fp8_cast_rows's for a dense tensor, with the loaded words of x (and dy) turned into the
// words of y through the table first; phase 2 is qt_fp8_tile_columns itself. A block runs many
// tiles, so that its table (4096 exact evaluations) is paid once per block, not once per tile,
// and its amax is one atomic at its end (a maximum: the order of the tiles and of the atomics
// does not matter).

// The words of one tile that this thread takes (zeros outside the tensor): x, and dy backward.
template <bool kBackward>
__device__ __forceinline__ void qt_fp8_act_cast_load(const fp8_act_cast_args &a, uint32_t tile,
                                                     uint32_t tiles_k, uint4 xw[QT_FP8_ITEMS],
                                                     uint4 dw[QT_FP8_ITEMS]) {
    const fp8_cast_args &c = a.cast;
    uint32_t m0 = tile / tiles_k * QT_FP8_TM;
    uint32_t k = tile % tiles_k * QT_FP8_TK + 8 * (threadIdx.x % 16);
#pragma unroll
    for (uint32_t i = 0; i < QT_FP8_ITEMS; i++) {
        uint32_t r = m0 + threadIdx.x / 16 + 16 * i;
        xw[i] = dw[i] = make_uint4(0u, 0u, 0u, 0u);
        if (r >= c.rows || k >= c.cols) continue;
        uint64_t at = ((uint64_t)r * c.cols + k) / 8;
        xw[i] = __ldg((const uint4 *)c.x + at);
        if (kBackward) dw[i] = __ldg((const uint4 *)a.dy + at);
    }
}

// Phase 1 of one tile from its loaded words: y's codes to the rowwise output and the shared
// tile (zero codes outside the tensor). Returns max |y| over the tile's elements that this
// thread holds.
template <bool kBackward, bool kE5M2>
__device__ __forceinline__ float qt_fp8_act_cast_rows(const fp8_act_cast_args &a,
                                                      const float *table,
                                                      uint32_t (*tile)[QT_FP8_PITCH], uint32_t m0,
                                                      uint32_t k0, float scale,
                                                      const uint4 xw[QT_FP8_ITEMS],
                                                      const uint4 dw[QT_FP8_ITEMS]) {
    const fp8_cast_args &c = a.cast;
    const uint32_t t = threadIdx.x, v = t % 16, k = k0 + 8 * v;
    float amax = 0.0f;
#pragma unroll
    for (uint32_t i = 0; i < QT_FP8_ITEMS; i++) {
        uint32_t rl = t / 16 + 16 * i, r = m0 + rl;
        bool valid = r < c.rows && k < c.cols;
        qt_fp8_vec8<uint16_t> y;
        y.w = qt_act_table_words<kBackward>(a.act, table, xw[i], dw[i]);
        uint32_t codes[2] = {0u, 0u};
        if (valid) {
            amax = fmaxf(amax, qt_fp8_convert8<uint16_t, kE5M2>(y, scale, codes));
            if (c.rowwise) {
                qt_fp8_store8((uint8_t *)c.rowwise + (uint64_t)r * c.cols + k, codes[0],
                              codes[1], true, c.cols - k);
            }
        }
        tile[rl][2 * v] = codes[0];
        tile[rl][2 * v + 1] = codes[1];
    }
    return amax;
}

struct qt_fp8_act_cast_smem {
    float table[QT_ACT_LUT_ENTRIES];
    uint32_t tile[QT_FP8_TM][QT_FP8_PITCH];
    float scratch[QT_FP8_CAST_THREADS / 32];
};

// The table of act (f forward, f' backward), each block its own.
template <bool kBackward>
__device__ __forceinline__ void qt_fp8_act_table(uint32_t act, float *table) {
    qt_act_table_fill(table, act, kBackward, QT_FP8_CAST_THREADS);
}

// Chunks of 8 a thread loads at once in the amax-only pass, 128 bytes forward (x), 96 backward
// (x and dy): no tiles there, only loads in flight and the table.
#define QT_FP8_ACT_AMAX_UNROLL(backward) ((backward) ? 3u : 8u)

// max |y| over the whole tensor into cast.amax_out: a grid-stride pass over 8-element chunks.
// The maximum is taken over the FP32 values and rounded to BF16 once, as qt_act_stored_amax does:
// that is the largest stored magnitude (NaN skipped either way), without rounding each value.
template <bool kBackward>
__device__ __forceinline__ void qt_fp8_act_amax_body(const fp8_act_cast_args &a,
                                                     qt_fp8_act_cast_smem &sm) {
    if (!kBackward && a.x_max != 0) {  // uniform: every thread reads the same slot
        float y;
        float x_max = __uint_as_float(*reinterpret_cast<const uint32_t *>(a.x_max));
        if (qt_act_amax_from_max(a.act, x_max, &y)) {
            if (blockIdx.x == 0 && threadIdx.x == 0) {
                qt_fp8_atomic_amax(a.cast.amax_out, 0, qt_bf16_to_f32(qt_f32_to_bf16(y)));
            }
            return;
        }
    }
    qt_fp8_act_table<kBackward>(a.act, sm.table);
    __syncthreads();  // the table is complete
    const uint64_t chunks = (uint64_t)a.cast.rows * a.cast.cols / 8;  // cols % 8 == 0
    const uint64_t stride = (uint64_t)gridDim.x * QT_FP8_CAST_THREADS;
    const uint4 *x = (const uint4 *)a.cast.x, *dy = (const uint4 *)a.dy;
    float amax = 0.0f;
    for (uint64_t c = (uint64_t)blockIdx.x * QT_FP8_CAST_THREADS + threadIdx.x; c < chunks;
         c += QT_FP8_ACT_AMAX_UNROLL(kBackward) * stride) {
        uint4 xw[QT_FP8_ACT_AMAX_UNROLL(kBackward)], dw[QT_FP8_ACT_AMAX_UNROLL(kBackward)];
#pragma unroll
        for (uint32_t u = 0; u < QT_FP8_ACT_AMAX_UNROLL(kBackward); u++) {
            uint64_t cu = c + u * stride;
            xw[u] = dw[u] = make_uint4(0u, 0u, 0u, 0u);
            if (cu >= chunks) continue;
            xw[u] = __ldg(x + cu);
            if (kBackward) dw[u] = __ldg(dy + cu);
        }
#pragma unroll
        for (uint32_t u = 0; u < QT_FP8_ACT_AMAX_UNROLL(kBackward); u++) {
            if (c + u * stride >= chunks) continue;
            float f[8];
            qt_act_table_values<kBackward>(a.act, sm.table, xw[u], dw[u], f);
#pragma unroll
            for (uint32_t j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(f[j]));
        }
    }
    float m = qt_fp8_block_max(qt_bf16_to_f32(qt_f32_to_bf16(amax)), sm.scratch);
    if (threadIdx.x == 0) qt_fp8_atomic_amax(a.cast.amax_out, 0, m);
}

// The codes, tile after tile. (Loading the next tile before this tile's arithmetic, or 5 blocks
// an SM forward, measured the same: H100, 2026-11-27.)
template <bool kBackward, bool kE5M2>
__device__ __forceinline__ void qt_fp8_act_cast_body(const fp8_act_cast_args &a,
                                                     qt_fp8_act_cast_smem &sm) {
    const fp8_cast_args &c = a.cast;
    qt_fp8_act_table<kBackward>(a.act, sm.table);
    if (blockIdx.x == 0) qt_fp8_cast_write_scales(c);
    float scale = qt_fp8_member_scale(&c, 0);
    __syncthreads();  // the table is complete
    uint32_t tiles_k = (c.cols + QT_FP8_TK - 1) / QT_FP8_TK;
    uint32_t tiles = (c.rows + QT_FP8_TM - 1) / QT_FP8_TM * tiles_k;
    float amax = 0.0f;
    for (uint32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform
        uint32_t m0 = tile / tiles_k * QT_FP8_TM, k0 = tile % tiles_k * QT_FP8_TK;
        uint4 xw[QT_FP8_ITEMS], dw[QT_FP8_ITEMS];
        qt_fp8_act_cast_load<kBackward>(a, tile, tiles_k, xw, dw);
        amax = fmaxf(amax, qt_fp8_act_cast_rows<kBackward, kE5M2>(a, sm.table, sm.tile, m0, k0,
                                                                   scale, xw, dw));
        if (c.colwise) {  // uniform
            __syncthreads();  // the tile is complete
            qt_fp8_tile_columns(sm.tile, c.rows, c.cols, c.colwise, m0, k0, c.rows);
            __syncthreads();  // read before the next tile overwrites it
        }
    }
    if (!c.amax_out) return;  // uniform
    float m = qt_fp8_block_max(amax, sm.scratch);
    if (threadIdx.x == 0) qt_fp8_atomic_amax(c.amax_out, 0, m);
}

template <bool kBackward>
__device__ __forceinline__ void qt_fp8_act_cast_of_mode(const fp8_act_cast_args &a,
                                                        qt_fp8_act_cast_smem &sm) {
    if (!a.cast.rowwise && !a.cast.colwise) {
        qt_fp8_act_amax_body<kBackward>(a, sm);
    } else if (a.cast.fp8 == QT_FP8_E5M2) {
        qt_fp8_act_cast_body<kBackward, true>(a, sm);
    } else {
        qt_fp8_act_cast_body<kBackward, false>(a, sm);
    }
}

extern "C" __global__ void __launch_bounds__(QT_FP8_CAST_THREADS, QT_FP8_ACT_CAST_BLOCKS_PER_SM)
    qt_fp8_act_cast_fwd(const __grid_constant__ fp8_act_cast_args args) {
    qt_grid_enter();
    __shared__ qt_fp8_act_cast_smem sm;
    qt_fp8_act_cast_of_mode<false>(args, sm);
}

extern "C" __global__ void __launch_bounds__(QT_FP8_CAST_THREADS, QT_FP8_ACT_CAST_BLOCKS_PER_SM)
    qt_fp8_act_cast_bwd(const __grid_constant__ fp8_act_cast_args args) {
    qt_grid_enter();
    __shared__ qt_fp8_act_cast_smem sm;
    qt_fp8_act_cast_of_mode<true>(args, sm);
}
