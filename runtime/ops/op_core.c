#include "runtime/ops/op_core.h"

#include <stddef.h>  // offsetof

launch_shape op_shape_1d_capped(uint64_t count, uint32_t threads, uint32_t max_blocks) {
    uint64_t blocks = (count + threads - 1) / threads;
    if (blocks == 0) blocks = 1;
    if (blocks > max_blocks) blocks = max_blocks;
    return (launch_shape){{(uint32_t)blocks, 1, 1}, {threads, 1, 1}, 0};
}

launch_shape op_shape_1d(uint64_t count, uint32_t threads) {
    return op_shape_1d_capped(count, threads, OP_GRID_BLOCKS_MAX);
}

qt_status op_fill_random_rows(program *p, const char *name, prog_ref out, uint64_t rows,
                              uint64_t cols, uint64_t stride, uint32_t dtype, uint32_t dist,
                              uint64_t seed, uint64_t offset, float a, float b) {
    QT_ASSERT(dtype == QT_DTYPE_F32 || dtype == QT_DTYPE_BF16);
    QT_ASSERT(dist == QT_FILL_UNIFORM || dist == QT_FILL_NORMAL);
    QT_ASSERT(cols >= 1 && stride >= cols);
    fill_random_args args = {0, rows * cols, seed, offset, cols, stride, a, b, dtype, dist};
    launch_shape shape = op_shape_1d(rows * cols, 256);
    uint64_t reach = rows == 0 ? 0 : ((rows - 1) * stride + cols) * (dtype == QT_DTYPE_F32 ? 4 : 2);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_FILL_RANDOM, name, &shape, &args, sizeof args, &op));
    return prog_use_span(p, op, offsetof(fill_random_args, out), out, reach, PROG_WRITE);
}

qt_status op_fill_random(program *p, const char *name, prog_ref out, uint64_t count,
                         uint32_t dtype, uint32_t dist, uint64_t seed, uint64_t offset, float a,
                         float b) {
    uint64_t cols = count ? count : 1;
    return op_fill_random_rows(p, name, out, count ? 1 : 0, cols, cols, dtype, dist, seed,
                               offset, a, b);
}

qt_status op_copy(program *p, const char *name, prog_ref dst, prog_ref src, uint64_t bytes) {
    copy_args args = {0, 0, bytes};
    launch_shape shape = op_shape_1d(bytes % 16 == 0 ? bytes / 16 : bytes, 256);
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_COPY, name, &shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(copy_args, dst), dst, PROG_WRITE));
    return prog_use(p, op, offsetof(copy_args, src), src, PROG_READ);
}

qt_status op_checksum(program *p, const char *name, prog_ref src, uint64_t bytes,
                      prog_ref partials, uint32_t blocks, prog_ref out) {
    QT_ASSERT(blocks > 0 && blocks <= OP_GRID_BLOCKS_MAX);
    QT_ASSERT(src.offset % 8 == 0);  // the kernel reads whole 64-bit words
    checksum_args args = {0, bytes, 0, 0, blocks, 0};
    launch_shape partial_shape = {{blocks, 1, 1}, {OP_CHECKSUM_THREADS, 1, 1}, 0};
    launch_shape final_shape = {{1, 1, 1}, {OP_CHECKSUM_THREADS, 1, 1}, 0};
    uint32_t op;
    QT_TRY(prog_append(p, KERNEL_CHECKSUM_PARTIAL, name, &partial_shape, &args, sizeof args,
                       &op));
    QT_TRY(prog_use(p, op, offsetof(checksum_args, src), src, PROG_READ));
    QT_TRY(prog_use(p, op, offsetof(checksum_args, partials), partials, PROG_WRITE));
    QT_TRY(prog_append(p, KERNEL_CHECKSUM_FINAL, name, &final_shape, &args, sizeof args, &op));
    QT_TRY(prog_use(p, op, offsetof(checksum_args, partials), partials, PROG_READ));
    return prog_use(p, op, offsetof(checksum_args, out), out, PROG_WRITE);
}
