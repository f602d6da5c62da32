// Cache: prefix pins (Admin.Pin, Unpin, ListPins). A pin is the tree's
// (RadixTree::PinPrefix); the daemon decides who may make and end one: a
// tenant pins in its own namespaces, whose salts are its own, and sees and
// ends only its own pins; an administrator pins in any namespace it names
// and sees every pin. A pin counts against the account of its namespace's
// tenant, whoever made it.
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "daemon/core/cache.h"
#include "daemon/core/refusal_errors.h"
#include "radix/refusal.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {
namespace {

// The error for a pin id the caller may not use, worded by the refusal
// table like the tree's own kPinUnknown.
absl::Status UnknownPin(uint64_t id, const Caller& caller) {
  return RefusalToFieldError(
      Refuse(absl::StatusCode::kNotFound,
             {.reason = Refusal::kPinUnknown, .lease = id}, "unknown pin"),
      {.tenant = caller.scope.name()});
}

}  // namespace

absl::Status Cache::Pin(const v1::PinRequest& req, v1::PinResponse* resp,
                        const Caller& caller) {
  ASSIGN_OR_RETURN(NamespaceSpec spec,
                   ValidateNamespace(req.namespace_(), options_));
  spec.cache_salt = caller.scope.EffectiveSalt(std::move(spec.cache_salt));
  ASSIGN_OR_RETURN(Prompt p,
                   ValidatePrompt(FieldsOf(req), spec.page_size, options_));
  const BlockKey root = NamespaceRoot(spec);
  const NamespaceRegistry::IdGuard guard = registry_.GuardIds();
  RadixTree* t = registry_.tree();
  NamespaceEntry ns;
  if (t == nullptr || !registry_.Find(root, &ns)) {
    return FieldError(absl::StatusCode::kNotFound, "namespace",
                      v1::ERROR_REASON_INVALID,
                      absl::StrCat("no session has bound namespace ",
                                   root.ToHex(),
                                   ", so none of its blocks is cached; pin "
                                   "a prompt once a worker has committed it"));
  }
  // A tenant's effective salt names its own namespaces only; this holds
  // whatever a future salt convention does.
  if (!caller.scope.admin() && !caller.scope.Owns(ns.tenant)) {
    CountPermissionDenied();
    return FieldError(absl::StatusCode::kPermissionDenied, "namespace",
                      v1::ERROR_REASON_PERMISSION_DENIED,
                      absl::StrCat("namespace ", root.ToHex(),
                                   " is another tenant's; tenant ",
                                   caller.scope.name(),
                                   " pins in its own namespaces only"));
  }
  absl::StatusOr<PinInfo> pin = t->PinPrefix(ns.id, p.keys, p.tokens);
  if (!pin.ok()) {
    // Limits are the account's: name the namespace's tenant.
    return RefusalToFieldError(pin.status(), {.tenant = ns.tenant});
  }
  resp->Clear();
  resp->set_pin_id(pin->id);
  resp->set_namespace_id(root.ToCanonical());
  resp->set_total_blocks(pin->total_blocks);
  resp->set_pinned_blocks(pin->pinned_blocks);
  resp->set_pinned_tokens(uint64_t{pin->pinned_blocks} * spec.page_size);
  return absl::OkStatus();
}

absl::Status Cache::Unpin(const v1::UnpinRequest& req, v1::UnpinResponse* resp,
                          const Caller& caller) {
  const NamespaceRegistry::IdGuard guard = registry_.GuardIds();
  RadixTree* t = registry_.tree();
  PinInfo pin;
  if (t == nullptr || !t->GetPin(req.pin_id(), &pin)) {
    return UnknownPin(req.pin_id(), caller);
  }
  // A pinned namespace is never forgotten, so its recorded tenant is the
  // pin's.
  const absl::flat_hash_map<NamespaceId, std::string> tenants =
      registry_.Tenants();
  auto it = tenants.find(pin.ns);
  if (it == tenants.end() || !caller.scope.Sees(it->second)) {
    return UnknownPin(req.pin_id(), caller);
  }
  if (!t->Unpin(pin.id).ok()) return UnknownPin(req.pin_id(), caller);
  resp->Clear();
  resp->set_unpinned_blocks(pin.pinned_blocks);
  return absl::OkStatus();
}

void Cache::ListPins(v1::ListPinsResponse* resp, const Caller& caller) const {
  resp->Clear();
  const NamespaceRegistry::IdGuard guard = registry_.GuardIds();
  const RadixTree* t = registry_.tree();
  if (t == nullptr) return;
  const absl::flat_hash_map<NamespaceId, std::string> tenants =
      registry_.Tenants();
  const absl::flat_hash_map<NamespaceId, BlockKey> roots = registry_.Roots();
  const absl::Time now = absl::Now();
  for (const PinInfo& pin : t->ListPins()) {
    auto tenant = tenants.find(pin.ns);
    if (tenant == tenants.end() || !caller.scope.Sees(tenant->second)) {
      continue;
    }
    v1::PinEntry* e = resp->add_pins();
    e->set_pin_id(pin.id);
    if (auto r = roots.find(pin.ns); r != roots.end()) {
      e->set_namespace_id(r->second.ToCanonical());
    }
    e->set_tenant(tenant->second);
    e->set_total_blocks(pin.total_blocks);
    e->set_pinned_blocks(pin.pinned_blocks);
    e->set_last_key(pin.last_key.ToCanonical());
    e->set_age_seconds(absl::ToDoubleSeconds(now - pin.created));
  }
}

}  // namespace radixkv::daemon
