// File: daemon/core/refusal_errors.h
//
// The one table from the radix tree's typed refusals (radix/refusal.h) to
// the errors clients receive: the ErrorDetail field and reason, and the
// message, which names the daemon flag or the tenant limit that was
// reached. The tree knows nothing of the wire; the daemon never reads the
// tree's messages: it words each refusal from the refusal's numbers.
//
//   absl::StatusOr<CommitResult> r = tree->Commit(...);
//   if (!r.ok()) return RefusalToFieldError(r.status(), RefusalContextOf(...));
//
// Thread safety: pure functions over a constant table.
#ifndef RADIXKV_DAEMON_CORE_REFUSAL_ERRORS_H_
#define RADIXKV_DAEMON_CORE_REFUSAL_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "radix/refusal.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::daemon {

// What the wording of a refusal needs besides the refusal itself.
struct RefusalContext {
  absl::Duration lease_ttl = absl::ZeroDuration();  // --lease_ttl
  absl::string_view tenant;                         // the caller's tenant
};

// One row: a refusal as the wire reports it.
struct RefusalRule {
  Refusal refusal = Refusal::kNone;
  // The request field ErrorDetail names.
  absl::string_view field;
  v1::ErrorReason reason = v1::ERROR_REASON_UNSPECIFIED;
  // The whole message; it starts with `field`.
  std::string (*word)(absl::string_view field, const RefusalDetail& detail,
                      const RefusalContext& context) = nullptr;
};

// The table: exactly one row per Refusal from kNone + 1 to kLastRefusal,
// in enum order.
absl::Span<const RefusalRule> RefusalRules();

// The row for `r`; null for kNone and values outside the enum.
const RefusalRule* RefusalRuleFor(Refusal r);

// `status` as clients receive it: a typed refusal becomes an error with
// the same code, its row's message and an ErrorDetail{field, reason}; any
// other status (OK included) is returned unchanged.
absl::Status RefusalToFieldError(const absl::Status& status,
                                 const RefusalContext& context);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_CORE_REFUSAL_ERRORS_H_
