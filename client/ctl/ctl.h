// File: client/ctl/ctl.h
//
// The command framework of radixkvctl (etcdctl-like): global options, a
// command's parsed flags and arguments (Args), the Command table, exit codes
// and the helpers shared by the command files.
//
//   radixkvctl [--endpoint E] [--timeout D] [-o text|json] <command> [flags] [args]
//
// Each command file contributes a list of Command descriptors (name, group,
// one-line summary, usage, example, flags, run function); main.cc turns them
// into CLI11 subcommands, parses the command line and prints grouped help.
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
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

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

// A command-specific flag. Boolean flags take no value ("--yes").
struct FlagSpec {
  std::string name;  // without the leading dashes
  bool takes_value = true;
  std::string help;
  // The values shell completion offers for it; {kAnyPath}: file names.
  std::vector<std::string> values = {};
};

// A command's parsed flags and positional arguments.
class Args {
 public:
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The flag's value, or `fallback` when absent.
  std::string Get(const std::string& name,
                  const std::string& fallback = "") const;
  // Unsigned integer flag in [min, max]; INVALID_ARGUMENT names the flag and
  // the range. Absent: `fallback`.
  absl::StatusOr<uint64_t> GetUint(const std::string& name, uint64_t fallback,
                                   uint64_t min, uint64_t max) const;
  // Like GetUint, but the flag must be present.
  absl::StatusOr<uint64_t> RequireUint(const std::string& name, uint64_t min,
                                       uint64_t max) const;
  const std::vector<std::string>& positional() const { return positional_; }

  void Set(const std::string& name, std::string value) {
    values_[name] = std::move(value);
  }
  void AddPositional(std::string arg) { positional_.push_back(std::move(arg)); }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

struct Context {
  GlobalOptions global;
  Args args;
  std::ostream* out = nullptr;  // stdout: data only
  std::ostream* err = nullptr;  // stderr: errors, prompts

  // Writes the shell completion script of this command line for `shell`
  // ("bash", "zsh") to `out`; set by main before a command runs.
  std::function<absl::Status(const std::string& shell, std::ostream& out)>
      write_completion;

  bool json() const { return global.output == OutputFormat::kJson; }
  // The channel to the daemon, created on first use.
  std::shared_ptr<grpc::Channel> Channel();

 private:
  std::shared_ptr<grpc::Channel> channel_;
};

struct Command {
  std::string name;
  std::string group;       // help section
  std::string summary;     // one line
  std::string positional;  // name of the positional arguments ("TOKENS");
                           // empty: the command takes none
  std::string example;     // one or more example lines
  std::string details;     // optional extra paragraph
  std::vector<FlagSpec> flags;
  int (*run)(Context& ctx) = nullptr;
  // Help for the positional arguments.
  std::string positional_help = "token ids, separate or comma lists";
  // The values shell completion offers for the positional arguments.
  std::vector<std::string> positional_values = {};
};

std::vector<Command> AdminCommands();  // health stats namespaces sessions tree evict clear watch
std::vector<Command> KeyCommands();    // match explain hash size version

// The flag of commands that print a table: --no-headers (main turns
// Headers(ctx.out) off when it is given).
FlagSpec NoHeadersFlag();

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
std::vector<FlagSpec> NamespaceFlags();
// Builds a NamespaceSpec from those flags. --model, --layers, --kv-heads,
// --head-dim and --dtype are required; --page-size defaults to 16,
// --tp-size to 1, --layout to per-layer (ParseLayout). INVALID_ARGUMENT
// names the flag. `raw` (for `hash`, which hashes whatever it is given, as
// the contract's test vectors do) also accepts 0 for the layout fields,
// tp_size and dtype ("unspecified"), and any xlayer:S[:W] values.
absl::StatusOr<NamespaceSpec> NamespaceFromArgs(const Args& args,
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

// Token ids from positional arguments ("1 2 3", "1,2,3") and/or --file PATH
// (ids separated by whitespace or commas). INVALID_ARGUMENT names the bad
// token; an empty list is an error unless `allow_empty`.
absl::StatusOr<std::vector<uint32_t>> TokensFromArgs(const Args& args,
                                                     bool allow_empty = false);

}  // namespace radixkv::ctl

#endif  // RADIXKV_CLIENT_CTL_CTL_H_
