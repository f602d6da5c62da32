// CPU write_kv / read_kv / copy_pages: exact placement against independent
// index math, fp32 and fp16 element sizes, argument errors that change
// nothing.
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu/kv_ops.h"
#include "gtest/gtest.h"
#include "tests/gpu/kernels_test_util.h"

namespace radixkv::gpu {
namespace {

using testing::HostPool;
using testing::ShuffledIds;

// Source element (layer, token, head, dim) of a recognisable pattern:
// distinct for every coordinate and for K vs V.
template <typename T>
T Pattern(uint32_t kv, uint32_t l, uint32_t t, uint32_t h, uint32_t d) {
  return static_cast<T>(1 + kv * 40000 + l * 7001 + t * 97 + h * 13 + d);
}

template <typename T>
struct Source {
  Source(const PageGeometry& g, uint32_t n, uint32_t stride) : geom(g) {
    const size_t per_layer = size_t{stride} * g.num_kv_heads * g.head_dim;
    k.assign(per_layer * g.num_layers, T{});
    v.assign(per_layer * g.num_layers, T{});
    for (uint32_t l = 0; l < g.num_layers; ++l)
      for (uint32_t t = 0; t < n; ++t)
        for (uint32_t h = 0; h < g.num_kv_heads; ++h)
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const size_t i =
                ((size_t{l} * stride + t) * g.num_kv_heads + h) * g.head_dim + d;
            k[i] = Pattern<T>(0, l, t, h, d);
            v[i] = Pattern<T>(1, l, t, h, d);
          }
  }
  PageGeometry geom;
  std::vector<T> k, v;
};

// Reads element (layer, kv, head, slot, dim) of a page with the layout
// spelled out by hand (page -> layer -> {K,V} -> head -> slot -> dim).
template <typename T>
T ReadPage(const uint8_t* page, const PageGeometry& g, uint32_t l, uint32_t kv,
           uint32_t h, uint32_t s, uint32_t d) {
  const size_t idx =
      ((((size_t{l} * 2 + kv) * g.num_kv_heads + h) * g.page_size + s) *
       g.head_dim) + d;
  T x;
  std::memcpy(&x, page + idx * sizeof(T), sizeof(T));
  return x;
}

template <typename T>
void CheckPlacement(HostPool& pool, const std::vector<uint64_t>& ids,
                    uint32_t n_tokens) {
  const PageGeometry& g = pool.geom;
  for (uint32_t t = 0; t < n_tokens; ++t) {
    const uint8_t* page = pool.page(ids[t / g.page_size]);
    const uint32_t slot = t % g.page_size;
    for (uint32_t l = 0; l < g.num_layers; ++l)
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint32_t h = 0; h < g.num_kv_heads; ++h)
          for (uint32_t d = 0; d < g.head_dim; ++d)
            ASSERT_EQ(ReadPage<T>(page, g, l, kv, h, slot, d),
                      Pattern<T>(kv, l, t, h, d))
                << "t=" << t << " l=" << l << " kv=" << kv << " h=" << h
                << " d=" << d;
  }
}

TEST(WriteKvTest, Fp32FullBlocksLandAtGeometryOffsets) {
  const PageGeometry g{3, 2, 4, 8, 4};
  HostPool pool(g, 16);
  const uint32_t n = 12;  // 3 full blocks
  Source<float> src(g, n, n);
  const std::vector<uint64_t> ids = ShuffledIds(3, 16, 1);
  ASSERT_TRUE(WriteKv(g, KvSource{src.k.data(), src.v.data(), n, 0},
                      pool.data_base(), 16, ids)
                  .ok());
  CheckPlacement<float>(pool, ids, n);
}

TEST(WriteKvTest, Fp16PartialLastPageLeavesOtherSlotsUntouched) {
  const PageGeometry g{2, 3, 5, 6, 2};
  HostPool pool(g, 8, 0xCD);
  const uint32_t n = 13;  // 2 full pages + 3 slots of a third
  Source<uint16_t> src(g, n, n);
  const std::vector<uint64_t> ids = {5, 0, 7};
  auto addrs = pool.Addresses(ids);
  ASSERT_TRUE(WriteKv(g, KvSource{src.k.data(), src.v.data(), n, 0}, addrs).ok());
  CheckPlacement<uint16_t>(pool, ids, n);
  // Slots 3 and 4 of the last page keep the fill pattern.
  const uint8_t* last = pool.page(7);
  for (uint32_t l = 0; l < g.num_layers; ++l)
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t h = 0; h < g.num_kv_heads; ++h)
        for (uint32_t s = 3; s < 5; ++s)
          EXPECT_EQ(ReadPage<uint16_t>(last, g, l, kv, h, s, 0), 0xCDCD);
  // Pages not named are untouched.
  for (uint64_t p : {1, 2, 3, 4, 6}) {
    for (uint64_t b = 0; b < g.page_bytes(); ++b) {
      ASSERT_EQ(pool.page(p)[b], 0xCD) << "page " << p;
    }
  }
}

TEST(WriteKvTest, LayerStrideSelectsAWindowOfALargerCache) {
  const PageGeometry g{2, 2, 4, 4, 4};
  HostPool pool(g, 4);
  // A cache sized for 20 tokens per layer; write its first 8.
  Source<float> src(g, 20, 20);
  const std::vector<uint64_t> ids = {2, 1};
  ASSERT_TRUE(WriteKv(g, KvSource{src.k.data(), src.v.data(), 8, 20},
                      pool.data_base(), 4, ids)
                  .ok());
  CheckPlacement<float>(pool, ids, 8);
}

TEST(WriteKvTest, ReadKvRoundTrips) {
  const PageGeometry g{2, 2, 4, 8, 4};
  HostPool pool(g, 6);
  const uint32_t n = 10;
  Source<float> src(g, n, n);
  const std::vector<uint64_t> ids = {4, 1, 3};
  ASSERT_TRUE(WriteKv(g, KvSource{src.k.data(), src.v.data(), n, 0},
                      pool.data_base(), 6, ids)
                  .ok());
  std::vector<float> k(src.k.size(), -1), v(src.v.size(), -1);
  auto addrs = pool.ConstAddresses(ids);
  ASSERT_TRUE(ReadKv(g, addrs, KvDest{k.data(), v.data(), n, 0}).ok());
  EXPECT_EQ(k, src.k);
  EXPECT_EQ(v, src.v);
}

TEST(WriteKvTest, LargeInputUsesThreadsAndStaysExact) {
  // > 1 MiB so ParallelFor splits the work.
  const PageGeometry g{4, 4, 16, 64, 4};
  HostPool pool(g, 40);
  const uint32_t n = 16 * 32;
  Source<float> src(g, n, n);
  const std::vector<uint64_t> ids = ShuffledIds(32, 40, 9);
  ASSERT_TRUE(WriteKv(g, KvSource{src.k.data(), src.v.data(), n, 0},
                      pool.data_base(), 40, ids)
                  .ok());
  CheckPlacement<float>(pool, ids, n);
}

TEST(WriteKvTest, BadArgumentsNameTheFieldAndWriteNothing) {
  const PageGeometry g{2, 2, 4, 4, 4};
  HostPool pool(g, 4, 0x11);
  Source<float> src(g, 8, 8);
  const std::vector<uint8_t> before = pool.bytes;
  const KvSource ok_src{src.k.data(), src.v.data(), 8, 0};

  absl::Status s = WriteKv(g, ok_src, pool.data_base(), 4, {0});  // 1 of 2 pages
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pages: 1 given, 2 needed"), std::string::npos)
      << s;
  s = WriteKv(g, ok_src, pool.data_base(), 4, {0, 4});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("page_ids[1] = 4"), std::string::npos) << s;
  s = WriteKv(g, KvSource{src.k.data(), src.v.data(), 8, 5}, pool.data_base(),
              4, {0, 1});
  EXPECT_NE(s.message().find("layer_stride_tokens"), std::string::npos) << s;
  s = WriteKv(g, KvSource{nullptr, src.v.data(), 8, 0}, pool.data_base(), 4,
              {0, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = WriteKv(PageGeometry{2, 0, 4, 4, 4}, ok_src, pool.data_base(), 4, {0, 1});
  EXPECT_NE(s.message().find("num_kv_heads=0"), std::string::npos) << s;
  std::vector<void*> addrs = {pool.page(0), nullptr};
  s = WriteKv(g, ok_src, addrs);
  EXPECT_NE(s.message().find("pages[1] is a null address"), std::string::npos)
      << s;
  EXPECT_EQ(pool.bytes, before);
}

TEST(CopyPagesTest, CopiesBetweenTwoPoolsExactly) {
  const PageGeometry g{2, 2, 4, 8, 2};
  HostPool a(g, 8), b(g, 5, 0);
  for (size_t i = 0; i < a.bytes.size(); ++i) a.bytes[i] = uint8_t(i * 31 + 7);
  const std::vector<uint64_t> src = {7, 0, 3}, dst = {1, 4, 0};
  ASSERT_TRUE(CopyPages(g.page_bytes(), a.data_base(), 8, src, b.data_base(), 5,
                        dst)
                  .ok());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(a.page(src[i]), b.page(dst[i]), g.page_bytes()));
  }
  for (uint64_t p : {2, 3}) {
    for (uint64_t x = 0; x < g.page_bytes(); ++x) ASSERT_EQ(b.page(p)[x], 0);
  }
}

TEST(CopyPagesTest, ManyPagesWithinOnePool) {
  const PageGeometry g{4, 2, 16, 32, 4};  // 32 KiB pages
  HostPool a(g, 128);
  for (size_t i = 0; i < a.bytes.size(); ++i) a.bytes[i] = uint8_t(i ^ (i >> 9));
  std::vector<uint64_t> src, dst;
  for (uint64_t i = 0; i < 64; ++i) {
    src.push_back(i);
    dst.push_back(127 - i);
  }
  const std::vector<uint8_t> orig = a.bytes;
  ASSERT_TRUE(CopyPages(g.page_bytes(), a.data_base(), 128, src, a.data_base(),
                        128, dst)
                  .ok());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(orig.data() + src[i] * g.page_bytes(),
                             a.page(dst[i]), g.page_bytes()));
  }
}

TEST(CopyPagesTest, BadArgumentsChangeNothing) {
  const PageGeometry g{1, 1, 4, 4, 4};
  HostPool a(g, 4, 1), b(g, 4, 2);
  const std::vector<uint8_t> before = b.bytes;
  absl::Status s =
      CopyPages(g.page_bytes(), a.data_base(), 4, {0, 1}, b.data_base(), 4, {0});
  EXPECT_NE(s.message().find("src_ids has 2 entries but dst_ids has 1"),
            std::string::npos)
      << s;
  s = CopyPages(g.page_bytes(), a.data_base(), 4, {0, 1}, b.data_base(), 4,
                {0, 9});
  EXPECT_NE(s.message().find("dst_ids[1] = 9"), std::string::npos) << s;
  s = CopyPages(0, a.data_base(), 4, {0}, b.data_base(), 4, {0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::vector<const void*> srcs = {a.page(0)};
  std::vector<void*> dsts = {a.page(0)};
  s = CopyPages(g.page_bytes(), srcs, dsts);
  EXPECT_NE(s.message().find("same page"), std::string::npos) << s;
  EXPECT_EQ(b.bytes, before);
}

TEST(CudaFallbackTest, DeviceCountIsNeverNegative) {
  EXPECT_GE(CudaKernelDeviceCount(), 0);
}

}  // namespace
}  // namespace radixkv::gpu
