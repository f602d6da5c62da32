// File: worker/model_internal.h
//
// Building blocks shared by the reference worker's CPU forward passes: the
// per-layer-KV model (model.cc) and the cross-layer KV model
// (xlayer_model.cc). Not part of the worker's interface.
//
// Thread safety: pure functions over caller-owned buffers.
#ifndef RADIXKV_CLIENT_WORKER_MODEL_INTERNAL_H_
#define RADIXKV_CLIENT_WORKER_MODEL_INTERNAL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/matmul.h"
#include "worker/model.h"
#include "gpu/kv_parallel.h"

namespace radixkv::worker::internal {

// Counter-based generator: a SplitMix64 finaliser of (seed, tensor, index),
// mapped to uniform [-1, 1). Any element can be regenerated independently.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// `n` weights uniform in [-scale, scale) for tensor number `tensor`.
inline std::vector<float> Uniform(uint64_t seed, uint64_t tensor, size_t n,
                                  float scale) {
  std::vector<float> out(n);
  const uint64_t base = Mix(seed ^ Mix(tensor));
  gpu::ParallelFor(n, size_t{1} << 20, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const uint64_t r = Mix(base + i);
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
      out[i] = (2.0f * u - 1.0f) * scale;
    }
  });
  return out;
}

// Norm gains near 1 so the norms are not the identity.
inline std::vector<float> NormGain(uint64_t seed, uint64_t tensor, size_t n) {
  std::vector<float> g = Uniform(seed, tensor, n, 0.1f);
  for (float& x : g) x += 1.0f;
  return g;
}

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain, for `rows` rows of `d`.
inline void RmsNorm(const float* x, const float* gain, float* out, size_t rows,
                    size_t d, float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float ss = 0.0f;
    for (size_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    float* o = out + r * d;
    for (size_t i = 0; i < d; ++i) o[i] = xr[i] * inv * gain[i];
  }
}

// RoPE tables of `m` consecutive absolute positions from `first_pos`:
// angle(i, j) = (first_pos + i) * inv_freq[j], computed in double.
struct RopeTables {
  RopeTables(const std::vector<float>& inv_freq, uint64_t first_pos, size_t m)
      : half(inv_freq.size()), cos_t(m * half), sin_t(m * half) {
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < half; ++j) {
        const double angle = double(first_pos + i) * inv_freq[j];
        cos_t[i * half + j] = static_cast<float>(std::cos(angle));
        sin_t[i * half + j] = static_cast<float>(std::sin(angle));
      }
    }
  }
  // Rotates pairs (x[j], x[j + half]) of each of `heads` heads of token i.
  void Apply(float* x, size_t heads, size_t i) const {
    const float* c = &cos_t[i * half];
    const float* s = &sin_t[i * half];
    for (size_t h = 0; h < heads; ++h) {
      float* xh = x + h * 2 * half;
      for (size_t j = 0; j < half; ++j) {
        const float a = xh[j], b = xh[j + half];
        xh[j] = a * c[j] - b * s[j];
        xh[j + half] = a * s[j] + b * c[j];
      }
    }
  }
  size_t half;
  std::vector<float> cos_t, sin_t;
};

// Activations of one forward pass of `m` tokens; every buffer is [m][...].
struct ForwardScratch {
  ForwardScratch(const ModelConfig& c, size_t rows)
      : m(rows),
        x(rows * c.d_model),
        h(rows * c.d_model),
        qkv(rows * (size_t{c.num_q_heads} + 2 * c.num_kv_heads) * c.head_dim),
        q(rows * size_t{c.num_q_heads} * c.head_dim),
        attn(q.size()),
        gu(rows * 2 * size_t{c.ffn_dim}),
        act(rows * size_t{c.ffn_dim}) {}
  size_t m;
  std::vector<float> x, h, qkv, q, attn, gu, act;
};

// The SwiGLU MLP block on `m` rows of x [m][d], in place:
//   x += (SiLU(RmsNorm(x) Wgate) * (RmsNorm(x) Wup)) Wdown
// `h` [m][d], `gu` [m][2f] and `act` [m][f] are scratch.
inline void MlpBlock(const float* mlp_norm, const float* wgateup,
                     const float* wdown, size_t m, size_t d, size_t f,
                     float eps, float* x, float* h, float* gu, float* act) {
  RmsNorm(x, mlp_norm, h, m, d, eps);
  MatMul(h, wgateup, gu, m, d, 2 * f, false);
  for (size_t i = 0; i < m; ++i) {
    const float* g = &gu[i * 2 * f];
    const float* u = g + f;
    float* a = &act[i * f];
    for (size_t j = 0; j < f; ++j) a[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
  MatMul(act, wdown, x, m, f, d, true);
}

}  // namespace radixkv::worker::internal

#endif  // RADIXKV_CLIENT_WORKER_MODEL_INTERNAL_H_
