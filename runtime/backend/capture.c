#include "runtime/backend/capture.h"

#include "runtime/backend/gemm_tier.h"  // gemm_tier_sm90a_kernel: which ops are wide GEMMs
#include "runtime/driver/modules.h"       // kernel_table: which ops are collectives

static void capture_reset(capture_plan *c) {
    for (int s = 0; s < CAPTURE_STREAMS; s++) {
        c->last[s] = CAPTURE_NONE;
        for (int t = 0; t < CAPTURE_STREAMS; t++) c->seen[s][t] = CAPTURE_NONE;
    }
    for (int k = 0; k < CAPTURE_MARKS; k++) c->mark_op[k] = CAPTURE_NONE;
}

bool capture_wide_gemm(const prog_op *op) {
    return gemm_tier_sm90a_kernel(op->kernel) != KERNEL_COUNT;
}

bool capture_between_collectives(const capture_plan *c, uint32_t i) {
    return (int32_t)i > c->first_collective && (int32_t)i < c->last_collective;
}

bool capture_collective(const prog_op *op) {
    return kernel_table[op->kernel].module == MODULE_host;
}

bool capture_collective_alone(const capture_plan *c, uint32_t i) {
    return capture_collective(&c->p->ops[i]) && (int32_t)i > c->last_wide_gemm;
}

bool capture_gemm_alone(const capture_plan *c, uint32_t i) {
    const program *p = c->p;
    if (!c->margin_beside || !capture_wide_gemm(&p->ops[i]) ||
        !capture_between_collectives(c, i)) {
        return false;
    }
    uint32_t k = i + 1;
    while (!capture_collective(&p->ops[k])) k++;  // the last collective lies after i
    return prog_ops_conflict(&p->ops[i], &p->ops[k]);
}

bool capture_leaves_margin(const capture_plan *c, uint32_t i) {
    return capture_between_collectives(c, i) && !capture_gemm_alone(c, i);
}

// need[s]: the latest earlier op on stream s that op j conflicts with (NONE: none); for a GEMM
// that runs alone, on the collectives' stream the last collective before it.
static void capture_needs(const capture_plan *c, uint32_t j, int32_t need[CAPTURE_STREAMS]) {
    const program *p = c->p;
    for (int s = 0; s < CAPTURE_STREAMS; s++) need[s] = CAPTURE_NONE;
    bool alone = capture_gemm_alone(c, j);
    for (uint32_t i = j; i-- > 0;) {
        int s = (int)c->stream_of[i];
        if (need[s] != CAPTURE_NONE) continue;  // a later op of that stream is needed already
        bool collective_before = alone && s == c->collective_stream;
        if (collective_before || prog_ops_conflict(&p->ops[i], &p->ops[j])) {
            need[s] = (int32_t)i;
        }
    }
}

// A stream for op j: in a program with collectives, the last stream for each collective and
// never for another op; in one with ops off the main line, the last stream but that one for each
// of them and never for another op; else one whose last op j needs anyway (the chain goes on
// without a wait), else an unused stream, else the one whose last op is oldest (the least likely
// to hold j back).
static int capture_pick(const capture_plan *c, uint32_t j, const int32_t need[CAPTURE_STREAMS]) {
    const prog_op *op = &c->p->ops[j];
    if (c->collective_stream != CAPTURE_NONE && capture_collective(op)) {
        return c->collective_stream;
    }
    if (c->beside_stream != CAPTURE_NONE && op->beside) return c->beside_stream;
    // The main line's streams: those below the reserved ones, which are the last.
    int streams = CAPTURE_STREAMS - (c->collective_stream != CAPTURE_NONE) -
                  (c->beside_stream != CAPTURE_NONE);
    int best = -1;
    for (int s = 0; s < streams; s++) {
        if (c->last[s] != CAPTURE_NONE && need[s] == c->last[s] &&
            (best < 0 || need[s] > need[best])) {
            best = s;
        }
    }
    if (best >= 0) return best;
    for (int s = 0; s < streams; s++) {
        if (c->last[s] == CAPTURE_NONE) return s;
    }
    best = 0;
    for (int s = 1; s < streams; s++) {
        if (c->last[s] < c->last[best]) best = s;
    }
    return best;
}

// marks_needed: capture_next takes a mark at op j when a later op waits for j, and frees it once
// that op's last waiter is placed; held[j] counts the marks held just after op j's placement.
// The scratch's halves are in use (stream_of, last_waiter), so the count walks ops again.
static void capture_count_marks(capture_plan *c) {
    const program *p = c->p;
    c->marks_needed = 0;
    uint32_t held = 0;
    for (uint32_t j = 0; j < p->op_count; j++) {
        for (uint32_t i = 0; i < j; i++) {  // marks freed once op j is placed
            held -= c->last_waiter[i] == j;
        }
        held += c->last_waiter[j] != UINT32_MAX;
        if (held > c->marks_needed) c->marks_needed = held;
    }
}

void capture_begin(capture_plan *c, const program *p, bool margin_beside) {
    QT_ASSERT(!prog_counting(p));
    c->p = p;
    c->margin_beside = margin_beside;
    c->stream_of = p->op_scratch;
    c->last_waiter = p->op_scratch + p->op_capacity;
    capture_reset(c);
    c->first_collective = c->last_collective = c->last_wide_gemm = CAPTURE_NONE;
    bool beside = false;
    for (uint32_t j = 0; j < p->op_count; j++) {
        c->last_waiter[j] = UINT32_MAX;
        beside |= p->ops[j].beside;
        if (capture_wide_gemm(&p->ops[j])) c->last_wide_gemm = (int32_t)j;
        if (!capture_collective(&p->ops[j])) continue;
        if (c->first_collective == CAPTURE_NONE) c->first_collective = (int32_t)j;
        c->last_collective = (int32_t)j;
    }
    c->collective_stream =
        c->first_collective != CAPTURE_NONE ? CAPTURE_STREAMS - 1 : CAPTURE_NONE;
    c->beside_stream = CAPTURE_NONE;
    if (beside) {
        c->beside_stream = c->collective_stream != CAPTURE_NONE ? CAPTURE_STREAMS - 2
                                                               : CAPTURE_STREAMS - 1;
    }
    // The dry run: streams as the capture will pick them, each wait aimed at its very op.
    for (uint32_t j = 0; j < p->op_count; j++) {
        int32_t need[CAPTURE_STREAMS];
        capture_needs(c, j, need);
        int s = capture_pick(c, j, need);
        for (int t = 0; t < CAPTURE_STREAMS; t++) {
            if (t == s || need[t] == CAPTURE_NONE || need[t] <= c->seen[s][t]) continue;
            c->last_waiter[need[t]] = j;
            c->seen[s][t] = need[t];
        }
        c->last[s] = (int32_t)j;
        c->stream_of[j] = (uint32_t)s;
    }
    capture_count_marks(c);
    capture_reset(c);
}

static int32_t capture_mark_of(const capture_plan *c, int32_t op) {
    for (int k = 0; k < CAPTURE_MARKS; k++) {
        if (c->mark_op[k] == op) return k;
    }
    return CAPTURE_NONE;
}

void capture_next(capture_plan *c, uint32_t j, capture_step *out) {
    int32_t need[CAPTURE_STREAMS];
    capture_needs(c, j, need);
    int s = (int)c->stream_of[j];
    // The streams' last ops evolve as in the dry run, so the pick is the one planned.
    QT_ASSERT(capture_pick(c, j, need) == s);
    out->stream = s;
    out->wait_count = 0;
    // Waits go through marks, so seen grows no further than in the dry run where one is found;
    // a fallback to the stream's last op covers more of it. Either way this run waits for a
    // subset of the dry run's targets, which last_waiter bounds.
    for (int t = 0; t < CAPTURE_STREAMS; t++) {
        if (t == s || need[t] == CAPTURE_NONE || need[t] <= c->seen[s][t]) continue;
        int32_t mark = capture_mark_of(c, need[t]);
        out->waits[out->wait_count++] = (capture_wait){t, need[t], mark};
        c->seen[s][t] = mark != CAPTURE_NONE ? need[t] : c->last[t];
    }
    c->last[s] = (int32_t)j;
    // A mark whose op no later op waits for is free again.
    for (int k = 0; k < CAPTURE_MARKS; k++) {
        if (c->mark_op[k] != CAPTURE_NONE && c->last_waiter[c->mark_op[k]] <= j) {
            c->mark_op[k] = CAPTURE_NONE;
        }
    }
    out->mark = CAPTURE_NONE;
    if (c->last_waiter[j] == UINT32_MAX) return;
    for (int k = 0; k < CAPTURE_MARKS; k++) {
        if (c->mark_op[k] != CAPTURE_NONE) continue;
        c->mark_op[k] = (int32_t)j;
        out->mark = k;
        return;
    }
}
