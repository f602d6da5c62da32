// radixkvd: the radixkv daemon. Parses flags, starts a Server, prints where
// it listens, and drains on SIGTERM/SIGINT. See docs/OPERATIONS.md.
//
// Exit codes: 0 stopped by SIGTERM/SIGINT after draining (or --help,
// --version); 1 a runtime failure (an address in use, a resource the
// machine lacks now); 2 a configuration error that a restart cannot fix
// (a bad flag or value, a stray argument, a listen address this machine
// cannot listen on, a pool this machine cannot serve).
#include <grp.h>
#include <malloc.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/log.h"
#include "daemon/rpc/server.h"
#include "radix/eviction_policy.h"
#include "radixkv/defaults.h"

// The four normative flags (docs/CONTRACTS.md §5): names, meanings and
// defaults are fixed.
ABSL_FLAG(std::string, socket, radixkv::DaemonDefaultSocketPath(),
          "gRPC Unix socket (mode 0660); the attach socket sits beside it");
ABSL_FLAG(std::string, listen_tcp, "",
          "also serve gRPC on HOST:PORT (empty: off)");
ABSL_FLAG(std::string, metrics_listen, radixkv::kDefaultMetricsListen,
          "Prometheus /metrics on HOST:PORT (empty: off)");
ABSL_FLAG(std::string, pool, "host,bytes=1GiB",
          "page pool: host,bytes=1GiB | cuda,device=0,bytes=60GiB | "
          "none,pages=100000");
ABSL_FLAG(std::string, tier, "",
          "tiers below the pool that evicted blocks move to and come back "
          "from, top to bottom, separated by ';': host,bytes=SIZE (host "
          "memory, pinned under a cuda pool) and/or "
          "disk,path=DIR,bytes=SIZE[,io_threads=N][,demote=drop|wait]; "
          "needs --pool with page_bytes=; empty: evicted blocks are dropped");

ABSL_FLAG(absl::Duration, lease_ttl, absl::Minutes(5),
          "a lease not ended by Commit(release)/Release expires after this");
ABSL_FLAG(absl::Duration, keepalive_time, absl::Seconds(30),
          "HTTP/2 keepalive ping interval towards idle clients");
ABSL_FLAG(absl::Duration, keepalive_timeout, absl::Seconds(10),
          "drop a client (ending its session) when a ping is unanswered this long");
ABSL_FLAG(uint32_t, max_prompt_tokens, 131072,
          "largest token list accepted by Acquire/Match/Explain");
ABSL_FLAG(uint32_t, max_string_bytes, 256,
          "largest namespace string / client name");
ABSL_FLAG(uint32_t, max_page_size, 1024, "largest namespace page_size (tokens)");
ABSL_FLAG(std::string, eviction_policy, "lru",
          "which unpinned cached block the pool evicts first: lru (the least "
          "recently used leaf) or turn_duel (new blocks of requests that "
          "start conversations wait on a probation stack and go first, at a "
          "strength picked online by sampled shadow caches; equal to lru "
          "until a shadow does better); docs/OPERATIONS.md says when to "
          "choose which");
ABSL_FLAG(uint64_t, max_pool_pages, uint64_t{1} << 22,
          "most pages the pool may be divided into; a first namespace whose "
          "page_bytes would divide --pool into more is refused (the index "
          "costs about 60 bytes per page)");
ABSL_FLAG(uint32_t, max_sessions, 1024, "open sessions at most");
ABSL_FLAG(uint32_t, max_leases_per_session, 4096, "live leases per session at most");
ABSL_FLAG(int32_t, max_receive_message_bytes, 16 << 20,
          "largest gRPC request message");
ABSL_FLAG(uint64_t, event_buffer, 65536,
          "events kept for WatchEvents consumers (older ones become gaps)");
ABSL_FLAG(bool, allow_key_mode, false,
          "accept block_keys instead of tokens (hits cannot be verified)");
ABSL_FLAG(std::vector<std::string>, attach_allowed_gids, {},
          "groups (names or numeric gids) whose members may also attach to "
          "the pool, besides the daemon's own uid and root");
ABSL_FLAG(uint32_t, attach_max_pending_per_uid, 8,
          "attach connections one uid may hold waiting for their session id "
          "(0: no per-uid limit)");
ABSL_FLAG(std::string, tenants, "",
          "JSON file mapping peers (uids, gids, certificate identities) to "
          "tenants with quotas, and naming administrators "
          "(docs/SECURITY.md); empty: one tenant for every peer");
ABSL_FLAG(std::vector<std::string>, admin_gids, {},
          "groups (names or numeric gids) whose members are administrators "
          "(Clear, Evict, WatchEvents, every tenant's sessions and tree), "
          "besides root and the daemon's own uid");
ABSL_FLAG(std::vector<std::string>, admin_subjects, {},
          "TLS client certificate identities that are administrators");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for --listen_tcp (TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: TCP clients must present a certificate it signed "
          "(mTLS); their identity is the certificate's subject");
ABSL_FLAG(bool, insecure_tcp, false,
          "serve --listen_tcp in plaintext without authentication (never "
          "administrators); without it --listen_tcp needs --tls_cert/--tls_key");
ABSL_FLAG(uint32_t, max_sessions_per_peer, 64,
          "sessions one peer (uid, certificate, TCP connection) may hold");
ABSL_FLAG(uint64_t, max_pinned_pages_per_session, 0,
          "pages one session's leases may hold at once, fenced ones included "
          "(0: half the pool)");
ABSL_FLAG(uint32_t, max_watch_streams, 16,
          "WatchEvents streams open at once (0: no limit)");
ABSL_FLAG(uint32_t, explain_max_namespaces, 16,
          "other namespaces Explain searches for WRONG_NAMESPACE (each costs "
          "a hash of the prompt)");
ABSL_FLAG(std::string, log_level, "info", "debug | info | warning | error");
ABSL_FLAG(uint64_t, malloc_trim_threshold, uint64_t{16} << 20,
          "free memory (bytes) glibc may keep at the top of a heap instead of "
          "returning it to the kernel (M_TRIM_THRESHOLD); 0 leaves glibc's "
          "own setting (adaptive, or GLIBC_TUNABLES)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "on SIGTERM/SIGINT, how long in-flight calls may finish");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "on SIGTERM/SIGINT with a disk tier, how long writing the pool's "
          "and host tier's blocks down to it may take, hottest first, so "
          "that a restart finds them (0: not at all); a stop takes at most "
          "--shutdown_grace + --drain_timeout");

// KV events in vLLM's wire format for cluster routers (docs/EVENTS.md).
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "publish KV events (vLLM's format, ZMQ PUB) on tcp://HOST:PORT or "
          "ipc://PATH (empty: off)");
ABSL_FLAG(bool, kv_events_connect, false,
          "connect the PUB socket to --kv_events_endpoint (a subscriber that "
          "binds) instead of binding it");
ABSL_FLAG(std::string, kv_events_replay_endpoint, "",
          "answer KV event replay requests (ZMQ ROUTER) on tcp://HOST:PORT or "
          "ipc://PATH (empty: no replay)");
ABSL_FLAG(std::string, kv_events_topic, "",
          "topic frame of every KV event message");
ABSL_FLAG(std::string, kv_events_hash, "int64",
          "block hashes in KV events: int64 (the key's low 64 bits, vLLM's "
          "default) | bytes (the 16-byte key)");
ABSL_FLAG(std::string, kv_events_encoding, "map",
          "KV events as map (fields by name, current vLLM) | array "
          "(positional, vLLM before the switch to maps)");
ABSL_FLAG(std::string, kv_events_media, "vllm",
          "tier media names in KV events: vllm (the names vLLM and its "
          "routers know: host tier CPU, or CPU_TIER1 below a host pool; disk "
          "STORAGE; remote EXTERNAL) | radixkv (CPU or CPU_TIER, DISK, "
          "REMOTE)");
ABSL_FLAG(uint64_t, kv_events_replay_buffer, 10000,
          "KV event batches kept for replay");
ABSL_FLAG(uint64_t, kv_events_replay_bytes, uint64_t{256} << 20,
          "payload bytes of KV event batches kept for replay at most");
ABSL_FLAG(int32_t, kv_events_hwm, 1000,
          "KV event messages queued per subscriber before that subscriber's "
          "new ones are dropped (it sees a sequence gap); the messages are "
          "shared, so subscribers that stop reading hold at most this many "
          "batches (each at most 600 KiB) of memory in all");
ABSL_FLAG(uint64_t, kv_events_queue_bytes, uint64_t{256} << 20,
          "KV events waiting for the publisher thread at most; beyond it "
          "events are dropped and a sequence number is skipped");

namespace {

constexpr int kExitConfig = 2;
constexpr int kExitRuntime = 1;

// Resolves --attach_allowed_gids entries (group names or numbers) to gids.
absl::StatusOr<std::vector<gid_t>> ResolveGroups(
    const std::vector<std::string>& groups,
    absl::string_view flag = "attach_allowed_gids") {
  std::vector<gid_t> gids;
  for (const std::string& g : groups) {
    if (g.empty()) continue;
    uint32_t id = 0;
    if (absl::SimpleAtoi(g, &id)) {
      gids.push_back(static_cast<gid_t>(id));
      continue;
    }
    const struct group* gr = getgrnam(g.c_str());
    if (gr == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": unknown group '", g, "'"));
    }
    gids.push_back(gr->gr_gid);
  }
  return gids;
}

void Print(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// glibc hands a heap's free top back to the kernel once it passes its trim
// threshold, and request buffers then fault those pages in again on the
// next burst; a higher threshold keeps them mapped (docs/ARCHITECTURE.md,
// "Request buffers stay with the process"). Call before any thread
// allocates. False (with a message) for an out-of-range flag.
bool SetMallocTrimThreshold() {
  const uint64_t trim = absl::GetFlag(FLAGS_malloc_trim_threshold);
  if (trim == 0) return true;
  if (trim > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    std::fprintf(stderr,
                 "radixkvd: --malloc_trim_threshold=%llu exceeds %d bytes\n",
                 static_cast<unsigned long long>(trim),
                 std::numeric_limits<int>::max());
    return false;
  }
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim)) != 1) {
    std::fprintf(stderr,
                 "radixkvd: warning: mallopt(M_TRIM_THRESHOLD, %llu) "
                 "failed; glibc's own trimming stays\n",
                 static_cast<unsigned long long>(trim));
  }
  return true;
}

// The --kv_events_* flags into o->kv_events; INVALID_ARGUMENT names a bad
// one.
absl::Status KvEventsFromFlags(radixkv::daemon::ServerOptions* o) {
  radixkv::daemon::KvEventsOptions& k = o->kv_events;
  k.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  k.connect = absl::GetFlag(FLAGS_kv_events_connect);
  k.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint);
  k.topic = absl::GetFlag(FLAGS_kv_events_topic);
  auto hash = radixkv::daemon::ParseKvHashForm(
      absl::GetFlag(FLAGS_kv_events_hash), "kv_events_hash");
  if (!hash.ok()) return hash.status();
  k.encode.hash = *hash;
  auto encoding = radixkv::daemon::ParseKvEventEncoding(
      absl::GetFlag(FLAGS_kv_events_encoding), "kv_events_encoding");
  if (!encoding.ok()) return encoding.status();
  k.encode.encoding = *encoding;
  auto media = radixkv::daemon::ParseKvMediaNames(
      absl::GetFlag(FLAGS_kv_events_media), "kv_events_media");
  if (!media.ok()) return media.status();
  k.encode.media = *media;
  k.replay_batches = absl::GetFlag(FLAGS_kv_events_replay_buffer);
  k.replay_bytes = absl::GetFlag(FLAGS_kv_events_replay_bytes);
  k.hwm = absl::GetFlag(FLAGS_kv_events_hwm);
  k.queue_bytes = absl::GetFlag(FLAGS_kv_events_queue_bytes);
  if (k.replay_batches == 0 || k.hwm < 0) {
    return absl::InvalidArgumentError(
        "--kv_events_replay_buffer must be at least 1 and --kv_events_hwm "
        "at least 0");
  }
  if (k.endpoint.empty() && !k.replay_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--kv_events_replay_endpoint needs --kv_events_endpoint");
  }
  return absl::OkStatus();
}

// The server's options from the flags.
absl::StatusOr<radixkv::daemon::ServerOptions> OptionsFromFlags() {
  radixkv::daemon::ServerOptions o;
  o.socket_path = absl::GetFlag(FLAGS_socket);
  o.listen_tcp = absl::GetFlag(FLAGS_listen_tcp);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.pool = absl::GetFlag(FLAGS_pool);
  o.tier = absl::GetFlag(FLAGS_tier);
  o.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (o.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--drain_timeout=", absl::FormatDuration(o.drain_timeout),
        " must be 0 (no drain) or more"));
  }
  o.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  o.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  o.max_receive_message_bytes = absl::GetFlag(FLAGS_max_receive_message_bytes);
  o.cache.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  o.cache.max_string_bytes = absl::GetFlag(FLAGS_max_string_bytes);
  o.cache.max_page_size = absl::GetFlag(FLAGS_max_page_size);
  if (const std::string p = absl::GetFlag(FLAGS_eviction_policy);
      !radixkv::ParseEvictionPolicy(p, &o.cache.eviction_policy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eviction_policy=", p, ": not a policy; choose one of ",
                     radixkv::EvictionPolicyNames()));
  }
  o.cache.max_pool_pages = absl::GetFlag(FLAGS_max_pool_pages);
  o.cache.allow_key_mode = absl::GetFlag(FLAGS_allow_key_mode);
  o.cache.event_buffer = absl::GetFlag(FLAGS_event_buffer);
  o.cache.sessions.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  o.cache.sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.cache.sessions.max_leases_per_session =
      absl::GetFlag(FLAGS_max_leases_per_session);
  auto gids = ResolveGroups(absl::GetFlag(FLAGS_attach_allowed_gids));
  if (!gids.ok()) return gids.status();
  o.attach_allowed_gids = *std::move(gids);
  o.attach_max_pending_per_uid = absl::GetFlag(FLAGS_attach_max_pending_per_uid);
  auto admin_gids = ResolveGroups(absl::GetFlag(FLAGS_admin_gids), "admin_gids");
  if (!admin_gids.ok()) return admin_gids.status();
  o.access.admin_gids = *std::move(admin_gids);
  o.access.admin_subjects = absl::GetFlag(FLAGS_admin_subjects);
  o.access.tenants_file = absl::GetFlag(FLAGS_tenants);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.insecure_tcp = absl::GetFlag(FLAGS_insecure_tcp);
  o.cache.sessions.max_sessions_per_peer =
      absl::GetFlag(FLAGS_max_sessions_per_peer);
  o.cache.sessions.max_pinned_pages_per_session =
      absl::GetFlag(FLAGS_max_pinned_pages_per_session);
  o.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  o.cache.explain_max_namespaces = absl::GetFlag(FLAGS_explain_max_namespaces);
  if (absl::Status s = KvEventsFromFlags(&o); !s.ok()) return s;
  return o;
}

// Where the started server listens, one line each, then "ready".
void PrintListening(const radixkv::daemon::ServerOptions& o,
                    const radixkv::daemon::Server& s) {
  if (!o.socket_path.empty()) {
    Print(absl::StrCat("radixkvd: gRPC on ", radixkv::UnixTarget(o.socket_path)));
  }
  if (!o.listen_tcp.empty()) {
    const size_t colon = o.listen_tcp.rfind(':');
    Print(absl::StrCat("radixkvd: gRPC on ", o.listen_tcp.substr(0, colon), ":",
                       s.tcp_port()));
  }
  Print(absl::StrCat("radixkvd: attach socket ",
                     s.attach_socket_path().empty() ? "(none)"
                                                    : s.attach_socket_path()));
  Print(absl::StrCat("radixkvd: metrics ",
                     s.metrics_url().empty() ? "(off)" : s.metrics_url()));
  Print(absl::StrCat("radixkvd: pool ", o.pool,
                     " (allocated when the first namespace binds)"));
  Print("radixkvd: ready");
}

// The usage message, --help's scope (this file's flags; --helpfull adds
// the libraries') and --version.
void ConfigureUsage() {
  absl::SetProgramUsageMessage(
      "prefix-caching KV store daemon.\n"
      "  radixkvd [--socket=PATH] [--listen_tcp=HOST:PORT] "
      "[--metrics_listen=HOST:PORT] [--pool=SPEC] ...\n"
      "docs/OPERATIONS.md describes every flag.");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "daemon/main.cc");
  };
  usage.version_string = [] {
    return std::string("radixkvd " RADIXKVD_VERSION "\n");
  };
  absl::SetFlagsUsageConfig(usage);
}

// radixkvd's own flags (those defined in this file), sorted by name, each
// with its help text and default, wrapped at 80 columns. Written from the
// public flag reflection API, so no build path appears in the output.
void PrintFlagsHelp(std::ostream& out) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "daemon/main.cc")) {
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  out << "radixkvd: " << absl::ProgramUsageMessage() << "\n\n  Flags:\n";
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string text =
        absl::StrCat("--", flag->Name(), " (", flag->Help(),
                     "); default: ", flag->DefaultValue(), ";");
    std::string line = "    ";
    bool line_empty = true;  // no word on this line yet
    for (absl::string_view word : absl::StrSplit(text, ' ')) {
      if (!line_empty && line.size() + 1 + word.size() > 80) {
        out << line << "\n";
        line = "      ";
        line_empty = true;
      }
      if (!line_empty) line += ' ';
      line.append(word.data(), word.size());
      line_empty = false;
    }
    out << line << "\n";
  }
}

// Handles the arguments absl's parser would get wrong for radixkvd before
// it runs: --help (print radixkvd's flags, exit 0: asking for help is not
// an error), and unknown flags or values that do not parse (absl exits 1;
// for radixkvd they are configuration errors, exit 2). Returns the exit
// code, or -1 to go on.
int PreParse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (absl::string_view(argv[i]) == "--help" ||
        absl::string_view(argv[i]) == "-h") {
      PrintFlagsHelp(std::cout);
      return 0;
    }
  }
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      continue;
    }
    const size_t eq = arg.find('=');
    absl::string_view name = arg.substr(0, eq);
    // absl's usage flags, which its parser handles itself.
    if (name == "version" || absl::StartsWith(name, "help") ||
        name == "only_check_args") {
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::ConsumePrefix(&name, "no")) {
      flag = absl::FindCommandLineFlag(name);
    }
    if (flag == nullptr) {
      std::fprintf(stderr,
                   "radixkvd: unknown flag '%s' (see radixkvd --help)\n",
                   argv[i]);
      return kExitConfig;
    }
    // A value that does not parse (--lease_ttl=soon) is a configuration
    // error too. Parsing it here sets the flag, as absl's parser will again.
    std::string error;
    if (eq != absl::string_view::npos &&
        !flag->ParseFrom(arg.substr(eq + 1), &error)) {
      std::fprintf(stderr, "radixkvd: --%s: %s\n",
                   std::string(name).c_str(), error.c_str());
      return kExitConfig;
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  ConfigureUsage();
  if (const int code = PreParse(argc, argv); code >= 0) return code;
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr,
                 "radixkvd: unexpected argument '%s' (radixkvd takes only "
                 "--flags; see radixkvd --help)\n",
                 positional[1]);
    return kExitConfig;
  }
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles, and
  // gRPC's own mutexes are Abseil mutexes too, so the check would run on
  // every RPC's locks. Tests keep the check on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (!SetMallocTrimThreshold()) return kExitConfig;
  using radixkv::Log;
  using radixkv::LogLevel;

  auto level = radixkv::ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) {
    std::fprintf(stderr, "radixkvd: %s\n", std::string(level.status().message()).c_str());
    return kExitConfig;
  }
  radixkv::SetLogLevel(*level);

  // Block the shutdown signals before any thread starts, so every thread
  // inherits the mask and only sigwait below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<radixkv::daemon::ServerOptions> o = OptionsFromFlags();
  if (!o.ok()) {
    std::fprintf(stderr, "radixkvd: %s\n",
                 std::string(o.status().message()).c_str());
    return kExitConfig;
  }
  auto server = radixkv::daemon::Server::Start(*o);
  if (!server.ok()) {
    // A flag this machine cannot serve will not work on a restart either.
    // Each message names its flag; a runtime failure says so.
    const bool config = absl::IsInvalidArgument(server.status());
    std::fprintf(stderr, "radixkvd: %s%s\n", config ? "" : "cannot start: ",
                 std::string(server.status().message()).c_str());
    return config ? kExitConfig : kExitRuntime;
  }
  radixkv::daemon::Server& s = **server;
  PrintListening(*o, s);
  // Under systemd (Type=notify) the unit turns active only now; elsewhere
  // NOTIFY_SOCKET is unset and this does nothing.
  sd_notify(0, "READY=1");

  int sig = 0;
  sigwait(&signals, &sig);
  Log(LogLevel::kInfo, absl::StrCat("signal ", sig, ": draining"));
  sd_notify(0, "STOPPING=1");
  s.Shutdown(absl::GetFlag(FLAGS_shutdown_grace));
  server->reset();
  Log(LogLevel::kInfo, "stopped");
  return 0;
}
