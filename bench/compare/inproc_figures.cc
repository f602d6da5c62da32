// File: bench/compare/inproc_figures.cc
//
// inproc_figures: the in-process figures that DESIGN.md §12 compares with
// the anchors' published numbers (printed alongside by side_by_side.sh,
// labelled as published, never as measured here):
//
//   hash_match   ComputeBlockKeys + RadixTree::Match of a fully cached
//                prompt (default 2048 tokens, page_size 16), tokens/s on one
//                thread
//   walk_match   the same lookup the way radixkvd resolves a token prompt:
//                ResolveTokenKeys (token comparison along hot children, no
//                hashing for cached blocks) + Match with the walked pages
//   evict        RadixTree::Evict at --cached_blocks cached blocks (default
//                1 M), ns per evicted block
//   memory       RadixTree::IndexMemoryBytes per cached block (token copies
//                excluded)
//
//   inproc_figures [--prompt_tokens=2048] [--cached_blocks=1000000] [--json]
//
// Single-threaded; no gRPC.
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "bench/bench_layout.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

ABSL_FLAG(uint32_t, prompt_tokens, 2048, "tokens of the cached prompt");
ABSL_FLAG(uint32_t, page_size, 16, "tokens per block");
ABSL_FLAG(uint32_t, cached_blocks, 1000000, "cached blocks for the eviction figure");
ABSL_FLAG(uint32_t, prompt_blocks_for_fill, 128,
          "blocks per prompt when filling the tree (chains of this depth)");
ABSL_FLAG(double, seconds, 2.0, "time per hash+match measurement");
ABSL_FLAG(bool, json, false, "print one JSON object");

namespace radixkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

NamespaceSpec Spec(uint32_t page_size) {
  return BenchLayout("radixkv-inproc-figures", page_size);
}

int Main() {
  const uint32_t page = absl::GetFlag(FLAGS_page_size);
  const uint32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const uint32_t cached = absl::GetFlag(FLAGS_cached_blocks);
  const uint32_t depth = absl::GetFlag(FLAGS_prompt_blocks_for_fill);
  if (page == 0 || prompt_tokens < page || cached == 0 || depth == 0) {
    std::cerr << "Error: --page_size, --cached_blocks and --prompt_blocks_for_fill "
                 "must be > 0 and --prompt_tokens >= --page_size\n";
    return 3;
  }

  // 1. hash + match of a fully cached prompt.
  double hash_match_tokens_per_s = 0;
  double walk_match_tokens_per_s = 0;
  {
    RadixTree tree({.capacity_pages = prompt_tokens / page + 1,
                    .max_page_size = page});
    NamespaceId ns = *tree.RegisterNamespace(Spec(page));
    const BlockKey root = tree.namespace_root(ns);
    std::vector<uint32_t> tokens(prompt_tokens);
    for (uint32_t i = 0; i < prompt_tokens; ++i) tokens[i] = 1000 + i;
    std::vector<BlockKey> keys = ComputeBlockKeys(root, page, tokens);
    const size_t full = keys.size() * page;
    absl::Span<const uint32_t> full_tokens(tokens.data(), full);
    AcquireResult a = *tree.Acquire({.ns = ns,
                                     .keys = keys,
                                     .tokens = full_tokens,
                                     .allocate = true,
                                     .chain_keys = true});
    (void)*tree.Commit(a.lease, a.new_blocks, true);
    // Tokens per second of `lookup` (returns matched blocks); -1 if a
    // lookup did not match the whole prompt.
    const double budget = absl::GetFlag(FLAGS_seconds);
    auto rate = [&](auto lookup) -> double {
      uint64_t iters = 0;
      uint64_t matched = 0;
      const auto t0 = Clock::now();
      auto t1 = t0;
      do {
        for (int i = 0; i < 64; ++i) matched += lookup();
        iters += 64;
        t1 = Clock::now();
      } while (Seconds(t0, t1) < budget);
      if (matched != iters * keys.size()) return -1;
      return iters * prompt_tokens / Seconds(t0, t1);
    };
    hash_match_tokens_per_s = rate([&] {
      std::vector<BlockKey> k = ComputeBlockKeys(root, page, tokens);
      return tree.Match(ns, k, full_tokens)->matched_blocks;
    });
    std::vector<BlockKey> k;
    std::vector<PageId> pages;
    walk_match_tokens_per_s = rate([&] {
      tree.ResolveTokenKeys(ns, full_tokens, /*stop_at_missing=*/true, &k,
                            &pages);
      return tree.Match(ns, k, full_tokens, pages)->matched_blocks;
    });
    if (hash_match_tokens_per_s < 0 || walk_match_tokens_per_s < 0) {
      std::cerr << "Error: prompt not fully matched\n";
      return 1;
    }
  }

  // 2. eviction cost and 3. index memory at `cached` blocks.
  double evict_ns_per_block = 0;
  double index_bytes_per_block = 0;
  double fill_s = 0;
  {
    RadixTree tree({.capacity_pages = cached, .max_page_size = page,
                    .remembered_evictions = 0});
    NamespaceId ns = *tree.RegisterNamespace(Spec(page));
    const BlockKey root = tree.namespace_root(ns);
    std::vector<uint32_t> tokens(static_cast<size_t>(depth) * page);
    uint32_t next_token = 0;
    const auto f0 = Clock::now();
    for (uint32_t done = 0; done < cached;) {
      const uint32_t n = std::min(depth, cached - done);
      tokens.resize(static_cast<size_t>(n) * page);
      for (uint32_t& t : tokens) t = next_token++;
      std::vector<BlockKey> keys = ComputeBlockKeys(root, page, tokens);
      AcquireResult a = *tree.Acquire(
          {.ns = ns, .keys = keys, .tokens = tokens, .allocate = true});
      (void)*tree.Commit(a.lease, a.new_blocks, true);
      done += n;
    }
    fill_s = Seconds(f0, Clock::now());
    const TreeStats before = tree.GetStats();
    index_bytes_per_block =
        static_cast<double>(tree.IndexMemoryBytes()) / before.cached_pages;
    // Evict a quarter of the tree in batches, so the tree stays ~1 M blocks.
    const uint64_t to_evict = before.cached_pages / 4;
    uint64_t evicted = 0;
    const auto e0 = Clock::now();
    while (evicted < to_evict) evicted += tree.Evict(std::min<uint64_t>(4096, to_evict - evicted));
    evict_ns_per_block = Seconds(e0, Clock::now()) * 1e9 / evicted;
  }

  if (absl::GetFlag(FLAGS_json)) {
    std::cout << absl::StrFormat(
        "{\"prompt_tokens\": %d, \"page_size\": %d, "
        "\"hash_match_tokens_per_s\": %.0f, "
        "\"walk_match_tokens_per_s\": %.0f, \"cached_blocks\": %d, "
        "\"evict_ns_per_block\": %.1f, \"index_bytes_per_block\": %.1f, "
        "\"fill_seconds\": %.2f}\n",
        prompt_tokens, page, hash_match_tokens_per_s, walk_match_tokens_per_s,
        cached, evict_ns_per_block, index_bytes_per_block, fill_s);
  } else {
    std::cout << absl::StrFormat(
        "hash+match  %.1f M tokens/s (fully cached %d-token prompt, page_size %d, 1 thread)\n"
        "walk+match  %.1f M tokens/s (the same, cached blocks found by token comparison)\n"
        "evict       %.1f ns per block at %d cached blocks\n"
        "index mem   %.1f bytes per block (token copies excluded)\n",
        hash_match_tokens_per_s / 1e6, prompt_tokens, page,
        walk_match_tokens_per_s / 1e6, evict_ns_per_block,
        cached, index_bytes_per_block);
  }
  return 0;
}

}  // namespace
}  // namespace radixkv::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("in-process hash+match, eviction and memory figures");
  absl::ParseCommandLine(argc, argv);
  return radixkv::bench::Main();
}
