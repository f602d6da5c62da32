#include "daemon/events/kv_events_encode.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "msgpack.hpp"

namespace radixkv::daemon {
namespace {

// The packer's output: the payload buffer itself, so the encoded batch is
// written once and never copied.
struct PayloadSink {
  KvPayload* out;
  void write(const char* data, size_t n) { out->Append(data, n); }
};
using Packer = msgpack::packer<PayloadSink>;
using Kind = KvRecord::Kind;

// Event kinds' tags and the fixed values radixkvd publishes.
constexpr absl::string_view kStoredTag = "BlockStored";
constexpr absl::string_view kRemovedTag = "BlockRemoved";
constexpr absl::string_view kClearedTag = "AllBlocksCleared";
// Every radixkv page holds full-attention K/V of one KV-cache group.
constexpr absl::string_view kSpecKind = "full_attention";

constexpr bool SameName(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// The kKvVllmTierMedia row of tier kind `kind`, or null.
constexpr const KvVllmTierMedia* VllmTierMedia(const char* kind) {
  for (const KvVllmTierMedia& m : kKvVllmTierMedia) {
    if (SameName(m.kind, kind)) return &m;
  }
  return nullptr;
}

constexpr bool EveryTierKindHasVllmMedia() {
  for (const TierKindInfo& k : kTierKinds) {
    const KvVllmTierMedia* m = VllmTierMedia(k.name);
    if (m == nullptr || *m->medium == '\0' ||
        *m->medium_under_host_pool == '\0') {
      return false;
    }
  }
  return true;
}
static_assert(EveryTierKindHasVllmMedia(),
              "a tier kind of kTierKinds has no row in kKvVllmTierMedia");

void Str(Packer& pk, absl::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void Hash(Packer& pk, KvHashForm form, const BlockKey& key) {
  if (form == KvHashForm::kInt64) {
    pk.pack_uint64(key.lo);
    return;
  }
  char c[BlockKey::kBytes];
  key.ToCanonical(c);
  pk.pack_bin(BlockKey::kBytes);
  pk.pack_bin_body(c, BlockKey::kBytes);
}

// Whether record b continues the BlockStored run that a ends.
bool Chains(const KvRecord& a, const KvRecord& b) {
  return b.kind == Kind::kStored && a.kind == Kind::kStored && b.ns == a.ns &&
         b.medium == a.medium &&
         b.depth == a.depth + 1 && b.parent_key == a.key &&
         b.block_size == a.block_size &&
         (b.token_count == 0) == (a.token_count == 0);
}

// The end of the run (one event) that starts at records[i].
size_t RunEnd(absl::Span<const KvRecord> records, size_t i) {
  size_t j = i + 1;
  switch (records[i].kind) {
    case Kind::kStored:
      while (j < records.size() && Chains(records[j - 1], records[j])) ++j;
      return j;
    case Kind::kRemoved:
      while (j < records.size() && records[j].kind == Kind::kRemoved &&
             records[j].medium == records[i].medium) {
        ++j;
      }
      return j;
    case Kind::kCleared:
      return j;
  }
  return j;
}

// Appends token ids as msgpack unsigned integers in their shortest form
// (what pack_uint32 writes), straight into the payload: the token ids are
// most of a BlockStored's bytes. Each id is written as one 8-byte store of
// its tag and big-endian value bytes, of which its encoded length counts;
// the 8 - 5 bytes of slack past the last id stay uncommitted.
void PackTokens(KvPayload* out, absl::Span<const uint32_t> tokens) {
  // By size class: 0 positive fixint, 1 uint8, 2 uint16, 3 uint32.
  static constexpr uint8_t kLength[4] = {1, 2, 3, 5};
  static constexpr uint8_t kTag[4] = {0, 0xcc, 0xcd, 0xce};
  static constexpr uint8_t kShift[4] = {0, 56, 48, 32};
  static_assert(std::endian::native == std::endian::little);
  char* const start = out->Extend(tokens.size() * 5 + 8);
  char* p = start;
  for (const uint32_t t : tokens) {
    const int c = (t >= 0x80) + (t >= 0x100) + (t >= 0x10000);
    // bswap64 puts the id's bytes, most significant first, at the top of
    // the word; the shift brings the c-th class's value bytes down to
    // bytes 1.. (little-endian store order), after the tag in byte 0.
    const uint64_t value = __builtin_bswap64(uint64_t{t}) >> kShift[c];
    const uint64_t word = c == 0 ? uint64_t{t} : (value << 8) | kTag[c];
    std::memcpy(p, &word, 8);
    p += kLength[c];
  }
  out->Commit(static_cast<size_t>(p - start));
}

void PackStored(KvPayload* buf, Packer& pk, const KvEncodeOptions& o,
                absl::Span<const KvRecord> run,
                absl::Span<const uint32_t> tokens, LoraLookup lora) {
  const KvRecord& first = run.front();
  const bool map = o.encoding == KvEventEncoding::kMap;
  if (map) {
    pk.pack_map(10);
    Str(pk, "type");
  } else {
    pk.pack_array(8);
  }
  Str(pk, kStoredTag);
  if (map) Str(pk, "block_hashes");
  pk.pack_array(static_cast<uint32_t>(run.size()));
  for (const KvRecord& r : run) Hash(pk, o.hash, r.key);
  if (map) Str(pk, "parent_block_hash");
  if (first.depth == 0) {
    pk.pack_nil();
  } else {
    Hash(pk, o.hash, first.parent_key);
  }
  if (map) Str(pk, "token_ids");
  size_t n_tokens = 0;
  for (const KvRecord& r : run) n_tokens += r.token_count;
  pk.pack_array(static_cast<uint32_t>(n_tokens));
  for (const KvRecord& r : run) {
    PackTokens(buf, tokens.subspan(r.token_offset, r.token_count));
  }
  if (map) Str(pk, "block_size");
  pk.pack_uint32(first.block_size);
  if (map) Str(pk, "lora_id");
  pk.pack_nil();
  if (map) Str(pk, "medium");
  Str(pk, o.MediumName(first.medium));
  if (map) Str(pk, "lora_name");
  const std::string* name = lora(first.root);
  if (name == nullptr || name->empty()) {
    pk.pack_nil();
  } else {
    Str(pk, *name);
  }
  if (!map) return;
  Str(pk, "group_idx");
  pk.pack_uint32(0);
  Str(pk, "kv_cache_spec_kind");
  Str(pk, kSpecKind);
}

void PackRemoved(Packer& pk, const KvEncodeOptions& o,
                 absl::Span<const KvRecord> run) {
  const bool map = o.encoding == KvEventEncoding::kMap;
  if (map) {
    pk.pack_map(4);
    Str(pk, "type");
  } else {
    pk.pack_array(3);
  }
  Str(pk, kRemovedTag);
  if (map) Str(pk, "block_hashes");
  pk.pack_array(static_cast<uint32_t>(run.size()));
  for (const KvRecord& r : run) Hash(pk, o.hash, r.key);
  if (map) Str(pk, "medium");
  Str(pk, o.MediumName(run.front().medium));
  if (!map) return;
  Str(pk, "group_idx");
  pk.pack_uint32(0);
}

void PackCleared(Packer& pk, const KvEncodeOptions& o) {
  if (o.encoding == KvEventEncoding::kMap) {
    pk.pack_map(1);
    Str(pk, "type");
  } else {
    pk.pack_array(1);
  }
  Str(pk, kClearedTag);
}

}  // namespace

absl::StatusOr<KvHashForm> ParseKvHashForm(absl::string_view value,
                                           absl::string_view flag) {
  if (value == "int64") return KvHashForm::kInt64;
  if (value == "bytes") return KvHashForm::kBytes;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", value,
      ": expected int64 (the key's low 64 bits, vLLM's default) or bytes "
      "(the 16-byte key)"));
}

absl::StatusOr<KvEventEncoding> ParseKvEventEncoding(absl::string_view value,
                                                     absl::string_view flag) {
  if (value == "map") return KvEventEncoding::kMap;
  if (value == "array") return KvEventEncoding::kArray;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", value,
      ": expected map (events keyed by field name, current vLLM) or array "
      "(positional events, vLLM before the switch to maps)"));
}

absl::StatusOr<KvMediaNames> ParseKvMediaNames(absl::string_view value,
                                               absl::string_view flag) {
  if (value == "vllm") return KvMediaNames::kVllm;
  if (value == "radixkv") return KvMediaNames::kRadixkv;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", value,
      ": expected vllm (tier media as vLLM and its routers name them: "
      "CPU or CPU_TIER1, STORAGE, EXTERNAL) or radixkv (radixkv's own: CPU "
      "or CPU_TIER, DISK, REMOTE)"));
}

absl::string_view KvEncodeOptions::MediumName(uint8_t m) const {
  const TierKindInfo* t = TierKindInfoOfMedium(m);
  if (t == nullptr) return medium;
  if (media == KvMediaNames::kVllm) {
    if (const KvVllmTierMedia* v = VllmTierMedia(t->name); v != nullptr) {
      return pool_is_host ? v->medium_under_host_pool : v->medium;
    }
  }
  return pool_is_host ? t->event_medium_under_host_pool : t->event_medium;
}

uint64_t KeyLow64(const BlockKey& key) { return key.lo; }

size_t CountKvEvents(absl::Span<const KvRecord> records) {
  size_t n = 0;
  for (size_t i = 0; i < records.size(); i = RunEnd(records, i)) ++n;
  return n;
}

void KvPayload::Grow(size_t n) {
  const size_t capacity = std::max(size_ + n, capacity_ * 2);
  std::unique_ptr<char[]> data(new char[capacity]);
  if (size_ != 0) std::memcpy(data.get(), data_.get(), size_);
  data_ = std::move(data);
  capacity_ = capacity;
}

void EncodeKvEventBatch(const KvEncodeOptions& options, double ts,
                        absl::Span<const KvRecord> records,
                        absl::Span<const uint32_t> tokens, LoraLookup lora,
                        KvPayload* out) {
  // Room for the whole batch up front: each token id takes at most 5
  // bytes, a record's hash, tags and fields well under 64.
  size_t n_tokens = 0;
  for (const KvRecord& r : records) n_tokens += r.token_count;
  out->clear();
  out->Extend(64 + records.size() * 64 + n_tokens * 5);
  PayloadSink sink{out};
  Packer pk(sink);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(CountKvEvents(records)));
  for (size_t i = 0; i < records.size();) {
    const size_t j = RunEnd(records, i);
    const absl::Span<const KvRecord> run = records.subspan(i, j - i);
    switch (records[i].kind) {
      case Kind::kStored:
        PackStored(out, pk, options, run, tokens, lora);
        break;
      case Kind::kRemoved: PackRemoved(pk, options, run); break;
      case Kind::kCleared: PackCleared(pk, options); break;
    }
    i = j;
  }
  pk.pack_int64(options.data_parallel_rank);
}

std::string EncodeKvEventBatch(const KvEncodeOptions& options, double ts,
                               absl::Span<const KvRecord> records,
                               absl::Span<const uint32_t> tokens,
                               LoraLookup lora) {
  KvPayload payload;
  EncodeKvEventBatch(options, ts, records, tokens, lora, &payload);
  return std::string(payload.view());
}

}  // namespace radixkv::daemon
