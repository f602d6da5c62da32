// File: radix/radix_tree_pin.cc
//
// RadixTree's prefix pins: PinPrefix, Unpin, ListPins. A pin is a lease
// record (radix_tree_internal.h) with prefix_pin set, owner kPinOwner and
// no expiry, that pins its path and owns no WRITING page; EraseLease ends
// it like any lease, so reference counts, the recency lists and
// CheckInvariants need nothing of their own for pins.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "radix/radix_tree.h"
#include "radix/radix_tree_internal.h"
#include "radix/refusal.h"
#include "base/status_macros.h"

namespace radixkv {

using radix_internal::Lease;
using radix_internal::ResolvedPrompt;

namespace {

// Account `a`'s weighted share of a pool of `capacity` pages.
uint64_t Share(const std::vector<radix_internal::Account>& accounts,
               uint32_t a, uint32_t capacity) {
  uint64_t weights = 0;
  for (const radix_internal::Account& x : accounts) weights += x.limits.weight;
  // capacity < 2^32 and weight < 2^32: the product fits.
  return uint64_t{capacity} * accounts[a].limits.weight / weights;
}

}  // namespace

uint64_t RadixTree::Impl::PinLimitLocked(uint32_t account) const {
  const uint64_t share = Share(accounts, account, capacity);
  const uint64_t quota = accounts[account].limits.max_pin_pages;
  return quota != 0 ? std::min(quota, share) : share;
}

uint64_t RadixTree::PinLimit(uint32_t account) const {
  ReaderMutexLock lock(&impl_->mu);
  return impl_->PinLimitLocked(account);
}

PinInfo RadixTree::Impl::PinInfoOf(LeaseId id, const Lease& lease) const {
  PinInfo info;
  info.id = id;
  info.ns = lease.ns;
  info.account = namespaces[lease.ns].account;
  info.total_blocks = lease.pin_blocks;
  info.pinned_blocks = static_cast<uint32_t>(lease.path.size());
  if (!lease.path.empty()) info.last_key = nodes[lease.path.back()].key;
  info.created = lease.created;
  return info;
}

absl::StatusOr<PinInfo> RadixTree::PinPrefix(
    NamespaceId ns, absl::Span<const BlockKey> keys,
    absl::Span<const uint32_t> tokens) {
  Impl& m = *impl_;
  ResolvedPrompt prompt;
  if (keys.empty() && !tokens.empty()) {
    ASSIGN_OR_RETURN(prompt,
                     m.ResolveTokens(ns, tokens, /*stop_at_missing=*/true));
  } else {
    prompt.keys = keys;
    prompt.tokens = tokens;
    prompt.total_blocks = static_cast<uint32_t>(keys.size());
  }
  const absl::Time created = absl::Now();
  WriterMutexLock lock(&m.mu);
  RETURN_IF_ERROR(
      m.ValidateRequest("PinPrefix", ns, prompt.keys, prompt.tokens));
  std::vector<PageId> path;
  uint32_t collisions = 0;
  m.MatchPath(ns, prompt.keys, prompt.tokens, prompt.known_pages,
              prompt.known_epoch, &path, &collisions);
  if (path.empty()) {
    return Refuse(absl::StatusCode::kFailedPrecondition,
                  {.reason = Refusal::kPinNothingCached,
                   .limit = prompt.total_blocks},
                  absl::StrCat("none of the prompt's ", prompt.total_blocks,
                               " blocks is cached; nothing to pin"));
  }
  const uint32_t account_id = m.namespaces[ns].account;
  radix_internal::Account& account = m.accounts[account_id];
  const uint64_t after = account.pin_pages + path.size();
  const uint64_t share = Share(m.accounts, account_id, m.capacity);
  const uint64_t quota = account.limits.max_pin_pages;
  if (quota != 0 && quota <= share && after > quota) {
    return Refuse(absl::StatusCode::kResourceExhausted,
                  {.reason = Refusal::kPinQuota, .held = after, .limit = quota},
                  absl::StrCat("the account's pins would hold ", after,
                               " pages, its max_pin_pages is ", quota));
  }
  if (after > share) {
    return Refuse(absl::StatusCode::kResourceExhausted,
                  {.reason = Refusal::kPinFairShare,
                   .held = after,
                   .limit = share},
                  absl::StrCat("the account's pins would hold ", after,
                               " pages, its weighted share of the pool is ",
                               share));
  }
  const uint32_t now = m.NowSeconds();
  PageId parent = kNoPage;
  for (PageId p : path) {
    m.Pin(p, now);
    m.SetHotChild(ns, parent, p);
    parent = p;
  }
  Lease lease;
  lease.owner = kPinOwner;
  lease.ns = ns;
  lease.prefix_pin = true;
  lease.matched = static_cast<uint32_t>(path.size());
  lease.pin_blocks = prompt.total_blocks;
  lease.held = path.size();
  lease.path = std::move(path);
  lease.created = created;
  const LeaseId id = m.next_lease++;
  Impl::OwnerCount& c = m.owner_leases[kPinOwner];
  ++c.leases;
  c.pages += lease.held;
  ++account.pins;
  account.pin_pages += lease.held;
  ++m.namespaces[ns].leases;
  auto it = m.leases.emplace(id, std::move(lease)).first;
  return m.PinInfoOf(id, it->second);
}

absl::Status RadixTree::Unpin(PinId id) {
  Impl& m = *impl_;
  WriterMutexLock lock(&m.mu);
  auto it = m.leases.find(id);
  if (it == m.leases.end() || !it->second.prefix_pin) {
    return Refuse(absl::StatusCode::kNotFound,
                  {.reason = Refusal::kPinUnknown, .lease = id},
                  absl::StrCat("no pin ", id));
  }
  m.EraseLease(it);
  m.FlushEvents();
  return absl::OkStatus();
}

bool RadixTree::GetPin(PinId id, PinInfo* out) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  auto it = m.leases.find(id);
  if (it == m.leases.end() || !it->second.prefix_pin) return false;
  *out = m.PinInfoOf(id, it->second);
  return true;
}

std::vector<PinInfo> RadixTree::ListPins() const {
  const Impl& m = *impl_;
  std::vector<PinInfo> out;
  {
    ReaderMutexLock lock(&m.mu);
    for (const auto& [id, lease] : m.leases) {
      if (lease.prefix_pin) out.push_back(m.PinInfoOf(id, lease));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const PinInfo& a, const PinInfo& b) { return a.id < b.id; });
  return out;
}

}  // namespace radixkv
