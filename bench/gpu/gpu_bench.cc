// gpu_bench: throughput of the page kernels on a CUDA device. One JSON object
// per line:
//
//   copy_pages     device -> device, many 1 and 2 MiB pages in shuffled
//                  order; GB/s counting read + write bytes, and the fraction
//                  of the HBM peak (--peak_gbps, default 4800: H200 HBM3e);
//                  cudaMemcpyAsync of one contiguous range as the reference
//   offload        device -> pinned host and back, 2 MiB pages, through
//                  copy_pages into mapped pinned memory and through batched
//                  cudaMemcpyAsync; GB/s of bytes moved (one direction)
//   tier_copy      a cuda PagePool's PageCopier moving scattered 2 MiB and
//                  256 KiB pages to its pinned host memory (d2h) and back
//                  (h2d), batch issued to batch waited; GB/s, and the ratio
//                  to one cudaMemcpyAsync of the same bytes between a
//                  cudaMalloc buffer and that host memory (timed the same
//                  way), the transport's ceiling
//   write_kv       new K/V of many tokens scattered into pages (base model
//                  geometry); GB/s of bytes written
//   attention      attention_prefix_suffix on the device vs the CPU oracle
//                  (same inputs) for a few shapes; milliseconds and max diff
//   kv_dtype       per page dtype (fp32, fp16, bf16, fp8 E4M3 / E5M2,
//                  int8): write_kv and attention ms for a 1856 + 192 token
//                  prefill, whether the device pages equal the CPU write_kv's
//                  bit for bit, and the attention's max diff from the CPU
//
// Usage: gpu_bench [--quick] [--peak_gbps=N] [--only=SECTION,...]
// [--skip=SECTION,...] (--help describes them; every section runs by
// default). Exit codes: 0 ok, 1 a CUDA or kernel error, 3 a bad argument,
// 77 no usable CUDA device (nothing measured).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_json.h"
#include "gpu/attention.h"
#include "gpu/cuda_kernels_util.h"
#include "gpu/kv_ops.h"
#include "gpu/page_copier.h"
#include "gpu/page_layout.h"
#include "gpu/pool.h"

namespace radixkv::gpu {
namespace {

#define BENCH_CHECK(expr)                                                    \
  do {                                                                       \
    if (absl::Status _s = (expr); !_s.ok()) {                                \
      std::fprintf(stderr, "gpu_bench: %s: %s\n", #expr,                     \
                   std::string(_s.message()).c_str());                       \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

using ::radixkv::bench::BenchJson;
using ::radixkv::bench::Rounded;
using ::radixkv::bench::Significant;

// One result line on stdout, flushed so a run cut short keeps what it
// measured.
void PrintLine(const BenchJson& j) {
  std::printf("%s\n", ::radixkv::bench::JsonLine(j).c_str());
  std::fflush(stdout);
}

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Pinned, device-mapped host memory (cudaHostAlloc); freed on destruction.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    BENCH_CHECK(Cuda(cudaHostAlloc(&ptr_, bytes, cudaHostAllocMapped),
                     "cudaHostAlloc"));
    std::memset(ptr_, 0, bytes);
  }
  ~PinnedBuffer() { (void)cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

class Stream {
 public:
  Stream() { BENCH_CHECK(Cuda(cudaStreamCreate(&s_), "cudaStreamCreate")); }
  ~Stream() { (void)cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Median milliseconds of `reps` runs of fn() (each enqueued on `stream`)
// after one warm-up run, timed with CUDA events.
template <typename Fn>
double TimeMs(cudaStream_t stream, int reps, Fn fn) {
  cudaEvent_t a, b;
  BENCH_CHECK(Cuda(cudaEventCreate(&a), "cudaEventCreate"));
  BENCH_CHECK(Cuda(cudaEventCreate(&b), "cudaEventCreate"));
  BENCH_CHECK(fn());
  BENCH_CHECK(Cuda(cudaStreamSynchronize(stream), "warm-up"));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    BENCH_CHECK(Cuda(cudaEventRecord(a, stream), "cudaEventRecord"));
    BENCH_CHECK(fn());
    BENCH_CHECK(Cuda(cudaEventRecord(b, stream), "cudaEventRecord"));
    BENCH_CHECK(Cuda(cudaEventSynchronize(b), "cudaEventSynchronize"));
    float t = 0;
    BENCH_CHECK(Cuda(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime"));
    ms.push_back(t);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<uint64_t> Shuffled(uint64_t n, uint32_t seed) {
  std::vector<uint64_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  return ids;
}

void BenchCopyPages(cudaStream_t s, bool quick, double peak_gbps) {
  const uint64_t total = (quick ? 512ull : 2048ull) << 20;  // per pool
  for (uint64_t page_bytes : {1ull << 20, 2ull << 20}) {
    const uint64_t pages = total / page_bytes;
    auto src = CudaKernelBuffer::Create(total);
    auto dst = CudaKernelBuffer::Create(total);
    BENCH_CHECK(src.status());
    BENCH_CHECK(dst.status());
    const std::vector<uint64_t> sid = Shuffled(pages, 1), did = Shuffled(pages, 2);
    const double ms = TimeMs(s, quick ? 5 : 20, [&] {
      return CopyPagesCuda(page_bytes, src->get(), pages, sid, dst->get(),
                           pages, did, s);
    });
    const double gbps = 2.0 * total / (ms * 1e-3) / 1e9;
    PrintLine({{"bench", "copy_pages"},
               {"dir", "d2d"},
               {"page_bytes", page_bytes},
               {"pages", pages},
               {"ms", Rounded(ms, 4)},
               {"gbps_rw", Rounded(gbps, 1)},
               {"peak_gbps", Rounded(peak_gbps, 0)},
               {"pct_of_peak", Rounded(100.0 * gbps / peak_gbps, 1)},
               {"target_pct", 70}});
    const double ms_ref = TimeMs(s, quick ? 5 : 20, [&] {
      return Cuda(cudaMemcpyAsync(dst->get(), src->get(), total,
                                  cudaMemcpyDeviceToDevice, s),
                  "cudaMemcpyAsync");
    });
    const double gbps_ref = 2.0 * total / (ms_ref * 1e-3) / 1e9;
    PrintLine({{"bench", "memcpy_reference"},
               {"dir", "d2d"},
               {"bytes", total},
               {"ms", Rounded(ms_ref, 4)},
               {"gbps_rw", Rounded(gbps_ref, 1)},
               {"pct_of_peak", Rounded(100.0 * gbps_ref / peak_gbps, 1)}});
  }
}

void BenchOffload(cudaStream_t s, bool quick) {
  const uint64_t page_bytes = 2ull << 20;
  const uint64_t total = (quick ? 256ull : 1024ull) << 20;
  const uint64_t pages = total / page_bytes;
  auto dev = CudaKernelBuffer::Create(total);
  BENCH_CHECK(dev.status());
  PinnedBuffer host(total);
  void* host_dev = nullptr;  // the device view of the mapped pinned buffer
  BENCH_CHECK(Cuda(cudaHostGetDevicePointer(&host_dev, host.get(), 0),
                   "cudaHostGetDevicePointer"));
  const std::vector<uint64_t> sid = Shuffled(pages, 3), did = Shuffled(pages, 4);
  const int reps = quick ? 3 : 10;
  auto report = [&](const char* method, const char* dir, double ms) {
    const double gbps = double(total) / (ms * 1e-3) / 1e9;
    PrintLine({{"bench", "offload"},
               {"method", method},
               {"dir", dir},
               {"page_bytes", page_bytes},
               {"pages", pages},
               {"ms", Rounded(ms, 3)},
               {"gbps", Rounded(gbps, 1)},
               {"target_gbps", 40}});
  };
  report("copy_pages", "d2h", TimeMs(s, reps, [&] {
           return CopyPagesCuda(page_bytes, dev->get(), pages, sid, host_dev,
                                pages, did, s);
         }));
  report("copy_pages", "h2d", TimeMs(s, reps, [&] {
           return CopyPagesCuda(page_bytes, host_dev, pages, did, dev->get(),
                                pages, sid, s);
         }));
  auto memcpy_batch = [&](bool d2h) {
    for (uint64_t i = 0; i < pages; ++i) {
      uint8_t* d = dev->as<uint8_t>() + sid[i] * page_bytes;
      uint8_t* h = host.get() + did[i] * page_bytes;
      cudaError_t e = d2h ? cudaMemcpyAsync(h, d, page_bytes,
                                            cudaMemcpyDeviceToHost, s)
                          : cudaMemcpyAsync(d, h, page_bytes,
                                            cudaMemcpyHostToDevice, s);
      if (e != cudaSuccess) return Cuda(e, "cudaMemcpyAsync");
    }
    return absl::OkStatus();
  };
  report("memcpy_async", "d2h", TimeMs(s, reps, [&] { return memcpy_batch(true); }));
  report("memcpy_async", "h2d", TimeMs(s, reps, [&] { return memcpy_batch(false); }));
}

// Median milliseconds, by the wall clock, of `reps` runs of fn() (which
// returns once its copies are done) after one warm-up run.
template <typename Fn>
double WallMs(int reps, Fn fn) {
  BENCH_CHECK(fn());
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    BENCH_CHECK(fn());
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The host tier's transport: PageCopier batches of scattered pool pages to
// consecutive pinned slots and back, against one cudaMemcpyAsync of the same
// bytes between a cudaMalloc buffer and the same pinned memory.
void BenchTierCopy(cudaStream_t s, bool quick) {
  const uint64_t pool_bytes = (quick ? 512ull : 2048ull) << 20;
  const uint64_t moved = pool_bytes / 2;  // per batch
  const int reps = quick ? 3 : 10;
  for (uint64_t page_bytes : {2ull << 20, 256ull << 10}) {
    PoolSpec spec;
    spec.backend = Backend::kCuda;
    spec.device = 0;
    spec.bytes = pool_bytes;
    auto pool = CreatePagePool(spec, page_bytes);
    BENCH_CHECK(pool.status());
    auto copier = CreatePageCopier(**pool);
    BENCH_CHECK(copier.status());
    auto host = (*copier)->AllocateHost(moved);
    BENCH_CHECK(host.status());
    auto dev = CudaKernelBuffer::Create(moved);
    BENCH_CHECK(dev.status());
    const uint64_t pages = moved / page_bytes;
    std::vector<uint64_t> out = Shuffled((*pool)->capacity_pages(), 10),
                          in = Shuffled((*pool)->capacity_pages(), 11);
    out.resize(pages);
    in.resize(pages);
    std::vector<void*> dst;
    for (uint64_t i = 0; i < pages; ++i) dst.push_back((*host)->data() + i * page_bytes);
    const std::vector<const void*> src(dst.begin(), dst.end());
    std::unique_ptr<PageCopier::Batch> batch = (*copier)->NewBatch();
    const double out_ms = WallMs(reps, [&] {
      batch->CopyOut(out, dst);
      return batch->Wait();
    });
    const double in_ms = WallMs(reps, [&] {
      batch->CopyIn(src, in);
      return batch->Wait();
    });
    auto one_copy = [&](bool d2h) {
      return WallMs(reps, [&] {
        cudaError_t e = d2h ? cudaMemcpyAsync((*host)->data(), dev->get(), moved,
                                              cudaMemcpyDeviceToHost, s)
                            : cudaMemcpyAsync(dev->get(), (*host)->data(), moved,
                                              cudaMemcpyHostToDevice, s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s);
        return Cuda(e, "cudaMemcpyAsync");
      });
    };
    const double ref_out_ms = one_copy(true), ref_in_ms = one_copy(false);
    auto report = [&](const char* dir, double ms, double ref_ms) {
      const double gbps = double(moved) / (ms * 1e-3) / 1e9;
      const double ref_gbps = double(moved) / (ref_ms * 1e-3) / 1e9;
      PrintLine({{"bench", "tier_copy"},
                 {"dir", dir},
                 {"page_bytes", page_bytes},
                 {"pages", pages},
                 {"pinned", (*host)->pinned()},
                 {"ms", Rounded(ms, 3)},
                 {"gbps", Rounded(gbps, 1)},
                 {"memcpy_gbps", Rounded(ref_gbps, 1)},
                 {"ratio", Rounded(gbps / ref_gbps, 3)},
                 {"target_gbps", 40},
                 {"target_ratio", 0.7}});
    };
    report("d2h", out_ms, ref_out_ms);
    report("h2d", in_ms, ref_in_ms);
  }
}

void BenchWriteKv(cudaStream_t s, bool quick) {
  // The base model's layout: 8 layers, 4 kv heads, 16-token pages, dim 64.
  const PageGeometry g{8, 4, 16, 64, 4};
  const uint32_t n = quick ? 4096 : 16384;
  const uint64_t pages = PagesForTokens(g, n);
  const uint64_t capacity = pages + 64;
  const size_t src_bytes = size_t{n} * g.num_layers * g.num_kv_heads * g.head_dim * 4;
  auto k = CudaKernelBuffer::Create(src_bytes);
  auto v = CudaKernelBuffer::Create(src_bytes);
  auto pool = CudaKernelBuffer::Create(capacity * g.page_bytes());
  BENCH_CHECK(k.status());
  BENCH_CHECK(v.status());
  BENCH_CHECK(pool.status());
  std::vector<uint64_t> ids = Shuffled(capacity, 5);
  ids.resize(pages);
  const double ms = TimeMs(s, quick ? 5 : 20, [&] {
    return WriteKvCuda(g, KvSource{k->get(), v->get(), n, 0}, pool->get(),
                       capacity, ids, s);
  });
  const double bytes = 2.0 * src_bytes;  // written (and as many read)
  PrintLine({{"bench", "write_kv"},
             {"tokens", n},
             {"page_bytes", g.page_bytes()},
             {"pages", pages},
             {"ms", Rounded(ms, 4)},
             {"gbps_written", Rounded(bytes / (ms * 1e-3) / 1e9, 1)},
             {"tokens_per_s", Significant(n / (ms * 1e-3), 3)}});
}

void BenchAttention(cudaStream_t s, bool quick) {
  struct Shape {
    const char* name;
    uint32_t hq, hkv, dim, prefix, suffix;
  };
  std::vector<Shape> shapes = {{"prefill_p1856_s192", 12, 4, 64, 1856, 192},
                               {"decode_p4096_s1", 12, 4, 64, 4096, 1},
                               {"prefill_p8192_s512", 32, 8, 128, 8192, 512}};
  if (quick) shapes.pop_back();
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Shape& sh : shapes) {
    const PageGeometry g{1, sh.hkv, 16, sh.dim, 4};
    const uint64_t pages = PagesForTokens(g, sh.prefix);
    std::vector<float> pool(pages * g.page_bytes() / 4), q(size_t{sh.suffix} * sh.hq * sh.dim),
        k(size_t{sh.suffix} * sh.hkv * sh.dim), v(k.size()), out_cpu(q.size()),
        out_gpu(q.size());
    for (auto* vec : {&pool, &q, &k, &v})
      for (float& x : *vec) x = u(rng);
    const std::vector<uint64_t> ids = Shuffled(pages, 7);
    std::vector<const void*> host_pages;
    for (uint64_t id : ids) host_pages.push_back(pool.data() + id * (g.page_bytes() / 4));
    const AttentionShape shape{sh.hq, sh.hkv, sh.dim, 0};
    const PrefixPages prefix{g, 0, sh.prefix};
    const auto t0 = std::chrono::steady_clock::now();
    BENCH_CHECK(AttentionPrefixSuffix(
        shape, prefix, host_pages,
        AttentionIo{q.data(), sh.suffix, k.data(), v.data(), sh.suffix, out_cpu.data()}));
    const double cpu_ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count();
    auto up = [](const void* p, size_t bytes) {
      auto b = CudaKernelBuffer::Create(bytes);
      BENCH_CHECK(b.status());
      BENCH_CHECK(b->CopyFromHost(p, bytes));
      return std::move(*b);
    };
    CudaKernelBuffer d_pool = up(pool.data(), pool.size() * 4),
                     d_ids = up(ids.data(), ids.size() * 8),
                     d_q = up(q.data(), q.size() * 4), d_k = up(k.data(), k.size() * 4),
                     d_v = up(v.data(), v.size() * 4), d_out = up(out_gpu.data(), out_gpu.size() * 4);
    const AttentionIo io{d_q.as<float>(), sh.suffix, d_k.as<float>(), d_v.as<float>(),
                         sh.suffix, d_out.as<float>()};
    const double gpu_ms = TimeMs(s, quick ? 3 : 10, [&] {
      return AttentionPrefixSuffixCuda(shape, prefix, d_pool.get(),
                                       d_ids.as<uint64_t>(), io, s);
    });
    BENCH_CHECK(d_out.CopyToHost(out_gpu.data(), out_gpu.size() * 4));
    float diff = 0;
    for (size_t i = 0; i < q.size(); ++i)
      diff = std::max(diff, std::fabs(out_cpu[i] - out_gpu[i]));
    const double flops = AttentionFlops(shape, sh.prefix, sh.suffix, sh.suffix);
    PrintLine({{"bench", "attention"},
               {"shape", sh.name},
               {"q_heads", sh.hq},
               {"kv_heads", sh.hkv},
               {"head_dim", sh.dim},
               {"prefix", sh.prefix},
               {"suffix", sh.suffix},
               {"gpu_ms", Rounded(gpu_ms, 4)},
               {"cpu_ms", Rounded(cpu_ms, 3)},
               {"speedup_vs_cpu", Rounded(cpu_ms / gpu_ms, 1)},
               {"gpu_tflops", Rounded(flops / (gpu_ms * 1e-3) / 1e12, 3)},
               {"max_abs_diff", Significant(diff, 3)}});
  }
}

// Typed KV pages: write_kv (quantising fp32 K/V into pages) and attention
// over fp16 / bf16 / fp8 / int8 prefix pages (dequantised in the kernel),
// prefill shape of the base model; ms per call and the max difference from
// the CPU attention over the same pages.
void BenchKvDtypes(cudaStream_t s, bool quick) {
  constexpr uint32_t kHq = 12, kHkv = 4, kDim = 64, kPrefix = 1856, kSuffix = 192;
  const DType dtypes[] = {DType::kFloat32,    DType::kFloat16,
                          DType::kBFloat16,   DType::kFloat8E4M3,
                          DType::kFloat8E5M2, DType::kInt8};
  const char* names[] = {"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"};
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> k(size_t{kPrefix} * kHkv * kDim), v(k.size()),
      q(size_t{kSuffix} * kHq * kDim), lk(size_t{kSuffix} * kHkv * kDim), lv(lk.size());
  for (auto* vec : {&k, &v, &q, &lk, &lv})
    for (float& x : *vec) x = u(rng);
  auto up = [](const void* p, size_t bytes) {
    auto b = CudaKernelBuffer::Create(bytes);
    BENCH_CHECK(b.status());
    BENCH_CHECK(b->CopyFromHost(p, bytes));
    return std::move(*b);
  };
  CudaKernelBuffer d_k = up(k.data(), k.size() * 4), d_v = up(v.data(), v.size() * 4),
                   d_q = up(q.data(), q.size() * 4), d_lk = up(lk.data(), lk.size() * 4),
                   d_lv = up(lv.data(), lv.size() * 4);
  for (size_t t = 0; t < std::size(dtypes); ++t) {
    const PageGeometry g = MakePageGeometry(1, kHkv, 16, kDim, dtypes[t]);
    const uint64_t pages = PagesForTokens(g, kPrefix);
    const std::vector<uint64_t> ids = Shuffled(pages, 9);
    std::vector<uint8_t> pool(pages * g.page_bytes());
    BENCH_CHECK(WriteKv(g, KvSource{k.data(), v.data(), kPrefix}, pool.data(),
                        pages, ids));
    std::vector<const void*> host_pages;
    for (uint64_t id : ids) host_pages.push_back(pool.data() + id * g.page_bytes());
    const AttentionShape shape{kHq, kHkv, kDim, 0};
    const PrefixPages prefix{g, 0, kPrefix};
    std::vector<float> out_cpu(q.size()), out_gpu(q.size());
    BENCH_CHECK(AttentionPrefixSuffix(
        shape, prefix, host_pages,
        AttentionIo{q.data(), kSuffix, lk.data(), lv.data(), kSuffix, out_cpu.data()}));
    auto d_pool = CudaKernelBuffer::Create(pool.size());
    BENCH_CHECK(d_pool.status());
    CudaKernelBuffer d_ids = up(ids.data(), ids.size() * 8),
                     d_out = up(out_gpu.data(), out_gpu.size() * 4);
    const double write_ms = TimeMs(s, quick ? 3 : 10, [&] {
      return WriteKvCuda(g, KvSource{d_k.get(), d_v.get(), kPrefix}, d_pool->get(),
                         pages, ids, s);
    });
    const AttentionIo io{d_q.as<float>(), kSuffix, d_lk.as<float>(), d_lv.as<float>(),
                         kSuffix, d_out.as<float>()};
    const double attn_ms = TimeMs(s, quick ? 3 : 10, [&] {
      return AttentionPrefixSuffixCuda(shape, prefix, d_pool->get(),
                                       d_ids.as<uint64_t>(), io, s);
    });
    BENCH_CHECK(d_out.CopyToHost(out_gpu.data(), out_gpu.size() * 4));
    std::vector<uint8_t> got(pool.size());
    BENCH_CHECK(d_pool->CopyToHost(got.data(), got.size()));
    float diff = 0;
    for (size_t i = 0; i < q.size(); ++i)
      diff = std::max(diff, std::fabs(out_cpu[i] - out_gpu[i]));
    PrintLine({{"bench", "kv_dtype"},
               {"kv_dtype", names[t]},
               {"prefix", kPrefix},
               {"suffix", kSuffix},
               {"page_bytes", g.page_bytes()},
               {"write_kv_ms", Rounded(write_ms, 4)},
               {"attention_ms", Rounded(attn_ms, 4)},
               {"pages_equal_cpu", got == pool},
               {"max_abs_diff", Significant(diff, 3)}});
  }
}

}  // namespace
}  // namespace radixkv::gpu

int main(int argc, char** argv) {
  using namespace radixkv::gpu;
  bool quick = false;
  double peak = 4800;
  const std::vector<std::string> sections = {"copy_pages", "offload", "tier_copy",
                                             "write_kv", "attention", "kv_dtype"};
  std::vector<std::string> only, skip;
  CLI::App app("throughput of the page kernels on a CUDA device (JSON lines)",
               "gpu_bench");
  app.add_flag("--quick", quick, "smaller pools, fewer repetitions and shapes");
  app.add_option("--peak_gbps", peak,
                 "HBM peak in GB/s that copy_pages is compared with")
      ->capture_default_str();
  app.add_option("--only", only, "run only these sections (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(sections));
  app.add_option("--skip", skip, "skip these sections (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(sections));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the error and a pointer to --help
    return 3;
  }
  if (!(peak > 0)) {
    std::fprintf(stderr, "gpu_bench: --peak_gbps must be > 0\n");
    return 3;
  }
  if (CudaKernelDeviceCount() == 0) {
    PrintLine({{"bench", "gpu_bench"}, {"skipped", "no usable CUDA device"}});
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    PrintLine({{"bench", "device"},
               {"name", std::string(prop.name)},
               {"sms", prop.multiProcessorCount},
               {"memory_gib",
                Rounded(prop.totalGlobalMem / double(1ull << 30), 1)},
               {"quick", quick}});
  }
  const std::set<std::string> only_set(only.begin(), only.end()),
      skip_set(skip.begin(), skip.end());
  auto want = [&](const char* section) {
    return (only_set.empty() || only_set.count(section) > 0) &&
           skip_set.count(section) == 0;
  };
  Stream stream;
  if (want("copy_pages")) BenchCopyPages(stream.get(), quick, peak);
  if (want("offload")) BenchOffload(stream.get(), quick);
  if (want("tier_copy")) BenchTierCopy(stream.get(), quick);
  if (want("write_kv")) BenchWriteKv(stream.get(), quick);
  if (want("attention")) BenchAttention(stream.get(), quick);
  if (want("kv_dtype")) BenchKvDtypes(stream.get(), quick);
  return 0;
}
