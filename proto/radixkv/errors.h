// File: proto/radixkv/errors.h
//
// Structured errors, shared by radixkvd and its clients. An error about one
// request field is an absl::Status whose message starts with the field's
// name and which carries a radixkv.v1.ErrorDetail payload (field, reason).
// At the gRPC edge the payload travels in the standard status details, so
// a client gets the same absl::Status back and decides what to do from the
// code and the detail, never from the message text.
//
//   return FieldError(absl::StatusCode::kNotFound, "lease_id",
//                     v1::ERROR_REASON_LEASE_NOT_FOUND, "unknown lease 7");
//   ...
//   if (ErrorReasonOf(s) == v1::ERROR_REASON_LEASE_NOT_FOUND) ...
//
// Thread safety: pure functions.
#ifndef RADIXKV_PROTO_RADIXKV_ERRORS_H_
#define RADIXKV_PROTO_RADIXKV_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv {

// The type URL of ErrorDetail as a status payload and in status details.
inline constexpr char kErrorDetailTypeUrl[] =
    "type.googleapis.com/radixkv.v1.ErrorDetail";

// Longest status message sent over gRPC; longer ones are truncated, so a
// huge error never bloats a trailer.
inline constexpr size_t kMaxGrpcStatusMessageBytes = 1024;

// An error with code `code` (not OK) about `field`: message
// "<field>: <message>" and an ErrorDetail{field, reason} payload.
absl::Status FieldError(absl::StatusCode code, absl::string_view field,
                        v1::ErrorReason reason, absl::string_view message);

// `status` (from a layer that does not know the request's field names)
// as an error about `field`: same code, message prefixed with the field.
// OK stays OK.
absl::Status WithField(absl::string_view field, v1::ErrorReason reason,
                       const absl::Status& status);

// `status` with an ErrorDetail{field, reason} payload and its message as it
// is (for a message that already names the field). OK stays OK.
absl::Status WithDetail(absl::string_view field, v1::ErrorReason reason,
                        const absl::Status& status);

// The status's ErrorDetail; false when it carries none.
bool GetErrorDetail(const absl::Status& status, v1::ErrorDetail* detail);
// The detail's reason, or ERROR_REASON_UNSPECIFIED without one.
v1::ErrorReason ErrorReasonOf(const absl::Status& status);
// The detail's field, or "" without one.
std::string ErrorFieldOf(const absl::Status& status);

// absl::Status -> grpc::Status: the code (both follow google.rpc.Code), the
// message truncated to kMaxGrpcStatusMessageBytes, and an ErrorDetail
// payload as status details (an RpcStatus). OK becomes grpc::Status::OK.
grpc::Status ToGrpcStatus(const absl::Status& status);

// grpc::Status -> absl::Status with the same code and message, and the
// ErrorDetail from the status details, if any. A code outside the canonical
// range becomes UNKNOWN with the original code in the message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace radixkv

#endif  // RADIXKV_PROTO_RADIXKV_ERRORS_H_
