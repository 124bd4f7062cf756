// fuzz: what a fuzz harness provides and may use. A harness is libFuzzer-compatible (it defines
// LLVMFuzzerTestOneInput, and LLVMFuzzerInitialize when it needs set-up) and also links with
// tests/fuzz/driver.c, a deterministic driver of our own that builds with gcc: it runs every
// file of a seed corpus, then a fixed number of mutations of them from a fixed seed, so a run is
// reproducible and bounded (`ninja test` runs each harness briefly, `ninja fuzz` longer).
//
// Owns nothing but the harness's temporary folder (fuzz_path, removed at exit). Test code: it
// may allocate. The helpers below are in tests/fuzz/fuzz.c, which links with either driver. A
// harness checks the invariants of what it calls (a clean status or a message, no read past
// its input): a crash, a sanitizer report, an assertion or a hang is a failure, and the driver
// keeps the input that caused it.
#ifndef QT_FUZZ_H
#define QT_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

// Words the driver splices into inputs (tokens of the format), defined by every harness.
extern const char *const fuzz_words[];
extern const size_t fuzz_words_count;

// A path in the harness's temporary folder (made at first use, removed at exit); the last 8
// paths stay valid.
const char *fuzz_path(const char *name);
// Writes size bytes to path (aborts when it cannot: the harness's own failure).
void fuzz_write(const char *path, const void *data, size_t size);
// Fails the run: prints the message (an invariant of the code under test that does not hold)
// and aborts, which the driver reports with the input.
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

// Little-endian readers of a harness's input framing; 0 past the end.
uint32_t fuzz_u32(const uint8_t *data, size_t size, size_t at);

#endif  // QT_FUZZ_H
