// Shared helpers of radixkvctl commands: flag values, namespace and token
// parsing, the daemon channel, calls with a deadline, the error -> exit code
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
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "radix/status_macros.h"
#include "radixkv/channel.h"
#include "radixkv/namespace_spec.h"

namespace radixkv::ctl {

std::string Args::Get(const std::string& name,
                      const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<uint64_t> Args::GetUint(const std::string& name,
                                       uint64_t fallback, uint64_t min,
                                       uint64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  uint64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", it->second,
                     ": want an integer in ", min, "..", max));
  }
  return v;
}

absl::StatusOr<uint64_t> Args::RequireUint(const std::string& name,
                                           uint64_t min, uint64_t max) const {
  if (!Has(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " is required (an integer in ", min, "..", max, ")"));
  }
  return GetUint(name, 0, min, max);
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
    case absl::StatusCode::kDeadlineExceeded:
      *ctx.err << "Error: radixkvd at " << ctx.global.target
               << " is unreachable or did not answer within "
               << absl::FormatDuration(ctx.global.timeout) << ": "
               << status.message() << "\n";
      return kExitUnreachable;
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

std::vector<FlagSpec> NamespaceFlags() {
  return {
      {"model", true, "model name (required; may be empty: --model=)"},
      {"model-revision", true, "weights revision"},
      {"lora", true, "LoRA adapter name"},
      {"salt", true, "tenant cache salt"},
      {"layers", true, "number of layers (required)"},
      {"kv-heads", true, "number of KV heads (required)"},
      {"head-dim", true, "head dimension (required)"},
      {"page-size", true, "tokens per block (default 16)"},
      {"dtype", true, "fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8 (required)",
       DTypeNames()},
      {"tp-rank", true, "tensor-parallel rank (default 0)"},
      {"tp-size", true, "tensor-parallel size (default 1)"},
      {"layout", true,
       "per-layer (default) or xlayer:S[:W]: layers S.. share one K/V bank, "
       "W the local window (part of the namespace)"},
  };
}

FlagSpec NoHeadersFlag() {
  return {"no-headers", false,
          "print table rows only (no header row or summary line)"};
}

std::vector<std::string> DTypeNames() {
  return {"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"};
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
  if (absl::SimpleAtoi(n, &v) && v >= 1 && v <= 6) return static_cast<DType>(v);
  return absl::InvalidArgumentError(absl::StrCat(
      "--dtype=", name,
      ": want fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8 or the enum value "
      "1..6"));
}

const char* DTypeShortName(uint32_t dtype) {
  switch (static_cast<DType>(dtype)) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8E4M3: return "fp8_e4m3";
    case DType::kFloat8E5M2: return "fp8_e5m2";
    case DType::kInt8: return "int8";
    default: return "unspecified";
  }
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

absl::StatusOr<NamespaceSpec> NamespaceFromArgs(const Args& args, bool raw) {
  constexpr uint64_t kU32Max = 0xffffffffu;
  const uint64_t min = raw ? 0 : 1;
  NamespaceSpec ns;
  if (!args.Has("model")) {
    return absl::InvalidArgumentError(
        "--model is required (use --model= for an empty name)");
  }
  ns.model = args.Get("model");
  ns.model_revision = args.Get("model-revision");
  ns.lora = args.Get("lora");
  ns.cache_salt = args.Get("salt");
  ASSIGN_OR_RETURN(uint64_t layers, args.RequireUint("layers", min, kU32Max));
  ASSIGN_OR_RETURN(uint64_t heads, args.RequireUint("kv-heads", min, kU32Max));
  ASSIGN_OR_RETURN(uint64_t dim, args.RequireUint("head-dim", min, kU32Max));
  ASSIGN_OR_RETURN(uint64_t page, args.GetUint("page-size", 16, 1, kU32Max));
  ASSIGN_OR_RETURN(uint64_t tp_size, args.GetUint("tp-size", 1, min, kU32Max));
  ASSIGN_OR_RETURN(uint64_t tp_rank,
                   args.GetUint("tp-rank", 0, 0,
                                raw ? kU32Max : tp_size - 1));
  if (!args.Has("dtype")) {
    return absl::InvalidArgumentError(
        "--dtype is required (fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8)");
  }
  ASSIGN_OR_RETURN(ns.dtype, ParseDType(args.Get("dtype"), raw));
  ns.num_layers = static_cast<uint32_t>(layers);
  ns.num_kv_heads = static_cast<uint32_t>(heads);
  ns.head_dim = static_cast<uint32_t>(dim);
  ns.page_size = static_cast<uint32_t>(page);
  ns.tp_rank = static_cast<uint32_t>(tp_rank);
  ns.tp_size = static_cast<uint32_t>(tp_size);
  RETURN_IF_ERROR(ParseLayout(args.Get("layout"), /*check=*/!raw, &ns));
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

absl::StatusOr<std::vector<uint32_t>> TokensFromArgs(const Args& args,
                                                     bool allow_empty) {
  std::vector<uint32_t> tokens;
  for (const std::string& arg : args.positional()) {
    RETURN_IF_ERROR(AppendTokens(arg, "", &tokens));
  }
  if (args.Has("file")) {
    const std::string path = args.Get("file");
    std::ifstream in(path);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--file=", path, ": cannot open"));
    }
    std::stringstream buf;
    buf << in.rdbuf();
    RETURN_IF_ERROR(AppendTokens(buf.str(), absl::StrCat(" in ", path), &tokens));
  }
  if (tokens.empty() && !allow_empty) {
    return absl::InvalidArgumentError(
        "no tokens: give token ids as arguments (\"1 2 3\" or 1,2,3) or "
        "--file PATH");
  }
  return tokens;
}

}  // namespace radixkv::ctl
