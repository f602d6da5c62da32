#include "daemon/tiers/tier_spec.h"

#include <cassert>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpu/pool.h"

namespace radixkv::daemon {
namespace {

constexpr absl::string_view kUsage =
    " (expected host,bytes=SIZE, disk,path=DIR,bytes=SIZE"
    "[,io_threads=N][,demote=drop|wait] and remote,addr=HOST:PORT[,...], "
    "top to bottom, separated by ';')";

absl::Status Bad(absl::string_view spec, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--tier=", spec, ": ", what, kUsage));
}


bool ParseDurationIn(absl::string_view v, absl::Duration lo, absl::Duration hi,
                     absl::Duration* out) {
  absl::Duration d;
  if (!absl::ParseDuration(v, &d) || d < lo || d > hi) return false;
  *out = d;
  return true;
}

bool ValidPrefix(absl::string_view p) {
  if (p.empty() || p.size() > 64) return false;
  for (char c : p) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

// A remote tier's key (`kind` is "remote"); false when `key` is not one.
absl::Status ParseRemoteKey(absl::string_view spec, absl::string_view key,
                            absl::string_view value, TierSpec* out,
                            bool* known) {
  *known = true;
  if (key == "addr") {
    absl::StatusOr<RedisEndpoint> e = ParseRedisEndpoint(value);
    if (!e.ok()) return Bad(spec, absl::StrCat("remote: addr=", e.status().message()));
    out->addrs.push_back(*std::move(e));
  } else if (key == "prefix") {
    if (!ValidPrefix(value)) {
      return Bad(spec, absl::StrCat("remote: prefix=", value,
                                    " is not 1..64 of [A-Za-z0-9_.-]"));
    }
    out->prefix = std::string(value);
  } else if (key == "user") {
    if (value.empty()) return Bad(spec, "remote: user is empty");
    out->user = std::string(value);
  } else if (key == "password_file") {
    if (value.empty()) return Bad(spec, "remote: password_file is empty");
    out->password_file = std::string(value);
  } else if (key == "timeout") {
    if (!ParseDurationIn(value, absl::Milliseconds(1), absl::Seconds(60),
                         &out->timeout)) {
      return Bad(spec, absl::StrCat("remote: timeout=", value,
                                    " is not a duration in 1ms..60s"));
    }
  } else if (key == "ttl") {
    if (!ParseDurationIn(value, absl::ZeroDuration(), absl::Hours(24 * 365),
                         &out->ttl)) {
      return Bad(spec, absl::StrCat("remote: ttl=", value,
                                    " is not a duration in 0..8760h"));
    }
  } else if (key == "queue") {
    if (!gpu::ParseSize(value, &out->queue_bytes) || out->queue_bytes == 0) {
      return Bad(spec, absl::StrCat("remote: queue=", value, " is not a size > 0"));
    }
  } else if (key == "writers") {
    if (!absl::SimpleAtoi(value, &out->writers) || out->writers < 1 ||
        out->writers > 16) {
      return Bad(spec, absl::StrCat("remote: writers=", value, " is not in 1..16"));
    }
  } else if (key == "breaker_failures") {
    if (!absl::SimpleAtoi(value, &out->breaker_failures) ||
        out->breaker_failures < 1 || out->breaker_failures > 1000) {
      return Bad(spec, absl::StrCat("remote: breaker_failures=", value,
                                    " is not in 1..1000"));
    }
  } else if (key == "tls") {
    if (value != "on" && value != "off") {
      return Bad(spec, absl::StrCat("remote: tls=", value, " is not on or off"));
    }
    out->tls = value == "on";
  } else if (key == "tls_ca" || key == "tls_cert" || key == "tls_key" ||
             key == "tls_name") {
    if (value.empty()) return Bad(spec, absl::StrCat("remote: ", key, " is empty"));
    std::string* dst = key == "tls_ca"     ? &out->tls_ca
                       : key == "tls_cert" ? &out->tls_cert
                       : key == "tls_key"  ? &out->tls_key
                                           : &out->tls_name;
    *dst = std::string(value);
    out->tls = true;
  } else if (key == "write") {
    if (value != "evicted" && value != "all") {
      return Bad(spec, absl::StrCat("remote: write=", value,
                                    " is not evicted or all"));
    }
    out->write_all = value == "all";
  } else if (key == "breaker_cooldown") {
    if (!ParseDurationIn(value, absl::Milliseconds(1), absl::Hours(1),
                         &out->breaker_cooldown)) {
      return Bad(spec, absl::StrCat("remote: breaker_cooldown=", value,
                                    " is not a duration in 1ms..1h"));
    }
  } else {
    *known = false;
  }
  return absl::OkStatus();
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
  const bool remote = out.kind == TierSpec::Kind::kRemote;
  const absl::string_view kind = TierKindInfoOf(out.kind).name;
  bool have_bytes = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    const auto& [key, value] = kv;
    if (key == "bytes" && !remote) {  // the store sizes itself
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
      bool known = false;
      if (remote) {
        absl::Status st = ParseRemoteKey(spec, key, value, &out, &known);
        if (!st.ok()) return st;
      }
      if (!known) {
        return Bad(spec, absl::StrCat(kind, ": unknown key '", key, "'"));
      }
    }
  }
  if (disk && out.path.empty()) return Bad(spec, "disk: path= is required");
  if (remote) {
    if (out.addrs.empty()) {
      return Bad(spec, "remote: addr=HOST:PORT is required (a node of the store)");
    }
    return out;
  }
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
      for (const TierSpec& above : out) {
        if (above.kind == t->kind) {
          return Bad(spec, "names the same kind of tier twice");
        }
      }
      // kTierKinds' order is the chain's: host, disk, remote.
      if (TierKindInfoOf(t->kind).medium < TierKindInfoOf(out.back().kind).medium) {
        return Bad(spec, absl::StrCat("a ", TierKindInfoOf(t->kind).name,
                                      " tier goes above a ",
                                      TierKindInfoOf(out.back().kind).name,
                                      " tier (the order is host, disk, remote)"));
      }
    }
    out.push_back(*std::move(t));
  }
  // At most one tier of each kind, in kTierKinds' order.
  assert(out.size() <= std::size(kTierKinds));
  return out;
}

}  // namespace radixkv::daemon
