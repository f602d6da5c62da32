#include "daemon/core/namespace_registry.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "gpu/namespace_geometry.h"
#include "radixkv/errors.h"

namespace radixkv::daemon {

namespace {

// A namespace whose page size in bytes is not the pool's; `whose` says who
// fixed the pool's.
absl::Status PageBytesMismatch(uint64_t page_bytes, uint64_t pool_bytes,
                               absl::string_view whose) {
  return FieldError(
      absl::StatusCode::kFailedPrecondition, "namespace",
      v1::ERROR_REASON_INVALID,
      absl::StrCat("page_bytes ", page_bytes,
                   " (num_layers x 2 x num_kv_heads x page_size x head_dim x "
                   "dtype bytes) differs from the pool's page_bytes ",
                   pool_bytes, ", ", whose,
                   "; run another radixkvd for this layout"));
}

}  // namespace

NamespaceRegistry::NamespaceRegistry(const RegistryOptions& options)
    : options_(options) {}

absl::StatusOr<NamespaceEntry> NamespaceRegistry::Bind(
    const NamespaceSpec& spec, const TenantScope& owner) {
  absl::StatusOr<NamespaceEntry> e = BindOnce(spec, owner);
  if (absl::IsResourceExhausted(e.status()) && tree() != nullptr &&
      ForgetUnused() != 0) {
    e = BindOnce(spec, owner);  // the tree (or the tenant) has room now
  }
  return e;
}

void NamespaceRegistry::Unbind(const BlockKey& root) {
  absl::MutexLock lock(&mu_);
  auto it = bound_.find(root);
  if (it == bound_.end()) return;
  // A root is in bound_ only while at least one session is bound to it.
  assert(it->second > 0);
  if (--it->second == 0) bound_.erase(it);
}

size_t NamespaceRegistry::ForgetUnused() {
  absl::MutexLock ids(&ids_mu_);
  absl::MutexLock lock(&mu_);
  if (tree_owner_ == nullptr) return 0;
  std::vector<NamespaceId> candidates;
  for (const auto& [root, e] : namespaces_) {
    if (!bound_.contains(root)) candidates.push_back(e.id);
  }
  if (candidates.empty()) return 0;
  const std::vector<NamespaceId> gone =
      tree_owner_->ForgetEmptyNamespaces(candidates);
  for (NamespaceId id : gone) {
    // The tree forgets only candidates, each recorded under its id.
    auto it = roots_.find(id);
    assert(it != roots_.end() && namespaces_.contains(it->second));
    namespaces_.erase(it->second);
    roots_.erase(it);
  }
  assert(namespaces_.size() == roots_.size());
  return gone.size();
}

absl::StatusOr<NamespaceEntry> NamespaceRegistry::BindOnce(
    const NamespaceSpec& spec, const TenantScope& owner) {
  const BlockKey root = NamespaceRoot(spec);
  absl::MutexLock lock(&mu_);
  if (auto it = namespaces_.find(root); it != namespaces_.end()) {
    // The root hashes the effective salt, which is one tenant's.
    assert(owner.Owns(it->second.tenant) &&
           "Bind: another tenant's namespace");
    ++bound_[root];
    return it->second;
  }
  if (const uint32_t max = owner.max_namespaces(); max != 0) {
    uint32_t held = 0;
    for (const auto& [r, e] : namespaces_) {
      if (owner.Owns(e.tenant)) ++held;
    }
    if (held >= max) {
      return FieldError(absl::StatusCode::kResourceExhausted, "namespace",
                        v1::ERROR_REASON_LIMIT,
                        absl::StrCat("tenant ", owner.name(), " has ", held,
                                     " namespaces, its limit max_namespaces=",
                                     max, " (--tenants) is reached"));
    }
  }
  if (tree_owner_ == nullptr) return BindFirst(spec, root, owner);
  // A none pool has no page memory, but its layout is still fixed by the
  // first namespace so that moving to a real pool changes nothing.
  const uint64_t page_bytes = NamespacePageBytes(spec);
  const bool needs_memory = options_.pool.backend != gpu::Backend::kNone;
  const uint64_t pool_bytes =
      needs_memory ? pool_owner_->page_bytes() : first_page_bytes_;
  const bool mismatch = needs_memory ? page_bytes != pool_bytes
                                     : (page_bytes != 0 && pool_bytes != 0 &&
                                        page_bytes != pool_bytes);
  if (mismatch) {
    return PageBytesMismatch(
        page_bytes, pool_bytes,
        options_.pool.page_bytes != 0
            ? std::string("set by --pool ... page_bytes=")
            : absl::StrCat("fixed by the first namespace bound to it (model '",
                           first_model_, "')"));
  }
  absl::StatusOr<NamespaceId> id =
      tree_owner_->RegisterNamespace(spec, owner.account());
  if (!id.ok()) {
    return WithField("namespace", absl::IsResourceExhausted(id.status())
                                      ? v1::ERROR_REASON_LIMIT
                                      : v1::ERROR_REASON_INVALID,
                     id.status());
  }
  return Record(*id, spec, root, owner);
}

absl::Status NamespaceRegistry::CheckFirstLayout(uint64_t page_bytes) const {
  const gpu::PoolSpec& pool = options_.pool;
  if (pool.page_bytes != 0 && page_bytes != pool.page_bytes) {
    return PageBytesMismatch(page_bytes, pool.page_bytes,
                             "set by --pool ... page_bytes=");
  }
  const uint64_t pages = pool.backend == gpu::Backend::kNone
                             ? pool.pages
                             : pool.bytes / std::max<uint64_t>(page_bytes, 1);
  if (pages > options_.max_pool_pages) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "namespace",
        v1::ERROR_REASON_LIMIT,
        absl::StrCat("page_bytes ", page_bytes, " would divide --pool=",
                     gpu::FormatPoolSpec(pool), " into ", pages,
                     " pages, more than --max_pool_pages=",
                     options_.max_pool_pages,
                     "; the first namespace fixes the pool's page size, so "
                     "open with the real model's layout, or set the pool's "
                     "page_bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<NamespaceEntry> NamespaceRegistry::BindFirst(
    const NamespaceSpec& spec, const BlockKey& root, const TenantScope& owner) {
  const uint64_t page_bytes = NamespacePageBytes(spec);
  RETURN_IF_ERROR(CheckFirstLayout(page_bytes));
  if (options_.pool.backend != gpu::Backend::kNone && page_bytes == 0) {
    return FieldError(
        absl::StatusCode::kInvalidArgument, "namespace",
        v1::ERROR_REASON_INVALID,
        absl::StrCat("num_layers, num_kv_heads, head_dim and dtype must all "
                     "be set for a ", gpu::BackendName(options_.pool.backend),
                     " pool (page_bytes would be 0)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::PagePool> pool,
                   gpu::CreatePagePool(options_.pool, page_bytes));
  if (pool->capacity_pages() == 0 || pool->capacity_pages() >= kNoPage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool: ", pool->capacity_pages(), " pages of ", page_bytes,
        " bytes; the pool must hold 1..", kNoPage - 1, " pages"));
  }
  RadixTreeOptions topts;
  topts.capacity_pages = static_cast<uint32_t>(pool->capacity_pages());
  topts.max_page_size = options_.max_page_size;
  topts.remembered_evictions = options_.remembered_evictions;
  topts.eviction_policy = options_.eviction_policy;
  topts.lower_tier_blocks = options_.lower_tier_blocks;
  topts.listener = options_.events;
  topts.fence_unended_leases =
      options_.fence && options_.pool.backend != gpu::Backend::kNone;
  topts.accounts = std::max<uint32_t>(
      1, static_cast<uint32_t>(options_.account_limits.size()));
  ASSIGN_OR_RETURN(std::unique_ptr<RadixTree> tree, RadixTree::Create(topts));
  for (uint32_t a = 0; a < options_.account_limits.size(); ++a) {
    RETURN_IF_ERROR(tree->SetAccountLimits(a, options_.account_limits[a]));
  }
  ASSIGN_OR_RETURN(NamespaceId id,
                   tree->RegisterNamespace(spec, owner.account()));
  if (options_.on_pool_created) RETURN_IF_ERROR(options_.on_pool_created(*pool));
  pool_owner_ = std::move(pool);
  tree_owner_ = std::move(tree);
  pool_.store(pool_owner_.get(), std::memory_order_release);
  tree_.store(tree_owner_.get(), std::memory_order_release);
  first_model_ = spec.model;
  first_page_bytes_ = page_bytes;
  Log(LogLevel::kInfo,
      absl::StrCat("pool ", gpu::BackendName(options_.pool.backend), ": ",
                   topts.capacity_pages, " pages of ", page_bytes,
                   " bytes, layout fixed by model '", spec.model,
                   "' (page_size ", spec.page_size, "), ",
                   tree_owner_->vector_walk(spec.page_size) ? "AVX2"
                                                            : "portable",
                   " token walk"));
  return Record(id, spec, root, owner);
}

NamespaceEntry NamespaceRegistry::Record(NamespaceId id,
                                         const NamespaceSpec& spec,
                                         const BlockKey& root,
                                         const TenantScope& owner) {
  NamespaceEntry e{id, spec, root, owner.name()};
  // A root is recorded once (Bind finds it first), and the tree hands out
  // an id again only after it was forgotten here; every namespace has its
  // tenant.
  assert(!namespaces_.contains(root) && !roots_.contains(id));
  assert(!e.tenant.empty());
  namespaces_[root] = e;
  roots_[id] = root;
  ++bound_[root];
  return e;
}

bool NamespaceRegistry::Find(const BlockKey& root, NamespaceEntry* out) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = namespaces_.find(root);
  if (it == namespaces_.end()) return false;
  *out = it->second;
  return true;
}

std::vector<NamespaceEntry> NamespaceRegistry::WithPageSize(
    uint32_t page_size, const BlockKey& except) const {
  std::vector<NamespaceEntry> out;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [root, e] : namespaces_) {
    if (root != except && e.spec.page_size == page_size) out.push_back(e);
  }
  return out;
}

absl::flat_hash_map<NamespaceId, BlockKey> NamespaceRegistry::Roots() const {
  absl::ReaderMutexLock lock(&mu_);
  return roots_;
}

absl::flat_hash_map<NamespaceId, std::string> NamespaceRegistry::Tenants()
    const {
  absl::flat_hash_map<NamespaceId, std::string> out;
  absl::ReaderMutexLock lock(&mu_);
  out.reserve(namespaces_.size());
  for (const auto& [root, e] : namespaces_) out.emplace(e.id, e.tenant);
  return out;
}

void NamespaceRegistry::FillPoolInfo(v1::PoolInfo* info) const {
  const gpu::PagePool* p = pool();
  info->set_backend(gpu::BackendName(options_.pool.backend));
  info->set_device(options_.pool.backend == gpu::Backend::kCuda
                       ? options_.pool.device
                       : -1);
  if (p == nullptr) {
    if (options_.pool.backend == gpu::Backend::kNone) {
      info->set_capacity_pages(options_.pool.pages);
    }
    return;
  }
  info->set_page_bytes(p->page_bytes());
  info->set_capacity_pages(p->capacity_pages());
  info->set_pages_per_chunk(p->pages_per_chunk());
  info->set_device(p->device());
  if (p->backend() != gpu::Backend::kNone) {
    info->set_attach_socket(options_.attach_socket);
  }
}

}  // namespace radixkv::daemon
