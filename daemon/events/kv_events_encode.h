// File: daemon/events/kv_events_encode.h
//
// The msgpack encoding of radixkvd's KV events in vLLM's wire format
// (docs/EVENTS.md has the format and the vLLM version it follows). An
// EventBatch is a 3-element array [ts, events, data_parallel_rank]; each
// event is a tagged union member, BlockStored, BlockRemoved or
// AllBlocksCleared, written as a map keyed by field name with the tag under
// "type" (KvEventEncoding::kMap, what vLLM publishes) or as a positional
// array with the tag first (kArray, the layout of vLLM releases before the
// switch to maps, for consumers that still decode only that).
//
// The encoder groups block records into events the way vLLM does: a run of
// stored blocks that chain (each one's parent is the block before it, same
// namespace) is one BlockStored whose parent_block_hash is the run's parent
// (nil for a run that starts at a first block) and whose token_ids are the
// run's tokens; a run of removed blocks is one BlockRemoved.
//
// Thread safety: pure functions.
#ifndef RADIXKV_DAEMON_EVENTS_KV_EVENTS_ENCODE_H_
#define RADIXKV_DAEMON_EVENTS_KV_EVENTS_ENCODE_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/tiers/tier.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

// How a block key travels: its 16 canonical bytes (msgpack bin), or its low
// 64 bits (the last 8 canonical bytes, big-endian) as an unsigned integer,
// the form vLLM publishes by default.
enum class KvHashForm : uint8_t { kBytes, kInt64 };
enum class KvEventEncoding : uint8_t { kMap, kArray };
// Which names the tiers' media take (docs/EVENTS.md has the table). kVllm:
// the names vLLM publishes and the routers that index its events (Dynamo,
// llm-d) sort into tiers: "CPU" for the host tier (a distinct host name
// below a host pool), "STORAGE" for the disk tier, "EXTERNAL" for the
// remote tier. kRadixkv: radixkv's own, the event_medium columns of
// kTierKinds ("CPU_TIER", "DISK", "REMOTE"). The pool's medium ("GPU" or
// "CPU") is the same in both.
enum class KvMediaNames : uint8_t { kVllm, kRadixkv };

// "bytes" | "int64"; "map" | "array"; "vllm" | "radixkv". INVALID_ARGUMENT
// names `flag` and the values it takes.
absl::StatusOr<KvHashForm> ParseKvHashForm(absl::string_view value,
                                           absl::string_view flag);
absl::StatusOr<KvEventEncoding> ParseKvEventEncoding(absl::string_view value,
                                                     absl::string_view flag);
absl::StatusOr<KvMediaNames> ParseKvMediaNames(absl::string_view value,
                                               absl::string_view flag);

// A tier kind's media under KvMediaNames::kVllm, by its --tier name
// (TierKindInfo::name): the medium of its blocks, and the one used when
// the pool is host memory too (the tier then needs a name of its own).
// Every kind of kTierKinds has a row (checked at compile time).
struct KvVllmTierMedia {
  const char* kind;
  const char* medium;
  const char* medium_under_host_pool;
};
inline constexpr KvVllmTierMedia kKvVllmTierMedia[] = {
    {"host", "CPU", "CPU_TIER1"},
    {"disk", "STORAGE", "STORAGE"},
    {"remote", "EXTERNAL", "EXTERNAL"},
};

// One block-level change, as the publisher queues it.
struct KvRecord {
  enum class Kind : uint8_t { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  NamespaceId ns = 0;
  uint32_t depth = 0;         // kStored: 0 = a first block
  uint32_t block_size = 0;    // kStored
  BlockKey key;               // kStored, kRemoved
  BlockKey parent_key;        // kStored: the namespace root at depth 0
  uint64_t token_offset = 0;  // kStored: into the batch's token array
  uint32_t token_count = 0;   // kStored: block_size, or 0 (key mode)
  BlockKey root;              // kStored, kRemoved: the namespace's root
  uint8_t medium = 0;         // 0 the pool, else a tier's (daemon/tiers/tier.h)
};

struct KvEncodeOptions {
  KvHashForm hash = KvHashForm::kInt64;
  KvEventEncoding encoding = KvEventEncoding::kMap;
  KvMediaNames media = KvMediaNames::kVllm;
  // The pool's medium.
  std::string medium = "CPU";
  // The pool is host memory: tiers of host memory below it take the
  // medium names kept for that case.
  bool pool_is_host = false;
  // The medium name for KvRecord::medium `m`: the pool's for 0 (and for a
  // medium no tier kind has), else its tier kind's under `media`.
  absl::string_view MediumName(uint8_t m) const;
  int64_t data_parallel_rank = 0;
};

// The namespace's LoRA name for BlockStored.lora_name; null or empty: nil.
using LoraLookup = absl::FunctionRef<const std::string*(const BlockKey& root)>;

// How many events `records` become (runs grouped as described above).
size_t CountKvEvents(absl::Span<const KvRecord> records);

// A growable byte buffer whose spare capacity is left uninitialised: the
// encoder writes a batch straight into it, and the publisher recycles them,
// so that a steady event flow allocates (and faults in) no new memory.
class KvPayload {
 public:
  KvPayload() = default;
  KvPayload(const KvPayload&) = delete;
  KvPayload& operator=(const KvPayload&) = delete;

  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  absl::string_view view() const { return {data_.get(), size_}; }
  // Empties the buffer; the capacity stays.
  void clear() { size_ = 0; }

  // Makes room for `n` more bytes and returns where they go; the caller
  // writes at most `n` bytes there and then calls Commit with the count.
  char* Extend(size_t n) {
    if (capacity_ - size_ < n) Grow(n);
    return data_.get() + size_;
  }
  void Commit(size_t n) { size_ += n; }
  void Append(const char* p, size_t n) {
    std::memcpy(Extend(n), p, n);
    size_ += n;
  }

 private:
  void Grow(size_t n);

  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// Encodes `records` (tokens: the array their token_offset indexes) as one
// EventBatch stamped `ts` (Unix seconds), replacing `*out`'s contents.
void EncodeKvEventBatch(const KvEncodeOptions& options, double ts,
                        absl::Span<const KvRecord> records,
                        absl::Span<const uint32_t> tokens, LoraLookup lora,
                        KvPayload* out);
// The same batch as a string.
std::string EncodeKvEventBatch(const KvEncodeOptions& options, double ts,
                               absl::Span<const KvRecord> records,
                               absl::Span<const uint32_t> tokens,
                               LoraLookup lora);

// The low 64 bits of a key (vLLM's integer hash form).
uint64_t KeyLow64(const BlockKey& key);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_EVENTS_KV_EVENTS_ENCODE_H_
