// C twins of ptx/gemm_portable.cu and ptx/gemm_sm90a.cu: the same GEMMs as plain loops, element
// by element, with the per-element decode, scale application, promotion and epilogue of gemm.h.
// Only the order of the FP32 accumulation differs from the kernels (sequential here; per-tensor
// FP8 and FP8 block keep the kernels' structure of 128-wide K blocks), so results agree within
// the tolerances of tests/test_gemm.c and exactly when every partial sum is exact.
#include <stdbool.h>

#include "ref.h"
#include "status.h"  // QT_ASSERT

// One operand as seen for one member: member-shifted bases plus the descriptor.
typedef struct ref_gemm_side {
    const gemm_operand *op;
    const uint8_t *data;
    const uint8_t *scale;
} ref_gemm_side;

static ref_gemm_side ref_gemm_side_of(const gemm_operand *op, uint32_t member) {
    ref_gemm_side s = {op, REF_PTR(const uint8_t, op->data) + member * op->data_member_bytes,
                       REF_PTR(const uint8_t, op->scale) + member * op->scale_member_bytes};
    return s;
}

// The value the tensor cores multiply for element (r, k): bf16 values, fp8 code values (their
// scales are applied later), mxfp8 and nvfp4 decoded and rounded to bf16.
static float ref_gemm_value(uint32_t format, const ref_gemm_side *s, uint64_t r, uint64_t k) {
    const gemm_operand *op = s->op;
    bool outer = (op->flags & GEMM_OPERAND_OUTER_MAJOR) != 0;
    uint64_t index = outer ? k * op->ld + r : r * op->ld + k;
    switch (format) {
    case GEMM_FORMAT_BF16:
        return qt_bf16_to_f32(((const uint16_t *)s->data)[index]);
    case GEMM_FORMAT_FP8:
    case GEMM_FORMAT_FP8_BLOCK:
        return qt_gemm_fp8_value(s->data[index], op->elem);
    case GEMM_FORMAT_MXFP8: {
        uint8_t e = s->scale[qt_gemm_scale_index(format, op->flags, r, k / GEMM_BLOCK_MXFP8,
                                                 op->scale_ld)];
        return qt_gemm_round_bf16(qt_gemm_mxfp8_decode(s->data[index], op->elem, e));
    }
    case GEMM_FORMAT_NVFP4: {
        QT_ASSERT(!outer);
        uint8_t byte = s->data[r * (op->ld / 2) + k / 2];
        uint8_t nibble = (uint8_t)((byte >> (4 * (k & 1))) & 0xFu);
        uint8_t sb = s->scale[qt_gemm_scale_index(format, op->flags, r, k / GEMM_BLOCK_NVFP4,
                                                  op->scale_ld)];
        return qt_gemm_round_bf16(qt_gemm_nvfp4_decode(nibble, sb));
    }
    default:
        QT_ASSERT(false);
        return 0.0f;
    }
}

static float ref_gemm_block_scale(const ref_gemm_side *s, uint64_t r, uint64_t kb) {
    const float *scales = (const float *)s->scale;
    return scales[qt_gemm_scale_index(GEMM_FORMAT_FP8_BLOCK, s->op->flags, r, kb,
                                      s->op->scale_ld)];
}

// sum_k A(m, k) B(n, k) over [k_begin, k_end), accumulated as the format's kernel structures it.
static float ref_gemm_dot(const gemm_args *a, const ref_gemm_side *sa, const ref_gemm_side *sb,
                          uint64_t m, uint64_t n, uint32_t k_begin, uint32_t k_end) {
    bool block = a->format == GEMM_FORMAT_FP8_BLOCK;
    bool split = block || (a->format == GEMM_FORMAT_FP8 &&
                           (a->flags & GEMM_FLAG_SPLIT_ACCUMULATE) != 0);
    float acc = 0.0f;
    if (!split) {
        for (uint32_t k = k_begin; k < k_end; k++) {
            acc += ref_gemm_value(a->format, sa, m, k) * ref_gemm_value(a->format, sb, n, k);
        }
        return acc;
    }
    QT_ASSERT(!block || k_begin % GEMM_BLOCK_FP8 == 0);
    for (uint32_t k0 = k_begin; k0 < k_end; k0 += GEMM_SPLIT_K) {
        uint32_t k1 = k_end - k0 < GEMM_SPLIT_K ? k_end : k0 + GEMM_SPLIT_K;
        float partial = 0.0f;
        for (uint32_t k = k0; k < k1; k++) {
            partial += ref_gemm_value(a->format, sa, m, k) * ref_gemm_value(a->format, sb, n, k);
        }
        if (block) {
            uint64_t kb = k0 / GEMM_BLOCK_FP8;
            acc = qt_gemm_promote(acc, partial, ref_gemm_block_scale(sa, m, kb),
                                  ref_gemm_block_scale(sb, n, kb));
        } else {
            acc = qt_gemm_split_add(acc, partial);
        }
    }
    return acc;
}

static float ref_gemm_load(uint64_t address, uint64_t index, uint32_t dtype) {
    if (dtype == QT_DTYPE_BF16) return qt_bf16_to_f32(REF_PTR(const uint16_t, address)[index]);
    return REF_PTR(const float, address)[index];
}

static void ref_gemm_store(uint64_t address, uint64_t index, uint32_t dtype, float v) {
    if (dtype == QT_DTYPE_BF16) {
        REF_PTR(uint16_t, address)[index] = qt_f32_to_bf16(v);
    } else {
        REF_PTR(float, address)[index] = v;
    }
}

// Rows [m_begin, m_end) of one member's D, of which rows from m_valid_end on are padding (zeros).
typedef struct ref_gemm_part {
    uint32_t member;
    uint32_t m_begin, m_end, m_valid_end;
    uint32_t k_begin, k_end;
} ref_gemm_part;

static void ref_gemm_rows(const gemm_args *a, const ref_gemm_part *part) {
    ref_gemm_side sa = ref_gemm_side_of(&a->a, part->member);
    ref_gemm_side sb = ref_gemm_side_of(&a->b, part->member);
    uint64_t d = a->d + part->member * a->d_member_bytes;
    uint64_t c = a->c + part->member * a->d_member_bytes;
    uint64_t bias = a->bias + part->member * a->bias_member_bytes;
    int has_c = a->c != 0 && a->beta != 0.0f;
    int has_bias = a->bias != 0;
    float alpha = qt_gemm_alpha(a, part->member);
    for (uint32_t m = part->m_begin; m < part->m_end; m++) {
        for (uint32_t n = 0; n < a->n; n++) {
            uint64_t index = (uint64_t)m * a->ldd + n;
            float v = 0.0f;
            if (m < part->m_valid_end) {
                float acc = ref_gemm_dot(a, &sa, &sb, m, n, part->k_begin, part->k_end);
                float cv = has_c ? ref_gemm_load(c, index, a->d_dtype) : 0.0f;
                float bv = has_bias ? ref_gemm_load(bias, n, a->bias_dtype) : 0.0f;
                v = qt_gemm_epilogue(acc, alpha, has_c, a->beta, cv, has_bias, bv);
            }
            ref_gemm_store(d, index, a->d_dtype, v);
        }
    }
}

static void ref_gemm(const gemm_args *a) {
    const uint32_t *off = REF_PTR(const uint32_t, a->group.row_offsets);
    const uint32_t *first_dims = REF_PTR(const uint32_t, a->group.first_dims);
    if (a->grouping == GEMM_DENSE) {
        ref_gemm_part part = {0, 0, a->m, a->m, 0, a->k};
        ref_gemm_rows(a, &part);
        return;
    }
    for (uint32_t i = 0; i < a->group.count; i++) {
        ref_gemm_part part = {i, 0, a->m, a->m, 0, a->k};
        if (a->grouping == GEMM_GROUP_M) {
            part.m_begin = off[i];
            part.m_end = off[i + 1] < a->m ? off[i + 1] : a->m;
            part.m_valid_end = off[i] + first_dims[i] < part.m_end ? off[i] + first_dims[i]
                                                                    : part.m_end;
        } else {
            part.k_begin = off[i];
            part.k_end = off[i] + first_dims[i];
        }
        ref_gemm_rows(a, &part);
    }
}

void ref_qt_gemm_bf16_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_BF16);
    ref_gemm(a);
}

void ref_qt_gemm_fp8_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_FP8);
    ref_gemm(a);
}

void ref_qt_gemm_fp8_block_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_FP8_BLOCK);
    ref_gemm(a);
}

void ref_qt_gemm_mxfp8_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_MXFP8);
    ref_gemm(a);
}

void ref_qt_gemm_nvfp4_portable(const gemm_args *a, const launch_shape *shape) {
    (void)shape;
    QT_ASSERT(a->format == GEMM_FORMAT_NVFP4);
    ref_gemm(a);
}

// The order of qt_gemm_bias_grad_add's comment: 32-row chunks in order, each summed in row order.
void ref_qt_gemm_bias_grad(const gemm_bias_grad_args *a, const launch_shape *shape) {
    (void)shape;
    uint32_t members = a->group.count ? a->group.count : 1u;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t r_begin = 0, r_end = a->rows;
        if (a->group.count) {
            r_begin = REF_PTR(const uint32_t, a->group.row_offsets)[i];
            r_end = r_begin + REF_PTR(const uint32_t, a->group.first_dims)[i];
        }
        for (uint32_t col = 0; col < a->cols; col++) {
            float total = 0.0f;
            for (uint32_t r0 = r_begin; r0 < r_end; r0 += GEMM_BGRAD_CHUNK_ROWS) {
                uint32_t r1 = r_end - r0 < GEMM_BGRAD_CHUNK_ROWS ? r_end
                                                                 : r0 + GEMM_BGRAD_CHUNK_ROWS;
                float p = 0.0f;
                for (uint32_t r = r0; r < r1; r++) {
                    p = qt_gemm_bias_grad_add(p, ref_gemm_load(a->dy, (uint64_t)r * a->ld + col,
                                                               a->dtype));
                }
                total = qt_gemm_bias_grad_add(total, p);
            }
            REF_PTR(float, a->out)[(uint64_t)i * a->cols + col] = total;
        }
    }
}

// The decode table's values: gemm.h's decode, rounded to BF16 as the twins above do.
void ref_qt_gemm_decode_table(const gemm_decode_table_args *a, const launch_shape *shape) {
    (void)shape;
    uint16_t *out = REF_PTR(uint16_t, a->out);
    uint32_t codes = GEMM_DECODE_TABLE_CODES(a->path);
    for (uint32_t scale = 0; scale < 256; scale++) {
        for (uint32_t code = 0; code < codes; code++) {
            float v = a->path == GEMM_DECODE_NVFP4
                          ? qt_gemm_nvfp4_decode((uint8_t)code, (uint8_t)scale)
                          : qt_gemm_mxfp8_decode((uint8_t)code, a->elem, (uint8_t)scale);
            out[scale * codes + code] = qt_f32_to_bf16(v);
        }
    }
}

// The sm_90a tier computes the same GEMMs (ptx/gemm_sm90a.cu); its args start with gemm_args.
void ref_qt_gemm_bf16_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_bf16_portable(&a->gemm, shape);
}

void ref_qt_gemm_fp8_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_fp8_portable(&a->gemm, shape);
}

void ref_qt_gemm_fp8_block_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_fp8_block_portable(&a->gemm, shape);
}

void ref_qt_gemm_mxfp8_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_mxfp8_portable(&a->gemm, shape);
}

void ref_qt_gemm_nvfp4_sm90a(const gemm_sm90a_args *a, const launch_shape *shape) {
    ref_qt_gemm_nvfp4_portable(&a->gemm, shape);
}
