// Microbenchmarks of the radix index core (the targets in docs/BENCHMARKS.md):
//   BM_HashAndMatch      hash + match of a fully cached 2,048-token prompt,
//                        page 16, one core        target >= 100 M tokens/s
//   BM_EvictAt1M         eviction cost per block with 1 M cached blocks
//                                                 target <= 0.1 us/block
//   BM_IndexMemoryAt1M   index bytes per cached block at 1 M blocks,
//                        excluding the token copy target <= 64 B/block
// Run: build/.../bench/index/radix_bench [--benchmark_filter=...]
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include <unistd.h>

#include "benchmark/benchmark.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

namespace radixkv {
namespace {

constexpr uint32_t kPageSize = 16;

NamespaceSpec Spec() {
  return NamespaceSpec{.model = "llama-3-8b",
                       .num_layers = 32,
                       .num_kv_heads = 8,
                       .head_dim = 128,
                       .page_size = kPageSize,
                       .dtype = DType::kBFloat16};
}

std::vector<uint32_t> RandomTokens(std::mt19937_64& rng, size_t n) {
  std::vector<uint32_t> t(n);
  for (uint32_t& x : t) x = static_cast<uint32_t>(rng() % 128256);
  return t;
}

// Inserts `tokens` (all full blocks) and ends the lease.
void Insert(RadixTree& tree, NamespaceId ns, const BlockKey& root,
            const std::vector<uint32_t>& tokens) {
  const auto keys = ComputeBlockKeys(root, kPageSize, tokens);
  AcquireResult a = tree
                        .Acquire({.ns = ns,
                                  .keys = keys,
                                  .tokens = tokens,
                                  .allocate = true})
                        .value();
  if (a.lease != 0) tree.Commit(a.lease, a.new_blocks, true).value();
}

// Fills `blocks` cached blocks as distinct prompts of `depth` blocks.
void Fill(RadixTree& tree, NamespaceId ns, uint64_t blocks, uint32_t depth,
          std::mt19937_64& rng) {
  const BlockKey root = tree.namespace_root(ns);
  for (uint64_t done = 0; done < blocks; done += depth) {
    Insert(tree, ns, root, RandomTokens(rng, size_t{depth} * kPageSize));
  }
}

size_t RssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// (a) ComputeBlockKeys + Match of a 2,048-token prompt whose 128 blocks are
// all cached. Items are tokens.
void BM_HashAndMatch(benchmark::State& state) {
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = 4096}).value();
  RadixTree& tree = *tree_owner;
  const NamespaceId ns = tree.RegisterNamespace(Spec()).value();
  const BlockKey root = tree.namespace_root(ns);
  std::mt19937_64 rng(1);
  Fill(tree, ns, 2048, 128, rng);  // other prompts
  const std::vector<uint32_t> prompt = RandomTokens(rng, 2048);
  Insert(tree, ns, root, prompt);
  for (auto _ : state) {
    const auto keys = ComputeBlockKeys(root, kPageSize, prompt);
    auto m = tree.Match(ns, keys, prompt);
    if (!m.ok() || m->matched_blocks != 128) state.SkipWithError("not cached");
    benchmark::DoNotOptimize(m);
  }
  state.SetItemsProcessed(state.iterations() * prompt.size());
}
BENCHMARK(BM_HashAndMatch);

// The two halves of (a), for profiling.
void BM_HashOnly(benchmark::State& state) {
  const BlockKey root = NamespaceRoot(Spec());
  std::mt19937_64 rng(2);
  const std::vector<uint32_t> prompt = RandomTokens(rng, 2048);
  for (auto _ : state) {
    benchmark::DoNotOptimize(ComputeBlockKeys(root, kPageSize, prompt));
  }
  state.SetItemsProcessed(state.iterations() * prompt.size());
}
BENCHMARK(BM_HashOnly);

void BM_MatchOnly(benchmark::State& state) {
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = 4096}).value();
  RadixTree& tree = *tree_owner;
  const NamespaceId ns = tree.RegisterNamespace(Spec()).value();
  const BlockKey root = tree.namespace_root(ns);
  std::mt19937_64 rng(3);
  const std::vector<uint32_t> prompt = RandomTokens(rng, 2048);
  Insert(tree, ns, root, prompt);
  const auto keys = ComputeBlockKeys(root, kPageSize, prompt);
  for (auto _ : state) {
    benchmark::DoNotOptimize(tree.Match(ns, keys, prompt));
  }
  state.SetItemsProcessed(state.iterations() * prompt.size());
}
BENCHMARK(BM_MatchOnly);

// Acquire (pin the 128 cached blocks) + Release (unpin them), tokens given.
void BM_AcquireReleaseCached(benchmark::State& state) {
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = 4096}).value();
  RadixTree& tree = *tree_owner;
  const NamespaceId ns = tree.RegisterNamespace(Spec()).value();
  const BlockKey root = tree.namespace_root(ns);
  std::mt19937_64 rng(4);
  const std::vector<uint32_t> prompt = RandomTokens(rng, 2048);
  Insert(tree, ns, root, prompt);
  const auto keys = ComputeBlockKeys(root, kPageSize, prompt);
  for (auto _ : state) {
    auto a = tree.Acquire({.ns = ns, .keys = keys, .tokens = prompt});
    tree.Release(a->lease).IgnoreError();
  }
  state.SetItemsProcessed(state.iterations() * prompt.size());
}
BENCHMARK(BM_AcquireReleaseCached);

// (b) Evict() cost per block while 1 M blocks (arg 2) are cached. Each iteration
// inserts `batch` fresh blocks into headroom pages (untimed), then evicts
// `batch` LRU leaves (timed), so every eviction sees ~1 M cached blocks.
void BM_EvictAt1M(benchmark::State& state) {
  const uint32_t kBlocks = static_cast<uint32_t>(state.range(2));
  const uint32_t batch = static_cast<uint32_t>(state.range(0));
  const uint32_t depth = static_cast<uint32_t>(state.range(1));
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = kBlocks + batch}).value();
  RadixTree& tree = *tree_owner;
  const NamespaceId ns = tree.RegisterNamespace(Spec()).value();
  std::mt19937_64 rng(5);
  Fill(tree, ns, kBlocks, depth, rng);
  uint64_t evicted = 0;
  for (auto _ : state) {
    state.PauseTiming();
    Fill(tree, ns, batch, depth, rng);
    state.ResumeTiming();
    evicted += tree.Evict(batch);
  }
  state.counters["cached_blocks"] =
      static_cast<double>(tree.GetStats().cached_pages);
  state.counters["ns_per_block"] = benchmark::Counter(
      static_cast<double>(evicted) * 1e-9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetItemsProcessed(static_cast<int64_t>(evicted));
}
BENCHMARK(BM_EvictAt1M)
    ->Args({4096, 64, 1 << 20})
    ->Args({4096, 1, 1 << 20})
    ->Args({4096, 64, 1 << 16})  // cache-resident, for comparison
    ->Unit(benchmark::kMicrosecond);

// Evicts all 1 M cached blocks in batches of 4096 straight after filling
// the tree (no refill between batches, so nothing else disturbs the caches).
void BM_EvictAll1M(benchmark::State& state) {
  constexpr uint32_t kBlocks = 1 << 20;
  uint64_t evicted = 0;
  std::unique_ptr<RadixTree> tree;
  for (auto _ : state) {
    state.PauseTiming();  // building (and destroying) trees is not timed
    tree.reset();
    tree = RadixTree::Create({.capacity_pages = kBlocks}).value();
    const NamespaceId ns = tree->RegisterNamespace(Spec()).value();
    std::mt19937_64 rng(8);
    Fill(*tree, ns, kBlocks, static_cast<uint32_t>(state.range(0)), rng);
    state.ResumeTiming();
    for (uint64_t n; (n = tree->Evict(4096)) > 0;) evicted += n;
  }
  state.counters["ns_per_block"] = benchmark::Counter(
      static_cast<double>(evicted) * 1e-9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetItemsProcessed(static_cast<int64_t>(evicted));
}
BENCHMARK(BM_EvictAll1M)->Arg(64)->Arg(1)->Iterations(3)->Unit(benchmark::kMillisecond);

// Allocation that must evict: a full 1 M tree, each Acquire asks for 16 new
// blocks (a 256-token miss) and evicts 16 LRU leaves; commit + release too.
void BM_AcquireEvictingAt1M(benchmark::State& state) {
  constexpr uint32_t kBlocks = 1 << 20;
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = kBlocks}).value();
  RadixTree& tree = *tree_owner;
  const NamespaceId ns = tree.RegisterNamespace(Spec()).value();
  const BlockKey root = tree.namespace_root(ns);
  std::mt19937_64 rng(6);
  Fill(tree, ns, kBlocks, 64, rng);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 256; ++i) prompts.push_back(RandomTokens(rng, 256));
  std::vector<std::vector<BlockKey>> keys;
  for (const auto& p : prompts) keys.push_back(ComputeBlockKeys(root, kPageSize, p));
  size_t i = 0;
  uint64_t blocks = 0;
  for (auto _ : state) {
    const size_t k = i++ % prompts.size();
    // Salt the first token so every prompt is new (keys recomputed untimed).
    state.PauseTiming();
    prompts[k][0] = static_cast<uint32_t>(i);
    keys[k] = ComputeBlockKeys(root, kPageSize, prompts[k]);
    state.ResumeTiming();
    auto a = tree.Acquire(
        {.ns = ns, .keys = keys[k], .tokens = prompts[k], .allocate = true});
    tree.Commit(a->lease, a->new_blocks, true).IgnoreError();
    blocks += a->new_blocks;
  }
  state.counters["ns_per_block"] = benchmark::Counter(
      static_cast<double>(blocks) * 1e-9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetItemsProcessed(static_cast<int64_t>(blocks));
}
BENCHMARK(BM_AcquireEvictingAt1M)->Unit(benchmark::kMicrosecond);

// (c) Index memory per cached block at 1 M blocks: IndexMemoryBytes()/nodes,
// and the RSS growth of building the tree minus the token copies.
void BM_IndexMemoryAt1M(benchmark::State& state) {
  constexpr uint32_t kBlocks = 1 << 20;
  const uint32_t depth = static_cast<uint32_t>(state.range(0));
  for (auto _ : state) {
    const size_t rss0 = RssBytes();
    std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = kBlocks}).value();
  RadixTree& tree = *tree_owner;
    const NamespaceId ns = tree.RegisterNamespace(Spec()).value();
    std::mt19937_64 rng(7);
    Fill(tree, ns, kBlocks, depth, rng);
    const size_t rss1 = RssBytes();
    const TreeStats s = tree.GetStats();
    const double nodes = static_cast<double>(s.nodes);
    const double token_bytes = nodes * kPageSize * sizeof(uint32_t);
    state.counters["nodes"] = nodes;
    state.counters["index_B_per_block"] =
        static_cast<double>(tree.IndexMemoryBytes()) / nodes;
    state.counters["rss_B_per_block_excl_tokens"] =
        (static_cast<double>(rss1 - rss0) - token_bytes) / nodes;
    state.counters["rss_B_per_block_incl_tokens"] =
        static_cast<double>(rss1 - rss0) / nodes;
  }
}
BENCHMARK(BM_IndexMemoryAt1M)
    ->Arg(64)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace radixkv
