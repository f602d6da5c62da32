// File: radix/radix_tree.cc
//
// RadixTree's mutating operations: namespaces, Acquire, Commit, Release,
// eviction. The storage layout and the invariants are described in
// radix_tree_internal.h; the read-only inspection API lives in
// radix_tree_inspect.cc.
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

namespace radixkv {

using radix_internal::Lease;
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
  // Fault every page in now rather than at first use, which happens under
  // the tree's exclusive lock: a first touch of a huge page zeroes 2 MB
  // and, where the kernel compacts memory on demand, compacts first
  // (2-4.5 ms per 2 MB on a 2-core VM). The node and link arrays are
  // initialised here anyway; this adds the key index's slots.
  for (size_t off = 0; off < rounded; off += 4096) {
    static_cast<volatile char*>(p)[off] = 0;
  }
  return p;
}

void* AllocArena(size_t bytes, size_t eager_bytes) {
  // Faulting the arena in up front costs ~50 ms per GB where the kernel
  // only has to zero memory, but up to ~2 s per GB on a VM whose host backs
  // guest memory on first touch (measured); a bigger arena than
  // `eager_bytes` (an index-only pool of long pages) is left to the OS,
  // 4 KiB at a time, without a huge-page request: huge pages faulted on
  // demand would stall the exclusive lock for up to milliseconds each.
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

// n default-constructed Ts in AllocLarge memory.
template <typename T>
T* NewLargeArray(size_t n) {
  void* mem = radix_internal::AllocLarge(n * sizeof(T));
  if (mem == nullptr) throw std::bad_alloc();
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
      listener(o.listener),
      epoch(absl::Now()),
      sentinel(o.capacity_pages),
      nodes(NewLargeArray<Node>(size_t{o.capacity_pages} + 1)),
      links(NewLargeArray<radix_internal::Link>(size_t{o.capacity_pages} + 1)),
      index(0, PageHash{nodes.get()}, PageEq{nodes.get()}) {
  WriterMutexLock lock(&mu);
  // The index never holds more than `capacity` keys. Sizing it now means it
  // never grows, and growing rehashes every key under the exclusive lock
  // (each rehash reads the key from its node: ~60 ms at 1 M blocks). Room
  // for half as many again keeps a full tree's table at most ~58 % loaded:
  // erasing from a fuller one leaves tombstones, and clearing them is an
  // in-place rehash of the whole table (1-4 ms at 100k blocks, where the
  // exact size would be 76 % loaded). At 1 M blocks the table is the same
  // size either way.
  index.reserve(size_t{capacity} + capacity / 2);
  for (PageId p = 0; p < capacity; ++p) {
    links[p].next = p + 1 < capacity ? p + 1 : kNoPage;
  }
  free_head = capacity > 0 ? 0 : kNoPage;
  free_count = capacity;
  links[sentinel].prev = sentinel;
  links[sentinel].next = sentinel;
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

bool RadixTree::Impl::EvictOne() {
  // The hot path of eviction: no divisions, no repeated unique_ptr loads.
  Node* const nd = nodes.get();
  radix_internal::Link* const ln = links.get();
  const PageId p = ln[sentinel].next;
  if (p == sentinel) return false;
  Node& n = nd[p];
  const PageId next = ln[p].next;
  __builtin_prefetch(&nd[next]);  // the likely next victim
  ln[sentinel].next = next;       // unlink the list head
  ln[next].prev = sentinel;
  index.erase(p);
  if (n.parent != kNoPage) --nd[n.parent].children;
  --namespaces[n.ns].cached_blocks;
  --cached_count;
  ++stats.evicted_pages;
  ++eviction_epoch;
  RememberEviction(n.key);
  if (listener != nullptr) {
    TreeEvent e;
    e.type = TreeEvent::Type::kRemoved;
    e.ns = n.ns;
    e.key = n.key;
    e.parent_key = ParentKey(n);
    e.page = p;
    pending_events.push_back(e);
  }
  PushFree(p);
  return true;
}

uint64_t RadixTree::Impl::EvictMany(uint64_t max) {
  // Evictions pop the recency list in order, so a batch's victims are known
  // in advance. Two scouts run ahead of the head: the far one walks the
  // links and prefetches victims' nodes, the near one (whose nodes have
  // arrived by then) prefetches their index buckets. Only the walk over the
  // dense links array stays a chain of dependent loads.
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
    if (!EvictOne()) break;
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
  if (ns >= namespaces.size()) {
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

size_t RadixTree::Impl::KnownPrefix(NamespaceId ns,
                                   absl::Span<const BlockKey> keys,
                                   absl::Span<const PageId> known,
                                   uint64_t known_epoch, PageId* parent,
                                   std::vector<PageId>* out) const {
  // Nothing evicted since the walk: every walked page is still the cached,
  // chain-keyed child of the one before it. The ends are re-checked so that
  // pages from another walk (a caller's mistake) fall through to the loop.
  if (known_epoch == eviction_epoch && !known.empty() &&
      known.size() <= keys.size() && *parent == kNoPage) {
    const PageId first = known.front(), last = known.back();
    if (first < capacity && last < capacity &&
        IsChainChild(nodes[first], ns, kNoPage) && nodes[first].key == keys[0] &&
        nodes[last].state == PageState::kCached && nodes[last].ns == ns &&
        nodes[last].key == keys[known.size() - 1]) {
      if (out != nullptr) out->insert(out->end(), known.begin(), known.end());
      *parent = last;
      return known.size();
    }
  }
  // A node that is still the cached, chain-keyed child of `parent` with
  // this key holds these tokens (its key is their hash): no lookup and no
  // token comparison needed.
  size_t i = 0;
  for (; i < known.size() && i < keys.size(); ++i) {
    const PageId p = known[i];
    if (p >= capacity) break;
    const Node& n = nodes[p];
    if (!IsChainChild(n, ns, *parent) || !(n.key == keys[i])) break;
    if (out != nullptr) out->push_back(p);
    *parent = p;
  }
  return i;
}

void RadixTree::Impl::MatchPath(NamespaceId ns, absl::Span<const BlockKey> keys,
                                absl::Span<const uint32_t> tokens,
                                absl::Span<const PageId> known,
                                uint64_t known_epoch,
                                std::vector<PageId>* out,
                                uint32_t* collisions) const {
  const size_t ps = namespaces[ns].spec.page_size;
  PageId parent = kNoPage;
  size_t i = KnownPrefix(ns, keys, known, known_epoch, &parent, out);
  for (; i < keys.size(); ++i) {
    const PageId p = FindByKey(ns, parent, keys[i]);
    if (p == kNoPage) return;
    const auto block = tokens.empty() ? absl::Span<const uint32_t>()
                                      : tokens.subspan(i * ps, ps);
    if (!Verifies(p, ns, parent, block)) {
      ++*collisions;
      return;
    }
    out->push_back(p);
    parent = p;
  }
}

size_t RadixTree::PrefixKeysByTokens(NamespaceId ns,
                                     absl::Span<const uint32_t> tokens,
                                     std::vector<BlockKey>* keys,
                                     std::vector<PageId>* pages,
                                     uint64_t* epoch) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  if (epoch != nullptr) *epoch = m.eviction_epoch;
  if (ns >= m.namespaces.size()) return 0;
  return m.WalkTokens(ns, tokens, keys, pages);
}

size_t RadixTree::Impl::WalkTokens(NamespaceId ns,
                                   absl::Span<const uint32_t> tokens,
                                   std::vector<BlockKey>* keys,
                                   std::vector<PageId>* pages) const {
  const size_t bytes = namespaces[ns].spec.page_size * sizeof(uint32_t);
  if (UsesWideWalk(bytes)) {
    return bytes == 64 ? WalkTokensWide<64>(ns, tokens, keys, pages)
                       : WalkTokensWide<128>(ns, tokens, keys, pages);
  }
  return bytes == 64 ? WalkTokensFor<64, false>(ns, tokens, keys, pages)
                     : WalkTokensFor<0, false>(ns, tokens, keys, pages);
}

template <size_t kBytes, bool kWide>
inline size_t RadixTree::Impl::WalkTokensFor(
    NamespaceId ns, absl::Span<const uint32_t> tokens,
    std::vector<BlockKey>* keys, std::vector<PageId>* pages) const {
  PageId parent = kNoPage;
  PageId next = namespaces[ns].hot_root;
  return WalkHot<kBytes, kWide>(ns, tokens.data(),
                                tokens.size() / namespaces[ns].spec.page_size,
                                &parent, &next, [&](PageId p, const Node& n) {
                                  keys->push_back(n.key);
                                  if (pages != nullptr) pages->push_back(p);
                                });
}

template <size_t kBytes>
size_t RadixTree::Impl::WalkTokensWide(NamespaceId ns,
                                       absl::Span<const uint32_t> tokens,
                                       std::vector<BlockKey>* keys,
                                       std::vector<PageId>* pages) const {
#if RADIXKV_WIDE_WALK
  return WalkTokensFor<kBytes, true>(ns, tokens, keys, pages);
#else
  return WalkTokensFor<0, false>(ns, tokens, keys, pages);  // never called
#endif
}

bool RadixTree::ContainsKey(const BlockKey& key) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  return m.index.contains(key);
}

size_t RadixTree::ResolveTokenKeys(NamespaceId ns,
                                   absl::Span<const uint32_t> tokens,
                                   bool stop_at_missing,
                                   std::vector<BlockKey>* keys,
                                   std::vector<PageId>* pages,
                                   uint64_t* epoch) const {
  keys->clear();
  pages->clear();
  const Impl& m = *impl_;
  BlockKey root;
  uint32_t ps;
  size_t known;
  {
    ReaderMutexLock lock(&m.mu);
    if (epoch != nullptr) *epoch = m.eviction_epoch;
    root = m.namespaces[ns].root;
    ps = m.namespaces[ns].spec.page_size;
    known = m.WalkTokens(ns, tokens, keys, pages);
  }
  absl::Span<const uint32_t> rest = tokens.subspan(known * ps);
  if (stop_at_missing && rest.size() >= ps) {
    AppendBlockKeys(keys->empty() ? root : keys->back(), ps, rest.first(ps),
                    keys);
    rest = ContainsKey(keys->back()) ? rest.subspan(ps)
                                     : absl::Span<const uint32_t>();
  }
  AppendBlockKeys(keys->empty() ? root : keys->back(), ps, rest, keys);
  return known;
}

void RadixTree::Impl::EndLease(Lease& lease) {
  const uint32_t now = NowSeconds();
  for (PageId p : lease.writing) {
    if (nodes[p].state == PageState::kWriting) {
      --writing_count;
      PushFree(p);
    }
  }
  // Deepest first, so each node lands in the recency list after its children.
  for (auto it = lease.path.rbegin(); it != lease.path.rend(); ++it) {
    Unpin(*it, now);
  }
}

RadixTree::RadixTree(const RadixTreeOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}

RadixTree::~RadixTree() = default;

absl::StatusOr<NamespaceId> RadixTree::RegisterNamespace(
    const NamespaceSpec& spec) {
  Impl& m = *impl_;
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
  if (m.namespaces.size() >= kMaxNamespaces) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "RegisterNamespace: the tree holds ", kMaxNamespaces,
        " namespaces, the most it can"));
  }
  const auto id = static_cast<NamespaceId>(m.namespaces.size());
  m.namespaces.push_back(Namespace{spec, root, 0, kNoPage});
  m.ns_by_root.emplace(root, id);
  return id;
}

BlockKey RadixTree::namespace_root(NamespaceId ns) const {
  ReaderMutexLock lock(&impl_->mu);
  return ns < impl_->namespaces.size() ? impl_->namespaces[ns].root
                                       : BlockKey{};
}

uint32_t RadixTree::page_size(NamespaceId ns) const {
  ReaderMutexLock lock(&impl_->mu);
  return ns < impl_->namespaces.size() ? impl_->namespaces[ns].spec.page_size
                                       : 0;
}

std::vector<NamespaceInfo> RadixTree::ListNamespaces() const {
  ReaderMutexLock lock(&impl_->mu);
  std::vector<NamespaceInfo> out;
  out.reserve(impl_->namespaces.size());
  for (size_t i = 0; i < impl_->namespaces.size(); ++i) {
    const Namespace& n = impl_->namespaces[i];
    out.push_back(NamespaceInfo{static_cast<NamespaceId>(i), n.spec, n.root,
                                n.cached_blocks});
  }
  return out;
}

absl::StatusOr<MatchResult> RadixTree::Match(
    NamespaceId ns, absl::Span<const BlockKey> keys,
    absl::Span<const uint32_t> tokens,
    absl::Span<const PageId> known_pages, uint64_t known_epoch) const {
  Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  if (absl::Status s = m.ValidateRequest("Match", ns, keys, tokens); !s.ok()) {
    return s;
  }
  m.matches.fetch_add(1, std::memory_order_relaxed);
  MatchResult r;
  r.total_blocks = static_cast<uint32_t>(keys.size());
  // Count-only walk (no vector): the hot path of routers and probes.
  const size_t ps = m.namespaces[ns].spec.page_size;
  PageId parent = kNoPage;
  size_t i = m.KnownPrefix(ns, keys, known_pages, known_epoch, &parent, nullptr);
  r.matched_blocks = static_cast<uint32_t>(i);
  for (; i < keys.size(); ++i) {
    const PageId p = m.FindByKey(ns, parent, keys[i]);
    if (p == kNoPage) break;
    const auto block = tokens.empty() ? absl::Span<const uint32_t>()
                                      : tokens.subspan(i * ps, ps);
    if (!m.Verifies(p, ns, parent, block)) {
      ++r.collisions;
      break;
    }
    parent = p;
    ++r.matched_blocks;
  }
  return r;
}

absl::StatusOr<MatchResult> RadixTree::MatchTokens(
    NamespaceId ns, absl::Span<const uint32_t> tokens) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  if (ns >= m.namespaces.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Match: unknown namespace id ", ns, " (",
                     m.namespaces.size(), " registered)"));
  }
  m.matches.fetch_add(1, std::memory_order_relaxed);
  return m.MatchTokensLocked(ns, tokens);
}

MatchResult RadixTree::Impl::MatchTokensLocked(
    NamespaceId ns, absl::Span<const uint32_t> tokens) const {
  const size_t bytes = namespaces[ns].spec.page_size * sizeof(uint32_t);
  if (UsesWideWalk(bytes)) {
    return bytes == 64 ? MatchTokensWide<64>(ns, tokens)
                       : MatchTokensWide<128>(ns, tokens);
  }
  return bytes == 64 ? MatchTokensFor<64, false>(ns, tokens)
                     : MatchTokensFor<0, false>(ns, tokens);
}

template <size_t kBytes>
MatchResult RadixTree::Impl::MatchTokensWide(
    NamespaceId ns, absl::Span<const uint32_t> tokens) const {
#if RADIXKV_WIDE_WALK
  return MatchTokensFor<kBytes, true>(ns, tokens);
#else
  return MatchTokensFor<0, false>(ns, tokens);  // never called
#endif
}

template <size_t kBytes, bool kWide>
inline MatchResult RadixTree::Impl::MatchTokensFor(
    NamespaceId ns, absl::Span<const uint32_t> tokens) const {
  const Namespace& space = namespaces[ns];
  const size_t ps = space.spec.page_size;
  const size_t blocks = tokens.size() / ps;
  MatchResult r;
  r.total_blocks = static_cast<uint32_t>(blocks);
  PageId parent = kNoPage;
  PageId next = space.hot_root;
  size_t i = 0;
  while (true) {
    const size_t walked =
        WalkHot<kBytes, kWide>(ns, tokens.data() + i * ps, blocks - i,
                               &parent, &next, [](PageId, const Node&) {});
    i += walked;
    r.walked_blocks += static_cast<uint32_t>(walked);
    if (i == blocks) break;
    // A branch point (or the end of the match): hash this block only.
    ++r.hashed_blocks;
    const absl::Span<const uint32_t> block(tokens.data() + i * ps, ps);
    const BlockKey key = ChainBlockKey(
        parent == kNoPage ? space.root : nodes[parent].key, block);
    const PageId p = FindByKey(ns, parent, key);
    if (p == kNoPage) break;
    if (!Verifies(p, ns, parent, block)) {
      ++r.collisions;
      break;
    }
    parent = p;
    next = nodes[p].hot_child;
    ++i;
  }
  r.matched_blocks = static_cast<uint32_t>(i);
  return r;
}

absl::StatusOr<AcquireResult> RadixTree::Acquire(const AcquireRequest& req) {
  Impl& m = *impl_;
  WriterMutexLock lock(&m.mu);
  if (absl::Status s = m.ValidateRequest("Acquire", req.ns, req.keys,
                                         req.tokens);
      !s.ok()) {
    return s;
  }
  const uint32_t ps = m.namespaces[req.ns].spec.page_size;
  const uint32_t now = m.NowSeconds();
  if (req.prompt_blocks != 0 &&
      (req.prompt_blocks < req.keys.size() || req.allocate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Acquire: prompt_blocks=", req.prompt_blocks,
        " must be 0 or, without allocate, at least keys.size()=",
        req.keys.size()));
  }
  // Checked whole before anything changes; ending one twice would unpin
  // its pages twice.
  absl::flat_hash_set<LeaseId> seen;
  for (size_t i = 0; i < req.end_leases.size(); ++i) {
    const LeaseId id = req.end_leases[i];
    if (!m.leases.contains(id)) {
      return absl::NotFoundError(absl::StrCat(
          "Acquire: end_leases[", i, "]: lease_id=", id,
          " is unknown or ended"));
    }
    if (req.end_leases.size() > 1 && !seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Acquire: end_leases: lease_id=", id, " is listed twice"));
    }
  }
  AcquireResult r;
  r.total_blocks = req.prompt_blocks != 0
                       ? req.prompt_blocks
                       : static_cast<uint32_t>(req.keys.size());
  r.pages.reserve(req.keys.size());
  m.MatchPath(req.ns, req.keys, req.tokens, req.known_pages, req.known_epoch,
              &r.pages, &r.collisions);
  r.matched_blocks = static_cast<uint32_t>(r.pages.size());

  m.stats.lookups++;
  m.stats.lookup_blocks += r.total_blocks;
  m.stats.hit_blocks += r.matched_blocks;
  m.stats.lookup_tokens += uint64_t{r.total_blocks} * ps;
  m.stats.hit_tokens += uint64_t{r.matched_blocks} * ps;
  m.stats.hash_collisions += r.collisions;

  // Pin the matched path before evicting, so eviction cannot take it.
  PageId parent = kNoPage;
  for (PageId p : r.pages) {
    m.Pin(p, now);
    m.SetHotChild(req.ns, parent, p);
    parent = p;
  }
  // Then end the leases the caller is done with: pages this Acquire just
  // pinned only lose a reference; the rest become evictable (or free).
  for (LeaseId id : req.end_leases) {
    auto it = m.leases.find(id);
    m.EndLease(it->second);
    m.leases.erase(it);
  }

  uint32_t want = 0;
  if (req.allocate) {
    want = r.total_blocks - r.matched_blocks;
    if (req.max_new_blocks != 0) want = std::min(want, req.max_new_blocks);
  }
  Lease lease;
  lease.ns = req.ns;
  lease.has_tokens = !req.tokens.empty();
  lease.chain_keyed = lease.has_tokens && req.chain_keys;
  for (uint32_t k = 0; k < want; ++k) {
    if (m.free_head == kNoPage) {
      if (!m.EvictOne()) break;
      ++r.evicted_pages;
    }
    const PageId p = m.PopFree();
    m.nodes[p].state = PageState::kWriting;
    ++m.writing_count;
    const size_t block = size_t{r.matched_blocks} + k;
    if (lease.has_tokens) {
      std::memcpy(m.MutableTokensOf(p), req.tokens.data() + block * ps,
                  size_t{ps} * sizeof(uint32_t));
    }
    lease.writing.push_back(p);
    lease.keys.push_back(req.keys[block]);
    r.pages.push_back(p);
  }
  r.new_blocks = static_cast<uint32_t>(lease.writing.size());
  if (!r.pages.empty()) {
    lease.path.assign(r.pages.begin(), r.pages.begin() + r.matched_blocks);
    lease.matched = r.matched_blocks;
    r.lease = m.next_lease++;
    m.leases.emplace(r.lease, std::move(lease));
  }
  m.FlushEvents();
  return r;
}

absl::StatusOr<CommitResult> RadixTree::Commit(LeaseId lease_id,
                                               uint32_t blocks, bool release) {
  Impl& m = *impl_;
  WriterMutexLock lock(&m.mu);
  auto it = m.leases.find(lease_id);
  if (it == m.leases.end()) {
    return absl::NotFoundError(
        absl::StrCat("Commit: lease_id=", lease_id, " is unknown or ended"));
  }
  Lease& lease = it->second;
  const uint32_t uncommitted =
      static_cast<uint32_t>(lease.writing.size()) - lease.committed;
  if (blocks > uncommitted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Commit: blocks=", blocks, " exceeds the lease's ", uncommitted,
        " uncommitted new pages"));
  }
  const uint32_t now = m.NowSeconds();
  const uint32_t ps = m.arena_page_size;
  CommitResult r;
  for (uint32_t j = lease.committed; j < lease.committed + blocks; ++j) {
    const PageId w = lease.writing[j];
    if (lease.broken) {
      ++r.collided;
      r.pages.push_back(w);
      continue;
    }
    const BlockKey& key = lease.keys[j];
    const PageId parent = lease.path.empty() ? kNoPage : lease.path.back();
    if (auto hit = m.index.find(key); hit != m.index.end()) {
      const PageId c = *hit;
      const Node& cn = m.nodes[c];
      const bool same =
          cn.ns == lease.ns && cn.parent == parent &&
          (!lease.has_tokens || !cn.has_tokens ||
           std::memcmp(m.TokensOf(c), m.TokensOf(w), ps * sizeof(uint32_t)) ==
               0);
      if (same) {
        m.Pin(c, now);
        m.SetHotChild(lease.ns, parent, c);
        lease.path.push_back(c);
        ++r.deduplicated;
        r.pages.push_back(c);
      } else {
        lease.broken = true;
        ++r.collided;
        ++m.stats.hash_collisions;
        r.pages.push_back(w);
      }
      continue;
    }
    Node& n = m.nodes[w];
    n.key = key;
    n.parent = parent;
    n.refs = 1;
    n.children = 0;
    n.last_used = now;
    n.ns = lease.ns;
    n.state = PageState::kCached;
    n.has_tokens = lease.has_tokens;
    n.chain_keyed = lease.chain_keyed;
    n.hot_child = kNoPage;
    m.SetHotChild(lease.ns, parent, w);
    m.index.insert(w);
    if (parent != kNoPage) ++m.nodes[parent].children;
    ++m.namespaces[lease.ns].cached_blocks;
    --m.writing_count;
    ++m.cached_count;
    ++m.pinned_count;
    lease.path.push_back(w);
    ++r.inserted;
    r.pages.push_back(w);
    if (m.listener != nullptr) {
      TreeEvent e;
      e.type = TreeEvent::Type::kStored;
      e.ns = lease.ns;
      e.key = key;
      e.parent_key = m.ParentKey(n);
      e.page = w;
      e.depth = lease.matched + j;
      m.pending_events.push_back(e);
    }
  }
  lease.committed += blocks;
  m.stats.inserted_blocks += r.inserted;
  m.stats.deduplicated_blocks += r.deduplicated;
  if (release) {
    m.EndLease(lease);
    m.leases.erase(it);
    r.released = true;
  }
  m.FlushEvents();
  return r;
}

absl::Status RadixTree::Release(LeaseId lease_id) {
  Impl& m = *impl_;
  WriterMutexLock lock(&m.mu);
  auto it = m.leases.find(lease_id);
  if (it == m.leases.end()) {
    return absl::NotFoundError(
        absl::StrCat("Release: lease_id=", lease_id, " is unknown or ended"));
  }
  m.EndLease(it->second);
  m.leases.erase(it);
  return absl::OkStatus();
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
      m.pending_events.push_back(e);
    }
    m.FlushEvents();
    if (done) return total;
  }
}

}  // namespace radixkv
