// export: a checkpoint's weights as a safetensors file (`qtrain export`), for PyTorch and
// every other reader of the format.
//
// Owns nothing past a call: the checkpoint reader and the buffer (EXPORT_BUFFER_BYTES, the
// tensor list and the output file's state included) are the caller's, the output file is written
// atomically through runtime/atomic_file.h (OUT.tmp-PID, fsync, rename, fsync of the folder).
// Callers: the embedding API (qt_export). One thread per call.
//
// The file (the safetensors layout):
//
//   0         8                          8 + N                                         end
//   +---------+--------------------------+---------------------------------------------+
//   | N: u64  | JSON header, N bytes,    | tensor data, in header order, contiguous:   |
//   | little- | padded with spaces to a  | data_offsets [begin, end) count from the     |
//   | endian  | multiple of 8            | first byte after the header                  |
//   +---------+--------------------------+---------------------------------------------+
//
//   {"__metadata__": {"format": "pt", "qtrain.recipe": NAME, "qtrain.recipe_hash": 16 hex,
//                     "qtrain.step": S, "qtrain.train_step": T, "qtrain.seed": SEED,
//                     ["qtrain.eval_loss", "qtrain.eval_accuracy", "qtrain.eval_samples"],
//                     "qtrain.quantizer.PARAM": "nvfp4 sr=0 2d=1 rht=0", ...,
//                     ["qtrain.tensor.NAME": "usage format [shape] of PARAM (quantizer)"]},
//    "fc1.weight": {"dtype": "F32", "shape": [OUT, IN], "data_offsets": [0, 4 * OUT * IN]}, ...}
//
// Tensors: every parameter's FP32 master under its layer's name, weights [out][in] without the
// padding columns a format added, biases [out], RMSNorm gains [width] as NAME.weight (the name
// torch.nn.RMSNorm gives them); --quantized adds, under the region's name (fc1.weight.row_data,
// .row_scale, .col_data, .col_scale, .scale_inv, .amax, .amax_col; .bf16 for a BF16 weight),
// the codes and scales of every usage of every quantized weight in the layouts of
// ptx/quant.h (padded K included): dtypes F32, BF16, F8_E4M3, F8_E5M2, and U8 for
// E8M0 scales and packed E2M1 pairs (shape [rows][ceil(cols/2)] bytes), with the format in the
// tensor's metadata entry. The eval fields come from the last eval row the run finished.
#ifndef QT_EXPORT_H
#define QT_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "atomic_file.h"  // atomic_file
#include "checkpoint.h"   // ckpt_reader

// One tensor of the file: where its bytes come from and where they go.
typedef struct export_tensor {
    char name[ARENA_NAME_MAX + 8];
    const char *dtype;      // safetensors dtype
    uint32_t rank;
    uint64_t dims[2];
    uint32_t region;        // checkpoint region of its bytes
    uint64_t rows;          // copied as rows of row_bytes at a source stride of stride bytes
    uint64_t row_bytes, stride;
    uint64_t begin;         // data offset in the file's data part
    const ckpt_region *entry;  // quantized copies: the region (its usage and format)
    const ckpt_param *param;
} export_tensor;

// Every tensor of the file, in file order.
typedef struct export_list {
    uint32_t count;
    export_tensor tensors[ARENA_REGIONS_MAX + MODEL_PARAMS_MAX];
    uint64_t data_bytes;
} export_list;

// What one export works with, in the first EXPORT_SCRATCH_BYTES of the caller's buffer.
typedef struct export_scratch {
    export_list list;
    atomic_file out;
} export_scratch;

// JSON header bound: every tensor entry and its metadata line within 512 bytes each.
#define EXPORT_HEADER_BYTES_MAX ((ARENA_REGIONS_MAX + MODEL_PARAMS_MAX) * 2 * 512 + 4096)
#define EXPORT_SCRATCH_BYTES ((sizeof(export_scratch) + 255) / 256 * 256)
#define EXPORT_BUFFER_BYTES (EXPORT_SCRATCH_BYTES + EXPORT_HEADER_BYTES_MAX + CKPT_CHUNK_BYTES)

// Checks the whole checkpoint (every CRC), then writes out_path. Refuses (QT_ERR_INPUT), before
// reading the checkpoint, an existing out_path unless force, and one that is not a regular
// file. buffer: at least EXPORT_BUFFER_BYTES, 8-byte aligned; it holds the tensor list, the
// output file's state, the JSON header and the data on their way to the file.
qt_status export_safetensors(ckpt_reader *rd, const char *ckpt_path, const char *out_path,
                             bool quantized, bool force, void *buffer, uint64_t buffer_bytes);

#endif  // QT_EXPORT_H
