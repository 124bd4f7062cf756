// gemm_decode: the decode of the emulated formats (MXFP8, NVFP4) into BF16, shared by both GEMM
// tiers (ptx/gemm_portable.cu, ptx/gemm_sm90a.cu), and the byte and conversion primitives it is
// made of. Device code only; gemm.h holds the arithmetic it reproduces (qt_gemm_mxfp8_decode,
// qt_gemm_nvfp4_decode, rounded to BF16), which the C twins compute.
//
// With the hardware conversions Hopper has, bit for bit the values of gemm.h's decode rounded to
// BF16:
//   MXFP8: cvt.rn.f16x2.{e4m3x2,e5m2x2} turns two codes into f16 (exact: every e4m3 and e5m2
//     value is an f16 value), cvt.f32.f16 widens them (exact), and one FP32 multiply by the e8m0
//     scale is qt_gemm_mxfp8_decode's product (no flush to zero: it may be an FP32 subnormal).
//     That product has at most 4 significant bits, so when it is an FP32 normal number (or zero,
//     Inf or NaN) it is a BF16 value whose bits are its upper half; every scale >= 17 makes it so
//     for every code (the smallest nonzero codes are e4m3 2^-9, e5m2 2^-16) and a byte permute
//     packs the pair. Pieces with a smaller scale round with cvt.rn.bf16x2.f32 (RNE, as
//     qt_f32_to_bf16; subnormal results kept).
//   NVFP4 (Hopper has no e2m1 conversion): one byte permute looks the magnitudes of four nibbles
//     up in an 8-entry table of BF16 bytes, another copies their signs, and one bf16x2 fused
//     multiply-add by the e4m3 scale (in BF16, exact: 4 significant bits) with a -0 addend (which
//     keeps the sign of zero products) gives the product, exact in BF16 since it has at most 6
//     significant bits and lies in [2^-10, 2688] (qt_gemm_nvfp4_decode).
//   NaN: the conversions and the bf16x2 fused multiply-add return the canonical NaN 0x7FFF,
//   which is also what qt_f32_to_bf16 writes for every NaN.
//
// A decoded piece of 16 (or 8) elements is 8 (or 4) BF16 pairs, element 2 i in the low half of
// word i.
#ifndef QT_GEMM_DECODE_H
#define QT_GEMM_DECODE_H

#include "ptx/gemm.h"

// MXFP8 pieces whose e8m0 scales are all at least this (and not the NaN scale 255 where a piece
// has one scale per element) give products that are BF16 values: no rounding (see above).
#define GEMM_MXFP8_EXACT_SCALE_MIN 17u

// with the nibble's bit 3 set that byte's top bit repeated through the byte.
__device__ __forceinline__ uint32_t gemm_prmt(uint32_t a, uint32_t b, uint32_t selector) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
    return d;
}

// Two floats to a BF16 pair, qt_f32_to_bf16's bits for every value (RNE, subnormals kept, NaN
// 0x7FFF); the low half is the first.
__device__ __forceinline__ uint32_t gemm_pack_bf16(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// The BF16 pair of two floats that are BF16 values (zero low halves): their upper halves.
__device__ __forceinline__ uint32_t gemm_pack_bf16_exact(float lo, float hi) {
    return gemm_prmt(__float_as_uint(lo), __float_as_uint(hi), 0x7632u);
}

// Four FP8 codes (element 0 in the low byte) to the f16 pairs of elements 0, 1 and 2, 3 (the
// first element in the low half). Exact.
template <bool kE5M2>
__device__ __forceinline__ void gemm_fp8x4_to_f16x2(uint32_t codes, uint32_t &h01,
                                                    uint32_t &h23) {
    if constexpr (kE5M2) {
        asm("{\n\t.reg .b16 c01, c23;\n\tmov.b32 {c01, c23}, %2;\n\t"
            "cvt.rn.f16x2.e5m2x2 %0, c01;\n\tcvt.rn.f16x2.e5m2x2 %1, c23;\n\t}\n"
            : "=r"(h01), "=r"(h23)
            : "r"(codes));
    } else {
        asm("{\n\t.reg .b16 c01, c23;\n\tmov.b32 {c01, c23}, %2;\n\t"
            "cvt.rn.f16x2.e4m3x2 %0, c01;\n\tcvt.rn.f16x2.e4m3x2 %1, c23;\n\t}\n"
            : "=r"(h01), "=r"(h23)
            : "r"(codes));
    }
}

// An f16 pair to two floats (exact, subnormals included).
__device__ __forceinline__ void gemm_f16x2_to_f32(uint32_t h, float &lo, float &hi) {
    asm("{\n\t.reg .b16 h0, h1;\n\tmov.b32 {h0, h1}, %2;\n\t"
        "cvt.f32.f16 %0, h0;\n\tcvt.f32.f16 %1, h1;\n\t}\n"
        : "=f"(lo), "=f"(hi)
        : "r"(h));
}

// a x b + c on BF16 pairs, one rounding (RNE).
__device__ __forceinline__ uint32_t gemm_fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Word i (0..3, a constant after unrolling) of a vector; keeps vectors in registers.
__device__ __forceinline__ uint32_t gemm_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// kPiece MXFP8 codes of one block, scaled by `scale` (kExact: every product is a BF16 value).
template <uint32_t kPiece, bool kE5M2, bool kExact>
__device__ __forceinline__ void gemm_decode_mxfp8_row(const uint4 &codes, float scale,
                                                      uint32_t (&w)[8]) {
#pragma unroll
    for (int i = 0; i < (int)kPiece / 4; i++) {
        uint32_t h[2];
        gemm_fp8x4_to_f16x2<kE5M2>(gemm_word(codes, i), h[0], h[1]);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float lo, hi;
            gemm_f16x2_to_f32(h[j], lo, hi);
            lo = lo * scale;
            hi = hi * scale;
            w[2 * i + j] = kExact ? gemm_pack_bf16_exact(lo, hi) : gemm_pack_bf16(lo, hi);
        }
    }
}

// kPiece MXFP8 codes with one e8m0 scale each (outer-major: consecutive operand rows). kExact:
// every scale is in [GEMM_MXFP8_EXACT_SCALE_MIN, 254], so it is 2^(e - 127) with the bits e << 23.
template <uint32_t kPiece, bool kE5M2, bool kExact>
__device__ __forceinline__ void gemm_decode_mxfp8_col(const uint4 &codes, const uint4 &scales,
                                                      uint32_t (&w)[8]) {
#pragma unroll
    for (int i = 0; i < (int)kPiece / 4; i++) {
        uint32_t h[2];
        gemm_fp8x4_to_f16x2<kE5M2>(gemm_word(codes, i), h[0], h[1]);
        uint32_t e4 = gemm_word(scales, i);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float lo, hi;
            gemm_f16x2_to_f32(h[j], lo, hi);
            uint32_t e_lo = (e4 >> (16 * j)) & 0xFFu, e_hi = (e4 >> (16 * j + 8)) & 0xFFu;
            if constexpr (kExact) {
                lo = lo * __uint_as_float(e_lo << 23);
                hi = hi * __uint_as_float(e_hi << 23);
                w[2 * i + j] = gemm_pack_bf16_exact(lo, hi);
            } else {
                lo = lo * qt_e8m0_to_f32((uint8_t)e_lo);
                hi = hi * qt_e8m0_to_f32((uint8_t)e_hi);
                w[2 * i + j] = gemm_pack_bf16(lo, hi);
            }
        }
    }
}

// Whether the piece's kPiece e8m0 scale bytes all lie in [GEMM_MXFP8_EXACT_SCALE_MIN, 254]: no
// byte below the minimum ((x - 0x11 per byte) & ~x & 0x80 per byte is nonzero exactly when some
// byte is below 0x11, for minimums up to 0x80) and no byte 0xFF (the same test for zero bytes
// of ~x).
template <uint32_t kPiece>
__device__ __forceinline__ bool gemm_scales_exact(const uint4 &s) {
    static_assert(GEMM_MXFP8_EXACT_SCALE_MIN == 0x11u, "the byte test below");
    uint32_t bad = 0;
#pragma unroll
    for (int i = 0; i < (int)kPiece / 4; i++) {
        uint32_t x = gemm_word(s, i);
        bad |= (x - 0x11111111u) & ~x & 0x80808080u;
        bad |= (~x - 0x01010101u) & x & 0x80808080u;
    }
    return bad == 0;
}


// The BF16 bytes of the e2m1 magnitudes m = 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6): byte m of the
// 8-byte tables {LO0, LO1} (low bytes) and {HI0, HI1} (high bytes) that prmt indexes.
#define GEMM_E2M1_BF16_LO0 0xC0800000u
#define GEMM_E2M1_BF16_LO1 0xC0804000u
#define GEMM_E2M1_BF16_HI0 0x3F3F3F00u
#define GEMM_E2M1_BF16_HI1 0x40404040u

// Eight e2m1 nibbles (element i in bits 4 i ... 4 i + 3) to four BF16 pairs of their values.
__device__ __forceinline__ void gemm_e2m1x8_to_bf16x2(uint32_t nibbles, uint32_t (&w)[4]) {
    uint32_t mag = nibbles & 0x77777777u;  // prmt selectors; bit 3 would select sign filling
    uint32_t even_signs = nibbles << 4;    // the signs of elements 0, 2, 4, 6 atop bytes 0..3
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t sel = mag >> (16 * h);  // prmt reads the low 16 bits: elements 4 h ... 4 h + 3
        uint32_t lo = gemm_prmt(GEMM_E2M1_BF16_LO0, GEMM_E2M1_BF16_LO1, sel);
        uint32_t hi = gemm_prmt(GEMM_E2M1_BF16_HI0, GEMM_E2M1_BF16_HI1, sel);
        // Sign-filled bytes whose top bits are the signs of elements 4 h ... 4 h + 3, in order:
        // even elements from even_signs (bytes 2 h, 2 h + 1), odd ones from nibbles (the same).
        uint32_t signs = gemm_prmt(even_signs, nibbles, 0xD9C8u + 0x2222u * (uint32_t)h);
        hi |= signs & 0x80808080u;
        w[2 * h] = gemm_prmt(lo, hi, 0x5140u);      // lo0 hi0 lo1 hi1
        w[2 * h + 1] = gemm_prmt(lo, hi, 0x7362u);  // lo2 hi2 lo3 hi3
    }
}


// An e4m3 block scale in BF16, in both halves: cvt.rn.f16x2.e4m3x2 and cvt.f32.f16 are exact, and
// an FP32 value with 4 significant bits that is a normal number (every e4m3 value is) is a BF16
// value whose bits are its upper half. Branch-free, so the decode of several pieces stays one
// straight run of code. (A NaN scale gives the canonical NaN; its products are NaN either way.)
__device__ __forceinline__ uint32_t gemm_nvfp4_scale_pair(uint8_t scale_e4m3) {
    uint32_t h01, h23;
    gemm_fp8x4_to_f16x2<false>(scale_e4m3, h01, h23);
    float lo, hi;
    gemm_f16x2_to_f32(h01, lo, hi);
    uint32_t s = __float_as_uint(lo) >> 16;
    return s | (s << 16);
}

// Eight NVFP4 nibbles (element i in bits 4 i ... 4 i + 3) of one block, times the block's scale
// pair, as four BF16 pairs.
__device__ __forceinline__ void gemm_decode_nvfp4x8(uint32_t nibbles, uint32_t scale2,
                                                    uint32_t (&w)[4]) {
    uint32_t v[4];
    gemm_e2m1x8_to_bf16x2(nibbles, v);
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = gemm_fma_bf16x2(v[i], scale2, 0x80008000u);
}

#endif  // QT_GEMM_DECODE_H
