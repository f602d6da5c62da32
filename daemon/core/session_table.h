// File: daemon/core/session_table.h
//
// SessionTable: who is attached. A session is one worker's attachment to
// one namespace and lives as long as its Session stream. Each session has a
// random 128-bit id (the worker's handle) and an owner id, unique for the
// daemon's lifetime, under which the radix tree records the session's
// leases. The leases themselves live only in the tree (RadixTree's lease
// records carry owner and expiry); this table keeps no copy of them.
//
// A session is bound to the verified peer that opened it
// (PeerIdentity::SameParty): its id is a handle, not a credential, and a
// call from any other peer is PERMISSION_DENIED.
//
// Thread safety: thread-safe; one internal mutex, never held while calling
// out.
#ifndef RADIXKV_DAEMON_CORE_SESSION_TABLE_H_
#define RADIXKV_DAEMON_CORE_SESSION_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/trust/access_policy.h"
#include "daemon/trust/peer_identity.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

// What a session is bound to.
struct SessionBinding {
  NamespaceId ns = 0;
  BlockKey root;
  uint32_t page_size = 0;
};

// A session as callers see it (copied out).
struct SessionEntry {
  std::string id;
  OwnerId owner = kNoOwner;
  SessionBinding binding;
  std::string client_name;
  PeerIdentity peer;
  // The opener's tenant (TenantScope::name), recorded at Create.
  std::string tenant;
  int32_t device = 0;
  absl::Time created;
};

// Session-count limits checked atomically with the insert (0: none).
struct SessionLimits {
  uint32_t per_peer = 0;    // by PeerIdentity::Principal (--max_sessions_per_peer)
  uint32_t per_tenant = 0;  // the tenant's max_sessions
};

// What a request needs of its session.
struct SessionRef {
  OwnerId owner = kNoOwner;
  SessionBinding binding;
};

class SessionTable {
 public:
  explicit SessionTable(uint32_t max_sessions);
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  // Creates a session of `caller` with a fresh random id and owner id.
  // RESOURCE_EXHAUSTED naming the limit (--max_sessions,
  // --max_sessions_per_peer, the tenant's max_sessions) when one is reached.
  absl::StatusOr<SessionEntry> Create(const SessionBinding& binding,
                                      absl::string_view client_name,
                                      const Caller& caller, int32_t device,
                                      const SessionLimits& limits);

  // Removes the session; returns its owner id (kNoOwner for an unknown id,
  // so removing twice is harmless) and, with `removed`, the whole entry.
  OwnerId Remove(absl::string_view session_id, SessionEntry* removed = nullptr);

  // The session's owner and binding, for a call from `peer`.
  // INVALID_ARGUMENT for an empty id, NOT_FOUND for an unknown one,
  // PERMISSION_DENIED when another peer opened it; all name the field
  // session_id and carry an ErrorDetail.
  absl::StatusOr<SessionRef> Lookup(absl::string_view session_id,
                                    const PeerIdentity& peer) const;
  // The whole entry; false for an unknown id.
  bool Get(absl::string_view session_id, SessionEntry* out) const;

  size_t size() const;
  std::vector<SessionEntry> List() const;
  // Sessions bound to each namespace id.
  absl::flat_hash_map<NamespaceId, uint32_t> SessionsPerNamespace() const;
  bool Exists(absl::string_view session_id) const;

 private:
  const uint32_t max_sessions_;

  mutable absl::Mutex mu_;
  // mu_ protects the following.
  absl::flat_hash_map<std::string, SessionEntry> sessions_ ABSL_GUARDED_BY(mu_);
  OwnerId next_owner_ ABSL_GUARDED_BY(mu_) = kNoOwner + 1;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_CORE_SESSION_TABLE_H_
