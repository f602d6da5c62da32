// Tests of daemon::Cache (daemon/core/cache.h) without gRPC: every bad input
// gets a clear, structured error and changes nothing; sessions own their
// leases; limits and expiry; what each tenant's callers reach and see. The
// gRPC layer has a thin smoke test of its own (server_ops_test.cc).
#include "daemon/core/cache.h"
#include "daemon/tiers/disk_tier.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "radixkv/errors.h"
#include "tests/daemon/test_util.h"

namespace radixkv::testing {
namespace {

using daemon::Cache;
using daemon::Caller;
using daemon::CacheOptions;

class CacheTest : public ::testing::Test {
 public:  // lambdas in the table-driven test call the helpers
  // A small none pool; `tweak` may change any option first.
  void Start(const std::function<void(CacheOptions&)>& tweak = {}) {
    CacheOptions o;
    o.pool = gpu::ParsePoolSpec("none,pages=64").value();
    o.sweep_interval = absl::Hours(1);  // tests sweep by hand
    if (tweak) tweak(o);
    cache_ = std::make_unique<Cache>(o);
  }
  ~CacheTest() override {
    if (cache_ != nullptr) {
      EXPECT_TRUE(cache_->CheckInvariants().ok()) << cache_->CheckInvariants();
    }
  }

  std::string Open(const v1::Namespace& ns = TestNamespace()) {
    v1::OpenSession open;
    *open.mutable_namespace_() = ns;
    v1::SessionInfo info;
    absl::Status s = cache_->OpenSession(open, Caller::Daemon(), &info);
    EXPECT_TRUE(s.ok()) << s;
    return info.session_id();
  }
  absl::StatusOr<v1::AcquireResponse> Acquire(
      const std::string& session, const std::vector<uint32_t>& tokens,
      const std::vector<uint64_t>& release = {}) {
    v1::AcquireRequest req;
    req.set_session_id(session);
    SetTokens(&req, tokens);
    req.set_allocate(true);
    for (uint64_t l : release) req.add_release_leases(l);
    v1::AcquireResponse resp;
    absl::Status s = cache_->Acquire(req, &resp, Caller::Daemon());
    if (!s.ok()) return s;
    return resp;
  }
  absl::Status Commit(const std::string& session, uint64_t lease,
                      uint32_t blocks, bool release) {
    v1::CommitRequest req;
    req.set_session_id(session);
    req.set_lease_id(lease);
    req.set_blocks(blocks);
    req.set_release(release);
    v1::CommitResponse resp;
    return cache_->Commit(req, &resp, Caller::Daemon());
  }
  absl::Status Release(const std::string& session, uint64_t lease) {
    v1::ReleaseRequest req;
    req.set_session_id(session);
    req.set_lease_id(lease);
    return cache_->Release(req, Caller::Daemon());
  }
  v1::Stats Stats() {
    v1::Stats s;
    cache_->GetStats(&s);
    s.clear_uptime_seconds();
    return s;
  }

  std::unique_ptr<Cache> cache_;
};

struct BadCase {
  const char* name;
  absl::StatusCode code;
  const char* message;  // must appear in the message
  const char* field;    // the ErrorDetail's field
  std::function<absl::Status(CacheTest*)> call;
};

// Every case of the bad-input table: the code, a message naming the field
// and the limit, an ErrorDetail naming the field, and nothing changed.
TEST_F(CacheTest, BadInputTable) {
  Start([](CacheOptions& o) {
    o.max_prompt_tokens = 64;
    o.max_string_bytes = 16;
    o.max_page_size = 32;
  });
  const std::string sid = Open();
  const std::string other = Open();
  absl::StatusOr<v1::AcquireResponse> held = Acquire(other, Tokens(8, 70));
  ASSERT_TRUE(held.ok()) << held.status();
  const uint64_t foreign = held->lease_id();
  ASSERT_NE(foreign, 0u);

  using Fill = std::function<void(v1::AcquireRequest*)>;
  auto acquire = [](const std::string& session_id, const Fill& fill) {
    return [session_id, fill](CacheTest* t) {
      v1::AcquireRequest req;
      req.set_session_id(session_id);
      req.set_allocate(true);
      fill(&req);
      v1::AcquireResponse resp;
      return t->cache_->Acquire(req, &resp, Caller::Daemon());
    };
  };
  auto match = [](const std::function<void(v1::MatchRequest*)>& fill) {
    return [fill](CacheTest* t) {
      v1::MatchRequest req;
      *req.mutable_namespace_() = TestNamespace();
      SetTokens(&req, Tokens(8, 1));
      fill(&req);
      v1::MatchResponse resp;
      return t->cache_->Match(req, &resp, Caller::Daemon());
    };
  };
  auto open = [](const std::function<void(v1::OpenSession*)>& fill) {
    return [fill](CacheTest* t) {
      v1::OpenSession o;
      *o.mutable_namespace_() = TestNamespace();
      fill(&o);
      v1::SessionInfo info;
      return t->cache_->OpenSession(o, Caller::Daemon(), &info);
    };
  };
  auto tokens8 = [](v1::AcquireRequest* r) { SetTokens(r, Tokens(8, 1)); };
  using C = absl::StatusCode;
  const std::vector<BadCase> cases = {
      {"no session", C::kInvalidArgument, "session_id", "session_id",
       acquire("", tokens8)},
      {"unknown session", C::kNotFound, "session_id", "session_id",
       acquire("00000000000000000000000000000000", tokens8)},
      {"empty tokens", C::kInvalidArgument, "tokens", "tokens",
       acquire(sid, [](auto*) {})},
      {"too many tokens", C::kInvalidArgument, "--max_prompt_tokens=64",
       "tokens", acquire(sid, [](auto* r) { SetTokens(r, Tokens(65, 1)); })},
      {"tokens and keys", C::kInvalidArgument, "block_keys",
       "tokens, tokens_le, block_keys, block_keys_packed",
       acquire(sid,
               [](auto* r) {
                 SetTokens(r, Tokens(8, 1));
                 r->add_block_keys(std::string(16, 'k'));
               })},
      {"key mode disabled", C::kFailedPrecondition, "--allow_key_mode",
       "block_keys",
       acquire(sid, [](auto* r) { r->add_block_keys(std::string(16, 'k')); })},
      {"packed key mode disabled", C::kFailedPrecondition, "block_keys_packed",
       "block_keys_packed",
       acquire(sid,
               [](auto* r) { r->set_block_keys_packed(std::string(32, 'k')); })},
      {"tokens_le not a multiple of 4", C::kInvalidArgument,
       "tokens_le: 7 bytes is not a multiple of 4", "tokens_le",
       acquire(sid, [](auto* r) { r->set_tokens_le(std::string(7, '\1')); })},
      {"too many tokens_le", C::kInvalidArgument, "--max_prompt_tokens=64",
       "tokens_le",
       acquire(sid, [](auto* r) { SetTokensLe(r, Tokens(65, 1)); })},
      {"tokens and tokens_le", C::kInvalidArgument,
       "tokens, tokens_le, block_keys, block_keys_packed: set exactly one",
       "tokens, tokens_le, block_keys, block_keys_packed",
       acquire(sid,
               [](auto* r) {
                 SetTokens(r, Tokens(8, 1));
                 SetTokensLe(r, Tokens(8, 1));
               })},
      {"tokens_le and block_keys_packed", C::kInvalidArgument,
       "set exactly one", "tokens, tokens_le, block_keys, block_keys_packed",
       acquire(sid,
               [](auto* r) {
                 SetTokensLe(r, Tokens(8, 1));
                 r->set_block_keys_packed(std::string(32, 'k'));
               })},
      {"block_keys and block_keys_packed", C::kInvalidArgument,
       "set exactly one", "tokens, tokens_le, block_keys, block_keys_packed",
       acquire(sid,
               [](auto* r) {
                 r->add_block_keys(std::string(16, 'k'));
                 r->set_block_keys_packed(std::string(16, 'k'));
               })},
      {"match tokens and tokens_le", C::kInvalidArgument, "tokens_le",
       "tokens, tokens_le, block_keys, block_keys_packed",
       match([](auto* r) { SetTokensLe(r, Tokens(8, 1)); })},
      {"match tokens_le bad size", C::kInvalidArgument, "tokens_le: 5 bytes",
       "tokens_le",
       match([](auto* r) {
         r->clear_tokens();
         r->set_tokens_le(std::string(5, '\0'));
       })},
      {"explain tokens_le bad size", C::kInvalidArgument, "tokens_le: 9 bytes",
       "tokens_le",
       [](CacheTest* t) {
         v1::ExplainRequest req;
         *req.mutable_namespace_() = TestNamespace();
         req.set_tokens_le(std::string(9, '\0'));
         v1::ExplainResponse resp;
         return t->cache_->Explain(req, &resp, Caller::Daemon());
       }},
      {"dump limit", C::kInvalidArgument, "limit: 10001", "limit",
       [](CacheTest* t) {
         v1::DumpTreeRequest req;
         req.set_limit(10001);
         v1::DumpTreeResponse resp;
         return t->cache_->DumpTree(req, &resp, Caller::Daemon());
       }},
      {"commit unknown lease", C::kNotFound, "lease_id", "lease_id",
       [sid](CacheTest* t) { return t->Commit(sid, 987654321, 1, true); }},
      {"commit foreign lease", C::kNotFound, "lease_id", "lease_id",
       [sid, foreign](CacheTest* t) { return t->Commit(sid, foreign, 1, true); }},
      {"release foreign lease", C::kNotFound, "lease_id", "lease_id",
       [sid, foreign](CacheTest* t) { return t->Release(sid, foreign); }},
      {"acquire releasing a foreign lease", C::kNotFound, "release_leases",
       "release_leases",
       acquire(sid,
               [foreign](auto* r) {
                 SetTokens(r, Tokens(8, 1));
                 r->add_release_leases(foreign);
               })},
      {"acquire releasing an unknown lease", C::kNotFound, "release_leases",
       "release_leases",
       acquire(sid,
               [](auto* r) {
                 SetTokens(r, Tokens(8, 1));
                 r->add_release_leases(987654321);
               })},
      {"acquire releasing a lease twice", C::kInvalidArgument,
       "release_leases", "release_leases",
       acquire(sid,
               [](auto* r) {
                 SetTokens(r, Tokens(8, 1));
                 r->add_release_leases(5);
                 r->add_release_leases(5);
               })},
      {"acquire releasing too many leases", C::kInvalidArgument, "at most 64",
       "release_leases",
       acquire(sid,
               [](auto* r) {
                 SetTokens(r, Tokens(8, 1));
                 for (uint64_t i = 1; i <= 65; ++i) r->add_release_leases(i);
               })},
      {"commit without session", C::kInvalidArgument, "session_id",
       "session_id",
       [foreign](CacheTest* t) { return t->Commit("", foreign, 1, true); }},
      {"commit more than allocated", C::kFailedPrecondition, "blocks",
       "blocks",
       [other, foreign](CacheTest* t) {
         return t->Commit(other, foreign, 3, false);
       }},
      {"match page_size 0", C::kInvalidArgument, "namespace.page_size",
       "namespace.page_size",
       match([](auto* r) { r->mutable_namespace_()->set_page_size(0); })},
      {"match page_size too big", C::kInvalidArgument, "--max_page_size",
       "namespace.page_size",
       match([](auto* r) { r->mutable_namespace_()->set_page_size(33); })},
      {"match model too long", C::kInvalidArgument, "namespace.model",
       "namespace.model",
       match([](auto* r) {
         r->mutable_namespace_()->set_model(std::string(17, 'm'));
       })},
      {"match tp_rank", C::kInvalidArgument, "namespace.tp_rank",
       "namespace.tp_rank",
       match([](auto* r) {
         r->mutable_namespace_()->set_tp_rank(2);
         r->mutable_namespace_()->set_tp_size(2);
       })},
      {"match unknown dtype", C::kInvalidArgument, "namespace.dtype",
       "namespace.dtype",
       match([](auto* r) {
         r->mutable_namespace_()->set_dtype(static_cast<v1::DType>(99));
       })},
      {"open unsupported key version", C::kInvalidArgument,
       "block_key_version", "open.block_key_version",
       open([](auto* o) { o->set_block_key_version(2); })},
      {"open without namespace", C::kInvalidArgument, "open.namespace",
       "open.namespace", open([](auto* o) { o->clear_namespace_(); })},
      {"open page_bytes mismatch", C::kFailedPrecondition, "page_bytes",
       "namespace",
       open([](auto* o) { o->mutable_namespace_()->set_num_layers(2); })},
      {"open client_name too long", C::kInvalidArgument, "open.client_name",
       "open.client_name",
       open([](auto* o) { o->set_client_name(std::string(17, 'c')); })},
  };
  const v1::Stats before = Stats();
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const absl::Status s = c.call(this);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos)
        << "message does not name '" << c.message << "': " << s;
    EXPECT_EQ(ErrorFieldOf(s), c.field) << s;
    EXPECT_NE(ErrorReasonOf(s), v1::ERROR_REASON_UNSPECIFIED) << s;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before,
                                                                   Stats()))
        << "stats changed:\n" << before.DebugString() << "\nvs\n"
        << Stats().DebugString();
  }
  // The foreign lease still works for its owner.
  EXPECT_TRUE(Commit(other, foreign, 2, true).ok());
}

TEST_F(CacheTest, LeasesBelongToTheirSession) {
  Start([](CacheOptions& o) { o.sessions.max_leases_per_session = 2; });
  const std::string a = Open();
  const std::string b = Open();
  absl::StatusOr<v1::AcquireResponse> l1 = Acquire(a, Tokens(8, 1));
  ASSERT_TRUE(l1.ok()) << l1.status();
  // b sees no such lease, and it stays a's.
  absl::Status s = Release(b, l1->lease_id());
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(ErrorReasonOf(s), v1::ERROR_REASON_LEASE_NOT_FOUND);
  EXPECT_EQ(ErrorFieldOf(s), "lease_id");
  EXPECT_NE(s.message().find("--lease_ttl"), std::string::npos) << s;
  s = Commit(b, l1->lease_id(), 1, true);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  // The per-session limit counts a's leases only; ending one in the same
  // Acquire makes room.
  absl::StatusOr<v1::AcquireResponse> l2 = Acquire(a, Tokens(8, 2));
  ASSERT_TRUE(l2.ok());
  absl::StatusOr<v1::AcquireResponse> l3 = Acquire(a, Tokens(8, 3));
  EXPECT_TRUE(absl::IsResourceExhausted(l3.status())) << l3.status();
  EXPECT_EQ(ErrorReasonOf(l3.status()), v1::ERROR_REASON_LIMIT);
  EXPECT_NE(l3.status().message().find("--max_leases_per_session=2"),
            std::string::npos)
      << l3.status();
  EXPECT_TRUE(Acquire(b, Tokens(8, 4)).ok());
  l3 = Acquire(a, Tokens(8, 3), {l2->lease_id()});
  ASSERT_TRUE(l3.ok()) << l3.status();
  v1::ListSessionsResponse sessions;
  cache_->ListSessions(&sessions, Caller::Daemon());
  ASSERT_EQ(sessions.sessions_size(), 2);
  for (const v1::SessionEntry& e : sessions.sessions()) {
    EXPECT_EQ(e.leases(), e.session_id() == a ? 2u : 1u);
  }
  // Closing a ends exactly a's leases.
  EXPECT_EQ(Stats().leases(), 3u);
  cache_->CloseSession(a);
  cache_->CloseSession(a);  // twice is harmless
  EXPECT_EQ(Stats().leases(), 1u);
  EXPECT_TRUE(absl::IsNotFound(Release(a, l1->lease_id())));
}

// Acknowledgements of lost sessions, in an open or a heartbeat: at most 64
// ids of at most --max_string_bytes each; more is INVALID_ARGUMENT naming
// the field and the limit, and nothing is opened or acknowledged.
TEST_F(CacheTest, AcknowledgementsAreBounded) {
  Start([](CacheOptions& o) { o.max_string_bytes = 16; });
  google::protobuf::RepeatedPtrField<std::string> ids;
  for (int i = 0; i < 65; ++i) *ids.Add() = absl::StrCat("s", i);
  absl::Status s = cache_->AcknowledgeSessions(ids, Caller::Daemon());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("heartbeat.acknowledge_sessions"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("at most 64"), std::string::npos) << s;
  google::protobuf::RepeatedPtrField<std::string> longer;
  *longer.Add() = std::string(17, 'x');
  s = cache_->AcknowledgeSessions(longer, Caller::Daemon());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("heartbeat.acknowledge_sessions[0]"),
            std::string::npos) << s;
  v1::OpenSession open;
  *open.mutable_namespace_() = TestNamespace();
  *open.mutable_acknowledge_sessions() = ids;
  v1::SessionInfo info;
  s = cache_->OpenSession(open, Caller::Daemon(), &info);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("open.acknowledge_sessions"), std::string::npos) << s;
  EXPECT_EQ(Stats().sessions(), 0u);
  EXPECT_EQ(Stats().namespaces(), 0u);
}

TEST_F(CacheTest, SessionsAreBounded) {
  Start([](CacheOptions& o) { o.sessions.max_sessions = 2; });
  Open();
  Open();
  v1::OpenSession open;
  *open.mutable_namespace_() = TestNamespace();
  v1::SessionInfo info;
  absl::Status s = cache_->OpenSession(open, Caller::Daemon(), &info);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("--max_sessions=2"), std::string::npos) << s;
  EXPECT_EQ(ErrorReasonOf(s), v1::ERROR_REASON_LIMIT);
}

TEST_F(CacheTest, ExpiredLeasesEndAndCarriedOnesAreNamed) {
  Start([](CacheOptions& o) { o.sessions.lease_ttl = absl::Milliseconds(20); });
  const std::string a = Open();
  absl::StatusOr<v1::AcquireResponse> l1 = Acquire(a, Tokens(8, 1));
  absl::StatusOr<v1::AcquireResponse> l2 = Acquire(a, Tokens(8, 2));
  ASSERT_TRUE(l1.ok() && l2.ok());
  EXPECT_GT(l1->lease_expires_unix_ms(), 0);
  absl::SleepFor(absl::Milliseconds(40));
  // A carried lease that expired is ended: its owner names it, so it is
  // done with it (for a fenced pool, this acknowledges the expiry).
  absl::StatusOr<v1::AcquireResponse> r = Acquire(a, Tokens(8, 3), {l1->lease_id()});
  ASSERT_TRUE(r.ok()) << r.status();
  // A lease of another session, or one already ended, is still named.
  absl::StatusOr<v1::AcquireResponse> gone =
      Acquire(a, Tokens(8, 4), {l1->lease_id()});
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
  EXPECT_EQ(ErrorFieldOf(gone.status()), "release_leases");
  EXPECT_EQ(ErrorReasonOf(gone.status()), v1::ERROR_REASON_LEASE_NOT_FOUND);
  // A Commit on an expired lease ends it and says so.
  absl::Status s = Commit(a, l2->lease_id(), 2, true);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_NE(s.message().find("expired"), std::string::npos) << s;
  EXPECT_EQ(cache_->lease_expired_total(), 2u);  // l1 and l2
  absl::SleepFor(absl::Milliseconds(40));
  EXPECT_EQ(cache_->SweepExpiredLeases(), 1u);  // r's
  EXPECT_EQ(cache_->lease_expired_total(), 3u);
  const v1::Stats st = Stats();
  EXPECT_EQ(st.leases(), 0u);
  EXPECT_EQ(st.writing_pages(), 0u);
  EXPECT_EQ(st.lease_expired(), 3u);
}

// A first client with a tiny layout cannot fix the pool's page size to one
// that divides it into millions of pages (gigabytes of index): it is refused
// before anything is allocated, and a real worker opens afterwards.
TEST_F(CacheTest, TinyFirstLayoutIsRefusedNotAllocated) {
  Start([](CacheOptions& o) {
    o.pool = gpu::ParsePoolSpec("host,bytes=64MiB").value();
    o.max_pool_pages = 1 << 20;
  });
  v1::Namespace tiny = TestNamespace(/*page_size=*/1);
  tiny.set_head_dim(1);
  tiny.set_dtype(v1::DTYPE_INT8);  // 2-byte pages: 33,554,432 of them
  v1::OpenSession open;
  *open.mutable_namespace_() = tiny;
  v1::SessionInfo info;
  absl::Status s = cache_->OpenSession(open, Caller::Daemon(), &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--max_pool_pages=1048576"), std::string::npos)
      << s;
  EXPECT_EQ(ErrorFieldOf(s), "namespace");
  EXPECT_EQ(Stats().capacity_pages(), 0u);  // no pool was made
  Open();                                   // 128-byte pages: 524,288
  EXPECT_EQ(Stats().capacity_pages(), 524288u);
}

// With --pool ... page_bytes=, the operator fixes the layout: a first
// namespace with other page_bytes is refused, the matching one binds.
TEST_F(CacheTest, OperatorPageBytesDecidesTheLayout) {
  Start([](CacheOptions& o) {
    o.pool = gpu::ParsePoolSpec("host,bytes=1MiB,page_bytes=256").value();
  });
  v1::OpenSession open;
  *open.mutable_namespace_() = TestNamespace();  // 128-byte pages
  v1::SessionInfo info;
  absl::Status s = cache_->OpenSession(open, Caller::Daemon(), &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("page_bytes 256"), std::string::npos) << s;
  EXPECT_EQ(Stats().capacity_pages(), 0u);
  v1::Namespace wide = TestNamespace();
  wide.set_head_dim(16);  // 256-byte pages
  Open(wide);
  EXPECT_EQ(Stats().capacity_pages(), 4096u);
}

TEST_F(CacheTest, NamespacesNoOneUsesAreForgottenSoNewOnesFit) {
  Start();
  // Each open binds a namespace of its own; closing leaves it empty. More
  // namespaces than the tree can number come and go, and every open works.
  v1::Namespace ns = TestNamespace();
  std::string kept;
  for (uint32_t i = 0; i < kMaxNamespaces + 100; ++i) {
    ns.set_cache_salt(absl::StrCat("salt-", i));
    const std::string sid = Open(ns);
    ASSERT_FALSE(sid.empty()) << "open " << i;
    if (i == 0) {
      // One namespace keeps a cached block (and no session).
      absl::StatusOr<v1::AcquireResponse> a = Acquire(sid, Tokens(8, 3));
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(Commit(sid, a->lease_id(), a->new_blocks(), true).ok());
    }
    if (i == 1) {
      kept = sid;  // and one keeps its session
      continue;
    }
    cache_->CloseSession(sid);
  }
  cache_->SweepExpiredLeases();
  // The sweeper's pass: only the two in use (and the newest ones since the
  // last forgetting) are still listed.
  EXPECT_GT(cache_->ForgetUnusedNamespaces(), 0u);
  v1::ListNamespacesResponse list;
  cache_->ListNamespaces(&list, Caller::Daemon());
  ASSERT_EQ(list.namespaces_size(), 2);
  std::vector<std::string> salts;
  for (const auto& e : list.namespaces()) salts.push_back(e.namespace_().cache_salt());
  std::sort(salts.begin(), salts.end());
  EXPECT_EQ(salts, (std::vector<std::string>{"salt-0", "salt-1"}));
  // The cached block is still found under its namespace.
  v1::MatchRequest m;
  ns.set_cache_salt("salt-0");
  *m.mutable_namespace_() = ns;
  SetTokens(&m, Tokens(8, 3));
  v1::MatchResponse mr;
  ASSERT_TRUE(cache_->Match(m, &mr, Caller::Daemon()).ok());
  EXPECT_GT(mr.matched_blocks(), 0u);
  EXPECT_EQ(Stats().namespaces(), 2u);
  cache_->CloseSession(kept);
}

TEST_F(CacheTest, AbandonedLeaseIsEndedAndCounted) {
  Start();
  const std::string a = Open();
  v1::AcquireRequest req;
  req.set_session_id(a);
  SetTokens(&req, Tokens(8, 1));
  req.set_allocate(true);
  v1::AcquireResponse resp;
  daemon::LeaseHandle handle;
  ASSERT_TRUE(cache_->Acquire(req, &resp, Caller::Daemon(), &handle).ok());
  EXPECT_EQ(handle.lease, resp.lease_id());
  // Another owner's handle for the same id ends nothing.
  cache_->AbandonLease({handle.lease, handle.owner + 1});
  EXPECT_EQ(cache_->lease_abandoned_total(), 0u);
  cache_->AbandonLease(handle);
  cache_->AbandonLease(handle);  // already ended: not counted again
  EXPECT_EQ(cache_->lease_abandoned_total(), 1u);
  EXPECT_EQ(Stats().leases(), 0u);
}

// Tenancy through Cache: each namespace is stored under the effective salt
// of the scope that binds it and records that tenant; a worker's lookups,
// listings, dumps and explanations reach its own tenant only, an
// administrator's every tenant.
TEST_F(CacheTest, TenantsSeeTheirOwnNamespacesOnly) {
  const std::string file = absl::StrCat(::testing::TempDir(), "/cache_test_",
                                        getpid(), "_tenants.json");
  std::ofstream(file) << R"({
    "tenants": [{"name": "alpha", "uids": [1001]},
                {"name": "beta", "uids": [1002], "max_namespaces": 1}],
    "admins": {"uids": [1000]}})";
  absl::StatusOr<std::unique_ptr<daemon::AccessPolicy>> policy =
      daemon::AccessPolicy::Create({.tenants_file = file});
  ASSERT_TRUE(policy.ok()) << policy.status();
  Start([&](CacheOptions& o) {
    // As the server makes them: account 0, then one per tenant.
    o.account_names.assign(1, "");
    o.account_limits.assign(1, AccountLimits{});
    for (const daemon::Tenant& t : (*policy)->tenants()) {
      o.account_names.push_back(t.name);
      o.account_limits.push_back(AccountLimits{});
    }
  });
  const auto admit = [&](uid_t uid) {
    daemon::PeerIdentity p;
    p.transport = daemon::PeerIdentity::Transport::kUnix;
    p.uid = uid;
    p.gid = uid;
    p.pid = getpid();
    p.address = "fd:9";
    return (*policy)->Admit(p).value();
  };
  const Caller alpha = admit(1001);
  const Caller beta = admit(1002);
  const Caller ops = admit(1000);  // an administrator, in alpha for its own
  ASSERT_TRUE(ops.scope.admin());
  ASSERT_EQ(ops.scope.name(), "alpha");

  v1::Namespace shared = TestNamespace();
  shared.set_cache_salt("shared");
  const auto open = [&](const Caller& c, const v1::Namespace& ns) {
    v1::OpenSession o;
    *o.mutable_namespace_() = ns;
    v1::SessionInfo info;
    absl::Status s = cache_->OpenSession(o, c, &info);
    return s.ok() ? absl::StatusOr<v1::SessionInfo>(info)
                  : absl::StatusOr<v1::SessionInfo>(s);
  };
  const absl::StatusOr<v1::SessionInfo> a = open(alpha, shared);
  const absl::StatusOr<v1::SessionInfo> b = open(beta, shared);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->tenant(), "alpha");
  EXPECT_EQ(b->tenant(), "beta");
  EXPECT_NE(a->namespace_id(), b->namespace_id());  // same salt sent

  // alpha caches two blocks; beta, with the same salt, hits none of them.
  v1::AcquireRequest acq;
  acq.set_session_id(a->session_id());
  SetTokens(&acq, Tokens(8, 1));
  acq.set_allocate(true);
  v1::AcquireResponse got;
  ASSERT_TRUE(cache_->Acquire(acq, &got, alpha).ok());
  v1::CommitRequest commit;
  commit.set_session_id(a->session_id());
  commit.set_lease_id(got.lease_id());
  commit.set_blocks(got.new_blocks());
  commit.set_release(true);
  v1::CommitResponse committed;
  ASSERT_TRUE(cache_->Commit(commit, &committed, alpha).ok());
  ASSERT_EQ(committed.inserted(), 2u);
  const auto matched = [&](const Caller& c) {
    v1::MatchRequest m;
    *m.mutable_namespace_() = shared;
    SetTokens(&m, Tokens(8, 1));
    v1::MatchResponse r;
    EXPECT_TRUE(cache_->Match(m, &r, c).ok());
    return r.matched_blocks();
  };
  EXPECT_EQ(matched(alpha), 2u);
  EXPECT_EQ(matched(beta), 0u);

  // ListNamespaces: a worker its own, with the salt it sent; an
  // administrator every tenant's, with the effective salts.
  const auto salts = [&](const Caller& c) {
    v1::ListNamespacesResponse r;
    cache_->ListNamespaces(&r, c);
    std::vector<std::string> out;
    for (const auto& e : r.namespaces()) {
      out.push_back(absl::StrCat(e.namespace_().cache_salt(), "@",
                                 e.namespace_id() == a->namespace_id()
                                     ? "a"
                                     : e.namespace_id() == b->namespace_id()
                                           ? "b"
                                           : "?"));
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(salts(alpha), (std::vector<std::string>{"shared@a"}));
  EXPECT_EQ(salts(beta), (std::vector<std::string>{"shared@b"}));
  EXPECT_EQ(salts(ops), (std::vector<std::string>{"tenant/alpha/shared@a",
                                                  "tenant/beta/shared@b"}));

  // ListSessions and DumpTree.
  const auto sessions = [&](const Caller& c) {
    v1::ListSessionsResponse r;
    cache_->ListSessions(&r, c);
    return r.sessions_size();
  };
  EXPECT_EQ(sessions(alpha), 1);
  EXPECT_EQ(sessions(beta), 1);
  EXPECT_EQ(sessions(ops), 2);
  const auto nodes = [&](const Caller& c) {
    v1::DumpTreeRequest req;
    v1::DumpTreeResponse r;
    EXPECT_TRUE(cache_->DumpTree(req, &r, c).ok());
    return r.nodes_size();
  };
  EXPECT_EQ(nodes(alpha), 2);
  EXPECT_EQ(nodes(beta), 0);
  EXPECT_EQ(nodes(ops), 2);

  // Explain in another namespace: the tokens are cached in alpha's, which
  // only alpha's members (and administrators) are told of.
  const auto wrong_namespace = [&](const Caller& c) {
    v1::ExplainRequest req;
    *req.mutable_namespace_() = shared;
    req.mutable_namespace_()->set_cache_salt("other");
    SetTokens(&req, Tokens(8, 1));
    v1::ExplainResponse r;
    EXPECT_TRUE(cache_->Explain(req, &r, c).ok());
    int n = 0;
    for (const auto& blk : r.blocks()) {
      if (blk.state() == v1::BLOCK_STATE_WRONG_NAMESPACE) {
        EXPECT_EQ(blk.other_namespace_id(), a->namespace_id());
        // The salt is named as the difference; its values never shown.
        EXPECT_EQ(std::vector<std::string>(blk.differing_fields().begin(),
                                           blk.differing_fields().end()),
                  std::vector<std::string>{"cache_salt"});
        EXPECT_EQ(blk.reason().find('"'), std::string::npos)
            << blk.reason();
        ++n;
      }
    }
    return n;
  };
  EXPECT_EQ(wrong_namespace(alpha), 2);
  EXPECT_EQ(wrong_namespace(beta), 0);
  EXPECT_EQ(wrong_namespace(ops), 2);

  // beta's quota counts the namespaces recorded as beta's: one.
  v1::Namespace second = shared;
  second.set_cache_salt("second");
  const absl::StatusOr<v1::SessionInfo> refused = open(beta, second);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("tenant beta has 1 namespaces"),
            std::string::npos)
      << refused.status();
  const absl::StatusOr<v1::SessionInfo> alpha_second = open(alpha, second);
  ASSERT_TRUE(alpha_second.ok()) << alpha_second.status();  // no such quota
  cache_->CloseSession(alpha_second->session_id());

  cache_->CloseSession(a->session_id());
  cache_->CloseSession(b->session_id());
  std::remove(file.c_str());
}

// With a tier below the pool, an Acquire copies its victims' bytes out of
// its new pages before it answers. A Release of that lease meanwhile (its
// id is predictable) must not hand those pages to anyone until the copies
// end: the pages stay WRITING, and another session gets none of them.
TEST_F(CacheTest, PagesOfALeaseEndedDuringItsTierCopiesWaitForThem) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr && *base ? base : "/tmp",
                                  "/cache_test_tier.XXXXXX");
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  daemon::DiskTierOptions d;
  d.path = dir;
  d.bytes = 1 << 20;
  d.page_bytes = 128;  // TestNamespace(): 1 layer x 2 x 1 head x 8 x 4 x fp16
  d.io_threads = 1;
  d.max_pending_bytes = 4096;  // one block staged at a time
  d.wait_for_staging = true;   // the next one waits for the disk
  absl::StatusOr<std::unique_ptr<daemon::DiskTier>> disk =
      daemon::DiskTier::Open(d);
  ASSERT_TRUE(disk.ok()) << disk.status();
  daemon::DiskTier* tier = disk->get();
  std::vector<std::unique_ptr<daemon::Tier>> tiers;
  tiers.push_back(*std::move(disk));
  auto chain = std::make_shared<daemon::TierChain>(std::move(tiers));
  Start([&](CacheOptions& o) {
    o.pool = gpu::ParsePoolSpec("host,bytes=1024,page_bytes=128").value();
    o.tiers = chain;
  });
  // Two sessions fill the 8 pages (a session may hold half the pool).
  const std::string a = Open(), a2 = Open(), b = Open(), c = Open();
  uint64_t last = 0;
  for (const auto& [session, seed] : {std::pair{a, 1u}, std::pair{a2, 2u}}) {
    absl::StatusOr<v1::AcquireResponse> r = Acquire(session, Tokens(16, seed));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->new_blocks(), 4u);
    ASSERT_TRUE(Commit(session, r->lease_id(), 4, /*release=*/true).ok());
    last = r->lease_id();
  }
  // b's Acquire evicts 4 blocks into its own new pages and copies them
  // down; with the disk's writes paused, the second block waits.
  tier->SetWritesPausedForTesting(true);
  const uint64_t lease = last + 1;  // b's, not yet answered
  absl::StatusOr<v1::AcquireResponse> second;
  std::thread acquirer([&] { second = Acquire(b, Tokens(16, 3)); });
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (tier->stats().pending == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(tier->stats().pending, 1u);
  ASSERT_TRUE(Release(b, lease).ok());
  v1::Stats s = Stats();
  EXPECT_EQ(s.leases(), 0u);
  EXPECT_EQ(s.writing_pages(), 4u);  // held until the copies end
  EXPECT_EQ(s.cached_pages(), 4u);
  EXPECT_EQ(s.free_pages(), 0u);
  // c gets the 4 cached blocks' pages, none of the held ones (its own
  // demotion then waits for the disk too).
  absl::StatusOr<v1::AcquireResponse> third;
  std::thread other([&] { third = Acquire(c, Tokens(16, 4)); });
  while (Stats().writing_pages() != 8 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(Stats().writing_pages(), 8u);
  tier->SetWritesPausedForTesting(false);
  acquirer.join();
  other.join();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->new_blocks(), 4u);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->lease_id(), lease);
  for (uint64_t p : second->pages()) {
    EXPECT_EQ(std::count(third->pages().begin(), third->pages().end(), p), 0)
        << "page " << p << " handed out while the daemon copied it";
  }
  ASSERT_TRUE(Release(c, third->lease_id()).ok());
  s = Stats();
  EXPECT_EQ(s.writing_pages(), 0u);
  EXPECT_EQ(s.free_pages(), 8u);
  ASSERT_EQ(s.tiers_size(), 1);
  EXPECT_EQ(s.tiers(0).demoted_blocks(), 8u);
  tier->Flush();
  cache_.reset();
  chain.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace radixkv::testing
