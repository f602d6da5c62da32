// File: radix/block_key.h
//
// Block-key contract v1 (normative; docs/CONTRACTS.md §1 states it byte for
// byte).
//
// A prompt is cut into blocks of `page_size` tokens; only full blocks are
// keyed. Each block's key is a 128-bit XXH3 hash chained from its parent's key,
// so one key names the whole prefix up to and including its block:
//
//   root   = H(ns_bytes)
//   key[0] = H(root     || u32(n) || u32(t) * n || extras_0)
//   key[i] = H(key[i-1] || u32(n) || u32(t) * n || extras_i)
//
// where H is XXH3_128bits_withSeed(bytes, 0) written in canonical form (16
// bytes, big-endian high64 then low64), u32 is 4 little-endian bytes,
// str(s) = u32(len) || bytes, and extras_i = u32(count) || (str(tag) ||
// str(value)) * count (v1 workers send none: u32(0)).
//
// ns_bytes is the eleven namespace fields; a namespace with a cross-layer KV
// layout appends str("radixkv.layout.xlayer.v1") || u32(shared_from_layer)
// || u32(local_window). The eleven-field form is self-delimiting, so a
// namespace without a layout hashes exactly as before and never shares a
// root (hence a block) with one that has a layout.
//
// Workers in any language must compute identical keys; tests/data/
// block_key_vectors.json pins the function down.
//
// Thread safety: everything here is a pure function or a value type; a
// BlockHasher is not shared between threads without external locking.
#ifndef RADIXKV_RADIX_BLOCK_KEY_H_
#define RADIXKV_RADIX_BLOCK_KEY_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/dtype.h"

namespace radixkv {

// The contract version this file implements; a session that asks for another
// version is refused.
inline constexpr uint32_t kBlockKeyVersion = 1;

// A 128-bit block key. `hi` and `lo` are XXH128_hash_t's high64 and low64;
// the canonical byte form is hi big-endian then lo big-endian.
struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  static constexpr size_t kBytes = 16;

  // Parses the 16-byte canonical form; {0, 0} for another size. Inline: key
  // mode parses one per block of every request.
  static BlockKey FromCanonical(absl::string_view bytes) {
    BlockKey k;
    if (bytes.size() != kBytes) return k;
    std::memcpy(&k.hi, bytes.data(), 8);
    std::memcpy(&k.lo, bytes.data() + 8, 8);
    if constexpr (std::endian::native == std::endian::little) {
      k.hi = __builtin_bswap64(k.hi);
      k.lo = __builtin_bswap64(k.lo);
    }
    return k;
  }
  // Parses 32 hex digits (either case); false on any other input.
  static bool FromHex(absl::string_view hex, BlockKey* out);

  // 16 bytes, canonical (big-endian) order.
  std::string ToCanonical() const;
  void ToCanonical(char out[kBytes]) const;
  // 32 lowercase hex digits of the canonical form.
  std::string ToHex() const;

  friend bool operator==(const BlockKey& a, const BlockKey& b) {
    return a.hi == b.hi && a.lo == b.lo;
  }
  friend bool operator!=(const BlockKey& a, const BlockKey& b) {
    return !(a == b);
  }
  // Keys are already uniform hashes; combining the halves is enough.
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.hi ^ k.lo);
  }
};

// A cross-layer KV layout (docs/CONTRACTS.md §1.2 and §2.2): layers
// [0, shared_from_layer) keep their own K/V; layers [shared_from_layer,
// num_layers) all read one shared bank, written once per position; each of
// those upper layers may also keep a local window of its own K/V over the
// last `local_window` tokens, which lives outside pages (a worker rebuilds
// it on a hit). A page holds shared_from_layer + 1 KV groups: the lower
// layers' K/V in layer order, then the bank. Serveable layouts have
// 1 <= shared_from_layer < num_layers and local_window <=
// kMaxCrossLayerWindow; the hash is defined for every value.
struct CrossLayerKv {
  uint32_t shared_from_layer = 0;
  uint32_t local_window = 0;

  friend bool operator==(const CrossLayerKv&, const CrossLayerKv&) = default;
};

// The largest local window a serveable cross-layer layout may declare.
inline constexpr uint32_t kMaxCrossLayerWindow = 65536;

// The tag that starts a cross-layer layout's bytes in ns_bytes.
inline constexpr char kCrossLayerTag[] = "radixkv.layout.xlayer.v1";

// Everything that makes KV reusable (docs/CONCEPTS.md). Blocks are shared only
// between requests with equal NamespaceSpecs.
struct NamespaceSpec {
  std::string model;
  std::string model_revision;
  std::string lora;
  std::string cache_salt;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t page_size = 0;  // tokens per block
  DType dtype = DType::kUnspecified;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  // Unset: per-layer KV (every layer's K/V in each page).
  std::optional<CrossLayerKv> cross_layer;

  // KV groups a page holds: num_layers, or shared_from_layer + 1 with a
  // cross-layer layout; 0 for a cross-layer layout that is not serveable
  // (shared_from_layer 0 or >= num_layers).
  uint32_t KvGroups() const;

  // page_bytes = KvGroups() * 2 * num_kv_heads * page_size * head_dim *
  // DTypeBytes(dtype), without the scale area of fp8/int8 pages
  // (NamespacePageBytes, gpu/namespace_geometry.h, adds it); 0 when the
  // layout is incomplete.
  uint64_t PageBytes() const;

  friend bool operator==(const NamespaceSpec&, const NamespaceSpec&) = default;
};

// One (tag, value) pair of a block's extras (e.g. a multimodal input hash).
using BlockExtra = std::pair<std::string, std::string>;

// root = H(ns_bytes): the namespace id.
BlockKey NamespaceRoot(const NamespaceSpec& ns);

// key[i] from key[i-1] (or the root for i = 0) and the block's tokens.
BlockKey ChainBlockKey(const BlockKey& parent, absl::Span<const uint32_t> tokens,
                       absl::Span<const BlockExtra> extras = {});

// Keys of every full block of `tokens` (a partial tail is ignored).
// REQUIRES: page_size > 0.
std::vector<BlockKey> ComputeBlockKeys(const BlockKey& root, uint32_t page_size,
                                       absl::Span<const uint32_t> tokens);

// The same keys written into `*out`: clears it and appends one key per full
// block, reusing its capacity, so a caller that keeps `out` across calls
// allocates nothing once it has grown. Leaves `out` empty when page_size is 0.
void ComputeBlockKeys(const BlockKey& root, uint32_t page_size,
                      absl::Span<const uint32_t> tokens,
                      std::vector<BlockKey>* out);

// Appends the keys of `tokens`' full blocks chained from `parent` (the key
// of the block before them, or the root) to `*out`; the rest of a prompt
// whose first keys are known. `parent` may refer into *out (out->back()).
// Nothing for page_size 0.
void AppendBlockKeys(const BlockKey& parent, uint32_t page_size,
                     absl::Span<const uint32_t> tokens,
                     std::vector<BlockKey>* out);

// Incremental hasher for a growing token sequence (a decode that keeps
// appending): feeds tokens in any amounts and keys each block as it fills.
//
//   BlockHasher h(NamespaceRoot(ns), ns.page_size);
//   h.Append(prompt);            // keys() holds the prompt's full blocks
//   h.Append(generated_token);   // a new key appears every page_size tokens
class BlockHasher {
 public:
  // REQUIRES: page_size > 0.
  BlockHasher(const BlockKey& root, uint32_t page_size);

  void Append(absl::Span<const uint32_t> tokens);
  void Append(uint32_t token) { Append(absl::MakeConstSpan(&token, 1)); }

  // Keys of the full blocks seen so far, in block order.
  const std::vector<BlockKey>& keys() const { return keys_; }
  // Tokens appended that do not yet fill a block.
  size_t pending_tokens() const { return pending_.size(); }
  // The key the next block chains from (the root before the first block).
  const BlockKey& last_key() const { return keys_.empty() ? root_ : keys_.back(); }

 private:
  BlockKey root_;
  uint32_t page_size_;
  std::vector<uint32_t> pending_;
  std::vector<BlockKey> keys_;
};

}  // namespace radixkv

#endif  // RADIXKV_RADIX_BLOCK_KEY_H_
