// File: radix/radix_tree_priority.cc
//
// RadixTree's retention priorities (BlockPriority). A page's priority is a
// step function of time (radix_internal::Priority) kept in two side arrays
// that exist from the first priority other than the default on; until then
// no function here runs and eviction is exactly the policy's.
//
// Each account has one list per priority class besides its default lists
// (recency list and probation stack). Every path's priorities fall from
// root to leaf at every time (ApplyPriorities), and each list keeps a node
// nearer its head than its parent; so the head of an account's lowest
// non-empty class is an unpinned leaf, and eviction stays O(1) per victim
// plus a scan of the account's class bits.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "radix/radix_tree.h"
#include "radix/radix_tree_internal.h"

namespace radixkv {

using radix_internal::kNever;
using radix_internal::Priority;

absl::Status RadixTree::Impl::CheckPriorities(
    const char* what, absl::Span<const BlockPriority> ranges,
    uint32_t total_blocks) {
  if (ranges.size() > kMaxPriorityRanges) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", ranges.size(), " ranges exceed the limit of ",
                     kMaxPriorityRanges));
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    const BlockPriority& r = ranges[i];
    if (r.priority > kMaxPriority) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "].priority=", r.priority,
                       " exceeds the limit of ", kMaxPriority));
    }
    if (r.duration != absl::InfiniteDuration() &&
        r.duration > kMaxPriorityDuration) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "[", i, "].duration=", absl::FormatDuration(r.duration),
          " exceeds the limit of ", absl::FormatDuration(kMaxPriorityDuration)));
    }
    if (r.blocks == 0 ||
        uint64_t{r.first_block} + r.blocks > uint64_t{total_blocks}) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "[", i, "]: blocks [", r.first_block, ", ",
          uint64_t{r.first_block} + r.blocks,
          ") are empty or not within the prompt's ", total_blocks,
          " full blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status RadixTree::Impl::EnablePriorities(
    absl::Span<const BlockPriority> ranges) {
  if (prio != nullptr) return absl::OkStatus();
  const bool any = std::any_of(ranges.begin(), ranges.end(), [](auto& r) {
    return r.priority != kDefaultPriority;
  });
  if (!any) return absl::OkStatus();
  std::unique_ptr<uint8_t[]> p(new (std::nothrow) uint8_t[capacity]);
  std::unique_ptr<uint32_t[]> e(new (std::nothrow) uint32_t[capacity]);
  if (p == nullptr || e == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "priorities: cannot allocate ", size_t{capacity} * 5,
        " bytes of per-page priorities"));
  }
  std::fill_n(p.get(), capacity, static_cast<uint8_t>(kDefaultPriority));
  std::fill_n(e.get(), capacity, kNever);
  prio = std::move(p);
  prio_expires = std::move(e);
  return absl::OkStatus();
}

void RadixTree::Impl::AddPriorities(Lease& lease,
                                    absl::Span<const BlockPriority> ranges,
                                    uint32_t now) {
  for (const BlockPriority& r : ranges) {
    Priority v;  // the default
    if (r.priority != kDefaultPriority) {
      v.prio = static_cast<uint8_t>(r.priority);
      if (r.duration > absl::ZeroDuration() &&
          r.duration != absl::InfiniteDuration()) {
        const int64_t secs = absl::ToInt64Seconds(
            absl::Ceil(r.duration, absl::Seconds(1)));
        v.expires = static_cast<uint32_t>(
            std::min<uint64_t>(uint64_t{now} + secs, kNever - 1));
      }
    }
    lease.priorities.push_back({r.first_block, r.blocks, v});
  }
}

Priority RadixTree::Impl::EvalPriority(PageId p, uint32_t now) {
  if (prio[p] != kDefaultPriority && prio_expires[p] <= now) {
    prio[p] = kDefaultPriority;
    prio_expires[p] = kNever;
  }
  return StoredPriority(p);
}

bool RadixTree::Impl::ListClassed(PageId p, uint32_t now) {
  const Priority v = EvalPriority(p, now);
  if (v.prio == kDefaultPriority) return false;
  Node& n = nodes[p];
  n.probation = false;  // only the default class has a probation stack
  const uint32_t a = namespaces[n.ns].account;
  LruAppend(p, ClassHead(a, v.prio));
  accounts[a].class_bits[v.prio / 64] |= uint64_t{1} << (v.prio % 64);
  return true;
}

PageId RadixTree::Impl::ClassedVictimList(uint32_t a) const {
  const radix_internal::Account& acc = accounts[a];
  // The first non-empty list of classes lo .. hi-1.
  auto scan = [&](uint32_t lo, uint32_t hi)
                  ABSL_SHARED_LOCKS_REQUIRED(mu) -> PageId {
    for (uint32_t w = lo / 64; w * 64 < hi; ++w) {
      uint64_t bits = acc.class_bits[w];
      while (bits != 0) {
        const uint32_t c = w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
        bits &= bits - 1;
        if (c < lo || c >= hi) continue;
        const PageId head = ClassHead(a, c);
        if (links[head].next != head) return head;
      }
    }
    return kNoPage;
  };
  if (PageId h = scan(0, kDefaultPriority); h != kNoPage) return h;
  const PageId prob = probation_sentinel + a;
  if (links[prob].next != prob) return prob;
  if (links[sentinel + a].next != sentinel + a) return sentinel + a;
  if (PageId h = scan(kDefaultPriority + 1, kMaxPriority + 1); h != kNoPage) {
    return h;
  }
  return sentinel + a;  // empty
}

void RadixTree::Impl::ApplyPriorities(const Lease& lease, uint32_t now) {
  Priority below = radix_internal::kBottomPriority;
  for (size_t i = lease.path.size(); i-- > 0;) {
    Priority want;  // the default, unless a range names block i
    bool named = false;
    for (const radix_internal::PriorityRange& r : lease.priorities) {
      if (i >= r.first && i - r.first < r.blocks) {
        want = named ? radix_internal::CombinePriority(want, r.value) : r.value;
        named = true;
      }
    }
    const PageId p = lease.path[i];
    const uint32_t old_expires = prio_expires[p];
    const Priority v = radix_internal::CombinePriority(
        radix_internal::CombinePriority(EvalPriority(p, now), want), below);
    prio[p] = v.prio;
    prio_expires[p] = v.expires;
    if (v.expires != kNever && v.expires != old_expires) {
      expiry_heap.emplace_back(v.expires, p);
      std::push_heap(expiry_heap.begin(), expiry_heap.end(),
                     std::greater<>());
    }
    below = v;
  }
  if (expiry_heap.size() > 2 * size_t{capacity} + 1024) {
    // Mostly stale entries: rebuild from the side arrays.
    expiry_heap.clear();
    for (PageId p = 0; p < capacity; ++p) {
      if (nodes[p].state == PageState::kCached &&
          prio[p] != kDefaultPriority && prio_expires[p] != kNever) {
        expiry_heap.emplace_back(prio_expires[p], p);
      }
    }
    std::make_heap(expiry_heap.begin(), expiry_heap.end(), std::greater<>());
  }
}

void RadixTree::Impl::DecayExpired(uint32_t now) {
  std::vector<PageId> due;
  while (!expiry_heap.empty() && expiry_heap.front().first <= now) {
    std::pop_heap(expiry_heap.begin(), expiry_heap.end(), std::greater<>());
    const auto [e, p] = expiry_heap.back();
    expiry_heap.pop_back();
    if (nodes[p].state == PageState::kCached &&
        prio[p] != kDefaultPriority && prio_expires[p] == e) {
      due.push_back(p);
    }
  }
  std::sort(due.begin(), due.end());
  due.erase(std::unique(due.begin(), due.end()), due.end());
  std::vector<std::pair<uint32_t, PageId>> by_depth;
  by_depth.reserve(due.size());
  for (PageId p : due) {
    uint32_t depth = 0;
    for (PageId q = nodes[p].parent; q != kNoPage; q = nodes[q].parent) ++depth;
    by_depth.emplace_back(depth, p);
  }
  std::sort(by_depth.begin(), by_depth.end());
  auto decay = [&](PageId p, bool oldest_end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    prio[p] = kDefaultPriority;
    prio_expires[p] = kNever;
    if (nodes[p].refs != 0) return;  // placed when unpinned
    LruRemove(p);
    const PageId head = SentinelOf(nodes[p].ns);
    if (oldest_end) {
      LinkAfter(p, head);
    } else {
      LruAppend(p, head);
    }
  };
  // Below the default: shallowest first onto the oldest end, so children
  // end up nearer the head than their parents.
  for (const auto& [depth, p] : by_depth) {
    if (prio[p] < kDefaultPriority) decay(p, /*oldest_end=*/true);
  }
  // Above the default: deepest first onto the newest end.
  for (auto it = by_depth.rbegin(); it != by_depth.rend(); ++it) {
    if (prio[it->second] > kDefaultPriority) decay(it->second, false);
  }
}

absl::Status RadixTree::Impl::CheckPriorityLists(std::vector<uint32_t>& pos,
                                                 std::vector<uint32_t>& list,
                                                 uint32_t* rank) const {
  auto fail = [](const auto&... parts) {
    return absl::InternalError(absl::StrCat("radix invariant: ", parts...));
  };
  const uint32_t n_accounts = static_cast<uint32_t>(accounts.size());
  if (prio == nullptr) return absl::OkStatus();
  for (uint32_t a = 0; a < n_accounts; ++a) {
    for (uint32_t c = 0; c <= kMaxPriority; ++c) {
      if (c == kDefaultPriority) continue;
      const PageId head = ClassHead(a, c);
      if (links[head].next != head &&
          (accounts[a].class_bits[c / 64] >> (c % 64) & 1) == 0) {
        return fail("class ", c, " of account ", a, " holds nodes, its bit is clear");
      }
      PageId prev = head;
      for (PageId p = links[head].next; p != head; p = links[p].next) {
        if (p >= capacity) return fail("class list holds bad page ", p);
        const Node& n = nodes[p];
        if (n.state != PageState::kCached || n.refs != 0 || n.probation) {
          return fail("class list holds page ", p,
                      " that is pinned, not cached or on probation");
        }
        if (namespaces[n.ns].account != a || prio[p] != c) {
          return fail("page ", p, " (priority ", prio[p],
                      ") is on class ", c, " of account ", a);
        }
        if (links[p].prev != prev) return fail("class list back link at ", p);
        if (pos[p] != 0 || *rank >= capacity) return fail("class list cycle");
        pos[p] = ++*rank;
        list[p] = 2 * n_accounts + a * (kMaxPriority + 1) + c;
        prev = p;
      }
      if (links[head].prev != prev) return fail("class list tail link");
    }
  }
  const uint32_t now = NowSeconds();
  for (PageId p = 0; p < capacity; ++p) {
    const Node& n = nodes[p];
    if (n.state != PageState::kCached) continue;
    if (pos[p] != 0 && list[p] < 2 * n_accounts && prio[p] != kDefaultPriority) {
      return fail("page ", p, " of priority ", prio[p], " is on a default list");
    }
    if (n.parent == kNoPage) continue;
    // At no time from now on above its parent.
    const Priority c = StoredPriority(p), up = StoredPriority(n.parent);
    for (uint32_t t : {now, c.expires, up.expires}) {
      if (t < now || t == kNever) continue;
      if (radix_internal::PriorityAt(c, t) > radix_internal::PriorityAt(up, t)) {
        return fail("page ", p, " has priority ", radix_internal::PriorityAt(c, t),
                    " at ", t, " s, above its parent ", n.parent, "'s ",
                    radix_internal::PriorityAt(up, t));
      }
    }
  }
  return absl::OkStatus();
}

uint32_t RadixTree::TEST_priority(PageId page) const {
  ReaderMutexLock lock(&impl_->mu);
  if (impl_->prio == nullptr) return kDefaultPriority;
  return radix_internal::PriorityAt(impl_->StoredPriority(page),
                                    impl_->NowSeconds());
}

}  // namespace radixkv
