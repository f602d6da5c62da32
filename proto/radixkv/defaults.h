// File: proto/radixkv/defaults.h
//
// Defaults shared by radixkvd, the client library and radixkvctl, so that all
// of them find each other with no flags.
//
// Thread safety: pure functions.
#ifndef RADIXKV_PROTO_RADIXKV_DEFAULTS_H_
#define RADIXKV_PROTO_RADIXKV_DEFAULTS_H_

#include <string>

namespace radixkv {

// The system daemon's directory: systemd's RuntimeDirectory=radixkv and the
// Kubernetes DaemonSet's hostPath. Its socket is <dir>/radixkvd.sock.
inline constexpr char kSystemRuntimeDir[] = "/run/radixkv";

// The per-user gRPC socket: $XDG_RUNTIME_DIR/radixkv/radixkvd.sock when
// XDG_RUNTIME_DIR is set, else /tmp/radixkv-<uid>/radixkvd.sock.
std::string UserSocketPath();

// Where clients (the client libraries, radixkvctl, radixkv-worker) look for
// the daemon when no endpoint is given: <system_dir>/radixkvd.sock when that
// socket exists (a system daemon runs), else UserSocketPath().
std::string DefaultSocketPath(const std::string& system_dir = kSystemRuntimeDir);

// Where radixkvd listens when --socket is not given: <system_dir>/
// radixkvd.sock when that directory exists and this process may create
// files in it (the system daemon), else UserSocketPath(). So a daemon and
// its clients meet at the same default in either deployment.
std::string DaemonDefaultSocketPath(
    const std::string& system_dir = kSystemRuntimeDir);

// Why a client cannot reach a Unix-socket gRPC target, in words: for
// "unix:PATH", connects to PATH and returns "" when that works, else
// "cannot connect to unix:PATH: <the OS error>", adding, when no endpoint
// was given (`defaulted`) and <system_dir> exists but this user cannot
// enter it, that the system daemon's socket is behind it (so the per-user
// path was tried instead). Other targets: "". Never blocks beyond a
// connect() to a local socket.
std::string ConnectProblem(const std::string& target, bool defaulted,
                           const std::string& system_dir = kSystemRuntimeDir);

// The attach socket beside a gRPC socket: "<dir>/<name>.attach" with a
// trailing ".sock" of <name> replaced (radixkvd.sock -> radixkvd.attach.sock).
std::string AttachSocketPathFor(const std::string& grpc_socket_path);

// gRPC target for a socket path ("unix:" + path).
std::string UnixTarget(const std::string& socket_path);

inline constexpr char kDefaultMetricsListen[] = "127.0.0.1:9464";

// Most lease ids one AcquireRequest.release_leases may carry.
inline constexpr int kMaxReleaseLeasesPerAcquire = 64;

}  // namespace radixkv

#endif  // RADIXKV_PROTO_RADIXKV_DEFAULTS_H_
