// bench_gemm: TFLOP/s of the portable GEMM tier (ptx/gemm_portable.cu) on square fprop-layout
// GEMMs (A [M][K] and B [N][K] K-major, D [M][N] BF16), M = N = K = 4096 and 8192.
//
// FLOPs counted: 2 M N K. The operands are bench_inputs, filled once before the timed program,
// so the timed graph holds the GEMM alone. FP8 codes are the bytes of random BF16 values (a few
// are NaN codes; tensor-core timing does not depend on the values).
#include "bench.h"
#include "op_gemm.h"  // op_gemm

typedef struct gemm_bench_input {
    bench_inputs inputs;
    prog_ref a, b, a_scale, b_scale, a_ts, b_ts;
} gemm_bench_input;

typedef struct gemm_bench_kind {
    const char *name;
    uint32_t format;
    uint32_t flags;
    uint32_t elem;
} gemm_bench_kind;

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

static prog_ref gemm_bench_fill(bench_inputs *in, const char *name, uint64_t bytes,
                                uint32_t format, bool scale, uint64_t seed) {
    if (scale && format == GEMM_FORMAT_FP8_BLOCK) {
        return bench_inputs_f32(in, name, bytes, seed, 0.5f, 1.0f);
    }
    // Codes and byte scales: the bytes of BF16 normals (e8m0/e4m3 scales of any value do).
    return bench_inputs_bf16(in, name, bytes, seed);
}

static bool gemm_bench_prepare(bench_env *env, gemm_bench_input *in, uint32_t format,
                               uint32_t size) {
    uint64_t data = gemm_bench_data_bytes(format, size, size);
    uint64_t sa = gemm_bench_scale_bytes(format, size, size, false);
    uint64_t sb = gemm_bench_scale_bytes(format, size, size, true);
    bench_inputs_begin(&in->inputs, "gemm");
    in->a = gemm_bench_fill(&in->inputs, "a", data, format, false, 1);
    in->b = gemm_bench_fill(&in->inputs, "b", data, format, false, 2);
    // No scales (0 bytes): a 4-byte region, left unfilled.
    in->a_scale = gemm_bench_fill(&in->inputs, "a_scale", sa, format, true, 3);
    in->b_scale = gemm_bench_fill(&in->inputs, "b_scale", sb, format, true, 4);
    in->a_ts = bench_inputs_f32(&in->inputs, "a_tensor_scale", 4, 5, 1.0f, 1.0f);
    in->b_ts = bench_inputs_f32(&in->inputs, "b_tensor_scale", 4, 6, 1.0f, 1.0f);
    return bench_inputs_ready(env, &in->inputs);
}

static void gemm_bench_case(bench_env *env, const gemm_bench_kind *kind, uint32_t size) {
    static gemm_bench_input in;
    uint32_t f = kind->format;
    if (!gemm_bench_prepare(env, &in, f, size)) return;
    bench_case_begin(env);
    prog_ref none = {0};
    bool scaled = f == GEMM_FORMAT_FP8_BLOCK || f == GEMM_FORMAT_MXFP8 ||
                  f == GEMM_FORMAT_NVFP4;
    bool tensor = f == GEMM_FORMAT_FP8 || f == GEMM_FORMAT_NVFP4;
    op_gemm_desc g = {0};
    g.format = f;
    g.grouping = GEMM_DENSE;
    g.flags = kind->flags;
    g.m = g.n = g.k = size;
    g.a = op_gemm_operand_of(f, kind->elem, size, size, false, false, in.a,
                             scaled ? in.a_scale : none, tensor ? in.a_ts : none);
    g.b = op_gemm_operand_of(f, kind->elem, size, size, false, f == GEMM_FORMAT_FP8_BLOCK, in.b,
                             scaled ? in.b_scale : none, tensor ? in.b_ts : none);
    g.alpha = 1.0f;
    g.d = bench_reserve(env, "d", (uint64_t)size * size * 2);
    g.d_dtype = QT_DTYPE_BF16;
    double ms = bench_case_finish(env, &in.inputs, op_gemm(&env->prog, kind->name, &g));
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%ux%u", size, size, size);
    if (ms <= 0) {
        fprintf(env->out, "%-30s %-16s failed\n", kind->name, shape);
        return;
    }
    double tflops = 2.0 * size * (double)size * size / (ms * 1e9);
    fprintf(env->out, "%-30s %-16s %9.4f ms %8.1f TFLOP/s\n", kind->name, shape, ms, tflops);
}

void bench_gemm(bench_env *env) {
    static const gemm_bench_kind kinds[] = {
        {"bf16 portable", GEMM_FORMAT_BF16, 0, GEMM_ELEM_BF16},
        {"fp8 e4m3 portable fast-acc", GEMM_FORMAT_FP8, 0, GEMM_ELEM_E4M3},
        {"fp8 e4m3 portable split-acc", GEMM_FORMAT_FP8, GEMM_FLAG_SPLIT_ACCUMULATE,
         GEMM_ELEM_E4M3},
        {"fp8 block 1x128x128 portable", GEMM_FORMAT_FP8_BLOCK, 0, GEMM_ELEM_E4M3},
        {"mxfp8 (emulated) portable", GEMM_FORMAT_MXFP8, 0, GEMM_ELEM_E4M3},
        {"nvfp4 (emulated) portable", GEMM_FORMAT_NVFP4, 0, GEMM_ELEM_E2M1},
    };
    static const uint32_t sizes[] = {4096, 8192};
    fprintf(env->out, "%-30s %-16s %12s %15s\n", "gemm", "MxNxK", "time", "throughput");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            gemm_bench_case(env, &kinds[i], sizes[s]);
        }
    }
}
