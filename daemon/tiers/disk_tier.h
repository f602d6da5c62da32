// File: daemon/tiers/disk_tier.h
//
// DiskTier: the tier below the page pool. Blocks the pool evicts (their
// page bytes and identity) are written to one preallocated file on local
// storage, DIR/radixkv-tier.dat, one block per fixed-size slot; a later
// Acquire that finds them reads them back into pool pages (promotion), and
// a restarted daemon finds them again. docs/TIERS.md has the file format.
//
//   auto tier = DiskTier::Open({.path = "/var/lib/radixkv", .bytes = 64 << 30,
//                               .page_bytes = pool->page_bytes()});
//   tier.value()->Put(block, page);             // demotion; never waits for I/O
//   size_t n = tier.value()->Take(keys, pages); // promotion of keys[0, n)
//
// Guarantees:
//   - A block's bytes are written before its header, and every header
//     carries an XXH3-64 of the data and a hash of itself; Take verifies both
//     and the key. A crash or a torn write therefore yields a miss, never
//     another block's bytes.
//   - Staging memory is bounded by max_pending_bytes; Put refuses a block
//     rather than wait. A write error drops the block and makes Put refuse
//     for write_error_backoff.
//   - The in-memory index is a flat_hash_map from key to slot plus an
//     intrusive LRU over the stored slots; no I/O happens under its mutex.
//
// Thread safety: every method is thread-safe. The I/O runs on io_threads
// threads that the tier owns; reads (Take) go before queued writes.
#ifndef RADIXKV_DAEMON_TIERS_DISK_TIER_H_
#define RADIXKV_DAEMON_TIERS_DISK_TIER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/tiers/disk_tier_io.h"
#include "daemon/tiers/page_mover.h"
#include "daemon/tiers/slot_lru.h"
#include "daemon/tiers/tier.h"
#include "radix/block_key.h"

namespace radixkv::daemon {

struct DiskTierOptions {
  std::string path;         // a directory; the tier file is path/radixkv-tier.dat
  uint64_t bytes = 0;       // the file's size budget (slots = bytes / slot size)
  uint64_t page_bytes = 0;  // bytes per block (the pool's page size), > 0
  int io_threads = 2;       // 1..64
  // Staged writes not yet on disk: page_bytes per block.
  uint64_t max_pending_bytes = 64ull << 20;
  // O_DIRECT for block data where the filesystem allows it (else buffered).
  bool direct_io = true;
  // After a write error, Put refuses blocks (dropped_error) for this long.
  absl::Duration write_error_backoff = absl::Seconds(1);
  // Write-through (--tier ... demote=wait): Put waits for staging room
  // instead of dropping the block, and returns once every write queued so
  // far (its own included) has finished. No block is lost to a slow disk,
  // and blocks reach the file, and its LRU order, in the order they were
  // put; the demoting caller pays the disk's time.
  bool wait_for_staging = false;
};

// pending: blocks staged, write not finished; pinned stays false.
using DiskTierStats = TierStats;

class DiskTier final : public Tier {
 public:
  // Opens (creating if absent) path/radixkv-tier.dat sized for bytes/slot,
  // and reloads every slot whose header is valid and whose page_bytes
  // matches (a file made with another page size or budget is reset, with a
  // log line). Errors are INVALID_ARGUMENT / FAILED_PRECONDITION naming
  // "--tier=disk" and the problem: path missing or not a directory, not
  // writable, bytes too small for one slot, the filesystem cannot hold the
  // file, page_bytes 0, io_threads out of range, max_pending_bytes below
  // one block, the file locked by another process.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& o);

  // Flush()es, then stops the I/O threads. REQUIRES: no call in progress.
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Tier. Put writes each block (Put below) from host memory: a host
  // pool's page directly, a device page through the mover's staging
  // buffers; a block it refuses goes below. Its own LRU victims are not
  // passed down (their bytes are on disk only). Take reads into the pool's
  // pages the same ways; blocks dropped for a failed check leave as
  // departures.
  TierKind kind() const override { return TierKind::kDisk; }
  void Put(absl::Span<const TierPut> blocks, PageMover& mover, TierSink& below,
           std::vector<TierMove>* moves) override;
  size_t Take(absl::Span<const BlockKey> keys, absl::Span<const uint64_t> pages,
              PageMover& mover, std::vector<TierMove>* moves) override;

  // Copies `page` (page_bytes) into a staging buffer and queues its write;
  // never waits for I/O, except with wait_for_staging (write-through, see
  // DiskTierOptions). Returns false (dropped_full) when
  // max_pending_bytes would be exceeded (without wait_for_staging), or
  // (dropped_error) within write_error_backoff of a write error; a dropped
  // block is simply not in the tier. A key already present is replaced.
  // The tier holds at most capacity_blocks() blocks, pending ones included,
  // in the order they were put: when it is full, the least recently put
  // block leaves (stored: its slot is reused; pending: its staged write is
  // cancelled, or its slot is freed when the running write ends). A block
  // is present from Put on, whether or not its write has reached the file,
  // so the tier is exactly an LRU of capacity_blocks() blocks by put order
  // however far the disk lags behind (within max_pending_bytes). The
  // blocks that left for this one are appended to *forgotten (when not
  // null).
  bool Put(const TierBlock& block, const void* page,
           std::vector<TierBlock>* forgotten = nullptr);

  // How many of keys[0..] are present, consecutively from the first
  // (pending writes count as present).
  size_t CountPresent(absl::Span<const BlockKey> keys) const override;

  // Reads blocks keys[0..n) into dst[i] (page_bytes each), n =
  // min(keys.size(), dst.size()), with parallel reads, verifying each
  // block's header (valid, key == keys[i]) and data checksum; stops at the
  // first block that is absent or fails (a failed one is dropped and
  // counted). Returns how many leading blocks were read; those are removed
  // from the tier. Later blocks stay; dst[i] for i >= the result holds
  // unspecified bytes. A block still pending is served from its staging
  // buffer. The keys of blocks dropped for a failed check or read are
  // appended to *dropped (when not null).
  size_t Take(absl::Span<const BlockKey> keys, absl::Span<void* const> dst,
              std::vector<BlockKey>* dropped = nullptr);

  // Drops the present copies of `keys` (blocks the pool caches again,
  // whose pool copy is the one kept), stored or pending, appending their
  // blocks to *dropped; a block being read leaves with the read. Returns how
  // many were dropped.
  size_t Forget(absl::Span<const BlockKey> keys,
                std::vector<TierBlock>* dropped) override;

  // Metadata of a present block (for events, Explain), if present.
  bool Lookup(const BlockKey& key, TierBlock* out) const override;

  // Waits until every pending write is on disk (data, then its header),
  // then fdatasync()s the file. For SIGTERM. REQUIRES: writes not paused.
  void Flush() override;

  // Drain at shutdown (Tier): the disk tier outlives the process. A full
  // tier makes room as Put does, least recently put first, so a drain of
  // at most capacity_blocks() blocks keeps them all. FinishDrain cancels
  // the queued writes not started by the deadline, waits for the running
  // ones and fdatasync()s.
  bool durable() const override { return true; }
  uint64_t ReserveSequences(uint64_t n) override;
  bool PutForDrain(const TierBlock& block, const void* bytes,
                   uint64_t sequence, absl::Time deadline) override;
  size_t FinishDrain(absl::Time deadline) override;

  DiskTierStats stats() const override;
  uint64_t capacity_blocks() const override { return layout_.slots; }
  uint64_t page_bytes() const override { return layout_.page_bytes; }
  const std::string& file_path() const { return file_path_; }
  const disk_tier::Layout& layout() const { return layout_; }

  // Tests: while paused, queued writes stay pending (reads still run).
  void SetWritesPausedForTesting(bool paused);

 private:
  // An entry is one block the tier holds or moves; a slot is a place in
  // the file. Entries outnumber slots by the staging budget, so that a
  // block can be present (staged) before any slot is free for it:
  //   kFree     unused
  //   kPending  staged: its write is queued (phys == kNoSlot) or running
  //             (phys is the slot it writes)
  //   kStored   its bytes and header are in slot phys
  //   kReading  claimed by a Take that reads slot phys
  // A slot is used by at most one entry; it is reused only when that
  // entry is freed, never while a write to it or a read of it runs.
  enum class SlotState : uint8_t { kFree, kPending, kStored, kReading };
  struct Slot {
    TierBlock block;
    uint64_t sequence = 0;  // of the entry's latest write
    uint32_t prev = kNoTierSlot;  // LRU links (live: kPending, kStored)
    uint32_t next = kNoTierSlot;  // LRU, or the free list (kFree)
    uint32_t phys = kNoTierSlot;  // its slot in the file, if any
    SlotState state = SlotState::kFree;
    bool live = false;  // indexed under block.key, and in the LRU
  };
  class StagingPool;
  using Staged = std::shared_ptr<char>;
  // A queued write names its entry; the slot, block and bytes are filled
  // in when an I/O thread starts it (StartWrite).
  struct WriteJob {
    uint32_t entry;
    uint64_t sequence;
    uint32_t slot = kNoTierSlot;
    TierBlock block;
    Staged data;
  };
  struct ReadBatch;
  struct ReadJob {
    uint32_t slot;
    uint64_t sequence;  // the header must carry it, with `key`
    BlockKey key;
    void* dst;
    ReadBatch* batch;
    size_t index;
  };
  enum class ReadResult : uint8_t { kOk, kBadHeader, kBadChecksum, kError };
  struct Claim {
    uint32_t entry;
    uint32_t slot;  // the slot to read (stored blocks)
    uint64_t sequence;
    Staged staged;  // set for a block still pending
  };

  DiskTier(const DiskTierOptions& o, const disk_tier::Layout& layout,
           const disk_tier::TierFile& file);
  void Reload();
  void StartThreads(int n);

  // Index and LRU; all REQUIRE mu_.
  // Frees an entry and its slot, if it has one.
  void FreeEntry(uint32_t entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a queued write that has not started: frees its staging and entry.
  void CancelWrite(uint32_t entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills in a queued write's slot, block and bytes, waiting for a free
  // slot; false when the write is void (its block left the tier).
  bool StartWrite(WriteJob* job);
  // Put's wait conditions (wait_for_staging): staging can take one more
  // slot; every queued write has finished.
  bool StagingHasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_bytes_ + layout_.page_bytes <= options_.max_pending_bytes;
  }
  bool NoPendingWrites() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_writes_ == 0;
  }
  void Unindex(uint32_t entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SlotFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !free_slots_.empty();
  }
  size_t ClaimForTake(absl::Span<const BlockKey> keys, std::vector<Claim>* claims)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SettleTake(absl::Span<const BlockKey> keys,
                  absl::Span<const Claim> claims,
                  absl::Span<const ReadResult> results, size_t served,
                  std::vector<BlockKey>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // I/O threads (and a Take's own thread, for its reads).
  void WorkerLoop();
  void HelpWithReads(ReadBatch* batch);
  bool NeedsBounce(const void* dst) const;
  void RunWrite(const WriteJob& job, char* pad);
  ReadResult RunRead(const ReadJob& job, char* bounce);
  void FinishWrite(const WriteJob& job, int err);
  void Enqueue(WriteJob job);
  void PutOne(const TierPut& b, const void* bytes, TierSink& below,
              std::vector<TierMove>* moves);
  // Put with a given sequence (0: the next one), waiting for staging room
  // until wait_until (InfinitePast: not at all; InfiniteFuture: as long as
  // it takes).
  bool PutAt(const TierBlock& block, const void* page,
             std::vector<TierBlock>* forgotten, uint64_t sequence,
             absl::Time wait_until);

  const DiskTierOptions options_;
  const disk_tier::Layout layout_;
  const std::string file_path_;
  const int meta_fd_;
  const int data_fd_;
  const bool direct_;
  std::shared_ptr<StagingPool> staging_pool_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<BlockKey, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  // Entries (index_ maps to them): layout_.slots plus the staging budget.
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  SlotLru<Slot> lru_ ABSL_GUARDED_BY(mu_);  // live entries, by put order
  SlotFreeList<Slot> free_ ABSL_GUARDED_BY(mu_);  // free entries
  // Slots of the file no entry uses; the next one is at the back.
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  // Staging buffers of pending entries, by entry.
  absl::flat_hash_map<uint32_t, Staged> staged_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // reserved by Put
  uint64_t pending_writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time refuse_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_set<int> logged_errors_ ABSL_GUARDED_BY(mu_);
  DiskTierStats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex queue_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::deque<ReadJob> reads_ ABSL_GUARDED_BY(queue_mu_);
  std::deque<WriteJob> writes_ ABSL_GUARDED_BY(queue_mu_);
  bool writes_paused_ ABSL_GUARDED_BY(queue_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_DISK_TIER_H_
