// Tests of gpu/page_copier.h on the host backend (no device needed): copies
// out of and into a host pool, order within a batch, bad page ids, host
// memory (AllocateHost, AllocateHostMemory), and the none pool's refusal.
#include "gpu/page_copier.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu/pool.h"
#include "gtest/gtest.h"

namespace radixkv::gpu {
namespace {

constexpr uint64_t kPageBytes = 8192;
constexpr uint64_t kPages = 16;

// A byte of page `page`'s pattern `seed` at offset `i`.
unsigned char PatternByte(uint64_t seed, uint64_t page, uint64_t i) {
  return static_cast<unsigned char>((seed * 131 + page * 31 + i * 7) ^
                                    (i >> 8));
}

void Fill(void* dst, uint64_t seed, uint64_t page) {
  auto* p = static_cast<unsigned char*>(dst);
  for (uint64_t i = 0; i < kPageBytes; ++i) p[i] = PatternByte(seed, page, i);
}

bool Holds(const void* src, uint64_t seed, uint64_t page) {
  const auto* p = static_cast<const unsigned char*>(src);
  for (uint64_t i = 0; i < kPageBytes; ++i) {
    if (p[i] != PatternByte(seed, page, i)) return false;
  }
  return true;
}

class HostPageCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PoolSpec spec;
    spec.backend = Backend::kHost;
    spec.bytes = kPages * kPageBytes;
    spec.chunk_bytes = 4 * kPageBytes;  // several chunks
    absl::StatusOr<std::unique_ptr<PagePool>> pool =
        CreatePagePool(spec, kPageBytes);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    ASSERT_EQ(pool_->capacity_pages(), kPages);
    ASSERT_GT(pool_->chunk_count(), 1u);
    absl::StatusOr<std::unique_ptr<PageCopier>> copier =
        CreatePageCopier(*pool_);
    ASSERT_TRUE(copier.ok()) << copier.status();
    copier_ = *std::move(copier);
    absl::StatusOr<std::unique_ptr<HostMemory>> mem =
        copier_->AllocateHost(kPages * kPageBytes);
    ASSERT_TRUE(mem.ok()) << mem.status();
    host_ = *std::move(mem);
  }

  void* page(uint64_t p) const { return pool_->host_page_address(p); }
  char* slot(uint64_t s) const { return host_->data() + s * kPageBytes; }

  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PageCopier> copier_;
  std::unique_ptr<HostMemory> host_;
};

TEST_F(HostPageCopierTest, DescribesItself) {
  EXPECT_EQ(copier_->backend(), Backend::kHost);
  EXPECT_EQ(copier_->page_bytes(), kPageBytes);
}

TEST_F(HostPageCopierTest, RoundTripsPagesThroughHostMemory) {
  for (uint64_t p = 0; p < kPages; ++p) Fill(page(p), 1, p);
  // Scattered pages into consecutive slots, crossing chunk boundaries.
  const std::vector<uint64_t> out = {13, 2, 3, 4, 0, 9, 15};
  std::vector<void*> dst;
  for (size_t i = 0; i < out.size(); ++i) dst.push_back(slot(i));
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(out, dst);
  ASSERT_TRUE(batch->Wait().ok());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(Holds(slot(i), 1, out[i])) << "slot " << i;
  }

  // Back into other pages, in another order; the batch is reused.
  const std::vector<uint64_t> in = {7, 8, 1, 14, 5, 6, 10};
  std::vector<const void*> src;
  for (size_t i = 0; i < in.size(); ++i) {
    src.push_back(slot(out.size() - 1 - i));
  }
  batch->CopyIn(src, in);
  ASSERT_TRUE(batch->Wait().ok());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_TRUE(Holds(page(in[i]), 1, out[out.size() - 1 - i]))
        << "page " << in[i];
  }
  // Pages no copy named keep their bytes.
  for (uint64_t p : {11, 12}) EXPECT_TRUE(Holds(page(p), 1, p)) << p;
}

TEST_F(HostPageCopierTest, CopiesOfOneBatchRunInOrder) {
  Fill(page(3), 2, 3);
  Fill(slot(1), 3, 99);
  const uint64_t pages[] = {3};
  void* const dst[] = {slot(0)};
  const void* const src[] = {slot(1)};
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(pages, dst);  // the old bytes first ...
  batch->CopyIn(src, pages);   // ... then the page is overwritten
  ASSERT_TRUE(batch->Wait().ok());
  EXPECT_TRUE(Holds(slot(0), 2, 3));
  EXPECT_TRUE(Holds(page(3), 3, 99));
}

TEST_F(HostPageCopierTest, BadPageIdCopiesNothingOfThatCall) {
  for (uint64_t p = 0; p < kPages; ++p) Fill(page(p), 4, p);
  std::memset(slot(0), 0xab, 2 * kPageBytes);
  const std::vector<uint64_t> out = {1, kPages + 5};
  std::vector<void*> dst = {slot(0), slot(1)};
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(out, dst);
  absl::Status s = batch->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(std::to_string(kPages + 5)), std::string::npos)
      << s;
  EXPECT_NE(s.message().find(std::to_string(kPages)), std::string::npos) << s;
  for (uint64_t i = 0; i < 2 * kPageBytes; ++i) {
    ASSERT_EQ(static_cast<unsigned char>(slot(0)[i]), 0xab) << i;
  }

  // CopyIn likewise; the first error is the one reported, and Wait clears it.
  Fill(slot(0), 5, 0);
  const std::vector<uint64_t> in = {2, kPages};
  std::vector<const void*> src = {slot(0), slot(0)};
  batch->CopyIn(src, in);
  batch->CopyOut(out, dst);
  s = batch->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("page " + std::to_string(kPages) + " "),
            std::string::npos)
      << s;
  EXPECT_TRUE(Holds(page(2), 4, 2));
  EXPECT_TRUE(batch->Wait().ok());

  // A later good call of the same batch copies.
  const uint64_t good[] = {2};
  const void* const good_src[] = {slot(0)};
  batch->CopyIn(good_src, good);
  EXPECT_TRUE(batch->Wait().ok());
  EXPECT_TRUE(Holds(page(2), 5, 0));
}

TEST_F(HostPageCopierTest, EmptyCallsCopyNothing) {
  std::unique_ptr<PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut({}, {});
  batch->CopyIn({}, {});
  EXPECT_TRUE(batch->Wait().ok());
}

TEST_F(HostPageCopierTest, AllocateHostIsWritableAndNotPinned) {
  constexpr uint64_t kBytes = (uint64_t{3} << 20) + 123;
  absl::StatusOr<std::unique_ptr<HostMemory>> mem =
      copier_->AllocateHost(kBytes);
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ((*mem)->bytes(), kBytes);
  EXPECT_FALSE((*mem)->pinned());
  ASSERT_NE((*mem)->data(), nullptr);
  std::memset((*mem)->data(), 0x5c, kBytes);  // writable to the end
  EXPECT_EQ(static_cast<unsigned char>((*mem)->data()[kBytes - 1]), 0x5c);
}

TEST_F(HostPageCopierTest, AllocateHostOfNothingIsInvalid) {
  absl::StatusOr<std::unique_ptr<HostMemory>> mem = copier_->AllocateHost(0);
  ASSERT_FALSE(mem.ok());
  EXPECT_EQ(mem.status().code(), absl::StatusCode::kInvalidArgument)
      << mem.status();
}

// More than the machine has is a configuration error (radixkvd exits 2),
// worded in units people read.
TEST_F(HostPageCopierTest, AllocateHostBeyondTheMachineIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<HostMemory>> mem =
      copier_->AllocateHost(uint64_t{1} << 62);
  ASSERT_FALSE(mem.ok());
  EXPECT_EQ(mem.status().code(), absl::StatusCode::kInvalidArgument)
      << mem.status();
  EXPECT_NE(mem.status().message().find("host memory: 4 EiB asked for, the "
                                        "machine has "),
            std::string::npos)
      << mem.status();
  EXPECT_EQ(mem.status().message().find(std::to_string(uint64_t{1} << 62)),
            std::string::npos)
      << mem.status();
}

TEST(AllocateHostMemoryTest, PerBackend) {
  absl::StatusOr<std::unique_ptr<HostMemory>> host =
      AllocateHostMemory(Backend::kHost, -1, 1 << 20);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_FALSE((*host)->pinned());
  EXPECT_EQ((*host)->bytes(), 1u << 20);

  absl::StatusOr<std::unique_ptr<HostMemory>> none =
      AllocateHostMemory(Backend::kNone, -1, 1 << 20);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument)
      << none.status();

#ifndef RADIXKV_GPU_WITH_CUDA
  absl::StatusOr<std::unique_ptr<HostMemory>> cuda =
      AllocateHostMemory(Backend::kCuda, 0, 1 << 20);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition)
      << cuda.status();
  EXPECT_NE(cuda.status().message().find("without CUDA"), std::string::npos)
      << cuda.status();
#endif
}

TEST(PageCopierTest, NonePoolIsRefused) {
  PoolSpec spec;
  spec.backend = Backend::kNone;
  spec.pages = 8;
  absl::StatusOr<std::unique_ptr<PagePool>> pool = CreatePagePool(spec, 0);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<std::unique_ptr<PageCopier>> copier =
      CreatePageCopier(**pool);
  ASSERT_FALSE(copier.ok());
  EXPECT_EQ(copier.status().code(), absl::StatusCode::kInvalidArgument)
      << copier.status();
  EXPECT_NE(copier.status().message().find("none"), std::string::npos)
      << copier.status();
}

}  // namespace
}  // namespace radixkv::gpu
