// File: gpu/page_layout.h
//
// PageGeometry: where each K/V element of a block lives inside one page.
// Header-only and usable from host and device code.
//
// Page layout (docs/CONTRACTS.md §2, normative), one contiguous page,
// page-first:
//
//   page -> layer -> {K, V} -> kv_head -> slot (token in block) -> dim
//
// so a page holds num_layers * 2 * num_kv_heads * page_size * head_dim
// elements of elem_bytes each, and one page is one unit for sharing,
// eviction and copies. Offsets are in elements unless named *_bytes.
#ifndef RADIXKV_GPU_PAGE_LAYOUT_H_
#define RADIXKV_GPU_PAGE_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define RADIXKV_HD __host__ __device__ __forceinline__
#else
#define RADIXKV_HD inline
#endif

namespace radixkv {

struct PageGeometry {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t page_size = 0;  // tokens (slots) per page
  uint32_t head_dim = 0;
  uint32_t elem_bytes = 0;

  // Elements of one (layer, K|V, head) run: page_size * head_dim.
  RADIXKV_HD uint64_t head_elems() const {
    return uint64_t{page_size} * head_dim;
  }
  // Elements of one layer's K (or V) for all heads.
  RADIXKV_HD uint64_t kv_elems() const { return head_elems() * num_kv_heads; }
  RADIXKV_HD uint64_t layer_elems() const { return 2 * kv_elems(); }
  RADIXKV_HD uint64_t page_elems() const { return layer_elems() * num_layers; }
  RADIXKV_HD uint64_t page_bytes() const { return page_elems() * elem_bytes; }

  // Offset of element (layer, kv: 0 = K / 1 = V, head, slot, dim) in a page.
  RADIXKV_HD uint64_t offset(uint32_t layer, uint32_t kv, uint32_t head,
                             uint32_t slot, uint32_t dim) const {
    return ((uint64_t{layer} * 2 + kv) * num_kv_heads + head) * head_elems() +
           uint64_t{slot} * head_dim + dim;
  }
  RADIXKV_HD bool valid() const {
    return num_layers > 0 && num_kv_heads > 0 && page_size > 0 &&
           head_dim > 0 && elem_bytes > 0;
  }
};

}  // namespace radixkv

#endif  // RADIXKV_GPU_PAGE_LAYOUT_H_
