// File: client/worker/model.h
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

  // INVALID_ARGUMENT naming the field: zero sizes, num_q_heads not a
  // multiple of num_kv_heads, odd head_dim (RoPE rotates pairs), sizes above
  // sane limits (layers <= 256, d_model/ffn_dim <= 65536, vocab <= 1<<22).
  absl::Status Validate() const;

  // The namespace this model's blocks live in: model "radixkv-reference/
  // <name>", a revision string that encodes every weight-shaping field and
  // the seed (so two configurations never share K/V), the KV layout and
  // kv_dtype.
  NamespaceSpec Namespace() const;
  // The page geometry of the namespace layout (dtype kv_dtype; page_bytes()
  // equals NamespacePageBytes(Namespace())).
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
};

// A LocalKv's device mirror (cuda_model.cc); opaque elsewhere.
struct DeviceKv;
struct DeviceKvDeleter {
  void operator()(DeviceKv* kv) const;
};

// One request's local K/V cache: the tokens after the prefix that this
// request computed itself. Layout per tensor: [layer][capacity][kv_head][dim]
// (the write_kv source layout with layer_stride_tokens == capacity), so full
// blocks can be written to pages straight from here. Move-only; owned by one
// request.
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
};

// FLOPs of a forward pass of `new_tokens` tokens after `context_tokens`
// tokens of context (prefix + local), counting matmuls (2 per multiply-add),
// attention (QK^T and PV over the visible keys) and the output head for the
// last token only.
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

  // Calls visit(name, shape, values) once for every host weight tensor the
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

  ModelConfig config_;
  std::vector<float> embedding_;  // [vocab][d_model]
  std::vector<float> head_;       // [d_model][vocab] (transposed embedding when tied)
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;   // RoPE, [head_dim / 2]
  std::unique_ptr<CudaModel> cuda_;  // set: the CUDA path
  std::string device_note_;

  friend class CudaModel;  // reads the host weights to upload them
};

// Index of the largest logit (the smallest index on ties).
uint32_t Argmax(absl::Span<const float> logits);

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_MODEL_H_
