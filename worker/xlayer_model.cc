// The cross-layer KV forward pass of the reference worker (xlayer_model.h).
#include "worker/xlayer_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/matmul.h"
#include "worker/model_internal.h"
#include "gpu/attention.h"
#include "gpu/namespace_geometry.h"
#include "gpu/kv_ops_quant.h"
#include "gpu/kv_parallel.h"
#include "base/status_macros.h"

namespace radixkv::worker {
namespace {

constexpr uint32_t kMaxTopK = 1u << 20;

// 4 floats: one SSE register (baseline x86-64) or NEON register.
typedef float V4 __attribute__((vector_size(16)));
typedef int32_t V4i __attribute__((vector_size(16)));

inline V4 Load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Query rows scored together: consecutive (query token, query head) pairs
// that read one KV head, held transposed as [head_dim][kChunkRows].
constexpr uint32_t kChunkRows = 16;

// Scores of keys j0 .. j0 + kKeys - 1 for the chunk's rows:
//   out[r * out_stride + j] = (sum over d = 0, 1, .. of qt[d][r] * key_j[d])
//                             * scale
// with one fp32 accumulator per score, so each equals the sequential dot
// product of the selection rule (xlayer_model.h) whatever the blocking.
// Key j's row is keys + j * stride. kRowVecs * 4 rows are computed (qt is
// zero-padded); rows >= `rows` are not stored.
template <int kRowVecs, int kKeys>
inline void ScoreBlock(const float* qt, uint32_t hd, const float* keys,
                       size_t stride, uint32_t j0, float scale, uint32_t rows,
                       float* out, size_t out_stride) {
  V4 acc[kKeys][kRowVecs] = {};
  const float* k[kKeys];
  for (int kk = 0; kk < kKeys; ++kk) k[kk] = keys + (j0 + kk) * stride;
  for (uint32_t d = 0; d < hd; ++d) {
    V4 q[kRowVecs];
    for (int rv = 0; rv < kRowVecs; ++rv) q[rv] = Load4(qt + d * kChunkRows + rv * 4);
    for (int kk = 0; kk < kKeys; ++kk) {
      const float x = k[kk][d];
      for (int rv = 0; rv < kRowVecs; ++rv) acc[kk][rv] += x * q[rv];
    }
  }
  for (int rv = 0; rv < kRowVecs; ++rv) {
    for (int lane = 0; lane < 4; ++lane) {
      const uint32_t r = rv * 4 + lane;
      if (r >= rows) return;
      for (int kk = 0; kk < kKeys; ++kk) {
        out[r * out_stride + j0 + kk] = acc[kk][rv][lane] * scale;
      }
    }
  }
}

template <int kRowVecs, int kKeys>
void ScoreKeysT(const float* qt, uint32_t hd, const float* keys, size_t stride,
                uint32_t n, float scale, uint32_t rows, float* out,
                size_t out_stride) {
  uint32_t j = 0;
  for (; j + kKeys <= n; j += kKeys) {
    ScoreBlock<kRowVecs, kKeys>(qt, hd, keys, stride, j, scale, rows, out,
                                out_stride);
  }
  for (; j < n; ++j) {
    ScoreBlock<kRowVecs, 1>(qt, hd, keys, stride, j, scale, rows, out, out_stride);
  }
}

// ScoreBlock over keys 0 .. n-1, with about 8 vector accumulators whatever
// the chunk's row count (REQUIRES: rows <= kChunkRows).
void ScoreKeys(const float* qt, uint32_t hd, const float* keys, size_t stride,
               uint32_t n, float scale, uint32_t rows, float* out,
               size_t out_stride) {
  if (rows <= 4) {
    ScoreKeysT<1, 8>(qt, hd, keys, stride, n, scale, rows, out, out_stride);
  } else if (rows <= 8) {
    ScoreKeysT<2, 4>(qt, hd, keys, stride, n, scale, rows, out, out_stride);
  } else {
    ScoreKeysT<4, 2>(qt, hd, keys, stride, n, scale, rows, out, out_stride);
  }
}

// A top-k candidate as one integer that orders like the selection rule:
// the score's bits mapped to an unsigned order (high half; -0 counted as
// +0 so that the two tie) and the complement of the position (low half,
// so that on a tie the lower position is the larger key).
inline uint64_t CandidateKey(float score, uint32_t pos) {
  uint32_t bits;
  const float canonical = score + 0.0f;  // -0 + 0 == +0
  std::memcpy(&bits, &canonical, sizeof(bits));
  bits = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (uint64_t{bits} << 32) | (0xFFFFFFFFu - pos);
}
inline float CandidateScore(uint64_t key) {
  uint32_t bits = static_cast<uint32_t>(key >> 32);
  bits = (bits & 0x80000000u) != 0 ? bits & 0x7FFFFFFFu : ~bits;
  float score;
  std::memcpy(&score, &bits, sizeof(score));
  return score;
}

// Replaces the smallest key of the min-heap heap[0 .. k) with x (REQUIRES:
// x > heap[0]) and restores the heap order.
inline void ReplaceHeapTop(uint64_t* heap, uint32_t k, uint64_t x) {
  uint32_t i = 0;
  for (;;) {
    uint32_t c = 2 * i + 1;
    if (c >= k) break;
    if (c + 1 < k && heap[c + 1] < heap[c]) ++c;
    if (heap[c] >= x) break;
    heap[i] = heap[c];
    i = c;
  }
  heap[i] = x;
}

// Writes the positions of the k highest of s[0 .. n) (a tie going to the
// lower position) to sel in increasing order. REQUIRES: 0 < k < n; heap
// has room for k keys. Positions are offered in increasing order, so a
// later one displaces the worst kept only with a strictly higher score;
// blocks of 8 scores none of which beats the worst kept are skipped with
// two vector compares.
void SelectTopK(const float* s, uint32_t n, uint32_t k, uint64_t* heap,
                uint32_t* sel) {
  for (uint32_t j = 0; j < k; ++j) heap[j] = CandidateKey(s[j], j);
  std::make_heap(heap, heap + k, std::greater<uint64_t>());
  float worst = CandidateScore(heap[0]);
  auto offer = [&](uint32_t j) {
    if (!(s[j] > worst)) return;
    ReplaceHeapTop(heap, k, CandidateKey(s[j], j));
    worst = CandidateScore(heap[0]);
  };
  uint32_t j = k;
  for (; j + 8 <= n; j += 8) {
    const V4 bar = V4{} + worst;
    const V4i hit = (Load4(s + j) > bar) | (Load4(s + j + 4) > bar);
    if ((hit[0] | hit[1] | hit[2] | hit[3]) == 0) continue;
    for (uint32_t jj = j; jj < j + 8; ++jj) offer(jj);
  }
  for (; j < n; ++j) offer(j);
  for (uint32_t i = 0; i < k; ++i) {
    sel[i] = 0xFFFFFFFFu - static_cast<uint32_t>(heap[i]);
  }
  std::sort(sel, sel + k);
}

// First window position visible from position p (p + 1 when W == 0).
inline uint64_t WindowStart(uint32_t w, uint64_t p) {
  return w == 0 ? p + 1 : (p + 1 > w ? p + 1 - w : 0);
}

// The upper-layer attention of one Forward (every token, every query
// head), one chunk of kChunkRows rows of one KV head at a time: the chunk's
// scores against every bank position up to its last query and against
// the window positions its queries see are computed together (ScoreKeys),
// then each row selects its top k (SelectTopK) and takes one softmax over
// the selected bank positions in increasing order followed by its window
// positions in increasing order. Owns its scratch; one per thread.
class ChunkAttention {
 public:
  // q and out are [m][q_heads][head_dim]; token i sits at first_pos + i.
  ChunkAttention(const ModelConfig& c, const XLayerBankView& b, const float* q,
                 size_t m, uint64_t first_pos, float* out)
      : c_(c), b_(b), q_(q), first_pos_(first_pos), out_(out),
        group_(c.num_q_heads / c.num_kv_heads),
        scale_(1.0f / std::sqrt(static_cast<float>(c.head_dim))),
        bank_stride_(first_pos + m),
        win_stride_(c.xlayer->window == 0 ? 0 : size_t{c.xlayer->window} + kChunkRows),
        qt_(size_t{c.head_dim} * kChunkRows),
        bank_(kChunkRows * bank_stride_),
        win_(kChunkRows * win_stride_) {
    const size_t k = std::min<size_t>(c.xlayer->top_k, bank_stride_);
    heap_.resize(k);
    sel_.resize(k);
  }

  // Rows r0 .. r1-1 of KV head g; row r is token r / group, query head
  // g * group + r % group. REQUIRES: r1 - r0 <= kChunkRows.
  void Run(uint32_t g, size_t r0, size_t r1);

 private:
  const float* QueryRow(size_t r, uint32_t g) const {
    const size_t i = r / group_, h = g * group_ + r % group_;
    return q_ + (i * c_.num_q_heads + h) * c_.head_dim;
  }
  void FinishRow(uint32_t g, size_t r, uint32_t row, uint64_t win_lo);

  const ModelConfig& c_;
  const XLayerBankView& b_;
  const float* q_;
  const uint64_t first_pos_;
  float* out_;
  const uint32_t group_;
  const float scale_;
  const size_t bank_stride_, win_stride_;
  std::vector<float> qt_;    // [head_dim][kChunkRows], zero-padded
  std::vector<float> bank_;  // [kChunkRows][bank_stride_]: bank scores
  std::vector<float> win_;   // [kChunkRows][win_stride_]: window scores
  std::vector<uint64_t> heap_;  // SelectTopK's
  std::vector<uint32_t> sel_;
};

void ChunkAttention::Run(uint32_t g, size_t r0, size_t r1) {
  const uint32_t hd = c_.head_dim, rows = static_cast<uint32_t>(r1 - r0);
  const size_t kvd = size_t{c_.num_kv_heads} * hd;
  std::fill(qt_.begin(), qt_.end(), 0.0f);
  for (uint32_t r = 0; r < rows; ++r) {
    const float* src = QueryRow(r0 + r, g);
    for (uint32_t d = 0; d < hd; ++d) qt_[d * kChunkRows + r] = src[d];
  }
  const uint64_t p_first = first_pos_ + r0 / group_;
  const uint64_t p_last = first_pos_ + (r1 - 1) / group_;
  const uint32_t bank_n = static_cast<uint32_t>(p_last + 1);
  const uint32_t prefix_n = std::min(bank_n, b_.prefix_tokens);
  if (prefix_n > 0) {
    ScoreKeys(qt_.data(), hd, b_.prefix_k + g * hd, kvd, prefix_n, scale_,
              rows, bank_.data(), bank_stride_);
  }
  if (bank_n > prefix_n) {
    ScoreKeys(qt_.data(), hd, b_.local_k + g * hd, kvd, bank_n - prefix_n,
              scale_, rows, bank_.data() + prefix_n, bank_stride_);
  }
  const uint32_t w = c_.xlayer->window;
  const uint64_t win_lo = WindowStart(w, p_first);
  if (w > 0) {
    ScoreKeys(qt_.data(), hd, b_.win_k + (win_lo - b_.win_base) * kvd + g * hd,
              kvd, static_cast<uint32_t>(p_last + 1 - win_lo), scale_, rows,
              win_.data(), win_stride_);
  }
  for (uint32_t r = 0; r < rows; ++r) FinishRow(g, r0 + r, r, win_lo);
}

void ChunkAttention::FinishRow(uint32_t g, size_t r, uint32_t row,
                               uint64_t win_lo) {
  const size_t hd = c_.head_dim, kvd = size_t{c_.num_kv_heads} * hd;
  const uint64_t p = first_pos_ + r / group_;
  const uint32_t n = static_cast<uint32_t>(p + 1), k = c_.xlayer->top_k;
  const float* sb = bank_.data() + row * bank_stride_;
  const bool all = k == 0 || k >= n;
  if (!all) SelectTopK(sb, n, k, heap_.data(), sel_.data());
  const uint32_t picked = all ? n : k;
  auto bank_pos = [&](uint32_t i) { return all ? i : sel_[i]; };
  // Window scores: position j in lo .. p at sw[j - win_lo].
  const uint64_t lo = WindowStart(c_.xlayer->window, p);
  const float* sw = win_.data() + row * win_stride_;
  float mx = -INFINITY;
  for (uint32_t i = 0; i < picked; ++i) mx = std::max(mx, sb[bank_pos(i)]);
  for (uint64_t j = lo; j <= p; ++j) mx = std::max(mx, sw[j - win_lo]);
  float* out = out_ + ((r / group_) * c_.num_q_heads + g * group_ + r % group_) * hd;
  std::fill(out, out + hd, 0.0f);
  float sum = 0.0f;
  auto add = [&](float score, const float* v) {
    const float e = std::exp(score - mx);
    sum += e;
    for (size_t d = 0; d < hd; ++d) out[d] += e * v[d];
  };
  for (uint32_t i = 0; i < picked; ++i) {
    const uint32_t j = bank_pos(i);
    const float* v = j < b_.prefix_tokens
                         ? b_.prefix_v + j * kvd
                         : b_.local_v + (j - b_.prefix_tokens) * kvd;
    add(sb[j], v + g * hd);
  }
  for (uint64_t j = lo; j <= p; ++j) {
    add(sw[j - win_lo], b_.win_v + (j - b_.win_base) * kvd + g * hd);
  }
  const float inv = 1.0f / sum;
  for (size_t d = 0; d < hd; ++d) out[d] *= inv;
}

// Copies the bank (page group `group`) of prefix positions 0 .. tokens-1
// into fp32 rows [token][kv_head][dim]: fp32 pages by run of head_dim
// floats, typed pages dequantised element by element.
void StageBank(const PageGeometry& g, uint32_t group,
               const std::vector<const void*>& pages, uint32_t tokens,
               std::vector<float>* k, std::vector<float>* v) {
  const size_t kvd = size_t{g.num_kv_heads} * g.head_dim;
  const bool fp32 = g.dtype == DType::kFloat32;
  k->resize(size_t{tokens} * kvd);
  v->resize(k->size());
  for (uint32_t t = 0; t < tokens; ++t) {
    const void* page = pages[t / g.page_size];
    const uint32_t slot = t % g.page_size;
    for (uint32_t kv = 0; kv < 2; ++kv) {
      float* dst = (kv == 0 ? k->data() : v->data()) + t * kvd;
      for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
        float* row = dst + h * g.head_dim;
        if (fp32) {
          std::memcpy(row,
                      static_cast<const float*>(page) + g.offset(group, kv, h, slot, 0),
                      g.head_dim * sizeof(float));
          continue;
        }
        const float scale = gpu::quant::PageScale(g, page, g.run(group, kv, h));
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          row[d] = gpu::quant::Dequant(g.dtype, page,
                                       g.offset(group, kv, h, slot, d), scale);
        }
      }
    }
  }
}

}  // namespace

// Work items are (KV head, chunk of rows), each run by ChunkAttention;
// below about 2^20 multiply-adds the call stays on the caller's thread.
void XLayerAttention(const ModelConfig& c, const XLayerBankView& b, const float* q,
                     size_t m, uint64_t first_pos, float* out) {
  const size_t rows = m * (c.num_q_heads / c.num_kv_heads);
  const size_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  const size_t items = size_t{c.num_kv_heads} * chunks;
  const double work = double(m) * c.num_q_heads * c.head_dim * double(first_pos + m);
  gpu::ParallelFor(items, work < double(1 << 20) ? items : 1,
                   [&](size_t begin, size_t end) {
    ChunkAttention attention(c, b, q, m, first_pos, out);
    for (size_t item = begin; item < end; ++item) {
      const size_t r0 = (item % chunks) * kChunkRows;
      attention.Run(static_cast<uint32_t>(item / chunks), r0,
                    std::min(rows, r0 + kChunkRows));
    }
  });
}

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
  XLayerBankView b;
  b.prefix_k = xl.bank_k.data();
  b.prefix_v = xl.bank_v.data();
  b.prefix_tokens = xl.bank_tokens;
  b.local_k = local->k(bank, 0);
  b.local_v = local->v(bank, 0);
  b.win_k = xl.win_k.empty() ? nullptr : xl.win_k.data() + win;
  b.win_v = xl.win_v.empty() ? nullptr : xl.win_v.data() + win;
  b.win_base = xl.window_base;
  XLayerAttention(c, b, s->q.data(), m, first_pos, s->attn.data());
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
