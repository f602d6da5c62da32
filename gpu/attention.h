// File: gpu/attention.h
//
// attention_prefix_suffix: causal attention of new (suffix) queries over a
// cached prefix held in pool pages followed by the request's own local K/V.
// CPU implementation (the oracle; multi-threaded over kv heads and query
// tiles, inner loops over contiguous dims) and a CUDA implementation.
//
// Keys seen by the queries, in order:
//
//   [ prefix: prefix_tokens tokens in pages (block order)                  ]
//   [ local:  local_tokens tokens, contiguous [token][kv_head][dim]        ]
//
// The S = num_queries queries are the LAST S local tokens (their K/V must be
// written into `local` before the call: "write the new K/V first"). Query i
// sits at local position T - S + i (T = local_tokens) and sees every prefix
// key and local keys 0 .. T - S + i: a bottom-right-aligned causal mask.
// With T == S this is the plain prefill of a suffix after a cached prefix; a
// decode step passes S == 1 and T == tokens generated so far plus the
// uncached prompt tail.
//
// GQA: query head h reads kv head h / (num_q_heads / num_kv_heads).
// Numerics: fp32 values (typed prefix pages dequantised first) and fp32
// accumulation with an online softmax
// (running max and sum, streamed over key blocks); no score matrix is
// materialised. out = softmax(scale * q k^T) v.
//
// Prefix pages use the page layout of gpu/page_layout.h; one layer is read.
// Their dtype (PrefixPages::geom.dtype) is fp32 (kFloat32, or kUnspecified,
// opaque, with elem_bytes 4) or any typed encoding: fp16, bf16, fp8 E4M3 /
// E5M2 and int8 keys and values are dequantised on read (decode(code) * the
// run's scale, gpu/kv_ops_quant.h), so the result equals attention over the
// fp32 pages that ReadKv would produce. Queries, local K/V and output stay
// fp32.
// Pointers are borrowed for the call.
//
// Thread safety: reentrant; concurrent calls may read the same pages. The
// CUDA version is asynchronous on `stream`.
#ifndef RADIXKV_GPU_ATTENTION_H_
#define RADIXKV_GPU_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gpu/page_layout.h"

namespace radixkv::gpu {

struct AttentionShape {
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;  // REQUIRES: divides num_q_heads
  uint32_t head_dim = 0;
  float scale = 0.0f;         // 0: 1 / sqrt(head_dim)
};

// The cached prefix of one layer.
struct PrefixPages {
  PageGeometry geom;      // REQUIRES: fp32 or typed; heads/dim == shape's
  uint32_t layer = 0;     // REQUIRES: < geom.num_layers
  // Keys 0 .. tokens-1 live in pages[t / page_size] at slot t % page_size.
  // REQUIRES: tokens <= pages.size() * page_size (a partial last page is
  // allowed: a fully cached prompt recomputes its last token over the
  // pages holding all but that token).
  uint32_t tokens = 0;
};

// Queries, local K/V and output, all fp32, row-major.
struct AttentionIo {
  const float* q = nullptr;  // [num_queries][num_q_heads][head_dim]
  uint32_t num_queries = 0;  // S
  const float* k = nullptr;  // [local_tokens][num_kv_heads][head_dim]
  const float* v = nullptr;
  uint32_t local_tokens = 0;  // T; REQUIRES: T >= S
  float* out = nullptr;       // [num_queries][num_q_heads][head_dim]
};

// The softmax scale used: shape.scale, or 1 / sqrt(head_dim) when it is 0.
float AttentionScale(const AttentionShape& shape);

// CPU. `pages` are host addresses, one per prefix page in block order
// (pages.size() >= PagesForTokens(prefix.tokens); extra pages are ignored).
// INVALID_ARGUMENT naming the field for a bad shape or buffer; out untouched.
absl::Status AttentionPrefixSuffix(const AttentionShape& shape,
                                   const PrefixPages& prefix,
                                   absl::Span<const void* const> pages,
                                   const AttentionIo& io);

// CUDA. Device pointers: the pool's contiguous base, `page_ids` (a device
// array of prefix.tokens / page_size rounded up page ids), q/k/v/out.
// FAILED_PRECONDITION without CUDA; INTERNAL on a launch failure.
absl::Status AttentionPrefixSuffixCuda(const AttentionShape& shape,
                                       const PrefixPages& prefix,
                                       const void* pool_base,
                                       const uint64_t* page_ids,
                                       const AttentionIo& io, void* stream);

// Floating-point operations of one call (2 per multiply-add of QK^T and of
// PV, over the unmasked keys), for ideal-speedup accounting.
double AttentionFlops(const AttentionShape& shape, uint64_t prefix_tokens,
                      uint64_t local_tokens, uint64_t num_queries);

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_ATTENTION_H_
