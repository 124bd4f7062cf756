// Foundation tests: Philox known answers, the core kernels' reference twins, programs on the
// reference backend, and (with a GPU) the same program on both backends, eager and graphed,
// compared bit for bit.
#include <math.h>
#include <stddef.h>  // offsetof
#include <stdlib.h>  // setenv
#include <string.h>  // strstr

#include "runtime/backend/capture.h"  // capture_begin, capture_next
#include "runtime/ops/op_core.h"
#include "runtime/run/run.h"  // run_pack_gap
#include "tests/rig.h"
#include "tests/test.h"

static void test_philox_known_answers(void) {
    test_begin("philox4x32_10_known_answers");
    // Known-answer vectors of the Philox4x32-10 specification (Salmon et al., SC'11).
    struct {
        uint32_t ctr[4], key[2], out[4];
    } cases[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qt_philox4 ctr = {{cases[c].ctr[0], cases[c].ctr[1], cases[c].ctr[2], cases[c].ctr[3]}};
        qt_philox4 out = qt_philox4x32_10(ctr, cases[c].key[0], cases[c].key[1]);
        for (int i = 0; i < 4; i++) {
            CHECK(out.v[i] == cases[c].out[i], "case %zu word %d: %08x, expected %08x", c, i,
                  out.v[i], cases[c].out[i]);
        }
    }
    test_end();
}

// Builds: fill uniform f32 (n), fill normal bf16 (n), copy of the f32 fill, checksum of it.
typedef struct core_program {
    arena_handle uniform, normal, copy, partials, sum;
    uint64_t count;
} core_program;

static void core_program_build(rig *r, core_program *c, uint64_t count, uint64_t seed) {
    c->count = count;
    c->uniform = rig_reserve(r, "uniform", count * 4);
    c->normal = rig_reserve(r, "normal", count * 2);
    c->copy = rig_reserve(r, "copy", count * 4);
    c->partials = rig_reserve(r, "partials", 64 * 8);
    c->sum = rig_reserve(r, "sum", 8);
    RIG_OK(op_fill_random(&r->prog, "fill_uniform", rig_ref(r, c->uniform, 0), count,
                          QT_DTYPE_F32, QT_FILL_UNIFORM, seed, 7, -2.0f, 3.0f));
    RIG_OK(op_fill_random(&r->prog, "fill_normal", rig_ref(r, c->normal, 0), count,
                          QT_DTYPE_BF16, QT_FILL_NORMAL, seed, 0, 1.0f, 0.5f));
    RIG_OK(op_copy(&r->prog, "copy", rig_ref(r, c->copy, 0), rig_ref(r, c->uniform, 0),
                   count * 4));
    // Checksum over an odd byte count, so the zero-padded tail word is exercised.
    RIG_OK(op_checksum(&r->prog, "checksum", rig_ref(r, c->uniform, 0), count * 4 - 3,
                       rig_ref(r, c->partials, 0), 64, rig_ref(r, c->sum, 0)));
    rig_bind(r);
}

typedef struct core_result {
    float *uniform;
    uint16_t *normal;
    float *copy;
    uint64_t sum;
} core_result;

static void core_result_read(rig *r, const core_program *c, core_result *out) {
    out->uniform = malloc(c->count * 4);
    out->normal = malloc(c->count * 2);
    out->copy = malloc(c->count * 4);
    RIG_OK(backend_read(&r->be, out->uniform, rig_ref(r, c->uniform, 0), c->count * 4));
    RIG_OK(backend_read(&r->be, out->normal, rig_ref(r, c->normal, 0), c->count * 2));
    RIG_OK(backend_read(&r->be, out->copy, rig_ref(r, c->copy, 0), c->count * 4));
    RIG_OK(backend_read(&r->be, &out->sum, rig_ref(r, c->sum, 0), 8));
}

static void core_result_free(core_result *res) {
    free(res->uniform);
    free(res->normal);
    free(res->copy);
}

static uint64_t host_checksum(const uint8_t *bytes, uint64_t n_bytes) {
    uint64_t sum = 0;
    for (uint64_t w = 0; w * 8 < n_bytes; w++) {
        uint64_t word = 0;
        for (uint64_t b = w * 8; b < n_bytes && b < w * 8 + 8; b++)
            word |= (uint64_t)bytes[b] << (8 * (b - w * 8));
        sum += qt_checksum_word(word, w);
    }
    return qt_checksum_finish(sum, n_bytes);
}

static rig ref_rig, gpu_rig;

static void test_ref_fill_statistics(void) {
    test_begin("ref_fill_statistics_and_checksum");
    const char *why = NULL;
    rig_open(&ref_rig, BACKEND_REF, &why);
    core_program c;
    core_program_build(&ref_rig, &c, 100003, 42);
    RIG_OK(backend_run(&ref_rig.be, &ref_rig.prog));
    core_result res;
    core_result_read(&ref_rig, &c, &res);
    double sum_u = 0, sum_n = 0, sum_n2 = 0;
    for (uint64_t i = 0; i < c.count; i++) {
        CHECK(res.uniform[i] >= -2.0f && res.uniform[i] < 3.0f, "uniform[%llu] = %g",
              (unsigned long long)i, res.uniform[i]);
        double n = qt_bf16_to_f32(res.normal[i]);
        sum_u += res.uniform[i];
        sum_n += n;
        sum_n2 += n * n;
    }
    double mean_u = sum_u / c.count, mean_n = sum_n / c.count;
    double std_n = sqrt(sum_n2 / c.count - mean_n * mean_n);
    // Bounds: 6 standard errors of the estimates for 1e5 samples (uniform std 5/sqrt(12)).
    CHECK(fabs(mean_u - 0.5) < 6 * 1.443 / sqrt(c.count), "uniform mean %g", mean_u);
    CHECK(fabs(mean_n - 1.0) < 6 * 0.5 / sqrt(c.count), "normal mean %g", mean_n);
    CHECK(fabs(std_n - 0.5) < 0.01, "normal std %g", std_n);
    CHECK(memcmp(res.uniform, res.copy, c.count * 4) == 0, "copy differs");
    // The checksum equals a direct computation over the same bytes.
    CHECK(res.sum == host_checksum((const uint8_t *)res.uniform, c.count * 4 - 3),
          "checksum %016llx", (unsigned long long)res.sum);
    core_result_free(&res);
    rig_close(&ref_rig);
    test_end();
}

static void test_fill_windows_compose(void) {
    test_begin("fill_windows_compose");
    // Element i of a fill is a function of (seed, offset + i) alone: a window starting at 500
    // reproduces the tail of a fill starting at 0.
    for (uint32_t dist = 0; dist < 2; dist++) {
        for (uint64_t i = 500; i < 1000; i++) {
            float whole = qt_fill_value(9, i, dist, 0.0f, 1.0f);
            float window = qt_fill_value(9, 500 + (i - 500), dist, 0.0f, 1.0f);
            CHECK(qt_f32_bits(whole) == qt_f32_bits(window), "dist %u element %llu", dist,
                  (unsigned long long)i);
        }
        CHECK(qt_fill_value(9, 0, dist, 0, 1) != qt_fill_value(10, 0, dist, 0, 1),
              "seed has no effect (dist %u)", dist);
    }
    test_end();
}

// A program holds the ops its table was sized for and refuses one more with the count in the
// message; a counting program (the pass that sizes the runtime's tables) counts any number of
// ops and keeps only the last.
static void test_program_capacity(void) {
    test_begin("program_capacity_and_counting");
    static uint8_t storage[4 * (sizeof(prog_op) + 4)] __attribute__((aligned(64)));
    program p;
    prog_init(&p, "full", 0, storage, 3);
    CHECK(prog_storage_bytes(3) <= sizeof storage, "storage bytes %llu",
          (unsigned long long)prog_storage_bytes(3));
    copy_args args = {0, 0, 0};
    launch_shape shape = op_shape_1d(1, 32);
    uint32_t op = 0;
    for (int i = 0; i < 3; i++) {
        qt_status s = prog_append(&p, KERNEL_COPY, "copy", &shape, &args, sizeof args, &op);
        CHECK(s == QT_OK, "append %d failed", i);
    }
    qt_status s = prog_append(&p, KERNEL_COPY, "one-too-many", &shape, &args, sizeof args, &op);
    CHECK(s == QT_ERR_CAPACITY, "expected QT_ERR_CAPACITY, got %s", qt_status_name(s));
    CHECK(strstr(qt_error_message(), "program 'full' holds 3 ops, the count its plan was sized "
                 "for; cannot add 'one-too-many'") != NULL, "message: %s", qt_error_message());
    program c;
    prog_init(&c, "counting", 7, NULL, 0);
    CHECK(prog_counting(&c) && !prog_counting(&p), "counting");
    for (uint32_t i = 0; i < 10000; i++) {
        args.bytes = i;
        CHECK(prog_append(&c, KERNEL_COPY, "copy", &shape, &args, sizeof args, &op) == QT_OK &&
              op == i, "counting append %u", i);
    }
    CHECK(c.op_count == 10000 && prog_op_index(&c, 9999) == 10006, "count %u", c.op_count);
    copy_args last;
    memcpy(&last, prog_op_at(&c, 9999)->args, sizeof last);
    CHECK(last.bytes == 9999, "the last op is kept: %llu", (unsigned long long)last.bytes);
    test_end();
}

// The ordering rule of a captured graph (prog_ops_conflict): reads of one region commute, a write
// orders its region's users, and regions packed into the same bytes order each other's users.
static void test_program_dependencies(void) {
    test_begin("program_dependencies");
    static program p;
    arena a;
    rig_arena_init(&a, ARENA_KIND_DEVICE, "device");
    rig_prog_init(&p, "deps");
    arena_handle ra, rb, rc, rd;
    CHECK(arena_reserve(&a, "a", 1024, 256, ARENA_CAT_ACTIVATIONS, 0, -1, &ra) == QT_OK, "a");
    CHECK(arena_reserve(&a, "b", 1024, 256, ARENA_CAT_ACTIVATIONS, 0, -1, &rb) == QT_OK, "b");
    CHECK(arena_reserve(&a, "c", 512, 256, ARENA_CAT_WEIGHTS, ARENA_LIFETIME_PERSISTENT, 0,
                        &rc) == QT_OK, "c");
    CHECK(arena_reserve(&a, "d", 512, 256, ARENA_CAT_WORKSPACE, 0, -1, &rd) == QT_OK, "d");
    // op: {reads, writes} as region masks: 1 = a, 2 = b, 4 = c, 8 = d.
    static const uint32_t uses[6][2] = {{0, 1}, {1, 4}, {4, 8}, {4, 0}, {0, 2}, {2, 0}};
    const arena_handle handles[4] = {ra, rb, rc, rd};
    copy_args args = {0, 0, 0};
    launch_shape shape = op_shape_1d(1, 32);
    for (uint32_t i = 0; i < 6; i++) {
        uint32_t op = 0;
        CHECK(prog_append(&p, KERNEL_COPY, "op", &shape, &args, sizeof args, &op) == QT_OK, "op");
        for (uint32_t r = 0; r < 4; r++) {
            prog_ref ref = {&a, handles[r], 0};
            if (uses[i][0] & (1u << r)) {
                CHECK(prog_use(&p, op, PROG_ARGS_FIELD_NONE, ref, PROG_READ) == QT_OK, "use");
            }
            if (uses[i][1] & (1u << r)) {
                CHECK(prog_use(&p, op, PROG_ARGS_FIELD_NONE, ref, PROG_WRITE) == QT_OK, "use");
            }
        }
    }
    arena_pack(&a);
    // a lives over ops 0-1, b over 4-5, d at op 2: the packer puts all three at offset 0, c
    // (persistent) after them.
    uint64_t oa = arena_region_get(&a, ra)->offset, ob = arena_region_get(&a, rb)->offset;
    uint64_t oc = arena_region_get(&a, rc)->offset, od = arena_region_get(&a, rd)->offset;
    CHECK(oa == 0 && ob == 0 && od == 0 && oc == 1024, "offsets a %llu b %llu c %llu d %llu",
          (unsigned long long)oa, (unsigned long long)ob, (unsigned long long)oc,
          (unsigned long long)od);
    const prog_op *o = p.ops;
    CHECK(prog_ops_conflict(&o[0], &o[1]), "write a, then read a");
    CHECK(prog_ops_conflict(&o[1], &o[2]), "write c, then read c");
    CHECK(!prog_ops_conflict(&o[2], &o[3]), "two reads of c (and d, elsewhere) commute");
    CHECK(prog_ops_conflict(&o[1], &o[4]), "b is packed over a: writing b waits for a's reader");
    CHECK(prog_ops_conflict(&o[2], &o[5]), "d shares bytes with b");
    CHECK(!prog_ops_conflict(&o[3], &o[4]), "c and b are apart");
    // Chain 0 -> 1 -> 2 -> 4 -> 5; op 3 runs beside it.
    CHECK(prog_critical_path(&p) == 5, "critical path %u", prog_critical_path(&p));
    // By the buffers alone (b's and d's reuse of a's bytes aside): 0 -> 1 -> 2 (a, c) and
    // 4 -> 5 (b).
    CHECK(prog_critical_path_buffers(&p) == 3, "critical path by buffers %u",
          prog_critical_path_buffers(&p));
    test_end();
}

// A use declared on an earlier op once later ops are built (prog_use_late) is that op's like any
// other: it widens the region's lifetime back to the op, orders the op before the region's later
// users, and its address lands in the op's args, as does a value set later (prog_args_set). A
// counting program keeps the last op only: the late use is checked, the write to a gone op is
// nothing, and the last op takes both.
static void test_program_late_use(void) {
    test_begin("program_late_use");
    static program p;
    arena a;
    rig_arena_init(&a, ARENA_KIND_HOST, "host");
    rig_prog_init(&p, "late");
    arena_handle src, dst;
    CHECK(arena_reserve(&a, "src", 256, 256, ARENA_CAT_ACTIVATIONS, 0, -1, &src) == QT_OK &&
              arena_reserve(&a, "dst", 256, 256, ARENA_CAT_ACTIVATIONS, 0, -1, &dst) == QT_OK,
          "reserve");
    copy_args args = {0, 0, 0};
    launch_shape shape = op_shape_1d(1, 32);
    uint32_t first = 0, second = 0;
    RIG_OK(prog_append(&p, KERNEL_COPY, "first", &shape, &args, sizeof args, &first));
    RIG_OK(prog_append(&p, KERNEL_COPY, "second", &shape, &args, sizeof args, &second));
    RIG_OK(prog_use(&p, second, offsetof(copy_args, src), (prog_ref){&a, dst, 0}, PROG_READ));
    RIG_OK(prog_use_late(&p, first, offsetof(copy_args, dst), (prog_ref){&a, dst, 0},
                         PROG_WRITE));
    uint64_t bytes = 256;
    prog_args_set(&p, first, offsetof(copy_args, bytes), &bytes, sizeof bytes);
    const arena_region *r = arena_region_get(&a, dst);
    CHECK(r->first_op == 0 && r->last_op == 1, "dst lives over ops %d..%d", r->first_op,
          r->last_op);
    CHECK(p.ops[0].ref_count == 1 && p.ops[0].refs[0].access == PROG_WRITE, "first: %u refs",
          p.ops[0].ref_count);
    arena_pack(&a);
    CHECK(prog_ops_conflict(&p.ops[0], &p.ops[1]), "the late write orders the later reader");
    copy_args got;
    memcpy(&got, p.ops[0].args, sizeof got);
    CHECK(got.bytes == 256, "args set later: %llu", (unsigned long long)got.bytes);

    program c;
    arena counting;
    arena_init(&counting, ARENA_KIND_HOST, "host", NULL, 0);
    prog_init(&c, "counting", 0, NULL, 0);
    CHECK(arena_reserve(&counting, "dst", 256, 256, ARENA_CAT_ACTIVATIONS, 0, -1, &dst) == QT_OK,
          "reserve");
    RIG_OK(prog_append(&c, KERNEL_COPY, "first", &shape, &args, sizeof args, &first));
    RIG_OK(prog_append(&c, KERNEL_COPY, "second", &shape, &args, sizeof args, &second));
    RIG_OK(prog_use_late(&c, first, offsetof(copy_args, dst), (prog_ref){&counting, dst, 0},
                         PROG_WRITE));
    prog_args_set(&c, first, offsetof(copy_args, bytes), &bytes, sizeof bytes);
    CHECK(prog_op_at(&c, second)->ref_count == 0, "the kept op has no use of the gone one");
    RIG_OK(prog_use_late(&c, second, offsetof(copy_args, dst), (prog_ref){&counting, dst, 0},
                         PROG_WRITE));
    prog_args_set(&c, second, offsetof(copy_args, bytes), &bytes, sizeof bytes);
    memcpy(&got, prog_op_at(&c, second)->args, sizeof got);
    CHECK(prog_op_at(&c, second)->ref_count == 1 && got.bytes == 256, "the last op takes both");
    test_end();
}

// The capture plan (runtime/backend/capture.h) over random programs: replaying its steps as the
// graph would (stream order, and each wait on its mark's op or the stream's last op), every pair
// of conflicting ops is ordered; a wait through a mark targets the latest conflicting op of its
// stream, and the mark then follows that op. A program of many independent readers of one op
// runs out of marks, and the fallback keeps the order.
enum { CAPTURE_TEST_OPS = 400, CAPTURE_TEST_WORDS = CAPTURE_TEST_OPS / 64 + 1 };

static uint64_t capture_test_next(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

// exhausts: the program waits for more ops at once than there are marks, so some waits must fall
// back to a stream's last op (the fallback path is taken, and still orders every conflict).
// Whether op j must follow op i: their regions conflict, or j is a GEMM that runs alone (with
// margin_beside) and i a collective before it.
static bool capture_test_needs(const capture_plan *c, uint32_t i, uint32_t j) {
    const program *p = c->p;
    return prog_ops_conflict(&p->ops[i], &p->ops[j]) ||
           (capture_gemm_alone(c, j) && capture_collective(&p->ops[i]));
}

// margin_beside: capture_begin's; each GEMM that then runs alone (on every SM) must follow every
// collective before it and come before every collective after it, so that none can run beside
// it, and only GEMMs between the first and the last collective leave the margin.
static void capture_check(const program *p, const char *what, bool exhausts, bool margin_beside) {
    static uint64_t reach[CAPTURE_TEST_OPS][CAPTURE_TEST_WORDS];  // reach[j]: ops before j
    int32_t last[CAPTURE_STREAMS], mark_op[CAPTURE_MARKS];
    for (int s = 0; s < CAPTURE_STREAMS; s++) last[s] = CAPTURE_NONE;
    for (int k = 0; k < CAPTURE_MARKS; k++) mark_op[k] = CAPTURE_NONE;
    capture_plan c;
    capture_begin(&c, p, margin_beside);
    uint32_t marked_waits = 0, fallbacks = 0, collectives = 0, misplaced = 0;
    uint32_t beside = 0, beside_misplaced = 0;
    for (uint32_t j = 0; j < p->op_count; j++) {
        capture_step st;
        capture_next(&c, j, &st);
        // Collectives, where the program has any, on the last stream, and nothing else there.
        bool collective = p->ops[j].kernel == KERNEL_DP_COLLECTIVE;
        collectives += collective;
        misplaced += collective != (st.stream == CAPTURE_STREAMS - 1) &&
                     c.collective_stream != CAPTURE_NONE;
        // Ops off the main line on their own stream (the last but the collectives'), and
        // nothing else there.
        beside += p->ops[j].beside;
        beside_misplaced += p->ops[j].beside != (st.stream == c.beside_stream);
        memset(reach[j], 0, sizeof reach[j]);
        int32_t before[CAPTURE_STREAMS + 1];
        uint32_t n = 0;
        if (last[st.stream] != CAPTURE_NONE) before[n++] = last[st.stream];
        for (uint32_t w = 0; w < st.wait_count; w++) {
            const capture_wait *wt = &st.waits[w];
            int32_t target = wt->mark != CAPTURE_NONE ? mark_op[wt->mark] : last[wt->stream];
            if (wt->mark != CAPTURE_NONE) {
                marked_waits++;
                CHECK(target == wt->op, "%s: op %u waits through mark %d, which follows op %d, "
                      "not op %d", what, j, wt->mark, target, wt->op);
                bool latest = true;
                for (uint32_t i = (uint32_t)wt->op + 1; i < j; i++) {
                    latest &= !(c.stream_of[i] == (uint32_t)wt->stream &&
                                capture_test_needs(&c, i, j));
                }
                CHECK(latest && capture_test_needs(&c, (uint32_t)wt->op, j),
                      "%s: op %u waits for op %d, not the latest op it needs there", what, j,
                      wt->op);
            } else {
                fallbacks++;
                CHECK(target >= wt->op, "%s: op %u falls back to op %d, before op %d", what, j,
                      target, wt->op);
            }
            if (target != CAPTURE_NONE) before[n++] = target;
        }
        for (uint32_t b = 0; b < n; b++) {
            for (uint32_t w = 0; w < CAPTURE_TEST_WORDS; w++) reach[j][w] |= reach[before[b]][w];
            reach[j][before[b] / 64] |= 1ull << (before[b] % 64);
        }
        last[st.stream] = (int32_t)j;
        if (st.mark != CAPTURE_NONE) mark_op[st.mark] = (int32_t)j;
    }
    uint64_t unordered = 0;
    for (uint32_t j = 0; j < p->op_count; j++) {
        for (uint32_t i = 0; i < j; i++) {
            if (!prog_ops_conflict(&p->ops[i], &p->ops[j])) continue;
            if (reach[j][i / 64] >> (i % 64) & 1) continue;
            if (unordered++ < 4) CHECK(false, "%s: ops %u and %u conflict, unordered", what, i, j);
        }
    }
    CHECK(unordered == 0, "%s: %llu conflicting pairs unordered", what,
          (unsigned long long)unordered);
    uint32_t gemms = 0, alone = 0, met = 0, margins = 0;
    for (uint32_t j = 0; j < p->op_count; j++) {
        bool window_j = (int32_t)j > c.first_collective && (int32_t)j < c.last_collective;
        margins += capture_leaves_margin(&c, j) != (window_j && !capture_gemm_alone(&c, j));
        if (!window_j || !capture_wide_gemm(&p->ops[j])) continue;
        gemms++;
        if (!capture_gemm_alone(&c, j)) continue;
        alone++;
        for (uint32_t k = 0; k < p->op_count; k++) {
            if (k == j || !capture_collective(&p->ops[k])) continue;
            bool ordered = k < j ? (reach[j][k / 64] >> (k % 64) & 1)
                                 : (reach[k][j / 64] >> (j % 64) & 1);
            if (!ordered && met++ < 4) {
                CHECK(false, "%s: collective %u may run beside GEMM %u, which runs alone", what,
                      k, j);
            }
        }
    }
    CHECK(met == 0 && margins == 0, "%s: %u collectives unordered with a GEMM that runs alone, "
          "%u ops leave the margin against the rule", what, met, margins);
    CHECK(!margin_beside || gemms == 0 || alone > 0, "%s: none of %u GEMMs runs alone", what,
          gemms);
    CHECK(margin_beside || alone == 0, "%s: %u GEMMs run alone without margin_beside", what,
          alone);
    if (margin_beside) {
        printf("  %s: %u GEMMs between the collectives, %u of them alone\n", what, gemms, alone);
    }
    int32_t first_collective = CAPTURE_NONE, last_collective = CAPTURE_NONE;
    for (uint32_t j = 0; j < p->op_count; j++) {
        if (p->ops[j].kernel != KERNEL_DP_COLLECTIVE) continue;
        if (first_collective == CAPTURE_NONE) first_collective = (int32_t)j;
        last_collective = (int32_t)j;
    }
    CHECK(c.first_collective == first_collective && c.last_collective == last_collective,
          "%s: the plan's collectives span ops %d..%d, the program's %d..%d", what,
          c.first_collective, c.last_collective, first_collective, last_collective);
    CHECK(misplaced == 0 && (collectives == 0) == (c.collective_stream == CAPTURE_NONE),
          "%s: %u of %u collectives or other ops on the wrong stream (collective stream %d)",
          what, misplaced, collectives, c.collective_stream);
    int32_t beside_stream = c.collective_stream != CAPTURE_NONE ? CAPTURE_STREAMS - 2
                                                                : CAPTURE_STREAMS - 1;
    CHECK(beside_misplaced == 0 &&
              c.beside_stream == (beside ? beside_stream : CAPTURE_NONE),
          "%s: %u of %u ops beside or other ops on the wrong stream (beside stream %d)", what,
          beside_misplaced, beside, c.beside_stream);
    CHECK(!exhausts || fallbacks > 0, "%s: no wait fell back to a stream's last op", what);
    CHECK((fallbacks > 0) == (c.marks_needed > CAPTURE_MARKS),
          "%s: %u waits fell back, %u marks needed of %u", what, fallbacks, c.marks_needed,
          CAPTURE_MARKS);
    printf("  %s: %u ops, %u waits through marks, %u on a stream's last op\n", what,
           p->op_count, marked_waits, fallbacks);
}

// ops random ops over `regions` regions, each reading up to two and writing one (fan > 0: the
// first op writes region 0 and the next fan ops each read it and write their own region;
// fan UINT32_MAX: ops/2 writers of their own regions, then one op after each of them, in order,
// so that more ops are waited for at once than there are marks).
// collective_every > 0: every such op (from the first) is a collective (its args are never
// read: the plan looks at the kernel and the regions only). beside_every > 0: every such op
// (from the second) is off the main line (prog_op.beside).
static void capture_program(program *p, arena *a, uint32_t ops, uint32_t regions, uint32_t fan,
                            uint64_t seed, uint32_t collective_every, uint32_t beside_every,
                            uint32_t gemm_every) {
    rig_arena_init(a, ARENA_KIND_DEVICE, "device");
    rig_prog_init(p, "capture");
    arena_handle h[64];
    QT_ASSERT(regions <= 64 && ops <= CAPTURE_TEST_OPS);
    for (uint32_t r = 0; r < regions; r++) {
        char name[16];
        snprintf(name, sizeof name, "r%u", r);
        CHECK(arena_reserve(a, name, 256, 256, ARENA_CAT_WORKSPACE, ARENA_LIFETIME_PERSISTENT, 0,
                            &h[r]) == QT_OK, "reserve");
    }
    copy_args args = {0, 0, 0};
    static const dp_collective_args collective_args;
    launch_shape shape = op_shape_1d(1, 32);
    uint64_t state = seed;
    uint32_t gemm_wrote = UINT32_MAX;  // the region the last GEMM wrote
    for (uint32_t i = 0; i < ops; i++) {
        uint32_t op = 0;
        if (collective_every && i % collective_every == 0) {
            CHECK(prog_append(p, KERNEL_DP_COLLECTIVE, "collective", &shape, &collective_args,
                              sizeof collective_args, &op) == QT_OK, "collective");
        } else if (gemm_every && i % gemm_every == 2) {
            static const gemm_args gemm;  // never read: the plan looks at kernel and regions
            CHECK(prog_append(p, KERNEL_GEMM_FP8_PORTABLE, "gemm", &shape, &gemm, sizeof gemm,
                              &op) == QT_OK, "gemm");
        } else {
            CHECK(prog_append(p, KERNEL_COPY, "op", &shape, &args, sizeof args, &op) == QT_OK,
                  "op");
            if (beside_every && i % beside_every == 1) prog_set_beside(p, op);
        }
        uint32_t reads[2] = {(uint32_t)(capture_test_next(&state) % regions),
                             (uint32_t)(capture_test_next(&state) % regions)};
        uint32_t write = (uint32_t)(capture_test_next(&state) % regions);
        if (fan == UINT32_MAX) {  // op i < ops/2 writes region i, op ops/2 + i rewrites it
            reads[0] = reads[1] = write = i % (ops / 2);
        } else if (fan && i <= fan) {
            reads[0] = reads[1] = 0;
            write = i == 0 ? 0 : 1 + (i - 1) % (regions - 1);
        }
        bool collective = collective_every && i % collective_every == 0;
        if (collective && gemm_every && gemm_wrote != UINT32_MAX) reads[0] = gemm_wrote;
        if (!collective && gemm_every && i % gemm_every == 2) gemm_wrote = write;
        for (int r = 0; r < 2; r++) {
            prog_ref ref = {a, h[reads[r]], 0};
            CHECK(prog_use(p, op, PROG_ARGS_FIELD_NONE, ref, PROG_READ) == QT_OK, "read");
        }
        prog_ref out = {a, h[write], 0};
        CHECK(prog_use(p, op, PROG_ARGS_FIELD_NONE, out, PROG_WRITE) == QT_OK, "write");
    }
    arena_pack(a);
}

static void test_capture_plan(void) {
    test_begin("capture_plan_orders_every_conflict");
    static program p;
    static arena a;
    static const struct {
        uint32_t ops, regions, fan;
        uint64_t seed;
        const char *what;
        uint32_t collective_every, beside_every, gemm_every;
    } cases[] = {
        {60, 6, 0, 1, "60 ops over 6 regions", 0, 0, 0},
        {400, 24, 0, 2, "400 ops over 24 regions", 0, 0, 0},
        {400, 64, 0, 3, "400 ops over 64 regions", 0, 0, 0},
        {200, 64, 63, 4, "one op read by 63", 0, 0, 0},
        {128, 64, UINT32_MAX, 5, "64 writers, then 64 ops after them", 0, 0, 0},
        {400, 24, 0, 6, "400 ops over 24 regions, every 7th a collective", 7, 0, 0},
        {128, 64, UINT32_MAX, 7, "64 writers, then 64 ops after them, every 5th a collective", 5,
         0, 0},
        {400, 24, 0, 8, "400 ops over 24 regions, every 6th beside", 0, 6, 0},
        {400, 24, 0, 9, "400 ops over 24 regions, every 7th a collective, every 4th beside", 7,
         4, 0},
        {400, 64, 0, 10, "400 ops over 64 regions, every 9th a collective (reading the last "
         "GEMM's output), every 5th a GEMM", 9, 0, 5},
        {128, 64, UINT32_MAX, 11, "64 writers, then 64 ops after them, every 3rd a GEMM, the "
         "last op a collective (reading the last GEMM's output)", 127, 0, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        capture_program(&p, &a, cases[i].ops, cases[i].regions, cases[i].fan, cases[i].seed,
                        cases[i].collective_every, cases[i].beside_every, cases[i].gemm_every);
        capture_check(&p, cases[i].what, cases[i].fan == UINT32_MAX, false);
        if (cases[i].gemm_every) capture_check(&p, cases[i].what, cases[i].fan == UINT32_MAX, true);
    }
    test_end();
}

static void compare_results(const core_result *a, const core_result *b, uint64_t count,
                            const char *what) {
    uint64_t mismatches = 0;
    for (uint64_t i = 0; i < count; i++) {
        if (qt_f32_bits(a->uniform[i]) != qt_f32_bits(b->uniform[i]) ||
            a->normal[i] != b->normal[i] ||
            qt_f32_bits(a->copy[i]) != qt_f32_bits(b->copy[i])) {
            if (mismatches++ < 4) {
                CHECK(false, "%s: element %llu: uniform %08x vs %08x, normal %04x vs %04x", what,
                      (unsigned long long)i, qt_f32_bits(a->uniform[i]),
                      qt_f32_bits(b->uniform[i]), a->normal[i], b->normal[i]);
            }
        }
    }
    CHECK(mismatches == 0, "%s: %llu mismatching elements", what, (unsigned long long)mismatches);
    CHECK(a->sum == b->sum, "%s: checksum %016llx vs %016llx", what,
          (unsigned long long)a->sum, (unsigned long long)b->sum);
}

// backend_timeline over the core program (fill_uniform, fill_normal, copy and the checksum's
// ops): every span inside the replay, an op that reads fill_uniform's output starting after its
// end, fill_normal (which shares no region with it) on another stream, a window of ops placed
// as in the whole program's timeline, and the replays leaving the eager run's bits.
static void timeline_check(rig *r, const core_program *c, const core_result *eager) {
    test_begin("gpu_core_timeline_orders_dependent_ops");
    const program *p = &r->prog;
    backend_op_span all[BACKEND_TIMELINE_OPS], window[2];
    QT_ASSERT(p->op_count >= 4 && p->op_count <= BACKEND_TIMELINE_OPS);
    RIG_OK(backend_timeline(&r->be, p, 0, p->op_count, BACKEND_TIMELINE_REPS, all));
    for (uint32_t i = 0; i < p->op_count; i++) {
        CHECK(all[i].start_us >= 0.0f && all[i].end_us >= all[i].start_us &&
                  all[i].stream < CAPTURE_STREAMS,
              "op %u (%s): start %.2f us, end %.2f us, stream %u", i, p->ops[i].name,
              (double)all[i].start_us, (double)all[i].end_us, all[i].stream);
        if (i == 0 || !prog_ops_conflict(&p->ops[0], &p->ops[i])) continue;
        CHECK(all[i].start_us >= all[0].end_us, "op %u (%s) starts at %.2f us, before %s ends "
              "at %.2f us", i, p->ops[i].name, (double)all[i].start_us, p->ops[0].name,
              (double)all[0].end_us);
    }
    CHECK(!prog_ops_conflict(&p->ops[0], &p->ops[1]) && all[1].stream != all[0].stream,
          "%s and %s on one stream (%u)", p->ops[0].name, p->ops[1].name, all[0].stream);
    RIG_OK(backend_timeline(&r->be, p, 1, 2, 3, window));
    CHECK(window[0].stream == all[1].stream && window[1].stream == all[2].stream,
          "a window's streams %u %u, the whole program's %u %u", window[0].stream,
          window[1].stream, all[1].stream, all[2].stream);
    core_result after;
    core_result_read(r, c, &after);
    compare_results(&after, eager, c->count, "after the timeline's replays");
    core_result_free(&after);
    test_end();
}

static void test_gpu_matches_ref(void) {
    const char *why = NULL;
    if (!rig_open(&gpu_rig, BACKEND_GPU, &why)) {
        test_skip("gpu_core_matches_ref_bitwise", why);
        test_skip("gpu_core_graph_matches_eager", why);
        test_skip("gpu_core_timeline_orders_dependent_ops", why);
        return;
    }
    test_begin("gpu_core_matches_ref_bitwise");
    const uint64_t count = 1000003;  // prime: the grid-stride tails are uneven
    core_program cg, cr;
    core_program_build(&gpu_rig, &cg, count, 1234);
    rig_open(&ref_rig, BACKEND_REF, &why);
    core_program_build(&ref_rig, &cr, count, 1234);
    RIG_OK(backend_run(&gpu_rig.be, &gpu_rig.prog));
    RIG_OK(backend_run(&ref_rig.be, &ref_rig.prog));
    core_result eager, ref;
    core_result_read(&gpu_rig, &cg, &eager);
    core_result_read(&ref_rig, &cr, &ref);
    compare_results(&eager, &ref, count, "gpu eager vs ref");
    test_end();

    test_begin("gpu_core_graph_matches_eager");
    // Zero the outputs, then replay the captured graph twice: same bits as the eager run.
    uint8_t *zeros = calloc(count, 4);
    RIG_OK(backend_write(&gpu_rig.be, rig_ref(&gpu_rig, cg.uniform, 0), zeros, count * 4));
    RIG_OK(backend_write(&gpu_rig.be, rig_ref(&gpu_rig, cg.copy, 0), zeros, count * 4));
    free(zeros);
    backend_graph graph;
    RIG_OK(backend_capture(&gpu_rig.be, &gpu_rig.prog, &graph));
    // A replay loop makes no synchronizing driver call; only the explicit finish does.
    const driver_syncs *syncs = &gpu_rig.be.syncs;
    uint64_t syncs_before = driver_sync_total(syncs);
    for (int replay = 0; replay < 100; replay++) RIG_OK(backend_launch(&gpu_rig.be, &graph));
    CHECK(driver_sync_total(syncs) == syncs_before, "%llu synchronizing calls in a replay loop",
          (unsigned long long)(driver_sync_total(syncs) - syncs_before));
    RIG_OK(backend_finish(&gpu_rig.be));
    CHECK(driver_sync_total(syncs) == syncs_before + 1, "finish counted once");
    for (int replay = 0; replay < 2; replay++) {
        RIG_OK(backend_launch(&gpu_rig.be, &graph));
        core_result graphed;
        core_result_read(&gpu_rig, &cg, &graphed);
        compare_results(&graphed, &eager, count, replay ? "second replay" : "first replay");
        core_result_free(&graphed);
    }
    backend_graph_destroy(&gpu_rig.be, &graph);
    test_end();

    timeline_check(&gpu_rig, &cg, &eager);
    core_result_free(&eager);
    core_result_free(&ref);
    rig_close(&gpu_rig);
    rig_close(&ref_rig);
}

// op_fill_random_rows: value (r, c) of a rows x cols fill into rows `stride` apart is element
// r * cols + c of the contiguous fill with the same seed and offset, and the columns past cols
// keep their bytes (the init program fills padded weights this way, one op per weight).
#define ROWS_R 37
#define ROWS_C 21
#define ROWS_S 32

static void rows_build(rig *r, arena_handle *strided, arena_handle *flat, arena_handle *bf16) {
    *strided = rig_reserve(r, "strided", ROWS_R * ROWS_S * 4);
    *flat = rig_reserve(r, "flat", ROWS_R * ROWS_C * 4);
    *bf16 = rig_reserve(r, "strided_bf16", ROWS_R * ROWS_S * 2);
    RIG_OK(op_fill_random_rows(&r->prog, "strided", rig_ref(r, *strided, 0), ROWS_R, ROWS_C,
                               ROWS_S, QT_DTYPE_F32, QT_FILL_NORMAL, 99, 5, 0.0f, 0.5f));
    RIG_OK(op_fill_random(&r->prog, "flat", rig_ref(r, *flat, 0), ROWS_R * ROWS_C, QT_DTYPE_F32,
                          QT_FILL_NORMAL, 99, 5, 0.0f, 0.5f));
    RIG_OK(op_fill_random_rows(&r->prog, "strided_bf16", rig_ref(r, *bf16, 0), ROWS_R, ROWS_C,
                               ROWS_S, QT_DTYPE_BF16, QT_FILL_UNIFORM, 3, 0, -1.0f, 1.0f));
    rig_bind(r);
}

static void rows_read(rig *r, const arena_handle h[3], float *strided, float *flat,
                      uint16_t *bf16) {
    RIG_OK(backend_read(&r->be, strided, rig_ref(r, h[0], 0), ROWS_R * ROWS_S * 4));
    RIG_OK(backend_read(&r->be, flat, rig_ref(r, h[1], 0), ROWS_R * ROWS_C * 4));
    RIG_OK(backend_read(&r->be, bf16, rig_ref(r, h[2], 0), ROWS_R * ROWS_S * 2));
}

static void test_fill_rows(void) {
    static float strided[ROWS_R * ROWS_S], flat[ROWS_R * ROWS_C], gs[ROWS_R * ROWS_S];
    static float gf[ROWS_R * ROWS_C];
    static uint16_t bf16[ROWS_R * ROWS_S], gb[ROWS_R * ROWS_S];
    static rig r;
    const char *why = NULL;
    test_begin("fill_rows_is_the_contiguous_fill_row_by_row");
    arena_handle h[3];
    rig_open(&r, BACKEND_REF, &why);
    rows_build(&r, &h[0], &h[1], &h[2]);
    RIG_OK(backend_run(&r.be, &r.prog));
    rows_read(&r, h, strided, flat, bf16);
    rig_close(&r);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < ROWS_R; i++) {
        for (uint32_t c = 0; c < ROWS_S; c++) {
            uint32_t got = qt_f32_bits(strided[i * ROWS_S + c]);
            uint32_t want = c < ROWS_C ? qt_f32_bits(flat[i * ROWS_C + c]) : 0u;
            uint16_t b = bf16[i * ROWS_S + c];
            bad += got != want || (c >= ROWS_C && b != 0) ||
                   (c < ROWS_C && (qt_bf16_to_f32(b) < -1.0f || qt_bf16_to_f32(b) > 1.0f));
        }
    }
    CHECK(bad == 0, "%u elements differ from the contiguous fill or touch the padding", bad);
    test_end();
    if (!rig_open(&r, BACKEND_GPU, &why)) {
        test_skip("gpu_fill_rows_matches_ref", why);
        return;
    }
    test_begin("gpu_fill_rows_matches_ref");
    rows_build(&r, &h[0], &h[1], &h[2]);
    RIG_OK(backend_run(&r.be, &r.prog));
    RIG_OK(backend_finish(&r.be));
    rows_read(&r, h, gs, gf, gb);
    rig_close(&r);
    CHECK(memcmp(gs, strided, sizeof gs) == 0 && memcmp(gf, flat, sizeof gf) == 0 &&
          memcmp(gb, bf16, sizeof gb) == 0, "the GPU's fills differ from the reference's");
    test_end();
}

// A write from pageable host memory must have landed before the next op on the backend's stream
// reads it: a kernel launched right after backend_write hashes the whole region, including its
// last bytes, which a copy still in flight would leave stale.
static void test_gpu_write_then_launch(void) {
    static rig r;
    const char *why = NULL;
    if (!rig_open(&r, BACKEND_GPU, &why)) {
        test_skip("gpu_write_is_ordered_before_next_launch", why);
        return;
    }
    test_begin("gpu_write_is_ordered_before_next_launch");
    const uint64_t bytes = 64ull << 20;
    arena_handle data = rig_reserve(&r, "data", bytes);
    arena_handle partials = rig_reserve(&r, "partials", 256 * 8);
    arena_handle sum = rig_reserve(&r, "sum", 8);
    RIG_OK(op_checksum(&r.prog, "checksum", rig_ref(&r, data, 0), bytes, rig_ref(&r, partials, 0),
                       256, rig_ref(&r, sum, 0)));
    rig_bind(&r);
    uint8_t *pattern = malloc(bytes);
    for (int round = 0; round < 4; round++) {
        for (uint64_t i = 0; i < bytes; i++) pattern[i] = (uint8_t)(i * 131 + round * 7 + i / 4093);
        RIG_OK(backend_write(&r.be, rig_ref(&r, data, 0), pattern, bytes));
        RIG_OK(backend_run(&r.be, &r.prog));
        uint64_t got = 0;
        RIG_OK(backend_read(&r.be, &got, rig_ref(&r, sum, 0), 8));
        CHECK(got == host_checksum(pattern, bytes), "round %d: device hashed stale bytes", round);
    }
    free(pattern);
    rig_close(&r);
    test_end();
}

// A setting read from the environment: unset gives the default, a number in range is taken,
// anything else is refused with a message that names the variable and the range.
typedef qt_status (*env_setting_fn)(uint32_t *value);

static void env_setting_check(const char *variable, env_setting_fn read, uint32_t fallback,
                              uint32_t max) {
    const char *saved = getenv(variable);
    char keep[32] = "";
    if (saved) snprintf(keep, sizeof keep, "%s", saved);
    uint32_t value = 999;
    unsetenv(variable);
    CHECK(read(&value) == QT_OK && value == fallback, "%s unset: %u, expected %u", variable,
          value, fallback);
    char at_max[16], past_max[16], range[32];
    snprintf(at_max, sizeof at_max, "%u", max);
    snprintf(past_max, sizeof past_max, "%u", max + 1);
    snprintf(range, sizeof range, "0 to %u", max);
    const struct { const char *text; uint32_t value; bool ok; } cases[] = {
        {"0", 0, true}, {"1", 1, true}, {at_max, max, true}, {past_max, 0, false},
        {"-1", 0, false}, {"8x", 0, false}, {"lots", 0, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        setenv(variable, cases[k].text, 1);
        value = 999;
        qt_status status = read(&value);
        if (cases[k].ok) {
            CHECK(status == QT_OK && value == cases[k].value, "%s='%s': status %d, %u", variable,
                  cases[k].text, (int)status, value);
        } else {
            CHECK(status == QT_ERR_INPUT && strstr(qt_error_message(), variable) &&
                      strstr(qt_error_message(), range),
                  "%s='%s': status %d, message '%s'", variable, cases[k].text, (int)status,
                  qt_error_message());
        }
    }
    if (saved) {
        setenv(variable, keep, 1);
    } else {
        unsetenv(variable);
    }
}

// A 0-or-1 setting as the number env_setting_check reads.
static qt_status switch_number(qt_status (*read)(bool *on), uint32_t *value) {
    bool on = false;
    qt_status status = read(&on);
    *value = on;
    return status;
}

static qt_status margin_beside_number(uint32_t *value) {
    return switch_number(backend_margin_beside, value);
}

static qt_status comm_priority_number(uint32_t *value) {
    return switch_number(backend_comm_priority, value);
}

static qt_status largest_first_number(uint32_t *value) {
    return switch_number(run_largest_first, value);
}

static qt_status comm_wide_number(uint32_t *value) {
    dp_wide wide = DP_WIDE_OFF;
    qt_status status = backend_comm_wide(&wide);
    *value = wide != DP_WIDE_OFF;
    return status;
}

// QTRAIN_COMM_SMS (the SMs a data-parallel step leaves to NCCL), QTRAIN_PACK_GAP (the device
// arena's pack_gap), and QTRAIN_MARGIN_BESIDE, QTRAIN_COMM_PRIORITY, QTRAIN_UPDATE_ORDER and
// QTRAIN_COMM_WIDE (0 or 1, on when unset).
static void test_env_settings(void) {
    test_begin("settings_read_the_environment");
    env_setting_check("QTRAIN_COMM_SMS", backend_comm_sms, BACKEND_COMM_SMS_DEFAULT,
                      BACKEND_COMM_SMS_MAX);
    env_setting_check("QTRAIN_PACK_GAP", run_pack_gap, 0, RUN_PACK_GAP_MAX);
    env_setting_check("QTRAIN_MARGIN_BESIDE", margin_beside_number, 1, 1);
    env_setting_check("QTRAIN_COMM_PRIORITY", comm_priority_number, 1, 1);
    env_setting_check("QTRAIN_UPDATE_ORDER", largest_first_number, 1, 1);
    env_setting_check("QTRAIN_COMM_WIDE", comm_wide_number, 1, 1);
    // Set to 1, the second communicator is required (an older NCCL fails the run); unset, it is
    // taken where NCCL has it.
    static const char *const wide_values[] = {NULL, "1", "0"};
    static const dp_wide wide_expected[] = {DP_WIDE_IF_ABLE, DP_WIDE_REQUIRED, DP_WIDE_OFF};
    for (int v = 0; v < 3; v++) {
        if (wide_values[v]) {
            setenv("QTRAIN_COMM_WIDE", wide_values[v], 1);
        } else {
            unsetenv("QTRAIN_COMM_WIDE");
        }
        dp_wide wide = wide_expected[v] == DP_WIDE_OFF ? DP_WIDE_REQUIRED : DP_WIDE_OFF;
        CHECK(backend_comm_wide(&wide) == QT_OK && wide == wide_expected[v],
              "QTRAIN_COMM_WIDE=%s: %d, expected %d",
              wide_values[v] ? wide_values[v] : "(unset)", (int)wide, (int)wide_expected[v]);
    }
    unsetenv("QTRAIN_COMM_WIDE");
    test_end();
}

int main(void) {
    test_philox_known_answers();
    test_env_settings();
    test_fill_windows_compose();
    test_program_capacity();
    test_program_dependencies();
    test_program_late_use();
    test_capture_plan();
    test_ref_fill_statistics();
    test_fill_rows();
    test_gpu_matches_ref();
    test_gpu_write_then_launch();
    return test_exit_code();
}
