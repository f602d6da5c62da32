// File: client/ctl/ctl.h
//
// The command framework of radixkvctl (etcdctl-like): global options, the
// Command table, exit codes and the helpers shared by the command files.
//
//   radixkvctl [--endpoint E] [--timeout D] [-o text|json] <command> [flags] [args]
//
// Each command file contributes a list of Command descriptors (name, group,
// one-line summary, example, details, and how it binds its flags): each
// command has an options struct whose fields its CLI11 flags fill (values
// checked by CLI11 validators while parsing) and a run function taking that
// struct. main.cc turns them into CLI11 subcommands, parses the command line
// and prints grouped help.
// A command that asks the daemon one question goes through CallAndPrint.
//
// Thread safety: single-threaded use (one command per process), except the
// SIGINT handling of `watch`, which is documented there.
#ifndef RADIXKV_CLIENT_CTL_CTL_H_
#define RADIXKV_CLIENT_CTL_CTL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "radix/block_key.h"

namespace radixkv::ctl {

// Exit codes (documented in `radixkvctl --help` and docs/CLI.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,        // the daemon answered with an error, or I/O failed
  kExitUnreachable = 2,  // no connection, or the deadline passed
  kExitBadArgs = 3,      // unknown command/flag, bad value, missing argument
  kExitUnhealthy = 4,    // `health`: the daemon is not SERVING
};

enum class OutputFormat { kText, kJson };

struct GlobalOptions {
  std::string endpoint;  // as given; empty = the daemon's default socket
  std::string target;    // the gRPC target derived from it
  absl::Duration timeout = absl::Seconds(5);
  OutputFormat output = OutputFormat::kText;
};

// In a list of completion values: complete file names.
inline constexpr char kAnyPath[] = "<path>";

// What shell completion offers for an option's value or a positional
// argument: words, or {kAnyPath}.
using CompletionValues = std::map<const CLI::Option*, std::vector<std::string>>;

struct Context {
  GlobalOptions global;
  std::ostream* out = nullptr;  // stdout: data only
  std::ostream* err = nullptr;  // stderr: errors, prompts

  // Writes the shell completion script of this command line for `shell`
  // ("bash", "zsh", "fish") to `out`; set by main before a command runs.
  std::function<absl::Status(const std::string& shell, std::ostream& out)>
      write_completion;

  bool json() const { return global.output == OutputFormat::kJson; }
  // The channel to the daemon, created on first use.
  std::shared_ptr<grpc::Channel> Channel();

 private:
  std::shared_ptr<grpc::Channel> channel_;
};

// A command, bound to the options struct its flags fill: run once the
// command line has parsed.
using BoundRun = std::function<int(Context& ctx)>;

struct Command {
  std::string name;
  std::string group;    // help section
  std::string summary;  // one line
  std::string example;  // one or more example lines
  std::string details;  // optional extra paragraph
  // Adds the command's flags, then its positional arguments, to `app` (the
  // command's subcommand), bound to a new options struct; records what
  // completion offers for their values in `values`. Returns the command
  // bound to that struct.
  std::function<BoundRun(CLI::App& app, CompletionValues& values)> bind;
};

// The `bind` of a command whose flags `add_flags` adds to an `Options`
// struct and which `run` runs with that struct.
template <typename Options>
std::function<BoundRun(CLI::App&, CompletionValues&)> CommandWith(
    void (*add_flags)(CLI::App& app, Options& options,
                      CompletionValues& values),
    int (*run)(Context& ctx, const Options& options)) {
  return [add_flags, run](CLI::App& app, CompletionValues& values) {
    auto options = std::make_shared<Options>();
    add_flags(app, *options, values);
    return BoundRun(
        [options, run](Context& ctx) { return run(ctx, *options); });
  };
}

// The options of a command without flags.
struct NoOptions {};
inline void AddNoFlags(CLI::App&, NoOptions&, CompletionValues&) {}

// A command flag's value that the command cannot take, thrown by the flag's
// CLI11 validator while the command line is parsed. what() is the whole
// message ("--limit=0: want an integer in 1..10000"); main reports it as
// "Error: <what>" with exit 3 once the command line is otherwise sound (help,
// unknown flags and arguments, the endpoint are answered first).
class FlagValueError : public CLI::ParseError {
 public:
  explicit FlagValueError(const std::string& message)
      : CLI::ParseError("FlagValueError", message,
                        CLI::ExitCodes::ValidationError) {}
};

// Adds the flag --`name`, which takes a value (help: "--name=V"), bound to
// `*value`.
template <typename T>
CLI::Option* AddValueFlag(CLI::App& app, const std::string& name, T* value,
                          const std::string& help) {
  return app.add_option("--" + name, *value, help)->type_name("V");
}

// Adds the boolean flag --`name` (no value; --name=false is accepted and
// leaves it off), bound to `*on`.
CLI::Option* AddBoolFlag(CLI::App& app, const std::string& name, bool* on,
                         const std::string& help);

// `text`, the value of --`name`, as an unsigned integer in [min, max]
// (absl::SimpleAtoi syntax); else INVALID_ARGUMENT
// "--name=text: want an integer in min..max".
absl::StatusOr<uint64_t> ParseUintFlag(const std::string& name,
                                       const std::string& text, uint64_t min,
                                       uint64_t max);

// The upper bound of an unsigned integer flag, evaluated when its value is
// validated (it may depend on another flag); an error fails the parse with
// its message.
using UintMax = std::function<absl::StatusOr<uint64_t>()>;

// The CLI11 transform of an unsigned integer flag: a value ParseUintFlag
// accepts for [min, max()] is handed on as plain decimal (what the bound
// integer receives); another throws FlagValueError with ParseUintFlag's
// message. Only the value that counts (the last one given) is checked.
CLI::Validator UintRange(const std::string& name, uint64_t min, UintMax max);

// Adds --`name` bound to the unsigned integer `*value` (an integer type, or
// std::optional of one: set only when the flag is given), accepting
// integers in [min, max] (UintRange). `max` must fit T.
template <typename T>
CLI::Option* AddUintFlag(CLI::App& app, const std::string& name, T* value,
                         uint64_t min, uint64_t max, const std::string& help) {
  return AddValueFlag(app, name, value, help)
      ->transform(UintRange(name, min, [max]() -> absl::StatusOr<uint64_t> {
        return max;
      }));
}

// Adds the positional arguments `name` (e.g. "TOKENS": any number of them)
// bound to `*args`.
CLI::Option* AddPositional(CLI::App& app, const std::string& name,
                           std::vector<std::string>* args,
                           const std::string& help);

std::vector<Command> AdminCommands();  // health endpoint stats namespaces sessions tree evict clear watch
std::vector<Command> KeyCommands();    // match explain hash size version

// Adds --no-headers, the flag of commands that print a table, bound to
// `*no_headers`; such a command calls ApplyNoHeaders before printing.
CLI::Option* AddNoHeadersFlag(CLI::App& app, bool* no_headers);
// Turns Headers(*ctx.out) off when --no-headers was given.
void ApplyNoHeaders(Context& ctx, bool no_headers);

// Prints "Error: <message>" on ctx.err and returns the exit code for the
// status: 2 for UNAVAILABLE/DEADLINE_EXCEEDED (with the endpoint named), 3 for
// INVALID_ARGUMENT, 1 otherwise.
int Fail(Context& ctx, const absl::Status& status);
// Prints "Error: <message>" and returns kExitBadArgs.
int BadArgs(Context& ctx, const std::string& message);

// Writes a command's result to ctx.out: with -o json, `json_line()` and a
// newline; else `print_text()`. Returns kExitOk.
int PrintResult(Context& ctx, absl::FunctionRef<std::string()> json_line,
                absl::FunctionRef<void()> print_text);

// One unary call to the daemon, bound to its stub, request and response:
// invoked once with the call's context.
using UnaryCall = absl::FunctionRef<grpc::Status(grpc::ClientContext*)>;

// Runs `call` with a deadline of now + `timeout`; returns its status.
absl::Status CallWithDeadline(UnaryCall call, absl::Duration timeout);

// The body of a command that asks the daemon one question: runs `call` with
// the --timeout deadline; a failed call goes through Fail (its "Error:" line
// and exit code); an answer is printed by PrintResult, as `response` in the
// JSON form of ToJsonLine (output.h) or by `print_text`. `response` is the
// message `call` fills.
int CallAndPrint(Context& ctx, const google::protobuf::Message& response,
                 UnaryCall call, absl::FunctionRef<void()> print_text);

// The same for a method of a generated stub; `print_text` writes the
// response to the stream it is given (ctx.out), e.g.
//   return CallAndPrint(ctx, &v1::Admin::Stub::DumpTree, req, PrintTree);
template <typename Stub, typename Request, typename Response>
int CallAndPrint(
    Context& ctx,
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                 Response*),
    const Request& request,
    std::type_identity_t<
        absl::FunctionRef<void(const Response&, std::ostream&)>>
        print_text) {
  Stub stub(ctx.Channel());
  Response response;
  return CallAndPrint(
      ctx, response,
      [&](grpc::ClientContext* call) {
        return (stub.*method)(call, request, &response);
      },
      [&] { print_text(response, *ctx.out); });
}

// The namespace flags shared by match, explain and hash.
struct NamespaceOptions {
  std::optional<std::string> model;  // required; may be empty
  std::string model_revision;
  std::string lora;
  std::string salt;
  std::optional<uint32_t> layers;  // required
  std::optional<uint32_t> kv_heads;  // required
  std::optional<uint32_t> head_dim;  // required
  uint32_t page_size = 16;
  std::optional<std::string> dtype;  // required; ParseDType
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  std::string layout;  // ParseLayout
};
// Adds those flags, bound to `*ns`. Values are checked while parsing:
// --layers, --kv-heads, --head-dim and --tp-size in 1..2^32-1 (`raw`: from
// 0), --page-size in 1..2^32-1, --tp-rank below --tp-size (`raw`: any
// 32-bit value).
void AddNamespaceFlags(CLI::App& app, NamespaceOptions* ns,
                       CompletionValues& values, bool raw);
// Builds a NamespaceSpec from those flags. --model, --layers, --kv-heads,
// --head-dim and --dtype are required; --page-size defaults to 16,
// --tp-size to 1, --layout to per-layer (ParseLayout). INVALID_ARGUMENT
// names the flag. `raw` (for `hash`, which hashes whatever it is given, as
// the contract's test vectors do) also accepts dtype 0 ("unspecified"), and
// any xlayer:S[:W] values; it must be what the flags were added with.
absl::StatusOr<NamespaceSpec> NamespaceFromOptions(const NamespaceOptions& ns,
                                                   bool raw = false);
// Parses a --layout value into spec->cross_layer: "per-layer" or empty
// (none), or "xlayer:S[:W]" (layers S.. share one K/V bank, W the local
// window, 0 when omitted; docs/CONTRACTS.md §2.2). With `check`, S and W
// must be serveable for spec->num_layers (CheckCrossLayerKv: 1 <= S <
// layers, W <= 65536). INVALID_ARGUMENT names --layout and the rule.
absl::Status ParseLayout(const std::string& layout, bool check,
                         NamespaceSpec* spec);
// Parses a dtype name: fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8 (also the long
// forms float16, bfloat16, DTYPE_FLOAT16, ...) or the enum number; with
// `allow_unspecified` also 0 / "unspecified".
absl::StatusOr<DType> ParseDType(const std::string& name,
                                 bool allow_unspecified = false);
const char* DTypeShortName(uint32_t dtype);
// The short dtype names, fp32 .. int8 (what completion offers for --dtype).
std::vector<std::string> DTypeNames();

// Adds --file PATH, the file token ids may come from, bound to `*path`.
CLI::Option* AddTokenFileFlag(CLI::App& app, std::optional<std::string>* path,
                              CompletionValues& values);
// Adds the positional TOKENS, bound to `*args`.
CLI::Option* AddTokensPositional(CLI::App& app,
                                 std::vector<std::string>* args);
// Token ids from positional arguments ("1 2 3", "1,2,3") and/or the file
// `path` (--file: ids separated by whitespace or commas). INVALID_ARGUMENT
// names the bad token; an empty list is an error unless `allow_empty`.
absl::StatusOr<std::vector<uint32_t>> ParseTokens(
    const std::vector<std::string>& args,
    const std::optional<std::string>& path, bool allow_empty = false);

}  // namespace radixkv::ctl

#endif  // RADIXKV_CLIENT_CTL_CTL_H_
