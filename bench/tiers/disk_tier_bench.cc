// disk_tier_bench: demotion (Put until Flush) and promotion (Take) throughput
// of DiskTier on a directory, in runs of --blocks blocks of --page_bytes, the
// way the daemon moves a prompt's evicted blocks and later promotes them.
//
//   disk_tier_bench --dir=/var/tmp --blocks=32 --page_bytes=262144 --runs=32
//
// Prints one line per phase, or one JSON object with --json. The tier file
// is removed at the end.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/tiers/disk_tier.h"
#include "daemon/tiers/disk_tier_io.h"

ABSL_FLAG(std::string, dir, "", "directory for the tier file (required)");
ABSL_FLAG(uint64_t, page_bytes, 256 << 10, "bytes per block");
ABSL_FLAG(uint64_t, blocks, 32, "blocks per run (one Take per run)");
ABSL_FLAG(uint64_t, runs, 32, "runs");
ABSL_FLAG(int, io_threads, 2, "DiskTierOptions::io_threads");
ABSL_FLAG(bool, direct_io, true, "DiskTierOptions::direct_io");
ABSL_FLAG(uint64_t, max_pending_bytes, 64 << 20, "DiskTierOptions::max_pending_bytes");
ABSL_FLAG(bool, json, false, "print one JSON object");

namespace radixkv::daemon {
namespace {

BlockKey Key(uint64_t run, uint64_t i) { return BlockKey{run + 1, i + 1}; }

double Gbps(uint64_t bytes, absl::Duration d) {
  return static_cast<double>(bytes) / absl::ToDoubleSeconds(d) / 1e9;
}

// Puts `runs` runs of `blocks` blocks from `src` and flushes; a refused
// Put (staging full) is retried after 50 us and counted in *refused.
absl::Duration Demote(DiskTier& t, const char* src, uint64_t stride,
                      uint64_t blocks, uint64_t runs, uint64_t* refused) {
  absl::Time start = absl::Now();
  for (uint64_t r = 0; r < runs; ++r) {
    for (uint64_t i = 0; i < blocks; ++i) {
      TierBlock b{Key(r, i), i == 0 ? BlockKey{r + 1, 0} : Key(r, i - 1),
                  BlockKey{r + 1, 0}, static_cast<uint32_t>(i)};
      while (!t.Put(b, src + i * stride)) {
        ++*refused;
        absl::SleepFor(absl::Microseconds(50));
      }
    }
  }
  t.Flush();
  return absl::Now() - start;
}

// Takes each run with one Take into aligned pages; per-Take milliseconds
// go to *run_ms.
absl::Duration Promote(DiskTier& t, uint64_t stride, uint64_t blocks,
                       uint64_t runs, uint64_t* taken,
                       std::vector<double>* run_ms) {
  disk_tier::AlignedBuffer dst_buf = disk_tier::AllocateAligned(blocks * stride);
  std::vector<void*> dst(blocks);
  for (uint64_t i = 0; i < blocks; ++i) dst[i] = dst_buf.get() + i * stride;
  std::vector<BlockKey> keys(blocks);
  absl::Time start = absl::Now();
  for (uint64_t r = 0; r < runs; ++r) {
    for (uint64_t i = 0; i < blocks; ++i) keys[i] = Key(r, i);
    absl::Time t0 = absl::Now();
    *taken += t.Take(keys, dst);
    run_ms->push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  return absl::Now() - start;
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const uint64_t page = absl::GetFlag(FLAGS_page_bytes);
  const uint64_t blocks = absl::GetFlag(FLAGS_blocks);
  const uint64_t runs = absl::GetFlag(FLAGS_runs);
  if (dir.empty() || page == 0 || blocks == 0 || runs == 0) {
    std::fprintf(stderr, "disk_tier_bench: --dir, --page_bytes, --blocks and --runs are required\n");
    return 2;
  }
  DiskTierOptions o;
  o.path = dir;
  o.page_bytes = page;
  o.io_threads = absl::GetFlag(FLAGS_io_threads);
  o.direct_io = absl::GetFlag(FLAGS_direct_io);
  o.max_pending_bytes = absl::GetFlag(FLAGS_max_pending_bytes);
  const uint64_t stride = (page + 4095) / 4096 * 4096;
  const uint64_t slots = blocks * runs;
  o.bytes = disk_tier::kSuperblockBytes + (slots * 128 + 4095) / 4096 * 4096 +
            slots * stride;
  auto tier = DiskTier::Open(o);
  if (!tier.ok()) {
    std::fprintf(stderr, "disk_tier_bench: %s\n", tier.status().ToString().c_str());
    return 1;
  }
  DiskTier& t = **tier;
  const std::string file = t.file_path();

  // Sources: one run's pages (random bytes), reused under new keys.
  disk_tier::AlignedBuffer src = disk_tier::AllocateAligned(blocks * stride);
  std::mt19937_64 rng(1);
  for (uint64_t i = 0; i < blocks * stride / 8; ++i) {
    uint64_t v = rng();
    std::memcpy(src.get() + i * 8, &v, 8);
  }
  uint64_t refused = 0;
  absl::Duration demote = Demote(t, src.get(), stride, blocks, runs, &refused);
  std::vector<double> run_ms;
  uint64_t taken = 0;
  absl::Duration promote = Promote(t, stride, blocks, runs, &taken, &run_ms);
  std::sort(run_ms.begin(), run_ms.end());
  DiskTierStats s = t.stats();
  const uint64_t total = blocks * runs * page;
  double demote_gbps = Gbps(total, demote);
  double promote_gbps = Gbps(taken * page, promote);
  double p50 = run_ms[run_ms.size() / 2];
  double p99 = run_ms[std::min(run_ms.size() - 1, run_ms.size() * 99 / 100)];
  tier->reset();
  unlink(file.c_str());
  if (taken != blocks * runs || s.checksum_failures != 0) {
    std::fprintf(stderr, "disk_tier_bench: took %llu of %llu blocks (%llu checksum failures)\n",
                 static_cast<unsigned long long>(taken),
                 static_cast<unsigned long long>(blocks * runs),
                 static_cast<unsigned long long>(s.checksum_failures));
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", absl::StrFormat(
        "{\"dir\":\"%s\",\"page_bytes\":%d,\"blocks\":%d,\"runs\":%d,"
        "\"io_threads\":%d,\"direct_io\":%s,\"demotion_gbps\":%.3f,"
        "\"promotion_gbps\":%.3f,\"take_ms_p50\":%.3f,\"take_ms_p99\":%.3f,"
        "\"put_refused\":%d}",
        dir, page, blocks, runs, o.io_threads, s.direct_io ? "true" : "false",
        demote_gbps, promote_gbps, p50, p99, refused).c_str());
  } else {
    std::printf("%s\n", absl::StrFormat(
        "disk tier on %s (%s, %d io threads): %d runs x %d blocks x %d B\n"
        "  demotion (Put..Flush): %.3f GB/s (%d Puts refused, retried)\n"
        "  promotion (Take):      %.3f GB/s, per Take p50 %.3f ms, p99 %.3f ms",
        dir, s.direct_io ? "O_DIRECT" : "buffered", o.io_threads, runs, blocks,
        page, demote_gbps, refused, promote_gbps, p50, p99).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace radixkv::daemon

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Measures DiskTier demotion and promotion throughput on --dir.");
  absl::ParseCommandLine(argc, argv);
  return radixkv::daemon::Main();
}
