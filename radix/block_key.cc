// File: radix/block_key.cc
//
// Block-key contract v1 (see block_key.h and docs/CONTRACTS.md §1). Every
// hash input is assembled into one contiguous little-endian byte buffer and
// hashed with a single XXH3_128bits_withSeed(..., 0) call; ComputeBlockKeys
// and BlockHasher reuse one buffer per call so the hot path does not
// allocate per block.
#include "radix/block_key.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "xxhash.h"

namespace radixkv {
namespace {

static_assert(sizeof(XXH128_canonical_t) == BlockKey::kBytes);

// Byte-order helpers: one memcpy (and one bswap where the host order
// differs), which compiles to a single load or store; GCC 12 does not turn
// the equivalent shift loops into that at -O2.
void StoreLE32(char* p, uint32_t v) {
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  std::memcpy(p, &v, sizeof(v));
}

void StoreBE64(char* p, uint64_t v) {
  if constexpr (std::endian::native == std::endian::little) v = __builtin_bswap64(v);
  std::memcpy(p, &v, sizeof(v));
}

// H(b): XXH3-128 with seed 0. The canonical form is high64 then low64, each
// big-endian, and BlockKey{hi, lo} parses it back into exactly those halves,
// so the halves are taken directly (no canonical round trip).
BlockKey Hash(const void* data, size_t len) {
  const XXH128_hash_t h = XXH3_128bits_withSeed(data, len, 0);
  return BlockKey{h.high64, h.low64};
}

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  StoreLE32(b, v);
  out->append(b, 4);
}

void PutStr(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// Writes `tokens` as consecutive u32 little-endian values at `dst`.
void PutTokens(char* dst, absl::Span<const uint32_t> tokens) {
  if constexpr (std::endian::native == std::endian::little) {
    if (!tokens.empty()) {
      std::memcpy(dst, tokens.data(), tokens.size() * sizeof(uint32_t));
    }
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      StoreLE32(dst + 4 * i, tokens[i]);
    }
  }
}

// Reusable hash input for chained block keys without extras:
//   parent(16) || u32(n) || tokens(4n) || u32(0)
class ChainBuffer {
 public:
  explicit ChainBuffer(uint32_t page_size)
      : buf_(Size(page_size)) {
    StoreLE32(buf_.data() + BlockKey::kBytes, page_size);
    StoreLE32(buf_.data() + buf_.size() - 4, 0);
  }

  // REQUIRES: tokens.size() == page_size.
  BlockKey Chain(const BlockKey& parent, absl::Span<const uint32_t> tokens) {
    parent.ToCanonical(buf_.data());
    PutTokens(buf_.data() + BlockKey::kBytes + 4, tokens);
    return Hash(buf_.data(), buf_.size());
  }

 private:
  static size_t Size(uint32_t n) {
    return BlockKey::kBytes + 4 + size_t{4} * n + 4;
  }
  // Inline up to page_size 64 (most models use 16 or 32): no allocation
  // per prompt.
  absl::InlinedVector<char, 24 + 4 * 64> buf_;
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool BlockKey::FromHex(absl::string_view hex, BlockKey* out) {
  if (hex.size() != 2 * kBytes) return false;
  uint64_t halves[2] = {0, 0};
  for (size_t i = 0; i < hex.size(); ++i) {
    int v = HexValue(hex[i]);
    if (v < 0) return false;
    uint64_t& h = halves[i / 16];
    h = (h << 4) | static_cast<uint64_t>(v);
  }
  out->hi = halves[0];
  out->lo = halves[1];
  return true;
}

void BlockKey::ToCanonical(char out[kBytes]) const {
  StoreBE64(out, hi);
  StoreBE64(out + 8, lo);
}

std::string BlockKey::ToCanonical() const {
  std::string s(kBytes, '\0');
  ToCanonical(s.data());
  return s;
}

std::string BlockKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  char raw[kBytes];
  ToCanonical(raw);
  std::string s(2 * kBytes, '0');
  for (size_t i = 0; i < kBytes; ++i) {
    const auto b = static_cast<unsigned char>(raw[i]);
    s[2 * i] = kDigits[b >> 4];
    s[2 * i + 1] = kDigits[b & 0xf];
  }
  return s;
}

uint32_t NamespaceSpec::KvGroups() const {
  if (!cross_layer.has_value()) return num_layers;
  const uint32_t s = cross_layer->shared_from_layer;
  return s == 0 || s >= num_layers ? 0 : s + 1;
}

uint64_t NamespaceSpec::PageBytes() const {
  const uint64_t elem = DTypeBytes(dtype);
  const uint32_t groups = KvGroups();
  if (elem == 0 || groups == 0 || num_kv_heads == 0 || page_size == 0 ||
      head_dim == 0) {
    return 0;
  }
  return uint64_t{groups} * 2 * num_kv_heads * page_size * head_dim * elem;
}

BlockKey NamespaceRoot(const NamespaceSpec& ns) {
  std::string b;
  b.reserve(100 + ns.model.size() + ns.model_revision.size() + ns.lora.size() +
            ns.cache_salt.size());
  PutStr(&b, "radixkv.ns.v1");
  PutStr(&b, ns.model);
  PutStr(&b, ns.model_revision);
  PutStr(&b, ns.lora);
  PutStr(&b, ns.cache_salt);
  PutU32(&b, ns.num_layers);
  PutU32(&b, ns.num_kv_heads);
  PutU32(&b, ns.head_dim);
  PutU32(&b, ns.page_size);
  PutU32(&b, static_cast<uint32_t>(ns.dtype));
  PutU32(&b, ns.tp_rank);
  PutU32(&b, ns.tp_size);
  if (ns.cross_layer.has_value()) {
    PutStr(&b, kCrossLayerTag);
    PutU32(&b, ns.cross_layer->shared_from_layer);
    PutU32(&b, ns.cross_layer->local_window);
  }
  return Hash(b.data(), b.size());
}

BlockKey ChainBlockKey(const BlockKey& parent, absl::Span<const uint32_t> tokens,
                       absl::Span<const BlockExtra> extras) {
  std::string b(BlockKey::kBytes + 4 + 4 * tokens.size(), '\0');
  parent.ToCanonical(b.data());
  StoreLE32(b.data() + BlockKey::kBytes,
                               static_cast<uint32_t>(tokens.size()));
  PutTokens(b.data() + BlockKey::kBytes + 4, tokens);
  PutU32(&b, static_cast<uint32_t>(extras.size()));
  for (const BlockExtra& e : extras) {
    PutStr(&b, e.first);
    PutStr(&b, e.second);
  }
  return Hash(b.data(), b.size());
}

void ComputeBlockKeys(const BlockKey& root, uint32_t page_size,
                      absl::Span<const uint32_t> tokens,
                      std::vector<BlockKey>* out) {
  out->clear();
  AppendBlockKeys(root, page_size, tokens, out);
}

void AppendBlockKeys(const BlockKey& parent, uint32_t page_size,
                     absl::Span<const uint32_t> tokens,
                     std::vector<BlockKey>* out) {
  if (page_size == 0) return;
  const size_t blocks = tokens.size() / page_size;
  if (blocks == 0) return;
  BlockKey key = parent;  // before reserve: `parent` may be out->back()
  out->reserve(out->size() + blocks);
  ChainBuffer buf(page_size);
  for (size_t i = 0; i < blocks; ++i) {
    key = buf.Chain(key, tokens.subspan(i * page_size, page_size));
    out->push_back(key);
  }
}

std::vector<BlockKey> ComputeBlockKeys(const BlockKey& root, uint32_t page_size,
                                       absl::Span<const uint32_t> tokens) {
  std::vector<BlockKey> keys;
  ComputeBlockKeys(root, page_size, tokens, &keys);
  return keys;
}

BlockHasher::BlockHasher(const BlockKey& root, uint32_t page_size)
    : root_(root), page_size_(page_size) {
  pending_.reserve(page_size_);
}

void BlockHasher::Append(absl::Span<const uint32_t> tokens) {
  if (page_size_ == 0) return;
  // Top up the pending partial block first, then key whole blocks straight
  // from `tokens`, and keep the remainder pending.
  size_t pos = 0;
  if (!pending_.empty()) {
    const size_t take =
        std::min<size_t>(page_size_ - pending_.size(), tokens.size());
    pending_.insert(pending_.end(), tokens.begin(), tokens.begin() + take);
    pos = take;
    if (pending_.size() < page_size_) return;
    keys_.push_back(ChainBlockKey(last_key(), pending_));
    pending_.clear();
  }
  const size_t whole = (tokens.size() - pos) / page_size_;
  if (whole > 0) {
    std::vector<BlockKey> more = ComputeBlockKeys(
        last_key(), page_size_, tokens.subspan(pos, whole * page_size_));
    keys_.insert(keys_.end(), more.begin(), more.end());
    pos += whole * page_size_;
  }
  pending_.insert(pending_.end(), tokens.begin() + pos, tokens.end());
}

}  // namespace radixkv
