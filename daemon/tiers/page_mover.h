// File: daemon/tiers/page_mover.h
//
// PageMover: how tiers move bytes between the pool's pages and host
// memory, through the pool's PageCopier (cuda: cudaMemcpyAsync on a
// batch's own stream, to and from pinned memory). Every copy returns once
// it is done. A host pool's pages are also addressable directly
// (host_address), so a tier that reads and writes host memory may skip the
// copy.
//
// Staging buffers (kStagingBlocks pages of host memory from the copier)
// are recycled for tiers that hold no host memory of their own.
//
// Thread safety: thread-safe; concurrent calls move different pages.
#ifndef RADIXKV_DAEMON_TIERS_PAGE_MOVER_H_
#define RADIXKV_DAEMON_TIERS_PAGE_MOVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/page_copier.h"
#include "gpu/pool.h"
#include "base/mutex.h"

namespace radixkv::daemon {

class PageMover {
 public:
  static constexpr size_t kStagingBlocks = 16;

  // A mover for `pool` (which outlives it): its PageCopier, or the
  // copier's error (cuda: mapping the pool).
  static absl::StatusOr<std::unique_ptr<PageMover>> Create(
      const gpu::PagePool* pool);
  PageMover(const PageMover&) = delete;
  PageMover& operator=(const PageMover&) = delete;

  uint64_t page_bytes() const { return pool_->page_bytes(); }
  // The page's bytes when the pool is host memory; else null.
  void* host_address(uint64_t page) const {
    return direct_ ? pool_->host_page_address(page) : nullptr;
  }

  // Copies pages[i] to dst[i] / src[i] to pages[i] (page_bytes each). A
  // failure is counted (copy_errors) and logged before it is returned.
  absl::Status CopyOut(absl::Span<const uint64_t> pages,
                       absl::Span<void* const> dst);
  absl::Status CopyIn(absl::Span<const void* const> src,
                      absl::Span<const uint64_t> pages);

  // A staging buffer of kStagingBlocks pages; null (counted as a copy
  // error) when none can be had. Give it back with ReturnStaging.
  std::unique_ptr<gpu::HostMemory> TakeStaging();
  void ReturnStaging(std::unique_ptr<gpu::HostMemory> b);

  // Batches whose copies failed (their blocks were dropped).
  uint64_t copy_errors() const {
    return copy_errors_.load(std::memory_order_relaxed);
  }

 private:
  PageMover(const gpu::PagePool* pool,
            std::unique_ptr<gpu::PageCopier> copier);
  absl::Status Failed(absl::Status s);

  const gpu::PagePool* const pool_;
  const std::unique_ptr<gpu::PageCopier> copier_;
  const bool direct_;
  std::atomic<uint64_t> copy_errors_{0};

  SharedMutex staging_mu_;
  std::vector<std::unique_ptr<gpu::HostMemory>> staging_
      ABSL_GUARDED_BY(staging_mu_);
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_PAGE_MOVER_H_
