#include "daemon/tiers/tier_coordinator.h"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace radixkv::daemon {

TierCoordinator::TierCoordinator(std::shared_ptr<TierChain> chain,
                                 TierEventListener* events)
    : chain_(std::move(chain)), events_(events) {}

void TierCoordinator::Publish(absl::Span<const TierMove> moves,
                              const BlockKey& root) {
  if (!moves.empty() && events_ != nullptr) events_->OnTierMoves(moves, root);
}

uint32_t TierCoordinator::AfterAcquire(RadixTree* t, NamespaceId ns,
                                       uint32_t page_size, OwnerId owner,
                                       AcquireResult* r) {
  const bool held = r->lease != 0 && r->new_blocks != 0;
  const BlockKey root = t->namespace_root(ns);
  // Down first: the evicted blocks' pages are this lease's new pages, and
  // promotion below may overwrite them.
  std::vector<TierMove> moves;
  if (!r->evicted.empty()) {
    std::vector<EvictedPage> evicted;
    evicted.reserve(r->evicted.size());
    // Evicted blocks may be any namespace's: each keeps its own block size.
    NamespaceId size_of = ns;
    uint32_t block_size = page_size;
    uint64_t declined = 0;
    for (const EvictedBlock& e : r->evicted) {
      if (!e.demote) {
        // The eviction policy judged it not worth a tier's write: a plain
        // eviction.
        ++declined;
        continue;
      }
      if (e.ns != size_of) {
        size_of = e.ns;
        block_size = t->page_size(e.ns);
      }
      evicted.push_back({.block = {.key = e.key,
                                   .parent_key = e.parent_key,
                                   .root = e.root,
                                   .block_size = block_size},
                         .page = e.page,
                         .ns = e.ns});
    }
    if (declined != 0) {
      policy_dropped_.fetch_add(declined, std::memory_order_relaxed);
    }
    if (!evicted.empty()) chain_->Demote(evicted, &moves);
  }
  const size_t present =
      r->new_blocks == 0 ? 0
                         : chain_->CountPresent(r->new_keys, nullptr, &root);
  size_t got = 0;
  if (present != 0) {
    std::vector<uint64_t> pages(present);
    for (size_t i = 0; i < present; ++i) {
      pages[i] = r->pages[r->matched_blocks + i];
    }
    got = chain_->Promote(absl::MakeConstSpan(r->new_keys).first(present),
                          pages, &moves, &root);
  }
  // The copies are done: pages of a lease that ended meanwhile go free.
  if (held) t->ReleaseHold(r->lease);
  Publish(moves, root);
  if (got == 0) return 0;
  // The bytes are in place: commit those blocks as the lease's own, so
  // they are cached and pinned like the matched prefix.
  absl::StatusOr<CommitResult> c =
      t->Commit(r->lease, static_cast<uint32_t>(got), /*release=*/false, owner);
  if (!c.ok()) {
    // The lease ended meanwhile (expired, session gone): the worker learns
    // that on its own Commit; the pages stay the lease's new pages.
    Log(LogLevel::kWarning, absl::StrCat("tier: promoted blocks of lease ",
                                         r->lease, " not committed: ",
                                         c.status().ToString()));
    return 0;
  }
  for (size_t i = 0; i < got; ++i) {
    // A duplicate's canonical page.
    r->pages[r->matched_blocks + i] = c->pages[i];
  }
  r->matched_blocks += static_cast<uint32_t>(got);
  r->new_blocks -= static_cast<uint32_t>(got);
  promoted_tokens_.fetch_add(got * page_size, std::memory_order_relaxed);
  return static_cast<uint32_t>(got);
}

void TierCoordinator::AfterCommit(RadixTree* t, NamespaceId ns,
                                  absl::Span<const BlockKey> keys) {
  if (keys.empty()) return;
  std::vector<TierMove> moves;
  if (chain_->Forget(keys, &moves) == 0) return;
  Publish(moves, t->namespace_root(ns));
}

size_t TierCoordinator::WriteThrough(RadixTree* t, NamespaceId ns,
                                     uint32_t page_size, const CommitResult& r,
                                     absl::FunctionRef<bool()> still_held) {
  if (r.inserted_keys.empty()) return 0;
  const BlockKey root = t->namespace_root(ns);
  std::vector<EvictedPage> blocks;
  blocks.reserve(r.inserted_keys.size());
  for (size_t i = 0; i < r.inserted_keys.size(); ++i) {
    blocks.push_back({.block = {.key = r.inserted_keys[i],
                                .root = root,
                                .block_size = page_size},
                      .page = r.inserted_pages[i],
                      .ns = ns});
  }
  return chain_->WriteThrough(blocks, still_held);
}

TierCoordinator::TierMatch TierCoordinator::AfterMatch(
    const BlockKey& root, absl::Span<const BlockKey> keys,
    uint32_t matched) const {
  std::array<size_t, kMediumCount> by_medium{};
  TierMatch out;
  out.blocks = matched >= keys.size()
                   ? 0
                   : static_cast<uint32_t>(chain_->CountPresent(
                         keys.subspan(matched), &by_medium, &root));
  out.per_tier.reserve(chain_->size());
  for (size_t i = 0; i < chain_->size(); ++i) {
    const Tier& tier = chain_->tier(i);
    out.per_tier.emplace_back(tier.name(),
                              static_cast<uint32_t>(by_medium[tier.medium()]));
  }
  return out;
}

TierChain::DrainResult TierCoordinator::Drain(const RadixTree* t,
                                              absl::Time deadline) {
  std::vector<NodeInfo> nodes;
  if (t != nullptr) {
    const PageId capacity = t->capacity();
    for (PageId start = 0; start < capacity;) {
      PageId next = capacity;
      std::vector<NodeInfo> part =
          t->DumpTreePage(std::numeric_limits<uint32_t>::max(), start,
                          RadixTree::kDumpScanPages, /*with_tokens=*/false,
                          &next);
      for (NodeInfo& n : part) nodes.push_back(std::move(n));
      if (next <= start) break;
      start = next;
    }
  }
  // Most recently used first; of equal age, parents before children (a
  // child is found only behind its parent).
  std::stable_sort(nodes.begin(), nodes.end(),
                   [](const NodeInfo& a, const NodeInfo& b) {
                     if (a.age_seconds != b.age_seconds) {
                       return a.age_seconds < b.age_seconds;
                     }
                     return a.depth < b.depth;
                   });
  std::vector<EvictedPage> pool;
  pool.reserve(nodes.size());
  for (const NodeInfo& n : nodes) {
    pool.push_back({.block = {.key = n.key,
                              .parent_key = n.parent_key,
                              .root = t->namespace_root(n.ns),
                              .depth = n.depth,
                              .block_size = t->page_size(n.ns)},
                    .page = n.page,
                    .ns = n.ns});
  }
  return chain_->Drain(pool, deadline);
}

std::vector<TierCoordinator::TierReport> TierCoordinator::Report() const {
  std::vector<TierReport> out;
  out.reserve(chain_->size());
  for (size_t i = 0; i < chain_->size(); ++i) {
    const Tier& tier = chain_->tier(i);
    out.push_back(TierReport{tier.name(), tier.page_bytes(), tier.stats(),
                             &chain_->promotion_latency(i)});
  }
  return out;
}

}  // namespace radixkv::daemon
