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

size_t Tier::CountPresentIn(const BlockKey& root,
                            absl::Span<const BlockKey> keys) const {
  const size_t n = CountPresent(keys);
  for (size_t i = 0; i < n; ++i) {
    TierBlock b;
    if (!Lookup(keys[i], &b) || !(b.root == root)) return i;
  }
  return n;
}

size_t Tier::TakeIn(const BlockKey& root, absl::Span<const BlockKey> keys,
                    absl::Span<const uint64_t> pages, PageMover& mover,
                    std::vector<TierMove>* moves) {
  const size_t n = CountPresentIn(root, keys);
  return n == 0 ? 0 : Take(keys.first(n), pages, mover, moves);
}

}  // namespace radixkv::daemon
