#include "client/status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace radixkv {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const std::string& message = status.error_message();
  // absl::StatusCode and grpc::StatusCode both follow google.rpc.Code: 1..16.
  if (code < 1 || code > 16) {
    return absl::UnknownError(
        absl::StrCat("grpc status code ", code, ": ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

bool IsUnreachable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

}  // namespace radixkv
