// DiskTier (daemon/tiers/disk_tier.h): round trips, LRU reuse, pending blocks,
// reload after a restart, corruption and torn writes, bad options, and
// write errors at run time. Files live in fresh directories under $TMPDIR
// (or /tmp).
#include "daemon/tiers/disk_tier.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/tiers/disk_tier_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(base != nullptr && *base ? base : "/tmp",
                                    "/disk_tier_test.XXXXXX");
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file() const { return path_ + "/radixkv-tier.dat"; }

 private:
  std::string path_;
};

BlockKey Key(uint64_t i) { return BlockKey{0x5eed000000000000ull + i, ~i}; }

TierBlock Block(uint64_t i) {
  return TierBlock{Key(i), i == 0 ? Key(1000) : Key(i - 1), Key(1000),
                   static_cast<uint32_t>(i)};
}

// The bytes of block `i` (and of `version` of it): a pattern that depends
// only on both.
std::vector<char> Page(uint64_t i, size_t page_bytes, uint64_t version = 0) {
  std::vector<char> page(page_bytes);
  std::mt19937_64 rng(i * 7919 + version * 104729 + 1);
  for (size_t j = 0; j < page_bytes; ++j) page[j] = static_cast<char>(rng());
  return page;
}

// kAlign-aligned destination pages (offset by `misalign` bytes).
class Pages {
 public:
  Pages(size_t count, size_t page_bytes, size_t misalign = 0)
      : page_bytes_(page_bytes), stride_((page_bytes + misalign + 4095) / 4096 * 4096),
        buffer_(disk_tier::AllocateAligned(count * stride_)) {
    for (size_t i = 0; i < count; ++i) {
      ptrs_.push_back(buffer_.get() + i * stride_ + misalign);
    }
  }
  absl::Span<void* const> ptrs() const { return ptrs_; }
  std::vector<char> at(size_t i) const {
    const char* p = static_cast<const char*>(ptrs_[i]);
    return std::vector<char>(p, p + page_bytes_);
  }

 private:
  size_t page_bytes_;
  size_t stride_;
  disk_tier::AlignedBuffer buffer_;
  std::vector<void*> ptrs_;
};

std::vector<BlockKey> Keys(uint64_t first, uint64_t count) {
  std::vector<BlockKey> keys;
  for (uint64_t i = first; i < first + count; ++i) keys.push_back(Key(i));
  return keys;
}

DiskTierOptions Options(const TempDir& dir, uint64_t page_bytes = 8192,
                        uint64_t slots = 16) {
  DiskTierOptions o;
  o.path = dir.path();
  o.page_bytes = page_bytes;
  o.bytes = disk_tier::kSuperblockBytes + 4096 * ((slots * 128 + 4095) / 4096) +
            slots * ((page_bytes + 4095) / 4096 * 4096);
  return o;
}

std::unique_ptr<DiskTier> MustOpen(const DiskTierOptions& o) {
  absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? std::move(*tier) : nullptr;
}

void PutRange(DiskTier& tier, uint64_t first, uint64_t count, size_t page_bytes) {
  for (uint64_t i = first; i < first + count; ++i) {
    ASSERT_TRUE(tier.Put(Block(i), Page(i, page_bytes).data())) << i;
  }
}

// The slot whose header names `key` (-1 if none), read from the file.
int64_t FindSlot(const std::string& file, const disk_tier::Layout& l,
                 const BlockKey& key) {
  int fd = open(file.c_str(), O_RDONLY);
  int64_t found = -1;
  for (uint64_t s = 0; s < l.slots && found < 0; ++s) {
    char h[disk_tier::kSlotHeaderBytes];
    disk_tier::SlotHeader header;
    if (disk_tier::PreadFull(fd, h, sizeof(h), l.HeaderOffset(s)) == 0 &&
        disk_tier::DecodeSlotHeader(h, &header) && header.key == key) {
      found = static_cast<int64_t>(s);
    }
  }
  close(fd);
  return found;
}

void WriteAt(const std::string& file, uint64_t offset, const void* data,
             size_t n) {
  int fd = open(file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(disk_tier::PwriteFull(fd, data, n, offset), 0);
  close(fd);
}

std::vector<char> ReadAt(const std::string& file, uint64_t offset, size_t n) {
  std::vector<char> out(n);
  int fd = open(file.c_str(), O_RDONLY);
  EXPECT_EQ(disk_tier::PreadFull(fd, out.data(), n, offset), 0);
  close(fd);
  return out;
}

TEST(DiskTierLayout, SlotsFitTheBudget) {
  for (uint64_t page : {1ull, 4096ull, 5000ull, 262144ull}) {
    for (uint64_t bytes : {20000ull, 1ull << 20, (1ull << 30) + 12345}) {
      disk_tier::Layout l = disk_tier::ComputeLayout(bytes, page);
      EXPECT_LE(l.file_bytes, bytes);
      EXPECT_EQ(l.data_offset % 4096, 0u);
      EXPECT_EQ(l.stride % 4096, 0u);
      EXPECT_GE(l.data_offset, disk_tier::kSuperblockBytes + l.slots * 128);
      if (l.slots > 0) {  // one more slot would not fit
        EXPECT_GT(disk_tier::kSuperblockBytes +
                      (((l.slots + 1) * 128 + 4095) / 4096 * 4096) +
                      (l.slots + 1) * l.stride,
                  bytes);
      }
    }
  }
  EXPECT_EQ(disk_tier::ComputeLayout(disk_tier::MinBytesForOneSlot(8192), 8192).slots, 1u);
  EXPECT_EQ(disk_tier::ComputeLayout(disk_tier::MinBytesForOneSlot(8192) - 1, 8192).slots, 0u);
}

TEST(DiskTier, PutTakeRoundTrip) {
  TempDir dir;
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->capacity_blocks(), 16u);
  PutRange(*tier, 0, 8, 8192);
  tier->Flush();
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.used, 8u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.demotions, 8u);
  EXPECT_EQ(s.bytes_written, 8u * 8192);
  Pages dst(8, 8192);
  std::vector<BlockKey> keys = Keys(0, 8);
  ASSERT_EQ(tier->Take(keys, dst.ptrs()), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(dst.at(i), Page(i, 8192)) << i;
  s = tier->stats();
  EXPECT_EQ(s.promotions, 8u);
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.bytes_read, 8u * 8192);
  EXPECT_EQ(s.checksum_failures, 0u);
}

TEST(DiskTier, OddPageSizeAndUnalignedDestination) {
  TempDir dir;
  auto tier = MustOpen(Options(dir, 5000, 8));
  ASSERT_NE(tier, nullptr);
  PutRange(*tier, 0, 5, 5000);
  tier->Flush();
  Pages dst(5, 5000, /*misalign=*/3);
  std::vector<BlockKey> keys = Keys(0, 5);
  ASSERT_EQ(tier->Take(keys, dst.ptrs()), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(dst.at(i), Page(i, 5000)) << i;
}

TEST(DiskTier, CountPresentLookupAndTakeRemoves) {
  TempDir dir;
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  PutRange(*tier, 0, 5, 8192);
  tier->Flush();
  std::vector<BlockKey> probe = {Key(0), Key(1), Key(2), Key(9), Key(3)};
  EXPECT_EQ(tier->CountPresent(probe), 3u);
  EXPECT_EQ(tier->CountPresent({}), 0u);
  TierBlock meta;
  ASSERT_TRUE(tier->Lookup(Key(2), &meta));
  EXPECT_EQ(meta.key, Key(2));
  EXPECT_EQ(meta.parent_key, Key(1));
  EXPECT_EQ(meta.root, Key(1000));
  EXPECT_EQ(meta.depth, 2u);
  EXPECT_FALSE(tier->Lookup(Key(9), &meta));

  Pages dst(5, 8192);
  std::vector<BlockKey> first_two = Keys(0, 2);
  ASSERT_EQ(tier->Take(first_two, dst.ptrs()), 2u);
  EXPECT_EQ(tier->CountPresent(first_two), 0u);
  EXPECT_FALSE(tier->Lookup(Key(0), &meta));
  std::vector<BlockKey> rest = Keys(2, 3);
  EXPECT_EQ(tier->CountPresent(rest), 3u);
  // A Take stops at the first absent key; the rest stay.
  std::vector<BlockKey> gap = {Key(2), Key(0), Key(3)};
  EXPECT_EQ(tier->Take(gap, dst.ptrs()), 1u);
  EXPECT_EQ(dst.at(0), Page(2, 8192));
  EXPECT_EQ(tier->CountPresent({Key(3)}), 1u);
  EXPECT_EQ(tier->Take(first_two, dst.ptrs()), 0u);
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.promotions, 3u);
  EXPECT_EQ(s.used, 2u);
}

TEST(DiskTier, LeastRecentlyPutSlotIsReusedWhenFull) {
  TempDir dir;
  auto tier = MustOpen(Options(dir, 8192, 4));
  ASSERT_NE(tier, nullptr);
  ASSERT_EQ(tier->capacity_blocks(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    PutRange(*tier, i, 1, 8192);
    tier->Flush();
  }
  PutRange(*tier, 4, 1, 8192);  // evicts 0
  tier->Flush();
  EXPECT_EQ(tier->CountPresent({Key(0)}), 0u);
  EXPECT_EQ(tier->CountPresent(Keys(1, 4)), 4u);
  // Putting 1 again makes it the newest; the next eviction takes 2.
  ASSERT_TRUE(tier->Put(Block(1), Page(1, 8192, 1).data()));
  tier->Flush();
  PutRange(*tier, 5, 1, 8192);
  tier->Flush();
  EXPECT_EQ(tier->CountPresent({Key(2)}), 0u);
  for (uint64_t i : {1, 3, 4, 5}) EXPECT_EQ(tier->CountPresent({Key(i)}), 1u) << i;
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.used, 4u);
  Pages dst(1, 8192);
  std::vector<BlockKey> one = {Key(1)};
  ASSERT_EQ(tier->Take(one, dst.ptrs()), 1u);
  EXPECT_EQ(dst.at(0), Page(1, 8192, 1));  // the replacement's bytes
}

TEST(DiskTier, PendingBlocksAreServedBeforeFlush) {
  TempDir dir;
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  tier->SetWritesPausedForTesting(true);
  PutRange(*tier, 0, 3, 8192);
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.pending, 3u);
  EXPECT_EQ(s.used, 3u);
  EXPECT_EQ(tier->CountPresent(Keys(0, 3)), 3u);
  Pages dst(2, 8192);
  std::vector<BlockKey> keys = Keys(0, 2);
  ASSERT_EQ(tier->Take(keys, dst.ptrs()), 2u);
  EXPECT_EQ(dst.at(0), Page(0, 8192));
  EXPECT_EQ(dst.at(1), Page(1, 8192));
  tier->SetWritesPausedForTesting(false);
  tier->Flush();
  s = tier->stats();
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.used, 1u);
  EXPECT_EQ(tier->CountPresent(keys), 0u);
  std::vector<BlockKey> last = {Key(2)};
  ASSERT_EQ(tier->Take(last, dst.ptrs()), 1u);
  EXPECT_EQ(dst.at(0), Page(2, 8192));
}

// More blocks in flight than slots: the tier is still an LRU of its
// capacity by put order. The oldest pending blocks leave (their writes are
// never made), the newest are served from staging with their own bytes,
// and once the writes run, the survivors reach the file and a reopen
// finds exactly them.
TEST(DiskTier, BlocksInFlightBeyondTheSlotsStayAnLruByPutOrder) {
  TempDir dir;
  auto tier = MustOpen(Options(dir, 8192, 4));
  ASSERT_NE(tier, nullptr);
  tier->Flush();
  PutRange(*tier, 0, 1, 8192);
  tier->Flush();  // block 0 stored
  tier->SetWritesPausedForTesting(true);
  std::vector<TierBlock> forgotten;
  for (uint64_t i = 1; i < 8; ++i) {
    ASSERT_TRUE(tier->Put(Block(i), Page(i, 8192).data(), &forgotten)) << i;
  }
  // 0..3 left, oldest first, for 4..7; 0 was stored, 1..3 pending.
  ASSERT_EQ(forgotten.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(forgotten[i].key, Key(i));
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.used, 4u);
  EXPECT_EQ(s.pending, 4u);  // the cancelled writes are not pending
  EXPECT_EQ(s.dropped_full, 0u);
  EXPECT_EQ(s.evictions, 4u);
  EXPECT_EQ(tier->CountPresent(Keys(0, 8)), 0u);
  EXPECT_EQ(tier->CountPresent(Keys(4, 4)), 4u);
  Pages dst(1, 8192);
  const std::vector<BlockKey> five = {Key(5)};
  ASSERT_EQ(tier->Take(five, dst.ptrs()), 1u);
  EXPECT_EQ(dst.at(0), Page(5, 8192));
  // A ninth block takes 5's room; 4 stays (it is older, but room is free).
  ASSERT_TRUE(tier->Put(Block(8), Page(8, 8192).data(), &forgotten));
  EXPECT_EQ(forgotten.size(), 4u);
  tier->SetWritesPausedForTesting(false);
  tier->Flush();
  s = tier->stats();
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.used, 4u);
  EXPECT_EQ(s.bytes_written, 5u * tier->layout().stride);  // 0, 4, 6, 7, 8
  tier.reset();
  tier = MustOpen(Options(dir, 8192, 4));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().reloaded, 4u);
  Pages all(4, 8192);
  const std::vector<BlockKey> want = {Key(4), Key(6), Key(7), Key(8)};
  for (size_t i = 0; i < want.size(); ++i) {
    const std::vector<BlockKey> one = {want[i]};
    ASSERT_EQ(tier->Take(one, all.ptrs().subspan(i, 1)), 1u) << i;
  }
  EXPECT_EQ(all.at(0), Page(4, 8192));
  EXPECT_EQ(all.at(1), Page(6, 8192));
  EXPECT_EQ(all.at(2), Page(7, 8192));
  EXPECT_EQ(all.at(3), Page(8, 8192));
}

TEST(DiskTier, ForgetDropsStoredAndPendingCopies) {
  TempDir dir;
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  PutRange(*tier, 0, 2, 8192);
  tier->Flush();  // blocks 0 and 1 stored
  tier->SetWritesPausedForTesting(true);
  PutRange(*tier, 2, 2, 8192);  // blocks 2 and 3 pending
  std::vector<TierBlock> dropped;
  const std::vector<BlockKey> gone = {Key(1), Key(2), Key(9)};
  EXPECT_EQ(tier->Forget(gone, &dropped), 2u);  // 9 was never there
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(dropped[0].key, Key(1));
  EXPECT_EQ(dropped[1].key, Key(2));
  EXPECT_EQ(tier->CountPresent({Key(1)}), 0u);
  EXPECT_EQ(tier->CountPresent({Key(2)}), 0u);
  tier->SetWritesPausedForTesting(false);
  tier->Flush();
  const DiskTierStats s = tier->stats();
  EXPECT_EQ(s.superseded, 2u);
  EXPECT_EQ(s.used, 2u);
  EXPECT_EQ(s.pending, 0u);
  // The others are untouched, and the freed slots take new blocks.
  Pages dst(1, 8192);
  const std::vector<BlockKey> three = {Key(3)};
  ASSERT_EQ(tier->Take(three, dst.ptrs()), 1u);
  EXPECT_EQ(dst.at(0), Page(3, 8192));
  PutRange(*tier, 5, 2, 8192);
  tier->Flush();
  EXPECT_EQ(tier->stats().used, 3u);
}

TEST(DiskTier, PutRefusesBeyondMaxPendingBytes) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.max_pending_bytes = 2 * 8192;
  auto tier = MustOpen(o);
  ASSERT_NE(tier, nullptr);
  tier->SetWritesPausedForTesting(true);
  EXPECT_TRUE(tier->Put(Block(0), Page(0, 8192).data()));
  EXPECT_TRUE(tier->Put(Block(1), Page(1, 8192).data()));
  EXPECT_FALSE(tier->Put(Block(2), Page(2, 8192).data()));
  EXPECT_EQ(tier->stats().dropped_full, 1u);
  EXPECT_EQ(tier->CountPresent({Key(2)}), 0u);
  tier->SetWritesPausedForTesting(false);
  tier->Flush();
  EXPECT_TRUE(tier->Put(Block(2), Page(2, 8192).data()));
  tier->Flush();
  EXPECT_EQ(tier->CountPresent(Keys(0, 3)), 3u);
}

TEST(DiskTier, ReopenReloadsBlocksWithIdenticalBytes) {
  TempDir dir;
  {
    auto tier = MustOpen(Options(dir));
    ASSERT_NE(tier, nullptr);
    PutRange(*tier, 0, 10, 8192);
    tier->Flush();
    PutRange(*tier, 10, 2, 8192);  // the destructor flushes these
  }
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.reloaded, 12u);
  EXPECT_EQ(s.used, 12u);
  TierBlock meta;
  ASSERT_TRUE(tier->Lookup(Key(7), &meta));
  EXPECT_EQ(meta.parent_key, Key(6));
  EXPECT_EQ(meta.root, Key(1000));
  EXPECT_EQ(meta.depth, 7u);
  Pages dst(12, 8192);
  std::vector<BlockKey> keys = Keys(0, 12);
  ASSERT_EQ(tier->Take(keys, dst.ptrs()), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(dst.at(i), Page(i, 8192)) << i;
}

TEST(DiskTier, ReloadedLruEvictsOldestWriteFirst) {
  TempDir dir;
  {
    auto tier = MustOpen(Options(dir, 8192, 4));
    ASSERT_NE(tier, nullptr);
    for (uint64_t i : {3, 1, 0, 2}) {
      PutRange(*tier, i, 1, 8192);
      tier->Flush();
    }
  }
  auto tier = MustOpen(Options(dir, 8192, 4));
  ASSERT_NE(tier, nullptr);
  PutRange(*tier, 4, 1, 8192);
  tier->Flush();
  EXPECT_EQ(tier->CountPresent({Key(3)}), 0u);
  EXPECT_EQ(tier->CountPresent({Key(1)}), 1u);
}

TEST(DiskTier, NewestOfTwoHeadersWithOneKeyWinsOnReload) {
  TempDir dir;
  {
    auto tier = MustOpen(Options(dir));
    ASSERT_NE(tier, nullptr);
    PutRange(*tier, 0, 2, 8192);
    tier->Flush();
    Pages dst(1, 8192);
    std::vector<BlockKey> k0 = {Key(0)}, k1 = {Key(1)};
    ASSERT_EQ(tier->Take(k0, dst.ptrs()), 1u);
    ASSERT_EQ(tier->Take(k1, dst.ptrs()), 1u);
    // Block 0's header stays valid in its freed slot; the new version of
    // it goes to another slot.
    ASSERT_TRUE(tier->Put(Block(0), Page(0, 8192, 2).data()));
  }
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  Pages dst(1, 8192);
  std::vector<BlockKey> k0 = {Key(0)};
  ASSERT_EQ(tier->Take(k0, dst.ptrs()), 1u);
  EXPECT_EQ(dst.at(0), Page(0, 8192, 2));
}

TEST(DiskTier, CorruptedDataByteStopsTakeAndDropsTheBlock) {
  TempDir dir;
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  PutRange(*tier, 0, 4, 8192);
  tier->Flush();
  int64_t slot = FindSlot(dir.file(), tier->layout(), Key(2));
  ASSERT_GE(slot, 0);
  uint64_t offset = tier->layout().DataOffset(slot) + 100;
  std::vector<char> byte = ReadAt(dir.file(), offset, 1);
  byte[0] = static_cast<char>(byte[0] ^ 0x40);
  WriteAt(dir.file(), offset, byte.data(), 1);

  Pages dst(4, 8192);
  std::vector<BlockKey> keys = Keys(0, 4);
  std::vector<BlockKey> dropped;
  EXPECT_EQ(tier->Take(keys, dst.ptrs(), &dropped), 2u);
  EXPECT_EQ(dst.at(1), Page(1, 8192));
  // The dropped block is reported (for its KV event), the one after is not.
  EXPECT_EQ(dropped, std::vector<BlockKey>{Key(2)});
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.promotions, 2u);
  EXPECT_EQ(tier->CountPresent({Key(2)}), 0u);
  std::vector<BlockKey> last = {Key(3)};
  ASSERT_EQ(tier->Take(last, dst.ptrs()), 1u);  // the block after stays
  EXPECT_EQ(dst.at(0), Page(3, 8192));
}

TEST(DiskTier, OlderHeaderOverNewerDataIsAMiss) {
  TempDir dir;
  DiskTierOptions o = Options(dir, 8192, 1);
  std::vector<char> header_a;
  {
    auto tier = MustOpen(o);
    ASSERT_NE(tier, nullptr);
    ASSERT_EQ(tier->capacity_blocks(), 1u);
    PutRange(*tier, 0, 1, 8192);
    tier->Flush();
    header_a = ReadAt(dir.file(), tier->layout().HeaderOffset(0),
                      disk_tier::kSlotHeaderBytes);
    PutRange(*tier, 1, 1, 8192);  // reuses slot 0: data then header
    tier->Flush();
    // A crash between block 1's data and its header leaves this.
    WriteAt(dir.file(), tier->layout().HeaderOffset(0), header_a.data(),
            header_a.size());
    Pages dst(1, 8192);
    std::vector<BlockKey> k1 = {Key(1)};
    EXPECT_EQ(tier->Take(k1, dst.ptrs()), 0u);
    EXPECT_EQ(tier->stats().checksum_failures, 1u);
    EXPECT_EQ(tier->CountPresent(k1), 0u);
  }
  auto tier = MustOpen(o);
  ASSERT_NE(tier, nullptr);
  // Block 0's header is valid, so it is indexed, but its data is gone.
  std::vector<BlockKey> k0 = {Key(0)};
  EXPECT_EQ(tier->CountPresent(k0), 1u);
  Pages dst(1, 8192);
  EXPECT_EQ(tier->Take(k0, dst.ptrs()), 0u);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  EXPECT_EQ(tier->CountPresent(k0), 0u);
}

TEST(DiskTier, ZeroedHeaderIsAMiss) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  int64_t slot = -1;
  disk_tier::Layout layout;
  {
    auto tier = MustOpen(o);
    ASSERT_NE(tier, nullptr);
    PutRange(*tier, 0, 3, 8192);
    tier->Flush();
    layout = tier->layout();
    slot = FindSlot(dir.file(), layout, Key(1));
  }
  ASSERT_GE(slot, 0);
  std::vector<char> zeros(disk_tier::kSlotHeaderBytes, 0);
  WriteAt(dir.file(), layout.HeaderOffset(slot), zeros.data(), zeros.size());
  auto tier = MustOpen(o);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().reloaded, 2u);
  std::vector<BlockKey> keys = Keys(0, 3);
  EXPECT_EQ(tier->CountPresent(keys), 1u);
  Pages dst(3, 8192);
  EXPECT_EQ(tier->Take(keys, dst.ptrs()), 1u);
  EXPECT_EQ(tier->stats().misses, 1u);
}

TEST(DiskTier, FileOfAnotherPageSizeIsReset) {
  TempDir dir;
  {
    auto tier = MustOpen(Options(dir, 8192, 8));
    ASSERT_NE(tier, nullptr);
    PutRange(*tier, 0, 4, 8192);
  }
  DiskTierOptions o = Options(dir, 8192, 8);
  o.page_bytes = 4096;  // same budget, other page size
  {
    auto tier = MustOpen(o);
    ASSERT_NE(tier, nullptr);
    DiskTierStats s = tier->stats();
    EXPECT_EQ(s.reloaded, 0u);
    EXPECT_EQ(s.used, 0u);
    EXPECT_EQ(tier->CountPresent({Key(0)}), 0u);
    PutRange(*tier, 0, 2, 4096);
  }
  auto tier = MustOpen(o);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().reloaded, 2u);
  Pages dst(2, 4096);
  std::vector<BlockKey> keys = Keys(0, 2);
  ASSERT_EQ(tier->Take(keys, dst.ptrs()), 2u);
  EXPECT_EQ(dst.at(1), Page(1, 4096));
}

TEST(DiskTier, ForeignFileOrOtherBudgetIsReset) {
  TempDir dir;
  std::vector<char> junk(64 << 10, 'x');
  int fd = open(dir.file().c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(disk_tier::PwriteFull(fd, junk.data(), junk.size(), 0), 0);
  close(fd);
  {
    auto tier = MustOpen(Options(dir, 8192, 8));
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->stats().reloaded, 0u);
    PutRange(*tier, 0, 3, 8192);
  }
  auto tier = MustOpen(Options(dir, 8192, 12));  // another budget
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->capacity_blocks(), 12u);
  EXPECT_EQ(tier->stats().reloaded, 0u);
}

void ExpectError(const DiskTierOptions& o, absl::StatusCode code,
                 const std::string& part) {
  absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(o);
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), code) << tier.status();
  EXPECT_THAT(std::string(tier.status().message()), HasSubstr("--tier=disk"));
  EXPECT_THAT(std::string(tier.status().message()), HasSubstr(part));
}

TEST(DiskTierOpen, RefusesBadOptions) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.path = dir.path() + "/missing";
  ExpectError(o, absl::StatusCode::kInvalidArgument, "does not exist");
  o.path = "";
  ExpectError(o, absl::StatusCode::kInvalidArgument, "does not exist");
  std::string file = dir.path() + "/plain";
  int fd = open(file.c_str(), O_CREAT | O_WRONLY, 0600);
  close(fd);
  o.path = file;
  ExpectError(o, absl::StatusCode::kInvalidArgument, "not a directory");

  o = Options(dir);
  o.page_bytes = 0;
  ExpectError(o, absl::StatusCode::kInvalidArgument, "page_bytes");
  o = Options(dir);
  o.bytes = disk_tier::MinBytesForOneSlot(o.page_bytes) - 1;
  ExpectError(o, absl::StatusCode::kInvalidArgument, "too small");
  o = Options(dir);
  o.io_threads = 0;
  ExpectError(o, absl::StatusCode::kInvalidArgument, "io_threads");
  o = Options(dir);
  o.max_pending_bytes = 4096;
  ExpectError(o, absl::StatusCode::kInvalidArgument, "max_pending_bytes");
}

TEST(DiskTierOpen, RefusesADirectoryItCannotWrite) {
  DiskTierOptions o;
  o.page_bytes = 4096;
  o.bytes = 1 << 20;
  TempDir dir;
  if (geteuid() != 0) {
    ASSERT_EQ(chmod(dir.path().c_str(), 0555), 0);
    o.path = dir.path();
    ExpectError(o, absl::StatusCode::kFailedPrecondition, "not writable");
    chmod(dir.path().c_str(), 0755);
    return;
  }
  // Root bypasses mode bits; sysfs refuses to create files even for root.
  struct stat st;
  if (stat("/sys", &st) != 0 || !S_ISDIR(st.st_mode) ||
      access("/sys/radixkv-tier.dat", F_OK) == 0) {
    GTEST_SKIP() << "no /sys to test an unwritable directory as root";
  }
  o.path = "/sys";
  ExpectError(o, absl::StatusCode::kFailedPrecondition, "not writable");
}

TEST(DiskTierOpen, RefusesABudgetTheFilesystemCannotHold) {
  TempDir dir;
  struct statvfs vfs;
  ASSERT_EQ(statvfs(dir.path().c_str(), &vfs), 0);
  uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (avail > (uint64_t{1} << 42)) GTEST_SKIP() << "filesystem too large";
  DiskTierOptions o = Options(dir);
  o.bytes = 2 * avail + (uint64_t{1} << 30);
  // A configuration error (exit 2, no restart loop), in units people read.
  ExpectError(o, absl::StatusCode::kInvalidArgument, dir.path());
  ExpectError(o, absl::StatusCode::kInvalidArgument, "GiB free");
  struct stat st;
  ASSERT_EQ(stat(dir.file().c_str(), &st), 0);
  EXPECT_EQ(st.st_blocks, 0);  // nothing stays allocated
}

TEST(DiskTierOpen, SmallTmpfsCannotHoldTheFile) {
  TempDir dir;
  if (mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  DiskTierOptions o;
  o.path = dir.path();
  o.page_bytes = 8192;
  o.bytes = 4 << 20;
  ExpectError(o, absl::StatusCode::kInvalidArgument,
              "the tier file needs 4 MiB (the bytes= option), the filesystem has");
  o.bytes = 128 << 10;  // fits: the tier works on tmpfs
  {
    auto tier = MustOpen(o);
    if (tier != nullptr) {
      PutRange(*tier, 0, 2, 8192);
      tier->Flush();
      Pages dst(2, 8192);
      std::vector<BlockKey> keys = Keys(0, 2);
      EXPECT_EQ(tier->Take(keys, dst.ptrs()), 2u);
      EXPECT_EQ(dst.at(1), Page(1, 8192));
    }
  }
  umount2(dir.path().c_str(), MNT_DETACH);
}

TEST(DiskTierOpen, OneProcessPerFile) {
  TempDir dir;
  auto tier = MustOpen(Options(dir));
  ASSERT_NE(tier, nullptr);
  ExpectError(Options(dir), absl::StatusCode::kFailedPrecondition,
              "in use by another process");
}

// Writes past RLIMIT_FSIZE fail with EFBIG (SIGXFSZ ignored): a disk that
// fails at run time, without root or a special filesystem.
TEST(DiskTier, WriteErrorsDropBlocks) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.write_error_backoff = absl::Milliseconds(300);
  auto tier = MustOpen(o);
  ASSERT_NE(tier, nullptr);
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = 4096;
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (setrlimit(RLIMIT_FSIZE, &low) != 0) {
    std::signal(SIGXFSZ, old_handler);
    GTEST_SKIP() << "setrlimit(RLIMIT_FSIZE) failed";
  }
  bool put_a = tier->Put(Block(0), Page(0, 8192).data());
  tier->Flush();
  bool put_b = tier->Put(Block(1), Page(1, 8192).data());  // within backoff
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(put_a);
  EXPECT_FALSE(put_b);
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.write_errors, 1u);
  EXPECT_EQ(s.dropped_error, 2u);
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(tier->CountPresent({Key(0)}), 0u);

  absl::SleepFor(absl::Milliseconds(400));
  ASSERT_TRUE(tier->Put(Block(2), Page(2, 8192).data()));
  tier->Flush();
  Pages dst(1, 8192);
  std::vector<BlockKey> k2 = {Key(2)};
  ASSERT_EQ(tier->Take(k2, dst.ptrs()), 1u);
  EXPECT_EQ(dst.at(0), Page(2, 8192));
}

// Puts, Takes and lookups from several threads on a small tier: every block
// a Take returns has exactly the bytes put under its key.
TEST(DiskTier, ConcurrentPutAndTakeServeOnlyRightBytes) {
  TempDir dir;
  constexpr size_t kPage = 4096;
  auto tier = MustOpen(Options(dir, kPage, 24));
  ASSERT_NE(tier, nullptr);
  std::atomic<uint64_t> served{0};
  std::atomic<uint64_t> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      Pages dst(4, kPage);
      for (int op = 0; op < 1500; ++op) {
        uint64_t k = rng() % 48;
        if (rng() % 2 == 0) {
          tier->Put(Block(k), Page(k, kPage).data());
        } else {
          std::vector<BlockKey> keys = Keys(k, 1 + rng() % 4);
          size_t n = tier->Take(keys, dst.ptrs());
          for (size_t i = 0; i < n; ++i) {
            if (dst.at(i) != Page(k + i, kPage)) ++wrong;
          }
          served += n;
          tier->CountPresent(keys);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  tier->Flush();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(served.load(), 0u);
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.pending, 0u);
  EXPECT_LE(s.used, 24u);
  EXPECT_EQ(s.checksum_failures, 0u);
}

}  // namespace
}  // namespace radixkv::daemon
