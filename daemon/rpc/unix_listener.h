// File: daemon/rpc/unix_listener.h
//
// UnixListener: accepts the gRPC Unix socket's connections itself, so that
// each connection's kernel credentials are known before any call on it.
// For every accepted connection it reads SO_PEERCRED / SO_PEERGROUPS,
// records them in the PeerRegistry under the descriptor, and then hands
// the descriptor to the gRPC server (grpc::AddInsecureChannelFromFd), which
// owns it from then on. A connection whose credentials cannot be read is
// closed.
//
// Thread safety: one accept thread; Start and the destructor from one
// thread. The destructor stops accepting and removes the socket file it
// bound, unless the path now names another file (a newer daemon's socket);
// connections already handed over stay with gRPC.
#ifndef RADIXKV_DAEMON_RPC_UNIX_LISTENER_H_
#define RADIXKV_DAEMON_RPC_UNIX_LISTENER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/trust/peer_identity.h"
#include "gpu/posix_resources.h"

namespace grpc {
class Server;
}

namespace radixkv::daemon {

class UnixListener {
 public:
  // Binds `path` (which must not exist; mode `mode`), listens, and starts
  // accepting into `server`. `registry` and `server` are borrowed and must
  // outlive the listener.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Start(
      const std::string& path, unsigned mode, PeerRegistry* registry,
      grpc::Server* server);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

 private:
  UnixListener(std::string path, gpu::UniqueFd listen_fd,
               gpu::UniqueFd wake_fd, PeerRegistry* registry,
               grpc::Server* server);
  void Run();

  const std::string path_;
  dev_t socket_dev_ = 0;  // the socket file bind() created at path_
  ino_t socket_ino_ = 0;
  gpu::UniqueFd listen_fd_;
  gpu::UniqueFd wake_fd_;  // eventfd: written by the destructor
  PeerRegistry* const registry_;
  grpc::Server* const server_;
  std::thread thread_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_UNIX_LISTENER_H_
