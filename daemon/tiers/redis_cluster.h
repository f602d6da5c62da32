// File: daemon/tiers/redis_cluster.h
//
// RedisCluster: the remote tier's client of a Redis Cluster (or of one
// Redis server without cluster mode): commands pipelined per node and
// routed by hash slot, MOVED and ASK redirections followed, and every call
// bounded by a deadline.
//
//   RedisCluster c({.seeds = {{"10.0.0.5", 7000}}, .auth = {...}});
//   std::vector<RedisCluster::Result> out;
//   c.Run({{.argv = {"GET", key}, .key = key}}, absl::Now() + timeout, &out);
//
// Replies are decoded by hiredis's RESP reader; commands are written as
// RESP arrays, a block's value sent from where it is, not copied. The
// sockets are this file's own, non-blocking and polled against the
// deadline, so no call waits past it, with TLS through OpenSSL when asked. The slot map comes from CLUSTER
// SLOTS and is refreshed after a MOVED; a server with cluster support
// disabled serves every slot.
//
// Thread safety: not thread-safe; one thread uses a client at a time (the
// remote tier keeps one per thread that talks to the store).
#ifndef RADIXKV_DAEMON_TIERS_REDIS_CLUSTER_H_
#define RADIXKV_DAEMON_TIERS_REDIS_CLUSTER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace radixkv::daemon {

struct RedisEndpoint {
  std::string host;
  int port = 0;
  std::string ToString() const;  // host:port ([v6]:port)
  bool operator==(const RedisEndpoint& o) const {
    return host == o.host && port == o.port;
  }
};

// "host:port" or "[v6addr]:port", port 1..65535. INVALID_ARGUMENT naming
// the value otherwise.
absl::StatusOr<RedisEndpoint> ParseRedisEndpoint(absl::string_view s);

// Redis Cluster's key slot: CRC16 (XMODEM) of the key, or of its hash tag
// (the part between the first '{' and the next '}', when not empty),
// modulo 16384.
uint16_t RedisKeySlot(absl::string_view key);

// TLS to the store (null ctx: plain TCP). Peers are verified against the
// context's CA and the name: server_name when set, else the node's host
// (its IP address for an address).
struct RedisTls {
  std::shared_ptr<ssl_ctx_st> ctx;
  std::string server_name;
};

// A client TLS context: verifies the store against `ca_file` (PEM); with
// cert_file and key_file, presents that client certificate too.
// INVALID_ARGUMENT naming the file that cannot be used.
absl::StatusOr<std::shared_ptr<ssl_ctx_st>> MakeRedisTlsContext(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file);

struct RedisAuth {
  std::string user;      // empty: AUTH password (the default user)
  std::string password;  // empty: no AUTH
};

struct RedisReply {
  enum class Type : uint8_t { kNil, kString, kStatus, kError, kInteger, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

class RedisCluster {
 public:
  struct Options {
    std::vector<RedisEndpoint> seeds;  // at least one
    RedisAuth auth;
    RedisTls tls;
  };
  explicit RedisCluster(Options options);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  struct Command {
    std::vector<absl::string_view> argv;  // argv[0] is the command's name
    absl::string_view key;                // routes the command (its slot)
  };
  struct Result {
    absl::Status status;  // not OK: no reply (unreachable, deadline, ...)
    RedisReply reply;     // an error reply (-ERR ...) is a reply
  };

  // Runs `commands`, pipelined per node, until `deadline`; (*out)[i]
  // answers commands[i]. Redirections are followed (a few hops at most);
  // a node that fails closes its connection, and its commands get
  // UNAVAILABLE or DEADLINE_EXCEEDED naming the node.
  void Run(absl::Span<const Command> commands, absl::Time deadline,
           std::vector<Result>* out);

  // Connects to a seed (AUTH included) and loads the slot map. Errors:
  // UNAVAILABLE when no seed answers, PERMISSION_DENIED when one refuses
  // the credentials.
  absl::Status Connect(absl::Time deadline);

  // Whether the server(s) run in cluster mode (after a Connect or Run).
  bool cluster_mode() const { return cluster_mode_; }
  // Nodes known (seeds and the slot map's).
  size_t node_count() const { return nodes_.size(); }

 private:
  class Conn;
  struct Node {
    RedisEndpoint endpoint;
    std::unique_ptr<Conn> conn;  // null until first used, or after a failure
  };

  int NodeIndex(const RedisEndpoint& e);  // adds it when new
  absl::Status EnsureConnected(Node& node, absl::Time deadline);
  absl::Status RefreshSlots(absl::Time deadline);
  absl::Status LoadSlotsFrom(Node& node, absl::Time deadline);
  // One node's share of a Run: commands[idx[i]] (asking[i]: precede it
  // with ASKING), results into (*out)[idx[i]]. Send writes them all;
  // Receive reads their replies (every node is sent its share before any
  // reply is read, so the nodes work at once).
  absl::Status SendToNode(int node, absl::Span<const Command> commands,
                          const std::vector<size_t>& idx,
                          const std::vector<bool>& asking, absl::Time deadline);
  void ReceiveFromNode(int node, absl::Status sent,
                       const std::vector<size_t>& idx,
                       const std::vector<bool>& asking, absl::Time deadline,
                       std::vector<Result>* out);

  const Options options_;
  std::vector<Node> nodes_;
  std::array<int16_t, 16384> slot_node_;  // -1: unknown
  bool slots_loaded_ = false;
  bool cluster_mode_ = false;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_REDIS_CLUSTER_H_
