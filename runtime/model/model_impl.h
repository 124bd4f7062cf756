// model_impl: what model.c (planning) and model_build.c (programs) share; not an interface for
// other modules.
#ifndef QT_MODEL_IMPL_H
#define QT_MODEL_IMPL_H

#include "runtime/model/model.h"

// Where a quantized tensor's regions go: persistent (a weight) or transient in one program
// (first use widens the lifetime), named "<prefix>.<part>".
typedef struct model_place {
    arena *arena;
    const char *prefix;
    bool persistent;
    arena_category category;
    // A transient place of a step whose amaxes are merged into from +0 every step: they are
    // slots of the step (model_amax); NULL: regions of their own, zeroed by whoever merges.
    model_amax_slots *amax_slots;
} model_place;

// Reserves the stored copies of one quantized tensor [rows][cols] for the enabled directions;
// a grouped tensor of `members` members (0: dense) has its per-tensor quantities (scale_inv,
// the current-scaling amax, NVFP4's global amaxes) per member. BF16 gets a region only when
// bf16_region is set (a tensor that is already BF16 is used as it is). values
// (MODEL_QSTORE_*_VALUES, MXFP8 only): directions stored as BF16 values, without scales.
qt_status model_qstore_reserve(const model_place *place, const model_quantizer *mq,
                               uint32_t rows, uint32_t cols, uint32_t members, bool rowwise,
                               bool colwise, uint32_t values, bool bf16_region,
                               model_qstore *out);

// A region of `bytes` (rounded up to 16) at `place`.
qt_status model_region(const model_place *place, const char *part, uint64_t bytes,
                       arena_category category, prog_ref *out);
// A part (arena_reserve_part) of `bytes` (rounded up to 16) of the transient region `whole`,
// named as model_region names its regions.
qt_status model_region_part(const model_place *place, prog_ref whole, const char *part,
                            uint64_t bytes, prog_ref *out);
// A per-tensor amax array of `bytes` at `place`: a slot of the step (its part of the step's
// region, model_amax_slots) where the place has them, else a region of `category`.
qt_status model_amax(const model_place *place, const char *part, uint64_t bytes,
                     arena_category category, prog_ref *out);

// The per-tensor FP8 element code of an element type.
uint32_t model_fp8_code(qt_elem e);
// GEMM_FORMAT_* of a format (its table row), GEMM_ELEM_* of an element type.
uint32_t model_gemm_format_of(qt_format f);
uint32_t model_gemm_elem_of(qt_elem e);

#endif  // QT_MODEL_IMPL_H
