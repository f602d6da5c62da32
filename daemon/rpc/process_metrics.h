// File: daemon/rpc/process_metrics.h
//
// The standard process_* metrics of a Prometheus exporter (CPU time,
// memory, file descriptors, start time), read from /proc/self at scrape
// time, and radixkv_build_info{version,commit}.
//
// Thread safety: pure functions of /proc and the build.
#ifndef RADIXKV_DAEMON_RPC_PROCESS_METRICS_H_
#define RADIXKV_DAEMON_RPC_PROCESS_METRICS_H_

#include <vector>

#include "prometheus/metric_family.h"

namespace radixkv::daemon {

// process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_start_time_seconds; a value /proc cannot give is left out.
std::vector<prometheus::MetricFamily> ProcessFamilies();

// radixkv_build_info{version, commit} 1.
prometheus::MetricFamily BuildInfoFamily();

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_RPC_PROCESS_METRICS_H_
