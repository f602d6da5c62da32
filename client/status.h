// File: client/status.h
//
// The client side of radixkv's one status mapping: the daemon converts its
// absl::Status to grpc::Status at the edge (ToGrpcStatus), and the client
// converts back with FromGrpcStatus (both in radixkv/errors.h). Both code
// spaces are the canonical google.rpc.Code values, so the conversion is a
// cast; the message travels unchanged and an ErrorDetail comes back as the
// same payload.
//
// Thread safety: pure functions.
#ifndef RADIXKV_CLIENT_STATUS_H_
#define RADIXKV_CLIENT_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"
#include "radixkv/errors.h"

namespace radixkv {

// True for the codes that mean "the daemon did not answer in time or is not
// there": UNAVAILABLE, DEADLINE_EXCEEDED and CANCELLED. The client library
// degrades to a cache miss on these; radixkvctl exits with code 2.
bool IsUnreachable(const absl::Status& status);

}  // namespace radixkv

#endif  // RADIXKV_CLIENT_STATUS_H_
