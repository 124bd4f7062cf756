// Fuzz harness of the trace readers (runtime/io/trace.h): the record reader of `qtrain plot`, the
// comparison of `qtrain diff` and the golden trace of `qtrain run --check`. Any bytes are either
// read or refused with a status of the readers and a message; a trace that reads compares equal
// to itself, and its records, checked against the same file as a golden trace, match it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "runtime/io/trace.h"

const char *const fuzz_words[] = {
    "qtrain-trace 1 recipe=", "0123456789abcdef", " quantizers=", " checksum_every=",
    "quantizer 0 linear.input@fc1\n", "quantizer 1 ", "step=", " mode=train", " mode=eval",
    " mode=infer", " flags=0x0:none", " flags=0x3:skipped,checksum", " flags=0x2:checksum",
    " loss=0x3f800000:1", " accuracy=0x00000000:0", " grad_norm=0x7fc00000:nan", " lr=",
    " checksum=-", " checksum=0x0123456789abcdef", " amax.0=0x43e00000:448",
    " scale.0=0x3e800000:0.25", "0x7f800000:inf", "0xff800000:-inf", "0x00000001:1.40129846e-45",
    "\n", " ", "=", ":",
};
const size_t fuzz_words_count = sizeof fuzz_words / sizeof fuzz_words[0];

static void check_status(qt_status s, const char *what) {
    if (s != QT_OK && s != QT_ERR_INPUT && s != QT_ERR_IO && s != QT_ERR_MISMATCH) {
        fuzz_fail("%s: %s: %s", what, qt_status_name(s), qt_error_message());
    }
    if (s != QT_OK && qt_error_message()[0] == '\0') fuzz_fail("%s: no message", what);
}

static FILE *null_out;
static trace_reader reader;
static trace_checker checker;
static qt_trace_record rec;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    null_out = fopen("/dev/null", "w");
    return 0;
}

// The golden-trace checker over the file, fed the file's own records.
static void check_against_itself(const char *path) {
    uint64_t bytes = 0;
    qt_status s = trace_check_bytes(path, &bytes);
    check_status(s, "trace_check_bytes");
    if (s != QT_OK || bytes > (64u << 20)) return;
    char *memory = malloc(bytes ? bytes : 1);
    s = trace_check_load(&checker, path, memory, bytes);
    check_status(s, "trace_check_load");
    if (s == QT_OK) s = trace_check_header(&checker, &checker.golden);
    check_status(s, "trace_check_header");
    bool opened = s == QT_OK && trace_reader_open(&reader, path) == QT_OK, have = opened;
    while (have && s == QT_OK) {
        if (trace_reader_next(&reader, &rec, &have) != QT_OK || !have) break;
        s = trace_check_record(&checker, &rec);
        check_status(s, "trace_check_record");
    }
    if (opened) trace_reader_close(&reader);
    free(memory);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("a.trace");
    fuzz_write(path, data, size);
    qt_status s = trace_reader_open(&reader, path);
    check_status(s, "trace_reader_open");
    if (s == QT_OK) {
        bool have = true;
        for (uint32_t n = 0; have && n < 1000000; n++) {
            s = trace_reader_next(&reader, &rec, &have);
            check_status(s, "trace_reader_next");
            if (s != QT_OK) break;
        }
        trace_reader_close(&reader);
    }
    bool identical = false;
    s = trace_diff(path, path, null_out, &identical);
    check_status(s, "trace_diff");
    if (s == QT_OK && !identical) fuzz_fail("a trace differs from itself");
    check_against_itself(path);
    return 0;
}
