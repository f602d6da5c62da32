// File: daemon/trust/tenant_scope.h
//
// TenantScope: the tenant a call acts in and whether its caller administers
// every tenant. It is the one owner of the tenancy convention; the access
// policy (which tenant a peer gets), the namespace registry (who bound a
// namespace, and tenant quotas) and the inspection calls (what a caller may
// see) all go through it. Nothing outside tenant_scope.cc composes, parses
// or compares cache salts.
//
//   - EffectiveSalt: the cache_salt a namespace the caller names is stored
//     under. A tenant of a --tenants file gets "tenant/<name>" or
//     "tenant/<name>/<client salt>", so two tenants never share a block even
//     when they send the same salt; the built-in tenant ("default", no
//     tenants file) keeps the client's salt as sent.
//   - VisibleSalt: the salt to show the caller for a namespace it sees: a
//     tenant sees the salt it sent, an administrator the stored one.
//   - Owns / Sees: whether a namespace, session, tree node or tenant's
//     statistics, owned by the tenant recorded when it was made, is the
//     caller's tenant's (Owns) or visible to the caller (Sees:
//     administrators see every tenant). Ownership is recorded, never
//     re-derived from salts: the registry stores the binder's name() on
//     each namespace, the session table on each session.
//
// Invariants: a tenant's salt prefix is empty (the built-in tenant only) or
// SaltPrefixFor(its name); tenant names contain no '/', so an effective salt
// names one tenant, and a namespace root (a hash over the effective salt) is
// bound by one tenant only.
//
// Thread safety: a value type, immutable once made, so thread-safe. The
// Tenant it refers to is immutable and must outlive the scope (the
// AccessPolicy's tenants, or the built-in one of Caller::Daemon(), which
// lives for the process).
#ifndef RADIXKV_DAEMON_TRUST_TENANT_SCOPE_H_
#define RADIXKV_DAEMON_TRUST_TENANT_SCOPE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace radixkv::daemon {

struct Tenant;  // access_policy.h

class TenantScope {
 public:
  // Acts in `tenant`; `admin`: the caller administers every tenant.
  TenantScope(const Tenant& tenant, bool admin);

  const Tenant& tenant() const { return *tenant_; }
  const std::string& name() const;
  bool admin() const { return admin_; }
  // The tree account of the tenant's namespaces (Tenant::account).
  uint32_t account() const;
  // The tenant's quotas; 0: no limit of that kind.
  uint32_t max_sessions() const;
  uint32_t max_namespaces() const;

  // The cache_salt under which the namespace this caller names with
  // `client_salt` is stored (and its root and block keys computed).
  std::string EffectiveSalt(std::string client_salt) const;
  // The cache_salt this caller is shown for a namespace stored under
  // `effective_salt` that it Sees: as stored for an administrator, as its
  // tenant sent it otherwise.
  std::string VisibleSalt(absl::string_view effective_salt) const;
  // Whether `owner`, a tenant name recorded from a scope's name(), is this
  // scope's tenant.
  bool Owns(absl::string_view owner) const;
  // Whether this caller may see what tenant `owner` owns: its own tenant's,
  // or every tenant's for an administrator.
  bool Sees(absl::string_view owner) const { return admin_ || Owns(owner); }

  // The salt prefix of the namespaces of a --tenants file's tenant `name`.
  static std::string SaltPrefixFor(absl::string_view name);

 private:
  const Tenant* tenant_;  // never null
  bool admin_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TRUST_TENANT_SCOPE_H_
