// The smallest program against the installed radixkv package: computes the
// block keys of a prompt and asks a (here absent) daemon for its prefix, which
// degrades to "no match, no pages". Exits 0 and prints "ok" when all holds.
#include <cstdio>
#include <vector>

#include "client/client.h"
#include "client/status.h"

int main() {
  radixkv::ClientOptions options;
  options.endpoint = "/tmp/radixkv_example_consumer_nobody.sock";
  options.initial_wait = absl::Milliseconds(100);
  options.ns.model = "example";
  options.ns.num_layers = 2;
  options.ns.num_kv_heads = 2;
  options.ns.head_dim = 8;
  options.ns.page_size = 4;
  options.ns.dtype = radixkv::DType::kFloat16;

  absl::StatusOr<std::unique_ptr<radixkv::Client>> client =
      radixkv::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "create: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<uint32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<radixkv::BlockKey> keys = (*client)->ComputeKeys(prompt);
  absl::StatusOr<radixkv::Lease> lease = (*client)->Acquire(prompt);
  if (!lease.ok() || !lease->degraded() || !lease->pages().empty() ||
      keys.size() != 2 || lease->total_blocks() != 2) {
    std::fprintf(stderr, "unexpected result\n");
    return 1;
  }
  absl::Status s = radixkv::FromGrpcStatus(
      grpc::Status(grpc::StatusCode::NOT_FOUND, "x"));
  if (s.code() != absl::StatusCode::kNotFound) return 1;
  std::printf("ok root=%s key0=%s\n", (*client)->namespace_root().ToHex().c_str(),
              keys[0].ToHex().c_str());
  return 0;
}
