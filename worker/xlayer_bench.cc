#include "worker/xlayer_bench.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine.h"
#include "worker/prefix_cache.h"
#include "worker/xlayer_model.h"
#include "gpu/kv_parallel.h"
#include "base/status_macros.h"

namespace radixkv::worker {
namespace {

double Rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

struct Measured {
  uint32_t matched_tokens = 0;
  double ttft_uncached_s = INFINITY;
  double ttft_cached_s = INFINITY;
  double max_abs_logit_diff = 0;
};

// Best-of-R TTFT of `prompt` uncached and with its first `prefix` tokens
// (whole blocks) committed to a fresh in-process cache; the measured runs
// commit nothing, so every cached run sees the same state.
absl::StatusOr<Measured> MeasureTtft(const Model& model,
                                     const std::vector<uint32_t>& prompt,
                                     uint32_t prefix, uint32_t repeat) {
  const ModelConfig& c = model.config();
  std::unique_ptr<PrefixCache> none = NewNoPrefixCache();
  const uint32_t capacity =
      static_cast<uint32_t>((prompt.size() + c.page_size - 1) / c.page_size + 8);
  ASSIGN_OR_RETURN(std::unique_ptr<PrefixCache> local,
                   NewLocalPrefixCache(c.Namespace(), capacity));
  Engine uncached(&model, none.get());
  Engine cached(&model, local.get());
  if (prefix > 0) {
    RETURN_IF_ERROR(
        cached.Run(absl::MakeConstSpan(prompt).subspan(0, prefix), RunOptions())
            .status());
  }
  RunOptions measure;
  measure.commit_prompt = false;
  Measured m;
  for (uint32_t i = 0; i < repeat; ++i) {
    ASSIGN_OR_RETURN(RunResult u, uncached.Run(prompt, measure));
    ASSIGN_OR_RETURN(RunResult k, cached.Run(prompt, measure));
    m.ttft_uncached_s = std::min(m.ttft_uncached_s, u.ttft_s);
    m.ttft_cached_s = std::min(m.ttft_cached_s, k.ttft_s);
    m.matched_tokens = k.matched_tokens;
    for (size_t j = 0; j < u.first_logits.size(); ++j) {
      m.max_abs_logit_diff = std::max<double>(
          m.max_abs_logit_diff, std::fabs(u.first_logits[j] - k.first_logits[j]));
    }
  }
  return m;
}

// One model's column of the comparison.
absl::StatusOr<nlohmann::ordered_json> Column(const ModelConfig& config,
                                              const std::vector<uint32_t>& prompt,
                                              const XLayerBenchOptions& o,
                                              uint32_t* matched) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Create(config, Device::kCpu));
  ASSIGN_OR_RETURN(Measured m,
                   MeasureTtft(*model, prompt, o.prefix_tokens, o.repeat));
  *matched = m.matched_tokens;
  const uint64_t n = prompt.size();
  const uint64_t page_bytes = config.Geometry().page_bytes();
  const uint64_t pages = (n + config.page_size - 1) / config.page_size;
  const uint64_t window = XLayerWindowBytes(config);
  const double ideal = ForwardFlops(config, 0, n) /
                       ForwardFlops(config, m.matched_tokens, n - m.matched_tokens);
  nlohmann::ordered_json j;
  j["kv_groups"] = config.KvGroups();
  j["page_bytes"] = page_bytes;
  j["bytes_per_token"] = Rounded(double(page_bytes) / config.page_size, 3);
  j["window_bytes_per_request"] = window;
  j["kv_bytes_for_prompt"] = pages * page_bytes + window;
  j["parameters"] = config.ParameterCount();
  j["ttft_uncached_s"] = Rounded(m.ttft_uncached_s, 6);
  j["ttft_cached_s"] = Rounded(m.ttft_cached_s, 6);
  j["speedup"] = Rounded(m.ttft_uncached_s / m.ttft_cached_s, 3);
  j["ideal_speedup"] = Rounded(ideal, 3);
  j["max_abs_logit_diff"] = m.max_abs_logit_diff;
  return j;
}

}  // namespace

absl::StatusOr<nlohmann::ordered_json> XLayerBench(
    const ModelConfig& config, const XLayerBenchOptions& o) {
  if (!config.xlayer.has_value()) {
    return absl::InvalidArgumentError("XLayerBench: the config has no xlayer");
  }
  if (o.suffix_tokens == 0 || o.repeat == 0) {
    return absl::InvalidArgumentError(
        "--suffix-tokens and --repeat must be >= 1");
  }
  const uint32_t n = o.prefix_tokens + o.suffix_tokens;
  std::mt19937 rng(1234);
  std::vector<uint32_t> prompt(n);
  for (uint32_t& t : prompt) t = rng() % config.vocab;
  ModelConfig plain = config;
  plain.xlayer.reset();
  uint32_t matched_plain = 0, matched_xlayer = 0;
  ASSIGN_OR_RETURN(nlohmann::ordered_json per_layer,
                   Column(plain, prompt, o, &matched_plain));
  ASSIGN_OR_RETURN(nlohmann::ordered_json xlayer,
                   Column(config, prompt, o, &matched_xlayer));
  nlohmann::ordered_json j;
  j["model"] = config.name;
  j["device"] = "cpu";
  j["kv_dtype"] = KvDTypeName(config.kv_dtype);
  j["layout"] = absl::StrCat("xlayer:", config.xlayer->shared_from);
  j["num_layers"] = config.num_layers;
  j["shared_from"] = config.xlayer->shared_from;
  j["window"] = config.xlayer->window;
  j["top_k"] = config.xlayer->top_k;
  j["prefix_tokens"] = o.prefix_tokens;
  j["suffix_tokens"] = o.suffix_tokens;
  j["matched_tokens"] = matched_xlayer;
  j["cached_fraction"] = Rounded(double(matched_xlayer) / n, 4);
  j["threads"] = gpu::KernelThreads();
  j["repeat"] = o.repeat;
  j["per_layer"] = per_layer;
  j["xlayer"] = xlayer;
  j["bytes_per_token_ratio"] = Rounded(
      xlayer["bytes_per_token"].get<double>() /
          per_layer["bytes_per_token"].get<double>(), 4);
  j["ttft_cached_ratio"] = Rounded(xlayer["ttft_cached_s"].get<double>() /
                                       per_layer["ttft_cached_s"].get<double>(),
                                   3);
  if (matched_plain != matched_xlayer) {
    return absl::InternalError(absl::StrCat(
        "the two models matched different prefixes (", matched_plain, " and ",
        matched_xlayer, " tokens)"));
  }
  return j;
}

}  // namespace radixkv::worker
