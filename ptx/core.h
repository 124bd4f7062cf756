// core: the foundation kernels' ABI (fill, copy, checksum) and their per-element arithmetic,
// shared by ptx/core.cu and the reference backend (runtime/ref/ref_core.c).
//
// Owns nothing. Every kernel takes one args struct by value; sizes are asserted on both sides.
//
//   fill_random    out[at(i)] = dist(philox(seed, offset + i))     any (seed, offset) window;
//                  at(i) = i / row_cols * row_stride + i % row_cols  (rows of a wider matrix)
//   copy           dst[0..bytes) = src[0..bytes)
//   checksum       out = H(src[0..bytes)), two launches: per-block partial sums of word hashes,
//                  then one block over the partials. H is position-sensitive (each 64-bit word is
//                  hashed with its index) and the partials are summed mod 2^64, which is exact and
//                  associative, so the value does not depend on the grid and the reference
//                  backend computes it with one sequential loop.
#ifndef QT_CORE_H
#define QT_CORE_H

#include "ptx/philox.h"
#include "ptx/qt_codec.h"  // qt_f32_to_bf16
#include "ptx/qt_hd.h"
#include "ptx/qt_math.h"   // qt_logf, qt_cospif

#define QT_DTYPE_F32 0u
#define QT_DTYPE_BF16 1u

#define QT_FILL_UNIFORM 0u  // a + (b - a) * u, u in [0, 1)
#define QT_FILL_NORMAL 1u   // mean a, standard deviation b (Box-Muller)

typedef struct fill_random_args {
    uint64_t out;     // f32 or bf16: count values, row_cols to a row, rows row_stride apart
    uint64_t count;   // a multiple of row_cols
    uint64_t seed;
    uint64_t offset;  // element i uses Philox counter offset + i: windows of one stream compose
    uint64_t row_cols;    // >= 1; count for a contiguous fill
    uint64_t row_stride;  // >= row_cols, in elements
    float a, b;
    uint32_t dtype;  // QT_DTYPE_F32 | QT_DTYPE_BF16 (rounded to nearest even)
    uint32_t dist;   // QT_FILL_UNIFORM | QT_FILL_NORMAL
} fill_random_args;
QT_STATIC_ASSERT(sizeof(fill_random_args) == 64, "fill_random_args layout");

typedef struct copy_args {
    uint64_t dst, src, bytes;
} copy_args;
QT_STATIC_ASSERT(sizeof(copy_args) == 24, "copy_args layout");

typedef struct checksum_args {
    uint64_t src;       // 8-byte aligned
    uint64_t bytes;
    uint64_t partials;  // (blocks) u64 workspace
    uint64_t out;       // u64
    uint32_t blocks;    // grid of the partial pass; the final pass reads this many partials
    uint32_t reserved;
} checksum_args;
QT_STATIC_ASSERT(sizeof(checksum_args) == 40, "checksum_args layout");

#define QT_KERNELS_CORE(X)                                                  \
    X(KERNEL_FILL_RANDOM, core, qt_fill_random, fill_random_args)          \
    X(KERNEL_COPY, core, qt_copy, copy_args)                               \
    X(KERNEL_CHECKSUM_PARTIAL, core, qt_checksum_partial, checksum_args)   \
    X(KERNEL_CHECKSUM_FINAL, core, qt_checksum_final, checksum_args)

// Element i of a fill. The normal case spends two words on Box-Muller; u1 is in (0, 1] so the
// logarithm is finite.
QT_HD float qt_fill_value(uint64_t seed, uint64_t index, uint32_t dist, float a, float b) {
    qt_philox4 r = qt_philox_at(seed, index, dist);
    if (dist == QT_FILL_UNIFORM) return qt_fmaf(qt_uniform_from_word(r.v[0]), b - a, a);
    float u1 = (float)((r.v[0] >> 8) + 1u) * (1.0f / 16777216.0f);
    float u2 = qt_uniform_from_word(r.v[1]);
    float radius = qt_sqrtf(-2.0f * qt_logf(u1));
    float z = radius * qt_cospif(2.0f * u2);
    return qt_fmaf(z, b, a);
}

// Where element i of a fill goes: a contiguous fill (row_stride == row_cols) needs no division.
QT_HD uint64_t qt_fill_index(const fill_random_args *a, uint64_t i) {
    if (a->row_stride == a->row_cols) return i;
    return i / a->row_cols * a->row_stride + i % a->row_cols;
}

// splitmix64's finalizer: a bijection with full avalanche, cheap on both sides.
QT_HD uint64_t qt_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Hash of the 64-bit word at word index i (little-endian, a short tail zero-padded).
QT_HD uint64_t qt_checksum_word(uint64_t word, uint64_t index) {
    return qt_mix64(word + (index + 1) * 0x9E3779B97F4A7C15ull);
}

QT_HD uint64_t qt_checksum_finish(uint64_t sum, uint64_t bytes) { return qt_mix64(sum ^ bytes); }

#endif  // QT_CORE_H
