// C twins of ptx/quant_fp8.cu: plain loops over members, rows and columns, running the per-element
// and per-slot functions of quant_fp8.h that the kernels run. A member's rows are cut into ranges,
// tasks of the thread pool: each writes its own codes and merges its amax as the kernels' blocks
// do (a maximum, whatever the order).
#include <stdbool.h>

#include "ptx/act_math.h"       // qt_act_lut_value, qt_act_stored_amax (the act casts)
#include "runtime/base/pool.h"  // pool_for, POOL_CPU_CLONES
#include "runtime/ref/ref.h"

static float ref_fp8_load(uint64_t x, uint32_t dtype, uint64_t i) {
    if (dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(REF_PTR(const uint16_t, x)[i]);
    return REF_PTR(const float, x)[i];
}

static uint32_t ref_fp8_members(qt_group_desc g) { return g.count ? g.count : 1u; }

// Rows [begin, end) of a member clipped to the active rows (the kernels never touch the rest).
static uint32_t ref_fp8_clip(uint32_t row, uint32_t active) { return row < active ? row : active; }

void ref_qt_fp8_amax_zero(const fp8_amax_zero_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint32_t i = 0; i < a->slots; i++) REF_PTR(float, a->amax)[i] = 0.0f;
}

// One member's rows as a job: rows [first + begin, first + end) per task.
typedef struct ref_fp8_job {
    const void *a;  // fp8_amax_args or fp8_cast_args
    uint32_t member, first;
    qt_group_rows rows;
    float scale;  // cast: the member's scale
} ref_fp8_job;

static uint64_t ref_fp8_count(uint32_t first, uint32_t end) {
    return end > first ? end - first : 0;
}

// The GPU maxes per-block partials into the slot; the max of all of them is this.
POOL_CPU_CLONES static void ref_fp8_amax_rows(void *ctx, uint64_t begin, uint64_t end) {
    const ref_fp8_job *job = ctx;
    const fp8_amax_args *a = job->a;
    float amax = 0.0f;
    for (uint64_t i = (job->first + begin) * a->cols; i < (job->first + end) * a->cols; i++) {
        amax = qt_fp8_amax_step(amax, ref_fp8_load(a->x, a->dtype, i));
    }
    ref_amax_merge(REF_PTR(float, a->amax) + job->member, amax);
}

void ref_qt_fp8_amax(const fp8_amax_args *a, const launch_shape *shape) {
    (void)shape;
    uint32_t active = qt_group_active_rows(a->group, a->rows);
    for (uint32_t member = 0; member < ref_fp8_members(a->group); member++) {
        ref_fp8_job job = {a, member, 0, qt_group_member_rows(a->group, a->rows, member), 0.0f};
        job.first = job.rows.begin;
        pool_for(ref_fp8_count(job.first, ref_fp8_clip(job.rows.valid_end, active)),
                 ref_task_rows(a->cols), ref_fp8_amax_rows, &job);
    }
}

POOL_CPU_CLONES static void ref_fp8_cast_rows(void *ctx, uint64_t begin, uint64_t end) {
    const ref_fp8_job *job = ctx;
    const fp8_cast_args *a = job->a;
    uint8_t *rowwise = REF_PTR(uint8_t, a->rowwise);
    uint8_t *colwise = REF_PTR(uint8_t, a->colwise);
    float amax = 0.0f;
    for (uint32_t r = job->first + (uint32_t)begin; r < job->first + end; r++) {
        bool valid = r < job->rows.valid_end;  // padding rows: zero codes, no amax
        for (uint32_t k = 0; k < a->cols; k++) {
            uint8_t code = 0;
            if (valid) {
                float x = ref_fp8_load(a->x, a->dtype, (uint64_t)r * a->cols + k);
                amax = qt_fp8_amax_step(amax, x);
                code = qt_fp8_quantize(x, job->scale, a->fp8);
            }
            if (rowwise) rowwise[(uint64_t)r * a->cols + k] = code;
            if (colwise) colwise[(uint64_t)k * a->rows + r] = code;
        }
    }
    if (a->amax_out) ref_amax_merge(REF_PTR(float, a->amax_out) + job->member, amax);
}

// Every member's scale_inv (and, for current scaling, the scale it derived), as the kernels'
// block 0 writes them (qt_fp8_cast_write_scales).
static void ref_fp8_write_scales(const fp8_cast_args *a) {
    uint32_t n = ref_fp8_members(a->group);
    for (uint32_t i = 0; i < n; i++) {
        float scale = qt_fp8_member_scale(a, i);
        if (a->scale_mode == QT_FP8_SCALE_CURRENT && a->scale) REF_PTR(float, a->scale)[i] = scale;
        REF_PTR(float, a->scale_inv)[i] = qt_fp8_scale_inv(scale);
    }
}

static void ref_fp8_cast(const fp8_cast_args *a) {
    uint32_t n = ref_fp8_members(a->group);
    ref_fp8_write_scales(a);
    uint32_t active = qt_group_active_rows(a->group, a->rows);
    for (uint32_t member = 0; member < n; member++) {
        ref_fp8_job job = {a, member, 0, qt_group_member_rows(a->group, a->rows, member),
                           qt_fp8_member_scale(a, member)};
        job.first = job.rows.begin;
        pool_for(ref_fp8_count(job.first, ref_fp8_clip(job.rows.end, active)),
                 ref_task_rows(a->cols), ref_fp8_cast_rows, &job);
    }
}

void ref_qt_fp8_cast_bf16(const fp8_cast_args *a, const launch_shape *shape) {
    (void)shape;
    ref_fp8_cast(a);
}

void ref_qt_fp8_cast_f32(const fp8_cast_args *a, const launch_shape *shape) {
    (void)shape;
    ref_fp8_cast(a);
}

void ref_qt_fp8_delayed_update(const fp8_delayed_update_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint32_t j = 0; j < a->slots; j++) qt_fp8_delayed_update_slot(a, j);
}

void ref_qt_fp8_delayed_states(const fp8_delayed_states_args *a, const launch_shape *shape) {
    (void)shape;
    for (uint32_t s = 0; s < a->count; s++) {
        for (uint32_t j = 0; j < a->states[s].slots; j++) qt_fp8_delayed_states_slot(a, s, j);
    }
}

POOL_CPU_CLONES static void ref_fp8_dequantize_rows(void *ctx, uint64_t begin, uint64_t end) {
    const ref_fp8_job *job = ctx;
    const fp8_dequantize_args *a = job->a;
    const uint8_t *codes = REF_PTR(const uint8_t, a->codes);
    float scale_inv = REF_PTR(const float, a->scale_inv)[job->member];
    for (uint32_t r = job->first + (uint32_t)begin; r < job->first + end; r++) {
        for (uint32_t k = 0; k < a->cols; k++) {
            uint64_t at = (uint64_t)r * a->cols + k;
            uint8_t code = a->colwise ? codes[(uint64_t)k * a->rows + r] : codes[at];
            float value = 0.0f;
            if (r < job->rows.valid_end) value = qt_fp8_dequantize_value(code, a->fp8, scale_inv);
            if (a->dtype == QT_DTYPE_BF16) {
                REF_PTR(uint16_t, a->out)[at] = qt_f32_to_bf16(value);
            } else {
                REF_PTR(float, a->out)[at] = value;
            }
        }
    }
}

void ref_qt_fp8_dequantize(const fp8_dequantize_args *a, const launch_shape *shape) {
    (void)shape;
    uint32_t active = qt_group_active_rows(a->group, a->rows);
    for (uint32_t member = 0; member < ref_fp8_members(a->group); member++) {
        ref_fp8_job job = {a, member, 0, qt_group_member_rows(a->group, a->rows, member), 0.0f};
        job.first = job.rows.begin;
        pool_for(ref_fp8_count(job.first, ref_fp8_clip(job.rows.end, active)),
                 ref_task_rows(a->cols), ref_fp8_dequantize_rows, &job);
    }
}

POOL_CPU_CLONES static void ref_fp8_transpose_rows(void *ctx, uint64_t begin, uint64_t end) {
    const fp8_transpose_args *a = ctx;
    const uint8_t *codes = REF_PTR(const uint8_t, a->codes);
    uint8_t *out = REF_PTR(uint8_t, a->out);
    for (uint64_t r = begin; r < end; r++) {
        for (uint64_t k = 0; k < a->cols; k++) out[k * a->rows + r] = codes[r * a->cols + k];
    }
}

void ref_qt_fp8_transpose(const fp8_transpose_args *a, const launch_shape *shape) {
    (void)shape;
    fp8_transpose_args job = *a;
    pool_for(a->rows, ref_task_rows(a->cols), ref_fp8_transpose_rows, &job);
    if (!a->scales) return;
    const float *scales = REF_PTR(const float, a->scales);
    float *out = REF_PTR(float, a->scales_out);
    for (uint64_t r = 0; r < a->scale_rows; r++) {
        for (uint64_t c = 0; c < a->scale_cols; c++) {
            out[c * a->scale_rows + r] = scales[r * a->scale_cols + c];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The activation and the cast of its output (fp8_act_cast_args): each element's y as the act
// twins store it (the table's values are qt_act_lut_value's), then the cast's code and amax.

typedef struct ref_fp8_act_job {
    const fp8_act_cast_args *a;
    bool backward;
    float scale;
} ref_fp8_act_job;

static float ref_fp8_act_y(const fp8_act_cast_args *a, bool backward, uint64_t i) {
    float x = qt_bf16_to_f32(REF_PTR(const uint16_t, a->cast.x)[i]);
    float f = qt_act_lut_value(a->act, backward, x);
    if (backward) f = qt_bf16_to_f32(REF_PTR(const uint16_t, a->dy)[i]) * f;
    return qt_bf16_to_f32(qt_f32_to_bf16(f));
}

POOL_CPU_CLONES static void ref_fp8_act_cast_rows(void *ctx, uint64_t begin, uint64_t end) {
    const ref_fp8_act_job *job = ctx;
    const fp8_cast_args *c = &job->a->cast;
    uint8_t *rowwise = REF_PTR(uint8_t, c->rowwise);
    uint8_t *colwise = REF_PTR(uint8_t, c->colwise);
    bool codes = rowwise || colwise;
    float amax = 0.0f;
    for (uint64_t r = begin; r < end; r++) {
        for (uint64_t k = 0; k < c->cols; k++) {
            float y = ref_fp8_act_y(job->a, job->backward, r * c->cols + k);
            amax = qt_fp8_amax_step(amax, y);
            if (!codes) continue;
            uint8_t code = qt_fp8_quantize(y, job->scale, c->fp8);
            if (rowwise) rowwise[r * c->cols + k] = code;
            if (colwise) colwise[k * c->rows + r] = code;
        }
    }
    if (c->amax_out) ref_amax_merge(REF_PTR(float, c->amax_out), amax);
}

static void ref_fp8_act_cast(const fp8_act_cast_args *a, bool backward) {
    const fp8_cast_args *c = &a->cast;
    ref_fp8_act_job job = {a, backward, 0.0f};
    float y;
    bool codes = c->rowwise || c->colwise;
    if (!backward && !codes && a->x_max != 0 &&
        qt_act_amax_from_max(a->act, qt_bits_f32(*REF_PTR(const uint32_t, a->x_max)), &y)) {
        ref_amax_merge(REF_PTR(float, c->amax_out), qt_act_stored_amax(y, QT_DTYPE_BF16));
        return;
    }
    if (codes) {
        ref_fp8_write_scales(c);
        job.scale = qt_fp8_member_scale(c, 0);
    }
    pool_for(c->rows, ref_task_rows(c->cols), ref_fp8_act_cast_rows, &job);
}

void ref_qt_fp8_act_cast_fwd(const fp8_act_cast_args *a, const launch_shape *shape) {
    (void)shape;
    ref_fp8_act_cast(a, false);
}

void ref_qt_fp8_act_cast_bwd(const fp8_act_cast_args *a, const launch_shape *shape) {
    (void)shape;
    ref_fp8_act_cast(a, true);
}
