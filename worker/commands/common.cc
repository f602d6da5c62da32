// File: worker/commands/common.cc
//
// The helpers shared by radixkv-worker's commands (common.h).
#include "worker/commands/common.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>

#include "base/status_macros.h"

namespace radixkv::worker::commands {
namespace {

// A decimal integer. CLI11 alone would also take 0x10, and read 010 as
// octal: leading zeros are dropped before it converts the value.
const CLI::Validator kDecimal(
    [](std::string& value) -> std::string {
      if (value.empty() ||
          !std::all_of(value.begin(), value.end(),
                       [](unsigned char c) { return std::isdigit(c) != 0; })) {
        return value + ": want a non-negative integer";
      }
      value.erase(0, std::min(value.find_first_not_of('0'), value.size() - 1));
      return "";
    },
    "");

}  // namespace

CLI::Option* AddUint(CLI::App* cmd, const std::string& name, uint32_t* value,
                     const std::string& help) {
  return cmd->add_option(name, *value, help)
      ->transform(kDecimal)
      ->capture_default_str();
}

void AddLayoutFlags(CLI::App* cmd, ModelFlags* f) {
  constexpr char kGroup[] = "Cross-layer KV (--layout=xlayer, CPU only)";
  cmd->add_option("--layout", f->layout,
                  "per-layer: every layer keeps its own K/V; xlayer:\n"
                  "layers from --xlayer-from on share one K/V bank\n"
                  "(part of the namespace)")
      ->check(CLI::IsMember({"per-layer", "xlayer"}))
      ->capture_default_str()
      ->group(kGroup);
  AddUint(cmd, "--xlayer-from", &f->xlayer_from,
          "S: first layer reading the bank, 1..layers-1\n"
          "(0: layers / 2, at least 1)")
      ->group(kGroup);
  AddUint(cmd, "--xlayer-window", &f->xlayer_window,
          "W: tokens of each upper layer's local window\n"
          "(0: none; at most 65536)")
      ->group(kGroup);
  AddUint(cmd, "--xlayer-topk", &f->xlayer_topk,
          "bank positions each query reads (0: all)")
      ->group(kGroup);
}

void AddModelFlags(CLI::App* cmd, const std::string& default_model,
                   ModelFlags* f) {
  constexpr char kOverrides[] = "Model overrides (of the named size)";
  f->model = default_model;
  cmd->add_option("--model", f->model,
                  "named size (see worker/README.md)")
      ->check(CLI::IsMember({"tiny", "small", "base"}))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--device", f->device,
                  "where forward passes run (auto: cuda when a device\n"
                  "is present, else cpu; cuda GEMMs use cuBLAS when it\n"
                  "loads, a built-in kernel otherwise)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--kv-dtype", f->kv_dtype,
                  "encoding of cached K/V pages (part of the namespace:\n"
                  "pages of one dtype never serve another); fp8 and int8\n"
                  "pages carry per-block, per-head scales")
      ->check(CLI::IsMember(
          {"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"}))
      ->capture_default_str()
      ->group("Model");
  f->overrides = {
      {"--layers", "number of layers", &ModelConfig::num_layers},
      {"--d-model", "hidden size", &ModelConfig::d_model},
      {"--q-heads", "query heads", &ModelConfig::num_q_heads},
      {"--kv-heads", "KV heads", &ModelConfig::num_kv_heads},
      {"--head-dim", "head dimension (even)", &ModelConfig::head_dim},
      {"--ffn", "MLP hidden size", &ModelConfig::ffn_dim},
      {"--vocab", "vocabulary size", &ModelConfig::vocab},
      {"--page-size", "tokens per cached block", &ModelConfig::page_size},
  };
  for (ModelFlags::Override& o : f->overrides) {
    o.option = cmd->add_option(o.flag, o.value, o.help)
                   ->transform(kDecimal)
                   ->group(kOverrides);
  }
  f->seed_option = cmd->add_option("--seed", f->seed, "weight seed")
                       ->transform(kDecimal)
                       ->group(kOverrides);
  cmd->add_flag("--tied", f->tied, "tie the output head to the embedding")
      ->group(kOverrides);
}

absl::StatusOr<ModelConfig> ModelFromFlags(const ModelFlags& f) {
  ASSIGN_OR_RETURN(ModelConfig c, NamedModelConfig(f.model));
  for (const ModelFlags::Override& o : f.overrides) {
    if (o.option->count() > 0) c.*o.field = o.value;
  }
  if (f.seed_option->count() > 0) c.seed = f.seed;
  if (f.tied) c.tied_embeddings = true;
  ASSIGN_OR_RETURN(c.kv_dtype, ParseKvDType(f.kv_dtype));
  if (f.layout == "xlayer") {
    c.xlayer = XLayerConfig{
        .shared_from = f.xlayer_from != 0 ? f.xlayer_from
                                          : std::max(1u, c.num_layers / 2),
        .window = f.xlayer_window,
        .top_k = f.xlayer_topk};
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelConfig& config,
                                                   Device device) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config, device));
  if (!model->device_note().empty()) {
    std::cerr << "radixkv-worker: " << model->device_note() << "\n";
  }
  return model;
}

int Fail(const absl::Status& s) {
  std::cerr << "Error: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ||
                 s.code() == absl::StatusCode::kNotFound
             ? kExitUsage
             : kExitError;
}

double Rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

}  // namespace radixkv::worker::commands
