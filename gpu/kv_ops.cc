// CPU implementations of write_kv / read_kv / copy_pages (see kv_ops.h), and
// the CUDA entry points' fallbacks for builds without CUDA.
#include "gpu/kv_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu/kv_ops_check.h"
#include "gpu/kv_ops_quant.h"
#include "gpu/kv_parallel.h"
#include "base/status_macros.h"

#if defined(RADIXKV_KERNELS_CUDA)
#include <cuda_runtime.h>

#include "gpu/kv_cuda_launch.h"
#endif

namespace radixkv::gpu {
namespace {

// Parallelise only when a call moves at least this many bytes per thread;
// below that, thread start-up costs more than the copy.
constexpr size_t kMinBytesPerThread = size_t{1} << 20;

// Copies rows between the source layout [layer][token][head][dim] and the
// page layout. kToPages: source -> pages; otherwise pages -> source.
template <bool kToPages>
void MoveRows(const PageGeometry& geom, uint8_t* k, uint8_t* v,
              uint32_t n_tokens, uint32_t layer_stride_tokens,
              const void* const* pages) {
  const size_t row_bytes = size_t{geom.head_dim} * geom.elem_bytes;
  const size_t token_bytes = row_bytes * geom.num_kv_heads;
  const uint32_t stride = layer_stride_tokens == 0 ? n_tokens : layer_stride_tokens;
  // One work item per (layer, token): num_kv_heads rows of K and of V.
  const size_t items = size_t{geom.num_layers} * n_tokens;
  const size_t per_thread =
      std::max<size_t>(1, kMinBytesPerThread / std::max<size_t>(1, 2 * token_bytes));
  ParallelFor(items, per_thread, [&](size_t begin, size_t end) {
    for (size_t item = begin; item < end; ++item) {
      const uint32_t layer = static_cast<uint32_t>(item / n_tokens);
      const uint32_t t = static_cast<uint32_t>(item % n_tokens);
      // Read-only when !kToPages; one signature serves both directions.
      uint8_t* page = static_cast<uint8_t*>(
          const_cast<void*>(pages[t / geom.page_size]));
      const uint32_t slot = t % geom.page_size;
      const size_t src_off = (size_t{layer} * stride + t) * token_bytes;
      for (uint32_t h = 0; h < geom.num_kv_heads; ++h) {
        uint8_t* pk = page + geom.offset(layer, 0, h, slot, 0) * geom.elem_bytes;
        uint8_t* pv = page + geom.offset(layer, 1, h, slot, 0) * geom.elem_bytes;
        uint8_t* sk = k + src_off + h * row_bytes;
        uint8_t* sv = v + src_off + h * row_bytes;
        if constexpr (kToPages) {
          std::memcpy(pk, sk, row_bytes);
          std::memcpy(pv, sv, row_bytes);
        } else {
          std::memcpy(sk, pk, row_bytes);
          std::memcpy(sv, pv, row_bytes);
        }
      }
    }
  });
}

// One (page, layer, K|V, head) run of typed pages, as ForEachRun hands it
// out: `row(s)` is the fp32 row of slot s (of `slots`) in the K or V tensor
// the run belongs to, `run` its index in the page (== geom.run(layer, kv,
// h)).
struct RunRef {
  uint64_t page = 0;
  uint64_t run = 0;
  uint32_t slots = 0;
  size_t first_row = 0;  // element offset of slot 0's row in its tensor
  uint32_t kv = 0;       // 0: K, 1: V
};

// Calls fn(RunRef) for every run of the pages holding n_tokens tokens, in
// parallel, one work item per run.
template <typename Fn>
void ForEachRun(const PageGeometry& geom, uint32_t n_tokens,
                uint32_t layer_stride_tokens, Fn&& fn) {
  const uint32_t H = geom.num_kv_heads, D = geom.head_dim;
  const uint32_t stride = layer_stride_tokens == 0 ? n_tokens : layer_stride_tokens;
  const uint64_t runs_per_page = uint64_t{geom.num_layers} * 2 * H;
  const uint64_t n_pages = PagesForTokens(geom, n_tokens);
  const size_t run_bytes = size_t{geom.page_size} * D * sizeof(float);
  const size_t per_thread =
      std::max<size_t>(1, kMinBytesPerThread / std::max<size_t>(1, run_bytes));
  ParallelFor(n_pages * runs_per_page, per_thread, [&](size_t begin, size_t end) {
    for (size_t item = begin; item < end; ++item) {
      RunRef r;
      r.page = item / runs_per_page;
      r.run = item % runs_per_page;
      const uint32_t layer = static_cast<uint32_t>(r.run / (2 * H));
      r.kv = static_cast<uint32_t>(r.run / H % 2);
      const uint32_t h = static_cast<uint32_t>(r.run % H);
      const uint32_t first = static_cast<uint32_t>(r.page * geom.page_size);
      r.slots = std::min(geom.page_size, n_tokens - first);
      r.first_row = ((size_t{layer} * stride + first) * H + h) * D;
      fn(r);
    }
  });
}

// Typed pages (fp16, bf16, fp8, int8): converts between the fp32 source
// layout and the page encoding, one work item per (page, layer, K|V, head)
// run, so a scaled run's amax, scale and codes come from one pass over the
// slots this call writes (kv_ops_quant.h).
void WriteRuns(const PageGeometry& geom, const float* k, const float* v,
               uint32_t n_tokens, uint32_t layer_stride_tokens,
               void* const* pages) {
  const uint32_t D = geom.head_dim;
  const size_t row_step = size_t{geom.num_kv_heads} * D;  // slot to slot
  ForEachRun(geom, n_tokens, layer_stride_tokens, [&](const RunRef& r) {
    const float* src = (r.kv == 0 ? k : v) + r.first_row;
    uint8_t* page = static_cast<uint8_t*>(pages[r.page]);
    float scale = 1.0f;
    if (geom.scaled()) {
      float amax = 0.0f;
      for (uint32_t s = 0; s < r.slots; ++s) {
        const float* x = src + s * row_step;
        for (uint32_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
      }
      scale = quant::ScaleForAmax(geom.dtype, amax);
      std::memcpy(page + geom.scale_offset_bytes() + r.run * sizeof(float),
                  &scale, sizeof(float));
    }
    const uint64_t base = r.run * geom.head_elems();
    for (uint32_t s = 0; s < r.slots; ++s) {
      const float* x = src + s * row_step;
      for (uint32_t d = 0; d < D; ++d) {
        quant::EncodeElem(geom.dtype, quant::Scaled(geom.dtype, x[d], scale),
                          page, base + uint64_t{s} * D + d);
      }
    }
  });
}

// The inverse of WriteRuns: decodes (and rescales) runs into fp32.
void ReadRuns(const PageGeometry& geom, float* k, float* v, uint32_t n_tokens,
              uint32_t layer_stride_tokens, const void* const* pages) {
  const uint32_t D = geom.head_dim;
  const size_t row_step = size_t{geom.num_kv_heads} * D;
  ForEachRun(geom, n_tokens, layer_stride_tokens, [&](const RunRef& r) {
    const void* page = pages[r.page];
    const float scale = quant::PageScale(geom, page, r.run);
    const uint64_t base = r.run * geom.head_elems();
    float* dst = (r.kv == 0 ? k : v) + r.first_row;
    for (uint32_t s = 0; s < r.slots; ++s) {
      float* x = dst + s * row_step;
      for (uint32_t d = 0; d < D; ++d) {
        x[d] = quant::Dequant(geom.dtype, page, base + uint64_t{s} * D + d,
                              scale);
      }
    }
  });
}

// True when the page elements are moved as they are (no conversion).
bool RawElements(const PageGeometry& geom) {
  return geom.dtype == DType::kUnspecified || geom.dtype == DType::kFloat32;
}

absl::Status CheckNoNullPages(absl::Span<const void* const> pages,
                              const char* field) {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] is a null address"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteKv(const PageGeometry& geom, const KvSource& src,
                     absl::Span<void* const> pages) {
  RETURN_IF_ERROR(internal::CheckKvTensors(geom, src.k, src.v, src.n_tokens,
                                           src.layer_stride_tokens,
                                           pages.size(), "src"));
  absl::Span<const void* const> cpages(
      reinterpret_cast<const void* const*>(pages.data()), pages.size());
  RETURN_IF_ERROR(CheckNoNullPages(cpages, "pages"));
  if (src.n_tokens == 0) return absl::OkStatus();
  if (!RawElements(geom)) {
    WriteRuns(geom, static_cast<const float*>(src.k),
              static_cast<const float*>(src.v), src.n_tokens,
              src.layer_stride_tokens, pages.data());
    return absl::OkStatus();
  }
  MoveRows<true>(geom, static_cast<uint8_t*>(const_cast<void*>(src.k)),
                 static_cast<uint8_t*>(const_cast<void*>(src.v)), src.n_tokens,
                 src.layer_stride_tokens, cpages.data());
  return absl::OkStatus();
}

absl::Status WriteKv(const PageGeometry& geom, const KvSource& src,
                     void* pool_base, uint64_t capacity_pages,
                     absl::Span<const uint64_t> page_ids) {
  RETURN_IF_ERROR(internal::CheckGeometry(geom));
  if (!page_ids.empty() && pool_base == nullptr) {
    return absl::InvalidArgumentError("pool_base must be non-null");
  }
  RETURN_IF_ERROR(internal::CheckPageIds(page_ids, capacity_pages, "page_ids"));
  std::vector<void*> addrs(page_ids.size());
  for (size_t i = 0; i < page_ids.size(); ++i) {
    addrs[i] = static_cast<uint8_t*>(pool_base) + page_ids[i] * geom.page_bytes();
  }
  return WriteKv(geom, src, absl::MakeConstSpan(addrs));
}

absl::Status ReadKv(const PageGeometry& geom,
                    absl::Span<const void* const> pages, const KvDest& dst) {
  RETURN_IF_ERROR(internal::CheckKvTensors(geom, dst.k, dst.v, dst.n_tokens,
                                           dst.layer_stride_tokens,
                                           pages.size(), "dst"));
  RETURN_IF_ERROR(CheckNoNullPages(pages, "pages"));
  if (dst.n_tokens == 0) return absl::OkStatus();
  if (!RawElements(geom)) {
    ReadRuns(geom, static_cast<float*>(dst.k), static_cast<float*>(dst.v),
             dst.n_tokens, dst.layer_stride_tokens, pages.data());
    return absl::OkStatus();
  }
  MoveRows<false>(geom, static_cast<uint8_t*>(dst.k),
                  static_cast<uint8_t*>(dst.v), dst.n_tokens,
                  dst.layer_stride_tokens, pages.data());
  return absl::OkStatus();
}

absl::Status CopyPages(uint64_t page_bytes, absl::Span<const void* const> src,
                       absl::Span<void* const> dst) {
  if (page_bytes == 0) {
    return absl::InvalidArgumentError("page_bytes must be > 0");
  }
  if (src.size() != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("src has ", src.size(), " pages but dst has ", dst.size(),
                     "; they must be equal"));
  }
  RETURN_IF_ERROR(CheckNoNullPages(src, "src"));
  absl::Span<const void* const> cdst(
      reinterpret_cast<const void* const*>(dst.data()), dst.size());
  RETURN_IF_ERROR(CheckNoNullPages(cdst, "dst"));
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i] == src[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("dst[", i, "] is the same page as src[", i, "]"));
    }
  }
  const size_t per_thread =
      std::max<size_t>(1, kMinBytesPerThread / page_bytes);
  ParallelFor(src.size(), per_thread, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) std::memcpy(dst[i], src[i], page_bytes);
  });
  return absl::OkStatus();
}

absl::Status CopyPages(uint64_t page_bytes, const void* src_base,
                       uint64_t src_capacity_pages,
                       absl::Span<const uint64_t> src_ids, void* dst_base,
                       uint64_t dst_capacity_pages,
                       absl::Span<const uint64_t> dst_ids) {
  RETURN_IF_ERROR(internal::CheckCopyIds(page_bytes, src_base,
                                         src_capacity_pages, src_ids, dst_base,
                                         dst_capacity_pages, dst_ids));
  std::vector<const void*> s(src_ids.size());
  std::vector<void*> d(dst_ids.size());
  for (size_t i = 0; i < src_ids.size(); ++i) {
    s[i] = static_cast<const uint8_t*>(src_base) + src_ids[i] * page_bytes;
    d[i] = static_cast<uint8_t*>(dst_base) + dst_ids[i] * page_bytes;
  }
  return CopyPages(page_bytes, absl::MakeConstSpan(s), absl::MakeConstSpan(d));
}

#if defined(RADIXKV_KERNELS_CUDA)
namespace internal {
absl::Status CudaStatus(int err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", err, " (",
                   cudaGetErrorString(static_cast<cudaError_t>(err)), ")"));
}
}  // namespace internal

int CudaKernelDeviceCount() {
  int n = 0;  // not written on error (e.g. 35, no driver)
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state
    return 0;
  }
  return n < 0 ? 0 : n;
}

absl::Status WriteKvCuda(const PageGeometry& geom, const KvSource& src,
                         void* pool_base, uint64_t capacity_pages,
                         absl::Span<const uint64_t> page_ids, void* stream) {
  RETURN_IF_ERROR(internal::CheckKvTensors(geom, src.k, src.v, src.n_tokens,
                                           src.layer_stride_tokens,
                                           page_ids.size(), "src"));
  if (!page_ids.empty() && pool_base == nullptr) {
    return absl::InvalidArgumentError("pool_base must be non-null");
  }
  RETURN_IF_ERROR(internal::CheckPageIds(page_ids, capacity_pages, "page_ids"));
  return internal::CudaStatus(
      cuda_kernels::LaunchWriteKv(geom, src.k, src.v, src.n_tokens,
                                  src.layer_stride_tokens, pool_base,
                                  page_ids.data(), page_ids.size(), stream),
      "WriteKvCuda");
}

absl::Status CopyPagesCuda(uint64_t page_bytes, const void* src_base,
                           uint64_t src_capacity_pages,
                           absl::Span<const uint64_t> src_ids, void* dst_base,
                           uint64_t dst_capacity_pages,
                           absl::Span<const uint64_t> dst_ids, void* stream) {
  RETURN_IF_ERROR(internal::CheckCopyIds(page_bytes, src_base,
                                         src_capacity_pages, src_ids, dst_base,
                                         dst_capacity_pages, dst_ids));
  return internal::CudaStatus(
      cuda_kernels::LaunchCopyPages(page_bytes, src_base, src_ids.data(),
                                    dst_base, dst_ids.data(), src_ids.size(),
                                    stream),
      "CopyPagesCuda");
}

absl::Status CudaKernelStreamSync(void* stream) {
  return internal::CudaStatus(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
      "CudaKernelStreamSync");
}
#endif  // RADIXKV_KERNELS_CUDA

#if !defined(RADIXKV_KERNELS_CUDA)
// Builds without CUDA: the CUDA entry points exist and say so.
namespace {
absl::Status NoCuda(const char* fn) {
  return absl::FailedPreconditionError(
      absl::StrCat(fn, ": radixkv was built without CUDA"));
}
}  // namespace

int CudaKernelDeviceCount() { return 0; }

absl::Status WriteKvCuda(const PageGeometry&, const KvSource&, void*, uint64_t,
                         absl::Span<const uint64_t>, void*) {
  return NoCuda("WriteKvCuda");
}

absl::Status CopyPagesCuda(uint64_t, const void*, uint64_t,
                           absl::Span<const uint64_t>, void*, uint64_t,
                           absl::Span<const uint64_t>, void*) {
  return NoCuda("CopyPagesCuda");
}

absl::Status CudaKernelStreamSync(void*) {
  return NoCuda("CudaKernelStreamSync");
}
#endif  // !RADIXKV_KERNELS_CUDA

}  // namespace radixkv::gpu
