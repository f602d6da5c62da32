// radixkvd as a child process: start-up output, serving, SIGTERM -> exit 0
// with its socket removed, stale, live and replaced sockets, start-up errors
// (one line naming the flag, exit 1 or 2), and a worker killed with SIGKILL
// mid-write.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "radixkv/defaults.h"
#include "tests/daemon/test_util.h"

#ifndef RADIXKVD_PATH
#error "RADIXKVD_PATH must name the radixkvd binary"
#endif
#ifndef LEASE_HOLDER_PATH
#error "LEASE_HOLDER_PATH must name the lease_holder binary"
#endif

namespace radixkv::testing {
namespace {

// A child process with its stdout (and optionally stderr) on a pipe.
class Child {
 public:
  Child(const std::string& path, const std::vector<std::string>& args) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(path.c_str()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(path.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads output until `needle` appears, EOF, or `seconds` pass.
  bool WaitForOutput(const std::string& needle, int seconds = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!absl::StrContains(output_, needle)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[1024];
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) return absl::StrContains(output_, needle);
      output_.append(buf, n);
    }
    return true;
  }

  // Reads what is left of the output (the writer has exited).
  void DrainOutput() {
    char buf[1024];
    pollfd p{fd_, POLLIN, 0};
    while (poll(&p, 1, 5000) > 0) {
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) return;
      output_.append(buf, n);
    }
  }

  // Waits for exit; returns the exit status or -1 on timeout / signal.
  int Wait(int seconds = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        DrainOutput();
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string output_;
};

std::vector<std::string> DaemonArgs(const std::string& socket,
                                    const std::string& pool = "none,pages=32") {
  return {"--socket=" + socket, "--metrics_listen=", "--pool=" + pool,
          "--keepalive_time=1s", "--keepalive_timeout=2s", "--shutdown_grace=5s"};
}

v1::Stats GetStats(v1::Admin::Stub* admin) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::GetStatsResponse resp;
  grpc::Status s = admin->GetStats(&ctx, v1::GetStatsRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.stats();
}

TEST(DaemonProcessTest, StartsPrintsServesAndExitsOnSigterm) {
  const std::string socket = TempSocketPath("proc");
  std::vector<std::string> args = DaemonArgs(socket);
  args[1] = "--metrics_listen=127.0.0.1:0";
  Child daemon(RADIXKVD_PATH, args);
  ASSERT_TRUE(daemon.WaitForOutput("radixkvd: ready")) << daemon.output();
  EXPECT_TRUE(absl::StrContains(daemon.output(), "gRPC on unix:" + socket));
  EXPECT_TRUE(absl::StrContains(daemon.output(), "metrics http://127.0.0.1:"));
  struct stat st;
  ASSERT_EQ(stat(socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  auto channel = grpc::CreateChannel(UnixTarget(socket), grpc::InsecureChannelCredentials());
  auto kv = v1::KvCache::NewStub(channel);
  auto admin = v1::Admin::NewStub(channel);
  {
    SessionStream session(kv.get(), TestNamespace());
    ASSERT_TRUE(session.ok()) << session.status().error_message();
    EXPECT_EQ(GetStats(admin.get()).sessions(), 1u);
    EXPECT_EQ(GetStats(admin.get()).capacity_pages(), 32u);
    // The session is still open when SIGTERM arrives: the daemon ends it.
    ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.output();
  }
  // The socket file it created is gone.
  EXPECT_NE(lstat(socket.c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT) << socket;
}

// Binds a Unix socket file at `path` (nobody accepts on it).
void BindSocketFile(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
}

// On SIGTERM radixkvd removes only the socket file it bound: a file that
// replaced it at the path (another daemon's) stays.
TEST(DaemonProcessTest, SocketReplacedWhileServingIsLeftInPlace) {
  const std::string socket = TempSocketPath("replaced");
  Child daemon(RADIXKVD_PATH, DaemonArgs(socket));
  ASSERT_TRUE(daemon.WaitForOutput("radixkvd: ready")) << daemon.output();
  struct stat before;
  ASSERT_EQ(lstat(socket.c_str(), &before), 0);
  ASSERT_EQ(unlink(socket.c_str()), 0);
  BindSocketFile(socket);
  struct stat replaced;
  ASSERT_EQ(lstat(socket.c_str(), &replaced), 0);
  ASSERT_NE(replaced.st_ino, before.st_ino);
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  EXPECT_EQ(daemon.Wait(), 0) << daemon.output();
  struct stat after;
  ASSERT_EQ(lstat(socket.c_str(), &after), 0) << "the replacement was removed";
  EXPECT_EQ(after.st_ino, replaced.st_ino);
  unlink(socket.c_str());
}

TEST(DaemonProcessTest, StaleSocketFileIsReplaced) {
  const std::string socket = TempSocketPath("stale");
  BindSocketFile(socket);  // a socket file nobody listens on
  Child daemon(RADIXKVD_PATH, DaemonArgs(socket));
  ASSERT_TRUE(daemon.WaitForOutput("radixkvd: ready")) << daemon.output();
  auto admin = v1::Admin::NewStub(
      grpc::CreateChannel(UnixTarget(socket), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(GetStats(admin.get()).sessions(), 0u);
  kill(daemon.pid(), SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0) << daemon.output();
}

TEST(DaemonProcessTest, SecondDaemonOnTheSameSocketIsRefused) {
  const std::string socket = TempSocketPath("twice");
  Child first(RADIXKVD_PATH, DaemonArgs(socket));
  ASSERT_TRUE(first.WaitForOutput("radixkvd: ready")) << first.output();
  Child second(RADIXKVD_PATH, DaemonArgs(socket));
  EXPECT_EQ(second.Wait(), 1) << second.output();
  EXPECT_TRUE(absl::StrContains(second.output(), "already listening"))
      << second.output();
  // The first one is unharmed.
  auto admin = v1::Admin::NewStub(
      grpc::CreateChannel(UnixTarget(socket), grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(GetStats(admin.get()).invariants_ok());
  kill(first.pid(), SIGTERM);
  EXPECT_EQ(first.Wait(), 0) << first.output();
}

TEST(DaemonProcessTest, OutOfRangeMallocTrimThresholdIsRefused) {
  std::vector<std::string> args = DaemonArgs(TempSocketPath("trim"));
  args.push_back("--malloc_trim_threshold=4294967296");
  Child bad(RADIXKVD_PATH, args);
  EXPECT_EQ(bad.Wait(), 2) << bad.output();
  EXPECT_TRUE(absl::StrContains(bad.output(),
                                "--malloc_trim_threshold=4294967296 exceeds"))
      << bad.output();
}

// --help lists radixkvd's own flags and exits 0; --version names the release;
// a stray positional argument is refused (exit 2) instead of ignored.
TEST(DaemonProcessTest, HelpVersionAndStrayArguments) {
  Child help(RADIXKVD_PATH, {"--help"});
  EXPECT_EQ(help.Wait(), 0) << help.output();
  for (const char* flag : {"--pool", "--socket", "--max_pool_pages",
                           "--lease_ttl"}) {
    EXPECT_TRUE(absl::StrContains(help.output(), flag))
        << flag << " missing from:\n" << help.output();
  }
  EXPECT_FALSE(absl::StrContains(help.output(), "No flags matched"));
  // Only radixkvd's flags, and no path of the machine it was built on.
  EXPECT_FALSE(absl::StrContains(help.output(), "main.cc")) << help.output();
  EXPECT_FALSE(absl::StrContains(help.output(), "--helpfull ("))
      << help.output();
  Child version(RADIXKVD_PATH, {"--version"});
  EXPECT_EQ(version.Wait(), 0) << version.output();
  EXPECT_TRUE(absl::StrContains(version.output(), "radixkvd 0."))
      << version.output();
  std::vector<std::string> args = DaemonArgs(TempSocketPath("stray"));
  args.push_back("stray");
  Child stray(RADIXKVD_PATH, args);
  EXPECT_EQ(stray.Wait(), 2) << stray.output();
  EXPECT_TRUE(absl::StrContains(stray.output(), "unexpected argument 'stray'"))
      << stray.output();
}

// Configuration errors exit 2 with one line, so a supervisor does not
// restart into the same error: a misspelt flag, a value that does not
// parse, and a pool this machine cannot serve (here: --pool=cuda where no CUDA device is usable).
TEST(DaemonProcessTest, ConfigurationErrorsExitTwo) {
  std::vector<std::string> args = DaemonArgs(TempSocketPath("typo"));
  args.push_back("--pol=host,bytes=1GiB");
  Child typo(RADIXKVD_PATH, args);
  EXPECT_EQ(typo.Wait(), 2) << typo.output();
  EXPECT_TRUE(absl::StrContains(typo.output(), "unknown flag '--pol="))
      << typo.output();
  std::vector<std::string> bad_value = DaemonArgs(TempSocketPath("value"));
  bad_value.push_back("--lease_ttl=soon");
  Child value(RADIXKVD_PATH, bad_value);
  EXPECT_EQ(value.Wait(), 2) << value.output();
  EXPECT_TRUE(absl::StrContains(value.output(), "--lease_ttl")) << value.output();

  Child cuda(RADIXKVD_PATH, DaemonArgs(TempSocketPath("cuda"),
                                       "cuda,device=0,bytes=256MiB"));
  if (cuda.WaitForOutput("radixkvd: ready", 10)) {
    GTEST_SKIP() << "a CUDA device is usable here: the cuda pool serves";
  }
  EXPECT_EQ(cuda.Wait(), 2) << cuda.output();
  EXPECT_TRUE(absl::StrContains(cuda.output(), "cannot be served here"))
      << cuda.output();
  EXPECT_FALSE(absl::StrContains(cuda.output(), "ready")) << cuda.output();
}

// A --pool that does not parse is one line naming the flag once, with its
// value and the forms it accepts; exit 2.
TEST(DaemonProcessTest, BadPoolNamesTheFlagOnceAndTheAcceptedForms) {
  Child bad(RADIXKVD_PATH, DaemonArgs(TempSocketPath("pool"), "foo"));
  EXPECT_EQ(bad.Wait(), 2) << bad.output();
  const std::string& out = bad.output();
  EXPECT_TRUE(absl::StrContains(
      out, "radixkvd: --pool=foo: unknown backend 'foo'; accepted forms: "
           "host,bytes=SIZE | cuda,device=N,bytes=SIZE | none,pages=N"))
      << out;
  size_t flags = 0;
  for (size_t at = out.find("--pool"); at != std::string::npos;
       at = out.find("--pool", at + 1)) {
    ++flags;
  }
  EXPECT_EQ(flags, 1u) << out;
  EXPECT_FALSE(absl::StrContains(out, "INVALID_ARGUMENT")) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

// A metrics port another process holds is a runtime failure (exit 1, as
// for a --socket in use) named by the flag; an address this machine cannot
// listen on at all is a configuration error (exit 2). Neither shows the
// HTTP library's internals.
TEST(DaemonProcessTest, MetricsListenErrorsNameTheFlag) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string busy = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  const std::string socket = TempSocketPath("mbusy");
  std::vector<std::string> args = DaemonArgs(socket);
  args[1] = "--metrics_listen=" + busy;
  Child in_use(RADIXKVD_PATH, args);
  EXPECT_EQ(in_use.Wait(), 1) << in_use.output();
  close(fd);
  EXPECT_TRUE(absl::StrContains(
      in_use.output(),
      absl::StrCat("--metrics_listen=", busy, ": cannot listen (address in use)")))
      << in_use.output();
  EXPECT_FALSE(absl::StrContains(in_use.output(), "CivetServer")) << in_use.output();
  EXPECT_FALSE(absl::StrContains(in_use.output(), "ready")) << in_use.output();
  struct stat st;
  EXPECT_NE(lstat(socket.c_str(), &st), 0) << "a socket was left behind";

  // 192.0.2.1 (TEST-NET-1) is no address of this machine; "9464" no HOST:PORT.
  for (const char* value : {"192.0.2.1:9464", "9464x"}) {
    args = DaemonArgs(TempSocketPath("mbad"));
    args[1] = absl::StrCat("--metrics_listen=", value);
    Child bad(RADIXKVD_PATH, args);
    EXPECT_EQ(bad.Wait(), 2) << value << ": " << bad.output();
    EXPECT_TRUE(absl::StrContains(
        bad.output(), absl::StrCat("--metrics_listen=", value, ": cannot listen (")))
        << bad.output();
    EXPECT_FALSE(absl::StrContains(bad.output(), "CivetServer")) << bad.output();
  }
}

// Under systemd's Type=notify the daemon says READY=1 on $NOTIFY_SOCKET once
// it serves, and STOPPING=1 when it starts draining.
TEST(DaemonProcessTest, NotifiesReadinessAndStopping) {
  const std::string path = TempSocketPath("notify");
  ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  Child daemon(RADIXKVD_PATH, DaemonArgs(TempSocketPath("notified")));
  ::unsetenv("NOTIFY_SOCKET");
  auto receive = [fd]() {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30000) <= 0) return std::string();
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : std::string();
  };
  EXPECT_TRUE(absl::StrContains(receive(), "READY=1"));
  EXPECT_TRUE(daemon.WaitForOutput("radixkvd: ready", 30)) << daemon.output();
  ::kill(daemon.pid(), SIGTERM);
  EXPECT_TRUE(absl::StrContains(receive(), "STOPPING=1"));
  EXPECT_EQ(daemon.Wait(), 0) << daemon.output();
  ::close(fd);
  ::unlink(path.c_str());
}

TEST(DaemonProcessTest, KilledWorkerReleasesItsWritingPages) {
  const std::string socket = TempSocketPath("kill");
  Child daemon(RADIXKVD_PATH, DaemonArgs(socket, "host,bytes=64KiB"));
  ASSERT_TRUE(daemon.WaitForOutput("radixkvd: ready")) << daemon.output();
  auto admin = v1::Admin::NewStub(
      grpc::CreateChannel(UnixTarget(socket), grpc::InsecureChannelCredentials()));

  Child worker(LEASE_HOLDER_PATH, {socket, "32"});
  ASSERT_TRUE(worker.WaitForOutput("ready")) << worker.output();
  v1::Stats s = GetStats(admin.get());
  EXPECT_EQ(s.sessions(), 1u);
  EXPECT_EQ(s.leases(), 1u);
  EXPECT_EQ(s.writing_pages(), 8u);

  ASSERT_EQ(kill(worker.pid(), SIGKILL), 0);
  EXPECT_EQ(worker.Wait(), -1);  // killed by a signal
  // Generous: the socket close is seen at once; keepalive (1s + 2s) is the
  // worst case.
  EXPECT_TRUE(WaitFor([&] {
    v1::Stats t = GetStats(admin.get());
    return t.sessions() == 0 && t.leases() == 0 && t.writing_pages() == 0;
  }, 60));
  s = GetStats(admin.get());
  EXPECT_TRUE(s.invariants_ok());
  EXPECT_EQ(s.free_pages(), s.capacity_pages());
  EXPECT_EQ(s.cached_pages(), 0u);
  kill(daemon.pid(), SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0) << daemon.output();
}

}  // namespace
}  // namespace radixkv::testing
