// Tests of TenantScope (daemon/trust/tenant_scope.h) in-process: effective
// salts of the built-in and of a tenants file's tenants, the salts each
// caller is shown, ownership and visibility for workers and administrators,
// and the daemon's own Caller.
#include "daemon/trust/tenant_scope.h"

#include <string>

#include "daemon/trust/access_policy.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

// A tenant of a --tenants file, as AccessPolicy makes it.
Tenant FileTenant(const std::string& name, uint32_t account) {
  Tenant t;
  t.name = name;
  t.account = account;
  t.max_sessions = 3;
  t.max_namespaces = 2;
  t.salt_prefix = TenantScope::SaltPrefixFor(name);
  return t;
}

TEST(TenantScopeTest, TheBuiltInTenantKeepsClientSalts) {
  const TenantScope& daemon = Caller::Daemon().scope;
  EXPECT_EQ(daemon.name(), "default");
  EXPECT_TRUE(daemon.admin());
  EXPECT_EQ(daemon.account(), 0u);
  EXPECT_EQ(daemon.max_sessions(), 0u);
  EXPECT_EQ(daemon.max_namespaces(), 0u);
  EXPECT_EQ(daemon.EffectiveSalt(""), "");
  EXPECT_EQ(daemon.EffectiveSalt("s"), "s");
  EXPECT_EQ(daemon.VisibleSalt("s"), "s");
  EXPECT_EQ(Caller::Daemon().peer.transport,
            PeerIdentity::Transport::kInProcess);
  // A worker of the built-in tenant: the same salts, its own tenant only.
  const TenantScope worker(daemon.tenant(), /*admin=*/false);
  EXPECT_EQ(worker.EffectiveSalt("s"), "s");
  EXPECT_EQ(worker.VisibleSalt("s"), "s");
  EXPECT_TRUE(worker.Sees("default"));
  EXPECT_FALSE(worker.Sees("alpha"));
}

TEST(TenantScopeTest, AFileTenantsSaltsArePrefixedWithItsName) {
  EXPECT_EQ(TenantScope::SaltPrefixFor("alpha"), "tenant/alpha");
  const Tenant alpha_tenant = FileTenant("alpha", 1);
  const Tenant alphabet_tenant = FileTenant("alphabet", 2);
  const TenantScope alpha(alpha_tenant, /*admin=*/false);
  const TenantScope alphabet(alphabet_tenant, /*admin=*/false);
  EXPECT_EQ(alpha.name(), "alpha");
  EXPECT_EQ(alpha.account(), 1u);
  EXPECT_EQ(alpha.max_sessions(), 3u);
  EXPECT_EQ(alpha.max_namespaces(), 2u);
  EXPECT_EQ(alpha.EffectiveSalt(""), "tenant/alpha");
  EXPECT_EQ(alpha.EffectiveSalt("x"), "tenant/alpha/x");
  EXPECT_EQ(alpha.EffectiveSalt("x/y"), "tenant/alpha/x/y");
  // Two tenants never share a salt, even when a name is another's prefix.
  EXPECT_NE(alpha.EffectiveSalt("x"), alphabet.EffectiveSalt("x"));
  EXPECT_NE(alpha.EffectiveSalt("bet"), alphabet.EffectiveSalt(""));
  // A tenant is shown the salt it sent.
  EXPECT_EQ(alpha.VisibleSalt("tenant/alpha"), "");
  EXPECT_EQ(alpha.VisibleSalt("tenant/alpha/x"), "x");
  EXPECT_EQ(alpha.VisibleSalt("tenant/alpha/x/y"), "x/y");
}

TEST(TenantScopeTest, OwnershipAndVisibility) {
  const Tenant alpha_tenant = FileTenant("alpha", 1);
  const TenantScope alpha(alpha_tenant, /*admin=*/false);
  const TenantScope ops(alpha_tenant, /*admin=*/true);
  EXPECT_TRUE(alpha.Owns("alpha"));
  EXPECT_FALSE(alpha.Owns("beta"));
  EXPECT_FALSE(alpha.Owns("alphabet"));
  EXPECT_TRUE(alpha.Sees("alpha"));
  EXPECT_FALSE(alpha.Sees("beta"));
  EXPECT_FALSE(alpha.Sees("default"));
  // An administrator owns its own tenant's only, but sees every tenant,
  // with the salts as stored.
  EXPECT_TRUE(ops.Owns("alpha"));
  EXPECT_FALSE(ops.Owns("beta"));
  EXPECT_TRUE(ops.Sees("beta"));
  EXPECT_TRUE(ops.Sees("default"));
  EXPECT_EQ(ops.VisibleSalt("tenant/beta/x"), "tenant/beta/x");
  EXPECT_EQ(ops.VisibleSalt("tenant/alpha/x"), "tenant/alpha/x");
  // Its namespaces are still its tenant's.
  EXPECT_EQ(ops.EffectiveSalt("x"), "tenant/alpha/x");
}

TEST(TenantScopeTest, ACallerCarriesItsScope) {
  const Tenant beta_tenant = FileTenant("beta", 2);
  Caller c = Caller::Daemon();
  c.scope = TenantScope(beta_tenant, /*admin=*/false);
  EXPECT_EQ(c.scope.name(), "beta");
  EXPECT_FALSE(c.scope.admin());
  EXPECT_EQ(&c.scope.tenant(), &beta_tenant);
  // The daemon's own caller is unchanged by copies.
  EXPECT_EQ(Caller::Daemon().scope.name(), "default");
  EXPECT_TRUE(Caller::Daemon().scope.admin());
}

}  // namespace
}  // namespace radixkv::daemon
