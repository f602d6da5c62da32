// File: bench/replay/replay.h
//
// Trace replay: drives a Trace through a ReplayTarget (the in-process
// RadixTree or a live radixkvd) as fast as possible, in arrival order, with
// N concurrent clients that take requests from one shared atomic cursor.
// Each request is one Acquire(tokens, allocate=all) followed by
// Commit(all new blocks, release=true), the way a worker uses the cache.
//
//   std::unique_ptr<ReplayTarget> target = ...;
//   absl::StatusOr<ReplayReport> r = RunReplay(trace, *target, /*clients=*/4);
//   PrintReport(*r, /*json=*/false, std::cout);
//
// With one client the order, and so the hit ratio, is deterministic; with
// several, requests interleave and the ratio may differ slightly.
//
// Thread safety: a ReplayTarget must allow NewClient from one thread while
// earlier clients are idle; each ReplayClient is used by one thread only.
#ifndef RADIXKV_BENCH_REPLAY_REPLAY_H_
#define RADIXKV_BENCH_REPLAY_REPLAY_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "bench/bench_json.h"
#include "bench/replay/trace.h"

namespace radixkv::bench {

// What one replayed request observed.
struct RequestOutcome {
  uint32_t total_blocks = 0;
  uint32_t matched_blocks = 0;
  uint32_t new_blocks = 0;
  int64_t acquire_ns = 0;  // the Acquire call (in-process: hash + Acquire)
  int64_t request_ns = 0;  // Acquire + Commit
};

// One client's connection to the target (a session, a thread's buffers).
class ReplayClient {
 public:
  virtual ~ReplayClient() = default;
  // Replays one request. An error ends the run.
  virtual absl::StatusOr<RequestOutcome> Replay(const TraceRequest& req) = 0;
};

// What is replayed against.
class ReplayTarget {
 public:
  virtual ~ReplayTarget() = default;
  // A new client; `index` is 0 .. clients-1.
  virtual absl::StatusOr<std::unique_ptr<ReplayClient>> NewClient(int index) = 0;
  // Short description for the report ("inproc capacity=3000").
  virtual std::string Describe() const = 0;
  // Extra facts after the run (tree stats, daemon stats) as a JSON object
  // whose members join the report's; an empty object for none.
  virtual BenchJson FinalStats() { return BenchJson::object(); }
};

struct ReplayReport {
  std::string target;
  int clients = 0;
  uint64_t requests = 0;
  uint64_t blocks = 0;
  uint64_t matched_blocks = 0;
  uint64_t new_blocks = 0;
  double hit_ratio = 0;
  double seconds = 0;
  double requests_per_second = 0;
  double acquire_p50_us = 0;
  double acquire_p99_us = 0;
  double acquire_max_us = 0;
  double request_p50_us = 0;
  double request_p99_us = 0;
  BenchJson extra = BenchJson::object();  // ReplayTarget::FinalStats
};

// Replays every request of `trace` with `clients` concurrent clients.
// INVALID_ARGUMENT when clients < 1; otherwise the first client error.
absl::StatusOr<ReplayReport> RunReplay(const Trace& trace, ReplayTarget& target,
                                       int clients);

// Human-readable lines, or one JSON object with --json.
void PrintReport(const ReplayReport& report, bool json, std::ostream& out);

}  // namespace radixkv::bench

#endif  // RADIXKV_BENCH_REPLAY_REPLAY_H_
