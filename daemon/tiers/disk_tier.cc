// File: daemon/tiers/disk_tier.cc
#include "daemon/tiers/disk_tier.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "base/log.h"

namespace radixkv::daemon {

using disk_tier::kNoSlot;

// Recycles staging buffers of one size: kAlign-aligned when the size is a
// multiple of kAlign (written with O_DIRECT as they are), else plain heap
// memory (copied into an aligned stride when written). Buffers are handed
// out as shared_ptrs whose deleter returns them here; the pool lives as
// long as its last buffer. Thread-safe.
class DiskTier::StagingPool
    : public std::enable_shared_from_this<DiskTier::StagingPool> {
 public:
  StagingPool(size_t buffer_bytes, size_t keep)
      : buffer_bytes_(buffer_bytes), keep_(keep) {}

  Staged Get() {
    char* p = nullptr;
    {
      absl::MutexLock l(&mu_);
      if (!free_.empty()) {
        p = free_.back().release();
        free_.pop_back();
      }
    }
    if (p == nullptr) {
      if (buffer_bytes_ % disk_tier::kAlign == 0) {
        p = disk_tier::AllocateAligned(buffer_bytes_).release();
      } else {
        p = static_cast<char*>(std::malloc(buffer_bytes_));
        if (p == nullptr) std::abort();  // as AllocateAligned
      }
    }
    std::shared_ptr<StagingPool> self = shared_from_this();
    return Staged(p, [self](char* q) { self->Return(q); });
  }

 private:
  void Return(char* p) {
    disk_tier::AlignedBuffer buffer(p);
    absl::MutexLock l(&mu_);
    if (free_.size() < keep_) free_.push_back(std::move(buffer));
  }

  const size_t buffer_bytes_;
  const size_t keep_;
  absl::Mutex mu_;
  std::vector<disk_tier::AlignedBuffer> free_ ABSL_GUARDED_BY(mu_);
};

// One Take's reads: a counter of those still running, and each one's
// result. The Take waits on the counter, after which it may be destroyed.
struct DiskTier::ReadBatch {
  ReadBatch(int reads, ReadResult* results) : counter(reads), results(results) {}

  void Done(size_t index, ReadResult r) {
    results[index] = r;
    counter.DecrementCount();
  }

  absl::BlockingCounter counter;
  ReadResult* const results;  // one per claim, written by its reader
};

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const DiskTierOptions& o) {
  if (o.page_bytes == 0 || o.page_bytes > disk_tier::kMaxPageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=disk: page_bytes=", o.page_bytes, " must be in 1..",
        disk_tier::kMaxPageBytes));
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=disk: io_threads=", o.io_threads, " must be in 1..64"));
  }
  disk_tier::Layout layout = disk_tier::ComputeLayout(o.bytes, o.page_bytes);
  if (layout.slots == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=disk: bytes=", o.bytes, " is too small for one block of ",
        o.page_bytes, " bytes (needs at least ",
        disk_tier::MinBytesForOneSlot(o.page_bytes), ")"));
  }
  if (o.max_pending_bytes < layout.page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=disk: max_pending_bytes=", o.max_pending_bytes,
        " is below one block (", layout.page_bytes, " bytes)"));
  }
  absl::StatusOr<disk_tier::TierFile> file =
      disk_tier::OpenTierFile(o.path, layout, o.direct_io);
  if (!file.ok()) return file.status();
  std::unique_ptr<DiskTier> tier(new DiskTier(o, layout, *file));
  if (!file->fresh) tier->Reload();
  tier->StartThreads(o.io_threads);
  DiskTierStats s = tier->stats();
  Log(LogLevel::kInfo,
      absl::StrCat("disk tier: ", file->file_path, ", ", layout.slots,
                   " slots of ", layout.page_bytes, " bytes, ", s.reloaded,
                   " blocks reloaded, ", file->direct ? "O_DIRECT" : "buffered",
                   " data I/O"));
  return tier;
}

DiskTier::DiskTier(const DiskTierOptions& o, const disk_tier::Layout& layout,
                   const disk_tier::TierFile& file)
    : options_(o),
      layout_(layout),
      file_path_(file.file_path),
      meta_fd_(file.meta_fd),
      data_fd_(file.data_fd),
      direct_(file.direct),
      staging_pool_(std::make_shared<StagingPool>(
          layout.page_bytes, o.max_pending_bytes / layout.page_bytes)) {
  absl::MutexLock l(&mu_);
  // Every staged buffer is one pending entry: entries beyond the slots
  // cover them, so a Put whose staging was reserved always finds an entry.
  const uint64_t staged_entries = std::min<uint64_t>(
      o.max_pending_bytes / layout.page_bytes, uint64_t{1} << 20);
  slots_.resize(layout.slots + staged_entries);
  for (uint64_t i = slots_.size(); i-- > 0;) FreeEntry(static_cast<uint32_t>(i));
  free_slots_.reserve(layout.slots);
  for (uint64_t i = layout.slots; i-- > 0;) {
    free_slots_.push_back(static_cast<uint32_t>(i));
  }
}

DiskTier::~DiskTier() {
  SetWritesPausedForTesting(false);
  Flush();
  {
    absl::MutexLock l(&queue_mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
  close(data_fd_);
  close(meta_fd_);  // releases the flock
}

// Indexes every valid header; of two with one key the newer wins. The LRU
// is rebuilt oldest write first.
void DiskTier::Reload() {
  absl::MutexLock l(&mu_);
  std::vector<std::pair<uint64_t, uint32_t>> found;  // (sequence, slot)
  int err = disk_tier::ScanSlotHeaders(
      meta_fd_, layout_,
      [&](uint32_t slot, const disk_tier::SlotHeader& h)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            if (h.key == BlockKey{}) return;
            auto [it, inserted] = index_.try_emplace(h.key, slot);
            if (!inserted) {
              Slot& other = slots_[it->second];
              if (other.sequence > h.sequence) return;
              other.live = false;
              it->second = slot;
            }
            Slot& s = slots_[slot];
            s.block = {h.key, h.parent_key, h.root, h.depth};
            s.sequence = h.sequence;
            s.live = true;
            found.emplace_back(h.sequence, slot);
          });
  if (err != 0) {
    Log(LogLevel::kWarning,
        absl::StrCat("disk tier: cannot read the header table of ", file_path_,
                     ": ", std::strerror(err), "; starting empty"));
    index_.clear();
    found.clear();
    for (Slot& s : slots_) s.live = false;
  }
  std::sort(found.begin(), found.end());
  // Rebuild the free lists from scratch: a reloaded block is the entry of
  // its own slot's number; every other entry and slot is free.
  free_.Clear();
  free_slots_.clear();
  for (auto [sequence, slot] : found) {
    Slot& s = slots_[slot];
    next_sequence_ = std::max(next_sequence_, sequence + 1);
    if (!s.live) continue;
    s.state = SlotState::kStored;
    s.phys = slot;
    lru_.PushNewest(slots_, slot);
  }
  for (uint64_t i = slots_.size(); i-- > 0;) {
    if (slots_[i].state == SlotState::kFree) FreeEntry(static_cast<uint32_t>(i));
  }
  for (uint64_t i = layout_.slots; i-- > 0;) {
    if (slots_[i].state == SlotState::kFree) {
      free_slots_.push_back(static_cast<uint32_t>(i));
    }
  }
  stats_.reloaded = index_.size();
}

void DiskTier::StartThreads(int n) {
  threads_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

// ---- Index and LRU (mu_ held) -------------------------------------------

void DiskTier::FreeEntry(uint32_t entry) {
  Slot& s = slots_[entry];
  if (s.phys != kNoSlot) free_slots_.push_back(s.phys);
  s.phys = kNoSlot;
  s.state = SlotState::kFree;
  s.live = false;
  free_.Push(slots_, entry);
}

void DiskTier::CancelWrite(uint32_t entry) {
  staged_.erase(entry);
  pending_bytes_ -= layout_.page_bytes;
  --pending_writes_;
  FreeEntry(entry);
}

// Removes a live entry's block from the index and the LRU. A stored entry
// is freed now; a pending one whose write is queued has it cancelled; one
// whose write runs is freed when it ends (FinishWrite). An entry being
// read is not live and never passed here.
void DiskTier::Unindex(uint32_t entry) {
  Slot& s = slots_[entry];
  index_.erase(s.block.key);
  s.live = false;
  lru_.Unlink(slots_, entry);
  if (s.state == SlotState::kStored) {
    FreeEntry(entry);
  } else if (s.phys == kNoSlot) {
    CancelWrite(entry);
  }
}

// ---- Put -------------------------------------------------------------------

bool DiskTier::Put(const TierBlock& block, const void* page,
                   std::vector<TierBlock>* forgotten) {
  return PutAt(block, page, forgotten, /*sequence=*/0,
               options_.wait_for_staging ? absl::InfiniteFuture()
                                         : absl::InfinitePast());
}

bool DiskTier::PutAt(const TierBlock& block, const void* page,
                     std::vector<TierBlock>* forgotten, uint64_t sequence,
                     absl::Time wait_until) {
  const uint64_t staged = layout_.page_bytes;  // staging bytes per block
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() < refuse_until_) {
      ++stats_.dropped_error;
      return false;
    }
    if (wait_until == absl::InfiniteFuture()) {
      mu_.Await(absl::Condition(this, &DiskTier::StagingHasRoom));
    } else if (wait_until > absl::Now()) {
      mu_.AwaitWithDeadline(absl::Condition(this, &DiskTier::StagingHasRoom),
                            wait_until);
    }
    if (pending_bytes_ + staged > options_.max_pending_bytes) {
      ++stats_.dropped_full;
      return false;
    }
    pending_bytes_ += staged;
  }
  // The copy runs with no lock held; the block is indexed only once its
  // staging buffer is complete, so Take never sees a partial copy.
  Staged data = staging_pool_->Get();
  std::memcpy(data.get(), page, layout_.page_bytes);
  WriteJob job;
  {
    absl::MutexLock l(&mu_);
    auto it = index_.find(block.key);
    if (it != index_.end()) Unindex(it->second);
    // Full: the least recently put blocks leave, whatever their state.
    while (index_.size() >= layout_.slots && lru_.oldest() != kNoSlot) {
      if (forgotten != nullptr) forgotten->push_back(slots_[lru_.oldest()].block);
      Unindex(lru_.oldest());
      ++stats_.evictions;
    }
    const uint32_t entry = free_.Pop(slots_);
    if (entry == kNoSlot) {
      pending_bytes_ -= staged;
      ++stats_.dropped_full;
      return false;
    }
    Slot& s = slots_[entry];
    s.block = block;
    s.sequence = sequence != 0 ? sequence : next_sequence_++;
    s.state = SlotState::kPending;
    s.phys = kNoSlot;
    s.live = true;
    index_[block.key] = entry;
    lru_.PushNewest(slots_, entry);
    staged_[entry] = std::move(data);
    ++pending_writes_;
    ++stats_.demotions;
    job = WriteJob{.entry = entry, .sequence = s.sequence};
  }
  Enqueue(std::move(job));
  if (options_.wait_for_staging && sequence == 0) {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(this, &DiskTier::NoPendingWrites));
  }
  return true;
}

void DiskTier::Enqueue(WriteJob job) {
  absl::MutexLock l(&queue_mu_);
  writes_.push_back(std::move(job));
}

// ---- Lookups ----------------------------------------------------------------

size_t DiskTier::CountPresent(absl::Span<const BlockKey> keys) const {
  absl::ReaderMutexLock l(&mu_);
  size_t n = 0;
  while (n < keys.size() && index_.contains(keys[n])) ++n;
  return n;
}

bool DiskTier::Lookup(const BlockKey& key, TierBlock* out) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  *out = slots_[it->second].block;
  return true;
}

DiskTierStats DiskTier::stats() const {
  absl::ReaderMutexLock l(&mu_);
  DiskTierStats s = stats_;
  s.slots = layout_.slots;
  s.used = index_.size();  // pending blocks included
  s.pending = pending_writes_;
  s.direct_io = direct_;
  return s;
}

// ---- Take ------------------------------------------------------------------

// Takes the present prefix of `keys` out of the index and the LRU: stored
// entries become kReading (owned by this Take, their slot kept from
// reuse), pending ones keep their state and lend their staging buffer
// (the claim's reference keeps it from reuse until the copy out of it
// ends). Returns how many were claimed.
size_t DiskTier::ClaimForTake(absl::Span<const BlockKey> keys,
                              std::vector<Claim>* claims) {
  for (const BlockKey& key : keys) {
    auto it = index_.find(key);
    if (it == index_.end()) break;
    const uint32_t entry = it->second;
    Slot& s = slots_[entry];
    index_.erase(it);
    lru_.Unlink(slots_, entry);
    s.live = false;
    if (s.state == SlotState::kPending) {
      claims->push_back({entry, s.phys, s.sequence, staged_[entry]});
    } else {
      s.state = SlotState::kReading;
      claims->push_back({entry, s.phys, s.sequence, nullptr});
    }
  }
  return claims->size();
}

size_t DiskTier::Forget(absl::Span<const BlockKey> keys,
                        std::vector<TierBlock>* dropped) {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const BlockKey& key : keys) {
    auto it = index_.find(key);
    if (it == index_.end()) continue;
    dropped->push_back(slots_[it->second].block);
    Unindex(it->second);
    ++n;
  }
  stats_.superseded += n;
  return n;
}

size_t DiskTier::Take(absl::Span<const BlockKey> keys,
                      absl::Span<void* const> dst,
                      std::vector<BlockKey>* dropped) {
  const size_t n = std::min(keys.size(), dst.size());
  if (n == 0) return 0;
  std::vector<Claim> claims;
  claims.reserve(n);
  {
    absl::MutexLock l(&mu_);
    ClaimForTake(keys.first(n), &claims);
  }
  const size_t m = claims.size();
  std::vector<ReadResult> results(m, ReadResult::kOk);
  int reads = static_cast<int>(std::count_if(
      claims.begin(), claims.end(), [](const Claim& c) { return c.staged == nullptr; }));
  ReadBatch batch(reads, results.data());
  if (reads > 0) {
    absl::MutexLock l(&queue_mu_);
    for (size_t i = 0; i < m; ++i) {
      if (claims[i].staged != nullptr) continue;
      reads_.push_back(ReadJob{claims[i].slot, claims[i].sequence, keys[i],
                               dst[i], &batch, i});
    }
  }
  for (size_t i = 0; i < m; ++i) {
    if (claims[i].staged != nullptr) {
      std::memcpy(dst[i], claims[i].staged.get(), layout_.page_bytes);
    }
  }
  HelpWithReads(&batch);
  size_t served = 0;
  while (served < m && results[served] == ReadResult::kOk) ++served;
  absl::MutexLock l(&mu_);
  SettleTake(keys, claims, results, served, dropped);
  stats_.promotions += served;
  if (m < n && served == m) ++stats_.misses;
  return served;
}

// Runs this batch's queued reads on the calling thread while the I/O
// threads run the others, then waits for the rest.
void DiskTier::HelpWithReads(ReadBatch* batch) {
  disk_tier::AlignedBuffer bounce;
  for (;;) {
    std::optional<ReadJob> job;
    {
      absl::MutexLock l(&queue_mu_);
      auto it = std::find_if(reads_.begin(), reads_.end(),
                             [batch](const ReadJob& j) { return j.batch == batch; });
      if (it == reads_.end()) break;
      job = *it;
      reads_.erase(it);
    }
    if (bounce == nullptr && NeedsBounce(job->dst)) {
      bounce = disk_tier::AllocateAligned(layout_.stride);
    }
    batch->Done(job->index, RunRead(*job, bounce.get()));
  }
  batch->counter.Wait();
}

// Frees the served blocks' entries (a served pending one's queued write is
// cancelled), drops failed ones, and puts back the claimed blocks after the
// first failure that read well, as the newest, unless their key was put
// again meanwhile or the tier is full (then they are dropped).
void DiskTier::SettleTake(absl::Span<const BlockKey> keys,
                          absl::Span<const Claim> claims,
                          absl::Span<const ReadResult> results, size_t served,
                          std::vector<BlockKey>* dropped) {
  for (size_t i = 0; i < claims.size(); ++i) {
    const Claim& c = claims[i];
    Slot& s = slots_[c.entry];
    const bool ok = results[i] == ReadResult::kOk;
    if (c.staged != nullptr) {
      // Still pending, unless its write ended (or its queued write was
      // found void) meanwhile and the entry was freed or reused.
      const bool mine = s.state == SlotState::kPending &&
                        s.sequence == c.sequence && !s.live;
      if (!mine) continue;
      if (i > served && !index_.contains(keys[i]) &&
          index_.size() < layout_.slots) {
        s.live = true;
        index_[keys[i]] = c.entry;
        lru_.PushNewest(slots_, c.entry);
      } else if (s.phys == kNoSlot) {
        CancelWrite(c.entry);
      }
      // A running write frees it when it ends.
      continue;
    }
    stats_.bytes_read += layout_.stride;
    if (results[i] == ReadResult::kError) ++stats_.read_errors;
    if (results[i] == ReadResult::kBadHeader ||
        results[i] == ReadResult::kBadChecksum) {
      ++stats_.checksum_failures;
    }
    if (!ok && dropped != nullptr) dropped->push_back(keys[i]);
    if (i < served || !ok || index_.contains(keys[i])) {
      FreeEntry(c.entry);
      continue;
    }
    if (index_.size() >= layout_.slots) {
      // Its room went to newer blocks while it was read: it leaves.
      if (dropped != nullptr) dropped->push_back(keys[i]);
      FreeEntry(c.entry);
      continue;
    }
    s.state = SlotState::kStored;
    s.live = true;
    index_[keys[i]] = c.entry;
    lru_.PushNewest(slots_, c.entry);
  }
}

// ---- I/O threads -------------------------------------------------------------

bool DiskTier::NeedsBounce(const void* dst) const {
  return direct_ && (layout_.page_bytes != layout_.stride ||
                     reinterpret_cast<uintptr_t>(dst) % disk_tier::kAlign != 0);
}

void DiskTier::WorkerLoop() {
  disk_tier::AlignedBuffer bounce;
  disk_tier::AlignedBuffer pad;  // a stride for staged blocks to be padded
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
    return stopping_ || !reads_.empty() || (!writes_paused_ && !writes_.empty());
  };
  for (;;) {
    std::optional<ReadJob> read;
    std::optional<WriteJob> write;
    {
      absl::MutexLock l(&queue_mu_);
      queue_mu_.Await(absl::Condition(&ready));
      if (!reads_.empty()) {
        read = reads_.front();
        reads_.pop_front();
      } else if (!writes_paused_ && !writes_.empty()) {
        write = std::move(writes_.front());
        writes_.pop_front();
      } else {
        return;  // stopping_, nothing left
      }
    }
    if (read.has_value()) {
      if (bounce == nullptr && NeedsBounce(read->dst)) {
        bounce = disk_tier::AllocateAligned(layout_.stride);
      }
      read->batch->Done(read->index, RunRead(*read, bounce.get()));
    } else if (StartWrite(&*write)) {
      if (pad == nullptr && layout_.page_bytes != layout_.stride) {
        pad = disk_tier::AllocateAligned(layout_.stride);
      }
      RunWrite(*write, pad.get());
    }
  }
}

// A write whose block is still live gets a slot: a free one, waiting
// until one is. One is bound to come: the live blocks are at most the
// slots, this one has none, so some slot is free or held by a write or a
// read that ends. A block that left the tier (evicted, taken, forgotten)
// before its write started is not written.
bool DiskTier::StartWrite(WriteJob* job) {
  absl::MutexLock l(&mu_);
  const uint32_t e = job->entry;
  auto mine = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Slot& s = slots_[e];
    return s.state == SlotState::kPending && s.sequence == job->sequence &&
           s.phys == kNoSlot;
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !mine() || !slots_[e].live || SlotFree();
  };
  mu_.Await(absl::Condition(&ready));
  if (!mine()) return false;  // cancelled and freed already
  if (!slots_[e].live) {
    // Claimed by a Take meanwhile (which copies from its staging) or left:
    // no write.
    CancelWrite(e);
    return false;
  }
  Slot& s = slots_[e];
  s.phys = free_slots_.back();
  free_slots_.pop_back();
  job->slot = s.phys;
  job->block = s.block;
  job->data = staged_[e];
  return true;
}

// Data first, then the header that makes it valid. A block staged with
// fewer bytes than a stride is copied into `pad` and zero-padded.
void DiskTier::RunWrite(const WriteJob& job, char* pad) {
  disk_tier::SlotHeader h;
  h.key = job.block.key;
  h.parent_key = job.block.parent_key;
  h.root = job.block.root;
  h.depth = job.block.depth;
  h.page_bytes = layout_.page_bytes;
  h.data_checksum = disk_tier::DataChecksum(job.data.get(), layout_.page_bytes);
  h.sequence = job.sequence;
  h.slot = job.slot;
  char header[disk_tier::kSlotHeaderBytes];
  disk_tier::EncodeSlotHeader(h, header);
  const char* data = job.data.get();
  if (layout_.page_bytes != layout_.stride) {
    std::memcpy(pad, data, layout_.page_bytes);
    std::memset(pad + layout_.page_bytes, 0,
                layout_.stride - layout_.page_bytes);
    data = pad;
  }
  int err = disk_tier::PwriteFull(data_fd_, data, layout_.stride,
                                  layout_.DataOffset(job.slot));
  if (err == 0) {
    err = disk_tier::PwriteFull(meta_fd_, header, sizeof(header),
                                layout_.HeaderOffset(job.slot));
  }
  FinishWrite(job, err);
}

void DiskTier::FinishWrite(const WriteJob& job, int err) {
  bool log = false;
  {
    absl::MutexLock l(&mu_);
    Slot& s = slots_[job.entry];
    staged_.erase(job.entry);
    pending_bytes_ -= layout_.page_bytes;
    --pending_writes_;
    if (err == 0) {
      stats_.bytes_written += layout_.stride;
      if (s.live) {
        s.state = SlotState::kStored;  // keeps its place in the LRU
      } else {
        FreeEntry(job.entry);
      }
      return;
    }
    ++stats_.write_errors;
    if (s.live) {
      index_.erase(s.block.key);
      lru_.Unlink(slots_, job.entry);
      ++stats_.dropped_error;
    }
    FreeEntry(job.entry);
    refuse_until_ = absl::Now() + options_.write_error_backoff;
    log = logged_errors_.insert(err).second;
  }
  if (log) {
    Log(LogLevel::kWarning,
        absl::StrCat("disk tier: writing ", file_path_, " failed: ",
                     std::strerror(err), "; blocks are dropped for ",
                     absl::FormatDuration(options_.write_error_backoff),
                     " after each write error"));
  }
}

DiskTier::ReadResult DiskTier::RunRead(const ReadJob& job, char* bounce) {
  char header[disk_tier::kSlotHeaderBytes];
  if (disk_tier::PreadFull(meta_fd_, header, sizeof(header),
                           layout_.HeaderOffset(job.slot)) != 0) {
    return ReadResult::kError;
  }
  disk_tier::SlotHeader h;
  if (!disk_tier::DecodeSlotHeader(header, &h) || h.key != job.key ||
      h.slot != job.slot || h.sequence != job.sequence ||
      h.page_bytes != layout_.page_bytes) {
    return ReadResult::kBadHeader;
  }
  char* target = static_cast<char*>(job.dst);
  size_t len = layout_.page_bytes;
  if (direct_) {
    len = layout_.stride;
    if (NeedsBounce(job.dst)) target = bounce;
  }
  if (disk_tier::PreadFull(data_fd_, target, len,
                           layout_.DataOffset(job.slot)) != 0) {
    return ReadResult::kError;
  }
  if (disk_tier::DataChecksum(target, layout_.page_bytes) != h.data_checksum) {
    return ReadResult::kBadChecksum;
  }
  if (target != job.dst) std::memcpy(job.dst, target, layout_.page_bytes);
  return ReadResult::kOk;
}

// ---- Tier ------------------------------------------------------------------

// One block into the file; refused ones go below.
void DiskTier::PutOne(const TierPut& b, const void* bytes, TierSink& below,
                      std::vector<TierMove>* moves) {
  std::vector<TierBlock> forgotten;
  if (!Put(b.block, bytes, &forgotten)) {
    if (!below.empty()) {
      const TierPut refused{.block = b.block, .ns = b.ns, .bytes = bytes};
      below.Put({&refused, 1}, moves);
    }
    return;
  }
  for (const TierBlock& f : forgotten) {
    moves->push_back({.stored = false, .medium = medium(), .block = f});
  }
  moves->push_back(
      {.stored = true, .medium = medium(), .block = b.block, .ns = b.ns});
}

void DiskTier::Put(absl::Span<const TierPut> blocks, PageMover& mover,
                   TierSink& below, std::vector<TierMove>* moves) {
  // Host bytes (a host pool's page, a block from the tier above) are
  // written as they are; device pages go through staging, in batches.
  std::vector<const TierPut*> staged;
  for (const TierPut& b : blocks) {
    const void* bytes =
        b.bytes != nullptr ? b.bytes : mover.host_address(b.page);
    if (bytes != nullptr) {
      PutOne(b, bytes, below, moves);
    } else {
      staged.push_back(&b);
    }
  }
  if (staged.empty()) return;
  std::unique_ptr<gpu::HostMemory> staging = mover.TakeStaging();
  if (staging == nullptr) return;
  const uint64_t pb = layout_.page_bytes;
  for (size_t at = 0; at < staged.size(); at += PageMover::kStagingBlocks) {
    const size_t n = std::min(PageMover::kStagingBlocks, staged.size() - at);
    std::vector<uint64_t> pages(n);
    std::vector<void*> dst(n);
    for (size_t i = 0; i < n; ++i) {
      pages[i] = staged[at + i]->page;
      dst[i] = staging->data() + i * pb;
    }
    if (!mover.CopyOut(pages, dst).ok()) break;
    for (size_t i = 0; i < n; ++i) PutOne(*staged[at + i], dst[i], below, moves);
  }
  mover.ReturnStaging(std::move(staging));
}

size_t DiskTier::Take(absl::Span<const BlockKey> keys,
                      absl::Span<const uint64_t> pages, PageMover& mover,
                      std::vector<TierMove>* moves) {
  size_t got = 0;
  // Blocks that failed their checksum (or read) left the tier.
  std::vector<BlockKey> dropped;
  if (mover.host_address(0) != nullptr) {
    std::vector<void*> dst(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      dst[i] = mover.host_address(pages[i]);
    }
    got = Take(keys, dst, &dropped);
  } else {
    std::unique_ptr<gpu::HostMemory> staging = mover.TakeStaging();
    if (staging == nullptr) return 0;
    const uint64_t pb = layout_.page_bytes;
    while (got < keys.size()) {
      const size_t want =
          std::min(PageMover::kStagingBlocks, keys.size() - got);
      std::vector<void*> dst(want);
      for (size_t i = 0; i < want; ++i) dst[i] = staging->data() + i * pb;
      const size_t n = Take(keys.subspan(got, want), dst, &dropped);
      if (n == 0) break;
      // A failed copy loses the blocks: they left the tier with Take.
      if (!mover
               .CopyIn(absl::MakeConstSpan(
                           reinterpret_cast<const void* const*>(dst.data()), n),
                       pages.subspan(got, n))
               .ok()) {
        break;
      }
      got += n;
      if (n < want) break;
    }
    mover.ReturnStaging(std::move(staging));
  }
  for (size_t i = 0; i < got; ++i) {
    moves->push_back(
        {.stored = false, .medium = medium(), .block = {.key = keys[i]}});
  }
  for (const BlockKey& k : dropped) {
    moves->push_back({.stored = false, .medium = medium(), .block = {.key = k}});
  }
  return got;
}

// ---- Drain (shutdown) ---------------------------------------------------------

uint64_t DiskTier::ReserveSequences(uint64_t n) {
  absl::MutexLock l(&mu_);
  const uint64_t first = next_sequence_;
  next_sequence_ += n;
  return first;
}

bool DiskTier::PutForDrain(const TierBlock& block, const void* bytes,
                           uint64_t sequence, absl::Time deadline) {
  if (absl::Now() >= deadline) return false;
  return PutAt(block, bytes, /*forgotten=*/nullptr, sequence, deadline);
}

size_t DiskTier::FinishDrain(absl::Time deadline) {
  size_t abandoned = 0;
  {
    absl::MutexLock l(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(this, &DiskTier::NoPendingWrites),
                          deadline);
    // Writes not started by the deadline are not made: their blocks leave.
    std::vector<uint32_t> queued;
    for (const auto& [entry, buffer] : staged_) {
      const Slot& s = slots_[entry];
      if (s.state == SlotState::kPending && s.phys == kNoSlot && s.live) {
        queued.push_back(entry);
      }
    }
    for (uint32_t entry : queued) Unindex(entry);
    abandoned = queued.size();
  }
  Flush();  // the writes already running, then fdatasync
  return abandoned;
}

// ---- Flush and tests ---------------------------------------------------------

void DiskTier::Flush() {
  {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](uint64_t* pending) { return *pending == 0; }, &pending_writes_));
  }
  if (fdatasync(data_fd_) != 0) {
    int err = errno;
    Log(LogLevel::kWarning, absl::StrCat("disk tier: fdatasync of ", file_path_,
                                         " failed: ", std::strerror(err)));
  }
}

void DiskTier::SetWritesPausedForTesting(bool paused) {
  absl::MutexLock l(&queue_mu_);
  writes_paused_ = paused;
}

}  // namespace radixkv::daemon
