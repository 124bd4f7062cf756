#include "runtime/io/trace.h"

#include <errno.h>
#include <fcntl.h>   // open
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>   // snprintf, fprintf
#include <stdlib.h>  // strtoull
#include <string.h>
#include <sys/stat.h>  // fstat: what --trace would replace
#include <unistd.h>  // read, write, close

#include "runtime/base/input_file.h"  // input_file_open: regular files only; input_file_kind

#define TRACE_MAGIC "qtrain-trace"
#define TRACE_END_KEY "end"

// The completion record's status words, by trace_end.
static const char *const end_names[] = {"complete", "stopped", "failed"};
_Static_assert(sizeof end_names / sizeof end_names[0] == TRACE_END_COUNT, "a name per trace_end");

// ---------------------------------------------------------------------------------------------
// Formatting

uint64_t trace_hash_more(uint64_t hash, const void *bytes, size_t n) {
    const uint8_t *p = bytes;
    for (size_t i = 0; i < n; i++) hash = (hash ^ p[i]) * 0x100000001b3ull;  // FNV-1a 64 prime
    return hash;
}

uint64_t trace_hash(const void *bytes, size_t n) {
    return trace_hash_more(0xcbf29ce484222325ull, bytes, n);  // FNV-1a 64 offset basis
}

// Appends with snprintf and asserts the room: callers size `out` for the longest line.
typedef struct text {
    char *out;
    size_t bytes;
    size_t used;
} text;

__attribute__((format(printf, 2, 3))) static void text_add(text *t, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(t->out + t->used, t->bytes - t->used, fmt, args);
    va_end(args);
    QT_ASSERT(n >= 0 && (size_t)n < t->bytes - t->used);
    t->used += (size_t)n;
}

// " key=0x3f8ccccd:1.10000002": the bits decide equality, the value is for people.
static void text_float(text *t, const char *key, float value) {
    text_add(t, " %s=0x%08" PRIx32 ":%.9g", key, qt_f32_bits(value), (double)value);
}

static const char *mode_name(uint32_t mode) {
    switch (mode) {
    case QT_TRACE_MODE_TRAIN: return "train";
    case QT_TRACE_MODE_EVAL: return "eval";
    case QT_TRACE_MODE_INFER: return "infer";
    default: return "unknown";
    }
}

size_t trace_format_header(const trace_header *h, char *out, size_t out_bytes) {
    QT_ASSERT(h->quantizers_count <= QT_TRACE_QUANTIZERS_MAX);
    text t = {out, out_bytes, 0};
    text_add(&t, "%s %d recipe=%016" PRIx64 " quantizers=%" PRIu32 " checksum_every=%" PRIu32
             "\n", TRACE_MAGIC, TRACE_VERSION, h->recipe_hash, h->quantizers_count,
             h->checksum_every);
    for (uint32_t i = 0; i < h->quantizers_count; i++) {
        const char *name = h->quantizer_names[i];
        size_t length = strnlen(name, TRACE_NAME_MAX);
        // The runtime builds the names from layer paths, which have no blanks.
        QT_ASSERT(length > 0 && length < TRACE_NAME_MAX && strpbrk(name, " \t\r\n") == NULL);
        text_add(&t, "quantizer %" PRIu32 " %s\n", i, name);
    }
    return t.used;
}

size_t trace_format_record(const qt_trace_record *r, uint32_t quantizers_count, char *out,
                           size_t out_bytes) {
    QT_ASSERT(quantizers_count <= QT_TRACE_QUANTIZERS_MAX);
    QT_ASSERT(out_bytes >= trace_line_bytes(quantizers_count));
    text t = {out, out_bytes, 0};
    text_add(&t, "step=%" PRIu64 " mode=%s flags=0x%" PRIx32 ":", r->step, mode_name(r->mode),
             r->flags);
    uint32_t known = r->flags & QT_TRACE_FLAGS_KNOWN;
    if (known == 0) text_add(&t, "none");
    if (known & QT_TRACE_FLAG_SKIPPED) text_add(&t, "skipped");
    if (known & QT_TRACE_FLAG_CHECKSUM) {
        text_add(&t, "%schecksum", (known & QT_TRACE_FLAG_SKIPPED) ? "," : "");
    }
    text_float(&t, "loss", r->loss);
    text_float(&t, "accuracy", r->accuracy);
    text_float(&t, "grad_norm", r->grad_norm);
    text_float(&t, "lr", r->lr);
    if (r->flags & QT_TRACE_FLAG_CHECKSUM) {
        text_add(&t, " checksum=0x%016" PRIx64, r->checksum);
    } else {
        text_add(&t, " checksum=-");  // the field holds nothing meaningful in this step
    }
    for (uint32_t i = 0; i < quantizers_count; i++) {
        char key[16];
        snprintf(key, sizeof key, "amax.%" PRIu32, i);
        text_float(&t, key, r->amax[i]);
        snprintf(key, sizeof key, "scale.%" PRIu32, i);
        text_float(&t, key, r->scale[i]);
    }
    text_add(&t, "\n");
    return t.used;
}

// ---------------------------------------------------------------------------------------------
// Writer

static qt_status writer_write_all(const trace_writer *w, const char *bytes, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(w->fd, bytes + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            return qt_fail(QT_ERR_IO, "%s: cannot write the trace: %s", w->path,
                           strerror(errno));
        }
        done += (size_t)k;
    }
    return QT_OK;
}

static qt_status writer_flush(trace_writer *w) {
    QT_TRY(writer_write_all(w, w->buffer, w->used));
    w->hash = trace_hash_more(w->hash, w->buffer, w->used);
    w->bytes_written += w->used;
    w->used = 0;
    return QT_OK;
}

static qt_status writer_check_path(const char *path) {
    if (strlen(path) >= TRACE_PATH_MAX) {
        return qt_fail(QT_ERR_INPUT, "trace path '%.64s...' is longer than TRACE_PATH_MAX - 1 = "
                       "%d bytes; use a shorter path", path, TRACE_PATH_MAX - 1);
    }
    return QT_OK;
}

// What may be at the trace's path (fd open on it, st its stat): a regular file that is empty
// or a trace already, or with `replace_other` any regular file.
static qt_status writer_check_kind(const char *path, int fd, const struct stat *st,
                                   bool replace_other) {
    if (!S_ISREG(st->st_mode)) {
        return qt_fail(QT_ERR_INPUT, "%s is %s, not a regular file; --trace writes a regular "
                       "file: name another path", path, input_file_kind(st->st_mode));
    }
    if (replace_other || st->st_size == 0) return QT_OK;
    char start[sizeof TRACE_MAGIC] = {0};
    ssize_t n = fd >= 0 ? pread(fd, start, sizeof start, 0) : -1;
    if (n == (ssize_t)sizeof start && memcmp(start, TRACE_MAGIC " ", sizeof start) == 0) {
        return QT_OK;
    }
    return qt_fail(QT_ERR_INPUT, "%s exists and is not a qtrain trace (it does not start with '"
                   TRACE_MAGIC " '); a run replaces only a trace with its trace: remove it, name "
                   "another file, or pass --force to replace it", path);
}

qt_status trace_check_output(const char *path, bool replace_other) {
    QT_TRY(writer_check_path(path));
    struct stat st;
    if (stat(path, &st) != 0) return QT_OK;  // a new file (trace_open reports other failures)
    if (!S_ISREG(st.st_mode)) return writer_check_kind(path, -1, &st, replace_other);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return QT_OK;  // unreadable: trace_open says why it cannot write either
    qt_status status = writer_check_kind(path, fd, &st, replace_other);
    close(fd);
    return status;
}

qt_status trace_open(trace_writer *w, const char *path, const trace_header *h,
                     bool replace_other) {
    QT_TRY(writer_check_path(path));
    QT_ASSERT(h->quantizers_count <= QT_TRACE_QUANTIZERS_MAX);
    // Not truncated at open: what is there is looked at first. O_NONBLOCK: a FIFO must not block.
    w->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (w->fd < 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot create the trace file: %s; check that the folder "
                       "exists and is writable", path, strerror(errno));
    }
    struct stat st;
    qt_status status = QT_OK;
    if (fstat(w->fd, &st) != 0) {
        status = qt_fail(QT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (status == QT_OK) status = writer_check_kind(path, w->fd, &st, replace_other);
    if (status == QT_OK && ftruncate(w->fd, 0) != 0) {
        status = qt_fail(QT_ERR_IO, "%s: cannot empty the file: %s", path, strerror(errno));
    }
    if (status != QT_OK) {
        close(w->fd);
        w->fd = -1;
        return status;
    }
    input_file_blocking(w->fd);
    snprintf(w->path, sizeof w->path, "%s", path);
    w->quantizers_count = h->quantizers_count;
    w->records = 0;
    w->bytes_written = 0;
    w->hash = trace_hash(NULL, 0);
    w->used = trace_format_header(h, w->buffer, sizeof w->buffer);
    return QT_OK;
}

// Hashes the first `bytes` bytes of fd (through the writer's buffer); false when it is shorter.
static qt_status writer_hash_prefix(trace_writer *w, uint64_t bytes, uint64_t *hash,
                                    bool *complete) {
    *hash = trace_hash(NULL, 0);
    uint64_t done = 0;
    while (done < bytes) {
        size_t want = bytes - done < sizeof w->buffer ? (size_t)(bytes - done) : sizeof w->buffer;
        ssize_t n = read(w->fd, w->buffer, want);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return qt_fail(QT_ERR_IO, "%s: cannot read: %s", w->path, strerror(errno));
        if (n == 0) break;
        *hash = trace_hash_more(*hash, w->buffer, (size_t)n);
        done += (uint64_t)n;
    }
    *complete = done == bytes;
    return QT_OK;
}

// The file is open read-write: is it the checkpointed run's trace, with this run's header?
static qt_status writer_check_prefix(trace_writer *w, const trace_header *h, uint64_t bytes,
                                     uint64_t hash) {
    const char *fix = "name another --trace file (a new one gets the records from the "
                      "checkpoint's step on) or remove it";
    if (bytes == 0) {
        return qt_fail(QT_ERR_MISMATCH, "%s exists, but the checkpoint was saved by a run "
                       "without a trace, so there is nothing to continue; %s", w->path, fix);
    }
    uint64_t found = 0;
    bool complete = false;
    QT_TRY(writer_hash_prefix(w, bytes, &found, &complete));
    if (!complete || found != hash) {
        return qt_fail(QT_ERR_MISMATCH, "%s is not the trace of the checkpointed run: %s; %s",
                       w->path, complete ? "its first bytes differ from those the checkpoint "
                       "describes" : "it is shorter than the trace was at the checkpoint", fix);
    }
    // The header is the file's beginning, and this run's must be the same (--checksum-every).
    size_t length = trace_format_header(h, w->buffer, sizeof w->buffer);
    bool same = true;
    for (size_t done = 0; done < length && same;) {  // a piece at a time, on the stack
        char piece[1024];
        size_t want = length - done < sizeof piece ? length - done : sizeof piece;
        ssize_t n = pread(w->fd, piece, want, (off_t)done);
        same = n == (ssize_t)want && memcmp(piece, w->buffer + done, want) == 0;
        done += want;
    }
    if (!same) {
        return qt_fail(QT_ERR_MISMATCH, "%s: its header differs from this run's (another "
                       "--checksum-every?); resume with the options of the run that wrote it, "
                       "or %s", w->path, fix);
    }
    return QT_OK;
}

qt_status trace_continue(trace_writer *w, const char *path, const trace_header *h,
                         uint64_t bytes, uint64_t hash, uint64_t records) {
    QT_TRY(writer_check_path(path));
    w->fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (w->fd < 0 && errno == ENOENT) return trace_open(w, path, h, false);
    if (w->fd < 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot open the trace to continue it: %s", path,
                       strerror(errno));
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    struct stat st;
    qt_status status = QT_OK;
    if (fstat(w->fd, &st) != 0) {
        status = qt_fail(QT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        status = writer_check_kind(path, w->fd, &st, false);
    } else {
        input_file_blocking(w->fd);
        status = writer_check_prefix(w, h, bytes, hash);
    }
    if (status == QT_OK && (ftruncate(w->fd, (off_t)bytes) != 0 ||
                            lseek(w->fd, (off_t)bytes, SEEK_SET) != (off_t)bytes)) {
        status = qt_fail(QT_ERR_IO, "%s: cannot cut the trace back to the checkpoint: %s",
                         path, strerror(errno));
    }
    if (status != QT_OK) {
        close(w->fd);
        w->fd = -1;
        return status;
    }
    w->quantizers_count = h->quantizers_count;
    w->records = records;
    w->bytes_written = bytes;
    w->hash = hash;
    w->used = 0;
    return QT_OK;
}

qt_status trace_flush(trace_writer *w, bool durable) {
    QT_ASSERT(w->fd >= 0);
    QT_TRY(writer_flush(w));
    if (durable && fsync(w->fd) != 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot sync the trace: %s", w->path, strerror(errno));
    }
    return QT_OK;
}

qt_status trace_write(trace_writer *w, const qt_trace_record *r) {
    QT_ASSERT(w->fd >= 0);
    if (sizeof w->buffer - w->used < trace_line_bytes(w->quantizers_count)) {
        QT_TRY(writer_flush(w));
    }
    w->used += trace_format_record(r, w->quantizers_count, w->buffer + w->used,
                                   sizeof w->buffer - w->used);
    w->records++;
    return QT_OK;
}

qt_status trace_close(trace_writer *w, trace_end end) {
    QT_ASSERT(w->fd >= 0 && (unsigned)end < TRACE_END_COUNT);
    qt_status status = writer_flush(w);
    if (status == QT_OK) {
        // After the counted bytes: a continued trace (trace_continue) cuts it off again.
        char line[64];
        int n = snprintf(line, sizeof line, TRACE_END_KEY " status=%s records=%" PRIu64 "\n",
                         end_names[end], w->records);
        status = writer_write_all(w, line, (size_t)n);
    }
    if (close(w->fd) != 0 && status == QT_OK) {
        status = qt_fail(QT_ERR_IO, "%s: cannot close the trace: %s", w->path, strerror(errno));
    }
    w->fd = -1;
    return status;
}

// ---------------------------------------------------------------------------------------------
// Reading lines: from a file through the reader's buffer, or from the caller's memory

static qt_status lines_open(trace_lines *r, const char *path) {
    memset(r, 0, offsetof(trace_lines, buffer));
    r->path = path;
    r->text = r->buffer;
    uint64_t bytes = 0;
    r->fd = -1;
    return input_file_open(path, "trace", NULL, &r->fd, &bytes);
}

// The whole file is already in memory[0 .. bytes), which the reader may write (it ends lines
// with NUL in place).
static void lines_memory(trace_lines *r, const char *path, char *memory, size_t bytes) {
    memset(r, 0, offsetof(trace_lines, buffer));
    r->path = path;
    r->fd = -1;
    r->text = memory;
    r->end = bytes;
    r->file_end = true;
}

static void lines_close(trace_lines *r) {
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
}

// The next line without its \n, NUL-terminated in place and valid until the next call; *have
// is false at the end of the file. A NUL byte inside a line is refused (qtrain never writes one,
// and a comparison must not stop at it). A last line without its \n is refused too, unless the
// reader tolerates it (`qtrain diff` reports such a trace as cut short): then r->cut is set.
static qt_status lines_next(trace_lines *r, char **line, bool *have) {
    for (;;) {
        char *begin = r->text + r->start;
        char *newline = memchr(begin, '\n', r->end - r->start);
        size_t length = newline != NULL ? (size_t)(newline - begin) : r->end - r->start;
        if (length >= TRACE_LINE_BYTES_MAX) {
            return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": line longer than %d bytes; expected a "
                           "qtrain trace file", r->path, r->line + 1, TRACE_LINE_BYTES_MAX);
        }
        if (newline != NULL) {
            const char *nul = memchr(begin, '\0', length);
            if (nul != NULL) {
                return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ":%zu: a NUL byte; qtrain writes none "
                               "into a trace: the file is damaged or not a trace", r->path,
                               r->line + 1, (size_t)(nul - begin) + 1);
            }
            *newline = '\0';
            *line = begin;
            r->start = (size_t)(newline + 1 - r->text);
            r->line++;
            *have = true;
            return QT_OK;
        }
        if (r->file_end) {
            *have = false;
            if (r->start == r->end) return QT_OK;
            if (r->tolerate_cut) {
                r->cut = true;
                r->start = r->end;
                return QT_OK;
            }
            return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": the last line has no end: the trace "
                           "is cut short (was the run interrupted?)", r->path, r->line + 1);
        }
        memmove(r->text, begin, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
        ssize_t n = read(r->fd, r->text + r->end, sizeof r->buffer - r->end);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return qt_fail(QT_ERR_IO, "%s: cannot read: %s", r->path, strerror(errno));
        if (n == 0) r->file_end = true;
        r->end += (size_t)n;
    }
}

static qt_status lines_expect(trace_lines *r, char **line, const char *what) {
    bool have;
    QT_TRY(lines_next(r, line, &have));
    if (!have) {
        return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": the file ends; expected %s", r->path,
                       r->line + 1, what);
    }
    return QT_OK;
}

// ---------------------------------------------------------------------------------------------
// Parsing

static qt_status parse_header(trace_lines *r, trace_header *h) {
    memset(h, 0, sizeof *h);
    char *line;
    QT_TRY(lines_expect(r, &line, "the header '" TRACE_MAGIC " N ...'"));
    int version = 0, end = -1;
    int fields = sscanf(line, TRACE_MAGIC " %d recipe=%16" SCNx64 " quantizers=%" SCNu32
                        " checksum_every=%" SCNu32 "%n", &version, &h->recipe_hash,
                        &h->quantizers_count, &h->checksum_every, &end);
    if (fields < 1 || strncmp(line, TRACE_MAGIC " ", sizeof TRACE_MAGIC) != 0) {
        return qt_fail(QT_ERR_INPUT, "%s:1: not a qtrain trace: expected '" TRACE_MAGIC " %d "
                       "recipe=...', found '%.40s'", r->path, TRACE_VERSION, line);
    }
    if (version != TRACE_VERSION) {
        return qt_fail(QT_ERR_INPUT, "%s:1: trace format version %d; this qtrain reads version "
                       "%d%s", r->path, version, TRACE_VERSION, version == 1 ? " (version 1 "
                       "traces have no completion record; run again to write one)" : "");
    }
    if (fields != 4 || end < 0 || line[end] != '\0' ||
        h->quantizers_count > QT_TRACE_QUANTIZERS_MAX) {
        return qt_fail(QT_ERR_INPUT, "%s:1: malformed header '%.120s'; expected '" TRACE_MAGIC
                       " %d recipe=<16 hex> quantizers=<0..%d> checksum_every=<N>'", r->path,
                       line, TRACE_VERSION, QT_TRACE_QUANTIZERS_MAX);
    }
    for (uint32_t i = 0; i < h->quantizers_count; i++) {
        QT_TRY(lines_expect(r, &line, "a 'quantizer I NAME' line"));
        uint32_t index = UINT32_MAX;
        end = -1;
        sscanf(line, "quantizer %" SCNu32 " %63s%n", &index, h->quantizer_names[i], &end);
        if (index != i || end < 0 || line[end] != '\0') {
            return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": expected 'quantizer %" PRIu32 " NAME', "
                           "found '%.80s'", r->path, r->line, i, line);
        }
    }
    return QT_OK;
}

static qt_status expect_record(const trace_lines *r, const char *line) {
    if (strncmp(line, "step=", 5) != 0) {
        return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": expected a record line 'step=N ...' or "
                       "the completion record '" TRACE_END_KEY " status=...', found '%.40s'",
                       r->path, r->line, line);
    }
    return QT_OK;
}

static bool is_end_line(const char *line) {
    return strncmp(line, TRACE_END_KEY " ", sizeof TRACE_END_KEY) == 0;
}

// "end status=complete records=12": the status and the count, which must be the file's.
static qt_status parse_end(const trace_lines *r, const char *line, trace_tail *tail) {
    char status[16] = "";
    int end = -1;
    sscanf(line, TRACE_END_KEY " status=%15s records=%" SCNu64 "%n", status, &tail->records,
           &end);
    tail->status = TRACE_END_COUNT;
    for (int i = 0; i < TRACE_END_COUNT; i++) {
        if (strcmp(status, end_names[i]) == 0) tail->status = (trace_end)i;
    }
    if (end < 0 || line[end] != '\0' || tail->status == TRACE_END_COUNT) {
        return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": malformed completion record '%.80s'; "
                       "expected '" TRACE_END_KEY " status=complete|stopped|failed records=N'",
                       r->path, r->line, line);
    }
    if (tail->records != r->records) {
        return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": the completion record counts %" PRIu64
                       " records, the file has %" PRIu64 "; the file was changed after qtrain "
                       "wrote it", r->path, r->line, tail->records, r->records);
    }
    return QT_OK;
}

// The next record line; at the completion record or the end of the file *have is false and
// r->tail says which (a completion record must be the file's last line).
static qt_status next_record(trace_lines *r, char **line, bool *have) {
    QT_TRY(lines_next(r, line, have));
    if (*have && is_end_line(*line)) {
        QT_TRY(parse_end(r, *line, &r->tail));
        r->tail.present = true;
        r->tail.line = r->line;
        char *after;
        bool more;
        QT_TRY(lines_next(r, &after, &more));
        if (more || r->cut) {
            return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": a line after the completion record "
                           "of line %" PRIu64 "; expected the end of the file", r->path,
                           r->line + (r->cut ? 1 : 0), r->tail.line);
        }
        *have = false;
        return QT_OK;
    }
    if (!*have) return QT_OK;
    QT_TRY(expect_record(r, *line));
    r->records++;
    return QT_OK;
}

// Splits off the next space-separated token of a record line; false at the end.
static bool next_token(const char **cursor, const char **token, size_t *length) {
    const char *p = *cursor;
    while (*p == ' ') p++;
    if (*p == '\0') return false;
    const char *start = p;
    while (*p != ' ' && *p != '\0') p++;
    *token = start;
    *length = (size_t)(p - start);
    *cursor = p;
    return true;
}

static size_t key_length(const char *token, size_t length) {
    const char *eq = memchr(token, '=', length);
    return eq != NULL ? (size_t)(eq - token) : length;
}

// The value of the next token if its key is `key` ("loss"), else NULL.
static const char *take_value(const char **cursor, const char *key) {
    const char *token;
    size_t length;
    if (!next_token(cursor, &token, &length)) return NULL;
    size_t k = strlen(key);
    if (key_length(token, length) != k || memcmp(token, key, k) != 0 || k == length) return NULL;
    return token + k + 1;
}

// "0x3f8ccccd:..." -> the float of those bits; only the bits count.
static bool parse_f32(const char *value, float *out) {
    uint32_t bits;
    int end = -1;
    if (value == NULL || sscanf(value, "0x%8" SCNx32 ":%n", &bits, &end) != 1 || end != 11) {
        return false;
    }
    *out = qt_bits_f32(bits);
    return true;
}

static bool parse_mode(const char *value, uint32_t *mode) {
    static const uint32_t modes[] = {QT_TRACE_MODE_TRAIN, QT_TRACE_MODE_EVAL,
                                     QT_TRACE_MODE_INFER};
    for (int i = 0; value != NULL && i < 3; i++) {
        const char *name = mode_name(modes[i]);
        size_t n = strlen(name);
        if (strncmp(value, name, n) == 0 && (value[n] == ' ' || value[n] == '\0')) {
            *mode = modes[i];
            return true;
        }
    }
    return false;
}

static bool parse_fields(const char *line, uint32_t quantizers, qt_trace_record *rec) {
    const char *c = line;
    int end = -1;
    const char *v = take_value(&c, "step");
    if (v == NULL || sscanf(v, "%" SCNu64 "%n", &rec->step, &end) != 1 || v[end] != ' ') {
        return false;
    }
    if (!parse_mode(take_value(&c, "mode"), &rec->mode)) return false;
    v = take_value(&c, "flags");
    if (v == NULL || sscanf(v, "0x%" SCNx32, &rec->flags) != 1) return false;
    if (!parse_f32(take_value(&c, "loss"), &rec->loss) ||
        !parse_f32(take_value(&c, "accuracy"), &rec->accuracy) ||
        !parse_f32(take_value(&c, "grad_norm"), &rec->grad_norm) ||
        !parse_f32(take_value(&c, "lr"), &rec->lr)) {
        return false;
    }
    v = take_value(&c, "checksum");
    if (v == NULL || (v[0] != '-' && sscanf(v, "0x%16" SCNx64, &rec->checksum) != 1)) return false;
    for (uint32_t i = 0; i < quantizers; i++) {
        char key[24];  // "scale." and any u32
        snprintf(key, sizeof key, "amax.%" PRIu32, i);
        if (!parse_f32(take_value(&c, key), &rec->amax[i])) return false;
        snprintf(key, sizeof key, "scale.%" PRIu32, i);
        if (!parse_f32(take_value(&c, key), &rec->scale[i])) return false;
    }
    const char *rest;
    size_t length;
    return !next_token(&c, &rest, &length);
}

// ---------------------------------------------------------------------------------------------
// Reports of differences, into a text: `qtrain diff` prints them, the replay check fails with them

typedef struct sides {
    const char *a, *b;  // "A" and "B", or "golden" and "run"
} sides;

// Values print at most this many bytes: a report must fit a message.
#define REPORT_VALUE_BYTES 96

static int capped(size_t length) {
    return (int)(length < REPORT_VALUE_BYTES ? length : REPORT_VALUE_BYTES);
}

// Adds the first header field that differs; returns whether one did.
static bool header_differs(const trace_header *a, const trace_header *b, sides s, text *t) {
    if (a->recipe_hash != b->recipe_hash) {
        text_add(t, "header: recipe hash differs: %s %016" PRIx64 ", %s %016" PRIx64 " (the runs "
                 "used different recipes)\n", s.a, a->recipe_hash, s.b, b->recipe_hash);
        return true;
    }
    if (a->quantizers_count != b->quantizers_count || a->checksum_every != b->checksum_every) {
        text_add(t, "header: %s has %" PRIu32 " quantizers, checksum every %" PRIu32 " steps; %s "
                 "has %" PRIu32 ", every %" PRIu32 "\n", s.a, a->quantizers_count,
                 a->checksum_every, s.b, b->quantizers_count, b->checksum_every);
        return true;
    }
    for (uint32_t i = 0; i < a->quantizers_count; i++) {
        if (strcmp(a->quantizer_names[i], b->quantizer_names[i]) != 0) {
            text_add(t, "header: quantizer %" PRIu32 " is %s in %s, %s in %s\n", i,
                     a->quantizer_names[i], s.a, b->quantizer_names[i], s.b);
            return true;
        }
    }
    return false;
}

// " (quantizer NAME)" for the amax.I and scale.I fields, else "".
static void quantizer_note(const trace_header *h, const char *key, size_t key_bytes, char *note,
                           size_t note_bytes) {
    note[0] = '\0';
    unsigned index;
    int end = -1;
    char field[TRACE_NAME_MAX];
    snprintf(field, sizeof field, "%.*s", (int)key_bytes, key);
    if ((sscanf(field, "amax.%u%n", &index, &end) == 1 ||
         sscanf(field, "scale.%u%n", &index, &end) == 1) &&
        field[end] == '\0' && index < h->quantizers_count) {
        snprintf(note, note_bytes, " (quantizer %s)", h->quantizer_names[index]);
    }
}

// The step of a record line: "12" of "step=12 mode=...".
static int step_bytes(const char *line) { return capped(strcspn(line + strlen("step="), " ")); }

// Two record lines that are not byte-equal: adds the first field that differs (after the
// caller's lead, "first difference at step 3 (...)") with both values.
static void report_fields(const trace_header *h, const char *a, const char *b, sides s,
                          text *t) {
    const char *ta = NULL, *tb = NULL;
    size_t la = 0, lb = 0;
    for (;;) {
        bool has_a = next_token(&a, &ta, &la), has_b = next_token(&b, &tb, &lb);
        if (!has_a && !has_b) {
            text_add(t, ": the fields are equal but spaced differently\n");
            return;
        }
        if (!has_a || !has_b) {
            const char *tok = has_a ? ta : tb;
            size_t len = has_a ? la : lb;
            text_add(t, ": %s's record ends where the other has %.*s\n", has_a ? s.b : s.a,
                     capped(len), tok);
            return;
        }
        if (la == lb && memcmp(ta, tb, la) == 0) continue;
        size_t ka = key_length(ta, la), kb = key_length(tb, lb);
        if (ka != kb || memcmp(ta, tb, ka) != 0) {
            text_add(t, ": %s has field %.*s where %s has %.*s\n", s.a, capped(ka), ta, s.b,
                     capped(kb), tb);
            return;
        }
        char note[TRACE_NAME_MAX + 16];
        quantizer_note(h, ta, ka, note, sizeof note);
        size_t width = strlen(s.a) > strlen(s.b) ? strlen(s.a) : strlen(s.b);
        text_add(t, ", field %.*s%s:\n  %s:%*s %.*s\n  %s:%*s %.*s\n", capped(ka), ta, note, s.a,
                 (int)(width - strlen(s.a)), "", capped(la - ka - 1), ta + ka + 1, s.b,
                 (int)(width - strlen(s.b)), "", capped(lb - kb - 1), tb + kb + 1);
        return;
    }
}

// ---------------------------------------------------------------------------------------------
// trace_diff

#define REPORT_BYTES 1024

static uint64_t record_step(const char *line) { return strtoull(line + 5, NULL, 10); }

// A trace that a resumed run started in a new file begins at the checkpoint's step: the other
// trace's records before that step have no counterpart and are skipped. *from is the step the
// comparison starts at when one was skipped, else UINT64_MAX.
static qt_status diff_align(trace_lines *ra, char **a, bool *have_a, trace_lines *rb, char **b,
                            bool *have_b, uint64_t *from) {
    *from = UINT64_MAX;
    if (!*have_a || !*have_b) return QT_OK;
    uint64_t sa = record_step(*a), sb = record_step(*b);
    while (*have_a && sa < sb) {
        QT_TRY(next_record(ra, a, have_a));
        if (*have_a) sa = record_step(*a);
        *from = sb;
    }
    while (*have_b && sb < sa) {
        QT_TRY(next_record(rb, b, have_b));
        if (*have_b) sb = record_step(*b);
        *from = sa;
    }
    return QT_OK;
}

// How a trace's records ended, for the report: " (its run completed)", or " (cut short: no
// completion record)".
static const char *tail_words(const trace_lines *r) {
    if (!r->tail.present) return "cut short: no completion record";
    static const char *const words[] = {
        "its run completed", "its run was stopped by a signal", "its run failed"};
    _Static_assert(sizeof words / sizeof words[0] == TRACE_END_COUNT, "a name per trace_end");
    return words[r->tail.status];
}

// Reads a trace's remaining records (after a difference was found) to tell how it ends.
static qt_status diff_drain(trace_lines *r) {
    char *line;
    bool have = true;
    while (have) QT_TRY(next_record(r, &line, &have));
    return QT_OK;
}

// The line for a trace without a completion record, which a comparison must not take for a
// complete shorter run.
static void diff_note_cut(const trace_lines *r, const char *name, FILE *out) {
    if (r->tail.present) return;
    fprintf(out, "%s is cut short: %" PRIu64 " records%s and no completion record (its run was "
            "killed, or is still running)\n", name, r->records,
            r->cut ? ", a last line without its end," : "");
}

// Both traces' records are equal up to where one or both end: how they end decides.
static void diff_ends(trace_lines *ra, trace_lines *rb, uint64_t records, uint64_t from,
                      FILE *out, bool *identical) {
    const trace_tail *ta = &ra->tail, *tb = &rb->tail;
    bool same_end = ta->present == tb->present && ra->cut == rb->cut &&
                    (!ta->present || ta->status == tb->status);
    if (!same_end) {
        *identical = false;
        fprintf(out, "records equal (%" PRIu64 "), but the traces end differently: A (%s), B "
                "(%s)\n", records, tail_words(ra), tail_words(rb));
        diff_note_cut(ra, "A", out);
        diff_note_cut(rb, "B", out);
        return;
    }
    if (!*identical) return;  // the headers differ (reported)
    const char *note = ta->present ? "" : " (both cut short: neither has a completion record)";
    if (from != UINT64_MAX) {
        fprintf(out, "identical: %" PRIu64 " records from step %" PRIu64 " (the other trace's "
                "records before it are not compared)%s\n", records, from, note);
    } else {
        fprintf(out, "identical: %" PRIu64 " records%s\n", records, note);
    }
}

// Both readers are past their headers. Compares record lines, byte for byte, until the first
// difference.
static qt_status diff_records(const trace_header *h, trace_lines *ra, trace_lines *rb,
                              FILE *out, bool *identical) {
    static const sides ab = {"A", "B"};
    uint64_t records = 0, from = UINT64_MAX;
    for (;;) {
        char *a, *b;
        bool have_a, have_b;
        QT_TRY(next_record(ra, &a, &have_a));
        QT_TRY(next_record(rb, &b, &have_b));
        if (records == 0) QT_TRY(diff_align(ra, &a, &have_a, rb, &b, &have_b, &from));
        if (!have_a && !have_b) break;
        if (!have_a || !have_b) {
            trace_lines *ended = have_a ? rb : ra, *longer_lines = have_a ? ra : rb;
            const char *longer = have_a ? a : b;
            fprintf(out, "%s ends after %" PRIu64 " records (%s); %s goes on with %.*s\n",
                    have_a ? "B" : "A", records, tail_words(ended), have_a ? "A" : "B",
                    capped(strcspn(longer, " ")), longer);
            *identical = false;
            QT_TRY(diff_drain(longer_lines));
            diff_note_cut(ra, "A", out);
            diff_note_cut(rb, "B", out);
            return QT_OK;
        }
        // No line holds a NUL byte (lines_next), so strcmp compares every byte of both.
        if (strcmp(a, b) != 0) {
            char report[REPORT_BYTES];
            text t = {report, sizeof report, 0};
            text_add(&t, "first difference at step %.*s (line %" PRIu64 " of A, line %" PRIu64
                     " of B)", step_bytes(a), a + strlen("step="), ra->line, rb->line);
            report_fields(h, a, b, ab, &t);
            fputs(report, out);
            *identical = false;
            QT_TRY(diff_drain(ra));
            QT_TRY(diff_drain(rb));
            diff_note_cut(ra, "A", out);
            diff_note_cut(rb, "B", out);
            return QT_OK;
        }
        records++;
    }
    diff_ends(ra, rb, records, from, out, identical);
    return QT_OK;
}

// Two readers and two headers take about 42 KiB of stack; trace_diff runs in the CLI's main
// thread, whose stack is megabytes.
qt_status trace_diff(const char *path_a, const char *path_b, FILE *out, bool *identical) {
    static const sides ab = {"A", "B"};
    trace_lines ra, rb;
    trace_header ha, hb;
    *identical = false;
    QT_TRY(lines_open(&ra, path_a));
    qt_status status = lines_open(&rb, path_b);
    if (status != QT_OK) {
        lines_close(&ra);
        return status;
    }
    // A trace cut inside its last line is a killed run's: reported, not refused.
    ra.tolerate_cut = rb.tolerate_cut = true;
    status = parse_header(&ra, &ha);
    if (status == QT_OK) status = parse_header(&rb, &hb);
    if (status == QT_OK) {
        char report[REPORT_BYTES];
        text t = {report, sizeof report, 0};
        report[0] = '\0';
        *identical = !header_differs(&ha, &hb, ab, &t);
        fputs(report, out);
        status = diff_records(&ha, &ra, &rb, out, identical);
    }
    if (status != QT_OK) *identical = false;
    lines_close(&ra);
    lines_close(&rb);
    return status;
}

// ---------------------------------------------------------------------------------------------
// Reading records

qt_status trace_reader_open(trace_reader *r, const char *path) {
    QT_TRY(lines_open(&r->lines, path));
    qt_status status = parse_header(&r->lines, &r->header);
    if (status != QT_OK) lines_close(&r->lines);
    return status;
}

qt_status trace_reader_next(trace_reader *r, qt_trace_record *rec, bool *have) {
    char *line;
    QT_TRY(next_record(&r->lines, &line, have));
    if (!*have) return QT_OK;
    memset(rec, 0, sizeof *rec);
    if (!parse_fields(line, r->header.quantizers_count, rec)) {
        return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": malformed record '%.60s...'; expected the "
                       "fields step, mode, flags, loss, accuracy, grad_norm, lr, checksum and %"
                       PRIu32 " amax/scale pairs, as qtrain writes them", r->lines.path,
                       r->lines.line, line, r->header.quantizers_count);
    }
    return QT_OK;
}

void trace_reader_close(trace_reader *r) { lines_close(&r->lines); }

// ---------------------------------------------------------------------------------------------
// Golden-trace replay

qt_status trace_check_bytes(const char *path, uint64_t *bytes) {
    int fd = -1;
    uint64_t size = 0;
    QT_TRY(input_file_open(path, "golden trace", NULL, &fd, &size));
    close(fd);
    *bytes = size + 1;  // + 1: a byte more than the file shows it did not grow
    return QT_OK;
}

// Reads the file into memory[0 .. bytes - 1); QT_ERR_MISMATCH if its size changed.
static qt_status read_whole(const char *path, char *memory, uint64_t bytes) {
    size_t done = 0;
    qt_status status = input_file_read(path, "golden trace", memory, bytes, &done);
    if (status == QT_ERR_CAPACITY) done = bytes;  // it grew past the byte to spare
    if (status != QT_OK && status != QT_ERR_CAPACITY) return status;
    if (done != bytes - 1) {
        return qt_fail(QT_ERR_MISMATCH, "%s: the golden trace changed size while qtrain started "
                       "(%" PRIu64 " bytes, then %s%zu); do not write it during a run",
                       path, bytes - 1, done == bytes ? "more than " : "", done);
    }
    return QT_OK;
}

qt_status trace_check_load(trace_checker *c, const char *path, char *memory, uint64_t bytes) {
    QT_ASSERT(bytes >= 1);
    QT_TRY(read_whole(path, memory, bytes));
    lines_memory(&c->lines, path, memory, bytes - 1);
    c->records = 0;
    QT_TRY(parse_header(&c->lines, &c->golden));
    // Every line must be whole now, so that a cut golden trace stops the run before it starts.
    if (bytes - 1 > c->lines.start && memory[bytes - 2] != '\n') {
        uint64_t lines = c->lines.line;
        for (uint64_t i = c->lines.start; i < bytes - 1; i++) lines += memory[i] == '\n';
        return qt_fail(QT_ERR_INPUT, "%s:%" PRIu64 ": the last line has no end: the golden "
                       "trace is cut short; use a trace of a run that finished", path, lines + 1);
    }
    // And the last line must be the completion record: a golden trace without one is a killed
    // run's, whose end is not where the run it checks would end.
    uint64_t last = bytes - 1 > c->lines.start ? bytes - 2 : c->lines.start;
    while (last > c->lines.start && memory[last - 1] != '\n') last--;
    if (!is_end_line(memory + last)) {
        return qt_fail(QT_ERR_INPUT, "%s: no completion record at its end: the golden trace is "
                       "cut short (its run was killed, or was still running); use a trace of a "
                       "run that finished", path);
    }
    return QT_OK;
}

qt_status trace_check_header(trace_checker *c, const trace_header *h) {
    static const sides gr = {"golden", "run"};
    char report[REPORT_BYTES];
    text t = {report, sizeof report, 0};
    if (!header_differs(&c->golden, h, gr, &t)) return QT_OK;
    report[strcspn(report, "\n")] = '\0';
    return qt_fail(QT_ERR_MISMATCH, "%.256s: the run does not match the golden trace before its "
                   "first step: %s", c->lines.path, report);
}

qt_status trace_check_skip_to(trace_checker *c, uint64_t step) {
    trace_lines *l = &c->lines;
    // The golden trace is in memory whole and its lines end in \n: the next line can be looked
    // at before it is taken. A line that is not a record stops the skip; the check reports it.
    while (l->start < l->end && strncmp(l->text + l->start, "step=", 5) == 0 &&
           record_step(l->text + l->start) < step) {
        char *skipped;
        bool have;
        QT_TRY(next_record(l, &skipped, &have));
    }
    return QT_OK;
}

qt_status trace_check_record(trace_checker *c, const qt_trace_record *r) {
    static const sides gr = {"golden", "run"};
    trace_format_record(r, c->golden.quantizers_count, c->line, sizeof c->line);
    c->line[strcspn(c->line, "\n")] = '\0';
    char *golden;
    bool have;
    QT_TRY(next_record(&c->lines, &golden, &have));
    if (!have) {
        return qt_fail(QT_ERR_MISMATCH, "%.256s: the golden trace ends after %" PRIu64 " records; "
                       "the run goes on with step=%" PRIu64, c->lines.path, c->records, r->step);
    }
    if (strcmp(golden, c->line) != 0) {
        char report[REPORT_BYTES];
        text t = {report, sizeof report, 0};
        text_add(&t, "%.256s: the run diverges from the golden trace at step %.*s (line %" PRIu64
                 " of the golden trace)", c->lines.path, step_bytes(c->line),
                 c->line + strlen("step="), c->lines.line);
        report_fields(&c->golden, golden, c->line, gr, &t);
        if (t.used > 0 && report[t.used - 1] == '\n') report[t.used - 1] = '\0';
        return qt_fail(QT_ERR_MISMATCH, "%s", report);
    }
    c->records++;
    return QT_OK;
}

qt_status trace_check_end(trace_checker *c) {
    char *golden;
    bool have;
    QT_TRY(next_record(&c->lines, &golden, &have));
    if (!have) return QT_OK;
    return qt_fail(QT_ERR_MISMATCH, "%.256s: the run ended after %" PRIu64 " records; the golden "
                   "trace goes on with %.*s (line %" PRIu64 ")", c->lines.path, c->records,
                   capped(strcspn(golden, " ")), golden, c->lines.line);
}
