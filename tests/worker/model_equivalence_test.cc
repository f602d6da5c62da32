// The point of the reference worker: logits of a prefill that reads a cached
// prefix from pages equal the logits of a full prefill (fp32, within 1e-4),
// for prefix 0, one block, a boundary on a page edge, a tail inside a page,
// the fully cached prompt (last token recomputed over the pages), and GQA
// ratios 1, 2 and 4.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "worker/model.h"
#include "gpu/kv_ops.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_test_util.h"

namespace radixkv::worker {
namespace {

class ModelEquivalenceTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  // GQA ratio from the parameter: q heads = ratio * kv heads.
  void SetUp() override {
    ModelConfig c = *NamedModelConfig("tiny");
    c.num_kv_heads = 2;
    c.num_q_heads = 2 * GetParam();
    c.d_model = 16 * c.num_q_heads;  // d_model = q heads * head_dim
    auto m = Model::Create(c);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  std::vector<float> FullPrefill(const std::vector<uint32_t>& tokens) {
    LocalKv local(model_->config(), tokens.size());
    auto logits = model_->Forward(PrefixView{}, &local, tokens);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return *logits;
  }

  // Caches the first `cached_blocks` blocks (K/V from a prefill of just
  // those tokens, as an earlier request would have produced them) in
  // shuffled pages, then prefills tokens[prefix_tokens..] over them.
  std::vector<float> CachedPrefill(const std::vector<uint32_t>& tokens,
                                   uint32_t cached_blocks,
                                   uint32_t prefix_tokens) {
    const ModelConfig& c = model_->config();
    const PageGeometry g = c.Geometry();
    const uint32_t cached = cached_blocks * c.page_size;
    pool_.assign(g.page_bytes() / 4 * (cached_blocks + 3), NAN);
    std::vector<uint64_t> ids(cached_blocks + 3);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(cached_blocks));
    ids.resize(cached_blocks);
    PrefixView prefix;
    prefix.tokens = prefix_tokens;
    if (cached > 0) {
      LocalKv earlier(c, cached);
      const std::vector<uint32_t> head(tokens.begin(), tokens.begin() + cached);
      EXPECT_TRUE(model_->Forward(PrefixView{}, &earlier, head).ok());
      EXPECT_TRUE(gpu::WriteKv(g,
                               gpu::KvSource{earlier.k(0, 0), earlier.v(0, 0),
                                             cached, earlier.capacity()},
                               pool_.data(), cached_blocks + 3, ids)
                      .ok());
      for (uint64_t id : ids) {
        prefix.pages.push_back(pool_.data() + id * (g.page_bytes() / 4));
      }
    }
    LocalKv local(c, tokens.size() - prefix_tokens);
    const std::vector<uint32_t> suffix(tokens.begin() + prefix_tokens, tokens.end());
    auto logits = model_->Forward(prefix, &local, suffix);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : std::vector<float>();
  }

  std::unique_ptr<Model> model_;
  std::vector<float> pool_;
};

TEST_P(ModelEquivalenceTest, PrefixZero) {
  const auto t = Prompt(37, 512, 1);
  EXPECT_LE(MaxAbsDiff(CachedPrefill(t, 0, 0), FullPrefill(t)), 1e-4f);
}

TEST_P(ModelEquivalenceTest, ExactlyOneBlock) {
  const auto t = Prompt(40, 512, 2);
  EXPECT_LE(MaxAbsDiff(CachedPrefill(t, 1, 16), FullPrefill(t)), 1e-4f);
}

TEST_P(ModelEquivalenceTest, BoundaryOnAPageEdge) {
  // 4 cached blocks; the suffix is exactly one more block.
  const auto t = Prompt(80, 512, 3);
  EXPECT_LE(MaxAbsDiff(CachedPrefill(t, 4, 64), FullPrefill(t)), 1e-4f);
}

TEST_P(ModelEquivalenceTest, TailInsideAPage) {
  // 100 = 6 full blocks + 4 tokens: every full block cached, the tail runs.
  const auto t = Prompt(100, 512, 4);
  EXPECT_LE(MaxAbsDiff(CachedPrefill(t, 6, 96), FullPrefill(t)), 1e-4f);
}

TEST_P(ModelEquivalenceTest, FullyCachedPromptRecomputesItsLastToken) {
  // All 4 blocks cached; the last token is recomputed over pages that hold
  // the 63 tokens before it (a partial last page).
  const auto t = Prompt(64, 512, 5);
  EXPECT_LE(MaxAbsDiff(CachedPrefill(t, 4, 63), FullPrefill(t)), 1e-4f);
}

TEST_P(ModelEquivalenceTest, LogitsDependOnTheWholePrompt) {
  // Guard against a vacuous pass: another prompt gives other logits.
  auto a = Prompt(64, 512, 6), b = a;
  b[3] = (b[3] + 1) % 512;
  EXPECT_GT(MaxAbsDiff(FullPrefill(a), FullPrefill(b)), 1e-3f);
}

INSTANTIATE_TEST_SUITE_P(GqaRatios, ModelEquivalenceTest,
                         ::testing::Values(1u, 2u, 4u),
                         [](const auto& info) {
                           return "ratio" + std::to_string(info.param);
                         });

TEST(ModelTest, TiedHeadCachedPrefixEqualsFullPrefill) {
  ModelConfig c = *NamedModelConfig("tiny");
  c.tied_embeddings = true;
  auto m = Model::Create(c);
  ASSERT_TRUE(m.ok());
  const auto t = Prompt(50, 512, 8);
  LocalKv full(c, 50);
  auto want = (*m)->Forward({}, &full, t);
  ASSERT_TRUE(want.ok());
  // The first 3 blocks from the full run's own K/V, in pages 2, 0, 1.
  const PageGeometry g = c.Geometry();
  std::vector<float> pool(g.page_bytes() / 4 * 3);
  const std::vector<uint64_t> ids = {2, 0, 1};
  ASSERT_TRUE(gpu::WriteKv(g, gpu::KvSource{full.k(0, 0), full.v(0, 0), 48, 50},
                           pool.data(), 3, ids)
                  .ok());
  PrefixView prefix;
  prefix.tokens = 48;
  for (uint64_t id : ids) prefix.pages.push_back(pool.data() + id * g.page_bytes() / 4);
  LocalKv local(c, 2);
  const std::vector<uint32_t> tail(t.begin() + 48, t.end());
  auto got = (*m)->Forward(prefix, &local, tail);
  ASSERT_TRUE(got.ok());
  EXPECT_LE(MaxAbsDiff(*got, *want), 1e-4f);
}

TEST(ModelTest, WeightsAreDeterministicFromTheSeed) {
  ModelConfig c = *NamedModelConfig("tiny");
  auto a = Model::Create(c), b = Model::Create(c);
  c.seed = 2;
  auto other = Model::Create(c);
  const auto t = Prompt(20, 512, 7);
  LocalKv la(c, 20), lb(c, 20), lo(c, 20);
  auto xa = (*a)->Forward({}, &la, t), xb = (*b)->Forward({}, &lb, t),
       xo = (*other)->Forward({}, &lo, t);
  EXPECT_EQ(*xa, *xb);
  EXPECT_NE(*xa, *xo);
  EXPECT_NE(c.Namespace().model_revision,
            NamedModelConfig("tiny")->Namespace().model_revision);
}

TEST(ModelTest, NamedSizesAndTheirNamespaces) {
  for (const char* name : {"tiny", "small", "base"}) {
    auto c = NamedModelConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(c->Validate().ok()) << name;
    const NamespaceSpec ns = c->Namespace();
    EXPECT_EQ(ns.num_layers, c->num_layers);
    EXPECT_EQ(ns.dtype, DType::kFloat32);
    EXPECT_EQ(ns.PageBytes(), c->Geometry().page_bytes());
  }
  EXPECT_EQ(NamedModelConfig("huge").status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelTest, BadInputNamesTheFieldAndChangesNothing) {
  ModelConfig c = *NamedModelConfig("tiny");
  c.num_q_heads = 3;
  EXPECT_NE(c.Validate().message().find("num_q_heads"), std::string::npos);
  c = *NamedModelConfig("tiny");
  c.head_dim = 15;
  EXPECT_NE(c.Validate().message().find("head_dim"), std::string::npos);

  auto m = Model::Create(*NamedModelConfig("tiny"));
  LocalKv local(m->get()->config(), 4);
  const std::vector<uint32_t> too_big = {1, 2, 512};
  auto r = (*m)->Forward({}, &local, too_big);
  EXPECT_NE(r.status().message().find("tokens[2] = 512"), std::string::npos);
  EXPECT_EQ(local.size(), 0u);
  const std::vector<uint32_t> five = {1, 2, 3, 4, 5};
  r = (*m)->Forward({}, &local, five);
  EXPECT_NE(r.status().message().find("do not fit"), std::string::npos);
  EXPECT_EQ(local.size(), 0u);
}

TEST(ModelTest, FlopsShrinkWithTheCachedPrefix) {
  const ModelConfig c = *NamedModelConfig("small");
  const double full = ForwardFlops(c, 0, 2048);
  const double cached = ForwardFlops(c, 1856, 192);
  EXPECT_GT(full / cached, 2048.0 / 192 * 0.5);
  EXPECT_LT(full / cached, 2048.0 / 192);
}

}  // namespace
}  // namespace radixkv::worker
