#include "daemon/rpc/server.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "daemon/rpc/admin_service.h"
#include "daemon/rpc/kv_service.h"
#include "base/log.h"
#include "daemon/tiers/open_tiers.h"
#include "daemon/rpc/unix_listener.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "base/status_macros.h"
#include "radixkv/defaults.h"

namespace radixkv::daemon {
namespace {

// Lives as long as its call: counts the calls gRPC holds, so that Shutdown
// waits for calls, not for connections that carry none (idle clients).
class CallCounter final : public grpc::experimental::Interceptor {
 public:
  explicit CallCounter(std::atomic<int64_t>* calls) : calls_(calls) {
    calls_->fetch_add(1, std::memory_order_relaxed);
  }
  ~CallCounter() override { calls_->fetch_sub(1, std::memory_order_release); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    m->Proceed();
  }

 private:
  std::atomic<int64_t>* const calls_;
};

class CallCounterFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(std::atomic<int64_t>* calls) : calls_(calls) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new CallCounter(calls_);
  }

 private:
  std::atomic<int64_t>* const calls_;
};

std::string ErrnoText(int err) { return std::strerror(err); }

// Creates the socket's parent directory (0700) when it is missing.
absl::Status EnsureParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  const std::string dir = path.substr(0, slash);
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--socket ", path, ": ", dir, " is not a directory"));
    }
    return absl::OkStatus();
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--socket ", path, ": cannot create directory ", dir, ": ",
        ErrnoText(errno)));
  }
  return absl::OkStatus();
}

// Removes a stale socket file; refuses when a live process answers on it.
absl::Status ClaimSocketPath(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--socket ", path, ": path is ", path.size(),
        " bytes; Unix socket paths must be shorter than ",
        sizeof(addr.sun_path), " bytes"));
  }
  RETURN_IF_ERROR(EnsureParentDir(path));
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();  // free
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--socket ", path, ": exists and is not a socket; refusing to remove it"));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket(): ", ErrnoText(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(fd);
  if (rc == 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "--socket ", path, ": another radixkvd is already listening there; "
        "stop it first or pass another --socket"));
  }
  if (err != ECONNREFUSED && err != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--socket ", path, ": cannot probe the existing socket: ",
        ErrnoText(err)));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--socket ", path, ": cannot remove the stale socket: ",
        ErrnoText(errno)));
  }
  Log(LogLevel::kInfo, absl::StrCat("removed stale socket ", path));
  return absl::OkStatus();
}

int ToMillis(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms);
}

// The TCP listener's transport security: TLS (mTLS with a client CA) from
// PEM files, or plaintext with --insecure_tcp.
absl::Status CheckTcpSecurity(const ServerOptions& options) {
  const bool tls = !options.tls_cert.empty() || !options.tls_key.empty();
  if (tls && (options.tls_cert.empty() || options.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--tls_cert, --tls_key: give both (PEM certificate chain and its key)");
  }
  if (!options.tls_client_ca.empty() && !tls) {
    return absl::InvalidArgumentError(
        "--tls_client_ca: needs --tls_cert and --tls_key");
  }
  if (tls && options.insecure_tcp) {
    return absl::InvalidArgumentError(
        "--insecure_tcp: contradicts --tls_cert/--tls_key; choose one");
  }
  if (tls && options.listen_tcp.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert, --tls_key: only apply to --listen_tcp, which is not set");
  }
  if (!options.listen_tcp.empty() && !tls && !options.insecure_tcp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen_tcp=", options.listen_tcp, ": needs --tls_cert and "
        "--tls_key (add --tls_client_ca for client certificates), or "
        "--insecure_tcp to serve plaintext that anyone who reaches the port "
        "may use"));
  }
  for (const std::string* f :
       {&options.tls_cert, &options.tls_key, &options.tls_client_ca}) {
    if (!f->empty() && access(f->c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          f == &options.tls_cert  ? "--tls_cert="
          : f == &options.tls_key ? "--tls_key="
                                  : "--tls_client_ca=",
          *f, ": cannot be read: ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read"));
  return ss.str();
}

std::shared_ptr<grpc::ServerCredentials> TcpCredentials(
    const ServerOptions& o, absl::Status* error) {
  if (o.insecure_tcp) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      o.tls_client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  absl::StatusOr<std::string> cert = ReadFile(o.tls_cert);
  absl::StatusOr<std::string> key = ReadFile(o.tls_key);
  if (!cert.ok() || !key.ok()) {
    *error = !cert.ok() ? cert.status() : key.status();
    return nullptr;
  }
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(o.tls_client_ca);
    if (!ca.ok()) {
      *error = ca.status();
      return nullptr;
    }
    ssl.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(ssl);
}

// The options' own checks (flags named), and the parsed pool spec.
absl::StatusOr<gpu::PoolSpec> CheckOptions(const ServerOptions& options) {
  if (options.socket_path.empty() && options.listen_tcp.empty()) {
    return absl::InvalidArgumentError(
        "--socket, --listen_tcp: at least one listening address is needed");
  }
  RETURN_IF_ERROR(CheckTcpSecurity(options));
  if (options.keepalive_time <= absl::ZeroDuration() ||
      options.keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--keepalive_time, --keepalive_timeout: must be positive");
  }
  if (options.max_receive_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        "--max_receive_message_bytes: must be positive");
  }
  if (options.cache.event_buffer == 0) {
    return absl::InvalidArgumentError("--event_buffer: must be at least 1");
  }
  if (options.cache.sessions.lease_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--lease_ttl: must be positive");
  }
  absl::StatusOr<gpu::PoolSpec> pool = gpu::ParsePoolSpec(options.pool);
  if (!pool.ok()) {
    // ParsePoolSpec's messages name the flag ("--pool: ..."); here it is
    // named once, with its value.
    absl::string_view why = pool.status().message();
    absl::ConsumePrefix(&why, "--pool: ");
    return absl::InvalidArgumentError(
        absl::StrCat("--pool=", options.pool, ": ", why));
  }
  if (options.cache.max_pool_pages == 0 ||
      options.cache.max_pool_pages >= kNoPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_pool_pages=", options.cache.max_pool_pages,
                     ": must be in 1..", kNoPage - 1));
  }
  // A pool this machine cannot serve is a configuration error, found now
  // rather than by every session open.
  if (absl::Status usable = gpu::CheckPoolUsable(*pool); !usable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool=", options.pool, ": cannot be served here: ",
        usable.message()));
  }
  if (pool->backend == gpu::Backend::kNone &&
      pool->pages > options.cache.max_pool_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool=", options.pool, ": pages=", pool->pages,
        " exceeds --max_pool_pages=", options.cache.max_pool_pages));
  }
  return pool;
}

}  // namespace

Server::Server(const ServerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server(options));
  absl::Status s = server->Init();
  if (!s.ok()) {
    server->Shutdown(absl::ZeroDuration());
    return s;
  }
  return server;
}

absl::Status Server::Init() {
  ASSIGN_OR_RETURN(gpu::PoolSpec pool, CheckOptions(options_));
  AccessOptions access = options_.access;
  access.self_uid = geteuid();
  ASSIGN_OR_RETURN(policy_, AccessPolicy::Create(access));
  CacheOptions copts = options_.cache;
  copts.pool = pool;
  if (options_.attach && !options_.socket_path.empty() &&
      pool.backend != gpu::Backend::kNone) {
    attach_path_ = AttachSocketPathFor(options_.socket_path);
  }
  copts.attach_socket = attach_path_;
  if (!options_.tier.empty()) {
    ASSIGN_OR_RETURN(copts.tiers, OpenTiers(options_.tier, pool));
  }
  if (policy_->accounts() > 1) {
    // Account 0 (the daemon's own calls) has no name and no limits.
    copts.account_names.assign(1, "");
    copts.account_limits.assign(1, AccountLimits{});
    for (const Tenant& t : policy_->tenants()) {
      copts.account_names.push_back(t.name);
      copts.account_limits.push_back({.max_pages = t.max_cached_pages,
                                      .max_pinned_pages = t.max_pinned_pages,
                                      .weight = t.weight,
                                      .max_pin_pages = t.max_pin_pages});
    }
  }
  cache_ = std::make_unique<Cache>(copts);
  if (!options_.kv_events.endpoint.empty()) {
    // Attached before any namespace binds, so it sees every tree event.
    KvEventsOptions kopts = options_.kv_events;
    kopts.encode.medium = pool.backend == gpu::Backend::kCuda ? "GPU" : "CPU";
    // A host tier below a host pool is host memory too, but not the
    // pool's: it gets a medium of its own.
    kopts.encode.pool_is_host = pool.backend != gpu::Backend::kCuda;
    const Cache* cache = cache_.get();
    auto lora = [cache](const BlockKey& root) -> std::string {
      v1::ListNamespacesResponse resp;
      cache->ListNamespaces(&resp, Caller::Daemon());
      for (const v1::NamespaceEntry& e : resp.namespaces()) {
        if (e.namespace_id() == root.ToCanonical()) return e.namespace_().lora();
      }
      return "";
    };
    ASSIGN_OR_RETURN(kv_events_, KvEventPublisher::Start(kopts, lora));
    cache_->events().SetForward(kv_events_.get());
    cache_->events().SetTierForward(kv_events_.get());
  }

  metrics_ = std::make_unique<Metrics>(cache_.get());
  if (!options_.metrics_listen.empty()) {
    RETURN_IF_ERROR(metrics_->Serve(options_.metrics_listen));
  }
  if (!options_.socket_path.empty()) {
    RETURN_IF_ERROR(ClaimSocketPath(options_.socket_path));
  }

  ServiceEnv env{cache_.get(), metrics_.get(), &draining_, policy_.get(),
                 &peers_};
  kv_service_ = std::make_unique<KvService>(env);
  admin_service_ =
      std::make_unique<AdminService>(env, options_.max_watch_streams);

  RETURN_IF_ERROR(StartGrpc());
  if (!options_.listen_tcp.empty() && tcp_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen_tcp ", options_.listen_tcp, ": cannot bind"));
  }
  if (!options_.socket_path.empty()) {
    ASSIGN_OR_RETURN(unix_listener_,
                     UnixListener::Start(options_.socket_path, 0660, &peers_,
                                         grpc_server_.get()));
  }
  if (options_.insecure_tcp) {
    Log(LogLevel::kWarning,
        absl::StrCat("--insecure_tcp: ", options_.listen_tcp,
                     " serves plaintext gRPC without authentication: anyone "
                     "who reaches it can use the cache (never as an "
                     "administrator); use --tls_cert/--tls_key/--tls_client_ca"));
  }
  if (!attach_path_.empty()) {
    AttachServer::Options aopts;
    aopts.path = attach_path_;
    aopts.allowed_gids = options_.attach_allowed_gids;
    aopts.max_pending_per_uid = options_.attach_max_pending_per_uid;
    Cache* cache = cache_.get();
    ASSIGN_OR_RETURN(
        attach_server_,
        AttachServer::Start(aopts, [cache](absl::string_view id,
                                           const gpu::PeerCredentials& peer) {
          return cache->PoolForAttach(id, peer);
        }));
  }
  metrics_->MarkReady();
  return absl::OkStatus();
}

absl::Status Server::StartGrpc() {
  // Keeps health.pb.o (the grpc.health.v1 descriptors) in the link, so
  // reflection can describe the health service.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // The Unix socket is accepted by UnixListener (for peer credentials) and
  // handed to this server connection by connection.
  if (!options_.listen_tcp.empty()) {
    absl::Status creds_error;
    std::shared_ptr<grpc::ServerCredentials> creds =
        TcpCredentials(options_, &creds_error);
    if (creds == nullptr) return creds_error;
    builder.AddListeningPort(options_.listen_tcp, creds, &tcp_port_);
  }
  builder.RegisterService(kv_service_.get());
  builder.RegisterService(admin_service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<CallCounterFactory>(&calls_));
  if (options_.interceptors) {
    for (auto& i : options_.interceptors()) interceptors.push_back(std::move(i));
  }
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             ToMillis(options_.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             ToMillis(options_.keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Let clients ping as often as every second without being disconnected.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot bind gRPC on ",
        options_.listen_tcp, " (address in use or not permitted)"));
  }
  if (auto* health = grpc_server_->GetHealthCheckService()) {
    health->SetServingStatus(v1::KvCache::service_full_name(), true);
    health->SetServingStatus(v1::Admin::service_full_name(), true);
  }
  return absl::OkStatus();
}

void Server::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  draining_.store(true, std::memory_order_release);
  if (metrics_ != nullptr) metrics_->MarkStopping();
  if (grpc_server_ != nullptr) {
    if (auto* health = grpc_server_->GetHealthCheckService()) {
      health->Shutdown();  // everything reports NOT_SERVING from now on
    }
  }
  unix_listener_.reset();  // no new connections
  if (kv_service_ != nullptr) kv_service_->Shutdown();
  if (cache_ != nullptr) cache_->events().Shutdown();
  if (grpc_server_ != nullptr) {
    // Calls in flight may finish within `grace`; once none is left, gRPC
    // stops at once, closing connections that carry no call (an idle
    // client's) instead of waiting out the grace for them.
    const absl::Time deadline = absl::Now() + grace;
    while (calls_.load(std::memory_order_acquire) > 0 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    grpc_server_->Shutdown(std::chrono::system_clock::now());
    grpc_server_->Wait();
    grpc_server_.reset();
  }
  // No request runs now: the pool's pages hold still while they are read.
  if (cache_ != nullptr && cache_->has_tiers() &&
      options_.drain_timeout > absl::ZeroDuration()) {
    const absl::Time start = absl::Now();
    const TierChain::DrainResult d =
        cache_->DrainTiers(start + options_.drain_timeout);
    Log(d.left == 0 ? LogLevel::kInfo : LogLevel::kWarning,
        absl::StrCat("drain: ", d.drained,
                     " blocks of the pool and host tier written to the disk "
                     "tier, ", d.left, " left behind, in ",
                     absl::FormatDuration(absl::Now() - start),
                     " (--drain_timeout=",
                     absl::FormatDuration(options_.drain_timeout), ")"));
  }
  if (metrics_ != nullptr) metrics_->StopServing();
  attach_server_.reset();
  if (kv_events_ != nullptr) kv_events_->Stop();  // publishes what is queued
  metrics_.reset();
}

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  admin_service_.reset();
  kv_service_.reset();
  cache_.reset();
}

int Server::metrics_port() const {
  return metrics_ == nullptr ? 0 : metrics_->port();
}

std::string Server::metrics_url() const {
  if (options_.metrics_listen.empty() || metrics_port() == 0) return "";
  const size_t colon = options_.metrics_listen.rfind(':');
  const std::string host = colon == std::string::npos
                               ? options_.metrics_listen
                               : options_.metrics_listen.substr(0, colon);
  return absl::StrCat("http://", host, ":", metrics_port(), "/metrics");
}

}  // namespace radixkv::daemon
