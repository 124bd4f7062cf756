// checkpoint: the checkpoint file of a run (every persistent region of the device arena but the
// batch slots, and the host loop's state), written atomically and read back with every field
// checked; the reader also serves `qtrain export` (runtime/run/export.h).
//
// Owns the layout of one run's checkpoints (ckpt_layout, inside the caller's run struct, from
// ckpt_plan for as long as the run lives) and, while a reader is open, its file descriptor and
// the table it read (ckpt_reader, caller storage). Data crosses between the file and the device
// through one pinned host-arena region (category staging, planned by ckpt_plan) in chunks, so
// nothing allocates: on the GPU each chunk is one copy into or out of that region, on the
// reference backend the same calls are plain copies. One thread.
//
// File format, version 1 (little-endian, the structs below as they are in memory):
//
//   0                 256                                 table_offset        file_bytes - 16
//   +-----------------+-------+-------+-----+--------------+------------------+---------+
//   | ckpt_header     | region| region| ... | region n - 1 | ckpt_region [n]  | trailer |
//   | magic, version, | 0     | 1     |     |              | ckpt_param [p]   | 16 B    |
//   | sizes, recipe,  | data  | data  |     |              | ckpt_host        |         |
//   | seed, CRC       |       |       |     |              | (the table)      |         |
//   +-----------------+-------+-------+-----+--------------+------------------+---------+
//   each region's data starts at a multiple of CKPT_ALIGN; the gaps are zero bytes
//
//   header   magic "QTRAINCK", version, the byte counts above, the recipe's text hash (the
//            trace header's), its file name, the seed (shuffle, initialization and stochastic
//            rounding are keyed by it: the run's only random key), the steps done; the CRC-32
//            of its first 252 bytes last
//   regions  every persistent device region with bytes, in handle order: quantized weights with
//            their scales in every usage, FP32 masters, Adam moments, delayed-scaling histories
//            and scales, the optimizer state (step counter, learning rate, skip flag), the
//            learning-rate rows, the device step counter; not the device batch slots (the loop
//            stages each step's batch before the step, a resumed run's first step too)
//   table    per region its name, offset, bytes, CRC-32, category, format (ckpt_format) and
//            shape; per parameter its name, stored and unpadded shape and quantizer; the host
//            state (ckpt_host: schedule position, data cursors, summary carry, trace position)
//   trailer  the table's CRC-32, the CRC-32 of every byte before the trailer, "QTCKEND1"
//
// CRC-32 is zlib's (the ISO-HDLC polynomial, as Python's zlib.crc32).
//
// Writing (ckpt_save), through runtime/io/atomic_file.h: PATH.tmp-PID in the same folder (a new
// file), header, regions (device -> staging -> file, chunk by chunk), table, trailer, fsync,
// rename onto PATH (or, when PATH may not be replaced, a link that fails if PATH appeared),
// fsync of the folder. A crash at any point leaves PATH as it was or the complete new file; a
// PATH.tmp-PID left behind is never read (only PATH is).
//
// Reading (ckpt_open, ckpt_match, ckpt_read_data) checks, in this order, and refuses with a
// message naming the field: the magic (not a checkpoint), the version, the header's CRC, the
// file's length (truncated, or bytes after the end), the trailer, the table's CRC and layout;
// against a run: the recipe (its text hash; the message names the first region whose format
// or shape differs, if one does), the seed, every region's name, category, format, shape and
// bytes; then each region's CRC as its data streams in, and the whole file's CRC.
#ifndef QT_CHECKPOINT_H
#define QT_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>  // size_t
#include <stdint.h>

#include "arena/arena.h"                // arena, arena_handle
#include "runtime/io/atomic_file.h"     // atomic_file
#include "runtime/backend/backend.h"    // backend
#include "runtime/model/model.h"        // model
#include "runtime/schedule/schedule.h"  // sched_state

#define CKPT_MAGIC "QTRAINCK"
#define CKPT_END_MAGIC "QTCKEND1"
#define CKPT_VERSION 1
#define CKPT_HEADER_BYTES 256
#define CKPT_TRAILER_BYTES 16
#define CKPT_ALIGN 256                  // region data offsets in the file
#define CKPT_CHUNK_BYTES (4u << 20)     // the staging region: one chunk of data per copy
#define CKPT_PATH_MAX 4096
#define CKPT_NONE UINT32_MAX

// What a region's bytes are, for the table and messages (names: ckpt_format_name).
typedef enum ckpt_format {
    CKPT_FORMAT_BYTES,   // opaque bytes; shape [bytes]
    CKPT_FORMAT_F32,
    CKPT_FORMAT_BF16,
    CKPT_FORMAT_U64,
    CKPT_FORMAT_E4M3,
    CKPT_FORMAT_E5M2,
    CKPT_FORMAT_E2M1X2,  // E2M1 codes, two per byte (low nibble first); shape in codes
    CKPT_FORMAT_E8M0,
    CKPT_FORMAT_COUNT
} ckpt_format;

// What a region holds for the run (names: ckpt_usage_name).
typedef enum ckpt_usage {
    CKPT_USAGE_OTHER,
    CKPT_USAGE_MASTER,       // f32 [rows][cols] parameter (weights: padded columns included)
    CKPT_USAGE_ADAM_M,
    CKPT_USAGE_ADAM_V,
    CKPT_USAGE_ROW_DATA,     // the weight's rowwise codes (or BF16 copy)
    CKPT_USAGE_ROW_SCALE,
    CKPT_USAGE_COL_DATA,
    CKPT_USAGE_COL_SCALE,
    CKPT_USAGE_SCALE_INV,    // per-tensor FP8: f32 [1], both directions
    CKPT_USAGE_AMAX,         // nvfp4 global amax (rowwise; columnwise too without RHT);
                             // current scaling: the amax workspace
    CKPT_USAGE_AMAX_COL,     // nvfp4 with RHT: the columnwise global amax
    CKPT_USAGE_HISTORY,      // delayed scaling: f32 [history][slots]
    CKPT_USAGE_STATE_SCALE,  // delayed scaling: f32 [slots]
    CKPT_USAGE_OPTIM_STEPS,  // u64: the optimizer's counted steps
    CKPT_USAGE_LR_ROWS,      // optim_lr_row [n]
    CKPT_USAGE_COUNTER,      // u64 device step counter
    CKPT_USAGE_COUNT
} ckpt_usage;

typedef enum ckpt_param_kind {
    CKPT_PARAM_WEIGHT,  // [out][in]: a linear layer's weight
    CKPT_PARAM_BIAS,    // [out]
    CKPT_PARAM_GAIN     // [width]: an RMSNorm's gain
} ckpt_param_kind;

typedef struct ckpt_header {
    char magic[8];              // CKPT_MAGIC, no terminator
    uint32_t version;           // CKPT_VERSION
    uint32_t header_bytes;      // CKPT_HEADER_BYTES
    uint64_t file_bytes;
    uint64_t recipe_hash;       // trace_hash of the recipe file's text
    uint64_t seed;
    uint64_t data_offset;       // = header_bytes
    uint64_t table_offset;
    uint64_t table_bytes;       // region_count * 128 + param_count * 128 + sizeof(ckpt_host)
    uint32_t region_count;
    uint32_t param_count;
    uint64_t step;              // steps done (every mode), as in the host state
    uint64_t train_steps;
    char recipe_name[64];       // the recipe file's name without its folder, NUL-terminated
    uint8_t reserved[100];
    uint32_t header_crc;        // CRC-32 of bytes [0, 252)
} ckpt_header;
QT_STATIC_ASSERT(sizeof(ckpt_header) == CKPT_HEADER_BYTES, "ckpt_header is the file's start");

typedef struct ckpt_region {
    char name[ARENA_NAME_MAX];  // the arena region's name, NUL-padded
    uint64_t offset;            // of its data in the file
    uint64_t bytes;             // the region's bytes (its shape's bytes rounded up to 16)
    uint32_t crc;               // CRC-32 of its data
    uint32_t category;          // arena_category
    uint32_t format;            // ckpt_format
    uint32_t usage;             // ckpt_usage
    uint32_t param;             // index into the parameter table, or CKPT_NONE
    uint32_t rank;              // 1 or 2
    uint32_t dims[2];           // shape in elements of `format`, outer first
    uint8_t reserved[16];
} ckpt_region;
QT_STATIC_ASSERT(sizeof(ckpt_region) == 128, "ckpt_region is a table entry on disk");

typedef struct ckpt_param {
    char name[MODEL_NAME_MAX];  // "fc1.weight", "fc1.bias", "rmsnorm1.gamma"
    uint32_t rows, cols;        // stored shape of the master (cols include padding columns)
    uint32_t cols_valid;        // columns without the padding
    uint32_t kind;              // ckpt_param_kind
    uint32_t master;            // region index of its FP32 master
    uint32_t scheme;            // qt_scheme of its quantized copies, or CKPT_NONE
    char quantizer[56];         // rules_quantizer_format: "nvfp4 sr=0 2d=1 rht=0"; "" if none
} ckpt_param;
QT_STATIC_ASSERT(sizeof(ckpt_param) == 128, "ckpt_param is a table entry on disk");

typedef struct ckpt_host {
    sched_state state;          // position, data cursors, summary carry
    uint64_t trace_bytes;       // the trace file's bytes at this step; 0: the run had no trace
    uint64_t trace_records;
    uint64_t trace_hash;        // trace_hash of those bytes
    uint64_t rows_hash;         // sched_rows_hash of the table rows before state.row
    uint32_t row_mode;          // the saving run's row state.row (when it had one)
    uint32_t row_dataset;
    uint64_t row_steps;
    uint32_t row_count;         // rows of the saving run's table
    uint32_t reserved[17];
} ckpt_host;
QT_STATIC_ASSERT(sizeof(ckpt_host) == 256, "ckpt_host is part of the table on disk");

// The header and the table; the entries live in caller memory sized from the model (a run's
// layout) or from the file's header (a reader: ckpt_peek).
typedef struct ckpt_table {
    ckpt_header header;
    ckpt_region *regions;       // [region_capacity]
    ckpt_param *params;         // [param_capacity]
    uint32_t region_capacity, param_capacity;
    ckpt_host host;
} ckpt_table;

// One run's checkpoints, planned with the run.
typedef struct ckpt_layout {
    ckpt_table table;          // what the run's checkpoints hold (CRCs: the last)
    arena_handle *handles;     // [region_capacity]: device region of table entry i; CKPT_NONE
                               // for a master or moment that another rank holds
    // Data parallelism: the owner rank of table entry i when it is a master or a moment that
    // only its owner holds (CKPT_NONE: every rank holds the region). Every rank's layout is the
    // table of the run on one GPU, so the file is the same whatever the GPU count.
    uint32_t *owner;           // [region_capacity]
    const model *model;
    uint32_t *index_of;        // [device regions]: table entry of a device region, or CKPT_NONE
    uint32_t dev_regions;
    arena_handle staging;      // host arena, chunk_bytes, pinned on the GPU
    uint64_t chunk_bytes;
    atomic_file file;                      // during ckpt_save
} ckpt_layout;

// Test hook: called as the writer goes, so a test can kill the process at any point of a save.
typedef enum ckpt_phase {
    CKPT_PHASE_WRITTEN,  // `bytes` bytes of PATH.tmp-PID written so far (after every write)
    CKPT_PHASE_SYNCED,   // PATH.tmp-PID complete and fsynced
    CKPT_PHASE_DONE      // PATH is the new file, its folder fsynced
} ckpt_phase;
typedef void (*ckpt_hook_fn)(void *ctx, ckpt_phase phase, uint64_t bytes);

const char *ckpt_format_name(ckpt_format f);   // "f32", "e2m1x2", ...
const char *ckpt_usage_name(ckpt_usage u);     // "master", "row_scale", ...

// Memory of a layout for `regions` persistent regions (at least the device arena's persistent
// regions with bytes, and ckpt_remote_regions), `params` parameters and a device arena of
// dev_regions regions.
uint64_t ckpt_layout_bytes(uint32_t regions, uint32_t params, uint32_t dev_regions);
// Data parallelism: the table entries of the masters and moments a rank of m does not hold,
// which its layout lists all the same (0 with one rank).
uint32_t ckpt_remote_regions(const model *m);

// Start-up, arenas in PLAN, after every program is built: describes every persistent region
// of m's device arena (format and shape from the model), lays the file out, and reserves the
// staging region in m's host arena: chunk_bytes (0: CKPT_CHUNK_BYTES), at most the largest
// region's bytes, rounded up to CKPT_ALIGN. storage: ckpt_layout_bytes(regions, params, the
// device arena's region count), 16-byte aligned; NULL with counting arenas (the pass that
// sizes the tables: only the staging region is reserved).
// recipe_name: the recipe's path (its folder is dropped).
qt_status ckpt_plan(ckpt_layout *c, const model *m, uint64_t recipe_hash, uint64_t seed,
                    const char *recipe_name, uint64_t chunk_bytes, void *storage,
                    uint32_t regions, uint32_t params);

// Writes the checkpoint of the bound run's device state and `host` atomically to path (see
// above); an existing PATH is replaced only with `replace` (else QT_ERR_INPUT naming --force),
// and never when it is not a regular file. The device must be idle (the schedule loop drains
// before it saves). QT_ERR_IO naming the file on failure, which removes PATH.tmp-PID and leaves
// PATH as it was.
// Data parallelism: rank 0 writes the file; every master and moment that another rank owns
// reaches it first, region by region in table order, by a broadcast from its owner into the
// parameter's gradient region (free between steps) on every rank, which every rank takes part
// in: ranks other than 0 call ckpt_save_share at the same save point instead of ckpt_save.
qt_status ckpt_save(ckpt_layout *c, backend *b, const arena *dev, const arena *host_arena,
                    const ckpt_host *host, const char *path, bool replace, ckpt_hook_fn hook,
                    void *ctx);
qt_status ckpt_save_share(ckpt_layout *c, backend *b, const arena *dev);

typedef struct ckpt_reader {
    int fd;
    char path[CKPT_PATH_MAX];
    uint64_t file_bytes;
    uint32_t table_crc;  // as stored in the trailer (and checked)
    uint32_t file_crc;   // as stored; ckpt_read_data checks it
    ckpt_table table;    // the header and the table as read, in the reader's memory
    uint32_t *target;    // [region_capacity]: ckpt_load_model's device region of file region i
} ckpt_reader;

// Memory of a reader for files of at most `regions` regions and `params` parameters.
uint64_t ckpt_reader_bytes(uint32_t regions, uint32_t params);
// Gives the reader its memory (ckpt_reader_bytes, 16-byte aligned, the caller's); once, before
// any ckpt_open.
void ckpt_reader_init(ckpt_reader *rd, void *storage, uint32_t regions, uint32_t params);

// The table size of the checkpoint at path, after the checks of its header and length that
// ckpt_open makes (same errors), for a reader's memory.
qt_status ckpt_peek(const char *path, uint32_t *regions, uint32_t *params);

// Opens a checkpoint and checks its header, length, trailer and table (CRCs and layout).
// QT_ERR_IO when it cannot be read, QT_ERR_MISMATCH when its table is larger than the reader
// holds (a resumed run's reader holds its own checkpoints: the file is another recipe's),
// QT_ERR_INPUT naming what is wrong otherwise. On failure nothing stays open.
qt_status ckpt_open(ckpt_reader *rd, const char *path);
// Whether the checkpoint is one of this run's: recipe, seed, every region (QT_ERR_MISMATCH).
qt_status ckpt_match(const ckpt_reader *rd, const ckpt_layout *c);
// Streams every byte of the data part in file order through buffer (at least CKPT_ALIGN
// bytes), checking each region's CRC and then the whole file's; sink (NULL: a check only) gets
// each region's data, piece by piece, as it is read. QT_ERR_INPUT naming the region or the file
// on a bad CRC; sink's status on its failure.
typedef qt_status (*ckpt_sink_fn)(void *ctx, uint32_t region, uint64_t offset,
                                  const void *bytes, uint64_t n);
qt_status ckpt_read_data(ckpt_reader *rd, void *buffer, uint64_t buffer_bytes, ckpt_sink_fn sink,
                         void *ctx);
// Reads n bytes of region `region` from `offset` into dst (after ckpt_open).
qt_status ckpt_read_region(const ckpt_reader *rd, uint32_t region, uint64_t offset, void *dst,
                           uint64_t n);
void ckpt_close(ckpt_reader *rd);

// The folder of a path ("." for a bare name): where a checkpoint's temporary file goes.
void ckpt_folder(const char *path, char *folder, size_t folder_bytes);

// Resuming: after ckpt_open and ckpt_match, streams every region into the bound run's device
// arena through the staging region (ckpt_read_data). A failure leaves the device state
// undefined: the caller must not run.
qt_status ckpt_load(ckpt_reader *rd, const ckpt_layout *c, backend *b, const arena *dev,
                    const arena *host_arena);

// `qtrain infer --from`: after ckpt_open, loads what the forward pass reads (every parameter in
// each usage this run has, the masters, the delayed-scaling state) from a checkpoint into a
// bound run whose table may differ from the saving run's: an infer-only run plans no
// columnwise copies, optimizer moments or learning-rate rows, and its step counter, optimizer
// state and workspaces stay its own. The recipe text and seed need not match. Refuses
// (QT_ERR_MISMATCH, naming it) a parameter of this run that the file lacks or holds with another
// shape or quantizer, and a region this run reads that the file lacks or holds in another format
// or shape; then streams the file with every CRC checked (QT_ERR_INPUT on a damaged file, which
// leaves the loaded regions undefined).
qt_status ckpt_load_model(ckpt_reader *rd, const ckpt_layout *c, backend *b, const arena *dev,
                          const arena *host_arena);

#endif  // QT_CHECKPOINT_H
