#include "daemon/async_unary.h"

#include <utility>

#include "absl/time/clock.h"
#include "daemon/cache.h"
#include "daemon/status_util.h"

namespace radixkv::daemon {
namespace {

// A tag on a completion queue: the call object it belongs to.
class CallTag {
 public:
  virtual ~CallTag() = default;
  // `ok` as returned by CompletionQueue::Next for this tag.
  virtual void Proceed(bool ok) = 0;
};

// One unary call of one method, from its request to its Finish. Deletes
// itself after the Finish completes (or when the request is cancelled by
// shutdown). While it is served, a fresh object waits for the next call.
template <typename Request, typename Response>
class UnaryCall final : public CallTag {
 public:
  using RequestFn = void (AsyncKvService::*)(
      grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Response>*,
      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  using HandleFn = absl::Status (*)(Cache*, const Request&, Response*);
  struct Method {
    daemon::Method metric;
    RequestFn request;
    HandleFn handle;
  };

  // Waits for the next call of `method` on `cq` (unless shutting down).
  static void Arm(const Method* method, AsyncUnaryServer::Shared* shared,
                  grpc::ServerCompletionQueue* cq) {
    auto* call = new UnaryCall(method, shared, cq);
    if (!shared->owner->IfOpen([call] { call->RequestNext(); })) delete call;
  }

  void Proceed(bool ok) override {
    if (finishing_ || !ok) {  // Finish done, or the request was cancelled
      delete this;
      return;
    }
    Arm(method_, shared_, cq_);
    const absl::Time start = absl::Now();
    absl::Status status = Admission(&ctx_, shared_->env);
    if (status.ok()) status = method_->handle(shared_->env.cache, request_, &response_);
    if (shared_->env.metrics != nullptr) {
      shared_->env.metrics->Record(method_->metric, status, absl::Now() - start);
    }
    finishing_ = true;
    const bool posted = shared_->owner->IfOpen([&] {
      if (status.ok()) {
        writer_.Finish(response_, grpc::Status::OK, this);
      } else {
        writer_.FinishWithError(ToGrpcStatus(status), this);
      }
    });
    if (!posted) delete this;
  }

 private:
  UnaryCall(const Method* method, AsyncUnaryServer::Shared* shared,
            grpc::ServerCompletionQueue* cq)
      : method_(method), shared_(shared), cq_(cq), writer_(&ctx_) {}

  void RequestNext() {
    (shared_->service->*(method_->request))(&ctx_, &request_, &writer_, cq_, cq_,
                                           this);
  }

  const Method* const method_;
  AsyncUnaryServer::Shared* const shared_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext ctx_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> writer_;
  bool finishing_ = false;
};

using AcquireCall = UnaryCall<v1::AcquireRequest, v1::AcquireResponse>;
using CommitCall = UnaryCall<v1::CommitRequest, v1::CommitResponse>;
using ReleaseCall = UnaryCall<v1::ReleaseRequest, v1::ReleaseResponse>;
using MatchCall = UnaryCall<v1::MatchRequest, v1::MatchResponse>;

const AcquireCall::Method kAcquire{
    Method::kAcquire, &AsyncKvService::RequestAcquire,
    [](Cache* c, const v1::AcquireRequest& req, v1::AcquireResponse* resp) {
      return c->Acquire(req, resp);
    }};
const CommitCall::Method kCommit{
    Method::kCommit, &AsyncKvService::RequestCommit,
    [](Cache* c, const v1::CommitRequest& req, v1::CommitResponse* resp) {
      return c->Commit(req, resp);
    }};
const ReleaseCall::Method kRelease{
    Method::kRelease, &AsyncKvService::RequestRelease,
    [](Cache* c, const v1::ReleaseRequest& req, v1::ReleaseResponse*) {
      return c->Release(req);
    }};
const MatchCall::Method kMatch{
    Method::kMatch, &AsyncKvService::RequestMatch,
    [](Cache* c, const v1::MatchRequest& req, v1::MatchResponse* resp) {
      return c->Match(req, resp);
    }};

// Calls waiting per method and queue: a burst of new calls does not have to
// wait for a re-arm.
constexpr int kArmedPerMethod = 4;

}  // namespace

AsyncUnaryServer::AsyncUnaryServer(
    AsyncKvService* service, const ServiceEnv& env,
    std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs)
    : shared_{service, env, this}, cqs_(std::move(cqs)) {}

AsyncUnaryServer::~AsyncUnaryServer() { Shutdown(); }

void AsyncUnaryServer::Start() {
  for (auto& cq : cqs_) {
    for (int i = 0; i < kArmedPerMethod; ++i) {
      AcquireCall::Arm(&kAcquire, &shared_, cq.get());
      CommitCall::Arm(&kCommit, &shared_, cq.get());
      ReleaseCall::Arm(&kRelease, &shared_, cq.get());
      MatchCall::Arm(&kMatch, &shared_, cq.get());
    }
  }
  for (auto& cq : cqs_) {
    threads_.emplace_back([this, q = cq.get()] { Loop(q); });
  }
}

void AsyncUnaryServer::Loop(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<CallTag*>(tag)->Proceed(ok);
}

void AsyncUnaryServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
  }
  for (auto& cq : cqs_) cq->Shutdown();
  if (threads_.empty()) {  // never started: drain here
    for (auto& cq : cqs_) Loop(cq.get());
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace radixkv::daemon
