// op_quant_group: the grouped-tensor description as op builders see it, and the builder of the
// offsets kernel (ptx/quant_group.cu). Every quantization family's builders take an op_group.
//
// Owns nothing. An op_group names the device regions holding a grouped tensor's row offsets and
// member sizes (ptx/quant_group.h draws the layout); count = 0 means a dense tensor and the two
// refs are then ignored.
#ifndef QT_OP_QUANT_GROUP_H
#define QT_OP_QUANT_GROUP_H

#include "runtime/program/program.h"
#include "ptx/quant_group.h"  // group_offsets_args, qt_group_desc

typedef struct op_group {
    uint32_t count;        // members; 0 = dense
    prog_ref row_offsets;  // u32 [count + 1]
    prog_ref first_dims;   // u32 [count]
} op_group;

// A dense tensor: no member arrays.
static inline op_group op_group_dense(void) { return (op_group){0}; }

// Fills the qt_group_desc at args offset `desc_offset` of op: the count now, and declares both
// arrays as read (their addresses reach the desc at resolve). Nothing for a dense tensor.
qt_status op_group_use(program *p, uint32_t op, uint32_t desc_offset, const op_group *g);

// row_offsets[0] = 0, row_offsets[i + 1] = row_offsets[i] + roundup(first_dims[i], row_align),
// computed on the device (one block), so member sizes written by a device router never need a
// host round trip.
qt_status op_group_offsets(program *p, const char *name, const op_group *g, uint32_t row_align);

#endif  // QT_OP_QUANT_GROUP_H
