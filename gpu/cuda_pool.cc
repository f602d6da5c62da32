// File: gpu/cuda_pool.cc
//
// The cuda backend (built only with the CUDA toolkit):
//
//   daemon  one cuMemCreate allocation per chunk, requested with POSIX-fd
//           shareable handles and exported once with
//           cuMemExportToShareableHandle; the pool keeps the handles and fds.
//   worker  MappedPool::MapCuda imports each fd, reserves one VA range for
//           all chunks, maps the chunks back to back and grants the device
//           read-write access.
//
// Every driver resource has one RAII owner below. Driver calls come from
// GetCudaDriver() (fetched at run time; see cuda_driver.h).
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/cuda_driver.h"
#include "gpu/mapped_pool.h"
#include "gpu/pool_internal.h"
#include "base/status_macros.h"

namespace radixkv::gpu {
namespace internal {
namespace {

// Owns one physical allocation handle (cuMemCreate or import).
class CudaAllocation {
 public:
  CudaAllocation(const CudaDriver* driver, CUmemGenericAllocationHandle handle)
      : driver_(driver), handle_(handle) {}
  ~CudaAllocation() {
    if (driver_ != nullptr) driver_->MemRelease(handle_);
  }
  CudaAllocation(CudaAllocation&& o) noexcept
      : driver_(std::exchange(o.driver_, nullptr)), handle_(o.handle_) {}
  CudaAllocation& operator=(CudaAllocation&&) = delete;
  CudaAllocation(const CudaAllocation&) = delete;

  CUmemGenericAllocationHandle get() const { return handle_; }

 private:
  const CudaDriver* driver_;
  CUmemGenericAllocationHandle handle_;
};

// Owns one reserved virtual address range.
class CudaAddressRange {
 public:
  CudaAddressRange(const CudaDriver* driver, CUdeviceptr base, size_t bytes)
      : driver_(driver), base_(base), bytes_(bytes) {}
  ~CudaAddressRange() {
    if (driver_ != nullptr) driver_->MemAddressFree(base_, bytes_);
  }
  CudaAddressRange(const CudaAddressRange&) = delete;
  CudaAddressRange& operator=(const CudaAddressRange&) = delete;

  CUdeviceptr base() const { return base_; }

 private:
  const CudaDriver* driver_;
  CUdeviceptr base_;
  size_t bytes_;
};

// Owns one mapping of an allocation into a reserved range.
class CudaMapping {
 public:
  CudaMapping(const CudaDriver* driver, CUdeviceptr ptr, size_t bytes)
      : driver_(driver), ptr_(ptr), bytes_(bytes) {}
  ~CudaMapping() {
    if (driver_ != nullptr) driver_->MemUnmap(ptr_, bytes_);
  }
  CudaMapping(CudaMapping&& o) noexcept
      : driver_(std::exchange(o.driver_, nullptr)),
        ptr_(o.ptr_),
        bytes_(o.bytes_) {}
  CudaMapping& operator=(CudaMapping&&) = delete;
  CudaMapping(const CudaMapping&) = delete;

 private:
  const CudaDriver* driver_;
  CUdeviceptr ptr_;
  size_t bytes_;
};

CUmemAllocationProp AllocationProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

absl::StatusOr<uint64_t> Granularity(const CudaDriver& d, int device) {
  CUmemAllocationProp prop = AllocationProp(device);
  size_t gran = 0;
  RETURN_IF_ERROR(CuStatus(d,
                           d.MemGetAllocationGranularity(
                               &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                           "cuMemGetAllocationGranularity"));
  if (gran == 0) return absl::InternalError("cuda pool: granularity is 0");
  return gran;
}

uint64_t RoundUp(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

struct CudaChunk {
  CudaAllocation allocation;
  UniqueFd fd;
  uint64_t bytes;
};

class CudaPagePool final : public PagePool {
 public:
  CudaPagePool(int device, uint64_t page_bytes, uint64_t capacity,
               uint64_t per_chunk, std::vector<CudaChunk> chunks)
      : device_(device),
        page_bytes_(page_bytes),
        capacity_(capacity),
        per_chunk_(per_chunk),
        chunks_(std::move(chunks)) {}

  Backend backend() const override { return Backend::kCuda; }
  uint64_t page_bytes() const override { return page_bytes_; }
  uint64_t capacity_pages() const override { return capacity_; }
  uint64_t pages_per_chunk() const override { return per_chunk_; }
  int device() const override { return device_; }
  size_t chunk_count() const override { return chunks_.size(); }
  uint64_t chunk_bytes(size_t chunk) const override {
    return chunk < chunks_.size() ? chunks_[chunk].bytes : 0;
  }
  int chunk_fd(size_t chunk) const override {
    return chunk < chunks_.size() ? chunks_[chunk].fd.get() : -1;
  }
  void* host_page_address(uint64_t) const override { return nullptr; }

 private:
  const int device_;
  const uint64_t page_bytes_;
  const uint64_t capacity_;
  const uint64_t per_chunk_;
  const std::vector<CudaChunk> chunks_;
};

}  // namespace

absl::Status CheckCudaUsable(int device) {
  absl::StatusOr<const CudaDriver*> driver = GetCudaDriver();
  if (!driver.ok()) return driver.status();
  return UseCudaDevice(**driver, device);
}

absl::StatusOr<std::unique_ptr<PagePool>> CreateCudaPagePool(
    const PoolSpec& spec, uint64_t page_bytes, uint64_t capacity) {
  absl::StatusOr<const CudaDriver*> driver = GetCudaDriver();
  if (!driver.ok()) return driver.status();
  const CudaDriver& d = **driver;
  RETURN_IF_ERROR(UseCudaDevice(d, spec.device));
  absl::StatusOr<uint64_t> gran = Granularity(d, spec.device);
  if (!gran.ok()) return gran.status();
  uint64_t target =
      spec.chunk_bytes != 0 ? spec.chunk_bytes : kDefaultCudaChunkBytes;
  target = std::max(*gran, target / *gran * *gran);
  absl::StatusOr<uint64_t> per_chunk =
      PagesPerChunk(capacity, page_bytes, target, target);
  if (!per_chunk.ok()) return per_chunk.status();

  CUmemAllocationProp prop = AllocationProp(spec.device);
  uint64_t n_chunks = (capacity + *per_chunk - 1) / *per_chunk;
  std::vector<CudaChunk> chunks;
  chunks.reserve(n_chunks);
  for (uint64_t c = 0; c < n_chunks; ++c) {
    uint64_t pages = std::min(*per_chunk, capacity - c * *per_chunk);
    uint64_t bytes = RoundUp(pages * page_bytes, *gran);
    CUmemGenericAllocationHandle handle = 0;
    RETURN_IF_ERROR(CuStatus(
        d, d.MemCreate(&handle, bytes, &prop, 0),
        absl::StrCat("cuMemCreate of chunk ", c, " (", bytes, " bytes)")));
    CudaAllocation allocation(&d, handle);
    int fd = -1;
    RETURN_IF_ERROR(
        CuStatus(d,
                 d.MemExportToShareableHandle(
                     &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 absl::StrCat("cuMemExportToShareableHandle of chunk ", c)));
    chunks.push_back(CudaChunk{std::move(allocation), UniqueFd(fd), bytes});
  }
  return std::unique_ptr<PagePool>(new CudaPagePool(
      spec.device, page_bytes, capacity, *per_chunk, std::move(chunks)));
}

}  // namespace internal

// Declared in mapped_pool.h. Members are destroyed in reverse order: the
// mappings go first, then the imported handles, then the address range.
struct MappedPool::CudaState {
  std::unique_ptr<internal::CudaAddressRange> range;
  std::vector<internal::CudaAllocation> allocations;
  std::vector<internal::CudaMapping> mappings;
};

void MappedPool::CudaStateDeleter::operator()(CudaState* state) const {
  delete state;
}

absl::Status MappedPool::MapCuda(std::vector<UniqueFd> fds) {
  using internal::CuStatus;
  absl::StatusOr<const internal::CudaDriver*> driver =
      internal::GetCudaDriver();
  if (!driver.ok()) return driver.status();
  const internal::CudaDriver& d = **driver;
  RETURN_IF_ERROR(internal::UseCudaDevice(d, layout_.device));
  absl::StatusOr<uint64_t> gran = internal::Granularity(d, layout_.device);
  if (!gran.ok()) return gran.status();
  uint64_t total = 0;
  for (size_t c = 0; c < layout_.chunk_bytes.size(); ++c) {
    if (layout_.chunk_bytes[c] % *gran != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda pool: chunks[", c, "].bytes=", layout_.chunk_bytes[c],
          " is not a multiple of the allocation granularity ", *gran));
    }
    total += layout_.chunk_bytes[c];
  }
  auto state = std::unique_ptr<CudaState, CudaStateDeleter>(new CudaState);
  for (size_t c = 0; c < fds.size(); ++c) {
    CUmemGenericAllocationHandle handle = 0;
    RETURN_IF_ERROR(CuStatus(
        d,
        d.MemImportFromShareableHandle(
            &handle,
            reinterpret_cast<void*>(static_cast<uintptr_t>(fds[c].get())),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        absl::StrCat("cuMemImportFromShareableHandle of chunk ", c)));
    state->allocations.emplace_back(&d, handle);
    fds[c].reset();  // the imported handle keeps the memory alive
  }
  CUdeviceptr base = 0;
  RETURN_IF_ERROR(
      CuStatus(d, d.MemAddressReserve(&base, total, *gran, 0, 0),
               absl::StrCat("cuMemAddressReserve of ", total, " bytes")));
  state->range = std::make_unique<internal::CudaAddressRange>(&d, base, total);
  uint64_t offset = 0;
  for (size_t c = 0; c < state->allocations.size(); ++c) {
    uint64_t bytes = layout_.chunk_bytes[c];
    RETURN_IF_ERROR(CuStatus(
        d, d.MemMap(base + offset, bytes, 0, state->allocations[c].get(), 0),
        absl::StrCat("cuMemMap of chunk ", c)));
    state->mappings.emplace_back(&d, base + offset, bytes);
    // Access is granted per mapped chunk (the range as a whole may not be
    // one allocation).
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = layout_.device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    RETURN_IF_ERROR(CuStatus(d,
                             d.MemSetAccess(base + offset, bytes, &access, 1),
                             absl::StrCat("cuMemSetAccess of chunk ", c)));
    chunk_base_.push_back(reinterpret_cast<char*>(base + offset));
    offset += bytes;
  }
  cuda_ = std::move(state);
  return absl::OkStatus();
}

}  // namespace radixkv::gpu
