// File: worker/engine.h
//
// Engine: runs one request of the reference worker through a PrefixCache:
//
//   1. Acquire(prompt, allocate): pin the cached prefix, get pages for the
//      next full blocks.
//   2. Prefill only the suffix after the cached prefix: attention reads the
//      prefix K/V from the pinned pages. A fully cached prompt still
//      recomputes its last token over the pages holding all the tokens
//      before it, so the first token never comes from stale logits.
//   3. First token = argmax of the last prompt position's logits (TTFT).
//   4. write_kv the new full blocks' K/V (from the request's local cache)
//      into the allocated pages, then Commit them (the CPU write has
//      completed when write_kv returns; the CUDA path synchronises its
//      stream first).
//   5. Decode greedily; decode K/V stay in the local cache. The prefix pages
//      stay pinned until decoding ends, then the lease is released.
//   6. With commit_generated, full blocks of prompt + generated tokens past
//      the prompt are committed through a second Acquire.
//
// Thread safety: an Engine borrows a Model (shared, immutable) and a
// PrefixCache (must be thread-safe to share); Run may be called from several
// threads at once.
#ifndef RADIXKV_CLIENT_WORKER_ENGINE_H_
#define RADIXKV_CLIENT_WORKER_ENGINE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/model.h"
#include "worker/prefix_cache.h"

namespace radixkv::worker {

struct RunOptions {
  // Tokens to generate (the first comes from the prefill), >= 1.
  uint32_t decode_tokens = 1;
  // Commit the prompt's new full blocks (off: release them unwritten; used
  // by benchmarks to measure the same cached state repeatedly).
  bool commit_prompt = true;
  // Also commit full blocks made of generated tokens.
  bool commit_generated = false;
};

struct RunResult {
  uint32_t prompt_tokens = 0;
  // Prompt tokens whose K/V came from the cache (cached blocks' tokens; one
  // less for a fully cached prompt, whose last token is recomputed).
  uint32_t matched_tokens = 0;
  bool cache_degraded = false;
  uint32_t committed_blocks = 0;            // prompt blocks committed
  uint32_t committed_generated_blocks = 0;  // with commit_generated
  double ttft_s = 0;       // Acquire + prefill + first token
  double decode_s = 0;     // the remaining decode_tokens - 1 steps
  double decode_tokens_per_s = 0;
  std::vector<uint32_t> generated;
  std::vector<float> first_logits;  // logits of the last prompt token
};

class Engine {
 public:
  // Both borrowed; must outlive the engine.
  Engine(const Model* model, PrefixCache* cache) : model_(model), cache_(cache) {}

  // INVALID_ARGUMENT for an empty prompt, a token >= vocab or
  // decode_tokens == 0; cache errors other than a miss are returned too.
  absl::StatusOr<RunResult> Run(absl::Span<const uint32_t> prompt,
                                const RunOptions& options) const;

 private:
  // Run, consulting the cache or not. A lease lost while its pages were
  // read (expired, session gone) makes Run serve the request again without
  // the cache: bytes read from pages the worker no longer holds are never
  // used.
  absl::StatusOr<RunResult> RunOnce(absl::Span<const uint32_t> prompt,
                                    const RunOptions& options,
                                    bool use_cache) const;

  const Model* model_;
  PrefixCache* cache_;
};

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_ENGINE_H_
