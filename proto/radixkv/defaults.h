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

// The per-user gRPC socket: $XDG_RUNTIME_DIR/radixkv/radixkvd.sock when
// XDG_RUNTIME_DIR is set, else /tmp/radixkv-<uid>/radixkvd.sock.
std::string DefaultSocketPath();

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
