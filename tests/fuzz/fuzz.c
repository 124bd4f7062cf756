// The helpers of fuzz.h, linked with every harness: with tests/fuzz/driver.c, or with libFuzzer.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

static char temp_dir[64];

void fuzz_fail(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "fuzz: an invariant does not hold: ");
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    abort();  // the driver (or libFuzzer) reports it and keeps the input
}

static void fuzz_remove_temp(void) {
    if (!temp_dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", temp_dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: cannot remove %s\n", temp_dir);
}

const char *fuzz_path(const char *name) {
    static char paths[8][128];
    static int next;
    if (!temp_dir[0]) {
        // Memory-backed when the machine has it: a file is written per execution, and on a
        // disk every rewrite of one is a journaled truncation.
        struct stat st;
        bool shm = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode);
        snprintf(temp_dir, sizeof temp_dir, "%s/qt_fuzz_%d_XXXXXX", shm ? "/dev/shm" : "/tmp",
                 (int)getpid());
        if (!mkdtemp(temp_dir)) {
            perror("fuzz: mkdtemp");
            exit(2);
        }
        atexit(fuzz_remove_temp);
    }
    char *p = paths[next++ % 8];
    snprintf(p, 128, "%s/%s", temp_dir, name);
    return p;
}

void fuzz_write(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

uint32_t fuzz_u32(const uint8_t *data, size_t size, size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; i++) v |= (uint32_t)(at + i < size ? data[at + i] : 0) << (8 * i);
    return v;
}
