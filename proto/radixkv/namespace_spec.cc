#include "radixkv/namespace_spec.h"

#include "absl/strings/str_cat.h"

namespace radixkv {

void NamespaceToProto(const NamespaceSpec& spec, v1::Namespace* out) {
  out->set_model(spec.model.data(), spec.model.size());
  out->set_model_revision(spec.model_revision.data(),
                          spec.model_revision.size());
  out->set_lora(spec.lora.data(), spec.lora.size());
  out->set_cache_salt(spec.cache_salt.data(), spec.cache_salt.size());
  out->set_num_layers(spec.num_layers);
  out->set_num_kv_heads(spec.num_kv_heads);
  out->set_head_dim(spec.head_dim);
  out->set_page_size(spec.page_size);
  out->set_dtype(static_cast<v1::DType>(spec.dtype));
  out->set_tp_rank(spec.tp_rank);
  out->set_tp_size(spec.tp_size);
  if (spec.cross_layer.has_value()) {
    v1::CrossLayerKv* x = out->mutable_cross_layer();
    x->set_shared_from_layer(spec.cross_layer->shared_from_layer);
    x->set_local_window(spec.cross_layer->local_window);
  } else {
    out->clear_cross_layer();
  }
}

v1::Namespace NamespaceToProto(const NamespaceSpec& spec) {
  v1::Namespace ns;
  NamespaceToProto(spec, &ns);
  return ns;
}

NamespaceSpec NamespaceFromProto(const v1::Namespace& ns) {
  NamespaceSpec spec;
  spec.model = ns.model();
  spec.model_revision = ns.model_revision();
  spec.lora = ns.lora();
  spec.cache_salt = ns.cache_salt();
  spec.num_layers = ns.num_layers();
  spec.num_kv_heads = ns.num_kv_heads();
  spec.head_dim = ns.head_dim();
  spec.page_size = ns.page_size();
  spec.dtype = static_cast<DType>(ns.dtype());
  spec.tp_rank = ns.tp_rank();
  spec.tp_size = ns.tp_size() == 0 ? 1 : ns.tp_size();
  if (ns.has_cross_layer()) {
    spec.cross_layer = CrossLayerKv{ns.cross_layer().shared_from_layer(),
                                    ns.cross_layer().local_window()};
  }
  return spec;
}

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
  static_assert(static_cast<uint32_t>(KvDType::kFloat32) ==
                        static_cast<uint32_t>(DType::kFloat32) &&
                    static_cast<uint32_t>(KvDType::kInt8) ==
                        static_cast<uint32_t>(DType::kInt8),
                "KvDType mirrors DType");
  const auto dtype = static_cast<KvDType>(spec.dtype);
  return MakePageGeometry(spec.KvGroups(), spec.num_kv_heads, spec.page_size,
                          spec.head_dim,
                          KvDTypeBytes(dtype) == 0 ? KvDType::kOpaque : dtype);
}

uint64_t NamespacePageBytes(const NamespaceSpec& spec) {
  const PageGeometry g = NamespaceGeometry(spec);
  return g.valid() && g.dtype != KvDType::kOpaque ? g.page_bytes() : 0;
}

uint64_t NamespaceScaleBytes(const NamespaceSpec& spec) {
  const PageGeometry g = NamespaceGeometry(spec);
  return g.valid() && g.scaled() ? g.page_bytes() - g.elems_bytes() : 0;
}

}  // namespace radixkv
