// C twins of ptx/core.cu.
#include <string.h>

#include "ref.h"

void ref_qt_fill_random(const fill_random_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint64_t i = 0; i < a->count; i++) {
        float value = qt_fill_value(a->seed, a->offset + i, a->dist, a->a, a->b);
        uint64_t at = qt_fill_index(a, i);
        if (a->dtype == QT_DTYPE_BF16) {
            REF_PTR(uint16_t, a->out)[at] = qt_f32_to_bf16(value);
        } else {
            REF_PTR(float, a->out)[at] = value;
        }
    }
}

void ref_qt_copy(const copy_args *a, const launch_shape *shape) {
    (void)shape;
    memmove(REF_PTR(void, a->dst), REF_PTR(const void, a->src), a->bytes);
}

// The sum is exact mod 2^64, so one sequential pass gives the GPU's tree result; the partials
// are still written the way the GPU writes them (block b sums words b, b + blocks*256, ...), so
// a test can compare the workspace too.
void ref_qt_checksum_partial(const checksum_args *a, const launch_shape *shape) {
    uint32_t threads = shape->block[0];
    const uint8_t *src = REF_PTR(const uint8_t, a->src);
    uint64_t words = (a->bytes + 7) / 8;
    uint64_t *partials = REF_PTR(uint64_t, a->partials);
    for (uint32_t b = 0; b < a->blocks; b++) partials[b] = 0;
    for (uint64_t i = 0; i < words; i++) {
        uint64_t word = 0;
        uint64_t first = i * 8;
        uint64_t last = first + 8 <= a->bytes ? first + 8 : a->bytes;
        memcpy(&word, src + first, last - first);  // little-endian host, as the GPU
        partials[(i / threads) % a->blocks] += qt_checksum_word(word, i);
    }
}

void ref_qt_checksum_final(const checksum_args *a, const launch_shape *shape) {
    (void)shape;
    uint64_t total = 0;
    for (uint32_t b = 0; b < a->blocks; b++) total += REF_PTR(const uint64_t, a->partials)[b];
    *REF_PTR(uint64_t, a->out) = qt_checksum_finish(total, a->bytes);
}
