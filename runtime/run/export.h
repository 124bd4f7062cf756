// export: a checkpoint's weights as a safetensors file (`qtrain export`), for PyTorch and
// every other reader of the format.
//
// Owns nothing past a call: the checkpoint reader and the memory are the caller's (the CLI
// allocates them at start-up, export_memory_bytes for the checkpoint's table as ckpt_peek
// reads it), the output file is written atomically through runtime/io/atomic_file.h (OUT.tmp-PID,
// fsync, rename, fsync of the folder). Callers: tools/qtrain. One thread.
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

#include "runtime/run/checkpoint.h"  // ckpt_reader

// The memory export_safetensors needs for a checkpoint of `regions` regions and `params`
// parameters (ckpt_peek): the reader's table, the list of tensors, the JSON header (every
// tensor entry and its metadata line within 512 bytes each) and a chunk of CKPT_CHUNK_BYTES.
uint64_t export_memory_bytes(uint32_t regions, uint32_t params);

// Checks the whole checkpoint (every CRC), then writes out_path. Refuses (QT_ERR_INPUT), before
// reading the checkpoint, an existing out_path unless force, and one that is not a regular
// file. memory: export_memory_bytes of the checkpoint's table (a larger table is refused),
// 16-byte aligned; rd gets its table there and keeps the header.
qt_status export_safetensors(ckpt_reader *rd, const char *ckpt_path, const char *out_path,
                             bool quantized, bool force, void *memory, uint64_t memory_bytes);

#endif  // QT_EXPORT_H
