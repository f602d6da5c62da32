#include "worker/prefix_cache.h"

#include "worker/cuda_model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gpu/mapped_pool.h"
#include "gpu/namespace_geometry.h"
#include "radix/radix_tree.h"
#include "base/status_macros.h"

namespace radixkv::worker {
namespace {

// ---------------------------------------------------------------------------
// NoPrefixCache
// ---------------------------------------------------------------------------

class EmptyLease final : public CacheLease {
 public:
  explicit EmptyLease(bool degraded) : degraded_(degraded) {}
  uint32_t matched_blocks() const override { return 0; }
  uint32_t new_blocks() const override { return 0; }
  bool degraded() const override { return degraded_; }
  void* page_address(size_t) const override { return nullptr; }
  absl::Status Commit(uint32_t blocks, bool) override {
    if (blocks == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "commit of ", blocks, " blocks: this lease has no new pages"));
  }
  absl::Status Release() override { return absl::OkStatus(); }

 private:
  bool degraded_;
};

class NoPrefixCache final : public PrefixCache {
 public:
  absl::StatusOr<std::unique_ptr<CacheLease>> Acquire(absl::Span<const uint32_t>,
                                                      bool) override {
    return std::make_unique<EmptyLease>(false);
  }
  std::string Describe() const override { return "none"; }
};

// ---------------------------------------------------------------------------
// LocalPrefixCache: RadixTree + host page array.
// ---------------------------------------------------------------------------

class LocalPrefixCache;

class LocalLease final : public CacheLease {
 public:
  LocalLease(RadixTree* tree, uint8_t* pool, uint64_t page_bytes,
             bool device, AcquireResult result)
      : tree_(tree),
        pool_(pool),
        page_bytes_(page_bytes),
        device_(device),
        r_(std::move(result)) {}
  ~LocalLease() override { (void)Release(); }

  uint32_t matched_blocks() const override { return r_.matched_blocks; }
  uint32_t new_blocks() const override { return r_.new_blocks; }
  void* page_address(size_t i) const override {
    if (i >= r_.pages.size()) return nullptr;
    return pool_ + uint64_t{r_.pages[i]} * page_bytes_;
  }
  bool device_pages() const override { return device_; }
  absl::Status Commit(uint32_t blocks, bool release) override {
    if (r_.lease == 0) {
      if (blocks == 0) return absl::OkStatus();
      return absl::FailedPreconditionError("commit on a lease that is not held");
    }
    ASSIGN_OR_RETURN(CommitResult c, tree_->Commit(r_.lease, blocks, release));
    if (c.released) r_.lease = 0;
    return absl::OkStatus();
  }
  absl::Status Release() override {
    if (r_.lease == 0) return absl::OkStatus();
    const LeaseId id = std::exchange(r_.lease, 0);
    return tree_->Release(id);
  }

 private:
  RadixTree* tree_;
  uint8_t* pool_;
  uint64_t page_bytes_;
  bool device_;
  AcquireResult r_;
};

class LocalPrefixCache final : public PrefixCache {
 public:
  // `device_pool`: the pages live in this device allocation instead of
  // host memory.
  LocalPrefixCache(const NamespaceSpec& ns, uint32_t capacity_pages,
                   std::shared_ptr<uint8_t> device_pool)
      : ns_(ns),
        page_bytes_(NamespacePageBytes(ns)),
        capacity_pages_(capacity_pages),
        pool_(device_pool ? 0 : page_bytes_ * capacity_pages),
        device_pool_(std::move(device_pool)) {}

  absl::Status Init() {
    ASSIGN_OR_RETURN(tree_,
                     RadixTree::Create({.capacity_pages = capacity_pages_,
                                        .max_page_size = ns_.page_size}));
    ASSIGN_OR_RETURN(ns_id_, tree_->RegisterNamespace(ns_));
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<CacheLease>> Acquire(
      absl::Span<const uint32_t> tokens, bool allocate) override {
    ASSIGN_OR_RETURN(AcquireResult r,
                     tree_->Acquire({.ns = ns_id_,
                                     .tokens = tokens,
                                     .allocate = allocate}));
    const bool device = device_pool_ != nullptr;
    return std::unique_ptr<CacheLease>(
        new LocalLease(tree_.get(), device ? device_pool_.get() : pool_.data(),
                       page_bytes_, device, std::move(r)));
  }
  std::string Describe() const override {
    return absl::StrCat("local (", capacity_pages_, " pages",
                        device_pool_ ? ", device" : "", ")");
  }

 private:
  const NamespaceSpec ns_;
  const uint64_t page_bytes_;
  const uint32_t capacity_pages_;
  std::unique_ptr<RadixTree> tree_;  // set by Init
  std::vector<uint8_t> pool_;
  std::shared_ptr<uint8_t> device_pool_;  // set: pages in device memory
  NamespaceId ns_id_ = 0;
};

// ---------------------------------------------------------------------------
// DaemonPrefixCache: radixkv::Client.
// ---------------------------------------------------------------------------

class DaemonLease final : public CacheLease {
 public:
  // `usable_pool`: the client's pool is mapped in a form the model can
  // read (host, or cuda for a CUDA model); `device`: it is a cuda pool.
  DaemonLease(Lease lease, bool usable_pool, bool device)
      : lease_(std::move(lease)), device_(device) {
    // Pages the worker cannot address (no mapping, a cuda pool for a CPU
    // model) are useless to it: serve such a lease as a miss and let the
    // daemon free its pages.
    const size_t n = lease_.pages().size();
    for (size_t i = 0; i < n && usable_; ++i) {
      usable_ = usable_pool && lease_.page_address(i) != nullptr;
    }
    if (!usable_) (void)lease_.Release();
  }
  ~DaemonLease() override { (void)Release(); }

  uint32_t matched_blocks() const override {
    return usable_ ? lease_.matched_blocks() : 0;
  }
  uint32_t new_blocks() const override { return usable_ ? lease_.new_blocks() : 0; }
  bool degraded() const override { return lease_.degraded() || !usable_; }
  void* page_address(size_t i) const override {
    return usable_ ? lease_.page_address(i) : nullptr;
  }
  bool device_pages() const override { return usable_ && device_; }
  absl::Status ConfirmRead() const override {
    return usable_ ? lease_.ConfirmRead() : absl::OkStatus();
  }
  absl::Status Commit(uint32_t blocks, bool release) override {
    if (!usable_ || !lease_.held()) {
      if (blocks == 0) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat("commit of ", blocks, " blocks: lease not held"));
    }
    if (blocks == 0 && release) return Release();
    return lease_.Commit(blocks, release).status();
  }
  // Dropping the client Lease ends it without a call of its own: the release
  // rides on the worker's next Acquire (ClientOptions::release_delay).
  absl::Status Release() override {
    lease_ = Lease();
    return absl::OkStatus();
  }

 private:
  Lease lease_;
  const bool device_;
  bool usable_ = true;
};

class DaemonPrefixCache final : public PrefixCache {
 public:
  DaemonPrefixCache(Client* client, bool accept_device_pages)
      : client_(client),
        accept_device_pages_(accept_device_pages),
        page_bytes_(NamespacePageBytes(client->options().ns)) {}

  absl::StatusOr<std::unique_ptr<CacheLease>> Acquire(
      absl::Span<const uint32_t> tokens, bool allocate) override {
    AcquireOptions options;
    options.allocate = allocate;
    ASSIGN_OR_RETURN(Lease lease, client_->Acquire(tokens, options));
    const std::shared_ptr<gpu::MappedPool> pool = client_->pool();
    // A pool whose pages are not this namespace's page size (a daemon that
    // sizes pages without the fp8/int8 scale area) cannot hold its pages.
    const bool sized = pool != nullptr && pool->page_bytes() == page_bytes_;
    const bool host_pool = sized && pool->backend() == gpu::Backend::kHost;
    const bool cuda_pool = sized && pool->backend() == gpu::Backend::kCuda;
    return std::unique_ptr<CacheLease>(new DaemonLease(
        std::move(lease), host_pool || (cuda_pool && accept_device_pages_),
        cuda_pool));
  }
  std::string Describe() const override {
    return absl::StrCat("daemon ", client_->options().endpoint);
  }

 private:
  Client* client_;
  const bool accept_device_pages_;
  const uint64_t page_bytes_;  // NamespacePageBytes of the client's namespace
};

}  // namespace

std::unique_ptr<PrefixCache> NewNoPrefixCache() {
  return std::make_unique<NoPrefixCache>();
}

absl::StatusOr<std::unique_ptr<PrefixCache>> NewLocalPrefixCache(
    const NamespaceSpec& ns, uint32_t capacity_pages, bool device_pages) {
  if (NamespacePageBytes(ns) == 0) {
    return absl::InvalidArgumentError(
        "namespace layout incomplete: page bytes would be 0");
  }
  if (capacity_pages == 0) {
    return absl::InvalidArgumentError("capacity_pages must be > 0");
  }
  std::shared_ptr<uint8_t> device_pool;
  if (device_pages) {
    ASSIGN_OR_RETURN(device_pool, CudaModel::AllocateDeviceBytes(
                                      NamespacePageBytes(ns) * capacity_pages));
  }
  auto cache = std::make_unique<LocalPrefixCache>(ns, capacity_pages,
                                                  std::move(device_pool));
  RETURN_IF_ERROR(cache->Init());
  return std::unique_ptr<PrefixCache>(std::move(cache));
}

std::unique_ptr<PrefixCache> NewDaemonPrefixCache(Client* client,
                                                  bool accept_device_pages) {
  return std::make_unique<DaemonPrefixCache>(client, accept_device_pages);
}

}  // namespace radixkv::worker
