// File: daemon/tiers/tier_spec.h
//
// --tier: the tiers below the page pool that evicted blocks move to
// (docs/TIERS.md), top to bottom, separated by ';':
//
//   host,bytes=SIZE
//   disk,path=DIR,bytes=SIZE[,io_threads=N][,demote=drop|wait]
//   host,bytes=SIZE;disk,path=DIR,bytes=SIZE[,...]
//
// A host tier is host memory (pinned under a cuda pool); a disk tier is one
// file in DIR. At most one of each, the host tier first.
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
#include "daemon/tiers/tier.h"

namespace radixkv::daemon {

struct TierSpec {
  using Kind = TierKind;
  Kind kind = Kind::kDisk;
  uint64_t bytes = 0;   // the tier's budget, > 0
  std::string path;     // disk: an existing, writable directory
  int io_threads = 2;   // disk: 1..64
  bool wait_for_staging = false;  // disk: demote=wait
};

// The tiers, top to bottom. INVALID_ARGUMENT naming --tier and the bad
// key, value or order.
absl::StatusOr<std::vector<TierSpec>> ParseTierSpecs(absl::string_view spec);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_TIER_SPEC_H_
