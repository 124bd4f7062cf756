// qt_math: the transcendental functions of elementwise ops (exp, log, erf, cos(pi x),
// sin(pi x)), one implementation for the GPU kernels and the C reference backend.
//
// Owns nothing; header-only. libm and CUDA's math library are each accurate to a few ulp, but not
// bit-identical to each other, so neither may be used where the reference backend must reproduce
// the GPU bit for bit. These functions use only +, -, *, /, qt_fmaf and
// integer work on bit patterns; host code is built with -ffp-contract=off and device code with
// -fmad=false, and both use IEEE round-to-nearest with subnormals kept, so every operation rounds
// the same way on both sides and the results are identical bit for bit.
//
// Method: exact range reduction, then a polynomial fitted (Chebyshev, near-minimax) to the reduced
// function, evaluated by Horner's rule with qt_fmaf. Coefficients are hexadecimal float literals,
// so no decimal-to-binary conversion is involved. Accuracy was measured over all 2^32 inputs
// against double-precision libm (tests/test_codec.c built with -DMATH_SWEEP_STEP=1; the regular
// test samples every 64th pattern) and is stated next to each function in ulp of the result.
// Every result was also checked bit-identical between host (gcc) and an H200 over all 2^32 inputs.
#ifndef QT_MATH_H
#define QT_MATH_H

#include <stdint.h>

#include "ptx/qt_hd.h"  // QT_HD, qt_f32_bits, qt_bits_f32, qt_fmaf

// Every NaN result is this one pattern, the canonical NaN that GPU arithmetic produces. Host x86
// arithmetic would instead keep an input NaN's payload (x + x) or make 0xFFC00000 (Inf - Inf), so
// NaN results are returned explicitly rather than computed.
#define QT_MATH_NAN_BITS 0x7FFFFFFFu

// 2^k as an FP32 for -126 <= k <= 127, built from its exponent field.
QT_HD float qt_math_pow2i(int32_t k) { return qt_bits_f32((uint32_t)(k + 127) << 23); }

// Round to nearest integer (ties to even) for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction
// bits, so the addition itself rounds; the subtraction is exact.
QT_HD float qt_math_rint_small(float v) {
    const float magic = 12582912.0f;  // 1.5 * 2^23
    return (v + magic) - magic;
}

QT_HD float qt_math_copysign(float mag, float sign_of) {
    uint32_t bits = (qt_f32_bits(mag) & 0x7FFFFFFFu) | (qt_f32_bits(sign_of) & 0x80000000u);
    return qt_bits_f32(bits);
}

// ln 2 split so that k * ln2_hi is exact for |k| < 2^9 (ln2_hi has 15 significant bits) and
// ln2_hi + ln2_lo carries ln 2 to about 2^-44.
#define QT_MATH_LN2_HI 0x1.62e4p-1f
#define QT_MATH_LN2_LO 0x1.7f7d1cp-20f

// e^x = 2^k y: k = rint(x / ln2) and y = e^r, r = x - k ln2, for finite -104 <= x <= 89; the
// two callers below apply 2^k.
typedef struct qt_math_exp_parts {
    float y, kf;
} qt_math_exp_parts;

QT_HD qt_math_exp_parts qt_math_exp_reduced(float x) {
    qt_math_exp_parts p;
    p.kf = qt_math_rint_small(x * 0x1.715476p+0f);  // x * log2(e)
    float r = qt_fmaf(-p.kf, QT_MATH_LN2_HI, x);
    r = qt_fmaf(-p.kf, QT_MATH_LN2_LO, r);
    float e = 0x1.a12a34p-13f;
    e = qt_fmaf(e, r, 0x1.6d4910p-10f);
    e = qt_fmaf(e, r, 0x1.1110e0p-7f);
    e = qt_fmaf(e, r, 0x1.5554e4p-5f);
    e = qt_fmaf(e, r, 0x1.555556p-3f);
    e = qt_fmaf(e, r, 0x1p-1f);
    p.y = 1.0f + qt_fmaf(r * r, e, r);
    return p;
}

// The arithmetic of qt_expf for finite -104 <= x <= 89, without the guards.
QT_HD float qt_math_exp_core(float x) {
    qt_math_exp_parts p = qt_math_exp_reduced(x);
    int32_t k = (int32_t)p.kf;  // -150 <= k <= 129
    int32_t k1 = k / 2;
    return (p.y * qt_math_pow2i(k1)) * qt_math_pow2i(k - k1);
}

// e^x. Max error 0.99 ulp over all floats (measured against double libm; subnormal results
// included).
// x = k ln2 + r with k = rint(x / ln2) and |r| <= ~0.347; r = x - k ln2_hi is exact (Sterbenz),
// then - k ln2_lo is one rounding inside an fma. e^r = 1 + r + r^2 E(r) with E fitted on
// [-0.35, 0.35] (max error 1.5e-9). The 2^k factor is applied as two exact-power multiplies so that
// only the last one rounds, which handles subnormal results and overflow with a single rounding.
QT_HD float qt_expf(float x) {
    uint32_t a = qt_f32_bits(x) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return qt_bits_f32(QT_MATH_NAN_BITS);
    if (x > 89.0f) return qt_bits_f32(0x7F800000u);  // e^89 > FLT_MAX; +Inf included
    if (x < -104.0f) return 0.0f;                    // e^-104 < 2^-150 rounds to 0; -Inf included
    return qt_math_exp_core(x);
}

// Natural logarithm. Max error 0.84 ulp over all floats (measured against double libm).
// x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals are first scaled by 2^23), f = m - 1 exact.
// log(1 + f) = 2 atanh(s) with s = f / (2 + f), |s| <= 0.1716, written as
// f - (f^2/2 - s (f^2/2 + R(s^2))) with R(z) = 2z/3 + 2z^2/5 + ... fitted (max error 1.2e-9), so
// the large term f is exact and only small corrections carry rounding errors.
QT_HD float qt_logf(float x) {
    uint32_t bits = qt_f32_bits(x);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return qt_bits_f32(QT_MATH_NAN_BITS);
    if ((bits & 0x7FFFFFFFu) == 0) return qt_bits_f32(0xFF800000u);  // log(±0) = -Inf
    if (bits & 0x80000000u) return qt_bits_f32(QT_MATH_NAN_BITS);  // x < 0
    if (bits == 0x7F800000u) return x;                            // log(+Inf) = +Inf
    int32_t k = 0;
    if (bits < 0x00800000u) {  // subnormal: scale into the normal range exactly
        bits = qt_f32_bits(x * 0x1p23f);
        k = -23;
    }
    k += (int32_t)(bits >> 23) - 127;
    uint32_t m_bits = (bits & 0x7FFFFFu) | 0x3F800000u;  // m in [1, 2)
    if (m_bits > 0x3FB504F3u) {                           // m > sqrt(2): use m / 2, k + 1
        m_bits -= 0x00800000u;
        k += 1;
    }
    float f = qt_bits_f32(m_bits) - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float p = 0x1.dddbaap-3f;
    p = qt_fmaf(p, z, 0x1.245c08p-2f);
    p = qt_fmaf(p, z, 0x1.9999ecp-2f);
    p = qt_fmaf(p, z, 0x1.555556p-1f);
    float r = z * p;
    float hfsq = 0.5f * f * f;
    float kf = (float)k;
    float lo = qt_fmaf(s, hfsq + r, kf * QT_MATH_LN2_LO);
    return kf * QT_MATH_LN2_HI + (f - (hfsq - lo));
}

// Error function. Max error 1.10 ulp over all floats (measured against double libm).
// |x| < 1: erf x = x + x Q(x^2), Q fitted on [0, 1] (max error 8.3e-13), Q(0) = 2/sqrt(pi) - 1,
// so the leading term x is exact.
// 1 <= |x| < 4: erf|x| = 1 - e^(-x^2) R, R = erfcx(|x|) = e^(x^2) erfc(|x|) fitted in
// u = 1/|x| - 0.625 on [-0.375, 0.375] (max error 6.5e-10). x^2 is split into hi + lo with an fma
// so that e^(-x^2) is not spoilt by the rounding of x^2. The subtracted term is below 0.16, so its
// relative errors shrink by that factor in the result.
// |x| >= 4: erfc < 1.6e-8 < 2^-25, so the result rounds to ±1.
QT_HD float qt_erff(float x) {
    uint32_t a_bits = qt_f32_bits(x) & 0x7FFFFFFFu;
    if (a_bits > 0x7F800000u) return qt_bits_f32(QT_MATH_NAN_BITS);
    float a = qt_bits_f32(a_bits);
    if (a < 1.0f) {
        float z = x * x;
        float q = 0x1.1c41acp-20f;
        q = qt_fmaf(q, z, -0x1.d2b852p-17f);
        q = qt_fmaf(q, z, 0x1.f57e9cp-14f);
        q = qt_fmaf(q, z, -0x1.bfe158p-11f);
        q = qt_fmaf(q, z, 0x1.56588cp-8f);
        q = qt_fmaf(q, z, -0x1.b82cbap-6f);
        q = qt_fmaf(q, z, 0x1.ce2f20p-4f);
        q = qt_fmaf(q, z, -0x1.812746p-2f);
        q = qt_fmaf(q, z, 0x1.06eba8p-3f);
        return qt_fmaf(x, q, x);  // ±0 stays ±0
    }
    if (a >= 4.0f) return qt_math_copysign(1.0f, x);
    float u = 1.0f / a - 0.625f;
    float r = -0x1.0d73f6p-5f;
    r = qt_fmaf(r, u, 0x1.aa8a92p-6f);
    r = qt_fmaf(r, u, 0x1.24059cp-8f);
    r = qt_fmaf(r, u, -0x1.b92d78p-6f);
    r = qt_fmaf(r, u, 0x1.623de6p-5f);
    r = qt_fmaf(r, u, -0x1.808d22p-5f);
    r = qt_fmaf(r, u, 0x1.7e3ad2p-6f);
    r = qt_fmaf(r, u, 0x1.6689dep-5f);
    r = qt_fmaf(r, u, -0x1.611080p-3f);
    r = qt_fmaf(r, u, 0x1.877566p-2f);
    r = qt_fmaf(r, u, 0x1.394bbep-2f);
    float sq_hi = a * a;
    float sq_lo = qt_fmaf(a, a, -sq_hi);
    float e = qt_expf(-sq_hi);
    e = qt_fmaf(-sq_lo, e, e);  // e^(-hi - lo) = e^(-hi) (1 - lo) to first order; |lo| < 2^-20
    return qt_math_copysign(qt_fmaf(-e, r, 1.0f), x);
}

// sin(pi r) for |r| <= 1/4: pi r + r^3 S(r^2), S fitted on [0, 1/16] (max error 8.6e-13). pi is
// carried as pi_hi + pi_lo so that the leading term does not inherit the 0.5 ulp error of f32(pi).
QT_HD float qt_math_sinpi_kernel(float r) {
    float z = r * r;
    float s = -0x1.de46bep-8f;
    s = qt_fmaf(s, z, 0x1.50740ep-4f);
    s = qt_fmaf(s, z, -0x1.32d2cap-1f);
    s = qt_fmaf(s, z, 0x1.466bc6p+1f);
    s = qt_fmaf(s, z, -0x1.4abbcep+2f);
    float tail = r * qt_fmaf(z, s, -0x1.777a5cp-24f);  // pi_lo = pi - pi_hi
    return qt_fmaf(r, 0x1.921fb6p+1f, tail);           // pi_hi = f32(pi)
}

// cos(pi r) for |r| <= 1/4: 1 + r^2 C(r^2), C fitted on [0, 1/16] (max error 3.0e-15).
QT_HD float qt_math_cospi_kernel(float r) {
    float z = r * r;
    float c = 0x1.f4b536p-10f;
    c = qt_fmaf(c, z, -0x1.a6cc32p-6f);
    c = qt_fmaf(c, z, 0x1.e1f500p-3f);
    c = qt_fmaf(c, z, -0x1.55d3c8p+0f);
    c = qt_fmaf(c, z, 0x1.03c1f0p+2f);
    c = qt_fmaf(c, z, -0x1.3bd3ccp+2f);
    return qt_fmaf(z, c, 1.0f);
}

// Exact reduction shared by sinpi and cospi: |x| = n/2 + r with n = rint(2|x|), |r| <= 1/4.
// r = |x| - n/2 is exact (Sterbenz). From 2^22 up every float is a multiple of 1/2, so r = 0;
// from 2^24 up every float is an even integer, which callers handle before calling this.
QT_HD float qt_math_pi_reduce(float a, uint32_t *quadrant) {
    float n = a < 0x1p22f ? qt_math_rint_small(a + a) : a + a;
    *quadrant = (uint32_t)n & 3u;
    return a - 0.5f * n;
}

// sin(pi x). Max error 1.02 ulp over all floats (measured against libm with exact reduction).
// NaN and ±Inf give NaN; integers give +0 for x > 0 and -0 for x < 0 (IEEE 754 sinPi).
QT_HD float qt_sinpif(float x) {
    uint32_t a_bits = qt_f32_bits(x) & 0x7FFFFFFFu;
    if (a_bits >= 0x7F800000u) return qt_bits_f32(QT_MATH_NAN_BITS);  // NaN and ±Inf
    if (a_bits >= 0x4B800000u) return qt_math_copysign(0.0f, x);  // |x| >= 2^24: even integer
    uint32_t quadrant;
    float r = qt_math_pi_reduce(qt_bits_f32(a_bits), &quadrant);
    float v;
    switch (quadrant) {  // sin(pi (r + q/2))
    case 0: v = qt_math_sinpi_kernel(r); break;
    case 1: v = qt_math_cospi_kernel(r); break;
    case 2: v = -qt_math_sinpi_kernel(r); break;
    default: v = -qt_math_cospi_kernel(r); break;
    }
    if (v == 0.0f) v = 0.0f;  // a zero result takes the sign of x below, never that of r
    return (qt_f32_bits(x) >> 31) ? -v : v;
}

// cos(pi x). Max error 1.02 ulp over all floats (measured against libm with exact reduction).
// NaN and ±Inf give NaN; x = n + 1/2 gives +0.
QT_HD float qt_cospif(float x) {
    uint32_t a_bits = qt_f32_bits(x) & 0x7FFFFFFFu;
    if (a_bits >= 0x7F800000u) return qt_bits_f32(QT_MATH_NAN_BITS);  // NaN and ±Inf
    if (a_bits >= 0x4B800000u) return 1.0f;    // |x| >= 2^24: even integer
    uint32_t quadrant;
    float r = qt_math_pi_reduce(qt_bits_f32(a_bits), &quadrant);
    float v;
    switch (quadrant) {  // cos(pi (r + q/2))
    case 0: v = qt_math_cospi_kernel(r); break;
    case 1: v = -qt_math_sinpi_kernel(r); break;
    case 2: v = -qt_math_cospi_kernel(r); break;
    default: v = qt_math_sinpi_kernel(r); break;
    }
    return v == 0.0f ? 0.0f : v;  // cos(pi (n + 1/2)) is +0, never -0
}

#endif  // QT_MATH_H
