// Shared helpers of radixkvctl commands: flag binding and value checks,
// namespace and token parsing, the daemon channel, calls with a deadline, the error -> exit code
// mapping and result printing.
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ctl/ctl.h"
#include "client/ctl/output.h"
#include "client/status.h"
#include "gpu/namespace_geometry.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "radixkv/channel.h"
#include "radixkv/defaults.h"

namespace radixkv::ctl {
namespace {

constexpr uint64_t kU32Max = 0xffffffffu;

}  // namespace

CLI::Option* AddBoolFlag(CLI::App& app, const std::string& name, bool* on,
                         const std::string& help) {
  return app.add_flag("--" + name, *on, help);
}

absl::StatusOr<uint64_t> ParseUintFlag(const std::string& name,
                                       const std::string& text, uint64_t min,
                                       uint64_t max) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, "=", text, ": want an integer in ", min, "..", max));
  }
  return v;
}

CLI::Validator UintRange(const std::string& name, uint64_t min, UintMax max) {
  CLI::Validator range(
      [name, min, max](std::string& value) {
        absl::StatusOr<uint64_t> bound = max();
        if (!bound.ok()) throw FlagValueError(std::string(bound.status().message()));
        absl::StatusOr<uint64_t> v = ParseUintFlag(name, value, min, *bound);
        if (!v.ok()) throw FlagValueError(std::string(v.status().message()));
        value = absl::StrCat(*v);  // CLI11 would read "010" as octal
        return std::string();
      },
      "", "UintRange");
  // The options take the last value given: with TakeLast, CLI11 numbers
  // the earlier values below 0, so index 0 is the one that counts.
  range.application_index(0);
  return range;
}

CLI::Option* AddPositional(CLI::App& app, const std::string& name,
                           std::vector<std::string>* args,
                           const std::string& help) {
  return app.add_option(name, *args, help)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

std::shared_ptr<grpc::Channel> Context::Channel() {
  if (channel_ == nullptr) {
    channel_ = grpc::CreateCustomChannel(global.target,
                                         grpc::InsecureChannelCredentials(),
                                         ClientChannelArguments());
  }
  return channel_;
}

absl::Status CallWithDeadline(UnaryCall call, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return FromGrpcStatus(call(&context));
}

int PrintResult(Context& ctx, absl::FunctionRef<std::string()> json_line,
                absl::FunctionRef<void()> print_text) {
  if (ctx.json()) {
    *ctx.out << json_line() << "\n";
  } else {
    print_text();
  }
  return kExitOk;
}

int CallAndPrint(Context& ctx, const google::protobuf::Message& response,
                 UnaryCall call, absl::FunctionRef<void()> print_text) {
  const absl::Status status = CallWithDeadline(call, ctx.global.timeout);
  if (!status.ok()) return Fail(ctx, status);
  return PrintResult(ctx, [&] { return ToJsonLine(response); }, print_text);
}

int Fail(Context& ctx, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: {
      // A socket that cannot be connected to says why in the OS's words
      // (no such file, permission denied, nothing listening).
      const std::string problem = ConnectProblem(
          ctx.global.target, /*defaulted=*/ctx.global.endpoint.empty());
      if (!problem.empty()) {
        *ctx.err << "Error: radixkvd is unreachable: " << problem << "\n";
        return kExitUnreachable;
      }
      *ctx.err << "Error: radixkvd at " << ctx.global.target
               << " is unreachable or did not answer within "
               << absl::FormatDuration(ctx.global.timeout) << ": "
               << status.message() << "\n";
      return kExitUnreachable;
    }
    case absl::StatusCode::kInvalidArgument:
      *ctx.err << "Error: " << status.message() << "\n";
      return kExitBadArgs;
    default:
      *ctx.err << "Error: " << absl::StatusCodeToString(status.code()) << ": "
               << status.message() << "\n";
      return kExitError;
  }
}

int BadArgs(Context& ctx, const std::string& message) {
  *ctx.err << "Error: " << message << "\n";
  return kExitBadArgs;
}

void AddNamespaceFlags(CLI::App& app, NamespaceOptions* ns,
                       CompletionValues& values, bool raw) {
  const uint64_t min = raw ? 0 : 1;
  AddValueFlag(app, "model", &ns->model,
               "model name (required; may be empty: --model=)");
  AddValueFlag(app, "model-revision", &ns->model_revision, "weights revision");
  AddValueFlag(app, "lora", &ns->lora, "LoRA adapter name");
  AddValueFlag(app, "salt", &ns->salt, "tenant cache salt");
  AddUintFlag(app, "layers", &ns->layers, min, kU32Max,
              "number of layers (required)");
  AddUintFlag(app, "kv-heads", &ns->kv_heads, min, kU32Max,
              "number of KV heads (required)");
  AddUintFlag(app, "head-dim", &ns->head_dim, min, kU32Max,
              "head dimension (required)");
  AddUintFlag(app, "page-size", &ns->page_size, 1, kU32Max,
              "tokens per block (default 16)");
  values[AddValueFlag(app, "dtype", &ns->dtype,
                      "fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8 (required)")] =
      DTypeNames();
  CLI::Option* tp_rank =
      AddValueFlag(app, "tp-rank", &ns->tp_rank,
                   "tensor-parallel rank (default 0)");
  CLI::Option* tp_size =
      AddUintFlag(app, "tp-size", &ns->tp_size, min, kU32Max,
                  "tensor-parallel size (default 1)");
  // --tp-rank is below --tp-size; a bad --tp-size is reported first.
  tp_rank->transform(UintRange(
      "tp-rank", 0, [tp_size, raw, min]() -> absl::StatusOr<uint64_t> {
        if (raw) return kU32Max;
        if (tp_size->count() == 0) return 0;  // --tp-size 1
        absl::StatusOr<uint64_t> size =
            ParseUintFlag("tp-size", tp_size->results().back(), min, kU32Max);
        if (!size.ok()) return size.status();
        return *size - 1;
      }));
  AddValueFlag(app, "layout", &ns->layout,
               "per-layer (default) or xlayer:S[:W]: layers S.. share one K/V "
               "bank, W the local window (part of the namespace)");
}

CLI::Option* AddNoHeadersFlag(CLI::App& app, bool* no_headers) {
  return AddBoolFlag(app, "no-headers", no_headers,
                     "print table rows only (no header row or summary line)");
}

void ApplyNoHeaders(Context& ctx, bool no_headers) {
  if (no_headers) SetHeaders(*ctx.out, false);
}

std::vector<std::string> DTypeNames() {
  std::vector<std::string> names;
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                  DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kInt8}) {
    names.push_back(DTypeName(d));
  }
  return names;
}

absl::StatusOr<DType> ParseDType(const std::string& name,
                                 bool allow_unspecified) {
  const std::string n = absl::AsciiStrToLower(name);
  if (allow_unspecified &&
      (n == "0" || n == "unspecified" || n == "dtype_unspecified")) {
    return DType::kUnspecified;
  }
  struct Alias {
    const char* name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"fp32", DType::kFloat32},      {"float32", DType::kFloat32},
      {"f32", DType::kFloat32},       {"dtype_float32", DType::kFloat32},
      {"fp16", DType::kFloat16},      {"float16", DType::kFloat16},
      {"f16", DType::kFloat16},       {"half", DType::kFloat16},
      {"dtype_float16", DType::kFloat16},
      {"bf16", DType::kBFloat16},     {"bfloat16", DType::kBFloat16},
      {"dtype_bfloat16", DType::kBFloat16},
      {"fp8_e4m3", DType::kFloat8E4M3}, {"fp8e4m3", DType::kFloat8E4M3},
      {"float8_e4m3", DType::kFloat8E4M3},
      {"dtype_float8_e4m3", DType::kFloat8E4M3},
      {"fp8_e5m2", DType::kFloat8E5M2}, {"fp8e5m2", DType::kFloat8E5M2},
      {"float8_e5m2", DType::kFloat8E5M2},
      {"dtype_float8_e5m2", DType::kFloat8E5M2},
      {"int8", DType::kInt8},         {"dtype_int8", DType::kInt8},
  };
  for (const Alias& a : kAliases) {
    if (n == a.name) return a.dtype;
  }
  uint32_t v = 0;
  if (absl::SimpleAtoi(n, &v) && DTypeBytes(static_cast<DType>(v)) != 0) {
    return static_cast<DType>(v);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--dtype=", name,
      ": want fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8 or the enum value "
      "1..6"));
}

const char* DTypeShortName(uint32_t dtype) {
  const auto d = static_cast<DType>(dtype);
  return DTypeBytes(d) == 0 ? DTypeName(DType::kUnspecified) : DTypeName(d);
}

absl::Status ParseLayout(const std::string& layout, bool check,
                         NamespaceSpec* spec) {
  spec->cross_layer.reset();
  if (layout.empty() || layout == "per-layer") return absl::OkStatus();
  const std::vector<std::string> parts = absl::StrSplit(layout, ':');
  uint32_t s = 0, w = 0;
  if (parts.size() < 2 || parts.size() > 3 || parts[0] != "xlayer" ||
      !absl::SimpleAtoi(parts[1], &s) ||
      (parts.size() == 3 && !absl::SimpleAtoi(parts[2], &w))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layout=", layout, ": want per-layer or xlayer:S[:W] (layers S.. "
        "share one K/V bank; W, the local window in tokens)"));
  }
  const CrossLayerKv x{s, w};
  if (check) {
    if (std::optional<CrossLayerProblem> bad =
            CheckCrossLayerKv(spec->num_layers, x)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--layout=", layout, ": ",
          bad->field == "local_window" ? "W (local_window) "
                                       : "S (shared_from_layer) ",
          bad->message));
    }
  }
  spec->cross_layer = x;
  return absl::OkStatus();
}

absl::StatusOr<NamespaceSpec> NamespaceFromOptions(const NamespaceOptions& o,
                                                   bool raw) {
  const uint64_t min = raw ? 0 : 1;
  auto required = [&](const char* name, const std::optional<uint32_t>& v)
      -> absl::StatusOr<uint32_t> {
    if (!v.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " is required (an integer in ", min, "..", kU32Max, ")"));
    }
    return *v;
  };
  NamespaceSpec ns;
  if (!o.model.has_value()) {
    return absl::InvalidArgumentError(
        "--model is required (use --model= for an empty name)");
  }
  ns.model = *o.model;
  ns.model_revision = o.model_revision;
  ns.lora = o.lora;
  ns.cache_salt = o.salt;
  ASSIGN_OR_RETURN(ns.num_layers, required("layers", o.layers));
  ASSIGN_OR_RETURN(ns.num_kv_heads, required("kv-heads", o.kv_heads));
  ASSIGN_OR_RETURN(ns.head_dim, required("head-dim", o.head_dim));
  if (!o.dtype.has_value()) {
    return absl::InvalidArgumentError(
        "--dtype is required (fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8)");
  }
  ASSIGN_OR_RETURN(ns.dtype, ParseDType(*o.dtype, raw));
  ns.page_size = o.page_size;
  ns.tp_rank = o.tp_rank;
  ns.tp_size = o.tp_size;
  RETURN_IF_ERROR(ParseLayout(o.layout, /*check=*/!raw, &ns));
  return ns;
}

namespace {

absl::Status AppendTokens(absl::string_view text, absl::string_view origin,
                          std::vector<uint32_t>* tokens) {
  for (absl::string_view piece :
       absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    uint32_t t = 0;
    if (!absl::SimpleAtoi(piece, &t)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens", origin, ": \"", piece,
                       "\" is not a token id (an integer in 0..4294967295)"));
    }
    tokens->push_back(t);
  }
  return absl::OkStatus();
}

}  // namespace

CLI::Option* AddTokenFileFlag(CLI::App& app, std::optional<std::string>* path,
                              CompletionValues& values) {
  CLI::Option* o = AddValueFlag(
      app, "file", path, "read token ids from PATH (whitespace/comma separated)");
  values[o] = {kAnyPath};
  return o;
}

CLI::Option* AddTokensPositional(CLI::App& app,
                                 std::vector<std::string>* args) {
  return AddPositional(app, "TOKENS", args,
                       "token ids, separate or comma lists");
}

absl::StatusOr<std::vector<uint32_t>> ParseTokens(
    const std::vector<std::string>& args,
    const std::optional<std::string>& path, bool allow_empty) {
  std::vector<uint32_t> tokens;
  for (const std::string& arg : args) {
    RETURN_IF_ERROR(AppendTokens(arg, "", &tokens));
  }
  if (path.has_value()) {
    std::ifstream in(*path);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--file=", *path, ": cannot open"));
    }
    std::stringstream buf;
    buf << in.rdbuf();
    RETURN_IF_ERROR(
        AppendTokens(buf.str(), absl::StrCat(" in ", *path), &tokens));
  }
  if (tokens.empty() && !allow_empty) {
    return absl::InvalidArgumentError(
        "no tokens: give token ids as arguments (\"1 2 3\" or 1,2,3) or "
        "--file PATH");
  }
  return tokens;
}

}  // namespace radixkv::ctl
