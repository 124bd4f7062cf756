// op_core: builders that append the core kernels (ptx/core.cu) to a program.
//
// Owns nothing; each builder picks the launch shape, fills the args struct and declares the
// regions the op reads and writes (which is also how their addresses reach the args).
#ifndef QT_OP_CORE_H
#define QT_OP_CORE_H

#include "runtime/program/program.h"

// Grid-stride kernels never need more blocks than this to fill any current GPU; values do not
// depend on it.
#define OP_GRID_BLOCKS_MAX 1024u
// The SMs of the GPUs programs are planned for (an H100 SXM's and an H200's): launch shapes that
// want one block or a few per SM take this count, not the device's, so that a program and its
// bits are the same on every GPU and on the reference backend (on another GPU the grid only
// fills the SMs less evenly).
#define OP_PLAN_SMS 132u
#define OP_CHECKSUM_THREADS 256u  // must equal QT_CHECKSUM_THREADS in ptx/core.cu

qt_status op_fill_random(program *p, const char *name, prog_ref out, uint64_t count,
                         uint32_t dtype, uint32_t dist, uint64_t seed, uint64_t offset, float a,
                         float b);
// rows x cols values into rows `stride` elements apart (the rest of each row is not written):
// value (r, c) is the contiguous fill's element offset + r * cols + c, so a padded matrix holds
// the values of its unpadded twin.
qt_status op_fill_random_rows(program *p, const char *name, prog_ref out, uint64_t rows,
                              uint64_t cols, uint64_t stride, uint32_t dtype, uint32_t dist,
                              uint64_t seed, uint64_t offset, float a, float b);
qt_status op_copy(program *p, const char *name, prog_ref dst, prog_ref src, uint64_t bytes);
// Two ops: partial sums into `partials` (blocks u64) and the final hash into `out` (one u64).
qt_status op_checksum(program *p, const char *name, prog_ref src, uint64_t bytes,
                      prog_ref partials, uint32_t blocks, prog_ref out);

// Launch shape of a 1-D grid-stride kernel over `count` items.
launch_shape op_shape_1d(uint64_t count, uint32_t threads);
// The same with another cap on the blocks (kernels whose grid-stride loops gain from one item per
// thread on large tensors).
launch_shape op_shape_1d_capped(uint64_t count, uint32_t threads, uint32_t max_blocks);

#endif  // QT_OP_CORE_H
