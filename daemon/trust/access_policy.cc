#include "daemon/trust/access_policy.h"

#include <algorithm>
#include <cassert>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "radix/radix_tree.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

using Json = nlohmann::json;

Tenant DefaultTenant() {
  Tenant t;
  t.name = "default";
  return t;
}

absl::Status BadFile(absl::string_view file, absl::string_view path,
                     absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--tenants=", file, ": ", path, ": ", what));
}

// Reads an array of unsigned integers or strings at j[key] into *out.
template <typename T>
absl::Status ReadList(const Json& j, const char* key, absl::string_view file,
                      const std::string& where, std::vector<T>* out) {
  if (!j.contains(key)) return absl::OkStatus();
  const Json& a = j.at(key);
  if (!a.is_array()) return BadFile(file, where + "." + key, "must be an array");
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string at = absl::StrCat(where, ".", key, "[", i, "]");
    if constexpr (std::is_same_v<T, std::string>) {
      if (!a[i].is_string() || a[i].get<std::string>().empty()) {
        return BadFile(file, at, "must be a non-empty string");
      }
      out->push_back(a[i].get<std::string>());
    } else {
      if (!a[i].is_number_unsigned()) {
        return BadFile(file, at, "must be a non-negative integer");
      }
      out->push_back(static_cast<T>(a[i].get<uint64_t>()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKeys(const Json& j, absl::string_view file,
                       const std::string& where,
                       std::initializer_list<absl::string_view> allowed) {
  if (!j.is_object()) return BadFile(file, where, "must be an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
      return BadFile(file, absl::StrCat(where, ".", it.key()), "unknown key");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadMatcher(const Json& j, absl::string_view file,
                         const std::string& where, PeerMatcher* m) {
  if (absl::Status s = ReadList(j, "uids", file, where, &m->uids); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadList(j, "gids", file, where, &m->gids); !s.ok()) {
    return s;
  }
  return ReadList(j, "subjects", file, where, &m->subjects);
}

absl::Status ReadQuota(const Json& j, const char* key, absl::string_view file,
                       const std::string& where, uint32_t* out) {
  if (!j.contains(key)) return absl::OkStatus();
  if (!j.at(key).is_number_unsigned() || j.at(key).get<uint64_t>() > UINT32_MAX) {
    return BadFile(file, absl::StrCat(where, ".", key),
                   "must be an integer in 0..4294967295");
  }
  *out = static_cast<uint32_t>(j.at(key).get<uint64_t>());
  return absl::OkStatus();
}

bool ValidTenantName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  });
}

}  // namespace

bool PeerMatcher::Matches(const PeerIdentity& peer) const {
  switch (peer.transport) {
    case PeerIdentity::Transport::kUnix:
      if (peer.pid < 0) return false;  // unknown connection
      if (std::find(uids.begin(), uids.end(), peer.uid) != uids.end()) {
        return true;
      }
      return std::any_of(gids.begin(), gids.end(),
                         [&](gid_t g) { return peer.InGroup(g); });
    case PeerIdentity::Transport::kTls:
      return !peer.subject.empty() &&
             std::find(subjects.begin(), subjects.end(), peer.subject) !=
                 subjects.end();
    case PeerIdentity::Transport::kInProcess:
    case PeerIdentity::Transport::kTcp:
      return false;
  }
  return false;
}

const Caller& Caller::Daemon() {
  static const Tenant* const kDefault = new Tenant(DefaultTenant());
  static const Caller* const kDaemon = new Caller{
      PeerIdentity::InProcess(), TenantScope(*kDefault, /*admin=*/true)};
  return *kDaemon;
}

absl::StatusOr<std::unique_ptr<AccessPolicy>> AccessPolicy::Create(
    const AccessOptions& options) {
  std::unique_ptr<AccessPolicy> p(new AccessPolicy(options));
  if (options.tenants_file.empty()) {
    p->tenants_.push_back(DefaultTenant());
    p->unmatched_ = 0;
  } else if (absl::Status s = p->Load(); !s.ok()) {
    return s;
  }
  // Admit hands out &tenants_[...]: at least one tenant, "unmatched" one of
  // them, and the i-th tenant of a file on account i + 1.
  assert(!p->tenants_.empty() &&
         p->unmatched_ < static_cast<int>(p->tenants_.size()));
  assert(!p->has_tenants_file() ||
         p->tenants_.back().account == p->tenants_.size());
  // Only the built-in tenant (no file) keeps client salts unprefixed.
  assert(std::all_of(p->tenants_.begin(), p->tenants_.end(),
                     [&](const Tenant& t) {
                       return TenantScope(t, false).EffectiveSalt("").empty() !=
                              p->has_tenants_file();
                     }));
  return p;
}

absl::Status AccessPolicy::Load() {
  const std::string& file = options_.tenants_file;
  std::ifstream in(file);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenants=", file, ": cannot be read"));
  }
  Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenants=", file, ": not valid JSON"));
  }
  if (absl::Status s = CheckKeys(j, file, "$", {"tenants", "admins", "unmatched"});
      !s.ok()) {
    return s;
  }
  if (!j.contains("tenants") || !j["tenants"].is_array() || j["tenants"].empty()) {
    return BadFile(file, "$.tenants", "must be a non-empty array");
  }
  for (size_t i = 0; i < j["tenants"].size(); ++i) {
    const Json& e = j["tenants"][i];
    const std::string where = absl::StrCat("$.tenants[", i, "]");
    if (absl::Status s = CheckKeys(e, file, where,
                                   {"name", "uids", "gids", "subjects",
                                    "max_sessions", "max_namespaces",
                                    "max_cached_pages", "max_pinned_pages",
                                    "max_pin_pages", "weight"});
        !s.ok()) {
      return s;
    }
    Tenant t;
    if (!e.contains("name") || !e["name"].is_string() ||
        !ValidTenantName(e["name"].get<std::string>())) {
      return BadFile(file, where + ".name",
                     "required: 1 to 64 characters of [A-Za-z0-9._-]");
    }
    t.name = e["name"].get<std::string>();
    for (const Tenant& other : tenants_) {
      if (other.name == t.name) {
        return BadFile(file, where + ".name",
                       absl::StrCat("\"", t.name, "\" is listed twice"));
      }
    }
    t.salt_prefix = TenantScope::SaltPrefixFor(t.name);
    if (absl::Status s = ReadMatcher(e, file, where, &t.members); !s.ok()) return s;
    if (absl::Status s = ReadQuota(e, "max_sessions", file, where, &t.max_sessions);
        !s.ok()) {
      return s;
    }
    for (const auto& [key, out] :
         {std::pair<const char*, uint32_t*>{"max_namespaces", &t.max_namespaces},
          {"max_cached_pages", &t.max_cached_pages},
          {"max_pinned_pages", &t.max_pinned_pages},
          {"max_pin_pages", &t.max_pin_pages},
          {"weight", &t.weight}}) {
      if (absl::Status s = ReadQuota(e, key, file, where, out); !s.ok()) {
        return s;
      }
    }
    if (t.weight == 0) {
      return BadFile(file, where + ".weight", "must be at least 1");
    }
    if (tenants_.size() + 1 >= kMaxAccounts) {
      return BadFile(file, where,
                     absl::StrCat("more than ", kMaxAccounts - 1, " tenants"));
    }
    t.account = static_cast<uint32_t>(tenants_.size()) + 1;
    tenants_.push_back(std::move(t));
  }
  if (j.contains("admins")) {
    if (absl::Status s = CheckKeys(j["admins"], file, "$.admins",
                                   {"uids", "gids", "subjects"});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadMatcher(j["admins"], file, "$.admins", &admins_);
        !s.ok()) {
      return s;
    }
  }
  if (j.contains("unmatched")) {
    if (!j["unmatched"].is_string()) {
      return BadFile(file, "$.unmatched",
                     "must be \"refuse\" or the name of a tenant");
    }
    const std::string u = j["unmatched"].get<std::string>();
    if (u != "refuse") {
      for (size_t i = 0; i < tenants_.size(); ++i) {
        if (tenants_[i].name == u) unmatched_ = static_cast<int>(i);
      }
      if (unmatched_ < 0) {
        return BadFile(file, "$.unmatched",
                       absl::StrCat("\"", u, "\" is not a tenant listed in "
                                    "$.tenants (or \"refuse\")"));
      }
    }
  }
  return absl::OkStatus();
}

bool AccessPolicy::IsAdmin(const PeerIdentity& peer) const {
  switch (peer.transport) {
    case PeerIdentity::Transport::kInProcess:
      return true;
    case PeerIdentity::Transport::kUnix:
      if (peer.pid < 0) return false;
      if (peer.uid == 0 || peer.uid == options_.self_uid) return true;
      if (std::any_of(options_.admin_gids.begin(), options_.admin_gids.end(),
                      [&](gid_t g) { return peer.InGroup(g); })) {
        return true;
      }
      return admins_.Matches(peer);
    case PeerIdentity::Transport::kTls:
      if (!peer.subject.empty() &&
          std::find(options_.admin_subjects.begin(),
                    options_.admin_subjects.end(),
                    peer.subject) != options_.admin_subjects.end()) {
        return true;
      }
      return admins_.Matches(peer);
    case PeerIdentity::Transport::kTcp:
      return false;
  }
  return false;
}

absl::StatusOr<Caller> AccessPolicy::Admit(const PeerIdentity& peer) const {
  const bool admin = IsAdmin(peer);
  const auto admitted = [&](const Tenant& t) {
    return Caller{peer, TenantScope(t, admin)};
  };
  if (peer.transport == PeerIdentity::Transport::kInProcess) {
    return admitted(tenants_[unmatched_ >= 0 ? unmatched_ : 0]);
  }
  if (peer.transport == PeerIdentity::Transport::kUnix && peer.pid < 0) {
    return FieldError(absl::StatusCode::kPermissionDenied, "peer",
                      v1::ERROR_REASON_PERMISSION_DENIED,
                      absl::StrCat("the connection ", peer.address,
                                   " has no verified credentials"));
  }
  if (has_tenants_file()) {
    for (const Tenant& t : tenants_) {
      if (t.members.Matches(peer)) return admitted(t);
    }
  }
  if (unmatched_ >= 0) return admitted(tenants_[unmatched_]);
  if (admin) {
    // An administrator that is no tenant's member may still administer;
    // it gets the first tenant for the worker API.
    return admitted(tenants_.front());
  }
  return FieldError(absl::StatusCode::kPermissionDenied, "peer",
                    v1::ERROR_REASON_PERMISSION_DENIED,
                    absl::StrCat("peer ", peer.ToString(),
                                 " belongs to no tenant in --tenants=",
                                 options_.tenants_file));
}

}  // namespace radixkv::daemon
