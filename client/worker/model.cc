#include "client/worker/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/worker/cuda_model.h"
#include "client/worker/matmul.h"
#include "gpu/attention.h"
#include "gpu/kv_parallel.h"

namespace radixkv::worker {
namespace {

// Counter-based generator: a SplitMix64 finaliser of (seed, tensor, index),
// mapped to uniform [-1, 1). Any element can be regenerated independently.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<float> Uniform(uint64_t seed, uint64_t tensor, size_t n,
                           float scale) {
  std::vector<float> out(n);
  const uint64_t base = Mix(seed ^ Mix(tensor));
  gpu::ParallelFor(n, size_t{1} << 20, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const uint64_t r = Mix(base + i);
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
      out[i] = (2.0f * u - 1.0f) * scale;
    }
  });
  return out;
}

// Norm gains near 1 so the norms are not the identity.
std::vector<float> NormGain(uint64_t seed, uint64_t tensor, size_t n) {
  std::vector<float> g = Uniform(seed, tensor, n, 0.1f);
  for (float& x : g) x += 1.0f;
  return g;
}

void RmsNorm(const float* x, const float* gain, float* out, size_t rows,
             size_t d, float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float ss = 0.0f;
    for (size_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    float* o = out + r * d;
    for (size_t i = 0; i < d; ++i) o[i] = xr[i] * inv * gain[i];
  }
}

// Rotates pairs (x[i], x[i + D/2]) of one head by pos * inv_freq[i].
void Rope(float* x, uint32_t head_dim, const float* cos_t, const float* sin_t) {
  const uint32_t half = head_dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos_t[i] - b * sin_t[i];
    x[i + half] = a * sin_t[i] + b * cos_t[i];
  }
}

}  // namespace

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  if (name == "auto") return Device::kAuto;
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(absl::StrCat(
      "device \"", name, "\": want auto, cpu or cuda"));
}

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kAuto:
      return "auto";
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

namespace {
struct KvDTypeEntry {
  DType dtype;
  const char* name;
  double tolerance;
};
// Tolerances: about 5x the largest first-token logit error measured over
// the benchmark prompt sets of the tiny, small and base models
// (client/worker/README.md, "KV dtypes"; base has the largest).
constexpr KvDTypeEntry kKvDTypes[] = {
    {DType::kFloat32, "fp32", 1e-4},        {DType::kFloat16, "fp16", 4e-4},
    {DType::kBFloat16, "bf16", 3e-3},       {DType::kFloat8E4M3, "fp8_e4m3", 0.05},
    {DType::kFloat8E5M2, "fp8_e5m2", 0.1},  {DType::kInt8, "int8", 0.015},
};
}  // namespace

absl::StatusOr<DType> ParseKvDType(absl::string_view name) {
  for (const KvDTypeEntry& e : kKvDTypes) {
    if (name == e.name) return e.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "kv dtype \"", name,
      "\": want fp32, fp16, bf16, fp8_e4m3, fp8_e5m2 or int8"));
}

const char* KvDTypeName(DType dtype) {
  for (const KvDTypeEntry& e : kKvDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

std::vector<DType> AllKvDTypes() {
  std::vector<DType> all;
  for (const KvDTypeEntry& e : kKvDTypes) all.push_back(e.dtype);
  return all;
}

double KvDTypeTolerance(DType dtype) {
  for (const KvDTypeEntry& e : kKvDTypes) {
    if (e.dtype == dtype) return e.tolerance;
  }
  return 0;
}

absl::Status ModelConfig::Validate() const {
  auto bad = [](absl::string_view field, uint64_t v, absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", field, " = ", v, ": ", rule));
  };
  if (num_layers == 0 || num_layers > 256)
    return bad("num_layers", num_layers, "must be in 1..256");
  if (d_model == 0 || d_model > 65536)
    return bad("d_model", d_model, "must be in 1..65536");
  if (ffn_dim == 0 || ffn_dim > 65536)
    return bad("ffn_dim", ffn_dim, "must be in 1..65536");
  if (vocab == 0 || vocab > (1u << 22))
    return bad("vocab", vocab, "must be in 1..4194304");
  if (num_kv_heads == 0 || num_kv_heads > 1024)
    return bad("num_kv_heads", num_kv_heads, "must be in 1..1024");
  if (num_q_heads == 0 || num_q_heads % num_kv_heads != 0)
    return bad("num_q_heads", num_q_heads,
               absl::StrCat("must be a positive multiple of num_kv_heads (",
                            num_kv_heads, ")"));
  if (head_dim == 0 || head_dim % 2 != 0 || head_dim > 1024)
    return bad("head_dim", head_dim, "must be even and in 2..1024");
  if (page_size == 0 || page_size > 4096)
    return bad("page_size", page_size, "must be in 1..4096");
  if (std::string(KvDTypeName(kv_dtype)) == "?")
    return bad("kv_dtype", static_cast<uint32_t>(kv_dtype),
               "must be fp32, fp16, bf16, fp8_e4m3, fp8_e5m2 or int8 (1..6)");
  return absl::OkStatus();
}

NamespaceSpec ModelConfig::Namespace() const {
  NamespaceSpec ns;
  ns.model = absl::StrCat("radixkv-reference/", name);
  ns.model_revision = absl::StrCat(
      "v1;seed=", seed, ";d=", d_model, ";ffn=", ffn_dim, ";q=", num_q_heads,
      ";vocab=", vocab, ";tied=", tied_embeddings ? 1 : 0, ";theta=", rope_theta,
      ";eps=", norm_eps);
  ns.num_layers = num_layers;
  ns.num_kv_heads = num_kv_heads;
  ns.head_dim = head_dim;
  ns.page_size = page_size;
  ns.dtype = kv_dtype;
  return ns;
}

PageGeometry ModelConfig::Geometry() const {
  return MakePageGeometry(num_layers, num_kv_heads, page_size, head_dim,
                          static_cast<KvDType>(kv_dtype));
}

uint64_t ModelConfig::ParameterCount() const {
  const uint64_t d = d_model, qd = uint64_t{num_q_heads} * head_dim,
                 kvd = uint64_t{num_kv_heads} * head_dim;
  const uint64_t per_layer = 2 * d + d * (qd + 2 * kvd) + qd * d + 3 * d * ffn_dim;
  return uint64_t{vocab} * d * (tied_embeddings ? 1 : 2) + d +
         per_layer * num_layers;
}

absl::StatusOr<ModelConfig> NamedModelConfig(absl::string_view name) {
  ModelConfig c;
  c.name = std::string(name);
  if (name == "tiny") {
    return c;  // the defaults
  }
  if (name == "small") {
    c.num_layers = 4;
    c.d_model = 256;
    c.num_q_heads = 8;
    c.num_kv_heads = 4;
    c.head_dim = 32;
    c.ffn_dim = 768;
    c.vocab = 4096;
    return c;
  }
  if (name == "base") {
    c.num_layers = 8;
    c.d_model = 768;
    c.num_q_heads = 12;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    c.ffn_dim = 2048;
    c.vocab = 8192;
    return c;
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown model \"", name, "\"; named sizes are tiny, small, base"));
}

double ForwardFlops(const ModelConfig& c, uint64_t context_tokens,
                    uint64_t new_tokens) {
  const double d = c.d_model, qd = double(c.num_q_heads) * c.head_dim,
               kvd = double(c.num_kv_heads) * c.head_dim;
  const double matmul_per_token =
      2.0 * (d * (qd + 2 * kvd) + qd * d + 3.0 * d * c.ffn_dim);
  const gpu::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, 0};
  // Context tokens are all visible; with local == new the counting of
  // AttentionFlops is exactly "prefix + causal suffix".
  const double attention =
      gpu::AttentionFlops(shape, context_tokens, new_tokens, new_tokens);
  return c.num_layers * (matmul_per_token * double(new_tokens) + attention) +
         (new_tokens > 0 ? 2.0 * d * c.vocab : 0.0);
}

LocalKv::LocalKv(const ModelConfig& config, uint32_t capacity_tokens)
    : capacity_(capacity_tokens),
      token_floats_(size_t{config.num_kv_heads} * config.head_dim),
      k_(size_t{config.num_layers} * capacity_tokens * token_floats_),
      v_(k_.size()) {}

Model::Model(const ModelConfig& config) : config_(config) {}
Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config,
                                                     Device device) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  std::unique_ptr<Model> m(new Model(config));
  const ModelConfig& c = m->config_;
  const size_t d = c.d_model, qd = size_t{c.num_q_heads} * c.head_dim,
               kvd = size_t{c.num_kv_heads} * c.head_dim, f = c.ffn_dim;
  const float in_d = 1.0f / std::sqrt(float(d));
  uint64_t tensor = 0;
  m->embedding_ = Uniform(c.seed, ++tensor, size_t{c.vocab} * d, 1.0f);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    Layer layer;
    layer.attn_norm = NormGain(c.seed, ++tensor, d);
    layer.wqkv = Uniform(c.seed, ++tensor, d * (qd + 2 * kvd), in_d);
    layer.wo = Uniform(c.seed, ++tensor, qd * d, 1.0f / std::sqrt(float(qd)));
    layer.mlp_norm = NormGain(c.seed, ++tensor, d);
    layer.wgateup = Uniform(c.seed, ++tensor, d * 2 * f, in_d);
    layer.wdown = Uniform(c.seed, ++tensor, f * d, 1.0f / std::sqrt(float(f)));
    m->layers_.push_back(std::move(layer));
  }
  m->final_norm_ = NormGain(c.seed, ++tensor, d);
  if (c.tied_embeddings) {
    // head = embedding^T, scaled so logits stay O(1).
    m->head_.resize(d * c.vocab);
    for (size_t v = 0; v < c.vocab; ++v)
      for (size_t i = 0; i < d; ++i)
        m->head_[i * c.vocab + v] = m->embedding_[v * d + i] * in_d;
  } else {
    m->head_ = Uniform(c.seed, ++tensor, d * c.vocab, in_d);
  }
  m->inv_freq_.resize(c.head_dim / 2);
  for (uint32_t i = 0; i < c.head_dim / 2; ++i) {
    m->inv_freq_[i] = static_cast<float>(
        std::pow(double(c.rope_theta), -2.0 * i / double(c.head_dim)));
  }
  if (device == Device::kCpu) return m;
  absl::StatusOr<std::unique_ptr<CudaModel>> cuda = CudaModel::Create(*m);
  if (cuda.ok()) {
    m->cuda_ = std::move(*cuda);
  } else if (device == Device::kCuda) {
    return cuda.status();
  } else {
    m->device_note_ = absl::StrCat("device auto: ", cuda.status().message(),
                                   "; using the CPU path");
  }
  return m;
}

const char* Model::gemm_backend() const {
  return cuda_ == nullptr ? "cpu" : cuda_->GemmBackend();
}

absl::Status Model::WriteKvToDevicePages(const LocalKv& local,
                                         uint32_t first_local,
                                         absl::Span<void* const> pages) const {
  if (cuda_ == nullptr) {
    return absl::FailedPreconditionError(
        "WriteKvToDevicePages: the model runs on the CPU");
  }
  return cuda_->WriteKvToDevicePages(local, first_local, pages);
}

absl::StatusOr<std::vector<float>> Model::Forward(
    const PrefixView& prefix, LocalKv* local,
    absl::Span<const uint32_t> tokens) const {
  const ModelConfig& c = config_;
  const size_t m = tokens.size();
  if (m == 0) return absl::InvalidArgumentError("tokens: at least one needed");
  for (size_t i = 0; i < m; ++i) {
    if (tokens[i] >= c.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens[", i, "] = ", tokens[i], " is not below vocab ", c.vocab));
    }
  }
  if (local == nullptr || uint64_t{local->size_} + m > local->capacity_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local cache: ", m, " new tokens do not fit (size ",
        local ? local->size_ : 0, ", capacity ", local ? local->capacity_ : 0,
        ")"));
  }
  if (uint64_t{prefix.pages.size()} * c.page_size < prefix.tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.tokens (", prefix.tokens, ") exceed ", prefix.pages.size(),
        " pages of ", c.page_size, " tokens"));
  }
  if (prefix.device_pages && prefix.tokens > 0 && cuda_ == nullptr) {
    return absl::InvalidArgumentError(
        "prefix.device_pages: the model runs on the CPU and cannot read "
        "device pages");
  }
  if (cuda_ != nullptr) return cuda_->Forward(prefix, local, tokens);
  const size_t d = c.d_model, hd = c.head_dim, hq = c.num_q_heads,
               hkv = c.num_kv_heads, qd = hq * hd, kvd = hkv * hd,
               f = c.ffn_dim, qkv_w = qd + 2 * kvd;
  const uint32_t first_local = local->size_;
  const uint64_t first_pos = uint64_t{prefix.tokens} + first_local;

  std::vector<float> x(m * d), h(m * d), qkv(m * qkv_w), q(m * qd),
      attn(m * qd), gu(m * 2 * f), act(m * f);
  for (size_t i = 0; i < m; ++i) {
    std::memcpy(&x[i * d], &embedding_[size_t{tokens[i]} * d], d * sizeof(float));
  }
  // RoPE tables for the new positions.
  const size_t half = hd / 2;
  std::vector<float> cos_t(m * half), sin_t(m * half);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < half; ++j) {
      const double angle = double(first_pos + i) * inv_freq_[j];
      cos_t[i * half + j] = static_cast<float>(std::cos(angle));
      sin_t[i * half + j] = static_cast<float>(std::sin(angle));
    }
  }
  const gpu::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, 0};
  const PageGeometry geom = c.Geometry();

  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const Layer& w = layers_[l];
    RmsNorm(x.data(), w.attn_norm.data(), h.data(), m, d, c.norm_eps);
    MatMul(h.data(), w.wqkv.data(), qkv.data(), m, d, qkv_w, false);
    for (size_t i = 0; i < m; ++i) {
      const float* row = &qkv[i * qkv_w];
      float* qi = &q[i * qd];
      float* ki = local->k(l, first_local + static_cast<uint32_t>(i));
      float* vi = local->v(l, first_local + static_cast<uint32_t>(i));
      std::memcpy(qi, row, qd * sizeof(float));
      std::memcpy(ki, row + qd, kvd * sizeof(float));
      std::memcpy(vi, row + qd + kvd, kvd * sizeof(float));
      for (size_t head = 0; head < hq; ++head)
        Rope(qi + head * hd, c.head_dim, &cos_t[i * half], &sin_t[i * half]);
      for (size_t head = 0; head < hkv; ++head)
        Rope(ki + head * hd, c.head_dim, &cos_t[i * half], &sin_t[i * half]);
    }
    const gpu::AttentionIo io{q.data(), static_cast<uint32_t>(m),
                              local->k(l, 0), local->v(l, 0),
                              first_local + static_cast<uint32_t>(m),
                              attn.data()};
    if (absl::Status s = gpu::AttentionPrefixSuffix(
            shape, gpu::PrefixPages{geom, l, prefix.tokens}, prefix.pages, io);
        !s.ok()) {
      return s;
    }
    MatMul(attn.data(), w.wo.data(), x.data(), m, qd, d, true);
    RmsNorm(x.data(), w.mlp_norm.data(), h.data(), m, d, c.norm_eps);
    MatMul(h.data(), w.wgateup.data(), gu.data(), m, d, 2 * f, false);
    for (size_t i = 0; i < m; ++i) {
      const float* g = &gu[i * 2 * f];
      const float* u = g + f;
      float* a = &act[i * f];
      for (size_t j = 0; j < f; ++j) a[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
    MatMul(act.data(), w.wdown.data(), x.data(), m, f, d, true);
  }
  local->size_ += static_cast<uint32_t>(m);
  // Only the last token's logits are needed.
  std::vector<float> last(d), logits(c.vocab);
  RmsNorm(&x[(m - 1) * d], final_norm_.data(), last.data(), 1, d, c.norm_eps);
  MatMul(last.data(), head_.data(), logits.data(), 1, d, c.vocab, false);
  return logits;
}

void Model::ForEachWeight(const WeightVisitor& visit) const {
  const ModelConfig& c = config_;
  const uint64_t d = c.d_model, qd = uint64_t{c.num_q_heads} * c.head_dim,
                 kvd = uint64_t{c.num_kv_heads} * c.head_dim, f = c.ffn_dim;
  visit("embedding", {c.vocab, d}, embedding_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    visit(p + "attn_norm", {d}, w.attn_norm);
    visit(p + "wqkv", {d, qd + 2 * kvd}, w.wqkv);
    visit(p + "wo", {qd, d}, w.wo);
    visit(p + "mlp_norm", {d}, w.mlp_norm);
    visit(p + "wgateup", {d, 2 * f}, w.wgateup);
    visit(p + "wdown", {f, d}, w.wdown);
  }
  visit("final_norm", {d}, final_norm_);
  visit("head", {d, c.vocab}, head_);
  visit("rope_inv_freq", {inv_freq_.size()}, inv_freq_);
}

uint32_t Argmax(absl::Span<const float> logits) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace radixkv::worker
