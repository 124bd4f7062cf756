// C twins of ptx/sched.cu.
#include <string.h>

#include "runtime/base/pool.h"  // pool_for: the pixels in ranges
#include "runtime/ref/ref.h"

static void ref_sched_zero_slots(const sched_zero *zero) {
    if (zero->words > 0) memset(REF_PTR(void, zero->at), 0, (size_t)zero->words * 4);
}

// sched_amax: the kernels' fold ends with the maximum stored to out and the fold words zero;
// here the maximum is taken in one pass and the fold words are left as they are (zero).
static void ref_sched_amax_store(const sched_amax *a, float m) {
    *REF_PTR(float, a->out) = m;
}

void ref_qt_sched_copy(const sched_copy_args *a, const launch_shape *shape) {
    (void)shape;
    ref_sched_zero_slots(&a->zero);
    uint64_t counter = *REF_PTR(const uint64_t, a->counter);
    uint64_t src = a->src + qt_sched_slot_offset(counter, a->src_slots, a->src_stride);
    uint64_t dst = a->dst + qt_sched_slot_offset(counter, a->dst_slots, a->dst_stride);
    memmove(REF_PTR(void, dst), REF_PTR(const void, src), a->bytes);
    if (a->amax.out == 0) return;
    const float *inputs = REF_PTR(const float, dst + a->amax.first);
    float m = 0.0f;
    for (uint64_t i = 0; i < a->amax.count; i++) m = qt_fp8_amax_step(m, inputs[i]);
    ref_sched_amax_store(&a->amax, m);
}

typedef struct ref_stage_job {
    const uint8_t *pixels;
    float *values;
    float amax;  // the largest value, merged by the tasks
} ref_stage_job;

// The values are x / 255, monotonic in x: a task's largest is its brightest pixel's.
static void ref_stage_pixels(void *ctx, uint64_t begin, uint64_t end) {
    ref_stage_job *job = ctx;
    uint8_t brightest = 0;
    for (uint64_t i = begin; i < end; i++) {
        job->values[i] = qt_sched_pixel(job->pixels[i]);
        if (job->pixels[i] > brightest) brightest = job->pixels[i];
    }
    ref_amax_merge(&job->amax, qt_sched_pixel(brightest));
}

void ref_qt_sched_stage_u8(const sched_stage_u8_args *a, const launch_shape *shape) {
    (void)shape;
    ref_sched_zero_slots(&a->zero);
    uint64_t counter = *REF_PTR(const uint64_t, a->counter);
    const uint8_t *src = REF_PTR(const uint8_t, a->src) +
                         qt_sched_slot_offset(counter, a->src_slots, a->src_stride);
    uint8_t *dst = REF_PTR(uint8_t, a->dst);
    ref_stage_job job = {src + a->inputs_offset, (float *)(void *)(dst + a->inputs_offset),
                         0.0f};
    pool_for(a->pixels, REF_TASK_ELEMS, ref_stage_pixels, &job);
    if (a->amax.out != 0) ref_sched_amax_store(&a->amax, job.amax);
    memmove(dst, src, a->inputs_offset);
    memmove(dst + a->dst_targets_offset, src + a->src_targets_offset, a->targets_bytes);
}

void ref_qt_sched_gather(const sched_gather_args *a, const launch_shape *shape) {
    (void)shape;
    ref_sched_zero_slots(&a->zero);
    uint64_t counter = *REF_PTR(const uint64_t, a->counter);
    const uint8_t *slot = REF_PTR(const uint8_t, a->slots) +
                          qt_sched_slot_offset(counter, a->slot_count, a->slot_stride);
    uint8_t *batch = REF_PTR(uint8_t, a->batch);
    uint32_t dataset = qt_sched_gather_dataset(a, slot);
    uint32_t limit = dataset == QT_SCHED_DATASETS ? a->stride : a->features;
    memmove(batch, slot, a->inputs_offset);
    float *inputs = (float *)(void *)(batch + a->inputs_offset);
    float m = 0.0f;
    for (uint32_t r = 0; r < a->rows; r++) {
        uint32_t index;
        const uint8_t *row = qt_sched_gather_row(a, slot, dataset, r, &index);
        for (uint32_t j = 0; j < a->stride; j++) {
            float v = qt_sched_gather_value(a, row, j, limit);
            inputs[(uint64_t)r * a->stride + j] = v;
            m = qt_fp8_amax_step(m, v);
        }
    }
    uint32_t per_row = a->target_type == 0 ? 1u : a->outputs;
    uint32_t *targets = (uint32_t *)(void *)(batch + a->batch_targets_offset);
    for (uint64_t e = 0; e < (uint64_t)a->rows * per_row; e++) {
        targets[e] = qt_sched_gather_target(a, slot, dataset, (uint32_t)(e / per_row),
                                            (uint32_t)(e % per_row));
    }
    if (a->amax.out != 0) ref_sched_amax_store(&a->amax, m);
}

void ref_qt_sched_record(const sched_record_args *a, const launch_shape *shape) {
    (void)shape;
    uint64_t *counter = REF_PTR(uint64_t, a->counter);
    uint64_t step = *counter;
    qt_trace_ring_head *r = qt_trace_ring_at(a->ring, step % a->ring_len, a->quantizers);
    for (uint32_t i = 0; i < a->quantizers; i++) qt_sched_record_entry(a, i, r);
    qt_sched_record_header(a, step, r);
    *counter = step + 1;
}

void ref_qt_sched_checksum(const sched_checksum_args *a, const launch_shape *shape) {
    (void)shape;
    uint64_t counter = *REF_PTR(const uint64_t, a->counter);
    if (counter == 0) return;
    qt_trace_ring_head *r = qt_trace_ring_at(a->ring, (counter - 1) % a->ring_len, a->quantizers);
    r->checksum = qt_sched_checksum_fold(REF_PTR(const uint64_t, a->hashes), a->count);
    r->flags |= QT_TRACE_FLAG_CHECKSUM;
}

void ref_qt_sched_inject(const sched_inject_args *a, const launch_shape *shape) {
    (void)shape;
    if (*REF_PTR(const uint64_t, a->counter) == a->step) *REF_PTR(uint32_t, a->target) = a->bits;
}
