// gemm_portable: the portable GEMM tier (mma.sync, sm_89 and newer), one kernel per format plus
// the bias gradient. ABI, operand layouts and the shared arithmetic: gemm.h.
//
// Every GEMM kernel computes one 128 x 128 tile of D with 256 threads (8 warps as 2 x 4, each
// warp 64 x 32 of the tile) over the whole contraction: no split-K, so a tile's value depends on
// the operands only, never on the grid. The contraction runs in pipeline stages:
//
//   format                  stage (k)  shared memory holds      tensor-core instruction
//   bf16                    32         bf16, K-major            m16n8k16 bf16 -> f32
//   mxfp8, nvfp4            32         decoded bf16, K-major    m16n8k16 bf16 -> f32
//   fp8, fp8 block          128        codes, K-major           m16n8k32 e4m3/e5m2 -> f32
//
// Shared tiles are [128 rows][stage bytes] with rows padded by 16 bytes (80 or 144 apart), so the
// eight 16-byte rows an ldmatrix phase reads (8 consecutive tile rows) fall in 8 distinct bank
// groups. Both operands are K-major in shared memory; outer-major operands are transposed on the
// way in. The fragments of m16n8k16 bf16 and m16n8k32 fp8 have the same byte layout (4 bytes per
// register, rows gid and gid + 8, k bytes 4 tig and 4 tig + 16), so one ldmatrix path serves
// both. An fp8 stage is exactly one 128-wide K block, so block scaling (and per-tensor split
// accumulation) keeps its partial sums in 4 registers per fragment inside the stage instead of a
// second 64-register accumulator.
//
// Two pipelines feed the shared stages:
//   asynchronous (bf16 with both operands K-major, fp8, fp8 block): cp.async copies straight into
//     shared memory, GEMM_PORTABLE_STAGES(format) stages deep (bf16 4, fp8 2 of 128 k), one
//     barrier per stage; no staging registers, which is what keeps the fp8 kernels unspilled.
//   register-staged (mxfp8, nvfp4, bf16 with an outer-major operand): while the warps multiply
//     stage s, each thread's global loads for stage s + 1 are in flight in registers; after the
//     multiply it decodes (or transposes) them into the other of two stages; one barrier per
//     stage. The other stage was last read before the previous barrier, so no store races a read.
#include <cuda_bf16.h>  // __floats2bfloat162_rn

#include "gemm.h"

#define GEMM_WARP_M 64u
#define GEMM_WARP_N 32u
#define GEMM_ROW_BF16 80u  // row stride of the 64-byte stages (bf16, mxfp8, nvfp4)

QT_STATIC_ASSERT(GEMM_THREADS == 256 && GEMM_TILE_M == 128 && GEMM_TILE_N == 128,
                 "the loaders below map 256 threads onto 128-row tiles");

// Dynamic shared memory: GEMM_PORTABLE_STAGES(format) stages of {a tile, b tile: 128 rows x kRow
// bytes; float scales[256]: FP8 block scaling's scale_a of the tile's 128 rows, then scale_b of
// its 128 columns, for the stage's K block}.
template <uint32_t kFormat>
struct gemm_layout {
    static constexpr uint32_t kStageBytes = GEMM_PORTABLE_STAGE_BYTES(kFormat);
    static constexpr uint32_t kStages = GEMM_PORTABLE_STAGES(kFormat);
    static constexpr uint32_t kRow = kStageBytes + 16;
    static constexpr uint32_t kTile = GEMM_TILE_M * kRow;
    static constexpr uint32_t kStage = 2 * kTile + (GEMM_TILE_M + GEMM_TILE_N) * 4;
    static constexpr uint32_t kBytes = kStages * kStage;
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
QT_STATIC_ASSERT(gemm_layout<GEMM_FORMAT_BF16>::kBytes ==
                     GEMM_PORTABLE_SMEM_BYTES(GEMM_FORMAT_BF16),
                 "launch shape and kernel agree on shared memory");
QT_STATIC_ASSERT(gemm_layout<GEMM_FORMAT_FP8>::kBytes == GEMM_PORTABLE_SMEM_BYTES(GEMM_FORMAT_FP8),
                 "launch shape and kernel agree on shared memory");
QT_STATIC_ASSERT(gemm_layout<GEMM_FORMAT_BF16>::kStage % 16 == 0 &&
                     gemm_layout<GEMM_FORMAT_FP8>::kStage % 16 == 0,
                 "16-byte aligned stages");
QT_STATIC_ASSERT(GEMM_PORTABLE_SMEM_BYTES(GEMM_FORMAT_BF16) <= 99u * 1024u &&
                     GEMM_PORTABLE_SMEM_BYTES(GEMM_FORMAT_FP8) <= 99u * 1024u,
                 "fits the 99 KiB per block of sm_89 and sm_120");

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
    uint32_t m0, m_end;  // D rows of the tile: [m0, min(m0 + 128, m_end))
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
    uint4 s;     // block scale bytes (mxfp8 outer-major: 16; mxfp8 K-major, nvfp4: s.x)
    uint32_t n;  // valid elements of this thread's piece (decoded formats)
};

// ---------------------------------------------------------------------------------------------
// Hardware primitives: the only code that is PTX.

extern __shared__ __align__(16) uint8_t gemm_dynamic_smem[];

__device__ __forceinline__ uint32_t gemm_smem_address(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void gemm_ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

// Asynchronous global -> shared copies (sm_80+). src_bytes < size zero-fills the rest of the
// destination; the source address must be aligned to `size` even then.
__device__ __forceinline__ void gemm_cp_async16(void *dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(gemm_smem_address(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void gemm_cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(gemm_smem_address(dst)),
                 "l"(src)
                 : "memory");
}

__device__ __forceinline__ void gemm_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void gemm_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The tensor-core instructions, D += A x B on one 16 x 8 output fragment.
struct gemm_mma_bf16 {
    static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

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
// Small helpers.

// Word i (0..3, a constant after unrolling) of a vector; keeps vectors in registers.
__device__ __forceinline__ uint32_t gemm_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint32_t gemm_byte(const uint4 &v, int j) {
    return (gemm_word(v, j >> 2) >> (8 * (j & 3))) & 0xFFu;
}

// Two floats to a bf16 pair (RNE; the low half is the first), as qt_f32_to_bf16 rounds every
// non-NaN value.
__device__ __forceinline__ uint32_t gemm_pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t bits;
    memcpy(&bits, &h, sizeof bits);
    return bits;
}

// Loads the first n_valid (0..N) bytes at p into a zeroed N-byte vector (N = 8 or 16). Whole,
// aligned vectors take one load; row edges, the k tail and misaligned rows go byte by byte, in a
// loop kept rolled so that the rare path does not hold 16 registers per chunk in the hot one.
template <int N>
__device__ __forceinline__ uint4 gemm_load_bytes(const uint8_t *p, uint32_t n_valid) {
    if (n_valid >= (uint32_t)N && ((uintptr_t)p & (uintptr_t)(N - 1)) == 0) {
        if constexpr (N == 16) {
            return __ldg(reinterpret_cast<const uint4 *>(p));
        } else {
            uint2 h = __ldg(reinterpret_cast<const uint2 *>(p));
            return make_uint4(h.x, h.y, 0u, 0u);
        }
    }
    uint64_t lo = 0, hi = 0;
    uint32_t n = min(n_valid, (uint32_t)N);
#pragma unroll 1
    for (uint32_t j = 0; j < n; j++) {
        uint64_t byte = __ldg(p + j);
        if (j < 8) {
            lo |= byte << (8 * j);
        } else {
            hi |= byte << (8 * (j - 8));
        }
    }
    return make_uint4((uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32));
}

// ---------------------------------------------------------------------------------------------
// Which tile this block computes.

// GEMM_GROUP_M: row tile `tile` of the launch is local tile `*local` of member `*member`, members'
// tiles counted in member order. Each thread sums the tile counts of a contiguous slice of the
// members, a block-wide scan orders the slices, and the one thread whose slice holds the tile
// walks it. No per-member shared array: any member count works. Called by every thread; returns
// the same answer in all of them (false: no tile left, the block has nothing to do).
__device__ bool gemm_group_m_find(const gemm_args &args, uint32_t tile, uint32_t *member,
                                  uint32_t *local) {
    __shared__ uint32_t warp_totals[GEMM_THREADS / 32];
    __shared__ uint32_t found[2];
    const uint32_t *off = reinterpret_cast<const uint32_t *>(args.group.row_offsets);
    uint32_t count = args.group.count;
    uint32_t per = (count + GEMM_THREADS - 1) / GEMM_THREADS;
    uint32_t first = min(threadIdx.x * per, count);
    uint32_t last = min(first + per, count);
    uint32_t mine = 0;
    for (uint32_t i = first; i < last; i++) mine += qt_gemm_member_tiles(off[i + 1] - off[i]);
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
            uint32_t tiles = qt_gemm_member_tiles(off[i + 1] - off[i]);
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
__device__ bool gemm_tile_setup(const gemm_args &args, gemm_tile &t) {
    uint32_t member = 0;
    const uint32_t *off = reinterpret_cast<const uint32_t *>(args.group.row_offsets);
    const uint32_t *first_dims = reinterpret_cast<const uint32_t *>(args.group.first_dims);
    t.k_begin = 0;
    t.k_end = args.k;
    t.m_end = args.m;
    t.m_valid_end = args.m;
    t.m0 = blockIdx.y * GEMM_TILE_M;
    if (args.grouping == GEMM_GROUP_M) {
        uint32_t local = 0;
        if (!gemm_group_m_find(args, blockIdx.y, &member, &local)) return false;
        uint32_t start = off[member];
        t.m0 = start + local * GEMM_TILE_M;
        t.m_end = min(off[member + 1], args.m);
        t.m_valid_end = min(start + first_dims[member], t.m_end);
    } else if (args.grouping == GEMM_GROUP_K) {
        member = blockIdx.z;
        t.k_begin = off[member];
        t.k_end = off[member] + first_dims[member];
    }
    t.n0 = blockIdx.x * GEMM_TILE_N;
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
// Loaders: global -> registers (load) and registers -> shared stage (store).

// K-major codes or bf16 (ES bytes per element), kStageBytes bytes of k per row: thread t takes
// the 16-byte chunks c = t + 256 i of the tile (row c / kChunksPerRow, column c % kChunksPerRow).
template <uint32_t kStageBytes, int ES>
__device__ __forceinline__ void gemm_load_direct(const gemm_view &v, uint32_t k0,
                                                 gemm_regs &g) {
    constexpr uint32_t kChunksPerRow = kStageBytes / 16;
#pragma unroll
    for (uint32_t i = 0; i < kStageBytes / 32; i++) {
        uint32_t c = threadIdx.x + i * GEMM_THREADS;
        uint32_t r = v.r0 + c / kChunksPerRow;
        uint32_t k = k0 + (c % kChunksPerRow) * (16 / ES);
        uint32_t n_bytes = 0;
        if (r < v.r_end && k < v.k_end) n_bytes = min(v.k_end - k, 16u / ES) * ES;
        const uint8_t *p = v.data + ((uint64_t)r * v.ld + k) * ES;
        g.v[i] = gemm_load_bytes<16>(p, n_bytes);
    }
}

template <uint32_t kStageBytes>
__device__ __forceinline__ void gemm_store_direct(uint8_t *tile, const gemm_regs &g) {
    constexpr uint32_t kChunksPerRow = kStageBytes / 16;
#pragma unroll
    for (uint32_t i = 0; i < kStageBytes / 32; i++) {
        uint32_t c = threadIdx.x + i * GEMM_THREADS;
        *reinterpret_cast<uint4 *>(tile + (c / kChunksPerRow) * (kStageBytes + 16) +
                                   (c % kChunksPerRow) * 16) = g.v[i];
    }
}

// The asynchronous pipeline's version: the same chunks, copied straight into the stage. A chunk
// outside the operand is zero-filled by a plain shared store; a chunk of a misaligned row (K not
// a multiple of 16 bytes) is read byte by byte and stored synchronously (correct, slow; callers
// pad leading dimensions to 16 bytes, NUMERICS 9.1).
template <uint32_t kStageBytes, int ES>
__device__ __forceinline__ void gemm_issue_direct(const gemm_view &v, uint32_t k0,
                                                  uint8_t *tile) {
    constexpr uint32_t kChunksPerRow = kStageBytes / 16;
#pragma unroll
    for (uint32_t i = 0; i < kStageBytes / 32; i++) {
        uint32_t c = threadIdx.x + i * GEMM_THREADS;
        uint32_t r = v.r0 + c / kChunksPerRow;
        uint32_t k = k0 + (c % kChunksPerRow) * (16 / ES);
        uint32_t n_bytes = 0;
        if (r < v.r_end && k < v.k_end) n_bytes = min(v.k_end - k, 16u / ES) * ES;
        const uint8_t *p = v.data + ((uint64_t)r * v.ld + k) * ES;
        uint8_t *dst = tile + (c / kChunksPerRow) * (kStageBytes + 16) + (c % kChunksPerRow) * 16;
        if (n_bytes != 0 && ((uintptr_t)p & 15u) == 0) {
            gemm_cp_async16(dst, p, n_bytes);
        } else {
            *reinterpret_cast<uint4 *>(dst) = gemm_load_bytes<16>(p, n_bytes);
        }
    }
}

// Outer-major ([k][r]) bf16 (ES = 2) or mxfp8 codes with their [kb][r] scales (ES = 1): lane l
// takes k = k0 + l, warp w the 16 rows r0 + 16 w ...; the stage is 32 k, one mxfp8 scale block.
template <int ES>
__device__ __forceinline__ void gemm_load_outer(const gemm_view &v, uint32_t k0, gemm_regs &g) {
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t k = k0 + lane;
    uint32_t r = v.r0 + warp * 16;
    uint32_t n = 0;
    if (k < v.k_end && r < v.r_end) n = min(v.r_end - r, 16u);
    const uint8_t *p = v.data + ((uint64_t)k * v.ld + r) * ES;
    if constexpr (ES == 1) {
        g.v[0] = gemm_load_bytes<16>(p, n);
        uint64_t kb = k0 / GEMM_BLOCK_MXFP8;
        g.s = gemm_load_bytes<16>(v.scale + kb * v.scale_ld + r, n);
    } else {
        g.v[0] = gemm_load_bytes<16>(p, min(n, 8u) * 2);
        g.v[1] = gemm_load_bytes<16>(p + 16, n > 8 ? (n - 8) * 2 : 0u);
    }
    g.n = n;
}

// Writes the 16 values down column k (= lane) of rows 16 w ... of the K-major stage; a warp's
// 32 lanes write 64 consecutive bytes of one row per store, so no bank conflicts.
template <int ES>
__device__ __forceinline__ void gemm_store_outer(uint8_t *tile, const gemm_regs &g,
                                                 uint32_t elem) {
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *column = tile + warp * 16 * GEMM_ROW_BF16 + lane * 2;
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
        uint32_t pair;
        if constexpr (ES == 2) {
            pair = gemm_word(g.v[j >> 3], (j & 7) >> 1);  // zero-filled where invalid
        } else {
            float lo = 0.0f, hi = 0.0f;
            if ((uint32_t)j < g.n) {
                lo = qt_gemm_mxfp8_decode((uint8_t)gemm_byte(g.v[0], j), elem,
                                          (uint8_t)gemm_byte(g.s, j));
            }
            if ((uint32_t)j + 1 < g.n) {
                hi = qt_gemm_mxfp8_decode((uint8_t)gemm_byte(g.v[0], j + 1), elem,
                                          (uint8_t)gemm_byte(g.s, j + 1));
            }
            pair = gemm_pack_bf16(lo, hi);
        }
        *reinterpret_cast<uint16_t *>(column + j * GEMM_ROW_BF16) = (uint16_t)pair;
        *reinterpret_cast<uint16_t *>(column + (j + 1) * GEMM_ROW_BF16) = (uint16_t)(pair >> 16);
    }
}

// K-major mxfp8 (16 codes, one e8m0 scale) or nvfp4 (16 codes in 8 bytes, one e4m3 scale):
// thread t takes row t / 2, elements k0 + 16 (t % 2) ... of the 32-wide stage.
template <uint32_t kFormat>
__device__ __forceinline__ void gemm_load_piece(const gemm_view &v, uint32_t k0, gemm_regs &g) {
    uint32_t r = v.r0 + (threadIdx.x >> 1);
    uint32_t k = k0 + (threadIdx.x & 1) * 16;
    uint32_t n = 0;
    if (r < v.r_end && k < v.k_end) n = min(v.k_end - k, 16u);
    uint32_t block = kFormat == GEMM_FORMAT_NVFP4 ? GEMM_BLOCK_NVFP4 : GEMM_BLOCK_MXFP8;
    const uint8_t *s = v.scale + (uint64_t)r * v.scale_ld + k / block;
    if constexpr (kFormat == GEMM_FORMAT_NVFP4) {
        g.v[0] = gemm_load_bytes<8>(v.data + (uint64_t)r * (v.ld / 2) + k / 2, (n + 1) / 2);
    } else {
        g.v[0] = gemm_load_bytes<16>(v.data + (uint64_t)r * v.ld + k, n);
    }
    g.s.x = n ? (uint32_t)__ldg(s) : 0u;
    g.n = n;
}

template <uint32_t kFormat>
__device__ __forceinline__ float gemm_piece_value(const gemm_regs &g, int j, uint32_t elem) {
    if ((uint32_t)j >= g.n) return 0.0f;  // the k tail reads as zero whatever the block scale
    if constexpr (kFormat == GEMM_FORMAT_NVFP4) {
        uint32_t nibble = (gemm_byte(g.v[0], j >> 1) >> (4 * (j & 1))) & 0xFu;
        return qt_gemm_nvfp4_decode((uint8_t)nibble, (uint8_t)g.s.x);
    } else {
        return qt_gemm_mxfp8_decode((uint8_t)gemm_byte(g.v[0], j), elem, (uint8_t)g.s.x);
    }
}

template <uint32_t kFormat>
__device__ __forceinline__ void gemm_store_piece(uint8_t *tile, const gemm_regs &g,
                                                 uint32_t elem) {
    uint32_t w[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        w[j] = gemm_pack_bf16(gemm_piece_value<kFormat>(g, 2 * j, elem),
                              gemm_piece_value<kFormat>(g, 2 * j + 1, elem));
    }
    uint8_t *dst = tile + (threadIdx.x >> 1) * GEMM_ROW_BF16 + (threadIdx.x & 1) * 32;
    *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    *reinterpret_cast<uint4 *>(dst + 16) = make_uint4(w[4], w[5], w[6], w[7]);
}

template <uint32_t kFormat>
__device__ __forceinline__ void gemm_load(const gemm_view &v, uint32_t k0, gemm_regs &g) {
    constexpr uint32_t kStageBytes = GEMM_PORTABLE_STAGE_BYTES(kFormat);
    if constexpr (kFormat == GEMM_FORMAT_BF16) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_load_outer<2>(v, k0, g);
        } else {
            gemm_load_direct<kStageBytes, 2>(v, k0, g);
        }
    } else if constexpr (kFormat == GEMM_FORMAT_MXFP8) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_load_outer<1>(v, k0, g);
        } else {
            gemm_load_piece<kFormat>(v, k0, g);
        }
    } else {
        static_assert(kFormat == GEMM_FORMAT_NVFP4, "fp8 kinds use the asynchronous pipeline");
        gemm_load_piece<kFormat>(v, k0, g);
    }
}

template <uint32_t kFormat>
__device__ __forceinline__ void gemm_store(uint8_t *tile, const gemm_view &v,
                                           const gemm_regs &g) {
    constexpr uint32_t kStageBytes = GEMM_PORTABLE_STAGE_BYTES(kFormat);
    if constexpr (kFormat == GEMM_FORMAT_BF16) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_store_outer<2>(tile, g, v.elem);
        } else {
            gemm_store_direct<kStageBytes>(tile, g);
        }
    } else if constexpr (kFormat == GEMM_FORMAT_MXFP8) {
        if (v.flags & GEMM_OPERAND_OUTER_MAJOR) {
            gemm_store_outer<1>(tile, g, v.elem);
        } else {
            gemm_store_piece<kFormat>(tile, g, v.elem);
        }
    } else {
        static_assert(kFormat == GEMM_FORMAT_NVFP4, "fp8 kinds use the asynchronous pipeline");
        gemm_store_piece<kFormat>(tile, g, v.elem);
    }
}

// FP8 block scaling: thread t < 128 copies scale_a of tile row t, thread 128 + j scale_b of tile
// column j, for the 128-wide K block starting at k0, into the stage's scale slots. Rows outside
// the operand get 0 (their results are never written).
__device__ __forceinline__ void gemm_issue_block_scale(const gemm_tile &t, uint32_t k0,
                                                       float *scales) {
    uint64_t kb = k0 / GEMM_BLOCK_FP8;
    uint32_t i = threadIdx.x & (GEMM_TILE_M - 1);
    bool is_a = threadIdx.x < GEMM_TILE_M;
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

template <uint32_t kRow>
__device__ __forceinline__ uint32_t gemm_a_base(const uint8_t *a_tile) {
    uint32_t lane = threadIdx.x & 31, wm = threadIdx.x >> 7;
    return gemm_smem_address(a_tile) + (wm * GEMM_WARP_M + (lane & 15)) * kRow + (lane >> 4) * 16;
}

template <uint32_t kRow>
__device__ __forceinline__ uint32_t gemm_b_base(const uint8_t *b_tile) {
    uint32_t lane = threadIdx.x & 31, wn = (threadIdx.x >> 5) & 3;
    return gemm_smem_address(b_tile) +
           (wn * GEMM_WARP_N + (lane & 7) + ((lane >> 4) << 3)) * kRow + ((lane >> 3) & 1) * 16;
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
template <class Mma, uint32_t kStageBytes>
__device__ __forceinline__ void gemm_compute_stage(const uint8_t *a_tile, const uint8_t *b_tile,
                                                   float (&acc)[4][4][4]) {
    constexpr uint32_t kRow = kStageBytes + 16;
    uint32_t a_base = gemm_a_base<kRow>(a_tile);
    uint32_t b_base = gemm_b_base<kRow>(b_tile);
    // Unrolling all four k steps of an fp8 stage would hoist 96 registers of fragments.
#pragma unroll(kStageBytes == 64 ? 2 : 1)
    for (uint32_t ks = 0; ks < kStageBytes / 32; ks++) {
        uint32_t af[4][4], bf[4][2];
#pragma unroll
        for (uint32_t mi = 0; mi < 4; mi++) {
            gemm_ldmatrix_x4(af[mi], a_base + mi * 16 * kRow + ks * 32);
        }
        gemm_load_b<kRow>(bf, b_base, ks);
#pragma unroll
        for (uint32_t mi = 0; mi < 4; mi++) {
#pragma unroll
            for (uint32_t ni = 0; ni < 4; ni++) Mma::run(acc[mi][ni], af[mi], bf[ni]);
        }
    }
}

// One 128-byte fp8 stage = one 128-wide K block: each fragment's partial sum over the block
// starts from zero, then is promoted into acc, with the block's scales (kBlock, from this stage's
// scale slots) or as a plain FP32 addition (per-tensor split accumulation). The warp tile is done
// in two halves of 32 rows so that the partial sums take 32 registers, not 64 (the B fragments
// are loaded once per half).
template <class Mma, bool kBlock>
__device__ __forceinline__ void gemm_compute_stage_split(const uint8_t *a_tile,
                                                         const uint8_t *b_tile,
                                                         const float *scales,
                                                         float (&acc)[4][4][4]) {
    constexpr uint32_t kRow = 128 + 16;
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t row0 = (warp >> 2) * GEMM_WARP_M + (lane >> 2);
    uint32_t col0 = (warp & 3) * GEMM_WARP_N + (lane & 3) * 2;
    uint32_t a_base = gemm_a_base<kRow>(a_tile);
    uint32_t b_base = gemm_b_base<kRow>(b_tile);
#pragma unroll
    for (uint32_t half = 0; half < 2; half++) {
        float part[2][4][4];
#pragma unroll
        for (int i = 0; i < 32; i++) part[i / 16][(i / 4) % 4][i % 4] = 0.0f;
#pragma unroll 1
        for (uint32_t ks = 0; ks < 4; ks++) {
            uint32_t af[2][4], bf[4][2];
#pragma unroll
            for (uint32_t i = 0; i < 2; i++) {
                gemm_ldmatrix_x4(af[i], a_base + (half * 2 + i) * 16 * kRow + ks * 32);
            }
            gemm_load_b<kRow>(bf, b_base, ks);
#pragma unroll
            for (uint32_t i = 0; i < 2; i++) {
#pragma unroll
                for (uint32_t ni = 0; ni < 4; ni++) Mma::run(part[i][ni], af[i], bf[ni]);
            }
        }
#pragma unroll
        for (uint32_t i = 0; i < 2; i++) {
            uint32_t mi = half * 2 + i;
            float sa0 = kBlock ? scales[row0 + mi * 16] : 1.0f;
            float sa1 = kBlock ? scales[row0 + mi * 16 + 8] : 1.0f;
#pragma unroll
            for (uint32_t ni = 0; ni < 4; ni++) {
#pragma unroll
                for (uint32_t e = 0; e < 4; e++) {
                    if constexpr (kBlock) {
                        float sb = scales[GEMM_TILE_M + col0 + ni * 8 + (e & 1)];
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
template <uint32_t kFormat, class Mma, bool kSplit>
__device__ __forceinline__ void gemm_mainloop_async(const gemm_tile &t, float (&acc)[4][4][4]) {
    using layout = gemm_layout<kFormat>;
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
            gemm_issue_direct<kStageBytes, kES>(t.a, k0, layout::a(smem, i));
            gemm_issue_direct<kStageBytes, kES>(t.b, k0, layout::b(smem, i));
            if constexpr (kBlock) gemm_issue_block_scale(t, k0, layout::scales(smem, i));
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
            gemm_issue_direct<kStageBytes, kES>(t.a, k0, layout::a(smem, slot));
            gemm_issue_direct<kStageBytes, kES>(t.b, k0, layout::b(smem, slot));
            if constexpr (kBlock) gemm_issue_block_scale(t, k0, layout::scales(smem, slot));
        }
        gemm_cp_async_commit();
        uint32_t cur = s % kStages;
        if constexpr (kSplit) {
            gemm_compute_stage_split<Mma, kBlock>(layout::a(smem, cur), layout::b(smem, cur),
                                                  layout::scales(smem, cur), acc);
        } else {
            gemm_compute_stage<Mma, kStageBytes>(layout::a(smem, cur), layout::b(smem, cur),
                                                 acc);
        }
    }
    gemm_cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight
}

// Register-staged pipeline (an operand is decoded or transposed on its way to shared memory:
// mxfp8, nvfp4, bf16 with an outer-major operand), two stages of 32 k: the loads of stage s + 1
// are in flight in registers while stage s is multiplied, then decoded and stored into the other
// stage, which nobody reads since the previous barrier.
template <uint32_t kFormat, class Mma>
__device__ __forceinline__ void gemm_mainloop_staged(const gemm_tile &t, float (&acc)[4][4][4]) {
    using layout = gemm_layout<kFormat>;
    constexpr uint32_t kStageBytes = layout::kStageBytes;
    constexpr uint32_t kStageK = kStageBytes / 2;
    static_assert(kStageBytes == 64 && layout::kStages >= 2, "two stages of 32 bf16 values");
    uint8_t *smem = gemm_dynamic_smem;
    uint32_t k_len = t.k_end > t.k_begin ? t.k_end - t.k_begin : 0u;
    uint32_t stages = (k_len + kStageK - 1) / kStageK;
    if (stages == 0) return;
    gemm_regs ra, rb;
    gemm_load<kFormat>(t.a, t.k_begin, ra);
    gemm_load<kFormat>(t.b, t.k_begin, rb);
    gemm_store<kFormat>(layout::a(smem, 0), t.a, ra);
    gemm_store<kFormat>(layout::b(smem, 0), t.b, rb);
    __syncthreads();
    for (uint32_t s = 0; s < stages; s++) {
        uint32_t cur = s & 1;
        bool more = s + 1 < stages;
        if (more) {
            uint32_t k0 = t.k_begin + (s + 1) * kStageK;
            gemm_load<kFormat>(t.a, k0, ra);
            gemm_load<kFormat>(t.b, k0, rb);
        }
        gemm_compute_stage<Mma, kStageBytes>(layout::a(smem, cur), layout::b(smem, cur), acc);
        if (more) {
            gemm_store<kFormat>(layout::a(smem, cur ^ 1), t.a, ra);
            gemm_store<kFormat>(layout::b(smem, cur ^ 1), t.b, rb);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// Epilogue: each thread writes its own accumulator elements (rows gid, gid + 8 of each 16-row
// fragment, columns 2 tig, 2 tig + 1 of each 8-column fragment).

__device__ __forceinline__ float gemm_load_value(const uint8_t *base, uint64_t index,
                                                 uint32_t dtype) {
    if (dtype == QT_DTYPE_BF16) {
        return qt_bf16_to_f32(reinterpret_cast<const uint16_t *>(base)[index]);
    }
    return reinterpret_cast<const float *>(base)[index];
}

__device__ __forceinline__ void gemm_epilogue(const gemm_args &args, const gemm_tile &t,
                                              const float (&acc)[4][4][4]) {
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t row0 = t.m0 + (warp >> 2) * GEMM_WARP_M + (lane >> 2);
    uint32_t col0 = t.n0 + (warp & 3) * GEMM_WARP_N + (lane & 3) * 2;
    int has_c = args.c != 0 && args.beta != 0.0f;
    int has_bias = args.bias != 0;
#pragma unroll
    for (uint32_t mi = 0; mi < 4; mi++) {
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
                    uint64_t index = (uint64_t)row * args.ldd + col;
                    float v = 0.0f;
                    if (!padding) {
                        float c = has_c ? gemm_load_value(t.c, index, args.d_dtype) : 0.0f;
                        float bias = has_bias ? gemm_load_value(t.bias, col, args.bias_dtype)
                                              : 0.0f;
                        v = qt_gemm_epilogue(acc[mi][ni][h * 2 + e], t.alpha, has_c, args.beta,
                                             c, has_bias, bias);
                    }
                    if (args.d_dtype == QT_DTYPE_BF16) {
                        reinterpret_cast<uint16_t *>(t.d)[index] = qt_f32_to_bf16(v);
                    } else {
                        reinterpret_cast<float *>(t.d)[index] = v;
                    }
                }
            }
        }
    }
}

template <uint32_t kFormat, class Mma, bool kSplit, bool kAsync>
__device__ __forceinline__ void gemm_run(const gemm_args &args, const gemm_tile &t) {
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i / 16][(i / 4) % 4][i % 4] = 0.0f;
    if constexpr (kAsync) {
        gemm_mainloop_async<kFormat, Mma, kSplit>(t, acc);
    } else {
        gemm_mainloop_staged<kFormat, Mma>(t, acc);
    }
    gemm_epilogue(args, t, acc);
}

// ---------------------------------------------------------------------------------------------
// Entry points. Launch: grid (ceil(n / 128), row tiles, members), 256 threads, dynamic shared
// memory GEMM_PORTABLE_SMEM_BYTES(format); row tiles = ceil(m / 128) (+ count for
// GEMM_GROUP_M); members = count for GEMM_GROUP_K, else 1.

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qt_gemm_bf16_portable(const __grid_constant__ gemm_args args) {
    gemm_tile t;
    if (!gemm_tile_setup(args, t)) return;
    if ((args.a.flags | args.b.flags) & GEMM_OPERAND_OUTER_MAJOR) {
        gemm_run<GEMM_FORMAT_BF16, gemm_mma_bf16, false, false>(args, t);
    } else {
        gemm_run<GEMM_FORMAT_BF16, gemm_mma_bf16, false, true>(args, t);
    }
}

// B is always E4M3 (weights, activations); A is E4M3 or E5M2 (gradients of HYBRID recipes).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qt_gemm_fp8_portable(const __grid_constant__ gemm_args args) {
    gemm_tile t;
    if (!gemm_tile_setup(args, t)) return;
    bool split = (args.flags & GEMM_FLAG_SPLIT_ACCUMULATE) != 0;
    if (args.a.elem == GEMM_ELEM_E5M2) {
        if (split) {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e5m2_e4m3, true, true>(args, t);
        } else {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e5m2_e4m3, false, true>(args, t);
        }
    } else {
        if (split) {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e4m3_e4m3, true, true>(args, t);
        } else {
            gemm_run<GEMM_FORMAT_FP8, gemm_mma_e4m3_e4m3, false, true>(args, t);
        }
    }
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qt_gemm_fp8_block_portable(const __grid_constant__ gemm_args args) {
    gemm_tile t;
    if (!gemm_tile_setup(args, t)) return;
    if (args.a.elem == GEMM_ELEM_E5M2) {
        gemm_run<GEMM_FORMAT_FP8_BLOCK, gemm_mma_e5m2_e4m3, true, true>(args, t);
    } else {
        gemm_run<GEMM_FORMAT_FP8_BLOCK, gemm_mma_e4m3_e4m3, true, true>(args, t);
    }
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qt_gemm_mxfp8_portable(const __grid_constant__ gemm_args args) {
    gemm_tile t;
    if (!gemm_tile_setup(args, t)) return;
    gemm_run<GEMM_FORMAT_MXFP8, gemm_mma_bf16, false, false>(args, t);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qt_gemm_nvfp4_portable(const __grid_constant__ gemm_args args) {
    gemm_tile t;
    if (!gemm_tile_setup(args, t)) return;
    gemm_run<GEMM_FORMAT_NVFP4, gemm_mma_bf16, false, false>(args, t);
}

// ---------------------------------------------------------------------------------------------
// Bias gradient. Grid (ceil(cols / 32), max(count, 1)), 256 threads. Lane l owns column
// 32 blockIdx.x + l; warp w sums chunks w, w + 8, ... of 32 rows (each chunk in row order), and
// after each round of 8 chunks warp 0 adds the round's partials in chunk order: exactly the
// order of qt_gemm_bias_grad_add's comment, whatever the grid.
extern "C" __global__ void __launch_bounds__(GEMM_BGRAD_THREADS)
    qt_gemm_bias_grad(const __grid_constant__ gemm_bias_grad_args args) {
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
