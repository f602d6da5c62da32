// File: worker/commands/commands.h
//
// The commands of radixkv-worker (worker/main.cc dispatches to them):
//
//   run             serve prompts through radixkvd, skipping each one's
//                   cached prefix (commands/run.cc)
//   bench           time to first token uncached vs with a cached prefix,
//                   one JSON object (commands/bench.cc)
//   export-weights  the model's config, namespace and weights as one
//                   safetensors file (commands/export_weights.cc)
//
// Each command has a flags struct, an Add...Command that registers the
// subcommand with its flags, help text and footer on a CLI11 app (binding
// the flags by address: the struct must stay where it is until the command
// has run), and a ...Command that runs it after parsing and returns the
// process's exit code (0 ok, kExitError, kExitUsage; common.h), having
// printed any error on stderr.
//
// Thread safety: none needed; everything runs on the main thread.
#ifndef RADIXKV_CLIENT_WORKER_COMMANDS_COMMANDS_H_
#define RADIXKV_CLIENT_WORKER_COMMANDS_COMMANDS_H_

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "worker/commands/common.h"

namespace radixkv::worker::commands {

// ---- run ------------------------------------------------------------------

struct RunFlags {
  ModelFlags model;
  std::string prompts;  // --prompts FILE: token ids
  std::string text;     // --text FILE: bytes as tokens
  // Set by AddRunCommand; tell which of --prompts and --text was given.
  CLI::Option* prompts_option = nullptr;
  CLI::Option* text_option = nullptr;
  uint32_t decode = 16;
  bool commit_generated = false;
  bool no_cache = false;
  bool json = false;
  std::string endpoint;  // empty: the daemon's default socket
  std::string timeout = "5s";
};

CLI::App* AddRunCommand(CLI::App& app, RunFlags* f);
int RunCommand(const RunFlags& f);

// ---- bench ----------------------------------------------------------------

struct BenchFlags {
  ModelFlags model;
  uint32_t prefix_tokens = 1856;
  uint32_t suffix_tokens = 192;
  uint32_t repeat = 5;
  uint32_t eval_prompts = 0;  // 0: no accuracy evaluation
  uint32_t eval_tokens = 512;
  uint32_t eval_decode = 16;
  bool json = false;  // accepted; the output is JSON either way
};

CLI::App* AddBenchCommand(CLI::App& app, BenchFlags* f);
int BenchCommand(const BenchFlags& f);

// ---- export-weights -------------------------------------------------------

struct ExportWeightsFlags {
  ModelFlags model;  // --device is not offered
  std::string out;
};

CLI::App* AddExportWeightsCommand(CLI::App& app, ExportWeightsFlags* f);
int ExportWeightsCommand(const ExportWeightsFlags& f);

}  // namespace radixkv::worker::commands

#endif  // RADIXKV_CLIENT_WORKER_COMMANDS_COMMANDS_H_
