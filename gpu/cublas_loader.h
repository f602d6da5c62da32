// File: gpu/cublas_loader.h
//
// cuBLAS loaded at run time. Binaries link no cuBLAS: the first use
// dlopen()s "libcublas.so.13" (then "libcublas.so") and resolves the few
// entry points the reference worker needs, so a machine without the library
// (or without a driver) still starts and takes the CPU path.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<CublasHandle> blas,
//                    CublasHandle::Create(stream));
//   RETURN_IF_ERROR(blas->GemmRowMajor(a, b, c, m, k, n, /*accumulate=*/false));
//
// Numerics: handles use CUBLAS_PEDANTIC_MATH, i.e. plain fp32 (no TF32, no
// reduced-precision reductions), so results compare with the CPU GEMM.
//
// Ownership: the library handle is loaded once per process and never
// unloaded. A CublasHandle owns one cublasHandle_t (destroyed with it).
// Thread safety: CublasLibraryStatus() and Create() are thread-safe; one
// CublasHandle must be used by one thread at a time (cuBLAS's rule).
#ifndef RADIXKV_GPU_CUBLAS_LOADER_H_
#define RADIXKV_GPU_CUBLAS_LOADER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace radixkv::gpu {

// OK when cuBLAS could be loaded and every needed symbol resolved;
// FAILED_PRECONDITION naming the library (or the missing symbol) otherwise,
// and always in builds without CUDA. The result is computed once.
absl::Status CublasLibraryStatus();

class CublasHandle {
 public:
  // Creates a handle bound to `stream` (a cudaStream_t; nullptr = legacy
  // default stream) in pedantic fp32 math mode. FAILED_PRECONDITION when the
  // library is unavailable, INTERNAL with the cuBLAS status otherwise.
  static absl::StatusOr<std::unique_ptr<CublasHandle>> Create(void* stream);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  // Row-major C[m][n] = A[m][k] * B[k][n] (accumulate: C += A * B); device
  // pointers, asynchronous on the handle's stream. INVALID_ARGUMENT when a
  // dimension is 0 or above INT32_MAX; INTERNAL on a cuBLAS error.
  absl::Status GemmRowMajor(const float* a, const float* b, float* c,
                            size_t m, size_t k, size_t n, bool accumulate);

 private:
  explicit CublasHandle(void* handle) : handle_(handle) {}
  // cublasHandle_t; unused in builds without CUDA.
  [[maybe_unused]] void* handle_;
};

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_CUBLAS_LOADER_H_
