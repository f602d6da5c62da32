// File: gpu/page_layout.h
//
// PageGeometry: where each K/V element of a block, and each per-head scale
// of a scaled dtype, lives inside one page. Header-only and usable from host
// and device code.
//
// Page layout (docs/CONTRACTS.md §2, normative), one contiguous page,
// page-first:
//
//   page -> layer -> {K, V} -> kv_head -> slot (token in block) -> dim
//
// so a page holds num_layers * 2 * num_kv_heads * page_size * head_dim
// elements of elem_bytes each, and one page is one unit for sharing,
// eviction and copies. Offsets are in elements unless named *_bytes.
//
// Scaled dtypes (fp8 E4M3, fp8 E5M2, int8) append a scale area: one fp32
// scale per (layer, K|V, kv_head) run, in the same order, starting at the
// element area's size rounded up to 16 bytes. A run's element e encodes
// x / scale; x = decode(e) * scale. fp32, fp16 and bf16 pages have no scale
// area. See gpu/kv_ops_quant.h for the encodings.
//
// Cross-layer pages (docs/CONTRACTS.md §2.2): a namespace whose layers
// [s, num_layers) share one K/V bank stores s + 1 KV groups per page, the
// per-layer K/V of layers 0 .. s-1 followed by the bank once. Its geometry
// is an ordinary PageGeometry with num_layers = s + 1 ("layer" indexes the
// group), so every kernel here reads and writes such pages unchanged;
// CrossLayerGroups() gives the count.
#ifndef RADIXKV_GPU_PAGE_LAYOUT_H_
#define RADIXKV_GPU_PAGE_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"  // DType, DTypeBytes, DTypeScaled, RADIXKV_HD

namespace radixkv {

// Bytes the scale area is aligned to inside a page.
inline constexpr uint32_t kScaleAreaAlign = 16;

struct PageGeometry {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t page_size = 0;  // tokens (slots) per page
  uint32_t head_dim = 0;
  uint32_t elem_bytes = 0;
  // How the elements are encoded. DType::kUnspecified: opaque, elements are
  // elem_bytes-sized values that the kernels move without looking at them
  // (the source of write_kv has the page's encoding). Any other value: the
  // page holds that encoding and write_kv / read_kv / attention convert
  // from / to fp32.
  // REQUIRES: kUnspecified, or elem_bytes == DTypeBytes(dtype).
  DType dtype = DType::kUnspecified;

  // Elements of one (layer, K|V, head) run: page_size * head_dim.
  RADIXKV_HD uint64_t head_elems() const {
    return uint64_t{page_size} * head_dim;
  }
  // Elements of one layer's K (or V) for all heads.
  RADIXKV_HD uint64_t kv_elems() const { return head_elems() * num_kv_heads; }
  RADIXKV_HD uint64_t layer_elems() const { return 2 * kv_elems(); }
  RADIXKV_HD uint64_t page_elems() const { return layer_elems() * num_layers; }
  // Bytes of the element area (the whole page for unscaled dtypes).
  RADIXKV_HD uint64_t elems_bytes() const { return page_elems() * elem_bytes; }
  RADIXKV_HD bool scaled() const { return DTypeScaled(dtype); }
  // Number of fp32 scales: one per (layer, K|V, head) run; 0 if unscaled.
  RADIXKV_HD uint64_t num_scales() const {
    return scaled() ? uint64_t{num_layers} * 2 * num_kv_heads : 0;
  }
  // Byte offset of the scale area: elems_bytes() rounded up to 16.
  RADIXKV_HD uint64_t scale_offset_bytes() const {
    return (elems_bytes() + kScaleAreaAlign - 1) / kScaleAreaAlign *
           kScaleAreaAlign;
  }
  RADIXKV_HD uint64_t page_bytes() const {
    return scaled() ? scale_offset_bytes() + 4 * num_scales() : elems_bytes();
  }

  // Offset of element (layer, kv: 0 = K / 1 = V, head, slot, dim) in a page.
  RADIXKV_HD uint64_t offset(uint32_t layer, uint32_t kv, uint32_t head,
                             uint32_t slot, uint32_t dim) const {
    return run(layer, kv, head) * head_elems() + uint64_t{slot} * head_dim +
           dim;
  }
  // Index of the (layer, kv, head) run: its scale is scale number run(...),
  // at byte scale_offset_bytes() + 4 * run(...).
  RADIXKV_HD uint64_t run(uint32_t layer, uint32_t kv, uint32_t head) const {
    return (uint64_t{layer} * 2 + kv) * num_kv_heads + head;
  }
  RADIXKV_HD bool valid() const {
    return num_layers > 0 && num_kv_heads > 0 && page_size > 0 &&
           head_dim > 0 && elem_bytes > 0 &&
           (dtype == DType::kUnspecified || elem_bytes == DTypeBytes(dtype));
  }
};

// KV groups of a page whose layers [shared_from_layer, num_layers) share one
// bank: shared_from_layer per-layer groups plus the bank. 0 unless
// 1 <= shared_from_layer < num_layers.
RADIXKV_HD constexpr uint32_t CrossLayerGroups(uint32_t num_layers,
                                               uint32_t shared_from_layer) {
  return shared_from_layer == 0 || shared_from_layer >= num_layers
             ? 0
             : shared_from_layer + 1;
}

// The geometry of a page of `dtype` (elem_bytes from the dtype).
RADIXKV_HD PageGeometry MakePageGeometry(uint32_t num_layers,
                                         uint32_t num_kv_heads,
                                         uint32_t page_size, uint32_t head_dim,
                                         DType dtype) {
  PageGeometry g;
  g.num_layers = num_layers;
  g.num_kv_heads = num_kv_heads;
  g.page_size = page_size;
  g.head_dim = head_dim;
  g.elem_bytes = DTypeBytes(dtype);
  g.dtype = dtype;
  return g;
}

}  // namespace radixkv

#endif  // RADIXKV_GPU_PAGE_LAYOUT_H_
