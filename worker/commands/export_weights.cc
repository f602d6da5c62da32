// File: worker/commands/export_weights.cc
//
// `radixkv-worker export-weights`: writes the model of the given flags
// (configuration, namespace and weights) as one safetensors file
// (worker/weights_export.h) and names it on stderr. The same model flags as
// for run give the same namespace.
#include <cstdio>

#include "worker/commands/commands.h"
#include "worker/weights_export.h"

namespace radixkv::worker::commands {
namespace {

constexpr char kExportFooter[] =
    "Writes the model's configuration, its namespace and every weight its\n"
    "forward pass uses as one safetensors file (the format is described in\n"
    "worker/README.md), so that another implementation runs the\n"
    "identical model and shares its cached blocks. The same model flags as\n"
    "for run give the same namespace.\n\n"
    "Example:\n"
    "  radixkv-worker export-weights --model small --out small.safetensors";

}  // namespace

CLI::App* AddExportWeightsCommand(CLI::App& app, ExportWeightsFlags* f) {
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

int ExportWeightsCommand(const ExportWeightsFlags& f) {
  absl::StatusOr<ModelConfig> config = ModelFromFlags(f.model);
  if (!config.ok()) return Fail(config.status());
  if (absl::Status s = ExportWeights(*config, f.out); !s.ok()) return Fail(s);
  std::fprintf(stderr, "radixkv-worker: wrote %s (model %s, %llu parameters)\n",
               f.out.c_str(), config->name.c_str(),
               static_cast<unsigned long long>(config->ParameterCount()));
  return 0;
}

}  // namespace radixkv::worker::commands
