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
// Thread safety: stateless helpers; ServiceEnv members are thread-safe.
#ifndef RADIXKV_DAEMON_RPC_UTIL_H_
#define RADIXKV_DAEMON_RPC_UTIL_H_

#include <atomic>

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

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_UTIL_H_
