#include "daemon/trust/tenant_scope.h"

#include <cassert>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/trust/access_policy.h"

namespace radixkv::daemon {
namespace {

constexpr absl::string_view kSaltPrefix = "tenant/";

// Whether `effective_salt` is `prefix` or `prefix` + "/" + more; sets *rest
// to the client's part.
bool SplitSalt(absl::string_view prefix, absl::string_view effective_salt,
               absl::string_view* rest) {
  absl::string_view s = effective_salt;
  if (!absl::ConsumePrefix(&s, prefix)) return false;
  if (!s.empty() && !absl::ConsumePrefix(&s, "/")) return false;
  *rest = s;
  return true;
}

}  // namespace

TenantScope::TenantScope(const Tenant& tenant, bool admin)
    : tenant_(&tenant), admin_(admin) {
  // A tenant's namespaces carry its own prefix, or none (the built-in one).
  assert(!tenant.name.empty() &&
         (tenant.salt_prefix.empty() ||
          tenant.salt_prefix == SaltPrefixFor(tenant.name)));
}

const std::string& TenantScope::name() const { return tenant_->name; }
uint32_t TenantScope::account() const { return tenant_->account; }
uint32_t TenantScope::max_sessions() const { return tenant_->max_sessions; }
uint32_t TenantScope::max_namespaces() const {
  return tenant_->max_namespaces;
}

std::string TenantScope::EffectiveSalt(std::string client_salt) const {
  const std::string& prefix = tenant_->salt_prefix;
  if (prefix.empty()) return client_salt;
  if (client_salt.empty()) return prefix;
  return absl::StrCat(prefix, "/", client_salt);
}

std::string TenantScope::VisibleSalt(absl::string_view effective_salt) const {
  const std::string& prefix = tenant_->salt_prefix;
  if (admin_ || prefix.empty()) return std::string(effective_salt);
  absl::string_view client;
  const bool own = SplitSalt(prefix, effective_salt, &client);
  // A tenant is shown its own namespaces only (Sees).
  assert(own && "VisibleSalt: another tenant's namespace");
  return std::string(own ? client : effective_salt);
}

bool TenantScope::Owns(absl::string_view owner) const {
  return owner == tenant_->name;
}

std::string TenantScope::SaltPrefixFor(absl::string_view name) {
  // Names are [A-Za-z0-9._-]+ (access_policy.cc), so no '/' in them.
  assert(!name.empty() && !absl::StrContains(name, '/'));
  return absl::StrCat(kSaltPrefix, name);
}

}  // namespace radixkv::daemon
