// op_quant_nvfp4: builders that append the NVFP4 kernels (ptx/quant_nvfp4.cu) to a program.
//
// Owns nothing; each builder checks its arguments, picks the launch shape, fills the args struct
// and declares every region the op reads and writes (which is also how their addresses reach the
// args). Layouts, numerics and the grouped-tensor rules are described in ptx/quant_nvfp4.h.
//
// Usage for one tensor (input x, RHT on the columnwise copy, as TE quantizes activations):
//
//   op_nvfp4_amax(p, "x.amax", &x, &(op_nvfp4_amax_out){.amax_row = ar, .amax_col = ac,
//                 .rht = true, .rht_signs = QT_NVFP4_RHT_SIGNS_TE});
//   op_nvfp4_quantize(p, "x.quant", &x, &q);   // q.amax_row = ar, q.amax_col = ac, ...
//
// A prog_ref whose arena is NULL means "absent".
#ifndef QT_OP_QUANT_NVFP4_H
#define QT_OP_QUANT_NVFP4_H

#include "runtime/ops/op_quant_group.h"  // op_group
#include "runtime/program/program.h"
#include "ptx/quant_nvfp4.h"             // args structs, flags, launch geometry

typedef struct op_nvfp4_input {
    prog_ref x;      // [rows][cols] bf16 | f32
    uint32_t dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t rows;   // M, or a grouped buffer's rows_capacity
    uint32_t cols;   // K
    op_group group;
} op_nvfp4_input;

// Bytes of each output buffer for a rows x cols tensor (grouped: rows = rows_capacity).
typedef struct op_nvfp4_sizes {
    uint64_t row_data, row_scales, col_data, col_scales;
    uint64_t amax;  // one f32 per member (at least one)
} op_nvfp4_sizes;
op_nvfp4_sizes op_nvfp4_sizes_of(uint32_t rows, uint32_t cols, uint32_t group_count);

typedef struct op_nvfp4_amax_out {
    prog_ref amax_row;  // f32 [max(count, 1)]: max |x| per member
    prog_ref amax_col;  // optional: the columnwise amax (= amax_row without RHT)
    bool rht;           // amax_col over RHT(x^T), rounded to BF16
    uint32_t rht_signs;
} op_nvfp4_amax_out;

// Two ops: zero the amax arrays, then the atomic-max pass over x.
qt_status op_nvfp4_amax(program *p, const char *name, const op_nvfp4_input *in,
                        const op_nvfp4_amax_out *out);
// The pass alone, for arrays that are +0 already: a step's amax slots, which the step's first op
// zeroes (op_sched_zero).
qt_status op_nvfp4_amax_merge(program *p, const char *name, const op_nvfp4_input *in,
                              const op_nvfp4_amax_out *out);

typedef struct op_nvfp4_quant {
    bool rowwise, colwise;  // at least one
    bool rht;               // columnwise copy of RHT(x^T); not with two_d
    uint32_t rht_signs;     // QT_NVFP4_RHT_SIGNS_TE, or 0 for the plain Hadamard matrix
    bool two_d;             // 16x16 tiles (weights)
    bool stochastic;        // stochastic rounding, keyed by (seed, *step, tensor_id, position)
    // QT_NVFP4_*_VALUES: the direction's data region holds its codes' BF16 values (2 bytes an
    // element, [rows][cols] rowwise, [cols][rows] columnwise), its scales are not written (may
    // be absent). Dense BF16 input, rows and cols multiples of 16, not two_d. (Beside the flags
    // above, in their padding: optimizer descriptors embed this struct.)
    bool row_values, col_values;
    uint64_t seed;
    uint32_t tensor_id;     // below QT_QUANT_TENSOR_COLWISE
    prog_ref step;          // u64 device step counter (stochastic only)
    prog_ref amax_row, amax_col;      // f32 [max(count, 1)] global amaxes (per enabled direction)
    prog_ref row_data, row_scales;    // rowwise outputs (rowwise only)
    prog_ref col_data, col_scales;    // columnwise outputs (colwise only)
} op_nvfp4_quant;

qt_status op_nvfp4_quantize(program *p, const char *name, const op_nvfp4_input *in,
                            const op_nvfp4_quant *q);

// Dequantizes one direction's codes back to [rows][cols] (columnwise data is transposed back;
// with RHT it stays in the RHT domain). `amax` is that direction's global amax array.
typedef struct op_nvfp4_dequant {
    uint32_t rows, cols;  // of the original tensor
    op_group group;
    bool colwise;
    prog_ref data, scales, amax;
    prog_ref out;        // [rows][cols]
    uint32_t out_dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
} op_nvfp4_dequant;

qt_status op_nvfp4_dequantize(program *p, const char *name, const op_nvfp4_dequant *d);

// One stored copy (rows x k codes: rowwise rows x cols, or columnwise cols x rows) decoded in its
// own orientation to BF16 rows x k without the global factor (ptx/quant_nvfp4.h,
// qt_nvfp4_decode): a K-major operand for a BF16 GEMM with GEMM_FLAG_ALPHA_NVFP4.
qt_status op_nvfp4_decode(program *p, const char *name, prog_ref data, prog_ref scales,
                          prog_ref out, uint32_t rows, uint32_t k);

#endif  // QT_OP_QUANT_NVFP4_H
