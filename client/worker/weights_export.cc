#include "client/worker/weights_export.h"

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
#include "radix/status_macros.h"

namespace radixkv::worker {
namespace {

// The weight generator of Model::Create (model.cc): element i of tensor
// number `tensor` is a SplitMix64 finaliser of (seed, tensor, i) mapped to
// uniform [-1, 1) and scaled. Tensors are numbered from 1 in creation
// order. The probe tensors of the file check that both stay identical.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<float> Uniform(uint64_t seed, uint64_t tensor, size_t n,
                           float scale) {
  std::vector<float> out(n);
  const uint64_t base = Mix(seed ^ Mix(tensor));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = Mix(base + i);
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    out[i] = (2.0f * u - 1.0f) * scale;
  }
  return out;
}

std::vector<float> NormGain(uint64_t seed, uint64_t tensor, size_t n) {
  std::vector<float> g = Uniform(seed, tensor, n, 0.1f);
  for (float& x : g) x += 1.0f;
  return g;
}

// One tensor of the file: its bytes are produced when it is written, so
// only one weight matrix is in memory at a time.
struct Tensor {
  std::string name;
  const char* dtype;  // safetensors dtype: "F32" or "U32"
  std::vector<uint64_t> shape;
  std::function<std::vector<float>()> make_f32;  // dtype F32
  std::vector<uint32_t> u32;                     // dtype U32

  uint64_t bytes() const {
    uint64_t n = 4;
    for (uint64_t s : shape) n *= s;
    return n;
  }
};

// The tensors in Model::Create's generation order.
std::vector<Tensor> WeightTensors(const ModelConfig& c) {
  const uint64_t d = c.d_model, qd = uint64_t{c.num_q_heads} * c.head_dim,
                 kvd = uint64_t{c.num_kv_heads} * c.head_dim, f = c.ffn_dim,
                 vocab = c.vocab, seed = c.seed;
  const float in_d = 1.0f / std::sqrt(float(d));
  std::vector<Tensor> t;
  auto uniform = [&](std::string name, std::vector<uint64_t> shape,
                     uint64_t id, float scale) {
    const size_t n = shape[0] * (shape.size() > 1 ? shape[1] : 1);
    t.push_back({std::move(name), "F32", std::move(shape),
                 [=] { return Uniform(seed, id, n, scale); }, {}});
  };
  auto gain = [&](std::string name, uint64_t id) {
    t.push_back({std::move(name), "F32", {d},
                 [=] { return NormGain(seed, id, d); }, {}});
  };
  uint64_t id = 0;
  uniform("embedding", {vocab, d}, ++id, 1.0f);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    gain(p + "attn_norm", ++id);
    uniform(p + "wqkv", {d, qd + 2 * kvd}, ++id, in_d);
    uniform(p + "wo", {qd, d}, ++id, 1.0f / std::sqrt(float(qd)));
    gain(p + "mlp_norm", ++id);
    uniform(p + "wgateup", {d, 2 * f}, ++id, in_d);
    uniform(p + "wdown", {f, d}, ++id, 1.0f / std::sqrt(float(f)));
  }
  gain("final_norm", ++id);
  if (c.tied_embeddings) {
    t.push_back({"head", "F32", {d, vocab}, [=] {
                   const std::vector<float> e = Uniform(seed, 1, vocab * d, 1.0f);
                   std::vector<float> h(d * vocab);
                   for (uint64_t v = 0; v < vocab; ++v)
                     for (uint64_t i = 0; i < d; ++i)
                       h[i * vocab + v] = e[v * d + i] * in_d;
                   return h;
                 }, {}});
  } else {
    uniform("head", {d, vocab}, ++id, in_d);
  }
  const uint32_t half = c.head_dim / 2;
  const double theta = c.rope_theta, hd = c.head_dim;
  t.push_back({"rope_inv_freq", "F32", {half}, [=] {
                 std::vector<float> inv(half);
                 for (uint32_t i = 0; i < half; ++i)
                   inv[i] = static_cast<float>(std::pow(theta, -2.0 * i / hd));
                 return inv;
               }, {}});
  return t;
}

// probe.tokens and probe.logits: two full blocks and one token of a fixed
// prompt, and the model's logits for its last token.
absl::Status AddProbe(const ModelConfig& c, std::vector<Tensor>* tensors) {
  const uint32_t n = 2 * c.page_size + 1;
  std::vector<uint32_t> tokens(n);
  for (uint32_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<uint32_t>((uint64_t{i} * 7919 + 13) % c.vocab);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(c, Device::kCpu));
  LocalKv local(c, n);
  ASSIGN_OR_RETURN(std::vector<float> logits,
                   model->Forward(PrefixView{}, &local, tokens));
  tensors->push_back({"probe.tokens", "U32", {n}, nullptr, tokens});
  tensors->push_back({"probe.logits", "F32", {c.vocab},
                      [logits = std::move(logits)] { return logits; }, {}});
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

absl::Status WriteFile(const std::string& path, const std::string& header,
                       const std::vector<Tensor>& tensors) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
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
    if (t.make_f32) {
      const std::vector<float> data = t.make_f32();
      out.write(reinterpret_cast<const char*>(data.data()),
                static_cast<std::streamsize>(data.size() * sizeof(float)));
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
  std::vector<Tensor> tensors = WeightTensors(config);
  RETURN_IF_ERROR(AddProbe(config, &tensors));
  const std::string tmp = absl::StrCat(path, ".tmp", ::getpid());
  if (absl::Status s = WriteFile(tmp, Header(config, tensors), tensors);
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
