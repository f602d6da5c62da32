// File: gpu/page_copier.cc
//
// CreatePageCopier and the host backend's copier: plain memcpy through the
// daemon's own mapping of the pool (PagePool::host_page_address).
#include "gpu/page_copier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/bytes.h"

namespace radixkv::gpu {
namespace {

class MappedHostMemory final : public HostMemory {
 public:
  MappedHostMemory(char* data, uint64_t bytes) : HostMemory(data, bytes) {}
  ~MappedHostMemory() override { munmap(data(), bytes()); }
  bool pinned() const override { return false; }
};

absl::Status BadPage(uint64_t page, uint64_t capacity) {
  return absl::InvalidArgumentError(
      absl::StrCat("page copy: page ", page, " is not below the pool's ",
                   capacity, " pages"));
}

class HostBatch final : public PageCopier::Batch {
 public:
  explicit HostBatch(const PagePool* pool) : pool_(pool) {}

  void CopyOut(absl::Span<const uint64_t> pages,
               absl::Span<void* const> dst) override {
    if (!Check(pages)) return;
    for (size_t i = 0; i < pages.size(); ++i) {
      std::memcpy(dst[i], pool_->host_page_address(pages[i]),
                  pool_->page_bytes());
    }
  }

  void CopyIn(absl::Span<const void* const> src,
              absl::Span<const uint64_t> pages) override {
    if (!Check(pages)) return;
    for (size_t i = 0; i < pages.size(); ++i) {
      std::memcpy(pool_->host_page_address(pages[i]), src[i],
                  pool_->page_bytes());
    }
  }

  absl::Status Wait() override { return std::exchange(status_, {}); }

 private:
  bool Check(absl::Span<const uint64_t> pages) {
    for (uint64_t p : pages) {
      if (p >= pool_->capacity_pages()) {
        if (status_.ok()) status_ = BadPage(p, pool_->capacity_pages());
        return false;
      }
    }
    return true;
  }

  const PagePool* const pool_;
  absl::Status status_;
};

class HostPageCopier final : public PageCopier {
 public:
  explicit HostPageCopier(const PagePool* pool) : pool_(pool) {}

  Backend backend() const override { return Backend::kHost; }
  uint64_t page_bytes() const override { return pool_->page_bytes(); }
  std::unique_ptr<Batch> NewBatch() const override {
    return std::make_unique<HostBatch>(pool_);
  }
  absl::StatusOr<std::unique_ptr<HostMemory>> AllocateHost(
      uint64_t bytes) const override {
    return AllocateHostMemory(Backend::kHost, -1, bytes);
  }

 private:
  const PagePool* const pool_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostMemory>> AllocateHostMemory(
    Backend backend, int device, uint64_t bytes) {
  if (backend == Backend::kCuda) {
    return internal::AllocatePinnedHostMemory(device, bytes);
  }
  if (backend == Backend::kNone) {
    return absl::InvalidArgumentError(
        "host memory: a none pool (--pool=none) has no pages to copy");
  }
  if (bytes == 0) {
    return absl::InvalidArgumentError("host memory: 0 bytes asked for");
  }
  // Pages are touched only when a block lands in them, so an impossible
  // budget would be granted now and fail later, under load: refuse one
  // beyond the machine's memory here.
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0 &&
      bytes > static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)) {
    // A configuration error: no restart on this machine can grant it.
    return absl::InvalidArgumentError(absl::StrCat(
        "host memory: ", HumanBytes(bytes), " asked for, the machine has ",
        HumanBytes(static_cast<uint64_t>(pages) *
                   static_cast<uint64_t>(page_size)),
        " in all"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host memory: mmap of ", bytes,
                     " bytes failed: ", std::strerror(errno)));
  }
  return std::unique_ptr<HostMemory>(
      new MappedHostMemory(static_cast<char*>(p), bytes));
}

absl::StatusOr<std::unique_ptr<PageCopier>> CreatePageCopier(
    const PagePool& pool) {
  switch (pool.backend()) {
    case Backend::kHost:
      return std::unique_ptr<PageCopier>(new HostPageCopier(&pool));
    case Backend::kCuda:
      return internal::CreateCudaPageCopier(pool);
    case Backend::kNone:
      break;
  }
  return absl::InvalidArgumentError(
      "page copy: a none pool (--pool=none) holds no bytes to copy");
}

}  // namespace radixkv::gpu
