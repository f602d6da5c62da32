// File: bench/replay/daemon_target.cc
//
// Replay against a live radixkvd through the generated gRPC stub: each
// client has its own channel (no shared subchannel, so N clients are N
// HTTP/2 connections) and its own Session stream, open for the whole run.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_json.h"
#include "bench/replay/targets.h"
#include "radixkv/channel.h"
#include "radixkv/v1/radixkv.grpc.pb.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::bench {
namespace {

namespace pb = ::radixkv::v1;

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& endpoint) {
  grpc::ChannelArguments args = ClientChannelArguments();
  // One connection per client: a private subchannel pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(),
                                   args);
}

void FillNamespace(const NamespaceSpec& s, pb::Namespace* out) {
  out->set_model(s.model.data(), s.model.size());
  out->set_num_layers(s.num_layers);
  out->set_num_kv_heads(s.num_kv_heads);
  out->set_head_dim(s.head_dim);
  out->set_page_size(s.page_size);
  out->set_dtype(static_cast<pb::DType>(s.dtype));
  out->set_tp_rank(s.tp_rank);
  out->set_tp_size(s.tp_size);
}

class DaemonClient final : public ReplayClient {
 public:
  explicit DaemonClient(const DaemonOptions& o) : options_(o) {}

  ~DaemonClient() override {
    if (stream_ != nullptr) {
      stream_->WritesDone();
      grpc::Status ignored = stream_->Finish();
      (void)ignored;
    }
  }

  absl::Status Open(int index) {
    channel_ = NewChannel(options_.endpoint);
    stub_ = pb::KvCache::NewStub(channel_);
    session_ctx_ = std::make_unique<grpc::ClientContext>();
    stream_ = stub_->Session(session_ctx_.get());
    pb::SessionRequest open;
    FillNamespace(options_.tiny_layout ? TinyNamespace(options_.page_size)
                                       : ReplayNamespace(options_.page_size),
                  open.mutable_open()->mutable_namespace_());
    const std::string name = absl::StrCat("radixkv-replay-", index);
    open.mutable_open()->set_client_name(name.data(), name.size());
    open.mutable_open()->set_block_key_version(kBlockKeyVersion);
    pb::SessionResponse resp;
    if (!stream_->Write(open) || !stream_->Read(&resp) || !resp.has_session()) {
      grpc::Status s = stream_->Finish();
      stream_.reset();
      if (!s.ok()) return FromGrpc(s, "Session open");
      return absl::UnavailableError(
          absl::StrCat("Session open on ", options_.endpoint,
                       ": stream ended before SessionInfo"));
    }
    session_id_ = resp.session().session_id();
    const std::string& root = resp.session().namespace_id();
    if (root.size() != BlockKey::kBytes) {
      return absl::InternalError(absl::StrCat(
          "SessionInfo.namespace_id has ", root.size(), " bytes, want 16"));
    }
    root_ = BlockKey::FromCanonical(absl::string_view(root.data(), root.size()));
    const BlockKey mine = NamespaceRoot(
        options_.tiny_layout ? TinyNamespace(options_.page_size)
                             : ReplayNamespace(options_.page_size));
    if (root_ != mine) {
      return absl::InternalError(absl::StrCat(
          "daemon namespace root ", root_.ToHex(), " != client's ", mine.ToHex()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RequestOutcome> Replay(const TraceRequest& req) override {
    acquire_.Clear();
    acquire_.set_session_id(session_id_);
    acquire_.set_allocate(true);
    if (options_.key_mode) {
      std::vector<BlockKey> keys = ComputeBlockKeys(
          root_, options_.page_size,
          FillTokens(req.hash_ids, options_.page_size, &tokens_));
      char buf[BlockKey::kBytes];
      for (const BlockKey& k : keys) {
        k.ToCanonical(buf);
        acquire_.add_block_keys(buf, sizeof(buf));
      }
    } else {
      const absl::Span<const uint32_t> tokens =
          FillTokens(req.hash_ids, options_.page_size, &tokens_);
      if (options_.tokens_le) {
        acquire_.set_tokens_le(reinterpret_cast<const char*>(tokens.data()),
                               tokens.size() * sizeof(uint32_t));
      } else {
        acquire_.mutable_tokens()->Add(tokens.begin(), tokens.end());
      }
    }
    RequestOutcome out;
    const int64_t t0 = NowNs();
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options_.deadline_ms));
      grpc::Status s = stub_->Acquire(&ctx, acquire_, &acquire_resp_);
      if (!s.ok()) return FromGrpc(s, "Acquire");
    }
    const int64_t t1 = NowNs();
    if (acquire_resp_.lease_id() != 0) {
      commit_.Clear();
      commit_.set_session_id(session_id_);
      commit_.set_lease_id(acquire_resp_.lease_id());
      commit_.set_blocks(acquire_resp_.new_blocks());
      commit_.set_release(true);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options_.deadline_ms));
      grpc::Status s = stub_->Commit(&ctx, commit_, &commit_resp_);
      if (!s.ok()) return FromGrpc(s, "Commit");
    }
    const int64_t t2 = NowNs();
    out.total_blocks = acquire_resp_.total_blocks();
    out.matched_blocks = acquire_resp_.matched_blocks();
    out.new_blocks = acquire_resp_.new_blocks();
    out.acquire_ns = t1 - t0;
    out.request_ns = t2 - t0;
    return out;
  }

 private:
  const DaemonOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KvCache::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> session_ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SessionRequest, pb::SessionResponse>>
      stream_;
  std::string session_id_;
  BlockKey root_;
  // Reused between requests so steady state allocates little.
  pb::AcquireRequest acquire_;
  pb::AcquireResponse acquire_resp_;
  pb::CommitRequest commit_;
  pb::CommitResponse commit_resp_;
  std::vector<uint32_t> tokens_;
};

class DaemonTarget final : public ReplayTarget {
 public:
  explicit DaemonTarget(const DaemonOptions& o) : options_(o) {}

  absl::StatusOr<std::unique_ptr<ReplayClient>> NewClient(int index) override {
    auto c = std::make_unique<DaemonClient>(options_);
    absl::Status s = c->Open(index);
    if (!s.ok()) return s;
    return std::unique_ptr<ReplayClient>(std::move(c));
  }

  std::string Describe() const override {
    return absl::StrCat("daemon ", options_.endpoint,
                        options_.key_mode ? " (key mode)" : " (tokens)");
  }

  BenchJson FinalStats() override { return DaemonStats(options_.endpoint); }

 private:
  const DaemonOptions options_;
};

}  // namespace

BenchJson DaemonStats(const std::string& endpoint) {
  auto stub = pb::Admin::NewStub(NewChannel(endpoint));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::GetStatsResponse resp;
  grpc::Status s = stub->GetStats(&ctx, pb::GetStatsRequest(), &resp);
  BenchJson j;
  if (!s.ok()) {
    j["daemon_stats_error"] = s.error_message();
  } else {
    const pb::Stats& st = resp.stats();
    j = {{"daemon_capacity_pages", st.capacity_pages()},
         {"daemon_cached_pages", st.cached_pages()},
         {"daemon_evicted_pages", st.evicted_pages()},
         {"daemon_lookup_tokens", st.lookup_tokens()},
         {"daemon_hit_tokens", st.hit_tokens()},
         {"daemon_hash_collisions", st.hash_collisions()},
         {"daemon_leases", st.leases()},
         {"daemon_invariants_ok", st.invariants_ok()}};
  }
  return j;
}

absl::StatusOr<std::unique_ptr<ReplayTarget>> NewDaemonTarget(
    const DaemonOptions& options) {
  if (options.endpoint.empty()) {
    return absl::InvalidArgumentError("--endpoint is required with --mode=daemon");
  }
  return std::unique_ptr<ReplayTarget>(new DaemonTarget(options));
}

}  // namespace radixkv::bench
