// Fused AdamW optimizer tests (ptx/optim.h, runtime/ops/op_optim.c, runtime/ref/ref_optim.c).
//
// CPU: bias corrections against TE's formula, learning-rate rules at row boundaries,
// the begin kernel's skip / step / clip rules, the update against a double-precision reference
// with a derived bound, the clip factor, a skipped step leaving every byte of state unchanged
// (every weight format), and the requantized weight equal, bit for bit, to the format family's
// own quantization of the new master; the multi-tensor launches against the per-parameter ops,
// byte for byte, with the case's parameter among 20 others. GPU (skipped without one): every
// format, GPU against the reference backend byte for byte over several steps (one skipped,
// planted NaN / Inf / huge / subnormal gradients), a captured graph replayed 10 times against
// eager execution, and the multi-tensor kernels against the per-parameter twins.
#include <math.h>

#include "runtime/ops/op_act.h"  // op_grad_norm: the norm's fold that begins the step
#include "runtime/ops/op_core.h"
#include "runtime/ops/op_moe.h"  // op_moe_uniform_group: a stacked weight's members
#include "runtime/ops/op_optim.h"
#include "tests/rig.h"
#include "tests/test.h"

static const double t_u = 0x1p-24;  // FP32 unit roundoff

// ---------------------------------------------------------------------------------------------
// Bias correction (TE's float(1.0 - pow(double(float beta), step))).

static void test_bias_correction(void) {
    test_begin("optim_bias_correction_matches_numerics");
    static const float betas[] = {0.9f, 0.999f, 0.95f, 0.98f, 0.5f, 0.99f, 0.9999f, 0.8f};
    static const uint64_t big[] = {100000,     1000000,           10000000,
                                   2147483648, 4294967303ull,     1000000000000ull,
                                   65535,      0xFFFFFFFFFFFFull, 123456789ull};
    uint64_t checked = 0;
    for (size_t b = 0; b < sizeof betas / sizeof betas[0]; b++) {
        for (uint64_t s = 1; s <= 30000 + sizeof big / sizeof big[0]; s++) {
            uint64_t step = s <= 30000 ? s : big[s - 30001];
            float got = qt_optim_bias_correction(betas[b], step);
            float want = (float)(1.0 - pow((double)betas[b], (double)step));
            CHECK(qt_f32_bits(got) == qt_f32_bits(want),
                  "beta %.9g step %llu: %.9g (%08x), pow gives %.9g (%08x)", betas[b],
                  (unsigned long long)step, got, qt_f32_bits(got), want, qt_f32_bits(want));
            checked++;
        }
    }
    // Hand values: step 1 gives exactly 1 - beta (Sterbenz), step 0 gives 0.
    CHECK(qt_optim_bias_correction(0.9f, 1) == 1.0f - 0.9f, "bc1(1) = %.9g",
          qt_optim_bias_correction(0.9f, 1));
    CHECK(qt_optim_bias_correction(0.999f, 0) == 0.0f, "bc(0) not 0");
    CHECK(checked > 200000, "only %llu checked", (unsigned long long)checked);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Learning-rate rules.

static const optim_lr_row t_lr_table[] = {
    {0, 10, QT_OPTIM_LR_LINEAR, 0.0f, 1e-3f, 0},      // warm-up 0 -> 1e-3 over steps 0..9
    {10, 100, QT_OPTIM_LR_COSINE, 1e-3f, 1e-5f, 0},  // cosine 1e-3 -> 1e-5 over 10..109
    {110, 50, QT_OPTIM_LR_CONSTANT, 5e-4f, 0.0f, 0}, // constant over 110..159
    {160, 4, QT_OPTIM_LR_LINEAR, 5e-4f, 1e-4f, 0},   // linear 5e-4 -> 1e-4, held after 164
};
#define T_LR_ROWS 4u

// The rules in double, from the definition in optim.h.
static double t_lr_double(uint64_t t) {
    uint32_t r = 0;
    for (uint32_t i = 1; i < T_LR_ROWS; i++) {
        if (t_lr_table[i].start <= t) r = i;
    }
    const optim_lr_row *row = &t_lr_table[r];
    double d = (double)(t - row->start);
    if (d > (double)row->steps) d = (double)row->steps;
    double f = d / (double)row->steps, a = row->a, b = row->b;
    if (row->rule == QT_OPTIM_LR_CONSTANT) return a;
    if (row->rule == QT_OPTIM_LR_LINEAR) return a + (b - a) * f;
    return a + (b - a) * 0.5 * (1.0 - cos(M_PI * f));
}

// The binary search picks the row a scan picks: the last row i >= 1 with start <= t, else row 0,
// over tables of 1 to 300 rows (starts strictly rising, as the schedule's, or with ties) and
// steps around every start.
static void test_lr_row_search(void) {
    test_begin("optim_lr_row_search_equals_a_scan");
    static optim_lr_row rows[300];
    uint64_t state = 12345;
    uint32_t mismatches = 0, probes = 0;
    for (uint32_t count = 1; count <= 300; count += count < 20 ? 1 : 37) {
        uint64_t start = (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 60;
        for (uint32_t i = 0; i < count; i++) {
            rows[i].start = start;
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            start += (state >> 61) + (i % 7 ? 1 : 0);  // steps of 1 to 8, a tie now and then
        }
        for (uint64_t t = 0; t <= start + 2; t++) {
            uint32_t scan = 0;
            for (uint32_t i = 1; i < count; i++) {
                if (rows[i].start <= t) scan = i;
            }
            mismatches += qt_optim_lr_row_of(rows, count, t) != scan;
            probes++;
        }
    }
    CHECK(mismatches == 0, "%u of %u probes picked another row", mismatches, probes);
    test_end();
}

static void test_lr_rules(void) {
    test_begin("optim_lr_rules_row_boundaries");
    // Exact values at row starts (the weight of b is exactly 0 there) and inside constant rows.
    static const struct {
        uint64_t t;
        float lr;
    } exact[] = {{0, 0.0f},     {10, 1e-3f},  {110, 5e-4f}, {135, 5e-4f},
                 {159, 5e-4f},  {160, 5e-4f}, {5, 5e-4f},   {162, 3e-4f}};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        float lr = qt_optim_lr_at(t_lr_table, T_LR_ROWS, exact[i].t);
        CHECK(lr == exact[i].lr, "t %llu: lr %.9g, expected %.9g", (unsigned long long)exact[i].t,
              lr, exact[i].lr);
    }
    // Everywhere else within the rounding of a + (b - a) w: (b - a), the product and the sum
    // each round once (3u max(|a|, |b|)), w = f = d / steps rounds once and cospi is within
    // 1.02 ulp, 1 - c and 0.5 x add 1u more: below 8u max(|a|, |b|) in all.
    for (uint64_t t = 0; t < 400; t++) {
        float lr = qt_optim_lr_at(t_lr_table, T_LR_ROWS, t);
        double want = t_lr_double(t);
        uint32_t r = t < 10 ? 0 : t < 110 ? 1 : t < 160 ? 2 : 3;
        double scale = fmax(fabs(t_lr_table[r].a), fabs(t_lr_table[r].b));
        CHECK(fabs(lr - want) <= 8 * t_u * scale, "t %llu: lr %.9g, double rule %.12g",
              (unsigned long long)t, lr, want);
    }
    // Past the last row the end value holds; the last step of a row is below its end.
    float end = qt_optim_lr_at(t_lr_table, T_LR_ROWS, 164);
    CHECK(end == qt_optim_lr_at(t_lr_table, T_LR_ROWS, 1000000), "end value not held");
    CHECK(fabsf(end - 1e-4f) <= 2e-11f, "end value %.9g", end);
    CHECK(qt_optim_lr_at(t_lr_table, T_LR_ROWS, 9) < 1e-3f, "warm-up reaches b early");
    CHECK(qt_optim_lr_at(t_lr_table, T_LR_ROWS, 109) > 1e-5f, "cosine reaches b early");
    // One row: a start after t uses row 0's start value.
    optim_lr_row late = {50, 10, QT_OPTIM_LR_LINEAR, 2e-3f, 1e-3f, 0};
    CHECK(qt_optim_lr_at(&late, 1, 3) == 2e-3f, "before the first row");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The begin kernel on the reference backend.

typedef struct t_begin_rig {
    rig r;
    arena_handle steps, state, norm, rows;
    program with_norm, without_norm;
} t_begin_rig;

static void t_begin_open(t_begin_rig *b) {
    const char *why = NULL;
    rig_open(&b->r, BACKEND_REF, &why);
    b->steps = rig_reserve(&b->r, "steps", 8);
    b->state = rig_reserve(&b->r, "state", sizeof(optim_state));
    b->norm = rig_reserve(&b->r, "norm", sizeof(optim_grad_norm));
    b->rows = rig_reserve(&b->r, "lr_rows", sizeof t_lr_table);
    rig_prog_init(&b->with_norm, "with_norm");
    rig_prog_init(&b->without_norm, "without_norm");
    RIG_OK(op_optim_begin(&b->with_norm, "begin", rig_ref(&b->r, b->steps, 0),
                          rig_ref(&b->r, b->state, 0), rig_ref(&b->r, b->norm, 0),
                          rig_ref(&b->r, b->rows, 0), T_LR_ROWS, NULL));
    RIG_OK(op_optim_begin(&b->without_norm, "begin", rig_ref(&b->r, b->steps, 0),
                          rig_ref(&b->r, b->state, 0), (prog_ref){0},
                          rig_ref(&b->r, b->rows, 0), T_LR_ROWS, NULL));
    rig_bind(&b->r);
    prog_resolve(&b->with_norm);
    prog_resolve(&b->without_norm);
    RIG_OK(backend_write(&b->r.be, rig_ref(&b->r, b->rows, 0), t_lr_table, sizeof t_lr_table));
}

// Runs begin after `step` counted steps; the counter after it must be the state's step.
static optim_state t_begin_run(t_begin_rig *b, uint64_t step, const optim_grad_norm *norm) {
    optim_state s = {~0ull, -1.0f, 7, -1.0f, 5};  // stale values: begin writes every field
    RIG_OK(backend_write(&b->r.be, rig_ref(&b->r, b->steps, 0), &step, 8));
    RIG_OK(backend_write(&b->r.be, rig_ref(&b->r, b->state, 0), &s, sizeof s));
    if (norm) RIG_OK(backend_write(&b->r.be, rig_ref(&b->r, b->norm, 0), norm, sizeof *norm));
    RIG_OK(backend_run(&b->r.be, norm ? &b->with_norm : &b->without_norm));
    RIG_OK(backend_read(&b->r.be, &s, rig_ref(&b->r, b->state, 0), sizeof s));
    uint64_t steps = 0;
    RIG_OK(backend_read(&b->r.be, &steps, rig_ref(&b->r, b->steps, 0), 8));
    CHECK(steps == s.step && s.reserved == 0, "counter %llu, state step %llu",
          (unsigned long long)steps, (unsigned long long)s.step);
    return s;
}

static void test_begin_rules(void) {
    test_begin("optim_begin_step_skip_clip_lr");
    static t_begin_rig b;  // large: static, not on the stack
    t_begin_open(&b);
    static const uint64_t steps[] = {0, 5, 9, 10, 11, 109, 110, 159, 160, 163, 164, 5000};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        optim_grad_norm norm = {3.0f, 0.5f, 0, 0};
        optim_state s = t_begin_run(&b, steps[i], &norm);
        float lr = qt_optim_lr_at(t_lr_table, T_LR_ROWS, steps[i]);
        CHECK(s.step == steps[i] + 1 && s.skip == 0, "step %llu -> %llu skip %u",
              (unsigned long long)steps[i], (unsigned long long)s.step, s.skip);
        CHECK(qt_f32_bits(s.lr) == qt_f32_bits(lr), "step %llu: lr %.9g, expected %.9g",
              (unsigned long long)steps[i], s.lr, lr);
        CHECK(s.clip == 0.5f, "clip %.9g", s.clip);
    }
    static const struct {
        float clip;
        uint32_t nonfinite, skip;
    } rules[] = {{1.0f, 1, 1},      {0.25f, 7, 1},     {NAN, 0, 1},  {INFINITY, 0, 1},
                 {-INFINITY, 0, 1}, {0.0f, 0, 0},      {1e-30f, 0, 0}, {1.0f, 0, 0}};
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        optim_grad_norm norm = {1.0f, rules[i].clip, rules[i].nonfinite, 0};
        optim_state s = t_begin_run(&b, 42, &norm);
        CHECK(s.skip == rules[i].skip, "clip %g nonfinite %u: skip %u", rules[i].clip,
              rules[i].nonfinite, s.skip);
        CHECK(s.step == (rules[i].skip ? 42u : 43u), "clip %g nonfinite %u: step %llu",
              rules[i].clip, rules[i].nonfinite, (unsigned long long)s.step);
        CHECK(qt_f32_bits(s.lr) == qt_f32_bits(qt_optim_lr_at(t_lr_table, T_LR_ROWS, 42)),
              "lr of a skipped step");
    }
    optim_state s = t_begin_run(&b, 0, NULL);
    CHECK(s.step == 1 && s.skip == 0 && s.clip == 1.0f, "no norm: step %llu skip %u clip %g",
          (unsigned long long)s.step, s.skip, s.clip);
    rig_close(&b.r);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The begin's zeroing of the updates' amax workspaces (op_optim_zeroes), by op_optim_begin and
// by the norm's fold that does its work (op_grad_norm with a begin).

#define T_ZERO_ENTRIES 3u
#define T_ZERO_TARGETS 5u
#define T_ZERO_WORDS 3u
#define T_ZERO_FILL 0xA5A5A5A5u

// A table of three entries (written after the bind, their addresses the targets'): entry 0
// zeroes targets 0 and 1 (amax0, amax1); entry 1 has no AMAX_ON_SKIP flag and an update target
// `kept`, which stays, and its cast's amax arrays are targets 2 and 3 (T_ZERO_WORDS words
// each); entry 2 zeroes target 4. Both programs begin the same step from the same norm; every
// target is filled before each, and the state each writes is the one without zeroes.
static void t_begin_zeroes_case(rig *r) {
    arena_handle steps = rig_reserve(r, "steps", 8);
    arena_handle state = rig_reserve(r, "state", sizeof(optim_state));
    arena_handle norm = rig_reserve(r, "norm", sizeof(optim_grad_norm));
    arena_handle rows = rig_reserve(r, "lr_rows", sizeof t_lr_table);
    arena_handle table = rig_reserve(r, "table", op_optim_table_bytes(T_ZERO_ENTRIES));
    arena_handle grad = rig_reserve(r, "grad", 4 * 3);
    arena_handle ws = rig_reserve(r, "gnorm_ws", op_grad_norm_workspace_bytes(1, &(uint64_t){3}));
    arena_handle ticket = rig_reserve(r, "ticket", 4);
    arena_handle kept = rig_reserve(r, "kept", 4);
    arena_handle targets[T_ZERO_TARGETS];
    static op_optim_zeroes z;
    z = (op_optim_zeroes){rig_ref(r, table, 0), T_ZERO_ENTRIES, T_ZERO_TARGETS, {{0}}, {0}};
    for (uint32_t t = 0; t < T_ZERO_TARGETS; t++) {
        char name[16];
        snprintf(name, sizeof name, "target%u", t);
        z.target_bytes[t] = t == 2 || t == 3 ? 4 * T_ZERO_WORDS : 4;
        targets[t] = rig_reserve(r, name, z.target_bytes[t]);
        z.targets[t] = rig_ref(r, targets[t], 0);
    }
    program *begin = &r->prog;
    static program fold;
    rig_prog_init(&fold, "fold");
    RIG_OK(op_optim_begin(begin, "begin", rig_ref(r, steps, 0), rig_ref(r, state, 0),
                          rig_ref(r, norm, 0), rig_ref(r, rows, 0), T_LR_ROWS, &z));
    op_gnorm_begin gb = {rig_ref(r, steps, 0), rig_ref(r, state, 0), rig_ref(r, rows, 0),
                         T_LR_ROWS, &z};
    prog_ref grads[1] = {rig_ref(r, grad, 0)};
    RIG_OK(op_grad_norm(&fold, "grad_norm", 1, grads, &(uint64_t){3}, 1.0f, rig_ref(r, ws, 0),
                        rig_ref(r, ticket, 0), rig_ref(r, norm, 0), &gb));
    rig_bind(r);
    prog_resolve(&fold);
    static optim_multi_entry entries[T_ZERO_ENTRIES];
    memset(entries, 0, sizeof entries);
    entries[0].args.flags = QT_OPTIM_FLAG_AMAX_ON_SKIP;
    entries[0].args.amax0 = arena_address(&r->dev, targets[0]);
    entries[0].args.amax1 = arena_address(&r->dev, targets[1]);
    entries[1].args.amax0 = arena_address(&r->dev, kept);
    entries[1].cast_amax[0] = arena_address(&r->dev, targets[2]);
    entries[1].cast_amax[1] = arena_address(&r->dev, targets[3]);
    entries[1].cast_amax_words = T_ZERO_WORDS;
    entries[2].args.flags = QT_OPTIM_FLAG_AMAX_ON_SKIP;
    entries[2].args.amax0 = arena_address(&r->dev, targets[4]);
    RIG_OK(backend_write(&r->be, rig_ref(r, table, 0), entries, sizeof entries));
    RIG_OK(backend_write(&r->be, rig_ref(r, rows, 0), t_lr_table, sizeof t_lr_table));
    const float g[3] = {3.0f, 4.0f, 0.0f};  // norm 5, clip 1
    RIG_OK(backend_write(&r->be, rig_ref(r, grad, 0), g, sizeof g));
    program *programs[2] = {begin, &fold};
    for (int k = 0; k < 2; k++) {
        uint32_t fill = T_ZERO_FILL, zero = 0;
        uint64_t step = 9;
        optim_grad_norm n = {5.0f, 1.0f / (5.0f + 1e-6f), 0, 0};
        RIG_OK(backend_write(&r->be, rig_ref(r, steps, 0), &step, 8));
        RIG_OK(backend_write(&r->be, rig_ref(r, norm, 0), &n, sizeof n));
        RIG_OK(backend_write(&r->be, rig_ref(r, ticket, 0), &zero, 4));
        RIG_OK(backend_write(&r->be, rig_ref(r, kept, 0), &fill, 4));
        const uint32_t fills[T_ZERO_WORDS] = {fill, fill, fill};
        for (uint32_t t = 0; t < T_ZERO_TARGETS; t++) {
            RIG_OK(backend_write(&r->be, rig_ref(r, targets[t], 0), fills, z.target_bytes[t]));
        }
        RIG_OK(backend_run(&r->be, programs[k]));
        const char *what = k == 0 ? "op_optim_begin" : "the norm's fold";
        for (uint32_t t = 0; t < T_ZERO_TARGETS; t++) {
            uint32_t v[T_ZERO_WORDS] = {1, 1, 1};
            RIG_OK(backend_read(&r->be, v, rig_ref(r, targets[t], 0), z.target_bytes[t]));
            for (uint32_t w = 0; w < z.target_bytes[t] / 4; w++) {
                CHECK(v[w] == 0, "%s, %s: target %u word %u is %08x", r->be.info.name, what, t,
                      w, v[w]);
            }
        }
        uint32_t v = 0;
        RIG_OK(backend_read(&r->be, &v, rig_ref(r, kept, 0), 4));
        CHECK(v == T_ZERO_FILL, "%s, %s: an entry without the flag lost its amax: %08x",
              r->be.info.name, what, v);
        optim_state s;
        RIG_OK(backend_read(&r->be, &s, rig_ref(r, state, 0), sizeof s));
        float lr = qt_optim_lr_at(t_lr_table, T_LR_ROWS, 9);
        CHECK(s.step == 10 && s.skip == 0 && qt_f32_bits(s.lr) == qt_f32_bits(lr) &&
                  qt_f32_bits(s.clip) == qt_f32_bits(n.clip_factor),
              "%s, %s: state step %llu skip %u lr %.9g clip %.9g", r->be.info.name, what,
              (unsigned long long)s.step, s.skip, s.lr, s.clip);
    }
    rig_table_drop(&fold);
    rig_close(r);
}

// The begin takes at most OP_OPTIM_ZEROES_MAX targets (one op's regions); a list of more keeps
// its launches' own zeroing. Parameters without a target (FP32, delayed scaling) count as
// entries only.
static void t_zeroes_limit(void) {
    static arena a;
    rig_arena_init(&a, ARENA_KIND_DEVICE, "device");
    arena_handle h;
    RIG_OK(arena_reserve(&a, "amax", 4, 256, ARENA_CAT_WORKSPACE, ARENA_LIFETIME_PERSISTENT, 0,
                         &h));
    static optim_param_desc list[OP_OPTIM_ZEROES_MAX + 2];
    for (uint32_t i = 0; i < OP_OPTIM_ZEROES_MAX + 2; i++) {
        optim_param_desc *d = &list[i];
        memset(d, 0, sizeof *d);
        d->name = "p";
        d->rows = d->cols = 1;
        d->grad_dtype = QT_DTYPE_F32;
        d->weight = i == 0 ? OPTIM_WEIGHT_NONE : OPTIM_WEIGHT_FP8_CURRENT;
        d->fp8_amax = (prog_ref){&a, h, 0};
    }
    static op_optim_zeroes z;
    prog_ref table = {&a, h, 0};
    CHECK(!op_optim_zeroes_of(list, 1, table, &z), "a list without targets has no zeroes");
    CHECK(op_optim_zeroes_of(list, OP_OPTIM_ZEROES_MAX + 1, table, &z) &&
              z.count == OP_OPTIM_ZEROES_MAX + 1 && z.target_count == OP_OPTIM_ZEROES_MAX,
          "%u targets of %u entries", z.target_count, z.count);
    CHECK(!op_optim_zeroes_of(list, OP_OPTIM_ZEROES_MAX + 2, table, &z),
          "%u targets fit the begin", OP_OPTIM_ZEROES_MAX + 1);
    rig_table_drop(&a);
}

static void test_begin_zeroes(void) {
    static rig r;
    const char *why = NULL;
    test_begin("optim_begin_and_norm_fold_zero_amax_targets");
    rig_open(&r, BACKEND_REF, &why);
    t_begin_zeroes_case(&r);
    t_zeroes_limit();
    test_end();
    if (!rig_open(&r, BACKEND_GPU, &why)) {
        test_skip("gpu_optim_begin_and_norm_fold_zero_amax_targets", why);
        return;
    }
    test_begin("gpu_optim_begin_and_norm_fold_zero_amax_targets");
    t_begin_zeroes_case(&r);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// A parameter on a rig: every region, the start-up program (fills, then the weight's
// quantization from the master) and the step program (begin, update + requantization, then the
// family's own quantization of a copy of the new master into separate check regions).

typedef struct t_case {
    const char *name;
    optim_weight weight;
    uint32_t rows, cols;
    uint32_t grad_dtype;
    uint32_t elem;   // QT_FP8_E4M3 | QT_FP8_E5M2 for the FP8 and MXFP8 formats
    bool two_d;      // MXFP8 32x32, block 128x128, NVFP4 16x16
    bool pow2;       // FP8 current scaling
    bool rht, sr;    // NVFP4
    bool plant;      // GPU: edge values in the gradients of step 2
    uint64_t seed;
    uint32_t members;  // a stacked weight of this many members of rows / members rows; 0: one
    bool row_only;     // MXFP8: the rowwise copy alone (which the update writes itself)
} t_case;

enum {
    R_STEPS, R_STATE, R_NORM, R_LR, R_GRAD, R_MASTER, R_M, R_V, R_WROW, R_WROWS, R_WCOL, R_WCOLS,
    R_SCALE, R_SINV, R_AMAX, R_AMAXC, R_EXTRA, R_GROUP_OFFSETS, R_GROUP_DIMS,
    R_COPY, R_CROW, R_CROWS, R_CCOL, R_CCOLS, R_CSCALE, R_CSINV, R_CAMAX, R_CAMAXC, R_CHIST0,
    R_TABLE, R_COUNT
};
#define T_COMPARE_END R_TABLE  // the multi-tensor table holds each rig's own addresses
#define T_STATE_END R_COPY  // regions below are state and inputs; the rest are check outputs
#define T_HISTORY_LEN 4u

static const char *const t_region_names[R_COUNT] = {
    "steps", "state", "grad_norm", "lr_rows", "grad", "master", "m", "v", "rowwise",
    "rowwise_scales", "colwise", "colwise_scales", "scale", "scale_inv", "amax", "amax_col",
    "extra_params", "group_offsets", "group_dims", "master_copy", "check_rowwise",
    "check_rowwise_scales", "check_colwise", "check_colwise_scales", "check_scale",
    "check_scale_inv", "check_amax", "check_amax_col", "check_history0", "optim_table"};

// How a run's step updates its parameters: the case's parameter alone by op_optim_adamw, or
// with T_EXTRAS small FP32 parameters around it (half before, half after, so that the case's
// entry is neither the first nor the last of a launch, and so many that their regions need two
// launches), by op_optim_adamw_list or by the multi-tensor op_optim_adamw_multi.
// T_LIST_PIPELINED: the multi-tensor launches of T_LIST_PIPELINED_PER_LAUNCH parameters each,
// each launch's casts right after it (as a data-parallel step builds them). The multi-tensor
// lists have their amax workspaces zeroed by the begin (op_optim_zeroes), as a model's step
// has them, except T_LIST_OWN_ZEROES: the launches' own zeroing, as a list of more targets than
// the begin takes has it.
typedef enum t_list {
    T_LIST_ONE,
    T_LIST_EACH,
    T_LIST_MULTI,
    T_LIST_PIPELINED,
    T_LIST_OWN_ZEROES
} t_list;
#define T_LIST_PIPELINED_PER_LAUNCH 2u
#define T_EXTRAS 20u

static uint32_t t_extra_rows(uint32_t k) { return 1 + (k * 7) % 40; }
static uint32_t t_extra_cols(uint32_t k) { return 1 + (k * 13 + 5) % 150; }

typedef struct t_run {
    rig r;
    const t_case *c;
    t_list list;
    program prep;
    arena_handle h[R_COUNT];
    uint64_t bytes[R_COUNT];
    uint32_t step_count;  // steps run so far (skipped ones included)
} t_run;

// Runs are large (a rig holds its arenas): two static slots instead of the stack.
static t_run t_slots[2];

static prog_ref t_ref(t_run *run, int region) { return rig_ref(&run->r, run->h[region], 0); }

static uint64_t t_elems(const t_case *c) { return (uint64_t)c->rows * c->cols; }

static void t_sizes(t_run *run) {
    const t_case *c = run->c;
    uint64_t elems = t_elems(c);
    // Generous upper bounds of every format's codes and scales (the builders assert the fit).
    uint64_t codes = elems * 2 + 64;
    uint64_t scales = 4ull * (c->rows + 32) * (c->cols + 32) / 16 + 256;
    uint64_t *b = run->bytes;
    b[R_STEPS] = 8;
    b[R_STATE] = sizeof(optim_state);
    b[R_NORM] = sizeof(optim_grad_norm);
    b[R_LR] = sizeof(optim_lr_row) * 2;
    b[R_GRAD] = elems * (c->grad_dtype == QT_DTYPE_BF16 ? 2 : 4);
    b[R_MASTER] = b[R_M] = b[R_V] = b[R_COPY] = elems * 4;
    b[R_WROW] = b[R_WCOL] = b[R_CROW] = b[R_CCOL] = codes;
    b[R_WROWS] = b[R_WCOLS] = b[R_CROWS] = b[R_CCOLS] = scales;
    // A word per member of a stacked weight.
    uint32_t words = c->members ? c->members : 1u;
    b[R_SCALE] = b[R_SINV] = b[R_AMAXC] = b[R_CSCALE] = b[R_CSINV] = b[R_CAMAX] = 4ull * words;
    b[R_CAMAXC] = 4ull * words;
    b[R_CHIST0] = 4;
    // Delayed scaling: the history [L][1], row 0 first.
    b[R_AMAX] = 4ull * (words > T_HISTORY_LEN ? words : T_HISTORY_LEN);
    b[R_GROUP_OFFSETS] = 4ull * (words + 1);
    b[R_GROUP_DIMS] = 4ull * words;
    b[R_EXTRA] = 0;
    for (uint32_t k = 0; k < T_EXTRAS; k++) b[R_EXTRA] += 16ull * t_extra_rows(k) * t_extra_cols(k);
    b[R_TABLE] = op_optim_table_bytes(T_EXTRAS + 1);
}

static uint32_t t_elem_size(const t_case *c, int region) {
    switch (region) {
    case R_GRAD: return c->grad_dtype == QT_DTYPE_BF16 ? 2 : 4;
    case R_WROW: case R_CROW: return c->weight == OPTIM_WEIGHT_BF16 ? 2 : 1;
    case R_WCOL: case R_CCOL: case R_WROWS: case R_WCOLS: case R_CROWS: case R_CCOLS:
        return c->weight == OPTIM_WEIGHT_FP8_BLOCK ? 4 : 1;
    default: return 4;
    }
}

// The parameter's description over the main regions, or (check) over the check regions.
static optim_param_desc t_desc(t_run *run, bool check) {
    const t_case *c = run->c;
    optim_param_desc d;
    memset(&d, 0, sizeof d);
    d.name = c->name;
    d.rows = c->rows;
    d.cols = c->cols;
    d.grad = t_ref(run, R_GRAD);
    d.grad_dtype = c->grad_dtype;
    d.master = t_ref(run, check ? R_COPY : R_MASTER);
    d.m = t_ref(run, R_M);
    d.v = t_ref(run, R_V);
    d.hp = optim_hparams_default();
    d.hp.weight_decay = 0.01f;
    d.weight = c->weight;
    prog_ref row = t_ref(run, check ? R_CROW : R_WROW);
    prog_ref rows = t_ref(run, check ? R_CROWS : R_WROWS);
    prog_ref col = t_ref(run, check ? R_CCOL : R_WCOL);
    prog_ref cols = t_ref(run, check ? R_CCOLS : R_WCOLS);
    prog_ref amax = t_ref(run, check ? R_CAMAX : R_AMAX);
    prog_ref amax_col = t_ref(run, check ? R_CAMAXC : R_AMAXC);
    d.bf16 = row;
    d.fp8 = (op_fp8_output){c->elem, row, col, t_ref(run, check ? R_CSINV : R_SINV)};
    d.fp8_scale = t_ref(run, check && c->weight == OPTIM_WEIGHT_FP8_CURRENT ? R_CSCALE : R_SCALE);
    d.fp8_amax = amax;
    d.fp8_pow2 = c->pow2;
    d.mxfp8.elem = c->elem == QT_FP8_E5M2 ? QT_ELEM_E5M2 : QT_ELEM_E4M3;
    d.mxfp8.tile_2d = c->two_d;
    d.mxfp8.rowwise = (op_mxfp8_dir){row, rows};
    if (!c->row_only) d.mxfp8.colwise = (op_mxfp8_dir){col, cols};
    d.block = (op_block_tensor){c->rows, c->cols, c->two_d, c->elem, true, true, row, rows, col,
                                cols, {0}};
    d.nvfp4 = (op_nvfp4_quant){true, true, c->rht, QT_NVFP4_RHT_SIGNS_TE, c->two_d, c->sr,
                               false, false, c->seed * 31 + 5, 7, t_ref(run, R_STEPS), amax,
                               amax_col, row, rows, col, cols};
    if (c->members) {
        d.group = (op_group){c->members, t_ref(run, R_GROUP_OFFSETS), t_ref(run, R_GROUP_DIMS)};
    }
    return d;
}

// Extra parameter k: FP32 grad, master, m, v one after the other in the extra region (4-byte
// aligned only, so the kernels' unaligned paths run too), with hyper-parameters of its own.
static optim_param_desc t_extra_desc(t_run *run, uint32_t k) {
    uint64_t offset = 0;
    for (uint32_t j = 0; j < k; j++) offset += 16ull * t_extra_rows(j) * t_extra_cols(j);
    uint64_t bytes = 4ull * t_extra_rows(k) * t_extra_cols(k);
    prog_ref at = t_ref(run, R_EXTRA);
    optim_param_desc d;
    memset(&d, 0, sizeof d);
    d.name = "extra";
    d.rows = t_extra_rows(k);
    d.cols = t_extra_cols(k);
    d.grad_dtype = QT_DTYPE_F32;
    at.offset = offset;
    d.grad = at;
    at.offset += bytes;
    d.master = at;
    at.offset += bytes;
    d.m = at;
    at.offset += bytes;
    d.v = at;
    d.hp = optim_hparams_default();
    d.hp.weight_decay = k % 2 ? 0.01f : 0.0f;
    d.hp.lr_scale = k % 3 ? 1.0f : 0.5f;
    d.hp.bias_correction = k % 4 != 1;
    d.weight = OPTIM_WEIGHT_NONE;
    return d;
}

// The format family's own quantization of the master copy into the check regions.
static qt_status t_family_ops(t_run *run, program *p) {
    const t_case *c = run->c;
    optim_param_desc d = t_desc(run, true);
    op_fp8_input fp8_in = {d.master, QT_DTYPE_F32, c->rows, c->cols, d.group};
    switch (c->weight) {
    case OPTIM_WEIGHT_NONE:
    case OPTIM_WEIGHT_BF16:
        return QT_OK;  // checked on the host
    case OPTIM_WEIGHT_FP8_DELAYED:
        // History row 0 right after the update, before the scaling update rolls it.
        QT_TRY(op_copy(p, "history0", t_ref(run, R_CHIST0), t_ref(run, R_AMAX), 4));
        QT_TRY(op_fp8_amax(p, "check_amax", &fp8_in, d.fp8_amax));
        return op_fp8_cast_delayed(p, "check_cast", &fp8_in, &d.fp8, d.fp8_scale, OP_FP8_NONE);
    case OPTIM_WEIGHT_FP8_CURRENT:
        return op_fp8_quantize_current(p, "check_cast", &fp8_in, &d.fp8, d.fp8_amax,
                                       d.fp8_scale, c->pow2, 0.0f);
    case OPTIM_WEIGHT_MXFP8:
        d.mxfp8.in = d.master;
        d.mxfp8.dtype = QT_DTYPE_F32;
        d.mxfp8.rows = c->rows;
        d.mxfp8.cols = c->cols;
        return op_mxfp8_quantize(p, "check_cast", &d.mxfp8);
    case OPTIM_WEIGHT_FP8_BLOCK:
        return op_quant_block(p, "check_cast", d.master, QT_DTYPE_F32, &d.block, NULL);
    case OPTIM_WEIGHT_NVFP4: {
        op_nvfp4_input in = {d.master, QT_DTYPE_F32, c->rows, c->cols, d.group};
        op_nvfp4_amax_out out = {d.nvfp4.amax_row, d.nvfp4.amax_col, c->rht,
                                 QT_NVFP4_RHT_SIGNS_TE};
        QT_TRY(op_nvfp4_amax(p, "check_amax", &in, &out));
        return op_nvfp4_quantize(p, "check_cast", &in, &d.nvfp4);
    }
    }
    return QT_OK;
}

static qt_status t_build(t_run *run) {
    const t_case *c = run->c;
    rig *r = &run->r;
    uint64_t elems = t_elems(c);
    optim_param_desc d = t_desc(run, false);
    if (c->members) {
        QT_TRY(op_moe_uniform_group(&run->prep, "members", &d.group, c->rows / c->members));
    }
    // Start-up: moments and master, then the weight as the cast of the master.
    QT_TRY(op_fill_random(&run->prep, "master", d.master, elems, QT_DTYPE_F32, QT_FILL_NORMAL,
                          c->seed, 0, 0.0f, 1.0f));
    QT_TRY(op_fill_random(&run->prep, "m", d.m, elems, QT_DTYPE_F32, QT_FILL_NORMAL, c->seed,
                          elems, 0.0f, 0.01f));
    QT_TRY(op_fill_random(&run->prep, "v", d.v, elems, QT_DTYPE_F32, QT_FILL_UNIFORM, c->seed,
                          2 * elems, 0.0f, 1e-3f));
    QT_TRY(op_optim_quantize(&run->prep, &d));
    // Positive values throughout: the extra parameters' v must not be negative.
    QT_TRY(op_fill_random(&run->prep, "extra", t_ref(run, R_EXTRA), run->bytes[R_EXTRA] / 4,
                          QT_DTYPE_F32, QT_FILL_UNIFORM, c->seed, 3 * elems, 0.0f, 1e-3f));
    static optim_param_desc list[T_EXTRAS + 1];  // read while the ops are built only
    for (uint32_t k = 0; k <= T_EXTRAS; k++) {
        uint32_t half = T_EXTRAS / 2;
        list[k] = k == half ? d : t_extra_desc(run, k < half ? k : k - 1);
    }
    uint32_t per_launch = run->list == T_LIST_PIPELINED ? T_LIST_PIPELINED_PER_LAUNCH : 0;
    bool multi = run->list >= T_LIST_MULTI;
    if (multi) {
        QT_TRY(op_optim_describe(&run->prep, list, T_EXTRAS + 1, t_ref(run, R_TABLE),
                                 per_launch));
    }
    static op_optim_zeroes zeroes;
    const op_optim_zeroes *zeroed = NULL;
    if (multi && run->list != T_LIST_OWN_ZEROES &&
        op_optim_zeroes_of(list, T_EXTRAS + 1, t_ref(run, R_TABLE), &zeroes)) {
        zeroed = &zeroes;
    }
    // The step.
    prog_ref state = t_ref(run, R_STATE);
    QT_TRY(op_optim_begin(&r->prog, "begin", t_ref(run, R_STEPS), state, t_ref(run, R_NORM),
                          t_ref(run, R_LR), 2, zeroed));
    if (run->list == T_LIST_ONE) {
        QT_TRY(op_optim_adamw(&r->prog, &d, state));
    } else if (run->list == T_LIST_EACH) {
        QT_TRY(op_optim_adamw_list(&r->prog, list, T_EXTRAS + 1, state));
    } else {
        QT_TRY(op_optim_adamw_multi(&r->prog, "multi", list, T_EXTRAS + 1, state,
                                    t_ref(run, R_TABLE), per_launch, (prog_ref){0}, zeroed));
    }
    QT_TRY(op_copy(&r->prog, "master_copy", t_ref(run, R_COPY), t_ref(run, R_MASTER),
                   elems * 4));
    QT_TRY(t_family_ops(run, &r->prog));
    if (c->weight == OPTIM_WEIGHT_FP8_DELAYED) {
        QT_TRY(op_fp8_delayed_update(&r->prog, "scaling_update", t_ref(run, R_AMAX),
                                     t_ref(run, R_SCALE), OP_FP8_NONE, 1, T_HISTORY_LEN,
                                     QT_FP8_AMAX_ALGO_MAX, c->elem, 0));
    }
    return QT_OK;
}

// Warm-up 1e-3 -> 1e-2 over 3 steps, then cosine down to 1e-3 over 20.
static const optim_lr_row t_run_lr[2] = {
    {0, 3, QT_OPTIM_LR_LINEAR, 1e-3f, 1e-2f, 0},
    {3, 20, QT_OPTIM_LR_COSINE, 1e-2f, 1e-3f, 0},
};

static bool t_run_open_list(t_run *run, backend_kind kind, const t_case *c, t_list list,
                            const char **why) {
    memset(run, 0, sizeof *run);
    if (!rig_open(&run->r, kind, why)) return false;
    run->c = c;
    run->list = list;
    t_sizes(run);
    for (int i = 0; i < R_COUNT; i++) {
        run->h[i] = rig_reserve(&run->r, t_region_names[i], run->bytes[i]);
    }
    rig_prog_init(&run->prep, "prepare");
    RIG_OK(t_build(run));
    rig_bind(&run->r);
    prog_resolve(&run->prep);
    backend *be = &run->r.be;
    RIG_OK(backend_write(be, t_ref(run, R_LR), t_run_lr, sizeof t_run_lr));
    float scale = 112.0f;  // 448 / 4: a few of the N(0, 1) master values saturate
    float history[T_HISTORY_LEN] = {0.5f, 3.0f, 0.0f, 0.0f};
    if (c->weight == OPTIM_WEIGHT_FP8_DELAYED) {
        RIG_OK(backend_write(be, t_ref(run, R_SCALE), &scale, 4));
        RIG_OK(backend_write(be, t_ref(run, R_AMAX), history, sizeof history));
    }
    RIG_OK(backend_run(be, &run->prep));
    RIG_OK(backend_finish(be));
    return true;
}

static bool t_run_open(t_run *run, backend_kind kind, const t_case *c, const char **why) {
    return t_run_open_list(run, kind, c, T_LIST_ONE, why);
}

static void *t_read(t_run *run, int region) {
    void *p = malloc(run->bytes[region]);
    RIG_OK(backend_read(&run->r.be, p, t_ref(run, region), run->bytes[region]));
    return p;
}

// Gradients of step `step`: N(0, 0.1) from Philox (host side, so every rig writes the same),
// with edge values planted at step 2 when the case asks for it.
static void t_write_grads(t_run *run, uint32_t step) {
    const t_case *c = run->c;
    uint64_t elems = t_elems(c);
    float *g = malloc(elems * 4);
    for (uint64_t i = 0; i < elems; i++) {
        g[i] = qt_fill_value(c->seed + 1000, step * elems + i, QT_FILL_NORMAL, 0.0f, 0.1f);
    }
    if (c->plant && step == 2) {
        static const uint32_t edges[] = {0x7FC00000u, 0xFF800000u, 0x7F800000u, 0x7149F2CAu,
                                         0x00000001u, 0x80000000u, 0x00000000u, 0xFFC12345u,
                                         0x5F000000u, 0x20000000u};
        for (uint32_t k = 0; k < 10 && k < elems; k++) {
            g[(k * 7919u + 13u) % elems] = qt_bits_f32(edges[k]);
        }
    }
    if (c->grad_dtype == QT_DTYPE_BF16) {
        uint16_t *h = malloc(elems * 2);
        for (uint64_t i = 0; i < elems; i++) h[i] = qt_f32_to_bf16(g[i]);
        RIG_OK(backend_write(&run->r.be, t_ref(run, R_GRAD), h, elems * 2));
        free(h);
    } else {
        RIG_OK(backend_write(&run->r.be, t_ref(run, R_GRAD), g, elems * 4));
    }
    free(g);
}

static void t_write_norm(t_run *run, float clip, uint32_t nonfinite) {
    optim_grad_norm norm = {1.0f, clip, nonfinite, 0};
    RIG_OK(backend_write(&run->r.be, t_ref(run, R_NORM), &norm, sizeof norm));
}

// One step, eager (or one replay of `graph` when given).
static void t_step(t_run *run, bool skip, const backend_graph *graph) {
    t_write_grads(run, run->step_count);
    t_write_norm(run, run->step_count % 2 ? 0.75f : 1.0f, skip ? 1u : 0u);
    if (graph) {
        RIG_OK(backend_launch(&run->r.be, graph));
    } else {
        RIG_OK(backend_run(&run->r.be, &run->r.prog));
    }
    RIG_OK(backend_finish(&run->r.be));
    run->step_count++;
}

// ---------------------------------------------------------------------------------------------
// The update against double precision.
//
// Bound of one step, from the FP32 state before it (u = 2^-24; first-order terms, then x 1.01
// for the second-order ones). With G = grad * clip exact and M, V, P the exact results:
//   g = RN(grad clip): u|G|.  1 - beta is exact (Sterbenz).
//   m = fma(b1, m, RN((1 - b1) g)): the product carries g's and its own rounding, the fma one:
//       Em = u (|M| + 2 (1 - b1)|G|)                                     (we use 3)
//   v = fma(b2, v, RN(RN((1 - b2) g) g)): four roundings of the product, one of the fma:
//       Ev = u (|V| + 4 (1 - b2) G^2)                                    (we use 5)
//   bc: within u of 1 - beta^step (test above: equal to the correctly rounded double value).
//   m / bc1, v / bc2: the errors above divided by bc, plus 2u relative (bc and the division).
//   sqrt: |sqrt(a) - sqrt(b)| <= min(|a - b| / sqrt(b), sqrt(|a - b|)), plus u of the root.
//   + eps, / denom, fma(wd, p, .), fma(-lr, ., p): one rounding each, propagated as absolute
//   errors: Er = (Emh + |R| Ed) / (D - Ed) + u |R|, Ew = Er + u |W|, Ep = lr Ew + u |P|.

typedef struct t_ref_out {
    double p, m, v, ep, em, ev;
} t_ref_out;

static t_ref_out t_adamw_double(double grad, double clip, double p, double m, double v,
                                const optim_hparams *hp, double lr, uint64_t step) {
    t_ref_out o;
    double b1 = hp->beta1, b2 = hp->beta2, G = grad * clip;
    double bc1 = hp->bias_correction ? 1.0 - pow(b1, (double)step) : 1.0;
    double bc2 = hp->bias_correction ? 1.0 - pow(b2, (double)step) : 1.0;
    o.m = b1 * m + (1 - b1) * G;
    o.v = b2 * v + (1 - b2) * G * G;
    o.em = t_u * (fabs(o.m) + 3 * (1 - b1) * fabs(G));
    o.ev = t_u * (fabs(o.v) + 5 * (1 - b2) * G * G);
    double mh = o.m / bc1, vh = o.v / bc2;
    double emh = o.em / bc1 + 2 * t_u * fabs(mh), evh = o.ev / bc2 + 2 * t_u * vh;
    double s = sqrt(vh);
    double es = (s > 0 ? fmin(evh / s, sqrt(evh)) : sqrt(evh)) + t_u * (s + sqrt(evh));
    double d = s + hp->eps, ed = es + t_u * (d + es);
    double r = mh / d;
    double er = d > ed ? (emh + fabs(r) * ed) / (d - ed) : INFINITY;
    er += t_u * (fabs(r) + er);
    double w = hp->weight_decay * p + r, ew = er + t_u * (fabs(w) + er);
    o.p = p - lr * w;
    o.ep = (lr * ew + t_u * (fabs(o.p) + lr * ew) + t_u * lr * fabs(w)) * 1.01;
    o.em *= 1.01;
    o.ev *= 1.01;
    return o;
}

static double t_grad_value(const t_case *c, const void *grad, uint64_t i) {
    if (c->grad_dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(((const uint16_t *)grad)[i]);
    return ((const float *)grad)[i];
}

static void t_check_against_double(const char *name, const t_case *c, const optim_hparams *hp) {
    t_run *run = &t_slots[0];
    const char *why = NULL;
    t_run_open(run, BACKEND_REF, c, &why);
    uint64_t elems = t_elems(c);
    double worst = 0;
    for (uint32_t s = 0; s < 6; s++) {
        float *p0 = t_read(run, R_MASTER), *m0 = t_read(run, R_M), *v0 = t_read(run, R_V);
        t_step(run, false, NULL);
        void *grad = t_read(run, R_GRAD);
        float *p1 = t_read(run, R_MASTER), *m1 = t_read(run, R_M), *v1 = t_read(run, R_V);
        optim_state *st = t_read(run, R_STATE);
        double clip = st->clip;
        for (uint64_t i = 0; i < elems; i++) {
            t_ref_out o = t_adamw_double(t_grad_value(c, grad, i), clip, p0[i], m0[i], v0[i],
                                         hp, (double)st->lr * hp->lr_scale, st->step);
            double dp = fabs(p1[i] - o.p);
            CHECK(dp <= o.ep, "%s step %u elem %llu: p %.9g, double %.12g, bound %.3g", name, s,
                  (unsigned long long)i, p1[i], o.p, o.ep);
            CHECK(fabs(m1[i] - o.m) <= o.em, "%s step %u elem %llu: m %.9g, double %.12g", name,
                  s, (unsigned long long)i, m1[i], o.m);
            CHECK(fabs(v1[i] - o.v) <= o.ev, "%s step %u elem %llu: v %.9g, double %.12g", name,
                  s, (unsigned long long)i, v1[i], o.v);
            if (o.ep > 0 && dp / o.ep > worst) worst = dp / o.ep;
        }
        CHECK(st->step == s + 1, "%s: step counter %llu", name, (unsigned long long)st->step);
        free(p0), free(m0), free(v0), free(grad), free(p1), free(m1), free(v1), free(st);
    }
    // The bound is not vacuous: it is used, and the update is far larger than it.
    CHECK(worst > 0.0, "%s: the FP32 result equals double exactly everywhere", name);
    rig_close(&run->r);
}

static void test_update_vs_double(void) {
    test_begin("optim_update_vs_double_reference");
    t_case f32 = {"fp32_param", OPTIM_WEIGHT_NONE, 37, 53, QT_DTYPE_F32, 0, 0, 0, 0, 0, 0, 11, 0,
                  0};
    t_case bf16 = {"bf16_grad", OPTIM_WEIGHT_BF16, 64, 96, QT_DTYPE_BF16, 0, 0, 0, 0, 0, 0, 12, 0,
                   0};
    optim_hparams hp = optim_hparams_default();
    hp.weight_decay = 0.01f;
    t_check_against_double("fp32_param", &f32, &hp);
    t_check_against_double("bf16_grad", &bf16, &hp);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Clip factor: clip c with gradients g gives the bits of clip 1 with gradients c g when c g is
// exact (c = 0.5, normal values); and the factor does change the result.

typedef struct t_clip_result {
    float *p, *m, *v;
} t_clip_result;

static t_clip_result t_clip_run(float clip, float grad_scale, bool with_norm) {
    t_case c = {"clip", OPTIM_WEIGHT_NONE, 33, 40, QT_DTYPE_F32, 0, 0, 0, 0, 0, 0, 21, 0, 0};
    t_run *run = &t_slots[0];
    const char *why = NULL;
    t_run_open(run, BACKEND_REF, &c, &why);
    uint64_t elems = t_elems(&c);
    for (uint32_t s = 0; s < 3; s++) {
        float *g = malloc(elems * 4);
        for (uint64_t i = 0; i < elems; i++) {
            g[i] = qt_fill_value(77, s * elems + i, QT_FILL_NORMAL, 0.0f, 0.1f) * grad_scale;
        }
        RIG_OK(backend_write(&run->r.be, t_ref(run, R_GRAD), g, elems * 4));
        free(g);
        // Without a norm input the kernel uses clip 1: write the neutral struct.
        t_write_norm(run, with_norm ? clip : 1.0f, 0);
        RIG_OK(backend_run(&run->r.be, &run->r.prog));
    }
    t_clip_result res = {t_read(run, R_MASTER), t_read(run, R_M), t_read(run, R_V)};
    rig_close(&run->r);
    return res;
}

static void t_clip_free(t_clip_result *r) {
    free(r->p);
    free(r->m);
    free(r->v);
}

static void test_clip_factor(void) {
    test_begin("optim_clip_factor_applied");
    uint64_t bytes = 33 * 40 * 4;
    t_clip_result clipped = t_clip_run(0.5f, 1.0f, true);
    t_clip_result scaled = t_clip_run(1.0f, 0.5f, false);
    t_clip_result plain = t_clip_run(1.0f, 1.0f, false);
    CHECK(memcmp(clipped.p, scaled.p, bytes) == 0, "master: clip 0.5 != gradients * 0.5");
    CHECK(memcmp(clipped.m, scaled.m, bytes) == 0, "m: clip 0.5 != gradients * 0.5");
    CHECK(memcmp(clipped.v, scaled.v, bytes) == 0, "v: clip 0.5 != gradients * 0.5");
    CHECK(memcmp(clipped.m, plain.m, bytes) != 0, "clip factor had no effect");
    t_clip_free(&clipped);
    t_clip_free(&scaled);
    t_clip_free(&plain);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Every format.

static const t_case t_cases[] = {
    {"fp32", OPTIM_WEIGHT_NONE, 45, 70, QT_DTYPE_F32, 0, 0, 0, 0, 0, 1, 101, 0, 0},
    {"bf16", OPTIM_WEIGHT_BF16, 64, 96, QT_DTYPE_BF16, 0, 0, 0, 0, 0, 1, 102, 0, 0},
    {"bf16_odd", OPTIM_WEIGHT_BF16, 45, 70, QT_DTYPE_F32, 0, 0, 0, 0, 0, 0, 103, 0, 0},
    {"fp8_delayed_e4m3", OPTIM_WEIGHT_FP8_DELAYED, 96, 160, QT_DTYPE_BF16, QT_FP8_E4M3, 0, 0, 0,
     0, 1, 104, 0, 0},
    {"fp8_delayed_e5m2_odd", OPTIM_WEIGHT_FP8_DELAYED, 45, 70, QT_DTYPE_F32, QT_FP8_E5M2, 0, 0,
     0, 0, 0, 105, 0, 0},
    {"fp8_current_e4m3", OPTIM_WEIGHT_FP8_CURRENT, 96, 160, QT_DTYPE_F32, QT_FP8_E4M3, 0, 0, 0,
     0, 1, 106, 0, 0},
    {"fp8_current_e5m2_pow2_odd", OPTIM_WEIGHT_FP8_CURRENT, 45, 70, QT_DTYPE_BF16, QT_FP8_E5M2, 0,
     1, 0, 0, 0, 107, 0, 0},
    {"mxfp8_2d", OPTIM_WEIGHT_MXFP8, 96, 160, QT_DTYPE_BF16, QT_FP8_E4M3, 1, 0, 0, 0, 1, 108, 0, 0},
    {"mxfp8_1d_odd", OPTIM_WEIGHT_MXFP8, 45, 70, QT_DTYPE_F32, QT_FP8_E4M3, 0, 0, 0, 0, 0, 109, 0,
     0},
    // The rowwise copy alone, written by the update: whole tiles; columns that end mid-block
    // and mid-word (E5M2); rows and columns that end mid-tile.
    {"mxfp8_rowwise_e4m3", OPTIM_WEIGHT_MXFP8, 96, 160, QT_DTYPE_BF16, QT_FP8_E4M3, 0, 0, 0, 0,
     1, 118, 0, 1},
    {"mxfp8_rowwise_e5m2_odd", OPTIM_WEIGHT_MXFP8, 45, 70, QT_DTYPE_F32, QT_FP8_E5M2, 0, 0, 0, 0,
     1, 119, 0, 1},
    {"mxfp8_rowwise_edge_tiles", OPTIM_WEIGHT_MXFP8, 130, 200, QT_DTYPE_BF16, QT_FP8_E4M3, 0, 0,
     0, 0, 0, 120, 0, 1},
    {"block_2d", OPTIM_WEIGHT_FP8_BLOCK, 130, 200, QT_DTYPE_BF16, QT_FP8_E4M3, 1, 0, 0, 0, 1,
     110, 0, 0},
    {"block_1d", OPTIM_WEIGHT_FP8_BLOCK, 130, 200, QT_DTYPE_F32, QT_FP8_E4M3, 0, 0, 0, 0, 0,
     111, 0, 0},
    {"nvfp4_2d", OPTIM_WEIGHT_NVFP4, 96, 160, QT_DTYPE_BF16, 0, 1, 0, 0, 0, 1, 112, 0, 0},
    {"nvfp4_1d_sr_odd", OPTIM_WEIGHT_NVFP4, 45, 70, QT_DTYPE_F32, 0, 0, 0, 0, 1, 0, 113, 0, 0},
    {"nvfp4_1d_rht", OPTIM_WEIGHT_NVFP4, 64, 96, QT_DTYPE_F32, 0, 0, 0, 1, 0, 0, 114, 0, 0},
    // Stacked weights: members of whole update tiles take their amaxes from the update (odd
    // columns: tiles cut at the edge); members of 48 rows take them from a pass of the cast's.
    {"fp8_current_stacked_e4m3", OPTIM_WEIGHT_FP8_CURRENT, 256, 70, QT_DTYPE_F32, QT_FP8_E4M3, 0,
     0, 0, 0, 1, 115, 4, 0},
    {"fp8_current_stacked_48_rows", OPTIM_WEIGHT_FP8_CURRENT, 144, 96, QT_DTYPE_BF16,
     QT_FP8_E4M3, 0, 0, 0, 0, 0, 116, 3, 0},
    {"nvfp4_stacked", OPTIM_WEIGHT_NVFP4, 128, 96, QT_DTYPE_BF16, 0, 0, 0, 0, 0, 1, 117, 2, 0},
};
#define T_CASES (sizeof t_cases / sizeof t_cases[0])

// Compares two buffers; prints the first mismatches with their element index and values.
static void t_compare(const char *what, const char *region, const void *got, const void *want,
                      uint64_t bytes, uint32_t esize) {
    uint64_t bad = 0;
    for (uint64_t e = 0; e < bytes / esize; e++) {
        const uint8_t *a = (const uint8_t *)got + e * esize, *b = (const uint8_t *)want + e * esize;
        if (memcmp(a, b, esize) == 0) continue;
        if (bad++ < 4) {
            uint32_t x = 0, y = 0;
            memcpy(&x, a, esize);
            memcpy(&y, b, esize);
            CHECK(false, "%s: %s element %llu: %08x, expected %08x (%.9g vs %.9g as f32)", what,
                  region, (unsigned long long)e, x, y, esize == 4 ? qt_bits_f32(x) : 0.0,
                  esize == 4 ? qt_bits_f32(y) : 0.0);
        }
    }
    CHECK(bad == 0, "%s: %s: %llu of %llu elements differ", what, region,
          (unsigned long long)bad, (unsigned long long)(bytes / esize));
}

static void t_compare_regions(t_run *a, t_run *b, int first, int end, const char *what) {
    for (int i = first; i < end; i++) {
        void *x = t_read(a, i), *y = t_read(b, i);
        t_compare(what, t_region_names[i], x, y, a->bytes[i], t_elem_size(a->c, i));
        free(x);
        free(y);
    }
}

// After a step: the weight equals the family's quantization of the new master.
static void t_check_family(t_run *run, float history0_before) {
    const t_case *c = run->c;
    char what[96];
    snprintf(what, sizeof what, "%s after step %u (fused vs family)", c->name, run->step_count);
    if (c->weight == OPTIM_WEIGHT_NONE) return;
    if (c->weight == OPTIM_WEIGHT_BF16) {
        float *p = t_read(run, R_MASTER);
        uint16_t *w = t_read(run, R_WROW);
        uint16_t *want = calloc(run->bytes[R_WROW] / 2, 2);
        for (uint64_t i = 0; i < t_elems(c); i++) want[i] = qt_f32_to_bf16(p[i]);
        t_compare(what, "bf16", w, want, run->bytes[R_WROW], 2);
        free(p), free(w), free(want);
        return;
    }
    static const int pairs[][2] = {{R_WROW, R_CROW},   {R_WROWS, R_CROWS}, {R_WCOL, R_CCOL},
                                   {R_WCOLS, R_CCOLS}, {R_SINV, R_CSINV},  {R_AMAX, R_CAMAX},
                                   {R_AMAXC, R_CAMAXC}, {R_SCALE, R_CSCALE}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        int mine = pairs[k][0], family = pairs[k][1];
        if (c->weight == OPTIM_WEIGHT_FP8_DELAYED && (mine == R_AMAX || mine == R_SCALE)) continue;
        if (c->weight != OPTIM_WEIGHT_FP8_CURRENT && mine == R_SCALE) continue;
        void *x = t_read(run, mine), *y = t_read(run, family);
        uint64_t bytes = run->bytes[mine] < run->bytes[family] ? run->bytes[mine]
                                                                : run->bytes[family];
        t_compare(what, t_region_names[mine], x, y, bytes, t_elem_size(c, mine));
        free(x), free(y);
    }
    if (c->weight == OPTIM_WEIGHT_FP8_DELAYED) {
        // History row 0 = max(its value before the step, amax of the new master).
        float *h0 = t_read(run, R_CHIST0), *amax = t_read(run, R_CAMAX);
        float want = history0_before;
        qt_fp8_amax_merge(&want, *amax);
        CHECK(qt_f32_bits(*h0) == qt_f32_bits(want), "%s: history row 0 %.9g, expected %.9g",
              what, *h0, want);
        CHECK(*amax > 0.0f, "%s: amax of the master is 0", what);
        free(h0), free(amax);
    }
}

static float t_history0(t_run *run) {
    float h0;
    RIG_OK(backend_read(&run->r.be, &h0, t_ref(run, R_AMAX), 4));
    return h0;
}

static void test_formats_match_family(void) {
    for (size_t k = 0; k < T_CASES; k++) {
        char name[96];
        snprintf(name, sizeof name, "optim_%s_weight_equals_family_quantization", t_cases[k].name);
        test_begin(name);
        t_run *run = &t_slots[0];
        const char *why = NULL;
        t_run_open(run, BACKEND_REF, &t_cases[k], &why);
        for (uint32_t s = 0; s < 3; s++) {
            float h0 = t_history0(run);
            t_step(run, false, NULL);
            t_check_family(run, h0);
        }
        rig_close(&run->r);
        test_end();
    }
}

// A skipped step: every byte of state (the counted steps included) and of the inputs unchanged,
// but the step's own optim_state; the next step changes the master.
static void test_skip_changes_nothing(void) {
    for (size_t k = 0; k < T_CASES; k++) {
        char name[96];
        snprintf(name, sizeof name, "optim_%s_skipped_step_changes_nothing", t_cases[k].name);
        test_begin(name);
        t_run *run = &t_slots[0];
        const char *why = NULL;
        t_run_open(run, BACKEND_REF, &t_cases[k], &why);
        t_step(run, false, NULL);
        t_step(run, false, NULL);
        void *before[T_STATE_END];
        for (int i = 0; i < T_STATE_END; i++) before[i] = t_read(run, i);
        t_write_norm(run, 1.0f, 1);
        RIG_OK(backend_run(&run->r.be, &run->r.prog));
        for (int i = 0; i < T_STATE_END; i++) {
            void *after = t_read(run, i);
            if (i == R_STATE) {
                // This step's own values: skipped, the counted steps as they were.
                optim_state *a = after;
                const uint64_t *steps = before[R_STEPS];
                CHECK(a->step == *steps && a->skip == 1, "%s: step %llu -> %llu, skip %u",
                      t_cases[k].name, (unsigned long long)*steps,
                      (unsigned long long)a->step, a->skip);
            } else if (i != R_NORM) {
                t_compare(t_cases[k].name, t_region_names[i], after, before[i], run->bytes[i],
                          t_elem_size(&t_cases[k], i));
            }
            free(after);
        }
        t_write_norm(run, 1.0f, 0);
        RIG_OK(backend_run(&run->r.be, &run->r.prog));
        void *master = t_read(run, R_MASTER);
        CHECK(memcmp(master, before[R_MASTER], run->bytes[R_MASTER]) != 0,
              "%s: the step after the skipped one changed nothing", t_cases[k].name);
        free(master);
        for (int i = 0; i < T_STATE_END; i++) free(before[i]);
        rig_close(&run->r);
        test_end();
    }
}

// NaN results are the canonical 0x7FFFFFFF on the reference backend too.
static void test_nan_canonical(void) {
    test_begin("optim_nan_results_canonical");
    optim_hparams hp = optim_hparams_default();
    qt_optim_coef c = {1e-3f, 1.0f, 0.1f, 0.001f, hp.beta1, hp.beta2, 1.0f - hp.beta1,
                       1.0f - hp.beta2, hp.eps, 0.01f, 1.0f};
    static const uint32_t grads[] = {0xFFC12345u, 0x7F800000u, 0xFF800000u, 0x7FC00001u};
    for (size_t i = 0; i < sizeof grads / sizeof grads[0]; i++) {
        float p = 1.0f, m = 0.0f, v = 0.0f;
        qt_optim_adamw_elem(&c, qt_bits_f32(grads[i]), &p, &m, &v);
        CHECK(qt_f32_bits(p) == 0x7FFFFFFFu, "grad %08x: p %08x", grads[i], qt_f32_bits(p));
        CHECK(!qt_f32_is_nan(m) || qt_f32_bits(m) == 0x7FFFFFFFu, "grad %08x: m %08x",
              grads[i], qt_f32_bits(m));
        CHECK(!qt_f32_is_nan(v) || qt_f32_bits(v) == 0x7FFFFFFFu, "grad %08x: v %08x",
              grads[i], qt_f32_bits(v));
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU.

#define T_GPU_STEPS 5u
#define T_GPU_SKIPPED_STEP 3u

// ---------------------------------------------------------------------------------------------
// Multi-tensor launches.

// The binary search picks the entry a scan picks: the last one whose first_block is <= block,
// for tables of 1 to 40 entries of 1 to 5 blocks each, at every block of the launch.
static void test_entry_search(void) {
    test_begin("optim_multi_entry_search_equals_a_scan");
    static optim_multi_entry entries[40];
    uint64_t state = 777;
    for (uint32_t count = 1; count <= 40; count++) {
        uint32_t blocks = 0;
        for (uint32_t i = 0; i < count; i++) {
            state = qt_mix64(state + i);
            entries[i].first_block = blocks;
            entries[i].blocks = 1 + (uint32_t)(state % 5);
            blocks += entries[i].blocks;
        }
        for (uint32_t b = 0; b < blocks; b++) {
            uint32_t want = 0;
            for (uint32_t i = 0; i < count; i++) {
                if (entries[i].first_block <= b) want = i;
            }
            uint32_t got = qt_optim_entry_of(entries, count, b);
            CHECK(got == want, "%u entries, block %u: entry %u, a scan gives %u", count, b, got,
                  want);
        }
    }
    test_end();
}

// Ops of each kernel in a run's step program.
static uint32_t t_ops_of(t_run *run, kernel_id kernel) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < run->r.prog.op_count; i++) n += run->r.prog.ops[i].kernel == kernel;
    return n;
}

// Steps 0, 1, 3 and 4 counted, step 2 skipped, then every state region (the extra parameters'
// included) and every check region of both runs byte for byte.
static void t_compare_steps(t_run *a, t_run *b, const char *what) {
    for (uint32_t s = 0; s < 5; s++) {
        t_step(a, s == 2, NULL);
        t_step(b, s == 2, NULL);
        char label[96];
        snprintf(label, sizeof label, "%s step %u%s", what, s, s == 2 ? " skipped" : "");
        t_compare_regions(a, b, 0, T_COMPARE_END, label);
    }
}

// On the reference backend, the multi-tensor launches give the per-parameter ops' bytes in
// every format, in launches that hold many parameters each (two here: the regions of 21
// parameters exceed one op's).
static void test_multi_equals_per_param(void) {
    for (size_t k = 0; k < T_CASES; k++) {
        char name[96];
        snprintf(name, sizeof name, "optim_multi_%s_equals_per_parameter_ops", t_cases[k].name);
        test_begin(name);
        t_run *each = &t_slots[0], *multi = &t_slots[1];
        const char *why = NULL;
        t_run_open_list(each, BACKEND_REF, &t_cases[k], T_LIST_EACH, &why);
        t_run_open_list(multi, BACKEND_REF, &t_cases[k], T_LIST_MULTI, &why);
        uint32_t launches = t_ops_of(multi, KERNEL_OPTIM_ADAMW_MULTI);
        CHECK(launches == 2 && t_ops_of(multi, KERNEL_OPTIM_ADAMW) == 0,
              "%s: %u multi-tensor launches and %u per-parameter ones, expected 2 and 0",
              t_cases[k].name, launches, t_ops_of(multi, KERNEL_OPTIM_ADAMW));
        // The begin zeroes the amaxes of per-tensor current scaling's and NVFP4's casts; the
        // update takes them (and a launch of its own zeroes them) without RHT, and for a
        // stacked weight only where its members are whole update tiles.
        const t_case *c = &t_cases[k];
        bool zeroes = c->weight == OPTIM_WEIGHT_FP8_CURRENT ||
                      (c->weight == OPTIM_WEIGHT_NVFP4 && !c->rht);
        bool whole_tiles = c->members == 0 || (c->rows / c->members) % QT_OPTIM_TILE == 0;
        bool update_zeroes = zeroes && whole_tiles;
        // The per-parameter zeroing launches (the check casts have zeroing launches of their
        // own, in both runs) are gone: the begin zeroes the list's targets.
        uint32_t each_zero = t_ops_of(each, KERNEL_FP8_AMAX_ZERO);
        uint32_t multi_zero = t_ops_of(multi, KERNEL_FP8_AMAX_ZERO);
        CHECK(t_ops_of(multi, KERNEL_OPTIM_AMAX_ZERO) == 0 &&
                  (zeroes ? multi_zero < each_zero : multi_zero == each_zero),
              "%s: %u multi-tensor zeroing launches; %u and %u per-parameter ones",
              t_cases[k].name, t_ops_of(multi, KERNEL_OPTIM_AMAX_ZERO), multi_zero, each_zero);
        t_compare_regions(each, multi, 0, T_COMPARE_END, "after start-up (multi vs each)");
        t_compare_steps(each, multi, "multi vs each");
        rig_close(&multi->r);
        // The launches' own zeroing (no begin zeroes): one launch for the whole list.
        t_run_open_list(multi, BACKEND_REF, &t_cases[k], T_LIST_OWN_ZEROES, &why);
        CHECK(t_ops_of(multi, KERNEL_OPTIM_AMAX_ZERO) == (update_zeroes ? 1u : 0u),
              "%s: %u zeroing launches of the list's own", t_cases[k].name,
              t_ops_of(multi, KERNEL_OPTIM_AMAX_ZERO));
        rig_close(&each->r);
        t_run_open_list(each, BACKEND_REF, &t_cases[k], T_LIST_EACH, &why);
        t_compare_regions(each, multi, 0, T_COMPARE_END, "after start-up (own zeroes)");
        t_compare_steps(each, multi, "own zeroes vs each");
        rig_close(&multi->r);
        // Two parameters a launch, each launch's casts right after it: the same bytes again.
        t_run *pipelined = multi;
        t_run_open_list(pipelined, BACKEND_REF, &t_cases[k], T_LIST_PIPELINED, &why);
        uint32_t expected = (T_EXTRAS + 1 + T_LIST_PIPELINED_PER_LAUNCH - 1) /
                            T_LIST_PIPELINED_PER_LAUNCH;
        launches = t_ops_of(pipelined, KERNEL_OPTIM_ADAMW_MULTI);
        CHECK(launches == expected, "%s: %u pipelined launches, expected %u", t_cases[k].name,
              launches, expected);
        rig_close(&each->r);
        t_run_open_list(each, BACKEND_REF, &t_cases[k], T_LIST_EACH, &why);
        t_compare_regions(each, pipelined, 0, T_COMPARE_END, "after start-up (pipelined)");
        t_compare_steps(each, pipelined, "pipelined vs each");
        rig_close(&each->r);
        rig_close(&pipelined->r);
        test_end();
    }
}

// Who writes an MXFP8 weight: the update where the rowwise copy is the weight's only one (the
// step and the start-up program then hold no cast of the master, the step only the check
// regions' own), the family cast after the update otherwise; in the multi-tensor step too.
static void test_mxfp8_cast_by_update(void) {
    test_begin("optim_mxfp8_rowwise_only_weight_written_by_the_update");
    for (size_t k = 0; k < T_CASES; k++) {
        const t_case *c = &t_cases[k];
        if (c->weight != OPTIM_WEIGHT_MXFP8) continue;
        for (t_list list = T_LIST_ONE; list <= T_LIST_MULTI; list++) {
            t_run *run = &t_slots[0];
            const char *why = NULL;
            t_run_open_list(run, BACKEND_REF, c, list, &why);
            uint32_t step = t_ops_of(run, KERNEL_MXFP8_QUANTIZE_F32);
            uint32_t start = 0;
            for (uint32_t i = 0; i < run->prep.op_count; i++) {
                start += run->prep.ops[i].kernel == KERNEL_MXFP8_QUANTIZE_F32;
            }
            uint32_t want = c->row_only ? 0u : 1u;
            CHECK(step == want + 1 && start == want,
                  "%s (list %d): %u casts in the step (one of them the check's), %u at start-up; "
                  "expected %u and %u", c->name, (int)list, step, start, want + 1, want);
            rig_close(&run->r);
        }
    }
    test_end();
}

static const t_case t_gpu_big[] = {
    {"fp8_delayed_e4m3_large", OPTIM_WEIGHT_FP8_DELAYED, 512, 1024, QT_DTYPE_BF16, QT_FP8_E4M3,
     0, 0, 0, 0, 1, 201, 0, 0},
    {"bf16_large_f32grad", OPTIM_WEIGHT_BF16, 300, 520, QT_DTYPE_F32, 0, 0, 0, 0, 0, 1, 202, 0, 0},
    {"nvfp4_2d_large", OPTIM_WEIGHT_NVFP4, 256, 768, QT_DTYPE_BF16, 0, 1, 0, 0, 0, 1, 203, 0, 0},
    {"mxfp8_rowwise_large", OPTIM_WEIGHT_MXFP8, 512, 1024, QT_DTYPE_BF16, QT_FP8_E4M3, 0, 0, 0,
     0, 1, 204, 0, 1},
};

static void t_gpu_case(const t_case *c, const char *why_none) {
    char name[96];
    snprintf(name, sizeof name, "gpu_optim_%s_matches_ref_bitwise", c->name);
    const char *why = NULL;
    t_run *gpu = &t_slots[0], *ref = &t_slots[1];
    if (why_none) {
        test_skip(name, why_none);
        return;
    }
    test_begin(name);  // before opening: the builders' checks belong to this case
    if (!t_run_open(gpu, BACKEND_GPU, c, &why)) {
        test_skip(name, why);
        return;
    }
    t_run_open(ref, BACKEND_REF, c, &why);
    t_compare_regions(gpu, ref, 0, T_COMPARE_END, "after start-up quantization");
    for (uint32_t s = 0; s < T_GPU_STEPS; s++) {
        bool skip = s == T_GPU_SKIPPED_STEP;
        t_step(gpu, skip, NULL);
        t_step(ref, skip, NULL);
        char what[64];
        snprintf(what, sizeof what, "%s step %u%s (gpu vs ref)", c->name, s,
                 skip ? " skipped" : "");
        t_compare_regions(gpu, ref, 0, T_COMPARE_END, what);
    }
    rig_close(&gpu->r);
    rig_close(&ref->r);
    test_end();
}

// The multi-tensor kernels on the GPU against the per-parameter twins on the reference backend.
static void t_gpu_multi(const t_case *c, const char *why_none) {
    char name[96];
    snprintf(name, sizeof name, "gpu_optim_multi_%s_matches_ref_per_parameter", c->name);
    const char *why = NULL;
    t_run *gpu = &t_slots[0], *ref = &t_slots[1];
    if (why_none) {
        test_skip(name, why_none);
        return;
    }
    test_begin(name);
    if (!t_run_open_list(gpu, BACKEND_GPU, c, T_LIST_MULTI, &why)) {
        test_skip(name, why);
        return;
    }
    t_run_open_list(ref, BACKEND_REF, c, T_LIST_EACH, &why);
    t_compare_regions(gpu, ref, 0, T_COMPARE_END, "after start-up (gpu multi vs ref)");
    t_compare_steps(gpu, ref, "gpu multi vs ref each");
    rig_close(&gpu->r);
    rig_close(&ref->r);
    test_end();
}

// 10 graph replays against 10 eager runs (one skipped), both on the GPU, then against the ref.
static void t_gpu_graph(const t_case *c, const char *why_none) {
    char name[96];
    snprintf(name, sizeof name, "gpu_optim_%s_graph_replay_equals_eager", c->name);
    const char *why = NULL;
    t_run *eager = &t_slots[0], *graphed = &t_slots[0], *ref = &t_slots[1];
    if (why_none) {
        test_skip(name, why_none);
        return;
    }
    test_begin(name);
    if (!t_run_open(eager, BACKEND_GPU, c, &why)) {
        test_skip(name, why);
        return;
    }
    for (uint32_t s = 0; s < 10; s++) t_step(eager, s == 4, NULL);
    void *eager_out[R_COUNT];
    for (int i = 0; i < T_COMPARE_END; i++) eager_out[i] = t_read(eager, i);
    rig_close(&eager->r);
    t_run_open(graphed, BACKEND_GPU, c, &why);
    backend_graph graph;
    RIG_OK(backend_capture(&graphed->r.be, &graphed->r.prog, &graph));
    for (uint32_t s = 0; s < 10; s++) t_step(graphed, s == 4, &graph);
    for (int i = 0; i < T_COMPARE_END; i++) {
        void *x = t_read(graphed, i);
        t_compare("graph vs eager", t_region_names[i], x, eager_out[i], graphed->bytes[i],
                  t_elem_size(c, i));
        free(x);
    }
    t_run_open(ref, BACKEND_REF, c, &why);
    for (uint32_t s = 0; s < 10; s++) t_step(ref, s == 4, NULL);
    t_compare_regions(graphed, ref, 0, T_COMPARE_END, "graph vs ref");
    for (int i = 0; i < T_COMPARE_END; i++) free(eager_out[i]);
    backend_graph_destroy(&graphed->r.be, &graph);
    rig_close(&graphed->r);
    rig_close(&ref->r);
    test_end();
}

static void test_gpu(void) {
    const char *why = NULL;
    static rig probe;  // large (a program): not on the stack
    const char *why_none = NULL;
    if (!rig_open(&probe, BACKEND_GPU, &why)) {
        why_none = why;
    } else {
        rig_close(&probe);
    }
    for (size_t k = 0; k < T_CASES; k++) TEST_UNIT(t_gpu_case(&t_cases[k], why_none));
    for (size_t k = 0; k < sizeof t_gpu_big / sizeof t_gpu_big[0]; k++) {
        TEST_UNIT(t_gpu_case(&t_gpu_big[k], why_none));
    }
    for (size_t k = 0; k < T_CASES; k++) TEST_UNIT(t_gpu_graph(&t_cases[k], why_none));
    for (size_t k = 0; k < T_CASES; k++) TEST_UNIT(t_gpu_multi(&t_cases[k], why_none));
    for (size_t k = 0; k < sizeof t_gpu_big / sizeof t_gpu_big[0]; k++) {
        TEST_UNIT(t_gpu_multi(&t_gpu_big[k], why_none));
    }
}

int main(void) {
    TEST_UNIT(test_lr_row_search());
    TEST_UNIT(test_bias_correction());
    TEST_UNIT(test_lr_rules());
    TEST_UNIT(test_begin_rules());
    TEST_UNIT(test_begin_zeroes());
    TEST_UNIT(test_nan_canonical());
    TEST_UNIT(test_update_vs_double());
    TEST_UNIT(test_clip_factor());
    TEST_UNIT(test_formats_match_family());
    TEST_UNIT(test_skip_changes_nothing());
    TEST_UNIT(test_entry_search());
    TEST_UNIT(test_multi_equals_per_param());
    TEST_UNIT(test_mxfp8_cast_by_update());
    test_gpu();  // not a unit: each of its GPU cases is one
    return test_exit_code();
}
