// Tests of NamespaceRegistry (daemon/core/namespace_registry.h) in-process: the
// pool and tree made by the first bind, the same entry for an equal spec,
// the layout checks (page_bytes, --max_pool_pages), the tenant recorded on
// each namespace and its quota, forgetting unused namespaces, and a pool
// hook that fails.
#include "daemon/core/namespace_registry.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "daemon/trust/access_policy.h"
#include "daemon/trust/tenant_scope.h"
#include "gtest/gtest.h"
#include "radix/block_key.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

// 1 layer x 2 (K, V) x 1 head x page_size 4 x head_dim 8 x 4 bytes = 256.
NamespaceSpec Spec(std::string salt = "", uint32_t head_dim = 8,
                   uint32_t page_size = 4) {
  NamespaceSpec s;
  s.model = "m";
  s.cache_salt = std::move(salt);
  s.num_layers = 1;
  s.num_kv_heads = 1;
  s.head_dim = head_dim;
  s.page_size = page_size;
  s.dtype = DType::kFloat32;
  return s;
}

// The daemon's own scope: the built-in tenant, administrator.
const TenantScope& kDaemon = Caller::Daemon().scope;

// A tenant of a --tenants file, as AccessPolicy makes it.
Tenant FileTenant(std::string name, uint32_t account,
                  uint32_t max_namespaces = 0) {
  Tenant t;
  t.salt_prefix = TenantScope::SaltPrefixFor(name);
  t.name = std::move(name);
  t.account = account;
  t.max_namespaces = max_namespaces;
  return t;
}

RegistryOptions HostPool(uint64_t bytes) {
  RegistryOptions o;
  o.pool.backend = gpu::Backend::kHost;
  o.pool.bytes = bytes;
  return o;
}

RegistryOptions NonePool(uint64_t pages) {
  RegistryOptions o;
  o.pool.backend = gpu::Backend::kNone;
  o.pool.pages = pages;
  return o;
}

TEST(NamespaceRegistryTest, TheFirstBindMakesPoolAndTree) {
  NamespaceRegistry r(HostPool(64 * 256));
  EXPECT_EQ(r.tree(), nullptr);
  EXPECT_EQ(r.pool(), nullptr);
  v1::PoolInfo before;
  r.FillPoolInfo(&before);
  EXPECT_EQ(before.backend(), "host");
  EXPECT_EQ(before.capacity_pages(), 0u);

  const absl::StatusOr<NamespaceEntry> a = r.Bind(Spec(), kDaemon);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(r.tree(), nullptr);
  ASSERT_NE(r.pool(), nullptr);
  EXPECT_EQ(r.tree()->capacity(), 64u);
  EXPECT_EQ(r.pool()->page_bytes(), 256u);
  EXPECT_EQ(a->root, NamespaceRoot(Spec()));
  v1::PoolInfo info;
  r.FillPoolInfo(&info);
  EXPECT_EQ(info.page_bytes(), 256u);
  EXPECT_EQ(info.capacity_pages(), 64u);

  // An equal spec: the same entry; another with the same layout: a new id.
  const absl::StatusOr<NamespaceEntry> again = r.Bind(Spec(), kDaemon);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id, a->id);
  const absl::StatusOr<NamespaceEntry> b = r.Bind(Spec("b"), kDaemon);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->id, a->id);
  NamespaceEntry found;
  ASSERT_TRUE(r.Find(b->root, &found));
  EXPECT_EQ(found.id, b->id);
  EXPECT_EQ(found.spec, Spec("b"));
  EXPECT_FALSE(r.Find(NamespaceRoot(Spec("c")), &found));
  const auto roots = r.Roots();
  EXPECT_EQ(roots.size(), 2u);
  EXPECT_EQ(roots.at(a->id), a->root);
  EXPECT_EQ(roots.at(b->id), b->root);
  const std::vector<NamespaceEntry> same = r.WithPageSize(4, a->root);
  ASSERT_EQ(same.size(), 1u);
  EXPECT_EQ(same[0].id, b->id);
  EXPECT_TRUE(r.WithPageSize(8, a->root).empty());
}

TEST(NamespaceRegistryTest, AnotherLayoutIsRefusedNamingBothSizes) {
  NamespaceRegistry r(HostPool(64 * 256));
  ASSERT_TRUE(r.Bind(Spec(), kDaemon).ok());
  const absl::StatusOr<NamespaceEntry> other =
      r.Bind(Spec("", /*head_dim=*/16), kDaemon);
  EXPECT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
  EXPECT_EQ(ErrorFieldOf(other.status()), "namespace");
  const std::string m(other.status().message());
  EXPECT_NE(m.find("page_bytes 512"), std::string::npos) << m;
  EXPECT_NE(m.find("pool's page_bytes 256"), std::string::npos) << m;
  EXPECT_NE(m.find("model 'm'"), std::string::npos) << m;
  EXPECT_EQ(r.Roots().size(), 1u);  // nothing recorded
}

TEST(NamespaceRegistryTest, PoolPageBytesFromTheFlag) {
  RegistryOptions o = HostPool(64 * 256);
  o.pool.page_bytes = 512;
  NamespaceRegistry r(o);
  const absl::StatusOr<NamespaceEntry> a = r.Bind(Spec(), kDaemon);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_NE(a.status().message().find("set by --pool ... page_bytes="),
            std::string::npos)
      << a.status();
  EXPECT_EQ(r.tree(), nullptr);  // nothing created
  ASSERT_TRUE(r.Bind(Spec("", 16), kDaemon).ok());
}

TEST(NamespaceRegistryTest, TooManyPagesForMaxPoolPages) {
  RegistryOptions o = HostPool(1 << 20);  // 4096 pages of 256 bytes
  o.max_pool_pages = 1024;
  NamespaceRegistry r(o);
  const absl::StatusOr<NamespaceEntry> a = r.Bind(Spec(), kDaemon);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_EQ(ErrorFieldOf(a.status()), "namespace");
  EXPECT_EQ(ErrorReasonOf(a.status()), v1::ERROR_REASON_LIMIT);
  EXPECT_NE(a.status().message().find("into 4096 pages, more than "
                                      "--max_pool_pages=1024"),
            std::string::npos)
      << a.status();
  EXPECT_EQ(r.tree(), nullptr);
}

TEST(NamespaceRegistryTest, AMemoryPoolNeedsACompleteLayout) {
  NamespaceRegistry r(HostPool(1 << 16));
  NamespaceSpec s = Spec();
  s.head_dim = 0;
  const absl::StatusOr<NamespaceEntry> a = r.Bind(s, kDaemon);
  EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
  EXPECT_EQ(ErrorFieldOf(a.status()), "namespace");
  EXPECT_NE(a.status().message().find("page_bytes would be 0"),
            std::string::npos);
}

TEST(NamespaceRegistryTest, ANonePoolHasPagesButNoMemory) {
  NamespaceRegistry r(NonePool(16));
  v1::PoolInfo info;
  r.FillPoolInfo(&info);
  EXPECT_EQ(info.backend(), "none");
  EXPECT_EQ(info.capacity_pages(), 16u);
  NamespaceSpec incomplete = Spec();
  incomplete.num_layers = 0;  // index only: no layout needed
  const absl::StatusOr<NamespaceEntry> a = r.Bind(incomplete, kDaemon);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(r.tree()->capacity(), 16u);
  // Another page_size than the tree's token storage: refused by the tree,
  // reported on the namespace.
  NamespaceSpec other = incomplete;
  other.page_size = 8;
  const absl::StatusOr<NamespaceEntry> b = r.Bind(other, kDaemon);
  EXPECT_TRUE(absl::IsFailedPrecondition(b.status())) << b.status();
  EXPECT_EQ(ErrorFieldOf(b.status()), "namespace");
  EXPECT_EQ(b.status().message().rfind("namespace: ", 0), 0u) << b.status();
}

TEST(NamespaceRegistryTest, TenantQuotaCountsTheNamespacesRecordedAsItsOwn) {
  NamespaceRegistry r(NonePool(16));
  const Tenant a_tenant = FileTenant("a", 0, /*max_namespaces=*/2);
  const Tenant ab_tenant = FileTenant("ab", 0);
  const TenantScope q(a_tenant, /*admin=*/false);
  const TenantScope ab(ab_tenant, /*admin=*/false);
  const absl::StatusOr<NamespaceEntry> first = r.Bind(Spec("tenant/a"), q);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->tenant, "a");
  const absl::StatusOr<NamespaceEntry> other = r.Bind(Spec("tenant/ab"), ab);
  ASSERT_TRUE(other.ok()) << other.status();  // not a's: another tenant
  EXPECT_EQ(other->tenant, "ab");
  ASSERT_TRUE(r.Bind(Spec("tenant/a/x"), q).ok());
  ASSERT_TRUE(r.Bind(Spec("tenant/a/x"), q).ok());  // bound again: no new one
  const absl::flat_hash_map<NamespaceId, std::string> tenants = r.Tenants();
  ASSERT_EQ(tenants.size(), 3u);
  EXPECT_EQ(tenants.at(first->id), "a");
  EXPECT_EQ(tenants.at(other->id), "ab");
  const absl::StatusOr<NamespaceEntry> third = r.Bind(Spec("tenant/a/y"), q);
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_EQ(ErrorFieldOf(third.status()), "namespace");
  EXPECT_EQ(ErrorReasonOf(third.status()), v1::ERROR_REASON_LIMIT);
  EXPECT_EQ(third.status().message(),
            "namespace: tenant a has 2 namespaces, its limit max_namespaces=2 "
            "(--tenants) is reached");
  // Once a namespace of a's is unbound and empty, the bind makes room.
  r.Unbind(NamespaceRoot(Spec("tenant/a")));
  const absl::StatusOr<NamespaceEntry> now = r.Bind(Spec("tenant/a/y"), q);
  ASSERT_TRUE(now.ok()) << now.status();
  NamespaceEntry e;
  EXPECT_FALSE(r.Find(NamespaceRoot(Spec("tenant/a")), &e));
}

TEST(NamespaceRegistryTest, ForgetUnusedKeepsBoundNamespaces) {
  NamespaceRegistry r(NonePool(16));
  EXPECT_EQ(r.ForgetUnused(), 0u);  // no tree yet
  const NamespaceEntry a = r.Bind(Spec("a"), kDaemon).value();
  const NamespaceEntry b = r.Bind(Spec("b"), kDaemon).value();
  r.Bind(Spec("b"), kDaemon).value();  // b bound twice
  EXPECT_EQ(r.ForgetUnused(), 0u);
  r.Unbind(a.root);
  r.Unbind(b.root);
  r.Unbind(NamespaceRoot(Spec("zz")));  // never bound: nothing happens
  EXPECT_EQ(r.ForgetUnused(), 1u);      // a; b is still bound once
  NamespaceEntry e;
  EXPECT_FALSE(r.Find(a.root, &e));
  EXPECT_TRUE(r.Find(b.root, &e));
  EXPECT_EQ(r.Roots().size(), 1u);
  r.Unbind(b.root);
  EXPECT_EQ(r.ForgetUnused(), 1u);
  EXPECT_TRUE(r.Roots().empty());
  // Bound again, it is registered afresh.
  ASSERT_TRUE(r.Bind(Spec("a"), kDaemon).ok());
  EXPECT_TRUE(r.Find(a.root, &e));
}

TEST(NamespaceRegistryTest, AFailingPoolHookFailsTheBindUntilItSucceeds) {
  RegistryOptions o = HostPool(64 * 256);
  int calls = 0;
  o.on_pool_created = [&](const gpu::PagePool& pool) {
    ++calls;
    EXPECT_EQ(pool.page_bytes(), 256u);
    return calls == 1 ? absl::UnavailableError("tier not ready")
                      : absl::OkStatus();
  };
  NamespaceRegistry r(o);
  const absl::StatusOr<NamespaceEntry> first = r.Bind(Spec(), kDaemon);
  EXPECT_TRUE(absl::IsUnavailable(first.status())) << first.status();
  EXPECT_EQ(r.tree(), nullptr);
  EXPECT_EQ(r.pool(), nullptr);
  ASSERT_TRUE(r.Bind(Spec(), kDaemon).ok());
  EXPECT_EQ(calls, 2);
  ASSERT_NE(r.tree(), nullptr);
}

TEST(NamespaceRegistryTest, AccountLimitsReachTheTree) {
  RegistryOptions o = NonePool(16);
  o.account_limits = {AccountLimits{}, AccountLimits{.max_pinned_pages = 1}};
  NamespaceRegistry r(o);
  const Tenant t_tenant = FileTenant("t", /*account=*/1);
  const NamespaceEntry a =
      r.Bind(Spec("tenant/t"), TenantScope(t_tenant, /*admin=*/false))
          .value();
  EXPECT_EQ(a.tenant, "t");
  RadixTree* t = r.tree();
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(
      t->Acquire({.ns = a.id, .tokens = {1, 2, 3, 4}, .allocate = true}).ok());
  const absl::StatusOr<AcquireResult> second =
      t->Acquire({.ns = a.id, .tokens = {5, 6, 7, 8}, .allocate = true});
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
}

}  // namespace
}  // namespace radixkv::daemon
