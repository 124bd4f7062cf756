// gemm_tier: which GEMM kernels run a program's GEMM ops on the GPU.
//
// Owns nothing. A program's GEMM op names its portable kernel (ptx/gemm_portable.cu) with its
// gemm_args, or a skinny kernel (ptx/gemm_skinny.cu, op_gemm_skinny: dense BF16 GEMMs with n or m
// of at most 64, which this tier never takes: its tiles would be mostly padding; a k of at most 64
// names the portable kernel, and this tier takes it where it can: it writes D faster). At
// launch time of a portable kernel's op (eager, captured or profiled alike: backend.c launches
// every op through one function) the GPU backend asks gemm_tier_takes whether the sm_90a tier
// (ptx/gemm_sm90a.cu) takes it, and if so gemm_tier_launch builds gemm_sm90a_args on the stack
// (the op's gemm_args, the TMA tensor maps of its operands) and launches the sm90a kernel of the
// format on a persistent grid. The program is never changed. Everything the sm90a tier does not
// cover stays on the portable tier:
//
//   taken by sm90a (compute capability 9.0)                   stays portable
//   bf16 with K-major or outer-major operands (fprop,        GEMM_GROUP_K mxfp8 and nvfp4,
//     dgrad, wgrad); fp8 per-tensor (fast or split), fp8     k = 0, split-K, outer-major
//     block (B 128 x 128, or 1 x 128 when not M-grouped),    mxfp8 (dgrad and wgrad), E5M2
//     mxfp8 (E4M3), nvfp4 (even k), both operands K-major    mxfp8, anything misaligned;
//   dense or GEMM_GROUP_M; GEMM_GROUP_K (wgrad) for bf16,    with gemm_tier AUTO also GEMMs
//     fp8 and fp8 block; TMA-aligned (below)                 of fewer than 32 tiles
//
// NOTE: TMA needs 16-byte aligned global addresses and row strides that are multiples of 16
// bytes (bf16, either layout: ld % 8 == 0; fp8 and mxfp8: ld % 16 == 0; nvfp4: ld % 32 == 0);
// stacked B members (GEMM_GROUP_M) must be a multiple of 16 bytes apart and must not overlap:
// either one after another, or (K-major) side by side inside B's rows, as in the transposed
// columnwise copy of stacked weights; per-column FP8 block scales of B (a tensor map too) need
// scale_ld % 4 == 0. GEMM_GROUP_K operands are one grouped tensor each (no member strides) and
// its members' D must not overlap.
#ifndef QT_GEMM_TIER_H
#define QT_GEMM_TIER_H

#include "runtime/driver/modules.h"   // modules, modules_launch
#include "runtime/program/program.h"  // prog_op
#include "ptx/gemm_sm90a.h"           // gemm_sm90a_args

// Which kernels run a program's GEMM ops (runtime/backend/gemm_tier.h): AUTO takes the sm_90a tier
// on a compute capability 9.0 GPU for the GEMMs it supports that have at least 32 of its tiles
// (about a quarter of an H100's SMs), and the portable tier otherwise; SM90A takes the sm_90a tier
// for every GEMM it supports; PORTABLE always runs the op's own (portable) kernel. All give results
// within the GEMM contract; tests and benchmarks compare them.
typedef enum backend_gemm_tier {
    BACKEND_GEMM_TIER_AUTO,
    BACKEND_GEMM_TIER_PORTABLE,
    BACKEND_GEMM_TIER_SM90A
} backend_gemm_tier;

// What the tier needs of the GPU it launches on, filled by the backend for each launch
// (backend_gemm_device): the tier reads no backend, so that the backend uses the tier and not
// the other way round.
typedef struct gemm_tier_device {
    bool gpu;  // false on the reference backend, where the tier takes nothing
    int cc_major, cc_minor, sm_count;
    backend_gemm_tier setting;
    uint32_t ctas_max;  // the persistent grid's CTAs at most (0: one per SM)
    const modules *modules;
} gemm_tier_device;


// Whether the sm90a tier can run these GEMM args (format, grouping, layouts, alignment); the
// device and the backend's tier setting are not considered.
bool gemm_tier_sm90a_supports(const gemm_args *g);

// Whether the sm90a tier's MXFP8 or NVFP4 kernel takes these args' block scales in groups by
// TMA (gemm_sm90a.h) rather than through its loader warps.
bool gemm_tier_scale_groups(const gemm_args *g);

// Whether backend_launch_op hands this op to gemm_tier_launch: a portable GEMM kernel, a GPU
// backend on a compute capability 9.0 device with the sm90a module loaded, tier AUTO or SM90A,
// gemm_tier_sm90a_supports, and with AUTO at least 32 tiles (gemm_tier.c says why).
bool gemm_tier_takes(const gemm_tier_device *d, const prog_op *op);
// The sm_90a tier's kernel for a portable GEMM kernel, or KERNEL_COUNT where it has none (that
// GEMM always runs on the portable tier).
kernel_id gemm_tier_sm90a_kernel(kernel_id portable);

// Whether op's kernel writes a GEMM's D without the norm units the op asks for
// (gemm_args.norm_units; ptx/gemm.h): the portable and skinny kernels and the split-K reduction.
// Then the backend runs qt_gemm_norm_units right after the op's kernel, on either backend, with
// *g (the op's args) and *shape. The sm90a tier computes the units in its epilogue instead.
bool gemm_tier_units_after(const prog_op *op, gemm_args *g, launch_shape *shape);
// The kernel a GPU launches for an op that gemm_tier_takes leaves alone: for a portable GEMM of
// the small tile its small-tile entry point (ptx/gemm_portable.cu says why; same bits), else the
// op's own kernel.
kernel_id gemm_tier_portable_kernel(const gemm_tier_device *d, const prog_op *op);

// Launches the sm90a kernel for the op (gemm_tier_takes must hold) on `stream` (the backend's
// stream, or one of its capture streams).
qt_status gemm_tier_launch(const gemm_tier_device *d, const prog_op *op, CUstream stream);

// The kernel and launch shape gemm_tier_launch gives the op (gemm_tier_takes must hold): what a
// profile names, since the program's op names its portable kernel and grid.
void gemm_tier_launched(const gemm_tier_device *d, const prog_op *op, kernel_id *kernel,
                        launch_shape *shape);

// The tier GEMMs take on this backend, in words (for `qtrain info`).
const char *gemm_tier_describe(const gemm_tier_device *d);

#endif  // QT_GEMM_TIER_H
