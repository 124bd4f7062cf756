// gemm_portable: the portable GEMM tier (mma.sync, sm_89 and newer), one kernel per format, the
// bias gradient, and a table of the emulated formats' decode for tests. ABI, operand layouts and
// the shared arithmetic: gemm.h.
//
// Every GEMM kernel computes one tile of D over the whole contraction, or, split-K (gemm.h), over
// one part of it into an FP32 workspace that qt_gemm_split_reduce sums in part order: a tile's
// value depends on the operands (and the planned split) only, never on the grid. Two tiles
// (gemm_args.tile, which op_gemm picks from the shape), both with 256 threads: 128 x 128 (8 warps
// as 2 x 4, each warp 64 x 32 of the tile; two threads per tile row load the operands) and
// 64 x 64 (8 warps as 4 x 2, each 16 x 32; four threads per row) for GEMMs whose large-tile grid
// would leave most SMs idle.
// There a block's time is the latency of its stages, so the small tile splits each stage's
// loads, decoding and multiplies over as many threads as the large one. Both walk the
// contraction in the same stages and k steps, so every element of D sees the same sequence of
// tensor-core instructions, and gets the same bits, with either tile. The contraction runs in
// pipeline stages:
//
//   format                  stage (k)  shared memory holds      tensor-core instruction
//   bf16                    32         bf16, K-major            m16n8k16 bf16 -> f32
//   mxfp8, nvfp4            32         decoded bf16, K-major    m16n8k16 bf16 -> f32
//   fp8, fp8 block          128        codes, K-major           m16n8k32 e4m3/e5m2 -> f32
//
// Shared tiles are [rows][stage bytes] with rows padded by 16 bytes (80 or 144 apart), so the
// eight 16-byte rows an ldmatrix phase reads (8 consecutive tile rows) fall in 8 distinct bank
// groups. Both operands are K-major in shared memory; outer-major operands are transposed on the
// way in. The fragments of m16n8k16 bf16 and m16n8k32 fp8 have the same byte layout (4 bytes per
// register, rows gid and gid + 8, k bytes 4 tig and 4 tig + 16), so one ldmatrix path serves
// both. An fp8 stage is exactly one 128-wide K block, so block scaling (and per-tensor split
// accumulation) keeps its partial sums in 4 registers per fragment inside the stage instead of a
// second accumulator as large as the first.
//
// Two pipelines feed the shared stages:
//   asynchronous (bf16 with both operands K-major, fp8, fp8 block): cp.async copies straight into
//     shared memory, GEMM_PORTABLE_STAGES(format) stages deep (bf16 4, fp8 2 of 128 k), one
//     barrier per stage; no staging registers, which is what keeps the fp8 kernels unspilled.
//   register-staged (mxfp8, nvfp4, bf16 with an outer-major operand): each thread's global loads
//     run two stages ahead in two register sets. While the warps multiply stage s, the loads of
//     stage s + 2 are in flight; after the multiply each thread decodes (or transposes) stage
//     s + 1, loaded one stage earlier, into the other of two shared stages; one barrier per
//     stage. That stage was last read before the previous barrier, so no store races a read.
//     Loading two stages ahead gives the loads the time of two multiplies, which the small tile's
//     short stages need to cover the latency of L2.
//
// Decoding the emulated formats (each element once per block, into the shared stage):
// ptx/gemm_decode.h, which the sm_90a tier shares.
#include "ptx/gemm_decode.h"  // gemm.h; the emulated formats' decode
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement
#include "ptx/gemm_mma.h"     // ldmatrix, cp.async, mma.sync, guarded loads, the epilogue

#define GEMM_WARP_N 32u    // columns of a warp's tile, either tile
#define GEMM_ROW_BF16 80u  // row stride of the 64-byte stages (bf16, mxfp8, nvfp4)

// One of the two tiles: kRows x kRows of D, GEMM_THREADS threads. The register-staged loaders
// give each thread a piece of kPiece elements of a 32-wide stage row (kPerRow threads per tile
// row; outer-major: lane = k, a warp per kPiece rows); warps are kWarpsM down M and kRows / 32
// across N.
template <uint32_t kRowsOfTile>
struct gemm_cfg {
    static constexpr uint32_t kRows = kRowsOfTile;
    static constexpr uint32_t kThreads = GEMM_THREADS;
    static constexpr uint32_t kWarps = kThreads / 32;
    static constexpr uint32_t kPerRow = kThreads / kRows;  // 2 | 4
    static constexpr uint32_t kPiece = 32 / kPerRow;       // 16 | 8
    static constexpr uint32_t kWarpsN = kRows / GEMM_WARP_N;
    static constexpr uint32_t kWarpsM = kWarps / kWarpsN;
    static constexpr uint32_t kWarpM = kRows / kWarpsM;  // rows of a warp's tile: 64 | 16
    static constexpr uint32_t kFragsM = kWarpM / 16;     // its 16-row fragments: 4 | 1
    static_assert(kWarps * kPiece == kRows && kWarpsM * kWarpsN == kWarps, "thread mapping");
    static_assert(kPiece == 16 || kPiece == 8, "pieces of 16 or 8 elements");
    static __device__ __forceinline__ uint32_t warp_m() { return (threadIdx.x >> 5) / kWarpsN; }
    static __device__ __forceinline__ uint32_t warp_n() { return (threadIdx.x >> 5) % kWarpsN; }
};
using gemm_cfg_large = gemm_cfg<GEMM_TILE_ROWS(GEMM_TILE_LARGE)>;
using gemm_cfg_small = gemm_cfg<GEMM_TILE_ROWS(GEMM_TILE_SMALL)>;
QT_STATIC_ASSERT(gemm_cfg_large::kThreads == GEMM_TILE_THREADS(GEMM_TILE_LARGE) &&
                     gemm_cfg_small::kThreads == GEMM_TILE_THREADS(GEMM_TILE_SMALL) &&
                     gemm_cfg_large::kRows == GEMM_TILE_M && gemm_cfg_large::kRows == GEMM_TILE_N,
                 "launch shapes and kernels agree on the tiles");

// Dynamic shared memory: GEMM_PORTABLE_STAGES(format) stages of {a tile, b tile: kRows rows x
// kRow bytes; float scales[2 kRows]: FP8 block scaling's scale_a of the tile's rows, then scale_b
// of its columns, for the stage's K block}.
template <uint32_t kFormat, class Cfg>
struct gemm_layout {
    static constexpr uint32_t kStageBytes = GEMM_PORTABLE_STAGE_BYTES(kFormat);
    static constexpr uint32_t kStages = GEMM_PORTABLE_STAGES(kFormat);
    static constexpr uint32_t kRow = kStageBytes + 16;
    static constexpr uint32_t kTile = Cfg::kRows * kRow;
    static constexpr uint32_t kStage = 2 * kTile + 2 * Cfg::kRows * 4;
    static constexpr uint32_t kBytes = kStages * kStage;
    static_assert(kStage % 16 == 0, "16-byte aligned stages");
    static_assert(kBytes <= 99u * 1024u, "fits the 99 KiB per block of sm_89 and sm_120");
    static __device__ __forceinline__ uint8_t *a(uint8_t *smem, uint32_t stage) {
        return smem + stage * kStage;
    }
    static __device__ __forceinline__ uint8_t *b(uint8_t *smem, uint32_t stage) {
        return smem + stage * kStage + kTile;
    }
    static __device__ __forceinline__ float *scales(uint8_t *smem, uint32_t stage) {
        return reinterpret_cast<float *>(smem + stage * kStage + 2 * kTile);
    }
};
#define GEMM_LAYOUT_AGREES(format, tile, cfg)                                           \
    static_assert((gemm_layout<format, cfg>::kBytes ==                                  \
                   GEMM_PORTABLE_SMEM_BYTES_TILE(format, tile)),                        \
                  "launch shape and kernel agree on shared memory")
GEMM_LAYOUT_AGREES(GEMM_FORMAT_BF16, GEMM_TILE_LARGE, gemm_cfg_large);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_FP8, GEMM_TILE_LARGE, gemm_cfg_large);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_FP8_BLOCK, GEMM_TILE_LARGE, gemm_cfg_large);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_MXFP8, GEMM_TILE_LARGE, gemm_cfg_large);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_NVFP4, GEMM_TILE_LARGE, gemm_cfg_large);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_BF16, GEMM_TILE_SMALL, gemm_cfg_small);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_FP8, GEMM_TILE_SMALL, gemm_cfg_small);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_FP8_BLOCK, GEMM_TILE_SMALL, gemm_cfg_small);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_MXFP8, GEMM_TILE_SMALL, gemm_cfg_small);
GEMM_LAYOUT_AGREES(GEMM_FORMAT_NVFP4, GEMM_TILE_SMALL, gemm_cfg_small);
#undef GEMM_LAYOUT_AGREES

// One operand as one block reads it.
struct gemm_view {
    const uint8_t *data;   // member-shifted
    const uint8_t *scale;  // member-shifted block scales
    uint64_t ld;           // elements between stored rows
    uint64_t scale_ld;
    uint32_t r0;     // the tile's first operand row
    uint32_t r_end;  // rows at or beyond read as zero
    uint32_t k_end;  // contraction indices at or beyond read as zero
    uint32_t elem, flags;
};

struct gemm_tile {
    gemm_view a, b;
    uint32_t member;
    uint32_t m0, m_end;  // D rows of the tile: [m0, min(m0 + rows, m_end))
    uint32_t m_valid_end;  // rows from here to m_end are padding, written as zero
    uint32_t n0;
    uint32_t k_begin, k_end;
    uint8_t *d;
    const uint8_t *c;
    const uint8_t *bias;
    float alpha;
};

// Staged global data of one operand for one stage (fields unused by a format are dropped).
struct gemm_regs {
    uint4 v[2];  // codes or bf16 values
    uint4 s;     // block scale bytes (mxfp8 outer-major: one per element; K-major: s.x)
    uint32_t n;  // valid elements of this thread's piece (register-staged formats)
};

// ---------------------------------------------------------------------------------------------
// The FP8 tensor-core instructions, D += A x B on one 16 x 8 output fragment (ptx/gemm_mma.h
// holds the BF16 one and the rest of the PTX).

struct gemm_mma_e4m3_e4m3 {
    static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

struct gemm_mma_e5m2_e4m3 {
    static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// ---------------------------------------------------------------------------------------------
// Which tile this block computes.

// GEMM_GROUP_M: row tile `tile` of the launch is local tile `*local` of member `*member`, members'
// tiles counted in member order. Each thread sums the tile counts of a contiguous slice of the
// members, a block-wide scan orders the slices, and the one thread whose slice holds the tile
// walks it. No per-member shared array: any member count works. Called by every thread; returns
// the same answer in all of them (false: no tile left, the block has nothing to do).
template <class Cfg>
__device__ bool gemm_group_m_find(const gemm_args &args, uint32_t tile, uint32_t *member,
                                  uint32_t *local) {
    __shared__ uint32_t warp_totals[Cfg::kWarps];
    __shared__ uint32_t found[2];
    const uint32_t *off = reinterpret_cast<const uint32_t *>(args.group.row_offsets);
    uint32_t count = args.group.count;
    uint32_t per = (count + Cfg::kThreads - 1) / Cfg::kThreads;
    uint32_t first = min(threadIdx.x * per, count);
    uint32_t last = min(first + per, count);
    uint32_t mine = 0;
    for (uint32_t i = first; i < last; i++) {
        mine += qt_gemm_member_row_tiles(off[i + 1] - off[i], Cfg::kRows);
    }
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t inclusive = mine;
#pragma unroll
    for (uint32_t d = 1; d < 32; d <<= 1) {
        uint32_t v = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
        if (lane >= d) inclusive += v;
    }
    if (threadIdx.x == 0) found[0] = UINT32_MAX;
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    uint32_t before = inclusive - mine;
    for (uint32_t w = 0; w < warp; w++) before += warp_totals[w];
    if (tile >= before && tile - before < mine) {
        uint32_t t = tile - before;
        for (uint32_t i = first; i < last; i++) {
            uint32_t tiles = qt_gemm_member_row_tiles(off[i + 1] - off[i], Cfg::kRows);
            if (t < tiles) {
                found[0] = i;
                found[1] = t;
                break;
            }
            t -= tiles;
        }
    }
    __syncthreads();
    *member = found[0];
    *local = found[1];
    return *member != UINT32_MAX;
}

__device__ void gemm_view_init(gemm_view &v, const gemm_operand &op, uint32_t member,
                               uint32_t r0, uint32_t r_end, uint32_t k_end) {
    v.data = reinterpret_cast<const uint8_t *>(op.data) + member * op.data_member_bytes;
    v.scale = reinterpret_cast<const uint8_t *>(op.scale) + member * op.scale_member_bytes;
    v.ld = op.ld;
    v.scale_ld = op.scale_ld;
    v.r0 = r0;
    v.r_end = r_end;
    v.k_end = k_end;
    v.elem = op.elem;
    v.flags = op.flags;
}

// Returns false (in every thread alike) when the block has no tile.
template <class Cfg>
__device__ bool gemm_tile_setup(const gemm_args &args, gemm_tile &t) {
    uint32_t member = 0;
    const uint32_t *off = reinterpret_cast<const uint32_t *>(args.group.row_offsets);
    const uint32_t *first_dims = reinterpret_cast<const uint32_t *>(args.group.first_dims);
    t.k_begin = 0;
    t.k_end = args.k;
    t.m_end = args.m;
    t.m_valid_end = args.m;
    t.m0 = blockIdx.y * Cfg::kRows;
    if (args.grouping == GEMM_GROUP_M) {
        uint32_t local = 0;
        if (!gemm_group_m_find<Cfg>(args, blockIdx.y, &member, &local)) return false;
        uint32_t start = off[member];
        t.m0 = start + local * Cfg::kRows;
        t.m_end = min(off[member + 1], args.m);
        t.m_valid_end = min(start + first_dims[member], t.m_end);
    } else if (args.grouping == GEMM_GROUP_K) {
        member = blockIdx.z;
        t.k_begin = off[member];
        t.k_end = off[member] + first_dims[member];
    } else if (qt_gemm_is_split(&args)) {
        qt_gemm_split_range(&args, blockIdx.z, &t.k_begin, &t.k_end);  // block z: part z
    }
    t.n0 = blockIdx.x * Cfg::kRows;
    if (t.m0 >= t.m_end || t.n0 >= args.n) return false;
    t.member = member;
    gemm_view_init(t.a, args.a, member, t.m0, t.m_end, t.k_end);
    gemm_view_init(t.b, args.b, member, t.n0, args.n, t.k_end);
    t.d = reinterpret_cast<uint8_t *>(args.d) + member * args.d_member_bytes;
    t.c = reinterpret_cast<const uint8_t *>(args.c) + member * args.d_member_bytes;
    t.bias = reinterpret_cast<const uint8_t *>(args.bias) + member * args.bias_member_bytes;
    t.alpha = qt_gemm_alpha(&args, member);
    return true;
}

// ---------------------------------------------------------------------------------------------
// Decoding the emulated formats (see the top of the file): a piece of kPiece (16 or 8) elements
// (of one operand row for K-major data, of one k for outer-major data) becomes kPiece / 2 BF16
// pairs, element 2 i in the low half of word i. Elements at or past the piece's valid count n
// read as +0 whatever their code and scale.

template <uint32_t kPiece>
__device__ __forceinline__ void gemm_mask_tail(uint32_t (&w)[8], uint32_t n) {
    if (n >= kPiece) return;
#pragma unroll
    for (uint32_t j = 0; j < kPiece / 2; j++) {
        w[j] &= (2 * j < n ? 0x0000FFFFu : 0u) | (2 * j + 1 < n ? 0xFFFF0000u : 0u);
    }
}

// A K-major MXFP8 piece: g.v[0] codes, g.s.x the block's e8m0 scale.
template <uint32_t kPiece>
__device__ __forceinline__ void gemm_decode_mxfp8_rowwise(const gemm_regs &g, uint32_t elem,
                                                          uint32_t (&w)[8]) {
    float scale = qt_e8m0_to_f32((uint8_t)g.s.x);
    bool exact = g.s.x >= GEMM_MXFP8_EXACT_SCALE_MIN;  // 255 too: every product is NaN
    if (elem == GEMM_ELEM_E5M2) {
        if (exact) {
            gemm_decode_mxfp8_row<kPiece, true, true>(g.v[0], scale, w);
        } else {
            gemm_decode_mxfp8_row<kPiece, true, false>(g.v[0], scale, w);
        }
    } else {
        if (exact) {
            gemm_decode_mxfp8_row<kPiece, false, true>(g.v[0], scale, w);
        } else {
            gemm_decode_mxfp8_row<kPiece, false, false>(g.v[0], scale, w);
        }
    }
    gemm_mask_tail<kPiece>(w, g.n);
}

// An outer-major MXFP8 piece: g.v[0] codes of kPiece consecutive rows, g.s their scales.
template <uint32_t kPiece>
__device__ __forceinline__ void gemm_decode_mxfp8_outer(const gemm_regs &g, uint32_t elem,
                                                        uint32_t (&w)[8]) {
    bool exact = gemm_scales_exact<kPiece>(g.s);
    if (elem == GEMM_ELEM_E5M2) {
        if (exact) {
            gemm_decode_mxfp8_col<kPiece, true, true>(g.v[0], g.s, w);
        } else {
            gemm_decode_mxfp8_col<kPiece, true, false>(g.v[0], g.s, w);
        }
    } else {
        if (exact) {
            gemm_decode_mxfp8_col<kPiece, false, true>(g.v[0], g.s, w);
        } else {
            gemm_decode_mxfp8_col<kPiece, false, false>(g.v[0], g.s, w);
        }
    }
    gemm_mask_tail<kPiece>(w, g.n);
}

// An NVFP4 piece: kPiece nibbles in g.v[0] (x, then y), g.s.x the block's e4m3 scale.
template <uint32_t kPiece>
__device__ __forceinline__ void gemm_decode_nvfp4(const gemm_regs &g, uint32_t (&w)[8]) {
    uint32_t scale2 = gemm_nvfp4_scale_pair((uint8_t)g.s.x);
#pragma unroll
    for (int q = 0; q < (int)kPiece / 8; q++) {
        uint32_t v[4];
        gemm_decode_nvfp4x8(q == 0 ? g.v[0].x : g.v[0].y, scale2, v);
#pragma unroll
        for (int i = 0; i < 4; i++) w[4 * q + i] = v[i];
    }
    gemm_mask_tail<kPiece>(w, g.n);
}

template <uint32_t kFormat, uint32_t kPiece>
__device__ __forceinline__ void gemm_decode_piece(const gemm_regs &g, uint32_t elem,
                                                  uint32_t (&w)[8]) {
    if constexpr (kFormat == GEMM_FORMAT_NVFP4) {
        gemm_decode_nvfp4<kPiece>(g, w);
    } else {
        static_assert(kFormat == GEMM_FORMAT_MXFP8, "decoded formats");
        gemm_decode_mxfp8_rowwise<kPiece>(g, elem, w);
    }
}

// ---------------------------------------------------------------------------------------------
// Loaders: global -> registers (load) and registers -> shared stage (store).

// 16-byte chunks of a K-major stage that each thread moves: the tile's rows x kStageBytes / 16
// chunks over the block's threads (bf16: 2 | 1, fp8: 4 | 2).
template <uint32_t kStageBytes, class Cfg>
struct gemm_chunks {
    static constexpr uint32_t kPerRow = kStageBytes / 16;
    static constexpr uint32_t kPerThread = Cfg::kRows * kPerRow / Cfg::kThreads;
    static_assert(kPerThread * Cfg::kThreads == Cfg::kRows * kPerRow, "whole chunks per thread");
};

// K-major codes or bf16 (ES bytes per element), kStageBytes bytes of k per row: thread t takes
// the 16-byte chunks c = t + threads i of the tile (row c / chunks per row, column the rest).
template <uint32_t kStageBytes, int ES, class Cfg>
__device__ __forceinline__ void gemm_load_direct(const gemm_view &v, uint32_t k0,
                                                 gemm_regs &g) {
    using chunks = gemm_chunks<kStageBytes, Cfg>;
    static_assert(chunks::kPerThread <= 2, "two staging vectors");
#pragma unroll
    for (uint32_t i = 0; i < chunks::kPerThread; i++) {
        uint32_t c = threadIdx.x + i * Cfg::kThreads;
        uint32_t r = v.r0 + c / chunks::kPerRow;
        uint32_t k = k0 + (c % chunks::kPerRow) * (16 / ES);
        uint32_t n_bytes = 0;
        if (r < v.r_end && k < v.k_end) n_bytes = min(v.k_end - k, 16u / ES) * ES;
        const uint8_t *p = v.data + ((uint64_t)r * v.ld + k) * ES;
        g.v[i] = gemm_load_bytes<16>(p, n_bytes);
    }
}

template <uint32_t kStageBytes, class Cfg>
__device__ __forceinline__ void gemm_store_direct(uint8_t *tile, const gemm_regs &g) {
    using chunks = gemm_chunks<kStageBytes, Cfg>;
#pragma unroll
    for (uint32_t i = 0; i < chunks::kPerThread; i++) {
        uint32_t c = threadIdx.x + i * Cfg::kThreads;
        *reinterpret_cast<uint4 *>(tile + (c / chunks::kPerRow) * (kStageBytes + 16) +
                                   (c % chunks::kPerRow) * 16) = g.v[i];
    }
}

// The asynchronous pipeline's version: the same chunks, copied straight into the stage. A chunk
// outside the operand is zero-filled by a plain shared store; a chunk of a misaligned row (K not
// a multiple of 16 bytes) is read byte by byte and stored synchronously (correct, slow; callers
// pad leading dimensions to 16 bytes).
template <uint32_t kStageBytes, int ES, class Cfg>
__device__ __forceinline__ void gemm_issue_direct(const gemm_view &v, uint32_t k0,
                                                  uint8_t *tile) {
    using chunks = gemm_chunks<kStageBytes, Cfg>;
#pragma unroll
    for (uint32_t i = 0; i < chunks::kPerThread; i++) {
        uint32_t c = threadIdx.x + i * Cfg::kThreads;
        uint32_t r = v.r0 + c / chunks::kPerRow;
        uint32_t k = k0 + (c % chunks::kPerRow) * (16 / ES);
        uint32_t n_bytes = 0;
        if (r < v.r_end && k < v.k_end) n_bytes = min(v.k_end - k, 16u / ES) * ES;
        const uint8_t *p = v.data + ((uint64_t)r * v.ld + k) * ES;
        gemm_copy_chunk(
            tile + (c / chunks::kPerRow) * (kStageBytes + 16) + (c % chunks::kPerRow) * 16, p,
            n_bytes);
    }
}

// Outer-major ([k][r]) bf16 (ES = 2) or mxfp8 codes with their [kb][r] scales (ES = 1): lane l
// takes k = k0 + l, warp w the kPiece rows r0 + kPiece w ...; the stage is 32 k, one mxfp8 scale
// block.
template <int ES, class Cfg>
__device__ __forceinline__ void gemm_load_outer(const gemm_view &v, uint32_t k0, gemm_regs &g) {
    constexpr uint32_t kPiece = Cfg::kPiece;
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t k = k0 + lane;
    uint32_t r = v.r0 + warp * kPiece;
    uint32_t n = 0;
    if (k < v.k_end && r < v.r_end) n = min(v.r_end - r, kPiece);
    const uint8_t *p = v.data + ((uint64_t)k * v.ld + r) * ES;
    if constexpr (ES == 1) {
        g.v[0] = gemm_load_bytes<kPiece>(p, n);
        uint64_t kb = k0 / GEMM_BLOCK_MXFP8;
        g.s = gemm_load_bytes<kPiece>(v.scale + kb * v.scale_ld + r, n);
    } else {
        g.v[0] = gemm_load_bytes<16>(p, min(n, 8u) * 2);
        if constexpr (kPiece == 16) {
            g.v[1] = gemm_load_bytes<16>(p + 16, n > 8 ? (n - 8) * 2 : 0u);
        }
    }
    g.n = n;
}

// Writes the kPiece values down column k (= lane) of rows kPiece w ... of the K-major stage; a
// warp's 32 lanes write 64 consecutive bytes of one row per store, so no bank conflicts.
template <int ES, class Cfg>
__device__ __forceinline__ void gemm_store_outer(uint8_t *tile, const gemm_regs &g,
                                                 uint32_t elem) {
    constexpr uint32_t kPiece = Cfg::kPiece;
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *column = tile + warp * kPiece * GEMM_ROW_BF16 + lane * 2;
    uint32_t w[8];
    if constexpr (ES == 2) {
#pragma unroll
        for (int j = 0; j < (int)kPiece / 2; j++) w[j] = gemm_word(g.v[j >> 2], j & 3);
    } else {
        gemm_decode_mxfp8_outer<kPiece>(g, elem, w);
    }
#pragma unroll
    for (int j = 0; j < (int)kPiece / 2; j++) {
        *reinterpret_cast<uint16_t *>(column + 2 * j * GEMM_ROW_BF16) = (uint16_t)w[j];
        *reinterpret_cast<uint16_t *>(column + (2 * j + 1) * GEMM_ROW_BF16) =
            (uint16_t)(w[j] >> 16);
    }
}

// K-major mxfp8 (kPiece codes, one e8m0 scale) or nvfp4 (kPiece codes in kPiece / 2 bytes, one
// e4m3 scale): thread t takes row t / kPerRow, elements k0 + kPiece (t % kPerRow) ... of the
// 32-wide stage (one mxfp8 block, two nvfp4 blocks: a piece never straddles one).
template <uint32_t kFormat, class Cfg>
__device__ __forceinline__ void gemm_load_piece(const gemm_view &v, uint32_t k0, gemm_regs &g) {
    constexpr uint32_t kPiece = Cfg::kPiece;
    uint32_t r = v.r0 + threadIdx.x / Cfg::kPerRow;
    uint32_t k = k0 + (threadIdx.x % Cfg::kPerRow) * kPiece;
    uint32_t n = 0;
    if (r < v.r_end && k < v.k_end) n = min(v.k_end - k, kPiece);
    uint32_t block = kFormat == GEMM_FORMAT_NVFP4 ? GEMM_BLOCK_NVFP4 : GEMM_BLOCK_MXFP8;
    const uint8_t *s = v.scale + (uint64_t)r * v.scale_ld + k / block;
    if constexpr (kFormat == GEMM_FORMAT_NVFP4) {
        g.v[0] = gemm_load_bytes<kPiece / 2>(v.data + (uint64_t)r * (v.ld / 2) + k / 2,
                                             (n + 1) / 2);
    } else {
        g.v[0] = gemm_load_bytes<kPiece>(v.data + (uint64_t)r * v.ld + k, n);
    }
    g.s.x = n ? (uint32_t)__ldg(s) : 0u;
    g.n = n;
}

template <uint32_t kFormat, class Cfg>
__device__ __forceinline__ void gemm_store_piece(uint8_t *tile, const gemm_regs &g,
                                                 uint32_t elem) {
    constexpr uint32_t kPiece = Cfg::kPiece;
    uint32_t w[8];
    gemm_decode_piece<kFormat, kPiece>(g, elem, w);
    uint8_t *dst = tile + (threadIdx.x / Cfg::kPerRow) * GEMM_ROW_BF16 +
                   (threadIdx.x % Cfg::kPerRow) * 2 * kPiece;
    *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    if constexpr (kPiece == 16) {
        *reinterpret_cast<uint4 *>(dst + 16) = make_uint4(w[4], w[5], w[6], w[7]);
    }
}

template <uint32_t kFormat, class Cfg>
__device__ __forceinline__ void gemm_load(const gemm_view &v, uint32_t k0, gemm_regs &g) {
    constexpr uint32_t kStageBytes = GEMM_PORTABLE_STAGE_BYTES(kFormat);
    if constexpr (kFormat == GEMM_FORMAT_BF16) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_load_outer<2, Cfg>(v, k0, g);
        } else {
            gemm_load_direct<kStageBytes, 2, Cfg>(v, k0, g);
        }
    } else if constexpr (kFormat == GEMM_FORMAT_MXFP8) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_load_outer<1, Cfg>(v, k0, g);
        } else {
            gemm_load_piece<kFormat, Cfg>(v, k0, g);
        }
    } else {
        static_assert(kFormat == GEMM_FORMAT_NVFP4, "fp8 kinds use the asynchronous pipeline");
        gemm_load_piece<kFormat, Cfg>(v, k0, g);
    }
}

template <uint32_t kFormat, class Cfg>
__device__ __forceinline__ void gemm_store(uint8_t *tile, const gemm_view &v,
                                           const gemm_regs &g) {
    constexpr uint32_t kStageBytes = GEMM_PORTABLE_STAGE_BYTES(kFormat);
    if constexpr (kFormat == GEMM_FORMAT_BF16) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_store_outer<2, Cfg>(tile, g, v.elem);
        } else {
            gemm_store_direct<kStageBytes, Cfg>(tile, g);
        }
    } else if constexpr (kFormat == GEMM_FORMAT_MXFP8) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_store_outer<1, Cfg>(tile, g, v.elem);
        } else {
            gemm_store_piece<kFormat, Cfg>(tile, g, v.elem);
        }
    } else {
        static_assert(kFormat == GEMM_FORMAT_NVFP4, "fp8 kinds use the asynchronous pipeline");
        gemm_store_piece<kFormat, Cfg>(tile, g, v.elem);
    }
}

// FP8 block scaling: thread t < rows copies scale_a of tile row t, thread rows + j scale_b of
// tile column j, for the 128-wide K block starting at k0, into the stage's scale slots (threads
// past 2 rows have none). Rows outside the operand get 0 (their results are never written).
template <class Cfg>
__device__ __forceinline__ void gemm_issue_block_scale(const gemm_tile &t, uint32_t k0,
                                                       float *scales) {
    if (threadIdx.x >= 2 * Cfg::kRows) return;
    uint64_t kb = k0 / GEMM_BLOCK_FP8;
    uint32_t i = threadIdx.x % Cfg::kRows;
    bool is_a = threadIdx.x < Cfg::kRows;
    const float *s = reinterpret_cast<const float *>(is_a ? t.a.scale : t.b.scale);
    uint32_t r = (is_a ? t.a.r0 : t.b.r0) + i;
    uint32_t r_end = is_a ? t.a.r_end : t.b.r_end;
    if (r >= r_end) {
        scales[threadIdx.x] = 0.0f;
        return;
    }
    uint32_t flags = is_a ? t.a.flags : t.b.flags;
    uint64_t scale_ld = is_a ? t.a.scale_ld : t.b.scale_ld;
    gemm_cp_async4(scales + threadIdx.x,
                   s + qt_gemm_scale_index(GEMM_FORMAT_FP8_BLOCK, flags, r, kb, scale_ld));
}

// ---------------------------------------------------------------------------------------------
// Multiplying one stage. Fragment addresses for ldmatrix x4, per lane:
//   A: matrices (rows 0-7, bytes 0-15), (rows 8-15, 0-15), (0-7, 16-31), (8-15, 16-31) = a0..a3
//      of a 16-row fragment: row = lane % 16, byte = 16 (lane / 16).
//   B: matrices (cols 0-7, bytes 0-15), (0-7, 16-31), (8-15, 0-15), (8-15, 16-31) = b0, b1 of two
//      adjacent 8-column fragments: col = lane % 8 + 8 (lane / 16), byte = 16 ((lane / 8) % 2).

template <uint32_t kRow, class Cfg>
__device__ __forceinline__ uint32_t gemm_a_base(const uint8_t *a_tile) {
    uint32_t lane = threadIdx.x & 31;
    return gemm_smem_address(a_tile) + (Cfg::warp_m() * Cfg::kWarpM + (lane & 15)) * kRow +
           (lane >> 4) * 16;
}

template <uint32_t kRow, class Cfg>
__device__ __forceinline__ uint32_t gemm_b_base(const uint8_t *b_tile) {
    uint32_t lane = threadIdx.x & 31;
    return gemm_smem_address(b_tile) +
           (Cfg::warp_n() * GEMM_WARP_N + (lane & 7) + ((lane >> 4) << 3)) * kRow +
           ((lane >> 3) & 1) * 16;
}

// The 4 B fragments (8 columns each) of the warp for one 32-byte k step.
template <uint32_t kRow>
__device__ __forceinline__ void gemm_load_b(uint32_t (&bf)[4][2], uint32_t b_base, uint32_t ks) {
#pragma unroll
    for (uint32_t nj = 0; nj < 2; nj++) {
        uint32_t r[4];
        gemm_ldmatrix_x4(r, b_base + nj * 16 * kRow + ks * 32);
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
    }
}

// Chained accumulation: every 32-byte k step of the stage adds into acc directly.
template <class Mma, uint32_t kStageBytes, class Cfg>
__device__ __forceinline__ void gemm_compute_stage(const uint8_t *a_tile, const uint8_t *b_tile,
                                                   float (&acc)[Cfg::kFragsM][4][4]) {
    constexpr uint32_t kRow = kStageBytes + 16;
    uint32_t a_base = gemm_a_base<kRow, Cfg>(a_tile);
    uint32_t b_base = gemm_b_base<kRow, Cfg>(b_tile);
    // Unrolling all four k steps of an fp8 stage would hoist 96 registers of fragments.
#pragma unroll(kStageBytes == 64 ? 2 : 1)
    for (uint32_t ks = 0; ks < kStageBytes / 32; ks++) {
        uint32_t af[Cfg::kFragsM][4], bf[4][2];
#pragma unroll
        for (uint32_t mi = 0; mi < Cfg::kFragsM; mi++) {
            gemm_ldmatrix_x4(af[mi], a_base + mi * 16 * kRow + ks * 32);
        }
        gemm_load_b<kRow>(bf, b_base, ks);
#pragma unroll
        for (uint32_t mi = 0; mi < Cfg::kFragsM; mi++) {
#pragma unroll
            for (uint32_t ni = 0; ni < 4; ni++) Mma::run(acc[mi][ni], af[mi], bf[ni]);
        }
    }
}

// One 128-byte fp8 stage = one 128-wide K block: each fragment's partial sum over the block
// starts from zero, then is promoted into acc, with the block's scales (kBlock, from this stage's
// scale slots) or as a plain FP32 addition (per-tensor split accumulation). The warp tile is done
// 32 rows (or its 16) at a time so that the partial sums take 32 registers, not 64 (the B
// fragments are loaded once per 32 rows).
template <class Mma, bool kBlock, class Cfg>
__device__ __forceinline__ void gemm_compute_stage_split(const uint8_t *a_tile,
                                                         const uint8_t *b_tile,
                                                         const float *scales,
                                                         float (&acc)[Cfg::kFragsM][4][4]) {
    constexpr uint32_t kRow = 128 + 16;
    uint32_t lane = threadIdx.x & 31;
    uint32_t row0 = Cfg::warp_m() * Cfg::kWarpM + (lane >> 2);
    uint32_t col0 = Cfg::warp_n() * GEMM_WARP_N + (lane & 3) * 2;
    uint32_t a_base = gemm_a_base<kRow, Cfg>(a_tile);
    uint32_t b_base = gemm_b_base<kRow, Cfg>(b_tile);
    constexpr uint32_t kGroup = Cfg::kFragsM < 2 ? Cfg::kFragsM : 2;  // fragments at a time
#pragma unroll
    for (uint32_t half = 0; half < Cfg::kFragsM / kGroup; half++) {
        float part[kGroup][4][4];
#pragma unroll
        for (uint32_t i = 0; i < kGroup * 16; i++) part[i / 16][(i / 4) % 4][i % 4] = 0.0f;
#pragma unroll 1
        for (uint32_t ks = 0; ks < 4; ks++) {
            uint32_t af[kGroup][4], bf[4][2];
#pragma unroll
            for (uint32_t i = 0; i < kGroup; i++) {
                gemm_ldmatrix_x4(af[i], a_base + (half * kGroup + i) * 16 * kRow + ks * 32);
            }
            gemm_load_b<kRow>(bf, b_base, ks);
#pragma unroll
            for (uint32_t i = 0; i < kGroup; i++) {
#pragma unroll
                for (uint32_t ni = 0; ni < 4; ni++) Mma::run(part[i][ni], af[i], bf[ni]);
            }
        }
#pragma unroll
        for (uint32_t i = 0; i < kGroup; i++) {
            uint32_t mi = half * kGroup + i;
            float sa0 = kBlock ? scales[row0 + mi * 16] : 1.0f;
            float sa1 = kBlock ? scales[row0 + mi * 16 + 8] : 1.0f;
#pragma unroll
            for (uint32_t ni = 0; ni < 4; ni++) {
#pragma unroll
                for (uint32_t e = 0; e < 4; e++) {
                    if constexpr (kBlock) {
                        float sb = scales[Cfg::kRows + col0 + ni * 8 + (e & 1)];
                        acc[mi][ni][e] = qt_gemm_promote(acc[mi][ni][e], part[i][ni][e],
                                                         e < 2 ? sa0 : sa1, sb);
                    } else {
                        acc[mi][ni][e] = qt_gemm_split_add(acc[mi][ni][e], part[i][ni][e]);
                    }
                }
            }
        }
    }
}

// Asynchronous pipeline (every operand K-major, no decoding: bf16 fprop, fp8, fp8 block):
// GEMM_PORTABLE_STAGES(format) stages in flight. Stage s of the contraction covers
// k_begin + s kStageK ... (for block scaling k_begin is a multiple of 128, so fp8 stages are the
// format's K blocks).
// Iteration s waits for its own copies of stage s (one commit group per stage, empty groups past
// the end keep the count), then the barrier makes everyone's copies visible and guarantees that
// stage s - 1 is no longer read, which is the slot the copies of stage s + STAGES - 1 go to.
template <uint32_t kFormat, class Mma, bool kSplit, class Cfg>
__device__ __forceinline__ void gemm_mainloop_async(const gemm_tile &t,
                                                    float (&acc)[Cfg::kFragsM][4][4]) {
    using layout = gemm_layout<kFormat, Cfg>;
    constexpr uint32_t kStageBytes = layout::kStageBytes;
    constexpr uint32_t kStageK = kFormat == GEMM_FORMAT_BF16 ? kStageBytes / 2 : kStageBytes;
    constexpr int kES = kFormat == GEMM_FORMAT_BF16 ? 2 : 1;
    constexpr uint32_t kStages = layout::kStages;
    constexpr bool kBlock = kFormat == GEMM_FORMAT_FP8_BLOCK;
    static_assert(kStages >= 2, "at least double buffering");
    static_assert(!kSplit || kStageK == GEMM_SPLIT_K, "an fp8 stage is one 128-wide K block");
    static_assert(!kBlock || (kSplit && kStageK == GEMM_BLOCK_FP8), "block scaling splits");
    uint8_t *smem = gemm_dynamic_smem;
    uint32_t k_len = t.k_end > t.k_begin ? t.k_end - t.k_begin : 0u;
    uint32_t stages = (k_len + kStageK - 1) / kStageK;
#pragma unroll
    for (uint32_t i = 0; i < kStages - 1; i++) {
        if (i < stages) {
            uint32_t k0 = t.k_begin + i * kStageK;
            gemm_issue_direct<kStageBytes, kES, Cfg>(t.a, k0, layout::a(smem, i));
            gemm_issue_direct<kStageBytes, kES, Cfg>(t.b, k0, layout::b(smem, i));
            if constexpr (kBlock) gemm_issue_block_scale<Cfg>(t, k0, layout::scales(smem, i));
        }
        gemm_cp_async_commit();
    }
    for (uint32_t s = 0; s < stages; s++) {
        gemm_cp_async_wait<kStages - 2>();
        __syncthreads();
        uint32_t next = s + kStages - 1;
        if (next < stages) {
            uint32_t slot = next % kStages;
            uint32_t k0 = t.k_begin + next * kStageK;
            gemm_issue_direct<kStageBytes, kES, Cfg>(t.a, k0, layout::a(smem, slot));
            gemm_issue_direct<kStageBytes, kES, Cfg>(t.b, k0, layout::b(smem, slot));
            if constexpr (kBlock) {
                gemm_issue_block_scale<Cfg>(t, k0, layout::scales(smem, slot));
            }
        }
        gemm_cp_async_commit();
        uint32_t cur = s % kStages;
        if constexpr (kSplit) {
            gemm_compute_stage_split<Mma, kBlock, Cfg>(layout::a(smem, cur), layout::b(smem, cur),
                                                       layout::scales(smem, cur), acc);
        } else {
            gemm_compute_stage<Mma, kStageBytes, Cfg>(layout::a(smem, cur), layout::b(smem, cur),
                                                      acc);
        }
    }
    gemm_cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight
}

// One stage of the register-staged pipeline. On entry shared slot s % 2 holds stage s, the
// registers `next` hold (or are loading) stage s + 1 and `spare` held stage s, already stored.
// The loads of stage s + 2 go to `spare` before the multiply, so they have the time of two
// multiplies; then stage s + 1 is decoded into the other slot, last read before the previous
// barrier.
template <uint32_t kFormat, class Mma, class Cfg>
__device__ __forceinline__ void gemm_staged_step(const gemm_tile &t, uint32_t s, uint32_t stages,
                                                 gemm_regs (&spare)[2], const gemm_regs (&next)[2],
                                                 float (&acc)[Cfg::kFragsM][4][4]) {
    using layout = gemm_layout<kFormat, Cfg>;
    constexpr uint32_t kStageK = layout::kStageBytes / 2;
    uint8_t *smem = gemm_dynamic_smem;
    if (s + 2 < stages) {
        uint32_t k0 = t.k_begin + (s + 2) * kStageK;
        gemm_load<kFormat, Cfg>(t.a, k0, spare[0]);
        gemm_load<kFormat, Cfg>(t.b, k0, spare[1]);
    }
    gemm_compute_stage<Mma, layout::kStageBytes, Cfg>(layout::a(smem, s & 1),
                                                      layout::b(smem, s & 1), acc);
    if (s + 1 < stages) {
        gemm_store<kFormat, Cfg>(layout::a(smem, (s + 1) & 1), t.a, next[0]);
        gemm_store<kFormat, Cfg>(layout::b(smem, (s + 1) & 1), t.b, next[1]);
    }
    __syncthreads();
}

// Register-staged pipeline (an operand is decoded or transposed on its way to shared memory:
// mxfp8, nvfp4, bf16 with an outer-major operand): two shared stages of 32 k, two register sets
// that swap roles every stage (the loop is unrolled by two so that both stay in registers).
template <uint32_t kFormat, class Mma, class Cfg>
__device__ __forceinline__ void gemm_mainloop_staged(const gemm_tile &t,
                                                     float (&acc)[Cfg::kFragsM][4][4]) {
    using layout = gemm_layout<kFormat, Cfg>;
    constexpr uint32_t kStageBytes = layout::kStageBytes;
    constexpr uint32_t kStageK = kStageBytes / 2;
    static_assert(kStageBytes == 64 && layout::kStages >= 2, "two stages of 32 bf16 values");
    uint8_t *smem = gemm_dynamic_smem;
    uint32_t k_len = t.k_end > t.k_begin ? t.k_end - t.k_begin : 0u;
    uint32_t stages = (k_len + kStageK - 1) / kStageK;
    if (stages == 0) return;
    gemm_regs even[2] = {}, odd[2] = {};
    gemm_load<kFormat, Cfg>(t.a, t.k_begin, even[0]);
    gemm_load<kFormat, Cfg>(t.b, t.k_begin, even[1]);
    if (stages > 1) {
        gemm_load<kFormat, Cfg>(t.a, t.k_begin + kStageK, odd[0]);
        gemm_load<kFormat, Cfg>(t.b, t.k_begin + kStageK, odd[1]);
    }
    gemm_store<kFormat, Cfg>(layout::a(smem, 0), t.a, even[0]);
    gemm_store<kFormat, Cfg>(layout::b(smem, 0), t.b, even[1]);
    __syncthreads();
    for (uint32_t s = 0; s < stages; s += 2) {
        gemm_staged_step<kFormat, Mma, Cfg>(t, s, stages, even, odd, acc);
        if (s + 1 == stages) break;
        gemm_staged_step<kFormat, Mma, Cfg>(t, s + 1, stages, odd, even, acc);
    }
}

// ---------------------------------------------------------------------------------------------
// Epilogue: each thread writes its own accumulator elements (rows gid, gid + 8 of each 16-row
// fragment, columns 2 tig, 2 tig + 1 of each 8-column fragment).

template <class Cfg>
__device__ __forceinline__ void gemm_epilogue(const gemm_args &args, const gemm_tile &t,
                                              const float (&acc)[Cfg::kFragsM][4][4]) {
    float d_max = 0.0f;  // the thread's stored values' maximum, for gemm_args.d_max
    uint32_t lane = threadIdx.x & 31;
    uint32_t row0 = t.m0 + Cfg::warp_m() * Cfg::kWarpM + (lane >> 2);
    uint32_t col0 = t.n0 + Cfg::warp_n() * GEMM_WARP_N + (lane & 3) * 2;
    // Split-K (gemm.h): part blockIdx.z's raw sums into workspace[part][m][n], nothing else
    // (dense, so no padding rows).
    bool split = qt_gemm_is_split(&args);
    float *part = reinterpret_cast<float *>(args.workspace) +
                  (uint64_t)blockIdx.z * args.m * args.n;
#pragma unroll
    for (uint32_t mi = 0; mi < Cfg::kFragsM; mi++) {
#pragma unroll
        for (uint32_t h = 0; h < 2; h++) {
            uint32_t row = row0 + mi * 16 + h * 8;
            if (row >= t.m_end) continue;
            bool padding = row >= t.m_valid_end;
#pragma unroll
            for (uint32_t ni = 0; ni < 4; ni++) {
#pragma unroll
                for (uint32_t e = 0; e < 2; e++) {
                    uint32_t col = col0 + ni * 8 + e;
                    if (col >= args.n) continue;
                    if (split) {
                        part[(uint64_t)row * args.n + col] = acc[mi][ni][h * 2 + e];
                        continue;
                    }
                    uint64_t index = (uint64_t)row * args.ldd + col;
                    float v = padding ? 0.0f
                                      : gemm_epilogue_value(args, t.c, t.bias, t.alpha, index,
                                                            col, acc[mi][ni][h * 2 + e]);
                    gemm_store_value(t.d, index, args.d_dtype, v);
                    d_max = qt_gemm_d_max_fold(d_max, v);
                }
            }
        }
    }
    // Every thread of the block gets here (the tile loops above only skip elements).
    if (args.d_max != 0) {
        qt_gemm_d_max_merge(args.d_max, qt_gemm_d_max_bits(d_max, args.d_dtype));
    }
}

template <uint32_t kFormat, class Mma, bool kSplit, bool kAsync, class Cfg>
__device__ __forceinline__ void gemm_run_tile(const gemm_args &args) {
    gemm_tile t;
    if (!gemm_tile_setup<Cfg>(args, t)) return;
    float acc[Cfg::kFragsM][4][4];
#pragma unroll
    for (uint32_t i = 0; i < Cfg::kFragsM * 16; i++) acc[i / 16][(i / 4) % 4][i % 4] = 0.0f;
    if constexpr (kAsync) {
        gemm_mainloop_async<kFormat, Mma, kSplit, Cfg>(t, acc);
    } else {
        gemm_mainloop_staged<kFormat, Mma, Cfg>(t, acc);
    }
    gemm_epilogue<Cfg>(args, t, acc);
}

// The launch's tile (its block has the matching thread count and shared memory). kSmallOnly: the
// small-tile entry points, which the launcher gives only GEMMs of the small tile.
template <uint32_t kFormat, class Mma, bool kSplit, bool kAsync, bool kSmallOnly>
__device__ __forceinline__ void gemm_run(const gemm_args &args) {
    if (kSmallOnly || args.tile == GEMM_TILE_SMALL) {
        gemm_run_tile<kFormat, Mma, kSplit, kAsync, gemm_cfg_small>(args);
    } else {
        gemm_run_tile<kFormat, Mma, kSplit, kAsync, gemm_cfg_large>(args);
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points. Launch for tile T (gemm_args.tile): grid (ceil(n / rows), row tiles, members or
// split parts),
// GEMM_TILE_THREADS(T) threads, dynamic shared memory GEMM_PORTABLE_SMEM_BYTES_TILE(format, T),
// rows = GEMM_TILE_ROWS(T); row tiles = ceil(m / rows) (+ count for GEMM_GROUP_M); members =
// count for GEMM_GROUP_K, split parts for a split GEMM, else 1.
//
// Each format has two: qt_gemm_<format>_portable takes either tile, and
// qt_gemm_<format>_portable_small the small tile alone (the launcher's choice for a small-tile
// GEMM on a GPU, runtime/backend/gemm_tier.c). One function holding both tiles is given the
// large tile's registers (178 to 247 a thread), so a small-tile launch fits one block per
// SM; the small tile alone fits GEMM_SMALL_BLOCKS_PER_SM (gemm.h; _SCALED for FP8 block scaling
// and MXFP8, whose scales need more than 80 registers a thread), and a split GEMM's parts then
// share the SMs instead of queueing behind each other. Both run the same tile code: the same bits.

template <bool kSmallOnly>
__device__ __forceinline__ void gemm_entry_bf16(const gemm_args &args) {
    // Small tiles take the register-staged pipeline even with both operands K-major: it loads
    // two stages ahead, and at training shapes (256 x 1024 x 1024, 64 blocks) it ran about twice
    // as fast as the cp.async pipeline on an H100. Both walk k in the same order: same bits.
    if (((args.a.flags | args.b.flags) & GEMM_OPERAND_OUTER_MAJOR) ||
        kSmallOnly || args.tile == GEMM_TILE_SMALL) {
        gemm_run<GEMM_FORMAT_BF16, gemm_mma_bf16, false, false, kSmallOnly>(args);
    } else {
        gemm_run<GEMM_FORMAT_BF16, gemm_mma_bf16, false, true, kSmallOnly>(args);
    }
}

// B is always E4M3 (weights, activations); A is E4M3 or E5M2 (gradients of HYBRID recipes).
template <bool kSmallOnly>
__device__ __forceinline__ void gemm_entry_fp8(const gemm_args &args) {
    bool split = (args.flags & GEMM_FLAG_SPLIT_ACCUMULATE) != 0;
    if (args.a.elem == GEMM_ELEM_E5M2) {
        if (split) {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e5m2_e4m3, true, true, kSmallOnly>(args);
        } else {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e5m2_e4m3, false, true, kSmallOnly>(args);
        }
    } else {
        if (split) {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e4m3_e4m3, true, true, kSmallOnly>(args);
        } else {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e4m3_e4m3, false, true, kSmallOnly>(args);
        }
    }
}

template <bool kSmallOnly>
__device__ __forceinline__ void gemm_entry_fp8_block(const gemm_args &args) {
    if (args.a.elem == GEMM_ELEM_E5M2) {
        gemm_run<GEMM_FORMAT_FP8_BLOCK, gemm_mma_e5m2_e4m3, true, true, kSmallOnly>(args);
    } else {
        gemm_run<GEMM_FORMAT_FP8_BLOCK, gemm_mma_e4m3_e4m3, true, true, kSmallOnly>(args);
    }
}

template <bool kSmallOnly>
__device__ __forceinline__ void gemm_entry_mxfp8(const gemm_args &args) {
    gemm_run<GEMM_FORMAT_MXFP8, gemm_mma_bf16, false, false, kSmallOnly>(args);
}

template <bool kSmallOnly>
__device__ __forceinline__ void gemm_entry_nvfp4(const gemm_args &args) {
    gemm_run<GEMM_FORMAT_NVFP4, gemm_mma_bf16, false, false, kSmallOnly>(args);
}

#define GEMM_PORTABLE_ENTRIES(format, small_blocks)                                        \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)                          \
        qt_gemm_##format##_portable(const __grid_constant__ gemm_args args) {              \
        qt_grid_enter();                                                                   \
        gemm_entry_##format<false>(args);                                                  \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, small_blocks)               \
        qt_gemm_##format##_portable_small(const __grid_constant__ gemm_args args) {        \
        qt_grid_enter();                                                                   \
        gemm_entry_##format<true>(args);                                                   \
    }

GEMM_PORTABLE_ENTRIES(bf16, GEMM_SMALL_BLOCKS_PER_SM)
GEMM_PORTABLE_ENTRIES(fp8, GEMM_SMALL_BLOCKS_PER_SM)
GEMM_PORTABLE_ENTRIES(fp8_block, GEMM_SMALL_BLOCKS_PER_SM_SCALED)
GEMM_PORTABLE_ENTRIES(mxfp8, GEMM_SMALL_BLOCKS_PER_SM_SCALED)
GEMM_PORTABLE_ENTRIES(nvfp4, GEMM_SMALL_BLOCKS_PER_SM)
#undef GEMM_PORTABLE_ENTRIES

// Split-K reduction (gemm.h): thread i of the grid takes element i of D ([m][n], row-major);
// its parts are summed in index order, then the unsplit kernel's epilogue
// (qt_gemm_split_element). Launch: ceil(m n / GEMM_SPLIT_REDUCE_THREADS) blocks (grid-stride
// beyond 2^31 - 1 of them), GEMM_SPLIT_REDUCE_THREADS threads.
extern "C" __global__ void __launch_bounds__(GEMM_SPLIT_REDUCE_THREADS)
    qt_gemm_split_reduce(const __grid_constant__ gemm_args args) {
    qt_grid_enter();
    const uint64_t elems = (uint64_t)args.m * args.n;
    float alpha = qt_gemm_alpha(&args, 0);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < elems;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t index = i / args.n * args.ldd + i % args.n;
        qt_gemm_store_value(args.d, index, args.d_dtype, qt_gemm_split_element(&args, alpha, i));
    }
}

// Gradient-norm units of D (gemm.h) after a kernel that does not compute them: warp w of block
// b sums unit 8 b + w (of every member's units, K-grouped) in gemm.h's lane order. Launch:
// ceil(units / 8) blocks of GEMM_NORM_UNITS_THREADS threads, the GEMM's own args.
extern "C" __global__ void __launch_bounds__(GEMM_NORM_UNITS_THREADS)
    qt_gemm_norm_units(const __grid_constant__ gemm_args args) {
    qt_grid_enter();
    uint32_t lane = threadIdx.x & 31u;
    uint64_t unit = (uint64_t)blockIdx.x * (GEMM_NORM_UNITS_THREADS / 32u) + threadIdx.x / 32u;
    uint64_t units = qt_gemm_norm_units_of(&args);
    if (unit >= units) return;  // the whole warp
    uint32_t unit_cols = (args.n + GEMM_NORM_UNIT_COLS - 1) / GEMM_NORM_UNIT_COLS;
    uint64_t per_member = qt_gemm_norm_unit_count(args.m, args.n);
    uint64_t member = unit / per_member, own = unit % per_member;
    const float *d = reinterpret_cast<const float *>(args.d + member * args.d_member_bytes);
    uint32_t bad = 0;
    float sum = qt_gemm_norm_unit_lane(d, &args, (uint32_t)(own / unit_cols),
                                       (uint32_t)(own % unit_cols), lane, &bad);
#pragma unroll
    for (uint32_t w = 16; w > 0; w >>= 1) sum = sum + __shfl_down_sync(0xFFFFFFFFu, sum, w);
    bad = __any_sync(0xFFFFFFFFu, bad != 0);
    if (lane != 0) return;
    float *sums = reinterpret_cast<float *>(args.norm_units);
    sums[unit] = sum;
    reinterpret_cast<uint32_t *>(sums + units)[unit] = bad ? 1u : 0u;
}

// ---------------------------------------------------------------------------------------------
// Decode table (gemm.h): block b, thread t decodes one piece of kPiece elements through the GEMM
// kernels' own decode functions. K-major MXFP8: codes kPiece t + j with scale b; outer-major
// MXFP8: codes kPiece t + j with scales (b + j) mod 256, so that pieces mix scales, special ones
// included; NVFP4: nibbles kPiece t + j with scale b.
template <uint32_t kPiece>
__device__ __forceinline__ void gemm_decode_table_piece(const gemm_decode_table_args &args) {
    uint32_t b = blockIdx.x, t = threadIdx.x;
    uint32_t codes_per_scale = GEMM_DECODE_TABLE_CODES(args.path);
    if (t * kPiece >= codes_per_scale) return;
    gemm_regs g = {};
    g.n = kPiece;
    uint32_t words[4] = {0u, 0u, 0u, 0u}, scales[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (uint32_t j = 0; j < kPiece; j++) {
        uint32_t code = kPiece * t + j;
        if (args.path == GEMM_DECODE_NVFP4) {
            words[j / 8] |= (code & 0xFu) << (4 * (j % 8));
        } else {
            words[j / 4] |= code << (8 * (j % 4));
        }
        scales[j / 4] |= ((b + j) & 0xFFu) << (8 * (j % 4));
    }
    g.v[0] = make_uint4(words[0], words[1], words[2], words[3]);
    uint32_t w[8];
    if (args.path == GEMM_DECODE_NVFP4) {
        g.s.x = b;
        gemm_decode_piece<GEMM_FORMAT_NVFP4, kPiece>(g, GEMM_ELEM_E2M1, w);
    } else if (args.path == GEMM_DECODE_MXFP8_OUTER) {
        g.s = make_uint4(scales[0], scales[1], scales[2], scales[3]);
        gemm_decode_mxfp8_outer<kPiece>(g, args.elem, w);
    } else {
        g.s.x = b;
        gemm_decode_piece<GEMM_FORMAT_MXFP8, kPiece>(g, args.elem, w);
    }
    uint16_t *out = reinterpret_cast<uint16_t *>(args.out);
#pragma unroll
    for (uint32_t j = 0; j < kPiece; j++) {
        uint32_t scale = args.path == GEMM_DECODE_MXFP8_OUTER ? (b + j) & 0xFFu : b;
        out[scale * codes_per_scale + kPiece * t + j] = (uint16_t)(w[j / 2] >> (16 * (j % 2)));
    }
}

extern "C" __global__ void __launch_bounds__(GEMM_DECODE_TABLE_THREADS)
    qt_gemm_decode_table(const __grid_constant__ gemm_decode_table_args args) {
    qt_grid_enter();
    if (args.piece == gemm_cfg_small::kPiece) {
        gemm_decode_table_piece<gemm_cfg_small::kPiece>(args);
    } else {
        gemm_decode_table_piece<gemm_cfg_large::kPiece>(args);
    }
}

// ---------------------------------------------------------------------------------------------
// Bias gradient. Grid (ceil(cols / 32), max(count, 1)), 256 threads. Lane l owns column
// 32 blockIdx.x + l; warp w sums chunks w, w + 8, ... of 32 rows (each chunk in row order), and
// after each round of 8 chunks warp 0 adds the round's partials in chunk order: exactly the
// order of qt_gemm_bias_grad_add's comment, whatever the grid.
extern "C" __global__ void __launch_bounds__(GEMM_BGRAD_THREADS)
    qt_gemm_bias_grad(const __grid_constant__ gemm_bias_grad_args args) {
    qt_grid_enter();
    constexpr uint32_t kWarps = GEMM_BGRAD_THREADS / 32;
    __shared__ float partial[kWarps][GEMM_BGRAD_COLS];
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t member = blockIdx.y;
    uint32_t col = blockIdx.x * GEMM_BGRAD_COLS + lane;
    uint32_t r_begin = 0, r_end = args.rows;
    if (args.group.count != 0) {
        r_begin = reinterpret_cast<const uint32_t *>(args.group.row_offsets)[member];
        r_end = r_begin + reinterpret_cast<const uint32_t *>(args.group.first_dims)[member];
    }
    uint32_t chunks = (r_end - r_begin + GEMM_BGRAD_CHUNK_ROWS - 1) / GEMM_BGRAD_CHUNK_ROWS;
    const uint8_t *dy = reinterpret_cast<const uint8_t *>(args.dy);
    float total = 0.0f;
    for (uint32_t first = 0; first < chunks; first += kWarps) {
        uint32_t j = first + warp;
        float p = 0.0f;
        if (j < chunks && col < args.cols) {
            uint32_t r0 = r_begin + j * GEMM_BGRAD_CHUNK_ROWS;
            uint32_t r1 = min(r0 + GEMM_BGRAD_CHUNK_ROWS, r_end);
#pragma unroll 8
            for (uint32_t r = r0; r < r1; r++) {
                p = qt_gemm_bias_grad_add(p, gemm_load_value(dy, (uint64_t)r * args.ld + col,
                                                             args.dtype));
            }
        }
        partial[warp][lane] = p;
        __syncthreads();
        if (warp == 0) {
            for (uint32_t w = 0; w < kWarps && first + w < chunks; w++) {
                total = qt_gemm_bias_grad_add(total, partial[w][lane]);
            }
        }
        __syncthreads();  // the partials are rewritten by the next round
    }
    if (warp == 0 && col < args.cols) {
        reinterpret_cast<float *>(args.out)[(uint64_t)member * args.cols + col] = total;
    }
}
