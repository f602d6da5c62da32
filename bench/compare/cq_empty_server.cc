// File: bench/compare/cq_empty_server.cc
//
// cq_empty_server: an empty gRPC handler on the completion-queue API, to
// compare gRPC's two server threading models on this machine. radixkvd's
// services use the callback API (gRPC's own threads run the handlers);
// here each of --threads threads owns one completion queue and runs the
// handler inline as its events come out, the model of gRPC's own
// benchmark servers. Every method is answered with the bytes of a
// grpc.health.v1.HealthCheckResponse{status: SERVING}, so `loadgen
// --method=health` drives it exactly as it drives radixkvd's Health/Check:
//
//   B_FLAGS=--threads=2 CASES="health:4x16 health:16x1 health:1x1"
//   bench/compare/ab_daemons.sh build/default/daemon/radixkvd
//   build/default/bench/compare/cq_empty_server
//
// Thread safety: a call's state is touched only by the thread of its queue.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"

ABSL_FLAG(std::string, socket, "", "Unix socket path to listen on");
ABSL_FLAG(int32_t, threads, 2, "completion queues, one polling thread each");
ABSL_FLAG(int32_t, calls_per_queue, 64,
          "calls waiting for a request per queue");

namespace radixkv::bench {
namespace {

// HealthCheckResponse{status: SERVING}: field 1, varint 1.
constexpr char kServing[] = {0x08, 0x01};

// One call: request it, read its message, answer, free itself.
class Call {
 public:
  Call(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq), stream_(&ctx_) {
    service_->RequestCall(&ctx_, &stream_, cq_, cq_, this);
  }

  void Proceed(bool ok) {
    switch (state_) {
      case State::kRequested:
        if (!ok) {  // the server is shutting down
          delete this;
          return;
        }
        new Call(service_, cq_);  // keep one waiting in its place
        state_ = State::kReading;
        stream_.Read(&request_, this);
        return;
      case State::kReading: {
        state_ = State::kFinishing;
        grpc::Slice slice(kServing, sizeof(kServing));
        response_ = grpc::ByteBuffer(&slice, 1);
        stream_.WriteAndFinish(response_, grpc::WriteOptions(),
                               grpc::Status::OK, this);
        return;
      }
      case State::kFinishing:
        delete this;
        return;
    }
  }

 private:
  enum class State { kRequested, kReading, kFinishing };
  grpc::AsyncGenericService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::GenericServerContext ctx_;
  grpc::GenericServerAsyncReaderWriter stream_;
  grpc::ByteBuffer request_, response_;
  State state_ = State::kRequested;
};

int Run() {
  const std::string socket = absl::GetFlag(FLAGS_socket);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int waiting = absl::GetFlag(FLAGS_calls_per_queue);
  if (socket.empty() || threads < 1 || threads > 64 || waiting < 1) {
    std::cerr << "Error: --socket is required; --threads must be 1..64 and "
                 "--calls_per_queue >= 1\n";
    return 2;
  }
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterAsyncGenericService(&service);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  for (int i = 0; i < threads; ++i) {
    queues.push_back(builder.AddCompletionQueue());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::cerr << "Error: cannot listen on unix:" << socket << "\n";
    return 1;
  }
  std::vector<std::thread> pollers;
  for (auto& q : queues) {
    grpc::ServerCompletionQueue* cq = q.get();
    for (int i = 0; i < waiting; ++i) new Call(&service, cq);
    pollers.emplace_back([cq] {
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) static_cast<Call*>(tag)->Proceed(ok);
    });
  }
  server->Wait();  // until killed; a benchmark helper has no clean stop
  return 0;
}

}  // namespace
}  // namespace radixkv::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "empty gRPC handler on the completion-queue API: "
      "--socket=PATH --threads=N");
  absl::ParseCommandLine(argc, argv);
  return radixkv::bench::Run();
}
