// File: daemon/rpc/rpc_util.h
//
// The bookkeeping every unary RPC shares, in one place: refuse while the
// daemon drains, refuse an already expired deadline, identify the peer and
// admit it (its tenant and role, access_policy.h), call the core with that
// Caller, record the metrics, Finish exactly once with the converted
// status.
//
// Every method is served on raw bytes (grpc::ByteBuffer in and out, the
// generated WithRawCallbackMethod_* services) and parses its own request
// with ParseBody: gRPC's typed handlers answer a body that does not parse
// with UNIMPLEMENTED and no message, uncounted, and end a stream's read as
// if the client had closed it. Here such a body is INVALID_ARGUMENT with an
// ErrorDetail, counted like any other answer, and reaches no core code. A
// unary method names its request and response types; its typed code is a
// function of (caller, request, response):
//
//   grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx,
//                                    const grpc::ByteBuffer* body,
//                                    grpc::ByteBuffer* reply) override {
//     return RunUnary<v1::CommitRequest, v1::CommitResponse>(
//         ctx, env_, Method::kCommit, body, reply,
//         [&](const Caller& c, const v1::CommitRequest& req,
//             v1::CommitResponse* resp) {
//           return env_.cache->Commit(req, resp, c);
//         });
//   }
//
// The response is serialized into `reply` before the call is finished (gRPC
// sends `reply` as it is at Finish).
//
// Also StreamWriteState, the one-write-at-a-time rule of the two streaming
// reactors (Session, WatchEvents).
//
// Thread safety: stateless helpers; ServiceEnv members are thread-safe.
#ifndef RADIXKV_DAEMON_RPC_RPC_UTIL_H_
#define RADIXKV_DAEMON_RPC_RPC_UTIL_H_

#include <atomic>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "daemon/trust/access_policy.h"
#include "daemon/rpc/metrics.h"
#include "daemon/trust/peer_identity.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"

namespace radixkv::daemon {

class Cache;

// What the services borrow from the Server; all pointers outlive them.
struct ServiceEnv {
  Cache* cache = nullptr;
  Metrics* metrics = nullptr;            // may be null (metrics off)
  const std::atomic<bool>* draining = nullptr;
  const AccessPolicy* policy = nullptr;  // null: every peer is Caller::Daemon
  const PeerRegistry* peers = nullptr;   // null: no Unix listener
};

// UNAVAILABLE while draining, DEADLINE_EXCEEDED when the client's deadline
// has passed, else OK.
absl::Status Admission(const grpc::CallbackServerContext* ctx,
                       const ServiceEnv& env);

// Admission, then the verified caller: PERMISSION_DENIED (counted, and
// logged with the peer) when no tenant takes it.
absl::StatusOr<Caller> AdmitCaller(const grpc::CallbackServerContext* ctx,
                                   const ServiceEnv& env, Method method);

// PERMISSION_DENIED naming the method unless the caller is an
// administrator; every refusal is counted and logged with the peer.
absl::Status RequireAdmin(const Caller& caller, Method method,
                          const ServiceEnv& env);

// A call of `method` begins: counts it as started (Metrics::Started) and
// returns the time its latency is measured from. Every StartCall is
// followed by one RecordUnary (or Metrics::Record) of the same method.
absl::Time StartCall(const ServiceEnv& env, Method method);

// Records `status` and the latency since `start` for `method`.
void RecordUnary(const ServiceEnv& env, Method method, absl::Time start,
                 const absl::Status& status);

// Records `status` for `method` and finishes the call with it.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const ServiceEnv& env, Method method,
                                      absl::Time start,
                                      const absl::Status& status);

// Parses `body` into `msg` (its previous contents are replaced). A body
// that is not a valid serialized message of msg's type is INVALID_ARGUMENT
// "request body (N bytes) is not a valid radixkv.v1.TYPE" with an
// ErrorDetail{field "request", ERROR_REASON_INVALID}. Either way `body` is
// consumed: its bytes are released and it is left empty.
absl::Status ParseBody(grpc::ByteBuffer* body,
                       google::protobuf::MessageLite* msg);

// `msg` serialized into `body`, replacing what it held; INTERNAL when the
// message cannot be serialized (over 2 GiB).
absl::Status SerializeBody(const google::protobuf::MessageLite& msg,
                           grpc::ByteBuffer* body);

// AdmitCaller, then the request `body` of a unary or server-streaming
// method parsed into `msg` (ParseBody; the caller is refused before its
// bytes are read). `body` is the buffer gRPC hands the method, which the
// method owns until it returns; it is consumed.
absl::StatusOr<Caller> AdmitRequest(const grpc::CallbackServerContext* ctx,
                                    const ServiceEnv& env, Method method,
                                    const grpc::ByteBuffer* body,
                                    google::protobuf::MessageLite* msg);

// One unary call served on raw bytes: AdmitRequest into a Req, then
// fn(caller, req, &resp) -> absl::Status; on OK the Resp is serialized into
// `reply`; the status is recorded and the call finished with it. The
// request and response live until this returns: `fn` must not keep them.
template <typename Req, typename Resp, typename Fn>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* ctx,
                                   const ServiceEnv& env, Method method,
                                   const grpc::ByteBuffer* body,
                                   grpc::ByteBuffer* reply, Fn&& fn) {
  const absl::Time start = StartCall(env, method);
  Req req;
  Resp resp;
  absl::StatusOr<Caller> caller = AdmitRequest(ctx, env, method, body, &req);
  absl::Status status = caller.ok() ? fn(*caller, req, &resp) : caller.status();
  if (status.ok()) status = SerializeBody(resp, reply);
  return FinishUnary(ctx, env, method, start, status);
}

// The write/finish bookkeeping of a server stream that writes one message at
// a time. gRPC takes no Finish while a write is in flight, so an end that
// arrives during a write waits for it:
//
//   under the reactor's lock:
//     if (state.can_write()) { state.WriteStarted(); StartWrite(&msg); }
//     OnWriteDone:  if (auto s = state.WriteDone()) { Finish(*s); return; }
//     to end:       if (auto s = state.End(status)) Finish(*s);
//
// Thread safety: none of its own; use it under the reactor's mutex.
class StreamWriteState {
 public:
  bool finished() const { return finished_; }
  // No write in flight and not finished.
  bool can_write() const { return !finished_ && !writing_; }
  // REQUIRES: can_write().
  void WriteStarted() { writing_ = true; }
  // The write in flight completed: the status to Finish with now, if an end
  // was waiting for it.
  std::optional<grpc::Status> WriteDone() {
    writing_ = false;
    return std::exchange(deferred_, std::nullopt);
  }
  // Ends the stream, once: the status to Finish with now; nothing when it
  // already ended or when a write is in flight (WriteDone returns it then).
  std::optional<grpc::Status> End(grpc::Status status) {
    if (finished_) return std::nullopt;
    finished_ = true;
    if (writing_) {
      deferred_ = std::move(status);
      return std::nullopt;
    }
    return status;
  }

 private:
  bool writing_ = false;
  bool finished_ = false;
  std::optional<grpc::Status> deferred_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_RPC_UTIL_H_
