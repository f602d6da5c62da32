// File: daemon/rpc/attach_server.cc
#include "daemon/rpc/attach_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/rpc/attach_protocol.h"
#include "base/log.h"
#include "gpu/fd_passing.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::daemon {

using gpu::ErrnoStatus;
using gpu::UniqueFd;

struct AttachServer::Pending {
  UniqueFd fd;
  gpu::PeerCredentials peer;
  absl::Time deadline;
};

namespace {

bool FillAddress(const std::string& path, struct sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  return true;
}

// Removes a stale socket file at `path`; refuses to touch a live socket or a
// non-socket.
absl::Status RemoveStaleSocket(const std::string& path,
                               const struct sockaddr_un& addr) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(absl::StrCat("attach socket ", path, ": lstat"), errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("attach socket ", path,
                     " exists and is not a socket; not removing it"));
  }
  UniqueFd probe(
      ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe.valid()) return ErrnoStatus("attach socket: socket", errno);
  if (::connect(probe.get(), reinterpret_cast<const struct sockaddr*>(&addr),
                sizeof(addr)) == 0 ||
      errno == EAGAIN) {
    return absl::FailedPreconditionError(
        absl::StrCat("attach socket ", path,
                     " is in use by a running process (another radixkvd?)"));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(absl::StrCat("attach socket ", path, ": unlink"), errno);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttachServer>> AttachServer::Start(
    const Options& options, Resolver resolve) {
  struct sockaddr_un addr;
  if (!FillAddress(options.path, &addr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attach socket: path '", options.path, "' must be 1..",
        sizeof(addr.sun_path) - 1, " bytes (it is ", options.path.size(), ")"));
  }
  if (!resolve) {
    return absl::InvalidArgumentError("attach socket: resolver is null");
  }
  if (absl::Status s = RemoveStaleSocket(options.path, addr); !s.ok()) return s;
  UniqueFd listen_fd(
      ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_fd.valid()) return ErrnoStatus("attach socket: socket", errno);
  if (::bind(listen_fd.get(), reinterpret_cast<struct sockaddr*>(&addr),
             sizeof(addr)) != 0) {
    return ErrnoStatus(absl::StrCat("attach socket ", options.path, ": bind"),
                       errno);
  }
  if (::chmod(options.path.c_str(), options.mode) != 0 ||
      ::listen(listen_fd.get(), 64) != 0) {
    absl::Status s = ErrnoStatus(
        absl::StrCat("attach socket ", options.path, ": chmod/listen"), errno);
    ::unlink(options.path.c_str());
    return s;
  }
  struct stat bound;
  ino_t socket_ino =
      ::lstat(options.path.c_str(), &bound) == 0 ? bound.st_ino : 0;
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    absl::Status s = ErrnoStatus("attach socket: eventfd", errno);
    ::unlink(options.path.c_str());
    return s;
  }
  std::unique_ptr<AttachServer> server(
      new AttachServer(options, std::move(resolve), std::move(listen_fd),
                       std::move(wake), socket_ino));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

AttachServer::AttachServer(Options options, Resolver resolve,
                           UniqueFd listen_fd, UniqueFd wake_fd,
                           ino_t socket_ino)
    : options_(std::move(options)),
      resolve_(std::move(resolve)),
      self_uid_(::geteuid()),
      listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      socket_ino_(socket_ino) {}

AttachServer::~AttachServer() {
  uint64_t one = 1;
  while (::write(wake_fd_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
  // Unlink only our own socket file: after a restart race the path may
  // already belong to a newer daemon.
  struct stat st;
  if (::lstat(options_.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      st.st_ino == socket_ino_) {
    ::unlink(options_.path.c_str());
  }
}

AttachServer::Stats AttachServer::stats() const {
  Stats s;
  s.accepted = accepted_.load(std::memory_order_relaxed);
  s.served = served_.load(std::memory_order_relaxed);
  s.refused = refused_.load(std::memory_order_relaxed);
  return s;
}

bool AttachServer::Trusted(const gpu::PeerCredentials& peer) const {
  if (peer.uid == 0) return true;
  if (options_.allow_same_uid && peer.uid == self_uid_) return true;
  auto allowed = [this](gid_t g) {
    return std::find(options_.allowed_gids.begin(),
                     options_.allowed_gids.end(),
                     g) != options_.allowed_gids.end();
  };
  return allowed(peer.gid) ||
         std::any_of(peer.groups.begin(), peer.groups.end(), allowed);
}

void AttachServer::Refuse(const Pending& conn, absl::string_view why) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kWarning,
      absl::StrCat("audit: attach refused for pid=", conn.peer.pid,
                   " uid=", conn.peer.uid, " gid=", conn.peer.gid, ": ", why));
}

void AttachServer::Run() {
  std::vector<Pending> pending;
  std::vector<struct pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    absl::Time next_deadline = absl::InfiniteFuture();
    for (const Pending& p : pending) {
      fds.push_back({p.fd.get(), POLLIN, 0});
      next_deadline = std::min(next_deadline, p.deadline);
    }
    int timeout_ms = -1;
    if (next_deadline != absl::InfiniteFuture()) {
      absl::Duration left = next_deadline - absl::Now();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 0,
          1 << 30));
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "radixkvd: attach: poll: %s; stopping\n",
                   std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;  // shutdown

    // Serve readable connections and expire late ones. Iterate backwards
    // over the pollfd entries so erasing keeps the indices valid.
    absl::Time now = absl::Now();
    for (size_t i = pending.size(); i-- > 0;) {
      short revents = fds[i + 2].revents;
      bool done = false;
      if (revents != 0) {
        Serve(&pending[i]);
        done = !pending[i].fd.valid();
      }
      if (!done && pending[i].deadline <= now) {
        Refuse(pending[i],
               absl::StrCat("no session id within ",
                            absl::FormatDuration(options_.request_timeout)));
        done = true;
      }
      if (done) pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
    }
    if (fds[1].revents != 0) Accept(&pending);
  }
}

void AttachServer::Accept(std::vector<Pending>* pending) {
  while (true) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr,
                          SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        std::fprintf(stderr, "radixkvd: attach: accept: %s\n",
                     std::strerror(errno));
      }
      return;
    }
    accepted_.fetch_add(1, std::memory_order_relaxed);
    Pending conn{std::move(fd), {}, absl::Now() + options_.request_timeout};
    absl::StatusOr<gpu::PeerCredentials> peer =
        gpu::GetPeerCredentials(conn.fd.get());
    if (!peer.ok()) {
      Refuse(conn, peer.status().ToString());
      continue;
    }
    conn.peer = *peer;
    if (!Trusted(*peer)) {
      Refuse(
          conn,
          absl::StrCat(
              "untrusted peer (daemon uid ", self_uid_,
              "; allowed: same uid, uid 0",
              options_.allowed_gids.empty()
                  ? ""
                  : ", or an allowed primary or supplementary group",
              ")"));
      continue;
    }
    if (pending->size() >= options_.max_pending) {
      Refuse(conn, absl::StrCat("too many connections waiting (max_pending=",
                                options_.max_pending, ")"));
      continue;
    }
    if (options_.max_pending_per_uid != 0) {
      size_t of_uid = 0;
      for (const Pending& p : *pending) of_uid += p.peer.uid == conn.peer.uid;
      if (of_uid >= options_.max_pending_per_uid) {
        Refuse(conn, absl::StrCat("uid ", conn.peer.uid, " already has ",
                                  of_uid, " connections waiting (the limit "
                                  "--attach_max_pending_per_uid=",
                                  options_.max_pending_per_uid, ")"));
        continue;
      }
    }
    pending->push_back(std::move(conn));
  }
}

void AttachServer::Serve(Pending* conn) {
  absl::StatusOr<gpu::ReceivedMessage> msg = gpu::RecvWithFds(
      conn->fd.get(), kMaxSessionIdBytes, /*max_fds=*/0, MSG_DONTWAIT);
  if (!msg.ok() && absl::IsUnavailable(msg.status())) return;  // spurious
  // From here on the connection is answered or refused, then closed.
  UniqueFd fd = std::move(conn->fd);
  if (!msg.ok()) {
    Refuse(*conn, absl::StrCat("bad message (session id: UTF-8, at most ",
                               kMaxSessionIdBytes,
                               " bytes, no fds): ", msg.status().message()));
    return;
  }
  static_assert(kMaxSessionIdBytes == kMaxAttachSessionIdBytes);
  absl::StatusOr<absl::string_view> parsed =
      ParseAttachRequest(msg->bytes, msg->fds.size(), msg->eof);
  if (!parsed.ok()) {
    Refuse(*conn, parsed.status().message());
    return;
  }
  absl::string_view id = *parsed;
  std::string shown = absl::CHexEscape(id.substr(0, 64));
  const gpu::PagePool* pool = resolve_(id, conn->peer);
  if (pool == nullptr) {
    Refuse(*conn, absl::StrCat("unknown session '", shown,
                               "', or one another uid opened"));
    return;
  }
  if (pool->backend() == gpu::Backend::kNone || pool->chunk_count() == 0) {
    Refuse(*conn, absl::StrCat("session '", shown,
                               "' uses a pool with no memory (none)"));
    return;
  }
  radixkv::v1::AttachResponse response;
  response.set_backend(gpu::BackendName(pool->backend()));
  response.set_page_bytes(pool->page_bytes());
  response.set_pages_per_chunk(pool->pages_per_chunk());
  response.set_capacity_pages(pool->capacity_pages());
  response.set_device(pool->device());
  std::vector<int> chunk_fds;
  for (size_t c = 0; c < pool->chunk_count(); ++c) {
    response.add_chunks()->set_bytes(pool->chunk_bytes(c));
    chunk_fds.push_back(pool->chunk_fd(c));
  }
  std::string bytes;
  response.SerializeToString(&bytes);
  // Counted before the reply leaves: a worker that has its reply (and
  // whoever it tells) must find itself in stats(), as a refused one does.
  served_.fetch_add(1, std::memory_order_relaxed);
  if (absl::Status s = gpu::SendWithFds(fd.get(), bytes, chunk_fds); !s.ok()) {
    served_.fetch_sub(1, std::memory_order_relaxed);
    Refuse(*conn, absl::StrCat("sending the reply failed: ", s.message()));
    return;
  }
}

}  // namespace radixkv::daemon
