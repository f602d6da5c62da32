// Unit tests of the session table (daemon/core/session_table.h).
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/session_table.h"
#include "radixkv/errors.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

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

// A worker of the built-in tenant.
Caller CallerOf(const PeerIdentity& peer) {
  return Caller{peer, TenantScope(Caller::Daemon().scope.tenant(),
                                  /*admin=*/false)};
}

TEST(SessionTableTest, IdsOwnersLimitsAndErrors) {
  SessionTable m(/*max_sessions=*/2);
  const Caller& me = Caller::Daemon();
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
