// Tests of AccessPolicy (daemon/trust/access_policy.h) in-process: the tenants
// file's checks as one table (every bad file: INVALID_ARGUMENT naming
// --tenants and the JSON path), tenant and administrator matching for each
// transport, "unmatched", accounts and quotas, and the effective salts.
#include "daemon/trust/access_policy.h"

#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "radix/radix_tree.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

// Writes `text` to a fresh file under the test's temporary directory.
std::string WriteFile(const std::string& text) {
  static int n = 0;
  const std::string path = absl::StrCat(testing::TempDir(), "/tenants_",
                                        getpid(), "_", n++, ".json");
  std::ofstream(path) << text;
  return path;
}

absl::StatusOr<std::unique_ptr<AccessPolicy>> FromText(
    const std::string& text, AccessOptions options = {}) {
  options.tenants_file = WriteFile(text);
  return AccessPolicy::Create(options);
}

PeerIdentity Unix(uid_t uid, gid_t gid, std::vector<gid_t> groups = {},
                  pid_t pid = 1234) {
  PeerIdentity p;
  p.transport = PeerIdentity::Transport::kUnix;
  p.uid = uid;
  p.gid = gid;
  p.groups = std::move(groups);
  p.pid = pid;
  p.address = "fd:9";
  return p;
}

PeerIdentity Tls(std::string subject) {
  PeerIdentity p;
  p.transport = PeerIdentity::Transport::kTls;
  p.subject = std::move(subject);
  p.address = "ipv4:10.0.0.1:5555";
  return p;
}

PeerIdentity Tcp() {
  PeerIdentity p;
  p.transport = PeerIdentity::Transport::kTcp;
  p.address = "ipv4:10.0.0.2:6666";
  return p;
}

TEST(AccessPolicyFileTest, BadFilesNameTheFlagAndThePath) {
  struct Case {
    std::string text;
    std::string want;  // a part of the message
  };
  std::string too_many = R"({"tenants": [)";
  for (uint32_t i = 0; i < kMaxAccounts; ++i) {
    absl::StrAppend(&too_many, i ? "," : "", R"({"name": "t)", i, R"("})");
  }
  too_many += "]}";
  const std::vector<Case> cases = {
      {"not json", ": not valid JSON"},
      {"[]", "$: must be an object"},
      {R"({"tenants": []})", "$.tenants: must be a non-empty array"},
      {R"({"tenants": {}})", "$.tenants: must be a non-empty array"},
      {R"({"admins": {}})", "$.tenants: must be a non-empty array"},
      {R"({"tenants": [{"name": "a"}], "x": 1})", "$.x: unknown key"},
      {R"({"tenants": [{"name": "a", "uid": [1]}]})",
       "$.tenants[0].uid: unknown key"},
      {R"({"tenants": ["a"]})", "$.tenants[0]: must be an object"},
      {R"({"tenants": [{"uids": [1]}]})",
       "$.tenants[0].name: required: 1 to 64 characters of [A-Za-z0-9._-]"},
      {R"({"tenants": [{"name": "a b"}]})", "$.tenants[0].name: required"},
      {R"({"tenants": [{"name": ""}]})", "$.tenants[0].name: required"},
      {absl::StrCat(R"({"tenants": [{"name": ")", std::string(65, 'x'),
                    R"("}]})"),
       "$.tenants[0].name: required"},
      {R"({"tenants": [{"name": 7}]})", "$.tenants[0].name: required"},
      {R"({"tenants": [{"name": "a"}, {"name": "a"}]})",
       R"($.tenants[1].name: "a" is listed twice)"},
      {R"({"tenants": [{"name": "a", "uids": 1}]})",
       "$.tenants[0].uids: must be an array"},
      {R"({"tenants": [{"name": "a", "uids": [-1]}]})",
       "$.tenants[0].uids[0]: must be a non-negative integer"},
      {R"({"tenants": [{"name": "a", "gids": [1, "2"]}]})",
       "$.tenants[0].gids[1]: must be a non-negative integer"},
      {R"({"tenants": [{"name": "a", "subjects": [""]}]})",
       "$.tenants[0].subjects[0]: must be a non-empty string"},
      {R"({"tenants": [{"name": "a", "max_cached_pages": -1}]})",
       "$.tenants[0].max_cached_pages: must be an integer in 0..4294967295"},
      {R"({"tenants": [{"name": "a", "max_sessions": 4294967296}]})",
       "$.tenants[0].max_sessions: must be an integer in 0..4294967295"},
      {R"({"tenants": [{"name": "a", "max_namespaces": "8"}]})",
       "$.tenants[0].max_namespaces: must be an integer"},
      {R"({"tenants": [{"name": "a", "max_pinned_pages": 1.5}]})",
       "$.tenants[0].max_pinned_pages: must be an integer"},
      {R"({"tenants": [{"name": "a", "max_pin_pages": -1}]})",
       "$.tenants[0].max_pin_pages: must be an integer in 0..4294967295"},
      {R"({"tenants": [{"name": "a", "weight": 0}]})",
       "$.tenants[0].weight: must be at least 1"},
      {too_many, absl::StrCat("more than ", kMaxAccounts - 1, " tenants")},
      {R"({"tenants": [{"name": "a"}], "admins": []})",
       "$.admins: must be an object"},
      {R"({"tenants": [{"name": "a"}], "admins": {"pids": [1]}})",
       "$.admins.pids: unknown key"},
      {R"({"tenants": [{"name": "a"}], "admins": {"uids": ["root"]}})",
       "$.admins.uids[0]: must be a non-negative integer"},
      {R"({"tenants": [{"name": "a"}], "unmatched": "b"})",
       R"($.unmatched: "b" is not a tenant listed in $.tenants)"},
      {R"({"tenants": [{"name": "a"}], "unmatched": 0})",
       R"($.unmatched: must be "refuse" or the name of a tenant)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text.substr(0, 80));
    AccessOptions o;
    o.tenants_file = WriteFile(c.text);
    const absl::StatusOr<std::unique_ptr<AccessPolicy>> p =
        AccessPolicy::Create(o);
    ASSERT_FALSE(p.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
    const std::string m(p.status().message());
    EXPECT_EQ(m.rfind(absl::StrCat("--tenants=", o.tenants_file, ": "), 0), 0u)
        << m;
    EXPECT_NE(m.find(c.want), std::string::npos)
        << "want '" << c.want << "' in: " << m;
  }
}

TEST(AccessPolicyFileTest, AMissingFileIsRefused) {
  AccessOptions o;
  o.tenants_file = absl::StrCat(testing::TempDir(), "/no/such/tenants.json");
  const absl::StatusOr<std::unique_ptr<AccessPolicy>> p =
      AccessPolicy::Create(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            absl::StrCat("--tenants=", o.tenants_file, ": cannot be read"));
}

TEST(AccessPolicyFileTest, AGoodFileIsReadWhole) {
  const auto p = FromText(R"({
    "tenants": [
      {"name": "alpha", "uids": [1001], "gids": [2001],
       "subjects": ["worker-alpha"], "max_sessions": 64, "max_namespaces": 8,
       "max_cached_pages": 4096, "max_pinned_pages": 1024,
       "max_pin_pages": 256, "weight": 2},
      {"name": "beta.B-2_x", "uids": [1002]}
    ],
    "admins": {"uids": [1000], "gids": [], "subjects": ["ops"]},
    "unmatched": "refuse"
  })");
  ASSERT_TRUE(p.ok()) << p.status();
  const AccessPolicy& a = **p;
  EXPECT_TRUE(a.has_tenants_file());
  ASSERT_EQ(a.tenants().size(), 2u);
  EXPECT_EQ(a.accounts(), 3u);
  const Tenant& alpha = a.tenants()[0];
  EXPECT_EQ(alpha.name, "alpha");
  EXPECT_EQ(alpha.account, 1u);
  EXPECT_EQ(alpha.salt_prefix, "tenant/alpha");
  EXPECT_EQ(alpha.max_sessions, 64u);
  EXPECT_EQ(alpha.max_namespaces, 8u);
  EXPECT_EQ(alpha.max_cached_pages, 4096u);
  EXPECT_EQ(alpha.max_pinned_pages, 1024u);
  EXPECT_EQ(alpha.max_pin_pages, 256u);
  EXPECT_EQ(alpha.weight, 2u);
  EXPECT_EQ(alpha.members.uids, (std::vector<uid_t>{1001}));
  EXPECT_EQ(alpha.members.gids, (std::vector<gid_t>{2001}));
  EXPECT_EQ(alpha.members.subjects, (std::vector<std::string>{"worker-alpha"}));
  const Tenant& beta = a.tenants()[1];
  EXPECT_EQ(beta.account, 2u);
  EXPECT_EQ(beta.weight, 1u);        // default
  EXPECT_EQ(beta.max_sessions, 0u);  // no limit
}

TEST(AccessPolicyTest, WithoutAFileEveryVerifiedPeerIsTheDefaultTenant) {
  const auto p = AccessPolicy::Create({.self_uid = 500});
  ASSERT_TRUE(p.ok()) << p.status();
  const AccessPolicy& a = **p;
  EXPECT_FALSE(a.has_tenants_file());
  EXPECT_EQ(a.accounts(), 1u);
  for (const PeerIdentity& peer :
       {Unix(1001, 1001), Tls("anyone"), Tcp(), PeerIdentity::InProcess()}) {
    SCOPED_TRACE(peer.ToString());
    const absl::StatusOr<Caller> c = a.Admit(peer);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->scope.name(), "default");
    EXPECT_EQ(c->scope.account(), 0u);
    EXPECT_TRUE(c->scope.tenant().salt_prefix.empty());
  }
  // Administrators: uid 0 and the daemon's own uid on Unix, in-process.
  EXPECT_TRUE(a.Admit(Unix(0, 0))->scope.admin());
  EXPECT_TRUE(a.Admit(Unix(500, 7))->scope.admin());
  EXPECT_FALSE(a.Admit(Unix(501, 7))->scope.admin());
  EXPECT_TRUE(a.Admit(PeerIdentity::InProcess())->scope.admin());
  EXPECT_FALSE(a.Admit(Tcp())->scope.admin());
  EXPECT_FALSE(a.Admit(Tls("ops"))->scope.admin());
  // Salts are the client's own, and every peer is of the one tenant.
  const TenantScope worker = a.Admit(Unix(501, 7))->scope;
  EXPECT_EQ(worker.EffectiveSalt("s"), "s");
  EXPECT_EQ(worker.VisibleSalt("anything"), "anything");
  EXPECT_TRUE(worker.Owns(a.Admit(Tcp())->scope.name()));
}

TEST(AccessPolicyTest, AnUnverifiedUnixConnectionIsRefused) {
  const auto p = AccessPolicy::Create({});
  ASSERT_TRUE(p.ok());
  const absl::StatusOr<Caller> c =
      (*p)->Admit(Unix(static_cast<uid_t>(-1), static_cast<gid_t>(-1), {}, -1));
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
  EXPECT_EQ(ErrorFieldOf(c.status()), "peer");
  EXPECT_EQ(ErrorReasonOf(c.status()), v1::ERROR_REASON_PERMISSION_DENIED);
  EXPECT_NE(c.status().message().find("fd:9 has no verified credentials"),
            std::string::npos)
      << c.status();
}

class TenantsTest : public testing::Test {
 protected:
  void Load(const std::string& unmatched = "refuse",
            AccessOptions options = {}) {
    constexpr absl::string_view kTenants = R"(
      "tenants": [
        {"name": "alpha", "uids": [1001], "gids": [2001],
         "subjects": ["worker-alpha"]},
        {"name": "beta", "uids": [1002, 1001], "subjects": ["worker-beta"]}
      ],
      "admins": {"uids": [1000], "gids": [3000], "subjects": ["ops"]})";
    auto p = FromText(
        absl::StrCat("{", kTenants, R"(, "unmatched": ")", unmatched, "\"}"),
        options);
    ASSERT_TRUE(p.ok()) << p.status();
    policy_ = *std::move(p);
  }
  std::string TenantOf(const PeerIdentity& peer) {
    const absl::StatusOr<Caller> c = policy_->Admit(peer);
    return c.ok() ? c->scope.name() : std::string(c.status().message());
  }
  std::unique_ptr<AccessPolicy> policy_;
};

TEST_F(TenantsTest, APeerBelongsToTheFirstTenantThatListsIt) {
  Load();
  EXPECT_EQ(TenantOf(Unix(1001, 5)), "alpha");  // listed by both: the first
  EXPECT_EQ(TenantOf(Unix(1002, 5)), "beta");
  EXPECT_EQ(TenantOf(Unix(7, 2001)), "alpha");          // primary group
  EXPECT_EQ(TenantOf(Unix(7, 5, {9, 2001})), "alpha");  // supplementary
  EXPECT_EQ(TenantOf(Tls("worker-beta")), "beta");
  EXPECT_EQ(TenantOf(Tls("worker-alpha")), "alpha");
  // Unix credentials do not match subjects, nor a subject uids.
  const PeerIdentity stranger = Unix(7, 5);
  const absl::StatusOr<Caller> c = policy_->Admit(stranger);
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
  EXPECT_EQ(ErrorFieldOf(c.status()), "peer");
  EXPECT_NE(c.status().message().find("belongs to no tenant in --tenants="),
            std::string::npos);
  EXPECT_TRUE(absl::IsPermissionDenied(policy_->Admit(Tls("")).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(policy_->Admit(Tls("1001")).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(policy_->Admit(Tcp()).status()));
}

TEST_F(TenantsTest, UnmatchedNamesTheTenantThatTakesEveryoneElse) {
  Load("beta");
  EXPECT_EQ(TenantOf(Unix(7, 5)), "beta");
  EXPECT_EQ(TenantOf(Tcp()), "beta");
  EXPECT_EQ(TenantOf(Unix(1001, 5)), "alpha");
  EXPECT_EQ(TenantOf(PeerIdentity::InProcess()), "beta");
}

TEST_F(TenantsTest, AdministratorsAndTheirTenant) {
  Load("refuse",
       {.admin_gids = {4000}, .admin_subjects = {"root-ca"}, .self_uid = 999});
  const auto admin = [&](const PeerIdentity& p) {
    const absl::StatusOr<Caller> c = policy_->Admit(p);
    return c.ok() && c->scope.admin();
  };
  EXPECT_TRUE(admin(Unix(0, 0)));
  EXPECT_TRUE(admin(Unix(999, 5)));        // the daemon's uid
  EXPECT_TRUE(admin(Unix(7, 4000)));       // --admin_gids
  EXPECT_TRUE(admin(Unix(7, 5, {4000})));  // a supplementary group
  EXPECT_TRUE(admin(Unix(1000, 5)));       // the file's admins.uids
  EXPECT_TRUE(admin(Unix(7, 3000)));       // the file's admins.gids
  EXPECT_TRUE(admin(Tls("root-ca")));      // --admin_subjects
  EXPECT_TRUE(admin(Tls("ops")));          // the file's admins.subjects
  EXPECT_FALSE(admin(Unix(1001, 5)));      // a tenant, not an admin
  EXPECT_FALSE(admin(Tls("worker-alpha")));
  // An administrator no tenant lists gets the first tenant.
  EXPECT_EQ(TenantOf(Unix(1000, 5)), "alpha");
  EXPECT_EQ(TenantOf(Tls("ops")), "alpha");
  // Plaintext TCP is never an administrator, nor a tenant here.
  EXPECT_TRUE(absl::IsPermissionDenied(policy_->Admit(Tcp()).status()));
}

TEST_F(TenantsTest, SaltsSeparateTenants) {
  Load();
  // The scopes Admit hands out: alpha's and beta's workers.
  const TenantScope alpha = policy_->Admit(Unix(1001, 5))->scope;
  const TenantScope beta = policy_->Admit(Unix(1002, 5))->scope;
  ASSERT_EQ(alpha.name(), "alpha");
  ASSERT_EQ(beta.name(), "beta");
  EXPECT_EQ(alpha.EffectiveSalt(""), "tenant/alpha");
  EXPECT_EQ(alpha.EffectiveSalt("x"), "tenant/alpha/x");
  EXPECT_NE(alpha.EffectiveSalt("x"), beta.EffectiveSalt("x"));
  EXPECT_EQ(alpha.VisibleSalt("tenant/alpha/x"), "x");
  EXPECT_EQ(alpha.VisibleSalt("tenant/alpha"), "");
  EXPECT_TRUE(alpha.Owns("alpha"));
  EXPECT_FALSE(alpha.Owns("beta"));
  EXPECT_FALSE(alpha.Sees("beta"));
  // An administrator is shown effective salts and sees every tenant.
  const TenantScope ops = policy_->Admit(Tls("ops"))->scope;
  EXPECT_EQ(ops.VisibleSalt("tenant/beta/y"), "tenant/beta/y");
  EXPECT_TRUE(ops.Sees("beta"));
}

TEST(PeerMatcherTest, MatchesByTransport) {
  PeerMatcher m{.uids = {10}, .gids = {20}, .subjects = {"s"}};
  EXPECT_TRUE(m.Matches(Unix(10, 1)));
  EXPECT_TRUE(m.Matches(Unix(1, 20)));
  EXPECT_TRUE(m.Matches(Unix(1, 1, {3, 20})));
  EXPECT_FALSE(m.Matches(Unix(1, 1, {3})));
  EXPECT_FALSE(m.Matches(Unix(10, 1, {}, -1)));  // unverified connection
  EXPECT_TRUE(m.Matches(Tls("s")));
  EXPECT_FALSE(m.Matches(Tls("")));
  EXPECT_FALSE(m.Matches(Tcp()));
  EXPECT_FALSE(m.Matches(PeerIdentity::InProcess()));
}

}  // namespace
}  // namespace radixkv::daemon
