// test_trace: the trace file (runtime/io/trace.c) and `qtrain diff`'s comparison.
//
// Exact text of hand-built records and headers; files written through the buffered writer are
// byte-identical to the formatted lines and their completion record; trace_diff reports
// identical traces, the first differing step and field (one ulp, NaN payloads, flags, a
// quantizer's amax with its name), traces that end early and how, traces cut short (no
// completion record, a cut line) against complete ones, and different headers; a NUL byte in a
// record, a line after the completion record and a miscounted one are refused, bad files fail
// with file:line messages. The writer replaces a trace or an empty file, another file only when
// told to, and never a FIFO. Records read back parse to the bits written; the replay check
// accepts the golden run's own records and names the first differing step and field, a run or
// golden trace that ends early, another header, and refuses a golden trace that is cut short.
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>  // mkfifo
#include <unistd.h>

#include "tests/files.h"  // tmp_path, file_read
#include "tests/test.h"
#include "runtime/io/trace.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) abort();
}

static float from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static trace_header header_of(uint64_t hash, uint32_t quantizers) {
    trace_header h;
    memset(&h, 0, sizeof h);
    h.recipe_hash = hash;
    h.quantizers_count = quantizers;
    h.checksum_every = 4;
    for (uint32_t i = 0; i < quantizers; i++) {
        snprintf(h.quantizer_names[i], TRACE_NAME_MAX, "linear.weight@fc%u", i + 1);
    }
    return h;
}

// Record `step` of a made-up run: every field depends on the step.
static qt_trace_record record_of(uint64_t step) {
    qt_trace_record r;
    memset(&r, 0, sizeof r);
    r.step = step;
    r.mode = step % 5 == 4 ? QT_TRACE_MODE_EVAL : QT_TRACE_MODE_TRAIN;
    r.flags = step % 4 == 0 ? QT_TRACE_FLAG_CHECKSUM : 0;
    r.loss = 2.0f / (float)(step + 1);
    r.accuracy = (float)step / 100.0f;
    r.grad_norm = 0.5f + (float)step;
    r.lr = 1e-3f;
    r.checksum = 0x0123456789abcdefull * (step + 1);
    for (int i = 0; i < QT_TRACE_QUANTIZERS_MAX; i++) {
        r.amax[i] = (float)(i + 1) * (float)(step + 1);
        r.scale[i] = 448.0f / r.amax[i];
    }
    return r;
}

// Writes `count` records of record_of, with `edit` applied to record `edit_step` if not NULL,
// and the completion record `end`.
static void write_trace_ended(const char *path, const trace_header *h, uint64_t count,
                              void (*edit)(qt_trace_record *), uint64_t edit_step,
                              trace_end end) {
    trace_writer *w = malloc(sizeof *w);
    qt_status status = trace_open(w, path, h, false);
    CHECK(status == QT_OK, "open %s: %s", path, qt_error_message());
    if (status != QT_OK) {
        free(w);
        return;
    }
    for (uint64_t s = 0; s < count; s++) {
        qt_trace_record r = record_of(s);
        if (edit != NULL && s == edit_step) edit(&r);
        status = trace_write(w, &r);
        CHECK(status == QT_OK, "write: %s", qt_error_message());
    }
    status = trace_close(w, end);
    CHECK(status == QT_OK, "close: %s", qt_error_message());
    free(w);
}

// The trace of a run that completed.
static void write_trace(const char *path, const trace_header *h, uint64_t count,
                        void (*edit)(qt_trace_record *), uint64_t edit_step) {
    write_trace_ended(path, h, count, edit, edit_step, TRACE_END_COMPLETE);
}

// The trace of a run killed after `count` records: no completion record, and with `cut_bytes`
// the last record cut that many bytes before its end.
static void write_killed(const char *path, const trace_header *h, uint64_t count,
                         size_t cut_bytes) {
    write_trace(path, h, count, NULL, 0);
    size_t size = 0;
    char *text = file_read(path, &size);
    size_t keep = size - 1;
    while (keep > 0 && text[keep - 1] != '\n') keep--;  // the completion record's line
    file_write(path, text, keep - cut_bytes);
    free(text);
}

// Runs trace_diff and returns its report; *identical and the status through pointers.
static char *diff(const char *a, const char *b, bool *identical, qt_status *status) {
    char *report = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&report, &size);
    *status = trace_diff(a, b, out, identical);
    fclose(out);
    return report;
}

#define CHECK_DIFF(a, b, expect_identical, expected_report)                                     \
    do {                                                                                        \
        bool same_ = !(expect_identical);                                                       \
        qt_status status_;                                                                      \
        char *report_ = diff(a, b, &same_, &status_);                                           \
        CHECK(status_ == QT_OK, "diff: %s", qt_error_message());                                \
        CHECK(same_ == (expect_identical), "identical = %d", same_);                            \
        CHECK(strcmp(report_, expected_report) == 0, "report:\n%s\nexpected:\n%s", report_,     \
              expected_report);                                                                 \
        free(report_);                                                                          \
    } while (0)

// ---------------------------------------------------------------------------------------------
// formatting

static void test_format_exact(void) {
    test_begin("format_exact");
    qt_trace_record r;
    memset(&r, 0, sizeof r);
    r.step = 12;
    r.mode = QT_TRACE_MODE_TRAIN;
    r.flags = QT_TRACE_FLAG_SKIPPED;
    r.loss = 1.1f;
    r.accuracy = 0.5f;
    r.grad_norm = from_bits(0x7f800000u);
    r.lr = 1e-3f;
    r.checksum = 0xdeadbeefull;  // not printed: the flag says the field holds nothing
    r.amax[0] = 448.0f;
    r.scale[0] = 0.25f;
    r.amax[1] = -0.0f;
    r.scale[1] = from_bits(0x7fc00001u);  // a NaN with a payload: the bits keep it
    r.amax[2] = 7.0f;                     // beyond the count: not printed
    char line[TRACE_LINE_BYTES_MAX];
    size_t n = trace_format_record(&r, 2, line, sizeof line);
    const char *expected =
        "step=12 mode=train flags=0x1:skipped loss=0x3f8ccccd:1.10000002 "
        "accuracy=0x3f000000:0.5 grad_norm=0x7f800000:inf lr=0x3a83126f:0.00100000005 "
        "checksum=- amax.0=0x43e00000:448 scale.0=0x3e800000:0.25 amax.1=0x80000000:-0 "
        "scale.1=0x7fc00001:nan\n";
    CHECK(n == strlen(expected) && strcmp(line, expected) == 0, "got\n%s", line);
    r.step = UINT64_MAX;
    r.mode = QT_TRACE_MODE_INFER;
    r.flags = QT_TRACE_FLAG_SKIPPED | QT_TRACE_FLAG_CHECKSUM | 0x80u;
    r.loss = from_bits(0x00000001u);  // the smallest subnormal
    n = trace_format_record(&r, 0, line, sizeof line);
    expected = "step=18446744073709551615 mode=infer flags=0x83:skipped,checksum "
               "loss=0x00000001:1.40129846e-45 accuracy=0x3f000000:0.5 grad_norm=0x7f800000:inf "
               "lr=0x3a83126f:0.00100000005 checksum=0x00000000deadbeef\n";
    CHECK(strcmp(line, expected) == 0, "got\n%s", line);
    r.mode = 7;
    r.flags = QT_TRACE_FLAG_CHECKSUM;
    trace_format_record(&r, 0, line, sizeof line);
    const char *prefix = "step=18446744073709551615 mode=unknown flags=0x2:checksum loss=";
    CHECK(strncmp(line, prefix, strlen(prefix)) == 0, "got\n%s", line);
    r.flags = 0;
    trace_format_record(&r, 0, line, sizeof line);
    CHECK(strstr(line, " flags=0x0:none ") != NULL, "got\n%s", line);
    // The longest record fits the line limit.
    for (int i = 0; i < QT_TRACE_QUANTIZERS_MAX; i++) {
        r.amax[i] = from_bits(0x80000001u);
        r.scale[i] = -3.40282347e38f;
    }
    n = trace_format_record(&r, QT_TRACE_QUANTIZERS_MAX, line, sizeof line);
    CHECK(n < TRACE_LINE_BYTES_MAX && line[n - 1] == '\n', "%zu bytes", n);
    test_end();
}

static void test_header_exact(void) {
    test_begin("header_exact");
    trace_header h = header_of(0x00c0ffee12345678ull, 2);
    char text[4096];
    size_t n = trace_format_header(&h, text, sizeof text);
    const char *expected = "qtrain-trace 2 recipe=00c0ffee12345678 quantizers=2 checksum_every=4\n"
                           "quantizer 0 linear.weight@fc1\n"
                           "quantizer 1 linear.weight@fc2\n";
    CHECK(n == strlen(expected) && strcmp(text, expected) == 0, "got\n%s", text);
    // FNV-1a 64 of "a" (the published test vector).
    CHECK(trace_hash("a", 1) == 0xaf63dc4c8601ec8cull, "hash %016" PRIx64, trace_hash("a", 1));
    CHECK(trace_hash("", 0) == 0xcbf29ce484222325ull, "empty hash");
    test_end();
}

// The buffered writer's file is the header and the formatted lines, byte for byte, across many
// buffer flushes (400 records of 768 quantizers are about 20 MB).
static void test_writer_file(void) {
    test_begin("writer_file");
    trace_header h = header_of(42, QT_TRACE_QUANTIZERS_MAX);
    write_trace(tmp_path("w.trace"), &h, 400, NULL, 0);
    size_t size = 0;
    char *file = file_read(tmp_path("w.trace"), &size);
    char *expected = malloc(400 * (size_t)TRACE_LINE_BYTES_MAX + TRACE_WRITE_BUFFER_BYTES);
    size_t used = trace_format_header(&h, expected, TRACE_WRITE_BUFFER_BYTES);
    for (uint64_t s = 0; s < 400; s++) {
        qt_trace_record r = record_of(s);
        used += trace_format_record(&r, h.quantizers_count, expected + used,
                                    TRACE_LINE_BYTES_MAX);
    }
    used += (size_t)sprintf(expected + used, "end status=complete records=400\n");
    CHECK(file != NULL && size == used && memcmp(file, expected, used) == 0,
          "file of %zu bytes, expected %zu", size, used);
    CHECK(size > 4 * TRACE_WRITE_BUFFER_BYTES, "only %zu bytes: the buffer never flushed", size);
    free(file), free(expected);
    trace_writer *w = malloc(sizeof *w);
    qt_status status = trace_open(w, "/nonexistent-folder/x.trace", &h, false);
    CHECK(status == QT_ERR_IO && strstr(qt_error_message(), "/nonexistent-folder/x.trace: cannot "
          "create the trace file") != NULL, "%s", qt_error_message());
    free(w);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// diff

static void one_ulp_amax1(qt_trace_record *r) {
    r->amax[1] = from_bits(0x41000001u);  // 8 -> the next float up
}
static void nan_payload(qt_trace_record *r) { r->loss = from_bits(0x7fc00002u); }
static void other_nan(qt_trace_record *r) { r->loss = from_bits(0x7fc00003u); }
static void skip(qt_trace_record *r) { r->flags |= QT_TRACE_FLAG_SKIPPED; }
static void junk_checksum(qt_trace_record *r) { r->checksum = 99; }  // flag unset: no meaning

static void test_diff_identical_and_first_difference(void) {
    test_begin("diff_identical_and_first_difference");
    trace_header h = header_of(7, 3);
    write_trace(tmp_path("a"), &h, 10, NULL, 0);
    write_trace(tmp_path("a2"), &h, 10, NULL, 0);
    write_trace(tmp_path("ulp"), &h, 10, one_ulp_amax1, 3);
    write_trace(tmp_path("nan2"), &h, 10, nan_payload, 6);
    write_trace(tmp_path("nan3"), &h, 10, other_nan, 6);
    write_trace(tmp_path("skip"), &h, 10, skip, 9);
    write_trace(tmp_path("junk"), &h, 10, junk_checksum, 5);
    CHECK_DIFF(tmp_path("a"), tmp_path("a2"), true, "identical: 10 records\n");
    // Lines: 1 header + 3 quantizers, so step 3 is line 8.
    CHECK_DIFF(tmp_path("a"), tmp_path("ulp"), false,
               "first difference at step 3 (line 8 of A, line 8 of B), field amax.1 (quantizer "
               "linear.weight@fc2):\n  A: 0x41000000:8\n  B: 0x41000001:8.00000095\n");
    CHECK_DIFF(tmp_path("nan2"), tmp_path("nan3"), false,
               "first difference at step 6 (line 11 of A, line 11 of B), field loss:\n"
               "  A: 0x7fc00002:nan\n  B: 0x7fc00003:nan\n");
    CHECK_DIFF(tmp_path("a"), tmp_path("skip"), false,
               "first difference at step 9 (line 14 of A, line 14 of B), field flags:\n"
               "  A: 0x0:none\n  B: 0x1:skipped\n");
    CHECK_DIFF(tmp_path("a"), tmp_path("junk"), true, "identical: 10 records\n");
    test_end();
}

static void test_diff_lengths_and_headers(void) {
    test_begin("diff_lengths_and_headers");
    trace_header h = header_of(7, 3), other = header_of(8, 3), renamed = header_of(7, 3);
    snprintf(renamed.quantizer_names[2], TRACE_NAME_MAX, "linear.input@head");
    write_trace(tmp_path("ten"), &h, 10, NULL, 0);
    write_trace(tmp_path("four"), &h, 4, NULL, 0);
    write_trace(tmp_path("none"), &h, 0, NULL, 0);
    write_trace(tmp_path("recipe8"), &other, 10, NULL, 0);
    write_trace(tmp_path("renamed"), &renamed, 10, one_ulp_amax1, 2);
    CHECK_DIFF(tmp_path("ten"), tmp_path("four"), false,
               "B ends after 4 records (its run completed); A goes on with step=4\n");
    CHECK_DIFF(tmp_path("none"), tmp_path("ten"), false,
               "A ends after 0 records (its run completed); B goes on with step=0\n");
    CHECK_DIFF(tmp_path("none"), tmp_path("none"), true, "identical: 0 records\n");
    CHECK_DIFF(tmp_path("ten"), tmp_path("recipe8"), false,
               "header: recipe hash differs: A 0000000000000007, B 0000000000000008 (the runs "
               "used different recipes)\n");
    CHECK_DIFF(tmp_path("ten"), tmp_path("renamed"), false,
               "header: quantizer 2 is linear.weight@fc3 in A, linear.input@head in B\n"
               "first difference at step 2 (line 7 of A, line 7 of B), field amax.1 (quantizer "
               "linear.weight@fc2):\n  A: 0x40c00000:6\n  B: 0x41000001:8.00000095\n");
    test_end();
}

static void expect_diff_error(const char *a, const char *b, qt_status expected,
                              const char *fragment) {
    bool same = true;
    qt_status status;
    free(diff(a, b, &same, &status));
    CHECK(status == expected && strstr(qt_error_message(), fragment) != NULL && !same,
          "expected %s with '%s', got %s: %s", qt_status_name(expected), fragment,
          qt_status_name(status), qt_error_message());
}

static void test_diff_bad_files(void) {
    test_begin("diff_bad_files");
    trace_header h = header_of(7, 1);
    write_trace(tmp_path("good"), &h, 3, NULL, 0);
    expect_diff_error(tmp_path("good"), tmp_path("missing"), QT_ERR_IO, "missing: cannot open");
    write_text(tmp_path("text"), "hello\n");
    expect_diff_error(tmp_path("text"), tmp_path("good"), QT_ERR_INPUT,
                      "text:1: not a qtrain trace: expected 'qtrain-trace 2 recipe=...', found "
                      "'hello'");
    write_text(tmp_path("v1"), "qtrain-trace 1 recipe=0000000000000007 quantizers=1\n");
    expect_diff_error(tmp_path("good"), tmp_path("v1"), QT_ERR_INPUT,
                      "v1:1: trace format version 1; this qtrain reads version 2 (version 1 "
                      "traces have no completion record");
    write_text(tmp_path("q1025"), "qtrain-trace 2 recipe=0000000000000007 quantizers=1025 "
               "checksum_every=4\n");  // one more than QT_TRACE_QUANTIZERS_MAX
    expect_diff_error(tmp_path("q1025"), tmp_path("good"), QT_ERR_INPUT,
                      "q1025:1: malformed header");
    write_text(tmp_path("noq"), "qtrain-trace 2 recipe=0000000000000007 quantizers=1 "
               "checksum_every=4\nstep=0 mode=train\n");
    expect_diff_error(tmp_path("noq"), tmp_path("good"), QT_ERR_INPUT,
                      "noq:2: expected 'quantizer 0 NAME', found 'step=0 mode=train'");
    write_text(tmp_path("badrec"), "qtrain-trace 2 recipe=0000000000000007 quantizers=1 "
               "checksum_every=4\nquantizer 0 linear.weight@fc1\nhello\n");
    expect_diff_error(tmp_path("good"), tmp_path("badrec"), QT_ERR_INPUT,
                      "badrec:3: expected a record line 'step=N ...' or the completion record "
                      "'end status=...', found 'hello'");
    char *huge = malloc(TRACE_LINE_BYTES_MAX + 64);
    memset(huge, 'x', TRACE_LINE_BYTES_MAX + 62);
    huge[TRACE_LINE_BYTES_MAX + 62] = '\n';
    huge[TRACE_LINE_BYTES_MAX + 63] = '\0';
    write_text(tmp_path("huge"), huge);
    free(huge);
    expect_diff_error(tmp_path("huge"), tmp_path("good"), QT_ERR_INPUT,
                      "huge:1: line longer than 131072 bytes");
    test_end();
}

// Records that differ only after a NUL byte: the NUL is refused (qtrain writes none), so the
// difference can never pass for identical.
static void test_diff_nul_byte(void) {
    test_begin("diff_refuses_nul_bytes");
    trace_header h = header_of(7, 1);
    write_trace(tmp_path("n0"), &h, 6, NULL, 0);
    size_t size = 0;
    char *text = file_read(tmp_path("n0"), &size);
    char *line = strstr(text, "\nstep=3 ") + 1;
    char *lr = strstr(line, " lr=");
    lr[0] = '\0';  // the rest of the record follows the NUL byte
    file_write(tmp_path("n1"), text, size);
    lr[5] ^= 1;     // a bit after the NUL byte
    file_write(tmp_path("n2"), text, size);
    free(text);
    expect_diff_error(tmp_path("n1"), tmp_path("n2"), QT_ERR_INPUT, "n1:6:");
    CHECK(strstr(qt_error_message(), "a NUL byte; qtrain writes none into a trace") != NULL,
          "%s", qt_error_message());
    expect_diff_error(tmp_path("n0"), tmp_path("n2"), QT_ERR_INPUT, "n2:6:");
    expect_diff_error(tmp_path("n1"), tmp_path("n1"), QT_ERR_INPUT, "a NUL byte");
    test_end();
}

// A killed run's trace (no completion record, maybe a cut line) against a complete one: never
// identical, and the report says which is cut short.
static void test_diff_truncated(void) {
    test_begin("diff_reports_truncated_traces");
    trace_header h = header_of(7, 1);
    write_trace(tmp_path("full10"), &h, 10, NULL, 0);
    write_killed(tmp_path("killed15"), &h, 15, 0);
    write_killed(tmp_path("killed10"), &h, 10, 0);
    write_killed(tmp_path("killed10b"), &h, 10, 0);
    write_killed(tmp_path("cut10"), &h, 10, 20);
    write_trace_ended(tmp_path("stopped10"), &h, 10, NULL, 0, TRACE_END_STOPPED);
    CHECK_DIFF(tmp_path("full10"), tmp_path("killed15"), false,
               "A ends after 10 records (its run completed); B goes on with step=10\n"
               "B is cut short: 15 records and no completion record (its run was killed, or is "
               "still running)\n");
    CHECK_DIFF(tmp_path("killed10"), tmp_path("full10"), false,
               "records equal (10), but the traces end differently: A (cut short: no completion "
               "record), B (its run completed)\n"
               "A is cut short: 10 records and no completion record (its run was killed, or is "
               "still running)\n");
    CHECK_DIFF(tmp_path("full10"), tmp_path("cut10"), false,
               "B ends after 9 records (cut short: no completion record); A goes on with step=9\n"
               "B is cut short: 9 records, a last line without its end, and no completion record "
               "(its run was killed, or is still running)\n");
    CHECK_DIFF(tmp_path("stopped10"), tmp_path("full10"), false,
               "records equal (10), but the traces end differently: A (its run was stopped by a "
               "signal), B (its run completed)\n");
    CHECK_DIFF(tmp_path("killed10"), tmp_path("killed10b"), true,
               "identical: 10 records (both cut short: neither has a completion record)\n");
    // A completion record must be last and count the file's records.
    size_t size = 0;
    char *text = file_read(tmp_path("full10"), &size);
    file_write(tmp_path("after_end"), text, size);
    FILE *f = fopen(tmp_path("after_end"), "ab");
    fputs("step=10 mode=train\n", f);
    fclose(f);
    expect_diff_error(tmp_path("full10"), tmp_path("after_end"), QT_ERR_INPUT,
                      "after_end:14: a line after the completion record of line 13");
    char *count = strstr(text, "records=10");
    count[9] = '2';  // "records=12"
    file_write(tmp_path("miscount"), text, size);
    free(text);
    expect_diff_error(tmp_path("miscount"), tmp_path("full10"), QT_ERR_INPUT,
                      "miscount:13: the completion record counts 12 records, the file has 10");
    test_end();
}

// --trace replaces a trace or an empty file, never another file without --force, and never
// what is not a regular file.
static void test_writer_replaces_only_traces(void) {
    test_begin("writer_replaces_only_traces");
    trace_header h = header_of(7, 1);
    trace_writer *w = malloc(sizeof *w);
    const char *keep = tmp_path("keep.txt");
    file_write(keep, "precious", 8);
    qt_status s = trace_check_output(keep, false);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "keep.txt exists and is not a qtrain "
          "trace") && strstr(qt_error_message(), "--force"), "check: %s", qt_error_message());
    s = trace_open(w, keep, &h, false);
    size_t size = 0;
    char *text = file_read(keep, &size);
    CHECK(s == QT_ERR_INPUT && size == 8 && memcmp(text, "precious", 8) == 0,
          "open: %s; %zu bytes left", qt_error_message(), size);
    free(text);
    s = trace_open(w, keep, &h, true);
    CHECK(s == QT_OK, "--force: %s", qt_error_message());
    if (s == QT_OK) trace_close(w, TRACE_END_COMPLETE);
    write_trace(tmp_path("old.trace"), &h, 5, NULL, 0);
    CHECK(trace_check_output(tmp_path("old.trace"), false) == QT_OK, "%s", qt_error_message());
    write_trace(tmp_path("old.trace"), &h, 2, NULL, 0);  // replaced: two records now
    CHECK_DIFF(tmp_path("old.trace"), keep, false,
               "B ends after 0 records (its run completed); A goes on with step=0\n");
    file_write(tmp_path("empty"), "", 0);
    CHECK(trace_check_output(tmp_path("empty"), false) == QT_OK, "%s", qt_error_message());
    const char *fifo = tmp_path("fifo");
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
    s = trace_check_output(fifo, true);
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "fifo is a FIFO (named pipe), not a "
          "regular file"), "%s", qt_error_message());
    s = trace_open(w, fifo, &h, true);  // must not block: no reader
    CHECK(s == QT_ERR_INPUT, "%s", qt_error_message());
    s = trace_open(w, tmp_dir, &h, true);
    CHECK(s != QT_OK, "a directory: %s", qt_status_name(s));
    expect_diff_error(fifo, tmp_path("old.trace"), QT_ERR_INPUT, "fifo is a FIFO (named pipe), "
                      "not a regular file; qtrain reads a trace from a regular file only");
    free(w);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Reading records back

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_reader_round_trip(void) {
    test_begin("reader_parses_every_field_back");
    trace_header h = header_of(7, 3);
    write_trace(tmp_path("read"), &h, 12, nan_payload, 5);
    trace_reader *r = malloc(sizeof *r);
    qt_status status = trace_reader_open(r, tmp_path("read"));
    CHECK(status == QT_OK && r->header.quantizers_count == 3 && r->header.recipe_hash == 7 &&
              strcmp(r->header.quantizer_names[2], "linear.weight@fc3") == 0, "header: %s",
          qt_error_message());
    uint64_t count = 0;
    bool have = status == QT_OK;
    while (have) {
        qt_trace_record got;
        status = trace_reader_next(r, &got, &have);
        CHECK(status == QT_OK, "%s", qt_error_message());
        if (status != QT_OK || !have) break;
        qt_trace_record want = record_of(count);
        if (count == 5) nan_payload(&want);
        bool checksum = want.flags & QT_TRACE_FLAG_CHECKSUM;
        bool same = got.step == want.step && got.mode == want.mode && got.flags == want.flags &&
                    same_bits(got.loss, want.loss) && same_bits(got.accuracy, want.accuracy) &&
                    same_bits(got.grad_norm, want.grad_norm) && same_bits(got.lr, want.lr) &&
                    got.checksum == (checksum ? want.checksum : 0);
        for (int i = 0; i < 3; i++) {
            same = same && same_bits(got.amax[i], want.amax[i]) &&
                   same_bits(got.scale[i], want.scale[i]);
        }
        CHECK(same, "record %" PRIu64 " differs", count);
        count++;
    }
    CHECK(count == 12, "%" PRIu64 " records", count);
    trace_reader_close(r);
    write_text(tmp_path("badfield"), "qtrain-trace 2 recipe=0000000000000007 quantizers=0 "
               "checksum_every=4\nstep=0 mode=train flags=0x0:none loss=1.5 accuracy=0x0:0\n");
    status = trace_reader_open(r, tmp_path("badfield"));
    qt_trace_record rec;
    if (status == QT_OK) {
        status = trace_reader_next(r, &rec, &have);
        trace_reader_close(r);
    }
    CHECK(status == QT_ERR_INPUT && strstr(qt_error_message(), "badfield:2: malformed record"),
          "%s", qt_error_message());
    free(r);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Golden-trace replay

static trace_checker checker;
static char *golden_memory;

static qt_status check_load(const char *path) {
    uint64_t bytes = 0;
    QT_TRY(trace_check_bytes(path, &bytes));
    free(golden_memory);
    golden_memory = malloc(bytes);
    return trace_check_load(&checker, path, golden_memory, bytes);
}

// Feeds `count` records of record_of (with `edit` at edit_step) to the checker; returns the
// first failure (or the end check's result when `end`).
static qt_status check_run(const trace_header *h, uint64_t count, void (*edit)(qt_trace_record *),
                           uint64_t edit_step, bool end) {
    QT_TRY(trace_check_header(&checker, h));
    for (uint64_t s = 0; s < count; s++) {
        qt_trace_record r = record_of(s);
        if (edit != NULL && s == edit_step) edit(&r);
        QT_TRY(trace_check_record(&checker, &r));
    }
    return end ? trace_check_end(&checker) : QT_OK;
}

#define CHECK_REPLAY(status, expected_status, expected_message)                              \
    CHECK((status) == (expected_status) && strcmp(qt_error_message(), expected_message) == 0,  \
          "%s: %s\nexpected: %s", qt_status_name(status), qt_error_message(), expected_message)

static void test_check_against_golden(void) {
    test_begin("check_against_golden_trace");
    trace_header h = header_of(7, 3), other = header_of(8, 3);
    const char *g = tmp_path("golden");
    write_trace(g, &h, 10, NULL, 0);
    qt_status s = check_load(g);
    CHECK(s == QT_OK, "%s", qt_error_message());
    CHECK(check_run(&h, 10, NULL, 0, true) == QT_OK, "identical run: %s", qt_error_message());
    char expected[1024];
    check_load(g);
    snprintf(expected, sizeof expected, "%s: the run diverges from the golden trace at step 3 "
             "(line 8 of the golden trace), field amax.1 (quantizer linear.weight@fc2):\n"
             "  golden: 0x41000000:8\n  run:    0x41000001:8.00000095", g);
    CHECK_REPLAY(check_run(&h, 10, one_ulp_amax1, 3, true), QT_ERR_MISMATCH, expected);
    check_load(g);
    snprintf(expected, sizeof expected, "%s: the run diverges from the golden trace at step 9 "
             "(line 14 of the golden trace), field flags:\n  golden: 0x0:none\n"
             "  run:    0x1:skipped", g);
    CHECK_REPLAY(check_run(&h, 10, skip, 9, true), QT_ERR_MISMATCH, expected);
    check_load(g);
    snprintf(expected, sizeof expected, "%s: the run ended after 4 records; the golden trace "
             "goes on with step=4 (line 9)", g);
    CHECK_REPLAY(check_run(&h, 4, NULL, 0, true), QT_ERR_MISMATCH, expected);
    check_load(g);
    snprintf(expected, sizeof expected, "%s: the golden trace ends after 10 records; the run "
             "goes on with step=10", g);
    CHECK_REPLAY(check_run(&h, 11, NULL, 0, true), QT_ERR_MISMATCH, expected);
    check_load(g);
    snprintf(expected, sizeof expected, "%s: the run does not match the golden trace before its "
             "first step: header: recipe hash differs: golden 0000000000000007, run "
             "0000000000000008 (the runs used different recipes)", g);
    CHECK_REPLAY(check_run(&other, 1, NULL, 0, true), QT_ERR_MISMATCH, expected);
    test_end();
}

static void test_check_bad_golden(void) {
    test_begin("check_refuses_bad_golden_traces");
    trace_header h = header_of(7, 1);
    write_trace(tmp_path("g1"), &h, 6, NULL, 0);
    size_t size = 0;
    char *good = file_read(tmp_path("g1"), &size);
    good[size - 10] = '\0';
    write_text(tmp_path("gcut"), good);
    free(good);
    qt_status s = check_load(tmp_path("gcut"));
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "gcut:9: the last line has no end: the "
          "golden trace is cut short"), "%s", qt_error_message());
    // Whole lines but no completion record: a killed run's trace.
    write_killed(tmp_path("gkilled"), &h, 6, 0);
    s = check_load(tmp_path("gkilled"));
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "gkilled: no completion record at its "
          "end: the golden trace is cut short"), "%s", qt_error_message());
    write_text(tmp_path("gtext"), "hello\n");
    s = check_load(tmp_path("gtext"));
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "not a qtrain trace"), "%s",
          qt_error_message());
    s = check_load(tmp_path("gmissing"));
    CHECK(s == QT_ERR_IO && strstr(qt_error_message(), "gmissing: cannot open the golden trace"),
          "%s", qt_error_message());
    free(golden_memory);
    golden_memory = NULL;
    test_end();
}

int main(void) {
    if (!tmp_dir_make("trace")) {
        printf("FAIL test_trace: cannot create a temporary folder\n");
        return 1;
    }
    test_format_exact();
    test_header_exact();
    test_writer_file();
    test_diff_identical_and_first_difference();
    test_diff_lengths_and_headers();
    test_diff_bad_files();
    test_diff_nul_byte();
    test_diff_truncated();
    test_writer_replaces_only_traces();
    test_reader_round_trip();
    test_check_against_golden();
    test_check_bad_golden();
    tmp_dir_remove();
    return test_exit_code();
}
