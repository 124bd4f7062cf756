// test_arena: exact offsets of hand-built plans, phase asserts (in forked children), errors,
// binding, the printed map, and random plans packed against an independent brute-force model.
#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arena/arena.h"
#include "tests/test.h"

#define NEVER_USED INT32_MAX, -1  // first_op > last_op: a transient region not used yet

// The region tables of these tests: TEST_REGIONS entries right after the arena struct, in one
// heap block (the runtime sizes its tables from the model).
#define TEST_REGIONS 2048
#define TEST_TABLE_OFFSET ((sizeof(arena) + 63) / 64 * 64)

static void arena_start(arena *a, arena_kind kind, const char *name) {
    arena_init(a, kind, name, (uint8_t *)a + TEST_TABLE_OFFSET, TEST_REGIONS);
}

static arena *arena_alloc(void) {
    arena *a = malloc(TEST_TABLE_OFFSET + arena_storage_bytes(TEST_REGIONS));
    if (a == NULL) abort();
    return a;
}

static arena *arena_new(arena_kind kind, const char *name) {
    arena *a = arena_alloc();
    arena_start(a, kind, name);
    return a;
}

static arena_handle reserve(arena *a, const char *name, uint64_t bytes, uint64_t align,
                            arena_category c, int32_t first_op, int32_t last_op) {
    arena_handle h = UINT32_MAX;
    qt_status s = arena_reserve(a, name, bytes, align, c, first_op, last_op, &h);
    CHECK(s == QT_OK, "reserve '%s': %s: %s", name, qt_status_name(s), qt_error_message());
    return h;
}

static uint64_t offset_of(const arena *a, arena_handle h) { return arena_region_get(a, h)->offset; }

static void check_packed(const arena *a) {
    char msg[256];
    bool ok = arena_check(a, msg, sizeof msg);
    CHECK(ok, "arena_check: %s", msg);
    CHECK(a->bytes_total >= arena_lower_bound(a), "total %" PRIu64 " < lower bound %" PRIu64,
          a->bytes_total, arena_lower_bound(a));
}

#define CHECK_OFFSET(a, h, expected)                                                      \
    CHECK(offset_of(a, h) == (expected), "offset of '%s' is %" PRIu64 ", expected %" PRIu64, \
          arena_region_get(a, h)->name, offset_of(a, h), (uint64_t)(expected))

// ---------------------------------------------------------------------------------------------
// hand-built plans with offsets derived by hand

static void test_persistent_and_transient_share(void) {
    test_begin("persistent_and_transient_share");
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    arena_handle w = reserve(a, "w", 1000, 16, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle x = reserve(a, "x", 512, 16, ARENA_CAT_ACTIVATIONS, 0, 1);
    arena_handle y = reserve(a, "y", 512, 16, ARENA_CAT_ACTIVATIONS, 2, 3);
    arena_handle z = reserve(a, "z", 256, 16, ARENA_CAT_ACTIVATIONS, 1, 2);
    arena_handle d = reserve(a, "d", 600, 16, ARENA_CAT_WORKSPACE, 4, 4);
    arena_pack(a);
    // Order w(1000) d(600) x(512) y(512) z(256). w at 0 ends at 1000 -> 1008 aligned. d, x and y
    // meet only w, so all three share 1008. z (ops 1..2) meets x and y, which end at 1520.
    CHECK_OFFSET(a, w, 0);
    CHECK_OFFSET(a, d, 1008);
    CHECK_OFFSET(a, x, 1008);
    CHECK_OFFSET(a, y, 1008);
    CHECK_OFFSET(a, z, 1520);
    CHECK(a->bytes_total == 1792, "bytes_total %" PRIu64 ", expected 1776 rounded up to 1792",
          a->bytes_total);
    // 1000 persistent + peak at ops 1 and 2 (x+z and y+z = 768).
    CHECK(arena_lower_bound(a) == 1768, "lower bound %" PRIu64, arena_lower_bound(a));
    CHECK(a->phase == ARENA_PHASE_BIND, "phase %d after pack", a->phase);
    check_packed(a);
    free(a);
    test_end();
}

// pack_gap: x (ops 0..1), y (ops 3..4), w (ops 6..7), same size. Gaps 0 and 1 put all three at
// offset 0 (y begins 2 ops after x ends, w 2 after y). Gap 2 keeps y apart from x and w apart
// from y, but w may reuse x's bytes (6 > 1 + 2). Gap 5 keeps all three apart; arena_check
// (lifetimes without the gap) holds throughout.
static void test_pack_gap(void) {
    test_begin("pack_gap_keeps_near_lifetimes_apart");
    static const struct { uint32_t gap; uint64_t x, y, w; } cases[] = {
        {0, 0, 0, 0}, {1, 0, 0, 0}, {2, 0, 100, 0}, {5, 0, 100, 200}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        arena *a = arena_new(ARENA_KIND_HOST, "host");
        arena_handle x = reserve(a, "x", 100, 1, ARENA_CAT_ACTIVATIONS, 0, 1);
        arena_handle y = reserve(a, "y", 100, 1, ARENA_CAT_ACTIVATIONS, 3, 4);
        arena_handle w = reserve(a, "w", 100, 1, ARENA_CAT_ACTIVATIONS, 6, 7);
        a->pack_gap = cases[k].gap;
        arena_pack(a);
        CHECK(offset_of(a, x) == cases[k].x && offset_of(a, y) == cases[k].y &&
                  offset_of(a, w) == cases[k].w,
              "gap %u: offsets %" PRIu64 " %" PRIu64 " %" PRIu64 ", expected %" PRIu64
              " %" PRIu64 " %" PRIu64, cases[k].gap, offset_of(a, x), offset_of(a, y),
              offset_of(a, w), cases[k].x, cases[k].y, cases[k].w);
        check_packed(a);
        free(a);
    }
    test_end();
}

static void test_transient_only_share(void) {
    test_begin("transient_only_share");
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    arena_handle x = reserve(a, "x", 100, 1, ARENA_CAT_ACTIVATIONS, 0, 1);
    arena_handle y = reserve(a, "y", 100, 1, ARENA_CAT_ACTIVATIONS, 2, 3);
    arena_handle z = reserve(a, "z", 100, 1, ARENA_CAT_ACTIVATIONS, 1, 2);  // meets both
    arena_pack(a);
    CHECK_OFFSET(a, x, 0);
    CHECK_OFFSET(a, y, 0);
    CHECK_OFFSET(a, z, 100);
    CHECK(a->bytes_total == 256, "bytes_total %" PRIu64, a->bytes_total);
    CHECK(arena_lower_bound(a) == 200, "lower bound %" PRIu64, arena_lower_bound(a));
    check_packed(a);
    free(a);
    test_end();
}

static void test_alignment_fills_gap(void) {
    test_begin("alignment_fills_gap");
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    arena_handle p = reserve(a, "p", 100, 1, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle q = reserve(a, "q", 64, 4096, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle r = reserve(a, "r", 10, 1, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle s = reserve(a, "s", 8, 8, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    arena_pack(a);
    // q jumps to 4096; r (align 1) and s (align 8) then fill the gap left below q.
    CHECK_OFFSET(a, p, 0);
    CHECK_OFFSET(a, q, 4096);
    CHECK_OFFSET(a, r, 100);
    CHECK_OFFSET(a, s, 112);
    CHECK(arena_region_get(a, q)->align == 4096, "align %" PRIu64, arena_region_get(a, q)->align);
    CHECK(arena_region_get(a, r)->align == 1, "host arena keeps align 1");
    CHECK(a->bytes_total == 4352, "bytes_total %" PRIu64 " (4160 rounded to 256)", a->bytes_total);
    check_packed(a);
    free(a);
    test_end();
}

static void test_device_raises_alignment(void) {
    test_begin("device_raises_alignment");
    arena *a = arena_new(ARENA_KIND_DEVICE, "device");
    arena_handle x = reserve(a, "x", 100, 1, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle y = reserve(a, "y", 100, 16, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle z = reserve(a, "z", 300, 512, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    arena_pack(a);
    CHECK(arena_region_get(a, x)->align == ARENA_DEVICE_ALIGN_MIN, "x align %" PRIu64,
          arena_region_get(a, x)->align);
    CHECK(arena_region_get(a, y)->align == ARENA_DEVICE_ALIGN_MIN, "y align raised");
    CHECK(arena_region_get(a, z)->align == 512, "z keeps its larger alignment");
    // z first at 0 (ends 300), x at 512, y after x's end 612 -> 768.
    CHECK_OFFSET(a, z, 0);
    CHECK_OFFSET(a, x, 512);
    CHECK_OFFSET(a, y, 768);
    CHECK(a->bytes_total == 1024, "bytes_total %" PRIu64, a->bytes_total);
    check_packed(a);
    free(a);
    test_end();
}

static void test_zero_bytes_and_unused(void) {
    test_begin("zero_bytes_and_unused");
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    arena_handle pa = reserve(a, "a", 100, 1, ARENA_CAT_OPTIM, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle z0 = reserve(a, "z0", 0, 64, ARENA_CAT_OPTIM, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle z1 = reserve(a, "z1", 0, 1, ARENA_CAT_GRADS, 0, 5);
    arena_handle b = reserve(a, "b", 50, 1, ARENA_CAT_OPTIM, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle u = reserve(a, "u", 300, 1, ARENA_CAT_WORKSPACE, NEVER_USED);
    CHECK(z0 == 1 && z1 == 2 && u == 4, "handles are dense: %u %u %u", z0, z1, u);
    const arena_region *ru = arena_region_get(a, u);
    CHECK(!ru->persistent && ru->first_op == INT32_MAX && ru->last_op == -1,
          "unused lifetime %d..%d", ru->first_op, ru->last_op);
    arena_pack(a);
    // u meets nothing, so it lands at 0 under a; zero-byte regions occupy nothing and sit at 0.
    CHECK_OFFSET(a, u, 0);
    CHECK_OFFSET(a, pa, 0);
    CHECK_OFFSET(a, z0, 0);
    CHECK_OFFSET(a, z1, 0);
    CHECK_OFFSET(a, b, 100);
    CHECK(a->bytes_total == 512, "bytes_total %" PRIu64, a->bytes_total);
    CHECK(arena_lower_bound(a) == 150, "lower bound %" PRIu64, arena_lower_bound(a));
    check_packed(a);
    free(a);

    arena *e = arena_new(ARENA_KIND_DEVICE, "empty");
    reserve(e, "only_zero", 0, 1, ARENA_CAT_STAGING, ARENA_LIFETIME_PERSISTENT, 0);
    arena_pack(e);
    CHECK(e->bytes_total == 0, "all-empty arena total %" PRIu64, e->bytes_total);
    check_packed(e);
    free(e);
    test_end();
}

static void test_extend(void) {
    test_begin("extend");
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    arena_handle p = reserve(a, "p", 64, 1, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle t = reserve(a, "t", 64, 1, ARENA_CAT_ACTIVATIONS, NEVER_USED);
    arena_handle v = reserve(a, "v", 64, 1, ARENA_CAT_ACTIVATIONS, 2, 2);
    arena_extend(a, t, 5);
    arena_extend(a, t, 3);
    arena_extend(a, t, 4);
    arena_extend(a, v, 1);
    arena_extend(a, p, 9);  // persistent already covers every op
    const arena_region *rt = arena_region_get(a, t), *rv = arena_region_get(a, v);
    const arena_region *rp = arena_region_get(a, p);
    CHECK(rt->first_op == 3 && rt->last_op == 5, "t lifetime %d..%d", rt->first_op, rt->last_op);
    CHECK(rv->first_op == 1 && rv->last_op == 2, "v lifetime %d..%d", rv->first_op, rv->last_op);
    CHECK(rp->persistent && rp->first_op == ARENA_LIFETIME_PERSISTENT, "p stays persistent");
    arena_pack(a);
    CHECK_OFFSET(a, p, 0);
    CHECK_OFFSET(a, t, 64);  // now used, so it meets p
    CHECK_OFFSET(a, v, 64);  // ops 1..2 and 3..5 are disjoint
    check_packed(a);
    free(a);
    test_end();
}

static char *print_to_string(const arena *a);

static arena_handle part(arena *a, arena_handle whole, const char *name, uint64_t bytes,
                         uint64_t align) {
    arena_handle h = UINT32_MAX;
    qt_status s = arena_reserve_part(a, whole, name, bytes, align, &h);
    CHECK(s == QT_OK, "part '%s': %s: %s", name, qt_status_name(s), qt_error_message());
    return h;
}

// Parts lie one after another inside their whole, each at its own alignment; the whole grows
// with them, takes the largest alignment and a lifetime over every part's use, and is packed
// for them: a region live beside a part's use never shares the whole's bytes, one live before
// or after every part does. Totals and the lower bound count the parts in the whole only.
static void test_parts(void) {
    test_begin("parts_inside_their_whole");
    arena *a = arena_new(ARENA_KIND_DEVICE, "device");
    arena_handle p = reserve(a, "p", 1024, 256, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle w = reserve(a, "amax", 0, 256, ARENA_CAT_WORKSPACE, NEVER_USED);
    arena_handle x = part(a, w, "x.amax", 4, 16);
    arena_handle y = part(a, w, "y.amax", 40, 1024);
    arena_handle z = part(a, w, "z.amax", 8, 1);
    const arena_region *rw = arena_region_get(a, w), *ry = arena_region_get(a, y);
    CHECK(rw->bytes == 1288 && rw->align == 1024, "whole: %" PRIu64 " bytes, align %" PRIu64,
          rw->bytes, rw->align);
    CHECK(arena_region_get(a, x)->part_offset == 0 && ry->part_offset == 1024 &&
              arena_region_get(a, z)->part_offset == 1280,
          "parts at +%" PRIu64 " +%" PRIu64 " +%" PRIu64, arena_region_get(a, x)->part_offset,
          ry->part_offset, arena_region_get(a, z)->part_offset);
    CHECK(arena_region_get(a, x)->align == ARENA_DEVICE_ALIGN_MIN && ry->part &&
              ry->whole == w && ry->category == ARENA_CAT_WORKSPACE,
          "a part is raised to the device alignment and has its whole's category");
    arena_extend(a, x, 3);
    arena_extend(a, y, 7);
    CHECK(rw->first_op == 3 && rw->last_op == 7, "whole lifetime %d..%d", rw->first_op,
          rw->last_op);
    CHECK(ry->first_op == 7 && ry->last_op == 7, "part keeps its own lifetime %d..%d",
          ry->first_op, ry->last_op);
    arena_handle during = reserve(a, "during", 512, 256, ARENA_CAT_ACTIVATIONS, 5, 5);
    arena_handle after = reserve(a, "after", 2048, 256, ARENA_CAT_ACTIVATIONS, 8, 9);
    CHECK(arena_category_bytes(a, ARENA_CAT_WORKSPACE) == 1288, "workspace %" PRIu64,
          arena_category_bytes(a, ARENA_CAT_WORKSPACE));
    // 1024 persistent + the peak at op 5 (the whole and `during`) or at 8 (`after`).
    CHECK(arena_lower_bound(a) == 1024 + 2048, "lower bound %" PRIu64, arena_lower_bound(a));
    arena_pack(a);
    // after (2048) at 0; the whole (1288, ops 3..7) shares its bytes; p (persistent) above
    // both; during (op 5) above the whole's end 1288, aligned: 1536.
    CHECK_OFFSET(a, after, 0);
    CHECK_OFFSET(a, w, 0);
    CHECK_OFFSET(a, x, 0);
    CHECK_OFFSET(a, y, 1024);
    CHECK_OFFSET(a, z, 1280);
    CHECK_OFFSET(a, p, 2048);
    CHECK_OFFSET(a, during, 1536);
    check_packed(a);
    char msg[256];
    a->regions[y].offset += 1024;  // out of its whole
    CHECK(!arena_check(a, msg, sizeof msg) && strstr(msg, "'y.amax'") &&
              strstr(msg, "not inside its whole"), "part moved: %s", msg);
    a->regions[y].offset -= 1024;
    CHECK(arena_check(a, msg, sizeof msg), "repaired: %s", msg);
    char *map = print_to_string(a);
    CHECK(strstr(map, "ops 7..7 in 1\n") && strstr(map, "unused in 1\n") &&
              strstr(map, "ops 3..7\n"), "a part's line names its whole:\n%s", map);
    free(map);
    free(a);

    arena *c = arena_new(ARENA_KIND_HOST, "host");
    arena_handle cw = reserve(c, "whole", 8, 1, ARENA_CAT_WORKSPACE, NEVER_USED);
    arena_handle h = 0;
    qt_status s = arena_reserve_part(c, cw, "huge", ARENA_BYTES_MAX - 4, 1, &h);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "'whole' past ARENA_BYTES_MAX"),
          "%s: %s", qt_status_name(s), qt_error_message());
    s = arena_reserve_part(c, cw, "whole", 4, 1, &h);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "reserved twice"), "duplicate: %s",
          qt_error_message());
    CHECK(c->region_count == 1 && arena_region_get(c, cw)->bytes == 8,
          "failed parts add nothing: %u regions, %" PRIu64 " bytes", c->region_count,
          arena_region_get(c, cw)->bytes);
    free(c);

    arena counting;
    arena_init(&counting, ARENA_KIND_DEVICE, "device", NULL, 0);
    CHECK(arena_reserve(&counting, "whole", 0, 256, ARENA_CAT_WORKSPACE, 0, -1, &h) == QT_OK &&
              arena_reserve_part(&counting, h, "part", 4, 16, &h) == QT_OK && h == 1 &&
              counting.region_count == 2,
          "a counting arena numbers parts: handle %u", h);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// operating errors

static void test_errors(void) {
    test_begin("errors_capacity_and_names");
    arena *a = arena_new(ARENA_KIND_DEVICE, "device");
    arena_handle h = 0;
    char name[ARENA_NAME_MAX + 8];
    for (int i = 0; i < TEST_REGIONS; i++) {
        snprintf(name, sizeof name, "r%d", i);
        reserve(a, name, 16, 1, ARENA_CAT_WEIGHTS, i, i);
    }
    qt_status s = arena_reserve(a, "one_more", 16, 1, ARENA_CAT_WEIGHTS, 0, 0, &h);
    CHECK(s == QT_ERR_CAPACITY, "status %s", qt_status_name(s));
    CHECK(strstr(qt_error_message(), "holds 2048 regions, the count its plan was sized for") !=
          NULL, "msg: %s", qt_error_message());
    CHECK(strstr(qt_error_message(), "one_more") != NULL, "msg: %s", qt_error_message());
    CHECK(a->region_count == TEST_REGIONS, "count %u", a->region_count);
    free(a);

    a = arena_new(ARENA_KIND_HOST, "host");
    reserve(a, "fc1.weight", 16, 1, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    s = arena_reserve(a, "fc1.weight", 32, 1, ARENA_CAT_GRADS, 0, 1, &h);
    CHECK(s == QT_ERR_INPUT, "duplicate: %s", qt_status_name(s));
    CHECK(strstr(qt_error_message(), "'fc1.weight'") != NULL, "msg: %s", qt_error_message());
    s = arena_reserve(a, "", 32, 1, ARENA_CAT_GRADS, 0, 1, &h);
    CHECK(s == QT_ERR_INPUT, "empty name: %s", qt_status_name(s));
    memset(name, 'n', ARENA_NAME_MAX);
    name[ARENA_NAME_MAX] = '\0';
    s = arena_reserve(a, name, 32, 1, ARENA_CAT_GRADS, 0, 1, &h);
    CHECK(s == QT_ERR_INPUT, "long name: %s", qt_status_name(s));
    CHECK(strstr(qt_error_message(), "ARENA_NAME_MAX") != NULL, "msg: %s", qt_error_message());
    name[ARENA_NAME_MAX - 1] = '\0';  // 63 characters: the longest that fits
    reserve(a, name, 32, 1, ARENA_CAT_GRADS, 0, 1);
    s = arena_reserve(a, "odd_align", 32, 24, ARENA_CAT_GRADS, 0, 1, &h);
    CHECK(s == QT_ERR_INPUT, "align 24: %s", qt_status_name(s));
    s = arena_reserve(a, "zero_align", 32, 0, ARENA_CAT_GRADS, 0, 1, &h);
    CHECK(s == QT_ERR_INPUT, "align 0: %s", qt_status_name(s));
    s = arena_reserve(a, "huge", ARENA_BYTES_MAX + 1, 1, ARENA_CAT_GRADS, 0, 1, &h);
    CHECK(s == QT_ERR_INPUT, "huge: %s", qt_status_name(s));
    CHECK(strstr(qt_error_message(), "ARENA_BYTES_MAX") != NULL, "msg: %s", qt_error_message());
    CHECK(a->region_count == 2, "failed reserves add nothing: count %u", a->region_count);
    free(a);
    test_end();
}

// A counting arena (the pass that sizes the runtime's tables) numbers what arena_reserve accepts
// and refuses what a table-backed arena refuses, names aside: it keeps none to compare.
static void test_counting(void) {
    test_begin("counting_arena_numbers_regions_and_keeps_nothing");
    arena a;
    arena_init(&a, ARENA_KIND_DEVICE, "device", NULL, 0);
    CHECK(arena_counting(&a) && a.regions == NULL, "a counting arena has no table");
    arena_handle h = UINT32_MAX;
    for (uint32_t i = 0; i < 5000; i++) {  // more than any table of these tests
        CHECK(arena_reserve(&a, "same_name", 64, 256, ARENA_CAT_ACTIVATIONS, 0, -1, &h) == QT_OK &&
              h == i, "reserve %u: handle %u: %s", i, h, qt_error_message());
    }
    CHECK(arena_reserve(&a, "w", 64, 1, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0, &h) ==
          QT_OK && h == 5000, "persistent");
    CHECK(arena_reserve(&a, "z", 0, 1, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0, &h) ==
          QT_OK, "empty persistent");
    arena_extend(&a, 3, 17);  // nothing to widen
    CHECK(arena_reserve(&a, "huge", ARENA_BYTES_MAX + 1, 1, ARENA_CAT_GRADS, 0, 1, &h) ==
          QT_ERR_INPUT && strstr(qt_error_message(), "ARENA_BYTES_MAX"), "%s", qt_error_message());
    CHECK(arena_reserve(&a, "", 1, 1, ARENA_CAT_GRADS, 0, 1, &h) == QT_ERR_INPUT, "empty name");
    CHECK(a.region_count == 5002, "count %u", a.region_count);
    CHECK(arena_persistent_regions(&a, ARENA_CAT_WEIGHTS) == 1 &&
          arena_persistent_regions(&a, ARENA_CAT_ACTIVATIONS) == 0,
          "persistent regions with bytes: %u", arena_persistent_regions(&a, ARENA_CAT_WEIGHTS));
    test_end();
}

// ---------------------------------------------------------------------------------------------
// phase asserts: each runs in a forked child, which must die by SIGABRT saying "assertion failed"

static qt_status alloc_fake_device(void *ctx, uint64_t bytes, uint64_t *base, uint8_t **host) {
    (void)ctx;
    (void)bytes;
    *base = UINT64_C(0x7f0000000000);
    *host = NULL;
    return QT_OK;
}

static arena *child_arena(void) {
    arena *a = arena_new(ARENA_KIND_DEVICE, "child");
    arena_handle h;
    if (arena_reserve(a, "x", 64, 1, ARENA_CAT_WEIGHTS, 0, 1, &h) != QT_OK) _exit(3);
    return a;
}

static void child_reserve_after_pack(void) {
    arena *a = child_arena();
    arena_handle h;
    arena_pack(a);
    (void)arena_reserve(a, "y", 64, 1, ARENA_CAT_WEIGHTS, 0, 1, &h);
}
static void child_extend_after_pack(void) {
    arena *a = child_arena();
    arena_pack(a);
    arena_extend(a, 0, 4);
}
static void child_pack_twice(void) {
    arena *a = child_arena();
    arena_pack(a);
    arena_pack(a);
}
static void child_reserve_after_bind(void) {
    arena *a = child_arena();
    arena_handle h;
    (void)arena_bind(a, alloc_fake_device, NULL);
    (void)arena_reserve(a, "y", 64, 1, ARENA_CAT_WEIGHTS, 0, 1, &h);
}
static void child_bind_twice(void) {
    arena *a = child_arena();
    (void)arena_bind(a, alloc_fake_device, NULL);
    (void)arena_bind(a, alloc_fake_device, NULL);
}
static void child_address_before_bind(void) {
    arena *a = child_arena();
    arena_pack(a);
    (void)arena_address(a, 0);
}
static void child_host_pointer_of_device(void) {
    arena *a = child_arena();
    (void)arena_bind(a, alloc_fake_device, NULL);
    (void)arena_host_pointer(a, 0);
}
static void child_bad_handle(void) {
    arena *a = child_arena();
    (void)arena_region_get(a, 1);
}
static void child_negative_first_op(void) {
    arena *a = child_arena();
    arena_handle h;
    (void)arena_reserve(a, "y", 64, 1, ARENA_CAT_WEIGHTS, -5, 1, &h);
}
static void child_valid(void) {
    arena *a = child_arena();
    (void)arena_bind(a, alloc_fake_device, NULL);
    (void)arena_address(a, 0);
}

// Runs fn in a child; returns true when it died by SIGABRT and wrote "assertion failed".
static bool child_aborts(void (*fn)(void)) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char text[512] = {0};
    size_t used = 0;
    ssize_t got;
    while ((got = read(fds[0], text + used, sizeof text - 1 - used)) > 0) used += (size_t)got;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    bool aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    return aborted && strstr(text, "assertion failed") != NULL;
}

static void test_phase_asserts(void) {
    test_begin("phase_asserts");
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"reserve after pack", child_reserve_after_pack},
        {"extend after pack", child_extend_after_pack},
        {"pack twice", child_pack_twice},
        {"reserve after bind", child_reserve_after_bind},
        {"bind twice", child_bind_twice},
        {"address before bind", child_address_before_bind},
        {"host pointer of a device arena", child_host_pointer_of_device},
        {"handle out of range", child_bad_handle},
        {"negative first_op", child_negative_first_op},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(child_aborts(cases[i].fn), "%s did not abort with an assertion", cases[i].name);
    }
    CHECK(!child_aborts(child_valid), "the harness reports a valid sequence as aborting");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// binding

typedef struct fake_alloc {
    int calls;
    uint64_t bytes_asked, base;
    uint8_t *host;
    qt_status status;
} fake_alloc;

static qt_status alloc_fake(void *ctx, uint64_t bytes, uint64_t *base, uint8_t **host) {
    fake_alloc *f = ctx;
    f->calls++;
    f->bytes_asked = bytes;
    if (f->status != QT_OK) return qt_fail(f->status, "fake allocator: out of memory");
    *base = f->base;
    *host = f->host;
    return QT_OK;
}

static void test_bind_device(void) {
    arena *a = arena_new(ARENA_KIND_DEVICE, "device");
    arena_handle x = reserve(a, "x", 1000, 1, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    arena_handle y = reserve(a, "y", 10, 1, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    fake_alloc f = {.status = QT_ERR_MEMORY};
    qt_status s = arena_bind(a, alloc_fake, &f);  // from PLAN: packs first
    CHECK(s == QT_ERR_MEMORY && f.calls == 1, "failing alloc: %s, %d calls", qt_status_name(s),
          f.calls);
    CHECK(a->phase == ARENA_PHASE_BIND, "failed bind stays in BIND, phase %d", a->phase);
    CHECK(f.bytes_asked == 1280, "asked %" PRIu64, f.bytes_asked);
    f = (fake_alloc){.base = UINT64_C(0x7f0000000000) + 16};
    s = arena_bind(a, alloc_fake, &f);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "aligned") != NULL, "misaligned: %s",
          qt_error_message());
    f = (fake_alloc){.base = UINT64_C(0x7f0000000000)};
    s = arena_bind(a, alloc_fake, &f);
    CHECK(s == QT_OK && f.calls == 1 && a->phase == ARENA_PHASE_FROZEN, "bind: %s",
          qt_status_name(s));
    CHECK(arena_address(a, x) == f.base, "x at %" PRIx64, arena_address(a, x));
    CHECK(arena_address(a, y) == f.base + 1024, "y at %" PRIx64, arena_address(a, y));
    CHECK(a->host_base == NULL, "device arena on a GPU has no host pointer");
    check_packed(a);
    free(a);
}

static void test_bind_host(void) {
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    arena_handle x = reserve(a, "x", 100, 64, ARENA_CAT_STAGING, 0, 0);
    arena_handle y = reserve(a, "y", 100, 64, ARENA_CAT_STAGING, 1, 1);
    arena_handle z = reserve(a, "z", 8, 8, ARENA_CAT_STAGING, ARENA_LIFETIME_PERSISTENT, 0);
    arena_pack(a);
    fake_alloc f = {.base = 64};
    qt_status s = arena_bind(a, alloc_fake, &f);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "host pointer"), "no host: %s",
          qt_error_message());
    uint8_t *memory = aligned_alloc(256, a->bytes_total);
    f = (fake_alloc){.base = (uint64_t)(uintptr_t)memory, .host = memory};
    s = arena_bind(a, alloc_fake, &f);
    CHECK(s == QT_OK && f.calls == 1, "bind: %s", qt_status_name(s));
    CHECK(f.bytes_asked == 256, "asked %" PRIu64, f.bytes_asked);
    uint8_t *px = arena_host_pointer(a, x), *py = arena_host_pointer(a, y);
    uint8_t *pz = arena_host_pointer(a, z);
    // x and y (100 bytes, ops 0 and 1) share 0; z meets both and goes after them, at 104.
    CHECK(px == py && px == memory, "x and y share bytes: %p %p", (void *)px, (void *)py);
    CHECK(pz == memory + 104, "z at %p", (void *)pz);
    CHECK(arena_address(a, y) == (uint64_t)(uintptr_t)py, "address matches host pointer");
    memset(px, 0xab, 100);  // the whole region is writable memory (a sanitizer would say)
    check_packed(a);
    free(memory);
    free(a);
}

static void test_bind(void) {
    test_begin("bind");
    test_bind_device();
    test_bind_host();
    test_end();
}

// ---------------------------------------------------------------------------------------------
// arena_check finds planted faults

static void test_check_finds_faults(void) {
    test_begin("check_finds_faults");
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    char msg[256];
    reserve(a, "p", 64, 64, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    reserve(a, "t", 64, 64, ARENA_CAT_ACTIVATIONS, 0, 3);
    reserve(a, "u", 64, 64, ARENA_CAT_ACTIVATIONS, 4, 5);
    CHECK(!arena_check(a, msg, sizeof msg) && strstr(msg, "not packed"), "plan: %s", msg);
    arena_pack(a);
    CHECK(arena_check(a, msg, sizeof msg), "packed: %s", msg);
    a->regions[1].offset = 32;  // t overlaps p and is misaligned
    CHECK(!arena_check(a, msg, sizeof msg) && strstr(msg, "alignment"), "misaligned: %s", msg);
    a->regions[1].offset = 0;
    CHECK(!arena_check(a, msg, sizeof msg) && strstr(msg, "'p'") && strstr(msg, "'t'"),
          "overlap: %s", msg);
    a->regions[1].offset = 64;
    a->regions[2].offset = 256;  // bytes_total is 256
    CHECK(!arena_check(a, msg, sizeof msg) && strstr(msg, "bytes_total"), "outside: %s", msg);
    CHECK(!arena_check(a, NULL, 0), "no message buffer");
    a->regions[2].offset = 64;
    CHECK(arena_check(a, NULL, 0), "repaired");
    free(a);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// printed map

static char *print_to_string(const arena *a) {
    char *text = NULL;
    size_t text_bytes = 0;
    FILE *out = open_memstream(&text, &text_bytes);
    if (out == NULL) abort();
    arena_print(a, out);
    fclose(out);
    return text;
}

static void test_print(void) {
    test_begin("print_totals");
    arena *a = arena_new(ARENA_KIND_HOST, "host");
    reserve(a, "w", 1000, 16, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0);
    reserve(a, "x", 512, 16, ARENA_CAT_ACTIVATIONS, 0, 1);
    reserve(a, "y", 512, 16, ARENA_CAT_ACTIVATIONS, 2, 3);
    reserve(a, "z", 256, 16, ARENA_CAT_ACTIVATIONS, 1, 2);
    reserve(a, "d", 600, 16, ARENA_CAT_WORKSPACE, 4, 4);
    reserve(a, "unused_one", 3 << 20, 16, ARENA_CAT_WORKSPACE, NEVER_USED);
    char *plan = print_to_string(a);
    CHECK(strstr(plan, "not packed") != NULL, "plan map:\n%s", plan);
    arena_pack(a);
    char *map = print_to_string(a);
    // Totals are exact bytes then a human-readable size, in fixed columns.
    CHECK(strstr(map, "\n  total               3145728    3.00 MiB\n") != NULL, "map:\n%s", map);
    CHECK(strstr(map, "\n  lower bound            1768    1.73 KiB\n") != NULL, "map:\n%s", map);
    CHECK(strstr(map, "\n  activations            1280    1.25 KiB\n") != NULL, "map:\n%s", map);
    CHECK(strstr(map, "\n  workspace           3146328    3.00 MiB\n") != NULL, "map:\n%s", map);
    CHECK(strstr(map, "0x000003f0") != NULL, "offset 1008 in hex:\n%s", map);
    CHECK(strstr(map, "ops 1..2") && strstr(map, "persistent") && strstr(map, "unused"),
          "lifetimes:\n%s", map);
    free(plan);
    free(map);
    free(a);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// random plans against an independent model of the same greedy packing

static uint64_t rng_state;

static uint64_t rng_next(void) {  // splitmix64
    uint64_t z = (rng_state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t rng_below(uint64_t n) { return rng_next() % n; }

typedef struct model_region {
    uint64_t bytes, align, offset;
    bool persistent, used;
    int32_t first, last;
} model_region;

static bool model_meet(const model_region *x, const model_region *y) {
    if (!x->used || !y->used) return false;
    if (x->persistent || y->persistent) return true;
    return !(x->last < y->first || y->last < x->first);
}

static bool model_fits(const model_region *m, const bool *placed, int n, int self, uint64_t at) {
    for (int j = 0; j < n; j++) {
        if (!placed[j] || m[j].bytes == 0 || !model_meet(&m[self], &m[j])) continue;
        uint64_t lo = at > m[j].offset ? at : m[j].offset;
        uint64_t hi_self = at + m[self].bytes, hi_j = m[j].offset + m[j].bytes;
        if (lo < (hi_self < hi_j ? hi_self : hi_j)) return false;
    }
    return true;
}

// Ops a region is live at, for the orders that weigh lifetimes (persistent: never compared).
static uint64_t model_ops(const model_region *r) {
    return r->used ? (uint64_t)(r->last - r->first) + 1 : 0;
}

// Whether region i comes before region j in arena_pack's order `rule` (0: bytes; 1: persistent,
// bytes, ops live; 2: persistent, bytes x ops live for transient regions, bytes), ties to the
// lower index.
static bool model_before(const model_region *m, int rule, int i, int j) {
    const model_region *x = &m[i], *y = &m[j];
    if (rule > 0 && x->persistent != y->persistent) return x->persistent;
    if (rule == 2 && !x->persistent) {
        double ax = (double)x->bytes * (double)model_ops(x);
        double ay = (double)y->bytes * (double)model_ops(y);
        if (ax != ay) return ax > ay;
    }
    if (x->bytes != y->bytes) return x->bytes > y->bytes;
    if (rule == 1 && !x->persistent && model_ops(x) != model_ops(y)) {
        return model_ops(x) > model_ops(y);
    }
    return i < j;
}

// Brute force in one order: the lowest feasible aligned offset is 0 or the aligned end of some
// placed region, so try every such candidate and keep the smallest that fits. Returns the end of
// the highest region.
static uint64_t model_pack_order(model_region *m, int n, int rule) {
    bool placed[TEST_REGIONS] = {false};
    uint64_t end_max = 0;
    for (int step = 0; step < n; step++) {
        int pick = -1;
        for (int i = 0; i < n; i++) {
            if (!placed[i] && (pick < 0 || model_before(m, rule, i, pick))) pick = i;
        }
        uint64_t best = UINT64_MAX;
        if (m[pick].bytes == 0 || model_fits(m, placed, n, pick, 0)) best = 0;
        for (int j = 0; j < n && best != 0; j++) {
            if (!placed[j]) continue;
            uint64_t a = m[pick].align, at = (m[j].offset + m[j].bytes + a - 1) / a * a;
            if (at < best && model_fits(m, placed, n, pick, at)) best = at;
        }
        m[pick].offset = best;
        placed[pick] = true;
        if (best + m[pick].bytes > end_max) end_max = best + m[pick].bytes;
    }
    return end_max;
}

static uint64_t model_lower_bound(const model_region *m, int n, int32_t ops);

// arena_pack's choice: the orders in turn until one ends at the lower bound, the first lowest
// end kept (its offsets left in m). Returns the model's bytes_total.
static uint64_t model_pack(model_region *m, int n, int32_t ops, int *rule_out) {
    uint64_t bound = model_lower_bound(m, n, ops), best_end = UINT64_MAX;
    int best = 0;
    for (int rule = 0; rule < 3; rule++) {
        uint64_t end = model_pack_order(m, n, rule);
        if (end < best_end) {
            best_end = end;
            best = rule;
        }
        if (end <= bound) break;
    }
    model_pack_order(m, n, best);
    *rule_out = best;
    return (best_end + 255) / 256 * 256;
}

// The lowest op with the most transient bytes live, or -1 when no transient region is used.
static int32_t model_peak_op(const model_region *m, int n, int32_t ops, uint64_t *bytes) {
    int32_t peak_op = -1;
    *bytes = 0;
    for (int32_t op = 0; op < ops; op++) {
        uint64_t live = 0;
        bool any = false;
        for (int i = 0; i < n; i++) {
            bool on = !m[i].persistent && m[i].used && m[i].first <= op && op <= m[i].last;
            live += on ? m[i].bytes : 0;
            any = any || on;
        }
        if (any && (peak_op < 0 || live > *bytes)) {
            peak_op = op;
            *bytes = live;
        }
    }
    return peak_op;
}

static uint64_t model_lower_bound(const model_region *m, int n, int32_t ops) {
    uint64_t persistent = 0, peak = 0;
    for (int i = 0; i < n; i++) persistent += m[i].persistent ? m[i].bytes : 0;
    for (int32_t op = 0; op < ops; op++) {
        uint64_t live = 0;
        for (int i = 0; i < n; i++) {
            bool on = !m[i].persistent && m[i].used && m[i].first <= op && op <= m[i].last;
            live += on ? m[i].bytes : 0;
        }
        if (live > peak) peak = live;
    }
    return persistent + peak;
}

static uint64_t random_bytes(void) {
    static const uint64_t common[] = {256, 1000, 4096, 65536};
    switch (rng_below(6)) {
    case 0: return rng_below(12) == 0 ? 0 : rng_below(64) + 1;
    case 1: return common[rng_below(4)];  // many equal sizes exercise the handle tie-break
    case 2: return UINT64_C(1) << rng_below(21);
    case 3: return rng_below(1 << 20) + 1;
    default: return rng_below(8192);
    }
}

// Fills m[0..n) and reserves the same plan in a.
static void random_plan(arena *a, model_region *m, int n, int32_t ops) {
    for (int i = 0; i < n; i++) {
        model_region *r = &m[i];
        r->bytes = random_bytes();
        uint64_t align = UINT64_C(1) << rng_below(13);
        r->align = a->kind == ARENA_KIND_DEVICE && align < 256 ? 256 : align;
        int kind = (int)rng_below(20);
        r->persistent = kind < 3;
        r->used = kind != 3;
        r->first = r->persistent ? ARENA_LIFETIME_PERSISTENT : (int32_t)rng_below((uint64_t)ops);
        r->last = r->first + (int32_t)rng_below((uint64_t)(ops - r->first));
        int32_t first = r->used ? r->first : INT32_MAX, last = r->used ? r->last : -1;
        char name[32];
        snprintf(name, sizeof name, "region.%d", i);
        reserve(a, name, r->bytes, align, (arena_category)rng_below(ARENA_CAT_COUNT), first, last);
    }
}

static void test_random_against_model(void) {
    test_begin("random_against_model");
    model_region *m = malloc(sizeof(model_region) * TEST_REGIONS);
    arena *a = arena_alloc();
    int plans = 300, rules[3] = {0, 0, 0};
    for (int plan = 0; plan < plans; plan++) {
        rng_state = UINT64_C(0x5eed0000) + (uint64_t)plan;
        int n = 1 + (int)rng_below(300);
        int32_t ops = 1 + (int32_t)rng_below(48);
        arena_start(a, rng_below(2) ? ARENA_KIND_DEVICE : ARENA_KIND_HOST, "random");
        random_plan(a, m, n, ops);
        arena_pack(a);
        int rule = 0;
        uint64_t total = model_pack(m, n, ops, &rule);
        rules[rule]++;
        int mismatches = 0;
        for (int i = 0; i < n; i++) {
            if (offset_of(a, (arena_handle)i) == m[i].offset) continue;
            if (++mismatches <= 3) {
                CHECK(false, "plan %d region %d (%" PRIu64 " bytes): offset %" PRIu64
                      ", model %" PRIu64, plan, i, m[i].bytes, offset_of(a, (arena_handle)i),
                      m[i].offset);
            }
        }
        CHECK(a->bytes_total == total, "plan %d: total %" PRIu64 ", model %" PRIu64, plan,
              a->bytes_total, total);
        uint64_t bound = model_lower_bound(m, n, ops);
        CHECK(arena_lower_bound(a) == bound, "plan %d: lower bound %" PRIu64 ", model %" PRIu64,
              plan, arena_lower_bound(a), bound);
        uint64_t peak_bytes = 0, model_peak_bytes = 0;
        int32_t peak = arena_peak_op(a, &peak_bytes);
        int32_t model_peak = model_peak_op(m, n, ops, &model_peak_bytes);
        CHECK(peak == model_peak && peak_bytes == model_peak_bytes, "plan %d: peak at op %d "
              "(%" PRIu64 " bytes), model op %d (%" PRIu64 ")", plan, peak, peak_bytes,
              model_peak, model_peak_bytes);
        // arena_next_largest walks every region with bytes once, by decreasing bytes, ties to
        // the lower handle; at the peak op, only the transient regions live there.
        const int32_t walks[2] = {-1, peak};
        for (int w = 0; w < (peak >= 0 ? 2 : 1); w++) {
            int32_t at = walks[w];
            int walked = 0, expected = 0;
            for (int i = 0; i < n; i++) {
                bool live = !m[i].persistent && m[i].used && m[i].first <= at && at <= m[i].last;
                expected += m[i].bytes > 0 && (at < 0 || live);
            }
            arena_handle prev = ARENA_HANDLE_NONE, h = ARENA_HANDLE_NONE;
            while ((h = arena_next_largest(a, at, h)) != ARENA_HANDLE_NONE) {
                bool ordered = prev == ARENA_HANDLE_NONE || m[h].bytes < m[prev].bytes ||
                               (m[h].bytes == m[prev].bytes && h > prev);
                CHECK(ordered && walked < n, "plan %d op %d: region %u after %u", plan, at, h,
                      prev);
                if (!ordered || ++walked > n) break;
                prev = h;
            }
            CHECK(walked == expected, "plan %d op %d: walked %d regions, expected %d", plan, at,
                  walked, expected);
        }
        if (peak >= 0) {
            uint64_t by_category = 0;
            for (int c = 0; c < ARENA_CAT_COUNT; c++) {
                by_category += arena_live_bytes(a, peak, (arena_category)c);
            }
            CHECK(by_category == bound, "plan %d: %" PRIu64 " bytes live by category at the "
                  "peak, lower bound %" PRIu64, plan, by_category, bound);
        }
        check_packed(a);
    }
    // Every order wins some plans, so the model checks each one's packing, not just the first.
    CHECK(rules[0] > 0 && rules[1] > 0 && rules[2] > 0, "plans packed in each order: %d %d %d",
          rules[0], rules[1], rules[2]);
    free(m);
    free(a);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// capacity-sized plans pack fast

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_pack_2048_fast(void) {
    test_begin("pack_2048_fast");
    model_region *m = malloc(sizeof(model_region) * TEST_REGIONS);
    arena *a = arena_alloc();
    rng_state = 2048;
    arena_start(a, ARENA_KIND_DEVICE, "big");
    random_plan(a, m, TEST_REGIONS, 200);
    double start = seconds_now();
    arena_pack(a);
    double seconds = seconds_now() - start;
    // The limit is generous: a budget for start-up, not a benchmark.
    CHECK(seconds < 0.25, "packing 2048 random regions took %.3f s", seconds);
    check_packed(a);

    // Worst case for first fit: every region persistent and equal, so each walks all before it.
    arena_start(a, ARENA_KIND_DEVICE, "stack");
    char name[32];
    for (int i = 0; i < TEST_REGIONS; i++) {
        snprintf(name, sizeof name, "p%d", i);
        reserve(a, name, 1000, 1, ARENA_CAT_MASTER, ARENA_LIFETIME_PERSISTENT, 0);
    }
    start = seconds_now();
    arena_pack(a);
    seconds = seconds_now() - start;
    CHECK(seconds < 0.25, "packing 2048 persistent regions took %.3f s", seconds);
    CHECK_OFFSET(a, TEST_REGIONS - 1, (uint64_t)1024 * (TEST_REGIONS - 1));
    check_packed(a);
    free(m);
    free(a);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// the memory map of a small realistic plan, printed for the docs

// A 2-layer MLP, 784 -> 512 -> 10, batch 64: FP8 (e4m3) weights with per-tensor scaling, BF16
// activations, FP32 master weights, gradients and Adam state. Ops of one training step:
//   0 fc1.forward   (x.fp8, fc1.w -> h1)      4 fc2.backward  (dlogits, a1 -> da1, fc2.w.grad)
//   1 gelu.forward  (h1 -> a1)                5 gelu.backward (da1, h1 -> dh1)
//   2 fc2.forward   (a1, fc2.w -> logits)     6 fc1.backward  (dh1, x.fp8 -> fc1.w.grad)
//   3 loss          (logits, labels -> dlogits)  7 adam        (grads -> master, m, v, weights)
static void mlp_plan(arena *a) {
    const int32_t P = ARENA_LIFETIME_PERSISTENT;
    reserve(a, "fc1.w.fp8", 784 * 512, 256, ARENA_CAT_WEIGHTS, P, 0);
    reserve(a, "fc2.w.fp8", 512 * 10, 256, ARENA_CAT_WEIGHTS, P, 0);
    reserve(a, "fc1.w.master", 784 * 512 * 4, 256, ARENA_CAT_MASTER, P, 0);
    reserve(a, "fc2.w.master", 512 * 10 * 4, 256, ARENA_CAT_MASTER, P, 0);
    reserve(a, "fc1.w.adam_m", 784 * 512 * 4, 256, ARENA_CAT_OPTIM, P, 0);
    reserve(a, "fc1.w.adam_v", 784 * 512 * 4, 256, ARENA_CAT_OPTIM, P, 0);
    reserve(a, "fc2.w.adam_m", 512 * 10 * 4, 256, ARENA_CAT_OPTIM, P, 0);
    reserve(a, "fc2.w.adam_v", 512 * 10 * 4, 256, ARENA_CAT_OPTIM, P, 0);
    // amax history of 16 steps for 3 roles (x, w, grad) plus the scales, FP32.
    reserve(a, "fc1.scaling", (16 + 1) * 3 * 4, 256, ARENA_CAT_SCALING, P, 0);
    reserve(a, "fc2.scaling", (16 + 1) * 3 * 4, 256, ARENA_CAT_SCALING, P, 0);
    reserve(a, "fc1.w.grad", 784 * 512 * 4, 256, ARENA_CAT_GRADS, 6, 7);
    reserve(a, "fc2.w.grad", 512 * 10 * 4, 256, ARENA_CAT_GRADS, 4, 7);
    reserve(a, "batch.x", 64 * 784 * 2, 256, ARENA_CAT_STAGING, 0, 0);
    reserve(a, "batch.labels", 64 * 4, 256, ARENA_CAT_STAGING, 3, 3);
    reserve(a, "step.stats", 64, 256, ARENA_CAT_STAGING, P, 0);
    reserve(a, "x.fp8", 64 * 784, 256, ARENA_CAT_ACTIVATIONS, 0, 6);
    reserve(a, "h1", 64 * 512 * 2, 256, ARENA_CAT_ACTIVATIONS, 0, 5);
    reserve(a, "a1", 64 * 512 * 2, 256, ARENA_CAT_ACTIVATIONS, 1, 4);
    reserve(a, "logits", 64 * 10 * 4, 256, ARENA_CAT_ACTIVATIONS, 2, 3);
    reserve(a, "dlogits", 64 * 10 * 4, 256, ARENA_CAT_ACTIVATIONS, 3, 4);
    reserve(a, "da1", 64 * 512 * 2, 256, ARENA_CAT_ACTIVATIONS, 4, 5);
    reserve(a, "dh1", 64 * 512 * 2, 256, ARENA_CAT_ACTIVATIONS, 5, 6);
    reserve(a, "gemm.workspace", 256 * 1024, 256, ARENA_CAT_WORKSPACE, 0, 6);
}

static void test_mlp_memory_map(void) {
    test_begin("mlp_memory_map");
    arena *a = arena_new(ARENA_KIND_DEVICE, "device");
    mlp_plan(a);
    arena_pack(a);
    check_packed(a);
    // Exact, so that a change in packing shows in review. The lower bound is 7289304.
    CHECK(a->bytes_total == 7289600, "bytes_total %" PRIu64, a->bytes_total);
    char *map = print_to_string(a);
    for (char *line = strtok(map, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        printf("  %s\n", line);
    }
    free(map);

    // Determinism: a second plan packs to the same offsets.
    arena *b = arena_new(ARENA_KIND_DEVICE, "device");
    mlp_plan(b);
    arena_pack(b);
    CHECK(a->region_count == b->region_count && a->bytes_total == b->bytes_total &&
              memcmp(a->regions, b->regions, a->region_count * sizeof(arena_region)) == 0,
          "two packings of one plan differ");
    free(b);
    free(a);
    test_end();
}

int main(void) {
    test_persistent_and_transient_share();
    test_transient_only_share();
    test_pack_gap();
    test_alignment_fills_gap();
    test_device_raises_alignment();
    test_zero_bytes_and_unused();
    test_extend();
    test_parts();
    test_errors();
    test_counting();
    test_phase_asserts();
    test_bind();
    test_check_finds_faults();
    test_print();
    test_random_against_model();
    test_pack_2048_fast();
    test_mlp_memory_map();
    return test_exit_code();
}
