#include "runtime/ops/op_sched.h"

#include <stddef.h>  // offsetof

#include "runtime/ops/op_core.h"  // op_shape_1d

// The amax's regions of a staging op (sched_amax sits at the same offset in both).
static qt_status op_sched_amax_use(program *p, uint32_t op, const op_sched_amax *amax) {
    if (amax == NULL) return QT_OK;
    QT_ASSERT(prog_ref_present(amax->out) && prog_ref_present(amax->fold));
    size_t at = offsetof(sched_copy_args, amax);
    QT_TRY(prog_use_span(p, op, (uint32_t)(at + offsetof(sched_amax, out)), amax->out, 4,
                         PROG_WRITE));
    return prog_use_span(p, op, (uint32_t)(at + offsetof(sched_amax, fold)), amax->fold, 8,
                         PROG_READ_WRITE);
}

qt_status op_sched_copy(program *p, const char *name, prog_ref counter, op_sched_slots dst,
                        op_sched_slots src, uint64_t bytes, const op_sched_amax *amax) {
    QT_ASSERT(dst.slots >= 1 && src.slots >= 1);
    QT_ASSERT(bytes % 16 == 0 && dst.stride % 16 == 0 && src.stride % 16 == 0);
    QT_ASSERT(dst.ref.offset % 16 == 0 && src.ref.offset % 16 == 0);
    QT_ASSERT(dst.slots == 1 || dst.stride >= bytes);
    QT_ASSERT(src.slots == 1 || src.stride >= bytes);
    QT_ASSERT(amax == NULL ||
              (dst.slots == 1 && amax->first % 16 == 0 && amax->first + 4 * amax->count <= bytes));
    sched_copy_args args = {0};
    args.dst_stride = dst.stride;
    args.src_stride = src.stride;
    args.bytes = bytes;
    args.dst_slots = dst.slots;
    args.src_slots = src.slots;
    if (amax) {
        args.amax.first = amax->first;
        args.amax.count = amax->count;
    }
    launch_shape shape = op_shape_1d(bytes / 16, QT_SCHED_THREADS);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_SCHED_COPY, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(sched_copy_args, counter), counter, 8, PROG_READ));
    uint64_t dst_span = (uint64_t)(dst.slots - 1) * dst.stride + bytes;
    uint64_t src_span = (uint64_t)(src.slots - 1) * src.stride + bytes;
    QT_TRY(prog_use_span(p, op, offsetof(sched_copy_args, dst), dst.ref, dst_span, PROG_WRITE));
    QT_TRY(op_sched_amax_use(p, op, amax));
    return prog_use_span(p, op, offsetof(sched_copy_args, src), src.ref, src_span, PROG_READ);
}

qt_status op_sched_stage_u8(program *p, const char *name, const op_sched_stage_desc *d) {
    uint32_t targets_bytes = (d->targets_bytes + 15u) / 16u * 16u;
    QT_ASSERT(d->src.slots >= 1 && d->src.stride % 16 == 0 && d->src.ref.offset % 16 == 0);
    QT_ASSERT(d->dst.offset % 16 == 0 && d->inputs_offset % 16 == 0);
    QT_ASSERT(d->src_targets_offset % 16 == 0 && d->dst_targets_offset % 16 == 0);
    QT_ASSERT(d->inputs_offset + d->pixels <= d->src_targets_offset &&
              d->src_targets_offset + targets_bytes <= d->src_bytes);
    QT_ASSERT(d->inputs_offset + d->pixels * 4 <= d->dst_targets_offset &&
              d->dst_targets_offset + targets_bytes <= d->dst_bytes);
    QT_ASSERT(d->src.slots == 1 || d->src.stride >= d->src_bytes);
    sched_stage_u8_args args = {0};
    args.src_stride = d->src.stride;
    args.pixels = d->pixels;
    args.inputs_offset = d->inputs_offset;
    args.src_targets_offset = d->src_targets_offset;
    args.dst_targets_offset = d->dst_targets_offset;
    args.targets_bytes = targets_bytes;
    args.src_slots = d->src.slots;
    // Every loop of the kernel strides over the grid, so any grid is correct; one thread per
    // unit of the longest loop (16-pixel chunks, the pixel tail, header or target words) is
    // enough to take each loop in one round.
    uint64_t threads = d->pixels / QT_SCHED_STAGE_CHUNK;
    uint64_t others[3] = {d->pixels % QT_SCHED_STAGE_CHUNK, d->inputs_offset / 16,
                          targets_bytes / 16};
    for (int i = 0; i < 3; i++) threads = others[i] > threads ? others[i] : threads;
    launch_shape shape = op_shape_1d(threads, QT_SCHED_THREADS);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_SCHED_STAGE_U8, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(sched_stage_u8_args, counter), d->counter, 8,
                        PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(sched_stage_u8_args, dst), d->dst, d->dst_bytes,
                        PROG_WRITE));
    uint64_t src_span = (uint64_t)(d->src.slots - 1) * d->src.stride + d->src_bytes;
    QT_TRY(op_sched_amax_use(p, op, d->amax));  // the kernel's inputs are its pixels
    return prog_use_span(p, op, offsetof(sched_stage_u8_args, src), d->src.ref, src_span,
                         PROG_READ);
}

qt_status op_sched_gather(program *p, const char *name, const op_sched_gather_desc *d) {
    uint32_t per_row = d->target_type == 0 ? 1u : d->outputs;
    QT_ASSERT(d->slots.slots >= 1 && d->slots.stride >= d->slot_bytes);
    QT_ASSERT(d->elem_bytes == 1 || d->elem_bytes == 4);
    QT_ASSERT(d->inputs_offset % 16 == 0 && d->batch.offset % 16 == 0 &&
              d->slots.ref.offset % 16 == 0 && d->slots.stride % 16 == 0);
    QT_ASSERT(d->indices_offset + 4ull * d->rows <= d->inputs_offset &&
              d->inputs_offset + (uint64_t)d->rows * d->stride * d->elem_bytes <=
                  d->slot_targets_offset &&
              d->slot_targets_offset + 4ull * d->rows * per_row <= d->slot_bytes &&
              d->inputs_offset + 4ull * d->rows * d->stride <= d->batch_targets_offset &&
              d->batch_targets_offset + 4ull * d->rows * per_row <= d->batch_bytes);
    sched_gather_args args = {0};
    args.slot_stride = d->slots.stride;
    args.inputs_offset = d->inputs_offset;
    args.indices_offset = d->indices_offset;
    args.slot_targets_offset = d->slot_targets_offset;
    args.batch_targets_offset = d->batch_targets_offset;
    args.slot_count = d->slots.slots;
    args.rows = d->rows;
    args.features = d->features;
    args.stride = d->stride;
    args.outputs = d->outputs;
    args.target_type = d->target_type;
    args.elem_bytes = d->elem_bytes;
    for (uint32_t k = 0; k < QT_SCHED_DATASETS; k++) {
        args.datasets[k].samples = d->datasets[k].samples;
    }
    // One thread per input quad takes the longest loop in one round.
    launch_shape shape = op_shape_1d(((uint64_t)d->rows * d->stride + 3) / 4, QT_SCHED_THREADS);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_SCHED_GATHER, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(sched_gather_args, counter), d->counter, 8, PROG_READ));
    uint64_t span = (uint64_t)(d->slots.slots - 1) * d->slots.stride + d->slot_bytes;
    QT_TRY(prog_use_span(p, op, offsetof(sched_gather_args, slots), d->slots.ref, span,
                         PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(sched_gather_args, batch), d->batch, d->batch_bytes,
                         PROG_WRITE));
    QT_TRY(op_sched_amax_use(p, op, d->amax));
    for (uint32_t k = 0; k < QT_SCHED_DATASETS; k++) {
        const op_sched_gather_dataset *ds = &d->datasets[k];
        if (!prog_ref_present(ds->inputs)) continue;
        uint32_t at = (uint32_t)(offsetof(sched_gather_args, datasets) +
                                 k * sizeof(sched_gather_dataset));
        QT_TRY(prog_use_span(p, op, at + offsetof(sched_gather_dataset, inputs), ds->inputs,
                             ds->samples * d->features * d->elem_bytes, PROG_READ));
        QT_TRY(prog_use_span(p, op, at + offsetof(sched_gather_dataset, targets), ds->targets,
                             ds->samples * per_row * 4, PROG_READ));
    }
    return QT_OK;
}

qt_status op_sched_zero(program *p, uint32_t op, prog_ref slots, uint64_t bytes) {
    QT_ASSERT(bytes % 4 == 0 && bytes / 4 <= UINT32_MAX);
    if (!prog_counting(p)) {
        kernel_id k = prog_op_at(p, op)->kernel;
        QT_ASSERT(k == KERNEL_SCHED_COPY || k == KERNEL_SCHED_STAGE_U8 ||
                  k == KERNEL_SCHED_GATHER);
    }
    uint32_t words = (uint32_t)(bytes / 4);
    prog_args_set(p, op, offsetof(sched_zero, words), &words, sizeof words);
    return prog_use_late(p, op, offsetof(sched_zero, at), slots, PROG_WRITE);
}

qt_status op_sched_record(program *p, const char *name, const op_sched_record_desc *d) {
    QT_ASSERT(d->ring_len >= 1 && d->quantizers <= QT_TRACE_QUANTIZERS_MAX);
    QT_ASSERT(d->mode <= QT_TRACE_MODE_INFER);
    sched_record_args args = {0};
    args.ring_len = d->ring_len;
    args.quantizers = d->quantizers;
    args.mode = d->mode;
    args.accuracy = d->accuracy ? 1u : 0u;
    launch_shape shape = {{1, 1, 1}, {QT_SCHED_RECORD_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_SCHED_RECORD, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(sched_record_args, counter), d->counter, 8,
                        PROG_READ_WRITE));
    QT_TRY(prog_use_span(p, op, offsetof(sched_record_args, ring), d->ring,
                        d->ring_len * qt_trace_ring_bytes(d->quantizers), PROG_WRITE));
    QT_TRY(prog_use_optional(p, op, offsetof(sched_record_args, loss), d->loss,
                            sizeof(qt_loss_stats), PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(sched_record_args, gnorm), d->gnorm,
                            sizeof(qt_gnorm_result), PROG_READ));
    QT_TRY(prog_use_optional(p, op, offsetof(sched_record_args, optim), d->optim,
                            sizeof(optim_state), PROG_READ));
    uint64_t array_bytes = (uint64_t)d->quantizers * 4;
    if (d->quantizers > 0) {
        QT_TRY(prog_use_optional(p, op, offsetof(sched_record_args, amax), d->amax, array_bytes,
                                PROG_READ));
        QT_TRY(prog_use_optional(p, op, offsetof(sched_record_args, scale), d->scale,
                                array_bytes, PROG_READ));
    }
    return QT_OK;
}

qt_status op_sched_checksum(program *p, const char *name, prog_ref counter, prog_ref ring,
                            uint32_t ring_len, uint32_t quantizers, prog_ref hashes,
                            uint32_t count) {
    QT_ASSERT(ring_len >= 1 && count >= 1 && quantizers <= QT_TRACE_QUANTIZERS_MAX);
    sched_checksum_args args = {0, 0, 0, ring_len, count, quantizers, 0};
    launch_shape shape = {{1, 1, 1}, {QT_SCHED_RECORD_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_SCHED_CHECKSUM, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(sched_checksum_args, counter), counter, 8, PROG_READ));
    QT_TRY(prog_use_span(p, op, offsetof(sched_checksum_args, ring), ring,
                        ring_len * qt_trace_ring_bytes(quantizers), PROG_READ_WRITE));
    return prog_use_span(p, op, offsetof(sched_checksum_args, hashes), hashes,
                        (uint64_t)count * 8, PROG_READ);
}

qt_status op_sched_inject(program *p, const char *name, prog_ref counter, uint64_t step,
                          prog_ref target, uint32_t bits) {
    QT_ASSERT(target.offset % 4 == 0);
    sched_inject_args args = {0, 0, step, bits, 0};
    launch_shape shape = {{1, 1, 1}, {1, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_SCHED_INJECT, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use_span(p, op, offsetof(sched_inject_args, counter), counter, 8, PROG_READ));
    // The target is read too: the kernel writes it at one step only, so at the others its old
    // value must stay ordered with its writer.
    return prog_use_span(p, op, offsetof(sched_inject_args, target), target, 4,
                         PROG_READ_WRITE);
}
