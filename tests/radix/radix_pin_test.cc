// Tests of RadixTree's prefix pins (radix/radix_tree.h, PinPrefix): pinned
// blocks survive eviction and Clear until Unpin, pins count against their
// account's max_pin_pages and weighted share (not max_pinned_pages), every
// refusal changes nothing, and a pin is invisible to owners' calls.
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "radix/radix_tree.h"
#include "radix/refusal.h"

namespace radixkv {
namespace {

using Tokens = std::vector<uint32_t>;

class RadixPinTest : public testing::Test {
 protected:
  static constexpr uint32_t kCapacity = 8;

  RadixPinTest()
      : tree_owner_(RadixTree::Create({.capacity_pages = kCapacity,
                                       .accounts = 3})
                        .value()),
        tree_(*tree_owner_) {
    a_ = tree_.RegisterNamespace({.model = "m", .cache_salt = "a",
                                  .page_size = 1}, 1).value();
    b_ = tree_.RegisterNamespace({.model = "m", .cache_salt = "b",
                                  .page_size = 1}, 2).value();
    // a's weighted share is 8 * 6 / (1 + 6 + 1) = 6 pages; tests of the
    // limits set their own.
    EXPECT_TRUE(tree_.SetAccountLimits(1, {.weight = 6}).ok());
  }
  ~RadixPinTest() override {
    EXPECT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
  }

  void Store(NamespaceId ns, const Tokens& t) {
    absl::StatusOr<AcquireResult> r =
        tree_.Acquire({.ns = ns, .tokens = t, .allocate = true});
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->lease != 0) {
      ASSERT_TRUE(tree_.Commit(r->lease, r->new_blocks, true).ok());
    }
  }
  uint32_t Cached(NamespaceId ns, const Tokens& t) {
    return tree_.Match(ns, {}, t).value().matched_blocks;
  }

  std::unique_ptr<RadixTree> tree_owner_;
  RadixTree& tree_;
  NamespaceId a_ = 0, b_ = 0;
};

TEST_F(RadixPinTest, APinnedPrefixSurvivesEvictionAndClearUntilUnpinned) {
  Store(a_, {1, 2, 3});
  absl::StatusOr<PinInfo> pin = tree_.PinPrefix(a_, {}, Tokens{1, 2, 3, 4});
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_EQ(pin->pinned_blocks, 3u);
  EXPECT_EQ(pin->total_blocks, 4u);
  EXPECT_EQ(pin->ns, a_);
  EXPECT_EQ(pin->account, 1u);
  EXPECT_EQ(tree_.GetStats().pins, 1u);
  EXPECT_EQ(tree_.GetStats().pin_pages, 3u);
  EXPECT_EQ(tree_.GetStats().pinned_pages, 3u);
  EXPECT_EQ(tree_.GetAccountStats(1).pin_pages, 3u);
  // Pins are not lease-held pages (max_pinned_pages).
  EXPECT_EQ(tree_.GetAccountStats(1).held_pages, 0u);

  EXPECT_EQ(tree_.Evict(kCapacity), 0u);
  Store(b_, {10, 11, 12, 13, 14, 15, 16, 17});  // only 5 pages are free
  EXPECT_EQ(Cached(a_, {1, 2, 3}), 3u);
  EXPECT_EQ(tree_.Clear(), 5u);
  EXPECT_EQ(Cached(a_, {1, 2, 3}), 3u);

  std::vector<PinInfo> pins = tree_.ListPins();
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(pins[0].id, pin->id);
  EXPECT_EQ(pins[0].pinned_blocks, 3u);

  ASSERT_TRUE(tree_.Unpin(pin->id).ok());
  EXPECT_EQ(tree_.GetStats().pins, 0u);
  EXPECT_EQ(tree_.GetStats().pinned_pages, 0u);
  EXPECT_EQ(tree_.Clear(), 3u);
  EXPECT_EQ(Cached(a_, {1, 2, 3}), 0u);
}

TEST_F(RadixPinTest, KeyModePinsAndOverlappingPinsCountEachTheirPages) {
  Store(a_, {1, 2});
  const BlockKey root = tree_.namespace_root(a_);
  const std::vector<BlockKey> keys = ComputeBlockKeys(root, 1, Tokens{1, 2});
  PinInfo p1 = tree_.PinPrefix(a_, keys, {}).value();
  PinInfo p2 = tree_.PinPrefix(a_, absl::MakeConstSpan(keys).first(1), {})
                   .value();
  EXPECT_EQ(p1.last_key, keys[1]);
  EXPECT_EQ(p2.last_key, keys[0]);
  EXPECT_EQ(tree_.GetAccountStats(1).pin_pages, 3u);
  EXPECT_EQ(tree_.Explain(a_, keys, {}).value()[0].refcount, 2u);
  ASSERT_TRUE(tree_.Unpin(p1.id).ok());
  // The first block stays pinned by the second pin.
  EXPECT_EQ(tree_.GetStats().pinned_pages, 1u);
  EXPECT_EQ(tree_.Clear(), 1u);
  ASSERT_TRUE(tree_.Unpin(p2.id).ok());
}

TEST_F(RadixPinTest, NothingCachedIsRefusedAndChangesNothing) {
  absl::StatusOr<PinInfo> pin = tree_.PinPrefix(a_, {}, Tokens{7, 8});
  ASSERT_FALSE(pin.ok());
  EXPECT_EQ(pin.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RefusalOf(pin.status()).reason, Refusal::kPinNothingCached);
  EXPECT_EQ(RefusalOf(pin.status()).limit, 2u);
  EXPECT_EQ(tree_.GetStats().pins, 0u);
  EXPECT_EQ(tree_.GetStats().leases, 0u);
}

TEST_F(RadixPinTest, AQuotaRefusesAPinThatWouldExceedItWholly) {
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.max_pin_pages = 2}).ok());
  EXPECT_EQ(tree_.PinLimit(1), 2u);
  Store(a_, {1, 2, 3});
  absl::StatusOr<PinInfo> pin = tree_.PinPrefix(a_, {}, Tokens{1, 2, 3});
  ASSERT_FALSE(pin.ok());
  EXPECT_EQ(pin.status().code(), absl::StatusCode::kResourceExhausted);
  const RefusalDetail d = RefusalOf(pin.status());
  EXPECT_EQ(d.reason, Refusal::kPinQuota);
  EXPECT_EQ(d.held, 3u);
  EXPECT_EQ(d.limit, 2u);
  EXPECT_EQ(tree_.GetStats().pinned_pages, 0u);
  EXPECT_EQ(tree_.GetAccountStats(1).pin_pages, 0u);
  // Within the quota it pins.
  ASSERT_TRUE(tree_.PinPrefix(a_, {}, Tokens{1, 2}).ok());
  EXPECT_EQ(tree_.PinPrefix(a_, {}, Tokens{1}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(RadixPinTest, PinsStayWithinTheAccountsWeightedShare) {
  // Three accounts of weight 1 over 8 pages: a share is 8 / 3 = 2 pages,
  // however large max_pin_pages is.
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.max_pin_pages = 100}).ok());
  EXPECT_EQ(tree_.PinLimit(1), 2u);
  Store(a_, {1, 2, 3});
  absl::StatusOr<PinInfo> pin = tree_.PinPrefix(a_, {}, Tokens{1, 2, 3});
  ASSERT_FALSE(pin.ok());
  const RefusalDetail d = RefusalOf(pin.status());
  EXPECT_EQ(d.reason, Refusal::kPinFairShare);
  EXPECT_EQ(d.held, 3u);
  EXPECT_EQ(d.limit, 2u);
  // A heavier weight is a larger share: 8 * 4 / 6 = 5.
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.weight = 4}).ok());
  EXPECT_EQ(tree_.PinLimit(1), 5u);
  EXPECT_TRUE(tree_.PinPrefix(a_, {}, Tokens{1, 2, 3}).ok());
}

TEST_F(RadixPinTest, APinsBlocksStillLeaveOtherAccountsTheirShare) {
  // a pins its share, then b fills the pool: b evicts only its own blocks
  // and a's unpinned ones, never below what the pin holds.
  ASSERT_TRUE(tree_.SetAccountLimits(1, {.weight = 2}).ok());  // share 4
  Store(a_, {1, 2, 3, 4, 5});
  ASSERT_TRUE(tree_.PinPrefix(a_, {}, Tokens{1, 2, 3, 4}).ok());
  Store(b_, {10, 11, 12, 13, 14, 15});
  EXPECT_EQ(Cached(a_, {1, 2, 3, 4}), 4u);
  EXPECT_EQ(Cached(a_, {1, 2, 3, 4, 5}), 4u);
  EXPECT_EQ(Cached(b_, {10, 11, 12, 13}), 4u);
  EXPECT_EQ(tree_.GetStats().cached_pages, kCapacity);
}

TEST_F(RadixPinTest, OwnersCannotSeeOrEndAPin) {
  Store(a_, {1, 2});
  PinInfo pin = tree_.PinPrefix(a_, {}, Tokens{1, 2}).value();
  EXPECT_EQ(tree_.Release(pin.id, kNoOwner).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tree_.Release(pin.id, kPinOwner).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(tree_.Commit(pin.id, 0, true, kPinOwner).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(tree_.Acquire({.ns = a_, .tokens = Tokens{1}, .owner = kPinOwner})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_.ReleaseExpired(absl::InfiniteFuture()), 0u);
  EXPECT_EQ(tree_.GetStats().pins, 1u);
  // A pinned namespace is not forgotten.
  EXPECT_TRUE(tree_.ForgetEmptyNamespaces({a_}).empty());
  absl::Status unknown = tree_.Unpin(pin.id + 1000);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(RefusalOf(unknown).reason, Refusal::kPinUnknown);
  ASSERT_TRUE(tree_.Unpin(pin.id).ok());
  EXPECT_EQ(tree_.Unpin(pin.id).code(), absl::StatusCode::kNotFound);
  PinInfo gone;
  EXPECT_FALSE(tree_.GetPin(pin.id, &gone));
}

TEST_F(RadixPinTest, AcquireOfAPinnedPrefixSharesItsPages) {
  Store(a_, {1, 2});
  PinInfo pin = tree_.PinPrefix(a_, {}, Tokens{1, 2}).value();
  AcquireResult r =
      tree_.Acquire({.ns = a_, .tokens = Tokens{1, 2, 3}, .allocate = true,
                     .owner = 7})
          .value();
  EXPECT_EQ(r.matched_blocks, 2u);
  ASSERT_TRUE(tree_.Commit(r.lease, r.new_blocks, true, 7).ok());
  ASSERT_TRUE(tree_.Unpin(pin.id).ok());
  EXPECT_EQ(Cached(a_, {1, 2, 3}), 3u);
}

}  // namespace
}  // namespace radixkv
