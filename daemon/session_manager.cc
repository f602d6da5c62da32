#include "daemon/session_manager.h"

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

SessionManager::SessionManager(const SessionManagerOptions& options)
    : options_(options) {}

absl::StatusOr<std::string> SessionManager::Create(
    const SessionBinding& binding, absl::string_view client_name,
    absl::string_view peer, int32_t device) {
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: ", sessions_.size(), " open, the limit --max_sessions=",
        options_.max_sessions, " is reached"));
  }
  std::string id = NewSessionId();
  while (sessions_.contains(id)) id = NewSessionId();
  Session& s = sessions_[id];
  s.client_name = std::string(client_name);
  s.peer = std::string(peer);
  s.binding = binding;
  s.device = device;
  s.created = absl::Now();
  return id;
}

std::vector<LeaseId> SessionManager::Remove(absl::string_view session_id) {
  std::vector<LeaseId> out;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return out;
  out.assign(it->second.leases.begin(), it->second.leases.end());
  for (LeaseId l : out) leases_.erase(l);
  sessions_.erase(it);
  return out;
}

absl::StatusOr<SessionBinding> SessionManager::Lookup(
    absl::string_view session_id, bool need_lease_slot) const {
  if (session_id.empty()) {
    return absl::InvalidArgumentError(
        "session_id: required; open a Session stream first and pass the "
        "session_id from its SessionInfo");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "session_id: unknown session '", Printable(session_id),
        "' (its Session stream ended, or it never existed)"));
  }
  if (need_lease_slot &&
      it->second.leases.size() >= options_.max_leases_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "leases: session holds ", it->second.leases.size(),
        " leases, the limit --max_leases_per_session=",
        options_.max_leases_per_session, " is reached; commit or release some"));
  }
  return it->second.binding;
}

absl::StatusOr<absl::Time> SessionManager::AddLease(
    absl::string_view session_id, LeaseId lease, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "session_id: session '", Printable(session_id), "' ended"));
  }
  if (it->second.leases.size() >= options_.max_leases_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "leases: the limit --max_leases_per_session=",
        options_.max_leases_per_session, " is reached"));
  }
  const absl::Time expires = now + options_.lease_ttl;
  it->second.leases.insert(lease);
  leases_[lease] = Lease{std::string(session_id), expires};
  return expires;
}

absl::Status SessionManager::CheckOwner(absl::string_view session_id,
                                        LeaseId lease, absl::Time now,
                                        bool* expired) {
  *expired = false;
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end() || it->second.session_id != session_id) {
    return absl::NotFoundError(absl::StrCat(
        "lease_id: unknown lease ", lease,
        " for this session (ended, expired, or owned by another session)"));
  }
  if (it->second.expires <= now) {
    *expired = true;
    auto s = sessions_.find(it->second.session_id);
    if (s != sessions_.end()) s->second.leases.erase(lease);
    leases_.erase(it);
    return absl::NotFoundError(absl::StrCat(
        "lease_id: lease ", lease, " expired (--lease_ttl=",
        absl::FormatDuration(options_.lease_ttl), ")"));
  }
  return absl::OkStatus();
}

void SessionManager::RemoveLease(LeaseId lease) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return;
  auto s = sessions_.find(it->second.session_id);
  if (s != sessions_.end()) s->second.leases.erase(lease);
  leases_.erase(it);
}

std::vector<LeaseId> SessionManager::TakeExpired(absl::Time now) {
  std::vector<LeaseId> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, l] : leases_) {
    if (l.expires <= now) out.push_back(id);
  }
  for (LeaseId id : out) {
    auto it = leases_.find(id);
    auto s = sessions_.find(it->second.session_id);
    if (s != sessions_.end()) s->second.leases.erase(id);
    leases_.erase(it);
  }
  return out;
}

size_t SessionManager::session_count() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

size_t SessionManager::lease_count() const {
  absl::MutexLock lock(&mu_);
  return leases_.size();
}

absl::flat_hash_map<NamespaceId, uint32_t>
SessionManager::SessionsPerNamespace() const {
  absl::flat_hash_map<NamespaceId, uint32_t> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, s] : sessions_) ++out[s.binding.ns];
  return out;
}

std::vector<SessionSnapshot> SessionManager::List() const {
  std::vector<SessionSnapshot> out;
  absl::MutexLock lock(&mu_);
  out.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) {
    out.push_back(SessionSnapshot{id, s.client_name, s.peer, s.binding,
                                  s.device,
                                  static_cast<uint32_t>(s.leases.size()),
                                  s.created});
  }
  return out;
}

bool SessionManager::Exists(absl::string_view session_id) const {
  absl::MutexLock lock(&mu_);
  return sessions_.contains(session_id);
}

}  // namespace radixkv::daemon
