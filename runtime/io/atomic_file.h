// atomic_file: files that appear whole or not at all, and never replace a file by surprise.
//
// Owns one file descriptor and two paths inside the caller's atomic_file, from atomic_file_create
// until atomic_file_commit or atomic_file_abandon. Callers: every writer of a result file (.npy
// outputs, `qtrain plot`'s SVG, checkpoints, safetensors exports). One thread per file. No
// allocation.
//
//   atomic_file_create   refuses a PATH that is not a regular file, and an existing one unless
//                        `replace`, then creates PATH.tmp-PID in the same folder (O_EXCL: never
//                        an existing file)
//   atomic_file_write    appends to the temporary file (write, retried on EINTR)
//   atomic_file_commit   fsync the temporary file, give it its name, fsync the folder
//   atomic_file_abandon  close and remove the temporary file (after any failure)
//
// Giving the name: with `replace`, rename(2), which swaps the file in one step; without it,
// link(2) then unlink of the temporary name, because link fails when PATH exists, so a file that
// appeared after atomic_file_create is still not replaced. A crash at any point leaves either the
// old state or the complete new file (plus, at worst, a PATH.tmp-PID to delete).
#ifndef QT_ATOMIC_FILE_H
#define QT_ATOMIC_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/base/status.h"  // qt_status

#define ATOMIC_FILE_PATH_MAX 4096  // terminator and the ".tmp-PID" suffix included

typedef struct atomic_file {
    bool open;                         // a temporary file exists and fd is its descriptor
    int fd;
    bool replace;
    uint64_t bytes;                    // written so far
    char path[ATOMIC_FILE_PATH_MAX];
    char temp[ATOMIC_FILE_PATH_MAX];
} atomic_file;

// QT_ERR_INPUT when path exists and replace is false (the message names the flag to pass,
// `replace_hint`, e.g. "--force") or the path is too long; QT_ERR_IO when the folder is missing or
// not writable.
qt_status atomic_file_create(atomic_file *f, const char *path, bool replace,
                             const char *replace_hint);
qt_status atomic_file_write(atomic_file *f, const void *bytes, size_t n);
// fsync of the temporary file (atomic_file_commit does it too): the data is on disk before the
// caller goes on, e.g. to report it.
qt_status atomic_file_sync(atomic_file *f);
// On failure the temporary file is removed and PATH is as it was.
qt_status atomic_file_commit(atomic_file *f);
// Safe on a zeroed atomic_file and on one that was committed or abandoned already.
void atomic_file_abandon(atomic_file *f);

// Whether something exists at path.
bool atomic_file_exists(const char *path);
// atomic_file_create's refusals, without creating anything (the early check, before any work is
// done): QT_ERR_INPUT when path exists and replace is false, and, even with replace, when it is
// not a regular file (a directory, a FIFO, a device: the rename would replace the entry itself,
// and a FIFO or a device is not a file whose content can be replaced).
qt_status atomic_file_check(const char *path, bool replace, const char *replace_hint);

#endif  // QT_ATOMIC_FILE_H
