#include "daemon/rpc_util.h"

#include <chrono>

#include "radixkv/errors.h"

namespace radixkv::daemon {

absl::Status Admission(const grpc::CallbackServerContext* ctx,
                       const ServiceEnv& env) {
  if (env.draining != nullptr && env.draining->load(std::memory_order_acquire)) {
    return absl::UnavailableError(
        "radixkvd is shutting down; retry after it restarts");
  }
  if (ctx->deadline() < std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("deadline passed before handling");
  }
  return absl::OkStatus();
}

void RecordUnary(const ServiceEnv& env, Method method, absl::Time start,
                 const absl::Status& status) {
  if (env.metrics != nullptr) env.metrics->Record(method, status, absl::Now() - start);
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const ServiceEnv& env, Method method,
                                      absl::Time start,
                                      const absl::Status& status) {
  RecordUnary(env, method, start, status);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace radixkv::daemon
