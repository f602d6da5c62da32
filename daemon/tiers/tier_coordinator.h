// File: daemon/tiers/tier_coordinator.h
//
// TierCoordinator: Cache's one counterpart for the tiers below the pool.
// It owns every move between the pool and the TierChain and publishes
// them (TierEventListener: the event log, which hands them to KV events);
// Cache calls one hook per request that concerns the tiers:
//
//   tree Acquire (report_evictions, hold_new_pages) -> AfterAcquire
//   tree Commit (report_inserted)                   -> AfterCommit
//   tree Match                                      -> AfterMatch
//
// AfterAcquire copies the blocks the Acquire evicted out of their pages
// into the tiers, then fills the lease's first new pages from the tiers'
// blocks that continue the match and commits them, so the lease comes back
// as if they had been cached. It runs after the tree's Acquire and before
// the answer: the evicted pages are the lease's new pages, which nobody
// writes until the answer arrives, and the tree holds them until
// ReleaseHold whatever ends the lease meanwhile.
//
// Thread safety: thread-safe. No hook is called with a tree lock held; the
// hooks take it through the tree's own calls.
#ifndef RADIXKV_DAEMON_TIERS_TIER_COORDINATOR_H_
#define RADIXKV_DAEMON_TIERS_TIER_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/tiers/tier.h"
#include "daemon/tiers/tier_chain.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

class TierCoordinator {
 public:
  // `events` (not owned) outlives the coordinator.
  TierCoordinator(std::shared_ptr<TierChain> chain, TierEventListener* events);
  TierCoordinator(const TierCoordinator&) = delete;
  TierCoordinator& operator=(const TierCoordinator&) = delete;

  TierChain& chain() const { return *chain_; }

  // After `tree`'s Acquire for a session bound to `ns` (blocks of
  // page_size tokens) and owned by `owner`: demotes r->evicted, promotes
  // what continues the match into the lease's new pages, ends the tree's
  // hold on them, and moves the promoted blocks from r's new blocks to its
  // matched ones. Returns how many blocks were promoted.
  uint32_t AfterAcquire(RadixTree* tree, NamespaceId ns, uint32_t page_size,
                        OwnerId owner, AcquireResult* r);

  // After a Commit in namespace `ns` inserted `keys`: drops the tiers'
  // older copies of them.
  void AfterCommit(RadixTree* tree, NamespaceId ns,
                   absl::Span<const BlockKey> keys);

  // Whether committed blocks also go to a tier (write-through), in which
  // case Cache commits without releasing, calls WriteThrough, then
  // releases.
  bool writes_through() const { return chain_->writes_through(); }
  // After a Commit in namespace `ns` (blocks of page_size tokens) that
  // inserted r.inserted_keys at r.inserted_pages and kept its lease, so
  // those pages stay pinned while the lease lives: copies them to the
  // write-through tiers if `still_held()` says the lease lived through the
  // copy. Returns how many blocks went.
  size_t WriteThrough(RadixTree* tree, NamespaceId ns, uint32_t page_size,
                      const CommitResult& r,
                      absl::FunctionRef<bool()> still_held);

  // After a Match in the namespace `root` found the first `matched` of the
  // prompt's blocks `keys`: the blocks of that namespace that follow,
  // consecutively, that the tiers hold, in total and per tier (one entry
  // per tier, top first).
  struct TierMatch {
    uint32_t blocks = 0;
    std::vector<std::pair<std::string_view, uint32_t>> per_tier;
  };
  TierMatch AfterMatch(const BlockKey& root, absl::Span<const BlockKey> keys,
                       uint32_t matched) const;

  // At shutdown, once no request runs: writes `tree`'s committed blocks
  // (most recently used first; null: no pool yet) and the host tier's down
  // to the disk tier until `deadline` (TierChain::Drain).
  TierChain::DrainResult Drain(const RadixTree* tree, absl::Time deadline);

  // One tier's figures for Stats.tiers, top first.
  struct TierReport {
    std::string_view name;  // the tier's kind, e.g. "host"
    uint64_t page_bytes = 0;
    TierStats stats;
    const TierLatency* promotion_latency = nullptr;  // the chain's
  };
  std::vector<TierReport> Report() const;
  // Copy failures of the chain's page mover.
  uint64_t copy_errors() const { return chain_->copy_errors(); }
  // The tokens promotions served: hits for the workers that asked.
  uint64_t promoted_tokens() const {
    return promoted_tokens_.load(std::memory_order_relaxed);
  }
  // Evicted blocks the eviction policy declined to demote
  // (EvictedBlock::demote false): no tier was offered them.
  uint64_t policy_dropped() const {
    return policy_dropped_.load(std::memory_order_relaxed);
  }

 private:
  void Publish(absl::Span<const TierMove> moves, const BlockKey& root);

  const std::shared_ptr<TierChain> chain_;
  TierEventListener* const events_;
  // The tokens promotions served (hits for the workers that asked).
  std::atomic<uint64_t> promoted_tokens_{0};
  std::atomic<uint64_t> policy_dropped_{0};
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_TIER_COORDINATOR_H_
