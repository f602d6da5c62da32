// lease_holder: a stand-in worker for the crash test. Opens a Session on
// radixkvd, acquires a prompt with allocate (its new pages are WRITING),
// prints "ready <lease_id> <new_blocks>" and then sleeps until killed.
//
//   lease_holder SOCKET_PATH [TOKENS]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "radixkv/defaults.h"
#include "tests/daemon/test_util.h"

int main(int argc, char** argv) {
  using namespace radixkv::testing;
  if (argc < 2) {
    std::fprintf(stderr, "usage: lease_holder SOCKET_PATH [TOKENS]\n");
    return 2;
  }
  const size_t n = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 16;
  auto channel = grpc::CreateChannel(radixkv::UnixTarget(argv[1]),
                                     grpc::InsecureChannelCredentials());
  auto kv = v1::KvCache::NewStub(channel);
  SessionStream session(kv.get(), TestNamespace(), "lease_holder");
  if (!session.ok()) {
    std::fprintf(stderr, "open failed: %s\n", session.status().error_message().c_str());
    return 1;
  }
  v1::AcquireRequest req;
  req.set_session_id(session.id());
  SetTokens(&req, Tokens(n, 99));
  req.set_allocate(true);
  v1::AcquireResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  grpc::Status s = kv->Acquire(&ctx, req, &resp);
  if (!s.ok()) {
    std::fprintf(stderr, "acquire failed: %s\n", s.error_message().c_str());
    return 1;
  }
  std::printf("ready %llu %u\n", static_cast<unsigned long long>(resp.lease_id()),
              resp.new_blocks());
  std::fflush(stdout);
  while (true) pause();
}
