#include "runtime/base/input_file.h"

#include <errno.h>
#include <fcntl.h>     // open, fcntl
#include <string.h>
#include <sys/stat.h>  // stat, fstat
#include <unistd.h>    // read, close

const char *input_file_kind(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

static qt_status refuse_kind(const char *path, const char *what, mode_t mode) {
    return qt_fail(QT_ERR_INPUT, "%s is %s, not a regular file; qtrain reads a %s from a regular "
                   "file only (a pipe or a device could block it, or give other bytes on a "
                   "second read): save the data to a file and name that", path,
                   input_file_kind(mode), what);
}

void input_file_blocking(int fd) {
    // Regular files ignore O_NONBLOCK; cleared anyway, so that no later reader depends on that.
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

qt_status input_file_open(const char *path, const char *what, const char *hint, int *fd,
                          uint64_t *bytes) {
    *fd = -1;
    struct stat st;
    // Opening a FIFO blocks until a writer opens it: its kind is known before.
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return refuse_kind(path, what, st.st_mode);
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot open the %s: %s%s", path, what, strerror(errno),
                       hint != NULL ? hint : "");
    }
    if (fstat(f, &st) != 0) {
        int error = errno;
        close(f);
        return qt_fail(QT_ERR_IO, "%s: cannot stat: %s", path, strerror(error));
    }
    if (!S_ISREG(st.st_mode)) {  // replaced between the stat and the open
        close(f);
        return refuse_kind(path, what, st.st_mode);
    }
    input_file_blocking(f);
    *fd = f;
    *bytes = (uint64_t)st.st_size;
    return QT_OK;
}

qt_status input_file_read(const char *path, const char *what, char *buffer, size_t buffer_bytes,
                          size_t *bytes) {
    int fd = -1;
    uint64_t size = 0;
    *bytes = 0;
    QT_TRY(input_file_open(path, what, NULL, &fd, &size));
    size_t used = 0;
    for (;;) {
        char probe;
        bool full = used == buffer_bytes;
        // A file that grows while it is read is read to its end, not to its first size.
        ssize_t got = full ? read(fd, &probe, 1) : read(fd, buffer + used, buffer_bytes - used);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int error = errno;
            close(fd);
            return qt_fail(QT_ERR_IO, "%s: cannot read: %s", path, strerror(error));
        }
        if (got == 0) break;
        if (full) {
            close(fd);
            return qt_fail(QT_ERR_CAPACITY, "%s: file larger than the %zu-byte buffer; expected "
                           "a %s of at most %zu bytes", path, buffer_bytes, what, buffer_bytes);
        }
        used += (size_t)got;
    }
    close(fd);
    *bytes = used;
    return QT_OK;
}
