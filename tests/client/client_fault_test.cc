// Client library against radixkvd child processes that die: the reconnect
// bound after a short outage, a daemon killed (SIGKILL) at each step of a
// request (session open, Acquire, pool attach, page write, Commit), and
// leases that refuse page access once they expire.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "client/status.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "radixkv/defaults.h"
#include "radixkv/v1/radixkv.grpc.pb.h"
#include "tests/client/daemon_process.h"

namespace radixkv {
namespace {

using testing::DaemonProcess;
using testing::TestSocketPath;

class ClientFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    daemon_ = std::make_unique<DaemonProcess>(
        RADIXKVD_PATH, TestSocketPath("f" + std::to_string(++counter)));
    ASSERT_TRUE(daemon_->Start().ok());
  }

  static NamespaceSpec Namespace() {
    NamespaceSpec ns;
    ns.model = "client-fault-test";
    ns.num_layers = 2;
    ns.num_kv_heads = 2;
    ns.head_dim = 8;
    ns.page_size = 4;
    ns.dtype = DType::kFloat16;
    return ns;
  }

  // Fast reconnects, generous deadlines (a loaded 2-core machine).
  ClientOptions Options() const {
    ClientOptions o;
    o.endpoint = daemon_->socket();
    o.ns = Namespace();
    o.client_name = "client_fault_test";
    o.initial_wait = absl::Seconds(30);
    o.connect_timeout = absl::Seconds(10);
    o.call_timeout = absl::Seconds(10);
    o.heartbeat_interval = absl::Milliseconds(500);
    o.reconnect_initial_backoff = absl::Milliseconds(50);
    o.reconnect_max_backoff = absl::Milliseconds(500);
    return o;
  }

  std::unique_ptr<Client> Connect(const ClientOptions& o) {
    auto c = Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->WaitForSession(absl::Seconds(30)).ok());
    return std::move(*c);
  }

  static std::vector<uint32_t> Prompt(uint32_t n, uint32_t salt) {
    std::vector<uint32_t> t(n);
    for (uint32_t i = 0; i < n; ++i) t[i] = 1000 * salt + i + 1;
    return t;
  }

  // Waits until the client has opened a session newer than `generation`.
  static bool WaitForNewSession(const Client& client, uint64_t generation,
                                absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      ClientState st = client.state();
      if (st.connected && st.generation > generation) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  static bool WaitForDisconnect(const Client& client, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (!client.connected()) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  // After a restart: a miss that commits, then a hit of all `blocks`.
  static void ExpectHitsResume(Client* client,
                               const std::vector<uint32_t>& prompt,
                               uint32_t blocks) {
    absl::StatusOr<Lease> miss = client->Acquire(prompt);
    ASSERT_TRUE(miss.ok()) << miss.status();
    ASSERT_FALSE(miss->degraded());
    ASSERT_EQ(miss->matched_blocks(), 0u);
    ASSERT_EQ(miss->new_blocks(), blocks);
    ASSERT_TRUE(miss->Commit(blocks, true).ok());
    absl::StatusOr<Lease> hit = client->Acquire(prompt);
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_FALSE(hit->degraded());
    EXPECT_EQ(hit->matched_blocks(), blocks);
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

// Runs `fn` on another thread; Wait() returns once it finished.
class Background {
 public:
  explicit Background(std::function<void()> fn)
      : thread_([this, fn = std::move(fn)] {
          fn();
          done_.store(true);
        }) {}
  ~Background() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// The documented bounds: a session attempt waits up to connect_timeout for
// the connection, so when the daemon comes back during one (an outage
// shorter than connect_timeout always does), the session opens as soon as
// the daemon accepts connections; in any case within reconnect_max_backoff
// * (1 + jitter). Measured against a fresh client that starts connecting
// when the daemon is back, which pays the same daemon start-up and open on
// a loaded machine. Default backoff options (100 ms doubling to 5 s,
// jitter 0.2).
TEST_F(ClientFaultTest, ReconnectsWithinMaxBackoffAfterShortOutage) {
  ClientOptions o;
  o.endpoint = daemon_->socket();
  o.ns = Namespace();
  o.client_name = "reconnect_bound";
  o.initial_wait = absl::Seconds(30);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  // Margins for a loaded machine: the channel's connection retry interval
  // (1 s, jitter 0.2) plus thread scheduling.
  const absl::Duration short_outage_margin = absl::Seconds(3);
  const absl::Duration backoff_bound =
      o.reconnect_max_backoff * (1 + o.reconnect_jitter) + absl::Seconds(2);
  for (int ms : {1000, 1250, 1500, 1750, 2000, 2000}) {
    const absl::Duration outage = absl::Milliseconds(ms);
    const uint64_t generation = client->state().generation;
    daemon_->Kill(SIGKILL);
    absl::SleepFor(outage);
    ASSERT_TRUE(daemon_->Start().ok());
    const absl::Time back = absl::Now();
    absl::Duration fresh = absl::InfiniteDuration();
    Background reference([&] {
      ClientOptions ro = o;
      ro.client_name = "reconnect_reference";
      ro.initial_wait = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(ro);
      if (c.ok() && (*c)->connected()) fresh = absl::Now() - back;
    });
    ASSERT_TRUE(WaitForNewSession(*client, generation, absl::Seconds(60)))
        << client->state().last_error;
    const absl::Duration took = absl::Now() - back;
    reference.Join();
    ASSERT_NE(fresh, absl::InfiniteDuration());
    std::fprintf(stderr,
                 "outage %s: session again %s after the restart (a fresh "
                 "client: %s)\n",
                 absl::FormatDuration(outage).c_str(),
                 absl::FormatDuration(took).c_str(),
                 absl::FormatDuration(fresh).c_str());
    EXPECT_LE(took, fresh + short_outage_margin) << "outage " << outage;
    EXPECT_LE(took, fresh + backoff_bound) << "outage " << outage;
    absl::StatusOr<Lease> lease = client->Acquire(Prompt(8, 1));
    ASSERT_TRUE(lease.ok());
    EXPECT_FALSE(lease->degraded());
  }
}

TEST_F(ClientFaultTest, DaemonKilledDuringOpenDegradesThenHitsResume) {
  daemon_->Stop();  // the open reaches the socket but is never answered
  ClientOptions o = Options();
  o.initial_wait = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<Client>> created = Client::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Client> client = std::move(*created);
  EXPECT_FALSE(client->connected());
  daemon_->Kill(SIGKILL);
  const std::vector<uint32_t> prompt = Prompt(16, 2);
  absl::StatusOr<Lease> lease = client->Acquire(prompt);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(lease->degraded());
  EXPECT_EQ(lease->matched_blocks(), 0u);
  ASSERT_TRUE(daemon_->Start().ok());
  ASSERT_TRUE(client->WaitForSession(absl::Seconds(60)).ok())
      << client->state().last_error;
  ExpectHitsResume(client.get(), prompt, 4);
}

TEST_F(ClientFaultTest, DaemonKilledDuringAcquireDegradesThenHitsResume) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<uint32_t> prompt = Prompt(16, 3);
  const uint64_t generation = client->state().generation;
  daemon_->Stop();
  absl::StatusOr<Lease> lease;
  Background acquire([&] { lease = client->Acquire(prompt); });
  absl::SleepFor(absl::Milliseconds(300));  // the call is in flight
  EXPECT_FALSE(acquire.done());
  const absl::Time killed = absl::Now();
  daemon_->Kill(SIGKILL);
  acquire.Join();
  // The broken connection ends the call, not its 10 s deadline.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(lease->degraded());
  EXPECT_TRUE(lease->pages().empty());
  ASSERT_TRUE(daemon_->Start().ok());
  ASSERT_TRUE(WaitForNewSession(*client, generation, absl::Seconds(60)));
  ExpectHitsResume(client.get(), prompt, 4);
}

// The daemon dies while the client waits for the attach reply: a stand-in
// listener on the attach socket accepts and never answers.
TEST_F(ClientFaultTest, DaemonKilledDuringAttachDegradesThenHitsResume) {
  const std::string attach_path = AttachSocketPathFor(daemon_->socket());
  ASSERT_EQ(unlink(attach_path.c_str()), 0);
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, attach_path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  ASSERT_EQ(listen(listener, 4), 0);

  ClientOptions o = Options();
  o.attach_pool = true;
  o.initial_wait = absl::ZeroDuration();
  o.connect_timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<Client>> created = Client::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Client> client = std::move(*created);
  const int conn = accept(listener, nullptr, nullptr);  // the client attaches
  ASSERT_GE(conn, 0);
  daemon_->Kill(SIGKILL);
  const std::vector<uint32_t> prompt = Prompt(8, 4);
  const absl::Time start = absl::Now();
  absl::StatusOr<Lease> lease = client->Acquire(prompt);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(lease->degraded());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));  // no waiting on attach
  close(conn);
  close(listener);
  unlink(attach_path.c_str());
  ASSERT_TRUE(daemon_->Start().ok());
  ASSERT_TRUE(client->WaitForSession(absl::Seconds(60)).ok())
      << client->state().last_error;
  ASSERT_NE(client->pool(), nullptr);
  ExpectHitsResume(client.get(), prompt, 2);
}

// The daemon dies while the worker writes its new pages: the pointers it
// holds stay mapped (no fault), but once the client has seen the session
// end the lease hands out no more addresses, its Commit is refused locally
// and the next open acknowledges the lost session.
TEST_F(ClientFaultTest, DaemonKilledDuringPageWriteStopsTheWriter) {
  ClientOptions o = Options();
  o.attach_pool = true;
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  const uint64_t page_bytes = client->state().pool.page_bytes();
  const std::string lost_session = client->state().session_id;
  const uint64_t generation = client->state().generation;
  const std::vector<uint32_t> prompt = Prompt(8, 5);
  absl::StatusOr<Lease> lease = client->Acquire(prompt);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->new_blocks(), 2u);
  ASSERT_TRUE(lease->live());
  void* first = lease->page_address(0);
  ASSERT_NE(first, nullptr);
  std::memset(first, 0x11, page_bytes);
  daemon_->Kill(SIGKILL);
  std::memset(first, 0x22, page_bytes);  // still mapped
  ASSERT_TRUE(WaitForDisconnect(*client, absl::Seconds(30)));
  EXPECT_FALSE(lease->live());
  EXPECT_EQ(lease->page_address(1), nullptr);
  EXPECT_EQ(lease->time_left(), absl::ZeroDuration());
  EXPECT_EQ(lease->ConfirmRead().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lease->Commit(2, true).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(lease->Release().ok());
  EXPECT_EQ(client->state().unacknowledged_sessions,
            std::vector<std::string>{lost_session});
  ASSERT_TRUE(daemon_->Start().ok());
  ASSERT_TRUE(WaitForNewSession(*client, generation, absl::Seconds(60)));
  EXPECT_TRUE(client->state().unacknowledged_sessions.empty());
  ExpectHitsResume(client.get(), prompt, 2);
}

TEST_F(ClientFaultTest, DaemonKilledDuringCommitIsAHandledError) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<uint32_t> prompt = Prompt(16, 6);
  const uint64_t generation = client->state().generation;
  absl::StatusOr<Lease> lease = client->Acquire(prompt);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->new_blocks(), 4u);
  daemon_->Stop();
  absl::StatusOr<v1::CommitResponse> committed;
  Background commit([&] { committed = lease->Commit(4, true); });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(commit.done());
  daemon_->Kill(SIGKILL);
  commit.Join();
  EXPECT_TRUE(IsUnreachable(committed.status())) << committed.status();
  ASSERT_TRUE(WaitForDisconnect(*client, absl::Seconds(30)));
  EXPECT_FALSE(lease->live());
  EXPECT_TRUE(lease->Release().ok());
  ASSERT_TRUE(daemon_->Start().ok());
  ASSERT_TRUE(WaitForNewSession(*client, generation, absl::Seconds(60)));
  ExpectHitsResume(client.get(), prompt, 4);
}

// The daemon's quarantined (fenced) pages, from Admin.GetStats.
uint64_t QuarantinedPages(const std::string& socket) {
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(
      "unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetStatsResponse resp;
  if (!stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok()) return ~0ull;
  return resp.stats().quarantined_pages();
}

// A session lost while a page of one of its leases is being written: the
// client may acknowledge it (and the daemon reuse the fenced pages) only
// once that write has ended, with the lease's Commit or Release; until
// then the pages stay quarantined, and the acknowledgement then rides on a
// heartbeat of the new session.
TEST_F(ClientFaultTest, LostSessionIsAcknowledgedOnlyAfterItsWritesEnd) {
  ClientOptions o = Options();
  o.attach_pool = true;
  o.heartbeat_interval = absl::Milliseconds(100);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  const uint64_t page_bytes = client->state().pool.page_bytes();
  const std::vector<uint32_t> prompt = Prompt(8, 21);
  absl::StatusOr<Lease> lease = client->Acquire(prompt);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->new_blocks(), 2u);
  void* page = lease->page_address(0);  // a write runs from here on
  ASSERT_NE(page, nullptr);
  const std::string lost = client->state().session_id;
  daemon_->Stop();  // heartbeats go unanswered: the client ends the session
  absl::SleepFor(absl::Milliseconds(800));
  daemon_->Continue();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && (client->state().session_id == lost ||
                                    !client->connected())) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_NE(client->state().session_id, lost);
  absl::SleepFor(absl::Milliseconds(500));  // several heartbeats
  EXPECT_EQ(client->state().unacknowledged_sessions,
            std::vector<std::string>{lost});
  EXPECT_EQ(QuarantinedPages(daemon_->socket()), 2u);
  std::memset(page, 0x5a, page_bytes);  // the write ends...
  EXPECT_EQ(lease->Commit(2, true).status().code(),
            absl::StatusCode::kUnavailable);  // ...and the lease with it
  while (absl::Now() < deadline &&
         (!client->state().unacknowledged_sessions.empty() ||
          QuarantinedPages(daemon_->socket()) != 0)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(client->state().unacknowledged_sessions.empty());
  EXPECT_EQ(QuarantinedPages(daemon_->socket()), 0u);
}

class ClientExpiryTest : public ClientFaultTest {
 protected:
  void SetUp() override {
    ClientFaultTest::SetUp();
    daemon_->Kill(SIGKILL);
    daemon_->set_extra_flags({"--lease_ttl=1s"});
    ASSERT_TRUE(daemon_->Start().ok());
  }
  ClientOptions Options() const {
    ClientOptions o = ClientFaultTest::Options();
    o.attach_pool = true;
    return o;
  }
};

// Lease TTL 1 s, so the safety margin is 100 ms: page access ends 900 ms
// after the Acquire was sent at the latest.
TEST_F(ClientExpiryTest, ExpiredLeaseRefusesPageAccess) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<uint32_t> prompt = Prompt(8, 7);
  absl::StatusOr<Lease> lease = client->Acquire(prompt);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->new_blocks(), 2u);
  ASSERT_TRUE(lease->live());
  EXPECT_GT(lease->time_left(), absl::ZeroDuration());
  EXPECT_LE(lease->time_left(), absl::Milliseconds(900));
  EXPECT_NE(lease->page_address(0), nullptr);
  absl::SleepFor(absl::Milliseconds(1300));  // past the daemon's expiry too
  EXPECT_TRUE(lease->held());
  EXPECT_FALSE(lease->live());
  EXPECT_EQ(lease->page_address(0), nullptr);
  EXPECT_EQ(lease->page_address(1), nullptr);
  EXPECT_EQ(lease->time_left(), absl::ZeroDuration());
  EXPECT_EQ(lease->ConfirmRead().code(), absl::StatusCode::kDeadlineExceeded);
  // The Commit still goes out (it tells the daemon the pages stay
  // unwritten); the daemon no longer has the lease.
  absl::StatusOr<v1::CommitResponse> late = lease->Commit(2, true);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound) << late.status();
  EXPECT_FALSE(lease->held());
  EXPECT_EQ(lease->Commit(0, true).status().code(),
            absl::StatusCode::kFailedPrecondition);  // never sent again
  EXPECT_TRUE(client->connected());
  ExpectHitsResume(client.get(), prompt, 2);
}

TEST_F(ClientExpiryTest, ReaderDiscardsAReadThatOutlivedTheLease) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const uint64_t page_bytes = client->state().pool.page_bytes();
  const std::vector<uint32_t> prompt = Prompt(8, 8);
  {
    absl::StatusOr<Lease> writer = client->Acquire(prompt);
    ASSERT_TRUE(writer.ok());
    for (size_t i = 0; i < 2; ++i) {
      std::memset(writer->page_address(i), 0x30 + static_cast<int>(i),
                  page_bytes);
    }
    ASSERT_TRUE(writer->Commit(2, true).ok());
  }
  absl::StatusOr<Lease> reader = client->Acquire(prompt);
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ(reader->matched_blocks(), 2u);
  std::vector<unsigned char> copy(page_bytes);
  std::memcpy(copy.data(), reader->page_address(0), page_bytes);
  EXPECT_EQ(copy[0], 0x30);
  EXPECT_TRUE(reader->ConfirmRead().ok());  // read finished in time
  const void* kept = reader->page_address(1);
  ASSERT_NE(kept, nullptr);
  absl::SleepFor(absl::Milliseconds(1000));  // a read that takes too long
  std::memcpy(copy.data(), kept, page_bytes);
  EXPECT_EQ(reader->ConfirmRead().code(), absl::StatusCode::kDeadlineExceeded);
}

// An Acquire whose answer arrives after the lease's usable time (here: the
// daemon was stopped for longer than the TTL) serves a miss.
TEST_F(ClientExpiryTest, AcquireAnsweredTooLateIsAMiss) {
  ClientOptions o = Options();
  o.heartbeat_interval = absl::Seconds(5);  // the stop is no lost session
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  const std::vector<uint32_t> prompt = Prompt(8, 9);
  daemon_->Stop();
  absl::StatusOr<Lease> lease;
  Background acquire([&] { lease = client->Acquire(prompt); });
  absl::SleepFor(absl::Milliseconds(1200));
  daemon_->Continue();
  acquire.Join();
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(lease->degraded());
  EXPECT_EQ(lease->matched_blocks(), 0u);
  EXPECT_TRUE(lease->pages().empty());
  EXPECT_FALSE(lease->held());
  ASSERT_TRUE(client->connected());
  ExpectHitsResume(client.get(), prompt, 2);
}

}  // namespace
}  // namespace radixkv
