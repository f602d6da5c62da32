#include "daemon/rpc/kv_service.h"

#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/cache.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

// Replies a Session stream may have waiting to be read by its client; a
// client that sends heartbeats and never reads the acks is disconnected.
constexpr size_t kMaxPendingReplies = 64;

}  // namespace

// One Session stream. Deletes itself in OnDone.
class KvService::SessionReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionReactor(KvService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx) {
    if (!service_->Register(this)) {
      FinishOnce(absl::UnavailableError("radixkvd is shutting down"));
      return;
    }
    StartRead(&body_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side, or the call broke
      FinishOnce(absl::OkStatus());
      return;
    }
    const absl::Time start = absl::Now();
    absl::Status s = ParseBody(&body_, &request_);
    if (!s.ok()) {
      const ServiceEnv& env = service_->env_;
      if (env.metrics != nullptr) {
        env.metrics->Started(Method::kSession);
        env.metrics->Record(Method::kSession, s, absl::Now() - start);
      }
      FinishOnce(s);
      return;
    }
    s = Handle(request_);
    if (!s.ok()) {
      FinishOnce(s);
      return;
    }
    absl::MutexLock lock(&mu_);
    if (!state_.finished()) StartRead(&body_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    pending_.pop_front();
    if (std::optional<grpc::Status> end = state_.WriteDone()) {
      Finish(*end);
      return;
    }
    if (ok && !pending_.empty() && state_.can_write()) {
      state_.WriteStarted();
      StartWrite(&pending_.front());
    }
  }

  void OnCancel() override {
    FinishOnce(absl::CancelledError("Session stream cancelled"));
  }

  void OnDone() override {
    service_->Unregister(this);
    EndSession();
    delete this;
  }

  // Ends the stream with `status` (once) and closes the session.
  void FinishOnce(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (state_.finished()) return;
      if (std::optional<grpc::Status> end = state_.End(ToGrpcStatus(status))) {
        Finish(*end);
      }
    }
    EndSession();
  }

 private:
  absl::Status Handle(const v1::SessionRequest& req) {
    switch (req.kind_case()) {
      case v1::SessionRequest::kOpen: {
        const absl::Time start = StartCall(service_->env_, Method::kSession);
        absl::Status s = Open(req.open());
        const ServiceEnv& env = service_->env_;
        if (env.metrics != nullptr) {
          env.metrics->Record(Method::kSession, s, absl::Now() - start);
        }
        return s;
      }
      case v1::SessionRequest::kHeartbeat: {
        {
          absl::MutexLock lock(&mu_);
          if (session_id_.empty()) {
            return FieldError(absl::StatusCode::kInvalidArgument, "open",
                              v1::ERROR_REASON_INVALID,
                              "the first Session message must be `open`, "
                              "got heartbeat");
          }
        }
        if (req.heartbeat().acknowledge_sessions_size() > 0) {
          // Rare: a lost session whose writes outlived this stream's open.
          absl::StatusOr<Caller> caller =
              AdmitCaller(ctx_, service_->env_, Method::kSession);
          if (!caller.ok()) return caller.status();
          RETURN_IF_ERROR(service_->env_.cache->AcknowledgeSessions(
              req.heartbeat().acknowledge_sessions(), *caller));
        }
        absl::MutexLock lock(&mu_);
        if (pending_.size() >= kMaxPendingReplies) {
          return FieldError(absl::StatusCode::kResourceExhausted, "heartbeat",
                            v1::ERROR_REASON_LIMIT,
                            absl::StrCat(pending_.size(),
                                         " heartbeat acks are unread (the "
                                         "limit is ", kMaxPendingReplies,
                                         "); read the stream"));
        }
        v1::SessionResponse resp;
        resp.mutable_heartbeat()->set_nonce(req.heartbeat().nonce());
        return EnqueueLocked(resp);
      }
      case v1::SessionRequest::KIND_NOT_SET:
        break;
    }
    return FieldError(absl::StatusCode::kInvalidArgument, "kind",
                      v1::ERROR_REASON_INVALID,
                      "a SessionRequest sets `open` (first) or `heartbeat`");
  }

  absl::Status Open(const v1::OpenSession& open) {
    {
      absl::MutexLock lock(&mu_);
      if (!session_id_.empty()) {
        return FieldError(absl::StatusCode::kInvalidArgument, "open",
                          v1::ERROR_REASON_INVALID,
                          "this stream already has a session; send heartbeats, "
                          "or open another stream for another namespace");
      }
    }
    absl::StatusOr<Caller> caller =
        AdmitCaller(ctx_, service_->env_, Method::kSession);
    if (!caller.ok()) return caller.status();
    v1::SessionResponse resp;
    absl::Status s = service_->env_.cache->OpenSession(
        open, *caller, resp.mutable_session());
    if (!s.ok()) {
      Log(LogLevel::kWarning,
          absl::StrCat("audit: session open refused for ",
                       caller->peer.ToString(), " (", open.client_name(),
                       ", model '", open.namespace_().model(), "'): ",
                       s.ToString()));
      return s;
    }
    const std::string id = resp.session().session_id();
    bool closed = false;
    {
      absl::MutexLock lock(&mu_);
      session_id_ = id;
      closed = state_.finished();  // cancelled while opening: do not leak it
      // An answer that cannot be sent ends the stream, and with it the
      // session.
      if (!closed) RETURN_IF_ERROR(EnqueueLocked(resp));
    }
    if (closed) {
      EndSession();
      return absl::OkStatus();
    }
    if (LogEnabled(LogLevel::kDebug)) {
      Log(LogLevel::kDebug,
          absl::StrCat("session ", id, " opened by ", caller->peer.ToString(),
                       " (tenant ", caller->scope.name(), ", ",
                       open.client_name(), ")"));
    }
    return absl::OkStatus();
  }

  // Queues `resp`, serialized, and starts its write when none is in flight.
  absl::Status EnqueueLocked(const v1::SessionResponse& resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (state_.finished()) return absl::OkStatus();
    grpc::ByteBuffer body;
    RETURN_IF_ERROR(SerializeBody(resp, &body));
    pending_.emplace_back().Swap(&body);
    if (state_.can_write()) {
      state_.WriteStarted();
      StartWrite(&pending_.front());
    }
    return absl::OkStatus();
  }

  void EndSession() {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      if (session_closed_ || session_id_.empty()) return;
      session_closed_ = true;
      id = session_id_;
    }
    service_->env_.cache->CloseSession(id);
    if (LogEnabled(LogLevel::kDebug)) {
      Log(LogLevel::kDebug, absl::StrCat("session ", id, " closed"));
    }
  }

  KvService* const service_;
  grpc::CallbackServerContext* const ctx_;
  // Only touched by the read chain: the message being read, then parsed.
  grpc::ByteBuffer body_;
  v1::SessionRequest request_;

  absl::Mutex mu_;
  // mu_ protects the following.
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  // Serialized answers; the front one is in flight.
  std::deque<grpc::ByteBuffer> pending_ ABSL_GUARDED_BY(mu_);
  StreamWriteState state_ ABSL_GUARDED_BY(mu_);
  bool session_closed_ ABSL_GUARDED_BY(mu_) = false;
};

KvService::KvService(const ServiceEnv& env) : env_(env) {}

KvService::~KvService() = default;

bool KvService::Register(SessionReactor* r) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return false;
  live_.insert(r);
  return true;
}

void KvService::Unregister(SessionReactor* r) {
  absl::MutexLock lock(&mu_);
  live_.erase(r);
}

void KvService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (SessionReactor* r : live_) {
    r->FinishOnce(absl::UnavailableError("radixkvd is shutting down"));
  }
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
KvService::Session(grpc::CallbackServerContext* ctx) {
  return new SessionReactor(this, ctx);
}

namespace {

// Finishes an Acquire that made a lease. If the call then fails before the
// answer reaches the client (its deadline passes or it is cancelled while
// the answer waits to be sent, the connection breaks), the client never
// learns the lease id, so the lease is ended here instead of pinning its
// pages until --lease_ttl. (An answer that was sent but arrived after the
// client gave up is not seen as failed here; that lease waits for the TTL.)
class AcquireReactor final : public grpc::ServerUnaryReactor {
 public:
  AcquireReactor(grpc::CallbackServerContext* ctx, Cache* cache,
                 const LeaseHandle& lease)
      : ctx_(ctx), cache_(cache), lease_(lease) {}

  void OnDone() override {
    if (ctx_->IsCancelled()) cache_->AbandonLease(lease_);
    delete this;
  }
  // OnDone is short (it rarely takes the tree's lock for microseconds), so
  // gRPC may run it on the thread that completes the call, as it does for
  // its own default reactor, instead of handing it to its executor, a
  // hand-off that costs a share of every Acquire. gRPC 1.51 documents this hook as internal; if a
  // later gRPC drops it, this override stops compiling rather than silently
  // changing.
  bool InternalInlineable() override { return true; }

 private:
  grpc::CallbackServerContext* const ctx_;
  Cache* const cache_;
  const LeaseHandle lease_;
};

}  // namespace

grpc::ServerUnaryReactor* KvService::Acquire(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* body,
                                             grpc::ByteBuffer* reply) {
  const absl::Time start = StartCall(env_, Method::kAcquire);
  v1::AcquireRequest req;
  v1::AcquireResponse resp;
  absl::StatusOr<Caller> caller =
      AdmitRequest(ctx, env_, Method::kAcquire, body, &req);
  absl::Status status = caller.status();
  LeaseHandle lease;
  if (status.ok()) status = env_.cache->Acquire(req, &resp, *caller, &lease);
  if (status.ok()) {
    status = SerializeBody(resp, reply);
    // An answer that cannot be sent leaves no lease behind.
    if (!status.ok() && resp.lease_id() != 0) env_.cache->AbandonLease(lease);
  }
  if (!status.ok() || resp.lease_id() == 0) {
    return FinishUnary(ctx, env_, Method::kAcquire, start, status);
  }
  RecordUnary(env_, Method::kAcquire, start, status);
  auto* reactor = new AcquireReactor(ctx, env_.cache, lease);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Commit(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* body,
                                            grpc::ByteBuffer* reply) {
  return RunUnary<v1::CommitRequest, v1::CommitResponse>(
      ctx, env_, Method::kCommit, body, reply,
      [&](const Caller& c, const v1::CommitRequest& req,
          v1::CommitResponse* resp) {
        return env_.cache->Commit(req, resp, c);
      });
}

grpc::ServerUnaryReactor* KvService::Release(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* body,
                                             grpc::ByteBuffer* reply) {
  return RunUnary<v1::ReleaseRequest, v1::ReleaseResponse>(
      ctx, env_, Method::kRelease, body, reply,
      [&](const Caller& c, const v1::ReleaseRequest& req,
          v1::ReleaseResponse*) { return env_.cache->Release(req, c); });
}

grpc::ServerUnaryReactor* KvService::Match(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* body,
                                           grpc::ByteBuffer* reply) {
  return RunUnary<v1::MatchRequest, v1::MatchResponse>(
      ctx, env_, Method::kMatch, body, reply,
      [&](const Caller& c, const v1::MatchRequest& req,
          v1::MatchResponse* resp) {
        return env_.cache->Match(req, resp, c);
      });
}

}  // namespace radixkv::daemon
