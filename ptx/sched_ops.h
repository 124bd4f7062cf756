// sched_ops: the bookkeeping kernels of the schedule loop (runtime/schedule/schedule.c): the ABI of
// ptx/sched.cu and the per-record arithmetic it shares with its C twins (runtime/ref/ref_sched.c).
//
// Owns nothing. One captured graph per mode serves every step, so whatever changes from step to
// step is chosen on the device from one counter that the graph itself advances:
//
//   counter  u64, device memory: the global step index of the step that is running (train, eval
//            and infer steps alike); qt_sched_record, the last op of every step, adds one.
//
//   kernel              what                                              launch
//   qt_sched_copy       dst slot (counter % dst_slots) <- src slot        1-D grid-stride over
//                       (counter % src_slots), 16-byte words: the batch    16-byte words
//                       from this step's device slot (FP32 inputs), and
//                       the infer outputs' device-to-host copy
//   qt_sched_stage_u8   the batch <- this step's device slot (counter %     1-D grid-stride over
//                       src_slots) whose inputs are u8 pixels: header and   16-pixel chunks
//                       targets copied, pixels -> FP32 x / 255 (IDX data
//                       crosses PCIe as bytes, a quarter of FP32's)
//                       Both, as a step's first op, also zero the step's
//                       amax slots (sched_zero), the same grid striding
//                       over their words, and may store the amax of the
//                       inputs they write (sched_amax)
//   qt_sched_gather     the staging op of a run with resident datasets      1-D grid-stride over
//                       (runtime/io/data.h): the batch <- this step's       input quads
//                       device slot's header region, and the rows and
//                       targets its sample indices name, read from the
//                       datasets' device copies (zero past `features`;
//                       padding rows zero with label -1); a slot the
//                       host filled with rows gives its own. IDX pixels
//                       become x / 255. The same zeroing and amax as the
//                       two above
//   qt_sched_record     the step's record into ring[counter % ring_len]    1 block x 32 threads
//                       (pinned host memory; ptx/trace_record.h's ring
//                       layout); counter += 1
//   qt_sched_checksum   folds the per-region hashes into the record of     1 block x 32 threads,
//                       the step that just ended (ring[(counter - 1) %     thread 0 works
//                       ring_len]) and sets its checksum flag
//   qt_sched_inject     a fault for tests and soaks: when the counter is   1 thread
//                       `step`, one FP32 word (a gradient element) := the
//                       given bits (a NaN or an infinity)
//
// The batch of step s reaches device slot s % 2 through a copy-engine copy that the schedule
// loop queues beside step s - 1, and step s's graph waits for it (runtime/schedule/schedule.h), so
// the first op reads device memory only. The host reads record s a few steps later, after waiting
// for an event recorded behind step s: the record and the infer outputs are written to pinned host
// memory directly (unified addressing), so no copy call and no synchronization is needed inside
// a step.
//
// Record fields (ptx/trace_record.h): loss = stats.loss_mean; accuracy = correct / valid (one
// IEEE division, 0 when nothing is valid or the loss is not a classification); grad_norm = the
// global norm before clipping; lr = the optimizer's lr of this step; flags: SKIPPED when the
// optimizer skipped the step; amax[i] / scale[i] from two FP32 arrays of `quantizers` entries
// (absent arrays give zeros), so every byte of a ring record is a function of the step.
#ifndef QT_SCHED_H
#define QT_SCHED_H

#include <stddef.h>  // offsetof

#include "ptx/act.h"           // qt_loss_stats, qt_gnorm_result
#include "ptx/core.h"          // qt_mix64
#include "ptx/optim.h"         // optim_state
#include "ptx/quant_fp8.h"     // qt_fp8_amax_step: the staging ops' amax is the pass's
#include "ptx/qt_hd.h"
#include "ptx/trace_record.h"  // qt_trace_record, QT_TRACE_*

#define QT_SCHED_THREADS 256u      // qt_sched_copy block size
#define QT_SCHED_RECORD_THREADS 32u

// The step's amax slots (runtime/model/model.c: the program's region "<mode>.step#amax", whose
// parts the step's per-tensor amaxes are): a producer merges each tensor's amax into its slot
// with an atomic max, so every slot must be +0 before the step's first merge. The step's first
// op zeroes them all, in place of one launch per slot.
typedef struct sched_zero {
    uint64_t at;      // u32 [words] set to 0 (+0.0f); 0: none
    uint32_t words;
    uint32_t reserved;
} sched_zero;
QT_STATIC_ASSERT(sizeof(sched_zero) == 16, "sched_zero layout");

// The amax of the inputs a staging op stores, for the per-tensor cast (current scaling, NVFP4's
// global amax) of the first linear's input: max |x| over the FP32 values written (NaN skipped,
// -0 as +0, Inf kept: what qt_fp8_amax would read back), so that the step needs no amax pass
// over its batch. The slot is written, not merged: the op's own blocks combine their maxima
// through `fold`, and the block that takes the last ticket stores the maximum and leaves
// `fold` zero again, as qt_gnorm's fold does (the step's amax slots are being zeroed by this
// very launch, so a merge into one of them could meet a zeroing block).
typedef struct sched_amax {
    uint64_t out;     // f32 [1], written; 0: none
    uint64_t fold;    // u32 [2]: the blocks' running maximum (bits), their ticket; zero before
                      // the launch and after it (a persistent region, zero from bind)
    uint64_t first;   // qt_sched_copy: byte offset of the first FP32 input in the slot, a
                      // multiple of 16; qt_sched_stage_u8: 0 (the pixels are the inputs)
    uint64_t count;   // qt_sched_copy: FP32 inputs from there; qt_sched_stage_u8: 0
} sched_amax;
QT_STATIC_ASSERT(sizeof(sched_amax) == 32, "sched_amax layout");

typedef struct sched_copy_args {
    sched_zero zero;      // first in both staging ops' args (op_sched_zero sets it in either)
    sched_amax amax;      // the inputs' amax; out 0 for none
    uint64_t counter;     // u64 device step counter, read
    uint64_t dst, src;    // slot 0 of each side
    uint64_t dst_stride;  // bytes from one slot to the next
    uint64_t src_stride;
    uint64_t bytes;       // a multiple of 16; dst, src and the strides too
    uint32_t dst_slots;   // >= 1: the slot is counter % slots (1: always slot 0)
    uint32_t src_slots;
} sched_copy_args;
QT_STATIC_ASSERT(sizeof(sched_copy_args) == 104, "sched_copy_args layout");

// Both sides have the parts of runtime/io/data.h's slot layout at the same offsets up to the
// inputs (the header region, `inputs_offset` bytes); the targets sit at their own offsets.
typedef struct sched_stage_u8_args {
    sched_zero zero;          // as sched_copy_args.zero
    sched_amax amax;          // the pixels' FP32 values' amax; out 0 for none
    uint64_t counter;         // u64 device step counter, read
    uint64_t dst, src;        // the device batch; slot 0 of the device slots
    uint64_t src_stride;      // bytes from one slot to the next
    uint64_t pixels;          // u8 inputs (batch x stride) -> as many FP32 values
    uint64_t inputs_offset;   // of both sides; a multiple of 16, as are the other offsets
    uint64_t src_targets_offset, dst_targets_offset;
    uint32_t targets_bytes;   // a multiple of 16
    uint32_t src_slots;       // >= 1
} sched_stage_u8_args;
QT_STATIC_ASSERT(sizeof(sched_stage_u8_args) == 120, "sched_stage_u8_args layout");
QT_STATIC_ASSERT(offsetof(sched_copy_args, zero) == 0 &&
                     offsetof(sched_stage_u8_args, zero) == 0,
                 "the staging ops' zero spans share their place");
QT_STATIC_ASSERT(offsetof(sched_copy_args, amax) == offsetof(sched_stage_u8_args, amax),
                 "the staging ops' amaxes share their place");

#define QT_SCHED_STAGE_CHUNK 16u  // pixels per thread step: one 16-byte load, four float4 stores

// The resident datasets a gather may read: data.h's DATA_DATASET_TRAIN and DATA_DATASET_EVAL.
#define QT_SCHED_DATASETS 2u

typedef struct sched_gather_dataset {
    uint64_t inputs;   // (samples, features) u8 or f32; 0: no such dataset
    uint64_t targets;  // labels i32 (samples) or targets f32 (samples, outputs)
    uint64_t samples;  // an index at or past it stages as a padding row (the host writes none)
} sched_gather_dataset;
QT_STATIC_ASSERT(sizeof(sched_gather_dataset) == 24, "sched_gather_dataset layout");

// The staging op of a run with resident datasets: the slot and the batch have runtime/io/data.h's
// layouts with an indices part (the same header region, [0, inputs_offset), in both).
typedef struct sched_gather_args {
    sched_zero zero;           // first, as in the other staging ops (op_sched_zero sets it)
    sched_amax amax;           // the batch inputs' amax; out 0 for none (first, count unused)
    uint64_t counter;          // u64 device step counter, read
    uint64_t slots;            // slot 0 of the device slots, read
    uint64_t slot_stride;      // bytes from one slot to the next
    uint64_t batch;            // the device batch, written
    sched_gather_dataset datasets[QT_SCHED_DATASETS];
    uint64_t inputs_offset;    // of both: the header region's end
    uint64_t indices_offset;   // u32 [rows]
    uint64_t slot_targets_offset, batch_targets_offset;
    uint32_t slot_count;       // >= 1: the slot is counter % slot_count
    uint32_t rows, features, stride, outputs;
    uint32_t target_type;      // 0: labels i32 (rows), 1: targets f32 (rows, outputs)
    uint32_t elem_bytes;       // the slot's and the datasets' inputs: 1 (u8 pixels) or 4 (f32)
    uint32_t reserved;
} sched_gather_args;
QT_STATIC_ASSERT(sizeof(sched_gather_args) == 192, "sched_gather_args layout");
QT_STATIC_ASSERT(offsetof(sched_gather_args, zero) == 0 &&
                     offsetof(sched_gather_args, amax) == offsetof(sched_copy_args, amax),
                 "the staging ops' zero spans and amaxes share their places");

#define QT_SCHED_INDEX_PAD 0xFFFFFFFFu  // data.h's DATA_INDEX_PAD
#define QT_SCHED_LABEL_PAD (-1)         // data.h's DATA_LABEL_PAD
#define QT_SCHED_HEADER_DATASET 44u     // offset of data_slot_header.dataset

#define QT_KERNELS_SCHED(X)                                                 \
    X(KERNEL_SCHED_COPY, sched, qt_sched_copy, sched_copy_args)            \
    X(KERNEL_SCHED_STAGE_U8, sched, qt_sched_stage_u8, sched_stage_u8_args) \
    X(KERNEL_SCHED_GATHER, sched, qt_sched_gather, sched_gather_args)      \
    X(KERNEL_SCHED_RECORD, sched, qt_sched_record, sched_record_args)      \
    X(KERNEL_SCHED_CHECKSUM, sched, qt_sched_checksum, sched_checksum_args) \
    X(KERNEL_SCHED_INJECT, sched, qt_sched_inject, sched_inject_args)

// An IDX pixel as the model sees it: one IEEE division, correctly rounded. It is monotonic, so
// the largest value staged is the largest pixel's: the staging op's amax needs one conversion.
QT_HD float qt_sched_pixel(uint8_t value) { return (float)value / 255.0f; }

// Byte offsets of this step's slots.
QT_HD uint64_t qt_sched_slot_offset(uint64_t counter, uint32_t slots, uint64_t stride) {
    return (counter % slots) * stride;
}

// Row r's inputs, elem_bytes each, `features` of them: its sample's row in resident dataset
// `dataset`, or the slot's own row r when dataset is QT_SCHED_DATASETS (a batch the host
// staged whole, zero past features already); NULL for a padding row of a gathered batch (the
// index pad, or one at or past the samples). *index gets the sample's index.
QT_HD const uint8_t *qt_sched_gather_row(const sched_gather_args *a, const uint8_t *slot,
                                         uint32_t dataset, uint32_t r, uint32_t *index) {
    if (dataset == QT_SCHED_DATASETS) {
        *index = r;
        return slot + a->inputs_offset + (uint64_t)r * a->stride * a->elem_bytes;
    }
    const sched_gather_dataset *d = &a->datasets[dataset];
    uint32_t i = ((const uint32_t *)(const void *)(slot + a->indices_offset))[r];
    *index = i;
    if (i == QT_SCHED_INDEX_PAD || (uint64_t)i >= d->samples) return 0;
    return (const uint8_t *)(uintptr_t)d->inputs + (uint64_t)i * a->features * a->elem_bytes;
}

// Input j of a row as the batch holds it: an IDX pixel's x / 255, an FP32 value as it is; zero
// past the row's features (a gathered row) or in a padding row.
QT_HD float qt_sched_gather_value(const sched_gather_args *a, const uint8_t *row, uint32_t j,
                                  uint32_t limit) {
    if (row == 0 || j >= limit) return 0.0f;
    if (a->elem_bytes == 1) return qt_sched_pixel(row[j]);
    return ((const float *)(const void *)row)[j];
}

// Target e (of outputs per row, or the row's label) of row r as the batch holds it.
QT_HD uint32_t qt_sched_gather_target(const sched_gather_args *a, const uint8_t *slot,
                                      uint32_t dataset, uint32_t r, uint32_t e) {
    uint32_t per_row = a->target_type == 0 ? 1u : a->outputs;
    if (dataset == QT_SCHED_DATASETS) {
        return ((const uint32_t *)(const void *)(slot + a->slot_targets_offset))
            [(uint64_t)r * per_row + e];
    }
    uint32_t index;
    const uint8_t *row = qt_sched_gather_row(a, slot, dataset, r, &index);
    if (row == 0) return a->target_type == 0 ? (uint32_t)QT_SCHED_LABEL_PAD : 0u;
    return ((const uint32_t *)(uintptr_t)a->datasets[dataset].targets)
        [(uint64_t)index * per_row + e];
}

// The dataset a slot's header names (k + 1), or QT_SCHED_DATASETS when it holds rows or names
// a dataset the run keeps none of.
QT_HD uint32_t qt_sched_gather_dataset(const sched_gather_args *a, const uint8_t *slot) {
    uint32_t d = *(const uint32_t *)(const void *)(slot + QT_SCHED_HEADER_DATASET);
    if (d == 0 || d > QT_SCHED_DATASETS || a->datasets[d - 1].inputs == 0) {
        return QT_SCHED_DATASETS;
    }
    return d - 1;
}

typedef struct sched_record_args {
    uint64_t counter;     // u64 device step counter, read and incremented
    uint64_t ring;        // ring_len records of `quantizers` entries (qt_trace_ring_bytes)
    uint64_t loss;        // qt_loss_stats, or 0 (loss and accuracy 0)
    uint64_t gnorm;       // qt_gnorm_result, or 0 (grad_norm 0)
    uint64_t optim;       // optim_state, or 0 (lr 0, never skipped)
    uint64_t amax;        // f32 [quantizers], or 0 (zeros)
    uint64_t scale;       // f32 [quantizers], or 0 (zeros)
    uint32_t ring_len;    // >= 1
    uint32_t quantizers;  // <= QT_TRACE_QUANTIZERS_MAX
    uint32_t mode;        // QT_TRACE_MODE_*
    uint32_t accuracy;    // 1: accuracy = correct / valid (classification)
} sched_record_args;
QT_STATIC_ASSERT(sizeof(sched_record_args) == 72, "sched_record_args layout");

typedef struct sched_checksum_args {
    uint64_t counter;     // u64 device step counter, read (records written so far)
    uint64_t ring;        // ring_len records of `quantizers` entries
    uint64_t hashes;      // u64 [count]: one op_checksum result per persistent region, in order
    uint32_t ring_len;    // >= 1
    uint32_t count;
    uint32_t quantizers;  // of the ring's records
    uint32_t reserved;
} sched_checksum_args;
QT_STATIC_ASSERT(sizeof(sched_checksum_args) == 40, "sched_checksum_args layout");

typedef struct sched_inject_args {
    uint64_t counter;  // u64 device step counter, read
    uint64_t target;   // f32, written at step `step` only
    uint64_t step;     // the global step index that gets the fault
    uint32_t bits;     // the value written (0x7FC00000: NaN, 0x7F800000: +infinity)
    uint32_t reserved;
} sched_inject_args;
QT_STATIC_ASSERT(sizeof(sched_inject_args) == 32, "sched_inject_args layout");


// Everything of a record but the amax and scale arrays, written field by field (the record
// lives in pinned host memory; a device thread writes it through unified addressing).
QT_HD void qt_sched_record_header(const sched_record_args *a, uint64_t step,
                                  qt_trace_ring_head *r) {
    float loss = 0.0f, accuracy = 0.0f, grad_norm = 0.0f, lr = 0.0f;
    uint32_t flags = 0;
    if (a->loss != 0) {
        const qt_loss_stats *s = (const qt_loss_stats *)(uintptr_t)a->loss;
        loss = s->loss_mean;
        if (a->accuracy && s->valid != 0) accuracy = (float)s->correct / (float)s->valid;
    }
    if (a->gnorm != 0) grad_norm = ((const qt_gnorm_result *)(uintptr_t)a->gnorm)->norm;
    if (a->optim != 0) {
        const optim_state *o = (const optim_state *)(uintptr_t)a->optim;
        lr = o->lr;
        if (o->skip) flags |= QT_TRACE_FLAG_SKIPPED;
    }
    r->step = step;
    r->mode = a->mode;
    r->flags = flags;
    r->loss = loss;
    r->accuracy = accuracy;
    r->grad_norm = grad_norm;
    r->lr = lr;
    r->checksum = 0;
}

// Entry i (< quantizers) of the record's amax and scale arrays.
QT_HD void qt_sched_record_entry(const sched_record_args *a, uint32_t i, qt_trace_ring_head *r) {
    float amax = 0.0f, scale = 0.0f;
    if (a->amax != 0) amax = ((const float *)(uintptr_t)a->amax)[i];
    if (a->scale != 0) scale = ((const float *)(uintptr_t)a->scale)[i];
    qt_trace_ring_amax(r)[i] = amax;
    qt_trace_ring_scale(r, a->quantizers)[i] = scale;
}

// The persistent-state checksum of a step: the regions' hashes folded in order (position
// sensitive, since each step goes through the mixer).
QT_HD uint64_t qt_sched_checksum_fold(const uint64_t *hashes, uint32_t count) {
    uint64_t h = 0x6A09E667F3BCC909ull;
    for (uint32_t i = 0; i < count; i++) h = qt_mix64(h ^ hashes[i]);
    return h;
}

#endif  // QT_SCHED_H
