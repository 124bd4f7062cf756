// philox: Philox4x32-10 counter-based random numbers, one implementation for host and device.
//
// Owns nothing. Every random value in qtrain (fills, stochastic rounding, data shuffles) is a pure
// function of (key, counter), so results never depend on kernel tiling or thread counts and the
// reference backend reproduces them exactly.
#ifndef QT_PHILOX_H
#define QT_PHILOX_H

#include "ptx/qt_hd.h"

typedef struct qt_philox4 {
    uint32_t v[4];
} qt_philox4;

#define QT_PHILOX_M0 0xD2511F53u
#define QT_PHILOX_M1 0xCD9E8D57u
#define QT_PHILOX_W0 0x9E3779B9u  // golden ratio
#define QT_PHILOX_W1 0xBB67AE85u  // sqrt(3) - 1

QT_HD qt_philox4 qt_philox4x32_10(qt_philox4 counter, uint32_t key0, uint32_t key1) {
    uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)QT_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)QT_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ key0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ key1;
        c3 = lo0;
        key0 += QT_PHILOX_W0;
        key1 += QT_PHILOX_W1;
    }
    qt_philox4 out = {{c0, c1, c2, c3}};
    return out;
}

// Convenience: the four words for a 64-bit counter and a 64-bit stream id under a 64-bit seed.
QT_HD qt_philox4 qt_philox_at(uint64_t seed, uint64_t counter, uint64_t stream) {
    qt_philox4 ctr = {{(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)}};
    return qt_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
}

// Uniform in [0, 1): the top 24 bits of a word, so every value is an exact float.
QT_HD float qt_uniform_from_word(uint32_t word) {
    return (float)(word >> 8) * (1.0f / 16777216.0f);
}

#endif  // QT_PHILOX_H
