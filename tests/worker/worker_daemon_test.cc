// Two radixkv-worker processes through a live radixkvd: the first fills the
// cache, the second (another process) hits it and generates exactly the
// tokens of a run with no cache. Also: with no daemon reachable the worker
// still answers, with full prefills; and blocks of one --kv-dtype never
// serve another.
//
// The binaries come from the build (RADIXKVD_PATH, RADIXKV_WORKER_PATH).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

extern char** environ;

namespace {

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout+stderr
};

Child Spawn(const std::vector<std::string>& argv) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Child c;
  EXPECT_EQ(posix_spawn(&c.pid, args[0], &fa, nullptr, args.data(), environ), 0)
      << argv[0];
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  c.out = fds[0];
  return c;
}

// Reads until EOF; returns the output and the exit status.
std::string RunToEnd(const std::vector<std::string>& argv, int* status) {
  Child c = Spawn(argv);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(c.out, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(c.out);
  waitpid(c.pid, status, 0);
  return out;
}

struct PromptResult {
  uint32_t matched = 0;
  std::string cache;
  std::string generated;  // the JSON array text
};

// Parses the worker's --json lines.
std::vector<PromptResult> Parse(const std::string& out) {
  std::vector<PromptResult> r;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (line.rfind("{\"prompt\"", 0) != 0) continue;
    PromptResult p;
    auto field = [&](absl::string_view key) -> absl::string_view {
      const size_t at = line.find(absl::StrCat("\"", key, "\":"));
      if (at == absl::string_view::npos) return "";
      absl::string_view rest = line.substr(at + key.size() + 3);
      const size_t end = rest.front() == '['   ? rest.find(']') + 1
                         : rest.front() == '"' ? rest.find('"', 1) + 1
                                               : rest.find_first_of(",}");
      return rest.substr(0, end);
    };
    EXPECT_TRUE(absl::SimpleAtoi(field("matched_tokens"), &p.matched)) << line;
    p.cache = std::string(field("cache"));
    p.generated = std::string(field("generated"));
    r.push_back(p);
  }
  return r;
}

class WorkerDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat("/tmp/rkwt", getpid());
    mkdir(dir_.c_str(), 0700);
    socket_ = dir_ + "/d.sock";
    prompts_ = dir_ + "/prompts.txt";
    std::mt19937 rng(42);
    std::vector<uint32_t> base(300);
    for (uint32_t& t : base) t = rng() % 512;
    std::ofstream f(prompts_);
    f << absl::StrJoin(base, " ") << "\n";
    std::vector<uint32_t> other(base.begin(), base.begin() + 200);
    for (int i = 0; i < 45; ++i) other.push_back(rng() % 512);
    f << absl::StrJoin(other, ",") << "\n";
  }
  void TearDown() override {
    StopDaemon();
    unlink(prompts_.c_str());
    rmdir(dir_.c_str());
  }

  void StartDaemon() {
    daemon_ = Spawn({RADIXKVD_PATH, "--socket=" + socket_, "--metrics_listen=",
                     "--pool=host,bytes=64MiB"});
    // Wait (bounded) for its "ready" line.
    std::string seen;
    char buf[1024];
    while (seen.find("ready") == std::string::npos) {
      pollfd p{daemon_.out, POLLIN, 0};
      ASSERT_GT(poll(&p, 1, 60000), 0) << "radixkvd not ready: " << seen;
      const ssize_t n = read(daemon_.out, buf, sizeof(buf));
      ASSERT_GT(n, 0) << "radixkvd exited: " << seen;
      seen.append(buf, n);
    }
  }
  void StopDaemon() {
    if (daemon_.pid <= 0) return;
    kill(daemon_.pid, SIGTERM);
    int status;
    waitpid(daemon_.pid, &status, 0);
    close(daemon_.out);
    daemon_.pid = -1;
  }

  std::vector<PromptResult> Worker(std::vector<std::string> extra) {
    std::vector<std::string> argv = {RADIXKV_WORKER_PATH, "run",
                                     "--prompts=" + prompts_, "--decode=12",
                                     "--json"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    int status = -1;
    const std::string out = RunToEnd(argv, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    auto r = Parse(out);
    EXPECT_EQ(r.size(), 2u) << out;
    return r;
  }

  std::string dir_, socket_, prompts_;
  Child daemon_;
};

TEST_F(WorkerDaemonTest, SecondProcessHitsTheCacheAndMatchesANoCacheRun) {
  const auto baseline = Worker({"--no-cache"});
  ASSERT_EQ(baseline.size(), 2u);
  EXPECT_EQ(baseline[0].matched, 0u);
  StartDaemon();
  const auto first = Worker({"--endpoint=" + socket_, "--timeout=20s"});
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].cache, "\"daemon\"");
  EXPECT_EQ(first[0].matched, 0u);
  // The second prompt shares 200 tokens (12 full blocks) with the first.
  EXPECT_EQ(first[1].matched, 192u);
  const auto second = Worker({"--endpoint=" + socket_, "--timeout=20s"});
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].matched, 288u);  // 18 full blocks of 300 tokens
  EXPECT_EQ(second[1].matched, 240u);  // 15 full blocks of 245 tokens
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(first[i].generated, baseline[i].generated) << i;
    EXPECT_EQ(second[i].generated, baseline[i].generated) << i;
  }
  // A guard against a vacuous comparison: real, varied output.
  EXPECT_NE(baseline[0].generated, baseline[1].generated);
}

TEST_F(WorkerDaemonTest, WithoutADaemonTheWorkerPrefillsEverything) {
  const auto baseline = Worker({"--no-cache"});
  const auto r = Worker({"--endpoint=" + dir_ + "/absent.sock", "--timeout=300ms"});
  ASSERT_EQ(r.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r[i].matched, 0u);
    EXPECT_EQ(r[i].cache, "\"degraded\"");
    EXPECT_EQ(r[i].generated, baseline[i].generated);
  }
}

// A namespace's page dtype is part of its identity: blocks committed by a
// worker of one --kv-dtype never serve a worker of another, even when their
// pages have the same size (fp16 and bf16); a daemon bound to fp16 pages
// answers an fp8 worker with misses (its namespace cannot bind), and the
// fp16 blocks keep serving fp16 workers.
TEST_F(WorkerDaemonTest, HalfPrecisionBlocksServeOnlyTheirOwnDtype) {
  StartDaemon();
  const std::string endpoint = "--endpoint=" + socket_;
  const auto fp16 = Worker({endpoint, "--timeout=20s", "--kv-dtype=fp16"});
  ASSERT_EQ(fp16.size(), 2u);
  EXPECT_EQ(fp16[0].cache, "\"daemon\"");
  EXPECT_EQ(fp16[1].matched, 192u);
  const auto bf16 = Worker({endpoint, "--timeout=20s", "--kv-dtype=bf16"});
  ASSERT_EQ(bf16.size(), 2u);
  EXPECT_EQ(bf16[0].cache, "\"daemon\"");
  EXPECT_EQ(bf16[0].matched, 0u);    // the fp16 blocks are not bf16's
  EXPECT_EQ(bf16[1].matched, 192u);  // its own first prompt's blocks
  const auto fp8 = Worker({endpoint, "--timeout=2s", "--kv-dtype=fp8_e4m3"});
  ASSERT_EQ(fp8.size(), 2u);
  EXPECT_EQ(fp8[0].matched, 0u);
  EXPECT_EQ(fp8[1].matched, 0u);
  const auto again = Worker({endpoint, "--timeout=20s", "--kv-dtype=fp16"});
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].matched, 288u);
  EXPECT_EQ(again[1].matched, 240u);
}

// An fp8 prefix never serves a request of another dtype: not int8 or fp8
// E5M2 (the same page size, scale area included), not fp16 (another page
// size); it keeps serving fp8 E4M3 requests.
TEST_F(WorkerDaemonTest, Fp8BlocksNeverServeAnotherDtype) {
  StartDaemon();
  const std::string endpoint = "--endpoint=" + socket_;
  const auto e4m3 = Worker({endpoint, "--timeout=20s", "--kv-dtype=fp8_e4m3"});
  ASSERT_EQ(e4m3.size(), 2u);
  if (e4m3[0].cache == "\"degraded\"") {
    GTEST_SKIP() << "radixkvd sized its pool's pages without the fp8 scale "
                    "area (NamespacePageBytes, docs/CONTRACTS.md §2.1)";
  }
  EXPECT_EQ(e4m3[1].matched, 192u);
  for (const char* other : {"fp8_e5m2", "int8", "fp16"}) {
    const auto r = Worker({endpoint, "--timeout=5s",
                           absl::StrCat("--kv-dtype=", other)});
    ASSERT_EQ(r.size(), 2u) << other;
    EXPECT_EQ(r[0].matched, 0u) << other;
  }
  const auto again = Worker({endpoint, "--timeout=20s", "--kv-dtype=fp8_e4m3"});
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].matched, 288u);
  EXPECT_EQ(again[1].matched, 240u);
}

}  // namespace
