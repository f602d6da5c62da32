// Cache: sessions, leases and lookups (the KvCache service's core).
#include "daemon/core/cache.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "daemon/core/refusal_errors.h"
#include "base/status_macros.h"
#include "radixkv/defaults.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

// NamespaceRoot(spec), remembering the last spec this thread saw: Match
// names its namespace on every call (no session), and a router asks about
// the same one again and again; comparing the spec is cheaper than hashing
// it.
BlockKey ThreadCachedRoot(const NamespaceSpec& spec) {
  thread_local NamespaceSpec last_spec;
  thread_local BlockKey last_root;
  thread_local bool valid = false;
  if (!valid || !(spec == last_spec)) {
    last_root = NamespaceRoot(spec);
    last_spec = spec;
    valid = true;
  }
  return last_root;
}

// AcquireResponse.pages_le is the host's u32 array as bytes.
static_assert(sizeof(PageId) == 4, "AcquireResponse.pages_le holds u32");

void FillAcquireResponse(const v1::AcquireRequest& req, const AcquireResult& r,
                         uint32_t page_size, absl::Time expires,
                         v1::AcquireResponse* resp) {
  resp->Clear();
  resp->set_lease_id(r.lease);
  resp->set_total_blocks(r.total_blocks);
  resp->set_matched_blocks(r.matched_blocks);
  resp->set_matched_tokens(uint64_t{r.matched_blocks} * page_size);
  if (req.pages_le()) {
    if (!r.pages.empty()) {
      resp->mutable_pages_le()->assign(
          reinterpret_cast<const char*>(r.pages.data()),
          r.pages.size() * sizeof(PageId));
    }
  } else {
    resp->mutable_pages()->Reserve(static_cast<int>(r.pages.size()));
    for (PageId page : r.pages) resp->add_pages(page);
  }
  resp->set_new_blocks(r.new_blocks);
  if (r.lease != 0) {
    resp->set_lease_expires_unix_ms(absl::ToUnixMillis(expires));
  }
}

}  // namespace

Cache::Cache(const CacheOptions& options)
    : options_(options),
      started_(absl::Now()),
      events_(options.event_buffer),
      tiers_(options.tiers == nullptr
                 ? nullptr
                 : std::make_unique<TierCoordinator>(options.tiers, &events_)),
      registry_({.pool = options.pool,
                 .max_pool_pages = options.max_pool_pages,
                 .max_page_size = options.max_page_size,
                 .account_limits = options.account_limits,
                 .remembered_evictions = options.remembered_evictions,
                 .eviction_policy = options.eviction_policy,
                 .lower_tier_blocks = options.tiers == nullptr
                                          ? 0
                                          : options.tiers->capacity_blocks(),
                 .events = &events_,
                 .attach_socket = options.attach_socket,
                 .on_pool_created =
                     options.tiers == nullptr
                         ? std::function<absl::Status(const gpu::PagePool&)>()
                         : [tiers = options.tiers](const gpu::PagePool& p) {
                             return tiers->AttachPool(&p);
                           }}),
      sessions_(options.sessions.max_sessions),
      fences_([this](OwnerId owner) {
        RadixTree* t = registry_.tree();
        if (t != nullptr) t->ReleaseFenced(owner);
      }) {
  sweeper_ = std::thread([this] { SweeperLoop(); });
}

uint64_t Cache::MaxSessionPages() const {
  if (options_.sessions.max_pinned_pages_per_session != 0) {
    return options_.sessions.max_pinned_pages_per_session;
  }
  RadixTree* t = registry_.tree();
  return t == nullptr ? 0 : std::max<uint64_t>(1, t->capacity() / 2);
}

// Most ids OpenSession.acknowledge_sessions may list.
constexpr int kMaxAcknowledged = 64;

absl::Status Cache::CheckAcknowledged(
    absl::string_view field,
    const google::protobuf::RepeatedPtrField<std::string>& ids) const {
  if (ids.size() > kMaxAcknowledged) {
    return FieldError(absl::StatusCode::kInvalidArgument, field,
                      v1::ERROR_REASON_INVALID,
                      absl::StrCat(ids.size(), " ids; at most ",
                                   kMaxAcknowledged));
  }
  for (int i = 0; i < ids.size(); ++i) {
    RETURN_IF_ERROR(CheckString(absl::StrCat(field, "[", i, "]"), ids.Get(i),
                                options_.max_string_bytes));
  }
  return absl::OkStatus();
}

absl::Status Cache::AcknowledgeSessions(
    const google::protobuf::RepeatedPtrField<std::string>& ids,
    const Caller& caller) {
  RETURN_IF_ERROR(CheckAcknowledged("heartbeat.acknowledge_sessions", ids));
  for (const std::string& id : ids) fences_.Acknowledge(id, caller.peer);
  return absl::OkStatus();
}

Cache::~Cache() {
  {
    absl::MutexLock lock(&sweeper_mu_);
    stop_sweeper_ = true;
  }
  sweeper_.join();
  events_.Shutdown();
}

void Cache::SweeperLoop() {
  absl::MutexLock lock(&sweeper_mu_);
  while (true) {
    const absl::Condition stopping(&stop_sweeper_);
    if (sweeper_mu_.AwaitWithTimeout(stopping, options_.sweep_interval)) return;
    sweeper_mu_.Unlock();
    SweepExpiredLeases();
    ForgetUnusedNamespaces();
    sweeper_mu_.Lock();
  }
}

absl::Status Cache::OpenSession(const v1::OpenSession& open,
                                const Caller& caller, v1::SessionInfo* info) {
  if (!open.has_namespace_()) {
    return FieldError(absl::StatusCode::kInvalidArgument, "open.namespace",
                      v1::ERROR_REASON_INVALID,
                      "required (model, layout, page_size ...)");
  }
  const uint32_t version =
      open.block_key_version() == 0 ? kBlockKeyVersion : open.block_key_version();
  if (version != kBlockKeyVersion) {
    return FieldError(
        absl::StatusCode::kInvalidArgument, "open.block_key_version",
        v1::ERROR_REASON_INVALID,
        absl::StrCat(version, " is not supported; this daemon computes "
                     "block-key contract version ", kBlockKeyVersion));
  }
  RETURN_IF_ERROR(CheckString("open.client_name", open.client_name(),
                              options_.max_string_bytes));
  ASSIGN_OR_RETURN(NamespaceSpec spec,
                   ValidateNamespace(open.namespace_(), options_));
  spec.cache_salt = caller.scope.EffectiveSalt(std::move(spec.cache_salt));
  RETURN_IF_ERROR(
      CheckAcknowledged("open.acknowledge_sessions", open.acknowledge_sessions()));
  if (sessions_.size() >= options_.sessions.max_sessions) {
    return FieldError(absl::StatusCode::kResourceExhausted, "sessions",
                      v1::ERROR_REASON_LIMIT,
                      absl::StrCat("the limit --max_sessions=",
                                   options_.sessions.max_sessions,
                                   " is reached"));
  }
  ASSIGN_OR_RETURN(NamespaceEntry ns, registry_.Bind(spec, caller.scope));
  // A session's tenant is its namespace's.
  assert(caller.scope.Owns(ns.tenant));
  absl::StatusOr<SessionEntry> created =
      sessions_.Create({ns.id, ns.root, spec.page_size}, open.client_name(),
                       caller, open.device(),
                       {.per_peer = options_.sessions.max_sessions_per_peer,
                        .per_tenant = caller.scope.max_sessions()});
  if (!created.ok()) {
    registry_.Unbind(ns.root);
    return created.status();
  }
  const SessionEntry& session = *created;
  if (caller.peer.transport == PeerIdentity::Transport::kUnix) {
    fences_.AddWriter(session.owner, caller.peer.pid);
  }
  // Only an open that succeeds acknowledges: a refused one changes nothing
  // and the client sends the same list again.
  for (const std::string& id : open.acknowledge_sessions()) {
    fences_.Acknowledge(id, caller.peer);
  }
  info->Clear();
  info->set_session_id(session.id);
  info->set_namespace_id(ns.root.ToCanonical());
  registry_.FillPoolInfo(info->mutable_pool());
  info->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.sessions.lease_ttl));
  info->set_max_prompt_tokens(options_.max_prompt_tokens);
  info->set_key_mode_allowed(options_.allow_key_mode);
  info->set_tenant(caller.scope.name());
  return absl::OkStatus();
}

absl::StatusOr<SessionRef> Cache::FindSession(absl::string_view session_id,
                                              const Caller& caller) {
  absl::StatusOr<SessionRef> r = sessions_.Lookup(session_id, caller.peer);
  if (!r.ok() && absl::IsPermissionDenied(r.status())) {
    CountPermissionDenied();
    Log(LogLevel::kWarning,
        absl::StrCat("audit: refused the use of another peer's session by ",
                     caller.peer.ToString()));
  }
  return r;
}

void Cache::CloseSession(absl::string_view session_id) {
  SessionEntry entry;
  const OwnerId owner = sessions_.Remove(session_id, &entry);
  if (owner == kNoOwner) return;  // unknown, or closed already
  registry_.Unbind(entry.binding.root);
  RadixTree* t = registry_.tree();
  if (t == nullptr) return;
  // Leases still open may be written by a process that is alive: fence
  // them (the tree ends them instead for a pool without memory).
  t->ReleaseOwner(owner, /*fence=*/true);
  const bool fenced = t->owner_leases(owner) != 0;
  fences_.SessionEnded(session_id, owner, entry.peer, fenced);
}

absl::Status Cache::LeaseError(const absl::Status& s,
                               const Caller& caller) const {
  return RefusalToFieldError(s, {.lease_ttl = options_.sessions.lease_ttl,
                                 .tenant = caller.scope.name()});
}

absl::Status Cache::Acquire(const v1::AcquireRequest& req,
                            v1::AcquireResponse* resp, const Caller& caller,
                            LeaseHandle* handle) {
  ASSIGN_OR_RETURN(SessionRef session,
                   FindSession(req.session_id(), caller));
  ASSIGN_OR_RETURN(
      Prompt p, ValidatePrompt(FieldsOf(req), session.binding.page_size, options_));
  RETURN_IF_ERROR(CheckReleaseLeaseList(req.release_leases()));
  ASSIGN_OR_RETURN(std::vector<BlockPriority> priorities,
                   ConvertPriorities(req.priorities()));
  RadixTree* t = registry_.tree();
  if (t == nullptr) return absl::InternalError("session without a pool");
  const absl::Time expires = absl::Now() + options_.sessions.lease_ttl;
  const auto& carried = req.release_leases();
  absl::StatusOr<AcquireResult> r = t->Acquire(
      {.ns = session.binding.ns,
       .keys = p.keys,
       .tokens = p.tokens,
       .allocate = req.allocate(),
       .max_new_blocks = req.max_new_blocks(),
       .owner = session.owner,
       .expires = expires,
       .max_owner_leases = options_.sessions.max_leases_per_session,
       .max_owner_pages = MaxSessionPages(),
       .end_leases = absl::MakeConstSpan(carried.data(), carried.size()),
       .report_evictions = tiers_ != nullptr,
       // The tiers copy into and out of the new pages before the answer.
       .hold_new_pages = tiers_ != nullptr,
       .priorities = priorities});
  if (!r.ok()) return LeaseError(r.status(), caller);
  if (r->lease != 0 && !sessions_.Exists(req.session_id())) {
    // The session closed while this Acquire ran, possibly after its
    // ReleaseOwner: end the new lease here so that it cannot outlive it.
    t->Release(r->lease, session.owner).IgnoreError();
    t->ReleaseHold(r->lease);
    return FieldError(absl::StatusCode::kNotFound, "session_id",
                      v1::ERROR_REASON_SESSION_NOT_FOUND,
                      "the session ended during this Acquire");
  }
  const uint32_t promoted =
      tiers_ == nullptr
          ? 0
          : tiers_->AfterAcquire(t, session.binding.ns,
                                 session.binding.page_size, session.owner,
                                 &*r);
  FillAcquireResponse(req, *r, session.binding.page_size, expires, resp);
  resp->set_promoted_blocks(promoted);
  if (handle != nullptr) *handle = {r->lease, session.owner};
  return absl::OkStatus();
}

TierChain::DrainResult Cache::DrainTiers(absl::Time deadline) {
  if (tiers_ == nullptr) return {};
  const TierChain::DrainResult r = tiers_->Drain(registry_.tree(), deadline);
  drained_blocks_.store(r.drained, std::memory_order_relaxed);
  drain_left_blocks_.store(r.left, std::memory_order_relaxed);
  return r;
}

TierChain::DrainResult Cache::last_drain() const {
  return {.drained = drained_blocks_.load(std::memory_order_relaxed),
          .left = drain_left_blocks_.load(std::memory_order_relaxed)};
}

absl::Status Cache::Commit(const v1::CommitRequest& req,
                           v1::CommitResponse* resp, const Caller& caller) {
  ASSIGN_OR_RETURN(SessionRef session,
                   FindSession(req.session_id(), caller));
  RadixTree* t = registry_.tree();
  if (t == nullptr) return absl::InternalError("session without a pool");
  // A write-through tier copies the inserted pages while the lease still
  // pins them: commit without releasing, copy, then release.
  const bool through = tiers_ != nullptr && tiers_->writes_through();
  ASSIGN_OR_RETURN(std::vector<BlockPriority> priorities,
                   ConvertPriorities(req.priorities()));
  absl::StatusOr<CommitResult> r =
      t->Commit(req.lease_id(), req.blocks(), req.release() && !through,
                session.owner, /*report_inserted=*/tiers_ != nullptr,
                priorities);
  if (!r.ok()) return LeaseError(r.status(), caller);
  if (tiers_ != nullptr) {
    tiers_->AfterCommit(t, session.binding.ns, r->inserted_keys);
  }
  if (through) {
    // The lease pinned the pages through the copy if it is still there
    // after it: a lease never comes back once ended.
    bool asked = false, released = false;
    tiers_->WriteThrough(t, session.binding.ns, session.binding.page_size,
                         *r, [&] {
                           asked = true;
                           if (!req.release()) {
                             return t->Commit(req.lease_id(), 0, false,
                                              session.owner).ok();
                           }
                           released = t->Release(req.lease_id(),
                                                 session.owner).ok();
                           return released;
                         });
    if (req.release() && !asked) {
      released = t->Release(req.lease_id(), session.owner).ok();
    }
    r->released = released;
  }
  resp->Clear();
  resp->set_inserted(r->inserted);
  resp->set_deduplicated(r->deduplicated);
  resp->set_collided(r->collided);
  resp->set_released(r->released);
  resp->mutable_pages()->Reserve(static_cast<int>(r->pages.size()));
  for (PageId page : r->pages) resp->add_pages(page);
  return absl::OkStatus();
}

absl::Status Cache::Release(const v1::ReleaseRequest& req,
                            const Caller& caller) {
  ASSIGN_OR_RETURN(SessionRef session,
                   FindSession(req.session_id(), caller));
  RadixTree* t = registry_.tree();
  if (t == nullptr) return absl::InternalError("session without a pool");
  return LeaseError(t->Release(req.lease_id(), session.owner), caller);
}

void Cache::AbandonLease(const LeaseHandle& handle) {
  RadixTree* t = registry_.tree();
  // NOT_FOUND: the session ended (ending it) or the lease expired first.
  if (t != nullptr && t->Release(handle.lease, handle.owner).ok()) {
    lease_abandoned_.fetch_add(1, std::memory_order_relaxed);
  }
}

absl::Status Cache::Match(const v1::MatchRequest& req, v1::MatchResponse* resp,
                          const Caller& caller) {
  ASSIGN_OR_RETURN(NamespaceSpec spec,
                   ValidateNamespace(req.namespace_(), options_));
  spec.cache_salt = caller.scope.EffectiveSalt(std::move(spec.cache_salt));
  ASSIGN_OR_RETURN(Prompt p,
                   ValidatePrompt(FieldsOf(req), spec.page_size, options_));
  const BlockKey root = ThreadCachedRoot(spec);
  NamespaceEntry ns;
  const NamespaceRegistry::IdGuard guard = registry_.GuardIds();
  RadixTree* t = registry_.tree();
  const bool known = t != nullptr && registry_.Find(root, &ns);
  resp->Clear();
  char root_bytes[BlockKey::kBytes];
  root.ToCanonical(root_bytes);
  resp->set_namespace_id(root_bytes, sizeof(root_bytes));
  MatchResult r;
  // Nothing is cached in a namespace the tree has not seen.
  r.total_blocks = static_cast<uint32_t>(
      p.key_mode ? p.keys.size() : p.tokens.size() / spec.page_size);
  if (known) {
    ASSIGN_OR_RETURN(r, t->Match(ns.id, p.keys, p.tokens));
  }
  if (tiers_ != nullptr) {
    std::vector<BlockKey> computed;
    absl::Span<const BlockKey> keys = p.keys;
    if (!p.key_mode) {
      computed = ComputeBlockKeys(root, spec.page_size, p.tokens);
      keys = computed;
    }
    const TierCoordinator::TierMatch m = tiers_->AfterMatch(root, keys, r.matched_blocks);
    resp->set_tier_matched_blocks(m.blocks);
    for (const auto& [kind, blocks] : m.per_tier) {
      v1::TierBlockCount* c = resp->add_tier_matched();
      c->set_kind(std::string(kind));
      c->set_blocks(blocks);
    }
  }
  resp->set_total_blocks(r.total_blocks);
  resp->set_matched_blocks(r.matched_blocks);
  resp->set_matched_tokens(uint64_t{r.matched_blocks} * spec.page_size);
  return absl::OkStatus();
}

const gpu::PagePool* Cache::PoolForSession(absl::string_view session_id) const {
  const gpu::PagePool* pool = registry_.pool();
  if (pool == nullptr || pool->backend() == gpu::Backend::kNone) return nullptr;
  return sessions_.Exists(session_id) ? pool : nullptr;
}

const gpu::PagePool* Cache::PoolForAttach(absl::string_view session_id,
                                          const gpu::PeerCredentials& peer) {
  const gpu::PagePool* pool = registry_.pool();
  if (pool == nullptr || pool->backend() == gpu::Backend::kNone) return nullptr;
  SessionEntry s;
  if (!sessions_.Get(session_id, &s)) return nullptr;
  const bool same_uid = s.peer.transport == PeerIdentity::Transport::kInProcess ||
                        (s.peer.transport == PeerIdentity::Transport::kUnix &&
                         s.peer.uid == peer.uid);
  if (!same_uid && peer.uid != 0) {
    CountPermissionDenied();
    return nullptr;
  }
  fences_.AddWriter(s.owner, peer.pid);
  // The session may have ended meanwhile; then its pages were fenced (or
  // released) without this writer: refuse, so the worker never writes.
  if (!sessions_.Exists(session_id)) return nullptr;
  return pool;
}

uint64_t Cache::SweepExpiredLeases() {
  RadixTree* t = registry_.tree();
  return t == nullptr ? 0 : t->ReleaseExpired(absl::Now());
}

}  // namespace radixkv::daemon
