// File: gpu/kv_ops_check.h
//
// Argument checks shared by the CPU (kv_ops.cc, attention.cc) and CUDA
// (kv_ops.cu, attention.cu) kernels, so both reject exactly the same inputs
// with the same messages. Internal to gpu/; not part of the public API.
//
// Thread safety: pure functions.
#ifndef RADIXKV_GPU_KV_OPS_CHECK_H_
#define RADIXKV_GPU_KV_OPS_CHECK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gpu/attention.h"
#include "gpu/kv_ops.h"
#include "gpu/page_layout.h"

namespace radixkv::gpu::internal {

inline absl::Status CheckGeometry(const PageGeometry& geom) {
  if (geom.dtype != DType::kUnspecified &&
      (DTypeBytes(geom.dtype) == 0 ||
       geom.elem_bytes != DTypeBytes(geom.dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "geometry: dtype ", static_cast<uint32_t>(geom.dtype),
        " needs elem_bytes ", DTypeBytes(geom.dtype), " (got ", geom.elem_bytes,
        "; dtypes are 1..6 as radixkv.v1.DType)"));
  }
  if (!geom.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "geometry: every field must be > 0 (num_layers=", geom.num_layers,
        ", num_kv_heads=", geom.num_kv_heads, ", page_size=", geom.page_size,
        ", head_dim=", geom.head_dim, ", elem_bytes=", geom.elem_bytes, ")"));
  }
  return absl::OkStatus();
}

// Checks a write_kv / read_kv source or destination against `n_pages` pages.
inline absl::Status CheckKvTensors(const PageGeometry& geom, const void* k,
                                   const void* v, uint32_t n_tokens,
                                   uint32_t layer_stride_tokens,
                                   uint64_t n_pages, const char* what) {
  if (absl::Status s = CheckGeometry(geom); !s.ok()) return s;
  if (n_tokens > 0 && (k == nullptr || v == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".k and ", what, ".v must be non-null for ",
                     n_tokens, " tokens"));
  }
  if (layer_stride_tokens != 0 && layer_stride_tokens < n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".layer_stride_tokens (", layer_stride_tokens,
        ") must be 0 or >= n_tokens (", n_tokens, ")"));
  }
  const uint64_t need = PagesForTokens(geom, n_tokens);
  if (n_pages != need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pages: ", n_pages, " given, ", need, " needed for ", n_tokens,
        " tokens at page_size ", geom.page_size));
  }
  return absl::OkStatus();
}

inline absl::Status CheckPageIds(absl::Span<const uint64_t> ids,
                                 uint64_t capacity_pages, const char* field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= capacity_pages) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", ids[i],
                       " is out of range: the pool has ", capacity_pages,
                       " pages"));
    }
  }
  return absl::OkStatus();
}

inline absl::Status CheckCopyIds(uint64_t page_bytes, const void* src_base,
                                 uint64_t src_capacity_pages,
                                 absl::Span<const uint64_t> src_ids,
                                 const void* dst_base,
                                 uint64_t dst_capacity_pages,
                                 absl::Span<const uint64_t> dst_ids) {
  if (page_bytes == 0) {
    return absl::InvalidArgumentError("page_bytes must be > 0");
  }
  if (src_ids.size() != dst_ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("src_ids has ", src_ids.size(), " entries but dst_ids has ",
                     dst_ids.size(), "; they must be equal"));
  }
  if (!src_ids.empty() && (src_base == nullptr || dst_base == nullptr)) {
    return absl::InvalidArgumentError("src_base and dst_base must be non-null");
  }
  if (absl::Status s = CheckPageIds(src_ids, src_capacity_pages, "src_ids");
      !s.ok()) {
    return s;
  }
  return CheckPageIds(dst_ids, dst_capacity_pages, "dst_ids");
}


// Checks an attention call; `n_pages` is the number of prefix page entries
// given (addresses on the CPU, ids on CUDA).
inline absl::Status CheckAttention(const AttentionShape& shape,
                                   const PrefixPages& prefix, uint64_t n_pages,
                                   const AttentionIo& io) {
  if (shape.num_q_heads == 0 || shape.num_kv_heads == 0 ||
      shape.head_dim == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape: num_q_heads (", shape.num_q_heads, "), num_kv_heads (",
        shape.num_kv_heads, ") and head_dim (", shape.head_dim,
        ") must be > 0"));
  }
  if (shape.num_q_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape.num_q_heads (", shape.num_q_heads,
        ") must be a multiple of shape.num_kv_heads (", shape.num_kv_heads,
        ")"));
  }
  if (io.num_queries == 0) {
    return absl::InvalidArgumentError("io.num_queries must be > 0");
  }
  if (io.local_tokens < io.num_queries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "io.local_tokens (", io.local_tokens,
        ") must be >= io.num_queries (", io.num_queries,
        "): the queries are the last local tokens"));
  }
  if (io.q == nullptr || io.k == nullptr || io.v == nullptr ||
      io.out == nullptr) {
    return absl::InvalidArgumentError("io.q, io.k, io.v and io.out must be non-null");
  }
  if (prefix.tokens == 0) return absl::OkStatus();
  if (absl::Status s = CheckGeometry(prefix.geom); !s.ok()) return s;
  if (prefix.geom.dtype == DType::kUnspecified && prefix.geom.elem_bytes != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.geom.elem_bytes is ", prefix.geom.elem_bytes,
        "; attention reads opaque pages as fp32 (4): set prefix.geom.dtype "
        "for fp16, bf16, fp8 or int8 pages"));
  }
  if (prefix.geom.num_kv_heads != shape.num_kv_heads ||
      prefix.geom.head_dim != shape.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.geom (num_kv_heads=", prefix.geom.num_kv_heads,
        ", head_dim=", prefix.geom.head_dim, ") does not match shape (",
        shape.num_kv_heads, ", ", shape.head_dim, ")"));
  }
  if (prefix.layer >= prefix.geom.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix.layer (", prefix.layer, ") must be < num_layers (",
                     prefix.geom.num_layers, ")"));
  }
  const uint64_t need = PagesForTokens(prefix.geom, prefix.tokens);
  if (n_pages < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pages: ", n_pages, " given, ", need, " needed for prefix.tokens ",
        prefix.tokens, " at page_size ", prefix.geom.page_size));
  }
  return absl::OkStatus();
}

}  // namespace radixkv::gpu::internal

#endif  // RADIXKV_GPU_KV_OPS_CHECK_H_
