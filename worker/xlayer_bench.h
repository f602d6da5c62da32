// File: worker/xlayer_bench.h
//
// `radixkv-worker bench --layout=xlayer`: the cross-layer KV model and the
// per-layer model of equal depth and width, measured side by side in one
// run on the same prompt, on the CPU: KV memory per token (page bytes, and
// the cross-layer model's fixed per-request window state) and time to first
// token uncached and with the prompt's first P tokens cached.
//
// Thread safety: runs on the caller's thread (the forward passes use
// internal threads).
#ifndef RADIXKV_CLIENT_WORKER_XLAYER_BENCH_H_
#define RADIXKV_CLIENT_WORKER_XLAYER_BENCH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/model.h"
#include "nlohmann/json.hpp"

namespace radixkv::worker {

struct XLayerBenchOptions {
  uint32_t prefix_tokens = 1856;  // P, cached (whole blocks of it)
  uint32_t suffix_tokens = 192;   // S >= 1, prefilled
  uint32_t repeat = 5;            // best of R runs each
};

// Measures `config` (REQUIRES: config.xlayer set) and the same config
// without xlayer. The JSON object has the common keys model, layout,
// shared_from, window, top_k, prefix_tokens, suffix_tokens, matched_tokens,
// cached_fraction, threads, repeat, then per model ("per_layer", "xlayer"):
// kv_groups, page_bytes, bytes_per_token, window_bytes_per_request,
// kv_bytes_for_prompt (whole pages of the P + S tokens, plus the window),
// parameters, ttft_uncached_s, ttft_cached_s, speedup, ideal_speedup,
// max_abs_logit_diff (cached vs uncached); and the ratios
// bytes_per_token_ratio and ttft_cached_ratio (xlayer / per_layer).
absl::StatusOr<nlohmann::ordered_json> XLayerBench(
    const ModelConfig& config, const XLayerBenchOptions& options);

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_XLAYER_BENCH_H_
