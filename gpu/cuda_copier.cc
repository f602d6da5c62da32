// File: gpu/cuda_copier.cc
//
// The cuda backend's PageCopier (built only with the CUDA toolkit):
//
//   mapping  the pool's chunks are mapped into this process once
//            (MappedPool::MapLocal); page addresses are device pointers.
//   batches  each Batch holds one non-blocking stream of the pool's device,
//            taken from the copier's stream pool and given back when the
//            batch is destroyed (after synchronising it). Copies are
//            cudaMemcpyAsync on that stream, so a batch's copies run in the
//            order they were queued.
//   host     AllocateHost is AllocateHostMemory for the pool's device:
//            pinned, portable memory (cuda_host_memory.cc).
//
// Every batch method makes the pool's device current on the calling thread
// first, so batches work from threads that never touched CUDA.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gpu/mapped_pool.h"
#include "gpu/page_copier.h"
#include "gpu/pool.h"

namespace radixkv::gpu {
namespace internal {
namespace {

std::string RuntimeError(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", static_cast<int>(err),
                      "): ", cudaGetErrorString(err));
}

// OK for cudaSuccess; otherwise INTERNAL "page copy: <what>: <error>".
absl::Status CopyStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("page copy: ", what, ": ", RuntimeError(err)));
}

// The copier's idle streams. Every stream was created on `device` and has no
// work queued while it is here.
class StreamPool {
 public:
  explicit StreamPool(int device) : device_(device) {}
  ~StreamPool() {
    if (free_.empty()) return;
    (void)cudaSetDevice(device_);
    for (cudaStream_t s : free_) (void)cudaStreamDestroy(s);
  }
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  // An idle stream, or a new one. REQUIRES: `device` is current.
  absl::StatusOr<cudaStream_t> Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaStream_t s = free_.back();
        free_.pop_back();
        return s;
      }
    }
    cudaStream_t s = nullptr;
    absl::Status status = CopyStatus(
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
        absl::StrCat("cudaStreamCreateWithFlags on device ", device_));
    if (!status.ok()) return status;
    return s;
  }

  // REQUIRES: `s` came from Take() and has no work queued.
  void Give(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  const int device_;
  std::mutex mu_;
  std::vector<cudaStream_t> free_;  // guarded by mu_
};

class CudaBatch final : public PageCopier::Batch {
 public:
  CudaBatch(const MappedPool* pool, StreamPool* streams)
      : pool_(pool), streams_(streams) {
    Prepare();
  }

  // Synchronises the stream; a stream whose work failed is destroyed rather
  // than given back.
  ~CudaBatch() override {
    if (stream_ == nullptr) return;
    (void)cudaSetDevice(pool_->device());
    if (cudaStreamSynchronize(stream_) == cudaSuccess) {
      streams_->Give(stream_);
    } else {
      (void)cudaStreamDestroy(stream_);
    }
  }

  void CopyOut(absl::Span<const uint64_t> pages,
               absl::Span<void* const> dst) override {
    if (!Prepare() || !Check(pages)) return;
    Enqueue(pages, dst.data(), cudaMemcpyDeviceToHost);
  }

  void CopyIn(absl::Span<const void* const> src,
              absl::Span<const uint64_t> pages) override {
    if (!Prepare() || !Check(pages)) return;
    Enqueue(pages, src.data(), cudaMemcpyHostToDevice);
  }

  absl::Status Wait() override {
    if (stream_ != nullptr) {
      Record(CopyStatus(cudaSetDevice(pool_->device()), "cudaSetDevice"));
      Record(CopyStatus(cudaStreamSynchronize(stream_),
                        "cudaStreamSynchronize"));
    }
    return std::exchange(status_, {});
  }

 private:
  void Record(absl::Status s) {
    if (status_.ok()) status_ = std::move(s);
  }

  // Makes the pool's device current and makes sure the batch has a stream.
  // false (the error recorded) when either fails.
  bool Prepare() {
    absl::Status s =
        CopyStatus(cudaSetDevice(pool_->device()),
                   absl::StrCat("cudaSetDevice(", pool_->device(), ")"));
    if (s.ok() && stream_ == nullptr) {
      absl::StatusOr<cudaStream_t> stream = streams_->Take();
      if (stream.ok()) {
        stream_ = *stream;
      } else {
        s = stream.status();
      }
    }
    Record(s);
    return s.ok();
  }

  bool Check(absl::Span<const uint64_t> pages) {
    for (uint64_t p : pages) {
      if (p >= pool_->capacity_pages()) {
        Record(absl::InvalidArgumentError(
            absl::StrCat("page copy: page ", p, " is not below the pool's ",
                         pool_->capacity_pages(), " pages")));
        return false;
      }
    }
    return true;
  }

  // Queues one cudaMemcpyAsync per run of pages that are consecutive within
  // one chunk and whose host buffers are back to back. `host[i]` pairs with
  // `pages[i]` (void* or const void*). Stops at the first failed call.
  template <typename HostPtr>
  void Enqueue(absl::Span<const uint64_t> pages, const HostPtr* host,
               cudaMemcpyKind kind) {
    const uint64_t page_bytes = pool_->page_bytes();
    const uint64_t per_chunk = pool_->pages_per_chunk();
    size_t i = 0;
    while (i < pages.size()) {
      const char* h = static_cast<const char*>(host[i]);
      size_t n = 1;
      while (i + n < pages.size() && pages[i + n] == pages[i] + n &&
             pages[i + n] / per_chunk == pages[i] / per_chunk &&
             static_cast<const char*>(host[i + n]) == h + n * page_bytes) {
        ++n;
      }
      char* device = static_cast<char*>(pool_->page_address(pages[i]));
      const uint64_t bytes = n * page_bytes;
      cudaError_t err =
          kind == cudaMemcpyDeviceToHost
              ? cudaMemcpyAsync(const_cast<char*>(h), device, bytes, kind,
                                stream_)
              : cudaMemcpyAsync(device, h, bytes, kind, stream_);
      if (err != cudaSuccess) {
        Record(CopyStatus(
            err, absl::StrCat("cudaMemcpyAsync of pages ", pages[i], "..",
                              pages[i] + n - 1,
                              kind == cudaMemcpyDeviceToHost ? " to" : " from",
                              " the host (", bytes, " bytes)")));
        return;
      }
      i += n;
    }
  }

  const MappedPool* const pool_;
  StreamPool* const streams_;
  cudaStream_t stream_ = nullptr;  // owned while the batch lives
  absl::Status status_;            // the first error since the last Wait
};

class CudaPageCopier final : public PageCopier {
 public:
  explicit CudaPageCopier(std::unique_ptr<MappedPool> pool)
      : pool_(std::move(pool)), streams_(pool_->device()) {}

  Backend backend() const override { return Backend::kCuda; }
  uint64_t page_bytes() const override { return pool_->page_bytes(); }

  std::unique_ptr<Batch> NewBatch() const override {
    return std::make_unique<CudaBatch>(pool_.get(), &streams_);
  }

  absl::StatusOr<std::unique_ptr<HostMemory>> AllocateHost(
      uint64_t bytes) const override {
    return AllocateHostMemory(Backend::kCuda, pool_->device(), bytes);
  }

 private:
  // Declared before streams_: streams are destroyed first, and every batch
  // (which synchronises its stream) is destroyed before the copier.
  const std::unique_ptr<MappedPool> pool_;
  mutable StreamPool streams_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PageCopier>> CreateCudaPageCopier(
    const PagePool& pool) {
  if (pool.backend() != Backend::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("page copy: the cuda copier needs a cuda pool, not ",
                     BackendName(pool.backend())));
  }
  absl::StatusOr<std::unique_ptr<MappedPool>> mapped =
      MappedPool::MapLocal(pool);
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<PageCopier>(new CudaPageCopier(*std::move(mapped)));
}

}  // namespace internal
}  // namespace radixkv::gpu
