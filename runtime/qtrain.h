// qtrain public API: the embedding interface of the qtrain runtime.
//
// Owns nothing by itself: every object named here lives in caller-provided storage or in the
// runtime struct. Any thread may call the status functions; the rest is single-threaded per
// runtime instance.
#ifndef QTRAIN_H
#define QTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The release, `qtrain --version`. The file formats carry versions of their own (TRACE_VERSION,
// CKPT_VERSION), which the version line also names.
#define QTRAIN_VERSION "0.1.0"

// Operating errors: returned, never asserted. Each failing call leaves a message (file:line:col
// for input errors, the driver's own text for driver errors) in a per-thread buffer.
typedef enum qt_status {
    QT_OK = 0,
    QT_ERR_INPUT,      // a recipe, an argument or a file's contents is malformed
    QT_ERR_IO,         // a file cannot be opened, read or written
    QT_ERR_NO_DRIVER,  // libcuda.so.1 cannot be loaded, or an entry point is missing
    QT_ERR_NO_DEVICE,  // the driver loaded but reports no usable GPU
    QT_ERR_DRIVER,     // a driver call failed
    QT_ERR_CAPACITY,   // a fixed-capacity table (a `*_max` limit) is full
    QT_ERR_MEMORY,     // an arena does not fit in the memory available
    QT_ERR_MISMATCH,   // loaded state (checkpoint, module, trace) does not match what is expected
    QT_STATUS_COUNT
} qt_status;

// Short upper-case name of a status ("QT_ERR_INPUT").
const char *qt_status_name(qt_status status);
// Detail of the last failure on this thread; "" after success paths that cleared it.
const char *qt_error_message(void);

#endif  // QTRAIN_H
