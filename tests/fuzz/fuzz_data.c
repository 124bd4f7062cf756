// Fuzz harness of the data readers (runtime/io/data.h, runtime/io/npy.h): IDX pairs, plain or gzip,
// .npy pairs, and a file of inputs alone (`qtrain infer --input`). The input is framed:
//
//   byte 0      mode: 0 IDX pair, 1 .npy pair, 2 inputs alone (mode % 3)
//   bytes 1..4  the model's inputs per sample, 5..8 its outputs (little-endian, clamped to >= 1)
//   bytes 9..12 the length of file A; then file A (images / features), then file B (labels or
//               targets)
//
// Each file is probed against the model; what probes is loaded into memory of the size probed
// (up to 64 MiB) and three batches are drawn from it. Every refusal is a status of the readers
// with a message; a load must give the dataset the probe described.
#include <stdlib.h>
#include <string.h>

#include "runtime/io/data.h"
#include "tests/fuzz/fuzz.h"

const char *const fuzz_words[] = {
    "\x00\x00\x08\x03", "\x00\x00\x08\x01", "\x1f\x8b\x08\x00", "\x93NUMPY\x01\x00",
    "\x93NUMPY\x02\x00", "{'descr': '<f4', 'fortran_order': False, 'shape': (",
    "'descr': '|u1'", "'descr': '<i8'", "'descr': '<i4'", "'descr': '>f4'", "'fortran_order': True",
    "), }", ",)", "(3, 4)", "(0,)", "(4294967296, 1)", "\n", " ", "\xff\xff\xff\xff",
    "\x00\x00\x00\x00", "\x7f\x80\x00\x00", "\xff\xc0\x00\x00",
};
const size_t fuzz_words_count = sizeof fuzz_words / sizeof fuzz_words[0];

#define FUZZ_DATA_BYTES_MAX (64u << 20)

static void check_status(qt_status s, const char *what) {
    if (s != QT_OK && s != QT_ERR_INPUT && s != QT_ERR_IO) {
        fuzz_fail("%s: %s: %s", what, qt_status_name(s), qt_error_message());
    }
    if (s != QT_OK && qt_error_message()[0] == '\0') fuzz_fail("%s: no message", what);
}

// A few batches of the loaded set, shuffled and in order.
static void draw(const data_set *set) {
    uint32_t batch = set->info.samples < 5 ? (uint32_t)set->info.samples : 5;
    data_slot_layout layout = data_slot_plan(&set->info, batch, set->info.features, false);
    uint8_t *slot = aligned_alloc(DATA_ALIGN, layout.bytes);
    uint64_t order_bytes = data_order_bytes(set->info.samples);
    uint32_t *order = aligned_alloc(DATA_ALIGN, order_bytes ? order_bytes : DATA_ALIGN);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        data_feed feed;
        data_feed_init(&feed, set, batch, shuffle == 1, 7, shuffle ? order : NULL);
        for (int k = 0; k < 3; k++) {
            uint32_t rows = data_feed_next(&feed, &layout, slot);
            if (rows == 0 || rows > batch) fuzz_fail("a batch of %u rows (batch %u)", rows, batch);
        }
    }
    free(order);
    free(slot);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 13) return 0;
    uint32_t mode = data[0] % 3;
    uint32_t features = fuzz_u32(data, size, 1) % (1u << 20), outputs = fuzz_u32(data, size, 5);
    features = features ? features : 1;
    outputs = outputs % 65536 ? outputs % 65536 : 1;
    size_t a = fuzz_u32(data, size, 9), rest = size - 13;
    if (a > rest) a = rest;
    const char *path_a = fuzz_path(mode == 1 ? "a.npy" : "a.idx");
    const char *path_b = fuzz_path(mode == 1 ? "b.npy" : "b.idx");
    fuzz_write(path_a, data + 13, a);
    fuzz_write(path_b, data + 13 + a, rest - a);
    recipe_source src;
    memset(&src, 0, sizeof src);
    if (mode == 2) {
        qt_status s = data_source_inputs(path_a, &src);
        check_status(s, "data_source_inputs");
        if (s != QT_OK) return 0;
    } else {
        src.kind = mode == 1 ? RECIPE_SOURCE_NPY : RECIPE_SOURCE_IDX;
        strcpy(src.images, path_a);
        strcpy(src.labels, path_b);
        src.line = 1;
    }
    data_info info;
    qt_status s = data_probe(&src, features, outputs, &info);
    check_status(s, "data_probe");
    if (s != QT_OK || info.bytes > FUZZ_DATA_BYTES_MAX) return 0;
    if (info.features != features || info.samples == 0) {
        fuzz_fail("probed %llu samples of %u features for a model of %u",
                  (unsigned long long)info.samples, info.features, features);
    }
    void *dst = aligned_alloc(DATA_ALIGN, info.bytes ? info.bytes : DATA_ALIGN);
    data_set set;
    s = data_load(&src, &info, dst, info.bytes, &set);
    check_status(s, "data_load");
    if (s == QT_OK) draw(&set);
    free(dst);
    return 0;
}
