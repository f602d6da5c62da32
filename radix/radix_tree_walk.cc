// File: radix/radix_tree_walk.cc
//
// RadixTree's lookups: token-mode key resolution (the token walk, then
// hashing with no lock held), the token-mode Match, and the key-mode match
// of a root path. Storage, invariants and the walk are described in
// radix_tree_internal.h.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "radix/radix_tree.h"
#include "radix/radix_tree_internal.h"

namespace radixkv {

using radix_internal::Namespace;
using radix_internal::Node;
using radix_internal::ResolvedPrompt;

namespace {

// The keys and pages of the token-mode prompt this thread is resolving
// (ResolvedPrompt views them), reused so that a warm thread allocates
// nothing per request. Bounded by the longest prompt the thread has seen.
struct Scratch {
  std::vector<BlockKey> keys;
  std::vector<PageId> pages;
};
Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

}  // namespace

absl::StatusOr<ResolvedPrompt> RadixTree::Impl::ResolveTokens(
    NamespaceId ns, absl::Span<const uint32_t> tokens,
    bool stop_at_missing) const {
  Scratch& s = ThreadScratch();
  s.keys.clear();
  s.pages.clear();
  ResolvedPrompt out;
  BlockKey root;
  uint32_t ps;
  {
    ReaderMutexLock lock(&mu);
    if (!LiveNamespace(ns)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown namespace id ", ns, " (", namespaces.size(),
          " registered)"));
    }
    root = namespaces[ns].root;
    ps = namespaces[ns].spec.page_size;
    out.known_epoch = eviction_epoch;
    out.walked_blocks =
        static_cast<uint32_t>(WalkTokens(ns, tokens, &s.keys, &s.pages));
  }
  out.total_blocks = static_cast<uint32_t>(tokens.size() / ps);
  absl::Span<const uint32_t> rest = tokens.subspan(size_t{out.walked_blocks} * ps);
  if (stop_at_missing && rest.size() >= ps) {
    // The block after the walk is hashed; the rest only if it is cached
    // (a branch point the walk did not take), since a lookup ends at the
    // first block no node has.
    AppendBlockKeys(s.keys.empty() ? root : s.keys.back(), ps, rest.first(ps),
                    &s.keys);
    bool cached;
    {
      ReaderMutexLock lock(&mu);
      cached = index.contains(s.keys.back());
    }
    rest = cached ? rest.subspan(ps) : absl::Span<const uint32_t>();
  }
  AppendBlockKeys(s.keys.empty() ? root : s.keys.back(), ps, rest, &s.keys);
  out.keys = s.keys;
  out.known_pages = s.pages;
  out.tokens = tokens.first(s.keys.size() * ps);
  out.chain_keys = true;
  return out;
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

size_t RadixTree::Impl::MatchPath(NamespaceId ns,
                                  absl::Span<const BlockKey> keys,
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
    if (p == kNoPage) break;
    const auto block = tokens.empty() ? absl::Span<const uint32_t>()
                                      : tokens.subspan(i * ps, ps);
    if (!Verifies(p, ns, parent, block)) {
      ++*collisions;
      break;
    }
    if (out != nullptr) out->push_back(p);
    parent = p;
  }
  return i;
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

absl::StatusOr<MatchResult> RadixTree::Match(
    NamespaceId ns, absl::Span<const BlockKey> keys,
    absl::Span<const uint32_t> tokens) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  if (keys.empty() && !tokens.empty()) {
    if (!m.LiveNamespace(ns)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Match: unknown namespace id ", ns, " (",
                       m.namespaces.size(), " registered)"));
    }
    m.matches.fetch_add(1, std::memory_order_relaxed);
    MatchResult r = m.MatchTokensLocked(ns, tokens);
    // A fully walked hit hashes nothing: skip that counter's atomic add.
    m.walked_blocks.fetch_add(r.walked_blocks, std::memory_order_relaxed);
    if (r.hashed_blocks != 0) {
      m.hashed_blocks.fetch_add(r.hashed_blocks, std::memory_order_relaxed);
    }
    return r;
  }
  if (absl::Status s = m.ValidateRequest("Match", ns, keys, tokens); !s.ok()) {
    return s;
  }
  m.matches.fetch_add(1, std::memory_order_relaxed);
  MatchResult r;
  r.total_blocks = static_cast<uint32_t>(keys.size());
  // Count-only (no page vector): the hot path of routers and probes.
  r.matched_blocks = static_cast<uint32_t>(
      m.MatchPath(ns, keys, tokens, {}, 0, nullptr, &r.collisions));
  return r;
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

size_t RadixTree::TEST_WalkTokens(NamespaceId ns,
                                  absl::Span<const uint32_t> tokens,
                                  std::vector<BlockKey>* keys,
                                  std::vector<PageId>* pages) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  if (!m.LiveNamespace(ns)) return 0;
  return m.WalkTokens(ns, tokens, keys, pages);
}

size_t RadixTree::TEST_TokenKeys(NamespaceId ns,
                                 absl::Span<const uint32_t> tokens,
                                 bool stop_at_missing,
                                 std::vector<BlockKey>* keys) const {
  absl::StatusOr<ResolvedPrompt> r =
      impl_->ResolveTokens(ns, tokens, stop_at_missing);
  keys->clear();
  if (!r.ok()) return 0;
  keys->assign(r->keys.begin(), r->keys.end());
  return r->walked_blocks;
}

uint64_t RadixTree::TEST_eviction_epoch() const {
  ReaderMutexLock lock(&impl_->mu);
  return impl_->eviction_epoch;
}

uint32_t RadixTree::TEST_MatchWalked(NamespaceId ns,
                                     absl::Span<const BlockKey> keys,
                                     absl::Span<const uint32_t> tokens,
                                     absl::Span<const PageId> known,
                                     uint64_t known_epoch) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  if (!m.ValidateRequest("Match", ns, keys, tokens).ok()) return 0;
  uint32_t collisions = 0;
  return static_cast<uint32_t>(
      m.MatchPath(ns, keys, tokens, known, known_epoch, nullptr, &collisions));
}

}  // namespace radixkv
