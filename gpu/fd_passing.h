// File: gpu/fd_passing.h
//
// Passing file descriptors over Unix sockets (SCM_RIGHTS), as the attach
// protocol does on SOCK_SEQPACKET sockets: one message = one send, with its
// fds as ancillary data, delivered whole or not at all.
//
//   SendWithFds(sock, bytes, {fd0, fd1});           // fds are duplicated
//   absl::StatusOr<ReceivedMessage> m = RecvWithFds(sock, 4096, 8);
//   if (m.ok() && !m->eof) use(m->bytes, m->fds);   // m->fds own the fds
//
// Received fds are close-on-exec (MSG_CMSG_CLOEXEC) and owned by UniqueFd,
// so every error path closes them.
//
// Thread safety: plain functions; concurrent use of one socket is the
// caller's business.
#ifndef RADIXKV_GPU_FD_PASSING_H_
#define RADIXKV_GPU_FD_PASSING_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gpu/posix_resources.h"

namespace radixkv::gpu {

// Linux's SCM_MAX_FD: the most fds one message can carry.
inline constexpr size_t kMaxFdsPerMessage = 253;

// Sends `bytes` as one message with `fds` attached (the fds stay owned by the
// caller; the receiver gets duplicates). MSG_NOSIGNAL: a closed peer gives
// UNAVAILABLE, not SIGPIPE. INVALID_ARGUMENT for more than
// kMaxFdsPerMessage fds; DEADLINE_EXCEEDED when a send timeout expires.
absl::Status SendWithFds(int sock, absl::string_view bytes,
                         absl::Span<const int> fds);

struct ReceivedMessage {
  std::string bytes;
  std::vector<UniqueFd> fds;
  // The peer closed the connection (or shut down writing) without sending.
  bool eof = false;
};

// Receives one message of at most `max_bytes` bytes and `max_fds` fds.
// A larger message (MSG_TRUNC) or more fds (MSG_CTRUNC) is an error
// (INVALID_ARGUMENT naming the limit) and any fds that did arrive are closed.
// Honours SO_RCVTIMEO (DEADLINE_EXCEEDED) and MSG_DONTWAIT via `flags`
// (UNAVAILABLE "no message yet" when nothing is queued). EINTR is retried.
absl::StatusOr<ReceivedMessage> RecvWithFds(int sock, size_t max_bytes,
                                            size_t max_fds, int flags = 0);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;  // the peer's primary (effective) gid at connect time
  // The peer's supplementary groups at connect time (SO_PEERGROUPS).
  std::vector<gid_t> groups;
};

// SO_PEERCRED and SO_PEERGROUPS of a connected Unix socket.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock);

// Sets SO_RCVTIMEO and SO_SNDTIMEO (a non-positive or infinite duration
// means "no timeout").
absl::Status SetSocketTimeouts(int sock, absl::Duration timeout);

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_FD_PASSING_H_
