#include "daemon/tiers/page_mover.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace radixkv::daemon {

absl::StatusOr<std::unique_ptr<PageMover>> PageMover::Create(
    const gpu::PagePool* pool) {
  absl::StatusOr<std::unique_ptr<gpu::PageCopier>> copier =
      gpu::CreatePageCopier(*pool);
  if (!copier.ok()) return copier.status();
  return std::unique_ptr<PageMover>(new PageMover(pool, *std::move(copier)));
}

PageMover::PageMover(const gpu::PagePool* pool,
                     std::unique_ptr<gpu::PageCopier> copier)
    : pool_(pool),
      copier_(std::move(copier)),
      direct_(pool->host_page_address(0) != nullptr) {}

absl::Status PageMover::Failed(absl::Status s) {
  copy_errors_.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kWarning,
      absl::StrCat("tier: a page copy failed, its blocks are dropped: ",
                   s.ToString()));
  return s;
}

absl::Status PageMover::CopyOut(absl::Span<const uint64_t> pages,
                                absl::Span<void* const> dst) {
  std::unique_ptr<gpu::PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(pages, dst);
  absl::Status s = batch->Wait();
  return s.ok() ? s : Failed(std::move(s));
}

absl::Status PageMover::CopyIn(absl::Span<const void* const> src,
                               absl::Span<const uint64_t> pages) {
  std::unique_ptr<gpu::PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyIn(src, pages);
  absl::Status s = batch->Wait();
  return s.ok() ? s : Failed(std::move(s));
}

std::unique_ptr<gpu::HostMemory> PageMover::TakeStaging() {
  {
    WriterMutexLock l(&staging_mu_);
    if (!staging_.empty()) {
      std::unique_ptr<gpu::HostMemory> b = std::move(staging_.back());
      staging_.pop_back();
      return b;
    }
  }
  absl::StatusOr<std::unique_ptr<gpu::HostMemory>> b =
      copier_->AllocateHost(kStagingBlocks * pool_->page_bytes());
  if (!b.ok()) {
    Failed(b.status()).IgnoreError();
    return nullptr;
  }
  return *std::move(b);
}

void PageMover::ReturnStaging(std::unique_ptr<gpu::HostMemory> b) {
  if (b == nullptr) return;
  WriterMutexLock l(&staging_mu_);
  staging_.push_back(std::move(b));
}

}  // namespace radixkv::daemon
