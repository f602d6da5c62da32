// File: worker/main.cc
//
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
//   radixkv-worker help [run|bench|export-weights]
//
// This file builds the CLI11 app (description, footer, help layout, the
// hidden `help` command), registers each command (worker/commands/
// commands.h) and runs the one given. `radixkv-worker --help-all` lists
// every flag.
//
// Exit codes: 0 ok, 1 error, 3 bad arguments (also for no command, an
// unknown command and an unknown flag).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "worker/commands/commands.h"
#include "worker/commands/common.h"

namespace radixkv::worker::commands {
namespace {

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
  ExportWeightsFlags export_weights;
  CLI::App* run_cmd = AddRunCommand(app, &run);
  CLI::App* bench_cmd = AddBenchCommand(app, &bench);
  CLI::App* export_cmd = AddExportWeightsCommand(app, &export_weights);
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
  if (export_cmd->parsed()) return ExportWeightsCommand(export_weights);
  if (help_cmd->parsed()) return Help(app, help_topic);
  std::cerr << app.help()
            << "Error: no command given (run, bench or export-weights)\n";
  return kExitUsage;
}

}  // namespace
}  // namespace radixkv::worker::commands

int main(int argc, char** argv) {
  return radixkv::worker::commands::Main(argc, argv);
}
