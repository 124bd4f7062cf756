// C twins of ptx/core.cu. The fill and the checksum's partial sums are tasks of the thread pool:
// every value is a function of its index, and each partial is summed by one task.
#include <string.h>

#include "runtime/base/pool.h"  // pool_for, POOL_CPU_CLONES
#include "runtime/ref/ref.h"

POOL_CPU_CLONES static void ref_fill_range(void *ctx, uint64_t begin, uint64_t end) {
    const fill_random_args *a = ctx;
    for (uint64_t i = begin; i < end; i++) {
        float value = qt_fill_value(a->seed, a->offset + i, a->dist, a->a, a->b);
        uint64_t at = qt_fill_index(a, i);
        if (a->dtype == QT_DTYPE_BF16) {
            REF_PTR(uint16_t, a->out)[at] = qt_f32_to_bf16(value);
        } else {
            REF_PTR(float, a->out)[at] = value;
        }
    }
}

void ref_qt_fill_random(const fill_random_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(a->count, REF_TASK_ELEMS, ref_fill_range, (void *)a);
}

void ref_qt_copy(const copy_args *a, const launch_shape *shape) {
    (void)shape;
    memmove(REF_PTR(void, a->dst), REF_PTR(const void, a->src), a->bytes);
}

// The sum is exact mod 2^64, so any order gives the GPU's tree result; the partials are still
// written the way the GPU writes them (block b sums the runs of `threads` words that start at
// words (b + j blocks) threads), so a test can compare the workspace too. Blocks are the tasks.
typedef struct ref_checksum_job {
    const checksum_args *a;
    uint32_t threads;  // words per run: the launch's block size
} ref_checksum_job;

POOL_CPU_CLONES static void ref_checksum_blocks(void *ctx, uint64_t b_begin, uint64_t b_end) {
    const ref_checksum_job *job = ctx;
    const checksum_args *a = job->a;
    const uint8_t *src = REF_PTR(const uint8_t, a->src);
    uint64_t words = (a->bytes + 7) / 8, stride = (uint64_t)a->blocks * job->threads;
    for (uint64_t b = b_begin; b < b_end; b++) {
        uint64_t sum = 0;
        for (uint64_t run = b * job->threads; run < words; run += stride) {
            for (uint64_t i = run; i < run + job->threads && i < words; i++) {
                uint64_t word = 0;
                uint64_t first = i * 8;
                uint64_t last = first + 8 <= a->bytes ? first + 8 : a->bytes;
                memcpy(&word, src + first, last - first);  // little-endian host, as the GPU
                sum += qt_checksum_word(word, i);
            }
        }
        REF_PTR(uint64_t, a->partials)[b] = sum;
    }
}

void ref_qt_checksum_partial(const checksum_args *a, const launch_shape *shape) {
    ref_checksum_job job = {a, shape->block[0]};
    uint64_t words_per_block = ((a->bytes + 7) / 8) / (a->blocks ? a->blocks : 1u);
    pool_for(a->blocks, ref_task_rows(words_per_block), ref_checksum_blocks, &job);
}

void ref_qt_checksum_final(const checksum_args *a, const launch_shape *shape) {
    (void)shape;
    uint64_t total = 0;
    for (uint32_t b = 0; b < a->blocks; b++) total += REF_PTR(const uint64_t, a->partials)[b];
    *REF_PTR(uint64_t, a->out) = qt_checksum_finish(total, a->bytes);
}
