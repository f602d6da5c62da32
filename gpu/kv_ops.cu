// CUDA kernels of write_kv and copy_pages (see kv_ops.h). Page ids travel in
// fixed-size kernel-parameter batches, so a launch needs no device
// allocation and no host->device copy; long lists take several launches on
// the same stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpu/kv_cuda_launch.h"
#include "gpu/kv_ops_quant.h"
#include "gpu/page_layout.h"

namespace radixkv::gpu::cuda_kernels {
namespace {

constexpr int kIdsPerLaunch = 256;   // 2 KiB of kernel parameters
constexpr int kPairsPerLaunch = 128;

struct IdBatch {
  uint64_t ids[kIdsPerLaunch];
};
struct PairBatch {
  uint64_t src[kPairsPerLaunch];
  uint64_t dst[kPairsPerLaunch];
};

// grid: x = token within the batch, y = layer, z = 0 (K) / 1 (V).
// Each thread block moves num_kv_heads rows of one (token, layer, K|V) in
// Word-sized units.
template <typename Word>
__global__ void WriteKvKernel(PageGeometry geom, const uint8_t* __restrict__ k,
                              const uint8_t* __restrict__ v,
                              uint32_t first_token, uint32_t layer_stride_tokens,
                              uint8_t* __restrict__ base, IdBatch batch) {
  const uint32_t t = first_token + blockIdx.x;  // token index in the source
  const uint32_t layer = blockIdx.y;
  const uint32_t kv = blockIdx.z;
  const uint32_t local_page = blockIdx.x / geom.page_size;
  const uint32_t slot = t % geom.page_size;
  const size_t row_words = size_t{geom.head_dim} * geom.elem_bytes / sizeof(Word);
  const size_t token_words = row_words * geom.num_kv_heads;
  const Word* src = reinterpret_cast<const Word*>(kv == 0 ? k : v) +
                    (size_t{layer} * layer_stride_tokens + t) * token_words;
  uint8_t* page = base + batch.ids[local_page] * geom.page_bytes();
  for (size_t i = threadIdx.x; i < token_words; i += blockDim.x) {
    const uint32_t h = static_cast<uint32_t>(i / row_words);
    const size_t w = i % row_words;
    Word* dst = reinterpret_cast<Word*>(
        page + geom.offset(layer, kv, h, slot, 0) * geom.elem_bytes);
    dst[w] = src[i];
  }
}

// Typed pages (fp16, bf16, fp8, int8). grid: x = page within the batch,
// y = layer, z = K|V * num_kv_heads + head: one thread block per run, which
// reduces the run's amax (scaled dtypes), stores its scale and encodes its
// elements with the shared kv_ops_quant.h functions, so the page equals the
// CPU write_kv's bit for bit (max is exact in any order).
constexpr int kRunThreads = 128;

__global__ void WriteRunsKernel(PageGeometry geom, const float* __restrict__ k,
                                const float* __restrict__ v,
                                uint32_t first_token, uint32_t n_tokens,
                                uint32_t layer_stride_tokens,
                                uint8_t* __restrict__ base, IdBatch batch) {
  __shared__ float partial[kRunThreads];
  const uint32_t H = geom.num_kv_heads, D = geom.head_dim;
  const uint32_t layer = blockIdx.y;
  const uint32_t kv = blockIdx.z / H;
  const uint32_t h = blockIdx.z % H;
  const uint32_t first = first_token + blockIdx.x * geom.page_size;
  const uint32_t slots = min(geom.page_size, n_tokens - first);
  const uint64_t n = uint64_t{slots} * D;
  const float* src = kv == 0 ? k : v;
  auto at = [&](uint64_t i) {
    const uint32_t s = static_cast<uint32_t>(i / D), d = static_cast<uint32_t>(i % D);
    return src[((size_t{layer} * layer_stride_tokens + first + s) * H + h) * D + d];
  };
  uint8_t* page = base + batch.ids[blockIdx.x] * geom.page_bytes();
  const uint64_t run = geom.run(layer, kv, h);
  float scale = 1.0f;
  if (geom.scaled()) {
    float amax = 0.0f;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
      amax = fmaxf(amax, fabsf(at(i)));
    }
    partial[threadIdx.x] = amax;
    __syncthreads();
    for (int s = kRunThreads / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + s]);
      }
      __syncthreads();
    }
    scale = quant::ScaleForAmax(geom.dtype, partial[0]);
    if (threadIdx.x == 0) {
      reinterpret_cast<float*>(page + geom.scale_offset_bytes())[run] = scale;
    }
  }
  const uint64_t elem0 = run * geom.head_elems();
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
    quant::EncodeElem(geom.dtype, quant::Scaled(geom.dtype, at(i), scale), page,
                      elem0 + i);
  }
}

// grid: x = pair within the batch, y = chunk of the page (strided when a
// page has more than gridDim.y chunks). Each thread loads kUnroll words
// before storing them, so enough loads are in flight to saturate HBM.
constexpr int kCopyThreads = 512;
constexpr int kUnroll = 4;
constexpr unsigned kMaxGridY = 65535;

template <typename Word>
__global__ void CopyPagesKernel(uint64_t page_bytes,
                                const uint8_t* __restrict__ src_base,
                                uint8_t* __restrict__ dst_base,
                                PairBatch batch) {
  const Word* src =
      reinterpret_cast<const Word*>(src_base + batch.src[blockIdx.x] * page_bytes);
  Word* dst = reinterpret_cast<Word*>(dst_base + batch.dst[blockIdx.x] * page_bytes);
  const uint64_t words = page_bytes / sizeof(Word);
  const uint64_t chunk_words = uint64_t{kCopyThreads} * kUnroll;
  const uint64_t chunks = (words + chunk_words - 1) / chunk_words;
  for (uint64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const uint64_t first = c * chunk_words + threadIdx.x;
    Word w[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const uint64_t i = first + static_cast<uint64_t>(j) * kCopyThreads;
      if (i < words) w[j] = src[i];
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const uint64_t i = first + static_cast<uint64_t>(j) * kCopyThreads;
      if (i < words) dst[i] = w[j];
    }
  }
}

bool Aligned(const void* p, size_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

}  // namespace

int LaunchWriteKv(const PageGeometry& geom, const void* k, const void* v,
                  uint32_t n_tokens, uint32_t layer_stride_tokens,
                  void* pool_base, const uint64_t* host_page_ids,
                  size_t n_pages, void* stream) {
  if (n_tokens == 0) return cudaSuccess;
  // grid.y carries the layer (limit 65535); grid.x the tokens of one batch.
  if (geom.num_layers > kMaxGridY ||
      uint64_t{geom.page_size} * kIdsPerLaunch > 0x7fffffffu) {
    return cudaErrorInvalidConfiguration;
  }
  const uint32_t stride = layer_stride_tokens == 0 ? n_tokens : layer_stride_tokens;
  if (geom.dtype != DType::kUnspecified && geom.dtype != DType::kFloat32) {
    if (uint64_t{geom.num_kv_heads} * 2 > kMaxGridY) {
      return cudaErrorInvalidConfiguration;
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    for (size_t p0 = 0; p0 < n_pages; p0 += kIdsPerLaunch) {
      const size_t np = std::min<size_t>(kIdsPerLaunch, n_pages - p0);
      IdBatch batch;
      std::copy(host_page_ids + p0, host_page_ids + p0 + np, batch.ids);
      const dim3 grid(static_cast<unsigned>(np), geom.num_layers,
                      2 * geom.num_kv_heads);
      WriteRunsKernel<<<grid, kRunThreads, 0, s>>>(
          geom, static_cast<const float*>(k), static_cast<const float*>(v),
          static_cast<uint32_t>(p0 * geom.page_size), n_tokens, stride,
          static_cast<uint8_t*>(pool_base), batch);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  const size_t row_bytes = size_t{geom.head_dim} * geom.elem_bytes;
  const bool words4 = row_bytes % 4 == 0 && Aligned(k, 4) && Aligned(v, 4) &&
                      Aligned(pool_base, 4) && geom.page_bytes() % 4 == 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (size_t p0 = 0; p0 < n_pages; p0 += kIdsPerLaunch) {
    const size_t np = std::min<size_t>(kIdsPerLaunch, n_pages - p0);
    IdBatch batch;
    std::copy(host_page_ids + p0, host_page_ids + p0 + np, batch.ids);
    const uint32_t first = static_cast<uint32_t>(p0 * geom.page_size);
    const uint32_t count =
        std::min<uint32_t>(n_tokens - first, static_cast<uint32_t>(np * geom.page_size));
    dim3 grid(count, geom.num_layers, 2);
    if (words4) {
      WriteKvKernel<uint32_t><<<grid, 128, 0, s>>>(
          geom, static_cast<const uint8_t*>(k), static_cast<const uint8_t*>(v),
          first, stride, static_cast<uint8_t*>(pool_base), batch);
    } else {
      WriteKvKernel<uint8_t><<<grid, 128, 0, s>>>(
          geom, static_cast<const uint8_t*>(k), static_cast<const uint8_t*>(v),
          first, stride, static_cast<uint8_t*>(pool_base), batch);
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

int LaunchCopyPages(uint64_t page_bytes, const void* src_base,
                    const uint64_t* host_src_ids, void* dst_base,
                    const uint64_t* host_dst_ids, size_t n_pages, void* stream) {
  const bool vec16 = page_bytes % 16 == 0 && Aligned(src_base, 16) &&
                     Aligned(dst_base, 16);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (size_t p0 = 0; p0 < n_pages; p0 += kPairsPerLaunch) {
    const size_t np = std::min<size_t>(kPairsPerLaunch, n_pages - p0);
    PairBatch batch;
    std::copy(host_src_ids + p0, host_src_ids + p0 + np, batch.src);
    std::copy(host_dst_ids + p0, host_dst_ids + p0 + np, batch.dst);
    const auto* sb = static_cast<const uint8_t*>(src_base);
    auto* db = static_cast<uint8_t*>(dst_base);
    const uint64_t word = vec16 ? 16 : 1;
    const uint64_t chunk_bytes = word * kCopyThreads * kUnroll;
    const uint64_t chunks = (page_bytes + chunk_bytes - 1) / chunk_bytes;
    const dim3 grid(static_cast<unsigned>(np),
                    static_cast<unsigned>(std::min<uint64_t>(chunks, kMaxGridY)));
    if (vec16) {
      CopyPagesKernel<uint4><<<grid, kCopyThreads, 0, s>>>(page_bytes, sb, db,
                                                           batch);
    } else {
      CopyPagesKernel<uint8_t><<<grid, kCopyThreads, 0, s>>>(page_bytes, sb,
                                                             db, batch);
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace radixkv::gpu::cuda_kernels
