// Tests of the block-key contract v1 (radix/block_key.h): the C++ keys must
// equal tests/data/block_key_vectors.json, which an independent Python
// implementation (tests/data/gen_block_key_vectors.py) produced.
#include "radix/block_key.h"

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace radixkv {
namespace {

// A minimal JSON reader (objects, arrays, strings, numbers, true/false/null)
// for the vectors file; no dependency beyond the standard library.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& operator[](const std::string& k) const {
    static const Json kMissing;
    auto it = fields.find(k);
    return it == fields.end() ? kMissing : it->second;
  }
  uint32_t u32() const { return static_cast<uint32_t>(number); }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  bool Parse(Json* out) {
    if (!Value(out)) return false;
    Skip();
    return pos_ == s_.size();
  }

 private:
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Literal(const char* word) {
    const std::string w(word);
    if (s_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }
  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return false;
      char e = s_[pos_++];
      switch (e) {
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return false;
          AppendUtf8(out, std::stoul(s_.substr(pos_, 4), nullptr, 16));
          pos_ += 4;
          break;
        }
        default: out->push_back(e); break;  // \" \\ \/
      }
    }
    return false;
  }
  bool Value(Json* v) {
    Skip();
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '{') {
      v->kind = Json::kObject;
      ++pos_;
      if (Eat('}')) return true;
      do {
        std::string key;
        Skip();
        if (!String(&key) || !Eat(':') || !Value(&v->fields[key])) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      v->kind = Json::kArray;
      ++pos_;
      if (Eat(']')) return true;
      do {
        v->items.emplace_back();
        if (!Value(&v->items.back())) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      v->kind = Json::kString;
      return String(&v->str);
    }
    if (Literal("true")) { v->kind = Json::kBool; v->number = 1; return true; }
    if (Literal("false")) { v->kind = Json::kBool; return true; }
    if (Literal("null")) return true;
    size_t used = 0;
    v->kind = Json::kNumber;
    v->number = std::stod(s_.substr(pos_, 32), &used);
    pos_ += used;
    return used > 0;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

const Json& Vectors() {
  static const Json* doc = [] {
    std::ifstream in(std::string(RADIXKV_TEST_DATA_DIR) +
                     "/block_key_vectors.json");
    std::stringstream ss;
    ss << in.rdbuf();
    auto* j = new Json;
    const std::string text = ss.str();
    if (!JsonParser(text).Parse(j)) j->kind = Json::kNull;
    return j;
  }();
  return *doc;
}

NamespaceSpec SpecOf(const Json& ns) {
  NamespaceSpec s;
  s.model = ns["model"].str;
  s.model_revision = ns["model_revision"].str;
  s.lora = ns["lora"].str;
  s.cache_salt = ns["cache_salt"].str;
  s.num_layers = ns["num_layers"].u32();
  s.num_kv_heads = ns["num_kv_heads"].u32();
  s.head_dim = ns["head_dim"].u32();
  s.page_size = ns["page_size"].u32();
  s.dtype = static_cast<DType>(ns["dtype"].u32());
  s.tp_rank = ns["tp_rank"].u32();
  s.tp_size = ns["tp_size"].u32();
  return s;
}

std::vector<uint32_t> TokensOf(const Json& list) {
  std::vector<uint32_t> t;
  for (const Json& x : list.items) t.push_back(x.u32());
  return t;
}

TEST(BlockKeyVectorsTest, FileCoversTheContract) {
  const Json& doc = Vectors();
  ASSERT_EQ(doc.kind, Json::kObject) << "cannot read or parse the vectors file";
  const Json& v = doc["vectors"];
  ASSERT_GE(v.items.size(), 20u);
  bool page1 = false, page16 = false, page512 = false, high = false,
       salt = false, lora = false, empty = false, tail = false, several = false;
  for (const Json& x : v.items) {
    const NamespaceSpec s = SpecOf(x["namespace"]);
    const std::vector<uint32_t> t = TokensOf(x["tokens"]);
    page1 |= s.page_size == 1;
    page16 |= s.page_size == 16;
    page512 |= s.page_size == 512;
    salt |= !s.cache_salt.empty();
    lora |= !s.lora.empty();
    empty |= s.model.empty() && s.lora.empty() && s.cache_salt.empty();
    tail |= t.size() % s.page_size != 0;
    several |= x["block_keys"].items.size() >= 3;
    for (uint32_t tok : t) high |= tok >= 0x80000000u;
  }
  EXPECT_TRUE(page1 && page16 && page512);
  EXPECT_TRUE(high && salt && lora && empty && tail && several);
}

TEST(BlockKeyVectorsTest, RootsAndKeysMatch) {
  const Json& v = Vectors()["vectors"];
  ASSERT_FALSE(v.items.empty());
  for (const Json& x : v.items) {
    SCOPED_TRACE(x["name"].str);
    const NamespaceSpec spec = SpecOf(x["namespace"]);
    const std::vector<uint32_t> tokens = TokensOf(x["tokens"]);
    const BlockKey root = NamespaceRoot(spec);
    EXPECT_EQ(root.ToHex(), x["root"].str);
    const std::vector<BlockKey> keys =
        ComputeBlockKeys(root, spec.page_size, tokens);
    ASSERT_EQ(keys.size(), x["block_keys"].items.size());
    std::vector<BlockKey> reused(3);
    ComputeBlockKeys(root, spec.page_size, tokens, &reused);
    EXPECT_EQ(reused, keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(keys[i].ToHex(), x["block_keys"].items[i].str) << "block " << i;
      // The one-block primitive agrees with the bulk path.
      const BlockKey parent = i == 0 ? root : keys[i - 1];
      EXPECT_EQ(ChainBlockKey(parent, absl::MakeConstSpan(tokens).subspan(
                                          i * spec.page_size, spec.page_size)),
                keys[i]);
    }
  }
}

TEST(BlockKeyVectorsTest, ExtrasMatch) {
  const Json& v = Vectors()["chain_with_extras"];
  ASSERT_FALSE(v.items.empty());
  for (const Json& x : v.items) {
    SCOPED_TRACE(x["name"].str);
    BlockKey parent;
    ASSERT_TRUE(BlockKey::FromHex(x["parent"].str, &parent));
    std::vector<BlockExtra> extras;
    for (const Json& e : x["extras"].items) {
      extras.emplace_back(e.items[0].str, e.items[1].str);
    }
    EXPECT_EQ(ChainBlockKey(parent, TokensOf(x["tokens"]), extras).ToHex(),
              x["key"].str);
  }
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
  // Length prefixes keep field boundaries: "ab"+"" differs from "a"+"b".
  NamespaceSpec a = base, b = base;
  a.model = "ab";
  b.model = "a";
  b.model_revision = "b";
  EXPECT_NE(NamespaceRoot(a), NamespaceRoot(b));
}

}  // namespace
}  // namespace radixkv
