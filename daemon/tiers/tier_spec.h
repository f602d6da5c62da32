// File: daemon/tiers/tier_spec.h
//
// --tier: the tiers below the page pool that evicted blocks move to
// (docs/TIERS.md), top to bottom, separated by ';':
//
//   host,bytes=SIZE
//   disk,path=DIR,bytes=SIZE[,io_threads=N][,demote=drop|wait]
//   host,bytes=SIZE;disk,path=DIR,bytes=SIZE[,...]
//   remote,addr=HOST:PORT[,addr=HOST:PORT...][,prefix=P][,user=U]
//         [,password_file=FILE][,timeout=DUR][,ttl=DUR][,queue=SIZE]
//         [,writers=N][,breaker_failures=N][,breaker_cooldown=DUR]
//         [,write=evicted|all][,tls=on][,tls_ca=FILE][,tls_cert=FILE]
//         [,tls_key=FILE][,tls_name=NAME]
//
// A host tier is host memory (pinned under a cuda pool); a disk tier is one
// file in DIR; a remote tier is a Redis Cluster (or server) that the fleet
// shares (remote_tier.h). At most one of each, in the order host, disk,
// remote.
//
// demote=drop (the default): an evicted block the disk tier cannot stage at
// once (its writes are behind) is dropped, a plain eviction; demote=wait
// (write-through): the Acquire that evicted blocks waits until the tier has
// written them (no tree lock held), so none is lost to a slow disk.
//
// Thread safety: pure functions.
#ifndef RADIXKV_DAEMON_TIERS_TIER_SPEC_H_
#define RADIXKV_DAEMON_TIERS_TIER_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/tiers/redis_cluster.h"
#include "daemon/tiers/tier.h"

namespace radixkv::daemon {

struct TierSpec {
  using Kind = TierKind;
  Kind kind = Kind::kDisk;
  uint64_t bytes = 0;   // the tier's budget, > 0
  std::string path;     // disk: an existing, writable directory
  int io_threads = 2;   // disk: 1..64
  bool wait_for_staging = false;  // disk: demote=wait
  // remote:
  std::vector<RedisEndpoint> addrs;  // addr=, at least one
  std::string prefix = "rkv";        // 1..64 of [A-Za-z0-9_.-]
  std::string user;                  // AUTH user (default: the default user)
  std::string password_file;         // AUTH password: the file's first line
  absl::Duration timeout = absl::Milliseconds(100);  // > 0, <= 60 s
  absl::Duration ttl = absl::ZeroDuration();         // 0: none
  uint64_t queue_bytes = 64ull << 20;                // staged writes, > 0
  int writers = 2;                                   // 1..16
  int breaker_failures = 5;                          // 1..1000
  absl::Duration breaker_cooldown = absl::Seconds(5);  // > 0
  bool write_all = false;                              // write=all|evicted
  // TLS (tls=on, or any tls_ key): the CA file (default: the system's),
  // a client certificate and key, the name to verify (default: the host).
  bool tls = false;
  std::string tls_ca, tls_cert, tls_key, tls_name;
};

// The tiers, top to bottom. INVALID_ARGUMENT naming --tier and the bad
// key, value or order.
absl::StatusOr<std::vector<TierSpec>> ParseTierSpecs(absl::string_view spec);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_TIER_SPEC_H_
