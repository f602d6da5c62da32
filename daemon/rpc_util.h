// File: daemon/rpc_util.h
//
// The bookkeeping every unary RPC shares, in one place: refuse while the
// daemon drains, refuse an already expired deadline, call the core, record
// the metrics, Finish exactly once with the converted status.
//
//   grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx,
//                                     const v1::AcquireRequest* req,
//                                     v1::AcquireResponse* resp) override {
//     return RunUnary(ctx, env_, Method::kAcquire,
//                     [&] { return env_.cache->Acquire(*req, resp); });
//   }
//
// Also StreamWriteState, the one-write-at-a-time rule of the two streaming
// reactors (Session, WatchEvents).
//
// Thread safety: stateless helpers; ServiceEnv members are thread-safe.
#ifndef RADIXKV_DAEMON_RPC_UTIL_H_
#define RADIXKV_DAEMON_RPC_UTIL_H_

#include <atomic>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/metrics.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace radixkv::daemon {

class Cache;

// What the services borrow from the Server; all pointers outlive them.
struct ServiceEnv {
  Cache* cache = nullptr;
  Metrics* metrics = nullptr;            // may be null (metrics off)
  const std::atomic<bool>* draining = nullptr;
};

// UNAVAILABLE while draining, DEADLINE_EXCEEDED when the client's deadline
// has passed, else OK.
absl::Status Admission(const grpc::CallbackServerContext* ctx,
                       const ServiceEnv& env);

// Records `status` and the latency since `start` for `method`.
void RecordUnary(const ServiceEnv& env, Method method, absl::Time start,
                 const absl::Status& status);

// Records `status` for `method` and finishes the call with it.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const ServiceEnv& env, Method method,
                                      absl::Time start,
                                      const absl::Status& status);

template <typename Fn>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* ctx,
                                   const ServiceEnv& env, Method method,
                                   Fn&& fn) {
  const absl::Time start = absl::Now();
  absl::Status status = Admission(ctx, env);
  if (status.ok()) status = fn();
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

#endif  // RADIXKV_DAEMON_RPC_UTIL_H_
