// Per-tensor FP8 tests (ptx/quant_fp8.cu, ptx/quant_group.cu). CPU: the C twins, called
// directly, against hand-derived codes, scales, amaxes and history rolls; the grouped rules of
// quant.h; dequantize(quantize(x)) error bounds; the op builders on the reference backend. GPU:
// the same programs on both backends, every output compared byte for byte (SKIP without a GPU).
#include <math.h>

#include "runtime/ops/op_core.h"         // op_fill_random
#include "runtime/ops/op_quant_block.h"  // op_quant_block: 128 x 128 tiles, transposed
#include "runtime/ops/op_quant_fp8.h"    // op_fp8_*
#include "runtime/ops/op_quant_group.h"  // op_group_offsets
#include "runtime/ref/ref.h"             // ref_qt_fp8_* (the twins, called directly)
#include "tests/rig.h"
#include "tests/test.h"

#define T_ADDR(p) ((uint64_t)(uintptr_t)(p))
#define T_SENTINEL 0xA5u  // output bytes a kernel must leave alone start as this

static const launch_shape t_no_shape;  // the fp8 twins do not look at the launch shape

static float t_f(uint32_t bits) { return qt_bits_f32(bits); }
static uint32_t t_b(float v) { return qt_f32_bits(v); }

// ---------------------------------------------------------------------------------------------
// CPU: hand-derived expectations through the twins.

static void test_byte_transpose(void) {
    test_begin("fp8_byte_transpose_4x4");
    // Row r, column c holds 0x10 * r + c; afterwards word c must hold column c.
    uint32_t w[4] = {0x03020100u, 0x13121110u, 0x23222120u, 0x33323130u};
    qt_fp8_transpose4x4(w);
    for (uint32_t c = 0; c < 4; c++) {
        uint32_t want = 0x30201000u + 0x01010101u * c;
        CHECK(w[c] == want, "word %u = %08x, expected %08x", c, w[c], want);
    }
    test_end();
}

typedef struct t_code_case {
    uint32_t x_bits;
    uint8_t code;
} t_code_case;

// One row of FP32 (or BF16, truncated from the FP32 bits) through the cast twin with a delayed
// scale; checks the rowwise and columnwise codes and scale_inv.
static void t_cast_row(const t_code_case *cases, uint32_t count, uint32_t dtype, uint32_t fp8,
                       float scale, const char *what) {
    uint32_t x32[64];
    uint16_t x16[64];
    uint8_t row[64], col[64];
    float scale_inv = 0, amax = 0;
    QT_ASSERT(count <= 64);
    for (uint32_t i = 0; i < count; i++) {
        x32[i] = cases[i].x_bits;
        x16[i] = (uint16_t)(cases[i].x_bits >> 16);
    }
    fp8_cast_args a = {0};
    a.x = dtype == QT_DTYPE_BF16 ? T_ADDR(x16) : T_ADDR(x32);
    a.rowwise = T_ADDR(row);
    a.colwise = T_ADDR(col);
    a.scale = T_ADDR(&scale);
    a.scale_inv = T_ADDR(&scale_inv);
    a.amax_out = T_ADDR(&amax);
    a.rows = 1;
    a.cols = count;
    a.dtype = dtype;
    a.fp8 = fp8;
    if (dtype == QT_DTYPE_BF16) {
        ref_qt_fp8_cast_bf16(&a, &t_no_shape);
    } else {
        ref_qt_fp8_cast_f32(&a, &t_no_shape);
    }
    for (uint32_t i = 0; i < count; i++) {
        CHECK(row[i] == cases[i].code && col[i] == cases[i].code,
              "%s: x = %08x (%g) * %g: rowwise %02x colwise %02x, expected %02x", what,
              dtype == QT_DTYPE_BF16 ? (uint32_t)x16[i] << 16 : x32[i], t_f(x32[i]), scale,
              row[i], col[i], cases[i].code);
    }
    CHECK(t_b(scale_inv) == t_b(1.0f / scale), "%s: scale_inv %08x", what, t_b(scale_inv));
}

static void test_cast_hand_codes(void) {
    test_begin("fp8_cast_hand_codes_e4m3");
    // E4M3, scale 1: saturation, NaN -> 0x7F, ties to even, subnormals.
    static const t_code_case e4m3[] = {
        {0x00000000u, 0x00},  // +0
        {0x80000000u, 0x80},  // -0 keeps its sign
        {0x3F800000u, 0x38},  // 1 = 2^0: exponent 7, mantissa 0
        {0xC0000000u, 0xC0},  // -2
        {0x43700000u, 0x77},  // 240 = 1.875 * 2^7
        {0x43E00000u, 0x7E},  // 448, max finite
        {0x43E80000u, 0x7E},  // 464: rounds toward 480, beyond max: saturates
        {0x7149F2CAu, 0x7E},  // 1e30
        {0xF149F2CAu, 0xFE},  // -1e30
        {0x7F800000u, 0x7E},  // +Inf -> max
        {0xFF800000u, 0xFE},  // -Inf -> -max
        {0x7FC00000u, 0x7F},  // NaN
        {0xFFC00000u, 0x7F},  // -NaN: sign dropped
        {0x3B000000u, 0x01},  // 2^-9, min subnormal
        {0x3A800000u, 0x00},  // 2^-10: half the min subnormal, tie to even 0
        {0x3A800001u, 0x01},  // just above it (FP32 only; BF16 truncates it to 2^-10)
        {0x3B400000u, 0x02},  // 1.5 * 2^-9: tie between 1 and 2 steps -> 2
        {0x3BA00000u, 0x02},  // 2.5 * 2^-9: tie between 2 and 3 steps -> 2
        {0x3C600000u, 0x07},  // 7 * 2^-9, the largest subnormal
        {0x3C800000u, 0x08},  // 2^-6, min normal
        {0xB9800000u, 0x80},  // -2^-12 -> -0
        {0x3F880000u, 0x38},  // 1.0625: tie between 1 and 1.125 -> even 1
        {0x3F980000u, 0x3A},  // 1.1875: tie between 1.125 and 1.25 -> even 1.25
        {0x000116C2u, 0x00},  // FP32 subnormal 1e-40, not flushed, rounds to +0
        {0x800116C2u, 0x80},  // -1e-40 -> -0
    };
    uint32_t n4 = sizeof e4m3 / sizeof e4m3[0];
    t_cast_row(e4m3, n4, QT_DTYPE_F32, QT_FP8_E4M3, 1.0f, "e4m3 f32");
    // The same through BF16 (each value's top 16 bits), except 2^-10 * (1 + 2^-23).
    t_code_case e4m3_bf16[sizeof e4m3 / sizeof e4m3[0]];
    uint32_t nb = 0;
    for (uint32_t i = 0; i < n4; i++) {
        if (e4m3[i].x_bits != 0x3A800001u) e4m3_bf16[nb++] = e4m3[i];
    }
    t_cast_row(e4m3_bf16, nb, QT_DTYPE_BF16, QT_FP8_E4M3, 1.0f, "e4m3 bf16");
    test_end();
}

static void test_cast_hand_codes_e5m2_and_scale(void) {
    test_begin("fp8_cast_hand_codes_e5m2_and_scale");
    // E5M2, scale 1.
    static const t_code_case e5m2[] = {
        {0x3F800000u, 0x3C},  // 1: exponent 15
        {0x3F900000u, 0x3C},  // 1.125: tie between 1 and 1.25 -> even 1
        {0x3FB00000u, 0x3E},  // 1.375: tie between 1.25 and 1.5 -> even 1.5
        {0x43F00000u, 0x60},  // 480 = 1.875 * 2^8: tie -> 2^9
        {0x47600000u, 0x7B},  // 57344, max finite
        {0x47700000u, 0x7B},  // 61440 saturates
        {0x7F800000u, 0x7B},  // +Inf -> max
        {0xFF800000u, 0xFB},  // -Inf -> -max
        {0xFFC00000u, 0x7F},  // -NaN -> 0x7F
        {0x37800000u, 0x01},  // 2^-16, min subnormal
        {0x37000000u, 0x00},  // 2^-17: tie -> 0
        {0x37C00000u, 0x02},  // 1.5 * 2^-16 -> 2
        {0x38800000u, 0x04},  // 2^-14, min normal
        {0xB6800000u, 0x80},  // -2^-18 -> -0
    };
    t_cast_row(e5m2, sizeof e5m2 / sizeof e5m2[0], QT_DTYPE_F32, QT_FP8_E5M2, 1.0f, "e5m2 f32");
    t_cast_row(e5m2, sizeof e5m2 / sizeof e5m2[0], QT_DTYPE_BF16, QT_FP8_E5M2, 1.0f,
               "e5m2 bf16");
    // The scale multiplies first, rounded once to FP32: 1 * 448 = 448 -> 0x7E;
    // 3 * 0.5 = 1.5 -> 0x3C; 2 * 448 = 896 saturates.
    static const t_code_case scaled_448[] = {{0x3F800000u, 0x7E}, {0x40000000u, 0x7E}};
    t_cast_row(scaled_448, 2, QT_DTYPE_F32, QT_FP8_E4M3, 448.0f, "scale 448");
    static const t_code_case scaled_half[] = {{0x40400000u, 0x3C}};
    t_cast_row(scaled_half, 1, QT_DTYPE_F32, QT_FP8_E4M3, 0.5f, "scale 0.5");
    // x = 1.0625 + 2^-23, scale = 1 - 2^-24: the exact product is 1.0625 + 0.46875 * 2^-23 (above
    // the E4M3 tie 1.0625, so a single rounding would give 0x39) but RN to FP32 first gives 1.0625
    // exactly, which ties to even: 0x38.
    static const t_code_case double_round[] = {{0x3F880001u, 0x38}};
    t_cast_row(double_round, 1, QT_DTYPE_F32, QT_FP8_E4M3, t_f(0x3F7FFFFFu), "RN(x*s) first");
    static const t_code_case single_round[] = {{0x3F880001u, 0x39}};
    t_cast_row(single_round, 1, QT_DTYPE_F32, QT_FP8_E4M3, 1.0f, "above the tie");
    test_end();
}

// amax of one dense FP32 or BF16 vector, through the zero and amax twins.
static uint32_t t_amax_bits(const uint32_t *bits, uint32_t count, uint32_t dtype) {
    uint32_t x32[16];
    uint16_t x16[16];
    for (uint32_t i = 0; i < count; i++) {
        x32[i] = bits[i];
        x16[i] = (uint16_t)(bits[i] >> 16);
    }
    float amax = 123.0f;
    fp8_amax_zero_args z = {T_ADDR(&amax), 1, 0};
    ref_qt_fp8_amax_zero(&z, &t_no_shape);
    fp8_amax_args a = {0};
    a.x = dtype == QT_DTYPE_BF16 ? T_ADDR(x16) : T_ADDR(x32);
    a.amax = T_ADDR(&amax);
    a.rows = 1;
    a.cols = count;
    a.dtype = dtype;
    ref_qt_fp8_amax(&a, &t_no_shape);
    return t_b(amax);
}

static void test_amax_hand(void) {
    test_begin("fp8_amax_hand");
    // NaN ignored (never NaN), Inf gives +Inf, starts from +0.
    static const struct {
        uint32_t x[4];
        uint32_t count;
        uint32_t amax;
    } cases[] = {
        {{0x3F800000u, 0xC0400000u, 0x7FC00000u, 0x40000000u}, 4, 0x40400000u},  // 1,-3,NaN,2
        {{0x7FC00000u, 0xFFC00000u}, 2, 0x00000000u},                            // all NaN
        {{0x7FC00000u, 0xFF800000u, 0x3F800000u}, 3, 0x7F800000u},               // -Inf -> +Inf
        {{0x80000000u}, 1, 0x00000000u},                                         // -0 -> +0
        {{0x00010000u, 0x80000000u}, 2, 0x00010000u},                            // subnormal
        {{0xC0600000u, 0x3F800000u}, 2, 0x40600000u},                            // -3.5
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (uint32_t dtype = 0; dtype < 2; dtype++) {
            uint32_t got = t_amax_bits(cases[c].x, cases[c].count, dtype);
            CHECK(got == cases[c].amax, "case %zu dtype %u: amax %08x, expected %08x", c, dtype,
                  got, cases[c].amax);
        }
    }
    test_end();
}

static void test_group_offsets_hand(void) {
    test_begin("group_offsets_hand");
    uint32_t dims[5] = {5, 0, 16, 17, 1};
    uint32_t off[6];
    group_offsets_args a = {T_ADDR(dims), T_ADDR(off), 5, 16};
    ref_qt_group_offsets(&a, &t_no_shape);
    static const uint32_t want16[6] = {0, 16, 16, 32, 64, 80};
    for (int i = 0; i < 6; i++) CHECK(off[i] == want16[i], "align 16: off[%d] = %u", i, off[i]);
    a.row_align = 1;
    ref_qt_group_offsets(&a, &t_no_shape);
    static const uint32_t want1[6] = {0, 5, 5, 21, 38, 39};
    for (int i = 0; i < 6; i++) CHECK(off[i] == want1[i], "align 1: off[%d] = %u", i, off[i]);
    // Member lookup: rows 0..15 -> 0, 16..31 -> 2 (1 is empty), 32..63 -> 3, 64..79 -> 4.
    a.row_align = 16;
    ref_qt_group_offsets(&a, &t_no_shape);
    qt_group_desc g = {T_ADDR(off), T_ADDR(dims), 5, 0};
    static const uint32_t rows[6] = {0, 15, 16, 31, 32, 79};
    static const uint32_t members[6] = {0, 0, 2, 2, 3, 4};
    for (int i = 0; i < 6; i++) {
        uint32_t m = qt_group_find(g, 0, 5, rows[i]);
        CHECK(m == members[i], "row %u: member %u, expected %u", rows[i], m, members[i]);
    }
    qt_group_rows r = qt_group_member_rows(g, 100, 3);
    CHECK(r.begin == 32 && r.valid_end == 49 && r.end == 64, "member 3 rows %u %u %u", r.begin,
          r.valid_end, r.end);
    CHECK(qt_group_active_rows(g, 100) == 80 && qt_group_active_rows(g, 70) == 70, "active");
    test_end();
}

// A grouped FP32 tensor of capacity 10 rows x 3 cols: first_dims {2, 0, 3}, row_align 4 ->
// offsets {0, 4, 4, 8}: member 0 rows 0-1 (2-3 padding), member 1 empty, member 2 rows 4-6 (7
// padding), rows 8-9 past the active end. Padding and tail rows hold huge values that must not
// reach any amax or code.
static void test_grouped_cast_twin(void) {
    test_begin("fp8_grouped_cast_padding_and_members");
    enum { ROWS = 10, COLS = 3 };
    float x[ROWS * COLS];
    for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < COLS; c++) x[r * COLS + c] = (float)(r + 1) * (c == 1 ? -1.0f : 0.5f);
    }
    for (int c = 0; c < COLS; c++) {
        x[2 * COLS + c] = x[3 * COLS + c] = x[7 * COLS + c] = 1e30f;
        x[8 * COLS + c] = x[9 * COLS + c] = -1e30f;
    }
    uint32_t dims[3] = {2, 0, 3}, off[4];
    group_offsets_args ga = {T_ADDR(dims), T_ADDR(off), 3, 4};
    ref_qt_group_offsets(&ga, &t_no_shape);
    float scale[3] = {2.0f, 8.0f, 0.5f}, scale_inv[3] = {0, 0, 0};
    float amax[3] = {0.0f, 7.0f, 100.0f};  // slot 2 starts above its member's amax
    uint8_t row[ROWS * COLS], col[ROWS * COLS];
    memset(row, T_SENTINEL, sizeof row);
    memset(col, T_SENTINEL, sizeof col);
    fp8_cast_args a = {0};
    a.x = T_ADDR(x);
    a.rowwise = T_ADDR(row);
    a.colwise = T_ADDR(col);
    a.scale = T_ADDR(scale);
    a.scale_inv = T_ADDR(scale_inv);
    a.amax_out = T_ADDR(amax);
    a.group = (qt_group_desc){T_ADDR(off), T_ADDR(dims), 3, 0};
    a.rows = ROWS;
    a.cols = COLS;
    a.dtype = QT_DTYPE_F32;
    a.fp8 = QT_FP8_E4M3;
    ref_qt_fp8_cast_f32(&a, &t_no_shape);
    for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < COLS; c++) {
            uint8_t want = T_SENTINEL;  // rows 8, 9: not written
            if (r < 2) want = qt_f32_to_e4m3(x[r * COLS + c] * 2.0f);
            if (r >= 4 && r < 7) want = qt_f32_to_e4m3(x[r * COLS + c] * 0.5f);
            if (r == 2 || r == 3 || r == 7) want = 0;  // padding: zero codes
            CHECK(row[r * COLS + c] == want, "rowwise (%d, %d) = %02x, expected %02x", r, c,
                  row[r * COLS + c], want);
            CHECK(col[c * ROWS + r] == want, "colwise (%d, %d) = %02x, expected %02x", c, r,
                  col[c * ROWS + r], want);
        }
    }
    // Member 0: max |x| over rows 0-1 = 2 (row 1, col 1); member 2: rows 4-6 -> 7.
    CHECK(amax[0] == 2.0f && amax[1] == 7.0f && amax[2] == 100.0f, "amax %g %g %g", amax[0],
          amax[1], amax[2]);
    CHECK(scale_inv[0] == 0.5f && scale_inv[1] == 0.125f && scale_inv[2] == 2.0f,
          "scale_inv %g %g %g", scale_inv[0], scale_inv[1], scale_inv[2]);
    // The amax op sees the same members: 2, 0 (empty member, zeroed), 7.
    fp8_amax_zero_args z = {T_ADDR(amax), 3, 0};
    ref_qt_fp8_amax_zero(&z, &t_no_shape);
    fp8_amax_args aa = {T_ADDR(x), T_ADDR(amax), a.group, ROWS, COLS, QT_DTYPE_F32, 0};
    ref_qt_fp8_amax(&aa, &t_no_shape);
    CHECK(amax[0] == 2.0f && amax[1] == 0.0f && amax[2] == 7.0f, "amax op %g %g %g", amax[0],
          amax[1], amax[2]);
    test_end();
}

// Current scaling through a 1 x 1 cast: the scale and scale_inv written.
static void t_current(float amax, uint32_t fp8, bool pow2, float eps, uint32_t scale_bits,
                      uint32_t inv_bits) {
    float x = 1.0f, scale = -1.0f, scale_inv = -1.0f;
    uint8_t row;
    fp8_cast_args a = {0};
    a.x = T_ADDR(&x);
    a.rowwise = T_ADDR(&row);
    a.scale = T_ADDR(&scale);
    a.scale_inv = T_ADDR(&scale_inv);
    a.amax_in = T_ADDR(&amax);
    a.rows = a.cols = 1;
    a.dtype = QT_DTYPE_F32;
    a.fp8 = fp8;
    a.scale_mode = QT_FP8_SCALE_CURRENT;
    a.pow2 = pow2;
    a.eps = eps;
    ref_qt_fp8_cast_f32(&a, &t_no_shape);
    CHECK(t_b(scale) == scale_bits && t_b(scale_inv) == inv_bits,
          "amax %08x fp8 %u pow2 %d eps %g: scale %08x inv %08x, expected %08x %08x", t_b(amax),
          fp8, pow2, eps, t_b(scale), t_b(scale_inv), scale_bits, inv_bits);
    CHECK(row == qt_fp8_quantize(1.0f, scale, fp8), "code %02x", row);
}

static void test_current_scaling_hand(void) {
    test_begin("fp8_current_scaling_hand");
    t_current(0.0f, QT_FP8_E4M3, false, 0.0f, 0x3F800000u, 0x3F800000u);   // amax 0 -> 1
    t_current(448.0f, QT_FP8_E4M3, false, 0.0f, 0x3F800000u, 0x3F800000u); // 448/448
    // 448/3 = 149.333... = 1.0010101010...b * 2^7, the dropped bits 0101... round down.
    t_current(3.0f, QT_FP8_E4M3, false, 0.0f, 0x43155555u, 0x3BDB6DB7u);
    t_current(3.0f, QT_FP8_E4M3, true, 0.0f, 0x43000000u, 0x3C000000u);   // pow2: 128, 1/128
    // 448 / 1e-40 overflows: FLT_MAX, whose reciprocal 2^-128 (1 + 2^-24) rounds to 2^-128.
    t_current(t_f(0x000116C2u), QT_FP8_E4M3, false, 0.0f, 0x7F7FFFFFu, 0x00200000u);
    t_current(t_f(0x7F800000u), QT_FP8_E4M3, false, 0.0f, 0x3F800000u, 0x3F800000u);  // Inf
    t_current(t_f(0x7FC00000u), QT_FP8_E4M3, false, 0.0f, 0x3F800000u, 0x3F800000u);  // NaN
    t_current(0.5f, QT_FP8_E4M3, false, 1.0f, 0x43E00000u, 0x3B124925u);  // eps lifts amax to 1
    t_current(0.0f, QT_FP8_E4M3, false, 1.0f, 0x43E00000u, 0x3B124925u);  // eps also lifts 0
    t_current(57344.0f, QT_FP8_E5M2, false, 0.0f, 0x3F800000u, 0x3F800000u);
    t_current(1.0f, QT_FP8_E5M2, false, 0.0f, 0x47600000u, 0x37924925u);  // 57344, f32(1/57344)
    test_end();
}

// Delayed update on a [4][7] history, by hand.
static void test_delayed_update_hand(void) {
    test_begin("fp8_delayed_update_hand");
    enum { L = 4, K = 7 };
    const float inf = t_f(0x7F800000u), nan = t_f(0x7FC00000u), tiny = t_f(0x000116C2u);
    // Columns are slots; row 0 is the current step.
    float h[L][K] = {
        {5, 0, tiny, 1, nan, 0, 6},
        {1, 3, 0, inf, 2, 0, 1},
        {7, 9, 0, 0, 0, 0, 1},
        {2, 4, 0, 0, 0, 0, 1},
    };
    float scale[K] = {1, 2, 1, 3, 1, inf, 1};
    fp8_delayed_update_args a = {T_ADDR(h), T_ADDR(scale), 0, K, L, QT_FP8_AMAX_ALGO_MAX, 448};
    ref_qt_fp8_delayed_update(&a, &t_no_shape);
    // slot 0: max(1, 7, 2, 5) = 7 -> 448/7 = 64; rolled to {0, 7, 2, 5}.
    // slot 1: current 0: nothing rolls, scale kept.
    // slot 2: 448/1e-40 = Inf -> FLT_MAX; {0, 0, 0, tiny}.
    // slot 3: Inf in the window: amax Inf -> scale kept; {0, 0, 0, 1}.
    // slot 4: NaN current is not 0: rolls, fmaxf ignores it: amax 2 -> 224; {0, 0, 0, NaN}.
    // slot 5: current 0 and an infinite old scale: kept, then Inf -> FLT_MAX (TE order).
    // slot 6: max(1, 1, 1, 6) = 6 -> 448/6 = 74.666664 (RN).
    static const float want_rows[L][K] = {
        {0, 0, 0, 0, 0, 0, 0}, {7, 3, 0, 0, 0, 0, 1}, {2, 9, 0, 0, 0, 0, 1}, {5, 4, 0, 1, 0, 0, 6},
    };
    for (int i = 0; i < L; i++) {
        for (int j = 0; j < K; j++) {
            float want = want_rows[i][j];
            if (i == L - 1 && j == 2) want = tiny;
            if (i == L - 1 && j == 4) want = nan;
            bool same = t_b(h[i][j]) == t_b(want);
            CHECK(same, "history[%d][%d] = %08x, expected %08x", i, j, t_b(h[i][j]), t_b(want));
        }
    }
    const float want_scale[K] = {64, 2, t_f(0x7F7FFFFFu), 3, 224, t_f(0x7F7FFFFFu), 448.0f / 6};
    for (int j = 0; j < K; j++) {
        CHECK(t_b(scale[j]) == t_b(want_scale[j]), "scale[%d] = %08x, expected %08x", j,
              t_b(scale[j]), t_b(want_scale[j]));
    }
    // most_recent with margin 1 (scaled_max 224) and an all-reduced buffer: slot 0 takes the
    // reduced 16 (-> 14), slot 1 keeps its own 0 (the reduced 0 does not override): no roll.
    float h2[2][2] = {{5, 0}, {9, 3}}, s2[2] = {1, 1}, reduced[2] = {16, 0};
    fp8_delayed_update_args b = {T_ADDR(h2), T_ADDR(s2), T_ADDR(reduced), 2, 2,
                                 QT_FP8_AMAX_ALGO_MOST_RECENT, 224};
    ref_qt_fp8_delayed_update(&b, &t_no_shape);
    CHECK(h2[0][0] == 0 && h2[1][0] == 16 && h2[0][1] == 0 && h2[1][1] == 3,
          "history %g %g / %g %g", h2[0][0], h2[0][1], h2[1][0], h2[1][1]);
    CHECK(s2[0] == 14.0f && s2[1] == 1.0f, "scale %g %g", s2[0], s2[1]);
    // L = 1: the single row is both current and window; it becomes 0, the scale uses it.
    float h1 = 3, s1 = 1;
    fp8_delayed_update_args c = {T_ADDR(&h1), T_ADDR(&s1), 0, 1, 1, QT_FP8_AMAX_ALGO_MAX, 448};
    ref_qt_fp8_delayed_update(&c, &t_no_shape);
    CHECK(h1 == 0 && t_b(s1) == 0x43155555u, "L=1: history %g scale %08x", h1, t_b(s1));
    test_end();
}

static void test_delayed_update_long_history(void) {
    test_begin("fp8_delayed_update_long_history");
    // L = 40 spans several roll chunks: old[i] = i (row 0 = 100) rolls to new[i] = i + 1 for
    // 1 <= i <= 38, new[39] = 100, new[0] = 0; the window max is 100 -> 4.48.
    float h40[40], s40 = 1;
    for (int i = 0; i < 40; i++) h40[i] = i == 0 ? 100.0f : (float)i;
    fp8_delayed_update_args d = {T_ADDR(h40), T_ADDR(&s40), 0, 1, 40, QT_FP8_AMAX_ALGO_MAX, 448};
    ref_qt_fp8_delayed_update(&d, &t_no_shape);
    for (int i = 0; i < 40; i++) {
        float want = i == 0 ? 0.0f : i == 39 ? 100.0f : (float)(i + 1);
        CHECK(h40[i] == want, "L=40: history[%d] = %g, expected %g", i, h40[i], want);
    }
    CHECK(s40 == 448.0f / 100.0f, "L=40: scale %g", s40);
    test_end();
}

static void test_dequantize_hand(void) {
    test_begin("fp8_dequantize_hand");
    // E4M3 codes {1, -2, NaN, 448, 2^-9} * 0.5 over a 2 x 5 tensor, and its transpose.
    uint8_t codes[10] = {0x38, 0xC0, 0x7F, 0x7E, 0x01, 0x38, 0x38, 0x38, 0x38, 0xFF};
    float scale_inv = 0.5f;
    static const uint32_t want_f32[10] = {0x3F000000u, 0xBF800000u, 0x7FFFFFFFu, 0x43600000u,
                                          0x3A800000u, 0x3F000000u, 0x3F000000u, 0x3F000000u,
                                          0x3F000000u, 0x7FFFFFFFu};  // -NaN canonical too
    static const uint16_t want_bf16[10] = {0x3F00, 0xBF80, 0x7FFF, 0x4360, 0x3A80,
                                           0x3F00, 0x3F00, 0x3F00, 0x3F00, 0x7FFF};
    float out32[10];
    uint16_t out16[10];
    fp8_dequantize_args a = {0};
    a.codes = T_ADDR(codes);
    a.scale_inv = T_ADDR(&scale_inv);
    a.out = T_ADDR(out32);
    a.rows = 2;
    a.cols = 5;
    a.dtype = QT_DTYPE_F32;
    a.fp8 = QT_FP8_E4M3;
    ref_qt_fp8_dequantize(&a, &t_no_shape);
    for (int i = 0; i < 10; i++) {
        CHECK(t_b(out32[i]) == want_f32[i], "f32 %d: %08x, expected %08x", i, t_b(out32[i]),
              want_f32[i]);
    }
    a.out = T_ADDR(out16);
    a.dtype = QT_DTYPE_BF16;
    ref_qt_fp8_dequantize(&a, &t_no_shape);
    for (int i = 0; i < 10; i++) {
        CHECK(out16[i] == want_bf16[i], "bf16 %d: %04x, expected %04x", i, out16[i],
              want_bf16[i]);
    }
    // Columnwise: the same codes read as the [5][2] transpose land back in [2][5].
    uint8_t t[10];
    for (int r = 0; r < 2; r++) {
        for (int c = 0; c < 5; c++) t[c * 2 + r] = codes[r * 5 + c];
    }
    a.codes = T_ADDR(t);
    a.colwise = 1;
    a.out = T_ADDR(out32);
    a.dtype = QT_DTYPE_F32;
    ref_qt_fp8_dequantize(&a, &t_no_shape);
    for (int i = 0; i < 10; i++) {
        CHECK(t_b(out32[i]) == want_f32[i], "colwise %d: %08x, expected %08x", i, t_b(out32[i]),
              want_f32[i]);
    }
    test_end();
}

static void t_cast_twin(const fp8_cast_args *a) {
    if (a->dtype == QT_DTYPE_BF16) {
        ref_qt_fp8_cast_bf16(a, &t_no_shape);
    } else {
        ref_qt_fp8_cast_f32(a, &t_no_shape);
    }
}

// dequantize(quantize(x)) with current scaling, through the twins. Bound, per element, with
// s = scale, y = RN32(x s) = x s (1 + d1), q = satFP8(y), x' = RN32(q RN32(1/s)), |di| <= 2^-24:
//   no saturation: |y| <= amax s (1 + 2^-24) and s = RN(qmax / amax), so |y| exceeds qmax by at
//   most one FP32 ulp, and clamping that costs less than the rounding term below;
//   |q - y| <= max(2^-(m+1) |y|, h) with m mantissa bits (E4M3 3, E5M2 2) and h half the
//   smallest subnormal (2^-10, 2^-17);
//   x' = x (1 + d1)(1 + d2)(1 + d3) + (q - y) (1 + d2)(1 + d3) / s, so
//   |x' - x| <= |x| (2^-(m+1) + 2^-20) + (h / s)(1 + 2^-20).
static void t_roundtrip(uint32_t dtype, uint32_t fp8, bool pow2) {
    enum { ROWS = 37, COLS = 53, N = ROWS * COLS };
    static float x32[N], back_row[N], back_col[N], x[N];
    static uint16_t x16[N];
    static uint8_t row[N], col[N];
    uint64_t state = 0x9E3779B97F4A7C15ull ^ (dtype * 3 + fp8 + (pow2 ? 17 : 0));
    for (int i = 0; i < N; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        // Magnitudes 2^-14 .. 2^10 with random mantissas and signs: normals and subnormals of
        // both formats after scaling.
        float mag = ldexpf(1.0f + (float)((state >> 40) & 0xFFFF) / 65536.0f,
                           (int)((state >> 24) % 25) - 14);
        x32[i] = (state >> 63) ? -mag : mag;
        x16[i] = qt_f32_to_bf16(x32[i]);
        x[i] = dtype == QT_DTYPE_BF16 ? qt_bf16_to_f32(x16[i]) : x32[i];
    }
    float amax = 0, scale = 0, scale_inv = 0;
    uint64_t in = dtype == QT_DTYPE_BF16 ? T_ADDR(x16) : T_ADDR(x32);
    fp8_amax_zero_args z = {T_ADDR(&amax), 1, 0};
    ref_qt_fp8_amax_zero(&z, &t_no_shape);
    fp8_amax_args am = {in, T_ADDR(&amax), {0, 0, 0, 0}, ROWS, COLS, dtype, 0};
    ref_qt_fp8_amax(&am, &t_no_shape);
    fp8_cast_args c = {0};
    c.x = in;
    c.rowwise = T_ADDR(row);
    c.colwise = T_ADDR(col);
    c.scale = T_ADDR(&scale);
    c.scale_inv = T_ADDR(&scale_inv);
    c.amax_in = T_ADDR(&amax);
    c.rows = ROWS;
    c.cols = COLS;
    c.dtype = dtype;
    c.fp8 = fp8;
    c.scale_mode = QT_FP8_SCALE_CURRENT;
    c.pow2 = pow2;
    t_cast_twin(&c);
    fp8_dequantize_args d = {T_ADDR(row), T_ADDR(&scale_inv), T_ADDR(back_row), {0, 0, 0, 0},
                             ROWS, COLS, QT_DTYPE_F32, fp8, 0, 0};
    ref_qt_fp8_dequantize(&d, &t_no_shape);
    d.codes = T_ADDR(col);
    d.out = T_ADDR(back_col);
    d.colwise = 1;
    ref_qt_fp8_dequantize(&d, &t_no_shape);
    double rel = fp8 == QT_FP8_E5M2 ? ldexp(1, -3) : ldexp(1, -4);
    double half_step = fp8 == QT_FP8_E5M2 ? ldexp(1, -17) : ldexp(1, -10);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double slack = ldexp(1, -20);
        double bound = fabs(x[i]) * (rel + slack) + half_step / scale * (1 + slack);
        double err = fabs((double)back_row[i] - x[i]);
        if (err / bound > worst) worst = err / bound;
        CHECK(err <= bound, "dtype %u fp8 %u pow2 %d: x[%d] = %a back %a, error %g > bound %g",
              dtype, fp8, pow2, i, x[i], back_row[i], err, bound);
        CHECK(t_b(back_col[i]) == t_b(back_row[i]), "colwise %d: %08x vs rowwise %08x", i,
              t_b(back_col[i]), t_b(back_row[i]));
    }
    // Not vacuous: some element uses most of its rounding budget.
    CHECK(worst > 0.5, "largest error / bound only %g", worst);
}

static void test_roundtrip_bounds(void) {
    test_begin("fp8_dequantize_quantize_error_bound");
    for (uint32_t dtype = 0; dtype < 2; dtype++) {
        for (uint32_t fp8 = 0; fp8 < 2; fp8++) {
            t_roundtrip(dtype, fp8, false);
            t_roundtrip(dtype, fp8, true);
        }
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Programs on a rig: one case built the same way on the reference backend and on the GPU.

typedef struct fp8_case {
    const char *name;
    uint32_t rows, cols;  // dense rows; grouped tensors derive their capacity from the members
    uint32_t dtype, fp8, mode;
    uint32_t members;  // 0 = dense
    uint32_t max_dim;  // grouped: first_dims drawn from [0, max_dim], about 1 in 5 empty
    bool rowwise, colwise, pow2;
    float eps;
    uint32_t plant;  // edge values planted: 0 none, 1 finite ones, 2 with +-Inf
    bool misalign;   // x one element, rowwise 1 byte, colwise 3 bytes past alignment
    uint64_t seed;
} fp8_case;

typedef struct fp8_run {
    rig r;
    program prep;  // fill and offsets, run before the case's program
    uint32_t rows, n;
    uint32_t *first_dims;
    arena_handle x, rowwise, colwise, scale, scale_inv, amax, dims, offsets, deq_row, deq_col;
    uint64_t x_off, row_off, col_off;
} fp8_run;

typedef struct fp8_out {
    uint8_t *rowwise, *colwise, *deq_row, *deq_col;
    float *scale, *scale_inv, *amax, *x;
    uint32_t *offsets;
} fp8_out;

#define T_ROW_ALIGN 16  // recipes/format.c: per-tensor FP8 members pad to 16 rows
#define T_SLACK_ROWS 21  // grouped capacity beyond the active rows (not a multiple of 16)

static uint64_t t_lcg(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

static uint32_t t_elem_bytes(uint32_t dtype) { return dtype == QT_DTYPE_BF16 ? 2 : 4; }

// Member sizes and the buffer's row capacity.
static void t_members(fp8_run *run, const fp8_case *c) {
    run->n = c->members ? c->members : 1;
    run->first_dims = calloc(run->n, sizeof *run->first_dims);
    if (!c->members) {
        run->rows = c->rows;
        return;
    }
    uint64_t state = c->seed;
    uint32_t total = 0;
    for (uint32_t i = 0; i < c->members; i++) {
        uint32_t d = (uint32_t)(t_lcg(&state) % (c->max_dim + 1));
        if (t_lcg(&state) % 5 == 0) d = 0;
        run->first_dims[i] = d;
        total += qt_group_roundup(d, T_ROW_ALIGN);
    }
    run->rows = total + T_SLACK_ROWS;
}

static qt_status t_build_main(fp8_run *run, const fp8_case *c) {
    rig *r = &run->r;
    op_group g = {c->members, rig_ref(r, run->offsets, 0), rig_ref(r, run->dims, 0)};
    op_fp8_input in = {rig_ref(r, run->x, run->x_off), c->dtype, run->rows, c->cols, g};
    op_fp8_output out = {c->fp8, OP_FP8_NONE, OP_FP8_NONE, rig_ref(r, run->scale_inv, 0)};
    if (c->rowwise) out.rowwise = rig_ref(r, run->rowwise, run->row_off);
    if (c->colwise) out.colwise = rig_ref(r, run->colwise, run->col_off);
    prog_ref scale = rig_ref(r, run->scale, 0), amax = rig_ref(r, run->amax, 0);
    if (c->mode == QT_FP8_SCALE_CURRENT) {
        QT_TRY(op_fp8_quantize_current(&r->prog, "quantize", &in, &out, amax, scale, c->pow2,
                                       c->eps));
    } else {
        QT_TRY(op_fp8_cast_delayed(&r->prog, "cast", &in, &out, scale, amax));
    }
    if (c->rowwise) {
        op_fp8_input hp = {rig_ref(r, run->deq_row, 0), QT_DTYPE_F32, run->rows, c->cols, g};
        QT_TRY(op_fp8_dequantize(&r->prog, "dequantize_rowwise", &hp, &out, false));
    }
    if (c->colwise) {
        op_fp8_input hp = {rig_ref(r, run->deq_col, 0), QT_DTYPE_BF16, run->rows, c->cols, g};
        QT_TRY(op_fp8_dequantize(&r->prog, "dequantize_colwise", &hp, &out, true));
    }
    return QT_OK;
}

// Opens the rig (false: no GPU), reserves, builds both programs and binds.
static bool t_run_open(fp8_run *run, backend_kind kind, const fp8_case *c, const char **why) {
    if (!rig_open(&run->r, kind, why)) return false;
    rig *r = &run->r;
    t_members(run, c);
    uint64_t elems = (uint64_t)run->rows * c->cols;
    uint32_t eb = t_elem_bytes(c->dtype);
    run->x_off = c->misalign ? eb : 0;
    run->row_off = c->misalign ? 1 : 0;
    run->col_off = c->misalign ? 3 : 0;
    run->x = rig_reserve(r, "x", elems * eb + 16);
    run->rowwise = rig_reserve(r, "rowwise", elems + 16);
    run->colwise = rig_reserve(r, "colwise", elems + 16);
    run->scale = rig_reserve(r, "scale", run->n * 4);
    run->scale_inv = rig_reserve(r, "scale_inv", run->n * 4);
    run->amax = rig_reserve(r, "amax", run->n * 4);
    run->dims = rig_reserve(r, "first_dims", run->n * 4);
    run->offsets = rig_reserve(r, "row_offsets", (run->n + 1) * 4);
    run->deq_row = rig_reserve(r, "dequantized_rowwise", elems * 4);
    run->deq_col = rig_reserve(r, "dequantized_colwise", elems * 2);
    rig_prog_init(&run->prep, "prepare");
    RIG_OK(op_fill_random(&run->prep, "fill", rig_ref(r, run->x, run->x_off), elems, c->dtype,
                          QT_FILL_NORMAL, c->seed, 0, 0.0f, 2.0f));
    if (c->members) {
        op_group g = {c->members, rig_ref(r, run->offsets, 0), rig_ref(r, run->dims, 0)};
        RIG_OK(op_group_offsets(&run->prep, "offsets", &g, T_ROW_ALIGN));
    }
    RIG_OK(t_build_main(run, c));
    rig_bind(r);
    prog_resolve(&run->prep);
    return true;
}

// FP32 bit patterns of edge values (BF16 inputs take the top 16 bits).
static const uint32_t t_edges[] = {
    0x00000000u, 0x80000000u, 0x7FC00000u, 0xFFC00001u, 0x43E00000u, 0xC3E00000u, 0x43E80000u,
    0x7149F2CAu, 0x7F7FFFFFu, 0x000116C2u, 0x800116C2u, 0x3A800000u, 0x3F880000u, 0x477FE000u,
    0x3B000000u, 0x3B400000u, 0x47600000u, 0x7F800000u, 0xFF800000u,
};
#define T_EDGES_FINITE 17  // the last two are the infinities

static void t_plant(void *x, const fp8_case *c, uint64_t elems) {
    if (c->plant == 0 || elems == 0) return;
    uint32_t kinds = c->plant == 2 ? sizeof t_edges / sizeof t_edges[0] : T_EDGES_FINITE;
    for (uint64_t i = 0; i < 97; i++) {
        uint64_t at = (i * 7919u + c->seed) % elems;
        uint32_t bits = t_edges[i % kinds];
        if (c->dtype == QT_DTYPE_BF16) {
            ((uint16_t *)x)[at] = (uint16_t)(bits >> 16);
        } else {
            ((uint32_t *)x)[at] = bits;
        }
    }
}

// Delayed scales cover saturation (1000, 448), tiny products (2^-10) and plain values; the amax
// slots start at values some members exceed and some do not.
static void t_state(float *scale, float *amax, uint32_t n) {
    static const float scales[8] = {1.0f, 16.0f, 0.25f, 1000.0f, 0.0009765625f, 448.0f, 3.0f,
                                    0.001f};
    for (uint32_t i = 0; i < n; i++) {
        scale[i] = scales[i % 8];
        amax[i] = (float)(i % 7) * 0.75f;
    }
}

static void t_run_execute(fp8_run *run, const fp8_case *c) {
    rig *r = &run->r;
    backend *be = &r->be;
    uint64_t elems = (uint64_t)run->rows * c->cols;
    uint32_t eb = t_elem_bytes(c->dtype);
    if (c->members) RIG_OK(backend_write(be, rig_ref(r, run->dims, 0), run->first_dims,
                                         c->members * 4));
    RIG_OK(backend_run(be, &run->prep));
    void *x = malloc(elems * eb + 1);
    RIG_OK(backend_read(be, x, rig_ref(r, run->x, run->x_off), elems * eb));
    t_plant(x, c, elems);
    RIG_OK(backend_write(be, rig_ref(r, run->x, run->x_off), x, elems * eb));
    free(x);
    float *scale = malloc(run->n * 4), *amax = malloc(run->n * 4);
    t_state(scale, amax, run->n);
    if (c->mode == QT_FP8_SCALE_DELAYED) {
        RIG_OK(backend_write(be, rig_ref(r, run->scale, 0), scale, run->n * 4));
        RIG_OK(backend_write(be, rig_ref(r, run->amax, 0), amax, run->n * 4));
    }
    free(scale);
    free(amax);
    uint8_t *sentinel = malloc(elems * 4 + 16);
    memset(sentinel, T_SENTINEL, elems * 4 + 16);
    RIG_OK(backend_write(be, rig_ref(r, run->rowwise, 0), sentinel, elems + 16));
    RIG_OK(backend_write(be, rig_ref(r, run->colwise, 0), sentinel, elems + 16));
    RIG_OK(backend_write(be, rig_ref(r, run->deq_row, 0), sentinel, elems * 4));
    RIG_OK(backend_write(be, rig_ref(r, run->deq_col, 0), sentinel, elems * 2));
    free(sentinel);
    RIG_OK(backend_run(be, &r->prog));
    RIG_OK(backend_finish(be));
}

static void *t_read(fp8_run *run, arena_handle h, uint64_t offset, uint64_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    RIG_OK(backend_read(&run->r.be, p, rig_ref(&run->r, h, offset), bytes));
    return p;
}

static void t_run_read(fp8_run *run, const fp8_case *c, fp8_out *o) {
    uint64_t elems = (uint64_t)run->rows * c->cols;
    o->rowwise = t_read(run, run->rowwise, 0, elems + 16);
    o->colwise = t_read(run, run->colwise, 0, elems + 16);
    o->deq_row = t_read(run, run->deq_row, 0, elems * 4);
    o->deq_col = t_read(run, run->deq_col, 0, elems * 2);
    o->scale = t_read(run, run->scale, 0, run->n * 4);
    o->scale_inv = t_read(run, run->scale_inv, 0, run->n * 4);
    o->amax = t_read(run, run->amax, 0, run->n * 4);
    o->offsets = t_read(run, run->offsets, 0, (run->n + 1) * 4);
    o->x = t_read(run, run->x, run->x_off, elems * t_elem_bytes(c->dtype));
}

static void t_out_free(fp8_out *o) {
    free(o->rowwise);
    free(o->colwise);
    free(o->deq_row);
    free(o->deq_col);
    free(o->scale);
    free(o->scale_inv);
    free(o->amax);
    free(o->offsets);
    free(o->x);
}

static void t_run_close(fp8_run *run) {
    rig_close(&run->r);
    free(run->first_dims);
}

// ---------------------------------------------------------------------------------------------
// Reference-backend invariants: a host oracle independent of the twins' loop structure.

typedef struct t_row_info {
    uint32_t member;
    int kind;  // 0 valid, 1 padding, 2 past the active end
} t_row_info;

static t_row_info t_row(const fp8_run *run, const fp8_case *c, const uint32_t *off, uint32_t r) {
    t_row_info info = {0, 0};
    if (!c->members) return info;
    if (r >= off[c->members]) {
        info.kind = 2;
        return info;
    }
    while (off[info.member + 1] <= r) info.member++;  // skips empty members
    info.kind = r < off[info.member] + run->first_dims[info.member] ? 0 : 1;
    return info;
}

static float t_x(const fp8_case *c, const fp8_out *o, uint64_t i) {
    if (c->dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(((const uint16_t *)o->x)[i]);
    return o->x[i];
}

static void t_check_offsets(const fp8_run *run, const fp8_case *c, const fp8_out *o) {
    uint32_t sum = 0;
    CHECK(o->offsets[0] == 0, "%s: row_offsets[0] = %u", c->name, o->offsets[0]);
    for (uint32_t i = 0; i < c->members; i++) {
        sum += qt_group_roundup(run->first_dims[i], T_ROW_ALIGN);
        CHECK(o->offsets[i + 1] == sum, "%s: row_offsets[%u] = %u, expected %u", c->name, i + 1,
              o->offsets[i + 1], sum);
    }
}

static void t_check_codes(const fp8_run *run, const fp8_case *c, const fp8_out *o,
                          float *member_amax) {
    uint32_t rows = run->rows, cols = c->cols;
    for (uint32_t r = 0; r < rows; r++) {
        t_row_info info = t_row(run, c, o->offsets, r);
        for (uint32_t k = 0; k < cols; k++) {
            uint64_t i = (uint64_t)r * cols + k;
            uint8_t want = T_SENTINEL;
            if (info.kind == 1) want = 0;
            if (info.kind == 0) {
                float x = t_x(c, o, i);
                want = qt_fp8_quantize(x, o->scale[info.member], c->fp8);
                member_amax[info.member] = qt_fp8_amax_step(member_amax[info.member], x);
            }
            uint8_t row = o->rowwise[run->row_off + i];
            uint8_t col = o->colwise[run->col_off + (uint64_t)k * rows + r];
            CHECK(row == (c->rowwise ? want : T_SENTINEL), "%s: rowwise (%u, %u) = %02x, "
                  "expected %02x (row kind %d)", c->name, r, k, row, want, info.kind);
            CHECK(col == (c->colwise ? want : T_SENTINEL), "%s: colwise (%u, %u) = %02x, "
                  "expected %02x (row kind %d)", c->name, k, r, col, want, info.kind);
            if (test_case_failures > 8) return;
        }
    }
}

static void t_check_invariants(const fp8_run *run, const fp8_case *c, const fp8_out *o) {
    t_check_offsets(run, c, o);
    float *member_amax = calloc(run->n, sizeof *member_amax);
    t_check_codes(run, c, o, member_amax);
    float *scale = malloc(run->n * 4), *preset = malloc(run->n * 4);
    t_state(scale, preset, run->n);
    for (uint32_t m = 0; m < run->n; m++) {
        float want_amax = member_amax[m];
        float want_scale = qt_scale_from_amax(want_amax, qt_fp8_qmax(c->fp8), c->pow2, c->eps,
                                              QT_F32_FLT_MAX);
        if (c->mode == QT_FP8_SCALE_DELAYED) {
            want_scale = scale[m];
            want_amax = preset[m];
            qt_fp8_amax_merge(&want_amax, member_amax[m]);
        }
        CHECK(t_b(o->amax[m]) == t_b(want_amax), "%s: amax[%u] = %08x, expected %08x", c->name,
              m, t_b(o->amax[m]), t_b(want_amax));
        CHECK(t_b(o->scale[m]) == t_b(want_scale), "%s: scale[%u] = %08x, expected %08x",
              c->name, m, t_b(o->scale[m]), t_b(want_scale));
        CHECK(t_b(o->scale_inv[m]) == t_b(qt_fp8_scale_inv(want_scale)),
              "%s: scale_inv[%u] = %08x", c->name, m, t_b(o->scale_inv[m]));
    }
    free(member_amax);
    free(scale);
    free(preset);
}

#define T_CASE(name, rows, cols, dtype, fp8, mode, members, max_dim, rw, cw, pow2, eps, plant, \
               misalign, seed)                                                                 \
    {name, rows, cols, QT_DTYPE_##dtype, QT_FP8_##fp8, QT_FP8_SCALE_##mode, members, max_dim,   \
     rw, cw, pow2, eps, plant, misalign, seed}

static const fp8_case t_cases[] = {
    T_CASE("dense_1x1_bf16_e4m3_delayed", 1, 1, BF16, E4M3, DELAYED, 0, 0, 1, 1, 0, 0, 0, 0, 1),
    T_CASE("dense_1x1000_bf16_e4m3_delayed", 1, 1000, BF16, E4M3, DELAYED, 0, 0, 1, 1, 0, 0, 2,
           0, 2),
    T_CASE("dense_1000x1_f32_e4m3_current", 1000, 1, F32, E4M3, CURRENT, 0, 0, 1, 1, 0, 0, 1, 0,
           3),
    T_CASE("dense_67x131_f32_e5m2_delayed", 67, 131, F32, E5M2, DELAYED, 0, 0, 1, 1, 0, 0, 2, 0,
           4),
    T_CASE("dense_257x509_bf16_e4m3_current_pow2_rowwise", 257, 509, BF16, E4M3, CURRENT, 0, 0,
           1, 0, 1, 0, 1, 0, 5),
    T_CASE("dense_129x77_bf16_e5m2_delayed_colwise", 129, 77, BF16, E5M2, DELAYED, 0, 0, 0, 1, 0,
           0, 2, 0, 6),
    T_CASE("dense_256x512_bf16_e4m3_current_eps", 256, 512, BF16, E4M3, CURRENT, 0, 0, 1, 1, 0,
           4.0f, 0, 0, 7),
    T_CASE("dense_192x384_f32_e4m3_delayed_misaligned", 192, 384, F32, E4M3, DELAYED, 0, 0, 1, 1,
           0, 0, 2, 1, 8),
    T_CASE("dense_200x136_bf16_e4m3_current_misaligned", 200, 136, BF16, E4M3, CURRENT, 0, 0, 1,
           1, 0, 0, 1, 1, 9),
    T_CASE("dense_1024x2048_bf16_e4m3_delayed", 1024, 2048, BF16, E4M3, DELAYED, 0, 0, 1, 1, 0,
           0, 2, 0, 10),
    T_CASE("dense_2048x4096_bf16_e5m2_current", 2048, 4096, BF16, E5M2, CURRENT, 0, 0, 1, 1, 0,
           0, 1, 0, 11),
    T_CASE("grouped1_bf16_e4m3_delayed", 0, 256, BF16, E4M3, DELAYED, 1, 300, 1, 1, 0, 0, 2, 0,
           12),
    T_CASE("grouped3_f32_e5m2_current", 0, 72, F32, E5M2, CURRENT, 3, 200, 1, 1, 0, 0, 1, 0, 13),
    T_CASE("grouped64_bf16_e4m3_delayed", 0, 96, BF16, E4M3, DELAYED, 64, 100, 1, 1, 0, 0, 2, 0,
           14),
    T_CASE("grouped65_bf16_e4m3_current", 0, 40, BF16, E4M3, CURRENT, 65, 90, 1, 1, 0, 0, 1, 0,
           15),
    T_CASE("grouped1000_bf16_e4m3_delayed", 0, 24, BF16, E4M3, DELAYED, 1000, 20, 1, 1, 0, 0, 2,
           0, 16),
    T_CASE("grouped1000_f32_e5m2_current_cols13", 0, 13, F32, E5M2, CURRENT, 1000, 12, 1, 1, 1,
           0, 1, 0, 17),
    T_CASE("grouped5_all_empty", 0, 64, BF16, E4M3, DELAYED, 5, 0, 1, 1, 0, 0, 0, 0, 18),
};
#define T_CASE_COUNT (sizeof t_cases / sizeof t_cases[0])

static void test_ref_programs(void) {
    test_begin("fp8_ref_programs_match_oracle");
    for (size_t i = 0; i < T_CASE_COUNT; i++) {
        const fp8_case *c = &t_cases[i];
        fp8_run *run = calloc(1, sizeof *run);
        const char *why = NULL;
        t_run_open(run, BACKEND_REF, c, &why);
        t_run_execute(run, c);
        fp8_out o;
        t_run_read(run, c, &o);
        t_check_invariants(run, c, &o);
        t_out_free(&o);
        t_run_close(run);
        free(run);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU against the reference backend, byte for byte.

// Compares two buffers element by element; prints the first mismatches with their (row, col)
// in a matrix of `row_len` elements starting `skip` bytes into the buffer.
static void t_compare(const char *name, const char *what, const void *gpu, const void *ref,
                      uint64_t bytes, uint32_t elem, uint64_t skip, uint64_t row_len) {
    const uint8_t *g = gpu, *w = ref;
    uint64_t bad = 0;
    for (uint64_t i = 0; i + elem <= bytes; i += elem) {
        if (memcmp(g + i, w + i, elem) == 0) continue;
        if (bad++ < 6) {
            uint64_t gv = 0, wv = 0;
            memcpy(&gv, g + i, elem);
            memcpy(&wv, w + i, elem);
            uint64_t e = i >= skip ? (i - skip) / elem : 0;
            CHECK(false, "%s %s: byte %llu (row %llu, col %llu): gpu %0*llx, ref %0*llx", name,
                  what, (unsigned long long)i, (unsigned long long)(e / row_len),
                  (unsigned long long)(e % row_len), (int)(2 * elem), (unsigned long long)gv,
                  (int)(2 * elem), (unsigned long long)wv);
        }
    }
    CHECK(bad == 0, "%s %s: %llu of %llu elements differ", name, what, (unsigned long long)bad,
          (unsigned long long)(bytes / elem));
}

static void t_compare_outputs(const fp8_run *run, const fp8_case *c, const fp8_out *g,
                              const fp8_out *w, const char *name) {
    uint64_t elems = (uint64_t)run->rows * c->cols;
    t_compare(name, "rowwise", g->rowwise, w->rowwise, elems + 16, 1, run->row_off, c->cols);
    t_compare(name, "colwise", g->colwise, w->colwise, elems + 16, 1, run->col_off, run->rows);
    t_compare(name, "dequantized rowwise f32", g->deq_row, w->deq_row, elems * 4, 4, 0, c->cols);
    t_compare(name, "dequantized colwise bf16", g->deq_col, w->deq_col, elems * 2, 2, 0,
              c->cols);
    t_compare(name, "scale", g->scale, w->scale, run->n * 4, 4, 0, run->n);
    t_compare(name, "scale_inv", g->scale_inv, w->scale_inv, run->n * 4, 4, 0, run->n);
    t_compare(name, "amax", g->amax, w->amax, run->n * 4, 4, 0, run->n);
    t_compare(name, "row_offsets", g->offsets, w->offsets, (run->n + 1) * 4, 4, 0, run->n + 1);
    t_compare(name, "input after planting", g->x, w->x, elems * t_elem_bytes(c->dtype),
              t_elem_bytes(c->dtype), 0, c->cols);
}

// Runs case c on both backends and compares. Returns false (and reports SKIP) without a GPU.
static bool t_gpu_case(const fp8_case *c) {
    fp8_run *gpu = calloc(1, sizeof *gpu), *ref = calloc(1, sizeof *ref);
    const char *why = NULL;
    char name[96];
    snprintf(name, sizeof name, "gpu_fp8_%s", c->name);
    if (!t_run_open(gpu, BACKEND_GPU, c, &why)) {
        test_skip(name, why);
        free(gpu);
        free(ref);
        return false;
    }
    test_begin(name);
    t_run_open(ref, BACKEND_REF, c, &why);
    t_run_execute(gpu, c);
    t_run_execute(ref, c);
    fp8_out g, w;
    t_run_read(gpu, c, &g);
    t_run_read(ref, c, &w);
    t_compare_outputs(gpu, c, &g, &w, c->name);
    t_out_free(&g);
    t_out_free(&w);
    t_run_close(gpu);
    t_run_close(ref);
    free(gpu);
    free(ref);
    test_end();
    return true;
}

// The graph of a stateless (current scaling) grouped case, replayed twice, gives the eager bits.
static void test_gpu_graph_replay(const fp8_case *c) {
    fp8_run *run = calloc(1, sizeof *run);
    const char *why = NULL;
    if (!t_run_open(run, BACKEND_GPU, c, &why)) {
        test_skip("gpu_fp8_graph_replay_matches_eager", why);
        free(run);
        return;
    }
    test_begin("gpu_fp8_graph_replay_matches_eager");
    t_run_execute(run, c);
    fp8_out eager;
    t_run_read(run, c, &eager);
    backend_graph graph;
    RIG_OK(backend_capture(&run->r.be, &run->r.prog, &graph));
    for (int replay = 0; replay < 2; replay++) {
        RIG_OK(backend_launch(&run->r.be, &graph));
        fp8_out again;
        t_run_read(run, c, &again);
        t_compare_outputs(run, c, &again, &eager, replay ? "replay 2" : "replay 1");
        t_out_free(&again);
    }
    backend_graph_destroy(&run->r.be, &graph);
    t_out_free(&eager);
    t_run_close(run);
    free(run);
    test_end();
}

// Group offsets for many counts (several 1024-member chunks among them) and alignments.
static void test_gpu_group_offsets(void) {
    static const uint32_t counts[] = {1, 3, 64, 65, 1000, 1024, 1025, 5000};
    static const uint32_t aligns[] = {16, 1, 128};
    rig *gpu = calloc(1, sizeof *gpu), *ref = calloc(1, sizeof *ref);  // large: off the stack
    const char *why = NULL;
    if (!rig_open(gpu, BACKEND_GPU, &why)) {
        test_skip("gpu_group_offsets_matches_ref", why);
        free(gpu);
        free(ref);
        return;
    }
    rig_open(ref, BACKEND_REF, &why);
    test_begin("gpu_group_offsets_matches_ref");
    enum { CASES = sizeof counts / sizeof counts[0] * (sizeof aligns / sizeof aligns[0]) };
    arena_handle dims[2][CASES], off[2][CASES];
    rig *rigs[2] = {gpu, ref};
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < CASES; i++) {
            uint32_t n = counts[i / 3];
            char name[32];  // region names are unique per arena
            snprintf(name, sizeof name, "first_dims_%d", i);
            dims[b][i] = rig_reserve(rigs[b], name, n * 4);
            snprintf(name, sizeof name, "row_offsets_%d", i);
            off[b][i] = rig_reserve(rigs[b], name, (n + 1) * 4);
            op_group g = {n, rig_ref(rigs[b], off[b][i], 0), rig_ref(rigs[b], dims[b][i], 0)};
            RIG_OK(op_group_offsets(&rigs[b]->prog, "offsets", &g, aligns[i % 3]));
        }
        rig_bind(rigs[b]);
    }
    uint32_t *host = malloc(5001 * 4), *result[2] = {malloc(5001 * 4), malloc(5001 * 4)};
    uint64_t state = 99;
    for (int i = 0; i < CASES; i++) {
        uint32_t n = counts[i / 3];
        for (uint32_t j = 0; j < n; j++) host[j] = (uint32_t)(t_lcg(&state) % 300);
        for (int b = 0; b < 2; b++) {
            RIG_OK(backend_write(&rigs[b]->be, rig_ref(rigs[b], dims[b][i], 0), host, n * 4));
        }
    }
    for (int b = 0; b < 2; b++) RIG_OK(backend_run(&rigs[b]->be, &rigs[b]->prog));
    for (int i = 0; i < CASES; i++) {
        uint32_t n = counts[i / 3];
        for (int b = 0; b < 2; b++) {
            RIG_OK(backend_read(&rigs[b]->be, result[b], rig_ref(rigs[b], off[b][i], 0),
                                (n + 1) * 4));
        }
        char what[64];
        snprintf(what, sizeof what, "n %u align %u", n, aligns[i % 3]);
        t_compare("group_offsets", what, result[0], result[1], (n + 1) * 4, 4, 0, n + 1);
    }
    free(host);
    free(result[0]);
    free(result[1]);
    rig_close(gpu);
    rig_close(ref);
    free(gpu);
    free(ref);
    test_end();
}

typedef struct t_update_case {
    uint32_t slots, len, algo, fp8;
    bool reduced;
    int margin;
} t_update_case;

// History values over many binades, zeros (a third of the current row), NaN, Inf and FP32
// subnormals; scales with a few infinities.
static void t_update_state(float *h, float *scale, float *reduced, const t_update_case *u,
                           uint64_t *state, bool current_row_only) {
    uint32_t rows = current_row_only ? 1 : u->len;
    for (uint32_t i = 0; i < rows; i++) {
        for (uint32_t j = 0; j < u->slots; j++) {
            uint64_t r = t_lcg(state);
            float v = ldexpf((float)(r % 1000) / 100.0f, (int)((r >> 10) % 40) - 20);
            if (r % 37 == 0) v = t_f(0x7FC00000u);
            if (r % 41 == 0) v = t_f(0x7F800000u);
            if (r % 43 == 0) v = t_f(0x000116C2u);
            if (r % 3 == 0 || (i > 0 && r % 4 == 1)) v = 0.0f;
            h[(uint64_t)i * u->slots + j] = v;
        }
    }
    if (current_row_only) return;
    for (uint32_t j = 0; j < u->slots; j++) {
        uint64_t r = t_lcg(state);
        scale[j] = r % 29 == 0 ? t_f(0x7F800000u) : 0.5f + (float)(r % 64) / 32.0f;
        reduced[j] = r % 2 ? 0.0f : (float)(r % 500) / 7.0f;
    }
}

static void t_gpu_update_case(const t_update_case *u, rig *rigs[2]) {
    uint64_t hist_bytes = (uint64_t)u->len * u->slots * 4;
    arena_handle h[2], s[2], red[2];
    for (int b = 0; b < 2; b++) {
        h[b] = rig_reserve(rigs[b], "history", hist_bytes);
        s[b] = rig_reserve(rigs[b], "scale", u->slots * 4);
        red[b] = rig_reserve(rigs[b], "reduced", u->slots * 4);
        prog_ref reduced = u->reduced ? rig_ref(rigs[b], red[b], 0) : OP_FP8_NONE;
        RIG_OK(op_fp8_delayed_update(&rigs[b]->prog, "update", rig_ref(rigs[b], h[b], 0),
                                     rig_ref(rigs[b], s[b], 0), reduced, u->slots, u->len,
                                     u->algo, u->fp8, u->margin));
        rig_bind(rigs[b]);
    }
    float *hist = malloc(hist_bytes), *scale = malloc(u->slots * 4);
    float *reduced = malloc(u->slots * 4);
    float *out[2][2] = {{malloc(hist_bytes), malloc(u->slots * 4)},
                        {malloc(hist_bytes), malloc(u->slots * 4)}};
    uint64_t state = u->slots * 31 + u->len;
    t_update_state(hist, scale, reduced, u, &state, false);
    // Two steps: the second starts from the first's result with a fresh current row.
    for (int step = 0; step < 2; step++) {
        if (step == 1) {
            memcpy(hist, out[1][0], hist_bytes);
            t_update_state(hist, scale, reduced, u, &state, true);
            memcpy(scale, out[1][1], u->slots * 4);
        }
        for (int b = 0; b < 2; b++) {
            RIG_OK(backend_write(&rigs[b]->be, rig_ref(rigs[b], h[b], 0), hist, hist_bytes));
            RIG_OK(backend_write(&rigs[b]->be, rig_ref(rigs[b], s[b], 0), scale, u->slots * 4));
            RIG_OK(backend_write(&rigs[b]->be, rig_ref(rigs[b], red[b], 0), reduced,
                                 u->slots * 4));
            RIG_OK(backend_run(&rigs[b]->be, &rigs[b]->prog));
            RIG_OK(backend_read(&rigs[b]->be, out[b][0], rig_ref(rigs[b], h[b], 0), hist_bytes));
            RIG_OK(backend_read(&rigs[b]->be, out[b][1], rig_ref(rigs[b], s[b], 0),
                                u->slots * 4));
        }
        char what[96];
        snprintf(what, sizeof what, "slots %u L %u algo %u step %d", u->slots, u->len, u->algo,
                 step);
        t_compare("delayed_update history", what, out[0][0], out[1][0], hist_bytes, 4, 0,
                  u->slots);
        t_compare("delayed_update scale", what, out[0][1], out[1][1], u->slots * 4, 4, 0,
                  u->slots);
    }
    free(hist);
    free(scale);
    free(reduced);
    for (int b = 0; b < 2; b++) {
        free(out[b][0]);
        free(out[b][1]);
    }
}

static void test_gpu_delayed_update(void) {
    static const t_update_case cases[] = {
        {1000, 1, QT_FP8_AMAX_ALGO_MAX, QT_FP8_E4M3, false, 0},
        {1000, 2, QT_FP8_AMAX_ALGO_MOST_RECENT, QT_FP8_E5M2, true, 1},
        {777, 17, QT_FP8_AMAX_ALGO_MAX, QT_FP8_E4M3, true, 0},
        {300, 1024, QT_FP8_AMAX_ALGO_MAX, QT_FP8_E4M3, false, 2},
        {1, 1024, QT_FP8_AMAX_ALGO_MOST_RECENT, QT_FP8_E5M2, false, 0},
    };
    const char *why = NULL;
    rig *rigs[2] = {calloc(1, sizeof(rig)), calloc(1, sizeof(rig))};
    if (!rig_open(rigs[0], BACKEND_GPU, &why)) {
        test_skip("gpu_fp8_delayed_update_matches_ref", why);
        free(rigs[0]);
        free(rigs[1]);
        return;
    }
    rig_close(rigs[0]);
    test_begin("gpu_fp8_delayed_update_matches_ref");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rig_open(rigs[0], BACKEND_GPU, &why);
        rig_open(rigs[1], BACKEND_REF, &why);
        t_gpu_update_case(&cases[i], rigs);
        rig_close(rigs[0]);
        rig_close(rigs[1]);
    }
    free(rigs[0]);
    free(rigs[1]);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The end of a step for several states in one op (op_fp8_delayed_states) against the ops it
// replaces: per state a copy of history row 0, op_fp8_delayed_update, a copy of the scales.

#define T_STATES_MAX 8

typedef struct t_states_case {
    const char *name;
    uint32_t count;  // <= T_STATES_MAX; more than QT_FP8_STATES_PER_OP takes several ops
    bool update;     // false: the scale snapshot alone (eval, infer)
    uint32_t slots_scale;  // state s has 1 + (s * 5 + 2) % 7 slots, times this
    bool skipped;    // update: the optimizer's skip flag is set (a non-finite gradient); the
                     // separate ops are then the amax copies and a zeroed row 0
} t_states_case;

// One program over `count` states, in either form, with its regions.
typedef struct t_states_run {
    rig r;
    op_fp8_delayed_state st[T_STATES_MAX];
    arena_handle history[T_STATES_MAX], scale[T_STATES_MAX], amax_out, scale_out, skip, zeros;
    uint32_t entries;
    uint64_t bytes;  // of every region, in the order above (t_states_read's layout)
} t_states_run;

// Shapes of every kind: lengths 1, 2, 16, 17, 1024 and 2500 (the C twin's rolls of one, two and
// many 16-row chunks; the kernel's of one whole and three 1024-row chunks, the last partial),
// both algorithms and formats, margins 0..2. Snapshot entries run in reverse state order, so
// that the kernel cannot rely on them following the states.
static void t_states_shapes(const t_states_case *c, t_states_run *run) {
    static const uint32_t lens[] = {1024, 16, 1, 2, 17, 2500};
    uint32_t entry = 0;
    for (uint32_t k = c->count; k-- > 0;) {
        op_fp8_delayed_state *st = &run->st[k];
        st->slots = (1 + (k * 5 + 2) % 7) * c->slots_scale;
        st->history_len = lens[k % (sizeof lens / sizeof lens[0])];
        st->algo = k % 2 ? QT_FP8_AMAX_ALGO_MOST_RECENT : QT_FP8_AMAX_ALGO_MAX;
        st->fp8 = k % 3 == 1 ? QT_FP8_E5M2 : QT_FP8_E4M3;
        st->margin = (int)(k % 3);
        st->first = entry;
        entry += st->slots;
    }
    run->entries = entry + 3;  // entries no slot maps to must stay untouched
}

static void t_states_build(t_states_run *run, const t_states_case *c, backend_kind kind,
                           bool fused, const char **why) {
    QT_ASSERT(c->count <= T_STATES_MAX);
    if (!rig_open(&run->r, kind, why)) return;
    t_states_shapes(c, run);
    run->bytes = 0;
    for (uint32_t k = 0; k < c->count; k++) {
        op_fp8_delayed_state *st = &run->st[k];
        char name[32];
        snprintf(name, sizeof name, "history%u", k);
        run->history[k] = rig_reserve(&run->r, name, (uint64_t)st->history_len * st->slots * 4);
        snprintf(name, sizeof name, "scale%u", k);
        run->scale[k] = rig_reserve(&run->r, name, st->slots * 4);
        st->history = rig_ref(&run->r, run->history[k], 0);
        st->scale = rig_ref(&run->r, run->scale[k], 0);
        run->bytes += (uint64_t)(st->history_len + 1) * st->slots * 4;
    }
    run->amax_out = rig_reserve(&run->r, "amax_out", run->entries * 4);
    run->scale_out = rig_reserve(&run->r, "scale_out", run->entries * 4);
    run->skip = rig_reserve(&run->r, "skip", 4);
    run->zeros = rig_reserve(&run->r, "zeros", (uint64_t)run->entries * 4);  // zero from bind
    run->bytes += run->entries * 8;
    prog_ref amax_out = rig_ref(&run->r, run->amax_out, 0);
    prog_ref scale_out = rig_ref(&run->r, run->scale_out, 0);
    program *p = &run->r.prog;
    if (fused) {
        // Every update reads the skip flag (t_states_step writes it): 0, or 1 when skipped.
        op_fp8_delayed_end end = {c->update, c->update ? amax_out : OP_FP8_NONE, scale_out,
                                  c->update ? rig_ref(&run->r, run->skip, 0) : OP_FP8_NONE,
                                  run->entries};
        RIG_OK(op_fp8_delayed_states(p, "delayed", run->st, c->count, &end));
        uint32_t ops = (c->count + QT_FP8_STATES_PER_OP - 1) / QT_FP8_STATES_PER_OP;
        CHECK(p->op_count == ops, "%u states: %u ops, expected %u", c->count, p->op_count, ops);
    } else {
        for (uint32_t k = 0; c->update && k < c->count; k++) {
            const op_fp8_delayed_state *st = &run->st[k];
            RIG_OK(op_copy(p, "amax", rig_ref(&run->r, run->amax_out, st->first * 4),
                           st->history, st->slots * 4));
        }
        for (uint32_t k = 0; c->update && k < c->count; k++) {
            const op_fp8_delayed_state *st = &run->st[k];
            if (c->skipped) {  // the state as before the step: row 0 back to zero
                RIG_OK(op_copy(p, "drop", st->history, rig_ref(&run->r, run->zeros, 0),
                               st->slots * 4));
                continue;
            }
            RIG_OK(op_fp8_delayed_update(p, "update", st->history, st->scale, OP_FP8_NONE,
                                         st->slots, st->history_len, st->algo, st->fp8,
                                         st->margin));
        }
        for (uint32_t k = 0; k < c->count; k++) {
            const op_fp8_delayed_state *st = &run->st[k];
            RIG_OK(op_copy(p, "scale", rig_ref(&run->r, run->scale_out, st->first * 4),
                           st->scale, st->slots * 4));
        }
    }
    rig_bind(&run->r);
}

// Writes the step's inputs (step 0: whole histories, scales and sentinel snapshots; later steps:
// a fresh row 0 of every history), runs the program once and reads every region into out.
static void t_states_step(t_states_run *run, const t_states_case *c, int step, uint8_t *out) {
    uint64_t state = 977 + (uint64_t)step;
    for (uint32_t k = 0; k < c->count; k++) {
        const op_fp8_delayed_state *st = &run->st[k];
        uint64_t hist_bytes = (uint64_t)st->history_len * st->slots * 4;
        float *h = malloc(hist_bytes), *scale = malloc(st->slots * 4);
        float *reduced = malloc(st->slots * 4);
        t_update_case u = {st->slots, st->history_len, st->algo, st->fp8, false, st->margin};
        t_update_state(h, scale, reduced, &u, &state, step > 0);
        uint64_t written = step > 0 ? st->slots * 4 : hist_bytes;
        RIG_OK(backend_write(&run->r.be, st->history, h, written));
        if (step == 0) RIG_OK(backend_write(&run->r.be, st->scale, scale, st->slots * 4));
        free(h);
        free(scale);
        free(reduced);
    }
    if (step == 0) {
        uint32_t skip = c->skipped ? 1u : 0u;
        RIG_OK(backend_write(&run->r.be, rig_ref(&run->r, run->skip, 0), &skip, 4));
        uint8_t *sentinel = malloc(run->entries * 4);
        memset(sentinel, T_SENTINEL, run->entries * 4);
        RIG_OK(backend_write(&run->r.be, rig_ref(&run->r, run->amax_out, 0), sentinel,
                             run->entries * 4));
        RIG_OK(backend_write(&run->r.be, rig_ref(&run->r, run->scale_out, 0), sentinel,
                             run->entries * 4));
        free(sentinel);
    }
    RIG_OK(backend_run(&run->r.be, &run->r.prog));
    uint64_t at = 0;
    for (uint32_t k = 0; k < c->count; k++) {
        const op_fp8_delayed_state *st = &run->st[k];
        uint64_t hist_bytes = (uint64_t)st->history_len * st->slots * 4;
        RIG_OK(backend_read(&run->r.be, out + at, st->history, hist_bytes));
        RIG_OK(backend_read(&run->r.be, out + at + hist_bytes, st->scale, st->slots * 4));
        at += hist_bytes + st->slots * 4;
    }
    RIG_OK(backend_read(&run->r.be, out + at, rig_ref(&run->r, run->amax_out, 0),
                        run->entries * 4));
    RIG_OK(backend_read(&run->r.be, out + at + run->entries * 4,
                        rig_ref(&run->r, run->scale_out, 0), run->entries * 4));
}

// The regions of two runs of the same case, part by part.
static void t_states_compare(const t_states_run *run, const t_states_case *c, const uint8_t *a,
                             const uint8_t *b, const char *what) {
    uint64_t at = 0;
    for (uint32_t k = 0; k < c->count; k++) {
        const op_fp8_delayed_state *st = &run->st[k];
        uint64_t hist_bytes = (uint64_t)st->history_len * st->slots * 4;
        char part[48];
        snprintf(part, sizeof part, "%s history%u", c->name, k);
        t_compare(part, what, a + at, b + at, hist_bytes, 4, 0, st->slots);
        snprintf(part, sizeof part, "%s scale%u", c->name, k);
        t_compare(part, what, a + at + hist_bytes, b + at + hist_bytes, st->slots * 4, 4, 0,
                  st->slots);
        at += hist_bytes + st->slots * 4;
    }
    t_compare(c->name, "amax snapshot", a + at, b + at, run->entries * 4, 4, 0, run->entries);
    at += run->entries * 4;
    t_compare(c->name, "scale snapshot", a + at, b + at, run->entries * 4, 4, 0, run->entries);
}

static const t_states_case t_states_cases[] = {
    {"two_states", 2, true, 1, false},          // the shipped delayed recipes: one op
    {"two_states_eval", 2, false, 1, false},    // eval and infer: scale snapshots only
    {"seven_states", 7, true, 1, false},        // two ops
    {"eight_states_eval", 8, false, 1, false},  // two ops, snapshots only
    {"wide_states", 3, true, 150, false},       // 900 slots in all: 900 blocks
    {"seven_states_skipped", 7, true, 1, true},  // a skipped step: the state stays
    {"wide_states_skipped", 3, true, 150, true},
};
#define T_STATES_CASES (sizeof t_states_cases / sizeof t_states_cases[0])

// The forms on backends a and b (fused or not), two steps each, compared region by region.
static void t_states_pair(const t_states_case *c, backend_kind ka, bool fa, backend_kind kb,
                          bool fb, const char *what) {
    t_states_run *run[2] = {calloc(1, sizeof(t_states_run)), calloc(1, sizeof(t_states_run))};
    const char *why = NULL;
    t_states_build(run[0], c, ka, fa, &why);
    t_states_build(run[1], c, kb, fb, &why);
    uint8_t *out[2] = {malloc(run[0]->bytes), malloc(run[1]->bytes)};
    for (int step = 0; step < 2; step++) {
        t_states_step(run[0], c, step, out[0]);
        t_states_step(run[1], c, step, out[1]);
        char label[64];
        snprintf(label, sizeof label, "%s, step %d", what, step);
        t_states_compare(run[0], c, out[0], out[1], label);
    }
    for (int i = 0; i < 2; i++) {
        rig_close(&run[i]->r);
        free(run[i]);
        free(out[i]);
    }
}

static void test_delayed_states_match_separate_ops(void) {
    test_begin("fp8_delayed_states_match_copy_update_copy_ref");
    for (size_t i = 0; i < T_STATES_CASES; i++) {
        t_states_pair(&t_states_cases[i], BACKEND_REF, true, BACKEND_REF, false,
                      "fused vs separate ops");
    }
    test_end();
}

static void test_gpu_delayed_states(void) {
    const char *why = NULL;
    rig probe;
    if (!rig_open(&probe, BACKEND_GPU, &why)) {
        test_skip("gpu_fp8_delayed_states_match_ref_and_separate_ops", why);
        return;
    }
    rig_close(&probe);
    test_begin("gpu_fp8_delayed_states_match_ref_and_separate_ops");
    for (size_t i = 0; i < T_STATES_CASES; i++) {
        const t_states_case *c = &t_states_cases[i];
        t_states_pair(c, BACKEND_GPU, true, BACKEND_REF, true, "gpu vs ref");
        t_states_pair(c, BACKEND_GPU, true, BACKEND_GPU, false, "gpu fused vs gpu separate ops");
    }
    test_end();
}

// The transpose of rowwise codes (op_fp8_transpose) equals the columnwise codes the cast wrote
// beside them, byte for byte, on each backend, and the GPU's equals the reference backend's:
// per-tensor current scaling, and FP8 block scaling's 128 x 128 tiles with the tile scales
// transposed too; shapes with partial tiles, odd rows (bytewise stores) and odd columns
// (bytewise loads).
typedef struct t_transpose_regions {
    arena_handle x, row, col, scale_inv, amax, t;
    arena_handle row_scales, col_scales, t_scales;  // block: [rows/128][cols/128] and transposed
    uint32_t grid_rows, grid_cols;
} t_transpose_regions;

static void t_transpose_build(rig *r, uint32_t rows, uint32_t cols, bool block,
                              t_transpose_regions *h) {
    uint64_t elems = (uint64_t)rows * cols;
    h->x = rig_reserve(r, "x", elems * 2);
    h->row = rig_reserve(r, "row", elems);
    h->col = rig_reserve(r, "col", elems);
    h->t = rig_reserve(r, "t", elems);
    h->grid_rows = (uint32_t)op_block_tiles(rows);
    h->grid_cols = (uint32_t)op_block_tiles(cols);
    op_fp8_scale_grid grid = {OP_FP8_NONE, OP_FP8_NONE, 0, 0};
    prog_ref x = rig_ref(r, h->x, 0);
    if (block) {
        uint64_t scale_bytes = 4ull * h->grid_rows * h->grid_cols;
        h->row_scales = rig_reserve(r, "row_scales", scale_bytes);
        h->col_scales = rig_reserve(r, "col_scales", scale_bytes);
        h->t_scales = rig_reserve(r, "t_scales", scale_bytes);
        op_block_tensor t = {rows, cols, true, QT_BLOCK_E4M3, true, true,
                             rig_ref(r, h->row, 0), rig_ref(r, h->row_scales, 0),
                             rig_ref(r, h->col, 0), rig_ref(r, h->col_scales, 0),
                             op_group_dense()};
        RIG_OK(op_quant_block(&r->prog, "cast", x, QT_DTYPE_BF16, &t, NULL));
        grid = (op_fp8_scale_grid){rig_ref(r, h->row_scales, 0), rig_ref(r, h->t_scales, 0),
                                   h->grid_rows, h->grid_cols};
    } else {
        h->scale_inv = rig_reserve(r, "scale_inv", 4);
        h->amax = rig_reserve(r, "amax", 4);
        op_fp8_input in = {x, QT_DTYPE_BF16, rows, cols, op_group_dense()};
        op_fp8_output out = {QT_FP8_E4M3, rig_ref(r, h->row, 0), rig_ref(r, h->col, 0),
                             rig_ref(r, h->scale_inv, 0)};
        RIG_OK(op_fp8_quantize_current(&r->prog, "cast", &in, &out, rig_ref(r, h->amax, 0),
                                       OP_FP8_NONE, false, 0.0f));
    }
    RIG_OK(op_fp8_transpose(&r->prog, "transpose", rows, cols, rig_ref(r, h->row, 0),
                            rig_ref(r, h->t, 0), block ? &grid : NULL));
    rig_bind(r);
}

// Runs the program on x; returns the transposed codes, then (block) the transposed scales (the
// caller frees them).
static uint8_t *t_transpose_run(rig *r, const t_transpose_regions *h, uint32_t rows,
                                uint32_t cols, bool block, const uint16_t *x, const char *on) {
    uint64_t elems = (uint64_t)rows * cols;
    uint64_t scale_bytes = block ? 4ull * h->grid_rows * h->grid_cols : 0;
    uint8_t *col = malloc(elems + scale_bytes), *t = malloc(elems + scale_bytes);
    RIG_OK(backend_write(&r->be, rig_ref(r, h->x, 0), x, elems * 2));
    RIG_OK(backend_run(&r->be, &r->prog));
    RIG_OK(backend_read(&r->be, col, rig_ref(r, h->col, 0), elems));
    RIG_OK(backend_read(&r->be, t, rig_ref(r, h->t, 0), elems));
    if (block) {
        RIG_OK(backend_read(&r->be, col + elems, rig_ref(r, h->col_scales, 0), scale_bytes));
        RIG_OK(backend_read(&r->be, t + elems, rig_ref(r, h->t_scales, 0), scale_bytes));
    }
    char what[64];
    snprintf(what, sizeof what, "%u x %u %s on %s", rows, cols, block ? "block" : "current", on);
    t_compare("transpose against the cast's columns", what, t, col, elems, 1, 0, rows);
    if (block) {
        t_compare("transposed scales against the cast's", what, t + elems, col + elems,
                  scale_bytes, 4, 0, h->grid_rows);
    }
    free(col);
    return t;
}

static void test_transpose_equals_cast_columns(void) {
    static const uint32_t shapes[][2] = {{1, 1},     {7, 13},     {64, 128},  {65, 129},
                                         {128, 72},  {200, 1000}, {3000, 520}, {1024, 4096},
                                         {4096, 1024}};
    rig_pair rigs;
    rig_pair_open(&rigs);
    rig *gpu = rigs.gpu, *ref = rigs.ref;
    test_begin("transpose_equals_cast_columns");
    uint64_t state = 7;
    for (size_t i = 0; i < 2 * sizeof shapes / sizeof shapes[0]; i++) {
        uint32_t rows = shapes[i / 2][0], cols = shapes[i / 2][1];
        bool block = i % 2 == 1;
        uint64_t elems = (uint64_t)rows * cols;
        uint16_t *x = malloc(elems * 2);
        // BF16 over 8 binades and both signs: every code byte value is likely.
        for (uint64_t e = 0; e < elems; e++) {
            uint64_t v = t_lcg(&state);
            x[e] = (uint16_t)(((v >> 20) & 1u) << 15 | (0x3C00u + (v >> 24) % 0x400u));
        }
        t_transpose_regions hr, hg;
        rig_reset(ref);
        t_transpose_build(ref, rows, cols, block, &hr);
        uint8_t *tr = t_transpose_run(ref, &hr, rows, cols, block, x, "ref");
        if (rigs.on_gpu) {
            rig_reset(gpu);
            t_transpose_build(gpu, rows, cols, block, &hg);
            uint8_t *tg = t_transpose_run(gpu, &hg, rows, cols, block, x, "gpu");
            char what[64];
            snprintf(what, sizeof what, "%u x %u %s", rows, cols, block ? "block" : "current");
            uint64_t bytes = elems + (block ? 4ull * hr.grid_rows * hr.grid_cols : 0);
            t_compare("transpose", what, tg, tr, bytes, 1, 0, rows);
            free(tg);
        }
        free(tr);
        free(x);
    }
    test_end();
    rig_pair_close(&rigs, "gpu_transpose_matches_ref");
}

// The activation and the cast of its output in one pass (op_fp8_act_*) against the activation
// storing its BF16 output and the cast reading it (op_act_forward or op_act_backward, then
// op_fp8_quantize_current or op_fp8_cast_delayed): the same codes in both directions, scale_inv
// and amax, byte for byte, on each backend, and the GPU's fused outputs equal the reference
// backend's. Inputs cover the tables' binades and beyond (the kernels' out-of-line path), zeros,
// subnormals, Inf and NaN; shapes with partial tiles and with more tiles than the grid's blocks
// (each block then runs several); GELU and SiLU, forward and backward, E4M3 and E5M2, delayed
// and current scaling, and a cast without its columnwise copy.
typedef struct t_act_cast_mode {
    uint32_t act;
    bool backward, delayed, colwise;
    uint32_t fp8;
} t_act_cast_mode;

typedef struct t_act_cast_regions {
    arena_handle x, dy, y, scale;
    arena_handle row[2], col[2], scale_inv[2], amax[2];  // [0] act then cast, [1] fused
} t_act_cast_regions;

static void t_act_cast_build(rig *r, uint32_t rows, uint32_t cols, const t_act_cast_mode *md,
                             t_act_cast_regions *h) {
    uint64_t elems = (uint64_t)rows * cols;
    h->x = rig_reserve(r, "x", elems * 2);
    h->dy = rig_reserve(r, "dy", elems * 2);
    h->y = rig_reserve(r, "y", elems * 2);
    h->scale = rig_reserve(r, "scale", 4);
    for (int w = 0; w < 2; w++) {
        h->row[w] = rig_reserve(r, w ? "row_fused" : "row", elems);
        h->col[w] = rig_reserve(r, w ? "col_fused" : "col", elems);
        h->scale_inv[w] = rig_reserve(r, w ? "scale_inv_fused" : "scale_inv", 4);
        h->amax[w] = rig_reserve(r, w ? "amax_fused" : "amax", 4);
    }
    prog_ref x = rig_ref(r, h->x, 0), dy = rig_ref(r, h->dy, 0), y = rig_ref(r, h->y, 0);
    RIG_OK(rig_act_bf16(r, md->act, md->backward, rows, cols, x, dy, y));
    op_fp8_output out[2];
    for (int w = 0; w < 2; w++) {
        out[w] = (op_fp8_output){md->fp8, rig_ref(r, h->row[w], 0),
                                 md->colwise ? rig_ref(r, h->col[w], 0) : OP_FP8_NONE,
                                 rig_ref(r, h->scale_inv[w], 0)};
    }
    op_fp8_input in = {y, QT_DTYPE_BF16, rows, cols, op_group_dense()};
    op_fp8_act_input act = {md->act, md->backward, x, md->backward ? dy : OP_FP8_NONE, rows,
                            cols, OP_FP8_NONE};
    prog_ref scale = rig_ref(r, h->scale, 0), amax0 = rig_ref(r, h->amax[0], 0);
    prog_ref amax1 = rig_ref(r, h->amax[1], 0);
    RIG_OK(op_fp8_amax_zero(&r->prog, "zero", amax1, 1));
    if (md->delayed) {
        RIG_OK(op_fp8_amax_zero(&r->prog, "zero", amax0, 1));
        RIG_OK(op_fp8_cast_delayed(&r->prog, "cast", &in, &out[0], scale, amax0));
        RIG_OK(op_fp8_act_cast_delayed(&r->prog, "act_cast", &act, &out[1], scale, amax1));
    } else {
        RIG_OK(op_fp8_quantize_current(&r->prog, "cast", &in, &out[0], amax0, OP_FP8_NONE, false,
                                       0.0f));
        RIG_OK(op_fp8_act_amax_merge(&r->prog, "act_amax", &act, amax1));
        RIG_OK(op_fp8_act_cast_current(&r->prog, "act_cast", &act, &out[1], amax1, false, 0.0f));
    }
    rig_bind(r);
}

// Runs the program; returns both ways' outputs, [2][rowwise, columnwise, scale_inv, amax]
// back to back (the caller frees them), after comparing them with each other.
static uint8_t *t_act_cast_run(rig *r, const t_act_cast_regions *h, uint32_t rows,
                               uint32_t cols, const t_act_cast_mode *md, const uint16_t *x,
                               const uint16_t *dy, const char *on) {
    uint64_t elems = (uint64_t)rows * cols, half = 2 * elems + 8;
    uint8_t *o = calloc(2, half);
    float scale = md->fp8 == QT_FP8_E5M2 ? 0.25f : 3.0f;
    RIG_OK(backend_write(&r->be, rig_ref(r, h->x, 0), x, elems * 2));
    RIG_OK(backend_write(&r->be, rig_ref(r, h->dy, 0), dy, elems * 2));
    RIG_OK(backend_write(&r->be, rig_ref(r, h->scale, 0), &scale, 4));
    RIG_OK(backend_run(&r->be, &r->prog));
    for (int w = 0; w < 2; w++) {
        uint8_t *at = o + w * half;
        RIG_OK(backend_read(&r->be, at, rig_ref(r, h->row[w], 0), elems));
        if (md->colwise) RIG_OK(backend_read(&r->be, at + elems, rig_ref(r, h->col[w], 0), elems));
        RIG_OK(backend_read(&r->be, at + 2 * elems, rig_ref(r, h->scale_inv[w], 0), 4));
        RIG_OK(backend_read(&r->be, at + 2 * elems + 4, rig_ref(r, h->amax[w], 0), 4));
    }
    char what[96];
    snprintf(what, sizeof what, "%u x %u %s %s %s on %s", rows, cols,
             md->act == QT_ACT_GELU ? "gelu" : "silu", md->backward ? "backward" : "forward",
             md->delayed ? "delayed" : "current", on);
    t_compare("fused rowwise", what, o + half, o, elems, 1, 0, cols);
    t_compare("fused columnwise", what, o + half + elems, o + elems, elems, 1, 0, rows);
    t_compare("fused scale_inv and amax", what, o + half + 2 * elems, o + 2 * elems, 8, 4, 0, 2);
    return o;
}

// A BF16 input: mostly values in and near the tables' binades [2^-12, 2^4), both signs; one in
// 64 anything at all (NaN, Inf, subnormals, huge values included).
static uint16_t t_act_cast_value(uint64_t *state) {
    uint64_t v = t_lcg(state);
    if ((v >> 10) % 64 == 0) return (uint16_t)(v >> 40);
    uint32_t sign = (uint32_t)((v >> 20) & 1u) << 15;
    uint32_t exponent = 110u + (uint32_t)((v >> 24) % 28u);  // 2^-17 .. 2^10
    return (uint16_t)(sign | exponent << 7 | (uint32_t)((v >> 32) & 0x7Fu));
}

static void test_act_cast_equals_act_then_cast(void) {
    // 33870 x 24 and 2048 x 4096: more tiles (530, 1024) than the grid has blocks (528).
    static const uint32_t shapes[][2] = {{7, 8},      {64, 128},   {65, 136},   {200, 1000},
                                         {3000, 520}, {33870, 24}, {2048, 4096}};
    static const t_act_cast_mode modes[] = {
        {QT_ACT_GELU, false, false, true, QT_FP8_E4M3},
        {QT_ACT_SILU, false, true, true, QT_FP8_E4M3},
        {QT_ACT_GELU, true, true, true, QT_FP8_E5M2},
        {QT_ACT_SILU, true, false, true, QT_FP8_E5M2},
        {QT_ACT_GELU, false, true, false, QT_FP8_E4M3},
        {QT_ACT_GELU, true, false, true, QT_FP8_E4M3},
    };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const size_t n_modes = sizeof modes / sizeof modes[0];
    rig_pair rigs;
    rig_pair_open(&rigs);
    rig *gpu = rigs.gpu, *ref = rigs.ref;
    test_begin("act_cast_equals_act_then_cast");
    uint64_t state = 19;
    for (size_t i = 0; i < n_shapes * 2; i++) {
        uint32_t rows = shapes[i % n_shapes][0], cols = shapes[i % n_shapes][1];
        const t_act_cast_mode *md = &modes[i % n_modes];
        uint64_t elems = (uint64_t)rows * cols;
        // Under compute-sanitizer the largest shape would take most of the run; 33870 x 24
        // keeps blocks of several tiles.
        if (test_sanitizer() && elems > (1u << 22)) continue;
        uint16_t *x = malloc(elems * 2), *dy = malloc(elems * 2);
        for (uint64_t e = 0; e < elems; e++) {
            x[e] = t_act_cast_value(&state);
            dy[e] = t_act_cast_value(&state);
        }
        t_act_cast_regions hr, hg;
        rig_reset(ref);
        t_act_cast_build(ref, rows, cols, md, &hr);
        uint8_t *or = t_act_cast_run(ref, &hr, rows, cols, md, x, dy, "ref");
        if (rigs.on_gpu) {
            rig_reset(gpu);
            t_act_cast_build(gpu, rows, cols, md, &hg);
            uint8_t *og = t_act_cast_run(gpu, &hg, rows, cols, md, x, dy, "gpu");
            char what[64];
            snprintf(what, sizeof what, "%u x %u, mode %zu", rows, cols, i % n_modes);
            uint64_t half = 2 * elems + 8;
            t_compare("fused outputs, gpu against ref", what, og + half, or + half, half, 1, 0,
                      cols);
            free(og);
        }
        free(or);
        free(x);
        free(dy);
    }
    test_end();
    rig_pair_close(&rigs, "gpu_act_cast_matches_ref");
}

// The forward amax from x's maximum slot (fp8_act_cast_args.x_max, which a GEMM fills: gemm.h
// d_max) against the pass over x without it, on each backend, and the GPU's amaxes against the
// reference's: GELU and SiLU; x's true maximum where it gives the amax (inputs as above, up to
// 2^10) and where it does not (every input below the lobe's depth, so the pass runs); an empty
// slot (+0); and a slot above x's true maximum, whose amax must be f(slot), which shows the launch
// took it without reading x.
typedef struct t_amax_max_case {
    const char *what;
    uint32_t act;
    int inputs;        // 0: t_act_cast_value's; 1: in [-4, 0.25)
    int slot;          // 0: +0; 1: x's maximum; 2: 64.0
    bool pass_equals;  // the amax equals the pass's (else f(64))
} t_amax_max_case;

static float t_amax_max_run(rig *r, const t_amax_max_case *c, const uint16_t *x, uint32_t rows,
                            uint32_t cols, uint32_t slot, float *pass) {
    uint64_t elems = (uint64_t)rows * cols;
    rig_reset(r);
    arena_handle hx = rig_reserve(r, "x", elems * 2), hs = rig_reserve(r, "x_max", 4);
    arena_handle ha[2] = {rig_reserve(r, "amax_pass", 4), rig_reserve(r, "amax_max", 4)};
    prog_ref xr = rig_ref(r, hx, 0);
    op_fp8_act_input in[2] = {{c->act, false, xr, OP_FP8_NONE, rows, cols, OP_FP8_NONE},
                              {c->act, false, xr, OP_FP8_NONE, rows, cols, rig_ref(r, hs, 0)}};
    for (int w = 0; w < 2; w++) {
        RIG_OK(op_fp8_amax_zero(&r->prog, "zero", rig_ref(r, ha[w], 0), 1));
        RIG_OK(op_fp8_act_amax_merge(&r->prog, w ? "amax_max" : "amax_pass", &in[w],
                                     rig_ref(r, ha[w], 0)));
    }
    rig_bind(r);
    RIG_OK(backend_write(&r->be, xr, x, elems * 2));
    RIG_OK(backend_write(&r->be, rig_ref(r, hs, 0), &slot, 4));
    RIG_OK(backend_run(&r->be, &r->prog));
    float got;
    RIG_OK(backend_read(&r->be, pass, rig_ref(r, ha[0], 0), 4));
    RIG_OK(backend_read(&r->be, &got, rig_ref(r, ha[1], 0), 4));
    return got;
}

static void test_act_amax_from_max(void) {
    static const t_amax_max_case cases[] = {
        {"gelu, x's maximum", QT_ACT_GELU, 0, 1, true},
        {"silu, x's maximum", QT_ACT_SILU, 0, 1, true},
        {"gelu, below the lobe", QT_ACT_GELU, 1, 1, true},
        {"silu, below the lobe", QT_ACT_SILU, 1, 1, true},
        {"gelu, empty slot", QT_ACT_GELU, 0, 0, true},
        {"silu, a larger slot", QT_ACT_SILU, 0, 2, false},
        {"gelu, a larger slot", QT_ACT_GELU, 1, 2, false},
    };
    const uint32_t rows = 300, cols = 136;
    const uint64_t elems = (uint64_t)rows * cols;
    rig_pair rigs;
    rig_pair_open(&rigs);
    test_begin("act_amax_from_max_equals_the_pass");
    uint16_t *x = malloc(elems * 2);
    uint64_t state = 23;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const t_amax_max_case *c = &cases[i];
        float largest = 0.0f;
        for (uint64_t e = 0; e < elems; e++) {
            uint16_t v = t_act_cast_value(&state);
            if (c->inputs == 1) {  // [-4, 0.25): below both lobes' depths' inputs
                v = qt_f32_to_bf16(-4.0f + (float)(t_lcg(&state) % 4250u) * 0.001f);
            }
            x[e] = v;
            float f = qt_bf16_to_f32(v);
            if (f > largest) largest = f;  // NaN skipped
        }
        uint32_t slot = c->slot == 0 ? 0u : c->slot == 1 ? qt_f32_bits(largest) : 0x42800000u;
        float y, want_max = 0.0f;
        bool answers = qt_act_amax_from_max(c->act, qt_bits_f32(slot), &y);
        bool expect = c->slot == 2 || (c->slot == 1 && c->inputs == 0);
        CHECK(answers == expect, "%s: qt_act_amax_from_max says %d", c->what, answers);
        if (answers) want_max = qt_bf16_to_f32(qt_f32_to_bf16(y));
        float pass_ref, pass_gpu;
        float got_ref = t_amax_max_run(rigs.ref, c, x, rows, cols, slot, &pass_ref);
        float want = c->pass_equals ? pass_ref : want_max;
        CHECK(qt_f32_bits(got_ref) == qt_f32_bits(want), "%s, ref: amax %a, want %a (pass %a)",
              c->what, got_ref, want, pass_ref);
        if (!rigs.on_gpu) continue;
        float got_gpu = t_amax_max_run(rigs.gpu, c, x, rows, cols, slot, &pass_gpu);
        CHECK(qt_f32_bits(got_gpu) == qt_f32_bits(got_ref) &&
                  qt_f32_bits(pass_gpu) == qt_f32_bits(pass_ref),
              "%s, gpu: amax %a and pass %a, ref %a and %a", c->what, got_gpu, pass_gpu, got_ref,
              pass_ref);
    }
    free(x);
    test_end();
    rig_pair_close(&rigs, "gpu_act_amax_from_max_matches_ref");
}

int main(void) {
    TEST_UNIT(test_byte_transpose());
    TEST_UNIT(test_cast_hand_codes());
    TEST_UNIT(test_cast_hand_codes_e5m2_and_scale());
    TEST_UNIT(test_amax_hand());
    TEST_UNIT(test_group_offsets_hand());
    TEST_UNIT(test_grouped_cast_twin());
    TEST_UNIT(test_current_scaling_hand());
    TEST_UNIT(test_delayed_update_hand());
    TEST_UNIT(test_delayed_update_long_history());
    TEST_UNIT(test_dequantize_hand());
    TEST_UNIT(test_roundtrip_bounds());
    TEST_UNIT(test_ref_programs());
    TEST_UNIT(test_transpose_equals_cast_columns());
    TEST_UNIT(test_act_cast_equals_act_then_cast());
    TEST_UNIT(test_act_amax_from_max());
    for (size_t i = 0; i < T_CASE_COUNT; i++) TEST_UNIT(t_gpu_case(&t_cases[i]));
    TEST_UNIT(test_gpu_graph_replay(&t_cases[14]));  // grouped65, current scaling
    TEST_UNIT(test_gpu_group_offsets());
    TEST_UNIT(test_gpu_delayed_update());
    TEST_UNIT(test_delayed_states_match_separate_ops());
    TEST_UNIT(test_gpu_delayed_states());
    return test_exit_code();
}
