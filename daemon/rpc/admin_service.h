// File: daemon/rpc/admin_service.h
//
// AdminService: the radixkv.v1.Admin gRPC service (operators, radixkvctl).
// Unary methods are thin adapters over Cache. WatchEvents is a server stream
// fed by the EventLog: each watcher pulls events by sequence number and is
// woken by the log's notifier thread, so no reaction ever blocks; a watcher
// that falls behind the log's ring gets an EventGap and continues. Every
// method is served on raw bytes (rpc_util.h): a request that does not parse
// is INVALID_ARGUMENT.
//
// Thread safety: thread-safe.
#ifndef RADIXKV_DAEMON_RPC_ADMIN_SERVICE_H_
#define RADIXKV_DAEMON_RPC_ADMIN_SERVICE_H_

#include <atomic>

#include "daemon/rpc/rpc_util.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::daemon {

// radixkv.v1.Admin with every method on raw bytes (rpc_util.h); gRPC
// reflection still describes the typed service.
using RawAdminService = v1::Admin::WithRawCallbackMethod_GetStats<
    v1::Admin::WithRawCallbackMethod_ListNamespaces<
        v1::Admin::WithRawCallbackMethod_DumpTree<
            v1::Admin::WithRawCallbackMethod_Explain<
                v1::Admin::WithRawCallbackMethod_Evict<
                    v1::Admin::WithRawCallbackMethod_Clear<
                        v1::Admin::WithRawCallbackMethod_ListSessions<
                            v1::Admin::WithRawCallbackMethod_WatchEvents<
                                v1::Admin::WithRawCallbackMethod_Pin<
                                    v1::Admin::WithRawCallbackMethod_Unpin<
                                        v1::Admin::WithRawCallbackMethod_ListPins<
                                            v1::Admin::Service>>>>>>>>>>>;

class AdminService final : public RawAdminService {
 public:
  // `env` members are borrowed and must outlive the service. Watchers are
  // ended by EventLog::Shutdown() (the Server calls it when draining).
  // At most `max_watchers` WatchEvents streams are open at once (0: no
  // limit; --max_watch_streams).
  AdminService(const ServiceEnv& env, uint32_t max_watchers);
  AdminService(const AdminService&) = delete;
  AdminService& operator=(const AdminService&) = delete;

  // The methods of radixkv.v1.Admin; `body` is the serialized request,
  // `reply` receives the serialized response.
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* body,
                                     grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* ListNamespaces(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* body,
                                           grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* DumpTree(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* body,
                                     grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* body,
                                    grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* body,
                                  grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Clear(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* body,
                                  grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* body,
                                         grpc::ByteBuffer* reply) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchEvents(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body) override;
  grpc::ServerUnaryReactor* Pin(grpc::CallbackServerContext* ctx,
                                const grpc::ByteBuffer* body,
                                grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Unpin(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* body,
                                  grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* ListPins(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* body,
                                     grpc::ByteBuffer* reply) override;

 private:
  class Watcher;
  // Counts a new WatchEvents stream; RESOURCE_EXHAUSTED at the limit.
  absl::Status ReserveWatcher();
  void ReleaseWatcher();

  const ServiceEnv env_;
  const uint32_t max_watchers_;
  std::atomic<uint32_t> watchers_{0};
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_ADMIN_SERVICE_H_
