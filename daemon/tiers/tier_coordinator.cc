#include "daemon/tiers/tier_coordinator.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/log.h"

namespace radixkv::daemon {

namespace {

void FillLatency(const TierLatency& l, v1::TierStats* out) {
  for (double b : TierLatency::kBounds) out->add_promotion_seconds_bounds(b);
  for (uint64_t c : l.counts()) out->add_promotion_seconds_counts(c);
  out->set_promotion_seconds_sum(l.sum_seconds());
}

}  // namespace

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
    chain_->Demote(evicted, &moves);
  }
  const size_t present =
      r->new_blocks == 0 ? 0 : chain_->CountPresent(r->new_keys);
  size_t got = 0;
  if (present != 0) {
    std::vector<uint64_t> pages(present);
    for (size_t i = 0; i < present; ++i) {
      pages[i] = r->pages[r->matched_blocks + i];
    }
    got = chain_->Promote(absl::MakeConstSpan(r->new_keys).first(present),
                          pages, &moves);
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

void TierCoordinator::AfterMatch(const BlockKey& root, uint32_t page_size,
                                 const Prompt& p, uint32_t matched,
                                 v1::MatchResponse* resp) const {
  std::vector<BlockKey> computed;
  absl::Span<const BlockKey> keys = p.keys;
  if (!p.key_mode) {
    computed = ComputeBlockKeys(root, page_size, p.tokens);
    keys = computed;
  }
  std::array<size_t, kMediumCount> by_medium{};
  const size_t n =
      matched >= keys.size()
          ? 0
          : chain_->CountPresent(keys.subspan(matched), &by_medium);
  resp->set_tier_matched_blocks(static_cast<uint32_t>(n));
  for (size_t i = 0; i < chain_->size(); ++i) {
    const Tier& tier = chain_->tier(i);
    v1::TierBlockCount* c = resp->add_tier_matched();
    c->set_kind(tier.name());
    c->set_blocks(static_cast<uint32_t>(by_medium[tier.medium()]));
  }
}

void TierCoordinator::FillStats(v1::Stats* s) const {
  for (size_t i = 0; i < chain_->size(); ++i) {
    const Tier& tier = chain_->tier(i);
    const TierStats d = tier.stats();
    v1::TierStats* out = s->add_tiers();
    out->set_kind(tier.name());
    out->set_page_bytes(tier.page_bytes());
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
    out->set_pinned(d.pinned);
    FillLatency(chain_->promotion_latency(i), out);
  }
  // Copy failures are the chain's (its PageMover's): counted on the top
  // tier, which Stats.tier repeats for readers of one tier.
  v1::TierStats* top = s->mutable_tiers(0);
  top->set_copy_errors(chain_->copy_errors());
  *s->mutable_tier() = *top;
  // A promoted block is a hit for the worker that asked.
  s->set_hit_tokens(s->hit_tokens() +
                    promoted_tokens_.load(std::memory_order_relaxed));
}

}  // namespace radixkv::daemon
