// Tests of the table from the tree's typed refusals to wire errors
// (daemon/core/refusal_errors.h): one row per refusal, the field, reason, code
// and exact message of each, and statuses without a refusal left as they
// are. Refusals come from a real RadixTree where the tree can produce them.
#include "daemon/core/refusal_errors.h"

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "radix/radix_tree.h"
#include "radix/refusal.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

constexpr OwnerId kAlice = 11;
constexpr OwnerId kBob = 22;
const RefusalContext kContext{.lease_ttl = absl::Seconds(30), .tenant = "beta"};

TEST(RefusalRulesTest, OneRowPerRefusalInEnumOrder) {
  const absl::Span<const RefusalRule> rules = RefusalRules();
  ASSERT_EQ(rules.size(), static_cast<size_t>(kLastRefusal));
  std::set<Refusal> seen;
  for (size_t i = 0; i < rules.size(); ++i) {
    SCOPED_TRACE(RefusalName(rules[i].refusal));
    EXPECT_EQ(static_cast<size_t>(rules[i].refusal), i + 1);
    EXPECT_TRUE(seen.insert(rules[i].refusal).second);
    EXPECT_FALSE(rules[i].field.empty());
    EXPECT_NE(rules[i].reason, v1::ERROR_REASON_UNSPECIFIED);
    ASSERT_NE(rules[i].word, nullptr);
    EXPECT_EQ(RefusalRuleFor(rules[i].refusal), &rules[i]);
    // Every message starts with the field it is about.
    const std::string m =
        rules[i].word(rules[i].field, {.reason = rules[i].refusal}, kContext);
    EXPECT_EQ(m.rfind(std::string(rules[i].field), 0), 0u) << m;
  }
  EXPECT_EQ(RefusalRuleFor(Refusal::kNone), nullptr);
  EXPECT_EQ(RefusalRuleFor(static_cast<Refusal>(200)), nullptr);
}

TEST(RefusalRulesTest, StatusesWithoutARefusalPassUnchanged) {
  const absl::Status untyped = absl::NotFoundError("unknown lease 5");
  EXPECT_EQ(RefusalToFieldError(untyped, kContext), untyped);
  EXPECT_EQ(ErrorFieldOf(RefusalToFieldError(untyped, kContext)), "");
  EXPECT_TRUE(RefusalToFieldError(absl::OkStatus(), kContext).ok());
  const absl::Status bad = absl::InvalidArgumentError("unknown namespace id 9");
  EXPECT_EQ(RefusalToFieldError(bad, kContext), bad);
}

// The wire error `s` maps to, checked for code, field and reason.
absl::Status Mapped(const absl::Status& s, absl::StatusCode code,
                    absl::string_view field, v1::ErrorReason reason) {
  const absl::Status w = RefusalToFieldError(s, kContext);
  EXPECT_EQ(w.code(), code) << w;
  EXPECT_EQ(ErrorFieldOf(w), field) << w;
  EXPECT_EQ(ErrorReasonOf(w), reason) << w;
  return w;
}

// The message of each row, exactly, for numbers a test chose.
TEST(RefusalRulesTest, LimitMessagesNameTheFlagAndTheNumbers) {
  using C = absl::StatusCode;
  EXPECT_EQ(
      Mapped(
          Refuse(C::kResourceExhausted,
                 {.reason = Refusal::kOwnerLeaseLimit, .held = 2, .limit = 2},
                 "tree words"),
          C::kResourceExhausted, "leases", v1::ERROR_REASON_LIMIT)
          .message(),
      "leases: the session holds the most leases "
      "--max_leases_per_session=2 allows; commit or release some");
  EXPECT_EQ(
      Mapped(Refuse(C::kResourceExhausted,
                    {.reason = Refusal::kOwnerPageLimit, .held = 4, .limit = 4},
                    "tree words"),
             C::kResourceExhausted, "leases", v1::ERROR_REASON_LIMIT)
          .message(),
      "leases: the session's leases hold the most pages "
      "--max_pinned_pages_per_session=4 allows (fenced pages of "
      "expired leases included); commit or release some");
  EXPECT_EQ(
      Mapped(
          Refuse(C::kResourceExhausted,
                 {.reason = Refusal::kAccountPinLimit, .held = 3, .limit = 2},
                 "tree words"),
          C::kResourceExhausted, "leases", v1::ERROR_REASON_LIMIT)
          .message(),
      "leases: tenant beta: its leases hold 3 pages, its limit is 2 "
      "(max_pinned_pages); commit or release some (--tenants)");
  EXPECT_EQ(
      Mapped(
          Refuse(C::kInvalidArgument,
                 {.reason = Refusal::kEndLeaseRepeated, .index = 1, .lease = 5},
                 "tree words"),
          C::kInvalidArgument, "release_leases", v1::ERROR_REASON_INVALID)
          .message(),
      "release_leases: lease 5 is listed twice");
}

class TreeRefusalsTest : public testing::Test {
 protected:
  TreeRefusalsTest()
      : tree_(
            RadixTree::Create({.capacity_pages = 16, .accounts = 2}).value()) {
    ns_ = tree_->RegisterNamespace({.model = "m", .page_size = 2}, 1).value();
  }
  absl::StatusOr<AcquireResult> Take(std::vector<uint32_t> t, OwnerId owner,
                                     AcquireRequest extra = {}) {
    extra.ns = ns_;
    extra.tokens = t;
    extra.allocate = true;
    extra.owner = owner;
    return tree_->Acquire(extra);
  }
  std::unique_ptr<RadixTree> tree_;
  NamespaceId ns_ = 0;
};

// Where the wire text once was the tree's text with the field added, it
// still is, word for word.
TEST_F(TreeRefusalsTest, LeaseRefusalsKeepTheTreesWordingWithTheField) {
  using C = absl::StatusCode;
  const std::string ttl = "; leases expire after --lease_ttl=30s";
  const LeaseId a = Take({1, 2, 3, 4}, kAlice).value().lease;
  const absl::Status unknown = tree_->Release(a, kBob);
  ASSERT_EQ(RefusalOf(unknown).reason, Refusal::kLeaseUnknown) << unknown;
  EXPECT_EQ(Mapped(unknown, C::kNotFound, "lease_id",
                   v1::ERROR_REASON_LEASE_NOT_FOUND)
                .message(),
            absl::StrCat("lease_id: ", unknown.message(), ttl));

  const absl::Status beyond = tree_->Commit(a, 3, false, kAlice).status();
  ASSERT_EQ(RefusalOf(beyond).reason, Refusal::kCommitBeyondLease) << beyond;
  EXPECT_EQ(
      Mapped(beyond, C::kFailedPrecondition, "blocks", v1::ERROR_REASON_INVALID)
          .message(),
      absl::StrCat("blocks: ", beyond.message()));

  const LeaseId late =
      Take({5, 6}, kAlice, {.expires = absl::Now()}).value().lease;
  const absl::Status expired = tree_->Release(late, kAlice);
  ASSERT_EQ(RefusalOf(expired).reason, Refusal::kLeaseExpired) << expired;
  EXPECT_EQ(Mapped(expired, C::kNotFound, "lease_id",
                   v1::ERROR_REASON_LEASE_NOT_FOUND)
                .message(),
            absl::StrCat("lease_id: ", expired.message(), ttl));

  const LeaseId b = Take({7, 8}, kBob).value().lease;
  const LeaseId ends[] = {a, b};
  const absl::Status foreign =
      Take({9, 10}, kAlice, {.end_leases = ends}).status();
  ASSERT_EQ(RefusalOf(foreign).reason, Refusal::kEndLeaseUnknown) << foreign;
  // The tree names its own parameter; the wire names the request's field.
  EXPECT_EQ(Mapped(foreign, C::kNotFound, "release_leases",
                   v1::ERROR_REASON_LEASE_NOT_FOUND)
                .message(),
            absl::StrReplaceAll(foreign.message(),
                                {{"end_leases[", "release_leases["}}));
  EXPECT_EQ(Mapped(foreign, C::kNotFound, "release_leases",
                   v1::ERROR_REASON_LEASE_NOT_FOUND)
                .message()
                .rfind("release_leases[1]: lease ", 0),
            0u);
}

TEST_F(TreeRefusalsTest, LimitRefusalsFromTheTree) {
  using C = absl::StatusCode;
  ASSERT_TRUE(Take({1, 2}, kAlice, {.max_owner_leases = 1}).ok());
  const absl::Status leases =
      Take({3, 4}, kAlice, {.max_owner_leases = 1}).status();
  EXPECT_NE(
      Mapped(leases, C::kResourceExhausted, "leases", v1::ERROR_REASON_LIMIT)
          .message()
          .find("--max_leases_per_session=1 allows"),
      std::string::npos);
  ASSERT_TRUE(tree_->SetAccountLimits(1, {.max_pinned_pages = 1}).ok());
  const absl::Status pins = Take({5, 6}, kBob).status();
  EXPECT_EQ(
      Mapped(pins, C::kResourceExhausted, "leases", v1::ERROR_REASON_LIMIT)
          .message(),
      "leases: tenant beta: its leases hold 1 pages, its limit is 1 "
      "(max_pinned_pages); commit or release some (--tenants)");
}

}  // namespace
}  // namespace radixkv::daemon
