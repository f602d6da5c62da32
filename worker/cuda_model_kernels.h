// File: worker/cuda_model_kernels.h
//
// Raw launchers of the reference model's small CUDA kernels (embedding
// gather, RMSNorm, QKV split + RoPE, SwiGLU, the built-in GEMM), implemented in
// cuda_model_kernels.cu. Internal to the worker's CUDA path (cuda_model.cc),
// which checks every argument before calling. Free of CUDA and Abseil types
// so cuda_model.cc compiles with the host compiler.
//
// Every launcher returns the cudaError_t (as int, 0 = success) of its launch;
// `stream` is a cudaStream_t; pointers are device pointers; all data is
// fp32, row-major. Numerics follow worker/model.cc's CPU code
// operation by operation (only reduction order differs).
//
// Thread safety: as the CUDA runtime.
#ifndef RADIXKV_CLIENT_WORKER_CUDA_MODEL_KERNELS_H_
#define RADIXKV_CLIENT_WORKER_CUDA_MODEL_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace radixkv::worker::cuda_kernels {

// x[i][:] = embedding[tokens[i]][:] for i < m. REQUIRES: tokens < vocab.
int LaunchEmbed(const uint32_t* tokens, const float* embedding, float* x,
                uint32_t m, uint32_t d, void* stream);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain, for r < rows.
int LaunchRmsNorm(const float* x, const float* gain, float* out, uint32_t rows,
                  uint32_t d, float eps, void* stream);

// Splits qkv rows [m][qd + 2 kvd] into q [m][qd] and the request's K/V
// (k_out/v_out [m][kvd], i.e. the local cache at the first new token), and
// rotates q and k by RoPE with the per-token tables cos/sin [m][head_dim/2].
int LaunchSplitRope(const float* qkv, float* q, float* k_out, float* v_out,
                    const float* cos_t, const float* sin_t, uint32_t m,
                    uint32_t num_q_heads, uint32_t num_kv_heads,
                    uint32_t head_dim, void* stream);

// act[i][j] = silu(gu[i][j]) * gu[i][f + j] for i < m, j < f.
int LaunchSwiGlu(const float* gu, float* act, uint32_t m, uint32_t f,
                 void* stream);

// Row-major C[m][n] = A[m][k] * B[k][n] (accumulate: C += A * B), fp32 with
// fp32 accumulation: the built-in GEMM used when cuBLAS cannot be loaded
// (a device machine with a driver and no CUDA toolkit). 64 x 64 output
// tiles, 256 threads, 4 x 4 outputs per thread. REQUIRES: m, k, n > 0 and
// below 2^31.
int LaunchGemm(const float* a, const float* b, float* c, uint32_t m,
               uint32_t k, uint32_t n, bool accumulate, void* stream);

}  // namespace radixkv::worker::cuda_kernels

#endif  // RADIXKV_CLIENT_WORKER_CUDA_MODEL_KERNELS_H_
