#include "worker/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/cuda_model.h"
#include "worker/matmul.h"
#include "worker/model_internal.h"
#include "worker/xlayer_model.h"
#include "gpu/attention.h"
#include "gpu/kv_parallel.h"
#include "base/status_macros.h"

namespace radixkv::worker {
namespace {

using internal::NormGain;
using internal::RmsNorm;
using internal::Uniform;

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
// (worker/README.md, "KV dtypes"; base has the largest).
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
  if (xlayer.has_value()) return ValidateXLayer(*this);
  return absl::OkStatus();
}

uint32_t ModelConfig::KvGroups() const {
  return xlayer.has_value() ? xlayer->shared_from + 1 : num_layers;
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
  if (xlayer.has_value()) {
    absl::StrAppend(&ns.model_revision, ";xlayer_topk=", xlayer->top_k);
    ns.cross_layer = CrossLayerKv{xlayer->shared_from, xlayer->window};
  }
  return ns;
}

PageGeometry ModelConfig::Geometry() const {
  return MakePageGeometry(KvGroups(), num_kv_heads, page_size, head_dim,
                          static_cast<DType>(kv_dtype));
}

uint64_t ModelConfig::ParameterCount() const {
  const uint64_t d = d_model, qd = uint64_t{num_q_heads} * head_dim,
                 kvd = uint64_t{num_kv_heads} * head_dim;
  const uint64_t per_layer = 2 * d + d * (qd + 2 * kvd) + qd * d + 3 * d * ffn_dim;
  const uint64_t shared = uint64_t{vocab} * d * (tied_embeddings ? 1 : 2) + d;
  if (xlayer.has_value()) {
    // Every layer as above (an upper layer's Q and window K/V projections
    // are as big as a lower layer's QKV), plus the encoder norm and the bank
    // projection.
    return shared + per_layer * num_layers + d + d * 2 * kvd;
  }
  return shared + per_layer * num_layers;
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
  if (c.xlayer.has_value()) {
    return XLayerForwardFlops(c, context_tokens, new_tokens);
  }
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
      k_(size_t{config.KvGroups()} * capacity_tokens * token_floats_),
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
  const uint32_t kv_layers =
      c.xlayer.has_value() ? c.xlayer->shared_from : c.num_layers;
  for (uint32_t l = 0; l < kv_layers; ++l) {
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
  if (c.xlayer.has_value()) {
    m->GenerateXLayerWeights(&tensor);
    // The cross-layer forward pass exists on the CPU only.
    if (device == Device::kCuda) {
      return absl::FailedPreconditionError(
          "--layout=xlayer runs on the CPU only: the cuda device has no "
          "cross-layer KV path (use --device=cpu)");
    }
    if (device == Device::kAuto) {
      m->device_note_ =
          "device auto: --layout=xlayer runs on the CPU only; using the CPU path";
    }
    return m;
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
  if (c.xlayer.has_value()) return ForwardXLayer(prefix, local, tokens);
  const size_t d = c.d_model;
  const uint32_t first_local = local->size_;
  internal::ForwardScratch s(c, m);
  Embed(tokens, s.x.data());
  const internal::RopeTables rope(inv_freq_, uint64_t{prefix.tokens} + first_local, m);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    RETURN_IF_ERROR(RunKvLayer(l, prefix, local, first_local, rope, &s));
  }
  local->size_ += static_cast<uint32_t>(m);
  return Logits(&s.x[(m - 1) * d]);
}

void Model::Embed(absl::Span<const uint32_t> tokens, float* x) const {
  const size_t d = config_.d_model;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::memcpy(&x[i * d], &embedding_[size_t{tokens[i]} * d], d * sizeof(float));
  }
}

std::vector<float> Model::Logits(const float* x) const {
  const ModelConfig& c = config_;
  std::vector<float> last(c.d_model), logits(c.vocab);
  RmsNorm(x, final_norm_.data(), last.data(), 1, c.d_model, c.norm_eps);
  MatMul(last.data(), head_.data(), logits.data(), 1, c.d_model, c.vocab, false);
  return logits;
}

absl::Status Model::RunKvLayer(uint32_t l, const PrefixView& prefix,
                               LocalKv* local, uint32_t first_local,
                               const internal::RopeTables& rope,
                               internal::ForwardScratch* s) const {
  const ModelConfig& c = config_;
  const Layer& w = layers_[l];
  const size_t m = s->m, d = c.d_model, hd = c.head_dim, hq = c.num_q_heads,
               hkv = c.num_kv_heads, qd = hq * hd, kvd = hkv * hd,
               f = c.ffn_dim, qkv_w = qd + 2 * kvd;
  RmsNorm(s->x.data(), w.attn_norm.data(), s->h.data(), m, d, c.norm_eps);
  MatMul(s->h.data(), w.wqkv.data(), s->qkv.data(), m, d, qkv_w, false);
  for (size_t i = 0; i < m; ++i) {
    const float* row = &s->qkv[i * qkv_w];
    float* qi = &s->q[i * qd];
    float* ki = local->k(l, first_local + static_cast<uint32_t>(i));
    float* vi = local->v(l, first_local + static_cast<uint32_t>(i));
    std::memcpy(qi, row, qd * sizeof(float));
    std::memcpy(ki, row + qd, kvd * sizeof(float));
    std::memcpy(vi, row + qd + kvd, kvd * sizeof(float));
    rope.Apply(qi, hq, i);
    rope.Apply(ki, hkv, i);
  }
  const gpu::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, 0};
  const gpu::AttentionIo io{s->q.data(), static_cast<uint32_t>(m),
                            local->k(l, 0), local->v(l, 0),
                            first_local + static_cast<uint32_t>(m),
                            s->attn.data()};
  RETURN_IF_ERROR(gpu::AttentionPrefixSuffix(
      shape, gpu::PrefixPages{c.Geometry(), l, prefix.tokens}, prefix.pages, io));
  MatMul(s->attn.data(), w.wo.data(), s->x.data(), m, qd, d, true);
  internal::MlpBlock(w.mlp_norm.data(), w.wgateup.data(), w.wdown.data(), m, d,
                     f, c.norm_eps, s->x.data(), s->h.data(), s->gu.data(),
                     s->act.data());
  return absl::OkStatus();
}

void Model::ForEachWeight(const WeightVisitor& visit) const {
  const ModelConfig& c = config_;
  if (c.xlayer.has_value()) return;
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
