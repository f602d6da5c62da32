#include "daemon/tier_spec.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpu/pool.h"

namespace radixkv::daemon {
namespace {

absl::Status Bad(absl::string_view spec, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--tier=", spec, ": ", what,
                   " (expected disk,path=DIR,bytes=SIZE[,io_threads=N]"
                   "[,demote=drop|wait])"));
}

}  // namespace

absl::StatusOr<TierSpec> ParseTierSpec(absl::string_view spec) {
  const std::vector<absl::string_view> parts = absl::StrSplit(spec, ',');
  if (parts[0] == "host") {
    return Bad(spec,
               "a host tier (pinned host memory below a cuda pool) is not "
               "built yet; use a disk tier below a host pool");
  }
  if (parts[0] != "disk") {
    return Bad(spec, absl::StrCat("unknown tier kind '", parts[0], "'"));
  }
  TierSpec out;
  bool have_bytes = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    const auto& [key, value] = kv;
    if (key == "path") {
      if (value.empty()) return Bad(spec, "path is empty");
      out.path = std::string(value);
    } else if (key == "bytes") {
      if (!gpu::ParseSize(value, &out.bytes) || out.bytes == 0) {
        return Bad(spec, absl::StrCat("bytes=", value, " is not a size > 0"));
      }
      have_bytes = true;
    } else if (key == "demote") {
      if (value != "drop" && value != "wait") {
        return Bad(spec, absl::StrCat("demote=", value, " is not drop or wait"));
      }
      out.wait_for_staging = value == "wait";
    } else if (key == "io_threads") {
      if (!absl::SimpleAtoi(value, &out.io_threads) || out.io_threads < 1 ||
          out.io_threads > 64) {
        return Bad(spec, absl::StrCat("io_threads=", value, " is not in 1..64"));
      }
    } else {
      return Bad(spec, absl::StrCat("unknown key '", key, "'"));
    }
  }
  if (out.path.empty()) return Bad(spec, "path= is required");
  if (!have_bytes) return Bad(spec, "bytes= is required");
  return out;
}

}  // namespace radixkv::daemon
