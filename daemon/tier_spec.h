// File: daemon/tier_spec.h
//
// --tier: the tier below the page pool that evicted blocks move to
// (docs/TIERS.md).
//
//   disk,path=DIR,bytes=SIZE[,io_threads=N][,demote=drop|wait]
//
// demote=drop (the default): an evicted block the tier cannot stage at once
// (its writes are behind) is dropped, a plain eviction; demote=wait
// (write-through): the Acquire that evicted blocks waits until the tier has
// written them (no tree lock held), so none is lost to a slow disk.
//
// A host tier (pinned host memory under a cuda pool) is named "host" and
// refused for now with a message saying so.
//
// Thread safety: pure functions.
#ifndef RADIXKV_DAEMON_TIER_SPEC_H_
#define RADIXKV_DAEMON_TIER_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace radixkv::daemon {

struct TierSpec {
  std::string path;     // an existing, writable directory
  uint64_t bytes = 0;   // the tier file's budget, > 0
  int io_threads = 2;   // 1..64
  bool wait_for_staging = false;  // demote=wait
};

// INVALID_ARGUMENT naming --tier and the bad key or value.
absl::StatusOr<TierSpec> ParseTierSpec(absl::string_view spec);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIER_SPEC_H_
