// File: daemon/tier_chain.h
//
// TierChain: the tiers below the page pool, top to bottom (--tier,
// docs/TIERS.md): an optional host tier (HostTier: host memory, pinned for
// a cuda pool), then an optional disk tier (DiskTier). A block is in at
// most one of them. Blocks the pool evicts go to the top tier; blocks the
// host tier makes room for go on down to the disk tier; an Acquire's
// blocks come back up from whichever tier holds them.
//
//   TierChain chain(pool, std::move(copier), std::move(host), std::move(disk));
//   chain.Demote(evicted, &moves);           // pages -> the top tier
//   size_t n = chain.Promote(keys, pages, &moves);  // keys[0, n) -> pages
//
// Every byte moves through the pool's PageCopier (cuda: cudaMemcpyAsync on
// a batch's own stream, to and from pinned memory), and each call returns
// once its copies are done. No call takes the tree's lock: the caller owns
// the pages it passes (an Acquire's new pages).
//
// Thread safety: thread-safe; concurrent calls move different pages.
#ifndef RADIXKV_DAEMON_TIER_CHAIN_H_
#define RADIXKV_DAEMON_TIER_CHAIN_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/disk_tier.h"
#include "daemon/host_tier.h"
#include "gpu/page_copier.h"
#include "gpu/pool.h"
#include "radix/block_key.h"
#include "radix/mutex.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

// Where a block is: TreeEvent::medium values (0 is the pool).
inline constexpr uint8_t kMediumHostTier = 1;
inline constexpr uint8_t kMediumDiskTier = 2;

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

// A block's arrival in (stored) or departure from a tier.
struct TierMove {
  bool stored = false;
  uint8_t medium = 0;  // kMediumHostTier or kMediumDiskTier
  TierBlock block;
  NamespaceId ns = 0;  // for blocks arriving from the pool; 0 otherwise
};

// A block the pool evicted, and its page (still holding its bytes).
struct EvictedPage {
  TierBlock block;
  uint64_t page = 0;
  NamespaceId ns = 0;
};

class TierChain {
 public:
  // At least one of host and disk, sized for the pool's page_bytes. The
  // pool itself comes later (AttachPool).
  TierChain(std::unique_ptr<HostTier> host, std::unique_ptr<DiskTier> disk);
  ~TierChain();

  // Makes `pool` (which outlives the chain) the one whose pages move, and
  // its PageCopier the mover. Called once, when the pool is created and
  // before any other call but CountPresent / Locate / Flush / stats;
  // INVALID_ARGUMENT when its page size is not the tiers', or the
  // copier's error (cuda: mapping the pool).
  absl::Status AttachPool(const gpu::PagePool* pool);
  TierChain(const TierChain&) = delete;
  TierChain& operator=(const TierChain&) = delete;

  // Copies evicted pages into the top tier (blocks it cannot take are
  // plain evictions) and appends what moved to *moves.
  void Demote(absl::Span<const EvictedPage> evicted, std::vector<TierMove>* moves);

  // Copies the blocks keys[0, n) into pages[0, n), from whichever tier
  // holds each, and removes them from it; stops at the first block no tier
  // holds or that fails (checksum, copy error). Returns n; pages[i] for
  // i >= n hold unspecified bytes. REQUIRES: pages.size() >= keys.size().
  size_t Promote(absl::Span<const BlockKey> keys,
                 absl::Span<const uint64_t> pages, std::vector<TierMove>* moves);

  // Drops the tiers' copies of `keys`, blocks the pool has just cached
  // again (a worker wrote them anew: promotion takes only the run of
  // blocks the tiers hold from the first new one, so a block behind one no
  // tier holds is written again), and appends what left to *moves. A block
  // is thus in one place at a time. Returns how many were dropped.
  size_t Forget(absl::Span<const BlockKey> keys, std::vector<TierMove>* moves);

  // How many of keys[0..] the tiers hold, consecutively from the first;
  // with by_medium, how many of those each tier holds (index kMedium*).
  size_t CountPresent(absl::Span<const BlockKey> keys,
                      std::array<size_t, 3>* by_medium = nullptr) const;
  // The tier holding `key` (kMedium*), or 0; its identity in *out.
  uint8_t Locate(const BlockKey& key, TierBlock* out) const;

  // The disk tier's Flush (SIGTERM); nothing for the host tier, whose
  // blocks do not outlive the process.
  void Flush();

  HostTier* host() const { return host_.get(); }
  DiskTier* disk() const { return disk_.get(); }
  // Promotions from the host or the disk tier (kMedium*), timed per run
  // of blocks one tier held.
  const TierLatency& promotion_latency(uint8_t medium) const {
    return medium == kMediumHostTier ? host_latency_ : disk_latency_;
  }
  // Batches whose copies failed (their blocks were dropped).
  uint64_t copy_errors() const {
    return copy_errors_.load(std::memory_order_relaxed);
  }

 private:
  // Host memory for a cuda pool's pages on their way to or from the disk
  // tier when no host tier holds them (kBounceBlocks pages each).
  static constexpr size_t kBounceBlocks = 16;
  std::unique_ptr<gpu::HostMemory> TakeBounce();
  void ReturnBounce(std::unique_ptr<gpu::HostMemory> b);

  void DemoteToHost(absl::Span<const EvictedPage> evicted,
                    std::vector<TierMove>* moves);
  void DemoteToDisk(absl::Span<const EvictedPage> evicted,
                    std::vector<TierMove>* moves);
  // A block leaving the host tier for the disk tier (or for nowhere).
  void Spill(const TierBlock& victim, const void* bytes,
             std::vector<TierMove>* moves);
  // Puts one block into the disk tier, reporting what moved.
  void PutOnDisk(const TierBlock& block, const void* bytes, NamespaceId ns,
                 std::vector<TierMove>* moves);
  size_t PromoteFromHost(absl::Span<const BlockKey> keys,
                         absl::Span<const uint64_t> pages,
                         std::vector<TierMove>* moves);
  size_t PromoteFromDisk(absl::Span<const BlockKey> keys,
                         absl::Span<const uint64_t> pages,
                         std::vector<TierMove>* moves);
  // Logs a failed copy (once per distinct message) and counts it.
  void CopyFailed(const absl::Status& s);

  const std::unique_ptr<HostTier> host_;
  const std::unique_ptr<DiskTier> disk_;
  // Set once by AttachPool, which happens before any Demote or Promote
  // (their callers found the pool through the registry, which publishes it
  // after AttachPool returns).
  const gpu::PagePool* pool_ = nullptr;
  std::unique_ptr<gpu::PageCopier> copier_;
  // The pool's pages are addressable here (host pool): the disk tier reads
  // and writes them directly.
  bool direct_ = false;
  std::atomic<uint64_t> copy_errors_{0};
  TierLatency host_latency_;
  TierLatency disk_latency_;

  SharedMutex bounce_mu_;
  std::vector<std::unique_ptr<gpu::HostMemory>> bounce_ ABSL_GUARDED_BY(bounce_mu_);
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIER_CHAIN_H_
