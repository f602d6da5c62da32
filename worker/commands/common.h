// File: worker/commands/common.h
//
// Helpers shared by the commands of radixkv-worker (commands.h): exit
// codes, the uint32 flag parser, the model flags (named size, per-field
// overrides, device, kv dtype, cross-layer layout) and their translation to
// a ModelConfig, model creation with its device note, and error reporting.
//
// Flags are bound to CLI11 by address: a ModelFlags must stay where it is
// from AddModelFlags until the command has run.
//
// Thread safety: none needed; everything runs on the main thread.
#ifndef RADIXKV_CLIENT_WORKER_COMMANDS_COMMON_H_
#define RADIXKV_CLIENT_WORKER_COMMANDS_COMMON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model.h"

namespace radixkv::worker::commands {

// Exit codes: 0 ok, kExitError for a failure while running, kExitUsage for
// bad arguments (unknown flag, bad value, unreadable or invalid input).
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 3;

// Adds a uint32 flag, in decimal only (no 0x, leading zeros do not mean
// octal), with its default shown in help.
CLI::Option* AddUint(CLI::App* cmd, const std::string& name, uint32_t* value,
                     const std::string& help);

// The model flags of a command: a named size, per-field overrides and the
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

// Adds --model (default `default_model`), --device, --kv-dtype, the
// per-field overrides, --seed and --tied to `cmd`, bound to *f.
void AddModelFlags(CLI::App* cmd, const std::string& default_model,
                   ModelFlags* f);

// Adds the cross-layer flags (--layout, --xlayer-from, --xlayer-window,
// --xlayer-topk) to `cmd`, bound to *f.
void AddLayoutFlags(CLI::App* cmd, ModelFlags* f);

// The named size with the given overrides, kv dtype and layout applied;
// NOT_FOUND for an unknown size, INVALID_ARGUMENT for a config that fails
// Validate(). Does not read f.device.
absl::StatusOr<ModelConfig> ModelFromFlags(const ModelFlags& f);

// Creates the model on `device`; a one-line note on stderr when auto fell
// back to the CPU.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelConfig& config,
                                                   Device device);

// Prints "Error: <message>" on stderr and returns the exit code:
// kExitUsage for INVALID_ARGUMENT and NOT_FOUND, kExitError otherwise.
int Fail(const absl::Status& s);

// `v` rounded to `decimals` places: the JSON number stays short.
double Rounded(double v, int decimals);

}  // namespace radixkv::worker::commands

#endif  // RADIXKV_CLIENT_WORKER_COMMANDS_COMMON_H_
