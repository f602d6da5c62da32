#include "gpu/cublas_loader.h"

#include <climits>
#include <cstddef>

#include "absl/strings/str_cat.h"

#if defined(RADIXKV_KERNELS_CUDA)
#include <cublas_api.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#endif

namespace radixkv::gpu {

#if defined(RADIXKV_KERNELS_CUDA)
namespace {

// Entry points, typed from the toolkit's own declarations.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
};

struct Loaded {
  absl::Status status;
  CublasApi api;
};

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out, absl::Status* status) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr) {
    *status = absl::FailedPreconditionError(
        absl::StrCat("cuBLAS: symbol ", name, " not found"));
    return false;
  }
  return true;
}

Loaded LoadOnce() {
  Loaded l;
  void* lib = nullptr;
  for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
  }
  if (lib == nullptr) {
    const char* err = dlerror();
    l.status = absl::FailedPreconditionError(absl::StrCat(
        "cuBLAS: cannot load libcublas.so.13 or libcublas.so (",
        err ? err : "unknown error", ")"));
    return l;
  }
  // The library stays loaded for the life of the process.
  absl::Status s;
  if (Resolve(lib, "cublasCreate_v2", &l.api.create, &s) &&
      Resolve(lib, "cublasDestroy_v2", &l.api.destroy, &s) &&
      Resolve(lib, "cublasSetStream_v2", &l.api.set_stream, &s) &&
      Resolve(lib, "cublasSetMathMode", &l.api.set_math_mode, &s) &&
      Resolve(lib, "cublasSgemm_v2", &l.api.sgemm, &s)) {
    l.status = absl::OkStatus();
  } else {
    l.status = s;
  }
  return l;
}

const Loaded& Library() {
  static const Loaded* const loaded = new Loaded(LoadOnce());
  return *loaded;
}

absl::Status BlasError(cublasStatus_t st, const char* what) {
  return absl::InternalError(
      absl::StrCat(what, ": cuBLAS status ", static_cast<int>(st)));
}

}  // namespace

absl::Status CublasLibraryStatus() { return Library().status; }

absl::StatusOr<std::unique_ptr<CublasHandle>> CublasHandle::Create(
    void* stream) {
  const Loaded& lib = Library();
  if (!lib.status.ok()) return lib.status;
  cublasHandle_t h = nullptr;
  if (cublasStatus_t st = lib.api.create(&h); st != CUBLAS_STATUS_SUCCESS) {
    return BlasError(st, "cublasCreate");
  }
  std::unique_ptr<CublasHandle> handle(new CublasHandle(h));
  if (cublasStatus_t st =
          lib.api.set_stream(h, static_cast<cudaStream_t>(stream));
      st != CUBLAS_STATUS_SUCCESS) {
    return BlasError(st, "cublasSetStream");
  }
  if (cublasStatus_t st = lib.api.set_math_mode(h, CUBLAS_PEDANTIC_MATH);
      st != CUBLAS_STATUS_SUCCESS) {
    return BlasError(st, "cublasSetMathMode");
  }
  return handle;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) {
    (void)Library().api.destroy(static_cast<cublasHandle_t>(handle_));
  }
}

absl::Status CublasHandle::GemmRowMajor(const float* a, const float* b,
                                        float* c, size_t m, size_t k, size_t n,
                                        bool accumulate) {
  for (auto [name, v] : {std::pair<const char*, size_t>{"m", m}, {"k", k}, {"n", n}}) {
    if (v == 0 || v > static_cast<size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GemmRowMajor: ", name, " = ", v, " must be in 1..", INT_MAX));
    }
  }
  // Row-major C = A B is column-major C^T = B^T A^T: B^T is B's memory with
  // leading dimension n, A^T is A's with leading dimension k.
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int im = static_cast<int>(m), ik = static_cast<int>(k),
            in = static_cast<int>(n);
  if (cublasStatus_t st = Library().api.sgemm(
          static_cast<cublasHandle_t>(handle_), CUBLAS_OP_N, CUBLAS_OP_N, in,
          im, ik, &alpha, b, in, a, ik, &beta, c, in);
      st != CUBLAS_STATUS_SUCCESS) {
    return BlasError(st, "cublasSgemm");
  }
  return absl::OkStatus();
}

#else  // !RADIXKV_KERNELS_CUDA

absl::Status CublasLibraryStatus() {
  return absl::FailedPreconditionError("cuBLAS: radixkv was built without CUDA");
}

absl::StatusOr<std::unique_ptr<CublasHandle>> CublasHandle::Create(void*) {
  return CublasLibraryStatus();
}

CublasHandle::~CublasHandle() = default;

absl::Status CublasHandle::GemmRowMajor(const float*, const float*, float*,
                                        size_t, size_t, size_t, bool) {
  return CublasLibraryStatus();
}

#endif  // RADIXKV_KERNELS_CUDA

}  // namespace radixkv::gpu
