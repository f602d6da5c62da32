// File: bench/replay/replay_main.cc
//
// replay: replays a Mooncake-format trace through radixkv and prints
// requests, blocks, hit ratio, requests/s and Acquire latency p50/p99.
//
//   replay --mode=inproc --capacity=3000
//   replay --mode=daemon --endpoint=unix:/tmp/rkv.sock --clients=4 --json
//   replay --mode=daemon --via=stub --key_mode --endpoint=unix:/tmp/rkv.sock
//
// In-process, capacity 0 means unbounded (the trace's distinct block count).
// Through a daemon the capacity is the daemon's (--pool=none,pages=N).
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/replay/replay.h"
#include "bench/replay/targets.h"
#include "bench/replay/trace.h"

ABSL_FLAG(std::string, trace, RADIXKV_DEFAULT_TRACE,
          "Mooncake-format JSONL trace (default: the build tree's copy of "
          "bench/data/conversation_trace.tar.xz)");
ABSL_FLAG(std::string, mode, "inproc", "inproc | daemon");
ABSL_FLAG(std::string, endpoint, "",
          "daemon mode: gRPC target, e.g. unix:/tmp/rkv.sock or 127.0.0.1:50051");
ABSL_FLAG(uint32_t, capacity, 0,
          "inproc mode: pool capacity in pages; 0 = unbounded");
ABSL_FLAG(uint32_t, page_size, 512, "tokens per block (the trace's block size)");
ABSL_FLAG(std::string, eviction_policy, "lru",
          "inproc mode: the tree's eviction policy (lru, turn_duel); through "
          "a daemon it is the daemon's --eviction_policy");
ABSL_FLAG(int32_t, clients, 1, "concurrent clients sharing one request cursor");
ABSL_FLAG(uint64_t, limit, 0, "replay only the first N requests (0 = all)");
ABSL_FLAG(std::string, via, "client",
          "daemon mode: client (radixkv::Client, the worker library) | stub "
          "(raw generated gRPC stub: least client overhead)");
ABSL_FLAG(bool, key_mode, false,
          "daemon mode: send client-computed block_keys instead of tokens");
ABSL_FLAG(bool, tokens_le, false,
          "daemon mode, --via=stub: send tokens as bytes tokens_le");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
ABSL_FLAG(bool, tiny_layout, false,
          "daemon mode, --via=stub: a one-layer, one-head, 8-dim bf16 "
          "namespace (32 bytes per token), for host pools and tiers of many "
          "pages");
ABSL_FLAG(bool, mutex_deadlock_detection, true,
          "keep Abseil's Mutex deadlock detection (Debian's Abseil has it on: "
          "every Lock updates a lock graph); false measures without it");

namespace {

absl::Status Main() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const uint32_t page_size = absl::GetFlag(FLAGS_page_size);
  if (page_size == 0 || page_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("--page_size must be in [1, 65536], got ", page_size));
  }
  absl::StatusOr<radixkv::bench::Trace> trace = radixkv::bench::LoadTrace(
      absl::GetFlag(FLAGS_trace), page_size, absl::GetFlag(FLAGS_limit));
  if (!trace.ok()) return trace.status();

  std::unique_ptr<radixkv::bench::ReplayTarget> target;
  if (mode == "inproc") {
    radixkv::bench::InProcOptions o;
    o.page_size = page_size;
    if (const std::string p = absl::GetFlag(FLAGS_eviction_policy);
        !radixkv::ParseEvictionPolicy(p, &o.eviction_policy)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--eviction_policy=", p, ": not a policy; choose one of ",
          radixkv::EvictionPolicyNames()));
    }
    o.capacity_pages = absl::GetFlag(FLAGS_capacity);
    if (o.capacity_pages == 0) {
      // Unbounded: room for every distinct block, so nothing is evicted.
      o.capacity_pages = static_cast<uint32_t>(trace->distinct_blocks + 1);
    }
    absl::StatusOr<std::unique_ptr<radixkv::bench::ReplayTarget>> t =
        radixkv::bench::NewInProcTarget(o);
    if (!t.ok()) return t.status();
    target = *std::move(t);
  } else if (mode == "daemon") {
    radixkv::bench::DaemonOptions o;
    o.endpoint = absl::GetFlag(FLAGS_endpoint);
    o.page_size = page_size;
    o.key_mode = absl::GetFlag(FLAGS_key_mode);
    o.tokens_le = absl::GetFlag(FLAGS_tokens_le);
    o.tiny_layout = absl::GetFlag(FLAGS_tiny_layout);
    const std::string via = absl::GetFlag(FLAGS_via);
    absl::StatusOr<std::unique_ptr<radixkv::bench::ReplayTarget>> t;
    if (via == "client") {
      t = radixkv::bench::NewClientLibraryTarget(o);
    } else if (via == "stub") {
      t = radixkv::bench::NewDaemonTarget(o);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--via must be client or stub, got '", via, "'"));
    }
    if (!t.ok()) return t.status();
    target = *std::move(t);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode must be inproc or daemon, got '", mode, "'"));
  }

  absl::StatusOr<radixkv::bench::ReplayReport> report = radixkv::bench::RunReplay(
      *trace, *target, absl::GetFlag(FLAGS_clients));
  if (!report.ok()) return report.status();
  radixkv::bench::PrintReport(*report, absl::GetFlag(FLAGS_json), std::cout);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "replays a Mooncake trace through radixkv (--mode=inproc|daemon)");
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  absl::Status s = Main();
  if (!s.ok()) {
    std::cerr << "Error: " << s << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 3 : 1;
  }
  return 0;
}
