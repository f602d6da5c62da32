// The cross-layer KV variant of the reference worker (xlayer_model.h):
// a request whose prefix comes from cached pages (lower layers' K/V and the
// bank) and whose windows are rebuilt from the prefix's last W tokens gives
// the logits and greedy tokens of a full prefill (fp32, within 1e-4), for
// cached prefixes shorter than, equal to and longer than W and for GQA and
// MQA head ratios; the upper layers' attention equals the selection rule
// written out directly, ties included; its pages hold S + 1 groups; its namespace never shares
// blocks with the per-layer one; invalid layouts are refused, by the model,
// by the daemon's request validation and by `radixkvctl size`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "worker/engine.h"
#include "worker/model.h"
#include "worker/prefix_cache.h"
#include "worker/xlayer_model.h"
#include "daemon/core/request_validation.h"
#include "gpu/namespace_geometry.h"
#include "gtest/gtest.h"
#include "radix/radix_tree.h"
#include "radixkv/namespace_spec.h"
#include "tests/worker/worker_test_util.h"

namespace radixkv::worker {
namespace {

constexpr uint32_t kWindow = 32;

// A 4-layer model whose layers 2 and 3 share the bank, window 32, 8 bank
// positions per query.
ModelConfig XLayerTiny(uint32_t q_heads, uint32_t kv_heads) {
  ModelConfig c = *NamedModelConfig("tiny");
  c.num_layers = 4;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.d_model = 16 * q_heads;
  c.xlayer = XLayerConfig{.shared_from = 2, .window = kWindow, .top_k = 8};
  return c;
}

RunResult Serve(const Model& model, PrefixCache* cache,
                const std::vector<uint32_t>& prompt, uint32_t decode = 1) {
  Engine e(&model, cache);
  RunOptions o;
  o.decode_tokens = decode;
  auto r = e.Run(prompt, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

// (q heads, kv heads): GQA ratios 1, 2 and 4, and MQA.
class XLayerEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {
 protected:
  void SetUp() override {
    auto m = Model::Create(XLayerTiny(std::get<0>(GetParam()),
                                      std::get<1>(GetParam())),
                           Device::kCpu);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
};

TEST_P(XLayerEquivalenceTest, CachedPrefixEqualsFullPrefill) {
  std::unique_ptr<PrefixCache> none = NewNoPrefixCache();
  // cached tokens -> prompt length: shorter than W, equal to W, longer than
  // W (several blocks), and the fully cached prompt (its last token runs
  // over 159 cached tokens, so the rebuild covers 32 of them).
  const std::vector<std::pair<uint32_t, uint32_t>> cases = {
      {16, 40}, {kWindow, 50}, {96, 120}, {160, 160}};
  for (const auto& [cached, n] : cases) {
    auto cache = NewLocalPrefixCache(model_->config().Namespace(), 64);
    ASSERT_TRUE(cache.ok()) << cache.status();
    const std::vector<uint32_t> prompt = Prompt(n, 512, cached * 13 + n);
    const std::vector<uint32_t> head(prompt.begin(), prompt.begin() + cached);
    Serve(*model_, cache->get(), head);  // an earlier request commits the prefix
    const RunResult want = Serve(*model_, none.get(), prompt, 6);
    const RunResult got = Serve(*model_, cache->get(), prompt, 6);
    EXPECT_EQ(got.matched_tokens, std::min(cached, n - 1)) << cached;
    EXPECT_LE(MaxAbsDiff(want.first_logits, got.first_logits), 1e-4f)
        << "cached " << cached << " of " << n;
    EXPECT_EQ(want.generated, got.generated) << "cached " << cached;
  }
}

INSTANTIATE_TEST_SUITE_P(
    HeadRatios, XLayerEquivalenceTest,
    ::testing::Values(std::make_tuple(2u, 2u), std::make_tuple(4u, 2u),
                      std::make_tuple(8u, 2u), std::make_tuple(4u, 1u)),
    [](const auto& info) {
      return "q" + std::to_string(std::get<0>(info.param)) + "kv" +
             std::to_string(std::get<1>(info.param));
    });

// The selection rule of xlayer_model.h written out directly: every visible
// bank position scored with a sequential dot product, a full sort by
// (score descending, position ascending), the first k taken in increasing
// position order, then the window; one softmax.
std::vector<float> ReferenceAttention(const ModelConfig& c,
                                      const XLayerBankView& b,
                                      const std::vector<float>& q, size_t m,
                                      uint64_t first_pos) {
  const size_t hd = c.head_dim, kvd = size_t{c.num_kv_heads} * hd;
  const size_t group = c.num_q_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const uint32_t k = c.xlayer->top_k, w = c.xlayer->window;
  std::vector<float> out(q.size());
  for (size_t i = 0; i < m; ++i) {
    const uint64_t p = first_pos + i;
    for (size_t h = 0; h < c.num_q_heads; ++h) {
      const float* qh = &q[(i * c.num_q_heads + h) * hd];
      const size_t g = h / group;
      auto row = [&](const float* prefix, const float* local, uint64_t j) {
        return (j < b.prefix_tokens ? prefix + j * kvd
                                    : local + (j - b.prefix_tokens) * kvd) +
               g * hd;
      };
      auto score = [&](const float* key) {
        float s = 0.0f;
        for (size_t d = 0; d < hd; ++d) s += qh[d] * key[d];
        return s * scale;
      };
      std::vector<uint32_t> order(p + 1);
      std::iota(order.begin(), order.end(), 0u);
      std::vector<float> sc(p + 1);
      for (uint64_t j = 0; j <= p; ++j) sc[j] = score(row(b.prefix_k, b.local_k, j));
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t z) {
        return sc[a] > sc[z] || (sc[a] == sc[z] && a < z);
      });
      if (k != 0 && k < order.size()) order.resize(k);
      std::sort(order.begin(), order.end());
      std::vector<std::pair<float, const float*>> keys;  // (score, V row)
      for (uint32_t j : order) keys.push_back({sc[j], row(b.prefix_v, b.local_v, j)});
      const uint64_t lo = w == 0 ? p + 1 : (p + 1 > w ? p + 1 - w : 0);
      for (uint64_t j = lo; j <= p; ++j) {
        const size_t at = (j - b.win_base) * kvd + g * hd;
        keys.push_back({score(b.win_k + at), b.win_v + at});
      }
      float mx = -INFINITY, sum = 0.0f;
      for (const auto& [s, v] : keys) mx = std::max(mx, s);
      float* o = &out[(i * c.num_q_heads + h) * hd];
      for (const auto& [s, v] : keys) {
        const float e = std::exp(s - mx);
        sum += e;
        for (size_t d = 0; d < hd; ++d) o[d] += e * v[d];
      }
      for (size_t d = 0; d < hd; ++d) o[d] *= 1.0f / sum;
    }
  }
  return out;
}

struct AttentionCase {
  uint32_t q_heads, kv_heads, head_dim, top_k, window;
  uint32_t prefix_tokens;  // P: positions 0 .. P-1 staged
  uint64_t first_pos;      // >= P; the local bank holds P .. first_pos + m - 1
  size_t m;
};

// Queries and keys are multiples of 1/4 in [-1, 1], so every dot product
// is exact whatever the summation order and equal scores are common: the
// tie rule decides many selections.
TEST(XLayerAttentionTest, EqualsTheSelectionRuleWrittenOut) {
  const AttentionCase cases[] = {
      {4, 2, 8, 8, 6, 40, 45, 30},      // several chunks, window, GQA 2
      {6, 2, 8, 5, 0, 0, 0, 50},        // full prefill, no window, GQA 3
      {8, 1, 16, 0, 4, 100, 100, 1},    // decode, every bank position, MQA
      {2, 2, 6, 200, 300, 20, 37, 9},   // k and W above every position
      {20, 1, 8, 7, 3, 33, 33, 5},      // a query's heads span chunks
      {8, 2, 32, 64, 128, 3000, 3000, 64},  // threaded
  };
  std::mt19937 rng(17);
  auto quarter = [&] { return static_cast<float>(int(rng() % 9) - 4) / 4.0f; };
  auto uniform = [&] { return static_cast<float>(rng() % 2001) / 1000.0f - 1.0f; };
  for (const AttentionCase& t : cases) {
    ModelConfig c = XLayerTiny(t.q_heads, t.kv_heads);
    c.head_dim = t.head_dim;
    c.xlayer->top_k = t.top_k;
    c.xlayer->window = t.window;
    const size_t kvd = size_t{t.kv_heads} * t.head_dim;
    const uint64_t end = t.first_pos + t.m;
    const uint64_t win_base = t.window == 0 || t.first_pos + 1 <= t.window
                                  ? 0 : t.first_pos + 1 - t.window;
    std::vector<float> pk(t.prefix_tokens * kvd), pv(pk.size()),
        lk((end - t.prefix_tokens) * kvd), lv(lk.size()),
        wk((end - win_base) * kvd), wv(wk.size()),
        q(t.m * t.q_heads * t.head_dim);
    for (auto* v : {&pk, &lk, &wk, &q}) std::generate(v->begin(), v->end(), quarter);
    for (auto* v : {&pv, &lv, &wv}) std::generate(v->begin(), v->end(), uniform);
    const XLayerBankView b{pk.data(), pv.data(), t.prefix_tokens, lk.data(),
                           lv.data(), wk.data(), wv.data(),
                           static_cast<uint32_t>(win_base)};
    std::vector<float> got(q.size());
    XLayerAttention(c, b, q.data(), t.m, t.first_pos, got.data());
    const std::vector<float> want = ReferenceAttention(c, b, q, t.m, t.first_pos);
    EXPECT_LE(MaxAbsDiff(want, got), 1e-6f)
        << "q " << t.q_heads << " kv " << t.kv_heads << " k " << t.top_k;
    // A row's result does not depend on the other rows of the call.
    const size_t row = size_t{t.q_heads} * t.head_dim;
    const size_t i = t.m / 2;
    std::vector<float> one(row);
    XLayerAttention(c, b, &q[i * row], 1, t.first_pos + i, one.data());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), got.begin() + i * row))
        << "q " << t.q_heads << " kv " << t.kv_heads << " k " << t.top_k;
  }
}

// Guards against a vacuous pass: the window, the top-k selection and the
// bank all change the logits, and the windows must be rebuilt.
TEST(XLayerModelTest, WindowTopKAndRebuildMatter) {
  const std::vector<uint32_t> prompt = Prompt(120, 512, 3);
  auto logits = [&](XLayerConfig x) {
    ModelConfig c = XLayerTiny(4, 2);
    c.xlayer = x;
    auto m = Model::Create(c, Device::kCpu);
    EXPECT_TRUE(m.ok()) << m.status();
    LocalKv local(c, 120);
    auto r = (*m)->Forward(PrefixView{}, &local, prompt);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<float>();
  };
  const auto base = logits({2, kWindow, 8});
  EXPECT_GT(MaxAbsDiff(base, logits({2, 0, 8})), 1e-3f);
  EXPECT_GT(MaxAbsDiff(base, logits({2, kWindow, 0})), 1e-3f);
  EXPECT_GT(MaxAbsDiff(base, logits({1, kWindow, 8})), 1e-3f);

  // A Forward over cached pages without the prefix's last tokens cannot
  // rebuild the windows: refused, naming the field.
  auto m = Model::Create(XLayerTiny(4, 2), Device::kCpu);
  ASSERT_TRUE(m.ok());
  const ModelConfig& c = (*m)->config();
  std::vector<float> pool(c.Geometry().page_bytes() / 4 * 2);
  PrefixView prefix;
  prefix.tokens = 32;
  prefix.pages = {pool.data(), pool.data() + pool.size() / 2};
  LocalKv local(c, 4);
  const std::vector<uint32_t> one = {7};
  auto r = (*m)->Forward(prefix, &local, one);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("prefix.recent_tokens"), std::string::npos);
}

TEST(XLayerModelTest, PagesHoldTheLowerLayersAndTheBankOnce) {
  const ModelConfig c = XLayerTiny(4, 2);
  const NamespaceSpec ns = c.Namespace();
  ASSERT_TRUE(ns.cross_layer.has_value());
  EXPECT_EQ(ns.cross_layer->shared_from_layer, 2u);
  EXPECT_EQ(ns.cross_layer->local_window, kWindow);
  EXPECT_EQ(c.KvGroups(), 3u);
  EXPECT_EQ(c.Geometry().num_layers, 3u);
  const uint64_t group = 2ull * c.num_kv_heads * c.page_size * c.head_dim * 4;
  EXPECT_EQ(NamespacePageBytes(ns), 3 * group);
  EXPECT_EQ(c.Geometry().page_bytes(), NamespacePageBytes(ns));
  ModelConfig plain = c;
  plain.xlayer.reset();
  EXPECT_EQ(NamespacePageBytes(plain.Namespace()), 4 * group);
  EXPECT_EQ(XLayerWindowBytes(c), 2ull * kWindow * 2 * 2 * 16 * 4);
  // The CUDA path has no cross-layer forward pass.
  auto cuda = Model::Create(c, Device::kCuda);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("xlayer"), std::string::npos);
}

// The background arithmetic: 24 layers x 8 KV heads x 64 dims x fp16 x
// 4,096 positions = 192 MiB; sharing from layer 12 keeps 12 + 1 groups.
TEST(XLayerModelTest, SizeArithmetic) {
  NamespaceSpec ns{.num_layers = 24, .num_kv_heads = 8, .head_dim = 64,
                   .page_size = 16, .dtype = DType::kFloat16};
  const uint64_t pages = 4096 / 16;
  EXPECT_EQ(NamespacePageBytes(ns) * pages, 192ull << 20);
  ns.cross_layer = CrossLayerKv{12, 128};
  EXPECT_EQ(NamespacePageBytes(ns) * pages, 104ull << 20);
  ns.num_layers = 40;
  ns.cross_layer = CrossLayerKv{21, 128};
  EXPECT_EQ(NamespacePageBytes(ns), 22ull * 2 * 8 * 16 * 64 * 2);
  // Scaled dtypes: one fp32 scale per group, K|V and KV head.
  ns.dtype = DType::kInt8;
  EXPECT_EQ(NamespaceScaleBytes(ns), 22ull * 2 * 8 * 4);
  EXPECT_EQ(NamespacePageBytes(ns), 22ull * 2 * 8 * 16 * 64 + 22 * 2 * 8 * 4);
}

TEST(XLayerModelTest, LayoutNamespaceNeverSharesWithThePlainOne) {
  NamespaceSpec plain{.model = "m", .num_layers = 4, .num_kv_heads = 2,
                      .head_dim = 16, .page_size = 16,
                      .dtype = DType::kFloat32};
  NamespaceSpec xl = plain;
  xl.cross_layer = CrossLayerKv{2, kWindow};
  EXPECT_NE(NamespaceRoot(plain), NamespaceRoot(xl));
  auto tree = RadixTree::Create({.capacity_pages = 16});
  ASSERT_TRUE(tree.ok());
  auto a = (*tree)->RegisterNamespace(plain);
  auto b = (*tree)->RegisterNamespace(xl);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  const std::vector<uint32_t> tokens = Prompt(48, 512, 9);
  auto put = (*tree)->Acquire({.ns = *a, .tokens = tokens, .allocate = true});
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_EQ(put->new_blocks, 3u);
  ASSERT_TRUE((*tree)->Commit(put->lease, 3, /*release=*/true).ok());
  auto other = (*tree)->Acquire({.ns = *b, .tokens = tokens});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->matched_blocks, 0u);
  auto same = (*tree)->Acquire({.ns = *a, .tokens = tokens});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->matched_blocks, 3u);
  if (same->lease != 0) {
    EXPECT_TRUE((*tree)->Release(same->lease).ok());
  }
}

TEST(XLayerModelTest, InvalidLayoutsAreRefusedNamingFieldAndLimit) {
  ModelConfig c = XLayerTiny(4, 2);
  c.xlayer->shared_from = 0;
  EXPECT_NE(c.Validate().message().find("xlayer.shared_from"), std::string::npos);
  EXPECT_NE(c.Validate().message().find("1..3"), std::string::npos);
  c.xlayer->shared_from = 4;
  EXPECT_NE(c.Validate().message().find("outside 1..3"), std::string::npos);
  c.xlayer->shared_from = 2;
  c.xlayer->window = kMaxCrossLayerWindow + 1;
  EXPECT_NE(c.Validate().message().find("xlayer.window"), std::string::npos);
  EXPECT_NE(c.Validate().message().find("65536"), std::string::npos);
  c.xlayer->window = 8;
  c.xlayer->top_k = (1u << 20) + 1;
  EXPECT_NE(c.Validate().message().find("xlayer.top_k"), std::string::npos);
  c.xlayer->top_k = 0;
  EXPECT_TRUE(c.Validate().ok());

  // The daemon's request validation.
  const daemon::RequestLimits limits;
  v1::Namespace ns = NamespaceToProto(c.Namespace());
  EXPECT_TRUE(daemon::ValidateNamespace(ns, limits).ok());
  ns.mutable_cross_layer()->set_shared_from_layer(4);
  absl::StatusOr<NamespaceSpec> bad = daemon::ValidateNamespace(ns, limits);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("namespace.cross_layer.shared_from_layer"),
            std::string::npos);
  EXPECT_NE(bad.status().message().find("1..3"), std::string::npos);
  ns.mutable_cross_layer()->set_shared_from_layer(0);
  EXPECT_FALSE(daemon::ValidateNamespace(ns, limits).ok());
  ns.mutable_cross_layer()->set_shared_from_layer(2);
  ns.mutable_cross_layer()->set_local_window(kMaxCrossLayerWindow + 1);
  bad = daemon::ValidateNamespace(ns, limits);
  EXPECT_NE(bad.status().message().find("namespace.cross_layer.local_window"),
            std::string::npos);
  ns.clear_cross_layer();
  bad = daemon::ValidateNamespace(ns, limits);
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->cross_layer.has_value());
}

#ifdef RADIXKVCTL_PATH
// `radixkvctl size --layout=xlayer:S`: the bytes and the saving, and a
// refused layout (exit 3, the flag and its limit named).
std::string Ctl(const std::string& args, int* exit_code) {
  const std::string cmd = std::string(RADIXKVCTL_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = p == nullptr ? -1 : pclose(p);
  *exit_code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(XLayerCliTest, SizeWithLayout) {
  int rc = 0;
  const std::string base =
      "size --layers=24 --kv-heads=8 --head-dim=64 --dtype=fp16 --tokens=4096 ";
  std::string out = Ctl(base + "-o json", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"bytes\":201326592"), std::string::npos) << out;
  out = Ctl(base + "--layout=xlayer:12 -o json", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"bytes\":109051904"), std::string::npos) << out;
  EXPECT_NE(out.find("\"per_layer_bytes\":201326592"), std::string::npos) << out;
  EXPECT_NE(out.find("\"saved_bytes\":92274688"), std::string::npos) << out;
  EXPECT_NE(out.find("\"kv_groups\":13"), std::string::npos) << out;
  out = Ctl(base + "--layout=xlayer:24", &rc);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("--layout"), std::string::npos) << out;
  EXPECT_NE(out.find("1..23"), std::string::npos) << out;
  out = Ctl(base + "--layout=xlayer:0", &rc);
  EXPECT_EQ(rc, 3) << out;
  out = Ctl(base + "--layout=xlayer:12:70000", &rc);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("65536"), std::string::npos) << out;
  out = Ctl(base + "--layout=shared", &rc);
  EXPECT_EQ(rc, 3) << out;
}
#endif  // RADIXKVCTL_PATH

}  // namespace
}  // namespace radixkv::worker
