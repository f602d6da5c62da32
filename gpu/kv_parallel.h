// File: gpu/kv_parallel.h
//
// ParallelFor: split an index range over a few short-lived std::threads.
// Used by the CPU kernels (write_kv, copy_pages, attention) and by the
// reference worker's matmul. Work below `min_per_thread` items per thread
// runs inline on the caller's thread, so small calls (decode steps) pay no
// thread start-up cost.
//
//   ParallelFor(rows, /*min_per_thread=*/64, [&](size_t begin, size_t end) {
//     for (size_t r = begin; r < end; ++r) ...;
//   });
//
// Thread safety: stateless; `fn` is called concurrently on disjoint ranges
// and must only write state owned by its range. ParallelFor returns after
// every range has finished (the threads are joined), so results are visible
// to the caller without further synchronisation.
#ifndef RADIXKV_GPU_KV_PARALLEL_H_
#define RADIXKV_GPU_KV_PARALLEL_H_

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace radixkv::gpu {

// Threads ParallelFor uses at most: hardware_concurrency(), at least 1.
inline size_t KernelThreads() {
  static const size_t n =
      std::max<size_t>(1, std::thread::hardware_concurrency());
  return n;
}

// Calls fn(begin, end) on disjoint contiguous sub-ranges covering [0, n).
// The caller's thread runs the first range itself.
template <typename Fn>
void ParallelFor(size_t n, size_t min_per_thread, Fn&& fn) {
  if (n == 0) return;
  size_t threads = std::min(KernelThreads(), n / std::max<size_t>(1, min_per_thread));
  if (threads <= 1) {
    fn(size_t{0}, n);
    return;
  }
  const size_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) {
    const size_t begin = t * chunk;
    const size_t end = std::min(n, begin + chunk);
    if (begin >= end) break;
    workers.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(size_t{0}, std::min(n, chunk));
  for (std::thread& w : workers) w.join();
}

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_KV_PARALLEL_H_
