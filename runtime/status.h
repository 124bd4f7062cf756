// status: operating-error reporting (qt_status + a per-thread message) and the QT_ASSERT macro for
// programmer errors.
//
// Owns one message buffer per thread, valid until the next qt_fail on that thread. Every module
// may call it.
#ifndef QT_STATUS_H
#define QT_STATUS_H

#include "qtrain.h"  // qt_status

#define QT_ERROR_MESSAGE_MAX 1024

// Records a formatted message for `status` and returns `status`, so callers write
// `return qt_fail(QT_ERR_INPUT, "%s:%d:%d: unknown key '%s'", ...)`.
qt_status qt_fail(qt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qt_error_clear(void);

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
