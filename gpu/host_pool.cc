// File: gpu/host_pool.cc
//
// The host backend: one sealed memfd per chunk, mapped MAP_SHARED in the
// daemon. Workers receive the fds over the attach socket and map them too, so
// every process sees the same bytes. The memfds are sealed against shrinking
// and growing, so no worker can truncate a chunk under the others (which
// would turn their reads into SIGBUS).
#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/pool.h"
#include "gpu/pool_internal.h"
#include "gpu/posix_resources.h"

namespace radixkv::gpu::internal {
namespace {

struct HostChunk {
  UniqueFd fd;
  SharedMapping mapping;
};

class HostPagePool final : public PagePool {
 public:
  HostPagePool(uint64_t page_bytes, uint64_t capacity, uint64_t per_chunk,
               std::vector<HostChunk> chunks)
      : page_bytes_(page_bytes),
        capacity_(capacity),
        per_chunk_(per_chunk),
        chunks_(std::move(chunks)) {}

  Backend backend() const override { return Backend::kHost; }
  uint64_t page_bytes() const override { return page_bytes_; }
  uint64_t capacity_pages() const override { return capacity_; }
  uint64_t pages_per_chunk() const override { return per_chunk_; }
  int device() const override { return -1; }
  size_t chunk_count() const override { return chunks_.size(); }
  uint64_t chunk_bytes(size_t chunk) const override {
    return chunk < chunks_.size() ? chunks_[chunk].mapping.size() : 0;
  }
  int chunk_fd(size_t chunk) const override {
    return chunk < chunks_.size() ? chunks_[chunk].fd.get() : -1;
  }
  void* host_page_address(uint64_t page) const override {
    if (page >= capacity_) return nullptr;
    const HostChunk& c = chunks_[page / per_chunk_];
    return static_cast<char*>(c.mapping.data()) +
           (page % per_chunk_) * page_bytes_;
  }

 private:
  const uint64_t page_bytes_;
  const uint64_t capacity_;
  const uint64_t per_chunk_;
  const std::vector<HostChunk> chunks_;
};

absl::StatusOr<HostChunk> CreateChunk(size_t index, uint64_t bytes) {
  std::string name = absl::StrCat("radixkv-pool-", index);
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus("host pool: memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(absl::StrCat("host pool: ftruncate of chunk ", index,
                                    " to ", bytes, " bytes"),
                       errno);
  }
  if (::fcntl(fd.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus("host pool: sealing the memfd", errno);
  }
  absl::StatusOr<SharedMapping> mapping = SharedMapping::Map(fd.get(), bytes);
  if (!mapping.ok()) {
    return absl::Status(mapping.status().code(),
                        absl::StrCat("host pool: chunk ", index, ": ",
                                     mapping.status().message()));
  }
  return HostChunk{std::move(fd), *std::move(mapping)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<PagePool>> CreateHostPagePool(
    const PoolSpec& spec, uint64_t page_bytes, uint64_t capacity) {
  absl::StatusOr<uint64_t> per_chunk = PagesPerChunk(
      capacity, page_bytes, spec.chunk_bytes, kDefaultHostChunkBytes);
  if (!per_chunk.ok()) return per_chunk.status();
  uint64_t n_chunks = (capacity + *per_chunk - 1) / *per_chunk;
  std::vector<HostChunk> chunks;
  chunks.reserve(n_chunks);
  for (uint64_t c = 0; c < n_chunks; ++c) {
    uint64_t pages = std::min(*per_chunk, capacity - c * *per_chunk);
    absl::StatusOr<HostChunk> chunk = CreateChunk(c, pages * page_bytes);
    if (!chunk.ok()) return chunk.status();
    chunks.push_back(*std::move(chunk));
  }
  return std::unique_ptr<PagePool>(
      new HostPagePool(page_bytes, capacity, *per_chunk, std::move(chunks)));
}

}  // namespace radixkv::gpu::internal
