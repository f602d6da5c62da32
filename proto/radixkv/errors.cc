#include "radixkv/errors.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"
#include "absl/strings/str_cat.h"

namespace radixkv {

absl::Status FieldError(absl::StatusCode code, absl::string_view field,
                        v1::ErrorReason reason, absl::string_view message) {
  return WithDetail(field, reason,
                    absl::Status(code, absl::StrCat(field, ": ", message)));
}

absl::Status WithDetail(absl::string_view field, v1::ErrorReason reason,
                        const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status s = status;
  v1::ErrorDetail detail;
  detail.set_field(field.data(), field.size());
  detail.set_reason(reason);
  s.SetPayload(kErrorDetailTypeUrl, absl::Cord(detail.SerializeAsString()));
  return s;
}

absl::Status WithField(absl::string_view field, v1::ErrorReason reason,
                       const absl::Status& status) {
  if (status.ok()) return status;
  return FieldError(status.code(), field, reason, status.message());
}

bool GetErrorDetail(const absl::Status& status, v1::ErrorDetail* detail) {
  const absl::optional<absl::Cord> payload =
      status.GetPayload(kErrorDetailTypeUrl);
  return payload.has_value() &&
         detail->ParseFromString(std::string(*payload));
}

v1::ErrorReason ErrorReasonOf(const absl::Status& status) {
  v1::ErrorDetail detail;
  return GetErrorDetail(status, &detail) ? detail.reason()
                                         : v1::ERROR_REASON_UNSPECIFIED;
}

std::string ErrorFieldOf(const absl::Status& status) {
  v1::ErrorDetail detail;
  return GetErrorDetail(status, &detail) ? detail.field() : std::string();
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(
      status.message().data(),
      std::min(status.message().size(), kMaxGrpcStatusMessageBytes));
  const auto code = static_cast<grpc::StatusCode>(status.code());
  const absl::optional<absl::Cord> payload =
      status.GetPayload(kErrorDetailTypeUrl);
  if (!payload.has_value()) return grpc::Status(code, std::move(message));
  v1::RpcStatus details;
  details.set_code(static_cast<int32_t>(status.code()));
  details.set_message(message);
  google::protobuf::Any* any = details.add_details();
  any->set_type_url(kErrorDetailTypeUrl);
  any->set_value(std::string(*payload));
  return grpc::Status(code, std::move(message), details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const std::string& message = status.error_message();
  // absl::StatusCode and grpc::StatusCode both follow google.rpc.Code: 1..16.
  if (code < 1 || code > 16) {
    return absl::UnknownError(
        absl::StrCat("grpc status code ", code, ": ", message));
  }
  absl::Status out(static_cast<absl::StatusCode>(code), message);
  v1::RpcStatus details;
  if (!status.error_details().empty() &&
      details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      if (any.type_url() == kErrorDetailTypeUrl) {
        out.SetPayload(kErrorDetailTypeUrl, absl::Cord(any.value()));
      }
    }
  }
  return out;
}

}  // namespace radixkv
