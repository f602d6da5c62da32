// Cache: the operator's view (the Admin service's core): statistics,
// namespaces, sessions, the tree, "explain this miss", eviction.
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/core/cache.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "radixkv/errors.h"
#include "radixkv/namespace_spec.h"

namespace radixkv::daemon {
namespace {

// DumpTree bounds (documented in the .proto).
constexpr uint32_t kDefaultDumpLimit = 100;
constexpr uint32_t kMaxDumpLimit = 10000;

v1::BlockState ToProto(BlockStatus s) {
  switch (s) {
    case BlockStatus::kCached: return v1::BLOCK_STATE_CACHED;
    case BlockStatus::kNotPresent: return v1::BLOCK_STATE_NOT_PRESENT;
    case BlockStatus::kEvicted: return v1::BLOCK_STATE_EVICTED;
    case BlockStatus::kTokenMismatch: return v1::BLOCK_STATE_TOKEN_MISMATCH;
    case BlockStatus::kParentMissing: return v1::BLOCK_STATE_PARENT_MISSING;
  }
  return v1::BLOCK_STATE_UNSPECIFIED;
}

const char* Reason(v1::BlockState s) {
  switch (s) {
    case v1::BLOCK_STATE_CACHED: return "cached";
    case v1::BLOCK_STATE_NOT_PRESENT: return "not present (never cached, or forgotten)";
    case v1::BLOCK_STATE_EVICTED: return "evicted (LRU, Evict or Clear)";
    case v1::BLOCK_STATE_TOKEN_MISMATCH:
      return "key cached with different tokens (hash collision)";
    case v1::BLOCK_STATE_WRONG_NAMESPACE:
      return "these tokens are cached under another namespace";
    case v1::BLOCK_STATE_PARENT_MISSING:
      return "an earlier block of the prompt is not cached";
    case v1::BLOCK_STATE_IN_TIER:
      return "in the tier below the pool (an Acquire promotes it)";
    default: return "";
  }
}

void FillTreeStats(const TreeStats& ts, v1::Stats* s) {
  s->set_capacity_pages(ts.capacity_pages);
  s->set_free_pages(ts.free_pages);
  s->set_writing_pages(ts.writing_pages);
  s->set_cached_pages(ts.cached_pages);
  s->set_pinned_pages(ts.pinned_pages);
  s->set_lookup_tokens(ts.lookup_tokens);
  s->set_hit_tokens(ts.hit_tokens);
  s->set_evicted_pages(ts.evicted_pages);
  s->set_leases(ts.leases);
  s->set_hash_collisions(ts.hash_collisions);
  s->set_tree_nodes(ts.nodes);
  s->set_namespaces(ts.namespaces);
  s->set_lookups(ts.lookups);
  s->set_matches(ts.matches);
  s->set_inserted_blocks(ts.inserted_blocks);
  s->set_deduplicated_blocks(ts.deduplicated_blocks);
  s->set_lease_expired(ts.leases_expired);
  s->set_walked_blocks(ts.walked_blocks);
  s->set_hashed_blocks(ts.hashed_blocks);
  s->set_eviction_policy(EvictionPolicyName(ts.eviction_policy));
  s->set_probation_pages(ts.probation_pages);
  s->set_eviction_theta(ts.eviction_theta);
  s->set_eviction_switches(ts.eviction_switches);
  s->set_eviction_tier_theta(ts.eviction_tier_theta);
  s->set_eviction_tier_switches(ts.eviction_tier_switches);
  s->set_admitted_requests(ts.admitted_requests);
  s->set_probation_requests(ts.probation_requests);
  s->set_pins(ts.pins);
  s->set_pin_pages(ts.pin_pages);
  s->set_quarantined_pages(ts.fenced_pages);
  s->set_quarantined_leases(ts.fenced_leases);
  s->set_invariants_ok(ts.free_pages + ts.writing_pages + ts.cached_pages ==
                           ts.capacity_pages &&
                       ts.pinned_pages <= ts.cached_pages);
}

// Whether `scope` sees namespace `id`, given `tenants` (the registry's
// recorded tenants, NamespaceRegistry::Tenants). A namespace registered
// after `tenants` was taken is shown to administrators only.
bool Sees(const TenantScope& scope,
          const absl::flat_hash_map<NamespaceId, std::string>& tenants,
          NamespaceId id) {
  auto it = tenants.find(id);
  return it != tenants.end() ? scope.Sees(it->second) : scope.admin();
}

// Stats.tiers (and Stats.tier, the top tier again, which also carries the
// chain's copy errors), and the tokens promotions served added to
// Stats.hit_tokens: a promoted block is a hit for the worker that asked.
void FillTierStats(const TierCoordinator& tiers, v1::Stats* s) {
  for (const TierCoordinator::TierReport& r : tiers.Report()) {
    const TierStats& d = r.stats;
    v1::TierStats* out = s->add_tiers();
    out->set_kind(std::string(r.name));
    out->set_page_bytes(r.page_bytes);
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
    out->set_unavailable(d.unavailable);
    out->set_breaker_trips(d.breaker_trips);
    out->set_write_errors(d.write_errors);
    for (double b : TierLatency::kBounds) out->add_promotion_seconds_bounds(b);
    for (uint64_t c : r.promotion_latency->counts()) {
      out->add_promotion_seconds_counts(c);
    }
    out->set_promotion_seconds_sum(r.promotion_latency->sum_seconds());
  }
  if (s->tiers_size() == 0) return;
  v1::TierStats* top = s->mutable_tiers(0);
  top->set_copy_errors(tiers.copy_errors());
  top->set_dropped_policy(tiers.policy_dropped());
  *s->mutable_tier() = *top;
  s->set_hit_tokens(s->hit_tokens() + tiers.promoted_tokens());
}

}  // namespace

void Cache::GetStats(v1::Stats* s) const {
  s->Clear();
  if (const RadixTree* t = registry_.tree(); t != nullptr) {
    FillTreeStats(t->GetStats(), s);
  } else {
    s->set_invariants_ok(true);
  }
  if (const RadixTree* t = registry_.tree(); t != nullptr) {
    for (uint32_t a = 1; a < options_.account_names.size(); ++a) {
      const AccountStats as = t->GetAccountStats(a);
      const AccountLimits& limits = options_.account_limits[a];
      v1::TenantStats* ts = s->add_tenants();
      ts->set_name(options_.account_names[a]);
      ts->set_cached_pages(as.cached_pages);
      ts->set_writing_pages(as.writing_pages);
      ts->set_held_pages(as.held_pages);
      ts->set_namespaces(as.namespaces);
      ts->set_evicted_pages(as.evicted_pages);
      ts->set_limited_acquires(as.limited_acquires);
      ts->set_max_cached_pages(limits.max_pages);
      ts->set_max_pinned_pages(limits.max_pinned_pages);
      ts->set_weight(limits.weight);
      ts->set_pins(as.pins);
      ts->set_pin_pages(as.pin_pages);
      ts->set_pin_limit_pages(t->PinLimit(a));
    }
  }
  if (tiers_ != nullptr) FillTierStats(*tiers_, s);
  s->set_sessions(sessions_.size());
  s->set_lease_abandoned(lease_abandoned_total());
  s->set_permission_denied(permission_denied_.load(std::memory_order_relaxed));
  s->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  registry_.FillPoolInfo(s->mutable_pool());
  s->set_version(RADIXKV_VERSION_STRING);
}

uint64_t Cache::lease_expired_total() const {
  const RadixTree* t = registry_.tree();
  return t == nullptr ? 0 : t->GetStats().leases_expired;
}

void Cache::ListNamespaces(v1::ListNamespacesResponse* resp,
                           const Caller& caller) const {
  resp->Clear();
  const RadixTree* t = registry_.tree();
  if (t == nullptr) return;
  const auto per_ns = sessions_.SessionsPerNamespace();
  // No id changes hands between the two snapshots.
  const NamespaceRegistry::IdGuard guard = registry_.GuardIds();
  const absl::flat_hash_map<NamespaceId, std::string> tenants =
      registry_.Tenants();
  for (const NamespaceInfo& info : t->ListNamespaces()) {
    if (!Sees(caller.scope, tenants, info.id)) continue;
    v1::NamespaceEntry* e = resp->add_namespaces();
    e->set_namespace_id(info.root.ToCanonical());
    NamespaceToProto(info.spec, e->mutable_namespace_());
    e->mutable_namespace_()->set_cache_salt(
        caller.scope.VisibleSalt(info.spec.cache_salt));
    e->set_cached_blocks(info.cached_blocks);
    auto it = per_ns.find(info.id);
    e->set_sessions(it == per_ns.end() ? 0 : it->second);
  }
}

void Cache::ListSessions(v1::ListSessionsResponse* resp,
                         const Caller& caller) const {
  resp->Clear();
  const absl::Time now = absl::Now();
  const RadixTree* t = registry_.tree();
  for (const SessionEntry& s : sessions_.List()) {
    if (!caller.scope.Sees(s.tenant)) continue;
    v1::SessionEntry* e = resp->add_sessions();
    // An id is a handle only its peer can use, but it is shown only to
    // administrators and to that peer.
    if (caller.scope.admin() || caller.peer.SameParty(s.peer)) {
      e->set_session_id(s.id);
    }
    e->set_client_name(s.client_name);
    e->set_namespace_id(s.binding.root.ToCanonical());
    e->set_device(s.device);
    e->set_leases(t == nullptr ? 0 : t->owner_leases(s.owner));
    e->set_age_seconds(absl::ToDoubleSeconds(now - s.created));
    e->set_peer(s.peer.ToString());
  }
}

namespace {

// DumpTree page tokens: "rkvp", the next page and the tree's capacity (so
// a token from a differently sized pool is refused), u32 little-endian each.
constexpr char kPageTokenMagic[4] = {'r', 'k', 'v', 'p'};
constexpr size_t kPageTokenBytes = 12;

std::string PageToken(PageId next, uint32_t capacity) {
  std::string out(kPageTokenMagic, sizeof(kPageTokenMagic));
  for (uint32_t v : {next, capacity}) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  }
  return out;
}

// The page a token continues from. INVALID_ARGUMENT for a token this
// daemon's tree did not issue.
absl::StatusOr<PageId> ParsePageToken(const std::string& token,
                                      uint32_t capacity) {
  auto bad = [&](absl::string_view why) {
    return FieldError(absl::StatusCode::kInvalidArgument, "page_token",
                      v1::ERROR_REASON_INVALID,
                      absl::StrCat(why, "; pass the next_page_token of the "
                                        "previous response, or none to start"));
  };
  if (token.size() != kPageTokenBytes ||
      token.compare(0, 4, kPageTokenMagic, 4) != 0) {
    return bad(absl::StrCat("not a DumpTree page token (", token.size(),
                            " bytes)"));
  }
  uint32_t v[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    for (int i = 0; i < 4; ++i) {
      v[k] |= uint32_t{static_cast<uint8_t>(token[4 + 4 * k + i])} << (8 * i);
    }
  }
  if (v[1] != capacity || v[0] > capacity) {
    return bad(absl::StrCat("issued for a pool of ", v[1],
                            " pages, this one has ", capacity));
  }
  return v[0];
}

}  // namespace

absl::Status Cache::DumpTree(const v1::DumpTreeRequest& req,
                             v1::DumpTreeResponse* resp,
                             const Caller& caller) const {
  const uint32_t limit = req.limit() == 0 ? kDefaultDumpLimit : req.limit();
  if (limit > kMaxDumpLimit) {
    return FieldError(absl::StatusCode::kInvalidArgument, "limit",
                      v1::ERROR_REASON_INVALID,
                      absl::StrCat(limit, " exceeds the maximum ",
                                   kMaxDumpLimit));
  }
  const uint32_t max_depth = req.has_max_depth()
                                 ? req.max_depth()
                                 : std::numeric_limits<uint32_t>::max();
  const bool paged = req.paged() || !req.page_token().empty();
  resp->Clear();
  const RadixTree* t = registry_.tree();
  if (t == nullptr) {
    if (!req.page_token().empty()) {
      return ParsePageToken(req.page_token(), 0).status();
    }
    return absl::OkStatus();
  }
  PageId start = 0;
  if (!req.page_token().empty()) {
    ASSIGN_OR_RETURN(start, ParsePageToken(req.page_token(), t->capacity()));
  }
  const NamespaceRegistry::IdGuard guard = registry_.GuardIds();
  const absl::flat_hash_map<NamespaceId, BlockKey> roots = registry_.Roots();
  // A non-administrator sees its own tenant's namespaces only.
  const absl::flat_hash_map<NamespaceId, std::string> tenants =
      registry_.Tenants();
  const uint64_t total = t->GetStats().nodes;
  PageId next = 0;
  const std::vector<NodeInfo> nodes =
      paged ? t->DumpTreePage(max_depth, start, limit, req.include_tokens(),
                              &next)
            : t->DumpTree(max_depth, limit);
  for (const NodeInfo& n : nodes) {
    if (!Sees(caller.scope, tenants, n.ns)) continue;
    v1::TreeNode* out = resp->add_nodes();
    out->set_key(n.key.ToCanonical());
    out->set_parent_key(n.parent_key.ToCanonical());
    if (auto it = roots.find(n.ns); it != roots.end()) {
      out->set_namespace_id(it->second.ToCanonical());
    }
    out->set_page(n.page);
    out->set_depth(n.depth);
    out->set_refcount(n.refcount);
    out->set_children(n.children);
    out->set_age_seconds(n.age_seconds);
    if (req.include_tokens() && !n.tokens.empty()) {
      out->mutable_tokens()->Add(n.tokens.begin(), n.tokens.end());
    }
  }
  resp->set_total_nodes(total);
  if (paged) {
    if (next < t->capacity()) {
      resp->set_next_page_token(PageToken(next, t->capacity()));
    }
    resp->set_truncated(next < t->capacity());
    return absl::OkStatus();
  }
  // Only the limit truncates; a max_depth filter is what was asked for.
  resp->set_truncated(nodes.size() >= limit && nodes.size() < total);
  return absl::OkStatus();
}

// The fields in which namespace `there` differs from `here`, by their
// names in v1::Namespace, each with its values for people ("model: \"b\"
// there, \"a\" here"); cache_salt's values are never shown.
static std::vector<std::pair<std::string, std::string>> NamespaceDifferences(
    const NamespaceSpec& here, const NamespaceSpec& there) {
  std::vector<std::pair<std::string, std::string>> out;
  auto text = [&](const char* field, const std::string& a,
                  const std::string& b) {
    if (a != b) {
      out.emplace_back(field, absl::StrCat(field, " \"", absl::CHexEscape(b),
                                           "\" there, \"",
                                           absl::CHexEscape(a), "\" here"));
    }
  };
  auto number = [&](const char* field, uint64_t a, uint64_t b) {
    if (a != b) {
      out.emplace_back(field, absl::StrCat(field, " ", b, " there, ", a, " here"));
    }
  };
  text("model", here.model, there.model);
  text("model_revision", here.model_revision, there.model_revision);
  text("lora", here.lora, there.lora);
  if (here.cache_salt != there.cache_salt) {
    out.emplace_back("cache_salt", "cache_salt");
  }
  number("num_layers", here.num_layers, there.num_layers);
  number("num_kv_heads", here.num_kv_heads, there.num_kv_heads);
  number("head_dim", here.head_dim, there.head_dim);
  if (here.dtype != there.dtype) {
    out.emplace_back("dtype", absl::StrCat("dtype ", DTypeName(there.dtype),
                                           " there, ", DTypeName(here.dtype),
                                           " here"));
  }
  number("tp_rank", here.tp_rank, there.tp_rank);
  number("tp_size", here.tp_size, there.tp_size);
  if (here.cross_layer != there.cross_layer) {
    out.emplace_back("cross_layer", "cross_layer");
  }
  return out;
}

// For blocks not cached in the prompt's namespace: index of the first
// other namespace (same block size) that caches the same tokens as a prefix
// up to that block, or -1. Only tokens can tell (keys are per namespace).
// Looks at most `max_namespaces` other namespaces, of the caller's tenant
// only (all tenants for an administrator).
static std::vector<int> OtherNamespaceHits(
    const RadixTree& t, const NamespaceRegistry& registry,
    const NamespaceSpec& spec, const BlockKey& root,
    absl::Span<const uint32_t> tokens, size_t blocks, const Caller& caller,
    uint32_t max_namespaces, std::vector<NamespaceEntry>* others) {
  std::vector<int> hit(blocks, -1);
  uint32_t looked = 0;
  for (const NamespaceEntry& o : registry.WithPageSize(spec.page_size, root)) {
    if (!caller.scope.Sees(o.tenant)) continue;
    if (looked++ >= max_namespaces) break;
    const std::vector<BlockKey> keys =
        ComputeBlockKeys(o.root, o.spec.page_size, tokens);
    // Explain, not Match: it reads the same and leaves the Match counter
    // (radixkv_matches_total) alone.
    absl::StatusOr<std::vector<BlockExplanation>> m =
        t.Explain(o.id, keys, tokens);
    if (!m.ok()) continue;
    for (size_t i = 0; i < m->size() && i < blocks; ++i) {
      if ((*m)[i].status != BlockStatus::kCached) break;
      if (hit[i] < 0) hit[i] = static_cast<int>(others->size());
    }
    others->push_back(o);
  }
  return hit;
}

absl::Status Cache::Explain(const v1::ExplainRequest& req,
                            v1::ExplainResponse* resp,
                            const Caller& caller) const {
  ASSIGN_OR_RETURN(NamespaceSpec spec,
                   ValidateNamespace(req.namespace_(), options_));
  spec.cache_salt = caller.scope.EffectiveSalt(std::move(spec.cache_salt));
  ASSIGN_OR_RETURN(Prompt p,
                   ValidatePrompt(FieldsOf(req), spec.page_size, options_));
  const BlockKey root = NamespaceRoot(spec);
  std::vector<BlockKey> keys = std::move(p.keys);
  absl::Span<const uint32_t> tokens;
  if (!p.key_mode) {
    keys = ComputeBlockKeys(root, spec.page_size, p.tokens);
    tokens = p.tokens.first(keys.size() * spec.page_size);
  }
  resp->Clear();
  resp->set_namespace_id(root.ToCanonical());
  resp->set_total_blocks(static_cast<uint32_t>(keys.size()));

  const NamespaceRegistry::IdGuard guard = registry_.GuardIds();
  const RadixTree* t = registry_.tree();
  NamespaceEntry ns;
  const bool known = t != nullptr && registry_.Find(root, &ns);
  resp->set_namespace_known(known);
  std::vector<BlockExplanation> blocks;
  if (known) {
    ASSIGN_OR_RETURN(blocks, t->Explain(ns.id, keys, tokens));
  } else {
    blocks.resize(keys.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      blocks[i].key = keys[i];
      blocks[i].status =
          i == 0 ? BlockStatus::kNotPresent : BlockStatus::kParentMissing;
    }
  }
  std::vector<NamespaceEntry> others;
  const std::vector<int> other =
      !p.key_mode && t != nullptr
          ? OtherNamespaceHits(*t, registry_, spec, root, tokens,
                               blocks.size(), caller,
                               options_.explain_max_namespaces, &others)
          : std::vector<int>(blocks.size(), -1);

  uint32_t matched = 0;
  bool prefix = true;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockExplanation& b = blocks[i];
    v1::BlockExplanation* out = resp->add_blocks();
    out->set_index(static_cast<uint32_t>(i));
    out->set_key(b.key.ToCanonical());
    v1::BlockState state = ToProto(b.status);
    if ((state == v1::BLOCK_STATE_NOT_PRESENT ||
         state == v1::BLOCK_STATE_PARENT_MISSING) &&
        other[i] >= 0) {
      state = v1::BLOCK_STATE_WRONG_NAMESPACE;
      out->set_other_namespace_id(others[other[i]].root.ToCanonical());
    }
    TierBlock in_tier;
    const TierKindInfo* tier =
        state != v1::BLOCK_STATE_CACHED && tiers_ != nullptr
            ? TierKindInfoOfMedium(tiers_->chain().Locate(b.key, &in_tier))
            : nullptr;
    if (tier != nullptr) state = v1::BLOCK_STATE_IN_TIER;
    out->set_state(state);
    out->set_reason(Reason(state));
    if (state == v1::BLOCK_STATE_WRONG_NAMESPACE) {
      std::vector<std::string> texts;
      for (auto& [field, text] :
           NamespaceDifferences(spec, others[other[i]].spec)) {
        out->add_differing_fields(field);
        texts.push_back(std::move(text));
      }
      if (!texts.empty()) {
        out->set_reason(absl::StrCat(Reason(state), ", which differs in ",
                                     absl::StrJoin(texts, "; ")));
      }
    }
    if (tier != nullptr) {
      out->set_tier(tier->name);
      out->set_reason(absl::StrCat("in the ", tier->name,
                                   " tier below the pool (an Acquire "
                                   "promotes it)"));
    }
    if (state == v1::BLOCK_STATE_CACHED) {
      out->set_page(b.page);
      out->set_refcount(b.refcount);
      out->set_age_seconds(b.age_seconds);
      if (prefix) ++matched;
    } else {
      prefix = false;
    }
  }
  resp->set_matched_blocks(matched);
  uint32_t in_tier = 0;
  while (matched + in_tier < static_cast<uint32_t>(resp->blocks_size()) &&
         resp->blocks(matched + in_tier).state() == v1::BLOCK_STATE_IN_TIER) {
    ++in_tier;
  }
  resp->set_tier_blocks(in_tier);
  return absl::OkStatus();
}

void Cache::Evict(const v1::EvictRequest& req, v1::EvictResponse* resp) {
  resp->Clear();
  RadixTree* t = registry_.tree();
  if (t == nullptr) return;
  resp->set_evicted(t->Evict(req.pages()));
}

void Cache::Clear(v1::ClearResponse* resp) {
  resp->Clear();
  RadixTree* t = registry_.tree();
  if (t == nullptr) return;
  resp->set_removed(t->Clear());
  resp->set_pinned_remaining(t->GetStats().cached_pages);
}

absl::Status Cache::CheckInvariants() const {
  const RadixTree* t = registry_.tree();
  return t == nullptr ? absl::OkStatus() : t->CheckInvariants();
}

}  // namespace radixkv::daemon
