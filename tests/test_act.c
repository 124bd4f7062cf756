// Tests of the act family (ptx/act.cu, its C twins runtime/ref/ref_act.c, the builders
// runtime/ops/op_act.c): activations, RMSNorm, residual add, softmax cross-entropy, MSE and the
// global gradient norm.
//
// CPU: every op runs as a program on the reference backend and is checked against a
// double-precision reference within an error bound derived next to it (u = 2^-24 is FP32's unit
// roundoff: one IEEE operation has relative error <= u; qt_math's functions are within the ulp
// counts stated in qt_math.h, 1 ulp <= 2u relative); the double references of the gradients are
// themselves checked against central finite differences in double; special values, ignored rows
// and odd shapes have exact expectations.
// GPU (SKIP without one): the same programs on the GPU and on the reference backend, every
// buffer compared byte for byte (inputs, outputs, workspaces), and a second eager run plus a
// graph replay compared with the first run.
#include <math.h>
#include <stddef.h>  // offsetof
#include <string.h>  // memset

#include "runtime/ops/op_act.h"
#include "runtime/ops/op_core.h"  // OP_PLAN_SMS, the table kernels' grid
#include "runtime/ops/op_quant_fp8.h"  // op_fp8_amax_zero
#include "tests/rig.h"
#include "tests/test.h"

#define T_U 0x1p-24       // FP32 unit roundoff
#define T_U_BF16 0x1p-8   // BF16 unit roundoff (8 significant bits)
#define T_TINY 0x1p-147   // slack for subnormal results (a few FP32 subnormal steps)
#define T_NONE 0xFFFFFFFFu

// Buffer element types: the two activation dtypes, then raw 32-bit words.
#define T_F32 QT_DTYPE_F32
#define T_BF16 QT_DTYPE_BF16
#define T_I32 2u
#define T_U32 3u

static float t_f(uint32_t bits) { return qt_bits_f32(bits); }
static uint32_t t_b(float v) { return qt_f32_bits(v); }

// ---------------------------------------------------------------------------------------------
// Runs: one rig, its buffers (each a region plus a misalignment), their initial and final bytes.

typedef struct t_buf {
    const char *name;
    arena_handle h;
    uint32_t type;
    uint64_t offset, elems;
    uint8_t *init;  // written before every run; NULL = zeros
    uint8_t *out;   // read after the run
} t_buf;

#define T_BUFS_MAX 24
#define T_SLOTS 16

typedef struct t_run {
    rig r;
    t_buf b[T_BUFS_MAX];
    uint32_t n;
    uint32_t slot[T_SLOTS];  // buffer index of each of the kind's named slots, or T_NONE
} t_run;

static uint32_t t_type_bytes(uint32_t type) { return type == T_BF16 ? 2u : 4u; }
static uint64_t t_bytes(const t_buf *b) { return b->elems * t_type_bytes(b->type); }

static void t_buf_add(t_run *run, uint32_t slot, const char *name, uint32_t type, uint64_t elems,
                      uint32_t misalign) {
    QT_ASSERT(run->n < T_BUFS_MAX && slot < T_SLOTS);
    t_buf *b = &run->b[run->n];
    memset(b, 0, sizeof *b);
    b->name = name;
    b->type = type;
    b->elems = elems;
    b->offset = misalign;
    b->h = rig_reserve(&run->r, name, misalign + t_bytes(b) + 16);
    b->out = calloc(1, t_bytes(b) + 16);
    run->slot[slot] = run->n++;
}

static t_buf *t_slot(t_run *run, uint32_t slot) {
    return run->slot[slot] == T_NONE ? NULL : &run->b[run->slot[slot]];
}

static prog_ref t_ref(t_run *run, uint32_t slot) {
    if (run->slot[slot] == T_NONE) return OP_REF_NONE;
    t_buf *b = t_slot(run, slot);
    return rig_ref(&run->r, b->h, b->offset);
}

static op_act_tensor t_tensor(t_run *run, uint32_t slot) {
    if (run->slot[slot] == T_NONE) return OP_ACT_NONE;
    return (op_act_tensor){t_ref(run, slot), t_slot(run, slot)->type};
}

static float t_decode(const t_buf *b, const uint8_t *bytes, uint64_t i) {
    if (b->type == T_BF16) {
        uint16_t h;
        memcpy(&h, bytes + i * 2, 2);
        return qt_bf16_to_f32(h);
    }
    float v;
    memcpy(&v, bytes + i * 4, 4);
    return v;
}

static float t_in(t_run *run, uint32_t slot, uint64_t i) {
    const t_buf *b = t_slot(run, slot);
    return t_decode(b, b->init, i);
}

static float t_out(t_run *run, uint32_t slot, uint64_t i) {
    const t_buf *b = t_slot(run, slot);
    return t_decode(b, b->out, i);
}

static uint32_t t_word(t_run *run, uint32_t slot, uint64_t i) {
    uint32_t w;
    memcpy(&w, t_slot(run, slot)->out + i * 4, 4);
    return w;
}

// Sets a buffer's initial values from floats (rounded to BF16 for BF16 buffers) or raw words.
static void t_set(t_run *run, uint32_t slot, const float *values) {
    t_buf *b = t_slot(run, slot);
    free(b->init);
    b->init = calloc(1, t_bytes(b) + 16);
    for (uint64_t i = 0; i < b->elems; i++) {
        if (b->type == T_BF16) {
            uint16_t h = qt_f32_to_bf16(values[i]);
            memcpy(b->init + i * 2, &h, 2);
        } else {
            memcpy(b->init + i * 4, &values[i], 4);
        }
    }
}

static void t_set_words(t_run *run, uint32_t slot, const void *words) {
    t_buf *b = t_slot(run, slot);
    free(b->init);
    b->init = calloc(1, t_bytes(b) + 16);
    memcpy(b->init, words, t_bytes(b));
}

static void t_run_open(t_run *run, backend_kind kind) {
    const char *why = NULL;
    memset(run, 0, sizeof *run);
    bool opened = rig_open(&run->r, kind, &why);
    QT_ASSERT(opened);
    for (uint32_t s = 0; s < T_SLOTS; s++) run->slot[s] = T_NONE;
}

// Writes every buffer's initial bytes (zeros where none), runs the program, reads every buffer.
static void t_run_exec(t_run *run, const backend_graph *graph) {
    for (uint32_t i = 0; i < run->n; i++) {
        t_buf *b = &run->b[i];
        uint8_t *zeros = b->init ? NULL : calloc(1, t_bytes(b) + 16);
        prog_ref ref = rig_ref(&run->r, b->h, b->offset);
        RIG_OK(backend_write(&run->r.be, ref, b->init ? b->init : zeros, t_bytes(b)));
        free(zeros);
    }
    if (graph) {
        RIG_OK(backend_launch(&run->r.be, graph));
    } else {
        RIG_OK(backend_run(&run->r.be, &run->r.prog));
    }
    for (uint32_t i = 0; i < run->n; i++) {
        t_buf *b = &run->b[i];
        RIG_OK(backend_read(&run->r.be, b->out, rig_ref(&run->r, b->h, b->offset), t_bytes(b)));
    }
}

static void t_run_close(t_run *run) {
    for (uint32_t i = 0; i < run->n; i++) {
        free(run->b[i].init);
        free(run->b[i].out);
    }
    rig_close(&run->r);
}

// ---------------------------------------------------------------------------------------------
// Input data: a seeded LCG, normal values by Box-Muller in double, optional planted specials.

static uint64_t t_lcg(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 11;
}

static double t_uniform(uint64_t *state) { return ((double)t_lcg(state) + 0.5) * 0x1p-53; }

static double t_normal(uint64_t *state) {
    double u1 = t_uniform(state), u2 = t_uniform(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static const uint32_t t_specials[] = {
    0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u,
    0x7149F2CAu /* 1e30 */, 0xF149F2CAu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u, 0x80000001u,
    0x006CE3EEu /* 1e-38 */, 0x3F800000u, 0xBF800000u, 0x41200000u, 0xC1200000u, 0xC2B20000u,
};
#define T_SPECIALS_COUNT (sizeof t_specials / sizeof t_specials[0])

static float *t_values(uint64_t count, uint64_t seed, double scale, double mean, bool specials) {
    float *v = malloc((count + 1) * sizeof *v);
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < count; i++) v[i] = (float)(mean + scale * t_normal(&state));
    if (specials) {
        for (uint64_t k = 0; k < T_SPECIALS_COUNT && k < count; k++) {
            v[(k * 7919u + seed) % count] = t_f(t_specials[k]);
        }
    }
    return v;
}

static void t_fill(t_run *run, uint32_t slot, uint64_t seed, double scale, double mean,
                   bool specials) {
    float *v = t_values(t_slot(run, slot)->elems, seed, scale, mean, specials);
    t_set(run, slot, v);
    free(v);
}

// ---------------------------------------------------------------------------------------------
// Cases.

enum { T_KIND_ACT, T_KIND_RMSNORM, T_KIND_RESIDUAL, T_KIND_XENT, T_KIND_MSE, T_KIND_GNORM };

#define T_BIAS 1u       // act: a bias
#define T_SPECIAL 2u    // plant special values in the inputs
#define T_ACCUM 4u      // rmsnorm: accumulate dgamma; residual: also an accumulating backward
#define T_IGNORE 8u     // xent: some labels -1 or out of range; mse: a valid-row count
#define T_NO_GRAD 16u   // xent / mse: no gradient output (evaluation)
#define T_SPLIT 32u     // xent / mse: the split kernels, whatever the shape (hand-built)
#define T_ONE_BLOCK 64u // xent / mse: the one-block kernel, whatever op_xent would take
#define T_EVERY_BF16 128u // act: x holds every BF16 bit pattern, in order, over and over
#define T_IN_PLACE 256u   // act (not swiglu): the backward writes dx over dy (act_args.out)

typedef struct t_case {
    const char *name;
    uint32_t kind;
    uint32_t op;  // act: QT_ACT_*
    uint32_t rows, cols;
    uint32_t in_dtype, out_dtype;
    uint32_t flags;
    uint32_t misalign;  // bytes added to every buffer's offset: 4 forces the element paths
    uint64_t seed;
    double scale;
} t_case;

// Slots of each kind.
enum { A_X, A_BIAS, A_DY, A_Y, A_DX, A_Y_AMAX, A_DX_AMAX };
// The *_AMAX slots: the amax of a stored output (ptx/act.h), +0 before every run.
enum { R_X, R_GAMMA, R_DY, R_Y, R_INV, R_DX, R_DGAMMA, R_WS, R_Y_AMAX, R_SKIP, R_DX_SUM,
       R_DX_AMAX, R_DGAMMA_SUM, R_DGAMMA_ALONE };
enum { S_X, S_F, S_Y, S_DY, S_DX, S_DX_ACC, S_Y_AMAX };
enum { X_LOGITS, X_LABELS, X_LOSS, X_DLOGITS, X_WS, X_STATS, X_DLOGITS_AMAX };
enum { M_PRED, M_TARGET, M_VALID, M_DPRED, M_WS, M_STATS, M_DPRED_AMAX };
// Eleven gradient regions: two qt_gnorm launches (QT_GNORM_REGIONS = 8 per launch).
#define T_GNORM_REGIONS 11u
enum { G_R0, G_R2 = G_R0 + 2, G_WS = G_R0 + T_GNORM_REGIONS, G_TICKET, G_OUT };

static void t_build_act(t_run *run, const t_case *c) {
    bool swiglu = c->op == QT_ACT_SWIGLU;
    uint64_t n = (uint64_t)c->rows * c->cols;
    uint64_t ny = swiglu ? n / 2 : n;
    bool sp = c->flags & T_SPECIAL;
    t_buf_add(run, A_X, "x", c->in_dtype, n, c->misalign);
    if (c->flags & T_BIAS) t_buf_add(run, A_BIAS, "bias", c->in_dtype, c->cols, c->misalign);
    t_buf_add(run, A_DY, "dy", c->out_dtype, ny, c->misalign);
    t_buf_add(run, A_Y, "y", c->out_dtype, ny, c->misalign);
    t_buf_add(run, A_DX, "dx", c->out_dtype, n, c->misalign);
    if (c->flags & T_EVERY_BF16) {
        uint16_t *words = malloc(n * 2);
        for (uint64_t i = 0; i < n; i++) words[i] = (uint16_t)i;
        t_set_words(run, A_X, words);
        free(words);
    } else {
        t_fill(run, A_X, c->seed, c->scale, 0, sp);
    }
    if (c->flags & T_BIAS) t_fill(run, A_BIAS, c->seed + 1, 0.5, 0, false);
    t_fill(run, A_DY, c->seed + 2, 1.0, 0, sp);
    program *p = &run->r.prog;
    // Both outputs' amaxes too (act_args.amax), zeroed first.
    t_buf_add(run, A_Y_AMAX, "y_amax", T_F32, 1, 0);
    t_buf_add(run, A_DX_AMAX, "dx_amax", T_F32, 1, 0);
    prog_ref y_amax = t_ref(run, A_Y_AMAX), dx_amax = t_ref(run, A_DX_AMAX);
    RIG_OK(op_fp8_amax_zero(p, "y_amax", y_amax, 1));
    RIG_OK(op_fp8_amax_zero(p, "dx_amax", dx_amax, 1));
    RIG_OK(op_act_forward(p, "act_fwd", c->op, c->rows, c->cols, t_tensor(run, A_X),
                          t_tensor(run, A_BIAS), t_tensor(run, A_Y), y_amax));
    // In place, dx lands in the dy buffer and the dx buffer keeps its zeros.
    uint32_t dx_slot = c->flags & T_IN_PLACE ? A_DY : A_DX;
    QT_ASSERT(!(c->flags & T_IN_PLACE) || !swiglu);
    RIG_OK(op_act_backward(p, "act_bwd", c->op, c->rows, c->cols, t_tensor(run, A_X),
                           t_tensor(run, A_BIAS), t_tensor(run, A_DY), t_tensor(run, dx_slot),
                           dx_amax));
}

static void t_build_rmsnorm(t_run *run, const t_case *c) {
    uint64_t n = (uint64_t)c->rows * c->cols;
    bool sp = c->flags & T_SPECIAL;
    t_buf_add(run, R_X, "x", c->in_dtype, n, c->misalign);
    t_buf_add(run, R_GAMMA, "gamma", c->in_dtype, c->cols, c->misalign);
    t_buf_add(run, R_DY, "dy", c->out_dtype, n, c->misalign);
    t_buf_add(run, R_Y, "y", c->out_dtype, n, c->misalign);
    t_buf_add(run, R_INV, "inv_rms", T_F32, c->rows, c->misalign);
    t_buf_add(run, R_DX, "dx", c->out_dtype, n, c->misalign);
    t_buf_add(run, R_DGAMMA, "dgamma", T_F32, c->cols, c->misalign);
    t_buf_add(run, R_WS, "workspace", T_F32, op_rmsnorm_workspace_bytes(c->rows, c->cols) / 4,
              0);
    t_buf_add(run, R_Y_AMAX, "y_amax", T_F32, 1, 0);
    t_buf_add(run, R_SKIP, "skip", c->out_dtype, n, c->misalign);
    t_buf_add(run, R_DX_SUM, "dx_sum", c->out_dtype, n, c->misalign);
    t_buf_add(run, R_DX_AMAX, "dx_amax", T_F32, 1, 0);
    t_buf_add(run, R_DGAMMA_SUM, "dgamma_sum", T_F32, c->cols, c->misalign);
    t_buf_add(run, R_DGAMMA_ALONE, "dgamma_alone", T_F32, c->cols, c->misalign);
    t_fill(run, R_SKIP, c->seed + 4, 1.0, 0, sp);
    t_fill(run, R_X, c->seed, c->scale, 0, sp);
    t_fill(run, R_GAMMA, c->seed + 1, 0.3, 1.0, false);
    t_fill(run, R_DY, c->seed + 2, 1.0, 0, sp);
    if (c->flags & T_ACCUM) t_fill(run, R_DGAMMA, c->seed + 3, 1.0, 0, false);
    program *p = &run->r.prog;
    RIG_OK(op_rmsnorm_forward(p, "rmsnorm_fwd", c->rows, c->cols, 1e-5f, t_tensor(run, R_X),
                              t_tensor(run, R_GAMMA), t_tensor(run, R_Y), t_ref(run, R_INV),
                              t_ref(run, R_Y_AMAX)));
    uint32_t y_op = p->op_count - 1;
    op_rmsnorm_grads grads = {t_tensor(run, R_DX), t_ref(run, R_DGAMMA),
                              (c->flags & T_ACCUM) != 0, t_ref(run, R_WS), OP_ACT_NONE,
                              OP_REF_NONE};
    uint32_t dx_op = p->op_count;
    RIG_OK(op_rmsnorm_backward(p, "rmsnorm_bwd", c->rows, c->cols, t_tensor(run, R_X),
                               t_tensor(run, R_GAMMA), t_ref(run, R_INV), t_tensor(run, R_DY),
                               &grads));
    // The dx kernel: the row held in registers for BF16 x and dy of whole chunks up to
    // QT_RMSNORM_REGS_COLS_MAX columns at 16-byte offsets (op_act.c), else the generic one.
    bool regs = c->in_dtype == T_BF16 && c->out_dtype == T_BF16 && c->cols % 8 == 0 &&
                c->cols <= QT_RMSNORM_REGS_COLS_MAX && c->misalign % 16 == 0;
    CHECK(p->ops[dx_op].kernel == (regs ? KERNEL_RMSNORM_BWD_DX_REGS : KERNEL_RMSNORM_BWD_DX),
          "%s: dx kernel %d, the row in registers expected: %d", c->name, p->ops[dx_op].kernel,
          regs);
    // The same backward pass with a residual block's skip gradient added as dx is stored
    // (op_rmsnorm_grads.skip) and the sum's amax, by the same kernel.
    op_rmsnorm_grads summed = grads;
    summed.dx = t_tensor(run, R_DX_SUM);
    summed.dgamma = t_ref(run, R_DGAMMA_SUM);  // dgamma's own checks read the first one's
    summed.accumulate = false;
    summed.skip = t_tensor(run, R_SKIP);
    summed.amax = t_ref(run, R_DX_AMAX);
    uint32_t sum_op = p->op_count;
    RIG_OK(op_rmsnorm_backward(p, "rmsnorm_bwd_skip", c->rows, c->cols, t_tensor(run, R_X),
                               t_tensor(run, R_GAMMA), t_ref(run, R_INV), t_tensor(run, R_DY),
                               &summed));
    CHECK(p->ops[sum_op].kernel == p->ops[dx_op].kernel, "%s: dx kernel with skip %d, not %d",
          c->name, p->ops[sum_op].kernel, p->ops[dx_op].kernel);
    // dgamma alone (no dx, as for the first layer with parameters): the two dgamma ops, no dx
    // kernel; its bits are checked against the summed pass's, which also overwrites.
    op_rmsnorm_grads alone = summed;
    alone.dx = OP_ACT_NONE;
    alone.dgamma = t_ref(run, R_DGAMMA_ALONE);
    alone.skip = OP_ACT_NONE;
    alone.amax = OP_REF_NONE;
    uint32_t alone_op = p->op_count;
    RIG_OK(op_rmsnorm_backward(p, "rmsnorm_bwd_dgamma", c->rows, c->cols, t_tensor(run, R_X),
                               t_tensor(run, R_GAMMA), t_ref(run, R_INV), t_tensor(run, R_DY),
                               &alone));
    CHECK(p->op_count == alone_op + 2 && p->ops[alone_op].kernel == KERNEL_RMSNORM_DGAMMA_PARTIAL,
          "%s: dgamma alone appended %u ops, the first kernel %d", c->name,
          p->op_count - alone_op, p->ops[alone_op].kernel);
    // The forward kernel: the row in registers for BF16 x and for FP32 x of half the columns,
    // whatever y's type.
    uint32_t y_cols_max = c->in_dtype == T_BF16 ? QT_RMSNORM_REGS_COLS_MAX
                                                : QT_RMSNORM_REGS_COLS_MAX_F32;
    bool y_regs = c->cols % 8 == 0 && c->cols <= y_cols_max && c->misalign % 16 == 0;
    CHECK(p->ops[y_op].kernel == (y_regs ? KERNEL_RMSNORM_FWD_REGS : KERNEL_RMSNORM_FWD),
          "%s: forward kernel %d, the row in registers expected: %d", c->name,
          p->ops[y_op].kernel, y_regs);
}

static void t_build_residual(t_run *run, const t_case *c) {
    uint64_t n = (uint64_t)c->rows * c->cols;
    bool sp = c->flags & T_SPECIAL;
    t_buf_add(run, S_X, "x", c->in_dtype, n, c->misalign);
    t_buf_add(run, S_F, "f", c->out_dtype, n, c->misalign);
    t_buf_add(run, S_Y, "y", c->out_dtype, n, c->misalign);
    t_buf_add(run, S_DY, "dy", c->out_dtype, n, c->misalign);
    t_buf_add(run, S_DX, "dx", c->in_dtype, n, c->misalign);
    t_buf_add(run, S_DX_ACC, "dx_acc", c->in_dtype, n, c->misalign);
    t_buf_add(run, S_Y_AMAX, "y_amax", T_F32, 1, 0);
    t_fill(run, S_X, c->seed, c->scale, 0, sp);
    t_fill(run, S_F, c->seed + 1, c->scale, 0, sp);
    t_fill(run, S_DY, c->seed + 2, 1.0, 0, sp);
    t_fill(run, S_DX_ACC, c->seed + 3, 1.0, 0, false);
    program *p = &run->r.prog;
    RIG_OK(op_residual_forward(p, "residual_fwd", n, t_tensor(run, S_X), t_tensor(run, S_F),
                               t_tensor(run, S_Y), t_ref(run, S_Y_AMAX)));
    RIG_OK(op_residual_backward(p, "residual_bwd", n, t_tensor(run, S_DY), t_tensor(run, S_DX),
                                false));
    RIG_OK(op_residual_backward(p, "residual_bwd_acc", n, t_tensor(run, S_DY),
                                t_tensor(run, S_DX_ACC), true));
}

// ---------------------------------------------------------------------------------------------
// Either form of a loss appended by hand (op_xent and op_mse pick one by the shape), so that
// both run on the same inputs: their results must be identical.

static const launch_shape t_one_block = {{1, 1, 1}, {QT_ACT_THREADS, 1, 1}, 0};

static launch_shape t_row_shape(uint32_t blocks) {
    return (launch_shape){{blocks, 1, 1}, {QT_ACT_THREADS, 1, 1}, 0};
}

static uint32_t t_row_blocks(uint32_t rows) {
    return (rows + QT_ACT_ROWS_PER_BLOCK - 1) / QT_ACT_ROWS_PER_BLOCK;
}

// Declares slot's buffer for an op's args field, when the case has the buffer.
static void t_use(t_run *run, uint32_t op, size_t field, uint32_t slot, prog_access access) {
    if (run->slot[slot] == T_NONE) return;
    RIG_OK(prog_use(&run->r.prog, op, (uint32_t)field, t_ref(run, slot), access));
}

// The args of a case's loss ops (addresses left to prog_use), shared by both forms.
static xent_args t_xent_args(const t_case *c) {
    xent_args args = {0};
    args.rows = c->rows;
    args.classes = c->cols;
    args.blocks = t_row_blocks(c->rows);
    args.logits_dtype = c->in_dtype;
    args.dlogits_dtype = c->out_dtype;
    return args;
}

static mse_args t_mse_args(const t_case *c) {
    mse_args args = {0};
    args.rows = c->rows;
    args.cols = c->cols;
    args.blocks = t_row_blocks(c->rows);
    args.pred_dtype = c->in_dtype;
    args.target_dtype = c->out_dtype;
    args.dpred_dtype = c->out_dtype;
    return args;
}

static void t_xent_split(t_run *run, const t_case *c) {
    program *p = &run->r.prog;
    xent_args args = t_xent_args(c);
    launch_shape rows = t_row_shape(args.blocks);
    uint32_t op;
    RIG_OK(prog_append(p, KERNEL_XENT_COUNT, "count", &t_one_block, &args, sizeof args, &op));
    t_use(run, op, offsetof(xent_args, labels), X_LABELS, PROG_READ);
    t_use(run, op, offsetof(xent_args, stats), X_STATS, PROG_WRITE);
    RIG_OK(prog_append(p, KERNEL_XENT_ROWS, "rows", &rows, &args, sizeof args, &op));
    t_use(run, op, offsetof(xent_args, logits), X_LOGITS, PROG_READ);
    t_use(run, op, offsetof(xent_args, labels), X_LABELS, PROG_READ);
    t_use(run, op, offsetof(xent_args, loss), X_LOSS, PROG_WRITE);
    t_use(run, op, offsetof(xent_args, dlogits), X_DLOGITS, PROG_WRITE);
    t_use(run, op, offsetof(xent_args, dlogits_amax), X_DLOGITS_AMAX, PROG_READ_WRITE);
    t_use(run, op, offsetof(xent_args, partials), X_WS, PROG_WRITE);
    t_use(run, op, offsetof(xent_args, stats), X_STATS, PROG_READ);
    RIG_OK(prog_append(p, KERNEL_XENT_FINAL, "final", &t_one_block, &args, sizeof args, &op));
    t_use(run, op, offsetof(xent_args, partials), X_WS, PROG_READ);
    t_use(run, op, offsetof(xent_args, stats), X_STATS, PROG_READ_WRITE);
}

static void t_xent_one_block(t_run *run, const t_case *c) {
    xent_args args = t_xent_args(c);
    uint32_t op;
    RIG_OK(prog_append(&run->r.prog, KERNEL_XENT_SMALL, "xent", &t_one_block, &args,
                       sizeof args, &op));
    t_use(run, op, offsetof(xent_args, logits), X_LOGITS, PROG_READ);
    t_use(run, op, offsetof(xent_args, labels), X_LABELS, PROG_READ);
    t_use(run, op, offsetof(xent_args, loss), X_LOSS, PROG_WRITE);
    t_use(run, op, offsetof(xent_args, dlogits), X_DLOGITS, PROG_WRITE);
    t_use(run, op, offsetof(xent_args, dlogits_amax), X_DLOGITS_AMAX, PROG_READ_WRITE);
    t_use(run, op, offsetof(xent_args, stats), X_STATS, PROG_WRITE);
}

static void t_mse_one_block(t_run *run, const t_case *c) {
    mse_args args = t_mse_args(c);
    uint32_t op;
    RIG_OK(prog_append(&run->r.prog, KERNEL_MSE_SMALL, "mse", &t_one_block, &args, sizeof args,
                       &op));
    t_use(run, op, offsetof(mse_args, pred), M_PRED, PROG_READ);
    t_use(run, op, offsetof(mse_args, target), M_TARGET, PROG_READ);
    t_use(run, op, offsetof(mse_args, valid_rows), M_VALID, PROG_READ);
    t_use(run, op, offsetof(mse_args, dpred), M_DPRED, PROG_WRITE);
    t_use(run, op, offsetof(mse_args, dpred_amax), M_DPRED_AMAX, PROG_READ_WRITE);
    t_use(run, op, offsetof(mse_args, stats), M_STATS, PROG_WRITE);
}

static void t_mse_split(t_run *run, const t_case *c) {
    program *p = &run->r.prog;
    mse_args args = t_mse_args(c);
    launch_shape rows = t_row_shape(args.blocks);
    uint32_t op;
    RIG_OK(prog_append(p, KERNEL_MSE_ROWS, "rows", &rows, &args, sizeof args, &op));
    t_use(run, op, offsetof(mse_args, pred), M_PRED, PROG_READ);
    t_use(run, op, offsetof(mse_args, target), M_TARGET, PROG_READ);
    t_use(run, op, offsetof(mse_args, valid_rows), M_VALID, PROG_READ);
    t_use(run, op, offsetof(mse_args, dpred), M_DPRED, PROG_WRITE);
    t_use(run, op, offsetof(mse_args, dpred_amax), M_DPRED_AMAX, PROG_READ_WRITE);
    t_use(run, op, offsetof(mse_args, partials), M_WS, PROG_WRITE);
    RIG_OK(prog_append(p, KERNEL_MSE_FINAL, "final", &t_one_block, &args, sizeof args, &op));
    t_use(run, op, offsetof(mse_args, valid_rows), M_VALID, PROG_READ);
    t_use(run, op, offsetof(mse_args, partials), M_WS, PROG_READ);
    t_use(run, op, offsetof(mse_args, stats), M_STATS, PROG_WRITE);
}

// Labels: class (r * 7 + seed) % classes, except with T_IGNORE every fifth row is -1 and every
// seventh is `classes` (out of range, also ignored).
static void t_build_xent(t_run *run, const t_case *c) {
    uint64_t n = (uint64_t)c->rows * c->cols;
    t_buf_add(run, X_LOGITS, "logits", c->in_dtype, n, c->misalign);
    t_buf_add(run, X_LABELS, "labels", T_I32, c->rows, c->misalign);
    t_buf_add(run, X_LOSS, "loss", T_F32, c->rows, c->misalign);
    if (!(c->flags & T_NO_GRAD)) {
        t_buf_add(run, X_DLOGITS, "dlogits", c->out_dtype, n, c->misalign);
        t_buf_add(run, X_DLOGITS_AMAX, "dlogits_amax", T_F32, 1, 0);
    }
    bool split = c->flags & T_SPLIT, one_block = c->flags & T_ONE_BLOCK;
    uint64_t ws_bytes = split ? t_row_blocks(c->rows) * 8ull
                        : one_block ? 0 : op_xent_workspace_bytes(c->rows, c->cols);
    if (ws_bytes) t_buf_add(run, X_WS, "workspace", T_U32, ws_bytes / 4, 0);
    t_buf_add(run, X_STATS, "stats", T_U32, 4, c->misalign);
    t_fill(run, X_LOGITS, c->seed, c->scale, 0, c->flags & T_SPECIAL);
    int32_t *labels = malloc(c->rows * sizeof *labels);
    for (uint32_t r = 0; r < c->rows; r++) {
        labels[r] = (int32_t)((r * 7u + c->seed) % c->cols);
        if ((c->flags & T_IGNORE) && r % 5 == 1) labels[r] = -1;
        if ((c->flags & T_IGNORE) && r % 7 == 3) labels[r] = (int32_t)c->cols;
    }
    t_set_words(run, X_LABELS, labels);
    free(labels);
    if (split || one_block) {
        (split ? t_xent_split : t_xent_one_block)(run, c);
        return;
    }
    RIG_OK(op_xent(&run->r.prog, "xent", c->rows, c->cols, t_tensor(run, X_LOGITS),
                   t_ref(run, X_LABELS), t_ref(run, X_LOSS), t_tensor(run, X_DLOGITS),
                   t_ref(run, X_DLOGITS_AMAX), t_ref(run, X_WS), t_ref(run, X_STATS)));
}

// With T_IGNORE the valid-row count on the device is about two thirds of the rows.
static void t_build_mse(t_run *run, const t_case *c) {
    uint64_t n = (uint64_t)c->rows * c->cols;
    bool sp = c->flags & T_SPECIAL;
    t_buf_add(run, M_PRED, "pred", c->in_dtype, n, c->misalign);
    t_buf_add(run, M_TARGET, "target", c->out_dtype, n, c->misalign);
    if (c->flags & T_IGNORE) t_buf_add(run, M_VALID, "valid_rows", T_U32, 1, c->misalign);
    if (!(c->flags & T_NO_GRAD)) {
        t_buf_add(run, M_DPRED, "dpred", c->out_dtype, n, c->misalign);
        t_buf_add(run, M_DPRED_AMAX, "dpred_amax", T_F32, 1, 0);
    }
    bool split = c->flags & T_SPLIT, one_block = c->flags & T_ONE_BLOCK;
    uint64_t ws_bytes = split ? t_row_blocks(c->rows) * 4ull
                        : one_block ? 0 : op_mse_workspace_bytes(c->rows, c->cols);
    if (ws_bytes) t_buf_add(run, M_WS, "workspace", T_F32, ws_bytes / 4, 0);
    t_buf_add(run, M_STATS, "stats", T_U32, 4, c->misalign);
    t_fill(run, M_PRED, c->seed, c->scale, 0, sp);
    t_fill(run, M_TARGET, c->seed + 1, c->scale, 0.25, sp);
    if (c->flags & T_IGNORE) {
        uint32_t valid = c->rows - c->rows / 3;
        t_set_words(run, M_VALID, &valid);
    }
    if (split || one_block) {
        (split ? t_mse_split : t_mse_one_block)(run, c);
        return;
    }
    RIG_OK(op_mse(&run->r.prog, "mse", c->rows, c->cols, t_tensor(run, M_PRED),
                  t_tensor(run, M_TARGET), t_ref(run, M_VALID), t_tensor(run, M_DPRED),
                  t_ref(run, M_DPRED_AMAX), t_ref(run, M_WS), t_ref(run, M_STATS)));
}

// FP32 regions of rows, cols, rows * cols and 1 + seed % 5 elements, then small ones of 1 to 37.
static void t_gnorm_counts(const t_case *c, uint64_t counts[T_GNORM_REGIONS]) {
    counts[0] = c->rows;
    counts[1] = c->cols;
    counts[2] = (uint64_t)c->rows * c->cols;
    counts[3] = 1 + c->seed % 5;
    for (uint32_t i = 4; i < T_GNORM_REGIONS; i++) counts[i] = 1 + (c->seed * i) % 37;
}

// Regions 1 and 9 are a GEMM's norm units (ptx/gemm.h): counts[i] sums, then as many flags.
static bool t_gnorm_units(uint32_t region) { return region == 1 || region == 9; }

// A units region's sums (magnitudes of the case's values) and flags (with T_SPECIAL, unit
// count / 2 of region 9 flags a non-finite element).
static void t_fill_units(t_run *run, const t_case *c, uint32_t region, uint64_t count) {
    float *v = t_values(count, c->seed + region, c->scale, 0, false);
    uint32_t *words = calloc(2 * count, 4);
    for (uint64_t i = 0; i < count; i++) {
        float sum = fabsf(v[i]);
        memcpy(&words[i], &sum, 4);
    }
    if ((c->flags & T_SPECIAL) && region == 9) words[count + count / 2] = 1;
    t_set_words(run, G_R0 + region, words);
    free(words);
    free(v);
}

static void t_build_gnorm(t_run *run, const t_case *c) {
    uint64_t counts[T_GNORM_REGIONS];
    t_gnorm_counts(c, counts);
    static char names[T_GNORM_REGIONS][16];
    prog_ref grads[T_GNORM_REGIONS];
    bool units[T_GNORM_REGIONS];
    for (uint32_t i = 0; i < T_GNORM_REGIONS; i++) {
        snprintf(names[i], sizeof names[i], "grad%u", i);
        units[i] = t_gnorm_units(i);
        if (units[i]) {
            t_buf_add(run, G_R0 + i, names[i], T_U32, 2 * counts[i], 0);
            t_fill_units(run, c, i, counts[i]);
        } else {
            t_buf_add(run, G_R0 + i, names[i], T_F32, counts[i], c->misalign);
            t_fill(run, G_R0 + i, c->seed + i, c->scale, 0, (c->flags & T_SPECIAL) && i == 2);
        }
        grads[i] = t_ref(run, G_R0 + i);
    }
    t_buf_add(run, G_WS, "workspace", T_U32,
              op_grad_norm_workspace_bytes(T_GNORM_REGIONS, counts) / 4, 0);
    t_buf_add(run, G_TICKET, "ticket", T_U32, 1, 0);
    t_buf_add(run, G_OUT, "result", T_U32, 4, c->misalign);
    float clip = (float)c->op;  // the case's op field carries the clip norm
    op_gnorm_set set = {.regions = T_GNORM_REGIONS, .grads = grads, .counts = counts,
                        .clip = clip, .workspace = t_ref(run, G_WS),
                        .ticket = t_ref(run, G_TICKET), .out = t_ref(run, G_OUT),
                        .units = units};
    RIG_OK(op_grad_norm_part(&run->r.prog, "grad_norm", &set, 0, T_GNORM_REGIONS, true));
}

static void t_build(t_run *run, const t_case *c) {
    switch (c->kind) {
    case T_KIND_ACT: t_build_act(run, c); break;
    case T_KIND_RMSNORM: t_build_rmsnorm(run, c); break;
    case T_KIND_RESIDUAL: t_build_residual(run, c); break;
    case T_KIND_XENT: t_build_xent(run, c); break;
    case T_KIND_MSE: t_build_mse(run, c); break;
    default: t_build_gnorm(run, c); break;
    }
    rig_bind(&run->r);
}

// Builds and runs case c on the reference backend.
static t_run *t_ref_run(const t_case *c) {
    t_run *run = calloc(1, sizeof *run);
    t_run_open(run, BACKEND_REF);
    t_build(run, c);
    t_run_exec(run, NULL);
    return run;
}

static void t_ref_free(t_run *run) {
    t_run_close(run);
    free(run);
}

// ---------------------------------------------------------------------------------------------
// Comparison with a bound.

// Adds the rounding of an output to its storage dtype to an FP32 error bound.
static double t_tol_store(double tol, double want, uint32_t dtype) {
    if (dtype != T_BF16) return tol;
    return tol + T_U_BF16 * (fabs(want) + tol) + 0x1p-133;
}

static void t_close(const char *what, uint64_t i, double got, double want, double tol) {
    bool ok = got == want || fabs(got - want) <= tol || (isnan(got) && isnan(want));
    CHECK(ok, "%s[%llu]: got %.9g (%08x), want %.12g, |error| %.3g > bound %.3g", what,
          (unsigned long long)i, got, t_b((float)got), want, fabs(got - want), tol);
}

// Central difference of f at v in double, with a step that keeps truncation (h^2 f''' / 6) and
// cancellation (1e-16 |f| / h) below 1e-9 relative for the smooth functions tested here.
static double t_fd(double (*f)(double), double v) {
    double h = 1e-5 * (fabs(v) > 1 ? fabs(v) : 1);
    return (f(v + h) - f(v - h)) / (2 * h);
}

// ---------------------------------------------------------------------------------------------
// Activations: double references and error bounds.

#define T_GELU_K0 0.79788456080286535588  // sqrt(2/pi)
#define T_GELU_K1 0.044715

static double t_gelu_arg(double v) { return T_GELU_K0 * (v + T_GELU_K1 * v * v * v); }

// In double through the logistic form x / (1 + exp(-2u)), u the tanh argument: it is the same
// function, and 1 + tanh(u) would cancel for negative x even in double.
static double t_gelu(double v) { return v / (1 + exp(-2 * t_gelu_arg(v))); }

static double t_gelu_grad(double v) {
    double s = 1 / (1 + exp(-2 * t_gelu_arg(v)));
    return s + 2 * v * T_GELU_K0 * (1 + 3 * T_GELU_K1 * v * v) * s * (1 - s);
}

static double t_silu(double v) { return v / (1 + exp(-v)); }

static double t_sigmoid(double v) { return 1 / (1 + exp(-v)); }

static double t_silu_grad(double v) {
    double s = t_sigmoid(v);
    return s * (1 + v * (1 - s));
}

// GELU forward, y = x / d, d = 1 + e, e = exp(z), z = -2u. The kernel's z' = z (1 + dz) with
// |dz| <= 6u (x^2, x^3, the fma, and the roundings of -2 k0, k1 and of the product; x and
// 0.044715 x^3 have the same sign, so nothing cancels), so e' = e exp(z' - z) (1 + 2u) errs by
// de <= 6u |z| + 2u relatively; d by om de + u (om = e / d = 1 - s); the division adds u:
// |y' - y| <= |y| (om de + 2u). Bound: twice that. Where e overflows (x below about -10.05)
// y is -0 while |y| < |x| 2^-127: that much absolute slack.
static double t_gelu_err(double v, double *de, double *om) {
    double z = -2 * t_gelu_arg(v), e = exp(z);
    *de = 6 * T_U * fabs(z) + 2 * T_U;
    *om = isinf(e) ? 1 : e / (1 + e);
    return *om * *de + T_U;  // relative error of d
}

static double t_gelu_tol(double v) {
    double de, om, dd = t_gelu_err(v, &de, &om);
    return 2 * fabs(t_gelu(v)) * (dd + T_U) + fabs(v) * 0x1p-127 + T_TINY;
}

// GELU derivative g = s fma(w, om, 1), s = 1 / d, om = e s, w = 2 x du, du = k0 (1 + 3 k1 x^2):
// s errs by dd + u, om by de + dd + 2u, w by 6u (x^2, the fma with 3 k1's rounding, k0, the
// products); the fma by |w om| (dw + dom) + u |1 + w om|, the last product by u:
// |g' - g| <= |g| (dd + 2u) + s (|w om| (dw + dom) + u |1 + w om|). Bound: twice that, with the
// overflow slack as above ((1 + |w|) 2^-127).
static double t_gelu_grad_tol(double v) {
    double de, om, dd = t_gelu_err(v, &de, &om);
    double s = 1 - om, w = 2 * v * T_GELU_K0 * (1 + 3 * T_GELU_K1 * v * v);
    double dom = de + dd + 2 * T_U, dw = 6 * T_U;
    double bound = fabs(t_gelu_grad(v)) * (dd + 2 * T_U) +
                   s * (fabs(w * om) * (dw + dom) + T_U * fabs(1 + w * om));
    return 2 * bound + (1 + fabs(w)) * 0x1p-127 + T_TINY;
}

// SiLU forward: e = exp(-|x|) within 2u, d = 1 + e within 2u of d, then x / d (x >= 0: 3u) or
// (x e) / d (x < 0: 6u): twice 6u |y|. Below x = -87.3 e^x is subnormal and below -104 it
// underflows to 0 (qt_expf): an absolute error of at most 2^-149 in e (and in s), so |x| 2^-149
// more in y (and (1 + |x|) 2^-149 in the derivative g below).
static double t_silu_tol(double v) {
    return 12 * T_U * fabs(t_silu(v)) + fabs(v) * 0x1p-149 + T_TINY;
}

// SiLU derivative g = s fma(x, om, 1), om = 1 - s: x >= 0: s = 1/d within 3u, om = e/d within
// 5u; x < 0: s within 5u, om within 3u. The fma errs by |x| om 5u + u |1 + x om|, the product by
// u: |g' - g| <= u (7 |g| + 5 s |x| om). Bound: twice that (x om cancels against 1 near -1.28).
static double t_silu_grad_tol(double v) {
    double s = t_sigmoid(v), om = 1 - s;
    return 2 * T_U * (7 * fabs(t_silu_grad(v)) + 5 * s * fabs(v) * om) +
           (1 + fabs(v)) * 0x1p-149 + T_TINY;
}

static double t_act_ref(uint32_t act, double v) {
    if (act == QT_ACT_GELU) return t_gelu(v);
    if (act == QT_ACT_SILU) return t_silu(v);
    return v <= 0 ? 0 : v;
}

static double t_act_grad_ref(uint32_t act, double v) {
    if (act == QT_ACT_GELU) return t_gelu_grad(v);
    if (act == QT_ACT_SILU) return t_silu_grad(v);
    return v <= 0 ? 0 : 1;
}

static double t_act_tol(uint32_t act, double v) {
    if (act == QT_ACT_GELU) return t_gelu_tol(v);
    if (act == QT_ACT_SILU) return t_silu_tol(v);
    return 0;  // ReLU is exact
}

static double t_act_grad_tol(uint32_t act, double v) {
    if (act == QT_ACT_GELU) return t_gelu_grad_tol(v);
    if (act == QT_ACT_SILU) return t_silu_grad_tol(v);
    return 0;
}

// The double derivative against a central difference (FD error below 1e-9 relative, see t_fd).
static void t_check_fd(const char *what, uint64_t i, double (*f)(double), double v, double g) {
    double fd = t_fd(f, v);
    CHECK(fabs(fd - g) <= 1e-7 * (1 + fabs(g)), "%s[%llu]: d/dx at %.9g: analytic %.12g, "
          "finite difference %.12g", what, (unsigned long long)i, v, g, fd);
}

static double (*t_act_fn(uint32_t act))(double) {
    return act == QT_ACT_GELU ? t_gelu : act == QT_ACT_SILU ? t_silu : NULL;
}

// The pre-activation the kernel sees: RN(x + bias) in FP32.
static float t_act_pre(t_run *run, const t_case *c, uint64_t i, uint64_t col) {
    float v = t_in(run, A_X, i);
    return (c->flags & T_BIAS) ? v + t_in(run, A_BIAS, col) : v;
}

// The amax an op merged for its output (slot `out`, its first n elements) from +0 is
// max |stored value|, NaN skipped, -0 as +0: the bits a separate qt_fp8_amax pass would give.
// Nothing to check when the case has no such output.
static void t_check_amax(t_run *run, uint32_t out, uint32_t amax, uint64_t n) {
    if (run->slot[amax] == T_NONE) return;
    float m = 0.0f;
    for (uint64_t i = 0; i < n; i++) {
        float v = fabsf(t_out(run, out, i));
        if (v > m) m = v;
    }
    float got = t_out(run, amax, 0);
    CHECK(t_b(got) == t_b(m), "%s: amax %a (%08x), want %a (%08x)", t_slot(run, amax)->name, got,
          t_b(got), m, t_b(m));
}

// The activations' amaxes (y of ny elements, dx of nx).
static void t_check_amaxes(t_run *run, uint64_t ny, uint64_t nx) {
    t_check_amax(run, A_Y, A_Y_AMAX, ny);
    t_check_amax(run, A_DX, A_DX_AMAX, nx);
}

static void t_check_act(t_run *run, const t_case *c) {
    uint64_t n = (uint64_t)c->rows * c->cols;
    for (uint64_t i = 0; i < n; i++) {
        float v = t_act_pre(run, c, i, i % c->cols);
        double y = t_act_ref(c->op, v), g = t_act_grad_ref(c->op, v);
        double dy = t_in(run, A_DY, i), dx = dy * g;
        if (t_act_fn(c->op) && i < 4096) t_check_fd("act'", i, t_act_fn(c->op), v, g);
        double tol_y = t_tol_store(t_act_tol(c->op, v), y, c->out_dtype);
        double tol_dx = fabs(dy) * t_act_grad_tol(c->op, v) + T_U * fabs(dx);
        t_close("y", i, t_out(run, A_Y, i), y, tol_y);
        t_close("dx", i, t_out(run, A_DX, i), dx, t_tol_store(tol_dx, dx, c->out_dtype));
    }
    t_check_amaxes(run, n, n);
}

// SwiGLU: y = RN(silu(a) b): |b| tol_silu(a) + u |y|; da = RN(RN(dy b) g): |dy b| tol_g + 2u
// |da|; db = RN(dy silu(a)): |dy| tol_silu + u |db|.
static void t_check_swiglu(t_run *run, const t_case *c) {
    uint32_t h = c->cols / 2;
    for (uint64_t r = 0; r < c->rows; r++) {
        for (uint32_t j = 0; j < h; j++) {
            uint64_t ia = r * c->cols + j, ib = ia + h, iy = r * h + j;
            float a = t_act_pre(run, c, ia, j), b = t_act_pre(run, c, ib, h + j);
            double dy = t_in(run, A_DY, iy);
            double y = t_silu(a) * b, da = dy * b * t_silu_grad(a), db = dy * t_silu(a);
            if (iy < 4096) t_check_fd("silu'", iy, t_silu, a, t_silu_grad(a));
            double tol_y = fabs(b) * t_silu_tol(a) + T_U * fabs(y) + T_TINY;
            double tol_da = fabs(dy * b) * t_silu_grad_tol(a) + 2 * T_U * fabs(da) + T_TINY;
            double tol_db = fabs(dy) * t_silu_tol(a) + T_U * fabs(db) + T_TINY;
            t_close("y", iy, t_out(run, A_Y, iy), y, t_tol_store(tol_y, y, c->out_dtype));
            t_close("da", ia, t_out(run, A_DX, ia), da, t_tol_store(tol_da, da, c->out_dtype));
            t_close("db", ib, t_out(run, A_DX, ib), db, t_tol_store(tol_db, db, c->out_dtype));
        }
    }
    t_check_amaxes(run, (uint64_t)c->rows * h, (uint64_t)c->rows * c->cols);
}

static const uint32_t t_shapes[][2] = {{1, 1}, {1, 10}, {257, 3}, {13, 1009}, {31, 97},
                                       {64, 256}, {7, 9}};
#define T_SHAPES_COUNT (sizeof t_shapes / sizeof t_shapes[0])

static void test_act_accuracy(void) {
    static const char *names[3] = {"relu", "gelu", "silu"};
    for (uint32_t act = QT_ACT_RELU; act <= QT_ACT_SILU; act++) {
        char name[64];
        snprintf(name, sizeof name, "act_%s_matches_double_reference", names[act]);
        test_begin(name);
        for (uint32_t s = 0; s < T_SHAPES_COUNT; s++) {
            for (uint32_t variant = 0; variant < 4; variant++) {
                // variants: f32 -> f32, bf16 -> f32 with bias, f32 -> bf16, f32 wide range
                t_case c = {"", T_KIND_ACT, act, t_shapes[s][0], t_shapes[s][1],
                            variant == 1 ? T_BF16 : T_F32, variant == 2 ? T_BF16 : T_F32,
                            variant == 1 ? T_BIAS : 0, 0, 11 + s * 4 + variant,
                            variant == 3 ? 12.0 : 2.5};
                t_run *run = t_ref_run(&c);
                t_check_act(run, &c);
                t_ref_free(run);
            }
        }
        test_end();
    }
}

static void test_swiglu_accuracy(void) {
    test_begin("swiglu_matches_double_reference");
    static const uint32_t shapes[][2] = {{1, 2}, {1, 10}, {257, 6}, {13, 1010}, {64, 512}};
    for (uint32_t s = 0; s < 5; s++) {
        for (uint32_t variant = 0; variant < 3; variant++) {
            t_case c = {"", T_KIND_ACT, QT_ACT_SWIGLU, shapes[s][0], shapes[s][1],
                        variant == 1 ? T_BF16 : T_F32, variant == 2 ? T_BF16 : T_F32,
                        variant == 1 ? T_BIAS : 0, 0, 101 + s * 3 + variant, 3.0};
            t_run *run = t_ref_run(&c);
            t_check_swiglu(run, &c);
            t_ref_free(run);
        }
    }
    test_end();
}

// A 1 x n activation program on given inputs (F32 in; dy given or 1).
static t_run *t_act_values(uint32_t act, const float *x, const float *dy, uint32_t n,
                           uint32_t out_dtype, t_case *c) {
    *c = (t_case){"", T_KIND_ACT, act, 1, n, T_F32, out_dtype, 0, 0, 1, 1.0};
    t_run *run = calloc(1, sizeof *run);
    t_run_open(run, BACKEND_REF);
    t_build_act(run, c);
    float *ones = malloc(n * sizeof *ones);
    for (uint32_t i = 0; i < n; i++) ones[i] = dy ? dy[i] : 1.0f;
    t_set(run, A_X, x);
    t_set(run, A_DY, ones);
    free(ones);
    rig_bind(&run->r);
    t_run_exec(run, NULL);
    return run;
}

static void test_act_special_values(void) {
    test_begin("act_special_values_exact");
    // Inputs: +0, -0, +Inf, -Inf, NaN, -NaN with payload, 1e30, -1e30; dy = 1. Expected bits of
    // y and dx (NaN results are the canonical 0x7FFFFFFF). The limits at +-Inf are the
    // functions' limits; large finite inputs reach them by the same arithmetic.
    static const uint32_t x_bits[8] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u,
                                       0x7FC00000u, 0xFFC00001u, 0x7149F2CAu, 0xF149F2CAu};
    static const uint32_t want[3][2][8] = {
        {{0, 0, 0x7F800000u, 0, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7149F2CAu, 0},  // relu
         {0, 0, 0x3F800000u, 0, 0x3F800000u, 0x3F800000u, 0x3F800000u, 0}},
        {{0, 0x80000000u, 0x7F800000u, 0x80000000u, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7149F2CAu,
          0x80000000u},  // gelu
         {0x3F000000u, 0x3F000000u, 0x3F800000u, 0x80000000u, 0x7FFFFFFFu, 0x7FFFFFFFu,
          0x3F800000u, 0x80000000u}},
        {{0, 0x80000000u, 0x7F800000u, 0x80000000u, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7149F2CAu,
          0x80000000u},  // silu
         {0x3F000000u, 0x3F000000u, 0x3F800000u, 0x80000000u, 0x7FFFFFFFu, 0x7FFFFFFFu,
          0x3F800000u, 0x80000000u}},
    };
    float x[8];
    for (int i = 0; i < 8; i++) x[i] = t_f(x_bits[i]);
    for (uint32_t act = QT_ACT_RELU; act <= QT_ACT_SILU; act++) {
        t_case c;
        t_run *run = t_act_values(act, x, NULL, 8, T_F32, &c);
        for (int i = 0; i < 8; i++) {
            uint32_t y = t_b(t_out(run, A_Y, i)), dx = t_b(t_out(run, A_DX, i));
            CHECK(y == want[act][0][i], "act %u y(%08x) = %08x, want %08x", act, x_bits[i], y,
                  want[act][0][i]);
            CHECK(dx == want[act][1][i], "act %u dx(%08x) = %08x, want %08x", act, x_bits[i],
                  dx, want[act][1][i]);
        }
        t_ref_free(run);
    }
    // ReLU's backward selects: dy = Inf or NaN where x <= 0 gives +0; GELU passes NaN dy on.
    float xs[4] = {-1.0f, -0.0f, 2.0f, 1.0f};
    float dys[4] = {t_f(0x7F800000u), t_f(0x7FC00000u), t_f(0xFF800000u), t_f(0x7FC00000u)};
    t_case c;
    t_run *run = t_act_values(QT_ACT_RELU, xs, dys, 4, T_BF16, &c);
    const uint16_t *dx16 = (const uint16_t *)t_slot(run, A_DX)->out;
    CHECK(dx16[0] == 0 && dx16[1] == 0 && dx16[2] == 0xFF80 && dx16[3] == QT_BF16_NAN,
          "relu dx bf16 %04x %04x %04x %04x", dx16[0], dx16[1], dx16[2], dx16[3]);
    t_ref_free(run);
    // BF16 stores: NaN of either sign -> 0x7FFF, -0 kept, 1e30 rounded to nearest even.
    run = t_act_values(QT_ACT_SILU, x, NULL, 8, T_BF16, &c);
    const uint16_t *y16 = (const uint16_t *)t_slot(run, A_Y)->out;
    CHECK(y16[1] == 0x8000 && y16[4] == QT_BF16_NAN && y16[5] == QT_BF16_NAN &&
              y16[6] == qt_f32_to_bf16(1e30f), "silu y bf16 %04x %04x %04x %04x", y16[1],
          y16[4], y16[5], y16[6]);
    t_ref_free(run);
    test_end();
}

// The reference backend runs GELU's forward and backward over chunks of elements, vectorized in
// its x86-64-v3 clone: every element must have the bits of the scalar functions (this file's
// own calls, compiled without vectors), over samples of every exponent and sign, NaNs, Infs,
// subnormals and the inputs around tanh's cut-offs, with dy of every kind, in a count that
// leaves a partial chunk.
static void test_gelu_chunks_scalar(void) {
    test_begin("gelu_chunked_twin_matches_scalar_functions");
    enum { n = 70001 };
    static float x[n], dy[n];
    static const float edges[] = {0.55f, 9.02f, 0x1p-12f, 4.51f, 0.0f};
    uint64_t state = 5;
    for (uint32_t i = 0; i < n; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(state >> 32);
        x[i] = i % 3 ? t_f(r) : ldexpf((float)(r % 20001) / 2000.0f - 5.0f, (int)(r % 7) - 3);
        float nudge = 1.0f + (float)(r % 9) * 0x1p-23f;  // a few ulps past the edge
        if (i % 11 == 0) x[i] = edges[i % 5] * (i % 2 ? -1.0f : 1.0f) * nudge;
        dy[i] = i % 13 ? t_f(0x3F000000u + (r & 0x00FFFFFFu)) : t_f(r);
    }
    t_case c;
    t_run *run = t_act_values(QT_ACT_GELU, x, dy, n, T_F32, &c);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t y = t_b(t_out(run, A_Y, i)), dx = t_b(t_out(run, A_DX, i));
        uint32_t want_y = t_b(qt_act_canonical(qt_act_gelu(x[i])));
        uint32_t want_dx = t_b(qt_act_canonical(dy[i] * qt_act_gelu_grad(x[i])));
        if ((y != want_y || dx != want_dx) && bad++ < 8) {
            CHECK(false, "x %08x dy %08x: y %08x dx %08x, scalar %08x %08x", t_b(x[i]),
                  t_b(dy[i]), y, dx, want_y, want_dx);
        }
    }
    CHECK(bad == 0, "%u elements differ", bad);
    t_ref_free(run);
    test_end();
}

// The table kernels' entries (ptx/act.h, QT_ACT_LUT_*): every BF16 value of the 16 binades
// [2^-12, 2^4) of either sign has its own entry, whose input is that value; every other one
// (zeros, subnormals, smaller and larger magnitudes, Inf, NaN) has none.
static void test_act_lut_entries(void) {
    test_begin("act_table_entries_cover_their_binades_once");
    static uint8_t seen[QT_ACT_LUT_ENTRIES];
    memset(seen, 0, sizeof seen);
    uint32_t inside = 0, bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float v = t_f(b << 16);
        float magnitude = fabsf(v);
        bool want = magnitude >= 0x1p-12f && magnitude < 0x1p4f;  // false for NaN
        uint32_t e = qt_act_lut_entry(v);
        bool got = e < QT_ACT_LUT_ENTRIES;
        if (got != want || (got && (seen[e]++ || t_b(qt_act_lut_input(e)) != b << 16))) {
            if (bad++ < 6) CHECK(false, "bf16 %04x: entry %u", b, e);
        }
        inside += got;
    }
    CHECK(bad == 0 && inside == QT_ACT_LUT_ENTRIES, "%u wrong, %u inside of %u", bad, inside,
          QT_ACT_LUT_ENTRIES);
    test_end();
}

// qt_act_lut_pair (two inputs an operation: the kernels' chunk test and lookups) against
// qt_act_lut_entry one input at a time: the test bits are zero iff both inputs have an entry,
// and then the byte offsets are 4 x the two entries. Every BF16 value in each half, against
// every 61st value in the other (each residue of 61 in turn, so every value meets values of
// every magnitude on both sides of the borrow from the low half into the high one).
static void test_act_lut_pairs(void) {
    test_begin("act_table_pairs_equal_single_entries");
    uint64_t bad = 0, checked = 0;
    for (uint32_t a = 0; a < 65536; a++) {
        uint32_t e_a = qt_act_lut_entry(t_f(a << 16));
        for (uint32_t b = a % 61u; b < 65536; b += 61u) {
            uint32_t e_b = qt_act_lut_entry(t_f(b << 16));
            bool both = e_a < QT_ACT_LUT_ENTRIES && e_b < QT_ACT_LUT_ENTRIES;
            for (int order = 0; order < 2; order++) {
                uint32_t lo = order ? b : a, hi = order ? a : b;
                uint32_t e_lo = order ? e_b : e_a, e_hi = order ? e_a : e_b;
                uint32_t bytes = 0;
                uint32_t test = qt_act_lut_pair(lo | hi << 16, &bytes);
                bool ok = (test == 0) == both && (!both || bytes == (4 * e_lo | 4 * e_hi << 16));
                if (!ok && bad++ < 6) {
                    CHECK(false, "halves %04x %04x: test %08x bytes %08x, entries %u %u", lo, hi,
                          test, bytes, e_lo, e_hi);
                }
                checked++;
            }
        }
    }
    CHECK(bad == 0, "%llu of %llu pairs wrong", (unsigned long long)bad,
          (unsigned long long)checked);
    test_end();
}

// qt_act_amax_from_max (ptx/act_math.h) over every BF16 input, in the order of their values from
// -Inf to +Inf: the two facts it rests on (the negative lobe's depth is the constant, reached at
// its stated input; f is >= +0 and nondecreasing from +0 on) and its claim itself: wherever it
// answers for x_max, its y is the largest |f(x)| over every non-NaN x <= x_max (NaN outputs
// skipped, as an amax skips them), bit for bit. Its answer must also come for every input from
// the lobe's depth on (where trained pre-activations' maxima lie), and never for ReLU.
static void test_act_amax_from_max(void) {
    test_begin("act_amax_from_max_is_the_amax_of_every_smaller_input");
    static const struct {
        uint32_t act;
        float depth;
        uint32_t depth_at;  // BF16 bits of the input where |f| reaches the depth
    } acts[] = {{QT_ACT_GELU, QT_ACT_GELU_NEG_AMAX, 0xBF41u},
                {QT_ACT_SILU, QT_ACT_SILU_NEG_AMAX, 0xBFA4u}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        uint32_t act = acts[i].act, bad = 0, answers = 0;
        float deepest = 0.0f, prefix = 0.0f, previous = 0.0f, y;
        // Negative inputs from -Inf (0xFF80) up to -0 (0x8000), then +0 up to +Inf (0x7F80).
        for (int32_t step = -0x7F80; step <= 0x7F80; step++) {
            uint32_t bits = step < 0 ? 0x8000u | (uint32_t)(-step) : (uint32_t)step;
            if (step == 0) bits = 0x8000u;  // -0 first, then +0 below
            for (int zero = 0; zero < (step == 0 ? 2 : 1); zero++) {
                if (zero) bits = 0u;
                float x = t_f(bits << 16), f = qt_act_forward(act, x);
                bool negative = (bits & 0x8000u) != 0;
                if (negative && f == f && fabsf(f) > deepest) deepest = fabsf(f);
                if (!negative && (!(f >= 0.0f) || f < previous)) {
                    if (bad++ < 4) CHECK(false, "act %u: f(%a) = %a after %a", act, x, f, previous);
                }
                if (!negative) previous = f;
                if (f == f && fabsf(f) > prefix) prefix = fabsf(f);
                if (qt_act_amax_from_max(act, x, &y)) {
                    answers++;
                    if (t_b(y) != t_b(prefix) && bad++ < 4) {
                        CHECK(false, "act %u: x_max %a gives %a, the amax is %a", act, x, y,
                              prefix);
                    }
                } else if (!negative && f >= acts[i].depth && bad++ < 4) {
                    CHECK(false, "act %u: no answer for x_max %a, f = %a", act, x, f);
                }
            }
        }
        CHECK(bad == 0, "act %u: %u wrong", act, bad);
        CHECK(t_b(deepest) == t_b(acts[i].depth) &&
                  t_b(fabsf(qt_act_forward(act, t_f(acts[i].depth_at << 16)))) ==
                      t_b(acts[i].depth),
              "act %u: the lobe's depth is %a, the constant %a", act, deepest, acts[i].depth);
        CHECK(answers > 0x3000u, "act %u: %u answers", act, answers);
    }
    CHECK(!qt_act_amax_from_max(QT_ACT_RELU, 100.0f, &(float){0}), "ReLU answered");
    test_end();
}

// Which activations op_act gives the table kernels: GELU and SiLU of a dense BF16 input without
// a bias from 2^21 elements, forward and backward, and SwiGLU's (2^21 outputs, rows of a and b
// of whole 8-element chunks); the flat kernels take everything else.
static void test_act_lut_choice(void) {
    test_begin("act_table_kernels_for_large_bf16_inputs_only");
    static const struct {
        uint32_t act, rows, cols, in, flags;
        bool table;
    } cases[] = {
        {QT_ACT_GELU, 512, 4096, T_BF16, 0, true},
        {QT_ACT_SILU, 2048, 1024, T_BF16, 0, true},
        {QT_ACT_GELU, 4097, 513, T_BF16, 0, true},
        {QT_ACT_GELU, 511, 4096, T_BF16, 0, false},  // one row short of 2^21
        {QT_ACT_GELU, 512, 4096, T_BF16, T_BIAS, false},
        {QT_ACT_GELU, 512, 4096, T_F32, 0, false},
        {QT_ACT_RELU, 512, 4096, T_BF16, 0, false},
        {QT_ACT_SWIGLU, 512, 8192, T_BF16, 0, true},
        {QT_ACT_SWIGLU, 511, 8192, T_BF16, 0, false},  // one row short of 2^21 outputs
        {QT_ACT_SWIGLU, 512, 8192, T_BF16, T_BIAS, false},
        {QT_ACT_SWIGLU, 512, 8192, T_F32, 0, false},
        {QT_ACT_SWIGLU, 512, 8200, T_BF16, 0, false},  // rows of 4100: no whole chunks
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        t_case c = {"choice", T_KIND_ACT, cases[i].act, cases[i].rows, cases[i].cols,
                    cases[i].in, T_BF16, cases[i].flags, 0, 1, 1.0};
        t_run *run = calloc(1, sizeof *run);
        t_run_open(run, BACKEND_REF);
        t_build(run, &c);
        const program *p = &run->r.prog;
        uint32_t fwd = p->op_count - 2, bwd = p->op_count - 1;
        bool swiglu = c.op == QT_ACT_SWIGLU;
        kernel_id want_fwd = cases[i].table ? (swiglu ? KERNEL_SWIGLU_FWD_LUT : KERNEL_ACT_FWD_LUT)
                             : swiglu       ? KERNEL_SWIGLU_FWD
                                            : KERNEL_ACT_FWD;
        kernel_id want_bwd = cases[i].table ? (swiglu ? KERNEL_SWIGLU_BWD_LUT : KERNEL_ACT_BWD_LUT)
                             : swiglu       ? KERNEL_SWIGLU_BWD
                                            : KERNEL_ACT_BWD;
        CHECK(p->ops[fwd].kernel == want_fwd && p->ops[bwd].kernel == want_bwd,
              "case %zu (act %u, %u x %u): kernels %u %u, expected %u %u", i, c.op, c.rows,
              c.cols, p->ops[fwd].kernel, p->ops[bwd].kernel, want_fwd, want_bwd);
        if (cases[i].table) {
            CHECK(p->ops[fwd].shape.block[0] == QT_ACT_LUT_THREADS &&
                      p->ops[fwd].shape.grid[0] == OP_PLAN_SMS,
                  "case %zu: grid %u of %u threads", i, p->ops[fwd].shape.grid[0],
                  p->ops[fwd].shape.block[0]);
        }
        t_run_close(run);
        free(run);
    }
    test_end();
}

// Tiny, huge and range-edge inputs (subnormals, FLT_MAX, exp's and tanh's cut-offs) within the
// same derived bounds as random data.
static void test_act_edge_ranges(void) {
    test_begin("act_tiny_huge_and_cutoff_inputs_within_bounds");
    static const float xs[] = {1e-45f, -1e-45f, 1e-38f, -1e-38f, 1e-20f, -1e-20f, 3e38f, -3e38f,
                               88.0f, -88.0f, 89.5f, -89.5f, 104.5f, -104.5f, 9.0f, -9.0f,
                               4.6f, -4.6f, 0.55f, -0.55f, 0x1p-12f, -0x1p-12f, 1.2785f,
                               -1.2785f, 1e5f, -1e5f, 2.0f, -2.0f};
    uint32_t n = sizeof xs / sizeof xs[0];
    for (uint32_t act = QT_ACT_RELU; act <= QT_ACT_SILU; act++) {
        t_case c;
        t_run *run = t_act_values(act, xs, NULL, n, T_F32, &c);
        t_check_act(run, &c);
        t_ref_free(run);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// RMSNorm.

// Longest sequential chain of one lane's fold plus the five tree levels.
static uint32_t t_row_depth(uint32_t cols) {
    uint32_t chunks = (cols + 7) / 8;
    return (chunks + 31) / 32 * 8 + 5;
}

typedef struct t_rms_row {
    double inv, c, abs_dot, e_inv;
} t_rms_row;

// Double forward of one row: y_j = x_j inv g_j, inv = 1 / sqrt(mean(x^2) + eps).
static double t_rms_inv(const double *x, uint32_t cols, double eps) {
    double ss = 0;
    for (uint32_t j = 0; j < cols; j++) ss += x[j] * x[j];
    return 1 / sqrt(ss / cols + eps);
}

static double t_rms_loss(const double *x, const double *g, const double *dy, uint32_t cols,
                         double eps) {
    double inv = t_rms_inv(x, cols, eps), l = 0;
    for (uint32_t j = 0; j < cols; j++) l += dy[j] * x[j] * inv * g[j];
    return l;
}

// Finite differences of L = sum dy y (double) for row r against the analytic dx (double).
static void t_rms_fd_row(const double *x, const double *g, const double *dy, uint32_t cols,
                         double eps, const double *dx) {
    double *xp = malloc(cols * sizeof *xp), scale = 0;
    memcpy(xp, x, cols * sizeof *xp);
    for (uint32_t j = 0; j < cols; j++) scale += fabs(dy[j] * g[j]) / cols;
    for (uint32_t k = 0; k < cols; k++) {
        // h = 1e-4 of the row's scale (rms, or |x_k| if larger): the double sum L of `cols`
        // terms carries ~cols * 1e-16 of rounding, which must stay small against L's change
        // 2 h dx, and truncation, h^2 L''' / 6, is ~1e-9 relative.
        double rms = 1 / t_rms_inv(x, cols, eps);
        double h = 1e-4 * (fabs(x[k]) > rms ? fabs(x[k]) : rms);
        xp[k] = x[k] + h;
        double lp = t_rms_loss(xp, g, dy, cols, eps);
        xp[k] = x[k] - h;
        double lm = t_rms_loss(xp, g, dy, cols, eps);
        xp[k] = x[k];
        double fd = (lp - lm) / (2 * h), inv = t_rms_inv(x, cols, eps);
        CHECK(fabs(fd - dx[k]) <= 1e-6 * (fabs(dx[k]) + inv * scale), "rmsnorm dx[%u]: "
              "analytic %.12g, finite difference %.12g", k, dx[k], fd);
    }
    free(xp);
}

// Bounds (u = 2^-24, D = t_row_depth): the sum of squares is a chain of at most D roundings of
// non-negative terms, so it errs by <= D u of itself; the mean, + eps, sqrt and reciprocal add
// 4 roundings and sqrt halves the sum's error: inv errs by e_inv = u (D/2 + 4) relative.
//   y = RN(RN(x inv) g): e_inv + 2u relative.
//   c = sum(dxhat xhat) / cols: each term carries e_inv + 2u, the chain D u of the sum of |terms|
//     (A): dc <= u (2 D + 8) A / cols + u |c|.
//   dx = RN(inv RN(dxhat - xhat c)): inv (|xhat| dc + |c xhat| (e_inv + u) + u |dxhat| + u |r|)
//     + |dx| (e_inv + u), r = dxhat - xhat c.
//   dgamma = sum over rows of dy xhat: chains of rows_per_part + parts roundings, each term
//     e_inv + 2u: (u (rows_per_part + parts + 2) + e_inv) M, M = sum |dy xhat|, plus u of the
//     result for the accumulating add.
// Every bound is doubled in the checks.
static void t_check_rmsnorm_row(t_run *run, const t_case *c, uint64_t r, double *dgamma_ref,
                                double *dgamma_abs) {
    uint32_t cols = c->cols;
    double eps = 1e-5f, depth = t_row_depth(cols), e_inv = T_U * (depth / 2 + 4);
    double *x = malloc(cols * sizeof *x), *g = malloc(cols * sizeof *g);
    double *dy = malloc(cols * sizeof *dy), *dx = malloc(cols * sizeof *dx);
    for (uint32_t j = 0; j < cols; j++) {
        x[j] = t_in(run, R_X, r * cols + j);
        g[j] = t_in(run, R_GAMMA, j);
        dy[j] = t_in(run, R_DY, r * cols + j);
    }
    double inv = t_rms_inv(x, cols, eps), dot = 0, abs_dot = 0;
    t_close("inv_rms", r, t_out(run, R_INV, r), inv, 2 * e_inv * inv);
    for (uint32_t j = 0; j < cols; j++) {
        double y = x[j] * inv * g[j];
        double tol = 2 * (e_inv + 2 * T_U) * fabs(y) + T_TINY;
        t_close("y", r * cols + j, t_out(run, R_Y, r * cols + j), y,
                t_tol_store(tol, y, c->out_dtype));
        dot += dy[j] * g[j] * x[j] * inv;
        abs_dot += fabs(dy[j] * g[j] * x[j] * inv);
        dgamma_ref[j] += dy[j] * x[j] * inv;
        dgamma_abs[j] += fabs(dy[j] * x[j] * inv);
    }
    double mean = dot / cols;
    double dc = T_U * (2 * depth + 8) * abs_dot / cols + T_U * fabs(mean);
    for (uint32_t j = 0; j < cols; j++) {
        double xhat = x[j] * inv, dxhat = dy[j] * g[j], rr = dxhat - xhat * mean;
        dx[j] = inv * rr;
        double tol = inv * (fabs(xhat) * dc + fabs(mean * xhat) * (e_inv + T_U) +
                            T_U * fabs(dxhat) + T_U * fabs(rr)) + fabs(dx[j]) * (e_inv + T_U);
        t_close("dx", r * cols + j, t_out(run, R_DX, r * cols + j), dx[j],
                t_tol_store(2 * tol + T_TINY, dx[j], c->out_dtype));
    }
    if (r < 2) t_rms_fd_row(x, g, dy, cols, eps, dx);
    free(x);
    free(g);
    free(dy);
    free(dx);
}

static void t_check_rmsnorm(t_run *run, const t_case *c) {
    t_check_amax(run, R_Y, R_Y_AMAX, (uint64_t)c->rows * c->cols);
    // dx with the skip gradient added: exactly the residual add of the stored dx and skip.
    for (uint64_t i = 0; i < (uint64_t)c->rows * c->cols; i++) {
        float sum = (float)t_in(run, R_SKIP, i) + (float)t_out(run, R_DX, i);
        float want = qt_act_stored(sum, c->out_dtype);
        float got = (float)t_out(run, R_DX_SUM, i);
        CHECK(t_b(got) == t_b(want), "dx + skip [%llu]: %08x, the residual add gives %08x",
              (unsigned long long)i, t_b(got), t_b(want));
    }
    t_check_amax(run, R_DX_SUM, R_DX_AMAX, (uint64_t)c->rows * c->cols);
    for (uint32_t j = 0; j < c->cols; j++) {
        float got = (float)t_out(run, R_DGAMMA_ALONE, j), want = (float)t_out(run, R_DGAMMA_SUM, j);
        CHECK(t_b(got) == t_b(want), "dgamma without dx [%u]: %08x, with dx %08x", j, t_b(got),
              t_b(want));
    }
    double *ref = calloc(c->cols, sizeof *ref), *abs_sum = calloc(c->cols, sizeof *abs_sum);
    for (uint64_t r = 0; r < c->rows; r++) t_check_rmsnorm_row(run, c, r, ref, abs_sum);
    uint32_t per_part = op_rmsnorm_rows_per_part(c->rows);
    uint32_t parts = (c->rows + per_part - 1) / per_part;
    double e_inv = T_U * (t_row_depth(c->cols) / 2.0 + 4);
    for (uint32_t j = 0; j < c->cols; j++) {
        double init = (c->flags & T_ACCUM) ? t_in(run, R_DGAMMA, j) : 0;
        double want = init + ref[j];
        double tol = (T_U * (per_part + parts + 2) + e_inv) * abs_sum[j] + T_U * fabs(want);
        t_close("dgamma", j, t_out(run, R_DGAMMA, j), want, 2 * tol + T_TINY);
    }
    // dgamma by finite differences of L = sum dy y over every row (L is linear in gamma).
    for (uint32_t j = 0; j < c->cols && j < 64; j++) {
        double lp = 0, lm = 0, h = 1e-3;
        for (uint64_t r = 0; r < c->rows; r++) {
            double ss = 0;
            for (uint32_t k = 0; k < c->cols; k++) {
                double v = t_in(run, R_X, r * c->cols + k);
                ss += v * v;
            }
            double xhat = t_in(run, R_X, r * c->cols + j) / sqrt(ss / c->cols + (double)1e-5f);
            double dyv = t_in(run, R_DY, r * c->cols + j), gj = t_in(run, R_GAMMA, j);
            lp += dyv * xhat * (gj + h);
            lm += dyv * xhat * (gj - h);
        }
        double fd = (lp - lm) / (2 * h);
        CHECK(fabs(fd - ref[j]) <= 1e-9 * (abs_sum[j] + 1), "dgamma[%u]: analytic %.12g, "
              "finite difference %.12g", j, ref[j], fd);
    }
    free(ref);
    free(abs_sum);
}

static void test_rmsnorm_accuracy(void) {
    test_begin("rmsnorm_matches_double_reference_and_finite_differences");
    static const uint32_t shapes[][2] = {{1, 1}, {1, 10}, {257, 3}, {13, 1009}, {31, 97},
                                         {64, 256}, {300, 40}, {2, 4099}};
    for (uint32_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (uint32_t variant = 0; variant < 3; variant++) {
            t_case c = {"", T_KIND_RMSNORM, 0, shapes[s][0], shapes[s][1],
                        variant == 1 ? T_BF16 : T_F32, variant == 2 ? T_BF16 : T_F32,
                        variant == 2 ? T_ACCUM : 0, 0, 201 + s * 3 + variant,
                        variant == 0 ? 1.0 : 40.0};
            t_run *run = t_ref_run(&c);
            t_check_rmsnorm(run, &c);
            t_ref_free(run);
        }
    }
    test_end();
}

// dgamma's parts: rows_per_part = max(64, ceil(rows / 256)), so at most 256 parts.
static void test_rmsnorm_parts(void) {
    test_begin("rmsnorm_dgamma_parts_rule");
    CHECK(op_rmsnorm_rows_per_part(1) == 64, "1 row");
    CHECK(op_rmsnorm_rows_per_part(16384) == 64, "16384 rows");
    CHECK(op_rmsnorm_rows_per_part(16385) == 65, "16385 rows");
    CHECK(op_rmsnorm_rows_per_part(1000000) == 3907, "1e6 rows");
    CHECK(op_rmsnorm_workspace_bytes(1000000, 10) == 256ull * 10 * 4, "1e6 rows workspace %llu",
          (unsigned long long)op_rmsnorm_workspace_bytes(1000000, 10));
    CHECK(op_rmsnorm_workspace_bytes(65, 3) == 2 * 3 * 4, "65 rows workspace");
    test_end();
}

static void test_rmsnorm_special_rows(void) {
    test_begin("rmsnorm_zero_constant_huge_tiny_and_inf_rows");
    t_case c = {"", T_KIND_RMSNORM, 0, 5, 10, T_F32, T_F32, 0, 0, 7, 1.0};
    t_run *run = calloc(1, sizeof *run);
    t_run_open(run, BACKEND_REF);
    t_build_rmsnorm(run, &c);
    float x[50];
    uint64_t state = 99;
    for (int j = 0; j < 10; j++) {
        x[j] = j % 2 ? 0.0f : -0.0f;                            // zero row: inv = 1/sqrt(eps)
        x[10 + j] = 3.0f;                                       // constant row
        x[20 + j] = (float)(1e18 * t_normal(&state));           // huge, squares still finite
        x[30 + j] = (float)(1e-42 * (j + 1));                   // subnormal: squares underflow
        x[40 + j] = (float)t_normal(&state);
    }
    t_set(run, R_X, x);
    rig_bind(&run->r);
    t_run_exec(run, NULL);
    t_check_rmsnorm(run, &c);
    t_ref_free(run);

    // A row holding +Inf: sum of squares Inf, inv = 1/Inf = +0, y = Inf * 0 = NaN there and
    // x * 0 = +-0 elsewhere.
    run = calloc(1, sizeof *run);
    t_run_open(run, BACKEND_REF);
    t_build_rmsnorm(run, &c);
    x[41] = t_f(0x7F800000u);
    t_set(run, R_X, x);
    rig_bind(&run->r);
    t_run_exec(run, NULL);
    CHECK(t_b(t_out(run, R_INV, 4)) == 0, "inv_rms of an Inf row %08x", t_b(t_out(run, R_INV, 4)));
    CHECK(t_b(t_out(run, R_Y, 41)) == 0x7FFFFFFFu, "y at the Inf %08x", t_b(t_out(run, R_Y, 41)));
    CHECK(t_out(run, R_Y, 42) == 0.0f, "y beside the Inf %g", t_out(run, R_Y, 42));
    // y's amax skips the NaN: the other rows' largest magnitude.
    t_check_amax(run, R_Y, R_Y_AMAX, 50);
    CHECK(t_out(run, R_Y_AMAX, 0) > 0.0f, "y amax %g", t_out(run, R_Y_AMAX, 0));
    t_ref_free(run);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Residual add: one FP32 addition, then the store's rounding: exact expectations.

static void t_check_residual(t_run *run, const t_case *c) {
    uint64_t n = (uint64_t)c->rows * c->cols;
    t_check_amax(run, S_Y, S_Y_AMAX, n);
    uint32_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        float y = t_in(run, S_X, i) + t_in(run, S_F, i);
        float dy = t_in(run, S_DY, i);
        float acc = t_in(run, S_DX_ACC, i) + dy;
        uint32_t want[3], got[3];
        float wants[3] = {y, dy, acc};
        uint32_t slots[3] = {S_Y, S_DX, S_DX_ACC};
        for (int k = 0; k < 3; k++) {
            uint32_t dtype = t_slot(run, slots[k])->type;
            float w = qt_act_canonical(wants[k]);
            want[k] = dtype == T_BF16 ? qt_f32_to_bf16(w) : t_b(w);
            float o = t_out(run, slots[k], i);
            got[k] = dtype == T_BF16 ? (uint32_t)(t_b(o) >> 16) : t_b(o);
            if (got[k] != want[k] && bad++ < 8) {
                CHECK(false, "%s[%llu] = %08x, want %08x", t_slot(run, slots[k])->name,
                      (unsigned long long)i, got[k], want[k]);
            }
        }
    }
    CHECK(bad == 0, "%u mismatches", bad);
}

static void test_residual_exact(void) {
    test_begin("residual_add_and_backward_exact");
    for (uint32_t s = 0; s < T_SHAPES_COUNT; s++) {
        for (uint32_t variant = 0; variant < 3; variant++) {
            t_case c = {"", T_KIND_RESIDUAL, 0, t_shapes[s][0], t_shapes[s][1],
                        variant == 1 ? T_BF16 : T_F32, variant == 2 ? T_BF16 : T_F32,
                        variant == 0 ? T_SPECIAL : 0, variant == 2 ? 4 : 0, 301 + s, 5.0};
            t_run *run = t_ref_run(&c);
            t_check_residual(run, &c);
            t_ref_free(run);
        }
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy.

static int32_t t_label(t_run *run, uint64_t r, uint32_t classes) {
    int32_t label;
    memcpy(&label, t_slot(run, X_LABELS)->init + r * 4, 4);
    return label >= 0 && (uint32_t)label < classes ? label : -1;
}

// Double loss of one row: log sum exp(z - m) + m - z_label.
static double t_xent_row(const double *z, uint32_t classes, int32_t label) {
    double m = z[0], s = 0;
    for (uint32_t j = 1; j < classes; j++) m = z[j] > m ? z[j] : m;
    for (uint32_t j = 0; j < classes; j++) s += exp(z[j] - m);
    return log(s) + m - z[label];
}

// Finite differences of the mean loss (double) against the analytic (softmax - onehot) / valid.
static void t_xent_fd_row(double *z, uint32_t classes, int32_t label, double valid) {
    double m = z[0], s = 0;
    for (uint32_t j = 1; j < classes; j++) m = z[j] > m ? z[j] : m;
    for (uint32_t j = 0; j < classes; j++) s += exp(z[j] - m);
    for (uint32_t j = 0; j < classes && j < 256; j++) {
        double analytic = (exp(z[j] - m) / s - (j == (uint32_t)label)) / valid;
        double keep = z[j], h = 1e-6 * (fabs(z[j]) > 1 ? fabs(z[j]) : 1);
        z[j] = keep + h;
        double lp = t_xent_row(z, classes, label);
        z[j] = keep - h;
        double lm = t_xent_row(z, classes, label);
        z[j] = keep;
        double fd = (lp - lm) / (2 * h) / valid;
        CHECK(fabs(fd - analytic) <= 1e-7 / valid, "dlogit %u: analytic %.12g, finite "
              "difference %.12g", j, analytic, fd);
    }
}

// Bounds (D = t_row_depth): each exp(z - m) carries u |z - m| from the subtraction and 2u from
// qt_expf, the sum D u: ds / s <= u (D + 2 + max |z - m|); log adds 2u of log s; the loss's two
// additions u of |m - z_label| and of the loss: dloss <= u (2 |m - z_l| + D + 4 + max |z - m| +
// 3 log s + 2 loss). dlogit = RN(RN(RN(e / s) - onehot) / valid): p = e / s errs by
// p u (D + 6 + |z - m|), then u of |p - onehot| and u of the result. Doubled in the checks.
static double t_check_xent_row(t_run *run, const t_case *c, uint64_t r, double valid,
                               double *tol_sum, uint32_t *correct) {
    uint32_t classes = c->cols;
    int32_t label = t_label(run, r, classes);
    if (label < 0) {
        CHECK(t_b(t_out(run, X_LOSS, r)) == 0, "ignored row %llu loss %08x",
              (unsigned long long)r, t_b(t_out(run, X_LOSS, r)));
        for (uint32_t j = 0; !(c->flags & T_NO_GRAD) && j < classes; j++) {
            float d = t_out(run, X_DLOGITS, r * classes + j);
            CHECK(t_b(d) == 0, "ignored row %llu dlogit %u = %08x", (unsigned long long)r, j,
                  t_b(d));
        }
        return 0;
    }
    double *z = malloc(classes * sizeof *z), m = -INFINITY, s = 0, maxd = 0;
    uint32_t arg = 0;
    for (uint32_t j = 0; j < classes; j++) {
        z[j] = t_in(run, X_LOGITS, r * classes + j);
        if (z[j] > m) m = z[j], arg = j;  // strict: ties keep the lowest index
    }
    for (uint32_t j = 0; j < classes; j++) {
        s += exp(z[j] - m);
        maxd = fabs(z[j] - m) > maxd ? fabs(z[j] - m) : maxd;
    }
    *correct += arg == (uint32_t)label;
    double loss = log(s) + m - z[label], depth = t_row_depth(classes);
    double tol = 2 * T_U * (2 * fabs(m - z[label]) + depth + 4 + maxd + 3 * log(s) + 2 * loss);
    t_close("loss", r, t_out(run, X_LOSS, r), loss, tol);
    *tol_sum += tol;
    for (uint32_t j = 0; !(c->flags & T_NO_GRAD) && j < classes; j++) {
        double p = exp(z[j] - m) / s, g = p - (j == (uint32_t)label);
        double want = g / valid;
        double bound = 2 * (p * T_U * (depth + 6 + fabs(z[j] - m)) + T_U * fabs(g)) / valid +
                       2 * T_U * fabs(want) + T_TINY;
        t_close("dlogits", r * classes + j, t_out(run, X_DLOGITS, r * classes + j), want,
                t_tol_store(bound, want, c->out_dtype));
    }
    if (r < 3) t_xent_fd_row(z, classes, label, valid);
    free(z);
    return loss;
}

// Stats: valid and correct exact; loss_sum within the rows' bounds plus the reduction's chain
// (8 rows, the final pass's fold and two trees: about 40 + blocks / 256 roundings).
static void t_check_xent(t_run *run, const t_case *c) {
    t_check_amax(run, X_DLOGITS, X_DLOGITS_AMAX, (uint64_t)c->rows * c->cols);
    uint32_t valid = 0, correct = 0;
    for (uint64_t r = 0; r < c->rows; r++) valid += t_label(run, r, c->cols) >= 0;
    double sum = 0, tol = 0;
    for (uint64_t r = 0; r < c->rows; r++) {
        sum += t_check_xent_row(run, c, r, valid ? valid : 1, &tol, &correct);
    }
    uint32_t blocks = (c->rows + 7) / 8;
    tol += 2 * T_U * (40 + blocks / 256.0) * sum;
    CHECK(t_word(run, X_STATS, 2) == valid, "valid %u, want %u", t_word(run, X_STATS, 2), valid);
    CHECK(t_word(run, X_STATS, 3) == correct, "correct %u, want %u", t_word(run, X_STATS, 3),
          correct);
    t_close("loss_sum", 0, t_f(t_word(run, X_STATS, 1)), sum, tol);
    double mean = valid ? sum / valid : 0;
    t_close("loss_mean", 0, t_f(t_word(run, X_STATS, 0)), mean,
            (valid ? tol / valid : 0) + 2 * T_U * mean);
}

static void test_xent_accuracy(void) {
    test_begin("xent_matches_double_reference_and_finite_differences");
    static const uint32_t shapes[][2] = {{1, 1}, {1, 10}, {257, 3}, {13, 1009}, {31, 97},
                                         {64, 256}, {5, 5000}};
    for (uint32_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (uint32_t variant = 0; variant < 4; variant++) {
            uint32_t flags = variant == 1 ? T_IGNORE : variant == 3 ? T_NO_GRAD | T_IGNORE : 0;
            t_case c = {"", T_KIND_XENT, 0, shapes[s][0], shapes[s][1],
                        variant == 1 ? T_BF16 : T_F32, variant == 2 ? T_BF16 : T_F32, flags, 0,
                        401 + s * 4 + variant, variant == 2 ? 8.0 : 2.0};
            t_run *run = t_ref_run(&c);
            t_check_xent(run, &c);
            t_ref_free(run);
        }
    }
    test_end();
}

// A hand-built xent program: rows x classes logits (F32) and labels.
static t_run *t_xent_values(uint32_t rows, uint32_t classes, const float *logits,
                            const int32_t *labels, t_case *c) {
    *c = (t_case){"", T_KIND_XENT, 0, rows, classes, T_F32, T_F32, 0, 0, 1, 1.0};
    t_run *run = calloc(1, sizeof *run);
    t_run_open(run, BACKEND_REF);
    t_build_xent(run, c);
    t_set(run, X_LOGITS, logits);
    t_set_words(run, X_LABELS, labels);
    rig_bind(&run->r);
    t_run_exec(run, NULL);
    return run;
}

static void test_xent_special(void) {
    test_begin("xent_huge_logits_ties_ignored_rows_nan_exact");
    // Rows: huge logits (label at the max: loss exactly 0; label at -1e30: loss 2e30), an
    // argmax tie (index 1 wins over 2), ignored rows (-1 and out of range).
    static const float z[7 * 3] = {1e30f, -1e30f, 0, 1e30f, -1e30f, 0, 1, 3, 3, 1, 3, 3,
                                   5, 6, 7, 5, 6, 7, -2, 0, 2};
    static const int32_t labels[7] = {0, 1, 2, 1, -1, 3, 2};
    t_case c;
    t_run *run = t_xent_values(7, 3, z, labels, &c);
    CHECK(t_b(t_out(run, X_LOSS, 0)) == 0, "loss at the huge max %08x", t_b(t_out(run, X_LOSS, 0)));
    CHECK(t_out(run, X_LOSS, 1) == 2e30f, "loss 2e30: %g", t_out(run, X_LOSS, 1));
    CHECK(t_b(t_out(run, X_LOSS, 4)) == 0 && t_b(t_out(run, X_LOSS, 5)) == 0, "ignored losses");
    CHECK(t_word(run, X_STATS, 2) == 5, "valid %u, want 5", t_word(run, X_STATS, 2));
    CHECK(t_word(run, X_STATS, 3) == 3, "correct %u, want 3 (rows 0, 3, 6)",
          t_word(run, X_STATS, 3));
    // dlogits of row 0: softmax (1, 0, 0) - onehot(0) = 0; row 1: (1, -1, 0) / 5.
    CHECK(t_out(run, X_DLOGITS, 0) == 0.0f && t_out(run, X_DLOGITS, 3) == 0.2f &&
              t_out(run, X_DLOGITS, 4) == -0.2f && t_b(t_out(run, X_DLOGITS, 5)) == 0,
          "dlogits %g %g %g %g", t_out(run, X_DLOGITS, 0), t_out(run, X_DLOGITS, 3),
          t_out(run, X_DLOGITS, 4), t_out(run, X_DLOGITS, 5));
    t_check_xent(run, &c);
    t_ref_free(run);

    // A NaN logit makes its row's loss, the sum and the mean the canonical NaN.
    static const float zn[2 * 3] = {0, NAN, 1, 0, 1, 2};
    static const int32_t ln[2] = {0, 1};
    run = t_xent_values(2, 3, zn, ln, &c);
    CHECK(t_b(t_out(run, X_LOSS, 0)) == 0x7FFFFFFFu, "NaN row loss %08x",
          t_b(t_out(run, X_LOSS, 0)));
    CHECK(t_word(run, X_STATS, 0) == 0x7FFFFFFFu && t_word(run, X_STATS, 1) == 0x7FFFFFFFu,
          "NaN mean %08x sum %08x", t_word(run, X_STATS, 0), t_word(run, X_STATS, 1));
    // The NaN row's gradients are NaN; their amax is the other row's (NaN skipped).
    t_check_amax(run, X_DLOGITS, X_DLOGITS_AMAX, 6);
    CHECK(t_out(run, X_DLOGITS_AMAX, 0) > 0.0f, "dlogits amax %g",
          t_out(run, X_DLOGITS_AMAX, 0));
    t_ref_free(run);

    // Every row ignored (one holds a NaN, which must not leak): nothing valid, mean +0, all
    // gradients +0.
    static const int32_t none[2] = {-1, 7};
    run = t_xent_values(2, 3, zn, none, &c);
    CHECK(t_word(run, X_STATS, 0) == 0 && t_word(run, X_STATS, 1) == 0 &&
              t_word(run, X_STATS, 2) == 0 && t_word(run, X_STATS, 3) == 0,
          "stats %08x %08x %u %u", t_word(run, X_STATS, 0), t_word(run, X_STATS, 1),
          t_word(run, X_STATS, 2), t_word(run, X_STATS, 3));
    for (int j = 0; j < 6; j++) CHECK(t_b(t_out(run, X_DLOGITS, j)) == 0, "dlogit %d", j);
    t_ref_free(run);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Mean squared error.

// Bounds: d = RN(p - t) errs by u |d|; the squares' chains (lane fold, tree, 8 rows, final
// fold and trees: D + 40 + blocks / 256 roundings) by that many u of sum d^2, plus 2u each:
// dsum <= u (D + 43 + blocks / 256) sum d^2; the mean adds the roundings of n and the division.
// dpred = RN(2 RN(p - t) / RN(n)): 3u of itself. Doubled in the checks.
static void t_check_mse(t_run *run, const t_case *c) {
    t_check_amax(run, M_DPRED, M_DPRED_AMAX, (uint64_t)c->rows * c->cols);
    uint32_t valid = (c->flags & T_IGNORE) ? c->rows - c->rows / 3 : c->rows;
    double n = (double)valid * c->cols, sum = 0;
    for (uint64_t r = 0; r < c->rows; r++) {
        for (uint32_t j = 0; j < c->cols; j++) {
            uint64_t i = r * c->cols + j;
            double d = (double)t_in(run, M_PRED, i) - t_in(run, M_TARGET, i);
            double want = r < valid ? 2 * d / n : 0;
            if (r < valid) sum += d * d;
            if (c->flags & T_NO_GRAD) continue;
            if (r >= valid) {
                CHECK(t_b(t_out(run, M_DPRED, i)) == 0, "padding dpred[%llu] %08x",
                      (unsigned long long)i, t_b(t_out(run, M_DPRED, i)));
                continue;
            }
            t_close("dpred", i, t_out(run, M_DPRED, i), want,
                    t_tol_store(6 * T_U * fabs(want) + T_TINY, want, c->out_dtype));
            // Finite difference of the mean loss in this prediction (a quadratic: exact up to
            // rounding).
            if (i < 64) {
                double h = 1e-3, p = t_in(run, M_PRED, i), t = t_in(run, M_TARGET, i);
                double fd = (((p + h - t) * (p + h - t)) - ((p - h - t) * (p - h - t))) /
                            (2 * h) / n;
                CHECK(fabs(fd - want) <= 1e-9 * (fabs(want) + 1 / n), "dpred[%llu]: analytic "
                      "%.12g, finite difference %.12g", (unsigned long long)i, want, fd);
            }
        }
    }
    uint32_t blocks = (c->rows + 7) / 8;
    double tol = 2 * T_U * (t_row_depth(c->cols) + 43 + blocks / 256.0) * sum;
    CHECK(t_word(run, M_STATS, 2) == valid, "valid %u, want %u", t_word(run, M_STATS, 2), valid);
    CHECK(t_word(run, M_STATS, 3) == 0, "correct %u", t_word(run, M_STATS, 3));
    t_close("loss_sum", 0, t_f(t_word(run, M_STATS, 1)), sum, tol);
    double mean = n > 0 ? sum / n : 0;
    t_close("loss_mean", 0, t_f(t_word(run, M_STATS, 0)), mean,
            (n > 0 ? tol / n : 0) + 4 * T_U * mean);
}

static void test_mse_accuracy(void) {
    test_begin("mse_matches_double_reference_and_finite_differences");
    for (uint32_t s = 0; s < T_SHAPES_COUNT; s++) {
        for (uint32_t variant = 0; variant < 4; variant++) {
            uint32_t flags = variant == 1 ? T_IGNORE : variant == 3 ? T_NO_GRAD : 0;
            t_case c = {"", T_KIND_MSE, 0, t_shapes[s][0], t_shapes[s][1],
                        variant == 1 ? T_BF16 : T_F32, variant == 2 ? T_BF16 : T_F32, flags,
                        variant == 2 ? 4 : 0, 501 + s * 4 + variant, 3.0};
            t_run *run = t_ref_run(&c);
            t_check_mse(run, &c);
            t_ref_free(run);
        }
    }
    test_end();
}

// The device's valid-row count: 0 gives a zero loss and zero gradients; a count above rows is
// clamped to rows.
static void test_mse_valid_rows(void) {
    test_begin("mse_valid_row_count_zero_and_clamped");
    static const uint32_t counts[2] = {0, 1000};
    for (int k = 0; k < 2; k++) {
        t_case c = {"", T_KIND_MSE, 0, 9, 5, T_F32, T_F32, T_IGNORE, 0, 77, 1.0};
        t_run *run = calloc(1, sizeof *run);
        t_run_open(run, BACKEND_REF);
        t_build_mse(run, &c);
        t_set_words(run, M_VALID, &counts[k]);
        rig_bind(&run->r);
        t_run_exec(run, NULL);
        uint32_t want_valid = k == 0 ? 0 : 9;
        CHECK(t_word(run, M_STATS, 2) == want_valid, "valid %u, want %u",
              t_word(run, M_STATS, 2), want_valid);
        if (k == 0) {
            CHECK(t_word(run, M_STATS, 0) == 0 && t_word(run, M_STATS, 1) == 0, "loss %08x %08x",
                  t_word(run, M_STATS, 0), t_word(run, M_STATS, 1));
            for (int i = 0; i < 45; i++) CHECK(t_b(t_out(run, M_DPRED, i)) == 0, "dpred %d", i);
        } else {
            c.flags = 0;  // all 9 rows valid: the plain check applies
            t_check_mse(run, &c);
        }
        t_ref_free(run);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Global gradient norm.

// Bound: each thread folds <= 32 squares, then two trees of 5 levels, 8 warp sums, the final
// fold (P / 256) and again 5 + 8: a chain of D = 58 + P / 256 roundings of non-negative terms,
// D u of the sum; sqrt halves it and rounds once: du/norm <= u (D / 2 + 1). The clip factor
// adds the + 1e-6 and the division. Doubled in the checks.
static void t_check_gnorm(t_run *run, const t_case *c) {
    uint64_t counts[T_GNORM_REGIONS];
    t_gnorm_counts(c, counts);
    double ss = 0;
    uint32_t nonfinite = 0, partials = 0;
    for (uint32_t k = 0; k < T_GNORM_REGIONS; k++) {
        for (uint64_t i = 0; i < counts[k]; i++) {
            if (t_gnorm_units(k)) {  // the sums count as they are; the flags say
                const uint8_t *init = t_slot(run, G_R0 + k)->init;
                float sum;
                uint32_t flag;
                memcpy(&sum, init + 4 * i, 4);
                memcpy(&flag, init + 4 * (counts[k] + i), 4);
                ss += sum;
                nonfinite |= flag != 0;
                continue;
            }
            double v = t_in(run, G_R0 + k, i);
            ss += v * v;
            nonfinite |= !isfinite(v);
        }
        partials += counts[k] ? (uint32_t)((counts[k] + QT_GNORM_BLOCK_ELEMS - 1) /
                                           QT_GNORM_BLOCK_ELEMS) : 1;
    }
    double norm = sqrt(ss), depth = 58 + partials / 256.0;
    float clip = (float)c->op;
    CHECK(t_word(run, G_OUT, 2) == nonfinite, "nonfinite %u, want %u", t_word(run, G_OUT, 2),
          nonfinite);
    if (nonfinite) return;
    t_close("norm", 0, t_f(t_word(run, G_OUT, 0)), norm, 2 * T_U * (depth / 2 + 1) * norm);
    double q = clip > 0 ? clip / (norm + 1e-6) : 1;
    double factor = q < 1 ? q : 1;
    t_close("clip_factor", 0, t_f(t_word(run, G_OUT, 1)), factor,
            2 * T_U * (depth / 2 + 4) * factor);
}

static void test_gnorm_accuracy(void) {
    test_begin("grad_norm_matches_double_reference");
    static const uint32_t shapes[][3] = {{1, 1, 1}, {257, 3, 2}, {13, 1009, 0}, {64, 300, 5},
                                         {7, 20000, 1000}};
    for (uint32_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (uint32_t variant = 0; variant < 2; variant++) {
            t_case c = {"", T_KIND_GNORM, shapes[s][2], shapes[s][0], shapes[s][1], T_F32,
                        T_F32, 0, variant ? 4 : 0, 601 + s * 2 + variant,
                        variant ? 1e-3 : 0.1};
            t_run *run = t_ref_run(&c);
            t_check_gnorm(run, &c);
            t_ref_free(run);
        }
    }
    test_end();
}

// A gradient-norm program over the case's regions with region 2 replaced by `values`.
static t_run *t_gnorm_values(t_case *c, const float *values) {
    t_run *run = calloc(1, sizeof *run);
    t_run_open(run, BACKEND_REF);
    t_build_gnorm(run, c);
    if (values) t_set(run, G_R2, values);
    rig_bind(&run->r);
    t_run_exec(run, NULL);
    return run;
}

static void test_gnorm_special(void) {
    test_begin("grad_norm_nonfinite_flag_clip_rules");
    t_case c = {"", T_KIND_GNORM, 1, 3, 5, T_F32, T_F32, 0, 0, 5, 0.0};  // all zero
    t_run *run = t_gnorm_values(&c, NULL);
    // Zero gradients: norm +0, factor min(1, 1 / 1e-6) = 1, finite.
    CHECK(t_word(run, G_OUT, 0) == 0 && t_f(t_word(run, G_OUT, 1)) == 1.0f &&
              t_word(run, G_OUT, 2) == 0, "zero: %08x %08x %u", t_word(run, G_OUT, 0),
          t_word(run, G_OUT, 1), t_word(run, G_OUT, 2));
    t_ref_free(run);
    float v[15] = {3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    c.op = 1;  // clip 1: norm 5 -> factor 1 / (5 + 1e-6)
    run = t_gnorm_values(&c, v);
    CHECK(t_f(t_word(run, G_OUT, 0)) == 5.0f, "norm %g", t_f(t_word(run, G_OUT, 0)));
    CHECK(t_f(t_word(run, G_OUT, 1)) == 1.0f / (5.0f + 1e-6f), "factor %.9g",
          t_f(t_word(run, G_OUT, 1)));
    t_ref_free(run);
    c.op = 0;  // clip <= 0 disables clipping
    run = t_gnorm_values(&c, v);
    CHECK(t_f(t_word(run, G_OUT, 1)) == 1.0f, "no clip: factor %g", t_f(t_word(run, G_OUT, 1)));
    t_ref_free(run);
    // NaN: flag set, norm NaN (canonical), factor 1 (the step is skipped anyway).
    c.op = 1;
    v[7] = NAN;
    run = t_gnorm_values(&c, v);
    CHECK(t_word(run, G_OUT, 0) == 0x7FFFFFFFu && t_f(t_word(run, G_OUT, 1)) == 1.0f &&
              t_word(run, G_OUT, 2) == 1, "NaN: %08x %08x %u", t_word(run, G_OUT, 0),
          t_word(run, G_OUT, 1), t_word(run, G_OUT, 2));
    t_ref_free(run);
    // -Inf: flag set, norm +Inf, factor clip / Inf = 0.
    v[7] = -INFINITY;
    run = t_gnorm_values(&c, v);
    CHECK(t_word(run, G_OUT, 0) == 0x7F800000u && t_word(run, G_OUT, 1) == 0 &&
              t_word(run, G_OUT, 2) == 1, "Inf: %08x %08x %u", t_word(run, G_OUT, 0),
          t_word(run, G_OUT, 1), t_word(run, G_OUT, 2));
    t_ref_free(run);
    // Huge but finite gradients: the FP32 sum of squares overflows (norm +Inf, factor 0), but
    // no gradient is non-finite, so the flag stays clear.
    v[7] = 1e20f;
    run = t_gnorm_values(&c, v);
    CHECK(t_word(run, G_OUT, 0) == 0x7F800000u && t_word(run, G_OUT, 2) == 0,
          "huge: %08x flag %u", t_word(run, G_OUT, 0), t_word(run, G_OUT, 2));
    t_ref_free(run);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The reduction order of act.h, written out independently (lane by lane, then the tree by
// levels): the twin's inv_rms matches it bit for bit, so the order the GPU must follow is the
// documented one.
static void test_documented_row_order(void) {
    test_begin("row_reduction_follows_documented_order");
    const uint32_t cols = 1500;  // 188 chunks: lanes 0..27 own 6, the rest 5, the last chunk 4
    t_case c = {"", T_KIND_RMSNORM, 0, 1, cols, T_F32, T_F32, 0, 0, 808, 100.0};
    t_run *run = t_ref_run(&c);
    float lane[32];
    for (uint32_t l = 0; l < 32; l++) {
        lane[l] = 0.0f;
        for (uint32_t chunk = l; chunk * 8 < cols; chunk += 32) {
            for (uint32_t k = 0; k < 8 && chunk * 8 + k < cols; k++) {
                float v = t_in(run, R_X, chunk * 8 + k);
                lane[l] = qt_fmaf(v, v, lane[l]);
            }
        }
    }
    for (uint32_t width = 16; width >= 1; width /= 2) {
        float next[16];
        for (uint32_t l = 0; l < width; l++) next[l] = lane[l] + lane[l + width];
        for (uint32_t l = 0; l < width; l++) lane[l] = next[l];
    }
    float inv = 1.0f / qt_sqrtf(lane[0] / (float)cols + 1e-5f);
    CHECK(t_b(t_out(run, R_INV, 0)) == t_b(inv), "inv_rms %08x, documented order %08x",
          t_b(t_out(run, R_INV, 0)), t_b(inv));
    t_ref_free(run);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU against the reference backend, byte for byte.

static void t_compare_buf(const char *label, const t_buf *g, const t_buf *w, uint32_t cols) {
    uint32_t size = t_type_bytes(g->type);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < g->elems; i++) {
        if (memcmp(g->out + i * size, w->out + i * size, size) == 0) continue;
        if (bad++ < 6) {
            uint32_t gv = 0, wv = 0;
            memcpy(&gv, g->out + i * size, size);
            memcpy(&wv, w->out + i * size, size);
            float gf = t_decode(g, g->out, i), wf = t_decode(w, w->out, i);
            CHECK(false, "%s %s[%llu] (row %llu, col %llu): gpu %0*x (%.9g), ref %0*x (%.9g)",
                  label, g->name, (unsigned long long)i, (unsigned long long)(i / cols),
                  (unsigned long long)(i % cols), (int)(2 * size), gv, gf, (int)(2 * size), wv,
                  wf);
        }
    }
    CHECK(bad == 0, "%s %s: %llu of %llu elements differ", label, g->name,
          (unsigned long long)bad, (unsigned long long)g->elems);
}

static void t_compare_runs(const char *label, const t_run *a, const t_run *b, uint32_t cols) {
    CHECK(a->n == b->n, "%s: %u vs %u buffers", label, a->n, b->n);
    for (uint32_t i = 0; i < a->n && i < b->n; i++) {
        t_compare_buf(label, &a->b[i], &b->b[i], cols);
    }
}

// Copies a run's outputs so that a later run of the same rig can be compared with them.
static t_run *t_snapshot(const t_run *run) {
    t_run *copy = malloc(sizeof *copy);
    memcpy(copy, run, sizeof *copy);
    for (uint32_t i = 0; i < run->n; i++) {
        uint64_t bytes = t_bytes(&run->b[i]) + 16;
        copy->b[i].out = malloc(bytes);
        memcpy(copy->b[i].out, run->b[i].out, bytes);
        copy->b[i].init = NULL;
    }
    return copy;
}

static void t_snapshot_free(t_run *copy) {
    for (uint32_t i = 0; i < copy->n; i++) free(copy->b[i].out);
    free(copy);
}

// The case on both backends, compared; then a second eager GPU run and a graph replay, each
// compared with the first GPU run.
static void t_gpu_case(const t_case *c) {
    char name[112];
    snprintf(name, sizeof name, "gpu_matches_ref_%s", c->name);
    t_run *gpu = calloc(1, sizeof *gpu);
    const char *why = NULL;
    if (!rig_open(&gpu->r, BACKEND_GPU, &why)) {
        test_skip(name, why);
        free(gpu);
        return;
    }
    for (uint32_t s = 0; s < T_SLOTS; s++) gpu->slot[s] = T_NONE;
    test_begin(name);
    t_build(gpu, c);
    t_run_exec(gpu, NULL);
    t_run *ref = t_ref_run(c);
    t_compare_runs("gpu vs ref", gpu, ref, c->cols);
    t_ref_free(ref);
    t_run *first = t_snapshot(gpu);
    t_run_exec(gpu, NULL);
    t_compare_runs("second eager run vs first", gpu, first, c->cols);
    backend_graph graph;
    RIG_OK(backend_capture(&gpu->r.be, &gpu->r.prog, &graph));
    t_run_exec(gpu, &graph);
    t_compare_runs("graph replay vs first run", gpu, first, c->cols);
    backend_graph_destroy(&gpu->r.be, &graph);
    t_snapshot_free(first);
    t_run_close(gpu);
    free(gpu);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// One-block losses against the split kernels: the same inputs through both forms, every output
// byte for byte (the workspace exists only in the split form), for shapes up to the one-block
// kernels' limits (op_xent and op_mse take them for fewer). On the reference backend the
// one-block twin runs the split twins; on the GPU the two are different kernels.

#define F32 T_F32
#define BF16 T_BF16
static const t_case t_small_cases[] = {
    // name                     kind      op  rows cols  in  out  flags  mis seed scale
    {"xent_bf16_256x10_ignore", T_KIND_XENT, 0, 256, 10, BF16, BF16, T_IGNORE, 0, 70, 3.0},
    {"xent_f32_1024x16_ignore_special", T_KIND_XENT, 0, 1024, 16, F32, F32,
     T_IGNORE | T_SPECIAL, 0, 71, 4.0},
    {"xent_bf16_f32_200x64", T_KIND_XENT, 0, 200, 64, BF16, F32, 0, 0, 72, 5.0},
    {"xent_f32_77x13_eval_misaligned", T_KIND_XENT, 0, 77, 13, F32, F32, T_NO_GRAD | T_IGNORE,
     4, 73, 2.0},
    {"xent_bf16_300x7_huge_logits", T_KIND_XENT, 0, 300, 7, BF16, BF16, 0, 0, 74, 3e4},
    {"xent_f32_1x1_small", T_KIND_XENT, 0, 1, 1, F32, F32, 0, 0, 75, 1.0},
    {"mse_bf16_256x10_valid", T_KIND_MSE, 0, 256, 10, BF16, BF16, T_IGNORE, 0, 80, 2.0},
    {"mse_f32_1024x16_special", T_KIND_MSE, 0, 1024, 16, F32, F32, T_SPECIAL, 0, 81, 2.0},
    {"mse_f32_bf16_200x64_eval", T_KIND_MSE, 0, 200, 64, F32, BF16, T_NO_GRAD, 0, 82, 2.0},
    {"mse_f32_33x5_valid_misaligned", T_KIND_MSE, 0, 33, 5, F32, F32, T_IGNORE, 4, 83, 2.0},
};
#undef F32
#undef BF16
#define T_SMALL_CASES (sizeof t_small_cases / sizeof t_small_cases[0])

// Builds and runs c on a backend; NULL when the backend cannot be opened.
static t_run *t_run_on(const t_case *c, backend_kind kind) {
    t_run *run = calloc(1, sizeof *run);
    const char *why = NULL;
    if (!rig_open(&run->r, kind, &why)) {
        free(run);
        return NULL;
    }
    for (uint32_t s = 0; s < T_SLOTS; s++) run->slot[s] = T_NONE;
    t_build(run, c);
    t_run_exec(run, NULL);
    return run;
}

// Case c in the one-block form and in the split form, on one backend.
static void t_compare_loss_forms(const t_case *c, backend_kind kind, const char *label) {
    t_case one_block = *c, split = *c;
    one_block.flags |= T_ONE_BLOCK;
    split.flags |= T_SPLIT;
    t_run *one = t_run_on(&one_block, kind), *two = t_run_on(&split, kind);
    QT_ASSERT(one && two);
    static const uint32_t xent_slots[] = {X_LOGITS, X_LABELS, X_LOSS, X_DLOGITS, X_STATS,
                                          X_DLOGITS_AMAX};
    static const uint32_t mse_slots[] = {M_PRED, M_TARGET, M_VALID, M_DPRED, M_STATS,
                                         M_DPRED_AMAX};
    const uint32_t *slots = c->kind == T_KIND_XENT ? xent_slots : mse_slots;
    char what[160];
    snprintf(what, sizeof what, "%s %s", label, c->name);
    for (uint32_t i = 0; i < 6; i++) {
        if (one->slot[slots[i]] == T_NONE) continue;
        t_compare_buf(what, t_slot(one, slots[i]), t_slot(two, slots[i]), c->cols);
    }
    t_run_close(one);
    t_run_close(two);
    free(one);
    free(two);
}

static void test_loss_one_block_matches_split_ref(void) {
    test_begin("loss_one_block_matches_split_kernels_ref");
    // The shapes on either side of each limit.
    CHECK(qt_loss_small_fits(1024, 64) && !qt_loss_small_fits(1024, 65) &&
          !qt_loss_small_fits(1025, 1), "what the one-block kernels take");
    CHECK(qt_loss_one_block(256, 16) && qt_loss_one_block(1024, 4), "16 elements a thread");
    CHECK(qt_loss_one_block(256, 10) && qt_loss_one_block(1, 1), "the shipped recipes' losses");
    CHECK(!qt_loss_one_block(256, 17) && !qt_loss_one_block(257, 9), "17, 18 elements a thread");
    CHECK(!qt_loss_one_block(1025, 1), "rows beyond shared memory");
    CHECK(op_xent_workspace_bytes(256, 10) == 0 && op_xent_workspace_bytes(257, 9) == 33 * 8,
          "xent workspace");
    CHECK(op_mse_workspace_bytes(33, 5) == 0 && op_mse_workspace_bytes(1025, 1) == 129 * 4,
          "mse workspace");
    // The form op_xent picks, by its op count.
    static const uint32_t shapes[][3] = {{256, 10, 1}, {256, 17, 3}, {1024, 4, 1}, {1025, 4, 3}};
    for (uint32_t i = 0; i < 4; i++) {
        t_case c = {"pick", T_KIND_XENT, 0, shapes[i][0], shapes[i][1], T_F32, T_F32, 0, 0, 9, 1};
        t_run *run = t_run_on(&c, BACKEND_REF);
        CHECK(run->r.prog.op_count == shapes[i][2], "op_xent on %u x %u: %u ops, expected %u",
              shapes[i][0], shapes[i][1], run->r.prog.op_count, shapes[i][2]);
        t_run_close(run);
        free(run);
    }
    for (size_t i = 0; i < T_SMALL_CASES; i++) {
        QT_ASSERT(qt_loss_small_fits(t_small_cases[i].rows, t_small_cases[i].cols));
        t_compare_loss_forms(&t_small_cases[i], BACKEND_REF, "ref one-block vs split:");
    }
    test_end();
}

static void test_gpu_loss_one_block(void) {
    rig probe;
    const char *why = NULL;
    if (!rig_open(&probe, BACKEND_GPU, &why)) {
        test_skip("gpu_loss_one_block_matches_split_kernels", why);
    } else {
        rig_close(&probe);
        test_begin("gpu_loss_one_block_matches_split_kernels");
        for (size_t i = 0; i < T_SMALL_CASES; i++) {
            t_compare_loss_forms(&t_small_cases[i], BACKEND_GPU, "gpu one-block vs split:");
        }
        test_end();
    }
    // The one-block kernel against its twin, then a second run and a graph replay.
    for (size_t i = 0; i < T_SMALL_CASES; i++) {
        t_case one_block = t_small_cases[i];
        one_block.flags |= T_ONE_BLOCK;
        t_gpu_case(&one_block);
    }
}

#define F32 T_F32
#define BF16 T_BF16
static const t_case t_gpu_cases[] = {
    // name                     kind      op  rows cols  in  out  flags  mis seed scale
    {"relu_f32_64x4096_bias", T_KIND_ACT, QT_ACT_RELU, 64, 4096, F32, F32, T_BIAS, 0, 1, 2.0},
    {"gelu_bf16_1024x4096", T_KIND_ACT, QT_ACT_GELU, 1024, 4096, BF16, BF16, 0, 0, 2, 3.0},
    {"gelu_bf16_f32_257x3_bias", T_KIND_ACT, QT_ACT_GELU, 257, 3, BF16, F32, T_BIAS, 0, 3, 3.0},
    {"silu_f32_bf16_13x1009_bias_special", T_KIND_ACT, QT_ACT_SILU, 13, 1009, F32, BF16,
     T_BIAS | T_SPECIAL, 0, 4, 4.0},
    {"silu_bf16_64x256_misaligned", T_KIND_ACT, QT_ACT_SILU, 64, 256, BF16, BF16, T_BIAS, 4, 5,
     3.0},
    {"relu_bf16_1x1_special", T_KIND_ACT, QT_ACT_RELU, 1, 1, BF16, BF16, T_SPECIAL, 0, 6, 1.0},
    {"gelu_f32_1x10_special", T_KIND_ACT, QT_ACT_GELU, 1, 10, F32, F32, T_SPECIAL, 0, 7, 5.0},
    {"gelu_f32_7x9_vector_tail", T_KIND_ACT, QT_ACT_GELU, 7, 9, F32, F32, T_SPECIAL, 0, 8, 5.0},
    {"silu_f32_wide_range_1000x1000", T_KIND_ACT, QT_ACT_SILU, 1000, 1000, F32, F32, T_SPECIAL,
     0, 9, 60.0},
    {"swiglu_bf16_64x512_bias", T_KIND_ACT, QT_ACT_SWIGLU, 64, 512, BF16, BF16, T_BIAS, 0, 10,
     3.0},
    {"swiglu_f32_257x6_special", T_KIND_ACT, QT_ACT_SWIGLU, 257, 6, F32, F32, T_SPECIAL, 0, 11,
     3.0},
    {"swiglu_bf16_13x1010_bias_misaligned", T_KIND_ACT, QT_ACT_SWIGLU, 13, 1010, BF16, F32,
     T_BIAS, 4, 12, 3.0},
    {"swiglu_f32_1x2", T_KIND_ACT, QT_ACT_SWIGLU, 1, 2, F32, F32, 0, 0, 13, 3.0},
    {"swiglu_bf16_512x8192", T_KIND_ACT, QT_ACT_SWIGLU, 512, 8192, BF16, BF16, 0, 0, 14, 3.0},
    // SwiGLU's table kernels (op_swiglu_lut_takes): planted specials, and every BF16 input into
    // FP32 outputs (each table value in full; the FP32 dy keeps the backward pass flat).
    {"swiglu_bf16_520x8192_table_special", T_KIND_ACT, QT_ACT_SWIGLU, 520, 8192, BF16, BF16,
     T_SPECIAL, 0, 37, 3.0},
    {"swiglu_bf16_f32_512x8192_table_every", T_KIND_ACT, QT_ACT_SWIGLU, 512, 8192, BF16, F32,
     T_EVERY_BF16, 0, 38, 3.0},
    // The table kernels (op_act_lut_takes): random values and planted specials (in and out of
    // the table's binades), every BF16 input into FP32 outputs (each table value in full), and
    // element paths at misaligned addresses.
    {"gelu_bf16_512x4096_table_special", T_KIND_ACT, QT_ACT_GELU, 512, 4096, BF16, BF16,
     T_SPECIAL, 0, 15, 3.0},
    {"gelu_bf16_f32_2048x1024_table_every_bf16", T_KIND_ACT, QT_ACT_GELU, 2048, 1024, BF16, F32,
     T_EVERY_BF16, 0, 16, 1.0},
    {"silu_bf16_f32_2048x1024_table_every_bf16", T_KIND_ACT, QT_ACT_SILU, 2048, 1024, BF16, F32,
     T_EVERY_BF16, 0, 17, 1.0},
    {"silu_bf16_2048x1024_table", T_KIND_ACT, QT_ACT_SILU, 2048, 1024, BF16, BF16, 0, 0, 18,
     2.0},
    {"gelu_bf16_4097x513_table_misaligned", T_KIND_ACT, QT_ACT_GELU, 4097, 513, BF16, BF16,
     T_SPECIAL, 4, 19, 3.0},
    // dx written over dy (a linear's dgrad D, model_build.c's mb_gemm_act): the table kernel's
    // BF16 and FP32 dy paths, the flat kernel's vectors, and the element paths.
    {"gelu_bf16_2048x4096_table_in_place", T_KIND_ACT, QT_ACT_GELU, 2048, 4096, BF16, BF16,
     T_SPECIAL | T_IN_PLACE, 0, 50, 3.0},
    {"silu_bf16_f32_2048x1024_table_in_place", T_KIND_ACT, QT_ACT_SILU, 2048, 1024, BF16, F32,
     T_IN_PLACE, 0, 51, 2.0},
    {"relu_bf16_1024x4096_in_place", T_KIND_ACT, QT_ACT_RELU, 1024, 4096, BF16, BF16,
     T_BIAS | T_IN_PLACE, 0, 52, 2.0},
    {"gelu_f32_13x1009_in_place_misaligned", T_KIND_ACT, QT_ACT_GELU, 13, 1009, F32, F32,
     T_SPECIAL | T_IN_PLACE, 4, 53, 3.0},
    {"rmsnorm_bf16_64x4096", T_KIND_RMSNORM, 0, 64, 4096, BF16, BF16, 0, 0, 20, 1.0},
    {"rmsnorm_f32_257x3_special", T_KIND_RMSNORM, 0, 257, 3, F32, F32, T_SPECIAL, 0, 21, 1.0},
    {"rmsnorm_bf16_f32_13x1009_accum", T_KIND_RMSNORM, 0, 13, 1009, BF16, F32, T_ACCUM, 0, 22,
     2.0},
    {"rmsnorm_f32_1x1", T_KIND_RMSNORM, 0, 1, 1, F32, F32, 0, 0, 23, 1.0},
    {"rmsnorm_bf16_1x10_special", T_KIND_RMSNORM, 0, 1, 10, BF16, BF16, T_SPECIAL, 0, 24, 1.0},
    {"rmsnorm_f32_4099x64_accum_misaligned", T_KIND_RMSNORM, 0, 4099, 64, F32, F32, T_ACCUM, 4,
     25, 3.0},
    {"rmsnorm_bf16_20000x128_many_parts", T_KIND_RMSNORM, 0, 20000, 128, BF16, BF16, 0, 0, 26,
     1.0},
    // dx from the row held in registers (qt_rmsnorm_bwd_dx_regs: BF16, whole chunks, at most
    // 4096 columns): lanes holding 9 chunks and 8, special values; then one chunk past its
    // limit, where the generic kernel takes the row.
    {"rmsnorm_bf16_37x2056_special_regs", T_KIND_RMSNORM, 0, 37, 2056, BF16, BF16, T_SPECIAL, 0,
     27, 1.0},
    {"rmsnorm_bf16_19x4104_past_regs", T_KIND_RMSNORM, 0, 19, 4104, BF16, BF16, 0, 0, 28, 1.0},
    // The forward kernel in registers with FP32 y (and the generic dx: FP32 dy), the widest row.
    {"rmsnorm_bf16_f32_33x4096_regs", T_KIND_RMSNORM, 0, 33, 4096, BF16, F32, T_SPECIAL, 0, 29,
     1.0},
    // The forward kernel in registers with FP32 x: the widest row it holds (8 chunks a lane),
    // lanes of 5 chunks and 4, special values; one chunk past its limit takes the generic one.
    {"rmsnorm_f32_bf16_21x2048_regs", T_KIND_RMSNORM, 0, 21, 2048, F32, BF16, T_SPECIAL, 0, 34,
     1.0},
    {"rmsnorm_f32_40x1160_special_regs", T_KIND_RMSNORM, 0, 40, 1160, F32, F32, T_SPECIAL, 0, 35,
     1.0},
    {"rmsnorm_f32_bf16_9x2056_past_regs", T_KIND_RMSNORM, 0, 9, 2056, F32, BF16, 0, 0, 36, 1.0},
    {"residual_bf16_1024x1000", T_KIND_RESIDUAL, 0, 1024, 1000, BF16, BF16, 0, 0, 30, 2.0},
    {"residual_f32_bf16_257x3_special", T_KIND_RESIDUAL, 0, 257, 3, F32, BF16, T_SPECIAL, 0, 31,
     2.0},
    {"residual_f32_1x1", T_KIND_RESIDUAL, 0, 1, 1, F32, F32, 0, 0, 32, 2.0},
    {"residual_bf16_13x1009_misaligned", T_KIND_RESIDUAL, 0, 13, 1009, BF16, F32, T_SPECIAL, 4,
     33, 2.0},
    {"xent_bf16_f32_256x1024_ignore", T_KIND_XENT, 0, 256, 1024, BF16, F32, T_IGNORE, 0, 40,
     3.0},
    {"xent_f32_257x3_ignore_special", T_KIND_XENT, 0, 257, 3, F32, F32, T_IGNORE | T_SPECIAL, 0,
     41, 3.0},
    {"xent_bf16_13x1009", T_KIND_XENT, 0, 13, 1009, BF16, BF16, 0, 0, 42, 5.0},
    {"xent_f32_1x1", T_KIND_XENT, 0, 1, 1, F32, F32, 0, 0, 43, 1.0},
    {"xent_f32_1x10", T_KIND_XENT, 0, 1, 10, F32, F32, 0, 0, 44, 1.0},
    {"xent_bf16_4099x64_ignore_misaligned", T_KIND_XENT, 0, 4099, 64, BF16, BF16, T_IGNORE, 4,
     45, 4.0},
    {"xent_f32_33x50257", T_KIND_XENT, 0, 33, 50257, F32, F32, T_IGNORE, 0, 46, 2.0},
    {"xent_bf16_300x128_eval", T_KIND_XENT, 0, 300, 128, BF16, F32, T_NO_GRAD | T_SPECIAL, 0,
     47, 30.0},
    {"mse_f32_257x3_valid", T_KIND_MSE, 0, 257, 3, F32, F32, T_IGNORE, 0, 50, 2.0},
    {"mse_bf16_64x4096", T_KIND_MSE, 0, 64, 4096, BF16, BF16, 0, 0, 51, 2.0},
    {"mse_bf16_f32_13x1009_special", T_KIND_MSE, 0, 13, 1009, BF16, F32, T_SPECIAL, 0, 52, 2.0},
    {"mse_f32_1x1", T_KIND_MSE, 0, 1, 1, F32, F32, 0, 0, 53, 2.0},
    {"mse_f32_1x10_valid_misaligned", T_KIND_MSE, 0, 1, 10, F32, F32, T_IGNORE, 4, 54, 2.0},
    {"mse_f32_5000x16_eval", T_KIND_MSE, 0, 5000, 16, F32, F32, T_NO_GRAD, 0, 55, 2.0},
    {"gnorm_257x3_clip1", T_KIND_GNORM, 1, 257, 3, F32, F32, 0, 0, 60, 0.1},
    {"gnorm_64x4096_special", T_KIND_GNORM, 1, 64, 4096, F32, F32, T_SPECIAL, 0, 61, 0.1},
    {"gnorm_1000x8193_noclip", T_KIND_GNORM, 0, 1000, 8193, F32, F32, 0, 0, 62, 0.01},
    {"gnorm_1x1_misaligned", T_KIND_GNORM, 2, 1, 1, F32, F32, 0, 4, 63, 1.0},
    {"gnorm_13x1009_misaligned", T_KIND_GNORM, 5, 13, 1009, F32, F32, 0, 4, 64, 1.0},
};

// On the reference backend, each in-place case's dy buffer ends with the dx (and the dx amax)
// of the same case written to a buffer of its own: the twin reads a chunk before it writes it.
static void test_act_in_place_ref(void) {
    test_begin("act_backward_in_place_equals_out_of_place_ref");
    uint32_t cases = 0;
    for (size_t i = 0; i < sizeof t_gpu_cases / sizeof t_gpu_cases[0]; i++) {
        const t_case *c = &t_gpu_cases[i];
        if (!(c->flags & T_IN_PLACE)) continue;
        t_case apart = *c;
        apart.flags &= ~T_IN_PLACE;
        t_run *in = t_ref_run(c), *out = t_ref_run(&apart);
        t_compare_buf(c->name, t_slot(in, A_DY), t_slot(out, A_DX), c->cols);
        t_compare_buf(c->name, t_slot(in, A_DX_AMAX), t_slot(out, A_DX_AMAX), 1);
        t_compare_buf(c->name, t_slot(in, A_Y), t_slot(out, A_Y), c->cols);
        t_ref_free(in);
        t_ref_free(out);
        cases++;
    }
    CHECK(cases == 4, "%u in-place cases", cases);
    test_end();
}

#undef F32
#undef BF16

int main(void) {
    TEST_UNIT(test_act_special_values());
    TEST_UNIT(test_gelu_chunks_scalar());
    TEST_UNIT(test_act_edge_ranges());
    TEST_UNIT(test_act_lut_entries());
    TEST_UNIT(test_act_lut_pairs());
    TEST_UNIT(test_act_lut_choice());
    TEST_UNIT(test_act_amax_from_max());
    TEST_UNIT(test_act_accuracy());
    TEST_UNIT(test_swiglu_accuracy());
    TEST_UNIT(test_rmsnorm_parts());
    TEST_UNIT(test_rmsnorm_accuracy());
    TEST_UNIT(test_rmsnorm_special_rows());
    TEST_UNIT(test_documented_row_order());
    TEST_UNIT(test_residual_exact());
    TEST_UNIT(test_xent_accuracy());
    TEST_UNIT(test_xent_special());
    TEST_UNIT(test_mse_accuracy());
    TEST_UNIT(test_mse_valid_rows());
    TEST_UNIT(test_gnorm_accuracy());
    TEST_UNIT(test_gnorm_special());
    TEST_UNIT(test_loss_one_block_matches_split_ref());
    TEST_UNIT(test_act_in_place_ref());
    for (size_t i = 0; i < sizeof t_gpu_cases / sizeof t_gpu_cases[0]; i++) {
        TEST_UNIT(t_gpu_case(&t_gpu_cases[i]));
    }
    TEST_UNIT(test_gpu_loss_one_block());
    return test_exit_code();
}
