// gemm_sm90a: the ABI of the sm_90a GEMM tier (ptx/gemm_sm90a.cu): its args struct, kernel list
// and tile shape. The GEMMs are those of gemm.h, with the same arithmetic; only the machinery
// differs (TMA loads, wgmma, warp specialization, a persistent grid).
//
// Owns nothing. Programs never hold these kernels: a program's GEMM op is a portable kernel with
// its gemm_args, and runtime/backend/gemm_tier.c launches the sm90a kernel of the same format in
// its place when the device is an sm_90 GPU and the GEMM fits this tier (gemm_tier.h says which).
// The launch builds gemm_sm90a_args on the stack: the op's gemm_args first, so the C twin of the
// portable kernel serves these kernel ids too, then the TMA tensor maps of the operands.
//
// Tile: 128 x N of D per CTA, 384 threads as three warpgroups: one producer (one thread issues
// the TMA loads) and two consumers (64 rows of the tile each, all N columns). N is 256 for fast
// accumulation (bf16, per-tensor fp8) and 192 where a 128-wide K block is summed apart before it
// is added (per-tensor fp8 with split accumulation, fp8 block scaling): the block's partial and
// the accumulator then both fit a consumer's registers (96 + 96 of 232). The contraction runs in
// stages of 128 bytes of k per tile row (64 bf16 values or 128 fp8 codes: one 128-wide fp8 K
// block): 4 stages of 256 columns and 5 of 192, beside the epilogue's buffers.
//
// The grid is persistent: CTA i takes tiles i, i + grid, ... in a fixed order, so which CTA
// computes a tile never changes a bit of it.
//
// Grouping. GEMM_GROUP_M: a member's padded rows in whole row tiles, counted on the device.
// GEMM_GROUP_K (wgrad): members x row tiles x column tiles, member-major; a tile of member i
// contracts k in [off[i], off[i] + first_dims[i]) in stages from off[i] (the member counts are
// read on the device), so its stages and 128-wide K blocks start where the twin's do. The last
// stage's k past the member's valid rows is zeroed in shared memory before the multiply: those
// are the next member's rows (the padding to row_align, 16 for BF16 and FP8, ends inside a
// stage) or rows past the last member, which no kernel writes. An empty member's tiles run no
// stage and store D_i = 0 (+ beta C_i) (+ bias_i).
#ifndef QT_GEMM_SM90A_H
#define QT_GEMM_SM90A_H

#include "ptx/gemm.h"  // gemm_args, GEMM_*

#define GEMM_SM90A_THREADS 384u
#define GEMM_SM90A_TILE_M 128u
#define GEMM_SM90A_TILE_N_FAST 256u
#define GEMM_SM90A_TILE_N_SPLIT 192u
#define GEMM_SM90A_K_BYTES 128u  // per stage and tile row: one 128-byte swizzle span
// Row tiles per raster group: consecutive tile indices walk the columns of 16 row tiles, so the
// CTAs running at one time share A and B tiles through L2.
#define GEMM_SM90A_RASTER_M 16u

// Outer-major BF16 operands (stored [k][r]; dgrad's weight, wgrad's both operands) come by TMA
// in boxes of 64 k x 64 r values: 64 lines of 128 bytes, one per k, in the 128-byte swizzle, so
// a stage's A tile is 2 boxes and its B tile N / 64, the same bytes as K-major. wgmma reads them
// MN-major: 1024 bytes between 8-line groups of k, one box between 64-row blocks.
#define GEMM_SM90A_OUTER_BOX_ROWS 64u
#define GEMM_SM90A_OUTER_BOX_K 64u
#define GEMM_SM90A_OUTER_BOX_BYTES (GEMM_SM90A_OUTER_BOX_ROWS * GEMM_SM90A_OUTER_BOX_K * 2u)
#define GEMM_SM90A_OUTER_K_STEP_BYTES (16u * 128u)  // 16 k (one bf16 wgmma k step) of lines

// The epilogue stages D through shared memory: each consumer warpgroup writes its 64 rows in
// chunks of 128 bytes of columns (64 bf16 or 32 fp32) into a buffer of 64 x 128 bytes in the
// 128-byte swizzle, from which one TMA store per chunk writes D while the warpgroup goes on
// (the next chunk into its other buffer, or the next tile's main loop). Two buffers per
// warpgroup for tiles of 256 columns with fast accumulation; one for the split tiles of 192
// columns, which keep a fifth stage instead (on average 2-3% nearer cuBLASLt than 4 stages and
// two buffers, H100), and for the emulated formats.
#define GEMM_SM90A_EPI_ROWS 64u
#define GEMM_SM90A_EPI_BUFFER_BYTES (GEMM_SM90A_EPI_ROWS * 128u)
#define GEMM_SM90A_EMU_EPI_BUFFERS 1u
#define GEMM_SM90A_EPI_BYTES(buffers) (2u * (buffers) * GEMM_SM90A_EPI_BUFFER_BYTES)

// Shared memory of a launch for tiles of n columns: 1024 bytes of slack to align the stages to
// the 1024-byte period of the 128-byte swizzle, the stages (A tile 128 x 128 bytes, B tile n x 128
// bytes), the epilogue buffers, for split tiles one slot of n FP8 block scales of B per stage,
// and a full and an empty barrier per stage. Both sizes stay within the 227 KiB an sm_90 CTA can
// have (225 KiB and 221 KiB).
#define GEMM_SM90A_STAGE_BYTES(n) ((GEMM_SM90A_TILE_M + (n)) * GEMM_SM90A_K_BYTES)
#define GEMM_SM90A_STAGES(n) ((n) == GEMM_SM90A_TILE_N_FAST ? 4u : 5u)
#define GEMM_SM90A_EPI_BUFFERS(n) ((n) == GEMM_SM90A_TILE_N_FAST ? 2u : 1u)
#define GEMM_SM90A_SCALE_SLOT_BYTES(n) ((n) == GEMM_SM90A_TILE_N_SPLIT ? (n) * 4u : 0u)
#define GEMM_SM90A_SMEM_BYTES(n)                                                           \
    (1024u + GEMM_SM90A_STAGES(n) * (GEMM_SM90A_STAGE_BYTES(n) + GEMM_SM90A_SCALE_SLOT_BYTES(n)) + \
     GEMM_SM90A_EPI_BYTES(GEMM_SM90A_EPI_BUFFERS(n)) + 2u * GEMM_SM90A_STAGES(n) * 8u)

// The emulated formats (MXFP8, NVFP4, both operands K-major): tiles of 128 x 256, stages of 64
// k whose codes TMA loads as they are stored (MXFP8 64 bytes per tile row, in the 64-byte
// swizzle; NVFP4 32 bytes, in the 32-byte swizzle): 4 stages of MXFP8 (96 KiB), 6 of NVFP4
// (72 KiB, which leaves room for its scale groups). The consumers decode each into one of two
// BF16 stages (A 128 and B 256 rows of 128 bytes, the 128-byte swizzle wgmma reads).
#define GEMM_SM90A_EMU_TILE_N 256u
#define GEMM_SM90A_EMU_K 64u
#define GEMM_SM90A_EMU_ROW_BYTES(format) ((format) == GEMM_FORMAT_NVFP4 ? 32u : 64u)
#define GEMM_SM90A_EMU_STAGE_BYTES(format) \
    ((GEMM_SM90A_TILE_M + GEMM_SM90A_EMU_TILE_N) * GEMM_SM90A_EMU_ROW_BYTES(format))
#define GEMM_SM90A_EMU_STAGES(format) ((format) == GEMM_FORMAT_NVFP4 ? 6u : 4u)
#define GEMM_SM90A_EMU_DECODED_BYTES \
    (2u * (GEMM_SM90A_TILE_M + GEMM_SM90A_EMU_TILE_N) * GEMM_SM90A_K_BYTES)
// Per stage, the block scales of its 128 + 256 tile rows, one 4-byte word per row (the stage's
// 2 MXFP8 or 4 NVFP4 scale bytes), which warps 1-3 of the producer warpgroup load when the
// scales do not come in groups (below).
#define GEMM_SM90A_EMU_SCALE_SLOT_BYTES ((GEMM_SM90A_TILE_M + GEMM_SM90A_EMU_TILE_N) * 4u)
// Scale groups (args.scale_tma, which gemm_tier.c sets when K is a multiple of 512 and the
// scale rows are whole 16-byte pieces): instead of the loader warps, the producer's TMA brings
// the scales of 8 stages at a time, 16 bytes (MXFP8) or 32 (NVFP4) per tile row (A's 128 rows,
// then B's 256), with the first stage of each group, into one of two group buffers, which take
// the slots' place. The loads then stay off the load/store pipe, which the decode's
// shared-memory traffic fills: through the loader warps, the scales came late (H100: MXFP8 at
// 4096^3 and 8192^3 +20-23% by TMA).
#define GEMM_SM90A_EMU_SCALE_GROUP 8u
#define GEMM_SM90A_EMU_SCALE_ROW_BYTES(format) ((format) == GEMM_FORMAT_NVFP4 ? 32u : 16u)
#define GEMM_SM90A_EMU_SCALE_GROUP_BYTES(format) \
    ((GEMM_SM90A_TILE_M + GEMM_SM90A_EMU_TILE_N) * GEMM_SM90A_EMU_SCALE_ROW_BYTES(format))
#define GEMM_SM90A_EMU_SCALE_REGION_BYTES(format)                                         \
    (GEMM_SM90A_EMU_STAGES(format) * GEMM_SM90A_EMU_SCALE_SLOT_BYTES >                    \
             2u * GEMM_SM90A_EMU_SCALE_GROUP_BYTES(format)                                \
         ? GEMM_SM90A_EMU_STAGES(format) * GEMM_SM90A_EMU_SCALE_SLOT_BYTES                \
         : 2u * GEMM_SM90A_EMU_SCALE_GROUP_BYTES(format))
#define GEMM_SM90A_EMU_SMEM_BYTES(format)                                                      \
    (1024u + GEMM_SM90A_EMU_STAGES(format) * GEMM_SM90A_EMU_STAGE_BYTES(format) +              \
     GEMM_SM90A_EMU_SCALE_REGION_BYTES(format) + GEMM_SM90A_EMU_DECODED_BYTES +               \
     GEMM_SM90A_EPI_BYTES(GEMM_SM90A_EMU_EPI_BUFFERS) + 2u * GEMM_SM90A_EMU_STAGES(format) * 8u)

// Whether a format is emulated on this tier (decoded to BF16 in the consumers).
QT_HD int qt_gemm_sm90a_emulated(uint32_t format) {
    return format == GEMM_FORMAT_MXFP8 || format == GEMM_FORMAT_NVFP4;
}

// The tile width of a GEMM (format and flags of its gemm_args).
QT_HD uint32_t qt_gemm_sm90a_tile_n(uint32_t format, uint32_t flags) {
    int split = format == GEMM_FORMAT_FP8_BLOCK ||
                (format == GEMM_FORMAT_FP8 && (flags & GEMM_FLAG_SPLIT_ACCUMULATE) != 0);
    return split ? GEMM_SM90A_TILE_N_SPLIT : GEMM_SM90A_TILE_N_FAST;
}

#if defined(__cplusplus)
#define GEMM_SM90A_ALIGN64 alignas(64)
#else
#define GEMM_SM90A_ALIGN64 _Alignas(64)
#endif

// A CUtensorMap (cuda.h), opaque: encoded by cuTensorMapEncodeTiled on the host, read by TMA.
typedef struct gemm_tensor_map {
    GEMM_SM90A_ALIGN64 uint64_t opaque[16];
} gemm_tensor_map;
QT_STATIC_ASSERT(sizeof(gemm_tensor_map) == 128, "gemm_tensor_map is a CUtensorMap");

// The tensor maps (innermost dimension first; every one zero-fills what lies out of bounds, which
// is how row, column and k tails read as zeros), for tiles of N columns:
//   a        A codes:  {k, m}              box {stage k, 128}      128-byte swizzle
//   b        B codes:  {k, n, members}     box {stage k, N, 1}     128-byte swizzle
//            or, with b_members_inner (M-grouped B whose members lie side by side inside each
//            stored row, as in the stacked weights' transposed columnwise copy):
//            {k, members, n}, strides {member bytes, row bytes}, box {stage k, 1, N}: the same
//            bytes in shared memory, with strides that grow as cuTensorMapEncodeTiled requires
//   b_scale  FP8 block 1x128 scales of B (dense): {n, k blocks}, box {N, 1}; MXFP8 and NVFP4
//            with scale_tma: B's scale bytes {k / block, n, members}, box {16 or 32, 256, 1}
//   a_scale  MXFP8 and NVFP4 with scale_tma: A's scale bytes {k / block, m}, box {16 or 32,
//            128}
//   d        D (bf16 or fp32): {n, m}, box {128 bytes of columns, 64}, 128-byte swizzle; the
//            epilogue's TMA stores, which clip at the tensor's edges. Where each member has its
//            own D (d_member_bytes, the K-grouped wgrad's): {n, m, members}, box {.., .., 1},
//            each tile stored at its member. Valid when d_tma is 1: D 16-byte aligned with rows
//            (and members' Ds) a multiple of 16 bytes long and apart, no C to add; else the
//            consumers store D from registers.
// (the emulated formats' maps hold code bytes: {k bytes, rows}, box {64 or 32, rows}; an
// outer-major BF16 operand's map is {rows, k} or {rows, k, members}, box {64, 64} or
// {64, 64, 1}, loaded once per 64 tile rows).
typedef struct gemm_sm90a_args {
    gemm_args gemm;           // first: the portable kernel's twin reads it
    uint32_t row_tiles;       // dense, GEMM_GROUP_K (per member): ceil(m / 128); GEMM_GROUP_M:
                              // 0 (counted on the device)
    uint32_t col_tiles;       // ceil(n / N)
    uint32_t k_stages;        // ceil(k / stage k)
    uint32_t d_tma;           // 1: the epilogue stores D through the map d
    uint32_t scale_tma;       // 1: emulated formats' scale groups through a_scale and b_scale
    uint32_t b_members_inner; // 1: map b is {k, members, n} (coordinates k, member, column)
    uint32_t reserved[8];
    gemm_tensor_map a;
    gemm_tensor_map b;
    gemm_tensor_map b_scale;
    gemm_tensor_map d;
    gemm_tensor_map a_scale;
} gemm_sm90a_args;
QT_STATIC_ASSERT(sizeof(gemm_args) == 256, "gemm_sm90a_args pads gemm_args to 320 bytes");
QT_STATIC_ASSERT(sizeof(gemm_sm90a_args) == 320 + 5 * 128, "gemm_sm90a_args layout");

#define QT_KERNELS_GEMM_SM90A(X)                                                      \
    X(KERNEL_GEMM_BF16_SM90A, gemm_sm90a, qt_gemm_bf16_sm90a, gemm_sm90a_args)       \
    X(KERNEL_GEMM_FP8_SM90A, gemm_sm90a, qt_gemm_fp8_sm90a, gemm_sm90a_args)         \
    X(KERNEL_GEMM_FP8_BLOCK_SM90A, gemm_sm90a, qt_gemm_fp8_block_sm90a, gemm_sm90a_args) \
    X(KERNEL_GEMM_MXFP8_SM90A, gemm_sm90a, qt_gemm_mxfp8_sm90a, gemm_sm90a_args)         \
    X(KERNEL_GEMM_NVFP4_SM90A, gemm_sm90a, qt_gemm_nvfp4_sm90a, gemm_sm90a_args)

#endif  // QT_GEMM_SM90A_H
