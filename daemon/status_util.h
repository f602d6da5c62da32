// File: daemon/status_util.h
//
// The one conversion from absl::Status (used everywhere inside radixkv) to
// grpc::Status (the wire). absl::StatusCode values equal google.rpc.Code, so
// the code is a cast; the message is truncated to kMaxGrpcStatusMessageBytes
// so a huge error never bloats a trailer. OK becomes grpc::Status::OK, which
// must not carry a message. client/ has the inverse.
//
// Thread safety: pure functions.
#ifndef RADIXKV_DAEMON_STATUS_UTIL_H_
#define RADIXKV_DAEMON_STATUS_UTIL_H_

#include <cstddef>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace radixkv::daemon {

inline constexpr size_t kMaxGrpcStatusMessageBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_STATUS_UTIL_H_
