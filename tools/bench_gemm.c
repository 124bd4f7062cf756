// bench_gemm: TFLOP/s of qtrain's GEMMs next to cuBLASLt's, measured in the same run on the same
// device buffers.
//
// Dense: fprop-layout GEMMs (A [M][K] and B [N][K] K-major, D [M][N] BF16) of the shapes below,
// in every format. Grouped: M-grouped fprop GEMMs (each member its own B) of 65536 rows in all,
// N = K = 2048, with 8 and 128 members, balanced and skewed, in BF16, per-tensor FP8 and FP8
// block, quoted against qtrain's own dense rate at the same FLOPs (a dense 65536 x 2048 x 2048
// GEMM, timed in the same section). `--quick` times the two square shapes only.
//
// FLOPs counted: 2 M N K; grouped, 2 N K times the members' valid rows. Every figure is a median
// of graph replays: qtrain's program through bench_time_graph, cuBLASLt's call captured on the
// same stream and timed the same way (bench_time_captured).
//
// Comparators (tools/bench_cublaslt.h): BF16 against cuBLASLt BF16; per-tensor FP8 against
// cuBLASLt FP8 with the same scale_inv values, fast accumulation on for qtrain's fast kind and
// off for its split kind; FP8 block against cuBLASLt's 1x128 x 128x128 block scaling on the same
// scales; the emulated MXFP8 and NVFP4 against cuBLASLt BF16 at the same shape, the rate their
// emulation on BF16 tensor cores aims at. "<tier> diff" is the relative L2 difference between
// sampled rows of that tier's D and cuBLASLt's, so a comparator that computed another product
// would show; D holds NaN codes before each tier runs, so rows a tier left unwritten show as nan.
// Rounding D to BF16 alone accounts for about 1e-3.
//
// Inputs are bench_inputs, filled once before the timed programs: BF16 normals, FP8 block
// scales uniform in [0.5, 1), per-tensor factors uniform in [0.5, 1). FP8 codes are the bytes of
// BF16 normals with the NaN codes replaced (gemm_bench_recode), so both libraries see finite
// products; block scale bytes are remapped to moderate powers (MXFP8) or positive values
// (NVFP4).
#include <math.h>    // sqrt
#include <stdlib.h>  // malloc, free
#include <string.h>

#include "tools/bench.h"
#include "tools/bench_cublaslt.h"  // bench_lt_time
#include "runtime/ops/op_gemm.h"   // op_gemm
#include "ptx/qt_codec.h"          // qt_bf16_to_f32

// ---------------------------------------------------------------------------------------------
// What is timed

// qtrain's GEMM tiers, each timed on every row, in this order. The backend picks a GEMM's
// kernels when it captures it: "sm90a" takes the sm_90a tier for every GEMM that tier supports
// on a compute capability 9.0 GPU (the portable kernels for the rest and on other GPUs; every
// bench shape is large enough for the automatic choice to agree), "portable" forces the
// portable kernels.
typedef struct gemm_bench_tier {
    const char *name;
    backend_gemm_tier setting;
} gemm_bench_tier;

static const gemm_bench_tier gemm_bench_tiers[] = {
    {"sm90a", BACKEND_GEMM_TIER_SM90A},
    {"portable", BACKEND_GEMM_TIER_PORTABLE},
};
#define GEMM_BENCH_TIER_COUNT (sizeof gemm_bench_tiers / sizeof gemm_bench_tiers[0])
#define GEMM_BENCH_TIERS_MAX 4
_Static_assert(GEMM_BENCH_TIER_COUNT <= GEMM_BENCH_TIERS_MAX, "raise GEMM_BENCH_TIERS_MAX");

static void gemm_bench_use_tier(bench_env *env, const gemm_bench_tier *tier) {
    env->gpu.gemm_tier = tier->setting;
}

typedef struct gemm_bench_kind {
    const char *name;
    uint32_t format, flags, elem;
    bench_lt_mode lt_mode;  // the comparator on the same operands
    bool lt_fast_accum;
    bool emulated;          // compared with cuBLASLt BF16 at the same shape instead
} gemm_bench_kind;

enum { GEMM_BENCH_BF16, GEMM_BENCH_FP8_FAST, GEMM_BENCH_FP8_SPLIT, GEMM_BENCH_FP8_BLOCK };

// BF16 first: the emulated rows of a shape quote its cuBLASLt rate.
static const gemm_bench_kind gemm_bench_kinds[] = {
    [GEMM_BENCH_BF16] = {"bf16", GEMM_FORMAT_BF16, 0, GEMM_ELEM_BF16, BENCH_LT_BF16, false,
                         false},
    [GEMM_BENCH_FP8_FAST] = {"fp8 e4m3 fast-acc", GEMM_FORMAT_FP8, 0, GEMM_ELEM_E4M3,
                             BENCH_LT_FP8, true, false},
    [GEMM_BENCH_FP8_SPLIT] = {"fp8 e4m3 split-acc", GEMM_FORMAT_FP8, GEMM_FLAG_SPLIT_ACCUMULATE,
                              GEMM_ELEM_E4M3, BENCH_LT_FP8, false, false},
    [GEMM_BENCH_FP8_BLOCK] = {"fp8 block 1x128x128", GEMM_FORMAT_FP8_BLOCK, 0, GEMM_ELEM_E4M3,
                              BENCH_LT_FP8_BLOCK, false, false},
    {"mxfp8 e4m3 (emulated)", GEMM_FORMAT_MXFP8, 0, GEMM_ELEM_E4M3, BENCH_LT_BF16, false, true},
    {"nvfp4 (emulated)", GEMM_FORMAT_NVFP4, 0, GEMM_ELEM_E2M1, BENCH_LT_BF16, false, true},
};
#define GEMM_BENCH_KIND_COUNT (sizeof gemm_bench_kinds / sizeof gemm_bench_kinds[0])

typedef struct gemm_bench_shape {
    uint32_t m, n, k;
    bool quick;  // part of --quick
} gemm_bench_shape;

static const gemm_bench_shape gemm_bench_shapes[] = {
    {4096, 4096, 4096, true},   {8192, 8192, 8192, true},    {8192, 28672, 4096, false},
    {8192, 4096, 14336, false}, {4096, 7168, 16384, false},
};

// The grouped section: 65536 rows in all (one MoE layer's tokens), N = K = 2048.
#define GEMM_BENCH_GROUP_ROWS 65536u
#define GEMM_BENCH_GROUP_N 2048u
#define GEMM_BENCH_GROUP_K 2048u

// One GEMM to time: dense (members 0) or M-grouped with stacked B (one per member).
typedef struct gemm_bench_problem {
    const gemm_bench_kind *kind;
    uint32_t m, n, k;          // grouped: m = the rows of all members
    uint32_t members;
    bench_member_sizes sizes;  // grouped only
} gemm_bench_problem;

typedef struct gemm_bench_result {
    double ms[GEMM_BENCH_TIERS_MAX];  // qtrain, per tier; <= 0: failed
    double lt_ms;                     // cuBLASLt on the same operands; <= 0: not run or failed
    char lt_why[256];                 // why not, when it was tried
    double rel_diff[GEMM_BENCH_TIERS_MAX];  // per tier; negative: not compared
} gemm_bench_result;

// ---------------------------------------------------------------------------------------------
// Inputs

typedef struct gemm_bench_input {
    bench_inputs inputs;
    prog_ref a, b;                  // codes; B holds one copy per member when grouped
    prog_ref a_scale, b_scale;      // block scales (4-byte stand-ins when the format has none)
    prog_ref a_ts, b_ts;            // per-tensor factors, one per member when grouped
    prog_ref d, d_lt;               // qtrain's result, cuBLASLt's
    prog_ref workspace;             // cuBLASLt's
    prog_ref lt_a_scale, lt_b_scale;  // FP8 block scales in cuBLASLt's layouts
    bool lt_a_relayout, lt_b_relayout;  // those are copies (else the same buffers)
} gemm_bench_input;

static uint64_t gemm_bench_data_bytes(uint32_t format, uint32_t rows, uint32_t k) {
    if (format == GEMM_FORMAT_BF16) return (uint64_t)rows * k * 2;
    if (format == GEMM_FORMAT_NVFP4) return (uint64_t)rows * ((k + 1) / 2);
    return (uint64_t)rows * k;
}

// Block scale entries of a K-major operand (A: 1x128 or 1x32/1x16; B: 128x128 for FP8 block).
static uint64_t gemm_bench_scale_bytes(uint32_t format, uint32_t rows, uint32_t k, bool is_b) {
    uint64_t kb = (k + qt_gemm_block_len(format) - 1) / qt_gemm_block_len(format);
    switch (format) {
    case GEMM_FORMAT_FP8_BLOCK:
        return is_b ? (uint64_t)((rows + 127) / 128) * kb * 4 : (uint64_t)rows * kb * 4;
    case GEMM_FORMAT_MXFP8:
    case GEMM_FORMAT_NVFP4:
        return (uint64_t)rows * kb;
    default:
        return 0;
    }
}

static uint64_t gemm_bench_address(prog_ref r) {
    return arena_address(r.arena, r.region) + r.offset;
}

static prog_ref gemm_bench_fill(bench_inputs *in, const char *name, uint64_t bytes,
                                uint32_t format, bool scale, uint64_t seed) {
    if (scale && format == GEMM_FORMAT_FP8_BLOCK) {
        return bench_inputs_f32(in, name, bytes, seed, 0.5f, 1.0f);
    }
    // Codes and byte scales: the bytes of BF16 normals, recoded after the fill where needed.
    return bench_inputs_bf16(in, name, bytes, seed);
}

// Byte substitutions applied on the host after the fill (outside every timing).
enum { GEMM_BENCH_FINITE_E4M3, GEMM_BENCH_E8M0_SCALE, GEMM_BENCH_E4M3_SCALE };

static uint8_t gemm_bench_recoded(uint32_t rule, uint8_t c) {
    switch (rule) {
    case GEMM_BENCH_FINITE_E4M3:  // S.1111.111 is NaN: the neighbouring code, +-448
        return (c & 0x7Fu) == 0x7Fu ? (uint8_t)(c ^ 1u) : c;
    case GEMM_BENCH_E8M0_SCALE:  // 2^-7 .. 2^8: no NaN (0xFF), no overflowing decodes
        return (uint8_t)(120u + (c & 15u));
    default:  // GEMM_BENCH_E4M3_SCALE: NVFP4 block scales are positive; 0.5 .. 7.5
        return (uint8_t)(0x30u + (c & 0x1Fu));
    }
}

static bool gemm_bench_recode(bench_env *env, prog_ref ref, uint64_t bytes, uint32_t rule) {
    static uint8_t chunk[16u << 20];
    uint8_t map[256];
    for (uint32_t c = 0; c < 256; c++) map[c] = gemm_bench_recoded(rule, (uint8_t)c);
    for (uint64_t done = 0; done < bytes;) {
        uint64_t n = bytes - done < sizeof chunk ? bytes - done : sizeof chunk;
        prog_ref at = ref;
        at.offset += done;
        if (backend_read(&env->gpu, chunk, at, n) != QT_OK) return false;
        for (uint64_t i = 0; i < n; i++) chunk[i] = map[chunk[i]];
        if (backend_write(&env->gpu, at, chunk, n) != QT_OK) return false;
        done += n;
    }
    return true;
}

static bool gemm_bench_recode_inputs(bench_env *env, const gemm_bench_input *in,
                                     const gemm_bench_problem *p) {
    uint32_t f = p->kind->format;
    uint64_t copies = p->members ? p->members : 1;
    bool ok = true;
    if (f == GEMM_FORMAT_FP8 || f == GEMM_FORMAT_FP8_BLOCK || f == GEMM_FORMAT_MXFP8) {
        ok = gemm_bench_recode(env, in->a, gemm_bench_data_bytes(f, p->m, p->k),
                               GEMM_BENCH_FINITE_E4M3) &&
             gemm_bench_recode(env, in->b, copies * gemm_bench_data_bytes(f, p->n, p->k),
                               GEMM_BENCH_FINITE_E4M3);
    }
    if (f == GEMM_FORMAT_MXFP8 || f == GEMM_FORMAT_NVFP4) {
        uint32_t rule = f == GEMM_FORMAT_MXFP8 ? GEMM_BENCH_E8M0_SCALE : GEMM_BENCH_E4M3_SCALE;
        ok = ok &&
             gemm_bench_recode(env, in->a_scale,
                               gemm_bench_scale_bytes(f, p->m, p->k, false), rule) &&
             gemm_bench_recode(env, in->b_scale,
                               copies * gemm_bench_scale_bytes(f, p->n, p->k, true), rule);
    }
    return ok;
}

// Copies an f32 scale matrix [outer][inner] into cuBLASLt's [outer][roundup(inner, 4)].
static bool gemm_bench_relayout(bench_env *env, prog_ref from, prog_ref to, uint32_t outer,
                                uint32_t inner) {
    uint32_t ld = bench_lt_scale_ld(inner);
    float *src = malloc((size_t)outer * inner * sizeof *src);
    float *dst = calloc((size_t)outer * ld, sizeof *dst);
    bool ok = src && dst &&
              backend_read(&env->gpu, src, from, (uint64_t)outer * inner * 4) == QT_OK;
    for (uint32_t o = 0; ok && o < outer; o++) {
        memcpy(dst + (size_t)o * ld, src + (size_t)o * inner, (size_t)inner * sizeof *src);
    }
    ok = ok && backend_write(&env->gpu, to, dst, (uint64_t)outer * ld * 4) == QT_OK;
    free(src);
    free(dst);
    return ok;
}

// cuBLASLt's FP8 block scales: qtrain's own buffers where the layouts coincide, else copies.
static void gemm_bench_lt_scales(gemm_bench_input *in, const gemm_bench_problem *p) {
    uint32_t kb = (p->k + GEMM_BLOCK_FP8 - 1) / GEMM_BLOCK_FP8;
    uint32_t nb = (p->n + GEMM_BLOCK_FP8 - 1) / GEMM_BLOCK_FP8;
    in->lt_a_relayout = bench_lt_scale_ld(p->m) != p->m;
    in->lt_b_relayout = bench_lt_scale_ld(kb) != kb;
    in->lt_a_scale = in->lt_a_relayout
                         ? bench_inputs_region(&in->inputs, "lt_a_scale",
                                               4ull * kb * bench_lt_scale_ld(p->m))
                         : in->a_scale;
    in->lt_b_scale = in->lt_b_relayout
                         ? bench_inputs_region(&in->inputs, "lt_b_scale",
                                               4ull * nb * bench_lt_scale_ld(kb))
                         : in->b_scale;
}

static bool gemm_bench_prepare(bench_env *env, gemm_bench_input *in,
                               const gemm_bench_problem *p, bool lt) {
    uint32_t f = p->kind->format;
    uint64_t copies = p->members ? p->members : 1;
    bench_inputs *bi = &in->inputs;
    bench_inputs_begin(bi, "gemm");
    in->a = gemm_bench_fill(bi, "a", gemm_bench_data_bytes(f, p->m, p->k), f, false, 1);
    in->b = gemm_bench_fill(bi, "b", copies * gemm_bench_data_bytes(f, p->n, p->k), f, false,
                            2);
    in->a_scale = gemm_bench_fill(bi, "a_scale", gemm_bench_scale_bytes(f, p->m, p->k, false),
                                  f, true, 3);
    in->b_scale = gemm_bench_fill(bi, "b_scale",
                                  copies * gemm_bench_scale_bytes(f, p->n, p->k, true), f, true,
                                  4);
    in->a_ts = bench_inputs_f32(bi, "a_tensor_scale", copies * 4, 5, 0.5f, 1.0f);
    in->b_ts = bench_inputs_f32(bi, "b_tensor_scale", copies * 4, 6, 0.5f, 1.0f);
    in->d = bench_inputs_region(bi, "d", (uint64_t)p->m * p->n * 2);
    in->lt_a_relayout = in->lt_b_relayout = false;
    if (lt) {
        in->d_lt = bench_inputs_region(bi, "d_cublaslt", (uint64_t)p->m * p->n * 2);
        in->workspace = bench_inputs_region(bi, "cublaslt_workspace", BENCH_LT_WORKSPACE_BYTES);
        if (f == GEMM_FORMAT_FP8_BLOCK) gemm_bench_lt_scales(in, p);
    }
    if (p->members) bench_inputs_group(bi, p->m, p->members, p->sizes);
    if (!bench_inputs_ready(env, bi)) return false;
    uint32_t kb = (p->k + GEMM_BLOCK_FP8 - 1) / GEMM_BLOCK_FP8;
    bool ok = gemm_bench_recode_inputs(env, in, p);
    if (ok && in->lt_a_relayout) ok = gemm_bench_relayout(env, in->a_scale, in->lt_a_scale, kb,
                                                          p->m);
    if (ok && in->lt_b_relayout) {
        ok = gemm_bench_relayout(env, in->b_scale, in->lt_b_scale,
                                 (p->n + GEMM_BLOCK_FP8 - 1) / GEMM_BLOCK_FP8, kb);
    }
    if (!ok) {
        fprintf(stderr, "bench gemm: preparing the inputs: %s\n", qt_error_message());
        bench_inputs_release(env, bi);
    }
    return ok;
}

// ---------------------------------------------------------------------------------------------
// Timing

static op_gemm_desc gemm_bench_desc(const gemm_bench_input *in, const gemm_bench_problem *p) {
    const gemm_bench_kind *kind = p->kind;
    uint32_t f = kind->format;
    prog_ref none = {0};
    bool scaled = f == GEMM_FORMAT_FP8_BLOCK || f == GEMM_FORMAT_MXFP8 ||
                  f == GEMM_FORMAT_NVFP4;
    bool tensor = f == GEMM_FORMAT_FP8 || f == GEMM_FORMAT_NVFP4;
    op_gemm_desc g = {0};
    g.format = f;
    g.grouping = GEMM_DENSE;
    g.flags = kind->flags;
    g.m = p->m;
    g.n = p->n;
    g.k = p->k;
    g.a = op_gemm_operand_of(f, kind->elem, p->m, p->k, false, false, in->a,
                             scaled ? in->a_scale : none, tensor ? in->a_ts : none);
    g.b = op_gemm_operand_of(f, kind->elem, p->n, p->k, false, f == GEMM_FORMAT_FP8_BLOCK,
                             in->b, scaled ? in->b_scale : none, tensor ? in->b_ts : none);
    g.alpha = 1.0f;
    g.d = in->d;
    g.d_dtype = QT_DTYPE_BF16;
    if (p->members) {
        g.grouping = GEMM_GROUP_M;
        g.count = p->members;
        g.row_offsets = in->inputs.row_offsets;
        g.first_dims = in->inputs.first_dims;
        // Stacked weights: member i's B and its scales lie i copies further.
        g.b.data_member_bytes = gemm_bench_data_bytes(f, p->n, p->k);
        g.b.scale_member_bytes = gemm_bench_scale_bytes(f, p->n, p->k, true);
        if (tensor) {
            g.a.flags |= GEMM_OPERAND_TENSOR_PER_MEMBER;
            g.b.flags |= GEMM_OPERAND_TENSOR_PER_MEMBER;
        }
    }
    return g;
}

// qtrain's GEMM alone in a program (its operands and D live in the input arena).
static double gemm_bench_qtrain(bench_env *env, const gemm_bench_input *in,
                                const gemm_bench_problem *p) {
    op_gemm_desc g = gemm_bench_desc(in, p);
    bench_case_begin(env);
    double ms = -1;
    if (op_gemm(&env->prog, p->kind->name, &g) == QT_OK) {
        ms = bench_time_program(env);
    } else {
        fprintf(stderr, "bench gemm: %s\n", qt_error_message());
    }
    bench_case_end(env);
    return ms;
}

static double gemm_bench_cublaslt(bench_env *env, const gemm_bench_input *in,
                                  const gemm_bench_problem *p, char *why, size_t why_bytes) {
    const gemm_bench_kind *kind = p->kind;
    bench_lt_gemm g = {0};
    g.mode = kind->lt_mode;
    g.fast_accum = kind->lt_fast_accum;
    g.m = p->m;
    g.n = p->n;
    g.k = p->k;
    g.a = gemm_bench_address(in->a);
    g.b = gemm_bench_address(in->b);
    g.d = gemm_bench_address(in->d_lt);
    if (g.mode == BENCH_LT_FP8) {
        g.a_scale = gemm_bench_address(in->a_ts);
        g.b_scale = gemm_bench_address(in->b_ts);
    } else if (g.mode == BENCH_LT_FP8_BLOCK) {
        g.a_scale = gemm_bench_address(in->lt_a_scale);
        g.b_scale = gemm_bench_address(in->lt_b_scale);
    }
    g.workspace = gemm_bench_address(in->workspace);
    return bench_lt_time(env, &g, why, why_bytes);
}

// Rows of D compared between the two libraries, spread over all of D.
#define GEMM_BENCH_SAMPLE_ROWS 64u

static bool gemm_bench_sample(bench_env *env, prog_ref d, uint32_t m, uint32_t n, float *out) {
    uint16_t *row = malloc((size_t)n * sizeof *row);
    bool ok = row != NULL;
    for (uint32_t s = 0; ok && s < GEMM_BENCH_SAMPLE_ROWS; s++) {
        prog_ref at = d;
        at.offset += (uint64_t)s * m / GEMM_BENCH_SAMPLE_ROWS * n * 2;
        ok = backend_read(&env->gpu, row, at, (uint64_t)n * 2) == QT_OK;
        for (uint32_t j = 0; ok && j < n; j++) out[(size_t)s * n + j] = qt_bf16_to_f32(row[j]);
    }
    free(row);
    return ok;
}

static bool gemm_bench_poison(bench_env *env, prog_ref d, uint64_t bytes) {
    CUresult result = drv.cuMemsetD8Async((CUdeviceptr)gemm_bench_address(d), 0xFF, bytes,
                                          env->gpu.stream);
    if (result != CUDA_SUCCESS) {
        driver_fail(result, "cuMemsetD8Async", __FILE__, __LINE__);
        fprintf(stderr, "bench gemm: %s\n", qt_error_message());
        return false;
    }
    return backend_finish(&env->gpu) == QT_OK;
}

// sqrt(sum (q - l)^2 / sum l^2); NaN when either side has one.
static double gemm_bench_rel_diff(const float *q, const float *l, size_t count) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < count; i++) {
        double e = (double)q[i] - (double)l[i];
        diff += e * e;
        ref += (double)l[i] * (double)l[i];
    }
    return ref > 0 ? sqrt(diff / ref) : diff > 0 ? INFINITY : 0.0;
}

// cuBLASLt first (when `lt`), then qtrain once per tier, all on one set of inputs.
static void gemm_bench_run(bench_env *env, const gemm_bench_problem *p, bool lt,
                           gemm_bench_result *r) {
    static gemm_bench_input in;
    memset(r, 0, sizeof *r);
    r->lt_ms = -1;
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) r->ms[t] = r->rel_diff[t] = -1;
    if (!gemm_bench_prepare(env, &in, p, lt)) return;
    size_t sampled = (size_t)GEMM_BENCH_SAMPLE_ROWS * p->n;
    float *lt_rows = NULL, *rows = NULL;
    if (lt) {
        r->lt_ms = gemm_bench_cublaslt(env, &in, p, r->lt_why, sizeof r->lt_why);
        if (r->lt_ms > 0 && p->m >= GEMM_BENCH_SAMPLE_ROWS) {
            lt_rows = malloc(sampled * sizeof *lt_rows);
            rows = malloc(sampled * sizeof *rows);
            if (!rows || !lt_rows || !gemm_bench_sample(env, in.d_lt, p->m, p->n, lt_rows)) {
                free(lt_rows);
                lt_rows = NULL;
            }
        }
    }
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        gemm_bench_use_tier(env, &gemm_bench_tiers[t]);
        // NaN codes over D first: rows one tier left unwritten cannot pass for another's.
        if (lt_rows && !gemm_bench_poison(env, in.d, (uint64_t)p->m * p->n * 2)) break;
        r->ms[t] = gemm_bench_qtrain(env, &in, p);
        if (r->ms[t] > 0 && lt_rows && gemm_bench_sample(env, in.d, p->m, p->n, rows)) {
            r->rel_diff[t] = gemm_bench_rel_diff(rows, lt_rows, sampled);
        }
    }
    env->gpu.gemm_tier = BACKEND_GEMM_TIER_AUTO;  // the backend's default, for what follows
    free(rows);
    free(lt_rows);
    bench_inputs_release(env, &in.inputs);
}

static double gemm_bench_tflops(double flops, double ms) {
    return ms > 0 ? flops / (ms * 1e9) : -1;
}

// A table cell: the value when positive, else `missing`.
static void gemm_bench_cell(bench_env *env, int width, int precision, double value,
                            const char *missing) {
    if (value > 0) {
        fprintf(env->out, " %*.*f", width, precision, value);
    } else {
        fprintf(env->out, " %*s", width, missing);
    }
}

// ---------------------------------------------------------------------------------------------
// Dense table

static void gemm_bench_dense_header(bench_env *env) {
    fprintf(env->out, "%-22s %-16s", "kind", "MxNxK");
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        fprintf(env->out, " %9s", gemm_bench_tiers[t].name);
    }
    fprintf(env->out, " %9s", "cuBLASLt");
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        char ratio[32];
        snprintf(ratio, sizeof ratio, "%s/lt", gemm_bench_tiers[t].name);
        fprintf(env->out, " %12s", ratio);
    }
    fprintf(env->out, "  %-16s", "cuBLASLt mode");
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        char diff[32];
        snprintf(diff, sizeof diff, "%s diff", gemm_bench_tiers[t].name);
        fprintf(env->out, " %13s", diff);
    }
    fprintf(env->out, "\n");
}

// "n/a" reasons, printed once per comparator mode.
static bool gemm_bench_reported[BENCH_LT_MODE_COUNT][2];

static void gemm_bench_report_lt(bench_env *env, const gemm_bench_kind *kind,
                                 const gemm_bench_result *r) {
    bool *reported = &gemm_bench_reported[kind->lt_mode][kind->lt_fast_accum];
    if (r->lt_ms > 0 || !r->lt_why[0] || *reported) return;
    *reported = true;
    fprintf(env->out, "  (cuBLASLt %s: n/a, %s)\n",
            bench_lt_mode_name(kind->lt_mode, kind->lt_fast_accum), r->lt_why);
}

// One dense case: times it, prints its row and returns qtrain's TFLOP/s per tier in `tflops`.
// `lt_bf16_tflops` carries cuBLASLt's BF16 rate of the shape from the BF16 row to the
// emulated rows.
static void gemm_bench_dense_case(bench_env *env, const gemm_bench_kind *kind, uint32_t m,
                                  uint32_t n, uint32_t k, bool lt, double *lt_bf16_tflops,
                                  double *tflops) {
    gemm_bench_problem p = {kind, m, n, k, 0, NULL};
    gemm_bench_result r;
    gemm_bench_run(env, &p, lt && !kind->emulated, &r);
    double flops = 2.0 * m * (double)n * k;
    double lt_tflops = kind->emulated ? *lt_bf16_tflops : gemm_bench_tflops(flops, r.lt_ms);
    if (kind->format == GEMM_FORMAT_BF16) *lt_bf16_tflops = lt_tflops;
    gemm_bench_report_lt(env, kind, &r);
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%ux%u", m, n, k);
    fprintf(env->out, "%-22s %-16s", kind->name, shape);
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        tflops[t] = gemm_bench_tflops(flops, r.ms[t]);
        gemm_bench_cell(env, 9, 1, tflops[t], "failed");
    }
    gemm_bench_cell(env, 9, 1, lt_tflops, "n/a");
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        gemm_bench_cell(env, 12, 3, tflops[t] > 0 && lt_tflops > 0 ? tflops[t] / lt_tflops : -1,
                        "-");
    }
    const char *mode = kind->emulated ? "bf16, same shape"
                                      : bench_lt_mode_name(kind->lt_mode, kind->lt_fast_accum);
    fprintf(env->out, "  %-16s", mode);
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        if (r.rel_diff[t] >= 0 || isnan(r.rel_diff[t])) {
            fprintf(env->out, " %13.1e", r.rel_diff[t]);
        } else {
            fprintf(env->out, " %13s", "-");
        }
    }
    fprintf(env->out, "\n");
    fflush(env->out);
}

// ---------------------------------------------------------------------------------------------
// Grouped section

// Balanced: every member the same rows (65536 / 8 and / 128 are multiples of every row
// alignment, so no member has padding rows).
static void gemm_bench_balanced(uint32_t rows, uint32_t members, uint32_t *offsets,
                                uint32_t *first_dims) {
    QT_ASSERT(rows % members == 0 && rows / members % GEMM_BLOCK_FP8 == 0);
    offsets[0] = 0;
    for (uint32_t i = 0; i < members; i++) {
        first_dims[i] = rows / members;
        offsets[i + 1] = offsets[i] + first_dims[i];
    }
}

// Skewed: member i's share of the rows is proportional to 1 / (i + 1) (Zipf), except that every
// fourth member (i % 4 == 3) gets none, as an expert no token was routed to. Shares round down
// to the format's row alignment (so the smallest vanish too) and member 0 takes what rounding
// left, so the members fill all rows. Integer arithmetic: the same split on every machine.
static uint64_t gemm_bench_skew_weight(uint32_t member) {
    return member % 4 == 3 ? 0 : (1u << 24) / (member + 1);
}

static void gemm_bench_skewed(uint32_t rows, uint32_t members, uint32_t align,
                              uint32_t *offsets, uint32_t *first_dims) {
    uint64_t weight_total = 0;
    for (uint32_t i = 0; i < members; i++) weight_total += gemm_bench_skew_weight(i);
    uint32_t rest = rows;
    for (uint32_t i = 1; i < members; i++) {
        uint64_t share = (uint64_t)rows * gemm_bench_skew_weight(i) / weight_total;
        first_dims[i] = (uint32_t)(share / align * align);
        rest -= first_dims[i];
    }
    first_dims[0] = rest;
    offsets[0] = 0;
    for (uint32_t i = 0; i < members; i++) offsets[i + 1] = offsets[i] + first_dims[i];
}

// Row alignments of recipes/format.c: 16 for BF16 and per-tensor FP8, 128 for FP8 block.
static void gemm_bench_skewed16(uint32_t rows, uint32_t members, uint32_t *offsets,
                                uint32_t *first_dims) {
    gemm_bench_skewed(rows, members, 16, offsets, first_dims);
}

static void gemm_bench_skewed128(uint32_t rows, uint32_t members, uint32_t *offsets,
                                 uint32_t *first_dims) {
    gemm_bench_skewed(rows, members, 128, offsets, first_dims);
}

#define GEMM_BENCH_MEMBERS_MAX 128u

static void gemm_bench_grouped_header(bench_env *env) {
    fprintf(env->out, "%-22s %-20s", "kind", "members");
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        fprintf(env->out, " %9s", gemm_bench_tiers[t].name);
    }
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        char ratio[32];
        snprintf(ratio, sizeof ratio, "%s/dense", gemm_bench_tiers[t].name);
        fprintf(env->out, " %15s", ratio);
    }
    fprintf(env->out, "\n");
}

// One grouped case against the kind's dense rate (`dense`, TFLOP/s per tier).
static void gemm_bench_grouped_case(bench_env *env, const gemm_bench_kind *kind,
                                    uint32_t members, bool skewed, const double *dense) {
    bool block = kind->format == GEMM_FORMAT_FP8_BLOCK;
    bench_member_sizes sizes = !skewed ? gemm_bench_balanced
                               : block ? gemm_bench_skewed128
                                       : gemm_bench_skewed16;
    uint32_t offsets[GEMM_BENCH_MEMBERS_MAX + 1], first_dims[GEMM_BENCH_MEMBERS_MAX];
    QT_ASSERT(members <= GEMM_BENCH_MEMBERS_MAX);
    sizes(GEMM_BENCH_GROUP_ROWS, members, offsets, first_dims);
    uint64_t valid = 0;
    uint32_t empty = 0;
    for (uint32_t i = 0; i < members; i++) {
        valid += first_dims[i];
        empty += first_dims[i] == 0;
    }
    gemm_bench_problem p = {kind, GEMM_BENCH_GROUP_ROWS, GEMM_BENCH_GROUP_N, GEMM_BENCH_GROUP_K,
                            members, sizes};
    gemm_bench_result r;
    gemm_bench_run(env, &p, false, &r);
    char layout[64];
    if (skewed) {
        snprintf(layout, sizeof layout, "%u skewed, %u empty", members, empty);
    } else {
        snprintf(layout, sizeof layout, "%u balanced", members);
    }
    fprintf(env->out, "%-22s %-20s", kind->name, layout);
    double flops = 2.0 * (double)valid * GEMM_BENCH_GROUP_N * GEMM_BENCH_GROUP_K;
    double tflops[GEMM_BENCH_TIERS_MAX];
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        tflops[t] = gemm_bench_tflops(flops, r.ms[t]);
        gemm_bench_cell(env, 9, 1, tflops[t], "failed");
    }
    for (size_t t = 0; t < GEMM_BENCH_TIER_COUNT; t++) {
        gemm_bench_cell(env, 15, 3, tflops[t] > 0 && dense[t] > 0 ? tflops[t] / dense[t] : -1,
                        "-");
    }
    fprintf(env->out, "\n");
    fflush(env->out);
}

static void gemm_bench_grouped(bench_env *env, bool lt) {
    static const uint32_t kinds[] = {GEMM_BENCH_BF16, GEMM_BENCH_FP8_FAST, GEMM_BENCH_FP8_BLOCK};
    static const uint32_t member_counts[] = {8, 128};
    enum { KINDS = sizeof kinds / sizeof kinds[0] };
    double dense[KINDS][GEMM_BENCH_TIERS_MAX];
    double lt_bf16_tflops = -1;
    fprintf(env->out, "\ngrouped GEMMs: M-grouped fprop, each member its own B; %u rows in all, "
            "N = K = %u; TFLOP/s over the valid rows\ndense reference (the same FLOPs):\n",
            GEMM_BENCH_GROUP_ROWS, GEMM_BENCH_GROUP_N);
    gemm_bench_dense_header(env);
    for (size_t i = 0; i < KINDS; i++) {
        gemm_bench_dense_case(env, &gemm_bench_kinds[kinds[i]], GEMM_BENCH_GROUP_ROWS,
                              GEMM_BENCH_GROUP_N, GEMM_BENCH_GROUP_K, lt, &lt_bf16_tflops,
                              dense[i]);
    }
    gemm_bench_grouped_header(env);
    for (size_t i = 0; i < KINDS; i++) {
        for (size_t c = 0; c < sizeof member_counts / sizeof member_counts[0]; c++) {
            for (int skewed = 0; skewed < 2; skewed++) {
                gemm_bench_grouped_case(env, &gemm_bench_kinds[kinds[i]], member_counts[c],
                                        skewed != 0, dense[i]);
            }
        }
    }
}

void bench_gemm(bench_env *env) {
    // For profiling one kernel: QT_BENCH_GEMM_KINDS=text keeps the dense rows whose kind names
    // contain it and skips the grouped section.
    const char *kinds = getenv("QT_BENCH_GEMM_KINDS");
    bool lt = bench_lt_open();
    fprintf(env->out, "gemm: qtrain against %s on the same device buffers, workspace %llu MiB, "
            "the heuristic's first algorithm\n", bench_lt_describe(),
            (unsigned long long)(BENCH_LT_WORKSPACE_BYTES >> 20));
    fprintf(env->out, "dense fprop GEMMs (A [M][K], B [N][K], D [M][N] bf16): TFLOP/s = 2MNK / "
            "median replay; diff: relative L2 difference of sampled rows of D from cuBLASLt's%s\n",
            env->quick ? " (--quick: the square shapes only)" : "");
    gemm_bench_dense_header(env);
    for (size_t s = 0; s < sizeof gemm_bench_shapes / sizeof gemm_bench_shapes[0]; s++) {
        const gemm_bench_shape *shape = &gemm_bench_shapes[s];
        if (env->quick && !shape->quick) continue;
        double lt_bf16_tflops = -1, tflops[GEMM_BENCH_TIERS_MAX];
        for (size_t i = 0; i < GEMM_BENCH_KIND_COUNT; i++) {
            if (kinds && !strstr(gemm_bench_kinds[i].name, kinds)) continue;
            gemm_bench_dense_case(env, &gemm_bench_kinds[i], shape->m, shape->n, shape->k, lt,
                                  &lt_bf16_tflops, tflops);
        }
    }
    if (!env->quick && !kinds) gemm_bench_grouped(env, lt);
    bench_lt_close();
}
