#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>  // abort

static _Thread_local char status_message[QT_ERROR_MESSAGE_MAX];

static const char *const status_names[QT_STATUS_COUNT] = {
    [QT_OK] = "QT_OK",
    [QT_ERR_INPUT] = "QT_ERR_INPUT",
    [QT_ERR_IO] = "QT_ERR_IO",
    [QT_ERR_NO_DRIVER] = "QT_ERR_NO_DRIVER",
    [QT_ERR_NO_DEVICE] = "QT_ERR_NO_DEVICE",
    [QT_ERR_DRIVER] = "QT_ERR_DRIVER",
    [QT_ERR_CAPACITY] = "QT_ERR_CAPACITY",
    [QT_ERR_MEMORY] = "QT_ERR_MEMORY",
    [QT_ERR_MISMATCH] = "QT_ERR_MISMATCH",
    [QT_ERR_STATE] = "QT_ERR_STATE",
};

const char *qt_status_name(qt_status status) {
    if ((unsigned)status >= QT_STATUS_COUNT) return "QT_ERR_UNKNOWN";
    return status_names[status];
}

const char *qt_error_message(void) { return status_message; }

void qt_error_clear(void) { status_message[0] = '\0'; }

qt_status qt_fail(qt_status status, const char *fmt, ...) {
    QT_ASSERT(status != QT_OK);
    va_list args;
    va_start(args, fmt);
    vsnprintf(status_message, sizeof status_message, fmt, args);
    va_end(args);
    return status;
}

void qt_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
