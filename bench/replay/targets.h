// File: bench/replay/targets.h
//
// The two things a trace can be replayed against:
//  * NewInProcTarget: a RadixTree in this process (no transport), clients
//    are threads that hash their tokens and call Acquire/Commit directly.
//  * NewClientLibraryTarget: a live radixkvd through radixkv::Client (the
//    worker's library); each replay client is one Client (one session).
//  * NewDaemonTarget: a live radixkvd through the raw generated stub; each
//    client opens its own channel and Session stream and sends
//    Acquire(tokens) + Commit(release). Less client overhead than the
//    library, so it isolates the daemon's cost.
//
// Thread safety: see ReplayTarget (replay.h).
#ifndef RADIXKV_BENCH_REPLAY_TARGETS_H_
#define RADIXKV_BENCH_REPLAY_TARGETS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bench/replay/replay.h"
#include "radix/block_key.h"
#include "radix/eviction_policy.h"

namespace radixkv::bench {

// Monotonic clock in nanoseconds, for latency samples.
inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The namespace every replay uses: model "radixkv-replay", page_size from the
// flag, a plausible KV layout (the `none` pool ignores it).
NamespaceSpec ReplayNamespace(uint32_t page_size);
// DaemonOptions::tiny_layout's namespace.
NamespaceSpec TinyNamespace(uint32_t page_size);

struct InProcOptions {
  uint32_t capacity_pages = 0;  // REQUIRES: > 0 (the caller sizes "unbounded")
  uint32_t page_size = 512;
  bool check_invariants = true;  // RadixTree::CheckInvariants after the run
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
};
absl::StatusOr<std::unique_ptr<ReplayTarget>> NewInProcTarget(
    const InProcOptions& options);

struct DaemonOptions {
  std::string endpoint;  // "unix:/path" or "host:port"
  uint32_t page_size = 512;
  // Send block_keys computed by the client instead of tokens (the daemon
  // must allow key mode). Hashing then happens in the client, untimed.
  bool key_mode = false;
  // Raw stub only: send tokens as bytes tokens_le instead of repeated uint32.
  bool tokens_le = false;
  // Raw stub only: the namespace's layout is one layer, one KV head of 8
  // dims, bf16 (32 bytes per token), so that a host pool and a tier of many
  // pages stay small.
  bool tiny_layout = false;
  int64_t deadline_ms = 10000;
};
absl::StatusOr<std::unique_ptr<ReplayTarget>> NewDaemonTarget(
    const DaemonOptions& options);
absl::StatusOr<std::unique_ptr<ReplayTarget>> NewClientLibraryTarget(
    const DaemonOptions& options);

// The daemon's Admin.GetStats as JSON members (see ReplayTarget::
// FinalStats), or a "daemon_stats_error" member.
BenchJson DaemonStats(const std::string& endpoint);

}  // namespace radixkv::bench

#endif  // RADIXKV_BENCH_REPLAY_TARGETS_H_
