#include "daemon/rpc/rpc_util.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "daemon/core/cache.h"
#include "base/log.h"
#include "grpcpp/impl/codegen/proto_utils.h"
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

absl::StatusOr<Caller> AdmitCaller(const grpc::CallbackServerContext* ctx,
                                   const ServiceEnv& env, Method method) {
  if (absl::Status s = Admission(ctx, env); !s.ok()) return s;
  if (env.policy == nullptr) return Caller::Daemon();
  absl::StatusOr<Caller> caller =
      env.policy->Admit(IdentifyCall(*ctx, env.peers));
  if (!caller.ok()) {
    env.cache->CountPermissionDenied();
    Log(LogLevel::kWarning, absl::StrCat("audit: refused ", MethodName(method),
                                         ": ", caller.status().message()));
  }
  return caller;
}

absl::Status RequireAdmin(const Caller& caller, Method method,
                          const ServiceEnv& env) {
  if (caller.scope.admin()) return absl::OkStatus();
  env.cache->CountPermissionDenied();
  Log(LogLevel::kWarning,
      absl::StrCat("audit: refused ", MethodName(method), " from ", caller.peer.ToString(),
                   " (tenant ", caller.scope.name(), "): not an administrator"));
  return FieldError(absl::StatusCode::kPermissionDenied, "peer",
                    v1::ERROR_REASON_PERMISSION_DENIED,
                    absl::StrCat(MethodName(method),
                                 " needs the administrator role; ",
                                 caller.peer.ToString(), " does not have it "
                                 "(--admin_gids, --admin_subjects, --tenants)"));
}

absl::Status ParseBody(grpc::ByteBuffer* body,
                       google::protobuf::MessageLite* msg) {
  const size_t bytes = body->Length();
  if (grpc::SerializationTraits<google::protobuf::MessageLite>::Deserialize(
          body, msg)
          .ok()) {
    return absl::OkStatus();
  }
  body->Clear();  // a reader that failed to start leaves it
  return WithDetail("request", v1::ERROR_REASON_INVALID,
                    absl::InvalidArgumentError(absl::StrCat(
                        "request body (", bytes, " bytes) is not a valid ",
                        msg->GetTypeName())));
}

absl::Status SerializeBody(const google::protobuf::MessageLite& msg,
                           grpc::ByteBuffer* body) {
  body->Clear();  // gRPC's writer appends to an empty buffer only
  bool own_buffer = false;
  const grpc::Status s =
      grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
          msg, body, &own_buffer);
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cannot serialize the ",
                                          msg.GetTypeName(), " answer: ",
                                          s.error_message()));
}

absl::StatusOr<Caller> AdmitRequest(const grpc::CallbackServerContext* ctx,
                                    const ServiceEnv& env, Method method,
                                    const grpc::ByteBuffer* body,
                                    google::protobuf::MessageLite* msg) {
  absl::StatusOr<Caller> caller = AdmitCaller(ctx, env, method);
  if (!caller.ok()) return caller;
  // gRPC passes the request as const, but the buffer is the method's own
  // (its handler's message holder, released after the method returns), so
  // parsing may consume it.
  absl::Status s = ParseBody(const_cast<grpc::ByteBuffer*>(body), msg);
  if (!s.ok()) return s;
  return caller;
}

absl::Time StartCall(const ServiceEnv& env, Method method) {
  if (env.metrics != nullptr) env.metrics->Started(method);
  return absl::Now();
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
