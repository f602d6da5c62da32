#include "daemon/tiers/host_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace radixkv::daemon {

namespace {
constexpr uint32_t kNoSlot = kNoTierSlot;
}  // namespace

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Open(gpu::Backend backend,
                                                         int device,
                                                         uint64_t bytes,
                                                         uint64_t page_bytes) {
  if (page_bytes == 0) {
    return absl::InvalidArgumentError(
        "--tier=host: the pool's page size is 0 (a none pool has no bytes)");
  }
  const uint64_t slots = bytes / page_bytes;
  if (slots == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=host: bytes=", bytes, " holds no page of ", page_bytes,
        " bytes"));
  }
  if (slots >= kNoSlot) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=host: bytes=", bytes, " makes ", slots, " slots of ",
        page_bytes, " bytes; at most ", kNoSlot - 1));
  }
  absl::StatusOr<std::unique_ptr<gpu::HostMemory>> memory =
      gpu::AllocateHostMemory(backend, device, slots * page_bytes);
  if (!memory.ok()) {
    return absl::Status(memory.status().code(),
                        absl::StrCat("--tier=host: ", memory.status().message()));
  }
  return std::unique_ptr<HostTier>(
      new HostTier(*std::move(memory), page_bytes, slots));
}

HostTier::HostTier(std::unique_ptr<gpu::HostMemory> memory,
                   uint64_t page_bytes, uint64_t slots)
    : memory_(std::move(memory)), page_bytes_(page_bytes), slot_count_(slots) {
  WriterMutexLock l(&mu_);
  slots_.resize(slots);
  // The free list runs 0, 1, 2, ... so the first blocks fill the front.
  for (uint64_t i = slots; i-- > 0;) {
    free_.Push(slots_, static_cast<uint32_t>(i));
  }
  stats_.slots = slots;
  stats_.pinned = memory_->pinned();
}

// Removes the slot's block from the index. A stored slot is freed now; a
// slot being read is freed by Finish.
void HostTier::Unindex(uint32_t slot) {
  Slot& s = slots_[slot];
  index_.erase(s.block.key);
  s.live = false;
  --stats_.used;
  if (s.state == SlotState::kStored) {
    lru_.Unlink(slots_, slot);
    FreeSlot(slot);
  }
}

void HostTier::FreeSlot(uint32_t slot) {
  Slot& s = slots_[slot];
  s.state = SlotState::kFree;
  s.live = false;
  free_.Push(slots_, slot);
}

size_t HostTier::Reserve(absl::Span<const TierBlock> blocks,
                         std::vector<Reservation>* out) {
  WriterMutexLock l(&mu_);
  size_t n = 0;
  for (; n < blocks.size(); ++n) {
    Reservation r;
    r.block = blocks[n];
    uint32_t slot = free_.Pop(slots_);
    if (slot == kNoSlot && lru_.oldest() != kNoSlot) {
      // The oldest stored block gives up its slot; its bytes stay there
      // for the caller until Publish.
      slot = lru_.oldest();
      r.has_victim = true;
      r.victim = slots_[slot].block;
      index_.erase(slots_[slot].block.key);
      --stats_.used;
      lru_.Unlink(slots_, slot);
      ++stats_.evictions;
    } else if (slot == kNoSlot) {
      stats_.dropped_full += blocks.size() - n;
      break;
    }
    Slot& s = slots_[slot];
    s.state = SlotState::kFilling;
    s.live = false;
    s.next = s.prev = kNoSlot;
    r.slot = slot;
    r.dst = address(slot);
    ++stats_.pending;
    out->push_back(r);
  }
  return n;
}

void HostTier::Publish(absl::Span<const Reservation> reservations, bool ok) {
  WriterMutexLock l(&mu_);
  for (const Reservation& r : reservations) {
    Slot& s = slots_[r.slot];
    --stats_.pending;
    if (!ok) {
      ++stats_.dropped_error;
      FreeSlot(r.slot);
      continue;
    }
    auto [it, inserted] = index_.try_emplace(r.block.key, r.slot);
    if (!inserted) {
      // The key is stored already (or being read): the new copy wins.
      Unindex(it->second);
      index_.emplace(r.block.key, r.slot);
    }
    s.block = r.block;
    s.state = SlotState::kStored;
    s.live = true;
    lru_.PushNewest(slots_, r.slot);
    ++stats_.used;
    ++stats_.demotions;
    stats_.bytes_written += page_bytes_;
  }
}

void HostTier::CountDropped(size_t n) {
  WriterMutexLock l(&mu_);
  stats_.dropped_full += n;
}

size_t HostTier::CountPresent(absl::Span<const BlockKey> keys) const {
  ReaderMutexLock l(&mu_);
  size_t n = 0;
  while (n < keys.size()) {
    auto it = index_.find(keys[n]);
    if (it == index_.end() || slots_[it->second].state != SlotState::kStored) {
      break;
    }
    ++n;
  }
  return n;
}

bool HostTier::Lookup(const BlockKey& key, TierBlock* out) const {
  ReaderMutexLock l(&mu_);
  auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].state != SlotState::kStored) {
    return false;
  }
  *out = slots_[it->second].block;
  return true;
}

size_t HostTier::Claim(absl::Span<const BlockKey> keys,
                       std::vector<uint32_t>* slots,
                       std::vector<const void*>* src) {
  WriterMutexLock l(&mu_);
  size_t n = 0;
  for (; n < keys.size(); ++n) {
    auto it = index_.find(keys[n]);
    if (it == index_.end()) break;
    Slot& s = slots_[it->second];
    if (s.state != SlotState::kStored) break;
    lru_.Unlink(slots_, it->second);
    s.state = SlotState::kReading;
    slots->push_back(it->second);
    src->push_back(address(it->second));
  }
  return n;
}

void HostTier::LendForDrain(
    absl::FunctionRef<bool(const TierBlock&, const void*)> fn) {
  std::vector<TierBlock> blocks;
  {
    ReaderMutexLock l(&mu_);
    for (uint32_t s = lru_.oldest(); s != kNoTierSlot; s = slots_[s].next) {
      blocks.push_back(slots_[s].block);
    }
  }
  std::reverse(blocks.begin(), blocks.end());  // most recently stored first
  std::vector<BlockKey> keys;
  keys.reserve(blocks.size());
  for (const TierBlock& b : blocks) keys.push_back(b.key);
  std::vector<uint32_t> slots;
  std::vector<const void*> src;
  const size_t claimed = Claim(keys, &slots, &src);
  for (size_t i = 0; i < claimed && fn(blocks[i], src[i]); ++i) {
  }
  Finish(slots, /*consumed=*/false);
}

void HostTier::Finish(absl::Span<const uint32_t> slots, bool consumed) {
  WriterMutexLock l(&mu_);
  for (uint32_t slot : slots) {
    Slot& s = slots_[slot];
    if (!s.live) {  // replaced by a newer copy while being read
      FreeSlot(slot);
      continue;
    }
    if (consumed) {
      index_.erase(s.block.key);
      --stats_.used;
      ++stats_.promotions;
      stats_.bytes_read += page_bytes_;
      FreeSlot(slot);
    } else {
      s.state = SlotState::kStored;
      lru_.PushNewest(slots_, slot);
    }
  }
}

size_t HostTier::Forget(absl::Span<const BlockKey> keys,
                        std::vector<TierBlock>* dropped) {
  WriterMutexLock l(&mu_);
  size_t n = 0;
  for (const BlockKey& key : keys) {
    auto it = index_.find(key);
    if (it == index_.end() || slots_[it->second].state != SlotState::kStored) {
      continue;
    }
    dropped->push_back(slots_[it->second].block);
    Unindex(it->second);
    ++n;
  }
  stats_.superseded += n;
  return n;
}

// ---- Tier ------------------------------------------------------------------

void HostTier::Put(absl::Span<const TierPut> blocks, PageMover& mover,
                   TierSink& below, std::vector<TierMove>* moves) {
  if (blocks.empty()) return;
  const size_t skip = blocks.size() > slot_count_
                          ? blocks.size() - static_cast<size_t>(slot_count_)
                          : 0;
  const absl::Span<const TierPut> head = blocks.first(skip);
  const absl::Span<const TierPut> tail = blocks.subspan(skip);
  std::vector<TierBlock> wanted;
  wanted.reserve(tail.size());
  for (const TierPut& b : tail) wanted.push_back(b.block);
  std::vector<Reservation> res;
  const size_t n = Reserve(wanted, &res);
  // A victim's bytes leave its slot before the new block's bytes land.
  for (const Reservation& r : res) {
    if (!r.has_victim) continue;
    moves->push_back({.stored = false, .medium = medium(), .block = r.victim});
    if (!below.empty()) {
      const TierPut victim{.block = r.victim, .bytes = r.dst};
      below.Put({&victim, 1}, moves);
    }
  }
  // Blocks it cannot hold (more than it has, or no slot free of copies in
  // flight) go straight below.
  if (!below.empty()) {
    std::vector<TierPut> straight(head.begin(), head.end());
    straight.insert(straight.end(), tail.begin() + n, tail.end());
    if (!straight.empty()) below.Put(straight, moves);
  } else {
    CountDropped(head.size());  // Reserve counted the rest
  }
  std::vector<uint64_t> pages;
  std::vector<void*> dst;
  for (size_t i = 0; i < n; ++i) {
    if (tail[i].bytes != nullptr) {
      std::memcpy(res[i].dst, tail[i].bytes, page_bytes_);
    } else {
      pages.push_back(tail[i].page);
      dst.push_back(res[i].dst);
    }
  }
  const absl::Status s =
      pages.empty() ? absl::OkStatus() : mover.CopyOut(pages, dst);
  Publish(res, s.ok());
  if (!s.ok()) return;
  for (size_t i = 0; i < n; ++i) {
    moves->push_back({.stored = true,
                      .medium = medium(),
                      .block = tail[i].block,
                      .ns = tail[i].ns});
  }
}

size_t HostTier::Take(absl::Span<const BlockKey> keys,
                      absl::Span<const uint64_t> pages, PageMover& mover,
                      std::vector<TierMove>* moves) {
  std::vector<uint32_t> slots;
  std::vector<const void*> src;
  const size_t n = Claim(keys, &slots, &src);
  if (n == 0) return 0;
  const absl::Status s = mover.CopyIn(src, pages.first(n));
  Finish(slots, s.ok());
  if (!s.ok()) return 0;
  for (size_t i = 0; i < n; ++i) {
    moves->push_back(
        {.stored = false, .medium = medium(), .block = {.key = keys[i]}});
  }
  return n;
}

HostTierStats HostTier::stats() const {
  ReaderMutexLock l(&mu_);
  return stats_;
}

}  // namespace radixkv::daemon
