// quant_nvfp4 kernels: global amax (with the post-RHT columnwise amax), the fused one-pass
// quantize (rowwise + transposed columnwise, RHT, 2-D, stochastic rounding), dequantize. ABI,
// layouts and all per-element arithmetic live in quant_nvfp4.h; this file only tiles, moves
// memory and reduces.
#include "ptx/core.h"         // QT_DTYPE_*
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement
#include "ptx/quant_nvfp4.h"
#include "ptx/gemm_decode.h"  // the NVFP4 GEMMs' decode, for qt_nvfp4_decode

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

__device__ __forceinline__ uint32_t nv_warp_max(uint32_t v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(~0u, v, offset));
    return v;
}

// Global amax update. Non-negative floats order like their bit patterns, so atomicMax on the
// bits is an exact, order-independent maximum. The plain read skips most atomics once the
// value has grown; a stale read only costs an unneeded atomic.
__device__ __forceinline__ void nv_amax_update(uint64_t amax, uint32_t member, uint32_t bits) {
    unsigned int *p = (unsigned int *)amax + member;
    if (bits > *(volatile unsigned int *)p) atomicMax(p, bits);
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_amax_zero: one block; the amax arrays have max(count, 1) entries.

extern "C" __global__ void __launch_bounds__(NV_THREADS)
    qt_nvfp4_amax_zero(const __grid_constant__ nvfp4_amax_args args) {
    qt_grid_enter();
    uint32_t n = args.group.count ? args.group.count : 1u;
    for (uint32_t i = threadIdx.x; i < n; i += NV_THREADS) {
        ((float *)args.amax_row)[i] = 0.0f;
        if (args.flags & QT_NVFP4_COLWISE) ((float *)args.amax_col)[i] = 0.0f;
    }
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_amax. Thread t holds one 16-byte column chunk (8 BF16 or 4 FP32 columns) of the 16
// rows of a row block in registers (16 loads, 256 bytes in flight), so the RHT needs no shared
// memory; a CTA covers QT_NVFP4_AMAX_COLS(esize) columns and grid.y strides over row blocks.
// The maxima accumulate in registers over the row blocks of one member and are reduced (warp
// shuffles, shared memory, one atomic per CTA) only when the member changes and at the end, so a
// dense tensor costs one reduction per CTA. BF16 row maxima stay packed (max.xorsign.abs.bf16x2
// returns the non-NaN operand; the signs are masked at the end). The RHT maximum is taken over
// the FP32 transform and rounded to BF16 once, at the reduction: RN is monotone and odd, so
// max |RN(y)| = RN(max |y|). A maximum does not depend on the grid.

__device__ __forceinline__ uint32_t nv_absmax_bf16x2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// The larger magnitude of a packed pair, a NaN half ignored (both NaN: 0).
__device__ __forceinline__ float nv_bf16x2_max(uint32_t packed) {
    return qt_nvfp4_absmax(qt_nvfp4_absmax(0.0f, __uint_as_float(packed << 16)),
                           __uint_as_float(packed & 0xFFFF0000u));
}

// The CTA's maxima of one member into the global amaxes (every thread calls it: uniform).
__device__ __forceinline__ void nv_amax_flush(const nvfp4_amax_args &a, uint32_t member,
                                              float row_max, float col_max, uint32_t *s_red) {
    uint32_t row_bits = nv_warp_max(__float_as_uint(row_max));
    uint32_t col_bits = nv_warp_max(__float_as_uint(col_max));
    if ((threadIdx.x & 31) == 0) {
        s_red[threadIdx.x >> 5] = row_bits;
        s_red[NV_WARPS + (threadIdx.x >> 5)] = col_bits;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < NV_WARPS; i++) {
            row_bits = max(row_bits, s_red[i]);
            col_bits = max(col_bits, s_red[NV_WARPS + i]);
        }
        nv_amax_update(a.amax_row, member, row_bits);
        if (a.flags & QT_NVFP4_COLWISE) nv_amax_update(a.amax_col, member, col_bits);
    }
    __syncthreads();  // s_red is rewritten by the next flush
}

// max |y| of the FP32 RHT of column e of the chunk rows w[0..15], over positions below n.
template <int ESIZE>
__device__ __forceinline__ float nv_amax_rht_col(const nvfp4_amax_args &a, const uint4 *w, int e,
                                                 uint32_t n, float acc) {
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; j++) v[j] = nv_elem<ESIZE>(w[j], e);
    if (ESIZE == 4) {
        qt_nvfp4_rht16_f32(v, a.rht_signs);
    } else if (a.rht_signs == QT_NVFP4_RHT_SIGNS_TE) {
        qt_nvfp4_rht16_bf16in_f32(v, QT_NVFP4_RHT_SIGNS_TE);  // constant signs
    } else {
        qt_nvfp4_rht16_bf16in_f32(v, a.rht_signs);
    }
    if (n >= 16) {
#pragma unroll
        for (int j = 0; j < 16; j++) acc = qt_nvfp4_absmax(acc, v[j]);
    } else {  // a dense tensor's last, partial group: positions past M are not stored
#pragma unroll
        for (int j = 0; j < 16; j++) {
            if ((uint32_t)j < n) acc = qt_nvfp4_absmax(acc, v[j]);
        }
    }
    return acc;
}

template <int ESIZE>
__device__ __forceinline__ void nv_amax_body(const nvfp4_amax_args &a) {
    constexpr int VEC = 16 / ESIZE;
    __shared__ uint32_t s_red[2 * NV_WARPS];
    const uint8_t *x = (const uint8_t *)a.x;
    const uint32_t *offsets = (const uint32_t *)a.group.row_offsets;
    const uint32_t *first_dims = (const uint32_t *)a.group.first_dims;
    const bool aligned = ((a.x | ((uint64_t)a.cols * ESIZE)) & 15u) == 0;
    const bool rht = (a.flags & QT_NVFP4_RHT) != 0;
    const uint32_t col = (blockIdx.x * NV_THREADS + threadIdx.x) * VEC;
    const uint32_t blocks = (a.rows + 15) / 16;
    uint32_t member = ~0u, row_packed = 0;  // BF16: packed pair maxima, signs unmasked
    float row_max = 0.0f, col_max = 0.0f;    // col_max: FP32 max |y| of the RHT
    for (uint32_t g = blockIdx.y; g < blocks; g += gridDim.y) {
        const uint32_t row0 = g * 16;
        uint4 w[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = row0 + j < a.rows ? nv_load_chunk<ESIZE>(x, a.cols, row0 + j, col, aligned)
                                     : make_uint4(0, 0, 0, 0);
        }
        // The lookup runs while the loads are in flight; it is the same for the whole CTA.
        const qt_nvfp4_span span =
            qt_nvfp4_span_of(offsets, first_dims, a.group.count, a.rows, row0);
        if (span.store_end <= row0) continue;
        if (span.member != member) {
            if (member != ~0u) {
                if (ESIZE == 2) row_max = nv_bf16x2_max(row_packed);
                const float col_amax = rht ? qt_bf16_to_f32(qt_f32_to_bf16(col_max)) : row_max;
                nv_amax_flush(a, member, row_max, col_amax, s_red);
            }
            member = span.member;
            row_packed = 0;
            row_max = col_max = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 16; j++) {
            if (row0 + j >= span.valid_end) w[j] = make_uint4(0, 0, 0, 0);  // padding reads as 0
            if (ESIZE == 2) {
                row_packed = nv_absmax_bf16x2(row_packed, nv_absmax_bf16x2(w[j].x, w[j].y));
                row_packed = nv_absmax_bf16x2(row_packed, nv_absmax_bf16x2(w[j].z, w[j].w));
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    row_max = qt_nvfp4_absmax(row_max, nv_elem<4>(w[j], e));
                }
            }
        }
        if (rht) {
            // Columns past `cols` transform zeros; positions at or past store_end (a dense
            // tensor's last partial group) are not part of the columnwise data.
            const uint32_t n_store = min(16u, span.store_end - row0);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                col_max = nv_amax_rht_col<ESIZE>(a, w, e, n_store, col_max);
            }
        }
    }
    if (member != ~0u) {
        if (ESIZE == 2) row_max = nv_bf16x2_max(row_packed);
        const float col_amax = rht ? qt_bf16_to_f32(qt_f32_to_bf16(col_max)) : row_max;
        nv_amax_flush(a, member, row_max, col_amax, s_red);
    }
}

// Two CTAs per SM (up to 128 registers) keep 128 KiB of loads in flight per SM.
extern "C" __global__ void __launch_bounds__(NV_THREADS, 2)
    qt_nvfp4_amax(const __grid_constant__ nvfp4_amax_args args) {
    qt_grid_enter();
    if (args.dtype == QT_DTYPE_F32) {
        nv_amax_body<4>(args);
    } else {
        nv_amax_body<2>(args);
    }
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_quantize, the general kernel (FP32 input; BF16 with 2-D or stochastic rounding; the
// BF16 fast cast has its own kernel below, sharing these helpers). A CTA quantizes a tile of
// TM = 128 rows x TK = 64 columns per iteration (grid.x over column tiles, grid.y striding over
// row tiles, several per CTA, so that the CTA's setup, the multiplier table of a dense tensor,
// is amortized):
//
//   1. thread t loads the two 16-element row blocks (row (t >> 2) + 64 i, column block t & 3),
//      i = 0, 1, as 2 (BF16) or 4 (FP32) 16-byte chunks each
//   2. threads 0..7 look up their 16-row block's span and global scales (s_rb)
//   3. the chunks go to shared memory, rows that are padding (or past M) zeroed; the same
//      thread reads its two rowwise blocks back and writes 8 code bytes and one scale byte each
//      (a warp writes 8 rows x 32 contiguous bytes)
//   4. (2-D) the 32 16x16 tile amaxes, then step 3's rowwise part
//   5. columnwise: 256 tasks (16-row block = warp, column pair = lane), 16 shared loads down the
//      columns, (RHT), codes staged transposed in shared memory
//   6. the staged columnwise codes leave as 16-byte stores, 64 contiguous bytes per output row
//
// Shared memory (dynamic, QT_NVFP4_QUANT_SMEM(esize) bytes):
//
//   in     [TM rows][TK * esize bytes] as 16-byte chunks; chunk c of row r lives in slot
//          c ^ (r & 1) ^ (((c >> 3) & 1) << 1) of its row. The XOR makes the 8 lanes of each
//          128-bit store phase hit 8 different 16-byte bank groups (lanes = 2 rows x 4 column
//          blocks), and the columnwise reads take one row per instruction.
//   colq   [TK columns][TM / 2 bytes] in 8-byte units (one 16-row block each); unit u of column
//          kl lives in slot u ^ ((kl >> 1) & 7), which spreads a warp's 8-byte writes (32
//          columns, one block) over the banks (2-way conflicts at most).
//   cols   [TK columns][TM / 16] scale bytes.

#define NVQ_TM QT_NVFP4_QUANT_TILE_ROWS
#define NVQ_TK QT_NVFP4_QUANT_TILE_COLS
#define NVQ_RB (NVQ_TM / 16)
#define NVQ_KB (NVQ_TK / 16)
#define NVQ_COLQ_BYTES (NVQ_TK * NVQ_TM / 2)
#define NVQ_GENERIC (QT_NVFP4_2D | QT_NVFP4_SR)  // flags that take the generic block path

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
    uint32_t npos[2];                  // columnwise positions of a tile that are stored
    float mult[2][128];                // dense: m_b by scale byte, [0] rowwise, [1] columnwise
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

// The global scales of member i (both directions).
__device__ __forceinline__ void nvq_member_scales(const nvfp4_quantize_args &a, uint32_t i,
                                                  nvq_rowblock *rb) {
    float amax_row = (a.flags & QT_NVFP4_ROWWISE) ? ((const float *)a.amax_row)[i] : 0;
    float amax_col = (a.flags & QT_NVFP4_COLWISE) ? ((const float *)a.amax_col)[i] : 0;
    rb->row = qt_nvfp4_scale_of(amax_row);
    rb->col = qt_nvfp4_scale_of(amax_col);
}

// Step 2: one thread per 16-row block of the tile. `dense` holds a dense tensor's scales,
// computed once before the tile loop (its divisions are not per tile).
__device__ __forceinline__ void nvq_rowblock_init(const nvfp4_quantize_args &a, uint32_t row,
                                                  const nvq_rowblock &dense, nvq_rowblock *out) {
    nvq_rowblock rb = dense;
    if (a.group.count == 0) {
        rb.valid_end = rb.store_end = row < a.rows ? a.rows : 0;
    } else {
        qt_nvfp4_span span = qt_nvfp4_span_of((const uint32_t *)a.group.row_offsets,
                                              (const uint32_t *)a.group.first_dims,
                                              a.group.count, a.rows, row);
        rb.valid_end = span.valid_end;
        rb.store_end = span.store_end;
        nvq_member_scales(a, span.member, &rb);
    }
    *out = rb;
}

// Dense tensors: every block of a direction shares S_dec, so m_b is a function of the scale byte
// alone; the 2 x 128 values are computed once per CTA (one per thread) instead of one reciprocal
// per block. Ordered before use by the first barrier of the tile loop.
__device__ __forceinline__ void nvq_mult_table(const nvfp4_quantize_args &a, nvq_shared *sh) {
    const uint32_t dir = threadIdx.x >> 7, sb = threadIdx.x & 127u;
    const uint32_t flag = dir ? QT_NVFP4_COLWISE : QT_NVFP4_ROWWISE;
    if (a.group.count != 0 || !(a.flags & flag)) return;
    const float amax = ((const float *)(dir ? a.amax_col : a.amax_row))[0];
    sh->mult[dir][sb] = qt_nvfp4_block_mult((uint8_t)sb, qt_nvfp4_scale_of(amax).s_dec);
}

__device__ __forceinline__ float nvq_mult(const nvfp4_quantize_args &a, const nvq_shared *sh,
                                          uint32_t dir, uint32_t sb, float s_dec) {
    if (a.group.count == 0) return sh->mult[dir][sb & 127u];
    return qt_nvfp4_block_mult((uint8_t)sb, s_dec);
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

// The generic block path (FP32 input, 2-D, stochastic rounding, and the blocks the fast encoder
// leaves: a NaN, a scale byte that is zero, subnormal or saturated): the C twin's operations.
// `tile` is the 2-D tile amax; line and blk key the randomness. Returns sb.
template <bool FAST>
__device__ __forceinline__ uint32_t nvq_block(const nvfp4_quantize_args &a, const nvq_shared *sh,
                                              uint32_t dir, const float v[16], float tile,
                                              qt_nvfp4_scale s, uint32_t line, uint32_t blk,
                                              uint64_t step, uint32_t q[2]) {
    float amax_b = tile;
    if (FAST || !(a.flags & QT_NVFP4_2D)) {
        amax_b = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; j++) amax_b = qt_nvfp4_absmax(amax_b, v[j]);
    }
    const uint8_t sb = qt_nvfp4_block_scale(amax_b, s);
    const float mult = nvq_mult(a, sh, dir, sb, s.s_dec);
    if (!FAST && (a.flags & QT_NVFP4_SR)) {
        const uint32_t id = a.tensor_id | (dir ? QT_QUANT_TENSOR_COLWISE : 0u);
        // The branch-free form without the codec's division (the same codes).
        qt_nvfp4_encode16_sr_select(v, mult, qt_quant_random16(a.seed, step, id, line, blk), q);
    } else {
        // The twin's qt_nvfp4_encode16_rn gives these codes too (it may take the fast encoder,
        // which agrees wherever it applies); the generic encoder keeps this path small.
        qt_nvfp4_encode16(v, mult, q);
    }
    return sb;
}

// Fast encoding of two BF16 blocks y0, y1 (packed, element 2i low in word i) of direction dir
// with scales s0, s1; a block the fast encoder does not take goes through nvq_block (one copy of
// that rare path, hence the loop that selects its block). Returns the two scale bytes (block 1's
// in bits 8..15); skip[k] leaves block k alone. With stochastic rounding (the SR variant of the
// kernel) every block goes through nvq_block's SR encoder, keyed by line, blk and step as the
// general kernel keys it: the same codes.
template <bool SR>
__device__ __forceinline__ uint32_t nvq_encode2_bf16(const nvfp4_quantize_args &a,
                                                     const nvq_shared *sh, uint32_t dir,
                                                     const uint32_t y[2][8],
                                                     const qt_nvfp4_scale s[2],
                                                     const bool skip[2], const uint32_t line[2],
                                                     const uint32_t blk[2], uint64_t step,
                                                     uint32_t q[2][2]) {
    // With stochastic rounding every block takes the loop below; one block at a time (not
    // unrolled) keeps one Philox draw and 16 FP32 values live at once.
    bool fast0 = false, fast1 = false;
    uint32_t sbs = 0;
    if (!SR) {
        const float amax0 = qt_nvfp4_absmax16_bf16(y[0]), amax1 = qt_nvfp4_absmax16_bf16(y[1]);
        sbs = qt_nvfp4_e4m3x2(amax0 * s[0].c, amax1 * s[1].c);
        fast0 = !qt_f32_is_nan(amax0) && qt_nvfp4_fast_ok(sbs & 0xFFu);
        fast1 = !qt_f32_is_nan(amax1) && qt_nvfp4_fast_ok((sbs >> 8) & 0xFFu);
        if (fast0 && fast1 && !skip[0] && !skip[1]) {
            // The common case, in one basic block so that the two blocks' dependency chains
            // interleave.
            const float m0 = nvq_mult(a, sh, dir, sbs & 0xFFu, s[0].s_dec);
            const float m1 = nvq_mult(a, sh, dir, (sbs >> 8) & 0xFFu, s[1].s_dec);
            qt_nvfp4_encode16_bf16(y[0], m0, q[0]);
            qt_nvfp4_encode16_bf16(y[1], m1, q[1]);
            return sbs;
        }
        if (fast0 && !skip[0]) {
            qt_nvfp4_encode16_bf16(y[0], nvq_mult(a, sh, dir, sbs & 0xFFu, s[0].s_dec), q[0]);
        }
        if (fast1 && !skip[1]) {
            qt_nvfp4_encode16_bf16(y[1], nvq_mult(a, sh, dir, (sbs >> 8) & 0xFFu, s[1].s_dec),
                                   q[1]);
        }
        if ((fast0 || skip[0]) && (fast1 || skip[1])) return sbs;
    }
#pragma unroll 1
    for (uint32_t k = 0; k < 2; k++) {
        if (k ? (fast1 || skip[1]) : (fast0 || skip[0])) continue;
        float v[16];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t w = k ? y[1][i] : y[0][i];
            v[2 * i] = __uint_as_float(w << 16);
            v[2 * i + 1] = __uint_as_float(w & 0xFFFF0000u);
        }
        uint32_t qk[2];
        const uint32_t sb = nvq_block<!SR>(a, sh, dir, v, 0.0f, k ? s[1] : s[0],
                                           k ? line[1] : line[0], k ? blk[1] : blk[0], step, qk);
        sbs = (sbs & ~(0xFFu << (8 * k))) | sb << (8 * k);
        if (k) {
            q[1][0] = qk[0];
            q[1][1] = qk[1];
        } else {
            q[0][0] = qk[0];
            q[0][1] = qk[1];
        }
    }
    return sbs;
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

// Step 3 (rowwise part): the thread's two row blocks (row (t >> 2) + 64 i, column block t & 3),
// read back from shared memory, where this thread staged them.
template <int ESIZE, bool FAST>
__device__ __forceinline__ void nvq_rowwise(const nvfp4_quantize_args &a, const uint4 *s_in,
                                            const nvq_shared *sh, uint32_t m0, uint32_t k0,
                                            uint64_t step) {
    const uint32_t rpitch = (a.cols + 1) / 2, spitch = (a.cols + 15) / 16;
    const bool aligned = ((a.row_data | rpitch) & 7u) == 0;
    const uint32_t b = threadIdx.x & 3u, kb = k0 + b * 16;
    if (kb >= a.cols) return;
    uint32_t m[2], q[2][2], sbs = 0;
    bool skip[2];
    qt_nvfp4_scale s[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t r = (threadIdx.x >> 2) + 64u * i;
        m[i] = m0 + r;
        skip[i] = m[i] >= sh->rb[r >> 4].store_end;
        s[i] = sh->rb[r >> 4].row;
    }
    if (skip[0] && skip[1]) return;
#pragma unroll 1
    for (uint32_t i = 0; i < 2; i++) {
        if (i ? skip[1] : skip[0]) continue;
        const uint32_t r = (threadIdx.x >> 2) + 64u * i;
        float v[16];
        nvq_read_row16<ESIZE>(s_in, r, b, v);
        const float tile = sh->tile_amax[(r >> 4) * NVQ_KB + b];
        uint32_t qi[2];
        sbs |= nvq_block<FAST>(a, sh, 0, v, tile, i ? s[1] : s[0], m0 + r, kb / 16, step, qi)
               << (8 * i);
        if (i) {
            q[1][0] = qi[0];
            q[1][1] = qi[1];
        } else {
            q[0][0] = qi[0];
            q[0][1] = qi[1];
        }
    }
    uint8_t *row_data = (uint8_t *)a.row_data;
    uint8_t *row_scales = (uint8_t *)a.row_scales;
    const uint32_t nbytes = min(8u, (a.cols - kb + 1) / 2);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (skip[i]) continue;
        nvq_store8(row_data + (uint64_t)m[i] * rpitch + kb / 2, q[i], nbytes, aligned);
        row_scales[(uint64_t)m[i] * spitch + kb / 16] = (uint8_t)(sbs >> (8 * i));
    }
}

// Step 5, generic path, for one column (kl = column within the tile) of 16-row block rbi.
template <bool FAST>
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
    const float tile = sh->tile_amax[rbi * NVQ_KB + (kl >> 4)];
    uint32_t q[2];
    const uint32_t sb =
        nvq_block<FAST>(a, sh, 1, v, tile, rb.col, k0 + kl, m0 / 16 + rbi, step, q);
    s_colq[kl * NVQ_RB + (rbi ^ ((kl >> 1) & 7u))] = make_uint2(q[0], q[1]);
    s_cols[kl * NVQ_RB + rbi] = (uint8_t)sb;
}

// Step 5, generic path: one column at a time.
template <int ESIZE, bool FAST>
__device__ __forceinline__ void nvq_colwise_generic(const nvfp4_quantize_args &a,
                                                    const uint4 *s_in, const nvq_shared *sh,
                                                    const nvq_rowblock &rb, uint32_t rbi,
                                                    uint32_t n_store, uint32_t m0, uint32_t k0,
                                                    uint64_t step, uint2 *s_colq,
                                                    uint8_t *s_cols) {
    constexpr uint32_t CPR = NVQ_TK * ESIZE / 16;
    const uint32_t cp = threadIdx.x & 31;
#pragma unroll 1
    for (uint32_t c = 0; c < 2; c++) {
        float v[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t r = rbi * 16 + j;
            if (ESIZE == 2) {
                // Column pair cp is 32-bit word cp of each row: chunk cp / 4, word cp % 4.
                const uint32_t word = ((const uint32_t *)s_in)[nvq_slot(r, cp >> 2, CPR) * 4 +
                                                                (cp & 3)];
                v[j] = __uint_as_float(c ? (word & 0xFFFF0000u) : (word << 16));
            } else {
                // Column 2 cp + c is float 2 (cp % 2) + c of chunk cp / 2.
                v[j] = ((const float *)s_in)[nvq_slot(r, cp >> 1, CPR) * 4 + 2 * (cp & 1) + c];
            }
        }
        nvq_column<FAST>(a, v, sh, rb, rbi, n_store, m0, k0, 2 * cp + c, step, s_colq, s_cols);
    }
}

// Step 5: warp = 16-row block, lane = column pair.
template <int ESIZE, bool FAST>
__device__ __forceinline__ void nvq_colwise(const nvfp4_quantize_args &a, const uint4 *s_in,
                                            const nvq_shared *sh, uint32_t m0, uint32_t k0,
                                            uint64_t step, uint2 *s_colq, uint8_t *s_cols) {
    const uint32_t rbi = threadIdx.x >> 5;
    const nvq_rowblock rb = sh->rb[rbi];
    const uint32_t mb = m0 + rbi * 16;
    if (mb >= rb.store_end) return;  // nothing of this block is stored
    const uint32_t n_store = min(16u, rb.store_end - mb);
    nvq_colwise_generic<ESIZE, FAST>(a, s_in, sh, rb, rbi, n_store, m0, k0, step, s_colq, s_cols);
}

// Step 6: thread = (column kl, 16-byte quarter q) of the staged codes; threads 0..63 also write
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

// Step 1: the thread's chunks of the tile at m0 (zero past M and past `cols`). A tile wholly
// inside an aligned tensor, the common case, takes plain loads from one base address.
template <int ESIZE>
__device__ __forceinline__ void nvq_load(const nvfp4_quantize_args &a, uint4 *chunk, uint32_t m0,
                                         uint32_t k0, bool aligned) {
    constexpr uint32_t VEC = 16 / ESIZE;
    const uint32_t r = threadIdx.x >> 2, col = k0 + (threadIdx.x & 3u) * ESIZE * VEC;
    if (aligned && m0 + NVQ_TM <= a.rows && k0 + NVQ_TK <= a.cols) {
        const uint4 *p = (const uint4 *)(a.x + ((uint64_t)(m0 + r) * a.cols + col) * ESIZE);
        const uint64_t down = (uint64_t)a.cols * (64 * ESIZE / 16);  // 64 rows, in chunks
#pragma unroll
        for (int i = 0; i < 2; i++) {
#pragma unroll
            for (int c = 0; c < ESIZE; c++) chunk[ESIZE * i + c] = __ldg(p + i * down + c);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t m = m0 + r + 64u * i;
#pragma unroll
        for (int c = 0; c < ESIZE; c++) {
            chunk[ESIZE * i + c] = m < a.rows ? nv_load_chunk<ESIZE>((const uint8_t *)a.x, a.cols,
                                                                     m, col + c * VEC, aligned)
                                              : make_uint4(0, 0, 0, 0);
        }
    }
}

// Step 3: padding rows zeroed, then the chunks go to shared memory, chunk c of block i at
// s_in[slot[c] + 64 CPR i] with slot[c] = nvq_slot(r, first chunk + c) (rows r and r + 64 share
// the swizzle).
template <int ESIZE>
__device__ __forceinline__ void nvq_stage(uint4 *s_in, const uint32_t *slot,
                                          const nvq_shared *sh, uint4 *chunk, uint32_t m0) {
    constexpr uint32_t CPR = NVQ_TK * ESIZE / 16;
    const uint32_t r = threadIdx.x >> 2;
    const bool valid0 = m0 + r < sh->rb[r >> 4].valid_end;
    const bool valid1 = m0 + r + 64 < sh->rb[(r >> 4) + 4].valid_end;
    if (!(valid0 && valid1)) {  // padding rows or past M: rare, so a branch, not selects
#pragma unroll
        for (int c = 0; c < ESIZE; c++) {
            if (!valid0) chunk[c] = make_uint4(0, 0, 0, 0);
            if (!valid1) chunk[ESIZE + c] = make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int c = 0; c < ESIZE; c++) s_in[slot[c] + 64 * CPR * i] = chunk[ESIZE * i + c];
    }
}

// FAST: no 2-D and no stochastic rounding (flags & NVQ_GENERIC == 0), known at compile time so
// that each variant gets its own register allocation.
template <int ESIZE, bool FAST>
__device__ __forceinline__ void nvq_body(const nvfp4_quantize_args &a, nvq_shared &sh) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint4 *s_in = (uint4 *)smem;
    uint2 *s_colq = (uint2 *)(smem + NVQ_TM * NVQ_TK * ESIZE);
    uint8_t *s_cols = smem + NVQ_TM * NVQ_TK * ESIZE + NVQ_COLQ_BYTES;
    const bool in_aligned = ((a.x | ((uint64_t)a.cols * ESIZE)) & 15u) == 0;
    const bool colwise = (a.flags & QT_NVFP4_COLWISE) != 0;
    const bool two_d = !FAST && (a.flags & QT_NVFP4_2D) != 0;
    const uint32_t k0 = blockIdx.x * NVQ_TK;
    const uint32_t tiles_m = (a.rows + NVQ_TM - 1) / NVQ_TM;
    const uint64_t step = (!FAST && (a.flags & QT_NVFP4_SR)) ? *(const uint64_t *)a.step : 0;
    nvq_mult_table(a, &sh);
    nvq_rowblock dense = {0, 0, {0, 0}, {0, 0}};
    if (a.group.count == 0 && threadIdx.x < NVQ_RB) nvq_member_scales(a, 0, &dense);
    uint32_t slot[ESIZE];
#pragma unroll
    for (int c = 0; c < ESIZE; c++) {
        slot[c] = nvq_slot(threadIdx.x >> 2, (threadIdx.x & 3u) * ESIZE + c, NVQ_TK * ESIZE / 16);
    }
    uint32_t it = 0;
    for (uint32_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y, it++) {
        const uint32_t m0 = tm * NVQ_TM;
        uint4 chunk[2 * ESIZE];
        nvq_load<ESIZE>(a, chunk, m0, k0, in_aligned);
        if (threadIdx.x < NVQ_RB) {
            nvq_rowblock_init(a, m0 + threadIdx.x * 16, dense, &sh.rb[threadIdx.x]);
            // Active blocks form a prefix of the tile (grouped: whole blocks below
            // row_offsets[n]; dense: up to M), so one length says what is stored: the largest
            // over the active blocks of their store_end, from m0, at most TM.
            const uint32_t end = sh.rb[threadIdx.x].store_end, mb = m0 + threadIdx.x * 16;
            uint32_t npos = end > mb ? min(end - m0, (uint32_t)NVQ_TM) : 0u;
#pragma unroll
            for (int offset = 1; offset < NVQ_RB; offset <<= 1) {
                npos = max(npos, __shfl_xor_sync(0xFFu, npos, offset));
            }
            // Two slots: the previous tile's columnwise store may still be reading the other.
            if (threadIdx.x == 0) sh.npos[it & 1] = npos;
        }
        __syncthreads();
        nvq_stage<ESIZE>(s_in, slot, &sh, chunk, m0);
        if ((a.flags & QT_NVFP4_ROWWISE) && !two_d) {
            nvq_rowwise<ESIZE, FAST>(a, s_in, &sh, m0, k0, step);
        }
        __syncthreads();
        if (two_d) {
            nvq_tile_amax<ESIZE>(s_in, &sh);
            __syncthreads();
            if (a.flags & QT_NVFP4_ROWWISE) nvq_rowwise<ESIZE, FAST>(a, s_in, &sh, m0, k0, step);
        }
        if (colwise) {
            nvq_colwise<ESIZE, FAST>(a, s_in, &sh, m0, k0, step, s_colq, s_cols);
            __syncthreads();
            nvq_colwise_store(a, s_colq, s_cols, sh.npos[it & 1], m0, k0);
        } else {
            __syncthreads();  // the 2-D rowwise pass reads s_rb, which the next tile rewrites
        }
        // No barrier here: the next tile's writes of shared memory (s_rb before its first
        // barrier, the rest after it) touch nothing that is read after this tile's last barrier
        // (the columnwise store reads s_colq and s_cols, rewritten only after two more).
    }
}

// The general kernel: FP32 input, and BF16 with 2-D. Three CTAs per SM
// (up to 80 registers, no spills).
extern "C" __global__ void __launch_bounds__(NV_THREADS, 3)
    qt_nvfp4_quantize(const __grid_constant__ nvfp4_quantize_args args) {
    qt_grid_enter();
    __shared__ nvq_shared sh;  // one copy for the variants
    if (args.dtype == QT_DTYPE_BF16) {
        nvq_body<2, false>(args, sh);
    } else if (args.flags & NVQ_GENERIC) {
        nvq_body<4, false>(args, sh);
    } else {
        nvq_body<4, true>(args, sh);
    }
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_quantize_bf16: the fused cast as TE runs it (BF16, no 2-D, no stochastic rounding),
// compiled alone so that its register budget is its own (64: four CTAs per SM), and arranged so
// that a tile costs one CTA barrier. Warp w owns the 16-row block w of the 128 x 64 tile for all
// but the final columnwise store: lane l loads the 64 bytes of row 16 w + l / 2 that hold its
// two column blocks 2 (l & 1) and 2 (l & 1) + 1, encodes them rowwise from its registers, and
// stages them in the warp's own 2 KiB of shared memory, from which (after __syncwarp) the warp
// reads its columns. Each warp looks up its own row block's span. The staged columnwise codes
// are double-buffered, so the barrier before their store is the only one per tile; the stored
// length of the tile follows from one bound (min(row_offsets[n], M), or M when dense), since the
// active blocks form a prefix.
//
// Shared memory (dynamic, QT_NVFP4_QUANT_BF16_SMEM bytes):
//   in     [8 warps][16 rows][8 chunks of 16 bytes]; chunk c of row r in slot c ^ (r & 7), so
//          the 8 lanes of a 128-bit store phase (4 rows x 2 chunks) and the 32 lanes of a
//          columnwise read (one row) hit distinct banks
//   colq   [2 buffers][64 columns][8 units of 8 bytes], swizzled as in the general kernel
//   cols   [2 buffers][64 columns][8 scale bytes]

#define NVB_COLQ_UNITS (NVQ_TK * NVQ_RB)  // 8-byte units of one colq buffer
QT_STATIC_ASSERT(QT_NVFP4_QUANT_BF16_SMEM ==
                     NVQ_TM * NVQ_TK * 2 + 2 * (NVQ_COLQ_BYTES + NVQ_TK * NVQ_RB),
                 "QT_NVFP4_QUANT_BF16_SMEM matches the layout");

// The warp's row block at mb: spans and global scales (dense: from `dense`, computed once).
__device__ __forceinline__ nvq_rowblock nvb_rowblock(const nvfp4_quantize_args &a, uint32_t mb,
                                                     const nvq_rowblock &dense) {
    nvq_rowblock rb = dense;
    if (a.group.count == 0) {
        rb.valid_end = rb.store_end = mb < a.rows ? a.rows : 0;
    } else {
        const qt_nvfp4_span span = qt_nvfp4_span_of((const uint32_t *)a.group.row_offsets,
                                                    (const uint32_t *)a.group.first_dims,
                                                    a.group.count, a.rows, mb);
        rb.valid_end = span.valid_end;
        rb.store_end = span.store_end;
        nvq_member_scales(a, span.member, &rb);
    }
    return rb;
}

// The lane's 32 elements of the tile at m0 (2 ESIZE chunks: 64 bytes of BF16, 128 of FP32): row
// m0 + 16 w + l / 2, columns k0 + 32 (l & 1) .. + 32.
template <int ESIZE>
__device__ __forceinline__ void nvb_load(const nvfp4_quantize_args &a, uint4 chunk[2 * ESIZE],
                                         uint32_t m0, uint32_t k0, bool aligned) {
    constexpr uint32_t VEC = 16 / ESIZE;
    const uint32_t lane = threadIdx.x & 31, m = m0 + (threadIdx.x >> 5) * 16 + (lane >> 1);
    const uint32_t col = k0 + (lane & 1u) * 32;
    if (aligned && m0 + NVQ_TM <= a.rows && k0 + NVQ_TK <= a.cols) {
        const uint4 *p = (const uint4 *)(a.x + ((uint64_t)m * a.cols + col) * ESIZE);
#pragma unroll
        for (int i = 0; i < 2 * ESIZE; i++) chunk[i] = __ldg(p + i);
        return;
    }
#pragma unroll
    for (int i = 0; i < 2 * ESIZE; i++) {
        chunk[i] = m < a.rows ? nv_load_chunk<ESIZE>((const uint8_t *)a.x, a.cols, m,
                                                     col + VEC * i, aligned)
                              : make_uint4(0, 0, 0, 0);
    }
}

// Padding rows and rows past M read as zero: the lane's n chunks of row mb + l / 2 (nvb_load's)
// when that row lies at or past its row block's valid_end.
template <int N>
__device__ __forceinline__ void nvb_zero_invalid(uint4 (&chunk)[N], uint32_t mb,
                                                 const nvq_rowblock &rb) {
    if (mb + ((threadIdx.x & 31) >> 1) >= rb.valid_end) {
#pragma unroll
        for (int i = 0; i < N; i++) chunk[i] = make_uint4(0, 0, 0, 0);
    }
}

// QT_NVFP4_*_VALUES: one block's 16 codes with scale byte sb as qt_nvfp4_decode writes them (the
// GEMMs' decode, the raw values in BF16), 32 bytes at dst.
__device__ __forceinline__ void nvb_store_values(uint4 *dst, const uint32_t q[2], uint32_t sb) {
    const uint32_t scale2 = gemm_nvfp4_scale_pair((uint8_t)sb);
    uint32_t lo[4], hi[4];
    gemm_decode_nvfp4x8(q[0], scale2, lo);
    gemm_decode_nvfp4x8(q[1], scale2, hi);
    dst[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    dst[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
}

// The lane's two rowwise blocks' codes q and scale bytes sbs (block 1's in bits 8..15) at row m,
// first column kb (< cols); skip1 leaves block 1 out (past cols). One 16-byte code store and one
// 2-byte scale store when whole and aligned.
__device__ __forceinline__ void nvb_row_store(const nvfp4_quantize_args &a, uint32_t m,
                                              uint32_t kb, const uint32_t q[2][2], uint32_t sbs,
                                              bool skip1) {
    const uint32_t rpitch = (a.cols + 1) / 2, spitch = (a.cols + 15) / 16;
    uint8_t *data = (uint8_t *)a.row_data + (uint64_t)m * rpitch + kb / 2;
    uint8_t *scales = (uint8_t *)a.row_scales + (uint64_t)m * spitch + kb / 16;
    if (!skip1 && kb + 32 <= a.cols && ((a.row_data | rpitch) & 15u) == 0 &&
        ((a.row_scales | spitch) & 1u) == 0) {
        *(uint4 *)data = make_uint4(q[0][0], q[0][1], q[1][0], q[1][1]);
        *(uint16_t *)scales = (uint16_t)sbs;
        return;
    }
    const bool aligned = ((a.row_data | rpitch) & 7u) == 0;
    nvq_store8(data, q[0], min(8u, (a.cols - kb + 1) / 2), aligned);
    scales[0] = (uint8_t)sbs;
    if (!skip1) {
        nvq_store8(data + 8, q[1], min(8u, (a.cols - kb - 16 + 1) / 2), aligned);
        scales[1] = (uint8_t)(sbs >> 8);
    }
}

// The lane's two rowwise blocks (chunks 0-1 and 2-3) at row m, first column kb; stored as one
// 16-byte code store and one 2-byte scale store when whole and aligned, or as their values
// (ROW_VALUES: whole blocks, 16-byte aligned rows, the builder's preconditions).
template <bool SR>
__device__ __forceinline__ void nvb_rowwise(const nvfp4_quantize_args &a, const uint4 chunk[4],
                                            const nvq_shared *sh, const nvq_rowblock &rb,
                                            uint32_t m, uint32_t kb, uint64_t step) {
    const bool skip_row = m >= rb.store_end;
    const bool skip[2] = {skip_row || kb >= a.cols, skip_row || kb + 16 >= a.cols};
    if (skip[0]) return;  // then the second block is skipped too
    uint32_t y[2][8];
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            y[i][4 * c] = chunk[2 * i + c].x;
            y[i][4 * c + 1] = chunk[2 * i + c].y;
            y[i][4 * c + 2] = chunk[2 * i + c].z;
            y[i][4 * c + 3] = chunk[2 * i + c].w;
        }
    }
    const qt_nvfp4_scale s[2] = {rb.row, rb.row};
    const uint32_t line[2] = {m, m}, blk[2] = {kb / 16, kb / 16 + 1};
    uint32_t q[2][2];
    const uint32_t sbs = nvq_encode2_bf16<SR>(a, sh, 0, y, s, skip, line, blk, step, q);
    if (a.flags & QT_NVFP4_ROW_VALUES) {
        uint4 *dst = (uint4 *)((uint16_t *)a.row_data + (uint64_t)m * a.cols + kb);
        nvb_store_values(dst, q[0], sbs & 0xFFu);
        if (!skip[1]) nvb_store_values(dst + 2, q[1], (sbs >> 8) & 0xFFu);
        return;
    }
    nvb_row_store(a, m, kb, q, sbs, skip[1]);
}

// The warp's columnwise blocks: lane cp takes columns 2 cp and 2 cp + 1 of the warp's rows,
// word cp of each staged row.
template <bool SR>
__device__ __forceinline__ void nvb_colwise(const nvfp4_quantize_args &a, const uint4 *s_rows,
                                            const nvq_shared *sh, const nvq_rowblock &rb,
                                            uint32_t rbi, uint32_t n_store, uint32_t m0,
                                            uint32_t k0, uint64_t step, uint2 *s_colq,
                                            uint8_t *s_cols) {
    const uint32_t cp = threadIdx.x & 31;
    const uint32_t *s_words = (const uint32_t *)s_rows;
    uint32_t w[16], y[2][8];
#pragma unroll
    for (int j = 0; j < 16; j++) w[j] = s_words[(j * 8 + ((cp >> 2) ^ (j & 7))) * 4 + (cp & 3)];
    if (a.flags & QT_NVFP4_RHT) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float v[16];
#pragma unroll
            for (int j = 0; j < 16; j++) {
                v[j] = __uint_as_float(c ? (w[j] & 0xFFFF0000u) : (w[j] << 16));
            }
            if (a.rht_signs == QT_NVFP4_RHT_SIGNS_TE) {
                qt_nvfp4_rht16_bf16in_f32(v, QT_NVFP4_RHT_SIGNS_TE);  // constant signs
            } else {
                qt_nvfp4_rht16_bf16in_f32(v, a.rht_signs);
            }
            qt_nvfp4_pack_bf16(v, y[c]);
        }
        if (n_store < 16) {  // only a dense tensor's last, partial group: past M, not counted
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint32_t keep = 2u * i >= n_store ? 0u : (2u * i + 1 >= n_store ? 0xFFFFu
                                                                                    : ~0u);
                y[0][i] &= keep;
                y[1][i] &= keep;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[0][i] = qt_nvfp4_prmt(w[2 * i], w[2 * i + 1], 0x5410u);  // rows 2i, 2i+1 of col 0
            y[1][i] = qt_nvfp4_prmt(w[2 * i], w[2 * i + 1], 0x7632u);
        }
    }
    const qt_nvfp4_scale s[2] = {rb.col, rb.col};
    const bool skip[2] = {false, false};
    const uint32_t line[2] = {k0 + 2 * cp, k0 + 2 * cp + 1};
    const uint32_t blk[2] = {m0 / 16 + rbi, m0 / 16 + rbi};
    uint32_t q[2][2];
    const uint32_t sbs = nvq_encode2_bf16<SR>(a, sh, 1, y, s, skip, line, blk, step, q);
    if (a.flags & QT_NVFP4_COL_VALUES) {  // dense, whole row blocks: straight to the copy
#pragma unroll
        for (uint32_t c = 0; c < 2; c++) {
            const uint32_t k = k0 + 2 * cp + c;
            if (k >= a.cols) continue;
            uint4 *dst = (uint4 *)((uint16_t *)a.col_data + (uint64_t)k * a.rows + m0 + 16 * rbi);
            nvb_store_values(dst, q[c], (sbs >> (8 * c)) & 0xFFu);
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const uint32_t kl = 2 * cp + c;
        s_colq[kl * NVQ_RB + (rbi ^ ((kl >> 1) & 7u))] = make_uint2(q[c][0], q[c][1]);
        s_cols[kl * NVQ_RB + rbi] = (uint8_t)(sbs >> (8 * c));
    }
}

// The fast casts' per-CTA setup: the multiplier table (ordered by the caller's first barrier),
// a dense tensor's global scales, and the bound below which rows are active (M, or
// min(row_offsets[n], M) for a grouped tensor), whose tile's stored columnwise length follows
// from it since the active blocks form a prefix.
__device__ __forceinline__ uint32_t nvb_setup(const nvfp4_quantize_args &a, nvq_shared &sh,
                                              nvq_rowblock *dense) {
    uint32_t limit = a.rows;
    if (a.group.count != 0) {
        limit = min(limit, ((const uint32_t *)a.group.row_offsets)[a.group.count]);
    }
    nvq_mult_table(a, &sh);
    *dense = nvq_rowblock{0, 0, {0, 0}, {0, 0}};
    if (a.group.count == 0) nvq_member_scales(a, 0, dense);
    return limit;
}

template <bool SR>
__device__ __forceinline__ void nvq_body_bf16(const nvfp4_quantize_args &a, nvq_shared &sh) {
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint4 *s_rows = (uint4 *)smem + warp * 16 * 8;  // this warp's 16 staged rows
    uint2 *s_colq = (uint2 *)(smem + NVQ_TM * NVQ_TK * 2);
    uint8_t *s_cols = smem + NVQ_TM * NVQ_TK * 2 + 2 * NVQ_COLQ_BYTES;
    const bool in_aligned = ((a.x | ((uint64_t)a.cols * 2)) & 15u) == 0;
    const bool colwise = (a.flags & QT_NVFP4_COLWISE) != 0;
    const uint32_t k0 = blockIdx.x * NVQ_TK;
    const uint32_t tiles_m = (a.rows + NVQ_TM - 1) / NVQ_TM;
    const uint64_t step = SR ? *(const uint64_t *)a.step : 0;
    // Rows below `limit` are active; a tile stores its columnwise positions below it.
    nvq_rowblock dense;
    const uint32_t limit = nvb_setup(a, sh, &dense);
    // This lane's staging slots (chunks 4 (l & 1) + i of row l / 2), and its column blocks.
    const uint32_t r = lane >> 1, c0 = (lane & 1u) * 4;
    __syncthreads();  // the multiplier table
    uint32_t it = 0;
    for (uint32_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y, it++) {
        const uint32_t m0 = tm * NVQ_TM, mb = m0 + warp * 16;
        uint4 chunk[4];
        nvb_load<2>(a, chunk, m0, k0, in_aligned);
        const nvq_rowblock rb = nvb_rowblock(a, mb, dense);
        nvb_zero_invalid(chunk, mb, rb);
        if (colwise) {
#pragma unroll
            for (int i = 0; i < 4; i++) s_rows[r * 8 + ((c0 + i) ^ (r & 7u))] = chunk[i];
        }
        if (a.flags & QT_NVFP4_ROWWISE) {
            nvb_rowwise<SR>(a, chunk, &sh, rb, mb + r, k0 + c0 * 8, step);
        }
        if (!colwise) continue;
        __syncwarp();
        uint2 *colq = s_colq + (it & 1) * NVB_COLQ_UNITS;
        uint8_t *cols = s_cols + (it & 1) * NVQ_TK * NVQ_RB;
        if (mb < rb.store_end) {
            nvb_colwise<SR>(a, s_rows, &sh, rb, warp, min(16u, rb.store_end - mb), m0, k0, step,
                            colq, cols);
        }
        // The tile's only barrier: all columnwise codes staged. The next tile writes the other
        // buffer; the one after writes this one only after the next tile's barrier, which every
        // thread reaches after this store. The staged rows are the warp's own, rewritten only
        // after this barrier.
        __syncthreads();
        if (a.flags & QT_NVFP4_COL_VALUES) continue;  // nvb_colwise stored them
        nvq_colwise_store(a, colq, cols, limit > m0 ? min(limit - m0, (uint32_t)NVQ_TM) : 0u,
                          m0, k0);
    }
}

extern "C" __global__ void __launch_bounds__(NV_THREADS, 4)
    qt_nvfp4_quantize_bf16(const __grid_constant__ nvfp4_quantize_args args) {
    qt_grid_enter();
    __shared__ nvq_shared sh;  // the multiplier table only
    nvq_body_bf16<false>(args, sh);
}

// The same cast of BF16 gradients with stochastic rounding: the tile and its single barrier as
// above, each block through the SR encoder (a Philox draw of 16 random bytes a block, the
// branch-free select form), which needs more registers than the round-to-nearest encoder:
// compiled alone, two CTAs an SM (the select form's comparisons of a block in flight at once).
extern "C" __global__ void __launch_bounds__(NV_THREADS, 2)
    qt_nvfp4_quantize_bf16_sr(const __grid_constant__ nvfp4_quantize_args args) {
    qt_grid_enter();
    __shared__ nvq_shared sh;  // the multiplier table only
    nvq_body_bf16<true>(args, sh);
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_quantize_f32_2d: FP32 input with 16 x 16 tiles, rounding to nearest (the weights' cast
// after each optimizer step), in the BF16 fast cast's arrangement: warp w owns the tile's 16-row
// block w, a row of four 16 x 16 tiles, and lane l holds row 16 w + l / 2, columns
// 32 (l & 1) .. + 32 (two blocks, 128 bytes) in registers. A tile's amax is then a maximum over
// the 16 lanes of one parity (four shuffles), the rowwise codes come from registers, the
// columnwise ones from the warp's own 4 KiB of staged rows, and the only CTA barrier of a tile
// is the double-buffered columnwise store's. The encoder is qt_nvfp4_encode16_rn (fast where it
// applies: a tile's amax bounds every element of its blocks, so |RN(x m_b)| < 7 holds as for a
// block's own amax), whose codes are the general kernel's.
//
// Shared memory (dynamic, QT_NVFP4_QUANT_F32_SMEM bytes):
//   in     [8 warps][16 rows][16 chunks of 16 bytes]; chunk c of row r in slot
//          c ^ (2 (r & 3) + (c >> 3)): the 8 lanes of a 128-bit store phase (4 rows x 2 halves)
//          hit distinct 16-byte bank groups, and a columnwise read (one row, 8 bytes a lane)
//          covers the row's 256 bytes once
//   colq, cols as in qt_nvfp4_quantize_bf16

QT_STATIC_ASSERT(QT_NVFP4_QUANT_F32_SMEM ==
                     NVQ_TM * NVQ_TK * 4 + 2 * (NVQ_COLQ_BYTES + NVQ_TK * NVQ_RB),
                 "QT_NVFP4_QUANT_F32_SMEM matches the layout");

__device__ __forceinline__ uint32_t nvf_slot(uint32_t r, uint32_t c) {
    return r * 16u + (c ^ (((r & 3u) << 1) | (c >> 3)));
}

// One block of direction dir with its tile's amax: the scale byte (returned) and the codes.
__device__ __forceinline__ uint32_t nvf_block(const nvfp4_quantize_args &a, const nvq_shared *sh,
                                              uint32_t dir, const float v[16], float tile,
                                              qt_nvfp4_scale s, uint32_t q[2]) {
    const uint8_t sb = qt_nvfp4_block_scale(tile, s);
    qt_nvfp4_encode16_rn(v, nvq_mult(a, sh, dir, sb, s.s_dec), sb, q);
    return sb;
}

__device__ __forceinline__ void nvq_body_f32_2d(const nvfp4_quantize_args &a, nvq_shared &sh) {
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint4 *s_rows = (uint4 *)smem + warp * 16 * 16;  // this warp's 16 staged rows
    uint2 *s_colq = (uint2 *)(smem + NVQ_TM * NVQ_TK * 4);
    uint8_t *s_cols = smem + NVQ_TM * NVQ_TK * 4 + 2 * NVQ_COLQ_BYTES;
    const bool in_aligned = ((a.x | ((uint64_t)a.cols * 4)) & 15u) == 0;
    const bool rowwise = (a.flags & QT_NVFP4_ROWWISE) != 0;
    const bool colwise = (a.flags & QT_NVFP4_COLWISE) != 0;
    const uint32_t k0 = blockIdx.x * NVQ_TK;
    const uint32_t tiles_m = (a.rows + NVQ_TM - 1) / NVQ_TM;
    nvq_rowblock dense;
    const uint32_t limit = nvb_setup(a, sh, &dense);  // rows below it are active
    const uint32_t r = lane >> 1, half = lane & 1u;
    __syncthreads();  // the multiplier table
    uint32_t it = 0;
    for (uint32_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y, it++) {
        const uint32_t m0 = tm * NVQ_TM, mb = m0 + warp * 16;
        uint4 chunk[8];
        nvb_load<4>(a, chunk, m0, k0, in_aligned);
        const nvq_rowblock rb = nvb_rowblock(a, mb, dense);
        nvb_zero_invalid(chunk, mb, rb);
        float v[2][16];
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int e = 0; e < 16; e++) {
                v[j][e] = __uint_as_float(nv_word(chunk[4 * j + e / 4], e & 3));
            }
        }
        // The amaxes of the lane's two tiles: its blocks', then the maximum over the 16 rows
        // (the lanes of its parity). Non-negative, non-NaN: ordered as their bits.
        uint32_t t[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float mx = 0.0f;
#pragma unroll
            for (int e = 0; e < 16; e++) mx = qt_nvfp4_absmax(mx, v[j][e]);
            t[j] = __float_as_uint(mx);
#pragma unroll
            for (int offset = 2; offset < 32; offset <<= 1) {
                t[j] = max(t[j], __shfl_xor_sync(~0u, t[j], offset));
            }
        }
        if (colwise) {
#pragma unroll
            for (int i = 0; i < 8; i++) s_rows[nvf_slot(r, 8 * half + i)] = chunk[i];
        }
        const uint32_t kb = k0 + 32 * half;
        if (rowwise && mb + r < rb.store_end && kb < a.cols) {
            uint32_t q[2][2], sbs = 0;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                sbs |= nvf_block(a, &sh, 0, v[j], __uint_as_float(t[j]), rb.row, q[j]) << (8 * j);
            }
            nvb_row_store(a, mb + r, kb, q, sbs, kb + 16 >= a.cols);
        }
        if (!colwise) continue;
        __syncwarp();
        uint2 *colq = s_colq + (it & 1) * NVB_COLQ_UNITS;
        uint8_t *cols = s_cols + (it & 1) * NVQ_TK * NVQ_RB;
        if (mb < rb.store_end) {  // uniform over the warp
            // Lane cp takes columns 2 cp and 2 cp + 1, in tile cp / 8, which lane cp / 16 holds
            // as its tile (cp / 8) & 1.
            const uint32_t cp = lane;
            const uint32_t t0 = __shfl_sync(~0u, t[0], cp >> 4);
            const uint32_t t1 = __shfl_sync(~0u, t[1], cp >> 4);
            const float tile = __uint_as_float(((cp >> 3) & 1u) ? t1 : t0);
            const float2 *s_pairs = (const float2 *)s_rows;
            float w[2][16];
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float2 pair = s_pairs[nvf_slot(j, cp >> 1) * 2 + (cp & 1u)];
                w[0][j] = pair.x;
                w[1][j] = pair.y;
            }
#pragma unroll
            for (uint32_t c = 0; c < 2; c++) {
                const uint32_t kl = 2 * cp + c;
                uint32_t q[2];
                const uint32_t sb = nvf_block(a, &sh, 1, w[c], tile, rb.col, q);
                colq[kl * NVQ_RB + (warp ^ ((kl >> 1) & 7u))] = make_uint2(q[0], q[1]);
                cols[kl * NVQ_RB + warp] = (uint8_t)sb;
            }
        }
        // The tile's only barrier, as in qt_nvfp4_quantize_bf16.
        __syncthreads();
        nvq_colwise_store(a, colq, cols, limit > m0 ? min(limit - m0, (uint32_t)NVQ_TM) : 0u, m0,
                          k0);
    }
}

extern "C" __global__ void __launch_bounds__(NV_THREADS, 3)
    qt_nvfp4_quantize_f32_2d(const __grid_constant__ nvfp4_quantize_args args) {
    qt_grid_enter();
    __shared__ nvq_shared sh;  // the multiplier table only
    nvq_body_f32_2d(args, sh);
}

// ---------------------------------------------------------------------------------------------
// qt_nvfp4_dequantize: thread = output column, CTA = 256 columns of one 16-row block per
// iteration (grid.y strides over row blocks). Not on a hot path; written for clarity.

extern "C" __global__ void __launch_bounds__(NV_THREADS)
    qt_nvfp4_dequantize(const __grid_constant__ nvfp4_dequantize_args a) {
    qt_grid_enter();
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
            const float value = qt_nvfp4_dequant_value(nibble, sb, amax);
            const uint64_t index = (uint64_t)m * a.cols + k;
            if (a.out_dtype == QT_DTYPE_F32) {
                ((float *)a.out)[index] = value;
            } else {
                ((uint16_t *)a.out)[index] = qt_f32_to_bf16(value);
            }
        }
    }
}

// qt_nvfp4_decode (quant_nvfp4.h): grid-stride over the 16-element blocks. Whole blocks of even
// rows (k a multiple of 16) take the vector path: 8 code bytes and the scale in, 32 bytes out.
extern "C" __global__ void __launch_bounds__(NV_THREADS)
    qt_nvfp4_decode(const __grid_constant__ nvfp4_decode_args a) {
    qt_grid_enter();
    uint64_t blocks = (uint64_t)a.rows * ((a.k + 15) / 16);
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    bool vec = a.k % 16 == 0;
    for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += stride) {
        if (!vec) {
            qt_nvfp4_decode_block(&a, b);
            continue;
        }
        // The NVFP4 GEMMs' own decode (gemm_decode.h: BF16 pair arithmetic, the same bits as
        // qt_nvfp4_raw_value rounded to BF16 for every code and scale, tests/test_gemm.c's
        // decode table), a few instructions per pair instead of a conversion per element.
        uint2 codes = ((const uint2 *)a.data)[b];
        uint32_t scale2 = gemm_nvfp4_scale_pair(((const uint8_t *)a.scales)[b]);
        uint32_t lo[4], hi[4];
        gemm_decode_nvfp4x8(codes.x, scale2, lo);
        gemm_decode_nvfp4x8(codes.y, scale2, hi);
        uint4 *out = (uint4 *)a.out + 2 * b;
        out[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        out[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    }
}
