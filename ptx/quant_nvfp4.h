// quant_nvfp4: NVFP4 quantization: the kernels' ABI (args structs,
// flags, QT_KERNELS_QUANT_NVFP4) and every per-element and per-block operation, shared by
// ptx/quant_nvfp4.cu and its C twins (runtime/ref/ref_quant_nvfp4.c) so that both run the very same
// IEEE operations in the same order.
//
// Owns nothing. Kernels, launched by runtime/ops/op_quant_nvfp4.c:
//
//   qt_nvfp4_amax_zero   amax_row[0..n) = 0 (and amax_col): the atomic maxima below start at 0
//   qt_nvfp4_amax        amax_row[i] = max |x| over member i's valid rows; amax_col[i] = the same,
//                        or with RHT max |RHT(x^T)| over the BF16-rounded transform
//   qt_nvfp4_quantize    one pass over x: rowwise and/or columnwise codes and E4M3 block scales
//   qt_nvfp4_quantize_bf16  the same for BF16 input without 2-D or stochastic rounding (the
//                        fused cast TE runs on activations and gradients), its own register budget
//   qt_nvfp4_quantize_bf16_sr  the same with stochastic rounding (BF16 gradients)
//   qt_nvfp4_quantize_f32_2d  FP32 input with 16 x 16 tiles, rounding to nearest (the weights)
//   qt_nvfp4_dequantize  codes + scales (+ the direction's global amax) -> [M][K] BF16 or FP32
//
// Layouts (ptx/quant.h): x [M][K] row-major (M = rows, K = cols), two codes per byte, even
// index in the low nibble, an odd row length leaving a zero high nibble:
//
//   rowwise     data   u8 [M][ceil(K/2)]    scales e4m3 [M][ceil(K/16)]
//   columnwise  data   u8 [K][ceil(M/2)]    scales e4m3 [K][ceil(M/16)]   (transposed: (m, k)
//                                                                          is stored at [k][m])
//   amax_row, amax_col  f32 [max(n, 1)]  one per member (n = group count; 1 for a dense tensor)
//
// Row blocks. Every kernel works on blocks of 16 consecutive rows starting at multiples of 16:
// the columnwise 16-element blocks, the RHT groups and the 2-D tiles are such blocks. A block
// lies inside one member, because members' padded sizes are multiples of 16 (row_align of the
// nvfp4 row of recipes/format.c), a precondition on row_offsets. For the block starting at row
// r, qt_nvfp4_span_of gives the member, `valid_end` (rows below hold data, rows from it on are
// read as zero: member padding, or past M) and `store_end` (rows, i.e. columnwise positions,
// below it are written and counted in amaxes). Dense: valid_end = store_end = M, so a partial
// last block is zero-padded and its positions >= M are neither stored nor counted. Grouped:
// valid_end = row_offsets[i] + first_dims[i], store_end = row_offsets[i + 1]; blocks at or past
// row_offsets[n] are skipped entirely (nothing is written there).
//
// Padding rows of a member are zero input: their rowwise codes and scales are 0, and without RHT
// so are their columnwise ones, and they add nothing to an amax. With RHT the positions of a
// member's last, partial 16-row group that fall in its padding hold the transform of the
// zero-padded group, which is in general not zero: keeping them is what makes the orthogonal
// transform cancel in the wgrad GEMM (sum over all 16 positions of RHT(a) * RHT(b) = sum of
// a * b), so they are stored and counted in the columnwise amax like any other position.
//
// Random Hadamard transform, on the columnwise copy only: for column k and the 16-row
// block at r, v_j = x[r + j][k] (zero where not valid), y = v * diag(s) * H16 / 4 with s the sign
// mask (bit j set: s_j = -1; QT_NVFP4_RHT_SIGNS_TE = 0xD7E8, 0 gives the plain Hadamard matrix).
// Fixed FP32 order (qt_nvfp4_rht16): first the exact products q_j = v_j * (+-0.25), then the
// four radix-2 butterfly stages of the fast Walsh-Hadamard transform (pairs (i, i + h) for
// h = 1, 2, 4, 8: a + b, a - b), which yields y_j = sum_k q_k (-1)^popcount(j & k) in Sylvester
// order; a zero y_j is made +0 (qt_nvfp4_rht_plus_zero), and each y_j is then rounded to BF16.
// TE sums on tensor cores in an unspecified order; the butterflies are our fixed order, cheaper
// than 16 sequential adds per output (4 adds per element instead of 16) and reproduced exactly
// by the twin. FP32 inputs are transformed as they are (TE requires BF16 input for RHT; we do
// not). The columnwise data of an RHT tensor dequantizes to the RHT domain (the transform is not
// undone).
//
// Stochastic rounding (ptx/quant.h): block b of row r of a direction's data draws its 16
// bytes from qt_quant_random16(seed, step, tensor_id, r, b); the columnwise direction uses
// tensor_id | QT_QUANT_TENSOR_COLWISE, row k and block m / 16. Rows are absolute rows of the
// (padded) buffer. step is read from a device u64 counter when the kernel runs.
#ifndef QT_QUANT_NVFP4_H
#define QT_QUANT_NVFP4_H

#include "ptx/qt_codec.h"  // qt_f32_to_e4m3, qt_e4m3_to_f32, qt_f32_to_e2m1_sr, qt_f32_to_bf16
#include "ptx/quant.h"     // qt_group_desc, qt_quant_random16

#define QT_NVFP4_BLOCK 16u              // elements per block scale, both directions
#define QT_NVFP4_RHT_SIGNS_TE 0xD7E8u   // TE's fixed sign vector, bit j = index j is -1

// nvfp4_quantize_args.flags; nvfp4_amax_args uses COLWISE (write amax_col) and RHT.
#define QT_NVFP4_ROWWISE 1u
#define QT_NVFP4_COLWISE 2u
#define QT_NVFP4_RHT 4u  // columnwise data (and amax_col) of RHT(x^T)
#define QT_NVFP4_2D 8u   // 16x16 tiles (weights): one amax per tile, scale replicated into rows;
                         // never with RHT (TE gives weights no RHT; the builder asserts)
#define QT_NVFP4_SR 16u  // stochastic rounding of the codes (both enabled directions)
// Values instead of codes, for a copy that only BF16 GEMMs read: the direction's codes decoded
// as qt_nvfp4_decode decodes them (qt_nvfp4_raw_value rounded to BF16, without the global
// factor) and stored as BF16 at row_data [rows][cols] (col_data [cols][rows]); its scales are
// not written. Dense tensors of BF16 input with rows and cols multiples of 16, no 2-D (the
// fast kernels; the builder asserts it).
#define QT_NVFP4_ROW_VALUES 32u
#define QT_NVFP4_COL_VALUES 64u

typedef struct nvfp4_amax_args {
    uint64_t x;         // [rows][cols] bf16 | f32
    uint64_t amax_row;  // f32 [max(count, 1)], atomically maxed (zeroed by qt_nvfp4_amax_zero)
    uint64_t amax_col;  // f32 [max(count, 1)] when flags has COLWISE, else 0
    qt_group_desc group;
    uint32_t rows, cols;
    uint32_t dtype;      // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t flags;      // QT_NVFP4_COLWISE | QT_NVFP4_RHT
    uint32_t rht_signs;  // low 16 bits
    uint32_t reserved;
} nvfp4_amax_args;
QT_STATIC_ASSERT(sizeof(nvfp4_amax_args) == 72, "nvfp4_amax_args layout");

typedef struct nvfp4_quantize_args {
    uint64_t x;           // [rows][cols] bf16 | f32
    uint64_t row_data;    // u8 [rows][ceil(cols/2)]      (ROWWISE; ROW_VALUES: bf16 [rows][cols])
    uint64_t row_scales;  // e4m3 [rows][ceil(cols/16)]   (ROWWISE, not ROW_VALUES)
    uint64_t col_data;    // u8 [cols][ceil(rows/2)]      (COLWISE; COL_VALUES: bf16 [cols][rows])
    uint64_t col_scales;  // e4m3 [cols][ceil(rows/16)]   (COLWISE, not COL_VALUES)
    uint64_t amax_row;    // f32 [max(count, 1)]          (ROWWISE)
    uint64_t amax_col;    // f32 [max(count, 1)]          (COLWISE)
    uint64_t step;        // u64 device step counter      (SR)
    uint64_t seed;        // SR key
    qt_group_desc group;
    uint32_t rows, cols;
    uint32_t dtype;
    uint32_t flags;
    uint32_t rht_signs;
    uint32_t tensor_id;  // SR stream; the columnwise stream adds QT_QUANT_TENSOR_COLWISE
} nvfp4_quantize_args;
QT_STATIC_ASSERT(sizeof(nvfp4_quantize_args) == 120, "nvfp4_quantize_args layout");

typedef struct nvfp4_dequantize_args {
    uint64_t data;    // rowwise u8 [rows][ceil(cols/2)] or columnwise u8 [cols][ceil(rows/2)]
    uint64_t scales;  // rowwise e4m3 [rows][ceil(cols/16)] or columnwise [cols][ceil(rows/16)]
    uint64_t amax;    // f32 [max(count, 1)]: the direction's global amax
    uint64_t out;     // [rows][cols] bf16 | f32 (rows at or past the active rows: not written)
    qt_group_desc group;
    uint32_t rows, cols;
    uint32_t out_dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t colwise;    // 1: data and scales are the columnwise (transposed) set
} nvfp4_dequantize_args;
QT_STATIC_ASSERT(sizeof(nvfp4_dequantize_args) == 72, "nvfp4_dequantize_args layout");

// qt_nvfp4_decode: one stored NVFP4 copy (rowwise [rows][k], or the transposed columnwise set,
// whose rows are the tensor's columns) decoded in its own orientation to BF16 [rows][k], each
// element the raw decode e2m1 x e4m3 block scale (qt_nvfp4_raw_value, exact in BF16): the K-major
// BF16 operand that gives a BF16 GEMM with GEMM_FLAG_ALPHA_NVFP4 the NVFP4 GEMM's bits. One
// thread per 16-element block, reading its codes and scale once and writing whole rows of
// blocks, so the pass streams at memory speed in both orientations. Dense tensors only.
typedef struct nvfp4_decode_args {
    uint64_t data;    // u8 [rows][ceil(k/2)], even k in the low nibble
    uint64_t scales;  // e4m3 [rows][ceil(k/16)]
    uint64_t out;     // bf16 [rows][k]
    uint32_t rows, k;
} nvfp4_decode_args;
QT_STATIC_ASSERT(sizeof(nvfp4_decode_args) == 32, "nvfp4_decode_args layout");

// Launch geometry, shared by the kernels and their op builders (runtime/ops/op_quant_nvfp4.c).
#define QT_NVFP4_THREADS 256u
// qt_nvfp4_amax: a CTA covers 16 rows x (256 threads x one 16-byte chunk) columns per row block
// and strides over row blocks; about QT_NVFP4_AMAX_CTAS CTAs in all (4 waves of 2 per SM on a
// 132-SM GPU), so that each reduces and updates the global amax once per member, not per block.
#define QT_NVFP4_AMAX_COLS(esize) (QT_NVFP4_THREADS * 16u / (esize))
#define QT_NVFP4_AMAX_CTAS 1056u
// qt_nvfp4_quantize: a CTA covers a 128 x 64 tile per iteration; dynamic shared memory holds the
// input tile, the staged columnwise codes (64 columns x 64 bytes) and scales (64 x 8).
#define QT_NVFP4_QUANT_TILE_ROWS 128u
#define QT_NVFP4_QUANT_TILE_COLS 64u
#define QT_NVFP4_QUANT_SMEM(esize) (128u * 64u * (esize) + 64u * 64u + 64u * 8u)
// qt_nvfp4_quantize_bf16: the same tile, its columnwise codes and scales double-buffered.
#define QT_NVFP4_QUANT_BF16_SMEM (128u * 64u * 2u + 2u * (64u * 64u + 64u * 8u))
// qt_nvfp4_quantize_f32_2d: the same for an FP32 tile.
#define QT_NVFP4_QUANT_F32_SMEM (128u * 64u * 4u + 2u * (64u * 64u + 64u * 8u))
// qt_nvfp4_dequantize: a CTA covers 16 rows x 256 columns per iteration.
#define QT_NVFP4_DEQUANT_COLS QT_NVFP4_THREADS

#define QT_KERNELS_QUANT_NVFP4(X)                                                  \
    X(KERNEL_NVFP4_AMAX_ZERO, quant_nvfp4, qt_nvfp4_amax_zero, nvfp4_amax_args)    \
    X(KERNEL_NVFP4_AMAX, quant_nvfp4, qt_nvfp4_amax, nvfp4_amax_args)              \
    X(KERNEL_NVFP4_QUANTIZE, quant_nvfp4, qt_nvfp4_quantize, nvfp4_quantize_args)  \
    X(KERNEL_NVFP4_QUANTIZE_BF16, quant_nvfp4, qt_nvfp4_quantize_bf16, nvfp4_quantize_args) \
    X(KERNEL_NVFP4_QUANTIZE_BF16_SR, quant_nvfp4, qt_nvfp4_quantize_bf16_sr, nvfp4_quantize_args) \
    X(KERNEL_NVFP4_QUANTIZE_F32_2D, quant_nvfp4, qt_nvfp4_quantize_f32_2d, nvfp4_quantize_args) \
    X(KERNEL_NVFP4_DEQUANTIZE, quant_nvfp4, qt_nvfp4_dequantize, nvfp4_dequantize_args) \
    X(KERNEL_NVFP4_DECODE, quant_nvfp4, qt_nvfp4_decode, nvfp4_decode_args)

#if defined(__CUDA_ARCH__)
#define QT_NVFP4_UNROLL _Pragma("unroll")
#else
#define QT_NVFP4_UNROLL
#endif

// ---------------------------------------------------------------------------------------------
// Row blocks and members.

typedef struct qt_nvfp4_span {
    uint32_t member;     // index into the per-member amax arrays
    uint32_t valid_end;  // absolute row: data below, zero from here on
    uint32_t store_end;  // absolute row: positions below are written; 0 = block not active
} qt_nvfp4_span;

// The span of the 16-row block starting at `row` (a multiple of 16). Grouped: the member is the
// largest i < count with row_offsets[i] <= row (binary search, as TE's grouped kernels do), which
// skips empty members (equal offsets); offsets past `rows` are clamped so that bad device data
// cannot make a kernel write outside its buffers.
QT_HD qt_nvfp4_span qt_nvfp4_span_of(const uint32_t *row_offsets, const uint32_t *first_dims,
                                     uint32_t count, uint32_t rows, uint32_t row) {
    qt_nvfp4_span span = {0, 0, 0};
    if (count == 0) {
        if (row < rows) span.valid_end = span.store_end = rows;
        return span;
    }
    uint32_t limit = row_offsets[count] < rows ? row_offsets[count] : rows;
    if (row >= limit) return span;
    uint32_t lo = 0, hi = count - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (row_offsets[mid] <= row) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    uint32_t begin = row_offsets[lo];
    uint32_t end = row_offsets[lo + 1] < limit ? row_offsets[lo + 1] : limit;
    uint32_t valid = first_dims[lo] < end - begin ? first_dims[lo] : end - begin;
    span.member = lo;
    span.valid_end = begin + valid;
    span.store_end = end;
    return span;
}

// ---------------------------------------------------------------------------------------------
// Scales.

// What a direction's global amax contributes to every block: c = RN(S_enc * f32(1/6)) and
// S_dec = RN(1 / S_enc), with S_enc = RN(2688 / amax) clamped as TE's
// compute_global_encode_scaling_factor_FP4 does: fminf(S_enc, FLT_MAX) (a NaN amax, which the
// amax kernel cannot produce, lands on FLT_MAX like fminf's), then 1 when amax is 0 or S_enc is
// 0 (amax = +Inf).
typedef struct qt_nvfp4_scale {
    float c;
    float s_dec;
} qt_nvfp4_scale;

QT_HD float qt_nvfp4_s_enc(float amax) {
    float s_enc = 2688.0f / amax;  // one IEEE division on both sides (-prec-div=true)
    if (!(s_enc <= QT_F32_FLT_MAX)) s_enc = QT_F32_FLT_MAX;
    if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
    return s_enc;
}

QT_HD qt_nvfp4_scale qt_nvfp4_scale_of(float amax) {
    float s_enc = qt_nvfp4_s_enc(amax);
    qt_nvfp4_scale s = {s_enc * QT_F32_INV_6, 1.0f / s_enc};
    return s;
}

// The fast paths below replace generic codec calls on the per-block and per-element paths of the
// fused cast, which is compute-bound: each equals the qt_codec.h function named in its comment
// on its whole input domain, which tests/test_quant_nvfp4.c checks exhaustively (or over every
// pattern of the binades that matter plus samples of all others). Both backends call them.

// min(a, b) and max(a, b) of non-NaN operands (one VIMNMX, or one select on the host).
QT_HD uint32_t qt_nvfp4_umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// |x| (the device folds it into the consuming FADD or FMNMX as an operand modifier).
QT_HD float qt_nvfp4_fabs(float x) {
#if defined(__CUDA_ARCH__)
    return fabsf(x);
#else
    return qt_bits_f32(qt_f32_bits(x) & QT_F32_ABS);
#endif
}

// qt_f32_to_e4m3(d) for d >= 0 that is not NaN (+Inf included): saturate to 448, then round to
// the E4M3 grid by one addition of M = 1.5 * 2^23 * step, step = 2^(max(E, 121) - 130) (the
// subnormals and the first normal binade share the step 2^-9), exactly as qt_nvfp4_e2m1_rn does
// for E2M1; the code is k + 8 * (max(E, 121) - 121) with k the sum's offset from M in ulps.
QT_HD uint8_t qt_nvfp4_e4m3_nonneg(float d) {
    float a = d <= 448.0f ? d : 448.0f;
    uint32_t m = qt_nvfp4_umax((qt_f32_bits(a) & 0x7F800000u) + 0x0A400000u, 0x46C00000u);
    uint32_t t = qt_f32_bits(a + qt_bits_f32(m));
    return (uint8_t)(t - m + (m >> 20) - 1132u);  // (m >> 20) - 1132 = 8 * (E' - 121)
}

// qt_e4m3_to_f32(sb) for codes 0..0x7E (non-negative, not NaN): the code's exponent and mantissa
// bits placed at FP32's exponent and mantissa positions read as an FP32 with bias 127 instead of
// 7 (E4M3 subnormals land on FP32 subnormals), then one exact multiplication by 2^120.
QT_HD float qt_nvfp4_e4m3_value(uint8_t sb) {
    return qt_bits_f32((uint32_t)sb << 20) * qt_bits_f32(0x7B800000u);  // 2^120
}

// RN(1 / x): the device's __frcp_rn is the correctly rounded reciprocal, like the host division.
QT_HD float qt_nvfp4_rcp(float x) {
#if defined(__CUDA_ARCH__)
    return __frcp_rn(x);
#else
    return 1.0f / x;
#endif
}

// satE4M3 of two values at once, d0 in the low byte, d1 in the next: one cvt.rn.satfinite on the
// device (checked equal to qt_f32_to_e4m3 bit for bit; quant_block.h relies on the
// same), the codec on the host. For d >= 0 both equal qt_nvfp4_e4m3_nonneg (tested exhaustively).
QT_HD uint32_t qt_nvfp4_e4m3x2(float d0, float d1) {
#if defined(__CUDA_ARCH__)
    uint16_t packed;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(d1), "f"(d0));
    return packed;
#else
    return (uint32_t)qt_f32_to_e4m3(d0) | (uint32_t)qt_f32_to_e4m3(d1) << 8;
#endif
}

// Stored block scale sb = satE4M3(RN(amax_b * c)). amax_b >= 0 and c is finite, so d is never
// NaN and sb is never a NaN code.
QT_HD uint8_t qt_nvfp4_block_scale(float amax_b, qt_nvfp4_scale s) {
    return (uint8_t)qt_nvfp4_e4m3x2(amax_b * s.c, 0.0f);
}

// Element multiplier m_b = min(RN(1 / RN(float(sb) * S_dec)), FLT_MAX); FLT_MAX when sb == 0,
// so that a block whose scale underflowed saturates its non-zero elements.
QT_HD float qt_nvfp4_block_mult(uint8_t sb, float s_dec) {
    if (sb == 0) return QT_F32_FLT_MAX;
    float m = qt_nvfp4_rcp(qt_nvfp4_e4m3_value(sb) * s_dec);
    return m <= QT_F32_FLT_MAX ? m : QT_F32_FLT_MAX;
}

// Dequantization scale RN(RN(float(sb) * amax) * f32(1/2688)), in this order, as TE dequantizes.
QT_HD float qt_nvfp4_dequant_scale(uint8_t sb, float amax) {
    return (qt_e4m3_to_f32(sb) * amax) * QT_F32_INV_2688;
}

// One dequantized element e2m1(q) * scale. A NaN product (a scale of 0 * Inf when amax is +Inf,
// or an Inf scale times a zero code) is written as the canonical 0x7FFFFFFF, which is what the
// GPU's multiply returns for any NaN; x86's would be its default NaN 0xFFC00000 (or an operand's
// payload), so the choice is made here, on both backends (as qt_block_dequantize does).
QT_HD float qt_nvfp4_dequant_value(uint8_t nibble, uint8_t sb, float amax) {
    float v = qt_e2m1_to_f32(nibble) * qt_nvfp4_dequant_scale(sb, amax);
    return qt_f32_is_nan(v) ? qt_bits_f32(QT_F32_ABS) : v;
}

// The element without the global factor: e2m1 (2 significant bits) x e4m3 (4) is exact in FP32
// and in BF16, the value the NVFP4 GEMMs decode (gemm.h, qt_gemm_nvfp4_decode). A NaN block
// scale (never written by the quantizer) gives the canonical NaN, as above.
QT_HD float qt_nvfp4_raw_value(uint8_t nibble, uint8_t sb) {
    float v = qt_e2m1_to_f32(nibble) * qt_e4m3_to_f32(sb);
    return qt_f32_is_nan(v) ? qt_bits_f32(QT_F32_ABS) : v;
}

// Block b (16 elements from k = 16 (b % blocks per row)) of qt_nvfp4_decode, the same on both
// backends: element j of the block is written as the BF16 bits of its raw decode.
QT_HD void qt_nvfp4_decode_block(const nvfp4_decode_args *a, uint64_t b) {
    uint32_t per_row = (a->k + 15) / 16;
    uint64_t row = b / per_row;
    uint32_t k0 = (uint32_t)(b % per_row) * 16u;
    const uint8_t *codes = (const uint8_t *)(uintptr_t)a->data + row * ((a->k + 1ull) / 2);
    uint8_t sb = ((const uint8_t *)(uintptr_t)a->scales)[row * per_row + k0 / 16];
    uint16_t *out = (uint16_t *)(uintptr_t)a->out + row * a->k;
    uint32_t n = a->k - k0 < 16u ? a->k - k0 : 16u;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t k = k0 + j;
        uint8_t nibble = (uint8_t)((codes[k / 2] >> (4 * (k & 1))) & 0xFu);
        out[k] = qt_f32_to_bf16(qt_nvfp4_raw_value(nibble, sb));
    }
}

// ---------------------------------------------------------------------------------------------
// Elements.

// acc = max(acc, |v|) with fmaxf semantics: a NaN v is ignored. acc is never NaN or
// negative, so the host's compare-select returns what the device's FMNMX does.
QT_HD float qt_nvfp4_absmax(float acc, float v) {
#if defined(__CUDA_ARCH__)
    return fmaxf(acc, fabsf(v));
#else
    float a = qt_bits_f32(qt_f32_bits(v) & QT_F32_ABS);
    return a > acc ? a : acc;
#endif
}

// max(min(y, 6), -6) with IEEE minNum/maxNum semantics: NaN becomes +6. One FMNMX each on the
// device; the host's compare-selects agree for every y because the constants are neither NaN
// nor zero.
QT_HD float qt_nvfp4_clamp6(float y) {
#if defined(__CUDA_ARCH__)
    return fmaxf(fminf(y, 6.0f), -6.0f);
#else
    float s = y <= 6.0f ? y : 6.0f;
    return s >= -6.0f ? s : -6.0f;
#endif
}

// satE2M1 with round to nearest even: equal to qt_f32_to_e2m1(y) for every FP32 y (tests/
// test_quant_nvfp4.c checks it over every pattern of the relevant binades and samples of all
// others), in about a third of the operations, which matters because the fused cast is
// compute-bound. After clamping to [-6, 6] (NaN -> +6), |s| is rounded to the E2M1 grid by one
// FP32 addition of M = 1.5 * 2^23 * step, where step = 0.5 below 2 (the subnormals and the
// binade [1, 2)), 1 in [2, 4) and 2 in [4, 6]: the sum lies in M's binade, whose ulp is the step,
// so the addition rounds |s| to a multiple of the step with ties to even (M is an even multiple).
// The sum's bit pattern is then M's plus k = |s| / step rounded, and the code is
// k + 2 * (E - 127), E = max(biased exponent of |s|, 127).
QT_HD uint32_t qt_nvfp4_e2m1_rn(float y) {
    uint32_t s = qt_f32_bits(qt_nvfp4_clamp6(y));
    uint32_t e = s & 0x7F800000u;
    e = e > 0x3F800000u ? e : 0x3F800000u;
    uint32_t m = e + 0x0B400000u;  // exponent E + 22, mantissa 1.5
    float t = qt_bits_f32(s & QT_F32_ABS) + qt_bits_f32(m);
    uint32_t code = qt_f32_bits(t) - m + (e >> 22) - 254u;
    return code | ((s >> 28) & 8u);
}

// 8 codes q_j = qt_nvfp4_e2m1_rn(v_j * m) packed into one word (element j in nibble j), with the
// arithmetic of qt_nvfp4_e2m1_rn rearranged to fewer device instructions: the sum t's bit pattern
// is m + k with m's low 22 bits zero, so (t >> 22) + (t & 7) = k + 2E' + 45 = code + 299; these
// biased codes are added at their nibbles (one shift-add each) and the bias, 299 per nibble, is
// taken off once, modulo 2^32, before the sign bits are merged in.
QT_HD uint32_t qt_nvfp4_encode8(const float *v, float m) {
    uint32_t codes = 0, signs = 0;
    QT_NVFP4_UNROLL
    for (int j = 0; j < 8; j++) {
        float s = qt_nvfp4_clamp6(v[j] * m);
        uint32_t bits = qt_f32_bits(s);
        uint32_t mb = qt_nvfp4_umax((bits & 0x7F800000u) + 0x0B400000u, 0x4AC00000u);
        uint32_t t = qt_f32_bits(qt_nvfp4_fabs(s) + qt_bits_f32(mb));
        codes += ((t >> 22) + (t & 7u)) << (4 * j);
        signs |= (bits >> (28 - 4 * j)) & (8u << (4 * j));
    }
    return (codes - 299u * 0x11111111u) | signs;
}

// 16 codes of one block with multiplier m: q_j = satE2M1(RN(v_j * m)) in nibble j of out.
QT_HD void qt_nvfp4_encode16(const float v[16], float m, uint32_t out[2]) {
    out[0] = qt_nvfp4_encode8(v, m);
    out[1] = qt_nvfp4_encode8(v + 8, m);
}

// A zero RHT output is +0 (qtrain's rule, recipes/NUMERICS.md "Random Hadamard transform"):
// the transform's sum accumulated from +0, as a tensor-core product is, is never -0, while the
// butterflies give -0 where only zeros of certain signs meet (an all-zero group holding -0, for
// one). One IEEE addition of +0 does it: -0 + +0 = +0 and x + 0 = x for every other x.
// __fadd_rn is never contracted or dropped; the host compiler keeps x + 0.0f because it would
// change -0 (no -ffast-math, so signed zeros are honoured).
QT_HD float qt_nvfp4_rht_plus_zero(float y) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(y, 0.0f);
#else
    return y + 0.0f;
#endif
}

// qt_f32_to_e2m1_sr(y, r8) for every FP32 y and byte r8 (tests/test_quant_nvfp4.c checks it),
// without branches or the codec's division, which both backends' encoders take: gradients' casts
// with stochastic rounding are compute-bound on the GPU as on the CPU, where this form runs 8
// elements per vector instruction. The codec
// truncates t = fma(u, s(a), a) to the grid below it, floor(t / s(t)) s(t) capped at 6: in each
// of [0, 2), [2, 4) and [4, inf) that is the largest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 not above t,
// and the code of grid point i is i, so the code is the count of the nonzero grid points not
// above t. t >= 0 is never NaN (a is not, and u s(a) is finite); a NaN y gives +6 (0x7) like the
// codec's, and the sign of anything else is y's. s(a) = 0.5 + 0.5 [a >= 2] + [a >= 4], exactly.
QT_HD uint32_t qt_nvfp4_e2m1_sr_select(float y, uint32_t r8) {
    uint32_t bits = qt_f32_bits(y);
    float a = qt_bits_f32(bits & QT_F32_ABS);
    float u = (float)(r8 & 0xFFu) * 0.00390625f;  // r8 / 256, exact
    float step = 0.5f + 0.5f * (float)(a >= 2.0f) + (float)(a >= 4.0f);
    float t = qt_fmaf(u, step, a);
    uint32_t code = (uint32_t)(t >= 0.5f) + (uint32_t)(t >= 1.0f) + (uint32_t)(t >= 1.5f) +
                    (uint32_t)(t >= 2.0f) + (uint32_t)(t >= 3.0f) + (uint32_t)(t >= 4.0f) +
                    (uint32_t)(t >= 6.0f);
    uint32_t number = (uint32_t)((bits & QT_F32_ABS) <= QT_F32_INF) * 0xFFFFFFFFu;  // all ones
    return ((code | ((bits >> 28) & 0x8u)) & number) | (0x7u & ~number);
}

// 16 codes of one block with multiplier m and stochastic rounding, element j with random byte j
// of r (ptx/quant.h): q_j = qt_f32_to_e2m1_sr(v_j * m, byte j), through qt_nvfp4_e2m1_sr_select
// (the form both backends' casts take; tests/test_quant_nvfp4.c checks it against the codec).
// On the host the random bytes are taken apart first (byte j as qt_quant_random_byte gives it),
// then the codes are computed side by side (vector instructions) and packed; a kernel packs each
// code as it comes, so that no 16-entry arrays hold registers.
QT_HD void qt_nvfp4_encode16_sr_select(const float v[16], float m, qt_philox4 r,
                                       uint32_t out[2]) {
#if defined(__CUDA_ARCH__)
    uint32_t w0 = 0, w1 = 0;
    QT_NVFP4_UNROLL
    for (uint32_t j = 0; j < 8; j++) {
        w0 |= qt_nvfp4_e2m1_sr_select(v[j] * m, qt_quant_random_byte(r, j)) << (4 * j);
        w1 |= qt_nvfp4_e2m1_sr_select(v[j + 8] * m, qt_quant_random_byte(r, j + 8)) << (4 * j);
    }
    out[0] = w0;
    out[1] = w1;
#else
    uint32_t codes[16];
    uint8_t bytes[16];
    for (uint32_t i = 0; i < 4; i++) {
        for (uint32_t b = 0; b < 4; b++) bytes[4 * i + b] = (uint8_t)(r.v[i] >> (8 * b));
    }
    for (uint32_t j = 0; j < 16; j++) codes[j] = qt_nvfp4_e2m1_sr_select(v[j] * m, bytes[j]);
    for (uint32_t h = 0; h < 2; h++) {
        uint32_t w = 0;
        for (uint32_t j = 0; j < 8; j++) w |= codes[8 * h + j] << (4 * j);
        out[h] = w;
    }
#endif
}

// Rounds a pair of RHT outputs (FP32) to BF16 (RN, Inf past BF16_MAX, subnormals kept, a zero
// made +0 first) and back. The device uses one cvt.rn.bf16x2.f32, which gives qt_f32_to_bf16's
// bits for every input (NaN: 0x7FFF).
QT_HD void qt_nvfp4_round_bf16_pair(float *lo, float *hi) {
    float y0 = qt_nvfp4_rht_plus_zero(*lo), y1 = qt_nvfp4_rht_plus_zero(*hi);
#if defined(__CUDA_ARCH__)
    uint32_t packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(y1), "f"(y0));
    *lo = __uint_as_float(packed << 16);
    *hi = __uint_as_float(packed & 0xFFFF0000u);
#else
    *lo = qt_bf16_to_f32(qt_f32_to_bf16(y0));
    *hi = qt_bf16_to_f32(qt_f32_to_bf16(y1));
#endif
}

// The radix-2 butterfly stages of the fast Walsh-Hadamard transform from pair distance `first`
// (1: all four; 2: the three after a first stage done otherwise) to 8, in place.
QT_HD void qt_nvfp4_butterflies(float v[16], int first) {
    QT_NVFP4_UNROLL
    for (int h = first; h < 16; h <<= 1) {
        QT_NVFP4_UNROLL
        for (int i = 0; i < 16; i++) {
            if ((i & h) == 0) {
                float a = v[i], b = v[i + h];
                v[i] = a + b;
                v[i + h] = a - b;
            }
        }
    }
}

// The 16 values of a group rounded to BF16 (kept as FP32), a pair at a time.
QT_HD void qt_nvfp4_round_bf16_16(float v[16]) {
    QT_NVFP4_UNROLL
    for (int j = 0; j < 16; j += 2) qt_nvfp4_round_bf16_pair(&v[j], &v[j + 1]);
}

// The RHT of one group (see the top of this file for the order) in FP32, before the rounding to
// BF16, in place.
QT_HD void qt_nvfp4_rht16_f32(float v[16], uint32_t signs) {
    QT_NVFP4_UNROLL
    for (int k = 0; k < 16; k++) v[k] = v[k] * (((signs >> k) & 1u) ? -0.25f : 0.25f);
    qt_nvfp4_butterflies(v, 1);
}

// The RHT of one group, rounded to BF16, in place.
QT_HD void qt_nvfp4_rht16(float v[16], uint32_t signs) {
    qt_nvfp4_rht16_f32(v, signs);
    qt_nvfp4_round_bf16_16(v);
}

// ---------------------------------------------------------------------------------------------
// The fast block encoder of the fused cast (RN, no 2-D, no SR), which is instruction-bound: every
// element costs four FMA-pipe operations and two integer minima, with no clamp, no sign or NaN
// test and no exponent arithmetic per element. It applies to a block whose values hold no NaN
// and whose scale byte is normal and not saturated (qt_nvfp4_fast_ok): then |RN(x * m_b)| < 7
// (below), and every other block takes qt_nvfp4_encode16. qt_nvfp4_encode16_rn chooses; both
// give qt_f32_to_e2m1(RN(x * m_b)) for every element (tests/test_quant_nvfp4.c checks the
// magnitude function on every FP32 value in [0, 7) and the packing on random blocks).
//
// Why |y| < 7, y = RN(x m_b): sb normal (0x08..0x7D) is RN_E4M3(d) with relative error at most
// 2^-4 and no saturation, d = RN(amax_b c), c = RN(S_enc f32(1/6)), m_b <= RN(1 / RN(sb S_dec))
// (the FLT_MAX clamp only lowers it) and S_dec = RN(1 / S_enc). So |y| <= amax_b m_b (1 + 2^-24)
// <= 6 / (1 - 2^-4) (1 + 2^-15) < 6.41; the 2^-15 covers a subnormal S_dec or sb S_dec (then
// at least 2^-134, 16 significant bits).

#define QT_NVFP4_MAGIC_BITS 0x4B400000u  // 1.5 * 2^23: its ulp is 1, so a + magic rounds to int

// Whether a block with scale byte sb (and no NaN) may use the fast encoder.
QT_HD int qt_nvfp4_fast_ok(uint32_t sb) { return sb >= 0x08u && sb <= 0x7Du; }

// The E2M1 magnitude code of a in [0, 7), biased: the result is QT_NVFP4_MAGIC_BITS + code. E2M1
// rounding to nearest even is RN_int(2 phi(a)) with phi(a) = min(a, (a + 2) / 2, (a + 8) / 4), the
// concave piecewise-linear map that sends the grid 0, 0.5, ..., 2, 3, 4, 6 to multiples of 0.5 and
// the ties 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 to odd multiples of 0.25, where ties to the even
// integer pick the even code. RN_int is monotone, so the code is the least of RN_int(2a),
// RN_int(a) + 2 and RN_int(a / 2) + 4, each one FP32 operation with the magic addend (a single
// rounding of an exact value; the magic is even, so ties keep their parity), compared as integers.
QT_HD uint32_t qt_nvfp4_e2m1_biased(float a) {
    const float magic = qt_bits_f32(QT_NVFP4_MAGIC_BITS);
    uint32_t t1 = qt_f32_bits(qt_fmaf(a, 2.0f, magic));
    uint32_t t2 = qt_f32_bits(a + magic) + 2u;
    uint32_t t3 = qt_f32_bits(qt_fmaf(a, 0.5f, magic)) + 4u;
    uint32_t t = t1 < t2 ? t1 : t2;
    return t < t3 ? t : t3;
}

// Eight biased codes b[j] into nibble j of a word: sum b[j] 16^j modulo 2^32 less the biases' sum.
QT_HD uint32_t qt_nvfp4_pack8(const uint32_t b[8]) {
    uint32_t acc = b[0] - QT_NVFP4_MAGIC_BITS * 0x11111111u;
    QT_NVFP4_UNROLL
    for (int j = 1; j < 8; j++) acc += b[j] << (4 * j);
    return acc;
}

// prmt.b32 in its default mode: result byte i is byte (sel >> 4i) & 7 of b:a (a holds bytes
// 0..3), replaced by 0xFF or 0x00 after that byte's sign bit when bit 3 of the nibble is set. The
// host runs this emulation, so the CPU tests exercise the selectors the device uses.
QT_HD uint32_t qt_nvfp4_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
#else
    uint64_t src = (uint64_t)b << 32 | a;
    uint32_t d = 0;
    for (int i = 0; i < 4; i++) {
        uint32_t s = (sel >> (4 * i)) & 0xFu;
        uint32_t byte = (uint32_t)(src >> (8 * (s & 7u))) & 0xFFu;
        if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
        d |= byte << (8 * i);
    }
    return d;
#endif
}

// Packed codes of 8 BF16 values w[0..3] (element 2i in the low half of w[i]) with their sign bits
// set (bit 4j + 3 for element j): the high bytes of the even elements, sign-replicated, and of the
// odd ones are gathered byte-wise, so that two masked ORs place all eight signs.
QT_HD uint32_t qt_nvfp4_signs_bf16(uint32_t codes, const uint32_t w[4]) {
    uint32_t p01 = qt_nvfp4_prmt(w[0], w[1], 0x7351u);  // high bytes of x0, x2, x1, x3
    uint32_t p23 = qt_nvfp4_prmt(w[2], w[3], 0x7351u);  // x4, x6, x5, x7
    uint32_t even = qt_nvfp4_prmt(p01, p23, 0xDC98u);   // x0, x2, x4, x6: 0xFF if negative
    uint32_t odd = qt_nvfp4_prmt(p01, p23, 0x7632u);    // x1, x3, x5, x7
    return codes | (even & 0x08080808u) | (odd & 0x80808080u);
}

// max.NaN.xorsign.abs.bf16x2: per half, max(|a|, |b|) with the XOR of the signs, or a NaN if
// either is NaN. Only the magnitude and NaN-ness are used below.
QT_HD uint32_t qt_nvfp4_absmax_nan_bf16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    uint32_t d;
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#else
    uint32_t d = 0;
    for (int h = 0; h < 2; h++) {
        uint32_t x = (a >> (16 * h)) & 0xFFFFu, y = (b >> (16 * h)) & 0xFFFFu;
        uint32_t mx = x & 0x7FFFu, my = y & 0x7FFFu;
        uint32_t r = mx > 0x7F80u || my > 0x7F80u ? 0x7FFFu
                                                  : (mx > my ? mx : my) | ((x ^ y) & 0x8000u);
        d |= r << (16 * h);
    }
    return d;
#endif
}

// max |x| over 16 BF16 values w[0..7] as FP32, or a NaN when any of them is NaN (the caller then
// takes the generic path, whose amax ignores NaN). Exact: a maximum of BF16 magnitudes.
QT_HD float qt_nvfp4_absmax16_bf16(const uint32_t w[8]) {
    uint32_t m0 = qt_nvfp4_absmax_nan_bf16x2(w[0], w[1]);
    uint32_t m1 = qt_nvfp4_absmax_nan_bf16x2(w[2], w[3]);
    uint32_t m2 = qt_nvfp4_absmax_nan_bf16x2(w[4], w[5]);
    uint32_t m3 = qt_nvfp4_absmax_nan_bf16x2(w[6], w[7]);
    m0 = qt_nvfp4_absmax_nan_bf16x2(qt_nvfp4_absmax_nan_bf16x2(m0, m1),
                                    qt_nvfp4_absmax_nan_bf16x2(m2, m3));
    m0 = qt_nvfp4_absmax_nan_bf16x2(m0, qt_nvfp4_prmt(m0, 0, 0x1032u));  // both halves
    return qt_bits_f32(m0 & 0x7FFF0000u);
}

// |x| of the low and high BF16 halves of w as FP32 (the device folds the low one's |.| into the
// consuming multiply; RN(|x| m) = |RN(x m)|).
QT_HD float qt_nvfp4_bf16_lo_abs(uint32_t w) { return qt_nvfp4_fabs(qt_bits_f32(w << 16)); }
QT_HD float qt_nvfp4_bf16_hi_abs(uint32_t w) { return qt_bits_f32(w & 0x7FFF0000u); }

// Fast encoder (see above) for 16 BF16 values packed in w[0..7].
QT_HD void qt_nvfp4_encode16_bf16(const uint32_t w[8], float m, uint32_t out[2]) {
    QT_NVFP4_UNROLL
    for (int h = 0; h < 2; h++) {
        uint32_t b[8];
        QT_NVFP4_UNROLL
        for (int i = 0; i < 4; i++) {
            b[2 * i] = qt_nvfp4_e2m1_biased(qt_nvfp4_bf16_lo_abs(w[4 * h + i]) * m);
            b[2 * i + 1] = qt_nvfp4_e2m1_biased(qt_nvfp4_bf16_hi_abs(w[4 * h + i]) * m);
        }
        out[h] = qt_nvfp4_signs_bf16(qt_nvfp4_pack8(b), w + 4 * h);
    }
}

// Fast encoder for 16 FP32 values (the C twin, FP32 inputs): signs from the FP32 sign bits.
QT_HD void qt_nvfp4_encode16_fast(const float v[16], float m, uint32_t out[2]) {
    QT_NVFP4_UNROLL
    for (int h = 0; h < 2; h++) {
        uint32_t b[8], signs = 0;
        QT_NVFP4_UNROLL
        for (int j = 0; j < 8; j++) {
            b[j] = qt_nvfp4_e2m1_biased(qt_nvfp4_fabs(v[8 * h + j]) * m);
            signs |= (qt_f32_bits(v[8 * h + j]) >> 31) << (4 * j + 3);
        }
        out[h] = qt_nvfp4_pack8(b) | signs;
    }
}

// The RN encoding of one block as both backends produce it: the fast encoder where it applies,
// else the generic one. The two agree wherever both apply, so this choice never shows.
QT_HD void qt_nvfp4_encode16_rn(const float v[16], float m, uint8_t sb, uint32_t out[2]) {
    int nan = 0;
    for (int j = 0; j < 16; j++) nan |= qt_f32_is_nan(v[j]);
    if (!nan && qt_nvfp4_fast_ok(sb)) {
        qt_nvfp4_encode16_fast(v, m, out);
    } else {
        qt_nvfp4_encode16(v, m, out);
    }
}

// The RHT of a group of BF16 values (qt_nvfp4_rht16's operations and order, to the bit), with
// the first butterfly stage fused with the +-1/4 products: v_i s_i is exact for a BF16 v_i (the
// smallest, 2^-133 / 4, is still an FP32 subnormal), so fma(v_i, s_i, +-v_k s_k) is the rounded
// sum RN(q_i +- q_k) of the reference. The results stay in FP32, not yet rounded to BF16
// (qt_nvfp4_pack_bf16 does that).
QT_HD void qt_nvfp4_rht16_bf16in_f32(float v[16], uint32_t signs) {
    QT_NVFP4_UNROLL
    for (int i = 0; i < 16; i += 2) {
        float si = ((signs >> i) & 1u) ? -0.25f : 0.25f;
        float sk = ((signs >> (i + 1)) & 1u) ? -0.25f : 0.25f;
        float q;
#if defined(__CUDA_ARCH__)
        // Opaque to the compiler, so that -q stays a negated FFMA operand instead of becoming a
        // second multiplication by -sk.
        asm("mul.rn.f32 %0, %1, %2;" : "=f"(q) : "f"(v[i + 1]), "f"(sk));
#else
        q = v[i + 1] * sk;
#endif
        float a = v[i];
        v[i] = qt_fmaf(a, si, q);
        v[i + 1] = qt_fmaf(a, si, -q);
    }
    qt_nvfp4_butterflies(v, 2);
}

// qt_nvfp4_rht16 for BF16 inputs, through the fused first stage (the C twin's form of the
// kernel's BF16 path; tests/test_quant_nvfp4.c checks the two agree).
QT_HD void qt_nvfp4_rht16_bf16in(float v[16], uint32_t signs) {
    qt_nvfp4_rht16_bf16in_f32(v, signs);
    qt_nvfp4_round_bf16_16(v);
}

// Rounds the 16 RHT outputs of a group to packed BF16 (element 2i low in y[i]), each zero made +0
// first (qt_nvfp4_rht_plus_zero): one cvt.rn.bf16x2.f32 per pair on the device, whose bits are
// the host's qt_f32_to_bf16's for every input (NaN: 0x7FFF).
QT_HD void qt_nvfp4_pack_bf16(const float v[16], uint32_t y[8]) {
    QT_NVFP4_UNROLL
    for (int i = 0; i < 8; i++) {
        float lo = qt_nvfp4_rht_plus_zero(v[2 * i]), hi = qt_nvfp4_rht_plus_zero(v[2 * i + 1]);
#if defined(__CUDA_ARCH__)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(y[i]) : "f"(hi), "f"(lo));
#else
        y[i] = (uint32_t)qt_f32_to_bf16(lo) | (uint32_t)qt_f32_to_bf16(hi) << 16;
#endif
    }
}

#endif  // QT_QUANT_NVFP4_H
