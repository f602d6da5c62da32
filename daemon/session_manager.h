// File: daemon/session_manager.h
//
// SessionManager: who holds what. A session is one worker's attachment to one
// namespace and lives as long as its Session stream; a lease (a RadixTree
// LeaseId) belongs to exactly one session and carries an expiry time (the
// TTL backstop). This class only keeps the bookkeeping; the caller (Cache)
// releases the tree leases that RemoveSession / TakeExpired hand back.
//
// Ownership rules enforced here: a lease is usable only by the session that
// acquired it, and only before it expires. Anything else reads as NOT_FOUND,
// so a foreign or stale lease id reveals nothing.
//
// Thread safety: thread-safe; one internal mutex, never held while calling
// out.
#ifndef RADIXKV_DAEMON_SESSION_MANAGER_H_
#define RADIXKV_DAEMON_SESSION_MANAGER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

struct SessionManagerOptions {
  uint32_t max_sessions = 1024;
  uint32_t max_leases_per_session = 4096;
  absl::Duration lease_ttl = absl::Minutes(5);
};

// What a session is bound to; copied out to callers.
struct SessionBinding {
  NamespaceId ns = 0;
  BlockKey root;
  uint32_t page_size = 0;
};

struct SessionSnapshot {
  std::string id;
  std::string client_name;
  std::string peer;
  SessionBinding binding;
  int32_t device = 0;
  uint32_t leases = 0;
  absl::Time created;
};

class SessionManager {
 public:
  explicit SessionManager(const SessionManagerOptions& options);
  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  const SessionManagerOptions& options() const { return options_; }

  // Creates a session with a fresh random 128-bit hex id.
  // RESOURCE_EXHAUSTED when --max_sessions sessions are open.
  absl::StatusOr<std::string> Create(const SessionBinding& binding,
                                     absl::string_view client_name,
                                     absl::string_view peer, int32_t device);

  // Removes the session and returns its leases (the caller releases them).
  // Unknown ids return an empty list.
  std::vector<LeaseId> Remove(absl::string_view session_id);

  // The session's binding. INVALID_ARGUMENT for an empty id, NOT_FOUND for
  // an unknown one; RESOURCE_EXHAUSTED (with need_lease_slot) when the
  // session already holds --max_leases_per_session leases.
  absl::StatusOr<SessionBinding> Lookup(absl::string_view session_id,
                                        bool need_lease_slot) const;

  // Records `lease` as owned by the session, expiring after the TTL.
  // Returns the expiry, or NOT_FOUND if the session is gone (closed
  // concurrently) / RESOURCE_EXHAUSTED if the per-session limit was reached
  // meanwhile: the caller then releases the lease itself.
  absl::StatusOr<absl::Time> AddLease(absl::string_view session_id,
                                      LeaseId lease, absl::Time now);

  // OK when `lease` exists, belongs to `session_id` and has not expired.
  // NOT_FOUND otherwise (unknown, foreign or expired; an expired lease is
  // also reported through *expired so the caller can release it at once,
  // and is removed from the books).
  absl::Status CheckOwner(absl::string_view session_id, LeaseId lease,
                          absl::Time now, bool* expired);

  // Forgets `lease` (after Commit(release) / Release). Unknown: no-op.
  void RemoveLease(LeaseId lease);

  // Removes and returns every lease whose expiry is <= now.
  std::vector<LeaseId> TakeExpired(absl::Time now);

  size_t session_count() const;
  size_t lease_count() const;
  // Sessions bound to each namespace id.
  absl::flat_hash_map<NamespaceId, uint32_t> SessionsPerNamespace() const;
  std::vector<SessionSnapshot> List() const;
  // Whether the session exists (for the attach socket).
  bool Exists(absl::string_view session_id) const;

 private:
  struct Session {
    std::string client_name;
    std::string peer;
    SessionBinding binding;
    int32_t device = 0;
    absl::Time created;
    absl::flat_hash_set<LeaseId> leases;
  };
  struct Lease {
    std::string session_id;
    absl::Time expires;
  };

  const SessionManagerOptions options_;

  mutable absl::Mutex mu_;
  // mu_ protects the following.
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<LeaseId, Lease> leases_ ABSL_GUARDED_BY(mu_);
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_SESSION_MANAGER_H_
