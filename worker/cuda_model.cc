#include "worker/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu/cublas_loader.h"
#include "gpu/kv_ops.h"

#if defined(RADIXKV_WORKER_CUDA)
#include <cuda_runtime.h>

#include "worker/cuda_model_kernels.h"
#include "gpu/attention.h"
#include "gpu/cuda_kernels_util.h"
#include "base/status_macros.h"
#endif

namespace radixkv::worker {

#if defined(RADIXKV_WORKER_CUDA)

namespace {

absl::Status Cuda(int err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", err, " (",
                   cudaGetErrorString(static_cast<cudaError_t>(err)), ")"));
}

absl::StatusOr<gpu::CudaKernelBuffer> Upload(const std::vector<float>& host) {
  ASSIGN_OR_RETURN(gpu::CudaKernelBuffer b,
                   gpu::CudaKernelBuffer::Create(host.size() * sizeof(float)));
  if (!host.empty()) {
    RETURN_IF_ERROR(b.CopyFromHost(host.data(), host.size() * sizeof(float)));
  }
  return b;
}

// Scratch floats are handed out in 256-byte aligned pieces (cuBLAS and the
// float4-free kernels need only 4-byte alignment; 256 keeps rows apart).
constexpr size_t kAlignFloats = 64;
size_t RoundUp(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

// The device mirror of one LocalKv plus the request's prefix as the
// attention kernel reads it (base + page ids), reused across decode steps.
struct DeviceKv {
  gpu::CudaKernelBuffer k, v;  // [layer][capacity][kv_head][dim]
  // Prefix source the staged ids describe (pages, tokens, kind).
  std::vector<const void*> prefix_pages;
  uint32_t prefix_tokens = 0;
  bool prefix_device = false;
  bool prefix_ready = false;
  gpu::CudaKernelBuffer staging;     // staged copies of the pages, if any
  gpu::CudaKernelBuffer prefix_ids;  // uint64 page ids relative to base
  const void* prefix_base = nullptr;
};

void DeviceKvDeleter::operator()(DeviceKv* kv) const { delete kv; }

struct CudaModel::State {
  const Model* model = nullptr;
  cudaStream_t stream = nullptr;
  std::unique_ptr<gpu::CublasHandle> blas;
  struct Layer {
    gpu::CudaKernelBuffer attn_norm, wqkv, wo, mlp_norm, wgateup, wdown;
  };
  gpu::CudaKernelBuffer embedding, head, final_norm;
  std::vector<Layer> layers;
  gpu::CudaKernelBuffer scratch;

  ~State() {
    blas.reset();  // before its stream
    if (stream != nullptr) {
      (void)cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
    }
  }

  // Makes `prefix` readable by the attention kernel: sets kv->prefix_base
  // and kv->prefix_ids (unchanged when the same prefix was prepared before).
  absl::Status PreparePrefix(const PrefixView& prefix, DeviceKv* kv);

  // Row-major C = A * B (+ C): cuBLAS when loaded, else the built-in GEMM.
  absl::Status Gemm(const float* a, const float* b, float* c, size_t m,
                    size_t k, size_t n, bool accumulate) {
    if (blas != nullptr) return blas->GemmRowMajor(a, b, c, m, k, n, accumulate);
    constexpr size_t kMax = std::numeric_limits<int32_t>::max();
    if (m == 0 || k == 0 || n == 0 || m > kMax || k > kMax || n > kMax) {
      return absl::InvalidArgumentError(
          absl::StrCat("gemm: dimensions ", m, " x ", k, " x ", n,
                       " must be in 1..2^31-1"));
    }
    return Cuda(cuda_kernels::LaunchGemm(a, b, c, static_cast<uint32_t>(m),
                                         static_cast<uint32_t>(k),
                                         static_cast<uint32_t>(n), accumulate,
                                         stream),
                "built-in gemm");
  }
};

absl::Status CudaModel::Available() {
  if (gpu::CudaKernelDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "cuda: no usable CUDA device (no driver, no device or a CUDA error)");
  }
  return absl::OkStatus();
}

CudaModel::CudaModel(std::unique_ptr<State> state)
    : cublas_(state->blas != nullptr), state_(std::move(state)) {}
CudaModel::~CudaModel() = default;

absl::StatusOr<std::shared_ptr<uint8_t>> CudaModel::AllocateDeviceBytes(
    size_t bytes) {
  if (gpu::CudaKernelDeviceCount() == 0) {
    return absl::FailedPreconditionError("cuda: no usable CUDA device");
  }
  ASSIGN_OR_RETURN(gpu::CudaKernelBuffer b, gpu::CudaKernelBuffer::Create(bytes));
  auto* owner = new gpu::CudaKernelBuffer(std::move(b));
  return std::shared_ptr<uint8_t>(owner->as<uint8_t>(),
                                  [owner](uint8_t*) { delete owner; });
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const Model& model) {
  RETURN_IF_ERROR(Available());
  auto st = std::make_unique<State>();
  st->model = &model;
  // A blocking stream: ordered after the synchronous legacy-stream
  // cudaMemset/cudaMemcpy of CudaKernelBuffer.
  RETURN_IF_ERROR(Cuda(cudaStreamCreate(&st->stream), "cudaStreamCreate"));
  const char* gemm = std::getenv("RADIXKV_WORKER_GEMM");
  const bool builtin = gemm != nullptr && std::string(gemm) == "builtin";
  if (!builtin && gpu::CublasLibraryStatus().ok()) {
    ASSIGN_OR_RETURN(st->blas, gpu::CublasHandle::Create(st->stream));
  }
  ASSIGN_OR_RETURN(st->embedding, Upload(model.embedding_));
  ASSIGN_OR_RETURN(st->head, Upload(model.head_));
  ASSIGN_OR_RETURN(st->final_norm, Upload(model.final_norm_));
  for (const Model::Layer& w : model.layers_) {
    State::Layer l;
    ASSIGN_OR_RETURN(l.attn_norm, Upload(w.attn_norm));
    ASSIGN_OR_RETURN(l.wqkv, Upload(w.wqkv));
    ASSIGN_OR_RETURN(l.wo, Upload(w.wo));
    ASSIGN_OR_RETURN(l.mlp_norm, Upload(w.mlp_norm));
    ASSIGN_OR_RETURN(l.wgateup, Upload(w.wgateup));
    ASSIGN_OR_RETURN(l.wdown, Upload(w.wdown));
    st->layers.push_back(std::move(l));
  }
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(st)));
}

absl::Status CudaModel::State::PreparePrefix(const PrefixView& prefix,
                                             DeviceKv* kv) {
  const ModelConfig& c = model->config();
  const uint64_t page_bytes = c.Geometry().page_bytes();
  const size_t n_pages = (size_t{prefix.tokens} + c.page_size - 1) / c.page_size;
  if (prefix.tokens == 0) {
    kv->prefix_base = nullptr;
    kv->prefix_ready = true;
    kv->prefix_tokens = 0;
    kv->prefix_pages.clear();
    return absl::OkStatus();
  }
  const std::vector<const void*> pages(prefix.pages.begin(),
                                       prefix.pages.begin() + n_pages);
  if (kv->prefix_ready && kv->prefix_tokens == prefix.tokens &&
      kv->prefix_device == prefix.device_pages && kv->prefix_pages == pages) {
    return absl::OkStatus();
  }
  kv->prefix_ready = false;
  std::vector<uint64_t> ids(n_pages);
  const void* base = nullptr;
  bool in_place = false;
  if (prefix.device_pages) {
    // Read in place when every page sits on one page_bytes grid from the
    // lowest page (a cuda pool maps all chunks into one VA range).
    const auto lowest = reinterpret_cast<uintptr_t>(
        *std::min_element(pages.begin(), pages.end()));
    in_place = true;
    for (size_t i = 0; i < n_pages && in_place; ++i) {
      const uintptr_t off = reinterpret_cast<uintptr_t>(pages[i]) - lowest;
      in_place = off % page_bytes == 0;
      ids[i] = off / page_bytes;
    }
    base = reinterpret_cast<const void*>(lowest);
  }
  if (!in_place) {
    // Stage the pages contiguously: host -> device, or device -> device.
    if (kv->staging.size() < n_pages * page_bytes) {
      kv->staging = gpu::CudaKernelBuffer();
      ASSIGN_OR_RETURN(kv->staging,
                       gpu::CudaKernelBuffer::Create(n_pages * page_bytes));
    }
    const cudaMemcpyKind kind = prefix.device_pages ? cudaMemcpyDeviceToDevice
                                                    : cudaMemcpyHostToDevice;
    for (size_t i = 0; i < n_pages; ++i) {
      RETURN_IF_ERROR(Cuda(
          cudaMemcpyAsync(kv->staging.as<uint8_t>() + i * page_bytes, pages[i],
                          page_bytes, kind, stream),
          "stage prefix page"));
      ids[i] = i;
    }
    base = kv->staging.get();
  }
  if (kv->prefix_ids.size() < n_pages * sizeof(uint64_t)) {
    kv->prefix_ids = gpu::CudaKernelBuffer();
    ASSIGN_OR_RETURN(kv->prefix_ids,
                     gpu::CudaKernelBuffer::Create(n_pages * sizeof(uint64_t)));
  }
  RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(kv->prefix_ids.get(), ids.data(),
                           n_pages * sizeof(uint64_t), cudaMemcpyHostToDevice,
                           stream),
           "upload prefix page ids"));
  kv->prefix_base = base;
  kv->prefix_pages = pages;
  kv->prefix_tokens = prefix.tokens;
  kv->prefix_device = prefix.device_pages;
  kv->prefix_ready = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaModel::Forward(
    const PrefixView& prefix, LocalKv* local,
    absl::Span<const uint32_t> tokens) {
  absl::MutexLock lock(&mu_);
  State& st = *state_;
  const Model& model = *st.model;
  const ModelConfig& c = model.config();
  const size_t m = tokens.size();
  const size_t d = c.d_model, hd = c.head_dim, hq = c.num_q_heads,
               hkv = c.num_kv_heads, qd = hq * hd, kvd = hkv * hd,
               f = c.ffn_dim, qkv_w = qd + 2 * kvd, half = hd / 2;
  const uint32_t first_local = local->size_;
  const uint32_t cap = local->capacity_;
  const uint64_t first_pos = uint64_t{prefix.tokens} + first_local;
  void* stream = st.stream;

  // The request's device mirror (uploads any tokens a CPU pass left).
  if (local->device_ == nullptr) {
    std::unique_ptr<DeviceKv, DeviceKvDeleter> kv(new DeviceKv);
    ASSIGN_OR_RETURN(kv->k, Upload(local->k_));
    ASSIGN_OR_RETURN(kv->v, Upload(local->v_));
    local->device_ = std::move(kv);
  }
  DeviceKv& kv = *local->device_;
  RETURN_IF_ERROR(st.PreparePrefix(prefix, &kv));

  // Scratch layout (floats).
  size_t off = 0;
  auto take = [&off](size_t n) {
    const size_t at = off;
    off += RoundUp(n);
    return at;
  };
  const size_t o_x = take(m * d), o_h = take(m * d), o_qkv = take(m * qkv_w),
               o_q = take(m * qd), o_attn = take(m * qd), o_gu = take(m * 2 * f),
               o_act = take(m * f), o_cos = take(m * half),
               o_sin = take(m * half), o_last = take(d),
               o_logits = take(c.vocab), o_tok = take(m);
  if (st.scratch.size() < off * sizeof(float)) {
    st.scratch = gpu::CudaKernelBuffer();
    ASSIGN_OR_RETURN(st.scratch, gpu::CudaKernelBuffer::Create(off * sizeof(float)));
  }
  float* s = st.scratch.as<float>();
  float *x = s + o_x, *h = s + o_h, *qkv = s + o_qkv, *q = s + o_q,
        *attn = s + o_attn, *gu = s + o_gu, *act = s + o_act,
        *cos_d = s + o_cos, *sin_d = s + o_sin, *last = s + o_last,
        *logits_d = s + o_logits;
  auto* tok_d = reinterpret_cast<uint32_t*>(s + o_tok);

  // RoPE tables exactly as the CPU path computes them.
  std::vector<float> cos_t(m * half), sin_t(m * half);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < half; ++j) {
      const double angle = double(first_pos + i) * model.inv_freq_[j];
      cos_t[i * half + j] = static_cast<float>(std::cos(angle));
      sin_t[i * half + j] = static_cast<float>(std::sin(angle));
    }
  }
  auto h2d = [&](void* dst, const void* src, size_t bytes, const char* what) {
    return Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                st.stream),
                what);
  };
  RETURN_IF_ERROR(h2d(tok_d, tokens.data(), m * sizeof(uint32_t), "upload tokens"));
  RETURN_IF_ERROR(h2d(cos_d, cos_t.data(), cos_t.size() * sizeof(float), "upload rope"));
  RETURN_IF_ERROR(h2d(sin_d, sin_t.data(), sin_t.size() * sizeof(float), "upload rope"));

  const uint32_t m32 = static_cast<uint32_t>(m);
  RETURN_IF_ERROR(Cuda(cuda_kernels::LaunchEmbed(tok_d, st.embedding.as<float>(),
                                                 x, m32, c.d_model, stream),
                       "embed"));
  const gpu::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, 0};
  const PageGeometry geom = c.Geometry();
  const size_t layer_floats = size_t{cap} * kvd;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const State::Layer& w = st.layers[l];
    float* k_layer = kv.k.as<float>() + l * layer_floats;
    float* v_layer = kv.v.as<float>() + l * layer_floats;
    RETURN_IF_ERROR(Cuda(cuda_kernels::LaunchRmsNorm(x, w.attn_norm.as<float>(),
                                                     h, m32, c.d_model,
                                                     c.norm_eps, stream),
                         "attn rmsnorm"));
    RETURN_IF_ERROR(st.Gemm(h, w.wqkv.as<float>(), qkv, m, d,
                                          qkv_w, false));
    RETURN_IF_ERROR(Cuda(
        cuda_kernels::LaunchSplitRope(qkv, q, k_layer + first_local * kvd,
                                      v_layer + first_local * kvd, cos_d,
                                      sin_d, m32, c.num_q_heads,
                                      c.num_kv_heads, c.head_dim, stream),
        "split rope"));
    const gpu::AttentionIo io{q, m32, k_layer, v_layer, first_local + m32, attn};
    RETURN_IF_ERROR(gpu::AttentionPrefixSuffixCuda(
        shape, gpu::PrefixPages{geom, l, prefix.tokens}, kv.prefix_base,
        prefix.tokens > 0 ? kv.prefix_ids.as<uint64_t>() : nullptr, io,
        stream));
    RETURN_IF_ERROR(st.Gemm(attn, w.wo.as<float>(), x, m, qd, d, true));
    RETURN_IF_ERROR(Cuda(cuda_kernels::LaunchRmsNorm(x, w.mlp_norm.as<float>(),
                                                     h, m32, c.d_model,
                                                     c.norm_eps, stream),
                         "mlp rmsnorm"));
    RETURN_IF_ERROR(st.Gemm(h, w.wgateup.as<float>(), gu, m, d,
                                          2 * f, false));
    RETURN_IF_ERROR(Cuda(cuda_kernels::LaunchSwiGlu(gu, act, m32, c.ffn_dim, stream),
                         "swiglu"));
    RETURN_IF_ERROR(st.Gemm(act, w.wdown.as<float>(), x, m, f, d, true));
  }
  RETURN_IF_ERROR(Cuda(cuda_kernels::LaunchRmsNorm(x + (m - 1) * d,
                                                   st.final_norm.as<float>(),
                                                   last, 1, c.d_model,
                                                   c.norm_eps, stream),
                       "final rmsnorm"));
  RETURN_IF_ERROR(st.Gemm(last, st.head.as<float>(), logits_d, 1,
                                        d, c.vocab, false));
  std::vector<float> logits(c.vocab);
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(logits.data(), logits_d,
                                       logits.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, st.stream),
                       "download logits"));
  // Mirror the new K/V into the host cache.
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const size_t at = l * layer_floats + size_t{first_local} * kvd;
    for (auto [dst, src] : {std::pair<float*, const float*>{
                                local->k_.data() + at, kv.k.as<float>() + at},
                            {local->v_.data() + at, kv.v.as<float>() + at}}) {
      RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(dst, src, m * kvd * sizeof(float),
                                           cudaMemcpyDeviceToHost, st.stream),
                           "download new K/V"));
    }
  }
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(st.stream), "forward"));
  local->size_ += m32;
  return logits;
}

absl::Status CudaModel::WriteKvToDevicePages(const LocalKv& local,
                                             uint32_t first_local,
                                             absl::Span<void* const> pages) {
  absl::MutexLock lock(&mu_);
  State& st = *state_;
  const ModelConfig& c = st.model->config();
  if (local.device_ == nullptr) {
    return absl::FailedPreconditionError(
        "WriteKvToDevicePages: the local cache has no device copy (no CUDA "
        "forward ran for it)");
  }
  const uint64_t end = uint64_t{first_local} + uint64_t{pages.size()} * c.page_size;
  if (end > local.size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteKvToDevicePages: tokens [", first_local, ", ", end,
        ") exceed the ", local.size_, " local tokens"));
  }
  const size_t kvd = size_t{c.num_kv_heads} * c.head_dim;
  const PageGeometry geom = c.Geometry();
  const uint64_t zero = 0;
  for (size_t i = 0; i < pages.size(); ++i) {
    const size_t t = first_local + i * c.page_size;
    const gpu::KvSource src{local.device_->k.as<float>() + t * kvd,
                            local.device_->v.as<float>() + t * kvd,
                            c.page_size, local.capacity_};
    RETURN_IF_ERROR(gpu::WriteKvCuda(geom, src, pages[i], 1,
                                     absl::MakeConstSpan(&zero, 1), st.stream));
  }
  return gpu::CudaKernelStreamSync(st.stream);
}

const char* CudaModel::GemmBackend() const {
  return cublas_ ? "cublas" : "builtin";
}

#else  // !RADIXKV_WORKER_CUDA

struct DeviceKv {};
void DeviceKvDeleter::operator()(DeviceKv* kv) const { delete kv; }

struct CudaModel::State {};

absl::Status CudaModel::Available() {
  return absl::FailedPreconditionError("cuda: radixkv was built without CUDA");
}
CudaModel::CudaModel(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaModel::~CudaModel() = default;
const char* CudaModel::GemmBackend() const { return "none"; }
absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const Model&) {
  return Available();
}
absl::StatusOr<std::shared_ptr<uint8_t>> CudaModel::AllocateDeviceBytes(size_t) {
  return Available();
}
absl::StatusOr<std::vector<float>> CudaModel::Forward(const PrefixView&,
                                                      LocalKv*,
                                                      absl::Span<const uint32_t>) {
  return Available();
}
absl::Status CudaModel::WriteKvToDevicePages(const LocalKv&, uint32_t,
                                             absl::Span<void* const>) {
  return Available();
}

#endif  // RADIXKV_WORKER_CUDA

}  // namespace radixkv::worker
