// radixkvctl commands that read or change the daemon's state through the
// Admin service and grpc.health.v1: health, stats, namespaces, sessions,
// tree, evict, clear, watch; and endpoint, which names the daemon's address
// without calling it.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/ctl/ctl.h"
#include "client/ctl/output.h"
#include "client/status.h"
#include "nlohmann/json.hpp"
#include "grpc/health/v1/health.grpc.pb.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::ctl {
namespace {

using v1::Admin;

std::string ShortNs(const std::string& id) { return Hex(id, 12); }

// The request type of a stub method.
template <typename Stub, typename Request, typename Response>
Request RequestOf(grpc::Status (Stub::*)(grpc::ClientContext*, const Request&,
                                         Response*));

// A command that asks `kMethod` with an empty request and prints the answer
// with `kPrint` (stats).
template <auto kMethod, auto kPrint>
int RunQuery(Context& ctx, const NoOptions&) {
  return CallAndPrint(ctx, kMethod, decltype(RequestOf(kMethod))(), kPrint);
}

// The options of a command that prints a table and has no other flags.
struct TableOptions {
  bool no_headers = false;
};

void AddTableFlags(CLI::App& app, TableOptions& o, CompletionValues&) {
  AddNoHeadersFlag(app, &o.no_headers);
}

// RunQuery for a command that prints a table (namespaces, sessions).
template <auto kMethod, auto kPrint>
int RunTableQuery(Context& ctx, const TableOptions& o) {
  ApplyNoHeaders(ctx, o.no_headers);
  return RunQuery<kMethod, kPrint>(ctx, NoOptions());
}

// ---- health ---------------------------------------------------------------

struct HealthOptions {
  std::string service;  // empty: the whole server
};

void AddHealthFlags(CLI::App& app, HealthOptions& o, CompletionValues&) {
  AddValueFlag(app, "service", &o.service,
               "service name to check (default: the whole server)");
}

int RunHealth(Context& ctx, const HealthOptions& o) {
  using grpc::health::v1::HealthCheckRequest;
  using grpc::health::v1::HealthCheckResponse;
  HealthCheckRequest req;
  req.set_service(o.service.data(), o.service.size());
  HealthCheckResponse resp;
  auto stub = grpc::health::v1::Health::NewStub(ctx.Channel());
  auto check = [&](grpc::ClientContext* call) {
    grpc::Status s = stub->Check(call, req, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The health service answers NOT_FOUND for a service it does not know.
      resp.set_status(HealthCheckResponse::SERVICE_UNKNOWN);
      return grpc::Status::OK;
    }
    return s;
  };
  const int exit = CallAndPrint(ctx, resp, check, [&] {
    *ctx.out << HealthCheckResponse::ServingStatus_Name(resp.status()) << "  "
             << ctx.global.target << "\n";
  });
  if (exit != kExitOk || resp.status() == HealthCheckResponse::SERVING) {
    return exit;
  }
  *ctx.err << "Error: radixkvd at " << ctx.global.target << " is "
           << HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
  return kExitUnhealthy;
}

// ---- endpoint -------------------------------------------------------------

// Prints the gRPC target every other command would connect to (--endpoint,
// RADIXKVCTL_ENDPOINT, else the default socket as radixkvctl resolves it
// here), without connecting. JSON: {"endpoint": as given ("" when none),
// "target": the gRPC target}.
int RunEndpoint(Context& ctx, const NoOptions&) {
  return PrintResult(
      ctx,
      [&] {
        nlohmann::json j;
        j["endpoint"] = ctx.global.endpoint;
        j["target"] = ctx.global.target;
        return j.dump();
      },
      [&] { *ctx.out << ctx.global.target << "\n"; });
}

// ---- stats ----------------------------------------------------------------

// "1.2k pages (600 KiB)"; without the bytes for an index-only pool.
std::string PagesWithBytes(uint64_t pages, uint64_t page_bytes) {
  std::string s = absl::StrCat(HumanCount(pages), pages == 1 ? " page" : " pages");
  if (page_bytes == 0) return s;
  return absl::StrCat(s, " (", HumanBytes(pages * page_bytes), ")");
}

// Evicted blocks that became plain evictions instead of reaching the tier:
// its staging was full, its write failed, or the eviction policy kept
// them from it.
uint64_t DroppedBlocks(const v1::TierStats& t) {
  return t.dropped_full() + t.dropped_error() + t.dropped_policy();
}

void PrintStats(const v1::GetStatsResponse& resp, std::ostream& out) {
  const v1::Stats& st = resp.stats();
  const uint64_t pb = st.pool().page_bytes();
  KeyValueList kv;
  kv.Add("version", st.version().empty() ? "-" : st.version());
  kv.Add("uptime", HumanDuration(st.uptime_seconds()));
  kv.Add("pool", absl::StrCat(st.pool().backend().empty() ? "-" : st.pool().backend(),
                              ", page ", pb == 0 ? "-" : HumanBytes(pb)));
  kv.Add("capacity", PagesWithBytes(st.capacity_pages(), pb));
  kv.Add("free", PagesWithBytes(st.free_pages(), pb));
  kv.Add("writing", PagesWithBytes(st.writing_pages(), pb));
  kv.Add("cached", absl::StrCat(PagesWithBytes(st.cached_pages(), pb), ", ",
                                Percent(st.cached_pages(), st.capacity_pages()),
                                " of capacity"));
  kv.Add("pinned", PagesWithBytes(st.pinned_pages(), pb));
  kv.Add("pins", absl::StrCat(HumanCount(st.pins()), " holding ",
                              PagesWithBytes(st.pin_pages(), pb)));
  kv.Add("fenced",
         absl::StrCat(PagesWithBytes(st.quarantined_pages(), pb),
                      " quarantined (", HumanCount(st.quarantined_leases()),
                      " leases)"));
  kv.Add("hit ratio", absl::StrCat(Percent(st.hit_tokens(), st.lookup_tokens()),
                                   " (", HumanCount(st.hit_tokens()), " of ",
                                   HumanCount(st.lookup_tokens()), " tokens)"));
  kv.Add("lookups", absl::StrCat(HumanCount(st.lookups()), " acquire, ",
                                 HumanCount(st.matches()), " match"));
  kv.Add("inserted", absl::StrCat(HumanCount(st.inserted_blocks()), " blocks, ",
                                  HumanCount(st.deduplicated_blocks()),
                                  " deduplicated"));
  kv.Add("evicted", absl::StrCat(HumanCount(st.evicted_pages()), " pages"));
  if (!st.eviction_policy().empty()) {
    std::string policy = st.eviction_policy();
    if (policy != "lru") {
      absl::StrAppend(&policy, " (theta ", st.eviction_theta(), ", ",
                      HumanCount(st.eviction_switches()), " changes; ",
                      PagesWithBytes(st.probation_pages(), pb),
                      " on probation");
      if (st.tiers_size() != 0) {
        absl::StrAppend(&policy, "; tier theta ", st.eviction_tier_theta(),
                        ", ", HumanCount(st.eviction_tier_switches()),
                        " changes");
      }
      absl::StrAppend(&policy, ")");
    }
    kv.Add("eviction", policy);
  }
  kv.Add("collisions", HumanCount(st.hash_collisions()));
  kv.Add("block keys",
         absl::StrCat(HumanCount(st.walked_blocks()), " by token walk, ",
                      HumanCount(st.hashed_blocks()), " hashed"));
  kv.Add("sessions", HumanCount(st.sessions()));
  kv.Add("leases", absl::StrCat(HumanCount(st.leases()), " (",
                                HumanCount(st.lease_expired()), " expired, ",
                                HumanCount(st.lease_abandoned()),
                                " abandoned)"));
  kv.Add("tree nodes", HumanCount(st.tree_nodes()));
  kv.Add("namespaces", HumanCount(st.namespaces()));
  kv.Add("refused", absl::StrCat(HumanCount(st.permission_denied()),
                                 " calls (identity or role)"));
  // One line per tier below the pool, top to bottom. An older daemon
  // reports its one tier in `tier` only.
  std::vector<const v1::TierStats*> tiers;
  for (const v1::TierStats& t : st.tiers()) tiers.push_back(&t);
  if (tiers.empty() && st.has_tier()) tiers.push_back(&st.tier());
  for (const v1::TierStats* t : tiers) {
    if (t->kind() == "remote") {
      // The fleet's shared store: it sizes itself, and its health matters.
      kv.Add("tier remote",
             absl::StrCat(
                 t->unavailable() ? "UNAVAILABLE (circuit open), "
                                  : "available, ",
                 HumanCount(t->demoted_blocks()), " written, ",
                 HumanCount(t->pending_blocks()), " staged, ",
                 HumanCount(t->promoted_blocks()), " promoted, ",
                 HumanCount(DroppedBlocks(*t)), " dropped, ",
                 HumanCount(t->read_errors() + t->write_errors()),
                 " failed calls, ", HumanCount(t->checksum_failures()),
                 " checksum failures, ", HumanCount(t->breaker_trips()),
                 " breaker trips"));
      continue;
    }
    std::string line = absl::StrCat(
        PagesWithBytes(t->blocks(), t->page_bytes() != 0 ? t->page_bytes() : pb),
        " of ",
        HumanCount(t->capacity_blocks()), ", ",
        HumanCount(t->demoted_blocks()), " demoted, ",
        HumanCount(t->promoted_blocks()), " promoted, ",
        HumanCount(t->forgotten_blocks()),
        t->kind() == "host" ? " moved down or forgotten, " : " forgotten, ",
        HumanCount(DroppedBlocks(*t)), " dropped");
    if (t->kind() == "disk") {
      absl::StrAppend(&line, ", ", HumanCount(t->checksum_failures()),
                      " checksum failures");
    }
    if (t->kind() == "host") {
      absl::StrAppend(&line, t->pinned() ? ", pinned" : ", not pinned");
    }
    if (t->copy_errors() != 0) {
      absl::StrAppend(&line, ", ", HumanCount(t->copy_errors()),
                      " failed copies");
    }
    if (t->superseded_blocks() != 0) {
      absl::StrAppend(&line, ", ", HumanCount(t->superseded_blocks()),
                      " superseded");
    }
    kv.Add(absl::StrCat("tier ", t->kind()), line);
  }
  kv.Add("invariants", st.invariants_ok() ? "ok" : "VIOLATED");
  kv.Print(out);
  if (st.tenants_size() == 0) return;
  // Per tenant (a --tenants file): its share of the pool and its limits.
  out << "\n";
  Table t({"TENANT", "CACHED", "WRITING", "HELD", "MAX CACHED", "MAX HELD",
           "WEIGHT", "EVICTED", "LIMITED", "PINNED", "MAX PINNED"});
  t.AlignRight({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  auto limit = [](uint64_t v) { return v == 0 ? std::string("-") : HumanCount(v); };
  for (const v1::TenantStats& ts : st.tenants()) {
    t.AddRow({ts.name(), HumanCount(ts.cached_pages()),
              HumanCount(ts.writing_pages()), HumanCount(ts.held_pages()),
              limit(ts.max_cached_pages()), limit(ts.max_pinned_pages()),
              absl::StrCat(ts.weight()), HumanCount(ts.evicted_pages()),
              HumanCount(ts.limited_acquires()), HumanCount(ts.pin_pages()),
              HumanCount(ts.pin_limit_pages())});
  }
  t.Print(out);
}


// ---- namespaces -------------------------------------------------------------

// " xlayer:S:W" for a namespace with a cross-layer KV layout (layers S..
// share one K/V bank, W the local window); "" for per-layer KV.
std::string CrossLayerSuffix(const v1::Namespace& n) {
  if (!n.has_cross_layer()) return "";
  return absl::StrCat(" xlayer:", n.cross_layer().shared_from_layer(), ":",
                      n.cross_layer().local_window());
}

void PrintNamespaces(const v1::ListNamespacesResponse& resp, std::ostream& out) {
  Table t({"NAMESPACE", "MODEL", "REVISION", "LORA", "SALT", "LAYOUT", "TP",
           "BLOCKS", "SESSIONS"});
  t.AlignRight({7, 8});
  for (const v1::NamespaceEntry& e : resp.namespaces()) {
    const v1::Namespace& n = e.namespace_();
    auto or_dash = [](const std::string& s) { return s.empty() ? "-" : s; };
    t.AddRow({ShortNs(e.namespace_id()), or_dash(n.model()),
              or_dash(n.model_revision()), or_dash(n.lora()),
              n.cache_salt().empty() ? "-" : "(set)",
              absl::StrCat(absl::StrFormat("L%u H%u D%u %s p%u", n.num_layers(),
                                           n.num_kv_heads(), n.head_dim(),
                                           DTypeShortName(n.dtype()),
                                           n.page_size()),
                           CrossLayerSuffix(n)),
              absl::StrCat(n.tp_rank(), "/", n.tp_size() == 0 ? 1 : n.tp_size()),
              HumanCount(e.cached_blocks()), absl::StrCat(e.sessions())});
  }
  t.Print(out);
}


// ---- sessions ---------------------------------------------------------------

void PrintSessions(const v1::ListSessionsResponse& resp, std::ostream& out) {
  Table t({"SESSION", "CLIENT", "NAMESPACE", "DEVICE", "LEASES", "AGE", "PEER"});
  t.AlignRight({3, 4, 5});
  for (const v1::SessionEntry& e : resp.sessions()) {
    t.AddRow({e.session_id().substr(0, 16),
              e.client_name().empty() ? "-" : e.client_name(),
              ShortNs(e.namespace_id()), absl::StrCat(e.device()),
              absl::StrCat(e.leases()), HumanDuration(e.age_seconds()),
              e.peer().empty() ? "-" : e.peer()});
  }
  t.Print(out);
}


// ---- tree -------------------------------------------------------------------

void PrintTree(const v1::DumpTreeResponse& resp, std::ostream& out) {
  Table t({"KEY", "DEPTH", "PAGE", "REFS", "CHILDREN", "AGE", "NAMESPACE"});
  t.AlignRight({1, 2, 3, 4, 5});
  for (const v1::TreeNode& n : resp.nodes()) {
    t.AddRow({Hex(n.key(), 16) + "..", absl::StrCat(n.depth()),
              absl::StrCat(n.page()), absl::StrCat(n.refcount()),
              absl::StrCat(n.children()), HumanDuration(n.age_seconds()),
              ShortNs(n.namespace_id())});
  }
  t.Print(out);
  if (!Headers(out)) return;
  out << "(" << resp.nodes_size() << " of " << resp.total_nodes()
      << " cached blocks shown"
      << (resp.truncated() ? "; raise --limit for more, or --all" : "")
      << ")\n";
}

struct TreeOptions {
  std::optional<uint32_t> limit;  // absent: 20; excludes --all
  std::optional<uint32_t> max_depth;
  bool all = false;
  bool no_headers = false;
};

void AddTreeFlags(CLI::App& app, TreeOptions& o, CompletionValues&) {
  AddUintFlag(app, "limit", &o.limit, 1, 10000,
              "at most this many blocks (default 20, max 10000)");
  AddUintFlag(app, "max-depth", &o.max_depth, 0, 0xffffffffu,
              "deepest block index to show (0: first blocks)");
  AddBoolFlag(app, "all", &o.all,
              "every cached block, however many (page order)");
  AddNoHeadersFlag(app, &o.no_headers);
}

// tree --all: every cached block, walking DumpTree's pages (page-id order)
// with one --timeout deadline per page; the pages are printed as one answer.
int RunTreeAll(Context& ctx, v1::DumpTreeRequest req) {
  Admin::Stub stub(ctx.Channel());
  req.set_limit(10000);
  req.set_paged(true);
  v1::DumpTreeResponse all;
  do {
    v1::DumpTreeResponse page;
    const absl::Status status = CallWithDeadline(
        [&](grpc::ClientContext* call) {
          return stub.DumpTree(call, req, &page);
        },
        ctx.global.timeout);
    if (!status.ok()) return Fail(ctx, status);
    for (v1::TreeNode& n : *page.mutable_nodes()) {
      *all.add_nodes() = std::move(n);
    }
    all.set_total_nodes(page.total_nodes());
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  return PrintResult(ctx, [&] { return ToJsonLine(all); },
                     [&] { PrintTree(all, *ctx.out); });
}

int RunTree(Context& ctx, const TreeOptions& o) {
  ApplyNoHeaders(ctx, o.no_headers);
  v1::DumpTreeRequest req;
  if (o.max_depth.has_value()) req.set_max_depth(*o.max_depth);
  if (o.all) {
    if (o.limit.has_value()) {
      return BadArgs(ctx, "--all and --limit exclude each other");
    }
    return RunTreeAll(ctx, req);
  }
  req.set_limit(o.limit.value_or(20));
  return CallAndPrint(ctx, &Admin::Stub::DumpTree, req, PrintTree);
}

// ---- evict / clear ------------------------------------------------------------

constexpr uint64_t kMaxEvictPages = uint64_t{1} << 40;

struct EvictOptions {
  std::optional<uint64_t> pages;  // required
};

void AddEvictFlags(CLI::App& app, EvictOptions& o, CompletionValues&) {
  AddUintFlag(app, "pages", &o.pages, 1, kMaxEvictPages,
              "how many pages to evict (required)");
}

int RunEvict(Context& ctx, const EvictOptions& o) {
  if (!o.pages.has_value()) {
    return BadArgs(ctx, absl::StrCat("--pages is required (an integer in 1..",
                                     kMaxEvictPages, ")"));
  }
  const uint64_t pages = *o.pages;
  v1::EvictRequest req;
  req.set_pages(pages);
  return CallAndPrint(ctx, &Admin::Stub::Evict, req,
                      [&](const v1::EvictResponse& resp, std::ostream& out) {
                        out << "evicted " << resp.evicted() << " of " << pages
                            << " requested pages\n";
                      });
}

struct ClearOptions {
  bool yes = false;  // no confirmation
};

void AddClearFlags(CLI::App& app, ClearOptions& o, CompletionValues&) {
  AddBoolFlag(app, "yes", &o.yes, "do not ask for confirmation");
}

int RunClear(Context& ctx, const ClearOptions& o) {
  if (!o.yes) {
    if (!isatty(STDIN_FILENO)) {
      return BadArgs(ctx,
                     "clear drops every unpinned cached block; stdin is not a "
                     "terminal to confirm on, so pass --yes");
    }
    *ctx.err << "Clear all unpinned cached blocks? [y/N] " << std::flush;
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "y" && answer != "Y" && answer != "yes") {
      *ctx.err << "Error: clear aborted\n";
      return kExitError;
    }
  }
  return CallAndPrint(ctx, &Admin::Stub::Clear, v1::ClearRequest(),
                      [](const v1::ClearResponse& resp, std::ostream& out) {
                        out << "removed " << resp.removed() << " blocks; "
                            << resp.pinned_remaining()
                            << " pinned blocks remain\n";
                      });
}

// ---- unpin, pins ----------------------------------------------------------------

struct UnpinOptions {
  std::vector<std::string> ids;  // positional: exactly one
};

void AddUnpinFlags(CLI::App& app, UnpinOptions& o, CompletionValues&) {
  AddPositional(app, "ID", &o.ids, "the pin's id (radixkvctl pins)");
}

int RunUnpin(Context& ctx, const UnpinOptions& o) {
  if (o.ids.size() != 1) {
    return BadArgs(ctx, absl::StrCat("unpin: name one pin id (radixkvctl "
                                     "pins lists them); got ",
                                     o.ids.size()));
  }
  absl::StatusOr<uint64_t> id =
      ParseUintFlag("ID", o.ids[0], 1, UINT64_MAX);
  if (!id.ok()) return BadArgs(ctx, std::string(id.status().message()));
  v1::UnpinRequest req;
  req.set_pin_id(*id);
  return CallAndPrint(ctx, &Admin::Stub::Unpin, req,
                      [&](const v1::UnpinResponse& resp, std::ostream& out) {
                        out << "unpinned pin " << *id << " ("
                            << resp.unpinned_blocks() << " blocks)\n";
                      });
}

void PrintPins(const v1::ListPinsResponse& resp, std::ostream& out) {
  Table t({"ID", "TENANT", "BLOCKS", "OF", "AGE", "LAST_KEY", "NAMESPACE"});
  t.AlignRight({0, 2, 3, 4});
  for (const v1::PinEntry& p : resp.pins()) {
    t.AddRow({absl::StrCat(p.pin_id()), p.tenant(),
              absl::StrCat(p.pinned_blocks()), absl::StrCat(p.total_blocks()),
              HumanDuration(p.age_seconds()), Hex(p.last_key(), 16) + "..",
              ShortNs(p.namespace_id())});
  }
  t.Print(out);
}

// ---- watch --------------------------------------------------------------------
//
// SIGINT/SIGTERM are blocked before any gRPC thread exists, and one thread
// waits for them with sigwait and cancels the stream: no work in a signal
// handler. g_watch_mu guards the pointer to the live call.

absl::Mutex g_watch_mu;
grpc::ClientContext* g_watch_call ABSL_GUARDED_BY(g_watch_mu) = nullptr;
bool g_interrupted ABSL_GUARDED_BY(g_watch_mu) = false;

void SignalWaiter(sigset_t set) {
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return;
    absl::MutexLock lock(&g_watch_mu);
    g_interrupted = true;
    if (g_watch_call != nullptr) g_watch_call->TryCancel();
  }
}

std::string FormatEvent(const v1::Event& e) {
  const std::string when = absl::FormatTime(
      "%H:%M:%E3S", absl::FromUnixNanos(static_cast<int64_t>(e.unix_seconds() * 1e9)),
      absl::LocalTimeZone());
  std::string line = absl::StrCat(e.sequence(), "  ", when, "  ");
  switch (e.kind_case()) {
    case v1::Event::kStored:
      absl::StrAppend(&line, "stored   key=", Hex(e.stored().key(), 16),
                      ".. depth=", e.stored().depth(), " page=",
                      e.stored().page(), " ns=",
                      ShortNs(e.stored().namespace_id()));
      break;
    case v1::Event::kRemoved:
      absl::StrAppend(&line, "removed  key=", Hex(e.removed().key(), 16),
                      ".. page=", e.removed().page(), " ns=",
                      ShortNs(e.removed().namespace_id()));
      break;
    case v1::Event::kCleared:
      absl::StrAppend(&line, "cleared");
      break;
    case v1::Event::kGap:
      absl::StrAppend(&line, "GAP      missed events ", e.gap().first_missing(),
                      "..", e.gap().next_sequence() - 1,
                      " (the daemon's event buffer overflowed)");
      break;
    default:
      absl::StrAppend(&line, "unknown event");
  }
  return line;
}

struct WatchOptions {
  uint64_t from = 0;   // 0: from now on
  uint64_t count = 0;  // 0: until interrupted
};

void AddWatchFlags(CLI::App& app, WatchOptions& o, CompletionValues&) {
  AddUintFlag(app, "from", &o.from, 0, ~uint64_t{0},
              "first sequence number, one still in the daemon's buffer "
              "(default 0: from now on)");
  AddUintFlag(app, "count", &o.count, 0, ~uint64_t{0},
              "stop after this many events (default 0: never)");
}

int RunWatch(Context& ctx, const WatchOptions& o) {
  const uint64_t count = o.count;

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before gRPC starts threads
  std::thread(SignalWaiter, set).detach();

  auto channel = ctx.Channel();
  if (!channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + ctx.global.timeout))) {
    return Fail(ctx, absl::UnavailableError("no connection"));
  }
  auto stub = Admin::NewStub(channel);
  v1::WatchEventsRequest req;
  req.set_start_sequence(o.from);
  grpc::ClientContext call;
  {
    absl::MutexLock lock(&g_watch_mu);
    if (g_interrupted) return kExitOk;
    g_watch_call = &call;
  }
  auto reader = stub->WatchEvents(&call, req);
  v1::Event event;
  uint64_t seen = 0;
  uint64_t expected = 0;  // next sequence number, once known
  while ((count == 0 || seen < count) && reader->Read(&event)) {
    ++seen;
    if (expected != 0 && event.sequence() > expected &&
        event.kind_case() != v1::Event::kGap) {
      // The daemon reports its own gaps; this catches any it did not.
      *ctx.err << "warning: events " << expected << ".."
               << event.sequence() - 1 << " were not received\n";
    }
    if (event.kind_case() == v1::Event::kGap) {
      expected = event.gap().next_sequence();
    } else {
      expected = event.sequence() + 1;
    }
    PrintResult(
        ctx, [&] { return ToJsonLine(event); },
        [&] { *ctx.out << FormatEvent(event) << "\n"; });
    *ctx.out << std::flush;
  }
  bool interrupted;
  {
    absl::MutexLock lock(&g_watch_mu);
    interrupted = g_interrupted;
    if (count != 0 && seen >= count) call.TryCancel();
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  {
    absl::MutexLock lock(&g_watch_mu);
    g_watch_call = nullptr;
  }
  if (interrupted || (count != 0 && seen >= count)) return kExitOk;
  if (!s.ok()) return Fail(ctx, s);
  return kExitOk;
}

}  // namespace

std::vector<Command> AdminCommands() {
  const std::string state = "Cluster health and state";
  const std::string contents = "Cache contents";
  const std::string maintenance = "Maintenance";
  // name, group, summary, example, details, flags and run
  return {
      {"health", state,
       "Check the daemon's grpc.health.v1 status (exit 4 unless SERVING)",
       "radixkvctl health\nradixkvctl --endpoint=/run/radixkv/radixkvd.sock health -o json",
       "Calls grpc.health.v1.Health/Check. Prints SERVING and exits 0, or "
       "prints the status and exits 4 (NOT_SERVING, e.g. while draining).",
       CommandWith(AddHealthFlags, RunHealth)},
      {"endpoint", state,
       "Print the gRPC target the other commands connect to (no call)",
       "radixkvctl endpoint\n"
       "S=$(radixkvctl endpoint)   # unix:/run/user/1000/radixkv/radixkvd.sock",
       "The target comes from --endpoint, else RADIXKVCTL_ENDPOINT, else the "
       "default socket: /run/radixkv/radixkvd.sock when that socket exists, "
       "else $XDG_RUNTIME_DIR/radixkv/radixkvd.sock when XDG_RUNTIME_DIR is "
       "set, else /tmp/radixkv-<uid>/radixkvd.sock. A socket path prints as "
       "unix:PATH, which any gRPC client takes. Always exits 0 for a valid "
       "endpoint (3 for one that does not parse); the daemon is not called.",
       CommandWith(AddNoFlags, RunEndpoint)},
      {"stats", state, "Show pool occupancy, hit ratio, sessions and leases",
       "radixkvctl stats\nradixkvctl stats -o json | jq .stats.hit_tokens", "",
       CommandWith(AddNoFlags, RunQuery<&Admin::Stub::GetStats, PrintStats>)},
      {"namespaces", state,
       "List namespaces (model, layout, tenant) and their cached blocks",
       "radixkvctl namespaces\n"
       "radixkvctl namespaces --no-headers | awk '{print $1}'",
       "",
       CommandWith(AddTableFlags,
                   RunTableQuery<&Admin::Stub::ListNamespaces, PrintNamespaces>)},
      {"sessions", state, "List worker sessions with their leases and age",
       "radixkvctl sessions -o json", "",
       CommandWith(AddTableFlags,
                   RunTableQuery<&Admin::Stub::ListSessions, PrintSessions>)},
      {"tree", contents,
       "Show the top of the radix tree: shallowest blocks first",
       "radixkvctl tree --limit=50 --max-depth=2\n"
       "radixkvctl tree --limit=1000 -o json | jq '.nodes | length'\n"
       "radixkvctl tree --all -o json | jq '.nodes | length'",
       "Columns: key prefix, depth (block index in its prompt), page, refcount "
       "(leases pinning it), children, age since last use, namespace. --all "
       "pages through every cached block (in page order, 10000 per call); "
       "blocks that change during the walk may show either state.",
       CommandWith(AddTreeFlags, RunTree)},
      {"watch", contents,
       "Follow cache events (stored, removed, cleared) until interrupted",
       "radixkvctl watch\nradixkvctl watch --from=1 --count=10 -o json",
       "Streams Admin.WatchEvents. Each event has a sequence number; a GAP "
       "line says which events this consumer missed. Stops on Ctrl-C "
       "(exit 0) or after --count events.",
       CommandWith(AddWatchFlags, RunWatch)},
      {"pins", "Pins", "List prefix pins: id, tenant, blocks, age",
       "radixkvctl pins\nradixkvctl pins -o json | jq '.pins[].pin_id'",
       "A tenant sees its own pins, an administrator every pin.",
       CommandWith(AddTableFlags,
                   RunTableQuery<&Admin::Stub::ListPins, PrintPins>)},
      {"unpin", "Pins", "End a prefix pin: its blocks are evictable again",
       "radixkvctl unpin 42",
       "The id is the one `radixkvctl pin` printed (or `radixkvctl pins` "
       "lists). An id that is not one of your tenant's pins is an error "
       "(exit 1).",
       CommandWith(AddUnpinFlags, RunUnpin)},
      {"evict", maintenance,
       "Evict up to N least-recently-used unpinned blocks",
       "radixkvctl evict --pages=1000", "",
       CommandWith(AddEvictFlags, RunEvict)},
      {"clear", maintenance,
       "Drop every unpinned cached block (asks for confirmation)",
       "radixkvctl clear --yes",
       "Asks \"Clear all unpinned cached blocks? [y/N]\" on a terminal. "
       "Without a terminal, --yes is required (else exit 3).",
       CommandWith(AddClearFlags, RunClear)},
  };
}

}  // namespace radixkv::ctl
