// Fuzzes the namespace and block-key computation (proto/radixkv/
// namespace_spec.h, radix/block_key.h) against a second implementation
// written here from docs/CONTRACTS.md §1: the namespace bytes and each
// block's bytes are built field by field and hashed with XXH3-128 directly.
//
// Checked for arbitrary namespaces, page sizes, tokens and extras:
//   - NamespaceRoot equals H(ns_bytes) of the contract;
//   - ComputeBlockKeys, AppendBlockKeys from any split point, BlockHasher
//     fed in arbitrary pieces and ChainBlockKey (with extras) all equal the
//     contract's chain;
//   - Namespace <-> proto conversions round-trip (tp_size 0 reads as 1),
//     also through the wire form when the strings are UTF-8 (proto3 refuses
//     others on parse), and ValidateNamespace accepts only what
//     the daemon may serve, returning the same spec;
//   - canonical and hex key forms round-trip, and FromHex accepts exactly
//     32 hex digits of either case.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "daemon/rpc/attach_protocol.h"
#include "daemon/core/request_validation.h"
#include "radix/block_key.h"
#include "radixkv/namespace_spec.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::fuzz {
namespace {

#define FUZZ_CHECK(cond, ...)                                         \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: %s\n", #cond,      \
                   absl::StrCat(__VA_ARGS__).c_str());                \
      std::abort();                                                   \
    }                                                                 \
  } while (0)

// --- The contract, written out (docs/CONTRACTS.md §1.1-1.3) ---

void U32(std::string* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b->push_back(static_cast<char>(v >> (8 * i)));
}
void Str(std::string* b, const std::string& s) {
  U32(b, static_cast<uint32_t>(s.size()));
  b->append(s);
}
std::string H(const std::string& b) {
  const XXH128_hash_t h = XXH3_128bits(b.data(), b.size());
  std::string out;
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(h.high64 >> (8 * i)));
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(h.low64 >> (8 * i)));
  return out;
}
std::string RefRoot(const NamespaceSpec& ns) {
  std::string b;
  Str(&b, "radixkv.ns.v1");
  Str(&b, ns.model);
  Str(&b, ns.model_revision);
  Str(&b, ns.lora);
  Str(&b, ns.cache_salt);
  for (uint32_t v : {ns.num_layers, ns.num_kv_heads, ns.head_dim, ns.page_size,
                     static_cast<uint32_t>(ns.dtype), ns.tp_rank, ns.tp_size}) {
    U32(&b, v);
  }
  return H(b);
}
std::string RefChain(const std::string& parent,
                     const std::vector<uint32_t>& tokens, size_t begin,
                     size_t count, const std::vector<BlockExtra>& extras) {
  std::string b = parent;
  U32(&b, static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) U32(&b, tokens[begin + i]);
  U32(&b, static_cast<uint32_t>(extras.size()));
  for (const auto& [tag, value] : extras) {
    Str(&b, tag);
    Str(&b, value);
  }
  return H(b);
}

NamespaceSpec ConsumeSpec(FuzzedDataProvider& in) {
  NamespaceSpec ns;
  ns.model = in.ConsumeRandomLengthString(64);
  ns.model_revision = in.ConsumeRandomLengthString(16);
  ns.lora = in.ConsumeRandomLengthString(16);
  ns.cache_salt = in.ConsumeRandomLengthString(16);
  ns.num_layers = in.ConsumeIntegral<uint32_t>();
  ns.num_kv_heads = in.ConsumeIntegral<uint32_t>();
  ns.head_dim = in.ConsumeIntegral<uint32_t>();
  ns.page_size = in.ConsumeIntegralInRange<uint32_t>(0, 70);
  ns.dtype = static_cast<DType>(in.ConsumeIntegralInRange<uint32_t>(0, 9));
  ns.tp_rank = in.ConsumeIntegral<uint32_t>();
  ns.tp_size = in.ConsumeIntegral<uint32_t>();
  return ns;
}

void CheckKeyForms(const BlockKey& k, FuzzedDataProvider& in) {
  FUZZ_CHECK(BlockKey::FromCanonical(k.ToCanonical()) == k, "canonical");
  const std::string hex = k.ToHex();
  BlockKey back;
  FUZZ_CHECK(hex.size() == 32 && BlockKey::FromHex(hex, &back) && back == k,
             "hex ", hex);
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  FUZZ_CHECK(BlockKey::FromHex(upper, &back) && back == k, "upper hex ", upper);
  // Arbitrary text: accepted iff 32 hex digits, and then it re-prints as
  // the same digits in lower case.
  const std::string text = in.ConsumeRandomLengthString(40);
  bool all_hex = text.size() == 32;
  for (char c : text) all_hex = all_hex && std::isxdigit(static_cast<unsigned char>(c));
  const bool ok = BlockKey::FromHex(text, &back);
  FUZZ_CHECK(ok == all_hex, "FromHex('", text, "') = ", ok);
  if (ok) {
    std::string lower = text;
    for (char& c : lower) c = static_cast<char>(std::tolower(c));
    FUZZ_CHECK(back.ToHex() == lower, "FromHex('", text, "') re-prints ",
               back.ToHex());
  }
}

void CheckNamespace(const NamespaceSpec& spec, FuzzedDataProvider& in) {
  // Conversions and the wire form.
  v1::Namespace proto = NamespaceToProto(spec);
  NamespaceSpec back = NamespaceFromProto(proto);
  NamespaceSpec expect = spec;
  if (expect.tp_size == 0) expect.tp_size = 1;
  FUZZ_CHECK(back == expect, "NamespaceFromProto(NamespaceToProto(spec))");
  // proto3 string fields carry UTF-8 only: a namespace with other bytes in
  // a string does not survive the wire (the daemon never sees it).
  const bool utf8 = daemon::IsValidUtf8(spec.model) &&
                    daemon::IsValidUtf8(spec.model_revision) &&
                    daemon::IsValidUtf8(spec.lora) &&
                    daemon::IsValidUtf8(spec.cache_salt);
  std::string wire;
  proto.SerializeToString(&wire);
  v1::Namespace parsed;
  const bool parses = parsed.ParseFromString(wire);
  FUZZ_CHECK(parses == utf8, "wire form parses: ", parses, ", UTF-8: ", utf8);
  if (parses) {
    FUZZ_CHECK(NamespaceFromProto(parsed) == expect, "wire round trip");
  }

  // What the daemon accepts.
  daemon::RequestLimits limits;
  limits.max_string_bytes = in.ConsumeIntegralInRange<uint32_t>(0, 80);
  limits.max_page_size = in.ConsumeIntegralInRange<uint32_t>(1, 80);
  absl::StatusOr<NamespaceSpec> valid = daemon::ValidateNamespace(proto, limits);
  const unsigned __int128 page_bytes =
      static_cast<unsigned __int128>(spec.num_layers) * 2 * spec.num_kv_heads *
      spec.page_size * spec.head_dim * DTypeBytes(spec.dtype);
  const bool acceptable =
      spec.model.size() <= limits.max_string_bytes &&
      spec.model_revision.size() <= limits.max_string_bytes &&
      spec.lora.size() <= limits.max_string_bytes &&
      spec.cache_salt.size() <= limits.max_string_bytes &&
      spec.page_size >= 1 && spec.page_size <= limits.max_page_size &&
      static_cast<uint32_t>(spec.dtype) <= 6 && spec.tp_rank < expect.tp_size &&
      page_bytes <= (unsigned __int128){1} << 40;
  FUZZ_CHECK(valid.ok() == acceptable, "ValidateNamespace: ",
             valid.ok() ? "accepted" : valid.status().ToString());
  if (valid.ok()) {
    FUZZ_CHECK(*valid == expect, "ValidateNamespace changed the spec");
    const bool complete = spec.num_layers && spec.num_kv_heads &&
                          spec.head_dim && DTypeBytes(spec.dtype);
    FUZZ_CHECK(valid->PageBytes() == (complete ? static_cast<uint64_t>(page_bytes) : 0),
               "PageBytes ", valid->PageBytes());
  }

  // The root as the daemon and the client compute it (after the tp_size
  // normalization), and as the contract states it.
  const BlockKey root = NamespaceRoot(expect);
  FUZZ_CHECK(root.ToCanonical() == RefRoot(expect), "NamespaceRoot");
  CheckKeyForms(root, in);
}

void CheckChain(const BlockKey& root, uint32_t page_size,
                FuzzedDataProvider& in) {
  std::vector<uint32_t> tokens;
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 300);
  for (size_t i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    // Mostly small ids (easier to repeat), sometimes any 32-bit value.
    tokens.push_back(in.ConsumeBool() ? in.ConsumeIntegral<uint32_t>()
                                      : in.ConsumeIntegralInRange<uint32_t>(0, 3));
  }
  std::vector<std::string> ref;
  std::string parent = root.ToCanonical();
  for (size_t b = 0; b + page_size <= tokens.size(); b += page_size) {
    parent = RefChain(parent, tokens, b, page_size, {});
    ref.push_back(parent);
  }
  auto same = [&](const std::vector<BlockKey>& keys, const char* what) {
    FUZZ_CHECK(keys.size() == ref.size(), what, ": ", keys.size(), " keys, ",
               ref.size(), " expected");
    for (size_t i = 0; i < keys.size(); ++i) {
      FUZZ_CHECK(keys[i].ToCanonical() == ref[i], what, ": key ", i);
    }
  };
  same(ComputeBlockKeys(root, page_size, tokens), "ComputeBlockKeys");

  // The rest of a prompt from a known prefix, appended after it.
  const size_t known = ref.empty() ? 0 : in.ConsumeIntegralInRange<size_t>(0, ref.size());
  std::vector<BlockKey> keys = ComputeBlockKeys(
      root, page_size, absl::MakeConstSpan(tokens).subspan(0, known * page_size));
  AppendBlockKeys(keys.empty() ? root : keys.back(), page_size,
                  absl::MakeConstSpan(tokens).subspan(known * page_size), &keys);
  same(keys, "AppendBlockKeys");

  BlockHasher hasher(root, page_size);
  for (size_t pos = 0; pos < tokens.size();) {
    const size_t piece = std::min<size_t>(
        tokens.size() - pos, in.ConsumeIntegralInRange<size_t>(0, 2 * page_size + 1));
    if (piece == 1 && in.ConsumeBool()) {
      hasher.Append(tokens[pos]);
    } else {
      hasher.Append(absl::MakeConstSpan(tokens).subspan(pos, piece));
    }
    pos += piece;
    if (piece == 0 && in.remaining_bytes() == 0) {
      hasher.Append(absl::MakeConstSpan(tokens).subspan(pos));
      pos = tokens.size();
    }
  }
  same(hasher.keys(), "BlockHasher");
  FUZZ_CHECK(hasher.pending_tokens() == tokens.size() % page_size, "pending");

  // One step with extras; its length word is the count of tokens given.
  std::vector<BlockExtra> extras;
  const size_t m = in.ConsumeIntegralInRange<size_t>(0, 3);
  for (size_t i = 0; i < m; ++i) {
    std::string tag = in.ConsumeRandomLengthString(12);
    extras.emplace_back(std::move(tag), in.ConsumeRandomLengthString(24));
  }
  const size_t count = std::min<size_t>(tokens.size(), page_size);
  const BlockKey k = ChainBlockKey(root, absl::MakeConstSpan(tokens).subspan(0, count),
                                   extras);
  FUZZ_CHECK(k.ToCanonical() == RefChain(root.ToCanonical(), tokens, 0, count, extras),
             "ChainBlockKey with ", extras.size(), " extras");
}

}  // namespace
}  // namespace radixkv::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Serializing a non-UTF-8 string logs an error each time; the harness
  // checks the outcome instead.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace radixkv::fuzz;
  FuzzedDataProvider in(data, size);
  const radixkv::NamespaceSpec spec = ConsumeSpec(in);
  CheckNamespace(spec, in);
  radixkv::NamespaceSpec served = spec;
  if (served.tp_size == 0) served.tp_size = 1;
  const uint32_t page_size = served.page_size == 0 ? 1 : served.page_size;
  CheckChain(radixkv::NamespaceRoot(served), page_size, in);
  return 0;
}
