// trace: the text trace file (one line per step, every field printed exactly), the comparison
// of two traces (`qtrain diff A B`), reading records back (`qtrain plot`) and checking a run
// against a golden trace as it goes (`qtrain run --check`).
//
// Owns the writer's file descriptor and line buffer (inside trace_writer, caller storage) from
// trace_open to trace_close. Callers: the schedule loop, which writes the records it reads from
// the device's pinned ring (ptx/trace_record.h); tools/qtrain for diff. One thread per writer.
//
// File format, version 2. Lines end with \n; fields are `key=value` separated by one space.
//
//   qtrain-trace 2 recipe=<16 hex digits> quantizers=<N> checksum_every=<K>
//   quantizer 0 <name>                       N lines: the delayed-scaling quantizers, in the
//   quantizer 1 <name>                       order of the records' amax.I and scale.I
//   step=<S> mode=<train|eval|infer> flags=<F> loss=<X> accuracy=<X> grad_norm=<X> lr=<X>
//       checksum=<C> amax.0=<X> scale.0=<X> ... amax.N-1=<X> scale.N-1=<X>      (one line)
//   ...                                      one record per step
//   end status=<complete|stopped|failed> records=<R>     the completion record, last
//
// The completion record is written when the writer closes: `complete` when the run finished
// its schedule, `stopped` when a signal stopped it at a step boundary, `failed` when it ended on
// an error; R counts the file's records. A trace without one is cut short: its run was killed,
// or is still running (version 1 had no completion record; its files are refused).
//
//   <X>  an FP32 as its bits and a readable value: 0x3f8ccccd:1.10000002 (%.9g, which
//        round-trips; nan and inf print as such, the bits tell which NaN)
//   <F>  0x<hex>:<names> with names skipped,checksum (or `none`); unknown bits stay in the hex
//   <C>  0x<16 hex digits> when the record carries the checksum of the persistent state, else -
//
// Every bit of a record that has a meaning is printed, and nothing else (no times, no paths), so
// two runs are bitwise identical exactly when their trace files are byte-identical; trace_diff
// names the first step and field where they are not.
//
// Resumed runs. A checkpoint keeps the trace's length and hash at its step (the writer flushes
// and fsyncs first; the completion record is never counted in them). A run resumed from it
// with the same file continues that file in place (trace_continue: the bytes after the
// checkpoint's are cut off, e.g. the records of steps a crashed run wrote after its last save,
// or the completion record of a stopped run), so it ends byte-identical to the uninterrupted
// run's trace. A resumed run writing to a new file starts it with the header and then the
// records from the checkpoint's step on; trace_diff compares such a trace with a whole one from
// the later of the two first steps.
#ifndef QT_TRACE_H
#define QT_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>  // FILE, for trace_diff's report

#include "runtime/base/status.h"  // qt_status
#include "ptx/trace_record.h"     // qt_trace_record, QT_TRACE_QUANTIZERS_MAX

#define TRACE_VERSION 2
#define TRACE_NAME_MAX 64           // quantizer names, terminator included
#define TRACE_PATH_MAX 256
// A record line takes at most TRACE_LINE_FIXED_BYTES for its fixed fields and
// TRACE_LINE_QUANTIZER_BYTES per quantizer (every value at its longest, ' amax.1023=0x...:
// -1.17549435e-38 scale.1023=...' is 75 bytes), so a line of the largest model fits.
#define TRACE_LINE_FIXED_BYTES 384
#define TRACE_LINE_QUANTIZER_BYTES 80
#define TRACE_LINE_BYTES_MAX 131072
#define TRACE_WRITE_BUFFER_BYTES 131072
QT_STATIC_ASSERT(TRACE_LINE_FIXED_BYTES + TRACE_LINE_QUANTIZER_BYTES * QT_TRACE_QUANTIZERS_MAX <=
                     TRACE_LINE_BYTES_MAX && TRACE_LINE_BYTES_MAX <= TRACE_WRITE_BUFFER_BYTES,
                 "a record line of any model fits a line buffer and the writer's buffer");
// The header (its first line, then one line of at most 16 + TRACE_NAME_MAX bytes per
// quantizer) fits the writer's buffer, which trace_open formats it into.
QT_STATIC_ASSERT(128 + QT_TRACE_QUANTIZERS_MAX * (16 + TRACE_NAME_MAX) <= TRACE_WRITE_BUFFER_BYTES,
                 "a trace header fits the writer's buffer");

// Bytes a record line of `quantizers` quantizers takes at most, its \n included.
static inline size_t trace_line_bytes(uint32_t quantizers) {
    return TRACE_LINE_FIXED_BYTES + (size_t)TRACE_LINE_QUANTIZER_BYTES * quantizers;
}

typedef struct trace_header {
    uint64_t recipe_hash;           // trace_hash of the recipe file's text
    uint32_t quantizers_count;      // <= QT_TRACE_QUANTIZERS_MAX
    uint32_t checksum_every;        // steps between checksums; 0 = none
    char quantizer_names[QT_TRACE_QUANTIZERS_MAX][TRACE_NAME_MAX];  // no blanks
} trace_header;

// How the run that wrote a trace ended (its completion record).
typedef enum trace_end {
    TRACE_END_COMPLETE,  // the schedule ran to its end
    TRACE_END_STOPPED,   // a signal stopped it between two steps (it may be resumed)
    TRACE_END_FAILED,    // an error ended it
    TRACE_END_COUNT
} trace_end;

typedef struct trace_writer {
    int fd;
    char path[TRACE_PATH_MAX];
    uint32_t quantizers_count;
    uint64_t records;               // in the file, those of a continued file included
    uint64_t bytes_written;         // bytes in the file (buffered bytes and the completion
                                    // record not counted)
    uint64_t hash;                  // trace_hash of those bytes
    size_t used;                    // bytes waiting in buffer
    char buffer[TRACE_WRITE_BUFFER_BYTES];
} trace_writer;

// 64-bit FNV-1a: the recipe hash of the header (and of checkpoints). trace_hash_more continues
// a hash with more bytes: trace_hash(ab) = trace_hash_more(trace_hash(a), b).
uint64_t trace_hash(const void *bytes, size_t n);
uint64_t trace_hash_more(uint64_t hash, const void *bytes, size_t n);

// Formats the header lines / one record line (with its \n) into out and returns the length.
// out_bytes must be at least trace_line_bytes(quantizers_count) (a record) or the header's
// size; asserted.
size_t trace_format_header(const trace_header *h, char *out, size_t out_bytes);
size_t trace_format_record(const qt_trace_record *r, uint32_t quantizers_count, char *out,
                           size_t out_bytes);

// Creates the file, or empties the one at path when it is a regular file that is empty or a
// trace already, or any regular file with `replace_other` (`--force`), and writes the header.
// QT_ERR_INPUT naming the file and the flag for any other file (something else would be lost)
// and for what is not a regular file (a FIFO, a device, a directory); QT_ERR_IO naming the path
// when it cannot be written.
qt_status trace_open(trace_writer *w, const char *path, const trace_header *h,
                     bool replace_other);
// trace_open's refusals, checked without writing anything (at start-up, before the run's slow
// part: a run must not fail on its trace after hours).
qt_status trace_check_output(const char *path, bool replace_other);
// Resumed runs: continues the file at `path` when its first `bytes` bytes hash to `hash` and
// begin with this run's header (the trace of the checkpointed run, which had `records`
// records there): cuts it to those bytes and appends after them. Creates it, like trace_open,
// when it does not exist. QT_ERR_MISMATCH, naming the file and the fix, when it exists but is
// not that trace (a checkpoint saved without a trace has bytes 0: any existing file is refused).
qt_status trace_continue(trace_writer *w, const char *path, const trace_header *h,
                         uint64_t bytes, uint64_t hash, uint64_t records);
// Appends one record (buffered; written when the buffer fills and at trace_close).
qt_status trace_write(trace_writer *w, const qt_trace_record *r);
// Writes what is buffered, then (durable) fsyncs the file: bytes_written and hash then describe
// the file on disk, as a checkpoint records them.
qt_status trace_flush(trace_writer *w, bool durable);
// Writes what is buffered and the completion record, and closes the file; the writer is done
// even when this fails.
qt_status trace_close(trace_writer *w, trace_end end);

// Lines of a trace: from a file through `buffer`, or from memory the caller holds (the golden
// trace). Internal to trace.c; public only so that the structs below can hold one.
// What follows a trace's last record: its completion record, or nothing (cut short).
typedef struct trace_tail {
    bool present;                   // the completion record was read
    trace_end status;
    uint64_t records;               // as the completion record counts them
    uint64_t line;                  // its line
} trace_tail;

typedef struct trace_lines {
    const char *path;
    int fd;                         // -1 for memory
    bool file_end;
    bool tolerate_cut;              // a last line without \n ends the file (cut is set)
    bool cut;
    uint64_t records;               // record lines read so far
    trace_tail tail;                // once the records ended
    uint64_t line;                  // number of the line last returned, from 1
    size_t start, end;              // unread bytes: text[start, end)
    char *text;                     // buffer, or the caller's memory
    char buffer[2 * TRACE_LINE_BYTES_MAX];
} trace_lines;

// A trace file read record by record (`qtrain plot`).
typedef struct trace_reader {
    trace_lines lines;
    trace_header header;
} trace_reader;

// Opens the file and parses its header (errors as trace_diff's).
qt_status trace_reader_open(trace_reader *r, const char *path);
// The next record, every field parsed from its bits; *have is false at the end of the records
// (r->lines.tail tells whether the completion record was there).
// QT_ERR_INPUT (file:line) for a line that is not a record as trace_format_record writes it.
qt_status trace_reader_next(trace_reader *r, qt_trace_record *rec, bool *have);
void trace_reader_close(trace_reader *r);

// Golden-trace replay (`qtrain run --check GOLDEN`): the golden file is read whole into caller
// memory at start-up (trace_check_bytes tells how much), its header and the completeness of its
// last line checked there; then every record the run produces is formatted as a trace line and
// compared with the golden trace's next line, so that a run is checked exactly as `qtrain diff`
// would compare its trace, without writing one. Each check that fails returns QT_ERR_MISMATCH
// with a message naming the step, the field and both values (as trace_diff reports them).
typedef struct trace_checker {
    trace_lines lines;              // over the caller's memory
    trace_header golden;
    uint64_t records;               // records matched so far
    char line[TRACE_LINE_BYTES_MAX];  // the run's record, formatted
} trace_checker;

// Bytes of memory trace_check_load needs for the golden trace at path. QT_ERR_IO when it cannot
// be read.
qt_status trace_check_bytes(const char *path, uint64_t *bytes);
// Reads the golden trace into memory (bytes from trace_check_bytes) and parses its header.
// QT_ERR_INPUT (file:line) when it is not a trace, or is cut short: in a line, or with no
// completion record (its run was killed).
qt_status trace_check_load(trace_checker *c, const char *path, char *memory, uint64_t bytes);
// The run's header (recipe hash, quantizers, checksum interval) against the golden trace's.
qt_status trace_check_header(trace_checker *c, const trace_header *h);
// Passes over the golden records before `step` (a resumed run's records begin at its
// checkpoint's step; nothing to pass over at step 0 or where the checker already stands).
qt_status trace_check_skip_to(trace_checker *c, uint64_t step);
// The run's next record against the golden trace's next record (or its end).
qt_status trace_check_record(trace_checker *c, const qt_trace_record *r);
// After the run's last record: the golden trace must end too.
qt_status trace_check_end(trace_checker *c);

// Compares two trace files, every byte of every record. Prints to `out` either `identical: N
// records` or the first difference: a header field, then the first step whose record differs,
// with the field and both values (and the quantizer's name for amax.I / scale.I), or where one
// trace ends early and how its run ended (its completion record), and for a trace without a
// completion record (or cut inside its last line) a line saying it is cut short, with its
// record count. Completion records that differ (a stopped run against a complete one) make
// the traces differ. When one trace starts at a later step (a resumed run's new file), the
// other's records before it are skipped and the report says `identical: N records from step S
// (...)`. *identical is true when the files are equal field for field. QT_ERR_IO when a file
// cannot be read, QT_ERR_INPUT (file:line) when one is not a qtrain trace (a NUL byte in a line
// included).
qt_status trace_diff(const char *path_a, const char *path_b, FILE *out, bool *identical);

#endif  // QT_TRACE_H
