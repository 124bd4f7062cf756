// dp kernels: data parallelism's per-rank to global folds (ABI and shared arithmetic in
// ptx/dp.h). The collective op has no kernel: NCCL runs it.
#include "ptx/dp.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

extern "C" __global__ void __launch_bounds__(QT_DP_THREADS)
    qt_dp_loss_share(const __grid_constant__ dp_loss_share_args args) {
    qt_grid_enter();
    const uint32_t *header = (const uint32_t *)(uintptr_t)args.header;
    float share = qt_dp_share(header[0], header[QT_DP_ROWS_GLOBAL_OFFSET / 4]);
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < args.count;
         i += stride) {
        float g = qt_act_load(args.grad, i, args.grad_dtype);
        qt_act_store(args.grad, i, args.grad_dtype, g * share);
    }
}

extern "C" __global__ void __launch_bounds__(1)
    qt_dp_stats_fold(const __grid_constant__ dp_stats_fold_args args) {
    qt_grid_enter();
    qt_dp_stats_fold((const qt_loss_stats *)(uintptr_t)args.gathered, args.world, args.cols,
                     (qt_loss_stats *)(uintptr_t)args.out);
}

extern "C" __global__ void __launch_bounds__(1)
    qt_dp_gnorm_fold(const __grid_constant__ dp_gnorm_fold_args args) {
    qt_grid_enter();
    qt_dp_gnorm_fold((const qt_gnorm_result *)(uintptr_t)args.gathered, args.world, args.clip,
                     (qt_gnorm_result *)(uintptr_t)args.out);
}
