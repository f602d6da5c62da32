// File: worker/cuda_model.h
//
// CudaModel: the device-resident forward pass of the reference model
// (worker/model.h), used by Model when it was created for the cuda
// device. Same math as the CPU path, step by step:
//
//   weights   uploaded once at Create (fp32, same layout as the CPU copy)
//   GEMMs     cuBLAS sgemm (gpu/cublas_loader.h), pedantic fp32 (no TF32),
//             when libcublas loads; otherwise (a device machine with a
//             driver and no CUDA toolkit), or with the environment variable
//             RADIXKV_WORKER_GEMM=builtin, a built-in tiled fp32 GEMM
//             (cuda_model_kernels.h)
//   RMSNorm, RoPE (tables computed on the host exactly as on the CPU),
//   SwiGLU, embedding gather   small kernels (cuda_model_kernels.cu)
//   attention gpu::AttentionPrefixSuffixCuda over the prefix pages and the
//             request's device-resident local K/V
//
// Prefix pages: device pages (a mapped cuda pool, PrefixView::device_pages)
// are read in place when they sit on one page_bytes grid (the case for a
// cuda pool's single VA range), otherwise copied device-to-device into a
// staging buffer; host pages are copied to a device staging buffer once per
// request and reused by its decode steps.
//
// Local K/V: each LocalKv gets a device mirror on its first CUDA Forward;
// after every Forward the new tokens' K/V are also copied back into the
// host LocalKv (the stream is synchronised before Forward returns), so the
// CPU write_kv into host pages, and a later CPU Forward, see them.
//
// Ownership: a CudaModel owns its stream, cuBLAS handle, device weights and
// scratch; it borrows the Model it was created from (must outlive it).
// Thread safety: Forward and WriteKvToDevicePages are serialised by an
// internal mutex (one stream, one cuBLAS handle); a LocalKv belongs to one
// request.
#ifndef RADIXKV_CLIENT_WORKER_CUDA_MODEL_H_
#define RADIXKV_CLIENT_WORKER_CUDA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/model.h"

namespace radixkv::worker {

class CudaModel {
 public:
  // OK when this build has CUDA and a CUDA device is usable (cuBLAS is
  // optional: see GemmBackend); FAILED_PRECONDITION saying which is missing
  // otherwise.
  static absl::Status Available();

  // `bytes` of zeroed device memory, freed when the last owner lets go (for
  // a device-resident page pool). FAILED_PRECONDITION without CUDA;
  // INTERNAL when the allocation fails.
  static absl::StatusOr<std::shared_ptr<uint8_t>> AllocateDeviceBytes(
      size_t bytes);

  // Uploads `model`'s weights and creates the stream and cuBLAS handle.
  // FAILED_PRECONDITION when !Available(); INTERNAL on a CUDA error.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const Model& model);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Model::Forward on the device. REQUIRES: the arguments passed
  // Model::Forward's checks. On error `local` is unchanged (size).
  absl::StatusOr<std::vector<float>> Forward(const PrefixView& prefix,
                                             LocalKv* local,
                                             absl::Span<const uint32_t> tokens);

  // Writes local tokens [first_local, first_local + pages.size() * page_size)
  // from `local`'s device mirror into device pages (one per block) with
  // write_kv, then synchronises the stream: the pages may be committed when
  // this returns OK. FAILED_PRECONDITION when `local` has no device mirror;
  // INVALID_ARGUMENT when the range exceeds the local tokens.
  absl::Status WriteKvToDevicePages(const LocalKv& local, uint32_t first_local,
                                    absl::Span<void* const> pages);

  // "cublas" or "builtin": which GEMM the forward passes use (fixed at
  // Create).
  const char* GemmBackend() const;

 private:
  struct State;
  explicit CudaModel(std::unique_ptr<State> state);

  // Set at construction, then read-only (unread in a build without CUDA).
  [[maybe_unused]] const bool cublas_ = false;
  absl::Mutex mu_;
  std::unique_ptr<State> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_CUDA_MODEL_H_
