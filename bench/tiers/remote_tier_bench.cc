// remote_tier_bench: the shared tier's write (Put until Flush) and read
// (TakeIn) throughput against a Redis Cluster, in runs of --blocks blocks
// of --page_bytes, the way the daemon demotes a prompt's evicted blocks
// and promotes them on another node. remote_compare.sh sets it beside
// redis-benchmark's SET and GET of values of the same size.
//
//   remote_tier_bench --addr=127.0.0.1:7001 --password_file=F --blocks=32
//       --runs=256 --page_bytes=4096 [--json]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/tiers/page_mover.h"
#include "daemon/tiers/remote_tier.h"
#include "gpu/pool.h"

ABSL_FLAG(std::string, addr, "", "a node of the store, HOST:PORT (required)");
ABSL_FLAG(std::string, password_file, "", "AUTH password file");
ABSL_FLAG(uint64_t, page_bytes, 4096, "bytes per block");
ABSL_FLAG(uint64_t, blocks, 32, "blocks per run (one Put and one TakeIn)");
ABSL_FLAG(uint64_t, runs, 256, "runs");
ABSL_FLAG(int, writers, 2, "RemoteTierOptions::writers");
ABSL_FLAG(bool, json, false, "print one JSON object");

namespace radixkv::daemon {
namespace {

class NoSink final : public TierSink {
 public:
  bool empty() const override { return true; }
  void Put(absl::Span<const TierPut>, std::vector<TierMove>*) override {}
};

int Main() {
  const uint64_t pb = absl::GetFlag(FLAGS_page_bytes);
  const uint64_t n = absl::GetFlag(FLAGS_blocks);
  const uint64_t runs = absl::GetFlag(FLAGS_runs);
  auto addr = ParseRedisEndpoint(absl::GetFlag(FLAGS_addr));
  if (!addr.ok() || n == 0 || runs == 0 || pb == 0) {
    std::fprintf(stderr, "--addr=HOST:PORT, --blocks, --runs, --page_bytes > 0\n");
    return 2;
  }
  std::string password;
  if (!absl::GetFlag(FLAGS_password_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_password_file));
    std::getline(in, password);
  }
  gpu::PoolSpec spec;
  spec.backend = gpu::Backend::kHost;
  spec.bytes = 2 * n * pb;
  auto pool = gpu::CreatePagePool(spec, pb);
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 1;
  }
  for (uint64_t p = 0; p < 2 * n; ++p) {
    std::memset((*pool)->host_page_address(p), static_cast<int>(p), pb);
  }
  auto mover = PageMover::Create(pool->get());
  if (!mover.ok()) return 1;
  const std::string prefix = absl::StrCat("bench", absl::ToUnixNanos(absl::Now()));
  auto tier = RemoteTier::Open({.seeds = {*addr},
                                .auth = {.password = password},
                                .prefix = prefix,
                                .page_bytes = pb,
                                .timeout = absl::Seconds(5),
                                .queue_bytes = 1ull << 30,
                                .writers = absl::GetFlag(FLAGS_writers)});
  if (!tier.ok()) {
    std::fprintf(stderr, "%s\n", tier.status().ToString().c_str());
    return 1;
  }
  const BlockKey root{7, 7};
  NoSink none;
  std::vector<TierMove> moves;
  const absl::Time w0 = absl::Now();
  for (uint64_t r = 0; r < runs; ++r) {
    std::vector<TierPut> puts;
    for (uint64_t i = 0; i < n; ++i) {
      puts.push_back({.block = {.key = BlockKey{r + 1, i + 1}, .root = root},
                      .page = i});
    }
    (*tier)->Put(puts, **mover, none, &moves);
  }
  (*tier)->Flush();
  const absl::Duration write = absl::Now() - w0;
  const TierStats ws = (*tier)->stats();
  std::vector<uint64_t> pages(n);
  for (uint64_t i = 0; i < n; ++i) pages[i] = n + i;
  uint64_t got = 0;
  const absl::Time r0 = absl::Now();
  for (uint64_t r = 0; r < runs; ++r) {
    std::vector<BlockKey> keys;
    for (uint64_t i = 0; i < n; ++i) keys.push_back(BlockKey{r + 1, i + 1});
    got += (*tier)->TakeIn(root, keys, pages, **mover, &moves);
  }
  const absl::Duration read = absl::Now() - r0;
  const double blocks = static_cast<double>(runs * n);
  const double wps = ws.demotions / absl::ToDoubleSeconds(write);
  const double rps = got / absl::ToDoubleSeconds(read);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"page_bytes\": %llu, \"blocks\": %.0f, \"written\": %llu, "
        "\"read\": %llu, \"write_blocks_per_s\": %.0f, "
        "\"read_blocks_per_s\": %.0f}\n",
        static_cast<unsigned long long>(pb), blocks,
        static_cast<unsigned long long>(ws.demotions),
        static_cast<unsigned long long>(got), wps, rps);
  } else {
    std::printf("write: %llu of %.0f blocks of %llu bytes, %.0f blocks/s\n",
                static_cast<unsigned long long>(ws.demotions), blocks,
                static_cast<unsigned long long>(pb), wps);
    std::printf("read:  %llu blocks, %.0f blocks/s\n",
                static_cast<unsigned long long>(got), rps);
  }
  return ws.demotions == runs * n && got == runs * n ? 0 : 1;
}

}  // namespace
}  // namespace radixkv::daemon

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("remote tier write and read throughput");
  absl::ParseCommandLine(argc, argv);
  return radixkv::daemon::Main();
}
