// File: daemon/tiers/open_tiers.h
//
// OpenTiers: the TierChain that --tier describes (tier_spec.h), its tiers
// opened for the pool's page size. The one place that maps a TierSpec's
// kind to the Tier implementation that serves it.
//
// Thread safety: a plain function (the tiers it opens are thread-safe).
#ifndef RADIXKV_DAEMON_TIERS_OPEN_TIERS_H_
#define RADIXKV_DAEMON_TIERS_OPEN_TIERS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/tiers/tier.h"
#include "daemon/tiers/tier_chain.h"
#include "daemon/tiers/tier_spec.h"
#include "gpu/pool.h"

namespace radixkv::daemon {

// One tier for `pool` (its backend, device and page_bytes); the tier's
// own Open errors.
absl::StatusOr<std::unique_ptr<Tier>> OpenTier(const TierSpec& spec,
                                               const gpu::PoolSpec& pool);

// Every tier of the flag value `spec`, top to bottom. INVALID_ARGUMENT
// naming --tier for a bad spec, a none pool or a pool without page_bytes.
absl::StatusOr<std::shared_ptr<TierChain>> OpenTiers(const std::string& spec,
                                                     const gpu::PoolSpec& pool);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_OPEN_TIERS_H_
