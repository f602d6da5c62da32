// File: daemon/rpc/kv_service.h
//
// KvService: the radixkv.v1.KvCache gRPC service (workers). A thin adapter
// over Cache: unary methods convert nothing but the status (the core speaks
// proto), and Session is a bidi stream whose life is the session's life.
//
// Session protocol: the first request must be `open` (else INVALID_ARGUMENT
// and the stream ends); the daemon answers with SessionInfo, then echoes each
// heartbeat. A message that does not parse ends the stream with
// INVALID_ARGUMENT (rpc_util.h, ParseBody). When the stream ends for any
// reason (client close, crash, keepalive timeout, daemon shutdown) the
// session is closed and all of its leases are released.
//
// Thread safety: thread-safe (gRPC calls it from many threads). Each Session
// reactor serializes its own state with its own mutex.
#ifndef RADIXKV_DAEMON_RPC_KV_SERVICE_H_
#define RADIXKV_DAEMON_RPC_KV_SERVICE_H_

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "daemon/rpc/rpc_util.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::daemon {

// radixkv.v1.KvCache with every method on raw bytes (rpc_util.h); gRPC
// reflection still describes the typed service.
using RawKvCacheService = v1::KvCache::WithRawCallbackMethod_Session<
    v1::KvCache::WithRawCallbackMethod_Acquire<
        v1::KvCache::WithRawCallbackMethod_Commit<
            v1::KvCache::WithRawCallbackMethod_Release<
                v1::KvCache::WithRawCallbackMethod_Match<
                    v1::KvCache::Service>>>>>;

class KvService final : public RawKvCacheService {
 public:
  // `env` members are borrowed and must outlive the service.
  explicit KvService(const ServiceEnv& env);
  ~KvService() override;
  KvService(const KvService&) = delete;
  KvService& operator=(const KvService&) = delete;

  // Ends every open Session stream with UNAVAILABLE (their sessions close)
  // and refuses new ones. Call before grpc::Server::Shutdown so draining
  // does not wait for long-lived streams.
  void Shutdown();

  // The methods of radixkv.v1.KvCache; `body` is the serialized request,
  // `reply` receives the serialized response.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* body,
                                    grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* body,
                                   grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* body,
                                    grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Match(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* body,
                                  grpc::ByteBuffer* reply) override;

 private:
  class SessionReactor;
  // False when shutting down (the reactor must then finish itself).
  bool Register(SessionReactor* r);
  void Unregister(SessionReactor* r);

  const ServiceEnv env_;
  absl::Mutex mu_;
  // mu_ protects the following. Reactors unregister in OnDone, before they
  // are deleted, so every pointer here is alive while mu_ is held.
  absl::flat_hash_set<SessionReactor*> live_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_KV_SERVICE_H_
