#include "daemon/tiers/tier.h"

#include <xxhash.h>

namespace radixkv::daemon {

const TierKindInfo* TierKindInfoOfMedium(uint8_t medium) {
  for (const TierKindInfo& k : kTierKinds) {
    if (k.medium == medium) return &k;
  }
  return nullptr;
}

bool ParseTierKind(absl::string_view name, TierKind* out) {
  for (const TierKindInfo& k : kTierKinds) {
    if (name == k.name) {
      *out = k.kind;
      return true;
    }
  }
  return false;
}

uint64_t BlockChecksum(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}

}  // namespace radixkv::daemon
