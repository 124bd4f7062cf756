// NVFP4 tests. CPU: the fast E2M1 encoder against the codec, hand-derived global and block
// scales and codes, dequantization error bounds, the RHT (orthogonality,
// agreement with an exact product), the 2-D transpose property, grouped padding rules, stochastic
// rounding statistics and keying. GPU: the same programs on the GPU and the reference backend,
// every output compared byte for byte (amaxes, codes, scales, dequantized values), dense and
// grouped, BF16 and FP32, with planted edge values.
#include <math.h>

#include "runtime/ops/op_core.h"         // op_fill_random
#include "runtime/ops/op_quant_nvfp4.h"  // op_nvfp4_*
#include "runtime/ref/ref.h"             // ref_qt_nvfp4_* (CPU tests call the twins directly)
#include "tests/rig.h"
#include "tests/test.h"

#define HOST(ptr) ((uint64_t)(uintptr_t)(ptr))

static uint64_t lcg_state;
static uint32_t lcg_next(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(lcg_state >> 33);
}
static float lcg_normal(void) {  // rough normal: sum of 4 uniforms, centred
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)(lcg_next() & 0xFFFFFF) / 16777216.0f;
    return (s - 2.0f) * 1.7320508f;
}

// ---------------------------------------------------------------------------------------------
// Host harness for the twins: one tensor with all its outputs in malloc'd memory.

typedef struct hq {
    uint32_t rows, cols, dtype, count;
    void *x;
    uint32_t *offsets, *first_dims;
    float *amax_row, *amax_col;
    uint8_t *row_data, *row_scales, *col_data, *col_scales;
    op_nvfp4_sizes sizes;
    uint64_t step;
} hq;

static void hq_init(hq *h, uint32_t rows, uint32_t cols, uint32_t dtype, uint32_t count) {
    memset(h, 0, sizeof *h);
    h->rows = rows;
    h->cols = cols;
    h->dtype = dtype;
    h->count = count;
    h->sizes = op_nvfp4_sizes_of(rows, cols, count);
    h->x = calloc((size_t)rows * cols + 1, dtype == QT_DTYPE_F32 ? 4 : 2);
    h->offsets = calloc(count + 2, 4);
    h->first_dims = calloc(count + 1, 4);
    h->amax_row = calloc(h->sizes.amax, 1);
    h->amax_col = calloc(h->sizes.amax, 1);
    h->row_data = calloc(h->sizes.row_data + 1, 1);
    h->row_scales = calloc(h->sizes.row_scales + 1, 1);
    h->col_data = calloc(h->sizes.col_data + 1, 1);
    h->col_scales = calloc(h->sizes.col_scales + 1, 1);
}

static void hq_free(hq *h) {
    free(h->x);
    free(h->offsets);
    free(h->first_dims);
    free(h->amax_row);
    free(h->amax_col);
    free(h->row_data);
    free(h->row_scales);
    free(h->col_data);
    free(h->col_scales);
}

static void hq_set(hq *h, uint32_t row, uint32_t col, float v) {
    uint64_t i = (uint64_t)row * h->cols + col;
    if (h->dtype == QT_DTYPE_F32) {
        ((float *)h->x)[i] = v;
    } else {
        ((uint16_t *)h->x)[i] = qt_f32_to_bf16(v);
    }
}

static float hq_get(const hq *h, uint32_t row, uint32_t col) {
    uint64_t i = (uint64_t)row * h->cols + col;
    if (h->dtype == QT_DTYPE_F32) return ((const float *)h->x)[i];
    return qt_bf16_to_f32(((const uint16_t *)h->x)[i]);
}

static qt_group_desc hq_group(const hq *h) {
    qt_group_desc g = {h->count ? HOST(h->offsets) : 0, h->count ? HOST(h->first_dims) : 0,
                       h->count, 0};
    return g;
}

static const launch_shape hq_shape = {{1, 1, 1}, {1, 1, 1}, 0};

static void hq_amax(hq *h, uint32_t flags, uint32_t signs) {
    nvfp4_amax_args a = {HOST(h->x), HOST(h->amax_row), HOST(h->amax_col), hq_group(h),
                         h->rows, h->cols, h->dtype, flags | QT_NVFP4_COLWISE, signs, 0};
    ref_qt_nvfp4_amax_zero(&a, &hq_shape);
    ref_qt_nvfp4_amax(&a, &hq_shape);
}

static void hq_quant(hq *h, uint32_t flags, uint32_t signs, uint64_t seed, uint32_t tensor_id) {
    nvfp4_quantize_args a = {HOST(h->x), HOST(h->row_data), HOST(h->row_scales),
                             HOST(h->col_data), HOST(h->col_scales), HOST(h->amax_row),
                             HOST(h->amax_col), HOST(&h->step), seed, hq_group(h), h->rows,
                             h->cols, h->dtype, flags, signs, tensor_id};
    ref_qt_nvfp4_quantize(&a, &hq_shape);
}

static void hq_dequant(hq *h, bool colwise, float *out) {
    nvfp4_dequantize_args a = {HOST(colwise ? h->col_data : h->row_data),
                               HOST(colwise ? h->col_scales : h->row_scales),
                               HOST(colwise ? h->amax_col : h->amax_row), HOST(out),
                               hq_group(h), h->rows, h->cols, QT_DTYPE_F32, colwise ? 1u : 0u};
    ref_qt_nvfp4_dequantize(&a, &hq_shape);
}

static uint8_t nib(const uint8_t *data, uint64_t pitch, uint32_t row, uint32_t pos) {
    return (uint8_t)((data[(uint64_t)row * pitch + pos / 2] >> (4 * (pos & 1))) & 0xF);
}

// ---------------------------------------------------------------------------------------------
// CPU tests.

static void check_e2m1(uint32_t bits, uint64_t *mismatches) {
    float y = qt_bits_f32(bits);
    uint32_t fast = qt_nvfp4_e2m1_rn(y), slow = qt_f32_to_e2m1(y);
    if (fast != slow && (*mismatches)++ < 8) {
        CHECK(false, "y = %a (%08x): fast %x, codec %x", (double)y, bits, fast, slow);
    }
}

static void test_e2m1_matches_codec(void) {
    test_begin("e2m1_rn_matches_codec");
    uint64_t mismatches = 0;
    // Every pattern of the binades 2^-8 .. 2^9 (every threshold and tie lives there), both signs.
    for (uint32_t e = 119; e <= 136; e++) {
        for (uint32_t m = 0; m < (1u << 23); m++) {
            check_e2m1((e << 23) | m, &mismatches);
            check_e2m1(0x80000000u | (e << 23) | m, &mismatches);
        }
    }
    // Every other binade (subnormals, huge, Inf, NaN payloads) at edge and random mantissas.
    const uint32_t edges[] = {0, 1, 2, 0x200000, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF};
    lcg_state = 1;
    for (uint32_t e = 0; e < 256; e++) {
        for (int s = 0; s < 2; s++) {
            uint32_t base = (s ? 0x80000000u : 0u) | (e << 23);
            for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
                check_e2m1(base | edges[i], &mismatches);
            }
            for (int i = 0; i < 4096; i++) check_e2m1(base | (lcg_next() & 0x7FFFFF), &mismatches);
        }
    }
    CHECK(mismatches == 0, "%llu mismatches", (unsigned long long)mismatches);
    test_end();
}

static void test_fast_paths_match_codec(void) {
    test_begin("fast_e4m3_and_encode8_match_codec");
    uint64_t bad = 0;
    // E4M3 encoder: every non-negative pattern of the binades 2^-27 .. 2^13 (the subnormal
    // steps, every normal binade, saturation), then edges and samples of all other exponents.
    for (uint32_t e = 100; e <= 140; e++) {
        for (uint32_t m = 0; m < (1u << 23); m++) {
            float d = qt_bits_f32((e << 23) | m);
            if (qt_nvfp4_e4m3_nonneg(d) != qt_f32_to_e4m3(d) && bad++ < 8) {
                CHECK(false, "e4m3 %a: fast %02x codec %02x", (double)d, qt_nvfp4_e4m3_nonneg(d),
                      qt_f32_to_e4m3(d));
            }
        }
    }
    lcg_state = 9;
    for (uint32_t e = 0; e < 256; e++) {
        for (int i = 0; i < 4096; i++) {
            uint32_t mant = i == 0 ? 0 : (i == 1 ? 0x7FFFFF : lcg_next() & 0x7FFFFF);
            if (e == 255 && mant != 0) continue;  // NaN is outside the domain
            float d = qt_bits_f32((e << 23) | mant);
            if (qt_nvfp4_e4m3_nonneg(d) != qt_f32_to_e4m3(d) && bad++ < 8) {
                CHECK(false, "e4m3 %a: fast %02x codec %02x", (double)d, qt_nvfp4_e4m3_nonneg(d),
                      qt_f32_to_e4m3(d));
            }
        }
    }
    // E4M3 decoder: every code of the domain.
    for (uint32_t c = 0; c <= 0x7E; c++) {
        CHECK(qt_f32_bits(qt_nvfp4_e4m3_value((uint8_t)c)) ==
                  qt_f32_bits(qt_e4m3_to_f32((uint8_t)c)),
              "e4m3 decode %02x", c);
    }
    // The packed encoder against the element encoder, on values around every grid point and
    // threshold, specials, and random multipliers.
    const float specials[] = {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f,
                              -6.0f, 7.0f, qt_bits_f32(0x7FC00000u), qt_bits_f32(0xFFC00000u),
                              qt_bits_f32(0x7F800000u), qt_bits_f32(0xFF800000u), 1e-40f, -3e38f};
    const uint32_t n_specials = sizeof specials / sizeof specials[0];
    for (int trial = 0; trial < 200000; trial++) {
        float v[8];
        float m = trial % 3 == 0 ? 1.0f : ldexpf(1.0f + (float)(lcg_next() % 1000) / 1000, -2);
        for (int j = 0; j < 8; j++) {
            uint32_t r = lcg_next();
            v[j] = r % 4 == 0 ? specials[r / 4 % n_specials]
                              : qt_bits_f32(qt_f32_bits(specials[r / 4 % 10] / m) +
                                            (uint32_t)(lcg_next() % 5) - 2u);
        }
        uint32_t packed = qt_nvfp4_encode8(v, m), expect = 0;
        for (int j = 0; j < 8; j++) expect |= qt_f32_to_e2m1(v[j] * m) << (4 * j);
        if (packed != expect && bad++ < 8) {
            CHECK(false, "encode8 trial %d: %08x, expected %08x", trial, packed, expect);
        }
    }
    CHECK(bad == 0, "%llu mismatches", (unsigned long long)bad);
    test_end();
}

// The fast block encoder's magnitude function on every FP32 value of its domain [0, 7) (the
// binades from 2^-3 up exhaustively, every threshold and tie lives there; below 0.125 the code is
// 0, checked on every 64th pattern).
static void test_fast_e2m1_exhaustive(void) {
    test_begin("fast_e2m1_magnitude_exhaustive");
    uint64_t bad = 0;
    for (uint32_t bits = 0; bits < 0x40E00000u; bits += bits < 0x3E000000u ? 64u : 1u) {
        float a = qt_bits_f32(bits);
        uint32_t got = qt_nvfp4_e2m1_biased(a) - QT_NVFP4_MAGIC_BITS;
        uint32_t want = qt_f32_to_e2m1(a) & 7u;
        if (got != want && bad++ < 8) CHECK(false, "a = %a (%08x): %u, codec %u", (double)a, bits,
                                            got, want);
    }
    CHECK(bad == 0, "%llu mismatches", (unsigned long long)bad);
    test_end();
}

// A random BF16 value: mostly normal data of a random scale, with zeros, -0, subnormals, huge
// values, +-Inf and NaNs mixed in at the given rate (per mille).
static uint16_t rand_bf16(int scale, uint32_t special_per_mille) {
    static const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8012, 0x0080, 0x7F7F,
                                        0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x3E80};
    if (lcg_next() % 1000 < special_per_mille) {
        return specials[lcg_next() % (sizeof specials / sizeof specials[0])];
    }
    return qt_f32_to_bf16(ldexpf(lcg_normal(), scale));
}

// The reference backend's branch-free stochastic rounding against the codec: every byte r8 with
// samples of every FP32 exponent and sign (NaN, Inf, subnormals included); a dense sweep of the
// magnitudes that land on the grid, [2^-2, 8) (every 16th pattern, a few bytes each); and, for
// every byte, the patterns around each magnitude a whose fma(u, s(a), a) hits a grid point or a
// step boundary exactly. Then whole blocks: the select encoder's words equal the codec's.
static uint64_t sr_mismatch(float y, uint32_t r8, uint64_t bad) {
    uint32_t got = qt_nvfp4_e2m1_sr_select(y, r8), want = qt_f32_to_e2m1_sr(y, r8);
    if (got != want && bad < 8) {
        CHECK(false, "y = %a (%08x), r8 %u: select %x, codec %x", (double)y, qt_f32_bits(y), r8,
              got, want);
    }
    return bad + (got != want);
}

// The codec's stochastic rounding of a block, element j with random byte j of r: the oracle of
// qt_nvfp4_encode16_sr_select.
static void nv_encode16_sr_codec(const float v[16], float m, qt_philox4 r, uint32_t out[2]) {
    out[0] = out[1] = 0;
    for (uint32_t j = 0; j < 16; j++) {
        out[j / 8] |= (uint32_t)qt_f32_to_e2m1_sr(v[j] * m, qt_quant_random_byte(r, j))
                      << (4 * (j % 8));
    }
}

static void test_sr_select(void) {
    test_begin("sr_select_matches_codec");
    uint64_t bad = 0;
    for (uint32_t r8 = 0; r8 < 256; r8++) {
        for (uint32_t i = 0; i < (1u << 16); i++) {
            bad = sr_mismatch(qt_bits_f32(i * 0x10001u + r8 * 0x3B1u), r8, bad);
        }
    }
    lcg_state = 17;
    for (uint32_t bits = 0x3E800000u; bits < 0x41000000u; bits += 16) {
        uint32_t r8[4] = {0, 255, lcg_next() & 0xFFu, lcg_next() & 0xFFu};
        for (int j = 0; j < 4; j++) {
            bad = sr_mismatch(qt_bits_f32(bits), r8[j], bad);
            bad = sr_mismatch(-qt_bits_f32(bits), r8[j], bad);
        }
    }
    const float targets[] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f};
    const float steps[] = {0.5f, 1.0f, 2.0f};
    for (uint32_t r8 = 0; r8 < 256; r8++) {
        float u = (float)r8 * 0.00390625f;
        for (size_t g = 0; g < sizeof targets / sizeof targets[0]; g++) {
            for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
                uint32_t center = qt_f32_bits(targets[g] - u * steps[k]);
                for (uint32_t d = 0; d <= 128; d++) {
                    bad = sr_mismatch(qt_bits_f32(center + d - 64), r8, bad);
                }
            }
        }
    }
    for (int b = 0; b < 20000; b++) {
        float v[16];
        for (int j = 0; j < 16; j++) {
            v[j] = qt_bf16_to_f32(rand_bf16((int)(lcg_next() % 9) - 4, 20));
        }
        float m = qt_bits_f32(0x3E000000u + (lcg_next() & 0x03FFFFFFu));
        qt_philox4 r = qt_quant_random16(lcg_next(), lcg_next(), lcg_next(), lcg_next(), 0);
        uint32_t got[2], want[2];
        qt_nvfp4_encode16_sr_select(v, m, r, got);
        nv_encode16_sr_codec(v, m, r, want);
        if ((got[0] != want[0] || got[1] != want[1]) && bad++ < 8) {
            CHECK(false, "block %d: select %08x %08x, codec %08x %08x", b, got[0], got[1],
                  want[0], want[1]);
        }
    }
    CHECK(bad == 0, "%llu mismatches", (unsigned long long)bad);
    test_end();
}

// The packed BF16 encoder, the FP32 fast encoder and the packed amax against the generic path,
// on blocks quantized the way the kernels do (global amax, block scale, table multiplier), and
// the bound |RN(x m_b)| < 7 on which the fast encoder relies, over global amaxes from tiny to
// huge, and block amaxes above the global one.
static void test_fast_block_encoder(void) {
    test_begin("fast_block_encoder_matches_generic");
    lcg_state = 21;
    uint64_t bad = 0, fast_blocks = 0, slow_blocks = 0;
    double worst = 0;
    for (int trial = 0; trial < 300000; trial++) {
        const int scale = (int)(lcg_next() % 200) - 100;
        uint32_t w[8];
        float v[16];
        for (int j = 0; j < 16; j++) {
            uint16_t h = rand_bf16(scale, trial % 4 == 0 ? 60 : 0);
            v[j] = qt_bf16_to_f32(h);
            w[j / 2] = j % 2 ? (w[j / 2] | (uint32_t)h << 16) : h;
        }
        float amax_b = 0;
        int nan = 0;
        for (int j = 0; j < 16; j++) {
            amax_b = qt_nvfp4_absmax(amax_b, v[j]);
            nan |= qt_f32_is_nan(v[j]);
        }
        const float packed_amax = qt_nvfp4_absmax16_bf16(w);
        if (nan ? !qt_f32_is_nan(packed_amax) : packed_amax != amax_b) {
            if (bad++ < 8) CHECK(false, "trial %d: packed amax %a, amax %a", trial,
                                 (double)packed_amax, (double)amax_b);
        }
        // Global amax: around the block's, or far from it (tiny / huge, S_enc clamped).
        float global = amax_b * ldexpf(1.0f + (float)(lcg_next() % 64) / 16, (int)(lcg_next() % 5));
        if (trial % 7 == 1) global = ldexpf(1.0f, (int)(lcg_next() % 250) - 125);
        if (trial % 11 == 2) global = amax_b * 0.75f;  // block above the global amax
        const qt_nvfp4_scale s = qt_nvfp4_scale_of(global);
        const uint8_t sb = qt_nvfp4_block_scale(amax_b, s);
        const float m = qt_nvfp4_block_mult(sb, s.s_dec);
        uint32_t generic[2], fast[2], packed[2];
        qt_nvfp4_encode16(v, m, generic);
        if (nan || !qt_nvfp4_fast_ok(sb)) {
            slow_blocks++;
            continue;
        }
        fast_blocks++;
        for (int j = 0; j < 16; j++) worst = fmax(worst, fabs((double)(v[j] * m)));
        qt_nvfp4_encode16_fast(v, m, fast);
        qt_nvfp4_encode16_bf16(w, m, packed);
        if ((fast[0] != generic[0] || fast[1] != generic[1] || packed[0] != generic[0] ||
             packed[1] != generic[1]) && bad++ < 8) {
            CHECK(false, "trial %d (sb %02x, m %a): generic %08x %08x fast %08x %08x packed "
                  "%08x %08x", trial, sb, (double)m, generic[0], generic[1], fast[0], fast[1],
                  packed[0], packed[1]);
        }
    }
    CHECK(worst < 6.41, "|x m_b| reached %g on the fast path", worst);
    CHECK(fast_blocks > 100000 && slow_blocks > 1000, "fast %llu, slow %llu blocks",
          (unsigned long long)fast_blocks, (unsigned long long)slow_blocks);
    // The sign placement and the pack on every sign pattern of 8 elements.
    for (uint32_t pattern = 0; pattern < 256; pattern++) {
        uint32_t w[4], b[8], expect = 0;
        for (int j = 0; j < 8; j++) {
            uint16_t h = (uint16_t)((pattern >> j & 1u) << 15 | (0x3F80u + 0x40u * (uint32_t)j));
            w[j / 2] = j % 2 ? (w[j / 2] | (uint32_t)h << 16) : h;
            b[j] = QT_NVFP4_MAGIC_BITS + (uint32_t)j % 8;
            expect |= ((uint32_t)j % 8 | (pattern >> j & 1u) << 3) << (4 * j);
        }
        uint32_t got = qt_nvfp4_signs_bf16(qt_nvfp4_pack8(b), w);
        CHECK(got == expect, "signs %02x: %08x, expected %08x", pattern, got, expect);
    }
    // The E4M3 pair converter against the element one.
    for (int i = 0; i < 100000; i++) {
        float d0 = qt_bits_f32(lcg_next() & 0x7FFFFFFFu), d1 = ldexpf(lcg_normal(), -12);
        d1 = fabsf(d1);
        if (qt_f32_is_nan(d0)) continue;
        uint32_t pair = qt_nvfp4_e4m3x2(d0, d1);
        CHECK(pair == (qt_nvfp4_e4m3_nonneg(d0) | (uint32_t)qt_nvfp4_e4m3_nonneg(d1) << 8),
              "e4m3x2 %a %a: %04x", (double)d0, (double)d1, pair);
        if (i > 16 && bad) break;
    }
    CHECK(bad == 0, "%llu mismatches", (unsigned long long)bad);
    test_end();
}

// The RHT with the fused first stage equals the reference order bit for bit on BF16 inputs
// (every input times 1/4 is exact), specials and subnormals included, for both sign masks.
static void test_rht_bf16_fused(void) {
    test_begin("rht_bf16_fused_stage_matches");
    lcg_state = 23;
    uint64_t bad = 0;
    for (int trial = 0; trial < 200000; trial++) {
        const int scale = trial % 3 ? (int)(lcg_next() % 40) - 20 : (int)(lcg_next() % 260) - 130;
        float v[16], y[16], z[16];
        for (int j = 0; j < 16; j++) {
            v[j] = qt_bf16_to_f32(rand_bf16(scale, trial % 5 == 0 ? 100 : 0));
            y[j] = z[j] = v[j];
        }
        const uint32_t signs = trial % 2 ? QT_NVFP4_RHT_SIGNS_TE : lcg_next() & 0xFFFFu;
        qt_nvfp4_rht16(y, signs);
        qt_nvfp4_rht16_bf16in(z, signs);
        for (int j = 0; j < 16; j++) {
            bool same = qt_f32_bits(y[j]) == qt_f32_bits(z[j]);
            if (!same && bad++ < 8) {
                CHECK(false, "trial %d j %d: %08x vs fused %08x", trial, j, qt_f32_bits(y[j]),
                      qt_f32_bits(z[j]));
            }
        }
        // The packed rounding gives the same BF16 bits (NaN too: 0x7FFF).
        float u[16];
        uint32_t packed[8];
        memcpy(u, v, sizeof u);
        qt_nvfp4_rht16_bf16in_f32(u, signs);
        qt_nvfp4_pack_bf16(u, packed);
        for (int j = 0; j < 16; j++) {
            uint32_t hi = j % 2 ? packed[j / 2] & 0xFFFF0000u : packed[j / 2] << 16;
            if (hi != qt_f32_bits(z[j]) && bad++ < 8) {
                CHECK(false, "trial %d j %d: packed %08x", trial, j, hi);
            }
        }
    }
    CHECK(bad == 0, "%llu mismatches", (unsigned long long)bad);
    test_end();
}

// A zero RHT output is +0, whatever the signs of the zeros that meet in the butterflies: groups
// of +-0 in every sign pattern and mask, groups where nonzero values cancel next to -0, through
// both forms of the transform (FP32 and the fused BF16 one, rounded as each kernel path rounds);
// and the twin's codes of an all -0 group in a quantized tensor are 0x0, not the -0 code 0x8.
static bool rht_has_negative_zero(const float v[16], uint32_t signs) {
    float y[16], z[16], u[16];
    uint32_t packed[8];
    memcpy(y, v, sizeof y);
    memcpy(z, v, sizeof z);
    memcpy(u, v, sizeof u);
    qt_nvfp4_rht16(y, signs);
    qt_nvfp4_rht16_bf16in(z, signs);
    qt_nvfp4_rht16_bf16in_f32(u, signs);
    qt_nvfp4_pack_bf16(u, packed);
    bool negative_zero = false;
    for (int j = 0; j < 16; j++) {
        uint16_t h = (uint16_t)(packed[j / 2] >> (16 * (j % 2)));
        negative_zero |= qt_f32_bits(y[j]) == 0x80000000u || qt_f32_bits(z[j]) == 0x80000000u ||
                         h == 0x8000u;
    }
    return negative_zero;
}

static void test_rht_signed_zero(void) {
    test_begin("rht_zero_output_is_plus_zero");
    lcg_state = 29;
    uint32_t bad = 0;
    for (int trial = 0; trial < 20000; trial++) {
        const uint32_t signs = trial % 3 == 0   ? QT_NVFP4_RHT_SIGNS_TE
                               : trial % 3 == 1 ? 0u
                                                : lcg_next() & 0xFFFFu;
        const uint32_t zero_signs = trial < 16 ? (trial % 2 ? 0xFFFFu : 1u << trial) : lcg_next();
        float v[16];
        for (int j = 0; j < 16; j++) v[j] = (zero_signs >> j) & 1u ? -0.0f : 0.0f;
        if (trial % 4 == 3) {  // two equal values that cancel in half of the outputs
            const int a = (int)(lcg_next() % 16), b = (a + 1 + (int)(lcg_next() % 15)) % 16;
            v[a] = v[b] = 1.5f;
        }
        if (rht_has_negative_zero(v, signs) && bad++ < 8) {
            CHECK(false, "trial %d: signs %04x, zeros %04x: an output is -0", trial, signs,
                  zero_signs & 0xFFFFu);
        }
    }
    CHECK(bad == 0, "%u groups with a -0 output", bad);
    for (uint32_t dtype = QT_DTYPE_F32; dtype <= QT_DTYPE_BF16; dtype++) {
        for (int mask = 0; mask < 2; mask++) {
            const uint32_t signs = mask ? QT_NVFP4_RHT_SIGNS_TE : 0u;
            hq h;
            hq_init(&h, 32, 3, dtype, 0);
            for (uint32_t r = 0; r < 32; r++) {  // column 1: -0 in rows 0..15, then data
                hq_set(&h, r, 0, 1.0f + (float)r);
                hq_set(&h, r, 1, r < 16 ? -0.0f : (float)r - 20.0f);
                hq_set(&h, r, 2, -0.0f);
            }
            hq_amax(&h, QT_NVFP4_RHT, signs);
            hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_COLWISE | QT_NVFP4_RHT, signs, 0, 0);
            const uint64_t pitch = (h.rows + 1) / 2;
            for (uint32_t m = 0; m < 32; m++) {
                const uint8_t c1 = nib(h.col_data, pitch, 1, m), c2 = nib(h.col_data, pitch, 2, m);
                CHECK(m >= 16 || c1 == 0, "dtype %u mask %d: column 1 position %u: 0x%x", dtype,
                      mask, m, c1);
                CHECK(c2 == 0, "dtype %u mask %d: column 2 position %u: 0x%x", dtype, mask, m, c2);
            }
            hq_free(&h);
        }
    }
    test_end();
}

// Dequantized NaN is the canonical 0x7FFFFFFF on both backends: amax +Inf with a zero scale byte
// (0 * Inf) and with a non-zero one times code 0 (Inf scale * 0).
static void test_dequant_nan(void) {
    test_begin("dequantize_nan_is_canonical");
    const float inf = qt_bits_f32(0x7F800000u);
    CHECK(qt_f32_bits(qt_nvfp4_dequant_value(0x3, 0x00, inf)) == 0x7FFFFFFFu, "0 * Inf");
    CHECK(qt_f32_bits(qt_nvfp4_dequant_value(0x8, 0x38, inf)) == 0x7FFFFFFFu, "-0 * Inf");
    CHECK(qt_f32_bits(qt_nvfp4_dequant_value(0xF, 0x38, inf)) == 0xFF800000u, "-6 * Inf");
    CHECK(qt_f32_bits(qt_nvfp4_dequant_value(0x2, 0x38, 2688.0f)) == 0x3F800000u, "1");
    test_end();
}

static void test_global_scale(void) {
    test_begin("global_scale_hand_values");
    // S_enc = RN(2688 / amax), FLT_MAX when that overflows, 1 for amax 0 or +Inf.
    struct {
        uint32_t amax, s_enc;
    } cases[] = {
        {0x00000000u, 0x3F800000u},  // 0 -> 1
        {0x7F800000u, 0x3F800000u},  // +Inf -> 2688/Inf = 0 -> 1
        {0x45280000u, 0x3F800000u},  // 2688 -> 1
        {0x3F800000u, 0x45280000u},  // 1 -> 2688
        {0x43E00000u, 0x40C00000u},  // 448 -> 6
        {0x00000001u, 0x7F7FFFFFu},  // min subnormal -> Inf -> FLT_MAX
        {0x7FC00000u, 0x7F7FFFFFu},  // NaN (never produced) -> fminf -> FLT_MAX
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t got = qt_f32_bits(qt_nvfp4_s_enc(qt_bits_f32(cases[i].amax)));
        CHECK(got == cases[i].s_enc, "amax %08x: S_enc %08x, expected %08x", cases[i].amax, got,
              cases[i].s_enc);
    }
    // amax 1: c = RN(2688 * f32(1/6)) = 448 exactly, S_dec = RN(1/2688) = f32(1/2688).
    qt_nvfp4_scale s = qt_nvfp4_scale_of(1.0f);
    CHECK(qt_f32_bits(s.c) == 0x43E00000u, "c %08x", qt_f32_bits(s.c));
    CHECK(qt_f32_bits(s.s_dec) == 0x39C30C31u, "S_dec %08x", qt_f32_bits(s.s_dec));
    // S_enc = FLT_MAX: S_dec = RN(1/FLT_MAX) = 2^-128 (subnormal 0x00200000).
    s = qt_nvfp4_scale_of(qt_bits_f32(1));
    CHECK(qt_f32_bits(s.s_dec) == 0x00200000u, "S_dec %08x", qt_f32_bits(s.s_dec));
    // Block scale: sb == 0 gives m_b = FLT_MAX; sb = 1.0 with S_dec = 1 gives 1.
    CHECK(qt_nvfp4_block_mult(0, 1.0f) == QT_F32_FLT_MAX, "sb 0");
    CHECK(qt_nvfp4_block_mult(0x38, 1.0f) == 1.0f, "sb 0x38");
    test_end();
}

// The hand-derived blocks of test_block_hand: values, scale byte, code bytes.
typedef struct hand_block {
    float v[16];
    uint32_t n;  // elements in the block (the last block of the row is partial)
    uint8_t scale;
    uint8_t bytes[8];
} hand_block;

// Global amax 2688: S_enc = 1, c = f32(1/6), S_dec = 1. NAN and INFINITY come from math.h.
static const hand_block hand_blocks[] = {
    // amax 6: d = RN(6 c) = 1 -> sb 0x38, m = 1. Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2,
    // 2.5->2, 3.5->4, 5->4; -0 -> 0x8, -0.3 -> -0.5.
    {{6, -6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.0f, 0.1f, -0.3f, 4.9f, 5.1f, 0.5f,
      -1.5f},
     16, 0x38, {0xF7, 0x20, 0x42, 0x64, 0x86, 0x90, 0x76, 0xB1}},
    // amax 3 (NaN ignored): d = RN(3 c) = 0.5 -> sb 0x30, m = 2; NaN of either sign -> +6.
    {{3, 1.5f, 0.75f, 0.375f, 0.125f, -3, NAN, -NAN, 2.9f, 0.3f, 0.2f, -0.2f, 1, -1.1f, 0, 0},
     16, 0x30, {0x57, 0x23, 0xF0, 0x77, 0x17, 0x91, 0xC4, 0x00}},
    // amax +Inf: d = Inf -> sb 0x7E (448), m = RN(1/448): 448 m = 1 -> 1.0; Inf -> 6.
    {{INFINITY, 1, -INFINITY, 0.5f, 448, -2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
     16, 0x7E, {0x07, 0x0F, 0x82, 0, 0, 0, 0, 0}},
    // all NaN: amax 0 -> sb 0 -> m = FLT_MAX, every code +6.
    {{NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN},
     16, 0x00, {0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77}},
    // all zero but one -0: sb 0, codes 0 and 0x8.
    {{0, 0, 0, -0.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
     16, 0x00, {0, 0x80, 0, 0, 0, 0, 0, 0}},
    // FP32 subnormals: sb underflows to 0, m = FLT_MAX: 1e-39 * FLT_MAX = 0.34 -> 0.5.
    {{1e-39f, -1e-39f, 1e-40f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
     16, 0x00, {0x91, 0, 0, 0, 0, 0, 0, 0}},
    // block amax above the global one: d = 500 saturates to sb 0x7E; 3000 / 448 -> 6.
    {{3000, 100, -50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
     16, 0x7E, {0x07, 0x08, 0, 0, 0, 0, 0, 0}},
    // partial last block (5 elements): d = RN(4 c) = 0.6667 -> sb 0.6875 (0x33),
    // m = 1.4545: 1.45 -> 1.5, 2.91 -> 3, 4.36 -> 4, -5.82 -> -6, 0.73 -> 0.5.
    {{1, 2, 3, -4, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 5, 0x33, {0x53, 0xF6, 0x01}},
};

static void test_block_hand(void) {
    test_begin("block_scales_and_codes_hand_derived");
    const hand_block *blocks = hand_blocks;
    const uint32_t nblocks = sizeof hand_blocks / sizeof hand_blocks[0];
    const uint32_t cols = (nblocks - 1) * 16 + blocks[nblocks - 1].n;
    hq h;
    hq_init(&h, 1, cols, QT_DTYPE_F32, 0);
    for (uint32_t b = 0; b < nblocks; b++) {
        for (uint32_t j = 0; j < blocks[b].n; j++) hq_set(&h, 0, b * 16 + j, blocks[b].v[j]);
    }
    h.amax_row[0] = 2688.0f;
    hq_quant(&h, QT_NVFP4_ROWWISE, 0, 0, 0);
    for (uint32_t b = 0; b < nblocks; b++) {
        CHECK(h.row_scales[b] == blocks[b].scale, "block %u: scale %02x, expected %02x", b,
              h.row_scales[b], blocks[b].scale);
        for (uint32_t i = 0; i < (blocks[b].n + 1) / 2; i++) {
            CHECK(h.row_data[b * 8 + i] == blocks[b].bytes[i],
                  "block %u byte %u: %02x, expected %02x", b, i, h.row_data[b * 8 + i],
                  blocks[b].bytes[i]);
        }
    }
    // Dequantization of block 0: RN(RN(1 * 2688) * f32(1/2688)) = 1, so the E2M1 values.
    float *out = calloc(cols, 4);
    hq_dequant(&h, false, out);
    const float expected0[16] = {6, -6, 0, 1, 1, 2, 2, 4, 4, -0.0f, 0, -0.5f, 4, 6, 0.5f, -1.5f};
    for (int j = 0; j < 16; j++) {
        CHECK(qt_f32_bits(out[j]) == qt_f32_bits(expected0[j]), "dequant %d: %g, expected %g", j,
              (double)out[j], (double)expected0[j]);
    }
    free(out);
    // The same first block in BF16 (all its values are exact in BF16).
    hq hb;
    hq_init(&hb, 1, 16, QT_DTYPE_BF16, 0);
    for (uint32_t j = 0; j < 16; j++) hq_set(&hb, 0, j, blocks[0].v[j]);
    hb.amax_row[0] = 2688.0f;
    hq_quant(&hb, QT_NVFP4_ROWWISE, 0, 0, 0);
    CHECK(hb.row_scales[0] == 0x38 && memcmp(hb.row_data, blocks[0].bytes, 8) == 0,
          "bf16 block: scale %02x, byte0 %02x", hb.row_scales[0], hb.row_data[0]);
    hq_free(&hb);
    hq_free(&h);
    test_end();
}

static void test_span_of(void) {
    test_begin("grouped_member_lookup");
    // Members: 0 rows [0,32) (20 valid), 1 and 2 empty, 3 [32,48) (0 valid), 4 [48,96) (48).
    const uint32_t offsets[] = {0, 32, 32, 32, 48, 96};
    const uint32_t first_dims[] = {20, 0, 0, 0, 48};
    const struct {
        uint32_t row, member, valid_end, store_end;
    } cases[] = {{0, 0, 20, 32}, {16, 0, 20, 32}, {32, 3, 32, 48}, {48, 4, 96, 96},
                 {80, 4, 96, 96}, {96, 0, 0, 0}, {112, 0, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qt_nvfp4_span s = qt_nvfp4_span_of(offsets, first_dims, 5, 128, cases[i].row);
        CHECK(s.store_end == cases[i].store_end && s.valid_end == cases[i].valid_end &&
                  (s.store_end == 0 || s.member == cases[i].member),
              "row %u: member %u valid %u store %u", cases[i].row, s.member, s.valid_end,
              s.store_end);
    }
    qt_nvfp4_span d = qt_nvfp4_span_of(NULL, NULL, 0, 37, 32);
    CHECK(d.valid_end == 37 && d.store_end == 37, "dense tail block %u %u", d.valid_end,
          d.store_end);
    test_end();
}

// |deq - x| <= 0.25 max(D, |x|) (1 + 2^-18) + amax 2^-18 + |x| 2^-20, D the dequant scale.
// Derivation: with y = RN(x m_b), E2M1 rounding moves y by at most max(0.25, |y|/4) (half the
// grid step: 0.25 below 2, 0.5 in [2,4), 1 in [4,6]; saturation of |y| <= 6.4, which a normal
// sb guarantees, is inside |y|/4). deq = q D and x = y D up to ~9 roundings of 2^-24 each
// (m_b, y, S_enc, S_dec, the two products in D, f32(1/2688)): the |x| 2^-20 term. A subnormal
// sb (d < 2^-6) can leave |y| up to 9, and sb = 0 flushes the block: either error is at most
// 6 * 2^-10 * S_dec ~ amax 2.2e-6 < amax 2^-18.
static double deq_bound(float x, float d, float amax) {
    double ax = fabs((double)x);
    return 0.25 * fmax((double)d, ax) * (1.0 + 0x1p-18) + (double)amax * 0x1p-18 + ax * 0x1p-20;
}

static void test_dequant_bound(void) {
    test_begin("dequantize_error_bound");
    const uint32_t rows = 67, cols = 83;
    hq h;
    hq_init(&h, rows, cols, QT_DTYPE_F32, 0);
    lcg_state = 7;
    // Magnitudes vary per 16 x 16 region over 2^-30 .. 2^30, so blocks of both directions see
    // spread-out values, and the amax is far above most blocks.
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t k = 0; k < cols; k++) {
            int e = (int)((r / 16 * 7 + k / 16 * 13 + (r * k) % 5) % 61) - 30;
            hq_set(&h, r, k, ldexpf(lcg_normal(), e));
        }
    }
    for (int rht = 0; rht < 2; rht++) {
        uint32_t flags = rht ? QT_NVFP4_RHT : 0;
        hq_amax(&h, flags, QT_NVFP4_RHT_SIGNS_TE);
        hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_COLWISE | flags, QT_NVFP4_RHT_SIGNS_TE, 0, 0);
        float *out = calloc((size_t)rows * cols, 4);
        for (int colwise = 0; colwise < 2; colwise++) {
            hq_dequant(&h, colwise, out);
            float amax = colwise ? h.amax_col[0] : h.amax_row[0];
            for (uint32_t k = 0; k < cols; k++) {
                for (uint32_t g = 0; g * 16 < rows; g++) {
                    float v[16];
                    for (uint32_t j = 0; j < 16; j++) {
                        v[j] = g * 16 + j < rows ? hq_get(&h, g * 16 + j, k) : 0.0f;
                    }
                    if (colwise && rht) qt_nvfp4_rht16(v, QT_NVFP4_RHT_SIGNS_TE);
                    for (uint32_t j = 0; j < 16 && g * 16 + j < rows; j++) {
                        uint32_t m = g * 16 + j;
                        uint8_t sb = colwise ? h.col_scales[(uint64_t)k * ((rows + 15) / 16) + g]
                                             : h.row_scales[(uint64_t)m * ((cols + 15) / 16) +
                                                            k / 16];
                        float d = qt_nvfp4_dequant_scale(sb, amax);
                        float got = out[(uint64_t)m * cols + k];
                        double err = fabs((double)got - (double)v[j]);
                        CHECK(err <= deq_bound(v[j], d, amax),
                              "rht %d colwise %d (%u,%u): x %g deq %g err %g bound %g", rht,
                              colwise, m, k, (double)v[j], (double)got, err,
                              deq_bound(v[j], d, amax));
                    }
                }
            }
        }
        free(out);
    }
    hq_free(&h);
    test_end();
}

static void test_rht(void) {
    test_begin("rht_orthogonal_and_exact_order");
    lcg_state = 11;
    for (int trial = 0; trial < 2000; trial++) {
        float v[16], y[16], z[16];
        double sum_abs = 0;
        for (int j = 0; j < 16; j++) {
            // BF16 inputs spanning several binades, as the columnwise input of an activation.
            v[j] = qt_bf16_to_f32(qt_f32_to_bf16(ldexpf(lcg_normal(), (int)(lcg_next() % 9) - 4)));
            y[j] = v[j];
            sum_abs += fabs(v[j]);
        }
        uint32_t signs = trial % 2 ? QT_NVFP4_RHT_SIGNS_TE : 0u;
        qt_nvfp4_rht16(y, signs);
        double y_max = 0;
        for (int j = 0; j < 16; j++) {
            // Exact product in double (16 BF16 values times +-1/4 sum exactly).
            double exact = 0;
            for (int k = 0; k < 16; k++) {
                int h_sign = __builtin_popcount((unsigned)(j & k)) & 1;
                int s_sign = (int)((signs >> k) & 1u);
                exact += (h_sign ^ s_sign ? -0.25 : 0.25) * v[k];
            }
            // y = bf16(fp32 sum): half a BF16 ulp (2^-9 relative) plus the FP32 sums (4 levels).
            double bound = 0x1p-8 * fabs(exact) + 0x1p-20 * sum_abs;
            CHECK(fabs(y[j] - exact) <= bound, "trial %d j %d: %g vs exact %g", trial, j,
                  (double)y[j], exact);
            y_max = fmax(y_max, fabs(y[j]));
            z[j] = y[j];
        }
        // H16 H16 = 16 I: applying the plain transform (mask 0) to y gives back v * s, with two
        // BF16 roundings: 2^-9 |z| from the second, and H e / 4 <= 16 * 2^-9 y_max / 4 from the
        // first.
        qt_nvfp4_rht16(z, 0);
        for (int j = 0; j < 16; j++) {
            double back = ((signs >> j) & 1u) ? -z[j] : z[j];
            double bound = 0x1p-8 * fabs(v[j]) + 0x1p-7 * y_max + 0x1p-20 * sum_abs;
            CHECK(fabs(back - v[j]) <= bound, "trial %d j %d: RHT twice %g, expected %g", trial, j,
                  back, (double)v[j]);
        }
    }
    test_end();
}

static void test_transpose_2d(void) {
    test_begin("two_d_columnwise_is_transpose");
    const uint32_t rows = 45, cols = 70;
    hq h;
    hq_init(&h, rows, cols, QT_DTYPE_BF16, 0);
    lcg_state = 5;
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t k = 0; k < cols; k++) hq_set(&h, r, k, ldexpf(lcg_normal(), (int)(k % 7)));
    }
    hq_amax(&h, 0, 0);  // without RHT both amaxes are max |x|
    CHECK(h.amax_row[0] == h.amax_col[0], "amaxes differ");
    hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_COLWISE | QT_NVFP4_2D, 0, 0, 0);
    const uint64_t rp = (cols + 1) / 2, cp = (rows + 1) / 2;
    for (uint32_t m = 0; m < rows; m++) {
        for (uint32_t k = 0; k < cols; k++) {
            CHECK(nib(h.row_data, rp, m, k) == nib(h.col_data, cp, k, m), "code (%u,%u)", m, k);
            CHECK(h.row_scales[(uint64_t)m * ((cols + 15) / 16) + k / 16] ==
                      h.col_scales[(uint64_t)k * ((rows + 15) / 16) + m / 16],
                  "scale (%u,%u)", m, k);
        }
    }
    hq_free(&h);
    test_end();
}

// Grouped rules on the twins: padding rows zero, empty members, rows past the active ones not
// written, per-member amaxes from valid rows only.
static void test_grouped_padding(void) {
    test_begin("grouped_padding_and_members_ref");
    const uint32_t cols = 40, count = 4;
    hq h;
    hq_init(&h, 90, cols, QT_DTYPE_BF16, count);
    // Member 0: 5 valid of 16; 1: empty; 2: 17 valid of 32; 3: 0 valid of 16. Active rows: 64.
    const uint32_t offsets[] = {0, 16, 16, 48, 64}, first_dims[] = {5, 0, 17, 0};
    memcpy(h.offsets, offsets, sizeof offsets);
    memcpy(h.first_dims, first_dims, sizeof first_dims);
    lcg_state = 3;
    for (uint32_t r = 0; r < h.rows; r++) {
        for (uint32_t k = 0; k < cols; k++) hq_set(&h, r, k, lcg_normal());
    }
    hq_set(&h, 7, 3, 1000.0f);   // padding of member 0: must not count
    hq_set(&h, 50, 3, 2000.0f);  // member 3, all padding
    hq_set(&h, 70, 3, 3000.0f);  // past the active rows
    hq_set(&h, 20, 5, 7.0f);     // member 2, valid
    memset(h.row_data, 0xAA, h.sizes.row_data);
    memset(h.col_data, 0xAA, h.sizes.col_data);
    hq_amax(&h, QT_NVFP4_RHT, QT_NVFP4_RHT_SIGNS_TE);
    CHECK(h.amax_row[0] < 10 && h.amax_row[1] == 0 && h.amax_row[2] == 7.0f &&
              h.amax_row[3] == 0,
          "amax_row %g %g %g %g", (double)h.amax_row[0], (double)h.amax_row[1],
          (double)h.amax_row[2], (double)h.amax_row[3]);
    CHECK(h.amax_col[1] == 0 && h.amax_col[3] == 0, "amax_col of empty members");
    hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_COLWISE | QT_NVFP4_RHT, QT_NVFP4_RHT_SIGNS_TE, 0, 0);
    const uint64_t rp = (cols + 1) / 2, cpitch = (h.rows + 1) / 2;
    for (uint32_t r = 0; r < h.rows; r++) {
        bool padding = (r >= 5 && r < 16) || (r >= 16 + 17 && r < 64);
        for (uint32_t b = 0; b < rp; b++) {
            uint8_t v = h.row_data[r * rp + b];
            if (r >= 64) {
                CHECK(v == 0xAA, "row %u past the active rows was written", r);
            } else if (padding) {
                CHECK(v == 0, "padding row %u byte %u = %02x", r, b, v);
            }
        }
    }
    for (uint32_t k = 0; k < cols; k++) {
        for (uint32_t b = 32; b < cpitch; b++) {
            CHECK(h.col_data[k * cpitch + b] == 0xAA, "col %u byte %u past the active rows", k, b);
        }
        // Member 3 is all padding: zero input transforms to zero codes.
        for (uint32_t b = 24; b < 32; b++) CHECK(h.col_data[k * cpitch + b] == 0, "member 3");
    }
    hq_free(&h);
    test_end();
}

static void test_sr_statistics(void) {
    test_begin("stochastic_rounding_statistics");
    // Blocks [6, c x 15] with global amax 2688: sb = 1, m = 1, so y = c exactly and the codes
    // are SR roundings of c. Averaged over 400 steps x 240 elements, the dequantized mean must
    // equal the exact expectation over the 256 random bytes (within 6 sigma) and approach c.
    const float values[4] = {2.3f, 0.3f, -4.7f, 1.1f};
    const uint32_t cols = 1024, steps = 400;
    hq h;
    hq_init(&h, 1, cols, QT_DTYPE_F32, 0);
    for (uint32_t k = 0; k < cols; k++) hq_set(&h, 0, k, k % 16 == 0 ? 6.0f : values[k / 16 % 4]);
    h.amax_row[0] = 2688.0f;
    double sum[4] = {0}, n[4] = {0};
    float *out = calloc(cols, 4);
    uint8_t *first = malloc(h.sizes.row_data);
    for (uint32_t s = 0; s < steps; s++) {
        h.step = s;
        hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_SR, 0, 1234, 9);
        if (s == 0) memcpy(first, h.row_data, h.sizes.row_data);
        hq_dequant(&h, false, out);
        for (uint32_t k = 0; k < cols; k++) {
            if (k % 16 == 0) continue;
            sum[k / 16 % 4] += out[k];
            n[k / 16 % 4] += 1;
        }
    }
    for (int i = 0; i < 4; i++) {
        double expect = 0, expect2 = 0;
        for (uint32_t r8 = 0; r8 < 256; r8++) {
            double q = qt_e2m1_to_f32(qt_f32_to_e2m1_sr(values[i], r8));
            expect += q / 256;
            expect2 += q * q / 256;
        }
        double sigma = sqrt(fmax(expect2 - expect * expect, 1e-12) / n[i]);
        double mean = sum[i] / n[i];
        CHECK(fabs(mean - expect) <= 6 * sigma, "value %g: mean %g, expected %g (sigma %g)",
              (double)values[i], mean, expect, sigma);
        // The 8-bit randomness quantizes the probability to 1/256 of the grid step (<= 2).
        CHECK(fabs(mean - values[i]) <= 2.0 / 256 + 6 * sigma, "value %g: mean %g",
              (double)values[i], mean);
    }
    // Keying: the same (seed, step) reproduces the codes; another step or seed changes them.
    h.step = 0;
    hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_SR, 0, 1234, 9);
    CHECK(memcmp(first, h.row_data, h.sizes.row_data) == 0, "same key, different codes");
    h.step = 1;
    hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_SR, 0, 1234, 9);
    CHECK(memcmp(first, h.row_data, h.sizes.row_data) != 0, "step does not change the codes");
    h.step = 0;
    hq_quant(&h, QT_NVFP4_ROWWISE | QT_NVFP4_SR, 0, 1235, 9);
    CHECK(memcmp(first, h.row_data, h.sizes.row_data) != 0, "seed does not change the codes");
    free(first);
    free(out);
    hq_free(&h);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// GPU vs reference.

typedef struct nv_case {
    const char *name;
    uint32_t rows, cols, dtype;
    uint32_t members;  // 0 = dense; else rows is recomputed as the capacity
    uint32_t flags;    // QT_NVFP4_ROWWISE | COLWISE | RHT | 2D | SR
    uint32_t signs;
    int plant;         // 0 none, 1 NaN/zero/subnormal/tiny/1000 and NaN/zero blocks, 2 + huge, Inf
} nv_case;

typedef struct nv_regions {
    prog_ref x, offsets, first_dims, amax_row, amax_col, step;
    prog_ref row_data, row_scales, col_data, col_scales, deq_row, deq_col;
    prog_ref raw_row, raw_col;  // dense cases: each copy's raw decode (qt_nvfp4_decode)
    prog_ref val_row, val_col;  // nv_values_case: a second cast's values (QT_NVFP4_*_VALUES)
} nv_regions;

typedef struct nv_result {
    uint8_t *buf[12];
    uint64_t bytes[12];
    uint8_t *x;  // the input as the program saw it (after planting), for diagnostics
} nv_result;

enum { R_AMAX_ROW, R_AMAX_COL, R_ROW_DATA, R_ROW_SCALES, R_COL_DATA, R_COL_SCALES, R_DEQ_ROW,
       R_DEQ_COL, R_RAW_ROW, R_RAW_COL, R_VAL_ROW, R_VAL_COL, R_COUNT };
static const char *const nv_result_names[R_COUNT] = {
    "amax_row", "amax_col", "row_data", "row_scales", "col_data", "col_scales",
    "dequant_row (f32)", "dequant_col (bf16)", "raw decode of the rowwise copy (bf16)",
    "raw decode of the columnwise copy (bf16)", "rowwise values (bf16)",
    "columnwise values (bf16)"};

// A case whose cast can also write values (QT_NVFP4_*_VALUES): dense BF16 input, no 2-D, rows
// and columns multiples of 16.
static bool nv_values_case(const nv_case *c) {
    return c->members == 0 && c->dtype == QT_DTYPE_BF16 && !(c->flags & QT_NVFP4_2D) &&
           c->rows % 16 == 0 && c->cols % 16 == 0;
}

// Host-side grouped layout: uneven members, some empty, some with whole padding blocks.
typedef struct nv_group {
    uint32_t *offsets, *first_dims;
    uint32_t active, capacity;
} nv_group;

static void nv_group_make(nv_group *g, uint32_t members, uint32_t seed) {
    g->offsets = calloc(members + 1, 4);
    g->first_dims = calloc(members, 4);
    lcg_state = seed;
    for (uint32_t i = 0; i < members; i++) {
        uint32_t fd = i % 7 == 3 ? 0 : lcg_next() % 41;
        uint32_t padded = (fd + 15) / 16 * 16 + (i % 5 == 1 ? 16 : 0);
        if (i % 7 == 3) padded = 0;  // an empty member
        g->first_dims[i] = fd;
        g->offsets[i + 1] = g->offsets[i] + padded;
    }
    g->active = g->offsets[members];
    g->capacity = g->active + 40;  // a tail the kernels must not write
}

static bool nv_group_valid(const nv_group *g, uint32_t members, uint32_t row) {
    for (uint32_t i = 0; i < members; i++) {
        if (row >= g->offsets[i] && row < g->offsets[i + 1]) {
            return row < g->offsets[i] + g->first_dims[i];
        }
    }
    return false;
}

static prog_ref nv_reserve(rig *r, const char *name, uint64_t bytes) {
    return rig_ref(r, rig_reserve(r, name, bytes ? bytes : 1), 0);
}

static void nv_build(rig *r, program *fill, const nv_case *c, nv_regions *g) {
    const uint32_t esize = c->dtype == QT_DTYPE_F32 ? 4 : 2;
    const uint64_t elems = (uint64_t)c->rows * c->cols;
    const op_nvfp4_sizes s = op_nvfp4_sizes_of(c->rows, c->cols, c->members);
    const bool rowwise = c->flags & QT_NVFP4_ROWWISE, colwise = c->flags & QT_NVFP4_COLWISE;
    g->x = nv_reserve(r, "x", elems * esize);
    g->offsets = nv_reserve(r, "offsets", 4ull * (c->members + 1));
    g->first_dims = nv_reserve(r, "first_dims", 4ull * (c->members + 1));
    g->amax_row = nv_reserve(r, "amax_row", s.amax);
    g->amax_col = nv_reserve(r, "amax_col", s.amax);
    g->step = nv_reserve(r, "step", 8);
    g->row_data = nv_reserve(r, "row_data", s.row_data);
    g->row_scales = nv_reserve(r, "row_scales", s.row_scales);
    g->col_data = nv_reserve(r, "col_data", s.col_data);
    g->col_scales = nv_reserve(r, "col_scales", s.col_scales);
    g->deq_row = nv_reserve(r, "deq_row", elems * 4);
    g->deq_col = nv_reserve(r, "deq_col", elems * 2);
    bool decode = c->members == 0;  // grouped buffers have rows no quantizer writes
    g->raw_row = nv_reserve(r, "raw_row", decode && rowwise ? elems * 2 : 0);
    g->raw_col = nv_reserve(r, "raw_col", decode && colwise ? elems * 2 : 0);
    const bool values = nv_values_case(c);
    g->val_row = nv_reserve(r, "val_row", values && rowwise ? elems * 2 : 0);
    g->val_col = nv_reserve(r, "val_col", values && colwise ? elems * 2 : 0);
    op_group group = {c->members, g->offsets, g->first_dims};
    op_nvfp4_input in = {g->x, c->dtype, c->rows, c->cols, group};
    rig_prog_init(fill, "fill");
    RIG_OK(op_fill_random(fill, "fill", g->x, elems, c->dtype, QT_FILL_NORMAL, 77, 0, 0, 1));
    const bool rht = c->flags & QT_NVFP4_RHT;
    op_nvfp4_amax_out ao = {g->amax_row, colwise ? g->amax_col : (prog_ref){0}, rht, c->signs};
    RIG_OK(op_nvfp4_amax(&r->prog, "amax", &in, &ao));
    op_nvfp4_quant q = {rowwise, colwise, rht, c->signs, (c->flags & QT_NVFP4_2D) != 0,
                        (c->flags & QT_NVFP4_SR) != 0, false, false, 0x5EEDull << 32 | 99, 17,
                        g->step, g->amax_row, g->amax_col, g->row_data, g->row_scales,
                        g->col_data, g->col_scales};
    RIG_OK(op_nvfp4_quantize(&r->prog, "quantize", &in, &q));
    // Which kernel casts: BF16 without 2-D takes a fast one (stochastic rounding its own), and
    // so does FP32 with 2-D rounding to nearest.
    const program *p = &r->prog;
    const bool two_d = c->flags & QT_NVFP4_2D, sr = c->flags & QT_NVFP4_SR;
    const kernel_id want = c->dtype == QT_DTYPE_F32 && two_d && !sr ? KERNEL_NVFP4_QUANTIZE_F32_2D
                           : c->dtype != QT_DTYPE_BF16 || two_d     ? KERNEL_NVFP4_QUANTIZE
                           : sr                                     ? KERNEL_NVFP4_QUANTIZE_BF16_SR
                                                                    : KERNEL_NVFP4_QUANTIZE_BF16;
    CHECK(p->op_count > 0 && p->ops[p->op_count - 1].kernel == want,
          "%s: quantize kernel %d, expected %d", c->name,
          p->op_count > 0 ? (int)p->ops[p->op_count - 1].kernel : -1, (int)want);
    op_nvfp4_dequant d = {c->rows, c->cols, group, false, g->row_data, g->row_scales,
                          g->amax_row, g->deq_row, QT_DTYPE_F32};
    if (rowwise) RIG_OK(op_nvfp4_dequantize(&r->prog, "dequant_row", &d));
    d = (op_nvfp4_dequant){c->rows, c->cols, group, true, g->col_data, g->col_scales,
                           g->amax_col, g->deq_col, QT_DTYPE_BF16};
    if (colwise) RIG_OK(op_nvfp4_dequantize(&r->prog, "dequant_col", &d));
    if (decode && rowwise) {
        RIG_OK(op_nvfp4_decode(&r->prog, "decode_row", g->row_data, g->row_scales, g->raw_row,
                               c->rows, c->cols));
    }
    if (decode && colwise) {
        RIG_OK(op_nvfp4_decode(&r->prog, "decode_col", g->col_data, g->col_scales, g->raw_col,
                               c->cols, c->rows));
    }
    if (values) {
        // The same cast again (the same amaxes, step and keys: the same codes), writing the codes'
        // values in place of codes and scales: they must be the raw decodes above.
        op_nvfp4_quant qv = q;
        qv.row_data = g->val_row;
        qv.col_data = g->val_col;
        qv.row_scales = qv.col_scales = (prog_ref){0};
        qv.row_values = rowwise;
        qv.col_values = colwise;
        RIG_OK(op_nvfp4_quantize(&r->prog, "quantize_values", &in, &qv));
    }
    rig_bind(r);
    prog_resolve(fill);
}

static void nv_write_elem(rig *r, const nv_case *c, const nv_regions *g, uint32_t row,
                          uint32_t col, uint32_t f32_bits) {
    uint64_t i = (uint64_t)row * c->cols + col;
    if (c->dtype == QT_DTYPE_F32) {
        RIG_OK(backend_write(&r->be, (prog_ref){g->x.arena, g->x.region, i * 4}, &f32_bits, 4));
    } else {
        uint16_t h = (uint16_t)(f32_bits >> 16);
        RIG_OK(backend_write(&r->be, (prog_ref){g->x.arena, g->x.region, i * 2}, &h, 2));
    }
}

// Edge values at pseudo-random valid positions, an all-NaN and an all-zero block in each
// direction.
static void nv_plant(rig *r, const nv_case *c, const nv_regions *g, const nv_group *grp) {
    static const uint32_t mild[] = {0x7FC00000u, 0xFFC00000u, 0x00000000u, 0x80000000u,
                                    0x00010000u, 0x80120000u, 0x00800000u, 0x447A0000u};
    static const uint32_t wild[] = {0x7F800000u, 0xFF800000u, 0x7F000000u, 0xFE7F0000u};
    lcg_state = c->rows * 31u + c->cols;
    for (int pass = 0; pass < (c->plant >= 2 ? 2 : 1); pass++) {
        const uint32_t *vals = pass ? wild : mild;
        size_t n = pass ? sizeof wild / 4 : sizeof mild / 4;
        for (size_t i = 0; i < n; i++) {
            for (int tries = 0; tries < 64; tries++) {
                uint32_t row = lcg_next() % c->rows, col = lcg_next() % c->cols;
                if (c->members && !nv_group_valid(grp, c->members, row)) continue;
                nv_write_elem(r, c, g, row, col, vals[i]);
                break;
            }
        }
    }
    uint32_t row0 = 0;
    while (c->members && row0 < c->rows && !nv_group_valid(grp, c->members, row0)) row0++;
    if (row0 >= c->rows) return;
    for (uint32_t j = 0; j < 16 && c->cols >= 48; j++) {
        nv_write_elem(r, c, g, row0, 16 + j, 0x7FC00000u);  // rowwise all-NaN block
        nv_write_elem(r, c, g, row0, 32 + j, 0);            // rowwise all-zero block
    }
    if (c->members == 0 && c->rows >= 48) {
        for (uint32_t j = 0; j < 16; j++) {
            nv_write_elem(r, c, g, 16 + j, c->cols - 1, 0xFFC00000u);  // columnwise all-NaN
            nv_write_elem(r, c, g, 32 + j, c->cols - 1, 0x80000000u);  // columnwise all -0
        }
    }
}

static void nv_run(rig *r, program *fill, const nv_case *c, const nv_regions *g,
                   const nv_group *grp, nv_result *out) {
    RIG_OK(backend_run(&r->be, fill));
    if (c->members) {
        RIG_OK(backend_write(&r->be, g->offsets, grp->offsets, 4ull * (c->members + 1)));
        RIG_OK(backend_write(&r->be, g->first_dims, grp->first_dims, 4ull * c->members));
    }
    if (c->plant) nv_plant(r, c, g, grp);
    uint64_t step = 5;
    RIG_OK(backend_write(&r->be, g->step, &step, 8));
    // Stale amaxes from an earlier step: the zeroing op must clear them.
    uint32_t n = c->members ? c->members : 1;
    float *stale = malloc(4ull * n);
    for (uint32_t i = 0; i < n; i++) stale[i] = 1e30f;
    RIG_OK(backend_write(&r->be, g->amax_row, stale, 4ull * n));
    RIG_OK(backend_write(&r->be, g->amax_col, stale, 4ull * n));
    free(stale);
    RIG_OK(backend_run(&r->be, &r->prog));
    const op_nvfp4_sizes s = op_nvfp4_sizes_of(c->rows, c->cols, c->members);
    const prog_ref refs[R_COUNT] = {g->amax_row, g->amax_col, g->row_data, g->row_scales,
                                    g->col_data, g->col_scales, g->deq_row, g->deq_col,
                                    g->raw_row, g->raw_col, g->val_row, g->val_col};
    const uint64_t elems = (uint64_t)c->rows * c->cols;
    const bool decode = c->members == 0;
    const uint64_t bytes[R_COUNT] = {
        s.amax, s.amax, s.row_data, s.row_scales, s.col_data, s.col_scales, elems * 4, elems * 2,
        decode && (c->flags & QT_NVFP4_ROWWISE) ? elems * 2 : 0,
        decode && (c->flags & QT_NVFP4_COLWISE) ? elems * 2 : 0,
        nv_values_case(c) && (c->flags & QT_NVFP4_ROWWISE) ? elems * 2 : 0,
        nv_values_case(c) && (c->flags & QT_NVFP4_COLWISE) ? elems * 2 : 0};
    for (int i = 0; i < R_COUNT; i++) {
        out->bytes[i] = bytes[i];
        out->buf[i] = malloc(bytes[i] + 1);
        if (bytes[i] != 0) RIG_OK(backend_read(&r->be, out->buf[i], refs[i], bytes[i]));
    }
    const uint64_t x_bytes = elems * (c->dtype == QT_DTYPE_F32 ? 4 : 2);
    out->x = malloc(x_bytes + 1);
    RIG_OK(backend_read(&r->be, out->x, g->x, x_bytes));
}

static void nv_result_free(nv_result *res) {
    for (int i = 0; i < R_COUNT; i++) free(res->buf[i]);
    free(res->x);
}

// Row length in bytes of each result, to print mismatches as (row, byte-in-row).
static uint64_t nv_pitch(const nv_case *c, int i) {
    switch (i) {
    case R_ROW_DATA: return (c->cols + 1) / 2;
    case R_ROW_SCALES: return (c->cols + 15) / 16;
    case R_COL_DATA: return (c->rows + 1) / 2;
    case R_COL_SCALES: return (c->rows + 15) / 16;
    case R_DEQ_ROW: return (uint64_t)c->cols * 4;
    case R_DEQ_COL: return (uint64_t)c->cols * 2;
    case R_RAW_ROW: return (uint64_t)c->cols * 2;
    case R_RAW_COL: return (uint64_t)c->rows * 2;
    case R_VAL_ROW: return (uint64_t)c->cols * 2;
    case R_VAL_COL: return (uint64_t)c->rows * 2;
    default: return 4;
    }
}

// The 16 inputs (FP32 bit patterns) of the block that holds output byte `b` of result i, with
// the direction's global amax, so that one failing run says what was quantized.
static void nv_explain(const nv_case *c, const nv_group *grp, const nv_result *ref, int i,
                       uint64_t b) {
    if (i < R_ROW_DATA || i > R_COL_SCALES) return;
    const bool col = i == R_COL_DATA || i == R_COL_SCALES;
    const bool data = i == R_ROW_DATA || i == R_COL_DATA;
    const uint64_t pitch = nv_pitch(c, i), line = b / pitch, pos = (b % pitch) * (data ? 2 : 16);
    const uint64_t start = pos / 16 * 16;  // first element of the block along the direction
    char text[16 * 11 + 1];
    size_t used = 0;
    for (uint64_t j = start; j < start + 16; j++) {
        uint64_t row = col ? j : line, k = col ? line : j;
        uint32_t bits = 0;
        if (row < c->rows && k < c->cols) {
            uint64_t e = row * c->cols + k;
            if (c->dtype == QT_DTYPE_F32) {
                memcpy(&bits, ref->x + e * 4, 4);
            } else {
                uint16_t h;
                memcpy(&h, ref->x + e * 2, 2);
                bits = (uint32_t)h << 16;
            }
        }
        used += (size_t)snprintf(text + used, sizeof text - used, " %08x", bits);
    }
    const uint32_t row0 = (uint32_t)((col ? start : line) / 16 * 16);
    qt_nvfp4_span span = qt_nvfp4_span_of(grp->offsets, grp->first_dims, c->members, c->rows, row0);
    float amax[2];
    memcpy(amax, ref->buf[R_AMAX_ROW] + 4ull * span.member, 4);
    memcpy(amax + 1, ref->buf[R_AMAX_COL] + 4ull * span.member, 4);
    printf("    %s block (line %llu, from %llu), member %u (valid < %u, stored < %u), amax row %a "
           "col %a, inputs:%s\n", col ? "columnwise" : "rowwise", (unsigned long long)line,
           (unsigned long long)start, span.member, span.valid_end, span.store_end,
           (double)amax[0], (double)amax[1], text);
}

static void nv_compare(const nv_case *c, const nv_group *grp, const nv_result *gpu,
                       const nv_result *ref, const char *what) {
    for (int i = 0; i < R_COUNT; i++) {
        uint64_t mismatches = 0, pitch = nv_pitch(c, i);
        for (uint64_t b = 0; b < gpu->bytes[i]; b++) {
            if (gpu->buf[i][b] == ref->buf[i][b]) continue;
            if (mismatches++ < 6) {
                CHECK(false, "%s %s: byte %llu (row %llu, byte %llu): gpu %02x ref %02x", what,
                      nv_result_names[i], (unsigned long long)b, (unsigned long long)(b / pitch),
                      (unsigned long long)(b % pitch), gpu->buf[i][b], ref->buf[i][b]);
                if (mismatches <= 2) nv_explain(c, grp, ref, i, b);
            }
        }
        CHECK(mismatches == 0, "%s %s: %llu bytes differ", what, nv_result_names[i],
              (unsigned long long)mismatches);
    }
}

static void nv_check_transpose(const nv_case *c, const nv_result *res) {
    const uint64_t rp = (c->cols + 1) / 2, cp = (c->rows + 1) / 2;
    uint64_t bad = 0;
    for (uint32_t m = 0; m < c->rows; m++) {
        for (uint32_t k = 0; k < c->cols; k++) {
            bool same = nib(res->buf[R_ROW_DATA], rp, m, k) ==
                            nib(res->buf[R_COL_DATA], cp, k, m) &&
                        res->buf[R_ROW_SCALES][(uint64_t)m * ((c->cols + 15) / 16) + k / 16] ==
                            res->buf[R_COL_SCALES][(uint64_t)k * ((c->rows + 15) / 16) + m / 16];
            if (!same && bad++ < 4) CHECK(false, "gpu 2-D: (%u,%u) is not transposed", m, k);
        }
    }
}

// The planted columnwise group of -0 (nv_plant) under RHT transforms to zeros, which are +0:
// its 16 columnwise codes are 0x0 (the -0 code 0x8 would differ from TE's tensor-core bits).
static void nv_check_zero_group(const nv_case *c, const nv_result *res, const char *what) {
    if (!c->plant || c->members || c->rows < 48 || !(c->flags & QT_NVFP4_COLWISE) ||
        !(c->flags & QT_NVFP4_RHT)) {
        return;
    }
    for (uint32_t m = 32; m < 48; m++) {
        const uint8_t code = nib(res->buf[R_COL_DATA], (c->rows + 1) / 2, c->cols - 1, m);
        CHECK(code == 0, "%s: RHT of the -0 group, position %u: code 0x%x", what, m, code);
    }
}

static rig gpu_rig, ref_rig;
static program fill_gpu, fill_ref;

// One run's values against its raw decodes of the codes, bit for bit (nv_values_case).
static void nv_check_values(const nv_case *c, const nv_result *res, const char *what) {
    if (!nv_values_case(c)) return;
    for (int dir = 0; dir < 2; dir++) {
        const int val = dir ? R_VAL_COL : R_VAL_ROW, raw = dir ? R_RAW_COL : R_RAW_ROW;
        const uint64_t pitch = nv_pitch(c, val);
        uint64_t bad = 0;
        for (uint64_t b = 0; b + 1 < res->bytes[val]; b += 2) {
            uint16_t got, want;
            memcpy(&got, res->buf[val] + b, 2);
            memcpy(&want, res->buf[raw] + b, 2);
            if (got != want && bad++ < 4) {
                CHECK(false, "%s %s: row %llu, element %llu: 0x%04x, the decode 0x%04x", what,
                      nv_result_names[val], (unsigned long long)(b / pitch),
                      (unsigned long long)(b % pitch / 2), got, want);
            }
        }
        CHECK(bad == 0, "%s %s: %llu elements differ from the decode", what,
              nv_result_names[val], (unsigned long long)bad);
    }
}

static void nv_gpu_case(const nv_case *base) {
    nv_case c = *base;
    nv_group grp = {0};
    if (c.members) {
        nv_group_make(&grp, c.members, c.members * 7 + c.cols);
        c.rows = grp.capacity;
    }
    test_begin(c.name);
    nv_regions gg, gr;
    rig_reset(&gpu_rig);
    rig_reset(&ref_rig);
    nv_build(&gpu_rig, &fill_gpu, &c, &gg);
    nv_build(&ref_rig, &fill_ref, &c, &gr);
    nv_result gpu = {0}, ref = {0};
    nv_run(&gpu_rig, &fill_gpu, &c, &gg, &grp, &gpu);
    nv_run(&ref_rig, &fill_ref, &c, &gr, &grp, &ref);
    nv_compare(&c, &grp, &gpu, &ref, "gpu vs ref");
    nv_check_zero_group(&c, &gpu, "gpu");
    nv_check_zero_group(&c, &ref, "ref");
    nv_check_values(&c, &gpu, "gpu");
    nv_check_values(&c, &ref, "ref");
    if ((c.flags & QT_NVFP4_2D) && (c.flags & QT_NVFP4_COLWISE) && (c.flags & QT_NVFP4_ROWWISE) &&
        !(c.flags & QT_NVFP4_SR)) {
        nv_check_transpose(&c, &gpu);
    }
    if (c.flags & QT_NVFP4_SR) {
        // A second GPU run gives the same bytes: randomness is keyed, and amaxes are re-zeroed.
        nv_result again = {0};
        nv_run(&gpu_rig, &fill_gpu, &c, &gg, &grp, &again);
        nv_compare(&c, &grp, &again, &gpu, "gpu rerun");
        nv_result_free(&again);
    }
    nv_result_free(&gpu);
    nv_result_free(&ref);
    free(grp.offsets);
    free(grp.first_dims);
    test_end();
}

#define RC (QT_NVFP4_ROWWISE | QT_NVFP4_COLWISE)
#define TE QT_NVFP4_RHT_SIGNS_TE

static const nv_case nv_cases[] = {
    {"gpu_bf16_1x7_row_col", 1, 7, QT_DTYPE_BF16, 0, RC, 0, 0},
    {"gpu_bf16_1x33_rht", 1, 33, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, TE, 0},
    {"gpu_f32_37x53_rht_mask0_planted", 37, 53, QT_DTYPE_F32, 0, RC | QT_NVFP4_RHT, 0, 1},
    {"gpu_bf16_128x64_rht_planted", 128, 64, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, TE, 1},
    {"gpu_bf16_300x200_rht_inf_huge", 300, 200, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, TE, 2},
    {"gpu_f32_257x96_planted", 257, 96, QT_DTYPE_F32, 0, RC, 0, 1},
    {"gpu_bf16_1000x1030_rht", 1000, 1030, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, TE, 1},
    {"gpu_bf16_2048x512_rht_aligned", 2048, 512, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, TE, 0},
    {"gpu_f32_384x320_rht", 384, 320, QT_DTYPE_F32, 0, RC | QT_NVFP4_RHT, TE, 1},
    {"gpu_bf16_200x160_2d_transpose", 200, 160, QT_DTYPE_BF16, 0, RC | QT_NVFP4_2D, 0, 1},
    {"gpu_f32_64x64_2d_transpose", 64, 64, QT_DTYPE_F32, 0, RC | QT_NVFP4_2D, 0, 0},
    {"gpu_bf16_45x77_2d_edges", 45, 77, QT_DTYPE_BF16, 0, RC | QT_NVFP4_2D, 0, 1},
    {"gpu_bf16_512x256_sr_rht", 512, 256, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT | QT_NVFP4_SR, TE,
     1},
    {"gpu_f32_45x77_sr", 45, 77, QT_DTYPE_F32, 0, RC | QT_NVFP4_SR, 0, 1},
    {"gpu_bf16_129x80_rowwise_only", 129, 80, QT_DTYPE_BF16, 0, QT_NVFP4_ROWWISE, 0, 1},
    {"gpu_f32_33x48_colwise_only_rht", 33, 48, QT_DTYPE_F32, 0, QT_NVFP4_COLWISE | QT_NVFP4_RHT,
     TE, 1},
    {"gpu_bf16_tall_1048624x3_rht_grid_stride", 1048624, 3, QT_DTYPE_BF16, 0,
     RC | QT_NVFP4_RHT, TE, 0},
    {"gpu_grouped_1_bf16_rht", 0, 64, QT_DTYPE_BF16, 1, RC | QT_NVFP4_RHT, TE, 1},
    {"gpu_grouped_3_bf16_rht", 0, 96, QT_DTYPE_BF16, 3, RC | QT_NVFP4_RHT, TE, 1},
    {"gpu_grouped_64_bf16_rht", 0, 64, QT_DTYPE_BF16, 64, RC | QT_NVFP4_RHT, TE, 1},
    {"gpu_grouped_65_f32_rht_sr", 0, 48, QT_DTYPE_F32, 65, RC | QT_NVFP4_RHT | QT_NVFP4_SR, TE,
     1},
    {"gpu_grouped_1000_bf16_rht", 0, 40, QT_DTYPE_BF16, 1000, RC | QT_NVFP4_RHT, TE, 1},
    {"gpu_grouped_64_bf16_2d", 0, 80, QT_DTYPE_BF16, 64, RC | QT_NVFP4_2D, 0, 1},
    {"gpu_grouped_3_f32_plain", 0, 33, QT_DTYPE_F32, 3, RC, 0, 2},
    // The BF16 fast paths: no RHT (columnwise pairs gathered from the tile), the RHT with a
    // runtime sign mask, grouped without RHT (multipliers computed per block), columnwise only,
    // and full aligned tiles with huge values and Inf (blocks leaving the fast path).
    {"gpu_bf16_520x384_plain_planted", 520, 384, QT_DTYPE_BF16, 0, RC, 0, 2},
    {"gpu_bf16_256x192_rht_mask0", 256, 192, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, 0, 1},
    {"gpu_bf16_256x128_rht_mask_a5c3", 256, 128, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, 0xA5C3, 2},
    {"gpu_grouped_3_bf16_plain", 0, 80, QT_DTYPE_BF16, 3, RC, 0, 2},
    {"gpu_bf16_77x64_colwise_only", 77, 64, QT_DTYPE_BF16, 0, QT_NVFP4_COLWISE, 0, 1},
    {"gpu_bf16_1024x512_rht_planted_wild", 1024, 512, QT_DTYPE_BF16, 0, RC | QT_NVFP4_RHT, TE, 2},
    // The BF16 fast cast with stochastic rounding: partial tiles without RHT, huge values and Inf,
    // a runtime sign mask, grouped rows, one direction at a time.
    {"gpu_bf16_45x77_sr", 45, 77, QT_DTYPE_BF16, 0, RC | QT_NVFP4_SR, 0, 1},
    {"gpu_bf16_300x200_sr_rht_inf_huge", 300, 200, QT_DTYPE_BF16, 0,
     RC | QT_NVFP4_RHT | QT_NVFP4_SR, TE, 2},
    {"gpu_bf16_256x128_sr_rht_mask_a5c3", 256, 128, QT_DTYPE_BF16, 0,
     RC | QT_NVFP4_RHT | QT_NVFP4_SR, 0xA5C3, 1},
    {"gpu_grouped_3_bf16_rht_sr", 0, 96, QT_DTYPE_BF16, 3, RC | QT_NVFP4_RHT | QT_NVFP4_SR, TE,
     1},
    {"gpu_bf16_129x80_rowwise_only_sr", 129, 80, QT_DTYPE_BF16, 0,
     QT_NVFP4_ROWWISE | QT_NVFP4_SR, 0, 1},
    {"gpu_bf16_77x64_colwise_only_sr_rht", 77, 64, QT_DTYPE_BF16, 0,
     QT_NVFP4_COLWISE | QT_NVFP4_RHT | QT_NVFP4_SR, TE, 2},
    // The FP32 2-D cast of weights (gpu_f32_64x64_2d_transpose above too): full aligned tiles
    // with huge values and Inf, partial tiles in both dimensions, columns that end mid-block,
    // several CTAs' worth of row tiles, grouped rows, one direction at a time; with stochastic
    // rounding it stays on the general kernel.
    {"gpu_f32_520x384_2d_planted_wild", 520, 384, QT_DTYPE_F32, 0, RC | QT_NVFP4_2D, 0, 2},
    {"gpu_f32_257x96_2d_planted", 257, 96, QT_DTYPE_F32, 0, RC | QT_NVFP4_2D, 0, 1},
    {"gpu_f32_45x77_2d_edges", 45, 77, QT_DTYPE_F32, 0, RC | QT_NVFP4_2D, 0, 1},
    {"gpu_f32_4096x1024_2d", 4096, 1024, QT_DTYPE_F32, 0, RC | QT_NVFP4_2D, 0, 0},
    {"gpu_f32_409600x64_2d_grid_stride", 409600, 64, QT_DTYPE_F32, 0, RC | QT_NVFP4_2D, 0, 0},
    {"gpu_grouped_3_f32_2d", 0, 80, QT_DTYPE_F32, 3, RC | QT_NVFP4_2D, 0, 1},
    {"gpu_f32_129x80_2d_rowwise_only", 129, 80, QT_DTYPE_F32, 0,
     QT_NVFP4_ROWWISE | QT_NVFP4_2D, 0, 1},
    {"gpu_f32_77x64_2d_colwise_only", 77, 64, QT_DTYPE_F32, 0, QT_NVFP4_COLWISE | QT_NVFP4_2D, 0,
     2},
    {"gpu_f32_45x77_2d_sr", 45, 77, QT_DTYPE_F32, 0, RC | QT_NVFP4_2D | QT_NVFP4_SR, 0, 1},
};

// CPU: the program of every case above picks the kernel its input calls for (nv_build checks
// it), so that the GPU cases exercise the kernels they are meant to.
static void test_kernel_choice(void) {
    test_begin("quantize_kernel_choice");
    const char *why = NULL;
    CHECK(rig_open(&ref_rig, BACKEND_REF, &why), "reference rig: %s", why ? why : "?");
    for (size_t i = 0; i < sizeof nv_cases / sizeof nv_cases[0]; i++) {
        nv_case c = nv_cases[i];
        nv_group grp = {0};
        if (c.members) {
            nv_group_make(&grp, c.members, c.members * 7 + c.cols);
            c.rows = grp.capacity;
        }
        nv_regions g;
        rig_reset(&ref_rig);
        nv_build(&ref_rig, &fill_ref, &c, &g);
        free(grp.offsets);
        free(grp.first_dims);
    }
    rig_reset(&ref_rig);
    rig_close(&ref_rig);
    test_end();
}

// CPU: every values case of the table on the reference backend: the values are the raw decodes
// of the codes the same cast writes.
static void test_values_ref(void) {
    test_begin("values_equal_decoded_codes_ref");
    const char *why = NULL;
    CHECK(rig_open(&ref_rig, BACKEND_REF, &why), "reference rig: %s", why ? why : "?");
    uint32_t cases = 0;
    for (size_t i = 0; i < sizeof nv_cases / sizeof nv_cases[0]; i++) {
        const nv_case *c = &nv_cases[i];
        if (!nv_values_case(c)) continue;
        nv_group grp = {0};
        nv_regions g;
        nv_result res = {0};
        rig_reset(&ref_rig);
        nv_build(&ref_rig, &fill_ref, c, &g);
        nv_run(&ref_rig, &fill_ref, c, &g, &grp, &res);
        nv_check_values(c, &res, c->name);
        nv_result_free(&res);
        cases++;
    }
    CHECK(cases >= 6, "only %u values cases", cases);
    rig_reset(&ref_rig);
    rig_close(&ref_rig);
    test_end();
}

static void test_gpu(void) {
    const size_t n = sizeof nv_cases / sizeof nv_cases[0];
    const char *why = NULL;
    if (!rig_open(&gpu_rig, BACKEND_GPU, &why)) {
        for (size_t i = 0; i < n; i++) test_skip(nv_cases[i].name, why);
        return;
    }
    rig_open(&ref_rig, BACKEND_REF, &why);
    for (size_t i = 0; i < n; i++) nv_gpu_case(&nv_cases[i]);
    rig_close(&gpu_rig);
    rig_close(&ref_rig);
}

int main(void) {
    test_e2m1_matches_codec();
    test_fast_paths_match_codec();
    test_fast_e2m1_exhaustive();
    test_sr_select();
    test_fast_block_encoder();
    test_rht_bf16_fused();
    test_rht_signed_zero();
    test_dequant_nan();
    test_global_scale();
    test_block_hand();
    test_span_of();
    test_dequant_bound();
    test_rht();
    test_transpose_2d();
    test_grouped_padding();
    test_sr_statistics();
    test_kernel_choice();
    test_values_ref();
    test_gpu();
    return test_exit_code();
}
