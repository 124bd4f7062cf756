// grid_order: the first statement of every kernel, for programmatic dependent launch.
//
// On compute capability 9.0 the runtime launches every kernel with programmatic stream
// serialization (runtime/driver/modules.c), which lets the driver launch a kernel before the
// kernel ahead of it in the stream has finished: the launch latency of a small kernel then
// overlaps the one before, the gap that dominates a step made of many short kernels. The price
// is that each kernel must itself wait for its predecessor's results, which is what
// qt_grid_enter does, before any load or store: griddepcontrol.wait
// returns once every prerequisite grid has completed and its memory operations are visible. It
// comes before everything else, so every kernel's blocks pass it, which keeps the order
// transitive: a kernel two places behind cannot finish before the one between has waited too.
//
// No kernel calls griddepcontrol.launch_dependents, so each one's dependents are released when
// its blocks finish (the implicit trigger), and the overlap is the launch work alone. With the
// trigger right after the wait (measured on an H200, 2026-11-26), the next kernel's blocks took
// SMs and sat in their wait while the long kernels of a parallel graph branch could have used
// them: the residual MLP's step (resmlp_current) went from 34.47 ms in plain stream order to
// 34.87 ms, against 34.33 ms without the trigger; the Fashion-MNIST step of short kernels gains
// as much either way (0.151 ms in stream order, 0.147-0.148 ms with or without it).
//
// Images compiled for targets below sm_90 (the compute_89 PTX that JITs on other GPUs) hold no
// such instruction, and the runtime launches them without the attribute, in plain stream order.
#ifndef QT_GRID_ORDER_H
#define QT_GRID_ORDER_H

#if defined(__CUDACC__)
__device__ __forceinline__ void qt_grid_enter(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#endif

#endif  // QT_GRID_ORDER_H
