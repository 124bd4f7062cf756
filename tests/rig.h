// rig: a backend with its two arenas and one program, as tests build them. Tests compare the
// same program on the GPU and on the reference backend, so a rig is opened once per backend.
//
// Owns the arenas, the program and (for the reference backend) the host memory behind the
// arenas, from rig_open to rig_close. Test code only: it allocates with malloc.
#ifndef QT_TEST_RIG_H
#define QT_TEST_RIG_H

#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "runtime/ops/op_act.h"  // op_act_forward, op_act_backward (rig_act_bf16)
#include "tests/test.h"          // test_skip (rig_pair_close)

// Tables of test programs and arenas (runtime/program/program.h, arena/arena.h) are sized
// generously instead of from a model: RIG_OPS ops, RIG_REGIONS regions, from malloc, one allocation
// per program or arena variable (keyed by its address), reused by every later init of that variable
// and kept until its rig closes.
#define RIG_OPS 2048
#define RIG_REGIONS 2048
#define RIG_TABLE_OWNERS 256

// The owners' tables; a closed rig gives its three back (rig_close), so a test that opens rigs
// in many frames reuses the slots instead of running out.
typedef struct rig_table {
    const void *owner;
    void *storage;
    size_t bytes;
} rig_table;

static inline rig_table *rig_tables(void) {
    static rig_table tables[RIG_TABLE_OWNERS];
    return tables;
}

static inline void *rig_table_for(const void *owner, size_t bytes) {
    rig_table *tables = rig_tables();
    for (int i = 0; i < RIG_TABLE_OWNERS; i++) {
        if (tables[i].owner == owner && tables[i].bytes >= bytes) return tables[i].storage;
    }
    for (int i = 0; i < RIG_TABLE_OWNERS; i++) {
        if (tables[i].owner != NULL && tables[i].owner != owner) continue;
        free(tables[i].storage);
        tables[i].owner = owner;
        tables[i].bytes = bytes;
        tables[i].storage = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (tables[i].storage == NULL) abort();
        return tables[i].storage;
    }
    fprintf(stderr, "rig_table_for: more than %d programs and arenas open at once\n",
            RIG_TABLE_OWNERS);
    abort();
}

static inline void rig_table_drop(const void *owner) {
    rig_table *tables = rig_tables();
    for (int i = 0; i < RIG_TABLE_OWNERS; i++) {
        if (tables[i].owner != owner) continue;
        free(tables[i].storage);
        memset(&tables[i], 0, sizeof tables[i]);
    }
}

static inline void rig_prog_init(program *p, const char *mode) {
    prog_init(p, mode, 0, rig_table_for(p, prog_storage_bytes(RIG_OPS)), RIG_OPS);
}

static inline void rig_arena_init(arena *a, arena_kind kind, const char *name) {
    arena_init(a, kind, name, rig_table_for(a, arena_storage_bytes(RIG_REGIONS)), RIG_REGIONS);
}

typedef struct rig {
    backend be;
    arena dev;
    arena host;
    program prog;
    void *ref_memory[2];
    bool bound;
} rig;

// Opens the backend; for BACKEND_GPU returns false (and sets *why) when no GPU can be used, so
// the caller reports the case as skipped.
static inline bool rig_open(rig *r, backend_kind kind, const char **why) {
    memset(r, 0, sizeof *r);
    if (kind == BACKEND_GPU) {
        qt_status status = backend_open_gpu(&r->be, 0);
        if (status != QT_OK) {
            *why = qt_error_message();
            return false;
        }
    } else {
        backend_open_ref(&r->be);
    }
    rig_arena_init(&r->dev, ARENA_KIND_DEVICE, "device");
    rig_arena_init(&r->host, ARENA_KIND_HOST, "host");
    rig_prog_init(&r->prog, "test");
    return true;
}

static inline arena_handle rig_reserve(rig *r, const char *name, uint64_t bytes) {
    arena_handle h;
    qt_status status = arena_reserve(&r->dev, name, bytes, 256, ARENA_CAT_WORKSPACE,
                                     ARENA_LIFETIME_PERSISTENT, 0, &h);
    if (status != QT_OK) {
        fprintf(stderr, "rig_reserve %s: %s\n", name, qt_error_message());
        abort();
    }
    return h;
}

static inline prog_ref rig_ref(rig *r, arena_handle h, uint64_t offset) {
    return (prog_ref){&r->dev, h, offset};
}

// Binds both arenas and resolves the program. Aborts on failure: a test rig that cannot bind
// is a broken test, not a result.
static inline void rig_bind(rig *r) {
    for (int i = 0; i < 2; i++) {
        arena *a = i == 0 ? &r->dev : &r->host;
        arena_pack(a);
        uint64_t bytes = a->bytes_total ? a->bytes_total : 256;
        if (r->be.kind == BACKEND_REF) r->ref_memory[i] = aligned_alloc(256, bytes);
        if (backend_bind(&r->be, a, r->ref_memory[i], bytes) != QT_OK) {
            fprintf(stderr, "rig_bind: %s\n", qt_error_message());
            abort();
        }
    }
    prog_resolve(&r->prog);
    r->bound = true;
}

// Releases the arenas and their memory; the backend (and its loaded modules) stays open.
static inline void rig_release(rig *r) {
    if (r->bound) {
        backend_release(&r->be, &r->dev);
        backend_release(&r->be, &r->host);
    }
    free(r->ref_memory[0]);
    free(r->ref_memory[1]);
    r->ref_memory[0] = r->ref_memory[1] = NULL;
    r->bound = false;
}

// A fresh case on an open rig: new arenas and an empty program, the same backend.
static inline void rig_reset(rig *r) {
    rig_release(r);
    rig_arena_init(&r->dev, ARENA_KIND_DEVICE, "device");
    rig_arena_init(&r->host, ARENA_KIND_HOST, "host");
    rig_prog_init(&r->prog, "test");
}

static inline void rig_close(rig *r) {
    rig_release(r);
    backend_close(&r->be);
    rig_table_drop(&r->dev);
    rig_table_drop(&r->host);
    rig_table_drop(&r->prog);
}

// Runs a status-returning call inside a test; a failure is a failed check with the message.
#define RIG_OK(call)                                                                  \
    do {                                                                              \
        qt_status rig_status_ = (call);                                               \
        CHECK(rig_status_ == QT_OK, "%s: %s", qt_status_name(rig_status_),           \
              qt_error_message());                                                    \
    } while (0)

// Both backends' rigs for a test that runs one program on each and compares them: the GPU's
// (on_gpu false, with why, when there is none) and the reference backend's. Large: off the stack.
typedef struct rig_pair {
    rig *gpu, *ref;
    bool on_gpu;
    const char *why;
} rig_pair;

static inline void rig_pair_open(rig_pair *r) {
    r->gpu = calloc(1, sizeof *r->gpu);
    r->ref = calloc(1, sizeof *r->ref);
    r->why = NULL;
    r->on_gpu = rig_open(r->gpu, BACKEND_GPU, &r->why);
    const char *ref_why = NULL;
    rig_open(r->ref, BACKEND_REF, &ref_why);
}

// Closes both; without a GPU, `gpu_case` is reported skipped with the reason.
static inline void rig_pair_close(rig_pair *r, const char *gpu_case) {
    if (r->on_gpu) rig_close(r->gpu);
    rig_close(r->ref);
    free(r->gpu);
    free(r->ref);
    if (!r->on_gpu) test_skip(gpu_case, r->why);
}

// The activation of BF16 x into BF16 y, rows x cols, without bias or amax (backward: its input
// gradient from BF16 dy): the stored tensor that the activation casts' tests cast on their own.
static inline qt_status rig_act_bf16(rig *r, uint32_t act, bool backward, uint32_t rows,
                                     uint32_t cols, prog_ref x, prog_ref dy, prog_ref y) {
    op_act_tensor xt = {x, QT_DTYPE_BF16}, dyt = {dy, QT_DTYPE_BF16}, yt = {y, QT_DTYPE_BF16};
    if (backward) {
        return op_act_backward(&r->prog, "act", act, rows, cols, xt, OP_ACT_NONE, dyt, yt,
                               OP_REF_NONE);
    }
    return op_act_forward(&r->prog, "act", act, rows, cols, xt, OP_ACT_NONE, yt, OP_REF_NONE);
}

// A BF16 input of the activation casts' tests: mostly values in and near the activation tables'
// binades [2^-12, 2^4), both signs; one in 32 any bit pattern at all (NaN, Inf, subnormals, huge
// values included). *state: the generator's state (a 64-bit LCG), advanced once.
static inline uint16_t rig_act_value(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t v = *state;
    if ((v >> 11) % 32 == 0) return (uint16_t)(v >> 44);
    uint32_t sign = (uint32_t)((v >> 21) & 1u) << 15;
    uint32_t exponent = 110u + (uint32_t)((v >> 25) % 28u);  // 2^-17 .. 2^10
    return (uint16_t)(sign | exponent << 7 | (uint32_t)((v >> 33) & 0x7Fu));
}

// x and dy, elems BF16 inputs each from rig_act_value (alternating, x first), allocated here:
// the caller frees both.
static inline void rig_act_inputs(uint64_t elems, uint64_t *state, uint16_t **x, uint16_t **dy) {
    *x = malloc(elems * 2);
    *dy = malloc(elems * 2);
    for (uint64_t e = 0; e < elems; e++) {
        (*x)[e] = rig_act_value(state);
        (*dy)[e] = rig_act_value(state);
    }
}

// One case of an activation cast's test: rows x cols, mode index `mode` of the test's table,
// inputs x and dy (rig_act_inputs); `name` says "R x C, mode M" for its messages.
typedef void (*rig_act_case_fn)(void *modes, rig_pair *rigs, uint32_t rows, uint32_t cols,
                                size_t mode, const uint16_t *x, const uint16_t *dy,
                                const char *name);

// `count` cases, case i of shape i % n_shapes and mode i % n_modes, their inputs drawn in order
// from the generator seeded with `seed`; under a sanitizer, shapes above 2^20 elements are left
// out (minutes each).
static inline void rig_act_cases(rig_pair *rigs, const uint32_t (*shapes)[2], size_t n_shapes,
                                 void *modes, size_t n_modes, size_t count, uint64_t seed,
                                 rig_act_case_fn fn) {
    uint64_t state = seed;
    for (size_t i = 0; i < count; i++) {
        uint32_t rows = shapes[i % n_shapes][0], cols = shapes[i % n_shapes][1];
        uint64_t elems = (uint64_t)rows * cols;
        if (test_sanitizer() && elems > (1u << 20)) continue;
        uint16_t *x, *dy;
        rig_act_inputs(elems, &state, &x, &dy);
        char name[64];
        snprintf(name, sizeof name, "%u x %u, mode %zu", rows, cols, i % n_modes);
        fn(modes, rigs, rows, cols, i % n_modes, x, dy, name);
        free(x);
        free(dy);
    }
}

#endif  // QT_TEST_RIG_H
