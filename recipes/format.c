#include "recipes/format.h"

#include <string.h>  // strcmp

#include "ptx/gemm.h"             // GEMM_FORMAT_*
#include "ptx/qt_codec.h"         // the scalar codecs the rows point to
#include "runtime/base/status.h"  // QT_ASSERT

#define ARRAY_COUNT(a) (sizeof(a) / sizeof((a)[0]))

// The codecs are header-only QT_HD functions (static inline in C); the table needs addresses of
// real functions, so each gets a plain wrapper here.
static uint8_t format_encode_e4m3(float x) { return qt_f32_to_e4m3(x); }
static uint8_t format_encode_e5m2(float x) { return qt_f32_to_e5m2(x); }
static uint8_t format_encode_e2m1(float x) { return qt_f32_to_e2m1(x); }
static float format_decode_e4m3(uint8_t code) { return qt_e4m3_to_f32(code); }
static float format_decode_e5m2(uint8_t code) { return qt_e5m2_to_f32(code); }
static float format_decode_e2m1(uint8_t code) { return qt_e2m1_to_f32(code); }

// Row alignment of grouped members. TE (get_align_size_for_quantization) pads to 32 for MXFP8,
// 128 for NVFP4 and 16 otherwise; qtrain pads FP8 block formats to 128 instead, so that every
// 128-row columnwise block lies inside one member, and NVFP4 to 16, which is all
// its 1x16 and 16x16 blocks need since qtrain does not use cuBLAS's 128-row scale tiles.
//
// K padding unit: 16 bytes of codes (8 BF16, 16 FP8, 32 E2M1 values: the kernels load 16-byte
// vectors and FP8 leading dimensions are multiples of 16), and at least one scaling block along K
// (MXFP8 1x32, FP8 block 1x128).
//
// The table's size comes from its rows, and the count assertion below it fails to compile when a
// qt_format has no row.
const qt_format_traits qt_format_table[] = {
    [QT_FORMAT_BF16] = {
        .name = "bf16", .elem_default = QT_ELEM_BF16, .bits_per_elem = 16,
        .block_rows = 1, .block_cols = 1, .weight_block_rows = 1,
        .scale_kind = QT_SCALE_NONE, .colwise_transposed = false, .row_align = 16,
        .k_unit = 8, .gemm_format = GEMM_FORMAT_BF16,
        .encode = NULL, .decode = NULL,
    },
    [QT_FORMAT_FP8_E4M3] = {
        .name = "fp8_e4m3", .elem_default = QT_ELEM_E4M3, .bits_per_elem = 8,
        .block_rows = 1, .block_cols = 1, .weight_block_rows = 1,
        .scale_kind = QT_SCALE_TENSOR_FP32, .colwise_transposed = true, .row_align = 16,
        .k_unit = 16, .gemm_format = GEMM_FORMAT_FP8,
        .encode = format_encode_e4m3, .decode = format_decode_e4m3,
    },
    [QT_FORMAT_FP8_E5M2] = {
        .name = "fp8_e5m2", .elem_default = QT_ELEM_E5M2, .bits_per_elem = 8,
        .block_rows = 1, .block_cols = 1, .weight_block_rows = 1,
        .scale_kind = QT_SCALE_TENSOR_FP32, .colwise_transposed = true, .row_align = 16,
        .k_unit = 16, .gemm_format = GEMM_FORMAT_FP8,
        .encode = format_encode_e5m2, .decode = format_decode_e5m2,
    },
    [QT_FORMAT_MXFP8] = {
        .name = "mxfp8", .elem_default = QT_ELEM_E4M3, .bits_per_elem = 8,
        .block_rows = 1, .block_cols = 32, .weight_block_rows = 32,
        .scale_kind = QT_SCALE_BLOCK_E8M0, .colwise_transposed = false, .row_align = 32,
        .k_unit = 32, .gemm_format = GEMM_FORMAT_MXFP8,
        .encode = format_encode_e4m3, .decode = format_decode_e4m3,
    },
    [QT_FORMAT_FP8_BLOCK_1D] = {
        .name = "fp8_block_1d", .elem_default = QT_ELEM_E4M3, .bits_per_elem = 8,
        .block_rows = 1, .block_cols = 128, .weight_block_rows = 1,
        .scale_kind = QT_SCALE_BLOCK_FP32, .colwise_transposed = true, .row_align = 128,
        .k_unit = 128, .gemm_format = GEMM_FORMAT_FP8_BLOCK,
        .encode = format_encode_e4m3, .decode = format_decode_e4m3,
    },
    [QT_FORMAT_FP8_BLOCK_2D] = {
        .name = "fp8_block_2d", .elem_default = QT_ELEM_E4M3, .bits_per_elem = 8,
        .block_rows = 128, .block_cols = 128, .weight_block_rows = 128,
        .scale_kind = QT_SCALE_BLOCK_FP32, .colwise_transposed = true, .row_align = 128,
        .k_unit = 128, .gemm_format = GEMM_FORMAT_FP8_BLOCK,
        .encode = format_encode_e4m3, .decode = format_decode_e4m3,
    },
    [QT_FORMAT_NVFP4] = {
        .name = "nvfp4", .elem_default = QT_ELEM_E2M1, .bits_per_elem = 4,
        .block_rows = 1, .block_cols = 16, .weight_block_rows = 16,
        .scale_kind = QT_SCALE_BLOCK_E4M3_TENSOR_FP32, .colwise_transposed = true,
        .row_align = 16, .k_unit = 32, .gemm_format = GEMM_FORMAT_NVFP4,
        .encode = format_encode_e2m1, .decode = format_decode_e2m1,
    },
};
_Static_assert(ARRAY_COUNT(qt_format_table) == QT_FORMAT_COUNT, "a row per qt_format");

static const char *const elem_names[] = {
    [QT_ELEM_BF16] = "bf16", [QT_ELEM_FP32] = "fp32", [QT_ELEM_E4M3] = "e4m3",
    [QT_ELEM_E5M2] = "e5m2", [QT_ELEM_E2M1] = "e2m1", [QT_ELEM_E8M0] = "e8m0",
};
_Static_assert(ARRAY_COUNT(elem_names) == QT_ELEM_COUNT, "a name per qt_elem");

const qt_format_traits *qt_format_get(qt_format f) {
    QT_ASSERT((unsigned)f < QT_FORMAT_COUNT);
    return &qt_format_table[f];
}

bool qt_format_from_name(const char *name, qt_format *out) {
    QT_ASSERT(name != NULL && out != NULL);
    for (int f = 0; f < QT_FORMAT_COUNT; f++) {
        if (strcmp(qt_format_table[f].name, name) == 0) {
            *out = (qt_format)f;
            return true;
        }
    }
    return false;
}

const char *qt_elem_name(qt_elem e) {
    QT_ASSERT((unsigned)e < QT_ELEM_COUNT && elem_names[e] != NULL);
    return elem_names[e];
}
