// infer_out: an infer row's outputs written to an .npy file as the schedule loop reads them.
//
// Owns one npy_writer (an atomic file) inside the caller's infer_out, from infer_out_open until
// infer_out_commit or infer_out_abandon. The scratch rows are caller memory (a host arena region
// planned at start-up: batch x outputs x 4 bytes), so writing allocates nothing. Callers: the
// run (open, commit) and the schedule loop (infer_out_write, once per infer step, when it reads
// the step's record). One thread.
//
// Where the numbers come from: the infer program copies the model's last activation, BF16
// [batch][outputs], into pinned host slot step % MODEL_OUTPUT_SLOTS (model_io.outputs); the
// loop reads it when it reads the step's record, at most SCHED_LAG steps after the launch,
// with no synchronization of its own (the record's event covers the copy). The file gets
//
//   logits       float32 [rows][outputs]: each BF16 value widened exactly
//   predictions  int32 [rows] (argmax): the index of the largest logit, the lower index on ties,
//                NaN never winning (ptx/act.h's qt_xent_best_combine, the rule the device's
//                accuracy uses, so predictions reproduce the eval accuracy exactly); -1 when
//                every logit of the row is NaN
//
// in step order, real rows only: the padding rows of a pass's last batch are dropped, so an
// `infer all` row writes one row per sample of its dataset, in file order.
#ifndef QT_INFER_OUT_H
#define QT_INFER_OUT_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/io/npy.h"       // npy_writer
#include "runtime/base/status.h"  // qt_status

typedef struct infer_out {
    npy_writer file;
    bool argmax;
    uint32_t outputs;          // logits per row
    uint32_t batch;            // rows per step, padding included
    uint64_t rows_expected;    // what the file's header promises
    uint64_t rows_written;
    void *scratch;             // batch * outputs float32 (or batch int32)
} infer_out;

// Rows an infer row of `steps` steps over a dataset of `samples` samples writes (passes start at
// the first sample in file order, and the last batch of each pass is padded).
uint64_t infer_out_rows(uint64_t samples, uint32_t batch, uint64_t steps);

// Bytes of the scratch an infer_out of this shape needs.
uint64_t infer_out_scratch_bytes(uint32_t batch, uint32_t outputs);

// Creates path (npy_create: refused when it exists unless replace; replace_hint names the flag)
// for rows_expected rows. scratch: at least infer_out_scratch_bytes, 4-byte aligned.
qt_status infer_out_open(infer_out *o, const char *path, bool argmax, uint64_t rows_expected,
                         uint32_t batch, uint32_t outputs, void *scratch, bool replace,
                         const char *replace_hint);
// The file's two forms of `rows` rows of bf16 [rows][outputs]: float32 logits [rows][outputs]
// and int32 classes [rows] (also what the embedding API's qt_infer gives).
void infer_out_logits(const uint16_t *bf16, uint32_t rows, uint32_t outputs, float *logits);
void infer_out_classes(const uint16_t *bf16, uint32_t rows, uint32_t outputs, int32_t *classes);
// One step's outputs: bf16 [batch][outputs], of which the first rows_valid rows are real.
qt_status infer_out_write(infer_out *o, const uint16_t *bf16, uint32_t rows_valid);
// Checks that every promised row came and gives the file its name.
qt_status infer_out_commit(infer_out *o);
void infer_out_abandon(infer_out *o);

#endif  // QT_INFER_OUT_H
