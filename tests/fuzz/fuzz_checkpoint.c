// Fuzz harness of the checkpoint loader (runtime/run/checkpoint.h): any bytes as a checkpoint file
// are read or refused with a status of the loader and a message, through every way qtrain reads
// one: ckpt_open and the CRC pass of ckpt_read_data, `qtrain export` (export_safetensors), a
// resume of a bound run of tests/fuzz/checkpoint.recipe on the reference backend (run_resume:
// ckpt_match, the position, ckpt_load) and `qtrain infer --from` (ckpt_load_model into it).
// Every input goes in twice: as it is, and with its CRCs made right again (the regions', the
// table's, the header's, the file's, where the header's sizes allow), so that mutations reach
// the checks behind the CRCs.
#include <stddef.h>  // offsetof
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>    // crc32

#include "runtime/run/export.h"
#include "tests/fuzz/fuzz.h"
#include "runtime/run/run.h"

const char *const fuzz_words[] = {
    "QTRAINCK", "QTCKEND1", "\x01\x00\x00\x00", "\x00\x01\x00\x00", "fc1.weight", "head.weight",
    "fc1.weight.row_data", "delayed0.history", "step.optim_steps", "checkpoint.recipe",
    "nvfp4 sr=0 2d=1 rht=0", "\xff\xff\xff\xff", "\x00\x00\x00\x80",
};
const size_t fuzz_words_count = sizeof fuzz_words / sizeof fuzz_words[0];

#define FUZZ_RECIPE "tests/fuzz/checkpoint.recipe"
#define FUZZ_ENTRIES_MAX 4096  // tables larger than this are only peeked at

static recipe the_recipe;
static run the_run;
static backend ref;
static char text[1 << 16];
static ckpt_reader reader;
static uint8_t *reader_memory, *export_memory, *chunk;
static uint64_t export_bytes;

static void check_status(qt_status s, const char *what) {
    if (s != QT_OK && s != QT_ERR_INPUT && s != QT_ERR_IO && s != QT_ERR_MISMATCH &&
        s != QT_ERR_CAPACITY) {
        fuzz_fail("%s: %s: %s", what, qt_status_name(s), qt_error_message());
    }
    if (s != QT_OK && qt_error_message()[0] == '\0') fuzz_fail("%s: no message", what);
}

static void *memory(uint64_t bytes) {
    void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) abort();
    return p;
}

// A bound run of the recipe, ready to resume (its checkpoint layout planned).
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    run_options o;
    memset(&o, 0, sizeof o);
    o.checkpoints = true;
    uint64_t bytes = 0, dev = 0, host = 0;
    qt_status s = recipe_load(FUZZ_RECIPE, text, sizeof text, &the_recipe);
    FILE *f = fopen(FUZZ_RECIPE, "rb");
    size_t n = f ? fread(text, 1, sizeof text, f) : 0;
    if (f) fclose(f);
    if (s == QT_OK) s = run_measure(&the_run, &the_recipe, text, n, &o, &bytes);
    if (s == QT_OK) s = run_plan(&the_run, memory(bytes), bytes);
    run_memory_bytes(&the_run, &dev, &host);
    if (s == QT_OK) s = run_load(&the_run, memory(run_data_bytes(&the_run)),
                                 run_data_bytes(&the_run));
    backend_open_ref(&ref);
    if (s == QT_OK) s = run_bind(&the_run, &ref, memory(dev), memory(host));
    if (s != QT_OK) fuzz_fail("%s: cannot start the run: %s", FUZZ_RECIPE, qt_error_message());
    reader_memory = memory(ckpt_reader_bytes(FUZZ_ENTRIES_MAX, FUZZ_ENTRIES_MAX));
    export_bytes = export_memory_bytes(FUZZ_ENTRIES_MAX, FUZZ_ENTRIES_MAX);
    export_memory = memory(export_bytes);
    chunk = memory(1 << 16);
    return 0;
}

static uint32_t crc_of(const uint8_t *bytes, uint64_t n) {
    return (uint32_t)crc32_z(0, bytes, (size_t)n);
}

// The CRCs of a checkpoint's bytes set to what its contents give, in the order they cover one
// another: every region's (in its table entry), the table's and the file's (in the trailer),
// the header's. Nothing when the header's sizes do not describe the file.
static void repair_crcs(uint8_t *file, size_t size) {
    ckpt_header h;
    if (size < sizeof h + CKPT_TRAILER_BYTES) return;
    memcpy(&h, file, sizeof h);
    uint64_t table = (uint64_t)h.region_count * sizeof(ckpt_region) +
                     (uint64_t)h.param_count * sizeof(ckpt_param) + sizeof(ckpt_host);
    if (h.file_bytes != size || h.table_offset > size || table > size - h.table_offset ||
        h.table_offset + table + CKPT_TRAILER_BYTES != size) {
        return;
    }
    for (uint32_t i = 0; i < h.region_count; i++) {
        ckpt_region e;
        uint8_t *at = file + h.table_offset + (uint64_t)i * sizeof e;
        memcpy(&e, at, sizeof e);
        if (e.offset > size || e.bytes > size - e.offset) continue;
        e.crc = crc_of(file + e.offset, e.bytes);
        memcpy(at, &e, sizeof e);
    }
    uint32_t crcs[2];
    crcs[0] = crc_of(file + h.table_offset, table);
    h.header_crc = crc_of((const uint8_t *)&h, offsetof(ckpt_header, header_crc));
    memcpy(file, &h, sizeof h);
    crcs[1] = crc_of(file, size - CKPT_TRAILER_BYTES);
    memcpy(file + size - CKPT_TRAILER_BYTES, crcs, sizeof crcs);
}

static void load_every_way(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("a.ckpt");
    fuzz_write(path, data, size);
    uint32_t regions = 0, params = 0;
    qt_status s = ckpt_peek(path, &regions, &params);
    check_status(s, "ckpt_peek");
    if (s == QT_OK && regions <= FUZZ_ENTRIES_MAX && params <= FUZZ_ENTRIES_MAX) {
        ckpt_reader_init(&reader, reader_memory, regions, params);
        s = ckpt_open(&reader, path);
        check_status(s, "ckpt_open");
        if (s == QT_OK) {
            check_status(ckpt_read_data(&reader, chunk, 1 << 16, NULL, NULL), "ckpt_read_data");
            ckpt_close(&reader);
        }
        static ckpt_reader exporter;
        s = export_safetensors(&exporter, path, fuzz_path("a.safetensors"), true, true,
                               export_memory, export_bytes);
        check_status(s, "export_safetensors");
        // `qtrain infer --from`: the model's regions of any checkpoint into the bound run.
        ckpt_reader_init(&reader, reader_memory, regions, params);
        s = ckpt_open(&reader, path);
        if (s == QT_OK) {
            s = ckpt_load_model(&reader, &the_run.ckpt, &ref, &the_run.dev, &the_run.host);
            check_status(s, "ckpt_load_model");
            ckpt_close(&reader);
        }
    }
    check_status(run_resume(&the_run, path), "run_resume");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_every_way(data, size);
    uint8_t *repaired = malloc(size ? size : 1);
    memcpy(repaired, data, size);
    repair_crcs(repaired, size);
    if (memcmp(repaired, data, size) != 0) load_every_way(repaired, size);
    free(repaired);
    return 0;
}
