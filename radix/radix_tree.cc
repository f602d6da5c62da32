// File: radix/radix_tree.cc
//
// RadixTree's construction, namespaces and eviction. The storage layout and
// the invariants are described in radix_tree_internal.h; lookups live in
// radix_tree_walk.cc, leases in radix_tree_lease.cc and the read-only
// inspection API in radix_tree_inspect.cc.
#include "radix/radix_tree.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include <sys/mman.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "radix/radix_tree_internal.h"
#include "base/status_macros.h"

namespace radixkv {

using radix_internal::Namespace;
using radix_internal::Node;
using radix_internal::PageEq;
using radix_internal::PageHash;

namespace radix_internal {

constexpr size_t kHugePage = size_t{2} << 20;

void* AllocLarge(size_t bytes) {
  if (bytes < kHugePage) return std::malloc(bytes == 0 ? 1 : bytes);
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  // Fault every page in now rather than at first use, which would happen
  // under the tree's exclusive lock: a first touch of a huge page zeroes
  // 2 MB and, where the kernel compacts memory on demand, compacts first.
  // The node and link arrays are initialised here anyway; this adds the
  // key index's slots.
  for (size_t off = 0; off < rounded; off += 4096) {
    static_cast<volatile char*>(p)[off] = 0;
  }
  return p;
}

void* AllocArena(size_t bytes, size_t eager_bytes) {
  // Faulting the arena in up front costs time proportional to its size (far
  // more on a VM whose host backs guest memory on first touch), so a bigger
  // arena than `eager_bytes` (an index-only pool of long pages) is left to
  // the OS, 4 KiB at a time, without a huge-page request: huge pages
  // faulted on demand would stall the exclusive lock each time.
  if (bytes <= eager_bytes) return AllocLarge(bytes);
  constexpr size_t kPage = 4096;
  return std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
}

void FreeLarge(void* p) { std::free(p); }

}  // namespace radix_internal

namespace {

bool CpuHasAvx2() {
#if RADIXKV_WIDE_WALK
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

// n value-initialised Ts in AllocLarge memory; nullptr when out of memory.
template <typename T>
T* NewLargeArray(size_t n) {
  void* mem = radix_internal::AllocLarge(n * sizeof(T));
  if (mem == nullptr) return nullptr;
  T* out = static_cast<T*>(mem);
  for (size_t i = 0; i < n; ++i) new (&out[i]) T();
  return out;
}

}  // namespace

const char* BlockStatusName(BlockStatus s) {
  switch (s) {
    case BlockStatus::kCached:
      return "cached";
    case BlockStatus::kNotPresent:
      return "not_present";
    case BlockStatus::kEvicted:
      return "evicted";
    case BlockStatus::kTokenMismatch:
      return "token_mismatch";
    case BlockStatus::kParentMissing:
      return "parent_missing";
  }
  return "unknown";
}

RadixTree::Impl::Impl(const RadixTreeOptions& o)
    : capacity(o.capacity_pages),
      max_page_size(o.max_page_size),
      eager_token_arena_bytes(o.eager_token_arena_bytes),
      remembered_evictions(o.remembered_evictions),
      wide_walk(o.vector_walk && CpuHasAvx2()),
      fence(o.fence_unended_leases),
      listener(o.listener),
      epoch(absl::Now()),
      sentinel(o.capacity_pages),
      num_accounts(o.accounts),
      probation_sentinel(o.capacity_pages + o.accounts),
      class_sentinel(o.capacity_pages + 2 * o.accounts),
      accounts(o.accounts) {
  if (o.eviction_policy == EvictionPolicy::kTurnDuel) {
    turn_duel = std::make_unique<radix_internal::TurnDuel>(
        o.capacity_pages, o.lower_tier_blocks);
  }
}

absl::Status RadixTree::Impl::Init() {
  WriterMutexLock lock(&mu);
  const size_t slots = size_t{capacity} + 2 * accounts.size();
  const size_t link_slots =
      slots + size_t{kMaxPriority + 1} * accounts.size();
  nodes.reset(NewLargeArray<Node>(slots));
  links.reset(NewLargeArray<radix_internal::Link>(link_slots));
  if (nodes == nullptr || links == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "capacity_pages=", capacity, ": cannot allocate the index's ",
        slots * sizeof(Node) + link_slots * sizeof(radix_internal::Link),
        " bytes"));
  }
  // The index never holds more than `capacity` keys. Sizing it now means it
  // never grows (growing rehashes every key under the exclusive lock), and
  // room for half as many again keeps a full tree's table at most ~58 %
  // loaded, where erasures rarely force an in-place rehash to clear
  // tombstones.
  try {
    index = KeyIndex(0, PageHash{nodes.get()}, PageEq{nodes.get()});
    index.reserve(size_t{capacity} + capacity / 2);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "capacity_pages=", capacity, ": cannot allocate the key index"));
  }
  for (PageId p = 0; p < capacity; ++p) {
    links[p].next = p + 1 < capacity ? p + 1 : kNoPage;
  }
  free_head = capacity > 0 ? 0 : kNoPage;
  free_count = capacity;
  for (PageId s = sentinel; s < link_slots; ++s) links[s] = {s, s};
  return absl::OkStatus();
}

PageId RadixTree::Impl::PopFree() {
  const PageId p = free_head;
  if (p == kNoPage) return p;
  free_head = links[p].next;
  links[p].next = kNoPage;
  --free_count;
  return p;
}

void RadixTree::Impl::PushFree(PageId p) {
  nodes[p] = Node{};
  links[p] = {kNoPage, free_head};
  free_head = p;
  ++free_count;
}

void RadixTree::Impl::RememberEviction(const BlockKey& k) {
  if (remembered_evictions == 0) return;
  if (evicted_ring.size() < remembered_evictions) {
    evicted_ring.push_back(k);
  } else {
    evicted_ring[evicted_next] = k;
  }
  if (++evicted_next == remembered_evictions) evicted_next = 0;
}

PageId RadixTree::Impl::VictimList() const {
  if (accounts.size() == 1) {
    const PageId head = turn_duel == nullptr && prio == nullptr
                            ? sentinel
                            : AccountVictimList(0);
    return links[head].next != head ? head : kNoPage;
  }
  // The account with the most cached pages per unit of weight that has an
  // unpinned leaf: cached_a / weight_a > cached_b / weight_b, compared as
  // products.
  PageId best = kNoPage;
  uint64_t best_cached = 0, best_weight = 1;
  for (uint32_t i = 0; i < accounts.size(); ++i) {
    const PageId head = AccountVictimList(i);
    if (links[head].next == head) continue;
    const radix_internal::Account& a = accounts[i];
    const unsigned __int128 lhs =
        static_cast<unsigned __int128>(a.cached) * best_weight;
    const unsigned __int128 rhs =
        static_cast<unsigned __int128>(best_cached) * a.limits.weight;
    if (best == kNoPage || lhs > rhs) {
      best = head;
      best_cached = a.cached;
      best_weight = a.limits.weight;
    }
  }
  return best;
}

template <bool kPlainLru>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool RadixTree::Impl::EvictFromList(
    PageId head, EvictedBlock* out) {
  // The hot path of eviction: no divisions, no repeated unique_ptr loads.
  Node* const nd = nodes.get();
  radix_internal::Link* const ln = links.get();
  const PageId p = ln[head].next;
  if (p == head) return false;
  Node& n = nd[p];
  const PageId next = ln[p].next;
  __builtin_prefetch(&nd[next]);  // the likely next victim
  ln[head].next = next;           // unlink the list head
  ln[next].prev = head;
  if (!kPlainLru && ABSL_PREDICT_FALSE(head >= class_sentinel) &&
      next == head) {
    // The class's list is empty now.
    const uint32_t c = (head - class_sentinel) % (kMaxPriority + 1);
    accounts[(head - class_sentinel) / (kMaxPriority + 1)].class_bits[c / 64] &=
        ~(uint64_t{1} << (c % 64));
  }
  index.erase(p);
  if (n.parent != kNoPage) --nd[n.parent].children;
  --namespaces[n.ns].cached_blocks;
  radix_internal::Account& a = kPlainLru ? accounts[0] : AccountOf(n.ns);
  if (!kPlainLru) probation_count -= n.probation;
  --a.cached;
  ++a.evicted;
  --cached_count;
  ++stats.evicted_pages;
  ++eviction_epoch;
  RememberEviction(n.key);
  if (out != nullptr) {
    *out = EvictedBlock{p, n.key, ParentKey(n), namespaces[n.ns].root, n.ns,
                        /*demote=*/!(n.probation && n.drop_below)};
  }
  if (listener != nullptr) {
    TreeEvent e;
    e.type = TreeEvent::Type::kRemoved;
    e.ns = n.ns;
    e.root = namespaces[n.ns].root;
    e.key = n.key;
    e.parent_key = ParentKey(n);
    e.page = p;
    pending_events.push_back(e);
  }
  PushFree(p);
  return true;
}

bool RadixTree::Impl::EvictFrom(PageId head, EvictedBlock* out) {
  return EvictFromList<false>(head, out);
}

uint64_t RadixTree::Impl::EvictMany(uint64_t max) {
  // Evictions pop the recency list in order, so a batch's victims are known
  // in advance. Two scouts run ahead of the head: the far one walks the
  // links and prefetches victims' nodes, the near one (whose nodes have
  // arrived by then) prefetches their index buckets. Only the walk over the
  // dense links array stays a chain of dependent loads.
  DecayIfDue(NowSeconds());
  if (accounts.size() != 1 || turn_duel != nullptr || prio != nullptr) {
    // Each victim may come from another list: no scouting.
    uint64_t n = 0;
    while (n < max && EvictOne()) ++n;
    return n;
  }
  constexpr uint64_t kNodeAhead = 16;
  constexpr uint64_t kBucketAhead = 8;
  const Node* const nd = nodes.get();
  const radix_internal::Link* const ln = links.get();
  PageId far = ln[sentinel].next, near = far;
  uint64_t far_n = 0, near_n = 0;  // list entries each scout has passed
  uint64_t n = 0;
  while (n < max) {
    while (far != sentinel && far_n < n + kNodeAhead && far_n < max) {
      __builtin_prefetch(&nd[far]);
      __builtin_prefetch(&ln[ln[far].next]);
      far = ln[far].next;
      ++far_n;
    }
    while (near != sentinel && near_n < n + kBucketAhead && near_n < far_n) {
      index.prefetch(nd[near].key);
      near = ln[near].next;
      ++near_n;
    }
    if (!EvictFromList<true>(sentinel, nullptr)) break;
    ++n;
  }
  return n;
}

void RadixTree::Impl::FlushEvents() {
  if (listener != nullptr && !pending_events.empty()) {
    listener->OnTreeEvents(pending_events);
  }
  pending_events.clear();
}

absl::Status RadixTree::Impl::ValidateRequest(
    const char* op, NamespaceId ns, absl::Span<const BlockKey> keys,
    absl::Span<const uint32_t> tokens) const {
  if (!LiveNamespace(ns)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": unknown namespace id ", ns, " (", namespaces.size(),
                     " registered)"));
  }
  if (keys.size() > 0xffffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": keys.size()=", keys.size(), " exceeds 2^32-1"));
  }
  const uint64_t want = uint64_t{keys.size()} * namespaces[ns].spec.page_size;
  if (!tokens.empty() && tokens.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": tokens.size()=", tokens.size(),
        " must be 0 (key mode) or keys.size()*page_size=", keys.size(), "*",
        namespaces[ns].spec.page_size, "=", want));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RadixTree>> RadixTree::Create(
    const RadixTreeOptions& options) {
  if (options.capacity_pages == 0 || options.capacity_pages >= kNoPage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity_pages=", options.capacity_pages, " must be in [1, ",
        kNoPage - 1, "]"));
  }
  if (options.max_page_size == 0) {
    return absl::InvalidArgumentError("max_page_size must be at least 1");
  }
  if (options.accounts == 0 || options.accounts > kMaxAccounts ||
      options.capacity_pages >= kNoPage - 2 * options.accounts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "accounts=", options.accounts, " must be in [1, ", kMaxAccounts,
        "] and capacity_pages + 2 accounts below ", kNoPage));
  }
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<RadixTree>(new RadixTree(std::move(impl)));
}

RadixTree::RadixTree(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RadixTree::~RadixTree() = default;

absl::StatusOr<NamespaceId> RadixTree::RegisterNamespace(
    const NamespaceSpec& spec, uint32_t account) {
  Impl& m = *impl_;
  if (account >= m.num_accounts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "account ", account, " is not below accounts=", m.num_accounts));
  }
  if (spec.page_size == 0 || spec.page_size > m.max_page_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace.page_size=", spec.page_size, " must be in [1, ",
        m.max_page_size, "] (max_page_size)"));
  }
  const BlockKey root = NamespaceRoot(spec);
  WriterMutexLock lock(&m.mu);
  if (auto it = m.ns_by_root.find(root); it != m.ns_by_root.end()) {
    if (!(m.namespaces[it->second].spec == spec)) {
      return absl::InternalError(absl::StrCat(
          "namespace root ", root.ToHex(), " is shared by two different specs"));
    }
    if (m.namespaces[it->second].account != account) {
      return absl::FailedPreconditionError(absl::StrCat(
          "namespace ", root.ToHex(), " belongs to account ",
          m.namespaces[it->second].account, ", not ", account));
    }
    return it->second;
  }
  if (m.arena_page_size == 0) {
    const size_t n = size_t{m.capacity} * spec.page_size;
    m.token_arena.reset(static_cast<uint32_t*>(radix_internal::AllocArena(
        n * sizeof(uint32_t), m.eager_token_arena_bytes)));
    if (m.token_arena == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve token storage for capacity_pages=", m.capacity,
          " * page_size=", spec.page_size, " tokens"));
    }
    m.arena_page_size = spec.page_size;
  } else if (spec.page_size != m.arena_page_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "namespace.page_size=", spec.page_size,
        " differs from the page_size=", m.arena_page_size,
        " this tree's token storage was sized for by its first namespace"));
  }
  NamespaceId id;
  if (!m.free_namespaces.empty()) {
    id = m.free_namespaces.back();
    m.free_namespaces.pop_back();
    m.namespaces[id] = Namespace{spec, root, 0, kNoPage, account};
  } else if (m.namespaces.size() >= kMaxNamespaces) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "RegisterNamespace: the tree holds ", kMaxNamespaces,
        " namespaces, the most it can"));
  } else {
    id = static_cast<NamespaceId>(m.namespaces.size());
    m.namespaces.push_back(Namespace{spec, root, 0, kNoPage, account});
  }
  m.ns_by_root.emplace(root, id);
  ++m.accounts[account].namespaces;
  return id;
}

std::vector<NamespaceId> RadixTree::ForgetEmptyNamespaces(
    absl::Span<const NamespaceId> candidates) {
  Impl& m = *impl_;
  std::vector<NamespaceId> out;
  WriterMutexLock lock(&m.mu);
  for (NamespaceId id : candidates) {
    if (!m.LiveNamespace(id)) continue;
    Namespace& n = m.namespaces[id];
    if (n.cached_blocks != 0 || n.leases != 0) continue;
    m.ns_by_root.erase(n.root);
    --m.accounts[n.account].namespaces;
    n = Namespace{};
    n.live = false;
    m.free_namespaces.push_back(id);
    out.push_back(id);
  }
  return out;
}

absl::Status RadixTree::SetAccountLimits(uint32_t account,
                                         const AccountLimits& limits) {
  Impl& m = *impl_;
  if (account >= m.num_accounts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "account ", account, " is not below accounts=", m.num_accounts));
  }
  if (limits.weight == 0) {
    return absl::InvalidArgumentError("AccountLimits.weight must be at least 1");
  }
  WriterMutexLock lock(&m.mu);
  m.accounts[account].limits = limits;
  return absl::OkStatus();
}

AccountStats RadixTree::GetAccountStats(uint32_t account) const {
  ReaderMutexLock lock(&impl_->mu);
  const radix_internal::Account& a = impl_->accounts[account];
  return AccountStats{a.cached,     a.writing, a.held,
                      a.namespaces, a.evicted, a.limited,
                      a.pins,       a.pin_pages};
}


BlockKey RadixTree::namespace_root(NamespaceId ns) const {
  ReaderMutexLock lock(&impl_->mu);
  return impl_->LiveNamespace(ns) ? impl_->namespaces[ns].root : BlockKey{};
}

uint32_t RadixTree::page_size(NamespaceId ns) const {
  ReaderMutexLock lock(&impl_->mu);
  return impl_->LiveNamespace(ns) ? impl_->namespaces[ns].spec.page_size : 0;
}

std::vector<NamespaceInfo> RadixTree::ListNamespaces() const {
  ReaderMutexLock lock(&impl_->mu);
  std::vector<NamespaceInfo> out;
  out.reserve(impl_->namespaces.size());
  for (size_t i = 0; i < impl_->namespaces.size(); ++i) {
    const Namespace& n = impl_->namespaces[i];
    if (!n.live) continue;
    out.push_back(NamespaceInfo{static_cast<NamespaceId>(i), n.spec, n.root,
                                n.cached_blocks});
  }
  return out;
}

uint64_t RadixTree::Evict(uint64_t max_pages) {
  Impl& m = *impl_;
  uint64_t total = 0;
  while (total < max_pages) {
    const uint64_t want = std::min(kAdminEvictionBatch, max_pages - total);
    uint64_t n;
    {
      WriterMutexLock lock(&m.mu);
      n = m.EvictMany(want);
      m.FlushEvents();
    }
    total += n;
    if (n < want) break;  // nothing unpinned is left
  }
  return total;
}

uint64_t RadixTree::Clear() {
  Impl& m = *impl_;
  uint64_t total = 0;
  uint64_t budget = 0;  // blocks cached when the Clear started
  for (bool first = true;; first = false) {
    WriterMutexLock lock(&m.mu);
    if (first) budget = m.cached_count;
    const uint64_t want = std::min(kAdminEvictionBatch, budget - total);
    const uint64_t n = m.EvictMany(want);
    total += n;
    const bool done = n < want || total >= budget;
    if (done && m.listener != nullptr) {
      TreeEvent e;
      e.type = TreeEvent::Type::kCleared;
      e.remaining = m.cached_count;
      m.pending_events.push_back(e);
    }
    m.FlushEvents();
    if (done) return total;
  }
}

}  // namespace radixkv
