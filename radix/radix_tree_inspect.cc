// File: radix/radix_tree_inspect.cc
//
// RadixTree's read-only inspection API: Explain, DumpTree, GetStats,
// IndexMemoryBytes, the TEST_ hooks and the invariant checker. All of them
// take the tree's mutex in shared mode.
#include <algorithm>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "radix/radix_tree.h"
#include "radix/radix_tree_internal.h"

namespace radixkv {

using radix_internal::Lease;
using radix_internal::Node;

absl::StatusOr<std::vector<BlockExplanation>> RadixTree::Explain(
    NamespaceId ns, absl::Span<const BlockKey> keys,
    absl::Span<const uint32_t> tokens) const {
  Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  if (absl::Status s = m.ValidateRequest("Explain", ns, keys, tokens);
      !s.ok()) {
    return s;
  }
  const size_t ps = m.namespaces[ns].spec.page_size;
  std::vector<BlockExplanation> out(keys.size());
  // The page found for the previous key (verified or not): a hit must chain
  // from it. `gap` becomes true after the first block that is not a hit.
  PageId parent = kNoPage;
  bool gap = false;
  absl::flat_hash_set<BlockKey> evicted;  // built on the first miss
  for (size_t i = 0; i < keys.size(); ++i) {
    BlockExplanation& e = out[i];
    e.key = keys[i];
    auto it = m.index.find(keys[i]);
    if (it != m.index.end()) {
      const PageId p = *it;
      const auto block = tokens.empty() ? absl::Span<const uint32_t>()
                                        : tokens.subspan(i * ps, ps);
      if (m.Verifies(p, ns, parent, block)) {
        e.status = gap ? BlockStatus::kParentMissing : BlockStatus::kCached;
        if (!gap) {
          e.page = p;
          e.refcount = m.nodes[p].refs;
          e.age_seconds = m.AgeSeconds(m.nodes[p]);
        }
      } else {
        e.status = BlockStatus::kTokenMismatch;
        gap = true;
      }
      parent = p;
      continue;
    }
    parent = kNoPage;
    if (evicted.empty() && !m.evicted_ring.empty()) {
      evicted.insert(m.evicted_ring.begin(), m.evicted_ring.end());
    }
    if (evicted.contains(keys[i])) {
      e.status = BlockStatus::kEvicted;
    } else if (gap) {
      e.status = BlockStatus::kParentMissing;
    } else {
      e.status = BlockStatus::kNotPresent;
    }
    gap = true;
  }
  return out;
}

std::vector<NodeInfo> RadixTree::DumpTree(uint32_t max_depth,
                                          uint32_t limit) const {
  Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  // Depth of every cached node, memoised: each node is resolved once by
  // walking up to the first ancestor whose depth is known.
  constexpr uint32_t kUnknown = 0xffffffffu;
  std::vector<uint32_t> depth(m.capacity, kUnknown);
  std::vector<PageId> chain;
  std::vector<NodeInfo> out;
  for (PageId p = 0; p < m.capacity; ++p) {
    if (m.nodes[p].state != PageState::kCached) continue;
    chain.clear();
    PageId q = p;
    while (q != kNoPage && depth[q] == kUnknown) {
      chain.push_back(q);
      q = m.nodes[q].parent;
    }
    uint32_t d = q == kNoPage ? 0 : depth[q] + 1;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) depth[*it] = d++;
    if (depth[p] > max_depth) continue;
    const Node& n = m.nodes[p];
    NodeInfo info;
    info.key = n.key;
    info.parent_key = m.ParentKey(n);
    info.ns = n.ns;
    info.page = p;
    info.depth = depth[p];
    info.refcount = n.refs;
    info.children = n.children;
    info.age_seconds = m.AgeSeconds(n);
    out.push_back(info);
  }
  std::sort(out.begin(), out.end(), [](const NodeInfo& a, const NodeInfo& b) {
    return std::tie(a.depth, a.age_seconds, a.page) <
           std::tie(b.depth, b.age_seconds, b.page);
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

std::vector<NodeInfo> RadixTree::DumpTreePage(uint32_t max_depth,
                                              PageId start, uint32_t limit,
                                              bool with_tokens,
                                              PageId* next) const {
  Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  std::vector<NodeInfo> out;
  // Depths found during this call, memoised: a node's depth is resolved by
  // walking up to the first ancestor whose depth is known.
  absl::flat_hash_map<PageId, uint32_t> depth;
  std::vector<PageId> chain;
  const uint64_t end =
      std::min<uint64_t>(m.capacity, uint64_t{start} + kDumpScanPages);
  PageId p = std::min<PageId>(start, m.capacity);
  for (; p < end && out.size() < limit; ++p) {
    const Node& n = m.nodes[p];
    if (n.state != PageState::kCached) continue;
    chain.clear();
    PageId q = p;
    uint32_t d = 0;
    while (q != kNoPage) {
      if (auto it = depth.find(q); it != depth.end()) {
        d = it->second + 1;
        break;
      }
      chain.push_back(q);
      q = m.nodes[q].parent;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) depth[*it] = d++;
    const uint32_t dp = depth[p];
    if (dp > max_depth) continue;
    NodeInfo& info = out.emplace_back();
    info.key = n.key;
    info.parent_key = m.ParentKey(n);
    info.ns = n.ns;
    info.page = p;
    info.depth = dp;
    info.refcount = n.refs;
    info.children = n.children;
    info.age_seconds = m.AgeSeconds(n);
    if (with_tokens && n.has_tokens && m.arena_page_size != 0) {
      const uint32_t* t = m.TokensOf(p);
      info.tokens.assign(t, t + m.arena_page_size);
    }
  }
  *next = p;
  return out;
}

uint32_t RadixTree::capacity() const { return impl_->capacity; }

TreeStats RadixTree::GetStats() const {
  Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  TreeStats s = m.stats;
  s.capacity_pages = m.capacity;
  s.free_pages = m.free_count;
  s.writing_pages = m.writing_count;
  s.cached_pages = m.cached_count;
  s.pinned_pages = m.pinned_count;
  s.nodes = m.cached_count;
  s.leases = m.leases.size();
  s.namespaces = m.namespaces.size() - m.free_namespaces.size();
  s.matches = m.matches.load(std::memory_order_relaxed);
  s.walked_blocks = m.walked_blocks.load(std::memory_order_relaxed);
  s.hashed_blocks = m.hashed_blocks.load(std::memory_order_relaxed);
  s.fenced_leases = m.fenced_leases;
  s.fenced_pages = m.fenced_pages;
  s.probation_pages = m.probation_count;
  for (const radix_internal::Account& a : m.accounts) {
    s.pins += a.pins;
    s.pin_pages += a.pin_pages;
  }
  if (m.turn_duel != nullptr) {
    s.eviction_policy = EvictionPolicy::kTurnDuel;
    s.eviction_theta = static_cast<uint32_t>(m.turn_duel->theta());
    s.eviction_switches = m.turn_duel->switches();
    s.eviction_tier_theta = static_cast<uint32_t>(m.turn_duel->tier_theta());
    s.eviction_tier_switches = m.turn_duel->tier_switches();
    s.admitted_requests = m.turn_duel->admitted();
    s.probation_requests = m.turn_duel->probationed();
  }
  return s;
}

bool RadixTree::vector_walk(uint32_t page_size) const {
  return impl_->UsesWideWalk(size_t{page_size} * sizeof(uint32_t));
}

size_t RadixTree::IndexMemoryBytes() const {
  Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  size_t bytes = (size_t{m.capacity} + 1) *
                 (sizeof(Node) + sizeof(radix_internal::Link));
  // flat_hash_set: one slot plus one control byte per bucket.
  bytes += m.index.capacity() * (sizeof(PageId) + 1);
  bytes += m.leases.capacity() * (sizeof(LeaseId) + sizeof(Lease) + 1);
  for (const auto& [id, lease] : m.leases) {
    bytes += lease.path.capacity() * sizeof(PageId) +
             lease.writing.capacity() * sizeof(PageId) +
             lease.keys.capacity() * sizeof(BlockKey);
  }
  bytes += m.owner_leases.capacity() *
           (sizeof(OwnerId) + sizeof(Impl::OwnerCount) + 1);
  bytes += m.evicted_ring.capacity() * sizeof(BlockKey);
  bytes += m.namespaces.capacity() * sizeof(m.namespaces[0]);
  return bytes;
}

PageState RadixTree::TEST_page_state(PageId page) const {
  ReaderMutexLock lock(&impl_->mu);
  return page < impl_->capacity ? impl_->nodes[page].state : PageState::kFree;
}

uint32_t RadixTree::TEST_refcount(PageId page) const {
  ReaderMutexLock lock(&impl_->mu);
  return page < impl_->capacity ? impl_->nodes[page].refs : 0;
}

absl::Status RadixTree::CheckInvariants() const {
  ReaderMutexLock lock(&impl_->mu);
  return impl_->CheckLocked();
}

namespace {

// An invariant violation, as CheckInvariants reports it.
template <typename... Parts>
absl::Status Violation(const Parts&... parts) {
  return absl::InternalError(absl::StrCat("radix invariant: ", parts...));
}

}  // namespace

absl::Status RadixTree::Impl::CheckLocked() const {
  PageCounts c;
  if (absl::Status s = CheckNodes(&c); !s.ok()) return s;
  if (absl::Status s = CheckLists(c); !s.ok()) return s;
  return CheckLeases(c.writing);
}

absl::Status RadixTree::Impl::CheckNodes(PageCounts* c) const {
  auto fail = [](const auto&... parts) { return Violation(parts...); };
  // Page states and counters.
  uint64_t n_free = 0, n_writing = 0, n_cached = 0, n_pinned = 0;
  std::vector<uint32_t> children(capacity, 0);
  std::vector<uint64_t> ns_blocks(namespaces.size(), 0);
  for (PageId p = 0; p < capacity; ++p) {
    const Node& n = nodes[p];
    switch (n.state) {
      case PageState::kFree:
        ++n_free;
        break;
      case PageState::kWriting:
        ++n_writing;
        break;
      case PageState::kCached: {
        ++n_cached;
        if (n.refs > 0) ++n_pinned;
        if (!LiveNamespace(n.ns)) {
          return fail("page ", p, " has unknown namespace ", n.ns);
        }
        ++ns_blocks[n.ns];
        auto it = index.find(n.key);
        if (it == index.end() || *it != p) {
          return fail("page ", p, " key ", n.key.ToHex(),
                      " is not indexed to it");
        }
        if (n.parent != kNoPage) {
          if (n.parent >= capacity ||
              nodes[n.parent].state != PageState::kCached) {
            return fail("page ", p, " has a parent ", n.parent,
                        " that is not cached");
          }
          const Node& par = nodes[n.parent];
          if (par.ns != n.ns) return fail("page ", p, " parent in other ns");
          if (par.refs < n.refs) {
            return fail("page ", p, " refs ", n.refs, " > parent refs ",
                        par.refs);
          }
          ++children[n.parent];
        }
        break;
      }
      default:
        return fail("page ", p, " has an invalid state");
    }
  }
  if (n_free + n_writing + n_cached != capacity) {
    return fail("free ", n_free, " + writing ", n_writing, " + cached ",
                n_cached, " != capacity ", capacity);
  }
  if (n_free != free_count || n_writing != writing_count ||
      n_cached != cached_count || n_pinned != pinned_count) {
    return fail("counters (free ", free_count, ", writing ", writing_count,
                ", cached ", cached_count, ", pinned ", pinned_count,
                ") differ from a scan (", n_free, ", ", n_writing, ", ",
                n_cached, ", ", n_pinned, ")");
  }
  if (index.size() != n_cached) {
    return fail("index holds ", index.size(), " keys, ", n_cached,
                " pages are cached");
  }
  for (PageId p = 0; p < capacity; ++p) {
    if (nodes[p].state == PageState::kCached &&
        nodes[p].children != children[p]) {
      return fail("page ", p, " child count ", nodes[p].children, " != ",
                  children[p]);
    }
  }
  std::vector<uint64_t> account_cached(accounts.size(), 0);
  for (size_t i = 0; i < namespaces.size(); ++i) {
    if (namespaces[i].cached_blocks != ns_blocks[i]) {
      return fail("namespace ", i, " counts ", namespaces[i].cached_blocks,
                  " blocks, scan finds ", ns_blocks[i]);
    }
    account_cached[namespaces[i].account] += ns_blocks[i];
  }
  for (size_t a = 0; a < accounts.size(); ++a) {
    if (accounts[a].cached != account_cached[a]) {
      return fail("account ", a, " counts ", accounts[a].cached,
                  " cached pages, scan finds ", account_cached[a]);
    }
  }
  c->free = n_free;
  c->writing = n_writing;
  c->cached = n_cached;
  c->pinned = n_pinned;
  return absl::OkStatus();
}

absl::Status RadixTree::Impl::CheckLists(const PageCounts& c) const {
  auto fail = [](const auto&... parts) { return Violation(parts...); };
  const uint64_t n_free = c.free, n_cached = c.cached, n_pinned = c.pinned;
  // Free list.
  uint64_t listed = 0;
  for (PageId p = free_head; p != kNoPage; p = links[p].next) {
    if (p >= capacity || nodes[p].state != PageState::kFree) {
      return fail("free list holds page ", p, " that is not free");
    }
    if (++listed > capacity) return fail("free list has a cycle");
  }
  if (listed != n_free) {
    return fail("free list has ", listed, " pages, ", n_free, " are free");
  }
  // Recency lists and probation stacks: together exactly the unpinned
  // cached nodes, each on its account's list of its kind (probation bit)
  // and nearer the list's head (evicted sooner) than its parent when both
  // are on the same list. No probation node has a child on a recency
  // list, so while a probation stack holds nodes its head is a leaf, and
  // once it is empty so is the recency list's.
  std::vector<uint32_t> pos(capacity, 0);  // 1-based position; 0: absent
  std::vector<uint32_t> list(capacity, 0);
  uint32_t rank = 0;
  for (uint32_t l = 0; l < 2 * accounts.size(); ++l) {
    const bool probation = l >= accounts.size();
    const uint32_t a = probation ? l - static_cast<uint32_t>(accounts.size()) : l;
    const PageId head = (probation ? probation_sentinel : sentinel) + a;
    if (probation && turn_duel == nullptr && links[head].next != head) {
      return fail("probation stack of account ", a, " used under lru");
    }
    PageId prev = head;
    for (PageId p = links[head].next; p != head; p = links[p].next) {
      if (p >= capacity) return fail("recency list holds bad page ", p);
      const Node& n = nodes[p];
      if (n.state != PageState::kCached || n.refs != 0) {
        return fail("recency list holds page ", p,
                    " that is pinned or not cached");
      }
      if (namespaces[n.ns].account != a) {
        return fail("page ", p, " is on account ", a, "'s recency list");
      }
      if (n.probation != probation) {
        return fail("page ", p, " is on the wrong list (probation ",
                    n.probation, ")");
      }
      if (links[p].prev != prev) return fail("recency list back link at ", p);
      if (pos[p] != 0 || rank >= capacity) return fail("recency list cycle");
      pos[p] = ++rank;
      list[p] = l;
      prev = p;
    }
    if (links[head].prev != prev) return fail("recency list tail link");
  }
  if (absl::Status s = CheckPriorityLists(pos, list, &rank); !s.ok()) {
    return s;
  }
  if (rank != n_cached - n_pinned) {
    return fail("recency list has ", rank, " nodes, ", n_cached - n_pinned,
                " are unpinned");
  }
  uint64_t on_probation = 0;
  for (PageId p = 0; p < capacity; ++p) {
    on_probation += pos[p] != 0 && list[p] >= accounts.size() &&
                    list[p] < 2 * accounts.size();
  }
  if (on_probation != probation_count) {
    return fail("probation stacks hold ", on_probation, " nodes, ",
                probation_count, " are counted");
  }
  for (PageId p = 0; p < capacity; ++p) {
    const Node& n = nodes[p];
    if (n.state != PageState::kCached || n.refs != 0 || n.parent == kNoPage) {
      continue;
    }
    const Node& parent = nodes[n.parent];
    if (parent.refs != 0) continue;
    if (parent.probation && !n.probation && list[p] < 2 * accounts.size()) {
      return fail("page ", p, " is on a recency list, its parent ", n.parent,
                  " on a probation stack");
    }
    if (list[n.parent] == list[p] && pos[n.parent] < pos[p]) {
      return fail("page ", p, " is newer in the recency list than its parent ",
                  n.parent);
    }
  }
  return absl::OkStatus();
}

absl::Status RadixTree::Impl::CheckLeases(uint64_t n_writing) const {
  auto fail = [](const auto&... parts) { return Violation(parts...); };
  // Leases: pins add up to refcounts; WRITING pages belong to one lease;
  // owner_leases counts each owner's leases and the pages they hold; each
  // lease's held count is its pins plus its WRITING pages; the fenced
  // counters add up.
  std::vector<uint32_t> pins(capacity, 0);
  std::vector<uint8_t> owned(capacity, 0);
  uint64_t lease_writing = 0;
  absl::flat_hash_map<OwnerId, OwnerCount> per_owner;
  uint64_t n_fenced = 0, n_fenced_pages = 0;
  std::vector<uint64_t> account_held(accounts.size(), 0);
  std::vector<uint64_t> account_writing(accounts.size(), 0);
  std::vector<uint64_t> account_pins(accounts.size(), 0);
  std::vector<uint64_t> account_pin_pages(accounts.size(), 0);
  std::vector<uint32_t> ns_leases(namespaces.size(), 0);
  for (const auto& [id, lease] : leases) {
    if (!LiveNamespace(lease.ns)) {
      return fail("lease ", id, " is in unknown namespace ", lease.ns);
    }
    ++ns_leases[lease.ns];
    const uint32_t account = namespaces[lease.ns].account;
    if (lease.prefix_pin) {
      if (lease.owner != kPinOwner || !lease.writing.empty() ||
          lease.expires != absl::InfiniteFuture() || lease.fenced) {
        return fail("pin ", id, " is not an unexpiring lease of kPinOwner "
                    "without WRITING pages");
      }
      ++account_pins[account];
      account_pin_pages[account] += lease.held;
    } else {
      if (lease.owner == kPinOwner) {
        return fail("lease ", id, " of kPinOwner is not a pin");
      }
      account_held[account] += lease.held;
    }
    if (lease.owner != kNoOwner) {
      ++per_owner[lease.owner].leases;
      per_owner[lease.owner].pages += lease.held;
    }
    if (lease.fenced) {
      ++n_fenced;
      n_fenced_pages += lease.held;
    }
    uint64_t lease_held = lease.path.size();
    PageId parent = kNoPage;
    for (PageId p : lease.path) {
      if (p >= capacity || nodes[p].state != PageState::kCached) {
        return fail("lease ", id, " pins page ", p, " that is not cached");
      }
      if (nodes[p].parent != parent) {
        return fail("lease ", id, " path is not a root path at page ", p);
      }
      parent = p;
      ++pins[p];
    }
    for (PageId p : lease.writing) {
      if (p >= capacity) return fail("lease ", id, " owns bad page ", p);
      if (nodes[p].state == PageState::kWriting) {
        if (owned[p]++) return fail("page ", p, " owned by two leases");
        ++lease_writing;
        ++account_writing[account];
        ++lease_held;
      }
    }
    if (lease_held != lease.held) {
      return fail("lease ", id, " counts ", lease.held, " pages, holds ",
                  lease_held);
    }
  }
  // Pages an ended lease left held (ReleaseHold frees them): WRITING,
  // owned by no lease, counted against their account.
  for (const auto& [id, h] : held) {
    if (h.account >= accounts.size()) {
      return fail("held pages of lease ", id, " in unknown account ",
                  h.account);
    }
    for (PageId p : h.pages) {
      if (p >= capacity || nodes[p].state != PageState::kWriting) {
        return fail("lease ", id, " holds page ", p, " that is not writing");
      }
      if (owned[p]++) return fail("page ", p, " owned twice (held)");
      ++lease_writing;
      ++account_writing[h.account];
    }
  }
  if (n_fenced != fenced_leases || n_fenced_pages != fenced_pages) {
    return fail("fenced counters ", fenced_leases, "/", fenced_pages,
                " != leases ", n_fenced, "/", n_fenced_pages);
  }
  bool same_counts = per_owner.size() == owner_leases.size();
  for (const auto& [o, c] : per_owner) {
    auto it = owner_leases.find(o);
    if (it == owner_leases.end() || it->second.leases != c.leases ||
        it->second.pages != c.pages) {
      same_counts = false;
    }
  }
  if (!same_counts) {
    return fail("owner_leases counts ", owner_leases.size(),
                " owners, the lease table ", per_owner.size(),
                " (or their counts differ)");
  }
  if (lease_writing != n_writing) {
    return fail(n_writing, " pages are writing, leases own ", lease_writing);
  }
  for (size_t i = 0; i < namespaces.size(); ++i) {
    if (namespaces[i].leases != ns_leases[i]) {
      return fail("namespace ", i, " counts ", namespaces[i].leases,
                  " leases, the lease table ", ns_leases[i]);
    }
  }
  for (size_t a = 0; a < accounts.size(); ++a) {
    if (accounts[a].held != account_held[a] ||
        accounts[a].writing != account_writing[a]) {
      return fail("account ", a, " counts ", accounts[a].held, " held and ",
                  accounts[a].writing, " writing pages, its leases ",
                  account_held[a], " and ", account_writing[a]);
    }
    if (accounts[a].pins != account_pins[a] ||
        accounts[a].pin_pages != account_pin_pages[a]) {
      return fail("account ", a, " counts ", accounts[a].pins, " pins of ",
                  accounts[a].pin_pages, " pages, the lease table ",
                  account_pins[a], " of ", account_pin_pages[a]);
    }
  }
  for (PageId p = 0; p < capacity; ++p) {
    if (nodes[p].state == PageState::kCached && nodes[p].refs != pins[p]) {
      return fail("page ", p, " refcount ", nodes[p].refs, " != ", pins[p],
                  " lease pins");
    }
  }
  return absl::OkStatus();
}

}  // namespace radixkv
