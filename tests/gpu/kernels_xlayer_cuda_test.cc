// Cross-layer KV pages on CUDA (label gpu): a page of a namespace whose
// layers S.. share one bank holds S + 1 KV groups (docs/CONTRACTS.md §2.2),
// an ordinary PageGeometry with num_layers = S + 1. For L = 8, S = 5 (six
// groups, the bank last) and every page dtype:
//   - WriteKvCuda writes pages bit-exact with the CPU write_kv (codes and
//     scales), ReadKv of those pages gives the CPU's values back, and
//     CopyPagesCuda moves them unchanged;
//   - the CUDA attention over the bank group (and over a lower group)
//     matches the CPU attention within 1e-4.
// Every test skips when no CUDA device is usable.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "gpu/attention.h"
#include "gpu/cuda_kernels_util.h"
#include "gpu/kv_ops.h"
#include "gpu/page_layout.h"
#include "gtest/gtest.h"
#include "tests/gpu/kernels_test_util.h"

namespace radixkv::gpu {
namespace {

using testing::HostPool;
using testing::MaxAbsDiff;
using testing::RandomFloats;
using testing::ShuffledIds;

constexpr uint32_t kLayers = 8, kSharedFrom = 5;
constexpr uint32_t kGroups = CrossLayerGroups(kLayers, kSharedFrom);
static_assert(kGroups == kSharedFrom + 1);

constexpr DType kDTypes[] = {DType::kFloat32,    DType::kFloat16,
                             DType::kBFloat16,   DType::kFloat8E4M3,
                             DType::kFloat8E5M2, DType::kInt8};

class XLayerCudaTest : public ::testing::Test {
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
  static std::vector<uint8_t> Download(const CudaKernelBuffer& b, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_TRUE(b.CopyToHost(out.data(), bytes).ok());
    return out;
  }
};

// The source is laid out as a request's local cache: [group][capacity]
// [kv_head][dim] with capacity > n (layer_stride_tokens), the bank group
// last; the last page is partial.
TEST_F(XLayerCudaTest, WriteReadAndCopyAreBitExactWithCpu) {
  const uint32_t H = 2, P = 16, D = 64, n = 16 * 4 + 5, stride = n + 11;
  const uint32_t cap = 64;
  std::vector<float> k =
      RandomFloats(size_t{kGroups} * stride * H * D, 71, -3.0f, 3.0f);
  std::vector<float> v = RandomFloats(k.size(), 72, -0.5f, 0.5f);
  k[(size_t{kGroups - 1} * stride + 3) * H * D] = 40.0f;  // a bank outlier
  for (DType t : kDTypes) {
    const PageGeometry g = MakePageGeometry(kGroups, H, P, D, t);
    ASSERT_TRUE(g.valid());
    const uint64_t pages = PagesForTokens(g, n);
    const auto ids = ShuffledIds(pages, cap, 100 + int(t));
    const KvSource host_src{k.data(), v.data(), n, stride};
    HostPool cpu(g, cap, 0x3C);
    ASSERT_TRUE(WriteKv(g, host_src, cpu.data_base(), cap, ids).ok());

    CudaKernelBuffer dk = Upload(k.data(), k.size() * 4);
    CudaKernelBuffer dv = Upload(v.data(), v.size() * 4);
    HostPool init(g, cap, 0x3C);
    CudaKernelBuffer dpool = Upload(init.bytes.data(), init.bytes.size());
    ASSERT_TRUE(WriteKvCuda(g, KvSource{dk.get(), dv.get(), n, stride},
                            dpool.get(), cap, ids, nullptr).ok());
    ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
    HostPool gpu(g, cap, 0);
    gpu.bytes = Download(dpool, init.bytes.size());
    EXPECT_TRUE(gpu.bytes == cpu.bytes) << "write_kv, dtype " << int(t);

    // Read back every group, the bank included, from the CUDA-written pages.
    std::vector<float> want_k(k.size()), want_v(k.size());
    std::vector<float> got_k(k.size(), -1.0f), got_v(k.size(), -1.0f);
    ASSERT_TRUE(ReadKv(g, cpu.ConstAddresses(ids),
                       KvDest{want_k.data(), want_v.data(), n, stride}).ok());
    ASSERT_TRUE(ReadKv(g, gpu.ConstAddresses(ids),
                       KvDest{got_k.data(), got_v.data(), n, stride}).ok());
    for (uint32_t grp = 0; grp < kGroups; ++grp) {
      const size_t first = size_t{grp} * stride * H * D;
      const size_t last = first + size_t{n} * H * D;
      auto same = [&](const std::vector<float>& a, const std::vector<float>& b) {
        return std::equal(a.begin() + first, a.begin() + last, b.begin() + first);
      };
      EXPECT_TRUE(same(got_k, want_k) && same(got_v, want_v))
          << "read_kv group " << grp << ", dtype " << int(t);
      // fp32 pages hold the source itself.
      if (t == DType::kFloat32) {
        EXPECT_TRUE(same(got_k, k) && same(got_v, v)) << "group " << grp;
      }
    }

    // Device-to-device page copy of the xlayer pages, into other ids.
    std::vector<uint64_t> dst_ids;
    for (uint64_t id : ids) dst_ids.push_back(cap - 1 - id);
    HostPool zeros(g, cap, 0);
    CudaKernelBuffer dcopy = Upload(zeros.bytes.data(), zeros.bytes.size());
    ASSERT_TRUE(CopyPagesCuda(g.page_bytes(), dpool.get(), cap, ids, dcopy.get(),
                              cap, dst_ids, nullptr).ok());
    ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
    HostPool copied(g, cap, 0);
    copied.bytes = Download(dcopy, zeros.bytes.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_TRUE(std::equal(copied.page(dst_ids[i]),
                             copied.page(dst_ids[i]) + g.page_bytes(),
                             cpu.page(ids[i])))
          << "copy_pages page " << i << ", dtype " << int(t);
    }
  }
}

// The upper layers read the bank, the last group; the lower layers their
// own groups. Both through the CUDA attention equal the CPU attention.
TEST_F(XLayerCudaTest, AttentionOverTheBankMatchesCpu) {
  const uint32_t Hkv = 2, Hq = 8, P = 16, D = 64, prefix = 16 * 5 + 9;
  const uint32_t S = 4, T = 10, cap = 32;
  const std::vector<float> k = RandomFloats(size_t{kGroups} * prefix * Hkv * D, 81);
  const std::vector<float> v = RandomFloats(k.size(), 82);
  const std::vector<float> q = RandomFloats(size_t{S} * Hq * D, 83);
  const std::vector<float> lk = RandomFloats(size_t{T} * Hkv * D, 84);
  const std::vector<float> lv = RandomFloats(lk.size(), 85);
  const AttentionShape shape{Hq, Hkv, D, 0};
  for (DType t : kDTypes) {
    const PageGeometry g = MakePageGeometry(kGroups, Hkv, P, D, t);
    const auto ids = ShuffledIds(PagesForTokens(g, prefix), cap, 7);
    HostPool pool(g, cap, 0);
    ASSERT_TRUE(WriteKv(g, KvSource{k.data(), v.data(), prefix},
                        pool.data_base(), cap, ids).ok());
    CudaKernelBuffer dpool = Upload(pool.bytes.data(), pool.bytes.size());
    CudaKernelBuffer dids = Upload(ids.data(), ids.size() * 8);
    CudaKernelBuffer dq = Upload(q.data(), q.size() * 4);
    CudaKernelBuffer dlk = Upload(lk.data(), lk.size() * 4);
    CudaKernelBuffer dlv = Upload(lv.data(), lv.size() * 4);
    for (uint32_t group : {kGroups - 1, 2u}) {
      const PrefixPages pages{g, group, prefix};
      std::vector<float> want(q.size());
      ASSERT_TRUE(AttentionPrefixSuffix(
                      shape, pages, pool.ConstAddresses(ids),
                      AttentionIo{q.data(), S, lk.data(), lv.data(), T, want.data()})
                      .ok());
      auto dout = CudaKernelBuffer::Create(q.size() * 4);
      ASSERT_TRUE(dout.ok());
      ASSERT_TRUE(AttentionPrefixSuffixCuda(
                      shape, pages, dpool.get(), dids.as<uint64_t>(),
                      AttentionIo{dq.as<float>(), S, dlk.as<float>(),
                                  dlv.as<float>(), T, dout->as<float>()},
                      nullptr).ok());
      ASSERT_TRUE(CudaKernelStreamSync(nullptr).ok());
      std::vector<float> got(q.size());
      ASSERT_TRUE(dout->CopyToHost(got.data(), got.size() * 4).ok());
      EXPECT_LE(MaxAbsDiff(got, want), 1e-4f)
          << "group " << group << ", dtype " << int(t);
    }
  }
}

}  // namespace
}  // namespace radixkv::gpu
