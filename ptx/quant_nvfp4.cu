// quant_nvfp4 kernels: global amax (with the post-RHT columnwise amax), the fused one-pass
// quantize (rowwise + transposed columnwise, RHT, 2-D, stochastic rounding), dequantize. ABI,
// layouts and all per-element arithmetic live in quant_nvfp4.h; this file only tiles, moves
// memory and reduces.
#include "core.h"  // QT_DTYPE_*
#include "quant_nvfp4.h"

#define NV_THREADS QT_NVFP4_THREADS
#define NV_WARPS (NV_THREADS / 32)

QT_STATIC_ASSERT(NV_THREADS == 256, "the tilings below assume 256 threads");

// ---------------------------------------------------------------------------------------------
// Shared helpers.

__device__ __forceinline__ uint32_t nv_word(const uint4 &w, int i) {
    return i == 0 ? w.x : (i == 1 ? w.y : (i == 2 ? w.z : w.w));
}

// Element e (a compile-time constant after unrolling) of a 16-byte chunk as FP32: BF16 pairs are
// widened exactly by placing the 16 bits on top.
template <int ESIZE>
__device__ __forceinline__ float nv_elem(const uint4 &w, int e) {
    if (ESIZE == 4) return __uint_as_float(nv_word(w, e));
    uint32_t word = nv_word(w, e >> 1);
    return __uint_as_float((e & 1) ? (word & 0xFFFF0000u) : (word << 16));
}

// The 16 bytes holding elements [col, col + 16 / ESIZE) of row `row` of x, zero past `cols`. One
// 16-byte load when the whole chunk is in range and rows are 16-byte aligned (`aligned` is
// uniform over the grid); element loads otherwise.
template <int ESIZE>
__device__ __forceinline__ uint4 nv_load_chunk(const uint8_t *x, uint32_t cols, uint32_t row,
                                               uint32_t col, bool aligned) {
    constexpr uint32_t VEC = 16 / ESIZE;
    uint4 w = make_uint4(0, 0, 0, 0);
    if (col >= cols) return w;
    const uint8_t *p = x + ((uint64_t)row * cols + col) * ESIZE;
    if (aligned && col + VEC <= cols) return __ldg((const uint4 *)p);
    uint32_t n = cols - col;
    if (ESIZE == 4) {
        const uint32_t *q = (const uint32_t *)p;
        w.x = q[0];
        if (n > 1) w.y = q[1];
        if (n > 2) w.z = q[2];
        if (n > 3) w.w = q[3];
        return w;
    }
    const uint16_t *h = (const uint16_t *)p;
    uint32_t e[8];
#pragma unroll
    for (int i = 0; i < 8; i++) e[i] = (uint32_t)i < n ? h[i] : 0u;
    w.x = e[0] | (e[1] << 16);
    w.y = e[2] | (e[3] << 16);
    w.z = e[4] | (e[5] << 16);
    w.w = e[6] | (e[7] << 16);
    return w;
}

// The 8 bytes holding elements [col, col + 8 / ESIZE) of row `row`, zero past `cols`; one 8-byte
// load when whole and rows are 8-byte aligned.
template <int ESIZE>
__device__ __forceinline__ uint2 nv_load_half(const uint8_t *x, uint32_t cols, uint32_t row,
                                              uint32_t col, bool aligned) {
    constexpr uint32_t VEC = 8 / ESIZE;
    uint2 w = make_uint2(0, 0);
    if (col >= cols) return w;
    const uint8_t *p = x + ((uint64_t)row * cols + col) * ESIZE;
    if (aligned && col + VEC <= cols) return __ldg((const uint2 *)p);
    const uint32_t n = cols - col;
    if (ESIZE == 4) {
        w.x = *(const uint32_t *)p;
        if (n > 1) w.y = ((const uint32_t *)p)[1];
        return w;
    }
    const uint16_t *h = (const uint16_t *)p;
    w.x = h[0] | (n > 1 ? (uint32_t)h[1] << 16 : 0u);
    if (n > 2) w.y = h[2] | (n > 3 ? (uint32_t)h[3] << 16 : 0u);
    return w;
}

__device__ __forceinline__ uint32_t nv_warp_max(uint32_t v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(~0u, v, offset));
    return v;
}

// Global amax update. Non-negative floats order like their bit patterns, so atomicMax on the
// bits is an exact, order-independent maximum (2.3). The plain read skips most atomics once the
// value has grown; a stale read only costs an unneeded atomic.
__device__ __forceinline__ void nv_amax_update(uint64_t amax, uint32_t member, uint32_t bits) {
    unsigned int *p = (unsigned int *)amax + member;
    if (bits > *(volatile unsigned int *)p) atomicMax(p, bits);
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_amax_zero: one block; the amax arrays have max(count, 1) entries.

extern "C" __global__ void __launch_bounds__(NV_THREADS)
    qt_nvfp4_amax_zero(const __grid_constant__ nvfp4_amax_args args) {
    uint32_t n = args.group.count ? args.group.count : 1u;
    for (uint32_t i = threadIdx.x; i < n; i += NV_THREADS) {
        ((float *)args.amax_row)[i] = 0.0f;
        if (args.flags & QT_NVFP4_COLWISE) ((float *)args.amax_col)[i] = 0.0f;
    }
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_amax. A CTA takes one 16-row block (one member, one RHT group per column) and
// QT_NVFP4_AMAX_COLS(esize) columns; thread t holds one 8-byte column chunk of all 16 rows in
// registers (16 loads in flight), so the RHT needs no shared memory. (16-byte chunks would need
// 64 registers of data and spill.) grid.y strides over row blocks; a maximum does not depend on
// the grid.

template <int ESIZE>
__device__ __forceinline__ float nv_half_elem(const uint2 &w, int e) {
    return nv_elem<ESIZE>(make_uint4(w.x, w.y, 0, 0), e);
}

template <int ESIZE>
__device__ __forceinline__ void nv_amax_body(const nvfp4_amax_args &a) {
    constexpr int VEC = 8 / ESIZE;
    __shared__ uint32_t s_red[2][NV_WARPS];
    const uint8_t *x = (const uint8_t *)a.x;
    const uint32_t *offsets = (const uint32_t *)a.group.row_offsets;
    const uint32_t *first_dims = (const uint32_t *)a.group.first_dims;
    const bool aligned = ((a.x | ((uint64_t)a.cols * ESIZE)) & 7u) == 0;
    const bool rht = (a.flags & QT_NVFP4_RHT) != 0;
    const uint32_t col = (blockIdx.x * NV_THREADS + threadIdx.x) * VEC;
    const uint32_t blocks = (a.rows + 15) / 16;
    for (uint32_t g = blockIdx.y; g < blocks; g += gridDim.y) {
        const uint32_t row0 = g * 16;
        uint2 w[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = row0 + j < a.rows ? nv_load_half<ESIZE>(x, a.cols, row0 + j, col, aligned)
                                     : make_uint2(0, 0);
        }
        qt_nvfp4_span span =
            qt_nvfp4_span_of(offsets, first_dims, a.group.count, a.rows, row0);
        if (span.store_end <= row0) continue;  // the same for every thread of the CTA
        float row_max = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            if (row0 + j >= span.valid_end) w[j] = make_uint2(0, 0);  // padding reads as 0
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                row_max = qt_nvfp4_absmax(row_max, nv_half_elem<ESIZE>(w[j], e));
            }
        }
        float col_max = row_max;
        if (rht) {
            // Positions at or past store_end (a dense tensor's last partial group) are not part
            // of the columnwise data, so they do not count; columns past `cols` transform zeros.
            const uint32_t n_store = min(16u, span.store_end - row0);
            col_max = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float v[16];
#pragma unroll
                for (int j = 0; j < 16; j++) v[j] = nv_half_elem<ESIZE>(w[j], e);
                qt_nvfp4_rht16(v, a.rht_signs);
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    if ((uint32_t)j < n_store) col_max = qt_nvfp4_absmax(col_max, v[j]);
                }
            }
        }
        uint32_t row_bits = nv_warp_max(__float_as_uint(row_max));
        uint32_t col_bits = nv_warp_max(__float_as_uint(col_max));
        if ((threadIdx.x & 31) == 0) {
            s_red[0][threadIdx.x >> 5] = row_bits;
            s_red[1][threadIdx.x >> 5] = col_bits;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 1; i < NV_WARPS; i++) {
                row_bits = max(row_bits, s_red[0][i]);
                col_bits = max(col_bits, s_red[1][i]);
            }
            nv_amax_update(a.amax_row, span.member, row_bits);
            if (a.flags & QT_NVFP4_COLWISE) nv_amax_update(a.amax_col, span.member, col_bits);
        }
        __syncthreads();  // s_red is rewritten for the next row block
    }
}

// Two CTAs per SM (102 registers) keep 64 KiB of loads in flight per SM; three would spill.
extern "C" __global__ void __launch_bounds__(NV_THREADS, 2)
    qt_nvfp4_amax(const __grid_constant__ nvfp4_amax_args args) {
    if (args.dtype == QT_DTYPE_F32) {
        nv_amax_body<4>(args);
    } else {
        nv_amax_body<2>(args);
    }
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_quantize. A CTA quantizes a tile of TM = 128 rows x TK = 64 columns per iteration
// (grid.x over column tiles, grid.y striding over row tiles):
//
//   1. each thread issues its 16-byte loads of the tile (4 for BF16, 8 for FP32) into registers
//   2. threads 0..7 look up their 16-row block's span and global scales (s_rb)
//   3. the chunks go to shared memory, rows that are padding (or past M) zeroed
//   4. (2-D) the 32 16x16 tile amaxes
//   5. rowwise: 512 tasks (row, 16-column block), 2 per thread, read 32 or 64 bytes of shared
//      memory, write 8 code bytes and 1 scale byte straight to global memory (a warp writes 8
//      rows x 32 contiguous bytes)
//   6. columnwise: 256 tasks (16-row block = warp, column pair = lane), 16 shared loads down the
//      columns, (RHT), codes staged transposed in shared memory
//   7. the staged columnwise codes leave as 16-byte stores, 64 contiguous bytes per output row
//
// Shared memory (dynamic, QT_NVFP4_QUANT_SMEM(esize) bytes):
//
//   in     [TM rows][TK * esize bytes] as 16-byte chunks; chunk c of row r lives in slot
//          c ^ (r & 1) ^ (((c >> 3) & 1) << 1) of its row. The XOR makes the 8 lanes of each
//          128-bit access phase hit 8 different 16-byte bank groups both for the rowwise reads
//          (lanes = 2 rows x 4 column blocks) and for the columnwise reads (one row per
//          instruction); the values in registers keep their logical order.
//   colq   [TK columns][TM / 2 bytes] in 8-byte units (one 16-row block each); unit u of column
//          kl lives in slot u ^ ((kl >> 1) & 7), which spreads a warp's 8-byte writes (32
//          columns, one block) over the banks (2-way conflicts at most).
//   cols   [TK columns][TM / 16] scale bytes.

#define NVQ_TM QT_NVFP4_QUANT_TILE_ROWS
#define NVQ_TK QT_NVFP4_QUANT_TILE_COLS
#define NVQ_RB (NVQ_TM / 16)
#define NVQ_KB (NVQ_TK / 16)
#define NVQ_COLQ_BYTES (NVQ_TK * NVQ_TM / 2)

QT_STATIC_ASSERT(NVQ_TM == 128 && NVQ_TK == 64, "task maps below assume a 128 x 64 tile");
QT_STATIC_ASSERT(QT_NVFP4_QUANT_SMEM(2) == NVQ_TM * NVQ_TK * 2 + NVQ_COLQ_BYTES + NVQ_TK * NVQ_RB,
                 "QT_NVFP4_QUANT_SMEM matches the layout");

typedef struct nvq_rowblock {
    uint32_t valid_end, store_end;
    qt_nvfp4_scale row, col;
} nvq_rowblock;

typedef struct nvq_shared {
    nvq_rowblock rb[NVQ_RB];
    float tile_amax[NVQ_RB * NVQ_KB];  // 2-D: [row block][column block]
    uint32_t npos;                     // columnwise positions of this tile that are stored
} nvq_shared;

__device__ __forceinline__ uint32_t nvq_slot(uint32_t r, uint32_t c, uint32_t cpr) {
    return r * cpr + (c ^ (r & 1u) ^ (((c >> 3) & 1u) << 1));
}

// The 16 values of column block b of tile row r, in order.
template <int ESIZE>
__device__ __forceinline__ void nvq_read_row16(const uint4 *s_in, uint32_t r, uint32_t b,
                                               float v[16]) {
    constexpr uint32_t CPR = NVQ_TK * ESIZE / 16;
    constexpr int CHUNKS = 16 * ESIZE / 16;  // chunks per 16-element block: 2 | 4
    constexpr int VEC = 16 / ESIZE;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        uint4 w = s_in[nvq_slot(r, b * CHUNKS + i, CPR)];
#pragma unroll
        for (int e = 0; e < VEC; e++) v[i * VEC + e] = nv_elem<ESIZE>(w, e);
    }
}

// Step 2: one thread per 16-row block of the tile.
__device__ __forceinline__ void nvq_rowblock_init(const nvfp4_quantize_args &a, uint32_t row,
                                                  nvq_rowblock *out) {
    qt_nvfp4_span span = qt_nvfp4_span_of((const uint32_t *)a.group.row_offsets,
                                          (const uint32_t *)a.group.first_dims, a.group.count,
                                          a.rows, row);
    float amax_row = (a.flags & QT_NVFP4_ROWWISE) ? ((const float *)a.amax_row)[span.member] : 0;
    float amax_col = (a.flags & QT_NVFP4_COLWISE) ? ((const float *)a.amax_col)[span.member] : 0;
    nvq_rowblock rb;
    rb.valid_end = span.valid_end;
    rb.store_end = span.store_end;
    rb.row = qt_nvfp4_scale_of(amax_row);
    rb.col = qt_nvfp4_scale_of(amax_col);
    *out = rb;
}

// Step 4: 8 threads per 16x16 tile, 2 rows each, then a max over the 8 lanes.
template <int ESIZE>
__device__ __forceinline__ void nvq_tile_amax(const uint4 *s_in, nvq_shared *sh) {
    const uint32_t tile = threadIdx.x >> 3, sub = threadIdx.x & 7;
    const uint32_t rb = tile / NVQ_KB, b = tile % NVQ_KB;
    float mx = 0.0f;
#pragma unroll
    for (uint32_t rr = 0; rr < 2; rr++) {
        float v[16];
        nvq_read_row16<ESIZE>(s_in, rb * 16 + sub * 2 + rr, b, v);
#pragma unroll
        for (int j = 0; j < 16; j++) mx = qt_nvfp4_absmax(mx, v[j]);
    }
    uint32_t bits = __float_as_uint(mx);
#pragma unroll
    for (int offset = 1; offset < 8; offset <<= 1) {
        bits = max(bits, __shfl_xor_sync(~0u, bits, offset));
    }
    if (sub == 0) sh->tile_amax[tile] = __uint_as_float(bits);
}

// Writes n (<= 8) bytes of codes: one 8-byte store when whole and aligned.
__device__ __forceinline__ void nvq_store8(uint8_t *dst, const uint32_t q[2], uint32_t n,
                                           bool aligned) {
    if (aligned && n == 8) {
        *(uint2 *)dst = make_uint2(q[0], q[1]);
        return;
    }
    for (uint32_t i = 0; i < n; i++) dst[i] = (uint8_t)((i < 4 ? q[0] : q[1]) >> (8 * (i & 3)));
}

// Step 5.
template <int ESIZE>
__device__ __forceinline__ void nvq_rowwise(const nvfp4_quantize_args &a, const uint4 *s_in,
                                            const nvq_shared *sh, uint32_t m0, uint32_t k0,
                                            uint64_t step) {
    const uint32_t rpitch = (a.cols + 1) / 2, spitch = (a.cols + 15) / 16;
    const bool aligned = ((a.row_data | rpitch) & 7u) == 0;
    uint8_t *row_data = (uint8_t *)a.row_data;
    uint8_t *row_scales = (uint8_t *)a.row_scales;
#pragma unroll 1
    for (uint32_t i = 0; i < 2; i++) {
        const uint32_t id = i * NV_THREADS + threadIdx.x;
        const uint32_t r = id / NVQ_KB, b = id % NVQ_KB;
        const uint32_t m = m0 + r, kb = k0 + b * 16;
        const nvq_rowblock &rb = sh->rb[r >> 4];
        if (m >= rb.store_end || kb >= a.cols) continue;
        float v[16];
        nvq_read_row16<ESIZE>(s_in, r, b, v);
        float amax_b = 0.0f;
        if (a.flags & QT_NVFP4_2D) {
            amax_b = sh->tile_amax[(r >> 4) * NVQ_KB + b];
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++) amax_b = qt_nvfp4_absmax(amax_b, v[j]);
        }
        const uint8_t sb = qt_nvfp4_block_scale(amax_b, rb.row);
        const float mult = qt_nvfp4_block_mult(sb, rb.row.s_dec);
        uint32_t q[2];
        if (a.flags & QT_NVFP4_SR) {
            qt_philox4 rnd = qt_quant_random16(a.seed, step, a.tensor_id, m, kb / 16);
            qt_nvfp4_encode16_sr(v, mult, rnd, q);
        } else {
            qt_nvfp4_encode16(v, mult, q);
        }
        nvq_store8(row_data + (uint64_t)m * rpitch + kb / 2, q, min(8u, (a.cols - kb + 1) / 2),
                   aligned);
        row_scales[(uint64_t)m * spitch + kb / 16] = sb;
    }
}

// Step 6 for one column (kl = column within the tile) of 16-row block rb.
__device__ __forceinline__ void nvq_column(const nvfp4_quantize_args &a, float v[16],
                                           const nvq_shared *sh, const nvq_rowblock &rb,
                                           uint32_t rbi, uint32_t n_store, uint32_t m0,
                                           uint32_t k0, uint32_t kl, uint64_t step,
                                           uint2 *s_colq, uint8_t *s_cols) {
    if (a.flags & QT_NVFP4_RHT) {
        qt_nvfp4_rht16(v, a.rht_signs);
        if (n_store < 16) {  // only a dense tensor's last, partial group
#pragma unroll
            for (int j = 0; j < 16; j++) {
                if ((uint32_t)j >= n_store) v[j] = 0.0f;  // past M: not stored, not counted
            }
        }
    }
    float amax_b = 0.0f;
    if (a.flags & QT_NVFP4_2D) {
        amax_b = sh->tile_amax[rbi * NVQ_KB + (kl >> 4)];
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++) amax_b = qt_nvfp4_absmax(amax_b, v[j]);
    }
    const uint8_t sb = qt_nvfp4_block_scale(amax_b, rb.col);
    const float mult = qt_nvfp4_block_mult(sb, rb.col.s_dec);
    uint32_t q[2];
    if (a.flags & QT_NVFP4_SR) {
        qt_philox4 rnd = qt_quant_random16(a.seed, step, a.tensor_id | QT_QUANT_TENSOR_COLWISE,
                                           k0 + kl, m0 / 16 + rbi);
        qt_nvfp4_encode16_sr(v, mult, rnd, q);
    } else {
        qt_nvfp4_encode16(v, mult, q);
    }
    s_colq[kl * NVQ_RB + (rbi ^ ((kl >> 1) & 7u))] = make_uint2(q[0], q[1]);
    s_cols[kl * NVQ_RB + rbi] = sb;
}

// Step 6: warp = 16-row block, lane = column pair.
template <int ESIZE>
__device__ __forceinline__ void nvq_colwise(const nvfp4_quantize_args &a, const uint4 *s_in,
                                            const nvq_shared *sh, uint32_t m0, uint32_t k0,
                                            uint64_t step, uint2 *s_colq, uint8_t *s_cols) {
    constexpr uint32_t CPR = NVQ_TK * ESIZE / 16;
    const uint32_t rbi = threadIdx.x >> 5, cp = threadIdx.x & 31;
    const nvq_rowblock rb = sh->rb[rbi];
    const uint32_t mb = m0 + rbi * 16;
    if (mb >= rb.store_end) return;  // nothing of this block is stored
    const uint32_t n_store = min(16u, rb.store_end - mb);
    float va[16], vb[16];
    if (ESIZE == 2) {
        // Column pair cp is 32-bit word cp of each row: chunk cp / 4, word cp % 4.
        const uint32_t *s_words = (const uint32_t *)s_in;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint32_t r = rbi * 16 + j;
            uint32_t word = s_words[nvq_slot(r, cp >> 2, CPR) * 4 + (cp & 3)];
            va[j] = __uint_as_float(word << 16);
            vb[j] = __uint_as_float(word & 0xFFFF0000u);
        }
    } else {
        // Column pair cp is 64-bit half cp % 2 of chunk cp / 2.
        const float2 *s_pairs = (const float2 *)s_in;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint32_t r = rbi * 16 + j;
            float2 pair = s_pairs[nvq_slot(r, cp >> 1, CPR) * 2 + (cp & 1)];
            va[j] = pair.x;
            vb[j] = pair.y;
        }
    }
    nvq_column(a, va, sh, rb, rbi, n_store, m0, k0, 2 * cp, step, s_colq, s_cols);
    nvq_column(a, vb, sh, rb, rbi, n_store, m0, k0, 2 * cp + 1, step, s_colq, s_cols);
}

// Step 7: thread = (column kl, 16-byte quarter q) of the staged codes; threads 0..63 also write
// one column's 8 scale bytes. Only the tile's first npos positions are written.
__device__ __forceinline__ void nvq_colwise_store(const nvfp4_quantize_args &a,
                                                  const uint2 *s_colq, const uint8_t *s_cols,
                                                  uint32_t npos, uint32_t m0, uint32_t k0) {
    const uint32_t cpitch = (a.rows + 1) / 2, cspitch = (a.rows + 15) / 16;
    const uint32_t nbytes = (npos + 1) / 2, nblocks = (npos + 15) / 16;
    const uint32_t kl = threadIdx.x >> 2, q = threadIdx.x & 3;
    const uint32_t k = k0 + kl;
    if (k < a.cols && 16 * q < nbytes) {
        const uint32_t s = (kl >> 1) & 7u;
        const uint2 lo = s_colq[kl * NVQ_RB + ((2 * q) ^ s)];
        const uint2 hi = s_colq[kl * NVQ_RB + ((2 * q + 1) ^ s)];
        uint8_t *dst = (uint8_t *)a.col_data + (uint64_t)k * cpitch + m0 / 2 + 16 * q;
        const bool aligned = ((a.col_data | cpitch) & 15u) == 0;
        if (aligned && 16 * q + 16 <= nbytes) {
            *(uint4 *)dst = make_uint4(lo.x, lo.y, hi.x, hi.y);
        } else {
            const uint32_t n = min(16u, nbytes - 16 * q);
            for (uint32_t i = 0; i < n; i++) {
                const uint32_t word = i < 8 ? (i < 4 ? lo.x : lo.y) : (i < 12 ? hi.x : hi.y);
                dst[i] = (uint8_t)(word >> (8 * (i & 3)));
            }
        }
    }
    if (threadIdx.x < NVQ_TK && k0 + threadIdx.x < a.cols) {
        const uint32_t c = threadIdx.x;
        uint8_t *dst = (uint8_t *)a.col_scales + (uint64_t)(k0 + c) * cspitch + m0 / 16;
        const bool aligned = ((a.col_scales | cspitch) & 7u) == 0;
        if (aligned && nblocks == NVQ_RB) {
            *(uint2 *)dst = *(const uint2 *)(s_cols + c * NVQ_RB);
        } else {
            for (uint32_t i = 0; i < nblocks; i++) dst[i] = s_cols[c * NVQ_RB + i];
        }
    }
}

// Steps 1 and 3: the tile's chunks, padding rows zeroed.
template <int ESIZE>
__device__ __forceinline__ void nvq_stage_input(uint4 *s_in, const nvq_shared *sh,
                                                const uint4 *chunk, uint32_t m0) {
    constexpr uint32_t CPR = NVQ_TK * ESIZE / 16;
    constexpr int CHUNKS = NVQ_TM * CPR / NV_THREADS;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        const uint32_t id = i * NV_THREADS + threadIdx.x;
        const uint32_t r = id / CPR, c = id % CPR;
        const bool valid = m0 + r < sh->rb[r >> 4].valid_end;
        s_in[nvq_slot(r, c, CPR)] = valid ? chunk[i] : make_uint4(0, 0, 0, 0);
    }
}

template <int ESIZE>
__device__ __forceinline__ void nvq_body(const nvfp4_quantize_args &a) {
    constexpr uint32_t CPR = NVQ_TK * ESIZE / 16;   // 16-byte chunks per tile row: 8 | 16
    constexpr int CHUNKS = NVQ_TM * CPR / NV_THREADS;  // per thread: 4 | 8
    constexpr uint32_t VEC = 16 / ESIZE;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ nvq_shared sh;
    uint4 *s_in = (uint4 *)smem;
    uint2 *s_colq = (uint2 *)(smem + NVQ_TM * NVQ_TK * ESIZE);
    uint8_t *s_cols = smem + NVQ_TM * NVQ_TK * ESIZE + NVQ_COLQ_BYTES;
    const uint8_t *x = (const uint8_t *)a.x;
    const bool in_aligned = ((a.x | ((uint64_t)a.cols * ESIZE)) & 15u) == 0;
    const uint32_t k0 = blockIdx.x * NVQ_TK;
    const uint32_t tiles_m = (a.rows + NVQ_TM - 1) / NVQ_TM;
    const uint64_t step = (a.flags & QT_NVFP4_SR) ? *(const uint64_t *)a.step : 0;
    for (uint32_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
        const uint32_t m0 = tm * NVQ_TM;
        uint4 chunk[CHUNKS];
#pragma unroll
        for (int i = 0; i < CHUNKS; i++) {
            const uint32_t id = i * NV_THREADS + threadIdx.x;
            const uint32_t r = id / CPR, c = id % CPR;
            chunk[i] = m0 + r < a.rows
                           ? nv_load_chunk<ESIZE>(x, a.cols, m0 + r, k0 + c * VEC, in_aligned)
                           : make_uint4(0, 0, 0, 0);
        }
        if (threadIdx.x < NVQ_RB) nvq_rowblock_init(a, m0 + threadIdx.x * 16, &sh.rb[threadIdx.x]);
        __syncthreads();
        nvq_stage_input<ESIZE>(s_in, &sh, chunk, m0);
        if (threadIdx.x == 0) {
            // Active blocks form a prefix of the tile (grouped: whole blocks below
            // row_offsets[n]; dense: up to M), so one length says what is stored.
            uint32_t npos = 0;
            for (uint32_t i = 0; i < NVQ_RB; i++) {
                const uint32_t end = sh.rb[i].store_end, mb = m0 + i * 16;
                if (end > mb) npos = min(end - m0, (uint32_t)NVQ_TM);
            }
            sh.npos = npos;
        }
        __syncthreads();
        if (a.flags & QT_NVFP4_2D) {
            nvq_tile_amax<ESIZE>(s_in, &sh);
            __syncthreads();
        }
        if (a.flags & QT_NVFP4_ROWWISE) nvq_rowwise<ESIZE>(a, s_in, &sh, m0, k0, step);
        if (a.flags & QT_NVFP4_COLWISE) {
            nvq_colwise<ESIZE>(a, s_in, &sh, m0, k0, step, s_colq, s_cols);
            __syncthreads();
            nvq_colwise_store(a, s_colq, s_cols, sh.npos, m0, k0);
        }
        __syncthreads();  // the next tile rewrites every shared buffer
    }
}

// Four CTAs per SM (64 registers, no spills; 4 x 21 KiB of shared memory for BF16): while some
// load their tile, others compute, which is what overlaps memory and arithmetic here.
extern "C" __global__ void __launch_bounds__(NV_THREADS, 4)
    qt_nvfp4_quantize(const __grid_constant__ nvfp4_quantize_args args) {
    if (args.dtype == QT_DTYPE_F32) {
        nvq_body<4>(args);
    } else {
        nvq_body<2>(args);
    }
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_dequantize: thread = output column, CTA = 256 columns of one 16-row block per
// iteration (grid.y strides over row blocks). Not on a hot path; written for clarity.

extern "C" __global__ void __launch_bounds__(NV_THREADS)
    qt_nvfp4_dequantize(const __grid_constant__ nvfp4_dequantize_args a) {
    const uint32_t k = blockIdx.x * NV_THREADS + threadIdx.x;
    if (k >= a.cols) return;  // no barriers below
    const uint8_t *data = (const uint8_t *)a.data;
    const uint8_t *scales = (const uint8_t *)a.scales;
    const uint32_t blocks = (a.rows + 15) / 16;
    for (uint32_t g = blockIdx.y; g < blocks; g += gridDim.y) {
        const uint32_t row0 = g * 16;
        qt_nvfp4_span span = qt_nvfp4_span_of((const uint32_t *)a.group.row_offsets,
                                              (const uint32_t *)a.group.first_dims,
                                              a.group.count, a.rows, row0);
        if (span.store_end <= row0) continue;
        const float amax = ((const float *)a.amax)[span.member];
        const uint32_t n = min(16u, span.store_end - row0);
        for (uint32_t j = 0; j < n; j++) {
            const uint32_t m = row0 + j;
            uint8_t byte, sb;
            if (a.colwise) {
                byte = data[(uint64_t)k * ((a.rows + 1) / 2) + m / 2];
                sb = scales[(uint64_t)k * ((a.rows + 15) / 16) + g];
            } else {
                byte = data[(uint64_t)m * ((a.cols + 1) / 2) + k / 2];
                sb = scales[(uint64_t)m * ((a.cols + 15) / 16) + k / 16];
            }
            const uint32_t pos = a.colwise ? m : k;
            const uint8_t nibble = (uint8_t)((byte >> (4 * (pos & 1))) & 0xFu);
            const float value = qt_e2m1_to_f32(nibble) * qt_nvfp4_dequant_scale(sb, amax);
            const uint64_t index = (uint64_t)m * a.cols + k;
            if (a.out_dtype == QT_DTYPE_F32) {
                ((float *)a.out)[index] = value;
            } else {
                ((uint16_t *)a.out)[index] = qt_f32_to_bf16(value);
            }
        }
    }
}
