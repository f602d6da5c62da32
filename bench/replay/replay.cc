// File: bench/replay/replay.cc
#include "bench/replay/replay.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/bench_json.h"

namespace radixkv::bench {
namespace {

// Nearest-rank percentile of sorted values, in microseconds.
double PercentileUs(const std::vector<int64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(q * sorted.size()));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1] / 1e3;
}

struct ClientTotals {
  uint64_t requests = 0;
  uint64_t blocks = 0;
  uint64_t matched = 0;
  uint64_t new_blocks = 0;
  std::vector<int64_t> acquire_ns;
  std::vector<int64_t> request_ns;
  absl::Status status;
};

// The report as one JSON object; the target's FinalStats members follow
// the replay's own.
BenchJson ReportJson(const ReplayReport& r) {
  BenchJson j = {
      {"target", r.target},
      {"clients", r.clients},
      {"requests", r.requests},
      {"blocks", r.blocks},
      {"matched_blocks", r.matched_blocks},
      {"new_blocks", r.new_blocks},
      {"hit_ratio", Rounded(r.hit_ratio, 6)},
      {"seconds", Rounded(r.seconds, 3)},
      {"requests_per_second", Rounded(r.requests_per_second, 1)},
      {"acquire_p50_us", Rounded(r.acquire_p50_us, 1)},
      {"acquire_p99_us", Rounded(r.acquire_p99_us, 1)},
      {"acquire_max_us", Rounded(r.acquire_max_us, 1)},
      {"request_p50_us", Rounded(r.request_p50_us, 1)},
      {"request_p99_us", Rounded(r.request_p99_us, 1)},
  };
  j.update(r.extra);
  return j;
}

}  // namespace

absl::StatusOr<ReplayReport> RunReplay(const Trace& trace, ReplayTarget& target,
                                       int clients) {
  if (clients < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--clients must be >= 1, got ", clients));
  }
  std::vector<std::unique_ptr<ReplayClient>> conns;
  for (int i = 0; i < clients; ++i) {
    absl::StatusOr<std::unique_ptr<ReplayClient>> c = target.NewClient(i);
    if (!c.ok()) return c.status();
    conns.push_back(*std::move(c));
  }

  std::atomic<size_t> cursor{0};
  std::atomic<bool> failed{false};
  std::vector<ClientTotals> totals(clients);
  for (ClientTotals& t : totals) {
    t.acquire_ns.reserve(trace.requests.size() / clients + 1);
    t.request_ns.reserve(trace.requests.size() / clients + 1);
  }
  absl::Notification start;
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      ClientTotals& t = totals[i];
      start.WaitForNotification();
      while (!failed.load(std::memory_order_relaxed)) {
        const size_t idx = cursor.fetch_add(1, std::memory_order_relaxed);
        if (idx >= trace.requests.size()) break;
        if (trace.requests[idx].hash_ids.empty()) {
          ++t.requests;  // no full block: nothing to look up or cache
          continue;
        }
        absl::StatusOr<RequestOutcome> o = conns[i]->Replay(trace.requests[idx]);
        if (!o.ok()) {
          t.status = absl::Status(
              o.status().code(),
              absl::StrCat("request ", idx, " (client ", i, "): ",
                           o.status().message()));
          failed.store(true);
          break;
        }
        ++t.requests;
        t.blocks += o->total_blocks;
        t.matched += o->matched_blocks;
        t.new_blocks += o->new_blocks;
        t.acquire_ns.push_back(o->acquire_ns);
        t.request_ns.push_back(o->request_ns);
      }
    });
  }
  const absl::Time t0 = absl::Now();
  start.Notify();
  for (std::thread& th : threads) th.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  conns.clear();  // ends sessions before the target reports its stats

  ReplayReport r;
  r.target = target.Describe();
  r.clients = clients;
  std::vector<int64_t> acq, req;
  for (ClientTotals& t : totals) {
    if (!t.status.ok()) return t.status;
    r.requests += t.requests;
    r.blocks += t.blocks;
    r.matched_blocks += t.matched;
    r.new_blocks += t.new_blocks;
    acq.insert(acq.end(), t.acquire_ns.begin(), t.acquire_ns.end());
    req.insert(req.end(), t.request_ns.begin(), t.request_ns.end());
  }
  std::sort(acq.begin(), acq.end());
  std::sort(req.begin(), req.end());
  r.hit_ratio = r.blocks ? static_cast<double>(r.matched_blocks) / r.blocks : 0;
  r.seconds = seconds;
  r.requests_per_second = seconds > 0 ? r.requests / seconds : 0;
  r.acquire_p50_us = PercentileUs(acq, 0.50);
  r.acquire_p99_us = PercentileUs(acq, 0.99);
  r.acquire_max_us = acq.empty() ? 0 : acq.back() / 1e3;
  r.request_p50_us = PercentileUs(req, 0.50);
  r.request_p99_us = PercentileUs(req, 0.99);
  r.extra = target.FinalStats();
  return r;
}

void PrintReport(const ReplayReport& r, bool json, std::ostream& out) {
  if (json) {
    out << JsonLine(ReportJson(r)) << "\n";
    return;
  }
  out << absl::StrFormat(
      "target        %s\n"
      "clients       %d\n"
      "requests      %d\n"
      "blocks        %d (matched %d, new %d)\n"
      "hit ratio     %.6f (%.2f %%)\n"
      "elapsed       %.3f s\n"
      "requests/s    %.1f\n"
      "acquire       p50 %.1f us  p99 %.1f us  max %.1f us\n"
      "request       p50 %.1f us  p99 %.1f us (acquire + commit)\n",
      r.target, r.clients, r.requests, r.blocks, r.matched_blocks, r.new_blocks,
      r.hit_ratio, 100 * r.hit_ratio, r.seconds, r.requests_per_second,
      r.acquire_p50_us, r.acquire_p99_us, r.acquire_max_us, r.request_p50_us,
      r.request_p99_us);
  if (!r.extra.empty()) out << "stats         " << JsonLine(r.extra) << "\n";
}

}  // namespace radixkv::bench
