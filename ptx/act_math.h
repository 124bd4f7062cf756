// act_math: the activation functions of a training step, one element at a time, and the layout
// of their tables over BF16 inputs: the arithmetic that ptx/act.cu's activation kernels and
// ptx/quant_fp8.cu's activation casts (qt_fp8_act_cast_*) run and that their C twins run too.
//
// Owns nothing. Every function is computed in FP32 with the transcendentals of qt_math.h and
// explicit qt_fmaf (no contraction), so the reference backend reproduces the GPU bit for bit.
// A header of its own, below ptx/act.h, so that the casts of ptx/quant_fp8.h, which ptx/optim.h
// and so ptx/act.h include, can read the functions without a cycle of includes.
#ifndef QT_ACT_MATH_H
#define QT_ACT_MATH_H

#include "ptx/core.h"      // QT_DTYPE_BF16
#include "ptx/qt_codec.h"  // qt_f32_to_bf16, qt_bf16_to_f32
#include "ptx/qt_hd.h"     // QT_HD, qt_f32_bits, qt_bits_f32, qt_fmaf
#include "ptx/qt_math.h"   // qt_expf, qt_math_exp_core

// Activation functions (act_args.act).
#define QT_ACT_RELU 0u
#define QT_ACT_GELU 1u    // tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#define QT_ACT_SILU 2u    // x * sigmoid(x)
#define QT_ACT_SWIGLU 3u  // x = [a | b] along columns: silu(a) * b (qt_swiglu_* kernels)

// ---------------------------------------------------------------------------------------------
// Activations. Each takes v = x (+ bias), the pre-activation value in FP32.

// sqrt(2/pi), -2 sqrt(2/pi) (exactly twice the first), 0.044715 and 3 * 0.044715, each rounded
// once to FP32.
#define QT_GELU_K0 0x1.988454p-1f
#define QT_GELU_MINUS_2K0 -0x1.988454p+0f
#define QT_GELU_K1 0x1.6e4e26p-5f
#define QT_GELU_K1X3 0x1.12ba9ep-3f
#define QT_ACT_NEG_INF qt_bits_f32(0xFF800000u)
#define QT_ACT_POS_INF qt_bits_f32(0x7F800000u)

// max(x, 0) that keeps NaN (like PyTorch's clamp_min): NaN <= 0 is false. relu(-0) = +0.
QT_HD float qt_act_relu(float v) { return v <= 0.0f ? 0.0f : v; }

// GELU (tanh form) is x (1 + tanh u) / 2 with u = sqrt(2/pi) (x + 0.044715 x^3), which is the
// same function as x s with s = 1 / (1 + e), e = exp(-2u): the logistic sigmoid of 2u. That form
// needs one exponential and one division and nothing cancels in it (1 + tanh u does, for
// negative x), so it is both cheaper and more accurate than going through tanh; the kernels are
// compute-bound on this arithmetic, not on memory.
//
// e = exp(-2u), with x^3 = (x x) x; forward and backward share it so that both see the same s.
// -2u is clamped to [-104, 89], the exponential's finite range without its guards: below -104
// e^z rounds to +0 and at 89 it is +Inf (the scaling overflows), the limits, so x = +-Inf and
// x^3 = +-Inf come out right; a NaN argument becomes 89 and the callers select NaN themselves.
QT_HD float qt_act_gelu_exp(float v, float v2) {
    float z = QT_GELU_MINUS_2K0 * qt_fmaf(QT_GELU_K1, v2 * v, v);
    z = z < 89.0f ? z : 89.0f;
    z = z > -104.0f ? z : -104.0f;
    return qt_math_exp_core(z);
}

// y = x / (1 + e). Where e overflows (x below about -10) y is x / Inf = -0; -Inf gives -0 too
// (Inf / Inf would be NaN). Every NaN input gives the canonical NaN (host division would keep
// the input's payload).
QT_HD float qt_act_gelu(float v) {
    float e = qt_act_gelu_exp(v, v * v);
    float y = v / (1.0f + e);
    return v == QT_ACT_NEG_INF ? -0.0f : y;
}

// d/dx = s + x s (1 - s) 2 du, du = sqrt(2/pi) (1 + 3 * 0.044715 x^2), as s (1 + w om) with
// om = 1 - s = e s and w = 2 x du. Where om = 0 (x above about 9, +Inf included) the result is
// s = 1, the limit, without w om = Inf * 0; where e overflows, s = 0 and om would be Inf * 0:
// the result is -0 (the derivative is negative and below any FP32 there); NaN in, NaN out.
QT_HD float qt_act_gelu_grad(float v) {
    float v2 = v * v;
    float e = qt_act_gelu_exp(v, v2);
    float s = 1.0f / (1.0f + e);
    float om = e * s;
    float w = (v + v) * (QT_GELU_K0 * qt_fmaf(QT_GELU_K1X3, v2, 1.0f));
    float g = s * qt_fmaf(w, om, 1.0f);
    g = om == 0.0f ? s : g;
    return e == QT_ACT_POS_INF && v == v ? -0.0f : g;
}

// The logistic sigmoid s and 1 - s from e = exp(-|x|) in (0, 1] and d = 1 + e in (1, 2]:
// x >= 0: s = 1/d, 1 - s = e/d; x < 0: s = e/d, 1 - s = 1/d. Neither branch overflows or
// cancels, so both are within ~3 ulp everywhere.
typedef struct qt_act_sigmoid {
    float s, one_minus_s, e, d;
} qt_act_sigmoid;

QT_HD qt_act_sigmoid qt_act_sigmoid_of(float v) {
    qt_act_sigmoid r;
    r.e = qt_expf(-qt_bits_f32(qt_f32_bits(v) & 0x7FFFFFFFu));
    r.d = 1.0f + r.e;
    float e_over_d = r.e / r.d;
    float one_over_d = 1.0f / r.d;
    int negative = v < 0.0f;
    r.s = negative ? e_over_d : one_over_d;
    r.one_minus_s = negative ? one_over_d : e_over_d;
    return r;
}

// x >= 0: x / d (one rounding after e and d); x < 0: (x e) / d. -Inf: -0, the limit.
QT_HD float qt_act_silu(float v) {
    if (v == QT_ACT_NEG_INF) return -0.0f;
    qt_act_sigmoid g = qt_act_sigmoid_of(v);
    return v < 0.0f ? (v * g.e) / g.d : v / g.d;
}

// d/dx = s (1 + x (1 - s)). +Inf: 1 and -Inf: -0, the limits (x (1 - s) would be Inf * 0).
QT_HD float qt_act_silu_grad(float v) {
    if (v == QT_ACT_POS_INF) return 1.0f;
    if (v == QT_ACT_NEG_INF) return -0.0f;
    qt_act_sigmoid g = qt_act_sigmoid_of(v);
    return g.s * qt_fmaf(v, g.one_minus_s, 1.0f);
}

QT_HD float qt_act_forward(uint32_t act, float v) {
    if (act == QT_ACT_GELU) return qt_act_gelu(v);
    if (act == QT_ACT_SILU) return qt_act_silu(v);
    return qt_act_relu(v);
}

// An output amax from the input's maximum. GELU and SiLU are negative with a single lobe below
// zero, at least as deep as any of their negative values: |f(x)| <= QT_ACT_*_NEG_AMAX for every
// BF16 x < 0 (NaN aside), and rise monotonically from +0 (f(x) >= +0 and nondecreasing over BF16
// inputs x >= +0, +Inf included). Both are exact statements about qt_act_forward over the 65536
// BF16 inputs, checked one by one by test_act. Hence, for the largest non-NaN input x_max of a
// tensor: where y = f(x_max) is at least the lobe's depth, y is max |f(x)| over the tensor (a
// positive input below x_max gives at most y, a negative one at most the depth, a NaN input a NaN
// output that an amax skips). Returns that and sets *y, else returns 0 (a pass must look at every
// element). The depths are the largest |f(x)| over BF16 x < 0, in FP32.
#define QT_ACT_GELU_NEG_AMAX 0x1.5c3e14p-3f  // at x = -0x1.82p-1 (BF16 0xBF41)
#define QT_ACT_SILU_NEG_AMAX 0x1.1d2596p-2f  // at x = -0x1.48p+0 (BF16 0xBFA4)

QT_HD int qt_act_amax_from_max(uint32_t act, float x_max, float *y) {
    float depth = act == QT_ACT_GELU ? QT_ACT_GELU_NEG_AMAX
                  : act == QT_ACT_SILU ? QT_ACT_SILU_NEG_AMAX
                                       : QT_ACT_POS_INF;  // others: never
    *y = qt_act_forward(act, x_max);
    return *y >= depth && depth != QT_ACT_POS_INF;
}

// max |stored value| from m = max |v| over the FP32 values before their stores (act_args.amax,
// the activation casts' amax): rounding to BF16 is monotonic and symmetric, so the largest
// stored magnitude is m rounded.
QT_HD float qt_act_stored_amax(float m, uint32_t dtype) {
    return dtype == QT_DTYPE_BF16 ? qt_bf16_to_f32(qt_f32_to_bf16(m)) : m;
}

// d/dx of GELU or SiLU (not ReLU, whose backward selects).
QT_HD float qt_act_grad(uint32_t act, float v) {
    return act == QT_ACT_GELU ? qt_act_gelu_grad(v) : qt_act_silu_grad(v);
}

// dx for one element. ReLU selects (dy where x > 0, else +0; NaN x passes dy, as PyTorch's
// threshold_backward), so that dy = Inf or NaN at x <= 0 gives 0, not NaN.
QT_HD float qt_act_backward(uint32_t act, float v, float dy) {
    if (act == QT_ACT_GELU || act == QT_ACT_SILU) return dy * qt_act_grad(act, v);
    return v <= 0.0f ? 0.0f : dy;
}

// Tables of GELU and SiLU over BF16 inputs (qt_act_fwd_lut, qt_act_bwd_lut). An activation's
// input without a bias is a BF16 tensor (the GEMM's D), so each element is one of 65536 values,
// and a table of f(v) (forward) or f'(v) (backward: dx = dy * f'(v), the same product as
// qt_act_backward) gives the arithmetic's bits at the cost of a shared-memory load: the exact
// functions above take 60 to 70 instructions an element and made GELU compute-bound (0.34 ms
// forward on 8192 x 16384, an H200 at a fifth of its DRAM bandwidth). Each block computes its
// table with those same functions, so no value can differ from the element kernels'. The table
// holds the 16 binades [2^-12, 2^4) of both signs (16 KB), where trained pre-activations lie;
// any other value (zeros, subnormals, large magnitudes, Inf, NaN) runs the functions themselves.
#define QT_ACT_LUT_EXP_FIRST 115u  // biased FP32 exponent of 2^-12
#define QT_ACT_LUT_EXPS 16u
#define QT_ACT_LUT_SIGN_ENTRIES (QT_ACT_LUT_EXPS * 128u)  // 7 mantissa bits a binade
#define QT_ACT_LUT_ENTRIES (2u * QT_ACT_LUT_SIGN_ENTRIES)
#define QT_ACT_LUT_THREADS 1024  // one block an SM: the table's cost is paid once per block
#define QT_ACT_LUT_WARPS 32

// A BF16 word h (the low 16 bits) has an entry iff its magnitude's offset into the table's
// binades, qt_act_lut_offset(h), is below QT_ACT_LUT_SIGN_ENTRIES (it wraps below the first
// binade): then the entry is the offset with the sign as bit 11 (qt_act_lut_entry_of). The
// kernels test a chunk's eight offsets at once (one OR) and take each entry in three operations.
QT_STATIC_ASSERT(QT_ACT_LUT_SIGN_ENTRIES == 0x800u, "the sign is the entry's bit 11");
QT_HD uint32_t qt_act_lut_offset(uint32_t h) {
    return (h & 0x7FFFu) - (QT_ACT_LUT_EXP_FIRST << 7);
}

QT_HD uint32_t qt_act_lut_entry_of(uint32_t h, uint32_t offset) {
    return offset | ((h >> 4) & QT_ACT_LUT_SIGN_ENTRIES);
}

// The entry of v, a BF16 value (its low 16 FP32 bits zero), or QT_ACT_LUT_ENTRIES outside the
// table's binades.
QT_HD uint32_t qt_act_lut_entry(float v) {
    uint32_t h = qt_f32_bits(v) >> 16;
    uint32_t offset = qt_act_lut_offset(h);
    return offset < QT_ACT_LUT_SIGN_ENTRIES ? qt_act_lut_entry_of(h, offset) : QT_ACT_LUT_ENTRIES;
}

// The input of entry e < QT_ACT_LUT_ENTRIES (qt_act_lut_entry's inverse).
QT_HD float qt_act_lut_input(uint32_t e) {
    uint32_t sign = e / QT_ACT_LUT_SIGN_ENTRIES, rest = e % QT_ACT_LUT_SIGN_ENTRIES;
    uint32_t b = sign << 15 | (QT_ACT_LUT_EXP_FIRST + rest / 128u) << 7 | (rest % 128u);
    return qt_bits_f32(b << 16);
}

// Both BF16 inputs of a word w (the low half and the high half) at once, in four operations: the
// byte offsets of their entries in an FP32 table (4 x the entry; the low half's in bits 15:0 of
// *bytes, the high half's in 31:16), valid when the returned test bits are zero, which they are
// iff both inputs have an entry. The halves' offsets come from one 32-bit subtraction: a low
// half below the first binade borrows from the high half, but then its own test bits are set.
QT_HD uint32_t qt_act_lut_pair(uint32_t w, uint32_t *bytes) {
    const uint32_t first = (QT_ACT_LUT_EXP_FIRST << 7) * 0x10001u;
    uint32_t offset = (w & 0x7FFF7FFFu) - first;
    *bytes = (offset | ((w >> 4) & (QT_ACT_LUT_SIGN_ENTRIES * 0x10001u))) << 2;
    return offset & ((0x10000u - QT_ACT_LUT_SIGN_ENTRIES) * 0x10001u);
}

// A table's value for input v: f(v) forward, f'(v) backward.
QT_HD float qt_act_lut_value(uint32_t act, uint32_t backward, float v) {
    return backward ? qt_act_grad(act, v) : qt_act_forward(act, v);
}

#if defined(__CUDACC__)
// The entries' offsets of a chunk of eight BF16 inputs as loaded (element 2k is the low half of
// word k): h[k] the inputs' bits, offset[k] = qt_act_lut_offset(h[k]). Returns their OR, below
// QT_ACT_LUT_SIGN_ENTRIES iff every input of the chunk has an entry, so that the kernels test a
// chunk with one comparison.
__device__ __forceinline__ uint32_t qt_act_lut_chunk(uint4 xw, uint32_t h[8],
                                                     uint32_t offset[8]) {
    const uint32_t w[4] = {xw.x, xw.y, xw.z, xw.w};
    uint32_t any = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        h[2 * k] = w[k] & 0xFFFFu;
        h[2 * k + 1] = w[k] >> 16;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        offset[k] = qt_act_lut_offset(h[k]);
        any |= offset[k];
    }
    return any;
}

// An input outside the table: the function itself, out of line, as act.cu's table kernels do
// (the activation casts of quant_fp8.cu and quant_block.cu).
template <bool kBackward>
__device__ __noinline__ float qt_act_table_miss(uint32_t act, float v) {
    return qt_act_lut_value(act, kBackward, v);
}

// A block's table of act's values (backward: its derivative's) at the table's inputs, filled by
// `threads` threads (the block's size, a compile-time constant at every caller); the caller's
// barrier publishes it.
__device__ __forceinline__ void qt_act_table_fill(float *table, uint32_t act, bool backward,
                                                  uint32_t threads) {
    for (uint32_t e = threadIdx.x; e < QT_ACT_LUT_ENTRIES; e += threads) {
        table[e] = qt_act_lut_value(act, backward, qt_act_lut_input(e));
    }
}

// The table's value at byte offset `bytes` (qt_act_lut_pair's halves).
__device__ __forceinline__ float qt_act_table_at(const float *table, uint32_t bytes) {
    return *(const float *)((const char *)table + bytes);
}

// Eight BF16 inputs (and gradients), packed as loaded (element 2k is the low half of word k),
// -> the eight outputs in FP32 before their rounding to BF16: act.cu's table kernels' values
// (act_lut_chunk_words), with one test for the chunk (qt_act_lut_pair, two inputs an
// operation: the lookups are what the fused casts spend their issue slots on) and the
// per-element path only for a chunk with an input outside the table.
template <bool kBackward>
__device__ __forceinline__ void qt_act_table_values(uint32_t act, const float *table, uint4 xw,
                                                    uint4 dw, float f[8]) {
    const uint32_t d[4] = {dw.x, dw.y, dw.z, dw.w};
    const uint32_t w[4] = {xw.x, xw.y, xw.z, xw.w};
    uint32_t bytes[4], test = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) test |= qt_act_lut_pair(w[k], &bytes[k]);
    if (test == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            f[2 * k] = qt_act_table_at(table, bytes[k] & 0xFFFFu);
            f[2 * k + 1] = qt_act_table_at(table, bytes[k] >> 16);
        }
    } else {
        uint32_t h[8], offset[8];
        qt_act_lut_chunk(xw, h, offset);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            f[k] = offset[k] < QT_ACT_LUT_SIGN_ENTRIES
                       ? table[qt_act_lut_entry_of(h[k], offset[k])]
                       : qt_act_table_miss<kBackward>(act, __uint_as_float(h[k] << 16));
        }
    }
#pragma unroll
    for (int k = 0; k < 4 && kBackward; k++) {
        f[2 * k] = __uint_as_float(d[k] << 16) * f[2 * k];
        f[2 * k + 1] = __uint_as_float(d[k] & 0xFFFF0000u) * f[2 * k + 1];
    }
}

// The same outputs rounded to BF16 as act_store8 rounds them, packed as the inputs.
template <bool kBackward>
__device__ __forceinline__ uint4 qt_act_table_words(uint32_t act, const float *table, uint4 xw,
                                                    uint4 dw) {
    float f[8];
    qt_act_table_values<kBackward>(act, table, xw, dw, f);
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(out[k]) : "f"(f[2 * k + 1]), "f"(f[2 * k]));
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}
#endif  // __CUDACC__

#endif  // QT_ACT_MATH_H
