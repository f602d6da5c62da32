// Tests of SlotLru and SlotFreeList (daemon/tiers/slot_lru.h): the order slots
// come out in, unlinking from the front, middle and back, the links left
// on each slot, and a long random sequence against a plain list.
#include "daemon/tiers/slot_lru.h"

#include <cstdint>
#include <list>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

constexpr uint32_t kNoSlot = kNoTierSlot;

// The fields SlotLru and SlotFreeList link through, and nothing else.
struct Slot {
  uint32_t prev = kNoSlot;
  uint32_t next = kNoSlot;
};

// The slots from oldest to newest, following `next`; checks each `prev`.
std::vector<uint32_t> Walk(const SlotLru<Slot>& lru,
                           const std::vector<Slot>& slots) {
  std::vector<uint32_t> out;
  uint32_t prev = kNoSlot;
  for (uint32_t s = lru.oldest(); s != kNoSlot; s = slots[s].next) {
    EXPECT_EQ(slots[s].prev, prev) << "slot " << s;
    out.push_back(s);
    prev = s;
    if (out.size() > slots.size()) {
      ADD_FAILURE() << "cycle";
      break;
    }
  }
  return out;
}

TEST(SlotLruTest, EmptyHasNoOldest) {
  SlotLru<Slot> lru;
  EXPECT_EQ(lru.oldest(), kNoSlot);
}

TEST(SlotLruTest, OldestFirstAndUnlinkAnywhere) {
  std::vector<Slot> slots(6);
  SlotLru<Slot> lru;
  for (uint32_t s : {3, 1, 4, 0, 5}) lru.PushNewest(slots, s);
  EXPECT_EQ(Walk(lru, slots), (std::vector<uint32_t>{3, 1, 4, 0, 5}));
  EXPECT_EQ(lru.oldest(), 3u);
  lru.Unlink(slots, 4);  // middle
  EXPECT_EQ(Walk(lru, slots), (std::vector<uint32_t>{3, 1, 0, 5}));
  EXPECT_EQ(slots[4].prev, kNoSlot);
  EXPECT_EQ(slots[4].next, kNoSlot);
  lru.Unlink(slots, 3);  // oldest
  EXPECT_EQ(lru.oldest(), 1u);
  lru.Unlink(slots, 5);  // newest
  EXPECT_EQ(Walk(lru, slots), (std::vector<uint32_t>{1, 0}));
  // A used slot pushed again is the newest.
  lru.Unlink(slots, 1);
  lru.PushNewest(slots, 1);
  EXPECT_EQ(Walk(lru, slots), (std::vector<uint32_t>{0, 1}));
  lru.Unlink(slots, 0);
  lru.Unlink(slots, 1);
  EXPECT_EQ(lru.oldest(), kNoSlot);
  // Empty again, it starts over.
  lru.PushNewest(slots, 2);
  EXPECT_EQ(Walk(lru, slots), (std::vector<uint32_t>{2}));
}

TEST(SlotFreeListTest, LastPushedIsPoppedFirst) {
  std::vector<Slot> slots(4);
  SlotFreeList<Slot> free_list;
  EXPECT_TRUE(free_list.empty());
  EXPECT_EQ(free_list.Pop(slots), kNoSlot);
  free_list.Push(slots, 2);
  free_list.Push(slots, 0);
  free_list.Push(slots, 3);
  EXPECT_FALSE(free_list.empty());
  EXPECT_EQ(free_list.Pop(slots), 3u);
  EXPECT_EQ(slots[3].next, kNoSlot);  // popped slots are unlinked
  EXPECT_EQ(free_list.Pop(slots), 0u);
  EXPECT_EQ(free_list.Pop(slots), 2u);
  EXPECT_TRUE(free_list.empty());
  free_list.Push(slots, 1);
  free_list.Clear();
  EXPECT_TRUE(free_list.empty());
  EXPECT_EQ(free_list.Pop(slots), kNoSlot);
}

TEST(SlotLruTest, FreeListAndLruShareTheSlots) {
  // A tier's cycle: free -> stored (LRU) -> evicted oldest -> free.
  std::vector<Slot> slots(3);
  SlotFreeList<Slot> free_list;
  SlotLru<Slot> lru;
  for (uint32_t s = 3; s-- > 0;) free_list.Push(slots, s);
  for (int i = 0; i < 3; ++i) lru.PushNewest(slots, free_list.Pop(slots));
  EXPECT_TRUE(free_list.empty());
  EXPECT_EQ(Walk(lru, slots), (std::vector<uint32_t>{0, 1, 2}));
  const uint32_t victim = lru.oldest();
  lru.Unlink(slots, victim);
  free_list.Push(slots, victim);
  EXPECT_EQ(Walk(lru, slots), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(free_list.Pop(slots), 0u);
}

TEST(SlotLruTest, RandomOperationsMatchAList) {
  constexpr uint32_t kSlots = 64;
  std::vector<Slot> slots(kSlots);
  SlotLru<Slot> lru;
  std::list<uint32_t> model;
  std::vector<bool> in(kSlots, false);
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const uint32_t s = rng() % kSlots;
    if (in[s]) {
      lru.Unlink(slots, s);
      model.remove(s);
      // Touch: back as the newest, half the time.
      if (rng() % 2 == 0) {
        lru.PushNewest(slots, s);
        model.push_back(s);
      } else {
        in[s] = false;
      }
    } else {
      lru.PushNewest(slots, s);
      model.push_back(s);
      in[s] = true;
    }
    EXPECT_EQ(lru.oldest(), model.empty() ? kNoSlot : model.front());
    if (step % 997 == 0) {
      ASSERT_EQ(Walk(lru, slots),
                std::vector<uint32_t>(model.begin(), model.end()));
    }
  }
  ASSERT_EQ(Walk(lru, slots),
            std::vector<uint32_t>(model.begin(), model.end()));
}

}  // namespace
}  // namespace radixkv::daemon
