// File: daemon/kv_events_encode.h
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
#ifndef RADIXKV_DAEMON_KV_EVENTS_ENCODE_H_
#define RADIXKV_DAEMON_KV_EVENTS_ENCODE_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

// How a block key travels: its 16 canonical bytes (msgpack bin), or its low
// 64 bits (the last 8 canonical bytes, big-endian) as an unsigned integer,
// the form vLLM publishes by default.
enum class KvHashForm : uint8_t { kBytes, kInt64 };
enum class KvEventEncoding : uint8_t { kMap, kArray };

// "bytes" | "int64"; "map" | "array". INVALID_ARGUMENT names `flag`.
absl::StatusOr<KvHashForm> ParseKvHashForm(absl::string_view value,
                                           absl::string_view flag);
absl::StatusOr<KvEventEncoding> ParseKvEventEncoding(absl::string_view value,
                                                     absl::string_view flag);

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
};

struct KvEncodeOptions {
  KvHashForm hash = KvHashForm::kInt64;
  KvEventEncoding encoding = KvEventEncoding::kMap;
  std::string medium = "CPU";
  int64_t data_parallel_rank = 0;
};

// The namespace's LoRA name for BlockStored.lora_name; null or empty: nil.
using LoraLookup = absl::FunctionRef<const std::string*(NamespaceId ns)>;

// How many events `records` become (runs grouped as described above).
size_t CountKvEvents(absl::Span<const KvRecord> records);

// Encodes `records` (tokens: the array their token_offset indexes) as one
// EventBatch stamped `ts` (Unix seconds).
std::string EncodeKvEventBatch(const KvEncodeOptions& options, double ts,
                               absl::Span<const KvRecord> records,
                               absl::Span<const uint32_t> tokens,
                               LoraLookup lora);

// The low 64 bits of a key (vLLM's integer hash form).
uint64_t KeyLow64(const BlockKey& key);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_KV_EVENTS_ENCODE_H_
