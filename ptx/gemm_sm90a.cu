// gemm_sm90a: the sm_90a GEMM tier (TMA, wgmma, warp specialization, a persistent grid): BF16
// with each operand K-major or outer-major (fprop, dgrad and wgrad alike), and with both operands
// K-major per-tensor FP8 (fast or split accumulation), FP8 block scaling, and MXFP8 and NVFP4
// decoded to BF16 (see "Emulated formats" below); dense or GEMM_GROUP_M, and for BF16, per-tensor
// FP8 and FP8 block GEMM_GROUP_K (wgrad; gemm_sm90a.h, "Grouping"). ABI and tile shapes:
// gemm_sm90a.h; arithmetic: gemm.h. Built for sm_90a only (wgmma and setmaxnreg exist nowhere
// else); runtime/backend/gemm_tier.c launches it in place of the portable kernel and keeps the
// portable tier for everything else.
//
// One CTA, 384 threads:
//   warpgroup 0, producer: one thread walks the CTA's tiles and their k stages; per stage it
//     waits for the stage's `empty` barrier, announces the stage's bytes on its `full` barrier
//     and issues the TMA loads (A tile, B tile, FP8 block scales of B when they are per
//     column, the emulated formats' scale groups), which complete the `full` barrier as they
//     land. The other producer threads retire (the emulated formats without scale groups:
//     warps 1-3 load block scales), and the warpgroup gives its registers up (setmaxnreg) to
//     the consumers.
//   warpgroups 1, 2, consumers: rows 64 w ... 64 w + 63 of the tile and all N columns; per stage
//     they wait for `full`, issue wgmma from shared memory and release the stage on its `empty`
//     barrier (one arrival per consumer warp) once their wgmma have read it. After a tile's
//     last stage each warpgroup stages its rows of D through its epilogue buffers in shared
//     memory, from which TMA stores them while the warpgroup starts the next tile (tiles that
//     TMA cannot write exactly, such as D with C to add, store from registers).
//
// Shared memory per stage (1024-byte aligned, 128-byte swizzle written by TMA and read by wgmma
// through matrix descriptors):
//
//   A: 128 rows x 128 bytes of k (16 KiB)   B: N rows x 128 bytes of k (N / 8 KiB)
//   8-row groups of 1024 bytes; inside a group, 16-byte chunk c of row r sits at chunk c ^ r
//
// An outer-major BF16 operand (stored [k][r]) arrives as it is stored, no transpose anywhere:
// TMA boxes of 64 k x 64 r (8 KiB, one 128-byte line of 64 r values per k), one box per 64 tile
// rows, in the same 128-byte swizzle; wgmma reads them MN-major (its transpose flag) through
// descriptors whose leading byte offset steps from one 64-row box to the next (gemm_sm90a.h,
// GEMM_SM90A_OUTER_BOX_BYTES). The stage holds the same bytes either way.
//
// Accumulation. Every output element is one FP32 sum over k in a fixed order: k stages in order,
// inside a stage the wgmma k steps (16 bf16 or 32 fp8 values) in order; no split-K. Per-tensor
// FP8 with split accumulation and FP8 block scaling sum each 128-wide K block (one stage) into a
// fresh partial accumulator (wgmma with scale-d = 0 for its first k step) and add it to the FP32
// accumulator with qt_gemm_split_add / qt_gemm_promote (tiles of 192 columns: 96 registers of
// partial and 96 of accumulator per consumer thread, gemm_whole_partial_loop).
#include "ptx/gemm_sm90a.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement
#include "ptx/gemm_decode.h"  // the emulated formats' decode, shared with the portable tier

// Register budgets after setmaxnreg: the producer warpgroup gives registers up to the consumers.
// The emulated formats' producer warpgroup also loads block scales (warps 1-3), which needs more.
// A CTA is launched with GEMM_SM90A_LAUNCH_REGS per thread (65536 / 384, rounded down to the
// allocation unit of 8), and setmaxnreg.inc waits until the registers it asks for are free: the
// consumers can take only what the producer gave up, or they wait forever.
#define GEMM_SM90A_LAUNCH_REGS 168
#define GEMM_SM90A_PRODUCER_REGS 40
#define GEMM_SM90A_CONSUMER_REGS 232
// FP8 block scaling's consumers hold the accumulator, two half partials (one still being
// written by wgmma while the other is promoted) and the promotion's scales; its producer only
// loads K-major tiles and their scale slots.
#define GEMM_SM90A_BLOCK_PRODUCER_REGS 24
#define GEMM_SM90A_BLOCK_CONSUMER_REGS 240
#define GEMM_SM90A_EMU_PRODUCER_REGS 56
#define GEMM_SM90A_EMU_CONSUMER_REGS 224
#define GEMM_SM90A_CONSUMER_WARPS 8u

QT_STATIC_ASSERT(GEMM_SM90A_THREADS == 3 * 128, "one producer and two consumer warpgroups");
QT_STATIC_ASSERT(GEMM_SM90A_TILE_M == 2 * 64, "each consumer warpgroup owns 64 rows");
QT_STATIC_ASSERT(GEMM_SM90A_TILE_M == GEMM_TILE_M,
                 "qt_gemm_member_tiles counts a member's rows in tiles of this height");
QT_STATIC_ASSERT(GEMM_SM90A_LAUNCH_REGS == 65536 / GEMM_SM90A_THREADS / 8 * 8,
                 "the registers a thread gets at launch");
QT_STATIC_ASSERT(128 * GEMM_SM90A_PRODUCER_REGS + 256 * GEMM_SM90A_CONSUMER_REGS <=
                         GEMM_SM90A_THREADS * GEMM_SM90A_LAUNCH_REGS &&
                     128 * GEMM_SM90A_BLOCK_PRODUCER_REGS + 256 * GEMM_SM90A_BLOCK_CONSUMER_REGS <=
                         GEMM_SM90A_THREADS * GEMM_SM90A_LAUNCH_REGS &&
                     128 * GEMM_SM90A_EMU_PRODUCER_REGS + 256 * GEMM_SM90A_EMU_CONSUMER_REGS <=
                         GEMM_SM90A_THREADS * GEMM_SM90A_LAUNCH_REGS,
                 "the consumers take no more registers than the producer gives up");
QT_STATIC_ASSERT(GEMM_SM90A_K_BYTES == GEMM_SPLIT_K && GEMM_SM90A_K_BYTES == GEMM_BLOCK_FP8,
                 "an fp8 stage is exactly one 128-wide K block");
QT_STATIC_ASSERT(GEMM_SM90A_SMEM_BYTES(GEMM_SM90A_TILE_N_FAST) <= 227u * 1024u &&
                     GEMM_SM90A_SMEM_BYTES(GEMM_SM90A_TILE_N_SPLIT) <= 227u * 1024u,
                 "fits an sm_90 CTA's shared memory");

// ---------------------------------------------------------------------------------------------
// Hardware primitives: the only code that is PTX.

extern __shared__ __align__(1024) uint8_t gemm_sm90a_smem[];

__device__ __forceinline__ uint32_t gemm_smem_address(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void gemm_mbar_init(uint32_t bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals)
                 : "memory");
}

// The producer's arrival on a `full` barrier, announcing the bytes its TMA loads will deliver.
__device__ __forceinline__ void gemm_mbar_expect_bytes(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void gemm_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase of the given parity has completed. A fresh barrier is in phase 0, and a
// wait for parity 1 returns at once (the phase before it counts as completed): that is how the
// producer's first pass over the `empty` barriers goes through.
__device__ __forceinline__ void gemm_mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// NOTE: TMA reads the tensor map through its generic address; a __grid_constant__ parameter has
// one, so the maps stay in the kernel's parameter space.
__device__ __forceinline__ void gemm_tma_prefetch(const gemm_tensor_map *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

__device__ __forceinline__ void gemm_tma_load_2d(uint32_t dst, const gemm_tensor_map *map,
                                                 uint32_t bar, int32_t x, int32_t y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(x), "r"(y)
        : "memory");
}

__device__ __forceinline__ void gemm_tma_load_3d(uint32_t dst, const gemm_tensor_map *map,
                                                 uint32_t bar, int32_t x, int32_t y, int32_t z) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(x), "r"(y), "r"(z)
        : "memory");
}

// A TMA store of a shared-memory tile (the tensor map's box, in its swizzle) to global memory,
// in the issuing thread's bulk group; the store clips what lies past the tensor's edges.
__device__ __forceinline__ void gemm_tma_store_2d(const gemm_tensor_map *map, uint32_t src,
                                                  int32_t x, int32_t y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
        "r"(src), "r"(x), "r"(y)
        : "memory");
}

// The same into the D of member z, through a map whose third dimension is the member.
__device__ __forceinline__ void gemm_tma_store_3d(const gemm_tensor_map *map, uint32_t src,
                                                  int32_t x, int32_t y, int32_t z) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group"
        " [%0, {%2, %3, %4}], [%1];\n" ::"l"(map),
        "r"(src), "r"(x), "r"(y), "r"(z)
        : "memory");
}

__device__ __forceinline__ void gemm_bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's bulk groups still read shared memory.
template <int kPending>
__device__ __forceinline__ void gemm_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until this thread's bulk groups have completed (their writes done).
__device__ __forceinline__ void gemm_bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Register budgets of the roles. setmaxnreg must be executed by every warp of a warpgroup.
template <uint32_t kRegs>
__device__ __forceinline__ void gemm_regs_producer() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <uint32_t kRegs>
__device__ __forceinline__ void gemm_regs_consumer() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ __forceinline__ void gemm_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void gemm_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending of the warpgroup's committed wgmma groups are still running.
template <int kPending>
__device__ __forceinline__ void gemm_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of accumulator registers across the asynchronous
// wgmma boundaries (fence, wait): the registers are written behind its back.
template <int kN>
__device__ __forceinline__ void gemm_fence_registers(float (&r)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; i++) asm volatile("" : "+f"(r[i])::"memory");
}

// Matrix descriptor of a K-major operand tile in the 128-byte swizzle (PTX ISA, "Matrix
// Descriptor Format"): start address >> 4 (bits 0-13), leading byte offset >> 4 (bits 16-29;
// unused by K-major swizzled layouts, whose k extent per instruction stays inside one 128-byte
// row), stride byte offset >> 4 (bits 32-45: 1024, from one 8-row group to the next) and the
// swizzle mode (bits 62-63: 1 = 128 bytes). The tiles are 1024-byte aligned, so the base offset
// (bits 49-51) is 0. The k step of an instruction adds its byte offset to the start address: the
// swizzle is a function of the address bits, the same for TMA's writes and wgmma's reads.
__device__ __forceinline__ uint64_t gemm_smem_desc_high() {
    return ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ uint64_t gemm_smem_desc(uint32_t address) {
    return (uint64_t)((address & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | gemm_smem_desc_high();
}

// Matrix descriptor of an outer-major (MN-major) BF16 tile in the 128-byte swizzle: 64 r values
// per 128-byte line, one line per k, 8-line groups of 1024 bytes (stride byte offset), and the
// next 64 r values one box further (leading byte offset GEMM_SM90A_OUTER_BOX_BYTES). A k step of
// 16 values is 16 lines: 2048 bytes added to the start address.
__device__ __forceinline__ uint64_t gemm_smem_desc_outer(uint32_t address) {
    return (uint64_t)((address & 0x3FFFFu) >> 4) |
           ((uint64_t)(GEMM_SM90A_OUTER_BOX_BYTES >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

// wgmma instructions: D (64 x N, FP32, N / 2 registers per thread) += A (64 x k from shared
// memory) x B (N x k from shared memory), K-major, or for BF16 either one outer-major (the
// instruction's transpose immediates, kOuterA and kOuterB); D = A x B instead when `accumulate`
// is 0.
// Register i of a thread holds row 16 warp + lane / 4 + 8 ((i / 2) % 2) and column
// 8 (i / 4) + 2 (lane % 4) + i % 2 of its warpgroup's 64 x N block. The FP8 kinds take E4M3 or
// E5M2 A (gradients) and E4M3 B, as the portable tier does.

// The accumulator operands of a 64 x N wgmma, N / 2 FP32 registers per thread: the register
// list of the instruction template and the matching "+f" constraints, written once for the
// wrappers below, which differ only in shape, types and the trailing immediates.
// The operand numbers in three runs, so that each list is a concatenation of them.
#define GEMM_WGMMA_OPERANDS_0_47 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define GEMM_WGMMA_OPERANDS_48_95 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, " \
    "%65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define GEMM_WGMMA_OPERANDS_96_127 \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
    "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, " \
    "%125, %126, %127"
#define GEMM_WGMMA_REGS_96 "{" GEMM_WGMMA_OPERANDS_0_47 ", " GEMM_WGMMA_OPERANDS_48_95 "}"
#define GEMM_WGMMA_REGS_128 \
    "{" GEMM_WGMMA_OPERANDS_0_47 ", " GEMM_WGMMA_OPERANDS_48_95 ", " GEMM_WGMMA_OPERANDS_96_127 "}"
// Eight accumulators from d[i].
#define GEMM_WGMMA_D_8(d, i)                                                                 \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define GEMM_WGMMA_D_48(d)                                                                   \
    GEMM_WGMMA_D_8(d, 0), GEMM_WGMMA_D_8(d, 8), GEMM_WGMMA_D_8(d, 16), GEMM_WGMMA_D_8(d, 24), \
        GEMM_WGMMA_D_8(d, 32), GEMM_WGMMA_D_8(d, 40)
#define GEMM_WGMMA_D_96(d)                                                                  \
    GEMM_WGMMA_D_48(d), GEMM_WGMMA_D_8(d, 48), GEMM_WGMMA_D_8(d, 56), GEMM_WGMMA_D_8(d, 64), \
        GEMM_WGMMA_D_8(d, 72), GEMM_WGMMA_D_8(d, 80), GEMM_WGMMA_D_8(d, 88)
#define GEMM_WGMMA_D_128(d)                                                                   \
    GEMM_WGMMA_D_96(d), GEMM_WGMMA_D_8(d, 96), GEMM_WGMMA_D_8(d, 104), GEMM_WGMMA_D_8(d, 112), \
        GEMM_WGMMA_D_8(d, 120)

// One wrapper: `instr` over the N / 2 accumulators, then the two descriptors (operands `descs`),
// the predicate made from `accumulate` (operand `pred`), and `tail` (scale-d immediates, and for
// 16-bit types the two transpose flags, which outer_a and outer_b restate for the descriptors);
// elem_bytes: bytes of one operand element.
#define GEMM_WGMMA(name, n, instr, regs, outs, descs, pred, tail, outer_a, outer_b, elem_bytes) \
    struct name {                                                                              \
        static constexpr uint32_t kN = n;                                                      \
        static constexpr uint32_t kElemBytes = elem_bytes;                                     \
        static constexpr bool kOuterA = outer_a;                                               \
        static constexpr bool kOuterB = outer_b;                                               \
        static __device__ __forceinline__ void run(float (&d)[n / 2], uint64_t desc_a,         \
                                                   uint64_t desc_b, uint32_t accumulate) {     \
            asm volatile("{\n"                                                                 \
                         ".reg .pred p;\n"                                                     \
                         "setp.ne.b32 p, " pred ", 0;\n"                                       \
                         instr " " regs ",\n"                                                  \
                         descs ", p, " tail ";\n"                                              \
                         "}\n"                                                                 \
                         : outs(d)                                                             \
                         : "l"(desc_a), "l"(desc_b), "r"(accumulate));                         \
        }                                                                                      \
    }

GEMM_WGMMA(gemm_wgmma_bf16_n256, 256, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
           GEMM_WGMMA_REGS_128, GEMM_WGMMA_D_128, "%128, %129", "%130", "1, 1, 0, 0", false, false,
           2);
GEMM_WGMMA(gemm_wgmma_bf16_n256_outer_a, 256,
           "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", GEMM_WGMMA_REGS_128,
           GEMM_WGMMA_D_128, "%128, %129", "%130", "1, 1, 1, 0", true, false, 2);
GEMM_WGMMA(gemm_wgmma_bf16_n256_outer_b, 256,
           "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", GEMM_WGMMA_REGS_128,
           GEMM_WGMMA_D_128, "%128, %129", "%130", "1, 1, 0, 1", false, true, 2);
GEMM_WGMMA(gemm_wgmma_bf16_n256_outer_ab, 256,
           "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", GEMM_WGMMA_REGS_128,
           GEMM_WGMMA_D_128, "%128, %129", "%130", "1, 1, 1, 1", true, true, 2);
GEMM_WGMMA(gemm_wgmma_e4m3_n256, 256, "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3",
           GEMM_WGMMA_REGS_128, GEMM_WGMMA_D_128, "%128, %129", "%130", "1, 1", false, false, 1);
GEMM_WGMMA(gemm_wgmma_e5m2_n256, 256, "wgmma.mma_async.sync.aligned.m64n256k32.f32.e5m2.e4m3",
           GEMM_WGMMA_REGS_128, GEMM_WGMMA_D_128, "%128, %129", "%130", "1, 1", false, false, 1);
GEMM_WGMMA(gemm_wgmma_e4m3_n192, 192, "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3",
           GEMM_WGMMA_REGS_96, GEMM_WGMMA_D_96, "%96, %97", "%98", "1, 1", false, false, 1);
GEMM_WGMMA(gemm_wgmma_e5m2_n192, 192, "wgmma.mma_async.sync.aligned.m64n192k32.f32.e5m2.e4m3",
           GEMM_WGMMA_REGS_96, GEMM_WGMMA_D_96, "%96, %97", "%98", "1, 1", false, false, 1);

// Shared-memory accesses of the consumers' own (the emulated formats' decode, a K-grouped
// member's k tail) and their barrier.

#define GEMM_SM90A_CONSUMER_BARRIER 1  // named barrier of the 256 consumer threads

__device__ __forceinline__ uint4 gemm_lds128(uint32_t address) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(address)
                 : "memory");
    return v;
}

__device__ __forceinline__ void gemm_sts128(uint32_t address, uint32_t x, uint32_t y, uint32_t z,
                                            uint32_t w) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(x), "r"(y),
                 "r"(z), "r"(w)
                 : "memory");
}

__device__ __forceinline__ void gemm_consumer_barrier() {
    asm volatile("bar.sync %0, 256;\n" ::"n"(GEMM_SM90A_CONSUMER_BARRIER) : "memory");
}

// Generic-proxy writes to shared memory (a decoded stage, a masked k tail) made visible to
// wgmma (async proxy).
__device__ __forceinline__ void gemm_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Byte offset of 16-byte chunk c of row r in a tile of kRowBytes rows that TMA wrote in the
// swizzle of the same span (32, 64 or 128 bytes): the chunk index XOR the address bits 7 and up.
template <uint32_t kRowBytes>
__device__ __forceinline__ uint32_t gemm_swizzled(uint32_t r, uint32_t c) {
    return r * kRowBytes + 16u * (c ^ ((r * kRowBytes / 128u) % (kRowBytes / 16u)));
}

// ---------------------------------------------------------------------------------------------
// Shared memory, pipeline position, schedule.

// A kernel's shared-memory shape: tiles of kN columns; kStages stages of kStageBytes, each the A
// tile (kABytes) and then the B tile as TMA writes them; kSlotBytes of B scales per stage;
// kDecodedBytes of decoded stages (emulated formats); kSmemBytes, what the launch gives.
template <uint32_t kTileN>
struct gemm_shape_native {
    static constexpr uint32_t kN = kTileN;
    static constexpr uint32_t kStages = GEMM_SM90A_STAGES(kTileN);
    static constexpr uint32_t kStageBytes = GEMM_SM90A_STAGE_BYTES(kTileN);
    static constexpr uint32_t kABytes = GEMM_SM90A_TILE_M * GEMM_SM90A_K_BYTES;
    static constexpr uint32_t kSlotBytes = GEMM_SM90A_SCALE_SLOT_BYTES(kTileN);
    static constexpr uint32_t kSlotRegionBytes = kStages * kSlotBytes;
    static constexpr uint32_t kScaleRowBytes = 0;  // no scale groups
    static constexpr uint32_t kScaleGroupBytes = 0;
    static constexpr uint32_t kDecodedBytes = 0;
    static constexpr uint32_t kEpilogueBuffers = GEMM_SM90A_EPI_BUFFERS(kTileN);
    static constexpr uint32_t kSmemBytes = GEMM_SM90A_SMEM_BYTES(kTileN);
};

template <uint32_t kFormat>
struct gemm_shape_emulated {
    static constexpr uint32_t kN = GEMM_SM90A_EMU_TILE_N;
    static constexpr uint32_t kRowBytes = GEMM_SM90A_EMU_ROW_BYTES(kFormat);
    static constexpr uint32_t kStages = GEMM_SM90A_EMU_STAGES(kFormat);
    static constexpr uint32_t kStageBytes = GEMM_SM90A_EMU_STAGE_BYTES(kFormat);
    static constexpr uint32_t kABytes = GEMM_SM90A_TILE_M * kRowBytes;
    static constexpr uint32_t kSlotBytes = GEMM_SM90A_EMU_SCALE_SLOT_BYTES;
    static constexpr uint32_t kScaleRowBytes = GEMM_SM90A_EMU_SCALE_ROW_BYTES(kFormat);
    static constexpr uint32_t kScaleGroupBytes = GEMM_SM90A_EMU_SCALE_GROUP_BYTES(kFormat);
    // The slots, or (scale groups) the two group buffers, in one region.
    static constexpr uint32_t kSlotRegionBytes = GEMM_SM90A_EMU_SCALE_REGION_BYTES(kFormat);
    static constexpr uint32_t kDecodedBytes = GEMM_SM90A_EMU_DECODED_BYTES;
    static constexpr uint32_t kEpilogueBuffers = GEMM_SM90A_EMU_EPI_BUFFERS;
    static constexpr uint32_t kSmemBytes = GEMM_SM90A_EMU_SMEM_BYTES(kFormat);
};

// Stages, then the decoded tiles, the epilogue buffers, the scale slots (or scale group buffers)
// and the barriers (a full and an empty one per stage).
template <class Shape>
struct gemm_smem {
    static constexpr uint32_t kStages = Shape::kStages;
    static constexpr uint32_t kStageBytes = Shape::kStageBytes;
    static constexpr uint32_t kSlotBytes = Shape::kSlotBytes;
    static constexpr uint32_t kDecodedBytes = Shape::kDecodedBytes;
    static constexpr uint32_t kEpilogueBuffers = Shape::kEpilogueBuffers;
    static constexpr uint32_t kEpilogueBytes = GEMM_SM90A_EPI_BYTES(kEpilogueBuffers);
    static_assert(kStageBytes % 1024 == 0 && Shape::kABytes % 1024 == 0 &&
                      kSlotBytes % 128 == 0 && kDecodedBytes % 2048 == 0,
                  "aligned stages, tiles and slots");
    static_assert(Shape::kSlotRegionBytes >= kStages * kSlotBytes, "the region holds the slots");
    static_assert(Shape::kSmemBytes >= 1024u + kStages * (kStageBytes + 16u) +
                                           Shape::kSlotRegionBytes + kDecodedBytes +
                                           kEpilogueBytes,
                  "the launch's shared memory holds the layout");
    uint32_t base;   // shared address of stage 0, 1024-byte aligned
    uint8_t *bytes;  // the same place, generic (for the consumers' reads of the scale slots)
    __device__ __forceinline__ uint32_t a(uint32_t s) const { return base + s * kStageBytes; }
    __device__ __forceinline__ uint32_t b(uint32_t s) const { return a(s) + Shape::kABytes; }
    // Decoded stage i (0, 1): the A tile, then the B tile.
    __device__ __forceinline__ uint32_t decoded(uint32_t i) const {
        return base + kStages * kStageBytes + i * (kDecodedBytes / 2);
    }
    // Epilogue buffer i of consumer warpgroup wg (1024-byte aligned, for the swizzle).
    __device__ __forceinline__ uint32_t epilogue(uint32_t wg, uint32_t i) const {
        return base + kStages * kStageBytes + kDecodedBytes +
               (wg * kEpilogueBuffers + i) * GEMM_SM90A_EPI_BUFFER_BYTES;
    }
    __device__ __forceinline__ uint32_t slot_offset(uint32_t s) const {
        return kStages * kStageBytes + kDecodedBytes + kEpilogueBytes + s * kSlotBytes;
    }
    // Scale group buffer i (0, 1) of the emulated formats, in the slots' region.
    __device__ __forceinline__ uint32_t group_offset(uint32_t i) const {
        return slot_offset(0) + i * Shape::kScaleGroupBytes;
    }
    __device__ __forceinline__ uint32_t full(uint32_t s) const {
        return base + slot_offset(0) + Shape::kSlotRegionBytes + 8 * s;
    }
    __device__ __forceinline__ uint32_t empty(uint32_t s) const { return full(kStages + s); }
};

template <class Shape>
__device__ __forceinline__ gemm_smem<Shape> gemm_smem_carve() {
    uint32_t raw = gemm_smem_address(gemm_sm90a_smem);
    uint32_t aligned = (raw + 1023u) & ~1023u;
    gemm_smem<Shape> sm = {aligned, gemm_sm90a_smem + (aligned - raw)};
    return sm;
}

// Position in the ring of stages; the parity flips each time the ring wraps. The producer and
// every consumer thread walk the same sequence of stages (tiles in order, k stages in order).
template <uint32_t kStages>
struct gemm_pipe {
    uint32_t stage, phase;
    uint32_t decoded;  // emulated formats: the decoded B tile of this stage (stages taken, mod 2)
    uint32_t groups;   // emulated formats: scale groups begun (consumers)
    __device__ __forceinline__ void advance() {
        decoded ^= 1u;
        if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
        }
    }
};

// D rows of a tile: [m0, min(m0 + 128, m_end)), of which rows from m_valid_end on are padding
// (written as zeros); columns [n0, min(n0 + N, n)). Its contraction: k_stages stages from k0
// (GEMM_GROUP_K: the member's first row; else 0), of which the last holds k_last valid k (fewer
// than a stage only for GEMM_GROUP_K: the rest is zeroed, gemm_zero_k_tail). b_member: B's
// member coordinate (GEMM_GROUP_M: the member; else 0, one B for all).
struct gemm_tile_pos {
    uint32_t member;
    uint32_t m0, m_end, m_valid_end;
    uint32_t n0;
    uint32_t k0, k_stages, k_last;
    uint32_t b_member;
};

// The tile order. Tile t lies in raster group t / (16 col_tiles): its 16 row tiles (fewer in the
// last group), walked row tile fastest. GEMM_GROUP_M counts row tiles member by member (each
// member's padded rows in whole tiles, qt_gemm_member_tiles); a cursor remembers the member of
// the current group's first row tile, so the lookup walks each member once per CTA, plus at most
// a group's worth per tile, with no per-member storage. GEMM_GROUP_K repeats the dense order for
// each member in turn (member t / (row_tiles col_tiles)).
struct gemm_sched {
    uint32_t row_tiles, col_tiles, members, total;
    uint32_t cursor_member;  // GEMM_GROUP_M: the member holding row tile cursor_before
    uint32_t cursor_before;  // row tiles of the members before cursor_member
};

__device__ __forceinline__ uint32_t gemm_member_row_tiles(const uint32_t *off, uint32_t member) {
    return qt_gemm_member_tiles(__ldg(off + member + 1) - __ldg(off + member));
}

// Called by whole warps (a warp sums the members' row tiles).
__device__ __forceinline__ gemm_sched gemm_sched_init(const gemm_sm90a_args &args) {
    gemm_sched s = {args.row_tiles, args.col_tiles, 1, 0, 0, 0};
    if (args.gemm.grouping == GEMM_GROUP_M) {
        const uint32_t *off = reinterpret_cast<const uint32_t *>(args.gemm.group.row_offsets);
        uint32_t sum = 0;
        for (uint32_t i = threadIdx.x & 31; i < args.gemm.group.count; i += 32) {
            sum += gemm_member_row_tiles(off, i);
        }
#pragma unroll
        for (uint32_t d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, d);
        s.row_tiles = sum;
    }
    if (args.gemm.grouping == GEMM_GROUP_K) s.members = args.gemm.group.count;
    s.total = s.row_tiles * s.col_tiles * s.members;  // gemm_tier.c keeps it below 2^31
    return s;
}

// Tile t's position; kStageK: k per stage (the native formats'; the emulated formats, whose
// stages count bytes of codes, are never K-grouped).
template <uint32_t kTileN, uint32_t kStageK>
__device__ __forceinline__ gemm_tile_pos gemm_sched_tile(const gemm_sm90a_args &args,
                                                         gemm_sched &s, uint32_t t) {
    const gemm_args &g = args.gemm;
    uint32_t k_member = 0;
    if (g.grouping == GEMM_GROUP_K) {
        uint32_t per_member = s.row_tiles * s.col_tiles;
        k_member = t / per_member;
        t -= k_member * per_member;
    }
    uint32_t per_group = GEMM_SM90A_RASTER_M * s.col_tiles;
    uint32_t group = t / per_group;
    uint32_t first = group * GEMM_SM90A_RASTER_M;
    uint32_t rows = min(GEMM_SM90A_RASTER_M, s.row_tiles - first);
    uint32_t within = t - group * per_group;
    uint32_t row_tile = first + within % rows;
    gemm_tile_pos p;
    p.n0 = (within / rows) * kTileN;
    p.k0 = 0;
    p.k_stages = args.k_stages;
    p.k_last = kStageK;
    p.b_member = 0;
    const uint32_t *off = reinterpret_cast<const uint32_t *>(g.group.row_offsets);
    const uint32_t *first_dims = reinterpret_cast<const uint32_t *>(g.group.first_dims);
    if (g.grouping != GEMM_GROUP_M) {
        p.member = k_member;
        p.m0 = row_tile * GEMM_SM90A_TILE_M;
        p.m_end = g.m;
        p.m_valid_end = g.m;
        if (g.grouping == GEMM_GROUP_K) {
            // The member's valid rows only: the stage holding its last row is masked after it.
            uint32_t valid = __ldg(first_dims + k_member);
            p.k0 = __ldg(off + k_member);
            p.k_stages = (valid + kStageK - 1) / kStageK;
            if (p.k_stages > 0) p.k_last = valid - (p.k_stages - 1) * kStageK;
        }
        return p;
    }
    // Groups only move forward along a CTA's tiles, so the cursor does too.
    while (s.cursor_before + gemm_member_row_tiles(off, s.cursor_member) <= first) {
        s.cursor_before += gemm_member_row_tiles(off, s.cursor_member);
        s.cursor_member++;
    }
    uint32_t member = s.cursor_member, before = s.cursor_before;
    while (before + gemm_member_row_tiles(off, member) <= row_tile) {
        before += gemm_member_row_tiles(off, member);
        member++;
    }
    uint32_t start = __ldg(off + member);
    p.member = member;
    p.b_member = member;
    p.m0 = start + (row_tile - before) * GEMM_SM90A_TILE_M;
    p.m_end = min(__ldg(off + member + 1), g.m);
    p.m_valid_end = min(start + __ldg(first_dims + member), p.m_end);
    return p;
}

// A consumer warp's release of a stage: its lanes are done with it (the wgmma that read it have
// completed, the scale slot has been read), one arrival per warp.
template <class Shape>
__device__ __forceinline__ void gemm_release(const gemm_smem<Shape> &sm, uint32_t stage) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) gemm_mbar_arrive(sm.empty(stage));
}

// A K-grouped member's k tail (gemm_sm90a.h, "Grouping"): in a landed stage whose first `valid`
// k belong to the member, every k from `valid` on is set to zero in both tiles, by the 256
// consumer threads together, before either warpgroup's wgmma read the stage. Zeros in both
// operands, not one: a zero times an Inf or NaN code of the other member's rows would still be
// NaN. A tile of kRows rows is kRows lines of 128 bytes, either layout: K-major, line r is row r
// (16-byte chunk c of it at chunk c ^ (r % 8), the 128-byte swizzle), whose bytes from
// valid * element bytes on are zeroed (a chunk across that point keeps its low bytes);
// outer-major BF16, line l is k l % 64 of the 64-row box l / 64, zeroed whole from k = valid on.
template <uint32_t kRows, bool kOuter>
__device__ __forceinline__ void gemm_zero_tile_k(uint32_t tile, uint32_t valid,
                                                 uint32_t elem_bytes, uint32_t tid) {
    static_assert(GEMM_SM90A_OUTER_BOX_BYTES == GEMM_SM90A_OUTER_BOX_K * GEMM_SM90A_K_BYTES,
                  "an outer-major box is 64 lines of 128 bytes");
    uint32_t valid_bytes = valid * elem_bytes;
    // One chunk at a time: the accumulators hold most registers here (split tiles: 96 + 96).
#pragma unroll 1
    for (uint32_t i = tid; i < kRows * 8u; i += 2u * 128u) {
        uint32_t line = i / 8u, c = i % 8u;
        if (kOuter) {
            if (line % GEMM_SM90A_OUTER_BOX_K >= valid) {
                gemm_sts128(tile + line * GEMM_SM90A_K_BYTES + 16u * c, 0u, 0u, 0u, 0u);
            }
            continue;
        }
        uint32_t lo = 16u * c;
        if (lo + 16u <= valid_bytes) continue;
        uint32_t at = tile + gemm_swizzled<GEMM_SM90A_K_BYTES>(line, c);
        uint32_t w[4] = {0u, 0u, 0u, 0u};
        if (lo < valid_bytes) {
            uint4 v = gemm_lds128(at);
            uint32_t keep = valid_bytes - lo;  // 1 ... 15 bytes of the chunk stay
            w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#pragma unroll
            for (uint32_t j = 0; j < 4; j++) {
                uint32_t first = 4u * j;
                if (keep <= first) {
                    w[j] = 0u;
                } else if (keep < first + 4u) {
                    w[j] &= (1u << (8u * (keep - first))) - 1u;
                }
            }
        }
        gemm_sts128(at, w[0], w[1], w[2], w[3]);
    }
}

// Masks tile p's stage `stage` when it is the member's last and holds fewer than kStageK valid
// k; every consumer thread calls it for every stage (both warpgroups walk the same stages, so
// they meet at the barrier together). The generic-proxy zeros are fenced for wgmma, which reads
// through the async proxy, and the barrier keeps both warpgroups' wgmma until the whole stage
// is masked.
template <class Shape, class Mma>
__device__ __forceinline__ void gemm_zero_k_tail(const gemm_smem<Shape> &sm, uint32_t stage,
                                                 const gemm_tile_pos &p, uint32_t kb) {
    constexpr uint32_t kStageK = GEMM_SM90A_K_BYTES / Mma::kElemBytes;
    if (kb + 1 != p.k_stages || p.k_last >= kStageK) return;
    uint32_t tid = threadIdx.x - 128u;  // consumer threads are 128 ... 383
    gemm_zero_tile_k<GEMM_SM90A_TILE_M, Mma::kOuterA>(sm.a(stage), p.k_last, Mma::kElemBytes,
                                                      tid);
    gemm_zero_tile_k<Mma::kN, Mma::kOuterB>(sm.b(stage), p.k_last, Mma::kElemBytes, tid);
    gemm_fence_proxy_async();
    gemm_consumer_barrier();
}

// ---------------------------------------------------------------------------------------------
// Producer: one thread. kStageK: k values per stage (64 bf16, 128 fp8); kScaleSlots: FP8 block
// scales of B per column, loaded with the stage (each CTA its own; they are small);
// kScaleGroups: the emulated formats' scale groups when args.scale_tma (gemm_sm90a.h), loaded
// with the first stage of each group of GEMM_SM90A_EMU_SCALE_GROUP into group buffer
// (groups so far) % 2.
// Reusing a group buffer is safe without a barrier of its own: every group is whole (k_stages is
// a multiple of its length), so when the producer may refill the stage that starts group g + 2,
// the consumers have released the stage kStages before it, past every stage of group g.
// kOuterA, kOuterB: the operand is outer-major BF16, loaded as one box of 64 k x 64 rows per 64
// tile rows (gemm_sm90a.h); boxes wholly past the operand's rows are not loaded: the D rows or
// columns they would feed are never stored, so what the stage holds there does not matter.

// Boxes of GEMM_SM90A_OUTER_BOX_ROWS that an outer-major operand's tile rows [r0, r0 + kRows)
// take from a map of `rows` rows (the map's first dimension): those that start inside it.
template <uint32_t kRows>
__device__ __forceinline__ uint32_t gemm_outer_boxes(uint32_t r0, uint32_t rows) {
    uint32_t left = r0 < rows ? rows - r0 : 0u;
    uint32_t boxes = (left + GEMM_SM90A_OUTER_BOX_ROWS - 1) / GEMM_SM90A_OUTER_BOX_ROWS;
    return min(boxes, kRows / GEMM_SM90A_OUTER_BOX_ROWS);
}

// The first `boxes` boxes of those tile rows, at k0 (and member, for a map of rank 3).
template <uint32_t kRows, uint32_t kRank>
__device__ __forceinline__ void gemm_load_outer(uint32_t dst, const gemm_tensor_map *map,
                                                uint32_t bar, uint32_t r0, uint32_t boxes,
                                                int32_t k0, uint32_t member) {
#pragma unroll
    for (uint32_t box = 0; box < kRows / GEMM_SM90A_OUTER_BOX_ROWS; box++) {
        if (box >= boxes) break;
        uint32_t at = dst + box * GEMM_SM90A_OUTER_BOX_BYTES;
        int32_t r = (int32_t)(r0 + box * GEMM_SM90A_OUTER_BOX_ROWS);
        if (kRank == 2) {
            gemm_tma_load_2d(at, map, bar, r, k0);
        } else {
            gemm_tma_load_3d(at, map, bar, r, k0, (int32_t)member);
        }
    }
}

// A K-major B tile at k0: coordinates (k, column, member), or (k, member, column) where the map
// has B's members inside its rows (gemm_sm90a.h).
__device__ __forceinline__ void gemm_load_b(const gemm_sm90a_args &args, uint32_t dst,
                                            uint32_t bar, int32_t k0, const gemm_tile_pos &p) {
    if (args.b_members_inner != 0) {
        gemm_tma_load_3d(dst, &args.b, bar, k0, (int32_t)p.b_member, (int32_t)p.n0);
    } else {
        gemm_tma_load_3d(dst, &args.b, bar, k0, (int32_t)p.n0, (int32_t)p.b_member);
    }
}

template <class Shape, uint32_t kStageK, bool kScaleSlots, bool kScaleGroups, bool kOuterA,
          bool kOuterB>
__device__ __forceinline__ void gemm_produce(const gemm_sm90a_args &args,
                                             const gemm_smem<Shape> &sm, gemm_sched s) {
    using smem = gemm_smem<Shape>;
    constexpr uint32_t kBytes = smem::kStageBytes + (kScaleSlots ? smem::kSlotBytes : 0u);
    static_assert(!(kOuterA || kOuterB) || (kStageK == GEMM_SM90A_OUTER_BOX_K && !kScaleSlots &&
                                            !kScaleGroups),
                  "outer-major operands are BF16: one box of k per stage, no block scales");
    static_assert(!kScaleGroups || smem::kStages <= GEMM_SM90A_EMU_SCALE_GROUP,
                  "a group buffer is refilled only after its group's stages are released");
    constexpr uint32_t kRowBytes = Shape::kScaleRowBytes;
    constexpr uint32_t kGroupBytes = Shape::kScaleGroupBytes;
    bool groups = kScaleGroups && args.scale_tma != 0;
    gemm_tma_prefetch(&args.a);
    gemm_tma_prefetch(&args.b);
    if (kScaleSlots || groups) gemm_tma_prefetch(&args.b_scale);
    if (groups) gemm_tma_prefetch(&args.a_scale);
    gemm_pipe<smem::kStages> pipe = {0, 0};
    uint32_t group = 0;
    for (uint32_t t = blockIdx.x; t < s.total; t += gridDim.x) {
        gemm_tile_pos p = gemm_sched_tile<Shape::kN, kStageK>(args, s, t);
        for (uint32_t kb = 0; kb < p.k_stages; kb++) {
            gemm_mbar_wait(sm.empty(pipe.stage), pipe.phase ^ 1u);
            uint32_t full = sm.full(pipe.stage);
            bool group_start = groups && kb % GEMM_SM90A_EMU_SCALE_GROUP == 0;
            int32_t k0 = (int32_t)(p.k0 + kb * kStageK);
            if constexpr (kOuterA || kOuterB) {
                uint32_t a_boxes = gemm_outer_boxes<GEMM_SM90A_TILE_M>(p.m0, args.gemm.m);
                uint32_t b_boxes = gemm_outer_boxes<Shape::kN>(p.n0, args.gemm.n);
                uint32_t bytes = (kOuterA ? a_boxes * GEMM_SM90A_OUTER_BOX_BYTES : Shape::kABytes) +
                                 (kOuterB ? b_boxes * GEMM_SM90A_OUTER_BOX_BYTES
                                          : smem::kStageBytes - Shape::kABytes);
                gemm_mbar_expect_bytes(full, bytes);
                if constexpr (kOuterA) {
                    gemm_load_outer<GEMM_SM90A_TILE_M, 2>(sm.a(pipe.stage), &args.a, full, p.m0,
                                                          a_boxes, k0, 0);
                } else {
                    gemm_tma_load_2d(sm.a(pipe.stage), &args.a, full, k0, (int32_t)p.m0);
                }
                if constexpr (kOuterB) {
                    gemm_load_outer<Shape::kN, 3>(sm.b(pipe.stage), &args.b, full, p.n0, b_boxes,
                                                  k0, p.b_member);
                } else {
                    gemm_load_b(args, sm.b(pipe.stage), full, k0, p);
                }
                pipe.advance();
                continue;
            }
            // NOTE: a box that reaches past the tensor still delivers its full size (zeros
            // outside), so every stage completes the same byte count.
            gemm_mbar_expect_bytes(full, kBytes + (group_start ? kGroupBytes : 0u));
            gemm_tma_load_2d(sm.a(pipe.stage), &args.a, full, k0, (int32_t)p.m0);
            gemm_load_b(args, sm.b(pipe.stage), full, k0, p);
            if (kScaleSlots) {
                // Per-column scales [k block][n]: a stage is one 128-wide K block, and a
                // K-grouped member starts on a block (gemm.h).
                gemm_tma_load_2d(sm.base + sm.slot_offset(pipe.stage), &args.b_scale, full,
                                 (int32_t)p.n0, (int32_t)(p.k0 / GEMM_BLOCK_FP8 + kb));
            }
            if (group_start) {
                uint32_t buffer = sm.base + sm.group_offset(group & 1u);
                int32_t x = (int32_t)(kb / GEMM_SM90A_EMU_SCALE_GROUP * kRowBytes);
                gemm_tma_load_2d(buffer, &args.a_scale, full, x, (int32_t)p.m0);
                gemm_tma_load_3d(buffer + GEMM_SM90A_TILE_M * kRowBytes, &args.b_scale, full, x,
                                 (int32_t)p.n0, (int32_t)p.member);
                group++;
            }
            pipe.advance();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer main loops: the tile's accumulators acc[N / 2] of this warpgroup (rows 64 wg ...).
// Each also states the roles around it: the warps of the producer warpgroup that load block
// scales, the arrivals that release a stage, and the register budgets after setmaxnreg.

// The native formats': no scale loaders, one release per consumer warp (gemm_release).
struct gemm_roles_native {
    static constexpr bool kOuterA = false;  // both operands K-major unless a main loop says
    static constexpr bool kOuterB = false;
    static constexpr uint32_t kScaleLoaderWarps = 0;
    static constexpr bool kScaleGroups = false;
    static constexpr uint32_t kEmptyArrivals = GEMM_SM90A_CONSUMER_WARPS;
    static constexpr uint32_t kProducerRegs = GEMM_SM90A_PRODUCER_REGS;
    static constexpr uint32_t kConsumerRegs = GEMM_SM90A_CONSUMER_REGS;
};

// One stage's wgmma k steps over the 128 bytes of k at shared addresses a (this warpgroup's A
// rows) and b (the B tile), into d; the first step accumulates onto d unless `first` is 0.
// Outer-major operands (Mma::kOuterA, kOuterB) step 2048 bytes per k step instead of 32.
//
// The descriptors are built once per stage and stepped: the start address field (bits 0-13)
// holds address >> 4 of an address below 256 KiB (a CTA's shared memory is at most 228 KiB, and
// a k step stays inside its stage's tile), so the descriptor of address + d is the tile's
// descriptor with d >> 4 added to its low word, with no carry out of the field. Building each k
// step's descriptor from its address again (mask, shift, or) put about 100 instructions per
// stage between a block-scaled consumer's `full` barrier and its first wgmma, while the tensor
// cores waited for them.
template <bool kOuter>
__device__ __forceinline__ uint64_t gemm_tile_desc(uint32_t tile) {
    return kOuter ? gemm_smem_desc_outer(tile) : gemm_smem_desc(tile);
}

template <bool kOuter>
__device__ __forceinline__ uint64_t gemm_stage_desc(uint64_t tile_desc, uint32_t ks) {
    constexpr uint32_t kStepBytes = kOuter ? GEMM_SM90A_OUTER_K_STEP_BYTES : 32u;
    uint32_t low = (uint32_t)tile_desc + kStepBytes / 16u * ks;
    return (tile_desc & 0xFFFFFFFF00000000ull) | low;
}

// The same from the tiles' descriptors (gemm_tile_desc).
template <class Mma>
__device__ __forceinline__ void gemm_wgmma_stage_desc(float (&d)[Mma::kN / 2], uint64_t desc_a,
                                                      uint64_t desc_b, uint32_t first) {
#pragma unroll
    for (uint32_t ks = 0; ks < GEMM_SM90A_K_BYTES / 32u; ks++) {
        Mma::run(d, gemm_stage_desc<Mma::kOuterA>(desc_a, ks),
                 gemm_stage_desc<Mma::kOuterB>(desc_b, ks), ks > 0 ? 1u : first);
    }
}

template <class Mma>
__device__ __forceinline__ void gemm_wgmma_stage(float (&d)[Mma::kN / 2], uint32_t a, uint32_t b,
                                                 uint32_t first) {
    gemm_wgmma_stage_desc<Mma>(d, gemm_tile_desc<Mma::kOuterA>(a), gemm_tile_desc<Mma::kOuterB>(b),
                               first);
}

// The K-major tile descriptors of a consumer warpgroup's A rows and of B in the pipeline's
// current stage, once its `full` barrier has completed (and a K-grouped member's k tail is
// zeroed): what split accumulation's main loop prepares for the next K block while the current
// block's wgmma still run.
struct gemm_stage_descs {
    uint32_t a, b;  // the descriptors' low words; the high word is gemm_smem_desc's constant
    __device__ __forceinline__ uint64_t desc_a() const { return gemm_smem_desc_high() | a; }
    __device__ __forceinline__ uint64_t desc_b() const { return gemm_smem_desc_high() | b; }
};

template <class Shape, class Mma, class Pipe>
__device__ __forceinline__ gemm_stage_descs gemm_stage_ready(const gemm_smem<Shape> &sm,
                                                             const gemm_tile_pos &p, uint32_t wg,
                                                             const Pipe &pipe, uint32_t kb) {
    gemm_mbar_wait(sm.full(pipe.stage), pipe.phase);
    gemm_zero_k_tail<Shape, Mma>(sm, pipe.stage, p, kb);
    return {(uint32_t)gemm_smem_desc(sm.a(pipe.stage) + wg * 64u * GEMM_SM90A_K_BYTES),
            (uint32_t)gemm_smem_desc(sm.b(pipe.stage))};
}

// Fast accumulation (bf16, per-tensor fp8 without split): the wgmma of stage s are left running
// while the consumer waits for stage s + 1; a stage is released once the wgmma that read it have
// completed (wait_group 1 after committing the next stage's).
template <class Mma>
struct gemm_mainloop_fast : gemm_roles_native {
    static constexpr bool kOuterA = Mma::kOuterA;  // BF16: the producer loads them as boxes
    static constexpr bool kOuterB = Mma::kOuterB;
    static constexpr uint32_t kTileN = Mma::kN;
    static constexpr uint32_t kAcc = kTileN / 2;
    using Shape = gemm_shape_native<kTileN>;
    template <class Pipe>
    static __device__ __forceinline__ void run(const gemm_sm90a_args &args,
                                               const gemm_smem<Shape> &sm,
                                               const gemm_tile_pos &p, uint32_t wg, Pipe &pipe,
                                               float (&acc)[kAcc]) {
#pragma unroll
        for (uint32_t i = 0; i < kAcc; i++) acc[i] = 0.0f;
        uint32_t previous = 0;
        for (uint32_t kb = 0; kb < p.k_stages; kb++) {
            gemm_mbar_wait(sm.full(pipe.stage), pipe.phase);
            gemm_zero_k_tail<Shape, Mma>(sm, pipe.stage, p, kb);
            uint32_t a = sm.a(pipe.stage) + wg * 64u * GEMM_SM90A_K_BYTES;
            uint32_t b = sm.b(pipe.stage);
            gemm_fence_registers(acc);
            gemm_wgmma_fence();
            gemm_wgmma_stage<Mma>(acc, a, b, 1u);
            gemm_wgmma_commit();
            gemm_fence_registers(acc);
            if (kb > 0) {
                gemm_wgmma_wait<1>();
                gemm_release(sm, previous);
            }
            previous = pipe.stage;
            pipe.advance();
        }
        gemm_wgmma_wait<0>();
        gemm_fence_registers(acc);
        if (p.k_stages > 0) gemm_release(sm, previous);
    }
};

// FP8 block scales of A for this thread's two rows (r, r + 8) in one K block; rows past m get
// scale 0 (their outputs are never stored, and their scales may lie beyond the array).
struct gemm_row_scales {
    float a0, a1;
};

struct gemm_row_scale_source {
    const float *a;  // A's scales of K block 0 at the thread's row r: a[kb a_ld (+ 8)]
    bool a0, a1;     // which exist
};

// K block kb of a tile is K block p.k0 / 128 + kb of the operands (a K-grouped member starts on
// a block, gemm.h).
__device__ __forceinline__ gemm_row_scale_source gemm_row_scale_source_of(const gemm_args &g,
                                                                          const gemm_tile_pos &p,
                                                                          uint32_t row) {
    gemm_row_scale_source s;
    s.a = reinterpret_cast<const float *>(g.a.scale + p.member * g.a.scale_member_bytes) + row +
          (uint64_t)(p.k0 / GEMM_BLOCK_FP8) * g.a.scale_ld;
    s.a0 = row < g.m;
    s.a1 = row + 8 < g.m;
    return s;
}

__device__ __forceinline__ gemm_row_scales gemm_load_row_scales(const gemm_args &g,
                                                                const gemm_row_scale_source &s,
                                                                uint32_t kb) {
    const float *a = s.a + (uint64_t)kb * g.a.scale_ld;
    return {s.a0 ? __ldg(a) : 0.0f, s.a1 ? __ldg(a + 8) : 0.0f};
}

// The products RN(sa * sb) of this thread's two row scales and the 128 x 128 scales of B's two
// column blocks under the tile (n0 / 128 and the next; blocks past n get scale 0), for K block
// kb. Computed from the arguments and the tile position each K block, so the loop holds no
// pointers for them.
struct gemm_block_products {
    float a0b0, a0b1, a1b0, a1b1;
};

__device__ __forceinline__ gemm_block_products gemm_load_block_products(const gemm_args &g,
                                                                        const gemm_tile_pos &p,
                                                                        uint32_t row,
                                                                        uint32_t kb) {
    gemm_row_scales a = gemm_load_row_scales(g, gemm_row_scale_source_of(g, p, row), kb);
    uint32_t block = p.n0 / GEMM_BLOCK_FP8;
    const float *b =
        reinterpret_cast<const float *>(g.b.scale + p.member * g.b.scale_member_bytes) +
        (uint64_t)block * g.b.scale_ld + p.k0 / GEMM_BLOCK_FP8 + kb;
    float b0 = block * GEMM_BLOCK_FP8 < g.n ? __ldg(b) : 0.0f;
    float b1 = (block + 1) * GEMM_BLOCK_FP8 < g.n ? __ldg(b + g.b.scale_ld) : 0.0f;
    return {qt_gemm_scale_product(a.a0, b0), qt_gemm_scale_product(a.a0, b1),
            qt_gemm_scale_product(a.a1, b0), qt_gemm_scale_product(a.a1, b1)};
}

// The main loop of one whole-tile partial per K block, shared by split accumulation and FP8
// block scaling. Each stage is one 128-wide K block: four wgmma k steps sum it into `part` (the
// first with scale-d = 0), and Block adds the completed partial into acc (Block::load(kb,
// stage): what the addition of K block kb in `stage` needs, loaded right after its issue;
// Block::add(acc, part, loaded)).
//
// Both consumer warpgroups wait for their block's wgmma together and add together, so the
// tensor cores idle from the last wgmma's completion to the next block's first issue. The next
// stage's `full` barrier, its k tail and its descriptors (gemm_stage_ready) are therefore taken
// while this block's wgmma run, leaving only the additions, the release and the issue between
// two blocks: 7% more throughput at 4096^3 and 8192^3 for split accumulation.
template <class Shape, class Mma, class Pipe, class Block>
__device__ __forceinline__ void gemm_whole_partial_loop(const gemm_smem<Shape> &sm,
                                                        const gemm_tile_pos &p, uint32_t wg,
                                                        Pipe &pipe, float (&acc)[Mma::kN / 2],
                                                        const Block &block) {
    constexpr uint32_t kAcc = Mma::kN / 2;
    float part[kAcc];
#pragma unroll
    for (uint32_t i = 0; i < kAcc; i++) {
        acc[i] = 0.0f;
        part[i] = 0.0f;
    }
    if (p.k_stages == 0) return;  // an empty K-grouped member: D is its zeros
    gemm_stage_descs descs = gemm_stage_ready<Shape, Mma>(sm, p, wg, pipe, 0);
    for (uint32_t kb = 0; kb < p.k_stages; kb++) {
        gemm_fence_registers(part);
        gemm_wgmma_fence();
        gemm_wgmma_stage_desc<Mma>(part, descs.desc_a(), descs.desc_b(), 0u);
        gemm_wgmma_commit();
        auto loaded = block.load(kb, pipe.stage);
        // The next stage's barrier and descriptors while this block's wgmma run.
        uint32_t stage = pipe.stage;
        pipe.advance();
        if (kb + 1 < p.k_stages) descs = gemm_stage_ready<Shape, Mma>(sm, p, wg, pipe, kb + 1);
        gemm_wgmma_wait<0>();
        gemm_fence_registers(part);
        block.add(acc, part, loaded);
        gemm_release(sm, stage);
    }
}

// Split accumulation's addition: acc + partial in FP32 (qt_gemm_split_add), nothing loaded.
template <uint32_t kAcc>
struct gemm_split_add {
    struct nothing {};
    __device__ __forceinline__ nothing load(uint32_t, uint32_t) const { return {}; }
    __device__ __forceinline__ void add(float (&acc)[kAcc], const float (&part)[kAcc],
                                        nothing) const {
#pragma unroll
        for (uint32_t i = 0; i < kAcc; i++) acc[i] = qt_gemm_split_add(acc[i], part[i]);
    }
};

// Split accumulation (per-tensor fp8 with GEMM_FLAG_SPLIT_ACCUMULATE): gemm_whole_partial_loop
// with the FP32 addition of each K block's partial.
template <class Mma>
struct gemm_mainloop_split : gemm_roles_native {
    static constexpr uint32_t kTileN = Mma::kN;
    static constexpr uint32_t kAcc = kTileN / 2;
    using Shape = gemm_shape_native<kTileN>;
    template <class Pipe>
    static __device__ __forceinline__ void run(const gemm_sm90a_args &args,
                                               const gemm_smem<Shape> &sm,
                                               const gemm_tile_pos &p, uint32_t wg, Pipe &pipe,
                                               float (&acc)[kAcc]) {
        (void)args;
        gemm_whole_partial_loop<Shape, Mma>(sm, p, wg, pipe, acc, gemm_split_add<kAcc>{});
    }
};

// FP8 block scaling (kScaleB2D: B has 128 x 128 scales, else per-column scales in the stage's
// slot): gemm_whole_partial_loop, one 192-column partial per 128-wide K block, promoted into acc
// in FP32 with the block's scales (qt_gemm_promote), the next stage made ready while the block's
// wgmma run, as in split accumulation. What a promotion needs is loaded right after the issue
// (128 x 128: the four scale products from the arguments; per column: A's two row scales, and
// B's read from the stage's slot during the promotion), so neither scale pointers nor the next
// block's scales are held through it; carried, as the loop of two 96-column halves carried
// them, they did not fit beside a whole partial (128 bytes spilled). With 128 x 128 scales it
// measured 6-12% more throughput than the halves at 4096^3 and 8192^3.
//
// Measured and dropped: the two consumer warpgroups issuing in turns (named barriers, each
// promoting while the other's wgmma run) lost 1.5-4% in every arrangement; the tensor cores
// were not idle for the reason the turns address.
template <class Mma, bool kScaleB2D>
struct gemm_mainloop_block : gemm_roles_native {
    static constexpr uint32_t kTileN = Mma::kN;
    static constexpr uint32_t kAcc = kTileN / 2;
    static constexpr uint32_t kProducerRegs = GEMM_SM90A_BLOCK_PRODUCER_REGS;
    static constexpr uint32_t kConsumerRegs = GEMM_SM90A_BLOCK_CONSUMER_REGS;
    using Shape = gemm_shape_native<kTileN>;
    template <class Pipe>
    static __device__ __forceinline__ void run(const gemm_sm90a_args &args,
                                               const gemm_smem<Shape> &sm,
                                               const gemm_tile_pos &p, uint32_t wg, Pipe &pipe,
                                               float (&acc)[kAcc]) {
        static_assert(kTileN % 64 == 0, "tiles start at 0 or 64 within a 128-column block");
        uint32_t lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
        uint32_t row = p.m0 + wg * 64u + warp * 16u + (lane >> 2);
        if constexpr (kScaleB2D) {
            // The tile's columns from 128 - n0 % 128 on take the second column block's scale;
            // the two cases are compiled apart, so the choice costs no registers.
            if (p.n0 % GEMM_BLOCK_FP8 != 0) {
                gemm_whole_partial_loop<Shape, Mma>(sm, p, wg, pipe, acc,
                                                    promote_whole<64>{args.gemm, p, row});
            } else {
                gemm_whole_partial_loop<Shape, Mma>(sm, p, wg, pipe, acc,
                                                    promote_whole<128>{args.gemm, p, row});
            }
        } else {
            gemm_whole_partial_loop<Shape, Mma>(sm, p, wg, pipe, acc,
                                                promote_columns{args.gemm, p, sm, row});
        }
    }

    // The promotion with 128 x 128 scales of B (gemm_whole_partial_loop's Block). kSecondBlock:
    // the tile column where B's second 128 x 128 scale starts.
    template <uint32_t kSecondBlock>
    struct promote_whole {
        const gemm_args &g;
        const gemm_tile_pos &p;
        uint32_t row;
        __device__ __forceinline__ gemm_block_products load(uint32_t kb, uint32_t) const {
            return gemm_load_block_products(g, p, row, kb);
        }
        __device__ __forceinline__ void add(float (&acc)[kAcc], const float (&part)[kAcc],
                                            const gemm_block_products &s) const {
#pragma unroll
            for (uint32_t i = 0; i < kAcc; i++) {
                bool second = 8u * (i / 4) >= kSecondBlock;
                float sab = (i & 2) ? (second ? s.a1b1 : s.a1b0) : (second ? s.a0b1 : s.a0b0);
                acc[i] = qt_gemm_promote_by(acc[i], part[i], sab);
            }
        }
    };

    // The promotion with per-column scales of B from the stage's slot.
    struct promote_columns {
        struct loaded {
            gemm_row_scales a;
            const float *slot;  // this thread's first column scale in the stage's slot
        };
        const gemm_args &g;
        const gemm_tile_pos &p;
        const gemm_smem<Shape> &sm;
        uint32_t row;
        __device__ __forceinline__ loaded load(uint32_t kb, uint32_t stage) const {
            return {gemm_load_row_scales(g, gemm_row_scale_source_of(g, p, row), kb),
                    reinterpret_cast<const float *>(sm.bytes + sm.slot_offset(stage)) +
                        2u * (threadIdx.x & 3)};
        }
        __device__ __forceinline__ void add(float (&acc)[kAcc], const float (&part)[kAcc],
                                            const loaded &s) const {
#pragma unroll
            for (uint32_t i = 0; i < kAcc; i++) {
                float sa = (i & 2) ? s.a.a1 : s.a.a0;
                acc[i] = qt_gemm_promote(acc[i], part[i], sa, s.slot[8u * (i / 4) + (i & 1)]);
            }
        }
    };
};

// ---------------------------------------------------------------------------------------------
// Emulated formats (MXFP8, NVFP4; both operands K-major). Each stage's codes arrive by TMA as
// they are stored; the consumers decode them with ptx/gemm_decode.h (the portable tier's decode,
// bit for bit) into a BF16 stage, A tile and B tile in the 128-byte swizzle, and multiply it as
// the BF16 kernel multiplies its stages. Thread t of consumer warpgroup w decodes B row
// 128 w + t (64 k) and A row t, k 32 w ... 32 w + 31. Two decoded stages alternate.
//
// Stage order, per consumer warpgroup: wait for the codes, decode (while the previous stage's
// wgmma run), release the codes, wait for the previous stage's wgmma, then one named barrier of
// both consumer warpgroups: after it the decoded stage is whole, and no wgmma still reads the
// other one, which the next stage decodes into.

// Scale loading (warps 1-3 of the producer warpgroup): per stage, after its `empty` barrier,
// each thread loads the stage's block scales of some of the tile's 384 rows (A rows, then B
// rows) from global memory, one byte per block, and writes them as one word per row into the
// stage's slot; each thread then arrives on the stage's `full` barrier (its own release orders
// its slot writes before the consumers' reads, with no warp-level step in between). The global
// loads' latency stays with these warps, whose only work it is. Rows past an operand and blocks
// past the contraction get the scale of 1 (their codes are TMA's zeros).
template <uint32_t kFormat>
__device__ __forceinline__ uint32_t gemm_emu_scale_word(const gemm_args &g,
                                                        const gemm_operand &op, uint32_t member,
                                                        uint32_t r, uint32_t rows,
                                                        uint32_t first_block) {
    constexpr bool kNvfp4 = kFormat == GEMM_FORMAT_NVFP4;
    constexpr uint32_t kBlock = kNvfp4 ? GEMM_BLOCK_NVFP4 : GEMM_BLOCK_MXFP8;
    constexpr uint32_t kBlocks = GEMM_SM90A_EMU_K / kBlock;
    constexpr uint32_t kOne = kNvfp4 ? 0x38u : 127u;  // e4m3, e8m0 1.0
    uint32_t blocks = r < rows ? (g.k + kBlock - 1) / kBlock : 0u;
    const uint8_t *row =
        reinterpret_cast<const uint8_t *>(op.scale + member * op.scale_member_bytes) +
        (uint64_t)r * op.scale_ld;
    uint32_t word = 0;
#pragma unroll
    for (uint32_t i = 0; i < kBlocks; i++) {
        uint32_t block = first_block + i;
        word |= (block < blocks ? (uint32_t)__ldg(row + block) : kOne) << (8 * i);
    }
    return word;
}

template <uint32_t kFormat, class Shape>
__device__ __forceinline__ void gemm_emu_load_scales(const gemm_sm90a_args &args,
                                                     const gemm_smem<Shape> &sm, gemm_sched s) {
    constexpr uint32_t kRows = GEMM_SM90A_TILE_M + GEMM_SM90A_EMU_TILE_N;
    constexpr uint32_t kThreads = 96;
    static_assert(kRows % kThreads == 0, "the rows spread evenly over the loading threads");
    constexpr uint32_t kBlocks =
        GEMM_SM90A_EMU_K / (kFormat == GEMM_FORMAT_NVFP4 ? GEMM_BLOCK_NVFP4 : GEMM_BLOCK_MXFP8);
    const gemm_args &g = args.gemm;
    uint32_t t0 = threadIdx.x - 32u;
    gemm_pipe<Shape::kStages> pipe = {0, 0};
    for (uint32_t t = blockIdx.x; t < s.total; t += gridDim.x) {
        gemm_tile_pos p = gemm_sched_tile<Shape::kN, Shape::kRowBytes>(args, s, t);
        for (uint32_t kb = 0; kb < p.k_stages; kb++) {
            gemm_mbar_wait(sm.empty(pipe.stage), pipe.phase ^ 1u);
            uint32_t *slot = reinterpret_cast<uint32_t *>(sm.bytes + sm.slot_offset(pipe.stage));
            uint32_t words[kRows / kThreads];
#pragma unroll
            for (uint32_t i = 0; i < kRows / kThreads; i++) {
                uint32_t r = t0 + i * kThreads;
                words[i] = r < GEMM_SM90A_TILE_M
                               ? gemm_emu_scale_word<kFormat>(g, g.a, p.member, p.m0 + r, g.m,
                                                              kb * kBlocks)
                               : gemm_emu_scale_word<kFormat>(g, g.b, p.member,
                                                              p.n0 + r - GEMM_SM90A_TILE_M, g.n,
                                                              kb * kBlocks);
            }
#pragma unroll
            for (uint32_t i = 0; i < kRows / kThreads; i++) slot[t0 + i * kThreads] = words[i];
            gemm_mbar_arrive(sm.full(pipe.stage));
            pipe.advance();
        }
    }
}

// 16 elements of one block, decoded: MXFP8 codes (a uint4), NVFP4 nibbles (two words). Written
// as BF16 chunks c and c + 1 of row r of a decoded tile.
__device__ __forceinline__ void gemm_emu_store(uint32_t tile, uint32_t r, uint32_t c,
                                               const uint32_t (&w)[8]) {
    gemm_sts128(tile + gemm_swizzled<GEMM_SM90A_K_BYTES>(r, c), w[0], w[1], w[2], w[3]);
    gemm_sts128(tile + gemm_swizzled<GEMM_SM90A_K_BYTES>(r, c + 1), w[4], w[5], w[6], w[7]);
}

// kExact: the scale is at least GEMM_MXFP8_EXACT_SCALE_MIN (255 too: every product is NaN).
template <bool kExact>
__device__ __forceinline__ void gemm_emu_piece_mxfp8(const uint4 &codes, uint32_t e8m0,
                                                     uint32_t tile, uint32_t r, uint32_t c) {
    uint32_t w[8];
    gemm_decode_mxfp8_row<16, false, kExact>(codes, qt_e8m0_to_f32((uint8_t)e8m0), w);
    gemm_emu_store(tile, r, c, w);
}

__device__ __forceinline__ void gemm_emu_piece_nvfp4(uint32_t x, uint32_t y, uint32_t e4m3,
                                                     uint32_t tile, uint32_t r, uint32_t c) {
    uint32_t scale2 = gemm_nvfp4_scale_pair((uint8_t)e4m3);
    uint32_t lo[4], hi[4];
    gemm_decode_nvfp4x8(x, scale2, lo);
    gemm_decode_nvfp4x8(y, scale2, hi);
    uint32_t w[8] = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
    gemm_emu_store(tile, r, c, w);
}

// MXFP8 operands are E4M3 here (gemm_tier.c sends E5M2 ones, only ever dgrad and wgrad
// gradients, whose other operand is outer-major, to the portable tier).
template <uint32_t kFormat>
struct gemm_mainloop_emulated {
    static constexpr uint32_t kTileN = GEMM_SM90A_EMU_TILE_N;
    static constexpr uint32_t kAcc = kTileN / 2;
    static constexpr bool kNvfp4 = kFormat == GEMM_FORMAT_NVFP4;
    using Shape = gemm_shape_emulated<kFormat>;
    static constexpr uint32_t kRowBytes = Shape::kRowBytes;
    // Scale blocks per stage (64 k) and per 16-element piece.
    static constexpr uint32_t kBlocks = kNvfp4 ? 4u : 2u;
    static constexpr uint32_t kPiecesPerBlock = kNvfp4 ? 1u : 2u;
    static constexpr uint32_t kDecodedA = GEMM_SM90A_TILE_M * GEMM_SM90A_K_BYTES;
    static_assert(GEMM_SM90A_EMU_K == 64 && kTileN == 256 && GEMM_SM90A_TILE_M == 128,
                  "a thread decodes one B row and half an A row per stage");
    static_assert(2u * (kDecodedA + kTileN * GEMM_SM90A_K_BYTES) == Shape::kDecodedBytes,
                  "two decoded stages");

    static constexpr bool kOuterA = false;
    static constexpr bool kOuterB = false;
    static constexpr uint32_t kScaleLoaderWarps = 3;
    // The scales come in groups by TMA when the launch allows (args.scale_tma).
    static constexpr bool kScaleGroups = true;
    // Every consumer thread reads the stage (codes and scale slot) with its own loads and
    // releases it with its own arrival, which orders exactly its reads before the next writes.
    static constexpr uint32_t kEmptyArrivals = 32 * GEMM_SM90A_CONSUMER_WARPS;
    static constexpr uint32_t kProducerRegs = GEMM_SM90A_EMU_PRODUCER_REGS;
    static constexpr uint32_t kConsumerRegs = GEMM_SM90A_EMU_CONSUMER_REGS;
    static_assert(GEMM_SM90A_EMU_SCALE_SLOT_BYTES == (GEMM_SM90A_TILE_M + kTileN) * 4u &&
                      (GEMM_SM90A_TILE_M + kTileN) % 96u == 0,
                  "one scale word per tile row, spread evenly over the 96 loading threads");

    // The block scales of one stage for this thread: A's row's blocks of its half (pieces
    // 2 w, 2 w + 1), B's row's blocks.
    struct scales {
        uint32_t a[2];
        uint32_t b[kBlocks];
    };

    // From the stage's slot, or with `group` (a group buffer) from its rows, at the stage's
    // kBlocks bytes (position kb % 8 of the group).
    static __device__ __forceinline__ scales read_scales(const gemm_smem<Shape> &sm,
                                                         uint32_t stage, uint32_t a_row,
                                                         uint32_t b_row, uint32_t wg,
                                                         const uint8_t *group, uint32_t kb) {
        uint32_t a, b;
        if (group != nullptr) {
            constexpr uint32_t kRow = Shape::kScaleRowBytes;
            const uint8_t *at = group + kBlocks * (kb % GEMM_SM90A_EMU_SCALE_GROUP);
            if constexpr (kNvfp4) {
                a = *reinterpret_cast<const uint32_t *>(at + a_row * kRow);
                b = *reinterpret_cast<const uint32_t *>(at + (GEMM_SM90A_TILE_M + b_row) * kRow);
            } else {
                a = *reinterpret_cast<const uint16_t *>(at + a_row * kRow);
                b = *reinterpret_cast<const uint16_t *>(at + (GEMM_SM90A_TILE_M + b_row) * kRow);
            }
        } else {
            const uint32_t *slot =
                reinterpret_cast<const uint32_t *>(sm.bytes + sm.slot_offset(stage));
            a = slot[a_row];
            b = slot[GEMM_SM90A_TILE_M + b_row];
        }
        scales s;
#pragma unroll
        for (uint32_t p = 0; p < 2; p++) {
            s.a[p] = (a >> (8u * ((2u * wg + p) / kPiecesPerBlock))) & 0xFFu;
        }
#pragma unroll
        for (uint32_t i = 0; i < kBlocks; i++) s.b[i] = (b >> (8u * i)) & 0xFFu;
        return s;
    }

    // Piece p (k 16 p ... 16 p + 15) of row r of a raw tile, decoded into chunks 2 p, 2 p + 1
    // of row r of the decoded tile `out`.
    template <bool kExact>
    static __device__ __forceinline__ void decode_piece(uint32_t raw, uint32_t r, uint32_t p,
                                                        uint32_t scale, uint32_t out) {
        if constexpr (kNvfp4) {
            uint4 v = gemm_lds128(raw + gemm_swizzled<kRowBytes>(r, p / 2u));
            uint32_t x = (p & 1u) ? v.z : v.x, y = (p & 1u) ? v.w : v.y;
            gemm_emu_piece_nvfp4(x, y, scale, out, r, 2u * p);
        } else {
            gemm_emu_piece_mxfp8<kExact>(gemm_lds128(raw + gemm_swizzled<kRowBytes>(r, p)), scale,
                                         out, r, 2u * p);
        }
    }

    // This thread's pieces of a stage: B row b_row, A row `a_row`'s half wg. One choice of the
    // MXFP8 decode path for all of them keeps the pieces one straight run of code, which the
    // compiler interleaves.
    template <bool kExact>
    static __device__ __forceinline__ void decode_stage(uint32_t raw_a, uint32_t raw_b,
                                                        uint32_t a_row, uint32_t b_row,
                                                        uint32_t wg, const scales &s,
                                                        uint32_t dec_a, uint32_t dec_b) {
#pragma unroll
        for (uint32_t piece = 0; piece < 4; piece++) {
            decode_piece<kExact>(raw_b, b_row, piece, s.b[piece / kPiecesPerBlock], dec_b);
        }
#pragma unroll
        for (uint32_t i = 0; i < 2; i++) {
            decode_piece<kExact>(raw_a, a_row, 2u * wg + i, s.a[i], dec_a);
        }
    }

    static __device__ __forceinline__ void load_scales(const gemm_sm90a_args &args,
                                                       const gemm_smem<Shape> &sm,
                                                       gemm_sched s) {
        gemm_emu_load_scales<kFormat>(args, sm, s);
    }

    // Whether every MXFP8 scale of the stage takes the exact path (NVFP4 has one path).
    static __device__ __forceinline__ bool exact(const scales &s) {
        uint32_t low = 0;
#pragma unroll
        for (uint32_t i = 0; i < 2; i++) low |= s.a[i] < GEMM_MXFP8_EXACT_SCALE_MIN;
#pragma unroll
        for (uint32_t i = 0; i < kBlocks; i++) low |= s.b[i] < GEMM_MXFP8_EXACT_SCALE_MIN;
        return kNvfp4 || low == 0;
    }

    template <class Pipe>
    static __device__ __forceinline__ void run(const gemm_sm90a_args &args,
                                               const gemm_smem<Shape> &sm,
                                               const gemm_tile_pos &p, uint32_t wg, Pipe &pipe,
                                               float (&acc)[kAcc]) {
        uint32_t tid = threadIdx.x & 127u;
        uint32_t b_row = wg * 128u + tid;
#pragma unroll
        for (uint32_t i = 0; i < kAcc; i++) acc[i] = 0.0f;
        for (uint32_t kb = 0; kb < p.k_stages; kb++) {
            uint32_t dec_a = sm.decoded(pipe.decoded);
            uint32_t dec_b = dec_a + kDecodedA;
            gemm_mbar_wait(sm.full(pipe.stage), pipe.phase);
            uint32_t raw_a = sm.a(pipe.stage), raw_b = sm.b(pipe.stage);
            const uint8_t *group = nullptr;
            if (kScaleGroups && args.scale_tma != 0) {
                if (kb % GEMM_SM90A_EMU_SCALE_GROUP == 0) pipe.groups++;
                group = sm.bytes + sm.group_offset((pipe.groups - 1u) & 1u);
            }
            scales s = read_scales(sm, pipe.stage, tid, b_row, wg, group, kb);
            if (exact(s)) {
                decode_stage<true>(raw_a, raw_b, tid, b_row, wg, s, dec_a, dec_b);
            } else {
                decode_stage<false>(raw_a, raw_b, tid, b_row, wg, s, dec_a, dec_b);
            }
            gemm_mbar_arrive(sm.empty(pipe.stage));
            gemm_fence_proxy_async();
            gemm_wgmma_wait<0>();
            gemm_fence_registers(acc);
            gemm_consumer_barrier();
            uint32_t a = dec_a + wg * 64u * GEMM_SM90A_K_BYTES;
            gemm_wgmma_fence();
            gemm_wgmma_stage<gemm_wgmma_bf16_n256>(acc, a, dec_b, 1u);
            gemm_wgmma_commit();
            gemm_fence_registers(acc);
            pipe.advance();
        }
        gemm_wgmma_wait<0>();
        gemm_fence_registers(acc);
    }
};

// ---------------------------------------------------------------------------------------------
// Epilogue: each thread writes its own accumulator elements, as qt_gemm_epilogue computes them.

__device__ __forceinline__ float gemm_load_value(const uint8_t *base, uint64_t index,
                                                 uint32_t dtype) {
    if (dtype == QT_DTYPE_BF16) {
        return qt_bf16_to_f32(reinterpret_cast<const uint16_t *>(base)[index]);
    }
    return reinterpret_cast<const float *>(base)[index];
}

// Two adjacent outputs (the second only when `pair`), as one store when aligned.
__device__ __forceinline__ void gemm_store_pair(uint8_t *d, uint64_t index, uint32_t dtype,
                                                float v0, float v1, bool pair) {
    if (dtype == QT_DTYPE_BF16) {
        uint16_t *out = reinterpret_cast<uint16_t *>(d) + index;
        uint16_t b0 = qt_f32_to_bf16(v0), b1 = qt_f32_to_bf16(v1);
        if (pair && ((uintptr_t)out & 3) == 0) {
            *reinterpret_cast<uint32_t *>(out) = (uint32_t)b0 | ((uint32_t)b1 << 16);
        } else {
            out[0] = b0;
            if (pair) out[1] = b1;
        }
        return;
    }
    float *out = reinterpret_cast<float *>(d) + index;
    if (pair && ((uintptr_t)out & 7) == 0) {
        *reinterpret_cast<float2 *>(out) = make_float2(v0, v1);
    } else {
        out[0] = v0;
        if (pair) out[1] = v1;
    }
}

template <uint32_t kAcc>
__device__ __forceinline__ void gemm_epilogue(const gemm_args &g, const gemm_tile_pos &p,
                                              uint32_t wg, const float (&acc)[kAcc],
                                              float &d_max) {
    uint32_t lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    uint32_t row0 = p.m0 + wg * 64u + warp * 16u + (lane >> 2);
    uint32_t col0 = p.n0 + 2u * (lane & 3);
    int has_c = g.c != 0 && g.beta != 0.0f;
    int has_bias = g.bias != 0;
    uint8_t *d = reinterpret_cast<uint8_t *>(g.d) + p.member * g.d_member_bytes;
    const uint8_t *c = reinterpret_cast<const uint8_t *>(g.c) + p.member * g.d_member_bytes;
    const uint8_t *bias =
        reinterpret_cast<const uint8_t *>(g.bias) + p.member * g.bias_member_bytes;
    float alpha = qt_gemm_alpha(&g, p.member);
#pragma unroll
    for (uint32_t h = 0; h < 2; h++) {
        uint32_t row = row0 + 8u * h;
        if (row >= p.m_end) continue;
        bool padding = row >= p.m_valid_end;
#pragma unroll
        for (uint32_t j = 0; j < kAcc / 4; j++) {
            uint32_t col = col0 + 8u * j;
            if (col >= g.n) break;
            bool pair = col + 1 < g.n;
            uint64_t index = (uint64_t)row * g.ldd + col;
            float v[2] = {0.0f, 0.0f};
#pragma unroll
            for (uint32_t e = 0; e < 2; e++) {
                if (padding || (e == 1 && !pair)) continue;
                float cv = has_c ? gemm_load_value(c, index + e, g.d_dtype) : 0.0f;
                float bv = has_bias ? gemm_load_value(bias, col + e, g.bias_dtype) : 0.0f;
                v[e] = qt_gemm_epilogue(acc[4 * j + 2 * h + e], alpha, has_c, g.beta, cv,
                                        has_bias, bv);
                d_max = qt_gemm_d_max_fold(d_max, v[e]);
            }
            gemm_store_pair(d, index, g.d_dtype, v[0], v[1], pair);
        }
    }
}

// The staged epilogue (gemm_sm90a.h): the same values as gemm_epilogue, written chunk by chunk
// into this warpgroup's epilogue buffers and stored by TMA. Per chunk: the warpgroup's leader
// waits until the buffer's previous store has read it; a barrier; every thread writes its values
// (the wgmma fragment: rows 16 warp + lane / 4 and + 8, column pairs 8 j + 2 (lane % 4)) in the
// 128-byte swizzle, whose chunk XOR is lane / 4 for all of a thread's rows; a proxy fence and a
// barrier; the leader issues the store. Padding rows hold zeros; columns past n and rows past
// the tensor are clipped by the store. Where the 64-row box would reach past the tile's rows into
// another member's (an M-grouped member's last tile), the threads copy the chunk's rows inside
// the tile to D themselves instead, 16 bytes at a time (D's rows are a whole number of 16-byte
// pieces, gemm_tier.c), and the barrier of the next chunk orders their reads before its writes.

#define GEMM_SM90A_EPI_BARRIER 2  // named barriers 2 and 3: consumer warpgroup 0's and 1's

__device__ __forceinline__ void gemm_epi_barrier(uint32_t wg) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(GEMM_SM90A_EPI_BARRIER + wg) : "memory");
}

// Two values of D as bf16x2 (lo in the low half), rounded as qt_f32_to_bf16 rounds them: the
// conversion (gemm_pack_bf16) gives its bits for every input, NaN included (0x7FFF).
__device__ __forceinline__ uint32_t gemm_pack_bf16_d(float lo, float hi) {
    return gemm_pack_bf16(lo, hi);
}

// The rows of chunk `buffer` (columns col0 ...) that lie inside the tile, rows r0 ... m_end - 1,
// copied to the member's D by the warpgroup's threads.
template <uint32_t kOutBytes>
__device__ __forceinline__ void gemm_epilogue_copy(const gemm_args &g, uint32_t buffer,
                                                   uint32_t member, uint32_t r0, uint32_t m_end,
                                                   uint32_t col0) {
    constexpr uint32_t kPieces = GEMM_SM90A_EPI_ROWS * 8u;  // 16-byte pieces of a chunk
    uint32_t tid = threadIdx.x & 127u;
    uint8_t *d = reinterpret_cast<uint8_t *>(g.d) + member * g.d_member_bytes;
#pragma unroll
    for (uint32_t i = 0; i < kPieces / 128u; i++) {
        uint32_t piece = tid + 128u * i, row = piece / 8u, c16 = piece % 8u;
        uint32_t col = col0 + c16 * (16u / kOutBytes);
        if (r0 + row >= m_end || col >= g.n) continue;
        uint4 v = gemm_lds128(buffer + row * 128u + 16u * (c16 ^ (row % 8u)));
        *reinterpret_cast<uint4 *>(d + ((uint64_t)(r0 + row) * g.ldd + col) * kOutBytes) = v;
    }
}

// Whether consumer warpgroup wg stores tile p's rows by TMA: the 64-row box ends inside the
// tile's rows, or its rows reach the tensor's end (where the store clips); else it copies them.
__device__ __forceinline__ bool gemm_epilogue_box_fits(const gemm_args &g, const gemm_tile_pos &p,
                                                       uint32_t wg) {
    uint32_t r0 = p.m0 + wg * GEMM_SM90A_EPI_ROWS;
    return r0 + GEMM_SM90A_EPI_ROWS <= p.m_end || p.m_end == g.m;
}

template <uint32_t kOutBytes, bool kBias, class Smem, uint32_t kAcc>
__device__ __forceinline__ void gemm_epilogue_staged(const gemm_sm90a_args &args, const Smem &sm,
                                                     const gemm_tile_pos &p, uint32_t wg,
                                                     const float (&acc)[kAcc], uint32_t &chunks,
                                                     float &d_max) {
    constexpr uint32_t kCols = 128u / kOutBytes;  // columns per chunk
    constexpr uint32_t kGroups = kCols / 8u;      // accumulator column groups per chunk
    constexpr uint32_t kTileN = kAcc * 2u;
    static_assert(kTileN % kCols == 0, "whole chunks per tile");
    const gemm_args &g = args.gemm;
    uint32_t tid = threadIdx.x & 127u, lane = tid & 31u, quad = lane & 3u, swizzle = lane >> 2;
    uint32_t r0 = p.m0 + wg * GEMM_SM90A_EPI_ROWS;
    if (r0 >= p.m_end) return;  // the warpgroup's rows all lie past the member (or m)
    uint32_t row = (tid >> 5) * 16u + (lane >> 2);  // and row + 8
    bool zero[2] = {r0 + row >= p.m_valid_end, r0 + row + 8u >= p.m_valid_end};
    bool tma = gemm_epilogue_box_fits(g, p, wg);
    float alpha = qt_gemm_alpha(&g, p.member);
    const uint8_t *bias =
        reinterpret_cast<const uint8_t *>(g.bias) + p.member * g.bias_member_bytes;
#pragma unroll
    for (uint32_t c = 0; c < kTileN / kCols; c++) {
        uint32_t col0 = p.n0 + c * kCols;
        if (col0 >= g.n) break;
        uint32_t buffer = sm.epilogue(wg, chunks % Smem::kEpilogueBuffers);
        if (tid == 0) gemm_bulk_wait_read<Smem::kEpilogueBuffers - 1>();
        gemm_epi_barrier(wg);
#pragma unroll
        for (uint32_t jl = 0; jl < kGroups; jl++) {
            uint32_t j = c * kGroups + jl;
            uint32_t col = col0 + 8u * jl + 2u * quad;
            float bv[2] = {0.0f, 0.0f};
            if (kBias) {
#pragma unroll
                for (uint32_t e = 0; e < 2; e++) {
                    if (col + e < g.n) bv[e] = gemm_load_value(bias, col + e, g.bias_dtype);
                }
            }
#pragma unroll
            for (uint32_t h = 0; h < 2; h++) {
                float v[2];
#pragma unroll
                for (uint32_t e = 0; e < 2; e++) {
                    v[e] = zero[h] ? 0.0f
                                   : qt_gemm_epilogue(acc[4 * j + 2 * h + e], alpha, 0, 0.0f,
                                                      0.0f, kBias, bv[e]);
                    d_max = qt_gemm_d_max_fold(d_max, v[e]);
                }
                uint32_t line = buffer + (row + 8u * h) * 128u;
                if (kOutBytes == 2) {
                    uint32_t at = line + 16u * (jl ^ swizzle) + 4u * quad;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at),
                                 "r"(gemm_pack_bf16_d(v[0], v[1]))
                                 : "memory");
                } else {
                    uint32_t chunk = (2u * jl + (quad >> 1)) ^ swizzle;
                    uint32_t at = line + 16u * chunk + 8u * (quad & 1u);
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(v[0]),
                                 "f"(v[1])
                                 : "memory");
                }
            }
        }
        gemm_fence_proxy_async();
        gemm_epi_barrier(wg);
        if (!tma) {
            gemm_epilogue_copy<kOutBytes>(g, buffer, p.member, r0, p.m_end, col0);
        } else if (tid == 0) {
            if (g.d_member_bytes != 0) {
                gemm_tma_store_3d(&args.d, buffer, (int32_t)col0, (int32_t)r0,
                                  (int32_t)p.member);
            } else {
                gemm_tma_store_2d(&args.d, buffer, (int32_t)col0, (int32_t)r0);
            }
            gemm_bulk_commit();
        }
        chunks++;
    }
}

// D's gradient-norm units (gemm.h) from the values the epilogue stores: a warp's fragment
// rows are one unit's 16 rows, and each 64 columns of them (8 column groups j) one unit, in the
// lanes and the order that gemm.h states. The tile's columns are whole units (192 or 256 from a
// multiple of them), so no unit spans two tiles. A K-grouped tile's units are its member's
// (qt_gemm_norm_units_of); an empty member's tiles store zeros, and so their units.
template <uint32_t kAcc>
__device__ __forceinline__ void gemm_norm_units(const gemm_args &g, const gemm_tile_pos &p,
                                                uint32_t wg, const float (&acc)[kAcc]) {
    constexpr uint32_t kGroups = GEMM_NORM_UNIT_COLS / 8u;
    static_assert(kAcc % (4u * kGroups) == 0, "whole units per tile");
    uint32_t lane = threadIdx.x & 31u, warp = (threadIdx.x >> 5) & 3u;
    uint32_t slab_row = p.m0 + wg * 64u + warp * GEMM_NORM_UNIT_ROWS;
    if (slab_row >= p.m_end) return;  // the whole warp: no unit of D here
    uint32_t row = slab_row + (lane >> 2);
    bool valid[2] = {row < p.m_end, row + 8u < p.m_end};
    uint32_t unit_cols = (g.n + GEMM_NORM_UNIT_COLS - 1) / GEMM_NORM_UNIT_COLS;
    uint64_t units = qt_gemm_norm_units_of(&g);
    float *sums = reinterpret_cast<float *>(g.norm_units);
    uint32_t *flags = reinterpret_cast<uint32_t *>(sums + units);
    if (g.grouping == GEMM_GROUP_K) {  // the member's units
        uint64_t first = (uint64_t)p.member * qt_gemm_norm_unit_count(g.m, g.n);
        sums += first;
        flags += first;
    }
    uint64_t slab = slab_row / GEMM_NORM_UNIT_ROWS;
    float alpha = qt_gemm_alpha(&g, p.member);
#pragma unroll
    for (uint32_t u = 0; u < kAcc / (4u * kGroups); u++) {
        uint32_t unit_col = p.n0 / GEMM_NORM_UNIT_COLS + u;
        if (unit_col >= unit_cols) break;
        float sum = 0.0f;
        uint32_t bad = 0;
#pragma unroll
        for (uint32_t jl = 0; jl < kGroups; jl++) {
            uint32_t j = u * kGroups + jl;
            uint32_t col = p.n0 + 8u * j + 2u * (lane & 3u);
#pragma unroll
            for (uint32_t h = 0; h < 2; h++) {
#pragma unroll
                for (uint32_t e = 0; e < 2; e++) {
                    if (!valid[h] || col + e >= g.n) continue;
                    float v = qt_gemm_epilogue(acc[4 * j + 2 * h + e], alpha, 0, 0.0f, 0.0f, 0,
                                               0.0f);
                    sum = qt_fmaf(v, v, sum);
                    bad |= qt_f32_nonfinite(v);
                }
            }
        }
#pragma unroll
        for (uint32_t w = 16; w > 0; w >>= 1) sum = sum + __shfl_down_sync(0xFFFFFFFFu, sum, w);
        bad = __any_sync(0xFFFFFFFFu, bad != 0);
        if (lane == 0) {
            sums[slab * unit_cols + unit_col] = sum;
            flags[slab * unit_cols + unit_col] = bad ? 1u : 0u;
        }
    }
}

// Tile p's D rows of consumer warpgroup wg: staged where D has its map, else from registers;
// then D's norm units where the GEMM has them. d_max: the thread's running maximum of the values
// it stored (gemm_args.d_max), over all its tiles.
template <class Smem, uint32_t kAcc>
__device__ __forceinline__ void gemm_epilogue_tile(const gemm_sm90a_args &args, const Smem &sm,
                                                   const gemm_tile_pos &p, uint32_t wg,
                                                   const float (&acc)[kAcc], uint32_t &chunks,
                                                   float &d_max) {
    if (args.gemm.norm_units != 0) gemm_norm_units(args.gemm, p, wg, acc);
    if (args.d_tma == 0) {
        gemm_epilogue(args.gemm, p, wg, acc, d_max);
        return;
    }
    bool bias = args.gemm.bias != 0;
    if (args.gemm.d_dtype == QT_DTYPE_BF16) {
        if (bias) {
            gemm_epilogue_staged<2, true>(args, sm, p, wg, acc, chunks, d_max);
        } else {
            gemm_epilogue_staged<2, false>(args, sm, p, wg, acc, chunks, d_max);
        }
    } else if (bias) {
        gemm_epilogue_staged<4, true>(args, sm, p, wg, acc, chunks, d_max);
    } else {
        gemm_epilogue_staged<4, false>(args, sm, p, wg, acc, chunks, d_max);
    }
}

// ---------------------------------------------------------------------------------------------
// The kernel body: barriers, roles, the persistent tile loop.

template <uint32_t kStageK, bool kScaleSlots, class Mainloop>
__device__ __forceinline__ void gemm_sm90a_run(const gemm_sm90a_args &args) {
    using Shape = typename Mainloop::Shape;
    using smem = gemm_smem<Shape>;
    smem sm = gemm_smem_carve<Shape>();
    if (threadIdx.x == 0) {
        // The producer's expect-bytes arrival, and the scale loaders' (one per thread) unless
        // the scales come in groups by TMA.
        uint32_t loaders = Mainloop::kScaleGroups && args.scale_tma != 0
                               ? 0u
                               : 32 * Mainloop::kScaleLoaderWarps;
        for (uint32_t s = 0; s < smem::kStages; s++) {
            gemm_mbar_init(sm.full(s), 1 + loaders);
            gemm_mbar_init(sm.empty(s), Mainloop::kEmptyArrivals);
        }
        // Make the initialized barriers visible to the other threads and to the TMA unit (the
        // async proxy), which completes them. (A CTA launched alone is a cluster of one.)
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    gemm_sched sched = gemm_sched_init(args);
    uint32_t warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        gemm_regs_producer<Mainloop::kProducerRegs>();
        if (threadIdx.x == 0) {
            gemm_produce<Shape, kStageK, kScaleSlots, Mainloop::kScaleGroups, Mainloop::kOuterA,
                         Mainloop::kOuterB>(args, sm, sched);
        }
        if constexpr (Mainloop::kScaleLoaderWarps != 0) {
            static_assert(Mainloop::kScaleLoaderWarps == 3, "warps 1-3 load scales");
            bool groups = Mainloop::kScaleGroups && args.scale_tma != 0;
            if (threadIdx.x >= 32 && !groups) Mainloop::load_scales(args, sm, sched);
        }
        return;
    }
    gemm_regs_consumer<Mainloop::kConsumerRegs>();
    uint32_t wg = warpgroup - 1;
    gemm_pipe<smem::kStages> pipe = {0, 0};
    float acc[Mainloop::kAcc];
    uint32_t chunks = 0;  // epilogue chunks this warpgroup has staged (its buffers' turn)
    float d_max = 0.0f;   // the values this thread stored, all tiles (gemm_args.d_max)
    for (uint32_t t = blockIdx.x; t < sched.total; t += gridDim.x) {
        gemm_tile_pos p = gemm_sched_tile<Shape::kN, kStageK>(args, sched, t);
        Mainloop::run(args, sm, p, wg, pipe, acc);
        gemm_epilogue_tile(args, sm, p, wg, acc, chunks, d_max);
    }
    // Every consumer thread leaves the loop here, so whole warps merge.
    if (args.gemm.d_max != 0) {
        qt_gemm_d_max_merge(args.gemm.d_max, qt_gemm_d_max_bits(d_max, args.gemm.d_dtype));
    }
    // The stores still running read this CTA's shared memory: they finish before it exits.
    if ((threadIdx.x & 127u) == 0) gemm_bulk_wait_all();
}

// ---------------------------------------------------------------------------------------------
// Entry points. Launch: grid (CTAs, 1, 1), at most one CTA per tile; GEMM_SM90A_THREADS threads;
// GEMM_SM90A_SMEM_BYTES(N) of dynamic shared memory for the GEMM's tile width N
// (qt_gemm_sm90a_tile_n).

#define GEMM_SM90A_KERNEL(name)                                         \
    extern "C" __global__ void __launch_bounds__(GEMM_SM90A_THREADS, 1) \
        name(const __grid_constant__ gemm_sm90a_args args)

// BF16 in every layout: fprop (both K-major), dgrad (B outer-major: the weight over its rows),
// wgrad (both outer-major), and A alone outer-major for completeness.
GEMM_SM90A_KERNEL(qt_gemm_bf16_sm90a) {
    qt_grid_enter();
    bool outer_a = (args.gemm.a.flags & GEMM_OPERAND_OUTER_MAJOR) != 0;
    bool outer_b = (args.gemm.b.flags & GEMM_OPERAND_OUTER_MAJOR) != 0;
    if (outer_a && outer_b) {
        gemm_sm90a_run<64, false, gemm_mainloop_fast<gemm_wgmma_bf16_n256_outer_ab>>(args);
    } else if (outer_b) {
        gemm_sm90a_run<64, false, gemm_mainloop_fast<gemm_wgmma_bf16_n256_outer_b>>(args);
    } else if (outer_a) {
        gemm_sm90a_run<64, false, gemm_mainloop_fast<gemm_wgmma_bf16_n256_outer_a>>(args);
    } else {
        gemm_sm90a_run<64, false, gemm_mainloop_fast<gemm_wgmma_bf16_n256>>(args);
    }
}

// The block-scaled mainloops of each A type (B is E4M3).
template <bool kScaleB2D>
using gemm_block_e5m2 = gemm_mainloop_block<gemm_wgmma_e5m2_n192, kScaleB2D>;
template <bool kScaleB2D>
using gemm_block_e4m3 = gemm_mainloop_block<gemm_wgmma_e4m3_n192, kScaleB2D>;

GEMM_SM90A_KERNEL(qt_gemm_fp8_sm90a) {
    qt_grid_enter();
    bool split = (args.gemm.flags & GEMM_FLAG_SPLIT_ACCUMULATE) != 0;
    if (args.gemm.a.elem == GEMM_ELEM_E5M2) {
        if (split) {
            gemm_sm90a_run<128, false, gemm_mainloop_split<gemm_wgmma_e5m2_n192>>(args);
        } else {
            gemm_sm90a_run<128, false, gemm_mainloop_fast<gemm_wgmma_e5m2_n256>>(args);
        }
    } else {
        if (split) {
            gemm_sm90a_run<128, false, gemm_mainloop_split<gemm_wgmma_e4m3_n192>>(args);
        } else {
            gemm_sm90a_run<128, false, gemm_mainloop_fast<gemm_wgmma_e4m3_n256>>(args);
        }
    }
}

GEMM_SM90A_KERNEL(qt_gemm_fp8_block_sm90a) {
    qt_grid_enter();
    bool b_2d = (args.gemm.b.flags & GEMM_OPERAND_SCALE_2D) != 0;
    if (args.gemm.a.elem == GEMM_ELEM_E5M2) {
        if (b_2d) {
            gemm_sm90a_run<128, false, gemm_block_e5m2<true>>(args);
        } else {
            gemm_sm90a_run<128, true, gemm_block_e5m2<false>>(args);
        }
    } else {
        if (b_2d) {
            gemm_sm90a_run<128, false, gemm_block_e4m3<true>>(args);
        } else {
            gemm_sm90a_run<128, true, gemm_block_e4m3<false>>(args);
        }
    }
}

GEMM_SM90A_KERNEL(qt_gemm_mxfp8_sm90a) {
    qt_grid_enter();
    gemm_sm90a_run<GEMM_SM90A_EMU_ROW_BYTES(GEMM_FORMAT_MXFP8), false,
                   gemm_mainloop_emulated<GEMM_FORMAT_MXFP8>>(args);
}

GEMM_SM90A_KERNEL(qt_gemm_nvfp4_sm90a) {
    qt_grid_enter();
    gemm_sm90a_run<GEMM_SM90A_EMU_ROW_BYTES(GEMM_FORMAT_NVFP4), false,
                   gemm_mainloop_emulated<GEMM_FORMAT_NVFP4>>(args);
}
