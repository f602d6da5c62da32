// The KV layout radixkv's benchmark tools describe (loadgen, replay,
// inproc_figures): a Llama-3-8B-shaped model, 32 layers of 8 KV heads of
// 128 in bf16, under each tool's own model name so that two tools never
// share a namespace by accident.
#ifndef RADIXKV_BENCH_BENCH_LAYOUT_H_
#define RADIXKV_BENCH_BENCH_LAYOUT_H_

#include <cstdint>
#include <string>
#include <utility>

#include "radix/block_key.h"

namespace radixkv::bench {

inline NamespaceSpec BenchLayout(std::string model, uint32_t page_size) {
  NamespaceSpec spec;
  spec.model = std::move(model);
  spec.num_layers = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.page_size = page_size;
  spec.dtype = DType::kBFloat16;
  return spec;
}

}  // namespace radixkv::bench

#endif  // RADIXKV_BENCH_BENCH_LAYOUT_H_
