// File: client/attach.h
//
// The worker side of the attach protocol (docs/CONTRACTS.md §3): connect to
// the daemon's attach socket, send the session id, receive the pool's layout
// and chunk fds, and map the pool.
//
//   absl::StatusOr<std::unique_ptr<gpu::MappedPool>> pool =
//       AttachPool(info.pool().attach_socket(), info.session_id(),
//                  absl::Seconds(5));
//   void* page = (*pool)->page_address(lease.pages()[0]);
//
// Thread safety: AttachPool is a plain function; concurrent calls are fine.
#ifndef RADIXKV_CLIENT_ATTACH_H_
#define RADIXKV_CLIENT_ATTACH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gpu/mapped_pool.h"

namespace radixkv {

// Attaches to the pool of `session_id` through `attach_socket` and maps it.
// The result owns the mapping; it stays valid after the daemon exits.
// Errors:
//   UNAVAILABLE        no daemon listens on attach_socket
//   PERMISSION_DENIED  the daemon closed the connection without a reply:
//                      unknown session or untrusted peer ("attach refused")
//   DEADLINE_EXCEEDED  no reply within `timeout`
//   INVALID_ARGUMENT   a bad session id (empty, > 256 bytes) or a reply that
//                      does not describe a mappable pool
//   FAILED_PRECONDITION / INTERNAL  from mapping (MappedPool::Map)
absl::StatusOr<std::unique_ptr<gpu::MappedPool>> AttachPool(
    const std::string& attach_socket, absl::string_view session_id,
    absl::Duration timeout);

}  // namespace radixkv

#endif  // RADIXKV_CLIENT_ATTACH_H_
