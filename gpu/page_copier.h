// File: gpu/page_copier.h
//
// PageCopier: the daemon's own copies of whole pages between its pool and
// host memory, for the tiers below the pool (docs/TIERS.md). A worker never
// uses it; workers reach pages through MappedPool.
//
//   auto copier = CreatePageCopier(*pool);            // once, at start
//   auto mem = copier.value()->AllocateHost(1 << 30);  // a host tier's slots
//   std::unique_ptr<PageCopier::Batch> b = copier.value()->NewBatch();
//   b->CopyOut(pages, dst);   // pool pages -> host, queued
//   b->CopyIn(src, pages);    // host -> pool pages, queued after them
//   absl::Status s = b->Wait();  // every queued copy is done (or failed)
//
// Backends:
//   host  memcpy through the daemon's own mapping of the pool; copies are
//         done when queued. AllocateHost maps anonymous memory.
//   cuda  the pool's chunks are mapped into the daemon (as a worker maps
//         them); each Batch owns a non-blocking CUDA stream on the pool's
//         device, copies are cudaMemcpyAsync on it (runs of adjacent pages
//         on both sides coalesced into one copy), and Wait synchronises that
//         stream. AllocateHost returns pinned (page-locked) memory, which
//         the copies need to be asynchronous and to run at full bandwidth.
//   none  CreatePageCopier fails: there are no bytes to copy.
//
// Order: the copies of one Batch run in the order they were queued, so a
// page copied out and then overwritten by a CopyIn of the same batch is
// copied out first. Different batches are unordered.
//
// Thread safety: a PageCopier is thread-safe (each thread makes its own
// batches); a Batch belongs to one thread. The pages themselves are
// synchronised by the caller: a page being copied is owned by it (a lease's
// new page, or an evicted page not yet handed out).
#ifndef RADIXKV_GPU_PAGE_COPIER_H_
#define RADIXKV_GPU_PAGE_COPIER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/pool.h"

namespace radixkv::gpu {

// Host memory a PageCopier copies to and from at full speed; released on
// destruction.
class HostMemory {
 public:
  virtual ~HostMemory() = default;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  char* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // Page-locked and registered with the device (cuda pools).
  virtual bool pinned() const = 0;

 protected:
  HostMemory(char* data, uint64_t bytes) : data_(data), bytes_(bytes) {}

 private:
  char* const data_;
  const uint64_t bytes_;
};

class PageCopier {
 public:
  class Batch {
   public:
    // Waits for copies still in flight (their status is lost).
    virtual ~Batch() = default;
    // Queues copies of page pages[i] into dst[i], page_bytes each.
    // REQUIRES: pages.size() == dst.size().
    virtual void CopyOut(absl::Span<const uint64_t> pages,
                         absl::Span<void* const> dst) = 0;
    // Queues copies of src[i] into page pages[i], page_bytes each.
    // REQUIRES: src.size() == pages.size().
    virtual void CopyIn(absl::Span<const void* const> src,
                        absl::Span<const uint64_t> pages) = 0;
    // Waits until every queued copy has finished. The first error, if any:
    // INVALID_ARGUMENT naming a page id at or past the pool's capacity
    // (nothing of that call was copied), or INTERNAL with the CUDA error
    // (the bytes of that batch's destinations are then unspecified). The
    // batch can be reused afterwards.
    virtual absl::Status Wait() = 0;
  };

  virtual ~PageCopier() = default;
  PageCopier(const PageCopier&) = delete;
  PageCopier& operator=(const PageCopier&) = delete;

  virtual Backend backend() const = 0;
  virtual uint64_t page_bytes() const = 0;
  // A new batch. For cuda, its stream comes from a pool of streams that
  // batches return on destruction.
  virtual std::unique_ptr<Batch> NewBatch() const = 0;
  // AllocateHostMemory for this copier's pool.
  virtual absl::StatusOr<std::unique_ptr<HostMemory>> AllocateHost(
      uint64_t bytes) const = 0;

 protected:
  PageCopier() = default;
};

// `bytes` of host memory suited to copies with a pool of `backend` on
// `device`: pinned (page-locked, portable) for cuda, anonymous memory for
// host; its bytes are unspecified until written. Needs no pool, so a tier can take its memory at start.
// RESOURCE_EXHAUSTED with the size and the system's error when it cannot
// be had; FAILED_PRECONDITION for cuda without a driver or device (or in a
// build without CUDA); INVALID_ARGUMENT for none.
absl::StatusOr<std::unique_ptr<HostMemory>> AllocateHostMemory(
    Backend backend, int device, uint64_t bytes);

// A copier for `pool`, which must outlive it. INVALID_ARGUMENT for a none
// pool; for cuda, the errors of mapping the pool (FAILED_PRECONDITION with
// no driver or device, or in a build without CUDA).
absl::StatusOr<std::unique_ptr<PageCopier>> CreatePageCopier(
    const PagePool& pool);

namespace internal {
// The cuda backend's copier (cuda_copier.cc; cuda_stub.cc without CUDA).
absl::StatusOr<std::unique_ptr<PageCopier>> CreateCudaPageCopier(
    const PagePool& pool);
// cudaHostAlloc'ed memory on `device` (cuda_host_memory.cc; cuda_stub.cc
// without CUDA): AllocateHostMemory's cuda backend.
absl::StatusOr<std::unique_ptr<HostMemory>> AllocatePinnedHostMemory(
    int device, uint64_t bytes);
}  // namespace internal

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_PAGE_COPIER_H_
