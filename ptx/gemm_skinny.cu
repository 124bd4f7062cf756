// gemm_skinny: the skinny BF16 GEMMs (gemm.h "Skinny GEMMs"), kernels N and M for dense GEMMs
// with n or m of at most 64, which are memory-bound: each reads its large operand once, in 16-byte
// asynchronous copies, and keeps enough of them in flight to run at the memory's rate, where the
// portable and sm_90a tiles would compute mostly padding.
//
//   N (fprop-like, n <= 64): block = 64 rows of D, all n columns. Stages of 64 k: A's 64 rows
//     and B's 8 frags rows (n padded to 8, 16, 32 or 64), 4 to 6 stages in flight. Warp w
//     multiplies rows 16 w .. 16 w + 15 by every B fragment.
//   M (wgrad-like, m <= 64): block = all m rows x 128 columns of D over one split part of k.
//     Stages of 32 k rows: A's m values and B's 128 of each row (both outer-major, so both
//     fragments come through ldmatrix .trans), 6 stages in flight. Warp w takes columns
//     32 w .. 32 w + 31.
//
// Every element sees the portable tier's sequence of m16n8k16 instructions (gemm.h): k steps of
// 16 from the range's start, 2 per 32 of k, zeros past the end. Shared tiles keep rows of 16-byte
// chunks, swizzled (skinny_offset) so that the 8 rows an ldmatrix phase reads fall in distinct
// banks.
#include "ptx/gemm_mma.h"  // gemm.h; ldmatrix, cp.async, mma.sync, the epilogue
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

#define SKINNY_THREADS GEMM_SKINNY_THREADS

// Byte offset of chunk `chunk` (16 bytes) of row `row` in a tile of kRowBytes rows (a power of
// two of 16 to 256 bytes). The chunk moves to chunk ^ f(row), f chosen so that 8 consecutive rows
// from a multiple of 8, at one chunk, land in 8 distinct 16-byte bank groups of the 128-byte bank
// sweep: rows of 128 bytes or more XOR with row % 8; narrower rows share a sweep (2 rows of 64,
// 4 of 32 bytes) and XOR with the sweep's index among 8 rows.
template <uint32_t kRowBytes>
__device__ __forceinline__ uint32_t skinny_offset(uint32_t row, uint32_t chunk) {
    static_assert(kRowBytes >= 16 && kRowBytes <= 256 && (kRowBytes & (kRowBytes - 1)) == 0,
                  "rows of a power of two of 16 to 256 bytes");
    constexpr uint32_t kChunks = kRowBytes / 16;
    constexpr uint32_t kRowsPerSweep = kChunks >= 8 ? 1u : 8u / kChunks;
    constexpr uint32_t kMask = (kChunks >= 8 ? 8u : kChunks) - 1u;
    return row * kRowBytes + ((chunk ^ ((row / kRowsPerSweep) & kMask)) << 4);
}

// Copies stored rows [row0, row0 + kRows) of a bf16 matrix (ld elements between stored rows),
// elements [col0, col0 + kRowBytes / 2) of each, into a tile; rows at or past row_end and
// elements at or past col_end read as zeros. A K-major operand stores operand rows (elements
// along k), an outer-major one stores k (elements along the operand's rows). Asynchronous where
// the chunk is aligned (gemm_copy_chunk); the caller commits.
template <uint32_t kRows, uint32_t kRowBytes>
__device__ __forceinline__ void skinny_issue(uint8_t *tile, const uint8_t *data, uint64_t ld,
                                             uint32_t row0, uint32_t row_end, uint32_t col0,
                                             uint32_t col_end) {
    constexpr uint32_t kChunks = kRowBytes / 16;
    constexpr uint32_t kTotal = kRows * kChunks;
#pragma unroll
    for (uint32_t i = 0; i < (kTotal + SKINNY_THREADS - 1) / SKINNY_THREADS; i++) {
        uint32_t c = threadIdx.x + i * SKINNY_THREADS;
        if (kTotal % SKINNY_THREADS != 0 && c >= kTotal) break;
        uint32_t r = row0 + c / kChunks, col = col0 + (c % kChunks) * 8u;
        uint32_t n_bytes = 0;
        if (r < row_end && col < col_end) n_bytes = min(col_end - col, 8u) * 2u;
        gemm_copy_chunk(tile + skinny_offset<kRowBytes>(c / kChunks, c % kChunks),
                        data + ((uint64_t)r * ld + col) * 2u, n_bytes);
    }
}

// The block's range of k: the whole contraction, or split part blockIdx.z (gemm.h).
__device__ __forceinline__ void skinny_part_range(const gemm_args &args, uint32_t *begin,
                                                  uint32_t *end) {
    *begin = 0;
    *end = args.k;
    if (qt_gemm_is_split(&args)) qt_gemm_split_range(&args, blockIdx.z, begin, end);
}

// The portable tier's k16 steps over [begin, end): two per 32-wide stage, the last stage's k past
// the end zeros (an extra all-zero step would not be a no-op for a -0 sum).
__device__ __forceinline__ uint32_t skinny_steps(uint32_t begin, uint32_t end) {
    uint32_t len = end > begin ? end - begin : 0u;
    return 2u * ((len + 31u) / 32u);
}

// Element (row, col) of a dense GEMM from its accumulator: split part blockIdx.z's raw sum into
// the workspace ([part][m][n]), or D's value through the epilogue.
__device__ __forceinline__ void skinny_store(const gemm_args &args, float alpha, uint32_t row,
                                             uint32_t col, float acc) {
    if (qt_gemm_is_split(&args)) {
        float *part = reinterpret_cast<float *>(args.workspace) +
                      (uint64_t)blockIdx.z * args.m * args.n;
        part[(uint64_t)row * args.n + col] = acc;
        return;
    }
    uint64_t index = (uint64_t)row * args.ldd + col;
    float v = gemm_epilogue_value(args, reinterpret_cast<const uint8_t *>(args.c),
                                  reinterpret_cast<const uint8_t *>(args.bias), alpha, index,
                                  col, acc);
    gemm_store_value(reinterpret_cast<uint8_t *>(args.d), index, args.d_dtype, v);
}

// The asynchronous pipeline of kinds N and M: kStages stages in flight, one commit group per
// stage (empty groups past the end keep the count). Iteration s waits for its own copies, the
// barrier makes everyone's visible and guarantees that stage s - 1 is no longer read, which is
// the slot the copies of stage s + kStages - 1 go to. Kernel::issue(s, slot) copies stage s,
// Kernel::compute(s, slot) multiplies it.
template <uint32_t kStages, class Kernel>
__device__ __forceinline__ void skinny_pipeline(Kernel &kernel, uint32_t stages) {
    static_assert(kStages >= 2, "at least double buffering");
#pragma unroll
    for (uint32_t i = 0; i < kStages - 1; i++) {
        if (i < stages) kernel.issue(i, i);
        gemm_cp_async_commit();
    }
    for (uint32_t s = 0; s < stages; s++) {
        gemm_cp_async_wait<kStages - 2>();
        __syncthreads();
        uint32_t next = s + kStages - 1;
        if (next < stages) kernel.issue(next, next % kStages);
        gemm_cp_async_commit();
        kernel.compute(s, s % kStages);
    }
    gemm_cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight
}

// ---------------------------------------------------------------------------------------------
// Kind N: D [m][n <= 64] = A [m][k] B [n][k]^T, both K-major.

template <uint32_t kFrags>
struct skinny_n {
    static constexpr uint32_t kRows = GEMM_SKINNY_N_ROWS;
    static constexpr uint32_t kCols = 8 * kFrags;  // B rows in a stage
    static constexpr uint32_t kStageK = GEMM_SKINNY_N_STAGE_K;
    static constexpr uint32_t kStages = GEMM_SKINNY_N_STAGES(kFrags);
    static constexpr uint32_t kTileA = kRows * 128;
    static constexpr uint32_t kStage = (kRows + kCols) * 128;
    static_assert(kStageK * 2 == 128, "a stage is 128 bytes of each row");
    static_assert(kStages * kStage == GEMM_SKINNY_N_SMEM_BYTES(kFrags),
                  "launch shape and kernel agree on shared memory");

    const gemm_args &args;
    uint32_t m0, k_begin, k_end, steps;
    float acc[kFrags][4];

    __device__ __forceinline__ uint8_t *stage(uint32_t slot) const {
        return gemm_dynamic_smem + slot * kStage;
    }

    __device__ __forceinline__ void issue(uint32_t s, uint32_t slot) {
        uint32_t k0 = k_begin + s * kStageK;
        skinny_issue<kRows, 128>(stage(slot), reinterpret_cast<const uint8_t *>(args.a.data),
                                 args.a.ld, m0, args.m, k0, k_end);
        skinny_issue<kCols, 128>(stage(slot) + kTileA,
                                 reinterpret_cast<const uint8_t *>(args.b.data), args.b.ld, 0,
                                 args.n, k0, k_end);
    }

    // ldmatrix lanes: A rows 16 w + lane % 16, chunk 2 j + lane / 16 (a0..a3 of the warp's 16
    // rows); B rows lane % 8 + 8 (lane / 16) of each pair of fragments, chunk 2 j + lane / 8 % 2
    // (b0, b1 of two fragments; one fragment: lanes 16..31 repeat rows 0..7).
    __device__ __forceinline__ void compute(uint32_t s, uint32_t slot) {
        uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        uint32_t a_base = gemm_smem_address(stage(slot));
        uint32_t b_base = a_base + kTileA;
        uint32_t a_row = 16 * warp + (lane & 15), a_half = lane >> 4;
        uint32_t b_row = (lane & 7) + (kFrags > 1 ? 8 * (lane >> 4) : 0u);
        uint32_t b_half = (lane >> 3) & 1;
        uint32_t stage_steps = min(steps - 4 * s, 4u);
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) {
            if (j >= stage_steps) break;
            uint32_t af[4], bf[kFrags][2];
            gemm_ldmatrix_x4(af, a_base + skinny_offset<128>(a_row, 2 * j + a_half));
#pragma unroll
            for (uint32_t p = 0; p < (kFrags + 1) / 2; p++) {
                uint32_t r[4];
                gemm_ldmatrix_x4(r, b_base + skinny_offset<128>(b_row + 16 * p, 2 * j + b_half));
                bf[2 * p][0] = r[0];
                bf[2 * p][1] = r[1];
                if (2 * p + 1 < kFrags) {
                    bf[2 * p + 1][0] = r[2];
                    bf[2 * p + 1][1] = r[3];
                }
            }
#pragma unroll
            for (uint32_t f = 0; f < kFrags; f++) gemm_mma_bf16::run(acc[f], af, bf[f]);
        }
    }

    // Rows gid, gid + 8 of the warp's 16, columns 2 tig, 2 tig + 1 of each fragment.
    __device__ __forceinline__ void epilogue() const {
        uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        uint32_t row0 = m0 + 16 * warp + (lane >> 2), col0 = 2 * (lane & 3);
        float alpha = qt_gemm_alpha(&args, 0);
#pragma unroll
        for (uint32_t f = 0; f < kFrags; f++) {
#pragma unroll
            for (uint32_t i = 0; i < 4; i++) {
                uint32_t row = row0 + 8 * (i >> 1), col = 8 * f + col0 + (i & 1);
                if (row < args.m && col < args.n) skinny_store(args, alpha, row, col, acc[f][i]);
            }
        }
    }
};

template <uint32_t kFrags>
__device__ __forceinline__ void skinny_n_run(const gemm_args &args) {
    skinny_n<kFrags> kernel{args, blockIdx.x * GEMM_SKINNY_N_ROWS, 0, 0, 0, {}};
    skinny_part_range(args, &kernel.k_begin, &kernel.k_end);
    kernel.steps = skinny_steps(kernel.k_begin, kernel.k_end);
    skinny_pipeline<skinny_n<kFrags>::kStages>(kernel, (kernel.steps + 3) / 4);
    kernel.epilogue();
}

// ---------------------------------------------------------------------------------------------
// Kind M: D [m <= 64][n] = A B^T over k, A stored [k][m], B stored [k][n] (both outer-major).

template <uint32_t kFrags>
struct skinny_m {
    static constexpr uint32_t kStageK = GEMM_SKINNY_M_STAGE_K;
    static constexpr uint32_t kStages = GEMM_SKINNY_M_STAGES;
    static constexpr uint32_t kRowA = 32 * kFrags;            // bytes: 16 frags values
    static constexpr uint32_t kRowB = 2 * GEMM_SKINNY_M_COLS;  // bytes: 128 values
    static constexpr uint32_t kTileA = kStageK * kRowA;
    static constexpr uint32_t kStage = kTileA + kStageK * kRowB;
    static_assert(kStageK == 32, "a stage is one of the portable tier's: two k steps");
    static_assert(kStages * kStage == GEMM_SKINNY_M_SMEM_BYTES(kFrags),
                  "launch shape and kernel agree on shared memory");

    const gemm_args &args;
    uint32_t n0, k_begin, k_end;
    float acc[kFrags][4][4];

    __device__ __forceinline__ uint8_t *stage(uint32_t slot) const {
        return gemm_dynamic_smem + slot * kStage;
    }

    __device__ __forceinline__ void issue(uint32_t s, uint32_t slot) {
        uint32_t k0 = k_begin + s * kStageK;
        skinny_issue<kStageK, kRowA>(stage(slot), reinterpret_cast<const uint8_t *>(args.a.data),
                                     args.a.ld, k0, k_end, 0, args.m);
        skinny_issue<kStageK, kRowB>(stage(slot) + kTileA,
                                     reinterpret_cast<const uint8_t *>(args.b.data), args.b.ld,
                                     k0, k_end, n0, args.n);
    }

    // ldmatrix .trans lanes (tiles are [k][r]): A k rows 16 j + lane % 8 + 8 (lane / 16), chunk
    // 2 mf + lane / 8 % 2 (a0..a3 of fragment mf); B k rows 16 j + lane % 8 + 8 (lane / 8 % 2),
    // chunk 4 w + 2 p + lane / 16 (b0, b1 of the warp's fragments 2 p and 2 p + 1).
    __device__ __forceinline__ void compute(uint32_t, uint32_t slot) {
        uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        uint32_t a_base = gemm_smem_address(stage(slot));
        uint32_t b_base = a_base + kTileA;
        uint32_t a_row = (lane & 7) + 8 * (lane >> 4), a_half = (lane >> 3) & 1;
        uint32_t b_row = (lane & 7) + 8 * ((lane >> 3) & 1), b_half = lane >> 4;
#pragma unroll
        for (uint32_t j = 0; j < kStageK / 16; j++) {
            uint32_t af[kFrags][4], bf[4][2];
#pragma unroll
            for (uint32_t mf = 0; mf < kFrags; mf++) {
                uint32_t address = a_base + skinny_offset<kRowA>(16 * j + a_row, 2 * mf + a_half);
                gemm_ldmatrix_x4_trans(af[mf], address);
            }
#pragma unroll
            for (uint32_t p = 0; p < 2; p++) {
                uint32_t r[4];
                gemm_ldmatrix_x4_trans(
                    r, b_base + skinny_offset<kRowB>(16 * j + b_row, 4 * warp + 2 * p + b_half));
                bf[2 * p][0] = r[0];
                bf[2 * p][1] = r[1];
                bf[2 * p + 1][0] = r[2];
                bf[2 * p + 1][1] = r[3];
            }
#pragma unroll
            for (uint32_t mf = 0; mf < kFrags; mf++) {
#pragma unroll
                for (uint32_t f = 0; f < 4; f++) gemm_mma_bf16::run(acc[mf][f], af[mf], bf[f]);
            }
        }
    }

    __device__ __forceinline__ void epilogue() const {
        uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        uint32_t col0 = n0 + 32 * warp + 2 * (lane & 3);
        float alpha = qt_gemm_alpha(&args, 0);
#pragma unroll
        for (uint32_t mf = 0; mf < kFrags; mf++) {
#pragma unroll
            for (uint32_t f = 0; f < 4; f++) {
#pragma unroll
                for (uint32_t i = 0; i < 4; i++) {
                    uint32_t row = 16 * mf + (lane >> 2) + 8 * (i >> 1);
                    uint32_t col = col0 + 8 * f + (i & 1);
                    if (row < args.m && col < args.n) {
                        skinny_store(args, alpha, row, col, acc[mf][f][i]);
                    }
                }
            }
        }
    }
};

template <uint32_t kFrags>
__device__ __forceinline__ void skinny_m_run(const gemm_args &args) {
    skinny_m<kFrags> kernel{args, blockIdx.x * GEMM_SKINNY_M_COLS, 0, 0, {}};
    skinny_part_range(args, &kernel.k_begin, &kernel.k_end);
    uint32_t steps = skinny_steps(kernel.k_begin, kernel.k_end);
    skinny_pipeline<GEMM_SKINNY_M_STAGES>(kernel, steps / 2);
    kernel.epilogue();
}

// ---------------------------------------------------------------------------------------------
// Entry points. GEMM_SKINNY_THREADS threads each; launches (op_gemm):
//   N: grid (ceil(m / 64), 1, split parts or 1), GEMM_SKINNY_N_SMEM_BYTES(frags of n)
//   M: grid (ceil(n / 128), 1, split parts or 1), GEMM_SKINNY_M_SMEM_BYTES(frags of m)

extern "C" __global__ void __launch_bounds__(GEMM_SKINNY_THREADS)
    qt_gemm_bf16_skinny_n(const __grid_constant__ gemm_args args) {
    qt_grid_enter();
    switch (qt_gemm_skinny_n_frags(args.n)) {
    case 1: skinny_n_run<1>(args); break;
    case 2: skinny_n_run<2>(args); break;
    case 4: skinny_n_run<4>(args); break;
    default: skinny_n_run<8>(args); break;
    }
}

extern "C" __global__ void __launch_bounds__(GEMM_SKINNY_THREADS)
    qt_gemm_bf16_skinny_m(const __grid_constant__ gemm_args args) {
    qt_grid_enter();
    switch (qt_gemm_skinny_m_frags(args.m)) {
    case 1: skinny_m_run<1>(args); break;
    case 2: skinny_m_run<2>(args); break;
    default: skinny_m_run<4>(args); break;
    }
}
