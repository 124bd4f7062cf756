#include "runtime/ops/op_quant_group.h"

#include <stddef.h>  // offsetof
#include <string.h>  // memcpy

qt_status op_group_use(program *p, uint32_t op, uint32_t desc_offset, const op_group *g) {
    if (g->count == 0) return QT_OK;
    QT_ASSERT(op < p->op_count);
    prog_op *entry = prog_op_at(p, op);
    QT_ASSERT(desc_offset + sizeof(qt_group_desc) <= entry->args_bytes);
    uint32_t count = g->count;
    memcpy(entry->args + desc_offset + offsetof(qt_group_desc, count), &count, sizeof count);
    QT_ASSERT(g->row_offsets.offset % 4 == 0 && g->first_dims.offset % 4 == 0);
    QT_TRY(prog_use_span(p, op, desc_offset + (uint32_t)offsetof(qt_group_desc, row_offsets),
                         g->row_offsets, 4ull * (g->count + 1), PROG_READ));
    return prog_use_span(p, op, desc_offset + (uint32_t)offsetof(qt_group_desc, first_dims),
                         g->first_dims, 4ull * g->count, PROG_READ);
}

qt_status op_group_offsets(program *p, const char *name, const op_group *g, uint32_t row_align) {
    QT_ASSERT(row_align >= 1);
    QT_ASSERT(g->row_offsets.arena != NULL);
    group_offsets_args args = {0, 0, g->count, row_align};
    launch_shape shape = {{1, 1, 1}, {QT_GROUP_OFFSETS_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_GROUP_OFFSETS, name, &shape, &args, sizeof args, &op));
    if (g->count > 0) {
        QT_TRY(prog_use(p, op, offsetof(group_offsets_args, first_dims), g->first_dims,
                        PROG_READ));
    }
    return prog_use(p, op, offsetof(group_offsets_args, row_offsets), g->row_offsets,
                    PROG_WRITE);
}
