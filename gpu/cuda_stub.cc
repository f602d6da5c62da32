// File: gpu/cuda_stub.cc
//
// The cuda backend of a build without the CUDA toolkit: every entry point
// reports FAILED_PRECONDITION "built without CUDA".
#include "absl/status/status.h"
#include "gpu/mapped_pool.h"
#include "gpu/page_copier.h"
#include "gpu/pool_internal.h"

namespace radixkv::gpu {
namespace internal {

absl::Status CheckCudaUsable(int device) {
  return absl::FailedPreconditionError(
      "cuda pool: radixkv was built without CUDA (use --pool=host,bytes=...)");
}

absl::StatusOr<std::unique_ptr<PagePool>> CreateCudaPagePool(
    const PoolSpec& spec, uint64_t page_bytes, uint64_t capacity) {
  return absl::FailedPreconditionError(
      "cuda pool: radixkv was built without CUDA (use --pool=host,bytes=...)");
}

absl::StatusOr<std::unique_ptr<PageCopier>> CreateCudaPageCopier(
    const PagePool& pool) {
  return absl::FailedPreconditionError(
      "cuda pool: radixkv was built without CUDA (use --pool=host,bytes=...)");
}

absl::StatusOr<std::unique_ptr<HostMemory>> AllocatePinnedHostMemory(
    int device, uint64_t bytes) {
  return absl::FailedPreconditionError(
      "pinned host memory: radixkv was built without CUDA (use "
      "--pool=host,bytes=...)");
}

}  // namespace internal

struct MappedPool::CudaState {};

void MappedPool::CudaStateDeleter::operator()(CudaState* state) const {
  delete state;
}

absl::Status MappedPool::MapCuda(std::vector<UniqueFd> fds) {
  return absl::FailedPreconditionError(
      "cuda pool: this worker was built without CUDA and cannot map a cuda "
      "pool");
}

}  // namespace radixkv::gpu
