// test_data: datasets and batches (runtime/io/data.c).
//
// IDX files written by the test (plain, gzip, multi-member gzip) probe to exact sizes and load to
// exact bytes; .npy pairs load like them (uint8 features, labels of every integer type) or as
// regression data (float32 features and targets); every kind of bad file fails with a message
// naming the file and the problem (a FIFO or a directory at once; an IDX length that disagrees
// with its header at the probe; damaged gzip data as a gzip error, wherever the damage is); the
// synthetic sources are deterministic (golden hashes) and learnable; the shuffle is a
// permutation fixed by (seed, epoch); feeds pad the last batch, cover every sample once per
// epoch and resume from a cursor. Fashion-MNIST is checked when extracted
// into .data/ or installed (else SKIP). Run from the repository root.
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>  // mkfifo
#include <unistd.h>
#include <zlib.h>

#include "runtime/io/data.h"
#include "tests/npy_save.h"        // npy_save: .npy sources
#include "runtime/ops/op_sched.h"  // op_sched_stage_u8
#include "runtime/base/pool.h"     // pool_start, pool_stop: ranges on 1 and 3 threads
#include "tests/rig.h"
#include "tests/test.h"

static char tmp_dir[64];

// ---------------------------------------------------------------------------------------------
// helpers: files, IDX bytes, loading

typedef struct bytes {
    uint8_t *data;
    size_t size;
} bytes;

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

// Sample s of the test images: pixel 0 = s & 255, pixel 1 = 255, then a pattern.
static uint8_t pixel_of(uint32_t s, uint32_t p) {
    if (p == 0) return (uint8_t)s;
    if (p == 1) return 255;
    return (uint8_t)(s * 7 + p * 13);
}

static bytes idx_images(uint32_t count, uint32_t rows, uint32_t cols) {
    bytes b = {malloc(16 + (size_t)count * rows * cols), 16 + (size_t)count * rows * cols};
    put_be32(b.data, 0x803);
    put_be32(b.data + 4, count);
    put_be32(b.data + 8, rows);
    put_be32(b.data + 12, cols);
    for (uint32_t s = 0; s < count; s++) {
        for (uint32_t p = 0; p < rows * cols; p++) {
            b.data[16 + (size_t)s * rows * cols + p] = pixel_of(s, p);
        }
    }
    return b;
}

static bytes idx_labels(uint32_t count, uint32_t classes) {
    bytes b = {malloc(8 + (size_t)count), 8 + (size_t)count};
    put_be32(b.data, 0x801);
    put_be32(b.data + 4, count);
    for (uint32_t s = 0; s < count; s++) b.data[8 + s] = (uint8_t)(s % classes);
    return b;
}

static const char *tmp_path(const char *name) {
    static char paths[8][128];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 128, "%s/%s", tmp_dir, name);
    return p;
}

static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        printf("  cannot write %s\n", path);
        abort();
    }
}

// gzip members of data[0 .. split) and data[split .. size), concatenated (one member if split is
// 0 or size).
static bytes gzip_bytes(const uint8_t *data, size_t size, size_t split) {
    bytes out = {malloc(2 * size + 256), 0};
    size_t parts[2][2] = {{0, split}, {split, size}};
    for (int m = 0; m < 2; m++) {
        if (parts[m][1] == parts[m][0] && !(m == 0 && split == size)) continue;
        z_stream z;
        memset(&z, 0, sizeof z);
        if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
        z.next_in = (uint8_t *)data + parts[m][0];
        z.avail_in = (uInt)(parts[m][1] - parts[m][0]);
        z.next_out = out.data + out.size;
        z.avail_out = (uInt)(2 * size + 256 - out.size);
        if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
        out.size += z.total_out;
        deflateEnd(&z);
    }
    return out;
}

static void write_bytes(const char *path, bytes b) {
    write_file(path, b.data, b.size);
}

static recipe_source idx_source(const char *images, const char *labels) {
    recipe_source s;
    memset(&s, 0, sizeof s);
    s.kind = RECIPE_SOURCE_IDX;
    snprintf(s.images, sizeof s.images, "%s", images);
    snprintf(s.labels, sizeof s.labels, "%s", labels);
    return s;
}

static recipe_source synthetic_source(recipe_source_kind kind, uint32_t inputs, uint32_t outputs,
                                      uint64_t samples, uint64_t seed) {
    recipe_source s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.inputs = inputs;
    s.outputs = outputs;
    s.samples = samples;
    s.seed = seed;
    s.task = seed;  // the parser's default: a source without task= draws the task from its seed
    s.line = 7;
    return s;
}

// Probes and loads into fresh memory, which it returns for the caller to free.
static void *load(const recipe_source *src, uint32_t features, uint32_t outputs, data_set *set,
                  qt_status *status) {
    data_info info;
    *status = data_probe(src, features, outputs, &info);
    if (*status != QT_OK) return NULL;
    void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
    memset(memory, 0xAB, info.bytes);  // garbage, so that unwritten bytes show
    *status = data_load(src, &info, memory, info.bytes, set);
    return memory;
}

static uint64_t fnv(const void *data, size_t size) {
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// Expects failure `status` with `fragment` in the message.
#define CHECK_ERROR(got, status, fragment)                                                    \
    CHECK((got) == (status) && strstr(qt_error_message(), (fragment)) != NULL,               \
          "expected %s with '%s', got %s: %s", qt_status_name(status), (fragment),           \
          qt_status_name(got), qt_error_message())

// ---------------------------------------------------------------------------------------------
// IDX files

enum { N = 37, ROWS = 3, COLS = 5, FEATURES = ROWS * COLS, CLASSES = 10 };

static void check_idx_set(const data_set *set) {
    const data_info *info = &set->info;
    CHECK(info->samples == N && info->features == FEATURES && info->image_rows == ROWS &&
          info->image_cols == COLS && info->outputs == CLASSES, "info %" PRIu64 " x %u (%u x %u)",
          info->samples, info->features, info->image_rows, info->image_cols);
    // 37 x 15 bytes = 555 -> targets at 768; 37 labels x 4 = 148 bytes -> 916 -> 1024.
    CHECK(info->inputs_offset == 0 && info->inputs_bytes == 555, "inputs %" PRIu64,
          info->inputs_bytes);
    CHECK(info->targets_offset == 768 && info->targets_bytes == 148, "targets at %" PRIu64,
          info->targets_offset);
    CHECK(info->scratch_bytes == 0 && info->bytes == 1024, "bytes %" PRIu64, info->bytes);
    CHECK(set->inputs_u8 != NULL && set->labels != NULL && set->inputs_f32 == NULL &&
          set->targets == NULL, "views");
    if (set->inputs_u8 == NULL || set->labels == NULL) return;
    int bad = 0;
    for (uint32_t s = 0; s < N; s++) {
        for (uint32_t p = 0; p < FEATURES; p++) {
            bad += set->inputs_u8[s * FEATURES + p] != pixel_of(s, p);
        }
        CHECK(set->labels[s] == (int32_t)(s % CLASSES), "label %u is %d", s, set->labels[s]);
    }
    CHECK(bad == 0, "%d pixels differ", bad);
}

static void test_idx_plain_and_gzip(void) {
    test_begin("idx_plain_and_gzip");
    bytes im = idx_images(N, ROWS, COLS), lb = idx_labels(N, CLASSES);
    write_bytes(tmp_path("im"), im);
    write_bytes(tmp_path("lb"), lb);
    bytes im_gz = gzip_bytes(im.data, im.size, im.size), lb_gz = gzip_bytes(lb.data, lb.size, 0);
    write_bytes(tmp_path("im.gz"), im_gz);
    write_bytes(tmp_path("lb.gz"), lb_gz);
    // Members split inside the header and inside the data; a gzip file without .gz in its name.
    bytes im_multi = gzip_bytes(im.data, im.size, 9), lb_multi = gzip_bytes(lb.data, lb.size, 20);
    write_bytes(tmp_path("im_multi.gz"), im_multi);
    write_bytes(tmp_path("lb_multi"), lb_multi);
    const char *pairs[3][2] = {{"im", "lb"}, {"im.gz", "lb.gz"}, {"im_multi.gz", "lb_multi"}};
    for (int i = 0; i < 3; i++) {
        recipe_source src = idx_source(tmp_path(pairs[i][0]), tmp_path(pairs[i][1]));
        data_set set;
        qt_status status;
        void *memory = load(&src, FEATURES, CLASSES, &set, &status);
        CHECK(status == QT_OK, "%s: %s", pairs[i][0], qt_error_message());
        if (status == QT_OK) check_idx_set(&set);
        free(memory);
    }
    free(im.data), free(lb.data), free(im_gz.data), free(lb_gz.data);
    free(im_multi.data), free(lb_multi.data);
    test_end();
}

// A gzip file cut in half still probes (only its header is inflated) but does not load.
static void test_idx_probe_reads_headers_only(void) {
    test_begin("idx_probe_reads_headers_only");
    bytes im = idx_images(400, 28, 28), lb = idx_labels(400, CLASSES);
    bytes im_gz = gzip_bytes(im.data, im.size, im.size);
    write_file(tmp_path("half.gz"), im_gz.data, im_gz.size / 2);
    write_bytes(tmp_path("lb400"), lb);
    recipe_source src = idx_source(tmp_path("half.gz"), tmp_path("lb400"));
    data_info info;
    qt_status status = data_probe(&src, 784, CLASSES, &info);
    CHECK(status == QT_OK && info.samples == 400 && info.bytes == 313600 + 1792,
          "probe: %s: %s (bytes %" PRIu64 ")", qt_status_name(status), qt_error_message(),
          info.bytes);
    void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
    data_set set;
    status = data_load(&src, &info, memory, info.bytes, &set);
    CHECK_ERROR(status, QT_ERR_INPUT, "half.gz: the gzip data ends early");
    free(memory), free(im.data), free(lb.data), free(im_gz.data);
    test_end();
}

// Probes (load = false) or loads the source and checks the error.
static void expect_source_failure(const recipe_source *src, uint32_t features, bool load_too,
                                  qt_status expected, const char *fragment) {
    data_info info;
    qt_status status = data_probe(src, features, CLASSES, &info);
    if (load_too && status == QT_OK) {
        void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
        data_set set;
        status = data_load(src, &info, memory, info.bytes, &set);
        free(memory);
    }
    CHECK_ERROR(status, expected, fragment);
}

// The same for images `im` with labels `lb`.
static void expect_failure(const char *im, const char *lb, uint32_t features, bool load_too,
                           qt_status expected, const char *fragment) {
    recipe_source src = idx_source(tmp_path(im), tmp_path(lb));
    expect_source_failure(&src, features, load_too, expected, fragment);
}

static void test_idx_errors(void) {
    test_begin("idx_errors");
    bytes im = idx_images(N, ROWS, COLS), lb = idx_labels(N, CLASSES);
    write_bytes(tmp_path("e_im"), im);
    write_bytes(tmp_path("e_lb"), lb);
    expect_failure("missing", "e_lb", FEATURES, false, QT_ERR_IO, "missing: cannot open");
    // Not regular files: refused before opening (a FIFO with no writer would block the open).
    CHECK(mkfifo(tmp_path("fifo"), 0600) == 0, "mkfifo");
    expect_failure("fifo", "e_lb", FEATURES, false, QT_ERR_INPUT, "fifo is a FIFO (named pipe), "
                   "not a regular file; qtrain reads a dataset from a regular file only");
    expect_failure("e_im", "fifo", FEATURES, false, QT_ERR_INPUT, "fifo is a FIFO (named pipe)");
    expect_failure("e_im", ".", FEATURES, false, QT_ERR_INPUT, "is a directory, not a regular "
                   "file");
    expect_failure("e_lb", "e_im", FEATURES, false, QT_ERR_INPUT, "IMAGES and LABELS swapped");
    write_file(tmp_path("text"), "hello, world: not IDX", 21);
    expect_failure("text", "e_lb", FEATURES, false, QT_ERR_INPUT, "text: magic 0x68656c6c is "
                   "not an IDX file; expected 0x00000803");
    expect_failure("e_im", "e_lb", FEATURES + 1, false, QT_ERR_INPUT, "images of 3 x 5 = 15 "
                   "values; the model's input is 16: set `input = 15`");
    write_file(tmp_path("empty"), "", 0);
    expect_failure("empty", "e_lb", FEATURES, false, QT_ERR_INPUT, "empty: truncated: the IDX "
                   "header needs 16 bytes, the data ends after 0");
    write_file(tmp_path("short_header"), im.data, 10);
    expect_failure("short_header", "e_lb", FEATURES, false, QT_ERR_INPUT, "needs 16 bytes");
    bytes lb36 = idx_labels(N - 1, CLASSES);
    write_bytes(tmp_path("lb36"), lb36);
    expect_failure("e_im", "lb36", FEATURES, false, QT_ERR_INPUT, "lb36: 36 labels, but");
    bytes zero = idx_images(0, ROWS, COLS);
    write_bytes(tmp_path("zero"), zero);
    expect_failure("zero", "e_lb", FEATURES, false, QT_ERR_INPUT, "the header gives 0 x 3 x 5");
    // A length that disagrees with the header shows at the probe, before anything is planned.
    write_file(tmp_path("cut"), im.data, im.size - 1);
    expect_failure("cut", "e_lb", FEATURES, false, QT_ERR_INPUT, "cut: truncated: its header "
                   "announces 37 images of 3 x 5 bytes, 571 bytes with the header, but the file "
                   "has 570; download or extract it again");
    uint8_t *longer = malloc(im.size + 3);
    memcpy(longer, im.data, im.size);
    memset(longer + im.size, 0, 3);
    write_file(tmp_path("long"), longer, im.size + 3);
    expect_failure("long", "e_lb", FEATURES, false, QT_ERR_INPUT, "long: trailing bytes: its "
                   "header announces 37 images of 3 x 5 bytes, 571 bytes with the header, but "
                   "the file has 574");
    write_file(tmp_path("lb_cut"), lb.data, lb.size - 2);
    expect_failure("e_im", "lb_cut", FEATURES, false, QT_ERR_INPUT, "lb_cut: truncated: its "
                   "header announces 37 labels of one byte, 45 bytes with the header, but the "
                   "file has 43");
    // Two 16-byte files whose headers claim 2^31 samples of 28 x 28: truncated files, named as
    // such at the probe, not a dataset too large for memory.
    uint8_t huge_im[16] = {0, 0, 8, 3, 0x80, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28};
    uint8_t huge_lb[16] = {0, 0, 8, 1, 0x80, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    write_file(tmp_path("huge_im"), huge_im, sizeof huge_im);
    write_file(tmp_path("huge_lb"), huge_lb, sizeof huge_lb);
    expect_failure("huge_im", "huge_lb", 784, false, QT_ERR_INPUT, "huge_im: truncated: its "
                   "header announces 2147483648 images of 28 x 28 bytes, 1683627180048 bytes "
                   "with the header, but the file has 16");
    expect_failure("e_im", "huge_lb", FEATURES, false, QT_ERR_INPUT, "huge_lb: truncated: its "
                   "header announces 2147483648 labels of one byte");
    lb.data[8 + 30] = CLASSES;
    write_bytes(tmp_path("lb_range"), lb);
    expect_failure("e_im", "lb_range", FEATURES, true, QT_ERR_INPUT, "label 10 of sample 30 is "
                   "out of range");
    free(longer), free(im.data), free(lb.data), free(lb36.data), free(zero.data);
    test_end();
}

static void test_idx_gzip_errors(void) {
    test_begin("idx_gzip_errors");
    bytes im = idx_images(N, ROWS, COLS), lb = idx_labels(N, CLASSES);
    write_bytes(tmp_path("g_lb"), lb);
    bytes gz = gzip_bytes(im.data, im.size, im.size);
    gz.data[gz.size - 6] ^= 0x40;  // inside the CRC-32 of the trailer
    write_bytes(tmp_path("crc.gz"), gz);
    expect_failure("crc.gz", "g_lb", FEATURES, true, QT_ERR_INPUT, "crc.gz: corrupt gzip data "
                   "after 571 uncompressed bytes (zlib: incorrect data check)");
    gz.data[gz.size - 6] ^= 0x40;
    write_file(tmp_path("notrailer.gz"), gz.data, gz.size - 8);
    expect_failure("notrailer.gz", "g_lb", FEATURES, true, QT_ERR_INPUT, "the gzip data ends "
                   "early, after 571 uncompressed bytes");
    uint8_t *junk = malloc(gz.size + 4);
    memcpy(junk, gz.data, gz.size);
    memcpy(junk + gz.size, "junk", 4);
    write_file(tmp_path("junk.gz"), junk, gz.size + 4);
    expect_failure("junk.gz", "g_lb", FEATURES, true, QT_ERR_INPUT, "junk.gz: corrupt gzip data "
                   "after 571 uncompressed bytes (zlib: incorrect header check)");
    // The uncompressed file is longer than its header says.
    uint8_t *longer = malloc(im.size + 1);
    memcpy(longer, im.data, im.size);
    longer[im.size] = 7;
    bytes long_gz = gzip_bytes(longer, im.size + 1, im.size + 1);
    write_bytes(tmp_path("long.gz"), long_gz);
    expect_failure("long.gz", "g_lb", FEATURES, true, QT_ERR_INPUT, "long.gz: trailing bytes");
    // A header that claims more than a gzip file of this size can inflate to: truncated.
    uint8_t huge_im[16] = {0, 0, 8, 3, 0x80, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28};
    bytes huge_gz = gzip_bytes(huge_im, sizeof huge_im, sizeof huge_im);
    write_bytes(tmp_path("huge.gz"), huge_gz);
    expect_failure("huge.gz", "g_lb", 784, false, QT_ERR_INPUT, "huge.gz: truncated: its header "
                   "announces 2147483648 images of 28 x 28 bytes, 1683627180048 bytes with the "
                   "header, but a gzip file of");
    // A plain file named .gz whose content is not IDX: the note says it is not gzip data.
    write_file(tmp_path("text.gz"), "hello, world: not gzip", 22);
    expect_failure("text.gz", "g_lb", FEATURES, false, QT_ERR_INPUT, "(unsigned bytes, MNIST "
                   "format) (the name ends in .gz, but the file does not start with gzip's "
                   "bytes 1f 8b");
    free(junk), free(longer), free(long_gz.data), free(huge_gz.data), free(gz.data);
    free(im.data), free(lb.data);
    test_end();
}

// Damaged gzip data is named as such, wherever the damage is: every byte of a gzip file of a
// dataset flipped in turn (but the header's time stamp, extra flags and OS, which nothing
// reads) makes the probe or the load fail with a message about the gzip data, never about an
// IDX header, a length or a label that the damaged data inflated to.
static void test_idx_gzip_damage_named(void) {
    test_begin("idx_gzip_damage_named_as_gzip");
    bytes im = idx_images(N, ROWS, COLS), lb = idx_labels(N, CLASSES);
    write_bytes(tmp_path("d_lb"), lb);
    bytes gz = gzip_bytes(im.data, im.size, im.size);
    uint32_t tried = 0, named = 0;
    char first[QT_ERROR_MESSAGE_MAX] = "";
    for (size_t at = 0; at < gz.size; at++) {
        if (at >= 4 && at < 10) continue;  // MTIME, XFL, OS
        gz.data[at] ^= 0xFF;
        write_bytes(tmp_path("damaged.gz"), gz);
        gz.data[at] ^= 0xFF;
        recipe_source src = idx_source(tmp_path("damaged.gz"), tmp_path("d_lb"));
        data_info info;
        qt_status status = data_probe(&src, FEATURES, CLASSES, &info);
        if (status == QT_OK) {
            void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
            data_set set;
            status = data_load(&src, &info, memory, info.bytes, &set);
            free(memory);
        }
        tried++;
        bool gzip = status == QT_ERR_INPUT && strstr(qt_error_message(), "gzip") != NULL;
        named += gzip;
        if (!gzip && first[0] == '\0') {
            snprintf(first, sizeof first, "byte %zu: %s: %s", at, qt_status_name(status),
                     qt_error_message());
        }
    }
    CHECK(tried > 40 && named == tried, "%u of %u damaged files named as gzip errors; first "
          "other: %s", named, tried, first);
    free(gz.data), free(im.data), free(lb.data);
    test_end();
}

// A file replaced between probe and load is refused rather than loaded into a wrong-sized plan.
static void test_idx_changed_after_probe(void) {
    test_begin("idx_changed_after_probe");
    bytes im = idx_images(N, ROWS, COLS), lb = idx_labels(N, CLASSES);
    write_bytes(tmp_path("c_im"), im);
    write_bytes(tmp_path("c_lb"), lb);
    recipe_source src = idx_source(tmp_path("c_im"), tmp_path("c_lb"));
    data_info info;
    qt_status status = data_probe(&src, FEATURES, CLASSES, &info);
    CHECK(status == QT_OK, "probe: %s", qt_error_message());
    bytes other = idx_images(N + 1, ROWS, COLS);
    write_bytes(tmp_path("c_im"), other);
    void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
    data_set set;
    status = data_load(&src, &info, memory, info.bytes, &set);
    CHECK_ERROR(status, QT_ERR_MISMATCH, "c_im: the header changed since the file was probed");
    free(memory), free(im.data), free(lb.data), free(other.data);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// .npy files

// An .npy file with a header of the caller's (a dtype this module does not write).
static void write_npy_raw(const char *path, const char *dict, size_t data_bytes) {
    static uint8_t buf[1 << 16];
    size_t n = strlen(dict), header = (10 + n + 1 + 63) / 64 * 64 - 10;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)header;
    buf[9] = 0;
    memcpy(buf + 10, dict, n);
    memset(buf + 10 + n, ' ', header - n - 1);
    buf[9 + header] = '\n';
    memset(buf + 10 + header, 0, data_bytes);
    write_file(path, buf, 10 + header + data_bytes);
}

static recipe_source npy_source(const char *features, const char *labels) {
    recipe_source s = idx_source(features, labels);
    s.kind = RECIPE_SOURCE_NPY;
    return s;
}

// The IDX test images as (N, FEATURES) uint8 and their labels as each integer type.
static void test_npy_u8_like_idx(void) {
    test_begin("npy_uint8_features_and_integer_labels");
    static uint8_t x[N * FEATURES];
    uint8_t l8[N];
    int32_t l32[N];
    int64_t l64[N];
    for (uint32_t s = 0; s < N; s++) {
        for (uint32_t p = 0; p < FEATURES; p++) x[s * FEATURES + p] = pixel_of(s, p);
        l8[s] = (uint8_t)(s % CLASSES);
        l32[s] = (int32_t)(s % CLASSES);
        l64[s] = s % CLASSES;
    }
    npy_save(tmp_path("x.npy"), NPY_DTYPE_U8, 2, N, FEATURES, x);
    const void *labels[] = {l8, l32, l64};
    const npy_dtype types[] = {NPY_DTYPE_U8, NPY_DTYPE_I32, NPY_DTYPE_I64};
    for (int t = 0; t < 3; t++) {
        npy_save(tmp_path("y.npy"), types[t], 1, N, 1, labels[t]);
        recipe_source src = npy_source(tmp_path("x.npy"), tmp_path("y.npy"));
        data_set set;
        qt_status status;
        void *memory = load(&src, FEATURES, CLASSES, &set, &status);
        CHECK(status == QT_OK, "%s labels: %s", npy_dtype_name(types[t]), qt_error_message());
        if (status == QT_OK) {
            const data_info *info = &set.info;
            CHECK(info->kind == RECIPE_SOURCE_NPY && info->samples == N &&
                      info->input_type == DATA_INPUT_U8 && info->target_type == DATA_TARGET_LABEL
                      && info->inputs_bytes == 555 && info->bytes == 1024, "info");
            CHECK(set.inputs_u8 && memcmp(set.inputs_u8, x, sizeof x) == 0, "pixels differ");
            CHECK(set.labels && memcmp(set.labels, l32, sizeof l32) == 0, "labels differ");
        }
        free(memory);
    }
    // Inputs only (`qtrain infer`): every label is padding.
    recipe_source src = npy_source(tmp_path("x.npy"), "");
    data_set set;
    qt_status status;
    void *memory = load(&src, FEATURES, CLASSES, &set, &status);
    CHECK(status == QT_OK && set.labels && set.labels[0] == DATA_LABEL_PAD &&
              set.labels[N - 1] == DATA_LABEL_PAD, "inputs only: %s", qt_error_message());
    free(memory);
    test_end();
}

static void test_npy_f32_targets(void) {
    test_begin("npy_float32_features_and_targets");
    enum { S = 21, F = 6, O = 3 };
    float x[S * F], y[S * O];
    for (int i = 0; i < S * F; i++) x[i] = (float)i * 0.25f - 7.0f;
    for (int i = 0; i < S * O; i++) y[i] = (float)i * -0.5f;
    npy_save(tmp_path("xf.npy"), NPY_DTYPE_F32, 2, S, F, x);
    npy_save(tmp_path("yf.npy"), NPY_DTYPE_F32, 2, S, O, y);
    recipe_source src = npy_source(tmp_path("xf.npy"), tmp_path("yf.npy"));
    data_set set;
    qt_status status;
    void *memory = load(&src, F, O, &set, &status);
    CHECK(status == QT_OK, "%s", qt_error_message());
    if (status == QT_OK) {
        CHECK(set.info.input_type == DATA_INPUT_F32 && set.info.target_type == DATA_TARGET_VALUES
                  && set.info.image_rows == 1 && set.info.image_cols == F, "info");
        CHECK(set.inputs_f32 && memcmp(set.inputs_f32, x, sizeof x) == 0, "features differ");
        CHECK(set.targets && memcmp(set.targets, y, sizeof y) == 0, "targets differ");
    }
    free(memory);
    test_end();
}

// Probes (and loads, with load_too) the pair and checks the error.
static void expect_npy_failure(const char *x, const char *y, uint32_t features, bool load_too,
                               qt_status expected, const char *fragment) {
    recipe_source src = npy_source(tmp_path(x), tmp_path(y));
    expect_source_failure(&src, features, load_too, expected, fragment);
}

static void test_npy_errors(void) {
    test_begin("npy_errors");
    static float x[N * FEATURES];
    int32_t labels[N];
    for (uint32_t s = 0; s < N; s++) labels[s] = (int32_t)(s % CLASSES);
    npy_save(tmp_path("ex.npy"), NPY_DTYPE_F32, 2, N, FEATURES, x);
    npy_save(tmp_path("ey.npy"), NPY_DTYPE_I32, 1, N, 1, labels);
    expect_npy_failure("ex.npy", "ey.npy", FEATURES + 1, false, QT_ERR_INPUT,
                       "15 features per sample; the model's input is 16: set `input = 15`");
    npy_save(tmp_path("e2.npy"), NPY_DTYPE_I32, 1, N - 1, 1, labels);
    expect_npy_failure("ex.npy", "e2.npy", FEATURES, false, QT_ERR_INPUT, "36 labels, but");
    npy_save(tmp_path("e3.npy"), NPY_DTYPE_F32, 2, N, 4, x);
    expect_npy_failure("ex.npy", "e3.npy", FEATURES, false, QT_ERR_INPUT,
                       "4 regression targets per sample; the model's last layer has 10 outputs");
    npy_save(tmp_path("e4.npy"), NPY_DTYPE_I32, 2, N, 1, labels);
    expect_npy_failure("ex.npy", "e4.npy", FEATURES, false, QT_ERR_INPUT,
                       "LABELS_OR_TARGETS takes a 1-D array of uint8");
    write_npy_raw(tmp_path("e5.npy"), "{'descr': '<f8', 'fortran_order': False, 'shape': (37, "
                  "15), }", N * FEATURES * 8);
    expect_npy_failure("e5.npy", "ey.npy", FEATURES, false, QT_ERR_INPUT,
                       "found dtype '<f8' (float64) and shape (37, 15); FEATURES takes a 2-D "
                       "array of float32 ('<f4') or uint8 ('|u1')");
    write_npy_raw(tmp_path("e6.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (37, "
                  "15), }", N * FEATURES * 4 - 1);
    expect_npy_failure("e6.npy", "ey.npy", FEATURES, false, QT_ERR_INPUT, "truncated");
    labels[N - 1] = CLASSES;
    npy_save(tmp_path("e7.npy"), NPY_DTYPE_I32, 1, N, 1, labels);
    expect_npy_failure("ex.npy", "e7.npy", FEATURES, true, QT_ERR_INPUT,
                       "label 10 of sample 36 is out of range");
    labels[N - 1] = -1;
    npy_save(tmp_path("e7.npy"), NPY_DTYPE_I32, 1, N, 1, labels);
    expect_npy_failure("ex.npy", "e7.npy", FEATURES, true, QT_ERR_INPUT, "labels must be in 0..9");
    x[3 * FEATURES + 2] = NAN;
    npy_save(tmp_path("e8.npy"), NPY_DTYPE_F32, 2, N, FEATURES, x);
    expect_npy_failure("e8.npy", "ey.npy", FEATURES, true, QT_ERR_INPUT,
                       "the feature of sample 3, column 2, is NaN");
    expect_npy_failure("missing.npy", "ey.npy", FEATURES, false, QT_ERR_IO, "missing.npy");
    // Replaced between the probe and the load.
    recipe_source src = npy_source(tmp_path("ex.npy"), tmp_path("ey.npy"));
    data_info info;
    qt_status status = data_probe(&src, FEATURES, CLASSES, &info);
    npy_save(tmp_path("ex.npy"), NPY_DTYPE_F32, 2, N - 1, FEATURES, x);
    void *memory = aligned_alloc(DATA_ALIGN, info.bytes);
    data_set set;
    if (status == QT_OK) status = data_load(&src, &info, memory, info.bytes, &set);
    free(memory);
    CHECK_ERROR(status, QT_ERR_MISMATCH, "changed since it was probed");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// synthetic sources

// Correct predictions on `test` of the nearest class mean, the means taken from `fit` (at most
// 8 classes of 32 features).
static int nearest_mean_correct(const data_set *fit, const data_set *test, int classes,
                                int features) {
    double mean[8][32] = {{0}};
    int count[8] = {0};
    for (uint64_t s = 0; s < fit->info.samples; s++) {
        int l = fit->labels[s];
        count[l]++;
        for (int f = 0; f < features; f++) mean[l][f] += fit->inputs_f32[s * features + f];
    }
    for (int k = 0; k < classes; k++) {
        for (int f = 0; f < features; f++) mean[k][f] /= count[k] > 0 ? count[k] : 1;
    }
    int correct = 0;
    for (uint64_t s = 0; s < test->info.samples; s++) {
        int best = 0;
        double best_d = INFINITY;
        for (int k = 0; k < classes; k++) {
            double d = 0;
            for (int f = 0; f < features; f++) {
                double e = test->inputs_f32[s * features + f] - mean[k][f];
                d += e * e;
            }
            if (d < best_d) best_d = d, best = k;
        }
        correct += best == test->labels[s];
    }
    return correct;
}

static void test_synthetic_classes(void) {
    test_begin("synthetic_classes");
    enum { IN = 24, K = 5, S = 3000 };
    recipe_source src = synthetic_source(RECIPE_SOURCE_CLASSES, IN, K, S, 11);
    data_set a, b, c;
    qt_status sa, sb, sc;
    void *ma = load(&src, IN, K, &a, &sa), *mb = load(&src, IN, K, &b, &sb);
    src.seed = 12;
    void *mc = load(&src, IN, K, &c, &sc);
    CHECK(sa == QT_OK && sb == QT_OK && sc == QT_OK, "load: %s", qt_error_message());
    // 3000 x 24 x 4 = 288000 bytes (a multiple of 256), 3000 labels x 4 = 12000 -> 300032; the
    // class centers 5 x 24 x 4 = 480 -> 300544.
    CHECK(a.info.targets_offset == 288000 && a.info.scratch_offset == 300032 &&
          a.info.scratch_bytes == 480 && a.info.bytes == 300544,
          "layout: targets at %" PRIu64 ", bytes %" PRIu64, a.info.targets_offset, a.info.bytes);
    CHECK(a.inputs_f32 != NULL && a.labels != NULL, "views");
    CHECK(memcmp(ma, mb, a.info.bytes) == 0, "two loads of one seed differ");
    CHECK(memcmp(ma, mc, a.info.targets_offset) != 0, "seeds 11 and 12 give the same inputs");
    // Golden: a change of the generator changes every trace that uses it; update on purpose only.
    // The hash covers the data (the centers in the scratch part are not part of the dataset).
    uint64_t h = fnv(ma, a.info.scratch_offset);
    CHECK(h == 0xfcb76e2f12b255d3ull, "dataset hash %016" PRIx64, h);
    // Labels in range and every class present; a nearest-class-mean classifier (means from the
    // data itself) separates the blobs, as the generator's comment promises.
    int count[K] = {0};
    bool in_range = true;
    for (int s = 0; s < S && in_range; s++) {
        int32_t l = a.labels[s];
        in_range = l >= 0 && l < K;
        CHECK(in_range, "label %d of sample %d", l, s);
        if (in_range) count[l]++;
    }
    for (int k = 0; k < K; k++) CHECK(count[k] > S / K / 2, "class %d has %d samples", k, count[k]);
    int correct = in_range ? nearest_mean_correct(&a, &a, K, IN) : 0;
    // Centers 4.2 noise deviations apart: the Bayes accuracy for 5 classes is about 95%.
    CHECK(correct > S * 85 / 100 && correct < S, "nearest mean accuracy %d / %d", correct, S);
    free(ma), free(mb), free(mc);
    test_end();
}

// zipf=S: label c with probability (c + 1)^-S / sum_k (k + 1)^-S, drawn from the seed and the
// sample's index alone; zipf=0 is the uniform draw, byte for byte.
static void test_synthetic_zipf(void) {
    test_begin("synthetic_classes_zipf_and_spread");
    enum { IN = 8, K = 6, S = 60000 };
    recipe_source src = synthetic_source(RECIPE_SOURCE_CLASSES, IN, K, S, 11);
    data_set a, b, u;
    qt_status sa, sb, su;
    void *mu = load(&src, IN, K, &u, &su);
    src.zipf = 0.0f;  // given explicitly: the same as not given
    void *mz = load(&src, IN, K, &b, &sb);
    CHECK(su == QT_OK && sb == QT_OK && u.info.bytes == b.info.bytes &&
          memcmp(mu, mz, u.info.bytes) == 0, "zipf=0 differs from the uniform draw");
    free(mz);
    src.zipf = 1.0f;
    void *ma = load(&src, IN, K, &a, &sa);
    void *mb = load(&src, IN, K, &b, &sb);
    CHECK(sa == QT_OK && sb == QT_OK, "load: %s", qt_error_message());
    // The centers (6 x 8 x 4 = 192 bytes) and the table after them, u64 [6]: 240 bytes.
    CHECK(a.info.scratch_offset == u.info.scratch_offset && a.info.scratch_bytes == 240,
          "layout: scratch %" PRIu64 " bytes", a.info.scratch_bytes);
    CHECK(memcmp(ma, mb, a.info.bytes) == 0, "two loads of one seed differ");
    // The same task: the same centers as the uniform draw; other labels, hence other inputs.
    CHECK(memcmp((uint8_t *)ma + a.info.scratch_offset, (uint8_t *)mu + u.info.scratch_offset,
                 192) == 0, "zipf= changed the class centers");
    CHECK(memcmp(a.labels, u.labels, S * sizeof(int32_t)) != 0, "zipf=1: the uniform labels");
    // Golden: a change of the skewed draw changes every trace that uses it.
    uint64_t h = fnv(ma, a.info.scratch_offset);
    CHECK(h == 0x74f3bbe69780fb02ull, "dataset hash %016" PRIx64, h);
    // Frequencies within 5 standard deviations of (1 / (c + 1)) / H_6, H_6 = 2.45.
    int count[K] = {0}, uniform[K] = {0};
    for (int s = 0; s < S; s++) {
        if (a.labels[s] >= 0 && a.labels[s] < K) count[a.labels[s]]++;
        if (u.labels[s] >= 0 && u.labels[s] < K) uniform[u.labels[s]]++;
    }
    double harmonic = 0.0;
    for (int c = 0; c < K; c++) harmonic += 1.0 / (c + 1);
    for (int c = 0; c < K; c++) {
        double p = 1.0 / (c + 1) / harmonic, expected = p * S;
        double sd = sqrt(S * p * (1 - p));
        CHECK(fabs(count[c] - expected) < 5 * sd, "class %d: %d samples, expected %.0f", c,
              count[c], expected);
        // The uniform draw: S / K each.
        CHECK(fabs(uniform[c] - (double)S / K) < 5 * sqrt(S * (1.0 / K) * (1 - 1.0 / K)),
              "uniform class %d: %d samples", c, uniform[c]);
    }
    // A steep skew leaves the far classes nearly empty but every label in range.
    src.zipf = 16.0f;
    void *mc = load(&src, IN, K, &b, &sb);
    int first = 0;
    bool in_range = sb == QT_OK;
    for (int s = 0; s < S && in_range; s++) {
        in_range = b.labels[s] >= 0 && b.labels[s] < K;
        first += b.labels[s] == 0;
    }
    CHECK(in_range && first > S - 10, "zipf=16: %d of %d samples in class 0", first, S);
    // spread=3 is the default's draw, byte for byte; spread=30 puts the centers ten times as far.
    src.zipf = 0.0f;
    src.spread = 3.0f;
    void *md = load(&src, IN, K, &b, &sb);
    CHECK(sb == QT_OK && memcmp(md, mu, u.info.bytes) == 0, "spread=3 differs from the default");
    src.spread = 30.0f;
    void *me = load(&src, IN, K, &b, &sb);
    const float *near = (const float *)((uint8_t *)mu + u.info.scratch_offset);
    const float *far = (const float *)((uint8_t *)me + b.info.scratch_offset);
    bool scaled = sb == QT_OK;
    for (int i = 0; i < K * IN && scaled; i++) {
        scaled = fabsf(far[i] - near[i] * 10.0f) <= 1e-5f * fabsf(far[i]);  // a few roundings
    }
    CHECK(scaled && memcmp(b.labels, u.labels, S * sizeof(int32_t)) == 0,
          "spread=30: centers not ten times the default's, or other labels");
    free(ma), free(mb), free(mc), free(mu), free(md), free(me);
    test_end();
}

static void test_synthetic_teacher(void) {
    test_begin("synthetic_teacher");
    enum { IN = 20, OUT = 3, S = 4000 };
    recipe_source src = synthetic_source(RECIPE_SOURCE_TEACHER, IN, OUT, S, 5);
    data_set a, b;
    qt_status sa, sb;
    void *ma = load(&src, IN, OUT, &a, &sa), *mb = load(&src, IN, OUT, &b, &sb);
    CHECK(sa == QT_OK && sb == QT_OK, "load: %s", qt_error_message());
    // Inputs 4000 x 20 x 4 = 320000 (a multiple of 256); targets 4000 x 3 x 4 = 48000 end at
    // 368000 -> 368128; teacher weights 32 x (20 + 3) x 4 = 2944 end at 371072 -> 371200.
    CHECK(a.info.targets_offset == 320000 && a.info.scratch_offset == 368128 &&
          a.info.scratch_bytes == 2944 && a.info.bytes == 371200, "layout: bytes %" PRIu64,
          a.info.bytes);
    CHECK(a.inputs_f32 != NULL && a.targets != NULL && a.labels == NULL, "views");
    CHECK(memcmp(ma, mb, a.info.bytes) == 0, "two loads of one seed differ");
    uint64_t h = fnv(ma, a.info.bytes);
    CHECK(h == 0x70090f64fd5e3e38ull, "dataset hash %016" PRIx64, h);
    // Inputs N(0, 1); targets of unit variance by construction (loose bounds: 4000 samples of a
    // fixed random teacher, whose own scale varies).
    double sx = 0, sxx = 0, syy = 0;
    for (int i = 0; i < S * IN; i++) {
        sx += a.inputs_f32[i];
        sxx += a.inputs_f32[i] * (double)a.inputs_f32[i];
    }
    for (int i = 0; i < S * OUT; i++) syy += a.targets[i] * (double)a.targets[i];
    double mean = sx / (S * IN), var = sxx / (S * IN) - mean * mean, var_y = syy / (S * OUT);
    CHECK(fabs(mean) < 0.02 && fabs(var - 1) < 0.03, "inputs mean %g var %g", mean, var);
    CHECK(var_y > 0.3 && var_y < 3, "targets mean square %g", var_y);
    // Not a constant function.
    CHECK(a.targets[0] != a.targets[OUT] || a.targets[1] != a.targets[OUT + 1], "targets equal");
    free(ma), free(mb);
    test_end();
}

// task= draws the task (class centers, teacher weights) and seed= the samples: an eval source
// with the train source's task and another seed is a fresh sample of the same problem, which a
// classifier fit on the train samples scores well on, while another task scores at chance.
static void test_synthetic_task(void) {
    test_begin("synthetic_task_separate_from_sample_seed");
    enum { IN = 16, K = 4, S = 2000 };
    recipe_source train = synthetic_source(RECIPE_SOURCE_CLASSES, IN, K, S, 3);
    recipe_source fresh = train, other = train, same = train;
    fresh.seed = 4;                 // task 3, other samples
    other.seed = 4, other.task = 4;  // what `seed=4` alone gives: another task
    same.task = 3;                  // task= equal to the default: the same bytes
    data_set a, b, c, d;
    qt_status sa, sb, sc, sd;
    void *ma = load(&train, IN, K, &a, &sa), *mb = load(&fresh, IN, K, &b, &sb);
    void *mc = load(&other, IN, K, &c, &sc), *md = load(&same, IN, K, &d, &sd);
    CHECK(sa == QT_OK && sb == QT_OK && sc == QT_OK && sd == QT_OK, "load: %s",
          qt_error_message());
    CHECK(memcmp(ma, md, a.info.bytes) == 0, "task=seed differs from the default");
    // The centers (scratch part) are the task's; the samples are the seed's.
    CHECK(memcmp((uint8_t *)ma + a.info.scratch_offset, (uint8_t *)mb + b.info.scratch_offset,
                 a.info.scratch_bytes) == 0, "one task, two sets of centers");
    CHECK(memcmp(ma, mb, a.info.targets_offset) != 0, "another seed, the same inputs");
    int fresh_correct = nearest_mean_correct(&a, &b, K, IN);
    int other_correct = nearest_mean_correct(&a, &c, K, IN);
    CHECK(fresh_correct > S * 85 / 100, "fresh samples of the task: %d / %d", fresh_correct, S);
    CHECK(other_correct < S * 50 / 100, "another task: %d / %d", other_correct, S);
    recipe_source teacher = synthetic_source(RECIPE_SOURCE_TEACHER, IN, 2, 64, 5);
    recipe_source teacher_fresh = teacher;
    teacher_fresh.seed = 6;
    void *mt = load(&teacher, IN, 2, &a, &sa), *mf = load(&teacher_fresh, IN, 2, &b, &sb);
    CHECK(sa == QT_OK && sb == QT_OK, "teacher load: %s", qt_error_message());
    CHECK(memcmp((uint8_t *)mt + a.info.scratch_offset, (uint8_t *)mf + b.info.scratch_offset,
                 a.info.scratch_bytes) == 0, "one task, two teachers");
    CHECK(memcmp(mt, mf, a.info.targets_offset) != 0, "another seed, the same teacher inputs");
    free(ma), free(mb), free(mc), free(md), free(mt), free(mf);
    test_end();
}

// Generation is split into ranges by sample (and by weight or center index) that the pool's
// threads take; every count of ranges, on one thread or on the pool, must give the bytes of one
// range, including counts that do not divide the work and counts above it.
static void test_synthetic_threads(void) {
    test_begin("synthetic_threads_same_bytes");
    const struct {
        recipe_source_kind kind;
        uint32_t inputs, outputs;
        uint64_t samples;
        float zipf;
    } cases[] = {
        {RECIPE_SOURCE_CLASSES, 37, 5, 1001, 0.0f},
        {RECIPE_SOURCE_CLASSES, 8, 3, 5, 0.0f},     // fewer samples than threads
        {RECIPE_SOURCE_CLASSES, 13, 9, 1003, 1.5f},  // skewed labels
        {RECIPE_SOURCE_TEACHER, 29, 3, 777, 0.0f},
        {RECIPE_SOURCE_TEACHER, 4, 2, 2, 0.0f},
    };
    const uint32_t counts[] = {2, 3, 7, 16, 61};
    const uint32_t pool_sizes[] = {1, 3};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        recipe_source src = synthetic_source(cases[c].kind, cases[c].inputs, cases[c].outputs,
                                             cases[c].samples, 21);
        src.zipf = cases[c].zipf;
        data_info info;
        qt_status status = data_probe(&src, cases[c].inputs, cases[c].outputs, &info);
        CHECK(status == QT_OK, "probe: %s", qt_error_message());
        if (status != QT_OK) continue;
        uint8_t *one = aligned_alloc(DATA_ALIGN, info.bytes);
        uint8_t *many = aligned_alloc(DATA_ALIGN, info.bytes);
        data_set set;
        memset(one, 0xAB, info.bytes);
        CHECK(data_load_parts(&src, &info, one, info.bytes, &set, 1) == QT_OK, "1 range");
        for (size_t p = 0; p < sizeof pool_sizes / sizeof pool_sizes[0]; p++) {
            pool_stop();
            pool_start(pool_sizes[p]);
            for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
                memset(many, 0xAB, info.bytes);
                status = data_load_parts(&src, &info, many, info.bytes, &set, counts[t]);
                CHECK(status == QT_OK && memcmp(one, many, info.bytes) == 0,
                      "case %zu: %u ranges on %u threads give other bytes than 1", c, counts[t],
                      pool_threads());
            }
        }
        // data_load itself, with the count it picks for the machine and the size.
        memset(many, 0xAB, info.bytes);
        status = data_load(&src, &info, many, info.bytes, &set);
        CHECK(status == QT_OK && memcmp(one, many, info.bytes) == 0,
              "case %zu: data_load gives other bytes", c);
        free(one), free(many);
    }
    test_end();
}

static void test_synthetic_errors(void) {
    test_begin("synthetic_errors");
    recipe_source src = synthetic_source(RECIPE_SOURCE_CLASSES, 8, 4, 100, 1);
    data_info info;
    qt_status status = data_probe(&src, 9, 4, &info);
    CHECK_ERROR(status, QT_ERR_INPUT, "synthetic classes: 8 inputs and 4 classes; "
                "the model has 9 inputs and 4 outputs");
    src.samples = (uint64_t)DATA_SAMPLES_MAX + 1;
    status = data_probe(&src, 8, 4, &info);
    CHECK_ERROR(status, QT_ERR_INPUT, "4294967296 samples; at most 4294967295");
    test_end();
}

// ---------------------------------------------------------------------------------------------
// shuffle

static bool is_permutation(const uint32_t *order, uint32_t n) {
    uint8_t *seen = calloc(n + 1, 1);
    bool ok = true;
    for (uint32_t i = 0; i < n; i++) {
        if (order[i] >= n || seen[order[i]]) ok = false;
        if (order[i] < n) seen[order[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_shuffle(void) {
    test_begin("shuffle");
    uint32_t a[64], b[64];
    for (uint32_t n = 0; n <= 64; n++) {
        data_shuffle(a, n, 3, 0);
        CHECK(is_permutation(a, n), "n = %u: not a permutation", n);
    }
    data_shuffle(a, 64, 3, 5);
    data_shuffle(b, 64, 3, 5);
    CHECK(memcmp(a, b, sizeof a) == 0, "(seed, epoch) = (3, 5) twice differs");
    data_shuffle(b, 64, 3, 6);
    CHECK(memcmp(a, b, sizeof a) != 0, "epochs 5 and 6 give one order");
    data_shuffle(b, 64, 4, 5);
    CHECK(memcmp(a, b, sizeof a) != 0, "seeds 3 and 4 give one order");
    // Golden: the order of seed 7, epoch 0, 10 samples. A change here changes every training run.
    static const uint32_t golden[10] = {7, 5, 0, 1, 8, 2, 4, 6, 9, 3};
    data_shuffle(a, 10, 7, 0);
    CHECK(memcmp(a, golden, sizeof golden) == 0, "order %u %u %u %u %u %u %u %u %u %u", a[0],
          a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    // Uniform: each of 4 samples lands first in a quarter of 24000 epochs (binomial standard
    // deviation 67; 400 is 6 of them).
    int first[4] = {0};
    for (uint64_t e = 0; e < 24000; e++) {
        data_shuffle(a, 4, 1, e);
        first[a[0]]++;
    }
    for (int k = 0; k < 4; k++) CHECK(abs(first[k] - 6000) < 400, "sample %d first %d times", k,
                                      first[k]);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// slots and feeds

// Checks one staged batch of the test IDX set and counts which samples it holds.
static void check_batch(const data_slot_layout *l, const uint8_t *slot, uint32_t rows,
                        data_cursor at, int *seen) {
    data_slot_header h;
    memcpy(&h, slot, sizeof h);
    CHECK(h.rows_valid == rows && h.batch == l->batch && h.features == FEATURES &&
          h.stride == l->stride && h.outputs == CLASSES && h.target_type == DATA_TARGET_LABEL,
          "header rows %u batch %u features %u stride %u", h.rows_valid, h.batch, h.features,
          h.stride);
    CHECK(h.epoch == at.epoch && h.position == at.position, "header cursor %" PRIu64 ".%" PRIu64
          ", expected %" PRIu64 ".%" PRIu64, h.epoch, h.position, at.epoch, at.position);
    CHECK(l->input_type == DATA_INPUT_U8, "IDX pixels are staged as bytes");
    const uint8_t *x = slot + l->inputs_offset;
    const int32_t *labels = (const int32_t *)(slot + l->targets_offset);
    for (uint32_t r = 0; r < l->batch; r++) {
        const uint8_t *row = x + r * l->stride;
        if (r >= rows) {
            bool zero = labels[r] == DATA_LABEL_PAD;
            for (uint32_t f = 0; f < l->stride; f++) zero = zero && row[f] == 0;
            CHECK(zero, "padding row %u: label %d", r, labels[r]);
            continue;
        }
        // pixel 0 is the sample index (< 256 here).
        uint32_t s = row[0];
        bool ok = s < N && labels[r] == (int32_t)(s % CLASSES) && row[1] == 255;
        for (uint32_t f = 0; ok && f < FEATURES; f++) ok = row[f] == pixel_of(s, f);
        for (uint32_t f = FEATURES; ok && f < l->stride; f++) ok = row[f] == 0;
        CHECK(ok, "row %u (sample %u) staged wrong", r, s);
        if (ok) seen[s]++;
    }
}

static void *idx_set(data_set *set) {
    bytes im = idx_images(N, ROWS, COLS), lb = idx_labels(N, CLASSES);
    write_bytes(tmp_path("f_im"), im);
    write_bytes(tmp_path("f_lb"), lb);
    free(im.data), free(lb.data);
    recipe_source src = idx_source(tmp_path("f_im"), tmp_path("f_lb"));
    qt_status status;
    void *memory = load(&src, FEATURES, CLASSES, set, &status);
    if (status != QT_OK) {
        printf("  loading the feed's set: %s\n", qt_error_message());
        abort();
    }
    return memory;
}

static void test_slot_plan(void) {
    test_begin("slot_plan");
    data_set set;
    void *memory = idx_set(&set);
    // Slot: header 64 -> pixels at 256; 8 rows x 16 bytes = 128 -> labels at 512; 32 -> 768.
    // Device batch: 8 rows x 16 floats = 512 -> labels at 768; 32 -> 1024.
    data_slot_layout l = data_slot_plan(&set.info, 8, 16, false);
    CHECK(l.inputs_offset == 256 && l.targets_offset == 512 && l.bytes == 768 && l.stride == 16 &&
          l.input_type == DATA_INPUT_U8,
          "slot %" PRIu64 " %" PRIu64 " %" PRIu64, l.inputs_offset, l.targets_offset, l.bytes);
    data_slot_layout b = data_batch_plan(&set.info, 8, 16, false);
    CHECK(b.inputs_offset == 256 && b.targets_offset == 768 && b.bytes == 1024 &&
          b.input_type == DATA_INPUT_F32,
          "batch %" PRIu64 " %" PRIu64 " %" PRIu64, b.inputs_offset, b.targets_offset, b.bytes);
    l = data_slot_plan(&set.info, 8, 0, false);
    CHECK(l.stride == FEATURES && l.targets_offset == 512, "stride 0 means features");
    CHECK(data_batches_per_epoch(37, 8) == 5 && data_batches_per_epoch(40, 8) == 5 &&
          data_batches_per_epoch(1, 8) == 1, "batches per epoch");
    CHECK(data_order_bytes(37) == 256 && data_order_bytes(65) == 512, "order bytes");
    free(memory);
    test_end();
}

// Two epochs of a shuffled feed: full batches then one padded, every sample once per epoch, a
// different order each epoch; then a second feed resumed at a saved cursor stages the same bytes.
static void test_feed_train_and_resume(void) {
    test_begin("feed_train_and_resume");
    data_set set;
    void *memory = idx_set(&set);
    data_slot_layout l = data_slot_plan(&set.info, 8, 16, false);
    uint8_t *slot = aligned_alloc(DATA_ALIGN, l.bytes), *other = aligned_alloc(DATA_ALIGN, l.bytes);
    uint32_t *order = malloc(data_order_bytes(N)), *order2 = malloc(data_order_bytes(N));
    data_feed f, g;
    data_feed_init(&f, &set, 8, true, 99, order);
    uint32_t first_rows[2][8];
    for (int epoch = 0; epoch < 2; epoch++) {
        int seen[N] = {0};
        for (uint32_t b = 0; b < 5; b++) {
            data_cursor at = f.cursor;
            CHECK(at.epoch == (uint64_t)epoch && at.position == b * 8,
                  "cursor %" PRIu64 ".%" PRIu64, at.epoch, at.position);
            uint32_t rows = data_feed_next(&f, &l, slot);
            CHECK(rows == (b < 4 ? 8u : 5u), "batch %u has %u rows", b, rows);
            check_batch(&l, slot, rows, at, seen);
            if (b == 0) {
                for (int r = 0; r < 8; r++) {
                    first_rows[epoch][r] = slot[l.inputs_offset + r * 16];
                }
            }
        }
        for (int s = 0; s < N; s++) CHECK(seen[s] == 1, "epoch %d: sample %d seen %d times",
                                          epoch, s, seen[s]);
    }
    CHECK(f.cursor.epoch == 2 && f.cursor.position == 0, "cursor after two epochs");
    CHECK(memcmp(first_rows[0], first_rows[1], sizeof first_rows[0]) != 0, "same order twice");
    // Resume: g starts at f's cursor after 3 more batches and must stage what f stages next.
    for (int b = 0; b < 3; b++) data_feed_next(&f, &l, slot);
    data_feed_init(&g, &set, 8, true, 99, order2);
    CHECK(data_feed_seek(&g, f.cursor) == QT_OK, "seek: %s", qt_error_message());
    for (int b = 0; b < 6; b++) {
        uint32_t rf = data_feed_next(&f, &l, slot), rg = data_feed_next(&g, &l, other);
        CHECK(rf == rg && memcmp(slot, other, l.bytes) == 0, "resumed batch %d differs", b);
    }
    data_cursor bad = {0, N};
    CHECK_ERROR(data_feed_seek(&g, bad), QT_ERR_MISMATCH, "data cursor at sample 37 of epoch 0, "
                "but the dataset has 37 samples");
    free(slot), free(other), free(order), free(order2), free(memory);
    test_end();
}

// An eval pass: data_batches_per_epoch steps in file order from position 0 cover every sample
// exactly once, whatever the cursor was before.
static void test_feed_eval_covers_once(void) {
    test_begin("feed_eval_covers_once");
    data_set set;
    void *memory = idx_set(&set);
    for (uint32_t batch = 1; batch <= 40; batch += 3) {
        data_slot_layout l = data_slot_plan(&set.info, batch, 0, false);
        uint8_t *slot = aligned_alloc(DATA_ALIGN, l.bytes);
        data_feed f;
        data_feed_init(&f, &set, batch, false, 0, NULL);
        data_feed_next(&f, &l, slot);  // somewhere in the middle of an earlier pass
        data_cursor start = {f.cursor.epoch, 0};
        CHECK(data_feed_seek(&f, start) == QT_OK, "seek");
        int seen[N] = {0};
        uint64_t steps = data_batches_per_epoch(N, batch), rows_total = 0;
        for (uint64_t b = 0; b < steps; b++) {
            data_cursor at = f.cursor;
            uint32_t rows = data_feed_next(&f, &l, slot);
            uint32_t expected = (b + 1) * batch <= N ? batch : N - (uint32_t)b * batch;
            CHECK(rows == expected, "batch %u step %" PRIu64 ": %u rows", batch, b, rows);
            check_batch(&l, slot, rows, at, seen);
            // File order: the first row is the sample at the cursor.
            uint32_t s = slot[l.inputs_offset];
            CHECK(s == at.position, "batch %u step %" PRIu64 " starts at sample %u", batch, b, s);
            rows_total += rows;
        }
        CHECK(rows_total == N, "batch %u: %" PRIu64 " rows", batch, rows_total);
        for (int s = 0; s < N; s++) CHECK(seen[s] == 1, "batch %u: sample %d seen %d times",
                                          batch, s, seen[s]);
        free(slot);
    }
    free(memory);
    test_end();
}

// Regression targets: the padded rows of the last batch carry zero targets, the others the set's.
static void test_feed_regression_padding(void) {
    test_begin("feed_regression_padding");
    recipe_source src = synthetic_source(RECIPE_SOURCE_TEACHER, 6, 2, 10, 3);
    data_set set;
    qt_status status;
    void *memory = load(&src, 6, 2, &set, &status);
    CHECK(status == QT_OK, "load: %s", qt_error_message());
    data_slot_layout l = data_slot_plan(&set.info, 4, 8, false);
    uint8_t *slot = aligned_alloc(DATA_ALIGN, l.bytes);
    memset(slot, 0xFF, l.bytes);
    data_feed f;
    data_feed_init(&f, &set, 4, false, 0, NULL);
    data_feed_next(&f, &l, slot);
    data_feed_next(&f, &l, slot);
    uint32_t rows = data_feed_next(&f, &l, slot);
    const float *x = (const float *)(slot + l.inputs_offset);
    const float *y = (const float *)(slot + l.targets_offset);
    CHECK(rows == 2 && f.cursor.epoch == 1 && f.cursor.position == 0, "rows %u", rows);
    for (uint32_t r = 0; r < 4; r++) {
        for (uint32_t k = 0; k < 2; k++) {
            float expected = r < 2 ? set.targets[(8 + r) * 2 + k] : 0.0f;
            CHECK(memcmp(&y[r * 2 + k], &expected, 4) == 0, "target %u.%u", r, k);
        }
        for (uint32_t c = 0; c < 8; c++) {
            float expected = r < 2 && c < 6 ? set.inputs_f32[(8 + r) * 6 + c] : 0.0f;
            CHECK(memcmp(&x[r * 8 + c], &expected, 4) == 0, "input %u.%u", r, c);
        }
    }
    free(slot), free(memory);
    test_end();
}

// A batch an embedder holds is staged as the feed stages the same samples (every byte but the
// header's cursor), for both input types, labels and targets; without targets its rows carry the
// padding rows' label.
static void test_stage_rows_like_feed(void) {
    test_begin("stage_rows_like_the_feed");
    data_set sets[2];
    void *memory[2];
    qt_status status;
    recipe_source teacher = synthetic_source(RECIPE_SOURCE_TEACHER, 6, 2, 10, 3);
    memory[0] = idx_set(&sets[0]);
    memory[1] = load(&teacher, 6, 2, &sets[1], &status);
    for (int k = 0; k < 2; k++) {
        const data_set *set = &sets[k];
        uint32_t batch = 4, features = set->info.features;
        data_slot_layout l = data_slot_plan(&set->info, batch, features + 2, false);
        uint8_t *fed = aligned_alloc(DATA_ALIGN, l.bytes), *given = aligned_alloc(DATA_ALIGN,
                                                                                   l.bytes);
        memset(given, 0xAB, l.bytes);
        data_feed f;
        data_feed_init(&f, set, batch, false, 0, NULL);
        uint64_t first = 0;
        uint32_t rows = 0;
        while (f.cursor.epoch == 0) {  // to the epoch's last batch, padded when it is short
            first = f.cursor.position;
            rows = data_feed_next(&f, &l, fed);
        }
        bool u8 = set->info.input_type == DATA_INPUT_U8;
        uint64_t at = first * features * (u8 ? 1 : 4);
        const uint8_t *inputs = (u8 ? (const uint8_t *)set->inputs_u8
                                    : (const uint8_t *)set->inputs_f32) + at;
        const int32_t *labels = set->labels ? set->labels + first : NULL;
        const float *targets = set->targets ? set->targets + first * set->info.outputs : NULL;
        data_stage_rows(&l, rows, inputs, labels, targets, given);
        const data_slot_header *h = (const data_slot_header *)(const void *)given;
        CHECK(rows < batch && h->rows_valid == rows && h->epoch == UINT64_MAX &&
                  h->position == 0, "set %d: %u rows, header rows %u", k, rows, h->rows_valid);
        CHECK(memcmp(fed + 64, given + 64, l.bytes - 64) == 0, "set %d: the slots differ", k);
        if (labels) {
            data_stage_rows(&l, rows, inputs, NULL, NULL, given);
            const int32_t *y = (const int32_t *)(const void *)(given + l.targets_offset);
            CHECK(y[0] == DATA_LABEL_PAD && y[rows - 1] == DATA_LABEL_PAD &&
                      memcmp(fed + l.inputs_offset, given + l.inputs_offset,
                             l.targets_offset - l.inputs_offset) == 0,
                  "set %d: an inputs-only batch", k);
        }
        free(fed);
        free(given);
        free(memory[k]);
    }
    test_end();
}

// ---------------------------------------------------------------------------------------------
// Fashion-MNIST, when present: `apt-get download dataset-fashion-mnist` then
// `dpkg -x dataset-fashion-mnist_*.deb .data` in the repository root, or the package installed.

static const char *fashion_dir(void) {
    static const char *const dirs[] = {".data/usr/share/datasets/fashion-mnist",
                                       "/usr/share/datasets/fashion-mnist"};
    for (int i = 0; i < 2; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dirs[i]);
        if (access(path, R_OK) == 0) return dirs[i];
    }
    return NULL;
}

static void check_fashion(const char *dir, const char *split, uint64_t samples) {
    char images[256], labels[256];
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    recipe_source src = idx_source(images, labels);
    data_set set;
    qt_status status;
    void *memory = load(&src, 784, 10, &set, &status);
    CHECK(status == QT_OK, "%s: %s", split, qt_error_message());
    if (status == QT_OK) {
        CHECK(set.info.samples == samples && set.info.image_rows == 28 &&
              set.info.image_cols == 28, "%s: %" PRIu64 " samples", split, set.info.samples);
        // Fashion-MNIST is balanced: a tenth of the samples in each class.
        uint64_t count[10] = {0};
        for (uint64_t s = 0; s < set.info.samples; s++) count[set.labels[s]]++;
        for (int k = 0; k < 10; k++) {
            CHECK(count[k] == samples / 10, "%s: class %d has %" PRIu64, split, k, count[k]);
        }
        CHECK(set.labels[0] == 9, "%s: the first sample is an ankle boot (9), found %d", split,
              set.labels[0]);
    }
    free(memory);
}

static void test_fashion_mnist(void) {
    const char *dir = fashion_dir();
    if (dir == NULL) {
        test_skip("fashion_mnist", "not found in .data/usr/share/datasets/fashion-mnist or "
                  "/usr/share/datasets/fashion-mnist");
        return;
    }
    test_begin("fashion_mnist");
    check_fashion(dir, "train", 60000);
    check_fashion(dir, "t10k", 10000);
    test_end();
}

// ---------------------------------------------------------------------------------------------
// The step's staging ops (qt_sched_stage_u8, qt_sched_copy): a slot of u8 pixels becomes the
// FP32 device batch, or FP32 inputs are copied; the step's amax slots zeroed; the staged inputs'
// amax stored (sched_amax).

// The step's amax slots that a staging op zeroes (op_sched_zero): SLOT_WORDS words of a region
// one word larger on both sides, filled with a pattern before the run.
#define SLOT_WORDS 37u

static arena_handle slots_zeroed_by(rig *r, uint32_t op) {
    arena_handle slots = rig_reserve(r, "amax_slots", (SLOT_WORDS + 2) * 4);
    RIG_OK(op_sched_zero(&r->prog, op, rig_ref(r, slots, 4), SLOT_WORDS * 4));
    return slots;
}

static void slots_fill(rig *r, arena_handle slots) {
    static uint8_t pattern[(SLOT_WORDS + 2) * 4];
    memset(pattern, 0xA5, sizeof pattern);
    RIG_OK(backend_write(&r->be, rig_ref(r, slots, 0), pattern, sizeof pattern));
}

// The span is +0 word by word, the words on either side untouched.
static void slots_check(rig *r, arena_handle slots) {
    uint32_t words[SLOT_WORDS + 2];
    RIG_OK(backend_read(&r->be, words, rig_ref(r, slots, 0), sizeof words));
    CHECK(words[0] == 0xA5A5A5A5u && words[SLOT_WORDS + 1] == 0xA5A5A5A5u,
          "%s: the words beside the slots became %08x and %08x", r->be.info.name, words[0],
          words[SLOT_WORDS + 1]);
    for (uint32_t i = 1; i <= SLOT_WORDS; i++) {
        CHECK(words[i] == 0, "%s: slot word %u is %08x", r->be.info.name, i - 1, words[i]);
    }
}

// The staged inputs' amax (op_sched_amax): its output word and the fold's two words, which are
// zero before the first launch (as at bind) and must be after every launch.
typedef struct stage_amax {
    arena_handle out, fold;
    op_sched_amax desc;
} stage_amax;

static void stage_amax_plan(rig *r, stage_amax *a, uint64_t first, uint64_t count) {
    a->out = rig_reserve(r, "stage_amax", 16);
    a->fold = rig_reserve(r, "stage_fold", 16);
    a->desc = (op_sched_amax){rig_ref(r, a->out, 0), rig_ref(r, a->fold, 0), first, count};
}

// Before a launch: the output holds a stale value (a run that skipped its store would show it).
static void stage_amax_poison(rig *r, const stage_amax *a) {
    uint32_t stale = 0x7F7FFFFFu;
    RIG_OK(backend_write(&r->be, rig_ref(r, a->out, 0), &stale, 4));
}

// One step of a staging test: the step counter set, the slots' zeroed region filled and the
// amax output poisoned, the program run, and the zeroed region checked.
static void stage_run_step(rig *r, arena_handle counter, uint64_t step, arena_handle zeroed,
                           const stage_amax *amax) {
    RIG_OK(backend_write(&r->be, rig_ref(r, counter, 0), &step, 8));
    slots_fill(r, zeroed);
    stage_amax_poison(r, amax);
    RIG_OK(backend_run(&r->be, &r->prog));
    slots_check(r, zeroed);
}

// After a launch: the output is `want`'s bits (max |x| over the FP32 inputs as stored, NaN
// skipped), the fold is zero again.
static void stage_amax_check(rig *r, const stage_amax *a, float want, const char *what) {
    uint32_t got, fold[2];
    RIG_OK(backend_read(&r->be, &got, rig_ref(r, a->out, 0), 4));
    RIG_OK(backend_read(&r->be, fold, rig_ref(r, a->fold, 0), 8));
    CHECK(got == qt_f32_bits(want), "%s %s: inputs' amax %08x, want %08x (%a)",
          r->be.info.name, what, got, qt_f32_bits(want), (double)want);
    CHECK(fold[0] == 0 && fold[1] == 0, "%s %s: the fold is left at %08x %08x",
          r->be.info.name, what, fold[0], fold[1]);
}

// max |v| over n FP32 values (bytes, any alignment), NaN skipped: qt_fp8_amax's rule.
static float stage_amax_of(const uint8_t *values, uint64_t n) {
    float m = 0.0f;
    for (uint64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, values + 4 * i, 4);
        v = fabsf(v);
        if (v > m) m = v;
    }
    return m;
}

typedef struct stage_shape {
    uint32_t rows, stride;
    const char *label;
} stage_shape;

// Runs the op on slot 1 of two (counter 1), then on slot 0 (counter 2), on an open rig and
// checks the batch against the slot byte by byte each time: the header region and the labels
// copied, every pixel b as the float (float)b / 255 computed here; the amax slots it zeroes;
// the stored inputs' amax (pixels below 251 but for one 251 planted at the end in one slot and
// in the middle in the other). Closes the rig.
static void stage_case(rig *rp, const stage_shape *sh) {
    rig *r = rp;
    data_info info = {0};
    info.features = sh->stride - 2;
    info.outputs = 10;
    info.input_type = DATA_INPUT_U8;
    info.target_type = DATA_TARGET_LABEL;
    data_slot_layout slot = data_slot_plan(&info, sh->rows, sh->stride, false);
    data_slot_layout batch = data_batch_plan(&info, sh->rows, sh->stride, false);
    uint32_t pixels = sh->rows * sh->stride;
    arena_handle counter = rig_reserve(r, "counter", 8);
    arena_handle src = rig_reserve(r, "slots", 2 * slot.bytes);
    arena_handle dst = rig_reserve(r, "batch", batch.bytes);
    stage_amax amax;
    stage_amax_plan(r, &amax, 0, 0);
    op_sched_stage_desc d = {0};
    d.counter = rig_ref(r, counter, 0);
    d.dst = rig_ref(r, dst, 0);
    d.src = (op_sched_slots){rig_ref(r, src, 0), slot.bytes, 2};
    d.dst_bytes = batch.bytes;
    d.src_bytes = slot.bytes;
    d.pixels = pixels;
    d.inputs_offset = slot.inputs_offset;
    d.src_targets_offset = slot.targets_offset;
    d.dst_targets_offset = batch.targets_offset;
    d.targets_bytes = (uint32_t)(slot.bytes - slot.targets_offset);
    d.amax = &amax.desc;
    RIG_OK(op_sched_stage_u8(&r->prog, "stage", &d));
    arena_handle zeroed = slots_zeroed_by(r, r->prog.op_count - 1);
    rig_bind(r);
    static uint8_t slots[2 * 16384], out[65536];
    QT_ASSERT(2 * slot.bytes <= sizeof slots && batch.bytes <= sizeof out);
    for (uint64_t i = 0; i < 2 * slot.bytes; i++) slots[i] = (uint8_t)(qt_mix64(i) >> 7);
    for (uint32_t k = 0; k < 2; k++) {
        uint8_t *in = slots + k * slot.bytes + slot.inputs_offset;
        for (uint32_t i = 0; i < pixels; i++) in[i] %= 251;
        in[k ? pixels - 1 : pixels / 2] = 251;
    }
    RIG_OK(backend_write(&r->be, rig_ref(r, src, 0), slots, 2 * slot.bytes));
    for (uint64_t step = 1; step <= 2; step++) {
        stage_run_step(r, counter, step, zeroed, &amax);
        RIG_OK(backend_read(&r->be, out, rig_ref(r, dst, 0), batch.bytes));
        const uint8_t *s1 = slots + (step % 2) * slot.bytes;
        CHECK(memcmp(out, s1, slot.inputs_offset) == 0, "%s: header region differs",
              r->be.info.name);
        CHECK(memcmp(out + batch.targets_offset, s1 + slot.targets_offset, sh->rows * 4) == 0,
              "%s: labels differ", r->be.info.name);
        uint32_t bad = 0;
        for (uint32_t i = 0; i < pixels; i++) {
            float expected = (float)s1[slot.inputs_offset + i] / 255.0f, got;
            memcpy(&got, out + batch.inputs_offset + 4 * i, 4);
            if (memcmp(&got, &expected, 4) != 0 && bad++ < 4) {
                CHECK(false, "%s: pixel %u (%u) became %a, expected %a", r->be.info.name, i,
                      s1[slot.inputs_offset + i], (double)got, (double)expected);
            }
        }
        CHECK(bad == 0, "%s: %u pixels differ", r->be.info.name, bad);
        stage_amax_check(r, &amax, stage_amax_of(out + batch.inputs_offset, pixels),
                         sh->label);
    }
    rig_close(r);
}

// qt_sched_copy as a step's first op: slot 1 of three (counter 4), then slot 2 (counter 5), into
// the batch, the amax slots zeroed and the amax of the FP32 inputs in the middle of the slot
// (random bit patterns: NaNs, infinities and subnormals among them) stored. Closes the rig.
static void stage_copy_case(rig *r) {
    enum { COPY_BYTES = 16 * 4096 + 48 };  // a grid of 17 blocks, and a tail
    enum { FIRST = 48, COUNT = (COPY_BYTES - FIRST - 16) / 4 };
    arena_handle counter = rig_reserve(r, "counter", 8);
    arena_handle src = rig_reserve(r, "slots", 3 * COPY_BYTES);
    arena_handle dst = rig_reserve(r, "batch", COPY_BYTES);
    stage_amax amax;
    stage_amax_plan(r, &amax, FIRST, COUNT);
    op_sched_slots to = {rig_ref(r, dst, 0), 0, 1};
    op_sched_slots from = {rig_ref(r, src, 0), COPY_BYTES, 3};
    RIG_OK(op_sched_copy(&r->prog, "stage", rig_ref(r, counter, 0), to, from, COPY_BYTES,
                         &amax.desc));
    arena_handle zeroed = slots_zeroed_by(r, r->prog.op_count - 1);
    rig_bind(r);
    static uint8_t slots[3 * COPY_BYTES], out[COPY_BYTES];
    for (uint64_t i = 0; i < sizeof slots; i++) slots[i] = (uint8_t)(qt_mix64(i + 5) >> 9);
    // Slot 1's first input is -Inf (its amax +Inf); slot 2's word just past the range is +Inf,
    // which must not count. Every other word is a random bit pattern.
    float minus_inf = -INFINITY, inf = INFINITY;
    memcpy(slots + COPY_BYTES + FIRST, &minus_inf, 4);
    for (uint32_t i = 0; i < COUNT; i++) {  // no infinity in slot 2's range
        uint8_t *exponent = slots + 2 * COPY_BYTES + FIRST + 4 * i + 3;
        if ((*exponent & 0x7F) == 0x7F) *exponent &= 0xFE;
    }
    memcpy(slots + 2 * COPY_BYTES + FIRST + 4 * COUNT, &inf, 4);
    RIG_OK(backend_write(&r->be, rig_ref(r, src, 0), slots, sizeof slots));
    for (uint64_t step = 4; step <= 5; step++) {
        stage_run_step(r, counter, step, zeroed, &amax);
        RIG_OK(backend_read(&r->be, out, rig_ref(r, dst, 0), sizeof out));
        const uint8_t *slot = slots + (step % 3) * COPY_BYTES;
        CHECK(memcmp(out, slot, COPY_BYTES) == 0, "%s: the batch is not slot %u",
              r->be.info.name, (unsigned)(step % 3));
        stage_amax_check(r, &amax, stage_amax_of(slot + FIRST, COUNT), "copy");
    }
    rig_close(r);
}

// Rows of 13 pixels (four 16-pixel chunks and a tail of one, one block), and 300 rows of 29
// (three blocks, the planted maximum in the last one or in the middle).
static const stage_shape stage_shapes[] = {{5, 13, "5x13"}, {300, 29, "300x29"}};

static void test_stage_u8(void) {
    static rig r;
    const char *why = NULL;
    for (int kind = 0; kind < 2; kind++) {
        const char *suffix = kind ? "gpu" : "ref";
        char u8_name[64], copy_name[64];
        snprintf(u8_name, sizeof u8_name, "stage_u8_and_its_amax_%s", suffix);
        snprintf(copy_name, sizeof copy_name, "stage_copy_zeroes_amax_slots_and_takes_amax_%s",
                 suffix);
        if (!rig_open(&r, kind ? BACKEND_GPU : BACKEND_REF, &why)) {
            test_skip(u8_name, why);
            test_skip(copy_name, why);
            continue;
        }
        test_begin(u8_name);
        for (size_t i = 0; i < sizeof stage_shapes / sizeof stage_shapes[0]; i++) {
            if (i > 0) rig_open(&r, kind ? BACKEND_GPU : BACKEND_REF, &why);
            stage_case(&r, &stage_shapes[i]);
        }
        test_end();
        rig_open(&r, kind ? BACKEND_GPU : BACKEND_REF, &why);
        test_begin(copy_name);
        stage_copy_case(&r);
        test_end();
    }
}

// ---------------------------------------------------------------------------------------------

static void remove_tmp_dir(void) {
    char command[128];
    snprintf(command, sizeof command, "rm -rf '%s'", tmp_dir);
    if (system(command) != 0) printf("  could not remove %s\n", tmp_dir);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qt_test_data_XXXXXX");
    if (mkdtemp(tmp_dir) == NULL) {
        printf("FAIL test_data: cannot create a temporary folder\n");
        return 1;
    }
    test_idx_plain_and_gzip();
    test_idx_probe_reads_headers_only();
    test_idx_errors();
    test_idx_gzip_errors();
    test_idx_gzip_damage_named();
    test_idx_changed_after_probe();
    test_npy_u8_like_idx();
    test_npy_f32_targets();
    test_npy_errors();
    test_synthetic_classes();
    test_synthetic_zipf();
    test_synthetic_teacher();
    test_synthetic_task();
    test_synthetic_threads();
    test_synthetic_errors();
    test_shuffle();
    test_slot_plan();
    test_feed_train_and_resume();
    test_feed_eval_covers_once();
    test_feed_regression_padding();
    test_stage_rows_like_feed();
    test_fashion_mnist();
    test_stage_u8();
    remove_tmp_dir();
    return test_exit_code();
}
