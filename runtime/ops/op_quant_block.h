// op_quant_block: builders that append the FP8 block-scaling kernels (ptx/quant_block.cu) to a
// program: the 1x128 fused rowwise + columnwise cast, the 128x128 cast, and dequantization.
//
// Owns nothing; each builder picks the kernel and launch shape, fills the args struct and
// declares every region the op reads and writes. Layouts: ptx/quant_block.h.
#ifndef QT_OP_QUANT_BLOCK_H
#define QT_OP_QUANT_BLOCK_H

#include "runtime/ops/op_quant_group.h"  // op_group
#include "runtime/program/program.h"     // program, prog_ref
#include "ptx/quant_block.h"             // QT_BLOCK_*, the args structs

// The storage of one block-scaled FP8 tensor. A direction that is off needs no regions.
typedef struct op_block_tensor {
    uint32_t rows;     // M, or the grouped buffer's rows_capacity
    uint32_t cols;     // K
    bool two_d;        // 128x128 tiles (weights) instead of 1x128 blocks
    uint32_t fp8;      // QT_BLOCK_E4M3 | QT_BLOCK_E5M2
    bool rowwise, colwise;
    prog_ref row_codes, row_scale_inv;  // u8 [rows][cols]; f32, see op_block_scale_count
    prog_ref col_codes, col_scale_inv;  // u8 [cols][rows]; f32
    op_group group;
} op_block_tensor;

// Scale options; NULL means the recipe defaults: power-of-two scales, eps 0.
typedef struct op_block_options {
    bool fp32_scales;  // TE's use_f32_scales: exact qmax/amax scales instead of powers of two
    float eps;         // amax epsilon
} op_block_options;

// Number of FP32 scale_inv entries of one direction of a tensor.
uint64_t op_block_scale_count(uint32_t rows, uint32_t cols, bool two_d, bool colwise);
// Blocks (or 2-D tiles) of QT_BLOCK_LEN along a dimension of n elements, the last one partial.
uint64_t op_block_tiles(uint64_t n);

// Quantizes `input` (rows x cols, QT_DTYPE_BF16 or QT_DTYPE_F32) into every enabled direction of
// t in one pass over the input.
qt_status op_quant_block(program *p, const char *name, prog_ref input, uint32_t in_dtype,
                         const op_block_tensor *t, const op_block_options *options);

// An activation and the 1-D cast of its output into t (dense, BF16 rows x cols of t, cols % 8
// == 0): y = act(x) forward, dy * act'(x) backward (dy NULL-equivalent forward), the bits of the
// activation's stored BF16 output cast by op_quant_block, in one pass over x (and dy) that never
// writes y (quant_block_act_args). act: QT_ACT_GELU | QT_ACT_SILU. x and dy 16-byte aligned.
qt_status op_quant_block_act(program *p, const char *name, uint32_t act, bool backward,
                             prog_ref x, prog_ref dy, const op_block_tensor *t,
                             const op_block_options *options);

// Dequantizes one direction of t (colwise: the transposed copy) into out, rows x cols of
// out_dtype (QT_DTYPE_BF16 or QT_DTYPE_F32). Rows at or beyond the group's active rows are not
// written.
qt_status op_dequant_block(program *p, const char *name, const op_block_tensor *t, bool colwise,
                           prog_ref out, uint32_t out_dtype);

#endif  // QT_OP_QUANT_BLOCK_H
