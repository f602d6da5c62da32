// In-process radixkvd: health + reflection, /metrics (checked by promtool),
// startup errors, the bad-input table, lease TTL and a concurrency run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "daemon/rpc/metrics.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "radixkv/errors.h"
#include "src/proto/grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/daemon/server_fixture.h"

namespace radixkv::testing {
namespace {

namespace refl = ::grpc::reflection::v1alpha;

TEST_F(ServerTest, HealthCheckServing) {
  StartServer();
  grpc::TemplatedGenericStub<grpc::health::v1::HealthCheckRequest,
                             grpc::health::v1::HealthCheckResponse>
      stub(channel_);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req,
                 &resp, [&](grpc::Status s) { done.set_value(s); });
  const grpc::Status s = done.get_future().get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  // Per service, too.
  req.set_service("radixkv.v1.KvCache");
  grpc::ClientContext ctx2;
  ctx2.set_deadline(Deadline());
  std::promise<grpc::Status> done2;
  stub.UnaryCall(&ctx2, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req,
                 &resp, [&](grpc::Status s) { done2.set_value(s); });
  ASSERT_TRUE(done2.get_future().get().ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ServerTest, ReflectionListsAndDescribesAllServices) {
  StartServer();
  auto stub = refl::ServerReflection::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest req;
  req.set_list_services("");
  refl::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  std::set<std::string> services;
  for (const auto& s : resp.list_services_response().service()) {
    services.insert(s.name());
  }
  EXPECT_TRUE(services.count("radixkv.v1.KvCache"));
  EXPECT_TRUE(services.count("radixkv.v1.Admin"));
  EXPECT_TRUE(services.count("grpc.health.v1.Health"));
  // Every listed service can be described (its file found by symbol).
  for (const std::string& name : services) {
    refl::ServerReflectionRequest file_req;
    file_req.set_file_containing_symbol(name);
    ASSERT_TRUE(stream->Write(file_req));
    refl::ServerReflectionResponse file_resp;
    ASSERT_TRUE(stream->Read(&file_resp));
    EXPECT_GT(file_resp.file_descriptor_response().file_descriptor_proto_size(), 0)
        << name << ": " << file_resp.error_response().error_message();
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// The output of `cmd`.
std::string Run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// GET http://127.0.0.1:port/metrics over a plain socket.
std::string HttpGet(int port, const std::string& path) {
  return Run(absl::StrCat("curl -sf --max-time 20 http://127.0.0.1:", port, path));
}

// GET http://127.0.0.1:port/path: "<status> <content type>\n<body>".
std::string HttpGetWithStatus(int port, const std::string& path) {
  const std::string out = Run(absl::StrCat(
      "curl -s --max-time 20 -w '\\n%{http_code} %{content_type}' "
      "http://127.0.0.1:", port, path));
  const size_t nl = out.rfind('\n');
  if (nl == std::string::npos) return out;
  return absl::StrCat(out.substr(nl + 1), "\n", out.substr(0, nl));
}

TEST_F(ServerTest, MetricsEndpointPassesPromtool) {
  StartServer([](daemon::ServerOptions& o) { o.metrics_listen = "127.0.0.1:0"; });
  ASSERT_GT(server_->metrics_port(), 0);
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  Insert(session.id(), Tokens(16, 60));
  v1::AcquireResponse bad;
  EXPECT_FALSE(Acquire("", Tokens(4, 1), true, &bad).ok());

  const std::string text = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_FALSE(text.empty()) << "curl failed against " << server_->metrics_url();
  for (const char* want :
       {"radixkv_pages{state=\"free\"} 60", "radixkv_pages{state=\"writing\"} 0",
        "radixkv_pages{state=\"cached\"} 4", "radixkv_pages{state=\"pinned\"} 0",
        "radixkv_capacity_pages 64", "radixkv_lookup_tokens_total 16",
        "radixkv_hit_tokens_total 0", "radixkv_evicted_pages_total 0",
        "radixkv_hash_collisions_total 0", "radixkv_sessions 1",
        "radixkv_leases 0", "radixkv_lease_expired_total 0",
        "radixkv_lease_abandoned_total 0",
        "radixkv_tree_nodes 4", "radixkv_namespaces 1",
        "radixkv_requests_total{code=\"OK\",method=\"Acquire\"} 1",
        "radixkv_requests_total{code=\"INVALID_ARGUMENT\",method=\"Acquire\"} 1",
        "radixkv_request_duration_seconds_bucket{method=\"Commit\",le=\"+Inf\"} 1",
        // The same calls under go-grpc-prometheus's names.
        "grpc_server_started_total{grpc_method=\"Acquire\",grpc_service="
        "\"radixkv.v1.KvCache\",grpc_type=\"unary\"} 2",
        "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Acquire\","
        "grpc_service=\"radixkv.v1.KvCache\",grpc_type=\"unary\"} 1",
        "grpc_server_handled_total{grpc_code=\"InvalidArgument\",grpc_method="
        "\"Acquire\",grpc_service=\"radixkv.v1.KvCache\",grpc_type=\"unary\"} 1",
        "grpc_server_handling_seconds_bucket{grpc_method=\"Commit\",grpc_service="
        "\"radixkv.v1.KvCache\",grpc_type=\"unary\",le=\"+Inf\"} 1",
        "grpc_server_started_total{grpc_method=\"Session\",grpc_service="
        "\"radixkv.v1.KvCache\",grpc_type=\"bidi_stream\"} 1",
        "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Session\","
        "grpc_service=\"radixkv.v1.KvCache\",grpc_type=\"bidi_stream\"} 1",
        "grpc_server_started_total{grpc_method=\"WatchEvents\",grpc_service="
        "\"radixkv.v1.Admin\",grpc_type=\"server_stream\"} 0",
        "# TYPE grpc_server_handling_seconds histogram",
        "radixkv_build_info{version=\"", ",commit=\"", "process_cpu_seconds_total ",
        "process_resident_memory_bytes ", "process_open_fds ", "process_max_fds ",
        "process_start_time_seconds "}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want;
  }
  // The probes answer while the daemon serves: /healthz in exposition
  // text, /readyz a short plain-text status.
  EXPECT_NE(HttpGet(server_->metrics_port(), "/healthz").find("radixkv_up 1"),
            std::string::npos);
  EXPECT_EQ(HttpGetWithStatus(server_->metrics_port(), "/readyz"),
            "200 text/plain; charset=utf-8\nready\n");
  // No unbounded label values: session ids never appear.
  EXPECT_EQ(text.find(session.id()), std::string::npos);

  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "promtool not installed (apt-get install prometheus)";
  }
  const std::string file = absl::StrCat("/tmp/rkd_metrics_", getpid(), ".txt");
  std::ofstream(file) << text;
  const int rc = std::system(
      absl::StrCat("/usr/bin/promtool check metrics < ", file, " >/dev/null 2>&1").c_str());
  std::remove(file.c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0) << "promtool check metrics failed on:\n" << text;
}

TEST(ServerStartTest, MetricsPortInUseIsAClearError) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string listen_addr = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  daemon::ServerOptions o;
  o.socket_path = TempSocketPath("port");
  o.metrics_listen = listen_addr;
  o.pool = "none,pages=8";
  auto server = daemon::Server::Start(o);
  close(fd);
  ASSERT_FALSE(server.ok());
  // In use: a runtime failure (radixkvd exits 1), named by the flag.
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StartsWith(
      server.status().message(),
      absl::StrCat("--metrics_listen=", listen_addr, ": cannot listen (address in use)")))
      << server.status();
  EXPECT_EQ(server.status().message().find("CivetServer"), std::string::npos)
      << server.status();
}

// /readyz is 503 "not ready: starting" from the moment the metrics port
// listens until the server is ready, then 200 "ready".
TEST(MetricsReadyzTest, NotReadyUntilMarkedReady) {
  daemon::Metrics metrics(nullptr);  // /metrics is not scraped here
  ASSERT_TRUE(metrics.Serve("127.0.0.1:0").ok());
  ASSERT_GT(metrics.port(), 0);
  EXPECT_EQ(HttpGetWithStatus(metrics.port(), "/readyz"),
            "503 text/plain; charset=utf-8\nnot ready: starting\n");
  EXPECT_EQ(HttpGetWithStatus(metrics.port(), "/healthz").substr(0, 4), "404 ");
  metrics.MarkReady();
  EXPECT_EQ(HttpGetWithStatus(metrics.port(), "/readyz"),
            "200 text/plain; charset=utf-8\nready\n");
  metrics.StopServing();
  EXPECT_EQ(metrics.port(), 0);
}

// --max_pool_pages must be usable, and a none pool may not exceed it; each
// refusal names the flag and starts nothing.
TEST(ServerStartTest, MaxPoolPagesIsChecked) {
  daemon::ServerOptions o;
  o.socket_path = TempSocketPath("maxp");
  o.metrics_listen = "";
  o.pool = "none,pages=64";
  o.cache.max_pool_pages = 0;
  auto server = daemon::Server::Start(o);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--max_pool_pages=0"),
            std::string::npos)
      << server.status();
  o.cache.max_pool_pages = 32;
  server = daemon::Server::Start(o);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("exceeds --max_pool_pages=32"),
            std::string::npos)
      << server.status();
  EXPECT_NE(access(o.socket_path.c_str(), F_OK), 0);  // nothing listens
}

TEST(ServerStartTest, BadPoolFlagIsAClearError) {
  daemon::ServerOptions o;
  o.socket_path = TempSocketPath("pool");
  o.pool = "floppy,bytes=1GiB";
  auto server = daemon::Server::Start(o);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--pool"), std::string::npos);
}

// --- The bad-input table -------------------------------------------------

// The bad-input table runs against daemon::Cache (cache_test.cc); over gRPC
// a few cases check that code, message and ErrorDetail reach the client and
// that nothing changed.
TEST_F(ServerTest, BadInputReachesTheClientWithItsDetail) {
  StartServer([](daemon::ServerOptions& o) { o.cache.max_prompt_tokens = 64; });
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  v1::Stats before = Stats();
  before.clear_uptime_seconds();

  v1::AcquireResponse resp;
  absl::Status s = FromGrpcStatus(Acquire(session.id(), Tokens(65, 1), true, &resp));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("--max_prompt_tokens=64"), std::string::npos) << s;
  EXPECT_EQ(ErrorFieldOf(s), "tokens");
  EXPECT_EQ(ErrorReasonOf(s), v1::ERROR_REASON_INVALID);

  v1::AcquireRequest carry;
  carry.set_session_id(session.id());
  SetTokens(&carry, Tokens(8, 1));
  carry.add_release_leases(987654321);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  s = FromGrpcStatus(kv_->Acquire(&ctx, carry, &resp));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(ErrorFieldOf(s), "release_leases");
  EXPECT_EQ(ErrorReasonOf(s), v1::ERROR_REASON_LEASE_NOT_FOUND);

  s = FromGrpcStatus(Release("00000000000000000000000000000000", 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(ErrorReasonOf(s), v1::ERROR_REASON_SESSION_NOT_FOUND);

  v1::Stats after = Stats();
  after.clear_uptime_seconds();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, after))
      << "stats changed:\n" << before.DebugString() << "\nvs\n"
      << after.DebugString();
}

// Clear, Evict and a refused session open each leave one audit line naming
// the peer and how much was done.
TEST_F(ServerTest, AdminActionsAndRefusalsAreAudited) {
  StartServer();
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  Insert(session.id(), Tokens(16, 70));
  ::testing::internal::CaptureStderr();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    v1::EvictRequest req;
    req.set_pages(1);
    v1::EvictResponse resp;
    ASSERT_TRUE(admin_->Evict(&ctx, req, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    v1::ClearResponse resp;
    ASSERT_TRUE(admin_->Clear(&ctx, v1::ClearRequest(), &resp).ok());
  }
  v1::Namespace other = TestNamespace();
  other.set_num_layers(3);  // other page_bytes: refused
  SessionStream refused(kv_.get(), other);
  EXPECT_FALSE(refused.ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  // The peer as the kernel reported it for the Unix connection.
  EXPECT_NE(log.find("audit: Evict from uid="), std::string::npos) << log;
  EXPECT_NE(log.find("asked 1 pages, evicted 1"), std::string::npos) << log;
  EXPECT_NE(log.find("audit: Clear from uid="), std::string::npos) << log;
  EXPECT_NE(log.find("removed 3 blocks"), std::string::npos) << log;
  EXPECT_NE(log.find("audit: session open refused for"), std::string::npos)
      << log;
}

TEST_F(ServerTest, ExpiredLeaseIsNotFoundAndSwept) {
  StartServer([](daemon::ServerOptions& o) {
    o.cache.sessions.lease_ttl = absl::Milliseconds(200);
  });
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  v1::AcquireResponse a;
  ASSERT_TRUE(Acquire(session.id(), Tokens(8, 80), true, &a).ok());
  ASSERT_TRUE(WaitFor([&] { return Stats().leases() == 0; }));
  v1::Stats s = Stats();
  EXPECT_EQ(s.lease_expired(), 1u);
  EXPECT_EQ(s.writing_pages(), 0u);
  ExpectInvariants(s);
  v1::CommitResponse c;
  EXPECT_EQ(Commit(session.id(), a.lease_id(), 2, true, &c).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Stats().cached_pages(), 0u);
}

// Holds back the answer of every Acquire for `delay` (before it is sent)
// while `armed`: the client's deadline passes with the lease already made.
class SlowAcquireAnswers : public grpc::experimental::Interceptor {
 public:
  SlowAcquireAnswers(const std::atomic<bool>* armed, absl::Duration delay)
      : armed_(armed), delay_(delay) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_MESSAGE) &&
        armed_->load()) {
      absl::SleepFor(delay_);
    }
    m->Proceed();
  }

 private:
  const std::atomic<bool>* const armed_;
  const absl::Duration delay_;
};

class SlowAcquireAnswersFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit SlowAcquireAnswersFactory(const std::atomic<bool>* armed)
      : armed_(armed) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (std::string(info->method()) != "/radixkv.v1.KvCache/Acquire") {
      return nullptr;
    }
    return new SlowAcquireAnswers(armed_, absl::Milliseconds(600));
  }

 private:
  const std::atomic<bool>* const armed_;
};

// An Acquire whose answer cannot reach the client before its deadline made
// a lease the client never learns of: the daemon ends it (its new pages are
// free again, nothing stays pinned) instead of keeping it for --lease_ttl.
TEST_F(ServerTest, AcquireThatFailsAfterMakingALeaseEndsIt) {
  std::atomic<bool> armed{false};
  StartServer([&](daemon::ServerOptions& o) {
    o.interceptors = [&armed] {
      std::vector<std::unique_ptr<
          grpc::experimental::ServerInterceptorFactoryInterface>> v;
      v.push_back(std::make_unique<SlowAcquireAnswersFactory>(&armed));
      return v;
    };
  });
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  // Answered in time: the lease stays.
  v1::AcquireResponse kept;
  ASSERT_TRUE(Acquire(session.id(), Tokens(32, 10), true, &kept).ok());  // 8 blocks
  ASSERT_NE(kept.lease_id(), 0u);

  armed = true;
  v1::AcquireRequest req;
  req.set_session_id(session.id());
  SetTokens(&req, Tokens(32, 20));
  req.set_allocate(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(150));
  v1::AcquireResponse lost;
  EXPECT_EQ(kv_->Acquire(&ctx, req, &lost).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitFor([&] { return Stats().lease_abandoned() == 1; }, 10));
  armed = false;
  v1::Stats s = Stats();
  EXPECT_EQ(s.leases(), 1u);          // the first one
  EXPECT_EQ(s.writing_pages(), 8u);   // its 8 new pages only
  EXPECT_EQ(s.lease_expired(), 0u);
  ExpectInvariants(s);
  // The first lease is unaffected.
  v1::CommitResponse c;
  EXPECT_TRUE(Commit(session.id(), kept.lease_id(), 8, true, &c).ok());
  EXPECT_EQ(Stats().cached_pages(), 8u);
}

// Raw bytes for a gRPC body.
grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer Serialized(const google::protobuf::MessageLite& msg) {
  return Bytes(msg.SerializeAsString());
}

// Calls unary `method` with `body` as its request, bypassing the stubs'
// serialization.
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method,
                          const grpc::ByteBuffer& body) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  grpc::ByteBuffer reply;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &body, &reply,
                 [&](grpc::Status s) { done.set_value(s); });
  return done.get_future().get();
}

// An unreadable request body is INVALID_ARGUMENT naming the message type and
// the body's size, with an ErrorDetail on field "request".
void ExpectUnreadable(const grpc::Status& grpc_status, const std::string& type,
                      size_t bytes, const std::string& what) {
  const absl::Status s = FromGrpcStatus(grpc_status);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
  EXPECT_EQ(s.message(), absl::StrCat("request body (", bytes,
                                      " bytes) is not a valid radixkv.v1.",
                                      type))
      << what;
  EXPECT_EQ(ErrorFieldOf(s), "request") << what;
  EXPECT_EQ(ErrorReasonOf(s), v1::ERROR_REASON_INVALID) << what;
}

// A request body that is not a valid serialized message, to any method
// (unary, each Session message, WatchEvents' request), is answered
// INVALID_ARGUMENT with its detail, counted in the metrics, and changes
// nothing.
TEST_F(ServerTest, UnreadableRequestBodiesAreInvalidArgument) {
  StartServer([](daemon::ServerOptions& o) { o.metrics_listen = "127.0.0.1:0"; });
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  Insert(session.id(), Tokens(16, 90));
  v1::Stats before = Stats();
  before.clear_uptime_seconds();
  const grpc::ByteBuffer garbage = Bytes("\xff\xff\xff");

  const std::vector<std::pair<std::string, std::string>> unary = {
      {"KvCache/Acquire", "AcquireRequest"},
      {"KvCache/Commit", "CommitRequest"},
      {"KvCache/Release", "ReleaseRequest"},
      {"KvCache/Match", "MatchRequest"},
      {"Admin/GetStats", "GetStatsRequest"},
      {"Admin/ListNamespaces", "ListNamespacesRequest"},
      {"Admin/DumpTree", "DumpTreeRequest"},
      {"Admin/Explain", "ExplainRequest"},
      {"Admin/Evict", "EvictRequest"},
      {"Admin/Clear", "ClearRequest"},
      {"Admin/ListSessions", "ListSessionsRequest"},
  };
  for (const auto& [method, type] : unary) {
    ExpectUnreadable(
        RawUnaryCall(channel_, absl::StrCat("/radixkv.v1.", method), garbage),
        type, 3, method);
  }

  // WatchEvents: its one request.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    const grpc::internal::RpcMethod method(
        "/radixkv.v1.Admin/WatchEvents",
        grpc::internal::RpcMethod::SERVER_STREAMING);
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
            channel_.get(), method, &ctx, garbage));
    grpc::ByteBuffer event;
    EXPECT_FALSE(reader->Read(&event));
    ExpectUnreadable(reader->Finish(), "WatchEventsRequest", 3, "WatchEvents");
  }

  // Session: an unreadable first message, and one after a good `open` (the
  // stream ends and its session closes).
  const grpc::internal::RpcMethod session_method(
      "/radixkv.v1.KvCache/Session", grpc::internal::RpcMethod::BIDI_STREAMING);
  for (const bool opened_first : {false, true}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream(grpc::internal::ClientReaderWriterFactory<
               grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(),
                                                           session_method, &ctx));
    grpc::ByteBuffer reply;
    if (opened_first) {
      v1::SessionRequest open;
      *open.mutable_open()->mutable_namespace_() = TestNamespace();
      open.mutable_open()->set_client_name("raw");
      ASSERT_TRUE(stream->Write(Serialized(open)));
      ASSERT_TRUE(stream->Read(&reply));
      v1::SessionResponse info;
      ASSERT_TRUE(grpc::SerializationTraits<v1::SessionResponse>::Deserialize(
                      &reply, &info)
                      .ok());
      ASSERT_TRUE(info.has_session());
      EXPECT_EQ(Stats().sessions(), 2u);
    }
    EXPECT_TRUE(stream->Write(Bytes("\xff\xff\xff\xff\xff")));
    while (stream->Read(&reply)) {
    }
    ExpectUnreadable(stream->Finish(), "SessionRequest", 5,
                     opened_first ? "Session, second message"
                                  : "Session, first message");
  }
  ASSERT_TRUE(WaitFor([&] { return Stats().sessions() == 1; }));

  v1::Stats after = Stats();
  after.clear_uptime_seconds();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, after))
      << "stats changed:\n" << before.DebugString() << "\nvs\n"
      << after.DebugString();

  const std::string text = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_FALSE(text.empty()) << "curl failed against " << server_->metrics_url();
  for (const auto& [method, type] : unary) {
    const std::string want = absl::StrCat(
        "radixkv_requests_total{code=\"INVALID_ARGUMENT\",method=\"",
        method.substr(method.find('/') + 1), "\"} 1\n");
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want;
  }
  for (const char* want :
       {"radixkv_requests_total{code=\"INVALID_ARGUMENT\",method=\"WatchEvents\"} 1\n",
        "radixkv_requests_total{code=\"INVALID_ARGUMENT\",method=\"Session\"} 2\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want;
  }

  // The daemon serves well-formed requests as before.
  EXPECT_TRUE(session.Heartbeat(7));
  EXPECT_EQ(MatchBlocks(TestNamespace(), Tokens(16, 90)), 4);
}

TEST_F(ServerTest, ConcurrentSessionsKeepInvariants) {
  StartServer([](daemon::ServerOptions& o) {
    o.pool = "none,pages=48";
    // Leases of one session pin shared prefixes many times over.
    o.cache.sessions.max_pinned_pages_per_session = 1 << 20;
  });
  constexpr int kThreads = 16;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::atomic<int> failures{0}, ops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SessionStream session(kv_.get(), TestNamespace());
      if (!session.ok()) {
        ++failures;
        return;
      }
      std::mt19937 rng(t);
      std::vector<std::pair<uint64_t, uint32_t>> held;  // lease, new blocks
      while (std::chrono::steady_clock::now() < until) {
        // Shared prefixes: a few prompt families of 1..6 blocks.
        const uint32_t family = rng() % 6;
        auto tokens = Tokens(4 * (1 + rng() % 6), family);
        const int action = rng() % 4;
        if (action < 2 || held.empty()) {
          v1::AcquireResponse a;
          grpc::Status s = Acquire(session.id(), tokens, true, &a);
          if (!s.ok()) {
            ++failures;
            continue;
          }
          if (a.lease_id() != 0) held.emplace_back(a.lease_id(), a.new_blocks());
        } else {
          const size_t i = rng() % held.size();
          const auto [lease, blocks] = held[i];
          held.erase(held.begin() + i);
          grpc::Status s;
          if (action == 2) {
            v1::CommitResponse c;
            s = Commit(session.id(), lease, blocks, true, &c);
          } else {
            s = Release(session.id(), lease);
          }
          if (!s.ok()) ++failures;
        }
        ++ops;
      }
      // Half the threads end cleanly, the other half leave their leases to
      // the session's end.
      if (t % 2 == 0) {
        for (const auto& [lease, blocks] : held) {
          if (!Release(session.id(), lease).ok()) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(ops.load(), kThreads);
  ASSERT_TRUE(WaitFor([&] {
    v1::Stats s = Stats();
    return s.sessions() == 0 && s.leases() == 0;
  }));
  v1::Stats s = Stats();
  EXPECT_EQ(s.writing_pages(), 0u);
  EXPECT_EQ(s.pinned_pages(), 0u);
  ExpectInvariants(s);
  EXPECT_TRUE(server_->cache().CheckInvariants().ok())
      << server_->cache().CheckInvariants();
}

}  // namespace
}  // namespace radixkv::testing
