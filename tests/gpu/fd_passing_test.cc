// Tests of gpu/fd_passing.h over SOCK_SEQPACKET socket pairs, including a
// memfd handed to a forked child that writes into it.
#include "gpu/fd_passing.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu/posix_resources.h"
#include "gtest/gtest.h"

namespace radixkv::gpu {
namespace {

struct SocketPair {
  UniqueFd a, b;
};

SocketPair MakePair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

TEST(FdPassingTest, MemfdSentToAForkedChildIsSharedMemory) {
  SocketPair sp = MakePair();
  absl::StatusOr<UniqueFd> memfd = CreateMemfd("fdpass", 1 << 20);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  absl::StatusOr<SharedMapping> parent_view =
      SharedMapping::Map(memfd->get(), 1 << 20);
  ASSERT_TRUE(parent_view.ok());

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Child: only the socket; receive the fd, map it, write, acknowledge.
    sp.a.reset();
    memfd->reset();
    absl::StatusOr<ReceivedMessage> m = RecvWithFds(sp.b.get(), 64, 4);
    if (!m.ok() || m->bytes != "pool" || m->fds.size() != 1) ::_exit(2);
    absl::StatusOr<SharedMapping> view =
        SharedMapping::Map(m->fds[0].get(), 1 << 20);
    if (!view.ok()) ::_exit(3);
    char* p = static_cast<char*>(view->data());
    for (int i = 0; i < (1 << 20); ++i) p[i] = static_cast<char>(i * 7 + 1);
    if (!SendWithFds(sp.b.get(), "done", {}).ok()) ::_exit(4);
    ::_exit(0);
  }
  sp.b.reset();
  int fd = memfd->get();
  ASSERT_TRUE(SendWithFds(sp.a.get(), "pool", {&fd, 1}).ok());
  absl::StatusOr<ReceivedMessage> ack = RecvWithFds(sp.a.get(), 64, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->bytes, "done");
  const char* p = static_cast<const char*>(parent_view->data());
  int mismatches = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    mismatches += p[i] != static_cast<char>(i * 7 + 1);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(FdPassingTest, ReceivedFdsAreCloseOnExecAndInOrder) {
  SocketPair sp = MakePair();
  std::vector<UniqueFd> memfds;
  std::vector<int> raw;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<UniqueFd> fd = CreateMemfd("order", 4096 * (i + 1));
    ASSERT_TRUE(fd.ok());
    raw.push_back(fd->get());
    memfds.push_back(*std::move(fd));
  }
  ASSERT_TRUE(SendWithFds(sp.a.get(), "x", raw).ok());
  absl::StatusOr<ReceivedMessage> m = RecvWithFds(sp.b.get(), 16, 8);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->fds.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(::fcntl(m->fds[i].get(), F_GETFD) & FD_CLOEXEC);
    EXPECT_EQ(::lseek(m->fds[i].get(), 0, SEEK_END), 4096 * (i + 1));
  }
}

TEST(FdPassingTest, OversizedMessageIsAnErrorNotASilentTruncation) {
  SocketPair sp = MakePair();
  std::string big(1000, 'z');
  ASSERT_TRUE(SendWithFds(sp.a.get(), big, {}).ok());
  absl::StatusOr<ReceivedMessage> m = RecvWithFds(sp.b.get(), 256, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("256 bytes"), std::string::npos);
}

TEST(FdPassingTest, TooManyFdsAreRejectedAndClosed) {
  SocketPair sp = MakePair();
  absl::StatusOr<UniqueFd> fd = CreateMemfd("many", 4096);
  ASSERT_TRUE(fd.ok());
  std::vector<int> raw(4, fd->get());
  ASSERT_TRUE(SendWithFds(sp.a.get(), "x", raw).ok());
  // Count open fds before and after: whatever arrived must be closed again.
  auto count_fds = [] {
    int n = 0;
    for (int i = 0; i < 4096; ++i) n += ::fcntl(i, F_GETFD) != -1;
    return n;
  };
  int before = count_fds();
  absl::StatusOr<ReceivedMessage> m = RecvWithFds(sp.b.get(), 16, 2);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("limit of 2 fds"), std::string::npos);
  EXPECT_EQ(count_fds(), before);

  ASSERT_TRUE(SendWithFds(sp.a.get(), "x", raw).ok());
  m = RecvWithFds(sp.b.get(), 16, 0);  // expecting none at all
  EXPECT_FALSE(m.ok());
  EXPECT_EQ(count_fds(), before);
}

TEST(FdPassingTest, EofTimeoutAndPeerCredentials) {
  SocketPair sp = MakePair();
  absl::StatusOr<PeerCredentials> cred = GetPeerCredentials(sp.a.get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, ::getpid());
  EXPECT_EQ(cred->uid, ::geteuid());
  EXPECT_EQ(cred->gid, ::getegid());

  ASSERT_TRUE(SetSocketTimeouts(sp.b.get(), absl::Milliseconds(50)).ok());
  absl::StatusOr<ReceivedMessage> m = RecvWithFds(sp.b.get(), 16, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  m = RecvWithFds(sp.b.get(), 16, 0, MSG_DONTWAIT);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable);

  sp.a.reset();
  m = RecvWithFds(sp.b.get(), 16, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->eof);
  // Sending to a closed peer is an error, not SIGPIPE.
  EXPECT_FALSE(SendWithFds(sp.b.get(), "x", {}).ok());
  EXPECT_FALSE(SendWithFds(sp.b.get(), "x", std::vector<int>(254, 0)).ok());
}

}  // namespace
}  // namespace radixkv::gpu
