// File: daemon/kv_service.h
//
// KvService: the radixkv.v1.KvCache gRPC service (workers). A thin adapter
// over Cache: unary methods convert nothing but the status (the core speaks
// proto), and Session is a bidi stream whose life is the session's life.
//
// Session protocol: the first request must be `open` (else INVALID_ARGUMENT
// and the stream ends); the daemon answers with SessionInfo, then echoes each
// heartbeat. When the stream ends for any reason (client close, crash,
// keepalive timeout, daemon shutdown) the session is closed and all of its
// leases are released.
//
// Thread safety: thread-safe (gRPC calls it from many threads). Each Session
// reactor serializes its own state with its own mutex.
#ifndef RADIXKV_DAEMON_KV_SERVICE_H_
#define RADIXKV_DAEMON_KV_SERVICE_H_

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "daemon/rpc_util.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::daemon {

class KvService final : public v1::KvCache::CallbackService {
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

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx,
                                    const v1::AcquireRequest* req,
                                    v1::AcquireResponse* resp) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx,
                                   const v1::CommitRequest* req,
                                   v1::CommitResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* Match(grpc::CallbackServerContext* ctx,
                                  const v1::MatchRequest* req,
                                  v1::MatchResponse* resp) override;

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

#endif  // RADIXKV_DAEMON_KV_SERVICE_H_
