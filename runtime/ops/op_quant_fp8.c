#include "runtime/ops/op_quant_fp8.h"

#include <math.h>    // ldexpf
#include <stddef.h>  // offsetof

#include "ptx/act_math.h"         // QT_ACT_GELU, QT_ACT_SILU
#include "runtime/ops/op_core.h"  // OP_GRID_BLOCKS_MAX, OP_PLAN_SMS

static void op_fp8_check_input(const op_fp8_input *in) {
    QT_ASSERT(in->dtype == QT_DTYPE_BF16 || in->dtype == QT_DTYPE_F32);
    QT_ASSERT(in->rows >= 1 && in->cols >= 1);
    QT_ASSERT(prog_ref_present(in->x));
}

static uint32_t op_fp8_members(const op_fp8_input *in) {
    return in->group.count ? in->group.count : 1u;
}

// The QT_FP8_CAST_TILE_ROWS x QT_FP8_CAST_TILE_COLS tiles of a rows x cols tensor: the grid of
// the cast and the transpose, and the work list of the activation casts.
static uint64_t op_fp8_tiles(uint32_t rows, uint32_t cols) {
    uint64_t tiles = (uint64_t)((rows + QT_FP8_CAST_TILE_ROWS - 1) / QT_FP8_CAST_TILE_ROWS) *
                     ((cols + QT_FP8_CAST_TILE_COLS - 1) / QT_FP8_CAST_TILE_COLS);
    QT_ASSERT(tiles <= 0x7FFFFFFFu);
    return tiles;
}

qt_status op_fp8_amax_zero(program *p, const char *name, prog_ref amax, uint32_t slots) {
    QT_ASSERT(slots >= 1);
    fp8_amax_zero_args zero = {0, slots, 0};
    launch_shape zero_shape = op_shape_1d(slots, 256);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FP8_AMAX_ZERO, name, &zero_shape, &zero, sizeof zero, &op));
    return prog_use(p, op, offsetof(fp8_amax_zero_args, amax), amax, PROG_WRITE);
}

qt_status op_fp8_amax(program *p, const char *name, const op_fp8_input *in, prog_ref amax) {
    op_fp8_check_input(in);
    QT_TRY(op_fp8_amax_zero(p, name, amax, op_fp8_members(in)));
    return op_fp8_amax_merge(p, name, in, amax);
}

qt_status op_fp8_amax_merge(program *p, const char *name, const op_fp8_input *in,
                            prog_ref amax) {
    op_fp8_check_input(in);
    uint32_t op;
    fp8_amax_args args = {0};
    args.rows = in->rows;
    args.cols = in->cols;
    args.dtype = in->dtype;
    uint64_t elems = (uint64_t)in->rows * in->cols;
    uint64_t blocks = (elems + QT_FP8_AMAX_BLOCK_ELEMS_MIN - 1) / QT_FP8_AMAX_BLOCK_ELEMS_MIN;
    if (blocks > OP_GRID_BLOCKS_MAX) blocks = OP_GRID_BLOCKS_MAX;
    launch_shape shape = {{(uint32_t)blocks, 1, 1}, {QT_FP8_AMAX_THREADS, 1, 1}, 0};
    QT_TRY(prog_append(p, KERNEL_FP8_AMAX, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(fp8_amax_args, x), in->x, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(fp8_amax_args, amax), amax, PROG_READ_WRITE));
    return op_group_use(p, op, offsetof(fp8_amax_args, group), &in->group);
}

// The cast op shared by both scaling modes; the caller declares the scale/amax regions.
static qt_status op_fp8_cast_append(program *p, const char *name, const op_fp8_input *in,
                                    const op_fp8_output *out, fp8_cast_args *args,
                                    uint32_t *op) {
    op_fp8_check_input(in);
    QT_ASSERT(out->fp8 == QT_FP8_E4M3 || out->fp8 == QT_FP8_E5M2);
    QT_ASSERT(prog_ref_present(out->scale_inv));
    args->rows = in->rows;
    args->cols = in->cols;
    args->dtype = in->dtype;
    args->fp8 = out->fp8;
    uint64_t tiles = op_fp8_tiles(in->rows, in->cols);
    launch_shape shape = {{(uint32_t)tiles, 1, 1}, {QT_FP8_CAST_THREADS, 1, 1}, 0};
    kernel_id kernel = in->dtype == QT_DTYPE_BF16 ? KERNEL_FP8_CAST_BF16 : KERNEL_FP8_CAST_F32;
    QT_TRY(prog_append(p, kernel, name, &shape, args, sizeof *args, op));
    QT_TRY(prog_use(p, *op, offsetof(fp8_cast_args, x), in->x, PROG_READ));
    QT_TRY(prog_use_optional(p, *op, offsetof(fp8_cast_args, rowwise),
                             out->rowwise, 0, PROG_WRITE));
    QT_TRY(prog_use_optional(p, *op, offsetof(fp8_cast_args, colwise),
                             out->colwise, 0, PROG_WRITE));
    QT_TRY(prog_use(p, *op, offsetof(fp8_cast_args, scale_inv), out->scale_inv, PROG_WRITE));
    return op_group_use(p, *op, offsetof(fp8_cast_args, group), &in->group);
}

qt_status op_fp8_cast_delayed(program *p, const char *name, const op_fp8_input *in,
                              const op_fp8_output *out, prog_ref scale, prog_ref amax_slots) {
    QT_ASSERT(prog_ref_present(scale));
    fp8_cast_args args = {0};
    args.scale_mode = QT_FP8_SCALE_DELAYED;
    uint32_t op;
    QT_TRY(op_fp8_cast_append(p, name, in, out, &args, &op));
    QT_TRY(prog_use(p, op, offsetof(fp8_cast_args, scale), scale, PROG_READ));
    // An atomic max reads and writes the slot.
    return prog_use_optional(p, op, offsetof(fp8_cast_args, amax_out),
                             amax_slots, 0, PROG_READ_WRITE);
}

qt_status op_fp8_cast_current(program *p, const char *name, const op_fp8_input *in,
                              const op_fp8_output *out, prog_ref amax, prog_ref scale, bool pow2,
                              float eps) {
    QT_ASSERT(prog_ref_present(amax));
    fp8_cast_args args = {0};
    args.scale_mode = QT_FP8_SCALE_CURRENT;
    args.pow2 = pow2 ? 1u : 0u;
    args.eps = eps;
    uint32_t op;
    QT_TRY(op_fp8_cast_append(p, name, in, out, &args, &op));
    QT_TRY(prog_use(p, op, offsetof(fp8_cast_args, amax_in), amax, PROG_READ));
    return prog_use_optional(p, op, offsetof(fp8_cast_args, scale), scale, 0, PROG_WRITE);
}

qt_status op_fp8_quantize_current(program *p, const char *name, const op_fp8_input *in,
                                  const op_fp8_output *out, prog_ref amax, prog_ref scale,
                                  bool pow2, float eps) {
    QT_TRY(op_fp8_amax(p, name, in, amax));
    return op_fp8_cast_current(p, name, in, out, amax, scale, pow2, eps);
}

// TE: fp8_max * std::pow(2.f, -margin); for an integer margin both factors and the product are
// exact powers-of-two scalings, which ldexpf computes exactly.
static float op_fp8_scaled_max(uint32_t fp8, int margin) {
    QT_ASSERT(fp8 == QT_FP8_E4M3 || fp8 == QT_FP8_E5M2);
    return ldexpf(qt_fp8_qmax(fp8), -margin);
}

qt_status op_fp8_delayed_update(program *p, const char *name, prog_ref history, prog_ref scale,
                                prog_ref reduced, uint32_t slots, uint32_t history_len,
                                uint32_t algo, uint32_t fp8, int margin) {
    QT_ASSERT(slots >= 1 && history_len >= 1);
    QT_ASSERT(algo == QT_FP8_AMAX_ALGO_MAX || algo == QT_FP8_AMAX_ALGO_MOST_RECENT);
    float scaled_max = op_fp8_scaled_max(fp8, margin);
    fp8_delayed_update_args args = {0, 0, 0, slots, history_len, algo, scaled_max};
    uint32_t blocks = (slots + QT_FP8_UPDATE_THREADS - 1) / QT_FP8_UPDATE_THREADS;
    launch_shape shape = {{blocks, 1, 1}, {QT_FP8_UPDATE_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FP8_DELAYED_UPDATE, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(fp8_delayed_update_args, history), history,
                    PROG_READ_WRITE));
    QT_TRY(prog_use(p, op, offsetof(fp8_delayed_update_args, scale), scale, PROG_READ_WRITE));
    return prog_use_optional(p, op, offsetof(fp8_delayed_update_args, reduced),
                             reduced, 0, PROG_READ);
}

// One op for states[0..count), count <= QT_FP8_STATES_PER_OP.
static qt_status op_fp8_delayed_states_op(program *p, const char *name,
                                          const op_fp8_delayed_state *states, uint32_t count,
                                          const op_fp8_delayed_end *end) {
    bool update = end->update;
    prog_ref amax_out = end->amax_out, scale_out = end->scale_out;
    uint32_t entries = end->entries;
    QT_ASSERT(count >= 1 && count <= QT_FP8_STATES_PER_OP);
    fp8_delayed_states_args args = {0};
    args.count = count;
    args.update = update ? 1u : 0u;
    uint64_t slots_total = 0;
    for (uint32_t s = 0; s < count; s++) {
        const op_fp8_delayed_state *st = &states[s];
        QT_ASSERT(st->slots >= 1 && st->history_len >= 1);
        QT_ASSERT(st->algo == QT_FP8_AMAX_ALGO_MAX || st->algo == QT_FP8_AMAX_ALGO_MOST_RECENT);
        QT_ASSERT((uint64_t)st->first + st->slots <= entries);
        args.states[s] = (fp8_delayed_state){0, 0, st->slots, st->history_len, st->algo,
                                             op_fp8_scaled_max(st->fp8, st->margin), st->first,
                                             0};
        slots_total += st->slots;
    }
    // One block per slot (its threads share the history roll): the kernel has no grid-stride
    // loop, so the grid is never capped.
    uint64_t blocks = slots_total;
    QT_ASSERT(blocks <= 0x7FFFFFFFu);
    launch_shape shape = {{(uint32_t)blocks, 1, 1}, {QT_FP8_UPDATE_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FP8_DELAYED_STATES, name, &shape, &args, sizeof args, &op));
    for (uint32_t s = 0; s < count; s++) {
        uint32_t at = (uint32_t)(offsetof(fp8_delayed_states_args, states) +
                                 s * sizeof(fp8_delayed_state));
        uint64_t slot_bytes = (uint64_t)states[s].slots * 4;
        if (update) {
            QT_TRY(prog_use_span(p, op, at + offsetof(fp8_delayed_state, history),
                                 states[s].history, slot_bytes * states[s].history_len,
                                 PROG_READ_WRITE));
        }
        QT_TRY(prog_use_span(p, op, at + offsetof(fp8_delayed_state, scale), states[s].scale,
                             slot_bytes, update ? PROG_READ_WRITE : PROG_READ));
    }
    if (update) {
        QT_TRY(prog_use_optional(p, op, offsetof(fp8_delayed_states_args, amax_out), amax_out,
                                 (uint64_t)entries * 4, PROG_WRITE));
        QT_TRY(prog_use_optional(p, op, offsetof(fp8_delayed_states_args, skip), end->skip, 4,
                                 PROG_READ));
    }
    return prog_use_optional(p, op, offsetof(fp8_delayed_states_args, scale_out), scale_out,
                             (uint64_t)entries * 4, PROG_WRITE);
}

qt_status op_fp8_delayed_states(program *p, const char *name, const op_fp8_delayed_state *states,
                                uint32_t count, const op_fp8_delayed_end *end) {
    QT_ASSERT(count >= 1);
    QT_ASSERT(end->update || (!prog_ref_present(end->amax_out) && !prog_ref_present(end->skip)));
    for (uint32_t first = 0; first < count; first += QT_FP8_STATES_PER_OP) {
        uint32_t n = count - first < QT_FP8_STATES_PER_OP ? count - first : QT_FP8_STATES_PER_OP;
        QT_TRY(op_fp8_delayed_states_op(p, name, states + first, n, end));
    }
    return QT_OK;
}

qt_status op_fp8_dequantize(program *p, const char *name, const op_fp8_input *hp,
                            const op_fp8_output *codes, bool colwise) {
    op_fp8_check_input(hp);
    prog_ref src = colwise ? codes->colwise : codes->rowwise;
    QT_ASSERT(prog_ref_present(src) && prog_ref_present(codes->scale_inv));
    fp8_dequantize_args args = {0};
    args.rows = hp->rows;
    args.cols = hp->cols;
    args.dtype = hp->dtype;
    args.fp8 = codes->fp8;
    args.colwise = colwise ? 1u : 0u;
    uint64_t tiles = (uint64_t)((hp->rows + QT_FP8_DEQ_TILE - 1) / QT_FP8_DEQ_TILE) *
                     ((hp->cols + QT_FP8_DEQ_TILE - 1) / QT_FP8_DEQ_TILE);
    QT_ASSERT(tiles <= 0x7FFFFFFFu);
    launch_shape shape = {{(uint32_t)tiles, 1, 1}, {QT_FP8_DEQ_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FP8_DEQUANTIZE, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(fp8_dequantize_args, codes), src, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(fp8_dequantize_args, scale_inv), codes->scale_inv,
                    PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(fp8_dequantize_args, out), hp->x, PROG_WRITE));
    return op_group_use(p, op, offsetof(fp8_dequantize_args, group), &hp->group);
}

qt_status op_fp8_transpose(program *p, const char *name, uint32_t rows, uint32_t cols,
                           prog_ref codes, prog_ref out, const op_fp8_scale_grid *grid) {
    QT_ASSERT(rows >= 1 && cols >= 1);
    QT_ASSERT(prog_ref_present(codes) && prog_ref_present(out));
    bool has_grid = grid && prog_ref_present(grid->scales);
    fp8_transpose_args args = {0};
    args.rows = rows;
    args.cols = cols;
    if (has_grid) {
        QT_ASSERT(prog_ref_present(grid->out) && grid->rows >= 1 && grid->cols >= 1);
        args.scale_rows = grid->rows;
        args.scale_cols = grid->cols;
    }
    uint64_t tiles = op_fp8_tiles(rows, cols);
    launch_shape shape = {{(uint32_t)tiles, 1, 1}, {QT_FP8_CAST_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FP8_TRANSPOSE, name, &shape, &args, sizeof args, &op));
    uint64_t bytes = (uint64_t)rows * cols;
    QT_TRY(prog_use_span(p, op, offsetof(fp8_transpose_args, codes), codes, bytes, PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(fp8_transpose_args, out), out, bytes, PROG_WRITE));
    if (!has_grid) return QT_OK;
    uint64_t scale_bytes = 4ull * grid->rows * grid->cols;
    QT_TRY(prog_use_span(p, op, offsetof(fp8_transpose_args, scales), grid->scales, scale_bytes,
                         PROG_READ));
    return prog_use_span(p, op, offsetof(fp8_transpose_args, scales_out), grid->out, scale_bytes,
                         PROG_WRITE);
}

// ---------------------------------------------------------------------------------------------
// An activation and the cast of its output (fp8_act_cast_args).

// The op shared by the three: args->cast holds the scaling mode and its fields; out NULL: the
// amax alone. The grid: every tile its block up to QT_FP8_ACT_CAST_BLOCKS_PER_SM blocks an SM of
// the planned GPUs (OP_PLAN_SMS), each block taking every gridDim.x-th tile after its own.
static qt_status op_fp8_act_append(program *p, const char *name, const op_fp8_act_input *in,
                                   const op_fp8_output *out, fp8_act_cast_args *args,
                                   uint32_t *op) {
    QT_ASSERT(in->act == QT_ACT_GELU || in->act == QT_ACT_SILU);
    QT_ASSERT(in->rows >= 1 && in->cols >= 1 && in->cols % 8 == 0);
    QT_ASSERT(prog_ref_present(in->x) && in->x.offset % 16 == 0);
    QT_ASSERT(!in->backward || (prog_ref_present(in->dy) && in->dy.offset % 16 == 0));
    args->act = in->act;
    args->cast.rows = in->rows;
    args->cast.cols = in->cols;
    args->cast.dtype = QT_DTYPE_BF16;
    uint64_t tiles = op_fp8_tiles(in->rows, in->cols);
    uint64_t blocks = OP_PLAN_SMS * QT_FP8_ACT_CAST_BLOCKS_PER_SM;
    if (tiles < blocks) blocks = tiles;
    launch_shape shape = {{(uint32_t)blocks, 1, 1}, {QT_FP8_CAST_THREADS, 1, 1}, 0};
    kernel_id kernel = in->backward ? KERNEL_FP8_ACT_CAST_BWD : KERNEL_FP8_ACT_CAST_FWD;
    if (out) {
        QT_ASSERT(out->fp8 == QT_FP8_E4M3 || out->fp8 == QT_FP8_E5M2);
        QT_ASSERT(prog_ref_present(out->scale_inv));
        QT_ASSERT(prog_ref_present(out->rowwise) || prog_ref_present(out->colwise));
        QT_ASSERT(out->rowwise.offset % 8 == 0 && out->colwise.offset % 8 == 0);
        args->cast.fp8 = out->fp8;
    }
    uint64_t bytes = (uint64_t)in->rows * in->cols;
    QT_TRY(prog_append(p, kernel, name, &shape, args, sizeof *args, op));
    QT_TRY(prog_use_span(p, *op, offsetof(fp8_act_cast_args, cast.x), in->x, 2 * bytes,
                         PROG_READ));
    if (in->backward) {
        QT_TRY(prog_use_span(p, *op, offsetof(fp8_act_cast_args, dy), in->dy, 2 * bytes,
                             PROG_READ));
    }
    if (!out) return QT_OK;
    QT_TRY(prog_use_optional(p, *op, offsetof(fp8_act_cast_args, cast.rowwise), out->rowwise,
                             bytes, PROG_WRITE));
    QT_TRY(prog_use_optional(p, *op, offsetof(fp8_act_cast_args, cast.colwise), out->colwise,
                             bytes, PROG_WRITE));
    return prog_use_span(p, *op, offsetof(fp8_act_cast_args, cast.scale_inv), out->scale_inv, 4,
                         PROG_WRITE);
}

qt_status op_fp8_act_amax_merge(program *p, const char *name, const op_fp8_act_input *in,
                                prog_ref amax) {
    QT_ASSERT(prog_ref_present(amax));
    fp8_act_cast_args args = {0};
    uint32_t op;
    QT_TRY(op_fp8_act_append(p, name, in, NULL, &args, &op));
    QT_ASSERT(!in->backward || !prog_ref_present(in->x_max));
    QT_TRY(prog_use_optional(p, op, offsetof(fp8_act_cast_args, x_max), in->x_max, 4,
                             PROG_READ));
    // An atomic max reads and writes the slot.
    return prog_use_span(p, op, offsetof(fp8_act_cast_args, cast.amax_out), amax, 4,
                         PROG_READ_WRITE);
}

qt_status op_fp8_act_cast_delayed(program *p, const char *name, const op_fp8_act_input *in,
                                  const op_fp8_output *out, prog_ref scale, prog_ref amax_slots) {
    QT_ASSERT(prog_ref_present(scale));
    fp8_act_cast_args args = {0};
    args.cast.scale_mode = QT_FP8_SCALE_DELAYED;
    uint32_t op;
    QT_TRY(op_fp8_act_append(p, name, in, out, &args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(fp8_act_cast_args, cast.scale), scale, 4, PROG_READ));
    return prog_use_optional(p, op, offsetof(fp8_act_cast_args, cast.amax_out), amax_slots, 4,
                             PROG_READ_WRITE);
}

qt_status op_fp8_act_cast_current(program *p, const char *name, const op_fp8_act_input *in,
                                  const op_fp8_output *out, prog_ref amax, bool pow2, float eps) {
    QT_ASSERT(prog_ref_present(amax));
    fp8_act_cast_args args = {0};
    args.cast.scale_mode = QT_FP8_SCALE_CURRENT;
    args.cast.pow2 = pow2 ? 1u : 0u;
    args.cast.eps = eps;
    uint32_t op;
    QT_TRY(op_fp8_act_append(p, name, in, out, &args, &op));
    return prog_use_span(p, op, offsetof(fp8_act_cast_args, cast.amax_in), amax, 4, PROG_READ);
}
