// quant_block: FP8 block scaling (TE's Float8BlockScaling): the kernels' ABI and the
// per-block arithmetic shared by ptx/quant_block.cu and its C twins
// (runtime/ref/ref_quant_block.c).
//
// Owns nothing. Layouts (ptx/quant.h), for an M x K input (M = rows, K = cols):
//
//   1-D (1x128)    rowwise codes u8 [M][K]  scale_inv f32 [ceil(K/128)][M] (block outer, row inner)
//                  colwise codes u8 [K][M]  scale_inv f32 [ceil(M/128)][K] (codes transposed,
//                                                                           blocks along M)
//   2-D (128x128)  rowwise codes u8 [M][K]  scale_inv f32 [ceil(M/128)][ceil(K/128)]
//                  colwise codes u8 [K][M]  scale_inv f32 [ceil(K/128)][ceil(M/128)]
//
//   rowwise codes                       colwise codes (transposed)
//        k ->                                m ->
//   m  +-----+-----+--                  k  +-----+-----+--
//   |  | 1x128 blocks along K            |  | 1x128 blocks along M (one per column k of
//   v  +-----+-----+--                  v  +-----+-----+--   the input, 128 rows of it)
//
// Per block: amax = max |x| over the block's valid elements (NaN ignored),
// scale = scale_from_amax(amax, qmax, pow2, eps, max finite of the INPUT dtype),
// scale_inv = RN(1/scale), code = satFP8(RN(x * scale)). 2-D blocks are 128x128 tiles: one scale
// per tile, and the columnwise codes are the byte transpose of the rowwise ones.
//
// Grouped tensors (ptx/quant.h): `rows` is the buffer's rows_capacity and every layout above is
// the dense layout of that padded matrix. Rows at or beyond row_offsets[count] are never written
// (codes nor scales); padding rows of a member read as zeros (zero codes, never in an amax).
// Members are padded to multiples of 128 rows, so a 128-row block never straddles two members.
#ifndef QT_QUANT_BLOCK_H
#define QT_QUANT_BLOCK_H

#include "ptx/act_math.h"  // QT_ACT_*, QT_ACT_LUT_ENTRIES (the activation casts)
#include "ptx/core.h"      // QT_DTYPE_BF16, QT_DTYPE_F32
#include "ptx/qt_codec.h"  // qt_scale_from_amax, qt_f32_to_e4m3, qt_e4m3_to_f32, ...
#include "ptx/quant.h"     // qt_group_desc

#define QT_BLOCK_LEN 128u  // block length, and the side of a 2-D tile

#define QT_BLOCK_E4M3 0u  // code format (E4M3 default; E5M2 for HYBRID grads)
#define QT_BLOCK_E5M2 1u

#define QT_BLOCK_ROWWISE 1u  // `directions` bits: which of the two outputs a cast writes
#define QT_BLOCK_COLWISE 2u

typedef struct quant_block_args {
    uint64_t input;          // [rows][cols] bf16 or f32
    uint64_t row_codes;      // u8 [rows][cols]                          (when ROWWISE)
    uint64_t row_scale_inv;  // f32 1-D [ceil(cols/128)][rows], 2-D [ceil(rows/128)][ceil(cols/128)]
    uint64_t col_codes;      // u8 [cols][rows], transposed               (when COLWISE)
    uint64_t col_scale_inv;  // f32 1-D [ceil(rows/128)][cols], 2-D [ceil(cols/128)][ceil(rows/128)]
    qt_group_desc group;     // count 0: dense
    uint32_t rows;           // M, or the grouped buffer's rows_capacity
    uint32_t cols;           // K
    uint32_t fp8;            // QT_BLOCK_E4M3 | QT_BLOCK_E5M2
    uint32_t directions;     // QT_BLOCK_ROWWISE | QT_BLOCK_COLWISE, at least one
    uint32_t pow2;           // 1: scales rounded down to powers of two (the recipe default)
    float eps;               // amax epsilon (recipe default 0)
} quant_block_args;
QT_STATIC_ASSERT(sizeof(quant_block_args) == 88, "quant_block_args layout");

// An activation and the 1-D cast of its output in one pass over the activation's input
// (qt_quant_block_act_fwd, qt_quant_block_act_bwd): y = act(x) forward, dy * act'(x) backward,
// rounded to BF16, the very tensor that qt_act_fwd / qt_act_bwd (ptx/act.h) would store, through
// the same table (ptx/act_math.h), which is never written; then y is cast as
// qt_quant_block_1d_bf16 casts a dense BF16 tensor: the same codes and scale_inv. Dense only
// (cast.group.count 0), 1-D, x and dy BF16, cols % 8 == 0, x and dy 16-byte aligned. Persistent:
// each block computes its table (QT_BLOCK_ACT_TABLE_BYTES of dynamic shared memory) once, then
// takes the 128 x 128 tiles blockIdx.x, blockIdx.x + gridDim.x, ... (the bits never depend on
// the grid).
typedef struct quant_block_act_args {
    quant_block_args cast;  // input: x, the activation's input, BF16 (cast.input)
    uint64_t dy;            // backward: BF16 [rows][cols], the gradient at the output
    uint32_t act;           // QT_ACT_GELU | QT_ACT_SILU (ptx/act_math.h)
    uint32_t reserved;
} quant_block_act_args;
QT_STATIC_ASSERT(sizeof(quant_block_act_args) == 104, "quant_block_act_args layout");

#define QT_BLOCK_ACT_TABLE_BYTES (4u * QT_ACT_LUT_ENTRIES)
#define QT_BLOCK_ACT_BLOCKS_PER_SM 4u  // the kernels' __launch_bounds__ minimum

typedef struct dequant_block_args {
    uint64_t codes;      // rowwise u8 [rows][cols], or columnwise u8 [cols][rows]
    uint64_t scale_inv;  // the direction's scale_inv, layout as in quant_block_args
    uint64_t out;        // [rows][cols] bf16 or f32 (columnwise data comes back untransposed)
    qt_group_desc group; // rows at or beyond row_offsets[count] are not written
    uint32_t rows, cols;
    uint32_t fp8;        // QT_BLOCK_E4M3 | QT_BLOCK_E5M2
    uint32_t colwise;    // 0: rowwise data, 1: columnwise (transposed) data
    uint32_t out_dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t reserved;
} dequant_block_args;
QT_STATIC_ASSERT(sizeof(dequant_block_args) == 72, "dequant_block_args layout");

// The casts have one symbol per input dtype, so each gets the register budget it needs (FP32
// tiles hold twice the bytes of BF16 tiles in registers); 1-D and 2-D dequantize share one ABI.
#define QT_KERNELS_QUANT_BLOCK(X)                                                        \
    X(KERNEL_QUANT_BLOCK_1D_BF16, quant_block, qt_quant_block_1d_bf16, quant_block_args) \
    X(KERNEL_QUANT_BLOCK_1D_F32, quant_block, qt_quant_block_1d_f32, quant_block_args)   \
    X(KERNEL_QUANT_BLOCK_2D_BF16, quant_block, qt_quant_block_2d_bf16, quant_block_args) \
    X(KERNEL_QUANT_BLOCK_2D_F32, quant_block, qt_quant_block_2d_f32, quant_block_args)   \
    X(KERNEL_DEQUANT_BLOCK_1D, quant_block, qt_dequant_block_1d, dequant_block_args)     \
    X(KERNEL_DEQUANT_BLOCK_2D, quant_block, qt_dequant_block_2d, dequant_block_args)     \
    X(KERNEL_QUANT_BLOCK_ACT_FWD, quant_block, qt_quant_block_act_fwd, quant_block_act_args) \
    X(KERNEL_QUANT_BLOCK_ACT_BWD, quant_block, qt_quant_block_act_bwd, quant_block_act_args)

// ---------------------------------------------------------------------------------------------
// Per-block arithmetic.

QT_HD float qt_block_qmax(uint32_t fp8) {
    return fp8 == QT_BLOCK_E5M2 ? QT_E5M2_MAX : QT_E4M3_MAX;
}

// Block scaling's scale_from_amax replaces an infinite scale by the input dtype's max finite value
// (which pow2 then truncates to 2^127 for both BF16 and FP32).
QT_HD float qt_block_inf_repl(uint32_t in_dtype) {
    return in_dtype == QT_DTYPE_BF16 ? QT_F32_BF16_MAX : QT_F32_FLT_MAX;
}

// One step of a block amax: |x| by clearing the sign bit, NaN ignored (the comparison with a NaN
// is false), as fmaxf does. The kernels use fmaxf, which returns the same value.
QT_HD float qt_block_amax_step(float amax, float x) {
    float a = qt_bits_f32(qt_f32_bits(x) & QT_F32_ABS);
    return a > amax ? a : amax;
}

QT_HD float qt_block_scale(float amax, uint32_t fp8, uint32_t pow2, float eps,
                           uint32_t in_dtype) {
    return qt_scale_from_amax(amax, qt_block_qmax(fp8), (int)pow2, eps,
                              qt_block_inf_repl(in_dtype));
}

// TE computes the 1-D scale_inv as 1.0/scale in double, rounded to FP32, and the
// 2-D one as 1.0f/scale in FP32. Both equal RN(1/scale): the double quotient carries 53 >= 2*24+2
// bits, so rounding it again to FP32 (24 bits, or fewer for a subnormal result) cannot land on a
// different value than rounding the exact quotient once (tests/test_quant_block.c checks this
// over every power of two and millions of other scales). Both backends compute the FP32 RN
// reciprocal: an IEEE division on the host, rcp.rn (IEEE-exact, subnormals kept) on the device.
QT_HD float qt_block_scale_inv(float scale) {
#if defined(__CUDA_ARCH__)
    return __frcp_rn(scale);
#else
    return 1.0f / scale;
#endif
}

// satFP8 of two FP32 values, codes packed lo | hi << 8. The device uses the hardware conversion
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (its first source goes to the upper byte), which was
// found equal bit for bit to the codec's rules; the GPU tests check it again over millions of
// bit patterns through the cast kernels. The host uses the codec.
QT_HD uint32_t qt_block_fp8x2(float lo, float hi, uint32_t fp8) {
#if defined(__CUDA_ARCH__)
    unsigned short packed;
    if (fp8 == QT_BLOCK_E5M2) {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(packed) : "f"(lo), "f"(hi));
    } else {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(packed) : "f"(lo), "f"(hi));
    }
    return packed;
#else
    if (fp8 == QT_BLOCK_E5M2) return qt_f32_to_e5m2(lo) | (uint32_t)qt_f32_to_e5m2(hi) << 8;
    return qt_f32_to_e4m3(lo) | (uint32_t)qt_f32_to_e4m3(hi) << 8;
#endif
}

// code = satFP8(RN(x * scale)): one FP32 multiply, then the conversion.
QT_HD uint8_t qt_block_quantize(float x, float scale, uint32_t fp8) {
    return (uint8_t)qt_block_fp8x2(x * scale, 0.0f, fp8);
}

QT_HD float qt_block_decode(uint8_t code, uint32_t fp8) {
    return fp8 == QT_BLOCK_E5M2 ? qt_e5m2_to_f32(code) : qt_e4m3_to_f32(code);
}

// Dequantize: x = fp8 * scale_inv, decoded value from qt_block_decode (exact).
// A NaN product is written as the canonical 0x7FFFFFFF, which is what the GPU's multiply returns
// for any NaN operand; the host's multiply would keep the operand's payload and sign.
QT_HD float qt_block_dequantize(float decoded, float scale_inv) {
    float v = decoded * scale_inv;
    return qt_f32_is_nan(v) ? qt_bits_f32(QT_F32_ABS) : v;
}

// ---------------------------------------------------------------------------------------------
// Grouped rows (ptx/quant.h). Device code reads the arrays through the read-only cache.

#if defined(__CUDA_ARCH__)
#define QT_BLOCK_LOAD_U32(p) __ldg(p)
#else
#define QT_BLOCK_LOAD_U32(p) (*(p))
#endif

#define QT_BLOCK_ROW_SKIP 0u   // at or beyond the active rows: nothing is written for it
#define QT_BLOCK_ROW_PAD 1u    // a member's padding row: reads as zeros, zero codes written
#define QT_BLOCK_ROW_VALID 2u  // a row of data

// Rows [0, active) are written: all rows of a dense tensor, rows below row_offsets[count] of a
// grouped one.
QT_HD uint32_t qt_block_active_rows(const qt_group_desc *g, uint32_t rows) {
    if (g->count == 0) return rows;
    uint32_t end = QT_BLOCK_LOAD_U32((const uint32_t *)(uintptr_t)g->row_offsets + g->count);
    return end < rows ? end : rows;
}

// State of row m < active: the member is the largest i with row_offsets[i] <= m (empty members
// share their offset with the next one, so this skips them); the row is data when it lies within
// the member's first_dims[i] rows.
QT_HD uint32_t qt_block_row_state(const qt_group_desc *g, uint32_t active, uint32_t m) {
    if (m >= active) return QT_BLOCK_ROW_SKIP;
    if (g->count == 0) return QT_BLOCK_ROW_VALID;
    const uint32_t *offsets = (const uint32_t *)(uintptr_t)g->row_offsets;
    uint32_t lo = 0, hi = g->count;  // invariant: offsets[lo] <= m < offsets[hi]
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (QT_BLOCK_LOAD_U32(offsets + mid) <= m) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    uint32_t first_dim = QT_BLOCK_LOAD_U32((const uint32_t *)(uintptr_t)g->first_dims + lo);
    return m - QT_BLOCK_LOAD_U32(offsets + lo) < first_dim ? QT_BLOCK_ROW_VALID
                                                           : QT_BLOCK_ROW_PAD;
}

#endif  // QT_QUANT_BLOCK_H
