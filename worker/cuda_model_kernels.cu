// Small CUDA kernels of the reference model (see cuda_model_kernels.h).
// Launch shapes: one block per row where a row needs a reduction (RMSNorm)
// or a gather (embedding, split); grid-stride loops elsewhere. Grids stay
// far below the limits: rows are capped by the caller (<= 2^20 tokens).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "worker/cuda_model_kernels.h"

namespace radixkv::worker::cuda_kernels {
namespace {

constexpr int kThreads = 256;           // power of two (block reduction)
constexpr unsigned kMaxGridX = 0x7fffffffu;

__global__ void EmbedKernel(const uint32_t* __restrict__ tokens,
                            const float* __restrict__ embedding,
                            float* __restrict__ x, uint32_t d) {
  const size_t row = blockIdx.x;
  const float* src = embedding + size_t{tokens[row]} * d;
  for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) x[row * d + i] = src[i];
}

__global__ void RmsNormKernel(const float* __restrict__ x,
                              const float* __restrict__ gain,
                              float* __restrict__ out, uint32_t d, float eps) {
  __shared__ float partial[kThreads];
  const float* xr = x + size_t{blockIdx.x} * d;
  float ss = 0.0f;
  for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(partial[0] / static_cast<float>(d) + eps);
  float* o = out + size_t{blockIdx.x} * d;
  for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * gain[i];
}

// One block per token. Work items: q pairs (hq * half), k pairs
// (hkv * half), then v elements (kvd).
__global__ void SplitRopeKernel(const float* __restrict__ qkv,
                                float* __restrict__ q, float* __restrict__ k_out,
                                float* __restrict__ v_out,
                                const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t, uint32_t hq,
                                uint32_t hkv, uint32_t hd) {
  const size_t t = blockIdx.x;
  const uint32_t half = hd / 2, qd = hq * hd, kvd = hkv * hd;
  const float* row = qkv + t * (qd + 2 * size_t{kvd});
  const float* c = cos_t + t * half;
  const float* s = sin_t + t * half;
  const uint32_t q_items = hq * half, k_items = hkv * half;
  const uint32_t total = q_items + k_items + kvd;
  for (uint32_t w = threadIdx.x; w < total; w += blockDim.x) {
    if (w < q_items + k_items) {
      const bool is_q = w < q_items;
      const uint32_t item = is_q ? w : w - q_items;
      const uint32_t head = item / half, i = item % half;
      const float* src = row + (is_q ? 0 : qd) + head * hd;
      float* dst = (is_q ? q + t * qd : k_out + t * kvd) + head * hd;
      const float a = src[i], b = src[i + half];
      dst[i] = a * c[i] - b * s[i];
      dst[i + half] = a * s[i] + b * c[i];
    } else {
      const uint32_t j = w - q_items - k_items;
      v_out[t * kvd + j] = row[qd + kvd + j];
    }
  }
}

__global__ void SwiGluKernel(const float* __restrict__ gu,
                             float* __restrict__ act, uint32_t m, uint32_t f) {
  const uint64_t n = uint64_t{m} * f;
  for (uint64_t e = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < n;
       e += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t i = e / f, j = e % f;
    const float g = gu[i * 2 * f + j];
    const float u = gu[i * 2 * f + f + j];
    act[e] = g / (1.0f + expf(-g)) * u;
  }
}

constexpr int kGemmTile = 64;   // output rows and columns per block
constexpr int kGemmDepth = 16;  // k per shared-memory stage
constexpr int kGemmThreads = 256;

// One block per 64 x 64 tile of C; thread (ty, tx) of a 16 x 16 grid owns
// rows ty + 16 i and columns tx + 16 j (i, j < 4) of the tile.
__global__ void GemmKernel(const float* __restrict__ a,
                           const float* __restrict__ b, float* __restrict__ c,
                           uint32_t m, uint32_t k, uint32_t n, bool accumulate) {
  __shared__ float as[kGemmDepth][kGemmTile];  // A tile, transposed
  __shared__ float bs[kGemmDepth][kGemmTile];
  const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const uint32_t row0 = blockIdx.y * kGemmTile, col0 = blockIdx.x * kGemmTile;
  float acc[4][4] = {};
  for (uint32_t k0 = 0; k0 < k; k0 += kGemmDepth) {
    for (uint32_t i = threadIdx.x; i < kGemmTile * kGemmDepth; i += kGemmThreads) {
      const uint32_t r = i / kGemmDepth, cc = i % kGemmDepth;
      const uint32_t gr = row0 + r, gc = k0 + cc;
      as[cc][r] = gr < m && gc < k ? a[size_t{gr} * k + gc] : 0.0f;
    }
    for (uint32_t i = threadIdx.x; i < kGemmDepth * kGemmTile; i += kGemmThreads) {
      const uint32_t r = i / kGemmTile, cc = i % kGemmTile;
      const uint32_t gr = k0 + r, gc = col0 + cc;
      bs[r][cc] = gr < k && gc < n ? b[size_t{gr} * n + gc] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kGemmDepth; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t r = row0 + ty + 16 * i;
    if (r >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t col = col0 + tx + 16 * j;
      if (col >= n) continue;
      float* out = c + size_t{r} * n + col;
      *out = accumulate ? *out + acc[i][j] : acc[i][j];
    }
  }
}

}  // namespace

int LaunchGemm(const float* a, const float* b, float* c, uint32_t m,
               uint32_t k, uint32_t n, bool accumulate, void* stream) {
  if (m == 0 || k == 0 || n == 0) return cudaErrorInvalidValue;
  const dim3 grid((n + kGemmTile - 1) / kGemmTile, (m + kGemmTile - 1) / kGemmTile);
  if (grid.y > 65535) return cudaErrorInvalidConfiguration;
  GemmKernel<<<grid, kGemmThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, b, c, m, k, n, accumulate);
  return cudaGetLastError();
}

int LaunchEmbed(const uint32_t* tokens, const float* embedding, float* x,
                uint32_t m, uint32_t d, void* stream) {
  if (m == 0) return cudaSuccess;
  if (m > kMaxGridX) return cudaErrorInvalidConfiguration;
  EmbedKernel<<<m, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      tokens, embedding, x, d);
  return cudaGetLastError();
}

int LaunchRmsNorm(const float* x, const float* gain, float* out, uint32_t rows,
                  uint32_t d, float eps, void* stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > kMaxGridX) return cudaErrorInvalidConfiguration;
  RmsNormKernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, gain, out, d, eps);
  return cudaGetLastError();
}

int LaunchSplitRope(const float* qkv, float* q, float* k_out, float* v_out,
                    const float* cos_t, const float* sin_t, uint32_t m,
                    uint32_t num_q_heads, uint32_t num_kv_heads,
                    uint32_t head_dim, void* stream) {
  if (m == 0) return cudaSuccess;
  if (m > kMaxGridX || head_dim % 2 != 0) return cudaErrorInvalidConfiguration;
  SplitRopeKernel<<<m, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      qkv, q, k_out, v_out, cos_t, sin_t, num_q_heads, num_kv_heads, head_dim);
  return cudaGetLastError();
}

int LaunchSwiGlu(const float* gu, float* act, uint32_t m, uint32_t f,
                 void* stream) {
  const uint64_t n = uint64_t{m} * f;
  if (n == 0) return cudaSuccess;
  const uint64_t blocks =
      std::min<uint64_t>((n + kThreads - 1) / kThreads, 65536);
  SwiGluKernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                 static_cast<cudaStream_t>(stream)>>>(gu, act, m, f);
  return cudaGetLastError();
}

}  // namespace radixkv::worker::cuda_kernels
