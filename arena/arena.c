#include "arena/arena.h"

#include <inttypes.h>  // PRIu64, PRIx64
#include <stdarg.h>
#include <string.h>

static const char *const arena_category_names[] = {
    [ARENA_CAT_WEIGHTS] = "weights",     [ARENA_CAT_MASTER] = "master",
    [ARENA_CAT_OPTIM] = "optim",         [ARENA_CAT_SCALING] = "scaling",
    [ARENA_CAT_GRADS] = "grads",         [ARENA_CAT_ACTIVATIONS] = "activations",
    [ARENA_CAT_WORKSPACE] = "workspace", [ARENA_CAT_STAGING] = "staging",
};
_Static_assert(sizeof arena_category_names / sizeof arena_category_names[0] == ARENA_CAT_COUNT,
               "a name per arena_category");

// Every arena's total is a multiple of this, so the host and device arenas of one plan can be
// laid side by side (or compared) without further padding.
#define ARENA_TOTAL_ALIGN 256

static bool arena_is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

static uint64_t arena_align_up(uint64_t x, uint64_t align) {
    QT_ASSERT(arena_is_pow2(align));
    return (x + align - 1) & ~(align - 1);
}

const char *arena_category_name(arena_category c) {
    QT_ASSERT((unsigned)c < ARENA_CAT_COUNT);
    return arena_category_names[c];
}

const char *arena_phase_name(arena_phase p) {
    switch (p) {
    case ARENA_PHASE_PLAN: return "plan";
    case ARENA_PHASE_BIND: return "bind";
    case ARENA_PHASE_FROZEN: return "frozen";
    }
    QT_ASSERT(!"unknown arena phase");
    return "";
}

uint64_t arena_storage_bytes(uint32_t capacity) {
    return (uint64_t)capacity * (sizeof(arena_region) + 2 * sizeof(arena_handle));
}

void arena_init(arena *a, arena_kind kind, const char *name, void *storage, uint32_t capacity) {
    QT_ASSERT(a != NULL && name != NULL);
    QT_ASSERT(kind == ARENA_KIND_DEVICE || kind == ARENA_KIND_HOST);
    QT_ASSERT(strlen(name) < ARENA_NAME_MAX);
    QT_ASSERT((storage == NULL) == (capacity == 0) && capacity <= ARENA_REGIONS_LIMIT);
    QT_ASSERT((uintptr_t)storage % 8 == 0);
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->phase = ARENA_PHASE_PLAN;
    strcpy(a->name, name);
    if (storage == NULL) return;
    // The whole table is zeroed so that a printed or compared arena never shows stale bytes.
    memset(storage, 0, arena_storage_bytes(capacity));
    a->region_capacity = capacity;
    a->regions = storage;
    a->pack_order = (arena_handle *)(a->regions + capacity);
    a->pack_placed = a->pack_order + capacity;
}

bool arena_counting(const arena *a) { return a->regions == NULL; }

uint32_t arena_persistent_regions(const arena *a, arena_category c) {
    QT_ASSERT((unsigned)c < ARENA_CAT_COUNT);
    return a->persistent_regions[c];
}

static qt_status arena_check_name(const arena *a, const char *name) {
    size_t length = strlen(name);
    if (length == 0) {
        return qt_fail(QT_ERR_INPUT, "arena '%s': region name is empty; give every region a name",
                       a->name);
    }
    if (length >= ARENA_NAME_MAX) {
        return qt_fail(QT_ERR_INPUT,
                       "arena '%s': region name '%.40s...' is %zu characters; ARENA_NAME_MAX is %d "
                       "(at most %d characters), shorten the name or raise ARENA_NAME_MAX",
                       a->name, name, length, ARENA_NAME_MAX, ARENA_NAME_MAX - 1);
    }
    for (uint32_t i = 0; i < a->region_count && !arena_counting(a); i++) {
        if (strcmp(a->regions[i].name, name) == 0) {
            return qt_fail(QT_ERR_INPUT,
                           "arena '%s': region '%s' reserved twice (first as handle %" PRIu32
                           "); region names must be unique",
                           a->name, name, i);
        }
    }
    return QT_OK;
}

static qt_status arena_check_size(const arena *a, const char *name, uint64_t bytes,
                                  uint64_t align) {
    if (bytes > ARENA_BYTES_MAX) {
        return qt_fail(QT_ERR_INPUT,
                       "arena '%s': region '%s' asks for %" PRIu64 " bytes, more than "
                       "ARENA_BYTES_MAX (%" PRIu64 "); check the shape that sized it",
                       a->name, name, bytes, ARENA_BYTES_MAX);
    }
    if (!arena_is_pow2(align) || align > ARENA_ALIGN_MAX) {
        return qt_fail(QT_ERR_INPUT,
                       "arena '%s': region '%s' alignment %" PRIu64 " is not a power of two "
                       "in [1, ARENA_ALIGN_MAX = %" PRIu64 "]",
                       a->name, name, align, ARENA_ALIGN_MAX);
    }
    return QT_OK;
}

qt_status arena_reserve(arena *a, const char *name, uint64_t bytes, uint64_t align,
                        arena_category category, int32_t first_op, int32_t last_op,
                        arena_handle *handle_out) {
    QT_ASSERT(a != NULL && name != NULL && handle_out != NULL);
    QT_ASSERT(a->phase == ARENA_PHASE_PLAN);
    QT_ASSERT((unsigned)category < ARENA_CAT_COUNT);
    QT_ASSERT(first_op == ARENA_LIFETIME_PERSISTENT || first_op >= 0);
    bool counting = arena_counting(a);
    uint32_t capacity = counting ? ARENA_REGIONS_LIMIT : a->region_capacity;
    if (a->region_count == capacity) {
        return qt_fail(QT_ERR_CAPACITY,
                       "arena '%s': cannot reserve region '%s': the table holds %" PRIu32
                       " regions%s", a->name, name, capacity,
                       counting ? " (ARENA_REGIONS_LIMIT, which keeps offsets from overflowing)"
                                : ", the count its plan was sized for");
    }
    QT_TRY(arena_check_name(a, name));
    QT_TRY(arena_check_size(a, name, bytes, align));
    if (first_op == ARENA_LIFETIME_PERSISTENT && bytes > 0) a->persistent_regions[category]++;
    if (counting) {
        *handle_out = a->region_count++;
        return QT_OK;
    }

    arena_region *r = &a->regions[a->region_count];
    memset(r, 0, sizeof *r);
    strcpy(r->name, name);
    r->bytes = bytes;
    r->align = align;
    if (a->kind == ARENA_KIND_DEVICE && r->align < ARENA_DEVICE_ALIGN_MIN) {
        r->align = ARENA_DEVICE_ALIGN_MIN;
    }
    r->category = category;
    r->persistent = first_op == ARENA_LIFETIME_PERSISTENT;
    if (r->persistent) {
        r->first_op = r->last_op = ARENA_LIFETIME_PERSISTENT;
    } else if (first_op > last_op) {
        // One spelling of "not used yet", so that arena_extend needs no special case.
        r->first_op = INT32_MAX;
        r->last_op = -1;
    } else {
        r->first_op = first_op;
        r->last_op = last_op;
    }
    *handle_out = a->region_count++;
    return QT_OK;
}

qt_status arena_reserve_part(arena *a, arena_handle whole, const char *name, uint64_t bytes,
                             uint64_t align, arena_handle *handle_out) {
    QT_ASSERT(a != NULL && name != NULL && handle_out != NULL);
    QT_ASSERT(a->phase == ARENA_PHASE_PLAN && whole < a->region_count);
    // 0 > -1: not used yet, like any region reserved ahead of its ops.
    if (arena_counting(a)) {
        return arena_reserve(a, name, bytes, align, ARENA_CAT_WORKSPACE, 0, -1, handle_out);
    }
    const arena_region *w = &a->regions[whole];
    QT_ASSERT(!w->persistent && !w->part);
    QT_TRY(arena_check_size(a, name, bytes, align));
    uint64_t part_align = a->kind == ARENA_KIND_DEVICE && align < ARENA_DEVICE_ALIGN_MIN
                              ? ARENA_DEVICE_ALIGN_MIN
                              : align;
    uint64_t at = arena_align_up(w->bytes, part_align);
    if (at > ARENA_BYTES_MAX - bytes) {
        return qt_fail(QT_ERR_INPUT,
                       "arena '%s': part '%s' of %" PRIu64 " bytes would take region '%s' past "
                       "ARENA_BYTES_MAX (%" PRIu64 "); check the shapes that sized its parts",
                       a->name, name, bytes, w->name, ARENA_BYTES_MAX);
    }
    QT_TRY(arena_reserve(a, name, bytes, align, w->category, 0, -1, handle_out));
    arena_region *r = &a->regions[*handle_out];
    arena_region *grown = &a->regions[whole];
    r->part = true;
    r->whole = whole;
    r->part_offset = at;
    grown->bytes = at + bytes;
    if (r->align > grown->align) grown->align = r->align;
    return QT_OK;
}

static void arena_widen(arena_region *r, int32_t op_index) {
    if (r->persistent) return;
    if (op_index < r->first_op) r->first_op = op_index;
    if (op_index > r->last_op) r->last_op = op_index;
}

void arena_extend(arena *a, arena_handle h, int32_t op_index) {
    QT_ASSERT(a != NULL && a->phase == ARENA_PHASE_PLAN);
    QT_ASSERT(h < a->region_count);
    QT_ASSERT(op_index >= 0);
    if (arena_counting(a)) return;
    arena_region *r = &a->regions[h];
    arena_widen(r, op_index);
    if (r->part) arena_widen(&a->regions[r->whole], op_index);
}

static bool arena_region_used(const arena_region *r) {
    return r->persistent || r->first_op <= r->last_op;
}

// Whether two regions are live at some common op once each transient lifetime is extended by
// `gap` ops at its end. Persistent regions are live at every op; a region never used is live at
// none.
static bool arena_lifetimes_within(const arena_region *x, const arena_region *y, int64_t gap) {
    if (!arena_region_used(x) || !arena_region_used(y)) return false;
    if (x->persistent || y->persistent) return true;
    return x->first_op <= y->last_op + gap && y->first_op <= x->last_op + gap;
}

// Two regions may not share bytes when both are live at some op.
static bool arena_lifetimes_intersect(const arena_region *x, const arena_region *y) {
    return arena_lifetimes_within(x, y, 0);
}

// Half-open byte ranges; an empty range intersects nothing, not even a range around it.
static bool arena_ranges_intersect(uint64_t x_offset, uint64_t x_bytes, uint64_t y_offset,
                                   uint64_t y_bytes) {
    if (x_bytes == 0 || y_bytes == 0) return false;
    return x_offset < y_offset + y_bytes && y_offset < x_offset + x_bytes;
}

// The orders arena_pack tries (arena.h). Each is a first-fit greedy; none wins on every
// lifetime pattern, so the arena keeps whichever ends lowest.
typedef enum arena_order {
    ARENA_ORDER_SIZE,       // larger first
    ARENA_ORDER_SIZE_LIFE,  // persistent first, then larger, then the longer lifetime
    ARENA_ORDER_AREA,       // persistent first (larger first), then bytes x ops live
    ARENA_ORDER_COUNT
} arena_order;

// Ops a transient region is live at (0 for one never used).
static uint64_t arena_ops_live(const arena_region *r) {
    return r->first_op <= r->last_op ? (uint64_t)(r->last_op - r->first_op) + 1 : 0;
}

// Whether region x goes before region y in `order`; ties go to the lower handle, so every order
// is total and the packing deterministic.
static bool arena_pack_before(const arena *a, arena_order order, arena_handle x, arena_handle y) {
    const arena_region *rx = &a->regions[x], *ry = &a->regions[y];
    if (order != ARENA_ORDER_SIZE && rx->persistent != ry->persistent) return rx->persistent;
    bool transient = !rx->persistent;  // both are, or neither (the order SIZE aside)
    if (order == ARENA_ORDER_AREA && transient) {
        // bytes < 2^48 and ops < 2^31 may overflow 64 bits; a double holds the product to 53
        // bits, which orders all but near ties, and those fall through to the bytes.
        double ax = (double)rx->bytes * (double)arena_ops_live(rx);
        double ay = (double)ry->bytes * (double)arena_ops_live(ry);
        if (ax != ay) return ax > ay;
    }
    if (rx->bytes != ry->bytes) return rx->bytes > ry->bytes;
    if (order == ARENA_ORDER_SIZE_LIFE && transient) {
        uint64_t lx = arena_ops_live(rx), ly = arena_ops_live(ry);
        if (lx != ly) return lx > ly;
    }
    return x < y;
}

// Insertion sort: O(N^2) moves at worst is about 2M for 2048 regions, well inside the packing
// budget (a model of the parser's largest size has some 15000 regions: well under a second),
// and unlike libc's qsort it cannot allocate and is stable by construction.
static void arena_pack_order(const arena *a, arena_order rule, arena_handle *order) {
    for (uint32_t i = 0; i < a->region_count; i++) {
        arena_handle h = i;
        uint32_t j = i;
        while (j > 0 && arena_pack_before(a, rule, h, order[j - 1])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = h;
    }
}

// First fit. `placed` lists the placed non-empty regions by increasing offset. The candidate only
// moves up, to the aligned end of a conflicting region that blocks it; every earlier conflicting
// region then ends at or below the candidate. So the first conflicting region that starts at or
// beyond candidate + bytes proves the gap, and no lower aligned offset can fit: each skipped
// offset overlapped the region that pushed the candidate past it.
static uint64_t arena_first_fit(const arena *a, const arena_region *r, const arena_handle *placed,
                                uint32_t placed_count) {
    uint64_t candidate = 0;
    if (r->bytes == 0) return candidate;
    for (uint32_t i = 0; i < placed_count; i++) {
        const arena_region *p = &a->regions[placed[i]];
        if (!arena_lifetimes_within(r, p, a->pack_gap)) continue;
        if (p->offset >= candidate + r->bytes) break;
        uint64_t p_end = p->offset + p->bytes;
        if (p_end > candidate) candidate = arena_align_up(p_end, r->align);
    }
    QT_ASSERT(candidate % r->align == 0);
    return candidate;
}

// Inserts h into `placed`, keeping it sorted by offset (ties by handle, for determinism).
static void arena_placed_insert(const arena *a, arena_handle *placed, uint32_t placed_count,
                                arena_handle h) {
    uint64_t offset = a->regions[h].offset;
    uint32_t j = placed_count;
    while (j > 0) {
        const arena_region *prev = &a->regions[placed[j - 1]];
        if (prev->offset < offset || (prev->offset == offset && placed[j - 1] < h)) break;
        placed[j] = placed[j - 1];
        j--;
    }
    placed[j] = h;
}

// Places every region in `rule`'s order, each at its first fit; returns the highest end.
static uint64_t arena_pack_in_order(arena *a, arena_order rule) {
    // Scratch beside the table, sized with it: the library does not allocate.
    arena_handle *order = a->pack_order;
    arena_handle *placed = a->pack_placed;
    uint32_t placed_count = 0;
    uint64_t end_max = 0;
    arena_pack_order(a, rule, order);
    for (uint32_t i = 0; i < a->region_count; i++) {
        arena_region *r = &a->regions[order[i]];
        if (r->part) continue;  // placed with its whole, by arena_pack
        r->offset = arena_first_fit(a, r, placed, placed_count);
        if (r->bytes == 0) continue;
        arena_placed_insert(a, placed, placed_count, order[i]);
        placed_count++;
        if (r->offset + r->bytes > end_max) end_max = r->offset + r->bytes;
    }
    return end_max;
}

void arena_pack(arena *a) {
    QT_ASSERT(a != NULL && a->phase == ARENA_PHASE_PLAN && !arena_counting(a));
    // Each order in turn, stopping at one that reaches the lower bound (nothing packs tighter);
    // the first of the lowest ends wins, packed again when a later order ran after it.
    uint64_t bound = arena_lower_bound(a);
    arena_order best = ARENA_ORDER_SIZE, last = ARENA_ORDER_SIZE;
    uint64_t best_end = UINT64_MAX;
    for (int rule = 0; rule < ARENA_ORDER_COUNT; rule++) {
        last = (arena_order)rule;
        uint64_t end = arena_pack_in_order(a, last);
        if (end < best_end) {
            best_end = end;
            best = last;
        }
        if (end <= bound) break;
    }
    if (last != best) {
        uint64_t end = arena_pack_in_order(a, best);
        QT_ASSERT(end == best_end);  // the packing is a function of the table and the order
    }
    for (uint32_t i = 0; i < a->region_count; i++) {
        arena_region *r = &a->regions[i];
        if (r->part) r->offset = a->regions[r->whole].offset + r->part_offset;
    }
    a->bytes_total = arena_align_up(best_end, ARENA_TOTAL_ALIGN);
    a->phase = ARENA_PHASE_BIND;
}

static uint64_t arena_align_max(const arena *a) {
    uint64_t align_max = a->kind == ARENA_KIND_DEVICE ? ARENA_DEVICE_ALIGN_MIN : 1;
    for (uint32_t i = 0; i < a->region_count; i++) {
        if (a->regions[i].align > align_max) align_max = a->regions[i].align;
    }
    return align_max;
}

qt_status arena_bind(arena *a, arena_alloc_fn alloc, void *ctx) {
    QT_ASSERT(a != NULL && alloc != NULL);
    QT_ASSERT(a->phase == ARENA_PHASE_PLAN || a->phase == ARENA_PHASE_BIND);
    if (a->phase == ARENA_PHASE_PLAN) arena_pack(a);

    uint64_t base_address = 0;
    uint8_t *host_base = NULL;
    QT_TRY(alloc(ctx, a->bytes_total, &base_address, &host_base));
    uint64_t align_max = arena_align_max(a);
    if (base_address % align_max != 0) {
        return qt_fail(QT_ERR_INPUT,
                       "arena '%s': allocator returned base 0x%" PRIx64 ", not aligned to %" PRIu64
                       " bytes (the largest region alignment); allocate with that alignment",
                       a->name, base_address, align_max);
    }
    // An empty host arena needs no memory, so it may bind to no pointer at all.
    if (a->kind == ARENA_KIND_HOST && host_base == NULL && a->bytes_total > 0) {
        return qt_fail(QT_ERR_INPUT,
                       "arena '%s': host arena bound without a host pointer; the allocator must "
                       "return host-visible memory in *host_base",
                       a->name);
    }
    a->base_address = base_address;
    a->host_base = host_base;
    a->phase = ARENA_PHASE_FROZEN;
    return QT_OK;
}

uint64_t arena_address(const arena *a, arena_handle h) {
    QT_ASSERT(a != NULL && a->phase == ARENA_PHASE_FROZEN);
    QT_ASSERT(h < a->region_count);
    return a->base_address + a->regions[h].offset;
}

void *arena_host_pointer(const arena *a, arena_handle h) {
    QT_ASSERT(a != NULL && a->phase == ARENA_PHASE_FROZEN && a->host_base != NULL);
    QT_ASSERT(h < a->region_count);
    return a->host_base + a->regions[h].offset;
}

const arena_region *arena_region_get(const arena *a, arena_handle h) {
    QT_ASSERT(a != NULL && h < a->region_count && !arena_counting(a));
    return &a->regions[h];
}

uint64_t arena_category_bytes(const arena *a, arena_category c) {
    QT_ASSERT(a != NULL && (unsigned)c < ARENA_CAT_COUNT && !arena_counting(a));
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < a->region_count; i++) {
        if (a->regions[i].category == c && !a->regions[i].part) bytes += a->regions[i].bytes;
    }
    return bytes;
}

// Live transient bytes at one op.
static uint64_t arena_live_bytes_at(const arena *a, int32_t op) {
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < a->region_count; i++) {
        const arena_region *r = &a->regions[i];
        if (r->persistent || r->part) continue;  // a part's bytes are its whole's
        if (r->first_op <= op && op <= r->last_op) bytes += r->bytes;
    }
    return bytes;
}

// The live sum only rises where a lifetime starts, so the peak is at some region's first_op:
// checking those ops is O(N^2) instead of a sweep over every op index.
int32_t arena_peak_op(const arena *a, uint64_t *bytes) {
    QT_ASSERT(a != NULL && !arena_counting(a));
    int32_t peak_op = -1;
    uint64_t peak_bytes = 0;
    for (uint32_t i = 0; i < a->region_count; i++) {
        const arena_region *r = &a->regions[i];
        if (r->persistent || r->part || r->first_op > r->last_op) continue;
        uint64_t live = arena_live_bytes_at(a, r->first_op);
        if (peak_op < 0 || live > peak_bytes || (live == peak_bytes && r->first_op < peak_op)) {
            peak_bytes = live;
            peak_op = r->first_op;
        }
    }
    if (bytes) *bytes = peak_bytes;
    return peak_op;
}

arena_handle arena_next_largest(const arena *a, int32_t op, arena_handle after) {
    QT_ASSERT(a != NULL && !arena_counting(a));
    QT_ASSERT(after == ARENA_HANDLE_NONE || after < a->region_count);
    uint64_t below = after == ARENA_HANDLE_NONE ? UINT64_MAX : a->regions[after].bytes;
    arena_handle pick = ARENA_HANDLE_NONE;
    for (arena_handle h = 0; h < a->region_count; h++) {
        const arena_region *r = &a->regions[h];
        if (r->bytes == 0) continue;
        if (op >= 0 && (r->persistent || r->part || r->first_op > op || op > r->last_op)) {
            continue;
        }
        bool later = r->bytes < below || (r->bytes == below && after != ARENA_HANDLE_NONE &&
                                          h > after);
        if (later && (pick == ARENA_HANDLE_NONE || r->bytes > a->regions[pick].bytes)) pick = h;
    }
    return pick;
}

uint64_t arena_live_bytes(const arena *a, int32_t op, arena_category c) {
    QT_ASSERT(a != NULL && !arena_counting(a));
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < a->region_count; i++) {
        const arena_region *r = &a->regions[i];
        if (r->part || r->category != c) continue;
        if (r->persistent || (r->first_op <= op && op <= r->last_op)) bytes += r->bytes;
    }
    return bytes;
}

uint64_t arena_lower_bound(const arena *a) {
    QT_ASSERT(a != NULL && !arena_counting(a));
    uint64_t persistent_bytes = 0, peak_bytes = 0;
    for (uint32_t i = 0; i < a->region_count; i++) {
        const arena_region *r = &a->regions[i];
        if (r->persistent) persistent_bytes += r->bytes;
    }
    arena_peak_op(a, &peak_bytes);
    return persistent_bytes + peak_bytes;
}

void arena_format_size(uint64_t bytes, char *buf, size_t buf_bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, buf_bytes, "%" PRIu64 " B", bytes);
        return;
    }
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        unit++;
    }
    snprintf(buf, buf_bytes, "%.2f %s", value, units[unit]);
}

static void arena_format_lifetime(const arena_region *r, char *buf, size_t buf_bytes) {
    char in[24] = "";
    if (r->part) snprintf(in, sizeof in, " in %" PRIu32, r->whole);
    if (r->persistent) {
        snprintf(buf, buf_bytes, "persistent");
    } else if (r->first_op > r->last_op) {
        snprintf(buf, buf_bytes, "unused%s", in);
    } else {
        snprintf(buf, buf_bytes, "ops %" PRId32 "..%" PRId32 "%s", r->first_op, r->last_op, in);
    }
}

static int arena_name_width(const arena *a) {
    size_t width = strlen("name");
    for (uint32_t i = 0; i < a->region_count; i++) {
        size_t length = strlen(a->regions[i].name);
        if (length > width) width = length;
    }
    return (int)width;
}

// Width of the category column: the longest category name, "activations".
#define ARENA_CATEGORY_WIDTH 11

static void arena_print_regions(const arena *a, FILE *out, int name_width) {
    bool packed = a->phase != ARENA_PHASE_PLAN;
    fprintf(out, "%6s  %-*s  %-*s  %12s  %12s  %10s  %s\n", "handle", name_width, "name",
            ARENA_CATEGORY_WIDTH, "category", "offset", "bytes", "size", "lifetime");
    for (uint32_t i = 0; i < a->region_count; i++) {
        const arena_region *r = &a->regions[i];
        char offset[24], size[24], lifetime[64];
        if (packed) {
            snprintf(offset, sizeof offset, "0x%08" PRIx64, r->offset);
        } else {
            snprintf(offset, sizeof offset, "-");
        }
        arena_format_size(r->bytes, size, sizeof size);
        arena_format_lifetime(r, lifetime, sizeof lifetime);
        fprintf(out, "%6" PRIu32 "  %-*s  %-*s  %12s  %12" PRIu64 "  %10s  %s\n", i, name_width,
                r->name, ARENA_CATEGORY_WIDTH, arena_category_name(r->category), offset, r->bytes,
                size, lifetime);
    }
}

static void arena_print_total(FILE *out, const char *label, uint64_t bytes) {
    char size[24];
    arena_format_size(bytes, size, sizeof size);
    fprintf(out, "  %-*s  %12" PRIu64 "  %10s\n", ARENA_CATEGORY_WIDTH + 2, label, bytes, size);
}

void arena_print(const arena *a, FILE *out) {
    QT_ASSERT(a != NULL && out != NULL && !arena_counting(a));
    fprintf(out, "arena '%s' (%s, phase %s): %" PRIu32 " regions\n", a->name,
            a->kind == ARENA_KIND_DEVICE ? "device" : "host", arena_phase_name(a->phase),
            a->region_count);
    arena_print_regions(a, out, arena_name_width(a));
    fprintf(out, "bytes by category (each region counted in full, so shared bytes count more "
                 "than once):\n");
    for (int c = 0; c < ARENA_CAT_COUNT; c++) {
        arena_print_total(out, arena_category_name((arena_category)c),
                          arena_category_bytes(a, (arena_category)c));
    }
    arena_print_total(out, "lower bound", arena_lower_bound(a));
    if (a->phase == ARENA_PHASE_PLAN) {
        fprintf(out, "  %-*s  %12s  (not packed yet)\n", ARENA_CATEGORY_WIDTH + 2, "total", "-");
    } else {
        arena_print_total(out, "total", a->bytes_total);
    }
}

void arena_print_summary(const arena *a, FILE *out) {
    QT_ASSERT(a != NULL && out != NULL);
    char total[24], bound[24], size[24];
    arena_format_size(a->bytes_total, total, sizeof total);
    arena_format_size(arena_lower_bound(a), bound, sizeof bound);
    fprintf(out, "%-12s %" PRIu32 " regions, %s (lower bound %s)\n", a->name, a->region_count,
            a->phase == ARENA_PHASE_PLAN ? "not packed" : total, bound);
    fprintf(out, "            ");
    for (int c = 0; c < ARENA_CAT_COUNT; c++) {
        uint64_t bytes = arena_category_bytes(a, (arena_category)c);
        if (bytes == 0) continue;
        arena_format_size(bytes, size, sizeof size);
        fprintf(out, " %s %s", arena_category_name((arena_category)c), size);
    }
    fputc('\n', out);
}

static bool arena_check_fail(char *msg, size_t msg_bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool arena_check_fail(char *msg, size_t msg_bytes, const char *fmt, ...) {
    if (msg != NULL && msg_bytes > 0) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(msg, msg_bytes, fmt, args);
        va_end(args);
    }
    return false;
}

static bool arena_check_region(const arena *a, arena_handle h, char *msg, size_t msg_bytes) {
    const arena_region *r = &a->regions[h];
    if (!arena_is_pow2(r->align) ||
        (a->kind == ARENA_KIND_DEVICE && r->align < ARENA_DEVICE_ALIGN_MIN)) {
        return arena_check_fail(msg, msg_bytes, "region %" PRIu32 " '%s': bad alignment %" PRIu64,
                                h, r->name, r->align);
    }
    if (r->offset % r->align != 0) {
        return arena_check_fail(msg, msg_bytes,
                                "region %" PRIu32 " '%s': offset %" PRIu64
                                " not a multiple of its alignment %" PRIu64,
                                h, r->name, r->offset, r->align);
    }
    if (r->offset > a->bytes_total || r->bytes > a->bytes_total - r->offset) {
        return arena_check_fail(msg, msg_bytes,
                                "region %" PRIu32 " '%s': [%" PRIu64 ", +%" PRIu64
                                ") ends past bytes_total %" PRIu64,
                                h, r->name, r->offset, r->bytes, a->bytes_total);
    }
    if (r->part) {
        const arena_region *w = &a->regions[r->whole];
        if (r->part_offset > w->bytes || r->bytes > w->bytes - r->part_offset ||
            r->offset != w->offset + r->part_offset) {
            return arena_check_fail(msg, msg_bytes,
                                    "region %" PRIu32 " '%s': not inside its whole %" PRIu32
                                    " '%s' at +%" PRIu64, h, r->name, r->whole, w->name,
                                    r->part_offset);
        }
    }
    if (a->phase == ARENA_PHASE_FROZEN && (a->base_address + r->offset) % r->align != 0) {
        return arena_check_fail(msg, msg_bytes,
                                "region %" PRIu32 " '%s': address 0x%" PRIx64 " misaligned",
                                h, r->name, a->base_address + r->offset);
    }
    return true;
}

bool arena_check(const arena *a, char *msg, size_t msg_bytes) {
    QT_ASSERT(a != NULL);
    if (a->phase == ARENA_PHASE_PLAN) {
        return arena_check_fail(msg, msg_bytes, "arena '%s' is not packed yet", a->name);
    }
    if (a->bytes_total % ARENA_TOTAL_ALIGN != 0) {
        return arena_check_fail(msg, msg_bytes, "arena '%s': bytes_total %" PRIu64
                                " is not a multiple of %d", a->name, a->bytes_total,
                                ARENA_TOTAL_ALIGN);
    }
    for (uint32_t i = 0; i < a->region_count; i++) {
        if (!arena_check_region(a, i, msg, msg_bytes)) return false;
    }
    for (uint32_t i = 0; i < a->region_count; i++) {
        const arena_region *x = &a->regions[i];
        if (x->part) continue;  // inside its whole, checked as that
        for (uint32_t j = i + 1; j < a->region_count; j++) {
            const arena_region *y = &a->regions[j];
            if (y->part || !arena_lifetimes_intersect(x, y)) continue;
            if (!arena_ranges_intersect(x->offset, x->bytes, y->offset, y->bytes)) continue;
            return arena_check_fail(msg, msg_bytes,
                                    "regions %" PRIu32 " '%s' [%" PRIu64 ", +%" PRIu64
                                    ") and %" PRIu32 " '%s' [%" PRIu64 ", +%" PRIu64
                                    ") are live together and overlap",
                                    i, x->name, x->offset, x->bytes, j, y->name, y->offset,
                                    y->bytes);
        }
    }
    return true;
}
