// Tests of RadixTree's accounts (radix/radix_tree.h, AccountLimits): fair
// eviction between accounts, weights, the per-account page and pin limits,
// the registration rules, and forgetting empty namespaces.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "radix/radix_tree.h"

namespace radixkv {
namespace {

using Tokens = std::vector<uint32_t>;

class RadixAccountTest : public testing::Test {
 protected:
  static constexpr uint32_t kCapacity = 8;

  RadixAccountTest()
      : tree_owner_(RadixTree::Create({.capacity_pages = kCapacity,
                                       .accounts = 3})
                        .value()),
        tree_(*tree_owner_) {
    a_ = tree_.RegisterNamespace({.model = "m", .cache_salt = "a",
                                  .page_size = 1}, 1).value();
    b_ = tree_.RegisterNamespace({.model = "m", .cache_salt = "b",
                                  .page_size = 1}, 2).value();
  }
  ~RadixAccountTest() override {
    EXPECT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
  }

  // Acquires `t` in `ns` with allocation and commits every new block at
  // once (the lease ends); returns the Acquire's result.
  AcquireResult Store(NamespaceId ns, const Tokens& t) {
    absl::StatusOr<AcquireResult> r =
        tree_.Acquire({.ns = ns, .tokens = t, .allocate = true});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    if (r->lease != 0) {
      EXPECT_TRUE(tree_.Commit(r->lease, r->new_blocks, true).ok());
    }
    return *r;
  }
  uint32_t Cached(NamespaceId ns, const Tokens& t) {
    return tree_.Match(ns, {}, t).value().matched_blocks;
  }

  std::unique_ptr<RadixTree> tree_owner_;
  RadixTree& tree_;
  NamespaceId a_ = 0, b_ = 0;
};

TEST_F(RadixAccountTest, ABusyAccountEvictsItsOwnPagesNotAQuietOnes) {
  // b stores 2 blocks first (the oldest in the pool), then a fills the rest.
  Store(b_, {100, 101});
  Store(a_, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(tree_.GetStats().free_pages, 0u);
  // a keeps storing: plain LRU would take b's older blocks first; fair
  // eviction takes a's own, since a holds more.
  const AcquireResult r = Store(a_, {7, 8});
  EXPECT_EQ(r.new_blocks, 2u);
  EXPECT_EQ(r.evicted_pages, 2u);
  EXPECT_EQ(Cached(b_, {100, 101}), 2u);
  EXPECT_EQ(tree_.GetAccountStats(2).evicted_pages, 0u);
  EXPECT_EQ(tree_.GetAccountStats(1).evicted_pages, 2u);
  EXPECT_EQ(tree_.GetAccountStats(1).cached_pages, 6u);
}

TEST_F(RadixAccountTest, AQuietAccountTakesPagesFromTheBusiestOne) {
  Store(a_, {1, 2, 3, 4, 5, 6});
  Store(b_, {100, 101});
  // b grows: its pages come from a, which holds more, even though b's own
  // blocks are older than a's newest.
  const AcquireResult r = Store(b_, {200, 201});
  EXPECT_EQ(r.evicted_pages, 2u);
  EXPECT_EQ(Cached(b_, {100, 101}), 2u);
  EXPECT_EQ(tree_.GetAccountStats(1).cached_pages, 4u);
  EXPECT_EQ(tree_.GetAccountStats(2).cached_pages, 4u);
  // At equal shares the tie goes to the lower account (a).
  Store(b_, {300});
  EXPECT_EQ(tree_.GetAccountStats(1).cached_pages, 3u);
  EXPECT_EQ(tree_.GetAccountStats(2).cached_pages, 5u);
}

TEST_F(RadixAccountTest, WeightsSetTheShares) {
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.weight = 3}).ok());
  // a (weight 3) and b (weight 1) both keep storing new prompts: the pool
  // settles at a 6 : 2 split (7 : 1 .. 5 : 3 between two stores).
  for (uint32_t i = 0; i < 20; ++i) {
    Store(b_, {2000 + i});
    EXPECT_GE(tree_.GetAccountStats(1).cached_pages, i < 10 ? 0u : 5u);
    Store(a_, {1000 + i});
  }
  EXPECT_EQ(tree_.GetAccountStats(1).cached_pages, 6u);
  EXPECT_EQ(tree_.GetAccountStats(2).cached_pages, 2u);
}

TEST_F(RadixAccountTest, MaxPagesCapsAnAccountAndRecyclesItsOwnPages) {
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.max_pages = 3}).ok());
  // Five new blocks with the pool empty: only three pages, flagged.
  absl::StatusOr<AcquireResult> r =
      tree_.Acquire({.ns = a_, .tokens = {1, 2, 3, 4, 5}, .allocate = true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->new_blocks, 3u);
  EXPECT_TRUE(r->account_limited);
  ASSERT_TRUE(tree_.Commit(r->lease, 3, true).ok());
  EXPECT_EQ(tree_.GetAccountStats(1).limited_acquires, 1u);
  // Later prompts reuse a's own least recently used pages while five pages
  // stay free for everyone else.
  const AcquireResult s = Store(a_, {9, 10});
  EXPECT_EQ(s.new_blocks, 2u);
  EXPECT_EQ(s.evicted_pages, 2u);
  EXPECT_EQ(tree_.GetAccountStats(1).cached_pages, 3u);
  EXPECT_EQ(tree_.GetStats().free_pages, kCapacity - 3);
  EXPECT_EQ(Store(b_, {100, 101, 102, 103, 104}).new_blocks, 5u);
}

TEST_F(RadixAccountTest, MaxPinnedPagesBoundsWhatLeasesHold) {
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.max_pinned_pages = 4}).ok());
  absl::StatusOr<AcquireResult> first =
      tree_.Acquire({.ns = a_, .tokens = {1, 2, 3}, .allocate = true});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->new_blocks, 3u);
  // One page of room left.
  absl::StatusOr<AcquireResult> second =
      tree_.Acquire({.ns = a_, .tokens = {7, 8, 9}, .allocate = true});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->new_blocks, 1u);
  EXPECT_TRUE(second->account_limited);
  // None left: refused, naming the limit, and nothing changes.
  const TreeStats before = tree_.GetStats();
  absl::StatusOr<AcquireResult> third =
      tree_.Acquire({.ns = a_, .tokens = {5}, .allocate = true});
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("max_pinned_pages"),
            std::string::npos);
  EXPECT_EQ(tree_.GetStats().writing_pages, before.writing_pages);
  // Another account is not affected.
  absl::StatusOr<AcquireResult> other =
      tree_.Acquire({.ns = b_, .tokens = {100, 101}, .allocate = true});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->new_blocks, 2u);
  EXPECT_EQ(tree_.GetAccountStats(1).held_pages, 4u);
  // Ending a lease in the same call makes room for the new one.
  const LeaseId ends[] = {first->lease};
  absl::StatusOr<AcquireResult> swap = tree_.Acquire(
      {.ns = a_, .tokens = {5}, .allocate = true, .end_leases = ends});
  ASSERT_TRUE(swap.ok()) << swap.status();
  EXPECT_EQ(swap->new_blocks, 1u);
  for (LeaseId l : {second->lease, other->lease, swap->lease}) {
    ASSERT_TRUE(tree_.Release(l).ok());
  }
  EXPECT_EQ(tree_.GetAccountStats(1).held_pages, 0u);
}

TEST_F(RadixAccountTest, RegistrationNamesTheAccount) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      tree_.RegisterNamespace({.model = "m", .page_size = 1}, 3).status()));
  // An existing namespace keeps its account.
  EXPECT_EQ(tree_.RegisterNamespace({.model = "m", .cache_salt = "a",
                                     .page_size = 1}, 1).value(),
            a_);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      tree_.RegisterNamespace({.model = "m", .cache_salt = "a",
                               .page_size = 1}, 2).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(tree_.SetAccountLimits(1, {.weight = 0})));
  EXPECT_TRUE(absl::IsInvalidArgument(tree_.SetAccountLimits(3, {})));
  EXPECT_EQ(tree_.GetAccountStats(1).namespaces, 1u);
}

TEST_F(RadixAccountTest, EmptyNamespacesAreForgottenAndTheirIdsReused) {
  Store(a_, {1, 2});
  absl::StatusOr<AcquireResult> held =
      tree_.Acquire({.ns = b_, .tokens = {9}, .allocate = true});
  ASSERT_TRUE(held.ok());
  const NamespaceId empty =
      tree_.RegisterNamespace({.model = "e", .page_size = 1}, 1).value();
  const NamespaceId ids[] = {a_, b_, empty, 999};
  // a caches blocks, b holds a lease, 999 is unknown: only `empty` goes.
  EXPECT_EQ(tree_.ForgetEmptyNamespaces(ids), std::vector<NamespaceId>{empty});
  EXPECT_EQ(tree_.GetStats().namespaces, 2u);
  EXPECT_EQ(tree_.GetAccountStats(1).namespaces, 1u);
  EXPECT_TRUE(absl::IsInvalidArgument(tree_.Match(empty, {}, Tokens{1}).status()));
  EXPECT_EQ(tree_.ForgetEmptyNamespaces(ids).size(), 0u);  // already gone
  // The id goes to the next new namespace, which sees nothing of the old.
  const NamespaceId next =
      tree_.RegisterNamespace({.model = "f", .page_size = 1}, 2).value();
  EXPECT_EQ(next, empty);
  EXPECT_EQ(tree_.namespace_root(next),
            NamespaceRoot({.model = "f", .page_size = 1}));
  // Once b's lease ends and a's blocks are evicted, both can go.
  ASSERT_TRUE(tree_.Release(held->lease).ok());
  tree_.Clear();
  const NamespaceId both[] = {a_, b_};
  EXPECT_EQ(tree_.ForgetEmptyNamespaces(both).size(), 2u);
  // Registering a's spec again gives a fresh namespace with nothing cached.
  const NamespaceId again = tree_.RegisterNamespace(
      {.model = "m", .cache_salt = "a", .page_size = 1}, 1).value();
  EXPECT_EQ(Cached(again, {1, 2}), 0u);
  EXPECT_EQ(tree_.ListNamespaces().size(), 2u);
}

TEST(RadixNamespaceLimitTest, ForgettingMakesRoomPastTheIdSpace) {
  std::unique_ptr<RadixTree> tree =
      RadixTree::Create({.capacity_pages = 4}).value();
  std::vector<NamespaceId> ids;
  for (uint32_t i = 0; i < kMaxNamespaces; ++i) {
    ids.push_back(tree->RegisterNamespace(
        {.model = "m", .cache_salt = std::to_string(i), .page_size = 1}).value());
  }
  EXPECT_TRUE(absl::IsResourceExhausted(
      tree->RegisterNamespace({.model = "one more", .page_size = 1}).status()));
  EXPECT_EQ(tree->ForgetEmptyNamespaces(ids).size(), kMaxNamespaces);
  for (uint32_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(tree->RegisterNamespace(
        {.model = "n", .cache_salt = std::to_string(i), .page_size = 1}).ok());
  }
  EXPECT_TRUE(tree->CheckInvariants().ok());
}

TEST_F(RadixAccountTest, EvictionsAreReportedWithTheirPagesForATierBelow) {
  Store(a_, {1, 2, 3, 4, 5, 6, 7, 8});  // the pool is full
  const BlockKey root = tree_.namespace_root(a_);
  const std::vector<BlockKey> old_keys =
      ComputeBlockKeys(root, 1, std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8});
  absl::StatusOr<AcquireResult> r = tree_.Acquire(
      {.ns = b_, .tokens = {50, 51}, .allocate = true, .report_evictions = true});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->evicted.size(), 2u);
  ASSERT_EQ(r->new_keys.size(), 2u);
  EXPECT_EQ(r->new_keys[0],
            ComputeBlockKeys(tree_.namespace_root(b_), 1,
                             std::vector<uint32_t>{50, 51})[0]);
  // The victims are a's least recently used leaves, deepest first; each
  // one's page is one of the new pages.
  for (const EvictedBlock& e : r->evicted) {
    EXPECT_NE(std::find(r->pages.begin(), r->pages.end(), e.page),
              r->pages.end());
    EXPECT_EQ(e.root, root);
    EXPECT_EQ(e.ns, a_);
  }
  EXPECT_EQ(r->evicted[0].key, old_keys[7]);
  EXPECT_EQ(r->evicted[0].parent_key, old_keys[6]);
  ASSERT_TRUE(tree_.Release(r->lease).ok());
}

TEST(RadixAccountCreateTest, AccountsMustFit) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      RadixTree::Create({.capacity_pages = 8, .accounts = 0}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      RadixTree::Create({.capacity_pages = 8, .accounts = kMaxAccounts + 1})
          .status()));
  EXPECT_TRUE(RadixTree::Create({.capacity_pages = 8, .accounts = kMaxAccounts})
                  .ok());
}

}  // namespace
}  // namespace radixkv
