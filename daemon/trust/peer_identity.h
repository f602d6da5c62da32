// File: daemon/trust/peer_identity.h
//
// Who is calling, as radixkvd verified it, never as the client claims.
//
//  - Unix socket: radixkvd accepts each connection itself, reads the
//    kernel's SO_PEERCRED / SO_PEERGROUPS (uid, gid, supplementary groups,
//    pid at connect time), records them in a PeerRegistry under the
//    descriptor, and only then hands the descriptor to gRPC. gRPC names such
//    a connection "fd:N", which IdentifyCall maps back to the record.
//  - TLS over TCP: the client certificate's identity (subject common name,
//    else the first SAN) from gRPC's auth context; verified when the daemon
//    requires client certificates (--tls_client_ca).
//  - Plaintext TCP (--insecure_tcp): only the connection's address; nothing
//    about the process behind it is known.
//
// Thread safety: PeerIdentity is a value. PeerRegistry is thread-safe.
#ifndef RADIXKV_DAEMON_TRUST_PEER_IDENTITY_H_
#define RADIXKV_DAEMON_TRUST_PEER_IDENTITY_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gpu/fd_passing.h"

namespace grpc {
class ServerContextBase;
}

namespace radixkv::daemon {

struct PeerIdentity {
  enum class Transport { kInProcess, kUnix, kTls, kTcp };
  Transport transport = Transport::kInProcess;
  // kUnix: the kernel's credentials of the connecting process.
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  pid_t pid = 0;
  // kTls: the certificate identity; empty when the client sent none.
  std::string subject;
  // The transport address as gRPC reports it ("fd:12", "ipv4:1.2.3.4:5").
  std::string address;

  // The daemon itself (tests and benchmarks driving the core directly).
  static PeerIdentity InProcess();

  // Whether this peer is the same party as `other` for holding a session:
  // same uid and pid (Unix), same certificate identity (TLS; the same
  // connection when the client sent no certificate), same connection
  // (plaintext TCP), both in-process.
  bool SameParty(const PeerIdentity& other) const;
  // For logs: "uid=1000 gid=1000 pid=4242", "tls:CN", "tcp:ipv4:...".
  std::string ToString() const;
  // The key that --max_sessions_per_peer counts by: the uid (Unix), the
  // certificate identity (TLS; else the address), the address (plaintext
  // TCP).
  std::string Principal() const;
  // Whether the peer's gid or a supplementary group is `g`.
  bool InGroup(gid_t g) const;
};

// Credentials of the Unix connections radixkvd accepted, by descriptor.
// A descriptor number is recorded before gRPC sees it and overwritten when
// the number is reused by a later connection.
class PeerRegistry {
 public:
  void Add(int fd, const gpu::PeerCredentials& creds);
  // false when `fd` was never recorded.
  bool Find(int fd, gpu::PeerCredentials* out) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, gpu::PeerCredentials> by_fd_ ABSL_GUARDED_BY(mu_);
};

// The identity of the peer of a call. `registry` may be null (no Unix
// listener); a Unix connection it does not know is reported as a kUnix
// peer with uid and pid -1, which no policy trusts.
PeerIdentity IdentifyCall(const grpc::ServerContextBase& ctx,
                          const PeerRegistry* registry);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TRUST_PEER_IDENTITY_H_
