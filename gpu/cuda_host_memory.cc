// File: gpu/cuda_host_memory.cc
//
// Pinned host memory for a cuda pool's tiers (AllocateHostMemory): one
// cudaHostAlloc'ed allocation, portable (usable from every context), freed
// with cudaFreeHost.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "gpu/page_copier.h"

namespace radixkv::gpu::internal {
namespace {

class PinnedHostMemory final : public HostMemory {
 public:
  PinnedHostMemory(char* data, uint64_t bytes) : HostMemory(data, bytes) {}
  ~PinnedHostMemory() override { cudaFreeHost(data()); }
  bool pinned() const override { return true; }
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostMemory>> AllocatePinnedHostMemory(
    int device, uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("pinned host memory: 0 bytes asked for");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 ||
      device >= count) {
    cudaGetLastError();  // clear the sticky-free error for later calls
    return absl::FailedPreconditionError(absl::StrCat(
        "pinned host memory: no CUDA device ", device, " (", count,
        " devices, or no driver)"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("pinned host memory: cudaSetDevice(", device,
                     "): ", cudaGetErrorName(e)));
  }
  void* p = nullptr;
  if (cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned host memory: cudaHostAlloc of ", bytes, " bytes failed: ",
        cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
  return std::unique_ptr<HostMemory>(
      new PinnedHostMemory(static_cast<char*>(p), bytes));
}

}  // namespace radixkv::gpu::internal
