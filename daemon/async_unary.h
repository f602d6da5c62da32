// File: daemon/async_unary.h
//
// The hot unary methods of radixkv.v1.KvCache (Acquire, Commit, Release,
// Match) served through gRPC completion queues, with each handler run inline
// on the thread that took the call off its queue.
//
// Why: with gRPC 1.51's callback API every unary call crosses threads (the
// poller hands the call to the callback executor, which runs the reactor and
// hands the write back), about 7.5 futex calls per RPC when calls arrive one
// at a time (docs/BENCHMARKS.md §5). The handlers here never block (the cache
// takes only short internal locks), so they may run on the polling thread:
// one thread per queue calls Next(), serves the call and finishes it.
//
// Session (a bidi stream) and the Admin service stay on the callback API.
//
//   KvService sessions(env);
//   AsyncKvService service(&sessions);          // registered instead
//   builder.RegisterService(&service);
//   std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
//   for (int i = 0; i < n; ++i) cqs.push_back(builder.AddCompletionQueue());
//   server = builder.BuildAndStart();
//   AsyncUnaryServer unary(&service, env, std::move(cqs));
//   unary.Start();
//   ...
//   server->Shutdown();   // in-flight calls finish on the queue threads
//   unary.Shutdown();     // then the queues are shut down and drained
//
// Thread safety: Start and Shutdown are called by the owner, once each; the
// queue threads are internal. Each call object is touched by one queue
// thread at a time (its tags come back on the queue it was requested on).
#ifndef RADIXKV_DAEMON_ASYNC_UNARY_H_
#define RADIXKV_DAEMON_ASYNC_UNARY_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/kv_service.h"
#include "daemon/rpc_util.h"
#include "grpcpp/completion_queue.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::daemon {

// radixkv.v1.KvCache with Acquire, Commit, Release and Match as async
// methods (served by AsyncUnaryServer) and Session as a callback method that
// `sessions` implements. (Built over the plain Service: marking a method
// async over CallbackService keeps its callback handler in gRPC 1.51.)
class AsyncKvService final
    : public v1::KvCache::WithCallbackMethod_Session<
          v1::KvCache::WithAsyncMethod_Acquire<v1::KvCache::WithAsyncMethod_Commit<
              v1::KvCache::WithAsyncMethod_Release<
                  v1::KvCache::WithAsyncMethod_Match<v1::KvCache::Service>>>>> {
 public:
  // `sessions` is borrowed (not registered itself) and must outlive this.
  explicit AsyncKvService(KvService* sessions) : sessions_(sessions) {}

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* ctx) override {
    return sessions_->Session(ctx);
  }

 private:
  KvService* const sessions_;
};

class AsyncUnaryServer {
 public:
  // `service` and `env` members are borrowed and must outlive this object;
  // `cqs` come from ServerBuilder::AddCompletionQueue (one thread each).
  AsyncUnaryServer(AsyncKvService* service, const ServiceEnv& env,
                   std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs);
  // Calls Shutdown.
  ~AsyncUnaryServer();
  AsyncUnaryServer(const AsyncUnaryServer&) = delete;
  AsyncUnaryServer& operator=(const AsyncUnaryServer&) = delete;

  // Requests the first calls of every method on every queue and starts the
  // queue threads. REQUIRES: the grpc::Server was built and started.
  void Start();
  // Shuts the queues down, drains them and joins the threads. Call after
  // grpc::Server::Shutdown has returned; idempotent.
  void Shutdown();

  // Internal: what a call needs to re-arm itself and run its handler.
  struct Shared {
    AsyncKvService* service;
    ServiceEnv env;
    AsyncUnaryServer* owner;
  };
  // Internal: runs `post` unless the queues are shut down (posting to a
  // shut-down queue is a gRPC error); false when it did not run.
  template <typename Fn>
  bool IfOpen(Fn&& post) {
    absl::ReaderMutexLock lock(&mu_);
    if (closed_) return false;
    post();
    return true;
  }

 private:
  void Loop(grpc::ServerCompletionQueue* cq);

  Shared shared_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  // mu_ protects the following: once set, nothing is posted to the queues.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_ASYNC_UNARY_H_
