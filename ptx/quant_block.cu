// quant_block kernels: FP8 block scaling casts (1x128 fused rowwise + columnwise, 128x128) and
// their dequantization (ABI, layouts and per-block arithmetic in quant_block.h).
//
// Tiling, shared by every kernel here: one block of 256 threads per 128 x 128 tile of the
// M x K matrix (tile index = blockIdx.x, K tiles fastest). Each thread owns an 8 x 8 sub-block,
// rows 8g..8g+7 and eight columns of vector slot c (g, c in 0..15):
//
//   lane bits  l[2:0] -> c (low 3 bits)   warp bit w[0] -> c (bit 3)
//              l[4:3] -> g (low 2 bits)   warp bits w[2:1] -> g (bits 3:2)
//
// so that 8 lanes cover 8 consecutive 16-byte vectors of one row (coalesced loads and rowwise
// stores) and 4 lanes cover 32 consecutive bytes of one row of the transposed columnwise codes
// (whole 32-byte sectors). Owning the 8 x 8 block makes the transpose free: a thread packs its
// columnwise codes along M straight from registers, so the input is read exactly once and no
// code goes through shared memory. Only the block amaxes are exchanged there.
//
// BF16 casts stage the input tile in shared memory first (cp.async, 32 KiB, no registers while
// in flight) and read each thread's block from there for the amaxes and again for the codes, so
// no data register lives across a barrier: 64 registers and 4 blocks per SM instead of 105 and
// 2, which took the dense 1-D cast from 85% to 91% of copy and the 2-D one from 88% to 93%
// (H200). FP32 tiles (64 KiB) exceed the static shared-memory limit and keep the register path.
#include "ptx/quant_block.h"
#include "ptx/cp_async.h"    // qt_cp_async16, the staged BF16 casts
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement
#include "ptx/quant_group.h"  // qt_group_find_warp

#define QB_THREADS 256u
#define QB_TILE 128u
// Shared rows of partial amaxes are padded to 132 floats: a quarter warp storing 16 bytes per
// lane from 8 consecutive c (stride 132 = 4 mod 32 words) then touches 8 distinct bank quads.
#define QB_PART_STRIDE 132u

// ---------------------------------------------------------------------------------------------
// Thread layout and input types.

__device__ __forceinline__ uint32_t qb_slot_c() {
    return ((threadIdx.x >> 5) & 1u) * 8u + (threadIdx.x & 7u);
}
__device__ __forceinline__ uint32_t qb_group_g() {
    return (threadIdx.x >> 6) * 4u + ((threadIdx.x >> 3) & 3u);
}

// BF16: a thread row is one 16-byte vector of 8 elements at tile column 8c.
// FP32: two 16-byte vectors of 4 elements at tile columns 4c and 64 + 4c, so that the 8 lanes of
// one row still read 128 consecutive bytes per load.
template <typename T>
struct qb_in;
template <>
struct qb_in<uint16_t> {
    static constexpr uint32_t VEC = 8;    // elements per 16-byte vector
    static constexpr uint32_t NVEC = 1;   // vectors per thread row
    static constexpr uint32_t WORDS = 4;  // 32-bit words per thread row
    static constexpr uint32_t DTYPE = QT_DTYPE_BF16;
};
template <>
struct qb_in<float> {
    static constexpr uint32_t VEC = 4;
    static constexpr uint32_t NVEC = 2;
    static constexpr uint32_t WORDS = 8;
    static constexpr uint32_t DTYPE = QT_DTYPE_F32;
};

// Tile column of vector v of slot c, and of element j (0..7) of a thread row.
template <typename T>
__device__ __forceinline__ uint32_t qb_vec_col(uint32_t c, uint32_t v) {
    return qb_in<T>::VEC == 8 ? 8u * c : 4u * c + 64u * v;
}
template <typename T>
__device__ __forceinline__ uint32_t qb_col(uint32_t c, uint32_t j) {
    return qb_vec_col<T>(c, j / qb_in<T>::VEC) + j % qb_in<T>::VEC;
}

// Element j of a thread row as FP32 (BF16 -> FP32 is exact: the bits move up).
template <typename T>
__device__ __forceinline__ float qb_elem(const uint32_t (&w)[qb_in<T>::WORDS], uint32_t j) {
    if (qb_in<T>::DTYPE == QT_DTYPE_BF16) {
        return __uint_as_float((j & 1u) ? (w[j >> 1] & 0xFFFF0000u) : (w[j >> 1] << 16));
    }
    return __uint_as_float(w[j]);
}

// Loads one vector (VEC elements from column kc of a row) into `w`; elements outside the matrix
// read as +0, which changes no amax and is never stored.
template <typename T>
__device__ __forceinline__ void qb_load_vec(const T *row, uint32_t kc, uint32_t cols, bool row_ok,
                                            bool vec_ok, uint32_t *w) {
    constexpr uint32_t VEC = qb_in<T>::VEC;
    if (row_ok && vec_ok && kc + VEC <= cols) {
        uint4 v = __ldg(reinterpret_cast<const uint4 *>(row + kc));
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
        return;
    }
#pragma unroll
    for (uint32_t e = 0; e < 4; e++) w[e] = 0;
#pragma unroll
    for (uint32_t e = 0; e < VEC; e++) {
        if (!row_ok || kc + e >= cols) continue;
        if (qb_in<T>::DTYPE == QT_DTYPE_BF16) {
            w[e >> 1] |= (uint32_t)((const uint16_t *)row)[kc + e] << (16 * (e & 1u));
        } else {
            w[e] = __float_as_uint(((const float *)row)[kc + e]);
        }
    }
}

// Stores the first n of N codes (bytes of w0 then w1, low byte first) at dst: one 4- or 8-byte
// store when `whole` (aligned) and n == N, single bytes otherwise.
template <uint32_t N>
__device__ __forceinline__ void qb_store_codes(uint8_t *dst, uint32_t w0, uint32_t w1, bool whole,
                                               uint32_t n) {
    if (whole && n == N) {
        if (N == 8) {
            *reinterpret_cast<uint2 *>(dst) = make_uint2(w0, w1);
        } else {
            *reinterpret_cast<uint32_t *>(dst) = w0;
        }
        return;
    }
#pragma unroll
    for (uint32_t e = 0; e < N; e++) {
        if (e < n) dst[e] = (uint8_t)((e < 4 ? w0 : w1) >> (8 * (e & 3u)));
    }
}

// ---------------------------------------------------------------------------------------------
// The cast.

// STAGED: the BF16 path that copies the input tile into shared memory (cp.async) instead of
// loading it into registers; its amax partials are first reduced inside each warp, so fewer
// shared partial rows are left.
template <bool TWO_D, bool STAGED>
struct qb_smem;
template <>
struct __align__(16) qb_smem<false, false> {
    static constexpr uint32_t ROW_PARTS = 16, COL_PARTS = 16;
    float row_part[16][QB_PART_STRIDE];  // [c][tile row]: amax of a row over slot c's columns
    float col_part[16][QB_PART_STRIDE];  // [g][tile col]: amax of a column over group g's rows
    float row_scale[QB_TILE];
    float col_scale[QB_TILE];
    uint8_t row_state[QB_TILE];
};
template <>
struct __align__(16) qb_smem<true, false> {
    float warp_amax[QB_THREADS / 32];
    float tile_scale;
    uint8_t row_state[QB_TILE];
};
template <>
struct __align__(16) qb_smem<false, true> {
    static constexpr uint32_t ROW_PARTS = 2, COL_PARTS = 4;
    uint4 tile[QB_TILE][QB_TILE / 8];  // [tile row][16-byte vector]: the BF16 input tile
    float row_part[2][QB_TILE];        // [c >> 3][tile row]: amax over 64 columns
    float col_part[4][QB_TILE];        // [g >> 2][tile col]: amax over 32 rows
    float row_scale[QB_TILE];
    float col_scale[QB_TILE];
    uint8_t row_state[QB_TILE];
};
template <>
struct __align__(16) qb_smem<true, true> {
    uint4 tile[QB_TILE][QB_TILE / 8];
    float warp_amax[QB_THREADS / 32];
    float tile_scale;
    uint8_t row_state[QB_TILE];
};

// Scale of tile row r / tile column k for the cast: per block (1-D) or the tile's (2-D).
template <bool TWO_D, bool STAGED>
__device__ __forceinline__ float qb_row_scale(const qb_smem<TWO_D, STAGED> &sm, uint32_t r) {
    if constexpr (TWO_D) {
        return sm.tile_scale;
    } else {
        return sm.row_scale[r];
    }
}
template <bool TWO_D, bool STAGED>
__device__ __forceinline__ float qb_col_scale(const qb_smem<TWO_D, STAGED> &sm, uint32_t k) {
    if constexpr (TWO_D) {
        return sm.tile_scale;
    } else {
        return sm.col_scale[k];
    }
}

// Per-tile geometry and flags every phase needs.
struct qb_tile {
    uint32_t m0, k0, tm, tk, tiles_m, tiles_k;
    uint32_t active;  // rows [0, active) are written
    uint32_t c, g;
    bool rowwise, colwise;
};

template <typename T>
__device__ __forceinline__ void qb_load_tile(const quant_block_args &a, const qb_tile &t,
                                             uint32_t (&x)[8][qb_in<T>::WORDS]) {
    const T *in = reinterpret_cast<const T *>(a.input);
    bool vec_ok = a.cols % qb_in<T>::VEC == 0 && a.input % 16 == 0;
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        uint32_t m = t.m0 + 8 * t.g + i;
        bool row_ok = m < a.rows;
        const T *row = in + (uint64_t)(row_ok ? m : 0) * a.cols + t.k0;
#pragma unroll
        for (uint32_t v = 0; v < qb_in<T>::NVEC; v++) {
            qb_load_vec<T>(row, qb_vec_col<T>(t.c, v), a.cols - t.k0, row_ok, vec_ok, &x[i][4 * v]);
        }
    }
}

// Staged 1-D partials: the thread's row and column maxima reduced inside the warp first, so
// only 2 (rows) and 4 (columns) shared partial rows are left for qb_scales.
__device__ __forceinline__ void qb_partials_warp(const qb_tile &t, const float (&rp)[8],
                                                 const float (&cp)[8],
                                                 qb_smem<false, true> &sm) {
    // Recursive halving: each step a lane keeps half of its values, sends the other half
    // to its partner and folds in what it receives. Rows: over the warp's 8 slots c (lane
    // bits 2:0), after which lane bits 2:0 name the row of 8 whose max the lane holds (the
    // warp's half of the row: warp bit 0 = c bit 3, part w & 1). Columns: over the warp's 4
    // groups g (lane bits 4:3); lane bits 4:3 then name the column pair (j, j + 1) the lane
    // holds (the warp's quarter of the rows: warp bits 2:1, part w >> 1).
    uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (t.rowwise) {
        float v4[4], v2[2];
        bool b = (lane & 4u) != 0;
#pragma unroll
        for (uint32_t k = 0; k < 4; k++) {
            float send = b ? rp[k] : rp[k + 4], keep = b ? rp[k + 4] : rp[k];
            v4[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 4));
        }
        b = (lane & 2u) != 0;
#pragma unroll
        for (uint32_t k = 0; k < 2; k++) {
            float send = b ? v4[k] : v4[k + 2], keep = b ? v4[k + 2] : v4[k];
            v2[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 2));
        }
        b = (lane & 1u) != 0;
        float send = b ? v2[0] : v2[1], keep = b ? v2[1] : v2[0];
        sm.row_part[warp & 1u][8 * t.g + (lane & 7u)] =
            fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 1));
    }
    if (t.colwise) {
        float v4[4], v2[2];
        bool b = (lane & 16u) != 0;
#pragma unroll
        for (uint32_t k = 0; k < 4; k++) {
            float send = b ? cp[k] : cp[k + 4], keep = b ? cp[k + 4] : cp[k];
            v4[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 16));
        }
        b = (lane & 8u) != 0;
#pragma unroll
        for (uint32_t k = 0; k < 2; k++) {
            float send = b ? v4[k] : v4[k + 2], keep = b ? v4[k + 2] : v4[k];
            v2[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 8));
        }
        uint32_t j = 2 * ((lane >> 3) & 3u);  // BF16: columns 8c + j and 8c + j + 1
        *reinterpret_cast<float2 *>(&sm.col_part[warp >> 1][8 * t.c + j]) =
            make_float2(v2[0], v2[1]);
    }
}

// BF16 row and column maxima of |x| over the thread's 8 x 8 block, two elements an operation:
// the sign bits cleared in the packed words, then max.bf16x2, which returns the other operand
// for a NaN as fmaxf does. A maximum of BF16 values is one of them, so each partial is the FP32
// path's bits, except that a row or column of NaNs only gives NaN where that path gives +0:
// every later step (the warp's and the tile's fmaxf, from +0 in qb_scales) drops it alike.
// About half the instructions of unpacking each element to FP32 (the casts are issue-bound).
__device__ __forceinline__ void qb_partials_bf16x2(const uint32_t (&x)[8][4], float (&rp)[8],
                                                   float (&cp)[8]) {
    uint32_t col[4];  // word k: the maxima of columns 2k (low half) and 2k + 1
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        uint32_t a[4];
#pragma unroll
        for (uint32_t k = 0; k < 4; k++) {
            a[k] = x[i][k] & 0x7FFF7FFFu;
            col[k] = i == 0 ? a[k] : qt_bf16x2_max(col[k], a[k]);
        }
        uint32_t row = qt_bf16x2_max(qt_bf16x2_max(a[0], a[1]), qt_bf16x2_max(a[2], a[3]));
        rp[i] = fmaxf(__uint_as_float(row << 16), __uint_as_float(row & 0xFFFF0000u));
    }
#pragma unroll
    for (uint32_t k = 0; k < 4; k++) {
        cp[2 * k] = __uint_as_float(col[k] << 16);
        cp[2 * k + 1] = __uint_as_float(col[k] & 0xFFFF0000u);
    }
}

// Partial amaxes of the thread's 8 x 8 block into shared memory (1-D: per row and per column;
// 2-D: one per warp). |x| is taken on the bits; fmaxf ignores NaN like qt_block_amax_step.
template <typename T, bool TWO_D, bool STAGED>
__device__ __forceinline__ void qb_partials(const qb_tile &t,
                                            const uint32_t (&x)[8][qb_in<T>::WORDS],
                                            qb_smem<TWO_D, STAGED> &sm) {
    float rp[8], cp[8];
    if constexpr (qb_in<T>::DTYPE == QT_DTYPE_BF16) {
        qb_partials_bf16x2(x, rp, cp);
    } else {
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) cp[j] = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < 8; i++) {
            rp[i] = 0.0f;
#pragma unroll
            for (uint32_t j = 0; j < 8; j++) {
                float v = __uint_as_float(__float_as_uint(qb_elem<T>(x[i], j)) & QT_F32_ABS);
                rp[i] = fmaxf(rp[i], v);
                cp[j] = fmaxf(cp[j], v);
            }
        }
    }
    if constexpr (TWO_D) {
        float amax = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < 8; i++) amax = fmaxf(amax, rp[i]);
#pragma unroll
        for (uint32_t lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
            amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lane_mask));
        }
        if ((threadIdx.x & 31u) == 0) sm.warp_amax[threadIdx.x >> 5] = amax;
    } else if constexpr (STAGED) {
        qb_partials_warp(t, rp, cp, sm);
    } else {
        if (t.rowwise) {
            float4 *dst = reinterpret_cast<float4 *>(&sm.row_part[t.c][8 * t.g]);
            dst[0] = make_float4(rp[0], rp[1], rp[2], rp[3]);
            dst[1] = make_float4(rp[4], rp[5], rp[6], rp[7]);
        }
        if (t.colwise) {
#pragma unroll
            for (uint32_t q = 0; q < 2; q++) {
                float4 *dst = reinterpret_cast<float4 *>(&sm.col_part[t.g][qb_col<T>(t.c, 4 * q)]);
                *dst = make_float4(cp[4 * q], cp[4 * q + 1], cp[4 * q + 2], cp[4 * q + 3]);
            }
        }
    }
}

// Block amaxes -> scales (kept in shared memory for the cast) and scale_inv (written out).
// 1-D: threads 0..127 own the tile's 128 columnwise blocks, threads 128..255 its 128 rowwise
// blocks. 2-D: thread 0 owns the tile.
template <typename T, bool TWO_D, uint32_t FP8, bool STAGED>
__device__ __forceinline__ void qb_scales(const quant_block_args &a, const qb_tile &t,
                                          qb_smem<TWO_D, STAGED> &sm) {
    constexpr uint32_t DTYPE = qb_in<T>::DTYPE;
    if constexpr (TWO_D) {
        if (threadIdx.x != 0) return;
        float amax = 0.0f;
#pragma unroll
        for (uint32_t w = 0; w < QB_THREADS / 32; w++) amax = fmaxf(amax, sm.warp_amax[w]);
        float scale = qt_block_scale(amax, FP8, a.pow2, a.eps, DTYPE);
        float scale_inv = qt_block_scale_inv(scale);
        sm.tile_scale = scale;
        if (t.rowwise) {
            ((float *)a.row_scale_inv)[(uint64_t)t.tm * t.tiles_k + t.tk] = scale_inv;
        }
        if (t.colwise) {
            ((float *)a.col_scale_inv)[(uint64_t)t.tk * t.tiles_m + t.tm] = scale_inv;
        }
    } else {
        uint32_t b = threadIdx.x & (QB_TILE - 1);
        bool col_thread = threadIdx.x < QB_TILE;
        if (col_thread ? !t.colwise : !t.rowwise) return;
        typedef qb_smem<TWO_D, STAGED> S;
        float amax = 0.0f;
        if (col_thread) {
#pragma unroll
            for (uint32_t p = 0; p < S::COL_PARTS; p++) amax = fmaxf(amax, sm.col_part[p][b]);
        } else {
#pragma unroll
            for (uint32_t p = 0; p < S::ROW_PARTS; p++) amax = fmaxf(amax, sm.row_part[p][b]);
        }
        float scale = qt_block_scale(amax, FP8, a.pow2, a.eps, DTYPE);
        float scale_inv = qt_block_scale_inv(scale);
        if (col_thread) {
            sm.col_scale[b] = scale;
            if (t.k0 + b < a.cols) {
                ((float *)a.col_scale_inv)[(uint64_t)t.tm * a.cols + t.k0 + b] = scale_inv;
            }
        } else {
            sm.row_scale[b] = scale;
            if (sm.row_state[b] != QT_BLOCK_ROW_SKIP) {
                ((float *)a.row_scale_inv)[(uint64_t)t.tk * a.rows + t.m0 + b] = scale_inv;
            }
        }
    }
}

// Codes of the thread's block: rowwise along its 8 columns (one store per row), columnwise along
// its 8 rows (one store per column of the transposed output). With 2-D both use the tile scale,
// so the columnwise codes come out as the byte transpose of the rowwise ones.
template <typename T, bool TWO_D, uint32_t FP8, bool STAGED>
__device__ __forceinline__ void qb_cast_store(const quant_block_args &a, const qb_tile &t,
                                              const uint32_t (&x)[8][qb_in<T>::WORDS],
                                              const qb_smem<TWO_D, STAGED> &sm) {
    constexpr uint32_t VEC = qb_in<T>::VEC;
    uint32_t rows_here = t.active - t.m0 < 8 * t.g ? 0 : t.active - t.m0 - 8 * t.g;
    if (rows_here > 8) rows_here = 8;  // rows of this thread below `active`
    if (t.rowwise) {
        uint8_t *codes = (uint8_t *)a.row_codes;
        bool whole = a.cols % VEC == 0 && a.row_codes % VEC == 0;
#pragma unroll
        for (uint32_t i = 0; i < 8; i++) {
            if (i >= rows_here) break;
            float s = qb_row_scale(sm, 8 * t.g + i);
            uint32_t w[2];
#pragma unroll
            for (uint32_t q = 0; q < 2; q++) {
                uint32_t lo = qt_block_fp8x2(qb_elem<T>(x[i], 4 * q) * s,
                                             qb_elem<T>(x[i], 4 * q + 1) * s, FP8);
                uint32_t hi = qt_block_fp8x2(qb_elem<T>(x[i], 4 * q + 2) * s,
                                             qb_elem<T>(x[i], 4 * q + 3) * s, FP8);
                w[q] = lo | hi << 16;
            }
            uint8_t *row = codes + (uint64_t)(t.m0 + 8 * t.g + i) * a.cols + t.k0;
#pragma unroll
            for (uint32_t v = 0; v < qb_in<T>::NVEC; v++) {
                uint32_t kc = qb_vec_col<T>(t.c, v);
                uint32_t left = t.k0 + kc < a.cols ? a.cols - t.k0 - kc : 0;
                uint32_t n = left < VEC ? left : VEC;
                // BF16: one vector of 8 codes (both words); FP32: vector v is word v.
                qb_store_codes<VEC>(row + kc, w[v], w[1], whole, n);
            }
        }
    }
    if (t.colwise) {
        uint8_t *codes = (uint8_t *)a.col_codes;
        bool whole = a.rows % 8 == 0 && a.col_codes % 8 == 0;
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
            uint32_t kt = qb_col<T>(t.c, j);
            if (t.k0 + kt >= a.cols) continue;
            float s = qb_col_scale(sm, kt);
            uint32_t w[2];
#pragma unroll
            for (uint32_t q = 0; q < 2; q++) {
                uint32_t lo = qt_block_fp8x2(qb_elem<T>(x[4 * q], j) * s,
                                             qb_elem<T>(x[4 * q + 1], j) * s, FP8);
                uint32_t hi = qt_block_fp8x2(qb_elem<T>(x[4 * q + 2], j) * s,
                                             qb_elem<T>(x[4 * q + 3], j) * s, FP8);
                w[q] = lo | hi << 16;
            }
            uint8_t *dst = codes + (uint64_t)(t.k0 + kt) * a.rows + t.m0 + 8 * t.g;
            qb_store_codes<8>(dst, w[0], w[1], whole, rows_here);
        }
    }
}

// Padding rows of grouped members read as zeros; rows that are not written (beyond the active
// rows, or beyond the matrix) were loaded as zeros or are zeroed here, so they add nothing to
// an amax either.
template <typename T, bool TWO_D>
__device__ __forceinline__ void qb_mask_rows(const qb_tile &t, uint32_t (&x)[8][qb_in<T>::WORDS],
                                             const qb_smem<TWO_D, false> &sm) {
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        if (sm.row_state[8 * t.g + i] == QT_BLOCK_ROW_VALID) continue;
#pragma unroll
        for (uint32_t w = 0; w < qb_in<T>::WORDS; w++) x[i][w] = 0;
    }
}

// The tile's row states (threads 0..127, one row each). Grouped members are padded to multiples
// of 128 rows, so a tile normally lies inside the member of its first row: each of the four
// warps finds that member once (quant_group.h, two dependent loads for up to 1024 members) and
// a row below the member's end takes its state from it, as qt_block_row_state would (the largest
// i with off[i] <= m is that member). Any other row falls back to the per-row search. Three
// dependent loads instead of seven: +4% on the 64-member grouped cast (H200).
__device__ __forceinline__ void qb_row_states(const quant_block_args &a, const qb_tile &t,
                                              uint8_t *row_state) {
    if (threadIdx.x >= QB_TILE) return;
    uint32_t m = t.m0 + threadIdx.x;
    if (a.group.count > 0) {
        const uint32_t *off = (const uint32_t *)(uintptr_t)a.group.row_offsets;
        const uint32_t *dims = (const uint32_t *)(uintptr_t)a.group.first_dims;
        uint32_t lo = qt_group_find_warp(a.group, t.m0);  // t.m0 < active: a member owns it
        uint32_t begin = __ldg(off + lo), end = __ldg(off + lo + 1), dim = __ldg(dims + lo);
        if (m < t.active && m < end) {
            row_state[threadIdx.x] = m - begin < dim ? QT_BLOCK_ROW_VALID : QT_BLOCK_ROW_PAD;
            return;
        }
    }
    row_state[threadIdx.x] = (uint8_t)qt_block_row_state(&a.group, t.active, m);
}

// The register path: the thread's 8 x 8 block is loaded into registers and stays there.
template <typename T, bool TWO_D, uint32_t FP8>
__device__ __forceinline__ void qb_cast_tile_regs(const quant_block_args &a, qb_tile &t,
                                                  qb_smem<TWO_D, false> &sm) {
    // The loads go out first; the row states (a binary search over the member offsets when
    // grouped) are looked up while they are in flight.
    uint32_t x[8][qb_in<T>::WORDS];
    qb_load_tile<T>(a, t, x);
    t.active = qt_block_active_rows(&a.group, a.rows);
    if (t.m0 >= t.active) return;  // the whole tile is beyond the active rows: all threads leave
    qb_row_states(a, t, sm.row_state);
    __syncthreads();  // row states visible
    qb_mask_rows<T, TWO_D>(t, x, sm);
    qb_partials<T, TWO_D, false>(t, x, sm);
    __syncthreads();  // partial amaxes visible
    qb_scales<T, TWO_D, FP8, false>(a, t, sm);
    __syncthreads();  // scales visible
    qb_cast_store<T, TWO_D, FP8, false>(a, t, x, sm);
}

// The whole BF16 tile into sm.tile: vector q = threadIdx.x + 256 n is tile row q / 16, columns
// 8 (q % 16) .. + 7, so a warp copies two rows of 256 contiguous bytes per instruction. Elements
// outside the matrix read as +0. Unaligned inputs take plain loads and shared stores.
template <bool TWO_D>
__device__ __forceinline__ void qb_stage_tile(const quant_block_args &a, const qb_tile &t,
                                              qb_smem<TWO_D, true> &sm) {
    const uint16_t *in = reinterpret_cast<const uint16_t *>(a.input);
    bool vec_ok = a.cols % 8 == 0 && a.input % 16 == 0;
#pragma unroll
    for (uint32_t n = 0; n < QB_TILE * QB_TILE / 8 / QB_THREADS; n++) {
        uint32_t q = threadIdx.x + QB_THREADS * n;
        uint32_t r = q / 16, v = q % 16;
        uint32_t m = t.m0 + r;
        bool row_ok = m < a.rows;
        const uint16_t *row = in + (uint64_t)(row_ok ? m : 0) * a.cols + t.k0;
        if (vec_ok) {
            // cols % 8 == 0: a vector is wholly inside the matrix or wholly outside.
            bool ok = row_ok && t.k0 + 8 * v < a.cols;
            qt_cp_async16(&sm.tile[r][v], ok ? row + 8 * v : in, ok ? 16u : 0u);
        } else {
            uint32_t w[4];
            qb_load_vec<uint16_t>(row, 8 * v, a.cols - t.k0, row_ok, false, w);
            sm.tile[r][v] = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

// The thread's 8 x 8 block from the staged tile; rows whose bit in `valid` is clear read as 0.
template <bool TWO_D>
__device__ __forceinline__ void qb_read_block(const qb_tile &t, const qb_smem<TWO_D, true> &sm,
                                              uint32_t valid, uint32_t (&x)[8][4]) {
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        uint4 v = sm.tile[8 * t.g + i][t.c];
        bool keep = (valid >> i) & 1u;
        x[i][0] = keep ? v.x : 0u;
        x[i][1] = keep ? v.y : 0u;
        x[i][2] = keep ? v.z : 0u;
        x[i][3] = keep ? v.w : 0u;
    }
}

// The staged path once the tile and its row states are in shared memory (and visible): the
// partial amaxes, the scales and the codes.
template <bool TWO_D, uint32_t FP8>
__device__ __forceinline__ void qb_cast_staged_tile(const quant_block_args &a, const qb_tile &t,
                                                    qb_smem<TWO_D, true> &sm) {
    uint32_t valid = 0;
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        valid |= (sm.row_state[8 * t.g + i] == QT_BLOCK_ROW_VALID ? 1u : 0u) << i;
    }
    {
        uint32_t x[8][4];
        qb_read_block<TWO_D>(t, sm, valid, x);
        qb_partials<uint16_t, TWO_D, true>(t, x, sm);
    }
    __syncthreads();  // partial amaxes visible
    qb_scales<uint16_t, TWO_D, FP8, true>(a, t, sm);
    __syncthreads();  // scales visible
    uint32_t x[8][4];
    qb_read_block<TWO_D>(t, sm, valid, x);
    qb_cast_store<uint16_t, TWO_D, FP8, true>(a, t, x, sm);
}

// The staged BF16 path: the tile is copied into shared memory without passing through
// registers, and each phase reads the thread's block from there, so no register holds data
// across a barrier and more blocks fit on an SM.
template <bool TWO_D, uint32_t FP8>
__device__ __forceinline__ void qb_cast_tile_staged(const quant_block_args &a, qb_tile &t,
                                                    qb_smem<TWO_D, true> &sm) {
    qb_stage_tile<TWO_D>(a, t, sm);
    t.active = qt_block_active_rows(&a.group, a.rows);
    if (t.m0 >= t.active) {  // uniform; the copies must land before the block's memory is reused
        qt_cp_async_wait_all();
        return;
    }
    qb_row_states(a, t, sm.row_state);
    qt_cp_async_wait_all();
    __syncthreads();  // the tile and the row states visible
    qb_cast_staged_tile<TWO_D, FP8>(a, t, sm);
}

template <typename T, bool TWO_D, uint32_t FP8, bool STAGED>
__device__ __forceinline__ void qb_cast_tile(const quant_block_args &a,
                                             qb_smem<TWO_D, STAGED> &sm) {
    qb_tile t;
    t.tiles_k = (a.cols + QB_TILE - 1) / QB_TILE;
    t.tiles_m = (a.rows + QB_TILE - 1) / QB_TILE;
    if (blockIdx.x >= t.tiles_k * t.tiles_m) return;
    t.tk = blockIdx.x % t.tiles_k;
    t.tm = blockIdx.x / t.tiles_k;
    t.m0 = t.tm * QB_TILE;
    t.k0 = t.tk * QB_TILE;
    t.c = qb_slot_c();
    t.g = qb_group_g();
    t.rowwise = (a.directions & QT_BLOCK_ROWWISE) != 0;
    t.colwise = (a.directions & QT_BLOCK_COLWISE) != 0;
    if constexpr (STAGED) {
        qb_cast_tile_staged<TWO_D, FP8>(a, t, sm);
    } else {
        qb_cast_tile_regs<T, TWO_D, FP8>(a, t, sm);
    }
}

// One shared block for both code formats (a __shared__ declared in the templated tile function
// would be allocated once per instantiation).
template <typename T, bool TWO_D>
__device__ __forceinline__ void qb_cast(const quant_block_args &a) {
    constexpr bool STAGED = qb_in<T>::DTYPE == QT_DTYPE_BF16;
    __shared__ qb_smem<TWO_D, STAGED> sm;
    if (a.fp8 == QT_BLOCK_E5M2) {
        qb_cast_tile<T, TWO_D, QT_BLOCK_E5M2, STAGED>(a, sm);
    } else {
        qb_cast_tile<T, TWO_D, QT_BLOCK_E4M3, STAGED>(a, sm);
    }
}

// BF16 (staged): four resident blocks of 256 threads per SM, so at most 64 registers (they use
// all 64 without spilling; five would leave 48 and spill) and 4 x 37 KiB of shared memory; up to
// 128 KiB of a tile's loads in flight per SM. FP32 (registers): two blocks, up to 128 registers,
// since a thread holds its whole 8 x 8 block plus both directions' scales. The input dtypes have
// their own symbols so that a change to one path's register use cannot spill the other.
extern "C" __global__ void __launch_bounds__(QB_THREADS, 4)
    qt_quant_block_1d_bf16(const __grid_constant__ quant_block_args args) {
    qt_grid_enter();
    qb_cast<uint16_t, false>(args);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS, 2)
    qt_quant_block_1d_f32(const __grid_constant__ quant_block_args args) {
    qt_grid_enter();
    qb_cast<float, false>(args);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS, 4)
    qt_quant_block_2d_bf16(const __grid_constant__ quant_block_args args) {
    qt_grid_enter();
    qb_cast<uint16_t, true>(args);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS, 2)
    qt_quant_block_2d_f32(const __grid_constant__ quant_block_args args) {
    qt_grid_enter();
    qb_cast<float, true>(args);
}

// ---------------------------------------------------------------------------------------------
// An activation and the 1-D cast of its output (quant_block_act_args). Per tile, the vectors
// that a thread stages are turned into y's BF16 words through the block's table
// (ptx/act_math.h, qt_act_table_words: act.cu's values and rounding) inside the shared tile,
// where the staged cast finds its input (qb_act_stage); from there on it is
// qb_cast_staged_tile itself, so the codes and scales are qt_quant_block_1d_bf16's for the
// stored y. A block runs many tiles, so its table (4096 exact evaluations) is paid once.

#define QB_ACT_VECTORS (QB_TILE * QB_TILE / 8u / QB_THREADS)  // 16-byte vectors a thread stages

// y's words of the tile into sm.tile (the staged layout of qb_stage_tile: vector q is tile row
// q / 16, columns 8 (q % 16) .. + 7); vectors outside the matrix are zeros. cols % 8 == 0, so a
// vector lies wholly inside or wholly outside. The tile's x (backward: dy) is copied into sm.tile
// first without registers, as the plain staged cast copies its input, and each vector is turned
// into y in place; backward loads x into registers beside the copies. Loaded through registers
// in batches of four, x and dy held the kernels at 72 and 80 registers, three blocks an SM; so
// they fit 64 and four. A thread rewrites only the vectors it copied, so its own
// cp.async.wait_all is the only ordering needed.
template <bool kBackward>
__device__ __forceinline__ void qb_act_stage(const quant_block_act_args &a, const qb_tile &t,
                                             const float *table, qb_smem<false, true> &sm) {
    const quant_block_args &c = a.cast;
    const uint4 *x = (const uint4 *)c.input, *dy = (const uint4 *)a.dy;
    const uint4 *copied = kBackward ? dy : x;
    uint32_t inside = 0;
#pragma unroll
    for (uint32_t n = 0; n < QB_ACT_VECTORS; n++) {
        const uint32_t q = threadIdx.x + QB_THREADS * n;
        const uint32_t m = t.m0 + q / 16u, k = t.k0 + 8u * (q % 16u);
        const bool ok = m < c.rows && k < c.cols;
        inside |= (ok ? 1u : 0u) << n;
        qt_cp_async16(&sm.tile[q / 16u][q % 16u],
                      copied + (ok ? ((uint64_t)m * c.cols + k) / 8u : 0u), ok ? 16u : 0u);
    }
    uint4 xw[QB_ACT_VECTORS];
#pragma unroll
    for (uint32_t n = 0; n < QB_ACT_VECTORS && kBackward; n++) {
        const uint32_t q = threadIdx.x + QB_THREADS * n;
        const uint32_t m = t.m0 + q / 16u, k = t.k0 + 8u * (q % 16u);
        xw[n] = make_uint4(0u, 0u, 0u, 0u);
        if ((inside >> n) & 1u) xw[n] = __ldg(x + ((uint64_t)m * c.cols + k) / 8u);
    }
    qt_cp_async_wait_all();
#pragma unroll
    for (uint32_t n = 0; n < QB_ACT_VECTORS; n++) {
        const uint32_t q = threadIdx.x + QB_THREADS * n;
        uint4 &v = sm.tile[q / 16u][q % 16u];
        uint4 y = make_uint4(0u, 0u, 0u, 0u);
        if ((inside >> n) & 1u) {
            y = kBackward ? qt_act_table_words<true>(a.act, table, xw[n], v)
                          : qt_act_table_words<false>(a.act, table, v, y);
        }
        v = y;
    }
}

template <bool kBackward, uint32_t FP8>
__device__ __forceinline__ void qb_act_cast_tiles(const quant_block_act_args &a,
                                                  const float *table, qb_smem<false, true> &sm) {
    const quant_block_args &c = a.cast;
    qb_tile t;
    t.tiles_k = (c.cols + QB_TILE - 1) / QB_TILE;
    t.tiles_m = (c.rows + QB_TILE - 1) / QB_TILE;
    t.active = c.rows;  // dense
    t.c = qb_slot_c();
    t.g = qb_group_g();
    t.rowwise = (c.directions & QT_BLOCK_ROWWISE) != 0;
    t.colwise = (c.directions & QT_BLOCK_COLWISE) != 0;
    const uint32_t tiles = t.tiles_k * t.tiles_m;
    for (uint32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform
        t.tk = tile % t.tiles_k;
        t.tm = tile / t.tiles_k;
        t.m0 = t.tm * QB_TILE;
        t.k0 = t.tk * QB_TILE;
        qb_act_stage<kBackward>(a, t, table, sm);
        qb_row_states(c, t, sm.row_state);
        __syncthreads();  // the tile and the row states visible
        qb_cast_staged_tile<false, FP8>(c, t, sm);
        __syncthreads();  // the tile, partials and scales read before the next tile's
    }
}

template <bool kBackward>
__device__ __forceinline__ void qb_act_cast(const quant_block_act_args &a) {
    extern __shared__ float qb_act_table[];  // QT_BLOCK_ACT_TABLE_BYTES, the launch's dynamic
    __shared__ qb_smem<false, true> sm;
    qt_act_table_fill(qb_act_table, a.act, kBackward, QB_THREADS);
    __syncthreads();  // the table is complete
    if (a.cast.fp8 == QT_BLOCK_E5M2) {
        qb_act_cast_tiles<kBackward, QT_BLOCK_E5M2>(a, qb_act_table, sm);
    } else {
        qb_act_cast_tiles<kBackward, QT_BLOCK_E4M3>(a, qb_act_table, sm);
    }
}

// Four blocks an SM: 37 KiB of static and 16 KiB of dynamic shared memory each (216 KiB), and
// 64 registers.
extern "C" __global__ void __launch_bounds__(QB_THREADS, QT_BLOCK_ACT_BLOCKS_PER_SM)
    qt_quant_block_act_fwd(const __grid_constant__ quant_block_act_args args) {
    qt_grid_enter();
    qb_act_cast<false>(args);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS, QT_BLOCK_ACT_BLOCKS_PER_SM)
    qt_quant_block_act_bwd(const __grid_constant__ quant_block_act_args args) {
    qt_grid_enter();
    qb_act_cast<true>(args);
}

// ---------------------------------------------------------------------------------------------
// Dequantize: the same tiles and thread blocks. A thread loads its 8 x 8 codes (8 bytes per row
// of the rowwise codes, or per row of the transposed columnwise codes) and writes 8 rows of 8
// consecutive output elements, so the columnwise transpose back to [M][K] also stays in
// registers. Codes are decoded through a 256-entry table built from qt_block_decode.

// Byte (i, j) of the thread's block: w[i] holds row i (rowwise), or w[j] holds column j.
template <bool COLWISE>
__device__ __forceinline__ uint32_t qb_code(const uint32_t (&w)[8][2], uint32_t i, uint32_t j) {
    uint32_t r = COLWISE ? j : i, e = COLWISE ? i : j;
    return (w[r][e >> 2] >> (8 * (e & 3u))) & 0xFFu;
}

__device__ __forceinline__ void qb_load_codes8(const uint8_t *src, bool whole, uint32_t n,
                                               uint32_t (&w)[2]) {
    if (whole && n == 8) {
        uint2 v = __ldg(reinterpret_cast<const uint2 *>(src));
        w[0] = v.x;
        w[1] = v.y;
        return;
    }
    w[0] = 0;
    w[1] = 0;
#pragma unroll
    for (uint32_t e = 0; e < 8; e++) {
        if (e < n) w[e >> 2] |= (uint32_t)src[e] << (8 * (e & 3u));
    }
}

// Scale_inv of element (i, j) of the thread's block; s[] holds one per row (1-D rowwise), one per
// column (1-D columnwise) or the tile's in s[0] (2-D).
template <bool TWO_D, bool COLWISE>
__device__ __forceinline__ float qb_dq_scale(const float (&s)[8], uint32_t i, uint32_t j) {
    return TWO_D ? s[0] : (COLWISE ? s[j] : s[i]);
}

template <bool TWO_D, bool COLWISE>
__device__ __forceinline__ void qb_dq_load(const dequant_block_args &a, const qb_tile &t,
                                           uint32_t rows_here, uint32_t (&w)[8][2],
                                           float (&s)[8]) {
    const uint8_t *codes = (const uint8_t *)a.codes;
    const float *scale_inv = (const float *)a.scale_inv;
    uint32_t k_base = t.k0 + 8 * t.c;
    uint32_t cols_here = k_base < a.cols ? min(a.cols - k_base, 8u) : 0;
    if (COLWISE) {
        bool whole = a.rows % 8 == 0 && a.codes % 8 == 0;
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
            uint64_t at = (uint64_t)(k_base + j) * a.rows + t.m0 + 8 * t.g;
            qb_load_codes8(codes + (j < cols_here ? at : 0), whole, j < cols_here ? rows_here : 0,
                           w[j]);
            if (!TWO_D) s[j] = j < cols_here ? scale_inv[(uint64_t)t.tm * a.cols + k_base + j] : 0;
        }
    } else {
        bool whole = a.cols % 8 == 0 && a.codes % 8 == 0;
#pragma unroll
        for (uint32_t i = 0; i < 8; i++) {
            uint64_t at = (uint64_t)(t.m0 + 8 * t.g + i) * a.cols + k_base;
            qb_load_codes8(codes + (i < rows_here ? at : 0), whole, i < rows_here ? cols_here : 0,
                           w[i]);
            if (!TWO_D) {
                s[i] = i < rows_here ? scale_inv[(uint64_t)t.tk * a.rows + t.m0 + 8 * t.g + i]
                                     : 0;
            }
        }
    }
    if (TWO_D) {
        s[0] = COLWISE ? scale_inv[(uint64_t)t.tk * t.tiles_m + t.tm]
                       : scale_inv[(uint64_t)t.tm * t.tiles_k + t.tk];
    }
}

template <bool TWO_D, bool COLWISE, uint32_t OUT_DTYPE>
__device__ __forceinline__ void qb_dequant_tile(const dequant_block_args &a,
                                                const float *lut) {
    qb_tile t;
    t.tiles_k = (a.cols + QB_TILE - 1) / QB_TILE;
    t.tiles_m = (a.rows + QB_TILE - 1) / QB_TILE;
    t.tk = blockIdx.x % t.tiles_k;
    t.tm = blockIdx.x / t.tiles_k;
    t.m0 = t.tm * QB_TILE;
    t.k0 = t.tk * QB_TILE;
    t.c = qb_slot_c();
    t.g = qb_group_g();
    t.active = qt_block_active_rows(&a.group, a.rows);
    if (t.m0 >= t.active) return;
    uint32_t rows_here = t.active - t.m0 < 8 * t.g ? 0 : t.active - t.m0 - 8 * t.g;
    if (rows_here > 8) rows_here = 8;
    uint32_t k_base = t.k0 + 8 * t.c;
    uint32_t cols_here = k_base < a.cols ? min(a.cols - k_base, 8u) : 0;
    uint32_t w[8][2];
    float s[8];
    qb_dq_load<TWO_D, COLWISE>(a, t, rows_here, w, s);
    constexpr uint32_t ESIZE = OUT_DTYPE == QT_DTYPE_BF16 ? 2 : 4;
    bool whole = a.cols % (16 / ESIZE) == 0 && a.out % 16 == 0 && cols_here == 8;
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        if (i >= rows_here) break;
        uint32_t o[8];
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
            float v = qt_block_dequantize(lut[qb_code<COLWISE>(w, i, j)],
                                          qb_dq_scale<TWO_D, COLWISE>(s, i, j));
            o[j] = OUT_DTYPE == QT_DTYPE_BF16 ? qt_f32_to_bf16(v) : __float_as_uint(v);
        }
        uint64_t at = (uint64_t)(t.m0 + 8 * t.g + i) * a.cols + k_base;
        if (OUT_DTYPE == QT_DTYPE_BF16) {
            uint16_t *dst = (uint16_t *)a.out + at;
            if (whole) {
                *reinterpret_cast<uint4 *>(dst) = make_uint4(o[0] | o[1] << 16, o[2] | o[3] << 16,
                                                             o[4] | o[5] << 16, o[6] | o[7] << 16);
            } else {
#pragma unroll
                for (uint32_t j = 0; j < 8; j++) {
                    if (j < cols_here) dst[j] = (uint16_t)o[j];
                }
            }
        } else {
            uint32_t *dst = (uint32_t *)a.out + at;
            if (whole) {
                reinterpret_cast<uint4 *>(dst)[0] = make_uint4(o[0], o[1], o[2], o[3]);
                reinterpret_cast<uint4 *>(dst)[1] = make_uint4(o[4], o[5], o[6], o[7]);
            } else {
#pragma unroll
                for (uint32_t j = 0; j < 8; j++) {
                    if (j < cols_here) dst[j] = o[j];
                }
            }
        }
    }
}

template <bool TWO_D>
__device__ __forceinline__ void qb_dequant(const dequant_block_args &a) {
    __shared__ float lut[256];
    lut[threadIdx.x] = qt_block_decode((uint8_t)threadIdx.x, a.fp8);  // 256 threads, 256 codes
    __syncthreads();
    uint32_t tiles = ((a.cols + QB_TILE - 1) / QB_TILE) * ((a.rows + QB_TILE - 1) / QB_TILE);
    if (blockIdx.x >= tiles) return;
    if (a.colwise) {
        if (a.out_dtype == QT_DTYPE_BF16) {
            qb_dequant_tile<TWO_D, true, QT_DTYPE_BF16>(a, lut);
        } else {
            qb_dequant_tile<TWO_D, true, QT_DTYPE_F32>(a, lut);
        }
    } else {
        if (a.out_dtype == QT_DTYPE_BF16) {
            qb_dequant_tile<TWO_D, false, QT_DTYPE_BF16>(a, lut);
        } else {
            qb_dequant_tile<TWO_D, false, QT_DTYPE_F32>(a, lut);
        }
    }
}

extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qt_dequant_block_1d(const __grid_constant__ dequant_block_args args) {
    qt_grid_enter();
    qb_dequant<false>(args);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qt_dequant_block_2d(const __grid_constant__ dequant_block_args args) {
    qt_grid_enter();
    qb_dequant<true>(args);
}
