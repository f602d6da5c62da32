// Unit tests of daemon pieces without a server: the status mapping and
// structured errors, the event ring and the session table.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cache.h"
#include "daemon/event_log.h"
#include "daemon/request_validation.h"
#include "daemon/session_table.h"
#include "radixkv/errors.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

// tokens_le: read in place when aligned, copied (same values) when not.
TEST(TokensLeViewTest, InPlaceWhenAlignedCopiedWhenNot) {
  const std::vector<uint32_t> ids = {1, 0x01020304u, 0xfffffffeu, 70000};
  std::string wire;
  for (uint32_t t : ids) {
    for (int i = 0; i < 4; ++i) wire.push_back(static_cast<char>(t >> (8 * i)));
  }
  // One spare byte in front, so both an aligned and a misaligned start exist.
  alignas(8) char buffer[1 + 16 + 8];
  for (int offset : {0, 1}) {
    SCOPED_TRACE(offset);
    std::memcpy(buffer + offset, wire.data(), wire.size());
    std::vector<uint32_t> copy;
    const absl::Span<const uint32_t> view =
        daemon::TokensLeView(absl::string_view(buffer + offset, wire.size()), &copy);
    EXPECT_EQ(std::vector<uint32_t>(view.begin(), view.end()), ids);
    if (offset == 0) {
      EXPECT_EQ(static_cast<const void*>(view.data()), buffer);  // no copy
      EXPECT_TRUE(copy.empty());
    } else {
      EXPECT_EQ(view.data(), copy.data());
    }
  }
  std::vector<uint32_t> copy;
  EXPECT_TRUE(daemon::TokensLeView(absl::string_view(buffer + 1, 0), &copy).empty());
}

TEST(StatusUtilTest, EveryCodeIsCastAndOkHasNoMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::OkStatus()).error_message(), "");
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), absl::StrCat("m", code));
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), absl::StrCat("m", code));
  }
}

TEST(StatusUtilTest, LongMessagesAreTruncated) {
  const grpc::Status g =
      ToGrpcStatus(absl::InvalidArgumentError(std::string(5000, 'x')));
  EXPECT_EQ(g.error_message().size(), kMaxGrpcStatusMessageBytes);
}

// An ErrorDetail survives the trip absl -> gRPC -> absl (the trailer is an
// RpcStatus, google.rpc.Status's wire form); a status without one has no
// details on the wire.
TEST(StatusUtilTest, ErrorDetailTravelsInTheStatusDetails) {
  const absl::Status s =
      FieldError(absl::StatusCode::kNotFound, "release_leases",
                 v1::ERROR_REASON_LEASE_NOT_FOUND, "lease 7 expired");
  EXPECT_EQ(s.message(), "release_leases: lease 7 expired");
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_message(), "release_leases: lease 7 expired");
  v1::RpcStatus wire;
  ASSERT_TRUE(wire.ParseFromString(g.error_details()));
  EXPECT_EQ(wire.code(), static_cast<int>(absl::StatusCode::kNotFound));
  ASSERT_EQ(wire.details_size(), 1);
  EXPECT_EQ(wire.details(0).type_url(), kErrorDetailTypeUrl);
  const absl::Status back = FromGrpcStatus(g);
  EXPECT_EQ(back.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(back.message(), s.message());
  EXPECT_EQ(ErrorFieldOf(back), "release_leases");
  EXPECT_EQ(ErrorReasonOf(back), v1::ERROR_REASON_LEASE_NOT_FOUND);
  EXPECT_TRUE(ToGrpcStatus(absl::NotFoundError("x")).error_details().empty());
  EXPECT_EQ(ErrorReasonOf(FromGrpcStatus(
                grpc::Status(grpc::StatusCode::NOT_FOUND, "x", "garbage"))),
            v1::ERROR_REASON_UNSPECIFIED);
  // WithField prefixes the message; WithDetail keeps it.
  const absl::Status w = WithField("lease_id", v1::ERROR_REASON_LEASE_NOT_FOUND,
                                   absl::NotFoundError("gone"));
  EXPECT_EQ(w.message(), "lease_id: gone");
  EXPECT_EQ(ErrorFieldOf(w), "lease_id");
  const absl::Status d = WithDetail("lease_id", v1::ERROR_REASON_INVALID,
                                    absl::NotFoundError("gone"));
  EXPECT_EQ(d.message(), "gone");
  EXPECT_EQ(ErrorReasonOf(d), v1::ERROR_REASON_INVALID);
  EXPECT_TRUE(WithField("x", v1::ERROR_REASON_INVALID, absl::OkStatus()).ok());
}

TreeEvent Stored(uint32_t page) {
  TreeEvent e;
  e.type = TreeEvent::Type::kStored;
  e.key = BlockKey{1, page};
  e.page = page;
  return e;
}

TEST(EventLogTest, ReadsInOrderThenWaits) {
  EventLog log(8);
  EXPECT_EQ(log.next_sequence(), 1u);
  std::vector<TreeEvent> events = {Stored(1), Stored(2), Stored(3)};
  log.OnTreeEvents(events);
  uint64_t next = 1;
  v1::Event e;
  for (uint32_t i = 1; i <= 3; ++i) {
    ASSERT_TRUE(log.Read(&next, &e));
    EXPECT_EQ(e.sequence(), i);
    EXPECT_EQ(e.stored().page(), i);
  }
  EXPECT_FALSE(log.Read(&next, &e));
  EXPECT_EQ(next, 4u);
}

TEST(EventLogTest, SlowReaderGetsAGapThenTheOldestHeld) {
  EventLog log(4);
  std::vector<TreeEvent> events;
  for (uint32_t i = 1; i <= 10; ++i) events.push_back(Stored(i));
  log.OnTreeEvents(events);  // holds 7..10
  uint64_t next = 2;
  v1::Event e;
  ASSERT_TRUE(log.Read(&next, &e));
  ASSERT_TRUE(e.has_gap());
  EXPECT_EQ(e.gap().first_missing(), 2u);
  EXPECT_EQ(e.gap().next_sequence(), 7u);
  EXPECT_EQ(next, 7u);
  ASSERT_TRUE(log.Read(&next, &e));
  EXPECT_EQ(e.sequence(), 7u);
  EXPECT_EQ(e.stored().page(), 7u);
}

class CountingWatcher : public EventLog::Watcher {
 public:
  void OnEventsAvailable() override {
    absl::MutexLock lock(&mu);
    ++woken;
  }
  void OnShutdown() override {
    absl::MutexLock lock(&mu);
    shut = true;
  }
  absl::Mutex mu;
  int woken ABSL_GUARDED_BY(mu) = 0;
  bool shut ABSL_GUARDED_BY(mu) = false;
};

TEST(EventLogTest, WatchersAreWokenAndShutDown) {
  EventLog log(8);
  CountingWatcher w;
  log.Subscribe(&w);
  std::vector<TreeEvent> events = {Stored(1)};
  log.OnTreeEvents(events);
  {
    absl::MutexLock lock(&w.mu);
    auto woken = [&w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) { return w.woken > 0; };
    EXPECT_TRUE(w.mu.AwaitWithTimeout(absl::Condition(&woken), absl::Seconds(30)));
  }
  log.Shutdown();
  {
    absl::MutexLock lock(&w.mu);
    EXPECT_TRUE(w.shut);
  }
  log.Unsubscribe(&w);
}

// A Unix peer as the daemon identifies it.
PeerIdentity UnixPeer(uid_t uid, pid_t pid) {
  PeerIdentity p;
  p.transport = PeerIdentity::Transport::kUnix;
  p.uid = uid;
  p.gid = uid;
  p.pid = pid;
  p.address = "fd:9";
  return p;
}

Caller CallerOf(const PeerIdentity& peer) {
  Caller c = Caller::Local();
  c.peer = peer;
  c.admin = false;
  return c;
}

TEST(SessionTableTest, IdsOwnersLimitsAndErrors) {
  SessionTable m(/*max_sessions=*/2);
  const Caller& me = Caller::Local();
  absl::StatusOr<SessionEntry> a = m.Create({.ns = 3}, "a", me, 0, {});
  absl::StatusOr<SessionEntry> b = m.Create({}, "b", me, 0, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->id.size(), 32u);
  EXPECT_NE(a->id, b->id);
  EXPECT_NE(a->owner, kNoOwner);
  EXPECT_NE(a->owner, b->owner);
  absl::StatusOr<SessionEntry> c = m.Create({}, "c", me, 0, {});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrorReasonOf(c.status()), v1::ERROR_REASON_LIMIT);

  absl::StatusOr<SessionRef> ref = m.Lookup(a->id, me.peer);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->owner, a->owner);
  EXPECT_EQ(ref->binding.ns, 3u);
  EXPECT_EQ(m.SessionsPerNamespace()[3], 1u);

  EXPECT_EQ(m.Remove(b->id), b->owner);
  EXPECT_EQ(m.Remove(b->id), kNoOwner);  // twice is harmless
  absl::Status gone = m.Lookup(b->id, me.peer).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorReasonOf(gone), v1::ERROR_REASON_SESSION_NOT_FOUND);
  EXPECT_EQ(ErrorFieldOf(gone), "session_id");
  EXPECT_EQ(m.Lookup("", me.peer).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A new session never reuses an owner id: leases of a closed session
  // cannot be adopted.
  absl::StatusOr<SessionEntry> d = m.Create({}, "d", me, 0, {});
  ASSERT_TRUE(d.ok());
  EXPECT_NE(d->owner, a->owner);
  EXPECT_NE(d->owner, b->owner);
  EXPECT_EQ(m.size(), 2u);
}

TEST(SessionTableTest, ASessionIsUsableOnlyByThePeerThatOpenedIt) {
  SessionTable m(/*max_sessions=*/8);
  const PeerIdentity alice = UnixPeer(1000, 4242);
  absl::StatusOr<SessionEntry> s = m.Create({}, "w", CallerOf(alice), 0, {});
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(m.Lookup(s->id, alice).ok());
  // Same uid, another process: another party.
  for (const PeerIdentity& other :
       {UnixPeer(1000, 4243), UnixPeer(1001, 4242), PeerIdentity::InProcess()}) {
    absl::Status denied = m.Lookup(s->id, other).status();
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied)
        << other.ToString();
    EXPECT_EQ(ErrorReasonOf(denied), v1::ERROR_REASON_PERMISSION_DENIED);
    EXPECT_EQ(ErrorFieldOf(denied), "session_id");
  }
  // A connection whose credentials are unknown is nobody's peer.
  PeerIdentity unknown = UnixPeer(static_cast<uid_t>(-1), -1);
  absl::StatusOr<SessionEntry> u = m.Create({}, "u", CallerOf(unknown), 0, {});
  ASSERT_TRUE(u.ok());
  EXPECT_FALSE(m.Lookup(u->id, unknown).ok());
  // TCP: bound to the connection.
  PeerIdentity tcp;
  tcp.transport = PeerIdentity::Transport::kTcp;
  tcp.address = "ipv4:127.0.0.1:40000";
  absl::StatusOr<SessionEntry> t = m.Create({}, "t", CallerOf(tcp), 0, {});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(m.Lookup(t->id, tcp).ok());
  tcp.address = "ipv4:127.0.0.1:40001";
  EXPECT_EQ(m.Lookup(t->id, tcp).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(SessionTableTest, PerPeerAndPerTenantLimits) {
  SessionTable m(/*max_sessions=*/100);
  const Caller a = CallerOf(UnixPeer(1000, 1));
  const Caller a2 = CallerOf(UnixPeer(1000, 2));  // same uid: same principal
  const Caller b = CallerOf(UnixPeer(1001, 3));
  ASSERT_TRUE(m.Create({}, "", a, 0, {.per_peer = 2}).ok());
  ASSERT_TRUE(m.Create({}, "", a2, 0, {.per_peer = 2}).ok());
  absl::Status full = m.Create({}, "", a, 0, {.per_peer = 2}).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("--max_sessions_per_peer=2"), std::string::npos)
      << full;
  EXPECT_TRUE(m.Create({}, "", b, 0, {.per_peer = 2}).ok());
  // Everyone here is the default tenant: 3 sessions.
  absl::Status tenant = m.Create({}, "", b, 0, {.per_tenant = 3}).status();
  EXPECT_EQ(tenant.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(tenant.message().find("max_sessions=3"), std::string::npos) << tenant;
  EXPECT_EQ(m.size(), 3u);
}

}  // namespace
}  // namespace radixkv::daemon
