#include "runtime/program/program.h"

#include <stdio.h>
#include <string.h>

// Op indices are int32 across all programs of a run (arena lifetimes): one program stays far
// below that.
#define PROG_OPS_LIMIT (1u << 24)

uint64_t prog_storage_bytes(uint32_t capacity) {
    return (uint64_t)capacity * (sizeof(prog_op) + 2 * sizeof(uint32_t));
}

void prog_init(program *p, const char *mode, int32_t op_base, void *storage, uint32_t capacity) {
    QT_ASSERT(op_base >= 0);
    QT_ASSERT(strlen(mode) < sizeof p->mode);
    QT_ASSERT((storage == NULL) == (capacity == 0) && capacity <= PROG_OPS_LIMIT);
    QT_ASSERT((uintptr_t)storage % _Alignof(prog_op) == 0);
    memset(p, 0, sizeof *p);
    strcpy(p->mode, mode);
    p->op_base = op_base;
    p->op_capacity = capacity;
    p->ops = storage;
    p->op_scratch = storage ? (uint32_t *)(void *)(p->ops + capacity) : NULL;
}

bool prog_counting(const program *p) { return p->ops == NULL; }

prog_op *prog_op_at(program *p, uint32_t op) {
    QT_ASSERT(op < p->op_count);
    if (!prog_counting(p)) return &p->ops[op];
    QT_ASSERT(op + 1 == p->op_count);  // builders use an op right after appending it
    return &p->pending;
}

qt_status prog_append(program *p, kernel_id kernel, const char *name, const launch_shape *shape,
                      const void *args, size_t args_bytes, uint32_t *op_out) {
    QT_ASSERT(!p->resolved);
    QT_ASSERT((unsigned)kernel < KERNEL_COUNT);
    QT_ASSERT(args_bytes == kernel_table[kernel].args_bytes);
    QT_ASSERT(shape->grid[0] > 0 && shape->grid[1] > 0 && shape->grid[2] > 0);
    QT_ASSERT(shape->block[0] > 0 && shape->block[1] > 0 && shape->block[2] > 0);
    uint32_t capacity = prog_counting(p) ? PROG_OPS_LIMIT : p->op_capacity;
    if (p->op_count == capacity) {
        return qt_fail(QT_ERR_CAPACITY, "program '%s' holds %u ops%s; cannot add '%s'", p->mode,
                       capacity, prog_counting(p) ? "" : ", the count its plan was sized for",
                       name);
    }
    prog_op *op = prog_counting(p) ? &p->pending : &p->ops[p->op_count];
    memset(op, 0, sizeof *op);
    op->kernel = kernel;
    snprintf(op->name, sizeof op->name, "%s", name);
    op->shape = *shape;
    op->args_bytes = (uint32_t)args_bytes;
    memcpy(op->args, args, args_bytes);
    *op_out = p->op_count++;
    return QT_OK;
}

void prog_set_beside(program *p, uint32_t op) { prog_op_at(p, op)->beside = true; }

int32_t prog_op_index(const program *p, uint32_t op) {
    QT_ASSERT(op < p->op_count);
    return p->op_base + (int32_t)op;
}

// prog_use into `op`, the entry of op_number, or NULL: a counting program's earlier op, whose
// entry is gone (the use is checked, then dropped).
static qt_status prog_use_into(program *p, prog_op *op, uint32_t op_number, uint32_t args_offset,
                               prog_ref ref, prog_access access) {
    QT_ASSERT(!p->resolved);
    QT_ASSERT(args_offset == PROG_ARGS_FIELD_NONE ||
              (args_offset % 8 == 0 && (op == NULL || args_offset + 8 <= op->args_bytes)));
    QT_ASSERT(access != PROG_ADDRESS || args_offset != PROG_ARGS_FIELD_NONE);
    QT_ASSERT(ref.arena != NULL && ref.region < ref.arena->region_count);
    // A counting arena has no table: the bounds are checked when the plan is made for real.
    bool regions = !arena_counting(ref.arena);
    QT_ASSERT(!regions || ref.offset <= arena_region_get(ref.arena, ref.region)->bytes);
    if (op != NULL) {
        // Builders split their ops below this (a property of the code, whatever the model).
        QT_ASSERT(op->ref_count < PROG_OP_REFS_MAX);
        op->refs[op->ref_count++] = (prog_op_ref){ref, (uint16_t)args_offset, (uint8_t)access};
    }
    if (regions && access != PROG_ADDRESS &&
        !arena_region_get(ref.arena, ref.region)->persistent) {
        arena_extend(ref.arena, ref.region, prog_op_index(p, op_number));
    }
    return QT_OK;
}

qt_status prog_use(program *p, uint32_t op_number, uint32_t args_offset, prog_ref ref,
                   prog_access access) {
    return prog_use_into(p, prog_op_at(p, op_number), op_number, args_offset, ref, access);
}

// The entry of op_number, or NULL for an op of a counting program that is not its last.
static prog_op *prog_op_kept(program *p, uint32_t op_number) {
    QT_ASSERT(op_number < p->op_count);
    return prog_counting(p) && op_number + 1 < p->op_count ? NULL : prog_op_at(p, op_number);
}

qt_status prog_use_late(program *p, uint32_t op_number, uint32_t args_offset, prog_ref ref,
                        prog_access access) {
    return prog_use_into(p, prog_op_kept(p, op_number), op_number, args_offset, ref, access);
}

void prog_args_set(program *p, uint32_t op_number, uint32_t args_offset, const void *value,
                   size_t bytes) {
    QT_ASSERT(!p->resolved);
    prog_op *op = prog_op_kept(p, op_number);
    if (op == NULL) return;
    QT_ASSERT(args_offset <= op->args_bytes && bytes <= op->args_bytes - args_offset);
    memcpy(op->args + args_offset, value, bytes);
}

qt_status prog_use_span(program *p, uint32_t op, uint32_t args_offset, prog_ref ref,
                        uint64_t bytes, prog_access access) {
    QT_ASSERT(prog_ref_present(ref));
    if (!arena_counting(ref.arena)) {
        const arena_region *region = arena_region_get(ref.arena, ref.region);
        QT_ASSERT(ref.offset <= region->bytes && bytes <= region->bytes - ref.offset);
    }
    return prog_use(p, op, args_offset, ref, access);
}

qt_status prog_use_optional(program *p, uint32_t op, uint32_t args_offset, prog_ref ref,
                            uint64_t bytes, prog_access access) {
    if (!prog_ref_present(ref)) return QT_OK;
    return prog_use_span(p, op, args_offset, ref, bytes, access);
}

void prog_resolve(program *p) {
    QT_ASSERT(!p->resolved && !prog_counting(p));
    for (uint32_t i = 0; i < p->op_count; i++) {
        prog_op *op = &p->ops[i];
        for (uint32_t r = 0; r < op->ref_count; r++) {
            const prog_op_ref *use = &op->refs[r];
            if (use->args_offset == PROG_ARGS_FIELD_NONE) continue;
            uint64_t address = arena_address(use->ref.arena, use->ref.region) + use->ref.offset;
            memcpy(op->args + use->args_offset, &address, sizeof address);
        }
    }
    p->resolved = true;
}

static bool prog_uses_conflict(const prog_op_ref *x, const prog_op_ref *y) {
    if (x->ref.arena != y->ref.arena) return false;
    if (x->access == PROG_ADDRESS || y->access == PROG_ADDRESS) return false;
    if (!((x->access | y->access) & PROG_WRITE)) return false;
    QT_ASSERT(x->ref.arena->phase != ARENA_PHASE_PLAN);
    const arena_region *rx = arena_region_get(x->ref.arena, x->ref.region);
    const arena_region *ry = arena_region_get(y->ref.arena, y->ref.region);
    return rx->offset < ry->offset + ry->bytes && ry->offset < rx->offset + rx->bytes;
}

// Whether two conflicting uses name one buffer: the same region, or a part and its whole (a
// part's bytes lie inside its whole's). Regions that share bytes only because the packing put
// one where the other had been are not one buffer.
static bool prog_uses_one_buffer(const prog_op_ref *x, const prog_op_ref *y) {
    if (x->ref.region == y->ref.region) return true;
    const arena_region *rx = arena_region_get(x->ref.arena, x->ref.region);
    const arena_region *ry = arena_region_get(y->ref.arena, y->ref.region);
    return (rx->part && rx->whole == y->ref.region) || (ry->part && ry->whole == x->ref.region);
}

// prog_ops_conflict, or (buffers_only) its conflicts through one buffer alone.
static bool prog_ops_conflict_by(const prog_op *x, const prog_op *y, bool buffers_only) {
    for (uint32_t i = 0; i < x->ref_count; i++) {
        for (uint32_t j = 0; j < y->ref_count; j++) {
            if (!prog_uses_conflict(&x->refs[i], &y->refs[j])) continue;
            if (!buffers_only || prog_uses_one_buffer(&x->refs[i], &y->refs[j])) return true;
        }
    }
    return false;
}

bool prog_ops_conflict(const prog_op *x, const prog_op *y) {
    return prog_ops_conflict_by(x, y, false);
}

static uint32_t prog_longest_chain(const program *p, bool buffers_only) {
    QT_ASSERT(!prog_counting(p));
    uint32_t *depth = p->op_scratch;  // chain length ending at each op
    uint32_t longest = 0;
    for (uint32_t j = 0; j < p->op_count; j++) {
        depth[j] = 1;
        for (uint32_t i = 0; i < j; i++) {
            if (depth[i] + 1 > depth[j] &&
                prog_ops_conflict_by(&p->ops[i], &p->ops[j], buffers_only)) {
                depth[j] = depth[i] + 1;
            }
        }
        if (depth[j] > longest) longest = depth[j];
    }
    return longest;
}

uint32_t prog_critical_path(const program *p) { return prog_longest_chain(p, false); }

uint32_t prog_critical_path_buffers(const program *p) { return prog_longest_chain(p, true); }

// Whether every arena the program uses is packed (offsets final).
static bool prog_packed(const program *p) {
    QT_ASSERT(!prog_counting(p));
    for (uint32_t i = 0; i < p->op_count; i++) {
        for (uint32_t r = 0; r < p->ops[i].ref_count; r++) {
            if (p->ops[i].refs[r].ref.arena->phase == ARENA_PHASE_PLAN) return false;
        }
    }
    return true;
}

void prog_print(const program *p, FILE *out) {
    fprintf(out, "program %s: %u ops", p->mode, p->op_count);
    if (p->op_count > 0 && prog_packed(p)) {
        fprintf(out, ", %u on the longest chain of ops that must stay in order (%u by their "
                "buffers alone, without the orderings that reused bytes add)",
                prog_critical_path(p), prog_critical_path_buffers(p));
    }
    fprintf(out, "\n");
    for (uint32_t i = 0; i < p->op_count; i++) {
        const prog_op *op = &p->ops[i];
        fprintf(out, "  %5d  %-28s %-24s grid %ux%ux%u block %u smem %u%s\n",
                prog_op_index(p, i), op->name, kernel_table[op->kernel].symbol, op->shape.grid[0],
                op->shape.grid[1], op->shape.grid[2], op->shape.block[0] * op->shape.block[1] *
                op->shape.block[2], op->shape.smem_bytes,
                op->beside ? "  (beside: a stream of its own)" : "");
        for (uint32_t r = 0; r < op->ref_count; r++) {
            const prog_op_ref *use = &op->refs[r];
            const char *access = use->access == PROG_ADDRESS ? "@ "
                                 : use->access == PROG_READ  ? "r "
                                 : use->access == PROG_WRITE ? " w"
                                                             : "rw";
            fprintf(out, "         %s %s+%llu\n", access,
                    arena_region_get(use->ref.arena, use->ref.region)->name,
                    (unsigned long long)use->ref.offset);
        }
    }
}
