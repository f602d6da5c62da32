// File: gpu/cuda_kernels_util.h
//
// Small RAII helpers for code that drives the CUDA kernels of kv_ops.h and
// attention.h (kernel tests, the reference worker's GPU path). Include only
// in builds with CUDA (RADIXKV_HAVE_CUDA): this header needs cuda_runtime.h.
//
//   ASSIGN_OR_RETURN(CudaKernelBuffer buf, CudaKernelBuffer::Create(bytes));
//   RETURN_IF_ERROR(buf.CopyFromHost(host.data(), bytes));
//
// Thread safety: a buffer is owned by one thread at a time (move-only); the
// memory itself follows CUDA's rules.
#ifndef RADIXKV_GPU_CUDA_KERNELS_UTIL_H_
#define RADIXKV_GPU_CUDA_KERNELS_UTIL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace radixkv::gpu {

// Owns one cudaMalloc allocation; frees it on destruction (never throws).
class CudaKernelBuffer {
 public:
  CudaKernelBuffer() = default;
  ~CudaKernelBuffer() { Reset(); }
  CudaKernelBuffer(CudaKernelBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  CudaKernelBuffer& operator=(CudaKernelBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  CudaKernelBuffer(const CudaKernelBuffer&) = delete;
  CudaKernelBuffer& operator=(const CudaKernelBuffer&) = delete;

  // Allocates `bytes` of device memory (zero-filled). INTERNAL with the CUDA
  // error text on failure.
  static absl::StatusOr<CudaKernelBuffer> Create(size_t bytes) {
    CudaKernelBuffer b;
    if (bytes == 0) return b;
    if (cudaError_t e = cudaMalloc(&b.ptr_, bytes); e != cudaSuccess) {
      b.ptr_ = nullptr;
      return absl::InternalError(absl::StrCat(
          "cudaMalloc(", bytes, "): ", cudaGetErrorString(e)));
    }
    b.bytes_ = bytes;
    if (cudaError_t e = cudaMemset(b.ptr_, 0, bytes); e != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cudaMemset: ", cudaGetErrorString(e)));
    }
    return b;
  }

  // Synchronous copies of the first `bytes` bytes. REQUIRES: bytes <= size().
  absl::Status CopyFromHost(const void* src, size_t bytes) {
    return Check(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
  }
  absl::Status CopyToHost(void* dst, size_t bytes) const {
    return Check(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost));
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

 private:
  static absl::Status Check(cudaError_t e) {
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("cudaMemcpy: ", cudaGetErrorString(e)));
  }
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_CUDA_KERNELS_UTIL_H_
