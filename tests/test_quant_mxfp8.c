// MXFP8 tests. CPU: the C twins (runtime/ref/ref_quant_mxfp8.c) against hand-derived codes and
// scales, against a test-local oracle written from the MXFP8 rules with the scalar codec
// alone, the grouped rules of quant.h, dequantize error bounds, and the op
// builders on the reference backend. GPU: the same programs on both backends, every output
// compared byte for byte (SKIP without a GPU).
#include <math.h>

#include "runtime/ops/op_core.h"         // op_fill_random
#include "runtime/ops/op_quant_mxfp8.h"  // op_mxfp8_quantize, op_mxfp8_dequantize
#include "runtime/ref/ref.h"             // ref_qt_mxfp8_* (the twins, called directly)
#include "tests/rig.h"
#include "tests/test.h"

#define MX_ADDR(p) ((uint64_t)(uintptr_t)(p))
#define MX_SENTINEL 0xA5u  // output bytes a kernel must leave alone start as this

// ---------------------------------------------------------------------------------------------
// Host matrices and the twins, called directly.

typedef struct mx_mat {
    uint32_t rows, cols, dtype;
    void *in;                // [rows][cols] bf16 or f32
    uint8_t *rc, *rs;        // rowwise codes [rows][cols], scales [rows][ceil(cols/32)]
    uint8_t *cc, *cs;        // columnwise codes [rows][cols], scales [ceil(rows/32)][cols]
} mx_mat;

static uint64_t mx_elem_bytes(uint32_t dtype) { return dtype == QT_DTYPE_BF16 ? 2 : 4; }

static uint8_t *mx_sentinel_alloc(uint64_t bytes) {
    uint8_t *p = malloc(bytes ? bytes : 1);
    memset(p, MX_SENTINEL, bytes ? bytes : 1);
    return p;
}

static mx_mat mx_mat_new(uint32_t rows, uint32_t cols, uint32_t dtype) {
    mx_mat m = {rows, cols, dtype, NULL, NULL, NULL, NULL, NULL};
    m.in = calloc((uint64_t)rows * cols + 1, mx_elem_bytes(dtype));
    m.rc = mx_sentinel_alloc(op_mxfp8_codes_bytes(rows, cols));
    m.rs = mx_sentinel_alloc(op_mxfp8_row_scales_bytes(rows, cols));
    m.cc = mx_sentinel_alloc(op_mxfp8_codes_bytes(rows, cols));
    m.cs = mx_sentinel_alloc(op_mxfp8_col_scales_bytes(rows, cols));
    return m;
}

static void mx_mat_free(mx_mat *m) {
    free(m->in);
    free(m->rc);
    free(m->rs);
    free(m->cc);
    free(m->cs);
}

// Element i from FP32 bits (BF16 keeps the top half: every value planted here is BF16-exact
// or meant to be truncated).
static void mx_set_bits(void *in, uint32_t dtype, uint64_t i, uint32_t bits) {
    if (dtype == QT_DTYPE_BF16) {
        ((uint16_t *)in)[i] = (uint16_t)(bits >> 16);
    } else {
        ((uint32_t *)in)[i] = bits;
    }
}

static void mx_set(void *in, uint32_t dtype, uint64_t i, float v) {
    if (dtype == QT_DTYPE_BF16) {
        ((uint16_t *)in)[i] = qt_f32_to_bf16(v);
    } else {
        ((float *)in)[i] = v;
    }
}

static float mx_get(const void *in, uint32_t dtype, uint64_t i) {
    return qt_mxfp8_load(in, dtype, i);
}

static uint32_t mx_elem_code(qt_elem elem) {
    return elem == QT_ELEM_E5M2 ? QT_MXFP8_E5M2 : QT_MXFP8_E4M3;
}

// Runs the quantize twin on m (both directions, no group unless given).
static void mx_twin(mx_mat *m, qt_elem elem, bool tile_2d, const uint32_t *offsets,
                    const uint32_t *first_dims, uint32_t count) {
    mxfp8_quantize_args a = {0};
    a.in = MX_ADDR(m->in);
    a.row_codes = MX_ADDR(m->rc);
    a.row_scales = MX_ADDR(m->rs);
    a.col_codes = MX_ADDR(m->cc);
    a.col_scales = MX_ADDR(m->cs);
    a.group = (qt_group_desc){MX_ADDR(offsets), MX_ADDR(first_dims), count, 0};
    a.rows = m->rows;
    a.cols = m->cols;
    a.dtype = m->dtype;
    a.elem = mx_elem_code(elem);
    a.flags = tile_2d ? QT_MXFP8_FLAG_2D : 0u;
    launch_shape shape = {{1, 1, 1}, {1, 1, 1}, 0};
    if (m->dtype == QT_DTYPE_BF16) {
        ref_qt_mxfp8_quantize_bf16(&a, &shape);
    } else {
        ref_qt_mxfp8_quantize_f32(&a, &shape);
    }
}

static void mx_twin_dequantize(const uint8_t *codes, const uint8_t *scales, bool colwise,
                               qt_elem elem, uint32_t rows, uint32_t cols, void *out,
                               uint32_t dtype) {
    mxfp8_dequantize_args a = {0};
    a.codes = MX_ADDR(codes);
    a.scales = MX_ADDR(scales);
    a.out = MX_ADDR(out);
    a.rows = rows;
    a.cols = cols;
    a.dtype = dtype;
    a.elem = mx_elem_code(elem);
    a.colwise = colwise;
    launch_shape shape = {{1, 1, 1}, {1, 1, 1}, 0};
    ref_qt_mxfp8_dequantize(&a, &shape);
}

// Byte comparison that names the first mismatches by (row, col) of a [.][cols] layout.
static uint64_t mx_compare(const char *what, const uint8_t *got, const uint8_t *want,
                           uint64_t bytes, uint32_t cols) {
    uint64_t bad = 0;
    for (uint64_t i = 0; i < bytes; i++) {
        if (got[i] == want[i]) continue;
        if (bad++ < 4) {
            CHECK(false, "%s [%llu][%llu]: got 0x%02x, expected 0x%02x", what,
                  (unsigned long long)(i / cols), (unsigned long long)(i % cols), got[i],
                  want[i]);
        }
    }
    CHECK(bad == 0, "%s: %llu of %llu bytes differ", what, (unsigned long long)bad,
          (unsigned long long)bytes);
    return bad;
}

// ---------------------------------------------------------------------------------------------
// The oracle: the MXFP8 block rule written directly with the scalar codec (qt_codec.h) and
// libm, sharing no code with the twin beyond the codec.

static uint8_t oracle_e(float amax, qt_elem elem) {
    float inv_qmax = elem == QT_ELEM_E5M2 ? QT_F32_INV_57344 : QT_F32_INV_448;
    return qt_f32_to_e8m0(amax * inv_qmax);
}

static uint8_t oracle_q(float x, uint8_t e, qt_elem elem) {
    float y = x * qt_e8m0_inv_f32(e);
    return elem == QT_ELEM_E5M2 ? qt_f32_to_e5m2(y) : qt_f32_to_e4m3(y);
}

static float oracle_amax(float amax, float x) {
    if (isnan(x)) return amax;
    return fabsf(x) > amax ? fabsf(x) : amax;
}

// Quantizes rows [0, rows) of the dense float matrix x (padding already zeroed) into o.
static void oracle_quantize(const float *x, uint32_t rows, uint32_t cols, qt_elem elem,
                            bool tile_2d, mx_mat *o) {
    uint32_t blocks = (cols + 31) / 32;
    for (uint32_t m0 = 0; m0 < rows; m0 += 32) {
        for (uint32_t k0 = 0; k0 < cols; k0 += 32) {
            uint32_t m1 = m0 + 32 < rows ? m0 + 32 : rows, k1 = k0 + 32 < cols ? k0 + 32 : cols;
            float tile = 0, row_amax[32] = {0}, col_amax[32] = {0};
            for (uint32_t r = m0; r < m1; r++) {
                for (uint32_t k = k0; k < k1; k++) {
                    float v = x[(uint64_t)r * cols + k];
                    row_amax[r - m0] = oracle_amax(row_amax[r - m0], v);
                    col_amax[k - k0] = oracle_amax(col_amax[k - k0], v);
                    tile = oracle_amax(tile, v);
                }
            }
            for (uint32_t r = m0; r < m1; r++) {
                uint8_t er = oracle_e(tile_2d ? tile : row_amax[r - m0], elem);
                o->rs[(uint64_t)r * blocks + k0 / 32] = er;
                for (uint32_t k = k0; k < k1; k++) {
                    uint8_t ec = oracle_e(tile_2d ? tile : col_amax[k - k0], elem);
                    o->cs[(uint64_t)(m0 / 32) * cols + k] = ec;
                    float v = x[(uint64_t)r * cols + k];
                    o->rc[(uint64_t)r * cols + k] = oracle_q(v, er, elem);
                    o->cc[(uint64_t)r * cols + k] = oracle_q(v, ec, elem);
                }
            }
        }
    }
}

// Compares the four outputs of a and b over their first `rows` rows (a and b share cols).
static void mx_compare_outputs(const char *what, const mx_mat *a, const mx_mat *b,
                               uint32_t rows) {
    char label[96];
    uint32_t cols = a->cols;
    snprintf(label, sizeof label, "%s row codes", what);
    mx_compare(label, a->rc, b->rc, op_mxfp8_codes_bytes(rows, cols), cols);
    snprintf(label, sizeof label, "%s row scales", what);
    mx_compare(label, a->rs, b->rs, op_mxfp8_row_scales_bytes(rows, cols), (cols + 31) / 32);
    snprintf(label, sizeof label, "%s col codes", what);
    mx_compare(label, a->cc, b->cc, op_mxfp8_codes_bytes(rows, cols), cols);
    snprintf(label, sizeof label, "%s col scales", what);
    mx_compare(label, a->cs, b->cs, op_mxfp8_col_scales_bytes(rows, cols), cols);
}

// ---------------------------------------------------------------------------------------------
// Inputs: random values over many binades plus planted edge values.

static const uint32_t mx_edge_bits[] = {
    0x7F800000u,  // +Inf: its blocks get e = 0xFE
    0xFF800000u,  // -Inf
    0x7FC00000u,  // NaN
    0xFFC10000u,  // -NaN with a payload
    0x80000000u,  // -0
    0x7F7F0000u,  // BF16_MAX
    0x7F7FFFFFu,  // FLT_MAX (BF16_MAX when truncated)
    0x43E00000u,  // 448
    0x43E08000u,  // 449
    0x47600000u,  // 57344
    0x00010000u,  // 2^-133, the smallest BF16 subnormal
    0x00000001u,  // 2^-149 (0 in BF16)
    0x00400000u,  // 2^-127
    0x3F880000u,  // 1.0625, an E4M3 tie at scale 1
    0xB9800000u,  // -2^-12
};

// Normal values times 2^s with s varying by row and 32-column block, so blocks see many scales.
static float mx_random_value(uint64_t seed, uint64_t i, uint32_t row, uint32_t col) {
    int shift = (int)((row * 5u + (col / 32u) * 3u) % 41u) - 20;
    return ldexpf(qt_fill_value(seed, i, QT_FILL_NORMAL, 0.0f, 1.0f), shift);
}

static void mx_fill_random(void *in, uint32_t dtype, uint32_t rows, uint32_t cols,
                           uint64_t seed) {
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t c = 0; c < cols; c++) {
            uint64_t i = (uint64_t)r * cols + c;
            mx_set(in, dtype, i, mx_random_value(seed, i, r, c));
        }
    }
}

// Edge values at scattered positions; an all-zero (with one -0) and an all-NaN rowwise block
// in rows 0 and 1, an all-zero and an all-NaN columnwise block in the last two columns.
static void mx_plant_edges(void *in, uint32_t dtype, uint32_t rows, uint32_t cols) {
    uint32_t n = sizeof mx_edge_bits / sizeof mx_edge_bits[0];
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = (i * 7u + 3u) % rows, c = (i * 13u + 40u) % cols;
        mx_set_bits(in, dtype, (uint64_t)r * cols + c, mx_edge_bits[i]);
    }
    for (uint32_t c = 0; c < cols && c < 32; c++) {
        mx_set_bits(in, dtype, c, c == 5 ? 0x80000000u : 0u);
        if (rows > 1) mx_set_bits(in, dtype, cols + c, c % 2 ? 0xFFC00000u : 0x7FC00000u);
    }
    if (cols >= 4) {
        for (uint32_t r = 32; r < rows && r < 64; r++) {
            mx_set_bits(in, dtype, (uint64_t)r * cols + cols - 1, 0u);
            mx_set_bits(in, dtype, (uint64_t)r * cols + cols - 2, 0x7FC00000u);
        }
    }
}

// Whether row r holds data, by a plain scan over the members (monotone offsets): the rule of
// quant.h, independent of the twin's binary search.
static bool mx_row_valid(const uint32_t *offsets, const uint32_t *first_dims, uint32_t count,
                         uint32_t r) {
    if (count == 0) return true;
    for (uint32_t i = 0; i < count; i++) {
        if (offsets[i] <= r && r < offsets[i + 1]) return r - offsets[i] < first_dims[i];
    }
    return false;
}

// The input as floats, with the rows that are not valid (padding) zeroed.
static float *mx_to_float(const mx_mat *m, const uint32_t *offsets, const uint32_t *first_dims,
                          uint32_t count) {
    float *x = malloc(((uint64_t)m->rows * m->cols + 1) * sizeof *x);
    for (uint32_t r = 0; r < m->rows; r++) {
        bool valid = mx_row_valid(offsets, first_dims, count, r);
        for (uint32_t c = 0; c < m->cols; c++) {
            uint64_t i = (uint64_t)r * m->cols + c;
            x[i] = valid ? mx_get(m->in, m->dtype, i) : 0.0f;
        }
    }
    return x;
}

// ---------------------------------------------------------------------------------------------
// CPU: hand-derived values.

static void test_scale_rule(void) {
    test_begin("mxfp8_scale_from_amax_hand_values");
    // e = clamp(ceil(log2(amax / qmax)), -127, 127) + 127 with amax * f32(1/qmax)
    // rounded once in FP32; f32(1/448) lies just above 1/448, so 448 * 2^k gives exactly 2^k.
    static const struct {
        float amax;
        uint8_t e4m3, e5m2;
    } cases[] = {
        {0.0f, 0x00, 0x00},          // zero block: e = 0
        {448.0f, 0x7F, 0x78},        // 448/448 = 2^0; 448/57344 = 2^-7
        {449.0f, 0x80, 0x79},        // just above: rounds up to 2^1; 2^-6
        {224.0f, 0x7E, 0x77},        // 2^-1; 2^-8
        {1.0f, 0x77, 0x70},          // 1/448 = 2^-8.8 -> 2^-8; 1/57344 = 2^-15.8 -> 2^-15
        {57344.0f, 0x86, 0x7F},      // 2^7; 2^0
        {0x1.FEp127f, 0xF7, 0xF0},   // BF16_MAX: 2^119.2 -> 2^120; 2^112.2 -> 2^113
        {0x1.Cp-118f, 0x01, 0x00},   // 448 * 2^-126 -> 2^-126; E5M2: 2^-133 -> 2^-127
        {0x1.Cp-119f, 0x00, 0x00},   // 448 * 2^-127 -> exactly 2^-127: not rounded up
        {0x1p-133f, 0x00, 0x00},     // the product lies below 2^-127
        {INFINITY, 0xFE, 0xFE},      // +Inf saturates to 2^127
        {NAN, 0xFF, 0xFF},           // never an amax (NaN is skipped), but defined
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t e4 = qt_mxfp8_scale_e8m0(cases[i].amax, QT_MXFP8_E4M3);
        uint8_t e5 = qt_mxfp8_scale_e8m0(cases[i].amax, QT_MXFP8_E5M2);
        CHECK(e4 == cases[i].e4m3, "amax %a: e4m3 scale 0x%02x, expected 0x%02x",
              cases[i].amax, e4, cases[i].e4m3);
        CHECK(e5 == cases[i].e5m2, "amax %a: e5m2 scale 0x%02x, expected 0x%02x",
              cases[i].amax, e5, cases[i].e5m2);
    }
    test_end();
}

// One 1 x 32 BF16 block whose amax is 448: E4M3 scale 2^0 (multiplier 1), E5M2 scale 2^-7
// (multiplier 128), so each code is satFP8 of the value (times 128).
static void test_hand_codes(void) {
    test_begin("mxfp8_rowwise_hand_codes_bf16");
    static const struct {
        uint32_t bits;
        uint8_t e4m3, e5m2;
    } cases[] = {
        {0x43E00000u, 0x7E, 0x7B},  // 448: E4M3 max; x128 = 57344, E5M2 max
        {0xC3E00000u, 0xFE, 0xFB},  // -448
        {0x3F800000u, 0x38, 0x58},  // 1.0; 128 = 2^7
        {0x00000000u, 0x00, 0x00},  // +0
        {0x80000000u, 0x80, 0x80},  // -0 keeps its sign
        {0x3F000000u, 0x30, 0x54},  // 0.5
        {0x3F880000u, 0x38, 0x58},  // 1.0625: E4M3 tie between 1 and 1.125 -> even (1.0)
        {0x3F980000u, 0x3A, 0x59},  // 1.1875: E4M3 tie -> even 1.25; E5M2 nearest 1.25
        {0x3B000000u, 0x01, 0x34},  // 2^-9: E4M3 min subnormal; 2^-2
        {0x3A800000u, 0x00, 0x30},  // 2^-10: exactly half the min subnormal -> 0
        {0x3B400000u, 0x02, 0x36},  // 1.5 * 2^-9: tie between 1 and 2 steps -> 2
        {0x3BA00000u, 0x02, 0x39},  // 2.5 * 2^-9: tie between 2 and 3 steps -> 2
        {0xB9800000u, 0x80, 0xA8},  // -2^-12 -> -0; E5M2 -2^-5
        {0x7FC00000u, 0x7F, 0x7F},  // NaN -> 0x7F
        {0xFFC00000u, 0x7F, 0x7F},  // -NaN -> 0x7F (sign dropped)
        {0x43700000u, 0x77, 0x78},  // 240; x128 = 1.875 * 2^14: E5M2 tie -> even 2^15
        {0x40400000u, 0x44, 0x5E},  // 3.0
    };
    uint32_t n = sizeof cases / sizeof cases[0];
    for (int e5 = 0; e5 < 2; e5++) {
        mx_mat m = mx_mat_new(1, 32, QT_DTYPE_BF16);
        for (uint32_t i = 0; i < n; i++) mx_set_bits(m.in, m.dtype, i, cases[i].bits);
        mx_twin(&m, e5 ? QT_ELEM_E5M2 : QT_ELEM_E4M3, false, NULL, NULL, 0);
        CHECK(m.rs[0] == (e5 ? 0x78 : 0x7F), "scale 0x%02x (e5m2 %d)", m.rs[0], e5);
        for (uint32_t i = 0; i < 32; i++) {
            uint8_t want = i < n ? (e5 ? cases[i].e5m2 : cases[i].e4m3) : 0x00;
            CHECK(m.rc[i] == want, "element %u (bits %08x, e5m2 %d): code 0x%02x, expected "
                  "0x%02x", i, i < n ? cases[i].bits : 0u, e5, m.rc[i], want);
        }
        mx_mat_free(&m);
    }
    test_end();
}

// FP32 block holding +-Inf: amax = +Inf, e = 0xFE, multiplier 2^-127: Inf -> +-max,
// |x| <= 2^117 -> +-0, 2^118 -> the min subnormal, NaN -> 0x7F.
static void test_inf_block(void) {
    test_begin("mxfp8_inf_block_f32");
    static const struct {
        uint32_t bits;
        uint8_t code;
    } cases[] = {
        {0x7F800000u, 0x7E}, {0xFF800000u, 0xFE}, {0x7A800000u, 0x01}, {0x7A000000u, 0x00},
        {0xFA800000u, 0x81}, {0x3F800000u, 0x00}, {0xBF800000u, 0x80}, {0x7FC00000u, 0x7F},
    };
    uint32_t n = sizeof cases / sizeof cases[0];
    mx_mat m = mx_mat_new(1, 40, QT_DTYPE_F32);  // a second, partial block of 8 stays finite
    for (uint32_t i = 0; i < n; i++) mx_set_bits(m.in, m.dtype, i, cases[i].bits);
    mx_set_bits(m.in, m.dtype, 39, 0x43E00000u);  // 448 alone in block 1: scale 2^0
    mx_twin(&m, QT_ELEM_E4M3, false, NULL, NULL, 0);
    CHECK(m.rs[0] == 0xFE, "Inf block scale 0x%02x, expected 0xfe", m.rs[0]);
    CHECK(m.rs[1] == 0x7F, "partial block scale 0x%02x, expected 0x7f", m.rs[1]);
    for (uint32_t i = 0; i < 32; i++) {
        uint8_t want = i < n ? cases[i].code : 0x00;
        CHECK(m.rc[i] == want, "element %u: code 0x%02x, expected 0x%02x", i, m.rc[i], want);
    }
    CHECK(m.rc[39] == 0x7E, "448 in the partial block: 0x%02x", m.rc[39]);
    mx_mat_free(&m);
    test_end();
}

// Zero, NaN and tiny blocks: amax 0 -> e 0, codes +-0; all-NaN -> e 0, codes 0x7F; a block
// whose amax is at most 448 * 2^-127 gets e 0 and the multiplier 2^127.
static void test_special_blocks(void) {
    test_begin("mxfp8_zero_nan_tiny_blocks_f32");
    mx_mat m = mx_mat_new(3, 64, QT_DTYPE_F32);
    mx_set_bits(m.in, m.dtype, 3, 0x80000000u);  // row 0 block 0: zeros and one -0
    for (uint32_t c = 32; c < 64; c++) {         // row 0 block 1: NaNs of both signs
        mx_set_bits(m.in, m.dtype, c, c % 3 ? 0x7FC00000u : 0xFFFFFFFFu);
    }
    mx_set_bits(m.in, m.dtype, 64 + 7, 0x03800000u);   // 2^-120 -> x 2^127 = 128 = 0x70
    mx_set_bits(m.in, m.dtype, 96 + 9, 0x04600000u);   // 448 * 2^-127 -> 448 = 0x7E
    mx_set_bits(m.in, m.dtype, 128 + 1, 0x00000001u);  // 2^-149 -> 2^-22 -> 0
    mx_set_bits(m.in, m.dtype, 160 + 2, 0x80000001u);  // -2^-149 -> -0
    mx_twin(&m, QT_ELEM_E4M3, false, NULL, NULL, 0);
    for (uint32_t b = 0; b < 6; b++) CHECK(m.rs[b] == 0x00, "block %u scale 0x%02x", b, m.rs[b]);
    for (uint32_t c = 0; c < 64; c++) {
        uint8_t want0 = c < 32 ? (c == 3 ? 0x80 : 0x00) : 0x7F;
        uint8_t want1 = c == 7 ? 0x70 : (c == 41 ? 0x7E : 0x00);
        uint8_t want2 = c == 34 ? 0x80 : 0x00;
        CHECK(m.rc[c] == want0, "row 0 col %u: 0x%02x, expected 0x%02x", c, m.rc[c], want0);
        CHECK(m.rc[64 + c] == want1, "row 1 col %u: 0x%02x, expected 0x%02x", c, m.rc[64 + c],
              want1);
        CHECK(m.rc[128 + c] == want2, "row 2 col %u: 0x%02x, expected 0x%02x", c,
              m.rc[128 + c], want2);
    }
    mx_mat_free(&m);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// CPU: the twin against the oracle and against itself.

static const struct {
    uint32_t rows, cols;
} mx_odd_shapes[] = {
    {1, 1}, {1, 31}, {1, 70}, {70, 1}, {31, 33}, {37, 45}, {64, 64}, {97, 131}, {33, 600},
};

static void mx_random_input(mx_mat *m, uint64_t seed) {
    mx_fill_random(m->in, m->dtype, m->rows, m->cols, seed);
    mx_plant_edges(m->in, m->dtype, m->rows, m->cols);
}

// Dense shapes that are not multiples of 32 (partial blocks use only in-range elements), both
// dtypes, both element types, 1-D and 2-D.
static void test_twin_matches_oracle(void) {
    test_begin("mxfp8_twin_matches_oracle_odd_shapes");
    size_t n = sizeof mx_odd_shapes / sizeof mx_odd_shapes[0];
    for (size_t s = 0; s < n; s++) {
        for (int variant = 0; variant < 8; variant++) {
            uint32_t dtype = variant & 1 ? QT_DTYPE_F32 : QT_DTYPE_BF16;
            qt_elem elem = variant & 2 ? QT_ELEM_E5M2 : QT_ELEM_E4M3;
            bool tile_2d = (variant & 4) != 0;
            mx_mat m = mx_mat_new(mx_odd_shapes[s].rows, mx_odd_shapes[s].cols, dtype);
            mx_mat o = mx_mat_new(m.rows, m.cols, dtype);
            mx_random_input(&m, 100 + s);
            mx_twin(&m, elem, tile_2d, NULL, NULL, 0);
            float *x = mx_to_float(&m, NULL, NULL, 0);
            oracle_quantize(x, m.rows, m.cols, elem, tile_2d, &o);
            char what[64];
            snprintf(what, sizeof what, "%ux%u variant %d", m.rows, m.cols, variant);
            mx_compare_outputs(what, &m, &o, m.rows);
            free(x);
            mx_mat_free(&m);
            mx_mat_free(&o);
        }
    }
    test_end();
}

// Columnwise outputs of X are the rowwise outputs of X^T, transposed back.
static void test_colwise_is_transposed_rowwise(void) {
    test_begin("mxfp8_colwise_equals_rowwise_of_transpose");
    size_t n = sizeof mx_odd_shapes / sizeof mx_odd_shapes[0];
    for (size_t s = 0; s < n; s++) {
        uint32_t rows = mx_odd_shapes[s].rows, cols = mx_odd_shapes[s].cols;
        uint32_t dtype = s % 2 ? QT_DTYPE_F32 : QT_DTYPE_BF16;
        qt_elem elem = s % 3 ? QT_ELEM_E4M3 : QT_ELEM_E5M2;
        mx_mat x = mx_mat_new(rows, cols, dtype), t = mx_mat_new(cols, rows, dtype);
        mx_random_input(&x, 200 + s);
        uint64_t bytes = mx_elem_bytes(dtype);
        for (uint32_t r = 0; r < rows; r++) {
            for (uint32_t c = 0; c < cols; c++) {
                memcpy((uint8_t *)t.in + ((uint64_t)c * rows + r) * bytes,
                       (uint8_t *)x.in + ((uint64_t)r * cols + c) * bytes, bytes);
            }
        }
        mx_twin(&x, elem, false, NULL, NULL, 0);
        mx_twin(&t, elem, false, NULL, NULL, 0);
        uint32_t t_blocks = (rows + 31) / 32, bad = 0;
        for (uint32_t r = 0; r < rows; r++) {
            for (uint32_t c = 0; c < cols; c++) {
                uint8_t code = x.cc[(uint64_t)r * cols + c];
                uint8_t code_t = t.rc[(uint64_t)c * rows + r];
                uint8_t e = x.cs[(uint64_t)(r / 32) * cols + c];
                uint8_t e_t = t.rs[(uint64_t)c * t_blocks + r / 32];
                if ((code != code_t || e != e_t) && bad++ < 4) {
                    CHECK(false, "%ux%u (%u, %u): code 0x%02x vs 0x%02x, scale 0x%02x vs 0x%02x",
                          rows, cols, r, c, code, code_t, e, e_t);
                }
            }
        }
        CHECK(bad == 0, "%ux%u: %u mismatches", rows, cols, bad);
        mx_mat_free(&x);
        mx_mat_free(&t);
    }
    test_end();
}

// 2-D: one scale per 32 x 32 tile, the tile's amax; both directions get the same codes, and
// the scale is repeated along the tile's rows (rowwise layout) and columns (columnwise layout).
static void test_2d_tiles(void) {
    test_begin("mxfp8_2d_tile_scale_shared");
    mx_mat m = mx_mat_new(40, 70, QT_DTYPE_BF16);
    for (uint64_t i = 0; i < 40 * 70; i++) mx_set(m.in, m.dtype, i, 0.5f);
    // Every other tile: amax 0.5, 0.5/448 = 2^-9.8 -> e = 118 (0x76).
    mx_set(m.in, m.dtype, 5 * 70 + 9, -896.0f);   // tile (0, 0): amax 896 -> e = 128
    mx_set(m.in, m.dtype, 35 * 70 + 69, 1.0f);    // tile (1, 2), partial: amax 1 -> e = 119
    mx_twin(&m, QT_ELEM_E4M3, true, NULL, NULL, 0);
    CHECK(memcmp(m.rc, m.cc, 40 * 70) == 0, "rowwise and columnwise codes differ");
    for (uint32_t r = 0; r < 40; r++) {
        for (uint32_t b = 0; b < 3; b++) {
            uint8_t want = r < 32 ? (b == 0 ? 0x80 : 0x76) : (b == 2 ? 0x77 : 0x76);
            CHECK(m.rs[r * 3 + b] == want, "row %u block %u: 0x%02x, expected 0x%02x", r, b,
                  m.rs[r * 3 + b], want);
        }
    }
    for (uint32_t c = 0; c < 70; c++) {
        uint8_t want0 = c < 32 ? 0x80 : 0x76, want1 = c < 64 ? 0x76 : 0x77;
        CHECK(m.cs[c] == want0 && m.cs[70 + c] == want1, "column %u scales 0x%02x 0x%02x", c,
              m.cs[c], m.cs[70 + c]);
    }
    // 0.5 at scale 2^1 (e = 128) is 0.25 -> 0x28; -896 / 2 = -448 -> 0xFE.
    CHECK(m.rc[0] == 0x28 && m.rc[5 * 70 + 9] == 0xFE, "tile (0,0) codes 0x%02x 0x%02x",
          m.rc[0], m.rc[5 * 70 + 9]);
    mx_mat_free(&m);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// CPU: grouped tensors.

// Members of uneven padded sizes (multiples of `unit` rows, 32 = the mxfp8 row_align unless
// given; every 7th member empty, member 0 never), valid rows first_dims <= padded (some 0,
// every 5th full). Returns the padded total, row_offsets[count].
static uint32_t mx_make_group(uint32_t count, uint32_t max_blocks, uint32_t unit, uint64_t seed,
                              uint32_t *offsets, uint32_t *first_dims) {
    if (unit == 0) unit = 32;
    offsets[0] = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t h = qt_mix64(seed * 1000003u + i);
        uint32_t blocks = i % 7 == 3 ? 0 : (uint32_t)(h % (max_blocks + 1));
        if (i == 0 && blocks == 0) blocks = 1;
        uint32_t padded = unit * blocks;
        uint32_t valid = padded ? (uint32_t)((h >> 32) % (padded + 1)) : 0;
        if (i % 5 == 0) valid = padded;
        offsets[i + 1] = offsets[i] + padded;
        first_dims[i] = valid;
    }
    return offsets[count];
}

typedef struct mx_group_case {
    uint32_t count, cols, dtype;
    qt_elem elem;
    bool tile_2d;
    int32_t slack;  // rows_capacity - row_offsets[count]; negative caps the group's end
    uint32_t max_blocks;
    uint32_t unit;  // member size unit; 0 = 32 (other values break row_align on purpose)
} mx_group_case;

static void mx_expect_untouched(const char *what, const uint8_t *p, uint64_t from, uint64_t to) {
    uint64_t bad = 0;
    for (uint64_t i = from; i < to; i++) bad += p[i] != MX_SENTINEL;
    CHECK(bad == 0, "%s: %llu bytes past the group's end were written", what,
          (unsigned long long)bad);
}

// Grouped = the dense cast of the first `end` padded rows with padding rows zeroed (the oracle);
// nothing at or beyond `end` is written.
static void mx_check_grouped(const mx_group_case *g, uint64_t seed) {
    uint32_t *offsets = malloc((g->count + 1) * sizeof *offsets);
    uint32_t *first_dims = malloc(g->count * sizeof *first_dims);
    uint32_t total = mx_make_group(g->count, g->max_blocks, g->unit, seed, offsets, first_dims);
    uint32_t rows = (uint32_t)((int64_t)total + g->slack);
    uint32_t end = rows < total ? rows : total;
    mx_mat m = mx_mat_new(rows, g->cols, g->dtype);
    mx_random_input(&m, seed);  // padding rows hold random values that must be ignored
    mx_twin(&m, g->elem, g->tile_2d, offsets, first_dims, g->count);
    float *x = mx_to_float(&m, offsets, first_dims, g->count);
    mx_mat o = mx_mat_new(end, g->cols, g->dtype);
    oracle_quantize(x, end, g->cols, g->elem, g->tile_2d, &o);
    char what[64];
    snprintf(what, sizeof what, "%u members, %ux%u", g->count, rows, g->cols);
    mx_compare_outputs(what, &m, &o, end);
    uint32_t blocks = (g->cols + 31) / 32;
    mx_expect_untouched(what, m.rc, (uint64_t)end * g->cols, (uint64_t)rows * g->cols);
    mx_expect_untouched(what, m.cc, (uint64_t)end * g->cols, (uint64_t)rows * g->cols);
    mx_expect_untouched(what, m.rs, (uint64_t)end * blocks, (uint64_t)rows * blocks);
    mx_expect_untouched(what, m.cs, (uint64_t)((end + 31) / 32) * g->cols,
                        op_mxfp8_col_scales_bytes(rows, g->cols));
    free(x);
    free(offsets);
    free(first_dims);
    mx_mat_free(&m);
    mx_mat_free(&o);
}

static void test_grouped_twin(void) {
    test_begin("mxfp8_grouped_twin_matches_dense_oracle");
    static const mx_group_case cases[] = {
        {1, 96, QT_DTYPE_BF16, QT_ELEM_E4M3, false, 45, 5, 0},
        {3, 520, QT_DTYPE_F32, QT_ELEM_E5M2, false, 7, 4, 0},
        {64, 64, QT_DTYPE_BF16, QT_ELEM_E4M3, false, 32, 3, 0},
        {65, 33, QT_DTYPE_F32, QT_ELEM_E4M3, true, 0, 3, 0},
        {1000, 40, QT_DTYPE_BF16, QT_ELEM_E4M3, false, 100, 2, 0},
        {1000, 17, QT_DTYPE_BF16, QT_ELEM_E5M2, true, 1, 2, 0},
        {9, 70, QT_DTYPE_BF16, QT_ELEM_E4M3, false, -45, 4, 0},  // capacity below the offsets
        // Members in units of 8 rows: tiles and columnwise blocks straddle members. Outside the
        // row_align contract, but the result is still the dense rule over the padded rows.
        {40, 48, QT_DTYPE_F32, QT_ELEM_E4M3, false, 5, 9, 8},
        {40, 48, QT_DTYPE_BF16, QT_ELEM_E5M2, true, 5, 9, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mx_check_grouped(&cases[i], 300 + i);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// CPU: dequantize.

static void test_dequant_hand(void) {
    test_begin("mxfp8_dequantize_hand_values");
    // x = fp8 * 2^(e - 127); NaN codes of either sign and e = 0xFF give the canonical NaN.
    static const uint8_t codes[8] = {0x38, 0x7E, 0xFE, 0x7F, 0xFF, 0x01, 0x00, 0x80};
    static const uint8_t scales[4] = {127, 0, 254, 255};
    static const uint32_t want[4][8] = {
        {0x3F800000u, 0x43E00000u, 0xC3E00000u, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x3B000000u, 0u,
         0x80000000u},
        // 2^-127 (FP32 subnormal), 448 * 2^-127, and 2^-9 * 2^-127 = 2^-136 = 0x2000 ulps.
        {0x00400000u, 0x04600000u, 0x84600000u, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x00002000u, 0u,
         0x80000000u},
        // 2^127; 448 * 2^127 overflows to Inf; 2^-9 * 2^127 = 2^118.
        {0x7F000000u, 0x7F800000u, 0xFF800000u, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7A800000u, 0u,
         0x80000000u},
        {0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu,
         0x7FFFFFFFu, 0x7FFFFFFFu},
    };
    uint8_t c[4 * 32] = {0};
    for (int r = 0; r < 4; r++) memcpy(c + 32 * r, codes, sizeof codes);
    float out[4 * 32];
    mx_twin_dequantize(c, scales, false, QT_ELEM_E4M3, 4, 32, out, QT_DTYPE_F32);
    for (int r = 0; r < 4; r++) {
        for (int j = 0; j < 8; j++) {
            uint32_t got = qt_f32_bits(out[32 * r + j]);
            CHECK(got == want[r][j], "e %u code 0x%02x: %08x, expected %08x", scales[r],
                  codes[j], got, want[r][j]);
        }
    }
    uint16_t bf[4 * 32];
    static const uint16_t want_bf[8] = {0x3F80, 0x43E0, 0xC3E0, 0x7FFF, 0x7FFF, 0x3B00, 0, 0x8000};
    mx_twin_dequantize(c, scales, false, QT_ELEM_E4M3, 4, 32, bf, QT_DTYPE_BF16);
    for (int j = 0; j < 8; j++) {
        CHECK(bf[j] == want_bf[j], "bf16 code 0x%02x: %04x, expected %04x", codes[j], bf[j],
              want_bf[j]);
    }
    // E5M2 at scale 2^0: 1.0, +-Inf, NaN, 57344.
    static const uint8_t c5[5] = {0x3C, 0x7C, 0xFC, 0x7D, 0x7B};
    static const uint32_t want5[5] = {0x3F800000u, 0x7F800000u, 0xFF800000u, 0x7FFFFFFFu,
                                      0x47600000u};
    uint8_t s127 = 127;
    mx_twin_dequantize(c5, &s127, false, QT_ELEM_E5M2, 1, 5, out, QT_DTYPE_F32);
    for (int j = 0; j < 5; j++) {
        CHECK(qt_f32_bits(out[j]) == want5[j], "e5m2 code 0x%02x: %08x", c5[j],
              qt_f32_bits(out[j]));
    }
    test_end();
}

// Columnwise scales are indexed (m / 32, k): 33 x 2 ones (0x38) with scales [[127, 126],
// [0, 254]] give 1 and 0.5 in rows 0..31, 2^-127 and 2^127 in row 32.
static void test_dequant_colwise_layout(void) {
    test_begin("mxfp8_dequantize_colwise_layout");
    uint8_t codes[33 * 2];
    memset(codes, 0x38, sizeof codes);
    static const uint8_t scales[4] = {127, 126, 0, 254};
    float out[33 * 2];
    mx_twin_dequantize(codes, scales, true, QT_ELEM_E4M3, 33, 2, out, QT_DTYPE_F32);
    for (int r = 0; r < 33; r++) {
        float w0 = r < 32 ? 1.0f : 0x1p-127f, w1 = r < 32 ? 0.5f : 0x1p127f;
        CHECK(out[2 * r] == w0 && out[2 * r + 1] == w1, "row %d: %a %a", r, out[2 * r],
              out[2 * r + 1]);
    }
    test_end();
}

// |dequantize(quantize(x)) - x| <= max(2^-(m+1) |x|, h * s) + 2^-149, where s = 2^(e - 127) is
// the element's block scale, m the mantissa bits (3 E4M3, 2 E5M2) and h half the smallest
// subnormal (2^-10 E4M3, 2^-17 E5M2). Why: y = x * 2^(127 - e) is exact (an FP32 underflow only
// happens for |y| < 2^-126, far below h, and then y rounds to 0 with error < h); since
// e >= log2(amax / qmax) up to one FP32 rounding of the product, |y| <= qmax (1 + 2^-23), so y
// rounds to the nearest FP8 value with error at most half an ulp, 2^-(m+1) of its binade
// (normal range) or h (subnormal range), or saturates by at most qmax * 2^-23; multiplying by s
// is exact except for an FP32 underflow, which adds at most 2^-150.
static void mx_check_roundtrip(uint32_t rows, uint32_t cols, uint32_t dtype, qt_elem elem,
                               uint64_t seed) {
    mx_mat m = mx_mat_new(rows, cols, dtype);
    mx_fill_random(m.in, dtype, rows, cols, seed);  // finite values only
    mx_twin(&m, elem, false, NULL, NULL, 0);
    float *dr = malloc((uint64_t)rows * cols * sizeof *dr);
    float *dc = malloc((uint64_t)rows * cols * sizeof *dc);
    mx_twin_dequantize(m.rc, m.rs, false, elem, rows, cols, dr, QT_DTYPE_F32);
    mx_twin_dequantize(m.cc, m.cs, true, elem, rows, cols, dc, QT_DTYPE_F32);
    double rel = elem == QT_ELEM_E5M2 ? 0x1p-3 : 0x1p-4;
    double half_sub = elem == QT_ELEM_E5M2 ? 0x1p-17 : 0x1p-10;
    uint32_t blocks = (cols + 31) / 32, bad = 0;
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t c = 0; c < cols; c++) {
            uint64_t i = (uint64_t)r * cols + c;
            double x = mx_get(m.in, dtype, i);
            for (int dir = 0; dir < 2; dir++) {
                uint8_t e = dir ? m.cs[(uint64_t)(r / 32) * cols + c]
                                : m.rs[(uint64_t)r * blocks + c / 32];
                double s = ldexp(1.0, (int)e - 127);
                double got = dir ? dc[i] : dr[i];
                double bound = fmax(rel * fabs(x), half_sub * s) + 0x1p-149;
                if (!(fabs(got - x) <= bound) && bad++ < 4) {
                    CHECK(false, "%s (%u, %u): x %a, got %a, scale 2^%d, bound %a",
                          dir ? "colwise" : "rowwise", r, c, x, got, (int)e - 127, bound);
                }
            }
        }
    }
    CHECK(bad == 0, "%ux%u: %u elements outside the bound", rows, cols, bad);
    free(dr);
    free(dc);
    mx_mat_free(&m);
}

static void test_roundtrip_bound(void) {
    test_begin("mxfp8_dequantize_quantize_error_bound");
    for (int v = 0; v < 4; v++) {
        uint32_t dtype = v & 1 ? QT_DTYPE_F32 : QT_DTYPE_BF16;
        qt_elem elem = v & 2 ? QT_ELEM_E5M2 : QT_ELEM_E4M3;
        mx_check_roundtrip(100, 300, dtype, elem, 400 + v);
        mx_check_roundtrip(37, 45, dtype, elem, 500 + v);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Programs: the op builders on a rig. The same case runs on the reference backend and, when
// there is one, on the GPU; every output region is compared byte for byte.

typedef struct mx_case {
    const char *name;
    uint32_t rows, cols;  // dense rows (grouped: padded total + slack)
    uint32_t dtype;
    qt_elem elem;
    bool tile_2d, rowwise, colwise;
    uint32_t members, slack, max_blocks;  // grouped when members > 0
    uint32_t out_dtype;                   // dequantized outputs
    bool patterns;                        // conversion patterns instead of random data
    uint32_t row_unit;                    // member size unit; 0 = 32, the mxfp8 row_align
} mx_case;

typedef struct mx_data {  // host inputs, the same bytes for both backends
    uint32_t rows, cols, dtype;
    void *in;
    uint32_t *offsets, *first_dims;
    uint32_t count;
} mx_data;

typedef struct mx_regions {
    arena_handle in, rc, rs, cc, cs, offsets, first_dims, dr, dc, rv, cv;
} mx_regions;

// The outputs: codes and scales of both directions, their dequantized copies, and (cases with
// BF16 copies) a second quantize's values (QT_MXFP8_FLAG_*_VALUES) of both directions.
#define MX_OUTPUTS 8
#define MX_OUT_ROW_VALUES 6

typedef struct mx_result {
    uint8_t *bytes[MX_OUTPUTS];  // rc, rs, cc, cs, dr, dc, rv, cv
} mx_result;

static const char *const mx_output_names[MX_OUTPUTS] = {
    "row codes",       "row scales",      "col codes",  "col scales",
    "rowwise dequant", "colwise dequant", "row values", "col values"};

static rig mx_ref_rig, mx_gpu_rig;
static program mx_fill_prog;

static void mx_output_sizes(const mx_data *d, const mx_case *c, uint64_t sizes[MX_OUTPUTS]) {
    uint64_t out = (uint64_t)d->rows * d->cols * mx_elem_bytes(c->out_dtype);
    sizes[0] = sizes[2] = op_mxfp8_codes_bytes(d->rows, d->cols);
    sizes[1] = op_mxfp8_row_scales_bytes(d->rows, d->cols);
    sizes[3] = op_mxfp8_col_scales_bytes(d->rows, d->cols);
    sizes[4] = sizes[5] = out;
    sizes[6] = sizes[7] = 2 * op_mxfp8_codes_bytes(d->rows, d->cols);  // BF16
}

static arena_handle mx_output_region(const mx_regions *g, int i) {
    const arena_handle h[MX_OUTPUTS] = {g->rc, g->rs, g->cc, g->cs, g->dr, g->dc, g->rv, g->cv};
    return h[i];
}

// Regions, the quantize op and one dequantize op per produced direction, then bind.
static void mx_rig_build(rig *r, const mx_case *c, const mx_data *d, mx_regions *g) {
    uint64_t sizes[MX_OUTPUTS];
    mx_output_sizes(d, c, sizes);
    g->in = rig_reserve(r, "in", (uint64_t)d->rows * d->cols * mx_elem_bytes(d->dtype));
    g->rc = rig_reserve(r, "row_codes", sizes[0]);
    g->rs = rig_reserve(r, "row_scales", sizes[1]);
    g->cc = rig_reserve(r, "col_codes", sizes[2]);
    g->cs = rig_reserve(r, "col_scales", sizes[3]);
    g->dr = rig_reserve(r, "row_dequant", sizes[4]);
    g->dc = rig_reserve(r, "col_dequant", sizes[5]);
    g->rv = rig_reserve(r, "row_values", sizes[6]);
    g->cv = rig_reserve(r, "col_values", sizes[7]);
    g->offsets = rig_reserve(r, "row_offsets", (d->count + 1) * 4);
    g->first_dims = rig_reserve(r, "first_dims", d->count * 4 + 4);
    op_group group = {d->count, rig_ref(r, g->offsets, 0), rig_ref(r, g->first_dims, 0)};
    op_mxfp8_quantize_desc q = {0};
    q.in = rig_ref(r, g->in, 0);
    q.dtype = d->dtype;
    q.rows = d->rows;
    q.cols = d->cols;
    q.elem = c->elem;
    q.tile_2d = c->tile_2d;
    if (c->rowwise) q.rowwise = (op_mxfp8_dir){rig_ref(r, g->rc, 0), rig_ref(r, g->rs, 0)};
    if (c->colwise) q.colwise = (op_mxfp8_dir){rig_ref(r, g->cc, 0), rig_ref(r, g->cs, 0)};
    q.group = group;
    RIG_OK(op_mxfp8_quantize(&r->prog, "quantize", &q));
    for (int dir = 0; dir < 2; dir++) {
        if (!(dir ? c->colwise : c->rowwise)) continue;
        op_mxfp8_dequantize_desc dq = {0};
        dq.src = dir ? q.colwise : q.rowwise;
        dq.colwise = dir == 1;
        dq.elem = c->elem;
        dq.rows = d->rows;
        dq.cols = d->cols;
        dq.out = rig_ref(r, dir ? g->dc : g->dr, 0);
        dq.dtype = c->out_dtype;
        dq.group = group;
        RIG_OK(op_mxfp8_dequantize(&r->prog, dir ? "dequantize_col" : "dequantize_row", &dq));
    }
    if (c->out_dtype == QT_DTYPE_BF16) {  // the same copies straight from the input
        op_mxfp8_quantize_desc v = q;
        v.rowwise = v.colwise = (op_mxfp8_dir){OP_REF_NONE, OP_REF_NONE};
        if (c->rowwise) v.rowwise.codes = rig_ref(r, g->rv, 0);
        if (c->colwise) v.colwise.codes = rig_ref(r, g->cv, 0);
        v.row_values = c->rowwise;
        v.col_values = c->colwise;
        RIG_OK(op_mxfp8_quantize(&r->prog, "quantize_values", &v));
    }
    rig_bind(r);
}

// Inputs, group arrays and sentinel-filled outputs into the rig.
static void mx_rig_load(rig *r, const mx_case *c, const mx_data *d, const mx_regions *g) {
    RIG_OK(backend_write(&r->be, rig_ref(r, g->in, 0), d->in,
                         (uint64_t)d->rows * d->cols * mx_elem_bytes(d->dtype)));
    if (d->count) {
        RIG_OK(backend_write(&r->be, rig_ref(r, g->offsets, 0), d->offsets,
                             (d->count + 1) * 4));
        RIG_OK(backend_write(&r->be, rig_ref(r, g->first_dims, 0), d->first_dims,
                             d->count * 4));
    }
    uint64_t sizes[MX_OUTPUTS];
    mx_output_sizes(d, c, sizes);
    for (int i = 0; i < MX_OUTPUTS; i++) {
        if (sizes[i] == 0) continue;
        uint8_t *s = mx_sentinel_alloc(sizes[i]);
        RIG_OK(backend_write(&r->be, rig_ref(r, mx_output_region(g, i), 0), s, sizes[i]));
        free(s);
    }
}

static void mx_rig_run(rig *r, const mx_case *c, const mx_data *d, const mx_regions *g,
                       mx_result *res) {
    RIG_OK(backend_run(&r->be, &r->prog));
    RIG_OK(backend_finish(&r->be));
    uint64_t sizes[MX_OUTPUTS];
    mx_output_sizes(d, c, sizes);
    for (int i = 0; i < MX_OUTPUTS; i++) {
        res->bytes[i] = malloc(sizes[i] ? sizes[i] : 1);
        if (sizes[i]) {
            RIG_OK(backend_read(&r->be, res->bytes[i], rig_ref(r, mx_output_region(g, i), 0),
                                sizes[i]));
        }
    }
}

static void mx_result_free(mx_result *res) {
    for (int i = 0; i < MX_OUTPUTS; i++) free(res->bytes[i]);
}

// ---------------------------------------------------------------------------------------------
// Case inputs.

// Conversion patterns, magnitudes y <= 448 with a sign: every BF16 value, FP32 values at and
// around the rounding tie of every mantissa bit position in every binade, random FP32 values,
// and NaNs with payloads. Scaled so that the block's multiplier brings them back to y, they
// exercise the hardware cvt.rn.satfinite against the codec over the whole E4M3 (and, x128,
// E5M2) range, subnormals and ties included.
#define MX_PATTERNS_BF16 (2u * 17377u)   // magnitudes 0x0000 .. 0x43E0, both signs
#define MX_PATTERNS_TIES (136u * 23u * 3u)  // exponent fields 0..135, tie bit, tie -1/0/+1
#define MX_PATTERNS_RANDOM 20000u
#define MX_PATTERNS (MX_PATTERNS_BF16 + MX_PATTERNS_TIES + MX_PATTERNS_RANDOM)

static uint32_t mx_pattern_bits(uint32_t p) {
    if (p < MX_PATTERNS_BF16) return ((p & 1u) << 31) | ((p / 2u) << 16);
    p -= MX_PATTERNS_BF16;
    uint32_t h = (uint32_t)qt_mix64(p + 0x5EEDull);
    uint32_t bits;
    if (p < MX_PATTERNS_TIES) {
        uint32_t exp = p / (23u * 3u), q = (p / 3u) % 23u, v = p % 3u;
        uint32_t mant = (((h << 1) << q) | (1u << q)) & 0x7FFFFFu;  // bit q set, below it 0
        mant = (mant + v - 1u) & 0x7FFFFFu;
        bits = (h & 0x80000000u) | (exp << 23) | mant;
    } else if (p % 997u == 5u) {
        bits = (h & 0x80000000u) | 0x7FC00000u | (h & 0x3FFFFFu);  // quiet NaN, payload
    } else {
        bits = (h & 0x80000000u) | (((h >> 8) % 136u) << 23) | (h & 0x7FFFFFu);
    }
    if ((bits & QT_F32_ABS) > 0x43E00000u && (bits & QT_F32_ABS) <= QT_F32_INF) {
        bits = (bits & QT_F32_SIGN) | 0x43E00000u;
    }
    return bits;
}

static uint32_t mx_pattern_rows(void) { return (MX_PATTERNS + 61u) / 62u; }

// Rows of 64: columns 0 and 32 hold the anchor 448 * 2^k (block scale 2^k, multiplier 2^-k),
// the other 62 slots patterns times 2^k. k = 0 but on every 8th row, where it spans -30..29.
static void mx_patterns(mx_data *d) {
    QT_ASSERT(d->cols == 64);
    uint32_t p = 0;
    for (uint32_t r = 0; r < d->rows; r++) {
        int k = r % 8 == 7 ? (int)((r / 8) % 60) - 30 : 0;
        for (uint32_t c = 0; c < 64; c++) {
            uint64_t i = (uint64_t)r * 64 + c;
            uint32_t bits = 0x43E00000u;
            if (c % 32 != 0) bits = p < MX_PATTERNS ? mx_pattern_bits(p++) : 0u;
            float v = ldexpf(qt_bits_f32(bits), k);
            if (isnan(v)) v = qt_bits_f32(bits);  // keep the payload
            if (d->dtype == QT_DTYPE_BF16) {
                mx_set_bits(d->in, d->dtype, i, qt_f32_bits(v));  // truncation: exact anchor
            } else {
                mx_set(d->in, d->dtype, i, v);
            }
        }
    }
}

static void mx_data_init(const mx_case *c, mx_data *d, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->rows = c->rows;
    d->cols = c->cols;
    d->dtype = c->dtype;
    d->count = c->members;
    if (c->members) {
        d->offsets = malloc((c->members + 1) * sizeof *d->offsets);
        d->first_dims = malloc(c->members * sizeof *d->first_dims);
        d->rows = mx_make_group(c->members, c->max_blocks, c->row_unit, seed, d->offsets,
                                d->first_dims) + c->slack;
    }
    if (c->patterns) d->rows = mx_pattern_rows();
    d->in = calloc((uint64_t)d->rows * d->cols + 1, mx_elem_bytes(d->dtype));
}

static void mx_data_free(mx_data *d) {
    free(d->in);
    free(d->offsets);
    free(d->first_dims);
}

// op_fill_random on the reference rig, read back; then every (row, 32-column block) rescaled by
// its own power of two (exact) and the edge values planted.
static void mx_data_fill(mx_data *d, const mx_regions *g, uint64_t seed) {
    rig *r = &mx_ref_rig;
    uint64_t n = (uint64_t)d->rows * d->cols;
    rig_prog_init(&mx_fill_prog, "fill");
    RIG_OK(op_fill_random(&mx_fill_prog, "fill", rig_ref(r, g->in, 0), n, d->dtype,
                          QT_FILL_NORMAL, seed, 0, 0.0f, 1.0f));
    prog_resolve(&mx_fill_prog);
    RIG_OK(backend_run(&r->be, &mx_fill_prog));
    RIG_OK(backend_read(&r->be, d->in, rig_ref(r, g->in, 0), n * mx_elem_bytes(d->dtype)));
    for (uint32_t row = 0; row < d->rows; row++) {
        for (uint32_t c = 0; c < d->cols; c++) {
            uint64_t i = (uint64_t)row * d->cols + c;
            int shift = (int)((row * 5u + (c / 32u) * 3u) % 41u) - 20;
            mx_set(d->in, d->dtype, i, ldexpf(mx_get(d->in, d->dtype, i), shift));
        }
    }
    mx_plant_edges(d->in, d->dtype, d->rows, d->cols);
}

// The case on the reference backend: the oracle of every GPU comparison.
static void mx_case_ref(const mx_case *c, mx_data *d, mx_result *res, uint64_t seed) {
    mx_regions g;
    rig_reset(&mx_ref_rig);
    mx_rig_build(&mx_ref_rig, c, d, &g);
    if (c->patterns) {
        mx_patterns(d);
    } else {
        mx_data_fill(d, &g, seed);
    }
    mx_rig_load(&mx_ref_rig, c, d, &g);
    mx_rig_run(&mx_ref_rig, c, d, &g, res);
}

// ---------------------------------------------------------------------------------------------
// Comparisons with enough context to fix a kernel from one log.

static uint32_t mx_input_bits(const mx_data *d, uint64_t i) {
    if (d->dtype == QT_DTYPE_BF16) return ((const uint16_t *)d->in)[i];
    return ((const uint32_t *)d->in)[i];
}

static uint64_t mx_load_le(const uint8_t *p, uint64_t bytes) {
    uint64_t v = 0;
    for (uint64_t b = 0; b < bytes; b++) v |= (uint64_t)p[b] << (8 * b);
    return v;
}

// Output `which` (mx_output_names) of two runs, element by element: codes and dequantized
// values name the element and its input bits, scales their block.
static void mx_compare_region(const char *label, int which, const mx_case *c,
                              const mx_data *d, const uint8_t *got, const uint8_t *want,
                              uint64_t bytes) {
    // Codes and scales are bytes, dequantized copies the case's output type, values BF16.
    uint64_t size = which >= MX_OUT_ROW_VALUES ? 2 : which >= 4 ? mx_elem_bytes(c->out_dtype) : 1;
    uint64_t width = which == 1 ? (d->cols + 31) / 32 : d->cols;
    uint64_t bad = 0;
    for (uint64_t i = 0; i < bytes; i += size) {
        if (memcmp(got + i, want + i, size) == 0) continue;
        if (bad++ >= 4) continue;
        uint64_t e = i / size;
        char input[40] = "";
        if (which != 1 && which != 3) {  // an element, not a block scale
            snprintf(input, sizeof input, " (input bits 0x%0*x)",
                     d->dtype == QT_DTYPE_BF16 ? 4 : 8, mx_input_bits(d, e));
        }
        CHECK(false, "%s: %s [%llu][%llu]: got 0x%0*llx, expected 0x%0*llx%s", label,
              mx_output_names[which], (unsigned long long)(e / width),
              (unsigned long long)(e % width), (int)(2 * size),
              (unsigned long long)mx_load_le(got + i, size), (int)(2 * size),
              (unsigned long long)mx_load_le(want + i, size), input);
    }
    CHECK(bad == 0, "%s: %s: %llu of %llu elements differ", label, mx_output_names[which],
          (unsigned long long)bad, (unsigned long long)(bytes / size));
}

static void mx_compare_results(const char *label, const mx_case *c, const mx_data *d,
                               const mx_result *got, const mx_result *want) {
    uint64_t sizes[MX_OUTPUTS];
    mx_output_sizes(d, c, sizes);
    for (int i = 0; i < MX_OUTPUTS; i++) {
        mx_compare_region(label, i, c, d, got->bytes[i], want->bytes[i], sizes[i]);
    }
}

// One run's values (the quantize with QT_MXFP8_FLAG_*_VALUES) against its dequantized codes,
// bit for bit, rows past a group's end included (untouched by both). BF16 copies only.
static void mx_check_values(const char *label, const mx_case *c, const mx_data *d,
                            const mx_result *res) {
    if (c->out_dtype != QT_DTYPE_BF16) return;
    uint64_t sizes[MX_OUTPUTS];
    mx_output_sizes(d, c, sizes);
    for (int dir = 0; dir < 2; dir++) {
        mx_compare_region(label, MX_OUT_ROW_VALUES + dir, c, d,
                          res->bytes[MX_OUT_ROW_VALUES + dir], res->bytes[4 + dir], sizes[4 + dir]);
    }
}

// ---------------------------------------------------------------------------------------------
// CPU: the op builders and the reference backend give the oracle's bytes (and leave rows past
// a group's end alone).

static void mx_check_program_ref(const mx_case *c, uint64_t seed) {
    mx_data d;
    mx_data_init(c, &d, seed);
    mx_result res;
    mx_case_ref(c, &d, &res, seed);
    uint32_t end = d.rows;
    if (d.count && d.offsets[d.count] < end) end = d.offsets[d.count];
    mx_mat view = {d.rows, d.cols, d.dtype, d.in, NULL, NULL, NULL, NULL};
    float *x = mx_to_float(&view, d.offsets, d.first_dims, d.count);
    mx_mat o = mx_mat_new(end, d.cols, d.dtype);
    oracle_quantize(x, end, d.cols, c->elem, c->tile_2d, &o);
    mx_mat got = {end, d.cols, d.dtype, NULL, res.bytes[0], res.bytes[1], res.bytes[2],
                  res.bytes[3]};
    mx_compare_outputs(c->name, &got, &o, end);
    uint64_t out_bytes = (uint64_t)end * d.cols * mx_elem_bytes(c->out_dtype);
    uint8_t *deq = malloc(out_bytes + 1);
    for (int dir = 0; dir < 2; dir++) {
        mx_twin_dequantize(dir ? o.cc : o.rc, dir ? o.cs : o.rs, dir == 1, c->elem, end, d.cols,
                           deq, c->out_dtype);
        CHECK(memcmp(deq, res.bytes[4 + dir], out_bytes) == 0, "%s: %s differs", c->name,
              mx_output_names[4 + dir]);
    }
    uint64_t sizes[MX_OUTPUTS];
    mx_output_sizes(&d, c, sizes);
    mx_expect_untouched("row codes", res.bytes[0], (uint64_t)end * d.cols, sizes[0]);
    mx_expect_untouched("rowwise dequant", res.bytes[4], out_bytes, sizes[4]);
    mx_check_values(c->name, c, &d, &res);
    free(deq);
    free(x);
    mx_mat_free(&o);
    mx_result_free(&res);
    mx_data_free(&d);
}

static void test_program_ref(void) {
    test_begin("mxfp8_program_on_ref_backend");
    static const mx_case cases[] = {
        {"dense_f32_e5m2", 67, 200, QT_DTYPE_F32, QT_ELEM_E5M2, false, true, true, 0, 0, 0,
         QT_DTYPE_BF16, false, 0},
        {"grouped_bf16_e4m3", 0, 96, QT_DTYPE_BF16, QT_ELEM_E4M3, false, true, true, 5, 40, 3,
         QT_DTYPE_F32, false, 0},
        {"grouped_bf16_e4m3_2d", 0, 50, QT_DTYPE_BF16, QT_ELEM_E4M3, true, true, true, 4, 0, 3,
         QT_DTYPE_F32, false, 0},
        // BF16 copies: the values of a second quantize equal the dequantized codes.
        {"grouped_bf16_e5m2_values", 0, 72, QT_DTYPE_BF16, QT_ELEM_E5M2, false, true, true, 5,
         40, 3, QT_DTYPE_BF16, false, 0},
        {"grouped_f32_e4m3_2d_values", 0, 50, QT_DTYPE_F32, QT_ELEM_E4M3, true, true, true, 4, 0,
         3, QT_DTYPE_BF16, false, 8},
        {"patterns_bf16_e4m3_values", 0, 64, QT_DTYPE_BF16, QT_ELEM_E4M3, false, true, true, 0,
         0, 0, QT_DTYPE_BF16, true, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mx_check_program_ref(&cases[i], 600 + i);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU: every case on both backends, byte for byte.

static bool mx_gpu_ok;
static const char *mx_gpu_why;

static void mx_run_gpu_case(const mx_case *c, uint64_t seed, bool rerun) {
    if (!mx_gpu_ok) {
        test_skip(c->name, mx_gpu_why);
        return;
    }
    test_begin(c->name);
    mx_data d;
    mx_data_init(c, &d, seed);
    mx_result ref, gpu;
    mx_case_ref(c, &d, &ref, seed);
    mx_regions g;
    rig_reset(&mx_gpu_rig);
    mx_rig_build(&mx_gpu_rig, c, &d, &g);
    mx_rig_load(&mx_gpu_rig, c, &d, &g);
    mx_rig_run(&mx_gpu_rig, c, &d, &g, &gpu);
    mx_compare_results("gpu vs ref", c, &d, &gpu, &ref);
    mx_check_values("gpu values vs gpu dequantize", c, &d, &gpu);
    if (rerun) {
        // Determinism: a second run from fresh sentinels gives the same bytes.
        mx_result again;
        mx_rig_load(&mx_gpu_rig, c, &d, &g);
        mx_rig_run(&mx_gpu_rig, c, &d, &g, &again);
        mx_compare_results("gpu second run", c, &d, &again, &gpu);
        mx_result_free(&again);
    }
    mx_result_free(&ref);
    mx_result_free(&gpu);
    mx_data_free(&d);
    test_end();
}

#define MX_BF QT_DTYPE_BF16
#define MX_F32 QT_DTYPE_F32
#define MX_E4 QT_ELEM_E4M3
#define MX_E5 QT_ELEM_E5M2

static void test_gpu_cases(void) {
    // name, rows, cols, dtype, elem, 2d, rowwise, colwise, members, slack, max_blocks,
    // dequantized dtype, patterns
    static const mx_case cases[] = {
        {"gpu_mxfp8_bf16_e4m3_256x1024", 256, 1024, MX_BF, MX_E4, false, true, true, 0, 0, 0,
         MX_BF, false, 0},
        {"gpu_mxfp8_bf16_e4m3_2d_256x1024", 256, 1024, MX_BF, MX_E4, true, true, true, 0, 0, 0,
         MX_F32, false, 0},
        {"gpu_mxfp8_f32_e5m2_160x520", 160, 520, MX_F32, MX_E5, false, true, true, 0, 0, 0,
         MX_F32, false, 0},
        {"gpu_mxfp8_bf16_e4m3_97x131", 97, 131, MX_BF, MX_E4, false, true, true, 0, 0, 0,
         MX_F32, false, 0},
        {"gpu_mxfp8_f32_e4m3_rowwise_only_33x45", 33, 45, MX_F32, MX_E4, false, true, false, 0,
         0, 0, MX_BF, false, 0},
        {"gpu_mxfp8_bf16_e5m2_colwise_only_2d_65x77", 65, 77, MX_BF, MX_E5, true, false, true,
         0, 0, 0, MX_BF, false, 0},
        {"gpu_mxfp8_bf16_e4m3_1x1", 1, 1, MX_BF, MX_E4, false, true, true, 0, 0, 0, MX_F32,
         false, 0},
        {"gpu_mxfp8_bf16_e4m3_1x4099", 1, 4099, MX_BF, MX_E4, false, true, true, 0, 0, 0,
         MX_BF, false, 0},
        {"gpu_mxfp8_f32_e4m3_4099x3", 4099, 3, MX_F32, MX_E4, false, true, true, 0, 0, 0,
         MX_F32, false, 0},
        {"gpu_mxfp8_bf16_e5m2_31x33", 31, 33, MX_BF, MX_E5, false, true, true, 0, 0, 0, MX_BF,
         false, 0},
        {"gpu_mxfp8_f32_e4m3_2d_100x1000", 100, 1000, MX_F32, MX_E4, true, true, true, 0, 0, 0,
         MX_BF, false, 0},
        {"gpu_mxfp8_bf16_e4m3_520x8", 520, 8, MX_BF, MX_E4, false, true, true, 0, 0, 0, MX_BF,
         false, 0},
        {"gpu_mxfp8_patterns_f32_e4m3", 0, 64, MX_F32, MX_E4, false, true, true, 0, 0, 0,
         MX_F32, true, 0},
        {"gpu_mxfp8_patterns_f32_e5m2", 0, 64, MX_F32, MX_E5, false, true, true, 0, 0, 0,
         MX_F32, true, 0},
        {"gpu_mxfp8_patterns_bf16_e4m3", 0, 64, MX_BF, MX_E4, false, true, true, 0, 0, 0,
         MX_BF, true, 0},
        {"gpu_mxfp8_grouped1_bf16_e4m3", 0, 96, MX_BF, MX_E4, false, true, true, 1, 45, 5,
         MX_BF, false, 0},
        {"gpu_mxfp8_grouped3_f32_e5m2", 0, 520, MX_F32, MX_E5, false, true, true, 3, 7, 4,
         MX_F32, false, 0},
        {"gpu_mxfp8_grouped64_bf16_e4m3", 0, 1024, MX_BF, MX_E4, false, true, true, 64, 32, 4,
         MX_BF, false, 0},
        {"gpu_mxfp8_grouped65_f32_e4m3_2d", 0, 33, MX_F32, MX_E4, true, true, true, 65, 0, 3,
         MX_F32, false, 0},
        {"gpu_mxfp8_grouped1000_bf16_e4m3", 0, 40, MX_BF, MX_E4, false, true, true, 1000, 100,
         2, MX_BF, false, 0},
        {"gpu_mxfp8_grouped1000_bf16_e5m2_rowwise_only", 0, 512, MX_BF, MX_E5, false, true,
         false, 1000, 1, 1, MX_F32, false, 0},
        // Member sizes in units of 8 rows (not the mxfp8 row_align): tiles cross members.
        {"gpu_mxfp8_grouped50_unaligned_bf16_e4m3", 0, 300, MX_BF, MX_E4, false, true, true, 50,
         3, 9, MX_BF, false, 8},
        {"gpu_mxfp8_grouped50_unaligned_f32_e4m3_2d", 0, 64, MX_F32, MX_E4, true, true, true, 50,
         3, 9, MX_F32, false, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mx_run_gpu_case(&cases[i], 700 + i, i == 0);
    }
    // The bench shape class: one large case, run twice.
    static const mx_case large = {"gpu_mxfp8_bf16_e4m3_1024x4096_twice", 1024, 4096, MX_BF,
                                  MX_E4, false, true, true, 0, 0, 0, MX_BF, false, 0};
    mx_run_gpu_case(&large, 800, true);
}

// ---------------------------------------------------------------------------------------------
// An activation and the MXFP8 cast of its output in one pass (op_mxfp8_act) against the
// activation's stored BF16 output cast by op_mxfp8_quantize, byte for byte (each direction's
// codes and scales, or its values), on each backend, and the GPU's fused outputs against the
// reference backend's. Inputs cover the tables' binades and beyond (the out-of-line path), zeros,
// subnormals, Inf and NaN; shapes with partial tiles (rows not a multiple of 32, columns of 8 not
// of 256) and with more tiles than the grid has blocks (each block then runs several); GELU and
// SiLU, forward and backward, E4M3 and E5M2, codes or values, one direction alone.

typedef struct mx_act_mode {
    uint32_t act;
    bool backward;
    qt_elem elem;
    bool rowwise, colwise, row_values, col_values;
} mx_act_mode;

// Regions: x, dy, the activation's stored y, and per way ([0] the activation then the cast, [1]
// fused) each direction's codes (or values) and scales.
typedef struct mx_act_regions {
    arena_handle x, dy, y;
    arena_handle data[2][2], scales[2][2];  // [way][rowwise, colwise]
    uint64_t elems, data_bytes[2], scale_bytes[2];
} mx_act_regions;

static op_mxfp8_quantize_desc mx_act_desc(rig *r, const mx_act_regions *h, uint32_t rows,
                                          uint32_t cols, const mx_act_mode *md, int way,
                                          prog_ref in) {
    op_mxfp8_quantize_desc d = {0};
    d.in = in;
    d.dtype = QT_DTYPE_BF16;
    d.rows = rows;
    d.cols = cols;
    d.elem = md->elem;
    d.row_values = md->row_values;
    d.col_values = md->col_values;
    const bool on[2] = {md->rowwise, md->colwise}, values[2] = {md->row_values, md->col_values};
    op_mxfp8_dir *dir[2] = {&d.rowwise, &d.colwise};
    for (int k = 0; k < 2; k++) {
        if (!on[k]) continue;
        dir[k]->codes = rig_ref(r, h->data[way][k], 0);
        if (!values[k]) dir[k]->scales = rig_ref(r, h->scales[way][k], 0);
    }
    d.group = op_group_dense();
    return d;
}

static void mx_act_build(rig *r, uint32_t rows, uint32_t cols, const mx_act_mode *md,
                         mx_act_regions *h) {
    h->elems = (uint64_t)rows * cols;
    h->data_bytes[0] = h->elems * (md->row_values ? 2 : 1);
    h->data_bytes[1] = h->elems * (md->col_values ? 2 : 1);
    h->scale_bytes[0] = op_mxfp8_row_scales_bytes(rows, cols);
    h->scale_bytes[1] = op_mxfp8_col_scales_bytes(rows, cols);
    h->x = rig_reserve(r, "x", h->elems * 2);
    h->dy = rig_reserve(r, "dy", h->elems * 2);
    h->y = rig_reserve(r, "y", h->elems * 2);
    static const char *const names[2][2][2] = {{{"row", "row_scales"}, {"col", "col_scales"}},
                                               {{"row_fused", "row_scales_fused"},
                                                {"col_fused", "col_scales_fused"}}};
    for (int w = 0; w < 2; w++) {
        for (int k = 0; k < 2; k++) {
            h->data[w][k] = rig_reserve(r, names[w][k][0], h->data_bytes[k]);
            h->scales[w][k] = rig_reserve(r, names[w][k][1], h->scale_bytes[k]);
        }
    }
    prog_ref x = rig_ref(r, h->x, 0), dy = rig_ref(r, h->dy, 0), y = rig_ref(r, h->y, 0);
    RIG_OK(rig_act_bf16(r, md->act, md->backward, rows, cols, x, dy, y));
    op_mxfp8_quantize_desc unfused = mx_act_desc(r, h, rows, cols, md, 0, y);
    op_mxfp8_quantize_desc fused = mx_act_desc(r, h, rows, cols, md, 1, x);
    RIG_OK(op_mxfp8_quantize(&r->prog, "cast", &unfused));
    RIG_OK(op_mxfp8_act(&r->prog, "act_cast", md->act, md->backward,
                        md->backward ? dy : OP_REF_NONE, &fused));
    rig_bind(r);
}

// Runs the program; returns both ways' outputs, [2][row data, row scales, col data, col scales]
// back to back (the caller frees them), after comparing them with each other. Outputs a mode
// does not write (a direction off, a values direction's scales) stay as written: zeros.
static uint8_t *mx_act_run(rig *r, const mx_act_regions *h, const mx_act_mode *md,
                           const uint16_t *x, const uint16_t *dy, const char *what,
                           uint64_t *half_bytes) {
    uint64_t half = h->data_bytes[0] + h->scale_bytes[0] + h->data_bytes[1] + h->scale_bytes[1];
    uint8_t *o = calloc(2, half);
    RIG_OK(backend_write(&r->be, rig_ref(r, h->x, 0), x, h->elems * 2));
    RIG_OK(backend_write(&r->be, rig_ref(r, h->dy, 0), dy, h->elems * 2));
    for (int w = 0; w < 2; w++) {
        for (int k = 0; k < 2; k++) {
            RIG_OK(backend_write(&r->be, rig_ref(r, h->data[w][k], 0), o, h->data_bytes[k]));
            RIG_OK(backend_write(&r->be, rig_ref(r, h->scales[w][k], 0), o, h->scale_bytes[k]));
        }
    }
    RIG_OK(backend_run(&r->be, &r->prog));
    const bool on[2] = {md->rowwise, md->colwise}, values[2] = {md->row_values, md->col_values};
    for (int w = 0; w < 2; w++) {
        uint8_t *at = o + w * half;
        for (int k = 0; k < 2; k++) {
            if (on[k]) RIG_OK(backend_read(&r->be, at, rig_ref(r, h->data[w][k], 0),
                                           h->data_bytes[k]));
            at += h->data_bytes[k];
            if (on[k] && !values[k]) {
                RIG_OK(backend_read(&r->be, at, rig_ref(r, h->scales[w][k], 0),
                                    h->scale_bytes[k]));
            }
            at += h->scale_bytes[k];
        }
    }
    mx_compare(what, o + half, o, half, 1);
    *half_bytes = half;
    return o;
}

// One case: the fused op against the activation then the cast on each backend, and the GPU's
// fused outputs against the reference backend's.
static void mx_act_case(void *modes, rig_pair *rigs, uint32_t rows, uint32_t cols, size_t mode,
                        const uint16_t *x, const uint16_t *dy, const char *name) {
    const mx_act_mode *md = &((const mx_act_mode *)modes)[mode];
    char what[96];
    snprintf(what, sizeof what, "%s, fused against act then cast, ref", name);
    mx_act_regions hr, hg;
    uint64_t half = 0;
    rig_reset(rigs->ref);
    mx_act_build(rigs->ref, rows, cols, md, &hr);
    uint8_t *or = mx_act_run(rigs->ref, &hr, md, x, dy, what, &half);
    if (rigs->on_gpu) {
        rig_reset(rigs->gpu);
        mx_act_build(rigs->gpu, rows, cols, md, &hg);
        snprintf(what, sizeof what, "%s, fused against act then cast, gpu", name);
        uint8_t *og = mx_act_run(rigs->gpu, &hg, md, x, dy, what, &half);
        snprintf(what, sizeof what, "%s, fused, gpu against ref", name);
        mx_compare(what, og + half, or + half, half, 1);
        free(og);
    }
    free(or);
}

static void test_act_cast(void) {
    // 2048 x 4096: 1024 tiles, more than the grids' 924 (forward) and 660 (backward) blocks.
    static const uint32_t shapes[][2] = {{7, 8},     {32, 256},  {33, 136},
                                         {300, 1000}, {1000, 24}, {2048, 4096}};
    static const mx_act_mode modes[] = {
        {QT_ACT_GELU, false, QT_ELEM_E4M3, true, true, true, false},
        {QT_ACT_SILU, false, QT_ELEM_E5M2, true, true, false, false},
        {QT_ACT_GELU, true, QT_ELEM_E4M3, true, true, true, true},
        {QT_ACT_SILU, true, QT_ELEM_E5M2, true, false, false, false},
        {QT_ACT_GELU, true, QT_ELEM_E5M2, false, true, false, false},
        {QT_ACT_GELU, false, QT_ELEM_E4M3, false, true, false, true},
        {QT_ACT_SILU, true, QT_ELEM_E4M3, true, true, false, true},
    };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const size_t n_modes = sizeof modes / sizeof modes[0];
    rig_pair rigs;
    rig_pair_open(&rigs);
    test_begin("mxfp8_act_cast_equals_act_then_cast");
    rig_act_cases(&rigs, shapes, n_shapes, (void *)modes, n_modes, n_shapes * 2 + 2, 29,
                  mx_act_case);
    test_end();
    rig_pair_close(&rigs, "gpu_mxfp8_act_cast_matches_ref");
}

int main(void) {
    test_scale_rule();
    test_hand_codes();
    test_inf_block();
    test_special_blocks();
    test_twin_matches_oracle();
    test_colwise_is_transposed_rowwise();
    test_2d_tiles();
    test_grouped_twin();
    test_dequant_hand();
    test_dequant_colwise_layout();
    test_roundtrip_bound();
    test_act_cast();
    const char *why = NULL;
    rig_open(&mx_ref_rig, BACKEND_REF, &why);
    test_program_ref();
    mx_gpu_ok = rig_open(&mx_gpu_rig, BACKEND_GPU, &mx_gpu_why);
    test_gpu_cases();
    rig_reset(&mx_ref_rig);
    rig_close(&mx_ref_rig);
    if (mx_gpu_ok) {
        rig_reset(&mx_gpu_rig);
        rig_close(&mx_gpu_rig);
    }
    return test_exit_code();
}
