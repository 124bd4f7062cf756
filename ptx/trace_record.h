// trace_record: the per-step record that the device writes into a pinned ring and the host
// prints to the trace file (runtime/io/trace.h). Plain C, shared by host and device code.
//
// Owns nothing. One record per step. On the host a record (qt_trace_record) has room for the
// largest model the parser accepts, and the trace file's header says how many quantizer entries
// are used (the delayed-scaling quantizers, in the runtime's order). In the ring a record has
// exactly the model's entries (qt_trace_ring_bytes apart), so a step writes no more than it
// has to say:
//
//   offset  field                 (host record; the ring's record is the same up to amax)
//        0  step          u64  global step index (train, eval and infer steps alike)
//        8  mode          u32  QT_TRACE_MODE_*
//       12  flags         u32  QT_TRACE_FLAG_*
//       16  loss          f32
//       20  accuracy      f32  correct / valid rows (classification), else 0
//       24  grad_norm     f32  global gradient norm before clipping (train), else 0
//       28  lr            f32  learning rate of the step (train), else 0
//       32  checksum      u64  hash of every persistent region, when FLAG_CHECKSUM
//       40  amax[1024]    f32  this step's amax of each delayed-scaling quantizer
//     4136  scale[1024]   f32  its scale after the step's update
//     8232  end
//
//   ring record of n quantizers: the fields up to checksum (40 bytes), amax[n], scale[n],
//   padded to 16 bytes
#ifndef QT_TRACE_RECORD_H
#define QT_TRACE_RECORD_H

#include <stddef.h>  // offsetof

#include "ptx/qt_hd.h"  // QT_STATIC_ASSERT, uint*_t

// Delayed-scaling slots a record can carry: one per quantized tensor of the parser's largest
// model (roles_max; runtime/model/model.c asserts that it is enough). Only an moe layer's grouped
// quantizers, with one slot per expert, can pass it: the record then carries the first slots
// (model.h, delayed_count) and the plan notes it.
#define QT_TRACE_QUANTIZERS_MAX 1024

#define QT_TRACE_MODE_TRAIN 0u
#define QT_TRACE_MODE_EVAL 1u
#define QT_TRACE_MODE_INFER 2u

#define QT_TRACE_FLAG_SKIPPED 1u   // a non-finite gradient: the update was skipped
#define QT_TRACE_FLAG_CHECKSUM 2u  // `checksum` holds the persistent-state hash of this step
#define QT_TRACE_FLAGS_KNOWN 3u

typedef struct qt_trace_record {
    uint64_t step;
    uint32_t mode;
    uint32_t flags;
    float loss;
    float accuracy;
    float grad_norm;
    float lr;
    uint64_t checksum;
    float amax[QT_TRACE_QUANTIZERS_MAX];
    float scale[QT_TRACE_QUANTIZERS_MAX];
} qt_trace_record;

QT_STATIC_ASSERT(sizeof(qt_trace_record) == 8232, "qt_trace_record size");
QT_STATIC_ASSERT(offsetof(qt_trace_record, mode) == 8, "qt_trace_record.mode");
QT_STATIC_ASSERT(offsetof(qt_trace_record, loss) == 16, "qt_trace_record.loss");
QT_STATIC_ASSERT(offsetof(qt_trace_record, checksum) == 32, "qt_trace_record.checksum");
QT_STATIC_ASSERT(offsetof(qt_trace_record, amax) == 40, "qt_trace_record.amax");
QT_STATIC_ASSERT(offsetof(qt_trace_record, scale) == 4136, "qt_trace_record.scale");

// The fields of a ring record before its arrays: those of qt_trace_record, at its offsets.
typedef struct qt_trace_ring_head {
    uint64_t step;
    uint32_t mode;
    uint32_t flags;
    float loss;
    float accuracy;
    float grad_norm;
    float lr;
    uint64_t checksum;
} qt_trace_ring_head;
QT_STATIC_ASSERT(sizeof(qt_trace_ring_head) == offsetof(qt_trace_record, amax),
                 "the ring's head is the record's head");
QT_STATIC_ASSERT(offsetof(qt_trace_ring_head, checksum) == offsetof(qt_trace_record, checksum),
                 "the ring's head is the record's head");

// Bytes from one ring record to the next, for n quantizers.
QT_HD uint64_t qt_trace_ring_bytes(uint32_t quantizers) {
    return (sizeof(qt_trace_ring_head) + 8ull * quantizers + 15) / 16 * 16;
}

// Ring record `slot` of a ring at `ring`, and its amax and scale arrays.
QT_HD qt_trace_ring_head *qt_trace_ring_at(uint64_t ring, uint64_t slot, uint32_t quantizers) {
    return (qt_trace_ring_head *)(uintptr_t)(ring + slot * qt_trace_ring_bytes(quantizers));
}
QT_HD float *qt_trace_ring_amax(qt_trace_ring_head *r) { return (float *)(r + 1); }
QT_HD float *qt_trace_ring_scale(qt_trace_ring_head *r, uint32_t quantizers) {
    return (float *)(r + 1) + quantizers;
}

// A ring record of n quantizers as a host record; the entries beyond n are zero, so every byte
// of the host record is a function of the step too.
QT_HD void qt_trace_ring_unpack(qt_trace_ring_head *r, uint32_t quantizers, qt_trace_record *out) {
    out->step = r->step;
    out->mode = r->mode;
    out->flags = r->flags;
    out->loss = r->loss;
    out->accuracy = r->accuracy;
    out->grad_norm = r->grad_norm;
    out->lr = r->lr;
    out->checksum = r->checksum;
    const float *amax = qt_trace_ring_amax(r), *scale = qt_trace_ring_scale(r, quantizers);
    for (uint32_t i = 0; i < QT_TRACE_QUANTIZERS_MAX; i++) {
        out->amax[i] = i < quantizers ? amax[i] : 0.0f;
        out->scale[i] = i < quantizers ? scale[i] : 0.0f;
    }
}

#endif  // QT_TRACE_RECORD_H
