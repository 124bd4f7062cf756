// C twins of ptx/quant_group.cu.
#include "runtime/ref/ref.h"

void ref_qt_group_offsets(const group_offsets_args *a, const launch_shape *shape) {
    (void)shape;
    const uint32_t *dims = REF_PTR(const uint32_t, a->first_dims);
    uint32_t *off = REF_PTR(uint32_t, a->row_offsets);
    off[0] = 0;
    for (uint32_t i = 0; i < a->count; i++) {
        off[i + 1] = off[i] + qt_group_roundup(dims[i], a->row_align);
    }
}
