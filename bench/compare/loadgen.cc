// File: bench/compare/loadgen.cc
//
// loadgen: an asynchronous gRPC load generator for radixkvd that drives one
// method at a time with pre-serialized request bodies, so the client-side
// cost is the same whichever method is measured:
//
//   health        grpc.health.v1.Health/Check (the daemon's empty handler)
//   match         KvCache/Match of a cached prompt (read-only, no session)
//   acquire       KvCache/Acquire(allocate=false) of a cached prompt; each
//                 returned lease is ended with a Release before that slot
//                 sends its next Acquire (latency and rate count Acquire only,
//                 rpcs_per_second counts both)
//                 (--release_in_acquire: no Release calls; the leases a
//                 connection's Acquires return are ended through
//                 AcquireRequest.release_leases of its next Acquire, one
//                 RPC per request, in the open loop too)
//   acquire_miss  KvCache/Acquire(allocate=false) of a never-cached prompt
//                 (no lease is created, so no Release is needed)
//
// With --key_mode the measured calls carry the prompt's 16-byte block keys
// (computed before the run) instead of its tokens, one `block_keys` string
// per block; --packed_keys sends the same keys concatenated in the single
// bytes field `block_keys_packed` (16 bytes per block). Both need radixkvd
// --allow_key_mode.
//
// Closed loop (--rate=0): --connections channels (one HTTP/2 connection and
// one Session each) x --inflight outstanding calls, re-issued on completion.
// Open loop (--rate=R): a pacer sends R requests/s round-robin over the
// connections; latency is measured from the scheduled send time, so a slow
// server cannot hide queueing (no coordinated omission).
//
//   loadgen --endpoint=unix:/tmp/rkv.sock --method=acquire --connections=4
//           --inflight=16 --duration=5 --json
//
// Thread safety: completions run on gRPC's callback threads; the only shared
// mutable state is the latency log (a mutex) and atomics.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bench/bench_json.h"
#include "bench/bench_layout.h"
#include "radix/block_key.h"
#include "radixkv/channel.h"
#include "radixkv/defaults.h"
#include "radixkv/namespace_spec.h"
#include "radixkv/v1/radixkv.grpc.pb.h"
#include "radixkv/v1/radixkv.pb.h"

ABSL_FLAG(std::string, endpoint, "", "gRPC target, e.g. unix:/tmp/rkv.sock");
ABSL_FLAG(std::string, method, "health",
          "health | match | acquire | acquire_miss");
ABSL_FLAG(int32_t, connections, 4, "channels (HTTP/2 connections, sessions)");
ABSL_FLAG(int32_t, inflight, 16, "closed loop: outstanding calls per connection");
ABSL_FLAG(double, rate, 0, "open loop: offered requests/s in total (0 = closed loop)");
ABSL_FLAG(double, duration, 5, "measured seconds");
ABSL_FLAG(double, warmup, 1, "seconds before measuring");
ABSL_FLAG(uint32_t, prompt_blocks, 128, "full blocks in the prompt");
ABSL_FLAG(uint32_t, page_size, 16, "tokens per block");
ABSL_FLAG(bool, key_mode, false,
          "send block_keys (computed here, before the run) instead of tokens in "
          "the measured Acquire/Match calls; radixkvd needs --allow_key_mode");
ABSL_FLAG(bool, packed_keys, false,
          "key mode with the keys in bytes block_keys_packed (16 bytes per "
          "block, computed here for the namespace the tokens mode uses) "
          "instead of repeated block_keys; radixkvd needs --allow_key_mode");
ABSL_FLAG(bool, tokens_le, false,
          "send the prompt as bytes tokens_le (little-endian u32) instead of "
          "repeated uint32 tokens in the measured Acquire/Match calls");
ABSL_FLAG(bool, pages_le, false,
          "acquire: ask for the pages as bytes pages_le (little-endian u32) "
          "instead of repeated uint64 pages, as radixkv::Client does");
ABSL_FLAG(bool, release_in_acquire, false,
          "acquire: end each slot's previous lease with release_leases in its "
          "next Acquire instead of a separate Release call");
ABSL_FLAG(std::string, label, "", "free-form label copied into the output");
ABSL_FLAG(bool, json, false, "print one JSON object");
ABSL_FLAG(std::string, write_body, "",
          "write the first request as a framed gRPC body (for h2load -d) and exit");

namespace radixkv::bench {
namespace {

namespace pb = ::radixkv::v1;
using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& m) {
  grpc::ByteBuffer buf;
  bool own = false;
  grpc::Status s = grpc::GenericSerialize<grpc::ProtoBufferWriter,
                                          google::protobuf::Message>(m, &buf, &own);
  if (!s.ok()) {
    std::cerr << "Error: serialize: " << s.error_message() << "\n";
    std::exit(1);
  }
  return buf;
}

template <typename M>
bool Parse(grpc::ByteBuffer* buf, M* m) {
  return grpc::GenericDeserialize<grpc::ProtoBufferReader, M>(buf, m).ok();
}

NamespaceSpec BenchSpec(uint32_t page_size) {
  return BenchLayout("radixkv-loadgen", page_size);
}

pb::Namespace BenchNamespace(uint32_t page_size) {
  return NamespaceToProto(BenchSpec(page_size));
}

void FillPrompt(uint32_t blocks, uint32_t page_size, uint32_t base,
                google::protobuf::RepeatedField<uint32_t>* tokens) {
  tokens->Clear();
  for (uint32_t i = 0; i < blocks * page_size; ++i) tokens->Add(base + i);
}

// Block keys of FillPrompt's tokens in BenchNamespace(page_size).
std::vector<BlockKey> PromptKeys(uint32_t blocks, uint32_t page_size,
                                 uint32_t base) {
  google::protobuf::RepeatedField<uint32_t> tokens;
  FillPrompt(blocks, page_size, base, &tokens);
  return ComputeBlockKeys(
      NamespaceRoot(BenchSpec(page_size)), page_size,
      absl::MakeConstSpan(tokens.data(), static_cast<size_t>(tokens.size())));
}

// Keys of FillPrompt's tokens, in the 16-byte canonical form, one per string.
void FillPromptKeys(uint32_t blocks, uint32_t page_size, uint32_t base,
                    google::protobuf::RepeatedPtrField<std::string>* keys) {
  keys->Clear();
  char buf[BlockKey::kBytes];
  for (const BlockKey& key : PromptKeys(blocks, page_size, base)) {
    key.ToCanonical(buf);
    keys->Add()->assign(buf, sizeof(buf));
  }
}

// The same keys concatenated (block_keys_packed: 16 bytes per block).
std::string PackedPromptKeys(uint32_t blocks, uint32_t page_size,
                             uint32_t base) {
  const std::vector<BlockKey> keys = PromptKeys(blocks, page_size, base);
  std::string packed(keys.size() * BlockKey::kBytes, '\0');
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i].ToCanonical(packed.data() + i * BlockKey::kBytes);
  }
  return packed;
}

struct Options {
  bool key_mode = false;     // keys instead of tokens in Acquire/Match
  bool packed_keys = false;  // key mode, keys in block_keys_packed
  bool release_in_acquire = false;  // acquire: piggyback the previous Release
  std::string endpoint;
  std::string method;
  int connections = 4;
  int inflight = 16;
  double rate = 0;
  double duration = 5;
  double warmup = 1;
  uint32_t prompt_blocks = 128;
  uint32_t page_size = 16;
};

// One channel, and for acquire* one open Session stream.
struct Conn {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> generic;
  std::unique_ptr<pb::KvCache::Stub> typed;
  std::unique_ptr<grpc::ClientContext> session_ctx;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SessionRequest, pb::SessionResponse>>
      session;
  std::string session_id;
  grpc::ByteBuffer request;  // the pre-serialized body for this connection
  std::string request_bytes;  // the same body as bytes (release_in_acquire)
  // release_in_acquire: leases this connection's Acquires returned, ended
  // by its next Acquire (in the open loop a call has no successor of its
  // own, so the connection carries them).
  absl::Mutex mu;
  std::vector<uint64_t> held ABSL_GUARDED_BY(mu);
};

class LoadGen {
 public:
  explicit LoadGen(const Options& o) : o_(o) {}

  ~LoadGen() {
    for (auto& c : conns_) {
      if (c->session != nullptr) {
        c->session->WritesDone();
        grpc::Status ignored = c->session->Finish();
        (void)ignored;
      }
    }
  }

  absl::Status Setup() {
    if (o_.method == "health") {
      path_ = "/grpc.health.v1.Health/Check";
    } else if (o_.method == "match") {
      path_ = "/radixkv.v1.KvCache/Match";
    } else if (o_.method == "acquire" || o_.method == "acquire_miss") {
      path_ = "/radixkv.v1.KvCache/Acquire";
      release_leases_ = o_.method == "acquire";
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--method must be health, match, acquire or acquire_miss; got '",
          o_.method, "'"));
    }
    if (o_.connections < 1 || o_.inflight < 1) {
      return absl::InvalidArgumentError("--connections and --inflight must be >= 1");
    }
    if (o_.prompt_blocks < 1 || o_.page_size < 1) {
      return absl::InvalidArgumentError("--prompt_blocks and --page_size must be >= 1");
    }
    const bool needs_session = o_.method != "health";
    for (int i = 0; i < o_.connections; ++i) {
      auto c = std::make_unique<Conn>();
      grpc::ChannelArguments args = ClientChannelArguments();
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      c->channel = grpc::CreateCustomChannel(
          o_.endpoint, grpc::InsecureChannelCredentials(), args);
      c->generic = std::make_unique<grpc::GenericStub>(c->channel);
      c->typed = pb::KvCache::NewStub(c->channel);
      if (!c->channel->WaitForConnected(std::chrono::system_clock::now() +
                                        std::chrono::seconds(10))) {
        return absl::UnavailableError(
            absl::StrCat("cannot connect to ", o_.endpoint, " within 10 s"));
      }
      if (needs_session) {
        c->session_ctx = std::make_unique<grpc::ClientContext>();
        c->session = c->typed->Session(c->session_ctx.get());
        pb::SessionRequest open;
        *open.mutable_open()->mutable_namespace_() = BenchNamespace(o_.page_size);
        const std::string name = absl::StrCat("loadgen-", i);
        open.mutable_open()->set_client_name(name.data(), name.size());
        open.mutable_open()->set_block_key_version(1);
        pb::SessionResponse resp;
        if (!c->session->Write(open) || !c->session->Read(&resp) ||
            !resp.has_session()) {
          grpc::Status s = c->session->Finish();
          c->session.reset();
          return absl::UnavailableError(
              absl::StrCat("Session open failed: ", s.error_message()));
        }
        c->session_id = resp.session().session_id();
      }
      conns_.push_back(std::move(c));
    }
    // Cache the prompt once (Acquire allocate + Commit release) so that
    // match and acquire hit all prompt_blocks blocks.
    if (o_.method == "match" || o_.method == "acquire") {
      Conn& c = *conns_[0];
      pb::AcquireRequest req;
      req.set_session_id(c.session_id);
      req.set_allocate(true);
      FillPrompt(o_.prompt_blocks, o_.page_size, 1, req.mutable_tokens());
      pb::AcquireResponse resp;
      grpc::ClientContext ctx;
      grpc::Status s = c.typed->Acquire(&ctx, req, &resp);
      if (!s.ok()) return absl::InternalError("warm-up Acquire: " + s.error_message());
      if (resp.lease_id() != 0) {
        pb::CommitRequest commit;
        commit.set_session_id(c.session_id);
        commit.set_lease_id(resp.lease_id());
        commit.set_blocks(resp.new_blocks());
        commit.set_release(true);
        pb::CommitResponse cresp;
        grpc::ClientContext cctx;
        s = c.typed->Commit(&cctx, commit, &cresp);
        if (!s.ok()) return absl::InternalError("warm-up Commit: " + s.error_message());
      }
      // Check the prompt is now fully cached.
      pb::MatchRequest m;
      *m.mutable_namespace_() = BenchNamespace(o_.page_size);
      FillPrompt(o_.prompt_blocks, o_.page_size, 1, m.mutable_tokens());
      pb::MatchResponse mresp;
      grpc::ClientContext mctx;
      s = c.typed->Match(&mctx, m, &mresp);
      if (!s.ok()) return absl::InternalError("warm-up Match: " + s.error_message());
      if (mresp.matched_blocks() != o_.prompt_blocks) {
        return absl::FailedPreconditionError(absl::StrCat(
            "prompt not cached after warm-up: matched ", mresp.matched_blocks(),
            " of ", o_.prompt_blocks, " blocks (pool too small?)"));
      }
    }
    for (auto& c : conns_) {
      if (o_.method == "health") {
        // An empty HealthCheckRequest (service "": the server as a whole).
        grpc::Slice empty;
        c->request = grpc::ByteBuffer(&empty, 1);
      } else if (o_.method == "match") {
        pb::MatchRequest m;
        *m.mutable_namespace_() = BenchNamespace(o_.page_size);
        if (o_.packed_keys) {
          const std::string packed =
              PackedPromptKeys(o_.prompt_blocks, o_.page_size, 1);
          m.set_block_keys_packed(packed.data(), packed.size());
        } else if (o_.key_mode) {
          FillPromptKeys(o_.prompt_blocks, o_.page_size, 1, m.mutable_block_keys());
        } else if (absl::GetFlag(FLAGS_tokens_le)) {
          google::protobuf::RepeatedField<uint32_t> t;
          FillPrompt(o_.prompt_blocks, o_.page_size, 1, &t);
          m.set_tokens_le(reinterpret_cast<const char*>(t.data()), t.size() * 4);
        } else {
          FillPrompt(o_.prompt_blocks, o_.page_size, 1, m.mutable_tokens());
        }
        if (o_.key_mode && c == conns_.front()) {
          // The keys computed here must name the blocks the tokens cached.
          pb::MatchResponse kresp;
          grpc::ClientContext kctx;
          grpc::Status ks = c->typed->Match(&kctx, m, &kresp);
          if (!ks.ok()) {
            return absl::InternalError("key-mode Match: " + ks.error_message());
          }
          if (kresp.matched_blocks() != o_.prompt_blocks) {
            return absl::InternalError(absl::StrCat(
                "key-mode Match found ", kresp.matched_blocks(), " of ",
                o_.prompt_blocks, " blocks: keys differ from the daemon's"));
          }
        }
        c->request = Serialize(m);
      } else {
        pb::AcquireRequest a;
        a.set_session_id(c->session_id);
        a.set_allocate(false);
        a.set_pages_le(absl::GetFlag(FLAGS_pages_le));
        // acquire_miss: tokens far away from anything cached.
        // acquire_miss: other tokens of the same varint width (< 2^14), so
        // the request costs the same to parse as the cached prompt.
        const uint32_t base = o_.method == "acquire" ? 1 : 8192;
        if (o_.packed_keys) {
          const std::string packed =
              PackedPromptKeys(o_.prompt_blocks, o_.page_size, base);
          a.set_block_keys_packed(packed.data(), packed.size());
        } else if (o_.key_mode) {
          FillPromptKeys(o_.prompt_blocks, o_.page_size, base, a.mutable_block_keys());
        } else if (absl::GetFlag(FLAGS_tokens_le)) {
          google::protobuf::RepeatedField<uint32_t> t;
          FillPrompt(o_.prompt_blocks, o_.page_size, base, &t);
          a.set_tokens_le(reinterpret_cast<const char*>(t.data()), t.size() * 4);
        } else {
          FillPrompt(o_.prompt_blocks, o_.page_size, base, a.mutable_tokens());
        }
        c->request = Serialize(a);
        c->request_bytes = a.SerializeAsString();
      }
    }
    return absl::OkStatus();
  }

  void Run() {
    const int64_t t0 = NowNs();
    measure_from_ = t0 + static_cast<int64_t>(o_.warmup * 1e9);
    measure_to_ = measure_from_ + static_cast<int64_t>(o_.duration * 1e9);
    if (o_.rate <= 0) {
      for (int i = 0; i < o_.connections; ++i) {
        for (int j = 0; j < o_.inflight; ++j) Issue(NewCall(conns_[i].get(), NowNs()));
      }
      while (NowNs() < measure_to_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } else {
      const double interval_ns = 1e9 / o_.rate;
      for (uint64_t n = 0;; ++n) {
        const int64_t due = t0 + static_cast<int64_t>(n * interval_ns);
        if (due >= measure_to_) break;
        // Sleep (never spin: the pacer must not take a core from the server);
        // requests already due on wake-up go out back to back.
        const int64_t now = NowNs();
        if (due > now) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
        if (inflight_.load() > 100000) continue;  // server hopelessly behind
        Issue(NewCall(conns_[n % conns_.size()].get(), due));
      }
    }
    stop_.store(true);
    // Wait for every outstanding call (each has a deadline) to complete.
    while (inflight_.load() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void Print(bool json, const std::string& label) {
    absl::MutexLock l(&mu_);
    std::sort(latency_ns_.begin(), latency_ns_.end());
    auto pct = [&](double q) {
      if (latency_ns_.empty()) return 0.0;
      size_t rank = static_cast<size_t>(std::ceil(q * latency_ns_.size()));
      rank = std::clamp<size_t>(rank, 1, latency_ns_.size());
      return latency_ns_[rank - 1] / 1e3;
    };
    const double secs = o_.duration;
    const double rps = completed_ / secs;
    const double rpcs = (completed_ + releases_) / secs;
    if (json) {
      const BenchJson j = {
          {"label", label},
          {"method", o_.method},
          {"key_mode", o_.key_mode},
          {"packed_keys", o_.packed_keys},
          {"release_in_acquire", o_.release_in_acquire},
          {"connections", o_.connections},
          {"inflight", o_.rate > 0 ? 0 : o_.inflight},
          {"offered_rate", Rounded(o_.rate, 0)},
          {"seconds", Rounded(secs, 2)},
          {"completed", completed_},
          {"requests_per_second", Rounded(rps, 1)},
          {"rpcs_per_second", Rounded(rpcs, 1)},
          {"errors", errors_},
          {"p50_us", Rounded(pct(0.5), 1)},
          {"p90_us", Rounded(pct(0.9), 1)},
          {"p99_us", Rounded(pct(0.99), 1)},
          {"p999_us", Rounded(pct(0.999), 1)},
          {"max_us",
           Rounded(latency_ns_.empty() ? 0.0 : latency_ns_.back() / 1e3, 1)},
          {"first_error", first_error_}};
      std::cout << JsonLine(j) << "\n";
    } else {
      std::cout << absl::StrFormat(
          "%s method=%s connections=%d %s: %.1f req/s (%.1f rpc/s), errors %d, "
          "latency p50 %.1f us p90 %.1f us p99 %.1f us p99.9 %.1f us%s%s\n",
          label, o_.method, o_.connections,
          o_.rate > 0 ? absl::StrFormat("offered=%.0f/s", o_.rate)
                      : absl::StrFormat("inflight=%d", o_.inflight),
          rps, rpcs, errors_, pct(0.5), pct(0.9), pct(0.99), pct(0.999),
          first_error_.empty() ? "" : ", first error: ", first_error_);
    }
  }

  // Writes the first connection's request as a length-prefixed gRPC message
  // (flag byte 0, 4-byte big-endian length, payload).
  absl::Status WriteBody(const std::string& path) {
    std::vector<grpc::Slice> slices;
    grpc::Status s = conns_[0]->request.Dump(&slices);
    if (!s.ok()) return absl::InternalError(s.error_message());
    std::string payload;
    for (const grpc::Slice& sl : slices) {
      payload.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    std::string framed(5, '\0');
    const uint32_t n = payload.size();
    framed[1] = static_cast<char>(n >> 24);
    framed[2] = static_cast<char>(n >> 16);
    framed[3] = static_cast<char>(n >> 8);
    framed[4] = static_cast<char>(n);
    framed += payload;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return absl::NotFoundError("cannot write " + path);
    const bool ok = std::fwrite(framed.data(), 1, framed.size(), f) == framed.size();
    std::fclose(f);
    return ok ? absl::OkStatus() : absl::InternalError("short write to " + path);
  }

  uint64_t errors() {
    absl::MutexLock l(&mu_);
    return errors_;
  }

 private:
  struct Call {
    Conn* conn = nullptr;
    int64_t start_ns = 0;  // send time (closed loop) or scheduled time (open loop)
    std::unique_ptr<grpc::ClientContext> ctx;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
  };

  static Call* NewCall(Conn* conn, int64_t start_ns) {
    Call* call = new Call;
    call->conn = conn;
    call->start_ns = start_ns;
    return call;
  }

  static std::unique_ptr<grpc::ClientContext> NewContext() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  void Issue(Call* call) {
    inflight_.fetch_add(1);
    call->ctx = NewContext();
    std::vector<uint64_t> ending;
    if (o_.release_in_acquire) {
      absl::MutexLock l(&call->conn->mu);
      std::vector<uint64_t>& held = call->conn->held;
      const size_t n = std::min<size_t>(held.size(), kMaxReleaseLeasesPerAcquire);
      ending.assign(held.end() - n, held.end());
      held.resize(held.size() - n);
    }
    if (!ending.empty()) {
      // Serialized messages concatenate as a merge: the base body plus a
      // message holding only release_leases is the body with that field.
      pb::AcquireRequest release;
      for (uint64_t id : ending) release.add_release_leases(id);
      std::string body = call->conn->request_bytes;
      release.AppendToString(&body);
      grpc::Slice slice(body);
      call->request = grpc::ByteBuffer(&slice, 1);
    } else {
      call->request = call->conn->request;
    }
    call->conn->generic->UnaryCall(
        call->ctx.get(), path_, grpc::StubOptions(), &call->request,
        &call->response, [this, call](grpc::Status s) { OnDone(call, s); });
  }

  void Record(int64_t start, int64_t end, const grpc::Status& s) {
    if (end < measure_from_ || end > measure_to_) return;
    absl::MutexLock l(&mu_);
    if (!s.ok()) {
      if (errors_++ == 0) {
        first_error_ = absl::StrCat(s.error_code(), " ", s.error_message());
      }
      return;
    }
    ++completed_;
    latency_ns_.push_back(end - start);
  }

  void OnDone(Call* call, const grpc::Status& s) {
    const int64_t end = NowNs();
    Record(call->start_ns, end, s);
    if (s.ok() && release_leases_ && o_.release_in_acquire) {
      pb::AcquireResponse resp;
      // The leases this call carried ended with it; the new one waits for
      // the connection's next Acquire.
      if (Parse(&call->response, &resp) && resp.lease_id() != 0) {
        absl::MutexLock l(&call->conn->mu);
        call->conn->held.push_back(resp.lease_id());
      }
      Next(call);
      return;
    }
    if (s.ok() && release_leases_) {
      pb::AcquireResponse resp;
      if (Parse(&call->response, &resp) && resp.lease_id() != 0) {
        auto* rel = new ReleaseCall;
        rel->call = call;
        rel->ctx = NewContext();
        pb::ReleaseRequest req;
        req.set_session_id(call->conn->session_id);
        req.set_lease_id(resp.lease_id());
        rel->request = Serialize(req);
        call->conn->generic->UnaryCall(
            rel->ctx.get(), "/radixkv.v1.KvCache/Release", grpc::StubOptions(),
            &rel->request, &rel->response,
            [this, rel](grpc::Status rs) { OnReleased(rel, rs); });
        return;
      }
    }
    Next(call);
  }

  struct ReleaseCall {
    Call* call = nullptr;
    std::unique_ptr<grpc::ClientContext> ctx;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
  };

  void OnReleased(ReleaseCall* rel, const grpc::Status& s) {
    const int64_t end = NowNs();
    Call* call = rel->call;
    delete rel;
    if (end >= measure_from_ && end <= measure_to_) {
      absl::MutexLock l(&mu_);
      if (s.ok()) {
        ++releases_;
      } else if (errors_++ == 0) {
        first_error_ = absl::StrCat("Release: ", s.error_code(), " ", s.error_message());
      }
    }
    Next(call);
  }

  // Closed loop: re-issue on the same connection; open loop: done.
  void Next(Call* call) {
    if (o_.rate <= 0 && !stop_.load() && NowNs() < measure_to_) {
      inflight_.fetch_sub(1);
      call->start_ns = NowNs();
      Issue(call);
      return;
    }
    delete call;
    inflight_.fetch_sub(1);
  }

  const Options o_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::string path_;
  bool release_leases_ = false;
  int64_t measure_from_ = 0;
  int64_t measure_to_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> inflight_{0};

  absl::Mutex mu_;  // protects the following
  std::vector<int64_t> latency_ns_ ABSL_GUARDED_BY(mu_);
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t releases_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace
}  // namespace radixkv::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gRPC load generator for radixkvd: --method=health|match|acquire|acquire_miss");
  absl::ParseCommandLine(argc, argv);
  radixkv::bench::Options o;
  o.endpoint = absl::GetFlag(FLAGS_endpoint);
  o.packed_keys = absl::GetFlag(FLAGS_packed_keys);
  o.release_in_acquire = absl::GetFlag(FLAGS_release_in_acquire);
  o.key_mode = absl::GetFlag(FLAGS_key_mode) || o.packed_keys;
  o.method = absl::GetFlag(FLAGS_method);
  o.connections = absl::GetFlag(FLAGS_connections);
  o.inflight = absl::GetFlag(FLAGS_inflight);
  o.rate = absl::GetFlag(FLAGS_rate);
  o.duration = absl::GetFlag(FLAGS_duration);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.prompt_blocks = absl::GetFlag(FLAGS_prompt_blocks);
  o.page_size = absl::GetFlag(FLAGS_page_size);
  if (o.endpoint.empty()) {
    std::cerr << "Error: --endpoint is required (e.g. unix:/tmp/rkv.sock)\n";
    return 3;
  }
  if (!(o.duration > 0) || o.warmup < 0 || o.rate < 0) {
    std::cerr << "Error: --duration must be > 0, --warmup and --rate >= 0\n";
    return 3;
  }
  radixkv::bench::LoadGen gen(o);
  absl::Status s = gen.Setup();
  if (!s.ok()) {
    std::cerr << "Error: " << s << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 3 : 1;
  }
  if (const std::string body = absl::GetFlag(FLAGS_write_body); !body.empty()) {
    s = gen.WriteBody(body);
    if (!s.ok()) {
      std::cerr << "Error: " << s << "\n";
      return 1;
    }
    return 0;
  }
  gen.Run();
  gen.Print(absl::GetFlag(FLAGS_json), absl::GetFlag(FLAGS_label));
  return gen.errors() == 0 ? 0 : 1;
}
