// CPU implementation of attention_prefix_suffix (see attention.h), and the
// CUDA entry point's fallback for builds without CUDA.
//
// Work decomposition: one work item is (kv head g, tile of kQueryTile
// queries); its rows are every (query, q head) pair of the tile that reads
// kv head g, so each key block loaded (and transposed) once serves up to
// kQueryTile * group rows. Keys stream in blocks of at most kKeyBlock keys
// that never cross a page; each row keeps a running max m, running sum l and
// an fp32 accumulator, rescaled when m grows (online softmax).
#include "gpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/kv_ops.h"
#include "gpu/kv_ops_check.h"
#include "gpu/kv_ops_quant.h"
#include "gpu/kv_parallel.h"
#include "base/status_macros.h"

#if defined(RADIXKV_KERNELS_CUDA)
#include "gpu/kv_cuda_launch.h"
#endif

namespace radixkv::gpu {
namespace {

constexpr uint32_t kKeyBlock = 32;
constexpr uint32_t kQueryTile = 8;
// Below this many multiply-adds a call runs on the caller's thread.
constexpr double kMinParallelWork = 1 << 20;

// A block of up to kKeyBlock keys of one kv head (they may come from
// several pages): key jj's K row at k[jj], V row at v[jj].
struct KeyBlock {
  const float* k[kKeyBlock];
  const float* v[kKeyBlock];
  uint32_t n = 0;
  // For local blocks: local index of the first key; prefix blocks: -1
  // (always visible).
  int64_t local_start = -1;
};

typedef float V4 __attribute__((vector_size(16)));
typedef int32_t V4i __attribute__((vector_size(16)));

// exp(x) for 4 lanes: 2^n * P(r) with x = n ln2 + r, |r| <= ln2/2, and a
// degree-6 polynomial (relative error ~2 ulp). Inputs below -87 flush to 0;
// scores are <= 0 here (x = s - running max).
inline V4 Exp4(V4 x) {
  const V4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
  const V4 lo = zero - 87.0f;
  const V4i underflow = x < lo;  // lanes of all ones where x < -87
  x = underflow ? lo : x;
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: rounds to an integer
  const V4 t = x * 1.44269504088896341f + kMagic;
  const V4 n = t - kMagic;
  const V4 r = x - n * 0.693359375f - n * -2.12194440e-4f;
  V4 p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n from the integer held in t's low mantissa bits.
  const V4i e = ((V4i)t - (V4i)(zero + kMagic) + 127) << 23;
  const V4 out = p * (V4)e;
  return (V4)((V4i)out & ~underflow);
}

class TileWorker {
 public:
  TileWorker(const AttentionShape& shape, float scale, const AttentionIo& io)
      : shape_(shape),
        scale_(scale),
        io_(io),
        group_(shape.num_q_heads / shape.num_kv_heads),
        kt_(size_t{shape.head_dim} * kKeyBlock),
        scores_(kKeyBlock),
        m_(kQueryTile * group_),
        l_(kQueryTile * group_),
        acc_(size_t{kQueryTile} * group_ * shape.head_dim),
        qs_(size_t{kQueryTile} * group_ * shape.head_dim) {}

  // Starts rows for kv head g and queries q0 .. q0+nq-1.
  void Begin(uint32_t g, uint32_t q0, uint32_t nq) {
    g_ = g;
    q0_ = q0;
    nq_ = nq;
    const uint32_t D = shape_.head_dim;
    std::fill(m_.begin(), m_.end(), -std::numeric_limits<float>::infinity());
    std::fill(l_.begin(), l_.end(), 0.0f);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    // Pre-scaled queries, row r = qi * group + hh.
    for (uint32_t qi = 0; qi < nq; ++qi) {
      for (uint32_t hh = 0; hh < group_; ++hh) {
        const float* src =
            io_.q + (size_t{q0 + qi} * shape_.num_q_heads + g * group_ + hh) * D;
        float* dst = qs_.data() + (size_t{qi} * group_ + hh) * D;
        for (uint32_t d = 0; d < D; ++d) dst[d] = src[d] * scale_;
      }
    }
  }

  void Consume(const KeyBlock& b) {
    const uint32_t D = shape_.head_dim;
    // Kt[d][jj], zero-padded to kKeyBlock so the score loop has a fixed trip
    // count and vectorises.
    float* kt = kt_.data();
    for (uint32_t jj = 0; jj < b.n; ++jj) {
      const float* krow = b.k[jj];
      for (uint32_t d = 0; d < D; ++d) kt[size_t{d} * kKeyBlock + jj] = krow[d];
    }
    for (uint32_t jj = b.n; jj < kKeyBlock; ++jj) {
      for (uint32_t d = 0; d < D; ++d) kt[size_t{d} * kKeyBlock + jj] = 0.0f;
    }
    const int64_t first_query_pos =
        int64_t{io_.local_tokens} - io_.num_queries + q0_;
    for (uint32_t qi = 0; qi < nq_; ++qi) {
      uint32_t visible = b.n;
      if (b.local_start >= 0) {
        const int64_t last_key = first_query_pos + qi;  // local index it sees
        const int64_t vis = last_key - b.local_start + 1;
        if (vis <= 0) continue;
        visible = static_cast<uint32_t>(std::min<int64_t>(vis, b.n));
      }
      for (uint32_t hh = 0; hh < group_; ++hh) {
        Row(qi * group_ + hh, b, visible);
      }
    }
  }

  // Writes out = acc / l for every row of the tile.
  void Finish() {
    const uint32_t D = shape_.head_dim;
    for (uint32_t qi = 0; qi < nq_; ++qi) {
      for (uint32_t hh = 0; hh < group_; ++hh) {
        const uint32_t r = qi * group_ + hh;
        const float inv = 1.0f / l_[r];
        const float* acc = acc_.data() + size_t{r} * D;
        float* out = io_.out +
                     (size_t{q0_ + qi} * shape_.num_q_heads + g_ * group_ + hh) * D;
        for (uint32_t d = 0; d < D; ++d) out[d] = acc[d] * inv;
      }
    }
  }

 private:
  void Row(uint32_t r, const KeyBlock& b, uint32_t visible) {
    const uint32_t D = shape_.head_dim;
    const float* q = qs_.data() + size_t{r} * D;
    float* s = scores_.data();
    for (uint32_t jj = 0; jj < kKeyBlock; ++jj) s[jj] = 0.0f;
    const float* kt = kt_.data();
    for (uint32_t d = 0; d < D; ++d) {
      const float qd = q[d];
      const float* ktd = kt + size_t{d} * kKeyBlock;
      for (uint32_t jj = 0; jj < kKeyBlock; ++jj) s[jj] += qd * ktd[jj];
    }
    float mb = s[0];
    for (uint32_t jj = 1; jj < visible; ++jj) mb = std::max(mb, s[jj]);
    float* acc = acc_.data() + size_t{r} * D;
    if (mb > m_[r]) {
      const float alpha = std::exp(m_[r] - mb);  // exp(-inf) == 0 on start
      l_[r] *= alpha;
      for (uint32_t d = 0; d < D; ++d) acc[d] *= alpha;
      m_[r] = mb;
    }
    const float m = m_[r];
    // p_j = exp(s_j - m) for the visible keys, 4 lanes at a time; lanes
    // past `visible` are zeroed.
    for (uint32_t jj = 0; jj < kKeyBlock; jj += 4) {
      V4 x;
      std::memcpy(&x, s + jj, sizeof(x));
      x = Exp4(x - m);
      std::memcpy(s + jj, &x, sizeof(x));
    }
    for (uint32_t jj = visible; jj < kKeyBlock; ++jj) s[jj] = 0.0f;
    float l = l_[r];
    for (uint32_t jj = 0; jj < visible; ++jj) {
      const float p = s[jj];
      l += p;
      const float* vrow = b.v[jj];
      for (uint32_t d = 0; d < D; ++d) acc[d] += p * vrow[d];
    }
    l_[r] = l;
  }

  const AttentionShape& shape_;
  const float scale_;
  const AttentionIo& io_;
  const uint32_t group_;
  uint32_t g_ = 0, q0_ = 0, nq_ = 0;
  std::vector<float> kt_;      // [head_dim][kKeyBlock]
  std::vector<float> scores_;  // [kKeyBlock]
  std::vector<float> m_, l_;   // per row
  std::vector<float> acc_;     // [rows][head_dim]
  std::vector<float> qs_;      // [rows][head_dim], pre-scaled
};

// Decodes layer `layer` of the prefix pages of a typed (non-fp32) geometry
// into fp32 pages of one layer (geometry *out_geom) held in *staging, one per
// prefix page, and points *out_pages at them. Values are exactly
// quant::Dequant's (8-bit codes through a 256-entry table of the same
// decode), so attention over the staging equals attention over ReadKv's
// fp32 output.
void DequantPrefix(const PrefixPages& prefix,
                   absl::Span<const void* const> pages,
                   std::vector<float>* staging, PageGeometry* out_geom,
                   std::vector<const void*>* out_pages) {
  const PageGeometry& g = prefix.geom;
  const PageGeometry g1 = MakePageGeometry(1, g.num_kv_heads, g.page_size,
                                           g.head_dim, DType::kFloat32);
  const uint64_t n_pages = PagesForTokens(g, prefix.tokens);
  const size_t page_floats = g1.page_elems();
  staging->resize(n_pages * page_floats);
  float lut[256];
  const bool byte_codes = g.elem_bytes == 1;
  if (byte_codes) {
    for (uint32_t c = 0; c < 256; ++c) {
      lut[c] = quant::DecodeByteCode(g.dtype, static_cast<uint8_t>(c));
    }
  }
  const uint64_t run_elems = g.head_elems();
  ParallelFor(n_pages, std::max<size_t>(1, (size_t{1} << 18) / page_floats),
              [&](size_t begin, size_t end) {
    for (size_t p = begin; p < end; ++p) {
      const uint8_t* page = static_cast<const uint8_t*>(pages[p]);
      const uint32_t slots = static_cast<uint32_t>(std::min<uint64_t>(
          g.page_size, prefix.tokens - p * g.page_size));
      float* out = staging->data() + p * page_floats;
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
          const uint64_t run = g.run(prefix.layer, kv, h);
          const float scale = quant::PageScale(g, page, run);
          const uint64_t n = uint64_t{slots} * g.head_dim;
          const uint64_t src0 = run * run_elems;
          float* dst = out + g1.offset(0, kv, h, 0, 0);
          if (byte_codes) {
            for (uint64_t i = 0; i < n; ++i) {
              const float v = lut[page[src0 + i]];
              dst[i] = g.scaled() ? v * scale : v;
            }
          } else {
            for (uint64_t i = 0; i < n; ++i) {
              dst[i] = quant::Dequant(g.dtype, page, src0 + i, scale);
            }
          }
        }
      }
    }
  });
  *out_geom = g1;
  out_pages->resize(n_pages);
  for (uint64_t p = 0; p < n_pages; ++p) {
    (*out_pages)[p] = staging->data() + p * page_floats;
  }
}

}  // namespace

float AttentionScale(const AttentionShape& shape) {
  return shape.scale != 0.0f
             ? shape.scale
             : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
}

absl::Status AttentionPrefixSuffix(const AttentionShape& shape,
                                   const PrefixPages& prefix,
                                   absl::Span<const void* const> pages,
                                   const AttentionIo& io) {
  RETURN_IF_ERROR(internal::CheckAttention(shape, prefix, pages.size(), io));
  for (size_t i = 0; i < PagesForTokens(prefix.geom, prefix.tokens); ++i) {
    if (pages[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "] is a null address"));
    }
  }
  if (prefix.tokens > 0 && prefix.geom.dtype != DType::kUnspecified &&
      prefix.geom.dtype != DType::kFloat32) {
    std::vector<float> staging;
    std::vector<const void*> staged;
    PrefixPages fp32 = prefix;
    DequantPrefix(prefix, pages, &staging, &fp32.geom, &staged);
    fp32.layer = 0;
    return AttentionPrefixSuffix(shape, fp32, staged, io);
  }
  const uint32_t Hkv = shape.num_kv_heads;
  const uint32_t D = shape.head_dim;
  const uint32_t S = io.num_queries;
  const uint32_t T = io.local_tokens;
  const uint32_t tiles = (S + kQueryTile - 1) / kQueryTile;
  const size_t items = size_t{Hkv} * tiles;
  const double work = AttentionFlops(shape, prefix.tokens, T, S) / 4;
  const size_t min_per_thread = work < kMinParallelWork ? items : 1;
  const float scale = AttentionScale(shape);

  ParallelFor(items, min_per_thread, [&](size_t begin, size_t end) {
    TileWorker w(shape, scale, io);
    for (size_t item = begin; item < end; ++item) {
      const uint32_t g = static_cast<uint32_t>(item / tiles);
      const uint32_t q0 = static_cast<uint32_t>(item % tiles) * kQueryTile;
      const uint32_t nq = std::min(kQueryTile, S - q0);
      w.Begin(g, q0, nq);
      // Prefix keys, kKeyBlock at a time across page boundaries.
      KeyBlock kb;
      for (uint32_t t0 = 0; t0 < prefix.tokens; t0 += kKeyBlock) {
        kb.n = std::min(kKeyBlock, prefix.tokens - t0);
        kb.local_start = -1;
        for (uint32_t jj = 0; jj < kb.n; ++jj) {
          const uint32_t t = t0 + jj;
          const float* page =
              static_cast<const float*>(pages[t / prefix.geom.page_size]);
          const uint32_t slot = t % prefix.geom.page_size;
          kb.k[jj] = page + prefix.geom.offset(prefix.layer, 0, g, slot, 0);
          kb.v[jj] = page + prefix.geom.offset(prefix.layer, 1, g, slot, 0);
        }
        w.Consume(kb);
      }
      // Local keys up to the last query of the tile.
      const uint32_t local_end = T - S + q0 + nq;
      for (uint32_t j = 0; j < local_end; j += kKeyBlock) {
        kb.n = std::min(kKeyBlock, local_end - j);
        kb.local_start = j;
        for (uint32_t jj = 0; jj < kb.n; ++jj) {
          kb.k[jj] = io.k + (size_t{j + jj} * Hkv + g) * D;
          kb.v[jj] = io.v + (size_t{j + jj} * Hkv + g) * D;
        }
        w.Consume(kb);
      }
      w.Finish();
    }
  });
  return absl::OkStatus();
}

double AttentionFlops(const AttentionShape& shape, uint64_t prefix_tokens,
                      uint64_t local_tokens, uint64_t num_queries) {
  if (num_queries == 0 || local_tokens < num_queries) return 0;
  // Query i sees prefix_tokens + (local_tokens - S) + i + 1 keys.
  const double S = static_cast<double>(num_queries);
  const double keys =
      S * static_cast<double>(prefix_tokens + local_tokens - num_queries) +
      S * (S + 1) / 2;
  return 4.0 * shape.num_q_heads * shape.head_dim * keys;
}

#if defined(RADIXKV_KERNELS_CUDA)
namespace internal {
absl::Status CudaStatus(int err, const char* what);  // kv_ops.cc
}  // namespace internal

absl::Status AttentionPrefixSuffixCuda(const AttentionShape& shape,
                                       const PrefixPages& prefix,
                                       const void* pool_base,
                                       const uint64_t* page_ids,
                                       const AttentionIo& io, void* stream) {
  const uint64_t n_pages = PagesForTokens(prefix.geom, prefix.tokens);
  RETURN_IF_ERROR(internal::CheckAttention(shape, prefix, n_pages, io));
  if (prefix.tokens > 0 && (pool_base == nullptr || page_ids == nullptr)) {
    return absl::InvalidArgumentError(
        "pool_base and page_ids must be non-null when prefix.tokens > 0");
  }
  if (shape.head_dim > cuda_kernels::kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape.head_dim (", shape.head_dim,
                     ") exceeds the CUDA kernel's limit of ",
                     cuda_kernels::kMaxAttentionHeadDim));
  }
  cuda_kernels::AttentionLaunch a{};
  a.num_q_heads = shape.num_q_heads;
  a.num_kv_heads = shape.num_kv_heads;
  a.head_dim = shape.head_dim;
  a.scale = AttentionScale(shape);
  a.geom = prefix.geom;
  a.layer = prefix.layer;
  a.prefix_tokens = prefix.tokens;
  a.pool_base = pool_base;
  a.page_ids = page_ids;
  a.q = io.q;
  a.k = io.k;
  a.v = io.v;
  a.out = io.out;
  a.num_queries = io.num_queries;
  a.local_tokens = io.local_tokens;
  return internal::CudaStatus(cuda_kernels::LaunchAttention(a, stream),
                              "AttentionPrefixSuffixCuda");
}
#endif  // RADIXKV_KERNELS_CUDA

#if !defined(RADIXKV_KERNELS_CUDA)
absl::Status AttentionPrefixSuffixCuda(const AttentionShape&, const PrefixPages&,
                                       const void*, const uint64_t*,
                                       const AttentionIo&, void*) {
  return absl::FailedPreconditionError(
      "AttentionPrefixSuffixCuda: radixkv was built without CUDA");
}
#endif  // !RADIXKV_KERNELS_CUDA

}  // namespace radixkv::gpu
