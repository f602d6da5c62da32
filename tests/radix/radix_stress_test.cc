// Multi-threaded stress test of RadixTree: 8 threads run random Acquire /
// Commit / Release / Evict / Match / inspection calls on one tree. Run it
// under ThreadSanitizer with the tsan preset (ctest label `tsan`):
//   cmake --preset tsan && cmake --build --preset tsan --target radix_stress_test
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"
#include "radix/scoped_lease.h"

namespace radixkv {
namespace {

// Counts events; must not call back into the tree.
class CountingListener : public EventListener {
 public:
  void OnTreeEvents(absl::Span<const TreeEvent> events) override {
    for (const TreeEvent& e : events) {
      if (e.type == TreeEvent::Type::kStored) stored_.fetch_add(1);
      if (e.type == TreeEvent::Type::kRemoved) removed_.fetch_add(1);
    }
  }
  std::atomic<uint64_t> stored_{0};
  std::atomic<uint64_t> removed_{0};
};

// The parameters: the tree's accounts and its eviction policy. With 3
// accounts, the two namespaces belong to accounts 1 (weight 2) and 2 (at
// most 64 pages), so evictions pick between lists and one account
// recycles its own pages; turn_duel adds the probation stacks.
class RadixStressTest
    : public testing::TestWithParam<std::tuple<uint32_t, EvictionPolicy>> {};

TEST_P(RadixStressTest, ConcurrentOperationsKeepInvariants) {
  constexpr int kThreads = 8;
  constexpr int kOpsPerThread = 3000;
  constexpr uint32_t kPageSize = 4;
  const uint32_t accounts = std::get<0>(GetParam());
  CountingListener listener;
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = 256,
                         .listener = &listener,
                         .accounts = accounts,
                         .eviction_policy = std::get<1>(GetParam())})
          .value();
  RadixTree& tree = *tree_owner;
  if (accounts > 1) {
    ASSERT_TRUE(tree.SetAccountLimits(1, {.weight = 2}).ok());
    ASSERT_TRUE(tree.SetAccountLimits(2, {.max_pages = 64}).ok());
  }
  NamespaceSpec spec{.model = "stress", .page_size = kPageSize};
  const NamespaceId ns0 =
      tree.RegisterNamespace(spec, accounts > 1 ? 1 : 0).value();
  spec.lora = "adapter";
  const NamespaceId ns1 =
      tree.RegisterNamespace(spec, accounts > 1 ? 2 : 0).value();
  const BlockKey roots[2] = {tree.namespace_root(ns0),
                             tree.namespace_root(ns1)};

  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> wrong_pages{0};
  auto worker = [&](int id) {
    std::mt19937 rng(1000 + id);
    auto rand = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
    std::vector<ScopedLease> held;
    std::vector<uint32_t> uncommitted;
    for (int i = 0; i < kOpsPerThread; ++i) {
      const uint32_t op = rand(100);
      if (op < 50 || held.empty()) {
        const NamespaceId ns = rand(4) == 0 ? ns1 : ns0;
        std::vector<uint32_t> t(kPageSize * (1 + rand(10)));
        for (uint32_t& x : t) x = rand(4);
        const auto keys = ComputeBlockKeys(roots[ns], kPageSize, t);
        // Half the time in token mode, as radixkvd sends token prompts: the
        // token walk (its pages trusted while nothing was evicted since),
        // then hashing the rest; the keys must come out the same.
        const bool token_mode = rand(2) == 0;
        if (token_mode) {
          std::vector<BlockKey> walked;
          tree.TEST_TokenKeys(ns, t, /*stop_at_missing=*/false, &walked);
          if (walked != keys) errors.fetch_add(1);
        }
        // Sometimes the Acquire also ends a held lease (release_leases).
        LeaseId ends[1] = {0};
        size_t ending = held.size();
        if (!held.empty() && rand(4) == 0) {
          ending = rand(static_cast<uint32_t>(held.size()));
          ends[0] = held[ending].id();
        }
        absl::StatusOr<AcquireResult> a = tree.Acquire(
            {.ns = ns,
             .keys = token_mode ? absl::Span<const BlockKey>() : keys,
             .tokens = t,
             .allocate = rand(5) != 0,
             .end_leases =
                 absl::MakeConstSpan(ends, ending < held.size() ? 1 : 0),
             .report_evictions = rand(2) == 0});
        if (!a.ok()) {
          errors.fetch_add(1);
          continue;
        }
        if (ending < held.size()) {
          held[ending].TakeId();  // ended by the Acquire
          held.erase(held.begin() + ending);
          uncommitted.erase(uncommitted.begin() + ending);
        }
        hits.fetch_add(a->matched_blocks);
        // The matched pages are pinned, so they stay the ones the index
        // holds for these keys, whatever the other threads do.
        if (a->matched_blocks != 0) {
          const auto matched =
              absl::MakeConstSpan(keys).first(a->matched_blocks);
          absl::StatusOr<std::vector<BlockExplanation>> e =
              tree.Explain(ns, matched, {});
          if (!e.ok()) {
            errors.fetch_add(1);
          } else {
            for (uint32_t b = 0; b < a->matched_blocks; ++b) {
              if ((*e)[b].status != BlockStatus::kCached ||
                  (*e)[b].page != a->pages[b]) {
                wrong_pages.fetch_add(1);
              }
            }
          }
        }
        if (a->lease != 0) {
          held.emplace_back(&tree, a->lease);
          uncommitted.push_back(a->new_blocks);
        }
      } else if (op < 80) {
        const size_t k = rand(static_cast<uint32_t>(held.size()));
        const uint32_t blocks = rand(uncommitted[k] + 1);
        const bool release = rand(2) == 0;
        absl::StatusOr<CommitResult> c = held[k].Commit(blocks, release);
        if (!c.ok()) {
          errors.fetch_add(1);
          continue;
        }
        uncommitted[k] -= blocks;
        if (release) {
          held.erase(held.begin() + k);
          uncommitted.erase(uncommitted.begin() + k);
        }
      } else if (op < 90) {
        const size_t k = rand(static_cast<uint32_t>(held.size()));
        held.erase(held.begin() + k);  // ScopedLease releases
        uncommitted.erase(uncommitted.begin() + k);
      } else if (op < 93) {
        tree.Evict(rand(8));
      } else if (op < 97) {
        std::vector<uint32_t> t(kPageSize * 3);
        for (uint32_t& x : t) x = rand(4);
        const auto keys = ComputeBlockKeys(roots[0], kPageSize, t);
        if (!tree.Match(ns0, keys, t).ok()) errors.fetch_add(1);
        // The one-pass token Match reads hot children and hashes at branch
        // points while other threads insert and evict.
        absl::StatusOr<MatchResult> m = tree.Match(ns0, {}, t);
        if (!m.ok() || m->total_blocks != 3 ||
            m->walked_blocks + m->hashed_blocks > 3) {
          errors.fetch_add(1);
        }
        if (!tree.Explain(ns0, keys, {}).ok()) errors.fetch_add(1);
      } else {
        (void)tree.GetStats();
        (void)tree.DumpTree(2, 16);
        (void)tree.IndexMemoryBytes();
      }
      while (held.size() > 4) {
        held.erase(held.begin());
        uncommitted.erase(uncommitted.begin());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (std::thread& t : threads) t.join();

  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(wrong_pages.load(), 0u);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants();
  const TreeStats s = tree.GetStats();
  EXPECT_EQ(s.leases, 0u);
  EXPECT_EQ(s.writing_pages, 0u);
  EXPECT_EQ(s.pinned_pages, 0u);
  EXPECT_EQ(s.free_pages + s.cached_pages, s.capacity_pages);
  EXPECT_EQ(s.lookups, s.lookups);  // read under the lock; no tearing
  EXPECT_GT(hits.load(), 0u);
  EXPECT_EQ(listener.stored_.load() - listener.removed_.load(),
            s.cached_pages);
}

INSTANTIATE_TEST_SUITE_P(
    AccountsAndPolicies, RadixStressTest,
    testing::Combine(testing::Values(1u, 3u),
                     testing::Values(EvictionPolicy::kLru,
                                     EvictionPolicy::kTurnDuel)),
    [](const testing::TestParamInfo<RadixStressTest::ParamType>& p) {
      return std::string(std::get<0>(p.param) == 1 ? "OneAccount"
                                                   : "ThreeAccounts") +
             (std::get<1>(p.param) == EvictionPolicy::kLru ? "Lru"
                                                           : "TurnDuel");
    });

}  // namespace
}  // namespace radixkv
