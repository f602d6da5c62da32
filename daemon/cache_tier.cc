// Cache's side of the tiers below the pool (--tier, docs/TIERS.md):
// moving evicted blocks down and matched ones up around the tree's
// Acquire, and the tiers' stats.
#include <vector>

#include "daemon/cache.h"
#include "daemon/log.h"

namespace radixkv::daemon {

namespace {

void FillLatency(const TierLatency& l, v1::TierStats* out) {
  for (double b : TierLatency::kBounds) out->add_promotion_seconds_bounds(b);
  for (uint64_t c : l.counts()) out->add_promotion_seconds_counts(c);
  out->set_promotion_seconds_sum(l.sum_seconds());
}

// A tier's move as the tree's listeners take it (KV events: the medium of
// that tier; WatchEvents reports the pool only). A removal names the block
// by key and root; its namespace id is not needed.
TreeEvent ToTreeEvent(const TierMove& m, const BlockKey& root_if_unset) {
  TreeEvent e;
  e.type = m.stored ? TreeEvent::Type::kStored : TreeEvent::Type::kRemoved;
  e.ns = m.ns;
  e.root = m.block.root == BlockKey{} ? root_if_unset : m.block.root;
  e.key = m.block.key;
  e.parent_key = m.block.parent_key;
  e.depth = m.block.parent_key == e.root ? 0 : 1;  // only "first block or not" matters
  e.block_size = m.stored ? m.block.block_size : 0;
  e.medium = m.medium;
  return e;
}

}  // namespace

void Cache::MoveBetweenTiers(const SessionRef& session, AcquireResult* r) {
  TierChain& tiers = *options_.tiers;
  RadixTree* t = registry_.tree();
  // The Acquire held the new pages (hold_new_pages): whatever ends the
  // lease while the copies below run (its session closing, a Release of a
  // guessed lease id), no other writer gets them before ReleaseHold.
  const bool held = r->lease != 0 && r->new_blocks != 0;
  const BlockKey root = t->namespace_root(session.binding.ns);
  // Down first: the evicted blocks' pages are this lease's new pages, and
  // promotion below may overwrite them.
  std::vector<TierMove> moves;
  if (!r->evicted.empty()) {
    std::vector<EvictedPage> evicted;
    evicted.reserve(r->evicted.size());
    // Evicted blocks may be any namespace's: each keeps its own block size.
    NamespaceId size_of = session.binding.ns;
    uint32_t block_size = session.binding.page_size;
    for (const EvictedBlock& e : r->evicted) {
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
    tiers.Demote(evicted, &moves);
  }
  const size_t present =
      r->new_blocks == 0 ? 0 : tiers.CountPresent(r->new_keys);
  size_t got = 0;
  if (present != 0) {
    std::vector<uint64_t> pages(present);
    for (size_t i = 0; i < present; ++i) {
      pages[i] = r->pages[r->matched_blocks + i];
    }
    got = tiers.Promote(absl::MakeConstSpan(r->new_keys).first(present), pages,
                        &moves);
  }
  // The copies are done: pages of a lease that ended meanwhile go free.
  if (held) t->ReleaseHold(r->lease);
  if (!moves.empty()) PublishTierMoves(moves, root);
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
}

void Cache::ForgetTierCopies(const SessionRef& session,
                             absl::Span<const BlockKey> keys) {
  std::vector<TierMove> moves;
  if (options_.tiers->Forget(keys, &moves) == 0) return;
  PublishTierMoves(moves,
                   registry_.tree()->namespace_root(session.binding.ns));
}

void Cache::PublishTierMoves(absl::Span<const TierMove> moves,
                             const BlockKey& root) {
  std::vector<TreeEvent> events;
  events.reserve(moves.size());
  for (const TierMove& m : moves) events.push_back(ToTreeEvent(m, root));
  events_.OnTreeEvents(events);
}

void Cache::TierMatched(const BlockKey& root, uint32_t page_size,
                        const Prompt& p, uint32_t matched,
                        v1::MatchResponse* resp) const {
  std::vector<BlockKey> computed;
  absl::Span<const BlockKey> keys = p.keys;
  if (!p.key_mode) {
    computed = ComputeBlockKeys(root, page_size, p.tokens);
    keys = computed;
  }
  std::array<size_t, 3> by_medium{};
  const size_t n = matched >= keys.size()
                       ? 0
                       : options_.tiers->CountPresent(keys.subspan(matched),
                                                      &by_medium);
  resp->set_tier_matched_blocks(static_cast<uint32_t>(n));
  const auto add = [&](const char* kind, uint8_t medium) {
    v1::TierBlockCount* c = resp->add_tier_matched();
    c->set_kind(kind);
    c->set_blocks(static_cast<uint32_t>(by_medium[medium]));
  };
  if (options_.tiers->host() != nullptr) add("host", kMediumHostTier);
  if (options_.tiers->disk() != nullptr) add("disk", kMediumDiskTier);
}

void Cache::FillTierStats(v1::Stats* s) const {
  if (options_.tiers == nullptr) return;
  const TierChain& tiers = *options_.tiers;
  if (const HostTier* h = tiers.host(); h != nullptr) {
    const HostTierStats d = h->stats();
    v1::TierStats* out = s->add_tiers();
    out->set_kind("host");
    out->set_page_bytes(h->page_bytes());
    out->set_capacity_blocks(d.slots);
    out->set_blocks(d.used);
    out->set_pending_blocks(d.filling);
    out->set_demoted_blocks(d.demotions);
    out->set_promoted_blocks(d.promotions);
    out->set_dropped_full(d.dropped_full);
    out->set_dropped_error(d.dropped_error);
    out->set_bytes_written(d.bytes_written);
    out->set_bytes_read(d.bytes_read);
    out->set_forgotten_blocks(d.evictions);
    out->set_superseded_blocks(d.superseded);
    out->set_pinned(d.pinned);
    FillLatency(tiers.promotion_latency(kMediumHostTier), out);
  }
  if (const DiskTier* k = tiers.disk(); k != nullptr) {
    const DiskTierStats d = k->stats();
    v1::TierStats* out = s->add_tiers();
    out->set_kind("disk");
    out->set_page_bytes(k->page_bytes());
    out->set_capacity_blocks(d.slots);
    out->set_blocks(d.used);
    out->set_pending_blocks(d.pending);
    out->set_demoted_blocks(d.demotions);
    out->set_promoted_blocks(d.promotions);
    out->set_dropped_full(d.dropped_full);
    out->set_dropped_error(d.dropped_error);
    out->set_checksum_failures(d.checksum_failures);
    out->set_read_errors(d.read_errors);
    out->set_bytes_written(d.bytes_written);
    out->set_bytes_read(d.bytes_read);
    out->set_reloaded_blocks(d.reloaded);
    out->set_forgotten_blocks(d.evictions);
    out->set_superseded_blocks(d.superseded);
    FillLatency(tiers.promotion_latency(kMediumDiskTier), out);
  }
  // Copy failures are the chain's (its PageCopier's): counted on the top
  // tier, which Stats.tier repeats for readers of one tier.
  v1::TierStats* top = s->mutable_tiers(0);
  top->set_copy_errors(tiers.copy_errors());
  *s->mutable_tier() = *top;
  // A promoted block is a hit for the worker that asked.
  s->set_hit_tokens(s->hit_tokens() +
                    promoted_tokens_.load(std::memory_order_relaxed));
}

}  // namespace radixkv::daemon
