// File: daemon/rpc/server.h
//
// Server: a running radixkvd — the gRPC server (KvCache, Admin, grpc.health.v1
// Health and server reflection) on a Unix socket and optionally TCP, the
// attach socket, and the Prometheus exposer, all wired to one Cache. main()
// only parses flags into ServerOptions; tests run the same Server in-process.
//
//   ServerOptions o;
//   o.socket_path = "/tmp/rkv_test.sock";
//   o.metrics_listen = "";                       // metrics off
//   ASSIGN_OR_RETURN(auto server, Server::Start(o));
//   ... connect to UnixTarget(o.socket_path) ...
//   server->Shutdown(absl::Seconds(5));          // drains in-flight calls
//
// Unix socket handling: the parent directory is created (mode 0700) when
// missing; an existing socket file is removed only when nothing answers on
// it (a stale file from a crashed daemon); when a live daemon answers, Start
// refuses with ALREADY_EXISTS. The socket is chmod 0660 after bind.
//
// Thread safety: Start/Shutdown/destructor from one thread; the accessors
// are safe from any thread.
#ifndef RADIXKV_DAEMON_RPC_SERVER_H_
#define RADIXKV_DAEMON_RPC_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/rpc/attach_server.h"
#include "daemon/core/cache.h"
#include "daemon/events/kv_events.h"
#include "daemon/rpc/metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace grpc {
class Server;
}

namespace radixkv::daemon {

class AdminService;
class KvService;
class UnixListener;

struct ServerOptions {
  // gRPC Unix socket; empty: none (then listen_tcp must be set).
  std::string socket_path;
  // Also serve gRPC here (HOST:PORT; port 0 picks one). Empty: off.
  std::string listen_tcp;
  // Prometheus /metrics (HOST:PORT; port 0 picks one). Empty: off.
  std::string metrics_listen;
  // --pool: "host,bytes=1GiB" | "cuda,device=0,bytes=60GiB" | "none,pages=N".
  std::string pool = "host,bytes=1GiB";
  // --tier: "host,bytes=SIZE", "disk,path=DIR,bytes=SIZE[,...]" or both,
  // separated by ';' (tiers/tier_spec.h); empty: no tier.
  std::string tier;
  // Serve the attach socket beside socket_path (host/cuda pools).
  bool attach = true;
  // Besides peers with the daemon's own uid (and root), let peers whose
  // primary gid is one of these attach (--attach_allowed_gids).
  std::vector<gid_t> attach_allowed_gids;
  // Attach connections one uid may hold waiting (--attach_max_pending_per_uid).
  size_t attach_max_pending_per_uid = 8;
  // Tenants and administrators (--tenants, --admin_gids, --admin_subjects);
  // self_uid is filled by Start.
  AccessOptions access;
  // TLS for listen_tcp: PEM files. With tls_client_ca, clients must present
  // a certificate it signed (mTLS) and their identity is its subject.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Serve listen_tcp in plaintext, unauthenticated (--insecure_tcp). Needed
  // for a TCP listener without TLS.
  bool insecure_tcp = false;
  // WatchEvents streams open at once (--max_watch_streams; 0: no limit).
  uint32_t max_watch_streams = 16;
  // Limits, lease TTL, key mode, event buffer (cache.pool and
  // cache.attach_socket are filled by Start).
  CacheOptions cache;
  // HTTP/2 keepalive: ping an idle client every keepalive_time and drop it
  // when a ping is unanswered for keepalive_timeout (a dead worker's session
  // then ends and its leases are released).
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Largest request message accepted.
  int max_receive_message_bytes = 16 << 20;
  // Extra gRPC server interceptors (tracing, auth, fault injection in
  // tests), made once by Start. Unset: none.
  std::function<std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>()>
      interceptors;
  // On Shutdown, how long writing the pool's and host tier's blocks down
  // to the disk tier may take (--drain_timeout; 0: not at all).
  absl::Duration drain_timeout = absl::Seconds(30);
  // KV events in vLLM's format (--kv_events_*; docs/EVENTS.md). Empty
  // endpoint: off. The medium is set by Start from the pool.
  KvEventsOptions kv_events;
};

class Server {
 public:
  // Validates options, creates everything and starts serving. Errors name
  // the flag: INVALID_ARGUMENT for a bad --pool or path, ALREADY_EXISTS when
  // a live daemon owns the socket, FAILED_PRECONDITION for a metrics port in
  // use, UNAVAILABLE when gRPC cannot bind.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);

  // Shuts down (grace 0) if Shutdown was not called.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Stops accepting work (new calls get UNAVAILABLE, health turns
  // NOT_SERVING), ends Session and WatchEvents streams, lets in-flight unary
  // calls finish within `grace`, then (with a disk tier) writes the pool's
  // and host tier's blocks down to it within options.drain_timeout
  // (Cache::DrainTiers, logged), then stops the attach socket and metrics.
  // So it returns within grace + drain_timeout, plus the disk writes
  // already running at the drain's deadline. Idempotent.
  void Shutdown(absl::Duration grace);

  const std::string& socket_path() const { return options_.socket_path; }
  // Empty when no attach socket is served.
  const std::string& attach_socket_path() const { return attach_path_; }
  int tcp_port() const { return tcp_port_; }
  int metrics_port() const;
  // "http://HOST:PORT/metrics", or empty when metrics are off.
  std::string metrics_url() const;
  Cache& cache() { return *cache_; }
  Metrics* metrics() { return metrics_.get(); }

 private:
  explicit Server(const ServerOptions& options);
  absl::Status Init();
  // Builds and starts the gRPC server on the configured addresses.
  absl::Status StartGrpc();

  ServerOptions options_;
  std::string attach_path_;
  int tcp_port_ = 0;
  std::atomic<bool> draining_{false};
  // Calls gRPC holds (an interceptor counts them); Shutdown waits for them.
  std::atomic<int64_t> calls_{0};
  bool shut_down_ = false;

  // Declared before cache_ so that it outlives the tree it listens to.
  std::unique_ptr<KvEventPublisher> kv_events_;
  std::unique_ptr<AccessPolicy> policy_;
  PeerRegistry peers_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<KvService> kv_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<UnixListener> unix_listener_;
  std::unique_ptr<AttachServer> attach_server_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_SERVER_H_
