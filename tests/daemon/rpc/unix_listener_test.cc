// Tests of UnixListener (daemon/rpc/unix_listener.h) with a real gRPC server in
// the test process: the socket's path and mode checks, and that a call
// over an accepted connection is identified (IdentifyCall) with this
// process's kernel credentials recorded in the PeerRegistry.
#include "daemon/rpc/unix_listener.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/trust/peer_identity.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::daemon {
namespace {

// Answers Admin.GetStats after recording who called.
class WhoCalls final : public v1::Admin::CallbackService {
 public:
  explicit WhoCalls(const PeerRegistry* registry) : registry_(registry) {}

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest*,
                                     v1::GetStatsResponse*) override {
    {
      absl::MutexLock lock(&mu_);
      last_ = IdentifyCall(*ctx, registry_);
      ++calls_;
    }
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  PeerIdentity last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  const PeerRegistry* const registry_;
  absl::Mutex mu_;
  PeerIdentity last_;
  int calls_ = 0;
};

class UnixListenerTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(testing::TempDir(), "/ul_", getpid());
    mkdir(dir_.c_str(), 0700);
    path_ = dir_ + "/s.sock";
    unlink(path_.c_str());
    grpc::ServerBuilder b;
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    listener_.reset();
    server_->Shutdown();
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  absl::Status Start(const std::string& path, unsigned mode = 0600) {
    absl::StatusOr<std::unique_ptr<UnixListener>> l =
        UnixListener::Start(path, mode, &registry_, server_.get());
    if (!l.ok()) return l.status();
    listener_ = *std::move(l);
    return absl::OkStatus();
  }

  grpc::Status Call() {
    auto stub = v1::Admin::NewStub(grpc::CreateChannel(
        "unix:" + path_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::GetStatsResponse resp;
    return stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
  }

  std::string dir_, path_;
  PeerRegistry registry_;
  WhoCalls service_{&registry_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixListener> listener_;
};

TEST_F(UnixListenerTest, ACallCarriesThisProcesssCredentials) {
  ASSERT_TRUE(Start(path_, 0660).ok());
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  const grpc::Status s = Call();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(service_.calls(), 1);
  const PeerIdentity p = service_.last();
  EXPECT_EQ(p.transport, PeerIdentity::Transport::kUnix);
  EXPECT_EQ(p.uid, getuid());
  EXPECT_EQ(p.gid, getegid());
  EXPECT_EQ(p.pid, getpid());
  EXPECT_EQ(p.address.rfind("fd:", 0), 0u) << p.address;
  // The registry holds the same record under that descriptor.
  gpu::PeerCredentials creds;
  ASSERT_TRUE(registry_.Find(std::stoi(p.address.substr(3)), &creds));
  EXPECT_EQ(creds.pid, getpid());
  EXPECT_EQ(creds.uid, getuid());
}

TEST_F(UnixListenerTest, TheListenerStopsAcceptingWhenDestroyed) {
  ASSERT_TRUE(Start(path_).ok());
  ASSERT_TRUE(Call().ok());
  listener_.reset();
  // The socket file it bound is gone, and nobody accepts: a call does not
  // complete.
  struct stat st;
  EXPECT_NE(lstat(path_.c_str(), &st), 0);
  auto stub = v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + path_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(500));
  v1::GetStatsResponse resp;
  EXPECT_FALSE(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
  EXPECT_EQ(service_.calls(), 1);
}

// A socket file that replaced the listener's at its path (a newer daemon's)
// outlives the listener.
TEST_F(UnixListenerTest, AReplacedSocketFileIsNotRemoved) {
  ASSERT_TRUE(Start(path_).ok());
  ASSERT_EQ(unlink(path_.c_str()), 0);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  struct stat replaced;
  ASSERT_EQ(lstat(path_.c_str(), &replaced), 0);
  listener_.reset();
  struct stat after;
  ASSERT_EQ(lstat(path_.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, replaced.st_ino);
  close(fd);
}

TEST_F(UnixListenerTest, BadPathsAreRefused) {
  absl::Status s = Start("");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("--socket"), std::string::npos) << s;
  sockaddr_un addr;
  s = Start(std::string(sizeof(addr.sun_path), 'x'));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find(absl::StrCat("must be 1..",
                                          sizeof(addr.sun_path) - 1, " bytes")),
            std::string::npos)
      << s;
  // The path must not exist.
  ASSERT_TRUE(Start(path_).ok());
  std::unique_ptr<UnixListener> first = std::move(listener_);
  s = Start(path_);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("cannot bind"), std::string::npos) << s;
  s = Start(dir_ + "/no/such/dir/s.sock");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

}  // namespace
}  // namespace radixkv::daemon
