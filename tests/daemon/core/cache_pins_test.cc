// Tests of daemon::Cache's prefix pins (daemon/core/cache_pins.cc) without
// gRPC: a pin keeps a tenant's cached prefix through Clear until Unpin; a
// tenant pins, sees and ends its own pins only; every refusal (quota, fair
// share, nothing cached, bad input, another tenant's pin) names the field
// and the limit and changes nothing.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/cache.h"
#include "gtest/gtest.h"
#include "radixkv/errors.h"
#include "tests/daemon/test_util.h"

namespace radixkv::testing {
namespace {

using daemon::Cache;
using daemon::CacheOptions;
using daemon::Caller;

class CachePinsTest : public ::testing::Test {
 protected:
  // A none pool of 64 pages of 4 tokens, tenants alpha (max_pin_pages 2)
  // and beta (no quota: its weighted share, 64 / 3 = 21 pages).
  CachePinsTest() {
    const std::string file = absl::StrCat(::testing::TempDir(), "/pins_test_",
                                          getpid(), "_tenants.json");
    std::ofstream(file) << R"({
      "tenants": [{"name": "alpha", "uids": [1001], "max_pin_pages": 2},
                  {"name": "beta", "uids": [1002]}],
      "admins": {"uids": [1000]}})";
    policy_ = daemon::AccessPolicy::Create({.tenants_file = file}).value();
    CacheOptions o;
    o.pool = gpu::ParsePoolSpec("none,pages=64").value();
    o.sweep_interval = absl::Hours(1);
    o.account_names.assign(1, "");
    o.account_limits.assign(1, AccountLimits{});
    for (const daemon::Tenant& t : policy_->tenants()) {
      o.account_names.push_back(t.name);
      o.account_limits.push_back({.max_pin_pages = t.max_pin_pages});
    }
    cache_ = std::make_unique<Cache>(o);
    alpha_ = Admit(1001);
    beta_ = Admit(1002);
  }
  ~CachePinsTest() override {
    EXPECT_TRUE(cache_->CheckInvariants().ok()) << cache_->CheckInvariants();
  }

  Caller Admit(uid_t uid) {
    daemon::PeerIdentity p;
    p.transport = daemon::PeerIdentity::Transport::kUnix;
    p.uid = uid;
    p.gid = uid;
    p.pid = getpid();
    p.address = "fd:9";
    return policy_->Admit(p).value();
  }
  // Opens a session of `c` and caches `tokens` through it.
  void Store(const Caller& c, const std::vector<uint32_t>& tokens) {
    v1::OpenSession open;
    *open.mutable_namespace_() = TestNamespace();
    v1::SessionInfo info;
    ASSERT_TRUE(cache_->OpenSession(open, c, &info).ok());
    v1::AcquireRequest acq;
    acq.set_session_id(info.session_id());
    SetTokens(&acq, tokens);
    acq.set_allocate(true);
    v1::AcquireResponse got;
    ASSERT_TRUE(cache_->Acquire(acq, &got, c).ok());
    v1::CommitRequest commit;
    commit.set_session_id(info.session_id());
    commit.set_lease_id(got.lease_id());
    commit.set_blocks(got.new_blocks());
    commit.set_release(true);
    v1::CommitResponse committed;
    ASSERT_TRUE(cache_->Commit(commit, &committed, c).ok());
    cache_->CloseSession(info.session_id());
  }
  absl::StatusOr<v1::PinResponse> Pin(const Caller& c,
                                      const std::vector<uint32_t>& tokens) {
    v1::PinRequest req;
    *req.mutable_namespace_() = TestNamespace();
    SetTokens(&req, tokens);
    v1::PinResponse resp;
    absl::Status s = cache_->Pin(req, &resp, c);
    if (!s.ok()) return s;
    return resp;
  }
  absl::Status Unpin(const Caller& c, uint64_t id) {
    v1::UnpinRequest req;
    req.set_pin_id(id);
    v1::UnpinResponse resp;
    return cache_->Unpin(req, &resp, c);
  }
  int Pins(const Caller& c) {
    v1::ListPinsResponse resp;
    cache_->ListPins(&resp, c);
    return resp.pins_size();
  }
  v1::Stats Stats() {
    v1::Stats s;
    cache_->GetStats(&s);
    s.clear_uptime_seconds();
    return s;
  }
  // Everything a refused call must leave as it was.
  std::string State() {
    v1::Stats s = Stats();
    return absl::StrCat(s.pins(), "/", s.pin_pages(), "/", s.pinned_pages(),
                        "/", s.cached_pages(), "/", s.leases());
  }

  std::unique_ptr<daemon::AccessPolicy> policy_;
  std::unique_ptr<Cache> cache_;
  Caller alpha_ = Caller::Daemon();
  Caller beta_ = Caller::Daemon();
};

TEST_F(CachePinsTest, APinKeepsItsPrefixThroughClearUntilUnpinned) {
  Store(alpha_, Tokens(12, 1));  // 3 blocks
  absl::StatusOr<v1::PinResponse> pin = Pin(alpha_, Tokens(9, 1));
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_EQ(pin->pinned_blocks(), 2u);
  EXPECT_EQ(pin->total_blocks(), 2u);
  EXPECT_EQ(pin->pinned_tokens(), 8u);
  EXPECT_NE(pin->pin_id(), 0u);

  v1::Stats s = Stats();
  EXPECT_EQ(s.pins(), 1u);
  EXPECT_EQ(s.pin_pages(), 2u);
  EXPECT_EQ(s.pinned_pages(), 2u);
  ASSERT_EQ(s.tenants_size(), 2);
  EXPECT_EQ(s.tenants(0).name(), "alpha");
  EXPECT_EQ(s.tenants(0).pin_pages(), 2u);
  EXPECT_EQ(s.tenants(0).pin_limit_pages(), 2u);
  EXPECT_EQ(s.tenants(1).pin_limit_pages(), 21u);

  v1::ClearResponse cleared;
  cache_->Clear(&cleared);
  EXPECT_EQ(cleared.removed(), 1u);
  EXPECT_EQ(cleared.pinned_remaining(), 2u);

  v1::ListPinsResponse list;
  cache_->ListPins(&list, alpha_);
  ASSERT_EQ(list.pins_size(), 1);
  EXPECT_EQ(list.pins(0).pin_id(), pin->pin_id());
  EXPECT_EQ(list.pins(0).tenant(), "alpha");
  EXPECT_EQ(list.pins(0).pinned_blocks(), 2u);
  EXPECT_EQ(list.pins(0).namespace_id(), pin->namespace_id());
  EXPECT_EQ(list.pins(0).last_key().size(), 16u);

  v1::UnpinRequest req;
  req.set_pin_id(pin->pin_id());
  v1::UnpinResponse unpinned;
  ASSERT_TRUE(cache_->Unpin(req, &unpinned, alpha_).ok());
  EXPECT_EQ(unpinned.unpinned_blocks(), 2u);
  EXPECT_EQ(Stats().pins(), 0u);
  cache_->Clear(&cleared);
  EXPECT_EQ(cleared.removed(), 2u);
}

TEST_F(CachePinsTest, ATenantSeesAndEndsItsOwnPinsOnly) {
  Store(alpha_, Tokens(8, 1));
  const uint64_t id = Pin(alpha_, Tokens(8, 1)).value().pin_id();
  EXPECT_EQ(Pins(alpha_), 1);
  EXPECT_EQ(Pins(beta_), 0);
  EXPECT_EQ(Pins(Caller::Daemon()), 1);  // an administrator sees every pin
  const std::string before = State();
  absl::Status s = Unpin(beta_, id);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(ErrorFieldOf(s), "pin_id");
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("no pin ", id)))
      << s;
  EXPECT_EQ(State(), before);
  // The same Namespace message names beta's own namespace (its salt),
  // where nothing of alpha's prompt is: alpha's blocks stay unpinned by
  // beta.
  Store(beta_, Tokens(4, 9));
  s = Pin(beta_, Tokens(8, 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(ErrorFieldOf(s), "tokens");
  EXPECT_TRUE(absl::StrContains(s.message(), "none of the prompt's 2 full "
                                             "blocks is cached"))
      << s;
  EXPECT_EQ(Stats().pins(), 1u);
  EXPECT_TRUE(Unpin(alpha_, id).ok());
  EXPECT_EQ(Unpin(alpha_, id).code(), absl::StatusCode::kNotFound);
}

TEST_F(CachePinsTest, AQuotaOrShareRefusesThePinWholeAndChangesNothing) {
  Store(alpha_, Tokens(12, 1));
  const std::string before = State();
  absl::Status s = Pin(alpha_, Tokens(12, 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(ErrorFieldOf(s), "pins");
  EXPECT_EQ(ErrorReasonOf(s), v1::ERROR_REASON_LIMIT);
  EXPECT_TRUE(absl::StrContains(
      s.message(), "tenant alpha: its pins would hold 3 pages, its limit is "
                   "2 (max_pin_pages"))
      << s;
  EXPECT_EQ(State(), before);

  // beta has no quota of its own: its weighted share bounds it.
  Store(beta_, Tokens(88, 2));  // 22 blocks
  const std::string before_beta = State();
  s = Pin(beta_, Tokens(88, 2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(ErrorFieldOf(s), "pins");
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "tenant beta: its pins would hold 22 pages, "
                                "its weighted share of the pool is 21"))
      << s;
  EXPECT_EQ(State(), before_beta);
  EXPECT_TRUE(Pin(beta_, Tokens(84, 2)).ok());
}

TEST_F(CachePinsTest, BadInputIsRefusedNamingTheField) {
  Store(alpha_, Tokens(8, 1));
  const std::string before = State();
  v1::PinResponse resp;
  {
    v1::PinRequest req;  // no namespace: page_size 0
    SetTokens(&req, Tokens(8, 1));
    absl::Status s = cache_->Pin(req, &resp, alpha_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StartsWith(ErrorFieldOf(s), "namespace")) << s;
  }
  {
    v1::PinRequest req;  // no prompt
    *req.mutable_namespace_() = TestNamespace();
    absl::Status s = cache_->Pin(req, &resp, alpha_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  {
    v1::PinRequest req;  // a namespace no session bound
    *req.mutable_namespace_() = TestNamespace(4, "other-model");
    SetTokens(&req, Tokens(8, 1));
    absl::Status s = cache_->Pin(req, &resp, alpha_);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_EQ(ErrorFieldOf(s), "namespace");
  }
  EXPECT_EQ(Unpin(alpha_, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Unpin(alpha_, 12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(State(), before);
}

}  // namespace
}  // namespace radixkv::testing
