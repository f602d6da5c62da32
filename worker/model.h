// File: worker/model.h
//
// The reference worker's model: a small decoder-only transformer with
// deterministic weights generated from a seed (no downloads), used to prove
// that prefilling only the uncached suffix of a prompt gives the same logits
// as a full prefill.
//
// Architecture (per layer, pre-norm):
//   h = RMSNorm(x);  q, k, v = h Wq, h Wk, h Wv  (GQA: num_q_heads =
//   group * num_kv_heads);  RoPE(q, k) at absolute positions;
//   x += Attention(q, [prefix pages ; local K/V]) Wo;
//   h = RMSNorm(x);  x += (SiLU(h Wgate) * (h Wup)) Wdown
// then a final RMSNorm and the output head (tied to the embedding, or a
// separate matrix). Weights: uniform(-1, 1) from a counter-based hash of
// (seed, tensor, index), scaled by 1/sqrt(fan_in).
//
// KV: the model's KV layout is its namespace layout (num_layers,
// num_kv_heads, head_dim, page_size, kv_dtype). The K stored in pages and in
// the local cache is post-RoPE, so cached pages are position-complete. The
// model computes in fp32 and its local cache is fp32; pages hold kv_dtype
// (fp32, fp16, bf16, fp8 E4M3 / E5M2 or int8 with per-run scales,
// docs/CONTRACTS.md §2.1): write_kv quantises when blocks are committed and
// attention dequantises cached prefix pages on read, so a cached prefix of a
// quantised namespace differs from a full prefill by the quantisation error
// only (KvDTypeTolerance).
//
// A forward pass (Forward) runs new tokens after a context made of
//   1. a prefix in pool pages (PrefixView: tokens 0 .. prefix.tokens-1), and
//   2. the request's local cache (LocalKv: the tokens after the prefix that
//      earlier Forward calls of this request have run),
// appends the new tokens' K/V to the local cache and returns the last new
// token's logits. Prefill = one Forward over the uncached suffix; each
// decode step = one Forward of one token.
//
// Devices: Create(config, device) picks the CPU path or the CUDA path
// (cuda_model.h: cuBLAS GEMMs and device kernels, weights on the device).
// kAuto takes CUDA when a device is usable (with cuBLAS GEMMs when
// libcublas loads, a built-in GEMM otherwise) and otherwise the CPU, saying
// why in device_note(). Both paths compute the same function
// (within float rounding; the CUDA equivalence tests allow 1e-3).
//
// Thread safety: a Model is immutable after Create and may be shared by
// threads; each request needs its own LocalKv. The CPU Forward uses internal
// threads (gpu::ParallelFor) for large matmuls and attention; CUDA Forward
// calls are serialised on the model's stream.
#ifndef RADIXKV_CLIENT_WORKER_MODEL_H_
#define RADIXKV_CLIENT_WORKER_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gpu/page_layout.h"
#include "radix/block_key.h"

namespace radixkv::worker {

class CudaModel;  // cuda_model.h
struct XLayerWeights;  // xlayer_model.h
namespace internal {
struct ForwardScratch;  // model_internal.h
struct RopeTables;
}  // namespace internal

// Where a Model runs its forward passes.
enum class Device { kAuto, kCpu, kCuda };

// "auto", "cpu" or "cuda"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view name);
const char* DeviceName(Device device);

// Page dtypes by their flag names: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2,
// int8. INVALID_ARGUMENT listing them otherwise.
absl::StatusOr<DType> ParseKvDType(absl::string_view name);
// The flag name of a page dtype ("fp32" ...; "?" for others).
const char* KvDTypeName(DType dtype);
// Every page dtype, fp32 first.
std::vector<DType> AllKvDTypes();

// Documented bound on max |cached - uncached| of the reference models' first
// logits (the "tiny", "small" and "base" configurations, prompts of up to a
// few thousand tokens) when the prefix comes from pages of `dtype`: float
// rounding for fp32, the quantisation error otherwise.
double KvDTypeTolerance(DType dtype);

// Cross-layer KV (worker/xlayer_model.h): layers [0, shared_from)
// keep their own K/V; layers [shared_from, num_layers) read one shared bank
// written once per position from the input of layer shared_from, choosing
// `top_k` bank positions per query, plus their own K/V of the last `window`
// tokens.
struct XLayerConfig {
  uint32_t shared_from = 1;  // S: in 1..num_layers-1
  uint32_t window = 64;      // W: 0..kMaxCrossLayerWindow; 0 = no window
  uint32_t top_k = 64;       // bank positions per query; 0 = every position

  friend bool operator==(const XLayerConfig&, const XLayerConfig&) = default;
};

struct ModelConfig {
  std::string name = "tiny";
  uint32_t num_layers = 2;
  uint32_t d_model = 64;
  uint32_t num_q_heads = 4;
  uint32_t num_kv_heads = 2;
  uint32_t head_dim = 16;
  uint32_t ffn_dim = 128;
  uint32_t vocab = 512;
  uint32_t page_size = 16;  // tokens per cached block
  bool tied_embeddings = false;  // a tied random model mostly echoes its input
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  uint64_t seed = 1;
  // Encoding of cached K/V pages; part of the namespace (a page of one
  // dtype never serves a request of another).
  DType kv_dtype = DType::kFloat32;
  // Set: the cross-layer KV variant (xlayer_model.h); unset: per-layer KV.
  std::optional<XLayerConfig> xlayer;

  // INVALID_ARGUMENT naming the field: zero sizes, num_q_heads not a
  // multiple of num_kv_heads, odd head_dim (RoPE rotates pairs), sizes above
  // sane limits (layers <= 256, d_model/ffn_dim <= 65536, vocab <= 1<<22),
  // a cross-layer layout outside CheckCrossLayerKv's limits or top_k above
  // 1<<20.
  absl::Status Validate() const;

  // KV groups of a page: num_layers, or xlayer->shared_from + 1 (the lower
  // layers, then the bank).
  uint32_t KvGroups() const;

  // The namespace this model's blocks live in: model "radixkv-reference/
  // <name>", a revision string that encodes every weight-shaping field and
  // the seed (so two configurations never share K/V), the KV layout and
  // kv_dtype; a cross-layer model also sets cross_layer (shared_from,
  // window) and adds top_k to the revision.
  NamespaceSpec Namespace() const;
  // The page geometry of the namespace layout (dtype kv_dtype, KvGroups()
  // groups; page_bytes() equals NamespacePageBytes(Namespace())).
  PageGeometry Geometry() const;
  // Number of weights (embedding, layers, final norm, separate head).
  uint64_t ParameterCount() const;
};

// The named sizes: "tiny" (CI), "small" (examples, CPU benchmarks) and
// "base" (bigger benchmarks). NOT_FOUND lists the names for anything else.
absl::StatusOr<ModelConfig> NamedModelConfig(absl::string_view name);

// The prefix part of the context: `tokens` tokens whose K/V sit in pool
// pages (host addresses, block order; the config's Geometry()). Borrowed
// for a call.
struct PrefixView {
  std::vector<const void*> pages;
  uint32_t tokens = 0;  // REQUIRES: <= pages.size() * page_size
  // The pages are device pointers (a mapped cuda pool); only a Model on the
  // cuda device can read them.
  bool device_pages = false;
  // Cross-layer models with a local window: the token ids of the prefix's
  // last min(tokens, window) positions (more are allowed; the last ones are
  // used). The request's first Forward re-runs them to rebuild the upper
  // layers' windows. Ignored by per-layer models.
  absl::Span<const uint32_t> recent_tokens;
};

// A LocalKv's device mirror (cuda_model.cc); opaque elsewhere.
struct DeviceKv;
struct DeviceKvDeleter {
  void operator()(DeviceKv* kv) const;
};

// One request's local K/V cache: the tokens after the prefix that this
// request computed itself. Layout per tensor: [group][capacity][kv_head][dim]
// (the write_kv source layout with layer_stride_tokens == capacity; a group
// is a layer, or for a cross-layer model a lower layer or the bank), so full
// blocks can be written to pages straight from here. A cross-layer model's
// request also keeps its windows and the prefix's bank here (XLayerState).
// Move-only; owned by one request.
class LocalKv {
 public:
  LocalKv(const ModelConfig& config, uint32_t capacity_tokens);
  LocalKv(LocalKv&&) = default;
  LocalKv& operator=(LocalKv&&) = default;
  LocalKv(const LocalKv&) = delete;
  LocalKv& operator=(const LocalKv&) = delete;

  uint32_t capacity() const { return capacity_; }
  uint32_t size() const { return size_; }
  // K (or V) of layer `layer`, token `t` (local index), all kv heads.
  float* k(uint32_t layer, uint32_t t) { return k_.data() + Index(layer, t); }
  float* v(uint32_t layer, uint32_t t) { return v_.data() + Index(layer, t); }
  const float* k(uint32_t layer, uint32_t t) const {
    return k_.data() + Index(layer, t);
  }
  const float* v(uint32_t layer, uint32_t t) const {
    return v_.data() + Index(layer, t);
  }

 private:
  friend class Model;
  friend class CudaModel;
  size_t Index(uint32_t layer, uint32_t t) const {
    return (size_t{layer} * capacity_ + t) * token_floats_;
  }
  uint32_t capacity_ = 0;
  uint32_t size_ = 0;
  size_t token_floats_ = 0;
  std::vector<float> k_, v_;
  // Created by the first CUDA Forward; kept in sync with k_/v_ for tokens
  // < size_.
  std::unique_ptr<DeviceKv, DeviceKvDeleter> device_;

  // Cross-layer models only (xlayer_model.cc), set up by the request's
  // first Forward.
  struct XLayerState {
    bool ready = false;
    // The prefix's bank (pages' last group) in fp32: [prefix token][kv_head]
    // [dim], bank_tokens of them.
    std::vector<float> bank_k, bank_v;
    uint32_t bank_tokens = 0;
    // Each upper layer's own K/V, [upper layer][window_capacity][kv_head]
    // [dim]; index j holds absolute position window_base + j. Positions
    // window_base .. prefix end came from the rebuild, later ones from this
    // request's tokens.
    std::vector<float> win_k, win_v;
    uint32_t window_capacity = 0;
    uint32_t window_base = 0;
  };
  XLayerState xl_;
};

// FLOPs of a forward pass of `new_tokens` tokens after `context_tokens`
// tokens of context (prefix + local), counting matmuls (2 per multiply-add),
// attention (QK^T and PV over the visible keys) and the output head for the
// last token only. A cross-layer model's count is XLayerForwardFlops's
// (the window rebuild of a cached context included).
double ForwardFlops(const ModelConfig& config, uint64_t context_tokens,
                    uint64_t new_tokens);

class Model {
 public:
  // Validates the config and generates the weights; with kCuda or kAuto
  // also uploads them to the device. kCuda without a usable device:
  // FAILED_PRECONDITION saying what is missing; kAuto then falls back to
  // the CPU and records why in device_note().
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const ModelConfig& config, Device device = Device::kCpu);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  // True when forward passes run on the CUDA device.
  bool on_cuda() const { return cuda_ != nullptr; }
  // The GEMM of the forward passes: "cpu", or on CUDA "cublas" or
  // "builtin" (cuBLAS could not be loaded).
  const char* gemm_backend() const;
  // One line: why kAuto chose the CPU; empty otherwise.
  const std::string& device_note() const { return device_note_; }

  // CUDA path only: writes local tokens [first_local, first_local +
  // pages.size() * page_size) into device pages with write_kv and waits for
  // completion (the pages may then be committed). FAILED_PRECONDITION on
  // the CPU path.
  absl::Status WriteKvToDevicePages(const LocalKv& local, uint32_t first_local,
                                    absl::Span<void* const> pages) const;

  // Runs `tokens` at absolute positions prefix.tokens + local->size() ...,
  // appends their K/V to `local` and returns the logits of the last one.
  // INVALID_ARGUMENT (local unchanged) for: no tokens, a token >= vocab, not
  // enough local capacity, a prefix that does not fit its pages, or device
  // prefix pages on the CPU path.
  absl::StatusOr<std::vector<float>> Forward(const PrefixView& prefix,
                                             LocalKv* local,
                                             absl::Span<const uint32_t> tokens) const;

  // Per-layer models only (a cross-layer model visits nothing). Calls
  // visit(name, shape, values) once for every host weight tensor the
  // forward pass uses, row-major, in this order: "embedding" [vocab,
  // d_model]; per layer l, "layers.<l>." + "attn_norm" [d_model], "wqkv"
  // [d_model, (q_heads + 2 kv_heads) head_dim], "wo" [q_heads head_dim,
  // d_model], "mlp_norm" [d_model], "wgateup" [d_model, 2 ffn_dim], "wdown"
  // [ffn_dim, d_model]; "final_norm" [d_model]; "head" [d_model, vocab]
  // (the scaled transposed embedding when tied); "rope_inv_freq"
  // [head_dim / 2]. The spans are valid while the Model lives.
  using WeightVisitor =
      std::function<void(const std::string& name,
                         const std::vector<uint64_t>& shape,
                         absl::Span<const float> values)>;
  void ForEachWeight(const WeightVisitor& visit) const;

 private:
  explicit Model(const ModelConfig& config);
  struct Layer {
    std::vector<float> attn_norm, wqkv, wo, mlp_norm, wgateup, wdown;
  };

  // x[i] = embedding of tokens[i].
  void Embed(absl::Span<const uint32_t> tokens, float* x) const;
  // The output head's logits for one final hidden state x [d_model].
  std::vector<float> Logits(const float* x) const;
  // Layer `l` with its own K/V (group l of the pages and of `local`) on the
  // s->m tokens at local positions first_local ..: writes their K/V into
  // `local`, attends over prefix + local, runs the MLP; s->x in place.
  absl::Status RunKvLayer(uint32_t l, const PrefixView& prefix, LocalKv* local,
                          uint32_t first_local, const internal::RopeTables& rope,
                          internal::ForwardScratch* s) const;

  // The cross-layer forward pass and its parts (xlayer_model.cc).
  // ProjectEncoder's bank_local value that skips the bank write (a rebuild:
  // the prefix's bank is already in pages).
  static constexpr uint32_t kNoBankWrite = ~0u;
  absl::StatusOr<std::vector<float>> ForwardXLayer(
      const PrefixView& prefix, LocalKv* local,
      absl::Span<const uint32_t> tokens) const;
  absl::Status PrepareXLayer(const PrefixView& prefix, LocalKv* local) const;
  void ProjectEncoder(const internal::RopeTables& rope, uint64_t first_pos,
                      LocalKv* local, uint32_t bank_local,
                      internal::ForwardScratch* s) const;
  void RunUpperLayer(uint32_t u, uint64_t first_pos, LocalKv* local,
                     const internal::RopeTables& rope,
                     internal::ForwardScratch* s) const;
  void GenerateXLayerWeights(uint64_t* tensor);

  ModelConfig config_;
  std::vector<float> embedding_;  // [vocab][d_model]
  std::vector<float> head_;       // [d_model][vocab] (transposed embedding when tied)
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;   // RoPE, [head_dim / 2]
  std::unique_ptr<CudaModel> cuda_;  // set: the CUDA path
  std::string device_note_;
  // Cross-layer models: layers_ holds the shared_from lower layers; these are
  // the bank projection and the upper layers (xlayer_model.h).
  std::unique_ptr<XLayerWeights> xlayer_;

  friend class CudaModel;  // reads the host weights to upload them
};

// Index of the largest logit (the smallest index on ties).
uint32_t Argmax(absl::Span<const float> logits);

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_MODEL_H_
