// quant: conventions shared by every quantization family (ptx/quant_*.cu, their op builders
// runtime/ops/op_quant_*.c and C twins runtime/ref/ref_quant_*.c). Codecs: ptx/qt_codec.h.
//
// Owns nothing. What it fixes:
//
// Tensors. A high-precision tensor is an M x K row-major matrix (K contiguous) of BF16 or FP32.
// "Rowwise" blocks run along K, "columnwise" blocks along M. Scale tensors use qtrain's compact
// layouts (no cuBLAS swizzle, no padding to 128 x 4), one table per format:
//
//   format           direction  data               scales
//   fp8 per-tensor   rowwise    u8 [M][K]          f32 scale_inv [1]
//                    colwise    u8 [K][M] (T)      the same scale_inv
//   mxfp8            rowwise    u8 [M][K]          e8m0 [M][ceil(K/32)]
//                    colwise    u8 [M][K] (not T)  e8m0 [ceil(M/32)][K]
//   fp8 block 1x128  rowwise    u8 [M][K]          f32 [ceil(K/128)][M]
//                    colwise    u8 [K][M] (T)      f32 [ceil(M/128)][K]
//   fp8 block 2-D    rowwise    u8 [M][K]          f32 [ceil(M/128)][ceil(K/128)]
//                    colwise    u8 [K][M] (T)      f32 [ceil(K/128)][ceil(M/128)]
//   nvfp4            rowwise    u8 [M][ceil(K/2)]  e4m3 [M][ceil(K/16)] + f32 amax
//                    colwise    u8 [K][ceil(M/2)]  e4m3 [K][ceil(M/16)] + f32 amax
//                               (T)                (post-RHT amax when RHT is on)
//
//   (T) = transposed: element (m, k) of the input is stored at [k][m]. nvfp4 packs two codes per
//   byte, even index in the low nibble; an odd row length leaves a zero high nibble at its end.
//   Partial blocks at the edges use only in-range elements for their amax.
//
// Grouped tensors. n members share one buffer of `rows_capacity` rows of K
// columns. Member i occupies padded rows [row_offsets[i], row_offsets[i+1]) of which the first
// first_dims[i] are valid; the rest are padding, written as zero codes and never counted in an
// amax. Padded sizes are multiples of the format's row_align (recipes/format.h), which is a
// multiple of every columnwise block length, so no columnwise block straddles two members. With
// that rule, a grouped tensor's data and block-scale buffers have exactly the dense layout of the
// padded [rows_capacity][K] matrix (columnwise transposed data is [K][rows_capacity]); only the
// per-tensor quantities (amax, scale, scale_inv, nvfp4 global amaxes) are per member, as arrays
// of n. row_offsets and first_dims live in device memory, written by the device (a router), so
// kernels read them there; the host never knows the active row count. Kernels are launched for
// rows_capacity and skip rows at or beyond row_offsets[n].
//
// Randomness (stochastic rounding) is keyed by (seed, step, tensor, element position), never by
// thread or tile: see qt_quant_random16.
#ifndef QT_QUANT_H
#define QT_QUANT_H

#include "ptx/philox.h"
#include "ptx/qt_hd.h"

typedef struct qt_group_desc {
    uint64_t row_offsets;  // u32 [count + 1] device; row_offsets[0] = 0
    uint64_t first_dims;   // u32 [count] device; valid rows of each member
    uint32_t count;        // members; 0 = a dense tensor (no arrays, one implicit member)
    uint32_t reserved;
} qt_group_desc;
QT_STATIC_ASSERT(sizeof(qt_group_desc) == 24, "qt_group_desc layout");

// Columnwise random streams are kept apart from rowwise ones by the top bit of the tensor id.
#define QT_QUANT_TENSOR_COLWISE 0x80000000u

// The 16 random bytes for one 16-element block: block `block_index` along row `row` of the
// direction's data (rowwise: row m, block k/16; columnwise: row k of the transposed data, block
// m/16). Element j of the block (0..15) uses byte j: bits [8(j%4)+7 : 8(j%4)] of word j/4.
QT_HD qt_philox4 qt_quant_random16(uint64_t seed, uint64_t step, uint32_t tensor_id,
                                   uint32_t row, uint32_t block_index) {
    qt_philox4 counter = {{block_index, row, tensor_id, (uint32_t)step}};
    return qt_philox4x32_10(counter, (uint32_t)seed, (uint32_t)(seed >> 32));
}

QT_HD uint32_t qt_quant_random_byte(qt_philox4 r, uint32_t j) {
    return (r.v[j >> 2] >> (8 * (j & 3))) & 0xFFu;
}

#if defined(__CUDACC__)
// The maxima of two BF16 pairs, half by half, in one instruction (max.bf16x2): the BF16 casts'
// partial amaxes over words of the raw input, |x| taken by masking the sign bits first.
__device__ __forceinline__ uint32_t qt_bf16x2_max(uint32_t a, uint32_t b) {
    uint32_t m;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(b));
    return m;
}
#endif

#endif  // QT_QUANT_H
