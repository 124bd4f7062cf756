// C twins of ptx/act.cu. The per-element arithmetic is act.h's, and every reduction runs the
// kernels' fixed order (act.h) operation for operation: lane j of a warp-per-row reduction owns
// chunks j, j + 32, ... of 8 elements, so walking a row in index order and folding element i into
// lane (i / 8) % 32 gives every lane the GPU's sequence; then the same lane tree. Element-wise
// maps, rows and blocks, which own their outputs, are tasks of the thread pool (ref.h).
#include <string.h>

#include "runtime/base/pool.h"    // pool_for, POOL_CPU_CLONES
#include "runtime/ref/ref.h"
#include "runtime/base/status.h"  // QT_ASSERT

#define REF_LANE(i) ((uint32_t)(((i) / QT_ACT_CHUNK) % QT_ACT_LANES))

// Block of 256 thread values: the lane tree in each warp, then warps 0..7 in order.
static float ref_act_block_sum(float v[QT_ACT_THREADS]) {
    for (uint32_t w = 0; w < QT_ACT_WARPS; w++) QT_ACT_TREE32(v + w * QT_ACT_LANES, qt_act_add);
    float total = v[0];
    for (uint32_t w = 1; w < QT_ACT_WARPS; w++) total = total + v[w * QT_ACT_LANES];
    return total;
}

// Final pass: thread t folds partials t, t + 256, ... from +0, then the block sum.
static float ref_act_final_sum(uint64_t partials, uint32_t count) {
    float acc[QT_ACT_THREADS];
    for (uint32_t t = 0; t < QT_ACT_THREADS; t++) acc[t] = 0.0f;
    const float *p = REF_PTR(const float, partials);
    for (uint32_t i = 0; i < count; i++) acc[i % QT_ACT_THREADS] = acc[i % QT_ACT_THREADS] + p[i];
    return ref_act_block_sum(acc);
}

// ---------------------------------------------------------------------------------------------
// Activations.

static float ref_act_pre(const act_args *a, uint64_t i, float x) {
    return a->bias ? x + qt_act_load(a->bias, i % a->cols, a->bias_dtype) : x;
}

// The rows the kernels walk: a grouped tensor's stop at its active end (act_args.group).
static uint64_t ref_act_rows(const act_args *a) {
    return a->group.count ? qt_group_active_rows(a->group, a->rows) : a->rows;
}

// The bits of max(m, |v|) for the bits m of a non-negative amax, NaN skipped (the kernels'
// fmaxf folds).
static uint32_t ref_act_abs_max(uint32_t m, float v) {
    uint32_t bits = qt_f32_bits(v) & 0x7FFFFFFFu;
    return bits <= 0x7F800000u && bits > m ? bits : m;
}

// An output's amax (ptx/act.h: max |x| over the stored values themselves; the kernels round the
// FP32 maximum instead, which gives the same value): elements [begin, end) of out, which the
// calling task stored, merged into the slot `amax` (0: none), as a block of the kernel merges
// its share.
static void ref_act_amax_range(uint64_t amax, uint64_t out, uint32_t dtype, uint64_t begin,
                               uint64_t end) {
    if (!amax) return;
    uint32_t m = 0;
    for (uint64_t i = begin; i < end; i++) m = ref_act_abs_max(m, qt_act_load(out, i, dtype));
    ref_amax_merge(REF_PTR(float, amax), qt_bits_f32(m));
}

// act_args.amax: each task merges the maximum of the outputs it stored, elements [begin, end) of
// out (rows of out_cols), while they are in its cache (ref_act_amax_range): one slot, or for a
// grouped output each member's over its valid rows, merged whenever the walk enters another
// member.
static void ref_act_amax(const act_args *a, uint64_t begin, uint64_t end, uint32_t out_cols) {
    if (!a->amax) return;
    bool grouped = a->group.count > 0;
    uint32_t member = 0, m = 0;
    uint64_t valid_end = end, member_end = grouped ? begin : end;
    for (uint64_t i = begin; i < end; i++) {
        if (i >= member_end) {
            ref_amax_merge(REF_PTR(float, a->amax) + member, qt_bits_f32(m));
            member = qt_group_find(a->group, 0, a->group.count, (uint32_t)(i / out_cols));
            qt_group_rows rows = qt_group_member_rows(a->group, a->rows, member);
            valid_end = (uint64_t)rows.valid_end * out_cols;
            member_end = (uint64_t)rows.end * out_cols;
            m = 0;
        }
        if (i >= valid_end) continue;  // padding rows count for no amax
        m = ref_act_abs_max(m, qt_act_load(a->out, i, a->out_dtype));
    }
    ref_amax_merge(REF_PTR(float, a->amax) + member, qt_bits_f32(m));
}

// Element-wise activations run a chunk at a time: the pre-activations loaded into a local array,
// the activation over the whole array (a constant trip count; lanes past the data hold zeros and
// are not stored), the results stored. GELU and its gradient have no branches (act.h), so that
// loop is vectorized (REF_VECTOR_LOOPS).
#define REF_ACT_CHUNK 64u

static uint64_t ref_act_chunk(uint64_t i, uint64_t end) {
    return end - i < REF_ACT_CHUNK ? end - i : REF_ACT_CHUNK;
}

REF_VECTOR_LOOPS POOL_CPU_CLONES static void ref_act_fwd_range(void *ctx, uint64_t begin,
                                                             uint64_t end) {
    const act_args *a = ctx;
    float v[REF_ACT_CHUNK];
    for (uint64_t i0 = begin; i0 < end; i0 += REF_ACT_CHUNK) {
        uint64_t n = ref_act_chunk(i0, end);
        for (uint64_t j = 0; j < REF_ACT_CHUNK; j++) {
            v[j] = j < n ? ref_act_pre(a, i0 + j, qt_act_load(a->x, i0 + j, a->x_dtype)) : 0.0f;
        }
        if (a->act == QT_ACT_GELU) {
            for (uint64_t j = 0; j < REF_ACT_CHUNK; j++) v[j] = qt_act_gelu(v[j]);
        } else {
            for (uint64_t j = 0; j < n; j++) v[j] = qt_act_forward(a->act, v[j]);
        }
        for (uint64_t j = 0; j < n; j++) qt_act_store(a->out, i0 + j, a->out_dtype, v[j]);
    }
    ref_act_amax(a, begin, end, a->cols);
}

void ref_qt_act_fwd(const act_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(ref_act_rows(a) * a->cols, REF_TASK_ELEMS, ref_act_fwd_range, (void *)a);
}

REF_VECTOR_LOOPS POOL_CPU_CLONES static void ref_act_bwd_range(void *ctx, uint64_t begin,
                                                             uint64_t end) {
    const act_args *a = ctx;
    float v[REF_ACT_CHUNK], dy[REF_ACT_CHUNK];
    for (uint64_t i0 = begin; i0 < end; i0 += REF_ACT_CHUNK) {
        uint64_t n = ref_act_chunk(i0, end);
        for (uint64_t j = 0; j < REF_ACT_CHUNK; j++) {
            v[j] = j < n ? ref_act_pre(a, i0 + j, qt_act_load(a->x, i0 + j, a->x_dtype)) : 0.0f;
            dy[j] = j < n ? qt_act_load(a->dy, i0 + j, a->dy_dtype) : 0.0f;
        }
        if (a->act == QT_ACT_GELU) {  // qt_act_backward's GELU case
            for (uint64_t j = 0; j < REF_ACT_CHUNK; j++) v[j] = dy[j] * qt_act_gelu_grad(v[j]);
        } else {
            for (uint64_t j = 0; j < n; j++) v[j] = qt_act_backward(a->act, v[j], dy[j]);
        }
        for (uint64_t j = 0; j < n; j++) qt_act_store(a->out, i0 + j, a->out_dtype, v[j]);
    }
    ref_act_amax(a, begin, end, a->cols);
}

void ref_qt_act_bwd(const act_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(ref_act_rows(a) * a->cols, REF_TASK_ELEMS, ref_act_bwd_range, (void *)a);
}

// qt_gemm_split_reduce_act_fwd / _bwd: a task stores its elements of D as
// ref_qt_gemm_split_reduce does, then runs the activation's own twin (ref_act_fwd_range,
// ref_act_bwd_range) over the same elements with D as the tensor it reads (x forward, dy
// backward): the two twins one after the other, by construction.
typedef struct ref_split_act_job {
    const gemm_args *gemm;
    act_args act;  // x (forward) or dy (backward) is D
    bool backward;
} ref_split_act_job;

POOL_CPU_CLONES static void ref_split_act_range(void *ctx, uint64_t begin, uint64_t end) {
    const ref_split_act_job *job = ctx;
    const gemm_args *g = job->gemm;
    float alpha = qt_gemm_alpha(g, 0);
    for (uint64_t i = begin; i < end; i++) {  // ldd = n: element i of D is at i
        qt_gemm_store_value(g->d, i, g->d_dtype, qt_gemm_split_element(g, alpha, i));
    }
    if (job->backward) {
        ref_act_bwd_range((void *)&job->act, begin, end);
    } else {
        ref_act_fwd_range((void *)&job->act, begin, end);
    }
}

static void ref_split_act(const gemm_act_args *args, bool backward) {
    QT_ASSERT(qt_gemm_is_split(&args->gemm) && args->gemm.grouping == GEMM_DENSE);
    QT_ASSERT(args->gemm.ldd == args->gemm.n && args->act.group.count == 0);
    QT_ASSERT(args->act.rows == args->gemm.m && args->act.cols == args->gemm.n);
    ref_split_act_job job = {&args->gemm, args->act, backward};
    if (backward) {
        job.act.dy = args->gemm.d;
    } else {
        job.act.x = args->gemm.d;
    }
    QT_ASSERT((backward ? job.act.dy_dtype : job.act.x_dtype) == args->gemm.d_dtype);
    pool_for((uint64_t)args->gemm.m * args->gemm.n, REF_TASK_ELEMS, ref_split_act_range, &job);
}

void ref_qt_gemm_split_reduce_act_fwd(const gemm_act_args *a, const launch_shape *shape) {
    (void)shape;
    ref_split_act(a, false);
}

void ref_qt_gemm_split_reduce_act_bwd(const gemm_act_args *a, const launch_shape *shape) {
    (void)shape;
    ref_split_act(a, true);
}

POOL_CPU_CLONES static void ref_swiglu_fwd_rows(void *ctx, uint64_t begin, uint64_t end) {
    const act_args *a = ctx;
    uint32_t h = a->cols / 2;
    for (uint64_t r = begin; r < end; r++) {
        for (uint32_t j = 0; j < h; j++) {
            float va, vb;
            qt_swiglu_ab(a, r, j, &va, &vb);
            qt_act_store(a->out, r * h + j, a->out_dtype, qt_swiglu_forward(va, vb));
        }
    }
    ref_act_amax(a, begin * h, end * h, h);
}

void ref_qt_swiglu_fwd(const act_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(ref_act_rows(a), ref_task_rows(a->cols), ref_swiglu_fwd_rows, (void *)a);
}

POOL_CPU_CLONES static void ref_swiglu_bwd_rows(void *ctx, uint64_t begin, uint64_t end) {
    const act_args *a = ctx;
    uint32_t h = a->cols / 2;
    for (uint64_t r = begin; r < end; r++) {
        for (uint32_t j = 0; j < h; j++) {
            float va, vb;
            qt_swiglu_ab(a, r, j, &va, &vb);
            float dy = qt_act_load(a->dy, r * h + j, a->dy_dtype);
            qt_act_store(a->out, r * a->cols + j, a->out_dtype, qt_swiglu_da(va, vb, dy));
            qt_act_store(a->out, r * a->cols + h + j, a->out_dtype, qt_swiglu_db(va, dy));
        }
    }
    ref_act_amax(a, begin * a->cols, end * a->cols, a->cols);
}

void ref_qt_swiglu_bwd(const act_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(ref_act_rows(a), ref_task_rows(a->cols), ref_swiglu_bwd_rows, (void *)a);
}

// The table kernels compute the same values (their tables hold qt_act_lut_value's).
void ref_qt_act_fwd_lut(const act_args *a, const launch_shape *shape) { ref_qt_act_fwd(a, shape); }

void ref_qt_act_bwd_lut(const act_args *a, const launch_shape *shape) { ref_qt_act_bwd(a, shape); }

// SwiGLU's table kernels, dense and grouped: the same values (SiLU's tables hold
// qt_act_lut_value's); every twin reads act_args.group.
void ref_qt_swiglu_fwd_lut(const act_args *a, const launch_shape *shape) {
    ref_qt_swiglu_fwd(a, shape);
}

void ref_qt_swiglu_bwd_lut(const act_args *a, const launch_shape *shape) {
    ref_qt_swiglu_bwd(a, shape);
}

void ref_qt_swiglu_fwd_lut_grouped(const act_args *a, const launch_shape *shape) {
    ref_qt_swiglu_fwd(a, shape);
}

void ref_qt_swiglu_bwd_lut_grouped(const act_args *a, const launch_shape *shape) {
    ref_qt_swiglu_bwd(a, shape);
}

// The grouped kernels are the same twins: every twin above reads act_args.group.
void ref_qt_act_fwd_grouped(const act_args *a, const launch_shape *shape) {
    ref_qt_act_fwd(a, shape);
}

void ref_qt_act_bwd_grouped(const act_args *a, const launch_shape *shape) {
    ref_qt_act_bwd(a, shape);
}

void ref_qt_swiglu_fwd_grouped(const act_args *a, const launch_shape *shape) {
    ref_qt_swiglu_fwd(a, shape);
}

void ref_qt_swiglu_bwd_grouped(const act_args *a, const launch_shape *shape) {
    ref_qt_swiglu_bwd(a, shape);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm.

POOL_CPU_CLONES static void ref_rmsnorm_fwd_rows(void *ctx, uint64_t begin, uint64_t end) {
    const rmsnorm_args *a = ctx;
    for (uint64_t r = begin; r < end; r++) {
        uint64_t base = r * a->cols;
        float lanes[QT_ACT_LANES] = {0};
        for (uint32_t j = 0; j < a->cols; j++) {
            float v = qt_act_load(a->x, base + j, a->x_dtype);
            lanes[REF_LANE(j)] = qt_fmaf(v, v, lanes[REF_LANE(j)]);
        }
        QT_ACT_TREE32(lanes, qt_act_add);
        float inv = qt_rmsnorm_inv(lanes[0], a->cols, a->eps);
        REF_PTR(float, a->inv_rms)[r] = qt_act_canonical(inv);
        for (uint32_t j = 0; j < a->cols; j++) {
            float v = qt_act_load(a->x, base + j, a->x_dtype);
            float g = qt_act_load(a->gamma, j, a->gamma_dtype);
            qt_act_store(a->out, base + j, a->out_dtype, qt_rmsnorm_y(v, inv, g));
        }
    }
    ref_act_amax_range(a->amax, a->out, a->out_dtype, begin * a->cols, end * a->cols);
}

void ref_qt_rmsnorm_fwd(const rmsnorm_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(a->rows, ref_task_rows(a->cols), ref_rmsnorm_fwd_rows, (void *)a);
}

POOL_CPU_CLONES static void ref_rmsnorm_bwd_dx_rows(void *ctx, uint64_t begin, uint64_t end) {
    const rmsnorm_args *a = ctx;
    for (uint64_t r = begin; r < end; r++) {
        uint64_t base = r * a->cols;
        float inv = REF_PTR(const float, a->inv_rms)[r];
        float lanes[QT_ACT_LANES] = {0};
        for (uint32_t j = 0; j < a->cols; j++) {
            float x = qt_act_load(a->x, base + j, a->x_dtype);
            float dy = qt_act_load(a->dy, base + j, a->dy_dtype);
            float g = qt_act_load(a->gamma, j, a->gamma_dtype);
            lanes[REF_LANE(j)] = qt_rmsnorm_dot(x, dy, g, inv, lanes[REF_LANE(j)]);
        }
        QT_ACT_TREE32(lanes, qt_act_add);
        float mean_dot = qt_rmsnorm_mean_dot(lanes[0], a->cols);
        for (uint32_t j = 0; j < a->cols; j++) {
            float x = qt_act_load(a->x, base + j, a->x_dtype);
            float dy = qt_act_load(a->dy, base + j, a->dy_dtype);
            float g = qt_act_load(a->gamma, j, a->gamma_dtype);
            float v = qt_rmsnorm_dx(x, dy, g, inv, mean_dot);
            // The residual add after it (rmsnorm_args.skip): skip + dx as a dx tensor holds it.
            if (a->skip) {
                v = qt_act_load(a->skip, base + j, a->skip_dtype) + qt_act_stored(v, a->out_dtype);
            }
            qt_act_store(a->out, base + j, a->out_dtype, v);
        }
    }
    ref_act_amax_range(a->amax, a->out, a->out_dtype, begin * a->cols, end * a->cols);
}

void ref_qt_rmsnorm_bwd_dx(const rmsnorm_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(a->rows, ref_task_rows(a->cols), ref_rmsnorm_bwd_dx_rows, (void *)a);
}

// The kernels that hold their rows in registers compute the generic kernels' bits.
void ref_qt_rmsnorm_fwd_regs(const rmsnorm_args *a, const launch_shape *shape) {
    ref_qt_rmsnorm_fwd(a, shape);
}

void ref_qt_rmsnorm_bwd_dx_regs(const rmsnorm_args *a, const launch_shape *shape) {
    ref_qt_rmsnorm_bwd_dx(a, shape);
}

// Parts [begin, end): each sums its own rows into its own partials.
POOL_CPU_CLONES static void ref_rmsnorm_dgamma_parts(void *ctx, uint64_t p_begin,
                                                     uint64_t p_end) {
    const rmsnorm_args *a = ctx;
    const float *inv = REF_PTR(const float, a->inv_rms);
    float *partials = REF_PTR(float, a->partials);
    for (uint64_t p = p_begin; p < p_end; p++) {
        uint64_t first = (uint64_t)p * a->rows_per_part;
        uint64_t end = first + a->rows_per_part < a->rows ? first + a->rows_per_part : a->rows;
        for (uint32_t c = 0; c < a->cols; c++) {
            float acc = 0.0f;
            for (uint64_t r = first; r < end; r++) {
                float x = qt_act_load(a->x, r * a->cols + c, a->x_dtype);
                float dy = qt_act_load(a->dy, r * a->cols + c, a->dy_dtype);
                acc = qt_rmsnorm_dgamma_step(x, dy, inv[r], acc);
            }
            partials[p * a->cols + c] = qt_act_canonical(acc);
        }
    }
}

void ref_qt_rmsnorm_dgamma_partial(const rmsnorm_args *a, const launch_shape *shape) {
    (void)shape;
    uint64_t part_elems = (uint64_t)a->rows_per_part * a->cols;
    pool_for(a->parts, ref_task_rows(part_elems), ref_rmsnorm_dgamma_parts, (void *)a);
}

void ref_qt_rmsnorm_dgamma_final(const rmsnorm_args *a, const launch_shape *shape) {
    (void)shape;
    const float *partials = REF_PTR(const float, a->partials);
    float *dgamma = REF_PTR(float, a->dgamma);
    for (uint32_t c = 0; c < a->cols; c++) {
        float acc = partials[c];
        for (uint32_t p = 1; p < a->parts; p++) acc = acc + partials[(uint64_t)p * a->cols + c];
        if (a->accumulate) acc = dgamma[c] + acc;
        dgamma[c] = qt_act_canonical(acc);
    }
}

// ---------------------------------------------------------------------------------------------
// Residual add.

POOL_CPU_CLONES static void ref_residual_add_range(void *ctx, uint64_t begin, uint64_t end) {
    const residual_args *a = ctx;
    for (uint64_t i = begin; i < end; i++) {
        float v = qt_act_load(a->a, i, a->a_dtype);
        if (a->b) v = v + qt_act_load(a->b, i, a->b_dtype);
        qt_act_store(a->y, i, a->y_dtype, v);
    }
    ref_act_amax_range(a->amax, a->y, a->y_dtype, begin, end);
}

void ref_qt_residual_add(const residual_args *a, const launch_shape *shape) {
    (void)shape;
    pool_for(a->count, REF_TASK_ELEMS, ref_residual_add_range, (void *)a);
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy.

void ref_qt_xent_count(const xent_args *a, const launch_shape *shape) {
    (void)shape;
    uint32_t valid = 0;
    for (uint32_t r = 0; r < a->rows; r++) valid += qt_xent_label(a->labels, r, a->classes) >= 0;
    REF_PTR(qt_loss_stats, a->stats)->valid = valid;
}

// The GPU's (max, argmax) and sum of exponentials of one row.
static void ref_xent_softmax_terms(const xent_args *a, uint64_t base, qt_xent_best *best,
                                   float *sum_exp) {
    qt_xent_best lanes[QT_ACT_LANES];
    const qt_xent_best none = {QT_ACT_NEG_INF, QT_XENT_NONE};
    for (uint32_t l = 0; l < QT_ACT_LANES; l++) lanes[l] = none;
    for (uint32_t j = 0; j < a->classes; j++) {
        qt_xent_best e = {qt_act_load(a->logits, base + j, a->logits_dtype), j};
        lanes[REF_LANE(j)] = qt_xent_best_combine(lanes[REF_LANE(j)], e);
    }
    QT_ACT_TREE32(lanes, qt_xent_best_combine);
    *best = lanes[0];
    float sums[QT_ACT_LANES] = {0};
    for (uint32_t j = 0; j < a->classes; j++) {
        float z = qt_act_load(a->logits, base + j, a->logits_dtype);
        sums[REF_LANE(j)] = sums[REF_LANE(j)] + qt_expf(z - best->value);
    }
    QT_ACT_TREE32(sums, qt_act_add);
    *sum_exp = sums[0];
}

static float ref_xent_row(const xent_args *a, uint64_t row, uint32_t *correct) {
    int32_t label = qt_xent_label(a->labels, row, a->classes);
    uint64_t base = row * a->classes;
    *correct = 0;
    if (label < 0) {
        for (uint32_t j = 0; a->dlogits && j < a->classes; j++) {
            qt_act_store(a->dlogits, base + j, a->dlogits_dtype, 0.0f);
        }
        return 0.0f;
    }
    qt_xent_best best;
    float sum_exp;
    ref_xent_softmax_terms(a, base, &best, &sum_exp);
    float z_label = qt_act_load(a->logits, base + (uint32_t)label, a->logits_dtype);
    *correct = best.index == (uint32_t)label;
    if (a->dlogits) {
        float valid = (float)REF_PTR(const qt_loss_stats, a->stats)->valid;
        for (uint32_t j = 0; j < a->classes; j++) {
            float z = qt_act_load(a->logits, base + j, a->logits_dtype);
            float d = qt_xent_dlogit(z, best.value, sum_exp, j == (uint32_t)label, valid);
            qt_act_store(a->dlogits, base + j, a->dlogits_dtype, d);
        }
    }
    return qt_xent_row_loss(best.value, z_label, sum_exp);
}

// The row pass into sums [blocks] and hits [blocks].
static void ref_xent_rows(const xent_args *a, float *sums, uint32_t *hits) {
    for (uint32_t b = 0; b < a->blocks; b++) {
        float sum = 0.0f;
        uint32_t correct_total = 0;
        for (uint32_t w = 0; w < QT_ACT_ROWS_PER_BLOCK; w++) {
            uint64_t row = (uint64_t)b * QT_ACT_ROWS_PER_BLOCK + w;
            float loss = 0.0f;
            uint32_t correct = 0;
            if (row < a->rows) {
                loss = ref_xent_row(a, row, &correct);
                if (a->loss) REF_PTR(float, a->loss)[row] = qt_act_canonical(loss);
            }
            sum = w == 0 ? loss : sum + loss;
            correct_total += correct;
        }
        sums[b] = qt_act_canonical(sum);
        hits[b] = correct_total;
    }
    ref_act_amax_range(a->dlogits_amax, a->dlogits, a->dlogits_dtype, 0,
                       (uint64_t)a->rows * a->classes);
}

void ref_qt_xent_rows(const xent_args *a, const launch_shape *shape) {
    (void)shape;
    ref_xent_rows(a, REF_PTR(float, a->partials), REF_PTR(uint32_t, a->partials) + a->blocks);
}

// The final pass over sums [blocks] and hits [blocks].
static void ref_xent_final(const xent_args *a, const float *sums, const uint32_t *hits) {
    float sum = ref_act_final_sum((uint64_t)(uintptr_t)sums, a->blocks);
    uint32_t correct = 0;
    for (uint32_t b = 0; b < a->blocks; b++) correct += hits[b];
    qt_loss_stats *stats = REF_PTR(qt_loss_stats, a->stats);
    stats->loss_sum = qt_act_canonical(sum);
    stats->loss_mean = qt_act_canonical(qt_loss_mean(sum, (float)stats->valid));
    stats->correct = correct;
}

void ref_qt_xent_final(const xent_args *a, const launch_shape *shape) {
    (void)shape;
    ref_xent_final(a, REF_PTR(const float, a->partials),
                   REF_PTR(const uint32_t, a->partials) + a->blocks);
}

#define REF_SMALL_BLOCKS (QT_LOSS_SMALL_ROWS_MAX / QT_ACT_ROWS_PER_BLOCK)

// The one-block kernel computes what the three passes compute: here they are, with the
// partials in local arrays (the kernel keeps the per-row values in shared memory instead).
void ref_qt_xent_small(const xent_args *a, const launch_shape *shape) {
    QT_ASSERT(qt_loss_small_fits(a->rows, a->classes) && a->blocks <= REF_SMALL_BLOCKS);
    float sums[REF_SMALL_BLOCKS];
    uint32_t hits[REF_SMALL_BLOCKS];
    ref_qt_xent_count(a, shape);
    ref_xent_rows(a, sums, hits);
    ref_xent_final(a, sums, hits);
}

// ---------------------------------------------------------------------------------------------
// Mean squared error.

static float ref_mse_row(const mse_args *a, uint64_t row, uint32_t valid) {
    uint64_t base = row * a->cols;
    float n = (float)((uint64_t)valid * a->cols);
    int is_valid = row < valid;
    float lanes[QT_ACT_LANES] = {0};
    for (uint32_t j = 0; j < a->cols; j++) {
        float d = qt_act_load(a->pred, base + j, a->pred_dtype) -
                  qt_act_load(a->target, base + j, a->target_dtype);
        if (is_valid) lanes[REF_LANE(j)] = qt_fmaf(d, d, lanes[REF_LANE(j)]);
        if (a->dpred) {
            qt_act_store(a->dpred, base + j, a->dpred_dtype, is_valid ? qt_mse_dpred(d, n) : 0.0f);
        }
    }
    QT_ACT_TREE32(lanes, qt_act_add);
    return lanes[0];
}

// The row pass into sums [blocks].
static void ref_mse_rows(const mse_args *a, float *sums) {
    uint32_t valid = qt_mse_valid(a->valid_rows, a->rows);
    for (uint32_t b = 0; b < a->blocks; b++) {
        float sum = 0.0f;
        for (uint32_t w = 0; w < QT_ACT_ROWS_PER_BLOCK; w++) {
            uint64_t row = (uint64_t)b * QT_ACT_ROWS_PER_BLOCK + w;
            float s = row < a->rows ? ref_mse_row(a, row, valid) : 0.0f;
            sum = w == 0 ? s : sum + s;
        }
        sums[b] = qt_act_canonical(sum);
    }
    ref_act_amax_range(a->dpred_amax, a->dpred, a->dpred_dtype, 0, (uint64_t)a->rows * a->cols);
}

void ref_qt_mse_rows(const mse_args *a, const launch_shape *shape) {
    (void)shape;
    ref_mse_rows(a, REF_PTR(float, a->partials));
}

// The final pass over sums [blocks].
static void ref_mse_final(const mse_args *a, const float *sums) {
    float sum = ref_act_final_sum((uint64_t)(uintptr_t)sums, a->blocks);
    uint32_t valid = qt_mse_valid(a->valid_rows, a->rows);
    qt_loss_stats *stats = REF_PTR(qt_loss_stats, a->stats);
    stats->loss_sum = qt_act_canonical(sum);
    stats->loss_mean = qt_act_canonical(qt_loss_mean(sum, (float)((uint64_t)valid * a->cols)));
    stats->valid = valid;
    stats->correct = 0;
}

void ref_qt_mse_final(const mse_args *a, const launch_shape *shape) {
    (void)shape;
    ref_mse_final(a, REF_PTR(const float, a->partials));
}

// As ref_qt_xent_small: the two passes with local partials.
void ref_qt_mse_small(const mse_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(qt_loss_small_fits(a->rows, a->cols) && a->blocks <= REF_SMALL_BLOCKS);
    float sums[REF_SMALL_BLOCKS];
    ref_mse_rows(a, sums);
    ref_mse_final(a, sums);
}

// ---------------------------------------------------------------------------------------------
// Global gradient norm.

// Blocks [begin, end) of the launch: each sums its own elements into its own partial, in the
// kernel's order.
POOL_CPU_CLONES static void ref_gnorm_blocks(void *ctx, uint64_t begin, uint64_t end) {
    const gnorm_args *a = ctx;
    float *partials = REF_PTR(float, a->partials);
    uint32_t *flags = (uint32_t *)(partials + a->total);
    for (uint32_t j = (uint32_t)begin; j < end; j++) {
        uint32_t region = qt_gnorm_region(a, j);
        const float *src = REF_PTR(const float, a->src[region]);
        uint64_t block_first = (uint64_t)(j - a->first_block[region]) * QT_GNORM_BLOCK_ELEMS;
        float acc[QT_ACT_THREADS];
        uint32_t nonfinite = 0;
        for (uint32_t t = 0; t < QT_ACT_THREADS; t++) acc[t] = 0.0f;
        bool units = (a->units >> region) & 1u;
        const uint32_t *unit_flags = (const uint32_t *)(src + a->count[region]);
        for (uint32_t k = 0; k < QT_GNORM_BLOCK_ELEMS / (QT_ACT_THREADS * 4); k++) {
            for (uint32_t t = 0; t < QT_ACT_THREADS; t++) {
                uint64_t first = block_first + ((uint64_t)k * QT_ACT_THREADS + t) * 4;
                for (uint64_t i = first; i < first + 4 && i < a->count[region]; i++) {
                    if (units) {
                        acc[t] = acc[t] + src[i];
                        nonfinite |= unit_flags[i];
                    } else {
                        acc[t] = qt_fmaf(src[i], src[i], acc[t]);
                        nonfinite |= qt_f32_nonfinite(src[i]);
                    }
                }
            }
        }
        partials[a->base + j] = qt_act_canonical(ref_act_block_sum(acc));
        flags[a->base + j] = nonfinite ? 1u : 0u;
    }
}

void ref_qt_gnorm(const gnorm_args *a, const launch_shape *shape) {
    const float *partials = REF_PTR(const float, a->partials);
    const uint32_t *flags = (const uint32_t *)(partials + a->total);
    pool_for(shape->grid[0], ref_task_rows(QT_GNORM_BLOCK_ELEMS), ref_gnorm_blocks, (void *)a);
    if (a->out == 0) return;
    float sum = ref_act_final_sum(a->partials, a->total);
    uint32_t nonfinite = 0;
    for (uint32_t i = 0; i < a->total; i++) nonfinite |= flags[i];
    float norm = qt_sqrtf(sum);
    qt_gnorm_result *out = REF_PTR(qt_gnorm_result, a->out);
    out->norm = qt_act_canonical(norm);
    out->clip_factor = qt_act_canonical(qt_gnorm_clip_factor(norm, a->clip));
    out->nonfinite = nonfinite ? 1u : 0u;
    out->reserved = 0;
    *REF_PTR(uint32_t, a->ticket) = 0;
    if (a->begin_state != 0) {
        qt_optim_begin_apply(REF_PTR(uint64_t, a->begin_steps),
                             REF_PTR(optim_state, a->begin_state),
                             (const optim_grad_norm *)out,
                             REF_PTR(const optim_lr_row, a->begin_lr_rows), a->begin_rows);
        if (a->begin_zero != 0) {
            qt_optim_zero_amaxes(REF_PTR(const optim_multi_entry, a->begin_zero),
                                 a->begin_zero_count);
        }
    }
}
