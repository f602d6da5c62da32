// radixkvctl commands about prompts and block keys: match, explain, hash,
// size, version. hash, size and version work without a daemon.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/ctl/ctl.h"
#include "client/ctl/output.h"
#include "gpu/namespace_geometry.h"
#include "nlohmann/json.hpp"
#include "radixkv/namespace_spec.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

#ifndef RADIXKV_VERSION
#define RADIXKV_VERSION "unknown"
#endif

namespace radixkv::ctl {
namespace {

// The options of match, explain and hash: a namespace and token ids.
struct PromptOptions {
  NamespaceOptions ns;
  std::optional<std::string> file;  // --file: more token ids
  std::vector<std::string> tokens;  // positional
  bool no_headers = false;          // explain and hash (they print a table)
};

// match: namespace flags, --file and the tokens.
void AddMatchFlags(CLI::App& app, PromptOptions& o, CompletionValues& values) {
  AddNamespaceFlags(app, &o.ns, values, /*raw=*/false);
  AddTokenFileFlag(app, &o.file, values);
  AddTokensPositional(app, &o.tokens);
}

// explain and hash print a table: also --no-headers. `kRaw`: the permissive
// namespace flags of `hash` (see NamespaceFromOptions).
template <bool kRaw>
void AddPromptTableFlags(CLI::App& app, PromptOptions& o,
                         CompletionValues& values) {
  AddNamespaceFlags(app, &o.ns, values, kRaw);
  AddTokenFileFlag(app, &o.file, values);
  AddNoHeadersFlag(app, &o.no_headers);
  AddTokensPositional(app, &o.tokens);
}

// A prompt given on the command line: its namespace and token ids.
struct Prompt {
  NamespaceSpec ns;
  std::vector<uint32_t> tokens;
};

// Builds the prompt from `o`; on failure prints the error and returns its
// exit code, else kExitOk. `raw`: the permissive parsing of `hash` (see
// NamespaceFromOptions).
int ParsePrompt(Context& ctx, const PromptOptions& o, Prompt* prompt,
                bool raw = false) {
  absl::StatusOr<NamespaceSpec> spec = NamespaceFromOptions(o.ns, raw);
  if (!spec.ok()) return BadArgs(ctx, std::string(spec.status().message()));
  absl::StatusOr<std::vector<uint32_t>> t = ParseTokens(o.tokens, o.file, raw);
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

int RunMatch(Context& ctx, const PromptOptions& o) {
  Prompt prompt;
  if (int exit = ParsePrompt(ctx, o, &prompt); exit != kExitOk) return exit;
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
        if (resp.tier_matched_blocks() != 0) {
          std::vector<std::string> parts;
          for (const v1::TierBlockCount& c : resp.tier_matched()) {
            if (c.blocks() != 0) parts.push_back(absl::StrCat(c.blocks(), " ", c.kind()));
          }
          out << absl::StrFormat(
              "then %u more blocks in the tiers below the pool (%s): an "
              "Acquire would promote them\n",
              resp.tier_matched_blocks(), absl::StrJoin(parts, ", "));
        }
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
    case v1::BLOCK_STATE_IN_TIER: return "in-tier";
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
        << " blocks cached";
    if (resp.tier_blocks() != 0) {
      out << ", " << resp.tier_blocks() << " more in the tiers below the pool";
    }
    out << "\n";
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

int RunExplain(Context& ctx, const PromptOptions& o) {
  ApplyNoHeaders(ctx, o.no_headers);
  Prompt prompt;
  if (int exit = ParsePrompt(ctx, o, &prompt); exit != kExitOk) return exit;
  return CallAndPrint(ctx, &v1::Admin::Stub::Explain,
                      PromptRequest<v1::ExplainRequest>(prompt),
                      [&](const v1::ExplainResponse& resp, std::ostream& out) {
                        PrintExplain(resp, prompt.ns.page_size, out);
                      });
}

// ---- pin ----------------------------------------------------------------------

int RunPin(Context& ctx, const PromptOptions& o) {
  Prompt prompt;
  if (int exit = ParsePrompt(ctx, o, &prompt); exit != kExitOk) return exit;
  return CallAndPrint(
      ctx, &v1::Admin::Stub::Pin, PromptRequest<v1::PinRequest>(prompt),
      [&](const v1::PinResponse& resp, std::ostream& out) {
        out << absl::StrFormat(
            "pin %u: %u of %u blocks (%u tokens) pinned in namespace %s\n",
            resp.pin_id(), resp.pinned_blocks(), resp.total_blocks(),
            resp.pinned_tokens(), Hex(resp.namespace_id(), 12));
      });
}

// ---- hash ---------------------------------------------------------------------

int RunHash(Context& ctx, const PromptOptions& o) {
  ApplyNoHeaders(ctx, o.no_headers);
  Prompt prompt;
  if (int exit = ParsePrompt(ctx, o, &prompt, /*raw=*/true); exit != kExitOk) {
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

// The KV bytes of `tokens` tokens for one layout: `groups` K/V groups per
// token (layers, or with a cross-layer layout the lower layers plus the
// bank).
struct SizeResult {
  uint64_t bytes = 0;       // tokens' K/V plus each page's scale area
  uint64_t per_token = 0;   // groups x 2 x kv_heads x head_dim x dtype bytes
  uint64_t page_bytes = 0;  // scale area included
  uint64_t scale_bytes = 0;
};

// INVALID_ARGUMENT when a result does not fit in 64 bits.
absl::StatusOr<SizeResult> SizeOf(const NamespaceSpec& spec, uint64_t tokens) {
  const uint64_t groups = spec.KvGroups();
  const unsigned __int128 per_token128 = static_cast<unsigned __int128>(groups) *
                                         2 * spec.num_kv_heads * spec.head_dim *
                                         DTypeBytes(spec.dtype);
  const uint64_t pages = (tokens + spec.page_size - 1) / spec.page_size;
  const unsigned __int128 elems_page128 = per_token128 * spec.page_size;
  if (per_token128 * tokens > ~uint64_t{0} || elems_page128 > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError("size: the result does not fit in 64 bits");
  }
  // fp8 and int8 pages also hold one fp32 scale per group, K|V and KV head
  // (docs/CONTRACTS.md §2.1): NamespacePageBytes is the page size a pool
  // uses.
  SizeResult r;
  r.scale_bytes = NamespaceScaleBytes(spec);
  const unsigned __int128 page128 = elems_page128 + r.scale_bytes;
  const unsigned __int128 bytes128 =
      per_token128 * tokens + static_cast<unsigned __int128>(pages) * r.scale_bytes;
  if (bytes128 > ~uint64_t{0} ||
      static_cast<unsigned __int128>(pages) * page128 > ~uint64_t{0}) {
    return absl::InvalidArgumentError("size: the result does not fit in 64 bits");
  }
  r.bytes = static_cast<uint64_t>(bytes128);
  r.per_token = static_cast<uint64_t>(per_token128);
  r.page_bytes = static_cast<uint64_t>(page128);
  return r;
}

// Prints `size`'s answer: r for spec's layout, per_layer for the same model
// with per-layer KV (equal to r without a cross-layer layout).
void PrintSize(Context& ctx, const NamespaceSpec& spec, uint64_t tokens,
               const SizeResult& r, const SizeResult& per_layer) {
  const uint64_t pages = (tokens + spec.page_size - 1) / spec.page_size;
  const uint64_t elem = DTypeBytes(spec.dtype);
  const bool xl = spec.cross_layer.has_value();
  const std::string layout =
      xl ? absl::StrCat("xlayer:", spec.cross_layer->shared_from_layer)
         : "per-layer";
  auto json = [&] {
    nlohmann::ordered_json j;
    j["bytes"] = r.bytes;
    j["pages"] = pages;
    j["page_bytes"] = r.page_bytes;
    j["bytes_per_token"] = r.per_token;
    j["tokens"] = tokens;
    j["page_size"] = spec.page_size;
    j["scale_bytes_per_page"] = r.scale_bytes;
    if (xl) {
      j["layout"] = layout;
      j["local_window"] = spec.cross_layer->local_window;
      j["kv_groups"] = spec.KvGroups();
      j["shared_layers"] = spec.num_layers - spec.cross_layer->shared_from_layer;
      j["per_layer_bytes"] = per_layer.bytes;
      j["per_layer_bytes_per_token"] = per_layer.per_token;
      j["saved_bytes"] = per_layer.bytes - r.bytes;
    }
    return j.dump();
  };
  PrintResult(ctx, json, [&] {
    KeyValueList kv;
    kv.Add("kv bytes", absl::StrCat(HumanBytes(r.bytes), " (", r.bytes, " B)"));
    const std::string groups =
        xl ? absl::StrCat(spec.cross_layer->shared_from_layer, " layers + 1 bank")
           : absl::StrCat(spec.num_layers, " layers");
    kv.Add("per token", absl::StrCat(HumanBytes(r.per_token), " (", groups,
                                     " x 2 x ", spec.num_kv_heads,
                                     " kv heads x ", spec.head_dim, " dims x ",
                                     elem, " B)"));
    if (xl) {
      kv.Add("layout", absl::StrCat(
                           layout, ": layers 0-",
                           spec.cross_layer->shared_from_layer - 1,
                           " keep their own K/V, layers ",
                           spec.cross_layer->shared_from_layer, "-",
                           spec.num_layers - 1, " share one bank (",
                           spec.KvGroups(), " groups instead of ",
                           spec.num_layers, ")"));
      kv.Add("per-layer kv", absl::StrCat(HumanBytes(per_layer.bytes), " (",
                                          per_layer.bytes, " B)"));
      kv.Add("saved", absl::StrCat(HumanBytes(per_layer.bytes - r.bytes), " (",
                                   Percent(per_layer.bytes - r.bytes,
                                           per_layer.bytes),
                                   " of per-layer)"));
    }
    kv.Add("pages", absl::StrCat(pages, " of ", spec.page_size, " tokens"));
    kv.Add("page bytes", HumanBytes(r.page_bytes));
    if (r.scale_bytes > 0) {
      kv.Add("scales", absl::StrCat(r.scale_bytes, " B per page (",
                                    spec.KvGroups(), xl ? " groups" : " layers",
                                    " x 2 x ", spec.num_kv_heads,
                                    " kv heads x 4 B fp32, 16 B aligned)"));
    }
    kv.Add("pool bytes", absl::StrCat(HumanBytes(pages * r.page_bytes),
                                      " (whole pages)"));
    kv.Print(*ctx.out);
  });
}

// The options of size: a model layout and a token count.
struct SizeOptions {
  std::optional<uint32_t> layers;    // required
  std::optional<uint32_t> kv_heads;  // required
  std::optional<uint32_t> head_dim;  // required
  std::optional<std::string> dtype;  // required; ParseDType
  std::optional<uint64_t> tokens;    // required
  uint32_t page_size = 16;
  std::string layout;  // ParseLayout; empty: per-layer
};

constexpr uint64_t kMaxSizeTokens = uint64_t{1} << 40;

void AddSizeFlags(CLI::App& app, SizeOptions& o, CompletionValues& values) {
  constexpr uint64_t kU32Max = 0xffffffffu;
  AddUintFlag(app, "layers", &o.layers, 1, kU32Max,
              "number of layers (required)");
  AddUintFlag(app, "kv-heads", &o.kv_heads, 1, kU32Max,
              "KV heads (required)");
  AddUintFlag(app, "head-dim", &o.head_dim, 1, kU32Max,
              "head dimension (required)");
  values[AddValueFlag(app, "dtype", &o.dtype,
                      "fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8 (required)")] =
      DTypeNames();
  AddUintFlag(app, "tokens", &o.tokens, 0, kMaxSizeTokens,
              "token count (required)");
  AddUintFlag(app, "page-size", &o.page_size, 1, kU32Max,
              "tokens per page (default 16)");
  AddValueFlag(app, "layout", &o.layout,
               "per-layer (default) or xlayer:S[:W]: layers S.. share one K/V "
               "bank (1 <= S < layers; W, the local window, <= 65536, holds "
               "no page bytes)");
}

int RunSize(Context& ctx, const SizeOptions& o) {
  constexpr uint64_t kU32Max = 0xffffffffu;
  struct Required {
    const char* name;
    bool given;
    uint64_t min, max;
  };
  for (const Required& r : {Required{"layers", o.layers.has_value(), 1, kU32Max},
                            Required{"kv-heads", o.kv_heads.has_value(), 1, kU32Max},
                            Required{"head-dim", o.head_dim.has_value(), 1, kU32Max},
                            Required{"tokens", o.tokens.has_value(), 0,
                                     kMaxSizeTokens}}) {
    if (!r.given) {
      return BadArgs(ctx, absl::StrCat("--", r.name,
                                       " is required (an integer in ", r.min,
                                       "..", r.max, ")"));
    }
  }
  if (!o.dtype.has_value()) {
    return BadArgs(ctx, "--dtype is required (fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8)");
  }
  absl::StatusOr<DType> dtype = ParseDType(*o.dtype);
  if (!dtype.ok()) return BadArgs(ctx, std::string(dtype.status().message()));
  NamespaceSpec spec;
  spec.num_layers = *o.layers;
  spec.num_kv_heads = *o.kv_heads;
  spec.head_dim = *o.head_dim;
  spec.page_size = o.page_size;
  spec.dtype = *dtype;
  NamespaceSpec plain = spec;
  if (absl::Status st = ParseLayout(o.layout, /*check=*/true, &spec); !st.ok()) {
    return BadArgs(ctx, std::string(st.message()));
  }
  absl::StatusOr<SizeResult> r = SizeOf(spec, *o.tokens);
  absl::StatusOr<SizeResult> per_layer = SizeOf(plain, *o.tokens);
  if (!r.ok()) return BadArgs(ctx, std::string(r.status().message()));
  if (!per_layer.ok()) return BadArgs(ctx, std::string(per_layer.status().message()));
  PrintSize(ctx, spec, *o.tokens, *r, *per_layer);
  return kExitOk;
}

// ---- version --------------------------------------------------------------------

int RunVersion(Context& ctx, const NoOptions&) {
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
  // name, group, summary, example, details, flags and run
  return {
      {"match", keys, "How much of a prompt is cached (read-only, no session)",
       "radixkvctl match --model=llama --layers=32 --kv-heads=8 --head-dim=128 "
       "--dtype=bf16 1 2 3 4\nradixkvctl match --model=llama --layers=32 "
       "--kv-heads=8 --head-dim=128 --dtype=bf16 --file=prompt.txt -o json",
       "Tokens are ids: separate arguments, comma lists, or --file.",
       CommandWith(AddMatchFlags, RunMatch)},
      {"explain", keys, "Per block of a prompt: cached or not, and why not",
       "radixkvctl explain --model=llama --layers=32 --kv-heads=8 "
       "--head-dim=128 --dtype=bf16 --file=prompt.txt",
       "States: cached, not-present (never cached), evicted (dropped for "
       "room), token-mismatch (hash collision), wrong-namespace (cached for "
       "another model/LoRA/salt/layout), parent-missing (an earlier block is "
       "not cached, so this one cannot hit).",
       CommandWith(AddPromptTableFlags<false>, RunExplain)},
      {"pin", "Pins",
       "Keep a prompt's cached blocks (a system prompt) until unpinned",
       "radixkvctl pin --model=llama --layers=32 --kv-heads=8 --head-dim=128 "
       "--dtype=bf16 --file=system_prompt.txt",
       "Pins the leading blocks of the prompt that are cached now in the "
       "namespace the flags name (with your tenant's salt): no eviction "
       "takes them until `radixkvctl unpin ID`. Prints the pin's id. Fails "
       "when no block is cached yet (exit 1), or when the pin would exceed "
       "the tenant's max_pin_pages or weighted share of the pool (exit 1; "
       "the error names the limit). A tenant pins in its own namespaces only.",
       CommandWith(AddMatchFlags, RunPin)},
      {"hash", keys, "Block keys of a token list for a namespace (offline)",
       "radixkvctl hash --model=llama --layers=32 --kv-heads=8 --head-dim=128 "
       "--dtype=bf16 --page-size=4 1 2 3 4 5 6 7 8",
       "Prints the namespace root and one key per full block, per the "
       "block-key contract v1 (docs/CONTRACTS.md section 1); needs no daemon. "
       "With -o json keys are 32 lowercase hex digits.",
       CommandWith(AddPromptTableFlags<true>, RunHash)},
      {"size", keys,
       "KV-cache bytes of a token count for a model layout (offline)",
       "radixkvctl size --layers=24 --kv-heads=8 --head-dim=64 --dtype=fp16 "
       "--tokens=4096\nradixkvctl size --layers=40 --kv-heads=8 "
       "--head-dim=128 --dtype=bf16 --tokens=4096 --layout=xlayer:21",
       "bytes = layers x 2 (K and V) x kv_heads x head_dim x dtype bytes x "
       "tokens, plus for fp8_e4m3, fp8_e5m2 and int8 each page's scale area "
       "(layers x 2 x kv_heads fp32 scales); pages = ceil(tokens / "
       "page_size); page_bytes includes the scales. With "
       "--layout=xlayer:S the layers from S on share one K/V bank: S + 1 "
       "groups take the place of the layers, and the answer adds the "
       "per-layer bytes and the saving (docs/CONTRACTS.md section 2.2).",
       CommandWith(AddSizeFlags, RunSize)},
      {"version", keys,
       "Print radixkvctl's version (and the daemon's when reachable)",
       "radixkvctl version", "", CommandWith(AddNoFlags, RunVersion)},
  };
}

}  // namespace radixkv::ctl
