// Tests of gpu/page_copier.h on a cuda pool (ctest label `gpu`): pages
// copied out to pinned (and pageable) host memory and back in, runs that
// cross chunk boundaries, order within a batch, bad page ids and batches of
// two threads at once. The pages are written and read with cudaMemcpy
// through this test's own mapping of the pool. Skips (GTEST_SKIP) without a
// CUDA device.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu/mapped_pool.h"
#include "gpu/page_copier.h"
#include "gpu/pool.h"
#include "gtest/gtest.h"

namespace radixkv::gpu {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * kKiB;
// 5 pages of 768 KiB per 4 MiB chunk: a chunk's pages end 256 KiB before the
// next chunk starts, so a run of pages may not be copied across chunks.
constexpr uint64_t kPageBytes = 768 * kKiB;
constexpr uint64_t kPerChunk = 5;
constexpr uint64_t kChunks = 6;
constexpr uint64_t kPages = kPerChunk * kChunks;

bool HaveDevice() {
  int n = 0;  // cudaGetDeviceCount leaves it unset on error 35 (no driver)
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Page contents: 64-bit words naming the pattern, the page and the offset.
uint64_t Word(uint64_t seed, uint64_t page, uint64_t i) {
  return (seed << 48) ^ (page << 32) ^ (i * 0x9e3779b97f4a7c15ull);
}

void Fill(void* dst, uint64_t seed, uint64_t page) {
  auto* w = static_cast<uint64_t*>(dst);
  for (uint64_t i = 0; i < kPageBytes / 8; ++i) w[i] = Word(seed, page, i);
}

// "" when `src` holds pattern (seed, page); else where it first differs.
std::string Mismatch(const void* src, uint64_t seed, uint64_t page) {
  const auto* w = static_cast<const uint64_t*>(src);
  for (uint64_t i = 0; i < kPageBytes / 8; ++i) {
    if (w[i] != Word(seed, page, i)) {
      return "word " + std::to_string(i) + " differs from pattern (" +
             std::to_string(seed) + ", " + std::to_string(page) + ")";
    }
  }
  return "";
}

class CudaPageCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    PoolSpec spec;
    spec.backend = Backend::kCuda;
    spec.device = 0;
    spec.bytes = kPages * kPageBytes;
    spec.chunk_bytes = 4 * kMiB;
    absl::StatusOr<std::unique_ptr<PagePool>> pool =
        CreatePagePool(spec, kPageBytes);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    ASSERT_EQ(pool_->capacity_pages(), kPages);
    ASSERT_EQ(pool_->pages_per_chunk(), kPerChunk);
    ASSERT_EQ(pool_->chunk_count(), kChunks);
    absl::StatusOr<std::unique_ptr<MappedPool>> mapped =
        MappedPool::MapLocal(*pool_);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    mapped_ = *std::move(mapped);
    absl::StatusOr<std::unique_ptr<PageCopier>> copier =
        CreatePageCopier(*pool_);
    ASSERT_TRUE(copier.ok()) << copier.status();
    copier_ = *std::move(copier);
    absl::StatusOr<std::unique_ptr<HostMemory>> host =
        copier_->AllocateHost(2 * kPages * kPageBytes);
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
  }

  char* slot(uint64_t s) const { return host_->data() + s * kPageBytes; }

  // Writes pattern (seed, page) into page `page` of the pool.
  void Store(uint64_t page, uint64_t seed) {
    std::vector<uint64_t> buf(kPageBytes / 8);
    Fill(buf.data(), seed, page);
    ASSERT_EQ(cudaMemcpy(mapped_->page_address(page), buf.data(), kPageBytes,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  // "" when page `page` of the pool holds pattern (seed, of).
  std::string PageMismatch(uint64_t page, uint64_t seed, uint64_t of) {
    std::vector<uint64_t> buf(kPageBytes / 8);
    cudaError_t err = cudaMemcpy(buf.data(), mapped_->page_address(page),
                                 kPageBytes, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) return cudaGetErrorString(err);
    return Mismatch(buf.data(), seed, of);
  }

  void StoreAll(uint64_t seed) {
    for (uint64_t p = 0; p < kPages; ++p) Store(p, seed);
  }

  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<MappedPool> mapped_;
  std::unique_ptr<PageCopier> copier_;
  std::unique_ptr<HostMemory> host_;
};

TEST_F(CudaPageCopierTest, AllocateHostIsPinned) {
  EXPECT_EQ(copier_->backend(), Backend::kCuda);
  EXPECT_EQ(copier_->page_bytes(), kPageBytes);
  EXPECT_TRUE(host_->pinned());
  EXPECT_EQ(host_->bytes(), 2 * kPages * kPageBytes);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, host_->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  std::memset(host_->data(), 0x3c, host_->bytes());  // writable to the end

  // The same memory without a copier, for the pool's device.
  absl::StatusOr<std::unique_ptr<HostMemory>> direct =
      AllocateHostMemory(Backend::kCuda, pool_->device(), 1 << 20);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_TRUE((*direct)->pinned());
  ASSERT_EQ(cudaPointerGetAttributes(&attr, (*direct)->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
}

// Consecutive pages into consecutive slots (runs, some crossing a chunk
// boundary), the same pages into scattered slots, and scattered pages.
TEST_F(CudaPageCopierTest, CopiesOutInAnyOrder) {
  StoreAll(1);
  std::vector<uint64_t> pages;
  std::vector<void*> dst;
  for (uint64_t p = 3; p < 13; ++p) {  // chunks 0, 1 and 2
    pages.push_back(p);
    dst.push_back(slot(p - 3));
  }
  for (uint64_t p = 20; p < 27; ++p) {  // consecutive pages, slots reversed
    pages.push_back(p);
    dst.push_back(slot(10 + 26 - p));
  }
  for (uint64_t p : {29, 0, 17, 14, 15, 2}) {  // scattered pages
    pages.push_back(p);
    dst.push_back(slot(dst.size()));
  }
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(pages, dst);
  ASSERT_TRUE(batch->Wait().ok());
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(Mismatch(dst[i], 1, pages[i]), "") << "page " << pages[i];
  }
}

TEST_F(CudaPageCopierTest, CopiesInToOtherPages) {
  // Slots 0..kPages-1 hold pattern 2 of page p in slot p.
  for (uint64_t s = 0; s < kPages; ++s) Fill(slot(s), 2, s);
  StoreAll(3);
  // Consecutive slots into a run crossing two chunk boundaries, and
  // scattered slots into scattered pages.
  std::vector<uint64_t> pages;
  std::vector<const void*> src;
  std::vector<uint64_t> from;
  for (uint64_t p = 4; p < 16; ++p) {
    pages.push_back(p);
    src.push_back(slot(p + 10));
    from.push_back(p + 10);
  }
  const uint64_t more[][2] = {{29, 0}, {0, 7}, {18, 3}, {19, 2}, {25, 26}};
  for (const auto& m : more) {
    pages.push_back(m[0]);
    src.push_back(slot(m[1]));
    from.push_back(m[1]);
  }
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyIn(src, pages);
  ASSERT_TRUE(batch->Wait().ok());
  std::vector<bool> written(kPages, false);
  for (size_t i = 0; i < pages.size(); ++i) {
    written[pages[i]] = true;
    EXPECT_EQ(PageMismatch(pages[i], 2, from[i]), "") << "page " << pages[i];
  }
  for (uint64_t p = 0; p < kPages; ++p) {
    if (!written[p]) {
      EXPECT_EQ(PageMismatch(p, 3, p), "") << "page " << p;
    }
  }
}

// Pageable host memory works too (the copies are then not asynchronous).
TEST_F(CudaPageCopierTest, PageableHostMemoryRoundTrips) {
  StoreAll(4);
  std::vector<uint64_t> buf(3 * kPageBytes / 8);
  char* base = reinterpret_cast<char*>(buf.data());
  const uint64_t out[] = {8, 9, 10};  // crosses chunk 1 -> 2
  void* const dst[] = {base, base + kPageBytes, base + 2 * kPageBytes};
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(out, dst);
  ASSERT_TRUE(batch->Wait().ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Mismatch(dst[i], 4, out[i]), "") << i;
  const uint64_t in[] = {21, 22, 23};
  const void* const src[] = {dst[0], dst[1], dst[2]};
  batch->CopyIn(src, in);
  ASSERT_TRUE(batch->Wait().ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(PageMismatch(in[i], 4, out[i]), "");
}

TEST_F(CudaPageCopierTest, CopiesOfOneBatchRunInOrder) {
  StoreAll(5);
  Fill(slot(1), 6, 77);
  Fill(slot(3), 6, 78);
  // Pages 4 and 5 (adjacent, different chunks), out, in, and out again.
  const uint64_t pages[] = {4, 5};
  void* const first[] = {slot(10), slot(11)};
  const void* const src[] = {slot(1), slot(3)};
  void* const second[] = {slot(20), slot(21)};
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(pages, first);
  batch->CopyIn(src, pages);
  batch->CopyOut(pages, second);
  ASSERT_TRUE(batch->Wait().ok());
  EXPECT_EQ(Mismatch(slot(10), 5, 4), "");
  EXPECT_EQ(Mismatch(slot(11), 5, 5), "");
  EXPECT_EQ(Mismatch(slot(20), 6, 77), "");
  EXPECT_EQ(Mismatch(slot(21), 6, 78), "");
  EXPECT_EQ(PageMismatch(4, 6, 77), "");
  EXPECT_EQ(PageMismatch(5, 6, 78), "");
}

TEST_F(CudaPageCopierTest, BadPageIdCopiesNothingOfThatCall) {
  StoreAll(7);
  std::memset(slot(0), 0xab, 2 * kPageBytes);
  const uint64_t out[] = {1, kPages};
  void* const dst[] = {slot(0), slot(1)};
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(out, dst);
  absl::Status s = batch->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("page " + std::to_string(kPages) + " "),
            std::string::npos)
      << s;
  for (uint64_t i = 0; i < 2 * kPageBytes; ++i) {
    ASSERT_EQ(static_cast<unsigned char>(slot(0)[i]), 0xab) << i;
  }
  Fill(slot(2), 8, 0);
  const uint64_t in[] = {6, kPages + 100};
  const void* const src[] = {slot(2), slot(2)};
  batch->CopyIn(src, in);
  s = batch->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(PageMismatch(6, 7, 6), "");
  // The batch still copies afterwards.
  const uint64_t good[] = {6};
  batch->CopyIn(absl::MakeConstSpan(src, 1), good);
  EXPECT_TRUE(batch->Wait().ok());
  EXPECT_EQ(PageMismatch(6, 8, 0), "");
}

// Two threads, each with its own batches (and so its own stream), move
// disjoint pages at once; batches are made and dropped repeatedly so the
// stream pool hands streams back and forth.
TEST_F(CudaPageCopierTest, TwoThreadsWithTheirOwnBatches) {
  StoreAll(9);
  constexpr uint64_t kHalf = kPages / 2;
  std::string errors[2];
  auto work = [&](int t) {
    const uint64_t first_page = t * kHalf;
    char* mine = slot(t * kHalf);             // pages are copied out here
    char* theirs = slot(kPages + t * kHalf);  // and copied in from here
    for (int round = 0; round < 20; ++round) {
      std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
      std::vector<uint64_t> pages;
      std::vector<void*> dst;
      std::vector<const void*> src;
      for (uint64_t i = 0; i < kHalf; ++i) {
        // Page order rotates each round; slots follow the pages.
        const uint64_t p = first_page + (i + round) % kHalf;
        pages.push_back(p);
        dst.push_back(mine + (p - first_page) * kPageBytes);
        src.push_back(theirs + (p - first_page) * kPageBytes);
      }
      batch->CopyOut(pages, dst);
      batch->CopyIn(src, pages);
      absl::Status s = batch->Wait();
      if (!s.ok()) {
        errors[t] = s.ToString();
        return;
      }
      for (uint64_t i = 0; i < kHalf; ++i) {
        const uint64_t p = first_page + i;
        // Round r copies out what round r - 1 copied in; the theirs slots
        // hold pattern 100 + r during round r.
        const uint64_t seed = round == 0 ? 9 : 100 + round - 1;
        std::string m = Mismatch(mine + i * kPageBytes, seed, p);
        if (!m.empty()) {
          errors[t] = "round " + std::to_string(round) + " page " +
                      std::to_string(p) + ": " + m;
          return;
        }
      }
      for (uint64_t i = 0; i < kHalf; ++i) {
        Fill(theirs + i * kPageBytes, 100 + round + 1, first_page + i);
      }
    }
  };
  for (int t = 0; t < 2; ++t) {
    for (uint64_t i = 0; i < kHalf; ++i) {
      Fill(slot(kPages + t * kHalf + i), 100, t * kHalf + i);
    }
  }
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (uint64_t p = 0; p < kPages; ++p) {
    EXPECT_EQ(PageMismatch(p, 100 + 19, p), "") << "page " << p;
  }
}

}  // namespace
}  // namespace radixkv::gpu
