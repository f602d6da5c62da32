#include "radixkv/namespace_spec.h"

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
  return spec;
}

PageGeometry NamespaceGeometry(const NamespaceSpec& spec) {
  static_assert(static_cast<uint32_t>(KvDType::kFloat32) ==
                        static_cast<uint32_t>(DType::kFloat32) &&
                    static_cast<uint32_t>(KvDType::kInt8) ==
                        static_cast<uint32_t>(DType::kInt8),
                "KvDType mirrors DType");
  const auto dtype = static_cast<KvDType>(spec.dtype);
  return MakePageGeometry(spec.num_layers, spec.num_kv_heads, spec.page_size,
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
