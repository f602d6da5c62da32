// File: daemon/tiers/host_tier.h
//
// HostTier: the tier of host memory below the page pool (--tier=host). Its
// memory is one allocation from the pool's PageCopier (pinned for a cuda
// pool), cut into page_bytes slots, one block per slot. The tier only
// hands out slot addresses and keeps the index; the copies themselves are
// the caller's (PageCopier batches, asynchronous on a cuda pool), which is
// why a slot passes through states the index hides:
//
//   Reserve  free (or least recently stored, whose block is handed back as
//            a victim) -> filling: invisible, the caller copies into it
//   Publish  filling -> stored (ok) or free (the copy failed)
//   Claim    stored -> reading: invisible to other Claims, the caller
//            copies out of it
//   Finish   reading -> free (consumed) or stored again
//
// Guarantees: a slot's bytes are read by no one while it is filling, and
// overwritten by no one while it is reading; a victim's bytes stay in place
// until the Publish of the reservation that took its slot. Nothing survives
// a restart (docs/TIERS.md).
//
// Thread safety: every method is thread-safe; one mutex guards the index
// and no copy happens under it.
#ifndef RADIXKV_DAEMON_TIERS_HOST_TIER_H_
#define RADIXKV_DAEMON_TIERS_HOST_TIER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/tiers/page_mover.h"
#include "daemon/tiers/slot_lru.h"
#include "daemon/tiers/tier.h"
#include "gpu/page_copier.h"
#include "radix/block_key.h"
#include "base/mutex.h"

namespace radixkv::daemon {

// pending: reserved slots whose copy is not published yet; direct_io,
// misses, checksums, reloads and I/O errors stay 0.
using HostTierStats = TierStats;

class HostTier final : public Tier {
 public:
  // A reserved slot. `victim` is set when the slot held a stored block:
  // its bytes are at `dst` until Publish.
  struct Reservation {
    uint32_t slot = 0;
    char* dst = nullptr;
    TierBlock block;
    bool has_victim = false;
    TierBlock victim;
  };

  // Allocates bytes / page_bytes slots of host memory for a pool of
  // `backend` on `device` (gpu::AllocateHostMemory: pinned for cuda).
  // INVALID_ARGUMENT naming --tier=host when the budget is below one page
  // or page_bytes is 0; RESOURCE_EXHAUSTED when the memory cannot be had;
  // FAILED_PRECONDITION for cuda without a usable device.
  static absl::StatusOr<std::unique_ptr<HostTier>> Open(gpu::Backend backend,
                                                        int device,
                                                        uint64_t bytes,
                                                        uint64_t page_bytes);

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Tier. Put keeps the newest blocks that fit, reusing the least recently
  // stored blocks' slots; those, and blocks it cannot hold, go below
  // (oldest first, so the tiers keep one least-recently-demoted order),
  // victims before their slots are overwritten. A failed copy drops its
  // batch. Take claims, copies into the pool and consumes.
  TierKind kind() const override { return TierKind::kHost; }
  void Put(absl::Span<const TierPut> blocks, PageMover& mover, TierSink& below,
           std::vector<TierMove>* moves) override;
  size_t Take(absl::Span<const BlockKey> keys, absl::Span<const uint64_t> pages,
              PageMover& mover, std::vector<TierMove>* moves) override;

  // Reserves slots for blocks[0..n): free slots first, then the least
  // recently stored blocks' (victims, unindexed at once). Stops when no
  // slot can be reused (every slot filling or reading); returns n, with
  // the reservations appended to *out.
  size_t Reserve(absl::Span<const TierBlock> blocks,
                 std::vector<Reservation>* out);
  // Ends reservations: ok, the blocks become stored (a key already stored
  // is replaced); otherwise the slots are freed.
  void Publish(absl::Span<const Reservation> reservations, bool ok);

  // Counts n blocks the tier was offered and could not take (dropped_full).
  void CountDropped(size_t n);

  // How many of keys[0..] are stored, consecutively from the first.
  size_t CountPresent(absl::Span<const BlockKey> keys) const override;
  // The block stored under `key`, if any.
  bool Lookup(const BlockKey& key, TierBlock* out) const override;

  // Claims the stored blocks keys[0..n), consecutively from the first, for
  // reading: their slots go to *slots and their addresses to *src. Returns n.
  size_t Claim(absl::Span<const BlockKey> keys, std::vector<uint32_t>* slots,
               std::vector<const void*>* src);
  // Ends claims: consumed, the blocks leave the tier; otherwise they are
  // stored again (as most recently stored).
  void Finish(absl::Span<const uint32_t> slots, bool consumed);

  // Drain (Tier): lends the stored blocks, most recently stored first,
  // claimed for the call so that nothing reuses their slots meanwhile.
  void LendForDrain(
      absl::FunctionRef<bool(const TierBlock&, const void*)> fn) override;

  // Drops the stored copies of `keys` (blocks the pool caches again, whose
  // pool copy is the one kept), appending their blocks to *dropped. A copy
  // being read is left to its reader (it leaves with the read). Returns how
  // many were dropped.
  size_t Forget(absl::Span<const BlockKey> keys,
                std::vector<TierBlock>* dropped) override;

  HostTierStats stats() const override;
  uint64_t capacity_blocks() const override { return slot_count_; }
  uint64_t page_bytes() const override { return page_bytes_; }

 private:
  enum class SlotState : uint8_t { kFree, kFilling, kStored, kReading };
  struct Slot {
    TierBlock block;
    uint32_t prev = kNoTierSlot;  // LRU links (kStored only)
    uint32_t next = kNoTierSlot;  // LRU, or the free list (kFree)
    SlotState state = SlotState::kFree;
    bool live = false;  // indexed under block.key
  };

  HostTier(std::unique_ptr<gpu::HostMemory> memory, uint64_t page_bytes,
           uint64_t slots);
  char* address(uint32_t slot) const {
    return memory_->data() + uint64_t{slot} * page_bytes_;
  }
  void Unindex(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<gpu::HostMemory> memory_;
  const uint64_t page_bytes_;
  const uint64_t slot_count_;

  // SharedMutex (base/mutex.h), so that ThreadSanitizer checks it.
  mutable SharedMutex mu_;
  absl::flat_hash_map<BlockKey, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  SlotLru<Slot> lru_ ABSL_GUARDED_BY(mu_);  // stored slots
  SlotFreeList<Slot> free_ ABSL_GUARDED_BY(mu_);
  HostTierStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_HOST_TIER_H_
