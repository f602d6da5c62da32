#include "client/core.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "radixkv/channel.h"

#if defined(RADIXKV_CLIENT_HAVE_ATTACH)
#include "client/attach.h"
#include "gpu/mapped_pool.h"
#endif

namespace radixkv::client_internal {
namespace {

int ToMillis(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<int>(std::clamp<int64_t>(ms, 1, 1 << 30));
}

std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& options,
                                           const std::string& target) {
  grpc::ChannelArguments args = ClientChannelArguments();
  // Reconnect quickly after a daemon restart; our own session backoff sits
  // on top of this.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              ToMillis(options.reconnect_initial_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              ToMillis(options.reconnect_initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              ToMillis(options.reconnect_max_backoff));
  // Transport-level liveness in addition to heartbeat acks. The session
  // stream always has traffic, so the server's ping policy accepts these.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // Each client gets its own connection: a Lease's calls never queue behind
  // another Client's in the same process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                   args);
}

}  // namespace

Core::Core(const ClientOptions& options, const std::string& target)
    : options_(options),
      channel_(MakeChannel(options, target)),
      stub_(v1::KvCache::NewStub(channel_)),
      rng_(std::random_device{}()) {
  absl::MutexLock lock(&mu_);
  last_error_ = absl::UnavailableError("session not opened yet");
}

Core::~Core() { Stop(); }

void Core::Start() { thread_ = std::thread([this] { Loop(); }); }

void Core::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

SessionSnapshot Core::Current() const {
  absl::MutexLock lock(&mu_);
  SessionSnapshot s;
  s.usable = connected_;
  s.session_id = session_id_;
  s.generation = generation_;
  s.pool = pool_;
  return s;
}

bool Core::IsCurrent(uint64_t generation) const {
  absl::MutexLock lock(&mu_);
  return connected_ && generation_ == generation;
}

void Core::ReportSessionLost(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != generation_ || !connected_) return;
  last_error_ = absl::NotFoundError("the daemon no longer knows the session");
  if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
}

ClientState Core::State() const {
  absl::MutexLock lock(&mu_);
  ClientState s;
  s.connected = connected_;
  s.session_id = session_id_;
  s.generation = generation_;
  s.reconnects = reconnects_;
  s.pool = pool_info_;
  s.last_error = last_error_;
  return s;
}

absl::Status Core::WaitForSession(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(absl::Condition(&connected_), timeout)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no radixkv session within ", absl::FormatDuration(timeout),
                   ": ", last_error_.ToString()));
}

absl::Duration Core::NextBackoff(absl::Duration base) {
  const double jitter = std::clamp(options_.reconnect_jitter, 0.0, 1.0);
  std::uniform_real_distribution<double> dist(1.0 - jitter, 1.0 + jitter);
  return base * dist(rng_);
}

void Core::Loop() {
  absl::Duration backoff = options_.reconnect_initial_backoff;
  while (true) {
    uint64_t generation_before;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      generation_before = generation_;
    }
    absl::Status why = RunSession();
    bool opened;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      last_error_ = why;
      opened = generation_ != generation_before;
    }
    if (opened) {
      backoff = options_.reconnect_initial_backoff;  // it worked for a while
    }
    const absl::Duration wait = NextBackoff(backoff);
    backoff = std::min(backoff * 2, options_.reconnect_max_backoff);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
  }
}

void Core::ReadLoop(Stream* stream, const v1::SessionRequest& open) {
  bool ok = stream->Write(open);
  v1::SessionResponse response;
  while (ok && stream->Read(&response)) {
    absl::MutexLock lock(&mu_);
    last_ack_ = absl::Now();
    if (response.has_session() && !stream_opened_) {
      stream_info_ = response.session();
      stream_opened_ = true;
    }
  }
  absl::MutexLock lock(&mu_);
  stream_ended_ = true;
}

absl::Status Core::RunSession() {
  grpc::ClientContext ctx;
  // Do not block in the call's creation; metadata goes out with `open`.
  ctx.set_initial_metadata_corked(true);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("client closing");
    stream_ctx_ = &ctx;
    stream_opened_ = false;
    stream_ended_ = false;
    stream_info_.Clear();
  }
  std::unique_ptr<Stream> stream = stub_->Session(&ctx);

  v1::SessionRequest open;
  v1::OpenSession* o = open.mutable_open();
  *o->mutable_namespace_() = NamespaceToProto(options_.ns);
  o->set_device(options_.device);
  o->set_client_name(options_.client_name.data(), options_.client_name.size());
  o->set_block_key_version(kBlockKeyVersion);
  std::thread reader([this, s = stream.get(), &open] { ReadLoop(s, open); });

  // Ends the stream: cancel, join the reader, collect the final status.
  auto finish = [&](absl::Status why) {
    {
      absl::MutexLock lock(&mu_);
      connected_ = false;
      pool_.reset();
      ctx.TryCancel();
    }
    reader.join();
    absl::Status final_status = FromGrpcStatus(stream->Finish());
    absl::MutexLock lock(&mu_);
    stream_ctx_ = nullptr;
    // The server's own status explains more than our cancellation does.
    if (!final_status.ok() &&
        final_status.code() != absl::StatusCode::kCancelled) {
      return final_status;
    }
    return why;
  };

  v1::SessionInfo info;
  absl::Status open_error;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &Core::OpenedOrEnded),
                         options_.connect_timeout);
    if (stopping_) {
      open_error = absl::CancelledError("client closing");
    } else if (stream_opened_) {
      info = stream_info_;
    } else if (stream_ended_) {
      open_error = absl::UnavailableError("session stream ended before open");
    } else {
      open_error = absl::DeadlineExceededError(
          absl::StrCat("no session reply within ",
                       absl::FormatDuration(options_.connect_timeout)));
    }
  }
  if (!open_error.ok()) return finish(open_error);

  std::shared_ptr<gpu::MappedPool> pool;
  if (options_.attach_pool && info.pool().backend() != "none" &&
      !info.pool().attach_socket().empty()) {
#if defined(RADIXKV_CLIENT_HAVE_ATTACH)
    absl::StatusOr<std::unique_ptr<gpu::MappedPool>> mapped =
        AttachPool(info.pool().attach_socket(), info.session_id(),
                   options_.connect_timeout);
    if (!mapped.ok()) {
      return finish(absl::Status(
          mapped.status().code(),
          absl::StrCat("attach pool: ", mapped.status().message())));
    }
    pool = std::move(*mapped);
#else
    return finish(absl::FailedPreconditionError(
        "attach_pool: this build of the client has no pool attach support"));
#endif
  }

  {
    absl::MutexLock lock(&mu_);
    if (generation_ > 0) ++reconnects_;
    ++generation_;
    session_id_ = info.session_id();
    pool_info_ = info.pool();
    pool_ = std::move(pool);
    connected_ = true;
    last_error_ = absl::OkStatus();
    last_ack_ = absl::Now();
  }

  // Serve: heartbeats until the stream ends, acks stop, or we are stopped.
  uint64_t nonce = 0;
  while (true) {
    absl::Status stop_reason;
    bool ended = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &Core::EndedOrStopping),
                           options_.heartbeat_interval);
      if (stopping_) {
        stop_reason = absl::CancelledError("client closing");
      } else if (stream_ended_) {
        ended = true;
      } else if (absl::Now() - last_ack_ > 3 * options_.heartbeat_interval) {
        stop_reason = absl::DeadlineExceededError(
            "session heartbeat not acknowledged for 3 intervals");
      }
    }
    if (!stop_reason.ok()) return finish(stop_reason);
    if (ended) break;
    v1::SessionRequest hb;
    hb.mutable_heartbeat()->set_nonce(++nonce);
    if (!stream->Write(hb)) break;
  }
  return finish(absl::UnavailableError("session stream ended"));
}

}  // namespace radixkv::client_internal
