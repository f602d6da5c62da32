// radixkvctl: the operator CLI of radixkvd (etcdctl-like).
//
//   radixkvctl [--endpoint E] [--timeout D] [-o text|json] <command> [flags] [args]
//
// The command line is parsed by CLI11: each Command becomes a subcommand
// whose flags are plain strings (the command checks their values through
// Args, so that every message names the flag). Global flags may appear
// before or after the command (the subcommands fall through to the root);
// each can also come from RADIXKVCTL_ENDPOINT / RADIXKVCTL_TIMEOUT /
// RADIXKVCTL_OUTPUT, and a flag overrides its variable. See docs/CLI.md.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/ctl/ctl.h"

namespace radixkv::ctl {
namespace {

constexpr char kDescription[] =
    "radixkvctl: inspect and operate radixkvd, the prefix-caching KV store.";

constexpr char kGlobalGroup[] =
    "Global flags (also from environment variables)";

constexpr char kMainFooter[] =
    "Exit codes:\n"
    "  0  ok\n"
    "  1  error (the daemon answered with an error, I/O failed)\n"
    "  2  daemon unreachable or deadline exceeded\n"
    "  3  bad arguments (unknown command or flag, bad value)\n"
    "  4  unhealthy (health: the daemon is not SERVING)\n"
    "\n"
    "Run 'radixkvctl help <command>' or 'radixkvctl <command> --help' for a\n"
    "command's flags and an example.";

// ---- global flags -------------------------------------------------------------

absl::Status ApplyEndpoint(const std::string& value, GlobalOptions* g) {
  g->endpoint = value;
  return absl::OkStatus();
}

absl::Status ApplyTimeout(const std::string& value, GlobalOptions* g) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(value, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(value, &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout=", value, ": want a duration such as 5s or 500ms"));
  }
  if (d <= absl::ZeroDuration() || d > absl::Hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout=", value, ": must be above 0 and at most 24h"));
  }
  g->timeout = d;
  return absl::OkStatus();
}

absl::Status ApplyOutput(const std::string& value, GlobalOptions* g) {
  if (value == "text" || value == "table") {
    g->output = OutputFormat::kText;
  } else if (value == "json") {
    g->output = OutputFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--output=", value, ": want text or json"));
  }
  return absl::OkStatus();
}

struct GlobalFlag {
  const char* names;  // CLI11 option names
  const char* env;    // the variable it may come from
  const char* value;  // the value's placeholder in help
  const char* help;
  absl::Status (*apply)(const std::string& value, GlobalOptions* g);
};

constexpr GlobalFlag kGlobalFlags[] = {
    {"--endpoint", "RADIXKVCTL_ENDPOINT", "E",
     "radixkvd address: /path or unix:/path (Unix socket) or\n"
     "host:port; default the daemon's default socket",
     ApplyEndpoint},
    {"--timeout", "RADIXKVCTL_TIMEOUT", "D",
     "deadline of each call, e.g. 5s, 500ms (default 5s)", ApplyTimeout},
    {"-o,--output", "RADIXKVCTL_OUTPUT", "F",
     "text (tables for people) or json (one protobuf JSON\n"
     "object per line)",
     ApplyOutput},
};

// ---- help -------------------------------------------------------------------------

// Breaks `text` into lines of at most `width` characters at spaces.
std::string Wrap(const std::string& text, size_t width) {
  std::string out;
  size_t line = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line > 0 && line + 1 + word.size() > width) {
      out += "\n";
      line = 0;
    } else if (line > 0) {
      out += " ";
      ++line;
    }
    absl::StrAppend(&out, word);
    line += word.size();
  }
  return out;
}

// The help layout of radixkvctl on top of CLI11's formatter:
//   root:    description, usage, commands by group, global flags, exit codes;
//   command: summary, usage, arguments, flags, details and example, then the
//            global flags (the root's options) again.
// Flags print as "--name=V", with the variable a flag may come from.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    column_width(24);
    label("Positionals", "Arguments");
  }

  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    std::string out =
        absl::StrCat(app->get_description(), "\n\n", make_usage(app, name));
    const CLI::App* root = app->get_parent();
    if (root == nullptr) {
      absl::StrAppend(&out, make_subcommands(app, mode), make_groups(app, mode),
                      "\n", make_footer(app));
    } else {
      absl::StrAppend(&out, make_positionals(app), make_groups(app, mode),
                      "\n", make_footer(app),
                      make_groups(root, CLI::AppFormatMode::Normal));
    }
    return out;
  }

  std::string make_usage(const CLI::App* app, std::string) const override {
    const CLI::App* root = app->get_parent();
    if (root == nullptr) {
      return absl::StrCat("Usage:\n  ", app->get_name(),
                          " [global flags] <command> [flags] [args]\n");
    }
    std::string usage = absl::StrCat("Usage:\n  ", root->get_name(),
                                     " [global flags] ", app->get_name());
    if (!app->get_options(
                [](const CLI::Option* o) { return o->nonpositional(); })
             .empty()) {
      usage += " [flags]";
    }
    for (const CLI::Option* o : app->get_options(
             [](const CLI::Option* o) { return o->get_positional(); })) {
      absl::StrAppend(&usage, " [", o->get_name(true, false), "...]");
    }
    return usage + "\n";
  }

  std::string make_subcommand(const CLI::App* sub) const override {
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_name(), sub->get_description(), 14);
    return out.str();
  }

  std::string make_option_name(const CLI::Option* opt,
                               bool is_positional) const override {
    if (is_positional) return opt->get_name(true, false) + "...";
    std::vector<std::string> names;
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    return absl::StrJoin(names, ", ");
  }

  // Value flags carry a type name ("E", "V"); boolean flags have none.
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (opt->get_positional() || opt->get_type_name().empty()) return "";
    return "=" + opt->get_type_name();
  }

  // The description (wrapped unless it breaks its own lines), then the
  // variable the flag may come from: on the last line when it fits, else on
  // a line of its own.
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    if (desc.find('\n') == std::string::npos) desc = Wrap(desc, kDescWidth);
    const std::string& env = opt->get_envname();
    if (env.empty()) return desc;
    const size_t last_line = desc.size() - (desc.rfind('\n') + 1);
    const bool fits = last_line + env.size() + 3 <= kDescWidth;
    absl::StrAppend(&desc, fits ? " " : "\n", "[", env, "]");
    return desc;
  }

 private:
  static constexpr size_t kDescWidth = 56;  // 80 columns less the names
};

// ---- commands ---------------------------------------------------------------------

// A Command as a CLI11 subcommand; its options fill Context::args.
struct BoundCommand {
  const Command* command = nullptr;
  CLI::App* app = nullptr;
  std::vector<std::pair<const FlagSpec*, CLI::Option*>> flags;
  std::vector<std::string> positional;
};

std::vector<Command> AllCommands() {
  std::vector<Command> all = AdminCommands();
  for (Command& c : KeyCommands()) all.push_back(std::move(c));
  return all;
}

std::string CommandFooter(const Command& c) {
  std::string footer;
  if (!c.details.empty()) footer = Wrap(c.details, 78) + "\n\n";
  footer += "Example:";
  for (absl::string_view line : absl::StrSplit(c.example, '\n')) {
    absl::StrAppend(&footer, "\n  ", line);
  }
  return footer;
}

void Bind(CLI::App& root, const Command& c, BoundCommand* bound) {
  bound->command = &c;
  bound->app = root.add_subcommand(c.name, c.summary);
  CLI::App* sub = bound->app;
  sub->group(c.group);
  sub->set_help_flag();  // the root's -h/--help serves every command
  sub->allow_extras(false);
  sub->footer(CommandFooter(c));
  for (const FlagSpec& f : c.flags) {
    CLI::Option* o = f.takes_value
                         ? sub->add_option("--" + f.name)->type_name("V")
                         : sub->add_flag("--" + f.name);
    o->description(f.help);
    bound->flags.emplace_back(&f, o);
  }
  if (!c.positional.empty()) {
    sub->add_option(c.positional, bound->positional,
                    "token ids, separate or comma lists")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
}

// Copies the flags the command line gave into `args`.
void FillArgs(const BoundCommand& bound, Args* args) {
  for (const auto& [spec, option] : bound.flags) {
    if (option->count() == 0) continue;
    if (!spec->takes_value) {
      if (option->as<bool>()) args->Set(spec->name, "true");
    } else {
      args->Set(spec->name, option->as<std::string>());
    }
  }
  for (const std::string& p : bound.positional) args->AddPositional(p);
}

// The argument vector for CLI11 (reversed, as App::parse wants it).
// "--flag=" becomes "--flag" "" : CLI11 would otherwise take the next
// argument as the value, and "--model=" names the empty model.
std::vector<std::string> ParserArgs(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      args.insert(args.end(), argv + i, argv + argc);
      break;
    }
    if (absl::StartsWith(a, "--") && absl::EndsWith(a, "=")) {
      args.push_back(a.substr(0, a.size() - 1));
      args.emplace_back();
    } else {
      args.push_back(a);
    }
  }
  return std::vector<std::string>(args.rbegin(), args.rend());
}

// The message for an argument nobody accepted (CLI11's "remaining").
std::string Unexpected(const std::string& arg, const CLI::App* command) {
  if (absl::StartsWith(arg, "-") && arg.size() > 1) {
    const std::string flag = arg.substr(0, arg.find('='));
    if (command == nullptr) {
      return absl::StrCat("unknown global flag ", flag,
                          " (see radixkvctl --help)");
    }
    return absl::StrCat("unknown flag ", flag, " for command '",
                        command->get_name(), "' (see radixkvctl ",
                        command->get_name(), " --help)");
  }
  if (command == nullptr) {
    return absl::StrCat("unknown command '", arg, "' (see radixkvctl --help)");
  }
  return absl::StrCat("unexpected argument '", arg, "' for command '",
                      command->get_name(), "' (see radixkvctl ",
                      command->get_name(), " --help)");
}

int Main(int argc, char** argv) {
  Context ctx;
  ctx.out = &std::cout;
  ctx.err = &std::cerr;

  // A bad variable is an error even where a flag overrides it; checking it
  // here lets the message name the variable.
  for (const GlobalFlag& g : kGlobalFlags) {
    const char* v = std::getenv(g.env);
    if (v == nullptr || v[0] == '\0') continue;
    absl::Status s = g.apply(v, &ctx.global);
    if (!s.ok()) return BadArgs(ctx, absl::StrCat(g.env, ": ", s.message()));
  }

  CLI::App app(kDescription, "radixkvctl");
  app.formatter(std::make_shared<HelpFormatter>());
  app.fallthrough();
  app.require_subcommand(0, 1);
  app.footer(kMainFooter);
  app.option_defaults()->group(kGlobalGroup);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "help for radixkvctl or a command");
  for (const GlobalFlag& g : kGlobalFlags) {
    app.add_option_function<std::string>(
           g.names,
           [&ctx, &g](const std::string& value) {
             absl::Status s = g.apply(value, &ctx.global);
             if (!s.ok()) throw CLI::ValidationError(std::string(s.message()));
           },
           g.help)
        ->envname(g.env)
        ->type_name(g.value);
  }
  app.option_defaults()->group("Flags");

  const std::vector<Command> commands = AllCommands();
  std::vector<BoundCommand> bound(commands.size());  // never resized
  for (size_t i = 0; i < commands.size(); ++i) {
    Bind(app, commands[i], &bound[i]);
  }
  std::string help_topic;
  CLI::App* help =
      app.add_subcommand("help", "help for radixkvctl or a command");
  help->group("");  // not listed: the usage line and footer name it
  help->set_help_flag();
  help->add_option("command", help_topic);
  app.allow_extras();  // unknown arguments are reported below, by name

  try {
    app.parse(ParserArgs(argc, argv));
  } catch (const CLI::CallForHelp&) {
    *ctx.out << app.help();  // the selected command's, if any
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    return BadArgs(ctx, e.what());
  }

  const std::vector<CLI::App*> selected = app.get_subcommands();
  const CLI::App* command = selected.empty() ? nullptr : selected.front();
  if (const std::vector<std::string> rest = app.remaining(); !rest.empty()) {
    return BadArgs(ctx, Unexpected(rest.front(), command));
  }
  if (command == help) {
    if (help_topic.empty()) {  // app.help() would describe `help` itself
      *ctx.out << app.get_formatter()->make_help(&app, app.get_name(),
                                                 CLI::AppFormatMode::Normal);
      return kExitOk;
    }
    for (const BoundCommand& b : bound) {
      if (b.command->name == help_topic) {
        *ctx.out << b.app->help(app.get_name());
        return kExitOk;
      }
    }
    return BadArgs(ctx, absl::StrCat("unknown command '", help_topic, "'"));
  }
  if (command == nullptr) {
    *ctx.err << app.help();
    return BadArgs(ctx, "no command given");
  }

  for (const BoundCommand& b : bound) {
    if (b.app != command) continue;
    FillArgs(b, &ctx.args);
    absl::StatusOr<std::string> target =
        GrpcTargetForEndpoint(ctx.global.endpoint);
    if (!target.ok()) {
      return BadArgs(ctx, absl::StrCat("--", target.status().message()));
    }
    ctx.global.target = *target;
    return b.command->run(ctx);
  }
  return BadArgs(ctx, "no command given");
}

}  // namespace
}  // namespace radixkv::ctl

int main(int argc, char** argv) { return radixkv::ctl::Main(argc, argv); }
