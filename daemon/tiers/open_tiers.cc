#include "daemon/tiers/open_tiers.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "daemon/tiers/disk_tier.h"
#include "daemon/tiers/host_tier.h"
#include "daemon/tiers/remote_tier.h"
#include "base/status_macros.h"

namespace radixkv::daemon {
namespace {

// The first line of `path`, without its line end. The file holds a
// secret: one readable by other users is refused.
absl::StatusOr<std::string> ReadPasswordFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=remote: password_file=", path, ": ", strerror(errno)));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=remote: password_file=", path, " is open to other users (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), "); chmod 600 it"));
  }
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=remote: password_file=", path,
        " has no password on its first line"));
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tier>> OpenTier(const TierSpec& t,
                                               const gpu::PoolSpec& pool) {
  switch (t.kind) {
    case TierKind::kHost: {
      ASSIGN_OR_RETURN(std::unique_ptr<HostTier> host,
                       HostTier::Open(pool.backend, pool.device, t.bytes,
                                      pool.page_bytes));
      Log(LogLevel::kInfo,
          absl::StrCat("tier host: ", host->capacity_blocks(), " blocks of ",
                       pool.page_bytes, " bytes, ",
                       host->stats().pinned ? "pinned" : "not pinned"));
      return host;
    }
    case TierKind::kDisk: {
      ASSIGN_OR_RETURN(
          std::unique_ptr<DiskTier> disk,
          DiskTier::Open({.path = t.path,
                          .bytes = t.bytes,
                          .page_bytes = pool.page_bytes,
                          .io_threads = t.io_threads,
                          .wait_for_staging = t.wait_for_staging}));
      Log(LogLevel::kInfo,
          absl::StrCat("tier disk: ", t.path, ", ", disk->capacity_blocks(),
                       " blocks of ", pool.page_bytes, " bytes, ",
                       disk->stats().reloaded, " reloaded"));
      return disk;
    }
    case TierKind::kRemote: {
      RemoteTierOptions o{.seeds = t.addrs,
                          .auth = {.user = t.user},
                          .prefix = t.prefix,
                          .page_bytes = pool.page_bytes,
                          .timeout = t.timeout,
                          .ttl = t.ttl,
                          .queue_bytes = t.queue_bytes,
                          .writers = t.writers,
                          .breaker_failures = t.breaker_failures,
                          .breaker_cooldown = t.breaker_cooldown,
                          .write_all = t.write_all};
      if (t.tls) {
        absl::StatusOr<std::shared_ptr<ssl_ctx_st>> ctx =
            MakeRedisTlsContext(t.tls_ca, t.tls_cert, t.tls_key);
        if (!ctx.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--tier=remote: ", ctx.status().message()));
        }
        o.tls = {.ctx = *std::move(ctx), .server_name = t.tls_name};
      }
      if (!t.password_file.empty()) {
        ASSIGN_OR_RETURN(o.auth.password, ReadPasswordFile(t.password_file));
      }
      absl::StatusOr<std::unique_ptr<RemoteTier>> remote =
          RemoteTier::Open(std::move(o));
      // Credentials the store refuses are the operator's to fix (exit 2).
      if (absl::IsPermissionDenied(remote.status())) {
        return absl::InvalidArgumentError(remote.status().message());
      }
      return remote;
    }
  }
  return absl::InvalidArgumentError("--tier: unknown tier kind");
}

// The tiers' slots are sized at start, so the pool's page size must be the
// operator's (--pool ... page_bytes=).
absl::StatusOr<std::shared_ptr<TierChain>> OpenTiers(
    const std::string& spec, const gpu::PoolSpec& pool) {
  ASSIGN_OR_RETURN(std::vector<TierSpec> specs, ParseTierSpecs(spec));
  if (pool.backend == gpu::Backend::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=", spec, ": a none pool has no page bytes to move; use "
        "--pool=host,... or --pool=cuda,..."));
  }
  if (pool.page_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=", spec, ": needs the pool's page size at start: add "
        "page_bytes=SIZE to --pool (the size of one page of your model's "
        "namespace, radixkvctl size)"));
  }
  std::vector<std::unique_ptr<Tier>> tiers;
  for (const TierSpec& t : specs) {
    ASSIGN_OR_RETURN(std::unique_ptr<Tier> tier, OpenTier(t, pool));
    tiers.push_back(std::move(tier));
  }
  return std::make_shared<TierChain>(std::move(tiers));
}

}  // namespace radixkv::daemon
