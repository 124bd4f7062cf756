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

// Every thread reads the slot's header and indices, which nothing here writes (every write is at
// or past inputs_offset), so there is no race. Inputs in 16-byte words where every row is whole
// words (bytes otherwise): word w of the inputs is row w / words-per-row, from its sample's row or
// zero; then the targets and the gaps.
extern "C" __global__ void __launch_bounds__(QT_SCHED_THREADS)
    qt_sched_gather(const __grid_constant__ sched_gather_args args) {
    qt_grid_enter();
    uint64_t counter = *(const volatile uint64_t *)args.counter;
    uint8_t *slot = (uint8_t *)(args.slots + qt_sched_slot_offset(counter, args.slot_count,
                                                                  args.slot_stride));
    uint32_t dataset = qt_sched_gather_dataset(&args, slot);
    if (dataset == QT_SCHED_DATASETS) return;  // rows the host staged
    const sched_gather_dataset &d = args.datasets[dataset];
    uint64_t thread = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t grid = (uint64_t)gridDim.x * blockDim.x;
    uint64_t row_bytes = (uint64_t)args.stride * args.elem_bytes;
    uint64_t sample_bytes = (uint64_t)args.features * args.elem_bytes;
    uint8_t *inputs = slot + args.inputs_offset;
    bool words = row_bytes % 16 == 0 && sample_bytes % 16 == 0 && d.inputs % 16 == 0 &&
                 (uintptr_t)inputs % 16 == 0;
    uint64_t word_bytes = words ? 16 : 1, per_row = row_bytes / word_bytes;
    for (uint64_t w = thread; w < (uint64_t)args.batch * per_row; w += grid) {
        uint32_t index;
        uint64_t c = w % per_row;
        const uint8_t *src = qt_sched_gather_source(&args, slot, dataset,
                                                    (uint32_t)(w / per_row), &index);
        bool inside = src != 0 && c * word_bytes < sample_bytes;
        if (words) {
            *(uint4 *)(inputs + w * 16) = inside ? *(const uint4 *)(src + c * 16)
                                                 : make_uint4(0u, 0u, 0u, 0u);
        } else {
            inputs[w] = inside ? src[c] : (uint8_t)0;
        }
    }
    uint64_t per_target = args.target_type == 0 ? 1 : args.outputs;
    for (uint64_t e = thread; e < (uint64_t)args.batch * per_target; e += grid) {
        uint32_t index, r = (uint32_t)(e / per_target);
        bool real = qt_sched_gather_source(&args, slot, dataset, r, &index) != 0;
        if (args.target_type == 0) {
            ((int32_t *)(slot + args.targets_offset))[e] =
                real ? ((const int32_t *)d.targets)[index] : QT_SCHED_LABEL_PAD;
        } else {
            ((float *)(slot + args.targets_offset))[e] =
                real ? ((const float *)d.targets)[(uint64_t)index * per_target + e % per_target]
                     : 0.0f;
        }
    }
    uint64_t inputs_end = args.inputs_offset + (uint64_t)args.batch * row_bytes;
    uint64_t targets_end = args.targets_offset + (uint64_t)args.batch * per_target * 4;
    uint64_t gap = args.targets_offset - inputs_end, tail = args.bytes - targets_end;
    for (uint64_t b = thread; b < gap + tail; b += grid) {
        slot[b < gap ? inputs_end + b : targets_end + (b - gap)] = 0;
    }
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
