// radixkv-worker: the reference worker.
//
//   radixkv-worker run --prompts FILE | --text FILE [--model tiny] [--decode N]
//                      [--commit-generated] [--no-cache] [--json]
//                      [--endpoint E] [--timeout D] [model overrides]
//   radixkv-worker bench [--model small] [--prefix-tokens P]
//                        [--suffix-tokens S] [--repeat R] [--json]
//   both: [--device auto|cpu|cuda]
//
// `run` serves each prompt through radixkvd (skipping its cached prefix) and
// prints tokens, matched tokens, time to first token, decode rate and the
// generated tokens; without a daemon it prefills everything and prints the
// same tokens. `bench` measures time to first token uncached vs with the
// first P tokens cached (in-process cache) and prints one JSON object.
//
// Exit codes: 0 ok, 1 error, 3 bad arguments.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/worker/engine.h"
#include "client/worker/model.h"
#include "client/worker/prefix_cache.h"
#include "gpu/kv_parallel.h"
#include "radix/status_macros.h"
#include "radixkv/defaults.h"

namespace radixkv::worker {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 3;

constexpr char kUsage[] =
    "Usage:\n"
    "  radixkv-worker run (--prompts FILE | --text FILE) [flags]\n"
    "      Serve prompts through radixkvd: prefill only the uncached suffix,\n"
    "      decode greedily, commit new full blocks. FILE: one prompt per line\n"
    "      (--prompts: token ids separated by spaces or commas; --text: each\n"
    "      line's bytes are its tokens).\n"
    "      --decode=N            tokens to generate per prompt (default 16)\n"
    "      --commit-generated    also commit full blocks of generated tokens\n"
    "      --no-cache            do not contact the daemon (full prefills)\n"
    "      --endpoint=E          radixkvd endpoint (default: the daemon's\n"
    "                            default socket, as radixkvctl)\n"
    "      --timeout=D           deadline of each call, e.g. 5s (default 5s)\n"
    "      --json                one JSON object per prompt\n"
    "  radixkv-worker bench [flags]\n"
    "      Time to first token of one prompt uncached vs with its first P\n"
    "      tokens cached (in-process cache, in device memory on cuda);\n"
    "      prints one JSON object.\n"
    "      --prefix-tokens=P (default 1856)  --suffix-tokens=S (default 192)\n"
    "      --repeat=R  best of R timed runs each (default 5)\n"
    "  Model flags (both commands):\n"
    "      --model=tiny|small|base (run: tiny, bench: small)\n"
    "      --device=auto|cpu|cuda  where forward passes run (default auto:\n"
    "                            cuda when a device and cuBLAS are present)\n"
    "      --layers --d-model --q-heads --kv-heads --head-dim --ffn --vocab\n"
    "      --page-size --seed --tied     override the named size\n"
    "Exit codes: 0 ok, 1 error, 3 bad arguments.\n";

struct Args {
  std::string command;
  std::map<std::string, std::string> flags;  // name -> value ("" for bools)
};

const char* const kBoolFlags[] = {"commit-generated", "no-cache", "json",
                                  "tied", "help"};

bool IsBoolFlag(const std::string& name) {
  for (const char* b : kBoolFlags)
    if (name == b) return true;
  return false;
}

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      if (!a.command.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument ", s));
      }
      a.command = s;
      continue;
    }
    s = s.substr(2);
    std::string name = s, value;
    const size_t eq = s.find('=');
    if (eq != std::string::npos) {
      name = s.substr(0, eq);
      value = s.substr(eq + 1);
    } else if (!IsBoolFlag(name)) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = argv[++i];
    }
    a.flags[name] = value;
  }
  return a;
}

class Flags {
 public:
  explicit Flags(std::map<std::string, std::string> f) : f_(std::move(f)) {}
  bool Has(const std::string& n) { used_.insert(n); return f_.count(n) > 0; }
  std::string Str(const std::string& n, const std::string& def) {
    return Has(n) ? f_[n] : def;
  }
  absl::StatusOr<uint32_t> U32(const std::string& n, uint32_t def) {
    if (!Has(n)) return def;
    uint32_t v;
    if (!absl::SimpleAtoi(f_[n], &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", n, "=", f_[n], ": want a non-negative integer"));
    }
    return v;
  }
  // Flags given but never asked for.
  absl::Status CheckAllUsed() const {
    for (const auto& [name, value] : f_) {
      if (!used_.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
      }
    }
    return absl::OkStatus();
  }

 private:
  std::map<std::string, std::string> f_;
  std::set<std::string> used_;
};

absl::StatusOr<ModelConfig> ModelFromFlags(Flags& f, const std::string& def) {
  ASSIGN_OR_RETURN(ModelConfig c, NamedModelConfig(f.Str("model", def)));
  ASSIGN_OR_RETURN(c.num_layers, f.U32("layers", c.num_layers));
  ASSIGN_OR_RETURN(c.d_model, f.U32("d-model", c.d_model));
  ASSIGN_OR_RETURN(c.num_q_heads, f.U32("q-heads", c.num_q_heads));
  ASSIGN_OR_RETURN(c.num_kv_heads, f.U32("kv-heads", c.num_kv_heads));
  ASSIGN_OR_RETURN(c.head_dim, f.U32("head-dim", c.head_dim));
  ASSIGN_OR_RETURN(c.ffn_dim, f.U32("ffn", c.ffn_dim));
  ASSIGN_OR_RETURN(c.vocab, f.U32("vocab", c.vocab));
  ASSIGN_OR_RETURN(c.page_size, f.U32("page-size", c.page_size));
  uint32_t seed;
  ASSIGN_OR_RETURN(seed, f.U32("seed", static_cast<uint32_t>(c.seed)));
  c.seed = seed;
  if (f.Has("tied")) c.tied_embeddings = true;
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

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

int RunCommand(Flags& f) {
  absl::StatusOr<ModelConfig> config = ModelFromFlags(f, "tiny");
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<Device> device = ParseDevice(f.Str("device", "auto"));
  if (!device.ok()) return Fail(device.status());
  const bool text = f.Has("text");
  if (text == f.Has("prompts")) {
    return Fail(absl::InvalidArgumentError("give exactly one of --prompts and --text"));
  }
  absl::StatusOr<uint32_t> decode = f.U32("decode", 16);
  if (!decode.ok()) return Fail(decode.status());
  if (*decode == 0) return Fail(absl::InvalidArgumentError("--decode must be >= 1"));
  const bool json = f.Has("json");
  const bool no_cache = f.Has("no-cache");
  const bool commit_generated = f.Has("commit-generated");
  const std::string endpoint = f.Str("endpoint", DefaultSocketPath());
  absl::Duration timeout = absl::Seconds(5);
  if (f.Has("timeout") &&
      (!absl::ParseDuration(f.Str("timeout", ""), &timeout) ||
       timeout <= absl::ZeroDuration())) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--timeout=", f.Str("timeout", ""),
                     ": want a positive duration such as 5s or 500ms")));
  }
  if (absl::Status s = f.CheckAllUsed(); !s.ok()) return Fail(s);
  auto prompts = ReadPrompts(f.Str(text ? "text" : "prompts", ""), text,
                             config->vocab);
  if (!prompts.ok()) return Fail(prompts.status());

  absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(*config, *device);
  if (!model.ok()) return Fail(model.status());

  std::unique_ptr<Client> client;
  std::unique_ptr<PrefixCache> cache;
  if (no_cache) {
    cache = NewNoPrefixCache();
  } else {
    ClientOptions options;
    options.endpoint = endpoint;
    options.call_timeout = timeout;
    options.connect_timeout = timeout;
    options.initial_wait = timeout;
    options.ns = config->Namespace();
    options.client_name = "radixkv-worker";
    options.attach_pool = true;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(options);
    if (!c.ok()) return Fail(c.status());
    client = std::move(*c);
    if (!client->connected()) {
      std::cerr << "radixkv-worker: no session with radixkvd at " << endpoint
                << " (" << client->state().last_error.message()
                << "); prefilling without the cache\n";
    }
    cache = NewDaemonPrefixCache(client.get(),
                                 /*accept_device_pages=*/(*model)->on_cuda());
  }

  Engine engine(model->get(), cache.get());
  RunOptions options;
  options.decode_tokens = *decode;
  options.commit_generated = commit_generated;
  for (size_t i = 0; i < prompts->size(); ++i) {
    absl::StatusOr<RunResult> r = engine.Run((*prompts)[i], options);
    if (!r.ok()) return Fail(r.status());
    if (json) {
      std::printf(
          "{\"prompt\":%zu,\"tokens\":%u,\"matched_tokens\":%u,"
          "\"cache\":\"%s\",\"ttft_s\":%.6f,\"decode_tokens_per_s\":%.2f,"
          "\"committed_blocks\":%u,\"committed_generated_blocks\":%u,"
          "\"generated\":[%s]}\n",
          i, r->prompt_tokens, r->matched_tokens,
          no_cache ? "none" : (r->cache_degraded ? "degraded" : "daemon"),
          r->ttft_s, r->decode_tokens_per_s, r->committed_blocks,
          r->committed_generated_blocks,
          absl::StrJoin(r->generated, ",").c_str());
    } else {
      std::printf(
          "prompt %zu: tokens=%u matched=%u%s ttft=%.2fms decode=%.1f tok/s "
          "committed=%u generated: %s\n",
          i, r->prompt_tokens, r->matched_tokens,
          r->cache_degraded ? " (cache unavailable)" : "", r->ttft_s * 1e3,
          r->decode_tokens_per_s, r->committed_blocks,
          absl::StrJoin(r->generated, " ").c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

int BenchCommand(Flags& f) {
  absl::StatusOr<ModelConfig> config = ModelFromFlags(f, "small");
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<Device> device = ParseDevice(f.Str("device", "auto"));
  if (!device.ok()) return Fail(device.status());
  absl::StatusOr<uint32_t> p = f.U32("prefix-tokens", 1856);
  absl::StatusOr<uint32_t> s = f.U32("suffix-tokens", 192);
  absl::StatusOr<uint32_t> repeat = f.U32("repeat", 5);
  for (const auto* v : {&p, &s, &repeat})
    if (!v->ok()) return Fail(v->status());
  (void)f.Has("json");  // the output is JSON either way
  if (absl::Status st = f.CheckAllUsed(); !st.ok()) return Fail(st);
  if (*s == 0) return Fail(absl::InvalidArgumentError("--suffix-tokens must be >= 1"));
  if (*repeat == 0) return Fail(absl::InvalidArgumentError("--repeat must be >= 1"));
  if (uint64_t{*p} + *s > (1u << 20)) {
    return Fail(absl::InvalidArgumentError("prefix + suffix tokens must be <= 1048576"));
  }
  absl::StatusOr<std::unique_ptr<Model>> model = CreateModel(*config, *device);
  if (!model.ok()) return Fail(model.status());

  const uint32_t n = *p + *s;
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
  if (*p > 0) {
    RunOptions fill;
    auto r = cached.Run(absl::MakeConstSpan(prompt).subspan(0, *p), fill);
    if (!r.ok()) return Fail(r.status());
  }
  double best_uncached = INFINITY, best_cached = INFINITY, diff = 0;
  uint32_t matched = 0;
  for (uint32_t i = 0; i < *repeat; ++i) {
    auto u = uncached.Run(prompt, measure);
    if (!u.ok()) return Fail(u.status());
    auto c = cached.Run(prompt, measure);
    if (!c.ok()) return Fail(c.status());
    best_uncached = std::min(best_uncached, u->ttft_s);
    best_cached = std::min(best_cached, c->ttft_s);
    matched = c->matched_tokens;
    for (size_t j = 0; j < u->first_logits.size(); ++j) {
      diff = std::max<double>(diff, std::fabs(u->first_logits[j] - c->first_logits[j]));
    }
  }
  const double ideal =
      ForwardFlops(*config, 0, n) / ForwardFlops(*config, matched, n - matched);
  const double speedup = best_uncached / best_cached;
  std::printf(
      "{\"model\":\"%s\",\"device\":\"%s\",\"prefix_tokens\":%u,\"suffix_tokens\":%u,"
      "\"matched_tokens\":%u,\"ttft_uncached_s\":%.6f,\"ttft_cached_s\":%.6f,"
      "\"speedup\":%.3f,\"ideal_speedup\":%.3f,\"fraction_of_ideal\":%.3f,"
      "\"max_abs_logit_diff\":%.3g,\"threads\":%zu,\"repeat\":%u,"
      "\"parameters\":%llu}\n",
      config->name.c_str(), (*model)->on_cuda() ? "cuda" : "cpu", *p, *s,
      matched, best_uncached, best_cached,
      speedup, ideal, speedup / ideal, diff, gpu::KernelThreads(), *repeat,
      static_cast<unsigned long long>(config->ParameterCount()));
  return 0;
}

}  // namespace
}  // namespace radixkv::worker

int main(int argc, char** argv) {
  using namespace radixkv::worker;
  absl::StatusOr<Args> args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::cerr << "Error: " << args.status().message() << "\n" << kUsage;
    return kExitUsage;
  }
  if (args->command.empty() || args->command == "help" || args->flags.count("help")) {
    std::cout << kUsage;
    return args->command.empty() && !args->flags.count("help") ? kExitUsage : 0;
  }
  Flags flags(args->flags);
  if (args->command == "run") return RunCommand(flags);
  if (args->command == "bench") return BenchCommand(flags);
  std::cerr << "Error: unknown command \"" << args->command << "\"\n" << kUsage;
  return kExitUsage;
}
