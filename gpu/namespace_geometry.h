// File: gpu/namespace_geometry.h
//
// The pages of a namespace (radix/block_key.h's NamespaceSpec): the page
// geometry of its layout (gpu/page_layout.h), the bytes of one page and of
// its scale area, and whether its cross-layer layout can be served. The one
// place where a namespace's fields become page sizes (docs/CONTRACTS.md §2),
// shared by radixkvd (pool sizing, request validation), radixkvctl and the
// workers, so every one of them sizes a namespace's pages identically.
//
// Thread safety: pure functions.
#ifndef RADIXKV_GPU_NAMESPACE_GEOMETRY_H_
#define RADIXKV_GPU_NAMESPACE_GEOMETRY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "gpu/page_layout.h"
#include "radix/block_key.h"

namespace radixkv {

// What is wrong with a cross-layer layout: `field` is "shared_from_layer" or
// "local_window" (callers prefix it: "namespace.cross_layer." on the wire,
// "--layout" on a command line), `message` states the value and the limit.
struct CrossLayerProblem {
  std::string field;
  std::string message;
};

// nullopt when `layout` can be served for a model of `num_layers` layers:
// 1 <= shared_from_layer <= num_layers - 1 (at least one layer keeps its own
// K/V, from whose output the bank is built, and at least one layer reads
// the bank) and local_window <= kMaxCrossLayerWindow.
std::optional<CrossLayerProblem> CheckCrossLayerKv(uint32_t num_layers,
                                                   const CrossLayerKv& layout);

// The page geometry of `spec`'s layout: dtype and elem_bytes from
// spec.dtype, and num_layers = spec.KvGroups() (a cross-layer page's groups
// are addressed as layers: the lower layers' K/V first, the bank last,
// docs/CONTRACTS.md §2.2). Not valid() when the layout is incomplete (a
// dtype of kUnspecified or outside the enum included) or its cross-layer
// layout is not serveable.
PageGeometry NamespaceGeometry(const NamespaceSpec& spec);

// Bytes of one page of `spec`'s layout, scale area included:
//   groups x 2 x num_kv_heads x page_size x head_dim x dtype bytes
// for fp32, fp16 and bf16, and for fp8_e4m3, fp8_e5m2 and int8 that rounded
// up to a multiple of 16 plus groups x 2 x num_kv_heads x 4 (one fp32 scale
// per group, K|V and KV head), with groups = num_layers, or
// shared_from_layer + 1 with a cross-layer layout. 0 when the layout is
// incomplete or the dtype unspecified. This is the size a pool holding the
// namespace's pages must use.
uint64_t NamespacePageBytes(const NamespaceSpec& spec);

// Bytes of a page's scale area (alignment padding included): 0 for
// unscaled dtypes and incomplete layouts.
uint64_t NamespaceScaleBytes(const NamespaceSpec& spec);

}  // namespace radixkv

#endif  // RADIXKV_GPU_NAMESPACE_GEOMETRY_H_
