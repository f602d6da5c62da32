// Tests of the attach protocol without the daemon: an AttachServer on an
// in-process host pool, workers in this process and in child processes, and
// misuse (unknown session, none pool, wrong socket type, oversized or
// malformed messages, silent peers, peers with another uid).
#include "client/attach.h"

#include <grp.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/rpc/attach_server.h"
#include "gpu/fd_passing.h"
#include "gpu/mapped_pool.h"
#include "gtest/gtest.h"

extern char** environ;

namespace radixkv::daemon {
namespace {

using gpu::UniqueFd;

constexpr uint64_t kPageBytes = 4096;

std::unique_ptr<gpu::PagePool> MakePool(const std::string& spec_text) {
  absl::StatusOr<gpu::PoolSpec> spec = gpu::ParsePoolSpec(spec_text);
  EXPECT_TRUE(spec.ok());
  absl::StatusOr<std::unique_ptr<gpu::PagePool>> pool =
      gpu::CreatePagePool(*spec, kPageBytes);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

// Connects a raw socket of `type` to `path`; invalid fd (errno set) on error.
UniqueFd Connect(const std::string& path, int type) {
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&addr),
                sizeof(addr)) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Waits (up to 60 s) for the server to answer or close `fd`: returns the
// message, eof = true when it closed without sending.
absl::StatusOr<gpu::ReceivedMessage> Await(int fd) {
  EXPECT_TRUE(gpu::SetSocketTimeouts(fd, absl::Seconds(60)).ok());
  return gpu::RecvWithFds(fd, 65536, 253);
}

class AttachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = MakePool("host,bytes=1MiB,chunk_bytes=64KiB");
    none_pool_ = MakePool("none,pages=100");
    ASSERT_NE(pool_, nullptr);
    options_.path = absl::StrCat("/tmp/rkv-att-", ::getpid(), ".sock");
    options_.request_timeout = absl::Seconds(30);
    StartServer();
  }

  void StartServer() {
    server_.reset();
    absl::StatusOr<std::unique_ptr<AttachServer>> server = AttachServer::Start(
        options_, [this](absl::string_view id) -> const gpu::PagePool* {
          if (id == "sess-1") return pool_.get();
          if (id == "sess-none") return none_pool_.get();
          return nullptr;
        });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A successful in-process attach: proves the server is alive and serving.
  void ExpectServes() {
    absl::StatusOr<std::unique_ptr<gpu::MappedPool>> m =
        AttachPool(options_.path, "sess-1", absl::Seconds(30));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->capacity_pages(), pool_->capacity_pages());
  }

  int RunChild(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    std::string exe = RADIXKV_ATTACH_CHILD;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid;
    EXPECT_EQ(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(),
                            environ),
              0);
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::unique_ptr<gpu::PagePool> pool_;
  std::unique_ptr<gpu::PagePool> none_pool_;
  AttachServer::Options options_;
  std::unique_ptr<AttachServer> server_;
};

TEST_F(AttachTest, ChildProcessReadsAndWritesDaemonPages) {
  std::memset(pool_->host_page_address(3), 0xab, kPageBytes);
  std::memset(pool_->host_page_address(200), 0, kPageBytes);
  EXPECT_EQ(RunChild({options_.path, "sess-1", "3", "171", "200", "205"}), 0);
  const unsigned char* p =
      static_cast<const unsigned char*>(pool_->host_page_address(200));
  EXPECT_EQ(p[0], 205);
  EXPECT_EQ(p[kPageBytes - 1], 205);
  // A second worker reads what the first one wrote.
  EXPECT_EQ(RunChild({options_.path, "sess-1", "200", "205", "201", "1"}), 0);
  EXPECT_EQ(server_->stats().served, 2u);
}

TEST_F(AttachTest, ReplyDescribesThePoolExactly) {
  UniqueFd fd = Connect(options_.path, SOCK_SEQPACKET);
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(gpu::SendWithFds(fd.get(), "sess-1", {}).ok());
  absl::StatusOr<gpu::ReceivedMessage> m = Await(fd.get());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_FALSE(m->eof);
  EXPECT_EQ(m->fds.size(), pool_->chunk_count());
  absl::StatusOr<std::unique_ptr<gpu::MappedPool>> mapped =
      AttachPool(options_.path, "sess-1", absl::Seconds(30));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const gpu::PoolLayout& got = (*mapped)->layout();
  gpu::PoolLayout want = gpu::LayoutOf(*pool_);
  EXPECT_EQ(got.backend, gpu::Backend::kHost);
  EXPECT_EQ(got.page_bytes, want.page_bytes);
  EXPECT_EQ(got.pages_per_chunk, want.pages_per_chunk);
  EXPECT_EQ(got.capacity_pages, want.capacity_pages);
  EXPECT_EQ(got.chunk_bytes, want.chunk_bytes);
  EXPECT_EQ(got.device, -1);
}

TEST_F(AttachTest, UnknownSessionIsClosedWithNothingSent) {
  UniqueFd fd = Connect(options_.path, SOCK_SEQPACKET);
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(gpu::SendWithFds(fd.get(), "no-such-session", {}).ok());
  absl::StatusOr<gpu::ReceivedMessage> m = Await(fd.get());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->eof);
  EXPECT_TRUE(m->bytes.empty());
  EXPECT_TRUE(m->fds.empty());

  absl::StatusOr<std::unique_ptr<gpu::MappedPool>> refused =
      AttachPool(options_.path, "no-such-session", absl::Seconds(30));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("attach refused"),
            std::string::npos);
  EXPECT_EQ(RunChild({options_.path, "bogus", "0", "0", "0", "0"}), 3);
  EXPECT_EQ(server_->stats().refused, 3u);
  EXPECT_EQ(server_->stats().served, 0u);
  ExpectServes();
}

TEST_F(AttachTest, NonePoolIsRefused) {
  absl::StatusOr<std::unique_ptr<gpu::MappedPool>> m =
      AttachPool(options_.path, "sess-none", absl::Seconds(30));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(AttachTest, WrongSocketTypeFailsCleanlyAndServerSurvives) {
  errno = 0;
  UniqueFd stream = Connect(options_.path, SOCK_STREAM);
  EXPECT_FALSE(stream.valid());
  EXPECT_EQ(errno, EPROTOTYPE);
  UniqueFd dgram = Connect(options_.path, SOCK_DGRAM);
  EXPECT_FALSE(dgram.valid());
  ExpectServes();
}

TEST_F(AttachTest, MalformedRequestsAreRefusedAndServerSurvives) {
  // Oversized: 300 bytes > 256.
  {
    UniqueFd fd = Connect(options_.path, SOCK_SEQPACKET);
    ASSERT_TRUE(gpu::SendWithFds(fd.get(), std::string(300, 's'), {}).ok());
    absl::StatusOr<gpu::ReceivedMessage> m = Await(fd.get());
    ASSERT_TRUE(m.ok());
    EXPECT_TRUE(m->eof);
  }
  // Not UTF-8.
  {
    UniqueFd fd = Connect(options_.path, SOCK_SEQPACKET);
    ASSERT_TRUE(gpu::SendWithFds(fd.get(), "sess-\xff", {}).ok());
    absl::StatusOr<gpu::ReceivedMessage> m = Await(fd.get());
    ASSERT_TRUE(m.ok());
    EXPECT_TRUE(m->eof);
  }
  // A valid id but with an fd attached.
  {
    UniqueFd fd = Connect(options_.path, SOCK_SEQPACKET);
    int self = fd.get();
    ASSERT_TRUE(gpu::SendWithFds(fd.get(), "sess-1", {&self, 1}).ok());
    absl::StatusOr<gpu::ReceivedMessage> m = Await(fd.get());
    ASSERT_TRUE(m.ok());
    EXPECT_TRUE(m->eof);
  }
  // Connect and hang up without sending.
  {
    UniqueFd fd = Connect(options_.path, SOCK_SEQPACKET);
    ASSERT_TRUE(fd.valid());
  }
  ExpectServes();
  EXPECT_GE(server_->stats().refused, 3u);
}

TEST_F(AttachTest, SilentPeerDoesNotBlockOthersAndTimesOut) {
  options_.request_timeout = absl::Milliseconds(500);
  StartServer();
  UniqueFd silent = Connect(options_.path, SOCK_SEQPACKET);
  ASSERT_TRUE(silent.valid());
  ExpectServes();  // served while the silent peer is pending
  absl::StatusOr<gpu::ReceivedMessage> m = Await(silent.get());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->eof);
  EXPECT_EQ(server_->stats().refused, 1u);
}

TEST_F(AttachTest, StaleSocketIsReplacedButALiveOneIsNot) {
  // A second server on the live path must refuse to steal it.
  absl::StatusOr<std::unique_ptr<AttachServer>> second =
      AttachServer::Start(options_, [](absl::string_view) { return nullptr; });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectServes();
  // Destroying the server unlinks its socket.
  server_.reset();
  EXPECT_NE(::access(options_.path.c_str(), F_OK), 0);
  // A stale socket file (bound, never listening) is replaced.
  {
    UniqueFd stale(::socket(AF_UNIX, SOCK_SEQPACKET, 0));
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, options_.path.data(), options_.path.size());
    ASSERT_EQ(::bind(stale.get(), reinterpret_cast<struct sockaddr*>(&addr),
                     sizeof(addr)),
              0);
  }
  StartServer();
  ExpectServes();
  // A regular file is never removed.
  server_.reset();
  std::string file = options_.path + ".file";
  {
    FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  AttachServer::Options o = options_;
  o.path = file;
  absl::StatusOr<std::unique_ptr<AttachServer>> bad =
      AttachServer::Start(o, [](absl::string_view) { return nullptr; });
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(::access(file.c_str(), F_OK), 0);
  ::unlink(file.c_str());
  o.path = std::string(200, 'x');
  bad = AttachServer::Start(o, [](absl::string_view) { return nullptr; });
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// Forks a child that drops to uid/gid 65534 (with `supplementary` as its
// only supplementary group, or none when 0) and attaches with raw syscalls
// only (async-signal-safe after fork in a threaded process). Exit code: 0
// closed with nothing sent, 1 got a reply, 2 could not connect, 3 setuid
// failed.
int AttachAsNobody(const std::string& path, gid_t supplementary = 0) {
  pid_t pid = ::fork();
  if (pid == 0) {
    const gid_t groups[1] = {supplementary};
    if (::setgroups(supplementary == 0 ? 0 : 1, groups) != 0 ||
        ::setgid(65534) != 0 || ::setuid(65534) != 0) {
      ::_exit(3);
    }
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (::connect(fd, reinterpret_cast<struct sockaddr*>(&addr),
                  sizeof(addr)) != 0) {
      ::_exit(2);
    }
    ::send(fd, "sess-1", 6, MSG_NOSIGNAL);
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ::_exit(n > 0 ? 1 : 0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(AttachTest, PeerWithAnotherUidIsRefusedUnlessItsGroupIsAllowed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as uid 65534";
  options_.mode = 0666;  // let uid 65534 connect; SO_PEERCRED must refuse it
  StartServer();
  EXPECT_EQ(AttachAsNobody(options_.path), 0);
  EXPECT_EQ(server_->stats().refused, 1u);
  EXPECT_EQ(server_->stats().served, 0u);
  ExpectServes();

  options_.allowed_gids = {65534};
  StartServer();
  EXPECT_EQ(AttachAsNobody(options_.path), 1);
  EXPECT_EQ(server_->stats().served, 1u);
}

// A worker in the allowed group only as a supplementary group (the usual
// way: its user is a member of group radixkv) is trusted too; one outside
// it is not.
TEST_F(AttachTest, SupplementaryGroupMembershipIsHonoured) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as uid 65534";
  options_.mode = 0666;
  options_.allowed_gids = {4242};
  StartServer();
  EXPECT_EQ(AttachAsNobody(options_.path, /*supplementary=*/4242), 1);
  EXPECT_EQ(server_->stats().served, 1u);
  EXPECT_EQ(AttachAsNobody(options_.path, /*supplementary=*/4243), 0);
  EXPECT_EQ(server_->stats().refused, 1u);
}

}  // namespace
}  // namespace radixkv::daemon
