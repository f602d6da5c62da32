// File: client/attach.cc
#include "client/attach.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/fd_passing.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv {
namespace {

// Session ids are at most this long (daemon/rpc/attach_server.h).
constexpr size_t kMaxSessionIdBytes = 256;
// A reply with 253 chunks is about 2.5 KB; anything near this is garbage.
constexpr size_t kMaxReplyBytes = 64 * 1024;

absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<gpu::MappedPool>> AttachPool(
    const std::string& attach_socket, absl::string_view session_id,
    absl::Duration timeout) {
  if (session_id.empty() || session_id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach: session_id must be 1..", kMaxSessionIdBytes,
                     " bytes (it is ", session_id.size(), ")"));
  }
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (attach_socket.empty() || attach_socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attach: attach_socket path must be 1..", sizeof(addr.sun_path) - 1,
        " bytes (it is ", attach_socket.size(), ")"));
  }
  std::memcpy(addr.sun_path, attach_socket.data(), attach_socket.size());

  gpu::UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return gpu::ErrnoStatus("attach: socket", errno);
  if (absl::Status s = gpu::SetSocketTimeouts(sock.get(), timeout); !s.ok()) {
    return s;
  }
  if (::connect(sock.get(), reinterpret_cast<struct sockaddr*>(&addr),
                sizeof(addr)) != 0) {
    int err = errno;
    std::string what = absl::StrCat("attach: connect to ", attach_socket, ": ",
                                    std::strerror(err));
    if (err == ENOENT || err == ECONNREFUSED) {
      return absl::UnavailableError(
          absl::StrCat(what, " (is radixkvd running?)"));
    }
    if (err == EPROTOTYPE) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " (not a SOCK_SEQPACKET attach socket)"));
    }
    if (err == EAGAIN || err == ETIMEDOUT || err == EINPROGRESS) {
      return absl::DeadlineExceededError(what);
    }
    return gpu::ErrnoStatus(what, err);
  }
  if (absl::Status s = gpu::SendWithFds(sock.get(), session_id, {}); !s.ok()) {
    if (absl::IsUnavailable(s)) {
      return absl::PermissionDeniedError(
          "attach refused: unknown session or untrusted peer (the daemon "
          "closed the connection)");
    }
    return Prefixed(s, "attach: sending the session id: ");
  }
  absl::StatusOr<gpu::ReceivedMessage> reply =
      gpu::RecvWithFds(sock.get(), kMaxReplyBytes, gpu::kMaxFdsPerMessage);
  if (!reply.ok()) {
    if (absl::IsDeadlineExceeded(reply.status())) {
      return absl::DeadlineExceededError(
          absl::StrCat("attach: no reply from ", attach_socket, " within ",
                       absl::FormatDuration(timeout)));
    }
    return Prefixed(reply.status(), "attach: receiving the reply: ");
  }
  if (reply->eof) {
    return absl::PermissionDeniedError(
        "attach refused: unknown session or untrusted peer (the daemon "
        "closed the connection without a reply; see its log)");
  }
  v1::AttachResponse response;
  if (!response.ParseFromString(reply->bytes)) {
    return absl::InvalidArgumentError(
        "attach: the reply is not a radixkv.v1.AttachResponse");
  }
  gpu::PoolLayout layout;
  if (response.backend() == "host") {
    layout.backend = gpu::Backend::kHost;
  } else if (response.backend() == "cuda") {
    layout.backend = gpu::Backend::kCuda;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("attach: reply backend '", response.backend(),
                     "' cannot be mapped (want host or cuda)"));
  }
  layout.page_bytes = response.page_bytes();
  layout.pages_per_chunk = response.pages_per_chunk();
  layout.capacity_pages = response.capacity_pages();
  layout.device = response.device();
  for (const v1::AttachChunk& chunk : response.chunks()) {
    layout.chunk_bytes.push_back(chunk.bytes());
  }
  if (absl::Status s = gpu::ValidatePoolLayout(layout, reply->fds.size());
      !s.ok()) {
    return Prefixed(s, "attach: ");
  }
  absl::StatusOr<std::unique_ptr<gpu::MappedPool>> pool =
      gpu::MappedPool::Map(layout, std::move(reply->fds));
  if (!pool.ok()) return Prefixed(pool.status(), "attach: ");
  return pool;
}

}  // namespace radixkv
