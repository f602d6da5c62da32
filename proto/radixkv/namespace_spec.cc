#include "radixkv/namespace_spec.h"

#include <cstdint>

namespace radixkv {

namespace {

constexpr bool SameValue(DType d, v1::DType wire) {
  return static_cast<int64_t>(d) == static_cast<int64_t>(wire);
}

// DType (base/dtype.h) carries radixkv.v1.DType's values, all of them, so
// the two convert by a cast.
static_assert(SameValue(DType::kUnspecified, v1::DTYPE_UNSPECIFIED) &&
                  SameValue(DType::kFloat32, v1::DTYPE_FLOAT32) &&
                  SameValue(DType::kFloat16, v1::DTYPE_FLOAT16) &&
                  SameValue(DType::kBFloat16, v1::DTYPE_BFLOAT16) &&
                  SameValue(DType::kFloat8E4M3, v1::DTYPE_FLOAT8_E4M3) &&
                  SameValue(DType::kFloat8E5M2, v1::DTYPE_FLOAT8_E5M2) &&
                  SameValue(DType::kInt8, v1::DTYPE_INT8) &&
                  v1::DType_MIN == v1::DTYPE_UNSPECIFIED &&
                  v1::DType_MAX == v1::DTYPE_INT8,
              "DType must carry radixkv.v1.DType's values");

}  // namespace

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

}  // namespace radixkv
