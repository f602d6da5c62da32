// File: gpu/pool_internal.h
//
// Backend factories behind CreatePagePool (pool.cc) and limits shared by the
// backends and the worker-side mapping. Not part of the public API.
#ifndef RADIXKV_GPU_POOL_INTERNAL_H_
#define RADIXKV_GPU_POOL_INTERNAL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "gpu/pool.h"

namespace radixkv::gpu::internal {

// Page ids are radix::PageId (uint32) and 0xffffffff means "no page".
inline constexpr uint64_t kMaxCapacityPages = 0xfffffffeull;
// Linux passes at most SCM_MAX_FD (253) fds in one message, and the attach
// protocol sends every chunk's fd in one message.
inline constexpr uint64_t kMaxChunks = 253;
inline constexpr uint64_t kDefaultHostChunkBytes = uint64_t{256} << 20;
inline constexpr uint64_t kDefaultCudaChunkBytes = uint64_t{1} << 30;

// Chunking of `capacity` pages of `page_bytes` with a target chunk size of
// `chunk_bytes` (0 = `default_chunk_bytes`): at least one page per chunk,
// never more pages per chunk than the capacity. INVALID_ARGUMENT when more
// than kMaxChunks chunks would be needed (the message says how to fix it).
absl::StatusOr<uint64_t> PagesPerChunk(uint64_t capacity, uint64_t page_bytes,
                                       uint64_t chunk_bytes,
                                       uint64_t default_chunk_bytes);

absl::StatusOr<std::unique_ptr<PagePool>> CreateHostPagePool(
    const PoolSpec& spec, uint64_t page_bytes, uint64_t capacity);

// FAILED_PRECONDITION "built without CUDA" when the library was built
// without the CUDA toolkit, or naming the missing driver or device.
absl::Status CheckCudaUsable(int device);

// FAILED_PRECONDITION "built without CUDA" when the library was built
// without the CUDA toolkit.
absl::StatusOr<std::unique_ptr<PagePool>> CreateCudaPagePool(
    const PoolSpec& spec, uint64_t page_bytes, uint64_t capacity);

}  // namespace radixkv::gpu::internal

#endif  // RADIXKV_GPU_POOL_INTERNAL_H_
