// Helper processes for the radixkvctl tests (ctl_test.py):
//
//   ctl_test_helper populate SOCKET TOKENS SALT   cache a prompt, then exit
//   ctl_test_helper hold SOCKET TOKENS SALT       keep a session and a lease
//                                                 open until stdin closes
//   ctl_test_helper unhealthy SOCKET              a gRPC server whose health
//                                                 status is NOT_SERVING, until
//                                                 stdin closes
//
// The namespace is fixed: model "ctl-test", 2 layers, 2 KV heads, head_dim 8,
// fp16, page_size 4. Prompt token i is SALT * 1000 + i + 1. Prints one JSON
// line ("ready" state) on stdout.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "client/client.h"
#include "radixkv/v1/radixkv.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace {

radixkv::NamespaceSpec TestNamespace() {
  radixkv::NamespaceSpec ns;
  ns.model = "ctl-test";
  ns.num_layers = 2;
  ns.num_kv_heads = 2;
  ns.head_dim = 8;
  ns.page_size = 4;
  ns.dtype = radixkv::DType::kFloat16;
  return ns;
}

void WaitForStdinEof() {
  std::string line;
  while (std::getline(std::cin, line)) {
  }
}

int Usage() {
  std::cerr << "usage: ctl_test_helper populate|hold SOCKET TOKENS SALT | "
               "unhealthy SOCKET\n";
  return 2;
}

int RunClient(const std::string& mode, const std::string& socket,
              uint32_t n, uint32_t salt) {
  radixkv::ClientOptions o;
  o.endpoint = socket;
  o.ns = TestNamespace();
  o.client_name = "ctl-helper-" + mode;
  o.initial_wait = absl::Seconds(30);
  o.call_timeout = absl::Seconds(10);
  auto client = radixkv::Client::Create(o);
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  absl::Status s = (*client)->WaitForSession(absl::Seconds(30));
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  std::vector<uint32_t> tokens(n);
  for (uint32_t i = 0; i < n; ++i) tokens[i] = salt * 1000 + i + 1;
  absl::StatusOr<radixkv::Lease> lease = (*client)->Acquire(tokens);
  if (!lease.ok() || lease->degraded()) {
    std::cerr << "acquire failed\n";
    return 1;
  }
  uint32_t inserted = 0;
  if (mode == "populate") {
    auto c = lease->Commit(lease->new_blocks(), /*release=*/true);
    if (!c.ok()) {
      std::cerr << c.status() << "\n";
      return 1;
    }
    inserted = c->inserted();
  }
  std::printf("{\"matched_blocks\":%u,\"new_blocks\":%u,\"inserted\":%u}\n",
              lease->matched_blocks(), lease->new_blocks(), inserted);
  std::fflush(stdout);
  if (mode == "hold") WaitForStdinEof();
  return 0;
}

int RunUnhealthy(const std::string& socket) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  // A server needs at least one service of its own besides health; every
  // Admin method of this one answers UNIMPLEMENTED.
  radixkv::v1::Admin::CallbackService unimplemented;
  builder.RegisterService(&unimplemented);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return 1;
  server->GetHealthCheckService()->SetServingStatus(false);
  std::printf("{\"ready\":true}\n");
  std::fflush(stdout);
  WaitForStdinEof();
  server->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string mode = argv[1];
  const std::string socket = argv[2];
  if (mode == "unhealthy") return RunUnhealthy(socket);
  uint32_t n = 0, salt = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[3], &n) ||
      !absl::SimpleAtoi(argv[4], &salt) || n == 0) {
    return Usage();
  }
  if (mode != "populate" && mode != "hold") return Usage();
  return RunClient(mode, socket, n, salt);
}
