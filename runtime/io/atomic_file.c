#include "runtime/io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>     // open
#include <stdio.h>     // snprintf
#include <string.h>
#include <sys/stat.h>  // stat
#include <unistd.h>    // write, fsync, link, unlink, getpid

#include "runtime/base/input_file.h"  // input_file_kind

bool atomic_file_exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

qt_status atomic_file_check(const char *path, bool replace, const char *replace_hint) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        return qt_fail(QT_ERR_INPUT, "%s is %s, not a regular file; qtrain writes an output file "
                       "whole beside it and gives it the name, which would replace it: name a "
                       "regular file", path, input_file_kind(st.st_mode));
    }
    if (!replace && atomic_file_exists(path)) {
        return qt_fail(QT_ERR_INPUT, "%s exists; qtrain does not replace files: remove it, "
                       "choose another name, or pass %s to replace it", path, replace_hint);
    }
    return QT_OK;
}

qt_status atomic_file_create(atomic_file *f, const char *path, bool replace,
                             const char *replace_hint) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->replace = replace;
    int n = snprintf(f->temp, sizeof f->temp, "%s.tmp-%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof f->temp) {
        return qt_fail(QT_ERR_INPUT, "output path '%.64s...' is too long: at most %d bytes; use a "
                       "shorter path", path, ATOMIC_FILE_PATH_MAX - 24);
    }
    snprintf(f->path, sizeof f->path, "%s", path);
    QT_TRY(atomic_file_check(path, replace, replace_hint));
    f->fd = open(f->temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot create the temporary file %s: %s; check that the "
                       "folder exists and is writable%s", path, f->temp, strerror(errno),
                       errno == EEXIST ? " (a crashed run left it: remove it)" : "");
    }
    f->open = true;
    return QT_OK;
}

qt_status atomic_file_write(atomic_file *f, const void *bytes, size_t n) {
    QT_ASSERT(f->open);
    const uint8_t *p = bytes;
    size_t done = 0;
    while (done < n) {
        ssize_t got = write(f->fd, p + done, n - done);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            return qt_fail(QT_ERR_IO, "%s: cannot write (%s): %s%s", f->path, f->temp,
                           strerror(errno), errno == ENOSPC ? "; free space in its folder, or "
                                                              "name a file on another disk" : "");
        }
        done += (size_t)got;
    }
    f->bytes += n;
    return QT_OK;
}

qt_status atomic_file_sync(atomic_file *f) {
    QT_ASSERT(f->open);
    if (fsync(f->fd) != 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot sync %s: %s", f->path, f->temp, strerror(errno));
    }
    return QT_OK;
}

// The folder's entry for the new name reaches the disk only when the folder itself is synced.
static qt_status sync_folder(const char *path) {
    char folder[ATOMIC_FILE_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(folder, sizeof folder, ".");
    } else if (slash == path) {
        snprintf(folder, sizeof folder, "/");
    } else {
        snprintf(folder, sizeof folder, "%.*s", (int)(slash - path), path);
    }
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot open its folder %s to sync it: %s", path, folder,
                       strerror(errno));
    }
    int rc = fsync(fd);
    int error = errno;
    close(fd);
    if (rc != 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot sync its folder %s: %s", path, folder,
                       strerror(error));
    }
    return QT_OK;
}

static qt_status give_name(atomic_file *f) {
    if (f->replace) {
        if (rename(f->temp, f->path) != 0) {
            return qt_fail(QT_ERR_IO, "%s: cannot rename %s to it: %s", f->path, f->temp,
                           strerror(errno));
        }
        return QT_OK;
    }
    if (link(f->temp, f->path) != 0) {
        return qt_fail(QT_ERR_IO, "%s: cannot create it from %s: %s%s", f->path, f->temp,
                       strerror(errno), errno == EEXIST ? " (the file appeared while qtrain "
                                                          "ran; it was left as it is)" : "");
    }
    (void)unlink(f->temp);  // the data has its name; a leftover temporary name is harmless
    return QT_OK;
}

qt_status atomic_file_commit(atomic_file *f) {
    QT_ASSERT(f->open);
    qt_status status = atomic_file_sync(f);
    if (close(f->fd) != 0 && status == QT_OK) {
        status = qt_fail(QT_ERR_IO, "%s: cannot close %s: %s", f->path, f->temp,
                         strerror(errno));
    }
    f->fd = -1;
    if (status == QT_OK) status = give_name(f);
    if (status != QT_OK) {
        (void)unlink(f->temp);
        f->open = false;
        return status;
    }
    f->open = false;
    return sync_folder(f->path);
}

void atomic_file_abandon(atomic_file *f) {
    if (!f->open) return;
    close(f->fd);
    (void)unlink(f->temp);
    f->fd = -1;
    f->open = false;
}
