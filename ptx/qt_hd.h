// qt_hd: the few definitions that let one header serve host C11 and device CUDA alike.
//
// Owns nothing. Included by every header shared between ptx/ kernels and host code (codecs,
// Philox, the transcendental functions, args structs), so that the reference backend runs the
// very same arithmetic as the GPU.
#ifndef QT_HD_H
#define QT_HD_H

#include <stdint.h>

#if defined(__CUDACC__)
#define QT_HD __host__ __device__ __forceinline__
#define QT_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#include <string.h>  // memcpy for bit casts
#define QT_HD static inline
#define QT_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

QT_HD uint32_t qt_f32_bits(float value) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(value);
#else
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
#endif
}

QT_HD float qt_bits_f32(uint32_t bits) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(bits);
#else
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
#endif
}

// 1 when v is NaN or +-Inf (the gradient norm's flags), else 0.
QT_HD uint32_t qt_f32_nonfinite(float v) {
    return (qt_f32_bits(v) & 0x7FFFFFFFu) >= 0x7F800000u;
}

// Explicit fused multiply-add: the only place where device or host code contracts a*b+c, since
// both are compiled without automatic contraction (-fmad=false, -ffp-contract=off).
QT_HD float qt_fmaf(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return __builtin_fmaf(a, b, c);
#endif
}

// IEEE square root, correctly rounded on both sides (nvcc's default -prec-sqrt=true; SSE sqrtss).
QT_HD float qt_sqrtf(float x) {
#if defined(__CUDA_ARCH__)
    return __fsqrt_rn(x);
#else
    return __builtin_sqrtf(x);
#endif
}

// The same in FP64.
QT_HD double qt_sqrt(double x) {
#if defined(__CUDA_ARCH__)
    return __dsqrt_rn(x);
#else
    return __builtin_sqrt(x);
#endif
}

#endif  // QT_HD_H
