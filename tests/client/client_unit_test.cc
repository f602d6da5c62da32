// Client library tests that need no daemon: status mapping, endpoints,
// option validation, and degrade-to-miss when nothing listens.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "client/status.h"
#include "gtest/gtest.h"
#include "radixkv/defaults.h"

namespace radixkv {
namespace {

TEST(FromGrpcStatus, OkIsOkWithoutMessage) {
  absl::Status s = FromGrpcStatus(grpc::Status::OK);
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE(s.message().empty());
}

TEST(FromGrpcStatus, EveryCanonicalCodeMapsToTheSameAbslCode) {
  for (int code = 1; code <= 16; ++code) {
    grpc::Status g(static_cast<grpc::StatusCode>(code), "msg " + std::to_string(code));
    absl::Status s = FromGrpcStatus(g);
    EXPECT_EQ(static_cast<int>(s.code()), code);
    EXPECT_EQ(s.message(), "msg " + std::to_string(code));
  }
}

TEST(FromGrpcStatus, OutOfRangeCodeBecomesUnknown) {
  // 30 is outside the canonical codes (0..16) but inside the enum's value
  // range, so constructing it is defined behaviour (UBSan checks this).
  absl::Status s = FromGrpcStatus(
      grpc::Status(static_cast<grpc::StatusCode>(30), "odd"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_NE(s.message().find("30"), absl::string_view::npos);
}

TEST(IsUnreachable, OnlyTransportCodes) {
  EXPECT_TRUE(IsUnreachable(absl::UnavailableError("")));
  EXPECT_TRUE(IsUnreachable(absl::DeadlineExceededError("")));
  EXPECT_FALSE(IsUnreachable(absl::InvalidArgumentError("")));
  EXPECT_FALSE(IsUnreachable(absl::OkStatus()));
}

TEST(GrpcTargetForEndpoint, Forms) {
  EXPECT_EQ(*GrpcTargetForEndpoint("/tmp/x.sock"), "unix:/tmp/x.sock");
  EXPECT_EQ(*GrpcTargetForEndpoint("unix:/tmp/x.sock"), "unix:/tmp/x.sock");
  EXPECT_EQ(*GrpcTargetForEndpoint("127.0.0.1:7000"), "127.0.0.1:7000");
  EXPECT_EQ(*GrpcTargetForEndpoint("localhost:7000"), "localhost:7000");
  EXPECT_EQ(*GrpcTargetForEndpoint("[::1]:7000"), "[::1]:7000");
  EXPECT_EQ(*GrpcTargetForEndpoint(""), UnixTarget(DefaultSocketPath()));
  for (const char* bad : {"localhost", "host:0", "host:70000", "unix:", ":80"}) {
    absl::StatusOr<std::string> t = GrpcTargetForEndpoint(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(t.status().message().find("endpoint"), absl::string_view::npos);
  }
}

// One default for a whole deployment: clients use the system daemon's
// socket when it exists; the daemon listens there when it may create it;
// otherwise both use the per-user socket.
TEST(DefaultSocketPath, SystemSocketWhenThereElsePerUser) {
  char dir_template[] = "/tmp/rkvdefXXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  ASSERT_FALSE(dir.empty());
  EXPECT_EQ(DefaultSocketPath(dir), UserSocketPath());
  EXPECT_EQ(DaemonDefaultSocketPath(dir), dir + "/radixkvd.sock");
  EXPECT_EQ(DaemonDefaultSocketPath(dir + "/missing"), UserSocketPath());
  // A socket file makes it the clients' default too.
  const std::string sock = dir + "/radixkvd.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, sock.data(), sock.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(DefaultSocketPath(dir), sock);
  ::close(fd);
  ::unlink(sock.c_str());
  ::rmdir(dir.c_str());
}

NamespaceSpec TestNamespace() {
  NamespaceSpec ns;
  ns.model = "unit";
  ns.num_layers = 2;
  ns.num_kv_heads = 2;
  ns.head_dim = 8;
  ns.page_size = 4;
  ns.dtype = DType::kFloat16;
  return ns;
}

TEST(NamespaceProto, RoundTrips) {
  NamespaceSpec ns = TestNamespace();
  ns.lora = "adapter";
  ns.cache_salt = "tenant";
  ns.tp_rank = 1;
  ns.tp_size = 2;
  EXPECT_EQ(NamespaceFromProto(NamespaceToProto(ns)), ns);
}

TEST(ClientCreate, RejectsBadOptionsNamingTheField) {
  ClientOptions o;
  o.ns = TestNamespace();
  o.ns.page_size = 0;
  auto c = Client::Create(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("page_size"), absl::string_view::npos);

  o.ns = TestNamespace();
  o.ns.tp_rank = 2;
  o.ns.tp_size = 2;
  c = Client::Create(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("tp_rank"), absl::string_view::npos);

  o.ns = TestNamespace();
  o.endpoint = "not an endpoint";
  c = Client::Create(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);

  o.endpoint = "";
  o.release_delay = absl::Milliseconds(-1);
  c = Client::Create(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("release_delay"), absl::string_view::npos);
}

TEST(ClientDegrades, NoDaemonMeansEmptyLeaseNotError) {
  ClientOptions o;
  o.ns = TestNamespace();
  o.endpoint = "/tmp/rkc_nobody_listens.sock";
  o.initial_wait = absl::Milliseconds(200);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->connected());

  std::vector<uint32_t> tokens(18);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  absl::StatusOr<Lease> lease = (*client)->Acquire(tokens);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(lease->degraded());
  EXPECT_FALSE(lease->held());
  EXPECT_EQ(lease->total_blocks(), 4u);  // 18 tokens / page_size 4
  EXPECT_EQ(lease->matched_blocks(), 0u);
  EXPECT_EQ(lease->matched_tokens(), 0u);
  EXPECT_TRUE(lease->pages().empty());
  EXPECT_EQ(lease->new_blocks(), 0u);
  EXPECT_EQ(lease->page_address(0), nullptr);
  EXPECT_TRUE(lease->Release().ok());
  EXPECT_EQ(lease->Commit(1, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE((*client)->state().last_error.ok());

  // Bad input is still an error, daemon or not.
  EXPECT_EQ((*client)->Acquire({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Match reports the outage instead of degrading.
  EXPECT_EQ((*client)->Match(tokens).status().code(),
            absl::StatusCode::kUnavailable);
}

// A client that cannot reach its daemon says where it looked and what the
// OS answered, not only that it is degraded.
TEST(ClientDegrades, LastErrorNamesTheEndpointAndTheOsError) {
  ClientOptions o;
  o.ns = TestNamespace();
  o.endpoint = "/tmp/rkc_nobody_listens_here.sock";
  o.initial_wait = absl::Milliseconds(100);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Status why = (*client)->state().last_error;
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(why.message().find("unix:/tmp/rkc_nobody_listens_here.sock"),
            absl::string_view::npos) << why;
  EXPECT_NE(why.message().find("No such file or directory"),
            absl::string_view::npos) << why;
}

TEST(ConnectProblem, NamesThePathTheErrorAndAnUnenterableSystemDir) {
  char dir_template[] = "/tmp/rkvcpXXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  ASSERT_FALSE(dir.empty());
  const std::string sock = dir + "/radixkvd.sock";
  EXPECT_EQ(ConnectProblem("unix:" + sock, false, dir),
            "cannot connect to unix:" + sock + ": No such file or directory");
  EXPECT_EQ(ConnectProblem("dns:localhost:1", true, dir), "");
  EXPECT_NE(ConnectProblem("unix:/" + std::string(200, 'x'), false, dir)
                .find("longer than a Unix socket path may be (107 bytes)"),
            std::string::npos);

  // A listening socket is reachable: no problem to report.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, sock.data(), sock.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_EQ(ConnectProblem("unix:" + sock, false, dir), "");
  ::close(fd);
  ::unlink(sock.c_str());

  // The system directory exists but cannot be entered: the defaulted
  // client is told so (root enters any directory, so only checked as
  // another user).
  if (::getuid() != 0) {
    ASSERT_EQ(::chmod(dir.c_str(), 0), 0);
    const std::string other = "unix:/tmp/rkc_user_default_missing.sock";
    EXPECT_NE(ConnectProblem(other, true, dir).find("cannot enter it"),
              std::string::npos);
    EXPECT_EQ(ConnectProblem(other, false, dir).find("cannot enter it"),
              std::string::npos);
    ::chmod(dir.c_str(), 0700);
  }
  ::rmdir(dir.c_str());
}

TEST(ClientHasher, MatchesTheContractFunctions) {
  ClientOptions o;
  o.ns = TestNamespace();
  o.endpoint = "/tmp/rkc_nobody_listens.sock";
  o.initial_wait = absl::ZeroDuration();
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  std::vector<uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ((*client)->namespace_root(), NamespaceRoot(o.ns));
  std::vector<BlockKey> keys = (*client)->ComputeKeys(tokens);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys, ComputeBlockKeys(NamespaceRoot(o.ns), 4, tokens));
  BlockHasher h = (*client)->NewHasher();
  h.Append(tokens);
  EXPECT_EQ(h.keys(), keys);
}

TEST(LeaseMove, MovedFromLeaseHoldsNothing) {
  Lease a;
  EXPECT_FALSE(a.held());
  Lease b(std::move(a));
  EXPECT_FALSE(b.held());
  EXPECT_TRUE(b.pages().empty());
}

}  // namespace
}  // namespace radixkv
