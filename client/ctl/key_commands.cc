// radixkvctl commands about prompts and block keys: match, explain, hash,
// size, version. hash, size and version work without a daemon.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/ctl/ctl.h"
#include "client/ctl/output.h"
#include "nlohmann/json.hpp"
#include "radixkv/namespace_spec.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

#ifndef RADIXKV_VERSION
#define RADIXKV_VERSION "unknown"
#endif

namespace radixkv::ctl {
namespace {

FlagSpec FileFlag() {
  return {"file", true, "read token ids from PATH (whitespace/comma separated)",
          {kAnyPath}};
}

std::vector<FlagSpec> PromptFlags() {
  std::vector<FlagSpec> f = NamespaceFlags();
  f.push_back(FileFlag());
  return f;
}

// explain and hash print a table.
std::vector<FlagSpec> PromptTableFlags() {
  std::vector<FlagSpec> f = PromptFlags();
  f.push_back(NoHeadersFlag());
  return f;
}

// A prompt given on the command line: its namespace and token ids.
struct Prompt {
  NamespaceSpec ns;
  std::vector<uint32_t> tokens;
};

// Parses namespace + tokens; on failure prints the error and returns its
// exit code, else kExitOk. `raw`: the permissive parsing of `hash` (see
// NamespaceFromArgs).
int ParsePrompt(Context& ctx, Prompt* prompt, bool raw = false) {
  absl::StatusOr<NamespaceSpec> spec = NamespaceFromArgs(ctx.args, raw);
  if (!spec.ok()) return BadArgs(ctx, std::string(spec.status().message()));
  absl::StatusOr<std::vector<uint32_t>> t = TokensFromArgs(ctx.args, raw);
  if (!t.ok()) return BadArgs(ctx, std::string(t.status().message()));
  prompt->ns = *spec;
  prompt->tokens = std::move(*t);
  return kExitOk;
}

// A Match or Explain request for `prompt`.
template <typename Request>
Request PromptRequest(const Prompt& prompt) {
  Request req;
  *req.mutable_namespace_() = NamespaceToProto(prompt.ns);
  req.mutable_tokens()->Add(prompt.tokens.begin(), prompt.tokens.end());
  return req;
}

// ---- match ------------------------------------------------------------------

int RunMatch(Context& ctx) {
  Prompt prompt;
  if (int exit = ParsePrompt(ctx, &prompt); exit != kExitOk) return exit;
  const size_t tokens = prompt.tokens.size();
  const size_t tail = tokens % prompt.ns.page_size;
  return CallAndPrint(
      ctx, &v1::KvCache::Stub::Match, PromptRequest<v1::MatchRequest>(prompt),
      [&](const v1::MatchResponse& resp, std::ostream& out) {
        out << absl::StrFormat(
            "matched %u of %u blocks: %u of %u tokens cached (%s)%s\n",
            resp.matched_blocks(), resp.total_blocks(), resp.matched_tokens(),
            tokens, Percent(resp.matched_tokens(), tokens),
            tail == 0 ? "" : absl::StrCat("; the last ", tail,
                                          " tokens do not fill a block"));
      });
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

void PrintExplain(const v1::ExplainResponse& resp, uint32_t page_size,
                  std::ostream& out) {
  if (Headers(out)) {
    out << "namespace " << Hex(resp.namespace_id()) << " ("
        << (resp.namespace_known() ? "known to the daemon"
                                   : "never used on this daemon")
        << "): " << resp.matched_blocks() << " of " << resp.total_blocks()
        << " blocks cached\n";
  }
  Table t({"BLOCK", "TOKENS", "KEY", "STATE", "PAGE", "REFS", "AGE", "REASON"});
  t.AlignRight({0, 4, 5, 6});
  for (const v1::BlockExplanation& b : resp.blocks()) {
    const bool cached = b.state() == v1::BLOCK_STATE_CACHED;
    const uint64_t first = uint64_t{b.index()} * page_size;
    std::string reason = b.reason();
    if (b.state() == v1::BLOCK_STATE_WRONG_NAMESPACE &&
        !b.other_namespace_id().empty()) {
      absl::StrAppend(&reason, reason.empty() ? "" : " ", "(cached under ",
                      Hex(b.other_namespace_id(), 12), ")");
    }
    t.AddRow({absl::StrCat(b.index()),
              absl::StrCat(first, "-", first + page_size - 1),
              Hex(b.key(), 16) + "..", StateName(b.state()),
              cached ? absl::StrCat(b.page()) : "-",
              cached ? absl::StrCat(b.refcount()) : "-",
              cached ? HumanDuration(b.age_seconds()) : "-",
              reason.empty() ? "-" : reason});
  }
  t.Print(out);
}

int RunExplain(Context& ctx) {
  Prompt prompt;
  if (int exit = ParsePrompt(ctx, &prompt); exit != kExitOk) return exit;
  return CallAndPrint(ctx, &v1::Admin::Stub::Explain,
                      PromptRequest<v1::ExplainRequest>(prompt),
                      [&](const v1::ExplainResponse& resp, std::ostream& out) {
                        PrintExplain(resp, prompt.ns.page_size, out);
                      });
}

// ---- hash ---------------------------------------------------------------------

int RunHash(Context& ctx) {
  Prompt prompt;
  if (int exit = ParsePrompt(ctx, &prompt, /*raw=*/true); exit != kExitOk) {
    return exit;
  }
  const NamespaceSpec& ns = prompt.ns;
  const std::vector<uint32_t>& tokens = prompt.tokens;
  const BlockKey root = NamespaceRoot(ns);
  const std::vector<BlockKey> keys =
      ComputeBlockKeys(root, ns.page_size, tokens);
  auto json = [&] {
    nlohmann::ordered_json j;
    j["block_key_version"] = kBlockKeyVersion;
    j["namespace_id"] = root.ToHex();
    j["page_size"] = ns.page_size;
    j["tokens"] = tokens.size();
    j["block_keys"] = nlohmann::ordered_json::array();
    for (const BlockKey& key : keys) j["block_keys"].push_back(key.ToHex());
    return j.dump();
  };
  return PrintResult(ctx, json, [&] {
    if (Headers(*ctx.out)) *ctx.out << "namespace  " << root.ToHex() << "\n";
    Table t({"BLOCK", "TOKENS", "KEY"});
    t.AlignRight({0});
    for (size_t i = 0; i < keys.size(); ++i) {
      t.AddRow({absl::StrCat(i),
                absl::StrCat(i * ns.page_size, "-", (i + 1) * ns.page_size - 1),
                keys[i].ToHex()});
    }
    t.Print(*ctx.out);
    if (Headers(*ctx.out) && tokens.size() % ns.page_size != 0) {
      *ctx.out << "(the last " << tokens.size() % ns.page_size
               << " tokens do not fill a block and have no key)\n";
    }
  });
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
  const uint64_t pages = (*tokens + *page - 1) / *page;
  const unsigned __int128 elems_page128 = per_token128 * *page;
  if (per_token128 * *tokens > ~uint64_t{0} || elems_page128 > (uint64_t{1} << 62)) {
    return BadArgs(ctx, "size: the result does not fit in 64 bits");
  }
  // fp8 and int8 pages also hold one fp32 scale per layer, K|V and KV head
  // (docs/CONTRACTS.md §2.1): NamespacePageBytes is the page size a pool
  // uses.
  NamespaceSpec spec;
  spec.num_layers = static_cast<uint32_t>(*layers);
  spec.num_kv_heads = static_cast<uint32_t>(*heads);
  spec.head_dim = static_cast<uint32_t>(*dim);
  spec.page_size = static_cast<uint32_t>(*page);
  spec.dtype = *dtype;
  const uint64_t scale_bytes = NamespaceScaleBytes(spec);
  const unsigned __int128 page128 = elems_page128 + scale_bytes;
  const unsigned __int128 bytes128 =
      per_token128 * *tokens + static_cast<unsigned __int128>(pages) * scale_bytes;
  if (bytes128 > ~uint64_t{0} ||
      static_cast<unsigned __int128>(pages) * page128 > ~uint64_t{0}) {
    return BadArgs(ctx, "size: the result does not fit in 64 bits");
  }
  const uint64_t per_token = static_cast<uint64_t>(per_token128);
  const uint64_t bytes = static_cast<uint64_t>(bytes128);
  const uint64_t page_bytes = static_cast<uint64_t>(page128);
  auto json = [&] {
    nlohmann::ordered_json j;
    j["bytes"] = bytes;
    j["pages"] = pages;
    j["page_bytes"] = page_bytes;
    j["bytes_per_token"] = per_token;
    j["tokens"] = *tokens;
    j["page_size"] = *page;
    j["scale_bytes_per_page"] = scale_bytes;
    return j.dump();
  };
  return PrintResult(ctx, json, [&] {
    KeyValueList kv;
    kv.Add("kv bytes", absl::StrCat(HumanBytes(bytes), " (", bytes, " B)"));
    kv.Add("per token", absl::StrCat(HumanBytes(per_token), " (", *layers,
                                     " layers x 2 x ", *heads, " kv heads x ",
                                     *dim, " dims x ", elem, " B)"));
    kv.Add("pages", absl::StrCat(pages, " of ", *page, " tokens"));
    kv.Add("page bytes", HumanBytes(page_bytes));
    if (scale_bytes > 0) {
      kv.Add("scales", absl::StrCat(scale_bytes, " B per page (", *layers,
                                    " layers x 2 x ", *heads,
                                    " kv heads x 4 B fp32, 16 B aligned)"));
    }
    kv.Add("pool bytes", absl::StrCat(HumanBytes(pages * page_bytes),
                                      " (whole pages)"));
    kv.Print(*ctx.out);
  });
}

// ---- version --------------------------------------------------------------------

int RunVersion(Context& ctx) {
  std::string daemon;
  v1::Admin::Stub stub(ctx.Channel());
  v1::GetStatsResponse resp;
  const absl::Status status = CallWithDeadline(
      [&](grpc::ClientContext* call) {
        return stub.GetStats(call, v1::GetStatsRequest(), &resp);
      },
      std::min(ctx.global.timeout, absl::Seconds(1)));
  if (status.ok()) daemon = resp.stats().version();
  auto json = [&] {
    nlohmann::ordered_json j;
    j["version"] = RADIXKV_VERSION;
    j["block_key_version"] = kBlockKeyVersion;
    j["daemon_version"] = daemon;
    return j.dump();
  };
  return PrintResult(ctx, json, [&] {
    KeyValueList kv;
    kv.Add("radixkvctl", RADIXKV_VERSION);
    kv.Add("block keys", absl::StrCat("v", kBlockKeyVersion));
    kv.Add("radixkvd", daemon.empty() ? "(not reachable)" : daemon);
    kv.Print(*ctx.out);
  });
}

}  // namespace

std::vector<Command> KeyCommands() {
  const std::string keys = "Prompts and keys";
  // name, group, summary, positional, example, details, flags, run
  return {
      {"match", keys, "How much of a prompt is cached (read-only, no session)",
       "TOKENS",
       "radixkvctl match --model=llama --layers=32 --kv-heads=8 --head-dim=128 "
       "--dtype=bf16 1 2 3 4\nradixkvctl match --model=llama --layers=32 "
       "--kv-heads=8 --head-dim=128 --dtype=bf16 --file=prompt.txt -o json",
       "Tokens are ids: separate arguments, comma lists, or --file.",
       PromptFlags(), RunMatch},
      {"explain", keys, "Per block of a prompt: cached or not, and why not",
       "TOKENS",
       "radixkvctl explain --model=llama --layers=32 --kv-heads=8 "
       "--head-dim=128 --dtype=bf16 --file=prompt.txt",
       "States: cached, not-present (never cached), evicted (dropped for "
       "room), token-mismatch (hash collision), wrong-namespace (cached for "
       "another model/LoRA/salt/layout), parent-missing (an earlier block is "
       "not cached, so this one cannot hit).",
       PromptTableFlags(), RunExplain},
      {"hash", keys, "Block keys of a token list for a namespace (offline)",
       "TOKENS",
       "radixkvctl hash --model=llama --layers=32 --kv-heads=8 --head-dim=128 "
       "--dtype=bf16 --page-size=4 1 2 3 4 5 6 7 8",
       "Prints the namespace root and one key per full block, per the "
       "block-key contract v1 (docs/CONTRACTS.md section 1); needs no daemon. "
       "With -o json keys are 32 lowercase hex digits.",
       PromptTableFlags(), RunHash},
      {"size", keys,
       "KV-cache bytes of a token count for a model layout (offline)", "",
       "radixkvctl size --layers=24 --kv-heads=8 --head-dim=64 --dtype=fp16 "
       "--tokens=4096",
       "bytes = layers x 2 (K and V) x kv_heads x head_dim x dtype bytes x "
       "tokens, plus for fp8_e4m3, fp8_e5m2 and int8 each page's scale area "
       "(layers x 2 x kv_heads fp32 scales); pages = ceil(tokens / "
       "page_size); page_bytes includes the scales.",
       {{"layers", true, "number of layers (required)"},
        {"kv-heads", true, "KV heads (required)"},
        {"head-dim", true, "head dimension (required)"},
        {"dtype", true, "fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8 (required)",
         DTypeNames()},
        {"tokens", true, "token count (required)"},
        {"page-size", true, "tokens per page (default 16)"}},
       RunSize},
      {"version", keys,
       "Print radixkvctl's version (and the daemon's when reachable)", "",
       "radixkvctl version", "", {}, RunVersion},
  };
}

}  // namespace radixkv::ctl
