// File: daemon/trust/access_policy.h
//
// AccessPolicy: which tenant a verified peer (peer_identity.h) belongs to
// and whether it is an administrator. The operator decides both; a client
// can only narrow them (its cache_salt partitions within its tenant).
//
// Without a tenants file there is one tenant, "default", that every peer
// allowed to connect belongs to, with no quotas; cache salts are used as
// the client sends them, so block keys are exactly the contract's. With
// --tenants=FILE (JSON):
//
//   {
//     "tenants": [
//       {"name": "alpha", "uids": [1001], "gids": [2001],
//        "subjects": ["worker-alpha"],
//        "max_sessions": 64, "max_namespaces": 8,
//        "max_cached_pages": 4096, "max_pinned_pages": 1024,
//        "max_pin_pages": 256, "weight": 2},
//       {"name": "beta", "uids": [1002]}
//     ],
//     "admins": {"uids": [1000], "gids": [], "subjects": ["ops"]},
//     "unmatched": "refuse"
//   }
//
// A peer belongs to the first tenant that lists its uid, one of its groups
// (primary or supplementary) or its certificate identity. "unmatched" is
// "refuse" (the default: every call is PERMISSION_DENIED) or the name of a
// tenant that takes everyone else. Each tenant's namespaces get the
// effective cache_salt "tenant/<name>" (or "tenant/<name>/<client salt>"),
// so two tenants never share a block even when they send the same salt
// (the convention is TenantScope's, tenant_scope.h).
// A quota of 0 (or absent) means no limit besides the daemon-wide ones.
// Page quotas and eviction: each tenant's namespaces share one account of
// the radix tree, so when the pool is full the tenant holding the most
// cached pages per unit of `weight` (default 1) loses its least recently
// used block first, a tenant at max_cached_pages recycles its own, and one
// whose leases hold max_pinned_pages gets no more (RadixTree's
// AccountLimits). max_pin_pages bounds the pages its prefix pins
// (Admin.Pin) hold together; pins never exceed its weighted share of the
// pool either.
//
// Administrators: uid 0 and the daemon's own uid on the Unix socket, peers
// whose gid or a supplementary group is in --admin_gids, certificate
// identities in --admin_subjects, and the file's "admins". Plaintext TCP
// peers are never administrators.
//
// Thread safety: immutable after Create; thread-safe.
#ifndef RADIXKV_DAEMON_TRUST_ACCESS_POLICY_H_
#define RADIXKV_DAEMON_TRUST_ACCESS_POLICY_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/trust/peer_identity.h"
#include "daemon/trust/tenant_scope.h"

namespace radixkv::daemon {

struct PeerMatcher {
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  std::vector<std::string> subjects;
  bool Matches(const PeerIdentity& peer) const;
};

struct Tenant {
  std::string name;
  PeerMatcher members;
  // 0: no limit of this kind for the tenant.
  uint32_t max_sessions = 0;
  uint32_t max_namespaces = 0;
  // The tree account its namespaces belong to (RadixTree accounts): i + 1
  // for the i-th tenant of a --tenants file; 0 without one (a single
  // account, plain LRU) and for the daemon's own calls. max_cached_pages,
  // max_pinned_pages, max_pin_pages and weight become the account's
  // AccountLimits.
  uint32_t account = 0;
  uint32_t max_cached_pages = 0;
  uint32_t max_pinned_pages = 0;
  uint32_t max_pin_pages = 0;
  uint32_t weight = 1;
  // The salt prefix of its namespaces: TenantScope::SaltPrefixFor(name) for
  // a tenant of a --tenants file, empty for the built-in "default". The
  // daemon reads it through TenantScope only.
  std::string salt_prefix;
};

struct AccessOptions {
  // --tenants: the JSON file above; empty for the single default tenant.
  std::string tenants_file;
  // --admin_gids, --admin_subjects.
  std::vector<gid_t> admin_gids;
  std::vector<std::string> admin_subjects;
  // The daemon's effective uid (trusted as administrator on Unix).
  uid_t self_uid = 0;
};

// A call's peer once admitted, and the tenant scope (tenant and role) it
// acts in. Every Cache call names one; there is no default.
struct Caller {
  PeerIdentity peer;
  TenantScope scope;

  // The daemon's own calls (its start-up hooks, and the in-process tests,
  // fuzzers and benchmarks of Cache): an in-process peer, administrator,
  // in the built-in "default" tenant (salts as sent, account 0, no limits).
  // Used by name only where the daemon itself is the caller.
  static const Caller& Daemon();
};

class AccessPolicy {
 public:
  // Reads and checks the tenants file. INVALID_ARGUMENT naming --tenants and
  // the JSON path of the bad entry (unknown key, duplicate name, bad type,
  // an "unmatched" tenant that does not exist).
  static absl::StatusOr<std::unique_ptr<AccessPolicy>> Create(
      const AccessOptions& options);

  // The caller's tenant and role. PERMISSION_DENIED, naming the peer, when
  // no tenant takes it.
  absl::StatusOr<Caller> Admit(const PeerIdentity& peer) const;

  bool has_tenants_file() const { return !options_.tenants_file.empty(); }
  const std::vector<Tenant>& tenants() const { return tenants_; }
  // The tree accounts the tenants need: 1 + tenants with a tenants file,
  // else 1.
  uint32_t accounts() const {
    return has_tenants_file() ? static_cast<uint32_t>(tenants_.size()) + 1 : 1;
  }

 private:
  explicit AccessPolicy(AccessOptions options) : options_(std::move(options)) {}
  absl::Status Load();
  bool IsAdmin(const PeerIdentity& peer) const;

  const AccessOptions options_;
  std::vector<Tenant> tenants_;
  PeerMatcher admins_;
  int unmatched_ = -1;  // index into tenants_, -1: refuse
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TRUST_ACCESS_POLICY_H_
