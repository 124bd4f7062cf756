// quant_fp8: per-tensor FP8 (E4M3 / E5M2) with delayed or current scaling: the kernels' ABI
// (ptx/quant_fp8.cu) and the per-element and per-slot arithmetic they share with their C twins
// (runtime/ref/ref_quant_fp8.c).
//
// Owns nothing. Storage (ptx/quant.h): rowwise codes u8 [M][K], columnwise codes u8 [K][M] (the
// exact byte transpose), one FP32 scale_inv per member shared by both. Grouped tensors keep the
// dense layout of the padded [rows][K] matrix, with scale, scale_inv and amax arrays of n.
//
//   kernel                    what                                       launch
//   qt_fp8_amax_zero          amax[0..slots) = +0                        1-D over slots
//   qt_fp8_amax               amax[member] = max |x| over valid rows     <= 1024 blocks x 256,
//                             (atomicMax of per-block maxima)            contiguous slices
//   qt_fp8_cast_bf16 / _f32   rowwise + columnwise codes, scale_inv,     one 64 x 128 tile per
//                             optional amax (delayed) or scale from      block, 256 threads
//                             amax (current)
//   qt_fp8_delayed_update     history roll + scale update of k slots     one thread per slot
//   qt_fp8_delayed_states     end of step of up to QT_FP8_STATES_PER_OP  one block per slot
//                             states: amax snapshot, roll + scale        of all the states
//                             update, scale snapshot (eval and infer:
//                             the scale snapshot alone)
//   qt_fp8_dequantize         codes * scale_inv -> bf16 / f32 [M][K]     32 x 32 tiles, 256 thr.
//   qt_fp8_act_cast_fwd/_bwd  GELU / SiLU (or its backward) and the      persistent, 256 thr.,
//                             cast of its BF16 output, or only the       up to 4 blocks an SM
//                             output's amax (fp8_act_cast_args)
//
// Fast paths: 16-byte input loads need a 16-byte aligned x and cols % 8 == 0; 8-byte code stores
// need 8-byte aligned outputs and cols % 8 == 0 (rowwise) or rows % 8 == 0 (columnwise). Anything
// else takes element-wise loads and byte stores with the same results.
//
// Amaxes are accumulated with atomicMax on the bit pattern of non-negative floats, which orders
// like the values. The maximum is exact, commutative and idempotent, so the result does not
// depend on the grid or on the order of the atomics; the target must start at +0, which the
// separate zeroing op guarantees for current scaling and the history roll (row 0 := 0) for
// delayed scaling. A partials workspace was not used because a block's slice can span any number
// of grouped members.
#ifndef QT_QUANT_FP8_H
#define QT_QUANT_FP8_H

#include "ptx/core.h"         // QT_DTYPE_BF16, QT_DTYPE_F32
#include "ptx/qt_codec.h"     // qt_f32_to_e4m3, qt_scale_from_amax, ...
#include "ptx/quant.h"        // qt_group_desc
#include "ptx/quant_group.h"  // qt_group_member_rows, qt_group_find

#define QT_FP8_E4M3 0u
#define QT_FP8_E5M2 1u

// Where a cast gets its scale.
#define QT_FP8_SCALE_DELAYED 0u  // scale[member] from device memory (the delayed-scaling state)
#define QT_FP8_SCALE_CURRENT 1u  // scale_from_amax(amax_in[member]) of this tensor, this step

#define QT_FP8_AMAX_ALGO_MAX 0u          // max over the history window
#define QT_FP8_AMAX_ALGO_MOST_RECENT 1u  // this step's amax

// Launch constants shared by kernels and op builders.
#define QT_FP8_CAST_TILE_ROWS 64
#define QT_FP8_CAST_TILE_COLS 128
#define QT_FP8_CAST_THREADS 256
#define QT_FP8_AMAX_THREADS 256
#define QT_FP8_AMAX_BLOCK_ELEMS_MIN 16384  // a block's slice is at least this many elements
#define QT_FP8_DEQ_TILE 32
#define QT_FP8_DEQ_THREADS 256
#define QT_FP8_UPDATE_THREADS 256

typedef struct fp8_amax_zero_args {
    uint64_t amax;   // f32 [slots], written +0
    uint32_t slots;
    uint32_t reserved;
} fp8_amax_zero_args;
QT_STATIC_ASSERT(sizeof(fp8_amax_zero_args) == 16, "fp8_amax_zero_args layout");

typedef struct fp8_amax_args {
    uint64_t x;           // (rows, cols) bf16 | f32
    uint64_t amax;        // f32 [max(count, 1)], atomically maxed; must start at +0
    qt_group_desc group;  // count 0 = dense
    uint32_t rows, cols;  // rows = the buffer's row capacity
    uint32_t dtype;       // QT_DTYPE_BF16 | QT_DTYPE_F32
    uint32_t reserved;
} fp8_amax_args;
QT_STATIC_ASSERT(sizeof(fp8_amax_args) == 56, "fp8_amax_args layout");

typedef struct fp8_cast_args {
    uint64_t x;           // (rows, cols) bf16 | f32
    uint64_t rowwise;     // u8 (rows, cols) codes; 0 = not produced
    uint64_t colwise;     // u8 (cols, rows) codes, the byte transpose; 0 = not produced
    uint64_t scale;       // f32 [n]: DELAYED reads it; CURRENT writes it unless 0
    uint64_t scale_inv;   // f32 [n] written: RN(1 / scale)
    uint64_t amax_in;     // f32 [n]: CURRENT only, this tensor's amax
    uint64_t amax_out;    // f32 [n]: DELAYED only, 0 = none: atomic max of |x| (history row 0)
    qt_group_desc group;  // count 0 = dense (n = 1)
    uint32_t rows, cols;
    uint32_t dtype;       // must match the kernel (qt_fp8_cast_bf16 / qt_fp8_cast_f32)
    uint32_t fp8;         // QT_FP8_E4M3 | QT_FP8_E5M2
    uint32_t scale_mode;  // QT_FP8_SCALE_DELAYED | QT_FP8_SCALE_CURRENT
    uint32_t pow2;        // CURRENT: round the scale down to a power of two
    float eps;            // CURRENT: amax epsilon
    uint32_t reserved;
} fp8_cast_args;
QT_STATIC_ASSERT(sizeof(fp8_cast_args) == 112, "fp8_cast_args layout");

typedef struct fp8_delayed_update_args {
    uint64_t history;      // f32 [history_len][slots]; row 0 is the current step's amax
    uint64_t scale;        // f32 [slots], updated in place
    uint64_t reduced;      // f32 [slots] all-reduced current amaxes; 0 = none (one GPU)
    uint32_t slots;
    uint32_t history_len;  // >= 1
    uint32_t algo;         // QT_FP8_AMAX_ALGO_*
    float scaled_max;      // f32(qmax) * 2^-margin
} fp8_delayed_update_args;
QT_STATIC_ASSERT(sizeof(fp8_delayed_update_args) == 40, "fp8_delayed_update_args layout");

typedef struct fp8_dequantize_args {
    uint64_t codes;       // u8 (rows, cols), or (cols, rows) when colwise
    uint64_t scale_inv;   // f32 [n]
    uint64_t out;         // (rows, cols) bf16 | f32
    qt_group_desc group;  // count 0 = dense
    uint32_t rows, cols;  // of the high-precision [M][K] orientation
    uint32_t dtype;       // of out
    uint32_t fp8;
    uint32_t colwise;     // 1: codes are the transposed [K][M] copy
    uint32_t reserved;
} fp8_dequantize_args;
QT_STATIC_ASSERT(sizeof(fp8_dequantize_args) == 72, "fp8_dequantize_args layout");

// The columnwise copy of an FP8 tensor from its rowwise one, where the first is the second
// transposed: out [cols][rows] is the byte transpose of codes [rows][cols], and, when scales is
// given, scales_out [scale_cols][scale_rows] the transpose of the f32 grid scales
// [scale_rows][scale_cols]. That holds for a per-tensor scale (no grid: both copies share it)
// and for FP8 block scaling's 128 x 128 tiles (ptx/quant_block.h), so the result is bit for bit
// the columnwise output of the cast that wrote the rowwise copy (a weight whose columnwise copy
// is made in the step that reads it, rather than stored). One block of QT_FP8_CAST_THREADS per
// QT_FP8_CAST_TILE_ROWS x QT_FP8_CAST_TILE_COLS tile, as the cast; the grid's threads also
// stride over the scale grid, one element each.
typedef struct fp8_transpose_args {
    uint64_t codes;       // u8 [rows][cols]
    uint64_t out;         // u8 [cols][rows]
    uint64_t scales;      // f32 [scale_rows][scale_cols]; 0 = none
    uint64_t scales_out;  // f32 [scale_cols][scale_rows]
    uint32_t rows, cols;
    uint32_t scale_rows, scale_cols;
} fp8_transpose_args;
QT_STATIC_ASSERT(sizeof(fp8_transpose_args) == 48, "fp8_transpose_args layout");

// An activation and the per-tensor FP8 cast of its output, in one pass over the activation's
// input (qt_fp8_act_cast_fwd, qt_fp8_act_cast_bwd). y = act(x) forward, dy * act'(x) backward,
// rounded to BF16: the very tensor that qt_act_fwd or qt_act_bwd (ptx/act.h) would store, through
// the same table, which is never written; then y is cast as qt_fp8_cast_bf16 casts a dense BF16
// tensor: the same codes, scale_inv and (delayed) amax. With neither rowwise nor colwise, the
// launch writes only max |y| into cast.amax_out (NaN skipped): the amax that a current-scaling
// cast of y reads, so that the activation's output is never stored at all, at one more read of x.
// Forward, where the GEMM that wrote x gave its maximum (x_max, the slot of gemm_args.d_max) and
// that maximum alone gives the amax (ptx/act_math.h, qt_act_amax_from_max), the launch writes that
// amax without reading x: block 0 merges it, every block returns at once.
// Dense only (cast.group.count 0), x and dy BF16, cols % 8 == 0, x, dy and the outputs 16-byte
// aligned. Persistent: each block computes its table once, then takes the 64 x 128 tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... (values never depend on the grid).
typedef struct fp8_act_cast_args {
    fp8_cast_args cast;  // x: the activation's input; dtype QT_DTYPE_BF16
    uint64_t dy;         // backward only: BF16 (rows, cols), the gradient at the output
    uint32_t act;        // QT_ACT_GELU | QT_ACT_SILU (ptx/act_math.h)
    uint32_t reserved;
    uint64_t x_max;      // forward amax only, 0 = none: u32, x's maximum slot (gemm.h d_max)
} fp8_act_cast_args;
QT_STATIC_ASSERT(sizeof(fp8_act_cast_args) == 136, "fp8_act_cast_args layout");

#define QT_FP8_ACT_CAST_BLOCKS_PER_SM 4  // the kernels' __launch_bounds__ minimum

// The end of a step for several delayed-scaling states in one launch (a step's tail otherwise
// costs three small launches per state). Slot j of state s is entry first + j of the snapshot
// arrays (the trace's quantizer order), and its work is, in this order (the C twin: one call of
// qt_fp8_delayed_states_slot; the kernel: one block, which shares the roll among its threads):
//   update = 1 (training):   amax_out[e] = history[0][j], this step's amax before the roll;
//                            the update of qt_fp8_delayed_update_slot (no all-reduced amaxes);
//                            scale_out[e] = scale[j], the scale the next step casts with
//                            A step the optimizer skipped (*skip != 0: a non-finite gradient)
//                            leaves the state as it was before the step: history[0][j] (zero
//                            when the step began) := 0, no roll, the scale stays; the amax
//                            snapshot still shows the step's amax
//   update = 0 (eval, infer): scale_out[e] = scale[j]; nothing is written to the state
// Snapshots are bit copies. States beyond QT_FP8_STATES_PER_OP take more launches; they touch
// disjoint slots, so their order does not matter.
#define QT_FP8_STATES_PER_OP 5

typedef struct fp8_delayed_state {
    uint64_t history;      // f32 [history_len][slots]; row 0 is the current step's amax
    uint64_t scale;        // f32 [slots], updated in place
    uint32_t slots;        // >= 1
    uint32_t history_len;  // >= 1
    uint32_t algo;         // QT_FP8_AMAX_ALGO_*
    float scaled_max;      // f32(qmax) * 2^-margin
    uint32_t first;        // snapshot entry of slot 0
    uint32_t reserved;
} fp8_delayed_state;
QT_STATIC_ASSERT(sizeof(fp8_delayed_state) == 40, "fp8_delayed_state layout");

typedef struct fp8_delayed_states_args {
    uint64_t amax_out;   // f32 [entries], update only; 0 = no amax snapshot
    uint64_t scale_out;  // f32 [entries]; 0 = no scale snapshot
    uint64_t skip;       // u32, update only: non-zero when this step is skipped; 0 = never
    uint32_t count;      // states in this launch, 1 ..= QT_FP8_STATES_PER_OP
    uint32_t update;     // 1: snapshot, roll and update (training); 0: scale snapshot only
    fp8_delayed_state states[QT_FP8_STATES_PER_OP];
} fp8_delayed_states_args;
QT_STATIC_ASSERT(sizeof(fp8_delayed_states_args) == 232, "fp8_delayed_states_args layout");

#define QT_KERNELS_QUANT_FP8(X)                                                              \
    X(KERNEL_FP8_AMAX_ZERO, quant_fp8, qt_fp8_amax_zero, fp8_amax_zero_args)                 \
    X(KERNEL_FP8_AMAX, quant_fp8, qt_fp8_amax, fp8_amax_args)                                \
    X(KERNEL_FP8_CAST_BF16, quant_fp8, qt_fp8_cast_bf16, fp8_cast_args)                      \
    X(KERNEL_FP8_CAST_F32, quant_fp8, qt_fp8_cast_f32, fp8_cast_args)                        \
    X(KERNEL_FP8_DELAYED_UPDATE, quant_fp8, qt_fp8_delayed_update, fp8_delayed_update_args)  \
    X(KERNEL_FP8_DELAYED_STATES, quant_fp8, qt_fp8_delayed_states, fp8_delayed_states_args)  \
    X(KERNEL_FP8_DEQUANTIZE, quant_fp8, qt_fp8_dequantize, fp8_dequantize_args)           \
    X(KERNEL_FP8_TRANSPOSE, quant_fp8, qt_fp8_transpose, fp8_transpose_args)               \
    X(KERNEL_FP8_ACT_CAST_FWD, quant_fp8, qt_fp8_act_cast_fwd, fp8_act_cast_args)         \
    X(KERNEL_FP8_ACT_CAST_BWD, quant_fp8, qt_fp8_act_cast_bwd, fp8_act_cast_args)

// ---------------------------------------------------------------------------------------------
// Per element.

QT_HD float qt_fp8_qmax(uint32_t fp8) { return fp8 == QT_FP8_E5M2 ? QT_E5M2_MAX : QT_E4M3_MAX; }

QT_HD uint8_t qt_fp8_encode(float v, uint32_t fp8) {
    return fp8 == QT_FP8_E5M2 ? qt_f32_to_e5m2(v) : qt_f32_to_e4m3(v);
}

QT_HD float qt_fp8_decode(uint8_t code, uint32_t fp8) {
    return fp8 == QT_FP8_E5M2 ? qt_e5m2_to_f32(code) : qt_e4m3_to_f32(code);
}

// q = satFP8(RN(x * scale)), the per-tensor FP8 rule: one FP32 multiply, then one conversion.
// The kernels convert with cvt.rn.satfinite, which the tests find equal to this codec bit for bit.
QT_HD uint8_t qt_fp8_quantize(float x, float scale, uint32_t fp8) {
    return qt_fp8_encode(x * scale, fp8);
}

// NVIDIA GPUs return the canonical NaN 0x7FFFFFFF from arithmetic on NaN operands, while x86
// keeps an operand's payload and sign (and makes 0 * Inf a negative NaN). Writing every NaN
// result as 0x7FFFFFFF on both sides keeps the twins bitwise equal for any input.
QT_HD float qt_fp8_nan_canonical(float v) {
    return qt_f32_is_nan(v) ? qt_bits_f32(0x7FFFFFFFu) : v;
}

// scale_inv = RN(1 / scale) (__frcp_rn): an IEEE division on both sides.
QT_HD float qt_fp8_scale_inv(float scale) { return qt_fp8_nan_canonical(1.0f / scale); }

// x = fp8 value * scale_inv, one RN multiply.
QT_HD float qt_fp8_dequantize_value(uint8_t code, uint32_t fp8, float scale_inv) {
    return qt_fp8_nan_canonical(qt_fp8_decode(code, fp8) * scale_inv);
}

// amax step: acc = fmaxf(acc, |x|). NaN elements are ignored and the result is
// never NaN. acc starts at +0 and only ever takes |x| values, so it is never NaN or -0, and the
// comparison below returns what fmaxf returns (the device uses fmaxf itself: one instruction).
QT_HD float qt_fp8_amax_step(float acc, float x) {
#if defined(__CUDA_ARCH__)
    return fmaxf(acc, fabsf(x));
#else
    float a = qt_bits_f32(qt_f32_bits(x) & QT_F32_ABS);
    return a > acc ? a : acc;
#endif
}

// The C twin of atomicMax((unsigned *)slot, bits(v)): an unsigned maximum of the bit patterns,
// which is the float maximum when both are non-negative (and does what the GPU does otherwise).
QT_HD void qt_fp8_amax_merge(float *slot, float v) {
    if (qt_f32_bits(v) > qt_f32_bits(*slot)) *slot = v;
}

// fmaxf's NaN rule (the non-NaN operand wins), written out so that both sides run the same code.
QT_HD float qt_fp8_fmaxf(float a, float b) {
    if (qt_f32_is_nan(a)) return b;
    if (qt_f32_is_nan(b)) return a;
    return b > a ? b : a;
}

// The scale a cast uses for one member.
QT_HD float qt_fp8_member_scale(const fp8_cast_args *a, uint32_t member) {
    if (a->scale_mode == QT_FP8_SCALE_CURRENT) {
        float amax = ((const float *)(uintptr_t)a->amax_in)[member];
        return qt_scale_from_amax(amax, qt_fp8_qmax(a->fp8), (int)a->pow2, a->eps,
                                  QT_F32_FLT_MAX);
    }
    return ((const float *)(uintptr_t)a->scale)[member];
}

// ---------------------------------------------------------------------------------------------
// Delayed scaling update of one slot j (TE's fused bulk kernel):
//   a_cur = reduced[j] if given and non-zero, else history[0][j];
//   a_cur == 0: nothing rolls and the update's amax is 0 (scale kept); a NaN a_cur is not 0;
//   else roll: new[i] = old[i+1] (i < L-1), new[L-1] = a_cur, then new[0] = 0 (so with L = 1
//   the single row becomes 0, as TE writes row 0 last), and the amax is fmaxf over
//   0, old[1..L-1], a_cur ("max") or a_cur ("most_recent");
//   scale = RN(scaled_max / amax) when amax is finite and > 0, else the old scale; an infinite
//   result (of either branch) becomes FLT_MAX. scale_inv is left to the next cast.
QT_HD float qt_fp8_delayed_scale(float amax, float scaled_max, float scale_old) {
    float scale = scale_old;
    if (amax > 0.0f && !qt_f32_is_inf(amax)) scale = scaled_max / amax;
    if (qt_f32_is_inf(scale)) scale = QT_F32_FLT_MAX;
    return scale;
}

#define QT_FP8_ROLL_CHUNK 16

QT_HD void qt_fp8_delayed_update_slot(const fp8_delayed_update_args *a, uint32_t j) {
    float *history = (float *)(uintptr_t)a->history;
    const float *reduced = (const float *)(uintptr_t)a->reduced;
    uint32_t slots = a->slots, len = a->history_len;
    float a_cur = history[j];
    if (reduced != 0 && reduced[j] != 0.0f) a_cur = reduced[j];
    float amax = 0.0f;
    if (a_cur != 0.0f) {
        // In place, QT_FP8_ROLL_CHUNK rows at a time: all reads of a chunk (old[i + 1]) come
        // before its writes (new[i]), and no write lands on a row a later chunk still reads. The
        // GPU thus keeps a chunk of independent loads in flight instead of one.
        for (uint32_t c = 0; c < len; c += QT_FP8_ROLL_CHUNK) {
            float v[QT_FP8_ROLL_CHUNK];
            for (uint32_t q = 0; q < QT_FP8_ROLL_CHUNK; q++) {
                uint32_t i = c + q;
                v[q] = i + 1 < len ? history[(uint64_t)(i + 1) * slots + j] : a_cur;
            }
            for (uint32_t q = 0; q < QT_FP8_ROLL_CHUNK && c + q < len; q++) {
                amax = qt_fp8_fmaxf(amax, v[q]);
                history[(uint64_t)(c + q) * slots + j] = c + q > 0 ? v[q] : 0.0f;
            }
        }
        if (a->algo == QT_FP8_AMAX_ALGO_MOST_RECENT) amax = a_cur;
    }
    float *scale = (float *)(uintptr_t)a->scale;
    scale[j] = qt_fp8_delayed_scale(amax, a->scaled_max, scale[j]);
}

// Slot `index` of a qt_fp8_delayed_states launch, counted over its states in order: the state
// (*state) and the slot within it (*slot); 0 past the last state's slots.
QT_HD int qt_fp8_delayed_states_find(const fp8_delayed_states_args *a, uint32_t index,
                                      uint32_t *state, uint32_t *slot) {
    for (uint32_t s = 0; s < a->count; s++) {
        if (index < a->states[s].slots) {
            *state = s;
            *slot = index;
            return 1;
        }
        index -= a->states[s].slots;
    }
    return 0;
}

// One slot of qt_fp8_delayed_states: the snapshots around the update, in the order above.
QT_HD void qt_fp8_delayed_states_slot(const fp8_delayed_states_args *a, uint32_t state,
                                      uint32_t j) {
    const fp8_delayed_state *st = &a->states[state];
    uint32_t entry = st->first + j;
    if (a->update) {
        if (a->amax_out) {
            ((uint32_t *)(uintptr_t)a->amax_out)[entry] =
                ((const uint32_t *)(uintptr_t)st->history)[j];
        }
        if (a->skip != 0 && *(const uint32_t *)(uintptr_t)a->skip != 0) {
            ((float *)(uintptr_t)st->history)[j] = 0.0f;
        } else {
            fp8_delayed_update_args u = {st->history, st->scale, 0, st->slots, st->history_len,
                                         st->algo, st->scaled_max};
            qt_fp8_delayed_update_slot(&u, j);
        }
    }
    if (a->scale_out) {
        const uint32_t *scale = (const uint32_t *)(uintptr_t)st->scale;
        ((uint32_t *)(uintptr_t)a->scale_out)[entry] = scale[j];
    }
}

// ---------------------------------------------------------------------------------------------
// Byte transpose of a 4 x 4 block held in four words (word r = row r, byte c = column c):
// afterwards word c holds column c (byte r = row r). The device uses prmt; the host the same
// selectors on plain shifts, so the test program checks the selectors without a GPU.
QT_HD uint32_t qt_fp8_byte_perm(uint32_t x, uint32_t y, uint32_t selector) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(x, y, selector);
#else
    uint64_t both = ((uint64_t)y << 32) | x;
    uint32_t out = 0;
    for (int b = 0; b < 4; b++) {
        uint32_t pick = (selector >> (4 * b)) & 7u;
        out |= (uint32_t)((both >> (8 * pick)) & 0xFFu) << (8 * b);
    }
    return out;
#endif
}

QT_HD void qt_fp8_transpose4x4(uint32_t w[4]) {
    uint32_t t0 = qt_fp8_byte_perm(w[0], w[1], 0x5140u);  // r0c0 r1c0 r0c1 r1c1
    uint32_t t1 = qt_fp8_byte_perm(w[0], w[1], 0x7362u);  // r0c2 r1c2 r0c3 r1c3
    uint32_t t2 = qt_fp8_byte_perm(w[2], w[3], 0x5140u);  // r2c0 r3c0 r2c1 r3c1
    uint32_t t3 = qt_fp8_byte_perm(w[2], w[3], 0x7362u);  // r2c2 r3c2 r2c3 r3c3
    w[0] = qt_fp8_byte_perm(t0, t2, 0x5410u);             // r0c0 r1c0 r2c0 r3c0
    w[1] = qt_fp8_byte_perm(t0, t2, 0x7632u);
    w[2] = qt_fp8_byte_perm(t1, t3, 0x5410u);
    w[3] = qt_fp8_byte_perm(t1, t3, 0x7632u);
}

#endif  // QT_QUANT_FP8_H
