// data: datasets (IDX files, .npy files, seeded synthetic sources), the per-epoch shuffle, the data
// cursor and the assembly of batches into pinned host staging slots.
//
// Owns no memory. The caller (the planner) learns every size first and gives the bytes:
//
//   data_probe(source)  reads only the IDX or .npy headers (a .gz file is inflated just far
//                       enough to see its header) or the synthetic parameters -> data_info with
//                       the bytes of the dataset (caller memory outside the arenas: only the
//                       host reads it, runtime/run/run.c)
//   data_order_bytes    the shuffle's index table (train feeds only, beside the datasets)
//   data_slot_plan      one staging slot; the schedule loop has three (pinned host arena)
//   data_load           fills the dataset region once, at start-up, validating everything
//   data_feed_next      fills one slot with the next batch, per step, without allocating
//   data_stage_rows     fills one slot with a batch an embedder gives, likewise
//
// The dataset region, from data_load until the end of the run (offsets are in data_info):
//
//   0 = inputs_offset             targets_offset              scratch_offset            bytes
//   +-----------------------------+---------------------------+-------------------------+
//   | inputs (samples, features)  | labels (samples) i32, or  | teacher weights or class|
//   | u8 (IDX, npy uint8) or f32  | targets (samples, outputs)| centers f32 (synthetic; |
//   |                             | f32                       | data_load, then idle)   |
//   +-----------------------------+---------------------------+-------------------------+
//   each part starts at a multiple of DATA_ALIGN; bytes is rounded up to one; with zipf= the
//   scratch part holds the labels' cumulative table (u64 [classes]) after the class centers
//
// Input precision, a decision: IDX pixels stay bytes in the dataset (exact, a quarter of the
// pinned memory FP32 would take: 47 MB instead of 188 MB for Fashion-MNIST) and in the staging
// slot, so a step moves a quarter of the bytes over PCIe; the step's first op (qt_sched_stage_u8)
// turns them into FP32 x/255 (one correctly rounded division, the same bits on every machine and
// on both backends) in the device batch. The device batch, which the model's first op reads,
// always holds FP32: it is the high-precision input that the first quantizer casts, and BF16
// would round the data before the recipe does. Synthetic FP32 inputs are staged as they are.
// .npy features follow their dtype: uint8 ones are pixels like IDX (x / 255 on the device), float32
// ones are staged as they are, like synthetic inputs.
//
// Sources without targets: an idx or npy source whose labels path is empty (`qtrain infer`'s
// input) has only inputs; its labels are all DATA_LABEL_PAD, which the infer program never reads.
//
// One staging slot and one device batch (offsets in data_slot_layout; 256-byte aligned so device
// copies vectorize). The batch (data_batch_plan) has the slot's layout with FP32 inputs:
//
//   0                  256                          targets_offset                   bytes
//   +------------------+----------------------------+--------------------------------+
//   | data_slot_header | inputs (batch, stride): u8 | labels (batch) i32, or         |
//   | (64 bytes, then  | pixels (IDX) or f32; the   | targets (batch, outputs) f32;  |
//   | zeros)           | columns from `features` 0  | padding rows: label -1, zeros  |
//   +------------------+----------------------------+--------------------------------+
//   gaps between the parts are zero, so every byte of a slot is a function of the batch
//
// Batches, a decision: a batch never crosses an epoch. The last batch of an epoch holds the
// remaining samples and is padded to the batch size: padding rows have zero inputs, label -1 and
// zero targets, and the header's rows_valid says how many rows are real, so the loss and the
// accuracy count only those (softmax_xent skips label -1, mse skips rows >= rows_valid). Padding
// instead of dropping keeps every sample in every epoch, keeps the batch shape fixed for the
// captured graphs, and makes an eval pass (data_batches_per_epoch steps from position 0, file
// order) cover the whole set exactly once.
//
// Shuffle: epoch e of a shuffled feed visits samples in a Fisher-Yates permutation of the
// identity drawn from Philox keyed by (seed, e) (ptx/philox.h). The permutation depends on
// nothing but (seed, epoch, samples), so a data_cursor {epoch, position} alone, saved in a
// checkpoint, restores the exact sequence of batches.
//
// Resident datasets (`resident = on`, a decision of the recipe): the run also keeps each
// dataset's inputs and targets (the dataset region's first two parts, as data_load laid them
// out) in the device arena, and a feed made resident (data_feed_resident) fills a slot with
// the batch's sample indices instead of its rows: the slot then has an indices part, u32
// [batch] (DATA_INDEX_PAD for a padding row), between the header and the inputs, and only its
// first inputs_offset bytes cross PCIe (data_slot_copy_bytes). The step's staging op,
// qt_sched_gather (ptx/sched_ops.h), builds the device batch from the slot's header and the rows
// and targets its indices name, the very values the other staging ops make of a slot that
// data_feed_next filled with rows, so every later op sees the same bytes either way. A slot
// whose header says rows (a batch an embedder pushed) is copied whole, and the gather stages it
// as it is.
//
//   0                  256              inputs_offset        targets_offset          bytes
//   +------------------+----------------+--------------------+-----------------------+
//   | data_slot_header | indices u32    | inputs: not filled | targets: not filled   |
//   | (dataset = k+1)  | [batch]        | nor copied         | nor copied            |
//   +------------------+----------------+--------------------+-----------------------+
//
// Staging (runtime/schedule/schedule.h): the host fills the slot of step s + 1 while step s runs,
// the copy engine moves the whole slot into a device copy of the same layout, and the step's first
// op reads that copy. A feed only writes the slot it is given; the caller makes sure no copy still
// reads it.
//
// Threads: data_load generates synthetic sources on the thread pool (runtime/base/pool.h; it starts
// the pool when no one has), in one range per pool thread (one per 2^18 values at least); the
// bytes are the same for any number of ranges and threads.
//
// Callers: the runtime at start-up (probe, load) and the schedule loop (feeds), one thread.
#ifndef QT_DATA_H
#define QT_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "ptx/qt_hd.h"            // QT_STATIC_ASSERT
#include "recipes/recipe.h"       // recipe_source
#include "runtime/base/status.h"  // qt_status

#define DATA_ALIGN 256                       // dataset parts and slot parts start at multiples
#define DATA_SAMPLES_MAX UINT32_MAX          // the shuffle indexes samples with 32 bits
QT_STATIC_ASSERT(RECIPE_SAMPLES_MAX == DATA_SAMPLES_MAX, "the parser refuses what cannot be held");
#define DATA_TEACHER_HIDDEN 32               // hidden width of the synthetic teacher network
#define DATA_LABEL_PAD (-1)                  // the label of a padding row
#define DATA_INDEX_PAD UINT32_MAX            // a resident slot's index of a padding row
#define DATA_DATASET_TRAIN 0u                // resident datasets: the header's dataset - 1
#define DATA_DATASET_EVAL 1u
#define DATA_DATASETS 2u                     // train and eval

typedef enum data_input_type {
    DATA_INPUT_U8,   // IDX pixels, npy uint8 features; staged as x / 255
    DATA_INPUT_F32   // synthetic, npy float32 features; staged as is
} data_input_type;

typedef enum data_target_type {
    DATA_TARGET_LABEL,  // one int32 class index per sample, 0 <= label < outputs
    DATA_TARGET_VALUES  // `outputs` FP32 regression targets per sample
} data_target_type;

typedef struct data_info {
    recipe_source_kind kind;
    uint64_t samples;
    uint32_t features;        // inputs per sample (IDX: rows * cols)
    uint32_t image_rows;      // IDX: dims 2 and 3 of the image file; synthetic: 1, features
    uint32_t image_cols;
    uint32_t outputs;         // classes (labels) or target width (values)
    data_input_type input_type;
    data_target_type target_type;
    uint64_t inputs_offset, inputs_bytes;
    uint64_t targets_offset, targets_bytes;
    uint64_t scratch_offset, scratch_bytes;  // used during data_load only (synthetic sources)
    uint64_t bytes;           // what data_load needs, a multiple of DATA_ALIGN
} data_info;

// A loaded dataset: views into the region given to data_load.
typedef struct data_set {
    data_info info;
    const uint8_t *inputs_u8;  // (samples, features) when input_type is U8, else NULL
    const float *inputs_f32;   // (samples, features) when input_type is F32, else NULL
    const int32_t *labels;     // (samples) when target_type is LABEL, else NULL
    const float *targets;      // (samples, outputs) when target_type is VALUES, else NULL
} data_set;

// Where the next batch starts: part of checkpoints. position is the index, in the epoch's visiting
// order, of the next sample; it is always below the number of samples.
typedef struct data_cursor {
    uint64_t epoch;
    uint64_t position;
} data_cursor;
QT_STATIC_ASSERT(sizeof(data_cursor) == 16, "data_cursor is saved in checkpoints");

// The first bytes of every staging slot; the device reads rows_valid (mse) from here.
typedef struct data_slot_header {
    uint32_t rows_valid;      // real rows; rows_valid..batch-1 are padding
    uint32_t batch;
    uint32_t features;
    uint32_t stride;          // input elements per row (>= features)
    uint32_t outputs;
    uint32_t target_type;     // data_target_type
    uint64_t epoch;           // cursor of the batch's first row, for checks and traces
    uint64_t position;
    uint32_t rows_global;     // real rows of the whole batch that this slot is a share of (data
                              // parallelism: every rank stages its share); rows_valid without
    uint32_t dataset;         // 0: the rows are in the slot; k + 1: the slot holds indices into
                              // resident dataset k (DATA_DATASET_*)
    uint64_t reserved[2];
} data_slot_header;
QT_STATIC_ASSERT(sizeof(data_slot_header) == 64, "data_slot_header layout (read by the device)");

typedef struct data_slot_layout {
    uint32_t batch;
    uint32_t features;
    uint32_t stride;
    uint32_t outputs;
    data_target_type target_type;
    data_input_type input_type;  // element type of the inputs part
    bool resident;            // an indices part: the run's datasets are resident
    uint64_t indices_offset;  // (batch) u32 when resident, else 0
    uint64_t inputs_offset;   // (batch, stride) u8 or f32
    uint64_t targets_offset;  // (batch) i32 or (batch, outputs) f32
    uint64_t bytes;           // a multiple of DATA_ALIGN
} data_slot_layout;

// A stream of batches from one dataset.
typedef struct data_feed {
    const data_set *set;
    uint32_t batch;
    bool shuffle;             // train: per-epoch shuffle; eval and infer: file order
    uint64_t seed;
    uint32_t *order;          // (samples) visiting order of order_epoch (shuffle only)
    uint64_t order_epoch;     // the epoch `order` holds; UINT64_MAX: none yet
    data_cursor cursor;       // the next batch
    // Data parallelism (runtime/parallel/parallel.h): the feed's batch is the global batch, and
    // this feed stages rows [share_first, share_first + share_rows) of each one, from the same
    // shuffle on every rank; the cursor advances by the whole batch. A plain feed's share is the
    // batch.
    uint32_t share_first, share_rows;
    // 0: the feed stages rows; k + 1: it stages indices into resident dataset k (its own set,
    // which the run keeps on the device as that dataset).
    uint32_t dataset;
} data_feed;

// Reads the headers of an IDX or .npy pair (or the parameters of a synthetic source), checks them
// against the model (`features` inputs per sample; `outputs` classes for labels or target values
// per sample) and fills *info. An .npy pair's second file decides the target type: 1-D integers
// are labels, 2-D float32 regression targets (the caller checks that against the loss). Errors
// name the file and the fix: a missing or unreadable file (QT_ERR_IO), a bad magic, dims, dtype
// or header, a truncated file, counts that differ between inputs and labels, widths that do not
// match the model, more than DATA_SAMPLES_MAX samples (QT_ERR_INPUT). The messages of
// data_probe and data_load do not name the recipe: the runtime puts the position of the line
// that gave the source in front (runtime/run/run.c).
qt_status data_probe(const recipe_source *src, uint32_t features, uint32_t outputs,
                     data_info *info);

// The inputs-only source of a file given on its own (`qtrain infer --input`): .npy features when
// it starts with the .npy magic, else IDX images (plain or gzip; data_probe checks the magic).
// QT_ERR_IO when it cannot be read, QT_ERR_INPUT when the path is too long.
qt_status data_source_inputs(const char *path, recipe_source *out);

// Fills dst (DATA_ALIGN aligned, at least info->bytes) with the dataset that data_probe described:
// IDX files are read (through zlib when they start with the gzip magic, whatever their name) and
// checked to the last byte (same headers as when probed, no truncation, no trailing bytes, the
// gzip CRC, labels below outputs); .npy files likewise (labels widened to int32 and checked,
// float32 features and targets finite); synthetic sources are generated (deterministic functions
// of their seed) on the thread pool. Uses about 64 KiB of stack for the inflate state and
// window.
qt_status data_load(const recipe_source *src, const data_info *info, void *dst, uint64_t bytes,
                    data_set *set);
// data_load with synthetic sources cut into `parts` ranges (at least 1): the same bytes for every
// count, which the tests check.
qt_status data_load_parts(const recipe_source *src, const data_info *info, void *dst,
                          uint64_t bytes, data_set *set, uint32_t parts);

// Bytes of the shuffle's index table for a dataset of `samples` samples.
uint64_t data_order_bytes(uint64_t samples);
// Steps of one pass over the dataset: ceil(samples / batch), the last one padded.
uint64_t data_batches_per_epoch(uint64_t samples, uint32_t batch);

// The staging slot for `batch` rows of the model's widths, inputs in the dataset's type; stride
// >= features is the row pitch in elements (the runtime pads the first layer's inner dimension
// to the format's block; 0 = features); resident: with an indices part (above).
data_slot_layout data_slot_plan(const data_info *info, uint32_t batch, uint32_t stride,
                                bool resident);
// The device batch the slot is staged into: the same parts, FP32 inputs.
data_slot_layout data_batch_plan(const data_info *info, uint32_t batch, uint32_t stride,
                                 bool resident);
// The bytes of a filled slot that the device needs: its first inputs_offset when it holds
// indices, else all of it.
uint64_t data_slot_copy_bytes(const data_slot_layout *layout, const void *slot);

// Writes into order[0 .. samples) the visiting order of epoch `epoch`: Fisher-Yates over the
// identity with j drawn from Philox keyed by (seed, epoch).
void data_shuffle(uint32_t *order, uint64_t samples, uint64_t seed, uint64_t epoch);

// Starts a feed at {0, 0}. order (data_order_bytes, 4-byte aligned) is needed when shuffle is set.
void data_feed_init(data_feed *f, const data_set *set, uint32_t batch, bool shuffle,
                    uint64_t seed, uint32_t *order);
// Makes the feed stage rank `rank`'s contiguous share of each of its batches, of `world` ranks
// (the batch a multiple of world): rows [rank * batch / world, (rank + 1) * batch / world). Its
// slots are laid out for batch / world rows; the header's rows_valid counts the share's real
// rows and rows_global the whole batch's, and the last partial batch of an epoch fills the
// shares in rank order (a later rank may hold padding only).
void data_feed_share(data_feed *f, uint32_t rank, uint32_t world);
// Makes the feed stage indices into resident dataset `dataset` (DATA_DATASET_*), whose device
// copy holds the feed's set; its slots must have an indices part.
void data_feed_resident(data_feed *f, uint32_t dataset);
// Moves the feed to a cursor, e.g. one loaded from a checkpoint. QT_ERR_MISMATCH when the
// position is not below the dataset's samples (the checkpoint belongs to other data).
qt_status data_feed_seek(data_feed *f, data_cursor cursor);
// Writes the next batch into `slot` (laid out as `layout`, whose widths match the dataset),
// advances the cursor (to the next epoch after the last batch) and returns the real rows.
uint32_t data_feed_next(data_feed *f, const data_slot_layout *layout, void *slot);
// Writes a batch the caller holds into `slot` as data_feed_next would: rows (1 .. batch) samples
// of inputs [rows][features] in the layout's input type and labels [rows] or targets
// [rows][outputs] as its target type (NULL: an inputs-only batch, staged with the padding
// rows' targets), then padding rows. The header's cursor is {UINT64_MAX, 0}, no dataset's.
void data_stage_rows(const data_slot_layout *layout, uint32_t rows, const void *inputs,
                     const int32_t *labels, const float *targets, void *slot);

#endif  // QT_DATA_H
