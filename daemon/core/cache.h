// File: daemon/core/cache.h
//
// Cache: the core of radixkvd, below the gRPC layer. It answers every
// radixkv.v1 request: sessions, leases and lookups here (cache.cc), the
// operator's view in cache_inspect.cc. Its API speaks radixkv.v1 proto
// messages (so the service layer is a thin adapter) but no gRPC types, so
// tests and benchmarks drive it directly.
//
//   Cache cache(options);
//   v1::SessionInfo info;
//   RETURN_IF_ERROR(cache.OpenSession(open, caller, &info));
//   v1::AcquireRequest req;  req.set_session_id(info.session_id()); ...
//   v1::AcquireResponse resp;
//   RETURN_IF_ERROR(cache.Acquire(req, &resp, caller));
//   ...
//   cache.CloseSession(info.session_id());   // ends what is left
//
// Parts, one concept each: request_validation.h checks requests,
// namespace_registry.h owns namespaces, pool and tree, session_table.h
// knows the sessions. Leases live only in the radix tree, recorded under
// the session's owner id with their expiry (--lease_ttl, a backstop for a
// stuck worker; a crashed worker's leases end with its Session stream). A
// background thread ends expired leases every `sweep_interval`.
//
// Errors: every request is validated before anything changes. Malformed
// input is INVALID_ARGUMENT with a message that names the field and the
// limit; an unknown session, lease (also: expired, foreign) is NOT_FOUND;
// state-dependent refusals are FAILED_PRECONDITION; full tables are
// RESOURCE_EXHAUSTED. An error about a request field carries an
// ErrorDetail (radixkv/errors.h). A failed call changes nothing.
//
// Callers: every request names its Caller (access_policy.h), the verified
// peer with its TenantScope (tenant_scope.h); no method has a default. A
// session is usable only by the peer that opened it; a namespace is stored
// under the effective cache_salt of the scope that binds it and records that
// tenant, and listings, dumps and explanations show what the caller's scope
// Sees of those recorded tenants. The daemon's own calls pass
// Caller::Daemon().
//
// Fencing: a lease that expires, or whose session ends without a Commit or
// Release, keeps its pages (pinned or WRITING, counted as quarantined)
// until every process that could still write them has exited or
// acknowledged the loss (fence_tracker.h); only then are they reused.
//
// Thread safety: thread-safe. Block keys are hashed outside every lock.
// Lock order: registry -> tree (internal) -> EventLog; the session table's
// mutex is never held while calling the tree.
#ifndef RADIXKV_DAEMON_CORE_CACHE_H_
#define RADIXKV_DAEMON_CORE_CACHE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/trust/access_policy.h"
#include "daemon/events/event_log.h"
#include "daemon/trust/fence_tracker.h"
#include "daemon/core/namespace_registry.h"
#include "daemon/core/request_validation.h"
#include "daemon/core/session_table.h"
#include "daemon/tiers/tier_chain.h"
#include "daemon/tiers/tier_coordinator.h"
#include "gpu/pool.h"
#include "radix/radix_tree.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::daemon {

// Session and lease limits (radixkvd flags of the same names).
struct SessionOptions {
  uint32_t max_sessions = 1024;
  // Sessions one peer (uid, certificate, TCP connection) may hold.
  uint32_t max_sessions_per_peer = 64;
  // Pages one session's leases may hold at once, fenced ones included
  // (0: half the pool).
  uint64_t max_pinned_pages_per_session = 0;
  uint32_t max_leases_per_session = 4096;
  absl::Duration lease_ttl = absl::Minutes(5);
};

// The request limits (RequestLimits: max_prompt_tokens, max_string_bytes,
// max_page_size, allow_key_mode) and the rest of the daemon core's options.
struct CacheOptions : RequestLimits {
  // The pool to create when the first namespace binds.
  gpu::PoolSpec pool;
  // Most pages the pool may be divided into (--max_pool_pages).
  uint64_t max_pool_pages = uint64_t{1} << 22;
  // The tree's accounts (Tenant::account): their names and limits, index
  // = account. Empty: one unnamed account without limits.
  std::vector<std::string> account_names;
  std::vector<AccountLimits> account_limits;
  // The tiers below the pool (--tier); null: evicted blocks are dropped.
  // Shared with the server, which opened them for the pool's page size.
  std::shared_ptr<TierChain> tiers;
  SessionOptions sessions;
  // Events kept for WatchEvents consumers.
  size_t event_buffer = 65536;
  // Evicted keys Explain remembers as EVICTED.
  uint32_t remembered_evictions = 4096;
  // Which unpinned leaf the pool evicts first (--eviction_policy).
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  // Other namespaces Explain looks in for WRONG_NAMESPACE (each costs a
  // hash of the prompt), --explain_max_namespaces.
  uint32_t explain_max_namespaces = 16;
  // How often expired leases are ended.
  absl::Duration sweep_interval = absl::Seconds(1);
  // Reported in PoolInfo.attach_socket (empty: no attach socket).
  std::string attach_socket;
};

// A lease as its session holds it (Acquire's out-parameter, AbandonLease).
struct LeaseHandle {
  LeaseId lease = 0;
  OwnerId owner = kNoOwner;
};

class Cache {
 public:
  // Starts the lease sweeper thread.
  explicit Cache(const CacheOptions& options);
  // Stops the sweeper. Sessions still open are dropped with the tree.
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  const CacheOptions& options() const { return options_; }

  // --- KvCache (cache.cc) ---
  // Heartbeat.acknowledge_sessions: the caller promises that no lease of
  // these ended sessions of its is written again; their fenced pages return
  // (FenceTracker). INVALID_ARGUMENT for too many or too long ids.
  absl::Status AcknowledgeSessions(
      const google::protobuf::RepeatedPtrField<std::string>& ids,
      const Caller& caller);
  // Validates `open`, binds its namespace under the caller's scope (its
  // effective salt; the namespace records the scope's tenant; the pool is
  // created on first use), acknowledges the sessions it lists and creates a
  // session bound to `caller`; fills *info.
  absl::Status OpenSession(const v1::OpenSession& open, const Caller& caller,
                           v1::SessionInfo* info);
  // Ends a session and every lease it holds (unwritten pages become free).
  // Unknown ids are ignored, so calling it twice is harmless.
  void CloseSession(absl::string_view session_id);
  // With `handle`, also says which lease (if any) the answer hands out.
  absl::Status Acquire(const v1::AcquireRequest& req, v1::AcquireResponse* resp,
                       const Caller& caller, LeaseHandle* handle = nullptr);
  absl::Status Commit(const v1::CommitRequest& req, v1::CommitResponse* resp,
                      const Caller& caller);
  absl::Status Release(const v1::ReleaseRequest& req, const Caller& caller);
  // Ends a lease made by an Acquire whose answer never reached the client
  // (the call failed after the lease was made: deadline, cancel, broken
  // connection), so the client cannot know the lease id and nothing else
  // would end it before --lease_ttl. Counted when the lease was still live.
  void AbandonLease(const LeaseHandle& handle);
  // The namespace is the caller's (its scope's effective salt).
  absl::Status Match(const v1::MatchRequest& req, v1::MatchResponse* resp,
                     const Caller& caller);

  // --- Admin (cache_inspect.cc) ---
  void GetStats(v1::Stats* stats) const;
  // The namespaces the caller's scope Sees, with the salts it is shown
  // (TenantScope::VisibleSalt).
  void ListNamespaces(v1::ListNamespacesResponse* resp,
                      const Caller& caller) const;
  // The nodes of the namespaces the caller's scope Sees.
  absl::Status DumpTree(const v1::DumpTreeRequest& req,
                        v1::DumpTreeResponse* resp,
                        const Caller& caller) const;
  // Explains a prompt in the caller's namespace; WRONG_NAMESPACE names only
  // namespaces the caller's scope Sees.
  absl::Status Explain(const v1::ExplainRequest& req,
                       v1::ExplainResponse* resp, const Caller& caller) const;
  void Evict(const v1::EvictRequest& req, v1::EvictResponse* resp);
  void Clear(v1::ClearResponse* resp);
  // --- Prefix pins (cache_pins.cc) ---
  // Pins the cached prefix of a prompt in the caller's namespace (its
  // effective salt). Errors name the field and the limit and change
  // nothing: INVALID_ARGUMENT for a bad namespace or prompt; NOT_FOUND
  // (namespace) for a namespace no session ever bound; PERMISSION_DENIED
  // (namespace) for another tenant's namespace; FAILED_PRECONDITION
  // (tokens) when not even its first block is cached; RESOURCE_EXHAUSTED
  // (pins) beyond the tenant's max_pin_pages or weighted share.
  absl::Status Pin(const v1::PinRequest& req, v1::PinResponse* resp,
                   const Caller& caller);
  // Ends a pin the caller's scope Sees; NOT_FOUND (pin_id) otherwise.
  absl::Status Unpin(const v1::UnpinRequest& req, v1::UnpinResponse* resp,
                     const Caller& caller);
  // The pins of the namespaces the caller's scope Sees, oldest first.
  void ListPins(v1::ListPinsResponse* resp, const Caller& caller) const;

  // Administrators see every session with its id; others see their
  // tenant's sessions, with ids only for their own.
  void ListSessions(v1::ListSessionsResponse* resp,
                    const Caller& caller) const;
  EventLog& events() { return events_; }

  // The pool a session may map through the attach socket: nullptr for an
  // unknown session, before the pool exists, or for a none pool.
  const gpu::PagePool* PoolForSession(absl::string_view session_id) const;
  // PoolForSession for an attach connection from `peer`: also nullptr when
  // the session was opened by another uid (or not over the Unix socket).
  // Records the peer's process as a writer of the session's pages.
  const gpu::PagePool* PoolForAttach(absl::string_view session_id,
                                     const gpu::PeerCredentials& peer);
  // Calls refused for identity or role (Stats.permission_denied).
  void CountPermissionDenied() {
    permission_denied_.fetch_add(1, std::memory_order_relaxed);
  }
  // Ended sessions whose fenced pages wait for a writer to exit.
  size_t fenced_sessions() const { return fences_.waiting(); }

  // At shutdown, once no request runs: writes the pool's committed blocks
  // (most recently used first) and the host tier's down to the disk tier
  // until `deadline`, then fdatasync()s it (docs/TIERS.md, Restarts).
  // Without tiers nothing is written. The result is kept for
  // last_drain() (metrics during the stop, the log).
  TierChain::DrainResult DrainTiers(absl::Time deadline);
  // The last DrainTiers' figures; zero before one ran.
  TierChain::DrainResult last_drain() const;
  bool has_tiers() const { return tiers_ != nullptr; }

  // Ends every expired lease now; returns how many. The sweeper calls it.
  uint64_t SweepExpiredLeases();
  // Forgets every namespace no session is bound to that holds no cached
  // block and no lease (NamespaceRegistry::ForgetUnused); returns how
  // many. The sweeper calls it after SweepExpiredLeases.
  size_t ForgetUnusedNamespaces() { return registry_.ForgetUnused(); }
  // Full tree consistency check (O(capacity)); OK before the pool exists.
  absl::Status CheckInvariants() const;
  uint64_t lease_expired_total() const;
  uint64_t lease_abandoned_total() const {
    return lease_abandoned_.load(std::memory_order_relaxed);
  }

 private:
  // An error from the tree's lease operations as clients receive it
  // (refusal_errors.h): typed refusals become field errors; others pass.
  absl::Status LeaseError(const absl::Status& s, const Caller& caller) const;
  void SweeperLoop();
  // sessions_.Lookup for `caller`, counting and logging a refusal.
  absl::StatusOr<SessionRef> FindSession(absl::string_view session_id,
                                         const Caller& caller);
  // The most pages one session's leases may hold.
  uint64_t MaxSessionPages() const;
  // Checks OpenSession.acknowledge_sessions (count and sizes).
  absl::Status CheckAcknowledged(
      absl::string_view field,
      const google::protobuf::RepeatedPtrField<std::string>& ids) const;

  const CacheOptions options_;
  const absl::Time started_;
  EventLog events_;
  // The moves between the pool and options_.tiers; null without tiers.
  const std::unique_ptr<TierCoordinator> tiers_;
  NamespaceRegistry registry_;
  SessionTable sessions_;
  std::atomic<uint64_t> lease_abandoned_{0};
  std::atomic<uint64_t> permission_denied_{0};
  std::atomic<uint64_t> drained_blocks_{0};  // last_drain()
  std::atomic<uint64_t> drain_left_blocks_{0};
  FenceTracker fences_;

  absl::Mutex sweeper_mu_;
  bool stop_sweeper_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  std::thread sweeper_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_CORE_CACHE_H_
