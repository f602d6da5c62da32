// File: daemon/cache.h
//
// Cache: the core of radixkvd, below the gRPC layer. It owns the page pool,
// the radix tree, the session/lease books and the event log, validates every
// request and answers it. Its API speaks radixkv.v1 proto messages (so the
// service layer is a thin adapter) but no gRPC types, so tests and benchmarks
// can drive it directly.
//
//   Cache cache(options);
//   v1::SessionInfo info;
//   RETURN_IF_ERROR(cache.OpenSession(open, "unix:", &info));
//   v1::AcquireRequest req;  req.set_session_id(info.session_id()); ...
//   v1::AcquireResponse resp;
//   RETURN_IF_ERROR(cache.Acquire(req, &resp));
//   ...
//   cache.CloseSession(info.session_id());   // releases what is left
//
// Lifecycle of the pool: the pool and the tree are created when the first
// namespace is bound (OpenSession), because a pool's page size in bytes is
// fixed by that namespace's layout: a host pool gets capacity
// bytes / page_bytes, a none pool spec.pages. A later namespace with other
// page_bytes is refused with FAILED_PRECONDITION naming both sizes.
//
// Errors: every request is validated before anything changes. Malformed
// input is INVALID_ARGUMENT with a message that names the field and the
// limit; an unknown session, lease (also: expired, foreign) is NOT_FOUND;
// state-dependent refusals are FAILED_PRECONDITION; full tables are
// RESOURCE_EXHAUSTED. A failed call changes nothing.
//
// Leases: each lease is owned by the session that acquired it and expires
// after --lease_ttl (a backstop for a stuck worker; a crashed worker's leases
// go when its Session stream ends). A background thread sweeps expired
// leases every `sweep_interval`.
//
// Thread safety: thread-safe. Block keys are hashed outside every lock. Lock
// order: ns_mu_ -> tree (internal) -> EventLog; the session books' mutex is
// never held while calling the tree.
#ifndef RADIXKV_DAEMON_CACHE_H_
#define RADIXKV_DAEMON_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/event_log.h"
#include "daemon/session_manager.h"
#include "gpu/pool.h"
#include "radix/radix_tree.h"
#include "radixkv/defaults.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::daemon {

struct CacheOptions {
  // The pool to create when the first namespace binds.
  gpu::PoolSpec pool;
  // Request limits (each is a radixkvd flag of the same name).
  uint32_t max_prompt_tokens = 131072;
  uint32_t max_string_bytes = 256;
  uint32_t max_page_size = 1024;
  // Accept block_keys instead of tokens (hits then cannot be verified).
  bool allow_key_mode = false;
  SessionManagerOptions sessions;
  // Events kept for WatchEvents consumers.
  size_t event_buffer = 65536;
  // Evicted keys Explain remembers as EVICTED.
  uint32_t remembered_evictions = 4096;
  // How often expired leases are swept.
  absl::Duration sweep_interval = absl::Seconds(1);
  // Reported in PoolInfo.attach_socket (empty: no attach socket).
  std::string attach_socket;
};

// The token ids in `bytes` (little-endian u32 each; REQUIRES: size a
// multiple of 4) without copying when the bytes are 4-byte aligned; else they
// are copied into *copy and the view points there. Little-endian hosts only.
absl::Span<const uint32_t> TokensLeView(absl::string_view bytes,
                                        std::vector<uint32_t>* copy);

class Cache {
 public:
  // Starts the lease sweeper thread.
  explicit Cache(const CacheOptions& options);
  // Stops the sweeper. Sessions still open are dropped with the tree.
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  const CacheOptions& options() const { return options_; }

  // --- KvCache ---
  // Validates `open`, binds its namespace (creating the pool on first use)
  // and creates a session; fills *info. `peer` is informational.
  absl::Status OpenSession(const v1::OpenSession& open, absl::string_view peer,
                           v1::SessionInfo* info);
  // Ends a session: releases all its leases (unwritten pages become free).
  // Unknown ids are ignored, so calling it twice is harmless.
  void CloseSession(absl::string_view session_id);
  absl::Status Acquire(const v1::AcquireRequest& req, v1::AcquireResponse* resp);
  absl::Status Commit(const v1::CommitRequest& req, v1::CommitResponse* resp);
  absl::Status Release(const v1::ReleaseRequest& req);
  // Ends `lease`, made by an Acquire whose answer never reached the client
  // (the call failed after the lease was made: deadline, cancel, broken
  // connection), so the client cannot know the lease id and nothing else
  // would end it before --lease_ttl. Counted when the lease was still live.
  void AbandonLease(LeaseId lease);
  absl::Status Match(const v1::MatchRequest& req, v1::MatchResponse* resp);

  // --- Admin ---
  void GetStats(v1::Stats* stats) const;
  void ListNamespaces(v1::ListNamespacesResponse* resp) const;
  absl::Status DumpTree(const v1::DumpTreeRequest& req,
                        v1::DumpTreeResponse* resp) const;
  absl::Status Explain(const v1::ExplainRequest& req,
                       v1::ExplainResponse* resp) const;
  void Evict(const v1::EvictRequest& req, v1::EvictResponse* resp);
  void Clear(v1::ClearResponse* resp);
  void ListSessions(v1::ListSessionsResponse* resp) const;
  EventLog& events() { return events_; }

  // The pool a session may map through the attach socket: nullptr for an
  // unknown session, before the pool exists, or for a none pool.
  const gpu::PagePool* PoolForSession(absl::string_view session_id) const;

  // Releases every expired lease now; returns how many. The sweeper calls it.
  uint64_t SweepExpiredLeases();
  // Full tree consistency check (O(capacity)); OK before the pool exists.
  absl::Status CheckInvariants() const;
  uint64_t lease_expired_total() const {
    return lease_expired_.load(std::memory_order_relaxed);
  }
  uint64_t lease_abandoned_total() const {
    return lease_abandoned_.load(std::memory_order_relaxed);
  }

 private:
  struct NamespaceEntry {
    NamespaceId id = 0;
    NamespaceSpec spec;
    BlockKey root;
  };
  // The four ways a request can carry its prompt (AcquireRequest,
  // MatchRequest, ExplainRequest); every reference is into the request,
  // which outlives the call.
  struct PromptFields {
    const google::protobuf::RepeatedField<uint32_t>& tokens;
    const std::string& tokens_le;
    const google::protobuf::RepeatedPtrField<std::string>& block_keys;
    const std::string& block_keys_packed;
  };
  template <typename Request>
  static PromptFields FieldsOf(const Request& r) {
    return PromptFields{r.tokens(), r.tokens_le(), r.block_keys(),
                        r.block_keys_packed()};
  }
  // A validated prompt: either tokens or keys (key mode). Move-only in
  // effect: `tokens` may point into `tokens_copy`.
  struct Prompt {
    // The token ids: a view into the request (no copy), or into
    // `tokens_copy` when tokens_le's bytes are not 4-byte aligned. Empty in
    // key mode.
    absl::Span<const uint32_t> tokens;
    std::vector<uint32_t> tokens_copy;
    // One key per full block (filled by ResolveKeys in token mode). Points
    // into this thread's key scratch vector in both modes: valid until the
    // thread's next ValidatePrompt or ResolveKeys, so a Prompt never leaves
    // the thread or the call that made it.
    absl::Span<const BlockKey> keys;
    // Pages the token walk vouched for (keys' first entries); a view into
    // this thread's page scratch, like `keys`.
    absl::Span<const PageId> known_pages;
    uint64_t known_epoch = 0;  // AcquireRequest::known_epoch
    // Full blocks of the prompt; `keys` may cover fewer (ResolveKeys
    // without all_keys).
    uint32_t total_blocks = 0;
    // How ResolveKeys found the keys: from cached blocks' tokens, hashed.
    uint32_t walked_blocks = 0;
    uint32_t hashed_blocks = 0;
    bool key_mode = false;
  };

  absl::StatusOr<NamespaceSpec> ValidateNamespace(const v1::Namespace& ns) const;
  // Checks that exactly one prompt form is set and within the limits, and
  // views it without copying (see Prompt). Errors name the field and limit.
  absl::StatusOr<Prompt> ValidatePrompt(const PromptFields& f,
                                        uint32_t page_size) const;
  // Computes the block keys of a tokens prompt, trims the tokens to the
  // keyed blocks and sets total_blocks. With a tree (ns registered there),
  // RadixTree::ResolveTokenKeys: the leading blocks it can vouch for by
  // comparing tokens are not hashed, and without all_keys hashing stops at
  // the first block the tree does not hold (enough for a lookup; not for
  // allocating pages). Without one, every block is hashed from `root`.
  static void ResolveKeys(const BlockKey& root, uint32_t page_size,
                          const RadixTree* tree, NamespaceId ns, bool all_keys,
                          Prompt* p);
  // Adds a resolved prompt's walked/hashed block counts to the totals.
  void CountResolved(const Prompt& p);
  // Registers `spec`, creating pool and tree on first use.
  absl::StatusOr<NamespaceEntry> BindNamespace(const NamespaceSpec& spec);
  // The registered namespace with this root, if any.
  bool FindNamespace(const BlockKey& root, NamespaceEntry* out) const;
  void FillPoolInfo(v1::PoolInfo* info) const;
  RadixTree* tree() const { return tree_.load(std::memory_order_acquire); }
  // AcquireRequest.release_leases: at most kMaxReleaseLeases, distinct, each
  // owned by the session and live. Releases nothing.
  absl::Status CheckReleaseLeases(const v1::AcquireRequest& req);
  static constexpr int kMaxReleaseLeases = kMaxReleaseLeasesPerAcquire;
  // Commit/Release's ownership check: session_id is set and owns a live
  // lease. An expired lease is released here (and counted) before NOT_FOUND.
  absl::Status CheckLeaseOwner(absl::string_view session_id, LeaseId lease);
  void ReleaseLeases(const std::vector<LeaseId>& leases);
  void SweeperLoop();

  const CacheOptions options_;
  const absl::Time started_;
  EventLog events_;
  SessionManager sessions_;
  std::atomic<uint64_t> lease_expired_{0};
  std::atomic<uint64_t> lease_abandoned_{0};
  // Prompt::walked_blocks / hashed_blocks summed over Acquire and Match.
  std::atomic<uint64_t> walked_blocks_{0};
  std::atomic<uint64_t> hashed_blocks_{0};

  // ns_mu_ protects the following. tree_ and pool_ are published once (with
  // release ordering) and never change afterwards, so readers load them
  // without the lock.
  mutable absl::Mutex ns_mu_;
  std::unique_ptr<gpu::PagePool> pool_owner_ ABSL_GUARDED_BY(ns_mu_);
  std::unique_ptr<RadixTree> tree_owner_ ABSL_GUARDED_BY(ns_mu_);
  absl::flat_hash_map<BlockKey, NamespaceEntry> namespaces_
      ABSL_GUARDED_BY(ns_mu_);
  absl::flat_hash_map<NamespaceId, BlockKey> roots_ ABSL_GUARDED_BY(ns_mu_);
  std::string first_model_ ABSL_GUARDED_BY(ns_mu_);
  uint64_t first_page_bytes_ ABSL_GUARDED_BY(ns_mu_) = 0;
  std::atomic<const gpu::PagePool*> pool_{nullptr};
  std::atomic<RadixTree*> tree_{nullptr};

  absl::Mutex sweeper_mu_;
  bool stop_sweeper_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  std::thread sweeper_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_CACHE_H_
