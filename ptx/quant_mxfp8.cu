// quant_mxfp8 kernels: the fused MXFP8 cast (one read of a BF16 or FP32 tensor, rowwise and
// columnwise codes and E8M0 scales out) and its dequantize. ABI, layouts and the shared
// arithmetic, the per-block scale and code rules included: quant_mxfp8.h.
//
// Quantize tiling. One block of 128 threads owns a 32-row x 256-column tile; warp w owns its
// columns [64w, 64w + 64), and lane = rg * 8 + cb * 4 + cl holds rows rg*8 .. rg*8+7 and the 8
// columns cb*32 + cl*8 .. +7 of the warp's 64:
//
//          cb = 0 (32 columns)          cb = 1 (32 columns)
//        cl=0  cl=1  cl=2  cl=3       cl=0  cl=1  cl=2  cl=3
//   rg=0 [ 0 ] [ 1 ] [ 2 ] [ 3 ]      [ 4 ] [ 5 ] [ 6 ] [ 7 ]     rows 0..7
//   rg=1 [ 8 ] [ 9 ] [10 ] [11 ]      [12 ] [13 ] [14 ] [15 ]     rows 8..15
//   rg=2 [16 ] ...                                                rows 16..23
//   rg=3 [24 ] ...                                    [31 ]       rows 24..31
//
// So each 32 x 32 block of the tile lives in 16 lanes of one warp: a row's 32-element block is
// reduced over the 4 lanes cl = 0..3 (shuffle xor 1, 2) and a column's 32-element block over the
// 4 lanes rg = 0..3 (xor 8, 16); no shared-memory transpose is needed. Each load instruction
// (row i of every lane) reads 4 rows x 128 contiguous bytes (BF16), each code store writes
// 4 rows x 64 contiguous bytes. The tile stays in registers (BF16 packed in pairs), so the input
// is read exactly once. Only the rowwise scales go through shared memory, to leave the block as
// one 8-byte store per row instead of 8 single bytes.
#include "ptx/quant_mxfp8.h"
#include "ptx/cp_async.h"    // qt_cp_async16, backward's staging of dy
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement
#include "ptx/gemm_decode.h"  // the MXFP8 GEMMs' decode, for the dequantize's BF16 path

#define MX_LANE_ROWS 8

#define MX_FULL 0xFFFFFFFFu
#define MX_TILE_BLOCKS (QT_MXFP8_TILE_COLS / 32u)  // rowwise scale bytes per row of a tile

// The vector type that stores one row of a tile's rowwise scales.
template <int kBytes> struct mx_vec;
template <> struct mx_vec<8> { typedef uint2 type; };
template <> struct mx_vec<16> { typedef uint4 type; };
typedef mx_vec<MX_TILE_BLOCKS>::type mx_row_e_vec;

struct mx_lane {
    uint32_t row0;  // first of the lane's 8 rows
    uint32_t col0;  // first of the lane's 8 columns
    uint32_t rg, cb, cl;
};

// ---------------------------------------------------------------------------------------------
// The lane's 8 x 8 elements: BF16 kept packed, two columns per register (low half = even column).

struct mx_tile_bf16 {
    uint32_t w[MX_LANE_ROWS][4];
    __device__ __forceinline__ float at(int i, int j) const {
        uint32_t pair = w[i][j >> 1];
        return __uint_as_float((j & 1) ? (pair & 0xFFFF0000u) : (pair << 16));
    }
    __device__ __forceinline__ void clear_row(int i) {
#pragma unroll
        for (int p = 0; p < 4; p++) w[i][p] = 0;
    }
};

struct mx_tile_f32 {
    float w[MX_LANE_ROWS][8];
    __device__ __forceinline__ float at(int i, int j) const { return w[i][j]; }
    __device__ __forceinline__ void clear_row(int i) {
#pragma unroll
        for (int j = 0; j < 8; j++) w[i][j] = 0.0f;
    }
};

// Loads row i's 8 columns; columns at or beyond `cols` read as zero. `vec`: 16-byte loads are
// aligned (base and row pitch) and the 8 columns are all in range. Through __ldg: evict-first
// loads (__ldcs) and L1::no_allocate ones each made the cast 6% slower (H200).
__device__ __forceinline__ void mx_load_row(mx_tile_bf16 &t, int i, const uint16_t *src,
                                            uint32_t in_range, bool vec) {
    if (vec) {
        uint4 v = __ldg((const uint4 *)src);
        t.w[i][0] = v.x;
        t.w[i][1] = v.y;
        t.w[i][2] = v.z;
        t.w[i][3] = v.w;
        return;
    }
#pragma unroll
    for (int p = 0; p < 4; p++) {
        uint32_t lo = (uint32_t)(2 * p) < in_range ? src[2 * p] : 0u;
        uint32_t hi = (uint32_t)(2 * p + 1) < in_range ? src[2 * p + 1] : 0u;
        t.w[i][p] = lo | (hi << 16);
    }
}

__device__ __forceinline__ void mx_load_row(mx_tile_f32 &t, int i, const float *src,
                                            uint32_t in_range, bool vec) {
    if (vec) {
        float4 a = __ldg((const float4 *)src);
        float4 b = __ldg((const float4 *)src + 1);
        t.w[i][0] = a.x;
        t.w[i][1] = a.y;
        t.w[i][2] = a.z;
        t.w[i][3] = a.w;
        t.w[i][4] = b.x;
        t.w[i][5] = b.y;
        t.w[i][6] = b.z;
        t.w[i][7] = b.w;
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) t.w[i][j] = (uint32_t)j < in_range ? src[j] : 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Block amaxes. Every reduction starts from +0 and uses a NaN-ignoring max (PTX max.bf16x2 and
// max.f32 return the non-NaN operand), so the result is qt_mxfp8_amax_step's loop value: the
// largest |x| of the non-NaN elements, 0 if there are none. |x| clears the sign bit, so -0 never
// appears and the max of a set is one exact element whatever the tree.

__device__ __forceinline__ uint32_t mx_max_shfl_bf16x2(uint32_t v, int lane_mask) {
    return qt_bf16x2_max(v, __shfl_xor_sync(MX_FULL, v, lane_mask));
}

__device__ __forceinline__ float mx_max_shfl_f32(float v, int lane_mask) {
    return fmaxf(v, __shfl_xor_sync(MX_FULL, v, lane_mask));
}

// Row amaxes of the lane's 8 rows, over each row's whole 32-block (4 lanes cl).
__device__ __forceinline__ void mx_row_amax(const mx_tile_bf16 &t, float amax[MX_LANE_ROWS]) {
#pragma unroll
    for (int k = 0; k < MX_LANE_ROWS / 2; k++) {
        uint32_t m0 = 0, m1 = 0;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            m0 = qt_bf16x2_max(m0, t.w[2 * k][p] & 0x7FFF7FFFu);
            m1 = qt_bf16x2_max(m1, t.w[2 * k + 1][p] & 0x7FFF7FFFu);
        }
        // Low half: row 2k, high half: row 2k+1 (max over the even and odd columns).
        uint32_t m = qt_bf16x2_max(__byte_perm(m0, m1, 0x5410), __byte_perm(m0, m1, 0x7632));
        m = mx_max_shfl_bf16x2(m, 1);
        m = mx_max_shfl_bf16x2(m, 2);
        amax[2 * k] = __uint_as_float(m << 16);
        amax[2 * k + 1] = __uint_as_float(m & 0xFFFF0000u);
    }
}

__device__ __forceinline__ void mx_row_amax(const mx_tile_f32 &t, float amax[MX_LANE_ROWS]) {
#pragma unroll
    for (int i = 0; i < MX_LANE_ROWS; i++) {
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(t.w[i][j]));
        m = mx_max_shfl_f32(m, 1);
        amax[i] = mx_max_shfl_f32(m, 2);
    }
}

// Column amaxes of the lane's 8 columns over the tile's 32 rows (4 lanes rg), and the amax of
// the lane's whole 32 x 32 block (also over the 4 lanes cl), used by the 2-D mode.
__device__ __forceinline__ void mx_col_amax(const mx_tile_bf16 &t, float amax[8], float *block) {
    uint32_t c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < MX_LANE_ROWS; i++) {
#pragma unroll
        for (int p = 0; p < 4; p++) c[p] = qt_bf16x2_max(c[p], t.w[i][p] & 0x7FFF7FFFu);
    }
#pragma unroll
    for (int p = 0; p < 4; p++) {
        c[p] = mx_max_shfl_bf16x2(c[p], 8);
        c[p] = mx_max_shfl_bf16x2(c[p], 16);
        amax[2 * p] = __uint_as_float(c[p] << 16);
        amax[2 * p + 1] = __uint_as_float(c[p] & 0xFFFF0000u);
    }
    uint32_t m = qt_bf16x2_max(qt_bf16x2_max(c[0], c[1]), qt_bf16x2_max(c[2], c[3]));
    m = qt_bf16x2_max(m, __byte_perm(m, 0, 0x1032));  // both halves: max of the two
    m = mx_max_shfl_bf16x2(m, 1);
    m = mx_max_shfl_bf16x2(m, 2);
    *block = __uint_as_float(m << 16);
}

__device__ __forceinline__ void mx_col_amax(const mx_tile_f32 &t, float amax[8], float *block) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float c = 0.0f;
#pragma unroll
        for (int i = 0; i < MX_LANE_ROWS; i++) c = fmaxf(c, fabsf(t.w[i][j]));
        c = mx_max_shfl_f32(c, 8);
        amax[j] = mx_max_shfl_f32(c, 16);
        m = fmaxf(m, amax[j]);
    }
    m = mx_max_shfl_f32(m, 1);
    *block = mx_max_shfl_f32(m, 2);
}

// ---------------------------------------------------------------------------------------------
// Stores.

// Up to 8 elements (bytes or BF16 values, element 0 in the low bits of w[0]) at dst: one 8- or
// 16-byte store when `vec` (aligned, all 8 in range), else in_range single elements.
template <typename E>
__device__ __forceinline__ void mx_store_elems8(E *dst, const uint32_t (&w)[2 * sizeof(E)],
                                                uint32_t in_range, bool vec) {
    constexpr uint32_t kPerWord = 4u / sizeof(E);
    if (vec) {
        if constexpr (sizeof(E) == 1) {
            *(uint2 *)dst = make_uint2(w[0], w[1]);
        } else {
            *(uint4 *)dst = make_uint4(w[0], w[1], w[2], w[3]);
        }
        return;
    }
#pragma unroll
    for (uint32_t j = 0; j < 8; j++) {
        if (j < in_range) dst[j] = (E)(w[j / kPerWord] >> (8 * sizeof(E) * (j % kPerWord)));
    }
}

// Eight bytes (codes, or scale bytes) through mx_store_elems8.
__device__ __forceinline__ void mx_store8(uint8_t *dst, uint2 bytes, uint32_t in_range,
                                          bool vec) {
    const uint32_t w[2] = {bytes.x, bytes.y};
    mx_store_elems8<uint8_t>(dst, w, in_range, vec);
}

// The E8M0 scale byte back from its multiplier 2^(127 - e) (qt_e8m0_inv_f32): e = 254 - the
// multiplier's exponent field, which also holds for e = 254 (the subnormal 2^-127, field 0);
// e = 255 is the NaN multiplier.
__device__ __forceinline__ uint32_t mx_e_of_mult(float mult) {
    uint32_t bits = __float_as_uint(mult);
    return bits == QT_F32_ABS ? 0xFFu : 254u - (bits >> 23);
}

// A row's 8 codes (element 0 in the low byte of word0) as their 8 BF16 values, through the
// dequantize kernel's decode (gemm_decode.h): rowwise with the row's scale, columnwise with each
// column's scale byte (col_e, column 0 in the low byte). The decode's rounding path serves every
// scale, so no branch on the scale's range.
template <bool kE5M2, bool kRowwise>
__device__ __forceinline__ void mx_values8(uint32_t word0, uint32_t word1, float row_scale,
                                           uint2 col_e, uint32_t (&values)[4]) {
    uint32_t w[8];
    const uint4 codes = make_uint4(word0, word1, 0u, 0u);
    if constexpr (kRowwise) {
        gemm_decode_mxfp8_row<8, kE5M2, false>(codes, row_scale, w);
    } else {
        gemm_decode_mxfp8_col<8, kE5M2, false>(codes, make_uint4(col_e.x, col_e.y, 0u, 0u), w);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) values[i] = w[i];
}

// The lane's codes of one direction: row i uses mult[i] (rowwise) or column j uses mult[j]
// (columnwise). kE5M2 is a template argument so the conversion has no branch inside the loop.
// kValues: the codes' BF16 values are stored instead (QT_MXFP8_FLAG_*_VALUES); col_e holds the
// columnwise scale bytes.
template <bool kE5M2, bool kRowwise, bool kValues, class Tile>
__device__ __forceinline__ void mx_codes(const Tile &t, const float mult[8], uint64_t out,
                                         uint32_t cols, const mx_lane &l, uint32_t end,
                                         uint32_t in_range, bool vec, uint2 col_e) {
    const uint32_t elem = kE5M2 ? QT_MXFP8_E5M2 : QT_MXFP8_E4M3;
#pragma unroll
    for (int i = 0; i < MX_LANE_ROWS; i++) {
        uint32_t word[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t q[2];
#pragma unroll
            for (int s = 0; s < 2; s++) {
                int j = 4 * h + 2 * s;
                float m0 = kRowwise ? mult[i] : mult[j];
                float m1 = kRowwise ? mult[i] : mult[j + 1];
                q[s] = qt_mxfp8_encode2(t.at(i, j), t.at(i, j + 1), m0, m1, elem);
            }
            word[h] = q[0] | (q[1] << 16);
        }
        uint32_t row = l.row0 + i;
        if (row >= end) continue;
        uint64_t at = (uint64_t)row * cols + l.col0;
        if constexpr (kValues) {
            float row_scale = kRowwise ? qt_e8m0_to_f32((uint8_t)mx_e_of_mult(mult[i])) : 0.0f;
            uint32_t values[4];
            mx_values8<kE5M2, kRowwise>(word[0], word[1], row_scale, col_e, values);
            mx_store_elems8<uint16_t>((uint16_t *)out + at, values, in_range, vec);
        } else {
            mx_store8((uint8_t *)out + at, make_uint2(word[0], word[1]), in_range, vec);
        }
    }
}

// One direction's codes (or values), with the element type and the output kind resolved to
// template arguments (uniform branches).
template <bool kRowwise, class Tile>
__device__ __forceinline__ void mx_codes_dir(const Tile &t, const float mult[8], uint64_t out,
                                             const mxfp8_quantize_args &a, const mx_lane &l,
                                             uint32_t end, uint32_t in_range, uint2 col_e) {
    const bool values =
        (a.flags & (kRowwise ? QT_MXFP8_FLAG_ROW_VALUES : QT_MXFP8_FLAG_COL_VALUES)) != 0;
    if (values) {
        bool vec = in_range == 8 && ((out | 2ull * a.cols) & 15u) == 0;
        if (a.elem == QT_MXFP8_E5M2) {
            mx_codes<true, kRowwise, true>(t, mult, out, a.cols, l, end, in_range, vec, col_e);
        } else {
            mx_codes<false, kRowwise, true>(t, mult, out, a.cols, l, end, in_range, vec, col_e);
        }
        return;
    }
    bool vec = in_range == 8 && ((out | a.cols) & 7u) == 0;
    if (a.elem == QT_MXFP8_E5M2) {
        mx_codes<true, kRowwise, false>(t, mult, out, a.cols, l, end, in_range, vec, col_e);
    } else {
        mx_codes<false, kRowwise, false>(t, mult, out, a.cols, l, end, in_range, vec, col_e);
    }
}

// ---------------------------------------------------------------------------------------------
// The warp's part of a tile: load, mask padding rows, amaxes, scales, codes. Rowwise scales go
// to row_e, the block's shared staging; columnwise scales are stored by the warp itself.

// Bit t: row tile_row0 + t holds data. The warp finds the member of the tile's first row
// together (quant_group.h); with row_offsets multiples of 32 (the mxfp8 row_align) the whole
// tile lies in that member, and only a tile that crosses a member boundary looks its other rows
// up one by one, as the twin does for every row.
__device__ __forceinline__ uint32_t mx_valid_rows(const mxfp8_quantize_args &a,
                                                  uint32_t tile_row0, uint32_t end) {
    if (a.group.count == 0) return MX_FULL;
    qt_group_rows m =
        qt_group_member_rows(a.group, a.rows, qt_group_find_warp(a.group, tile_row0));
    uint32_t row = tile_row0 + (threadIdx.x & 31u);
    bool valid = row < m.valid_end;
    if (row >= m.end) valid = row < end && qt_mxfp8_row_valid(a.group, a.rows, row);
    return __ballot_sync(MX_FULL, valid);
}

// The lane's 8 x 8 elements, padding rows zeroed; nothing past `end` or `cols` is read.
template <class Tile, class T>
__device__ __forceinline__ void mx_load_tile(Tile &t, const mxfp8_quantize_args &a,
                                             const mx_lane &l, uint32_t tile_row0, uint32_t end,
                                             uint32_t in_range) {
    bool vec = in_range == 8 && ((a.in | ((uint64_t)a.cols * sizeof(T))) & 15u) == 0;
    const T *in = (const T *)a.in + (uint64_t)l.row0 * a.cols + l.col0;
    if (vec && l.row0 + MX_LANE_ROWS <= end) {
        // The common case, without a branch between the 8 independent loads.
#pragma unroll
        for (int i = 0; i < MX_LANE_ROWS; i++) {
            mx_load_row(t, i, in + (uint64_t)i * a.cols, 8, true);
        }
    } else {
#pragma unroll
        for (int i = 0; i < MX_LANE_ROWS; i++) {
            if (l.row0 + i < end && in_range > 0) {
                mx_load_row(t, i, in + (uint64_t)i * a.cols, in_range, vec);
            } else {
                t.clear_row(i);
            }
        }
    }
    // After the loads are issued: padding rows of grouped members quantize as zeros.
    uint32_t valid = mx_valid_rows(a, tile_row0, end);
#pragma unroll
    for (int i = 0; i < MX_LANE_ROWS; i++) {
        if (!((valid >> (l.rg * MX_LANE_ROWS + i)) & 1u)) t.clear_row(i);
    }
}

// One of four values by a run-time index, as selects (an indexed array would go to local memory).
__device__ __forceinline__ float mx_pick4(float v0, float v1, float v2, float v3, uint32_t i) {
    float lo = (i & 1u) ? v1 : v0, hi = (i & 1u) ? v3 : v2;
    return (i & 2u) ? hi : lo;
}

// Rowwise: scales staged in row_e (column row_e_col of the tile's [32][MX_TILE_BLOCKS]), codes
// stored. block_e >= 0 is the 2-D tile scale, used instead of the row amaxes. Deriving each
// scale in one lane instead of four (here and columnwise) cut the 1-D cast's time by 4-6% (H200).
template <class Tile>
__device__ __forceinline__ void mx_rowwise(const Tile &t, const mxfp8_quantize_args &a,
                                           const mx_lane &l, uint32_t end, uint32_t in_range,
                                           int32_t block_e, uint8_t (*row_e)[MX_TILE_BLOCKS],
                                           uint32_t row_e_col) {
    float amax[MX_LANE_ROWS], mult[MX_LANE_ROWS];
    // The 4 lanes cl of a row group hold the same 8 row amaxes: lane cl derives the scales of
    // rows cl and cl + 4 only, stages them, and the 8 multipliers are gathered by shuffles.
    uint32_t e_lo, e_hi;
    if (block_e >= 0) {
        e_lo = e_hi = (uint32_t)block_e;
    } else {
        mx_row_amax(t, amax);
        e_lo = qt_mxfp8_scale_e8m0(mx_pick4(amax[0], amax[1], amax[2], amax[3], l.cl), a.elem);
        e_hi = qt_mxfp8_scale_e8m0(mx_pick4(amax[4], amax[5], amax[6], amax[7], l.cl), a.elem);
    }
    row_e[l.rg * MX_LANE_ROWS + l.cl][row_e_col] = (uint8_t)e_lo;
    row_e[l.rg * MX_LANE_ROWS + l.cl + 4][row_e_col] = (uint8_t)e_hi;
    float m_lo = qt_e8m0_inv_f32((uint8_t)e_lo), m_hi = qt_e8m0_inv_f32((uint8_t)e_hi);
    uint32_t base = (threadIdx.x & 31u) & ~3u;
#pragma unroll
    for (int i = 0; i < MX_LANE_ROWS; i++) {
        mult[i] = __shfl_sync(MX_FULL, i < 4 ? m_lo : m_hi, base | (uint32_t)(i & 3));
    }
    mx_codes_dir<true>(t, mult, a.row_codes, a, l, end, in_range, make_uint2(0u, 0u));
}

// Columnwise: the lane's 8 column scales (stored by the lanes rg = 0) and codes.
template <class Tile>
__device__ __forceinline__ void mx_colwise(const Tile &t, const mxfp8_quantize_args &a,
                                           const mx_lane &l, uint32_t tile_row0, uint32_t end,
                                           uint32_t in_range, int32_t block_e) {
    float amax[8], mult[8], unused;
    uint32_t e[8];
    // The 4 lanes rg of a column group hold the same 8 column amaxes: lane rg derives the scales
    // of columns 2rg and 2rg + 1; the multipliers are gathered by shuffles and the scale bytes
    // recovered from them.
    uint32_t e_a, e_b;
    if (block_e >= 0) {
        e_a = e_b = (uint32_t)block_e;
    } else {
        mx_col_amax(t, amax, &unused);
        e_a = qt_mxfp8_scale_e8m0(mx_pick4(amax[0], amax[2], amax[4], amax[6], l.rg), a.elem);
        e_b = qt_mxfp8_scale_e8m0(mx_pick4(amax[1], amax[3], amax[5], amax[7], l.rg), a.elem);
    }
    float m_a = qt_e8m0_inv_f32((uint8_t)e_a), m_b = qt_e8m0_inv_f32((uint8_t)e_b);
    uint32_t low = (threadIdx.x & 31u) & 7u;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        mult[j] = __shfl_sync(MX_FULL, (j & 1) ? m_b : m_a, low | ((uint32_t)(j >> 1) << 3));
        e[j] = mx_e_of_mult(mult[j]);
    }
    uint2 bytes = make_uint2(e[0] | (e[1] << 8) | (e[2] << 16) | (e[3] << 24),
                             e[4] | (e[5] << 8) | (e[6] << 16) | (e[7] << 24));
    if (l.rg == 0 && in_range > 0 && !(a.flags & QT_MXFP8_FLAG_COL_VALUES)) {
        uint8_t *dst = (uint8_t *)a.col_scales + (uint64_t)(tile_row0 / 32u) * a.cols + l.col0;
        mx_store8(dst, bytes, in_range, in_range == 8 && ((a.col_scales | a.cols) & 7u) == 0);
    }
    mx_codes_dir<false>(t, mult, a.col_codes, a, l, end, in_range, bytes);
}

// The codes of the warp's part of a tile, its elements loaded. Rowwise runs to completion before
// columnwise, so one direction's 8 multipliers are live at a time.
template <class Tile>
__device__ __forceinline__ void mx_encode_tile(const Tile &t, const mxfp8_quantize_args &a,
                                               const mx_lane &l, uint32_t tile_row0,
                                               uint32_t end, uint32_t in_range,
                                               uint8_t (*row_e)[MX_TILE_BLOCKS],
                                               uint32_t row_e_col) {
    // 2-D: one scale per 32 x 32 block, from the block amax, for both directions.
    int32_t block_e = -1;
    if (a.flags & QT_MXFP8_FLAG_2D) {
        float col_amax[8], block_amax;
        mx_col_amax(t, col_amax, &block_amax);
        block_e = qt_mxfp8_scale_e8m0(block_amax, a.elem);
    }
    if (a.row_codes) mx_rowwise(t, a, l, end, in_range, block_e, row_e, row_e_col);
    if (a.col_codes) mx_colwise(t, a, l, tile_row0, end, in_range, block_e);
}

// The lane's columns of the tile in range: 8, fewer at the matrix's last columns, or 0.
__device__ __forceinline__ uint32_t mx_in_range(const mxfp8_quantize_args &a, const mx_lane &l) {
    return l.col0 < a.cols ? min(a.cols - l.col0, 8u) : 0u;
}

// The warp's part of a tile: load, then encode.
template <class Tile, class T>
__device__ __forceinline__ void mx_warp_tile(const mxfp8_quantize_args &a, const mx_lane &l,
                                             uint32_t tile_row0, uint32_t end,
                                             uint8_t (*row_e)[MX_TILE_BLOCKS],
                                             uint32_t row_e_col) {
    Tile t;
    uint32_t in_range = mx_in_range(a, l);
    mx_load_tile<Tile, T>(t, a, l, tile_row0, end, in_range);
    mx_encode_tile(t, a, l, tile_row0, end, in_range, row_e, row_e_col);
}

// Writes the tile's staged rowwise scales: one 8-byte store per row when aligned and whole.
__device__ __forceinline__ void mx_store_row_scales(const mxfp8_quantize_args &a,
                                                    uint8_t (*row_e)[MX_TILE_BLOCKS],
                                                    uint32_t tile_row0, uint32_t kt,
                                                    uint32_t end) {
    uint32_t t = threadIdx.x;
    if (t >= QT_MXFP8_TILE_ROWS || tile_row0 + t >= end) return;
    uint32_t blocks = (a.cols + 31u) / 32u;
    uint32_t block0 = kt * MX_TILE_BLOCKS;
    uint32_t n = min(blocks - block0, MX_TILE_BLOCKS);
    uint8_t *dst = (uint8_t *)a.row_scales + (uint64_t)(tile_row0 + t) * blocks + block0;
    if (n == MX_TILE_BLOCKS && ((uintptr_t)dst % MX_TILE_BLOCKS) == 0) {
        *(mx_row_e_vec *)dst = *(const mx_row_e_vec *)row_e[t];
        return;
    }
    for (uint32_t b = 0; b < n; b++) dst[b] = row_e[t][b];
}

// The lane's place in the tile of row tile tile_row0 / 32 and column tile kt.
__device__ __forceinline__ void mx_lane_set(mx_lane &l, uint32_t lane, uint32_t warp,
                                            uint32_t tile_row0, uint32_t kt) {
    l.rg = lane >> 3;
    l.cb = (lane >> 2) & 1u;
    l.cl = lane & 3u;
    l.row0 = tile_row0 + l.rg * MX_LANE_ROWS;
    l.col0 = kt * QT_MXFP8_TILE_COLS + warp * 64u + l.cb * 32u + l.cl * 8u;
}

template <class Tile, class T>
__device__ __forceinline__ void mx_quantize(const mxfp8_quantize_args &a) {
    __shared__ __align__(16) uint8_t row_e[QT_MXFP8_TILE_ROWS][MX_TILE_BLOCKS];
    uint32_t col_tiles = (a.cols + QT_MXFP8_TILE_COLS - 1) / QT_MXFP8_TILE_COLS;
    uint32_t mt = blockIdx.x / col_tiles, kt = blockIdx.x % col_tiles;
    uint32_t tile_row0 = mt * QT_MXFP8_TILE_ROWS;
    uint32_t end = qt_group_active_rows(a.group, a.rows);
    if (tile_row0 >= end) return;  // the whole block: nothing of this tile is active
    uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    mx_lane l;
    mx_lane_set(l, lane, warp, tile_row0, kt);
    // Warp-uniform: a warp wholly past the last column has nothing to do (shuffles inside need
    // the whole warp, which this keeps together).
    if (kt * QT_MXFP8_TILE_COLS + warp * 64u < a.cols) {
        mx_warp_tile<Tile, T>(a, l, tile_row0, end, row_e, warp * 2u + l.cb);
    }
    if (a.row_codes && !(a.flags & QT_MXFP8_FLAG_ROW_VALUES)) {  // uniform
        __syncthreads();  // every warp's row_e entries are staged
        mx_store_row_scales(a, row_e, tile_row0, kt, end);
    }
}

// BF16: at least 8 blocks (32 warps) per SM, so enough loads are in flight; that caps the kernel
// at 64 registers, which it fits without spills (uncapped it takes 72, 7 blocks).
extern "C" __global__ void __launch_bounds__(QT_MXFP8_THREADS, 8)
    qt_mxfp8_quantize_bf16(const __grid_constant__ mxfp8_quantize_args args) {
    qt_grid_enter();
    mx_quantize<mx_tile_bf16, uint16_t>(args);
}

extern "C" __global__ void __launch_bounds__(QT_MXFP8_THREADS)
    qt_mxfp8_quantize_f32(const __grid_constant__ mxfp8_quantize_args args) {
    qt_grid_enter();
    mx_quantize<mx_tile_f32, float>(args);
}

// ---------------------------------------------------------------------------------------------
// An activation and the MXFP8 cast of its output (mxfp8_act_args). A lane loads its 8 x 8
// elements of x (backward: and stages its dy beside them), turns each row's eight into y's BF16
// words through the block's table (ptx/act_math.h, qt_act_table_words: act.cu's values and
// rounding) in its registers, and from there on encodes them as the cast does (mx_encode_tile),
// so codes, scales and values are qt_mxfp8_quantize_bf16's for the stored y. A block runs many
// tiles, so its table (4096 exact evaluations) is paid once. Fusing halves the bytes moved but
// adds the table's work to the cast's: on an H200 the fused forward takes about 300 us for
// 8192 x 16384 against 153 + 169 us for the activation and the cast apart, the backward about
// 420 against 215 + 234 (BENCHMARKS.md).

// Row i of the lane's 8 x 8 elements of a BF16 [rows][cols] tensor as loaded: columns are whole
// vectors (cols % 8 == 0, 16-byte aligned), so a lane's 8 are all in range or none. Rows past
// `end` and columns past `cols` read as zeros, whose y (and dx) is zero: no amax changes and
// nothing of them is stored.
__device__ __forceinline__ uint4 mx_act_load_row(uint64_t tensor, uint32_t cols, const mx_lane &l,
                                                 int i, uint32_t end, uint32_t in_range) {
    if (in_range == 0 || l.row0 + i >= end) return make_uint4(0u, 0u, 0u, 0u);
    const uint4 *row = (const uint4 *)tensor + ((uint64_t)(l.row0 + i) * cols + l.col0) / 8u;
    return __ldg(row);
}

__device__ __forceinline__ void mx_tile_set_row(mx_tile_bf16 &t, int i, uint4 v) {
    t.w[i][0] = v.x;
    t.w[i][1] = v.y;
    t.w[i][2] = v.z;
    t.w[i][3] = v.w;
}

__device__ __forceinline__ uint4 mx_tile_row(const mx_tile_bf16 &t, int i) {
    return make_uint4(t.w[i][0], t.w[i][1], t.w[i][2], t.w[i][3]);
}

// Backward's staging of dy: each lane copies its 8 rows of 8 dy values into shared memory by
// cp.async (no registers while in flight) and reads back only what it copied, so its own
// cp.async.wait_all is the only ordering needed; meanwhile its 8 rows of x are loaded into the
// tile's registers. Row r of the tile, 16-byte vector v of its 32: [r][v]. A quarter warp reads
// 8 consecutive vectors of one row (128 contiguous bytes): no bank conflict.
typedef uint4 mx_dy_stage[QT_MXFP8_TILE_ROWS][QT_MXFP8_TILE_COLS / 8u];

// Forward: the tile holds x, turned into y in place. Backward: the tile holds x, dy arrives in
// `stage`, and each row of the two is turned into dx's row of the tile.
template <bool kBackward>
__device__ __forceinline__ void mx_act_warp_tile(const mxfp8_act_args &a, const float *table,
                                                 mx_dy_stage &stage, const mx_lane &l,
                                                 uint32_t tile_row0, uint32_t end,
                                                 uint8_t (*row_e)[MX_TILE_BLOCKS],
                                                 uint32_t row_e_col) {
    const mxfp8_quantize_args &c = a.cast;
    mx_tile_bf16 t;
    uint32_t in_range = mx_in_range(c, l);
    uint32_t v = (l.col0 % QT_MXFP8_TILE_COLS) / 8u, r0 = l.rg * MX_LANE_ROWS;
    if (kBackward) {
        const uint4 *dy = (const uint4 *)a.dy;
#pragma unroll
        for (int i = 0; i < MX_LANE_ROWS; i++) {
            bool ok = in_range > 0 && l.row0 + i < end;
            uint64_t at = ok ? ((uint64_t)(l.row0 + i) * c.cols + l.col0) / 8u : 0u;
            qt_cp_async16(&stage[r0 + i][v], dy + at, ok ? 16u : 0u);
        }
    }
#pragma unroll
    for (int i = 0; i < MX_LANE_ROWS; i++) {
        mx_tile_set_row(t, i, mx_act_load_row(c.in, c.cols, l, i, end, in_range));
    }
    if (kBackward) qt_cp_async_wait_all();
#pragma unroll
    for (int i = 0; i < MX_LANE_ROWS; i++) {
        uint4 x = mx_tile_row(t, i);
        uint4 g = kBackward ? stage[r0 + i][v] : x;
        mx_tile_set_row(t, i, qt_act_table_words<kBackward>(a.act, table, x, g));
    }
    mx_encode_tile(t, c, l, tile_row0, end, in_range, row_e, row_e_col);
}

template <bool kBackward>
__device__ __forceinline__ void mx_act_quantize(const mxfp8_act_args &a) {
    // The launch's dynamic shared memory: the table (QT_ACT_LUT_ENTRIES floats), then backward's
    // staging of dy (mx_dy_stage).
    extern __shared__ __align__(16) float mx_act_table[];
    mx_dy_stage &stage = *(mx_dy_stage *)(mx_act_table + QT_ACT_LUT_ENTRIES);
    __shared__ __align__(16) uint8_t row_e[QT_MXFP8_TILE_ROWS][MX_TILE_BLOCKS];
    qt_act_table_fill(mx_act_table, a.act, kBackward, QT_MXFP8_THREADS);
    __syncthreads();  // the table is complete
    const mxfp8_quantize_args &c = a.cast;
    uint32_t col_tiles = (c.cols + QT_MXFP8_TILE_COLS - 1) / QT_MXFP8_TILE_COLS;
    uint32_t tiles = col_tiles * ((c.rows + QT_MXFP8_TILE_ROWS - 1) / QT_MXFP8_TILE_ROWS);
    uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (uint32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform
        uint32_t mt = tile / col_tiles, kt = tile % col_tiles;
        uint32_t tile_row0 = mt * QT_MXFP8_TILE_ROWS;
        mx_lane l;
        mx_lane_set(l, lane, warp, tile_row0, kt);
        if (kt * QT_MXFP8_TILE_COLS + warp * 64u < c.cols) {  // warp-uniform, as the cast's
            mx_act_warp_tile<kBackward>(a, mx_act_table, stage, l, tile_row0, c.rows, row_e,
                                        warp * 2u + l.cb);
        }
        if (c.row_codes && !(c.flags & QT_MXFP8_FLAG_ROW_VALUES)) {  // uniform
            __syncthreads();  // every warp's row_e entries are staged
            mx_store_row_scales(c, row_e, tile_row0, kt, c.rows);
            __syncthreads();  // row_e read before the next tile's entries
        }
    }
}

// Forward: seven blocks an SM, 71 registers without spills (at eight, 64, the table's
// out-of-line misses and the division's slow path spill), 16 KiB of table each. Backward: five,
// 86 registers (at six, 80, the row loop spills), 32 KiB of table and staged dy each.
extern "C" __global__ void __launch_bounds__(QT_MXFP8_THREADS, QT_MXFP8_ACT_FWD_BLOCKS_PER_SM)
    qt_mxfp8_act_fwd(const __grid_constant__ mxfp8_act_args args) {
    qt_grid_enter();
    mx_act_quantize<false>(args);
}

extern "C" __global__ void __launch_bounds__(QT_MXFP8_THREADS, QT_MXFP8_ACT_BWD_BLOCKS_PER_SM)
    qt_mxfp8_act_bwd(const __grid_constant__ mxfp8_act_args args) {
    qt_grid_enter();
    mx_act_quantize<true>(args);
}

// ---------------------------------------------------------------------------------------------
// Dequantize: grid-stride over 16-element chunks of the active rows (rows at or beyond the
// group's end are not written). A chunk lies inside one 32-block of its row, so rowwise it needs
// one scale byte, columnwise the 16 scale bytes of its columns.

__device__ __forceinline__ void mx_load16(const uint8_t *src, uint32_t n, bool vec,
                                          uint32_t word[4]) {
    if (vec) {
        uint4 v = *(const uint4 *)src;
        word[0] = v.x;
        word[1] = v.y;
        word[2] = v.z;
        word[3] = v.w;
        return;
    }
#pragma unroll
    for (uint32_t w = 0; w < 4; w++) {
        word[w] = 0;
#pragma unroll
        for (uint32_t b = 0; b < 4; b++) {
            if (4 * w + b < n) word[w] |= (uint32_t)src[4 * w + b] << (8 * b);
        }
    }
}

__device__ __forceinline__ void mx_store16(const mxfp8_dequantize_args &a, uint64_t index,
                                           const float v[16], uint32_t n, bool vec) {
    if (vec && a.dtype == QT_DTYPE_F32) {
        float4 *dst = (float4 *)((float *)a.out + index);
#pragma unroll
        for (int q = 0; q < 4; q++) dst[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2],
                                                         v[4 * q + 3]);
        return;
    }
    if (vec) {
        uint32_t h[8];
#pragma unroll
        for (int q = 0; q < 8; q++) {
            h[q] = qt_f32_to_bf16(v[2 * q]) | ((uint32_t)qt_f32_to_bf16(v[2 * q + 1]) << 16);
        }
        uint4 *dst = (uint4 *)((uint16_t *)a.out + index);
        dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
        dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
        return;
    }
#pragma unroll
    for (uint32_t j = 0; j < 16; j++) {
        if (j < n) qt_mxfp8_store((void *)a.out, a.dtype, index + j, v[j]);
    }
}

// BF16 output of a whole chunk through the MXFP8 GEMMs' decode (gemm_decode.h: f16 conversion
// of the codes, the scale applied in FP32, BF16 pairs packed; the decode table test holds it to
// qt_f32_to_bf16 of the product for every code and scale, NaN codes and the NaN scale 0xFF
// included: both give 0x7FFF, as the C path's qt_mxfp8_decode does). About a third of the
// instructions of the C path, which left BF16 copies of training tensors compute-bound.
template <bool kE5M2>
__device__ __forceinline__ void mx_dequant_bf16_fast_elem(const mxfp8_dequantize_args &a,
                                                          uint64_t index, const uint4 &codes,
                                                          const uint4 &scales) {
    uint32_t w[8];
    if (a.colwise) {
        if (gemm_scales_exact<16>(scales)) {
            gemm_decode_mxfp8_col<16, kE5M2, true>(codes, scales, w);
        } else {
            gemm_decode_mxfp8_col<16, kE5M2, false>(codes, scales, w);
        }
    } else {
        uint32_t e = scales.x & 0xFFu;
        if (e >= GEMM_MXFP8_EXACT_SCALE_MIN) {
            gemm_decode_mxfp8_row<16, kE5M2, true>(codes, qt_e8m0_to_f32((uint8_t)e), w);
        } else {
            gemm_decode_mxfp8_row<16, kE5M2, false>(codes, qt_e8m0_to_f32((uint8_t)e), w);
        }
    }
    uint4 *dst = (uint4 *)((uint16_t *)a.out + index);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

__device__ __forceinline__ void mx_dequant_bf16_fast(const mxfp8_dequantize_args &a,
                                                     uint64_t index, const uint32_t code[4],
                                                     const uint32_t scale[4]) {
    uint4 codes = make_uint4(code[0], code[1], code[2], code[3]);
    uint4 scales = make_uint4(scale[0], scale[1], scale[2], scale[3]);
    if (a.elem == QT_MXFP8_E5M2) {
        mx_dequant_bf16_fast_elem<true>(a, index, codes, scales);
    } else {
        mx_dequant_bf16_fast_elem<false>(a, index, codes, scales);
    }
}

extern "C" __global__ void __launch_bounds__(256)
    qt_mxfp8_dequantize(const __grid_constant__ mxfp8_dequantize_args args) {
    qt_grid_enter();
    const mxfp8_dequantize_args &a = args;
    uint32_t end = qt_group_active_rows(a.group, a.rows);
    uint64_t chunks_per_row = (a.cols + 15u) / 16u;
    uint64_t chunks = (uint64_t)end * chunks_per_row;
    uint32_t blocks = (a.cols + 31u) / 32u;
    // Every row start is 16-byte aligned for codes, scales and output alike when K % 16 == 0.
    bool vec = ((a.codes | a.scales | a.out | a.cols) & 15u) == 0;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t q = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; q < chunks; q += stride) {
        uint32_t row = (uint32_t)(q / chunks_per_row);
        uint32_t col0 = (uint32_t)(q % chunks_per_row) * 16u;
        uint32_t n = min(a.cols - col0, 16u);
        uint64_t index = (uint64_t)row * a.cols + col0;
        uint32_t code[4], scale[4];
        mx_load16((const uint8_t *)a.codes + index, n, vec, code);
        if (a.colwise) {
            mx_load16((const uint8_t *)a.scales + (uint64_t)(row / 32u) * a.cols + col0, n, vec,
                      scale);
        } else {
            uint32_t e = ((const uint8_t *)a.scales)[(uint64_t)row * blocks + col0 / 32u];
            scale[0] = scale[1] = scale[2] = scale[3] = e * 0x01010101u;
        }
        if (vec && a.dtype == QT_DTYPE_BF16) {
            mx_dequant_bf16_fast(a, index, code, scale);
            continue;
        }
        float v[16];
#pragma unroll
        for (uint32_t j = 0; j < 16; j++) {
            uint8_t c = (uint8_t)(code[j / 4] >> (8 * (j % 4)));
            uint8_t e = (uint8_t)(scale[j / 4] >> (8 * (j % 4)));
            v[j] = qt_mxfp8_decode(c, e, a.elem);
        }
        mx_store16(a, index, v, n, vec);
    }
}
