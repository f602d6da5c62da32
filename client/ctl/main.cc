// radixkvctl: the operator CLI of radixkvd (etcdctl-like).
//
//   radixkvctl [--endpoint E] [--timeout D] [-o text|json] <command> [flags] [args]
//
// Global flags may appear before or after the command; each can also come
// from RADIXKVCTL_ENDPOINT / RADIXKVCTL_TIMEOUT / RADIXKVCTL_OUTPUT (a flag
// overrides its variable). See docs/CLI.md.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/ctl/ctl.h"
#include "radixkv/defaults.h"

namespace radixkv::ctl {
namespace {

constexpr char kGlobalHelp[] =
    "Global flags (also from environment variables):\n"
    "  --endpoint=E      radixkvd address: /path or unix:/path (Unix socket) or\n"
    "                    host:port; default the daemon's default socket\n"
    "                    [RADIXKVCTL_ENDPOINT]\n"
    "  --timeout=D       deadline of each call, e.g. 5s, 500ms (default 5s)\n"
    "                    [RADIXKVCTL_TIMEOUT]\n"
    "  -o, --output=F    text (tables for people) or json (one protobuf JSON\n"
    "                    object per line) [RADIXKVCTL_OUTPUT]\n"
    "  -h, --help        help for radixkvctl or a command\n";

constexpr char kExitCodesHelp[] =
    "Exit codes:\n"
    "  0  ok\n"
    "  1  error (the daemon answered with an error, I/O failed)\n"
    "  2  daemon unreachable or deadline exceeded\n"
    "  3  bad arguments (unknown command or flag, bad value)\n"
    "  4  unhealthy (health: the daemon is not SERVING)\n";

std::vector<Command> AllCommands() {
  std::vector<Command> all = AdminCommands();
  for (Command& c : KeyCommands()) all.push_back(std::move(c));
  return all;
}

const Command* Find(const std::vector<Command>& commands,
                    const std::string& name) {
  for (const Command& c : commands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

void PrintMainHelp(const std::vector<Command>& commands, std::ostream& out) {
  out << "radixkvctl: inspect and operate radixkvd, the prefix-caching KV "
         "store.\n\n"
         "Usage:\n  radixkvctl [global flags] <command> [flags] [args]\n";
  std::vector<std::string> groups;
  for (const Command& c : commands) {
    bool seen = false;
    for (const auto& g : groups) seen |= g == c.group;
    if (!seen) groups.push_back(c.group);
  }
  for (const std::string& g : groups) {
    out << "\n" << g << ":\n";
    for (const Command& c : commands) {
      if (c.group != g) continue;
      out << "  " << c.name << std::string(12 - std::min<size_t>(c.name.size(), 11), ' ')
          << c.summary << "\n";
    }
  }
  out << "\n" << kGlobalHelp << "\n" << kExitCodesHelp
      << "\nRun 'radixkvctl help <command>' or 'radixkvctl <command> --help' "
         "for a command's flags and an example.\n";
}

void PrintCommandHelp(const Command& c, std::ostream& out) {
  out << c.summary << "\n\nUsage:\n  radixkvctl [global flags] " << c.name;
  if (!c.flags.empty()) out << " [flags]";
  if (!c.usage.empty()) out << " " << c.usage;
  out << "\n";
  if (!c.details.empty()) out << "\n" << c.details << "\n";
  if (!c.flags.empty()) {
    out << "\nFlags:\n";
    for (const FlagSpec& f : c.flags) {
      std::string left = absl::StrCat("  --", f.name, f.takes_value ? "=V" : "");
      out << left << std::string(left.size() < 22 ? 22 - left.size() : 2, ' ')
          << f.help << "\n";
    }
  }
  out << "\nExample:\n";
  for (absl::string_view line : absl::StrSplit(c.example, '\n')) {
    out << "  " << line << "\n";
  }
  out << "\n" << kGlobalHelp;
}

// Applies a global flag; returns false when `name` is not one.
bool IsGlobalFlag(const std::string& name) {
  return name == "endpoint" || name == "timeout" || name == "output" ||
         name == "o";
}

absl::Status ApplyGlobal(const std::string& name, const std::string& value,
                         GlobalOptions* g) {
  if (name == "endpoint") {
    g->endpoint = value;
  } else if (name == "timeout") {
    absl::Duration d;
    double seconds = 0;
    if (absl::SimpleAtod(value, &seconds)) {
      d = absl::Seconds(seconds);
    } else if (!absl::ParseDuration(value, &d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--timeout=", value, ": want a duration such as 5s or 500ms"));
    }
    if (d <= absl::ZeroDuration() || d > absl::Hours(24)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--timeout=", value, ": must be above 0 and at most 24h"));
    }
    g->timeout = d;
  } else {  // output / o
    if (value == "text" || value == "table") {
      g->output = OutputFormat::kText;
    } else if (value == "json") {
      g->output = OutputFormat::kJson;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--output=", value, ": want text or json"));
    }
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Context ctx;
  ctx.out = &std::cout;
  ctx.err = &std::cerr;
  const std::vector<Command> commands = AllCommands();

  // Environment first; flags override.
  for (const auto& [var, flag] :
       std::vector<std::pair<const char*, const char*>>{
           {"RADIXKVCTL_ENDPOINT", "endpoint"},
           {"RADIXKVCTL_TIMEOUT", "timeout"},
           {"RADIXKVCTL_OUTPUT", "output"}}) {
    const char* v = std::getenv(var);
    if (v == nullptr || v[0] == '\0') continue;
    absl::Status s = ApplyGlobal(flag, v, &ctx.global);
    if (!s.ok()) return BadArgs(ctx, absl::StrCat(var, ": ", s.message()));
  }

  std::vector<std::string> args(argv + 1, argv + argc);
  const Command* command = nullptr;
  bool help = false;
  bool flags_done = false;
  std::vector<std::string> help_topic;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!flags_done && a == "--") {
      flags_done = true;
      continue;
    }
    if (!flags_done && a.size() > 1 && a[0] == '-') {
      std::string name, value;
      bool has_value = false;
      if (a == "-h" || a == "--help") {
        help = true;
        continue;
      }
      if (a == "-o") {
        name = "output";
      } else if (absl::StartsWith(a, "-o") && a.size() > 2 && a[2] != '-') {
        name = "output";  // -ojson
        value = a.substr(2);
        has_value = true;
      } else if (absl::StartsWith(a, "--")) {
        name = a.substr(2);
        const size_t eq = name.find('=');
        if (eq != std::string::npos) {
          value = name.substr(eq + 1);
          name.resize(eq);
          has_value = true;
        }
      } else {
        return BadArgs(ctx, absl::StrCat("unknown flag ", a,
                                         " (flags are --name=value)"));
      }
      const FlagSpec* spec = nullptr;
      if (command != nullptr) {
        for (const FlagSpec& f : command->flags) {
          if (f.name == name) spec = &f;
        }
      }
      const bool global = spec == nullptr && IsGlobalFlag(name);
      if (spec == nullptr && !global) {
        return BadArgs(
            ctx, command == nullptr
                     ? absl::StrCat("unknown global flag --", name)
                     : absl::StrCat("unknown flag --", name, " for command '",
                                    command->name, "' (see radixkvctl ",
                                    command->name, " --help)"));
      }
      const bool takes_value = global || spec->takes_value;
      if (takes_value && !has_value) {
        if (i + 1 >= args.size()) {
          return BadArgs(ctx, absl::StrCat("flag --", name, " needs a value"));
        }
        value = args[++i];
      } else if (!takes_value && has_value && value != "true") {
        if (value == "false") continue;
        return BadArgs(ctx, absl::StrCat("flag --", name, " takes no value"));
      }
      if (global) {
        absl::Status s = ApplyGlobal(name, value, &ctx.global);
        if (!s.ok()) return BadArgs(ctx, std::string(s.message()));
      } else {
        ctx.args.Set(name, value);
      }
      continue;
    }
    if (command == nullptr && help_topic.empty() && a == "help") {
      help = true;
      help_topic.push_back(a);
      continue;
    }
    if (command == nullptr) {
      command = Find(commands, a);
      if (command == nullptr) {
        if (help) return BadArgs(ctx, absl::StrCat("unknown command '", a, "'"));
        return BadArgs(ctx, absl::StrCat("unknown command '", a,
                                         "' (see radixkvctl --help)"));
      }
      continue;
    }
    ctx.args.AddPositional(a);
  }

  if (help) {
    if (command != nullptr) {
      PrintCommandHelp(*command, std::cout);
    } else {
      PrintMainHelp(commands, std::cout);
    }
    return kExitOk;
  }
  if (command == nullptr) {
    PrintMainHelp(commands, std::cerr);
    return BadArgs(ctx, "no command given");
  }
  absl::StatusOr<std::string> target = GrpcTargetForEndpoint(
      ctx.global.endpoint);
  if (!target.ok()) {
    return BadArgs(ctx, absl::StrCat("--", target.status().message()));
  }
  ctx.global.target = *target;
  return command->run(ctx);
}

}  // namespace
}  // namespace radixkv::ctl

int main(int argc, char** argv) { return radixkv::ctl::Main(argc, argv); }
