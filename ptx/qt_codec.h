// qt_codec: scalar converters between FP32 and every element and scale type qtrain stores
// (FP8 E4M3/E5M2, FP4 E2M1, UE8M0, BF16), plus the shared scale rule `scale_from_amax`.
//
// Owns nothing; header-only. One implementation serves host C11 (the reference backend, tests)
// and device CUDA (kernels), so both produce the same bits. To make that hold without relying on
// either compiler's conversion intrinsics, everything is integer work on the FP32 bit pattern plus
// float operations whose result is exact (or a single IEEE RN division in scale_from_amax).
//
//   code layouts (sign.exponent.mantissa, bias):  e4m3 1.4.3 b7   e5m2 1.5.2 b15
//                                                 e2m1 1.2.1 b1   e8m0 0.8.0 b127
#ifndef QT_CODEC_H
#define QT_CODEC_H

#include <stdint.h>

#include "ptx/qt_hd.h"  // QT_HD, qt_f32_bits, qt_bits_f32, qt_fmaf

#define QT_E4M3_MAX 448.0f
#define QT_E5M2_MAX 57344.0f
#define QT_E2M1_MAX 6.0f

// FP32 constants of the quantization rules, written as bit patterns so that no compiler's
// decimal parsing or constant folding is involved: f32(1/448), f32(1/57344), f32(1/6), f32(1/2688).
#define QT_F32_INV_448 qt_bits_f32(0x3B124925u)
#define QT_F32_INV_57344 qt_bits_f32(0x37924925u)
#define QT_F32_INV_6 qt_bits_f32(0x3E2AAAABu)
#define QT_F32_INV_2688 qt_bits_f32(0x39C30C31u)
#define QT_F32_FLT_MAX qt_bits_f32(0x7F7FFFFFu)
#define QT_F32_BF16_MAX qt_bits_f32(0x7F7F0000u)

#define QT_F32_SIGN 0x80000000u
#define QT_F32_ABS 0x7FFFFFFFu
#define QT_F32_INF 0x7F800000u

QT_HD int qt_f32_is_nan(float x) { return (qt_f32_bits(x) & QT_F32_ABS) > QT_F32_INF; }
QT_HD int qt_f32_is_inf(float x) { return (qt_f32_bits(x) & QT_F32_ABS) == QT_F32_INF; }

// ---------------------------------------------------------------------------------------------
// Generic small-float rounding (shared by E4M3, E5M2, E2M1).

// Rounds the finite FP32 magnitude with bits `a` to the unsigned magnitude code of a format with
// `man_bits` mantissa bits and exponent bias `bias`, to nearest, ties to the even code. The caller
// has already saturated: `a` does not exceed the format's max finite, so no rounding here can
// carry past it. Where the result is normal in the target, rounding directly on the FP32 bit
// pattern is correct because a mantissa carry moves into the exponent field, which is exactly the
// next binade's code. Below the target's min normal the value is a multiple of the target's
// subnormal step, so it is rounded as an integer quotient with an explicit ties-to-even test.
QT_HD uint32_t qt_codec_round_mag(uint32_t a, uint32_t man_bits, int32_t bias) {
    int32_t exp_field = (int32_t)(a >> 23);
    int32_t min_normal_field = 128 - bias;  // FP32 biased exponent of the target's min normal
    if (exp_field >= min_normal_field) {
        uint32_t shift = 23u - man_bits;
        uint32_t lsb = (a >> shift) & 1u;
        uint32_t rounded = a + ((1u << (shift - 1u)) - 1u) + lsb;
        return (rounded >> shift) - ((uint32_t)(127 - bias) << man_bits);
    }
    // value = m * 2^(e - 150) (FP32 subnormals use e = 1 and no implicit bit); the target's
    // subnormal step is 2^(1 - bias - man_bits), so the code is RNE(m / 2^s).
    uint32_t m = (a & 0x7FFFFFu) | (exp_field != 0 ? 0x800000u : 0u);
    int32_t e = exp_field != 0 ? exp_field : 1;
    int32_t s = 151 - bias - (int32_t)man_bits - e;  // >= 24 - man_bits >= 1
    if (s >= 25) return 0;  // m < 2^24 = half a step: rounds to zero
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;  // q == 2^man_bits is the min normal code, as it should be
}

// Decodes an unsigned finite magnitude code of the same family of formats; exact.
QT_HD float qt_codec_decode_mag(uint32_t mag, uint32_t man_bits, int32_t bias) {
    uint32_t e = mag >> man_bits;
    uint32_t m = mag & ((1u << man_bits) - 1u);
    if (e == 0) {
        // Subnormal: m * 2^(1 - bias - man_bits); a small integer times a power of two is exact.
        float step = qt_bits_f32((uint32_t)(128 - bias - (int32_t)man_bits) << 23);
        return (float)m * step;
    }
    return qt_bits_f32(((e + (uint32_t)(127 - bias)) << 23) | (m << (23u - man_bits)));
}

// ---------------------------------------------------------------------------------------------
// FP8: cvt.rn.satfinite semantics. NaN of either sign becomes the positive NaN code 0x7F;
// Inf and every finite value above max saturate to ±max with the sign kept; everything else
// rounds to nearest even, subnormals included; FP32 subnormal inputs are not flushed.

QT_HD uint8_t qt_f32_to_e4m3(float x) {
    uint32_t bits = qt_f32_bits(x);
    uint32_t a = bits & QT_F32_ABS;
    uint32_t sign = (bits >> 24) & 0x80u;
    if (a > QT_F32_INF) return 0x7F;
    if (a > 0x43E00000u) return (uint8_t)(sign | 0x7Eu);  // |x| > 448, Inf included
    return (uint8_t)(sign | qt_codec_round_mag(a, 3, 7));
}

QT_HD uint8_t qt_f32_to_e5m2(float x) {
    uint32_t bits = qt_f32_bits(x);
    uint32_t a = bits & QT_F32_ABS;
    uint32_t sign = (bits >> 24) & 0x80u;
    if (a > QT_F32_INF) return 0x7F;
    if (a > 0x47600000u) return (uint8_t)(sign | 0x7Bu);  // |x| > 57344, Inf included
    return (uint8_t)(sign | qt_codec_round_mag(a, 2, 15));
}

// Exact. 0x7F and 0xFF (the only NaN codes) decode to a NaN that keeps the code's sign.
QT_HD float qt_e4m3_to_f32(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t mag = code & 0x7Fu;
    if (mag == 0x7Fu) return qt_bits_f32(sign | QT_F32_ABS);
    return qt_bits_f32(sign | qt_f32_bits(qt_codec_decode_mag(mag, 3, 7)));
}

// Exact. 0x7C/0xFC decode to ±Inf, 0x7D..0x7F and 0xFD..0xFF to a NaN with the code's sign.
QT_HD float qt_e5m2_to_f32(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t mag = code & 0x7Fu;
    if (mag == 0x7Cu) return qt_bits_f32(sign | QT_F32_INF);
    if (mag > 0x7Cu) return qt_bits_f32(sign | QT_F32_ABS);
    return qt_bits_f32(sign | qt_f32_bits(qt_codec_decode_mag(mag, 2, 15)));
}

// ---------------------------------------------------------------------------------------------
// FP4 E2M1. Codes are returned in the low nibble; bit 3 is the sign. The format has no
// NaN or Inf: NaN of either sign becomes +6 (0x7), ±Inf and |x| > 6 become ±6.

QT_HD uint8_t qt_f32_to_e2m1(float x) {
    uint32_t bits = qt_f32_bits(x);
    uint32_t a = bits & QT_F32_ABS;
    uint32_t sign = (bits >> 28) & 0x8u;
    if (a > QT_F32_INF) return 0x7;
    if (a > 0x40C00000u) return (uint8_t)(sign | 0x7u);  // |x| > 6, Inf included
    return (uint8_t)(sign | qt_codec_round_mag(a, 1, 1));
}

QT_HD float qt_e2m1_to_f32(uint8_t nibble) {
    uint32_t sign = (uint32_t)(nibble & 0x8u) << 28;
    return qt_bits_f32(sign | qt_f32_bits(qt_codec_decode_mag(nibble & 0x7u, 1, 1)));
}

// floor() of a non-negative float (Inf passes through), by clearing fraction bits, so that no
// libm or device intrinsic is involved.
QT_HD float qt_codec_floor_nonneg(float t) {
    uint32_t a = qt_f32_bits(t);
    int32_t e = (int32_t)(a >> 23) - 127;
    if (e < 0) return 0.0f;
    if (e >= 23) return t;
    return qt_bits_f32(a & ~(0x7FFFFFu >> e));
}

// E2M1 grid step around a magnitude: 0.5 below 2, 1 in [2, 4), 2 from 4 up.
QT_HD float qt_codec_e2m1_step(float a) { return a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f); }

// Stochastic rounding with an 8-bit random value r8 (0..255), exactly TE's software recipe that
// mirrors cvt.rs: t = fma(r8/256, s(a), a); q = min(floor(t / s(t)) * s(t), 6). Adding a uniform
// fraction of the local grid step before truncating makes a magnitude between grid neighbours
// lo < a < hi round up with probability (a - lo) / (hi - lo), quantized to 1/256. Every step
// except the fma (a single rounding, the same on host and device) is exact.
QT_HD uint8_t qt_f32_to_e2m1_sr(float x, uint32_t r8) {
    uint32_t bits = qt_f32_bits(x);
    if ((bits & QT_F32_ABS) > QT_F32_INF) return 0x7;
    float a = qt_bits_f32(bits & QT_F32_ABS);
    float u = (float)(r8 & 0xFFu) * 0.00390625f;  // r8 / 256, exact
    float t = qt_fmaf(u, qt_codec_e2m1_step(a), a);
    float st = qt_codec_e2m1_step(t);
    float q = qt_codec_floor_nonneg(t / st) * st;
    if (q > 6.0f) q = 6.0f;
    uint32_t sign = (bits >> 28) & 0x8u;
    return (uint8_t)(sign | qt_codec_round_mag(qt_f32_bits(q), 1, 1));  // q is on the grid
}

// ---------------------------------------------------------------------------------------------
// UE8M0 scales.

// Rounds a non-negative v up to a power of two: clamp(ceil(log2 v), -127, 127) + 127, NaN -> 0xFF,
// +Inf -> 0xFE, 0 -> 0. Like TE's software emulation (which truncates the bits to 8), the sign
// bit is ignored, so a negative input encodes as its magnitude; amaxes are never negative.
QT_HD uint8_t qt_f32_to_e8m0(float v) {
    uint32_t a = qt_f32_bits(v) & QT_F32_ABS;
    if (a > QT_F32_INF) return 0xFF;
    if (a == QT_F32_INF) return 0xFE;
    uint32_t e = a >> 23;
    uint32_t m = a & 0x7FFFFFu;
    // Round up when not a power of two, except: saturate at 2^127, and FP32 subnormals up to
    // 2^-127 (mantissa <= 0x400000) stay at 2^-127, the smallest scale.
    if (m != 0 && e != 0xFE && !(e == 0 && m <= 0x400000u)) e++;
    return (uint8_t)e;
}

// 2^(e - 127); e = 0 is the FP32 subnormal 2^-127 (0x00400000) and e = 255 is NaN.
QT_HD float qt_e8m0_to_f32(uint8_t e) {
    if (e == 0xFF) return qt_bits_f32(QT_F32_ABS);
    if (e == 0) return qt_bits_f32(0x00400000u);
    return qt_bits_f32((uint32_t)e << 23);
}

// 2^(127 - e), the exact multiplier used when quantizing; e = 254 gives 2^-127 (0x00400000),
// e = 255 NaN.
QT_HD float qt_e8m0_inv_f32(uint8_t e) {
    if (e == 0xFF) return qt_bits_f32(QT_F32_ABS);
    if (e == 0xFE) return qt_bits_f32(0x00400000u);
    return qt_bits_f32((uint32_t)(254u - e) << 23);
}

// ---------------------------------------------------------------------------------------------
// BF16.

// BF16's canonical NaN: what the GPU's cvt.rn.bf16x2.f32 writes for a NaN of either sign.
#define QT_BF16_NAN 0x7FFFu

// Round to nearest even on the top 16 bits; values that round past BF16_MAX become Inf, as
// __float2bfloat16_rn does. Every NaN, of either sign and any payload, becomes the canonical
// 0x7FFF, as the GPU's conversion instruction writes it, so that a kernel may convert with that
// instruction and still give this function's bits (recipes/NUMERICS.md "NaN").
QT_HD uint16_t qt_f32_to_bf16(float x) {
    uint32_t bits = qt_f32_bits(x);
    if ((bits & QT_F32_ABS) > QT_F32_INF) return (uint16_t)QT_BF16_NAN;
    uint32_t lsb = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7FFFu + lsb) >> 16);
}

QT_HD float qt_bf16_to_f32(uint16_t h) { return qt_bits_f32((uint32_t)h << 16); }

// ---------------------------------------------------------------------------------------------
// scale_from_amax, TE's compute_scale_from_amax:
//   amax < eps -> eps (NaN fails the comparison); amax Inf, 0 or NaN -> 1; scale = RN(qmax/amax);
//   Inf scale -> inf_repl; pow2 clears the mantissa, rounding the scale down to a power of two so
//   that amax * scale <= qmax still holds.
QT_HD float qt_scale_from_amax(float amax, float qmax, int pow2, float eps, float inf_repl) {
    if (amax < eps) amax = eps;
    if (qt_f32_is_inf(amax) || amax == 0.0f || qt_f32_is_nan(amax)) return 1.0f;
    float scale = qmax / amax;  // one IEEE RN division on host and device (-prec-div=true)
    if (qt_f32_is_inf(scale)) scale = inf_repl;
    if (pow2) scale = qt_bits_f32(qt_f32_bits(scale) & 0xFF800000u);
    return scale;
}

#endif  // QT_CODEC_H
