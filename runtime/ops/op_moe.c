#include "runtime/ops/op_moe.h"

#include <stddef.h>  // offsetof
#include <stdio.h>   // snprintf

#include "runtime/ops/op_core.h"  // op_shape_1d_capped

#define OP_MOE_FLAT_BLOCKS_MAX (1u << 20)

uint64_t op_moe_capacity(uint32_t tokens, uint32_t topk, uint32_t experts, uint32_t row_align) {
    QT_ASSERT(row_align >= 1 && experts >= 1 && topk >= 1 && topk <= experts);
    uint64_t bound = (uint64_t)tokens * topk + (uint64_t)experts * (row_align - 1);
    uint64_t capacity = bound / row_align * row_align;
    return capacity <= UINT32_MAX ? capacity : 0;
}

uint32_t op_moe_chunks(uint32_t assignments) {
    return (assignments + QT_MOE_CHUNK - 1) / QT_MOE_CHUNK;
}

float op_moe_aux_scale(float alpha, uint32_t experts, uint32_t tokens, uint32_t topk) {
    double t = (double)tokens;
    return (float)((double)alpha * experts / (t * t * topk));
}

static launch_shape op_moe_blocks(uint64_t items, uint32_t per_block, uint32_t threads,
                                  uint32_t smem) {
    uint32_t blocks = (uint32_t)((items + per_block - 1) / per_block);
    return (launch_shape){{blocks ? blocks : 1, 1, 1}, {threads, 1, 1}, smem};
}

static void op_moe_check(const op_moe_routing *r) {
    QT_ASSERT(r->tokens >= 1 && r->topk >= 1 && r->topk <= r->experts);
    QT_ASSERT(r->experts <= QT_MOE_EXPERTS_MAX);
    QT_ASSERT(r->group.count == r->experts);
    QT_ASSERT(r->capacity == op_moe_capacity(r->tokens, r->topk, r->experts, r->row_align));
    QT_ASSERT(r->capacity > 0);
    QT_ASSERT(r->row_align % QT_MOE_WHOLE_ROWS == 0 || !prog_ref_present(r->whole_dims));
    QT_ASSERT(prog_ref_present(r->amax) == (r->amax_slots > 0));
}

static qt_status op_moe_route(program *p, const char *name, const op_moe_routing *r) {
    moe_route_args args = {0};
    args.tokens = r->tokens;
    args.experts = r->experts;
    args.topk = r->topk;
    launch_shape shape = op_moe_blocks(r->tokens, QT_MOE_TOKEN_THREADS, QT_MOE_TOKEN_THREADS, 0);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_ROUTE, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_route_args, logits), r->logits, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_route_args, probs), r->probs, PROG_WRITE));
    QT_TRY(prog_use(p, op, offsetof(moe_route_args, expert), r->expert, PROG_WRITE));
    return prog_use(p, op, offsetof(moe_route_args, gate), r->gate, PROG_WRITE);
}

static qt_status op_moe_count(program *p, const char *name, const op_moe_routing *r) {
    uint32_t assignments = r->tokens * r->topk;
    moe_count_args args = {0};
    args.assignments = assignments;
    args.experts = r->experts;
    args.chunks = op_moe_chunks(assignments);
    launch_shape shape = op_moe_blocks(assignments, QT_MOE_CHUNK, QT_MOE_COUNT_THREADS,
                                       4 * r->experts);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_COUNT, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_count_args, expert), r->expert, PROG_READ));
    return prog_use(p, op, offsetof(moe_count_args, chunk_counts), r->chunk_counts, PROG_WRITE);
}

static qt_status op_moe_scan(program *p, const char *name, const op_moe_routing *r) {
    moe_scan_args args = {0};
    args.experts = r->experts;
    args.chunks = op_moe_chunks(r->tokens * r->topk);
    args.amax_slots = r->amax_slots;
    uint32_t blocks = (r->experts + QT_MOE_SCAN_EXPERTS - 1) / QT_MOE_SCAN_EXPERTS;
    launch_shape shape = {{blocks, 1, 1}, {QT_MOE_SCAN_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_SCAN, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_optional(p, op, offsetof(moe_scan_args, amax), r->amax,
                             4ull * r->amax_slots * r->experts, PROG_WRITE));
    QT_TRY(prog_use(p, op, offsetof(moe_scan_args, chunk_counts), r->chunk_counts, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_scan_args, chunk_base), r->chunk_base, PROG_WRITE));
    QT_TRY(prog_use_optional(p, op, offsetof(moe_scan_args, whole_dims), r->whole_dims,
                             4ull * r->experts, PROG_WRITE));
    return prog_use(p, op, offsetof(moe_scan_args, first_dims), r->group.first_dims, PROG_WRITE);
}

static qt_status op_moe_permute(program *p, const char *name, const op_moe_routing *r) {
    uint32_t assignments = r->tokens * r->topk;
    moe_permute_args args = {0};
    args.assignments = assignments;
    args.experts = r->experts;
    args.chunks = op_moe_chunks(assignments);
    launch_shape shape = op_moe_blocks(assignments, QT_MOE_CHUNK, 32, 4 * r->experts);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_PERMUTE, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_permute_args, expert), r->expert, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_permute_args, chunk_base), r->chunk_base, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_permute_args, row_offsets), r->group.row_offsets,
                    PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_permute_args, row_of), r->row_of, PROG_WRITE));
    return prog_use(p, op, offsetof(moe_permute_args, assign_of), r->assign_of, PROG_WRITE);
}

qt_status op_moe_route_and_permute(program *p, const char *name, const op_moe_routing *r) {
    op_moe_check(r);
    char part[PROG_OP_NAME_MAX];
    snprintf(part, sizeof part, "%s.route", name);
    QT_TRY(op_moe_route(p, part, r));
    snprintf(part, sizeof part, "%s.count", name);
    QT_TRY(op_moe_count(p, part, r));
    snprintf(part, sizeof part, "%s.scan", name);
    QT_TRY(op_moe_scan(p, part, r));
    snprintf(part, sizeof part, "%s.offsets", name);
    QT_TRY(op_group_offsets(p, part, &r->group, r->row_align));
    snprintf(part, sizeof part, "%s.permute", name);
    return op_moe_permute(p, part, r);
}

static void op_moe_check_tensor(op_moe_tensor t) {
    QT_ASSERT(prog_ref_present(t.ref));
    QT_ASSERT(t.dtype == QT_DTYPE_BF16 || t.dtype == QT_DTYPE_F32);
}

// One warp per token and per permuted row (the capacity holds every token's K rows, so it
// bounds both); with an amax output, the per-member table as dynamic shared memory.
static launch_shape op_moe_row_shape(const op_moe_routing *r, prog_ref amax) {
    QT_ASSERT(r->capacity >= r->tokens);
    uint32_t smem = prog_ref_present(amax) ? 4 * r->experts : 0;
    return op_moe_blocks(r->capacity, QT_MOE_ROWS_PER_BLOCK, QT_MOE_ROW_THREADS, smem);
}

qt_status op_moe_gather(program *p, const char *name, const op_moe_routing *r, op_moe_tensor x,
                        uint32_t cols, prog_ref out, prog_ref amax) {
    op_moe_check(r);
    op_moe_check_tensor(x);
    QT_ASSERT(cols >= 1);
    moe_gather_args args = {0};
    args.tokens = r->tokens;
    args.capacity = r->capacity;
    args.row_bytes = cols * qt_act_dtype_bytes(x.dtype);
    args.topk = r->topk;
    args.dtype = x.dtype;
    launch_shape shape = op_moe_row_shape(r, amax);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_GATHER, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_gather_args, x), x.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_gather_args, out), out, PROG_WRITE));
    QT_TRY(prog_use(p, op, offsetof(moe_gather_args, row_of), r->row_of, PROG_READ));
    if (prog_ref_present(amax)) {
        QT_TRY(prog_use(p, op, offsetof(moe_gather_args, expert), r->expert, PROG_READ));
        QT_TRY(prog_use_span(p, op, offsetof(moe_gather_args, amax), amax, 4ull * r->experts,
                             PROG_READ_WRITE));
    }
    return op_group_use(p, op, offsetof(moe_gather_args, group), &r->group);
}

qt_status op_moe_combine(program *p, const char *name, const op_moe_routing *r, uint32_t cols,
                         op_moe_tensor src, prog_ref gate, op_moe_tensor addend,
                         const op_moe_router_term *router, op_moe_tensor out) {
    op_moe_check(r);
    QT_ASSERT(cols >= 1);
    op_moe_check_tensor(src);
    op_moe_check_tensor(out);
    bool has_addend = prog_ref_present(addend.ref);
    if (has_addend) op_moe_check_tensor(addend);
    moe_combine_args args = {0};
    args.tokens = r->tokens;
    args.cols = cols;
    args.topk = r->topk;
    args.src_dtype = src.dtype;
    args.addend_dtype = has_addend ? addend.dtype : QT_DTYPE_F32;
    args.out_dtype = out.dtype;
    if (router != NULL) {
        op_moe_check_tensor(router->dlogits);
        QT_ASSERT(router->weight_cols >= cols);
        QT_ASSERT(prog_ref_present(router->weight));
        args.experts = r->experts;
        args.dlogits_dtype = router->dlogits.dtype;
        args.router_w_cols = router->weight_cols;
    }
    // A thread per chunk of 8 columns (per element when rows are not whole chunks) up to
    // OP_MOE_FLAT_BLOCKS_MAX blocks: op_shape_1d's OP_GRID_BLOCKS_MAX blocks (16 chunks a thread
    // at the bench's size) would be a full wave and a short second one at 5 resident blocks an
    // SM (48 registers a thread) on 132 SMs.
    uint64_t items = (uint64_t)r->tokens * cols;
    if (cols % QT_ACT_CHUNK == 0) items /= QT_ACT_CHUNK;
    launch_shape shape = op_shape_1d_capped(items, QT_MOE_FLAT_THREADS, OP_MOE_FLAT_BLOCKS_MAX);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_COMBINE, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_args, src), src.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_args, row_of), r->row_of, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(moe_combine_args, gate), gate, 0, PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(moe_combine_args, addend), addend.ref, 0,
                             PROG_READ));
    if (router != NULL) {
        QT_TRY(prog_use_span(p, op, offsetof(moe_combine_args, dlogits), router->dlogits.ref,
                             (uint64_t)r->tokens * r->experts *
                                 qt_act_dtype_bytes(router->dlogits.dtype),
                             PROG_READ));
        QT_TRY(prog_use_span(p, op, offsetof(moe_combine_args, router_w), router->weight,
                             2ull * r->experts * router->weight_cols, PROG_READ));
    }
    return prog_use(p, op, offsetof(moe_combine_args, out), out.ref, PROG_WRITE);
}

qt_status op_moe_combine_backward(program *p, const char *name, const op_moe_routing *r,
                                  uint32_t cols, op_moe_tensor dy, op_moe_tensor yp,
                                  op_moe_tensor dyp, prog_ref dgate, prog_ref amax) {
    op_moe_check(r);
    QT_ASSERT(cols >= 1);
    op_moe_check_tensor(dy);
    op_moe_check_tensor(yp);
    op_moe_check_tensor(dyp);
    moe_combine_bwd_args args = {0};
    args.tokens = r->tokens;
    args.capacity = r->capacity;
    args.cols = cols;
    args.topk = r->topk;
    args.dy_dtype = dy.dtype;
    args.yp_dtype = yp.dtype;
    args.dyp_dtype = dyp.dtype;
    launch_shape shape = op_moe_row_shape(r, amax);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_COMBINE_BWD, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_bwd_args, dy), dy.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_bwd_args, yp), yp.ref, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_bwd_args, gate), r->gate, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_bwd_args, row_of), r->row_of, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_bwd_args, dyp), dyp.ref, PROG_WRITE));
    QT_TRY(prog_use(p, op, offsetof(moe_combine_bwd_args, dgate), dgate, PROG_WRITE));
    if (prog_ref_present(amax)) {
        QT_TRY(prog_use(p, op, offsetof(moe_combine_bwd_args, expert), r->expert, PROG_READ));
        QT_TRY(prog_use_span(p, op, offsetof(moe_combine_bwd_args, amax), amax,
                             4ull * r->experts, PROG_READ_WRITE));
    }
    return op_group_use(p, op, offsetof(moe_combine_bwd_args, group), &r->group);
}

qt_status op_moe_router_backward(program *p, const char *name, const op_moe_routing *r,
                                 prog_ref dgate, float aux_scale, op_moe_tensor dlogits) {
    op_moe_check(r);
    op_moe_check_tensor(dlogits);
    moe_router_bwd_args args = {0};
    args.aux_scale = aux_scale;
    args.tokens = r->tokens;
    args.experts = r->experts;
    args.topk = r->topk;
    args.out_dtype = dlogits.dtype;
    launch_shape shape = op_moe_blocks(r->tokens, QT_MOE_TOKEN_THREADS, QT_MOE_TOKEN_THREADS, 0);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_ROUTER_BWD, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_router_bwd_args, probs), r->probs, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_router_bwd_args, expert), r->expert, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_router_bwd_args, dgate), dgate, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(moe_router_bwd_args, first_dims), r->group.first_dims,
                    PROG_READ));
    return prog_use(p, op, offsetof(moe_router_bwd_args, dlogits), dlogits.ref, PROG_WRITE);
}

qt_status op_moe_uniform_group(program *p, const char *name, const op_group *g, uint32_t rows) {
    QT_ASSERT(g->count >= 1);
    QT_ASSERT((uint64_t)g->count * rows <= UINT32_MAX);
    moe_uniform_group_args args = {0};
    args.count = g->count;
    args.rows = rows;
    launch_shape shape = op_moe_blocks((uint64_t)g->count + 1, 256, 256, 0);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_MOE_UNIFORM_GROUP, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(moe_uniform_group_args, row_offsets), g->row_offsets,
                    PROG_WRITE));
    return prog_use(p, op, offsetof(moe_uniform_group_args, first_dims), g->first_dims,
                    PROG_WRITE);
}
