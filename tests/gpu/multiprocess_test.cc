// Multi-process page sharing through a live radixkvd (host pool): writer and
// reader processes, a writer killed while WRITING, and the daemon killed
// while a worker has the pool mapped. The daemon and the workers
// (mp_worker.cc) are separate processes started with posix_spawn.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

extern char** environ;

namespace {

// A child process with its stdin and stdout connected to pipes.
class Child {
 public:
  Child(const std::string& exe, const std::vector<std::string>& args) {
    int in[2], out[2];
    EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<std::string> all = {exe};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(
        ::posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv.data(), environ),
        0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = ::fdopen(out[0], "r");
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ != nullptr) std::fclose(stdout_);
  }

  // The next stdout line without its newline; "" at EOF.
  std::string ReadLine() {
    char buf[4096];
    if (std::fgets(buf, sizeof(buf), stdout_) == nullptr) return "";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void WriteLine(const std::string& s) {
    std::string line = s + "\n";
    EXPECT_EQ(::write(stdin_, line.data(), line.size()),
              static_cast<ssize_t>(line.size()));
  }
  void Kill() { ::kill(pid_, SIGKILL); }
  // Exit code, or 128 + signal.
  int Wait() {
    int status = 0;
    EXPECT_EQ(::waitpid(pid_, &status, 0), pid_);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  FILE* stdout_ = nullptr;
};

struct Acquired {
  std::vector<uint64_t> pages;
  int matched = -1;
  int fresh = -1;
};

// Parses "pages=1,2 matched=M new=N".
Acquired ParsePages(const std::string& line) {
  Acquired a;
  for (absl::string_view field : absl::StrSplit(line, ' ')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(field, '=');
    if (kv.first == "pages") {
      for (absl::string_view p :
           absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
        a.pages.push_back(std::stoull(std::string(p)));
      }
    } else if (kv.first == "matched") {
      a.matched = std::stoi(kv.second);
    } else if (kv.first == "new") {
      a.fresh = std::stoi(kv.second);
    }
  }
  return a;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat("/tmp/rkv-mp-", ::getpid(), ".sock");
    ::unlink(socket_.c_str());  // left behind by a daemon killed earlier
    daemon_ = std::make_unique<Child>(
        RADIXKVD,
        std::vector<std::string>{"--socket=" + socket_,
                                 "--metrics_listen=", "--pool=host,bytes=1MiB",
                                 "--log_level=warning"});
    // Create the channel once the socket exists, so it does not start in
    // connect backoff; ready when GetStats answers (60 s on a loaded machine).
    struct stat st;
    for (int i = 0; i < 600 && ::stat(socket_.c_str(), &st) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    admin_ = radixkv::v1::Admin::NewStub(grpc::CreateChannel(
        "unix:" + socket_, grpc::InsecureChannelCredentials()));
    for (int i = 0; i < 600; ++i) {
      if (Stats(nullptr)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "radixkvd did not answer on " << socket_;
  }

  void TearDown() override {
    daemon_.reset();  // SIGKILL: nothing removes the sockets
    ::unlink(socket_.c_str());
    ::unlink(absl::StrCat("/tmp/rkv-mp-", ::getpid(), ".attach.sock").c_str());
  }

  bool Stats(radixkv::v1::Stats* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    radixkv::v1::GetStatsResponse resp;
    grpc::Status st = admin_->GetStats(&ctx, {}, &resp);
    if (st.ok() && out != nullptr) *out = resp.stats();
    return st.ok();
  }

  Child Worker(const std::vector<std::string>& args) {
    return Child(MP_WORKER, args);
  }

  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<radixkv::v1::Admin::Stub> admin_;
};

TEST_F(MultiProcessTest, ReaderSeesExactlyTheWritersBytes) {
  Child a = Worker({"write", socket_, "7", "5"});
  Acquired wrote = ParsePages(a.ReadLine());
  EXPECT_EQ(a.ReadLine(), "inserted=5");
  ASSERT_EQ(a.Wait(), 0);
  EXPECT_EQ(wrote.matched, 0);
  EXPECT_EQ(wrote.fresh, 5);
  ASSERT_EQ(wrote.pages.size(), 5u);

  // Process B: same prefix, same pages, and the bytes check out (exit 0).
  Child b = Worker({"read", socket_, "7", "5"});
  Acquired read = ParsePages(b.ReadLine());
  EXPECT_EQ(b.Wait(), 0);
  EXPECT_EQ(read.matched, 5);
  EXPECT_EQ(read.pages, wrote.pages);

  radixkv::v1::Stats s;
  ASSERT_TRUE(Stats(&s));
  EXPECT_EQ(s.cached_pages(), 5u);
  EXPECT_EQ(s.writing_pages(), 0u);
}

TEST_F(MultiProcessTest, WriterKilledWhileWritingLeaksNothingAndIsNeverServed) {
  radixkv::v1::Stats before;
  ASSERT_TRUE(Stats(&before));
  {
    Child w = Worker({"write", socket_, "9", "3", "hang"});
    Acquired got = ParsePages(w.ReadLine());
    EXPECT_EQ(got.fresh, 3);
    ASSERT_EQ(w.ReadLine(), "writing");
    radixkv::v1::Stats during;
    ASSERT_TRUE(Stats(&during));
    EXPECT_EQ(during.writing_pages(), 3u);
    w.Kill();
    EXPECT_EQ(w.Wait(), 128 + SIGKILL);
  }
  // The session ends with the killed process; its pages go back to free.
  radixkv::v1::Stats after;
  for (int i = 0; i < 600; ++i) {
    ASSERT_TRUE(Stats(&after));
    if (after.writing_pages() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(after.writing_pages(), 0u);
  EXPECT_EQ(after.cached_pages(), 0u);
  EXPECT_EQ(after.free_pages(), after.capacity_pages());
  EXPECT_TRUE(after.invariants_ok());

  // A later reader of the same prompt is never handed those pages as cached.
  Child r = Worker({"read", socket_, "9", "3"});
  Acquired read = ParsePages(r.ReadLine());
  EXPECT_EQ(r.Wait(), 0);
  EXPECT_EQ(read.matched, 0);
}

TEST_F(MultiProcessTest, DaemonKilledWhileMappedLeavesPagesReadable) {
  Child a = Worker({"write", socket_, "11", "4"});
  ParsePages(a.ReadLine());
  ASSERT_EQ(a.Wait(), 0);

  Child h = Worker({"hold", socket_, "11", "4"});
  Acquired held = ParsePages(h.ReadLine());
  EXPECT_EQ(held.matched, 4);
  ASSERT_EQ(h.ReadLine(), "ready");
  daemon_->Kill();
  EXPECT_EQ(daemon_->Wait(), 128 + SIGKILL);
  daemon_.reset();
  h.WriteLine("go");
  // The worker re-checks every page through its mapping, then its next RPC
  // reports UNAVAILABLE (exit 0) rather than crashing.
  EXPECT_EQ(h.ReadLine(),
            absl::StrCat("after_daemon_exit code=",
                         static_cast<int>(grpc::StatusCode::UNAVAILABLE)));
  EXPECT_EQ(h.Wait(), 0);
}

}  // namespace
