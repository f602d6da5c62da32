// Tests of RadixTree's retention priorities (radix/radix_tree.h,
// BlockPriority): lower priorities are evicted first, one priority follows
// the policy's order, priorities expire to the default, a prefix keeps the
// priority of the blocks below it, accounts' fair shares still hold, and
// bad ranges are refused without changing anything.
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "radix/radix_tree.h"

namespace radixkv {
namespace {

using Tokens = std::vector<uint32_t>;

class RadixPriorityTest : public testing::TestWithParam<EvictionPolicy> {
 protected:
  static constexpr uint32_t kCapacity = 8;

  RadixPriorityTest()
      : tree_owner_(RadixTree::Create({.capacity_pages = kCapacity,
                                       .accounts = 3,
                                       .eviction_policy = GetParam()})
                        .value()),
        tree_(*tree_owner_) {
    a_ = tree_.RegisterNamespace({.model = "m", .cache_salt = "a",
                                  .page_size = 1}, 1).value();
    b_ = tree_.RegisterNamespace({.model = "m", .cache_salt = "b",
                                  .page_size = 1}, 2).value();
  }
  ~RadixPriorityTest() override {
    EXPECT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
  }

  // Stores `t` in `ns` (Acquire with allocation, commit every new block,
  // end the lease) with `ranges`; returns the Acquire's result.
  AcquireResult Store(NamespaceId ns, const Tokens& t,
                      std::vector<BlockPriority> ranges = {}) {
    absl::StatusOr<AcquireResult> r = tree_.Acquire(
        {.ns = ns, .tokens = t, .allocate = true, .priorities = ranges});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    if (r->lease != 0) {
      EXPECT_TRUE(tree_.Commit(r->lease, r->new_blocks, true).ok());
    }
    EXPECT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
    return *r;
  }
  // Pins and releases the cached prefix of `t`: a use, as a lookup is.
  void Touch(NamespaceId ns, const Tokens& t) {
    absl::StatusOr<AcquireResult> r = tree_.Acquire({.ns = ns, .tokens = t});
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->lease != 0) {
      ASSERT_TRUE(tree_.Release(r->lease).ok());
    }
  }
  uint32_t Cached(NamespaceId ns, const Tokens& t) {
    return tree_.Match(ns, {}, t).value().matched_blocks;
  }
  static BlockPriority All(uint32_t blocks, uint32_t priority,
                           absl::Duration d = absl::InfiniteDuration()) {
    return {.first_block = 0, .blocks = blocks, .priority = priority,
            .duration = d};
  }

  std::unique_ptr<RadixTree> tree_owner_;
  RadixTree& tree_;
  NamespaceId a_ = 0, b_ = 0;
};

TEST_P(RadixPriorityTest, LowerPriorityIsEvictedFirst) {
  Store(a_, {1, 2, 3, 4});                    // default, older
  Store(a_, {10, 11, 12, 13}, {All(4, 10)});  // low, newer
  // Least recently used would take {1, 2}; the low priority goes first.
  const AcquireResult r = Store(a_, {20, 21});
  EXPECT_EQ(r.evicted_pages, 2u);
  EXPECT_EQ(Cached(a_, {1, 2, 3, 4}), 4u);
  EXPECT_EQ(Cached(a_, {10, 11, 12, 13}), 2u);
}

TEST_P(RadixPriorityTest, HigherPriorityOutlivesNewerDefaults) {
  Store(a_, {1, 2}, {All(2, 90)});  // high, oldest
  Store(a_, {10, 11, 12, 13, 14, 15});
  Store(a_, {20, 21, 22, 23});
  EXPECT_EQ(Cached(a_, {1, 2}), 2u);
  EXPECT_EQ(Cached(a_, {10, 11, 12, 13, 14, 15}), 2u);
  // Only high-priority leaves left besides the lease's: they go too.
  Store(a_, {30, 31, 32, 33, 34, 35, 36, 37});
  EXPECT_EQ(Cached(a_, {1, 2}), 0u);
}

TEST_P(RadixPriorityTest, OnePriorityFollowsThePolicysOrder) {
  Store(a_, {1, 2}, {All(2, 10)});
  Store(a_, {5, 6}, {All(2, 10)});
  Store(a_, {8, 9, 10, 11});
  Touch(a_, {1, 2});  // now {5, 6} is the least recently used low block
  const AcquireResult r = Store(a_, {20, 21});
  EXPECT_EQ(r.evicted_pages, 2u);
  EXPECT_EQ(Cached(a_, {1, 2}), 2u);
  EXPECT_EQ(Cached(a_, {5, 6}), 0u);
  EXPECT_EQ(Cached(a_, {8, 9, 10, 11}), 4u);
}

TEST_P(RadixPriorityTest, APrefixKeepsThePriorityOfBlocksBelowIt) {
  const AcquireResult r = Store(
      a_, {1, 2, 3, 4},
      {{.first_block = 3, .blocks = 1, .priority = 80}});
  ASSERT_EQ(r.pages.size(), 4u);
  for (PageId p : r.pages) EXPECT_EQ(tree_.TEST_priority(p), 80u) << p;
  // A lease that names no priority gives its blocks the default: a low
  // block it uses is raised, a high one keeps its priority.
  const AcquireResult low = Store(a_, {7, 8}, {All(2, 5)});
  EXPECT_EQ(tree_.TEST_priority(low.pages[0]), 5u);
  Touch(a_, {7, 8});
  EXPECT_EQ(tree_.TEST_priority(low.pages[0]), kDefaultPriority);
  Touch(a_, {1, 2, 3, 4});
  EXPECT_EQ(tree_.TEST_priority(r.pages[3]), 80u);
}

TEST_P(RadixPriorityTest, APriorityDecaysToTheDefaultAfterItsDuration) {
  const AcquireResult h = Store(a_, {1, 2}, {All(2, 90, absl::Seconds(1))});
  const AcquireResult l = Store(a_, {3, 4}, {All(2, 5, absl::Milliseconds(1))});
  Store(a_, {10, 11, 12, 13});
  EXPECT_EQ(tree_.TEST_priority(h.pages[1]), 90u);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_EQ(tree_.TEST_priority(h.pages[1]), kDefaultPriority);
  EXPECT_EQ(tree_.TEST_priority(l.pages[1]), kDefaultPriority);
  // The decayed low block is the oldest default block; then, once
  // {10 .. 13} were used again, the decayed high one is older than them.
  Touch(a_, {10, 11, 12, 13});
  Store(a_, {20, 21});
  EXPECT_EQ(Cached(a_, {3, 4}), 0u);
  Store(a_, {30, 31});
  EXPECT_EQ(Cached(a_, {1, 2}), 0u);
  EXPECT_EQ(Cached(a_, {10, 11, 12, 13}), 4u);
}

TEST_P(RadixPriorityTest, PrioritiesDoNotMoveAnotherAccountsFairShare) {
  Store(b_, {100, 101});                    // b: default, the oldest
  Store(a_, {1, 2, 3, 4, 5, 6}, {All(6, 100)});
  // a's churn evicts a's own blocks, however high their priority, since
  // a holds more than b.
  const AcquireResult r = Store(a_, {7, 8}, {All(2, 100)});
  EXPECT_EQ(r.evicted_pages, 2u);
  EXPECT_EQ(Cached(b_, {100, 101}), 2u);
  EXPECT_EQ(tree_.GetAccountStats(2).evicted_pages, 0u);
  // b's low-priority blocks are only ever b's victims.
  Store(b_, {200, 201}, {All(2, 0)});
  EXPECT_EQ(tree_.GetAccountStats(2).evicted_pages, 0u);
  EXPECT_EQ(Cached(b_, {200, 201}), 2u);
}

TEST_P(RadixPriorityTest, BadRangesAreRefusedAndChangeNothing) {
  const TreeStats before = tree_.GetStats();
  struct Case {
    BlockPriority range;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {All(2, 101), "priorities[0].priority=101 exceeds the limit of 100"},
           {All(2, 50, absl::Hours(24 * 31)),
            "priorities[0].duration=744h exceeds the limit of 720h"},
           {{.first_block = 1, .blocks = 2, .priority = 50},
            "not within the prompt's 2 full blocks"},
           {{.first_block = 0xffffffffu, .blocks = 2, .priority = 50},
            "not within the prompt's 2 full blocks"},
           {{.first_block = 0, .blocks = 0, .priority = 50}, "are empty"}}) {
    BlockPriority ranges[] = {c.range};
    absl::StatusOr<AcquireResult> r = tree_.Acquire(
        {.ns = a_, .tokens = Tokens{1, 2}, .allocate = true,
         .priorities = ranges});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.message), std::string::npos)
        << r.status();
  }
  const TreeStats after = tree_.GetStats();
  EXPECT_EQ(after.free_pages, before.free_pages);
  EXPECT_EQ(after.leases, 0u);
  EXPECT_EQ(after.lookups, before.lookups);
  // Commit checks its ranges against the lease's prompt; the lease lives on.
  absl::StatusOr<AcquireResult> r =
      tree_.Acquire({.ns = a_, .tokens = Tokens{1, 2}, .allocate = true});
  ASSERT_TRUE(r.ok());
  BlockPriority beyond[] = {{.first_block = 2, .blocks = 1, .priority = 9}};
  absl::StatusOr<CommitResult> c =
      tree_.Commit(r->lease, 2, true, kNoOwner, false, beyond);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_.GetStats().cached_pages, 0u);
  BlockPriority ok[] = {{.first_block = 1, .blocks = 1, .priority = 9}};
  c = tree_.Commit(r->lease, 2, true, kNoOwner, false, ok);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(tree_.TEST_priority(r->pages[1]), 9u);
  EXPECT_EQ(tree_.TEST_priority(r->pages[0]), kDefaultPriority);
}

TEST_P(RadixPriorityTest, RandomPrioritiesKeepTheInvariants) {
  std::mt19937 rng(29);
  for (int step = 0; step < 3000; ++step) {
    const NamespaceId ns = rng() % 2 ? a_ : b_;
    Tokens t(1 + rng() % 5);
    for (uint32_t& x : t) x = rng() % 4;  // shared prefixes
    std::vector<BlockPriority> ranges;
    if (rng() % 3 != 0) {
      const uint32_t first = rng() % t.size();
      ranges.push_back(
          {.first_block = first,
           .blocks = 1 + static_cast<uint32_t>(rng() % (t.size() - first)),
           .priority = static_cast<uint32_t>(rng() % 101),
           .duration = rng() % 2 ? absl::InfiniteDuration()
                                 : absl::Milliseconds(rng() % 1500)});
    }
    if (rng() % 4 == 0) {
      Touch(ns, t);
    } else {
      Store(ns, t, ranges);
    }
    ASSERT_TRUE(tree_.CheckInvariants().ok())
        << "step " << step << ": " << tree_.CheckInvariants();
    if (step == 1500) std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  }
  // With no lease left, every block can be evicted, leaves first.
  tree_.Evict(kCapacity);
  EXPECT_EQ(tree_.GetStats().cached_pages, 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, RadixPriorityTest,
                         testing::Values(EvictionPolicy::kLru,
                                         EvictionPolicy::kTurnDuel),
                         [](const auto& info) {
                           return info.param == EvictionPolicy::kLru
                                      ? "lru"
                                      : "turn_duel";
                         });

}  // namespace
}  // namespace radixkv
