// File: daemon/rpc/metrics.h
//
// Metrics: radixkvd's Prometheus export (the metrics of docs/OPERATIONS.md).
// Two sources:
//   * per-RPC counters and latency histograms, recorded by the service layer
//     through Started() and Record() (radixkv_requests_total{method,code},
//     radixkv_request_duration_seconds{method}), and the same calls under
//     go-grpc-prometheus's names (grpc_server_started_total,
//     grpc_server_handled_total and grpc_server_handling_seconds, labelled
//     grpc_service, grpc_method, grpc_type and, for handled, grpc_code in
//     Go's spelling: OK, InvalidArgument, ...);
//   * cache state (pages by state, capacity, hits, evictions, sessions,
//     leases, ...), produced at scrape time from one Cache::GetStats()
//     snapshot, so no RPC pays for it.
// Label values are bounded: method names and status code names only.
//
//   auto metrics = std::make_unique<Metrics>(&cache);  // cache outlives it
//   RETURN_IF_ERROR(metrics->Serve("127.0.0.1:9464"));  // /metrics over HTTP
//   metrics->Started(Method::kAcquire);                              // per RPC
//   metrics->Record(Method::kAcquire, status, absl::Now() - start);
//
// Thread safety: thread-safe. Started() and Record() take no lock on their
// fast path once a (method, code) series exists.
#ifndef RADIXKV_DAEMON_RPC_METRICS_H_
#define RADIXKV_DAEMON_RPC_METRICS_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace radixkv::daemon {

class Cache;

// Every RPC of the daemon, as the `method` label.
enum class Method : int {
  kSession = 0,
  kAcquire,
  kCommit,
  kRelease,
  kMatch,
  kGetStats,
  kListNamespaces,
  kDumpTree,
  kExplain,
  kEvict,
  kClear,
  kListSessions,
  kWatchEvents,
  kPin,
  kUnpin,
  kListPins,
  kCount,
};
const char* MethodName(Method m);

class Metrics {
 public:
  // `cache` is borrowed and must outlive the Metrics (and its exposer).
  explicit Metrics(const Cache* cache);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Starts the HTTP exposer on HOST:PORT serving /metrics, and /readyz:
  // plain text, 503 "not ready: starting" until MarkReady, then 200
  // "ready". A port already in use is UNAVAILABLE "--metrics_listen=
  // HOST:PORT: cannot listen (address in use); ..."; an address that cannot
  // be listened on here (no HOST:PORT, a host that does not resolve or is
  // not this machine's, a port not permitted) is INVALID_ARGUMENT
  // "--metrics_listen=...: cannot listen (<why>)". REQUIRES: called at most
  // once.
  absl::Status Serve(const std::string& listen);
  // The daemon is up and serving: /readyz answers 200 "ready", and
  // /healthz is added (200, "radixkv_up 1"; 404 before).
  void MarkReady();
  // Draining has begun: /readyz answers 503 "not ready: draining"; the
  // other paths (/metrics with the drain's figures) are served until
  // StopServing.
  void MarkStopping();
  // Stops the exposer: from then on every path (probes included) refuses
  // connections.
  void StopServing();
  // The bound port (useful with port 0); 0 when not serving.
  int port() const;

  // A call of `method` began (grpc_server_started_total). Each Started is
  // followed by one Record when the call is answered.
  void Started(Method method);
  // A call of `method` was answered with `status` after `latency`.
  void Record(Method method, const absl::Status& status, absl::Duration latency);

  // The exposition text that /metrics serves (for tests and debugging).
  std::string Render() const;

 private:
  class StateCollector;
  class ProbeCollector;
  struct MethodSeries {
    prometheus::Histogram* duration = nullptr;
    std::array<std::atomic<prometheus::Counter*>, 17> by_code{};
    // The grpc_server_* series of the method.
    prometheus::Counter* grpc_started = nullptr;
    prometheus::Histogram* grpc_handling = nullptr;
    std::array<std::atomic<prometheus::Counter*>, 17> grpc_by_code{};
  };

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<StateCollector> state_;
  std::shared_ptr<ProbeCollector> probe_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* durations_ = nullptr;
  prometheus::Family<prometheus::Counter>* grpc_started_ = nullptr;
  prometheus::Family<prometheus::Counter>* grpc_handled_ = nullptr;
  prometheus::Family<prometheus::Histogram>* grpc_handling_ = nullptr;
  std::array<MethodSeries, static_cast<size_t>(Method::kCount)> series_;
  // What /readyz answers: starting (0) until MarkReady, ready (1), then
  // stopping (2) once StopServing begins.
  std::atomic<int> ready_{0};
  int readyz_port_ = 0;  // the port /readyz is registered under; 0: none
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_METRICS_H_
