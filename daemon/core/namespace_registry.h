// File: daemon/core/namespace_registry.h
//
// NamespaceRegistry: the namespaces radixkvd serves, and the page pool and
// radix tree they share. Both are created when the first namespace binds. A
// pool's page size in bytes is the operator's when --pool names page_bytes,
// else the first namespace's layout fixes it; a host or cuda pool gets
// bytes / page_bytes pages, a none pool spec.pages, and never more than
// max_pool_pages (so a tiny layout cannot turn a pool into millions of
// pages of index). A namespace with other page_bytes is refused with
// FAILED_PRECONDITION naming both sizes; nothing is allocated for it.
//
// Namespaces are forgotten when nothing uses them: Bind counts the sessions
// bound to each (Unbind uncounts), and ForgetUnused (the sweeper, and Bind
// when the tree holds the most namespaces it can) lets the tree forget
// every one with no session, no cached block and no lease; its id may then
// go to another namespace. A caller that looks an id up without a session
// (Match, Explain, DumpTree) holds GuardIds() until it is done with it.
//
// Each namespace records the tenant of the scope that bound it
// (TenantScope::name): inspection decides visibility by that record, and a
// tenant's max_namespaces counts the namespaces recorded as its; the tree
// keeps the namespace in that tenant's account. A namespace's effective salt
// is its tenant's (tenant_scope.h), so every later bind of it is by the same
// tenant.
//
// Thread safety: thread-safe. tree() and pool() are published once (release
// ordering) and never change afterwards, so they are read without a lock.
// Lock order: the id guard, then the registry's mutex, then the tree's.
#ifndef RADIXKV_DAEMON_CORE_NAMESPACE_REGISTRY_H_
#define RADIXKV_DAEMON_CORE_NAMESPACE_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/events/event_log.h"
#include "daemon/trust/tenant_scope.h"
#include "gpu/pool.h"
#include "radix/radix_tree.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::daemon {

struct NamespaceEntry {
  NamespaceId id = 0;
  NamespaceSpec spec;
  BlockKey root;
  // The tenant that bound it (TenantScope::name of the binder); never empty.
  std::string tenant;
};

struct RegistryOptions {
  // The pool to create when the first namespace binds.
  gpu::PoolSpec pool;
  // Most pages a pool may be divided into (--max_pool_pages).
  uint64_t max_pool_pages = uint64_t{1} << 22;
  // RadixTreeOptions for the tree.
  uint32_t max_page_size = 1024;
  // One entry per tree account (index = account); empty: one account
  // without limits.
  std::vector<AccountLimits> account_limits;
  uint32_t remembered_evictions = 4096;
  // RadixTreeOptions::eviction_policy for the tree.
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  // RadixTreeOptions::lower_tier_blocks: the tiers' blocks below the pool
  // (0: none, or of unknown size).
  uint64_t lower_tier_blocks = 0;
  // Receives the tree's events and learns each namespace's root. Not
  // owned; may be null; must outlive the registry.
  EventLog* events = nullptr;
  // Reported in PoolInfo.attach_socket (empty: no attach socket).
  std::string attach_socket;
  // RadixTreeOptions::fence_unended_leases for pools with memory (a none
  // pool has no bytes anyone could write).
  bool fence = true;
  // Called with the new pool before it is published (under the registry's
  // mutex); an error fails the bind that created it, and the next bind
  // tries again. May be empty.
  std::function<absl::Status(const gpu::PagePool&)> on_pool_created;
};

class NamespaceRegistry {
 public:
  explicit NamespaceRegistry(const RegistryOptions& options);
  NamespaceRegistry(const NamespaceRegistry&) = delete;
  NamespaceRegistry& operator=(const NamespaceRegistry&) = delete;

  // Registers `spec` (already validated, its cache_salt the effective one
  // of `owner`), creating pool and tree on first use; an equal spec gets the
  // same entry again. A new namespace is recorded as `owner`'s, in its tree
  // account, if the tenant holds fewer than its max_namespaces. Errors name
  // the field or the flag (--pool), or the tenant's max_namespaces
  // (RESOURCE_EXHAUSTED), and change nothing.
  // A successful Bind counts one more session bound to the namespace.
  absl::StatusOr<NamespaceEntry> Bind(const NamespaceSpec& spec,
                                      const TenantScope& owner);
  // One session fewer bound to the namespace `root`.
  void Unbind(const BlockKey& root);
  // Forgets every namespace that no session is bound to and that holds
  // nothing in the tree; returns how many.
  size_t ForgetUnused();

  // While alive, no namespace id is forgotten (a shared hold of the
  // registry's id lock; ForgetUnused takes it exclusively). Returned by
  // value, so it carries no lock annotations; ids_mu_ guards no field.
  class IdGuard {
   public:
    explicit IdGuard(absl::Mutex* mu) : lock_(mu) {}

   private:
    absl::ReaderMutexLock lock_;
  };
  IdGuard GuardIds() const { return IdGuard(&ids_mu_); }
  // The registered namespace with this root, if any.
  bool Find(const BlockKey& root, NamespaceEntry* out) const;
  // Registered namespaces other than `except` with this page_size.
  std::vector<NamespaceEntry> WithPageSize(uint32_t page_size,
                                           const BlockKey& except) const;
  // Namespace id -> root, for every registered namespace.
  absl::flat_hash_map<NamespaceId, BlockKey> Roots() const;
  // Namespace id -> the tenant recorded for it, for every registered
  // namespace.
  absl::flat_hash_map<NamespaceId, std::string> Tenants() const;

  // nullptr until the first namespace binds.
  RadixTree* tree() const { return tree_.load(std::memory_order_acquire); }
  const gpu::PagePool* pool() const {
    return pool_.load(std::memory_order_acquire);
  }
  void FillPoolInfo(v1::PoolInfo* info) const;

 private:
  // Creates pool and tree for the first namespace. REQUIRES: mu_ held.
  absl::StatusOr<NamespaceEntry> BindOnce(const NamespaceSpec& spec,
                                          const TenantScope& owner);
  absl::StatusOr<NamespaceEntry> BindFirst(const NamespaceSpec& spec,
                                           const BlockKey& root,
                                           const TenantScope& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the first namespace's page_bytes may fix the pool: equal to
  // --pool's page_bytes when set, and dividing the pool into at most
  // max_pool_pages pages.
  absl::Status CheckFirstLayout(uint64_t page_bytes) const;
  // Records a namespace the tree registered as `owner`'s. REQUIRES: mu_
  // held.
  NamespaceEntry Record(NamespaceId id, const NamespaceSpec& spec,
                        const BlockKey& root, const TenantScope& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;

  // Held shared by GuardIds, exclusively while ids are forgotten.
  mutable absl::Mutex ids_mu_;
  mutable absl::Mutex mu_;
  // mu_ protects the following.
  std::unique_ptr<gpu::PagePool> pool_owner_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RadixTree> tree_owner_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockKey, NamespaceEntry> namespaces_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NamespaceId, BlockKey> roots_ ABSL_GUARDED_BY(mu_);
  // Sessions bound to each namespace (absent: none).
  absl::flat_hash_map<BlockKey, uint32_t> bound_ ABSL_GUARDED_BY(mu_);
  std::string first_model_ ABSL_GUARDED_BY(mu_);
  uint64_t first_page_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  std::atomic<const gpu::PagePool*> pool_{nullptr};
  std::atomic<RadixTree*> tree_{nullptr};
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_CORE_NAMESPACE_REGISTRY_H_
