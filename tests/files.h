// files: a temporary folder, whole files and commands' output, for the test programs.
//
// Owns the program's temporary folder (tmp_dir_make to tmp_dir_remove) and the paths tmp_path
// hands out (the last 16 stay valid). Test code only: it allocates with malloc.
#ifndef QT_TEST_FILES_H
#define QT_TEST_FILES_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>  // WEXITSTATUS

static char tmp_dir[64];

// /tmp/qt_test_NAME_XXXXXX; false when it cannot be made.
static inline bool tmp_dir_make(const char *name) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qt_test_%s_XXXXXX", name);
    return mkdtemp(tmp_dir) != NULL;
}

static inline void tmp_dir_remove(void) {
    char command[128];
    snprintf(command, sizeof command, "rm -rf '%s'", tmp_dir);
    if (system(command) != 0) printf("  could not remove %s\n", tmp_dir);
}

static inline const char *tmp_path(const char *name) {
    static char paths[16][160];
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, 160, "%s/%s", tmp_dir, name);
    return p;
}

// The whole file, NUL-terminated (the caller frees it), or NULL.
static inline char *file_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)n + 1);
    *size = fread(data, 1, (size_t)n, f);
    data[*size] = '\0';
    fclose(f);
    return data;
}

// Whether two files hold the same bytes (false when either cannot be read).
static inline bool file_same(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = file_read(a, &na), *y = file_read(b, &nb);
    bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

// Whether two files agree after their first lines (two traces of recipes that differ, whose
// headers' recipe hashes do: the quantizer lines and every record). 0 when they do, else the
// 1-based line of the first difference (past the end of the shorter file: its line count + 1).
static inline size_t file_differs_after_first_line(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = file_read(a, &na), *y = file_read(b, &nb);
    const char *ra = x ? memchr(x, '\n', na) : NULL, *rb = y ? memchr(y, '\n', nb) : NULL;
    size_t line = 1;
    if (ra && rb) {
        size_t la = na - (size_t)(ra - x), lb = nb - (size_t)(rb - y), same = 0;
        while (same < la && same < lb && ra[same] == rb[same]) line += ra[same++] == '\n';
        if (la == lb && same == la) line = 0;
    }
    free(x);
    free(y);
    return line;
}

static inline void file_write(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        printf("  cannot write %s\n", path);
        abort();
    }
}

// Runs cmd with its stderr joined to its stdout, which goes to out; returns its exit status.
static inline int command_output(const char *cmd, char *out, size_t bytes) {
    char full[2400];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *pipe = popen(full, "r");
    if (!pipe) return -1;
    size_t used = fread(out, 1, bytes - 1, pipe);
    out[used] = '\0';
    int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif  // QT_TEST_FILES_H
