// File: gpu/fd_passing.cc
#include "gpu/fd_passing.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace radixkv::gpu {

absl::Status SendWithFds(int sock, absl::string_view bytes,
                         absl::Span<const int> fds) {
  if (fds.size() > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("SendWithFds: ", fds.size(), " fds; at most ",
                     kMaxFdsPerMessage, " fit in one message"));
  }
  struct iovec iov;
  iov.iov_base = const_cast<char*>(bytes.data());
  iov.iov_len = bytes.size();
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  while (true) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != bytes.size()) {
        return absl::InternalError(
            absl::StrCat("sendmsg: sent ", n, " of ", bytes.size(), " bytes"));
      }
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError("sendmsg: timed out");
    }
    return ErrnoStatus("sendmsg", errno);
  }
}

absl::StatusOr<ReceivedMessage> RecvWithFds(int sock, size_t max_bytes,
                                            size_t max_fds, int flags) {
  if (max_fds > kMaxFdsPerMessage) max_fds = kMaxFdsPerMessage;
  ReceivedMessage out;
  // One spare byte is not needed: MSG_TRUNC reports a longer datagram.
  out.bytes.resize(max_bytes);
  struct iovec iov;
  iov.iov_base = out.bytes.data();
  iov.iov_len = max_bytes;
  // Room for max_fds fds; at least one cmsghdr so that an unexpected fd
  // shows up as MSG_CTRUNC rather than vanishing silently.
  std::vector<char> control(
      CMSG_SPACE(sizeof(int) * (max_fds == 0 ? 1 : max_fds)), 0);
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  while (true) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (flags & MSG_DONTWAIT) {
        return absl::UnavailableError("recvmsg: no message yet");
      }
      return absl::DeadlineExceededError("recvmsg: timed out");
    }
    if (errno == ECONNRESET) {
      out.bytes.clear();
      out.eof = true;
      return out;
    }
    return ErrnoStatus("recvmsg", errno);
  }
  // Take ownership of every fd that arrived before looking at any flag.
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (msg.msg_flags & MSG_TRUNC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recvmsg: message longer than the limit of ", max_bytes, " bytes"));
  }
  if ((msg.msg_flags & MSG_CTRUNC) || out.fds.size() > max_fds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recvmsg: message carried more than the limit of ", max_fds, " fds"));
  }
  out.bytes.resize(static_cast<size_t>(n));
  out.eof = n == 0 && out.fds.empty();
  return out;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock) {
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus("getsockopt(SO_PEERCRED)", errno);
  }
  PeerCredentials out{cred.pid, cred.uid, cred.gid, {}};
  // SO_PEERGROUPS answers ERANGE with the size it needs when the buffer is
  // too small.
  out.groups.resize(16);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(out.groups.size() * sizeof(gid_t));
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, out.groups.data(),
                     &bytes) == 0) {
      out.groups.resize(bytes / sizeof(gid_t));
      return out;
    }
    if (errno != ERANGE) return ErrnoStatus("getsockopt(SO_PEERGROUPS)", errno);
    out.groups.resize(bytes / sizeof(gid_t) + 1);
  }
  return ErrnoStatus("getsockopt(SO_PEERGROUPS)", ERANGE);
}

absl::Status SetSocketTimeouts(int sock, absl::Duration timeout) {
  struct timeval tv = {};
  if (timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration()) {
    tv = absl::ToTimeval(timeout);
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  }
  if (::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return ErrnoStatus("setsockopt(SO_RCVTIMEO/SO_SNDTIMEO)", errno);
  }
  return absl::OkStatus();
}

}  // namespace radixkv::gpu
