#include "daemon/server.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/admin_service.h"
#include "daemon/kv_service.h"
#include "daemon/log.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "radix/status_macros.h"
#include "radixkv/defaults.h"

namespace radixkv::daemon {
namespace {

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

// The options' own checks (flags named), and the parsed pool spec.
absl::StatusOr<gpu::PoolSpec> CheckOptions(const ServerOptions& options) {
  if (options.socket_path.empty() && options.listen_tcp.empty()) {
    return absl::InvalidArgumentError(
        "--socket, --listen_tcp: at least one listening address is needed");
  }
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
    return absl::InvalidArgumentError(
        absl::StrCat("--pool ", options.pool, ": ", pool.status().message()));
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
        "--pool ", options.pool, ": cannot be served here: ",
        usable.message()));
  }
  if (pool->backend == gpu::Backend::kNone &&
      pool->pages > options.cache.max_pool_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool ", options.pool, ": pages=", pool->pages,
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
  CacheOptions copts = options_.cache;
  copts.pool = pool;
  if (options_.attach && !options_.socket_path.empty() &&
      pool.backend != gpu::Backend::kNone) {
    attach_path_ = AttachSocketPathFor(options_.socket_path);
  }
  copts.attach_socket = attach_path_;
  cache_ = std::make_unique<Cache>(copts);

  metrics_ = std::make_unique<Metrics>(cache_.get());
  if (!options_.metrics_listen.empty()) {
    RETURN_IF_ERROR(metrics_->Serve(options_.metrics_listen));
  }
  if (!options_.socket_path.empty()) {
    RETURN_IF_ERROR(ClaimSocketPath(options_.socket_path));
  }

  ServiceEnv env{cache_.get(), metrics_.get(), &draining_};
  kv_service_ = std::make_unique<KvService>(env);
  admin_service_ = std::make_unique<AdminService>(env);

  RETURN_IF_ERROR(StartGrpc());
  if (!options_.listen_tcp.empty() && tcp_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen_tcp ", options_.listen_tcp, ": cannot bind"));
  }
  if (!options_.socket_path.empty() &&
      chmod(options_.socket_path.c_str(), 0660) != 0) {
    return absl::InternalError(absl::StrCat(
        "--socket ", options_.socket_path, ": chmod 0660: ", ErrnoText(errno)));
  }
  if (!attach_path_.empty()) {
    AttachServer::Options aopts;
    aopts.path = attach_path_;
    aopts.allowed_gids = options_.attach_allowed_gids;
    Cache* cache = cache_.get();
    ASSIGN_OR_RETURN(attach_server_,
                     AttachServer::Start(aopts, [cache](absl::string_view id) {
                       return cache->PoolForSession(id);
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
  if (!options_.socket_path.empty()) {
    builder.AddListeningPort(UnixTarget(options_.socket_path),
                             grpc::InsecureServerCredentials());
  }
  if (!options_.listen_tcp.empty()) {
    builder.AddListeningPort(options_.listen_tcp,
                             grpc::InsecureServerCredentials(), &tcp_port_);
  }
  builder.RegisterService(kv_service_.get());
  builder.RegisterService(admin_service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
  if (options_.interceptors) {
    builder.experimental().SetInterceptorCreators(options_.interceptors());
  }
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
        options_.socket_path.empty() ? "" : UnixTarget(options_.socket_path),
        options_.socket_path.empty() || options_.listen_tcp.empty() ? "" : " and ",
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
  if (metrics_ != nullptr) metrics_->StopServing();
  if (grpc_server_ != nullptr) {
    if (auto* health = grpc_server_->GetHealthCheckService()) {
      health->Shutdown();  // everything reports NOT_SERVING from now on
    }
  }
  if (kv_service_ != nullptr) kv_service_->Shutdown();
  if (cache_ != nullptr) cache_->events().Shutdown();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() +
                           absl::ToChronoMilliseconds(grace));
    grpc_server_->Wait();
    grpc_server_.reset();
  }
  attach_server_.reset();
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
