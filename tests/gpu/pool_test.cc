// Tests of gpu/pool.h (ParsePoolSpec, FormatPoolSpec, CreatePagePool) and
// the in-process side of gpu/mapped_pool.h.
#include "gpu/pool.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/mapped_pool.h"
#include "gtest/gtest.h"

namespace radixkv::gpu {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

PoolSpec Parse(const std::string& text) {
  absl::StatusOr<PoolSpec> spec = ParsePoolSpec(text);
  EXPECT_TRUE(spec.ok()) << text << ": " << spec.status();
  return spec.ok() ? *spec : PoolSpec{};
}

std::string ParseError(const std::string& text) {
  absl::StatusOr<PoolSpec> spec = ParsePoolSpec(text);
  EXPECT_FALSE(spec.ok()) << text;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(spec.status().message());
}

TEST(ParsePoolSpecTest, AcceptsTheDocumentedForms) {
  PoolSpec host = Parse("host,bytes=1GiB");
  EXPECT_EQ(host.backend, Backend::kHost);
  EXPECT_EQ(host.bytes, uint64_t{1} << 30);

  PoolSpec cuda = Parse("cuda,device=3,bytes=60GiB");
  EXPECT_EQ(cuda.backend, Backend::kCuda);
  EXPECT_EQ(cuda.device, 3);
  EXPECT_EQ(cuda.bytes, uint64_t{60} << 30);

  PoolSpec none = Parse("none,pages=100000");
  EXPECT_EQ(none.backend, Backend::kNone);
  EXPECT_EQ(none.pages, 100000u);
}

// The operator may fix the page size for every namespace (any backend); it
// round-trips through FormatPoolSpec and cannot exceed the pool.
TEST(ParsePoolSpecTest, PageBytesIsTheOperatorsChoice) {
  PoolSpec host = Parse("host,bytes=1GiB,page_bytes=768KiB");
  EXPECT_EQ(host.page_bytes, uint64_t{768} << 10);
  EXPECT_EQ(FormatPoolSpec(host), "host,bytes=1GiB,page_bytes=768KiB");
  EXPECT_EQ(Parse("none,pages=8,page_bytes=128").page_bytes, 128u);
  EXPECT_EQ(Parse("host,bytes=1GiB").page_bytes, 0u);  // the first namespace's
  for (const char* bad : {"host,bytes=1MiB,page_bytes=2MiB",
                          "host,bytes=1GiB,page_bytes=0",
                          "host,bytes=1GiB,page_bytes=x",
                          "host,bytes=1GiB,page_bytes=1,page_bytes=2"}) {
    absl::StatusOr<PoolSpec> spec = ParsePoolSpec(bad);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(spec.status().message().find("page_bytes"), std::string::npos)
        << spec.status();
  }
}

TEST(ParsePoolSpecTest, SizeUnits) {
  EXPECT_EQ(Parse("host,bytes=4096").bytes, 4096u);
  EXPECT_EQ(Parse("host,bytes=7B").bytes, 7u);
  EXPECT_EQ(Parse("host,bytes=2KiB").bytes, 2048u);
  EXPECT_EQ(Parse("host,bytes=3MiB").bytes, 3 * kMiB);
  EXPECT_EQ(Parse("host,bytes=1TiB").bytes, uint64_t{1} << 40);
  EXPECT_EQ(Parse("host,bytes=5KB").bytes, 5000u);
  EXPECT_EQ(Parse("host,bytes=2MB").bytes, 2000000u);
  EXPECT_EQ(Parse("host,bytes=1GB").bytes, 1000000000u);
  EXPECT_EQ(Parse("host,bytes=1gib").bytes, uint64_t{1} << 30);
  PoolSpec chunked = Parse("host,bytes=64MiB,chunk_bytes=8MiB");
  EXPECT_EQ(chunked.chunk_bytes, 8 * kMiB);
  EXPECT_EQ(Parse("host").bytes, uint64_t{1} << 30);  // default budget
}

TEST(ParsePoolSpecTest, RejectsBadSpecsWithClearMessages) {
  constexpr char kForms[] =
      "; accepted forms: host,bytes=SIZE | cuda,device=N,bytes=SIZE | "
      "none,pages=N (host and cuda also take chunk_bytes=SIZE, every form "
      "page_bytes=SIZE)";
  EXPECT_EQ(ParseError("gpu,bytes=1GiB"),
            absl::StrCat("--pool: unknown backend 'gpu'", kForms));
  EXPECT_EQ(ParseError(""), absl::StrCat("--pool: unknown backend ''", kForms));
  EXPECT_NE(
      ParseError("host,bytes=1.5GiB").find("bytes='1.5GiB' is not a size"),
      std::string::npos);
  EXPECT_NE(ParseError("host,bytes=1XB").find("bytes='1XB'"),
            std::string::npos);
  EXPECT_NE(ParseError("host,bytes=").find("bytes=''"), std::string::npos);
  EXPECT_NE(ParseError("host,bytes=0").find("bytes=0"), std::string::npos);
  EXPECT_NE(ParseError("host,bytes=99999999999999999999TiB").find("not a size"),
            std::string::npos);
  EXPECT_NE(ParseError("host,bytes=1GiB,bytes=2GiB").find("given twice"),
            std::string::npos);
  EXPECT_NE(ParseError("host,pages=10").find("pages= applies only to none"),
            std::string::npos);
  EXPECT_NE(ParseError("host,device=0").find("device= applies only to cuda"),
            std::string::npos);
  EXPECT_NE(ParseError("cuda,device=-1").find("device='-1'"),
            std::string::npos);
  EXPECT_NE(ParseError("none").find("none needs pages=N"), std::string::npos);
  EXPECT_NE(ParseError("none,pages=0").find("pages='0'"), std::string::npos);
  EXPECT_NE(ParseError("none,pages=99999999999").find("1..4294967294"),
            std::string::npos);
  EXPECT_NE(ParseError("none,bytes=1GiB").find("does not apply to none"),
            std::string::npos);
  EXPECT_NE(ParseError("host,color=blue").find("unknown key 'color'"),
            std::string::npos);
  EXPECT_NE(ParseError("host,bytes").find("not key=value"), std::string::npos);
}

TEST(ParsePoolSpecTest, FormatRoundTrips) {
  for (const char* text :
       {"host,bytes=1GiB", "cuda,device=1,bytes=60GiB", "none,pages=100000",
        "host,bytes=12345", "host,bytes=64MiB,chunk_bytes=8MiB"}) {
    EXPECT_EQ(FormatPoolSpec(Parse(text)), text);
  }
}

TEST(CreatePagePoolTest, NonePoolHasCapacityButNoMemory) {
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      CreatePagePool(Parse("none,pages=1000"), 12345);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->backend(), Backend::kNone);
  EXPECT_EQ((*pool)->capacity_pages(), 1000u);
  EXPECT_EQ((*pool)->page_bytes(), 0u);
  EXPECT_EQ((*pool)->chunk_count(), 0u);
  EXPECT_EQ((*pool)->host_page_address(0), nullptr);
  EXPECT_FALSE(MappedPool::MapLocal(**pool).ok());
}

TEST(CreatePagePoolTest, HostCapacityAndChunking) {
  // 10 MiB budget, 3000-byte pages, 1 MiB chunks: floor(10 MiB / 3000) =
  // 3495 pages, 349 pages per chunk, ceil(3495 / 349) = 11 chunks, the last
  // one holding 5 pages.
  PoolSpec spec = Parse("host,bytes=10MiB,chunk_bytes=1MiB");
  absl::StatusOr<std::unique_ptr<PagePool>> pool = CreatePagePool(spec, 3000);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const PagePool& p = **pool;
  EXPECT_EQ(p.backend(), Backend::kHost);
  EXPECT_EQ(p.page_bytes(), 3000u);
  EXPECT_EQ(p.capacity_pages(), 3495u);
  EXPECT_EQ(p.pages_per_chunk(), 349u);
  ASSERT_EQ(p.chunk_count(), 11u);
  EXPECT_EQ(p.device(), -1);
  for (size_t c = 0; c < 10; ++c) EXPECT_EQ(p.chunk_bytes(c), 349u * 3000u);
  EXPECT_EQ(p.chunk_bytes(10), 5u * 3000u);
  for (size_t c = 0; c < p.chunk_count(); ++c) {
    EXPECT_GE(p.chunk_fd(c), 0);
    // Close-on-exec, so the fds never leak into children the daemon spawns.
    EXPECT_TRUE(::fcntl(p.chunk_fd(c), F_GETFD) & FD_CLOEXEC);
    // Sealed: no process holding the fd can shrink a chunk under the others.
    EXPECT_NE(::ftruncate(p.chunk_fd(c), 0), 0);
  }
  EXPECT_EQ(p.chunk_fd(11), -1);

  // Page p is in chunk p / 349 at offset (p % 349) * 3000.
  char* first = static_cast<char*>(p.host_page_address(0));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(static_cast<char*>(p.host_page_address(348)), first + 348 * 3000);
  EXPECT_EQ(p.host_page_address(3495), nullptr);
  // Every page is writable and distinct.
  for (uint64_t page = 0; page < p.capacity_pages(); ++page) {
    std::memset(p.host_page_address(page), static_cast<int>(page % 251), 3000);
  }
  for (uint64_t page = 0; page < p.capacity_pages(); page += 97) {
    const unsigned char* b =
        static_cast<const unsigned char*>(p.host_page_address(page));
    EXPECT_EQ(b[0], page % 251);
    EXPECT_EQ(b[2999], page % 251);
  }
}

TEST(CreatePagePoolTest, DefaultChunkIs256MiBAndPagesLargerThanAChunkGetOne) {
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      CreatePagePool(Parse("host,bytes=600MiB"), kMiB);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->capacity_pages(), 600u);
  EXPECT_EQ((*pool)->pages_per_chunk(), 256u);
  EXPECT_EQ((*pool)->chunk_count(), 3u);
  EXPECT_EQ((*pool)->chunk_bytes(2), 88 * kMiB);

  pool = CreatePagePool(Parse("host,bytes=8MiB,chunk_bytes=1MiB"), 3 * kMiB);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->capacity_pages(), 2u);
  EXPECT_EQ((*pool)->pages_per_chunk(), 1u);
  EXPECT_EQ((*pool)->chunk_count(), 2u);
}

TEST(CreatePagePoolTest, BadSizesAreInvalidArgumentNamingBothSizes) {
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      CreatePagePool(Parse("host,bytes=1MiB"), 2 * kMiB);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("page_bytes=2097152"),
            std::string::npos);
  EXPECT_NE(pool.status().message().find("bytes=1048576"), std::string::npos);

  pool = CreatePagePool(Parse("host,bytes=1MiB"), 0);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);

  // 254 chunks would not fit in one attach message.
  pool = CreatePagePool(Parse("host,bytes=254KiB,chunk_bytes=1KiB"), 1024);
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("raise chunk_bytes"),
            std::string::npos);
}

TEST(CreatePagePoolTest, CudaWithoutDeviceIsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      CreatePagePool(Parse("cuda,device=0,bytes=64MiB"), kMiB);
  if (pool.ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition)
      << pool.status();
  EXPECT_NE(pool.status().message().find("cuda pool"), std::string::npos);
}

TEST(MappedPoolTest, MapLocalSeesTheDaemonsBytes) {
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      CreatePagePool(Parse("host,bytes=1MiB,chunk_bytes=64KiB"), 4096);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<std::unique_ptr<MappedPool>> mapped =
      MappedPool::MapLocal(**pool);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const MappedPool& m = **mapped;
  EXPECT_EQ(m.backend(), Backend::kHost);
  EXPECT_EQ(m.capacity_pages(), 256u);
  EXPECT_EQ(m.page_bytes(), 4096u);
  EXPECT_EQ(m.pages_per_chunk(), 16u);
  EXPECT_EQ(m.page_address(256), nullptr);
  for (uint64_t page : {0u, 15u, 16u, 200u, 255u}) {
    // A different virtual address, the same memory.
    EXPECT_NE(m.page_address(page), (*pool)->host_page_address(page));
    std::memset(m.page_address(page), 0x40 + static_cast<int>(page % 64), 4096);
    const char* daemon_view =
        static_cast<const char*>((*pool)->host_page_address(page));
    EXPECT_EQ(daemon_view[4095], 0x40 + static_cast<int>(page % 64));
  }
  // The mapping outlives the pool object (the daemon going away).
  char* page7 = static_cast<char*>(m.page_address(7));
  std::memcpy(page7, "persist", 8);
  pool->reset();
  EXPECT_STREQ(page7, "persist");
}

TEST(MappedPoolTest, RejectsInconsistentLayouts) {
  PoolLayout layout;
  layout.backend = Backend::kHost;
  layout.page_bytes = 4096;
  layout.pages_per_chunk = 4;
  layout.capacity_pages = 10;
  layout.chunk_bytes = {16384, 16384, 8192};
  EXPECT_TRUE(ValidatePoolLayout(layout, 3).ok());
  EXPECT_FALSE(ValidatePoolLayout(layout, 2).ok());  // fd count
  PoolLayout short_chunk = layout;
  short_chunk.chunk_bytes[2] = 4096;  // needs 2 pages
  absl::Status s = ValidatePoolLayout(short_chunk, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunks[2].bytes=4096"), std::string::npos) << s;
  PoolLayout missing = layout;
  missing.chunk_bytes.pop_back();
  EXPECT_FALSE(ValidatePoolLayout(missing, 2).ok());
  PoolLayout none = layout;
  none.backend = Backend::kNone;
  EXPECT_FALSE(ValidatePoolLayout(none, 3).ok());
  PoolLayout zero = layout;
  zero.page_bytes = 0;
  EXPECT_FALSE(ValidatePoolLayout(zero, 3).ok());
}

TEST(MappedPoolTest, RefusesAnFdSmallerThanItsChunk) {
  // A 4 KiB memfd presented as a 16 KiB chunk: mapping it would turn reads
  // past 4 KiB into SIGBUS, so Map must refuse.
  absl::StatusOr<UniqueFd> fd = CreateMemfd("small", 4096);
  ASSERT_TRUE(fd.ok()) << fd.status();
  PoolLayout layout;
  layout.backend = Backend::kHost;
  layout.page_bytes = 4096;
  layout.pages_per_chunk = 4;
  layout.capacity_pages = 4;
  layout.chunk_bytes = {16384};
  std::vector<UniqueFd> fds;
  fds.push_back(*std::move(fd));
  absl::StatusOr<std::unique_ptr<MappedPool>> m =
      MappedPool::Map(layout, std::move(fds));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("fewer than chunks[0].bytes=16384"),
            std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace radixkv::gpu
