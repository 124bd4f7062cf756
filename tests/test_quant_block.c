// FP8 block scaling: the C twins against hand-derived codes and scales, the claim that TE's
// double reciprocal for scale_inv equals the FP32 RN one, grouped layouts, dequantize error
// bounds; then, with a GPU, every kernel against its twin, byte for byte, on random and planted
// data.
#include <math.h>
#include <stdint.h>

#include "runtime/ops/op_core.h"         // op_fill_random
#include "runtime/ops/op_quant_block.h"  // op_quant_block, op_dequant_block
#include "tests/rig.h"
#include "tests/test.h"

// ---------------------------------------------------------------------------------------------
// Harness: one cast (+ dequantize of each direction) of one case on one backend.

typedef struct bcase {
    const char *name;
    uint32_t rows, cols;  // rows = rows_capacity when grouped
    uint32_t in_dtype, out_dtype, fp8;
    bool two_d, rowwise, colwise;
    op_block_options options;
    uint32_t count;  // grouped members, 0 = dense
    const uint32_t *offsets, *first_dims;
    const void *input;  // whole input (host bytes), or NULL: op_fill_random with the fields below
    uint32_t fill_dist;
    float fill_a, fill_b;
    uint64_t seed;
    const uint64_t *plant_index;  // then these elements are overwritten (after the fill)
    const float *plant_value;
    uint32_t plant_count;
    bool misalign;  // every region used from an offset that breaks the kernels' vector paths
} bcase;

typedef struct bout {
    uint8_t *input;  // the input the cast saw
    uint8_t *row_codes, *col_codes;
    float *row_si, *col_si;
    uint8_t *deq_row, *deq_col;  // out_dtype elements
} bout;

#define BLOCK_SENTINEL 0xA5  // every output starts as this byte: unwritten bytes stay so

static uint32_t dtype_bytes(uint32_t dtype) { return dtype == QT_DTYPE_BF16 ? 2 : 4; }
static uint64_t case_elems(const bcase *c) { return (uint64_t)c->rows * c->cols; }
static uint64_t case_si_count(const bcase *c, bool colwise) {
    return op_block_scale_count(c->rows, c->cols, c->two_d, colwise);
}
static uint64_t at_least_16(uint64_t bytes) { return bytes < 16 ? 16 : bytes; }

typedef struct bregions {
    arena_handle input, row_codes, col_codes, row_si, col_si, deq_row, deq_col, offsets, dims;
    uint64_t in_off, code_off, si_off, deq_off;  // byte offsets of the tensors in their regions
} bregions;

static void bcase_reserve(rig *r, const bcase *c, bregions *h) {
    uint64_t n = case_elems(c);
    // Misaligned: input and dequantized outputs by one element, codes by one byte, scales by one
    // float (they are only ever accessed as single floats).
    h->in_off = c->misalign ? dtype_bytes(c->in_dtype) : 0;
    h->code_off = c->misalign ? 1 : 0;
    h->si_off = c->misalign ? 4 : 0;
    h->deq_off = c->misalign ? dtype_bytes(c->out_dtype) : 0;
    h->input = rig_reserve(r, "input", 16 + n * dtype_bytes(c->in_dtype));
    h->row_codes = rig_reserve(r, "row_codes", 16 + n);
    h->col_codes = rig_reserve(r, "col_codes", 16 + n);
    h->row_si = rig_reserve(r, "row_scale_inv", 16 + 4 * case_si_count(c, false));
    h->col_si = rig_reserve(r, "col_scale_inv", 16 + 4 * case_si_count(c, true));
    h->deq_row = rig_reserve(r, "deq_row", 16 + n * dtype_bytes(c->out_dtype));
    h->deq_col = rig_reserve(r, "deq_col", 16 + n * dtype_bytes(c->out_dtype));
    h->offsets = rig_reserve(r, "row_offsets", at_least_16(4ull * (c->count + 1)));
    h->dims = rig_reserve(r, "first_dims", at_least_16(4ull * c->count));
}

static void bcase_build(rig *r, program *fill, const bcase *c, const bregions *h) {
    op_block_tensor t = {0};
    t.rows = c->rows;
    t.cols = c->cols;
    t.two_d = c->two_d;
    t.fp8 = c->fp8;
    t.rowwise = c->rowwise;
    t.colwise = c->colwise;
    t.row_codes = rig_ref(r, h->row_codes, h->code_off);
    t.row_scale_inv = rig_ref(r, h->row_si, h->si_off);
    t.col_codes = rig_ref(r, h->col_codes, h->code_off);
    t.col_scale_inv = rig_ref(r, h->col_si, h->si_off);
    t.group.count = c->count;
    t.group.row_offsets = rig_ref(r, h->offsets, 0);
    t.group.first_dims = rig_ref(r, h->dims, 0);
    prog_ref input = rig_ref(r, h->input, h->in_off);
    if (c->input == NULL) {
        RIG_OK(op_fill_random(fill, "fill", input, case_elems(c), c->in_dtype, c->fill_dist,
                              c->seed, 0, c->fill_a, c->fill_b));
    }
    RIG_OK(op_quant_block(&r->prog, c->name, input, c->in_dtype, &t, &c->options));
    if (c->rowwise) {
        RIG_OK(op_dequant_block(&r->prog, "dequant_row", &t, false,
                                rig_ref(r, h->deq_row, h->deq_off), c->out_dtype));
    }
    if (c->colwise) {
        RIG_OK(op_dequant_block(&r->prog, "dequant_col", &t, true,
                                rig_ref(r, h->deq_col, h->deq_off), c->out_dtype));
    }
}

static void bcase_write_inputs(rig *r, program *fill, const bcase *c, const bregions *h) {
    uint32_t esize = dtype_bytes(c->in_dtype);
    if (c->input == NULL) {
        prog_resolve(fill);
        RIG_OK(backend_run(&r->be, fill));
    } else {
        RIG_OK(backend_write(&r->be, rig_ref(r, h->input, h->in_off), c->input,
                             case_elems(c) * esize));
    }
    for (uint32_t i = 0; i < c->plant_count; i++) {
        uint32_t bits = qt_f32_bits(c->plant_value[i]);
        uint16_t half = qt_f32_to_bf16(c->plant_value[i]);
        RIG_OK(backend_write(&r->be, rig_ref(r, h->input, h->in_off + c->plant_index[i] * esize),
                             esize == 2 ? (const void *)&half : (const void *)&bits, esize));
    }
    if (c->count > 0) {
        RIG_OK(backend_write(&r->be, rig_ref(r, h->offsets, 0), c->offsets, 4ull * (c->count + 1)));
        RIG_OK(backend_write(&r->be, rig_ref(r, h->dims, 0), c->first_dims, 4ull * c->count));
    }
    arena_handle outs[6] = {h->row_codes, h->col_codes, h->row_si, h->col_si, h->deq_row,
                            h->deq_col};
    for (int i = 0; i < 6; i++) {
        uint64_t bytes = arena_region_get(&r->dev, outs[i])->bytes;
        uint8_t *sentinel = malloc(bytes);
        memset(sentinel, BLOCK_SENTINEL, bytes);
        RIG_OK(backend_write(&r->be, rig_ref(r, outs[i], 0), sentinel, bytes));
        free(sentinel);
    }
}

static void *read_region(rig *r, arena_handle h, uint64_t offset, uint64_t bytes) {
    void *out = malloc(at_least_16(bytes));
    RIG_OK(backend_read(&r->be, out, rig_ref(r, h, offset), bytes));
    return out;
}

// Runs case c on the reference backend (gpu == NULL) or on the given open GPU backend.
static void bcase_run(const backend *gpu, const bcase *c, bout *o) {
    static rig r;
    static program fill;
    memset(&r, 0, sizeof r);
    if (gpu) {
        r.be = *gpu;
    } else {
        backend_open_ref(&r.be);
    }
    rig_arena_init(&r.dev, ARENA_KIND_DEVICE, "device");
    rig_arena_init(&r.host, ARENA_KIND_HOST, "host");
    rig_prog_init(&r.prog, "test");
    rig_prog_init(&fill, "fill");
    bregions h;
    bcase_reserve(&r, c, &h);
    bcase_build(&r, &fill, c, &h);
    rig_bind(&r);
    bcase_write_inputs(&r, &fill, c, &h);
    RIG_OK(backend_run(&r.be, &r.prog));
    RIG_OK(backend_finish(&r.be));
    uint64_t n = case_elems(c);
    o->input = read_region(&r, h.input, h.in_off, n * dtype_bytes(c->in_dtype));
    o->row_codes = read_region(&r, h.row_codes, h.code_off, n);
    o->col_codes = read_region(&r, h.col_codes, h.code_off, n);
    o->row_si = read_region(&r, h.row_si, h.si_off, 4 * case_si_count(c, false));
    o->col_si = read_region(&r, h.col_si, h.si_off, 4 * case_si_count(c, true));
    o->deq_row = read_region(&r, h.deq_row, h.deq_off, n * dtype_bytes(c->out_dtype));
    o->deq_col = read_region(&r, h.deq_col, h.deq_off, n * dtype_bytes(c->out_dtype));
    // The GPU backend stays open for the next case; only this case's arenas go.
    backend_release(&r.be, &r.dev);
    backend_release(&r.be, &r.host);
    free(r.ref_memory[0]);
    free(r.ref_memory[1]);
}

static void bout_free(bout *o) {
    free(o->input);
    free(o->row_codes);
    free(o->col_codes);
    free(o->row_si);
    free(o->col_si);
    free(o->deq_row);
    free(o->deq_col);
}

static float input_at(const bcase *c, const bout *o, uint32_t m, uint32_t k) {
    uint64_t i = (uint64_t)m * c->cols + k;
    if (c->in_dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(((const uint16_t *)o->input)[i]);
    return ((const float *)o->input)[i];
}

static float deq_at(const bcase *c, const uint8_t *deq, uint32_t m, uint32_t k) {
    uint64_t i = (uint64_t)m * c->cols + k;
    if (c->out_dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(((const uint16_t *)deq)[i]);
    return ((const float *)deq)[i];
}

static uint32_t f32_bits_at(const float *a, uint64_t i) { return qt_f32_bits(a[i]); }

// ---------------------------------------------------------------------------------------------
// CPU: the reciprocal claim and the scale rule.

static void test_scale_inv_double_rounding(void) {
    test_begin("block_scale_inv_double_equals_float_rn");
    // TE's 1-D scale_inv is (float)(1.0 / (double)scale); qtrain computes the FP32
    // RN reciprocal. Every power of two (the default pow2 scales, subnormal ones included), then
    // 16M pseudo-random positive finite floats (the fp32_scales case), then the near-1 ulps.
    for (int e = -149; e <= 127; e++) {
        float s = ldexpf(1.0f, e);
        float te = (float)(1.0 / (double)s);
        CHECK(qt_f32_bits(te) == qt_f32_bits(qt_block_scale_inv(s)), "2^%d: %a vs %a", e, te,
              qt_block_scale_inv(s));
    }
    uint64_t state = 0x1234567ull;
    uint32_t mismatches = 0;
    for (uint32_t i = 0; i < (1u << 24); i++) {
        state = qt_mix64(state + i);
        uint32_t bits = (uint32_t)(state % 0x7F7FFFFFull) + 1u;  // (0, FLT_MAX]
        if ((i & 3u) == 0) bits = 0x3F000000u + (uint32_t)(state >> 40) % 0x01000000u;
        float s = qt_bits_f32(bits);
        float te = (float)(1.0 / (double)s);
        if (qt_f32_bits(te) != qt_f32_bits(qt_block_scale_inv(s)) && mismatches++ < 4) {
            CHECK(false, "scale %a (%08x): double path %a, float RN %a", s, bits, te,
                  qt_block_scale_inv(s));
        }
    }
    CHECK(mismatches == 0, "%u mismatching scales", mismatches);
    test_end();
}

static void test_scale_rule(void) {
    test_begin("block_scale_from_amax_rules");
    struct {
        float amax;
        uint32_t fp8, pow2, dtype;
        float eps;
        uint32_t expected;  // scale bits
    } cases[] = {
        {0.0f, QT_BLOCK_E4M3, 1, QT_DTYPE_BF16, 0.0f, 0x3F800000u},       // zero block: 1
        {NAN, QT_BLOCK_E4M3, 1, QT_DTYPE_BF16, 0.0f, 0x3F800000u},        // never from a
        {INFINITY, QT_BLOCK_E4M3, 1, QT_DTYPE_BF16, 0.0f, 0x3F800000u},   // reduction, but: 1
        {1.0f, QT_BLOCK_E4M3, 1, QT_DTYPE_BF16, 0.0f, 0x43800000u},       // 448 -> 256
        {1.0f, QT_BLOCK_E4M3, 0, QT_DTYPE_BF16, 0.0f, 0x43E00000u},       // 448
        {1.0f, QT_BLOCK_E5M2, 1, QT_DTYPE_F32, 0.0f, 0x47000000u},        // 57344 -> 32768
        {1.0f, QT_BLOCK_E5M2, 0, QT_DTYPE_F32, 0.0f, 0x47600000u},        // 57344
        {448.0f, QT_BLOCK_E4M3, 1, QT_DTYPE_F32, 0.0f, 0x3F800000u},      // exactly 1
        {3.0f, QT_BLOCK_E4M3, 1, QT_DTYPE_F32, 0.0f, 0x43000000u},        // 149.3 -> 128
        {0x1p-133f, QT_BLOCK_E4M3, 1, QT_DTYPE_BF16, 0.0f, 0x7F000000u},  // Inf->BF16_MAX->2^127
        {0x1p-133f, QT_BLOCK_E4M3, 0, QT_DTYPE_BF16, 0.0f, 0x7F7F0000u},  // BF16_MAX
        {0x1p-133f, QT_BLOCK_E4M3, 0, QT_DTYPE_F32, 0.0f, 0x7F7FFFFFu},   // FLT_MAX
        {0x1p-133f, QT_BLOCK_E4M3, 1, QT_DTYPE_F32, 0.0f, 0x7F000000u},   // FLT_MAX -> 2^127
        {0.5f, QT_BLOCK_E4M3, 1, QT_DTYPE_F32, 1.0f, 0x43800000u},        // eps lifts 0.5 to 1
        {0.0f, QT_BLOCK_E4M3, 1, QT_DTYPE_F32, 2.0f, 0x43000000u},        // 448/2 = 224 -> 128
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float s = qt_block_scale(cases[i].amax, cases[i].fp8, cases[i].pow2, cases[i].eps,
                                 cases[i].dtype);
        CHECK(qt_f32_bits(s) == cases[i].expected, "case %zu: amax %a: scale %a (%08x), "
              "expected %08x", i, cases[i].amax, s, qt_f32_bits(s), cases[i].expected);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// CPU: hand-derived codes and scales (E4M3 unless named; scale = qmax/amax floored to 2^k).

typedef struct hand_code {
    uint32_t m, k;
    uint8_t code;
} hand_code;

typedef struct hand_scale {
    uint32_t index;  // into the direction's scale_inv array
    uint32_t bits;
} hand_scale;

static void check_codes(const char *what, const uint8_t *codes, bool colwise, uint32_t rows,
                        uint32_t cols, const hand_code *expect, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t at = colwise ? (uint64_t)expect[i].k * rows + expect[i].m
                              : (uint64_t)expect[i].m * cols + expect[i].k;
        CHECK(codes[at] == expect[i].code, "%s (m %u, k %u): code %02x, expected %02x", what,
              expect[i].m, expect[i].k, codes[at], expect[i].code);
    }
}

static void check_scales(const char *what, const float *si, const hand_scale *expect, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = f32_bits_at(si, expect[i].index);
        CHECK(bits == expect[i].bits, "%s [%u]: %08x (%a), expected %08x", what,
              expect[i].index, bits, si[expect[i].index], expect[i].bits);
    }
}

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

// 2 x 256 BF16: row 0 block 0 has amax 1 (scale 256), row 0 block 1 holds +-Inf (scale 1, codes
// are satFP8(x) itself), row 1 block 0 is zeros, row 1 block 1 NaNs (amax 0: scale 1).
static void hand_bf16_input(uint16_t *in) {
    static const struct {
        uint32_t k;
        float v;
    } row0[] = {
        {0, 1.0f}, {1, 0.5f}, {2, -1.0f}, {3, 0.0f}, {4, -0.0f}, {5, 0x1p-10f},
        {6, 0x1.1p-8f}, {7, 0x1.3p-8f}, {8, NAN}, {9, -NAN}, {10, 0x1p-18f}, {11, 0x1.8p-17f},
        {12, -0x1p-20f}, {13, 0.875f}, {14, 0x3p-9f},
        {128, INFINITY}, {129, -INFINITY}, {130, 1e30f}, {131, 464.0f}, {132, -480.0f},
        {133, 448.0f}, {134, 0x1p-9f}, {135, 0x1p-10f}, {136, 0x1.8p-9f}, {137, 0x1.4p-8f},
        {138, -0x1p-12f}, {139, 240.0f}, {140, 0x1p-133f},
    };
    for (uint32_t k = 0; k < 256; k++) {
        in[k] = qt_f32_to_bf16(k < 128 ? 0.25f : 0.0f);
        in[256 + k] = qt_f32_to_bf16(k < 128 ? 0.0f : NAN);
    }
    for (size_t i = 0; i < COUNT_OF(row0); i++) in[row0[i].k] = qt_f32_to_bf16(row0[i].v);
    in[256 + 3] = qt_f32_to_bf16(-0.0f);
    in[256 + 200] = qt_f32_to_bf16(-NAN);
}

static void test_hand_1d_bf16(void) {
    test_begin("block_1d_hand_codes_bf16");
    static uint16_t in[2 * 256];
    hand_bf16_input(in);
    bcase c = {.name = "hand_1d", .rows = 2, .cols = 256, .in_dtype = QT_DTYPE_BF16,
               .out_dtype = QT_DTYPE_F32, .fp8 = QT_BLOCK_E4M3, .rowwise = true,
               .colwise = true, .input = in};
    bout o;
    bcase_run(NULL, &c, &o);
    static const hand_code row[] = {
        {0, 0, 0x78}, {0, 1, 0x70}, {0, 2, 0xF8}, {0, 3, 0x00}, {0, 4, 0x80}, {0, 5, 0x28},
        {0, 6, 0x38}, {0, 7, 0x3A}, {0, 8, 0x7F}, {0, 9, 0x7F}, {0, 10, 0x00}, {0, 11, 0x02},
        {0, 12, 0x80}, {0, 13, 0x76}, {0, 14, 0x3C}, {0, 15, 0x68}, {0, 127, 0x68},
        {0, 128, 0x7E}, {0, 129, 0xFE}, {0, 130, 0x7E}, {0, 131, 0x7E}, {0, 132, 0xFE},
        {0, 133, 0x7E}, {0, 134, 0x01}, {0, 135, 0x00}, {0, 136, 0x02}, {0, 137, 0x02},
        {0, 138, 0x80}, {0, 139, 0x77}, {0, 140, 0x00}, {0, 255, 0x00},
        {1, 0, 0x00}, {1, 3, 0x80}, {1, 127, 0x00}, {1, 128, 0x7F}, {1, 200, 0x7F},
    };
    check_codes("rowwise", o.row_codes, false, 2, 256, row, COUNT_OF(row));
    // Rowwise scale_inv [ceil(K/128)][M]: (block 0, row 0) 2^-8; every other block 1.
    static const hand_scale row_si[] = {
        {0, 0x3B800000u}, {1, 0x3F800000u}, {2, 0x3F800000u}, {3, 0x3F800000u}};
    check_scales("rowwise scale_inv", o.row_si, row_si, COUNT_OF(row_si));
    // Columnwise: one block of the 2 rows per column k; codes at [k][m].
    static const hand_code col[] = {
        {0, 0, 0x78}, {1, 0, 0x00}, {0, 1, 0x78}, {0, 3, 0x00}, {1, 3, 0x80}, {0, 5, 0x78},
        {0, 8, 0x7F}, {1, 8, 0x00}, {0, 13, 0x7E}, {0, 128, 0x7E}, {1, 128, 0x7F},
        {0, 134, 0x78}, {1, 134, 0x7F}, {0, 140, 0x08}, {0, 200, 0x00}, {1, 200, 0x7F},
    };
    check_codes("columnwise", o.col_codes, true, 2, 256, col, COUNT_OF(col));
    // Columnwise scale_inv [ceil(M/128)][K]: 448/0.5 -> 512, 448*2^10 -> 2^18, 448*2^9 -> 2^17,
    // and 448/2^-133 overflows to BF16_MAX -> 2^127, whose reciprocal is the subnormal 2^-127.
    static const hand_scale col_si[] = {
        {0, 0x3B800000u}, {1, 0x3B000000u}, {3, 0x3F800000u}, {5, 0x36800000u},
        {8, 0x3F800000u}, {13, 0x3B000000u}, {128, 0x3F800000u}, {134, 0x37000000u},
        {140, 0x00400000u}, {200, 0x3F800000u},
    };
    check_scales("columnwise scale_inv", o.col_si, col_si, COUNT_OF(col_si));
    // Dequantized (FP32): codes times scale_inv; NaN codes give the canonical NaN.
    const float *deq = (const float *)o.deq_row;
    CHECK(deq[0] == 1.0f && deq[1] == 0.5f && deq[128] == 448.0f && deq[129] == -448.0f,
          "rowwise dequantized %a %a %a %a", deq[0], deq[1], deq[128], deq[129]);
    CHECK(f32_bits_at(deq, 8) == 0x7FFFFFFFu && f32_bits_at(deq, 4) == 0x80000000u,
          "rowwise dequantized NaN %08x, -0 %08x", f32_bits_at(deq, 8), f32_bits_at(deq, 4));
    CHECK(deq_at(&c, o.deq_col, 0, 140) == 0x1p-133f, "columnwise dequantized 2^-133: %a",
          deq_at(&c, o.deq_col, 0, 140));
    bout_free(&o);
    test_end();
}

// 6 x 1 FP32: each rowwise block is one element, the one columnwise block holds all six.
static const float hand_f32_input[6] = {0x1p-133f, 448.0f, 3.0f, -0x1p-140f, 449.0f, 1e-3f};

static void test_hand_1d_f32(void) {
    test_begin("block_1d_hand_codes_f32");
    bcase c = {.name = "hand_f32", .rows = 6, .cols = 1, .in_dtype = QT_DTYPE_F32,
               .out_dtype = QT_DTYPE_BF16, .fp8 = QT_BLOCK_E4M3, .rowwise = true,
               .colwise = true, .input = hand_f32_input};
    bout o;
    bcase_run(NULL, &c, &o);
    // 2^-133 (an FP32 subnormal): 448/amax overflows, FLT_MAX -> 2^127, code 2^-6 = 0x08;
    // 3 -> scale 128 -> 384 = 0x7C; 449 -> scale 0.5 -> 224.5 -> 224 = 0x76;
    // 1e-3 -> scale 2^18 -> 262.1 -> 256 = 0x78; -2^-140 * 2^127 = -2^-13 -> -0 = 0x80.
    static const hand_code row[] = {{0, 0, 0x08}, {1, 0, 0x7E}, {2, 0, 0x7C},
                                    {3, 0, 0x80}, {4, 0, 0x76}, {5, 0, 0x78}};
    check_codes("rowwise", o.row_codes, false, 6, 1, row, COUNT_OF(row));
    static const hand_scale row_si[] = {{0, 0x00400000u}, {1, 0x3F800000u}, {2, 0x3C000000u},
                                        {3, 0x00400000u}, {4, 0x40000000u}, {5, 0x36800000u}};
    check_scales("rowwise scale_inv", o.row_si, row_si, COUNT_OF(row_si));
    // One block, amax 449: scale 0.5.
    static const hand_code col[] = {{0, 0, 0x00}, {1, 0, 0x76}, {2, 0, 0x3C},
                                    {3, 0, 0x80}, {4, 0, 0x76}, {5, 0, 0x00}};
    check_codes("columnwise", o.col_codes, true, 6, 1, col, COUNT_OF(col));
    static const hand_scale col_si[] = {{0, 0x40000000u}};
    check_scales("columnwise scale_inv", o.col_si, col_si, COUNT_OF(col_si));
    bout_free(&o);

    // FP32 scales (TE's use_f32_scales): the FLT_MAX replacement stays, so 2^-133 * FLT_MAX =
    // (1 - 2^-24) * 2^-5 rounds up to 2^-5 = 0x10; scale_inv is TE's double-path reciprocal.
    c.options.fp32_scales = true;
    bcase_run(NULL, &c, &o);
    float s3 = 448.0f / 3.0f, s449 = 448.0f / 449.0f;
    static const hand_code row32[] = {{0, 0, 0x10}, {1, 0, 0x7E}, {2, 0, 0x7E}, {4, 0, 0x7E}};
    check_codes("rowwise f32 scales", o.row_codes, false, 6, 1, row32, COUNT_OF(row32));
    hand_scale row32_si[] = {
        {0, qt_f32_bits((float)(1.0 / (double)QT_F32_FLT_MAX))}, {1, 0x3F800000u},
        {2, qt_f32_bits((float)(1.0 / (double)s3))}, {4, qt_f32_bits((float)(1.0 / (double)s449))}};
    check_scales("rowwise f32 scale_inv", o.row_si, row32_si, COUNT_OF(row32_si));
    // Column scale 448/449: 3 -> 2.993 -> 3.0 = 0x44; 1e-3 -> 0.511 subnormal steps -> 0x01.
    static const hand_code col32[] = {{1, 0, 0x7E}, {2, 0, 0x44}, {5, 0, 0x01}};
    check_codes("columnwise f32 scales", o.col_codes, true, 6, 1, col32, COUNT_OF(col32));
    bout_free(&o);
    test_end();
}

static void test_hand_1d_e5m2(void) {
    test_begin("block_1d_hand_codes_e5m2");
    static uint16_t in[2 * 5];
    const float v[10] = {1.0f, 0.75f, 0x1p-31f, 0x1p-32f, NAN,
                         INFINITY, 65536.0f, -65536.0f, 57344.0f, 0.0f};
    for (int i = 0; i < 10; i++) in[i] = qt_f32_to_bf16(v[i]);
    bcase c = {.name = "hand_e5m2", .rows = 2, .cols = 5, .in_dtype = QT_DTYPE_BF16,
               .out_dtype = QT_DTYPE_F32, .fp8 = QT_BLOCK_E5M2, .rowwise = true,
               .colwise = true, .input = in};
    bout o;
    bcase_run(NULL, &c, &o);
    // Row 0: 57344 -> 32768 = 2^15: 1 -> 2^15 = 0x78, 0.75 -> 0x76, 2^-31 -> 2^-16 = 0x01,
    // 2^-32 -> 2^-17 (half the min subnormal, ties to 0). Row 1 holds Inf: scale 1, E5M2 max 0x7B.
    static const hand_code row[] = {{0, 0, 0x78}, {0, 1, 0x76}, {0, 2, 0x01}, {0, 3, 0x00},
                                    {0, 4, 0x7F}, {1, 0, 0x7B}, {1, 1, 0x7B}, {1, 2, 0xFB},
                                    {1, 3, 0x7B}, {1, 4, 0x00}};
    check_codes("rowwise", o.row_codes, false, 2, 5, row, COUNT_OF(row));
    static const hand_scale row_si[] = {{0, 0x38000000u}, {1, 0x3F800000u}};
    check_scales("rowwise scale_inv", o.row_si, row_si, COUNT_OF(row_si));
    static const hand_code col[] = {{0, 0, 0x3C}, {1, 0, 0x7B}, {0, 3, 0x00}, {1, 3, 0x7B},
                                    {0, 4, 0x7F}, {1, 4, 0x00}};
    check_codes("columnwise", o.col_codes, true, 2, 5, col, COUNT_OF(col));
    CHECK(deq_at(&c, o.deq_row, 1, 0) == 57344.0f, "E5M2 max dequantized: %a",
          deq_at(&c, o.deq_row, 1, 0));
    bout_free(&o);
    test_end();
}

static void test_hand_2d(void) {
    test_begin("block_2d_hand_tiles");
    enum { N = 130 };
    static float in[N * N];
    memset(in, 0, sizeof in);
    in[5 * N + 7] = 1.0f;       // tile (0,0): amax 1 -> scale 256
    in[100 * N + 0] = 0.5f;
    in[3 * N + 129] = 448.0f;   // tile (0,1): amax 448 -> scale 1
    in[127 * N + 128] = -2.0f;
    in[128 * N + 128] = NAN;    // tile (1,1): amax 2 -> 224 -> 128; tile (1,0) is all zero
    in[129 * N + 129] = 2.0f;
    bcase c = {.name = "hand_2d", .rows = N, .cols = N, .in_dtype = QT_DTYPE_F32,
               .out_dtype = QT_DTYPE_F32, .fp8 = QT_BLOCK_E4M3, .two_d = true,
               .rowwise = true, .colwise = true, .input = in};
    bout o;
    bcase_run(NULL, &c, &o);
    static const hand_code row[] = {{5, 7, 0x78}, {100, 0, 0x70}, {3, 129, 0x7E},
                                    {127, 128, 0xC0}, {128, 128, 0x7F}, {129, 129, 0x78},
                                    {129, 0, 0x00}};
    check_codes("rowwise", o.row_codes, false, N, N, row, COUNT_OF(row));
    // Rowwise [tile m][tile k], columnwise [tile k][tile m].
    static const hand_scale row_si[] = {
        {0, 0x3B800000u}, {1, 0x3F800000u}, {2, 0x3F800000u}, {3, 0x3C000000u}};
    check_scales("rowwise scale_inv", o.row_si, row_si, COUNT_OF(row_si));
    check_scales("columnwise scale_inv", o.col_si, row_si, COUNT_OF(row_si));
    uint32_t mismatches = 0;
    for (uint32_t m = 0; m < N; m++) {
        for (uint32_t k = 0; k < N; k++) {
            if (o.col_codes[k * N + m] != o.row_codes[m * N + k] && mismatches++ < 4) {
                CHECK(false, "2-D columnwise (k %u, m %u) %02x is not the transpose %02x", k, m,
                      o.col_codes[k * N + m], o.row_codes[m * N + k]);
            }
        }
    }
    bout_free(&o);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// CPU: structural properties on random data (odd shapes), dequantize error bounds.

// Host random input from the same generator op_fill_random uses (normal, spread over binades
// by a per-element power of two so that blocks have very different amaxes).
static void *random_input(uint32_t rows, uint32_t cols, uint32_t dtype, uint64_t seed) {
    uint64_t n = (uint64_t)rows * cols;
    void *in = malloc(at_least_16(n * dtype_bytes(dtype)));
    for (uint64_t i = 0; i < n; i++) {
        float v = qt_fill_value(seed, i, QT_FILL_NORMAL, 0.0f, 1.0f);
        v = ldexpf(v, (int)(qt_mix64(seed ^ (i / 97)) % 40) - 20);
        if (dtype == QT_DTYPE_BF16) {
            ((uint16_t *)in)[i] = qt_f32_to_bf16(v);
        } else {
            ((float *)in)[i] = v;
        }
    }
    return in;
}

static void *transpose_input(const void *in, uint32_t rows, uint32_t cols, uint32_t dtype) {
    uint32_t esize = dtype_bytes(dtype);
    uint8_t *out = malloc(at_least_16((uint64_t)rows * cols * esize));
    for (uint32_t m = 0; m < rows; m++) {
        for (uint32_t k = 0; k < cols; k++) {
            memcpy(out + ((uint64_t)k * rows + m) * esize,
                   (const uint8_t *)in + ((uint64_t)m * cols + k) * esize, esize);
        }
    }
    return out;
}

static void check_bytes(const char *what, const void *got, const void *expected, uint64_t bytes) {
    const uint8_t *a = got, *b = expected;
    uint32_t reported = 0;
    for (uint64_t i = 0; i < bytes && reported < 4; i++) {
        if (a[i] != b[i]) {
            reported++;
            CHECK(false, "%s: byte %llu: %02x, expected %02x", what, (unsigned long long)i, a[i],
                  b[i]);
        }
    }
}

static void check_2d_transpose(const bcase *dense) {
    bcase c = *dense;
    c.two_d = true;
    bout o;
    bcase_run(NULL, &c, &o);
    uint32_t tiles_m = (c.rows + 127) / 128, tiles_k = (c.cols + 127) / 128;
    for (uint32_t m = 0; m < c.rows; m++) {
        for (uint32_t k = 0; k < c.cols; k++) {
            uint8_t a = o.col_codes[(uint64_t)k * c.rows + m];
            uint8_t b = o.row_codes[(uint64_t)m * c.cols + k];
            if (a != b) {
                CHECK(false, "2-D %ux%u: columnwise (k %u, m %u) %02x, rowwise %02x", c.rows,
                      c.cols, k, m, a, b);
                m = c.rows;
                break;
            }
        }
    }
    for (uint32_t tm = 0; tm < tiles_m; tm++) {
        for (uint32_t tk = 0; tk < tiles_k; tk++) {
            CHECK(f32_bits_at(o.col_si, tk * tiles_m + tm) ==
                      f32_bits_at(o.row_si, tm * tiles_k + tk),
                  "2-D scale_inv of tile (%u, %u) differs between directions", tm, tk);
        }
    }
    bout_free(&o);
}

// Columnwise quantization of X is rowwise quantization of X^T (same [K][M] codes and the same
// [ceil(M/128)][K] scale layout); for 2-D the columnwise data is the rowwise data transposed.
static void test_direction_consistency(void) {
    test_begin("block_directions_consistent_odd_shapes");
    static const uint32_t shapes[][2] = {{1, 1}, {1, 300}, {300, 1}, {131, 257}, {129, 127},
                                         {256, 130}};
    for (size_t s = 0; s < COUNT_OF(shapes); s++) {
        for (uint32_t dtype = 0; dtype < 2; dtype++) {
            uint32_t rows = shapes[s][0], cols = shapes[s][1];
            void *in = random_input(rows, cols, dtype, 11 + s);
            void *in_t = transpose_input(in, rows, cols, dtype);
            bcase c = {.name = "x", .rows = rows, .cols = cols, .in_dtype = dtype,
                       .out_dtype = QT_DTYPE_F32, .fp8 = QT_BLOCK_E4M3, .rowwise = true,
                       .colwise = true, .input = in};
            bcase ct = c;
            ct.name = "x_t";
            ct.rows = cols;
            ct.cols = rows;
            ct.input = in_t;
            bout o, ot;
            bcase_run(NULL, &c, &o);
            bcase_run(NULL, &ct, &ot);
            check_bytes("colwise codes vs rowwise codes of the transpose", o.col_codes,
                        ot.row_codes, (uint64_t)rows * cols);
            check_bytes("colwise scale_inv vs rowwise scale_inv of the transpose", o.col_si,
                        ot.row_si, 4 * case_si_count(&c, true));
            for (uint64_t i = 0; i < (uint64_t)rows * cols; i++) {
                uint32_t m = (uint32_t)(i / cols), k = (uint32_t)(i % cols);
                uint32_t a = qt_f32_bits(deq_at(&c, o.deq_col, m, k));
                uint32_t b = qt_f32_bits(deq_at(&ct, ot.deq_row, k, m));
                if (a != b) {
                    CHECK(false, "dequantized columnwise (%u, %u) %08x vs transpose's %08x", m, k,
                          a, b);
                    break;
                }
            }
            check_2d_transpose(&c);
            bout_free(&o);
            bout_free(&ot);
            free(in);
            free(in_t);
        }
    }
    test_end();
}

// Scale_inv that element (m, k) was quantized with, in the direction's layout.
static float scale_inv_at(const bcase *c, const float *si, bool colwise, uint32_t m, uint32_t k) {
    uint32_t tiles_m = (c->rows + 127) / 128, tiles_k = (c->cols + 127) / 128;
    if (c->two_d) {
        return colwise ? si[(k / 128) * tiles_m + m / 128] : si[(m / 128) * tiles_k + k / 128];
    }
    return colwise ? si[(uint64_t)(m / 128) * c->cols + k] : si[(uint64_t)(k / 128) * c->rows + m];
}

// Dequantize(quantize(x)) for finite x in a block without Inf (so |x * s| <= qmax, up to the
// rounding of a non-power-of-two s). With p mantissa bits (E4M3 3, E5M2 2):
//   y = RN(x * s)          relative error 2^-24
//   q = satFP8(y)          normal range: relative error 2^-(p+1); subnormal range: absolute
//                          error half the min subnormal, h = 2^-10 (E4M3) or 2^-17 (E5M2);
//                          a y just above qmax (fp32 scales only) saturates: relative 2^-22
//   d = RN(q * scale_inv)  scale_inv = RN(1/s): two more relative 2^-24, and h becomes h / s
//   BF16 output            relative 2^-9 of |d| <= 2 |x| (plus its subnormal half-step 2^-134)
// so |d - x| <= (2^-(p+1) + 2^-21 [+ 2^-8]) |x| + h * scale_inv * (1 + 2^-20) + 2^-133.
static void check_dequant_bound(const bcase *c, const bout *o, bool colwise) {
    const uint8_t *deq = colwise ? o->deq_col : o->deq_row;
    const float *si = colwise ? o->col_si : o->row_si;
    int p = c->fp8 == QT_BLOCK_E4M3 ? 3 : 2;
    double rel = ldexp(1.0, -(p + 1)) + ldexp(1.0, -21);
    if (c->out_dtype == QT_DTYPE_BF16) rel += ldexp(1.0, -8);
    double h = c->fp8 == QT_BLOCK_E4M3 ? ldexp(1.0, -10) : ldexp(1.0, -17);
    uint32_t failures = 0;
    for (uint32_t m = 0; m < c->rows && failures < 4; m++) {
        for (uint32_t k = 0; k < c->cols && failures < 4; k++) {
            double x = input_at(c, o, m, k), d = deq_at(c, deq, m, k);
            if (isnan(x)) {
                if (!isnan(d)) failures++;
                CHECK(isnan(d), "NaN at (%u, %u) dequantized to %g", m, k, d);
                continue;
            }
            double bound = rel * fabs(x) + h * scale_inv_at(c, si, colwise, m, k) * 1.000001 +
                           ldexp(1.0, -133);
            if (fabs(d - x) > bound) {
                failures++;
                CHECK(false, "%s %s (%u, %u): x %a dequantized %a, error %g > bound %g",
                      c->two_d ? "2-D" : "1-D", colwise ? "columnwise" : "rowwise", m, k, x, d,
                      fabs(d - x), bound);
            }
        }
    }
}

static void test_dequant_error_bound(void) {
    test_begin("block_dequantize_error_bound");
    enum { ROWS = 200, COLS = 300 };
    for (uint32_t v = 0; v < 16; v++) {
        uint32_t dtype = v & 1u;
        void *in = random_input(ROWS, COLS, dtype, 100 + v);
        // Planted: a huge block, tiny and subnormal values, signed zeros and a NaN.
        static const float planted[] = {1e30f, -3e29f, 1e-30f, 0x1p-133f, -0.0f, 0.0f, NAN};
        for (uint32_t i = 0; i < COUNT_OF(planted); i++) {
            uint64_t at = (uint64_t)(37 * i + 5) * COLS + 13 * i;
            if (dtype == QT_DTYPE_BF16) {
                ((uint16_t *)in)[at] = qt_f32_to_bf16(planted[i]);
            } else {
                ((float *)in)[at] = planted[i];
            }
        }
        bcase c = {.name = "bound", .rows = ROWS, .cols = COLS, .in_dtype = dtype,
                   .out_dtype = (v >> 3) & 1u, .fp8 = (v >> 1) & 1u, .two_d = (v >> 2) & 1u,
                   .rowwise = true, .colwise = true, .input = in};
        c.options.fp32_scales = (v % 3) == 0;
        bout o;
        bcase_run(NULL, &c, &o);
        check_dequant_bound(&c, &o, false);
        check_dequant_bound(&c, &o, true);
        bout_free(&o);
        free(in);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// CPU: grouped tensors (ptx/quant.h). Checked against dense casts of each member on its own.

typedef struct bgroup {
    uint32_t count, rows_capacity;
    uint32_t *offsets, *first_dims;
} bgroup;

// Members padded to multiples of 128 rows, packed from row 0; capacity beyond the last member.
static bgroup group_make(const uint32_t *first_dims, uint32_t count, uint32_t extra_rows) {
    bgroup g = {count, 0, malloc(4ull * (count + 1)), malloc(4ull * count + 4)};
    g.offsets[0] = 0;
    for (uint32_t i = 0; i < count; i++) {
        g.first_dims[i] = first_dims[i];
        g.offsets[i + 1] = g.offsets[i] + (first_dims[i] + 127) / 128 * 128;
    }
    g.rows_capacity = g.offsets[count] + extra_rows;
    return g;
}

static void group_free(bgroup *g) {
    free(g->offsets);
    free(g->first_dims);
}

static bool is_sentinel(const void *p, uint64_t bytes) {
    for (uint64_t i = 0; i < bytes; i++) {
        if (((const uint8_t *)p)[i] != BLOCK_SENTINEL) return false;
    }
    return true;
}

// Rows at or beyond the active rows keep the sentinel in every output.
static void check_untouched_tail(const bcase *c, const bout *o, uint32_t active) {
    uint64_t tail = (uint64_t)(c->rows - active) * c->cols;
    uint32_t ob = dtype_bytes(c->out_dtype);
    CHECK(is_sentinel(o->row_codes + (uint64_t)active * c->cols, tail), "rowwise codes written "
          "beyond row %u", active);
    CHECK(is_sentinel(o->deq_row + (uint64_t)active * c->cols * ob, tail * ob) &&
          is_sentinel(o->deq_col + (uint64_t)active * c->cols * ob, tail * ob),
          "dequantized rows written beyond row %u", active);
    for (uint32_t k = 0; k < c->cols; k++) {
        CHECK(is_sentinel(o->col_codes + (uint64_t)k * c->rows + active, c->rows - active),
              "columnwise codes of column %u written beyond row %u", k, active);
    }
    if (c->two_d) return;
    for (uint32_t kb = 0; kb < (c->cols + 127) / 128; kb++) {
        CHECK(is_sentinel(o->row_si + (uint64_t)kb * c->rows + active, 4ull * (c->rows - active)),
              "rowwise scale_inv of block %u written beyond row %u", kb, active);
    }
    uint64_t col_blocks_active = (active + 127) / 128;
    CHECK(is_sentinel(o->col_si + col_blocks_active * c->cols,
                      4ull * (case_si_count(c, true) - col_blocks_active * c->cols)),
          "columnwise scale_inv written beyond row %u", active);
}

// Member i's dense cast: its valid rows, then zero rows up to its padded size.
static void check_member(const bcase *gc, const bgroup *g, const bout *go, uint32_t i) {
    uint32_t off = g->offsets[i], padded = g->offsets[i + 1] - off;
    uint32_t esize = dtype_bytes(gc->in_dtype);
    if (padded == 0) return;
    uint8_t *in = calloc((uint64_t)padded * gc->cols, esize);
    memcpy(in, go->input + (uint64_t)off * gc->cols * esize,
           (uint64_t)g->first_dims[i] * gc->cols * esize);
    bcase c = *gc;
    c.rows = padded;
    c.count = 0;
    c.input = in;
    bout o;
    bcase_run(NULL, &c, &o);
    uint32_t K = gc->cols, tiles_k = (K + 127) / 128, tiles_m = (gc->rows + 127) / 128;
    check_bytes("member rowwise codes", go->row_codes + (uint64_t)off * K, o.row_codes,
                (uint64_t)padded * K);
    for (uint32_t k = 0; k < K; k++) {
        check_bytes("member columnwise codes", go->col_codes + (uint64_t)k * gc->rows + off,
                    o.col_codes + (uint64_t)k * padded, padded);
    }
    for (uint32_t b = 0; b < padded / 128; b++) {
        for (uint32_t kb = 0; kb < tiles_k; kb++) {
            if (!gc->two_d) continue;
            CHECK(f32_bits_at(go->row_si, (off / 128 + b) * tiles_k + kb) ==
                          f32_bits_at(o.row_si, b * tiles_k + kb) &&
                      f32_bits_at(go->col_si, kb * tiles_m + off / 128 + b) ==
                          f32_bits_at(o.col_si, kb * (padded / 128) + b),
                  "member %u 2-D scale_inv of tile (%u, %u)", i, b, kb);
        }
        if (!gc->two_d) {
            check_bytes("member columnwise scale_inv", go->col_si + (uint64_t)(off / 128 + b) * K,
                        o.col_si + (uint64_t)b * K, 4ull * K);
        }
    }
    for (uint32_t kb = 0; kb < tiles_k && !gc->two_d; kb++) {
        check_bytes("member rowwise scale_inv", go->row_si + (uint64_t)kb * gc->rows + off,
                    o.row_si + (uint64_t)kb * padded, 4ull * padded);
    }
    bout_free(&o);
    free(in);
}

// Garbage where no value may leak: the first padding row of every member and every row beyond
// the active rows get Inf and NaN (an Inf reaching an amax would change that block's scale).
static void plant_padding_garbage(void *in, uint32_t dtype, uint32_t cols, const bgroup *g) {
    for (uint32_t i = 0; i <= g->count; i++) {
        uint32_t row = i < g->count ? g->offsets[i] + g->first_dims[i] : g->offsets[g->count];
        bool has_padding = i < g->count ? row < g->offsets[i + 1] : row < g->rows_capacity;
        if (!has_padding) continue;
        for (uint32_t k = 0; k < cols; k++) {
            float v = k % 2 ? INFINITY : NAN;
            uint64_t at = (uint64_t)row * cols + k;
            if (dtype == QT_DTYPE_BF16) {
                ((uint16_t *)in)[at] = qt_f32_to_bf16(v);
            } else {
                ((float *)in)[at] = v;
            }
        }
    }
}

static void run_grouped_ref(const uint32_t *first_dims, uint32_t count, uint32_t extra,
                            uint32_t cols, uint32_t variant) {
    bgroup g = group_make(first_dims, count, extra);
    uint32_t dtype = variant & 1u;
    void *in = random_input(g.rows_capacity, cols, dtype, 500 + variant);
    plant_padding_garbage(in, dtype, cols, &g);
    bcase c = {.name = "grouped", .rows = g.rows_capacity, .cols = cols, .in_dtype = dtype,
               .out_dtype = QT_DTYPE_F32, .fp8 = QT_BLOCK_E4M3, .two_d = (variant >> 1) & 1u,
               .rowwise = true, .colwise = true, .count = count, .offsets = g.offsets,
               .first_dims = g.first_dims, .input = in};
    bout o;
    bcase_run(NULL, &c, &o);
    check_untouched_tail(&c, &o, g.offsets[count]);
    for (uint32_t i = 0; i < count; i++) check_member(&c, &g, &o, i);
    // Padding rows: zero codes in both directions, and rowwise scale_inv 1 (amax 0, eps 0).
    for (uint32_t i = 0; i < count; i++) {
        for (uint32_t m = g.offsets[i] + first_dims[i]; m < g.offsets[i + 1]; m++) {
            CHECK(o.row_codes[(uint64_t)m * cols] == 0 && o.col_codes[(uint64_t)(cols - 1) *
                  g.rows_capacity + m] == 0, "padding row %u of member %u has codes", m, i);
            if (!c.two_d) {
                CHECK(o.row_si[m] == 1.0f, "padding row %u: scale_inv %g", m, o.row_si[m]);
            }
        }
    }
    bout_free(&o);
    free(in);
    group_free(&g);
}

static void test_grouped_ref(void) {
    test_begin("block_grouped_ref_equals_dense_members");
    static const uint32_t a[] = {100, 0, 200, 128};
    static const uint32_t b[] = {0, 0, 150, 0, 1, 0};
    uint32_t many[65];
    for (uint32_t i = 0; i < 65; i++) many[i] = i % 5 == 0 ? 0 : (uint32_t)(qt_mix64(i) % 141);
    for (uint32_t variant = 0; variant < 4; variant++) {
        run_grouped_ref(a, COUNT_OF(a), 128, 200, variant);
        run_grouped_ref(b, COUNT_OF(b), 0, 129, variant);
        run_grouped_ref(many, 65, 256, 64, variant);
    }
    // A group whose members are all empty writes nothing at all.
    static const uint32_t empty[] = {0, 0, 0};
    bgroup g = group_make(empty, 3, 256);
    bcase c = {.name = "grouped_empty", .rows = g.rows_capacity, .cols = 40,
               .in_dtype = QT_DTYPE_BF16, .out_dtype = QT_DTYPE_BF16, .fp8 = QT_BLOCK_E4M3,
               .rowwise = true, .colwise = true, .count = 3, .offsets = g.offsets,
               .first_dims = g.first_dims, .fill_dist = QT_FILL_NORMAL, .fill_b = 1.0f};
    bout o;
    bcase_run(NULL, &c, &o);
    check_untouched_tail(&c, &o, 0);
    bout_free(&o);
    group_free(&g);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU: every kernel against its twin, byte for byte.

static backend gpu_backend;

static void report_code(const char *what, const bcase *c, const bout *g, const bout *r,
                        bool colwise, uint64_t i) {
    uint32_t m = colwise ? (uint32_t)(i % c->rows) : (uint32_t)(i / c->cols);
    uint32_t k = colwise ? (uint32_t)(i / c->rows) : (uint32_t)(i % c->cols);
    const uint8_t *gc = colwise ? g->col_codes : g->row_codes;
    const uint8_t *rc = colwise ? r->col_codes : r->row_codes;
    float x = input_at(c, r, m, k);
    float si = scale_inv_at(c, colwise ? r->col_si : r->row_si, colwise, m, k);
    CHECK(false, "%s code (m %u, k %u): gpu %02x, ref %02x; x %a (%08x), ref scale_inv %a", what,
          m, k, gc[i], rc[i], x, qt_f32_bits(x), si);
}

static void compare_codes(const bcase *c, const bout *g, const bout *r, bool colwise) {
    const uint8_t *gc = colwise ? g->col_codes : g->row_codes;
    const uint8_t *rc = colwise ? r->col_codes : r->row_codes;
    uint64_t mismatches = 0;
    for (uint64_t i = 0; i < case_elems(c); i++) {
        if (gc[i] != rc[i] && mismatches++ < 4) {
            report_code(colwise ? "columnwise" : "rowwise", c, g, r, colwise, i);
        }
    }
    CHECK(mismatches == 0, "%s codes: %llu mismatches", colwise ? "columnwise" : "rowwise",
          (unsigned long long)mismatches);
}

static void compare_scales(const bcase *c, const bout *g, const bout *r, bool colwise) {
    const float *gs = colwise ? g->col_si : g->row_si, *rs = colwise ? r->col_si : r->row_si;
    uint64_t n = case_si_count(c, colwise), mismatches = 0;
    // 1-D rowwise [kb][m], 1-D columnwise [mb][k], 2-D rowwise [tm][tk], 2-D columnwise [tk][tm].
    uint64_t inner = c->two_d ? (colwise ? (c->rows + 127) / 128 : (c->cols + 127) / 128)
                              : (colwise ? c->cols : c->rows);
    for (uint64_t i = 0; i < n; i++) {
        if (f32_bits_at(gs, i) != f32_bits_at(rs, i) && mismatches++ < 4) {
            CHECK(false, "%s scale_inv [%llu][%llu]: gpu %08x (%a), ref %08x (%a)",
                  colwise ? "columnwise" : "rowwise", (unsigned long long)(i / inner),
                  (unsigned long long)(i % inner), f32_bits_at(gs, i), gs[i],
                  f32_bits_at(rs, i), rs[i]);
        }
    }
    CHECK(mismatches == 0, "%s scale_inv: %llu mismatches", colwise ? "columnwise" : "rowwise",
          (unsigned long long)mismatches);
}

static void compare_dequant(const bcase *c, const bout *g, const bout *r, bool colwise) {
    const uint8_t *gd = colwise ? g->deq_col : g->deq_row, *rd = colwise ? r->deq_col : r->deq_row;
    uint32_t ob = dtype_bytes(c->out_dtype);
    uint64_t mismatches = 0;
    for (uint64_t i = 0; i < case_elems(c); i++) {
        if (memcmp(gd + i * ob, rd + i * ob, ob) != 0 && mismatches++ < 4) {
            uint32_t m = (uint32_t)(i / c->cols), k = (uint32_t)(i % c->cols);
            uint64_t code_at = colwise ? (uint64_t)k * c->rows + m : i;
            uint32_t gb = 0, rb = 0;
            memcpy(&gb, gd + i * ob, ob);
            memcpy(&rb, rd + i * ob, ob);
            CHECK(false, "%s dequantized (m %u, k %u): gpu %08x, ref %08x; code %02x", colwise ?
                  "columnwise" : "rowwise", m, k, gb, rb, (colwise ? r->col_codes :
                  r->row_codes)[code_at]);
        }
    }
    CHECK(mismatches == 0, "%s dequantized: %llu mismatches", colwise ? "columnwise" : "rowwise",
          (unsigned long long)mismatches);
}

static void gpu_compare(const bcase *c, const bout *g, const bout *r) {
    check_bytes("input (fill + planted values)", g->input, r->input,
                case_elems(c) * dtype_bytes(c->in_dtype));
    // Every output is compared whole, sentinel bytes included: an unwritten byte on one side and
    // a written one on the other is a mismatch too.
    compare_codes(c, g, r, false);
    compare_codes(c, g, r, true);
    compare_scales(c, g, r, false);
    compare_scales(c, g, r, true);
    compare_dequant(c, g, r, false);
    compare_dequant(c, g, r, true);
}

static void gpu_case(const bcase *c) {
    char name[160];
    snprintf(name, sizeof name, "gpu_block_%s_%s_%ux%u_%s_%s%s%s%s%s%s", c->two_d ? "2d" : "1d",
             c->name, c->rows, c->cols, c->in_dtype == QT_DTYPE_BF16 ? "bf16" : "f32",
             c->fp8 == QT_BLOCK_E5M2 ? "e5m2" : "e4m3", c->options.fp32_scales ? "_f32scales" : "",
             c->options.eps != 0.0f ? "_eps" : "", c->rowwise ? "" : "_colonly",
             c->colwise ? "" : "_rowonly", c->misalign ? "_misaligned" : "");
    test_begin(name);
    bout g, r;
    bcase_run(&gpu_backend, c, &g);
    bcase_run(NULL, c, &r);
    gpu_compare(c, &g, &r);
    bout_free(&g);
    bout_free(&r);
    test_end();
}

// Edge values at scattered positions, one all-NaN rowwise block (row 2) and one all-zero
// columnwise block (the last column), written over the random fill.
typedef struct bplants {
    uint64_t *index;
    float *value;
    uint32_t count;
} bplants;

static bplants plants_make(uint32_t rows, uint32_t cols) {
    static const float edges[] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 0x1.fffffep127f,
                                  0x1.fep127f, 448.0f, 449.0f, 464.0f, 480.0f, 57344.0f,
                                  61440.0f, 1e-40f, 0x1p-133f, -0x1p-149f, 1e30f, -1e-30f,
                                  0x1.1p-8f, 0x1.3p-8f, 0x1p-10f};
    uint64_t n = (uint64_t)rows * cols;
    bplants p = {malloc(8 * (COUNT_OF(edges) + 256)), malloc(4 * (COUNT_OF(edges) + 256)), 0};
    for (uint32_t i = 0; i < COUNT_OF(edges); i++) {
        p.index[p.count] = (qt_mix64(i + 77) % n);
        p.value[p.count++] = edges[i];
    }
    if (rows > 2) {
        for (uint32_t k = 0; k < cols && k < 128; k++) {
            p.index[p.count] = 2ull * cols + k;
            p.value[p.count++] = k % 3 ? NAN : -NAN;
        }
    }
    for (uint32_t m = 0; m < rows && m < 128; m++) {
        p.index[p.count] = (uint64_t)m * cols + cols - 1;
        p.value[p.count++] = m % 2 ? 0.0f : -0.0f;
    }
    return p;
}

// A random case: normal(0, spread) fill from op_fill_random plus the planted edge values.
static void gpu_random_case(bcase c, float spread, uint64_t seed) {
    bplants p = plants_make(c.rows, c.cols);
    c.fill_dist = QT_FILL_NORMAL;
    c.fill_a = 0.0f;
    c.fill_b = spread;
    c.seed = seed;
    c.plant_index = p.index;
    c.plant_value = p.value;
    c.plant_count = p.count;
    gpu_case(&c);
    free(p.index);
    free(p.value);
}

static void gpu_dense_cases(void) {
    static const uint32_t shapes[][2] = {{1, 1}, {1, 1000}, {1000, 1}, {131, 257}, {257, 509},
                                         {128, 128}, {384, 256}, {1024, 2048}, {300, 4100},
                                         {4096, 1024}, {1031, 1033}};
    for (size_t s = 0; s < COUNT_OF(shapes); s++) {
        for (uint32_t v = 0; v < 4; v++) {
            bcase c = {.name = "random", .rows = shapes[s][0], .cols = shapes[s][1],
                       .in_dtype = v & 1u, .out_dtype = (uint32_t)((v + s) & 1u),
                       .fp8 = (v == 3 || s % 4 == 3) ? QT_BLOCK_E5M2 : QT_BLOCK_E4M3,
                       .two_d = v >= 2, .rowwise = true, .colwise = true};
            c.options.fp32_scales = (s % 3 == 1);
            c.options.eps = (s % 5 == 2) ? 1e-3f : 0.0f;
            gpu_random_case(c, s % 2 ? 1000.0f : 0.01f, 1000 + 10 * s + v);
        }
    }
    // One direction only, and every region misaligned (the kernels' scalar paths).
    for (uint32_t v = 0; v < 8; v++) {
        bcase c = {.name = "partial", .rows = v < 4 ? 640 : 257, .cols = v < 4 ? 384 : 509,
                   .in_dtype = v & 1u, .out_dtype = (v >> 1) & 1u, .fp8 = QT_BLOCK_E4M3,
                   .two_d = (v >> 1) & 1u, .rowwise = (v % 3) != 1, .colwise = (v % 3) != 2,
                   .misalign = v >= 4};
        gpu_random_case(c, 3.0f, 2000 + v);
    }
}

// The hardware conversion the kernels use against the codec the twins use, over
// 2^20 - 2^13 FP32 bit patterns per format: every element (m, k) with m % 128 == k % 128 is +Inf,
// so every block in both directions has amax Inf, scale 1 and codes satFP8(x) of the raw input.
// The rest: exponents around the FP8 ranges with random mantissas (3/4), any bit pattern (1/4),
// and planted ties: every midpoint between neighbouring FP8 values and its two FP32 neighbours.
static float *cvt_input(void) {
    enum { N = 1024 };
    float *in = malloc(sizeof(float) * N * N);
    for (uint32_t i = 0; i < N * N; i++) {
        uint64_t r = qt_mix64(0xC0FFEEull + i);
        uint32_t bits = (uint32_t)r;
        if ((r >> 62) != 0) {
            uint32_t exponent = 100u + (uint32_t)((r >> 32) % 50u);  // 2^-27 .. 2^22
            bits = (bits & 0x807FFFFFu) | exponent << 23;
        }
        in[i] = qt_bits_f32(bits);
    }
    uint32_t at = 0;
    for (uint32_t fmt = 0; fmt < 2; fmt++) {
        uint32_t max_code = fmt == QT_BLOCK_E5M2 ? 0x7B : 0x7E;
        for (uint32_t code = 0; code < max_code; code++) {
            float lo = qt_block_decode((uint8_t)code, fmt);
            float hi = qt_block_decode((uint8_t)(code + 1), fmt);
            float mid = 0.5f * (lo + hi);  // exact: both are short binary fractions
            float near[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
            for (int j = 0; j < 6; j++) {
                at += 7;
                in[at] = j < 3 ? near[j] : -near[j - 3];
            }
        }
    }
    for (uint32_t m = 0; m < N; m++) {
        for (uint32_t k = m % 128; k < N; k += 128) in[m * N + k] = INFINITY;
    }
    return in;
}

static void gpu_cvt_cases(void) {
    float *in = cvt_input();
    for (uint32_t fmt = 0; fmt < 2; fmt++) {
        bcase c = {.name = "hw_cvt_vs_codec", .rows = 1024, .cols = 1024,
                   .in_dtype = QT_DTYPE_F32, .out_dtype = QT_DTYPE_F32, .fp8 = fmt,
                   .rowwise = true, .colwise = true, .input = in};
        gpu_case(&c);
    }
    free(in);
}

// Grouped: 1, 3, 64, 65 and 1000 members, uneven, with empty ones, capacity beyond the last.
static void gpu_grouped_cases(void) {
    static const uint32_t counts[] = {1, 3, 64, 65, 1000};
    for (size_t s = 0; s < COUNT_OF(counts); s++) {
        uint32_t count = counts[s];
        uint32_t *dims = malloc(4ull * count);
        for (uint32_t i = 0; i < count; i++) {
            uint64_t r = qt_mix64(31 * count + i);
            dims[i] = r % 7 == 0 ? 0 : (uint32_t)((r >> 8) % (count > 100 ? 140 : 400));
        }
        if (count == 1) dims[0] = 300;
        bgroup g = group_make(dims, count, 256);
        for (uint32_t v = 0; v < 2; v++) {
            bcase c = {.name = "grouped", .rows = g.rows_capacity, .cols = count > 100 ? 72 : 260,
                       .in_dtype = (uint32_t)((s + v) & 1u), .out_dtype = v, .fp8 = QT_BLOCK_E4M3,
                       .two_d = v == 1, .rowwise = true, .colwise = true, .count = count,
                       .offsets = g.offsets, .first_dims = g.first_dims};
            // The fill puts data in padding rows too: the kernels must ignore it.
            gpu_random_case(c, 5.0f, 3000 + 10 * s + v);
        }
        group_free(&g);
        free(dims);
    }
}

static void test_gpu(void) {
    qt_status status = backend_open_gpu(&gpu_backend, 0);
    if (status != QT_OK) {
        test_skip("gpu_block_hw_cvt_vs_codec", qt_error_message());
        test_skip("gpu_block_dense_match_ref_bitwise", qt_error_message());
        test_skip("gpu_block_grouped_match_ref_bitwise", qt_error_message());
        return;
    }
    gpu_cvt_cases();
    gpu_dense_cases();
    gpu_grouped_cases();
    backend_close(&gpu_backend);
}

// ---------------------------------------------------------------------------------------------
// An activation and the cast of its output in one pass (op_quant_block_act) against the
// activation's stored BF16 output cast by op_quant_block, byte for byte (codes and scale_inv of
// both directions), on each backend, and the GPU's fused outputs against the reference
// backend's. Inputs cover the tables' binades and beyond (the out-of-line path), zeros,
// subnormals, Inf and NaN; shapes with partial tiles and with more tiles than the grid has
// blocks (each block then runs several); GELU and SiLU, forward and backward, E4M3 and E5M2,
// power-of-two and FP32 scales, one direction alone.

typedef struct act_mode {
    uint32_t act;
    bool backward;
    uint32_t fp8;
    bool fp32_scales, rowwise, colwise;
} act_mode;

// Regions: [0] the activation then the cast, [1] fused.
typedef struct act_regions {
    arena_handle x, dy, y;
    arena_handle row[2], row_si[2], col[2], col_si[2];
    uint64_t elems, row_si_bytes, col_si_bytes;
} act_regions;

static op_block_tensor act_tensor(rig *r, const act_regions *h, uint32_t rows, uint32_t cols,
                                  const act_mode *md, int w) {
    op_block_tensor t = {0};
    t.rows = rows;
    t.cols = cols;
    t.fp8 = md->fp8;
    t.rowwise = md->rowwise;
    t.colwise = md->colwise;
    t.row_codes = rig_ref(r, h->row[w], 0);
    t.row_scale_inv = rig_ref(r, h->row_si[w], 0);
    t.col_codes = rig_ref(r, h->col[w], 0);
    t.col_scale_inv = rig_ref(r, h->col_si[w], 0);
    t.group = op_group_dense();
    return t;
}

static void act_build(rig *r, uint32_t rows, uint32_t cols, const act_mode *md, act_regions *h) {
    h->elems = (uint64_t)rows * cols;
    h->row_si_bytes = 4 * op_block_scale_count(rows, cols, false, false);
    h->col_si_bytes = 4 * op_block_scale_count(rows, cols, false, true);
    h->x = rig_reserve(r, "x", h->elems * 2);
    h->dy = rig_reserve(r, "dy", h->elems * 2);
    h->y = rig_reserve(r, "y", h->elems * 2);
    for (int w = 0; w < 2; w++) {
        h->row[w] = rig_reserve(r, w ? "row_fused" : "row", h->elems);
        h->row_si[w] = rig_reserve(r, w ? "row_si_fused" : "row_si", h->row_si_bytes);
        h->col[w] = rig_reserve(r, w ? "col_fused" : "col", h->elems);
        h->col_si[w] = rig_reserve(r, w ? "col_si_fused" : "col_si", h->col_si_bytes);
    }
    prog_ref x = rig_ref(r, h->x, 0), dy = rig_ref(r, h->dy, 0), y = rig_ref(r, h->y, 0);
    RIG_OK(rig_act_bf16(r, md->act, md->backward, rows, cols, x, dy, y));
    op_block_options o = {md->fp32_scales, 0.0f};
    op_block_tensor t0 = act_tensor(r, h, rows, cols, md, 0);
    op_block_tensor t1 = act_tensor(r, h, rows, cols, md, 1);
    RIG_OK(op_quant_block(&r->prog, "cast", y, QT_DTYPE_BF16, &t0, &o));
    RIG_OK(op_quant_block_act(&r->prog, "act_cast", md->act, md->backward, x,
                              md->backward ? dy : OP_REF_NONE, &t1, &o));
    rig_bind(r);
}

// Runs the program; returns both ways' outputs, [2][row codes, row scale_inv, col codes, col
// scale_inv] back to back (the caller frees them), after comparing them with each other.
static uint8_t *act_run(rig *r, const act_regions *h, const act_mode *md, const uint16_t *x,
                        const uint16_t *dy, const char *what) {
    uint64_t half = 2 * h->elems + h->row_si_bytes + h->col_si_bytes;
    uint8_t *o = calloc(2, half);
    RIG_OK(backend_write(&r->be, rig_ref(r, h->x, 0), x, h->elems * 2));
    RIG_OK(backend_write(&r->be, rig_ref(r, h->dy, 0), dy, h->elems * 2));
    RIG_OK(backend_run(&r->be, &r->prog));
    for (int w = 0; w < 2; w++) {
        uint8_t *at = o + w * half;
        if (md->rowwise) {
            RIG_OK(backend_read(&r->be, at, rig_ref(r, h->row[w], 0), h->elems));
            RIG_OK(backend_read(&r->be, at + h->elems, rig_ref(r, h->row_si[w], 0),
                                h->row_si_bytes));
        }
        at += h->elems + h->row_si_bytes;
        if (md->colwise) {
            RIG_OK(backend_read(&r->be, at, rig_ref(r, h->col[w], 0), h->elems));
            RIG_OK(backend_read(&r->be, at + h->elems, rig_ref(r, h->col_si[w], 0),
                                h->col_si_bytes));
        }
    }
    check_bytes(what, o + half, o, half);
    return o;
}

// One case: the fused op against the activation then the cast on each backend, and the GPU's
// fused outputs against the reference backend's.
static void act_case(void *modes, rig_pair *rigs, uint32_t rows, uint32_t cols, size_t mode,
                     const uint16_t *x, const uint16_t *dy, const char *name) {
    const act_mode *md = &((const act_mode *)modes)[mode];
    char what[96];
    snprintf(what, sizeof what, "%s, fused against act then cast, ref", name);
    act_regions hr, hg;
    rig_reset(rigs->ref);
    act_build(rigs->ref, rows, cols, md, &hr);
    uint8_t *or = act_run(rigs->ref, &hr, md, x, dy, what);
    if (rigs->on_gpu) {
        rig_reset(rigs->gpu);
        act_build(rigs->gpu, rows, cols, md, &hg);
        snprintf(what, sizeof what, "%s, fused against act then cast, gpu", name);
        uint8_t *og = act_run(rigs->gpu, &hg, md, x, dy, what);
        uint64_t half = 2 * hr.elems + hr.row_si_bytes + hr.col_si_bytes;
        snprintf(what, sizeof what, "%s, fused, gpu against ref", name);
        check_bytes(what, og + half, or + half, half);
        free(og);
    }
    free(or);
}

static void test_act_cast(void) {
    // 2048 x 4096: 512 tiles, more than the grid's 396 blocks.
    static const uint32_t shapes[][2] = {{7, 8},     {128, 128},  {130, 136},
                                         {300, 1000}, {1000, 24}, {2048, 4096}};
    static const act_mode modes[] = {
        {QT_ACT_GELU, false, QT_BLOCK_E4M3, false, true, true},
        {QT_ACT_SILU, false, QT_BLOCK_E5M2, true, true, true},
        {QT_ACT_GELU, true, QT_BLOCK_E5M2, false, true, true},
        {QT_ACT_SILU, true, QT_BLOCK_E4M3, true, true, false},
        {QT_ACT_GELU, false, QT_BLOCK_E4M3, false, false, true},
    };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const size_t n_modes = sizeof modes / sizeof modes[0];
    rig_pair rigs;
    rig_pair_open(&rigs);
    test_begin("block_act_cast_equals_act_then_cast");
    rig_act_cases(&rigs, shapes, n_shapes, (void *)modes, n_modes, n_shapes * 2, 23, act_case);
    test_end();
    rig_pair_close(&rigs, "gpu_block_act_cast_matches_ref");
}

int main(void) {
    test_scale_inv_double_rounding();
    test_scale_rule();
    test_hand_1d_bf16();
    test_hand_1d_f32();
    test_hand_1d_e5m2();
    test_hand_2d();
    test_direction_consistency();
    test_dequant_error_bound();
    test_grouped_ref();
    test_act_cast();
    test_gpu();
    return test_exit_code();
}
