// status: operating-error reporting (qt_status + a per-thread message) and the QT_ASSERT macro for
// programmer errors.
//
// Owns one message buffer per thread, valid until the next qt_fail on that thread. Every module
// may call it.
#ifndef QT_STATUS_H
#define QT_STATUS_H

#include "runtime/qtrain.h"  // qt_status

#define QT_ERROR_MESSAGE_MAX 1024

// Records a formatted message for `status` and returns `status`, so callers write
// `return qt_fail(QT_ERR_INPUT, "%s:%d:%d: unknown key '%s'", ...)`. Bytes that would not show
// are escaped (qt_escape), so text quoted from a file or an argument reads as it is; line
// breaks stay (a report may span lines).
qt_status qt_fail(qt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Copies text[0 .. bytes) into out (always NUL-terminated; cut at an escape's boundary when out
// is full) with everything a terminal would not show as itself escaped: \t, \r, \n (unless
// keep_newlines) and other control bytes as \xNN, bytes that are not UTF-8 as \xNN, and
// invisible or blank-looking characters (no-break space, zero-width characters, the byte-order
// mark, bidirectional marks, C1 controls, ...) as <U+FEFF>. Visible UTF-8 stays as it is.
// Returns the length written.
size_t qt_escape(const char *text, size_t bytes, char *out, size_t out_bytes, bool keep_newlines);
// qt_shown (runtime/qtrain.h): a NUL-terminated text escaped as qt_escape does (line breaks
// too), in one of QT_SHOWN_BUFFERS buffers of this thread.
void qt_error_clear(void);

// A whole-number setting from the environment, refused like any bad input: `variable` unset or
// empty gives `fallback`; a number from 0 to `max` is taken; anything else is QT_ERR_INPUT with
// a message that names the variable, what it sets (`meaning`) and the range.
qt_status qt_env_u32(const char *variable, const char *meaning, uint32_t fallback, uint32_t max,
                     uint32_t *value);
// A 0-or-1 setting (qt_env_u32 with max 1): *on when it is 1, or unset and `fallback`.
qt_status qt_env_switch(const char *variable, const char *meaning, bool fallback, bool *on);

// Programmer errors: a broken invariant aborts with file:line:expression.
_Noreturn void qt_assert_fail(const char *file, int line, const char *expr);
#define QT_ASSERT(expr) ((expr) ? (void)0 : qt_assert_fail(__FILE__, __LINE__, #expr))

// Propagates a failure status to the caller; the message is already recorded.
#define QT_TRY(call)                          \
    do {                                      \
        qt_status qt_try_status_ = (call);    \
        if (qt_try_status_ != QT_OK) return qt_try_status_; \
    } while (0)

#endif  // QT_STATUS_H
