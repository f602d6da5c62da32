#include "daemon/tiers/tier_spec.h"

#include <cassert>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpu/pool.h"

namespace radixkv::daemon {
namespace {

constexpr absl::string_view kUsage =
    " (expected host,bytes=SIZE and/or disk,path=DIR,bytes=SIZE"
    "[,io_threads=N][,demote=drop|wait], top to bottom, separated by ';')";

absl::Status Bad(absl::string_view spec, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--tier=", spec, ": ", what, kUsage));
}

// One tier's "kind,key=value,..." (`spec` is the whole flag, for errors).
absl::StatusOr<TierSpec> ParseOne(absl::string_view spec,
                                  absl::string_view one) {
  const std::vector<absl::string_view> parts = absl::StrSplit(one, ',');
  TierSpec out;
  if (!ParseTierKind(parts[0], &out.kind)) {
    return Bad(spec, absl::StrCat("unknown tier kind '", parts[0], "'"));
  }
  const bool disk = out.kind == TierSpec::Kind::kDisk;
  const absl::string_view kind = TierKindInfoOf(out.kind).name;
  bool have_bytes = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    const auto& [key, value] = kv;
    if (key == "bytes") {
      if (!gpu::ParseSize(value, &out.bytes) || out.bytes == 0) {
        return Bad(spec, absl::StrCat(kind, ": bytes=", value,
                                      " is not a size > 0"));
      }
      have_bytes = true;
    } else if (disk && key == "path") {
      if (value.empty()) return Bad(spec, "disk: path is empty");
      out.path = std::string(value);
    } else if (disk && key == "demote") {
      if (value != "drop" && value != "wait") {
        return Bad(spec, absl::StrCat("disk: demote=", value,
                                      " is not drop or wait"));
      }
      out.wait_for_staging = value == "wait";
    } else if (disk && key == "io_threads") {
      if (!absl::SimpleAtoi(value, &out.io_threads) || out.io_threads < 1 ||
          out.io_threads > 64) {
        return Bad(spec, absl::StrCat("disk: io_threads=", value,
                                      " is not in 1..64"));
      }
    } else {
      return Bad(spec, absl::StrCat(kind, ": unknown key '", key, "'"));
    }
  }
  if (disk && out.path.empty()) return Bad(spec, "disk: path= is required");
  if (!have_bytes) return Bad(spec, absl::StrCat(kind, ": bytes= is required"));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<TierSpec>> ParseTierSpecs(absl::string_view spec) {
  std::vector<TierSpec> out;
  for (absl::string_view one : absl::StrSplit(spec, ';')) {
    absl::StatusOr<TierSpec> t = ParseOne(spec, one);
    if (!t.ok()) return t.status();
    if (!out.empty()) {
      if (out.back().kind == t->kind) {
        return Bad(spec, "names the same kind of tier twice");
      }
      if (t->kind == TierSpec::Kind::kHost) {
        return Bad(spec, "a host tier goes above the disk tier (name it first)");
      }
    }
    out.push_back(*std::move(t));
  }
  // At most one tier of each kind, the host tier first.
  assert(out.size() <= 2 &&
         (out.size() < 2 || out[0].kind == TierSpec::Kind::kHost));
  return out;
}

}  // namespace radixkv::daemon
