// The reference model's CUDA path against its CPU path (label `gpu`):
// logits within 1e-3 (fp32 GEMMs without TF32) for the cases of
// model_equivalence_test.cc — prefix 0, one block, a page-edge boundary, a
// tail inside a page, the fully cached prompt — with GQA ratios 1, 2 and 4,
// prefix pages in host memory (staged) and in device memory (read in
// place); decode steps; write_kv into device pages; every page dtype
// (--kv-dtype). Every test skips when no CUDA device or no cuBLAS is usable.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "worker/cuda_model.h"
#include "worker/engine.h"
#include "worker/prefix_cache.h"
#include "worker/model.h"
#include "gpu/cuda_kernels_util.h"
#include "gpu/kv_ops.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_test_util.h"

namespace radixkv::worker {
namespace {

constexpr float kTolerance = 1e-3f;

class ModelCudaTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    if (absl::Status s = CudaModel::Available(); !s.ok()) {
      GTEST_SKIP() << s.message();
    }
    ModelConfig c = *NamedModelConfig("tiny");
    c.num_kv_heads = 2;
    c.num_q_heads = 2 * GetParam();
    c.d_model = 16 * c.num_q_heads;
    auto cpu = Model::Create(c, Device::kCpu);
    auto cuda = Model::Create(c, Device::kCuda);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cpu_ = std::move(*cpu);
    cuda_ = std::move(*cuda);
    ASSERT_FALSE(cpu_->on_cuda());
    ASSERT_TRUE(cuda_->on_cuda());
  }

  std::vector<float> FullPrefill(const Model& model,
                                 const std::vector<uint32_t>& tokens) {
    LocalKv local(model.config(), tokens.size());
    auto logits = model.Forward(PrefixView{}, &local, tokens);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : std::vector<float>();
  }

  // The CPU model fills `cached_blocks` blocks into shuffled host pages;
  // the CUDA model prefills tokens[prefix_tokens..] over them, reading the
  // pages from host memory or (device_pages) from a device copy of the pool.
  std::vector<float> CudaCachedPrefill(const std::vector<uint32_t>& tokens,
                                       uint32_t cached_blocks,
                                       uint32_t prefix_tokens,
                                       bool device_pages) {
    const ModelConfig& c = cpu_->config();
    const PageGeometry g = c.Geometry();
    const uint32_t cached = cached_blocks * c.page_size;
    const uint64_t pool_pages = cached_blocks + 3;
    std::vector<float> pool(g.page_bytes() / 4 * pool_pages, NAN);
    std::vector<uint64_t> ids(pool_pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(cached_blocks));
    ids.resize(cached_blocks);
    if (cached > 0) {
      LocalKv earlier(c, cached);
      const std::vector<uint32_t> head(tokens.begin(), tokens.begin() + cached);
      EXPECT_TRUE(cpu_->Forward(PrefixView{}, &earlier, head).ok());
      EXPECT_TRUE(gpu::WriteKv(g,
                               gpu::KvSource{earlier.k(0, 0), earlier.v(0, 0),
                                             cached, earlier.capacity()},
                               pool.data(), pool_pages, ids)
                      .ok());
    }
    auto dev = gpu::CudaKernelBuffer::Create(pool.size() * sizeof(float));
    EXPECT_TRUE(dev.ok()) << dev.status();
    if (!dev.ok()) return {};
    EXPECT_TRUE(dev->CopyFromHost(pool.data(), pool.size() * sizeof(float)).ok());
    PrefixView prefix;
    prefix.tokens = prefix_tokens;
    prefix.device_pages = device_pages;
    for (uint64_t id : ids) {
      prefix.pages.push_back(device_pages
                                 ? dev->as<float>() + id * (g.page_bytes() / 4)
                                 : pool.data() + id * (g.page_bytes() / 4));
    }
    LocalKv local(c, tokens.size() - prefix_tokens);
    const std::vector<uint32_t> suffix(tokens.begin() + prefix_tokens, tokens.end());
    auto logits = cuda_->Forward(prefix, &local, suffix);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : std::vector<float>();
  }

  void ExpectCase(uint32_t n, uint32_t seed, uint32_t blocks, uint32_t prefix) {
    const auto t = Prompt(n, 512, seed);
    const std::vector<float> want = FullPrefill(*cpu_, t);
    EXPECT_LE(MaxAbsDiff(FullPrefill(*cuda_, t), want), kTolerance);
    EXPECT_LE(MaxAbsDiff(CudaCachedPrefill(t, blocks, prefix, false), want),
              kTolerance);
    EXPECT_LE(MaxAbsDiff(CudaCachedPrefill(t, blocks, prefix, true), want),
              kTolerance);
  }

  std::unique_ptr<Model> cpu_, cuda_;
};

TEST_P(ModelCudaTest, PrefixZero) { ExpectCase(37, 1, 0, 0); }
TEST_P(ModelCudaTest, ExactlyOneBlock) { ExpectCase(40, 2, 1, 16); }
TEST_P(ModelCudaTest, BoundaryOnAPageEdge) { ExpectCase(80, 3, 4, 64); }
TEST_P(ModelCudaTest, TailInsideAPage) { ExpectCase(100, 4, 6, 96); }
TEST_P(ModelCudaTest, FullyCachedPromptRecomputesItsLastToken) {
  ExpectCase(64, 5, 4, 63);
}

TEST_P(ModelCudaTest, DecodeStepsMatchTheCpu) {
  const auto t = Prompt(50, 512, 7);
  const ModelConfig& c = cpu_->config();
  LocalKv a(c, 60), b(c, 60);
  auto la = cpu_->Forward(PrefixView{}, &a, t);
  auto lb = cuda_->Forward(PrefixView{}, &b, t);
  ASSERT_TRUE(la.ok() && lb.ok());
  for (int step = 0; step < 8; ++step) {
    ASSERT_LE(MaxAbsDiff(*la, *lb), kTolerance) << "step " << step;
    const uint32_t tok = Argmax(*la);
    la = cpu_->Forward(PrefixView{}, &a, absl::MakeConstSpan(&tok, 1));
    lb = cuda_->Forward(PrefixView{}, &b, absl::MakeConstSpan(&tok, 1));
    ASSERT_TRUE(la.ok() && lb.ok());
  }
  EXPECT_EQ(a.size(), b.size());
  // The host mirror of the CUDA local cache holds the device's K/V.
  float diff = 0;
  for (uint32_t l = 0; l < c.num_layers; ++l)
    for (uint32_t i = 0; i < b.size() * c.num_kv_heads * c.head_dim; ++i)
      diff = std::max(diff, std::fabs(a.k(l, 0)[i] - b.k(l, 0)[i]));
  EXPECT_LE(diff, kTolerance);
}

TEST_P(ModelCudaTest, WriteKvToDevicePagesMatchesTheHostCopy) {
  const ModelConfig& c = cpu_->config();
  const PageGeometry g = c.Geometry();
  const auto t = Prompt(3 * c.page_size + 5, 512, 8);
  LocalKv local(c, t.size());
  ASSERT_TRUE(cuda_->Forward(PrefixView{}, &local, t).ok());
  auto dev = gpu::CudaKernelBuffer::Create(4 * g.page_bytes());
  ASSERT_TRUE(dev.ok());
  std::vector<void*> pages;
  for (int i : {2, 0, 3}) pages.push_back(dev->as<uint8_t>() + i * g.page_bytes());
  ASSERT_TRUE(cuda_->WriteKvToDevicePages(local, 0, pages).ok());
  std::vector<uint8_t> got(4 * g.page_bytes()), want(4 * g.page_bytes(), 0);
  ASSERT_TRUE(dev->CopyToHost(got.data(), got.size()).ok());
  std::vector<void*> host_pages;
  for (int i : {2, 0, 3}) host_pages.push_back(want.data() + i * g.page_bytes());
  ASSERT_TRUE(gpu::WriteKv(g,
                           gpu::KvSource{local.k(0, 0), local.v(0, 0),
                                         3 * c.page_size, local.capacity()},
                           host_pages)
                  .ok());
  EXPECT_EQ(got, want);
  // Past the local tokens: rejected, nothing written.
  EXPECT_EQ(cuda_->WriteKvToDevicePages(local, 2 * c.page_size, pages).code(),
            absl::StatusCode::kInvalidArgument);
  // The CPU path cannot write device pages.
  EXPECT_EQ(cpu_->WriteKvToDevicePages(local, 0, pages).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(ModelCudaTest, EngineOverADevicePoolMatchesAFullCpuPrefill) {
  // The first run writes its blocks into device pages (write_kv on the
  // device, stream sync, Commit); the second reads them in place.
  const ModelConfig& c = cuda_->config();
  auto device_cache = NewLocalPrefixCache(c.Namespace(), 64, /*device_pages=*/true);
  ASSERT_TRUE(device_cache.ok()) << device_cache.status();
  std::unique_ptr<PrefixCache> none = NewNoPrefixCache();
  const Engine gpu_engine(cuda_.get(), device_cache->get());
  const Engine cpu_engine(cpu_.get(), none.get());
  RunOptions options;
  options.decode_tokens = 6;
  const auto prompt = Prompt(5 * c.page_size + 3, 512, 9);
  auto want = cpu_engine.Run(prompt, options);
  auto first = gpu_engine.Run(prompt, options);
  auto second = gpu_engine.Run(prompt, options);
  ASSERT_TRUE(want.ok() && first.ok() && second.ok());
  EXPECT_EQ(first->committed_blocks, 5u);
  EXPECT_EQ(second->matched_tokens, 5 * c.page_size);
  EXPECT_LE(MaxAbsDiff(second->first_logits, want->first_logits), kTolerance);
  EXPECT_EQ(second->generated, want->generated);
}

// Quantised pages on the device: the CUDA write_kv of the model's local
// K/V gives the pages the CPU write_kv gives from the host mirror (bit for
// bit: same codes, same scales), and a CUDA engine over a device pool of the
// dtype stays within the dtype's tolerance of a full fp32 CPU prefill.
class ModelCudaKvDTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (absl::Status s = CudaModel::Available(); !s.ok()) {
      GTEST_SKIP() << s.message();
    }
    ModelConfig c = *NamedModelConfig("tiny");
    c.kv_dtype = GetParam();
    auto cpu = Model::Create(c, Device::kCpu);
    auto cuda = Model::Create(c, Device::kCuda);
    ASSERT_TRUE(cpu.ok() && cuda.ok());
    cpu_ = std::move(*cpu);
    cuda_ = std::move(*cuda);
  }
  std::unique_ptr<Model> cpu_, cuda_;
};

TEST_P(ModelCudaKvDTypeTest, DeviceWriteKvIsBitExactWithTheCpu) {
  const ModelConfig& c = cuda_->config();
  const PageGeometry g = c.Geometry();
  const auto t = Prompt(3 * c.page_size, 512, 10);
  LocalKv local(c, t.size());
  ASSERT_TRUE(cuda_->Forward(PrefixView{}, &local, t).ok());
  auto dev = gpu::CudaKernelBuffer::Create(3 * g.page_bytes());
  ASSERT_TRUE(dev.ok());
  std::vector<void*> pages, host_pages;
  std::vector<uint8_t> want(3 * g.page_bytes(), 0), got(want.size());
  for (int i : {1, 2, 0}) {
    pages.push_back(dev->as<uint8_t>() + i * g.page_bytes());
    host_pages.push_back(want.data() + i * g.page_bytes());
  }
  ASSERT_TRUE(cuda_->WriteKvToDevicePages(local, 0, pages).ok());
  ASSERT_TRUE(dev->CopyToHost(got.data(), got.size()).ok());
  ASSERT_TRUE(gpu::WriteKv(g,
                           gpu::KvSource{local.k(0, 0), local.v(0, 0),
                                         3 * c.page_size, local.capacity()},
                           host_pages)
                  .ok());
  EXPECT_EQ(got, want) << KvDTypeName(GetParam());
}

TEST_P(ModelCudaKvDTypeTest, EngineOverADevicePoolStaysWithinTheTolerance) {
  const ModelConfig& c = cuda_->config();
  auto device_cache = NewLocalPrefixCache(c.Namespace(), 64, /*device_pages=*/true);
  ASSERT_TRUE(device_cache.ok()) << device_cache.status();
  std::unique_ptr<PrefixCache> none = NewNoPrefixCache();
  const Engine gpu_engine(cuda_.get(), device_cache->get());
  const Engine cpu_engine(cpu_.get(), none.get());
  const auto prompt = Prompt(6 * c.page_size + 3, 512, 11);
  auto want = cpu_engine.Run(prompt, RunOptions());
  auto first = gpu_engine.Run(prompt, RunOptions());
  auto second = gpu_engine.Run(prompt, RunOptions());
  ASSERT_TRUE(want.ok() && first.ok() && second.ok());
  EXPECT_EQ(second->matched_tokens, 6 * c.page_size);
  EXPECT_LE(MaxAbsDiff(second->first_logits, want->first_logits),
            KvDTypeTolerance(GetParam()) + kTolerance)
      << KvDTypeName(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypes, ModelCudaKvDTypeTest, ::testing::ValuesIn(AllKvDTypes()),
    [](const ::testing::TestParamInfo<DType>& info) {
      return std::string(KvDTypeName(info.param));
    });

INSTANTIATE_TEST_SUITE_P(GqaRatios, ModelCudaTest, ::testing::Values(1u, 2u, 4u),
                         [](const auto& info) {
                           return "ratio" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace radixkv::worker
