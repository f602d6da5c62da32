// File: radix/eviction_policy.h
//
// Which cached block the tree evicts when it needs a page
// (RadixTreeOptions::eviction_policy, radixkvd --eviction_policy).
//
//   lru        the least recently used unpinned leaf (ties: the deeper).
//   turn_duel  turn-aware bimodal insertion: a request's new blocks join
//              the recency list only for a share of requests that shrinks
//              with a strength theta and grows with how many turns the
//              conversation has had; the others wait on a probation stack
//              and go first. theta is picked by sampled shadow caches, one
//              per theta; theta = 0 is lru exactly, and the cache leaves
//              it only for a theta whose shadow scored better.
//
// Matched blocks always become most recently used. Every policy evicts
// only unpinned leaves, so a block's next use is never cut off by its
// parent's eviction.
//
// Each policy also says which evicted blocks are worth a write to the
// tiers below the pool (EvictedBlock::demote). lru: every one. turn_duel:
// every one but the probation blocks of requests that a second duel, for
// a cache of the pool and the tiers together
// (RadixTreeOptions::lower_tier_blocks), would not have admitted either;
// without tiers, or over tiers of unknown size, every one.
//
// turn_duel's state apart from the tree is in turn_duel.h (private).
#ifndef RADIXKV_RADIX_EVICTION_POLICY_H_
#define RADIXKV_RADIX_EVICTION_POLICY_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace radixkv {

enum class EvictionPolicy : uint8_t { kLru, kTurnDuel };

// "lru", "turn_duel".
const char* EvictionPolicyName(EvictionPolicy p);
// The policy named `name`; false when there is none.
bool ParseEvictionPolicy(absl::string_view name, EvictionPolicy* out);
// Every policy's name, comma separated, for help text and errors.
std::string EvictionPolicyNames();

}  // namespace radixkv

#endif  // RADIXKV_RADIX_EVICTION_POLICY_H_
