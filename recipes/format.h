// format: the table of number formats (ggml type_traits style): one const row per format, indexed
// by qt_format. A format is its row here and its reference codec in ptx/qt_codec.h. The runtime
// reads the facts of a format from its row (block shape, scale type, alignment, columnwise
// layout, K padding unit, GEMM kernel family); where a format needs code of its own (which
// quantize, dequantize and optimizer kernels to build, the checkpoint's scale shapes), the
// runtime switches over qt_format with a case per format and no `default:`, so that a new format
// fails to compile at each of those places (runtime/DESIGN.md "Formats, schemes and recipes"
// lists them).
//
// Owns the const table, which lives for the whole program; any thread may read it.
//
// Scaling blocks, in elements of the row-major M x K matrix (rowwise = blocks run along K):
//
//   per-tensor fp8  one FP32 scale for the whole tensor  (block dims are 1x1 placeholders; the
//                   scale kind TENSOR_FP32 says "one scale", never "one scale per element")
//   mxfp8           1x32   E8M0 scale      weights may use 32x32 tiles (one scale per tile)
//   fp8_block_1d    1x128  FP32 scale_inv
//   fp8_block_2d    128x128 FP32 scale_inv
//   nvfp4           1x16   E4M3 scale x FP32 global scale; weights use 16x16 tiles
//
// Columnwise copies use the same blocks along M. Whether the columnwise codes are stored
// transposed ([K, M]) is per format: per-tensor FP8 yes (Hopper keeps a transpose), MXFP8
// no, FP8 block and NVFP4 yes (README's "Quantization formats" table).
#ifndef QT_FORMAT_H
#define QT_FORMAT_H

#include <stdbool.h>
#include <stdint.h>

typedef enum qt_format {
    QT_FORMAT_BF16,
    QT_FORMAT_FP8_E4M3,      // per-tensor scaling (delayed or current)
    QT_FORMAT_FP8_E5M2,      // per-tensor scaling (delayed or current)
    QT_FORMAT_MXFP8,
    QT_FORMAT_FP8_BLOCK_1D,
    QT_FORMAT_FP8_BLOCK_2D,
    QT_FORMAT_NVFP4,
    QT_FORMAT_COUNT
} qt_format;

typedef enum qt_elem {
    QT_ELEM_BF16,
    QT_ELEM_FP32,
    QT_ELEM_E4M3,
    QT_ELEM_E5M2,
    QT_ELEM_E2M1,
    QT_ELEM_E8M0,
    QT_ELEM_COUNT
} qt_elem;

typedef enum qt_scale_kind {
    QT_SCALE_NONE,                   // bf16: codes are the values
    QT_SCALE_TENSOR_FP32,            // one FP32 scale_inv per tensor
    QT_SCALE_BLOCK_E8M0,             // one E8M0 byte per block
    QT_SCALE_BLOCK_FP32,             // one FP32 scale_inv per block
    QT_SCALE_BLOCK_E4M3_TENSOR_FP32  // one E4M3 byte per block times one FP32 global scale
} qt_scale_kind;

typedef struct qt_format_traits {
    const char *name;          // recipe-file spelling: "bf16", "fp8_e4m3", ..., "nvfp4"
    qt_elem elem_default;      // element type of the codes (mxfp8 and block formats may use e5m2)
    uint32_t bits_per_elem;    // 16, 8 or 4 (two e2m1 codes per byte, even element low nibble)
    uint32_t block_rows;       // rowwise scaling block, in rows x cols of the M x K matrix
    uint32_t block_cols;
    uint32_t weight_block_rows;  // rows of the 2-D weight tile where the format has one
                                 // (mxfp8 32, nvfp4 16), else block_rows
    qt_scale_kind scale_kind;
    bool colwise_transposed;   // columnwise codes stored as [K, M]
    uint32_t row_align;        // grouped members' rows are padded to a multiple of this
    uint32_t k_unit;           // a row of codes takes K in multiples of this: whole 16-byte
                               // vectors and whole scaling blocks along K (inputs are padded)
    uint32_t gemm_format;      // GEMM_FORMAT_* of ptx/gemm.h: the GEMM kernels that take it
    uint8_t (*encode)(float);  // reference codec of elem_default; NULL for bf16 (16-bit codes:
    float (*decode)(uint8_t);  // callers use qt_f32_to_bf16 / qt_bf16_to_f32)
} qt_format_traits;

// Declared without its size so that the definition's rows give it, and the count assertion
// beside the table (recipes/format.c) fails to compile when a qt_format has no row.
extern const qt_format_traits qt_format_table[];

// Row of a format; asserts that f is a valid enum value.
const qt_format_traits *qt_format_get(qt_format f);

// Parsing helper for recipe files: name -> format; returns false if unknown.
bool qt_format_from_name(const char *name, qt_format *out);

// Recipe-file spelling of an element type: "bf16", "fp32", "e4m3", "e5m2", "e2m1", "e8m0".
const char *qt_elem_name(qt_elem e);

#endif  // QT_FORMAT_H
