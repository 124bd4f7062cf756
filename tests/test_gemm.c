// GEMM tests (ptx/gemm_portable.cu, runtime/ref/ref_gemm.c, runtime/ops/op_gemm.c).
//
// Each case is a Linear layer's GEMM (fprop, dgrad or wgrad) in one format, dense
// or grouped, with its operands written here directly in the layouts of ptx/quant.h (random codes
// and scales; this file's own layout code, independent of gemm.h's index helpers):
//   CPU: the reference backend's result against an FP64 evaluation of the dequantized operands,
//        exactly on small-integer inputs, within a derived bound on random ones;
//   GPU: the same program on the GPU against the reference backend, bit for bit on small-integer
//        inputs, within a bound on random ones, and bit for bit between two GPU runs.
// Grouped cases include empty members and members of exactly one 128-row tile; M-grouped outputs
// are checked to be zero in padding rows and untouched past the last member. On both backends,
// after every run, every input and guard bytes around every region (D's included) must be
// unchanged (see gregion).
//
// GPU tiers: every GPU case runs twice, on the portable tier (`_gpu`, forced) and with the tier
// left to the backend (`_gpu_sm90a`: the sm_90a tier where it takes the GEMM; skipped on GPUs
// other than compute capability 9.0), each against the reference; on small-integer inputs the
// two tiers must give the same bits. The sm_90a run's repeat uses a grid of 3 CTAs, so that each
// CTA walks many tiles, and must reproduce the full grid's bits. A GEMM that op_gemm gives a
// skinny kernel (ptx/gemm_skinny.cu) runs it in `_gpu` and `_gpu_sm90a` (the tier never takes
// it); its `_gpu_other_tile` run, with a forced tile, is the portable kernel, whose bits it must
// give on every input.
#include <math.h>

#include "runtime/backend/gemm_tier.h"  // gemm_tier_takes, gemm_tier_describe
#include "runtime/qtrain.h"              // qt_device_info
#include "runtime/ops/op_gemm.h"
// pool_start, pool_stop: the reference GEMM on one and three threads
#include "runtime/base/pool.h"
#include "tests/rig.h"
#include "tests/test.h"

// Whether the tier takes op on backend b as its settings stand.
static bool gemm_tier_takes_op(const backend *b, const prog_op *op) {
    gemm_tier_device tier = backend_gemm_device(b);
    return gemm_tier_takes(&tier, op);
}

// ---------------------------------------------------------------------------------------------
// Random numbers (splitmix64), independent of the library's Philox so that the test data does not
// depend on code under test.

static uint64_t rng_state = 1;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(void) { return (double)(rng_next() >> 11) * 0x1p-53; }

static int rng_int(int lo, int hi) { return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1)); }

static double rng_normal(void) {
    double u1 = rng_uniform() + 0x1p-60, u2 = rng_uniform();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// One stored copy of a quantized tensor of logical shape rows x cols, in the layout of quant.h:
//
//   format      rowwise data      rowwise scales        columnwise data   columnwise scales
//   bf16        [R][C] u16        -                     (the same data)   -
//   fp8         [R][C]            f32 [1] / [members]   [C][R]            the same
//   block 1-D   [R][C]            f32 [C/128][R]        [C][R]            f32 [R/128][C]
//   block 2-D   [R][C]            f32 [R/128][C/128]    [C][R]            f32 [C/128][R/128]
//   mxfp8       [R][C]            e8m0 [R][C/32]        [R][C]            e8m0 [R/32][C]
//   nvfp4       [R][C/2] packed   e4m3 [R][C/16]        [C][R/2] packed   e4m3 [C][R/16]
//
// (divisions round up). Rows whose member is TT_PADDING hold zero codes.
#define TT_PADDING UINT32_MAX

typedef struct ttensor {
    uint32_t format, elem;
    bool colwise, two_d;
    uint32_t rows, cols;
    const uint32_t *row_member;  // grouped: member of each row or TT_PADDING; NULL: dense
    uint8_t *data;
    size_t data_bytes;
    uint8_t *scale;
    size_t scale_bytes;
    float *tscale;  // fp8 scale_inv, nvfp4 amax: [1] dense, [members] grouped
    uint32_t tscale_count;
} ttensor;

static size_t tt_scale_entries(const ttensor *t) {
    uint32_t r = t->rows, c = t->cols;
    switch (t->format) {
    case GEMM_FORMAT_FP8_BLOCK:
        if (t->two_d) return (size_t)ceil_div(r, 128) * ceil_div(c, 128);
        return t->colwise ? (size_t)ceil_div(r, 128) * c : (size_t)ceil_div(c, 128) * r;
    case GEMM_FORMAT_MXFP8:
        return t->colwise ? (size_t)ceil_div(r, 32) * c : (size_t)r * ceil_div(c, 32);
    case GEMM_FORMAT_NVFP4:
        return t->colwise ? (size_t)c * ceil_div(r, 16) : (size_t)r * ceil_div(c, 16);
    default:
        return 0;
    }
}

static size_t tt_scale_index(const ttensor *t, uint32_t r, uint32_t c) {
    uint32_t rows = t->rows, cols = t->cols;
    switch (t->format) {
    case GEMM_FORMAT_FP8_BLOCK:
        if (t->two_d) {
            return t->colwise ? (size_t)(c / 128) * ceil_div(rows, 128) + r / 128
                              : (size_t)(r / 128) * ceil_div(cols, 128) + c / 128;
        }
        return t->colwise ? (size_t)(r / 128) * cols + c : (size_t)(c / 128) * rows + r;
    case GEMM_FORMAT_MXFP8:
        return t->colwise ? (size_t)(r / 32) * cols + c : (size_t)r * ceil_div(cols, 32) + c / 32;
    default:  // nvfp4
        return t->colwise ? (size_t)c * ceil_div(rows, 16) + r / 16
                          : (size_t)r * ceil_div(cols, 16) + c / 16;
    }
}

// Element index (bf16: u16 index; nvfp4: byte index with *shift the nibble's bit position).
static size_t tt_data_index(const ttensor *t, uint32_t r, uint32_t c, uint32_t *shift) {
    *shift = 0;
    switch (t->format) {
    case GEMM_FORMAT_BF16:
    case GEMM_FORMAT_MXFP8:
        return (size_t)r * t->cols + c;
    case GEMM_FORMAT_FP8:
    case GEMM_FORMAT_FP8_BLOCK:
        return t->colwise ? (size_t)c * t->rows + r : (size_t)r * t->cols + c;
    default:  // nvfp4
        if (t->colwise) {
            *shift = 4 * (r & 1);
            return (size_t)c * ceil_div(t->rows, 2) + r / 2;
        }
        *shift = 4 * (c & 1);
        return (size_t)r * ceil_div(t->cols, 2) + c / 2;
    }
}

static void tt_alloc(ttensor *t, uint32_t format, uint32_t elem, bool colwise, bool two_d,
                     uint32_t rows, uint32_t cols, const uint32_t *row_member,
                     uint32_t tscale_count) {
    memset(t, 0, sizeof *t);
    t->format = format;
    t->elem = elem;
    t->colwise = colwise;
    t->two_d = two_d;
    t->rows = rows;
    t->cols = cols;
    t->row_member = row_member;
    if (format == GEMM_FORMAT_BF16) {
        t->data_bytes = (size_t)rows * cols * 2;
    } else if (format == GEMM_FORMAT_NVFP4) {
        t->data_bytes = colwise ? (size_t)cols * ceil_div(rows, 2)
                                : (size_t)rows * ceil_div(cols, 2);
    } else {
        t->data_bytes = (size_t)rows * cols;
    }
    t->scale_bytes = tt_scale_entries(t) * (format == GEMM_FORMAT_FP8_BLOCK ? 4 : 1);
    t->data = calloc(t->data_bytes + 16, 1);
    t->scale = calloc(t->scale_bytes + 16, 1);
    t->tscale_count = tscale_count;
    t->tscale = calloc(tscale_count, sizeof(float));
}

static void tt_free(ttensor *t) {
    free(t->data);
    free(t->scale);
    free(t->tscale);
}

static uint32_t tt_member(const ttensor *t, uint32_t r) {
    return t->row_member ? t->row_member[r] : 0u;
}

// ---------------------------------------------------------------------------------------------
// Random contents. `ints`: every decoded value is a small multiple of 1/2 and every scale a power
// of two near 1 (nvfp4: amax 2688, so alpha' is exactly alpha), so all products and partial sums
// of the test sizes are exact in FP32, and in the FP8 tensor cores' narrower accumulators too
// (|partial sums| < 2^11 with 13 mantissa bits).

static uint8_t gen_fp8(uint32_t elem, bool ints) {
    double v = ints ? rng_int(-2, 2) : rng_normal() * (elem == GEMM_ELEM_E5M2 ? 2000.0 : 60.0);
    return elem == GEMM_ELEM_E5M2 ? qt_f32_to_e5m2((float)v) : qt_f32_to_e4m3((float)v);
}

static uint32_t gen_code(const ttensor *t, bool ints) {
    switch (t->format) {
    case GEMM_FORMAT_BF16:
        return qt_f32_to_bf16((float)(ints ? rng_int(-2, 2) : rng_normal()));
    case GEMM_FORMAT_NVFP4:
        if (ints) return qt_f32_to_e2m1((float)(rng_int(-4, 4) * 0.5));
        return (uint32_t)(rng_next() & 0xF);
    default:
        return gen_fp8(t->elem, ints);
    }
}

static void gen_scales(ttensor *t, bool ints) {
    size_t n = tt_scale_entries(t);
    for (size_t i = 0; i < n; i++) {
        if (t->format == GEMM_FORMAT_FP8_BLOCK) {
            static const float pow2[3] = {0.5f, 1.0f, 2.0f};
            float s = ints ? pow2[rng_int(0, 2)] : (float)(0.002 + 0.018 * rng_uniform());
            memcpy(t->scale + 4 * i, &s, 4);
        } else if (t->format == GEMM_FORMAT_MXFP8) {
            t->scale[i] = (uint8_t)(ints ? rng_int(126, 128) : rng_int(118, 131));
        } else {
            t->scale[i] = ints ? (rng_int(0, 1) ? 0x38 : 0x40)
                               : qt_f32_to_e4m3((float)(0.05 + 50.0 * rng_uniform()));
        }
    }
    for (uint32_t i = 0; i < t->tscale_count; i++) {
        static const float pow2[3] = {0.5f, 1.0f, 2.0f};
        if (t->format == GEMM_FORMAT_FP8) {
            t->tscale[i] = ints ? pow2[rng_int(0, 2)] : (float)(0.001 + 0.02 * rng_uniform());
        } else if (t->format == GEMM_FORMAT_NVFP4) {
            t->tscale[i] = ints ? 2688.0f : (float)(1.0 + 1000.0 * rng_uniform());
        }
    }
}

static void tt_fill(ttensor *t, bool ints) {
    for (uint32_t r = 0; r < t->rows; r++) {
        bool padding = tt_member(t, r) == TT_PADDING;
        for (uint32_t c = 0; c < t->cols; c++) {
            uint32_t code = padding ? 0u : gen_code(t, ints), shift;
            size_t i = tt_data_index(t, r, c, &shift);
            if (t->format == GEMM_FORMAT_BF16) {
                ((uint16_t *)t->data)[i] = (uint16_t)code;
            } else {
                t->data[i] = (uint8_t)(t->data[i] | (code << shift));
            }
        }
    }
    gen_scales(t, ints);
}

// The dequantized value of logical element (r, c), exactly (nvfp4's global factor amax / 2688 up
// to one FP64 rounding).
static double tt_value(const ttensor *t, uint32_t r, uint32_t c) {
    uint32_t shift;
    size_t i = tt_data_index(t, r, c, &shift);
    uint32_t member = tt_member(t, r);
    float ts = t->tscale_count ? t->tscale[member == TT_PADDING ? 0 : member] : 1.0f;
    switch (t->format) {
    case GEMM_FORMAT_BF16:
        return qt_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case GEMM_FORMAT_FP8: {
        double code = qt_gemm_fp8_value(t->data[i], t->elem);
        return code * ts;
    }
    case GEMM_FORMAT_FP8_BLOCK: {
        float s;
        memcpy(&s, t->scale + 4 * tt_scale_index(t, r, c), 4);
        return (double)qt_gemm_fp8_value(t->data[i], t->elem) * s;
    }
    case GEMM_FORMAT_MXFP8: {
        int e = t->scale[tt_scale_index(t, r, c)];
        return ldexp(qt_gemm_fp8_value(t->data[i], t->elem), e - 127);
    }
    default: {
        double q = qt_e2m1_to_f32((uint8_t)((t->data[i] >> shift) & 0xF));
        double sb = qt_e4m3_to_f32(t->scale[tt_scale_index(t, r, c)]);
        return q * sb * ts / 2688.0;
    }
    }
}

// ---------------------------------------------------------------------------------------------
// A GEMM case: a Linear layer with x [T][in], W [out][in], dy [T][out] (grouped: T = capacity
// rows of the grouped x and dy, one W per member).

typedef enum tkind { KIND_FPROP, KIND_DGRAD, KIND_WGRAD } tkind;

typedef struct tcase {
    uint32_t format;
    tkind kind;
    bool ints;
    uint32_t tokens;  // dense T
    uint32_t in_features, out_features;
    uint32_t members;        // 0: dense
    const uint32_t *sizes;   // grouped: valid rows of each member
    bool bias;               // fprop: bias add (bf16 with bf16 output, else f32)
    bool accumulate;         // D = ... + beta D (C aliases D)
    bool out_bf16;
    bool split;              // per-tensor fp8: split accumulation
    bool e5m2_grad;          // fp8 kinds: dy in E5M2
    bool want_sm90a;         // the sm_90a tier must take it (on a compute capability 9.0 GPU)
    int want_auto;           // AUTO's shape rule: 1 takes the sm_90a tier, -1 does not, 0 either
    bool want_scale_groups;  // MXFP8 on the sm_90a tier: scales in groups by TMA
    uint32_t split_parts;    // split-K parts (dense), 0: none
    uint32_t skinny;         // 1 + the skinny kind (GEMM_SKINNY_*) op_gemm must pick; 0: unchecked
    bool b_inner;            // grouped dgrad (fp8, fp8 block, nvfp4): the stacked weights'
                             // columnwise copy as one tensor, [in][members x out], members side
                             // by side in its rows (as an moe layer stores them)
    const char *tag;         // distinguishes cases of one kind
} tcase;

#define D_UNTOUCHED 2u  // element status: M-grouped rows past the last member
#define D_PADDING 1u    // M-grouped padding rows: zeros
#define D_VALID 0u

typedef struct tproblem {
    tcase c;
    char name[128];
    uint32_t m, n, k, count, cap;
    uint32_t grouping;
    float alpha, beta;
    uint32_t *off, *fd, *row_member;
    ttensor a;
    ttensor *b;
    uint32_t b_count;
    bool b_stacked;
    uint32_t d_dtype;
    size_t d_elems;
    uint8_t *d_init;   // initial D: C values (accumulate) or a sentinel
    uint8_t *bias;     // [bias_count][n]
    uint32_t bias_count;
    uint32_t bias_dtype;
    double *expect, *sum_abs, *extra;  // per D element: value, sum |a b|, |beta c| + |bias|
    uint32_t *k_len;
    uint8_t *status;
} tproblem;

static const char *format_name(uint32_t f) {
    static const char *names[] = {"bf16", "fp8", "fp8_block", "mxfp8", "nvfp4"};
    return names[f];
}

static uint32_t format_row_align(uint32_t f) {
    return f == GEMM_FORMAT_FP8_BLOCK ? 128u : f == GEMM_FORMAT_MXFP8 ? 32u : 16u;
}

static uint32_t format_elem(uint32_t f, bool grad, bool e5m2_grad) {
    if (f == GEMM_FORMAT_BF16) return GEMM_ELEM_BF16;
    if (f == GEMM_FORMAT_NVFP4) return GEMM_ELEM_E2M1;
    return grad && e5m2_grad ? GEMM_ELEM_E5M2 : GEMM_ELEM_E4M3;
}

static bool format_tensor_scaled(uint32_t f) {
    return f == GEMM_FORMAT_FP8 || f == GEMM_FORMAT_NVFP4;
}

static uint32_t sentinel_bits(uint32_t dtype) { return dtype == QT_DTYPE_BF16 ? 0xFFFFu : ~0u; }

static uint32_t out_bits(uint32_t dtype, const uint8_t *d, size_t i) {
    if (dtype == QT_DTYPE_BF16) return ((const uint16_t *)d)[i];
    return ((const uint32_t *)d)[i];
}

static double out_value(uint32_t dtype, const uint8_t *d, size_t i) {
    uint32_t bits = out_bits(dtype, d, i);
    return dtype == QT_DTYPE_BF16 ? qt_bf16_to_f32((uint16_t)bits) : qt_bits_f32(bits);
}

static void out_store(uint32_t dtype, uint8_t *d, size_t i, float v) {
    if (dtype == QT_DTYPE_BF16) {
        ((uint16_t *)d)[i] = qt_f32_to_bf16(v);
    } else {
        memcpy(d + 4 * i, &v, 4);
    }
}

static uint32_t expect_bits(uint32_t dtype, double e) {
    float f = (float)e;
    return dtype == QT_DTYPE_BF16 ? qt_f32_to_bf16(f) : qt_f32_bits(f);
}

// Group layout: members padded to the format's row alignment, plus one alignment of spare
// capacity past the last member (rows the GEMM must not touch).
static void problem_group(tproblem *p) {
    const tcase *c = &p->c;
    if (c->members == 0) {
        p->cap = c->tokens;
        return;
    }
    uint32_t align = format_row_align(c->format);
    p->count = c->members;
    p->off = calloc(p->count + 1, sizeof(uint32_t));
    p->fd = calloc(p->count, sizeof(uint32_t));
    for (uint32_t i = 0; i < p->count; i++) {
        p->fd[i] = c->sizes[i];
        p->off[i + 1] = p->off[i] + ceil_div(c->sizes[i], align) * align;
    }
    p->cap = p->off[p->count] + align;
    p->row_member = malloc(p->cap * sizeof(uint32_t));
    for (uint32_t r = 0; r < p->cap; r++) p->row_member[r] = TT_PADDING;
    for (uint32_t i = 0; i < p->count; i++) {
        for (uint32_t r = p->off[i]; r < p->off[i] + p->fd[i]; r++) p->row_member[r] = i;
    }
}

// The tensors of the case: A's copy and B's copies (one per member when stacked weights).
static void problem_tensors(tproblem *p) {
    const tcase *c = &p->c;
    uint32_t f = c->format;
    bool grouped = c->members != 0;
    uint32_t group_ts = format_tensor_scaled(f) ? (grouped ? p->count : 1u) : 0u;
    uint32_t one_ts = format_tensor_scaled(f) ? 1u : 0u;
    bool two_d = f == GEMM_FORMAT_FP8_BLOCK && c->kind != KIND_WGRAD;
    uint32_t x_elem = format_elem(f, false, false), g_elem = format_elem(f, true, c->e5m2_grad);
    uint32_t in = c->in_features, out = c->out_features;
    if (c->kind == KIND_WGRAD) {
        tt_alloc(&p->a, f, g_elem, true, false, p->cap, out, p->row_member, group_ts);
        p->b_count = 1;
        p->b = calloc(1, sizeof(ttensor));
        tt_alloc(&p->b[0], f, x_elem, true, false, p->cap, in, p->row_member, group_ts);
        tt_fill(&p->b[0], c->ints);
    } else {
        bool fprop = c->kind == KIND_FPROP;
        tt_alloc(&p->a, f, fprop ? x_elem : g_elem, false, false, p->cap, fprop ? in : out,
                 p->row_member, group_ts);
        p->b_count = grouped ? p->count : 1u;
        p->b_stacked = grouped;
        p->b = calloc(p->b_count, sizeof(ttensor));
        for (uint32_t i = 0; i < p->b_count; i++) {
            tt_alloc(&p->b[i], f, x_elem, !fprop, two_d, out, in, NULL, one_ts);
            tt_fill(&p->b[i], c->ints);
        }
    }
    tt_fill(&p->a, c->ints);
}

static double problem_a(const tproblem *p, uint32_t m, uint32_t k) {
    return p->c.kind == KIND_WGRAD ? tt_value(&p->a, k, m) : tt_value(&p->a, m, k);
}

static double problem_b(const tproblem *p, uint32_t member, uint32_t n, uint32_t k) {
    const ttensor *b = &p->b[p->b_stacked ? member : 0];
    return p->c.kind == KIND_FPROP ? tt_value(b, n, k) : tt_value(b, k, n);
}

// D's initial contents (C when accumulating, else a sentinel) and the bias.
static void problem_epilogue_data(tproblem *p) {
    const tcase *c = &p->c;
    size_t esz = p->d_dtype == QT_DTYPE_BF16 ? 2 : 4;
    p->d_init = malloc(p->d_elems * esz);
    for (size_t i = 0; i < p->d_elems; i++) {
        if (c->accumulate) {
            out_store(p->d_dtype, p->d_init, i, (float)(c->ints ? rng_int(-3, 3) : rng_normal()));
        } else if (p->d_dtype == QT_DTYPE_BF16) {
            ((uint16_t *)p->d_init)[i] = (uint16_t)sentinel_bits(p->d_dtype);
        } else {
            ((uint32_t *)p->d_init)[i] = sentinel_bits(p->d_dtype);
        }
    }
    if (!c->bias) return;
    p->bias_count = p->count ? p->count : 1u;
    p->bias_dtype = c->out_bf16 ? QT_DTYPE_BF16 : QT_DTYPE_F32;
    p->bias = malloc((size_t)p->bias_count * p->n * 4);
    for (size_t i = 0; i < (size_t)p->bias_count * p->n; i++) {
        out_store(p->bias_dtype, p->bias, i, (float)(c->ints ? rng_int(-3, 3) : rng_normal()));
    }
}

// FP64 evaluation of every D element from the dequantized operands, with the sums of |a b| and
// of the epilogue terms' magnitudes that the tolerances scale with.
static void problem_expect(tproblem *p) {
    const tcase *c = &p->c;
    size_t n_el = p->d_elems;
    p->expect = calloc(n_el, sizeof(double));
    p->sum_abs = calloc(n_el, sizeof(double));
    p->extra = calloc(n_el, sizeof(double));
    p->k_len = calloc(n_el, sizeof(uint32_t));
    p->status = calloc(n_el, 1);
    // The dequantized operands, once (A as the GEMM reads it, B per stacked member), so that each
    // product below is one FP64 multiply even for training-sized shapes.
    uint32_t b_members = p->b_stacked ? p->b_count : 1u;
    double *a_all = malloc(((size_t)p->m * p->k + 1) * sizeof(double));
    double *b_all = malloc(((size_t)b_members * p->n * p->k + 1) * sizeof(double));
    for (uint32_t m = 0; m < p->m; m++) {
        for (uint32_t k = 0; k < p->k; k++) a_all[(size_t)m * p->k + k] = problem_a(p, m, k);
    }
    for (uint32_t i = 0; i < b_members; i++) {
        for (uint32_t n = 0; n < p->n; n++) {
            for (uint32_t k = 0; k < p->k; k++) {
                b_all[((size_t)i * p->n + n) * p->k + k] = problem_b(p, i, n, k);
            }
        }
    }
    uint32_t parts = p->grouping == GEMM_GROUP_K ? p->count : 1u;
    for (uint32_t i = 0; i < parts; i++) {
        for (uint32_t m = 0; m < p->m; m++) {
            uint32_t member = i, k0 = 0, k1 = p->k;
            uint8_t status = D_VALID;
            if (p->grouping == GEMM_GROUP_M) {
                member = p->row_member[m];
                if (member == TT_PADDING) status = m < p->off[p->count] ? D_PADDING : D_UNTOUCHED;
            } else if (p->grouping == GEMM_GROUP_K) {
                k0 = p->off[i];
                k1 = p->off[i] + p->fd[i];
            }
            for (uint32_t n = 0; n < p->n; n++) {
                size_t idx = ((size_t)i * p->m + m) * p->n + n;
                p->status[idx] = status;
                if (status != D_VALID) continue;
                double acc = 0, s = 0;
                const double *a_row = a_all + (size_t)m * p->k;
                const double *b_row =
                    b_all + ((size_t)(p->b_stacked ? member : 0) * p->n + n) * p->k;
                for (uint32_t k = k0; k < k1; k++) {
                    double prod = a_row[k] * b_row[k];
                    acc += prod;
                    s += fabs(prod);
                }
                double cv = c->accumulate ? out_value(p->d_dtype, p->d_init, idx) : 0.0;
                double bv = c->bias ? out_value(p->bias_dtype, p->bias, (size_t)member * p->n + n)
                                    : 0.0;
                p->expect[idx] = p->alpha * acc + p->beta * cv + bv;
                p->sum_abs[idx] = s;
                p->extra[idx] = fabs(p->beta * cv) + fabs(bv);
                p->k_len[idx] = k1 - k0;
            }
        }
    }
    free(a_all);
    free(b_all);
}

static void case_name(const tcase *c, char *name, size_t size) {
    static const char *kinds[] = {"fprop", "dgrad", "wgrad"};
    char split[24] = "";
    if (c->split_parts > 1) snprintf(split, sizeof split, "_splitk%u", c->split_parts);
    snprintf(name, size, "gemm_%s_%s_%s_%s%s%s%s", format_name(c->format), kinds[c->kind],
             c->members ? "grouped" : "dense", c->ints ? "ints" : "random", split,
             c->tag ? "_" : "", c->tag ? c->tag : "");
}

static void problem_init(tproblem *p, const tcase *c) {
    memset(p, 0, sizeof *p);
    p->c = *c;
    case_name(c, p->name, sizeof p->name);
    problem_group(p);
    problem_tensors(p);
    p->grouping = c->members == 0 ? GEMM_DENSE
                  : c->kind == KIND_WGRAD ? GEMM_GROUP_K
                                          : GEMM_GROUP_M;
    p->m = c->kind == KIND_WGRAD ? c->out_features : p->cap;
    p->n = c->kind == KIND_DGRAD || c->kind == KIND_WGRAD ? c->in_features : c->out_features;
    p->k = c->kind == KIND_FPROP ? c->in_features
           : c->kind == KIND_DGRAD ? c->out_features
                                   : p->cap;
    p->alpha = c->ints ? (c->kind == KIND_DGRAD ? 0.5f : 1.0f) : 0.75f;
    p->beta = c->accumulate ? (c->ints ? 1.0f : 0.5f) : 0.0f;
    p->d_dtype = c->out_bf16 ? QT_DTYPE_BF16 : QT_DTYPE_F32;
    p->d_elems = (size_t)(p->grouping == GEMM_GROUP_K ? p->count : 1u) * p->m * p->n;
    problem_epilogue_data(p);
    problem_expect(p);
}

static void problem_free(tproblem *p) {
    tt_free(&p->a);
    for (uint32_t i = 0; i < p->b_count; i++) tt_free(&p->b[i]);
    free(p->b);
    free(p->off);
    free(p->fd);
    free(p->row_member);
    free(p->d_init);
    free(p->bias);
    free(p->expect);
    free(p->sum_abs);
    free(p->extra);
    free(p->k_len);
    free(p->status);
}

// ---------------------------------------------------------------------------------------------
// Programs on a rig: reserve, build the op with op_gemm, bind, upload.

// Guarded regions. Every region of a case is reserved with GUARD_BYTES of a fill pattern on each
// side of its payload, and after every run, on either backend, the whole region must still hold
// what was uploaded: the guards of all regions and the payloads of the inputs (operands, scales,
// tensor scales, bias, group offsets). D's own payload is checked by the result checks (rows an
// M-grouped GEMM must not touch keep D's initial bits). A write outside D's written extent lands
// in the same arena allocation, which memcheck cannot see and which a comparison of D alone
// notices only when it corrupts an input that a later run reads.
#define GUARD_BYTES 256u  // keeps the payload 256-byte aligned, as rig_reserve's regions are
#define GUARD_FILL 0xA5u

typedef struct gregion {
    const char *name;
    arena_handle h;
    uint64_t bytes;  // payload
    uint8_t *image;  // the bytes the region must hold: guard, payload, guard
    bool output;     // the payload is the op's output: only the guards are checked
} gregion;

static void greg_reserve(rig *r, gregion *g, const char *name, uint64_t bytes, bool output) {
    uint64_t total = bytes + 2 * GUARD_BYTES;
    g->name = name;
    g->bytes = bytes;
    g->output = output;
    g->h = rig_reserve(r, name, total);
    g->image = malloc(total);
    memset(g->image, GUARD_FILL, total);
    memset(g->image + GUARD_BYTES, 0, bytes);
}

static prog_ref greg_ref(rig *r, const gregion *g) { return rig_ref(r, g->h, GUARD_BYTES); }

// Uploads the whole region: the guards and the payload, whose first n bytes come from src (the
// rest zero). After rig_bind.
static void greg_upload(rig *r, gregion *g, const void *src, uint64_t n) {
    if (n) memcpy(g->image + GUARD_BYTES, src, n);
    RIG_OK(backend_write(&r->be, rig_ref(r, g->h, 0), g->image, g->bytes + 2 * GUARD_BYTES));
}

static void greg_check(rig *r, const gregion *g, const char *when) {
    uint64_t total = g->bytes + 2 * GUARD_BYTES;
    uint8_t *now = malloc(total);
    RIG_OK(backend_read(&r->be, now, rig_ref(r, g->h, 0), total));
    uint64_t bad = 0, first = 0, last = 0;
    for (uint64_t i = 0; i < total; i++) {
        if (g->output && i >= GUARD_BYTES && i < GUARD_BYTES + g->bytes) continue;
        if (now[i] == g->image[i]) continue;
        if (bad++ == 0) first = i;
        last = i;
    }
    // Offsets are relative to the payload: negative in the front guard, >= bytes in the back one.
    CHECK(bad == 0, "%s: %llu bytes of region '%s' (%llu payload bytes%s) changed, at payload "
          "offsets %lld ... %lld; first 0x%02x, was 0x%02x", when, (unsigned long long)bad,
          g->name, (unsigned long long)g->bytes, g->output ? ", an output" : "",
          (long long)first - (long long)GUARD_BYTES, (long long)last - (long long)GUARD_BYTES,
          now[first], g->image[first]);
    free(now);
}

static void greg_free(gregion *g) { free(g->image); }

enum { R_A_DATA, R_A_SCALE, R_A_TS, R_B_DATA, R_B_SCALE, R_B_TS, R_D, R_BIAS, R_OFF, R_FD,
       R_SPLIT, R_UNITS, R_D_MAX, R_COUNT };

typedef struct tregions {
    gregion r[R_COUNT];
    bool d_max_written;  // op_gemm_writes_d_max of the case's GEMM
} tregions;

static void regions_check(rig *r, const tregions *g, const char *when) {
    for (int i = 0; i < R_COUNT; i++) greg_check(r, &g->r[i], when);
}

static void regions_free(tregions *g) {
    for (int i = 0; i < R_COUNT; i++) greg_free(&g->r[i]);
}

static rig ref_rig, gpu_rig;
static bool gpu_ok;
static char gpu_why[256];
static uint32_t tile_forced = OP_GEMM_TILE_AUTO;  // the portable tier's tile of the next runs
static bool sm90a_ok;  // the GPU can run the sm_90a tier
static char sm90a_why[256];
static uint32_t sm90a_taken, sm90a_cases;  // GPU cases the sm_90a tier took, of those run

// The sm_90a tier's repeat runs use this many CTAs (results must not depend on the grid).
#define SM90A_REPEAT_CTAS 3u

static void rig_execute(rig *r) { RIG_OK(backend_run(&r->be, &r->prog)); }

// All B copies back to back (stacked weights: member strides are one copy's sizes).
static uint8_t *concat_b(const tproblem *p, int what, size_t *bytes) {
    size_t each = what == 0 ? p->b[0].data_bytes
                  : what == 1 ? p->b[0].scale_bytes
                              : p->b[0].tscale_count * sizeof(float);
    uint8_t *all = malloc(each * p->b_count + 1);
    for (uint32_t i = 0; i < p->b_count; i++) {
        const void *src = what == 0 ? (const void *)p->b[i].data
                          : what == 1 ? (const void *)p->b[i].scale
                                      : (const void *)p->b[i].tscale;
        memcpy(all + each * i, src, each);
    }
    *bytes = each * p->b_count;
    return all;
}

// The members' transposed columnwise B copies ([in][out] each) side by side in the rows of one
// tensor, [in][members x out] (b_inner): data, or the block scales (fp8 block 2-D: rows of
// ceil(in / 128); nvfp4: rows of in), each member's row of a copy after the previous member's.
static uint8_t *interleave_b(const tproblem *p, bool scales, size_t *bytes) {
    const ttensor *t = &p->b[0];
    size_t each = scales ? t->scale_bytes : t->data_bytes;
    uint32_t rows = scales && t->format == GEMM_FORMAT_FP8_BLOCK ? ceil_div(t->cols, 128)
                                                                 : t->cols;
    size_t row_bytes = each / rows;
    CHECK(row_bytes * rows == each, "b_inner: whole rows");
    uint8_t *all = malloc(each * p->b_count + 1);
    for (uint32_t i = 0; i < p->b_count; i++) {
        const uint8_t *src = scales ? p->b[i].scale : p->b[i].data;
        for (uint32_t r = 0; r < rows; r++) {
            memcpy(all + (r * (size_t)p->b_count + i) * row_bytes, src + r * row_bytes,
                   row_bytes);
        }
    }
    *bytes = each * p->b_count;
    return all;
}

static op_gemm_operand problem_operand(rig *r, const tproblem *p, const ttensor *t,
                                       const gregion *data, const gregion *scale,
                                       const gregion *ts) {
    prog_ref none = {0};
    prog_ref s = t->scale_bytes ? greg_ref(r, scale) : none;
    prog_ref tsr = t->tscale_count ? greg_ref(r, ts) : none;
    op_gemm_operand o = op_gemm_operand_of(p->c.format, t->elem, t->rows, t->cols, t->colwise,
                                           t->two_d, greg_ref(r, data), s, tsr);
    if (p->count && t->tscale_count) o.flags |= GEMM_OPERAND_TENSOR_PER_MEMBER;
    return o;
}

// The norm units of the case's D (gemm.h), each K-grouped member's D's in member order; 0 where
// the GEMM cannot have them.
static uint64_t problem_units(const tproblem *p) {
    bool fit = (p->grouping == GEMM_DENSE || p->grouping == GEMM_GROUP_K) &&
               p->d_dtype == QT_DTYPE_F32 && !p->c.accumulate && !p->c.bias;
    uint64_t members = p->grouping == GEMM_GROUP_K ? p->count : 1u;
    return fit ? members * qt_gemm_norm_unit_count(p->m, p->n) : 0;
}

// The units of D as stored, written out from gemm.h's statement of the order (not through its
// helpers): lane l's elements in (j, h, e) order, each fma(v, v, acc), then the lane tree.
static void units_expect(const tproblem *p, const float *d_all, float *sums, uint32_t *flags) {
    uint32_t unit_cols = ceil_div(p->n, 64);
    uint64_t units = problem_units(p);
    uint64_t per_member = (uint64_t)ceil_div(p->m, 16) * unit_cols;
    for (uint64_t u = 0; u < units; u++) {
        const float *d = d_all + (size_t)(u / per_member) * p->m * p->n;  // its member's D
        uint64_t own = u % per_member;
        uint32_t s0 = (uint32_t)(own / unit_cols) * 16, c0 = (uint32_t)(own % unit_cols) * 64;
        float lane[32];
        uint32_t bad = 0;
        for (uint32_t l = 0; l < 32; l++) {
            lane[l] = 0.0f;
            for (uint32_t j = 0; j < 8; j++) {
                for (uint32_t h = 0; h < 2; h++) {
                    for (uint32_t e = 0; e < 2; e++) {
                        uint32_t row = s0 + l / 4 + 8 * h, col = c0 + 8 * j + 2 * (l % 4) + e;
                        if (row >= p->m || col >= p->n) continue;
                        float v = d[(size_t)row * p->n + col];
                        lane[l] = fmaf(v, v, lane[l]);
                        bad |= !isfinite(v);
                    }
                }
            }
        }
        for (uint32_t w = 16; w > 0; w >>= 1) {
            for (uint32_t i = 0; i < w; i++) lane[i] = lane[i] + lane[i + w];
        }
        sums[u] = lane[0];
        flags[u] = bad;
    }
}

// The units a run wrote against those of the D it wrote, bit for bit.
static void problem_units_check(rig *r, const tproblem *p, const tregions *g, const uint8_t *d,
                                const char *when) {
    uint64_t units = problem_units(p);
    if (units == 0) return;
    uint8_t *got = malloc(units * 8), *want = malloc(units * 8);
    RIG_OK(backend_read(&r->be, got, greg_ref(r, &g->r[R_UNITS]), units * 8));
    units_expect(p, (const float *)d, (float *)want, (uint32_t *)(want + units * 4));
    for (uint64_t u = 0; u < 2 * units; u++) {
        uint32_t a, b;
        memcpy(&a, got + 4 * u, 4);
        memcpy(&b, want + 4 * u, 4);
        if (a == b) continue;
        CHECK(false, "%s: norm unit %s %llu of %llu is 0x%08x, D's is 0x%08x", when,
              u < units ? "sum" : "flag", (unsigned long long)(u % units),
              (unsigned long long)units, a, b);
        break;
    }
    free(got);
    free(want);
}

// D's maximum slot (gemm.h, gemm_args.d_max): every dense case has one, so that every kernel's
// path to it is compared; the kernels that op_gemm gives none (split, skinny) must leave it +0.
// The value is written out from gemm.h's statement (the largest non-NaN value of D as stored,
// floored at +0), not through its helpers.
static void problem_d_max_check(rig *r, const tproblem *p, const tregions *g, const uint8_t *d,
                                const char *when) {
    if (p->grouping != GEMM_DENSE) return;
    uint32_t got;
    RIG_OK(backend_read(&r->be, &got, greg_ref(r, &g->r[R_D_MAX]), 4));
    double largest = 0.0;
    for (size_t i = 0; i < p->d_elems; i++) {
        double v = out_value(p->d_dtype, d, i);
        if (v > largest) largest = v;  // NaN skipped
    }
    uint32_t want = g->d_max_written ? qt_f32_bits((float)largest) : 0u;
    CHECK(got == want, "%s: D's maximum slot 0x%08x, want 0x%08x (%s)", when, got, want,
          g->d_max_written ? "D's largest value" : "untouched");
}

static void problem_program(rig *r, const tproblem *p, tregions *g) {
    size_t b_data_bytes, b_scale_bytes, b_ts_bytes;
    bool inner = p->c.b_inner;
    uint8_t *b_data = inner ? interleave_b(p, false, &b_data_bytes) : concat_b(p, 0, &b_data_bytes);
    uint8_t *b_scale = inner ? interleave_b(p, true, &b_scale_bytes)
                             : concat_b(p, 1, &b_scale_bytes);
    uint8_t *b_ts = concat_b(p, 2, &b_ts_bytes);
    size_t d_bytes = p->d_elems * (p->d_dtype == QT_DTYPE_BF16 ? 2 : 4);
    gregion *R = g->r;
    greg_reserve(r, &R[R_A_DATA], "a_data", p->a.data_bytes, false);
    greg_reserve(r, &R[R_A_SCALE], "a_scale", p->a.scale_bytes, false);
    greg_reserve(r, &R[R_A_TS], "a_ts", p->a.tscale_count * sizeof(float), false);
    greg_reserve(r, &R[R_B_DATA], "b_data", b_data_bytes, false);
    greg_reserve(r, &R[R_B_SCALE], "b_scale", b_scale_bytes, false);
    greg_reserve(r, &R[R_B_TS], "b_ts", b_ts_bytes, false);
    greg_reserve(r, &R[R_D], "d", d_bytes, true);
    greg_reserve(r, &R[R_BIAS], "bias", (uint64_t)p->bias_count * p->n * 4, false);
    greg_reserve(r, &R[R_OFF], "row_offsets", (p->count + 1) * sizeof(uint32_t), false);
    greg_reserve(r, &R[R_FD], "first_dims", p->count * sizeof(uint32_t), false);
    op_gemm_desc desc = {0};
    desc.m = p->m;
    desc.n = p->n;
    desc.split_parts = p->c.split_parts;
    greg_reserve(r, &R[R_SPLIT], "split", op_gemm_workspace_bytes(&desc, desc.split_parts), true);
    if (desc.split_parts > 1) desc.workspace = greg_ref(r, &R[R_SPLIT]);
    // Every GEMM that can have norm units (a weight gradient's: f32 D, dense or one per K-grouped
    // member, no C, no bias) has them, so that every kernel's path to them is compared
    // (problem_units_check).
    greg_reserve(r, &R[R_UNITS], "norm_units", problem_units(p) * 8, true);
    if (problem_units(p)) desc.norm_units = greg_ref(r, &R[R_UNITS]);
    bool dense = p->grouping == GEMM_DENSE;
    greg_reserve(r, &R[R_D_MAX], "d_max", dense ? 4 : 0, true);
    if (dense) desc.d_max = greg_ref(r, &R[R_D_MAX]);
    desc.format = p->c.format;
    desc.grouping = p->grouping;
    desc.flags = p->c.split ? GEMM_FLAG_SPLIT_ACCUMULATE : 0u;
    desc.tile = tile_forced;
    desc.m = p->m;
    desc.n = p->n;
    desc.k = p->k;
    desc.a = problem_operand(r, p, &p->a, &R[R_A_DATA], &R[R_A_SCALE], &R[R_A_TS]);
    desc.b = problem_operand(r, p, &p->b[0], &R[R_B_DATA], &R[R_B_SCALE], &R[R_B_TS]);
    if (p->b_stacked && inner) {
        // One stacked weight of members x out rows, read through its columnwise copy.
        const ttensor *t = &p->b[0];
        prog_ref none = {0};
        desc.b = op_gemm_operand_of(p->c.format, t->elem, p->b_count * t->rows, t->cols, true,
                                    t->two_d, greg_ref(r, &R[R_B_DATA]),
                                    t->scale_bytes ? greg_ref(r, &R[R_B_SCALE]) : none,
                                    t->tscale_count ? greg_ref(r, &R[R_B_TS]) : none);
        op_gemm_operand_stack(&desc.b, p->c.format, t->two_d, true, t->rows, t->cols);
    } else if (p->b_stacked) {
        desc.b.data_member_bytes = p->b[0].data_bytes;
        desc.b.scale_member_bytes = p->b[0].scale_bytes;
    }
    if (p->b_stacked && p->b[0].tscale_count) desc.b.flags |= GEMM_OPERAND_TENSOR_PER_MEMBER;
    desc.alpha = p->alpha;
    desc.d = greg_ref(r, &R[R_D]);
    desc.d_dtype = p->d_dtype;
    if (p->c.accumulate) {
        desc.c = desc.d;  // accumulate in place: C aliases D
        desc.beta = p->beta;
    }
    if (p->c.bias) {
        desc.bias = greg_ref(r, &R[R_BIAS]);
        desc.bias_dtype = p->bias_dtype;
        desc.bias_member_bytes = p->count ? (uint64_t)p->n * (p->bias_dtype == QT_DTYPE_BF16 ? 2
                                                                                         : 4)
                                          : 0;
    }
    if (p->count) {
        desc.count = p->count;
        desc.row_offsets = greg_ref(r, &R[R_OFF]);
        desc.first_dims = greg_ref(r, &R[R_FD]);
    }
    RIG_OK(op_gemm(&r->prog, p->name, &desc));
    g->d_max_written = op_gemm_writes_d_max(&desc);
    rig_bind(r);
    greg_upload(r, &R[R_A_DATA], p->a.data, p->a.data_bytes);
    greg_upload(r, &R[R_A_SCALE], p->a.scale, p->a.scale_bytes);
    greg_upload(r, &R[R_A_TS], p->a.tscale, p->a.tscale_count * sizeof(float));
    greg_upload(r, &R[R_B_DATA], b_data, b_data_bytes);
    greg_upload(r, &R[R_B_SCALE], b_scale, b_scale_bytes);
    greg_upload(r, &R[R_B_TS], b_ts, b_ts_bytes);
    greg_upload(r, &R[R_D], p->d_init, d_bytes);
    // The bias region holds bias_count x n f32 slots; a bf16 bias uses the first half.
    size_t bias_bytes = (size_t)p->bias_count * p->n * (p->bias_dtype == QT_DTYPE_BF16 ? 2 : 4);
    greg_upload(r, &R[R_BIAS], p->bias, p->c.bias ? bias_bytes : 0);
    greg_upload(r, &R[R_OFF], p->off, p->count ? (p->count + 1) * sizeof(uint32_t) : 0);
    greg_upload(r, &R[R_FD], p->fd, p->count * sizeof(uint32_t));
    greg_upload(r, &R[R_SPLIT], NULL, 0);
    greg_upload(r, &R[R_UNITS], NULL, 0);
    greg_upload(r, &R[R_D_MAX], NULL, 0);
    free(b_data);
    free(b_scale);
    free(b_ts);
}

// ---------------------------------------------------------------------------------------------
// Tolerances.

// Reference twin vs FP64 (random inputs). The twin multiplies decoded values whose products are
// exact in FP32 (for the generated MXFP8 scales the BF16 rounding of the decode is exact, and
// NVFP4's decode always is), and sums them in FP32: sequentially, |error| <= gamma_K sum|p| with
// gamma_K ~ K u, u = 2^-24; per 128-wide block plus one promotion (an exact power-of-two scale
// product or a rounded one, and a fused multiply-add) per block, <= (K + 2 K / 128) u sum|p|.
// alpha' costs <= 3 u relative (nvfp4 also f32(1/7225344)'s 0.23 u), RN(alpha' acc) u, the C and
// bias additions u each of their own magnitude: (K + 2 K / 128 + 8) u bounds all of it. A BF16
// output adds its rounding, half an ulp = 2^-9 relative; 2^-8 leaves room for the test's own
// rounding of the FP64 value.
static double tol_ref(const tproblem *p, size_t i) {
    const double u = 0x1p-24;
    double k = p->k_len[i];
    double t = (k + 2.0 * k / 128.0 + 8.0) * u * (fabs(p->alpha) * p->sum_abs[i] + p->extra[i]);
    if (p->d_dtype == QT_DTYPE_BF16) t += 0x1p-8 * fabs(p->expect[i]);
    return t;
}

// GPU vs reference twin (random inputs): both errors against the exact value, added. The FP8
// tensor cores keep 13 mantissa bits of the running sum across chained mma (truncated), so each
// k32 step may lose 2^-13 of |running sum| <= sum|p|, plus the alignment of the step's own
// products: fast accumulation (K/32 + 2) 2^-12 sum|p|; with split accumulation or block scaling
// only 4 steps chain before an FP32 promotion: 6 2^-12. BF16 tensor cores keep (at least) 22
// bits: (K/16 + 2) 2^-20. Outputs: two roundings may fall on adjacent values, one ulp (BF16
// 2^-7 relative to be safe; F32 2^-21 covers RN(alpha' acc) too).
static double tol_gpu(const tproblem *p, size_t i, double ref) {
    const double u = 0x1p-24;
    double k = p->k_len[i];
    uint32_t f = p->c.format;
    double per;
    if (f == GEMM_FORMAT_FP8 && !p->c.split) {
        per = (k / 32.0 + 2.0) * 0x1p-12;
    } else if (f == GEMM_FORMAT_FP8 || f == GEMM_FORMAT_FP8_BLOCK) {
        per = 6.0 * 0x1p-12;
    } else {
        per = (k / 16.0 + 2.0) * 0x1p-20;
    }
    per += (k + 2.0 * k / 128.0 + 8.0) * u;
    double t = per * fabs(p->alpha) * p->sum_abs[i] + 8.0 * u * p->extra[i];
    return t + (p->d_dtype == QT_DTYPE_BF16 ? 0x1p-7 : 0x1p-21) * fabs(ref);
}

// ---------------------------------------------------------------------------------------------
// Checks. Failures print the element (member, row, column), the values and the bound.

static void element_position(const tproblem *p, size_t i, uint32_t *member, uint32_t *row,
                             uint32_t *col) {
    *col = (uint32_t)(i % p->n);
    *row = (uint32_t)((i / p->n) % p->m);
    *member = (uint32_t)(i / ((size_t)p->n * p->m));
    if (p->grouping == GEMM_GROUP_M && p->row_member[*row] != TT_PADDING) {
        *member = p->row_member[*row];
    }
}

static const char *status_name(uint8_t s) {
    return s == D_UNTOUCHED ? "untouched" : s == D_PADDING ? "padding" : "valid";
}

// Expected bits of a non-valid element: untouched keeps D's initial bits, padding is zero.
static bool fixed_ok(const tproblem *p, const uint8_t *d, size_t i) {
    uint32_t bits = out_bits(p->d_dtype, d, i);
    if (p->status[i] == D_UNTOUCHED) return bits == out_bits(p->d_dtype, p->d_init, i);
    return bits == 0;
}

static void check_ref_result(const tproblem *p, const uint8_t *d) {
    uint64_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < p->d_elems; i++) {
        double v = out_value(p->d_dtype, d, i), e = p->expect[i], tol = 0;
        bool ok;
        if (p->status[i] != D_VALID) {
            ok = fixed_ok(p, d, i);
        } else if (p->c.ints) {
            ok = out_bits(p->d_dtype, d, i) == expect_bits(p->d_dtype, e);
        } else {
            tol = tol_ref(p, i);
            ok = fabs(v - e) <= tol;
            if (tol > 0 && fabs(v - e) / tol > worst) worst = fabs(v - e) / tol;
        }
        if (!ok && bad++ < 6) {
            uint32_t member, row, col;
            element_position(p, i, &member, &row, &col);
            CHECK(false, "member %u row %u col %u (%s): ref %.9g (0x%08x), expected %.9g, "
                  "bound %.3g, k %u", member, row, col, status_name(p->status[i]), v,
                  out_bits(p->d_dtype, d, i), e, tol, p->k_len[i]);
        }
    }
    CHECK(bad == 0, "%llu of %zu elements outside (worst error / bound %.3g)",
          (unsigned long long)bad, p->d_elems, worst);
}

static void check_gpu_result(const tproblem *p, const uint8_t *gpu, const uint8_t *ref) {
    uint64_t bad = 0;
    for (size_t i = 0; i < p->d_elems; i++) {
        uint32_t gb = out_bits(p->d_dtype, gpu, i), rb = out_bits(p->d_dtype, ref, i);
        double g = out_value(p->d_dtype, gpu, i), r = out_value(p->d_dtype, ref, i), tol = 0;
        bool ok;
        if (p->status[i] != D_VALID || p->c.ints) {
            ok = gb == rb;
        } else {
            tol = tol_gpu(p, i, r);
            ok = fabs(g - r) <= tol || (isnan(g) && isnan(r));
        }
        if (!ok && bad++ < 6) {
            uint32_t member, row, col;
            element_position(p, i, &member, &row, &col);
            CHECK(false, "member %u row %u col %u (%s): gpu %.9g (0x%08x), ref %.9g (0x%08x), "
                  "bound %.3g, k %u", member, row, col, status_name(p->status[i]), g, gb, r, rb,
                  tol, p->k_len[i]);
        }
    }
    CHECK(bad == 0, "%llu of %zu elements differ", (unsigned long long)bad, p->d_elems);
}

// Compares a later run's D with the first run's; reports the first differing element.
static void check_same_d(const tproblem *p, const uint8_t *first_run, const uint8_t *again,
                         const char *what) {
    size_t esz = p->d_dtype == QT_DTYPE_BF16 ? 2 : 4, bytes = p->d_elems * esz, first = 0;
    while (first < bytes && again[first] == first_run[first]) first++;
    if (first == bytes) return;
    size_t i = first / esz;
    uint32_t member, row, col;
    element_position(p, i, &member, &row, &col);
    CHECK(false, "%s differs first at byte %zu of %zu: member %u row %u col %u (%s), 0x%08x, "
          "first run 0x%08x", what, first, bytes, member, row, col, status_name(p->status[i]),
          out_bits(p->d_dtype, again, i), out_bits(p->d_dtype, first_run, i));
}

static void run_on(rig *r, const tproblem *p, uint8_t *d_out) {
    tregions g;
    rig_reset(r);
    problem_program(r, p, &g);
    const gregion *d = &g.r[R_D];
    size_t d_bytes = p->d_elems * (p->d_dtype == QT_DTYPE_BF16 ? 2 : 4);
    rig_execute(r);
    RIG_OK(backend_read(&r->be, d_out, greg_ref(r, d), d_bytes));
    regions_check(r, &g, "first run");
    problem_units_check(r, p, &g, d_out, "first run");
    problem_d_max_check(r, p, &g, d_out, "first run");
    if (r != &gpu_rig) {
        // The reference GEMM's tiles are tasks of the thread pool and each element sums in k
        // order, so its bytes do not depend on the threads: again from the same initial D on
        // one thread and on three.
        uint8_t *again = malloc(d_bytes);
        uint32_t threads = pool_threads();
        for (uint32_t other = 1; other <= 3; other += 2) {
            pool_stop();
            pool_start(other);
            RIG_OK(backend_write(&r->be, greg_ref(r, d), p->d_init, d_bytes));
            rig_execute(r);
            RIG_OK(backend_read(&r->be, again, greg_ref(r, d), d_bytes));
            check_same_d(p, d_out, again, other == 1 ? "one thread" : "three threads");
        }
        pool_stop();
        pool_start(threads);
        free(again);
        regions_free(&g);
        return;
    }
    // Second GPU run from the same initial D (C aliases D when accumulating): same bits. On the
    // sm_90a tier, from a grid of a few CTAs that each walk many tiles.
    uint8_t *again = malloc(d_bytes);
    const uint32_t zero = 0;  // each run's D maximum its own
    RIG_OK(backend_write(&r->be, greg_ref(r, d), p->d_init, d_bytes));
    if (g.r[R_D_MAX].bytes) RIG_OK(backend_write(&r->be, greg_ref(r, &g.r[R_D_MAX]), &zero, 4));
    if (r->be.gemm_tier != BACKEND_GEMM_TIER_PORTABLE) r->be.gemm_ctas_max = SM90A_REPEAT_CTAS;
    rig_execute(r);
    r->be.gemm_ctas_max = 0;
    RIG_OK(backend_read(&r->be, again, greg_ref(r, d), d_bytes));
    check_same_d(p, d_out, again, "second GPU run");
    regions_check(r, &g, "second run");
    problem_d_max_check(r, p, &g, again, "second GPU run");
    if (r->be.kind == BACKEND_GPU) {
        // A captured graph replay (launch shapes depend on capacities only): same bits again.
        backend_graph graph;
        RIG_OK(backend_write(&r->be, greg_ref(r, d), p->d_init, d_bytes));
        if (g.r[R_D_MAX].bytes) {
            RIG_OK(backend_write(&r->be, greg_ref(r, &g.r[R_D_MAX]), &zero, 4));
        }
        uint64_t units_bytes = problem_units(p) * 8;
        if (units_bytes) {  // so that the replay's units are its own
            uint8_t *zeros = calloc(units_bytes, 1);
            RIG_OK(backend_write(&r->be, greg_ref(r, &g.r[R_UNITS]), zeros, units_bytes));
            free(zeros);
        }
        RIG_OK(backend_capture(&r->be, &r->prog, &graph));
        RIG_OK(backend_launch(&r->be, &graph));
        RIG_OK(backend_read(&r->be, again, greg_ref(r, d), d_bytes));
        backend_graph_destroy(&r->be, &graph);
        check_same_d(p, d_out, again, "graph replay");
        regions_check(r, &g, "graph replay");
        problem_units_check(r, p, &g, again, "graph replay");
        problem_d_max_check(r, p, &g, again, "graph replay");
    }
    free(again);
    regions_free(&g);
}

// The same case on the sm_90a tier wherever it supports the GEMM (tier SM90A): against the
// reference, and bit for bit against the portable tier on small-integer inputs. Then AUTO's
// choice for the shape, where the case states it.
static void run_case_sm90a(const tproblem *p, const uint8_t *d_ref, const uint8_t *d_portable) {
    char name[176];
    snprintf(name, sizeof name, "%s_gpu_sm90a", p->name);
    if (!sm90a_ok) {
        test_skip(name, sm90a_why);
        return;
    }
    size_t d_bytes = p->d_elems * (p->d_dtype == QT_DTYPE_BF16 ? 2 : 4);
    uint8_t *d = malloc(d_bytes);
    test_begin(name);
    gpu_rig.be.gemm_tier = BACKEND_GEMM_TIER_SM90A;
    run_on(&gpu_rig, p, d);
    bool taken = gemm_tier_takes_op(&gpu_rig.be, &gpu_rig.prog.ops[0]);
    sm90a_cases++;
    sm90a_taken += taken;
    CHECK(taken || !p->c.want_sm90a, "the sm_90a tier did not take the GEMM");
    gemm_args args;
    memcpy(&args, gpu_rig.prog.ops[0].args, sizeof args);
    CHECK(!p->c.want_scale_groups || gemm_tier_scale_groups(&args),
          "the MXFP8 scales do not come in groups by TMA");
    gpu_rig.be.gemm_tier = BACKEND_GEMM_TIER_AUTO;
    bool auto_takes = gemm_tier_takes_op(&gpu_rig.be, &gpu_rig.prog.ops[0]);
    CHECK(p->c.want_auto == 0 || auto_takes == (p->c.want_auto > 0),
          "AUTO chose the %s tier for a GEMM of %u x %u", auto_takes ? "sm_90a" : "portable", p->m,
          p->n);
    check_gpu_result(p, d, d_ref);
    if (p->c.ints) check_same_d(p, d_portable, d, "sm_90a tier vs portable tier");
    test_end();
    gpu_rig.be.gemm_tier = BACKEND_GEMM_TIER_PORTABLE;
    free(d);
}

// The same case on the portable tier with the tile op_gemm did not pick (the last GPU run's):
// the same bits, since both tiles give every element of D the same sequence of tensor-core
// instructions. Where op_gemm picked a skinny kernel, any forced tile runs the portable kernel
// instead, with the same sequence again (gemm.h "Skinny GEMMs"): the skinny kernel's check.
static void run_case_other_tile(const tproblem *p, const uint8_t *d_portable) {
    char name[176];
    snprintf(name, sizeof name, "%s_gpu_other_tile", p->name);
    gemm_args picked;
    memcpy(&picked, gpu_rig.prog.ops[0].args, sizeof picked);
    size_t d_bytes = p->d_elems * (p->d_dtype == QT_DTYPE_BF16 ? 2 : 4);
    uint8_t *d = malloc(d_bytes);
    test_begin(name);
    tile_forced = picked.tile == GEMM_TILE_SMALL ? OP_GEMM_TILE_LARGE : OP_GEMM_TILE_SMALL;
    run_on(&gpu_rig, p, d);
    tile_forced = OP_GEMM_TILE_AUTO;
    check_same_d(p, d_portable, d, "the other tile vs op_gemm's tile");
    test_end();
    free(d);
}

// QT_TEST_GEMM_CASES=text runs only the GEMM cases whose name contains `text` (a sanitizer run
// of a few cases); unset, all of them.
static const char *case_filter;

// The skinny kind of a program's GEMM op, GEMM_SKINNY_NONE for a portable kernel.
static uint32_t skinny_of_op(const prog_op *op) {
    switch (op->kernel) {
    case KERNEL_GEMM_BF16_SKINNY_N: return GEMM_SKINNY_N;
    case KERNEL_GEMM_BF16_SKINNY_M: return GEMM_SKINNY_M;
    default: return GEMM_SKINNY_NONE;
    }
}

static void run_case(const tcase *c) {
    if (case_filter) {
        char name[160];
        case_name(c, name, sizeof name);
        if (!strstr(name, case_filter)) return;
    }
    if (!test_shard_take()) return;
    tproblem p;
    problem_init(&p, c);
    size_t d_bytes = p.d_elems * (p.d_dtype == QT_DTYPE_BF16 ? 2 : 4);
    uint8_t *d_ref = malloc(d_bytes);
    test_begin(p.name);
    run_on(&ref_rig, &p, d_ref);
    check_ref_result(&p, d_ref);
    uint32_t skinny = skinny_of_op(&ref_rig.prog.ops[0]);
    CHECK(c->skinny == 0 || skinny == c->skinny - 1, "op_gemm picked skinny kind %u, expected %u",
          skinny, c->skinny - 1);
    if (c->want_sm90a) {
        // The tier's rule is plain C over the op's args: checked here too, GPU or not.
        gemm_args args;
        memcpy(&args, ref_rig.prog.ops[0].args, sizeof args);
        CHECK(gemm_tier_sm90a_supports(&args), "the sm_90a tier's rule refuses the GEMM");
    }
    test_end();
    char gpu_name[160];
    snprintf(gpu_name, sizeof gpu_name, "%s_gpu", p.name);
    if (!gpu_ok) {
        test_skip(gpu_name, gpu_why);
        snprintf(gpu_name, sizeof gpu_name, "%s_gpu_other_tile", p.name);
        test_skip(gpu_name, gpu_why);
        snprintf(gpu_name, sizeof gpu_name, "%s_gpu_sm90a", p.name);
        test_skip(gpu_name, gpu_why);
    } else {
        uint8_t *d_gpu = malloc(d_bytes);
        test_begin(gpu_name);
        gpu_rig.be.gemm_tier = BACKEND_GEMM_TIER_PORTABLE;
        run_on(&gpu_rig, &p, d_gpu);
        check_gpu_result(&p, d_gpu, d_ref);
        test_end();
        run_case_other_tile(&p, d_gpu);
        run_case_sm90a(&p, d_ref, d_gpu);
        free(d_gpu);
    }
    free(d_ref);
    problem_free(&p);
}

// ---------------------------------------------------------------------------------------------
// The case list.

static const uint32_t group_sizes[] = {37, 0, 128, 1, 90};  // odd, empty, one tile, one row

static tcase base_case(uint32_t format, tkind kind, bool grouped, bool ints) {
    tcase c = {0};
    c.format = format;
    c.kind = kind;
    c.ints = ints;
    c.tokens = 150;
    c.in_features = 160;
    c.out_features = 72;
    if (grouped) {
        c.members = sizeof group_sizes / sizeof group_sizes[0];
        c.sizes = group_sizes;
    }
    c.bias = kind == KIND_FPROP;
    c.out_bf16 = kind != KIND_WGRAD;
    c.accumulate = kind == KIND_WGRAD;
    // TE's defaults: per-tensor fprop uses fast accumulation, dgrad and wgrad split it.
    c.split = format == GEMM_FORMAT_FP8 && kind != KIND_FPROP;
    c.e5m2_grad = format == GEMM_FORMAT_FP8 ||
                  (format == GEMM_FORMAT_FP8_BLOCK && kind == KIND_DGRAD) ||
                  (format == GEMM_FORMAT_MXFP8 && kind == KIND_WGRAD);
    return c;
}

// Every format x {fprop, dgrad, wgrad} x {dense, grouped} x {small integers, random}.
static void run_matrix(void) {
    for (uint32_t f = 0; f < GEMM_FORMAT_COUNT; f++) {
        for (int kind = KIND_FPROP; kind <= KIND_WGRAD; kind++) {
            for (int grouped = 0; grouped < 2; grouped++) {
                for (int ints = 1; ints >= 0; ints--) {
                    tcase c = base_case(f, (tkind)kind, grouped != 0, ints != 0);
                    run_case(&c);
                }
            }
        }
    }
}

static uint32_t *many_sizes(uint32_t count, uint32_t modulus) {
    uint32_t *sizes = malloc(count * sizeof(uint32_t));
    for (uint32_t i = 0; i < count; i++) sizes[i] = (i * 7u + 3u) % modulus;  // zeros included
    return sizes;
}

static void run_odd_shapes(void) {
    static const uint32_t one_block[GEMM_FORMAT_COUNT] = {32, 128, 128, 32, 16};
    for (uint32_t f = 0; f < GEMM_FORMAT_COUNT; f++) {
        tcase c = base_case(f, KIND_FPROP, false, false);
        c.tokens = 1;
        c.tag = "m1";
        run_case(&c);
        c = base_case(f, KIND_FPROP, false, true);
        c.tokens = 130;  // a second row tile of 2 rows
        c.out_features = 136;  // a second column tile of 8 columns
        c.tag = "m130_n136";
        run_case(&c);
        c = base_case(f, KIND_FPROP, false, false);
        c.tokens = 64;
        c.in_features = one_block[f];
        c.tag = "k_one_block";
        run_case(&c);
        c = base_case(f, KIND_WGRAD, false, false);
        c.tokens = 1;  // a contraction of one row
        c.tag = "k1";
        run_case(&c);
    }
    tcase c = base_case(GEMM_FORMAT_FP8, KIND_DGRAD, false, false);
    c.split = false;
    c.tag = "fast_accumulation";
    run_case(&c);
    c = base_case(GEMM_FORMAT_FP8, KIND_FPROP, true, false);
    c.split = true;
    c.tag = "split_accumulation";
    run_case(&c);
    c = base_case(GEMM_FORMAT_BF16, KIND_FPROP, false, true);
    c.in_features = 37;  // rows of 74 bytes: the misaligned path
    c.tag = "k37";
    run_case(&c);
    c = base_case(GEMM_FORMAT_FP8, KIND_FPROP, false, false);
    c.in_features = 100;  // fp8 rows of 100 bytes
    c.tag = "k100";
    run_case(&c);
}

// Shapes the sm_90a tier takes (rows of multiples of 16 bytes; K-major operands, or outer-major
// BF16): every format it covers x {fprop, dgrad, wgrad} x {dense, grouped} x {small integers,
// random}; the cases it leaves to the portable tier (MXFP8 with an outer-major operand, K-grouped
// MXFP8 and NVFP4 wgrad) run too. Then the persistent scheduler: more tiles than SMs at the full
// grid, M = 1, one K stage.
// The aligned shapes: one per format.
static const struct {
    uint32_t format, tokens, in_features;
} sm90a_aligned[] = {{GEMM_FORMAT_BF16, 272, 160},       {GEMM_FORMAT_FP8, 272, 160},
                     {GEMM_FORMAT_FP8_BLOCK, 272, 160},  {GEMM_FORMAT_MXFP8, 288, 192},
                     {GEMM_FORMAT_NVFP4, 288, 192}};

// The aligned shapes in every format, each kind, dense and grouped, integer and random data.
static void run_sm90a_aligned(void) {
    // The emulated formats get rows of multiples of 16 bytes for NVFP4 too (192 and 96 k), and
    // contractions of 192, 96 (one stage and a half) and 288. MXFP8 dgrad and wgrad have an
    // outer-major operand, and the tier takes no K-grouped NVFP4: those stay portable. The
    // K-grouped members' k tails (37 and 90 rows, the next member's rows after them) are
    // masked by the tier.
    for (size_t i = 0; i < sizeof sm90a_aligned / sizeof sm90a_aligned[0]; i++) {
        uint32_t f = sm90a_aligned[i].format;
        bool outer_major_grads = f == GEMM_FORMAT_MXFP8;
        for (int kind = KIND_FPROP; kind <= KIND_WGRAD; kind++) {
            for (int grouped = 0; grouped < 2; grouped++) {
                for (int ints = 1; ints >= 0; ints--) {
                    tcase c = base_case(f, (tkind)kind, grouped != 0, ints != 0);
                    c.tokens = sm90a_aligned[i].tokens;
                    c.in_features = sm90a_aligned[i].in_features;
                    c.out_features = 96;
                    c.want_sm90a = !(grouped && kind == KIND_WGRAD && qt_gemm_sm90a_emulated(f)) &&
                                   !(outer_major_grads && kind != KIND_FPROP);
                    c.want_auto = -1;  // at most 9 tiles: AUTO keeps the portable tier
                    c.tag = "aligned";
                    run_case(&c);
                }
            }
        }
    }
}

static void run_sm90a_shapes(void) {
    run_sm90a_aligned();
    // Per-tensor fp8: split accumulation in fprop, fast accumulation of an E5M2 dgrad.
    tcase c = base_case(GEMM_FORMAT_FP8, KIND_FPROP, false, false);
    c.split = true;
    c.tokens = 272;
    c.want_sm90a = true;
    c.tag = "aligned_split";
    run_case(&c);
    c = base_case(GEMM_FORMAT_FP8, KIND_DGRAD, true, false);
    c.split = false;
    c.out_features = 96;
    c.want_sm90a = true;
    c.tag = "aligned_fast";
    run_case(&c);
    // FP32 D, with a bias (dense, small integers) and without (M-grouped, random), through the
    // staged epilogue; the wgrad cases above add C, which keeps the register stores.
    for (size_t i = 0; i < sizeof sm90a_aligned / sizeof sm90a_aligned[0]; i++) {
        for (int bias = 1; bias >= 0; bias--) {
            c = base_case(sm90a_aligned[i].format, KIND_FPROP, bias == 0, bias != 0);
            c.tokens = sm90a_aligned[i].tokens;
            c.in_features = sm90a_aligned[i].in_features;
            c.out_features = 96;
            c.out_bf16 = false;
            c.bias = bias != 0;
            c.want_sm90a = true;
            c.want_auto = -1;
            c.tag = bias ? "f32_bias" : "f32";
            run_case(&c);
        }
    }
    static const uint32_t all[] = {GEMM_FORMAT_BF16, GEMM_FORMAT_FP8, GEMM_FORMAT_FP8_BLOCK,
                                   GEMM_FORMAT_MXFP8, GEMM_FORMAT_NVFP4};
    static const uint32_t one_stage[] = {64, 128, 128, 64, 64};  // k of one sm_90a stage
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        c = base_case(all[i], KIND_FPROP, false, false);
        c.tokens = 1;
        if (qt_gemm_sm90a_emulated(all[i])) c.in_features = 192;  // NVFP4: 96-byte rows
        c.want_sm90a = true;
        c.tag = "one_row";
        run_case(&c);
        c = base_case(all[i], KIND_FPROP, false, true);
        c.tokens = 200;
        c.in_features = one_stage[i];
        c.want_sm90a = true;
        c.tag = "one_stage";
        run_case(&c);
    }
    // MXFP8 and NVFP4 with K a multiple of 512: the scales come in groups by TMA. Dense and
    // M-grouped, and 5 x 9 tiles that the repeat run's 3 CTAs walk 15 at a time (the group
    // buffers alternate across tiles).
    static const struct {
        uint32_t tokens, in_features, out_features;
        bool grouped, ints;
        const char *tag;
    } scale_groups[] = {{272, 1024, 96, false, false, "scale_groups"},
                        {288, 512, 96, true, true, "scale_groups"},
                        {600, 512, 2100, false, false, "scale_groups_tiles45"}};
    static const uint32_t emulated[] = {GEMM_FORMAT_MXFP8, GEMM_FORMAT_NVFP4};
    for (size_t f = 0; f < sizeof emulated / sizeof emulated[0]; f++) {
        for (size_t i = 0; i < sizeof scale_groups / sizeof scale_groups[0]; i++) {
            c = base_case(emulated[f], KIND_FPROP, scale_groups[i].grouped, scale_groups[i].ints);
            c.tokens = scale_groups[i].tokens;
            c.in_features = scale_groups[i].in_features;
            c.out_features = scale_groups[i].out_features;
            c.want_sm90a = true;
            c.want_scale_groups = true;
            c.tag = scale_groups[i].tag;
            run_case(&c);
        }
    }
    // 9 x 16 = 144 tiles of 128 x 256: more than the 132 SMs of an H100, so AUTO takes the
    // sm_90a tier too.
    static const struct {
        uint32_t format, in_features;
        bool ints;
    } many_tiles[] = {{GEMM_FORMAT_BF16, 96, true},
                      {GEMM_FORMAT_FP8, 48, false},
                      {GEMM_FORMAT_MXFP8, 96, false},
                      {GEMM_FORMAT_NVFP4, 96, true}};
    for (size_t i = 0; i < sizeof many_tiles / sizeof many_tiles[0]; i++) {
        c = base_case(many_tiles[i].format, KIND_FPROP, false, many_tiles[i].ints);
        c.tokens = 1100;
        c.in_features = many_tiles[i].in_features;
        c.out_features = 3900;
        c.want_sm90a = true;
        c.want_auto = 1;
        c.tag = "tiles144";
        run_case(&c);
    }
    // BF16 dgrad (B outer-major) and wgrad (both outer-major) over 9 x 16 tiles, where 3 CTAs
    // each walk 48 in the repeat run; D's row and column tails (1100 or 1096, and 3896, are not
    // multiples of 64; the outer-major rows stay whole 16-byte pieces) leave the last tiles'
    // boxes partly and wholly past the operands. Wgrad adds C (register epilogue); dgrad's BF16
    // D is staged.
    c = base_case(GEMM_FORMAT_BF16, KIND_DGRAD, false, false);
    c.tokens = 1100;
    c.in_features = 3896;
    c.out_features = 72;
    c.want_sm90a = true;
    c.want_auto = 1;
    c.tag = "tiles144";
    run_case(&c);
    c = base_case(GEMM_FORMAT_BF16, KIND_WGRAD, false, true);
    c.tokens = 200;
    c.in_features = 3896;
    c.out_features = 1096;
    c.want_sm90a = true;
    c.want_auto = 1;
    c.tag = "tiles144";
    run_case(&c);
}

// The sm_90a tier's grouped GEMMs of an moe layer's backward pass, against the reference:
// K-grouped wgrad (BF16, per-tensor FP8 with split and with fast accumulation, FP8 block) over
// 1, 8, 64 and 65 members of uneven sizes with empty ones, whose k tails are no multiple of a
// stage (37, 90, 129 rows: the rest of the last stage is the next member's rows, or rows past
// the last member, which the tier zeroes); 65 members make 65 tiles that the repeat run's 3 CTAs
// walk 22 at a time. M-grouped dgrad whose B is the stacked weights' transposed columnwise copy,
// members side by side in its rows (FP8 with k = 96 per member, less than a stage, FP8 block and
// NVFP4), over the usual 5 and over 65 members.
static void run_sm90a_grouped(void) {
    static const uint32_t one[] = {100};
    static const uint32_t eight[] = {37, 0, 300, 1, 129, 0, 64, 90};
    uint32_t *many64 = many_sizes(64, 200), *many65 = many_sizes(65, 200);
    const struct {
        uint32_t count;
        const uint32_t *sizes;
        bool random;  // a random-input case too
        const char *tag;
    } groups[] = {{1, one, false, "k_members1"},
                  {8, eight, true, "k_members8"},
                  {64, many64, true, "k_members64"},
                  {65, many65, false, "k_members65"}};
    static const uint32_t wgrad_formats[] = {GEMM_FORMAT_BF16, GEMM_FORMAT_FP8,
                                             GEMM_FORMAT_FP8_BLOCK};
    for (size_t f = 0; f < sizeof wgrad_formats / sizeof wgrad_formats[0]; f++) {
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
            for (int ints = 1; ints >= (groups[g].random ? 0 : 1); ints--) {
                tcase c = base_case(wgrad_formats[f], KIND_WGRAD, true, ints != 0);
                c.members = groups[g].count;
                c.sizes = groups[g].sizes;
                c.out_features = 96;
                c.want_sm90a = true;
                c.tag = groups[g].tag;
                run_case(&c);
            }
        }
    }
    // Without C, as the moe layer's wgrad writes its members' gradients: every member's tiles
    // store through the staged epilogue at that member's D (map d's third coordinate), with
    // rows and columns past the member's D clipped (m = 96, n = 160: a tile's second warpgroup
    // and its last 32 columns lie past them).
    const struct {
        uint32_t count;
        const uint32_t *sizes;
        bool ints;
        const char *tag;
    } no_c[] = {{8, eight, false, "k_members8_no_c"}, {65, many65, true, "k_members65_no_c"}};
    for (size_t f = 0; f < sizeof wgrad_formats / sizeof wgrad_formats[0]; f++) {
        for (size_t g = 0; g < sizeof no_c / sizeof no_c[0]; g++) {
            tcase c = base_case(wgrad_formats[f], KIND_WGRAD, true, no_c[g].ints);
            c.members = no_c[g].count;
            c.sizes = no_c[g].sizes;
            c.out_features = 96;
            c.accumulate = false;
            c.want_sm90a = true;
            c.tag = no_c[g].tag;
            run_case(&c);
        }
    }
    tcase c = base_case(GEMM_FORMAT_FP8, KIND_WGRAD, true, false);
    c.members = 8;
    c.sizes = eight;
    c.out_features = 96;
    c.split = false;
    c.want_sm90a = true;
    c.tag = "k_members8_fast";
    run_case(&c);
    static const struct {
        uint32_t format, out_features, members;
        const uint32_t *sizes;
        bool ints, split;
        const char *tag;
    } inner[] = {
        {GEMM_FORMAT_FP8, 96, 0, NULL, true, true, "b_inner"},
        {GEMM_FORMAT_FP8, 96, 0, NULL, false, false, "b_inner_fast"},
        {GEMM_FORMAT_FP8, 96, 65, NULL, false, true, "b_inner_members65"},
        {GEMM_FORMAT_FP8_BLOCK, 128, 0, NULL, true, false, "b_inner"},
        {GEMM_FORMAT_FP8_BLOCK, 128, 0, NULL, false, false, "b_inner"},
        {GEMM_FORMAT_NVFP4, 128, 0, NULL, true, false, "b_inner"},
        {GEMM_FORMAT_NVFP4, 128, 0, NULL, false, false, "b_inner"},
    };
    for (size_t i = 0; i < sizeof inner / sizeof inner[0]; i++) {
        c = base_case(inner[i].format, KIND_DGRAD, true, inner[i].ints);
        if (inner[i].members) {
            c.members = inner[i].members;
            c.sizes = many65;
        }
        c.out_features = inner[i].out_features;
        c.split = inner[i].split;
        c.b_inner = true;
        c.want_sm90a = true;
        c.tag = inner[i].tag;
        run_case(&c);
    }
    free(many64);
    free(many65);
}

// A training-sized case: only beside a GPU (its reference and FP64 evaluation take seconds of a
// CPU, and its point is the kernel's stream), otherwise one skip.
static void run_case_beside_gpu(const tcase *c) {
    if (gpu_ok) {
        run_case(c);
        return;
    }
    char name[160];
    case_name(c, name, sizeof name);
    if (case_filter && !strstr(name, case_filter)) return;
    if (test_shard_take()) test_skip(name, "a training-sized shape: checked only beside a GPU");
}

// Training-sized GEMMs (the Fashion-MNIST MLP at batch 256) in every format, all on the small
// tile: fprop 256 x 1024 with K 800 (small integers) and 1024 (random), 16 large tiles; the
// 10-wide head, fprop N = 10 and wgrad M = 10. The big two cost seconds of reference time on a
// CPU, so without a GPU to compare they are skipped.
static void run_training_shapes(void) {
    for (uint32_t f = 0; f < GEMM_FORMAT_COUNT; f++) {
        for (int ints = 1; ints >= 0; ints--) {
            tcase c = base_case(f, KIND_FPROP, false, ints != 0);
            c.tokens = 256;
            c.in_features = ints ? 800 : 1024;
            c.out_features = 1024;
            c.tag = ints ? "m256_n1024_k800" : "m256_n1024_k1024";
            run_case_beside_gpu(&c);
        }
        tcase c = base_case(f, KIND_FPROP, false, false);
        c.tokens = 256;
        c.in_features = 1024;
        c.out_features = 10;
        c.tag = "n10";
        run_case(&c);
        c = base_case(f, KIND_WGRAD, false, false);
        c.tokens = 256;
        c.in_features = 1024;
        c.out_features = 10;
        c.tag = "m10";
        run_case(&c);
    }
}

// Split-K (gemm.h): every format, fprop, dgrad and wgrad, dense, with 2 parts (uneven: the last
// takes the rest) and with one part per 128-wide K block (a short last part). Small integers
// give exact sums, so the reference and the GPU must give the unsplit GEMM's bits; random inputs
// stay within the same bounds. Then the Fashion-MNIST head's fprop with the parts the planner
// picks for it (op_gemm_split_parts: 8).
static void run_split_k(void) {
    for (uint32_t f = 0; f < GEMM_FORMAT_COUNT; f++) {
        for (int kind = KIND_FPROP; kind <= KIND_WGRAD; kind++) {
            for (int ints = 1; ints >= 0; ints--) {
                tcase c = base_case(f, (tkind)kind, false, ints != 0);
                c.tokens = 300;
                c.in_features = 400;
                c.out_features = 272;
                uint32_t k = kind == KIND_FPROP ? 400 : kind == KIND_DGRAD ? 272 : 300;
                c.split_parts = 2;
                run_case(&c);
                c.split_parts = ceil_div(k, GEMM_SPLIT_K_ALIGN);
                run_case(&c);
            }
        }
        tcase c = base_case(f, KIND_FPROP, false, false);
        c.tokens = 256;
        c.in_features = 1024;
        c.out_features = 10;
        c.tag = "n10_planned";
        op_gemm_desc d = {0};
        d.m = 256;
        d.n = 10;
        d.k = 1024;
        c.split_parts = op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
        run_case(&c);
    }
}

// ---------------------------------------------------------------------------------------------
// Skinny GEMMs (gemm.h "Skinny GEMMs", ptx/gemm_skinny.cu): dense BF16 GEMMs with n (kind N,
// fprop-like), m (M, wgrad-like) or k (K, dgrad-like) of at most 64, which op_gemm gives kernels
// of their own. Every case states the kind op_gemm must pick (checked on both backends); beside
// a GPU its `_gpu_other_tile` run is the portable kernel, whose bits the skinny kernel must give
// on random inputs too (run_case_other_tile). The tags all start with "skinny", so that
// QT_TEST_GEMM_CASES=skinny runs them alone.

// The split parts the planner gives a case's dense BF16 GEMM (op_gemm_split_parts), with the
// operands' layouts of a Linear layer (op_gemm.h).
static uint32_t planned_parts(const tcase *c) {
    prog_ref none = {0};
    bool fprop = c->kind == KIND_FPROP, wgrad = c->kind == KIND_WGRAD;
    uint32_t in = c->in_features, out = c->out_features, t = c->tokens;
    op_gemm_desc d = {0};
    d.format = GEMM_FORMAT_BF16;
    d.m = wgrad ? out : t;
    d.n = fprop ? out : in;
    d.k = fprop ? in : wgrad ? t : out;
    d.a = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, t, fprop ? in : out, wgrad, false,
                             none, none, none);
    d.b = wgrad ? op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, t, in, true, false, none,
                                     none, none)
                : op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, out, in, !fprop, false,
                                     none, none, none);
    return op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
}

static tcase skinny_case(tkind kind, bool ints, uint32_t tokens, uint32_t in, uint32_t out,
                         uint32_t kind_want, const char *tag) {
    tcase c = base_case(GEMM_FORMAT_BF16, kind, false, ints);
    c.tokens = tokens;
    c.in_features = in;
    c.out_features = out;
    c.skinny = kind_want + 1;
    c.tag = tag;
    c.split_parts = planned_parts(&c);
    return c;
}

// One case per `out` of a table, small integers and random, of one kind and shape otherwise.
typedef struct skinny_size {
    uint32_t out;
    const char *tag;
} skinny_size;

static void run_skinny_sizes(tkind kind, uint32_t tokens, uint32_t in, const skinny_size *sizes,
                             size_t count, uint32_t kind_want) {
    for (size_t i = 0; i < count; i++) {
        for (int ints = 1; ints >= 0; ints--) {
            tcase c = skinny_case(kind, ints != 0, tokens, in, sizes[i].out, kind_want,
                                  sizes[i].tag);
            run_case(&c);
        }
    }
}

// Kind N: every fragment count (n of 1 to 64; 33 pads to 64), 150 rows (a partial block), k 200
// (4 stages of 64, the last of 2 k steps), with bias and BF16 D; k 72 (a stage of 4 steps and one
// of 2, the second step all zeros) and k 8 (one stage of one 16-byte piece); FP32 D with C and no
// bias; 3 forced split parts and the Fashion-MNIST head's
// planned 7 (256 x 10 x 784).
static void run_skinny_n(void) {
    static const skinny_size widths[] = {{1, "skinny_n1"},   {8, "skinny_n8"},
                                         {10, "skinny_n10"}, {16, "skinny_n16"},
                                         {33, "skinny_n33"}, {64, "skinny_n64"}};
    run_skinny_sizes(KIND_FPROP, 150, 200, widths, sizeof widths / sizeof widths[0],
                     GEMM_SKINNY_N);
    tcase c = skinny_case(KIND_FPROP, false, 70, 72, 16, GEMM_SKINNY_N, "skinny_n16_k72");
    run_case(&c);
    c = skinny_case(KIND_FPROP, false, 70, 8, 16, GEMM_SKINNY_N, "skinny_n16_k8");
    run_case(&c);
    c = skinny_case(KIND_FPROP, false, 150, 200, 33, GEMM_SKINNY_N, "skinny_n33_f32_c");
    c.out_bf16 = false;
    c.bias = false;
    c.accumulate = true;
    run_case(&c);
    for (int ints = 1; ints >= 0; ints--) {
        c = skinny_case(KIND_FPROP, ints != 0, 150, 1000, 16, GEMM_SKINNY_N, "skinny_n16_split3");
        c.split_parts = 3;
        run_case(&c);
        c = skinny_case(KIND_FPROP, ints != 0, 256, 784, 10, GEMM_SKINNY_N, "skinny_n10_planned");
        run_case(&c);
    }
}

// Kind M: every fragment count (m of 8 to 64), 264 columns (a partial block of 8), k 700 (a
// stage tail; m 8 and 16 in 2 planned parts, the rest whole), with C and FP32 D; BF16 D without
// C (k 500, one part); one stage (k 20); the planned split of a longer contraction (3000 rows: 8
// parts of 384, the last 312).
static void run_skinny_m(void) {
    static const skinny_size heights[] = {{8, "skinny_m8"},   {16, "skinny_m16"},
                                          {24, "skinny_m24"}, {40, "skinny_m40"},
                                          {64, "skinny_m64"}};
    run_skinny_sizes(KIND_WGRAD, 700, 264, heights, sizeof heights / sizeof heights[0],
                     GEMM_SKINNY_M);
    tcase c = skinny_case(KIND_WGRAD, false, 500, 264, 16, GEMM_SKINNY_M, "skinny_m16_bf16");
    c.out_bf16 = true;
    c.accumulate = false;
    run_case(&c);
    c = skinny_case(KIND_WGRAD, false, 20, 264, 16, GEMM_SKINNY_M, "skinny_m16_k20");
    run_case(&c);
    for (int ints = 1; ints >= 0; ints--) {
        c = skinny_case(KIND_WGRAD, ints != 0, 3000, 264, 16, GEMM_SKINNY_M, "skinny_m16_planned");
        run_case(&c);
    }
}

// No kind for a small k (op_gemm.c: the tiers write D faster): a dgrad of k 16 (dy's rows of 32
// bytes) names the portable kernel and the sm_90a tier must take it; k 10 (rows of 20 bytes, no
// TMA) stays portable.
static void run_skinny_small_k(void) {
    for (int ints = 1; ints >= 0; ints--) {
        tcase c = skinny_case(KIND_DGRAD, ints != 0, 150, 264, 16, GEMM_SKINNY_NONE,
                              "skinny_none_dgrad16");
        c.want_sm90a = true;
        run_case(&c);
    }
    tcase c = skinny_case(KIND_DGRAD, false, 150, 264, 10, GEMM_SKINNY_NONE,
                          "skinny_none_dgrad10");
    run_case(&c);
}

// The training shapes: the moe8 bench's head (16 classes) and routers (8 and 64 experts) over
// 16384 tokens of 2048, the resmlp bench's head over 8192 of 4096, and a 10-class head over
// 4096 tokens of 784; their wgrad (planned splits of 16, 16 and 8 parts) and dgrad, which no
// skinny kernel takes: the sm_90a tier does, AUTO included.
static void run_skinny_training(void) {
    static const struct {
        tkind kind;
        uint32_t tokens, in, out;
        bool ints;
        const char *tag;
    } shapes[] = {
        {KIND_FPROP, 16384, 2048, 16, true, "skinny_train_head"},
        {KIND_FPROP, 16384, 2048, 16, false, "skinny_train_head"},
        {KIND_FPROP, 16384, 2048, 8, false, "skinny_train_router8"},
        {KIND_FPROP, 16384, 2048, 64, false, "skinny_train_router64"},
        {KIND_FPROP, 8192, 4096, 16, false, "skinny_train_resmlp_head"},
        {KIND_FPROP, 4096, 784, 10, false, "skinny_train_head10"},
        {KIND_WGRAD, 16384, 2048, 16, true, "skinny_train_head"},
        {KIND_WGRAD, 16384, 2048, 16, false, "skinny_train_head"},
        {KIND_WGRAD, 16384, 2048, 64, false, "skinny_train_router64"},
        {KIND_WGRAD, 8192, 4096, 16, false, "skinny_train_resmlp_head"},
        {KIND_DGRAD, 8192, 2048, 16, true, "skinny_train_head"},
        {KIND_DGRAD, 8192, 2048, 16, false, "skinny_train_head"},
        {KIND_DGRAD, 4096, 2048, 64, false, "skinny_train_router64"},
    };
    static const uint32_t kinds[] = {GEMM_SKINNY_N, GEMM_SKINNY_NONE, GEMM_SKINNY_M};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        tcase c = skinny_case(shapes[i].kind, shapes[i].ints, shapes[i].tokens, shapes[i].in,
                              shapes[i].out, kinds[shapes[i].kind], shapes[i].tag);
        if (shapes[i].kind == KIND_DGRAD) {
            c.want_sm90a = true;
            c.want_auto = 1;
        }
        run_case_beside_gpu(&c);
    }
}

static void run_skinny(void) {
    run_skinny_n();
    run_skinny_m();
    run_skinny_small_k();
    run_skinny_training();
}

// The skinny rule (op_gemm_skinny) on descriptors: the kind for each layout and bound, what keeps
// a GEMM off them, kind M's planned parts, the launch shapes, and the ops op_gemm appends.
static op_gemm_desc skinny_desc(uint32_t m, uint32_t n, uint32_t k, bool a_outer, bool b_outer,
                                uint32_t a_ld, uint32_t b_ld) {
    op_gemm_desc d = {0};
    d.format = GEMM_FORMAT_BF16;
    d.m = m;
    d.n = n;
    d.k = k;
    d.a.ld = a_ld;
    d.b.ld = b_ld;
    d.a.flags = a_outer ? GEMM_OPERAND_OUTER_MAJOR : 0u;
    d.b.flags = b_outer ? GEMM_OPERAND_OUTER_MAJOR : 0u;
    return d;
}

static void test_skinny_rule(void) {
    test_begin("gemm_skinny_rule");
    struct {
        uint32_t m, n, k;
        bool a_outer, b_outer;
        uint32_t a_ld, b_ld, kind, parts;
    } rows[] = {
        {16384, 16, 2048, false, false, 2048, 2048, GEMM_SKINNY_N, 1},  // moe8 head fprop
        {16384, 64, 2048, false, false, 2048, 2048, GEMM_SKINNY_N, 1},  // a 64-expert router
        {16384, 65, 2048, false, false, 2048, 2048, GEMM_SKINNY_NONE, 1},
        {256, 10, 1024, false, false, 1024, 1024, GEMM_SKINNY_N, 8},  // Fashion head: split
        {256, 10, 784, false, false, 784, 784, GEMM_SKINNY_N, 7},     // run_skinny_n's
        {256, 10, 1028, false, false, 1028, 1028, GEMM_SKINNY_NONE, 9},  // rows of 2056 bytes
        {16, 2048, 16384, true, true, 16, 2048, GEMM_SKINNY_M, 16},   // moe8 head wgrad
        {64, 2048, 16384, true, true, 64, 2048, GEMM_SKINNY_M, 16},   // parts of 1024 rows
        {16, 4096, 8192, true, true, 16, 4096, GEMM_SKINNY_M, 8},     // resmlp head wgrad
        {16, 128, 1000, true, true, 16, 128, GEMM_SKINNY_M, 3},       // 3 of at least 256
        {16, 264, 3000, true, true, 16, 264, GEMM_SKINNY_M, 8},       // run_skinny_m's
        {16, 2048, 400, true, true, 16, 2048, GEMM_SKINNY_M, 1},      // one part
        {10, 1024, 256, true, true, 10, 1024, GEMM_SKINNY_NONE, 1},   // dy rows of 20 bytes
        {65, 2048, 16384, true, true, 72, 2048, GEMM_SKINNY_NONE, 2},  // the portable split
        {16384, 2048, 16, false, true, 16, 2048, GEMM_SKINNY_NONE, 1},  // moe8 head dgrad
        {256, 1024, 10, false, true, 10, 1024, GEMM_SKINNY_NONE, 1},    // Fashion head dgrad
        {256, 1020, 10, false, true, 10, 1020, GEMM_SKINNY_NONE, 1},  // W rows of 2040 bytes
        {8192, 4096, 16, false, false, 16, 16, GEMM_SKINNY_NONE, 1},    // fprop of 16 inputs
        {8192, 4096, 65, false, true, 65, 4096, GEMM_SKINNY_NONE, 1},
        {16384, 16, 2048, true, false, 16384, 2048, GEMM_SKINNY_NONE, 1},  // an outer-major A
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        op_gemm_desc d = skinny_desc(rows[i].m, rows[i].n, rows[i].k, rows[i].a_outer,
                                     rows[i].b_outer, rows[i].a_ld, rows[i].b_ld);
        uint32_t kind = op_gemm_skinny(&d), parts = op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
        CHECK(kind == rows[i].kind && parts == rows[i].parts,
              "%u x %u x %u (lds %u, %u): kind %u, %u parts; expected %u, %u", d.m, d.n, d.k,
              d.a.ld, d.b.ld, kind, parts, rows[i].kind, rows[i].parts);
        CHECK(op_gemm_split_parts(&d, 0) == 1, "no SMs, no split");
    }
    // What keeps a GEMM off them: another format, grouping, a forced tile.
    op_gemm_desc head = skinny_desc(16384, 16, 2048, false, false, 2048, 2048);
    op_gemm_desc d = head;
    d.format = GEMM_FORMAT_FP8;
    CHECK(op_gemm_skinny(&d) == GEMM_SKINNY_NONE, "fp8 taken");
    d = head;
    d.grouping = GEMM_GROUP_M;
    CHECK(op_gemm_skinny(&d) == GEMM_SKINNY_NONE, "grouped taken");
    d = head;
    d.tile = OP_GEMM_TILE_SMALL;
    CHECK(op_gemm_skinny(&d) == GEMM_SKINNY_NONE && op_gemm_kernel(&d) ==
          KERNEL_GEMM_BF16_PORTABLE, "a forced tile taken");
    // Kind M's parts over a sweep: whole 128-wide blocks, none empty, each at least
    // max(256, 16 m) rows, at most about two blocks per SM.
    uint64_t bad = 0;
    for (uint32_t m = 8; m <= 64; m += 8) {
        for (uint32_t n = 128; n <= 8192; n *= 2) {
            for (uint32_t k = 1; k <= 40000; k += 997) {
                d = skinny_desc(m, n, k, true, true, m, n);
                uint32_t parts = op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
                bool ok = op_gemm_skinny(&d) == GEMM_SKINNY_M && parts >= 1 &&
                          parts <= GEMM_SPLIT_PARTS_MAX;
                if (ok && parts > 1) {
                    uint32_t split_k = op_gemm_split_k(k, parts), rows_min = 16 * m;
                    if (rows_min < 256) rows_min = 256;
                    ok = split_k % GEMM_SPLIT_K_ALIGN == 0 && (uint64_t)split_k * (parts - 1) < k &&
                         (uint64_t)split_k * parts >= k && split_k >= rows_min &&
                         (uint64_t)ceil_div(n, GEMM_SKINNY_M_COLS) * (parts - 1) <
                             2 * OP_GEMM_SPLIT_SMS;
                }
                if (!ok && bad++ < 4) CHECK(false, "%u x %u x %u: %u parts", m, n, k, parts);
            }
        }
    }
    CHECK(bad == 0, "%llu shapes broke the rule", (unsigned long long)bad);
    // Launch shapes: N 64-row blocks, M 128-column blocks by parts.
    launch_shape shape = op_gemm_shape(&head);
    CHECK(shape.grid[0] == 256 && shape.grid[1] == 1 && shape.grid[2] == 1 &&
              shape.block[0] == GEMM_SKINNY_THREADS &&
              shape.smem_bytes == GEMM_SKINNY_N_SMEM_BYTES(2),
          "N: %ux%ux%u, %u bytes", shape.grid[0], shape.grid[1], shape.grid[2], shape.smem_bytes);
    d = skinny_desc(16, 2048, 16384, true, true, 16, 2048);
    d.split_parts = 16;
    shape = op_gemm_shape(&d);
    CHECK(shape.grid[0] == 16 && shape.grid[1] == 1 && shape.grid[2] == 16 &&
              shape.smem_bytes == GEMM_SKINNY_M_SMEM_BYTES(1),
          "M: %ux%ux%u, %u bytes", shape.grid[0], shape.grid[1], shape.grid[2], shape.smem_bytes);
    // A small k names the portable kernel and its launch, which the tiers take (the moe8 head's
    // dgrad and the Fashion-MNIST head's).
    d = skinny_desc(16384, 2048, 16, false, true, 16, 2048);
    shape = op_gemm_shape(&d);
    CHECK(op_gemm_kernel(&d) == KERNEL_GEMM_BF16_PORTABLE &&
              shape.block[0] == GEMM_TILE_THREADS(op_gemm_tile(&d)),
          "moe8 head dgrad: kernel %d, %u threads", (int)op_gemm_kernel(&d), shape.block[0]);
    d = skinny_desc(256, 1024, 10, false, true, 10, 1024);
    CHECK(op_gemm_kernel(&d) == KERNEL_GEMM_BF16_PORTABLE, "Fashion head dgrad: kernel %d",
          (int)op_gemm_kernel(&d));
    // The ops: a split kind M is its kernel and the reduction; kind N alone.
    static program prog;
    static arena dev;
    rig_arena_init(&dev, ARENA_KIND_DEVICE, "skinny");
    d = skinny_desc(16, 2048, 16384, true, true, 16, 2048);
    d.split_parts = op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
    arena_handle h, hw;
    RIG_OK(arena_reserve(&dev, "x", 256, 256, ARENA_CAT_WORKSPACE, ARENA_LIFETIME_PERSISTENT, 0,
                         &h));
    RIG_OK(arena_reserve(&dev, "ws", op_gemm_workspace_bytes(&d, d.split_parts), 256,
                         ARENA_CAT_WORKSPACE, ARENA_LIFETIME_PERSISTENT, 0, &hw));
    prog_ref ref = {&dev, h, 0}, ws = {&dev, hw, 0};
    rig_prog_init(&prog, "skinny");
    d.a.data = d.b.data = d.d = ref;
    d.workspace = ws;
    d.alpha = 1.0f;
    d.d_dtype = QT_DTYPE_F32;
    RIG_OK(op_gemm(&prog, "wgrad", &d));
    CHECK(prog.op_count == 2 && prog.ops[0].kernel == KERNEL_GEMM_BF16_SKINNY_M &&
              prog.ops[1].kernel == KERNEL_GEMM_SPLIT_REDUCE,
          "wgrad: %u ops", prog.op_count);
    head.a.data = head.b.data = head.d = ref;
    head.alpha = 1.0f;
    head.d_dtype = QT_DTYPE_BF16;
    RIG_OK(op_gemm(&prog, "fprop", &head));
    CHECK(prog.op_count == 3 && prog.ops[2].kernel == KERNEL_GEMM_BF16_SKINNY_N,
          "fprop: %u ops", prog.op_count);
    test_end();
}

// The structure of a split, bit for bit on one backend: a BF16 GEMM split into 3 parts (256,
// 256 and 128 of k = 640) gives exactly alpha times the in-order sum of three unsplit GEMMs
// over those k ranges of the same operands (their data offset by the part's first k, alpha 1,
// FP32 D): each part is the unsplit GEMM of its range, and the reduction adds them in order.
// N = 72 runs the portable kernel, N = 48 the skinny kind N (gemm.h), whose kind is checked.
static void split_structure_case(rig *r, const char *name, uint32_t N) {
    enum { M = 64, K = 640, PARTS = 3 };
    const uint32_t starts[PARTS + 1] = {0, 256, 512, K};
    test_begin(name);
    rig_reset(r);
    uint16_t *a = malloc(sizeof(uint16_t) * M * K), *b = malloc(sizeof(uint16_t) * N * K);
    for (uint32_t i = 0; i < M * K; i++) a[i] = qt_f32_to_bf16((float)rng_normal());
    for (uint32_t i = 0; i < N * K; i++) b[i] = qt_f32_to_bf16((float)rng_normal());
    arena_handle ha = rig_reserve(r, "a", sizeof(uint16_t) * M * K);
    arena_handle hb = rig_reserve(r, "b", sizeof(uint16_t) * N * K);
    arena_handle hd = rig_reserve(r, "d", 4u * M * N);
    arena_handle hp = rig_reserve(r, "parts", 4u * M * N * PARTS);
    arena_handle hw = rig_reserve(r, "ws", 4u * M * N * PARTS);
    op_gemm_desc g = {0};
    g.format = GEMM_FORMAT_BF16;
    g.m = M;
    g.n = N;
    g.k = K;
    g.alpha = 0.75f;
    g.d_dtype = QT_DTYPE_F32;
    g.a = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, M, K, false, false,
                             rig_ref(r, ha, 0), (prog_ref){0}, (prog_ref){0});
    g.b = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, N, K, false, false,
                             rig_ref(r, hb, 0), (prog_ref){0}, (prog_ref){0});
    g.d = rig_ref(r, hd, 0);
    g.split_parts = PARTS;
    g.workspace = rig_ref(r, hw, 0);
    RIG_OK(op_gemm(&r->prog, "split", &g));
    uint32_t kind = N <= GEMM_SKINNY_MAX ? GEMM_SKINNY_N : GEMM_SKINNY_NONE;
    CHECK(skinny_of_op(&r->prog.ops[0]) == kind, "skinny kind %u, expected %u",
          skinny_of_op(&r->prog.ops[0]), kind);
    for (uint32_t z = 0; z < PARTS; z++) {
        op_gemm_desc part = g;
        part.split_parts = 0;
        part.workspace = (prog_ref){0};
        part.alpha = 1.0f;
        part.k = starts[z + 1] - starts[z];
        part.a.data = rig_ref(r, ha, 2u * starts[z]);
        part.b.data = rig_ref(r, hb, 2u * starts[z]);
        part.d = rig_ref(r, hp, 4u * M * N * z);
        RIG_OK(op_gemm(&r->prog, "part", &part));
    }
    rig_bind(r);
    RIG_OK(backend_write(&r->be, rig_ref(r, ha, 0), a, sizeof(uint16_t) * M * K));
    RIG_OK(backend_write(&r->be, rig_ref(r, hb, 0), b, sizeof(uint16_t) * N * K));
    rig_execute(r);
    float *d = malloc(4u * M * N), *parts = malloc(4u * M * N * PARTS);
    RIG_OK(backend_read(&r->be, d, rig_ref(r, hd, 0), 4u * M * N));
    RIG_OK(backend_read(&r->be, parts, rig_ref(r, hp, 0), 4u * M * N * PARTS));
    uint32_t bad = 0;
    for (uint32_t i = 0; i < M * N; i++) {
        float sum = parts[i];
        for (uint32_t z = 1; z < PARTS; z++) sum = sum + parts[z * M * N + i];
        float want = 0.75f * sum;
        if (qt_f32_bits(want) != qt_f32_bits(d[i]) && bad++ < 4) {
            CHECK(false, "element %u: 0x%08x, expected 0x%08x", i, qt_f32_bits(d[i]),
                  qt_f32_bits(want));
        }
    }
    CHECK(bad == 0, "%u elements differ", bad);
    test_end();
    free(a);
    free(b);
    free(d);
    free(parts);
}

static void run_split_structure(void) {
    split_structure_case(&ref_rig, "gemm_split_structure", 72);
    split_structure_case(&ref_rig, "gemm_skinny_split_structure", 48);
    if (!gpu_ok) {
        test_skip("gemm_split_structure_gpu", gpu_why);
        test_skip("gemm_skinny_split_structure_gpu", gpu_why);
        return;
    }
    gpu_rig.be.gemm_tier = BACKEND_GEMM_TIER_PORTABLE;
    split_structure_case(&gpu_rig, "gemm_split_structure_gpu", 72);
    split_structure_case(&gpu_rig, "gemm_skinny_split_structure_gpu", 48);
}

// The split rule (op_gemm.h): a pure function of the shape and the SM count, with whole 128-wide
// K blocks per part and no empty part.
static void test_split_rule(void) {
    test_begin("gemm_split_rule");
    struct {
        uint32_t m, n, k, grouping, parts;
    } shapes[] = {
        {256, 1024, 1024, GEMM_DENSE, 2},   // Fashion-MNIST fc2 fprop, fc2 dgrad: 64 small tiles
        {256, 1024, 784, GEMM_DENSE, 2},    // fc1 fprop: 7 blocks, parts of 512 and 272
        {256, 10, 1024, GEMM_DENSE, 8},     // the head's fprop: 4 tiles
        {10, 1024, 256, GEMM_DENSE, 1},     // the head's wgrad: 16 tiles, only 2 blocks
        {10, 1024, 512, GEMM_DENSE, 4},     // the same at batch 512: 4 blocks
        {256, 1024, 10, GEMM_DENSE, 1},     // the head's dgrad: one block
        {1024, 1024, 256, GEMM_DENSE, 1},   // fc2 wgrad: 256 small tiles
        {4096, 4096, 4096, GEMM_DENSE, 1},  // large tiles enough
        {256, 10, 1024, GEMM_GROUP_M, 1},   // grouped GEMMs are never split
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        op_gemm_desc d = {0};
        d.m = shapes[i].m;
        d.n = shapes[i].n;
        d.k = shapes[i].k;
        d.grouping = shapes[i].grouping;
        uint32_t parts = op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
        CHECK(parts == shapes[i].parts, "%u x %u x %u: %u parts, expected %u", d.m, d.n, d.k,
              parts, shapes[i].parts);
        CHECK(op_gemm_split_parts(&d, 0) == 1, "no SMs, no split");
    }
    // Every shape of a sweep: parts within bounds, whole blocks, none empty, tiles x parts within
    // the SMs, and the same answer every time.
    uint64_t bad = 0;
    for (uint32_t m = 16; m <= 1024; m += 208) {
        for (uint32_t n = 8; n <= 1024; n += 136) {
            for (uint32_t k = 1; k <= 4200; k += 97) {
                op_gemm_desc d = {0};
                d.m = m;
                d.n = n;
                d.k = k;
                uint32_t parts = op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
                bool ok = parts >= 1 && parts <= GEMM_SPLIT_PARTS_MAX &&
                          parts == op_gemm_split_parts(&d, OP_GEMM_SPLIT_SMS);
                if (ok && parts > 1) {
                    uint32_t split_k = op_gemm_split_k(k, parts);
                    uint32_t rows = GEMM_TILE_ROWS(op_gemm_tile(&d));
                    uint64_t tiles = (uint64_t)ceil_div(m, rows) * ceil_div(n, rows);
                    ok = split_k % GEMM_SPLIT_K_ALIGN == 0 &&
                         (uint64_t)split_k * (parts - 1) < k && (uint64_t)split_k * parts >= k &&
                         tiles * parts <= OP_GEMM_SPLIT_SMS &&
                         op_gemm_workspace_bytes(&d, parts) == (uint64_t)parts * m * n * 4;
                }
                if (!ok && bad++ < 4) CHECK(false, "%u x %u x %u: %u parts", m, n, k, parts);
            }
        }
    }
    CHECK(bad == 0, "%llu shapes broke the rule", (unsigned long long)bad);
    test_end();
}

static void run_group_shapes(void) {
    static const uint32_t empty[] = {0, 0, 0};
    static const uint32_t one[] = {100};
    tcase c = base_case(GEMM_FORMAT_BF16, KIND_FPROP, true, true);
    c.members = 3;
    c.sizes = empty;
    c.tag = "all_empty";
    run_case(&c);
    c = base_case(GEMM_FORMAT_BF16, KIND_WGRAD, true, true);
    c.members = 3;
    c.sizes = empty;
    c.tag = "all_empty";
    run_case(&c);
    c = base_case(GEMM_FORMAT_FP8_BLOCK, KIND_WGRAD, true, false);
    c.members = 1;
    c.sizes = one;
    c.tag = "one_member";
    run_case(&c);
    // More members than threads: the tile lookup walks slices of several members per thread.
    static const struct {
        uint32_t format;
        tkind kind;
        bool ints;
        uint32_t count;
        const char *tag;
    } many[] = {
        {GEMM_FORMAT_BF16, KIND_FPROP, true, 1000, "members1000"},
        {GEMM_FORMAT_FP8, KIND_WGRAD, true, 300, "members300"},
        {GEMM_FORMAT_MXFP8, KIND_DGRAD, false, 65, "members65"},
        {GEMM_FORMAT_NVFP4, KIND_WGRAD, false, 65, "members65"},
        {GEMM_FORMAT_FP8_BLOCK, KIND_FPROP, true, 65, "members65"},
    };
    for (size_t i = 0; i < sizeof many / sizeof many[0]; i++) {
        uint32_t *sizes = many_sizes(many[i].count, many[i].count > 100 ? 19 : 40);
        c = base_case(many[i].format, many[i].kind, true, many[i].ints);
        c.members = many[i].count;
        c.sizes = sizes;
        c.in_features = 48;
        c.out_features = 40;
        c.tag = many[i].tag;
        run_case(&c);
        free(sizes);
    }
}

// ---------------------------------------------------------------------------------------------
// Bias gradient: column sums of dy in a fixed order, bit for bit on both backends.

typedef struct bgrad {
    uint32_t dtype, cols, rows, ld, count, members;
    const uint32_t *sizes;
    uint32_t *off;
    uint8_t *dy;
    double *expect, *sum_abs;  // [members][cols]: exact sums and sums of |dy|
    bool ints;
} bgrad;

// Runs the bias gradient on one rig and returns the sums (caller frees).
static float *bgrad_run(rig *r, const bgrad *b, const char *name) {
    size_t esz = b->dtype == QT_DTYPE_BF16 ? 2 : 4;
    uint64_t dy_bytes = (uint64_t)b->rows * b->ld * esz;
    uint64_t out_bytes = (uint64_t)b->members * b->cols * 4;
    rig_reset(r);
    gregion g[4];
    greg_reserve(r, &g[0], "dy", dy_bytes, false);
    greg_reserve(r, &g[1], "out", out_bytes, true);
    greg_reserve(r, &g[2], "row_offsets", (b->count + 1) * 4, false);
    greg_reserve(r, &g[3], "first_dims", b->count * 4, false);
    prog_ref none = {0};
    RIG_OK(op_gemm_bias_grad(&r->prog, name, greg_ref(r, &g[0]), b->dtype, b->rows, b->cols,
                             b->ld, b->count, b->count ? greg_ref(r, &g[2]) : none,
                             b->count ? greg_ref(r, &g[3]) : none, greg_ref(r, &g[1])));
    rig_bind(r);
    greg_upload(r, &g[0], b->dy, dy_bytes);
    greg_upload(r, &g[1], NULL, 0);
    greg_upload(r, &g[2], b->off, b->count ? (b->count + 1) * 4 : 0);
    greg_upload(r, &g[3], b->sizes, b->count * 4);
    rig_execute(r);
    float *out = malloc(out_bytes);
    RIG_OK(backend_read(&r->be, out, greg_ref(r, &g[1]), out_bytes));
    for (int i = 0; i < 4; i++) {
        greg_check(r, &g[i], "bias gradient");
        greg_free(&g[i]);
    }
    return out;
}

// ref: exact on small integers, else within (31 + chunks) u sum|dy| (chunk partials of at most
// 32 rows, then one addition per chunk); GPU: the reference's bits.
static void bgrad_check(const bgrad *b, const float *out, const float *ref) {
    uint64_t bad = 0;
    for (size_t i = 0; i < (size_t)b->members * b->cols; i++) {
        uint32_t member_rows = b->count ? b->sizes[i / b->cols] : b->rows;
        double tol = (34.0 + member_rows / 32.0) * 0x1p-24 * b->sum_abs[i];
        bool ok = ref ? qt_f32_bits(out[i]) == qt_f32_bits(ref[i])
                  : b->ints ? out[i] == (float)b->expect[i]
                            : fabs(out[i] - b->expect[i]) <= tol;
        if (!ok && bad++ < 6) {
            CHECK(false, "member %zu col %zu: %.9g (0x%08x), ref %.9g, exact %.9g, bound %.3g",
                  i / b->cols, i % b->cols, out[i], qt_f32_bits(out[i]), ref ? ref[i] : 0.0f,
                  b->expect[i], tol);
        }
    }
    CHECK(bad == 0, "%llu of %zu sums wrong", (unsigned long long)bad,
          (size_t)b->members * b->cols);
}

static void bias_grad_case(const char *name, uint32_t dtype, uint32_t cols, uint32_t rows_dense,
                           uint32_t count, const uint32_t *sizes, bool ints) {
    bgrad b = {dtype, cols, rows_dense, cols + 3, count, count ? count : 1u, sizes, NULL, NULL,
               NULL, NULL, ints};
    b.off = calloc(count + 1, sizeof(uint32_t));
    for (uint32_t i = 0; i < count; i++) b.off[i + 1] = b.off[i] + ceil_div(sizes[i], 16) * 16;
    if (count) b.rows = b.off[count] + 16;
    b.dy = malloc((size_t)b.rows * b.ld * 4);
    // Padding rows and the gaps of ld hold values that would show if they were summed.
    for (size_t i = 0; i < (size_t)b.rows * b.ld; i++) out_store(dtype, b.dy, i, 1e30f);
    b.expect = calloc((size_t)b.members * cols, sizeof(double));
    b.sum_abs = calloc((size_t)b.members * cols, sizeof(double));
    for (uint32_t m = 0; m < b.members; m++) {
        uint32_t r0 = count ? b.off[m] : 0, r1 = count ? b.off[m] + sizes[m] : b.rows;
        for (uint32_t r = r0; r < r1; r++) {
            for (uint32_t col = 0; col < cols; col++) {
                size_t at = (size_t)r * b.ld + col;
                out_store(dtype, b.dy, at, (float)(ints ? rng_int(-3, 3) : rng_normal()));
                b.expect[(size_t)m * cols + col] += out_value(dtype, b.dy, at);
                b.sum_abs[(size_t)m * cols + col] += fabs(out_value(dtype, b.dy, at));
            }
        }
    }
    test_begin(name);
    float *ref = bgrad_run(&ref_rig, &b, name);
    bgrad_check(&b, ref, NULL);
    test_end();
    char gpu_name[128];
    snprintf(gpu_name, sizeof gpu_name, "%s_gpu", name);
    if (!gpu_ok) {
        test_skip(gpu_name, gpu_why);
    } else {
        test_begin(gpu_name);
        float *gpu = bgrad_run(&gpu_rig, &b, gpu_name);
        bgrad_check(&b, gpu, ref);
        test_end();
        free(gpu);
    }
    free(ref);
    free(b.off);
    free(b.dy);
    free(b.expect);
    free(b.sum_abs);
}

static void run_bias_grad(void) {
    static const uint32_t sizes[] = {0, 33, 128, 1, 300};
    uint32_t *sizes1000 = many_sizes(1000, 23);
    bias_grad_case("bias_grad_bf16_dense_ints", QT_DTYPE_BF16, 70, 1000, 0, NULL, true);
    bias_grad_case("bias_grad_f32_dense_random", QT_DTYPE_F32, 70, 1000, 0, NULL, false);
    bias_grad_case("bias_grad_bf16_dense_one_row", QT_DTYPE_BF16, 33, 1, 0, NULL, false);
    bias_grad_case("bias_grad_f32_grouped_random", QT_DTYPE_F32, 45, 0, 5, sizes, false);
    bias_grad_case("bias_grad_bf16_grouped_ints", QT_DTYPE_BF16, 45, 0, 5, sizes, true);
    bias_grad_case("bias_grad_f32_members1000", QT_DTYPE_F32, 20, 0, 1000, sizes1000, false);
    free(sizes1000);
}

// Every description of the GEMM tier fits the public device report's field whole
// (qt_device_info.gemm_tier), for every setting on an sm_90a device and on others.
static void test_tier_descriptions_fit(void) {
    test_begin("gemm_tier_descriptions_fit_the_device_report");
    static modules loaded;
    loaded.function[KERNEL_GEMM_BF16_SM90A] = (CUfunction)(uintptr_t)1;  // never called
    static const backend_gemm_tier settings[] = {BACKEND_GEMM_TIER_AUTO, BACKEND_GEMM_TIER_SM90A,
                                                 BACKEND_GEMM_TIER_PORTABLE};
    size_t field = sizeof ((qt_device_info *)0)->gemm_tier;
    for (int cc_minor = 0; cc_minor <= 1; cc_minor++) {
        for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
            gemm_tier_device d = {.gpu = true, .cc_major = 9, .cc_minor = cc_minor,
                                  .sm_count = 132, .setting = settings[i], .modules = &loaded};
            size_t length = strlen(gemm_tier_describe(&d));
            CHECK(length > 0 && length < field, "setting %zu, cc 9.%d: %zu characters for a "
                  "field of %zu", i, cc_minor, length, field);
        }
    }
    test_end();
}

// What a profile names for an op (backend_launched): the sm_90a tier's kernel and persistent
// grid, one CTA per SM but never more CTAs than tiles nor than ctas_max, where the tier takes
// the GEMM; the op's own kernel and shape on the reference backend.
static void test_tier_launched(void) {
    test_begin("gemm_tier_launched_names_the_kernel_and_grid_that_run");
    static prog_op op;
    memset(&op, 0, sizeof op);
    gemm_args g;
    memset(&g, 0, sizeof g);
    g.format = GEMM_FORMAT_FP8;
    g.grouping = GEMM_DENSE;
    g.flags = GEMM_FLAG_SPLIT_ACCUMULATE;  // a gradient's GEMM: the 128 x 192 tile
    g.m = 8192, g.n = 16384, g.k = 4096;
    op.kernel = KERNEL_GEMM_FP8_PORTABLE;
    op.args_bytes = sizeof g;
    op.shape = (launch_shape){{128, 64, 1}, {128, 1, 1}, 0};
    static modules loaded;
    gemm_tier_device d = {.gpu = true, .cc_major = 9, .cc_minor = 0, .sm_count = 132,
                          .setting = BACKEND_GEMM_TIER_AUTO, .modules = &loaded};
    struct {
        uint32_t m, n, ctas_max, grid;
    } cases[] = {
        {8192, 16384, 0, 132},  // 64 x 86 tiles: one CTA per SM
        {8192, 16384, 100, 100},
        {256, 1024, 0, 12},     // 2 x 6 tiles
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g.m = cases[i].m, g.n = cases[i].n;
        memcpy(op.args, &g, sizeof g);
        d.ctas_max = cases[i].ctas_max;
        kernel_id kernel = KERNEL_COUNT;
        launch_shape shape;
        memset(&shape, 0, sizeof shape);
        gemm_tier_launched(&d, &op, &kernel, &shape);
        CHECK(kernel == KERNEL_GEMM_FP8_SM90A, "case %zu: kernel %s", i,
              kernel < KERNEL_COUNT ? kernel_table[kernel].symbol : "none");
        CHECK(shape.grid[0] == cases[i].grid && shape.grid[1] == 1 && shape.grid[2] == 1,
              "case %zu: grid %ux%ux%u, expected %ux1x1", i, shape.grid[0], shape.grid[1],
              shape.grid[2], cases[i].grid);
        CHECK(shape.block[0] == GEMM_SM90A_THREADS &&
                  shape.smem_bytes == GEMM_SM90A_SMEM_BYTES(GEMM_SM90A_TILE_N_SPLIT),
              "case %zu: block %u, %u bytes of shared memory", i, shape.block[0],
              shape.smem_bytes);
    }
    static backend ref;
    backend_open_ref(&ref);
    kernel_id kernel = KERNEL_COUNT;
    launch_shape shape;
    backend_launched(&ref, &op, &kernel, &shape);
    CHECK(kernel == KERNEL_GEMM_FP8_PORTABLE && shape.grid[0] == 128 && shape.grid[1] == 64,
          "reference backend: kernel %d, grid %ux%u", (int)kernel, shape.grid[0],
          shape.grid[1]);
    backend_close(&ref);
    test_end();
}

// Which portable kernel a GPU launches (gemm_tier_portable_kernel): the format's small-tile entry
// point for a GEMM of the small tile, the op's own kernel for the large tile, for ops that are no
// portable GEMM, and on the reference backend. The GPU cases of this file then run every
// small-tile GEMM through those entry points against the twin.
static void test_tier_small_kernel(void) {
    test_begin("gemm_tier_small_tile_takes_its_own_entry_point");
    static modules loaded;
    static const struct {
        kernel_id portable, small;
    } pairs[] = {
        {KERNEL_GEMM_BF16_PORTABLE, KERNEL_GEMM_BF16_PORTABLE_SMALL},
        {KERNEL_GEMM_FP8_PORTABLE, KERNEL_GEMM_FP8_PORTABLE_SMALL},
        {KERNEL_GEMM_FP8_BLOCK_PORTABLE, KERNEL_GEMM_FP8_BLOCK_PORTABLE_SMALL},
        {KERNEL_GEMM_MXFP8_PORTABLE, KERNEL_GEMM_MXFP8_PORTABLE_SMALL},
        {KERNEL_GEMM_NVFP4_PORTABLE, KERNEL_GEMM_NVFP4_PORTABLE_SMALL},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        loaded.function[pairs[i].small] = (CUfunction)(uintptr_t)1;  // never called
    }
    gemm_tier_device gpu = {.gpu = true, .cc_major = 9, .cc_minor = 0, .sm_count = 132,
                            .setting = BACKEND_GEMM_TIER_AUTO, .modules = &loaded};
    gemm_tier_device ref = {.gpu = false, .modules = &loaded};
    static prog_op op;
    gemm_args g;
    memset(&g, 0, sizeof g);
    op.args_bytes = sizeof g;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        op.kernel = pairs[i].portable;
        for (uint32_t tile = GEMM_TILE_LARGE; tile <= GEMM_TILE_SMALL; tile++) {
            g.tile = tile;
            memcpy(op.args, &g, sizeof g);
            kernel_id want = tile == GEMM_TILE_SMALL ? pairs[i].small : pairs[i].portable;
            kernel_id got = gemm_tier_portable_kernel(&gpu, &op);
            CHECK(got == want, "%s, tile %u: %s", kernel_table[op.kernel].symbol, tile,
                  got < KERNEL_COUNT ? kernel_table[got].symbol : "none");
            got = gemm_tier_portable_kernel(&ref, &op);
            CHECK(got == op.kernel, "%s on the reference backend: %s",
                  kernel_table[op.kernel].symbol,
                  got < KERNEL_COUNT ? kernel_table[got].symbol : "none");
        }
    }
    op.kernel = KERNEL_GEMM_SPLIT_REDUCE;  // takes gemm_args too, and is no GEMM tile
    g.tile = GEMM_TILE_SMALL;
    memcpy(op.args, &g, sizeof g);
    CHECK(gemm_tier_portable_kernel(&gpu, &op) == KERNEL_GEMM_SPLIT_REDUCE,
          "the split reduction keeps its kernel");
    test_end();
}

// Launch shapes come from capacities; a GEMM whose row tiles exceed the grid limit is refused
// with an operating error naming the limit, and empty GEMMs append nothing.
static void test_op_gemm_limits(void) {
    test_begin("gemm_op_grid_limit_and_empty");
    static program prog;
    static arena dev;
    rig_arena_init(&dev, ARENA_KIND_DEVICE, "limits");
    arena_handle h;
    RIG_OK(arena_reserve(&dev, "x", 256, 256, ARENA_CAT_WORKSPACE, ARENA_LIFETIME_PERSISTENT, 0,
                         &h));
    prog_ref ref = {&dev, h, 0}, none = {0};
    rig_prog_init(&prog, "limits");
    op_gemm_desc g = {0};
    g.format = GEMM_FORMAT_BF16;
    // 72 columns and k 72: above the skinny kernels' 64 (gemm.h), so the portable tier's grid.
    g.m = 65535u * 128u + 1u;
    g.n = 72;
    g.k = 72;
    g.a = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, g.m, g.k, false, false, ref, none,
                             none);
    g.b = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, g.n, g.k, false, false, ref, none,
                             none);
    g.alpha = 1.0f;
    g.d = ref;
    g.d_dtype = QT_DTYPE_F32;
    qt_status s = op_gemm(&prog, "too_tall", &g);
    CHECK(s == QT_ERR_INPUT, "expected QT_ERR_INPUT, got %s", qt_status_name(s));
    CHECK(strstr(qt_error_message(), "grid limit") != NULL, "message: %s", qt_error_message());
    CHECK(prog.op_count == 0, "%u ops appended", prog.op_count);
    g.m = 0;
    RIG_OK(op_gemm(&prog, "empty", &g));
    CHECK(prog.op_count == 0, "an empty GEMM appended %u ops", prog.op_count);
    g.m = 130;
    RIG_OK(op_gemm(&prog, "shape", &g));
    // Two 128 x 128 tiles: far fewer than SMs, so the 64 x 64 tile (3 row tiles of 2 column
    // tiles).
    launch_shape shape = op_gemm_shape(&g);
    CHECK(prog.op_count == 1 && shape.grid[0] == 2 && shape.grid[1] == 3 && shape.grid[2] == 1 &&
              shape.block[0] == GEMM_TILE_THREADS(GEMM_TILE_SMALL) &&
              shape.smem_bytes == GEMM_PORTABLE_SMEM_BYTES_TILE(GEMM_FORMAT_BF16,
                                                                GEMM_TILE_SMALL),
          "shape %ux%ux%u, %u threads, %u bytes", shape.grid[0], shape.grid[1], shape.grid[2],
          shape.block[0], shape.smem_bytes);
    gemm_args args;
    memcpy(&args, prog.ops[0].args, sizeof args);
    CHECK(args.tile == GEMM_TILE_SMALL, "tile %u in the args", args.tile);
    g.tile = OP_GEMM_TILE_LARGE;
    shape = op_gemm_shape(&g);
    CHECK(shape.grid[1] == 2 && shape.block[0] == GEMM_THREADS &&
              shape.smem_bytes == GEMM_PORTABLE_SMEM_BYTES(GEMM_FORMAT_BF16),
          "forced large: shape %ux%ux%u, %u threads, %u bytes", shape.grid[0], shape.grid[1],
          shape.grid[2], shape.block[0], shape.smem_bytes);
    // Exactly OP_GEMM_SMALL_TILE_BELOW large tiles: the large tile.
    g.tile = OP_GEMM_TILE_AUTO;
    g.m = 128u * OP_GEMM_SMALL_TILE_BELOW;
    CHECK(op_gemm_tile(&g) == GEMM_TILE_LARGE, "%u x %u: tile %u", g.m, g.n, op_gemm_tile(&g));
    g.m -= 128u;
    CHECK(op_gemm_tile(&g) == GEMM_TILE_SMALL, "%u x %u: tile %u", g.m, g.n, op_gemm_tile(&g));
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The emulated formats' decode, exhaustively: every (code, scale) pair through each decode path
// of the GEMM kernels (qt_gemm_decode_table) against the twin, and the twin against FP64, bit
// for bit: NaN included, since the kernels' conversions and qt_f32_to_bf16 both give the
// canonical NaN 0x7FFF.

static uint16_t *decode_table_run(rig *r, uint32_t path, uint32_t elem, uint32_t piece,
                                  const char *name, uint64_t bytes) {
    rig_reset(r);
    gregion g;
    greg_reserve(r, &g, "table", bytes, true);
    RIG_OK(op_gemm_decode_table(&r->prog, name, path, elem, piece, greg_ref(r, &g)));
    rig_bind(r);
    greg_upload(r, &g, NULL, 0);
    rig_execute(r);
    uint16_t *out = malloc(bytes);
    RIG_OK(backend_read(&r->be, out, greg_ref(r, &g), bytes));
    greg_check(r, &g, "decode table");
    greg_free(&g);
    return out;
}

// The exact value of (code, scale) in FP64, as BF16 bits: the product is exact in FP32 (also
// when subnormal), so one conversion to float and qt_f32_to_bf16 give its BF16 rounding.
static uint16_t decode_exact(uint32_t path, uint32_t elem, uint32_t code, uint32_t scale) {
    double v;
    if (path == GEMM_DECODE_NVFP4) {
        v = (double)qt_e2m1_to_f32((uint8_t)code) * qt_e4m3_to_f32((uint8_t)scale);
    } else {
        double c = qt_gemm_fp8_value((uint8_t)code, elem);
        v = scale == 255 ? NAN : ldexp(c, (int)scale - 127);
    }
    return qt_f32_to_bf16((float)v);
}

// Pieces of 16 (the large tile's decode) and of 8 elements (the small tile's) on the GPU.
static void decode_table_case(uint32_t path, uint32_t elem, const char *name) {
    uint32_t codes = GEMM_DECODE_TABLE_CODES(path);
    uint64_t bytes = 256ull * codes * sizeof(uint16_t);
    test_begin(name);
    uint16_t *ref = decode_table_run(&ref_rig, path, elem, 16, name, bytes);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < 256 * codes; i++) {
        uint16_t e = decode_exact(path, elem, i % codes, i / codes);
        if (ref[i] != e && bad++ < 6) {
            CHECK(false, "scale 0x%02x code 0x%02x: twin 0x%04x, exact 0x%04x", i / codes,
                  i % codes, ref[i], e);
        }
    }
    CHECK(bad == 0, "%u of %u twin values wrong", bad, 256 * codes);
    test_end();
    for (uint32_t piece = 16; piece >= 8; piece /= 2) {
        char gpu_name[96];
        snprintf(gpu_name, sizeof gpu_name, "%s_piece%u_gpu", name, piece);
        if (!gpu_ok) {
            test_skip(gpu_name, gpu_why);
            continue;
        }
        test_begin(gpu_name);
        gpu_rig.be.gemm_tier = BACKEND_GEMM_TIER_PORTABLE;
        uint16_t *gpu = decode_table_run(&gpu_rig, path, elem, piece, gpu_name, bytes);
        bad = 0;
        for (uint32_t i = 0; i < 256 * codes; i++) {
            if (gpu[i] != ref[i] && bad++ < 6) {
                CHECK(false, "scale 0x%02x code 0x%02x: gpu 0x%04x, twin 0x%04x", i / codes,
                      i % codes, gpu[i], ref[i]);
            }
        }
        CHECK(bad == 0, "%u of %u decoded values differ", bad, 256 * codes);
        test_end();
        free(gpu);
    }
    free(ref);
}

static void run_decode_tables(void) {
    decode_table_case(GEMM_DECODE_MXFP8_ROWWISE, GEMM_ELEM_E4M3, "gemm_decode_mxfp8_e4m3_rowwise");
    decode_table_case(GEMM_DECODE_MXFP8_ROWWISE, GEMM_ELEM_E5M2, "gemm_decode_mxfp8_e5m2_rowwise");
    decode_table_case(GEMM_DECODE_MXFP8_OUTER, GEMM_ELEM_E4M3, "gemm_decode_mxfp8_e4m3_outer");
    decode_table_case(GEMM_DECODE_MXFP8_OUTER, GEMM_ELEM_E5M2, "gemm_decode_mxfp8_e5m2_outer");
    decode_table_case(GEMM_DECODE_NVFP4, GEMM_ELEM_E2M1, "gemm_decode_nvfp4");
}

// ---------------------------------------------------------------------------------------------
// A split-K GEMM's reduction fused with the activation of its D (op_gemm_act, ptx/act.h
// gemm_act_args) against the two ops it replaces: one program holds both forms over the same
// operands (own workspaces and outputs), and D, the activation's output and its amax must agree
// bit for bit. GPU units (`_gpu`) compare the GPU's fused form with its unfused pair and with the
// reference backend's fused form: the operands are small integers, so every part's sum is exact
// and the GEMMs of the two backends agree too.

typedef struct split_act_form {
    uint32_t seed;
    uint32_t format;  // GEMM_FORMAT_BF16 | GEMM_FORMAT_FP8
    uint32_t m, n, k, parts;
    uint32_t act;
    bool backward;
    uint32_t d_dtype, out_dtype, x_dtype, act_bias_dtype;
    bool gemm_bias, act_bias, amax, specials;  // specials: NaN, Inf, huge and tiny C and x
    bool in_place;  // backward, out_dtype = d_dtype: both forms write dx over D (act_args.out)
} split_act_form;

// Outputs of one run: [0] unfused, [1] fused.
typedef struct split_act_result {
    uint8_t *d[2], *out[2];
    float amax[2];
    size_t d_bytes, out_bytes;
    uint32_t fused_kernel;  // the fused op's kernel id
    uint32_t ops;           // ops in the program
} split_act_result;

static uint32_t dtype_bytes(uint32_t dtype) { return dtype == QT_DTYPE_BF16 ? 2u : 4u; }

// Values of a tensor in a dtype: normal(0, scale), with specials (NaN, +-Inf, -0, huge, tiny and
// GELU's and SiLU's cut-off regions) at about one element in 16 when asked.
static uint8_t *split_act_values(uint32_t dtype, size_t count, double scale, bool specials) {
    static const uint32_t bits[] = {0x7FC00000u, 0xFFC12345u, 0x7F800000u, 0xFF800000u,
                                    0x80000000u, 0x00000000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                    0x00000001u, 0x80400000u, 0x41200000u, 0xC1200000u,
                                    0x42B00000u, 0xC2D00000u, 0x3F800000u, 0xC0800000u};
    uint8_t *out = malloc(count * dtype_bytes(dtype));
    for (size_t i = 0; i < count; i++) {
        float v = (float)(rng_normal() * scale);
        if (specials && rng_int(0, 15) == 0) v = qt_bits_f32(bits[rng_int(0, 15)]);
        out_store(dtype, out, i, v);
    }
    return out;
}

static const char *act_name(uint32_t act) {
    return act == QT_ACT_GELU ? "gelu" : act == QT_ACT_SILU ? "silu" : "relu";
}

// Builds, runs and reads back both forms of f on rig r.
static void split_act_run(rig *r, const split_act_form *f, split_act_result *res) {
    rng_state = f->seed;
    const uint32_t m = f->m, n = f->n, k = f->k;
    const bool fp8 = f->format == GEMM_FORMAT_FP8;
    const size_t ab_bytes = fp8 ? 1u : 2u;
    QT_ASSERT(!f->in_place || (f->backward && f->out_dtype == f->d_dtype));
    uint8_t *a = malloc((size_t)m * k * ab_bytes), *b = malloc((size_t)n * k * ab_bytes);
    for (size_t i = 0; i < (size_t)m * k; i++) {
        if (fp8) a[i] = qt_f32_to_e4m3((float)rng_int(-2, 2));
        else ((uint16_t *)a)[i] = qt_f32_to_bf16((float)rng_int(-2, 2));
    }
    for (size_t i = 0; i < (size_t)n * k; i++) {
        if (fp8) b[i] = qt_f32_to_e4m3((float)rng_int(-2, 2));
        else ((uint16_t *)b)[i] = qt_f32_to_bf16((float)rng_int(-2, 2));
    }
    const float tensor_scales[2] = {0.5f, 2.0f}, zeros[2] = {0.0f, 0.0f};
    uint8_t *bias = split_act_values(QT_DTYPE_F32, n, 0.5, false);
    uint8_t *c = split_act_values(f->d_dtype, (size_t)m * n, 2.0, true);
    uint8_t *x = split_act_values(f->x_dtype, (size_t)m * n, 3.0, f->specials);
    uint8_t *act_bias_values = split_act_values(f->act_bias_dtype, n, 0.5, false);
    res->d_bytes = (size_t)m * n * dtype_bytes(f->d_dtype);
    res->out_bytes = (size_t)m * n * dtype_bytes(f->out_dtype);

    rig_reset(r);
    arena_handle ha = rig_reserve(r, "a", (uint64_t)m * k * ab_bytes);
    arena_handle hb = rig_reserve(r, "b", (uint64_t)n * k * ab_bytes);
    arena_handle hs = rig_reserve(r, "tensor_scales", sizeof tensor_scales);
    arena_handle hbias = rig_reserve(r, "bias", 4u * n);
    arena_handle hc = rig_reserve(r, "c", res->d_bytes);
    arena_handle hx = rig_reserve(r, "x", (uint64_t)m * n * dtype_bytes(f->x_dtype));
    arena_handle habias = rig_reserve(r, "act_bias", (uint64_t)n * dtype_bytes(f->act_bias_dtype));
    arena_handle hamax = rig_reserve(r, "amax", sizeof zeros);
    arena_handle hws[2], hd[2], hout[2];
    op_gemm_desc g = {0};
    g.format = f->format;
    g.flags = fp8 && f->backward ? GEMM_FLAG_SPLIT_ACCUMULATE : 0u;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = 0.0371f;
    uint32_t elem = fp8 ? GEMM_ELEM_E4M3 : GEMM_ELEM_BF16;
    prog_ref none = {0};
    g.a = op_gemm_operand_of(f->format, elem, m, k, false, false, rig_ref(r, ha, 0), none,
                             fp8 ? rig_ref(r, hs, 0) : none);
    g.b = op_gemm_operand_of(f->format, elem, n, k, false, false, rig_ref(r, hb, 0), none,
                             fp8 ? rig_ref(r, hs, 4) : none);
    g.d_dtype = f->d_dtype;
    if (f->specials) {  // C brings NaN and Inf into D
        g.c = rig_ref(r, hc, 0);
        g.beta = 0.5f;
    }
    if (f->gemm_bias) {
        g.bias = rig_ref(r, hbias, 0);
        g.bias_dtype = QT_DTYPE_F32;
    }
    g.split_parts = f->parts;
    op_act_tensor act_bias = OP_ACT_NONE;
    if (f->act_bias) act_bias = (op_act_tensor){rig_ref(r, habias, 0), f->act_bias_dtype};
    op_act_tensor x_saved = {rig_ref(r, hx, 0), f->x_dtype};
    for (int form = 0; form < 2; form++) {
        char name[16];
        snprintf(name, sizeof name, "ws%d", form);
        hws[form] = rig_reserve(r, name, op_gemm_workspace_bytes(&g, f->parts));
        snprintf(name, sizeof name, "d%d", form);
        hd[form] = rig_reserve(r, name, res->d_bytes);
        snprintf(name, sizeof name, "out%d", form);
        hout[form] = rig_reserve(r, name, res->out_bytes);
        op_gemm_desc gf = g;
        gf.workspace = rig_ref(r, hws[form], 0);
        gf.d = rig_ref(r, hd[form], 0);
        op_act_tensor out = {rig_ref(r, hout[form], 0), f->out_dtype};
        op_act_tensor d = {gf.d, f->d_dtype};
        if (f->in_place) out = d;
        prog_ref amax = f->amax ? rig_ref(r, hamax, 4u * form) : none;
        if (form == 1) {
            uint32_t before = r->prog.op_count;
            op_gemm_act_desc act = {"act", f->act, f->backward, f->backward ? x_saved : OP_ACT_NONE,
                                    act_bias, out, amax};
            CHECK(op_gemm_act_fuses(&gf), "op_gemm_act_fuses refuses a split GEMM");
            RIG_OK(op_gemm_act(&r->prog, "gemm", &gf, &act));
            CHECK(r->prog.op_count == before + 2, "%u ops for the fused form, expected 2",
                  r->prog.op_count - before);
            res->fused_kernel = r->prog.ops[r->prog.op_count - 1].kernel;
        } else {
            RIG_OK(op_gemm(&r->prog, "gemm", &gf));
            if (f->backward) {
                RIG_OK(op_act_backward(&r->prog, "act", f->act, m, n, x_saved, act_bias, d, out,
                                       amax));
            } else {
                RIG_OK(op_act_forward(&r->prog, "act", f->act, m, n, d, act_bias, out, amax));
            }
        }
    }
    res->ops = r->prog.op_count;
    rig_bind(r);
    RIG_OK(backend_write(&r->be, rig_ref(r, ha, 0), a, (uint64_t)m * k * ab_bytes));
    RIG_OK(backend_write(&r->be, rig_ref(r, hb, 0), b, (uint64_t)n * k * ab_bytes));
    RIG_OK(backend_write(&r->be, rig_ref(r, hs, 0), tensor_scales, sizeof tensor_scales));
    RIG_OK(backend_write(&r->be, rig_ref(r, hbias, 0), bias, 4u * n));
    RIG_OK(backend_write(&r->be, rig_ref(r, hc, 0), c, res->d_bytes));
    RIG_OK(backend_write(&r->be, rig_ref(r, hx, 0), x, (uint64_t)m * n * dtype_bytes(f->x_dtype)));
    RIG_OK(backend_write(&r->be, rig_ref(r, habias, 0), act_bias_values,
                         (uint64_t)n * dtype_bytes(f->act_bias_dtype)));
    RIG_OK(backend_write(&r->be, rig_ref(r, hamax, 0), zeros, sizeof zeros));
    rig_execute(r);
    for (int form = 0; form < 2; form++) {
        res->d[form] = malloc(res->d_bytes);
        res->out[form] = malloc(res->out_bytes);
        RIG_OK(backend_read(&r->be, res->d[form], rig_ref(r, hd[form], 0), res->d_bytes));
        arena_handle hdx = f->in_place ? hd[form] : hout[form];
        RIG_OK(backend_read(&r->be, res->out[form], rig_ref(r, hdx, 0), res->out_bytes));
    }
    float amax[2];
    RIG_OK(backend_read(&r->be, amax, rig_ref(r, hamax, 0), sizeof amax));
    res->amax[0] = amax[0];
    res->amax[1] = amax[1];
    free(a);
    free(b);
    free(bias);
    free(c);
    free(x);
    free(act_bias_values);
}

static void split_act_free(split_act_result *res) {
    for (int form = 0; form < 2; form++) {
        free(res->d[form]);
        free(res->out[form]);
    }
}

// Two results of one dtype, element by element; reports the first difference. any_nan: an FP32
// NaN equals any NaN. A GEMM's FP32 D keeps what the arithmetic gives a NaN (the GPU's canonical
// 0x7FFFFFFF, x86's operand payload), unlike the activations' stores, so D of the two backends
// agrees bit for bit except in a NaN's payload.
static void split_act_same(const char *what, const char *label, uint32_t dtype,
                           const uint8_t *got, const uint8_t *want, size_t bytes, bool any_nan) {
    size_t esz = dtype_bytes(dtype);
    for (size_t i = 0; i < bytes / esz; i++) {
        uint32_t g = out_bits(dtype, got, i), w = out_bits(dtype, want, i);
        if (g == w) continue;
        if (any_nan && dtype == QT_DTYPE_F32 && qt_f32_is_nan(qt_bits_f32(g)) &&
            qt_f32_is_nan(qt_bits_f32(w))) {
            continue;
        }
        CHECK(false, "%s: %s differs at element %zu: 0x%08x, expected 0x%08x", label, what, i,
              g, w);
        return;
    }
}

// got against want; across backends (the GPU against the reference) D's FP32 NaNs match any NaN.
static void split_act_compare(const char *label, const split_act_form *f,
                              const split_act_result *got, int got_form,
                              const split_act_result *want, int want_form, bool across) {
    split_act_same("D", label, f->d_dtype, got->d[got_form], want->d[want_form], got->d_bytes,
                   across);
    split_act_same("out", label, f->out_dtype, got->out[got_form], want->out[want_form],
                   got->out_bytes, false);
    CHECK(qt_f32_bits(got->amax[got_form]) == qt_f32_bits(want->amax[want_form]),
          "%s: amax 0x%08x, expected 0x%08x", label, qt_f32_bits(got->amax[got_form]),
          qt_f32_bits(want->amax[want_form]));
}

// Backward with out in D's dtype: both forms again, each writing dx over D (the model's dgrad
// and its activation, runtime/model/model_build.c's mb_gemm_act); each form's dx must be `apart`'s
// unfused out, bit for bit, and so must the amax.
static void split_act_in_place(const char *label, const split_act_form *f, rig *r,
                               const split_act_result *apart) {
    if (!f->backward || f->out_dtype != f->d_dtype) return;
    split_act_form g = *f;
    g.in_place = true;
    split_act_result in;
    split_act_run(r, &g, &in);
    char what[224];
    for (int form = 0; form < 2; form++) {
        snprintf(what, sizeof what, "%s, %s in place vs unfused apart", label,
                 form ? "fused" : "unfused");
        split_act_same("dx", what, f->out_dtype, in.out[form], apart->out[0], in.out_bytes,
                       false);
        CHECK(qt_f32_bits(in.amax[form]) == qt_f32_bits(apart->amax[0]),
              "%s: amax 0x%08x, expected 0x%08x", what, qt_f32_bits(in.amax[form]),
              qt_f32_bits(apart->amax[0]));
    }
    split_act_free(&in);
}

// The combinations of one unit: D and out in BF16 and FP32, with and without the GEMM's bias,
// the amax and special values, on an odd shape (67 x 131, k 640 in 3 parts) and on
// Fashion-MNIST's hidden layer (256 x 1024, k 1024 in 2) for some.
#define SPLIT_ACT_FORMS 16u

static split_act_form split_act_form_of(uint32_t format, uint32_t act, bool backward,
                                        uint32_t i) {
    split_act_form f = {0};
    f.seed = 7001u + 97u * i + 13u * act + (backward ? 5u : 0u) + format;
    f.format = format;
    f.act = act;
    f.backward = backward;
    f.d_dtype = i & 1u ? QT_DTYPE_F32 : QT_DTYPE_BF16;
    f.gemm_bias = (i & 2u) != 0;
    f.amax = (i & 4u) != 0;
    f.specials = (i & 8u) != 0;
    // The other dtypes and the activation's own bias vary with the combination.
    f.out_dtype = (i % 3u) == 0 ? QT_DTYPE_F32 : QT_DTYPE_BF16;
    f.x_dtype = (i % 5u) < 2 ? QT_DTYPE_F32 : QT_DTYPE_BF16;
    f.act_bias = (i % 3u) == 1;
    f.act_bias_dtype = (i & 1u) ? QT_DTYPE_BF16 : QT_DTYPE_F32;
    bool fashion = f.amax && !f.specials && (i & 2u);
    f.m = fashion ? 256 : 67;
    f.n = fashion ? 1024 : 131;
    f.k = fashion ? 1024 : 640;
    f.parts = fashion ? 2 : 3;
    return f;
}

static void split_act_label(const split_act_form *f, char *label, size_t size) {
    snprintf(label, size, "%ux%ux%u/%u d %s out %s%s%s%s%s", f->m, f->n, f->k, f->parts,
             f->d_dtype == QT_DTYPE_BF16 ? "bf16" : "f32",
             f->out_dtype == QT_DTYPE_BF16 ? "bf16" : "f32", f->gemm_bias ? " gemm_bias" : "",
             f->act_bias ? " act_bias" : "", f->amax ? " amax" : "",
             f->specials ? " specials" : "");
}

// One unit: an activation, a direction and a GEMM format, every combination of
// split_act_form_of; on the reference backend, then on the GPU.
static void split_act_unit(uint32_t format, uint32_t act, bool backward) {
    char name[96];
    snprintf(name, sizeof name, "gemm_split_act_%s_%s_%s", act_name(act),
             backward ? "bwd" : "fwd", format_name(format));
    if (case_filter && !strstr(name, case_filter)) return;
    if (!test_shard_take()) return;
    uint32_t want_kernel = backward ? KERNEL_GEMM_SPLIT_REDUCE_ACT_BWD
                                    : KERNEL_GEMM_SPLIT_REDUCE_ACT_FWD;
    test_begin(name);
    for (uint32_t i = 0; i < SPLIT_ACT_FORMS; i++) {
        split_act_form f = split_act_form_of(format, act, backward, i);
        char label[128];
        split_act_label(&f, label, sizeof label);
        split_act_result ref;
        split_act_run(&ref_rig, &f, &ref);
        CHECK(ref.fused_kernel == want_kernel && ref.ops == 5,
              "%s: fused kernel %u in %u ops, expected %u in 5", label, ref.fused_kernel,
              ref.ops, want_kernel);
        split_act_compare(label, &f, &ref, 1, &ref, 0, false);
        split_act_in_place(label, &f, &ref_rig, &ref);
        split_act_free(&ref);
    }
    test_end();
    char gpu_name[112];
    snprintf(gpu_name, sizeof gpu_name, "%s_gpu", name);
    if (!gpu_ok) {
        test_skip(gpu_name, gpu_why);
        return;
    }
    test_begin(gpu_name);
    gpu_rig.be.gemm_tier = BACKEND_GEMM_TIER_PORTABLE;
    for (uint32_t i = 0; i < SPLIT_ACT_FORMS; i++) {
        split_act_form f = split_act_form_of(format, act, backward, i);
        char label[160], what[192];
        split_act_label(&f, label, sizeof label);
        split_act_result ref, gpu;
        split_act_run(&ref_rig, &f, &ref);
        split_act_run(&gpu_rig, &f, &gpu);
        snprintf(what, sizeof what, "%s, gpu fused vs gpu unfused", label);
        split_act_compare(what, &f, &gpu, 1, &gpu, 0, false);
        snprintf(what, sizeof what, "%s, gpu fused vs reference fused", label);
        split_act_compare(what, &f, &gpu, 1, &ref, 1, true);
        snprintf(what, sizeof what, "%s, gpu", label);
        split_act_in_place(what, &f, &gpu_rig, &gpu);
        split_act_free(&ref);
        split_act_free(&gpu);
    }
    test_end();
}

// What op_gemm_act builds: the fused op only for a split dense GEMM with a contiguous D; an
// unsplit GEMM (or a D with a row pitch) keeps the activation's own op, under its name.
static void test_split_act_rule(void) {
    test_begin("gemm_split_act_rule");
    static program prog;
    static arena dev;
    rig_arena_init(&dev, ARENA_KIND_DEVICE, "split_act_rule");
    arena_handle h, hy;
    RIG_OK(arena_reserve(&dev, "x", 1u << 20, 256, ARENA_CAT_WORKSPACE,
                         ARENA_LIFETIME_PERSISTENT, 0, &h));
    // The activation's output apart from D (op_gemm_act allows only dx over D in place).
    RIG_OK(arena_reserve(&dev, "y", 1u << 20, 256, ARENA_CAT_WORKSPACE,
                         ARENA_LIFETIME_PERSISTENT, 0, &hy));
    prog_ref ref = {&dev, h, 0}, yref = {&dev, hy, 0}, none = {0};
    op_gemm_desc g = {0};
    g.format = GEMM_FORMAT_BF16;
    g.m = 64;
    g.n = 96;
    g.k = 512;
    g.alpha = 1.0f;
    g.a = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, g.m, g.k, false, false, ref, none,
                             none);
    g.b = op_gemm_operand_of(GEMM_FORMAT_BF16, GEMM_ELEM_BF16, g.n, g.k, false, false, ref, none,
                             none);
    g.d = ref;
    g.d_dtype = QT_DTYPE_BF16;
    g.workspace = ref;
    op_act_tensor out = {yref, QT_DTYPE_BF16};
    op_gemm_act_desc act = {"gelu#1.y", QT_ACT_GELU, false, OP_ACT_NONE, OP_ACT_NONE, out, none};
    struct {
        uint32_t parts, ldd, ops, last;
        const char *last_name;
    } cases[] = {
        {2, 0, 2, KERNEL_GEMM_SPLIT_REDUCE_ACT_FWD, "gelu#1.y"},
        {2, 96, 2, KERNEL_GEMM_SPLIT_REDUCE_ACT_FWD, "gelu#1.y"},
        {1, 0, 2, KERNEL_ACT_FWD, "gelu#1.y"},
        {2, 100, 3, KERNEL_ACT_FWD, "gelu#1.y"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rig_prog_init(&prog, "split_act_rule");
        g.split_parts = cases[i].parts;
        g.ldd = cases[i].ldd;
        RIG_OK(op_gemm_act(&prog, "fc1.fprop", &g, &act));
        const prog_op *last = prog_op_at(&prog, prog.op_count - 1);
        CHECK(prog.op_count == cases[i].ops && last->kernel == cases[i].last &&
                  strcmp(last->name, cases[i].last_name) == 0,
              "case %zu: %u ops, the last %s '%s'", i, prog.op_count,
              kernel_table[last->kernel].symbol, last->name);
        CHECK(op_gemm_act_fuses(&g) == (cases[i].ops == 2 && cases[i].parts > 1),
              "case %zu: op_gemm_act_fuses", i);
    }
    test_end();
}

static void run_split_act(void) {
    if (!case_filter && test_shard_take()) test_split_act_rule();
    static const uint32_t acts[] = {QT_ACT_RELU, QT_ACT_GELU, QT_ACT_SILU};
    for (uint32_t a = 0; a < 3; a++) {
        split_act_unit(GEMM_FORMAT_BF16, acts[a], false);
        split_act_unit(GEMM_FORMAT_BF16, acts[a], true);
    }
    // Per-tensor FP8 (alpha' from the operands' scales): the Fashion-MNIST current recipe's.
    split_act_unit(GEMM_FORMAT_FP8, QT_ACT_GELU, false);
    split_act_unit(GEMM_FORMAT_FP8, QT_ACT_GELU, true);
}

int main(void) {
    const char *why = NULL;
    rig_open(&ref_rig, BACKEND_REF, &why);
    gpu_ok = rig_open(&gpu_rig, BACKEND_GPU, &why);
    if (!gpu_ok) snprintf(gpu_why, sizeof gpu_why, "%s", why ? why : "no GPU");
    sm90a_ok = gpu_ok && gpu_rig.be.info.cc_major == 9 && gpu_rig.be.info.cc_minor == 0;
    snprintf(sm90a_why, sizeof sm90a_why, "%s",
             gpu_ok ? "the sm_90a GEMM tier needs a compute capability 9.0 GPU" : gpu_why);
    rng_state = 20261122;
    case_filter = getenv("QT_TEST_GEMM_CASES");
    // The groups that are not GEMM cases are one unit each of QT_TEST_SHARD (every GEMM case is
    // one), and only run unfiltered.
    bool whole_groups = case_filter == NULL;
    if (whole_groups && test_shard_take()) test_op_gemm_limits();
    if (whole_groups && test_shard_take()) test_tier_descriptions_fit();
    if (whole_groups && test_shard_take()) test_tier_launched();
    if (whole_groups && test_shard_take()) test_tier_small_kernel();
    run_matrix();
    run_odd_shapes();
    run_training_shapes();
    if (whole_groups && test_shard_take()) test_split_rule();
    run_split_k();
    if (whole_groups && test_shard_take()) test_skinny_rule();
    run_skinny();
    if (whole_groups && test_shard_take()) run_split_structure();
    if (whole_groups && test_shard_take()) run_decode_tables();
    run_group_shapes();
    run_sm90a_shapes();
    run_sm90a_grouped();
    if (whole_groups && test_shard_take()) run_bias_grad();
    run_split_act();
    if (sm90a_ok) printf("the sm_90a tier took %u of %u GEMM cases\n", sm90a_taken, sm90a_cases);
    rig_close(&ref_rig);
    if (gpu_ok) rig_close(&gpu_rig);
    return test_exit_code();
}
