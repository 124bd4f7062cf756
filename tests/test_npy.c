// test_npy: .npy files (runtime/io/npy.c) and atomic result files (runtime/io/atomic_file.c).
//
// Written headers are byte-exact (NumPy's layout: the data at a multiple of 64) and read back;
// headers as other writers produce them (version 2.0, double quotes, keys in another order, no
// trailing comma) are read; every kind of bad file is refused with a message naming the file,
// what was found and what is accepted; existing files are never replaced unless asked, and a
// failed or abandoned write leaves nothing behind. Run from the repository root.
#include <dirent.h>  // opendir, for leftover temporary files
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "tests/files.h"  // tmp_path, file_read, file_write
#include "runtime/io/npy.h"
#include "tests/test.h"

// Up to `bytes` bytes of the file into out; how many it has.
static size_t read_whole(const char *path, uint8_t *out, size_t bytes) {
    size_t size = 0;
    char *data = file_read(path, &size);
    if (!data) return 0;
    memcpy(out, data, size < bytes ? size : bytes);
    free(data);
    return size;
}

// An .npy file from its parts: version (major), the dict text as given (padding added to a
// multiple of 16, as NumPy's older writers did), then `data_bytes` bytes 0, 1, 2, ...
static void write_npy(const char *path, int major, const char *dict, size_t data_bytes) {
    static uint8_t buf[1 << 16];
    size_t pre = major == 1 ? 10 : 12, n = strlen(dict);
    size_t header = (pre + n + 1 + 15) / 16 * 16 - pre;
    memcpy(buf, NPY_MAGIC, 6);
    buf[6] = (uint8_t)major;
    buf[7] = 0;
    buf[8] = (uint8_t)header;
    buf[9] = (uint8_t)(header >> 8);
    if (major > 1) buf[10] = buf[11] = 0;
    memcpy(buf + pre, dict, n);
    memset(buf + pre + n, ' ', header - n - 1);
    buf[pre + header - 1] = '\n';
    for (size_t i = 0; i < data_bytes; i++) buf[pre + header + i] = (uint8_t)i;
    file_write(path, buf, pre + header + data_bytes);
}

static const npy_expect features = {
    "FEATURES", {0, 0, NPY_DTYPE_BIT(NPY_DTYPE_F32) | NPY_DTYPE_BIT(NPY_DTYPE_U8)}};
static const npy_expect labels = {
    "LABELS", {0, NPY_DTYPE_BIT(NPY_DTYPE_I32) | NPY_DTYPE_BIT(NPY_DTYPE_I64) |
                      NPY_DTYPE_BIT(NPY_DTYPE_U8), 0}};
static const npy_expect either = {
    "TARGETS", {0, NPY_DTYPE_BIT(NPY_DTYPE_I32), NPY_DTYPE_BIT(NPY_DTYPE_F32)}};

// Nothing but `expected` names in the folder (no temporary file left behind).
static void check_folder_holds(size_t expected) {
    DIR *d = opendir(tmp_dir);
    size_t count = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        count++;
        CHECK(strstr(e->d_name, ".tmp-") == NULL, "temporary file left: %s", e->d_name);
    }
    if (d) closedir(d);
    CHECK(count == expected, "%zu files in the folder, expected %zu", count, expected);
}

static void clear_folder(void) {
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    char path[512];
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
}

// ---------------------------------------------------------------------------------------------

static void test_write_exact_and_read_back(void) {
    test_begin("npy_write_exact_header_and_read_back");
    clear_folder();
    float values[3][5];
    for (int i = 0; i < 15; i++) values[i / 5][i % 5] = (float)i * 0.5f - 3.0f;
    const char *path = tmp_path("f32.npy");
    npy_writer w;
    uint64_t shape[2] = {3, 5};
    qt_status s = npy_create(&w, path, NPY_DTYPE_F32, 2, shape, false, "--force");
    CHECK(s == QT_OK, "%s", qt_error_message());
    CHECK(!atomic_file_exists(path), "the file exists before the commit");
    if (s == QT_OK) s = npy_write(&w, values[0], 2 * sizeof values[0]);
    if (s == QT_OK) s = npy_write(&w, values[2], sizeof values[2]);
    if (s == QT_OK) s = npy_commit(&w);
    CHECK(s == QT_OK, "%s", qt_error_message());
    // What numpy.save writes for np.zeros((3, 5), np.float32): 128 bytes of header.
    static uint8_t bytes[4096];
    size_t n = read_whole(path, bytes, sizeof bytes);
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }";
    CHECK(n == 128 + sizeof values, "%zu bytes", n);
    CHECK(memcmp(bytes, "\x93NUMPY\x01\x00\x76\x00", 10) == 0, "preamble differs");
    CHECK(memcmp(bytes + 10, dict, strlen(dict)) == 0, "dict differs: %.60s", bytes + 10);
    for (size_t i = 10 + strlen(dict); i < 127; i++) CHECK(bytes[i] == ' ', "byte %zu", i);
    CHECK(bytes[127] == '\n', "no newline before the data");
    CHECK(memcmp(bytes + 128, values, sizeof values) == 0, "data differs");
    npy_info info;
    s = npy_probe(path, &features, &info);
    CHECK(s == QT_OK, "%s", qt_error_message());
    CHECK(info.dtype == NPY_DTYPE_F32 && info.rank == 2 && info.shape[0] == 3 &&
              info.shape[1] == 5 && info.data_offset == 128 && info.data_bytes == 60,
          "info %u %u %" PRIu64 " %" PRIu64, info.dtype, info.rank, info.shape[0],
          info.shape[1]);
    float back[3][5];
    npy_reader r;
    s = npy_open(&r, path, &features);
    if (s == QT_OK) {
        s = npy_read(&r, back, sizeof back);
        npy_close(&r);
    }
    CHECK(s == QT_OK && memcmp(back, values, sizeof back) == 0, "read back: %s",
          qt_error_message());
    // int32 1-D: (7,), and the data at 128 too (10 + 58 bytes of dict + \n do not fit in 64).
    int32_t preds[7] = {0, 1, -1, 9, 3, 3, 2};
    const char *path_i = tmp_path("i32.npy");
    uint64_t shape_i[2] = {7, 1};
    s = npy_create(&w, path_i, NPY_DTYPE_I32, 1, shape_i, false, "--force");
    if (s == QT_OK) s = npy_write(&w, preds, sizeof preds);
    if (s == QT_OK) s = npy_commit(&w);
    CHECK(s == QT_OK, "%s", qt_error_message());
    n = read_whole(path_i, bytes, sizeof bytes);
    const char *dict_i = "{'descr': '<i4', 'fortran_order': False, 'shape': (7,), }";
    CHECK(n == 128 + sizeof preds && memcmp(bytes + 10, dict_i, strlen(dict_i)) == 0 &&
              bytes[127] == '\n' && memcmp(bytes + 128, preds, sizeof preds) == 0,
          "int32 file: %zu bytes, %.60s", n, bytes + 10);
    s = npy_probe(path_i, &labels, &info);
    CHECK(s == QT_OK && info.dtype == NPY_DTYPE_I32 && info.shape[0] == 7 && info.shape[1] == 1,
          "%s", qt_error_message());
    check_folder_holds(2);
    test_end();
}

// Headers as NumPy's versions and other writers make them.
static void test_read_variants(void) {
    test_begin("npy_read_header_variants");
    clear_folder();
    const struct {
        int major;
        const char *dict;
        npy_dtype dtype;
        uint64_t rows, cols;
    } cases[] = {
        {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 6), }", NPY_DTYPE_U8, 4, 6},
        {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_DTYPE_F32, 2, 3},
        {3, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_DTYPE_F32, 2, 3},
        {1, "{\"shape\": (5,3), \"fortran_order\": False, \"descr\": \"<f4\"}", NPY_DTYPE_F32, 5,
         3},
        {1, "{'descr':'<u1','fortran_order':False,'shape':(1,1)}", NPY_DTYPE_U8, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = tmp_path("variant.npy");
        uint64_t bytes = cases[i].rows * cases[i].cols * npy_dtype_bytes(cases[i].dtype);
        write_npy(path, cases[i].major, cases[i].dict, bytes);
        npy_info info;
        qt_status s = npy_probe(path, &features, &info);
        CHECK(s == QT_OK && info.dtype == cases[i].dtype && info.shape[0] == cases[i].rows &&
                  info.shape[1] == cases[i].cols && info.data_offset % 16 == 0,
              "case %zu: %s", i, qt_error_message());
        uint8_t data[64] = {0};
        npy_reader r;
        if (s == QT_OK && npy_open(&r, path, &features) == QT_OK) {
            s = npy_read(&r, data, bytes);
            npy_close(&r);
            CHECK(s == QT_OK && data[bytes - 1] == (uint8_t)(bytes - 1), "case %zu data", i);
        }
    }
    const char *lpath = tmp_path("labels.npy");
    write_npy(lpath, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (9,), }", 72);
    npy_info info;
    qt_status s = npy_probe(lpath, &labels, &info);
    CHECK(s == QT_OK && info.dtype == NPY_DTYPE_I64 && info.rank == 1 && info.shape[0] == 9,
          "int64 labels: %s", qt_error_message());
    test_end();
}

static void expect_refusal(const char *path, const npy_expect *e, const char *const *needles,
                           size_t count) {
    npy_info info;
    qt_status s = npy_probe(path, e, &info);
    CHECK(s != QT_OK, "%s: accepted", path);
    const char *m = qt_error_message();
    CHECK(strstr(m, path) != NULL, "message does not name the file: %s", m);
    for (size_t i = 0; i < count; i++) {
        CHECK(strstr(m, needles[i]) != NULL, "message lacks '%s': %s", needles[i], m);
    }
}

#define REFUSE(path, expect, ...)                                                       \
    do {                                                                                \
        const char *needles_[] = {__VA_ARGS__};                                         \
        expect_refusal(path, expect, needles_, sizeof needles_ / sizeof needles_[0]);   \
    } while (0)

static void test_refusals(void) {
    test_begin("npy_refusals_name_file_found_and_accepted");
    clear_folder();
    const char *p = tmp_path("bad.npy");
    write_npy(p, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 48);
    REFUSE(p, &features, "'<f8' (float64)", "(2, 3)", "FEATURES takes a 2-D array of float32 "
           "('<f4') or uint8 ('|u1')");
    write_npy(p, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
    REFUSE(p, &features, "big-endian float32");
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24);
    REFUSE(p, &features, "Fortran", "ascontiguousarray");
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }", 96);
    REFUSE(p, &features, "shape (2, 3, 4)", "2-D");
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", 24);
    REFUSE(p, &features, "shape (6,)", "2-D");
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 24);
    REFUSE(p, &labels, "LABELS takes a 1-D array of uint8 ('|u1'), int32 ('<i4') or int64 "
           "('<i8')");
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 2), }", 0);
    REFUSE(p, &features, "between 1 and");
    // Sizes: one byte short, one byte too many.
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 23);
    REFUSE(p, &features, "truncated", "needs 24 bytes");
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 25);
    REFUSE(p, &features, "trailing bytes");
    // Malformed headers.
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False}", 24);
    REFUSE(p, &features, "malformed .npy header");
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 24);
    REFUSE(p, &features, "malformed .npy header");
    write_npy(p, 1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,3)}",
              24);
    REFUSE(p, &features, "malformed .npy header");
    write_npy(p, 4, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
    REFUSE(p, &features, "version 4.0");
    file_write(p, "P5\n2 3\n255\n", 11);
    REFUSE(p, &features, "not an .npy file");
    file_write(p, "\x93NUMPY\x01\x00\x76\x00{'descr'", 18);
    REFUSE(p, &features, "truncated", "inside the .npy header");
    npy_info info;
    qt_status s = npy_probe(tmp_path("missing.npy"), &features, &info);
    CHECK(s == QT_ERR_IO && strstr(qt_error_message(), "missing.npy"), "missing file: %s",
          qt_error_message());
    // A role that takes either rank lists both.
    write_npy(p, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", 48);
    REFUSE(p, &either, "TARGETS takes a 1-D array of int32 ('<i4') or a 2-D array of float32 "
           "('<f4')");
    test_end();
}

static void test_no_surprise_overwrite(void) {
    test_begin("npy_atomic_write_refuses_existing_and_cleans_up");
    clear_folder();
    const char *path = tmp_path("out.npy");
    file_write(path, "keep", 4);
    npy_writer w;
    uint64_t shape[2] = {2, 1};
    qt_status s = npy_create(&w, path, NPY_DTYPE_I32, 1, shape, false, "--force");
    CHECK(s == QT_ERR_INPUT && strstr(qt_error_message(), "exists") &&
              strstr(qt_error_message(), "--force"), "existing file: %s", qt_error_message());
    uint8_t bytes[256];
    CHECK(read_whole(path, bytes, sizeof bytes) == 4 && memcmp(bytes, "keep", 4) == 0,
          "the existing file changed");
    // Asked to replace: the new file, whole.
    int32_t v[2] = {5, 6};
    s = npy_create(&w, path, NPY_DTYPE_I32, 1, shape, true, "--force");
    if (s == QT_OK) s = npy_write(&w, v, sizeof v);
    if (s == QT_OK) s = npy_commit(&w);
    CHECK(s == QT_OK && read_whole(path, bytes, sizeof bytes) == 128 + sizeof v,
          "replace: %s", qt_error_message());
    // A short write is refused at the commit and leaves nothing; so does an abandoned one.
    const char *other = tmp_path("short.npy");
    s = npy_create(&w, other, NPY_DTYPE_I32, 1, shape, false, "--force");
    if (s == QT_OK) s = npy_write(&w, v, sizeof v[0]);
    if (s == QT_OK) s = npy_commit(&w);
    CHECK(s == QT_ERR_MISMATCH && !atomic_file_exists(other), "short write: %s",
          qt_error_message());
    s = npy_create(&w, other, NPY_DTYPE_I32, 1, shape, false, "--force");
    npy_abandon(&w);
    npy_abandon(&w);  // twice is harmless
    CHECK(s == QT_OK && !atomic_file_exists(other), "abandoned file exists");
    // A file that appears after the create is not replaced either (link, not rename).
    s = npy_create(&w, other, NPY_DTYPE_I32, 1, shape, false, "--force");
    if (s == QT_OK) s = npy_write(&w, v, sizeof v);
    file_write(other, "late", 4);
    if (s == QT_OK) s = npy_commit(&w);
    CHECK(s == QT_ERR_IO && read_whole(other, bytes, sizeof bytes) == 4 &&
              memcmp(bytes, "late", 4) == 0, "late file: %s", qt_error_message());
    s = npy_create(&w, "/nonexistent-folder/x.npy", NPY_DTYPE_I32, 1, shape, false, "--force");
    CHECK(s == QT_ERR_IO && strstr(qt_error_message(), "folder exists"), "missing folder: %s",
          qt_error_message());
    check_folder_holds(2);
    test_end();
}

int main(void) {
    if (!tmp_dir_make("npy")) {
        printf("FAIL npy_setup: cannot create a temporary folder\n");
        return 1;
    }
    test_write_exact_and_read_back();
    test_read_variants();
    test_refusals();
    test_no_surprise_overwrite();
    tmp_dir_remove();
    return test_exit_code();
}
