// npy: NumPy .npy files: 1-D and 2-D arrays of float32, uint8, int32 and int64, read and written
// without allocation.
//
// Owns nothing but the caller's structs: an npy_reader holds a file descriptor from npy_open to
// npy_close, an npy_writer an atomic_file from npy_create to npy_commit or npy_abandon. Callers:
// the data module (datasets and `qtrain infer` inputs, at start-up), the infer outputs (during
// the step loop), tests. One thread per file.
//
// The format (NumPy's "NPY format" version 1.0; 2.0 and 3.0 are read too):
//
//   0           6       7       8                    10 (v1), 12 (v2, v3)     data_offset
//   +-----------+-------+-------+--------------------+------------------------+--------------+
//   | \x93NUMPY | major | minor | header length, LE: | header: a dict, spaces | data in C    |
//   |           |       |       | u16 (v1), u32      | and a \n               | order        |
//   +-----------+-------+-------+--------------------+------------------------+--------------+
//   the header is a Python dict literal, padded with spaces and ended by \n so that the data
//   starts at a multiple of 64 (what this module writes; any offset is read):
//   {'descr': '<f4', 'fortran_order': False, 'shape': (10000, 10), }
//
// Reading is strict, since the files come from elsewhere: the dict must hold exactly the three
// keys, `descr` one of '<f4' (float32), '|u1' (uint8), '<i4' (int32), '<i8' (int64) (multi-byte
// types little-endian: every machine qtrain runs on is), `fortran_order` False, a shape of rank 1
// or 2, and the file's size must be the header plus exactly the bytes the shape describes (a
// truncated file is caught before anything is read). What the caller accepts (rank and dtypes of
// a role) is checked in the same place, and every refusal names the file, what was found, what
// is accepted and how to convert it.
#ifndef QT_NPY_H
#define QT_NPY_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/io/atomic_file.h"  // atomic_file
#include "runtime/base/status.h"     // qt_status

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_BYTES 6
#define NPY_ALIGN 64                 // data offset of the files this module writes
#define NPY_HEADER_BYTES_MAX 16384   // dicts longer than this are refused (NumPy's own: 10000)
#define NPY_DIM_MAX (UINT64_C(1) << 40)

typedef enum npy_dtype {
    NPY_DTYPE_F32,
    NPY_DTYPE_U8,
    NPY_DTYPE_I32,
    NPY_DTYPE_I64,
    NPY_DTYPE_COUNT
} npy_dtype;

#define NPY_DTYPE_BIT(d) (1u << (d))

typedef struct npy_info {
    npy_dtype dtype;
    uint32_t rank;          // 1 or 2
    uint64_t shape[2];      // rank 1: (shape[0]) and shape[1] = 1
    uint64_t data_offset;   // bytes before the data
    uint64_t data_bytes;    // shape[0] * shape[1] * npy_dtype_bytes(dtype)
} npy_info;

// What a role accepts, by rank: dtypes[1] for 1-D arrays, dtypes[2] for 2-D ones (bits of
// NPY_DTYPE_BIT; 0: that rank is refused). role names the array in messages ("FEATURES").
typedef struct npy_expect {
    const char *role;
    uint32_t dtypes[3];
} npy_expect;

typedef struct npy_reader {
    const char *path;
    int fd;
    npy_info info;
    uint64_t done;          // data bytes read so far
} npy_reader;

typedef struct npy_writer {
    atomic_file file;
    uint64_t data_bytes;    // what the shape promises
    uint64_t header_bytes;
} npy_writer;

uint32_t npy_dtype_bytes(npy_dtype dtype);
// '<f4', '|u1', '<i4', '<i8'.
const char *npy_dtype_descr(npy_dtype dtype);
// "float32", "uint8", "int32", "int64".
const char *npy_dtype_name(npy_dtype dtype);

// Opens the file, reads and checks its header and its size against expect; r->info describes
// the array and the data follow. QT_ERR_IO when the file cannot be opened or read, QT_ERR_INPUT
// for anything else (not an .npy file, a malformed or unsupported header, a dtype or rank the
// role does not take, a truncated file, trailing bytes). Nothing is open after a failure.
qt_status npy_open(npy_reader *r, const char *path, const npy_expect *expect);
// The next `bytes` bytes of data (QT_ERR_INPUT if the file ends first: it changed while read).
qt_status npy_read(npy_reader *r, void *dst, uint64_t bytes);
void npy_close(npy_reader *r);

// npy_open and npy_close: the header alone.
qt_status npy_probe(const char *path, const npy_expect *expect, npy_info *info);

// Formats the header of an array (magic to the \n before the data) into out and returns its
// length, a multiple of NPY_ALIGN; out must hold NPY_ALIGN * 4 bytes.
uint32_t npy_format_header(npy_dtype dtype, uint32_t rank, const uint64_t shape[2], char *out);

// Starts PATH as an atomic file (atomic_file.h: refused when it exists unless replace; the
// message names replace_hint) and writes the header; then npy_write the data in C order, and
// npy_commit, which checks that exactly the promised bytes came.
qt_status npy_create(npy_writer *w, const char *path, npy_dtype dtype, uint32_t rank,
                     const uint64_t shape[2], bool replace, const char *replace_hint);
qt_status npy_write(npy_writer *w, const void *data, uint64_t bytes);
qt_status npy_commit(npy_writer *w);
void npy_abandon(npy_writer *w);

#endif  // QT_NPY_H
