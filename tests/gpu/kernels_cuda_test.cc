// CUDA write_kv / copy_pages / attention against the CPU oracles: copies
// bit-exact, attention within 1e-4. Label `gpu`; every test skips when no
// CUDA device is usable (no driver: cudaGetDeviceCount fails with 35).
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu/attention.h"
#include "gpu/cuda_kernels_util.h"
#include "gpu/kv_ops.h"
#include "gtest/gtest.h"
#include "tests/gpu/kernels_test_util.h"

namespace radixkv::gpu {
namespace {

using testing::HostPool;
using testing::MaxAbsDiff;
using testing::RandomFloats;
using testing::ShuffledIds;

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaKernelDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
  static CudaKernelBuffer Upload(const void* data, size_t bytes) {
    auto b = CudaKernelBuffer::Create(bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->CopyFromHost(data, bytes).ok());
    return std::move(*b);
  }
};

TEST_F(CudaKernelsTest, WriteKvIsBitExactWithCpu) {
  for (uint32_t elem : {4u, 2u}) {
    const PageGeometry g{3, 2, 16, 64, elem};
    const uint32_t n = 16 * 5 + 7, stride = n + 9, cap = 300;
    const size_t src_bytes = size_t{stride} * g.num_layers * 2 * 64 * elem;
    std::vector<uint8_t> k(src_bytes), v(src_bytes);
    for (size_t i = 0; i < src_bytes; ++i) {
      k[i] = uint8_t(i * 7 + 1);
      v[i] = uint8_t(i * 13 + 5);
    }
    const auto ids = ShuffledIds(PagesForTokens(g, n), cap, elem);
    HostPool cpu(g, cap, 0x5A);
    ASSERT_TRUE(WriteKv(g, KvSource{k.data(), v.data(), n, stride},
                        cpu.data_base(), cap, ids)
                    .ok());
    CudaKernelBuffer dk = Upload(k.data(), src_bytes);
    CudaKernelBuffer dv = Upload(v.data(), src_bytes);
    HostPool init(g, cap, 0x5A);
    CudaKernelBuffer dpool = Upload(init.bytes.data(), init.bytes.size());
    ASSERT_TRUE(WriteKvCuda(g, KvSource{dk.get(), dv.get(), n, stride},
                            dpool.get(), cap, ids, nullptr)
                    .ok());
    ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
    std::vector<uint8_t> got(init.bytes.size());
    ASSERT_TRUE(dpool.CopyToHost(got.data(), got.size()).ok());
    EXPECT_TRUE(got == cpu.bytes) << "elem_bytes " << elem;
  }
}

TEST_F(CudaKernelsTest, CopyPagesIsBitExactIncludingManyBatches) {
  const PageGeometry g{2, 2, 16, 32, 2};
  const uint64_t cap = 600;
  HostPool src(g, cap);
  for (size_t i = 0; i < src.bytes.size(); ++i) src.bytes[i] = uint8_t(i * 29 + (i >> 11));
  std::vector<uint64_t> s_ids, d_ids;
  for (uint64_t i = 0; i < 300; ++i) {  // > one launch batch
    s_ids.push_back(i * 2);
    d_ids.push_back(cap - 1 - i);
  }
  HostPool cpu(g, cap, 0);
  ASSERT_TRUE(CopyPages(g.page_bytes(), src.data_base(), cap, s_ids,
                        cpu.data_base(), cap, d_ids)
                  .ok());
  CudaKernelBuffer dsrc = Upload(src.bytes.data(), src.bytes.size());
  std::vector<uint8_t> zeros(src.bytes.size(), 0);
  CudaKernelBuffer ddst = Upload(zeros.data(), zeros.size());
  ASSERT_TRUE(CopyPagesCuda(g.page_bytes(), dsrc.get(), cap, s_ids, ddst.get(),
                            cap, d_ids, nullptr)
                  .ok());
  ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
  std::vector<uint8_t> got(zeros.size());
  ASSERT_TRUE(ddst.CopyToHost(got.data(), got.size()).ok());
  EXPECT_TRUE(got == cpu.bytes);
}

TEST_F(CudaKernelsTest, AttentionMatchesCpuWithin1e4) {
  struct C {
    uint32_t hq, hkv, d, page, prefix, suffix, extra;
  };
  for (const C& c : {C{4, 2, 16, 16, 0, 33, 0}, C{8, 2, 64, 16, 160, 40, 0},
                     C{8, 8, 128, 16, 45, 17, 0}, C{16, 4, 64, 7, 99, 1, 30},
                     C{32, 8, 128, 16, 1024, 64, 0}}) {
    SCOPED_TRACE(::testing::Message() << "P=" << c.prefix << " S=" << c.suffix
                                      << " d=" << c.d);
    const PageGeometry g{2, c.hkv, c.page, c.d, 4};
    const uint64_t np = PagesForTokens(g, c.prefix), cap = np + 5;
    HostPool pool(g, cap);
    const auto ids = ShuffledIds(np, cap, c.prefix);
    const auto pk = RandomFloats(size_t{2} * c.prefix * c.hkv * c.d, 1);
    const auto pv = RandomFloats(pk.size(), 2);
    if (c.prefix > 0) {
      ASSERT_TRUE(WriteKv(g, KvSource{pk.data(), pv.data(), c.prefix, 0},
                          pool.data_base(), cap, ids)
                      .ok());
    }
    const uint32_t T = c.suffix + c.extra;
    const auto q = RandomFloats(size_t{c.suffix} * c.hq * c.d, 3, -2, 2);
    const auto k = RandomFloats(size_t{T} * c.hkv * c.d, 4, -2, 2);
    const auto v = RandomFloats(k.size(), 5);
    const AttentionShape shape{c.hq, c.hkv, c.d, 0.0f};
    const PrefixPages prefix{g, 1, c.prefix};
    std::vector<float> cpu(q.size());
    ASSERT_TRUE(AttentionPrefixSuffix(
                    shape, prefix, pool.ConstAddresses(ids),
                    AttentionIo{q.data(), c.suffix, k.data(), v.data(), T, cpu.data()})
                    .ok());
    CudaKernelBuffer dpool = Upload(pool.bytes.data(), pool.bytes.size());
    std::vector<uint64_t> ids_padded = ids;  // never empty
    ids_padded.push_back(0);
    CudaKernelBuffer dids =
        Upload(ids_padded.data(), ids_padded.size() * sizeof(uint64_t));
    CudaKernelBuffer dq = Upload(q.data(), q.size() * 4);
    CudaKernelBuffer dk = Upload(k.data(), k.size() * 4);
    CudaKernelBuffer dv = Upload(v.data(), v.size() * 4);
    auto dout = CudaKernelBuffer::Create(q.size() * 4);
    ASSERT_TRUE(dout.ok());
    ASSERT_TRUE(AttentionPrefixSuffixCuda(
                    shape, prefix, dpool.get(), dids.as<uint64_t>(),
                    AttentionIo{dq.as<float>(), c.suffix, dk.as<float>(),
                                dv.as<float>(), T, dout->as<float>()},
                    nullptr)
                    .ok());
    ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
    std::vector<float> gpu(q.size());
    ASSERT_TRUE(dout->CopyToHost(gpu.data(), gpu.size() * 4).ok());
    EXPECT_LE(MaxAbsDiff(gpu, cpu), 1e-4f);
  }
}

}  // namespace
}  // namespace radixkv::gpu
