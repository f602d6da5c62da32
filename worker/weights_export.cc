#include "worker/weights_export.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "base/status_macros.h"

namespace radixkv::worker {
namespace {

// One tensor of the file: a view of the model's weights (F32) or values of
// its own.
struct Tensor {
  std::string name;
  const char* dtype;  // safetensors dtype: "F32" or "U32"
  std::vector<uint64_t> shape;
  absl::Span<const float> f32;  // dtype F32: the model's, or `own_f32`
  std::vector<float> own_f32;
  std::vector<uint32_t> u32;    // dtype U32

  uint64_t bytes() const {
    uint64_t n = 4;
    for (uint64_t s : shape) n *= s;
    return n;
  }
};

// The model's weights, in Model::ForEachWeight's order.
std::vector<Tensor> WeightTensors(const Model& model) {
  std::vector<Tensor> t;
  model.ForEachWeight([&t](const std::string& name,
                           const std::vector<uint64_t>& shape,
                           absl::Span<const float> values) {
    t.push_back({name, "F32", shape, values, {}, {}});
  });
  return t;
}

// probe.tokens and probe.logits: two full blocks and one token of a fixed
// prompt, and the model's logits for its last token.
absl::Status AddProbe(const Model& model, std::vector<Tensor>* tensors) {
  const ModelConfig& c = model.config();
  const uint32_t n = 2 * c.page_size + 1;
  std::vector<uint32_t> tokens(n);
  for (uint32_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<uint32_t>((uint64_t{i} * 7919 + 13) % c.vocab);
  }
  LocalKv local(c, n);
  ASSIGN_OR_RETURN(std::vector<float> logits,
                   model.Forward(PrefixView{}, &local, tokens));
  tensors->push_back({"probe.tokens", "U32", {n}, {}, {}, std::move(tokens)});
  tensors->push_back({"probe.logits", "F32", {c.vocab}, {}, std::move(logits),
                      {}});
  Tensor& probe = tensors->back();
  probe.f32 = probe.own_f32;
  return absl::OkStatus();
}

nlohmann::ordered_json ConfigJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["name"] = c.name;
  j["num_layers"] = c.num_layers;
  j["d_model"] = c.d_model;
  j["num_q_heads"] = c.num_q_heads;
  j["num_kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["ffn_dim"] = c.ffn_dim;
  j["vocab"] = c.vocab;
  j["page_size"] = c.page_size;
  j["tied_embeddings"] = c.tied_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["norm_eps"] = c.norm_eps;
  j["seed"] = c.seed;
  return j;
}

nlohmann::ordered_json NamespaceJson(const NamespaceSpec& ns) {
  nlohmann::ordered_json j;
  j["model"] = ns.model;
  j["model_revision"] = ns.model_revision;
  j["lora"] = ns.lora;
  j["cache_salt"] = ns.cache_salt;
  j["num_layers"] = ns.num_layers;
  j["num_kv_heads"] = ns.num_kv_heads;
  j["head_dim"] = ns.head_dim;
  j["page_size"] = ns.page_size;
  j["dtype"] = static_cast<uint32_t>(ns.dtype);
  j["tp_rank"] = ns.tp_rank;
  j["tp_size"] = ns.tp_size;
  return j;
}

// The JSON header, padded with spaces to a multiple of 8 bytes.
std::string Header(const ModelConfig& c, const std::vector<Tensor>& tensors) {
  nlohmann::ordered_json h;
  nlohmann::ordered_json meta;
  meta["format"] = "radixkv-reference-weights";
  meta["format_version"] = "1";
  meta["config"] = ConfigJson(c).dump();
  meta["namespace"] = NamespaceJson(c.Namespace()).dump();
  meta["parameters"] = absl::StrCat(c.ParameterCount());
  h["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string out = h.dump();
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

// Writes the file at `tmp`; errors name `path`, the file the caller asked for.
absl::Status WriteFile(const std::string& tmp, const std::string& path,
                       const std::string& header,
                       const std::vector<Tensor>& tensors) {
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  auto failed = [&path] {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  };
  if (!out) return failed();
  // Little-endian u64 (every platform radixkv builds for is little-endian).
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const Tensor& t : tensors) {
    if (t.u32.empty()) {
      out.write(reinterpret_cast<const char*>(t.f32.data()),
                static_cast<std::streamsize>(t.f32.size() * sizeof(float)));
    } else {
      out.write(reinterpret_cast<const char*>(t.u32.data()),
                static_cast<std::streamsize>(t.u32.size() * sizeof(uint32_t)));
    }
    if (!out) return failed();
  }
  out.close();
  if (!out) return failed();
  return absl::OkStatus();
}

}  // namespace

absl::Status ExportWeights(const ModelConfig& config, const std::string& path) {
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Create(config, Device::kCpu));
  std::vector<Tensor> tensors = WeightTensors(*model);
  RETURN_IF_ERROR(AddProbe(*model, &tensors));
  const std::string tmp = absl::StrCat(path, ".tmp", ::getpid());
  if (absl::Status s = WriteFile(tmp, path, Header(config, tensors), tensors);
      !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace radixkv::worker
