// TierChain (daemon/tiers/tier_chain.h) under a cuda pool (ctest label `gpu`):
// device pages demoted to pinned host memory (HostTier on the pool's
// device) and, through pinned bounce buffers, to a disk tier file, then
// promoted into other device pages, every byte checked with cudaMemcpy
// through this test's own mapping of the pool. Pages of 256 KiB and of
// 768 KiB (which do not fill a 4 MiB chunk), several chunks each. Skips
// (GTEST_SKIP) without a CUDA device.
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/tiers/disk_tier.h"
#include "daemon/tiers/host_tier.h"
#include "daemon/tiers/tier_chain.h"
#include "gpu/mapped_pool.h"
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

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * kKiB;
constexpr uint64_t kPages = 64;
constexpr uint64_t kChunkBytes = 4 * kMiB;

bool HaveDevice() {
  int n = 0;  // cudaGetDeviceCount leaves it unset on error 35 (no driver)
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

BlockKey Key(uint64_t i) { return BlockKey{0xc0da000000000000ull + i, ~i}; }

TierBlock Block(uint64_t i) {
  return TierBlock{.key = Key(i), .parent_key = Key(i + 1000),
                   .root = Key(5000), .block_size = 16};
}

// Page contents: 64-bit words naming the pattern and the offset.
uint64_t Word(uint64_t seed, uint64_t i) {
  return (seed << 40) ^ (i * 0x9e3779b97f4a7c15ull) ^ 0x5a5a5a5a5a5a5a5aull;
}

// Page-locked host memory for the test's own copies: a cudaMemcpy from it
// to the device has finished when the call returns (one from pageable
// memory may still be in flight, unordered with the copier's streams).
class Pinned {
 public:
  explicit Pinned(uint64_t bytes) {
    if (cudaMallocHost(&data_, bytes) != cudaSuccess) data_ = nullptr;
  }
  ~Pinned() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  uint64_t* words() const { return static_cast<uint64_t*>(data_); }

 private:
  void* data_ = nullptr;
};

class CudaTierChainTest : public ::testing::TestWithParam<uint64_t> {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    page_bytes_ = GetParam();
    buf_ = std::make_unique<Pinned>(page_bytes_);
    ASSERT_NE(buf_->words(), nullptr);
    gpu::PoolSpec spec;
    spec.backend = gpu::Backend::kCuda;
    spec.device = 0;
    spec.bytes = kPages * page_bytes_;
    spec.chunk_bytes = kChunkBytes;
    auto pool = gpu::CreatePagePool(spec, page_bytes_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    ASSERT_EQ(pool_->capacity_pages(), kPages);
    ASSERT_GT(pool_->chunk_count(), 3u);
    ASSERT_EQ(pool_->host_page_address(0), nullptr);  // not host-addressable
    auto mapped = gpu::MappedPool::MapLocal(*pool_);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    mapped_ = *std::move(mapped);
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(base != nullptr && *base ? base : "/tmp",
                                    "/tier_chain_cuda_test.XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    chain_.reset();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  uint64_t words() const { return page_bytes_ / 8; }

  // A chain of a host tier of `host` blocks (0: none) above a disk tier of
  // `disk` blocks (0: none), attached to the cuda pool.
  void MakeChain(uint64_t host, uint64_t disk) {
    std::unique_ptr<HostTier> h;
    std::unique_ptr<DiskTier> k;
    if (host != 0) {
      auto t = HostTier::Open(gpu::Backend::kCuda, 0, host * page_bytes_,
                              page_bytes_);
      ASSERT_TRUE(t.ok()) << t.status();
      h = *std::move(t);
      ASSERT_TRUE(h->stats().pinned);
      ASSERT_EQ(h->capacity_blocks(), host);
    }
    if (disk != 0) {
      // A 4 KiB superblock and one 4 KiB page of slot headers (up to 32
      // slots), then the slots.
      const uint64_t bytes = 4096 + 4096 + disk * page_bytes_;
      auto opened = DiskTier::Open({.path = dir_, .bytes = bytes,
                                    .page_bytes = page_bytes_,
                                    .wait_for_staging = true});
      ASSERT_TRUE(opened.ok()) << opened.status();
      k = *std::move(opened);
      ASSERT_EQ(k->capacity_blocks(), disk);
    }
    chain_ = std::make_unique<TierChain>(Tiers(std::move(h), std::move(k)));
    absl::Status s = chain_->AttachPool(pool_.get());
    ASSERT_TRUE(s.ok()) << s;
  }

  // Writes pattern `seed` into device page `page`; `buf` is pinned, one page.
  void Store(uint64_t page, uint64_t seed, const Pinned& buf) {
    for (uint64_t i = 0; i < words(); ++i) buf.words()[i] = Word(seed, i);
    ASSERT_EQ(cudaMemcpy(mapped_->page_address(page), buf.words(), page_bytes_,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  void Store(uint64_t page, uint64_t seed) { Store(page, seed, *buf_); }

  // "" when device page `page` holds pattern `seed`; else where it differs.
  std::string Mismatch(uint64_t page, uint64_t seed, const Pinned& buf) const {
    cudaError_t err = cudaMemcpy(buf.words(), mapped_->page_address(page),
                                 page_bytes_, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) return cudaGetErrorString(err);
    for (uint64_t i = 0; i < words(); ++i) {
      if (buf.words()[i] != Word(seed, i)) {
        return absl::StrCat("page ", page, " word ", i,
                            " differs from pattern ", seed);
      }
    }
    return "";
  }
  std::string Mismatch(uint64_t page, uint64_t seed) const {
    return Mismatch(page, seed, *buf_);
  }

  // Demotes pages first_page.. as blocks first_key.., oldest first, each
  // holding pattern 100 + its key.
  std::vector<TierMove> DemoteRun(uint64_t first_page, uint64_t first_key,
                                  uint64_t n) {
    std::vector<EvictedPage> evicted;
    for (uint64_t i = 0; i < n; ++i) {
      Store(first_page + i, 100 + first_key + i);
      evicted.push_back({.block = Block(first_key + i),
                         .page = first_page + i, .ns = 1});
    }
    std::vector<TierMove> moves;
    chain_->Demote(evicted, &moves);
    return moves;
  }

  // Overwrites pages [first, first + n) with pattern 1 (stale bytes a
  // promotion must replace).
  void Scribble(uint64_t first, uint64_t n) {
    for (uint64_t p = first; p < first + n; ++p) Store(p, 1);
  }

  uint64_t page_bytes_ = 0;
  std::unique_ptr<gpu::PagePool> pool_;
  std::unique_ptr<gpu::MappedPool> mapped_;
  std::unique_ptr<TierChain> chain_;
  std::unique_ptr<Pinned> buf_;  // one page
  std::string dir_;
};

INSTANTIATE_TEST_SUITE_P(PageSizes, CudaTierChainTest,
                         ::testing::Values(256 * kKiB, 768 * kKiB),
                         [](const ::testing::TestParamInfo<uint64_t>& info) {
                           return absl::StrCat(info.param / kKiB, "KiB");
                         });

TEST_P(CudaTierChainTest, BlocksGoDownThroughPinnedMemoryToDiskAndBackIntact) {
  ASSERT_NO_FATAL_FAILURE(MakeChain(/*host=*/4, /*disk=*/32));
  // 24 evictions, oldest first: the host tier keeps the newest 4, the
  // older 20 go straight to the disk tier (two rounds of bounce buffers).
  std::vector<TierMove> moves = DemoteRun(/*first_page=*/0, /*first_key=*/0, 24);
  size_t stored_disk = 0, stored_host = 0;
  for (const TierMove& m : moves) {
    ASSERT_TRUE(m.stored);
    EXPECT_EQ(m.ns, 1u);
    (m.medium == kMediumDiskTier ? stored_disk : stored_host)++;
  }
  EXPECT_EQ(stored_disk, 20u);
  EXPECT_EQ(stored_host, 4u);
  // Four more push the host tier's four down to the disk tier, straight
  // from pinned memory.
  moves = DemoteRun(/*first_page=*/24, /*first_key=*/24, 4);
  EXPECT_EQ(moves.size(), 12u);  // 4 x (left host, stored on disk, stored in host)
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(0), &where), kMediumDiskTier);
  EXPECT_EQ(chain_->Locate(Key(23), &where), kMediumDiskTier);
  EXPECT_EQ(chain_->Locate(Key(24), &where), kMediumHostTier);
  EXPECT_EQ(chain_->Locate(Key(27), &where), kMediumHostTier);

  // The source pages are reused; the destinations hold stale bytes.
  Scribble(0, 28);
  Scribble(32, 32);
  std::vector<BlockKey> keys;
  std::vector<uint64_t> pages;
  for (uint64_t i = 0; i < 29; ++i) {  // key 28 was never demoted
    keys.push_back(Key(i));
    pages.push_back(32 + i);
  }
  std::array<size_t, kMediumCount> by{};
  EXPECT_EQ(chain_->CountPresent(keys, &by), 28u);
  EXPECT_EQ(by[kMediumDiskTier], 24u);
  EXPECT_EQ(by[kMediumHostTier], 4u);
  moves.clear();
  ASSERT_EQ(chain_->Promote(keys, pages, &moves), 28u);
  for (uint64_t i = 0; i < 28; ++i) {
    EXPECT_EQ(Mismatch(32 + i, 100 + i), "") << "block " << i;
  }
  for (uint64_t p = 61; p < kPages; ++p) EXPECT_EQ(Mismatch(p, 1), "");
  for (uint64_t p = 0; p < 28; ++p) EXPECT_EQ(Mismatch(p, 1), "");
  EXPECT_EQ(moves.size(), 28u);
  EXPECT_EQ(chain_->CountPresent(keys), 0u);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().promotions, 4u);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().used, 0u);
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().promotions, 24u);
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().checksum_failures, 0u);
  EXPECT_EQ(chain_->copy_errors(), 0u);
}

TEST_P(CudaTierChainTest, ADiskTierAloneMovesPagesThroughBounceBuffers) {
  ASSERT_NO_FATAL_FAILURE(MakeChain(/*host=*/0, /*disk=*/24));
  ASSERT_EQ(chain_->Find(TierKind::kHost), nullptr);
  std::vector<TierMove> moves = DemoteRun(/*first_page=*/4, /*first_key=*/0, 20);
  ASSERT_EQ(moves.size(), 20u);
  for (const TierMove& m : moves) {
    EXPECT_TRUE(m.stored);
    EXPECT_EQ(m.medium, kMediumDiskTier);
  }
  Scribble(4, 20);
  Scribble(30, 20);
  std::vector<BlockKey> keys;
  std::vector<uint64_t> pages;
  for (uint64_t i = 0; i < 20; ++i) {
    keys.push_back(Key(i));
    pages.push_back(30 + i);
  }
  moves.clear();
  ASSERT_EQ(chain_->Promote(keys, pages, &moves), 20u);
  for (uint64_t i = 0; i < 20; ++i) {
    EXPECT_EQ(Mismatch(30 + i, 100 + i), "") << "block " << i;
  }
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().promotions, 20u);
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().used, 0u);
  EXPECT_EQ(chain_->copy_errors(), 0u);
}

TEST_P(CudaTierChainTest, AHostTierAloneKeepsTheNewestBlocksInPinnedMemory) {
  ASSERT_NO_FATAL_FAILURE(MakeChain(/*host=*/8, /*disk=*/0));
  DemoteRun(/*first_page=*/0, /*first_key=*/0, 10);
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(0), &where), 0);  // the oldest two are dropped
  EXPECT_EQ(chain_->Locate(Key(1), &where), 0);
  EXPECT_EQ(chain_->Locate(Key(2), &where), kMediumHostTier);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().dropped_full, 2u);
  Scribble(0, 10);
  // Promoted in two calls, into scattered pages across chunks.
  const std::vector<uint64_t> pages = {63, 20, 41, 5, 6, 7, 50, 33};
  std::vector<BlockKey> keys;
  for (uint64_t i = 2; i < 10; ++i) keys.push_back(Key(i));
  std::vector<TierMove> moves;
  ASSERT_EQ(chain_->Promote(absl::MakeConstSpan(keys).first(3),
                            absl::MakeConstSpan(pages).first(3), &moves),
            3u);
  ASSERT_EQ(chain_->Promote(absl::MakeConstSpan(keys).subspan(3),
                            absl::MakeConstSpan(pages).subspan(3), &moves),
            5u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(Mismatch(pages[i], 102 + i), "") << "block " << 2 + i;
  }
  const TierStats s = chain_->Find(TierKind::kHost)->stats();
  EXPECT_EQ(s.promotions, 8u);
  EXPECT_EQ(s.bytes_read, 8 * page_bytes_);
  EXPECT_EQ(s.used, 0u);
  EXPECT_TRUE(s.pinned);
  EXPECT_EQ(chain_->copy_errors(), 0u);
}

TEST_P(CudaTierChainTest, ABadPageIsACopyErrorAndStoresNothing) {
  ASSERT_NO_FATAL_FAILURE(MakeChain(/*host=*/4, /*disk=*/0));
  std::vector<TierMove> moves;
  chain_->Demote({{.block = Block(1), .page = kPages + 5}}, &moves);
  EXPECT_EQ(chain_->copy_errors(), 1u);
  EXPECT_TRUE(moves.empty());
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(1), &where), 0);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().dropped_error, 1u);
  EXPECT_EQ(chain_->Find(TierKind::kHost)->stats().used, 0u);
  // The chain goes on: a good page is demoted, a promotion into a bad page
  // fails and leaves the block in the tier, a good one then succeeds.
  moves = DemoteRun(/*first_page=*/2, /*first_key=*/2, 1);
  ASSERT_EQ(moves.size(), 1u);
  const std::vector<BlockKey> keys = {Key(2)};
  const std::vector<uint64_t> bad = {kPages};
  EXPECT_EQ(chain_->Promote(keys, bad, &moves), 0u);
  EXPECT_EQ(chain_->copy_errors(), 2u);
  EXPECT_EQ(chain_->Locate(Key(2), &where), kMediumHostTier);
  Scribble(9, 1);
  const std::vector<uint64_t> good = {9};
  ASSERT_EQ(chain_->Promote(keys, good, &moves), 1u);
  EXPECT_EQ(Mismatch(9, 102), "");
}

TEST_P(CudaTierChainTest, ABadPageUnderADiskTierAloneStoresNothing) {
  ASSERT_NO_FATAL_FAILURE(MakeChain(/*host=*/0, /*disk=*/8));
  std::vector<TierMove> moves;
  chain_->Demote({{.block = Block(1), .page = kPages + 5}}, &moves);
  EXPECT_EQ(chain_->copy_errors(), 1u);
  EXPECT_TRUE(moves.empty());
  TierBlock where;
  EXPECT_EQ(chain_->Locate(Key(1), &where), 0);
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().demotions, 0u);
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().used, 0u);
}

TEST_P(CudaTierChainTest, ConcurrentDemotionsAndPromotionsServeOnlyRightBytes) {
  // Each batch of 3 spans both tiers.
  ASSERT_NO_FATAL_FAILURE(MakeChain(/*host=*/2, /*disk=*/6));
  // Two threads, each with its own pages, keys and pinned buffer, move
  // blocks down and up through both tiers; every promoted page must hold
  // its block's pattern.
  constexpr int kRounds = 60;
  std::atomic<int> promoted{0};
  std::atomic<int> bad{0};
  std::string first_error[2];
  auto run = [&](int t) {
    const uint64_t base = 16 * t;
    Pinned buf(page_bytes_);
    if (buf.words() == nullptr) {
      bad.fetch_add(1);
      return;
    }
    for (int round = 0; round < kRounds; ++round) {
      std::vector<EvictedPage> evicted;
      for (uint64_t i = 0; i < 3; ++i) {
        const uint64_t key = 10000 * (t + 1) + round * 3 + i;
        Store(base + i, key, buf);
        evicted.push_back({.block = Block(key), .page = base + i});
      }
      std::vector<TierMove> moves;
      chain_->Demote(evicted, &moves);
      std::vector<BlockKey> keys;
      for (const auto& e : evicted) keys.push_back(e.block.key);
      const std::vector<uint64_t> pages = {base + 3, base + 4, base + 5};
      const size_t n = chain_->Promote(keys, pages, &moves);
      promoted.fetch_add(static_cast<int>(n));
      for (size_t i = 0; i < n; ++i) {
        const uint64_t key = 10000 * (t + 1) + round * 3 + i;
        std::string m = Mismatch(base + 3 + i, key, buf);
        if (!m.empty()) {
          if (bad.fetch_add(1) == 0) first_error[t] = m;
        }
      }
    }
  };
  std::thread a(run, 0);
  std::thread b(run, 1);
  a.join();
  b.join();
  EXPECT_EQ(bad.load(), 0) << first_error[0] << first_error[1];
  EXPECT_GT(promoted.load(), kRounds * 6 / 2);  // most blocks came back
  EXPECT_EQ(chain_->copy_errors(), 0u);
  EXPECT_GT(chain_->Find(TierKind::kDisk)->stats().promotions, 0u);
  EXPECT_GT(chain_->Find(TierKind::kHost)->stats().promotions, 0u);
  EXPECT_EQ(chain_->Find(TierKind::kDisk)->stats().checksum_failures, 0u);
}

}  // namespace
}  // namespace radixkv::daemon
