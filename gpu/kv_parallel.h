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
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <thread>
#include <vector>

namespace radixkv::gpu {

// Threads ParallelFor uses at most: $RADIXKV_THREADS when set to a positive
// number, else hardware_concurrency(); at least 1. Read once per process.
inline size_t KernelThreads() {
  static const size_t n = [] {
    if (const char* env = std::getenv("RADIXKV_THREADS")) {
      const long v = std::strtol(env, nullptr, 10);
      if (v > 0) return static_cast<size_t>(std::min(v, 1024L));
    }
    return std::max<size_t>(1, std::thread::hardware_concurrency());
  }();
  return n;
}

// Calls fn(begin, end) on disjoint contiguous sub-ranges covering [0, n).
// Ranges are handed out dynamically (an atomic cursor, about 8 ranges per
// thread), so a thread that the OS deschedules on a busy machine delays the
// call by one small range, not by a fixed share of the work. The caller's
// thread works too.
template <typename Fn>
void ParallelFor(size_t n, size_t min_per_thread, Fn&& fn) {
  if (n == 0) return;
  const size_t threads =
      std::min(KernelThreads(), n / std::max<size_t>(1, min_per_thread));
  if (threads <= 1) {
    fn(size_t{0}, n);
    return;
  }
  const size_t grain = std::max<size_t>(1, n / (threads * 8));
  std::atomic<size_t> next{0};
  auto work = [&fn, &next, n, grain] {
    for (;;) {
      const size_t begin = next.fetch_add(grain, std::memory_order_relaxed);
      if (begin >= n) return;
      fn(begin, std::min(n, begin + grain));
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();
}

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_KV_PARALLEL_H_
