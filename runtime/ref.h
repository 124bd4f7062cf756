// ref: the C twin of every kernel, named ref_<symbol>, taking the kernel's own args struct.
//
// Owns nothing. Addresses in args are host addresses on the reference backend (its arenas live
// in host memory), so a twin casts them straight to pointers. The launch shape is passed for the
// few twins whose outputs depend on it (per-block partial results).
#ifndef QT_REF_H
#define QT_REF_H

#include <stdint.h>

#include "kernels.h"  // QT_KERNELS, args structs
#include "modules.h"  // launch_shape

#define QT_REF_DECL(id, module, symbol, args) \
    void ref_##symbol(const args *a, const launch_shape *shape);
QT_KERNELS(QT_REF_DECL)
#undef QT_REF_DECL

// Host pointer from an args address field.
#define REF_PTR(type, address) ((type *)(uintptr_t)(address))

#endif  // QT_REF_H
