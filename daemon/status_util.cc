#include "daemon/status_util.h"

#include <string>

namespace radixkv::daemon {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message().data(),
                      std::min(status.message().size(),
                               kMaxGrpcStatusMessageBytes));
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::move(message));
}

}  // namespace radixkv::daemon
