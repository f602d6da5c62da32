#include "radix/eviction_policy.h"

#include <vector>

#include "absl/strings/str_join.h"

namespace radixkv {
namespace {

struct PolicyRow {
  EvictionPolicy policy;
  const char* name;
};
constexpr PolicyRow kPolicies[] = {
    {EvictionPolicy::kLru, "lru"},
    {EvictionPolicy::kTurnDuel, "turn_duel"},
};

}  // namespace

const char* EvictionPolicyName(EvictionPolicy p) {
  for (const PolicyRow& r : kPolicies) {
    if (r.policy == p) return r.name;
  }
  return "unknown";
}

bool ParseEvictionPolicy(absl::string_view name, EvictionPolicy* out) {
  for (const PolicyRow& r : kPolicies) {
    if (name == r.name) {
      *out = r.policy;
      return true;
    }
  }
  return false;
}

std::string EvictionPolicyNames() {
  std::vector<const char*> names;
  for (const PolicyRow& r : kPolicies) names.push_back(r.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace radixkv
