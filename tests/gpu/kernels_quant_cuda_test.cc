// Typed pages on CUDA (label gpu):
//   - the shared encoders (gpu/kv_ops_quant.h) against the CUDA toolkit's own
//     conversions (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h; host code, no
//     device needed);
//   - WriteKvCuda of every dtype bit-exact with the CPU write_kv (codes and
//     scales);
//   - the CUDA attention over typed pages against the CPU attention (1e-4).
// Device tests skip when no CUDA device is usable.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu/attention.h"
#include "gpu/cuda_kernels_util.h"
#include "gpu/kv_ops.h"
#include "gpu/kv_ops_quant.h"
#include "gtest/gtest.h"
#include "tests/gpu/kernels_test_util.h"

namespace radixkv::gpu {
namespace {

using testing::HostPool;
using testing::MaxAbsDiff;
using testing::RandomFloats;
using testing::ShuffledIds;

constexpr DType kTyped[] = {DType::kFloat32,    DType::kFloat16,
                            DType::kBFloat16,   DType::kFloat8E4M3,
                            DType::kFloat8E5M2, DType::kInt8};

template <typename T>
uint32_t RawBits(const T& x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(T));
  return u;
}

// Finite inputs spanning every binade the formats use, plus ties.
std::vector<float> Probes() {
  std::vector<float> xs;
  for (int e = -30; e <= 17; ++e) {
    for (float m : RandomFloats(400, 100 + e, 1.0f, 2.0f)) {
      xs.push_back(std::ldexp(m, e));
      xs.push_back(-std::ldexp(m, e));
    }
  }
  // Exact halfway points between fp8 / fp16 neighbours.
  for (uint32_t c = 0; c < 0x7e; ++c) {
    xs.push_back((quant::DecodeE4M3(uint8_t(c)) + quant::DecodeE4M3(uint8_t(c + 1))) / 2);
    if (c < 0x7b) {
      xs.push_back((quant::DecodeE5M2(uint8_t(c)) + quant::DecodeE5M2(uint8_t(c + 1))) / 2);
    }
  }
  for (uint32_t c = 0; c < 0x7bff; c += 7) {
    xs.push_back((quant::DecodeF16(uint16_t(c)) + quant::DecodeF16(uint16_t(c + 1))) / 2);
  }
  xs.push_back(448.0f);
  xs.push_back(500.0f);
  xs.push_back(57344.0f);
  xs.push_back(1e6f);
  xs.push_back(0.0f);
  return xs;
}

TEST(KvQuantToolkitTest, EncodersMatchTheCudaConversions) {
  for (float x : Probes()) {
    ASSERT_EQ(quant::EncodeF16(x), RawBits(__float2half_rn(x))) << x;
    ASSERT_EQ(quant::EncodeBF16(x), RawBits(__float2bfloat16_rn(x))) << x;
    ASSERT_EQ(quant::EncodeE4M3(x),
              __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) << x;
    ASSERT_EQ(quant::EncodeE5M2(x),
              __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)) << x;
  }
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(uint8_t(c), __NV_E4M3);
    EXPECT_EQ(quant::DecodeE4M3(uint8_t(c)), __half2float(__half(h))) << c;
    if ((c & 0x7f) < 0x7c) {
      const __half_raw h2 = __nv_cvt_fp8_to_halfraw(uint8_t(c), __NV_E5M2);
      EXPECT_EQ(quant::DecodeE5M2(uint8_t(c)), __half2float(__half(h2))) << c;
    }
  }
}

class KvQuantCudaTest : public ::testing::Test {
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

TEST_F(KvQuantCudaTest, WriteKvIsBitExactWithCpuForEveryDtype) {
  const uint32_t L = 3, H = 4, P = 16, D = 64, n = 16 * 5 + 7, stride = n + 9;
  const uint32_t cap = 300;
  std::vector<float> k = RandomFloats(size_t{L} * stride * H * D, 31, -4.0f, 4.0f);
  std::vector<float> v = RandomFloats(k.size(), 32, -0.3f, 0.3f);
  k[5] = 90.0f;  // an outlier in one run
  for (DType t : kTyped) {
    const PageGeometry g = MakePageGeometry(L, H, P, D, t);
    const auto ids = ShuffledIds(PagesForTokens(g, n), cap, int(t));
    HostPool cpu(g, cap, 0x5A);
    ASSERT_TRUE(WriteKv(g, KvSource{k.data(), v.data(), n, stride},
                        cpu.data_base(), cap, ids).ok());
    CudaKernelBuffer dk = Upload(k.data(), k.size() * 4);
    CudaKernelBuffer dv = Upload(v.data(), v.size() * 4);
    HostPool init(g, cap, 0x5A);
    CudaKernelBuffer dpool = Upload(init.bytes.data(), init.bytes.size());
    ASSERT_TRUE(WriteKvCuda(g, KvSource{dk.get(), dv.get(), n, stride},
                            dpool.get(), cap, ids, nullptr).ok());
    ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
    std::vector<uint8_t> got(init.bytes.size());
    ASSERT_TRUE(dpool.CopyToHost(got.data(), got.size()).ok());
    EXPECT_TRUE(got == cpu.bytes) << "dtype " << int(t);
  }
}

TEST_F(KvQuantCudaTest, AttentionOverTypedPagesMatchesCpu) {
  const uint32_t L = 2, Hkv = 2, Hq = 8, P = 16, D = 64, prefix = 16 * 6 + 3;
  const uint32_t S = 5, T = 12, cap = 40;
  std::vector<float> k = RandomFloats(size_t{L} * prefix * Hkv * D, 41);
  std::vector<float> v = RandomFloats(k.size(), 42);
  const std::vector<float> q = RandomFloats(size_t{S} * Hq * D, 43);
  const std::vector<float> lk = RandomFloats(size_t{T} * Hkv * D, 44);
  const std::vector<float> lv = RandomFloats(lk.size(), 45);
  const AttentionShape shape{Hq, Hkv, D, 0};
  for (DType t : kTyped) {
    const PageGeometry g = MakePageGeometry(L, Hkv, P, D, t);
    const auto ids = ShuffledIds(PagesForTokens(g, prefix), cap, 9);
    HostPool pool(g, cap, 0);
    ASSERT_TRUE(WriteKv(g, KvSource{k.data(), v.data(), prefix},
                        pool.data_base(), cap, ids).ok());
    std::vector<float> want(q.size());
    ASSERT_TRUE(AttentionPrefixSuffix(
                    shape, PrefixPages{g, 1, prefix}, pool.ConstAddresses(ids),
                    AttentionIo{q.data(), S, lk.data(), lv.data(), T, want.data()})
                    .ok());
    CudaKernelBuffer dpool = Upload(pool.bytes.data(), pool.bytes.size());
    CudaKernelBuffer dids = Upload(ids.data(), ids.size() * 8);
    CudaKernelBuffer dq = Upload(q.data(), q.size() * 4);
    CudaKernelBuffer dlk = Upload(lk.data(), lk.size() * 4);
    CudaKernelBuffer dlv = Upload(lv.data(), lv.size() * 4);
    auto dout = CudaKernelBuffer::Create(q.size() * 4);
    ASSERT_TRUE(dout.ok());
    ASSERT_TRUE(AttentionPrefixSuffixCuda(
                    shape, PrefixPages{g, 1, prefix}, dpool.get(),
                    dids.as<uint64_t>(),
                    AttentionIo{dq.as<float>(), S, dlk.as<float>(),
                                dlv.as<float>(), T, dout->as<float>()},
                    nullptr).ok());
    ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
    std::vector<float> got(q.size());
    ASSERT_TRUE(dout->CopyToHost(got.data(), got.size() * 4).ok());
    EXPECT_LE(MaxAbsDiff(got, want), 1e-4f) << "dtype " << int(t);
  }
}

}  // namespace
}  // namespace radixkv::gpu
