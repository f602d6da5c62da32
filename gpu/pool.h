// File: gpu/pool.h
//
// PagePool: the memory behind page ids. A pool is a fixed number of
// equal-sized pages in one or more chunks; page p lives in chunk
// p / pages_per_chunk() at byte offset (p % pages_per_chunk()) * page_bytes().
// The radix index (radix/) decides which page ids are free, written or cached;
// the pool only provides their memory and the fds that let workers map it.
//
// Backends:
//   none  index only: no memory, page_bytes() == 0, no chunks
//   host  memfd chunks mapped MAP_SHARED in the daemon; workers mmap the fds
//   cuda  CUDA VMM allocations with POSIX-fd shareable handles (one per
//         chunk); workers import, reserve, map and set access. The driver API
//         is fetched at run time, so the binary starts with no driver.
//
// Thread safety: a created pool is immutable; all methods are const and safe
// from any thread. The memory itself is synchronised by the lease protocol.
#ifndef RADIXKV_GPU_POOL_H_
#define RADIXKV_GPU_POOL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace radixkv::gpu {

enum class Backend { kNone, kHost, kCuda };

// "none" / "host" / "cuda".
const char* BackendName(Backend b);

// A parsed --pool flag.
struct PoolSpec {
  Backend backend = Backend::kHost;
  uint64_t bytes = uint64_t{1} << 30;  // host/cuda: byte budget
  uint64_t pages = 0;                  // none: capacity in pages
  int device = 0;                      // cuda: device ordinal
  // Bytes per chunk (rounded down to a page multiple and, for cuda, to the
  // allocation granularity); 0 = backend default (host: 256 MiB, cuda: 1 GiB).
  uint64_t chunk_bytes = 0;
  // The page size in bytes the operator fixes for every namespace (any
  // backend); 0 = fixed by the first namespace that binds.
  uint64_t page_bytes = 0;
};

// Parses "host,bytes=1GiB", "cuda,device=0,bytes=60GiB", "none,pages=100000"
// (sizes take B, KiB, MiB, GiB, TiB, KB, MB, GB or no unit; optional
// chunk_bytes=SIZE and page_bytes=SIZE). INVALID_ARGUMENT names the
// offending key and value.
absl::StatusOr<PoolSpec> ParsePoolSpec(absl::string_view spec);
// Parses a size: "123", "4KiB", "1GB" (B, KiB, MiB, GiB, TiB, KB, MB, GB,
// TB; case-insensitive). false on malformed input or overflow.
bool ParseSize(absl::string_view text, uint64_t* out);
std::string FormatPoolSpec(const PoolSpec& spec);

class PagePool {
 public:
  virtual ~PagePool() = default;
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  virtual Backend backend() const = 0;
  virtual uint64_t page_bytes() const = 0;       // 0 for none
  virtual uint64_t capacity_pages() const = 0;
  virtual uint64_t pages_per_chunk() const = 0;  // 0 for none
  virtual int device() const = 0;                // -1 unless cuda
  virtual size_t chunk_count() const = 0;
  virtual uint64_t chunk_bytes(size_t chunk) const = 0;
  // The shareable fd of a chunk (memfd, or exported CUDA handle), owned by
  // the pool: callers dup() or send it, never close it.
  virtual int chunk_fd(size_t chunk) const = 0;
  // Host address of a page in the daemon's own mapping (host backend only;
  // nullptr otherwise).
  virtual void* host_page_address(uint64_t page) const = 0;

 protected:
  PagePool() = default;
};

// Creates a pool for pages of `page_bytes` bytes within spec's budget:
// capacity = floor(bytes / page_bytes) (none: spec.pages, page_bytes ignored).
// Errors: INVALID_ARGUMENT when page_bytes is 0 or larger than the budget
// (the message names both sizes); FAILED_PRECONDITION for cuda with no driver
// or device ("cuda pool: no CUDA driver/device: ..."); INTERNAL for a failed
// allocation, with the errno/CUDA error text.
// Whether this process can serve `spec` at all, checked before any page
// size is known: host and none always; cuda when the build has CUDA and the
// driver and device are usable. FAILED_PRECONDITION saying what is missing.
absl::Status CheckPoolUsable(const PoolSpec& spec);

absl::StatusOr<std::unique_ptr<PagePool>> CreatePagePool(const PoolSpec& spec,
                                                         uint64_t page_bytes);

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_POOL_H_
