#include "gpu/namespace_geometry.h"

#include "absl/strings/str_cat.h"

namespace radixkv {

std::optional<CrossLayerProblem> CheckCrossLayerKv(uint32_t num_layers,
                                                   const CrossLayerKv& layout) {
  const uint32_t s = layout.shared_from_layer;
  if (num_layers < 2) {
    return CrossLayerProblem{
        "shared_from_layer",
        absl::StrCat("needs num_layers >= 2 (one layer with its own K/V and "
                     "one reading the shared bank); num_layers is ",
                     num_layers)};
  }
  if (s == 0 || s >= num_layers) {
    return CrossLayerProblem{
        "shared_from_layer",
        absl::StrCat(s, " is outside 1..", num_layers - 1,
                     " (num_layers - 1: at least layer 0 keeps its own K/V "
                     "and at least one layer reads the bank)")};
  }
  if (layout.local_window > kMaxCrossLayerWindow) {
    return CrossLayerProblem{
        "local_window", absl::StrCat(layout.local_window, " exceeds the limit ",
                                     kMaxCrossLayerWindow, " tokens")};
  }
  return std::nullopt;
}

PageGeometry NamespaceGeometry(const NamespaceSpec& spec) {
  // A value outside the enum reads as kUnspecified (no element size).
  const DType dtype =
      DTypeBytes(spec.dtype) == 0 ? DType::kUnspecified : spec.dtype;
  return MakePageGeometry(spec.KvGroups(), spec.num_kv_heads, spec.page_size,
                          spec.head_dim, dtype);
}

uint64_t NamespacePageBytes(const NamespaceSpec& spec) {
  const PageGeometry g = NamespaceGeometry(spec);
  return g.valid() && g.dtype != DType::kUnspecified ? g.page_bytes() : 0;
}

uint64_t NamespaceScaleBytes(const NamespaceSpec& spec) {
  const PageGeometry g = NamespaceGeometry(spec);
  return g.valid() && g.scaled() ? g.page_bytes() - g.elems_bytes() : 0;
}

}  // namespace radixkv
