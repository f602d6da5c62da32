// radixkvctl: the operator CLI of radixkvd (etcdctl-like).
//
//   radixkvctl [--endpoint E] [--timeout D] [-o text|json] <command> [flags] [args]
//
// The command line is parsed by CLI11: each Command becomes a subcommand
// whose flags fill the command's options struct; their validators check the
// values, with messages that name the flag. Global flags may appear
// before or after the command (the subcommands fall through to the root);
// each can also come from RADIXKVCTL_ENDPOINT / RADIXKVCTL_TIMEOUT /
// RADIXKVCTL_OUTPUT, and a flag overrides its variable. `completion` prints a
// bash, zsh or fish script generated from the same CLI11 app. --version
// prints "radixkvctl VERSION" and exits 0. See docs/CLI.md.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/ctl/ctl.h"
#include "client/ctl/output.h"

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
  const char* values;  // what completion offers: words, or kAnyPath
};

constexpr GlobalFlag kGlobalFlags[] = {
    {"--endpoint", "RADIXKVCTL_ENDPOINT", "E",
     "radixkvd address: /path or unix:/path (Unix socket) or\n"
     "host:port; default the daemon's default socket",
     ApplyEndpoint, kAnyPath},
    {"--timeout", "RADIXKVCTL_TIMEOUT", "D",
     "deadline of each call, e.g. 5s, 500ms (default 5s)", ApplyTimeout, ""},
    {"-o,--output", "RADIXKVCTL_OUTPUT", "F",
     "text (tables for people) or json (one JSON object per\n"
     "line: counts as numbers, keys as hex)",
     ApplyOutput, "text json"},
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

// A Command as a CLI11 subcommand, bound to the options its flags fill.
struct BoundCommand {
  const Command* command = nullptr;
  CLI::App* app = nullptr;
  BoundRun run;
};

std::vector<Command> ShellCommands();

std::vector<Command> AllCommands() {
  std::vector<Command> all = AdminCommands();
  for (Command& c : KeyCommands()) all.push_back(std::move(c));
  for (Command& c : ShellCommands()) all.push_back(std::move(c));
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

void Bind(CLI::App& root, const Command& c, BoundCommand* bound,
          CompletionValues* values) {
  bound->command = &c;
  bound->app = root.add_subcommand(c.name, c.summary);
  CLI::App* sub = bound->app;
  sub->group(c.group);
  sub->set_help_flag();  // the root's -h/--help serves every command
  sub->allow_extras(false);
  sub->footer(CommandFooter(c));
  bound->run = c.bind(*sub, *values);
}

// The argument vector for CLI11 (reversed, as App::parse wants it).
// "--flag=" becomes "--flag" "" : CLI11 would otherwise take the next
// argument as the value, and "--model=" names the empty model. "-o=json"
// becomes "-o" "json", as "--output=json" is read (CLI11 would take
// "=json" as the value).
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
    } else if (a.size() >= 3 && a[0] == '-' && absl::ascii_isalpha(a[1]) &&
               a[2] == '=') {
      args.push_back(a.substr(0, 2));
      args.push_back(a.substr(3));
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
    if (command->get_option_no_throw(flag) != nullptr) {
      return absl::StrCat("flag ", flag, " of command '", command->get_name(),
                          "' must follow the command: radixkvctl ",
                          command->get_name(), " ", flag, " ...");
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

// ---- shell completion ---------------------------------------------------------
//
// The scripts (output.h) are generated from the CLI11 app (its subcommands,
// options and descriptions) and the CompletionValues recorded while binding,
// so they offer exactly what the parser accepts.

CompletionItem ItemOf(const CLI::Option* o, const CompletionValues& values) {
  CompletionItem item;
  if (o->get_positional()) item.names.push_back(o->get_name(true, false));
  for (const std::string& s : o->get_snames()) item.names.push_back("-" + s);
  for (const std::string& l : o->get_lnames()) item.names.push_back("--" + l);
  item.takes_value = o->get_expected_max() > 0;  // flags expect none
  item.help = absl::StrReplaceAll(o->get_description(), {{"\n", " "}});
  if (auto it = values.find(o); it != values.end()) {
    item.paths = it->second == std::vector<std::string>{kAnyPath};
    if (!item.paths) item.values = it->second;
  }
  return item;
}

CompletionModel ModelOf(const CLI::App& app, const CompletionValues& values) {
  CompletionModel model;
  for (const CLI::Option* o : app.get_options(
           [](const CLI::Option* o) { return o->nonpositional(); })) {
    model.globals.push_back(ItemOf(o, values));
  }
  for (const CLI::App* sub :
       app.get_subcommands([](const CLI::App*) { return true; })) {
    CompletionCommand c;
    c.name = sub->get_name();
    c.summary = sub->get_description();
    for (const CLI::Option* o : sub->get_options()) {
      (o->get_positional() ? c.positionals : c.flags)
          .push_back(ItemOf(o, values));
    }
    model.commands.push_back(std::move(c));
  }
  return model;
}

struct Shell {
  const char* name;
  std::string (*script)(const CompletionModel& model);
};

constexpr Shell kShells[] = {{"bash", BashCompletion},
                              {"zsh", ZshCompletion},
                              {"fish", FishCompletion}};

std::vector<std::string> ShellNames() {
  std::vector<std::string> names;
  for (const Shell& s : kShells) names.push_back(s.name);
  return names;
}

// "bash, zsh or fish".
std::string ShellList() {
  const std::vector<std::string> names = ShellNames();
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

struct CompletionOptions {
  std::vector<std::string> shells;  // positional: exactly one is valid
};

void AddCompletionFlags(CLI::App& app, CompletionOptions& o,
                        CompletionValues& values) {
  const std::vector<std::string> shells = ShellNames();
  values[AddPositional(app, "SHELL", &o.shells, ShellList())] = shells;
}

int RunCompletion(Context& ctx, const CompletionOptions& o) {
  const std::vector<std::string>& shells = o.shells;
  if (shells.size() != 1) {
    return BadArgs(ctx, absl::StrCat("completion: name one shell: ",
                                     ShellList()));
  }
  const absl::Status s = ctx.write_completion(shells[0], *ctx.out);
  return s.ok() ? kExitOk : Fail(ctx, s);
}

std::vector<Command> ShellCommands() {
  // name, group, summary, example, details, flags and run
  return {
      {"completion", "Shell",
       "Print a bash, zsh or fish script that completes commands and flags",
       "source <(radixkvctl completion bash)\n"
       "radixkvctl completion zsh > \"${fpath[1]}/_radixkvctl\"\n"
       "radixkvctl completion fish > ~/.config/fish/completions/radixkvctl.fish",
       "The script completes commands, flags and flag values (output "
       "formats, dtypes, files); it is generated from this radixkvctl's own "
       "command table. bash: source it, or save it as "
       "/etc/bash_completion.d/radixkvctl. zsh: save it as _radixkvctl in a "
       "directory of $fpath, or source it after compinit. fish: pipe it to "
       "`source`, or save it as radixkvctl.fish in "
       "~/.config/fish/completions.",
       CommandWith(AddCompletionFlags, RunCompletion)},
  };
}

// Writes the completion script for `shell` of `app` to `out`.
absl::Status WriteCompletion(const CLI::App& app,
                             const CompletionValues& values,
                             const std::string& shell, std::ostream& out) {
  for (const Shell& s : kShells) {
    if (shell == s.name) {
      out << s.script(ModelOf(app, values));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("completion: unknown shell '", shell, "': want ",
                   ShellList()));
}

// The command line of radixkvctl: the CLI11 app and what its parse fills.
struct Cli {
  explicit Cli(size_t commands) : bound(commands) {}

  CLI::App app{kDescription, "radixkvctl"};
  std::vector<BoundCommand> bound;  // one per Command; never resized
  CLI::App* help = nullptr;         // the `help` subcommand
  std::string help_topic;           // its argument
  CompletionValues values;
};

// Sets up `cli`: global flags that apply to ctx.global as they are parsed,
// one subcommand per command, and `help`.
void BuildApp(Context& ctx, const std::vector<Command>& commands, Cli* cli) {
  CLI::App& app = cli->app;
  app.formatter(std::make_shared<HelpFormatter>());
  app.fallthrough();
  app.require_subcommand(0, 1);
  app.footer(kMainFooter);
  app.option_defaults()->group(kGlobalGroup);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "help for radixkvctl or a command");
  app.set_version_flag("--version", "radixkvctl " RADIXKV_VERSION,
                       "print radixkvctl's version and exit");
  for (const GlobalFlag& g : kGlobalFlags) {
    CLI::Option* o =
        app.add_option_function<std::string>(
               g.names,
               [&ctx, &g](const std::string& value) {
                 absl::Status s = g.apply(value, &ctx.global);
                 if (!s.ok()) {
                   throw CLI::ValidationError(std::string(s.message()));
                 }
               },
               g.help)
            ->envname(g.env)
            ->type_name(g.value);
    if (g.values[0] != '\0') {
      cli->values[o] = absl::StrSplit(g.values, ' ');
    }
  }
  app.option_defaults()->group("Flags");

  std::vector<std::string> names;
  for (size_t i = 0; i < commands.size(); ++i) {
    Bind(app, commands[i], &cli->bound[i], &cli->values);
    names.push_back(commands[i].name);
  }
  cli->help = app.add_subcommand("help", "help for radixkvctl or a command");
  cli->help->group("");  // not listed: the usage line and footer name it
  cli->help->set_help_flag();
  cli->values[cli->help->add_option("command", cli->help_topic)] = names;
  app.allow_extras();  // unknown arguments are reported below, by name
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

  const std::vector<Command> commands = AllCommands();
  Cli cli(commands.size());
  BuildApp(ctx, commands, &cli);
  CLI::App& app = cli.app;
  const std::vector<BoundCommand>& bound = cli.bound;
  ctx.write_completion = [&cli](const std::string& shell, std::ostream& out) {
    return WriteCompletion(cli.app, cli.values, shell, out);
  };

  // A command flag's bad value (FlagValueError) stops CLI11 before it looks
  // at --help; help, unknown arguments and a bad endpoint are answered first.
  std::string bad_value;
  try {
    app.parse(ParserArgs(argc, argv));
  } catch (const CLI::CallForHelp&) {
    *ctx.out << app.help();  // the selected command's, if any
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    *ctx.out << e.what() << "\n";
    return kExitOk;
  } catch (const FlagValueError& e) {
    bad_value = e.what();
  } catch (const CLI::ParseError& e) {
    return BadArgs(ctx, e.what());
  }
  if (!bad_value.empty() && app.get_help_ptr()->count() > 0) {
    *ctx.out << app.help();
    return kExitOk;
  }

  const std::vector<CLI::App*> selected = app.get_subcommands();
  const CLI::App* command = selected.empty() ? nullptr : selected.front();
  if (const std::vector<std::string> rest = app.remaining(); !rest.empty()) {
    return BadArgs(ctx, Unexpected(rest.front(), command));
  }
  if (command == cli.help) {
    const std::string& help_topic = cli.help_topic;
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
    absl::StatusOr<std::string> target =
        GrpcTargetForEndpoint(ctx.global.endpoint);
    if (!target.ok()) {
      return BadArgs(ctx, absl::StrCat("--", target.status().message()));
    }
    if (!bad_value.empty()) return BadArgs(ctx, bad_value);
    ctx.global.target = *target;
    return b.run(ctx);
  }
  return BadArgs(ctx, "no command given");
}

}  // namespace
}  // namespace radixkv::ctl

int main(int argc, char** argv) { return radixkv::ctl::Main(argc, argv); }
