// input_file: opening the files qtrain reads (recipes, datasets, traces, checkpoints, inputs)
// only when they are regular files.
//
// Owns nothing: input_file_open hands its descriptor to the caller, who closes it. Callers: the
// recipe loader, the data and .npy readers, the trace readers, the checkpoint reader, the CLI.
// Any thread. No allocation.
//
// Why regular files only: a FIFO (named pipe) blocks open and read until a writer comes, maybe
// forever, and is read once, so the recipe's hash, a probe and the load that follows it would
// see different bytes; a directory or a device is never what was meant. The kind is checked
// with stat before opening (opening a FIFO is what blocks), and again on the open descriptor,
// which is opened non-blocking so that a FIFO swapped in between cannot block it either. Every
// refusal names the file, what it is, and what is expected.
#ifndef QT_INPUT_FILE_H
#define QT_INPUT_FILE_H

#include <stddef.h>  // size_t
#include <stdint.h>
#include <sys/types.h>  // mode_t

#include "runtime/base/status.h"  // qt_status

// "a FIFO (named pipe)", "a directory", "a character device", ... for st_mode's file type.
const char *input_file_kind(mode_t mode);

// Opens path for reading. `what` names the role in messages ("recipe", "dataset", "trace").
// QT_ERR_INPUT when it exists but is not a regular file; QT_ERR_IO when it cannot be opened
// (the message ends with `hint` when it is not NULL, e.g. where the path comes from). *bytes
// gets the file's size.
qt_status input_file_open(const char *path, const char *what, const char *hint, int *fd,
                          uint64_t *bytes);

// Clears O_NONBLOCK on a descriptor opened with it (so as not to block on a FIFO) once it is
// known to be a regular file, so that its reads and writes are plain ones.
void input_file_blocking(int fd);

// Reads the whole file into buffer[0 .. *bytes): QT_ERR_CAPACITY when it holds more than
// buffer_bytes (the message names the limit), else as input_file_open.
qt_status input_file_read(const char *path, const char *what, char *buffer, size_t buffer_bytes,
                          size_t *bytes);

#endif  // QT_INPUT_FILE_H
