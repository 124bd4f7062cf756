// The fuzz driver (tests/fuzz/fuzz.h): `fuzz_NAME CORPUS [EXECUTIONS [SEED]]`.
//
// Runs every file of the folder CORPUS once (in name order), then mutations of them until
// EXECUTIONS inputs ran in all (default 10000), each mutation chosen by a xorshift generator
// from SEED (default 1): flipped bits, bytes and little-endian integers set to values that sit
// on boundaries, runs deleted, duplicated or inserted, the harness's words spliced in, two seeds
// crossed, the input cut short. No coverage feedback: the same arguments give the same inputs on
// every machine, so a failure reproduces and the test's time is bounded.
//
// Prints `  NAME: N executions (S seeds) in T s (R per second)` and `PASS fuzz_NAME`, the line
// tests/runner.c counts. A crash, an abort (QT_ASSERT), a sanitizer's report (its death
// callback) or an input that runs longer than FUZZ_TIMEOUT_S seconds prints `FAIL fuzz_NAME:
// ...` and keeps the input in build/fuzz/crash-NAME (replay it: `fuzz_NAME FOLDER 1` with the
// file alone in FOLDER).
#include <dirent.h>
#include <fcntl.h>  // open
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

#define FUZZ_INPUT_MAX (1u << 20)  // bytes of one input; longer seeds are cut
#define FUZZ_SEEDS_MAX 256
#define FUZZ_TIMEOUT_S 20

static const char *fuzz_name = "fuzz";
static uint8_t *current;      // the input running now, for the failure handlers
static size_t current_size;
static uint64_t executions;

// ---------------------------------------------------------------------------------------------
// Failures: print the FAIL line and keep the input. The signal handlers use this too: it
// formats into a local buffer and writes with write(2), after a crash that is as much as can be
// done.

static void fuzz_keep_input(const char *why) {
    char line[256], path[128];
    snprintf(path, sizeof path, "build/fuzz/crash-%s", fuzz_name);
    int n = snprintf(line, sizeof line, "FAIL fuzz_%s: %s at execution %llu; the input (%zu "
                     "bytes) is in %s\n", fuzz_name, why, (unsigned long long)executions,
                     current_size, path);
    fflush(stdout);
    if (write(STDOUT_FILENO, line, (size_t)n) < 0) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    if (current_size && write(fd, current, current_size) < 0) line[0] = '\0';
    close(fd);
}

static void fuzz_signal(int sig) {
    fuzz_keep_input(sig == SIGALRM ? "a hang" : sig == SIGABRT ? "an abort" : "a crash");
    signal(sig, SIG_DFL);
    raise(sig);
}

// The sanitizers call this before they end the process (after their report on stderr);
// fuzz_fail aborts, which the SIGABRT handler reports.
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
static void fuzz_sanitizer_death(void) { fuzz_keep_input("a sanitizer report"); }

// ---------------------------------------------------------------------------------------------
// The corpus and the mutations

typedef struct seed {
    uint8_t *data;
    size_t size;
} seed;

static seed seeds[FUZZ_SEEDS_MAX];
static size_t seed_count;

static int name_order(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_corpus(const char *folder) {
    DIR *d = opendir(folder);
    if (!d) {
        printf("FAIL fuzz_%s: cannot open the corpus %s\n", fuzz_name, folder);
        exit(1);
    }
    static char *names[FUZZ_SEEDS_MAX];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < FUZZ_SEEDS_MAX) {
        if (e->d_name[0] == '.') continue;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof names[0], name_order);
    for (size_t i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", folder, names[i]);
        struct stat st;
        FILE *f = fopen(path, "rb");
        if (f && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            size_t size = (size_t)st.st_size < FUZZ_INPUT_MAX ? (size_t)st.st_size
                                                               : FUZZ_INPUT_MAX;
            seeds[seed_count].data = malloc(size ? size : 1);
            seeds[seed_count].size = fread(seeds[seed_count].data, 1, size, f);
            seed_count++;
        }
        if (f) fclose(f);
        free(names[i]);
    }
}

static uint64_t rng = 1;

static uint64_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static size_t below(size_t n) { return n ? (size_t)(next_random() % n) : 0; }

static const uint64_t interesting[] = {0,          1,          2,          7,
                                       8,          15,         16,         31,
                                       32,         127,        128,        255,
                                       256,        1024,       4096,       65535,
                                       65536,      0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                                       1ull << 32, 1ull << 40, ~0ull};
#define INTERESTING (sizeof interesting / sizeof interesting[0])

// One mutation of buf[0 .. *size) in place (capacity FUZZ_INPUT_MAX).
static void mutate_once(uint8_t *buf, size_t *size) {
    size_t n = *size, at = below(n + 1);
    switch (below(10)) {
    case 0:  // flip a bit
        if (n) buf[below(n)] ^= (uint8_t)(1u << below(8));
        break;
    case 1:  // a random byte
        if (n) buf[below(n)] = (uint8_t)next_random();
        break;
    case 2: {  // a little-endian integer of 1, 2, 4 or 8 bytes on a boundary value
        size_t width = (size_t)1 << below(4);
        uint64_t v = interesting[below(INTERESTING)] + (below(3) ? 0 : (uint64_t)below(3) - 1);
        for (size_t i = 0; i < width && at + i < n; i++) buf[at + i] = (uint8_t)(v >> (8 * i));
        break;
    }
    case 3: {  // delete a run
        size_t run = 1 + below(below(2) ? 8 : 256);
        if (at + run > n) run = n - at;
        memmove(buf + at, buf + at + run, n - at - run);
        *size = n - run;
        break;
    }
    case 4: {  // duplicate a run
        size_t run = 1 + below(64);
        if (at + run > n) run = n - at;
        if (n + run > FUZZ_INPUT_MAX) break;
        memmove(buf + at + run, buf + at, n - at);
        *size = n + run;
        break;
    }
    case 5: {  // insert random bytes
        size_t run = 1 + below(16);
        if (n + run > FUZZ_INPUT_MAX) break;
        memmove(buf + at + run, buf + at, n - at);
        for (size_t i = 0; i < run; i++) buf[at + i] = (uint8_t)next_random();
        *size = n + run;
        break;
    }
    case 6:
    case 7: {  // a word of the format, inserted or written over
        if (!fuzz_words_count) break;
        const char *w = fuzz_words[below(fuzz_words_count)];
        size_t len = strlen(w);
        if (below(2) && n + len <= FUZZ_INPUT_MAX) {
            memmove(buf + at + len, buf + at, n - at);
            *size = n + len;
        } else if (at + len > n) {
            break;
        }
        memcpy(buf + at, w, len);
        break;
    }
    case 8: {  // cross with another seed: this one's head, that one's tail
        const seed *o = &seeds[below(seed_count)];
        size_t from = below(o->size + 1);
        size_t tail = o->size - from;
        if (at + tail > FUZZ_INPUT_MAX) tail = FUZZ_INPUT_MAX - at;
        memcpy(buf + at, o->data + from, tail);
        *size = at + tail;
        break;
    }
    default:  // cut short
        *size = at;
        break;
    }
}

static void run_one(uint8_t *buf, size_t size) {
    current = buf;
    current_size = size;
    executions++;
    alarm(FUZZ_TIMEOUT_S);
    // An exactly sized copy, so that a read past the end is a sanitizer's report.
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, buf, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
    alarm(0);
}

int main(int argc, char **argv) {
    const char *slash = strrchr(argv[0], '/');
    fuzz_name = slash ? slash + 1 : argv[0];
    if (strncmp(fuzz_name, "fuzz_", 5) == 0) fuzz_name += 5;
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS [EXECUTIONS [SEED]]\n", argv[0]);
        return 2;
    }
    uint64_t total = argc > 2 ? strtoull(argv[2], NULL, 10) : 10000;
    rng = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    if (rng == 0) rng = 1;
    signal(SIGSEGV, fuzz_signal);
    signal(SIGBUS, fuzz_signal);
    signal(SIGFPE, fuzz_signal);
    signal(SIGABRT, fuzz_signal);
    signal(SIGALRM, fuzz_signal);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(fuzz_sanitizer_death);
    mkdir("build/fuzz", 0755);
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    load_corpus(argv[1]);
    if (seed_count == 0) {
        printf("FAIL fuzz_%s: no seeds in %s\n", fuzz_name, argv[1]);
        return 1;
    }
    static uint8_t buf[FUZZ_INPUT_MAX];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < seed_count && executions < total; i++) {
        memcpy(buf, seeds[i].data, seeds[i].size);
        run_one(buf, seeds[i].size);
    }
    while (executions < total) {
        const seed *s = &seeds[below(seed_count)];
        size_t size = s->size;
        memcpy(buf, s->data, size);
        for (size_t k = 1 + below(below(4) ? 4 : 16); k > 0; k--) mutate_once(buf, &size);
        run_one(buf, size);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("  %s: %llu executions (%zu seeds) in %.2f s (%.0f per second)\n", fuzz_name,
           (unsigned long long)executions, seed_count, seconds,
           seconds > 0 ? (double)executions / seconds : 0.0);
    printf("PASS fuzz_%s\n", fuzz_name);
    for (size_t i = 0; i < seed_count; i++) free(seeds[i].data);
    return 0;
}
