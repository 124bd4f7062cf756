// kernels: the one list of every kernel qtrain has, as an X-macro over the op families.
//
// Owns nothing. Each entry is X(id, module, symbol, args type): `id` is the kernel_id enum value,
// `module` the ptx/<module>.cu image that holds it, `symbol` its extern "C" name, and the args
// struct its single by-value parameter. The loader (runtime/driver/modules.c) resolves every
// symbol, the reference backend (runtime/backend/backend.c) dispatches to ref_<symbol>, and both
// fail to build or to start if an entry has no implementation.
#ifndef QT_KERNELS_H
#define QT_KERNELS_H

#include "ptx/act.h"
#include "ptx/core.h"
#include "ptx/dp.h"
#include "ptx/gemm.h"
#include "ptx/gemm_sm90a.h"
#include "ptx/moe.h"
#include "ptx/optim.h"
#include "ptx/quant_block.h"
#include "ptx/quant_fp8.h"
#include "ptx/quant_group.h"
#include "ptx/quant_mxfp8.h"
#include "ptx/quant_nvfp4.h"
#include "ptx/sched_ops.h"

#define QT_KERNELS_PROGRAM(X) QT_KERNELS_CORE(X) QT_KERNELS_QUANT_MXFP8(X) \
    QT_KERNELS_QUANT_BLOCK(X) \
    QT_KERNELS_QUANT_GROUP(X) QT_KERNELS_QUANT_FP8(X) \
    QT_KERNELS_QUANT_NVFP4(X) \
    QT_KERNELS_OPTIM(X) \
    QT_KERNELS_ACT(X) \
    QT_KERNELS_GEMM(X) \
    QT_KERNELS_MOE(X) \
    QT_KERNELS_SCHED(X) \
    QT_KERNELS_DP(X)

// Every kernel: the ones programs hold, then the sm_90a GEMM tier and the portable tier's
// small-tile entry points, which runtime/backend/gemm_tier.c launches in place of a program's
// portable GEMM (never appended to a program).
#define QT_KERNELS(X) QT_KERNELS_PROGRAM(X) QT_KERNELS_GEMM_SM90A(X) QT_KERNELS_GEMM_SMALL(X)

// Modules: one per ptx/*.cu, embedded as qt_module_<name> by tools/embed.
#define QT_MODULES(X) X(core) X(quant_mxfp8) X(quant_block) X(quant_group) X(quant_fp8) \
    X(quant_nvfp4) \
    X(optim) \
    X(act) \
    X(gemm_portable) \
    X(gemm_skinny) \
    X(gemm_sm90a) \
    X(moe) \
    X(sched) \
    X(dp)

// Every args struct of a kernel that programs hold fits the program's per-op args buffer (the
// sm_90a GEMM args, tensor maps included, are built on the stack at launch). The largest is
// gemm_act_args, a GEMM's args and an activation's (ptx/act.h).
#define QT_ARGS_BYTES_MAX 352
#define QT_ARGS_FIT(id, module, symbol, args) \
    QT_STATIC_ASSERT(sizeof(args) <= QT_ARGS_BYTES_MAX, #args " exceeds QT_ARGS_BYTES_MAX");
QT_KERNELS_PROGRAM(QT_ARGS_FIT)
#undef QT_ARGS_FIT

#define QT_KERNEL_ID(id, module, symbol, args) id,
typedef enum kernel_id { QT_KERNELS(QT_KERNEL_ID) KERNEL_COUNT } kernel_id;
#undef QT_KERNEL_ID

// MODULE_host: the ops that no image holds, which the backend runs on the host's side (the
// collective op of ptx/dp.h, handed to NCCL); no module is loaded for it.
#define QT_MODULE_ID(module) MODULE_##module,
typedef enum module_id { QT_MODULES(QT_MODULE_ID) MODULE_COUNT, MODULE_host = MODULE_COUNT }
    module_id;
#undef QT_MODULE_ID

#endif  // QT_KERNELS_H
