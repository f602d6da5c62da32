// Tests of RadixTree's lease records (radix/radix_tree.h): who may end a
// lease, expiry, ending by owner, fencing, the per-owner limits, and the
// factory.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "radix/radix_tree.h"

namespace radixkv {
namespace {

using Tokens = std::vector<uint32_t>;

constexpr OwnerId kAlice = 11;
constexpr OwnerId kBob = 22;

class RadixLeaseTest : public testing::Test {
 protected:
  static constexpr uint32_t kCapacity = 8;

  RadixLeaseTest()
      : tree_owner_(RadixTree::Create({.capacity_pages = kCapacity}).value()),
        tree_(*tree_owner_) {
    ns_ = tree_.RegisterNamespace({.model = "m", .page_size = 2}).value();
  }
  ~RadixLeaseTest() override {
    EXPECT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
  }

  // A lease of `owner` allocating pages for `t`'s blocks (token mode).
  LeaseId Take(const Tokens& t, OwnerId owner,
               absl::Time expires = absl::InfiniteFuture()) {
    absl::StatusOr<AcquireResult> r = tree_.Acquire({.ns = ns_,
                                                     .tokens = t,
                                                     .allocate = true,
                                                     .owner = owner,
                                                     .expires = expires});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->lease : 0;
  }

  std::unique_ptr<RadixTree> tree_owner_;
  RadixTree& tree_;
  NamespaceId ns_ = 0;
};

TEST_F(RadixLeaseTest, OnlyTheOwnerEndsALease) {
  const LeaseId a = Take({1, 2, 3, 4}, kAlice);
  ASSERT_NE(a, 0u);
  EXPECT_EQ(tree_.owner_leases(kAlice), 1u);
  // Bob, and callers without an owner, see no such lease and change nothing.
  EXPECT_TRUE(absl::IsNotFound(tree_.Release(a, kBob)));
  EXPECT_TRUE(absl::IsNotFound(tree_.Release(a)));
  EXPECT_TRUE(absl::IsNotFound(tree_.Commit(a, 2, true, kBob).status()));
  EXPECT_EQ(tree_.GetStats().writing_pages, 2u);
  EXPECT_EQ(tree_.GetStats().leases, 1u);
  absl::StatusOr<CommitResult> c = tree_.Commit(a, 2, true, kAlice);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->inserted, 2u);
  EXPECT_EQ(tree_.owner_leases(kAlice), 0u);
  EXPECT_TRUE(absl::IsNotFound(tree_.Release(a, kAlice)));  // ended
}

TEST_F(RadixLeaseTest, EndLeasesMustBeTheOwnersOwn) {
  const LeaseId a = Take({1, 2}, kAlice);
  const LeaseId ends[] = {a};
  const uint64_t lookups = tree_.GetStats().lookups;
  absl::StatusOr<AcquireResult> r =
      tree_.Acquire({.ns = ns_,
                     .tokens = {3, 4},
                     .owner = kBob,
                     .end_leases = ends});
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("end_leases[0]"), std::string::npos)
      << r.status();
  EXPECT_EQ(RefusalOf(r.status()),
            (RefusalDetail{.reason = Refusal::kEndLeaseUnknown, .index = 0,
                           .lease = a}));
  EXPECT_EQ(tree_.owner_leases(kAlice), 1u);
  EXPECT_EQ(tree_.GetStats().lookups, lookups);  // refused before the lookup
  r = tree_.Acquire(
      {.ns = ns_, .tokens = {1, 2}, .owner = kAlice, .end_leases = ends});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(tree_.owner_leases(kAlice), 0u);  // a ended, nothing matched
}

TEST_F(RadixLeaseTest, ExpiredLeasesEndAndReadAsNotFound) {
  const absl::Time now = absl::Now();
  const LeaseId a = Take({1, 2, 3, 4}, kAlice, now + absl::Hours(1));
  const LeaseId b = Take({5, 6}, kAlice, now + absl::Hours(2));
  const LeaseId c = Take({7, 8}, kBob);  // never expires
  ASSERT_TRUE(a != 0 && b != 0 && c != 0);
  EXPECT_EQ(tree_.ReleaseExpired(now), 0u);
  EXPECT_EQ(tree_.ReleaseExpired(now + absl::Minutes(90)), 1u);
  EXPECT_EQ(tree_.GetStats().leases_expired, 1u);
  EXPECT_TRUE(absl::IsNotFound(tree_.Release(a, kAlice)));
  EXPECT_EQ(tree_.owner_leases(kAlice), 1u);
  EXPECT_EQ(tree_.GetStats().writing_pages, 2u);  // b's and c's
  // A lease found expired by Commit is ended there and then.
  const LeaseId d = Take({9, 10}, kBob, absl::Now());
  absl::StatusOr<CommitResult> late = tree_.Commit(d, 1, true, kBob);
  EXPECT_TRUE(absl::IsNotFound(late.status())) << late.status();
  EXPECT_NE(late.status().message().find("expired"), std::string::npos);
  EXPECT_EQ(tree_.GetStats().leases_expired, 2u);
  EXPECT_EQ(tree_.owner_leases(kBob), 1u);
  // An expired lease carried into an Acquire by its owner is ended there:
  // naming it tells the tree the owner is done with it.
  const LeaseId e = Take({11, 12}, kBob, absl::Now());
  const LeaseId ends[] = {e};
  absl::StatusOr<AcquireResult> carried = tree_.Acquire(
      {.ns = ns_, .tokens = {1, 2}, .owner = kBob, .end_leases = ends});
  ASSERT_TRUE(carried.ok()) << carried.status();
  EXPECT_EQ(tree_.owner_leases(kBob), 1u);  // c
  EXPECT_EQ(tree_.ReleaseExpired(now + absl::Hours(3)), 1u);  // b
  EXPECT_TRUE(tree_.Release(c, kBob).ok());
  EXPECT_EQ(tree_.GetStats().free_pages, kCapacity);
}

TEST_F(RadixLeaseTest, ReleaseOwnerEndsExactlyThatOwnersLeases) {
  Take({1, 2}, kAlice);
  Take({3, 4}, kAlice);
  const LeaseId b = Take({5, 6}, kBob);
  const LeaseId n = Take({7, 8}, kNoOwner);
  EXPECT_EQ(tree_.ReleaseOwner(kAlice), 2u);
  EXPECT_EQ(tree_.ReleaseOwner(kAlice), 0u);
  EXPECT_EQ(tree_.ReleaseOwner(kNoOwner), 0u);  // not an owner to end
  EXPECT_EQ(tree_.GetStats().leases, 2u);
  EXPECT_TRUE(tree_.Release(b, kBob).ok());
  EXPECT_TRUE(tree_.Release(n).ok());
}

TEST_F(RadixLeaseTest, OwnerLeaseLimit) {
  auto take = [&](uint32_t first, absl::Span<const LeaseId> ends = {}) {
    return tree_.Acquire({.ns = ns_,
                          .tokens = {first, first + 1},
                          .allocate = true,
                          .owner = kAlice,
                          .max_owner_leases = 2,
                          .end_leases = ends});
  };
  ASSERT_TRUE(take(1).ok());
  absl::StatusOr<AcquireResult> second = take(3);
  ASSERT_TRUE(second.ok());
  absl::StatusOr<AcquireResult> third = take(5);
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("limit is 2"), std::string::npos);
  EXPECT_EQ(tree_.GetStats().writing_pages, 2u);  // nothing allocated
  // Ending one of them in the same Acquire leaves room.
  const LeaseId ends[] = {second->lease};
  EXPECT_TRUE(take(5, ends).ok());
  EXPECT_EQ(tree_.owner_leases(kAlice), 2u);
  // Other owners are not limited by Alice's leases.
  EXPECT_NE(Take({9, 10}, kBob), 0u);
  tree_.ReleaseOwner(kAlice);
  tree_.ReleaseOwner(kBob);
}

TEST(RadixTreeCreateTest, BadOptionsAreErrorsNotExceptions) {
  absl::StatusOr<std::unique_ptr<RadixTree>> t =
      RadixTree::Create({.capacity_pages = 0});
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("capacity_pages"), std::string::npos);
  t = RadixTree::Create({.capacity_pages = kNoPage});
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  t = RadixTree::Create({.capacity_pages = 4, .max_page_size = 0});
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("max_page_size"), std::string::npos);
  t = RadixTree::Create({.capacity_pages = 4});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->GetStats().free_pages, 4u);
}


// A tree that fences: expired leases and leases of owners that went away
// keep their pages until the owner is gone for good or acknowledges.
class RadixFenceTest : public RadixLeaseTest {
 protected:
  RadixFenceTest() {
    fenced_owner_ = RadixTree::Create({.capacity_pages = kCapacity,
                                       .fence_unended_leases = true})
                        .value();
    ns_f_ = fenced_owner_->RegisterNamespace({.model = "m", .page_size = 2})
                .value();
  }
  ~RadixFenceTest() override {
    EXPECT_TRUE(fenced_owner_->CheckInvariants().ok())
        << fenced_owner_->CheckInvariants();
  }
  absl::StatusOr<AcquireResult> Fill(const Tokens& t, OwnerId owner,
                                     absl::Time expires) {
    return fenced_owner_->Acquire({.ns = ns_f_,
                                   .tokens = t,
                                   .allocate = true,
                                   .owner = owner,
                                   .expires = expires});
  }
  std::unique_ptr<RadixTree> fenced_owner_;
  NamespaceId ns_f_ = 0;
};

TEST_F(RadixFenceTest, ExpiredWritersPagesAreNeverReallocated) {
  RadixTree& t = *fenced_owner_;
  const absl::Time now = absl::Now();
  // Alice takes every page and stalls past her expiry.
  absl::StatusOr<AcquireResult> a =
      Fill({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, kAlice,
           now + absl::Seconds(1));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->new_blocks, kCapacity);
  EXPECT_EQ(t.ReleaseExpired(now + absl::Seconds(2)), 1u);
  EXPECT_EQ(t.GetStats().fenced_leases, 1u);
  EXPECT_EQ(t.GetStats().fenced_pages, kCapacity);
  EXPECT_EQ(t.GetStats().leases_expired, 1u);
  // Bob gets none of Alice's pages while she may still write them.
  absl::StatusOr<AcquireResult> b = Fill({21, 22, 23, 24}, kBob,
                                         absl::InfiniteFuture());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->new_blocks, 0u);
  EXPECT_EQ(t.GetStats().free_pages, 0u);
  // A second sweep does not count or fence it again.
  EXPECT_EQ(t.ReleaseExpired(now + absl::Seconds(3)), 0u);
  // Alice resumes and commits: NOT_FOUND, and that acknowledges the loss.
  absl::StatusOr<CommitResult> late = t.Commit(a->lease, 8, true, kAlice);
  EXPECT_TRUE(absl::IsNotFound(late.status())) << late.status();
  EXPECT_EQ(t.GetStats().fenced_leases, 0u);
  EXPECT_EQ(t.GetStats().free_pages, kCapacity);
  EXPECT_EQ(t.GetStats().cached_pages, 0u);  // nothing of hers was cached
  EXPECT_EQ(t.owner_leases(kAlice), 0u);
}

TEST_F(RadixFenceTest, OwnerGoneFencesUntilReleaseFenced) {
  RadixTree& t = *fenced_owner_;
  ASSERT_TRUE(Fill({1, 2, 3, 4}, kAlice, absl::InfiniteFuture()).ok());
  absl::StatusOr<AcquireResult> second =
      Fill({1, 2, 3, 4, 5, 6}, kAlice, absl::InfiniteFuture());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(t.ReleaseOwner(kAlice, /*fence=*/true), 2u);
  EXPECT_EQ(t.GetStats().fenced_leases, 2u);
  EXPECT_EQ(t.ReleaseOwner(kAlice, /*fence=*/true), 0u);  // already fenced
  EXPECT_EQ(t.GetStats().free_pages, kCapacity - 5);
  EXPECT_EQ(t.ReleaseFenced(kBob), 0u);
  EXPECT_EQ(t.ReleaseFenced(kAlice), 5u);
  EXPECT_EQ(t.GetStats().fenced_pages, 0u);
  EXPECT_EQ(t.GetStats().free_pages, kCapacity);
  // Without fence, ReleaseOwner ends at once, as before.
  ASSERT_TRUE(Fill({1, 2}, kBob, absl::InfiniteFuture()).ok());
  EXPECT_EQ(t.ReleaseOwner(kBob), 1u);
  EXPECT_EQ(t.GetStats().free_pages, kCapacity);
}

TEST_F(RadixFenceTest, FencedLeaseCarriedIntoAcquireIsAcknowledged) {
  RadixTree& t = *fenced_owner_;
  const absl::Time now = absl::Now();
  absl::StatusOr<AcquireResult> a = Fill({1, 2, 3, 4}, kAlice, now);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(t.ReleaseExpired(now + absl::Seconds(1)), 1u);
  const LeaseId ends[] = {a->lease};
  absl::StatusOr<AcquireResult> r =
      t.Acquire({.ns = ns_f_, .tokens = {5, 6}, .owner = kAlice,
                 .end_leases = ends});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(t.GetStats().fenced_leases, 0u);
  EXPECT_EQ(t.GetStats().free_pages, kCapacity);
}

// An Acquire with hold_new_pages: the caller copies into the new pages
// before it answers, so however the lease ends meanwhile (its owner ends
// it, its owner goes away, it expires, it is fenced and acknowledged), no
// other writer is handed those pages before ReleaseHold.
TEST_F(RadixFenceTest, HeldNewPagesOutliveTheLeaseUntilReleaseHold) {
  RadixTree& t = *fenced_owner_;
  struct Ending {
    const char* name;
    void (*end)(RadixTree&, LeaseId);
  };
  const Ending endings[] = {
      {"Release", [](RadixTree& t, LeaseId l) { ASSERT_TRUE(t.Release(l, kAlice).ok()); }},
      {"ReleaseOwner", [](RadixTree& t, LeaseId) { t.ReleaseOwner(kAlice); }},
      {"ReleaseOwner fenced, then ReleaseFenced",
       [](RadixTree& t, LeaseId) {
         t.ReleaseOwner(kAlice, /*fence=*/true);
         t.ReleaseFenced(kAlice);
       }},
      {"expiry, then the owner names it",
       [](RadixTree& t, LeaseId l) {
         t.ReleaseExpired(absl::InfiniteFuture());
         EXPECT_TRUE(absl::IsNotFound(t.Release(l, kAlice)));
       }},
  };
  for (const Ending& e : endings) {
    SCOPED_TRACE(e.name);
    absl::StatusOr<AcquireResult> a = fenced_owner_->Acquire(
        {.ns = ns_f_,
         .tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
         .allocate = true,
         .owner = kAlice,
         .expires = absl::Now() + absl::Hours(1),
         .hold_new_pages = true});
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->new_blocks, kCapacity);
    e.end(t, a->lease);
    EXPECT_EQ(t.owner_leases(kAlice), 0u);
    EXPECT_EQ(t.GetStats().leases, 0u);
    // Bob gets none of the held pages.
    EXPECT_EQ(t.GetStats().writing_pages, kCapacity);
    EXPECT_EQ(t.GetStats().free_pages, 0u);
    absl::StatusOr<AcquireResult> b =
        Fill({21, 22}, kBob, absl::InfiniteFuture());
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->new_blocks, 0u);
    EXPECT_TRUE(t.CheckInvariants().ok()) << t.CheckInvariants();
    t.ReleaseHold(a->lease);
    EXPECT_EQ(t.GetStats().writing_pages, 0u);
    EXPECT_EQ(t.GetStats().free_pages, kCapacity);
    t.ReleaseHold(a->lease);  // a second release changes nothing
    EXPECT_EQ(t.GetStats().free_pages, kCapacity);
  }
}

TEST_F(RadixFenceTest, AHoldOnALiveLeaseChangesNothing) {
  RadixTree& t = *fenced_owner_;
  absl::StatusOr<AcquireResult> a = fenced_owner_->Acquire(
      {.ns = ns_f_, .tokens = {1, 2, 3, 4}, .allocate = true, .owner = kAlice,
       .expires = absl::InfiniteFuture(), .hold_new_pages = true});
  ASSERT_TRUE(a.ok()) << a.status();
  t.ReleaseHold(a->lease);
  // The lease goes on as usual: commit one block, release the other.
  absl::StatusOr<CommitResult> c = t.Commit(a->lease, 1, false, kAlice);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->inserted, 1u);
  ASSERT_TRUE(t.Release(a->lease, kAlice).ok());
  EXPECT_EQ(t.GetStats().cached_pages, 1u);
  EXPECT_EQ(t.GetStats().free_pages, kCapacity - 1);
  // A committed page is the tree's, not the hold's: ending the lease
  // before ReleaseHold parks only the page left WRITING.
  absl::StatusOr<AcquireResult> b = fenced_owner_->Acquire(
      {.ns = ns_f_, .tokens = {5, 6, 7, 8}, .allocate = true, .owner = kAlice,
       .expires = absl::InfiniteFuture(), .hold_new_pages = true});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(t.Commit(b->lease, 1, false, kAlice).ok());
  ASSERT_TRUE(t.Release(b->lease, kAlice).ok());
  EXPECT_EQ(t.GetStats().writing_pages, 1u);
  EXPECT_TRUE(t.CheckInvariants().ok()) << t.CheckInvariants();
  t.ReleaseHold(b->lease);
  EXPECT_EQ(t.GetStats().writing_pages, 0u);
  EXPECT_EQ(t.GetStats().cached_pages, 2u);
}

TEST_F(RadixLeaseTest, OwnerPageLimitShortensThenRefuses) {
  // Cache 3 blocks, then a limit of 4 pages per owner.
  const LeaseId w = Take({1, 2, 3, 4, 5, 6}, kBob);
  ASSERT_TRUE(tree_.Commit(w, 3, true, kBob).ok());
  auto acquire = [&](const Tokens& t) {
    return tree_.Acquire({.ns = ns_,
                          .tokens = t,
                          .allocate = true,
                          .owner = kAlice,
                          .max_owner_pages = 4});
  };
  absl::StatusOr<AcquireResult> a = acquire({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->matched_blocks, 3u);
  EXPECT_EQ(a->new_blocks, 1u);  // 5 blocks wanted, 4 pages allowed
  EXPECT_EQ(tree_.owner_pages(kAlice), 4u);
  absl::StatusOr<AcquireResult> b = acquire({1, 2});
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  EXPECT_NE(b.status().message().find("limit is 4"), std::string::npos);
  ASSERT_TRUE(tree_.Release(a->lease, kAlice).ok());
  EXPECT_EQ(tree_.owner_pages(kAlice), 0u);
  // A matched prefix longer than the limit is cut to it.
  absl::StatusOr<AcquireResult> c = tree_.Acquire(
      {.ns = ns_, .tokens = {1, 2, 3, 4, 5, 6}, .owner = kAlice,
       .max_owner_pages = 2});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->matched_blocks, 2u);
  ASSERT_TRUE(tree_.Release(c->lease, kAlice).ok());
}

}  // namespace
}  // namespace radixkv
