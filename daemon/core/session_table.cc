#include "daemon/core/session_table.h"

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

std::string NewSessionId() {
  // absl::BitGen is seeded from the OS entropy source per instance.
  thread_local absl::BitGen gen;
  const uint64_t hi = absl::Uniform<uint64_t>(gen);
  const uint64_t lo = absl::Uniform<uint64_t>(gen);
  return absl::StrFormat("%016x%016x", hi, lo);
}

// Session ids are 32 hex digits; cap what goes back into an error message.
std::string Printable(absl::string_view id) {
  if (id.size() > 40) return absl::StrCat(id.substr(0, 40), "...");
  return std::string(id);
}

}  // namespace

SessionTable::SessionTable(uint32_t max_sessions)
    : max_sessions_(max_sessions) {}

absl::StatusOr<SessionEntry> SessionTable::Create(
    const SessionBinding& binding, absl::string_view client_name,
    const Caller& caller, int32_t device, const SessionLimits& limits) {
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= max_sessions_) {
    return FieldError(absl::StatusCode::kResourceExhausted, "sessions",
                      v1::ERROR_REASON_LIMIT,
                      absl::StrCat(sessions_.size(),
                                   " open, the limit --max_sessions=",
                                   max_sessions_, " is reached"));
  }
  if (limits.per_peer != 0 || limits.per_tenant != 0) {
    const std::string principal = caller.peer.Principal();
    uint32_t of_peer = 0, of_tenant = 0;
    for (const auto& [id, e] : sessions_) {
      if (e.peer.Principal() == principal) ++of_peer;
      if (caller.scope.Owns(e.tenant)) ++of_tenant;
    }
    if (limits.per_peer != 0 && of_peer >= limits.per_peer) {
      return FieldError(absl::StatusCode::kResourceExhausted, "sessions",
                        v1::ERROR_REASON_LIMIT,
                        absl::StrCat(principal, " has ", of_peer,
                                     " sessions open, the limit "
                                     "--max_sessions_per_peer=",
                                     limits.per_peer, " is reached"));
    }
    if (limits.per_tenant != 0 && of_tenant >= limits.per_tenant) {
      return FieldError(absl::StatusCode::kResourceExhausted, "sessions",
                        v1::ERROR_REASON_LIMIT,
                        absl::StrCat("tenant ", caller.scope.name(), " has ",
                                     of_tenant, " sessions open, its limit "
                                     "max_sessions=", limits.per_tenant,
                                     " (--tenants) is reached"));
    }
  }
  std::string id = NewSessionId();
  while (sessions_.contains(id)) id = NewSessionId();
  SessionEntry& s = sessions_[id];
  s.id = id;
  s.owner = next_owner_++;
  s.binding = binding;
  s.client_name = std::string(client_name);
  s.peer = caller.peer;
  s.tenant = caller.scope.name();
  s.device = device;
  s.created = absl::Now();
  return s;
}

OwnerId SessionTable::Remove(absl::string_view session_id,
                             SessionEntry* removed) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return kNoOwner;
  const OwnerId owner = it->second.owner;
  if (removed != nullptr) *removed = std::move(it->second);
  sessions_.erase(it);
  return owner;
}

absl::StatusOr<SessionRef> SessionTable::Lookup(
    absl::string_view session_id, const PeerIdentity& peer) const {
  if (session_id.empty()) {
    return FieldError(absl::StatusCode::kInvalidArgument, "session_id",
                      v1::ERROR_REASON_INVALID,
                      "required; open a Session stream first and pass the "
                      "session_id from its SessionInfo");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return FieldError(
        absl::StatusCode::kNotFound, "session_id",
        v1::ERROR_REASON_SESSION_NOT_FOUND,
        absl::StrCat("unknown session '", Printable(session_id),
                     "' (its Session stream ended, or it never existed)"));
  }
  if (!peer.SameParty(it->second.peer)) {
    return FieldError(
        absl::StatusCode::kPermissionDenied, "session_id",
        v1::ERROR_REASON_PERMISSION_DENIED,
        absl::StrCat("session '", Printable(session_id), "' belongs to ",
                     "another peer; ", peer.ToString(), " may use only the ",
                     "sessions it opened"));
  }
  return SessionRef{it->second.owner, it->second.binding};
}

bool SessionTable::Get(absl::string_view session_id, SessionEntry* out) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  *out = it->second;
  return true;
}

size_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

std::vector<SessionEntry> SessionTable::List() const {
  std::vector<SessionEntry> out;
  absl::MutexLock lock(&mu_);
  out.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) out.push_back(s);
  return out;
}

absl::flat_hash_map<NamespaceId, uint32_t>
SessionTable::SessionsPerNamespace() const {
  absl::flat_hash_map<NamespaceId, uint32_t> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, s] : sessions_) ++out[s.binding.ns];
  return out;
}

bool SessionTable::Exists(absl::string_view session_id) const {
  absl::MutexLock lock(&mu_);
  return sessions_.contains(session_id);
}

}  // namespace radixkv::daemon
