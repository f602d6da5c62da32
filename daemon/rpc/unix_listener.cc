#include "daemon/rpc/unix_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"

namespace radixkv::daemon {

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Start(
    const std::string& path, unsigned mode, PeerRegistry* registry,
    grpc::Server* server) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket ", path, ": must be 1..",
                     sizeof(addr.sun_path) - 1, " bytes"));
  }
  gpu::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("socket(): ", std::strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "--socket ", path, ": cannot bind: ", std::strerror(errno)));
  }
  // From here on the listener owns the file bind() created; a failure below
  // removes it.
  struct stat bound;
  if (lstat(path.c_str(), &bound) != 0) {
    return absl::InternalError(absl::StrCat("--socket ", path, ": lstat: ",
                                            std::strerror(errno)));
  }
  auto fail = [&](absl::Status s) {
    unlink(path.c_str());
    return s;
  };
  if (chmod(path.c_str(), mode) != 0) {
    return fail(absl::InternalError(absl::StrCat(
        "--socket ", path, ": chmod: ", std::strerror(errno))));
  }
  if (listen(fd.get(), 512) != 0) {
    return fail(absl::UnavailableError(absl::StrCat(
        "--socket ", path, ": cannot listen: ", std::strerror(errno))));
  }
  gpu::UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return fail(absl::InternalError(
        absl::StrCat("eventfd: ", std::strerror(errno))));
  }
  std::unique_ptr<UnixListener> l(new UnixListener(
      path, std::move(fd), std::move(wake), registry, server));
  l->socket_dev_ = bound.st_dev;
  l->socket_ino_ = bound.st_ino;
  l->thread_ = std::thread([p = l.get()] { p->Run(); });
  return l;
}

UnixListener::UnixListener(std::string path, gpu::UniqueFd listen_fd,
                           gpu::UniqueFd wake_fd, PeerRegistry* registry,
                           grpc::Server* server)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      registry_(registry),
      server_(server) {}

UnixListener::~UnixListener() {
  const uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  // Remove only the socket file this listener bound: once another process
  // has replaced it (a newer daemon on the same path), the path is theirs.
  struct stat st;
  if (lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      st.st_dev == socket_dev_ && st.st_ino == socket_ino_) {
    unlink(path_.c_str());
  }
}

void UnixListener::Run() {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      Log(LogLevel::kError, absl::StrCat("unix listener: poll: ",
                                         std::strerror(errno)));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn =
        accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        Log(LogLevel::kWarning, absl::StrCat("unix listener: accept: ",
                                             std::strerror(errno)));
        if (errno == EMFILE || errno == ENFILE) usleep(10000);
      }
      continue;
    }
    absl::StatusOr<gpu::PeerCredentials> creds = gpu::GetPeerCredentials(conn);
    if (!creds.ok()) {
      Log(LogLevel::kWarning,
          absl::StrCat("unix listener: refused a connection without "
                       "credentials: ", creds.status().message()));
      close(conn);
      continue;
    }
    registry_->Add(conn, *creds);
    grpc::AddInsecureChannelFromFd(server_, conn);
  }
}

}  // namespace radixkv::daemon
