#include "daemon/core/request_validation.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gpu/namespace_geometry.h"
#include "radixkv/defaults.h"
#include "radixkv/errors.h"
#include "radixkv/namespace_spec.h"

namespace radixkv::daemon {
namespace {

// tokens_le is read in place as host u32 values; a big-endian host would
// have to byte-swap a copy instead.
static_assert(std::endian::native == std::endian::little,
              "radixkvd reads tokens_le in place: little-endian hosts only");

// Largest page a layout may describe; anything above is surely a typo.
constexpr unsigned __int128 kMaxPageBytes = uint64_t{1} << 40;

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return FieldError(absl::StatusCode::kInvalidArgument, field,
                    v1::ERROR_REASON_INVALID, message);
}

// Key mode: block_keys or block_keys_packed, parsed into p->keys.
absl::Status ParseKeys(const PromptFields& f, uint32_t page_size,
                       const RequestLimits& limits, Prompt* p) {
  const bool packed = !f.block_keys_packed.empty();
  const char* field = packed ? "block_keys_packed" : "block_keys";
  if (!limits.allow_key_mode) {
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      v1::ERROR_REASON_INVALID,
                      "key mode is disabled on this daemon (unverifiable "
                      "hits); send tokens, or start radixkvd with "
                      "--allow_key_mode");
  }
  if (packed && f.block_keys_packed.size() % BlockKey::kBytes != 0) {
    return Invalid(field, absl::StrCat(f.block_keys_packed.size(),
                                       " bytes is not a multiple of ",
                                       BlockKey::kBytes,
                                       " (one 16-byte key per block)"));
  }
  const uint64_t count = packed ? f.block_keys_packed.size() / BlockKey::kBytes
                                : static_cast<uint64_t>(f.block_keys.size());
  const uint32_t max_tokens = limits.max_prompt_tokens;
  const uint32_t max_keys = std::max<uint32_t>(1, max_tokens / page_size);
  if (count > max_keys) {
    return Invalid(field, absl::StrCat(count, " keys exceed the limit ",
                                       max_keys, " (--max_prompt_tokens=",
                                       max_tokens, " / page_size ", page_size,
                                       ")"));
  }
  p->keys.reserve(count);
  if (packed) {
    const char* data = f.block_keys_packed.data();
    for (uint64_t i = 0; i < count; ++i) {
      p->keys.push_back(BlockKey::FromCanonical(
          absl::string_view(data + i * BlockKey::kBytes, BlockKey::kBytes)));
    }
  } else {
    for (int i = 0; i < f.block_keys.size(); ++i) {
      const std::string& k = f.block_keys[i];
      if (k.size() != BlockKey::kBytes) {
        return Invalid(absl::StrCat("block_keys[", i, "]"),
                       absl::StrCat(k.size(), " bytes; a block key is "
                                    "exactly ", BlockKey::kBytes, " bytes"));
      }
      p->keys.push_back(BlockKey::FromCanonical(k));
    }
  }
  p->key_mode = true;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckString(absl::string_view field, const std::string& value,
                         uint32_t limit) {
  if (value.size() > limit) {
    return Invalid(field, absl::StrCat(value.size(),
                                       " bytes exceed the limit "
                                       "--max_string_bytes=",
                                       limit));
  }
  return absl::OkStatus();
}

absl::StatusOr<NamespaceSpec> ValidateNamespace(const v1::Namespace& ns,
                                                const RequestLimits& limits) {
  const uint32_t lim = limits.max_string_bytes;
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"namespace.model",
                                                   &ns.model()},
        {"namespace.model_revision", &ns.model_revision()},
        {"namespace.lora", &ns.lora()},
        {"namespace.cache_salt", &ns.cache_salt()}}) {
    if (absl::Status s = CheckString(field, *value, lim); !s.ok()) return s;
  }
  if (ns.page_size() == 0 || ns.page_size() > limits.max_page_size) {
    return Invalid("namespace.page_size",
                   absl::StrCat(ns.page_size(), " is outside 1..",
                                limits.max_page_size, " (--max_page_size)"));
  }
  if (!v1::DType_IsValid(ns.dtype())) {
    return Invalid("namespace.dtype",
                   absl::StrCat("unknown value ", static_cast<int>(ns.dtype()),
                                " (see enum radixkv.v1.DType)"));
  }
  const uint32_t tp_size = ns.tp_size() == 0 ? 1 : ns.tp_size();
  if (ns.tp_rank() >= tp_size) {
    return Invalid("namespace.tp_rank",
                   absl::StrCat(ns.tp_rank(), " must be below namespace.tp_size=",
                                tp_size));
  }
  if (ns.has_cross_layer()) {
    // A cross-layer layout is part of the namespace identity and fixes the
    // page size (docs/CONTRACTS.md §2.2); refuse one no worker can serve.
    const CrossLayerKv layout{ns.cross_layer().shared_from_layer(),
                              ns.cross_layer().local_window()};
    if (std::optional<CrossLayerProblem> bad =
            CheckCrossLayerKv(ns.num_layers(), layout)) {
      return Invalid(absl::StrCat("namespace.cross_layer.", bad->field),
                     bad->message);
    }
  }
  NamespaceSpec spec = NamespaceFromProto(ns);
  const unsigned __int128 bytes =
      static_cast<unsigned __int128>(spec.num_layers) * 2 * spec.num_kv_heads *
      spec.page_size * spec.head_dim * DTypeBytes(spec.dtype);
  if (bytes > kMaxPageBytes) {
    return Invalid("namespace",
                   "num_layers x 2 x num_kv_heads x page_size x head_dim x "
                   "dtype bytes exceeds the 1 TiB page limit");
  }
  return spec;
}

absl::StatusOr<Prompt> ValidatePrompt(const PromptFields& f,
                                      uint32_t page_size,
                                      const RequestLimits& limits) {
  const uint32_t max_tokens = limits.max_prompt_tokens;
  const int forms = int{!f.tokens.empty()} + int{!f.tokens_le.empty()} +
                    int{!f.block_keys.empty()} +
                    int{!f.block_keys_packed.empty()};
  if (forms > 1) {
    return Invalid(
        "tokens, tokens_le, block_keys, block_keys_packed",
        absl::StrCat("set exactly one (got ", f.tokens.size(), " tokens, ",
                     f.tokens_le.size(), " bytes of tokens_le, ",
                     f.block_keys.size(), " block_keys and ",
                     f.block_keys_packed.size(),
                     " bytes of block_keys_packed)"));
  }
  Prompt p;
  if (!f.block_keys.empty() || !f.block_keys_packed.empty()) {
    if (absl::Status s = ParseKeys(f, page_size, limits, &p); !s.ok()) {
      return s;
    }
    return p;
  }
  if (!f.tokens_le.empty()) {
    const std::string& le = f.tokens_le;
    if (le.size() % sizeof(uint32_t) != 0) {
      return Invalid("tokens_le",
                     absl::StrCat(le.size(),
                                  " bytes is not a multiple of 4 "
                                  "(little-endian u32 token ids)"));
    }
    const size_t n = le.size() / sizeof(uint32_t);
    if (n > max_tokens) {
      return Invalid("tokens_le",
                     absl::StrCat(n, " ids exceed the limit "
                                  "--max_prompt_tokens=", max_tokens));
    }
    p.tokens = TokensLeView(le, &p.tokens_copy);
    return p;
  }
  if (f.tokens.empty()) {
    return Invalid("tokens",
                   absl::StrCat("empty; send 1..", max_tokens,
                                " token ids (--max_prompt_tokens) in tokens "
                                "or tokens_le"));
  }
  if (static_cast<uint64_t>(f.tokens.size()) > max_tokens) {
    return Invalid("tokens", absl::StrCat(f.tokens.size(),
                                          " ids exceed the limit "
                                          "--max_prompt_tokens=",
                                          max_tokens));
  }
  p.tokens = absl::MakeConstSpan(f.tokens.data(),
                                 static_cast<size_t>(f.tokens.size()));
  return p;
}

absl::Status CheckReleaseLeaseList(
    const google::protobuf::RepeatedField<uint64_t>& leases) {
  if (leases.size() > kMaxReleaseLeasesPerAcquire) {
    return Invalid("release_leases",
                   absl::StrCat(leases.size(), " leases, at most ",
                                kMaxReleaseLeasesPerAcquire));
  }
  for (int i = 0; i < leases.size(); ++i) {
    for (int j = 0; j < i; ++j) {
      if (leases[i] == leases[j]) {
        return Invalid("release_leases",
                       absl::StrCat("lease ", leases[i], " is listed twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlockPriority>> ConvertPriorities(
    const google::protobuf::RepeatedPtrField<v1::BlockPriority>& ranges) {
  if (static_cast<size_t>(ranges.size()) > kMaxPriorityRanges) {
    return Invalid("priorities", absl::StrCat(ranges.size(), " ranges, at most ",
                                              kMaxPriorityRanges));
  }
  const uint64_t max_ms =
      static_cast<uint64_t>(absl::ToInt64Milliseconds(kMaxPriorityDuration));
  std::vector<BlockPriority> out;
  out.reserve(ranges.size());
  for (int i = 0; i < ranges.size(); ++i) {
    const v1::BlockPriority& r = ranges[i];
    const std::string field = absl::StrCat("priorities[", i, "]");
    if (r.priority() > kMaxPriority) {
      return Invalid(absl::StrCat(field, ".priority"),
                     absl::StrCat(r.priority(), " exceeds the limit of ",
                                  kMaxPriority));
    }
    if (r.duration_ms() > max_ms) {
      return Invalid(absl::StrCat(field, ".duration_ms"),
                     absl::StrCat(r.duration_ms(), " exceeds the limit of ",
                                  max_ms, " (30 days)"));
    }
    if (r.blocks() == 0) {
      return Invalid(absl::StrCat(field, ".blocks"), "must be at least 1");
    }
    out.push_back({.first_block = r.first_block(),
                   .blocks = r.blocks(),
                   .priority = r.priority(),
                   .duration = r.duration_ms() == 0
                                   ? absl::InfiniteDuration()
                                   : absl::Milliseconds(r.duration_ms())});
  }
  return out;
}

absl::Span<const uint32_t> TokensLeView(absl::string_view bytes,
                                        std::vector<uint32_t>* copy) {
  const size_t n = bytes.size() / sizeof(uint32_t);
  // The wire form is the host's form (little-endian, asserted above), so the
  // ids are used in place when the bytes are aligned, which protobuf's string
  // storage is in practice; otherwise they are copied once.
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint32_t) == 0) {
    return absl::MakeConstSpan(reinterpret_cast<const uint32_t*>(bytes.data()),
                               n);
  }
  copy->resize(n);
  if (n > 0) std::memcpy(copy->data(), bytes.data(), n * sizeof(uint32_t));
  return *copy;
}

}  // namespace radixkv::daemon
