// File: tests/gpu/kernels_test_util.h
//
// Helpers shared by the kernel tests: deterministic random data, a pool of
// pages in host memory, and the naive attention reference (double precision,
// materialised softmax over an explicitly gathered key list) that the
// kernels are checked against.
#ifndef RADIXKV_TESTS_GPU_KERNELS_TEST_UTIL_H_
#define RADIXKV_TESTS_GPU_KERNELS_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/attention.h"
#include "gpu/page_layout.h"

namespace radixkv::gpu::testing {

inline std::vector<float> RandomFloats(size_t n, uint32_t seed,
                                       float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A host pool of `pages` pages, each page_bytes bytes, filled with a byte
// pattern so untouched bytes are recognisable.
struct HostPool {
  HostPool(const PageGeometry& g, uint64_t pages, uint8_t fill = 0xAB)
      : geom(g), capacity(pages), bytes(g.page_bytes() * pages, fill) {}
  uint8_t* page(uint64_t p) { return bytes.data() + p * geom.page_bytes(); }
  void* data_base() { return bytes.data(); }
  std::vector<void*> Addresses(const std::vector<uint64_t>& ids) {
    std::vector<void*> out;
    for (uint64_t id : ids) out.push_back(page(id));
    return out;
  }
  std::vector<const void*> ConstAddresses(const std::vector<uint64_t>& ids) {
    std::vector<const void*> out;
    for (uint64_t id : ids) out.push_back(page(id));
    return out;
  }
  PageGeometry geom;
  uint64_t capacity;
  std::vector<uint8_t> bytes;
};

// `n` distinct page ids out of `capacity`, in shuffled order.
inline std::vector<uint64_t> ShuffledIds(uint64_t n, uint64_t capacity,
                                         uint32_t seed) {
  std::vector<uint64_t> all(capacity);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

// Naive attention: for query i (local position T - S + i), gathers every
// visible key (all prefix keys read through the page geometry, then local
// keys 0..T-S+i), computes all scores in double, a two-pass softmax, and the
// weighted sum of V. out: [S][Hq][D].
inline std::vector<float> NaiveAttention(const AttentionShape& shape,
                                         const PrefixPages& prefix,
                                         const std::vector<const void*>& pages,
                                         const AttentionIo& io) {
  const uint32_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads,
                 D = shape.head_dim, S = io.num_queries, T = io.local_tokens;
  const double scale = shape.scale != 0 ? shape.scale : 1.0 / std::sqrt(double(D));
  std::vector<float> out(size_t{S} * Hq * D);
  for (uint32_t i = 0; i < S; ++i) {
    for (uint32_t h = 0; h < Hq; ++h) {
      const uint32_t g = h / (Hq / Hkv);
      std::vector<const float*> ks, vs;
      for (uint32_t t = 0; t < prefix.tokens; ++t) {
        const float* page =
            static_cast<const float*>(pages[t / prefix.geom.page_size]);
        const uint32_t slot = t % prefix.geom.page_size;
        ks.push_back(page + prefix.geom.offset(prefix.layer, 0, g, slot, 0));
        vs.push_back(page + prefix.geom.offset(prefix.layer, 1, g, slot, 0));
      }
      for (uint32_t j = 0; j <= T - S + i; ++j) {
        ks.push_back(io.k + (size_t{j} * Hkv + g) * D);
        vs.push_back(io.v + (size_t{j} * Hkv + g) * D);
      }
      const float* q = io.q + (size_t{i} * Hq + h) * D;
      std::vector<double> s(ks.size());
      double mx = -1e300;
      for (size_t j = 0; j < ks.size(); ++j) {
        double dot = 0;
        for (uint32_t d = 0; d < D; ++d) dot += double(q[d]) * ks[j][d];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (uint32_t d = 0; d < D; ++d) {
        double acc = 0;
        for (size_t j = 0; j < ks.size(); ++j) acc += s[j] * vs[j][d];
        out[(size_t{i} * Hq + h) * D + d] = static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

inline float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return a.size() == b.size() ? m : INFINITY;
}

}  // namespace radixkv::gpu::testing

#endif  // RADIXKV_TESTS_GPU_KERNELS_TEST_UTIL_H_
