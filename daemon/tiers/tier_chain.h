// File: daemon/tiers/tier_chain.h
//
// TierChain: the tiers below the page pool, top to bottom (--tier,
// docs/TIERS.md), each a Tier (tier.h). A block is in at most one of them.
// Blocks the pool evicts are put into the first tier; what tier i does
// not keep is offered to tier i + 1 (and dropped below the last); an
// Acquire's blocks come back up from whichever tier holds them. The chain
// knows no tier kind: a new kind is one more Tier implementation.
//
//   TierChain chain(std::move(tiers));   // top first
//   chain.AttachPool(pool);
//   chain.Demote(evicted, &moves);                  // pages -> the tiers
//   size_t n = chain.Promote(keys, pages, &moves);  // keys[0, n) -> pages
//
// Every byte moves through the pool's PageMover, and each call returns
// once its copies are done. No call takes the tree's lock: the caller owns
// the pages it passes (an Acquire's new pages).
//
// Thread safety: thread-safe; concurrent calls move different pages.
#ifndef RADIXKV_DAEMON_TIERS_TIER_CHAIN_H_
#define RADIXKV_DAEMON_TIERS_TIER_CHAIN_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "daemon/tiers/page_mover.h"
#include "daemon/tiers/tier.h"
#include "gpu/pool.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

// How long promotions from one tier take: counts per bucket (bounds in
// seconds; the last bucket is +Inf) and the sum. Thread-safe.
class TierLatency {
 public:
  static constexpr std::array<double, 9> kBounds = {
      1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0};
  void Add(absl::Duration d);
  std::array<uint64_t, kBounds.size() + 1> counts() const;
  double sum_seconds() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

// A block the pool evicted, and its page (still holding its bytes).
struct EvictedPage {
  TierBlock block;
  uint64_t page = 0;
  NamespaceId ns = 0;
};

class TierChain {
 public:
  // REQUIRES: at least one tier, none null, all of one page size. The
  // pool comes later (AttachPool).
  explicit TierChain(std::vector<std::unique_ptr<Tier>> tiers);
  ~TierChain();
  TierChain(const TierChain&) = delete;
  TierChain& operator=(const TierChain&) = delete;

  // Makes `pool` (which outlives the chain) the one whose pages move.
  // Called once, when the pool is created and before any other call but
  // CountPresent / Locate / Flush / stats; INVALID_ARGUMENT when its page
  // size is not the tiers', or the copier's error (cuda: mapping the pool).
  absl::Status AttachPool(const gpu::PagePool* pool);

  // Puts evicted pages into the tiers (blocks none keeps are plain
  // evictions) and appends what moved to *moves.
  void Demote(absl::Span<const EvictedPage> evicted, std::vector<TierMove>* moves);

  // Copies the blocks keys[0, n) into pages[0, n), from whichever tier
  // holds each, and removes them from it (a shared tier keeps its copy);
  // stops at the first block no tier holds or that fails (checksum, copy
  // error). With `root`, only blocks of that namespace count (Tier::TakeIn;
  // a shared tier finds nothing without it). Returns n; pages[i] for
  // i >= n hold unspecified bytes. REQUIRES: pages.size() >= keys.size().
  size_t Promote(absl::Span<const BlockKey> keys,
                 absl::Span<const uint64_t> pages, std::vector<TierMove>* moves,
                 const BlockKey* root = nullptr);

  // Drops the tiers' copies of `keys`, blocks the pool has just cached
  // again (a worker wrote them anew: promotion takes only the run of
  // blocks the tiers hold from the first new one, so a block behind one no
  // tier holds is written again), and appends what left to *moves. A block
  // is thus in one place at a time. Returns how many were dropped.
  size_t Forget(absl::Span<const BlockKey> keys, std::vector<TierMove>* moves);

  // How many of keys[0..] the tiers hold, consecutively from the first;
  // with by_medium, how many of those each medium holds. A block on its
  // way down (a Demote of it has begun, its copy into a tier not ended)
  // is waited for, so it counts: its bytes are in the pool page it left
  // until the copy ends, and the wait lasts that copy, never a disk write.
  // With `root`, scoped to that namespace as Promote is.
  size_t CountPresent(absl::Span<const BlockKey> keys,
                      std::array<size_t, kMediumCount>* by_medium = nullptr,
                      const BlockKey* root = nullptr) const;
  // The medium of the tier holding `key`, or 0; its identity in *out.
  uint8_t Locate(const BlockKey& key, TierBlock* out) const;

  // Tests: runs inside Demote once its blocks are on their way down, before
  // any copy.
  void SetDemoteHookForTesting(std::function<void()> hook) {
    demote_hook_ = std::move(hook);
  }

  // Whether a tier takes committed blocks too (Tier::writes_through).
  bool writes_through() const { return writes_through_; }
  // Copies the pages of just-committed `blocks` out to host memory, then,
  // if `still_held()` (the caller's proof that the pages stayed pinned
  // through the copy) holds, puts them into the tiers that write through;
  // else drops the copies. Returns how many blocks those tiers were
  // offered.
  size_t WriteThrough(absl::Span<const EvictedPage> blocks,
                      absl::FunctionRef<bool()> still_held);

  // Every tier's Flush (SIGTERM).
  void Flush();

  // What Drain did: blocks written to the tier that outlives the process,
  // and blocks it had to leave behind (timeout, no room, write errors, no
  // such tier).
  struct DrainResult {
    uint64_t drained = 0;
    uint64_t left = 0;
  };
  // At shutdown, once no request runs: writes the pool's committed blocks
  // `pool` (hottest first; their pages hold their bytes and stay unchanged
  // during the call) and then those of the tiers above the lowest durable
  // tier (Tier::durable(); each lends its own hottest first) down to that
  // tier, so that a deadline loses the coldest; at most its capacity, the
  // hottest. A restart finds them in recency order
  // (Tier::ReserveSequences). Writes not done by `deadline` are given up;
  // the rest is made durable. Without a durable tier nothing outlives the
  // process: every block is left.
  DrainResult Drain(absl::Span<const EvictedPage> pool, absl::Time deadline);

  // The tiers, top first.
  size_t size() const { return tiers_.size(); }
  // The blocks the chain holds in all; 0 when a tier sizes itself (a
  // shared store) and the total is unknown.
  uint64_t capacity_blocks() const;
  Tier& tier(size_t i) const { return *tiers_[i]; }
  // The first tier of `kind`, or null.
  Tier* Find(TierKind kind) const;
  // Promotions from tier i, timed per run of blocks it held.
  const TierLatency& promotion_latency(size_t i) const { return latency_[i]; }
  // Batches whose copies failed (their blocks were dropped).
  uint64_t copy_errors() const {
    return mover_ == nullptr ? 0 : mover_->copy_errors();
  }

 private:
  class Below;

  const std::vector<std::unique_ptr<Tier>> tiers_;
  const bool writes_through_;
  // Set once by AttachPool, which happens before any Demote or Promote
  // (their callers found the pool through the registry, which publishes it
  // after AttachPool returns).
  std::unique_ptr<PageMover> mover_;
  std::unique_ptr<TierLatency[]> latency_;
  // Keys of blocks Demote is moving (a count per key), for CountPresent.
  mutable Mutex flight_mu_;
  absl::flat_hash_map<BlockKey, uint32_t> in_flight_ ABSL_GUARDED_BY(flight_mu_);
  std::function<void()> demote_hook_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_TIER_CHAIN_H_
