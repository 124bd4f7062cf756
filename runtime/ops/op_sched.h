// op_sched: builders that append the schedule loop's bookkeeping kernels (ptx/sched.cu) to a
// program: the slot-indexed copy (with the step's amax slots zeroed and, for current scaling or
// NVFP4, the staged inputs' amax), the step record and the checksum fold.
//
// Owns nothing; each builder picks the launch shape, fills the args struct and declares every
// region the op reads and writes. The counter, the slots and the ring are described in
// ptx/sched_ops.h.
#ifndef QT_OP_SCHED_H
#define QT_OP_SCHED_H

#include "runtime/program/program.h"
#include "ptx/sched_ops.h"

// One side of a slot-indexed copy: slot i starts at ref + i * stride (slots >= 1).
typedef struct op_sched_slots {
    prog_ref ref;
    uint64_t stride;
    uint32_t slots;
} op_sched_slots;

// The amax of the FP32 inputs a staging op stores (ptx/sched_ops.h, sched_amax), for the
// per-tensor cast of the first linear's input: written to `out`, f32 [1] (not merged, so it
// needs no zeroing), through `fold`, u32 [2] that are zero at bind and left zero by every launch
// (a persistent region that nothing else writes). op_sched_copy: inputs [first, first + 4 count)
// bytes of the slot; op_sched_stage_u8: its pixels (first, count unused).
typedef struct op_sched_amax {
    prog_ref out, fold;
    uint64_t first, count;
} op_sched_amax;

// dst slot (counter % dst.slots) <- src slot (counter % src.slots), `bytes` bytes (a multiple
// of 16, as are the offsets and strides). amax: NULL, or the copied inputs' (dst has one slot).
qt_status op_sched_copy(program *p, const char *name, prog_ref counter, op_sched_slots dst,
                        op_sched_slots src, uint64_t bytes, const op_sched_amax *amax);

// The device batch `dst` <- this step's slot of `src` (slot i at src.ref + i * src.stride),
// whose inputs are u8 pixels (ptx/sched_ops.h, qt_sched_stage_u8). The offsets and sizes are those
// of the two layouts (runtime/io/data.h: data_slot_plan for the slot, data_batch_plan for dst).
typedef struct op_sched_stage_desc {
    prog_ref counter;         // u64
    prog_ref dst;             // dst_bytes
    op_sched_slots src;       // src.slots slots of src_bytes
    uint64_t dst_bytes, src_bytes;
    uint64_t pixels;          // batch x stride
    uint64_t inputs_offset;   // of both
    uint64_t src_targets_offset, dst_targets_offset;
    uint32_t targets_bytes;
    const op_sched_amax *amax;  // NULL, or the staged values'
} op_sched_stage_desc;
qt_status op_sched_stage_u8(program *p, const char *name, const op_sched_stage_desc *d);

// The staging op of a run with resident datasets (runtime/io/data.h; ptx/sched_ops.h,
// qt_sched_gather): the device batch `batch` <- this step's slot of `slots`, whose rows are
// gathered from the datasets' device copies by the slot's sample indices (inputs and targets as
// data_load laid them out; an absent dataset's refs absent), or are the slot's own when the host
// staged them whole. IDX pixels become x / 255. amax: NULL, or the batch inputs' (first, count
// unused).
typedef struct op_sched_gather_dataset {
    prog_ref inputs, targets;  // inputs absent: no such dataset
    uint64_t samples;
} op_sched_gather_dataset;
typedef struct op_sched_gather_desc {
    prog_ref counter;     // u64
    op_sched_slots slots;
    prog_ref batch;
    uint64_t slot_bytes, batch_bytes;
    uint64_t inputs_offset, indices_offset;  // of both layouts
    uint64_t slot_targets_offset, batch_targets_offset;
    uint32_t rows, features, stride, outputs;
    uint32_t target_type;  // 0: labels i32, 1: targets f32 [outputs] a row
    uint32_t elem_bytes;   // of the slot's and the datasets' inputs: 1 (u8 pixels) or 4 (f32)
    op_sched_gather_dataset datasets[QT_SCHED_DATASETS];  // train, eval
    const op_sched_amax *amax;
} op_sched_gather_desc;
qt_status op_sched_gather(program *p, const char *name, const op_sched_gather_desc *d);

// `bytes` of `slots` (the step's amax slots, ptx/sched_ops.h sched_zero; a multiple of 4) set to
// +0 by `op`, the step's staging op appended earlier (op_sched_copy, op_sched_stage_u8 or
// op_sched_gather), in
// the same launch as its copy. Declared once the program's other ops are built (prog_use_late):
// the region is whole then, and its declared write orders every later use of the slots after
// the op, so no producer of the step merges into a slot before it is zeroed.
qt_status op_sched_zero(program *p, uint32_t op, prog_ref slots, uint64_t bytes);

typedef struct op_sched_record_desc {
    prog_ref counter;      // u64
    prog_ref ring;         // ring_len records of `quantizers` entries (qt_trace_ring_bytes)
    uint32_t ring_len;
    uint32_t mode;         // QT_TRACE_MODE_*
    prog_ref loss;         // qt_loss_stats, optional
    bool accuracy;         // classification: accuracy = correct / valid
    prog_ref gnorm;        // qt_gnorm_result, optional
    prog_ref optim;        // optim_state, optional
    prog_ref amax;         // f32 [quantizers], optional
    prog_ref scale;        // f32 [quantizers], optional
    uint32_t quantizers;
} op_sched_record_desc;

qt_status op_sched_record(program *p, const char *name, const op_sched_record_desc *d);

// Folds hashes (u64 [count]) into the last record written (see ptx/sched_ops.h); the ring's
// records have `quantizers` entries.
qt_status op_sched_checksum(program *p, const char *name, prog_ref counter, prog_ref ring,
                            uint32_t ring_len, uint32_t quantizers, prog_ref hashes,
                            uint32_t count);

// At global step `step` only, the FP32 word at target := bits (qt_sched_inject: a fault that
// tests and soaks plant in a gradient).
qt_status op_sched_inject(program *p, const char *name, prog_ref counter, uint64_t step,
                          prog_ref target, uint32_t bits);

#endif  // QT_OP_SCHED_H
