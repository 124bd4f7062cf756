// sched kernels: the schedule loop's per-step copy, record and checksum (ABI and shared
// arithmetic in ptx/sched_ops.h).
#include "ptx/sched_ops.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

// The step's amax slots (sched_zero) set to +0, the grid striding over their words.
static __device__ void sched_zero_slots(const sched_zero &zero) {
    uint32_t *words = (uint32_t *)zero.at;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < zero.words;
         i += stride) {
        words[i] = 0u;
    }
}

// sched_amax: the block's maximum of the values its threads stored (m, each thread's own) into
// fold[0], then a ticket; the block that takes the last one stores the grid's maximum to out and
// leaves both fold words zero for the next launch. Every thread of the block calls it.
static __device__ void sched_amax_fold(const sched_amax &a, float m) {
    __shared__ float warp_max[QT_SCHED_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (uint32_t w = 0; w < QT_SCHED_THREADS / 32; w++) m = fmaxf(m, warp_max[w]);
    unsigned int *fold = (unsigned int *)(uintptr_t)a.fold;
    // Values are >= +0 and never NaN, so the integer order of the bits is the float order.
    if (m > 0.0f) atomicMax(fold, __float_as_uint(m));
    __threadfence();  // this block's maximum before its ticket
    if (atomicAdd(fold + 1, 1u) != gridDim.x - 1) return;
    __threadfence();  // every other block's maximum, merged before its ticket, is seen
    *(unsigned int *)(uintptr_t)a.out = atomicExch(fold, 0u);
    fold[1] = 0u;  // the next launch starts from 0
}

// max |x| over this thread's words of the copy that hold FP32 inputs (sched_amax.first/count).
static __device__ __forceinline__ float sched_copy_amax(const sched_amax &a, uint64_t word,
                                                        uint4 w, float m) {
    uint64_t first = word * 4 - a.first / 4;  // inputs index of the word's first float
    if (word * 16 < a.first || first >= a.count) return m;
    float v[4] = {__uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z),
                  __uint_as_float(w.w)};
#pragma unroll
    for (uint32_t k = 0; k < 4; k++) {
        if (first + k < a.count) m = qt_fp8_amax_step(m, v[k]);
    }
    return m;
}

// Every thread reads the counter before any write of this step; nothing in this kernel writes
// the counter, so there is no race.
extern "C" __global__ void __launch_bounds__(QT_SCHED_THREADS)
    qt_sched_copy(const __grid_constant__ sched_copy_args args) {
    qt_grid_enter();
    sched_zero_slots(args.zero);
    uint64_t counter = *(const volatile uint64_t *)args.counter;
    const uint4 *src = (const uint4 *)(args.src +
                                       qt_sched_slot_offset(counter, args.src_slots,
                                                            args.src_stride));
    uint4 *dst = (uint4 *)(args.dst +
                           qt_sched_slot_offset(counter, args.dst_slots, args.dst_stride));
    uint64_t words = args.bytes / 16;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    float m = 0.0f;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        uint4 w = src[i];
        dst[i] = w;
        if (args.amax.out) m = sched_copy_amax(args.amax, i, w, m);
    }
    if (args.amax.out) sched_amax_fold(args.amax, m);
}

// Every thread reads the counter before any write; nothing here writes it. One 16-byte load of
// pixels per thread step, four float4 stores: a device-to-device pass.
extern "C" __global__ void __launch_bounds__(QT_SCHED_THREADS)
    qt_sched_stage_u8(const __grid_constant__ sched_stage_u8_args args) {
    qt_grid_enter();
    sched_zero_slots(args.zero);
    uint64_t counter = *(const volatile uint64_t *)args.counter;
    const uint8_t *src =
        (const uint8_t *)(args.src + qt_sched_slot_offset(counter, args.src_slots,
                                                          args.src_stride));
    uint8_t *dst = (uint8_t *)args.dst;
    uint64_t thread = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint8_t *pixels = src + args.inputs_offset;
    float *values = (float *)(dst + args.inputs_offset);
    uint64_t chunks = args.pixels / QT_SCHED_STAGE_CHUNK;
    uint32_t brightest = 0;  // four byte lanes of maxima, then this thread's largest pixel
    for (uint64_t c = thread; c < chunks; c += stride) {
        uint4 word = *(const uint4 *)(pixels + c * QT_SCHED_STAGE_CHUNK);
        uint32_t w[4] = {word.x, word.y, word.z, word.w};
        float4 *out = (float4 *)(values + c * QT_SCHED_STAGE_CHUNK);
#pragma unroll
        for (uint32_t q = 0; q < 4; q++) {
            out[q] = make_float4(qt_sched_pixel((uint8_t)w[q]),
                                 qt_sched_pixel((uint8_t)(w[q] >> 8)),
                                 qt_sched_pixel((uint8_t)(w[q] >> 16)),
                                 qt_sched_pixel((uint8_t)(w[q] >> 24)));
            brightest = __vmaxu4(brightest, w[q]);
        }
    }
    brightest = max(max(brightest & 0xFFu, (brightest >> 8) & 0xFFu),
                    max((brightest >> 16) & 0xFFu, brightest >> 24));
    for (uint64_t i = chunks * QT_SCHED_STAGE_CHUNK + thread; i < args.pixels; i += stride) {
        values[i] = qt_sched_pixel(pixels[i]);
        brightest = max(brightest, (uint32_t)pixels[i]);
    }
    // The values are x / 255 >= +0, and x / 255 is monotonic: the largest is the brightest's.
    if (args.amax.out) sched_amax_fold(args.amax, qt_sched_pixel((uint8_t)brightest));
    const uint4 *header = (const uint4 *)src;
    for (uint64_t i = thread; i < args.inputs_offset / 16; i += stride) {
        ((uint4 *)dst)[i] = header[i];
    }
    const uint4 *targets = (const uint4 *)(src + args.src_targets_offset);
    for (uint64_t i = thread; i < args.targets_bytes / 16; i += stride) {
        ((uint4 *)(dst + args.dst_targets_offset))[i] = targets[i];
    }
}

// Input quad q (4 consecutive inputs of a row; rows are whole quads) of the batch: loaded 16 or
// 4 bytes at once where the row's source allows, else one by one; the same values either way.
static __device__ __forceinline__ float4 sched_gather_quad(const sched_gather_args &a,
                                                           const uint8_t *row, uint32_t j,
                                                           uint32_t limit) {
    if (row != 0 && j + 4 <= limit) {
        if (a.elem_bytes == 4 && (uintptr_t)(row + 4ull * j) % 16 == 0) {
            return *(const float4 *)(row + 4ull * j);
        }
        if (a.elem_bytes == 1 && (uintptr_t)(row + j) % 4 == 0) {
            uint32_t w = *(const uint32_t *)(row + j);
            return make_float4(qt_sched_pixel((uint8_t)w), qt_sched_pixel((uint8_t)(w >> 8)),
                               qt_sched_pixel((uint8_t)(w >> 16)),
                               qt_sched_pixel((uint8_t)(w >> 24)));
        }
    }
    return make_float4(qt_sched_gather_value(&a, row, j, limit),
                       qt_sched_gather_value(&a, row, j + 1, limit),
                       qt_sched_gather_value(&a, row, j + 2, limit),
                       qt_sched_gather_value(&a, row, j + 3, limit));
}

// Every thread reads the counter and the slot (header, indices, rows), which nothing here
// writes: there is no race. The header region as 16-byte words, the inputs as quads of FP32
// stores (one by one where rows are not whole quads), then the targets; every block takes part
// in the amax fold. The batch's alignment gaps (past the inputs, past the targets) keep whatever
// the region held: no op reads them, and no checksum covers a staging region.
extern "C" __global__ void __launch_bounds__(QT_SCHED_THREADS)
    qt_sched_gather(const __grid_constant__ sched_gather_args args) {
    qt_grid_enter();
    sched_zero_slots(args.zero);
    uint64_t counter = *(const volatile uint64_t *)args.counter;
    const uint8_t *slot = (const uint8_t *)(args.slots + qt_sched_slot_offset(
                                                             counter, args.slot_count,
                                                             args.slot_stride));
    uint8_t *batch = (uint8_t *)args.batch;
    uint32_t dataset = qt_sched_gather_dataset(&args, slot);
    uint32_t limit = dataset == QT_SCHED_DATASETS ? args.stride : args.features;
    uint64_t thread = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t grid = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = thread; i < args.inputs_offset / 16; i += grid) {
        ((uint4 *)batch)[i] = ((const uint4 *)slot)[i];
    }
    float *inputs = (float *)(batch + args.inputs_offset);
    float m = 0.0f;  // this thread's max |input| stored (sched_amax)
    if (args.stride % 4 == 0) {
        uint64_t quads = (uint64_t)args.stride / 4;
        for (uint64_t q = thread; q < (uint64_t)args.rows * quads; q += grid) {
            uint32_t index, r = (uint32_t)(q / quads), j = (uint32_t)(q % quads) * 4;
            const uint8_t *row = qt_sched_gather_row(&args, slot, dataset, r, &index);
            float4 v = sched_gather_quad(args, row, j, limit);
            *(float4 *)(inputs + 4 * q) = v;
            m = qt_fp8_amax_step(qt_fp8_amax_step(m, v.x), v.y);
            m = qt_fp8_amax_step(qt_fp8_amax_step(m, v.z), v.w);
        }
    } else {
        for (uint64_t e = thread; e < (uint64_t)args.rows * args.stride; e += grid) {
            uint32_t index, r = (uint32_t)(e / args.stride), j = (uint32_t)(e % args.stride);
            const uint8_t *row = qt_sched_gather_row(&args, slot, dataset, r, &index);
            float v = qt_sched_gather_value(&args, row, j, limit);
            inputs[e] = v;
            m = qt_fp8_amax_step(m, v);
        }
    }
    uint32_t per_row = args.target_type == 0 ? 1u : args.outputs;
    uint32_t *targets = (uint32_t *)(batch + args.batch_targets_offset);
    for (uint64_t e = thread; e < (uint64_t)args.rows * per_row; e += grid) {
        targets[e] = qt_sched_gather_target(&args, slot, dataset, (uint32_t)(e / per_row),
                                            (uint32_t)(e % per_row));
    }
    if (args.amax.out) sched_amax_fold(args.amax, m);
}

// One warp: every lane reads the counter, the lanes write the record's arrays, lane 0 its
// header; after a warp barrier (all reads of the counter done) lane 0 advances the counter.
// The writes go to pinned host memory; the host reads them only after an event that follows
// this kernel, which orders them.
extern "C" __global__ void __launch_bounds__(QT_SCHED_RECORD_THREADS)
    qt_sched_record(const __grid_constant__ sched_record_args args) {
    qt_grid_enter();
    uint64_t *counter = (uint64_t *)args.counter;
    uint64_t step = *(volatile uint64_t *)counter;
    qt_trace_ring_head *r = qt_trace_ring_at(args.ring, step % args.ring_len, args.quantizers);
    for (uint32_t i = threadIdx.x; i < args.quantizers; i += blockDim.x) {
        qt_sched_record_entry(&args, i, r);
    }
    if (threadIdx.x == 0) qt_sched_record_header(&args, step, r);
    __syncthreads();
    if (threadIdx.x == 0) *counter = step + 1;
}

extern "C" __global__ void __launch_bounds__(QT_SCHED_RECORD_THREADS)
    qt_sched_checksum(const __grid_constant__ sched_checksum_args args) {
    qt_grid_enter();
    if (threadIdx.x != 0) return;
    uint64_t counter = *(const volatile uint64_t *)args.counter;
    if (counter == 0) return;  // no step has been recorded yet
    qt_trace_ring_head *r = qt_trace_ring_at(args.ring, (counter - 1) % args.ring_len,
                                             args.quantizers);
    r->checksum = qt_sched_checksum_fold((const uint64_t *)args.hashes, args.count);
    r->flags |= QT_TRACE_FLAG_CHECKSUM;
}

// Reads the counter before its write; the word it writes is read by later ops only.
extern "C" __global__ void __launch_bounds__(1)
    qt_sched_inject(const __grid_constant__ sched_inject_args args) {
    qt_grid_enter();
    if (*(const volatile uint64_t *)args.counter == args.step) {
        *(uint32_t *)args.target = args.bits;
    }
}
