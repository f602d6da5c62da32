// radixkvctl commands about prompts and block keys: match, explain, hash,
// size, version. hash, size and version work without a daemon.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/ctl/ctl.h"
#include "client/ctl/output.h"
#include "client/status.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

#ifndef RADIXKV_VERSION
#define RADIXKV_VERSION "unknown"
#endif

namespace radixkv::ctl {
namespace {

FlagSpec FileFlag() {
  return {"file", true, "read token ids from PATH (whitespace/comma separated)"};
}

std::vector<FlagSpec> PromptFlags() {
  std::vector<FlagSpec> f = NamespaceFlags();
  f.push_back(FileFlag());
  return f;
}

// Parses namespace + tokens; on failure prints the error and sets *exit.
// `raw`: the permissive parsing of `hash` (see NamespaceFromArgs).
bool ParsePrompt(Context& ctx, NamespaceSpec* ns, std::vector<uint32_t>* tokens,
                 int* exit, bool raw = false) {
  absl::StatusOr<NamespaceSpec> spec = NamespaceFromArgs(ctx.args, raw);
  if (!spec.ok()) {
    *exit = BadArgs(ctx, std::string(spec.status().message()));
    return false;
  }
  absl::StatusOr<std::vector<uint32_t>> t = TokensFromArgs(ctx.args, raw);
  if (!t.ok()) {
    *exit = BadArgs(ctx, std::string(t.status().message()));
    return false;
  }
  *ns = *spec;
  *tokens = std::move(*t);
  return true;
}

// ---- match ------------------------------------------------------------------

int RunMatch(Context& ctx) {
  NamespaceSpec ns;
  std::vector<uint32_t> tokens;
  int exit = 0;
  if (!ParsePrompt(ctx, &ns, &tokens, &exit)) return exit;
  v1::MatchRequest req;
  *req.mutable_namespace_() = NamespaceToProto(ns);
  req.mutable_tokens()->Add(tokens.begin(), tokens.end());
  auto stub = v1::KvCache::NewStub(ctx.Channel());
  v1::MatchResponse resp;
  grpc::ClientContext call;
  ctx.SetDeadline(&call);
  absl::Status s = FromGrpcStatus(stub->Match(&call, req, &resp));
  if (!s.ok()) return Fail(ctx, s);
  if (ctx.json()) {
    *ctx.out << ToJsonLine(resp) << "\n";
    return kExitOk;
  }
  *ctx.out << absl::StrFormat(
      "matched %u of %u blocks: %u of %u tokens cached (%s)%s\n",
      resp.matched_blocks(), resp.total_blocks(), resp.matched_tokens(),
      tokens.size(), Percent(resp.matched_tokens(), tokens.size()),
      tokens.size() % ns.page_size == 0
          ? ""
          : absl::StrCat("; the last ", tokens.size() % ns.page_size,
                         " tokens do not fill a block"));
  return kExitOk;
}

// ---- explain ------------------------------------------------------------------

const char* StateName(v1::BlockState s) {
  switch (s) {
    case v1::BLOCK_STATE_CACHED: return "cached";
    case v1::BLOCK_STATE_NOT_PRESENT: return "not-present";
    case v1::BLOCK_STATE_EVICTED: return "evicted";
    case v1::BLOCK_STATE_TOKEN_MISMATCH: return "token-mismatch";
    case v1::BLOCK_STATE_WRONG_NAMESPACE: return "wrong-namespace";
    case v1::BLOCK_STATE_PARENT_MISSING: return "parent-missing";
    default: return "unknown";
  }
}

int RunExplain(Context& ctx) {
  NamespaceSpec ns;
  std::vector<uint32_t> tokens;
  int exit = 0;
  if (!ParsePrompt(ctx, &ns, &tokens, &exit)) return exit;
  v1::ExplainRequest req;
  *req.mutable_namespace_() = NamespaceToProto(ns);
  req.mutable_tokens()->Add(tokens.begin(), tokens.end());
  auto stub = v1::Admin::NewStub(ctx.Channel());
  v1::ExplainResponse resp;
  grpc::ClientContext call;
  ctx.SetDeadline(&call);
  absl::Status s = FromGrpcStatus(stub->Explain(&call, req, &resp));
  if (!s.ok()) return Fail(ctx, s);
  if (ctx.json()) {
    *ctx.out << ToJsonLine(resp) << "\n";
    return kExitOk;
  }
  *ctx.out << "namespace " << Hex(resp.namespace_id()) << " ("
           << (resp.namespace_known() ? "known to the daemon"
                                      : "never used on this daemon")
           << "): " << resp.matched_blocks() << " of " << resp.total_blocks()
           << " blocks cached\n";
  Table t({"BLOCK", "TOKENS", "KEY", "STATE", "PAGE", "REFS", "AGE", "REASON"});
  t.AlignRight({0, 4, 5, 6});
  for (const v1::BlockExplanation& b : resp.blocks()) {
    const bool cached = b.state() == v1::BLOCK_STATE_CACHED;
    const uint64_t first = uint64_t{b.index()} * ns.page_size;
    std::string reason = b.reason();
    if (b.state() == v1::BLOCK_STATE_WRONG_NAMESPACE &&
        !b.other_namespace_id().empty()) {
      absl::StrAppend(&reason, reason.empty() ? "" : " ", "(cached under ",
                      Hex(b.other_namespace_id(), 12), ")");
    }
    t.AddRow({absl::StrCat(b.index()),
              absl::StrCat(first, "-", first + ns.page_size - 1),
              Hex(b.key(), 16) + "..", StateName(b.state()),
              cached ? absl::StrCat(b.page()) : "-",
              cached ? absl::StrCat(b.refcount()) : "-",
              cached ? HumanDuration(b.age_seconds()) : "-",
              reason.empty() ? "-" : reason});
  }
  t.Print(*ctx.out);
  return kExitOk;
}

// ---- hash ---------------------------------------------------------------------

int RunHash(Context& ctx) {
  NamespaceSpec ns;
  std::vector<uint32_t> tokens;
  int exit = 0;
  if (!ParsePrompt(ctx, &ns, &tokens, &exit, /*raw=*/true)) return exit;
  const BlockKey root = NamespaceRoot(ns);
  const std::vector<BlockKey> keys =
      ComputeBlockKeys(root, ns.page_size, tokens);
  if (ctx.json()) {
    std::string line = absl::StrCat(
        "{\"block_key_version\":", kBlockKeyVersion, ",\"namespace_id\":\"",
        root.ToHex(), "\",\"page_size\":", ns.page_size,
        ",\"tokens\":", tokens.size(), ",\"block_keys\":[");
    for (size_t i = 0; i < keys.size(); ++i) {
      absl::StrAppend(&line, i ? "," : "", "\"", keys[i].ToHex(), "\"");
    }
    *ctx.out << line << "]}\n";
    return kExitOk;
  }
  *ctx.out << "namespace  " << root.ToHex() << "\n";
  Table t({"BLOCK", "TOKENS", "KEY"});
  t.AlignRight({0});
  for (size_t i = 0; i < keys.size(); ++i) {
    t.AddRow({absl::StrCat(i),
              absl::StrCat(i * ns.page_size, "-", (i + 1) * ns.page_size - 1),
              keys[i].ToHex()});
  }
  t.Print(*ctx.out);
  if (tokens.size() % ns.page_size != 0) {
    *ctx.out << "(the last " << tokens.size() % ns.page_size
             << " tokens do not fill a block and have no key)\n";
  }
  return kExitOk;
}

// ---- size ---------------------------------------------------------------------

int RunSize(Context& ctx) {
  constexpr uint64_t kU32Max = 0xffffffffu;
  auto need = [&](const char* name) { return ctx.args.RequireUint(name, 1, kU32Max); };
  absl::StatusOr<uint64_t> layers = need("layers");
  absl::StatusOr<uint64_t> heads = need("kv-heads");
  absl::StatusOr<uint64_t> dim = need("head-dim");
  absl::StatusOr<uint64_t> tokens =
      ctx.args.RequireUint("tokens", 0, uint64_t{1} << 40);
  absl::StatusOr<uint64_t> page = ctx.args.GetUint("page-size", 16, 1, kU32Max);
  for (const auto* v : {&layers, &heads, &dim, &tokens, &page}) {
    if (!v->ok()) return BadArgs(ctx, std::string(v->status().message()));
  }
  if (!ctx.args.Has("dtype")) {
    return BadArgs(ctx, "--dtype is required (fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8)");
  }
  absl::StatusOr<DType> dtype = ParseDType(ctx.args.Get("dtype"));
  if (!dtype.ok()) return BadArgs(ctx, std::string(dtype.status().message()));
  const uint64_t elem = DTypeBytes(*dtype);
  // K and V (x2) of every layer and KV head, per token.
  const unsigned __int128 per_token128 =
      static_cast<unsigned __int128>(*layers) * 2 * *heads * *dim * elem;
  const unsigned __int128 bytes128 = per_token128 * *tokens;
  const unsigned __int128 page128 = per_token128 * *page;
  if (bytes128 > ~uint64_t{0} || page128 > ~uint64_t{0}) {
    return BadArgs(ctx, "size: the result does not fit in 64 bits");
  }
  const uint64_t per_token = static_cast<uint64_t>(per_token128);
  const uint64_t bytes = static_cast<uint64_t>(bytes128);
  const uint64_t page_bytes = static_cast<uint64_t>(page128);
  const uint64_t pages = (*tokens + *page - 1) / *page;
  if (ctx.json()) {
    *ctx.out << absl::StrCat("{\"bytes\":", bytes, ",\"pages\":", pages,
                             ",\"page_bytes\":", page_bytes,
                             ",\"bytes_per_token\":", per_token,
                             ",\"tokens\":", *tokens, ",\"page_size\":", *page,
                             "}\n");
    return kExitOk;
  }
  KeyValueList kv;
  kv.Add("kv bytes", absl::StrCat(HumanBytes(bytes), " (", bytes, " B)"));
  kv.Add("per token", absl::StrCat(HumanBytes(per_token), " (", *layers,
                                   " layers x 2 x ", *heads, " kv heads x ",
                                   *dim, " dims x ", elem, " B)"));
  kv.Add("pages", absl::StrCat(pages, " of ", *page, " tokens"));
  kv.Add("page bytes", HumanBytes(page_bytes));
  kv.Add("pool bytes", absl::StrCat(HumanBytes(pages * page_bytes),
                                    " (whole pages)"));
  kv.Print(*ctx.out);
  return kExitOk;
}

// ---- version --------------------------------------------------------------------

int RunVersion(Context& ctx) {
  std::string daemon;
  auto stub = v1::Admin::NewStub(ctx.Channel());
  v1::GetStatsResponse resp;
  grpc::ClientContext call;
  call.set_deadline(absl::ToChronoTime(
      absl::Now() + std::min(ctx.global.timeout, absl::Seconds(1))));
  if (stub->GetStats(&call, v1::GetStatsRequest(), &resp).ok()) {
    daemon = resp.stats().version();
  }
  if (ctx.json()) {
    *ctx.out << "{\"version\":\"" << RADIXKV_VERSION
             << "\",\"block_key_version\":" << kBlockKeyVersion
             << ",\"daemon_version\":\"" << daemon << "\"}\n";
    return kExitOk;
  }
  KeyValueList kv;
  kv.Add("radixkvctl", RADIXKV_VERSION);
  kv.Add("block keys", absl::StrCat("v", kBlockKeyVersion));
  kv.Add("radixkvd", daemon.empty() ? "(not reachable)" : daemon);
  kv.Print(*ctx.out);
  return kExitOk;
}

}  // namespace

std::vector<Command> KeyCommands() {
  return {
      {"match", "Prompts and keys",
       "How much of a prompt is cached (read-only, no session)",
       "TOKENS... | --file=PATH",
       "radixkvctl match --model=llama --layers=32 --kv-heads=8 --head-dim=128 "
       "--dtype=bf16 1 2 3 4\nradixkvctl match --model=llama --layers=32 "
       "--kv-heads=8 --head-dim=128 --dtype=bf16 --file=prompt.txt -o json",
       "Tokens are ids: separate arguments, comma lists, or --file.",
       PromptFlags(), RunMatch},
      {"explain", "Prompts and keys",
       "Per block of a prompt: cached or not, and why not",
       "TOKENS... | --file=PATH",
       "radixkvctl explain --model=llama --layers=32 --kv-heads=8 "
       "--head-dim=128 --dtype=bf16 --file=prompt.txt",
       "States: cached, not-present (never cached), evicted (dropped for "
       "room), token-mismatch (hash collision), wrong-namespace (cached for "
       "another model/LoRA/salt/layout), parent-missing (an earlier block is "
       "not cached, so this one cannot hit).",
       PromptFlags(), RunExplain},
      {"hash", "Prompts and keys",
       "Block keys of a token list for a namespace (offline)",
       "TOKENS... | --file=PATH",
       "radixkvctl hash --model=llama --layers=32 --kv-heads=8 --head-dim=128 "
       "--dtype=bf16 --page-size=4 1 2 3 4 5 6 7 8",
       "Prints the namespace root and one key per full block, per the "
       "block-key contract v1 (DESIGN.md section 3); needs no daemon. With "
       "-o json keys are 32 lowercase hex digits.",
       PromptFlags(), RunHash},
      {"size", "Prompts and keys",
       "KV-cache bytes of a token count for a model layout (offline)", "",
       "radixkvctl size --layers=24 --kv-heads=8 --head-dim=64 --dtype=fp16 "
       "--tokens=4096",
       "bytes = layers x 2 (K and V) x kv_heads x head_dim x dtype bytes x "
       "tokens; pages = ceil(tokens / page_size).",
       {{"layers", true, "number of layers (required)"},
        {"kv-heads", true, "KV heads (required)"},
        {"head-dim", true, "head dimension (required)"},
        {"dtype", true, "fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8 (required)"},
        {"tokens", true, "token count (required)"},
        {"page-size", true, "tokens per page (default 16)"}},
       RunSize},
      {"version", "Prompts and keys",
       "Print radixkvctl's version (and the daemon's when reachable)", "",
       "radixkvctl version", "", {}, RunVersion},
  };
}

}  // namespace radixkv::ctl
