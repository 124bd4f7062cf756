// arena: plans, packs and binds the runtime's memory; one `arena` per kind (device, pinned host).
//
// Owns the region table of one arena (names, sizes, alignments, categories, lifetimes, offsets)
// from arena_init for as long as the runtime lives; it owns no memory itself. The bytes come from
// the allocation callback given to arena_bind, called exactly once, and belong to whoever gave
// them (the GPU backend: one cuMemAlloc or cuMemHostAlloc; the reference backend: caller memory).
// This module never calls the CUDA driver and never allocates.
//
// Callers: the runtime's planner (runtime/model, program) reserves regions during start-up and
// binds them; after that every module may read addresses. Not thread-safe: one thread plans.
//
// Phases, asserted on every call (a call in the wrong phase is a programmer error and aborts):
//
//          arena_pack                      arena_bind (packs first if still in PLAN)
//   PLAN --------------------------> BIND ----------------------------------> FROZEN
//   arena_reserve, arena_extend      offsets and bytes_total set;      the allocator gave the
//   (sizes, lifetimes, no offsets)   nothing more can be reserved      base; arena_address and
//                                                                      arena_host_pointer work
//
// Layout after packing (offsets are relative to base_address; addresses exist once FROZEN):
//
//   0                                                                      bytes_total
//   |                                                                                |
//   v                                                                                v
//   +-----------+-----------+-----------+--------------------------+-------------+-----+
//   | weights   | master    | optim     | act1 (ops 0..3)          | ws (op 2)   | pad |
//   | persist.  | persist.  | persist.  +--------------------------+-------------+ to  |
//   |           |           |           | grads (ops 5..7)              | free   | 256 |
//   +-----------+-----------+-----------+-------------------------------+--------+-----+
//    live at every op, so no region      transient: regions stacked in one column share
//    shares their bytes                  bytes because their lifetimes are disjoint
//
// Each region starts at a multiple of its alignment (device regions: at least 256 bytes).
//
// Packing is greedy (each region in turn at the first gap that fits), deterministic, and O(N^2)
// in regions, tried in up to three orders (arena_pack).
//
// A region may be made of parts (arena_reserve_part): regions of their own (a name, bytes, an
// address) laid one after another inside it, so one op can reach all of them through the whole
// while other ops reach each part alone. Parts are not packed on their own: the whole is, with a
// lifetime that covers every part's, and each part lands at its offset inside the whole.
//
// The region table is the caller's memory (arena_storage_bytes for a given number of regions),
// sized from the model at planning: runtime/run/run.h plans once with counting arenas (no table:
// arena_reserve checks its arguments and numbers the regions, nothing else may be asked) and
// then again over tables of exactly the counted size.
#ifndef QT_ARENA_H
#define QT_ARENA_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>  // FILE, for arena_print

#include "runtime/base/status.h"  // qt_status, qt_fail, QT_ASSERT

#define ARENA_NAME_MAX 64
// NOTE: cuMemAlloc returns 256-byte aligned memory and the vectorized kernels and TMA
// descriptors want at least 16; 256 on every device region keeps any region usable by any kernel.
#define ARENA_DEVICE_ALIGN_MIN 256
#define ARENA_LIFETIME_PERSISTENT (-1)
// Bounds that keep offset arithmetic from uint64 overflow: 2^15 regions of 2^48 bytes each,
// each padded by at most 2^30, sum to less than 2^64. A model of the parser's largest size
// (recipes/recipe.h) needs well under 2^15 regions per arena.
#define ARENA_REGIONS_LIMIT (1u << 15)
#define ARENA_BYTES_MAX (UINT64_C(1) << 48)
#define ARENA_ALIGN_MAX (UINT64_C(1) << 30)

typedef enum arena_kind { ARENA_KIND_DEVICE, ARENA_KIND_HOST } arena_kind;

typedef enum arena_category {
    ARENA_CAT_WEIGHTS,      // quantized weight data and its scales
    ARENA_CAT_MASTER,       // high-precision master weights
    ARENA_CAT_OPTIM,        // optimizer state (Adam m, v)
    ARENA_CAT_SCALING,      // amax histories, scales
    ARENA_CAT_GRADS,        // gradients
    ARENA_CAT_ACTIVATIONS,  // forward outputs kept for backward, and their gradients
    ARENA_CAT_WORKSPACE,    // scratch of one op
    ARENA_CAT_STAGING,      // data input, statistics read back
    ARENA_CAT_COUNT
} arena_category;

typedef enum arena_phase { ARENA_PHASE_PLAN, ARENA_PHASE_BIND, ARENA_PHASE_FROZEN } arena_phase;

typedef uint32_t arena_handle;  // index into regions[]; handles are dense 0..region_count-1
#define ARENA_HANDLE_NONE UINT32_MAX

typedef struct arena_region {
    char name[ARENA_NAME_MAX];
    uint64_t bytes;
    uint64_t align;   // power of two; device regions at least ARENA_DEVICE_ALIGN_MIN
    uint64_t offset;  // from base_address; set by arena_pack
    arena_category category;
    bool persistent;  // live at every op; then first_op = last_op = ARENA_LIFETIME_PERSISTENT
    // Inclusive lifetime in op indices, transient regions only. A region not used yet has
    // first_op = INT32_MAX, last_op = -1 (empty), so arena_extend widens it with min/max.
    int32_t first_op, last_op;
    // A part (arena_reserve_part): its bytes start part_offset bytes into region `whole`.
    bool part;
    arena_handle whole;
    uint64_t part_offset;
} arena_region;

typedef struct arena {
    arena_kind kind;
    arena_phase phase;
    char name[ARENA_NAME_MAX];
    uint32_t region_count;
    uint32_t region_capacity;  // entries of the caller's table; 0: a counting arena
    arena_region *regions;     // [region_capacity], the caller's (arena_init)
    arena_handle *pack_order;  // [region_capacity] each: arena_pack's scratch, in the same
    arena_handle *pack_placed; // storage
    uint32_t persistent_regions[ARENA_CAT_COUNT];  // persistent regions with bytes, counting too
    // arena_pack: two transient regions share bytes only when one's last op comes more than
    // pack_gap ops before the other's first (0: whenever their lifetimes are disjoint). Sharing
    // orders the later region's users after the earlier one's in a captured graph; a gap keeps
    // ops a few apart in program order (often independent branches) from being ordered so.
    uint32_t pack_gap;
    uint64_t bytes_total;   // after packing: end of the highest region, rounded to 256
    uint64_t base_address;  // after bind: device address (or host address as integer)
    uint8_t *host_base;     // after bind: host pointer for host arenas / reference backend, or NULL
    bool external;          // after bind: the allocator used memory its own caller gave, so
                            // whoever releases the arena frees none
} arena;

// Bytes of storage for a table of `capacity` regions (8-byte aligned memory).
uint64_t arena_storage_bytes(uint32_t capacity);

// Starts an empty arena in PLAN over `storage` (arena_storage_bytes(capacity) bytes, the
// caller's, outliving the arena; capacity <= ARENA_REGIONS_LIMIT). `name` (shorter than
// ARENA_NAME_MAX) appears in messages. storage NULL (capacity 0): a counting arena, which only
// numbers what arena_reserve accepts (region_count) and answers arena_counting.
void arena_init(arena *a, arena_kind kind, const char *name, void *storage, uint32_t capacity);
bool arena_counting(const arena *a);

// PLAN only. Reserves `bytes` (may be 0: no space, but a valid handle) aligned to `align` (a power
// of two, at most ARENA_ALIGN_MAX; device arenas raise it to ARENA_DEVICE_ALIGN_MIN).
// first_op = ARENA_LIFETIME_PERSISTENT makes the region persistent (last_op ignored); otherwise
// first_op >= 0 and the region lives over [first_op, last_op], and first_op > last_op means "not
// used yet" (widen it with arena_extend). Fails with QT_ERR_CAPACITY when the table is full (or
// ARENA_REGIONS_LIMIT regions are counted), QT_ERR_INPUT on an empty, too long or duplicate name
// (a counting arena keeps no names to compare), a bad alignment or bytes above ARENA_BYTES_MAX.
qt_status arena_reserve(arena *a, const char *name, uint64_t bytes, uint64_t align,
                        arena_category category, int32_t first_op, int32_t last_op,
                        arena_handle *handle_out);

// PLAN only. Reserves a part of the transient region `whole` (not a part itself): `bytes` at
// the end of the whole so far, aligned to `align` (raised as arena_reserve raises it; the whole's
// alignment grows to the largest of its parts'), and the whole grows to end with it. The part
// has the whole's category and its own name and lifetime; arena_extend on it widens the whole's
// too. Uses of two parts of one whole touch different bytes; a use of the whole touches every
// part. Errors as arena_reserve's (a counting arena numbers the part only).
qt_status arena_reserve_part(arena *a, arena_handle whole, const char *name, uint64_t bytes,
                             uint64_t align, arena_handle *handle_out);

// Any phase, counting arenas too: the persistent regions of category c that have bytes.
uint32_t arena_persistent_regions(const arena *a, arena_category c);

// PLAN only. Widens a transient region's lifetime to include op_index (>= 0), and a part's
// whole's too; no effect on a persistent region, which already includes every op, nor on a
// counting arena.
void arena_extend(arena *a, arena_handle h, int32_t op_index);

// PLAN -> BIND. Places regions one at a time, each at the lowest offset, aligned, where it
// overlaps no placed region whose lifetime intersects its own. Persistent regions intersect every
// region that is used; a region never used intersects nothing and lands at offset 0. Zero-byte
// regions occupy nothing and land at offset 0. Parts land inside their wholes. The orders tried,
// each with ties to the lower handle: decreasing bytes; persistent first, then decreasing bytes,
// then the longer lifetime; persistent first, then decreasing bytes x ops live. It stops at an
// order that reaches arena_lower_bound and keeps the first of the lowest ends (a large model's
// greedy packing can leave a gap of a whole activation at its peak in one order and none in
// another). Sets bytes_total. With a pack_gap, "lifetimes intersect" reads each transient
// lifetime as extended by pack_gap ops at its end; arena_check still holds.
void arena_pack(arena *a);

// The allocator arena_bind calls: gives `bytes` (may be 0) and returns the base address and, when
// the bytes are host-visible, the host pointer (else NULL). The base must be aligned to the
// largest region alignment (cuMemAlloc's 256 suffices for device arenas without larger requests).
typedef qt_status (*arena_alloc_fn)(void *ctx, uint64_t bytes, uint64_t *base_address,
                                    uint8_t **host_base);

// PLAN or BIND -> FROZEN. Packs if still in PLAN, calls alloc(ctx, bytes_total, ...) exactly once
// and checks its result. On failure returns the status (alloc's own, or QT_ERR_INPUT for a base
// that is misaligned, or a host arena given no host pointer) and the arena stays in BIND.
qt_status arena_bind(arena *a, arena_alloc_fn alloc, void *ctx);

// FROZEN only: base_address + offset.
uint64_t arena_address(const arena *a, arena_handle h);
// FROZEN with a host_base only: host_base + offset.
void *arena_host_pointer(const arena *a, arena_handle h);
// Any phase.
const arena_region *arena_region_get(const arena *a, arena_handle h);

// Any phase. Sum of persistent bytes plus the peak over ops of the live transient bytes (a part
// counted in its whole): no packing can use fewer bytes (alignment ignored), so bytes_total >=
// this after packing.
uint64_t arena_lower_bound(const arena *a);
// Any phase but on a counting arena. The op at which the most transient bytes are live (a part
// counted in its whole; the lowest such op), with those bytes in *bytes (when not NULL); -1 (and
// 0) when no transient region is used.
int32_t arena_peak_op(const arena *a, uint64_t *bytes);
// Any phase but on a counting arena. The region after `after` (ARENA_HANDLE_NONE: before the
// first) in the order of decreasing bytes, ties to the lower handle, among the regions with
// bytes: every one for op < 0, parts and persistent ones included; for op >= 0 the transient
// regions live at op, not parts. ARENA_HANDLE_NONE when none is left. Reports list the largest
// regions by calling it in turn.
arena_handle arena_next_largest(const arena *a, int32_t op, arena_handle after);
// Any phase but on a counting arena. Bytes of category c live at op: its persistent regions and
// the transient ones whose lifetime holds op (a part counted in its whole).
uint64_t arena_live_bytes(const arena *a, int32_t op, arena_category c);
// Any phase. Bytes reserved in a category, counted without sharing (regions that share bytes each
// count in full; a part counts in its whole only), so the categories can sum to more than
// bytes_total.
uint64_t arena_category_bytes(const arena *a, arena_category c);
// "weights", "master", "optim", "scaling", "grads", "activations", "workspace", "staging".
const char *arena_category_name(arena_category c);
// "plan", "bind", "frozen".
const char *arena_phase_name(arena_phase p);

// Any phase. Writes the memory map: a header, one line per region in handle order (handle, name,
// category, offset, exact bytes, human-readable size, lifetime; a part's lifetime is followed by
// "in H", its whole's handle), per-category totals, the lower bound and the total (`total`
// line). Offsets print as "-" before packing.
void arena_print(const arena *a, FILE *out);
// Any phase. Two lines: the arena's name, regions, total and lower bound; the bytes of each
// category that has any.
void arena_print_summary(const arena *a, FILE *out);
// Writes "n B", "x.xx KiB", "x.xx MiB", "x.xx GiB" or "x.xx TiB" into buf.
void arena_format_size(uint64_t bytes, char *buf, size_t buf_bytes);

// BIND or FROZEN. Checks every region is aligned, inside bytes_total, every part inside its
// whole, and that no two regions (parts aside) with intersecting lifetimes have intersecting
// byte ranges. Returns true if so; else false, with the first violation described in msg (msg
// may be NULL when msg_bytes is 0).
bool arena_check(const arena *a, char *msg, size_t msg_bytes);

#endif  // QT_ARENA_H
