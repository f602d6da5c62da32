// Cache's side of the tier below the pool (--tier, docs/TIERS.md): moving
// evicted blocks down and matched ones up around the tree's Acquire, and
// the tier's stats.
#include <vector>

#include "absl/time/clock.h"
#include "daemon/cache.h"
#include "daemon/log.h"

namespace radixkv::daemon {

void TierLatency::Add(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(d)),
                    std::memory_order_relaxed);
}

void TierLatency::Fill(v1::TierStats* out) const {
  for (double b : kBounds) out->add_promotion_seconds_bounds(b);
  for (const auto& c : counts_) {
    out->add_promotion_seconds_counts(c.load(std::memory_order_relaxed));
  }
  out->set_promotion_seconds_sum(
      static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9);
}

namespace {

// A block's move into (kStored) or out of (kRemoved) the tier, as the
// tree's listeners take it.
TreeEvent TierEvent(TreeEvent::Type type, NamespaceId ns, const BlockKey& root,
                    const BlockKey& key, const BlockKey& parent_key,
                    uint32_t block_size) {
  TreeEvent e;
  e.type = type;
  e.ns = ns;
  e.root = root;
  e.key = key;
  e.parent_key = parent_key;
  e.depth = parent_key == root ? 0 : 1;  // only "first block or not" matters
  e.block_size = block_size;
  e.medium = 1;
  return e;
}

}  // namespace

void Cache::MoveBetweenTiers(const SessionRef& session, AcquireResult* r) {
  DiskTier& tier = *options_.tier;
  const gpu::PagePool* pool = registry_.pool();
  RadixTree* t = registry_.tree();
  // Down first: the evicted blocks' pages are this lease's new pages, and
  // promotion below may overwrite them. Each move is reported as a tier
  // event (KV events: medium DISK; WatchEvents reports the pool only).
  std::vector<TreeEvent> moves;
  std::vector<TierBlock> forgotten;
  for (const EvictedBlock& e : r->evicted) {
    forgotten.clear();
    if (tier.Put({.key = e.key, .parent_key = e.parent_key, .root = e.root},
                 pool->host_page_address(e.page), &forgotten)) {
      for (const TierBlock& f : forgotten) {
        // The tier made room: that block is gone. A removal names the
        // block by key and root; its namespace id is not needed.
        moves.push_back(TierEvent(TreeEvent::Type::kRemoved, 0, f.root, f.key,
                                  f.parent_key, 0));
      }
      moves.push_back(TierEvent(TreeEvent::Type::kStored, e.ns, e.root, e.key,
                                e.parent_key, session.binding.page_size));
    }
  }
  const size_t present =
      r->new_blocks == 0 ? 0 : tier.CountPresent(r->new_keys);
  if (present == 0) {
    if (!moves.empty()) events_.OnTreeEvents(moves);
    return;
  }
  const absl::Time start = absl::Now();
  std::vector<void*> dst(present);
  for (size_t i = 0; i < present; ++i) {
    dst[i] = pool->host_page_address(r->pages[r->matched_blocks + i]);
  }
  const size_t got = tier.Take(
      absl::MakeConstSpan(r->new_keys).first(present), dst);
  const BlockKey root = t->namespace_root(session.binding.ns);
  for (size_t i = 0; i < got; ++i) {
    moves.push_back(TierEvent(TreeEvent::Type::kRemoved, session.binding.ns,
                              root, r->new_keys[i], BlockKey{}, 0));
  }
  if (!moves.empty()) events_.OnTreeEvents(moves);
  if (got == 0) return;
  // The bytes are in place: commit those blocks as the lease's own, so
  // they are cached and pinned like the matched prefix.
  absl::StatusOr<CommitResult> c =
      t->Commit(r->lease, static_cast<uint32_t>(got), /*release=*/false,
                session.owner);
  if (!c.ok()) {
    // The lease ended meanwhile (expired, session gone): the worker learns
    // that on its own Commit; the pages stay the lease's new pages.
    Log(LogLevel::kWarning, absl::StrCat("tier: promoted blocks of lease ",
                                         r->lease, " not committed: ",
                                         c.status().ToString()));
    return;
  }
  for (size_t i = 0; i < got; ++i) {
    r->pages[r->matched_blocks + i] = c->pages[i];  // a duplicate's canonical page
  }
  r->matched_blocks += static_cast<uint32_t>(got);
  promoted_tokens_.fetch_add(got * session.binding.page_size,
                             std::memory_order_relaxed);
  r->new_blocks -= static_cast<uint32_t>(got);
  promotion_latency_.Add(absl::Now() - start);
}

uint32_t Cache::TierMatched(const BlockKey& root, uint32_t page_size,
                            const Prompt& p, uint32_t matched) const {
  std::vector<BlockKey> computed;
  absl::Span<const BlockKey> keys = p.keys;
  if (!p.key_mode) {
    computed = ComputeBlockKeys(root, page_size, p.tokens);
    keys = computed;
  }
  if (matched >= keys.size()) return 0;
  return static_cast<uint32_t>(
      options_.tier->CountPresent(keys.subspan(matched)));
}

void Cache::FillTierStats(v1::Stats* s) const {
  if (options_.tier == nullptr) return;
  const DiskTierStats d = options_.tier->stats();
  v1::TierStats* out = s->mutable_tier();
  out->set_kind("disk");
  out->set_capacity_blocks(d.slots);
  out->set_blocks(d.used);
  out->set_pending_blocks(d.pending);
  out->set_demoted_blocks(d.demotions);
  out->set_promoted_blocks(d.promotions);
  out->set_dropped_full(d.dropped_full);
  out->set_dropped_error(d.dropped_error);
  out->set_checksum_failures(d.checksum_failures);
  out->set_bytes_written(d.bytes_written);
  out->set_bytes_read(d.bytes_read);
  out->set_reloaded_blocks(d.reloaded);
  out->set_forgotten_blocks(d.evictions);
  promotion_latency_.Fill(out);
  // A promoted block is a hit for the worker that asked.
  s->set_hit_tokens(s->hit_tokens() +
                    promoted_tokens_.load(std::memory_order_relaxed));
}

}  // namespace radixkv::daemon
