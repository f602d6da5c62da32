// File: tests/daemon/server_fixture.h
//
// ServerTest: a gtest fixture running radixkvd's Server in-process on a /tmp
// Unix socket (real gRPC, no transport mocks), with stubs and tiny RPC
// wrappers so each test reads like a spec.
#ifndef RADIXKV_TESTS_DAEMON_SERVER_FIXTURE_H_
#define RADIXKV_TESTS_DAEMON_SERVER_FIXTURE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/rpc/server.h"
#include "gtest/gtest.h"
#include "radixkv/defaults.h"
#include "tests/daemon/test_util.h"

namespace radixkv::testing {

class ServerTest : public ::testing::Test {
 public:  // lambdas in table-driven tests call the helpers
  // Starts the server with a small none pool and metrics off; `tweak` may
  // change any option first.
  void StartServer(const std::function<void(daemon::ServerOptions&)>& tweak = {}) {
    options_.socket_path = TempSocketPath("srv");
    options_.metrics_listen = "";
    options_.pool = "none,pages=64";
    options_.cache.sweep_interval = absl::Milliseconds(50);
    if (tweak) tweak(options_);
    auto server = daemon::Server::Start(options_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(UnixTarget(options_.socket_path),
                                   grpc::InsecureChannelCredentials());
    kv_ = v1::KvCache::NewStub(channel_);
    admin_ = v1::Admin::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(2));
  }

  v1::Stats Stats() {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    v1::GetStatsResponse resp;
    grpc::Status s = admin_->GetStats(&ctx, v1::GetStatsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.stats();
  }

  grpc::Status Acquire(const std::string& session, const std::vector<uint32_t>& tokens,
                       bool allocate, v1::AcquireResponse* resp) {
    v1::AcquireRequest req;
    req.set_session_id(session);
    SetTokens(&req, tokens);
    req.set_allocate(allocate);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    return kv_->Acquire(&ctx, req, resp);
  }

  grpc::Status Commit(const std::string& session, uint64_t lease, uint32_t blocks,
                      bool release, v1::CommitResponse* resp) {
    v1::CommitRequest req;
    req.set_session_id(session);
    req.set_lease_id(lease);
    req.set_blocks(blocks);
    req.set_release(release);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    return kv_->Commit(&ctx, req, resp);
  }

  grpc::Status Release(const std::string& session, uint64_t lease) {
    v1::ReleaseRequest req;
    req.set_session_id(session);
    req.set_lease_id(lease);
    v1::ReleaseResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    return kv_->Release(&ctx, req, &resp);
  }

  // Matched blocks of `tokens` in `ns` (read-only), or -1 on error.
  int MatchBlocks(const v1::Namespace& ns, const std::vector<uint32_t>& tokens) {
    v1::MatchRequest req;
    *req.mutable_namespace_() = ns;
    SetTokens(&req, tokens);
    v1::MatchResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    if (!kv_->Match(&ctx, req, &resp).ok()) return -1;
    return static_cast<int>(resp.matched_blocks());
  }

  // Acquire with allocate + commit everything + release: caches `tokens`.
  void Insert(const std::string& session, const std::vector<uint32_t>& tokens) {
    v1::AcquireResponse a;
    ASSERT_TRUE(Acquire(session, tokens, true, &a).ok());
    v1::CommitResponse c;
    ASSERT_TRUE(Commit(session, a.lease_id(), a.new_blocks(), true, &c).ok());
  }

  static void ExpectInvariants(const v1::Stats& s) {
    EXPECT_TRUE(s.invariants_ok());
    EXPECT_EQ(s.free_pages() + s.writing_pages() + s.cached_pages(),
              s.capacity_pages());
    EXPECT_LE(s.pinned_pages(), s.cached_pages());
  }

  daemon::ServerOptions options_;
  std::unique_ptr<daemon::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> kv_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

}  // namespace radixkv::testing

#endif  // RADIXKV_TESTS_DAEMON_SERVER_FIXTURE_H_
