// optim kernels: qt_optim_begin (the per-step device state), qt_optim_adamw (the fused AdamW
// update of one parameter and its BF16 / FP8 per-tensor / rowwise MXFP8 requantization), its
// multi-tensor launch over a table of parameters, the table's amax zeroing, and the op that
// writes a table entry.
// ABI, numerics and the skip rule: optim.h.
#include "ptx/optim.h"
#include "ptx/grid_order.h"  // qt_grid_enter, every kernel's first statement

extern "C" __global__ void __launch_bounds__(QT_OPTIM_BEGIN_THREADS)
    qt_optim_begin(const __grid_constant__ optim_begin_args args) {
    qt_grid_enter();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    qt_optim_begin_apply((uint64_t *)args.steps, (optim_state *)args.state,
                         (const optim_grad_norm *)args.grad_norm,
                         (const optim_lr_row *)args.lr_rows, args.row_count);
    if (args.zero != 0) {
        qt_optim_zero_amaxes((const optim_multi_entry *)args.zero, args.zero_count);
    }
}

// ---------------------------------------------------------------------------------------------
// qt_optim_adamw. Block b (of the parameter) takes the 64 x 64 tile (b / tiles_k, b % tiles_k);
// thread t takes rows 4 (t / 16) .. +3 and columns 4 (t % 16) .. +3 of it, so a warp reads two
// rows of 256 contiguous bytes per FP32 array and instruction. All four rows are loaded before
// any is computed (64 independent loads in flight per thread). The FP8 columnwise codes go through
// shared memory: each thread transposes its 4 x 4 codes in registers (prmt), stores the four
// column words, and after a barrier each thread writes 16 consecutive bytes of one column.
// Elements past the matrix are computed on zeros and never stored or counted.

#define OPT_T_WORDS 17u  // words per staged column: 64 code bytes + 1 pad word (fewer conflicts)

__device__ __forceinline__ void opt_load4(const float *__restrict__ src, uint32_t n, bool vec,
                                          float out[4]) {
    if (vec) {
        float4 t = *(const float4 *)src;
        out[0] = t.x;
        out[1] = t.y;
        out[2] = t.z;
        out[3] = t.w;
        return;
    }
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) out[j] = j < n ? src[j] : 0.0f;
}

__device__ __forceinline__ void opt_store4(float *__restrict__ dst, uint32_t n, bool vec,
                                           const float in[4]) {
    if (vec) {
        *(float4 *)dst = make_float4(in[0], in[1], in[2], in[3]);
        return;
    }
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) {
        if (j < n) dst[j] = in[j];
    }
}

// Four gradients as FP32 (BF16 widening is exact).
__device__ __forceinline__ void opt_load_grad(const optim_adamw_args &a, uint64_t i, uint32_t n,
                                              bool vec, float out[4]) {
    if (a.grad_dtype == QT_DTYPE_BF16) {
        const uint16_t *__restrict__ src = (const uint16_t *)a.grad + i;
        if (vec) {
            uint2 w = __ldg((const uint2 *)src);
            out[0] = __uint_as_float(w.x << 16);
            out[1] = __uint_as_float(w.x & 0xFFFF0000u);
            out[2] = __uint_as_float(w.y << 16);
            out[3] = __uint_as_float(w.y & 0xFFFF0000u);
            return;
        }
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) out[j] = j < n ? qt_bf16_to_f32(src[j]) : 0.0f;
        return;
    }
    const float *__restrict__ src = (const float *)a.grad + i;
    if (vec) {
        float4 t = __ldg((const float4 *)src);
        out[0] = t.x;
        out[1] = t.y;
        out[2] = t.z;
        out[3] = t.w;
        return;
    }
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) out[j] = j < n ? src[j] : 0.0f;
}

// The fused rowwise output of one row's four elements; returns the FP8 codes (element j in byte
// j) for the columnwise copy.
__device__ __forceinline__ uint32_t opt_store_out(const optim_adamw_args &a,
                                                  const qt_optim_coef &c, uint64_t i, uint32_t n,
                                                  bool vec_rows, const float p[4]) {
    if (a.out == QT_OPTIM_OUT_BF16) {
        uint16_t *dst = (uint16_t *)a.weight + i;
        uint16_t h[4];
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) h[j] = qt_f32_to_bf16(p[j]);
        if (vec_rows && (a.weight & 7u) == 0) {
            *(uint2 *)dst =
                make_uint2(h[0] | ((uint32_t)h[1] << 16), h[2] | ((uint32_t)h[3] << 16));
        } else {
#pragma unroll
            for (uint32_t j = 0; j < 4; j++) {
                if (j < n) dst[j] = h[j];
            }
        }
        return 0;
    }
    uint32_t codes = qt_optim_fp8_pair(p[0], p[1], c.scale, a.fp8) |
                     (qt_optim_fp8_pair(p[2], p[3], c.scale, a.fp8) << 16);
    if (a.weight != 0) {
        uint8_t *dst = (uint8_t *)a.weight + i;
        if (vec_rows && (a.weight & 3u) == 0) {
            *(uint32_t *)dst = codes;
        } else {
#pragma unroll
            for (uint32_t j = 0; j < 4; j++) {
                if (j < n) dst[j] = (uint8_t)(codes >> (8 * j));
            }
        }
    }
    return codes;
}

// The transposed FP8 codes of the tile: codes[q] holds row 4 rg + q (byte j = column 4 cg + j).
// Every thread of the block calls it (it has a barrier).
__device__ __forceinline__ void opt_store_colwise(const optim_adamw_args &a, uint32_t *s_t,
                                                  uint32_t codes[4], uint32_t r0, uint32_t c0,
                                                  uint32_t cg, uint32_t rg) {
    qt_fp8_transpose4x4(codes);  // codes[j]: column 4 cg + j, byte q = row 4 rg + q
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) s_t[(4u * cg + j) * OPT_T_WORDS + rg] = codes[j];
    __syncthreads();
    const uint32_t col = threadIdx.x >> 2, part = threadIdx.x & 3u;
    const uint32_t k = c0 + col, m0 = r0 + 16u * part;
    if (k >= a.cols || m0 >= a.rows) return;
    const uint32_t *src = s_t + col * OPT_T_WORDS + 4u * part;
    uint8_t *dst = (uint8_t *)a.weight_t + (uint64_t)k * a.rows + m0;
    if (m0 + 16u <= a.rows && (a.rows & 15u) == 0 && (a.weight_t & 15u) == 0) {
        *(uint4 *)dst = make_uint4(src[0], src[1], src[2], src[3]);
        return;
    }
    for (uint32_t b = 0; b < 16u && m0 + b < a.rows; b++) {
        dst[b] = (uint8_t)(src[b >> 2] >> (8u * (b & 3u)));
    }
}

// The rowwise MXFP8 copy of one row of the tile's new master values p (QT_OPTIM_OUT_MXFP8),
// written as soon as the row is updated (the registers of the other rows' inputs are still
// live then; holding all 16 values to the end instead makes the division's slow path spill).
// The 1 x 32 block at column 4 cg is the row's columns of 8 threads, lanes 8k .. 8k + 7 of a
// warp (cg / 8 is the block within the tile), so its amax is a max over 8 lanes by shuffles;
// then each thread encodes its four elements with the block's scale and the block's first
// thread writes the scale. The per-block arithmetic is the family cast's (quant_mxfp8.h), so
// the bytes are qt_mxfp8_quantize_f32's. Values past the matrix are zeros, which leave an amax
// as it is. Every thread of the block calls it (the shuffles need every lane); `live`: the
// thread's part of the row lies in the matrix.
__device__ __forceinline__ void opt_store_mxfp8(const optim_adamw_args &a, const float p[4],
                                                uint32_t row, uint32_t col, uint32_t n,
                                                uint32_t cg, bool vec_rows, bool live) {
    float amax = 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) amax = qt_mxfp8_amax_step(amax, p[j]);
#pragma unroll
    for (uint32_t off = 1; off < 8u; off <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    }
    if (!live) return;
    const uint8_t e = qt_mxfp8_scale_e8m0(amax, a.fp8);
    const float mult = qt_e8m0_inv_f32(e);
    const uint32_t codes = qt_mxfp8_encode2(p[0], p[1], mult, mult, a.fp8) |
                           (qt_mxfp8_encode2(p[2], p[3], mult, mult, a.fp8) << 16);
    uint8_t *dst = (uint8_t *)a.weight + (uint64_t)row * a.cols + col;
    if (vec_rows && (a.weight & 3u) == 0) {
        *(uint32_t *)dst = codes;
    } else {
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) {
            if (j < n) dst[j] = (uint8_t)(codes >> (8 * j));
        }
    }
    if ((cg & 7u) == 0) {
        const uint32_t scale_cols = (a.cols + QT_MXFP8_BLOCK - 1u) / QT_MXFP8_BLOCK;
        ((uint8_t *)a.scale_inv)[(uint64_t)row * scale_cols + col / QT_MXFP8_BLOCK] = e;
    }
}

// Block maximum of the threads' amaxes, then one atomicMax per target on the bit pattern (values
// are >= +0 and never NaN, so the integer order is the float order; max is exact and order-free,
// so the result does not depend on the grid). Every thread calls it (it has a barrier).
__device__ __forceinline__ void opt_amax_block(const optim_adamw_args &a, float amax,
                                               float *s_amax, uint32_t r0) {
#pragma unroll
    for (uint32_t off = 16; off > 0; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    }
    if ((threadIdx.x & 31u) == 0) s_amax[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x != 0) return;
    float block = s_amax[0];
    for (uint32_t w = 1; w < QT_OPTIM_THREADS / 32u; w++) block = fmaxf(block, s_amax[w]);
    if (!(block > 0.0f)) return;
    const uint32_t word = qt_optim_amax_word(&a, r0);  // the tile's rows lie in one member
    if (a.amax0 != 0) atomicMax((unsigned int *)a.amax0 + word, __float_as_uint(block));
    if (a.amax1 != 0) atomicMax((unsigned int *)a.amax1 + word, __float_as_uint(block));
}

// Tile `block` of the parameter of args a: the whole of qt_optim_adamw, and of one block of
// qt_optim_adamw_multi. Every thread of the block calls it (it has barriers).
__device__ __forceinline__ void opt_adamw_tile(const optim_adamw_args &a, uint32_t block) {
    // Aligned so that the compiler's vector loads of the whole struct stay inside it: unaligned,
    // they also read the neighbouring s_amax word that another warp writes later, which
    // racecheck reports (the extra word is discarded, but the report would hide real races).
    __shared__ __align__(16) qt_optim_coef s_coef;
    __shared__ uint32_t s_mode;
    __shared__ uint32_t s_t[QT_OPTIM_TILE * OPT_T_WORDS];
    __shared__ float s_amax[QT_OPTIM_THREADS / 32u];
    if (threadIdx.x == 0) s_mode = qt_optim_prepare(&a, &s_coef);
    __syncthreads();
    const uint32_t mode = s_mode;
    if (mode == 0) return;
    const qt_optim_coef c = s_coef;
    const uint32_t tiles_k = (a.cols + QT_OPTIM_TILE - 1u) / QT_OPTIM_TILE;
    const uint32_t r0 = block / tiles_k * QT_OPTIM_TILE;
    const uint32_t c0 = block % tiles_k * QT_OPTIM_TILE;
    const uint32_t cg = threadIdx.x & 15u, rg = threadIdx.x >> 4;
    const uint32_t col = c0 + 4u * cg;
    const uint32_t n = col < a.cols ? min(4u, a.cols - col) : 0u;
    const bool vec_rows = n == 4u && (a.cols & 3u) == 0;
    const uint64_t grad_align = a.grad_dtype == QT_DTYPE_BF16 ? 7u : 15u;
    const bool vec = vec_rows && ((a.master | a.m | a.v) & 15u) == 0 && (a.grad & grad_align) == 0;
    const bool update = (mode & QT_OPTIM_DO_UPDATE) != 0;

    float p[4][4], g[4][4], m[4][4], v[4][4];
#pragma unroll
    for (uint32_t q = 0; q < 4; q++) {
        const uint32_t row = r0 + 4u * rg + q;
        const uint32_t nq = row < a.rows ? n : 0u;
        const uint64_t i = (uint64_t)row * a.cols + col;
        opt_load4((const float *)a.master + i, nq, vec && nq != 0, p[q]);
        if (update) {
            opt_load_grad(a, i, nq, vec && nq != 0, g[q]);
            opt_load4((const float *)a.m + i, nq, vec && nq != 0, m[q]);
            opt_load4((const float *)a.v + i, nq, vec && nq != 0, v[q]);
        }
    }

    float amax = 0.0f;
    uint32_t codes[4] = {0, 0, 0, 0};
    const bool mxfp8_out = (mode & QT_OPTIM_DO_OUT) && a.out == QT_OPTIM_OUT_MXFP8;
#pragma unroll
    for (uint32_t q = 0; q < 4; q++) {
        const uint32_t row = r0 + 4u * rg + q;
        const bool live = row < a.rows && n != 0;
        const uint64_t i = (uint64_t)row * a.cols + col;
        if (live && update) {
#pragma unroll
            for (uint32_t j = 0; j < 4; j++) {
                qt_optim_adamw_elem(&c, g[q][j], &p[q][j], &m[q][j], &v[q][j]);
            }
            opt_store4((float *)a.master + i, n, vec, p[q]);
            opt_store4((float *)a.m + i, n, vec, m[q]);
            opt_store4((float *)a.v + i, n, vec, v[q]);
        }
        if (live && (mode & QT_OPTIM_DO_AMAX)) {
#pragma unroll
            for (uint32_t j = 0; j < 4; j++) {
                if (j < n) amax = qt_fp8_amax_step(amax, p[q][j]);
            }
        }
        if (mxfp8_out) {
            opt_store_mxfp8(a, p[q], row, col, n, cg, vec_rows, live);
        } else if (live && (mode & QT_OPTIM_DO_OUT)) {
            codes[q] = opt_store_out(a, c, i, n, vec_rows, p[q]);
        }
    }

    const bool fp8_out = (mode & QT_OPTIM_DO_OUT) && a.out == QT_OPTIM_OUT_FP8;
    if (fp8_out && a.weight_t != 0) opt_store_colwise(a, s_t, codes, r0, c0, cg, rg);
    if (mode & QT_OPTIM_DO_AMAX) opt_amax_block(a, amax, s_amax, r0);
    if (fp8_out && a.scale_inv != 0 && block == 0 && threadIdx.x == 0) {
        *(float *)a.scale_inv = qt_fp8_scale_inv(c.scale);
    }
}

extern "C" __global__ void __launch_bounds__(QT_OPTIM_THREADS)
    qt_optim_adamw(const __grid_constant__ optim_adamw_args a) {
    qt_grid_enter();
    opt_adamw_tile(a, blockIdx.x);
}

// The block's entry, with the launch's state, staged in shared memory by thread 0 (a binary
// search of a few global reads per block). Three blocks an SM (80 registers, no spill; two at
// the 87 the compiler picks alone): the update streams 28 bytes a parameter, and the H200's
// bandwidth needs more of them in flight than two blocks keep.
extern "C" __global__ void __launch_bounds__(QT_OPTIM_THREADS, 3)
    qt_optim_adamw_multi(const __grid_constant__ optim_multi_args m) {
    qt_grid_enter();
    __shared__ __align__(16) optim_multi_entry s_entry;
    if (threadIdx.x == 0) {
        const optim_multi_entry *entries = (const optim_multi_entry *)m.entries;
        s_entry = entries[qt_optim_entry_of(entries, m.count, blockIdx.x)];
        s_entry.args.state = m.state;
    }
    __syncthreads();
    opt_adamw_tile(s_entry.args, blockIdx.x - s_entry.first_block);
}

extern "C" __global__ void __launch_bounds__(QT_OPTIM_ZERO_THREADS)
    qt_optim_amax_zero(const __grid_constant__ optim_multi_args m) {
    qt_grid_enter();
    const optim_multi_entry *entries = (const optim_multi_entry *)m.entries;
    for (uint32_t i = threadIdx.x; i < m.count; i += blockDim.x) {
        const optim_multi_entry *e = &entries[i];
        if (!qt_optim_entry_zeroes(e)) continue;
        for (uint32_t w = 0; w < qt_optim_amax_words(&e->args); w++) {
            if (e->args.amax0 != 0) ((float *)e->args.amax0)[w] = 0.0f;
            if (e->args.amax1 != 0) ((float *)e->args.amax1)[w] = 0.0f;
        }
    }
}

extern "C" __global__ void __launch_bounds__(QT_OPTIM_DESCRIBE_THREADS)
    qt_optim_describe(const __grid_constant__ optim_describe_args a) {
    qt_grid_enter();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    *(optim_multi_entry *)a.entry = a.value;
}
