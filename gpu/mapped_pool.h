// File: gpu/mapped_pool.h
//
// MappedPool: a worker's view of the daemon's page pool, built from the chunk
// fds the attach protocol delivers (client/attach.h) or, in-process, from a
// PagePool's own fds (MapLocal).
//
//   host  each chunk fd is mmap'ed PROT_READ|PROT_WRITE, MAP_SHARED;
//         page_address() is a CPU pointer.
//   cuda  each fd is imported (cuMemImportFromShareableHandle), one virtual
//         address range is reserved for all chunks, every chunk is mapped
//         into it and made read-write for the pool's device; the fds are
//         closed after import. page_address() is a device pointer.
//
// Page p lives in chunk p / pages_per_chunk at byte offset
// (p % pages_per_chunk) * page_bytes, exactly as on the daemon side.
//
// Ownership: a MappedPool owns its mappings (and CUDA handles) and releases
// them on destruction; addresses it returned are invalid afterwards. The
// mapping stays valid if the daemon exits: the memory lives as long as any
// process maps it.
//
// Thread safety: immutable after Map(); all methods are const and safe from
// any thread. Reads and writes of the pages themselves are ordered by the
// lease protocol (write, wait for completion, then Commit).
#ifndef RADIXKV_GPU_MAPPED_POOL_H_
#define RADIXKV_GPU_MAPPED_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/pool.h"
#include "gpu/posix_resources.h"

namespace radixkv::gpu {

// The geometry of a shared pool, as carried by radixkv.v1.AttachResponse.
struct PoolLayout {
  Backend backend = Backend::kHost;
  uint64_t page_bytes = 0;
  uint64_t pages_per_chunk = 0;
  uint64_t capacity_pages = 0;
  std::vector<uint64_t> chunk_bytes;  // one entry per chunk, in order
  int device = -1;                    // cuda device ordinal; -1 otherwise
};

// The layout of a pool (chunk sizes read from the pool).
PoolLayout LayoutOf(const PagePool& pool);

// Checks that a layout describes a mappable pool: backend host or cuda,
// page_bytes, pages_per_chunk and capacity_pages > 0, exactly
// ceil(capacity / pages_per_chunk) chunks (at most 253), each large enough
// for its pages, and `fd_count` equal to the chunk count. INVALID_ARGUMENT
// naming the field and the expected value otherwise.
absl::Status ValidatePoolLayout(const PoolLayout& layout, size_t fd_count);

class MappedPool {
 public:
  // Maps the chunks. `fds` holds one fd per chunk, in order; MappedPool takes
  // them (host: closed once mapped; cuda: closed once imported). Errors:
  // INVALID_ARGUMENT for a bad layout or an fd smaller than its chunk;
  // FAILED_PRECONDITION for cuda without a driver/device or in a build
  // without CUDA; INTERNAL (errno or CUDA error text) when mapping fails.
  static absl::StatusOr<std::unique_ptr<MappedPool>> Map(
      const PoolLayout& layout, std::vector<UniqueFd> fds);

  // Maps `pool`'s chunks in this process through duplicates of its fds, as a
  // worker would. INVALID_ARGUMENT for a none pool.
  static absl::StatusOr<std::unique_ptr<MappedPool>> MapLocal(
      const PagePool& pool);

  ~MappedPool();
  MappedPool(const MappedPool&) = delete;
  MappedPool& operator=(const MappedPool&) = delete;

  Backend backend() const { return layout_.backend; }
  uint64_t page_bytes() const { return layout_.page_bytes; }
  uint64_t pages_per_chunk() const { return layout_.pages_per_chunk; }
  uint64_t capacity_pages() const { return layout_.capacity_pages; }
  int device() const { return layout_.device; }
  const PoolLayout& layout() const { return layout_; }

  // The address of page `page` (host: CPU pointer; cuda: device pointer), or
  // nullptr when page >= capacity_pages().
  void* page_address(uint64_t page) const;

 private:
  struct CudaState;
  struct CudaStateDeleter {
    void operator()(CudaState* state) const;
  };

  explicit MappedPool(PoolLayout layout) : layout_(std::move(layout)) {}
  absl::Status MapHost(std::vector<UniqueFd> fds);
  absl::Status MapCuda(std::vector<UniqueFd> fds);  // cuda_pool.cc

  PoolLayout layout_;
  std::vector<char*> chunk_base_;
  std::vector<SharedMapping> host_mappings_;
  std::unique_ptr<CudaState, CudaStateDeleter> cuda_;
};

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_MAPPED_POOL_H_
