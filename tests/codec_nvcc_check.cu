// codec_nvcc_check: compile-only proof that ptx/qt_codec.h and ptx/qt_math.h build as device code
// under nvcc (-fmad=false, warnings as errors) and that every function is callable from a kernel.
// Built by `ninja build/tests/codec_nvcc_check.o`; never linked or launched.
#include "ptx/qt_codec.h"
#include "ptx/qt_math.h"

__global__ void codec_nvcc_check(const float *in, float *out, uint8_t *codes, uint16_t *halves) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const float x = in[i];
    codes[8 * i + 0] = qt_f32_to_e4m3(x);
    codes[8 * i + 1] = qt_f32_to_e5m2(x);
    codes[8 * i + 2] = qt_f32_to_e2m1(x);
    codes[8 * i + 3] = qt_f32_to_e2m1_sr(x, i & 0xFFu);
    codes[8 * i + 4] = qt_f32_to_e8m0(x);
    halves[i] = qt_f32_to_bf16(x);
    const uint8_t c = codes[8 * i + 5];
    float acc = qt_e4m3_to_f32(c) + qt_e5m2_to_f32(c) + qt_e2m1_to_f32(c);
    acc += qt_e8m0_to_f32(c) * qt_e8m0_inv_f32(c) + qt_bf16_to_f32(halves[i + 1]);
    acc += qt_scale_from_amax(x, QT_E4M3_MAX, 1, 0.0f, QT_F32_FLT_MAX);
    acc += QT_F32_INV_448 + QT_F32_INV_57344 + QT_F32_INV_6 + QT_F32_INV_2688 + QT_E5M2_MAX;
    acc += QT_E2M1_MAX + QT_F32_BF16_MAX;
    acc += qt_expf(x) + qt_logf(x) + qt_erff(x) + qt_cospif(x) + qt_sinpif(x);
    out[i] = acc;
}
