// CUDA kernel of attention_prefix_suffix (see attention.h).
//
// One warp per (query, q head) row. Lane j holds dims j, j+32, ... of the
// query and of the fp32 accumulator; keys are visited in order (prefix pages,
// then local keys up to the row's causal limit), each score is a warp
// reduction, and the row keeps a running max and sum (online softmax), so
// nothing is materialised. The same visiting order as the CPU oracle keeps
// the two within float rounding of each other.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kv_cuda_launch.h"
#include "gpu/page_layout.h"

namespace radixkv::gpu::cuda_kernels {
namespace {

constexpr int kDimsPerLane = kMaxAttentionHeadDim / 32;
constexpr int kWarpsPerBlock = 4;

struct RowState {
  float q[kDimsPerLane];
  float acc[kDimsPerLane];
  float m;
  float l;
};

__device__ __forceinline__ void Visit(RowState& st, const float* __restrict__ krow,
                                      const float* __restrict__ vrow,
                                      uint32_t head_dim, uint32_t lane) {
  float partial = 0.0f;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const uint32_t d = lane + 32 * i;
    if (d < head_dim) partial += st.q[i] * krow[d];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    partial += __shfl_xor_sync(0xffffffffu, partial, off);
  }
  const float s = partial;
  const float m_new = fmaxf(st.m, s);
  const float alpha = expf(st.m - m_new);
  const float p = expf(s - m_new);
  st.l = st.l * alpha + p;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const uint32_t d = lane + 32 * i;
    if (d < head_dim) st.acc[i] = st.acc[i] * alpha + p * vrow[d];
  }
  st.m = m_new;
}

__global__ void AttentionKernel(AttentionLaunch a) {
  const uint64_t warp =
      (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const uint32_t lane = threadIdx.x % 32;
  const uint64_t rows = uint64_t{a.num_queries} * a.num_q_heads;
  if (warp >= rows) return;  // whole warps exit together
  const uint32_t qi = static_cast<uint32_t>(warp / a.num_q_heads);
  const uint32_t h = static_cast<uint32_t>(warp % a.num_q_heads);
  const uint32_t g = h / (a.num_q_heads / a.num_kv_heads);
  const uint32_t D = a.head_dim;

  RowState st;
  const float* q = a.q + (size_t{qi} * a.num_q_heads + h) * D;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const uint32_t d = lane + 32 * i;
    st.q[i] = d < D ? q[d] * a.scale : 0.0f;
    st.acc[i] = 0.0f;
  }
  st.m = -INFINITY;
  st.l = 0.0f;

  const uint8_t* base = static_cast<const uint8_t*>(a.pool_base);
  const uint64_t page_bytes = a.geom.page_bytes();
  for (uint32_t t = 0; t < a.prefix_tokens; ++t) {
    const uint32_t slot = t % a.geom.page_size;
    const float* page = reinterpret_cast<const float*>(
        base + a.page_ids[t / a.geom.page_size] * page_bytes);
    Visit(st, page + a.geom.offset(a.layer, 0, g, slot, 0),
          page + a.geom.offset(a.layer, 1, g, slot, 0), D, lane);
  }
  const uint32_t last = a.local_tokens - a.num_queries + qi;  // inclusive
  const size_t stride = size_t{a.num_kv_heads} * D;
  for (uint32_t j = 0; j <= last; ++j) {
    Visit(st, a.k + j * stride + size_t{g} * D, a.v + j * stride + size_t{g} * D,
          D, lane);
  }
  float* out = a.out + (size_t{qi} * a.num_q_heads + h) * D;
  const float inv = 1.0f / st.l;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const uint32_t d = lane + 32 * i;
    if (d < D) out[d] = st.acc[i] * inv;
  }
}

}  // namespace

int LaunchAttention(const AttentionLaunch& a, void* stream) {
  const uint64_t rows = uint64_t{a.num_queries} * a.num_q_heads;
  const uint64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (rows == 0) return cudaSuccess;
  if (blocks > 0x7fffffffu || a.head_dim > kMaxAttentionHeadDim ||
      a.num_kv_heads == 0 || a.num_q_heads % a.num_kv_heads != 0) {
    return cudaErrorInvalidConfiguration;
  }
  AttentionKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0,
                    static_cast<cudaStream_t>(stream)>>>(a);
  return cudaGetLastError();
}

}  // namespace radixkv::gpu::cuda_kernels
