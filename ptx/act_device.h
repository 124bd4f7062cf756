// act_device: device code shared by the element kernels of ptx/act.cu and ptx/moe.cu: loads and
// stores of 8-element chunks of BF16 or FP32 tensors, and the per-member amax of a grouped output
// (ptx/quant_group.h) that its producer merges for the current-scaling cast that reads it next.
// Device code only; the per-element arithmetic is act.h's (qt_act_load, qt_act_store,
// qt_act_stored_amax), which the C twins run, and a chunk load or store gives exactly the values
// of eight of those calls.
//
// Per-member amax. A block keeps one maximum per member in dynamic shared memory (u32 bits,
// 4 x members bytes, zeroed when the block starts): every thread folds the magnitudes it stores
// into a running maximum (fmaxf: NaN skipped) and merges it, rounded to the stored dtype
// (qt_act_stored_amax: rounding is monotonic, so that is the largest stored magnitude), into its
// member's entry with a shared atomicMax on the bits (non-negative floats order like their bits);
// then the block merges each nonzero entry into the member's global slot with one atomicMax,
// skipped when the slot already holds as much. A maximum is exact and order-free, so the slots
// get the bits of a separate qt_fp8_amax pass over the stored tensor's valid rows.
#ifndef QT_ACT_DEVICE_H
#define QT_ACT_DEVICE_H

#if defined(__CUDACC__)

#include "ptx/act.h"  // qt_act_canonical, qt_act_stored_amax, QT_DTYPE_*

__device__ __forceinline__ bool act_aligned16(uint64_t address) { return (address & 15u) == 0; }

// base[first .. first + 8), first % 8 == 0, base 16-byte aligned.
__device__ __forceinline__ void act_load8(uint64_t base, uint64_t first, uint32_t dtype,
                                          float v[8]) {
    if (dtype == QT_DTYPE_BF16) {
        uint4 u = __ldg((const uint4 *)(uintptr_t)(base + first * 2));
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {  // element 2k is the low half of word k (little-endian)
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
        }
    } else {
        const float4 *p = (const float4 *)(uintptr_t)(base + first * 4);
        float4 a = __ldg(p), b = __ldg(p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
}

__device__ __forceinline__ void act_store8(uint64_t base, uint64_t first, uint32_t dtype,
                                           const float v[8]) {
    if (dtype == QT_DTYPE_BF16) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = qt_f32_to_bf16(qt_act_canonical(v[2 * k]));
            uint32_t hi = qt_f32_to_bf16(qt_act_canonical(v[2 * k + 1]));
            w[k] = lo | hi << 16;
        }
        *(uint4 *)(uintptr_t)(base + first * 2) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
        float c[8];
#pragma unroll
        for (int k = 0; k < 8; k++) c[k] = qt_act_canonical(v[k]);
        float4 *p = (float4 *)(uintptr_t)(base + first * 4);
        p[0] = make_float4(c[0], c[1], c[2], c[3]);
        p[1] = make_float4(c[4], c[5], c[6], c[7]);
    }
}

// act_store8 with BF16 pairs through cvt.rn.bf16x2, which gives qt_f32_to_bf16's bits for every
// input (RNE, subnormals kept, the canonical NaN 0x7FFF), so the bits match the reference
// backend's with fewer instructions.
__device__ __forceinline__ void act_store8_pairs(uint64_t base, uint64_t first, uint32_t dtype,
                                                 const float v[8]) {
    if (dtype != QT_DTYPE_BF16) {
        act_store8(base, first, dtype, v);
        return;
    }
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(w[k]) : "f"(v[2 * k + 1]), "f"(v[2 * k]));
    }
    *(uint4 *)(uintptr_t)(base + first * 2) = make_uint4(w[0], w[1], w[2], w[3]);
}

// max |v[k]| over a chunk (NaN skipped, as fmaxf does).
__device__ __forceinline__ float act_max8(const float v[8]) {
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) m = fmaxf(m, fabsf(v[k]));
    return m;
}

// ---------------------------------------------------------------------------------------------
// Per-member amax tables (see the header comment). Every thread of the block calls the zero and
// flush steps; the table is the block's dynamic shared memory.

__device__ __forceinline__ void act_amax_table_zero(uint32_t *table, uint32_t members) {
    for (uint32_t e = threadIdx.x; e < members; e += blockDim.x) table[e] = 0;
    __syncthreads();
}

// m: max |v| over FP32 values before their stores to dtype.
__device__ __forceinline__ void act_amax_table_merge(uint32_t *table, uint32_t member, float m,
                                                     uint32_t dtype) {
    m = qt_act_stored_amax(m, dtype);
    if (m > 0.0f) atomicMax(table + member, __float_as_uint(m));
}

// act_amax_table_merge by a whole warp (all 32 lanes converged): when the lanes that hold a
// maximum share one member, they fold theirs first and send one shared atomic.
__device__ __forceinline__ void act_amax_table_merge_warp(uint32_t *table, uint32_t member,
                                                          float m, uint32_t dtype) {
    uint32_t live = __ballot_sync(0xFFFFFFFFu, m > 0.0f);
    if (live == 0) return;
    uint32_t lead = __shfl_sync(0xFFFFFFFFu, member, __ffs(live) - 1);
    if (!__all_sync(0xFFFFFFFFu, !(m > 0.0f) || member == lead)) {
        act_amax_table_merge(table, member, m, dtype);
        return;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if ((threadIdx.x & 31u) == 0) act_amax_table_merge(table, lead, m, dtype);
}

// The table's nonzero entries into the global slots (f32 [members]), once every thread of the
// block has merged its share.
__device__ __forceinline__ void act_amax_table_flush(const uint32_t *table, uint32_t members,
                                                     uint64_t slots) {
    __syncthreads();
    unsigned int *global = (unsigned int *)(uintptr_t)slots;
    for (uint32_t e = threadIdx.x; e < members; e += blockDim.x) {
        uint32_t v = table[e];
        if (v != 0 && v > *(volatile unsigned int *)(global + e)) atomicMax(global + e, v);
    }
}

#endif  // __CUDACC__
#endif  // QT_ACT_DEVICE_H
