// Tests of the typed refusals (radix/refusal.h): the payload's round trip,
// and the Refusal with its numbers that each kind of refusal of the tree
// carries, so that callers never read the message to tell them apart.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "radix/radix_tree.h"
#include "radix/refusal.h"

namespace radixkv {
namespace {

using Tokens = std::vector<uint32_t>;

constexpr OwnerId kAlice = 11;
constexpr OwnerId kBob = 22;

TEST(RefusalTest, PayloadRoundTrips) {
  const RefusalDetail d{.reason = Refusal::kOwnerPageLimit,
                        .index = 3,
                        .lease = 0xfedcba9876543210u,
                        .held = 17,
                        .limit = 16};
  const absl::Status s =
      Refuse(absl::StatusCode::kResourceExhausted, d, "words for people");
  EXPECT_TRUE(absl::IsResourceExhausted(s));
  EXPECT_EQ(s.message(), "words for people");
  EXPECT_EQ(RefusalOf(s), d);
  // A copy keeps it; the same code and message without it read as kNone.
  const absl::Status copy = s;
  EXPECT_EQ(RefusalOf(copy).reason, Refusal::kOwnerPageLimit);
  EXPECT_EQ(RefusalOf(absl::ResourceExhaustedError("words for people")).reason,
            Refusal::kNone);
  EXPECT_EQ(RefusalOf(absl::OkStatus()).reason, Refusal::kNone);
}

TEST(RefusalTest, MalformedPayloadsReadAsNone) {
  absl::Status s = absl::NotFoundError("x");
  s.SetPayload(kRefusalTypeUrl, absl::Cord("short"));
  EXPECT_EQ(RefusalOf(s).reason, Refusal::kNone);
  // The right size but a reason beyond the enum.
  std::string bytes(1 + 4 * sizeof(uint64_t), '\0');
  bytes[0] = static_cast<char>(static_cast<uint8_t>(kLastRefusal) + 1);
  s.SetPayload(kRefusalTypeUrl, absl::Cord(bytes));
  EXPECT_EQ(RefusalOf(s).reason, Refusal::kNone);
  bytes[0] = static_cast<char>(Refusal::kLeaseExpired);
  s.SetPayload(kRefusalTypeUrl, absl::Cord(bytes));
  EXPECT_EQ(RefusalOf(s).reason, Refusal::kLeaseExpired);
}

TEST(RefusalTest, EveryReasonHasItsOwnName) {
  std::vector<std::string> names;
  for (int r = 0; r <= static_cast<int>(kLastRefusal); ++r) {
    const std::string name = RefusalName(static_cast<Refusal>(r));
    EXPECT_NE(name, "unknown") << r;
    for (const std::string& other : names) EXPECT_NE(name, other) << r;
    names.push_back(name);
  }
  EXPECT_STREQ(RefusalName(static_cast<Refusal>(200)), "unknown");
}

class RadixRefusalTest : public testing::Test {
 protected:
  static constexpr uint32_t kCapacity = 16;

  RadixRefusalTest()
      : tree_owner_(
            RadixTree::Create({.capacity_pages = kCapacity, .accounts = 2})
                .value()),
        tree_(*tree_owner_) {
    ns_ = tree_.RegisterNamespace({.model = "m", .page_size = 2}, 1).value();
  }
  ~RadixRefusalTest() override {
    EXPECT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
  }

  absl::StatusOr<AcquireResult> Take(const Tokens& t, OwnerId owner,
                                     AcquireRequest extra = {}) {
    extra.ns = ns_;
    extra.tokens = t;
    extra.allocate = true;
    extra.owner = owner;
    return tree_.Acquire(extra);
  }

  std::unique_ptr<RadixTree> tree_owner_;
  RadixTree& tree_;
  NamespaceId ns_ = 0;
};

TEST_F(RadixRefusalTest, UnknownLease) {
  const LeaseId a = Take({1, 2}, kAlice).value().lease;
  for (const absl::Status& s :
       {tree_.Release(a, kBob), tree_.Release(a + 100, kAlice),
        tree_.Commit(a, 1, true, kBob).status()}) {
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    const RefusalDetail d = RefusalOf(s);
    EXPECT_EQ(d.reason, Refusal::kLeaseUnknown) << s;
    EXPECT_TRUE(d.lease == a || d.lease == a + 100) << d.lease;
  }
  EXPECT_TRUE(tree_.Release(a, kAlice).ok());
}

TEST_F(RadixRefusalTest, ExpiredLease) {
  const LeaseId a =
      Take({1, 2}, kAlice, {.expires = absl::Now()}).value().lease;
  const absl::Status s = tree_.Commit(a, 1, true, kAlice).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(RefusalOf(s),
            (RefusalDetail{.reason = Refusal::kLeaseExpired, .lease = a}));
  // Ended by that refusal: now it is unknown.
  EXPECT_EQ(RefusalOf(tree_.Release(a, kAlice)).reason, Refusal::kLeaseUnknown);
}

TEST_F(RadixRefusalTest, EndLeaseUnknownNamesTheEntry) {
  const LeaseId a = Take({1, 2}, kAlice).value().lease;
  const LeaseId b = Take({3, 4}, kBob).value().lease;
  const LeaseId ends[] = {a, b};
  const absl::StatusOr<AcquireResult> r =
      Take({5, 6}, kAlice, {.end_leases = ends});
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_EQ(RefusalOf(r.status()),
            (RefusalDetail{
                .reason = Refusal::kEndLeaseUnknown, .index = 1, .lease = b}));
  EXPECT_EQ(tree_.owner_leases(kAlice), 1u);  // nothing changed
}

TEST_F(RadixRefusalTest, EndLeaseRepeatedNamesTheSecondEntry) {
  const LeaseId a = Take({1, 2}, kAlice).value().lease;
  const LeaseId c = Take({3, 4}, kAlice).value().lease;
  const LeaseId ends[] = {c, a, c};
  const absl::StatusOr<AcquireResult> r =
      Take({5, 6}, kAlice, {.end_leases = ends});
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_EQ(RefusalOf(r.status()),
            (RefusalDetail{
                .reason = Refusal::kEndLeaseRepeated, .index = 2, .lease = c}));
  EXPECT_EQ(tree_.owner_leases(kAlice), 2u);
}

TEST_F(RadixRefusalTest, OwnerLeaseLimit) {
  ASSERT_TRUE(Take({1, 2}, kAlice, {.max_owner_leases = 2}).ok());
  ASSERT_TRUE(Take({3, 4}, kAlice, {.max_owner_leases = 2}).ok());
  const absl::StatusOr<AcquireResult> r =
      Take({5, 6}, kAlice, {.max_owner_leases = 2});
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(RefusalOf(r.status()),
            (RefusalDetail{
                .reason = Refusal::kOwnerLeaseLimit, .held = 2, .limit = 2}));
}

TEST_F(RadixRefusalTest, OwnerPageLimit) {
  ASSERT_EQ(Take({1, 2, 3, 4, 5, 6}, kAlice, {.max_owner_pages = 3})
                .value()
                .new_blocks,
            3u);
  const absl::StatusOr<AcquireResult> r =
      Take({7, 8}, kAlice, {.max_owner_pages = 3});
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(RefusalOf(r.status()),
            (RefusalDetail{
                .reason = Refusal::kOwnerPageLimit, .held = 3, .limit = 3}));
}

TEST_F(RadixRefusalTest, AccountPinLimit) {
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.max_pinned_pages = 2}).ok());
  ASSERT_EQ(Take({1, 2, 3, 4}, kAlice).value().new_blocks, 2u);
  const absl::StatusOr<AcquireResult> r = Take({7, 8}, kBob);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(RefusalOf(r.status()),
            (RefusalDetail{
                .reason = Refusal::kAccountPinLimit, .held = 2, .limit = 2}));
}

TEST_F(RadixRefusalTest, CommitBeyondLease) {
  const LeaseId a = Take({1, 2, 3, 4}, kAlice).value().lease;
  const absl::Status s = tree_.Commit(a, 3, false, kAlice).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(RefusalOf(s), (RefusalDetail{.reason = Refusal::kCommitBeyondLease,
                                         .lease = a,
                                         .held = 3,
                                         .limit = 2}));
  EXPECT_TRUE(tree_.Commit(a, 2, true, kAlice).ok());
}

TEST_F(RadixRefusalTest, BadArgumentsAreNotTyped) {
  const absl::StatusOr<AcquireResult> r = tree_.Acquire(
      {.ns = ns_ + 7, .tokens = {1, 2}, .allocate = true, .owner = kAlice});
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_EQ(RefusalOf(r.status()).reason, Refusal::kNone);
}

}  // namespace
}  // namespace radixkv
