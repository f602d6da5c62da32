// The reference worker with quantised KV pages (--kv-dtype): for every page
// dtype, a request whose prefix comes from the cache (pages written by an
// earlier request through write_kv, read back by attention) gives logits
// within the dtype's documented tolerance (KvDTypeTolerance) of a full fp32
// prefill, at a block boundary, a tail inside a page and a fully cached
// prompt; the dtype is part of the namespace, and the page size is the one
// docs/CONTRACTS.md §2.1 gives.
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "worker/engine.h"
#include "worker/model.h"
#include "worker/prefix_cache.h"
#include "gpu/namespace_geometry.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_test_util.h"

namespace radixkv::worker {
namespace {

class KvDTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ModelConfig c = *NamedModelConfig("tiny");
    c.kv_dtype = GetParam();
    auto m = Model::Create(c, Device::kCpu);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  RunResult Run(PrefixCache* cache, const std::vector<uint32_t>& prompt,
                uint32_t decode = 1) {
    Engine e(model_.get(), cache);
    RunOptions o;
    o.decode_tokens = decode;
    auto r = e.Run(prompt, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : RunResult{};
  }
  std::unique_ptr<Model> model_;
};

TEST_P(KvDTypeTest, CachedLogitsWithinTheDtypeTolerance) {
  const double tol = KvDTypeTolerance(GetParam());
  ASSERT_GT(tol, 0.0);
  std::unique_ptr<PrefixCache> none = NewNoPrefixCache();
  // cached prefix (tokens) -> prompt length: a page edge, a tail inside a
  // page, several blocks, and the fully cached prompt.
  const std::vector<std::pair<uint32_t, uint32_t>> cases = {
      {16, 40}, {64, 64 + 16}, {96, 100}, {160, 160}};
  for (const auto& [cached, n] : cases) {
    auto cache = NewLocalPrefixCache(model_->config().Namespace(), 64);
    ASSERT_TRUE(cache.ok()) << cache.status();
    const std::vector<uint32_t> prompt = Prompt(n, 512, cached * 7 + n);
    const std::vector<uint32_t> head(prompt.begin(), prompt.begin() + cached);
    Run(cache->get(), head);  // an earlier request commits the prefix blocks
    const RunResult want = Run(none.get(), prompt);
    const RunResult got = Run(cache->get(), prompt);
    EXPECT_EQ(got.matched_tokens, std::min(cached, n - 1)) << cached;
    const float diff = MaxAbsDiff(want.first_logits, got.first_logits);
    EXPECT_LE(diff, tol) << KvDTypeName(GetParam()) << " cached " << cached
                         << " of " << n;
    if (GetParam() != DType::kFloat32) {
      // Not vacuous: the quantised prefix changes the logits a little.
      EXPECT_GT(diff, 0.0f) << KvDTypeName(GetParam());
    }
  }
}

TEST_P(KvDTypeTest, PagesHaveTheNamespacePageSize) {
  const ModelConfig& c = model_->config();
  const NamespaceSpec ns = c.Namespace();
  EXPECT_EQ(ns.dtype, GetParam());
  EXPECT_EQ(NamespacePageBytes(ns), c.Geometry().page_bytes());
  const uint64_t elems = uint64_t{c.num_layers} * 2 * c.num_kv_heads *
                         c.page_size * c.head_dim;
  const uint64_t scales = uint64_t{c.num_layers} * 2 * c.num_kv_heads * 4;
  const bool scaled = GetParam() == DType::kFloat8E4M3 ||
                      GetParam() == DType::kFloat8E5M2 ||
                      GetParam() == DType::kInt8;
  EXPECT_EQ(NamespacePageBytes(ns),
            elems * DTypeBytes(GetParam()) + (scaled ? scales : 0));
  EXPECT_EQ(NamespaceScaleBytes(ns), scaled ? scales : 0);
  // fp32 keeps the v1 page size.
  if (GetParam() == DType::kFloat32) {
    EXPECT_EQ(NamespacePageBytes(ns), ns.PageBytes());
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypes, KvDTypeTest, ::testing::ValuesIn(AllKvDTypes()),
    [](const ::testing::TestParamInfo<DType>& info) {
      return std::string(KvDTypeName(info.param));
    });

TEST(KvDTypeNamespaceTest, TheDtypeIsPartOfTheNamespace) {
  std::set<std::string> roots;
  for (DType d : AllKvDTypes()) {
    ModelConfig c = *NamedModelConfig("tiny");
    c.kv_dtype = d;
    roots.insert(NamespaceRoot(c.Namespace()).ToHex());
  }
  EXPECT_EQ(roots.size(), AllKvDTypes().size());
}

TEST(KvDTypeNamespaceTest, NamesParseAndUnknownNamesAreRefused) {
  for (DType d : AllKvDTypes()) {
    auto parsed = ParseKvDType(KvDTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  auto bad = ParseKvDType("fp4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("fp8_e4m3"), std::string::npos);
  ModelConfig c = *NamedModelConfig("tiny");
  c.kv_dtype = DType::kUnspecified;
  EXPECT_FALSE(c.Validate().ok());
}

// A model of one dtype reading pages of another would misread them; the
// engine never gets there, because an in-process cache is bound to one
// namespace and a daemon keys blocks by namespace (worker_daemon_test).
TEST(KvDTypeNamespaceTest, LocalCachesOfTwoDtypesShareNothing) {
  ModelConfig c8 = *NamedModelConfig("tiny");
  c8.kv_dtype = DType::kFloat8E4M3;
  ModelConfig c16 = c8;
  c16.kv_dtype = DType::kFloat16;
  EXPECT_NE(NamespaceRoot(c8.Namespace()), NamespaceRoot(c16.Namespace()));
  EXPECT_NE(NamespacePageBytes(c8.Namespace()), NamespacePageBytes(c16.Namespace()));
}

}  // namespace
}  // namespace radixkv::worker
