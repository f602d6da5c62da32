// File: bench/replay/client_target.cc
//
// Replay against a live radixkvd through the client library (radixkv::Client,
// client/client.h), the way a worker uses it. The library degrades to an
// empty lease when the daemon is away; a replay must not silently count that
// as a miss, so a degraded lease ends the run with UNAVAILABLE.
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/replay/targets.h"
#include "client/client.h"

namespace radixkv::bench {
namespace {

class LibraryClient final : public ReplayClient {
 public:
  LibraryClient(std::unique_ptr<Client> client, const DaemonOptions& o)
      : client_(std::move(client)), options_(o) {}

  absl::StatusOr<RequestOutcome> Replay(const TraceRequest& req) override {
    const absl::Span<const uint32_t> tokens =
        FillTokens(req.hash_ids, options_.page_size, &tokens_);
    if (options_.key_mode) keys_ = client_->ComputeKeys(tokens);
    RequestOutcome out;
    const int64_t t0 = NowNs();
    absl::StatusOr<Lease> lease = options_.key_mode ? client_->AcquireKeys(keys_)
                                                    : client_->Acquire(tokens);
    const int64_t t1 = NowNs();
    if (!lease.ok()) return lease.status();
    if (lease->degraded()) {
      return absl::UnavailableError(absl::StrCat(
          "Acquire came back degraded (daemon unreachable or late): ",
          client_->state().last_error.ToString()));
    }
    // A lease with new pages commits them and ends; one with only cached
    // pages is dropped: its release rides on the next Acquire.
    if (lease->held() && lease->new_blocks() > 0) {
      absl::StatusOr<v1::CommitResponse> c =
          lease->Commit(lease->new_blocks(), /*release=*/true);
      if (!c.ok()) return c.status();
    }
    const int64_t t2 = NowNs();
    out.total_blocks = lease->total_blocks();
    out.matched_blocks = lease->matched_blocks();
    out.new_blocks = lease->new_blocks();
    out.acquire_ns = t1 - t0;
    out.request_ns = t2 - t0;
    return out;
  }

 private:
  std::unique_ptr<Client> client_;
  const DaemonOptions options_;
  std::vector<uint32_t> tokens_;
  std::vector<BlockKey> keys_;
};

class LibraryTarget final : public ReplayTarget {
 public:
  explicit LibraryTarget(const DaemonOptions& o) : options_(o) {}

  absl::StatusOr<std::unique_ptr<ReplayClient>> NewClient(int index) override {
    ClientOptions co;
    co.endpoint = options_.endpoint;
    co.ns = ReplayNamespace(options_.page_size);
    co.client_name = absl::StrCat("radixkv-replay-", index);
    co.call_timeout = absl::Milliseconds(options_.deadline_ms);
    co.connect_timeout = absl::Seconds(10);
    co.initial_wait = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(co);
    if (!c.ok()) return c.status();
    absl::Status s = (*c)->WaitForSession(absl::Seconds(10));
    if (!s.ok()) return s;
    return std::unique_ptr<ReplayClient>(
        new LibraryClient(*std::move(c), options_));
  }

  std::string Describe() const override {
    return absl::StrCat("daemon via radixkv::Client ", options_.endpoint,
                        options_.key_mode ? " (key mode)" : " (tokens)");
  }

  BenchJson FinalStats() override { return DaemonStats(options_.endpoint); }

 private:
  const DaemonOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayTarget>> NewClientLibraryTarget(
    const DaemonOptions& options) {
  if (options.endpoint.empty()) {
    return absl::InvalidArgumentError("--endpoint is required with --mode=daemon");
  }
  return std::unique_ptr<ReplayTarget>(new LibraryTarget(options));
}

}  // namespace radixkv::bench
