// File: radix/refusal.h
//
// Typed refusals: why the tree refused a request, carried as a payload of
// the absl::Status it returns, beside the code and the message. The message
// is for people; a caller decides from RefusalOf(status), never from the
// text. The tree knows nothing of its callers' field names or flags: a
// refusal carries the numbers a caller needs to word its own error.
//
//   absl::StatusOr<AcquireResult> r = tree.Acquire(req);
//   if (!r.ok() && RefusalOf(r.status()).reason == Refusal::kOwnerLeaseLimit)
//     ...
//
// Thread safety: pure functions.
#ifndef RADIXKV_RADIX_REFUSAL_H_
#define RADIXKV_RADIX_REFUSAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace radixkv {

// Each refusal has one status code, listed with it. Values are stable:
// they are never reused.
enum class Refusal : uint8_t {
  // Not a typed refusal: OK, or an error without a reason (a bad argument).
  kNone = 0,
  // NOT_FOUND: `lease` is not one the owner holds (ended, or another's).
  kLeaseUnknown = 1,
  // NOT_FOUND: `lease` had expired or was fenced; it is ended now.
  kLeaseExpired = 2,
  // NOT_FOUND: end_leases[`index`] = `lease` is not one the owner holds.
  kEndLeaseUnknown = 3,
  // INVALID_ARGUMENT: end_leases[`index`] = `lease` is listed before it.
  kEndLeaseRepeated = 4,
  // RESOURCE_EXHAUSTED: the owner holds `held` leases; `limit` is
  // AcquireRequest::max_owner_leases.
  kOwnerLeaseLimit = 5,
  // RESOURCE_EXHAUSTED: the owner's leases hold `held` pages (end_leases
  // counted as ended); `limit` is AcquireRequest::max_owner_pages.
  kOwnerPageLimit = 6,
  // RESOURCE_EXHAUSTED: the account's leases hold `held` pages (end_leases
  // counted as ended); `limit` is AccountLimits::max_pinned_pages.
  kAccountPinLimit = 7,
  // FAILED_PRECONDITION: Commit of `held` blocks where the lease has only
  // `limit` uncommitted new pages.
  kCommitBeyondLease = 8,
  // FAILED_PRECONDITION: PinPrefix found none of the prompt's `limit`
  // blocks cached.
  kPinNothingCached = 9,
  // RESOURCE_EXHAUSTED: the account's pins would hold `held` pages;
  // `limit` is AccountLimits::max_pin_pages.
  kPinQuota = 10,
  // RESOURCE_EXHAUSTED: the account's pins would hold `held` pages;
  // `limit` is its weighted share of the pool.
  kPinFairShare = 11,
  // NOT_FOUND: `lease` names no pin.
  kPinUnknown = 12,
};

// The largest Refusal value; every value from kNone to it is named.
inline constexpr Refusal kLastRefusal = Refusal::kPinUnknown;

// "owner_lease_limit" etc.; "none" for kNone, "unknown" outside the enum.
const char* RefusalName(Refusal r);

// A refusal with the numbers it is about; a field a refusal does not
// mention is 0.
struct RefusalDetail {
  Refusal reason = Refusal::kNone;
  uint64_t index = 0;  // entry of the list the refusal is about
  uint64_t lease = 0;  // lease id the refusal is about
  uint64_t held = 0;   // amount in use, or asked for
  uint64_t limit = 0;  // the limit reached

  friend bool operator==(const RefusalDetail& a, const RefusalDetail& b) {
    return a.reason == b.reason && a.index == b.index && a.lease == b.lease &&
           a.held == b.held && a.limit == b.limit;
  }
};

// The status payload's type URL.
inline constexpr char kRefusalTypeUrl[] = "radixkv.radix/Refusal";

// An error with `code` and `message` carrying `detail`. REQUIRES: code is
// not OK and detail.reason is not kNone.
absl::Status Refuse(absl::StatusCode code, const RefusalDetail& detail,
                    absl::string_view message);

// The refusal `status` carries; reason kNone when it carries none (or a
// payload that does not parse).
RefusalDetail RefusalOf(const absl::Status& status);

}  // namespace radixkv

#endif  // RADIXKV_RADIX_REFUSAL_H_
