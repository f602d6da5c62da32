// File: worker/weights_export.h
//
// `radixkv-worker export-weights`: the reference model's configuration and
// every weight its forward pass uses, in one safetensors file, so that
// another implementation (examples/torch_worker.py) runs the identical model
// and shares its cached blocks.
//
// File format (safetensors; worker/README.md documents it for
// readers):
//
//   u64 N (little-endian) ‖ N bytes of JSON header ‖ tensor data
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end)} (byte offsets into the data that follows the header; the
// tensors are contiguous, in header order, row-major, little-endian), plus
// "__metadata__": string values "format" ("radixkv-reference-weights"),
// "format_version" ("1"), "config" (the ModelConfig as a JSON object),
// "namespace" (ModelConfig::Namespace() as a JSON object, dtype by its enum
// name) and "parameters". The header is padded with spaces to a multiple of
// 8 bytes.
//
// Tensors (F32 unless noted; matrices are [in][out], y = x W):
//   embedding             [vocab][d_model]
//   layers.L.attn_norm    [d_model]
//   layers.L.wqkv         [d_model][(q_heads + 2 kv_heads) head_dim]
//                         columns: q heads, then k heads, then v heads
//   layers.L.wo           [q_heads head_dim][d_model]
//   layers.L.mlp_norm     [d_model]
//   layers.L.wgateup      [d_model][2 ffn]   columns: gate, then up
//   layers.L.wdown        [ffn][d_model]
//   final_norm            [d_model]
//   head                  [d_model][vocab]   (the scaled transposed
//                                             embedding when tied)
//   rope_inv_freq         [head_dim / 2]     rotation of pair (i, i + D/2)
//                                             at position p: p * inv_freq[i],
//                                             in double precision
//   probe.tokens          U32 [n]            a fixed prompt, and
//   probe.logits          [vocab]            its last token's logits from a
//                                             full CPU prefill, for a reader
//                                             to check its forward pass
#ifndef RADIXKV_CLIENT_WORKER_WEIGHTS_EXPORT_H_
#define RADIXKV_CLIENT_WORKER_WEIGHTS_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "worker/model.h"

namespace radixkv::worker {

// Writes `config`'s weights to `path` (through a temporary file in the same
// directory, renamed into place, so `path` is either complete or untouched).
// INVALID_ARGUMENT for a config that fails Validate(); FAILED_PRECONDITION
// naming the path when it cannot be written.
absl::Status ExportWeights(const ModelConfig& config, const std::string& path);

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_WEIGHTS_EXPORT_H_
