// File: daemon/tiers/tier.h
//
// The tiers below the page pool (--tier, docs/TIERS.md): the one Tier
// interface every tier kind implements, and the types they share: a
// block's identity (TierBlock), the XXH3-64 block checksum, the stats
// every tier reports, a block's arrival in or departure from a tier
// (TierMove) and where those moves are published (TierEventListener).
//
// Tier kinds, their --tier names and their media are spelled once, in
// kTierKinds. A medium is where a block is: 0 the pool, otherwise the
// medium of the tier kind that holds it.
//
// A TierChain (tier_chain.h) holds tiers top to bottom. It hands each
// tier a PageMover (page_mover.h), which moves bytes between pool pages
// and host memory, and the TierSink of the tiers below it.
//
// Thread safety: every Tier method is thread-safe.
#ifndef RADIXKV_DAEMON_TIERS_TIER_H_
#define RADIXKV_DAEMON_TIERS_TIER_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

class PageMover;

enum class TierKind : uint8_t { kHost, kDisk, kRemote };

// One row per tier kind; the only place their names are spelled.
struct TierKindInfo {
  TierKind kind;
  const char* name;  // --tier, Stats.tiers.kind, Explain, metrics labels
  uint8_t medium;    // TierMove::medium, never 0
  // The KV-event medium of its blocks, and the one used when the pool is
  // host memory too (the tier then needs a name of its own).
  const char* event_medium;
  const char* event_medium_under_host_pool;
};
inline constexpr TierKindInfo kTierKinds[] = {
    {TierKind::kHost, "host", 1, "CPU", "CPU_TIER"},
    {TierKind::kDisk, "disk", 2, "DISK", "DISK"},
    {TierKind::kRemote, "remote", 3, "REMOTE", "REMOTE"},
};
// Media are 0 (the pool) .. kMediumCount - 1.
inline constexpr size_t kMediumCount = 1 + std::size(kTierKinds);
inline constexpr uint8_t kMediumPool = 0;

constexpr const TierKindInfo& TierKindInfoOf(TierKind kind) {
  for (const TierKindInfo& k : kTierKinds) {
    if (k.kind == kind) return k;
  }
  return kTierKinds[0];  // unreachable: every kind has a row
}
constexpr uint8_t TierMedium(TierKind kind) {
  return TierKindInfoOf(kind).medium;
}
// The row of `medium`, or null for the pool or an unknown medium.
const TierKindInfo* TierKindInfoOfMedium(uint8_t medium);
// The kind named `name`, if any.
bool ParseTierKind(absl::string_view name, TierKind* out);

inline constexpr uint8_t kMediumHostTier = TierMedium(TierKind::kHost);
inline constexpr uint8_t kMediumDiskTier = TierMedium(TierKind::kDisk);
inline constexpr uint8_t kMediumRemoteTier = TierMedium(TierKind::kRemote);

// Tiers keep slot numbers in 32 bits; kNoTierSlot is never a slot.
inline constexpr uint32_t kNoTierSlot = 0xffffffffu;

struct TierBlock {  // a block's identity, stored with its bytes
  BlockKey key;         // its chained key (unique across namespaces)
  BlockKey parent_key;  // the parent's key (the root for a first block)
  BlockKey root;        // the namespace root
  uint32_t depth = 0;   // block index in its prompt
  // Tokens per block, for events; a tier that outlives the process need
  // not keep it (0 for a block reloaded at start).
  uint32_t block_size = 0;
};

// XXH3-64 of a block's bytes.
uint64_t BlockChecksum(const void* data, size_t n);

// What a tier reports; a field a kind does not have stays 0.
struct TierStats {
  uint64_t slots = 0;              // capacity in blocks
  uint64_t used = 0;               // blocks present (pending included)
  uint64_t pending = 0;            // arriving, copy or write not finished
  uint64_t demotions = 0;          // blocks accepted
  uint64_t dropped_full = 0;       // blocks refused: no room
  uint64_t dropped_error = 0;      // blocks lost to copy or write errors
  uint64_t promotions = 0;         // blocks taken back into the pool
  uint64_t misses = 0;             // takes that stopped at an absent key
  uint64_t checksum_failures = 0;  // blocks whose header or data failed
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t reloaded = 0;           // blocks found at start
  uint64_t evictions = 0;          // stored blocks whose room was reused
  uint64_t write_errors = 0;
  uint64_t read_errors = 0;
  uint64_t superseded = 0;         // blocks Forget dropped
  uint64_t breaker_trips = 0;      // remote: times its circuit opened
  bool unavailable = false;        // remote: its circuit is open now
  bool pinned = false;             // host memory page-locked for the device
  bool direct_io = false;          // data I/O uses O_DIRECT
};

// A block's arrival in (stored) or departure from a tier.
struct TierMove {
  bool stored = false;
  uint8_t medium = 0;  // the tier's (TierMedium)
  TierBlock block;
  NamespaceId ns = 0;  // for blocks arriving from the pool; 0 otherwise
};

// Where tier moves go (KV events). Called with no tree lock held; the
// same rules as EventListener otherwise (quick, never blocks, never calls
// the tree). A move whose block.root is unset belongs to `root`.
class TierEventListener {
 public:
  virtual ~TierEventListener() = default;
  virtual void OnTierMoves(absl::Span<const TierMove> moves,
                           const BlockKey& root) = 0;
};

// A block offered to a tier: its bytes are either a pool page or host
// memory (a block leaving the tier above), valid for the call.
struct TierPut {
  TierBlock block;
  NamespaceId ns = 0;           // for KV events; 0 when not from the pool
  uint64_t page = 0;            // its pool page, when bytes is null
  const void* bytes = nullptr;  // else its bytes in host memory
};

// The tiers below one tier: where the blocks it does not keep go.
class TierSink {
 public:
  virtual ~TierSink() = default;
  // No tier below: what would go here is dropped.
  virtual bool empty() const = 0;
  // Offers blocks (oldest first) to the tiers below, appending what moved.
  virtual void Put(absl::Span<const TierPut> blocks,
                   std::vector<TierMove>* moves) = 0;
};

class Tier {
 public:
  virtual ~Tier() = default;

  virtual TierKind kind() const = 0;
  uint8_t medium() const { return TierMedium(kind()); }
  const char* name() const { return TierKindInfoOf(kind()).name; }
  virtual uint64_t page_bytes() const = 0;
  virtual uint64_t capacity_blocks() const = 0;

  // put: stores what it can of `blocks` (oldest first), appending their
  // arrivals to *moves. What it does not keep (blocks it cannot take, and
  // stored blocks whose room it reuses, with their departures) it offers
  // to `below` while their bytes are still valid. Returns once every copy
  // out of `blocks` is done.
  virtual void Put(absl::Span<const TierPut> blocks, PageMover& mover,
                   TierSink& below, std::vector<TierMove>* moves) = 0;

  // take: copies the blocks keys[0, n) into the pool pages pages[0, n) and
  // removes them; stops at the first block it does not hold or that fails
  // (checksum, read or copy error). Appends every departure to *moves:
  // the n taken, then blocks dropped for a failed check. Returns n.
  // REQUIRES: pages.size() >= keys.size().
  virtual size_t Take(absl::Span<const BlockKey> keys,
                      absl::Span<const uint64_t> pages, PageMover& mover,
                      std::vector<TierMove>* moves) = 0;

  // The same, scoped to the namespace `root`: a block held under one of
  // `keys` that belongs to another namespace (a key a caller sent in key
  // mode) is absent. The chain calls these when it knows the namespace.
  // By default CountPresent and Take, cut at the first block whose stored
  // root differs; a tier that keys its store by namespace overrides them.
  virtual size_t CountPresentIn(const BlockKey& root,
                                absl::Span<const BlockKey> keys) const;
  virtual size_t TakeIn(const BlockKey& root, absl::Span<const BlockKey> keys,
                        absl::Span<const uint64_t> pages, PageMover& mover,
                        std::vector<TierMove>* moves);

  // A tier that several daemons share (remote): Take copies and leaves the
  // block in place, Forget keeps it (its bytes are the same wherever the
  // key is cached), and its moves are not this daemon's to publish.
  virtual bool shared() const { return false; }
  // A tier that also receives every block the pool caches, as it is
  // committed (TierChain::WriteThrough), not only the blocks evicted.
  virtual bool writes_through() const { return false; }

  // forget: drops its copies of `keys` (blocks the pool caches again),
  // appending their blocks to *dropped. Returns how many were dropped.
  virtual size_t Forget(absl::Span<const BlockKey> keys,
                        std::vector<TierBlock>* dropped) = 0;

  // contains: how many of keys[0..] it holds, consecutively from the first.
  virtual size_t CountPresent(absl::Span<const BlockKey> keys) const = 0;
  // The block it holds under `key`, if any.
  virtual bool Lookup(const BlockKey& key, TierBlock* out) const = 0;

  virtual TierStats stats() const = 0;

  // Makes what it holds durable, where it outlives the process (SIGTERM).
  virtual void Flush() {}

  // Drain at shutdown (TierChain::Drain), once no request runs.
  //
  // A tier whose blocks die with the process lends them, hottest first:
  // calls fn(block, bytes) for each until fn returns false; `bytes` are
  // valid during the call. The blocks stay where they are.
  virtual void LendForDrain(
      absl::FunctionRef<bool(const TierBlock&, const void*)> fn) {
    (void)fn;
  }
  // A tier that outlives the process (durable()) receives them. The
  // drain hands blocks hottest first, yet a restart must find them in
  // recency order (the hottest newest): ReserveSequences(n) reserves n
  // recency ranks above every one used so far and returns the first, and
  // the i-th hottest of n blocks is put with rank first + n - 1 - i.
  // PutForDrain is Put of one block with that rank, waiting for room until
  // `deadline` (false once it has passed or the tier refuses). FinishDrain
  // waits until `deadline` for what it still writes, gives up on the rest
  // (those blocks leave the tier) and makes the rest durable; returns how
  // many it gave up.
  virtual bool durable() const { return false; }
  virtual uint64_t ReserveSequences(uint64_t n) {
    (void)n;
    return 0;
  }
  virtual bool PutForDrain(const TierBlock& block, const void* bytes,
                           uint64_t sequence, absl::Time deadline) {
    (void)block, (void)bytes, (void)sequence, (void)deadline;
    return false;
  }
  virtual size_t FinishDrain(absl::Time deadline) {
    (void)deadline;
    return 0;
  }
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_TIER_H_
