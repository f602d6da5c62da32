// File: gpu/kv_cuda_launch.h
//
// Raw kernel launchers implemented in kv_ops.cu and attention.cu. Internal to
// gpu/: the public, checked API is kv_ops.h / attention.h, whose CUDA
// functions validate arguments and then call these. Kept free of CUDA and
// Abseil types so the .cu files compile without Abseil headers and the .cc
// files without nvcc.
//
// Every launcher returns a cudaError_t value (0 = cudaSuccess) from the
// launch; `stream` is a cudaStream_t. Pointers are device pointers; id arrays
// named host_* are host memory copied into kernel parameters.
//
// Thread safety: as the CUDA runtime (any thread, any stream).
#ifndef RADIXKV_GPU_KV_CUDA_LAUNCH_H_
#define RADIXKV_GPU_KV_CUDA_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "gpu/page_layout.h"

namespace radixkv::gpu::cuda_kernels {

// Largest head_dim the CUDA attention kernel supports.
inline constexpr uint32_t kMaxAttentionHeadDim = 256;

int LaunchWriteKv(const PageGeometry& geom, const void* k, const void* v,
                  uint32_t n_tokens, uint32_t layer_stride_tokens,
                  void* pool_base, const uint64_t* host_page_ids,
                  size_t n_pages, void* stream);

int LaunchCopyPages(uint64_t page_bytes, const void* src_base,
                    const uint64_t* host_src_ids, void* dst_base,
                    const uint64_t* host_dst_ids, size_t n_pages, void* stream);

struct AttentionLaunch {
  uint32_t num_q_heads, num_kv_heads, head_dim;
  float scale;
  PageGeometry geom;
  uint32_t layer;
  uint32_t prefix_tokens;
  const void* pool_base;
  const uint64_t* page_ids;  // device array
  const float* q;
  const float* k;
  const float* v;
  float* out;
  uint32_t num_queries;
  uint32_t local_tokens;
};

int LaunchAttention(const AttentionLaunch& a, void* stream);

}  // namespace radixkv::gpu::cuda_kernels

#endif  // RADIXKV_GPU_KV_CUDA_LAUNCH_H_
