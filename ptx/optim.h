// optim: the fused AdamW optimizer's ABI (ptx/optim.cu) and the per-step and per-element
// arithmetic it shares with its C twins (runtime/ref/ref_optim.c): the AdamW update rule in IEEE
// arithmetic instead of fast math (so the C twins reproduce the GPU bit for bit), delayed scaling
// (ptx/quant_fp8.h), quantized parameters requantized from the FP32 master every step
// (runtime/ops/op_optim.h), and the learning-rate schedule (runtime/schedule/schedule.h).
//
// Owns nothing. Device state, written by device kernels only, so one captured graph serves every
// step and every schedule row:
//
//   steps           (8 B, persistent)   u64: the counted (not skipped) steps so far
//   optim_state     (24 B, one step)    this step's values, written by qt_optim_begin: step
//                                       (counted steps, this one included unless skipped), lr,
//                                       skip, clip; read by the updates and the step's record
//   optim_lr_row[n] (32 B each)         the learning-rate schedule, sorted by start
//   optim_grad_norm (16 B, input)       {norm, clip_factor, nonfinite}: written by the global-norm
//                                       kernel of the act family; optional
//
//   kernel            what                                               launch
//   qt_optim_begin    skip = nonfinite || clip not finite; lr from the   1 block x 32 threads,
//                     schedule row of step t = steps (before the         thread 0 works
//                     increment); steps += 1 unless skipped; the state;
//                     the table's amaxes zeroed (qt_optim_zero_amaxes)
//                     (several ranks only: on one GPU qt_gnorm's folding thread runs
//                     qt_optim_begin_apply itself, ptx/act.h gnorm_args.begin_*)
//   qt_optim_adamw    one parameter: grad, master, m, v -> master, m, v  one 64 x 64 tile per
//                     and, fused, the BF16 copy or the FP8 per-tensor    block, 256 threads,
//                     delayed codes (rowwise + transposed columnwise,    each 4 rows x 4 columns
//                     scale_inv, atomic amax into history row 0); or
//                     the new master's amax for a cast that follows;
//                     or the rowwise MXFP8 codes and E8M0 scales (a
//                     1 x 32 block is one row of 8 threads' columns)
//   qt_optim_adamw_   qt_optim_adamw of every entry of a table          the entries' tiles
//     multi           (optim_multi_entry), each with its own args       one after the other
//   qt_optim_amax_    +0 into the amax targets of the table's entries   1 block x 32 threads
//     zero            that qt_optim_entry_zeroes (before the update),
//                     where the step's begin does not (a list whose
//                     targets are more than one op declares)
//   qt_optim_describe writes one table entry (init program)             1 block x 32 threads
//
// A skipped step (state.skip = 1) changes no persistent byte of the model: qt_optim_adamw writes
// no master, m, v, codes, scale_inv or amax history, the counted steps stay, the step's own
// values live in a region of the train program alone, and the end of the step leaves the
// delayed-scaling state as it was (ptx/quant_fp8.h: the step's amaxes are dropped, nothing
// rolls), so a run that meets a non-finite gradient goes on from the state before it, bit for
// bit (tests/test_faults.c checks every persistent region in every format). Formats cast by a
// separate kernel after
// the update (see runtime/ops/op_optim.h) recast the unchanged master, which reproduces the
// weight's bytes because the weight always is the cast of its master (op_optim_quantize establishes
// that at start-up and every step keeps it); for them the update kernel still writes the master's
// amax on a skipped step (QT_OPTIM_FLAG_AMAX_ON_SKIP), since the cast reads it from a workspace
// that was zeroed this step.
//
// Per element, in this order (FP32, IEEE round to nearest even, subnormals kept; qt_fmaf marks
// the only fused multiply-adds, everything else is one rounding per operation):
//
//   g      = grad * clip
//   m      = fma(beta1, m, (1 - beta1) * g)
//   v      = fma(beta2, v, ((1 - beta2) * g) * g)
//   denom  = sqrt(v / bc2) + eps                    (eps after the square root)
//   update = fma(weight_decay, p, (m / bc1) / denom)
//   p      = fma(-lr, update, p)                     lr = state.lr * lr_scale
//
// 1 - beta is computed in FP32 (exact for beta in [0.5, 1] by Sterbenz). A NaN result is written
// as the canonical 0x7FFFFFFF on both sides (the GPU's NaN; x86 would keep payloads and signs).
//
// Bias corrections bc = 1 - beta^step (TE computes float(1.0 - pow(double(beta),
// step)) on the host): here beta^step is raised in double by binary exponentiation over the bits
// of the device step counter (squarings and multiplications in a fixed order, IEEE double on
// both sides, no contraction), then 1.0 - that in double, rounded once to FP32. Squaring doubles
// a relative error, so the power is within step * 2^-53 of beta^step relatively, and bc within
// beta^step * step * 2^-53 <= 2^-53 / (e |ln beta|) absolutely (4e-14 for beta = 0.999), far
// below FP32's resolution: the FP32 result equals TE's except when the exact value lies within
// that distance of an FP32 rounding boundary (tests/test_optim.c finds it equal to pow()'s over
// 240000 (beta, step) pairs). This is O(log step) work once per block, against O(step) for
// repeated multiplication, and needs no transcendental function.
//
// Learning rate at step index t (counted steps before this one): the row is the last one with
// start <= t (row 0 if none; found by binary search over the sorted rows); d = min(t - start,
// steps), f = float(d) / float(steps);
//   CONSTANT  a
//   LINEAR    a + (b - a) * f                       a at the row's first step, b at start + steps
//   COSINE    a + (b - a) * (0.5 * (1 - cospi(f)))  cospi from qt_math.h (bit-identical twins)
// so a linear warm-up row followed by a cosine row from the same value is continuous, and steps
// past the last row keep its end value b.
#ifndef QT_OPTIM_H
#define QT_OPTIM_H

#include "ptx/core.h"         // QT_DTYPE_BF16, QT_DTYPE_F32
#include "ptx/qt_codec.h"     // qt_f32_to_bf16, qt_bf16_to_f32
#include "ptx/qt_hd.h"        // qt_fmaf, qt_sqrtf
#include "ptx/qt_math.h"      // qt_cospif
#include "ptx/quant_block.h"  // qt_block_fp8x2 (cvt.rn.satfinite on the device, the codec on host)
#include "ptx/quant_fp8.h"    // QT_FP8_E4M3/E5M2, qt_fp8_amax_step, qt_fp8_scale_inv, ...
#include "ptx/quant_mxfp8.h"  // qt_mxfp8_amax_step, qt_mxfp8_scale_e8m0, qt_mxfp8_encode2

QT_STATIC_ASSERT(QT_FP8_E4M3 == QT_BLOCK_E4M3 && QT_FP8_E5M2 == QT_BLOCK_E5M2,
                 "qt_block_fp8x2 takes the per-tensor FP8 element codes");

// Learning-rate rules of a schedule row.
#define QT_OPTIM_LR_CONSTANT 0u
#define QT_OPTIM_LR_LINEAR 1u
#define QT_OPTIM_LR_COSINE 2u

// What qt_optim_adamw writes besides master, m and v.
#define QT_OPTIM_OUT_NONE 0u  // nothing (FP32 parameters, or a cast kernel follows)
#define QT_OPTIM_OUT_BF16 1u  // weight: u16 [rows][cols], RN
#define QT_OPTIM_OUT_FP8 2u   // per-tensor FP8 with the scale read from `scale` (delayed scaling)
#define QT_OPTIM_OUT_MXFP8 3u  // rowwise MXFP8 (1 x 32 blocks, E8M0 scales) of the new master

// optim_adamw_args.flags
#define QT_OPTIM_FLAG_BIAS_CORRECTION 1u  // bc1, bc2 from the step; off: both 1
#define QT_OPTIM_FLAG_AMAX_ON_SKIP 2u     // a skipped step still writes the (old) master's amax
#define QT_OPTIM_FLAG_QUANTIZE_ONLY 4u    // no update, state not read: outputs and amax of the
                                          // master as it is (start-up quantization)

typedef struct optim_state {
    uint64_t step;  // counted (not skipped) steps, including this one unless it is skipped
    float lr;       // this step's schedule learning rate
    uint32_t skip;  // 1: this step is skipped
    float clip;     // this step's gradient multiplier (1 without a norm input)
    uint32_t reserved;
} optim_state;
QT_STATIC_ASSERT(sizeof(optim_state) == 24, "optim_state layout");

// Written by the global gradient-norm kernel (act family); the layout is the contract.
typedef struct optim_grad_norm {
    float norm;
    float clip_factor;   // multiplier of every gradient (min(1, max_norm / norm) or 1)
    uint32_t nonfinite;  // non-zero: some gradient element is NaN or Inf
    uint32_t pad;
} optim_grad_norm;
QT_STATIC_ASSERT(sizeof(optim_grad_norm) == 16, "optim_grad_norm layout");

typedef struct optim_lr_row {
    uint64_t start;  // step index (counted steps before it) of the row's first step
    uint64_t steps;  // length of the row, >= 1
    uint32_t rule;   // QT_OPTIM_LR_*
    float a, b;      // CONSTANT: a; LINEAR and COSINE: from a to b
    uint32_t reserved;
} optim_lr_row;
QT_STATIC_ASSERT(sizeof(optim_lr_row) == 32, "optim_lr_row layout");

typedef struct optim_begin_args {
    uint64_t steps;      // u64 counted steps, read; written (+1) unless the step is skipped
    uint64_t state;      // optim_state, written
    uint64_t grad_norm;  // optim_grad_norm, read; 0 = none (clip 1, never skip)
    uint64_t lr_rows;    // optim_lr_row [row_count], read
    uint64_t zero;       // optim_multi_entry [zero_count], read: qt_optim_zero_amaxes; 0 = none
    uint32_t row_count;  // >= 1
    uint32_t zero_count;
} optim_begin_args;
QT_STATIC_ASSERT(sizeof(optim_begin_args) == 48, "optim_begin_args layout");

typedef struct optim_adamw_args {
    uint64_t state;      // optim_state, read (not with QUANTIZE_ONLY)
    uint64_t grad;       // [rows][cols] bf16 | f32
    uint64_t master;     // f32 [rows][cols], updated in place
    uint64_t m, v;       // f32 [rows][cols], updated in place
    uint64_t weight;     // OUT_BF16: u16 [rows][cols]; OUT_FP8 and OUT_MXFP8: rowwise u8
                         // [rows][cols]; 0 = none (OUT_FP8 only)
    uint64_t weight_t;   // OUT_FP8: columnwise u8 [cols][rows] (byte transpose); 0 = none
    uint64_t scale;      // OUT_FP8: f32, read (the delayed-scaling state's scale)
    uint64_t scale_inv;  // OUT_FP8: f32, written RN(1 / scale); OUT_MXFP8: the rowwise E8M0
                         // scales, u8 [rows][ceil(cols / 32)], written
    uint64_t amax0;      // f32 [qt_optim_amax_words], atomic max of |new master| (history row 0,
                         // or a workspace at 0)
    uint64_t amax1;      // f32 [qt_optim_amax_words], a second target of the same values (NVFP4
                         // columnwise); 0 = none
    uint32_t rows, cols;
    uint32_t grad_dtype;  // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t out;         // QT_OPTIM_OUT_*
    uint32_t fp8;         // OUT_FP8: QT_FP8_E4M3 | QT_FP8_E5M2; OUT_MXFP8: QT_MXFP8_E4M3 | _E5M2
    uint32_t flags;       // QT_OPTIM_FLAG_*
    float beta1, beta2, eps, weight_decay;
    float lr_scale;       // this parameter's lr = state.lr * lr_scale
    // A stacked weight's members (rows / amax_member_rows of them, each amax_member_rows rows,
    // a multiple of QT_OPTIM_TILE so that a tile lies in one member) each take their own amax:
    // word r / amax_member_rows of amax0 and amax1. 0: one word, the whole parameter's.
    uint32_t amax_member_rows;
} optim_adamw_args;
QT_STATIC_ASSERT(sizeof(optim_adamw_args) == 136, "optim_adamw_args layout");

// The multi-tensor update: one launch over many parameters. Each parameter is one entry of a
// device table: its qt_optim_adamw args (state 0: the launch's own), and its tiles' place among
// the launch's blocks. A block finds its entry by a binary search over first_block, then runs
// the per-parameter kernel's tile on it, so every parameter gets the per-parameter kernel's
// bits. The table holds addresses, so it is written once at start-up (qt_optim_describe in the
// init program, one op per entry, its args' addresses resolved like any op's) and read by every
// step.
typedef struct optim_multi_entry {
    optim_adamw_args args;  // state unused: the launch's
    uint32_t first_block;   // the blocks of the launch's entries before this one
    uint32_t blocks;        // this parameter's tiles (>= 1)
    // The amax arrays that the parameter's cast kernel after the update merges into (a stacked
    // weight's per-member amaxes, NVFP4's pair with RHT), f32 [cast_amax_words] each, which the
    // step's begin zeroes (qt_optim_zero_amaxes); 0: none. The update never reads them.
    uint64_t cast_amax[2];
    uint32_t cast_amax_words;
    uint32_t reserved;
} optim_multi_entry;
QT_STATIC_ASSERT(sizeof(optim_multi_entry) == 168, "optim_multi_entry layout");

typedef struct optim_describe_args {
    uint64_t entry;           // optim_multi_entry, written: a copy of `value`
    optim_multi_entry value;  // the addresses of its args resolved by the program
} optim_describe_args;
QT_STATIC_ASSERT(sizeof(optim_describe_args) == 176, "optim_describe_args layout");

typedef struct optim_multi_args {
    uint64_t state;    // optim_state, read
    uint64_t entries;  // optim_multi_entry [count], read; first_block rising from 0
    uint32_t count;    // >= 1
    uint32_t reserved;
} optim_multi_args;
QT_STATIC_ASSERT(sizeof(optim_multi_args) == 24, "optim_multi_args layout");

// Launch geometry shared by the kernel and its op builder.
#define QT_OPTIM_TILE 64u      // a block's tile is QT_OPTIM_TILE x QT_OPTIM_TILE elements
#define QT_OPTIM_THREADS 256u  // 16 x 16 threads, each 4 rows x 4 columns of the tile
#define QT_OPTIM_BEGIN_THREADS 32u

#define QT_OPTIM_DESCRIBE_THREADS 32u
#define QT_OPTIM_ZERO_THREADS 32u

#define QT_KERNELS_OPTIM(X)                                                       \
    X(KERNEL_OPTIM_BEGIN, optim, qt_optim_begin, optim_begin_args)               \
    X(KERNEL_OPTIM_ADAMW, optim, qt_optim_adamw, optim_adamw_args)               \
    X(KERNEL_OPTIM_DESCRIBE, optim, qt_optim_describe, optim_describe_args)      \
    X(KERNEL_OPTIM_AMAX_ZERO, optim, qt_optim_amax_zero, optim_multi_args)       \
    X(KERNEL_OPTIM_ADAMW_MULTI, optim, qt_optim_adamw_multi, optim_multi_args)

// ---------------------------------------------------------------------------------------------
// Per step.

QT_HD int qt_optim_finite(float x) { return (qt_f32_bits(x) & QT_F32_ABS) < QT_F32_INF; }

// base^e by binary exponentiation in double: the squarings and multiplications run in one fixed
// order, each an IEEE double rounding, so both backends get the same bits.
QT_HD double qt_optim_powi(double base, uint64_t e) {
    double result = 1.0;
    double square = base;
    while (e != 0) {
        if (e & 1u) result = result * square;
        square = square * square;
        e >>= 1;
    }
    return result;
}

// bc = 1 - beta^step, in double, rounded once to FP32, as TE's bias correction.
QT_HD float qt_optim_bias_correction(float beta, uint64_t step) {
    return (float)(1.0 - qt_optim_powi((double)beta, step));
}

// The row of step t: the last row i >= 1 with start <= t, else row 0. A binary search (rows
// are sorted by start), so a schedule of many rows (repeats) costs a few reads per step.
QT_HD uint32_t qt_optim_lr_row_of(const optim_lr_row *rows, uint32_t count, uint64_t t) {
    uint32_t lo = 1, hi = count;  // rows [1, lo) start at or before t, rows [hi, count) after
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (rows[mid].start <= t) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo - 1;
}

QT_HD float qt_optim_lr_at(const optim_lr_row *rows, uint32_t count, uint64_t t) {
    const optim_lr_row *row = &rows[qt_optim_lr_row_of(rows, count, t)];
    if (row->rule == QT_OPTIM_LR_CONSTANT || row->steps == 0) return row->a;
    uint64_t d = t > row->start ? t - row->start : 0;
    if (d > row->steps) d = row->steps;
    float f = (float)d / (float)row->steps;
    float w = row->rule == QT_OPTIM_LR_LINEAR ? f : 0.5f * (1.0f - qt_cospif(f));
    return row->a + (row->b - row->a) * w;
}

// The whole of qt_optim_begin (one thread on the device).
QT_HD void qt_optim_begin_apply(uint64_t *steps, optim_state *s, const optim_grad_norm *norm,
                                const optim_lr_row *rows, uint32_t row_count) {
    float clip = 1.0f;
    uint32_t skip = 0;
    if (norm != 0) {
        clip = norm->clip_factor;
        skip = (norm->nonfinite != 0 || !qt_optim_finite(clip)) ? 1u : 0u;
    }
    uint64_t done = *steps;
    s->lr = qt_optim_lr_at(rows, row_count, done);
    s->clip = clip;
    s->skip = skip;
    s->reserved = 0;
    s->step = skip ? done : done + 1;
    if (!skip) *steps = done + 1;
}

// What one launch of qt_optim_adamw does.
#define QT_OPTIM_DO_UPDATE 1u  // update master, m, v
#define QT_OPTIM_DO_OUT 2u     // write the fused weight outputs (BF16 or FP8 codes, scale_inv)
#define QT_OPTIM_DO_AMAX 4u    // max |master| into amax0 / amax1

// The per-launch constants of the update.
typedef struct qt_optim_coef {
    float lr, clip, bc1, bc2;
    float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
    float scale;  // OUT_FP8
} qt_optim_coef;

QT_HD uint32_t qt_optim_prepare(const optim_adamw_args *a, qt_optim_coef *c) {
    uint32_t mode = QT_OPTIM_DO_UPDATE | QT_OPTIM_DO_OUT | QT_OPTIM_DO_AMAX;
    c->lr = 0.0f;
    c->clip = 1.0f;
    c->bc1 = 1.0f;
    c->bc2 = 1.0f;
    if (a->flags & QT_OPTIM_FLAG_QUANTIZE_ONLY) {
        mode = QT_OPTIM_DO_OUT | QT_OPTIM_DO_AMAX;
    } else {
        const optim_state *s = (const optim_state *)(uintptr_t)a->state;
        if (s->skip) {
            mode = (a->flags & QT_OPTIM_FLAG_AMAX_ON_SKIP) ? QT_OPTIM_DO_AMAX : 0u;
        } else if (a->flags & QT_OPTIM_FLAG_BIAS_CORRECTION) {
            c->bc1 = qt_optim_bias_correction(a->beta1, s->step);
            c->bc2 = qt_optim_bias_correction(a->beta2, s->step);
        }
        c->lr = s->lr * a->lr_scale;
        c->clip = s->clip;
    }
    if (a->out == QT_OPTIM_OUT_NONE) mode &= ~QT_OPTIM_DO_OUT;
    if (a->amax0 == 0 && a->amax1 == 0) mode &= ~QT_OPTIM_DO_AMAX;
    c->beta1 = a->beta1;
    c->beta2 = a->beta2;
    c->one_minus_beta1 = 1.0f - a->beta1;
    c->one_minus_beta2 = 1.0f - a->beta2;
    c->eps = a->eps;
    c->weight_decay = a->weight_decay;
    c->scale = (mode & QT_OPTIM_DO_OUT) && a->out == QT_OPTIM_OUT_FP8
                   ? *(const float *)(uintptr_t)a->scale
                   : 1.0f;
    return mode;
}

// ---------------------------------------------------------------------------------------------
// Per element.

// One AdamW step of one element (the order of operations is the one at the top of this file).
QT_HD void qt_optim_adamw_elem(const qt_optim_coef *c, float grad, float *p, float *m,
                               float *v) {
    float g = grad * c->clip;
    float m_new = qt_fmaf(c->beta1, *m, c->one_minus_beta1 * g);
    float v_new = qt_fmaf(c->beta2, *v, (c->one_minus_beta2 * g) * g);
    float denom = qt_sqrtf(v_new / c->bc2) + c->eps;
    float update = qt_fmaf(c->weight_decay, *p, (m_new / c->bc1) / denom);
    float p_new = qt_fmaf(-c->lr, update, *p);
    *m = qt_fp8_nan_canonical(m_new);
    *v = qt_fp8_nan_canonical(v_new);
    *p = qt_fp8_nan_canonical(p_new);
}

// ---------------------------------------------------------------------------------------------
// Multi-tensor launches.

// The entry of block `block`: the last one whose first_block is <= block (first_block rises
// strictly, every entry having a block).
QT_HD uint32_t qt_optim_entry_of(const optim_multi_entry *entries, uint32_t count,
                                 uint32_t block) {
    uint32_t lo = 1, hi = count;  // entries [1, lo) start at or before block, [hi, count) after
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (entries[mid].first_block <= block) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo - 1;
}

// The words of each amax target of a (one per member of a stacked weight), and the word of row r.
QT_HD uint32_t qt_optim_amax_words(const optim_adamw_args *a) {
    return a->amax_member_rows != 0 ? a->rows / a->amax_member_rows : 1u;
}

QT_HD uint32_t qt_optim_amax_word(const optim_adamw_args *a, uint32_t row) {
    return a->amax_member_rows != 0 ? row / a->amax_member_rows : 0u;
}

// Whether qt_optim_amax_zero zeroes the entry's amax targets: the ones that are a workspace the
// update fills for a cast that follows (QT_OPTIM_FLAG_AMAX_ON_SKIP), never a delayed-scaling
// history slot, which other casts of the step max into too.
QT_HD int qt_optim_entry_zeroes(const optim_multi_entry *e) {
    return (e->args.flags & QT_OPTIM_FLAG_AMAX_ON_SKIP) != 0;
}

// +0 into every amax of entries[0, count) that the step maxes into from zero: the update's
// targets where qt_optim_entry_zeroes (what qt_optim_amax_zero does), and the cast kernels'
// arrays (cast_amax). The step's begin does it (qt_optim_begin, gnorm_args.begin_zero), one
// thread, before any update or cast of the step merges into them.
QT_HD void qt_optim_zero_amaxes(const optim_multi_entry *entries, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) {
        const optim_multi_entry *e = &entries[i];
        if (qt_optim_entry_zeroes(e)) {
            float *amax0 = (float *)(uintptr_t)e->args.amax0;
            float *amax1 = (float *)(uintptr_t)e->args.amax1;
            for (uint32_t w = 0; w < qt_optim_amax_words(&e->args); w++) {
                if (amax0 != 0) amax0[w] = 0.0f;
                if (amax1 != 0) amax1[w] = 0.0f;
            }
        }
        for (uint32_t k = 0; k < 2; k++) {
            float *amax = (float *)(uintptr_t)e->cast_amax[k];
            for (uint32_t w = 0; amax != 0 && w < e->cast_amax_words; w++) amax[w] = 0.0f;
        }
    }
}

// Two FP8 codes (p0 in the low byte) of q = satFP8(RN(p * scale)), the per-tensor FP8 rule:
// the per-tensor family's qt_fp8_quantize, with the device's hardware conversion (equal to the
// codec bit for bit).
QT_HD uint32_t qt_optim_fp8_pair(float p0, float p1, float scale, uint32_t fp8) {
    return qt_block_fp8x2(p0 * scale, p1 * scale, fp8);
}

#endif  // QT_OPTIM_H
