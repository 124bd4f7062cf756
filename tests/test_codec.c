// test_codec: the scalar converters of ptx/qt_codec.h, the transcendentals of ptx/qt_math.h and
// the format table of recipes/format.c, each against an oracle that shares no code with them.
//
// Oracles: small float formats are decoded from their definition (sign, exponent and mantissa
// fields, via ldexp in double) and inputs are rounded by comparing distances to the neighbouring
// representable values in double, with the tie, saturation and NaN rules of FP8 and E2M1
// restated here. E8M0 uses frexp, BF16 distances in double, the transcendentals libm in double.
// FP8, E2M1, BF16 and E8M0 encoding are checked over all 2^32 FP32 bit patterns (two threads);
// the transcendentals on every 64th bit pattern of their useful domain.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "recipes/format.h"  // qt_format_table, qt_format_get, qt_format_from_name
#include "ptx/gemm.h"        // GEMM_FORMAT_*
#include "ptx/qt_codec.h"    // the converters under test
#include "ptx/qt_math.h"     // the transcendentals under test
#include "tests/test.h"

#ifndef SWEEP_THREADS
#define SWEEP_THREADS 2  // the test budget assumes two cores
#endif

static float bits_to_f(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static uint32_t f_to_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

// Runs fn on SWEEP_THREADS argument blocks of `size` bytes each, in parallel.
static void run_threads(void *(*fn)(void *), void *args, size_t size) {
    pthread_t threads[SWEEP_THREADS];
    for (int t = 0; t < SWEEP_THREADS; t++) {
        int rc = pthread_create(&threads[t], NULL, fn, (char *)args + (size_t)t * size);
        if (rc != 0) abort();
    }
    for (int t = 0; t < SWEEP_THREADS; t++) pthread_join(threads[t], NULL);
}

// ---------------------------------------------------------------------------------------------
// Oracle for E4M3, E5M2 and E2M1: the table of non-negative finite values from the definition.

typedef struct oracle_fmt {
    const char *name;
    int man_bits;
    int bias;
    uint32_t max_code;  // largest finite magnitude code
    uint32_t sign_bit;  // 0x80 for FP8, 0x8 for E2M1
    uint32_t nan_code;  // what NaN inputs encode to (0x7F for FP8, 0x7 = +6 for E2M1)
    double value[128];  // value[c] for magnitude codes 0..max_code, increasing
} oracle_fmt;

static oracle_fmt oracle_e4m3 = {"e4m3", 3, 7, 0x7E, 0x80, 0x7F, {0}};
static oracle_fmt oracle_e5m2 = {"e5m2", 2, 15, 0x7B, 0x80, 0x7F, {0}};
static oracle_fmt oracle_e2m1 = {"e2m1", 1, 1, 0x7, 0x8, 0x7, {0}};

static void oracle_fmt_init(oracle_fmt *o) {
    for (uint32_t c = 0; c <= o->max_code; c++) {
        int e = (int)(c >> o->man_bits);
        int m = (int)(c & ((1u << o->man_bits) - 1));
        if (e == 0) {
            o->value[c] = ldexp((double)m, 1 - o->bias - o->man_bits);  // subnormal
        } else {
            o->value[c] = ldexp(1.0 + ldexp((double)m, -o->man_bits), e - o->bias);
        }
    }
}

// Nearest code to a finite v >= 0: everything above max saturates to max; ties go to the even
// code (codes are consecutive, so an even code has an even mantissa). *index is a search hint
// that walks from the previous answer, which makes a sweep in increasing order cheap.
static uint32_t oracle_round(const oracle_fmt *o, uint32_t *index, double v) {
    if (v >= o->value[o->max_code]) return o->max_code;
    while (*index > 0 && o->value[*index] > v) (*index)--;
    while (o->value[*index + 1] <= v) (*index)++;
    uint32_t lo = *index;
    double d_lo = v - o->value[lo];
    double d_hi = o->value[lo + 1] - v;
    if (d_lo < d_hi) return lo;
    if (d_hi < d_lo) return lo + 1;
    return (lo & 1u) ? lo + 1 : lo;
}

// Expected code of an FP32 pattern p (sign included) under satfinite RN.
static uint32_t oracle_encode(const oracle_fmt *o, uint32_t *index, uint32_t p) {
    uint32_t a = p & 0x7FFFFFFFu;
    uint32_t sign = (p >> 31) ? o->sign_bit : 0;
    if (a > 0x7F800000u) return o->nan_code;              // NaN, either sign
    if (a == 0x7F800000u) return sign | o->max_code;      // Inf saturates
    return sign | oracle_round(o, index, (double)bits_to_f(a));
}

// BF16 RN: the two BF16 neighbours of |x| and their distances in double. The neighbour above
// BF16_MAX is 2^128, the value Inf stands for when rounding with an unbounded exponent.
static uint32_t oracle_bf16(uint32_t p) {
    uint32_t a = p & 0x7FFFFFFFu;
    uint32_t sign = (p >> 16) & 0x8000u;
    if (a > 0x7F800000u) return 0x7FFFu;  // the canonical NaN, whatever the sign
    if (a == 0x7F800000u) return sign | 0x7F80u;
    uint32_t lo = a & 0xFFFF0000u;
    double v = (double)bits_to_f(a);
    double lo_v = (double)bits_to_f(lo);
    double hi_v = lo == 0x7F7F0000u ? ldexp(1.0, 128) : (double)bits_to_f(lo + 0x10000u);
    uint32_t code = lo >> 16;
    if (hi_v - v < v - lo_v || (hi_v - v == v - lo_v && (code & 1u))) code++;
    return sign | code;
}

// E8M0: clamp(ceil(log2 |v|), -127, 127) + 127 from frexp; NaN 0xFF, Inf 0xFE, 0 -> 0.
static uint32_t oracle_e8m0(uint32_t p) {
    uint32_t a = p & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0xFF;
    if (a == 0x7F800000u) return 0xFE;
    if (a == 0) return 0;
    int k;
    double f = frexp((double)bits_to_f(a), &k);  // v = f 2^k, f in [0.5, 1)
    int c = f == 0.5 ? k - 1 : k;                 // ceil(log2 v)
    if (c < -127) c = -127;
    if (c > 127) c = 127;
    return (uint32_t)(c + 127);
}

// ---------------------------------------------------------------------------------------------
// Exhaustive sweep of the encoders over all 2^32 patterns.

enum { KIND_E4M3, KIND_E5M2, KIND_E2M1, KIND_BF16, KIND_E8M0, KIND_COUNT };
static const char *const kind_names[KIND_COUNT] = {"e4m3", "e5m2", "e2m1", "bf16", "e8m0"};

typedef struct sweep_job {
    uint32_t begin, end;  // non-negative patterns [begin, end); each is also run with the sign set
    uint64_t bad[KIND_COUNT];
    uint32_t bad_input[KIND_COUNT], bad_got[KIND_COUNT], bad_want[KIND_COUNT];
} sweep_job;

static void sweep_note(sweep_job *job, int kind, uint32_t p, uint32_t got, uint32_t want) {
    if (got == want) return;
    if (job->bad[kind]++ == 0) {
        job->bad_input[kind] = p;
        job->bad_got[kind] = got;
        job->bad_want[kind] = want;
    }
}

static void *sweep_encoders(void *arg) {
    sweep_job *job = arg;
    uint32_t hint[2][3] = {{0}};  // oracle search hints: [sign][format]
    for (uint32_t a = job->begin; a < job->end; a++) {
        for (uint32_t s = 0; s < 2; s++) {
            uint32_t p = a | (s << 31);
            float x = bits_to_f(p);
            sweep_note(job, KIND_E4M3, p, qt_f32_to_e4m3(x),
                       oracle_encode(&oracle_e4m3, &hint[s][0], p));
            sweep_note(job, KIND_E5M2, p, qt_f32_to_e5m2(x),
                       oracle_encode(&oracle_e5m2, &hint[s][1], p));
            sweep_note(job, KIND_E2M1, p, qt_f32_to_e2m1(x),
                       oracle_encode(&oracle_e2m1, &hint[s][2], p));
            sweep_note(job, KIND_BF16, p, qt_f32_to_bf16(x), oracle_bf16(p));
            sweep_note(job, KIND_E8M0, p, qt_f32_to_e8m0(x), oracle_e8m0(p));
        }
    }
    return NULL;
}

static void test_encoders_exhaustive(void) {
    test_begin("codec_encoders_all_2^32_patterns");
    sweep_job jobs[SWEEP_THREADS];
    memset(jobs, 0, sizeof jobs);
    uint32_t span = 0x80000000u / SWEEP_THREADS;
    for (int t = 0; t < SWEEP_THREADS; t++) {
        jobs[t].begin = (uint32_t)t * span;
        jobs[t].end = t == SWEEP_THREADS - 1 ? 0x80000000u : (uint32_t)(t + 1) * span;
    }
    run_threads(sweep_encoders, jobs, sizeof jobs[0]);
    for (int k = 0; k < KIND_COUNT; k++) {
        for (int t = 0; t < SWEEP_THREADS; t++) {
            const sweep_job *j = &jobs[t];
            CHECK(j->bad[k] == 0, "%s: %llu mismatches, first x=0x%08X got 0x%X want 0x%X",
                  kind_names[k], (unsigned long long)j->bad[k], j->bad_input[k], j->bad_got[k],
                  j->bad_want[k]);
        }
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Hand-derived FP8 and E2M1 examples (explicit expectations).

typedef struct example { float x; uint32_t code; } example;

static void test_fp8_examples(void) {
    test_begin("codec_fp8_numerics_examples");
    static const example e4m3[] = {
        {448.0f, 0x7E}, {456.0f, 0x7E}, {464.0f, 0x7E}, {479.0f, 0x7E}, {480.0f, 0x7E},
        {1e30f, 0x7E}, {-1e30f, 0xFE}, {INFINITY, 0x7E}, {-INFINITY, 0xFE}, {NAN, 0x7F},
        {-NAN, 0x7F}, {0x1p-10f, 0x00}, {0x1.000002p-10f, 0x01}, {0x1.8p-9f, 0x02},
        {0x1.4p-8f, 0x02}, {1.0625f, 0x38}, {1.1875f, 0x3A}, {-0x1p-12f, 0x80}, {0.0f, 0x00},
        {-0.0f, 0x80}, {0x1p-149f, 0x00}, {-0x1p-149f, 0x80}, {0x1p-9f, 0x01}, {0x1p-6f, 0x08},
        {0x1.cp-7f, 0x07}, {0x1.ep-7f, 0x08}, {1.0f, 0x38}, {-2.0f, 0xC0}, {240.0f, 0x77},
    };
    static const example e5m2[] = {
        {480.0f, 0x60}, {448.0f, 0x5F}, {57344.0f, 0x7B}, {61440.0f, 0x7B}, {1e30f, 0x7B},
        {-1e30f, 0xFB}, {INFINITY, 0x7B}, {-INFINITY, 0xFB}, {NAN, 0x7F}, {-NAN, 0x7F},
        {0x1p-17f, 0x00}, {0x1.000002p-17f, 0x01}, {0x1p-16f, 0x01}, {0x1p-14f, 0x04}, {1.0f, 0x3C},
        {1.125f, 0x3C}, {1.375f, 0x3E}, {-0x1p-18f, 0x80}, {0.0f, 0x00},
    };
    for (size_t i = 0; i < sizeof e4m3 / sizeof e4m3[0]; i++) {
        uint32_t got = qt_f32_to_e4m3(e4m3[i].x);
        CHECK(got == e4m3[i].code, "e4m3(%a) = 0x%02X, want 0x%02X", e4m3[i].x, got,
              e4m3[i].code);
    }
    for (size_t i = 0; i < sizeof e5m2 / sizeof e5m2[0]; i++) {
        uint32_t got = qt_f32_to_e5m2(e5m2[i].x);
        CHECK(got == e5m2[i].code, "e5m2(%a) = 0x%02X, want 0x%02X", e5m2[i].x, got,
              e5m2[i].code);
    }
    test_end();
}

static void test_e2m1_examples(void) {
    test_begin("codec_e2m1_numerics_examples");
    static const example cases[] = {
        {0.25f, 0x0}, {0.75f, 0x2}, {1.25f, 0x2}, {1.75f, 0x4}, {2.5f, 0x4}, {3.5f, 0x6},
        {5.0f, 0x6}, {5.0001f, 0x7}, {6.0f, 0x7}, {7.0f, 0x7}, {1e30f, 0x7}, {-7.0f, 0xF},
        {INFINITY, 0x7}, {-INFINITY, 0xF}, {NAN, 0x7}, {-NAN, 0x7}, {-0.1f, 0x8}, {-0.0f, 0x8},
        {0.0f, 0x0}, {0.2500001f, 0x1}, {0.5f, 0x1}, {-1.5f, 0xB}, {3.0f, 0x5}, {-4.0f, 0xE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t got = qt_f32_to_e2m1(cases[i].x);
        CHECK(got == cases[i].code, "e2m1(%a) = 0x%X, want 0x%X", cases[i].x, got,
              cases[i].code);
    }
    static const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (uint32_t c = 0; c < 16; c++) {
        float want = (c & 8u) ? -magnitudes[c & 7u] : magnitudes[c & 7u];
        float got = qt_e2m1_to_f32((uint8_t)c);
        CHECK(f_to_bits(got) == f_to_bits(want), "e2m1_to_f32(0x%X) = %a, want %a", c, got, want);
        CHECK(qt_e2m1_to_f32((uint8_t)(c | 0xF0u)) == got, "high nibble not ignored (0x%X)", c);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Decoders over every code.

static void check_fp8_decode(const oracle_fmt *o, float (*decode)(uint8_t), bool has_inf) {
    for (uint32_t c = 0; c < 256; c++) {
        uint32_t mag = c & 0x7Fu;
        float got = decode((uint8_t)c);
        if (mag > o->max_code) {
            bool inf_code = has_inf && mag == o->max_code + 1;
            CHECK(inf_code ? isinf(got) : isnan(got), "%s decode 0x%02X = %a", o->name, c, got);
            CHECK(!inf_code || (c >= 0x80u) == (got < 0), "%s Inf sign 0x%02X", o->name, c);
            continue;
        }
        double want = (c & 0x80u) ? -o->value[mag] : o->value[mag];
        CHECK((double)got == want && !signbit(got) == !signbit(want),
              "%s decode 0x%02X = %a, want %a", o->name, c, got, want);
        uint32_t back = o == &oracle_e4m3 ? qt_f32_to_e4m3(got) : qt_f32_to_e5m2(got);
        CHECK(back == c, "%s encode(decode(0x%02X)) = 0x%02X", o->name, c, back);
    }
}

static void test_decoders(void) {
    test_begin("codec_decoders_all_codes");
    check_fp8_decode(&oracle_e4m3, qt_e4m3_to_f32, false);
    check_fp8_decode(&oracle_e5m2, qt_e5m2_to_f32, true);
    for (uint32_t e = 0; e < 256; e++) {
        float value = qt_e8m0_to_f32((uint8_t)e);
        float inverse = qt_e8m0_inv_f32((uint8_t)e);
        if (e == 255) {
            CHECK(f_to_bits(value) == 0x7FFFFFFFu && f_to_bits(inverse) == 0x7FFFFFFFu,
                  "e8m0 0xFF must decode to NaN 0x7FFFFFFF");
            continue;
        }
        CHECK((double)value == ldexp(1.0, (int)e - 127), "e8m0_to_f32(%u) = %a", e, value);
        CHECK((double)inverse == ldexp(1.0, 127 - (int)e), "e8m0_inv_f32(%u) = %a", e, inverse);
        CHECK(value * inverse == 1.0f, "e8m0 %u: value * inverse != 1", e);
    }
    CHECK(f_to_bits(qt_e8m0_to_f32(0)) == 0x00400000u, "e8m0 0 -> 0x00400000");
    CHECK(f_to_bits(qt_e8m0_inv_f32(254)) == 0x00400000u, "e8m0 inv 254 -> 0x00400000");
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t got = f_to_bits(qt_bf16_to_f32((uint16_t)h));
        CHECK(got == h << 16, "bf16_to_f32(0x%04X) = 0x%08X", h, got);
        if (got == h << 16 && (h & 0x7FFFu) <= 0x7F80u) {
            uint32_t back = qt_f32_to_bf16(bits_to_f(got));
            CHECK(back == h, "bf16 round trip 0x%04X -> 0x%04X", h, back);
        }
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// E2M1 stochastic rounding: the rounding rule recomputed in double, plus its probability.

static double sr_step(double a) { return a < 2.0 ? 0.5 : (a < 4.0 ? 1.0 : 2.0); }

// The recipe in double. The fma of the recipe rounds a + u s to FP32 once; a + u s is exact in
// double for the magnitudes used here (a >= 2^-30 or tiny enough to vanish), so (float) of it is
// that single rounding.
static uint32_t sr_oracle(float x, uint32_t r8) {
    if (isnan(x)) return 0x7;
    double a = fabs((double)x);
    double t = (double)(float)(a + (r8 / 256.0) * sr_step(a));
    double st = sr_step(t);
    double q = fmin(floor(t / st) * st, 6.0);
    uint32_t index = 0;
    uint32_t code = oracle_round(&oracle_e2m1, &index, q);  // q is on the grid: exact
    return (signbit(x) ? 0x8u : 0u) | code;
}

// xorshift32: only spreads sample points, no statistical quality needed.
static uint32_t next_random(uint32_t *state) {
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

// Checks one magnitude (both signs) for all 256 r8 and, inside the grid, the round-up count.
static void sr_check_magnitude(float a) {
    for (int s = 0; s < 2; s++) {
        float x = s ? -a : a;
        uint32_t ups = 0;
        for (uint32_t r8 = 0; r8 < 256; r8++) {
            uint32_t got = qt_f32_to_e2m1_sr(x, r8);
            uint32_t want = sr_oracle(x, r8);
            CHECK(got == want, "e2m1_sr(%a, %u) = 0x%X, want 0x%X", x, r8, got, want);
            if ((double)fabsf(qt_e2m1_to_f32((uint8_t)got)) > (double)a) ups++;
        }
        if (!(a < 6.0f) || isnan(a)) continue;
        uint32_t lo = 0;
        while (oracle_e2m1.value[lo + 1] <= (double)a) lo++;
        double width = oracle_e2m1.value[lo + 1] - oracle_e2m1.value[lo];
        double expect = 256.0 * ((double)a - oracle_e2m1.value[lo]) / width;
        CHECK(ups == (uint32_t)floor(expect) || ups == (uint32_t)ceil(expect),
              "e2m1_sr(%a): %u round-ups of 256, want %.3f", x, ups, expect);
    }
}

static void test_e2m1_sr(void) {
    test_begin("codec_e2m1_stochastic_rounding");
    static const float grid[9] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f};
    uint32_t state = 12345;
    for (int b = 0; b < 8; b++) {
        float lo = grid[b], hi = grid[b + 1];
        sr_check_magnitude(lo);
        sr_check_magnitude(nextafterf(lo, hi));
        sr_check_magnitude(nextafterf(hi, lo));
        for (int k = 1; k < 16; k++) sr_check_magnitude(lo + (hi - lo) * (float)k / 16.0f);
        for (int k = 0; k < 200; k++) {
            float u = (float)(next_random(&state) & 0xFFFFFFu) * 0x1p-24f;
            sr_check_magnitude(lo + (hi - lo) * u);
        }
    }
    static const float extra[] = {0x1p-30f, 0x1p-149f, 1e-40f, 0x1.fffffep-2f, 100.0f, 1e30f,
                                  INFINITY, NAN};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) sr_check_magnitude(extra[i]);
    CHECK(qt_f32_to_e2m1_sr(-NAN, 0) == 0x7 && qt_f32_to_e2m1_sr(-INFINITY, 255) == 0xF,
          "NaN -> 0x7, -Inf -> 0xF");
    CHECK(qt_f32_to_e2m1_sr(1.25f, 0) == 0x2 && qt_f32_to_e2m1_sr(1.25f, 128) == 0x3,
          "1.25 rounds down for r8 = 0 and up from r8 = 128");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// scale_from_amax and the FP32 constants.

typedef struct scale_case {
    float amax, qmax;
    int pow2;
    float eps, inf_repl;
    uint32_t want_bits;
    const char *why;
} scale_case;

static void test_scale_from_amax(void) {
    test_begin("codec_scale_from_amax");
    const float flt_max = bits_to_f(0x7F7FFFFFu), bf16_max = bits_to_f(0x7F7F0000u);
    const scale_case cases[] = {
        {448.0f, 448.0f, 0, 0.0f, flt_max, 0x3F800000u, "amax == qmax -> 1"},
        {0.0f, 448.0f, 0, 0.0f, flt_max, 0x3F800000u, "amax 0 -> 1"},
        {INFINITY, 448.0f, 1, 0.0f, flt_max, 0x3F800000u, "amax Inf -> 1"},
        {NAN, 448.0f, 0, 1e-3f, flt_max, 0x3F800000u, "NaN amax skips eps, -> 1"},
        {0.0f, 448.0f, 0, 0x1p-10f, flt_max, 0x48E00000u, "eps replaces 0: 448 * 1024"},
        {1e-5f, 448.0f, 0, 0x1p-4f, flt_max, 0x45E00000u, "eps 1/16 > amax: 448 * 16"},
        {3.0f, 448.0f, 1, 0.0f, flt_max, 0x43000000u, "149.33 truncates to 128"},
        {1000.0f, 448.0f, 1, 0.0f, flt_max, 0x3E800000u, "0.448 truncates to 0.25"},
        {1e-40f, 448.0f, 0, 0.0f, flt_max, 0x7F7FFFFFu, "Inf scale -> inf_repl"},
        {1e-40f, 448.0f, 1, 0.0f, flt_max, 0x7F000000u, "FLT_MAX truncates to 2^127"},
        {0x1p-128f, 448.0f, 1, 0.0f, bf16_max, 0x7F000000u, "BF16_MAX truncates to 2^127"},
        {0x1p-128f, 448.0f, 1, 0.0f, 65504.0f, 0x47000000u, "FP16_MAX truncates to 32768"},
        {0x1p-128f, 448.0f, 0, 0.0f, 65504.0f, 0x477FE000u, "inf_repl used as is"},
        {57344.0f * 0x1p-20f, 57344.0f, 1, 0.0f, flt_max, 0x49800000u, "exactly 2^20"},
        {448.0f * 0x1p-120f, 448.0f, 0, 0.0f, flt_max, 0x7B800000u, "exactly 2^120"},
        {0x1.dc6534p-120f, 448.0f, 0, 0.0f, 65504.0f, 0x7F70BDC2u, "3.2e38 is finite: kept"},
        {0x1.ba5df8p-120f, 448.0f, 0, 0.0f, 65504.0f, 0x477FE000u, "3.4e38 overflows: inf_repl"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const scale_case *c = &cases[i];
        float got = qt_scale_from_amax(c->amax, c->qmax, c->pow2, c->eps, c->inf_repl);
        CHECK(f_to_bits(got) == c->want_bits, "%s: scale_from_amax(%a) = %a (0x%08X), want 0x%08X",
              c->why, c->amax, got, f_to_bits(got), c->want_bits);
    }
    // RN(qmax / amax): one IEEE division. Dividing in double and rounding once to FP32 gives the
    // same result (double has more than 2 * 24 + 2 bits), so it serves as the oracle.
    uint32_t state = 777;
    for (int i = 0; i < 100000; i++) {
        float amax = bits_to_f(0x00800000u + next_random(&state) % 0x7E000000u);
        float want = (float)(448.0 / (double)amax);
        if (isinf(want)) want = flt_max;
        float got = qt_scale_from_amax(amax, 448.0f, 0, 0.0f, flt_max);
        CHECK(f_to_bits(got) == f_to_bits(want), "scale_from_amax(%a) = %a, want %a", amax, got,
              want);
        float got2 = qt_scale_from_amax(amax, 448.0f, 1, 0.0f, flt_max);
        CHECK(f_to_bits(got2) == (f_to_bits(want) & 0xFF800000u), "pow2 of %a", amax);
    }
    test_end();
}

static void test_constants(void) {
    test_begin("codec_constants");
    CHECK(QT_F32_INV_448 == (float)(1.0 / 448.0), "f32(1/448)");
    CHECK(QT_F32_INV_57344 == (float)(1.0 / 57344.0), "f32(1/57344)");
    CHECK(QT_F32_INV_6 == (float)(1.0 / 6.0), "f32(1/6)");
    CHECK(QT_F32_INV_2688 == (float)(1.0 / 2688.0), "f32(1/2688)");
    CHECK((double)QT_E4M3_MAX == oracle_e4m3.value[oracle_e4m3.max_code], "E4M3 max");
    CHECK((double)QT_E5M2_MAX == oracle_e5m2.value[oracle_e5m2.max_code], "E5M2 max");
    CHECK((double)QT_E2M1_MAX == oracle_e2m1.value[oracle_e2m1.max_code], "E2M1 max");
    CHECK(f_to_bits(QT_F32_FLT_MAX) == 0x7F7FFFFFu, "FLT_MAX");
    CHECK((double)QT_F32_BF16_MAX == ldexp(255.0 / 128.0, 127), "BF16_MAX = 0x1.FEp127");
    // 448 * f32(1/448) rounds to exactly 1, so an amax of 448 * 2^k gives 2^k.
    CHECK(448.0f * QT_F32_INV_448 == 1.0f && 57344.0f * QT_F32_INV_57344 == 1.0f, "amax = qmax");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Transcendentals against double libm: max error in ulp over a dense sample, plus special values.

#ifndef MATH_SWEEP_STEP
#define MATH_SWEEP_STEP 64  // every 64th bit pattern; build with -DMATH_SWEEP_STEP=1 for all
#endif

#define PI_DOUBLE 3.14159265358979323846

// sin(pi x) (quadrant_shift 0) or cos(pi x) = sin(pi (x + 1/2)) (quadrant_shift 1) in double:
// x mod 2 and the split into n/2 + d are exact, so libm only sees |pi d| <= pi/4.
static double ref_pi_trig(double x, int quadrant_shift) {
    double r = fmod(fabs(x), 2.0);
    double n = nearbyint(2.0 * r);
    double d = r - 0.5 * n;
    double v;
    switch (((int)n + quadrant_shift) & 3) {
    case 0: v = sin(PI_DOUBLE * d); break;
    case 1: v = cos(PI_DOUBLE * d); break;
    case 2: v = -sin(PI_DOUBLE * d); break;
    default: v = -cos(PI_DOUBLE * d); break;
    }
    return (quadrant_shift == 0 && x < 0) ? -v : v;
}
static double ref_sinpi(double x) { return ref_pi_trig(x, 0); }
static double ref_cospi(double x) { return ref_pi_trig(x, 1); }

// Error of y in units of the last place of the FP32 result nearest ref (2^-149 below 2^-126).
// Where ref is outside the FP32 range, y must be exactly the FP32 rounding of ref (Inf).
static double ulp_error(float y, double ref) {
    float ref_f = (float)ref;
    if (isinf(ref_f)) return f_to_bits(y) == f_to_bits(ref_f) ? 0.0 : INFINITY;
    if (!isfinite(y)) return INFINITY;
    int e = -126;
    if (ref != 0.0) {
        frexp(ref, &e);
        e = e - 1 < -126 ? -126 : e - 1;
    }
    return fabs((double)y - ref) / ldexp(1.0, e - 23);
}

typedef struct math_case {
    const char *name;
    float (*fn)(float);
    double (*ref)(double);
    float lo, hi;   // sampled domain; outside it results are constants checked as specials
    double bound;   // ulp bound stated in qt_math.h
} math_case;

typedef struct math_job {
    const math_case *mc;
    uint32_t offset;
    double err_max;
    float worst_x;
    uint64_t points;
} math_job;

static void *sweep_math(void *arg) {
    math_job *job = arg;
    const uint64_t stride = (uint64_t)MATH_SWEEP_STEP * SWEEP_THREADS;
    for (uint64_t b = job->offset; b < 0x100000000ull; b += stride) {
        float x = bits_to_f((uint32_t)b);
        if (!(x >= job->mc->lo && x <= job->mc->hi)) continue;  // NaN fails too
        double err = ulp_error(job->mc->fn(x), job->mc->ref((double)x));
        job->points++;
        if (!(err <= job->err_max)) {
            job->err_max = err;
            job->worst_x = x;
        }
    }
    return NULL;
}

static void test_math_ulp(void) {
    test_begin("math_ulp_vs_libm");
    static const math_case cases[] = {
        {"qt_expf", qt_expf, exp, -110.0f, 100.0f, 1.0},
        {"qt_logf", qt_logf, log, 0.0f, 0x1.fffffep127f, 1.0},
        {"qt_erff", qt_erff, erf, -6.0f, 6.0f, 1.2},
        {"qt_sinpif", qt_sinpif, ref_sinpi, -0x1p25f, 0x1p25f, 1.1},
        {"qt_cospif", qt_cospif, ref_cospi, -0x1p25f, 0x1p25f, 1.1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        math_job jobs[SWEEP_THREADS];
        memset(jobs, 0, sizeof jobs);
        for (int t = 0; t < SWEEP_THREADS; t++) {
            jobs[t].mc = &cases[i];
            jobs[t].offset = (uint32_t)t * MATH_SWEEP_STEP;
        }
        run_threads(sweep_math, jobs, sizeof jobs[0]);
        math_job *worst = &jobs[0];
        uint64_t points = 0;
        for (int t = 0; t < SWEEP_THREADS; t++) {
            points += jobs[t].points;
            if (!(jobs[t].err_max <= worst->err_max)) worst = &jobs[t];
        }
        printf("  %-9s max %.3f ulp at %a (%llu points, bound %.1f)\n", cases[i].name,
               worst->err_max, worst->worst_x, (unsigned long long)points, cases[i].bound);
        CHECK(worst->err_max <= cases[i].bound, "%s: %.3f ulp at %a exceeds %.1f", cases[i].name,
              worst->err_max, worst->worst_x, cases[i].bound);
    }
    test_end();
}

typedef struct math_special {
    const char *name;
    float (*fn)(float);
    float x;
    uint32_t want_bits;
} math_special;

#define ANY_NAN QT_MATH_NAN_BITS  // every NaN result is this canonical pattern

static void test_math_specials(void) {
    test_begin("math_special_values");
    static const math_special cases[] = {
        {"exp", qt_expf, NAN, ANY_NAN}, {"exp", qt_expf, -NAN, ANY_NAN},
        {"exp", qt_expf, INFINITY, 0x7F800000u},
        {"exp", qt_expf, -INFINITY, 0x00000000u}, {"exp", qt_expf, 0.0f, 0x3F800000u},
        {"exp", qt_expf, -0.0f, 0x3F800000u}, {"exp", qt_expf, 88.8f, 0x7F800000u},
        {"exp", qt_expf, 0x1.62e42ep+6f, 0x7F7FFF84u}, {"exp", qt_expf, -103.3f, 0x00000001u},
        {"exp", qt_expf, -104.5f, 0x00000000u}, {"exp", qt_expf, 1e30f, 0x7F800000u},
        {"log", qt_logf, NAN, ANY_NAN}, {"log", qt_logf, -1.0f, ANY_NAN},
        {"log", qt_logf, -INFINITY, ANY_NAN}, {"log", qt_logf, -0x1p-149f, ANY_NAN},
        {"log", qt_logf, 0.0f, 0xFF800000u}, {"log", qt_logf, -0.0f, 0xFF800000u},
        {"log", qt_logf, INFINITY, 0x7F800000u}, {"log", qt_logf, 1.0f, 0x00000000u},
        {"log", qt_logf, 0x1p-149f, 0xC2CE8ED0u}, {"log", qt_logf, 2.0f, 0x3F317218u},
        {"erf", qt_erff, NAN, ANY_NAN}, {"erf", qt_erff, INFINITY, 0x3F800000u},
        {"erf", qt_erff, -INFINITY, 0xBF800000u}, {"erf", qt_erff, 0.0f, 0x00000000u},
        {"erf", qt_erff, -0.0f, 0x80000000u}, {"erf", qt_erff, 10.0f, 0x3F800000u},
        {"sinpi", qt_sinpif, NAN, ANY_NAN}, {"sinpi", qt_sinpif, INFINITY, ANY_NAN},
        {"sinpi", qt_sinpif, -INFINITY, ANY_NAN}, {"sinpi", qt_sinpif, 0.0f, 0x00000000u},
        {"sinpi", qt_sinpif, -0.0f, 0x80000000u}, {"sinpi", qt_sinpif, 1.0f, 0x00000000u},
        {"sinpi", qt_sinpif, -1.0f, 0x80000000u}, {"sinpi", qt_sinpif, 0.5f, 0x3F800000u},
        {"sinpi", qt_sinpif, -1.5f, 0x3F800000u}, {"sinpi", qt_sinpif, 0x1p30f, 0x00000000u},
        {"sinpi", qt_sinpif, 0.25f, 0x3F3504F3u}, {"sinpi", qt_sinpif, 0x1.000002p23f, 0},
        {"cospi", qt_cospif, NAN, ANY_NAN}, {"cospi", qt_cospif, INFINITY, ANY_NAN},
        {"cospi", qt_cospif, 0.0f, 0x3F800000u}, {"cospi", qt_cospif, 1.0f, 0xBF800000u},
        {"cospi", qt_cospif, 0.5f, 0x00000000u}, {"cospi", qt_cospif, -1.5f, 0x00000000u},
        {"cospi", qt_cospif, 0x1p30f, 0x3F800000u},
        {"cospi", qt_cospif, 0x1.000002p23f, 0xBF800000u},
        {"cospi", qt_cospif, 0x1.800002p22f, 0x00000000u},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const math_special *c = &cases[i];
        float got = c->fn(c->x);
        CHECK(f_to_bits(got) == c->want_bits, "%s(%a) = %a (0x%08X), want 0x%08X", c->name, c->x,
              got, f_to_bits(got), c->want_bits);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The format table.

typedef struct format_row {
    qt_format format;
    const char *name;
    qt_elem elem;
    uint32_t bits, block_rows, block_cols, weight_block_rows;
    qt_scale_kind scale;
    bool transposed;
    uint32_t row_align, k_unit, gemm_format;
} format_row;

static void test_format_table(void) {
    test_begin("format_table");
    static const format_row rows[] = {
        {QT_FORMAT_BF16, "bf16", QT_ELEM_BF16, 16, 1, 1, 1, QT_SCALE_NONE, false, 16, 8,
         GEMM_FORMAT_BF16},
        {QT_FORMAT_FP8_E4M3, "fp8_e4m3", QT_ELEM_E4M3, 8, 1, 1, 1, QT_SCALE_TENSOR_FP32, true,
         16, 16, GEMM_FORMAT_FP8},
        {QT_FORMAT_FP8_E5M2, "fp8_e5m2", QT_ELEM_E5M2, 8, 1, 1, 1, QT_SCALE_TENSOR_FP32, true,
         16, 16, GEMM_FORMAT_FP8},
        {QT_FORMAT_MXFP8, "mxfp8", QT_ELEM_E4M3, 8, 1, 32, 32, QT_SCALE_BLOCK_E8M0, false, 32, 32,
         GEMM_FORMAT_MXFP8},
        {QT_FORMAT_FP8_BLOCK_1D, "fp8_block_1d", QT_ELEM_E4M3, 8, 1, 128, 1, QT_SCALE_BLOCK_FP32,
         true, 128, 128, GEMM_FORMAT_FP8_BLOCK},
        {QT_FORMAT_FP8_BLOCK_2D, "fp8_block_2d", QT_ELEM_E4M3, 8, 128, 128, 128,
         QT_SCALE_BLOCK_FP32, true, 128, 128, GEMM_FORMAT_FP8_BLOCK},
        {QT_FORMAT_NVFP4, "nvfp4", QT_ELEM_E2M1, 4, 1, 16, 16, QT_SCALE_BLOCK_E4M3_TENSOR_FP32,
         true, 16, 32, GEMM_FORMAT_NVFP4},
    };
    // A new format fails to compile here until its expected row is written.
    _Static_assert(sizeof rows / sizeof rows[0] == QT_FORMAT_COUNT, "a row per qt_format");
    static const float samples[] = {0.0f, -0.3f, 1.0f, 2.5f, -5.0f, 300.0f, 1e9f, NAN};
    for (int i = 0; i < QT_FORMAT_COUNT; i++) {
        const format_row *want = &rows[i];
        const qt_format_traits *t = qt_format_get(want->format);
        CHECK(t == &qt_format_table[want->format], "qt_format_get(%d)", i);
        CHECK(strcmp(t->name, want->name) == 0, "name %s, want %s", t->name, want->name);
        CHECK(t->elem_default == want->elem && t->bits_per_elem == want->bits, "%s elem", t->name);
        CHECK(t->block_rows == want->block_rows && t->block_cols == want->block_cols &&
              t->weight_block_rows == want->weight_block_rows, "%s blocks", t->name);
        CHECK(t->scale_kind == want->scale && t->colwise_transposed == want->transposed &&
              t->row_align == want->row_align, "%s scale/layout", t->name);
        // K padding: whole 16-byte vectors of codes and whole scaling blocks along K.
        CHECK(t->k_unit == want->k_unit && t->k_unit * t->bits_per_elem % 128 == 0 &&
              t->k_unit % t->block_cols == 0, "%s k_unit %u", t->name, t->k_unit);
        CHECK(t->gemm_format == want->gemm_format, "%s gemm_format %u", t->name, t->gemm_format);
        qt_format parsed = QT_FORMAT_COUNT;
        CHECK(qt_format_from_name(want->name, &parsed) && parsed == want->format, "parse %s",
              want->name);
        if (t->elem_default == QT_ELEM_BF16) {
            CHECK(t->encode == NULL && t->decode == NULL, "bf16 has no 8-bit codec");
            continue;
        }
        for (size_t s = 0; s < sizeof samples / sizeof samples[0]; s++) {
            uint8_t want_code = t->elem_default == QT_ELEM_E4M3 ? qt_f32_to_e4m3(samples[s])
                                : t->elem_default == QT_ELEM_E5M2 ? qt_f32_to_e5m2(samples[s])
                                                                  : qt_f32_to_e2m1(samples[s]);
            CHECK(t->encode(samples[s]) == want_code, "%s encode(%a)", t->name, samples[s]);
            float want_value = t->elem_default == QT_ELEM_E4M3 ? qt_e4m3_to_f32(want_code)
                               : t->elem_default == QT_ELEM_E5M2 ? qt_e5m2_to_f32(want_code)
                                                                 : qt_e2m1_to_f32(want_code);
            CHECK(f_to_bits(t->decode(want_code)) == f_to_bits(want_value), "%s decode(0x%02X)",
                  t->name, want_code);
        }
        CHECK(t->decode(t->encode(1.0f)) == 1.0f, "%s: decode(encode(1)) != 1", t->name);
    }
    qt_format untouched = QT_FORMAT_NVFP4;
    CHECK(!qt_format_from_name("fp9", &untouched) && untouched == QT_FORMAT_NVFP4, "fp9");
    CHECK(!qt_format_from_name("", &untouched) && !qt_format_from_name("BF16", &untouched),
          "names are exact and case-sensitive");
    static const char *const elems[] = {"bf16", "fp32", "e4m3", "e5m2", "e2m1", "e8m0"};
    _Static_assert(sizeof elems / sizeof elems[0] == QT_ELEM_COUNT, "a name per qt_elem");
    for (int e = 0; e < QT_ELEM_COUNT; e++) {
        CHECK(strcmp(qt_elem_name((qt_elem)e), elems[e]) == 0, "elem %d: %s", e,
              qt_elem_name((qt_elem)e));
    }
    test_end();
}

int main(void) {
    oracle_fmt_init(&oracle_e4m3);
    oracle_fmt_init(&oracle_e5m2);
    oracle_fmt_init(&oracle_e2m1);
    test_fp8_examples();
    test_e2m1_examples();
    test_decoders();
    test_constants();
    test_scale_from_amax();
    test_e2m1_sr();
    test_format_table();
    test_math_specials();
    test_math_ulp();
    test_encoders_exhaustive();
    return test_exit_code();
}
