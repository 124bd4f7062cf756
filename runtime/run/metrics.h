// metrics: the metrics file of a run (`qtrain run --metrics FILE`): one JSON line per eval pass
// and per N train steps, for plotting and for other tools.
//
// Owns the file (an atomic_file, runtime/io/atomic_file.h) and the sums of the interval being
// measured, inside the caller's metrics_writer, from metrics_open until metrics_commit or
// metrics_abandon. The schedule loop hands it every record it reads (sched_env.record); the
// lines go to FILE.tmp-PID beside FILE as the steps finish and FILE appears when the run ends.
// One thread. No allocation.
//
// Format: JSON Lines, one object per line, keys always in this order (numbers as C prints them,
// `null` where there is no value), e.g.
//
//   {"kind":"train","step":100,"epoch":0.4255,"loss":0.61234,"accuracy":0.7812,"lr":0.00099,
//    "steps_per_s":152.3,"steps":100,"skipped":0}
//   {"kind":"eval","step":235,"epoch":1.0000,"loss":0.41232,"accuracy":0.8512,"lr":0.00095,
//    "steps_per_s":410.7,"steps":40,"samples":10000,"dataset":"eval"}
//
//   kind         "train": after every `every`-th train step of the run and after the last step
//                of every train row (and of a loop that stops), over the train steps since the
//                previous train line; "eval": after the last step of every eval row, over the
//                row (one pass with `all`)
//   step         train steps of the run done (the x axis of a training curve); for an eval line
//                the train steps before the pass
//   epoch        step / the train steps of an epoch, %.4f
//   loss         the mean loss over the real rows (padding rows of an epoch's last batch count
//                for nothing) of the interval's steps, or of the pass; %.9g
//   accuracy     correct predictions / real rows, the same way; null for a regression (mse)
//   lr           the learning rate of the last train step (for an eval line: of the last train
//                step before it, 0 when there was none); %.9g, which gives back the FP32 bits
//   steps_per_s  the line's steps over the wall time the loop spent on them (the time between
//                the records of consecutive steps counts for the later step's mode), %.4g
//   steps        the steps the line covers; skipped: train steps of them whose update the
//                optimizer skipped (non-finite gradients); samples: the pass's real rows;
//                dataset: "eval" or "train", the set the eval row read
#ifndef QT_METRICS_H
#define QT_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/io/atomic_file.h"
#include "runtime/schedule/schedule.h"  // sched_progress
#include "runtime/base/status.h"

#define METRICS_LINE_BYTES 512

typedef struct metrics_writer {
    atomic_file file;
    uint64_t every;           // train steps between train lines (> 0)
    bool classification;      // accuracy is meaningful (softmax_xent); else null
    double last_elapsed;      // the elapsed time of the last record (the loop's clock)
    // The train interval since the last train line.
    uint64_t steps, skipped, rows, correct;
    double loss_sum, seconds;
    float lr;                 // the last train step's
    // The eval row under way: its wall time.
    double eval_seconds;
    uint64_t last_train_steps;  // of the last record, and the epoch's length: for the last line
    uint64_t epoch_steps;
    uint64_t lines;
    bool failed;              // a write failed: the file is not whole, and is not committed
    char line[METRICS_LINE_BYTES];
} metrics_writer;

// Creates FILE.tmp-PID beside path; an existing path is refused unless replace (the message
// names replace_hint, "--force"). every: train steps between train lines (>= 1).
qt_status metrics_open(metrics_writer *m, const char *path, bool replace, const char *replace_hint,
                       uint64_t every, bool classification);

// The record of one step (sched_record_fn): accumulates it and writes the lines it completes.
qt_status metrics_record(void *writer, const sched_progress *p);

// Writes the line of the train steps since the last train line, if any (a loop that stopped
// inside a row), then gives the file its name (atomic_file_commit). After a failed write it
// removes the temporary file instead (and returns QT_OK: the write reported the error).
qt_status metrics_commit(metrics_writer *m);

// Removes the temporary file (safe after a commit and on a zeroed writer).
void metrics_abandon(metrics_writer *m);

#endif  // QT_METRICS_H
