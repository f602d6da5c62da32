// File: worker/commands/bench.cc
//
// `radixkv-worker bench`: times one random prompt of P + S tokens uncached
// and with its first P tokens cached (in-process cache, in device memory on
// cuda), best of R runs each, and prints one JSON object; with
// --eval-prompts, also the accuracy of --kv-dtype pages against an all-fp32
// run. With --layout=xlayer the cross-layer and per-layer models are
// measured side by side instead (worker/xlayer_bench.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "base/status_macros.h"
#include "gpu/kv_parallel.h"
#include "nlohmann/json.hpp"
#include "worker/commands/commands.h"
#include "worker/engine.h"
#include "worker/prefix_cache.h"
#include "worker/xlayer_bench.h"

namespace radixkv::worker::commands {
namespace {

constexpr char kBenchFooter[] =
    "Times one random prompt of P + S tokens uncached and with its first P\n"
    "tokens cached (in-process cache, in device memory on cuda), best of R\n"
    "runs each, and prints one JSON object.\n"
    "Keys: model, device, kv_dtype, gemm, prefix_tokens, suffix_tokens,\n"
    "matched_tokens, ttft_uncached_s, ttft_cached_s, speedup, ideal_speedup,\n"
    "fraction_of_ideal, max_abs_logit_diff, page_bytes, bytes_per_token,\n"
    "pages_per_gib, threads, repeat, parameters. The uncached run is all\n"
    "fp32; the cached run reads the prefix from --kv-dtype pages, so\n"
    "max_abs_logit_diff is that dtype's error.\n"
    "With --eval-prompts N: N fixed prompts of --eval-tokens tokens, 90 %\n"
    "cached (whole blocks), each decoded greedily for --eval-decode tokens\n"
    "from --kv-dtype pages and compared with an all-fp32 run; adds\n"
    "eval_prompts, eval_tokens, eval_decode, eval_max_abs_logit_err,\n"
    "eval_mean_abs_logit_err (first-token logits) and greedy_agreement\n"
    "(fraction of generated tokens equal to the fp32 run's).\n\n"
    "Example:\n"
    "  radixkv-worker bench --device cpu --model small --prefix-tokens 1856 "
    "--suffix-tokens 192\n"
    "  radixkv-worker bench --model small --kv-dtype fp8_e4m3 "
    "--eval-prompts 16\n\n"
    "With --layout=xlayer the cross-layer model and the per-layer model of\n"
    "the same depth and width are measured side by side on the CPU, same\n"
    "prompt: keys per_layer and xlayer (kv_groups, page_bytes,\n"
    "bytes_per_token, window_bytes_per_request, kv_bytes_for_prompt,\n"
    "ttft_uncached_s, ttft_cached_s, speedup, ideal_speedup,\n"
    "max_abs_logit_diff) and bytes_per_token_ratio, ttft_cached_ratio.\n"
    "  radixkv-worker bench --model small --layout xlayer --xlayer-from 2";

// What `bench` measured; printed as one JSON object.
struct BenchResult {
  uint32_t matched_tokens = 0;
  double ttft_uncached_s = INFINITY;  // best of the runs
  double ttft_cached_s = INFINITY;
  double max_abs_logit_diff = 0;  // cached vs uncached, first token's logits
  // --eval-prompts: kv-dtype pages vs all fp32.
  double eval_max_abs = 0, eval_mean_abs = 0, greedy_agreement = 0;
};

// Runs the --eval-prompts set: per prompt, an all-fp32 run (no cache) and a
// run whose first 90 % (whole blocks) come from a fresh in-process cache of
// the model's kv dtype; accumulates the first-token logit errors and the
// greedy agreement into *r.
absl::Status EvalQuality(const BenchFlags& f, const Model& model,
                         BenchResult* r) {
  const ModelConfig& c = model.config();
  const uint32_t n = f.eval_tokens;
  const uint32_t ps = c.page_size;
  const uint32_t cached_tokens = n * 9 / 10 / ps * ps;
  std::unique_ptr<PrefixCache> none = NewNoPrefixCache();
  std::mt19937 rng(20240601);
  double sum_abs = 0;
  uint64_t logits = 0, agree = 0, generated = 0;
  for (uint32_t i = 0; i < f.eval_prompts; ++i) {
    std::vector<uint32_t> prompt(n);
    for (uint32_t& t : prompt) t = rng() % c.vocab;
    ASSIGN_OR_RETURN(std::unique_ptr<PrefixCache> cache,
                     NewLocalPrefixCache(c.Namespace(), (n + ps - 1) / ps + 2,
                                         model.on_cuda()));
    Engine fp32(&model, none.get());
    Engine quant(&model, cache.get());
    RunOptions opts;
    opts.decode_tokens = f.eval_decode;
    if (cached_tokens > 0) {
      RETURN_IF_ERROR(quant.Run(absl::MakeConstSpan(prompt).subspan(0, cached_tokens),
                                RunOptions()).status());
    }
    ASSIGN_OR_RETURN(RunResult ref, fp32.Run(prompt, opts));
    ASSIGN_OR_RETURN(RunResult got, quant.Run(prompt, opts));
    for (size_t j = 0; j < ref.first_logits.size(); ++j) {
      const double d = std::fabs(double(ref.first_logits[j]) - got.first_logits[j]);
      r->eval_max_abs = std::max(r->eval_max_abs, d);
      sum_abs += d;
      ++logits;
    }
    for (size_t j = 0; j < ref.generated.size(); ++j) {
      agree += ref.generated[j] == got.generated[j];
      ++generated;
    }
  }
  r->eval_mean_abs = logits > 0 ? sum_abs / double(logits) : 0;
  r->greedy_agreement = generated > 0 ? double(agree) / double(generated) : 0;
  return absl::OkStatus();
}

void PrintBenchResult(const BenchFlags& f, const ModelConfig& config,
                      bool on_cuda, const char* gemm, const BenchResult& r) {
  const uint32_t n = f.prefix_tokens + f.suffix_tokens;
  const double ideal =
      ForwardFlops(config, 0, n) /
      ForwardFlops(config, r.matched_tokens, n - r.matched_tokens);
  const double speedup = r.ttft_uncached_s / r.ttft_cached_s;
  nlohmann::ordered_json j;
  j["model"] = config.name;
  j["device"] = on_cuda ? "cuda" : "cpu";
  j["kv_dtype"] = KvDTypeName(config.kv_dtype);
  j["gemm"] = gemm;
  j["prefix_tokens"] = f.prefix_tokens;
  j["suffix_tokens"] = f.suffix_tokens;
  j["matched_tokens"] = r.matched_tokens;
  j["ttft_uncached_s"] = Rounded(r.ttft_uncached_s, 6);
  j["ttft_cached_s"] = Rounded(r.ttft_cached_s, 6);
  j["speedup"] = Rounded(speedup, 3);
  j["ideal_speedup"] = Rounded(ideal, 3);
  j["fraction_of_ideal"] = Rounded(speedup / ideal, 3);
  j["max_abs_logit_diff"] = r.max_abs_logit_diff;
  const uint64_t page_bytes = config.Geometry().page_bytes();
  j["page_bytes"] = page_bytes;
  j["bytes_per_token"] = Rounded(double(page_bytes) / config.page_size, 3);
  j["pages_per_gib"] = (uint64_t{1} << 30) / page_bytes;
  if (f.eval_prompts > 0) {
    j["eval_prompts"] = f.eval_prompts;
    j["eval_tokens"] = f.eval_tokens;
    j["eval_decode"] = f.eval_decode;
    j["eval_max_abs_logit_err"] = r.eval_max_abs;
    j["eval_mean_abs_logit_err"] = r.eval_mean_abs;
    j["greedy_agreement"] = Rounded(r.greedy_agreement, 4);
  }
  j["threads"] = gpu::KernelThreads();
  j["repeat"] = f.repeat;
  j["parameters"] = config.ParameterCount();
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

CLI::App* AddBenchCommand(CLI::App& app, BenchFlags* f) {
  CLI::App* cmd = app.add_subcommand("bench", "Time to first token uncached "
                                              "vs with a cached prefix (JSON)")
                      ->footer(kBenchFooter);
  AddUint(cmd, "--prefix-tokens", &f->prefix_tokens,
          "cached prompt tokens (P)");
  AddUint(cmd, "--suffix-tokens", &f->suffix_tokens,
          "uncached prompt tokens (S, >= 1)");
  AddUint(cmd, "--repeat", &f->repeat, "best of R timed runs each (>= 1)");
  AddUint(cmd, "--eval-prompts", &f->eval_prompts,
          "accuracy vs fp32 over N fixed prompts (0: skip)");
  AddUint(cmd, "--eval-tokens", &f->eval_tokens,
          "tokens per evaluation prompt (>= 2)");
  AddUint(cmd, "--eval-decode", &f->eval_decode,
          "greedy tokens per evaluation prompt (>= 1)");
  cmd->add_flag("--json", f->json, "accepted; the output is JSON either way");
  AddModelFlags(cmd, "small", &f->model);
  AddLayoutFlags(cmd, &f->model);
  return cmd;
}

int BenchCommand(const BenchFlags& f) {
  absl::StatusOr<ModelConfig> config = ModelFromFlags(f.model);
  if (!config.ok()) return Fail(config.status());
  if (config->xlayer.has_value()) {
    if (f.eval_prompts > 0) {
      return Fail(absl::InvalidArgumentError(
          "--eval-prompts is not available with --layout=xlayer"));
    }
    absl::StatusOr<nlohmann::ordered_json> j = XLayerBench(
        *config, {f.prefix_tokens, f.suffix_tokens, f.repeat});
    if (!j.ok()) return Fail(j.status());
    std::printf("%s\n", j->dump().c_str());
    return 0;
  }
  absl::StatusOr<Device> device = ParseDevice(f.model.device);
  if (!device.ok()) return Fail(device.status());
  const uint32_t p = f.prefix_tokens;
  const uint32_t s = f.suffix_tokens;
  if (s == 0) return Fail(absl::InvalidArgumentError("--suffix-tokens must be >= 1"));
  if (f.repeat == 0) return Fail(absl::InvalidArgumentError("--repeat must be >= 1"));
  if (f.eval_prompts > 0 && (f.eval_tokens < 2 || f.eval_tokens > (1u << 16) ||
                             f.eval_decode == 0)) {
    return Fail(absl::InvalidArgumentError(
        "--eval-tokens must be in 2..65536 and --eval-decode >= 1"));
  }
  if (uint64_t{p} + s > (1u << 20)) {
    return Fail(absl::InvalidArgumentError("prefix + suffix tokens must be <= 1048576"));
  }
  absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(*config, *device);
  if (!model.ok()) return Fail(model.status());

  const uint32_t n = p + s;
  std::mt19937 rng(1234);
  std::vector<uint32_t> prompt(n);
  for (uint32_t& t : prompt) t = rng() % config->vocab;

  std::unique_ptr<PrefixCache> none = NewNoPrefixCache();
  const uint32_t capacity = (n + config->page_size - 1) / config->page_size + 8;
  absl::StatusOr<std::unique_ptr<PrefixCache>> local =
      NewLocalPrefixCache(config->Namespace(), capacity,
                          /*device_pages=*/(*model)->on_cuda());
  if (!local.ok()) return Fail(local.status());
  Engine uncached(model->get(), none.get());
  Engine cached(model->get(), local->get());
  RunOptions measure;
  measure.commit_prompt = false;  // keep the cached state identical per run

  // Fill the cache with the prefix (full blocks only).
  if (p > 0) {
    RunOptions fill;
    auto r = cached.Run(absl::MakeConstSpan(prompt).subspan(0, p), fill);
    if (!r.ok()) return Fail(r.status());
  }
  BenchResult result;
  for (uint32_t i = 0; i < f.repeat; ++i) {
    auto u = uncached.Run(prompt, measure);
    if (!u.ok()) return Fail(u.status());
    auto c = cached.Run(prompt, measure);
    if (!c.ok()) return Fail(c.status());
    result.ttft_uncached_s = std::min(result.ttft_uncached_s, u->ttft_s);
    result.ttft_cached_s = std::min(result.ttft_cached_s, c->ttft_s);
    result.matched_tokens = c->matched_tokens;
    for (size_t j = 0; j < u->first_logits.size(); ++j) {
      result.max_abs_logit_diff = std::max<double>(
          result.max_abs_logit_diff,
          std::fabs(u->first_logits[j] - c->first_logits[j]));
    }
  }
  if (f.eval_prompts > 0) {
    if (absl::Status st = EvalQuality(f, **model, &result); !st.ok()) return Fail(st);
  }
  PrintBenchResult(f, *config, (*model)->on_cuda(), (*model)->gemm_backend(),
                   result);
  return 0;
}

}  // namespace radixkv::worker::commands
