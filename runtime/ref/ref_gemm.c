// C twins of ptx/gemm_portable.cu, ptx/gemm_skinny.cu and ptx/gemm_sm90a.cu: the same GEMMs with
// the per-element decode, scale application, promotion and epilogue of gemm.h. Only the order of
// the FP32 accumulation differs from the kernels (sequential along k for each element here;
// per-tensor FP8 with the split accumulator and FP8 block keep the kernels' structure of
// 128-wide K blocks), so results agree within the tolerances of tests/test_gemm.c and exactly
// when every partial sum is exact.
//
// How it runs, without changing a bit of that order: D is cut into tiles of REF_GEMM_TILE_M x
// REF_GEMM_TILE_N, one task of the thread pool (runtime/base/pool.h) each. For every 128-wide block
// of k a task decodes its rows of A and of B into FP32 panels in its thread's static scratch, then
// a micro-kernel adds the block's products into REF_GEMM_MR x REF_GEMM_NR accumulators held in
// vector registers: each lane is one element of D and adds its products one k after the other,
// a rounded multiply then a rounded add (-ffp-contract=off), exactly the scalar loop's roundings.
// So an element's bits depend on its inputs alone: not on the tiles, the thread that ran it, the
// number of threads, or the instruction set of the clone that ran (ref_gemm_tile).
#include <stdbool.h>
#include <string.h>

#include "runtime/base/pool.h"    // pool_run, POOL_THREADS_MAX
#include "runtime/ref/ref.h"
#include "runtime/base/status.h"  // QT_ASSERT

#define REF_GEMM_MR 4u        // rows of D per micro-kernel
#define REF_GEMM_NR 16u       // columns of D per micro-kernel: two vectors of 8
#define REF_GEMM_KC GEMM_SPLIT_K  // k per block: one split-accumulator chunk (and FP8 block)
#define REF_GEMM_TILE_M 128u  // rows of D per task
#define REF_GEMM_TILE_N 256u  // columns of D per task
QT_STATIC_ASSERT(REF_GEMM_TILE_M % REF_GEMM_MR == 0 && REF_GEMM_TILE_N % REF_GEMM_NR == 0,
                 "tiles hold whole micro-kernel blocks");
QT_STATIC_ASSERT(GEMM_SPLIT_K == GEMM_BLOCK_FP8, "one K block per split chunk and scale block");

// One thread's scratch: 320 KiB, static (the library allocates nothing), one per pool
// thread index.
typedef struct ref_gemm_scratch {
    float acc[REF_GEMM_TILE_M * REF_GEMM_TILE_N];  // the tile's accumulators, [m][n]
    float a[REF_GEMM_TILE_M * REF_GEMM_KC];        // A panels: [m / MR][k][MR]
    float b[REF_GEMM_TILE_N * REF_GEMM_KC];        // B panels: [n / NR][k][NR]
} ref_gemm_scratch;
static _Alignas(64) ref_gemm_scratch ref_gemm_scratch_of[POOL_THREADS_MAX];

// Decoded values, filled once per GEMM (not once per element): the FP32 values of FP8 codes (per
// operand: A and B may differ in element type), e8m0 scales, and every NVFP4 (scale, nibble)
// pair as the tensor cores see it.
typedef struct ref_gemm_tables {
    float code_a[256], code_b[256];  // fp8 and mxfp8 code values
    float e8m0[256];
    float nvfp4[256 * 16];           // [e4m3 scale][e2m1 nibble]: qt_gemm_nvfp4_decode, in BF16
} ref_gemm_tables;

static void ref_gemm_tables_init(ref_gemm_tables *t, const gemm_args *a) {
    for (uint32_t c = 0; c < 256; c++) {
        uint8_t code = (uint8_t)c;
        if (a->format == GEMM_FORMAT_NVFP4) {
            for (uint32_t nibble = 0; nibble < 16; nibble++) {
                t->nvfp4[c * 16 + nibble] =
                    qt_gemm_round_bf16(qt_gemm_nvfp4_decode((uint8_t)nibble, code));
            }
            continue;
        }
        t->code_a[c] = qt_gemm_fp8_value(code, a->a.elem);
        t->code_b[c] = qt_gemm_fp8_value(code, a->b.elem);
        t->e8m0[c] = qt_e8m0_to_f32(code);
    }
}

// One operand as seen for one member: member-shifted bases plus the descriptor and its tables.
typedef struct ref_gemm_side {
    const gemm_operand *op;
    const uint8_t *data;
    const uint8_t *scale;
    const float *code_value;  // fp8 and mxfp8: this operand's code values
    const ref_gemm_tables *tables;
} ref_gemm_side;

static ref_gemm_side ref_gemm_side_of(const gemm_operand *op, uint32_t member,
                                      const float *code_value, const ref_gemm_tables *tables) {
    ref_gemm_side s = {op, REF_PTR(const uint8_t, op->data) + member * op->data_member_bytes,
                       REF_PTR(const uint8_t, op->scale) + member * op->scale_member_bytes,
                       code_value, tables};
    return s;
}

// The value the tensor cores multiply for element (r, k) of an outer-major operand (bf16 or
// mxfp8): bf16 values, mxfp8 decoded and rounded to bf16 (qt_gemm_mxfp8_decode: code value x
// scale value, one rounding, then qt_gemm_round_bf16).
static inline float ref_gemm_outer_value(uint32_t format, const ref_gemm_side *s, uint64_t r,
                                         uint64_t k) {
    const gemm_operand *op = s->op;
    uint64_t index = k * op->ld + r;
    if (format == GEMM_FORMAT_BF16) return qt_bf16_to_f32(((const uint16_t *)s->data)[index]);
    QT_ASSERT(format == GEMM_FORMAT_MXFP8);
    uint8_t e = s->scale[qt_gemm_scale_index(format, op->flags, r, k / GEMM_BLOCK_MXFP8,
                                             op->scale_ld)];
    return qt_gemm_round_bf16(s->code_value[s->data[index]] * s->tables->e8m0[e]);
}

// Values (r, k0 .. k0 + kc) of a K-major operand into out[0], out[stride], ...: the same values
// as ref_gemm_outer_value's, plus fp8 code values (their scales are applied later) and nvfp4's
// decode, each format in a loop of its own.
static inline void ref_gemm_row(uint32_t format, const ref_gemm_side *s, uint64_t r, uint32_t k0,
                                uint32_t kc, float *out, uint32_t stride) {
    const gemm_operand *op = s->op;
    if (format == GEMM_FORMAT_BF16) {
        const uint16_t *p = (const uint16_t *)s->data + r * op->ld + k0;
        for (uint32_t kk = 0; kk < kc; kk++) out[kk * stride] = qt_bf16_to_f32(p[kk]);
    } else if (format == GEMM_FORMAT_FP8 || format == GEMM_FORMAT_FP8_BLOCK) {
        const uint8_t *p = s->data + r * op->ld + k0;
        for (uint32_t kk = 0; kk < kc; kk++) out[kk * stride] = s->code_value[p[kk]];
    } else if (format == GEMM_FORMAT_MXFP8) {
        const uint8_t *p = s->data + r * op->ld, *e = s->scale + r * op->scale_ld;
        for (uint32_t k = k0; k < k0 + kc; k++) {
            float v = s->code_value[p[k]] * s->tables->e8m0[e[k / GEMM_BLOCK_MXFP8]];
            out[(k - k0) * stride] = qt_gemm_round_bf16(v);
        }
    } else {
        QT_ASSERT(format == GEMM_FORMAT_NVFP4);
        const uint8_t *p = s->data + r * (op->ld / 2), *e = s->scale + r * op->scale_ld;
        uint32_t k = k0;
        // Whole 16-element blocks: one scale, so one row of the table, and 8 bytes of two codes.
        for (; k % GEMM_BLOCK_NVFP4 == 0 && k + GEMM_BLOCK_NVFP4 <= k0 + kc;
             k += GEMM_BLOCK_NVFP4) {
            const float *value = s->tables->nvfp4 + e[k / GEMM_BLOCK_NVFP4] * 16u;
            float *o = out + (k - k0) * stride;
            for (uint32_t j = 0; j < GEMM_BLOCK_NVFP4 / 2; j++) {
                uint8_t byte = p[k / 2 + j];
                o[2 * j * stride] = value[byte & 0xFu];
                o[(2 * j + 1) * stride] = value[byte >> 4];
            }
        }
        for (; k < k0 + kc; k++) {
            uint32_t nibble = (p[k / 2] >> (4 * (k & 1))) & 0xFu;
            out[(k - k0) * stride] = s->tables->nvfp4[e[k / GEMM_BLOCK_NVFP4] * 16u + nibble];
        }
    }
}

// A panel of `width` (MR or NR) operand rows from r0 at k in [k0, k0 + kc): dst[kk * width + i]
// = element (r0 + i, k0 + kk), zero for rows at or past r_end (the tile's edge, D's padding rows).
static inline void ref_gemm_pack(uint32_t format, const ref_gemm_side *s, uint32_t r0,
                                 uint32_t r_end, uint32_t k0, uint32_t kc, uint32_t width,
                                 float *dst) {
    uint32_t rows = r_end > r0 ? (r_end - r0 < width ? r_end - r0 : width) : 0;
    if (rows < width) {
        for (uint32_t kk = 0; kk < kc; kk++) {
            for (uint32_t i = rows; i < width; i++) dst[kk * width + i] = 0.0f;
        }
    }
    if (s->op->flags & GEMM_OPERAND_OUTER_MAJOR) {  // the panel's rows lie side by side per k
        for (uint32_t kk = 0; kk < kc; kk++) {
            for (uint32_t i = 0; i < rows; i++) {
                dst[kk * width + i] = ref_gemm_outer_value(format, s, r0 + i, k0 + kk);
            }
        }
        return;
    }
    for (uint32_t i = 0; i < rows; i++) ref_gemm_row(format, s, r0 + i, k0, kc, dst + i, width);
}

typedef float ref_v8 __attribute__((vector_size(32)));
QT_STATIC_ASSERT(REF_GEMM_NR == 16, "the micro-kernel holds two 8-wide vectors per row");

// c[i][j] (ldc apart) = (from_zero ? 0 : c[i][j]) + a[0][i] b[0][j] + a[1][i] b[1][j] + ...,
// one rounded product and one rounded sum per k, in k order: each lane is the scalar loop.
static inline __attribute__((always_inline)) void ref_gemm_micro(uint32_t kc, const float *a,
                                                                 const float *b, float *c,
                                                                 uint32_t ldc, bool from_zero) {
    ref_v8 acc[REF_GEMM_MR][2];
#pragma GCC unroll 16
    for (uint32_t i = 0; i < REF_GEMM_MR; i++) {
        if (from_zero) {
            acc[i][0] = acc[i][1] = (ref_v8){0};
        } else {
            memcpy(&acc[i][0], c + i * ldc, sizeof(ref_v8));
            memcpy(&acc[i][1], c + i * ldc + 8, sizeof(ref_v8));
        }
    }
    for (uint32_t kk = 0; kk < kc; kk++) {
        ref_v8 b0, b1;
        memcpy(&b0, b + kk * REF_GEMM_NR, sizeof b0);
        memcpy(&b1, b + kk * REF_GEMM_NR + 8, sizeof b1);
#pragma GCC unroll 16
        for (uint32_t i = 0; i < REF_GEMM_MR; i++) {
            float av = a[kk * REF_GEMM_MR + i];
            acc[i][0] += av * b0;  // RN(a * b), then RN(acc + that): A's value first, as before
            acc[i][1] += av * b1;
        }
    }
#pragma GCC unroll 16
    for (uint32_t i = 0; i < REF_GEMM_MR; i++) {
        memcpy(c + i * ldc, &acc[i][0], sizeof(ref_v8));
        memcpy(c + i * ldc + 8, &acc[i][1], sizeof(ref_v8));
    }
}

static float ref_gemm_block_scale(const ref_gemm_side *s, uint64_t r, uint64_t kb) {
    const float *scales = (const float *)s->scale;
    return scales[qt_gemm_scale_index(GEMM_FORMAT_FP8_BLOCK, s->op->flags, r, kb,
                                      s->op->scale_ld)];
}


// Rows [m_begin, m_end) of one member's D, of which rows from m_valid_end on are padding (zeros),
// over k in [k_begin, k_end); split-K: split part `split` of D, into the workspace.
typedef struct ref_gemm_part {
    uint32_t member;
    uint32_t m_begin, m_end, m_valid_end;
    uint32_t k_begin, k_end;
    uint32_t split;
} ref_gemm_part;

// One part's GEMM, the pool's job: tiles_n tiles across, row tiles from part.m_begin.
typedef struct ref_gemm_job {
    const gemm_args *a;
    ref_gemm_part part;
    ref_gemm_side sa, sb;
    bool split, block;  // 128-wide K blocks summed apart; promoted with FP8 block scales
    uint32_t tiles_n;
} ref_gemm_job;

// The block's partial sums p (MR x NR, row-major) into the accumulators (ldc apart) of rows
// m0 .. m0 + rows and columns n0 .. n0 + cols: the split accumulator's addition, or FP8 block's
// promotion with the block's scales, per element (those past the edges read no scales).
static void ref_gemm_combine(const ref_gemm_job *job, const float *p, float *c, uint32_t ldc,
                             uint32_t m0, uint32_t rows, uint32_t n0, uint32_t cols,
                             uint32_t k0) {
    uint64_t kb = k0 / GEMM_BLOCK_FP8;
    for (uint32_t i = 0; i < rows; i++) {
        float scale_a = job->block ? ref_gemm_block_scale(&job->sa, m0 + i, kb) : 0.0f;
        for (uint32_t j = 0; j < cols; j++) {
            float *acc = c + i * ldc + j, partial = p[i * REF_GEMM_NR + j];
            *acc = job->block ? qt_gemm_promote(*acc, partial, scale_a,
                                                ref_gemm_block_scale(&job->sb, n0 + j, kb))
                              : qt_gemm_split_add(*acc, partial);
        }
    }
}

static uint32_t ref_gemm_min(uint32_t x, uint32_t y) { return x < y ? x : y; }

// The accumulators of rows [m0, m0 + rows) x columns [n0, n0 + cols) over the part's k range,
// block by block, inlined into the two functions below.
static inline __attribute__((always_inline)) void ref_gemm_accumulate_blocks(
    const ref_gemm_job *job, ref_gemm_scratch *s, uint32_t m0, uint32_t rows, uint32_t n0,
    uint32_t cols) {
    const uint32_t format = job->a->format, ldc = REF_GEMM_TILE_N;
    const ref_gemm_part *part = &job->part;
    QT_ASSERT(!job->block || part->k_begin % GEMM_BLOCK_FP8 == 0);
    if (part->k_begin >= part->k_end) memset(s->acc, 0, sizeof s->acc);
    for (uint32_t k0 = part->k_begin; k0 < part->k_end; k0 += REF_GEMM_KC) {
        uint32_t kc = ref_gemm_min(REF_GEMM_KC, part->k_end - k0);
        bool first = k0 == part->k_begin;
        for (uint32_t i = 0; i < rows; i += REF_GEMM_MR) {
            ref_gemm_pack(format, &job->sa, m0 + i, m0 + rows, k0, kc, REF_GEMM_MR,
                          s->a + i * REF_GEMM_KC);
        }
        for (uint32_t j = 0; j < cols; j += REF_GEMM_NR) {
            ref_gemm_pack(format, &job->sb, n0 + j, n0 + cols, k0, kc, REF_GEMM_NR,
                          s->b + j * REF_GEMM_KC);
        }
        for (uint32_t j = 0; j < cols; j += REF_GEMM_NR) {
            for (uint32_t i = 0; i < rows; i += REF_GEMM_MR) {
                float *c = s->acc + i * ldc + j;
                const float *pa = s->a + i * REF_GEMM_KC, *pb = s->b + j * REF_GEMM_KC;
                if (!job->split) {
                    ref_gemm_micro(kc, pa, pb, c, ldc, first);
                    continue;
                }
                float partial[REF_GEMM_MR * REF_GEMM_NR];
                ref_gemm_micro(kc, pa, pb, partial, REF_GEMM_NR, true);
                if (first) {
                    for (uint32_t r = 0; r < REF_GEMM_MR; r++) {
                        memset(c + r * ldc, 0, REF_GEMM_NR * sizeof(float));
                    }
                }
                ref_gemm_combine(job, partial, c, ldc, m0 + i, ref_gemm_min(REF_GEMM_MR, rows - i),
                                 n0 + j, ref_gemm_min(REF_GEMM_NR, cols - j), k0);
            }
        }
    }
}

// The clones (pool.h) give the same bits (see the top): x86-64-v3 runs each 8-wide vector of a
// micro-kernel row as one instruction, the baseline as two SSE halves.
POOL_CPU_CLONES static void ref_gemm_accumulate(const ref_gemm_job *job, ref_gemm_scratch *s,
                                                uint32_t m0, uint32_t rows, uint32_t n0,
                                                uint32_t cols) {
    ref_gemm_accumulate_blocks(job, s, m0, rows, n0, cols);
}

// NVFP4 and FP8 (per-tensor and block) products are exact in FP32: decoded NVFP4 values have at
// most 6 significant bits and lie in [2^-10, 2688] (gemm.h), FP8 codes at most 4 and lie in
// [2^-16, 57344], so no product rounds, underflows or overflows (Inf and NaN codes aside, which
// give Inf or NaN either way). Then RN(RN(a b) + acc) is RN(a b + acc), one fused multiply-add,
// and this variant lets the compiler contract them: the x86-64-v3 clone adds each product in one
// FMA instruction instead of two, the same bits again. BF16 and MXFP8 values span the whole FP32
// exponent range, so their products may round and they take the plain variant.
__attribute__((optimize("fp-contract=fast"))) POOL_CPU_CLONES static void ref_gemm_accumulate_exact(
    const ref_gemm_job *job, ref_gemm_scratch *s, uint32_t m0, uint32_t rows, uint32_t n0,
    uint32_t cols) {
    ref_gemm_accumulate_blocks(job, s, m0, rows, n0, cols);
}

// Task: one tile of D, accumulated, then the epilogue per element (padding rows get zeros).
static void ref_gemm_tile(void *ctx, uint32_t task, uint32_t thread) {
    const ref_gemm_job *job = ctx;
    const gemm_args *a = job->a;
    const ref_gemm_part *part = &job->part;
    ref_gemm_scratch *s = &ref_gemm_scratch_of[thread];
    uint32_t m0 = part->m_begin + task / job->tiles_n * REF_GEMM_TILE_M;
    uint32_t n0 = task % job->tiles_n * REF_GEMM_TILE_N;
    uint32_t m1 = ref_gemm_min(m0 + REF_GEMM_TILE_M, part->m_end);
    uint32_t n1 = ref_gemm_min(n0 + REF_GEMM_TILE_N, a->n);
    uint32_t valid_end = ref_gemm_min(m1, part->m_valid_end);
    uint32_t rows = valid_end > m0 ? valid_end - m0 : 0;
    bool exact = a->format == GEMM_FORMAT_NVFP4 || a->format == GEMM_FORMAT_FP8 ||
                 a->format == GEMM_FORMAT_FP8_BLOCK;
    if (rows > 0 && exact) ref_gemm_accumulate_exact(job, s, m0, rows, n0, n1 - n0);
    if (rows > 0 && !exact) ref_gemm_accumulate(job, s, m0, rows, n0, n1 - n0);
    if (qt_gemm_is_split(a)) {  // the part's raw sums (gemm.h); dense, so no padding rows
        float *out = REF_PTR(float, a->workspace) + (uint64_t)part->split * a->m * a->n;
        for (uint32_t m = m0; m < m1; m++) {
            memcpy(out + (uint64_t)m * a->n + n0, s->acc + (m - m0) * REF_GEMM_TILE_N,
                   (n1 - n0) * sizeof(float));
        }
        return;
    }
    uint64_t d = a->d + part->member * a->d_member_bytes;
    uint64_t c = a->c + part->member * a->d_member_bytes;
    uint64_t bias = a->bias + part->member * a->bias_member_bytes;
    int has_c = a->c != 0 && a->beta != 0.0f;
    int has_bias = a->bias != 0;
    float alpha = qt_gemm_alpha(a, part->member);
    for (uint32_t m = m0; m < m1; m++) {
        for (uint32_t n = n0; n < n1; n++) {
            uint64_t index = (uint64_t)m * a->ldd + n;
            float v = 0.0f;
            if (m < valid_end) {
                float acc = s->acc[(m - m0) * REF_GEMM_TILE_N + (n - n0)];
                float cv = has_c ? qt_gemm_load_value(c, index, a->d_dtype) : 0.0f;
                float bv = has_bias ? qt_gemm_load_value(bias, n, a->bias_dtype) : 0.0f;
                v = qt_gemm_epilogue(acc, alpha, has_c, a->beta, cv, has_bias, bv);
            }
            qt_gemm_store_value(d, index, a->d_dtype, v);
        }
    }
}

static void ref_gemm_part_run(const gemm_args *a, const ref_gemm_tables *tables,
                              const ref_gemm_part *part) {
    if (part->m_end <= part->m_begin || a->n == 0) return;
    ref_gemm_job job;
    job.a = a;
    job.part = *part;
    job.sa = ref_gemm_side_of(&a->a, part->member, tables->code_a, tables);
    job.sb = ref_gemm_side_of(&a->b, part->member, tables->code_b, tables);
    job.block = a->format == GEMM_FORMAT_FP8_BLOCK;
    job.split = job.block ||
                (a->format == GEMM_FORMAT_FP8 && (a->flags & GEMM_FLAG_SPLIT_ACCUMULATE) != 0);
    job.tiles_n = (a->n + REF_GEMM_TILE_N - 1) / REF_GEMM_TILE_N;
    uint32_t tiles_m = (part->m_end - part->m_begin + REF_GEMM_TILE_M - 1) / REF_GEMM_TILE_M;
    pool_run(tiles_m * job.tiles_n, ref_gemm_tile, &job);
}

// D's maximum (gemm.h, gemm_args.d_max) over D as stored, merged into the slot.
static void ref_gemm_d_max(const gemm_args *a) {
    float running = 0.0f;
    for (uint64_t row = 0; row < a->m; row++) {
        for (uint32_t col = 0; col < a->n; col++) {
            running = qt_gemm_d_max_fold(running,
                                         qt_gemm_load_value(a->d, row * a->ldd + col, a->d_dtype));
        }
    }
    uint32_t *slot = REF_PTR(uint32_t, a->d_max);
    uint32_t bits = qt_gemm_d_max_bits(running, a->d_dtype);
    if (bits > *slot) *slot = bits;
}

static void ref_gemm(const gemm_args *a) {
    ref_gemm_tables tables;  // 21 KiB of stack, so that GEMMs on several threads stay apart
    ref_gemm_tables_init(&tables, a);
    const uint32_t *off = REF_PTR(const uint32_t, a->group.row_offsets);
    const uint32_t *first_dims = REF_PTR(const uint32_t, a->group.first_dims);
    if (qt_gemm_is_split(a)) {
        QT_ASSERT(a->grouping == GEMM_DENSE && a->split_k % GEMM_SPLIT_K_ALIGN == 0);
        for (uint32_t z = 0; z < a->split_parts; z++) {
            ref_gemm_part part = {0, 0, a->m, a->m, 0, 0, z};
            qt_gemm_split_range(a, z, &part.k_begin, &part.k_end);
            ref_gemm_part_run(a, &tables, &part);
        }
        return;
    }
    if (a->grouping == GEMM_DENSE) {
        ref_gemm_part part = {0, 0, a->m, a->m, 0, a->k, 0};
        ref_gemm_part_run(a, &tables, &part);
        if (a->d_max != 0) ref_gemm_d_max(a);
        return;
    }
    for (uint32_t i = 0; i < a->group.count; i++) {
        ref_gemm_part part = {i, 0, a->m, a->m, 0, a->k, 0};
        if (a->grouping == GEMM_GROUP_M) {
            part.m_begin = off[i];
            part.m_end = off[i + 1] < a->m ? off[i + 1] : a->m;
            part.m_valid_end = off[i] + first_dims[i] < part.m_end ? off[i] + first_dims[i]
                                                                    : part.m_end;
        } else {
            part.k_begin = off[i];
            part.k_end = off[i] + first_dims[i];
        }
        ref_gemm_part_run(a, &tables, &part);
    }
}

void ref_qt_gemm_bf16_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_BF16);
    ref_gemm(a);
}

void ref_qt_gemm_fp8_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_FP8);
    ref_gemm(a);
}

void ref_qt_gemm_fp8_block_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_FP8_BLOCK);
    ref_gemm(a);
}

void ref_qt_gemm_mxfp8_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_MXFP8);
    ref_gemm(a);
}

void ref_qt_gemm_nvfp4_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_NVFP4);
    ref_gemm(a);
}

// Split-K reduction: rows [r_begin, r_end) of D, each element's parts in index order, then the
// epilogue; the kernel's arithmetic (gemm.h, qt_gemm_split_element), so the same bits.
POOL_CPU_CLONES static void ref_gemm_split_rows(void *ctx, uint64_t r_begin, uint64_t r_end) {
    const gemm_args *a = ctx;
    float alpha = qt_gemm_alpha(a, 0);
    for (uint64_t row = r_begin; row < r_end; row++) {
        for (uint32_t col = 0; col < a->n; col++) {
            qt_gemm_store_value(a->d, row * a->ldd + col, a->d_dtype,
                                qt_gemm_split_element(a, alpha, row * a->n + col));
        }
    }
}

void ref_qt_gemm_split_reduce(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(qt_gemm_is_split(a));
    pool_for(a->m, ref_task_rows((uint64_t)a->n * a->split_parts), ref_gemm_split_rows,
             (void *)a);
}

// Gradient-norm units of D (gemm.h): each unit's 32 lane folds, then the lane tree. Units
// [begin, end) are a task; each writes its own sum and flag.
POOL_CPU_CLONES static void ref_gemm_norm_units_range(void *ctx, uint64_t begin, uint64_t end) {
    const gemm_args *a = ctx;
    uint32_t unit_cols = (a->n + GEMM_NORM_UNIT_COLS - 1) / GEMM_NORM_UNIT_COLS;
    uint64_t units = qt_gemm_norm_units_of(a);
    uint64_t per_member = qt_gemm_norm_unit_count(a->m, a->n);
    float *sums = REF_PTR(float, a->norm_units);
    uint32_t *flags = (uint32_t *)(sums + units);
    for (uint64_t u = begin; u < end; u++) {
        // A K-grouped GEMM's unit u is unit u % per_member of member u / per_member's D.
        const float *d = REF_PTR(const float, a->d + u / per_member * a->d_member_bytes);
        uint64_t own = u % per_member;
        float lanes[32];
        uint32_t bad = 0;
        for (uint32_t l = 0; l < 32; l++) {
            uint32_t lane_bad = 0;
            lanes[l] = qt_gemm_norm_unit_lane(d, a, (uint32_t)(own / unit_cols),
                                              (uint32_t)(own % unit_cols), l, &lane_bad);
            bad |= lane_bad;
        }
        QT_ACT_TREE32(lanes, qt_act_add);
        sums[u] = lanes[0];
        flags[u] = bad ? 1u : 0u;
    }
}

void ref_qt_gemm_norm_units(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->norm_units != 0 && qt_gemm_norm_units_fit(a));
    pool_for(qt_gemm_norm_units_of(a),
             ref_task_rows(GEMM_NORM_UNIT_ROWS * GEMM_NORM_UNIT_COLS), ref_gemm_norm_units_range,
             (void *)a);
}

// The order of qt_gemm_bias_grad_add's comment: 32-row chunks in order, each summed in row order.
// Columns [c_begin, c_end) of every member are a task: each column's sum is one task's.
POOL_CPU_CLONES static void ref_gemm_bias_grad_cols(void *ctx, uint64_t c_begin, uint64_t c_end) {
    const gemm_bias_grad_args *a = ctx;
    uint32_t members = a->group.count ? a->group.count : 1u;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t r_begin = 0, r_end = a->rows;
        if (a->group.count) {
            r_begin = REF_PTR(const uint32_t, a->group.row_offsets)[i];
            r_end = r_begin + REF_PTR(const uint32_t, a->group.first_dims)[i];
        }
        for (uint32_t col = (uint32_t)c_begin; col < c_end; col++) {
            float total = 0.0f;
            for (uint32_t r0 = r_begin; r0 < r_end; r0 += GEMM_BGRAD_CHUNK_ROWS) {
                uint32_t r1 = r_end - r0 < GEMM_BGRAD_CHUNK_ROWS ? r_end
                                                                 : r0 + GEMM_BGRAD_CHUNK_ROWS;
                float p = 0.0f;
                for (uint32_t r = r0; r < r1; r++) {
                    float dy = qt_gemm_load_value(a->dy, (uint64_t)r * a->ld + col, a->dtype);
                    p = qt_gemm_bias_grad_add(p, dy);
                }
                total = qt_gemm_bias_grad_add(total, p);
            }
            REF_PTR(float, a->out)[(uint64_t)i * a->cols + col] = total;
        }
    }
}

void ref_qt_gemm_bias_grad(const gemm_bias_grad_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(a->cols, ref_task_rows(a->rows), ref_gemm_bias_grad_cols, (void *)a);
}

// The decode table's values: gemm.h's decode, rounded to BF16 as the twins above do.
void ref_qt_gemm_decode_table(const gemm_decode_table_args *a, const launch_shape *shape) {
    (void)shape;
    uint16_t *out = REF_PTR(uint16_t, a->out);
    uint32_t codes = GEMM_DECODE_TABLE_CODES(a->path);
    for (uint32_t scale = 0; scale < 256; scale++) {
        for (uint32_t code = 0; code < codes; code++) {
            float v = a->path == GEMM_DECODE_NVFP4
                          ? qt_gemm_nvfp4_decode((uint8_t)code, (uint8_t)scale)
                          : qt_gemm_mxfp8_decode((uint8_t)code, a->elem, (uint8_t)scale);
            out[scale * codes + code] = qt_f32_to_bf16(v);
        }
    }
}

// The skinny kernels (ptx/gemm_skinny.cu) are the portable BF16 kernel's GEMM (gemm.h: the same
// instruction sequence for every element, so the same bits on the GPU), and so is their twin.
void ref_qt_gemm_bf16_skinny_n(const gemm_args *a, const launch_shape *shape) {
    ref_qt_gemm_bf16_portable(a, shape);
}

void ref_qt_gemm_bf16_skinny_m(const gemm_args *a, const launch_shape *shape) {
    ref_qt_gemm_bf16_portable(a, shape);
}

// The sm_90a tier computes the same GEMMs (ptx/gemm_sm90a.cu); its args start with gemm_args.
void ref_qt_gemm_bf16_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_bf16_portable(&a->gemm, shape);
}

void ref_qt_gemm_fp8_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_fp8_portable(&a->gemm, shape);
}

void ref_qt_gemm_fp8_block_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_fp8_block_portable(&a->gemm, shape);
}

void ref_qt_gemm_mxfp8_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_mxfp8_portable(&a->gemm, shape);
}

void ref_qt_gemm_nvfp4_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_nvfp4_portable(&a->gemm, shape);
}

// The portable tier's small-tile entry points run the portable kernels' small tile.
void ref_qt_gemm_bf16_portable_small(const gemm_args *a, const launch_shape *shape) {
    ref_qt_gemm_bf16_portable(a, shape);
}

void ref_qt_gemm_fp8_portable_small(const gemm_args *a, const launch_shape *shape) {
    ref_qt_gemm_fp8_portable(a, shape);
}

void ref_qt_gemm_fp8_block_portable_small(const gemm_args *a, const launch_shape *shape) {
    ref_qt_gemm_fp8_block_portable(a, shape);
}

void ref_qt_gemm_mxfp8_portable_small(const gemm_args *a, const launch_shape *shape) {
    ref_qt_gemm_mxfp8_portable(a, shape);
}

void ref_qt_gemm_nvfp4_portable_small(const gemm_args *a, const launch_shape *shape) {
    ref_qt_gemm_nvfp4_portable(a, shape);
}
