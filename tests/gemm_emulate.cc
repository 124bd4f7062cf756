// gemm_emulate: a CPU model of the CUDA execution of ptx/gemm_portable.cu, so that its kernels
// (the very source, compiled for the host) run without a GPU. tests/test_gemm.c built with
// -DTEST_GEMM_EMULATE uses it in place of the GPU: every GPU case then checks the kernels' tiling,
// loaders, pipelines, fragment addressing and epilogues against the reference twins.
//
// Owns the emulated block (256 cooperative threads on ucontext stacks, one block at a time), its
// shared memory and per-thread asynchronous-copy queues, for the duration of one launch. Test code
// only (C++17, allocates).
//
// What is modelled, and how strictly:
//   - __syncthreads and warp-wide operations are barriers: a thread blocks until all threads of
//     the block (of the warp) arrive; a barrier that some thread never reaches is reported as a
//     deadlock (divergent barriers are bugs).
//   - ldmatrix .x4: lane l gives a row address; matrix i's rows come from lanes 8i..8i+7; lane l
//     receives 4 bytes of row l / 4 at byte 4 (l % 4) of each matrix. Row addresses must be
//     16-byte aligned.
//   - mma.sync m16n8k16 (bf16) and m16n8k32 (e4m3 / e5m2 x e4m3): the PTX fragment layouts; the
//     products are exact and summed in FP64, then rounded once to FP32 (the hardware accumulates
//     differently; the tests' bounds cover both).
//   - cp.async: copies stay queued per thread until a cp.async.wait_group lets them complete, as
//     late as the PTX allows; so a stage read before its wait shows stale bytes. Shared memory is
//     filled with a pattern (NaN bytes) before each block, so reads of unwritten bytes show.
//   - A thread that ends with copies still queued is reported.
#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

// ---------------------------------------------------------------------------------------------
// The CUDA surface the kernel file uses.

#define __CUDACC__ 1  // qt_hd.h: QT_HD functions and static_assert, host code paths
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static

struct uint4 {
    uint32_t x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
    return uint4{x, y, z, w};
}
struct dim3e {
    unsigned x, y, z;
};
static dim3e threadIdx, blockIdx;

static inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }
template <class T>
static inline T __ldg(const T *p) {
    return *p;
}

#include "gemm.h"

struct __nv_bfloat162 {
    uint16_t x, y;
};
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{qt_f32_to_bf16(lo), qt_f32_to_bf16(hi)};
}

// ---------------------------------------------------------------------------------------------
// Cooperative threads.

namespace emu {

constexpr int kThreadsMax = 256;
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kSmemBytes = 160 * 1024;

struct copy {
    uint8_t *dst;
    const uint8_t *src;
    uint32_t size, src_bytes;
};

struct thread {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done;
    std::vector<copy> open;                // issued, not yet committed
    std::deque<std::vector<copy>> groups;  // committed, not yet complete
};

struct barrier {
    int needed = 0, arrived = 0;
    unsigned generation = 0;
};

static thread threads[kThreadsMax];
static int thread_count;
static int current;
static ucontext_t scheduler;
static uint64_t events;  // barrier arrivals and completions: progress of the block
static barrier block_barrier, warp_barrier[kThreadsMax / 32];
static void (*body)(const void *);
static const void *body_args;
static bool failed;

static void yield() {
    int me = current;
    swapcontext(&threads[me].ctx, &scheduler);
    threadIdx.x = (unsigned)current;
}

static void barrier_wait(barrier &b) {
    unsigned generation = b.generation;
    events++;
    if (++b.arrived == b.needed) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    while (b.generation == generation) yield();
}

static void warp_sync() { barrier_wait(warp_barrier[threadIdx.x / 32]); }

static void thread_entry() {
    body(body_args);
    thread &t = threads[current];
    if (!t.open.empty() || !t.groups.empty()) {
        fprintf(stderr, "emulate: thread %d of block (%u, %u, %u) ended with %zu copies queued\n",
                current, blockIdx.x, blockIdx.y, blockIdx.z, t.open.size() + t.groups.size());
        failed = true;
    }
    t.done = true;
    events++;
}

}  // namespace emu

static void __syncthreads() { emu::barrier_wait(emu::block_barrier); }

template <class T>
static T __shfl_up_sync(unsigned mask, T value, unsigned delta) {
    (void)mask;
    static T scratch[emu::kThreadsMax];
    unsigned lane = threadIdx.x & 31;
    scratch[threadIdx.x] = value;
    emu::warp_sync();
    T result = lane >= delta ? scratch[threadIdx.x - delta] : value;
    emu::warp_sync();
    return result;
}

// ---------------------------------------------------------------------------------------------
// The hardware primitives of gemm_portable.cu.

#define QT_GEMM_EMULATE 1
alignas(16) static uint8_t gemm_dynamic_smem[emu::kSmemBytes];

static uint32_t gemm_smem_address(const void *p) {
    const uint8_t *q = static_cast<const uint8_t *>(p);
    if (q < gemm_dynamic_smem || q >= gemm_dynamic_smem + emu::kSmemBytes) {
        fprintf(stderr, "emulate: shared address outside dynamic shared memory\n");
        abort();
    }
    return (uint32_t)(q - gemm_dynamic_smem);
}

static void gemm_ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
    static uint32_t rows[emu::kThreadsMax];
    unsigned lane = threadIdx.x & 31, base = threadIdx.x & ~31u;
    if (address % 16 != 0 || address + 16 > emu::kSmemBytes) {
        fprintf(stderr, "emulate: ldmatrix row address %u misaligned or out of range\n", address);
        abort();
    }
    rows[threadIdx.x] = address;
    emu::warp_sync();
    for (int i = 0; i < 4; i++) {
        memcpy(&r[i], gemm_dynamic_smem + rows[base + 8 * i + lane / 4] + 4 * (lane % 4), 4);
    }
    emu::warp_sync();
}

static void gemm_cp_async16(void *dst, const void *src, uint32_t src_bytes) {
    if ((uintptr_t)src % 16 != 0 || gemm_smem_address(dst) % 16 != 0 || src_bytes > 16) {
        fprintf(stderr, "emulate: cp.async 16 misaligned or src_bytes %u\n", src_bytes);
        abort();
    }
    emu::threads[threadIdx.x].open.push_back(
        {static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), 16, src_bytes});
}

static void gemm_cp_async4(void *dst, const void *src) {
    if ((uintptr_t)src % 4 != 0 || gemm_smem_address(dst) % 4 != 0) {
        fprintf(stderr, "emulate: cp.async 4 misaligned\n");
        abort();
    }
    emu::threads[threadIdx.x].open.push_back(
        {static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), 4, 4});
}

static void gemm_cp_async_commit() {
    emu::thread &t = emu::threads[threadIdx.x];
    t.groups.push_back(t.open);
    t.open.clear();
}

template <int kPending>
static void gemm_cp_async_wait() {
    emu::thread &t = emu::threads[threadIdx.x];
    while (t.groups.size() > (size_t)kPending) {
        for (const emu::copy &c : t.groups.front()) {
            memcpy(c.dst, c.src, c.src_bytes);
            memset(c.dst + c.src_bytes, 0, c.size - c.src_bytes);
        }
        t.groups.pop_front();
    }
}

// One warp's mma: each lane posts its fragments; each lane then computes its own 4 outputs from
// the matrices assembled per the PTX fragment layouts.
namespace emu {

enum mma_kind { MMA_BF16, MMA_E4M3_E4M3, MMA_E5M2_E4M3 };

static float element(mma_kind kind, bool is_a, uint32_t word, int index, int bits) {
    uint32_t v = (word >> (bits * index)) & ((1u << bits) - 1u);
    if (kind == MMA_BF16) return qt_bf16_to_f32((uint16_t)v);
    if (kind == MMA_E5M2_E4M3 && is_a) return qt_e5m2_to_f32((uint8_t)v);
    return qt_e4m3_to_f32((uint8_t)v);
}

static void mma(mma_kind kind, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    static uint32_t fa[kThreadsMax][4], fb[kThreadsMax][2];
    unsigned lane = threadIdx.x & 31, base = threadIdx.x & ~31u;
    for (int i = 0; i < 4; i++) fa[threadIdx.x][i] = a[i];
    for (int i = 0; i < 2; i++) fb[threadIdx.x][i] = b[i];
    warp_sync();
    // Per register: bf16 holds 2 values along k (k = 2 tig + j, + 8 for a2, a3 and b1); fp8
    // holds 4 (k = 4 tig + j, + 16). Rows: a0, a2 row gid; a1, a3 row gid + 8.
    int per = kind == MMA_BF16 ? 2 : 4, bits = kind == MMA_BF16 ? 16 : 8, half = 4 * per;
    int kdim = 2 * half;
    double A[16][32] = {}, B[32][8] = {};
    for (int l = 0; l < 32; l++) {
        int gid = l / 4, tig = l % 4;
        for (int j = 0; j < per; j++) {
            int k = tig * per + j;
            A[gid][k] = element(kind, true, fa[base + l][0], j, bits);
            A[gid + 8][k] = element(kind, true, fa[base + l][1], j, bits);
            A[gid][k + half] = element(kind, true, fa[base + l][2], j, bits);
            A[gid + 8][k + half] = element(kind, true, fa[base + l][3], j, bits);
            B[k][gid] = element(kind, false, fb[base + l][0], j, bits);
            B[k + half][gid] = element(kind, false, fb[base + l][1], j, bits);
        }
    }
    int gid = (int)lane / 4, tig = (int)lane % 4;
    for (int e = 0; e < 4; e++) {
        int row = gid + 8 * (e >> 1), col = 2 * tig + (e & 1);
        double sum = d[e];
        for (int k = 0; k < kdim; k++) sum += A[row][k] * B[k][col];
        d[e] = (float)sum;
    }
    warp_sync();
}

}  // namespace emu

struct gemm_mma_bf16 {
    static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
        emu::mma(emu::MMA_BF16, d, a, b);
    }
};
struct gemm_mma_e4m3_e4m3 {
    static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
        emu::mma(emu::MMA_E4M3_E4M3, d, a, b);
    }
};
struct gemm_mma_e5m2_e4m3 {
    static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
        emu::mma(emu::MMA_E5M2_E4M3, d, a, b);
    }
};

#include "../ptx/gemm_portable.cu"

// ---------------------------------------------------------------------------------------------
// Launching.

namespace emu {

static void run_block(int threads_per_block) {
    thread_count = threads_per_block;
    block_barrier = barrier{threads_per_block, 0, 0};
    for (int w = 0; w < threads_per_block / 32; w++) warp_barrier[w] = barrier{32, 0, 0};
    memset(gemm_dynamic_smem, 0xFF, kSmemBytes);  // NaN in every format: unwritten bytes show
    for (int i = 0; i < threads_per_block; i++) {
        thread &t = threads[i];
        if (t.stack.empty()) t.stack.resize(kStackBytes);
        t.done = false;
        t.open.clear();
        t.groups.clear();
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = t.stack.data();
        t.ctx.uc_stack.ss_size = t.stack.size();
        t.ctx.uc_link = &scheduler;
        makecontext(&t.ctx, thread_entry, 0);
    }
    int alive = threads_per_block;
    while (alive > 0) {
        uint64_t before = events;
        alive = 0;
        for (int i = 0; i < threads_per_block; i++) {
            if (threads[i].done) continue;
            current = i;
            threadIdx.x = (unsigned)i;
            swapcontext(&scheduler, &threads[i].ctx);
            if (!threads[i].done) alive++;
        }
        if (alive > 0 && events == before) {
            fprintf(stderr, "emulate: deadlock in block (%u, %u, %u): %d threads wait at a "
                    "barrier the others never reach\n", blockIdx.x, blockIdx.y, blockIdx.z,
                    alive);
            abort();
        }
    }
}

template <class Args>
static void launch(void (*kernel)(const Args), const void *args, const uint32_t grid[3],
                   uint32_t threads_per_block) {
    static Args copy;
    memcpy(&copy, args, sizeof copy);
    static void (*k)(const Args);
    k = kernel;
    body = [](const void *a) { k(*static_cast<const Args *>(a)); };
    body_args = &copy;
    for (uint32_t z = 0; z < grid[2]; z++) {
        for (uint32_t y = 0; y < grid[1]; y++) {
            for (uint32_t x = 0; x < grid[0]; x++) {
                blockIdx = dim3e{x, y, z};
                run_block((int)threads_per_block);
            }
        }
    }
}

}  // namespace emu

extern "C" int gemm_emulate_launch(const char *symbol, const void *args, const uint32_t grid[3],
                                   uint32_t threads_per_block, uint32_t smem_bytes) {
    if (smem_bytes > emu::kSmemBytes || threads_per_block > (uint32_t)emu::kThreadsMax ||
        threads_per_block % 32 != 0) {
        fprintf(stderr, "emulate: %s: launch of %u threads, %u bytes of shared memory\n", symbol,
                threads_per_block, smem_bytes);
        return 1;
    }
    emu::failed = false;
    struct entry {
        const char *symbol;
        void (*kernel)(const gemm_args);
    } gemm_kernels[] = {
        {"qt_gemm_bf16_portable", qt_gemm_bf16_portable},
        {"qt_gemm_fp8_portable", qt_gemm_fp8_portable},
        {"qt_gemm_fp8_block_portable", qt_gemm_fp8_block_portable},
        {"qt_gemm_mxfp8_portable", qt_gemm_mxfp8_portable},
        {"qt_gemm_nvfp4_portable", qt_gemm_nvfp4_portable},
    };
    for (const entry &e : gemm_kernels) {
        if (strcmp(e.symbol, symbol) == 0) {
            emu::launch<gemm_args>(e.kernel, args, grid, threads_per_block);
            return emu::failed ? 1 : 0;
        }
    }
    if (strcmp(symbol, "qt_gemm_bias_grad") == 0) {
        emu::launch<gemm_bias_grad_args>(qt_gemm_bias_grad, args, grid, threads_per_block);
        return emu::failed ? 1 : 0;
    }
    fprintf(stderr, "emulate: no kernel %s\n", symbol);
    return 1;
}
