// Tests of ScopedLease (radix/scoped_lease.h).
#include "radix/scoped_lease.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

namespace radixkv {
namespace {

class ScopedLeaseTest : public testing::Test {
 protected:
  ScopedLeaseTest()
      : tree_owner_(RadixTree::Create({.capacity_pages = 4}).value()),
        tree_(*tree_owner_) {
    ns_ = tree_.RegisterNamespace({.model = "m", .page_size = 1}).value();
  }
  AcquireResult Acquire(std::vector<uint32_t> t) {
    const auto keys = ComputeBlockKeys(tree_.namespace_root(ns_), 1, t);
    return tree_.Acquire({.ns = ns_, .keys = keys, .tokens = t, .allocate = true})
        .value();
  }
  std::unique_ptr<RadixTree> tree_owner_;
  RadixTree& tree_;
  NamespaceId ns_ = 0;
};

TEST_F(ScopedLeaseTest, ReleasesOnDestruction) {
  {
    ScopedLease lease(&tree_, Acquire({1, 2}).lease);
    EXPECT_TRUE(lease.active());
    EXPECT_EQ(tree_.GetStats().writing_pages, 2u);
  }
  EXPECT_EQ(tree_.GetStats().leases, 0u);
  EXPECT_EQ(tree_.GetStats().free_pages, 4u);
}

TEST_F(ScopedLeaseTest, CommitWithReleaseEndsOwnership) {
  ScopedLease lease(&tree_, Acquire({1, 2}).lease);
  absl::StatusOr<CommitResult> c = lease.Commit(2, /*release=*/true);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(lease.active());
  EXPECT_EQ(lease.Commit(0, true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tree_.GetStats().cached_pages, 2u);
  EXPECT_EQ(tree_.GetStats().pinned_pages, 0u);
}

TEST_F(ScopedLeaseTest, MoveTransfersOwnership) {
  ScopedLease a(&tree_, Acquire({1}).lease);
  ScopedLease b = std::move(a);
  EXPECT_FALSE(a.active());
  EXPECT_TRUE(b.active());
  ScopedLease c(&tree_, Acquire({2}).lease);
  c = std::move(b);  // c's old lease is released
  EXPECT_EQ(tree_.GetStats().leases, 1u);
  EXPECT_TRUE(c.Release().ok());
  EXPECT_EQ(tree_.GetStats().leases, 0u);
  EXPECT_EQ(c.Release().code(), absl::StatusCode::kNotFound);
}

TEST_F(ScopedLeaseTest, TakeIdHandsOff) {
  ScopedLease a(&tree_, Acquire({1}).lease);
  const LeaseId id = a.TakeId();
  EXPECT_FALSE(a.active());
  EXPECT_EQ(tree_.GetStats().leases, 1u);
  EXPECT_TRUE(tree_.Release(id).ok());
}

}  // namespace
}  // namespace radixkv
