// CUDA kernel of attention_prefix_suffix (see attention.h).
//
// One warp per (query, q head) row. Lane j holds dims j, j+32, ... of the
// query and of the fp32 accumulator; keys are visited in order (prefix pages,
// then local keys up to the row's causal limit), each score is a warp
// reduction, and the row keeps a running max and sum (online softmax), so
// nothing is materialised. The same visiting order as the CPU oracle keeps
// the two within float rounding of each other.
//
// Typed prefix pages (fp16, bf16, fp8, int8) are dequantised as they are
// read, element by element, with the CPU's decode and scale rule
// (kv_ops_quant.h): the kernel is instantiated per dtype.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kv_cuda_launch.h"
#include "gpu/kv_ops_quant.h"
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

// A key/value row of fp32 values (local K/V, fp32 pages).
struct FloatRow {
  const float* __restrict__ k;
  const float* __restrict__ v;
  __device__ __forceinline__ float K(uint32_t d) const { return k[d]; }
  __device__ __forceinline__ float V(uint32_t d) const { return v[d]; }
};

// A key/value row of a typed page: codes and the runs' scales.
template <DType kT>
struct CodeRow {
  const uint8_t* __restrict__ k;  // the run's elements start at element k_at
  const uint8_t* __restrict__ v;
  uint64_t k_at, v_at;
  float k_scale, v_scale;
  __device__ __forceinline__ float K(uint32_t d) const {
    return quant::Dequant(kT, k, k_at + d, k_scale);
  }
  __device__ __forceinline__ float V(uint32_t d) const {
    return quant::Dequant(kT, v, v_at + d, v_scale);
  }
};

template <typename Row>
__device__ __forceinline__ void Visit(RowState& st, const Row& row,
                                      uint32_t head_dim, uint32_t lane) {
  float partial = 0.0f;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const uint32_t d = lane + 32 * i;
    if (d < head_dim) partial += st.q[i] * row.K(d);
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
    if (d < head_dim) st.acc[i] = st.acc[i] * alpha + p * row.V(d);
  }
  st.m = m_new;
}

template <DType kT>
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
    const uint8_t* page = base + a.page_ids[t / a.geom.page_size] * page_bytes;
    if constexpr (kT == DType::kFloat32) {
      const float* fp = reinterpret_cast<const float*>(page);
      Visit(st, FloatRow{fp + a.geom.offset(a.layer, 0, g, slot, 0),
                         fp + a.geom.offset(a.layer, 1, g, slot, 0)},
            D, lane);
    } else {
      const uint64_t k_run = a.geom.run(a.layer, 0, g);
      const uint64_t v_run = a.geom.run(a.layer, 1, g);
      Visit(st,
            CodeRow<kT>{page, page, a.geom.offset(a.layer, 0, g, slot, 0),
                        a.geom.offset(a.layer, 1, g, slot, 0),
                        quant::PageScale(a.geom, page, k_run),
                        quant::PageScale(a.geom, page, v_run)},
            D, lane);
    }
  }
  const uint32_t last = a.local_tokens - a.num_queries + qi;  // inclusive
  const size_t stride = size_t{a.num_kv_heads} * D;
  for (uint32_t j = 0; j <= last; ++j) {
    Visit(st,
          FloatRow{a.k + j * stride + size_t{g} * D,
                   a.v + j * stride + size_t{g} * D},
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
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(kWarpsPerBlock * 32);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (a.geom.dtype) {
    case DType::kUnspecified:  // checked: elem_bytes 4
    case DType::kFloat32:
      AttentionKernel<DType::kFloat32><<<grid, block, 0, s>>>(a);
      break;
    case DType::kFloat16:
      AttentionKernel<DType::kFloat16><<<grid, block, 0, s>>>(a);
      break;
    case DType::kBFloat16:
      AttentionKernel<DType::kBFloat16><<<grid, block, 0, s>>>(a);
      break;
    case DType::kFloat8E4M3:
      AttentionKernel<DType::kFloat8E4M3><<<grid, block, 0, s>>>(a);
      break;
    case DType::kFloat8E5M2:
      AttentionKernel<DType::kFloat8E5M2><<<grid, block, 0, s>>>(a);
      break;
    case DType::kInt8:
      AttentionKernel<DType::kInt8><<<grid, block, 0, s>>>(a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace radixkv::gpu::cuda_kernels
