// CPU attention_prefix_suffix against the naive double-precision reference
// (materialised softmax), over prefix lengths, suffix lengths, page sizes,
// GQA ratios, shuffled pages and decode-shaped calls; plus split invariance
// (cached prefix + suffix == attention over the whole sequence) and errors.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/attention.h"
#include "gpu/kv_ops.h"
#include "gtest/gtest.h"
#include "tests/gpu/kernels_test_util.h"

namespace radixkv::gpu {
namespace {

using testing::HostPool;
using testing::MaxAbsDiff;
using testing::NaiveAttention;
using testing::RandomFloats;
using testing::ShuffledIds;

struct Case {
  uint32_t hq, hkv, d, page_size, prefix, suffix, extra_local;
};

// Builds a pool holding `prefix` random tokens of K/V for 2 layers (the test
// reads layer 1), random local K/V and queries, and checks the kernel
// against the naive reference.
void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "hq=" << c.hq << " hkv=" << c.hkv << " d=" << c.d
               << " page=" << c.page_size << " P=" << c.prefix
               << " S=" << c.suffix << " extra=" << c.extra_local);
  const PageGeometry g{2, c.hkv, c.page_size, c.d, 4};
  const uint64_t n_pages = PagesForTokens(g, c.prefix);
  HostPool pool(g, n_pages + 3);
  const std::vector<uint64_t> ids = ShuffledIds(n_pages, n_pages + 3, seed);
  if (c.prefix > 0) {
    const auto pk = RandomFloats(size_t{2} * c.prefix * c.hkv * c.d, seed + 1);
    const auto pv = RandomFloats(pk.size(), seed + 2);
    ASSERT_TRUE(WriteKv(g, KvSource{pk.data(), pv.data(), c.prefix, 0},
                        pool.data_base(), pool.capacity, ids)
                    .ok());
  }
  const uint32_t T = c.suffix + c.extra_local;
  const auto q = RandomFloats(size_t{c.suffix} * c.hq * c.d, seed + 3, -2, 2);
  const auto k = RandomFloats(size_t{T} * c.hkv * c.d, seed + 4, -2, 2);
  const auto v = RandomFloats(k.size(), seed + 5);
  std::vector<float> out(q.size(), NAN);
  const AttentionShape shape{c.hq, c.hkv, c.d, 0.0f};
  const PrefixPages prefix{g, 1, c.prefix};
  const AttentionIo io{q.data(), c.suffix, k.data(), v.data(), T, out.data()};
  const auto pages = pool.ConstAddresses(ids);
  ASSERT_TRUE(AttentionPrefixSuffix(shape, prefix, pages, io).ok());
  const auto ref = NaiveAttention(shape, prefix, pages, io);
  EXPECT_LE(MaxAbsDiff(out, ref), 1e-5f);
}

TEST(AttentionCpuTest, MatchesNaiveReferenceAcrossShapes) {
  const std::vector<Case> cases = {
      {4, 2, 16, 16, 0, 1, 0},     // no prefix, one query
      {4, 2, 16, 16, 0, 37, 0},    // no prefix, plain causal prefill
      {4, 2, 16, 16, 16, 5, 0},    // exactly one block
      {4, 2, 16, 16, 64, 16, 0},   // boundary on a page edge
      {4, 2, 16, 16, 45, 9, 0},    // partial last prefix page
      {4, 4, 16, 16, 48, 20, 0},   // GQA ratio 1
      {8, 2, 32, 16, 80, 33, 0},   // GQA ratio 4
      {6, 3, 8, 3, 31, 7, 0},      // odd page size
      {2, 1, 64, 1, 20, 4, 0},     // page size 1
      {4, 2, 16, 64, 130, 70, 0},  // pages larger than a key block
      {4, 2, 16, 16, 32, 1, 11},   // decode step: local cache holds more
      {4, 1, 24, 8, 17, 3, 29},    // several queries at the end of a cache
  };
  uint32_t seed = 100;
  for (const Case& c : cases) RunCase(c, seed += 10);
}

TEST(AttentionCpuTest, RandomisedAgainstNaiveReference) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 30; ++trial) {
    const uint32_t hkv = 1 + rng() % 3;
    const uint32_t group = 1 + rng() % 4;
    const uint32_t d = 4 * (1 + rng() % 12);
    const uint32_t page = 1 + rng() % 20;
    const uint32_t prefix = rng() % 90;
    const uint32_t suffix = 1 + rng() % 40;
    const uint32_t extra = (rng() % 3 == 0) ? rng() % 20 : 0;
    RunCase(Case{hkv * group, hkv, d, page, prefix, suffix, extra}, 7000 + trial);
  }
}

// The cached path (prefix in pages + suffix queries) equals attention over
// the whole sequence computed with no prefix at all.
TEST(AttentionCpuTest, SplitInvariance) {
  const uint32_t hq = 8, hkv = 2, d = 32, page = 16, n = 100;
  const PageGeometry g{1, hkv, page, d, 4};
  const auto q = RandomFloats(size_t{n} * hq * d, 1, -2, 2);
  const auto k = RandomFloats(size_t{n} * hkv * d, 2, -2, 2);
  const auto v = RandomFloats(k.size(), 3);
  const AttentionShape shape{hq, hkv, d, 0.0f};
  std::vector<float> full(q.size());
  ASSERT_TRUE(AttentionPrefixSuffix(
                  shape, PrefixPages{g, 0, 0}, {},
                  AttentionIo{q.data(), n, k.data(), v.data(), n, full.data()})
                  .ok());
  for (uint32_t p : {16u, 48u, 64u, 96u}) {
    HostPool pool(g, 8);
    const auto ids = ShuffledIds(PagesForTokens(g, p), 8, p);
    ASSERT_TRUE(WriteKv(g, KvSource{k.data(), v.data(), p, 0}, pool.data_base(),
                        8, ids)
                    .ok());
    const uint32_t s = n - p;
    std::vector<float> out(size_t{s} * hq * d);
    const size_t qoff = size_t{p} * hq * d, koff = size_t{p} * hkv * d;
    ASSERT_TRUE(AttentionPrefixSuffix(
                    shape, PrefixPages{g, 0, p}, pool.ConstAddresses(ids),
                    AttentionIo{q.data() + qoff, s, k.data() + koff,
                                v.data() + koff, s, out.data()})
                    .ok());
    const std::vector<float> tail(full.begin() + qoff, full.end());
    EXPECT_LE(MaxAbsDiff(out, tail), 1e-5f) << "prefix " << p;
  }
}

TEST(AttentionCpuTest, FlopsCountVisibleKeys) {
  const AttentionShape shape{4, 2, 16, 0.0f};
  // 3 queries after 10 prefix tokens: they see 11, 12, 13 keys.
  EXPECT_DOUBLE_EQ(AttentionFlops(shape, 10, 3, 3), 4.0 * 4 * 16 * (11 + 12 + 13));
  // Decode step: 1 query at the end of 5 local tokens after 16 prefix ones.
  EXPECT_DOUBLE_EQ(AttentionFlops(shape, 16, 5, 1), 4.0 * 4 * 16 * 21);
}

TEST(AttentionCpuTest, BadArgumentsNameTheField) {
  const PageGeometry g{2, 2, 16, 16, 4};
  std::vector<float> q(4 * 16), k(2 * 2 * 16), v(k.size()), out(q.size(), 7.0f);
  const AttentionIo io{q.data(), 1, k.data(), v.data(), 2, out.data()};
  auto err = [&](AttentionShape s, PrefixPages p,
                 std::vector<const void*> pages, AttentionIo x) {
    return std::string(AttentionPrefixSuffix(s, p, pages, x).message());
  };
  EXPECT_NE(err({6, 4, 16}, {g, 0, 0}, {}, io).find("multiple of"),
            std::string::npos);
  EXPECT_NE(err({4, 2, 16}, {g, 0, 40}, {q.data()}, io).find("pages: 1 given, 3 needed"),
            std::string::npos);
  EXPECT_NE(err({4, 2, 16}, {g, 2, 4}, {q.data()}, io).find("prefix.layer"),
            std::string::npos);
  EXPECT_NE(err({4, 2, 32}, {g, 0, 4}, {q.data()}, io).find("does not match"),
            std::string::npos);
  PageGeometry g16 = g;
  g16.elem_bytes = 2;
  EXPECT_NE(err({4, 2, 16}, {g16, 0, 4}, {q.data()}, io).find("elem_bytes"),
            std::string::npos);
  AttentionIo bad = io;
  bad.local_tokens = 0;
  EXPECT_NE(err({4, 2, 16}, {g, 0, 0}, {}, bad).find("io.local_tokens"),
            std::string::npos);
  for (float x : out) EXPECT_EQ(x, 7.0f);
}

}  // namespace
}  // namespace radixkv::gpu
