// File: daemon/rpc/attach_protocol.h
//
// The request half of the attach protocol (docs/CONTRACTS.md §3, normative):
// what one message a worker sends on the attach socket must be for radixkvd
// to look its session up. The socket work (peer checks, recvmsg, the reply
// with the pool's fds) stays in attach_server.cc; this is the pure part, so
// it can be tested and fuzzed without a socket.
//
//   absl::StatusOr<absl::string_view> id =
//       ParseAttachRequest(msg.bytes, msg.fds.size(), msg.eof);
//   if (!id.ok()) refuse(id.status().message());   // close, send nothing
//
// Thread safety: pure functions.
#ifndef RADIXKV_DAEMON_RPC_ATTACH_PROTOCOL_H_
#define RADIXKV_DAEMON_RPC_ATTACH_PROTOCOL_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace radixkv::daemon {

// Longest session id an attach message may carry, in bytes.
inline constexpr size_t kMaxAttachSessionIdBytes = 256;

// The session id an attach message carries: `bytes` exactly, when they are
// 1 to kMaxAttachSessionIdBytes bytes of valid UTF-8 and the message carried
// no file descriptors (`fd_count` 0) and was not an end-of-file (`eof`).
// Otherwise INVALID_ARGUMENT whose message is the refusal reason radixkvd
// logs. The returned view points into `bytes`.
absl::StatusOr<absl::string_view> ParseAttachRequest(absl::string_view bytes,
                                                     size_t fd_count, bool eof);

// True when `s` is well-formed UTF-8: no overlong forms, no surrogates
// (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequence. The
// empty string is valid.
bool IsValidUtf8(absl::string_view s);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_ATTACH_PROTOCOL_H_
