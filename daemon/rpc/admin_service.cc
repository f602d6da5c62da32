#include "daemon/rpc/admin_service.h"

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/cache.h"
#include "daemon/events/event_log.h"
#include "base/log.h"
#include "daemon/rpc/rpc_util.h"
#include "base/status_macros.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {

// One WatchEvents stream. Writes one event at a time; deletes itself in
// OnDone after unsubscribing from the log.
class AdminService::Watcher final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
      public EventLog::Watcher {
 public:
  Watcher(AdminService* service, EventLog* log, uint64_t start_sequence)
      : service_(service),
        log_(log),
        next_(start_sequence == 0 ? log->next_sequence() : start_sequence) {
    log_->Subscribe(this);
    TryWrite();
  }

  void OnEventsAvailable() override { TryWrite(); }
  void OnShutdown() override {
    FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "radixkvd is shutting down"));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (std::optional<grpc::Status> end = state_.WriteDone()) {
      Finish(*end);
      return;
    }
    if (!ok) return;  // the client went away; OnCancel follows
    TryWriteLocked();
  }

  void OnCancel() override { FinishOnce(grpc::Status::CANCELLED); }

  void OnDone() override {
    log_->Unsubscribe(this);
    service_->ReleaseWatcher();
    delete this;
  }

 private:
  void TryWrite() {
    absl::MutexLock lock(&mu_);
    TryWriteLocked();
  }

  void TryWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!state_.can_write()) return;
    if (!log_->Read(&next_, &event_)) return;
    if (absl::Status s = SerializeBody(event_, &body_); !s.ok()) {
      if (std::optional<grpc::Status> end = state_.End(ToGrpcStatus(s))) {
        Finish(*end);
      }
      return;
    }
    state_.WriteStarted();
    StartWrite(&body_);
  }

  void FinishOnce(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (std::optional<grpc::Status> end = state_.End(status)) Finish(*end);
  }

  AdminService* const service_;
  EventLog* const log_;
  absl::Mutex mu_;
  // mu_ protects the following.
  uint64_t next_ ABSL_GUARDED_BY(mu_);
  v1::Event event_ ABSL_GUARDED_BY(mu_);       // the last event read
  grpc::ByteBuffer body_ ABSL_GUARDED_BY(mu_);  // it serialized, in flight
  StreamWriteState state_ ABSL_GUARDED_BY(mu_);
};

AdminService::AdminService(const ServiceEnv& env, uint32_t max_watchers)
    : env_(env), max_watchers_(max_watchers) {}

absl::Status AdminService::ReserveWatcher() {
  uint32_t n = watchers_.load(std::memory_order_relaxed);
  do {
    if (max_watchers_ != 0 && n >= max_watchers_) {
      return FieldError(absl::StatusCode::kResourceExhausted, "WatchEvents",
                        v1::ERROR_REASON_LIMIT,
                        absl::StrCat(n, " streams are open, the limit "
                                     "--max_watch_streams=", max_watchers_,
                                     " is reached"));
    }
  } while (!watchers_.compare_exchange_weak(n, n + 1));
  return absl::OkStatus();
}

void AdminService::ReleaseWatcher() {
  watchers_.fetch_sub(1, std::memory_order_relaxed);
}

grpc::ServerUnaryReactor* AdminService::GetStats(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body,
    grpc::ByteBuffer* reply) {
  return RunUnary<v1::GetStatsRequest, v1::GetStatsResponse>(
      ctx, env_, Method::kGetStats, body, reply,
      [&](const Caller& c, const v1::GetStatsRequest&,
          v1::GetStatsResponse* resp) {
        env_.cache->GetStats(resp->mutable_stats());
        // A tenant sees its own share of the pool, no one else's.
        auto* tenants = resp->mutable_stats()->mutable_tenants();
        for (int i = tenants->size() - 1; i >= 0; --i) {
          if (!c.scope.Sees(tenants->Get(i).name())) {
            tenants->DeleteSubrange(i, 1);
          }
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AdminService::ListNamespaces(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body,
    grpc::ByteBuffer* reply) {
  return RunUnary<v1::ListNamespacesRequest, v1::ListNamespacesResponse>(
      ctx, env_, Method::kListNamespaces, body, reply,
      [&](const Caller& c, const v1::ListNamespacesRequest&,
          v1::ListNamespacesResponse* resp) {
        env_.cache->ListNamespaces(resp, c);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AdminService::DumpTree(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body,
    grpc::ByteBuffer* reply) {
  return RunUnary<v1::DumpTreeRequest, v1::DumpTreeResponse>(
      ctx, env_, Method::kDumpTree, body, reply,
      [&](const Caller& c, const v1::DumpTreeRequest& req,
          v1::DumpTreeResponse* resp) {
        return env_.cache->DumpTree(req, resp, c);
      });
}

grpc::ServerUnaryReactor* AdminService::Explain(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body,
    grpc::ByteBuffer* reply) {
  return RunUnary<v1::ExplainRequest, v1::ExplainResponse>(
      ctx, env_, Method::kExplain, body, reply,
      [&](const Caller& c, const v1::ExplainRequest& req,
          v1::ExplainResponse* resp) {
        return env_.cache->Explain(req, resp, c);
      });
}

grpc::ServerUnaryReactor* AdminService::Evict(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* body,
                                              grpc::ByteBuffer* reply) {
  return RunUnary<v1::EvictRequest, v1::EvictResponse>(
      ctx, env_, Method::kEvict, body, reply,
      [&](const Caller& c, const v1::EvictRequest& req,
          v1::EvictResponse* resp) {
        RETURN_IF_ERROR(RequireAdmin(c, Method::kEvict, env_));
        env_.cache->Evict(req, resp);
        Log(LogLevel::kInfo,
            absl::StrCat("audit: Evict from ", c.peer.ToString(), ": asked ",
                         req.pages(), " pages, evicted ", resp->evicted()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AdminService::Clear(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* body,
                                              grpc::ByteBuffer* reply) {
  return RunUnary<v1::ClearRequest, v1::ClearResponse>(
      ctx, env_, Method::kClear, body, reply,
      [&](const Caller& c, const v1::ClearRequest&, v1::ClearResponse* resp) {
        RETURN_IF_ERROR(RequireAdmin(c, Method::kClear, env_));
        env_.cache->Clear(resp);
        Log(LogLevel::kInfo,
            absl::StrCat("audit: Clear from ", c.peer.ToString(),
                         ": removed ", resp->removed(), " blocks, ",
                         resp->pinned_remaining(), " pinned remain"));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AdminService::ListSessions(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body,
    grpc::ByteBuffer* reply) {
  return RunUnary<v1::ListSessionsRequest, v1::ListSessionsResponse>(
      ctx, env_, Method::kListSessions, body, reply,
      [&](const Caller& c, const v1::ListSessionsRequest&,
          v1::ListSessionsResponse* resp) {
        env_.cache->ListSessions(resp, c);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AdminService::Pin(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* body,
                                            grpc::ByteBuffer* reply) {
  return RunUnary<v1::PinRequest, v1::PinResponse>(
      ctx, env_, Method::kPin, body, reply,
      [&](const Caller& c, const v1::PinRequest& req, v1::PinResponse* resp) {
        RETURN_IF_ERROR(env_.cache->Pin(req, resp, c));
        Log(LogLevel::kInfo,
            absl::StrCat("audit: Pin ", resp->pin_id(), " of ",
                         resp->pinned_blocks(), " blocks by ",
                         c.peer.ToString(), " (tenant ", c.scope.name(), ")"));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AdminService::Unpin(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* body,
                                              grpc::ByteBuffer* reply) {
  return RunUnary<v1::UnpinRequest, v1::UnpinResponse>(
      ctx, env_, Method::kUnpin, body, reply,
      [&](const Caller& c, const v1::UnpinRequest& req,
          v1::UnpinResponse* resp) {
        RETURN_IF_ERROR(env_.cache->Unpin(req, resp, c));
        Log(LogLevel::kInfo,
            absl::StrCat("audit: Unpin ", req.pin_id(), " by ",
                         c.peer.ToString(), " (tenant ", c.scope.name(), ")"));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AdminService::ListPins(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body,
    grpc::ByteBuffer* reply) {
  return RunUnary<v1::ListPinsRequest, v1::ListPinsResponse>(
      ctx, env_, Method::kListPins, body, reply,
      [&](const Caller& c, const v1::ListPinsRequest&,
          v1::ListPinsResponse* resp) {
        env_.cache->ListPins(resp, c);
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* AdminService::WatchEvents(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* body) {
  const absl::Time start = StartCall(env_, Method::kWatchEvents);
  v1::WatchEventsRequest req;
  absl::StatusOr<Caller> caller =
      AdmitRequest(ctx, env_, Method::kWatchEvents, body, &req);
  absl::Status admission = caller.status();
  // Events name every tenant's blocks: administrators only.
  if (admission.ok()) {
    admission = RequireAdmin(*caller, Method::kWatchEvents, env_);
  }
  // A start past the next event would wait for events that may never come
  // (at 2^64-1, forever): refuse it.
  const uint64_t next = env_.cache->events().next_sequence();
  if (admission.ok() && req.start_sequence() > next) {
    admission = FieldError(
        absl::StatusCode::kOutOfRange, "start_sequence",
        v1::ERROR_REASON_INVALID,
        absl::StrCat(req.start_sequence(), " is past the next event's "
                     "sequence ", next, "; send 0 (from now on) or a "
                     "sequence already seen"));
  }
  if (admission.ok()) admission = ReserveWatcher();
  if (env_.metrics != nullptr) {
    env_.metrics->Record(Method::kWatchEvents, admission, absl::Now() - start);
  }
  if (!admission.ok()) {
    // A trivial reactor that only reports the refusal.
    class Refusal final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
     public:
      explicit Refusal(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Refusal(ToGrpcStatus(admission));
  }
  return new Watcher(this, &env_.cache->events(), req.start_sequence());
}

}  // namespace radixkv::daemon
