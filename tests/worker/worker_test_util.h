// Helpers shared by the reference worker's tests.
#ifndef RADIXKV_TESTS_WORKER_WORKER_TEST_UTIL_H_
#define RADIXKV_TESTS_WORKER_WORKER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace radixkv::worker {

// `n` token ids below `vocab`, the same for the same seed.
inline std::vector<uint32_t> Prompt(uint32_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t(n);
  for (uint32_t& x : t) x = rng() % vocab;
  return t;
}

// Largest element-wise |a - b|; infinity when the sizes differ, so a
// tolerance check on the result fails.
inline float MaxAbsDiff(const std::vector<float>& a,
                        const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<float>::infinity();
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace radixkv::worker

#endif  // RADIXKV_TESTS_WORKER_WORKER_TEST_UTIL_H_
