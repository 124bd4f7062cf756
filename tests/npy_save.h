// npy_save: writes an array as an .npy file through runtime/io/npy.h, for the test programs.
#ifndef QT_TEST_NPY_SAVE_H
#define QT_TEST_NPY_SAVE_H

#include <stdio.h>
#include <stdlib.h>

#include "runtime/io/npy.h"

// rows x cols values of dtype (rank 1: cols = 1), replacing the file; aborts on failure.
static inline void npy_save(const char *path, npy_dtype dtype, uint32_t rank, uint64_t rows,
                            uint64_t cols, const void *data) {
    npy_writer w;
    uint64_t shape[2] = {rows, cols};
    qt_status s = npy_create(&w, path, dtype, rank, shape, true, "--force");
    if (s == QT_OK) s = npy_write(&w, data, rows * cols * npy_dtype_bytes(dtype));
    if (s == QT_OK) s = npy_commit(&w);
    if (s != QT_OK) {
        printf("  cannot write %s: %s\n", path, qt_error_message());
        abort();
    }
}

#endif  // QT_TEST_NPY_SAVE_H
