// Tests of the block-key contract v1 (radix/block_key.h): the C++ keys must
// equal tests/data/block_key_vectors.json, which an independent Python
// implementation (tests/data/gen_block_key_vectors.py) produced.
#include "radix/block_key.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace radixkv {
namespace {

using Json = nlohmann::json;

// The parsed vectors file, or a discarded value when it cannot be read or
// parsed (the first test reports that).
const Json& Vectors() {
  static const Json* doc = [] {
    std::ifstream in(std::string(RADIXKV_TEST_DATA_DIR) +
                     "/block_key_vectors.json");
    return new Json(
        Json::parse(in, /*cb=*/nullptr, /*allow_exceptions=*/false));
  }();
  return *doc;
}

// Field accessors; a missing field or a value of another type throws,
// which fails the test that reads it.
uint32_t U32(const Json& v) { return v.get<uint32_t>(); }
std::string Str(const Json& v) { return v.get<std::string>(); }

NamespaceSpec SpecOf(const Json& ns) {
  NamespaceSpec s;
  s.model = ns.at("model").get<std::string>();
  s.model_revision = ns.at("model_revision").get<std::string>();
  s.lora = ns.at("lora").get<std::string>();
  s.cache_salt = ns.at("cache_salt").get<std::string>();
  s.num_layers = U32(ns.at("num_layers"));
  s.num_kv_heads = U32(ns.at("num_kv_heads"));
  s.head_dim = U32(ns.at("head_dim"));
  s.page_size = U32(ns.at("page_size"));
  s.dtype = static_cast<DType>(U32(ns.at("dtype")));
  s.tp_rank = U32(ns.at("tp_rank"));
  s.tp_size = U32(ns.at("tp_size"));
  if (ns.contains("cross_layer")) {
    const Json& x = ns.at("cross_layer");
    s.cross_layer = CrossLayerKv{U32(x.at("shared_from_layer")),
                                 U32(x.at("local_window"))};
  }
  return s;
}

std::vector<uint32_t> TokensOf(const Json& list) {
  return list.get<std::vector<uint32_t>>();
}

TEST(BlockKeyVectorsTest, FileCoversTheContract) {
  const Json& doc = Vectors();
  ASSERT_TRUE(doc.is_object()) << "cannot read or parse the vectors file";
  const Json& v = doc.at("vectors");
  ASSERT_TRUE(v.is_array());
  ASSERT_GE(v.size(), 20u);
  bool page1 = false, page16 = false, page512 = false, high = false,
       salt = false, lora = false, empty = false, tail = false, several = false;
  for (const Json& x : v) {
    const NamespaceSpec s = SpecOf(x.at("namespace"));
    const std::vector<uint32_t> t = TokensOf(x.at("tokens"));
    page1 |= s.page_size == 1;
    page16 |= s.page_size == 16;
    page512 |= s.page_size == 512;
    salt |= !s.cache_salt.empty();
    lora |= !s.lora.empty();
    empty |= s.model.empty() && s.lora.empty() && s.cache_salt.empty();
    tail |= t.size() % s.page_size != 0;
    several |= x.at("block_keys").size() >= 3;
    for (uint32_t tok : t) high |= tok >= 0x80000000u;
  }
  EXPECT_TRUE(page1 && page16 && page512);
  EXPECT_TRUE(high && salt && lora && empty && tail && several);
}

TEST(BlockKeyVectorsTest, RootsAndKeysMatch) {
  ASSERT_TRUE(Vectors().is_object()) << "cannot read or parse the vectors file";
  const Json& v = Vectors().at("vectors");
  ASSERT_FALSE(v.empty());
  for (const Json& x : v) {
    SCOPED_TRACE(Str(x.at("name")));
    const NamespaceSpec spec = SpecOf(x.at("namespace"));
    const std::vector<uint32_t> tokens = TokensOf(x.at("tokens"));
    const Json& block_keys = x.at("block_keys");
    const BlockKey root = NamespaceRoot(spec);
    EXPECT_EQ(root.ToHex(), Str(x.at("root")));
    const std::vector<BlockKey> keys =
        ComputeBlockKeys(root, spec.page_size, tokens);
    ASSERT_EQ(keys.size(), block_keys.size());
    std::vector<BlockKey> reused(3);
    ComputeBlockKeys(root, spec.page_size, tokens, &reused);
    EXPECT_EQ(reused, keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(keys[i].ToHex(), Str(block_keys.at(i))) << "block " << i;
      // The one-block primitive agrees with the bulk path.
      const BlockKey parent = i == 0 ? root : keys[i - 1];
      EXPECT_EQ(ChainBlockKey(parent, absl::MakeConstSpan(tokens).subspan(
                                          i * spec.page_size, spec.page_size)),
                keys[i]);
    }
  }
}

TEST(BlockKeyVectorsTest, ExtrasMatch) {
  ASSERT_TRUE(Vectors().is_object()) << "cannot read or parse the vectors file";
  const Json& v = Vectors().at("chain_with_extras");
  ASSERT_FALSE(v.empty());
  for (const Json& x : v) {
    SCOPED_TRACE(Str(x.at("name")));
    BlockKey parent;
    ASSERT_TRUE(BlockKey::FromHex(Str(x.at("parent")), &parent));
    std::vector<BlockExtra> extras;
    for (const Json& e : x.at("extras")) {
      extras.emplace_back(Str(e.at(0)), Str(e.at(1)));
    }
    EXPECT_EQ(ChainBlockKey(parent, TokensOf(x.at("tokens")), extras).ToHex(),
              Str(x.at("key")));
  }
}

// Namespaces with a cross-layer layout: the root hashes the layout after
// the eleven fields, and differs from the root of the same namespace
// without one (so the two never share a block).
TEST(BlockKeyVectorsTest, CrossLayerRootsAndKeysMatch) {
  ASSERT_TRUE(Vectors().is_object()) << "cannot read or parse the vectors file";
  const Json& v = Vectors().at("cross_layer_vectors");
  ASSERT_GE(v.size(), 5u);
  for (const Json& x : v) {
    SCOPED_TRACE(Str(x.at("name")));
    NamespaceSpec spec = SpecOf(x.at("namespace"));
    ASSERT_TRUE(spec.cross_layer.has_value());
    const BlockKey root = NamespaceRoot(spec);
    EXPECT_EQ(root.ToHex(), Str(x.at("root")));
    const std::vector<uint32_t> tokens = TokensOf(x.at("tokens"));
    const std::vector<BlockKey> keys =
        ComputeBlockKeys(root, spec.page_size, tokens);
    ASSERT_EQ(keys.size(), x.at("block_keys").size());
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(keys[i].ToHex(), Str(x.at("block_keys").at(i))) << i;
    }
    spec.cross_layer.reset();
    EXPECT_EQ(NamespaceRoot(spec).ToHex(), Str(x.at("plain_root")));
    EXPECT_NE(Str(x.at("plain_root")), Str(x.at("root")));
  }
}

// Every v1 vector still hashes as a namespace without a layout: adding the
// field kept the contract (no vector carries "cross_layer").
TEST(BlockKeyVectorsTest, V1VectorsHaveNoLayout) {
  ASSERT_TRUE(Vectors().is_object()) << "cannot read or parse the vectors file";
  for (const Json& x : Vectors().at("vectors")) {
    EXPECT_FALSE(x.at("namespace").contains("cross_layer"))
        << Str(x.at("name"));
    EXPECT_FALSE(SpecOf(x.at("namespace")).cross_layer.has_value());
  }
}

TEST(BlockKeyTest, CrossLayerGroupsAndPageBytes) {
  NamespaceSpec s{.num_layers = 40, .num_kv_heads = 8, .head_dim = 128,
                  .page_size = 16, .dtype = DType::kBFloat16};
  const uint64_t per_group = 2u * 8 * 16 * 128 * 2;
  EXPECT_EQ(s.KvGroups(), 40u);
  EXPECT_EQ(s.PageBytes(), 40 * per_group);
  s.cross_layer = CrossLayerKv{21, 128};
  EXPECT_EQ(s.KvGroups(), 22u);  // layers 0..20, then the bank once
  EXPECT_EQ(s.PageBytes(), 22 * per_group);
  s.cross_layer->shared_from_layer = 0;
  EXPECT_EQ(s.KvGroups(), 0u);
  EXPECT_EQ(s.PageBytes(), 0u);
  s.cross_layer->shared_from_layer = 40;
  EXPECT_EQ(s.PageBytes(), 0u);
}

TEST(BlockKeyTest, HexAndCanonicalRoundTrip) {
  const BlockKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(k.ToHex(), "0123456789abcdeffedcba9876543210");
  const std::string c = k.ToCanonical();
  ASSERT_EQ(c.size(), BlockKey::kBytes);
  EXPECT_EQ(static_cast<unsigned char>(c[0]), 0x01);
  EXPECT_EQ(static_cast<unsigned char>(c[15]), 0x10);
  EXPECT_EQ(BlockKey::FromCanonical(c), k);
  BlockKey parsed;
  ASSERT_TRUE(BlockKey::FromHex("0123456789ABCDEFfedcba9876543210", &parsed));
  EXPECT_EQ(parsed, k);
  EXPECT_FALSE(BlockKey::FromHex("0123", &parsed));
  EXPECT_FALSE(BlockKey::FromHex("g123456789abcdeffedcba9876543210", &parsed));
}

TEST(BlockKeyTest, DTypeBytesAndPageBytes) {
  EXPECT_EQ(DTypeBytes(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeBytes(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kFloat8E4M3), 1u);
  EXPECT_EQ(DTypeBytes(DType::kFloat8E5M2), 1u);
  EXPECT_EQ(DTypeBytes(DType::kInt8), 1u);
  EXPECT_EQ(DTypeBytes(DType::kUnspecified), 0u);
  NamespaceSpec s;
  s.num_layers = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.page_size = 16;
  s.dtype = DType::kBFloat16;
  EXPECT_EQ(s.PageBytes(), 32u * 2 * 8 * 16 * 128 * 2);
  s.dtype = DType::kUnspecified;
  EXPECT_EQ(s.PageBytes(), 0u);
}

TEST(BlockKeyTest, PartialTailIsIgnored) {
  const BlockKey root = NamespaceRoot(NamespaceSpec{.page_size = 4});
  std::vector<uint32_t> t = {1, 2, 3, 4, 5, 6, 7};
  const auto keys = ComputeBlockKeys(root, 4, t);
  ASSERT_EQ(keys.size(), 1u);
  t.resize(4);
  EXPECT_EQ(ComputeBlockKeys(root, 4, t), keys);
}

TEST(BlockKeyTest, IncrementalHasherEqualsOneShot) {
  std::mt19937 rng(1234);
  for (uint32_t page_size : {1u, 3u, 16u, 512u}) {
    const BlockKey root = NamespaceRoot(NamespaceSpec{.page_size = page_size});
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint32_t> tokens(rng() % (page_size * 6 + 5));
      for (uint32_t& t : tokens) t = rng();
      const auto expected = ComputeBlockKeys(root, page_size, tokens);
      BlockHasher h(root, page_size);
      size_t pos = 0;
      while (pos < tokens.size()) {
        const size_t n = std::min<size_t>(tokens.size() - pos,
                                          rng() % (2 * page_size + 2));
        if (n == 1 && rng() % 2) {
          h.Append(tokens[pos]);
        } else {
          h.Append(absl::MakeConstSpan(tokens).subspan(pos, n));
        }
        pos += n;
      }
      EXPECT_EQ(h.keys(), expected) << "page_size " << page_size;
      EXPECT_EQ(h.pending_tokens(), tokens.size() % page_size);
      EXPECT_EQ(h.last_key(), expected.empty() ? root : expected.back());
    }
  }
}

TEST(BlockKeyTest, OutParameterOverloadEqualsReturningVersion) {
  std::mt19937 rng(99);
  // One vector reused across calls of every size, as the daemon does: it
  // must be cleared each time, never carry keys over.
  std::vector<BlockKey> out = {BlockKey{1, 2}, BlockKey{3, 4}};
  for (uint32_t page_size : {1u, 4u, 16u, 512u}) {
    const BlockKey root = NamespaceRoot(NamespaceSpec{.page_size = page_size});
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint32_t> tokens(rng() % (page_size * 9 + 3));
      for (uint32_t& t : tokens) t = rng();
      ComputeBlockKeys(root, page_size, tokens, &out);
      const std::vector<BlockKey> expected =
          ComputeBlockKeys(root, page_size, tokens);
      EXPECT_EQ(out, expected) << "page_size " << page_size << ", "
                               << tokens.size() << " tokens";
      EXPECT_EQ(out.size(), tokens.size() / page_size);
    }
  }
  // A large call followed by a small one keeps the capacity and shrinks the
  // contents.
  const BlockKey root = NamespaceRoot(NamespaceSpec{.page_size = 2});
  std::vector<uint32_t> big(200, 7);
  ComputeBlockKeys(root, 2, big, &out);
  ASSERT_EQ(out.size(), 100u);
  const size_t cap = out.capacity();
  const BlockKey* data = out.data();
  ComputeBlockKeys(root, 2, absl::MakeConstSpan(big).first(6), &out);
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(out.capacity(), cap);
  EXPECT_EQ(out.data(), data);
  EXPECT_EQ(out, ComputeBlockKeys(root, 2, absl::MakeConstSpan(big).first(6)));
  // page_size 0 leaves the vector empty.
  ComputeBlockKeys(root, 0, big, &out);
  EXPECT_TRUE(out.empty());
}

TEST(BlockKeyTest, NamespaceFieldsAllMatter) {
  NamespaceSpec base{.model = "m", .page_size = 16, .dtype = DType::kBFloat16};
  const BlockKey r = NamespaceRoot(base);
  auto differs = [&](auto mutate) {
    NamespaceSpec s = base;
    mutate(s);
    return NamespaceRoot(s) != r;
  };
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.model = "n"; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.model_revision = "r"; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.lora = "l"; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.cache_salt = "c"; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.num_layers = 1; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.num_kv_heads = 1; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.head_dim = 1; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.page_size = 8; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.dtype = DType::kFloat16; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.tp_rank = 1; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.tp_size = 2; }));
  EXPECT_TRUE(differs([](NamespaceSpec& s) { s.cross_layer = CrossLayerKv{}; }));
  NamespaceSpec x = base;
  x.cross_layer = CrossLayerKv{1, 0};
  const BlockKey rx = NamespaceRoot(x);
  x.cross_layer->shared_from_layer = 2;
  EXPECT_NE(NamespaceRoot(x), rx);
  x.cross_layer = CrossLayerKv{1, 8};
  EXPECT_NE(NamespaceRoot(x), rx);
  // Length prefixes keep field boundaries: "ab"+"" differs from "a"+"b".
  NamespaceSpec a = base, b = base;
  a.model = "ab";
  b.model = "a";
  b.model_revision = "b";
  EXPECT_NE(NamespaceRoot(a), NamespaceRoot(b));
}

}  // namespace
}  // namespace radixkv
