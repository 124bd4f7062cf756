// bench_quant_nvfp4: the NVFP4 cast as TE runs it for an input tensor: rowwise codes plus the
// transposed columnwise codes of RHT(x^T), fused in one pass over BF16 x, and its global-amax
// pre-pass, each timed as its own graph. Bytes counted: the input read once plus every output
// written once (codes and E4M3 scales of both directions; the few amax bytes are ignored).
#include <stdlib.h>

#include "tools/bench.h"
#include "runtime/ops/op_core.h"         // op_fill_random
#include "runtime/ops/op_quant_nvfp4.h"  // op_nvfp4_amax, op_nvfp4_quantize

typedef struct nvfp4_bench_case {
    const char *label;
    uint32_t rows, cols;
    uint32_t members;  // 0 = dense
    bool rht;
} nvfp4_bench_case;

// Uneven member sizes (multiples of 16) that sum to `rows`: alternately 3/4 and 5/4 of the mean.
static void nvfp4_bench_members(uint32_t rows, uint32_t members, uint32_t *offsets,
                                uint32_t *first_dims) {
    uint32_t mean = rows / members;
    offsets[0] = 0;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t size = i + 1 == members ? rows - offsets[i]
                                         : (i % 2 ? mean + mean / 4 : mean - mean / 4) / 16 * 16;
        offsets[i + 1] = offsets[i] + size;
        first_dims[i] = size;
    }
}

static void nvfp4_bench_row(bench_env *env, const nvfp4_bench_case *c, const char *what,
                            double ms, double bytes) {
    double gbps = bench_gbps(bytes, ms);
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%u", c->rows, c->cols);
    fprintf(env->out, "nvfp4 %-34s %-18s %8.4f ms %7.0f GB/s %6.1f %%copy\n", what, shape, ms,
            gbps, 100.0 * gbps / env->copy_gbps);
}

static void nvfp4_bench_case_run(bench_env *env, const nvfp4_bench_case *c) {
    program fill, amax;
    bench_case_begin(env);
    const uint64_t elems = (uint64_t)c->rows * c->cols;
    const op_nvfp4_sizes s = op_nvfp4_sizes_of(c->rows, c->cols, c->members);
    op_nvfp4_input in = {bench_reserve(env, "x", elems * 2), QT_DTYPE_BF16, c->rows, c->cols,
                         {c->members, {0}, {0}}};
    if (c->members) {
        in.group.row_offsets = bench_reserve(env, "row_offsets", 4ull * (c->members + 1));
        in.group.first_dims = bench_reserve(env, "first_dims", 4ull * c->members);
    }
    op_nvfp4_quant q = {.rowwise = true, .colwise = true, .rht = c->rht,
                        .rht_signs = QT_NVFP4_RHT_SIGNS_TE};
    q.amax_row = bench_reserve(env, "amax_row", s.amax);
    q.amax_col = bench_reserve(env, "amax_col", s.amax);
    q.row_data = bench_reserve(env, "row_data", s.row_data);
    q.row_scales = bench_reserve(env, "row_scales", s.row_scales);
    q.col_data = bench_reserve(env, "col_data", s.col_data);
    q.col_scales = bench_reserve(env, "col_scales", s.col_scales);
    op_nvfp4_amax_out a = {q.amax_row, q.amax_col, c->rht, QT_NVFP4_RHT_SIGNS_TE};

    void *fill_table = bench_program_init(&fill, "bench-fill");
    void *amax_table = bench_program_init(&amax, "bench-amax");
    qt_status st = op_fill_random(&fill, "fill", in.x, elems, QT_DTYPE_BF16, QT_FILL_NORMAL, 7,
                                  0, 0.0f, 1.0f);
    if (st == QT_OK) st = op_nvfp4_amax(&fill, "amax", &in, &a);
    if (st == QT_OK) st = op_nvfp4_amax(&amax, "amax", &in, &a);
    if (st == QT_OK) st = op_nvfp4_quantize(&env->prog, "quantize", &in, &q);
    if (st == QT_OK) st = backend_bind(&env->gpu, &env->dev, NULL, 0);
    if (st == QT_OK) st = backend_bind(&env->gpu, &env->host, NULL, 0);
    if (st == QT_OK && c->members) {
        uint32_t *offsets = calloc(c->members + 1, 4), *dims = calloc(c->members, 4);
        nvfp4_bench_members(c->rows, c->members, offsets, dims);
        st = backend_write(&env->gpu, in.group.row_offsets, offsets, 4ull * (c->members + 1));
        if (st == QT_OK) {
            st = backend_write(&env->gpu, in.group.first_dims, dims, 4ull * c->members);
        }
        free(offsets);
        free(dims);
    }
    double ms_quant = -1, ms_amax = -1;
    if (st == QT_OK) {
        prog_resolve(&fill);
        prog_resolve(&amax);
        prog_resolve(&env->prog);
        st = backend_run(&env->gpu, &fill);  // input and amaxes, once, outside the timing
    }
    if (st == QT_OK) st = backend_finish(&env->gpu);
    if (st == QT_OK) {
        ms_quant = bench_time_graph(env, &env->prog);
        ms_amax = bench_time_graph(env, &amax);
    }
    if (st != QT_OK || ms_quant < 0 || ms_amax < 0) {
        fprintf(stderr, "bench quant_nvfp4 %s: %s\n", c->label, qt_error_message());
    } else {
        double out_bytes = (double)(s.row_data + s.row_scales + s.col_data + s.col_scales);
        nvfp4_bench_row(env, c, c->label, ms_quant, (double)elems * 2 + out_bytes);
        char label[64];
        snprintf(label, sizeof label, "amax pre-pass%s%s", c->rht ? " (+rht col)" : "",
                 c->members ? " grouped" : "");
        nvfp4_bench_row(env, c, label, ms_amax, (double)elems * 2);
    }
    bench_case_end(env);
    free(fill_table);
    free(amax_table);
}

void bench_quant_nvfp4(bench_env *env) {
    static const nvfp4_bench_case cases[] = {
        {"bf16 row+col(rht) fused", 8192, 8192, 0, true},
        {"bf16 row+col(rht) fused", 16384, 4096, 0, true},
        {"bf16 row+col(rht) fused, 64 members", 8192, 8192, 64, true},
        {"bf16 row+col fused (no rht)", 8192, 8192, 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nvfp4_bench_case_run(env, &cases[i]);
    }
}
