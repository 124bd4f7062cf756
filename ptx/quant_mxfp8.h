// quant_mxfp8: the MXFP8 kernels' ABI (fused rowwise + columnwise quantize, dequantize) and the
// per-element and per-block arithmetic shared by ptx/quant_mxfp8.cu and its C twins
// (runtime/ref/ref_quant_mxfp8.c). Layouts: ptx/quant.h.
//
// Owns nothing. For an M x K input (rows = M, or rows_capacity of a grouped tensor):
//
//   row_codes   u8   [M][K]            block (m, k/32): 32 consecutive elements of row m
//   row_scales  e8m0 [M][ceil(K/32)]
//   col_codes   u8   [M][K]            not transposed; block (m/32, k): 32 rows of column k
//   col_scales  e8m0 [ceil(M/32)][K]
//
// Per block: amax = max |x| over the in-range, valid elements (NaN ignored, start 0);
// e = toE8M0(RN(amax * f32(1/qmax))); q = satFP8(RN(x * 2^(127 - e))). With QT_MXFP8_FLAG_2D one
// amax over each 32 x 32 tile gives the scale of both directions; the scale is still written in
// both compact layouts (each of the tile's 32 rows and 32 columns gets the tile's byte).
//
// Grouped tensors (quant.h, quant_group.h): the same layouts over the padded rows. Row r is
// *active* when r < end = min(row_offsets[count], rows) and *valid* when it is active and among
// its member's first_dims rows; invalid active rows (padding) quantize as zeros (codes 0, row
// scale 0), inactive rows are never read or written, and a columnwise scale row m/32 is written
// when its first row is active. A dense tensor (count 0) has end = rows and every row valid.
#ifndef QT_QUANT_MXFP8_H
#define QT_QUANT_MXFP8_H

#include "ptx/act_math.h"     // QT_ACT_*, QT_ACT_LUT_ENTRIES (the activation casts)
#include "ptx/core.h"         // QT_DTYPE_*
#include "ptx/qt_codec.h"     // qt_f32_to_e4m3/e5m2, qt_f32_to_e8m0, qt_e8m0_inv_f32, decoders
#include "ptx/quant_group.h"  // qt_group_desc, qt_group_active_rows, qt_group_find

#define QT_MXFP8_BLOCK 32u  // elements per scaling block, along K (rowwise) or M (columnwise)

// Element type of the codes (args `elem`).
#define QT_MXFP8_E4M3 0u
#define QT_MXFP8_E5M2 1u

#define QT_MXFP8_FLAG_2D 1u  // one scale per 32 x 32 tile, shared by both directions
// Values instead of codes: the direction's codes are decoded with their block's scale at once
// and stored as BF16 [rows][cols] at row_codes (col_codes), the bits qt_mxfp8_dequantize writes
// to a BF16 output (qt_mxfp8_value_bf16); that direction's scales are not written (its scales
// pointer is ignored). A BF16 GEMM over such values computes the MXFP8 GEMM's products, so a
// tensor that only such GEMMs read needs neither its codes nor a dequantize pass over them.
#define QT_MXFP8_FLAG_ROW_VALUES 2u
#define QT_MXFP8_FLAG_COL_VALUES 4u

// The quantize kernel's tile: 32 rows x 256 columns per block of 128 threads (4 warps, each
// 32 rows x 64 columns). The op builder sizes the grid with these. Small blocks keep the last,
// partial wave of blocks short (8192 blocks for an 8192 x 8192 cast).
#define QT_MXFP8_TILE_ROWS 32u
#define QT_MXFP8_TILE_COLS 256u
#define QT_MXFP8_THREADS (QT_MXFP8_TILE_COLS / 2u)  // 32 lanes per 64 columns

typedef struct mxfp8_quantize_args {
    uint64_t in;          // [rows][cols] bf16 or f32
    uint64_t row_codes;   // u8 [rows][cols] (ROW_VALUES: bf16); 0 = no rowwise output
    uint64_t row_scales;  // e8m0 [rows][ceil(cols/32)]; ignored with ROW_VALUES
    uint64_t col_codes;   // u8 [rows][cols], not transposed (COL_VALUES: bf16); 0 = none
    uint64_t col_scales;  // e8m0 [ceil(rows/32)][cols]; ignored with COL_VALUES
    qt_group_desc group;  // count 0: dense
    uint32_t rows;        // M, or the grouped tensor's rows_capacity
    uint32_t cols;        // K
    uint32_t dtype;       // QT_DTYPE_BF16 | QT_DTYPE_F32 (must match the kernel's symbol)
    uint32_t elem;        // QT_MXFP8_E4M3 | QT_MXFP8_E5M2
    uint32_t flags;       // QT_MXFP8_FLAG_*
    uint32_t reserved;
} mxfp8_quantize_args;
QT_STATIC_ASSERT(sizeof(mxfp8_quantize_args) == 88, "mxfp8_quantize_args layout");

typedef struct mxfp8_dequantize_args {
    uint64_t codes;       // u8 [rows][cols]
    uint64_t scales;      // rowwise e8m0 [rows][ceil(cols/32)], columnwise [ceil(rows/32)][cols]
    uint64_t out;         // [rows][cols] bf16 or f32; inactive rows of a group are not written
    qt_group_desc group;  // count 0: dense
    uint32_t rows, cols;
    uint32_t dtype;       // of out: QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t elem;        // QT_MXFP8_E4M3 | QT_MXFP8_E5M2
    uint32_t colwise;     // 0: rowwise scales, 1: columnwise scales
    uint32_t reserved;
} mxfp8_dequantize_args;
QT_STATIC_ASSERT(sizeof(mxfp8_dequantize_args) == 72, "mxfp8_dequantize_args layout");

// An activation and the MXFP8 cast of its output in one pass over the activation's input
// (qt_mxfp8_act_fwd, qt_mxfp8_act_bwd): y = act(x) forward, dy * act'(x) backward, rounded to
// BF16, the very tensor that qt_act_fwd / qt_act_bwd (ptx/act.h) would store, through the same
// table (ptx/act_math.h), which is never written; then y is cast as qt_mxfp8_quantize_bf16
// casts a dense BF16 tensor: the same codes, scales and values. Dense only (cast.group.count 0),
// 1-D (no QT_MXFP8_FLAG_2D), x and dy BF16, cols % 8 == 0, x and dy 16-byte aligned.
// Persistent: each block computes its table (QT_MXFP8_ACT_TABLE_BYTES of dynamic shared memory;
// backward QT_MXFP8_ACT_BWD_SMEM_BYTES, with a tile of dy staged after it) once, then takes the
// quantize kernel's tiles blockIdx.x, blockIdx.x + gridDim.x, ... (the bits never depend on the
// grid).
typedef struct mxfp8_act_args {
    mxfp8_quantize_args cast;  // in: x, the activation's input, BF16 (cast.dtype BF16)
    uint64_t dy;               // backward: BF16 [rows][cols], the gradient at the output
    uint32_t act;              // QT_ACT_GELU | QT_ACT_SILU (ptx/act_math.h)
    uint32_t reserved;
} mxfp8_act_args;
QT_STATIC_ASSERT(sizeof(mxfp8_act_args) == 104, "mxfp8_act_args layout");

#define QT_MXFP8_ACT_TABLE_BYTES (4u * QT_ACT_LUT_ENTRIES)
#define QT_MXFP8_ACT_BWD_SMEM_BYTES \
    (QT_MXFP8_ACT_TABLE_BYTES + 2u * QT_MXFP8_TILE_ROWS * QT_MXFP8_TILE_COLS)  // + dy's tile
// The kernels' __launch_bounds__ minimum blocks an SM, which the op builder sizes grids with.
#define QT_MXFP8_ACT_FWD_BLOCKS_PER_SM 7u
#define QT_MXFP8_ACT_BWD_BLOCKS_PER_SM 5u

// The input dtype picks the quantize kernel: each instantiation gets its own register budget
// (the BF16 one keeps its tile packed in half the registers of the FP32 one).
#define QT_KERNELS_QUANT_MXFP8(X)                                                           \
    X(KERNEL_MXFP8_QUANTIZE_BF16, quant_mxfp8, qt_mxfp8_quantize_bf16, mxfp8_quantize_args) \
    X(KERNEL_MXFP8_QUANTIZE_F32, quant_mxfp8, qt_mxfp8_quantize_f32, mxfp8_quantize_args)   \
    X(KERNEL_MXFP8_DEQUANTIZE, quant_mxfp8, qt_mxfp8_dequantize, mxfp8_dequantize_args)     \
    X(KERNEL_MXFP8_ACT_FWD, quant_mxfp8, qt_mxfp8_act_fwd, mxfp8_act_args)                  \
    X(KERNEL_MXFP8_ACT_BWD, quant_mxfp8, qt_mxfp8_act_bwd, mxfp8_act_args)

// ---------------------------------------------------------------------------------------------
// Grouped rows (member lookups of quant_group.h).

// Whether active row `row` (below qt_group_active_rows) holds data of its member; padding rows
// do not. A dense tensor's rows all do.
QT_HD int qt_mxfp8_row_valid(qt_group_desc g, uint32_t rows, uint32_t row) {
    if (g.count == 0) return 1;
    qt_group_rows m = qt_group_member_rows(g, rows, qt_group_find(g, 0, g.count, row));
    return row >= m.begin && row < m.valid_end;
}

// ---------------------------------------------------------------------------------------------
// Per element and per block.

// Input element `index` as FP32 (exact for BF16).
QT_HD float qt_mxfp8_load(const void *in, uint32_t dtype, uint64_t index) {
    if (dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(((const uint16_t *)in)[index]);
    return ((const float *)in)[index];
}

// One step of a block amax: max(amax, |x|) with NaN ignored (fmaxf semantics), so
// an amax that starts at 0 is never NaN. Max is exact and order-free, so the kernels' packed
// BF16 and warp-shuffle trees give this loop's value.
QT_HD float qt_mxfp8_amax_step(float amax, float x) {
    float a = qt_bits_f32(qt_f32_bits(x) & QT_F32_ABS);
    return a > amax ? a : amax;
}

// The block's E8M0 scale: toE8M0(RN(amax * f32(1/qmax))). One IEEE multiply on both sides (no
// contraction: -fmad=false, -ffp-contract=off). amax 0 gives 0, amax +Inf gives 0xFE.
QT_HD uint8_t qt_mxfp8_scale_e8m0(float amax, uint32_t elem) {
    float inv_qmax = elem == QT_MXFP8_E5M2 ? QT_F32_INV_57344 : QT_F32_INV_448;
    return qt_f32_to_e8m0(amax * inv_qmax);
}

// Two elements, x0 in the low byte: satFP8(RN(x * mult)) with mult = qt_e8m0_inv_f32(e) of each
// element's block (rowwise both come from one block, columnwise from two columns). mult is a
// power of two, so the product is exact except for FP32 underflow, where both sides round the
// same IEEE way (no flush to zero on either). On the device the conversion is the hardware
// cvt.rn.satfinite instruction, on the host the codec of qt_codec.h: the two
// agree bit for bit (the GPU tests check it over planted and random bit patterns).
// NOTE: the codec's integer emulation costs ~20 instructions per element, which with two
// conversions per element would make the fused cast compute-bound on an H100; the hardware
// instruction converts two elements in one.
QT_HD uint32_t qt_mxfp8_encode2(float x0, float x1, float mult0, float mult1, uint32_t elem) {
    float y0 = x0 * mult0;
    float y1 = x1 * mult1;
#if defined(__CUDA_ARCH__)
    unsigned short pair;
    if (elem == QT_MXFP8_E5M2) {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(y1), "f"(y0));
    } else {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(y1), "f"(y0));
    }
    return pair;
#else
    if (elem == QT_MXFP8_E5M2) return qt_f32_to_e5m2(y0) | ((uint32_t)qt_f32_to_e5m2(y1) << 8);
    return qt_f32_to_e4m3(y0) | ((uint32_t)qt_f32_to_e4m3(y1) << 8);
#endif
}

// One element (the twin's plain loop): the low lane of qt_mxfp8_encode2.
QT_HD uint8_t qt_mxfp8_encode(float x, float mult, uint32_t elem) {
    return (uint8_t)(qt_mxfp8_encode2(x, 0.0f, mult, mult, elem) & 0xFFu);
}

// Dequantize: code * 2^(e - 127), exact except for FP32 underflow at tiny scales, rounded
// the same IEEE way on both sides. NaN is decided here rather than left to the multiply, whose
// NaN result differs between the GPU (canonical 0x7FFFFFFF) and x86 (the operand's payload and
// sign): a NaN code of either sign and the NaN scale (0xFF) both give the canonical 0x7FFFFFFF,
// the GPU multiply's result, as every other dequantize writes it.
QT_HD float qt_mxfp8_decode(uint8_t code, uint8_t e, uint32_t elem) {
    float v = elem == QT_MXFP8_E5M2 ? qt_e5m2_to_f32(code) : qt_e4m3_to_f32(code);
    if (qt_f32_is_nan(v) || e == 0xFFu) return qt_bits_f32(QT_F32_ABS);
    return v * qt_e8m0_to_f32(e);
}

// The BF16 value of a code (qt_mxfp8_dequantize's BF16 output, QT_MXFP8_FLAG_*_VALUES).
QT_HD uint16_t qt_mxfp8_value_bf16(uint8_t code, uint8_t e, uint32_t elem) {
    return qt_f32_to_bf16(qt_mxfp8_decode(code, e, elem));
}

// The stored output element: FP32 bits, or BF16 rounded to nearest even (qt_f32_to_bf16).
QT_HD void qt_mxfp8_store(void *out, uint32_t dtype, uint64_t index, float value) {
    if (dtype == QT_DTYPE_BF16) {
        ((uint16_t *)out)[index] = qt_f32_to_bf16(value);
    } else {
        ((float *)out)[index] = value;
    }
}

#endif  // QT_QUANT_MXFP8_H
