#include "radix/refusal.h"

#include <cassert>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace radixkv {
namespace {

// Payload layout: the reason byte, then index, lease, held and limit as
// 64-bit integers in the host's byte order (the payload never leaves the
// process: the daemon turns it into its own wire error).
constexpr size_t kPayloadBytes = 1 + 4 * sizeof(uint64_t);

void PutU64(uint64_t v, char* out) { std::memcpy(out, &v, sizeof(v)); }

uint64_t GetU64(const char* in) {
  uint64_t v;
  std::memcpy(&v, in, sizeof(v));
  return v;
}

}  // namespace

const char* RefusalName(Refusal r) {
  switch (r) {
    case Refusal::kNone:
      return "none";
    case Refusal::kLeaseUnknown:
      return "lease_unknown";
    case Refusal::kLeaseExpired:
      return "lease_expired";
    case Refusal::kEndLeaseUnknown:
      return "end_lease_unknown";
    case Refusal::kEndLeaseRepeated:
      return "end_lease_repeated";
    case Refusal::kOwnerLeaseLimit:
      return "owner_lease_limit";
    case Refusal::kOwnerPageLimit:
      return "owner_page_limit";
    case Refusal::kAccountPinLimit:
      return "account_pin_limit";
    case Refusal::kCommitBeyondLease:
      return "commit_beyond_lease";
    case Refusal::kPinNothingCached:
      return "pin_nothing_cached";
    case Refusal::kPinQuota:
      return "pin_quota";
    case Refusal::kPinFairShare:
      return "pin_fair_share";
    case Refusal::kPinUnknown:
      return "pin_unknown";
  }
  return "unknown";
}

absl::Status Refuse(absl::StatusCode code, const RefusalDetail& detail,
                    absl::string_view message) {
  assert(code != absl::StatusCode::kOk && detail.reason != Refusal::kNone);
  absl::Status s(code, message);
  char bytes[kPayloadBytes];
  bytes[0] = static_cast<char>(detail.reason);
  PutU64(detail.index, bytes + 1);
  PutU64(detail.lease, bytes + 9);
  PutU64(detail.held, bytes + 17);
  PutU64(detail.limit, bytes + 25);
  s.SetPayload(kRefusalTypeUrl,
               absl::Cord(absl::string_view(bytes, sizeof(bytes))));
  return s;
}

RefusalDetail RefusalOf(const absl::Status& status) {
  RefusalDetail d;
  if (status.ok()) return d;
  const absl::optional<absl::Cord> payload = status.GetPayload(kRefusalTypeUrl);
  if (!payload.has_value() || payload->size() != kPayloadBytes) return d;
  const std::string bytes(*payload);
  const auto reason = static_cast<uint8_t>(bytes[0]);
  if (reason == 0 || reason > static_cast<uint8_t>(kLastRefusal)) return d;
  d.reason = static_cast<Refusal>(reason);
  d.index = GetU64(bytes.data() + 1);
  d.lease = GetU64(bytes.data() + 9);
  d.held = GetU64(bytes.data() + 17);
  d.limit = GetU64(bytes.data() + 25);
  return d;
}

}  // namespace radixkv
