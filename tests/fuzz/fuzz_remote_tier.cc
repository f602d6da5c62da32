// libFuzzer harness for what the remote tier takes from outside: values
// read from the shared store (RemoteTier::CheckValue: any bytes, from a
// store anyone with its credentials can write), --tier specs
// (ParseTierSpecs) and store addresses (ParseRedisEndpoint). The first
// byte picks the parser. Checked: no crash or sanitizer report; a value
// accepted is the block asked for, of the page size, and re-encodes to the
// same bytes; an endpoint accepted prints to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "daemon/tiers/redis_cluster.h"
#include "daemon/tiers/remote_tier.h"
#include "daemon/tiers/tier_spec.h"

namespace {

using radixkv::BlockKey;
using namespace radixkv::daemon;  // NOLINT: a harness

void Require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      // The key and root the seed value was made for (corpus/...); the page
      // is 64 bytes.
      const BlockKey root{0x1111, 0x2222};
      const BlockKey key{0x3333, 0x4444};
      TierBlock b;
      absl::string_view d;
      if (RemoteTier::CheckValue(in, root, key, 64, &b, &d) ==
          RemoteTier::Check::kOk) {
        Require(d.size() == 64 && b.key == key && b.root == root);
        Require(RemoteTier::EncodeValue(b, d.data(), d.size()) == in);
      }
      break;
    }
    case 1: {
      auto specs = ParseTierSpecs(in);
      if (specs.ok()) {
        Require(!specs->empty() && specs->size() <= std::size(kTierKinds));
        for (const TierSpec& t : *specs) {
          if (t.kind == TierKind::kRemote) {
            Require(!t.addrs.empty() && t.writers >= 1 && t.writers <= 16);
          }
        }
      }
      break;
    }
    default: {
      auto e = ParseRedisEndpoint(in);
      if (e.ok()) {
        Require(e->port >= 1 && e->port <= 65535);
        auto again = ParseRedisEndpoint(e->ToString());
        Require(again.ok() && *again == *e);
      }
      (void)RedisKeySlot(in);
      break;
    }
  }
  return 0;
}
