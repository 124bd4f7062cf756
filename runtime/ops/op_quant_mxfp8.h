// op_quant_mxfp8: builders that append the MXFP8 kernels (ptx/quant_mxfp8.cu) to a program.
//
// Owns nothing; each builder picks the launch shape, fills the args struct and declares every
// region the op reads and writes. Layouts (quant_mxfp8.h, ptx/quant.h), for rows x cols:
//
//   rowwise     codes u8 [rows][cols]          scales e8m0 [rows][ceil(cols/32)]
//   columnwise  codes u8 [rows][cols] (not T)  scales e8m0 [ceil(rows/32)][cols]
//
// A grouped tensor uses the same layouts over its rows_capacity padded rows; its row_offsets
// (multiples of 32, the mxfp8 row_align) and first_dims live in device memory.
#ifndef QT_OP_QUANT_MXFP8_H
#define QT_OP_QUANT_MXFP8_H

#include "runtime/ops/op_quant_group.h"  // op_group
#include "recipes/format.h"              // qt_elem
#include "runtime/program/program.h"

// One direction's data. codes.arena == NULL: the direction is not produced (quantize).
typedef struct op_mxfp8_dir {
    prog_ref codes;
    prog_ref scales;
} op_mxfp8_dir;

typedef struct op_mxfp8_quantize_desc {
    prog_ref in;           // [rows][cols] of dtype
    uint32_t dtype;        // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t rows, cols;   // rows: M, or rows_capacity of a grouped tensor
    qt_elem elem;          // QT_ELEM_E4M3 | QT_ELEM_E5M2
    bool tile_2d;          // one scale per 32 x 32 tile for both directions (weights)
    // The direction's codes ref receives the codes' BF16 values ([rows][cols], 2 bytes an
    // element: what op_mxfp8_dequantize would write to BF16) instead of the codes, and its
    // scales ref must be absent (QT_MXFP8_FLAG_ROW_VALUES, _COL_VALUES).
    bool row_values, col_values;
    op_mxfp8_dir rowwise;
    op_mxfp8_dir colwise;
    op_group group;
} op_mxfp8_quantize_desc;

typedef struct op_mxfp8_dequantize_desc {
    op_mxfp8_dir src;      // codes and the scales of the direction below
    bool colwise;          // scales are columnwise ([ceil(rows/32)][cols])
    qt_elem elem;
    uint32_t rows, cols;
    prog_ref out;          // [rows][cols] of dtype
    uint32_t dtype;        // QT_DTYPE_BF16 | QT_DTYPE_F32
    op_group group;  // rows at or beyond row_offsets[count] are not written
} op_mxfp8_dequantize_desc;

// Bytes of each buffer.
uint64_t op_mxfp8_codes_bytes(uint32_t rows, uint32_t cols);
uint64_t op_mxfp8_row_scales_bytes(uint32_t rows, uint32_t cols);
uint64_t op_mxfp8_col_scales_bytes(uint32_t rows, uint32_t cols);

// The fused cast: one kernel, one read of the input, both directions (either may be absent).
// An empty tensor (rows or cols 0) appends nothing.
qt_status op_mxfp8_quantize(program *p, const char *name, const op_mxfp8_quantize_desc *d);
qt_status op_mxfp8_dequantize(program *p, const char *name, const op_mxfp8_dequantize_desc *d);

// An activation and the MXFP8 cast of its output in one pass (qt_mxfp8_act_fwd, _bwd): d->in is
// x, the activation's BF16 input; backward also reads dy (BF16, x's shape), the gradient at the
// output. The outputs are d's, the bits of op_act_forward / op_act_backward followed by
// op_mxfp8_quantize of the BF16 tensor they would store, which is never written
// (mxfp8_act_args). act: QT_ACT_GELU | QT_ACT_SILU; dense, 1-D, cols % 8 == 0, x and dy 16-byte
// aligned.
qt_status op_mxfp8_act(program *p, const char *name, uint32_t act, bool backward, prog_ref dy,
                       const op_mxfp8_quantize_desc *d);

#endif  // QT_OP_QUANT_MXFP8_H
