// File: daemon/rpc/metrics.h
//
// Metrics: radixkvd's Prometheus export (the metrics of docs/OPERATIONS.md).
// Two sources:
//   * per-RPC counters and latency histograms, recorded by the service layer
//     through Record() (radixkv_requests_total{method,code},
//     radixkv_request_duration_seconds{method});
//   * cache state (pages by state, capacity, hits, evictions, sessions,
//     leases, ...), produced at scrape time from one Cache::GetStats()
//     snapshot, so no RPC pays for it.
// Label values are bounded: method names and status code names only.
//
//   auto metrics = std::make_unique<Metrics>(&cache);  // cache outlives it
//   RETURN_IF_ERROR(metrics->Serve("127.0.0.1:9464"));  // /metrics over HTTP
//   metrics->Record(Method::kAcquire, status, absl::Now() - start);  // per RPC
//
// Thread safety: thread-safe. Record() takes no lock on its fast path once a
// (method, code) series exists.
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

  // Starts the HTTP exposer on HOST:PORT serving /metrics. A port already
  // in use is FAILED_PRECONDITION "metrics_listen HOST:PORT: address in use"
  // (or cannot bind). REQUIRES: called at most once.
  absl::Status Serve(const std::string& listen);
  // Adds /healthz and /readyz (200, "radixkv_up 1"): the daemon is up and
  // serving. Before it they answer 404.
  void MarkReady();
  // Stops the exposer: from the start of draining, every path (probes
  // included) refuses connections.
  void StopServing();
  // The bound port (useful with port 0); 0 when not serving.
  int port() const;

  void Record(Method method, const absl::Status& status, absl::Duration latency);

  // The exposition text that /metrics serves (for tests and debugging).
  std::string Render() const;

 private:
  class StateCollector;
  class ProbeCollector;
  struct MethodSeries {
    prometheus::Histogram* duration = nullptr;
    std::array<std::atomic<prometheus::Counter*>, 17> by_code{};
  };

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<StateCollector> state_;
  std::shared_ptr<ProbeCollector> probe_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* durations_ = nullptr;
  std::array<MethodSeries, static_cast<size_t>(Method::kCount)> series_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_METRICS_H_
