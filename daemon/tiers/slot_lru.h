// File: daemon/tiers/slot_lru.h
//
// SlotLru: the least-recently-used order of a tier's slots, kept in a
// vector and linked through each slot's own `prev` and `next` fields
// (intrusive: nothing is allocated). SlotFreeList: the tier's free slots,
// linked through `next` alone. A slot is in at most one of them. Used by
// DiskTier and HostTier.
//
//   SlotLru<Slot> lru;
//   lru.PushNewest(slots, 7);
//   uint32_t victim = lru.oldest();  // kNoTierSlot when empty
//   lru.Unlink(slots, victim);
//
// A slot is in the list or not; Unlink of a slot not in it is undefined
// (asserted where it shows: a slot without a predecessor must be the
// oldest, one without a successor the newest, and its neighbours must link
// back to it). PushNewest of a slot already in the list is undefined too.
//
// Thread safety: none; the owner's mutex guards the list and the slots.
#ifndef RADIXKV_DAEMON_TIERS_SLOT_LRU_H_
#define RADIXKV_DAEMON_TIERS_SLOT_LRU_H_

#include <cassert>
#include <cstdint>
#include <vector>

#include "daemon/tiers/tier.h"

namespace radixkv::daemon {

template <typename Slot>
class SlotLru {
 public:
  // The least recently pushed slot, or kNoSlot.
  uint32_t oldest() const { return head_; }

  void PushNewest(std::vector<Slot>& slots, uint32_t slot) {
    assert(slot < slots.size() && slot != head_ && slot != tail_);
    Slot& s = slots[slot];
    s.prev = tail_;
    s.next = kNoTierSlot;
    if (tail_ != kNoTierSlot) {
      slots[tail_].next = slot;
    } else {
      head_ = slot;
    }
    tail_ = slot;
  }

  void Unlink(std::vector<Slot>& slots, uint32_t slot) {
    assert(slot < slots.size());
    Slot& s = slots[slot];
    assert((s.prev == kNoTierSlot) == (head_ == slot));
    assert((s.next == kNoTierSlot) == (tail_ == slot));
    assert(s.prev == kNoTierSlot || slots[s.prev].next == slot);
    assert(s.next == kNoTierSlot || slots[s.next].prev == slot);
    if (s.prev != kNoTierSlot) {
      slots[s.prev].next = s.next;
    } else {
      head_ = s.next;
    }
    if (s.next != kNoTierSlot) {
      slots[s.next].prev = s.prev;
    } else {
      tail_ = s.prev;
    }
    s.prev = s.next = kNoTierSlot;
  }

 private:
  uint32_t head_ = kNoTierSlot;  // oldest
  uint32_t tail_ = kNoTierSlot;  // newest
};

template <typename Slot>
class SlotFreeList {
 public:
  bool empty() const { return head_ == kNoTierSlot; }
  // Forgets every slot (the caller pushes the free ones again).
  void Clear() { head_ = kNoTierSlot; }

  // The slot popped next is the one pushed last.
  void Push(std::vector<Slot>& slots, uint32_t slot) {
    assert(slot < slots.size() && slot != head_);
    Slot& s = slots[slot];
    s.prev = kNoTierSlot;
    s.next = head_;
    head_ = slot;
  }

  // A free slot, unlinked; kNoSlot when none is.
  uint32_t Pop(std::vector<Slot>& slots) {
    const uint32_t slot = head_;
    if (slot != kNoTierSlot) {
      head_ = slots[slot].next;
      slots[slot].next = kNoTierSlot;
    }
    return slot;
  }

 private:
  uint32_t head_ = kNoTierSlot;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_SLOT_LRU_H_
