#include "client/core.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "radixkv/channel.h"
#include "radixkv/defaults.h"

#include "client/attach.h"
#include "gpu/mapped_pool.h"

namespace radixkv::client_internal {
namespace {

// Longest wait between the channel's own connection retries.
constexpr absl::Duration kMaxChannelBackoff = absl::Seconds(1);

int ToMillis(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<int>(std::clamp<int64_t>(ms, 1, 1 << 30));
}

std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& options,
                                           const std::string& target) {
  grpc::ChannelArguments args = ClientChannelArguments();
  // The session backoff (Core::Loop) decides when to reconnect; the channel
  // only retries the connection while a session attempt waits for it
  // (wait_for_ready), at most kMaxChannelBackoff apart, and its backoff is
  // reset before each attempt, so it never adds to the session backoff.
  const absl::Duration channel_max =
      std::min(options.reconnect_max_backoff, kMaxChannelBackoff);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              ToMillis(std::min(options.reconnect_initial_backoff, channel_max)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ToMillis(channel_max));
  // gRPC reads this one as the minimum time one connection attempt may take.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              ToMillis(options.connect_timeout));
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
      target_(target),
      channel_(MakeChannel(options, target)),
      stub_(v1::KvCache::NewStub(channel_)),
      rng_(std::random_device{}()) {
  // Known before the first attempt ends, so that a caller who stops
  // waiting early learns why.
  const std::string problem =
      ConnectProblem(target_, /*defaulted=*/options_.endpoint.empty());
  absl::MutexLock lock(&mu_);
  last_error_ = absl::UnavailableError(
      problem.empty() ? "session not opened yet" : problem);
}

Core::~Core() { Stop(); }

void Core::Start() { thread_ = std::thread([this] { Loop(); }); }

void Core::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // A serving session thread first releases the queued leases (a session
    // that ends with leases open has their pages fenced), then cancels.
    if (stream_ctx_ != nullptr && !connected_) stream_ctx_->TryCancel();
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
  if (connected_) s.life = life_;
  s.lease_ttl = lease_ttl_;
  return s;
}

bool Core::IsCurrent(uint64_t generation) const {
  absl::MutexLock lock(&mu_);
  return IsCurrentLocked(generation);
}

bool Core::Stopped() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Core::ReportSessionLost(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (!IsCurrentLocked(generation)) return;
  last_error_ = absl::NotFoundError("the daemon no longer knows the session");
  // Its leases refuse page access from now on; the session thread queues
  // the id for acknowledgement when it ends the stream.
  if (life_ != nullptr) life_->ended.store(true);
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
  for (const Unacknowledged& u : unacknowledged_) {
    s.unacknowledged_sessions.push_back(u.id);
  }
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

void Core::TrackLease(uint64_t generation, uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  if (IsCurrentLocked(generation)) live_leases_.insert(lease_id);
}

void Core::UntrackLease(uint64_t generation, uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  if (IsCurrentLocked(generation)) live_leases_.erase(lease_id);
}

void Core::DeferRelease(uint64_t generation, uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  if (!IsCurrentLocked(generation)) return;  // already ended
  live_leases_.erase(lease_id);
  const absl::Time now = absl::Now();
  deferred_.push_back(DeferredRelease{lease_id, now});
  release_ticking_until_ = now + absl::Seconds(1);
  // A session thread asleep until its next heartbeat must recompute its
  // wake-up; one that is ticking wakes soon enough anyway.
  if (serve_wake_at_ > now + options_.release_delay) serve_wakeup_ = true;
}

std::vector<uint64_t> Core::TakeDeferred(uint64_t generation, size_t max) {
  std::vector<uint64_t> ids;
  absl::MutexLock lock(&mu_);
  if (!IsCurrentLocked(generation)) return ids;
  while (!deferred_.empty() && ids.size() < max) {
    ids.push_back(deferred_.front().lease_id);
    deferred_.pop_front();
  }
  return ids;
}

void Core::RequeueDeferred(uint64_t generation,
                           const std::vector<uint64_t>& ids,
                           bool release_now) {
  if (ids.empty()) return;
  absl::MutexLock lock(&mu_);
  if (!IsCurrentLocked(generation)) return;
  const absl::Time now = absl::Now();
  // Back at the front, in their order: they are the oldest.
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    deferred_.push_front(DeferredRelease{*it, now});
  }
  if (release_now) release_now_ = true;
  serve_wakeup_ = true;
}

std::vector<uint64_t> Core::TakeDueReleases(absl::Time now) {
  std::vector<uint64_t> ids;
  while (!deferred_.empty() &&
         (release_now_ ||
          deferred_.front().since + options_.release_delay <= now)) {
    ids.push_back(deferred_.front().lease_id);
    deferred_.pop_front();
  }
  release_now_ = false;
  return ids;
}

void Core::SendReleases(const std::string& session_id,
                        const std::vector<uint64_t>& ids) {
  v1::ReleaseRequest req;
  req.set_session_id(session_id);
  for (uint64_t id : ids) {
    req.set_lease_id(id);
    v1::ReleaseResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.release_timeout));
    const absl::Status s = FromGrpcStatus(stub_->Release(&ctx, req, &resp));
    // NOT_FOUND: already ended (TTL). An unreachable daemon: the rest end
    // with the session or at their TTL; do not hold up the heartbeats.
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) return;
  }
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
    if (absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why)) {
      const std::string problem =
          ConnectProblem(target_, /*defaulted=*/options_.endpoint.empty());
      if (!problem.empty()) {
        why = absl::UnavailableError(
            absl::StrCat(problem, " (", why.message(), ")"));
      }
    }
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

v1::SessionRequest Core::OpenRequest() const {
  v1::SessionRequest open;
  v1::OpenSession* o = open.mutable_open();
  *o->mutable_namespace_() = NamespaceToProto(options_.ns);
  o->set_device(options_.device);
  o->set_client_name(options_.client_name.data(), options_.client_name.size());
  o->set_block_key_version(kBlockKeyVersion);
  for (const Unacknowledged& u : unacknowledged_) {
    if (u.Ready()) o->add_acknowledge_sessions(u.id.data(), u.id.size());
  }
  return open;
}

void Core::EndPublishedLocked() {
  // First stop every writer (the leases check this flag), then promise the
  // daemon, through the next open, that none of them writes again.
  if (life_ != nullptr) life_->ended.store(true);
  std::shared_ptr<const SessionLife> life = std::move(life_);
  life_.reset();
  if (stopping_ || session_id_.empty()) return;
  for (const Unacknowledged& u : unacknowledged_) {
    if (u.id == session_id_) return;
  }
  unacknowledged_.push_back(Unacknowledged{session_id_, std::move(life)});
  while (unacknowledged_.size() > kMaxAcknowledgeSessions) {
    unacknowledged_.pop_front();
  }
}

void Core::AddHeartbeatAcknowledgements(uint64_t nonce, v1::Heartbeat* hb) {
  absl::MutexLock lock(&mu_);
  for (Unacknowledged& u : unacknowledged_) {
    if (u.sent_nonce != 0 || !u.Ready()) continue;
    hb->add_acknowledge_sessions(u.id.data(), u.id.size());
    u.sent_nonce = nonce;
  }
}

void Core::ReadLoop(Stream* stream, const v1::SessionRequest& open) {
  bool ok = stream->Write(open);
  v1::SessionResponse response;
  while (ok && stream->Read(&response)) {
    absl::MutexLock lock(&mu_);
    last_ack_ = absl::Now();
    if (response.has_heartbeat()) {
      // The daemon has taken every acknowledgement this heartbeat carried.
      acked_nonce_ = std::max(acked_nonce_, response.heartbeat().nonce());
      const uint64_t acked = acked_nonce_;
      std::erase_if(unacknowledged_, [acked](const Unacknowledged& u) {
        return u.sent_nonce != 0 && u.sent_nonce <= acked;
      });
    }
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
  // Wait for the connection (up to connect_timeout, when this thread
  // cancels the call) instead of failing while the channel backs off.
  ctx.set_wait_for_ready(true);
  v1::SessionRequest open;
  if (!BeginStream(&ctx, &open)) return absl::CancelledError("client closing");
  // Connect now rather than when the channel's backoff timer fires.
  grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  std::unique_ptr<Stream> stream = stub_->Session(&ctx);
  std::thread reader([this, s = stream.get(), &open] { ReadLoop(s, open); });

  absl::StatusOr<v1::SessionInfo> info = AwaitOpen();
  if (!info.ok()) return EndStream(ctx, reader, *stream, info.status());
  ForgetAcknowledged(open);
  absl::StatusOr<std::shared_ptr<gpu::MappedPool>> pool = MapPool(*info);
  if (!pool.ok()) return EndStream(ctx, reader, *stream, pool.status());
  Publish(*info, std::move(*pool));
  const absl::Status why = Serve(stream.get(), info->session_id());
  return EndStream(ctx, reader, *stream, why);
}

bool Core::BeginStream(grpc::ClientContext* ctx, v1::SessionRequest* open) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  stream_ctx_ = ctx;
  stream_opened_ = false;
  stream_ended_ = false;
  stream_info_.Clear();
  *open = OpenRequest();
  return true;
}

absl::Status Core::EndStream(grpc::ClientContext& ctx, std::thread& reader,
                             Stream& stream, absl::Status why) {
  {
    absl::MutexLock lock(&mu_);
    if (connected_) EndPublishedLocked();
    connected_ = false;
    pool_.reset();
    deferred_.clear();  // the daemon ends the session's leases itself
    live_leases_.clear();
    release_now_ = false;
    ctx.TryCancel();
  }
  reader.join();
  absl::Status final_status = FromGrpcStatus(stream.Finish());
  absl::MutexLock lock(&mu_);
  stream_ctx_ = nullptr;
  // The server's own status explains more than our cancellation does.
  if (!final_status.ok() &&
      final_status.code() != absl::StatusCode::kCancelled) {
    return final_status;
  }
  return why;
}

absl::StatusOr<v1::SessionInfo> Core::AwaitOpen() {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &Core::OpenedOrEnded),
                       options_.connect_timeout);
  if (stopping_) return absl::CancelledError("client closing");
  if (stream_opened_) return stream_info_;
  if (stream_ended_) {
    return absl::UnavailableError("session stream ended before open");
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no session reply within ",
                   absl::FormatDuration(options_.connect_timeout)));
}

void Core::ForgetAcknowledged(const v1::SessionRequest& open) {
  absl::MutexLock lock(&mu_);
  const auto& sent = open.open().acknowledge_sessions();
  std::erase_if(unacknowledged_, [&sent](const Unacknowledged& u) {
    return std::find(sent.begin(), sent.end(), u.id) != sent.end();
  });
  acked_nonce_ = 0;
}

absl::StatusOr<std::shared_ptr<gpu::MappedPool>> Core::MapPool(
    const v1::SessionInfo& info) {
  if (!options_.attach_pool || info.pool().backend() == "none" ||
      info.pool().attach_socket().empty()) {
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<gpu::MappedPool>> mapped =
      AttachPool(info.pool().attach_socket(), info.session_id(),
                 options_.connect_timeout);
  if (!mapped.ok()) {
    return absl::Status(
        mapped.status().code(),
        absl::StrCat("attach pool: ", mapped.status().message()));
  }
  return std::shared_ptr<gpu::MappedPool>(std::move(*mapped));
}

void Core::Publish(const v1::SessionInfo& info,
                   std::shared_ptr<gpu::MappedPool> pool) {
  absl::MutexLock lock(&mu_);
  if (generation_ > 0) ++reconnects_;
  ++generation_;
  session_id_ = info.session_id();
  pool_info_ = info.pool();
  pool_ = std::move(pool);
  lease_ttl_ = absl::Milliseconds(info.lease_ttl_ms());
  life_ = std::make_shared<SessionLife>();
  connected_ = true;
  last_error_ = absl::OkStatus();
  last_ack_ = absl::Now();
}

absl::Status Core::Serve(Stream* stream, const std::string& session_id) {
  uint64_t nonce = 0;
  absl::Time next_heartbeat = absl::Now() + options_.heartbeat_interval;
  while (true) {
    ServeTick tick = AwaitServeTick(next_heartbeat);
    if (!tick.stop.ok()) {
      // Closing: the queued leases end now, not fenced with the session.
      if (!tick.releases.empty()) SendReleases(session_id, tick.releases);
      return tick.stop;
    }
    if (tick.ended) break;
    if (!tick.releases.empty()) SendReleases(session_id, tick.releases);
    if (!tick.heartbeat_due) continue;
    next_heartbeat = absl::Now() + options_.heartbeat_interval;
    if (!SendHeartbeat(stream, ++nonce)) break;
  }
  return absl::UnavailableError("session stream ended");
}

Core::ServeTick Core::AwaitServeTick(absl::Time next_heartbeat) {
  ServeTick tick;
  absl::MutexLock lock(&mu_);
  absl::Time wake = next_heartbeat;
  const absl::Time now = absl::Now();
  if (release_now_) {
    wake = now;
  } else if (!deferred_.empty()) {
    wake = std::min(wake, deferred_.front().since + options_.release_delay);
  } else if (now < release_ticking_until_) {
    wake = std::min(wake, now + options_.release_delay);
  }
  serve_wake_at_ = wake;
  mu_.AwaitWithDeadline(absl::Condition(this, &Core::ServeWakeup), wake);
  serve_wakeup_ = false;
  serve_wake_at_ = absl::InfiniteFuture();
  const absl::Time woke = absl::Now();
  if (stopping_) {
    tick.stop = absl::CancelledError("client closing");
    // No lease of this session writes from now on; all of them end.
    if (life_ != nullptr) life_->ended.store(true);
    tick.releases = TakeDueReleases(absl::InfiniteFuture());
    tick.releases.insert(tick.releases.end(), live_leases_.begin(),
                         live_leases_.end());
    live_leases_.clear();
  } else if (stream_ended_) {
    tick.ended = true;
  } else if (woke - last_ack_ > 3 * options_.heartbeat_interval) {
    tick.stop = absl::DeadlineExceededError(
        "session heartbeat not acknowledged for 3 intervals");
  } else {
    tick.releases = TakeDueReleases(woke);
    tick.heartbeat_due = woke >= next_heartbeat;
  }
  return tick;
}

bool Core::SendHeartbeat(Stream* stream, uint64_t nonce) {
  v1::SessionRequest hb;
  hb.mutable_heartbeat()->set_nonce(nonce);
  AddHeartbeatAcknowledgements(nonce, hb.mutable_heartbeat());
  return stream->Write(hb);
}

}  // namespace radixkv::client_internal
