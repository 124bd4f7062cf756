// trace_record: the fixed per-step record that the device writes into a pinned ring and the host
// prints to the trace file (runtime/trace.h). Plain C, shared by host and device code.
//
// Owns nothing. One record per step, whatever the recipe: the quantizer arrays have a fixed
// capacity and the trace file's header says how many entries are used (the delayed-scaling
// quantizers, in the runtime's order), so the layout never depends on the model.
//
//   offset  field
//        0  step          u64  global step index (train, eval and infer steps alike)
//        8  mode          u32  QT_TRACE_MODE_*
//       12  flags         u32  QT_TRACE_FLAG_*
//       16  loss          f32
//       20  accuracy      f32  correct / valid rows (classification), else 0
//       24  grad_norm     f32  global gradient norm before clipping (train), else 0
//       28  lr            f32  learning rate of the step (train), else 0
//       32  checksum      u64  hash of every persistent region, when FLAG_CHECKSUM
//       40  amax[64]      f32  this step's amax of each delayed-scaling quantizer
//      296  scale[64]     f32  its scale after the step's update
//      552  end
#ifndef QT_TRACE_RECORD_H
#define QT_TRACE_RECORD_H

#include <stddef.h>  // offsetof

#include "qt_hd.h"  // QT_STATIC_ASSERT, uint*_t

// Delayed-scaling slots a record can carry; a model with more (an moe layer's grouped quantizers
// have one per expert) records the first ones (model.h, delayed_count) and notes it in its plan.
#define QT_TRACE_QUANTIZERS_MAX 64

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

QT_STATIC_ASSERT(sizeof(qt_trace_record) == 552, "qt_trace_record size");
QT_STATIC_ASSERT(offsetof(qt_trace_record, mode) == 8, "qt_trace_record.mode");
QT_STATIC_ASSERT(offsetof(qt_trace_record, loss) == 16, "qt_trace_record.loss");
QT_STATIC_ASSERT(offsetof(qt_trace_record, checksum) == 32, "qt_trace_record.checksum");
QT_STATIC_ASSERT(offsetof(qt_trace_record, amax) == 40, "qt_trace_record.amax");
QT_STATIC_ASSERT(offsetof(qt_trace_record, scale) == 296, "qt_trace_record.scale");

#endif  // QT_TRACE_RECORD_H
