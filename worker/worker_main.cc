// radixkv-worker: the reference worker.
//
//   radixkv-worker run --prompts FILE | --text FILE [--model tiny] [--decode N]
//                      [--commit-generated] [--no-cache] [--json]
//                      [--endpoint E] [--timeout D] [model overrides]
//   radixkv-worker bench [--model small] [--prefix-tokens P]
//                        [--suffix-tokens S] [--repeat R] [--json]
//   run, bench: [--device auto|cpu|cuda]
//   run, bench, export-weights:
//               [--kv-dtype fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8]
//   run, bench: [--layout per-layer|xlayer [--xlayer-from S]
//               [--xlayer-window W] [--xlayer-topk K]]
//   radixkv-worker export-weights [--model tiny] --out FILE [model overrides]
//
// `run` serves each prompt through radixkvd (skipping its cached prefix) and
// prints tokens, matched tokens, time to first token, decode rate and the
// generated tokens; without a daemon it prefills everything and prints the
// same tokens. `bench` measures time to first token uncached vs with the
// first P tokens cached (in-process cache) and prints one JSON object.
// `export-weights` writes the model's configuration, namespace and weights
// as one safetensors file (weights_export.h).
//
// The command line is parsed by CLI11 (`radixkv-worker --help-all` lists
// every flag); JSON output is built with nlohmann_json.
//
// Exit codes: 0 ok, 1 error, 3 bad arguments.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/prefix_cache.h"
#include "worker/weights_export.h"
#include "worker/xlayer_bench.h"
#include "gpu/kv_parallel.h"
#include "nlohmann/json.hpp"
#include "base/status_macros.h"
#include "radixkv/defaults.h"
#include "xxhash.h"

namespace radixkv::worker {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 3;

constexpr char kDescription[] =
    "radixkv-worker: the reference worker of radixkv, a small deterministic\n"
    "transformer that serves prompts through radixkvd and prefills only the\n"
    "part of each prompt that is not cached.";

constexpr char kFooter[] =
    "Exit codes: 0 ok, 1 error, 3 bad arguments (unknown flag, bad value, a\n"
    "prompt file that cannot be read or holds a token >= vocab).\n"
    "Environment: RADIXKV_THREADS=N caps the CPU threads (default: all "
    "cores).\n"
    "Run 'radixkv-worker <command> --help' for a command's flags, or\n"
    "'radixkv-worker --help-all' for all of them.";

// CLI11's help layout with one blank line after the description and between
// flag groups.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::string out = app->get_description() + "\n\n" + make_usage(app, name) +
                      make_positionals(app);
    for (const std::string& group : app->get_groups()) {
      std::vector<const CLI::Option*> options = app->get_options(
          [&](const CLI::Option* o) {
            return o->get_group() == group && o->nonpositional();
          });
      if (!group.empty() && !options.empty()) {
        out += make_group(group, false, options);
      }
    }
    return out + make_subcommands(app, mode) + "\n" + make_footer(app);
  }
};

// ---- flag values ----------------------------------------------------------------

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

// A positive duration as absl::ParseDuration reads it ("5s", "500ms").
const CLI::Validator kDuration(
    [](std::string& value) -> std::string {
      absl::Duration d;
      if (absl::ParseDuration(value, &d) && d > absl::ZeroDuration()) return "";
      return value + ": want a positive duration such as 5s or 500ms";
    },
    "");

// Adds a uint32 flag with its default shown in help.
CLI::Option* AddUint(CLI::App* cmd, const std::string& name, uint32_t* value,
                     const std::string& help) {
  return cmd->add_option(name, *value, help)
      ->transform(kDecimal)
      ->capture_default_str();
}

// The model flags of both commands: a named size, per-field overrides and the
// device. The overrides apply only when given.
struct ModelFlags {
  struct Override {
    const char* flag;
    const char* help;
    uint32_t ModelConfig::*field;
    uint32_t value = 0;
    CLI::Option* option = nullptr;
  };
  std::string model;
  std::string device = "auto";
  std::string kv_dtype = "fp32";
  bool tied = false;
  uint32_t seed = 0;
  CLI::Option* seed_option = nullptr;
  std::vector<Override> overrides;
  // Cross-layer KV (xlayer_model.h); xlayer_from 0: num_layers / 2.
  std::string layout = "per-layer";
  uint32_t xlayer_from = 0;
  uint32_t xlayer_window = XLayerConfig().window;
  uint32_t xlayer_topk = XLayerConfig().top_k;
};

// The cross-layer flags of run and bench.
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

struct RunFlags {
  ModelFlags model;
  std::string prompts;
  std::string text;
  CLI::Option* prompts_option = nullptr;
  CLI::Option* text_option = nullptr;
  uint32_t decode = 16;
  bool commit_generated = false;
  bool no_cache = false;
  bool json = false;
  std::string endpoint;
  std::string timeout = "5s";
};

constexpr char kRunFooter[] =
    "Per prompt: prefill only the uncached suffix, decode greedily, commit\n"
    "the new full blocks.\n"
    "FILE holds one prompt per line: --prompts, token ids separated by\n"
    "spaces or commas; --text, each line's bytes are its tokens.\n"
    "Without a daemon (or with --no-cache) every prompt is prefilled in\n"
    "full and the output tokens are the same.\n\n"
    "Example:\n"
    "  radixkv-worker run --text prompt.txt --model small --decode 16";

CLI::App* AddRunCommand(CLI::App& app, RunFlags* f) {
  CLI::App* cmd =
      app.add_subcommand("run", "Serve prompts through radixkvd, reusing "
                                "their cached prefixes")
          ->footer(kRunFooter);
  f->prompts_option =
      cmd->add_option("--prompts", f->prompts, "prompts as token ids")
          ->type_name("FILE")
          ->group("Input (one of)");
  f->text_option = cmd->add_option("--text", f->text, "prompts as text")
                       ->type_name("FILE")
                       ->group("Input (one of)");
  AddUint(cmd, "--decode", &f->decode, "tokens to generate per prompt (>= 1)");
  cmd->add_flag("--commit-generated", f->commit_generated,
                "also commit full blocks of generated tokens");
  cmd->add_flag("--json", f->json, "one JSON object per prompt");
  cmd->add_flag("--no-cache", f->no_cache,
                "do not contact the daemon (full prefills)")
      ->group("Daemon");
  cmd->add_option("--endpoint", f->endpoint,
                  "radixkvd endpoint, as radixkvctl's (default: the\n"
                  "daemon's default socket)")
      ->envname("RADIXKVCTL_ENDPOINT")
      ->type_name("E")
      ->group("Daemon");
  cmd->add_option("--timeout", f->timeout, "deadline of each call, e.g. 5s")
      ->type_name("D")
      ->check(kDuration)
      ->capture_default_str()
      ->group("Daemon");
  AddModelFlags(cmd, "tiny", &f->model);
  AddLayoutFlags(cmd, &f->model);
  return cmd;
}

struct BenchFlags {
  ModelFlags model;
  uint32_t prefix_tokens = 1856;
  uint32_t suffix_tokens = 192;
  uint32_t repeat = 5;
  uint32_t eval_prompts = 0;
  uint32_t eval_tokens = 512;
  uint32_t eval_decode = 16;
  bool json = false;
};

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

struct ExportFlags {
  ModelFlags model;
  std::string out;
};

constexpr char kExportFooter[] =
    "Writes the model's configuration, its namespace and every weight its\n"
    "forward pass uses as one safetensors file (the format is described in\n"
    "worker/README.md), so that another implementation runs the\n"
    "identical model and shares its cached blocks. The same model flags as\n"
    "for run give the same namespace.\n\n"
    "Example:\n"
    "  radixkv-worker export-weights --model small --out small.safetensors";

CLI::App* AddExportCommand(CLI::App& app, ExportFlags* f) {
  CLI::App* cmd =
      app.add_subcommand("export-weights",
                         "Write the model's config and weights (safetensors)")
          ->footer(kExportFooter);
  cmd->add_option("--out", f->out, "output file (replaced if it exists)")
      ->type_name("FILE")
      ->required();
  AddModelFlags(cmd, "tiny", &f->model);
  cmd->remove_option(cmd->get_option("--device"));  // no forward pass to place
  return cmd;
}

// ---- commands ---------------------------------------------------------------------

absl::StatusOr<std::vector<std::vector<uint32_t>>> ReadPrompts(
    const std::string& path, bool text, uint32_t vocab) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<std::vector<uint32_t>> prompts;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::vector<uint32_t> p;
    if (text) {
      for (unsigned char ch : line) p.push_back(ch);
    } else {
      for (absl::string_view tok :
           absl::StrSplit(line, absl::ByAnyChar(" ,\t\r"), absl::SkipEmpty())) {
        uint32_t v;
        if (!absl::SimpleAtoi(tok, &v)) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", line_no, ": \"", tok, "\" is not a token id"));
        }
        p.push_back(v);
      }
    }
    if (p.empty()) continue;
    for (uint32_t t : p) {
      if (t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", line_no, ": token ", t, " is not below vocab ", vocab));
      }
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  }
  return prompts;
}

// Creates the model on --device; a one-line note on stderr when auto fell
// back to the CPU.
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

// The prefix cache of `run`: none with --no-cache, else radixkvd through a
// client (stored in *client, which must outlive the cache). A daemon that
// does not answer is a note on stderr: the cache then degrades to misses.
absl::StatusOr<std::unique_ptr<PrefixCache>> OpenCache(
    const RunFlags& f, const ModelConfig& config, absl::Duration timeout,
    bool on_cuda, std::unique_ptr<Client>* client) {
  if (f.no_cache) return NewNoPrefixCache();
  ClientOptions options;
  options.endpoint = f.endpoint.empty() ? DefaultSocketPath() : f.endpoint;
  options.call_timeout = timeout;
  options.connect_timeout = timeout;
  options.initial_wait = timeout;
  options.ns = config.Namespace();
  options.client_name = "radixkv-worker";
  options.attach_pool = true;
  ASSIGN_OR_RETURN(*client, Client::Create(options));
  if (!(*client)->connected()) {
    std::cerr << "radixkv-worker: no session with radixkvd at "
              << options.endpoint << " ("
              << (*client)->state().last_error.message()
              << "); prefilling without the cache\n";
  }
  return NewDaemonPrefixCache(client->get(), /*accept_device_pages=*/on_cuda);
}

// `v` rounded to `decimals` places: the JSON number stays short.
double Rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

void PrintRunResult(size_t prompt, const RunResult& r, const RunFlags& f) {
  if (f.json) {
    nlohmann::ordered_json j;
    j["prompt"] = prompt;
    j["tokens"] = r.prompt_tokens;
    j["matched_tokens"] = r.matched_tokens;
    j["cache"] =
        f.no_cache ? "none" : (r.cache_degraded ? "degraded" : "daemon");
    j["ttft_s"] = Rounded(r.ttft_s, 6);
    j["decode_tokens_per_s"] = Rounded(r.decode_tokens_per_s, 2);
    j["committed_blocks"] = r.committed_blocks;
    j["committed_generated_blocks"] = r.committed_generated_blocks;
    j["generated"] = r.generated;
    // The first token's logits, bit for bit: equal digests mean a cached
    // (or promoted) prefix gave exactly the logits of another run.
    j["first_logits_xxh3"] = absl::StrFormat(
        "%016x", XXH3_64bits(r.first_logits.data(),
                             r.first_logits.size() * sizeof(float)));
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "prompt %zu: tokens=%u matched=%u%s ttft=%.2fms decode=%.1f tok/s "
        "committed=%u generated: %s\n",
        prompt, r.prompt_tokens, r.matched_tokens,
        r.cache_degraded ? " (cache unavailable)" : "", r.ttft_s * 1e3,
        r.decode_tokens_per_s, r.committed_blocks,
        absl::StrJoin(r.generated, " ").c_str());
  }
  std::fflush(stdout);
}

int RunCommand(const RunFlags& f) {
  absl::StatusOr<ModelConfig> config = ModelFromFlags(f.model);
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<Device> device = ParseDevice(f.model.device);
  if (!device.ok()) return Fail(device.status());
  const bool text = f.text_option->count() > 0;
  if (text == (f.prompts_option->count() > 0)) {
    return Fail(absl::InvalidArgumentError("give exactly one of --prompts and --text"));
  }
  if (f.decode == 0) return Fail(absl::InvalidArgumentError("--decode must be >= 1"));
  absl::Duration timeout;
  if (!absl::ParseDuration(f.timeout, &timeout)) {  // checked by kDuration
    return Fail(absl::InvalidArgumentError("--timeout: not a duration"));
  }
  auto prompts = ReadPrompts(text ? f.text : f.prompts, text, config->vocab);
  if (!prompts.ok()) return Fail(prompts.status());

  absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(*config, *device);
  if (!model.ok()) return Fail(model.status());
  std::unique_ptr<Client> client;
  absl::StatusOr<std::unique_ptr<PrefixCache>> cache =
      OpenCache(f, *config, timeout, (*model)->on_cuda(), &client);
  if (!cache.ok()) return Fail(cache.status());

  Engine engine(model->get(), cache->get());
  RunOptions options;
  options.decode_tokens = f.decode;
  options.commit_generated = f.commit_generated;
  for (size_t i = 0; i < prompts->size(); ++i) {
    absl::StatusOr<RunResult> r = engine.Run((*prompts)[i], options);
    if (!r.ok()) return Fail(r.status());
    PrintRunResult(i, *r, f);
  }
  return 0;
}

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

int ExportCommand(const ExportFlags& f) {
  absl::StatusOr<ModelConfig> config = ModelFromFlags(f.model);
  if (!config.ok()) return Fail(config.status());
  if (absl::Status s = ExportWeights(*config, f.out); !s.ok()) return Fail(s);
  std::fprintf(stderr, "radixkv-worker: wrote %s (model %s, %llu parameters)\n",
               f.out.c_str(), config->name.c_str(),
               static_cast<unsigned long long>(config->ParameterCount()));
  return 0;
}

// Prints the help of `radixkv-worker help [command]`.
int Help(CLI::App& app, const std::string& topic) {
  if (topic.empty()) {  // app.help() would describe `help` itself
    std::cout << app.get_formatter()->make_help(&app, app.get_name(),
                                                CLI::AppFormatMode::Normal);
    return 0;
  }
  for (const CLI::App* cmd : app.get_subcommands({})) {
    if (cmd->get_name() == topic && !cmd->get_group().empty()) {
      std::cout << cmd->help(app.get_name());
      return 0;
    }
  }
  std::cerr << "Error: unknown command '" << topic
            << "' (commands: run, bench, export-weights)\n";
  return kExitUsage;
}

int Main(int argc, char** argv) {
  CLI::App app(kDescription, "radixkv-worker");
  app.formatter(std::make_shared<HelpFormatter>());
  app.footer(kFooter);
  app.set_help_flag("-h,--help", "help for radixkv-worker or a command");
  app.set_help_all_flag("--help-all", "help for every command");
  app.require_subcommand(0, 1);
  RunFlags run;
  BenchFlags bench;
  ExportFlags export_flags;
  CLI::App* run_cmd = AddRunCommand(app, &run);
  CLI::App* bench_cmd = AddBenchCommand(app, &bench);
  CLI::App* export_cmd = AddExportCommand(app, &export_flags);
  std::string help_topic;
  CLI::App* help_cmd = app.add_subcommand("help", "help for a command");
  help_cmd->group("");  // not listed
  help_cmd->add_option("command", help_topic);
  app.allow_extras();  // an unknown command is reported below, by name
  for (CLI::App* cmd : {run_cmd, bench_cmd, export_cmd, help_cmd}) {
    cmd->allow_extras(false);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --help-all
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "Error: " << e.what()
              << "\nRun 'radixkv-worker --help-all' for the flags.\n";
    return kExitUsage;
  }
  if (const std::vector<std::string> rest = app.remaining(); !rest.empty()) {
    std::cerr << "Error: unknown command or flag '" << rest.front()
              << "' (commands: run, bench, export-weights)\n";
    return kExitUsage;
  }
  if (run_cmd->parsed()) return RunCommand(run);
  if (bench_cmd->parsed()) return BenchCommand(bench);
  if (export_cmd->parsed()) return ExportCommand(export_flags);
  if (help_cmd->parsed()) return Help(app, help_topic);
  std::cerr << app.help()
            << "Error: no command given (run, bench or export-weights)\n";
  return kExitUsage;
}

}  // namespace
}  // namespace radixkv::worker

int main(int argc, char** argv) { return radixkv::worker::Main(argc, argv); }
