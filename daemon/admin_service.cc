#include "daemon/admin_service.h"

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cache.h"
#include "daemon/event_log.h"
#include "daemon/log.h"
#include "daemon/rpc_util.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {

// One WatchEvents stream. Writes one event at a time; deletes itself in
// OnDone after unsubscribing from the log.
class AdminService::Watcher final : public grpc::ServerWriteReactor<v1::Event>,
                                    public EventLog::Watcher {
 public:
  Watcher(EventLog* log, uint64_t start_sequence)
      : log_(log),
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
    state_.WriteStarted();
    StartWrite(&event_);
  }

  void FinishOnce(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (std::optional<grpc::Status> end = state_.End(status)) Finish(*end);
  }

  EventLog* const log_;
  absl::Mutex mu_;
  // mu_ protects the following.
  uint64_t next_ ABSL_GUARDED_BY(mu_);
  v1::Event event_ ABSL_GUARDED_BY(mu_);  // in flight while writing
  StreamWriteState state_ ABSL_GUARDED_BY(mu_);
};

AdminService::AdminService(const ServiceEnv& env) : env_(env) {}

grpc::ServerUnaryReactor* AdminService::GetStats(
    grpc::CallbackServerContext* ctx, const v1::GetStatsRequest* req,
    v1::GetStatsResponse* resp) {
  return RunUnary(ctx, env_, Method::kGetStats, [&] {
    env_.cache->GetStats(resp->mutable_stats());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::ListNamespaces(
    grpc::CallbackServerContext* ctx, const v1::ListNamespacesRequest* req,
    v1::ListNamespacesResponse* resp) {
  return RunUnary(ctx, env_, Method::kListNamespaces, [&] {
    env_.cache->ListNamespaces(resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::DumpTree(
    grpc::CallbackServerContext* ctx, const v1::DumpTreeRequest* req,
    v1::DumpTreeResponse* resp) {
  return RunUnary(ctx, env_, Method::kDumpTree,
                  [&] { return env_.cache->DumpTree(*req, resp); });
}

grpc::ServerUnaryReactor* AdminService::Explain(
    grpc::CallbackServerContext* ctx, const v1::ExplainRequest* req,
    v1::ExplainResponse* resp) {
  return RunUnary(ctx, env_, Method::kExplain,
                  [&] { return env_.cache->Explain(*req, resp); });
}

grpc::ServerUnaryReactor* AdminService::Evict(grpc::CallbackServerContext* ctx,
                                              const v1::EvictRequest* req,
                                              v1::EvictResponse* resp) {
  return RunUnary(ctx, env_, Method::kEvict, [&] {
    env_.cache->Evict(*req, resp);
    Log(LogLevel::kInfo,
        absl::StrCat("audit: Evict from ", ctx->peer(), ": asked ",
                     req->pages(), " pages, evicted ", resp->evicted()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::Clear(grpc::CallbackServerContext* ctx,
                                              const v1::ClearRequest* req,
                                              v1::ClearResponse* resp) {
  return RunUnary(ctx, env_, Method::kClear, [&] {
    env_.cache->Clear(resp);
    Log(LogLevel::kInfo,
        absl::StrCat("audit: Clear from ", ctx->peer(), ": removed ",
                     resp->removed(), " blocks, ", resp->pinned_remaining(),
                     " pinned remain"));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::ListSessions(
    grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest* req,
    v1::ListSessionsResponse* resp) {
  return RunUnary(ctx, env_, Method::kListSessions, [&] {
    env_.cache->ListSessions(resp);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::Event>* AdminService::WatchEvents(
    grpc::CallbackServerContext* ctx, const v1::WatchEventsRequest* req) {
  const absl::Time start = absl::Now();
  absl::Status admission = Admission(ctx, env_);
  // A start past the next event would wait for events that may never come
  // (at 2^64-1, forever): refuse it.
  const uint64_t next = env_.cache->events().next_sequence();
  if (admission.ok() && req->start_sequence() > next) {
    admission = FieldError(
        absl::StatusCode::kOutOfRange, "start_sequence",
        v1::ERROR_REASON_INVALID,
        absl::StrCat(req->start_sequence(), " is past the next event's "
                     "sequence ", next, "; send 0 (from now on) or a "
                     "sequence already seen"));
  }
  if (env_.metrics != nullptr) {
    env_.metrics->Record(Method::kWatchEvents, admission, absl::Now() - start);
  }
  if (!admission.ok()) {
    // A trivial reactor that only reports the refusal.
    class Refusal final : public grpc::ServerWriteReactor<v1::Event> {
     public:
      explicit Refusal(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Refusal(ToGrpcStatus(admission));
  }
  return new Watcher(&env_.cache->events(), req->start_sequence());
}

}  // namespace radixkv::daemon
