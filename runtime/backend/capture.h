// capture: how a program's ops spread over the capture streams of a CUDA graph, and which
// earlier op each op waits for (runtime/backend/backend.c replays the plan into stream-capture
// calls; it is plain C so that tests check it without a GPU).
//
// Owns nothing: the plan's per-op arrays are the program's scratch (program.h op_scratch).
//
// An op waits, on every other stream, for the latest earlier op of that stream whose regions
// conflict with its own (prog_ops_conflict); the ops before that one on its stream come with it.
// A wait targets that very op, through a mark (an event recorded right after it) of a small
// pool, not the stream's last op: a stream that went on with other work (the backward pass after
// a layer's weight gradient) does not hold back an op that needs only its earlier part (the
// gradient's reduction). When no mark is free, the wait falls back to the stream's last op,
// which is later and so always safe. In a program with collectives (runtime/parallel), they
// have a stream of their own; so do the ops off the main line (prog_op.beside), so that no op of
// the main line queues behind one of them.
#ifndef QT_BACKEND_CAPTURE_H
#define QT_BACKEND_CAPTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/program/program.h"

#define CAPTURE_STREAMS 6
// Marks: events after the ops that some later op of another stream waits for, held until that
// op's last waiter is placed. The bench recipes need at most 12 at once (capture_plan.
// marks_needed, which `qtrain plan` prints); past this many the waits fall back.
#define CAPTURE_MARKS 32
#define CAPTURE_NONE (-1)

typedef struct capture_plan {
    const program *p;
    int32_t last[CAPTURE_STREAMS];                   // each stream's last op placed
    int32_t seen[CAPTURE_STREAMS][CAPTURE_STREAMS];  // [s][t]: stream t's ops s already follows
    int32_t mark_op[CAPTURE_MARKS];                  // the op each mark follows (NONE: free)
    // The stream of the collectives, which holds nothing else (NONE: the program has none): a
    // gradient's reduction, placed after the whole backward pass in program order, then starts
    // once its gradient is written, not behind the backward ops of a shared stream.
    int32_t collective_stream;
    // The stream of the ops off the main line (prog_op.beside), which holds nothing else (NONE:
    // the program has none): the last stream but the collectives'.
    int32_t beside_stream;
    // The program's first and last collective (both NONE: none): the ops between them may run
    // beside one.
    int32_t first_collective, last_collective;
    int32_t last_wide_gemm;  // the program's last wide GEMM (NONE: none)
    // capture_begin's margin_beside: the SM margin only for the wide GEMMs of the window that a
    // collective may run beside; the others run alone (capture_gemm_alone).
    bool margin_beside;
    // The most marks held at once if the pool had no end: above CAPTURE_MARKS, some waits fall
    // back to a stream's last op and wait longer than their op needs.
    uint32_t marks_needed;
    uint32_t *stream_of;    // per op: its stream (the first half of the program's scratch)
    uint32_t *last_waiter;  // per op: the last op of another stream that waits for it, or
                            // UINT32_MAX (the second half)
} capture_plan;

// One wait of an op: for stream `stream` up to op `op`, through mark `mark`, or (mark NONE)
// through the stream's last op.
typedef struct capture_wait {
    int32_t stream;
    int32_t op;
    int32_t mark;
} capture_wait;

// What the capture does for one op: waits, the launch on `stream`, then the stream's event and,
// when `mark` is not NONE, that mark recorded after it.
typedef struct capture_step {
    int32_t stream;
    uint32_t wait_count;
    capture_wait waits[CAPTURE_STREAMS];
    int32_t mark;
} capture_step;

// Whether op is a collective (runtime/parallel: NCCL's, run from the host's side).
bool capture_collective(const prog_op *op);

// Whether op is a GEMM whose grid the sm_90a tier may make persistent and as wide as the GPU
// (its kernel has an sm_90a twin: runtime/backend/gemm_tier.h), whichever tier runs it.
bool capture_wide_gemm(const prog_op *op);

// Whether op i lies strictly between the program's first and last collective (what may run
// beside one; false in a program without collectives). After capture_begin.
bool capture_between_collectives(const capture_plan *c, uint32_t i);

// With margin_beside: whether wide GEMM i of the window runs with no collective beside it, so on
// every SM. It does when the first collective after it in program order reads or writes what it
// does (the reduction of the gradient it writes): the collectives run in program order on their
// own stream, so none after that one starts before the GEMM ends; and the GEMM waits for the
// last collective before it (capture_next's waits), so none before it is still running.
bool capture_gemm_alone(const capture_plan *c, uint32_t i);

// Whether op i leaves the SM margin to NCCL (backend.comm_sms): between the first and the last
// collective, and not a GEMM that runs alone.
bool capture_leaves_margin(const capture_plan *c, uint32_t i);

// Whether op i is a collective after the program's last wide GEMM in program order: no GEMM runs
// beside it, so it may take more SMs than the margin (dp_launch's `alone`). The program's GEMMs
// and collectives are the same on every rank, so every rank answers alike.
bool capture_collective_alone(const capture_plan *c, uint32_t i);

// Plans every op's stream and which ops other streams wait for (a dry run of the placement),
// then readies the plan for capture_next from op 0. margin_beside: in a program with
// collectives, only the wide GEMMs that a collective may run beside leave the SM margin to NCCL
// (backend.h comm_sms); the others wait for the collectives before them and take every SM
// (capture_gemm_alone). Only an order is added; the bits do not change.
void capture_begin(capture_plan *c, const program *p, bool margin_beside);
// The step of op j (0, 1, ... in order).
void capture_next(capture_plan *c, uint32_t j, capture_step *out);

#endif  // QT_BACKEND_CAPTURE_H
