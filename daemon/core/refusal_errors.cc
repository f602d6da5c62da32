#include "daemon/core/refusal_errors.h"

#include <cstddef>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

std::string LeaseTtlHint(const RefusalContext& c) {
  return absl::StrCat("; leases expire after --lease_ttl=",
                      absl::FormatDuration(c.lease_ttl));
}

// Rows in enum order; RefusalRuleFor indexes by value, and the unit test
// checks the order.
constexpr RefusalRule kRules[] = {
    {Refusal::kLeaseUnknown, "lease_id", v1::ERROR_REASON_LEASE_NOT_FOUND,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext& c) {
       return absl::StrCat(field, ": unknown lease ", d.lease,
                           " for this owner (ended, expired, or held by "
                           "another)",
                           LeaseTtlHint(c));
     }},
    {Refusal::kLeaseExpired, "lease_id", v1::ERROR_REASON_LEASE_NOT_FOUND,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext& c) {
       return absl::StrCat(field, ": lease ", d.lease,
                           " expired; its pages were released",
                           LeaseTtlHint(c));
     }},
    {Refusal::kEndLeaseUnknown, "release_leases",
     v1::ERROR_REASON_LEASE_NOT_FOUND,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext&) {
       return absl::StrCat(field, "[", d.index, "]: lease ", d.lease,
                           " is unknown to this owner (ended, or held by "
                           "another)");
     }},
    {Refusal::kEndLeaseRepeated, "release_leases", v1::ERROR_REASON_INVALID,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext&) {
       return absl::StrCat(field, ": lease ", d.lease, " is listed twice");
     }},
    {Refusal::kOwnerLeaseLimit, "leases", v1::ERROR_REASON_LIMIT,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext&) {
       return absl::StrCat(field,
                           ": the session holds the most leases "
                           "--max_leases_per_session=",
                           d.limit, " allows; commit or release some");
     }},
    {Refusal::kOwnerPageLimit, "leases", v1::ERROR_REASON_LIMIT,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext&) {
       return absl::StrCat(field,
                           ": the session's leases hold the most pages "
                           "--max_pinned_pages_per_session=",
                           d.limit,
                           " allows (fenced pages of expired leases "
                           "included); commit or release some");
     }},
    {Refusal::kAccountPinLimit, "leases", v1::ERROR_REASON_LIMIT,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext& c) {
       return absl::StrCat(field, ": tenant ", c.tenant, ": its leases hold ",
                           d.held, " pages, its limit is ", d.limit,
                           " (max_pinned_pages); commit or release some "
                           "(--tenants)");
     }},
    {Refusal::kCommitBeyondLease, "blocks", v1::ERROR_REASON_INVALID,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext&) {
       return absl::StrCat(field, ": blocks=", d.held, " exceeds the lease's ",
                           d.limit, " uncommitted new pages");
     }},
    {Refusal::kPinNothingCached, "tokens", v1::ERROR_REASON_INVALID,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext&) {
       return absl::StrCat(field, ": none of the prompt's ", d.limit,
                           " full blocks is cached, so there is nothing to "
                           "pin; pin it once a worker has committed it");
     }},
    {Refusal::kPinQuota, "pins", v1::ERROR_REASON_LIMIT,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext& c) {
       return absl::StrCat(field, ": tenant ", c.tenant,
                           ": its pins would hold ", d.held,
                           " pages, its limit is ", d.limit,
                           " (max_pin_pages, --tenants); unpin some");
     }},
    {Refusal::kPinFairShare, "pins", v1::ERROR_REASON_LIMIT,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext& c) {
       return absl::StrCat(field, ": tenant ", c.tenant,
                           ": its pins would hold ", d.held,
                           " pages, its weighted share of the pool is ",
                           d.limit, " (capacity * weight / the sum of the "
                           "weights, --tenants); unpin some");
     }},
    {Refusal::kPinUnknown, "pin_id", v1::ERROR_REASON_INVALID,
     [](absl::string_view field, const RefusalDetail& d,
        const RefusalContext&) {
       return absl::StrCat(field, ": no pin ", d.lease,
                           " of this tenant (unpinned, or never made)");
     }},
};

static_assert(std::size(kRules) == static_cast<size_t>(kLastRefusal),
              "one row per Refusal other than kNone");

}  // namespace

absl::Span<const RefusalRule> RefusalRules() { return kRules; }

const RefusalRule* RefusalRuleFor(Refusal r) {
  const size_t i = static_cast<size_t>(r);
  if (i == 0 || i > std::size(kRules)) return nullptr;
  return &kRules[i - 1];
}

absl::Status RefusalToFieldError(const absl::Status& status,
                                 const RefusalContext& context) {
  const RefusalDetail detail = RefusalOf(status);
  const RefusalRule* rule = RefusalRuleFor(detail.reason);
  if (rule == nullptr) return status;
  return WithDetail(
      rule->field, rule->reason,
      absl::Status(status.code(), rule->word(rule->field, detail, context)));
}

}  // namespace radixkv::daemon
