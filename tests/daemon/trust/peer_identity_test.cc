// Tests of PeerIdentity and PeerRegistry (daemon/trust/peer_identity.h): who is
// the same party for holding a session, the principal limits count by,
// group membership, and the registry of accepted connections by
// descriptor. IdentifyCall over a real Unix connection is tested in
// unix_listener_test.cc.
#include "daemon/trust/peer_identity.h"

#include <sys/types.h>

#include <vector>

#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

TEST(PeerRegistryTest, RecordsByDescriptorAndOverwritesOnReuse) {
  PeerRegistry r;
  gpu::PeerCredentials out;
  EXPECT_FALSE(r.Find(5, &out));
  r.Add(5, {.pid = 10, .uid = 1000, .gid = 1000, .groups = {4, 27}});
  r.Add(6, {.pid = 11, .uid = 1001, .gid = 1001});
  ASSERT_TRUE(r.Find(5, &out));
  EXPECT_EQ(out.pid, 10);
  EXPECT_EQ(out.uid, 1000u);
  EXPECT_EQ(out.groups, (std::vector<gid_t>{4, 27}));
  // The descriptor number reused by a later connection.
  r.Add(5, {.pid = 12, .uid = 0, .gid = 0});
  ASSERT_TRUE(r.Find(5, &out));
  EXPECT_EQ(out.pid, 12);
  EXPECT_EQ(out.uid, 0u);
  EXPECT_TRUE(out.groups.empty());
  ASSERT_TRUE(r.Find(6, &out));
  EXPECT_EQ(out.pid, 11);
}

TEST(PeerIdentityTest, SamePartyPrincipalAndGroups) {
  PeerIdentity a;
  a.transport = PeerIdentity::Transport::kUnix;
  a.uid = 1000;
  a.gid = 100;
  a.groups = {27};
  a.pid = 42;
  PeerIdentity b = a;
  EXPECT_TRUE(a.SameParty(b));
  b.pid = 43;
  EXPECT_FALSE(a.SameParty(b));             // another process of the same user
  EXPECT_EQ(a.Principal(), b.Principal());  // counted as one peer
  EXPECT_EQ(a.Principal(), "uid:1000");
  EXPECT_EQ(a.ToString(), "uid=1000 gid=100 pid=42");
  EXPECT_TRUE(a.InGroup(100));
  EXPECT_TRUE(a.InGroup(27));
  EXPECT_FALSE(a.InGroup(28));
  // Unknown credentials are nobody's party, not even their own.
  PeerIdentity unknown = a;
  unknown.uid = static_cast<uid_t>(-1);
  unknown.pid = -1;
  EXPECT_FALSE(unknown.SameParty(unknown));

  PeerIdentity t1;
  t1.transport = PeerIdentity::Transport::kTls;
  t1.subject = "svc";
  t1.address = "ipv4:1.1.1.1:1";
  PeerIdentity t2 = t1;
  t2.address = "ipv4:1.1.1.1:2";
  EXPECT_TRUE(t1.SameParty(t2));  // same certificate, other connection
  EXPECT_EQ(t1.Principal(), "tls:svc");
  t1.subject.clear();
  t2.subject.clear();
  EXPECT_FALSE(t1.SameParty(t2));  // no certificate: the connection only
  EXPECT_TRUE(t1.SameParty(t1));
  EXPECT_EQ(t1.Principal(), "tls:ipv4:1.1.1.1:1");
  EXPECT_FALSE(t1.SameParty(a));  // other transports never match

  PeerIdentity tcp;
  tcp.transport = PeerIdentity::Transport::kTcp;
  tcp.address = "ipv4:2.2.2.2:5";
  EXPECT_EQ(tcp.ToString(), "tcp:ipv4:2.2.2.2:5");
  EXPECT_TRUE(tcp.SameParty(tcp));
  EXPECT_TRUE(PeerIdentity::InProcess().SameParty(PeerIdentity::InProcess()));
  EXPECT_EQ(PeerIdentity::InProcess().Principal(), "in-process");
}

}  // namespace
}  // namespace radixkv::daemon
