// File: daemon/admin_service.h
//
// AdminService: the radixkv.v1.Admin gRPC service (operators, radixkvctl).
// Unary methods are thin adapters over Cache. WatchEvents is a server stream
// fed by the EventLog: each watcher pulls events by sequence number and is
// woken by the log's notifier thread, so no reaction ever blocks; a watcher
// that falls behind the log's ring gets an EventGap and continues.
//
// Thread safety: thread-safe.
#ifndef RADIXKV_DAEMON_ADMIN_SERVICE_H_
#define RADIXKV_DAEMON_ADMIN_SERVICE_H_

#include "daemon/rpc_util.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::daemon {

class AdminService final : public v1::Admin::CallbackService {
 public:
  // `env` members are borrowed and must outlive the service. Watchers are
  // ended by EventLog::Shutdown() (the Server calls it when draining).
  explicit AdminService(const ServiceEnv& env);
  AdminService(const AdminService&) = delete;
  AdminService& operator=(const AdminService&) = delete;

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest* req,
                                     v1::GetStatsResponse* resp) override;
  grpc::ServerUnaryReactor* ListNamespaces(
      grpc::CallbackServerContext* ctx, const v1::ListNamespacesRequest* req,
      v1::ListNamespacesResponse* resp) override;
  grpc::ServerUnaryReactor* DumpTree(grpc::CallbackServerContext* ctx,
                                     const v1::DumpTreeRequest* req,
                                     v1::DumpTreeResponse* resp) override;
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* ctx,
                                    const v1::ExplainRequest* req,
                                    v1::ExplainResponse* resp) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* ctx,
                                  const v1::EvictRequest* req,
                                  v1::EvictResponse* resp) override;
  grpc::ServerUnaryReactor* Clear(grpc::CallbackServerContext* ctx,
                                  const v1::ClearRequest* req,
                                  v1::ClearResponse* resp) override;
  grpc::ServerUnaryReactor* ListSessions(
      grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest* req,
      v1::ListSessionsResponse* resp) override;
  grpc::ServerWriteReactor<v1::Event>* WatchEvents(
      grpc::CallbackServerContext* ctx,
      const v1::WatchEventsRequest* req) override;

 private:
  class Watcher;
  const ServiceEnv env_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_ADMIN_SERVICE_H_
