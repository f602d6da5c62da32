// Client library against an in-process stand-in for radixkvd's KvCache
// service that records every OpenSession: a lost session is acknowledged in
// the next open (OpenSession.acknowledge_sessions) once its leases refuse
// page access, and a Commit answered LEASE_NOT_FOUND ends the lease for
// good.
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/security/server_credentials.h"
#include "gtest/gtest.h"
#include "radixkv/errors.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv {
namespace {

// Session n (1-based) is "s<n>"; it stays open until EndSession(n) or the
// client cancels it. Heartbeats are not read (tests use long intervals).
class FakeKvCache final : public v1::KvCache::Service {
 public:
  grpc::Status Session(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>*
          stream) override {
    v1::SessionRequest req;
    if (!stream->Read(&req) || !req.has_open()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "open first");
    }
    size_t n;
    {
      absl::MutexLock lock(&mu_);
      opens_.push_back(req.open());
      n = opens_.size();
    }
    v1::SessionResponse resp;
    v1::SessionInfo* info = resp.mutable_session();
    info->set_session_id(absl::StrCat("s", n));
    info->mutable_pool()->set_backend("none");
    info->set_lease_ttl_ms(60000);
    if (!stream->Write(resp)) return grpc::Status::CANCELLED;
    absl::MutexLock lock(&mu_);
    auto ended = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ >= n;
    };
    while (!ctx->IsCancelled() &&
           !mu_.AwaitWithTimeout(absl::Condition(&ended),
                                 absl::Milliseconds(10))) {
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "session ended");
  }

  grpc::Status Acquire(grpc::ServerContext*, const v1::AcquireRequest* req,
                       v1::AcquireResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (session_not_found_) {
      return ToGrpcStatus(FieldError(absl::StatusCode::kNotFound, "session_id",
                                     v1::ERROR_REASON_SESSION_NOT_FOUND,
                                     "unknown session"));
    }
    resp->set_lease_id(++leases_);
    resp->set_total_blocks(1);
    resp->set_new_blocks(1);
    resp->add_pages(leases_);
    resp->set_lease_expires_unix_ms(
        absl::ToUnixMillis(absl::Now() + absl::Minutes(1)));
    return grpc::Status::OK;
  }

  grpc::Status Commit(grpc::ServerContext*, const v1::CommitRequest*,
                      v1::CommitResponse*) override {
    absl::MutexLock lock(&mu_);
    ++commits_;
    return ToGrpcStatus(FieldError(absl::StatusCode::kNotFound, "lease_id",
                                   v1::ERROR_REASON_LEASE_NOT_FOUND,
                                   "no live lease"));
  }

  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest*,
                       v1::ReleaseResponse*) override {
    absl::MutexLock lock(&mu_);
    ++releases_;
    return grpc::Status::OK;
  }

  void EndSession(size_t n) {
    absl::MutexLock lock(&mu_);
    ended_ = std::max(ended_, n);
  }
  void set_session_not_found(bool v) {
    absl::MutexLock lock(&mu_);
    session_not_found_ = v;
  }
  // Waits until `n` sessions were opened; returns the opens so far.
  std::vector<v1::OpenSession> WaitForOpens(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return opens_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return opens_;
  }
  int commits() {
    absl::MutexLock lock(&mu_);
    return commits_;
  }
  int releases() {
    absl::MutexLock lock(&mu_);
    return releases_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::OpenSession> opens_ ABSL_GUARDED_BY(mu_);
  size_t ended_ ABSL_GUARDED_BY(mu_) = 0;
  bool session_not_found_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t leases_ ABSL_GUARDED_BY(mu_) = 0;
  int commits_ ABSL_GUARDED_BY(mu_) = 0;
  int releases_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<std::string> Acks(const v1::OpenSession& open) {
  return {open.acknowledge_sessions().begin(),
          open.acknowledge_sessions().end()};
}

class ClientAckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    socket_ = absl::StrCat("/tmp/rkack_", getpid(), "_", ++counter, ".sock");
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_,
                             grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    client_.reset();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    unlink(socket_.c_str());
  }

  Client* Connect() {
    ClientOptions o;
    o.endpoint = socket_;
    o.ns.model = "ack-test";
    o.ns.num_layers = 1;
    o.ns.num_kv_heads = 1;
    o.ns.head_dim = 8;
    o.ns.page_size = 4;
    o.ns.dtype = DType::kFloat16;
    o.initial_wait = absl::Seconds(30);
    o.heartbeat_interval = absl::Seconds(60);
    o.reconnect_initial_backoff = absl::Milliseconds(10);
    o.reconnect_max_backoff = absl::Milliseconds(100);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    client_ = std::move(*c);
    EXPECT_TRUE(client_->connected());
    return client_.get();
  }

  std::string socket_;
  FakeKvCache service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientAckTest, LostSessionIsAcknowledgedByTheNextOpen) {
  Client* client = Connect();
  ASSERT_NE(client, nullptr);
  const std::vector<uint32_t> prompt = {1, 2, 3, 4};
  absl::StatusOr<Lease> lease = client->Acquire(prompt);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(lease->held());
  EXPECT_TRUE(lease->live());
  EXPECT_TRUE(lease->ConfirmRead().ok());

  service_.EndSession(1);  // the stream breaks without Commit or Release
  std::vector<v1::OpenSession> opens = service_.WaitForOpens(2);
  ASSERT_EQ(opens.size(), 2u);
  EXPECT_TRUE(Acks(opens[0]).empty());
  EXPECT_EQ(Acks(opens[1]), std::vector<std::string>{"s1"});
  // The lease of the lost session was stopped before that open.
  EXPECT_FALSE(lease->live());
  EXPECT_EQ(lease->ConfirmRead().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lease->Commit(1, true).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.commits(), 0);  // refused without a call

  ASSERT_TRUE(client->WaitForSession(absl::Seconds(30)).ok());
  EXPECT_TRUE(client->state().unacknowledged_sessions.empty());
  service_.EndSession(2);
  opens = service_.WaitForOpens(3);
  ASSERT_EQ(opens.size(), 3u);
  EXPECT_EQ(Acks(opens[2]), std::vector<std::string>{"s2"});  // s1 was taken
}

TEST_F(ClientAckTest, SessionNotFoundIsAcknowledgedByTheNextOpen) {
  Client* client = Connect();
  ASSERT_NE(client, nullptr);
  service_.set_session_not_found(true);
  absl::StatusOr<Lease> lease = client->Acquire({1, 2, 3, 4});
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(lease->degraded());
  std::vector<v1::OpenSession> opens = service_.WaitForOpens(2);
  ASSERT_EQ(opens.size(), 2u);
  EXPECT_EQ(Acks(opens[1]), std::vector<std::string>{"s1"});
}

TEST_F(ClientAckTest, CommitAnsweredLeaseNotFoundEndsTheLease) {
  Client* client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<Lease> lease = client->Acquire({1, 2, 3, 4});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(lease->live());
  absl::StatusOr<v1::CommitResponse> c = lease->Commit(1, false);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorReasonOf(c.status()), v1::ERROR_REASON_LEASE_NOT_FOUND);
  EXPECT_FALSE(lease->held());
  EXPECT_FALSE(lease->live());
  EXPECT_EQ(lease->Commit(1, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(lease->Release().ok());
  EXPECT_EQ(service_.commits(), 1);   // the Commit was the acknowledgement
  EXPECT_EQ(service_.releases(), 0);  // nothing more was sent for it
  EXPECT_TRUE(client->connected());   // the session is unaffected
  EXPECT_EQ(client->state().generation, 1u);
}

// A session that ends with leases open has their pages fenced: closing the
// client releases every lease first, including one that outlives it.
TEST_F(ClientAckTest, ClosingReleasesHeldLeasesFirst) {
  Client* client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<Lease> lease = client->Acquire({1, 2, 3, 4});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(lease->live());
  client_.reset();
  EXPECT_EQ(service_.releases(), 1);
  EXPECT_FALSE(lease->live());
  EXPECT_EQ(lease->ConfirmRead().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace radixkv
