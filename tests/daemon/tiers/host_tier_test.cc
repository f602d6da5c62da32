// HostTier (daemon/tiers/host_tier.h) and TierChain
// (daemon/tiers/tier_chain.h) over a real host pool: slot states, LRU
// reuse with victims handed back, claims, replacement of a key, and the
// chain's moves between pool, host memory and a disk tier file, byte for
// byte.
#include "daemon/tiers/host_tier.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/tiers/disk_tier.h"
#include "daemon/tiers/tier_chain.h"
#include "gmock/gmock.h"
#include "gpu/pool.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

// The non-null tiers, top first, for a TierChain.
template <typename... T>
std::vector<std::unique_ptr<Tier>> Tiers(std::unique_ptr<T>... t) {
  std::vector<std::unique_ptr<Tier>> out;
  (..., (t != nullptr ? out.push_back(std::move(t)) : void()));
  return out;
}

using ::testing::HasSubstr;

constexpr uint64_t kPageBytes = 4096;

BlockKey Key(uint64_t i) { return BlockKey{0xb10c000000000000ull + i, ~i}; }

TierBlock Block(uint64_t i) {
  return TierBlock{.key = Key(i), .parent_key = Key(i + 1000),
                   .root = Key(5000), .block_size = 16};
}

std::unique_ptr<HostTier> MustOpen(uint64_t slots) {
  auto t = HostTier::Open(gpu::Backend::kHost, -1, slots * kPageBytes,
                          kPageBytes);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// Fills slot memory of reservations with `byte` and publishes them.
void Fill(HostTier* t, const std::vector<HostTier::Reservation>& res,
          unsigned char byte) {
  for (const auto& r : res) std::memset(r.dst, byte, kPageBytes);
  t->Publish(res, true);
}

bool Holds(const void* p, unsigned char byte) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (uint64_t i = 0; i < kPageBytes; ++i) {
    if (c[i] != byte) return false;
  }
  return true;
}

TEST(HostTierOpen, RefusesBadSizes) {
  auto none = HostTier::Open(gpu::Backend::kHost, -1, kPageBytes - 1, kPageBytes);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("--tier=host: bytes=4095 holds no page of 4096 bytes"));
  auto zero = HostTier::Open(gpu::Backend::kHost, -1, kPageBytes, 0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  auto nopool = HostTier::Open(gpu::Backend::kNone, -1, kPageBytes, kPageBytes);
  EXPECT_FALSE(nopool.ok());
}

TEST(HostTier, ReservedBlocksAreInvisibleUntilPublished) {
  auto t = MustOpen(4);
  std::vector<HostTier::Reservation> res;
  ASSERT_EQ(t->Reserve({Block(1), Block(2)}, &res), 2u);
  EXPECT_EQ(t->CountPresent({Key(1)}), 0u);
  TierBlock out;
  EXPECT_FALSE(t->Lookup(Key(1), &out));
  EXPECT_EQ(t->stats().pending, 2u);
  Fill(t.get(), res, 0x11);
  EXPECT_EQ(t->CountPresent({Key(1), Key(2), Key(3)}), 2u);
  ASSERT_TRUE(t->Lookup(Key(2), &out));
  EXPECT_EQ(out.parent_key, Key(1002));
  EXPECT_EQ(out.block_size, 16u);
  const HostTierStats s = t->stats();
  EXPECT_EQ(s.used, 2u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.demotions, 2u);
  EXPECT_FALSE(s.pinned);
}

TEST(HostTier, FailedCopiesFreeTheirSlots) {
  auto t = MustOpen(2);
  std::vector<HostTier::Reservation> res;
  ASSERT_EQ(t->Reserve({Block(1), Block(2)}, &res), 2u);
  t->Publish(res, false);
  EXPECT_EQ(t->CountPresent({Key(1)}), 0u);
  EXPECT_EQ(t->stats().dropped_error, 2u);
  res.clear();
  EXPECT_EQ(t->Reserve({Block(3), Block(4)}, &res), 2u);  // slots came back
  for (const auto& r : res) EXPECT_FALSE(r.has_victim);
}

TEST(HostTier, FullTierHandsBackItsOldestBlocksAsVictims) {
  auto t = MustOpen(3);
  for (uint64_t i = 1; i <= 3; ++i) {
    std::vector<HostTier::Reservation> res;
    ASSERT_EQ(t->Reserve({Block(i)}, &res), 1u);
    Fill(t.get(), res, static_cast<unsigned char>(i));
  }
  std::vector<HostTier::Reservation> res;
  ASSERT_EQ(t->Reserve({Block(4), Block(5)}, &res), 2u);
  ASSERT_TRUE(res[0].has_victim && res[1].has_victim);
  EXPECT_EQ(res[0].victim.key, Key(1));
  EXPECT_EQ(res[1].victim.key, Key(2));
  // The victims' bytes are still in place until Publish.
  EXPECT_TRUE(Holds(res[0].dst, 1));
  EXPECT_TRUE(Holds(res[1].dst, 2));
  EXPECT_EQ(t->CountPresent({Key(1)}), 0u);  // unindexed at once
  Fill(t.get(), res, 0x44);
  EXPECT_EQ(t->CountPresent({Key(3), Key(4), Key(5)}), 3u);
  EXPECT_EQ(t->stats().evictions, 2u);
}

TEST(HostTier, NoSlotIsReusedWhileFillingOrReading) {
  auto t = MustOpen(2);
  std::vector<HostTier::Reservation> first;
  ASSERT_EQ(t->Reserve({Block(1)}, &first), 1u);  // filling
  std::vector<HostTier::Reservation> second;
  ASSERT_EQ(t->Reserve({Block(2)}, &second), 1u);
  Fill(t.get(), second, 2);
  std::vector<uint32_t> slots;
  std::vector<const void*> src;
  ASSERT_EQ(t->Claim({Key(2)}, &slots, &src), 1u);  // reading
  std::vector<HostTier::Reservation> third;
  EXPECT_EQ(t->Reserve({Block(3)}, &third), 0u);
  EXPECT_EQ(t->stats().dropped_full, 1u);
  EXPECT_EQ(t->CountPresent({Key(2)}), 0u);  // a claimed block is not offered twice
  t->Finish(slots, /*consumed=*/false);
  EXPECT_EQ(t->CountPresent({Key(2)}), 1u);
  Fill(t.get(), first, 1);
}

TEST(HostTier, ClaimReadsConsecutiveBlocksAndFinishRemovesThem) {
  auto t = MustOpen(4);
  std::vector<HostTier::Reservation> res;
  ASSERT_EQ(t->Reserve({Block(1), Block(2), Block(4)}, &res), 3u);
  std::memset(res[0].dst, 1, kPageBytes);
  std::memset(res[1].dst, 2, kPageBytes);
  std::memset(res[2].dst, 4, kPageBytes);
  t->Publish(res, true);
  std::vector<uint32_t> slots;
  std::vector<const void*> src;
  ASSERT_EQ(t->Claim({Key(1), Key(2), Key(3), Key(4)}, &slots, &src), 2u);
  EXPECT_TRUE(Holds(src[0], 1));
  EXPECT_TRUE(Holds(src[1], 2));
  t->Finish(slots, /*consumed=*/true);
  EXPECT_EQ(t->CountPresent({Key(1)}), 0u);
  EXPECT_EQ(t->CountPresent({Key(4)}), 1u);
  const HostTierStats s = t->stats();
  EXPECT_EQ(s.promotions, 2u);
  EXPECT_EQ(s.used, 1u);
  EXPECT_EQ(s.bytes_read, 2 * kPageBytes);
}

TEST(HostTier, ForgetDropsStoredCopiesAndLeavesReadsAlone) {
  auto t = MustOpen(4);
  std::vector<HostTier::Reservation> res;
  ASSERT_EQ(t->Reserve({Block(1), Block(2), Block(3)}, &res), 3u);
  Fill(t.get(), res, 1);
  std::vector<uint32_t> slots;
  std::vector<const void*> src;
  ASSERT_EQ(t->Claim({Key(3)}, &slots, &src), 1u);  // being read
  std::vector<TierBlock> dropped;
  EXPECT_EQ(t->Forget({Key(1), Key(3), Key(7)}, &dropped), 1u);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].key, Key(1));
  EXPECT_EQ(t->CountPresent({Key(1)}), 0u);
  EXPECT_EQ(t->CountPresent({Key(2)}), 1u);
  t->Finish(slots, /*consumed=*/true);
  HostTierStats s = t->stats();
  EXPECT_EQ(s.superseded, 1u);
  EXPECT_EQ(s.promotions, 1u);
  EXPECT_EQ(s.used, 1u);
  // Block 1's slot is free: three more blocks fit without a victim.
  std::vector<HostTier::Reservation> more;
  ASSERT_EQ(t->Reserve({Block(4), Block(5), Block(6)}, &more), 3u);
  for (const HostTier::Reservation& r : more) EXPECT_FALSE(r.has_victim);
  Fill(t.get(), more, 4);
  EXPECT_EQ(t->stats().used, 4u);
}

TEST(HostTier, ANewCopyOfAKeyReplacesTheOldOneEvenWhileItIsRead) {
  auto t = MustOpen(3);
  std::vector<HostTier::Reservation> res;
  ASSERT_EQ(t->Reserve({Block(1)}, &res), 1u);
  Fill(t.get(), res, 1);
  std::vector<uint32_t> slots;
  std::vector<const void*> src;
  ASSERT_EQ(t->Claim({Key(1)}, &slots, &src), 1u);
  std::vector<HostTier::Reservation> again;
  ASSERT_EQ(t->Reserve({Block(1)}, &again), 1u);
  Fill(t.get(), again, 9);
  t->Finish(slots, /*consumed=*/true);  // the old copy's slot is just freed
  std::vector<uint32_t> slots2;
  std::vector<const void*> src2;
  ASSERT_EQ(t->Claim({Key(1)}, &slots2, &src2), 1u);
  EXPECT_TRUE(Holds(src2[0], 9));
  t->Finish(slots2, true);
  EXPECT_EQ(t->stats().used, 0u);
  // Every slot is free again: three reservations without victims.
  std::vector<HostTier::Reservation> all;
  ASSERT_EQ(t->Reserve({Block(5), Block(6), Block(7)}, &all), 3u);
  for (const auto& r : all) EXPECT_FALSE(r.has_victim);
}

// ---- TierChain over a host pool ---------------------------------------------

class TierChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu::PoolSpec spec;
    spec.backend = gpu::Backend::kHost;
    spec.bytes = 16 * kPageBytes;
    auto pool = gpu::CreatePagePool(spec, kPageBytes);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(base != nullptr && *base ? base : "/tmp",
                                    "/host_tier_test.XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    chain_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A chain of a host tier of `host` blocks (0: none) above a disk tier
  // of `disk` blocks (0: none).
  void MakeChain(uint64_t host, uint64_t disk) {
    std::unique_ptr<HostTier> h;
    std::unique_ptr<DiskTier> k;
    if (host != 0) h = MustOpen(host);
    if (disk != 0) {
      const uint64_t bytes = 4096 + 4096 + disk * kPageBytes;
      auto opened = DiskTier::Open({.path = dir_, .bytes = bytes,
                                    .page_bytes = kPageBytes,
                                    .wait_for_staging = true});
      ASSERT_TRUE(opened.ok()) << opened.status();
      k = *std::move(opened);
    }
    chain_ = std::make_unique<TierChain>(Tiers(std::move(h), std::move(k)));
    ASSERT_TRUE(chain_->AttachPool(pool_.get()).ok());
  }

  void FillPage(uint64_t page, unsigned char byte) {
    std::memset(pool_->host_page_address(page), byte, kPageBytes);
  }

  std::unique_ptr<gpu::PagePool> pool_;
  std::unique_ptr<TierChain> chain_;
  std::string dir_;
};

TEST_F(TierChainTest, AttachRefusesAPoolOfAnotherPageSize) {
  auto t = HostTier::Open(gpu::Backend::kHost, -1, 4 * 8192, 8192);
  ASSERT_TRUE(t.ok());
  TierChain chain(Tiers(*std::move(t)));
  absl::Status s = chain.AttachPool(pool_.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("pages of 8192 bytes"));
}

TEST_F(TierChainTest, LookupsInAnotherNamespaceFindNothing) {
  // A caller in key mode can name any key: the tiers answer only for
  // blocks of the caller's own namespace (root), in host memory and on disk.
  MakeChain(/*host=*/2, /*disk=*/8);
  std::vector<EvictedPage> evicted;
  for (uint64_t i = 0; i < 4; ++i) {
    FillPage(i, static_cast<unsigned char>(0x60 + i));
    evicted.push_back({.block = Block(i), .page = i, .ns = 1});
  }
  std::vector<TierMove> moves;
  chain_->Demote(evicted, &moves);
  const std::vector<BlockKey> keys = {Key(0), Key(1), Key(2), Key(3)};
  const BlockKey own = Block(0).root;
  const BlockKey other = Key(7777);
  EXPECT_EQ(chain_->CountPresent(keys, nullptr, &other), 0u);
  EXPECT_EQ(chain_->CountPresent(keys, nullptr, &own), 4u);
  std::vector<uint64_t> pages = {8, 9, 10, 11};
  for (uint64_t p : pages) FillPage(p, 0);
  moves.clear();
  EXPECT_EQ(chain_->Promote(keys, pages, &moves, &other), 0u);
  for (uint64_t p : pages) {
    EXPECT_EQ(static_cast<unsigned char*>(pool_->host_page_address(p))[0], 0);
  }
  EXPECT_TRUE(moves.empty());
  ASSERT_EQ(chain_->Promote(keys, pages, &moves, &own), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(static_cast<unsigned char*>(pool_->host_page_address(8 + i))[0],
              0x60 + i);
  }
}

TEST_F(TierChainTest, BlocksGoDownThroughHostMemoryToDiskAndComeBackIntact) {
  MakeChain(/*host=*/2, /*disk=*/8);
  // Five evictions, oldest first: the host tier keeps the newest two, the
  // older three go straight to the disk tier.
  std::vector<EvictedPage> evicted;
  for (uint64_t i = 0; i < 5; ++i) {
    FillPage(i, static_cast<unsigned char>(0x10 + i));
    evicted.push_back({.block = Block(i), .page = i, .ns = 1});
  }
  std::vector<TierMove> moves;
  chain_->Demote(evicted, &moves);
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(0), &where), kMediumDiskTier);
  EXPECT_EQ(chain_->Locate(Key(2), &where), kMediumDiskTier);
  EXPECT_EQ(chain_->Locate(Key(3), &where), kMediumHostTier);
  EXPECT_EQ(chain_->Locate(Key(4), &where), kMediumHostTier);
  int stored_disk = 0, stored_host = 0;
  for (const TierMove& m : moves) {
    ASSERT_TRUE(m.stored);
    (m.medium == kMediumDiskTier ? stored_disk : stored_host)++;
  }
  EXPECT_EQ(stored_disk, 3);
  EXPECT_EQ(stored_host, 2);

  // A sixth block pushes the host tier's oldest (3) down to the disk tier.
  FillPage(5, 0x15);
  moves.clear();
  chain_->Demote({{.block = Block(5), .page = 5}}, &moves);
  EXPECT_EQ(chain_->Locate(Key(3), &where), kMediumDiskTier);
  ASSERT_EQ(moves.size(), 3u);  // removed from host, stored on disk, stored in host
  EXPECT_FALSE(moves[0].stored);
  EXPECT_EQ(moves[0].medium, kMediumHostTier);
  EXPECT_EQ(moves[0].block.key, Key(3));
  EXPECT_TRUE(moves[1].stored);
  EXPECT_EQ(moves[1].medium, kMediumDiskTier);

  // The prefix 0..5 spans both tiers; all of it comes back, into other
  // pages, with the right bytes, and leaves the tiers.
  std::array<size_t, kMediumCount> by{};
  const std::vector<BlockKey> keys = {Key(0), Key(1), Key(2), Key(3), Key(4),
                                      Key(5), Key(6)};
  EXPECT_EQ(chain_->CountPresent(keys, &by), 6u);
  EXPECT_EQ(by[kMediumHostTier], 2u);
  EXPECT_EQ(by[kMediumDiskTier], 4u);
  for (uint64_t p = 8; p < 15; ++p) FillPage(p, 0);
  moves.clear();
  const std::vector<uint64_t> pages = {8, 9, 10, 11, 12, 13, 14};
  ASSERT_EQ(chain_->Promote(keys, pages, &moves), 6u);
  for (uint64_t i = 0; i < 6; ++i) {
    EXPECT_TRUE(Holds(pool_->host_page_address(8 + i),
                      static_cast<unsigned char>(0x10 + i)))
        << "block " << i;
  }
  EXPECT_EQ(moves.size(), 6u);
  EXPECT_EQ(chain_->CountPresent(keys), 0u);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().promotions, 2u);
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().promotions, 4u);
  EXPECT_EQ(chain_->copy_errors(), 0u);
}

// The chain knows no tier kind: with three tiers, what tier i does not
// keep goes to tier i + 1, and promotion takes each run of blocks from the
// tier that holds it.
TEST_F(TierChainTest, OverflowFromEachTierGoesToTheNextOne) {
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(MustOpen(2));
  tiers.push_back(MustOpen(2));
  auto disk = DiskTier::Open({.path = dir_,
                              .bytes = 4096 + 4096 + 8 * kPageBytes,
                              .page_bytes = kPageBytes,
                              .wait_for_staging = true});
  ASSERT_TRUE(disk.ok()) << disk.status();
  tiers.push_back(*std::move(disk));
  chain_ = std::make_unique<TierChain>(std::move(tiers));
  ASSERT_TRUE(chain_->AttachPool(pool_.get()).ok());
  // Six evictions, oldest first: the newest two stay in the first tier,
  // the two before them in the second, the oldest two reach the third.
  std::vector<EvictedPage> evicted;
  for (uint64_t i = 0; i < 6; ++i) {
    FillPage(i, static_cast<unsigned char>(0x20 + i));
    evicted.push_back({.block = Block(i), .page = i, .ns = 1});
  }
  std::vector<TierMove> moves;
  chain_->Demote(evicted, &moves);
  EXPECT_EQ(moves.size(), 6u);
  EXPECT_EQ(chain_->tier(0).CountPresent({Key(4), Key(5)}), 2u);
  EXPECT_EQ(chain_->tier(1).CountPresent({Key(2), Key(3)}), 2u);
  EXPECT_EQ(chain_->tier(2).CountPresent({Key(0), Key(1)}), 2u);

  // A seventh block pushes the first tier's oldest (4) into the second,
  // whose oldest (2) goes on to the third.
  FillPage(6, 0x26);
  moves.clear();
  chain_->Demote({{.block = Block(6), .page = 6}}, &moves);
  EXPECT_EQ(chain_->tier(0).CountPresent({Key(5), Key(6)}), 2u);
  EXPECT_EQ(chain_->tier(1).CountPresent({Key(3), Key(4)}), 2u);
  EXPECT_EQ(chain_->tier(2).CountPresent({Key(0), Key(1), Key(2)}), 3u);

  const std::vector<BlockKey> keys = {Key(0), Key(1), Key(2), Key(3),
                                      Key(4), Key(5), Key(6)};
  const std::vector<uint64_t> pages = {8, 9, 10, 11, 12, 13, 14};
  for (uint64_t p : pages) FillPage(p, 0);
  moves.clear();
  ASSERT_EQ(chain_->Promote(keys, pages, &moves), 7u);
  for (uint64_t i = 0; i < 7; ++i) {
    EXPECT_TRUE(Holds(pool_->host_page_address(8 + i),
                      static_cast<unsigned char>(0x20 + i)))
        << "block " << i;
  }
  EXPECT_EQ(moves.size(), 7u);
  EXPECT_EQ(chain_->CountPresent(keys), 0u);
  EXPECT_EQ(chain_->tier(0).stats().promotions, 2u);
  EXPECT_EQ(chain_->tier(1).stats().promotions, 2u);
  EXPECT_EQ(chain_->tier(2).stats().promotions, 3u);
}

// Default (asynchronous) demotion: a block whose write to the disk tier is
// still in flight is present, in put order, even when more blocks are in
// flight than the tier has slots. Match (CountPresent) counts it and
// Acquire (Promote) serves it from its staging buffer with its own bytes.
TEST_F(TierChainTest, BlocksWhoseDiskWriteIsInFlightAreHits) {
  auto disk = DiskTier::Open({.path = dir_,
                              .bytes = 4096 + 4096 + 4 * kPageBytes,
                              .page_bytes = kPageBytes});
  ASSERT_TRUE(disk.ok()) << disk.status();
  DiskTier* tier = disk->get();
  ASSERT_EQ(tier->capacity_blocks(), 4u);
  chain_ = std::make_unique<TierChain>(Tiers(*std::move(disk)));
  ASSERT_TRUE(chain_->AttachPool(pool_.get()).ok());
  tier->SetWritesPausedForTesting(true);  // every write stays in flight
  std::vector<EvictedPage> evicted;
  for (uint64_t i = 0; i < 6; ++i) {
    FillPage(i, static_cast<unsigned char>(0x40 + i));
    evicted.push_back({.block = Block(i), .page = i, .ns = 1});
  }
  std::vector<TierMove> moves;
  chain_->Demote(evicted, &moves);
  // The pages are reused at once: the tier's copies are all that is left.
  for (uint64_t i = 0; i < 6; ++i) FillPage(i, 0xee);
  EXPECT_EQ(tier->stats().pending, 4u);
  EXPECT_EQ(tier->stats().dropped_full, 0u);
  // An LRU of 4 by put order: 0 and 1 left for 4 and 5.
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(0), &where), kMediumPool);
  EXPECT_EQ(chain_->Locate(Key(1), &where), kMediumPool);
  const std::vector<BlockKey> keys = {Key(2), Key(3), Key(4), Key(5)};
  std::array<size_t, kMediumCount> by{};
  EXPECT_EQ(chain_->CountPresent(keys, &by), 4u);  // Match: tier hits
  EXPECT_EQ(by[kMediumDiskTier], 4u);
  const std::vector<uint64_t> pages = {8, 9, 10, 11};
  for (uint64_t p : pages) FillPage(p, 0);
  moves.clear();
  ASSERT_EQ(chain_->Promote(keys, pages, &moves), 4u);  // Acquire: promoted
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(Holds(pool_->host_page_address(8 + i),
                      static_cast<unsigned char>(0x42 + i)))
        << "block " << i + 2;
  }
  EXPECT_EQ(chain_->CountPresent(keys), 0u);
  // The taken blocks' writes are void: nothing is left to write.
  EXPECT_EQ(tier->stats().pending, 0u);
  tier->SetWritesPausedForTesting(false);
  tier->Flush();
  EXPECT_EQ(tier->stats().used, 0u);
  EXPECT_EQ(tier->stats().bytes_written, 0u);
}

// A block whose copy into a tier is still running (Demote held in flight
// through its test hook) is not a miss: a concurrent Match/Acquire
// (CountPresent, then Promote) waits for that copy and then hits, with
// the block's own bytes.
TEST_F(TierChainTest, ABlockWhoseCopyIntoATierRunsIsWaitedForNotMissed) {
  MakeChain(/*host=*/4, /*disk=*/0);
  absl::Notification entered, release;
  chain_->SetDemoteHookForTesting([&] {
    entered.Notify();
    release.WaitForNotification();
  });
  for (uint64_t i = 0; i < 2; ++i) FillPage(i, static_cast<unsigned char>(0x60 + i));
  std::thread demoter([&] {
    std::vector<TierMove> moves;
    chain_->Demote({{.block = Block(0), .page = 0, .ns = 1},
                    {.block = Block(1), .page = 1, .ns = 1}},
                   &moves);
  });
  entered.WaitForNotification();
  const std::vector<BlockKey> keys = {Key(0), Key(1)};
  std::atomic<size_t> counted{kNoTierSlot};
  std::thread matcher([&] { counted = chain_->CountPresent(keys); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(counted.load(), kNoTierSlot) << "answered while the copy ran";
  release.Notify();
  demoter.join();
  matcher.join();
  EXPECT_EQ(counted.load(), 2u);
  chain_->SetDemoteHookForTesting(nullptr);
  const std::vector<uint64_t> pages = {8, 9};
  for (uint64_t p : pages) FillPage(p, 0);
  std::vector<TierMove> moves;
  ASSERT_EQ(chain_->Promote(keys, pages, &moves), 2u);
  EXPECT_TRUE(Holds(pool_->host_page_address(8), 0x60));
  EXPECT_TRUE(Holds(pool_->host_page_address(9), 0x61));
}

// A graceful stop writes the pool's blocks, then the host tier's, down to
// the durable tier, hottest first; a restart finds them all, the hottest
// the most recent, with their bytes.
TEST_F(TierChainTest, DrainWritesThePoolThenTheHostTierDownHottestFirst) {
  MakeChain(/*host=*/2, /*disk=*/8);
  // The host tier holds 0 and 1 (1 the newer).
  std::vector<TierMove> moves;
  for (uint64_t i = 0; i < 2; ++i) {
    FillPage(i, static_cast<unsigned char>(0x20 + i));
    chain_->Demote({{.block = Block(i), .page = i}}, &moves);
  }
  // The pool caches 2, 3, 4; 4 is the hottest.
  std::vector<EvictedPage> pool;
  for (uint64_t i = 4; i >= 2; --i) {
    FillPage(i, static_cast<unsigned char>(0x20 + i));
    pool.push_back({.block = Block(i), .page = i, .ns = 1});
  }
  const TierChain::DrainResult r =
      chain_->Drain(pool, absl::InfiniteFuture());
  EXPECT_EQ(r.drained, 5u);
  EXPECT_EQ(r.left, 0u);
  // The host tier lent its blocks; they are still there, not promoted.
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().used, 2u);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().promotions, 0u);

  // Restart: the disk tier alone, reloaded from its file.
  chain_.reset();
  MakeChain(/*host=*/0, /*disk=*/8);
  Tier& disk = *chain_->Find(TierKind::kDisk);
  EXPECT_EQ(disk.stats().reloaded, 5u);
  // Four more blocks fill it past its 8: the one that leaves is the
  // coldest drained, the host tier's older block 0.
  for (uint64_t i = 10; i < 14; ++i) {
    FillPage(i - 10, static_cast<unsigned char>(i));
    chain_->Demote({{.block = Block(i), .page = i - 10}}, &moves);
  }
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(0), &where), 0);
  for (uint64_t i = 1; i <= 4; ++i) {
    EXPECT_EQ(chain_->Locate(Key(i), &where), kMediumDiskTier) << i;
  }
  const std::vector<BlockKey> keys = {Key(4), Key(3), Key(2), Key(1)};
  const std::vector<uint64_t> pages = {8, 9, 10, 11};
  ASSERT_EQ(chain_->Promote(keys, pages, &moves), 4u);
  EXPECT_TRUE(Holds(pool_->host_page_address(8), 0x24));
  EXPECT_TRUE(Holds(pool_->host_page_address(9), 0x23));
  EXPECT_TRUE(Holds(pool_->host_page_address(10), 0x22));
  EXPECT_TRUE(Holds(pool_->host_page_address(11), 0x21));
}

// Without a tier that outlives the process, a drain keeps nothing and
// says so.
TEST_F(TierChainTest, DrainWithoutADurableTierLeavesEverything) {
  MakeChain(/*host=*/4, /*disk=*/0);
  std::vector<TierMove> moves;
  FillPage(0, 0x30);
  chain_->Demote({{.block = Block(0), .page = 0}}, &moves);
  const std::vector<EvictedPage> pool = {{.block = Block(1), .page = 1}};
  const TierChain::DrainResult r =
      chain_->Drain(pool, absl::InfiniteFuture());
  EXPECT_EQ(r.drained, 0u);
  EXPECT_EQ(r.left, 2u);
}

TEST_F(TierChainTest, AHostTierAloneDropsWhatItCannotHold) {
  MakeChain(/*host=*/2, /*disk=*/0);
  std::vector<EvictedPage> evicted;
  for (uint64_t i = 0; i < 3; ++i) {
    FillPage(i, static_cast<unsigned char>(i + 1));
    evicted.push_back({.block = Block(i), .page = i});
  }
  std::vector<TierMove> moves;
  chain_->Demote(evicted, &moves);
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(0), &where), 0);  // the oldest is dropped
  EXPECT_EQ(chain_->Locate(Key(2), &where), kMediumHostTier);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().dropped_full, 1u);
  // A further eviction forgets the host tier's oldest block.
  FillPage(3, 4);
  moves.clear();
  chain_->Demote({{.block = Block(3), .page = 3}}, &moves);
  EXPECT_EQ(chain_->Locate(Key(1), &where), 0);
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_FALSE(moves[0].stored);
  EXPECT_EQ(moves[0].block.key, Key(1));
}

TEST_F(TierChainTest, ABadPageIsACopyErrorAndDropsOnlyThatBatch) {
  MakeChain(/*host=*/4, /*disk=*/0);
  std::vector<TierMove> moves;
  chain_->Demote({{.block = Block(1), .page = 99}}, &moves);  // no page 99
  EXPECT_EQ(chain_->copy_errors(), 1u);
  EXPECT_TRUE(moves.empty());
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(1), &where), 0);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().dropped_error, 1u);
  FillPage(2, 7);
  chain_->Demote({{.block = Block(2), .page = 2}}, &moves);
  EXPECT_EQ(chain_->Locate(Key(2), &where), kMediumHostTier);
}

// Two threads, each with its own pages and keys, move blocks down and up;
// every promoted page must hold its block's byte. `disk`: a disk tier below
// (0: host memory alone, whose locks ThreadSanitizer can follow).
void RunConcurrentMoves(TierChain* chain, gpu::PagePool* pool, bool disk) {
  std::atomic<int> promoted{0};
  std::atomic<int> bad{0};
  auto run = [&](uint64_t base) {
    for (int round = 0; round < 200; ++round) {
      std::vector<EvictedPage> evicted;
      for (uint64_t i = 0; i < 3; ++i) {
        const uint64_t page = base + i;
        const uint64_t key = base * 1000 + round * 3 + i;
        std::memset(pool->host_page_address(page),
                    static_cast<int>(key & 0xff), kPageBytes);
        evicted.push_back({.block = Block(key), .page = page});
      }
      std::vector<TierMove> moves;
      chain->Demote(evicted, &moves);
      std::vector<BlockKey> keys;
      for (const auto& e : evicted) keys.push_back(e.block.key);
      const std::vector<uint64_t> pages = {base + 3, base + 4, base + 5};
      const size_t n = chain->Promote(keys, pages, &moves);
      promoted.fetch_add(static_cast<int>(n));
      for (size_t i = 0; i < n; ++i) {
        const uint64_t key = base * 1000 + round * 3 + i;
        if (!Holds(pool->host_page_address(base + 3 + i),
                   static_cast<unsigned char>(key & 0xff))) {
          bad.fetch_add(1);
        }
      }
    }
  };
  std::thread a(run, 0);
  std::thread b(run, 8);
  a.join();
  b.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(chain->copy_errors(), 0u);
  if (disk) {
    EXPECT_GT(promoted.load(), 600);  // most of the 1,200 blocks came back
    EXPECT_GT(chain->Find(TierKind::kDisk)->stats().promotions, 0u);
  } else {
    EXPECT_GT(chain->Find(TierKind::kHost)->stats().promotions, 0u);
  }
}

TEST_F(TierChainTest, ConcurrentDemotionsAndPromotionsServeOnlyRightBytes) {
  MakeChain(/*host=*/2, /*disk=*/6);  // each batch of 3 spans both tiers
  RunConcurrentMoves(chain_.get(), pool_.get(), /*disk=*/true);
}

TEST_F(TierChainTest, ConcurrentMovesThroughHostMemoryServeOnlyRightBytes) {
  MakeChain(/*host=*/4, /*disk=*/0);
  RunConcurrentMoves(chain_.get(), pool_.get(), /*disk=*/false);
}

}  // namespace
}  // namespace radixkv::daemon
