// File: daemon/rpc/attach_server.h
//
// AttachServer: the daemon side of the attach protocol (docs/CONTRACTS.md
// §3, normative). It listens on a Unix SOCK_SEQPACKET socket beside the gRPC
// socket. A worker connects and sends one message, its session id (UTF-8,
// at most kMaxSessionIdBytes). The server checks the peer with SO_PEERCRED,
// resolves the session to its pool and answers with one message: a
// serialized radixkv.v1.AttachResponse with one fd per chunk, in order, as
// SCM_RIGHTS. For an untrusted peer, an unknown session, a malformed message
// or a pool without memory (none) it closes the connection without sending
// anything, and logs one line to stderr.
//
//   // cache: the daemon's Cache*, which outlives the server.
//   AttachServer::Options opts;
//   opts.path = AttachSocketPathFor(grpc_socket_path);  // radixkv/defaults.h
//   ASSIGN_OR_RETURN(
//       std::unique_ptr<AttachServer> server,
//       AttachServer::Start(opts, [cache](absl::string_view id,
//                                         const gpu::PeerCredentials& peer) {
//         return cache->PoolForAttach(id, peer);  // nullptr: refuse
//       }));
//
// Threads: one thread runs a poll loop over the listening socket, an eventfd
// for shutdown and the connections that have not yet sent their id. Every
// connection is non-blocking and has a deadline (Options::request_timeout),
// so a silent or slow peer never blocks the others. `resolve` runs on that
// thread; it must be thread-safe with respect to the rest of the daemon and
// must not block for long. The PagePool it returns must stay alive until
// `resolve` is called again or the server is destroyed.
//
// Ownership: the server owns its socket and thread; the destructor stops the
// thread, closes every connection and unlinks the socket path.
#ifndef RADIXKV_DAEMON_RPC_ATTACH_SERVER_H_
#define RADIXKV_DAEMON_RPC_ATTACH_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gpu/fd_passing.h"
#include "gpu/pool.h"
#include "gpu/posix_resources.h"

namespace radixkv::daemon {

class AttachServer {
 public:
  static constexpr size_t kMaxSessionIdBytes = 256;

  struct Options {
    // Socket path (< 108 bytes). A stale socket at this path is removed; a
    // live one (another daemon answering) or a non-socket file is an error.
    std::string path;
    // Trust peers whose uid equals this process's effective uid. uid 0 is
    // always trusted.
    bool allow_same_uid = true;
    // Also trust peers whose primary gid or any supplementary group
    // (SO_PEERGROUPS, as at connect time) is one of these.
    std::vector<gid_t> allowed_gids;
    // A connection that has not sent its session id by then is closed.
    absl::Duration request_timeout = absl::Seconds(5);
    // Connections waiting for their session id at once; more are refused.
    size_t max_pending = 64;
    // Of those, at most this many from one uid (0: no per-uid limit), so
    // one peer holding connections open cannot lock the others out.
    size_t max_pending_per_uid = 8;
    // Socket file mode.
    uint32_t mode = 0660;
  };

  // Resolves a session id, asked for by `peer`, to its pool; nullptr to
  // refuse (an unknown session, one the peer may not map).
  using Resolver = std::function<const gpu::PagePool*(
      absl::string_view session_id, const gpu::PeerCredentials& peer)>;
  using SimpleResolver =
      std::function<const gpu::PagePool*(absl::string_view session_id)>;

  // Counters since Start.
  struct Stats {
    uint64_t accepted = 0;  // connections accepted
    uint64_t served = 0;    // replies sent with the pool's fds
    uint64_t refused = 0;   // closed without a reply (any reason)
  };

  // Binds, listens and starts the thread. Errors: INVALID_ARGUMENT for an
  // empty or too long path or a null resolver; FAILED_PRECONDITION when the
  // path is taken by a live socket or a non-socket; errno-derived statuses
  // for socket/bind/listen failures.
  static absl::StatusOr<std::unique_ptr<AttachServer>> Start(
      const Options& options, Resolver resolve);
  // The same, for a resolver that does not look at the peer.
  static absl::StatusOr<std::unique_ptr<AttachServer>> Start(
      const Options& options, SimpleResolver resolve) {
    if (!resolve) return Start(options, Resolver());
    return Start(options, [r = std::move(resolve)](
                              absl::string_view id,
                              const gpu::PeerCredentials&) { return r(id); });
  }

  ~AttachServer();
  AttachServer(const AttachServer&) = delete;
  AttachServer& operator=(const AttachServer&) = delete;

  const std::string& path() const { return options_.path; }
  Stats stats() const;

 private:
  struct Pending;

  AttachServer(Options options, Resolver resolve, gpu::UniqueFd listen_fd,
               gpu::UniqueFd wake_fd, ino_t socket_ino);
  void Run();
  void Accept(std::vector<Pending>* pending);
  // Reads the session id from a readable connection and answers it.
  void Serve(Pending* conn);
  void Refuse(const Pending& conn, absl::string_view why);
  // uid 0, the daemon's uid (allow_same_uid), or a peer whose primary or
  // any supplementary group is in allowed_gids.
  bool Trusted(const gpu::PeerCredentials& peer) const;

  const Options options_;
  const Resolver resolve_;
  const uid_t self_uid_;
  gpu::UniqueFd listen_fd_;
  gpu::UniqueFd wake_fd_;   // eventfd: written by the destructor to stop Run
  const ino_t socket_ino_;  // inode of the socket file we bound
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_ATTACH_SERVER_H_
