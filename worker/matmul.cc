#include "worker/matmul.h"

#include <algorithm>
#include <cstring>

#include "gpu/kv_parallel.h"

namespace radixkv::worker {
namespace {

// 4 floats: one SSE register (baseline x86-64) or NEON register. The 8
// columns of a micro-kernel row are two of them.
typedef float V4 __attribute__((vector_size(16)));

constexpr size_t kNr = 8;          // micro-kernel columns
constexpr size_t kMr = 4;          // micro-kernel rows
constexpr size_t kRowBlock = 64;   // rows per work item
constexpr size_t kColGroup = 128;  // columns per work item
// Multiply-adds per thread below which a call stays on one thread.
constexpr size_t kMinWorkPerThread = size_t{1} << 18;

inline V4 Load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store4(float* p, V4 v) { std::memcpy(p, &v, sizeof(v)); }

// rows x 8 block at (i0, j0): acc[r] = sum_k a[i0+r][k] * b[k][j0..j0+8).
template <size_t kRows>
inline void MicroKernel(const float* a, const float* b, float* c, size_t k,
                        size_t n, size_t i0, size_t j0, bool accumulate) {
  V4 lo[kRows] = {}, hi[kRows] = {};
  const float* arow[kRows];
  for (size_t r = 0; r < kRows; ++r) arow[r] = a + (i0 + r) * k;
  const float* bp = b + j0;
  for (size_t kk = 0; kk < k; ++kk, bp += n) {
    const V4 b_lo = Load4(bp), b_hi = Load4(bp + 4);
    for (size_t r = 0; r < kRows; ++r) {
      const float x = arow[r][kk];
      lo[r] += x * b_lo;
      hi[r] += x * b_hi;
    }
  }
  for (size_t r = 0; r < kRows; ++r) {
    float* cp = c + (i0 + r) * n + j0;
    if (accumulate) {
      Store4(cp, Load4(cp) + lo[r]);
      Store4(cp + 4, Load4(cp + 4) + hi[r]);
    } else {
      Store4(cp, lo[r]);
      Store4(cp + 4, hi[r]);
    }
  }
}

// Columns j0 .. j1 (< 8 of them) for rows i0 .. i1, same summation order.
void EdgeColumns(const float* a, const float* b, float* c, size_t k, size_t n,
                 size_t i0, size_t i1, size_t j0, size_t j1, bool accumulate) {
  for (size_t i = i0; i < i1; ++i) {
    for (size_t j = j0; j < j1; ++j) {
      float acc = 0.0f;
      for (size_t kk = 0; kk < k; ++kk) acc += a[i * k + kk] * b[kk * n + j];
      c[i * n + j] = accumulate ? c[i * n + j] + acc : acc;
    }
  }
}

void Block(const float* a, const float* b, float* c, size_t m, size_t k,
           size_t n, size_t i0, size_t i1, size_t j0, size_t j1,
           bool accumulate) {
  const size_t j_vec_end = j0 + (j1 - j0) / kNr * kNr;
  for (size_t j = j0; j < j_vec_end; j += kNr) {
    size_t i = i0;
    for (; i + kMr <= i1; i += kMr) MicroKernel<4>(a, b, c, k, n, i, j, accumulate);
    switch (i1 - i) {
      case 3: MicroKernel<3>(a, b, c, k, n, i, j, accumulate); break;
      case 2: MicroKernel<2>(a, b, c, k, n, i, j, accumulate); break;
      case 1: MicroKernel<1>(a, b, c, k, n, i, j, accumulate); break;
      default: break;
    }
  }
  if (j_vec_end < j1) EdgeColumns(a, b, c, k, n, i0, i1, j_vec_end, j1, accumulate);
}

}  // namespace

void MatMul(const float* a, const float* b, float* c, size_t m, size_t k,
            size_t n, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) std::fill(c, c + m * n, 0.0f);
    return;
  }
  const size_t row_blocks = (m + kRowBlock - 1) / kRowBlock;
  const size_t col_groups = (n + kColGroup - 1) / kColGroup;
  const size_t items = row_blocks * col_groups;
  const size_t work = m * k * n;
  const size_t min_items =
      work < kMinWorkPerThread * 2
          ? items
          : std::max<size_t>(1, items * kMinWorkPerThread / work);
  gpu::ParallelFor(items, min_items, [&](size_t begin, size_t end) {
    for (size_t item = begin; item < end; ++item) {
      const size_t rb = item / col_groups, cg = item % col_groups;
      const size_t i0 = rb * kRowBlock, i1 = std::min(m, i0 + kRowBlock);
      const size_t j0 = cg * kColGroup, j1 = std::min(n, j0 + kColGroup);
      Block(a, b, c, m, k, n, i0, i1, j0, j1, accumulate);
    }
  });
}

}  // namespace radixkv::worker
