// Client library against a live radixkvd child process: lease RAII,
// commit/hit, reconnect after a daemon restart, degrade while the daemon is
// down, deadlines against a stopped daemon, pool attach with page addresses.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/status.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "radixkv/v1/radixkv.grpc.pb.h"
#include "tests/client/daemon_process.h"

namespace radixkv {
namespace {

using testing::DaemonProcess;
using testing::TestSocketPath;

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    daemon_ = std::make_unique<DaemonProcess>(
        RADIXKVD_PATH, TestSocketPath(std::to_string(++counter)));
    ASSERT_TRUE(daemon_->Start().ok());
  }

  NamespaceSpec Namespace() const {
    NamespaceSpec ns;
    ns.model = "client-test";
    ns.num_layers = 2;
    ns.num_kv_heads = 2;
    ns.head_dim = 8;
    ns.page_size = 4;
    ns.dtype = DType::kFloat16;
    return ns;
  }

  ClientOptions Options() const {
    ClientOptions o;
    o.endpoint = daemon_->socket();
    o.ns = Namespace();
    o.client_name = "client_test";
    o.initial_wait = absl::Seconds(30);
    o.connect_timeout = absl::Seconds(10);
    o.call_timeout = absl::Seconds(10);
    o.heartbeat_interval = absl::Milliseconds(500);
    o.reconnect_initial_backoff = absl::Milliseconds(50);
    o.reconnect_max_backoff = absl::Milliseconds(500);
    return o;
  }

  std::unique_ptr<Client> Connect(ClientOptions o) {
    auto c = Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->WaitForSession(absl::Seconds(30)).ok());
    return std::move(*c);
  }

  v1::Stats Stats() {
    auto stub = v1::Admin::NewStub(grpc::CreateChannel(
        "unix:" + daemon_->socket(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetStatsResponse resp;
    grpc::Status s = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.stats();
  }

  static std::vector<uint32_t> Prompt(uint32_t n, uint32_t salt = 0) {
    std::vector<uint32_t> t(n);
    for (uint32_t i = 0; i < n; ++i) t[i] = 1000 * salt + i + 1;
    return t;
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(ClientTest, LeaseDestructorReleases) {
  ClientOptions o = Options();
  o.release_delay = absl::ZeroDuration();  // ~Lease sends Release itself
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  {
    absl::StatusOr<Lease> lease = client->Acquire(Prompt(16));
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_FALSE(lease->degraded());
    EXPECT_TRUE(lease->held());
    EXPECT_EQ(lease->total_blocks(), 4u);
    EXPECT_EQ(lease->matched_blocks(), 0u);
    EXPECT_EQ(lease->new_blocks(), 4u);
    EXPECT_EQ(lease->pages().size(), 4u);
    v1::Stats during = Stats();
    EXPECT_EQ(during.leases(), 1u);
    EXPECT_EQ(during.writing_pages(), 4u);
    // Moving keeps exactly one owner.
    Lease moved = std::move(*lease);
    EXPECT_FALSE(lease->held());
    EXPECT_TRUE(moved.held());
  }
  v1::Stats after = Stats();
  EXPECT_EQ(after.leases(), 0u);
  EXPECT_EQ(after.writing_pages(), 0u);
  EXPECT_EQ(after.cached_pages(), 0u);
}

TEST_F(ClientTest, DroppedLeaseRidesOnTheNextAcquire) {
  ClientOptions o = Options();
  o.release_delay = absl::Hours(1);  // only an Acquire can end it
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  {
    absl::StatusOr<Lease> lease = client->Acquire(Prompt(16));
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_TRUE(lease->held());
  }
  v1::Stats dropped = Stats();
  EXPECT_EQ(dropped.leases(), 1u);  // queued, not yet released
  EXPECT_EQ(dropped.writing_pages(), 4u);
  absl::StatusOr<Lease> next = client->Acquire(Prompt(8, /*salt=*/1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->degraded());
  ASSERT_TRUE(next->held());
  v1::Stats after = Stats();
  EXPECT_EQ(after.leases(), 1u);         // the new one only
  EXPECT_EQ(after.writing_pages(), 2u);  // the dropped lease's 4 are free
}

TEST_F(ClientTest, DroppedLeasesBeyondOneAcquireWaitForTheNext) {
  ClientOptions o = Options();
  o.release_delay = absl::Hours(1);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  const uint32_t kDropped = kMaxReleaseLeasesPerAcquire + 6;
  std::vector<Lease> held;
  for (uint32_t i = 0; i < kDropped; ++i) {
    absl::StatusOr<Lease> lease = client->Acquire(Prompt(4, /*salt=*/i + 1));
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_TRUE(lease->held());
    held.push_back(*std::move(lease));
  }
  held.clear();  // all dropped at once
  EXPECT_EQ(Stats().leases(), kDropped);
  absl::StatusOr<Lease> a = client->Acquire(Prompt(4, /*salt=*/500));
  ASSERT_TRUE(a.ok()) << a.status();
  // 64 rode on the Acquire; 6 remain, plus the new lease.
  EXPECT_EQ(Stats().leases(), 6u + 1u);
  absl::StatusOr<Lease> b = client->Acquire(Prompt(4, /*salt=*/501));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Stats().leases(), 2u);
}

TEST_F(ClientTest, DroppedLeaseIsReleasedAfterTheDelay) {
  ClientOptions o = Options();
  o.release_delay = absl::Milliseconds(50);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  { ASSERT_TRUE(client->Acquire(Prompt(16)).ok()); }
  // No further Acquire: the session thread sends the Release.
  for (int i = 0; i < 100 && Stats().leases() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  v1::Stats s = Stats();
  EXPECT_EQ(s.leases(), 0u);
  EXPECT_EQ(s.writing_pages(), 0u);
  EXPECT_TRUE(client->connected());
}

TEST_F(ClientTest, ExpiredDroppedLeaseDoesNotFailTheNextAcquire) {
  daemon_->Kill(SIGKILL);
  daemon_->set_extra_flags({"--lease_ttl=1s"});
  ASSERT_TRUE(daemon_->Start().ok());
  ClientOptions o = Options();
  o.release_delay = absl::Hours(1);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  { ASSERT_TRUE(client->Acquire(Prompt(16)).ok()); }
  absl::SleepFor(absl::Milliseconds(1500));  // past the lease's TTL
  // The queued id no longer names a live lease; the Acquire still works,
  // on the same session.
  absl::StatusOr<Lease> next = client->Acquire(Prompt(8, /*salt=*/1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->degraded());
  EXPECT_TRUE(next->held());
  ClientState state = client->state();
  EXPECT_TRUE(state.connected);
  EXPECT_EQ(state.reconnects, 0u);
  EXPECT_EQ(Stats().leases(), 1u);
}

TEST_F(ClientTest, PromotedBlocksAreCountedOnTheLease) {
  // A 16-page pool (pages of this namespace's 512 bytes) over a host tier:
  // four 8-block prompts evict the first two into the tier.
  daemon_->Kill(SIGKILL);
  daemon_->set_extra_flags(
      {"--pool=host,bytes=8KiB,page_bytes=512", "--tier=host,bytes=64KiB"});
  ASSERT_TRUE(daemon_->Start().ok());
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  for (uint32_t salt = 0; salt < 4; ++salt) {
    absl::StatusOr<Lease> lease = client->Acquire(Prompt(32, salt));
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->promoted_blocks(), 0u);
    ASSERT_EQ(lease->new_blocks(), 8u);
    ASSERT_TRUE(lease->Commit(8, /*release=*/true).ok());
  }
  absl::StatusOr<Lease> again = client->Acquire(Prompt(32, 0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->matched_blocks(), 8u);
  EXPECT_EQ(again->promoted_blocks(), 8u);
  Lease moved = *std::move(again);  // the count moves with the lease
  EXPECT_EQ(moved.promoted_blocks(), 8u);
}

TEST_F(ClientTest, CommitThenHitAndPin) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<uint32_t> prompt = Prompt(18);  // 4 full blocks + 2
  {
    absl::StatusOr<Lease> first = client->Acquire(prompt);
    ASSERT_TRUE(first.ok());
    ASSERT_EQ(first->new_blocks(), 4u);
    // Chunked commit: 1 block, then the rest with release.
    absl::StatusOr<v1::CommitResponse> c1 = first->Commit(1, false);
    ASSERT_TRUE(c1.ok()) << c1.status();
    EXPECT_EQ(c1->inserted(), 1u);
    EXPECT_EQ(first->uncommitted_blocks(), 3u);
    EXPECT_EQ(first->Commit(4, false).status().code(),
              absl::StatusCode::kFailedPrecondition);  // only 3 left
    absl::StatusOr<v1::CommitResponse> c2 = first->Commit(3, true);
    ASSERT_TRUE(c2.ok()) << c2.status();
    EXPECT_EQ(c2->inserted(), 3u);
    EXPECT_FALSE(first->held());
  }
  absl::StatusOr<Lease> second = client->Acquire(prompt);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->matched_blocks(), 4u);
  EXPECT_EQ(second->matched_tokens(), 16u);
  EXPECT_EQ(second->new_blocks(), 0u);
  EXPECT_EQ(Stats().pinned_pages(), 4u);
  absl::StatusOr<v1::MatchResponse> m = client->Match(prompt);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->matched_blocks(), 4u);
  EXPECT_TRUE(second->Release().ok());
  EXPECT_TRUE(second->Release().ok());  // idempotent
  EXPECT_EQ(Stats().pinned_pages(), 0u);
}

TEST_F(ClientTest, ClosingTheClientReleasesItsLeases) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<Lease> lease = client->Acquire(Prompt(8));
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(Stats().leases(), 1u);
  client.reset();  // ends the session stream; the lease outlives the client
  lease->Release().IgnoreError();
  // The daemon ends the session's leases when the stream ends.
  for (int i = 0; i < 100 && Stats().sessions() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  v1::Stats s = Stats();
  EXPECT_EQ(s.sessions(), 0u);
  EXPECT_EQ(s.leases(), 0u);
  EXPECT_EQ(s.writing_pages(), 0u);
}

TEST_F(ClientTest, DegradesWhileDownAndReconnectsAfterRestart) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<uint32_t> prompt = Prompt(16, 7);
  absl::StatusOr<Lease> warm = client->Acquire(prompt);
  ASSERT_TRUE(warm.ok());
  ASSERT_TRUE(warm->Commit(4, true).ok());
  absl::StatusOr<Lease> held = client->Acquire(prompt);  // across the restart
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(held->matched_blocks(), 4u);
  const uint64_t generation = client->state().generation;

  daemon_->Kill(SIGKILL);
  // Down: Acquire answers "no match, no pages" instead of failing.
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Lease> l = client->Acquire(prompt);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_TRUE(l->degraded());
    EXPECT_EQ(l->matched_blocks(), 0u);
    EXPECT_TRUE(l->pages().empty());
    EXPECT_EQ(l->total_blocks(), 4u);
  }

  ASSERT_TRUE(daemon_->Start().ok());
  // Wait for the new session (not the old one, were its end still unnoticed).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (client->state().generation == generation && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(client->WaitForSession(absl::Seconds(60)).ok())
      << client->state().last_error;
  ClientState st = client->state();
  EXPECT_GT(st.generation, generation);
  EXPECT_GE(st.reconnects, 1u);

  // The old lease belongs to the dead session.
  EXPECT_EQ(held->Commit(0, true).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(held->Release().ok());

  // The restart lost the cache: a miss, then a hit after recommitting.
  absl::StatusOr<Lease> miss = client->Acquire(prompt);
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->degraded());
  EXPECT_EQ(miss->matched_blocks(), 0u);
  ASSERT_EQ(miss->new_blocks(), 4u);
  ASSERT_TRUE(miss->Commit(4, true).ok());
  absl::StatusOr<Lease> hit = client->Acquire(prompt);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->matched_blocks(), 4u);
}

TEST_F(ClientTest, StoppedDaemonDegradesAtTheDeadline) {
  ClientOptions o = Options();
  o.call_timeout = absl::Milliseconds(300);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  daemon_->Stop();
  const absl::Time start = absl::Now();
  absl::StatusOr<Lease> lease = client->Acquire(Prompt(16));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(lease->degraded());
  EXPECT_TRUE(lease->pages().empty());
  // Bounded by the deadline, not by the daemon (generous for a loaded box).
  EXPECT_LT(took, absl::Seconds(10));
  absl::StatusOr<v1::MatchResponse> m = client->Match(Prompt(16));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  daemon_->Continue();
  // Once the daemon runs again the client recovers: its session survives, or
  // (missed heartbeat acks) is re-opened; either way Acquire stops degrading.
  bool recovered = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!recovered && absl::Now() < deadline) {
    ASSERT_TRUE(client->WaitForSession(absl::Seconds(60)).ok());
    absl::StatusOr<Lease> after = client->Acquire(Prompt(16));
    ASSERT_TRUE(after.ok());
    recovered = !after->degraded();
    if (!recovered) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(recovered);
}

// The default wire form (tokens_le, block_keys_packed, pages_le) and the
// legacy one (repeated tokens / block_keys / pages) name the same blocks and
// pages.
TEST_F(ClientTest, PackedAndLegacyPromptFieldsAgree) {
  auto packed = Connect(Options());
  ClientOptions lo = Options();
  lo.legacy_prompt_fields = true;
  lo.client_name = "client_test_legacy";
  auto legacy = Connect(lo);
  ASSERT_NE(packed, nullptr);
  ASSERT_NE(legacy, nullptr);
  const std::vector<uint32_t> prompt = Prompt(22, 7);  // 5 full blocks + 2
  std::vector<uint64_t> committed;
  {
    absl::StatusOr<Lease> first = packed->Acquire(prompt);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_EQ(first->new_blocks(), 5u);
    absl::StatusOr<v1::CommitResponse> c = first->Commit(5, true);
    ASSERT_TRUE(c.ok()) << c.status();
    committed.assign(c->pages().begin(), c->pages().end());
  }
  for (Client* c : {legacy.get(), packed.get()}) {
    absl::StatusOr<Lease> hit = c->Acquire(prompt, {.allocate = false});
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->matched_blocks(), 5u);
    EXPECT_EQ(std::vector<uint64_t>(hit->pages().begin(), hit->pages().end()),
              committed);
    absl::StatusOr<v1::MatchResponse> m = c->Match(prompt);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->matched_blocks(), 5u);
  }
  // Which field each client sends shows in the daemon's refusal (this
  // daemon runs without --allow_key_mode).
  const std::vector<BlockKey> keys = packed->ComputeKeys(prompt);
  ASSERT_EQ(keys.size(), 5u);
  absl::StatusOr<Lease> k1 = packed->AcquireKeys(keys);
  EXPECT_EQ(k1.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(k1.status().message(), "block_keys_packed:"))
      << k1.status();
  absl::StatusOr<Lease> k2 = legacy->AcquireKeys(keys);
  EXPECT_EQ(k2.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(k2.status().message(), "block_keys:"))
      << k2.status();
}

TEST_F(ClientTest, BadInputIsAnErrorNotADegrade) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<Lease> empty = client->Acquire({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint32_t> huge(200000, 1);  // above --max_prompt_tokens
  absl::StatusOr<Lease> big = client->Acquire(huge);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument)
      << big.status();
  EXPECT_EQ(Stats().leases(), 0u);
}

TEST_F(ClientTest, AttachedHostPoolSharesPageBytes) {
  ClientOptions o = Options();
  o.attach_pool = true;
  auto writer = Connect(o);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(writer->pool(), nullptr);
  EXPECT_EQ(writer->state().pool.backend(), "host");
  const uint64_t page_bytes = writer->state().pool.page_bytes();
  ASSERT_EQ(page_bytes, Namespace().PageBytes());

  const std::vector<uint32_t> prompt = Prompt(8, 3);
  absl::StatusOr<Lease> w = writer->Acquire(prompt);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->new_blocks(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    void* p = w->page_address(i);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x40 + static_cast<int>(i), page_bytes);
  }
  EXPECT_EQ(w->page_address(2), nullptr);  // out of range
  ASSERT_TRUE(w->Commit(2, true).ok());

  o.client_name = "reader";
  auto reader = Connect(o);
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<Lease> r = reader->Acquire(prompt);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->matched_blocks(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto* p = static_cast<const unsigned char*>(r->page_address(i));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p[0], 0x40 + i);
    EXPECT_EQ(p[page_bytes - 1], 0x40 + i);
  }
}

}  // namespace
}  // namespace radixkv
