// gemm: the GEMM family's ABI (args structs, operand descriptors, kernel list) and the per-element
// arithmetic shared by the kernels (ptx/gemm_portable.cu, ptx/gemm_skinny.cu, and the sm_90a tier
// ptx/gemm_sm90a.cu, whose args carry these gemm_args) and their C twins (runtime/ref/ref_gemm.c).
//
// Owns nothing. The quantized layouts are those of ptx/quant.h. The operation, FP32 accumulation:
//
//   D[m][n] = alpha' * sum_k A(m, k) B(n, k)  (+ beta * C[m][n])  (+ bias[n])
//
// Operands. A's rows are D's rows, B's rows are D's columns; k is the contraction index. Each
// operand is one stored copy of a quantized tensor, seen through `gemm_operand`:
//
//   K-major (default)              outer-major (GEMM_OPERAND_OUTER_MAJOR)
//   element (r, k) at [r][k]       element (r, k) at [k][r]
//   row stride `ld` elements       row stride `ld` elements (between consecutive k)
//
//   rowwise copies and the transposed columnwise copies (fp8, fp8 block, nvfp4) are K-major;
//   MXFP8 columnwise data (not transposed) and BF16 used over its rows are outer-major.
//
//   format     elem          block scale (r, kb = k / block), index into `scale`     alpha'
//   bf16       bf16          -                                                     alpha
//   fp8        e4m3 | e5m2   - (tensor_scale = scale_inv)                          alpha sa sb
//   fp8_block  e4m3 | e5m2   f32, 1x128: [kb][r]; B may be 128x128: [r/128][kb]    alpha
//   mxfp8      e4m3 | e5m2   e8m0, 1x32: K-major [r][kb], outer-major [kb][r]      alpha
//   nvfp4      e2m1          e4m3, 1x16: [r][kb] (tensor_scale = amax)             8.3's
//
//   index = row * scale_ld + column of the bracketed 2-D scale matrix.
//
// Exactness. FP8 codes go to FP8 tensor cores as they are; the per-tensor scales fold into alpha
// (qt_gemm_alpha_fp8). FP8 block: the FP32 partial sum of each 128-wide K block is promoted into
// the accumulator with that block's two scales (qt_gemm_promote). MXFP8 and NVFP4 are emulated:
// each element is decoded (code x block scale, exact in FP32, rounded to BF16, which is exact for
// NVFP4 always and for MXFP8 whenever the value is a BF16 normal number) and the BF16 values meet
// on BF16 tensor cores; NVFP4's two global amaxes fold into alpha. Products of the decoded
// values are exact in FP32, so the kernels and the twins differ only in the order (and, on tensor
// cores, the internal precision) of the FP32 accumulation.
//
// Grouping (quant.h: a qt_group_desc, device row_offsets and first_dims):
//   GEMM_GROUP_M (fprop, dgrad): A is the grouped tensor; member i's valid D rows
//     [off[i], off[i] + first_dims[i]) use B member i (b.data + i * b.data_member_bytes, ...);
//     D's padding rows [off[i] + first_dims[i], off[i+1]) are written as zeros; rows at or
//     beyond off[count] are not touched. m = rows capacity.
//   GEMM_GROUP_K (wgrad): D member i (d + i * d_member_bytes) = the contraction over member i's
//     valid rows k in [off[i], off[i] + first_dims[i]) of the columnwise copies; an empty member
//     gets D_i = 0 (+ beta C_i) (+ bias). k = rows capacity. The scale blocks along k start at
//     off[i], so off[i] must be a multiple of the format's block (fp8 block 128, mxfp8 32,
//     nvfp4 16), which the formats' row_align (recipes/format.c) guarantees.
//   Per-tensor factors (fp8 scale_inv, nvfp4 amax) are arrays indexed by member when the
//   operand has GEMM_OPERAND_TENSOR_PER_MEMBER.
#ifndef QT_GEMM_H
#define QT_GEMM_H

#include "ptx/core.h"      // QT_DTYPE_F32, QT_DTYPE_BF16
#include "ptx/qt_codec.h"  // qt_e4m3_to_f32, qt_e5m2_to_f32, qt_e2m1_to_f32, qt_e8m0_to_f32, bf16
#include "ptx/qt_hd.h"
#include "ptx/quant.h"     // qt_group_desc

#define GEMM_FORMAT_BF16 0u
#define GEMM_FORMAT_FP8 1u        // per-tensor scaling (delayed or current)
#define GEMM_FORMAT_FP8_BLOCK 2u  // 1x128 x 128x128 (fprop, dgrad) or 1x128 x 1x128 (wgrad)
#define GEMM_FORMAT_MXFP8 3u
#define GEMM_FORMAT_NVFP4 4u
#define GEMM_FORMAT_COUNT 5u

#define GEMM_ELEM_BF16 0u
#define GEMM_ELEM_E4M3 1u
#define GEMM_ELEM_E5M2 2u
#define GEMM_ELEM_E2M1 3u

#define GEMM_OPERAND_OUTER_MAJOR 1u         // stored [k][r]; bf16 and mxfp8 only
#define GEMM_OPERAND_SCALE_2D 2u            // fp8 block: one scale per 128 x 128 tile
#define GEMM_OPERAND_TENSOR_PER_MEMBER 4u   // tensor_scale[member] instead of tensor_scale[0]

// Per-tensor FP8: accumulate each 128-wide K block separately and add it to the FP32 accumulator
// (TE's "split accumulator", its default for dgrad and wgrad; fprop uses fast accumulation).
// FP8 tensor cores keep fewer accumulator bits than FP32 across chained instructions, so the
// split bounds that loss to 128 products. FP8 block scaling always works this way.
#define GEMM_FLAG_SPLIT_ACCUMULATE 1u
#define GEMM_SPLIT_K 128u

// A BF16 GEMM of NVFP4 operands decoded without their global factors (the raw decode of
// ptx/quant_nvfp4.h: exactly the BF16 values the NVFP4 kernels multiply): alpha' is NVFP4's
// (qt_gemm_alpha_nvfp4), from both operands' tensor_scale (their global amaxes), so D has the
// NVFP4 GEMM's bits.
#define GEMM_FLAG_ALPHA_NVFP4 2u

#define GEMM_DENSE 0u
#define GEMM_GROUP_M 1u
#define GEMM_GROUP_K 2u

// Block lengths along k of the block-scaled formats.
#define GEMM_BLOCK_FP8 128u
#define GEMM_BLOCK_MXFP8 32u
#define GEMM_BLOCK_NVFP4 16u

// The output tiles of the portable tier; launch shapes depend on them. op_gemm picks one per GEMM
// from its shape alone (gemm_args.tile): the large tile, unless its grid would leave most SMs of
// a GPU idle, where the small tile's grid has 4x the blocks. Both have 256 threads (8 warps).
#define GEMM_TILE_LARGE 0u  // 128 x 128, warp tiles of 64 x 32
#define GEMM_TILE_SMALL 1u  // 64 x 64, warp tiles of 16 x 32
#define GEMM_TILE_ROWS(tile) ((tile) == GEMM_TILE_SMALL ? 64u : 128u)
#define GEMM_TILE_THREADS(tile) GEMM_THREADS
#define GEMM_TILE_M 128u  // the large tile
#define GEMM_TILE_N 128u
#define GEMM_THREADS 256u
// Blocks of the small tile that the small-tile entry points (qt_gemm_<format>_portable_small)
// fit on one SM: their register bound (65536 / (256 x 3): 80 a thread, in the allocation's steps
// of 8) and shared memory (at most 3 x 43 KiB) leave room for three. FP8 block scaling and MXFP8
// keep their scales in registers too and would spill at 80: two (128 a thread).
#define GEMM_SMALL_BLOCKS_PER_SM 3
#define GEMM_SMALL_BLOCKS_PER_SM_SCALED 2

// Portable tier: bytes of k per tile row in one pipeline stage (fp8 kinds: 128 codes, one whole
// 128-wide K block; bf16 and the decoded formats: 32 bf16 values), the stages in shared memory
// (bf16: 4 for its asynchronous pipeline; mxfp8 and nvfp4 have only the register-staged one,
// which uses 2), and the dynamic shared memory of a launch: the stages, each both tiles (rows
// padded by 16 bytes) and the FP8 block scales of the tile's rows and columns. NOTE: sm_89 and
// sm_120 give a block at most 99 KiB of shared memory; every size stays below (large tile: fp8
// 74 KiB, bf16 84 KiB, mxfp8 and nvfp4 42 KiB).
#define GEMM_PORTABLE_FP8_KIND(format) \
    ((format) == GEMM_FORMAT_FP8 || (format) == GEMM_FORMAT_FP8_BLOCK)
#define GEMM_PORTABLE_STAGE_BYTES(format) (GEMM_PORTABLE_FP8_KIND(format) ? 128u : 64u)
#define GEMM_PORTABLE_STAGES(format) ((format) == GEMM_FORMAT_BF16 ? 4u : 2u)
#define GEMM_PORTABLE_SMEM_BYTES_TILE(format, tile)                              \
    (GEMM_PORTABLE_STAGES(format) * (2u * GEMM_TILE_ROWS(tile) *                \
                                         (GEMM_PORTABLE_STAGE_BYTES(format) + 16u) + \
                                     2u * GEMM_TILE_ROWS(tile) * 4u))
#define GEMM_PORTABLE_SMEM_BYTES(format) GEMM_PORTABLE_SMEM_BYTES_TILE(format, GEMM_TILE_LARGE)

// Split-K (dense GEMMs whose tiles would leave most SMs idle; op_gemm_split_parts picks the
// parts from the shape). The GEMM op runs with split_parts > 1: block z of the launch computes
// part z, the contraction over k in [z split_k, min(k, (z + 1) split_k)), every tile as the
// unsplit kernel would over that range (its own accumulator, from zero), and writes the raw FP32
// sums (no alpha, C or bias) to workspace[z][m][n]. The reduction op (qt_gemm_split_reduce, the
// same gemm_args) then sums the parts of each element in index order, part 0 + part 1 + ..., one
// FP32 addition each (qt_gemm_parts_add), and applies the epilogue (alpha', beta C, bias, D's
// type) as the unsplit kernel does. No atomics, no order that depends on the grid or on timing:
// the bits depend on the operands and split_k alone. Parts start at multiples of
// GEMM_SPLIT_K_ALIGN = 128, so every part begins on a stage of every format, a per-tensor FP8
// split-accumulator chunk and an FP8 block, MXFP8 and NVFP4 scale block. Where an activation
// reads D, the reduction may take it along: qt_gemm_split_reduce_act_fwd / _bwd (ptx/act.h,
// gemm_act_args) store D exactly as qt_gemm_split_reduce does (qt_gemm_split_element) and apply
// the activation to the stored value in the same launch.
#define GEMM_SPLIT_K_ALIGN 128u
#define GEMM_SPLIT_PARTS_MAX 16u
#define GEMM_SPLIT_REDUCE_THREADS 256u

// Skinny GEMMs (ptx/gemm_skinny.cu): dense BF16 GEMMs with n or m of at most GEMM_SKINNY_MAX,
// which are memory-bound (a classifier head's or an moe router's fprop and wgrad): the portable
// and sm_90a tiles of 64 to 256 columns would compute mostly padding and leave the operands'
// bytes too few loads in flight. op_gemm runs them on kernels of their own, picked from the
// descriptor alone (op_gemm_skinny says when); each reads its large operand once, in 16-byte
// cp.async copies, many stages deep:
//
//   kind  small    layouts                       a block computes
//   N     n <= 64  A, B K-major                  64 rows of D (16 per warp) x all n, over k
//                                                (or one split part) in stages of 64; B's n
//                                                rows ride along with each stage of A
//   M     m <= 64  A, B outer-major              all m x 128 columns of D (32 per warp) over
//                                                one split part of k in stages of 32
//
// A GEMM whose small dimension is k (dgrad of a head or router) has no kind: it writes D rather
// than reading a large operand, and the tiers write D faster than a kernel of its own (op_gemm.c).
//
// Order: every element of D (of a split part) is the portable tier's BF16 sum exactly: the
// m16n8k16 instructions over k from the range's start in 16-wide steps, 2 ceil(k_len / 32) of
// them (the portable tier's stages of 32; the k past the end read as zeros), from +0. Each
// instruction sees the same products in the same positions as there, so D has the portable
// tier's bits, split parts and their reduction included (split-K above). Split: block z is part
// z, as in the portable kernels.
#define GEMM_SKINNY_NONE 0u
#define GEMM_SKINNY_N 1u
#define GEMM_SKINNY_M 2u
#define GEMM_SKINNY_MAX 64u
#define GEMM_SKINNY_THREADS 128u      // 4 warps, every kind
#define GEMM_SKINNY_N_ROWS 64u        // N: rows of D per block
#define GEMM_SKINNY_N_STAGE_K 64u     // N: k per stage (128 bytes of each row)
#define GEMM_SKINNY_M_COLS 128u       // M: columns of D per block
#define GEMM_SKINNY_M_STAGE_K 32u     // M: k per stage
#define GEMM_SKINNY_M_STAGES 6u

// N: B's 8-row fragments (8 n-columns of D each) for n columns: 1, 2, 4 or 8.
QT_HD uint32_t qt_gemm_skinny_n_frags(uint32_t n) {
    return n <= 8u ? 1u : n <= 16u ? 2u : n <= 32u ? 4u : 8u;
}

// N: stages in flight (eight fragments' B stages are as large as A's: fewer of them), and the
// dynamic shared memory, the stages of {A: 64 rows, B: 8 frags rows; 128 bytes each}.
#define GEMM_SKINNY_N_STAGES(frags) ((frags) == 8u ? 4u : 6u)
#define GEMM_SKINNY_N_SMEM_BYTES(frags) \
    (GEMM_SKINNY_N_STAGES(frags) * (GEMM_SKINNY_N_ROWS + 8u * (frags)) * 128u)

// M: A's 16-row fragments for m rows of D: 1, 2 or 4.
QT_HD uint32_t qt_gemm_skinny_m_frags(uint32_t m) { return m <= 16u ? 1u : m <= 32u ? 2u : 4u; }

// M: dynamic shared memory, the stages of {A: 32 k rows of 16 frags values, B: 32 k rows of 128
// columns}, bf16.
#define GEMM_SKINNY_M_SMEM_BYTES(frags) \
    (GEMM_SKINNY_M_STAGES * GEMM_SKINNY_M_STAGE_K * (32u * (frags) + 2u * GEMM_SKINNY_M_COLS))

// Bias gradient: 32 columns per block, one per lane; 8 warps take 32-row chunks in turn.
#define GEMM_BGRAD_COLS 32u
#define GEMM_BGRAD_CHUNK_ROWS 32u
#define GEMM_BGRAD_THREADS 256u

// f32(1/7225344) = f32(1/(6 * 6 * 448 * 448)), for the NVFP4 alpha'.
#define GEMM_F32_INV_7225344 qt_bits_f32(0x34149B93u)

typedef struct gemm_operand {
    uint64_t data;                // codes (nvfp4: two per byte, even k in the low nibble)
    uint64_t scale;               // block scales, see the table; 0 when the format has none
    uint64_t tensor_scale;        // f32 [1] or [count]: fp8 scale_inv, nvfp4 amax; else 0
    uint64_t data_member_bytes;   // GEMM_GROUP_M, operand B: from member i's data to i + 1's
    uint64_t scale_member_bytes;  // the same for its block scales
    uint32_t ld;        // elements between stored rows (nvfp4: even)
    uint32_t scale_ld;  // entries between rows of the scale matrix
    uint32_t elem;      // GEMM_ELEM_*
    uint32_t flags;     // GEMM_OPERAND_*
} gemm_operand;
QT_STATIC_ASSERT(sizeof(gemm_operand) == 56, "gemm_operand layout");

typedef struct gemm_args {
    gemm_operand a;              // rows = D rows
    gemm_operand b;              // rows = D columns
    uint64_t d;                  // [m][ldd] d_dtype (GEMM_GROUP_K: one per member)
    uint64_t c;                  // read when nonzero and beta != 0; same layout and dtype as d
    uint64_t bias;               // [n] bias_dtype, or 0
    uint64_t d_member_bytes;     // GEMM_GROUP_K: from D_i (and C_i) to D_{i+1}
    uint64_t bias_member_bytes;  // grouped: from member i's bias to i + 1's
    qt_group_desc group;         // count 0 with GEMM_DENSE
    uint32_t m, n, k;            // GEMM_GROUP_M: m = rows capacity; GEMM_GROUP_K: k = capacity
    uint32_t ldd;                // elements between rows of D and C
    float alpha, beta;
    uint32_t d_dtype;     // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t bias_dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t grouping;    // GEMM_DENSE | GEMM_GROUP_M | GEMM_GROUP_K
    uint32_t format;      // GEMM_FORMAT_*; each kernel handles one
    uint32_t flags;       // GEMM_FLAG_*
    uint32_t tile;        // GEMM_TILE_*: the portable tier's tile (launch shape); twins ignore it
    uint64_t workspace;   // split-K: f32 [split_parts][m][n], the parts' sums; else 0
    uint32_t split_parts; // 0 or 1: no split-K; else parts along k (dense only)
    uint32_t split_k;     // split-K: k of each part (a multiple of GEMM_SPLIT_K_ALIGN); the last
                          // part takes what is left
    uint64_t norm_units;  // 0, or D's gradient-norm units (below): dense or GEMM_GROUP_K, f32 D,
                          // no C, no bias
    uint64_t d_max;       // 0, or D's maximum slot (below): dense, unsplit
} gemm_args;
QT_STATIC_ASSERT(sizeof(gemm_args) == 256, "gemm_args layout");

// Column sums of dy over rows (per member when grouped): out[i][col] in FP32, in a fixed order
// (qt_gemm_bias_grad_order below), so the value never depends on the grid.
typedef struct gemm_bias_grad_args {
    uint64_t dy;          // [rows][ld] dtype
    uint64_t out;         // f32 [max(count, 1)][cols]
    qt_group_desc group;  // count 0: one sum over rows [0, rows)
    uint32_t rows, cols, ld, dtype;
} gemm_bias_grad_args;
QT_STATIC_ASSERT(sizeof(gemm_bias_grad_args) == 56, "gemm_bias_grad_args layout");

// Decode table: the BF16 bits that the emulated formats' GEMM kernels write to shared memory for
// every (code, block scale) pair, through one of their decode paths and piece sizes (the large
// tile decodes pieces of 16 elements, the small one of 8), so that a test compares the whole
// decode with the twin's qt_f32_to_bf16 of qt_gemm_mxfp8_decode / qt_gemm_nvfp4_decode.
// Grid 256, GEMM_DECODE_TABLE_THREADS threads, no shared memory.
#define GEMM_DECODE_MXFP8_ROWWISE 0u  // K-major pieces: codes of one e8m0 scale
#define GEMM_DECODE_MXFP8_OUTER 1u    // outer-major pieces: codes with one e8m0 scale each
#define GEMM_DECODE_NVFP4 2u          // nibbles of one e4m3 scale
#define GEMM_DECODE_TABLE_THREADS 32u
#define GEMM_DECODE_TABLE_CODES(path) ((path) == GEMM_DECODE_NVFP4 ? 16u : 256u)

typedef struct gemm_decode_table_args {
    uint64_t out;    // u16 [256 scales][GEMM_DECODE_TABLE_CODES(path)], bf16 bits
    uint32_t path;   // GEMM_DECODE_*
    uint32_t elem;   // mxfp8: GEMM_ELEM_E4M3 | GEMM_ELEM_E5M2
    uint32_t piece;  // elements per decoded piece: 16 or 8
    uint32_t reserved;
} gemm_decode_table_args;
QT_STATIC_ASSERT(sizeof(gemm_decode_table_args) == 24, "gemm_decode_table_args layout");

#define QT_KERNELS_GEMM(X)                                                              \
    X(KERNEL_GEMM_BF16_PORTABLE, gemm_portable, qt_gemm_bf16_portable, gemm_args)       \
    X(KERNEL_GEMM_FP8_PORTABLE, gemm_portable, qt_gemm_fp8_portable, gemm_args)         \
    X(KERNEL_GEMM_FP8_BLOCK_PORTABLE, gemm_portable, qt_gemm_fp8_block_portable,        \
      gemm_args)                                                                        \
    X(KERNEL_GEMM_MXFP8_PORTABLE, gemm_portable, qt_gemm_mxfp8_portable, gemm_args)     \
    X(KERNEL_GEMM_NVFP4_PORTABLE, gemm_portable, qt_gemm_nvfp4_portable, gemm_args)     \
    X(KERNEL_GEMM_BIAS_GRAD, gemm_portable, qt_gemm_bias_grad, gemm_bias_grad_args)     \
    X(KERNEL_GEMM_SPLIT_REDUCE, gemm_portable, qt_gemm_split_reduce, gemm_args)         \
    X(KERNEL_GEMM_DECODE_TABLE, gemm_portable, qt_gemm_decode_table, gemm_decode_table_args) \
    X(KERNEL_GEMM_NORM_UNITS, gemm_portable, qt_gemm_norm_units, gemm_args)             \
    X(KERNEL_GEMM_BF16_SKINNY_N, gemm_skinny, qt_gemm_bf16_skinny_n, gemm_args)         \
    X(KERNEL_GEMM_BF16_SKINNY_M, gemm_skinny, qt_gemm_bf16_skinny_m, gemm_args)

// The small-tile entry points (gemm_portable.cu), which the GPU backend launches in place of a
// program's portable GEMM of the small tile (runtime/backend/gemm_tier.c); never appended to a
// program.
#define QT_KERNELS_GEMM_SMALL(X)                                                            \
    X(KERNEL_GEMM_BF16_PORTABLE_SMALL, gemm_portable, qt_gemm_bf16_portable_small, gemm_args) \
    X(KERNEL_GEMM_FP8_PORTABLE_SMALL, gemm_portable, qt_gemm_fp8_portable_small, gemm_args)   \
    X(KERNEL_GEMM_FP8_BLOCK_PORTABLE_SMALL, gemm_portable, qt_gemm_fp8_block_portable_small,  \
      gemm_args)                                                                              \
    X(KERNEL_GEMM_MXFP8_PORTABLE_SMALL, gemm_portable, qt_gemm_mxfp8_portable_small,          \
      gemm_args)                                                                              \
    X(KERNEL_GEMM_NVFP4_PORTABLE_SMALL, gemm_portable, qt_gemm_nvfp4_portable_small,          \
      gemm_args)

// ---------------------------------------------------------------------------------------------
// Per-element arithmetic, the same on both backends.

// Value of an FP8 code (exact). Products of two are exact in FP32 (at most 4 x 4 significant bits).
QT_HD float qt_gemm_fp8_value(uint8_t code, uint32_t elem) {
    return elem == GEMM_ELEM_E5M2 ? qt_e5m2_to_f32(code) : qt_e4m3_to_f32(code);
}

// MXFP8 element before the BF16 rounding: code x 2^(e - 127) is exact in FP32 for every code and
// scale (the smallest product, 2^-9 x 2^-127, is an FP32 subnormal; the largest overflow to Inf
// only for the saturated blocks of an Inf amax). Rounded to BF16 (RNE) it is exact unless it is
// below BF16's normal range.
QT_HD float qt_gemm_mxfp8_decode(uint8_t code, uint32_t elem, uint8_t e8m0) {
    return qt_gemm_fp8_value(code, elem) * qt_e8m0_to_f32(e8m0);
}

// NVFP4 element: e2m1 (2 significant bits) x e4m3 block scale (4 bits) has at most 6 significant
// bits and lies within [2^-10, 2688]: exact in FP32 and in BF16.
QT_HD float qt_gemm_nvfp4_decode(uint8_t nibble, uint8_t scale_e4m3) {
    return qt_e2m1_to_f32(nibble & 0xFu) * qt_e4m3_to_f32(scale_e4m3);
}

// The value the BF16 tensor cores see for a decoded element.
QT_HD float qt_gemm_round_bf16(float x) { return qt_bf16_to_f32(qt_f32_to_bf16(x)); }

// Per-tensor FP8: alpha' = RN(RN(alpha * scale_inv_a) * scale_inv_b).
QT_HD float qt_gemm_alpha_fp8(float alpha, float scale_inv_a, float scale_inv_b) {
    float t = alpha * scale_inv_a;
    return t * scale_inv_b;
}

// NVFP4: alpha' = RN(RN(RN(alpha * amax_A) * amax_B) * f32(1/7225344)).
QT_HD float qt_gemm_alpha_nvfp4(float alpha, float amax_a, float amax_b) {
    float t = alpha * amax_a;
    t = t * amax_b;
    return t * GEMM_F32_INV_7225344;
}

// FP8 block: promotion of one 128-wide K block's FP32 partial sum, acc + partial * RN(sa * sb)
// with one rounding for the fused multiply-add (the scales are powers of two by default, so the
// product of the scales is exact). A kernel that holds RN(sa * sb) per block
// (qt_gemm_scale_product) promotes with qt_gemm_promote_by: the same two roundings.
QT_HD float qt_gemm_scale_product(float scale_a, float scale_b) { return scale_a * scale_b; }

QT_HD float qt_gemm_promote_by(float acc, float partial, float scale_product) {
    return qt_fmaf(partial, scale_product, acc);
}

QT_HD float qt_gemm_promote(float acc, float partial, float scale_a, float scale_b) {
    return qt_gemm_promote_by(acc, partial, qt_gemm_scale_product(scale_a, scale_b));
}

// Split accumulation (per-tensor FP8): acc + partial, one FP32 addition per 128-wide K block.
QT_HD float qt_gemm_split_add(float acc, float partial) { return acc + partial; }

// Split-K reduction: sum + part, one FP32 addition per part after the first, in part order.
QT_HD float qt_gemm_parts_add(float sum, float part) { return sum + part; }

// D's elements (and C's, of D's dtype) as the kernels and twins load and store them: BF16 stores
// round to nearest even (qt_f32_to_bf16), FP32 ones keep the value's bits.
QT_HD float qt_gemm_load_value(uint64_t base, uint64_t index, uint32_t dtype) {
    if (dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(((const uint16_t *)(uintptr_t)base)[index]);
    return ((const float *)(uintptr_t)base)[index];
}

QT_HD void qt_gemm_store_value(uint64_t base, uint64_t index, uint32_t dtype, float v) {
    if (dtype == QT_DTYPE_BF16) {
        ((uint16_t *)(uintptr_t)base)[index] = qt_f32_to_bf16(v);
    } else {
        ((float *)(uintptr_t)base)[index] = v;
    }
}

// The value a load of D returns after qt_gemm_store_value stored v, without the round trip
// through memory (a consumer fused with the store sees what a later kernel would read).
QT_HD float qt_gemm_stored_value(float v, uint32_t dtype) {
    return dtype == QT_DTYPE_BF16 ? qt_bf16_to_f32(qt_f32_to_bf16(v)) : v;
}

// Whether a GEMM's args ask for split-K.
QT_HD int qt_gemm_is_split(const gemm_args *args) { return args->split_parts > 1u; }

// The k range [begin, end) of split part `part` (begin may equal end only when the split is
// misplanned; op_gemm never plans an empty part).
QT_HD void qt_gemm_split_range(const gemm_args *args, uint32_t part, uint32_t *begin,
                               uint32_t *end) {
    uint64_t b = (uint64_t)part * args->split_k;
    uint64_t e = b + args->split_k;
    *begin = b < args->k ? (uint32_t)b : args->k;
    *end = e < args->k ? (uint32_t)e : args->k;
}

// Epilogue: RN(alpha' * acc), then + RN(beta * c) when C is read, then + bias when given.
QT_HD float qt_gemm_epilogue(float acc, float alpha, int has_c, float beta, float c,
                             int has_bias, float bias) {
    float v = alpha * acc;
    if (has_c) v = v + beta * c;
    if (has_bias) v = v + bias;
    return v;
}

// ---------------------------------------------------------------------------------------------
// Gradient-norm units (gemm_args.norm_units). A weight's gradient is a dense FP32 D that the
// global norm reads right after the GEMM writes it (ptx/act.h, qt_gnorm). The GEMM also gives
// D's sums of squares in units of 16 rows x 64 columns, so the norm reads 1/1024 of D's bytes.
//   Unit (s, c): rows [16 s, 16 s + 16) and columns [64 c, 64 c + 64) of D, clipped at m and n;
//   number s * ceil(n / 64) + c. Layout: the sums, f32 [U], then the flags, u32 [U] (1 when an
//   element is NaN or +-Inf), U = ceil(m / 16) * ceil(n / 64) (qt_gemm_norm_unit_count).
//   GEMM_GROUP_K: each member's D has its U units, member i's unit u being number i U + u of
//   the count x U (qt_gemm_norm_units_of); for a stacked weight's gradient of members of whole
//   16 rows that is the numbering of the stack as one dense D.
//   Order: that of the sm_90a tier's accumulator fragments. Lane l of 32 holds the elements of
//   rows 16 s + l / 4 + 8 h and columns 64 c + 8 j + 2 (l % 4) + e, and folds them for
//   j = 0..7, h = 0..1, e = 0..1 as acc = fma(v, v, acc) from +0, skipping those outside D.
//   Then the lane tree: for w = 16, 8, 4, 2, 1, lane i < w takes own + lane i + w. Lane 0's
//   value is the unit's sum.
// The sm_90a tier computes the units in its epilogue from the values it stores. After any other
// kernel that writes such a D (portable, skinny, the split-K reduction) the backend launches
// qt_gemm_norm_units over D. The twins do the same. Every path gives these bits.
#define GEMM_NORM_UNIT_ROWS 16u
#define GEMM_NORM_UNIT_COLS 64u
#define GEMM_NORM_UNITS_THREADS 256u  // qt_gemm_norm_units: 8 warps, one unit each

QT_HD uint64_t qt_gemm_norm_unit_count(uint32_t m, uint32_t n) {
    uint64_t slabs = (m + GEMM_NORM_UNIT_ROWS - 1) / GEMM_NORM_UNIT_ROWS;
    return slabs * ((n + GEMM_NORM_UNIT_COLS - 1) / GEMM_NORM_UNIT_COLS);
}

// The units of all of a GEMM's Ds: one D's, or each K-grouped member's.
QT_HD uint64_t qt_gemm_norm_units_of(const gemm_args *a) {
    uint64_t members = a->grouping == GEMM_GROUP_K ? a->group.count : 1u;
    return members * qt_gemm_norm_unit_count(a->m, a->n);
}

// Whether a GEMM's D can have norm units: dense or a D per member (K-grouped), FP32, nothing
// added to the products' sum.
QT_HD int qt_gemm_norm_units_fit(const gemm_args *a) {
    return (a->grouping == GEMM_DENSE || a->grouping == GEMM_GROUP_K) &&
           a->d_dtype == QT_DTYPE_F32 && (a->c == 0 || a->beta == 0.0f) && a->bias == 0;
}

// Lane `lane`'s fold over unit (s, c) of D as stored (f32, rows ldd apart); nonfinite gets its
// flag.
QT_HD float qt_gemm_norm_unit_lane(const float *d, const gemm_args *a, uint32_t s, uint32_t c,
                                   uint32_t lane, uint32_t *nonfinite) {
    float acc = 0.0f;
    uint32_t bad = 0;
    for (uint32_t j = 0; j < GEMM_NORM_UNIT_COLS / 8u; j++) {
        for (uint32_t h = 0; h < 2; h++) {
            uint32_t row = GEMM_NORM_UNIT_ROWS * s + lane / 4u + 8u * h;
            for (uint32_t e = 0; e < 2; e++) {
                uint32_t col = GEMM_NORM_UNIT_COLS * c + 8u * j + 2u * (lane % 4u) + e;
                if (row >= a->m || col >= a->n) continue;
                float v = d[(uint64_t)row * a->ldd + col];
                acc = qt_fmaf(v, v, acc);
                bad |= qt_f32_nonfinite(v);
            }
        }
    }
    *nonfinite = bad;
    return acc;
}

// D's maximum (gemm_args.d_max). A GELU or SiLU whose output only a current-scaling FP8 cast
// reads needs that output's amax before the cast (ptx/quant_fp8.h, fp8_act_cast_args.x_max),
// which otherwise costs a pass over the GEMM's D. Both functions rise monotonically above their
// negative lobe, so the amax follows from D's largest value alone (ptx/act_math.h,
// qt_act_amax_from_max). The GEMM gives that value as it stores D:
//   slot (u32) = max(slot, bits of max(+0, the largest non-NaN value of D as stored)),
// an atomic maximum of FP32 bits, which order like the values they hold since every one is +0
// or positive. The kernels take the maximum over FP32 values before D's rounding, which gives
// the same bits (rounding to BF16 is monotonic), and may count zeros of rows or columns past D,
// which the floor at +0 absorbs. Dense, unsplit GEMMs of the portable kernels and the sm_90a
// tier write it, and their twins; op_gemm gives no slot to the skinny kernels or a split
// GEMM, whose reader then takes its own pass. The slot starts at +0 (a step's amax slots).
// A running maximum folds each stored value in (NaN leaves it as it was).
QT_HD float qt_gemm_d_max_fold(float running, float v) { return v > running ? v : running; }

// The slot's bits for a running maximum of values before D's rounding to d_dtype.
QT_HD uint32_t qt_gemm_d_max_bits(float running, uint32_t d_dtype) {
    float stored = qt_gemm_stored_value(running, d_dtype);
    return stored > 0.0f ? qt_f32_bits(stored) : 0u;
}

#if defined(__CUDACC__)
// A warp's maxima (every lane's slot bits) merged into the slot: one atomic per warp. All 32
// lanes take part.
__device__ __forceinline__ void qt_gemm_d_max_merge(uint64_t slot, uint32_t bits) {
#pragma unroll
    for (uint32_t w = 16; w > 0; w >>= 1) {
        uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, bits, w);
        bits = other > bits ? other : bits;
    }
    if ((threadIdx.x & 31u) == 0 && bits != 0) {
        atomicMax(reinterpret_cast<unsigned int *>(slot), bits);
    }
}
#endif

// Split-K reduction of element i of D (i = row * n + col, the workspace's order), before D's
// rounding: the parts' sum in index order, then the epilogue with alpha' (qt_gemm_alpha) and the
// C element and bias column of D's position (row * ldd + col). qt_gemm_split_reduce, its fused
// form with an activation (ptx/act.h) and their twins all compute it here.
QT_HD float qt_gemm_split_element(const gemm_args *args, float alpha, uint64_t i) {
    const float *parts = (const float *)(uintptr_t)args->workspace;
    const uint64_t elems = (uint64_t)args->m * args->n;
    float sum = parts[i];
    for (uint32_t p = 1; p < args->split_parts; p++) {
        sum = qt_gemm_parts_add(sum, parts[(uint64_t)p * elems + i]);
    }
    uint32_t col = (uint32_t)(i % args->n);
    uint64_t index = i / args->n * args->ldd + col;
    int has_c = args->c != 0 && args->beta != 0.0f;
    int has_bias = args->bias != 0;
    float c = has_c ? qt_gemm_load_value(args->c, index, args->d_dtype) : 0.0f;
    float bias = has_bias ? qt_gemm_load_value(args->bias, col, args->bias_dtype) : 0.0f;
    return qt_gemm_epilogue(sum, alpha, has_c, args->beta, c, has_bias, bias);
}

// Index of block scale (r, kb) of an operand, per the table above.
QT_HD uint64_t qt_gemm_scale_index(uint32_t format, uint32_t flags, uint64_t r, uint64_t kb,
                                   uint64_t scale_ld) {
    if (format == GEMM_FORMAT_FP8_BLOCK) {
        if (flags & GEMM_OPERAND_SCALE_2D) return (r / GEMM_BLOCK_FP8) * scale_ld + kb;
        return kb * scale_ld + r;
    }
    if (format == GEMM_FORMAT_MXFP8 && (flags & GEMM_OPERAND_OUTER_MAJOR)) {
        return kb * scale_ld + r;
    }
    return r * scale_ld + kb;  // mxfp8 K-major, nvfp4
}

// Block length along k of a format's scales (1 when it has none).
QT_HD uint32_t qt_gemm_block_len(uint32_t format) {
    return format == GEMM_FORMAT_FP8_BLOCK ? GEMM_BLOCK_FP8
           : format == GEMM_FORMAT_MXFP8   ? GEMM_BLOCK_MXFP8
           : format == GEMM_FORMAT_NVFP4   ? GEMM_BLOCK_NVFP4
                                           : 1u;
}

// The per-tensor factor of an operand for a member (fp8 scale_inv, nvfp4 amax).
QT_HD float qt_gemm_tensor_scale(const gemm_operand *op, uint32_t member) {
    const float *ts = (const float *)(uintptr_t)op->tensor_scale;
    return ts[(op->flags & GEMM_OPERAND_TENSOR_PER_MEMBER) ? member : 0u];
}

// alpha' of a GEMM for one member.
QT_HD float qt_gemm_alpha(const gemm_args *args, uint32_t member) {
    if (args->format == GEMM_FORMAT_FP8) {
        return qt_gemm_alpha_fp8(args->alpha, qt_gemm_tensor_scale(&args->a, member),
                                 qt_gemm_tensor_scale(&args->b, member));
    }
    if (args->format == GEMM_FORMAT_NVFP4 || (args->flags & GEMM_FLAG_ALPHA_NVFP4)) {
        return qt_gemm_alpha_nvfp4(args->alpha, qt_gemm_tensor_scale(&args->a, member),
                                   qt_gemm_tensor_scale(&args->b, member));
    }
    return args->alpha;
}

// M tiles of `tile_rows` rows of one member of a GEMM_GROUP_M GEMM: its padded rows, in whole
// tiles (so that D's padding rows get their zeros). The launch has ceil(m / tile_rows) + count
// row tiles, which bounds the sum over members since the padded rows sum to at most m.
QT_HD uint32_t qt_gemm_member_row_tiles(uint32_t padded_rows, uint32_t tile_rows) {
    return (padded_rows + tile_rows - 1) / tile_rows;
}

// The same for the large tile.
QT_HD uint32_t qt_gemm_member_tiles(uint32_t padded_rows) {
    return qt_gemm_member_row_tiles(padded_rows, GEMM_TILE_M);
}

// Bias gradient order: out = (((0 + p_0) + p_1) + ...) over the member's 32-row chunks in order,
// p_j = (((0 + dy[r_j]) + dy[r_j + 1]) + ...) over the chunk's rows in order. One FP32 addition
// per step, the same on both backends.
QT_HD float qt_gemm_bias_grad_add(float sum, float value) { return sum + value; }

#endif  // QT_GEMM_H
