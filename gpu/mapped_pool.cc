// File: gpu/mapped_pool.cc
//
// MappedPool: layout validation and the host (mmap) mapping. The cuda
// mapping lives in cuda_pool.cc (or cuda_stub.cc without CUDA).
#include "gpu/mapped_pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu/pool_internal.h"
#include "base/status_macros.h"

namespace radixkv::gpu {

PoolLayout LayoutOf(const PagePool& pool) {
  PoolLayout layout;
  layout.backend = pool.backend();
  layout.page_bytes = pool.page_bytes();
  layout.pages_per_chunk = pool.pages_per_chunk();
  layout.capacity_pages = pool.capacity_pages();
  layout.device = pool.device();
  for (size_t c = 0; c < pool.chunk_count(); ++c) {
    layout.chunk_bytes.push_back(pool.chunk_bytes(c));
  }
  return layout;
}

absl::Status ValidatePoolLayout(const PoolLayout& layout, size_t fd_count) {
  if (layout.backend != Backend::kHost && layout.backend != Backend::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool layout: backend ", BackendName(layout.backend),
                     " has no memory to map (want host or cuda)"));
  }
  if (layout.page_bytes == 0 || layout.pages_per_chunk == 0 ||
      layout.capacity_pages == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool layout: page_bytes (", layout.page_bytes, "), pages_per_chunk (",
        layout.pages_per_chunk, ") and capacity_pages (", layout.capacity_pages,
        ") must all be > 0"));
  }
  if (layout.capacity_pages > internal::kMaxCapacityPages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool layout: capacity_pages=", layout.capacity_pages,
                     " exceeds ", internal::kMaxCapacityPages));
  }
  uint64_t want_chunks = (layout.capacity_pages + layout.pages_per_chunk - 1) /
                         layout.pages_per_chunk;
  if (layout.chunk_bytes.size() != want_chunks ||
      want_chunks > internal::kMaxChunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool layout: chunks has ", layout.chunk_bytes.size(),
                     " entries; capacity_pages=", layout.capacity_pages,
                     " / pages_per_chunk=", layout.pages_per_chunk, " needs ",
                     want_chunks, " (at most ", internal::kMaxChunks, ")"));
  }
  if (fd_count != want_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool layout: got ", fd_count, " fds for ", want_chunks,
                     " chunks (want one fd per chunk)"));
  }
  for (size_t c = 0; c < want_chunks; ++c) {
    uint64_t pages =
        std::min(layout.pages_per_chunk,
                 layout.capacity_pages - c * layout.pages_per_chunk);
    // pages * page_bytes cannot overflow silently: check by division.
    if (layout.page_bytes > UINT64_MAX / pages ||
        layout.chunk_bytes[c] < pages * layout.page_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool layout: chunks[", c, "].bytes=", layout.chunk_bytes[c],
          " is smaller than its ", pages, " pages of ", layout.page_bytes,
          " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::Map(
    const PoolLayout& layout, std::vector<UniqueFd> fds) {
  RETURN_IF_ERROR(ValidatePoolLayout(layout, fds.size()));
  std::unique_ptr<MappedPool> pool(new MappedPool(layout));
  absl::Status s = layout.backend == Backend::kHost
                       ? pool->MapHost(std::move(fds))
                       : pool->MapCuda(std::move(fds));
  if (!s.ok()) return s;
  return pool;
}

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::MapLocal(
    const PagePool& pool) {
  if (pool.backend() == Backend::kNone) {
    return absl::InvalidArgumentError(
        "MapLocal: a none pool has no memory to map");
  }
  std::vector<UniqueFd> fds;
  for (size_t c = 0; c < pool.chunk_count(); ++c) {
    UniqueFd fd(::fcntl(pool.chunk_fd(c), F_DUPFD_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoStatus("MapLocal: dup of a chunk fd", errno);
    fds.push_back(std::move(fd));
  }
  return Map(LayoutOf(pool), std::move(fds));
}

MappedPool::~MappedPool() = default;

absl::Status MappedPool::MapHost(std::vector<UniqueFd> fds) {
  for (size_t c = 0; c < fds.size(); ++c) {
    struct stat st;
    if (::fstat(fds[c].get(), &st) != 0) {
      return ErrnoStatus(absl::StrCat("host pool: fstat of chunk ", c), errno);
    }
    // Mapping past the end of the file would turn accesses into SIGBUS.
    if (static_cast<uint64_t>(st.st_size) < layout_.chunk_bytes[c]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host pool: chunk ", c, " fd holds ", st.st_size,
          " bytes, fewer than chunks[", c, "].bytes=", layout_.chunk_bytes[c]));
    }
    absl::StatusOr<SharedMapping> m =
        SharedMapping::Map(fds[c].get(), layout_.chunk_bytes[c]);
    if (!m.ok()) return m.status();
    chunk_base_.push_back(static_cast<char*>(m->data()));
    host_mappings_.push_back(*std::move(m));
  }
  return absl::OkStatus();  // `fds` closes here; the mappings stay valid.
}

void* MappedPool::page_address(uint64_t page) const {
  if (page >= layout_.capacity_pages) return nullptr;
  return chunk_base_[page / layout_.pages_per_chunk] +
         (page % layout_.pages_per_chunk) * layout_.page_bytes;
}

}  // namespace radixkv::gpu
