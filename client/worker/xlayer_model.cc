// The cross-layer KV forward pass of the reference worker (xlayer_model.h).
#include "client/worker/xlayer_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/worker/matmul.h"
#include "client/worker/model_internal.h"
#include "gpu/attention.h"
#include "gpu/kv_ops_quant.h"
#include "gpu/kv_parallel.h"
#include "radix/status_macros.h"
#include "radixkv/namespace_spec.h"

namespace radixkv::worker {
namespace {

constexpr uint32_t kMaxTopK = 1u << 20;

// What the upper layers' attention reads for one Forward: the bank of the
// prefix (staged fp32) and of the request's own tokens (LocalKv's bank
// group), and one upper layer's window. Token rows are kv_heads * head_dim
// floats.
struct BankView {
  const float* prefix_k = nullptr;
  const float* prefix_v = nullptr;
  uint32_t prefix_tokens = 0;  // positions 0 .. prefix_tokens-1 staged
  const float* local_k = nullptr;  // position prefix_tokens + t at row t
  const float* local_v = nullptr;
  const float* win_k = nullptr;  // position win_base + j at row j
  const float* win_v = nullptr;
  uint32_t win_base = 0;
};

float Dot(const float* a, const float* b, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Attention of one query head (query q, KV head g) at position p over the
// top-k bank positions and the window (selection rule of xlayer_model.h);
// writes head_dim floats to out. `scores` and `order` are scratch of at
// least p + 1 entries.
void AttendOne(const ModelConfig& c, const BankView& b, const float* q,
               uint32_t g, uint64_t p, float* out, std::vector<float>* scores,
               std::vector<uint32_t>* order) {
  const size_t hd = c.head_dim, kvd = size_t{c.num_kv_heads} * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const uint32_t n = static_cast<uint32_t>(p + 1);
  auto bank_row = [&](uint32_t j, bool v) {
    if (j < b.prefix_tokens) {
      return (v ? b.prefix_v : b.prefix_k) + j * kvd + g * hd;
    }
    return (v ? b.local_v : b.local_k) + (j - b.prefix_tokens) * kvd + g * hd;
  };
  float* sc = scores->data();
  for (uint32_t j = 0; j < n; ++j) sc[j] = Dot(q, bank_row(j, false), hd) * scale;
  uint32_t* sel = order->data();
  std::iota(sel, sel + n, 0u);
  const uint32_t k = c.xlayer->top_k;
  uint32_t picked = n;
  if (k != 0 && k < n) {
    std::nth_element(sel, sel + k, sel + n, [sc](uint32_t a, uint32_t z) {
      return sc[a] > sc[z] || (sc[a] == sc[z] && a < z);
    });
    std::sort(sel, sel + k);
    picked = k;
  }
  const uint32_t w = c.xlayer->window;
  const uint64_t lo = w == 0 ? p + 1 : (p + 1 > w ? p + 1 - w : 0);
  float mx = -INFINITY;
  for (uint32_t i = 0; i < picked; ++i) mx = std::max(mx, sc[sel[i]]);
  for (uint64_t j = lo; j <= p && w > 0; ++j) {
    const float* kw = b.win_k + (j - b.win_base) * kvd + g * hd;
    mx = std::max(mx, Dot(q, kw, hd) * scale);
  }
  std::fill(out, out + hd, 0.0f);
  float sum = 0.0f;
  auto add = [&](float score, const float* v) {
    const float e = std::exp(score - mx);
    sum += e;
    for (size_t d = 0; d < hd; ++d) out[d] += e * v[d];
  };
  for (uint32_t i = 0; i < picked; ++i) add(sc[sel[i]], bank_row(sel[i], true));
  for (uint64_t j = lo; j <= p && w > 0; ++j) {
    const size_t row = (j - b.win_base) * kvd + g * hd;
    add(Dot(q, b.win_k + row, hd) * scale, b.win_v + row);
  }
  const float inv = 1.0f / sum;
  for (size_t d = 0; d < hd; ++d) out[d] *= inv;
}

// AttendOne for every (token, query head) of a Forward: q and out are
// [m][q_heads][head_dim]; token i sits at position first_pos + i.
void SparseAttention(const ModelConfig& c, const BankView& b, const float* q,
                     size_t m, uint64_t first_pos, float* out) {
  const size_t hq = c.num_q_heads, hd = c.head_dim;
  const uint32_t group = c.num_q_heads / c.num_kv_heads;
  gpu::ParallelFor(m * hq, 4, [&](size_t begin, size_t end) {
    std::vector<float> scores(first_pos + m);
    std::vector<uint32_t> order(first_pos + m);
    for (size_t item = begin; item < end; ++item) {
      const size_t i = item / hq, h = item % hq;
      AttendOne(c, b, q + (i * hq + h) * hd, static_cast<uint32_t>(h / group),
                first_pos + i, out + (i * hq + h) * hd, &scores, &order);
    }
  });
}

// Copies the bank (page group `group`) of prefix positions 0 .. tokens-1
// into fp32 rows [token][kv_head][dim], dequantising typed pages.
void StageBank(const PageGeometry& g, uint32_t group,
               const std::vector<const void*>& pages, uint32_t tokens,
               std::vector<float>* k, std::vector<float>* v) {
  const size_t kvd = size_t{g.num_kv_heads} * g.head_dim;
  k->resize(size_t{tokens} * kvd);
  v->resize(k->size());
  for (uint32_t t = 0; t < tokens; ++t) {
    const void* page = pages[t / g.page_size];
    const uint32_t slot = t % g.page_size;
    for (uint32_t kv = 0; kv < 2; ++kv) {
      float* dst = (kv == 0 ? k->data() : v->data()) + t * kvd;
      for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
        const float scale = gpu::quant::PageScale(g, page, g.run(group, kv, h));
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          dst[h * g.head_dim + d] = gpu::quant::Dequant(
              g.dtype, page, g.offset(group, kv, h, slot, d), scale);
        }
      }
    }
  }
}

}  // namespace

absl::Status ValidateXLayer(const ModelConfig& c) {
  const XLayerConfig& x = *c.xlayer;
  if (std::optional<CrossLayerProblem> bad =
          CheckCrossLayerKv(c.num_layers, CrossLayerKv{x.shared_from, x.window})) {
    const char* field = bad->field == "local_window" ? "window" : "shared_from";
    return absl::InvalidArgumentError(
        absl::StrCat("model xlayer.", field, ": ", bad->message));
  }
  if (x.top_k > kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model xlayer.top_k = ", x.top_k, ": must be at most ", kMaxTopK,
        " (0 reads every bank position)"));
  }
  return absl::OkStatus();
}

double XLayerForwardFlops(const ModelConfig& c, uint64_t context_tokens,
                          uint64_t new_tokens) {
  const XLayerConfig& x = *c.xlayer;
  const double d = c.d_model, qd = double(c.num_q_heads) * c.head_dim,
               kvd = double(c.num_kv_heads) * c.head_dim, f = c.ffn_dim;
  const double upper = c.num_layers - x.shared_from;
  const double lower_per_token = 2.0 * (d * (qd + 2 * kvd) + qd * d + 3 * d * f);
  const gpu::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, 0};
  const double proj_per_token = 2.0 * d * 2 * kvd;
  double flops = x.shared_from * (lower_per_token * double(new_tokens) +
                                  gpu::AttentionFlops(shape, context_tokens,
                                                      new_tokens, new_tokens));
  flops += proj_per_token * (1 + upper) * double(new_tokens);
  flops += upper * 2.0 * (d * qd + qd * d + 3 * d * f) * double(new_tokens);
  double attention = 0;
  for (uint64_t p = context_tokens; p < context_tokens + new_tokens; ++p) {
    const double visible = double(p + 1);
    const double picked = x.top_k == 0 ? visible : std::min<double>(x.top_k, visible);
    attention += 2 * qd * visible + 2 * qd * picked +
                 4 * qd * std::min<double>(x.window, visible);
  }
  flops += upper * attention;
  const uint64_t r = std::min<uint64_t>(x.window, context_tokens);
  if (r > 0) {
    flops += x.shared_from * (lower_per_token * double(r) +
                              gpu::AttentionFlops(shape, context_tokens - r, r, r));
    flops += proj_per_token * upper * double(r);
  }
  return flops + (new_tokens > 0 ? 2.0 * d * c.vocab : 0.0);
}

uint64_t XLayerWindowBytes(const ModelConfig& c) {
  if (!c.xlayer.has_value()) return 0;
  return uint64_t{c.num_layers - c.xlayer->shared_from} * c.xlayer->window * 2 *
         c.num_kv_heads * c.head_dim * sizeof(float);
}

void Model::GenerateXLayerWeights(uint64_t* tensor) {
  const ModelConfig& c = config_;
  const size_t d = c.d_model, qd = size_t{c.num_q_heads} * c.head_dim,
               kvd = size_t{c.num_kv_heads} * c.head_dim, f = c.ffn_dim;
  const float in_d = 1.0f / std::sqrt(float(d));
  auto w = std::make_unique<XLayerWeights>();
  w->enc_norm = internal::NormGain(c.seed, ++*tensor, d);
  w->wkv_bank = internal::Uniform(c.seed, ++*tensor, d * 2 * kvd, in_d);
  for (uint32_t l = c.xlayer->shared_from; l < c.num_layers; ++l) {
    XLayerWeights::Upper u;
    u.attn_norm = internal::NormGain(c.seed, ++*tensor, d);
    u.wq = internal::Uniform(c.seed, ++*tensor, d * qd, in_d);
    u.wkv_window = internal::Uniform(c.seed, ++*tensor, d * 2 * kvd, in_d);
    u.wo = internal::Uniform(c.seed, ++*tensor, qd * d, 1.0f / std::sqrt(float(qd)));
    u.mlp_norm = internal::NormGain(c.seed, ++*tensor, d);
    u.wgateup = internal::Uniform(c.seed, ++*tensor, d * 2 * f, in_d);
    u.wdown = internal::Uniform(c.seed, ++*tensor, f * d, 1.0f / std::sqrt(float(f)));
    w->upper.push_back(std::move(u));
  }
  xlayer_ = std::move(w);
}

void Model::ProjectEncoder(const internal::RopeTables& rope, uint64_t first_pos,
                           LocalKv* local, uint32_t bank_local,
                           internal::ForwardScratch* s) const {
  const ModelConfig& c = config_;
  const size_t m = s->m, d = c.d_model, hkv = c.num_kv_heads,
               kvd = hkv * c.head_dim;
  const uint32_t bank = c.xlayer->shared_from;
  LocalKv::XLayerState& xl = local->xl_;
  internal::RmsNorm(s->x.data(), xlayer_->enc_norm.data(), s->h.data(), m, d,
                    c.norm_eps);
  auto project = [&](const std::vector<float>& w, float* k_rows, float* v_rows) {
    MatMul(s->h.data(), w.data(), s->qkv.data(), m, d, 2 * kvd, false);
    for (size_t i = 0; i < m; ++i) {
      float* k = k_rows + i * kvd;
      std::memcpy(k, &s->qkv[i * 2 * kvd], kvd * sizeof(float));
      std::memcpy(v_rows + i * kvd, &s->qkv[i * 2 * kvd + kvd], kvd * sizeof(float));
      rope.Apply(k, hkv, i);
    }
  };
  if (bank_local != kNoBankWrite) {
    project(xlayer_->wkv_bank, local->k(bank, bank_local), local->v(bank, bank_local));
  }
  if (c.xlayer->window == 0) return;
  const size_t row = first_pos - xl.window_base;
  for (size_t u = 0; u < xlayer_->upper.size(); ++u) {
    const size_t at = (u * xl.window_capacity + row) * kvd;
    project(xlayer_->upper[u].wkv_window, &xl.win_k[at], &xl.win_v[at]);
  }
}

void Model::RunUpperLayer(uint32_t u, uint64_t first_pos, LocalKv* local,
                          const internal::RopeTables& rope,
                          internal::ForwardScratch* s) const {
  const ModelConfig& c = config_;
  const XLayerWeights::Upper& w = xlayer_->upper[u];
  const size_t m = s->m, d = c.d_model, hq = c.num_q_heads,
               qd = hq * c.head_dim, kvd = size_t{c.num_kv_heads} * c.head_dim;
  const LocalKv::XLayerState& xl = local->xl_;
  internal::RmsNorm(s->x.data(), w.attn_norm.data(), s->h.data(), m, d, c.norm_eps);
  MatMul(s->h.data(), w.wq.data(), s->q.data(), m, d, qd, false);
  for (size_t i = 0; i < m; ++i) rope.Apply(&s->q[i * qd], hq, i);
  const uint32_t bank = c.xlayer->shared_from;
  const size_t win = size_t{u} * xl.window_capacity * kvd;
  BankView b;
  b.prefix_k = xl.bank_k.data();
  b.prefix_v = xl.bank_v.data();
  b.prefix_tokens = xl.bank_tokens;
  b.local_k = local->k(bank, 0);
  b.local_v = local->v(bank, 0);
  b.win_k = xl.win_k.empty() ? nullptr : xl.win_k.data() + win;
  b.win_v = xl.win_v.empty() ? nullptr : xl.win_v.data() + win;
  b.win_base = xl.window_base;
  SparseAttention(c, b, s->q.data(), m, first_pos, s->attn.data());
  MatMul(s->attn.data(), w.wo.data(), s->x.data(), m, qd, d, true);
  internal::MlpBlock(w.mlp_norm.data(), w.wgateup.data(), w.wdown.data(), m, d,
                     c.ffn_dim, c.norm_eps, s->x.data(), s->h.data(),
                     s->gu.data(), s->act.data());
}

absl::Status Model::PrepareXLayer(const PrefixView& prefix, LocalKv* local) const {
  const ModelConfig& c = config_;
  const uint32_t P = prefix.tokens;
  const uint32_t r = std::min(c.xlayer->window, P);
  if (prefix.recent_tokens.size() < r) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.recent_tokens: ", prefix.recent_tokens.size(),
        " given; a cross-layer model with window ", c.xlayer->window,
        " needs the prefix's last ", r, " token ids to rebuild its windows"));
  }
  const absl::Span<const uint32_t> tail =
      prefix.recent_tokens.subspan(prefix.recent_tokens.size() - r);
  for (uint32_t t : tail) {
    if (t >= c.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prefix.recent_tokens: token ", t, " is not below vocab ", c.vocab));
    }
  }
  LocalKv::XLayerState& xl = local->xl_;
  StageBank(c.Geometry(), c.xlayer->shared_from, prefix.pages, P, &xl.bank_k,
            &xl.bank_v);
  xl.bank_tokens = P;
  xl.window_base = P - r;
  xl.window_capacity = r + local->capacity_;
  const size_t kvd = size_t{c.num_kv_heads} * c.head_dim;
  const size_t win_floats =
      c.xlayer->window == 0 ? 0 : xlayer_->upper.size() * xl.window_capacity * kvd;
  xl.win_k.assign(win_floats, 0.0f);
  xl.win_v.assign(win_floats, 0.0f);
  if (r > 0) {
    // The lower layers over the last r prefix tokens: their attention reads
    // the pages of positions 0 .. P-r-1 and the recomputed K/V of the r
    // tokens themselves (scratch; the pages already hold them).
    PrefixView head = prefix;
    head.tokens = P - r;
    LocalKv scratch(c, r);
    internal::ForwardScratch s(c, r);
    Embed(tail, s.x.data());
    const internal::RopeTables rope(inv_freq_, P - r, r);
    for (uint32_t l = 0; l < c.xlayer->shared_from; ++l) {
      RETURN_IF_ERROR(RunKvLayer(l, head, &scratch, 0, rope, &s));
    }
    ProjectEncoder(rope, P - r, local, kNoBankWrite, &s);
  }
  xl.ready = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Model::ForwardXLayer(
    const PrefixView& prefix, LocalKv* local,
    absl::Span<const uint32_t> tokens) const {
  const ModelConfig& c = config_;
  if (!local->xl_.ready) RETURN_IF_ERROR(PrepareXLayer(prefix, local));
  const size_t m = tokens.size();
  const uint32_t first_local = local->size_;
  const uint64_t first_pos = uint64_t{prefix.tokens} + first_local;
  internal::ForwardScratch s(c, m);
  Embed(tokens, s.x.data());
  const internal::RopeTables rope(inv_freq_, first_pos, m);
  for (uint32_t l = 0; l < c.xlayer->shared_from; ++l) {
    RETURN_IF_ERROR(RunKvLayer(l, prefix, local, first_local, rope, &s));
  }
  ProjectEncoder(rope, first_pos, local, first_local, &s);
  for (uint32_t u = 0; u < xlayer_->upper.size(); ++u) {
    RunUpperLayer(u, first_pos, local, rope, &s);
  }
  local->size_ += static_cast<uint32_t>(m);
  return Logits(&s.x[(m - 1) * c.d_model]);
}

}  // namespace radixkv::worker
