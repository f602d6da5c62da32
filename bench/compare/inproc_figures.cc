// File: bench/compare/inproc_figures.cc
//
// inproc_figures: the in-process figures of the performance targets in
// docs/BENCHMARKS.md, compared there with other projects' published numbers
// (printed alongside by side_by_side.sh, labelled as published, never as
// measured here):
//
//   hash_match   ComputeBlockKeys + RadixTree::Match of a fully cached
//                prompt (default 2048 tokens, page_size 16), tokens/s on one
//                thread
//   walk_match   the same lookup the way a token-mode Acquire resolves its
//                prompt: the token walk (token comparison along hot
//                children, no hashing for cached blocks), then the match
//                given the walked pages (RadixTree's TEST_ hooks for the two
//                steps)
//   match_tokens RadixTree::Match in token mode (keys empty), radixkvd's
//                token Match: walk and lookup in one pass, hashing only
//                where the walk stops
//   evict        RadixTree::Evict at --cached_blocks cached blocks (default
//                1 M), ns per evicted block
//   memory       RadixTree::IndexMemoryBytes per cached block (token copies
//                excluded)
//   hold         how long one operation holds the tree's lock: each timed
//                call runs entirely under it (keys computed beforehand), so
//                its duration bounds the hold; p50/p99/max over
//                --hold_samples calls: a 2k-token Acquire hit given the
//                walked pages (the locked step of a token-mode Acquire) and
//                its Release (exclusive), a token-mode Match (shared), a
//                trace-shaped miss (24 new blocks of 512 tokens in a full
//                3,000-page tree: Acquire evicting 24 leaves, then Commit),
//                every Acquire and Commit while the eviction figure's tree
//                fills to --cached_blocks (first touches of its memory),
//                and one batch of an admin Evict or Clear (kAdminEvictionBatch
//                blocks) at ~750k cached blocks; plus the whole Clear's
//                duration, which it spends in many such holds
//
//   inproc_figures [--prompt_tokens=2048] [--cached_blocks=1000000] [--json]
//
// Single-threaded; no gRPC.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "bench/bench_layout.h"
#include "nlohmann/json.hpp"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

ABSL_FLAG(uint32_t, prompt_tokens, 2048, "tokens of the cached prompt");
ABSL_FLAG(uint32_t, page_size, 16, "tokens per block");
ABSL_FLAG(uint32_t, cached_blocks, 1000000, "cached blocks for the eviction figure");
ABSL_FLAG(uint32_t, prompt_blocks_for_fill, 128,
          "blocks per prompt when filling the tree (chains of this depth)");
ABSL_FLAG(double, seconds, 2.0, "time per hash+match measurement");
ABSL_FLAG(uint32_t, hold_samples, 20000, "timed calls per lock-hold figure");
ABSL_FLAG(bool, json, false, "print one JSON object");

namespace radixkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Durations of timed calls, in microseconds.
class Holds {
 public:
  template <typename F>
  auto Time(F&& f) {
    const auto t0 = Clock::now();
    auto r = f();
    us_.push_back(Seconds(t0, Clock::now()) * 1e6);
    return r;
  }
  double Quantile(double q) {
    if (us_.empty()) return 0;
    std::sort(us_.begin(), us_.end());
    return us_[std::min(us_.size() - 1, static_cast<size_t>(q * us_.size()))];
  }
  std::string Summary() {
    return absl::StrFormat("p50 %.2f us  p99 %.2f us  max %.1f us",
                           Quantile(0.5), Quantile(0.99), Quantile(1.0));
  }
  // Adds <name>_p50_us, <name>_p99_us and <name>_max_us to *out.
  void Json(const std::string& name, nlohmann::json* out) {
    (*out)[name + "_p50_us"] = Quantile(0.5);
    (*out)[name + "_p99_us"] = Quantile(0.99);
    (*out)[name + "_max_us"] = Quantile(1.0);
  }

 private:
  std::vector<double> us_;
};

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
  double match_tokens_tokens_per_s = 0;
  // Token Match and walk+match with the vector walk and the portable one
  // (RadixTreeOptions::vector_walk), measured alternately.
  double vector_match = 0, portable_match = 0;
  double vector_walk = 0, portable_walk = 0;
  const uint32_t samples = absl::GetFlag(FLAGS_hold_samples);
  Holds hit_hold, release_hold, match_hold;
  {
    std::vector<uint32_t> tokens(prompt_tokens);
    for (uint32_t i = 0; i < prompt_tokens; ++i) tokens[i] = 1000 + i;
    // The prompt, cached in a tree with the vector walk where the CPU has
    // one (the default) and in one with the portable walk.
    NamespaceId ns = 0;
    auto cached_tree = [&](bool vector_walk) {
      std::unique_ptr<RadixTree> t =
          RadixTree::Create({.capacity_pages = prompt_tokens / page + 1,
                             .max_page_size = page,
                             .vector_walk = vector_walk})
              .value();
      ns = *t->RegisterNamespace(Spec(page));
      AcquireResult a =
          *t->Acquire({.ns = ns, .tokens = tokens, .allocate = true});
      (void)*t->Commit(a.lease, a.new_blocks, true);
      return t;
    };
    // Each tree has one namespace, so `ns` is the same id in both.
    std::unique_ptr<RadixTree> plain = cached_tree(false);
    std::unique_ptr<RadixTree> tree_ptr = cached_tree(true);
    RadixTree& tree = *tree_ptr;
    const BlockKey root = tree.namespace_root(ns);
    std::vector<BlockKey> keys = ComputeBlockKeys(root, page, tokens);
    const size_t full = keys.size() * page;
    absl::Span<const uint32_t> full_tokens(tokens.data(), full);
    // Tokens per second of `lookup` (returns matched blocks); -1 if a
    // lookup did not match the whole prompt.
    const double budget = absl::GetFlag(FLAGS_seconds);
    double seconds_per_rate = budget;
    auto rate = [&](auto lookup) -> double {
      uint64_t iters = 0;
      uint64_t matched = 0;
      const auto t0 = Clock::now();
      auto t1 = t0;
      do {
        for (int i = 0; i < 64; ++i) matched += lookup();
        iters += 64;
        t1 = Clock::now();
      } while (Seconds(t0, t1) < seconds_per_rate);
      if (matched != iters * keys.size()) return -1;
      return iters * prompt_tokens / Seconds(t0, t1);
    };
    hash_match_tokens_per_s = rate([&] {
      std::vector<BlockKey> k = ComputeBlockKeys(root, page, tokens);
      return tree.Match(ns, k, full_tokens)->matched_blocks;
    });
    std::vector<BlockKey> k;
    std::vector<PageId> pages;
    // The walk, then the match given its pages (what a token-mode Acquire
    // does before and under its exclusive lock).
    auto walk_match = [&](RadixTree& t) {
      k.clear();
      pages.clear();
      t.TEST_WalkTokens(ns, full_tokens, &k, &pages);
      return t.TEST_MatchWalked(ns, k, full_tokens, pages, 0);
    };
    walk_match_tokens_per_s = rate([&] { return walk_match(tree); });
    match_tokens_tokens_per_s = rate(
        [&] { return tree.Match(ns, {}, full_tokens)->matched_blocks; });
    // Vector vs portable walk, alternately in 4 rounds of budget / 4.
    seconds_per_rate = budget / 4;
    bool alternating_matched_all = true;
    for (int round = 0; round < 4; ++round) {
      for (int which = 0; which < 2; ++which) {
        RadixTree& t = which == 0 ? tree : *plain;
        const double m = rate(
            [&] { return t.Match(ns, {}, full_tokens)->matched_blocks; });
        const double w = rate([&] { return walk_match(t); });
        if (m < 0 || w < 0) alternating_matched_all = false;
        (which == 0 ? vector_match : portable_match) += m / 4;
        (which == 0 ? vector_walk : portable_walk) += w / 4;
      }
    }
    uint64_t held = 0;
    for (uint32_t i = 0; i < samples; ++i) {
      k.clear();
      pages.clear();
      const uint64_t epoch = tree.TEST_eviction_epoch();
      tree.TEST_WalkTokens(ns, full_tokens, &k, &pages);
      const AcquireResult hit = hit_hold.Time([&] {
        return *tree.TEST_AcquireWalked(
            {.ns = ns, .keys = k, .tokens = full_tokens}, pages, epoch);
      });
      held += hit.matched_blocks;
      release_hold.Time([&] { return tree.Release(hit.lease).ok(); });
      held += match_hold.Time(
          [&] { return tree.Match(ns, {}, full_tokens)->matched_blocks; });
    }
    if (held != uint64_t{2} * samples * keys.size()) {
      std::cerr << "Error: a timed lookup did not match the whole prompt\n";
      return 1;
    }
    if (hash_match_tokens_per_s < 0 || walk_match_tokens_per_s < 0 ||
        match_tokens_tokens_per_s < 0 || !alternating_matched_all) {
      std::cerr << "Error: prompt not fully matched\n";
      return 1;
    }
  }

  // Lock holds of a trace-shaped miss: 24 new blocks of 512 tokens into a
  // full 3,000-page tree, each Acquire evicting 24 leaves.
  Holds miss_hold, commit_hold;
  {
    constexpr uint32_t kTracePage = 512, kTraceBlocks = 24;
    constexpr uint32_t kTraceCapacity = 3000;
    std::unique_ptr<RadixTree> tree_owner =
        RadixTree::Create(
            {.capacity_pages = kTraceCapacity, .max_page_size = kTracePage})
            .value();
    RadixTree& tree = *tree_owner;
    NamespaceId ns = *tree.RegisterNamespace(Spec(kTracePage));
    const BlockKey root = tree.namespace_root(ns);
    std::vector<uint32_t> tokens(kTraceBlocks * kTracePage);
    uint32_t next_token = 0;
    const uint32_t fill = kTraceCapacity / kTraceBlocks + 1;
    for (uint32_t i = 0; i < fill + samples / 4; ++i) {
      for (uint32_t& t : tokens) t = next_token++;
      const std::vector<BlockKey> keys =
          ComputeBlockKeys(root, kTracePage, tokens);
      const bool timed = i >= fill;  // the tree is full from here on
      auto acquire = [&] {
        return *tree.Acquire(
            {.ns = ns, .keys = keys, .tokens = tokens, .allocate = true});
      };
      const AcquireResult a = timed ? miss_hold.Time(acquire) : acquire();
      auto commit = [&] {
        return tree.Commit(a.lease, a.new_blocks, true).ok();
      };
      if (!(timed ? commit_hold.Time(commit) : commit()) ||
          a.new_blocks != kTraceBlocks) {
        std::cerr << "Error: trace-shaped miss did not allocate and commit "
                  << kTraceBlocks << " blocks\n";
        return 1;
      }
    }
  }

  // 2. eviction cost and 3. index memory at `cached` blocks.
  double evict_ns_per_block = 0;
  double index_bytes_per_block = 0;
  double fill_s = 0;
  Holds evict_hold, clear_hold, fill_hold;
  uint64_t clear_blocks = 0;
  {
    std::unique_ptr<RadixTree> tree_owner =
        RadixTree::Create({.capacity_pages = cached,
                           .max_page_size = page,
                           .remembered_evictions = 0})
            .value();
    RadixTree& tree = *tree_owner;
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
      AcquireResult a = fill_hold.Time([&] {
        return *tree.Acquire(
            {.ns = ns, .keys = keys, .tokens = tokens, .allocate = true});
      });
      fill_hold.Time(
          [&] { return tree.Commit(a.lease, a.new_blocks, true).ok(); });
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
    for (int i = 0; i < 256; ++i) {
      evict_hold.Time([&] { return tree.Evict(kAdminEvictionBatch); });
    }
    clear_blocks = tree.GetStats().cached_pages;
    clear_hold.Time([&] { return tree.Clear(); });
  }

  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json j = {
        {"prompt_tokens", prompt_tokens},
        {"page_size", page},
        {"hash_match_tokens_per_s", hash_match_tokens_per_s},
        {"walk_match_tokens_per_s", walk_match_tokens_per_s},
        {"cached_blocks", cached},
        {"evict_ns_per_block", evict_ns_per_block},
        {"index_bytes_per_block", index_bytes_per_block},
        {"fill_seconds", fill_s},
        {"match_tokens_tokens_per_s", match_tokens_tokens_per_s},
        {"vector_match_tokens_per_s", vector_match},
        {"portable_match_tokens_per_s", portable_match},
        {"vector_walk_match_tokens_per_s", vector_walk},
        {"portable_walk_match_tokens_per_s", portable_walk},
        {"clear_blocks", clear_blocks},
    };
    hit_hold.Json("hold_acquire_hit", &j);
    release_hold.Json("hold_release", &j);
    match_hold.Json("hold_match_tokens", &j);
    miss_hold.Json("hold_trace_miss_acquire", &j);
    commit_hold.Json("hold_trace_commit", &j);
    fill_hold.Json("hold_fill", &j);
    evict_hold.Json("hold_admin_evict_batch", &j);
    clear_hold.Json("hold_clear", &j);
    std::cout << j.dump() << "\n";
  } else {
    std::cout << absl::StrFormat(
        "hash+match  %.1f M tokens/s (fully cached %d-token prompt, page_size %d, 1 thread)\n"
        "walk+match  %.1f M tokens/s (the same, cached blocks found by token comparison)\n"
        "token Match %.1f M tokens/s (radixkvd's Match of tokens: walk and lookup in one pass)\n"
        "vector walk / portable walk, alternately: token Match %.1f / %.1f M tokens/s = %.2fx, "
        "walk+match %.1f / %.1f M = %.2fx\n"
        "evict       %.1f ns per block at %d cached blocks\n"
        "index mem   %.1f bytes per block (token copies excluded)\n"
        "lock hold (each call runs under the tree lock; %d samples):\n"
        "  Acquire hit, %d-token prompt, walked pages (exclusive)  %s\n"
        "  its Release (exclusive)                               %s\n"
        "  token Match, same prompt (shared)                     %s\n"
        "  trace miss: Acquire 24 x 512 tokens, evicting 24       %s\n"
        "  its Commit of 24 blocks (exclusive)                   %s\n"
        "  Acquire or Commit while filling to %d blocks        %s\n"
        "  admin Evict/Clear batch, %d blocks at ~%d cached    %s\n"
        "  whole Clear of %d cached blocks, in batches         %s\n",
        hash_match_tokens_per_s / 1e6, prompt_tokens, page,
        walk_match_tokens_per_s / 1e6, match_tokens_tokens_per_s / 1e6,
        vector_match / 1e6, portable_match / 1e6, vector_match / portable_match,
        vector_walk / 1e6, portable_walk / 1e6, vector_walk / portable_walk,
        evict_ns_per_block, cached, index_bytes_per_block, samples,
        prompt_tokens, hit_hold.Summary(), release_hold.Summary(),
        match_hold.Summary(), miss_hold.Summary(), commit_hold.Summary(),
        cached, fill_hold.Summary(),
        static_cast<int>(kAdminEvictionBatch), cached * 3 / 4,
        evict_hold.Summary(), clear_blocks,
        clear_hold.Summary());
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
