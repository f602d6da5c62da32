// File: worker/xlayer_model.h
//
// The reference worker's cross-layer KV variant (`radixkv-worker
// --layout=xlayer`): a model of the same depth and width as the per-layer
// model (model.h) whose upper layers share one K/V bank.
//
// Architecture, with S = shared_from, L = num_layers, W = window, k = top_k:
//   layers 0 .. S-1 ("encoder"): exactly the per-layer model's layers, each
//     with its own K/V (RoPE'd K), causal attention over all positions.
//   at the input x_S of layer S: e = RMSNorm(x_S) (gain enc_norm);
//     bank K, V = e Wkv_bank (K RoPE'd at the token's position), written
//     once per position and shared by every upper layer;
//     for each upper layer u: window K, V = e Wkv_window[u] (RoPE'd), that
//     layer's own K/V.
//   layers S .. L-1 ("decoder"): q = RMSNorm(x) Wq[u] (RoPE'd), own per
//     layer; attention of the query at position p over
//       (a) the k bank positions in 0..p with the highest scores
//           q . K_bank[j] / sqrt(head_dim), and
//       (b) the layer's window K/V of positions max(0, p-W+1) .. p,
//     one softmax over (a) and (b) together; then Wo and the SwiGLU MLP as
//     in the per-layer model. GQA: query head h reads KV head
//     h / (q_heads / kv_heads), of the bank and of the window alike.
//   final RMSNorm and output head as in the per-layer model.
//
// Selection rule (deterministic): per query token and query head, every
// bank position 0..p is scored in fp32 (dot product over dims in order,
// times the softmax scale); the k highest scores win, a tie going to the
// lower position; k = 0, or k > p, selects every position. The selected
// positions are then used in increasing position order, followed by the
// window positions in increasing order, so the softmax sums in a fixed
// order.
//
// Why the window K/V come from e (the encoder output) and not from each
// upper layer's own input: the K/V of position j then depend on tokens
// 0..j through the lower layers only, so the windows at the end of a cached
// prefix of P tokens are rebuilt exactly by re-running the lower layers
// over the last min(W, P) prefix tokens (their attention reads the cached
// pages) and projecting e for each upper layer. That is the serving plan:
// prefill touches only the last W prompt tokens of the cached part to
// rebuild local state; older history reaches the upper layers through the
// bank. Upper-layer outputs at the rebuilt positions are never needed
// (nothing later reads them), so the upper attention is not re-run there.
//
// Pages (docs/CONTRACTS.md §2.2): S + 1 groups, the S lower layers' K/V
// and then the bank, in the per-layer page layout with "layer" = group; the
// windows never enter pages. The namespace carries cross_layer {S, W}; the
// revision string adds top_k.
//
// Devices: CPU only; Model::Create refuses Device::kCuda for a cross-layer
// config (FAILED_PRECONDITION) and kAuto picks the CPU with a note.
//
// Thread safety: as Model (immutable weights; per-request LocalKv).
#ifndef RADIXKV_CLIENT_WORKER_XLAYER_MODEL_H_
#define RADIXKV_CLIENT_WORKER_XLAYER_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/model.h"

namespace radixkv::worker {

// The cross-layer weights a Model holds besides its S lower layers,
// row-major [in][out] as in the per-layer model.
struct XLayerWeights {
  struct Upper {
    std::vector<float> attn_norm;   // [d_model]
    std::vector<float> wq;          // [d_model][q_heads * head_dim]
    std::vector<float> wkv_window;  // [d_model][2 * kv_heads * head_dim]: K | V
    std::vector<float> wo, mlp_norm, wgateup, wdown;  // as Model::Layer
  };
  std::vector<float> enc_norm;  // [d_model]
  std::vector<float> wkv_bank;  // [d_model][2 * kv_heads * head_dim]: K | V
  std::vector<Upper> upper;     // layers S .. L-1
};

// The xlayer part of ModelConfig::Validate: INVALID_ARGUMENT naming the
// field and its limit ("model xlayer.shared_from = 0: ...").
// REQUIRES: config.xlayer is set.
absl::Status ValidateXLayer(const ModelConfig& config);

// What the upper layers' attention of one Forward reads: the bank of the
// prefix (staged fp32) and of the request's own tokens (LocalKv's bank
// group), and one upper layer's window. Token rows are kv_heads * head_dim
// floats, row-major; pointers are borrowed for the call.
struct XLayerBankView {
  const float* prefix_k = nullptr;  // position j < prefix_tokens at row j
  const float* prefix_v = nullptr;
  uint32_t prefix_tokens = 0;
  const float* local_k = nullptr;  // position prefix_tokens + t at row t
  const float* local_v = nullptr;
  const float* win_k = nullptr;  // position win_base + j at row j
  const float* win_v = nullptr;
  uint32_t win_base = 0;
};

// One upper layer's attention (the selection rule above) for m query
// tokens at positions first_pos .. first_pos + m - 1: q and out are
// [m][q_heads][head_dim], q RoPE'd. REQUIRES: config.xlayer set; the bank
// holds positions 0 .. first_pos + m - 1; with a window, the window holds
// positions max(0, first_pos - W + 1) .. first_pos + m - 1 (win_base at or
// below the first). Multi-threaded (gpu::ParallelFor); out does not depend
// on the thread count or on m (a row's result is that of the same query
// attending alone).
void XLayerAttention(const ModelConfig& config, const XLayerBankView& bank,
                     const float* q, size_t m, uint64_t first_pos, float* out);

// ForwardFlops of a cross-layer model: lower layers as the per-layer
// model's, the bank and window projections, upper layers' matmuls, their
// bank scoring over every visible position, the weighted sum over the
// selected positions and the window; with context_tokens > 0 also the
// window rebuild of the request's first pass (lower layers and window
// projections over min(W, context_tokens) tokens).
double XLayerForwardFlops(const ModelConfig& config, uint64_t context_tokens,
                          uint64_t new_tokens);

// Bytes of one request's window state as a server keeps it (fp32):
// (L - S) upper layers x W tokens x 2 (K, V) x kv_heads x head_dim x 4.
// 0 for a per-layer model.
uint64_t XLayerWindowBytes(const ModelConfig& config);

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_XLAYER_MODEL_H_
