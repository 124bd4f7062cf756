// ref: the C twin of every kernel, named ref_<symbol>, taking the kernel's own args struct.
//
// Owns nothing. Addresses in args are host addresses on the reference backend (its arenas live
// in host memory), so a twin casts them straight to pointers. The launch shape is passed for the
// few twins whose outputs depend on it (per-block partial results).
#ifndef QT_REF_H
#define QT_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "ptx/kernels.h"             // QT_KERNELS, args structs
#include "runtime/driver/modules.h"  // launch_shape

#define QT_REF_DECL(id, module, symbol, args) \
    void ref_##symbol(const args *a, const launch_shape *shape);
QT_KERNELS(QT_REF_DECL)
#undef QT_REF_DECL

// Host pointer from an args address field.
#define REF_PTR(type, address) ((type *)(uintptr_t)(address))

// Threads. A twin whose outputs are independent of each other (element-wise maps, rows, blocks
// that own their outputs) runs them as tasks of the thread pool (runtime/base/pool.h), in ranges of
// at least REF_TASK_ELEMS elements: below that, waking the pool's threads costs more than the work.
// Sums keep the kernels' fixed order inside a task, so no bit depends on the threads.
#define REF_TASK_ELEMS 8192u

// Rows per task for rows of `cols` elements: REF_TASK_ELEMS elements, at least one row.
static inline uint64_t ref_task_rows(uint64_t cols) {
    return cols >= REF_TASK_ELEMS ? 1u : REF_TASK_ELEMS / (cols ? cols : 1u);
}

// Twins whose per-element functions have no branches (GELU's) run them over fixed-size local
// arrays, which the x86-64-v3 clone (pool.h) turns into 8-wide vector instructions, each lane the
// scalar function's operations. no-trapping-math lets the compiler keep both sides of a select in
// vectors rather than branch around one (the scalar functions compute both anyway); it changes no
// result (rounding and contraction stay as they are).
#define REF_VECTOR_LOOPS __attribute__((optimize("no-trapping-math")))

// The kernels' atomicMax on the bits of a non-negative float (an amax): tasks that merge their
// maxima from several threads leave the largest one, in whatever order they arrive.
static inline void ref_amax_merge(float *slot, float value) {
    uint32_t *bits = (uint32_t *)slot, v = qt_f32_bits(value);
    uint32_t seen = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (v > seen && !__atomic_compare_exchange_n(bits, &seen, v, true, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)) {
    }
}

#endif  // QT_REF_H
