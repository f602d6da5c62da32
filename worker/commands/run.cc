// File: worker/commands/run.cc
//
// `radixkv-worker run`: serves each prompt of a file through radixkvd
// (skipping its cached prefix) and prints, per prompt, its tokens, matched
// tokens, time to first token, decode rate and generated tokens (a line, or
// one JSON object with --json). With --no-cache, or when the daemon does not
// answer (a note on stderr), every prompt is prefilled in full and the
// output tokens are the same.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "client/client.h"
#include "nlohmann/json.hpp"
#include "radixkv/defaults.h"
#include "worker/commands/commands.h"
#include "worker/engine.h"
#include "worker/prefix_cache.h"
#include "xxhash.h"

namespace radixkv::worker::commands {
namespace {

// A positive duration as absl::ParseDuration reads it ("5s", "500ms").
const CLI::Validator kDuration(
    [](std::string& value) -> std::string {
      absl::Duration d;
      if (absl::ParseDuration(value, &d) && d > absl::ZeroDuration()) return "";
      return value + ": want a positive duration such as 5s or 500ms";
    },
    "");

constexpr char kRunFooter[] =
    "Per prompt: prefill only the uncached suffix, decode greedily, commit\n"
    "the new full blocks.\n"
    "FILE holds one prompt per line: --prompts, token ids separated by\n"
    "spaces or commas; --text, each line's bytes are its tokens.\n"
    "Without a daemon (or with --no-cache) every prompt is prefilled in\n"
    "full and the output tokens are the same.\n\n"
    "Example:\n"
    "  radixkv-worker run --text prompt.txt --model small --decode 16";

// The non-empty lines of `path` as prompts: bytes (`text`) or token ids
// separated by spaces, commas or tabs. NOT_FOUND when the file cannot be
// opened; INVALID_ARGUMENT naming the line for a bad id or a token >=
// `vocab`, or when there is no prompt.
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

}  // namespace

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

}  // namespace radixkv::worker::commands
