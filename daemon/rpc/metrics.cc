#include "daemon/rpc/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>

#include "CivetServer.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "civetweb.h"
#include "daemon/core/cache.h"
#include "daemon/rpc/process_metrics.h"
#include "prometheus/labels.h"
#include "prometheus/text_serializer.h"

namespace radixkv::daemon {
namespace {

// Upper bounds of the latency histogram: 10 us .. 10 s.
const std::vector<double>& LatencyBuckets() {
  static const auto* b = new std::vector<double>{
      1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
      5e-3, 1e-2,   2.5e-2, 5e-2, 0.1, 0.25,  0.5,  1,    2.5, 10};
  return *b;
}

const char* CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return "OK";
    case absl::StatusCode::kCancelled: return "CANCELLED";
    case absl::StatusCode::kUnknown: return "UNKNOWN";
    case absl::StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound: return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted: return "ABORTED";
    case absl::StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case absl::StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal: return "INTERNAL";
    case absl::StatusCode::kUnavailable: return "UNAVAILABLE";
    case absl::StatusCode::kDataLoss: return "DATA_LOSS";
    case absl::StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

// A status code as go-grpc-prometheus's grpc_code label spells it (Go's
// codes.Code names).
const char* GrpcCodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return "OK";
    case absl::StatusCode::kCancelled: return "Canceled";
    case absl::StatusCode::kUnknown: return "Unknown";
    case absl::StatusCode::kInvalidArgument: return "InvalidArgument";
    case absl::StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case absl::StatusCode::kNotFound: return "NotFound";
    case absl::StatusCode::kAlreadyExists: return "AlreadyExists";
    case absl::StatusCode::kPermissionDenied: return "PermissionDenied";
    case absl::StatusCode::kResourceExhausted: return "ResourceExhausted";
    case absl::StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case absl::StatusCode::kAborted: return "Aborted";
    case absl::StatusCode::kOutOfRange: return "OutOfRange";
    case absl::StatusCode::kUnimplemented: return "Unimplemented";
    case absl::StatusCode::kInternal: return "Internal";
    case absl::StatusCode::kUnavailable: return "Unavailable";
    case absl::StatusCode::kDataLoss: return "DataLoss";
    case absl::StatusCode::kUnauthenticated: return "Unauthenticated";
    default: return "Unknown";
  }
}

// The grpc_service, grpc_method and grpc_type labels of a method.
prometheus::Labels GrpcLabels(Method m) {
  const bool kv = m == Method::kSession || m == Method::kAcquire ||
                  m == Method::kCommit || m == Method::kRelease ||
                  m == Method::kMatch;
  const char* type = m == Method::kSession       ? "bidi_stream"
                     : m == Method::kWatchEvents ? "server_stream"
                                                 : "unary";
  return {{"grpc_service", kv ? "radixkv.v1.KvCache" : "radixkv.v1.Admin"},
          {"grpc_method", MethodName(m)},
          {"grpc_type", type}};
}

// ---- /readyz ----------------------------------------------------------------
//
// prometheus::Exposer serves only exposition text, so /readyz is answered in
// civetweb's begin_request callback, before the exposer's handlers. The
// callback has no user data of its own: each serving Metrics registers its
// readiness under the port it listens on (one exposer per port).

struct ReadyzRegistry {
  absl::Mutex mu;
  absl::flat_hash_map<int, const std::atomic<int>*> by_port ABSL_GUARDED_BY(mu);
};

ReadyzRegistry& Readyz() {
  static auto* registry = new ReadyzRegistry;
  return *registry;
}

// The values of Metrics::ready_.
constexpr int kStarting = 0;
constexpr int kReady = 1;
constexpr int kStopping = 2;

// Answers GET/HEAD /readyz; 0 (civetweb goes on) for every other path.
int BeginRequest(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri == nullptr || ri->local_uri == nullptr ||
      std::strcmp(ri->local_uri, "/readyz") != 0) {
    return 0;
  }
  int state = kStarting;  // not registered yet: Serve has not returned
  {
    ReadyzRegistry& r = Readyz();
    absl::MutexLock lock(&r.mu);
    auto it = r.by_port.find(ri->server_port);
    if (it != r.by_port.end()) state = it->second->load(std::memory_order_acquire);
  }
  const std::string body =
      state == kReady      ? "ready\n"
      : state == kStopping ? "not ready: draining\n"
                           : "not ready: starting\n";
  const int code = state == kReady ? 200 : 503;
  const std::string head = absl::StrCat(
      "HTTP/1.1 ", code, code == 200 ? " OK" : " Service Unavailable",
      "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ",
      body.size(), "\r\nCache-Control: no-store\r\n\r\n");
  mg_write(conn, head.data(), head.size());
  if (ri->request_method == nullptr ||
      std::strcmp(ri->request_method, "HEAD") != 0) {
    mg_write(conn, body.data(), body.size());
  }
  return code;
}

const CivetCallbacks* ExposerCallbacks() {
  static const CivetCallbacks* callbacks = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = BeginRequest;
    return c;
  }();
  return callbacks;
}

// Why --metrics_listen=`listen` cannot be listened on, found by binding it
// once more after the exposer failed with `what`: UNAVAILABLE for an
// address in use (another process holds it; a restart may find it free),
// INVALID_ARGUMENT for an address this machine cannot listen on.
absl::Status ListenError(const std::string& listen, const char* what) {
  const std::string flag = absl::StrCat("--metrics_listen=", listen);
  const size_t colon = listen.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": cannot listen (want HOST:PORT with a port in 0..65535, e.g. "
        "127.0.0.1:9464; an empty value turns metrics off)"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int gai = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                              service.c_str(), &hints, &found);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": cannot listen (host '", host, "': ", gai_strerror(gai), ")"));
  }
  int err = 0;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
                          a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    err = bound ? 0 : errno;
    close(fd);
    if (bound || err == EADDRINUSE) break;
  }
  freeaddrinfo(found);
  if (err == EADDRINUSE) {
    return absl::UnavailableError(absl::StrCat(
        flag, ": cannot listen (address in use); stop what holds the port "
        "(often the previous radixkvd, still draining), pass another "
        "--metrics_listen, or --metrics_listen= to turn metrics off"));
  }
  if (err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot listen (", std::strerror(err), ")"));
  }
  return absl::UnavailableError(
      absl::StrCat(flag, ": cannot listen (", what, ")"));
}

prometheus::MetricFamily Family(const char* name, const char* help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddValue(prometheus::MetricFamily* f, double v,
              std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f->type == prometheus::MetricType::Counter) {
    m.counter.value = v;
  } else {
    m.gauge.value = v;
  }
  f->metric.push_back(std::move(m));
}

// Per-tenant pages and counters (only with a tenants file).
void AddTenantFamilies(const v1::Stats& s,
                       std::vector<prometheus::MetricFamily>* out) {
  using prometheus::MetricType;
  auto pages = Family("radixkv_tenant_pages",
                      "A tenant's pages by state (held: pinned or being "
                      "written by its leases) and its limits (0: none).",
                      MetricType::Gauge);
  auto evicted = Family("radixkv_tenant_evicted_pages_total",
                        "A tenant's cached pages evicted.", MetricType::Counter);
  auto limited = Family("radixkv_tenant_limited_acquires_total",
                        "Acquires a tenant's page limits cut short or refused.",
                        MetricType::Counter);
  for (const v1::TenantStats& t : s.tenants()) {
    const std::string& name = t.name();
    AddValue(&pages, t.cached_pages(), {{"tenant", name}, {"state", "cached"}});
    AddValue(&pages, t.writing_pages(), {{"tenant", name}, {"state", "writing"}});
    AddValue(&pages, t.held_pages(), {{"tenant", name}, {"state", "held"}});
    AddValue(&pages, t.max_cached_pages(),
             {{"tenant", name}, {"state", "max_cached"}});
    AddValue(&pages, t.max_pinned_pages(),
             {{"tenant", name}, {"state", "max_pinned"}});
    AddValue(&pages, t.pin_pages(), {{"tenant", name}, {"state", "pin"}});
    AddValue(&pages, t.pin_limit_pages(),
             {{"tenant", name}, {"state", "max_pin"}});
    AddValue(&evicted, t.evicted_pages(), {{"tenant", name}});
    AddValue(&limited, t.limited_acquires(), {{"tenant", name}});
  }
  out->push_back(std::move(pages));
  out->push_back(std::move(evicted));
  out->push_back(std::move(limited));
}

// The tiers below the pool (--tier), one label value per tier.
void AddTierFamilies(
    const google::protobuf::RepeatedPtrField<v1::TierStats>& tiers,
    std::vector<prometheus::MetricFamily>* out) {
  using prometheus::MetricType;
  auto blocks = Family("radixkv_tier_blocks",
                       "Blocks in a tier below the pool, and its capacity.",
                       MetricType::Gauge);
  auto moved = Family("radixkv_tier_moved_blocks_total",
                      "Blocks demoted to a tier (evicted from the pool or "
                      "the tier above) and promoted back into the pool.",
                      MetricType::Counter);
  auto bytes = Family("radixkv_tier_bytes_total",
                      "Bytes written to and read from a tier.",
                      MetricType::Counter);
  auto dropped = Family("radixkv_tier_dropped_blocks_total",
                        "Blocks a tier did not take (plain evictions), "
                        "blocks that failed their checksum or their read, "
                        "failed page copies, copies superseded when the "
                        "pool cached the block again, and evicted blocks the "
                        "eviction policy kept from the tiers (reason policy).",
                        MetricType::Counter);
  auto available = Family("radixkv_tier_available",
                          "A shared tier's store: 1 when lookups reach it, 0 "
                          "while its circuit breaker is open.",
                          MetricType::Gauge);
  auto trips = Family("radixkv_tier_breaker_trips_total",
                      "Times a shared tier's circuit breaker opened after "
                      "consecutive failed store calls.",
                      MetricType::Counter);
  auto latency = Family("radixkv_tier_promotion_seconds",
                        "Time an Acquire spent copying one run of blocks up "
                        "from a tier.",
                        MetricType::Histogram);
  for (const v1::TierStats& t : tiers) {
    const std::string& kind = t.kind();
    AddValue(&blocks, t.blocks(), {{"tier", kind}, {"state", "stored"}});
    AddValue(&blocks, t.pending_blocks(), {{"tier", kind}, {"state", "pending"}});
    AddValue(&blocks, t.capacity_blocks(), {{"tier", kind}, {"state", "capacity"}});
    AddValue(&moved, t.demoted_blocks(), {{"tier", kind}, {"direction", "down"}});
    AddValue(&moved, t.promoted_blocks(), {{"tier", kind}, {"direction", "up"}});
    AddValue(&bytes, t.bytes_written(), {{"tier", kind}, {"direction", "write"}});
    AddValue(&bytes, t.bytes_read(), {{"tier", kind}, {"direction", "read"}});
    AddValue(&dropped, t.dropped_full(), {{"tier", kind}, {"reason", "staging_full"}});
    AddValue(&dropped, t.dropped_error(), {{"tier", kind}, {"reason", "write_error"}});
    AddValue(&dropped, t.checksum_failures(), {{"tier", kind}, {"reason", "checksum"}});
    AddValue(&dropped, t.copy_errors(), {{"tier", kind}, {"reason", "copy_error"}});
    AddValue(&dropped, t.read_errors(), {{"tier", kind}, {"reason", "read_error"}});
    AddValue(&dropped, t.superseded_blocks(), {{"tier", kind}, {"reason", "superseded"}});
    AddValue(&dropped, t.dropped_policy(), {{"tier", kind}, {"reason", "policy"}});
    if (kind == "remote") {
      AddValue(&dropped, t.write_errors(), {{"tier", kind}, {"reason", "store_error"}});
      AddValue(&available, t.unavailable() ? 0 : 1, {{"tier", kind}});
      AddValue(&trips, t.breaker_trips(), {{"tier", kind}});
    }
    prometheus::ClientMetric m;
    m.label = {{"tier", kind}};
    uint64_t cumulative = 0;
    for (int i = 0; i < t.promotion_seconds_counts_size(); ++i) {
      cumulative += t.promotion_seconds_counts(i);
      prometheus::ClientMetric::Bucket b;
      b.cumulative_count = cumulative;
      b.upper_bound = i < t.promotion_seconds_bounds_size()
                          ? t.promotion_seconds_bounds(i)
                          : std::numeric_limits<double>::infinity();
      m.histogram.bucket.push_back(b);
    }
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = t.promotion_seconds_sum();
    latency.metric.push_back(std::move(m));
  }
  out->push_back(std::move(blocks));
  out->push_back(std::move(moved));
  out->push_back(std::move(bytes));
  out->push_back(std::move(dropped));
  out->push_back(std::move(latency));
  if (!available.metric.empty()) {
    out->push_back(std::move(available));
    out->push_back(std::move(trips));
  }
}

}  // namespace

const char* MethodName(Method m) {
  switch (m) {
    case Method::kSession: return "Session";
    case Method::kAcquire: return "Acquire";
    case Method::kCommit: return "Commit";
    case Method::kRelease: return "Release";
    case Method::kMatch: return "Match";
    case Method::kGetStats: return "GetStats";
    case Method::kListNamespaces: return "ListNamespaces";
    case Method::kDumpTree: return "DumpTree";
    case Method::kExplain: return "Explain";
    case Method::kEvict: return "Evict";
    case Method::kClear: return "Clear";
    case Method::kListSessions: return "ListSessions";
    case Method::kWatchEvents: return "WatchEvents";
    case Method::kPin: return "Pin";
    case Method::kUnpin: return "Unpin";
    case Method::kListPins: return "ListPins";
    case Method::kCount: break;
  }
  return "unknown";
}

// Produces the cache-state families from one stats snapshot per scrape.
class Metrics::StateCollector : public prometheus::Collectable {
 public:
  explicit StateCollector(const Cache* cache) : cache_(cache) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    v1::Stats s;
    cache_->GetStats(&s);
    std::vector<prometheus::MetricFamily> out;

    auto pages = Family("radixkv_pages",
                        "Pool pages by state (pinned is a subset of cached; "
                        "quarantined, pages of fenced leases, a subset of "
                        "writing and pinned).",
                        MetricType::Gauge);
    AddValue(&pages, s.free_pages(), {{"state", "free"}});
    AddValue(&pages, s.writing_pages(), {{"state", "writing"}});
    AddValue(&pages, s.cached_pages(), {{"state", "cached"}});
    AddValue(&pages, s.pinned_pages(), {{"state", "pinned"}});
    AddValue(&pages, s.quarantined_pages(), {{"state", "quarantined"}});
    out.push_back(std::move(pages));
    if (s.tenants_size() > 0) AddTenantFamilies(s, &out);
    if (s.tiers_size() > 0) AddTierFamilies(s.tiers(), &out);
    if (cache_->has_tiers()) {
      // Written during a stop (metrics are served until it ends).
      auto drain = Family("radixkv_tier_drain_blocks",
                          "Blocks of the pool and the host tier the last "
                          "graceful stop wrote down to the disk tier "
                          "(drained) or left behind (left).",
                          MetricType::Gauge);
      const TierChain::DrainResult d = cache_->last_drain();
      AddValue(&drain, d.drained, {{"result", "drained"}});
      AddValue(&drain, d.left, {{"result", "left"}});
      out.push_back(std::move(drain));
    }

    auto gauge = [&out](const char* name, const char* help, double v) {
      auto f = Family(name, help, MetricType::Gauge);
      AddValue(&f, v);
      out.push_back(std::move(f));
    };
    auto counter = [&out](const char* name, const char* help, double v) {
      auto f = Family(name, help, MetricType::Counter);
      AddValue(&f, v);
      out.push_back(std::move(f));
    };
    gauge("radixkv_capacity_pages", "Pages in the pool (0 until the first namespace binds).",
          s.capacity_pages());
    gauge("radixkv_page_bytes", "Bytes per page (0 for a none pool or before binding).",
          s.pool().page_bytes());
    counter("radixkv_lookup_tokens_total",
            "Full-block tokens looked up by Acquire.", s.lookup_tokens());
    counter("radixkv_hit_tokens_total",
            "Tokens of those lookups found in the cache.", s.hit_tokens());
    counter("radixkv_lookups_total", "Acquire lookups.", s.lookups());
    counter("radixkv_matches_total", "Read-only Match lookups.", s.matches());
    counter("radixkv_inserted_blocks_total", "Blocks committed as new cached blocks.",
            s.inserted_blocks());
    counter("radixkv_deduplicated_blocks_total",
            "Committed blocks that were already cached.", s.deduplicated_blocks());
    counter("radixkv_evicted_pages_total", "Cached pages evicted.", s.evicted_pages());
    counter("radixkv_hash_collisions_total",
            "Key hits rejected because the stored tokens differed.", s.hash_collisions());
    counter("radixkv_walked_blocks_total",
            "Token-prompt blocks whose keys came from cached blocks by token "
            "comparison, without hashing.",
            s.walked_blocks());
    counter("radixkv_hashed_blocks_total",
            "Token-prompt blocks the daemon hashed.", s.hashed_blocks());
    gauge("radixkv_probation_pages",
          "Unpinned cached pages on the eviction policy's probation stack "
          "(evicted first).",
          s.probation_pages());
    gauge("radixkv_eviction_theta",
          "turn_duel's insertion strength (0: as lru).", s.eviction_theta());
    counter("radixkv_eviction_theta_changes_total",
            "Times turn_duel changed its insertion strength.",
            s.eviction_switches());
    gauge("radixkv_eviction_tier_theta",
          "turn_duel with tiers: the strength that decides which probation "
          "blocks are demoted when evicted (0: every one).",
          s.eviction_tier_theta());
    counter("radixkv_eviction_tier_theta_changes_total",
            "Times turn_duel changed its tier strength.",
            s.eviction_tier_switches());
    {
      auto f = Family("radixkv_eviction_admissions_total",
                      "Acquires by where the eviction policy put their new "
                      "blocks: the recency list or the probation stack.",
                      MetricType::Counter);
      AddValue(&f, s.admitted_requests(), {{"list", "recency"}});
      AddValue(&f, s.probation_requests(), {{"list", "probation"}});
      out.push_back(std::move(f));
    }
    gauge("radixkv_pinned_pages",
          "Pages held by prefix pins (Admin.Pin; a page two pins hold "
          "counts twice).",
          s.pin_pages());
    gauge("radixkv_pins", "Prefix pins (Admin.Pin).", s.pins());
    gauge("radixkv_sessions", "Open sessions.", s.sessions());
    gauge("radixkv_leases", "Live leases.", s.leases());
    counter("radixkv_lease_expired_total", "Leases ended by --lease_ttl.",
            s.lease_expired());
    counter("radixkv_lease_abandoned_total",
            "Leases ended because their Acquire failed before its answer "
            "reached the client.",
            s.lease_abandoned());
    gauge("radixkv_tree_nodes", "Nodes (cached blocks) in the radix tree.", s.tree_nodes());
    gauge("radixkv_namespaces", "Namespaces registered.", s.namespaces());
    gauge("radixkv_invariants_ok",
          "1 when free + writing + cached == capacity and pinned <= cached.",
          s.invariants_ok() ? 1 : 0);
    gauge("radixkv_uptime_seconds", "Seconds since radixkvd started.", s.uptime_seconds());
    out.push_back(BuildInfoFamily());
    for (prometheus::MetricFamily& f : ProcessFamilies()) {
      out.push_back(std::move(f));
    }
    return out;
  }

 private:
  const Cache* cache_;
};

// /healthz: "radixkv_up 1".
class Metrics::ProbeCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    auto f = Family("radixkv_up", "1 while radixkvd serves.",
                    prometheus::MetricType::Gauge);
    AddValue(&f, 1);
    std::vector<prometheus::MetricFamily> out;
    out.push_back(std::move(f));
    return out;
  }
};

Metrics::Metrics(const Cache* cache)
    : registry_(std::make_shared<prometheus::Registry>()),
      state_(std::make_shared<StateCollector>(cache)),
      probe_(std::make_shared<ProbeCollector>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("radixkv_requests_total")
                   .Help("RPCs handled, by method and gRPC status code.")
                   .Register(*registry_);
  durations_ = &prometheus::BuildHistogram()
                    .Name("radixkv_request_duration_seconds")
                    .Help("RPC handling time in the daemon, by method.")
                    .Register(*registry_);
  // go-grpc-prometheus's server metrics, for dashboards and alerts written
  // against them.
  grpc_started_ = &prometheus::BuildCounter()
                       .Name("grpc_server_started_total")
                       .Help("RPCs started on the server.")
                       .Register(*registry_);
  grpc_handled_ = &prometheus::BuildCounter()
                       .Name("grpc_server_handled_total")
                       .Help("RPCs completed on the server, regardless of "
                             "success or failure, by gRPC status code.")
                       .Register(*registry_);
  grpc_handling_ = &prometheus::BuildHistogram()
                        .Name("grpc_server_handling_seconds")
                        .Help("Response latency (seconds) of RPCs handled by "
                              "the server.")
                        .Register(*registry_);
  for (int i = 0; i < static_cast<int>(Method::kCount); ++i) {
    const Method m = static_cast<Method>(i);
    const char* name = MethodName(m);
    series_[i].duration =
        &durations_->Add({{"method", name}}, LatencyBuckets());
    series_[i].by_code[0].store(
        &requests_->Add({{"method", name}, {"code", "OK"}}));
    const prometheus::Labels grpc = GrpcLabels(m);
    series_[i].grpc_started = &grpc_started_->Add(grpc);
    series_[i].grpc_handling = &grpc_handling_->Add(grpc, LatencyBuckets());
    prometheus::Labels ok = grpc;
    ok["grpc_code"] = "OK";
    series_[i].grpc_by_code[0].store(&grpc_handled_->Add(ok));
  }
}

Metrics::~Metrics() { StopServing(); }

void Metrics::MarkStopping() {
  ready_.store(kStopping, std::memory_order_release);
}

void Metrics::StopServing() {
  ready_.store(kStopping, std::memory_order_release);
  // Stopping the exposer waits for the requests in flight; only then may
  // /readyz forget this port.
  exposer_.reset();
  if (readyz_port_ != 0) {
    ReadyzRegistry& r = Readyz();
    absl::MutexLock lock(&r.mu);
    auto it = r.by_port.find(readyz_port_);
    if (it != r.by_port.end() && it->second == &ready_) r.by_port.erase(it);
    readyz_port_ = 0;
  }
}

absl::Status Metrics::Serve(const std::string& listen) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(listen, 2,
                                                     ExposerCallbacks());
  } catch (const std::exception& e) {
    return ListenError(listen, e.what());
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(state_);
  readyz_port_ = port();
  ReadyzRegistry& r = Readyz();
  absl::MutexLock lock(&r.mu);
  r.by_port[readyz_port_] = &ready_;
  return absl::OkStatus();
}

void Metrics::MarkReady() {
  if (exposer_ == nullptr) return;
  exposer_->RegisterCollectable(probe_, "/healthz");
  ready_.store(kReady, std::memory_order_release);
}

int Metrics::port() const {
  if (exposer_ == nullptr) return 0;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Metrics::Record(Method method, const absl::Status& status,
                     absl::Duration latency) {
  MethodSeries& s = series_[static_cast<int>(method)];
  s.duration->Observe(absl::ToDoubleSeconds(latency));
  const int code = static_cast<int>(status.code());
  const int slot = code >= 0 && code < 17 ? code : 2;  // 2 = UNKNOWN
  prometheus::Counter* c = s.by_code[slot].load(std::memory_order_acquire);
  if (c == nullptr) {
    // Family::Add is idempotent and locked; racing threads get one series.
    c = &requests_->Add({{"method", MethodName(method)},
                         {"code", CodeName(static_cast<absl::StatusCode>(slot))}});
    s.by_code[slot].store(c, std::memory_order_release);
  }
  c->Increment();

  s.grpc_handling->Observe(absl::ToDoubleSeconds(latency));
  prometheus::Counter* g = s.grpc_by_code[slot].load(std::memory_order_acquire);
  if (g == nullptr) {
    prometheus::Labels labels = GrpcLabels(method);
    labels["grpc_code"] = GrpcCodeName(static_cast<absl::StatusCode>(slot));
    g = &grpc_handled_->Add(labels);
    s.grpc_by_code[slot].store(g, std::memory_order_release);
  }
  g->Increment();
}

void Metrics::Started(Method method) {
  series_[static_cast<int>(method)].grpc_started->Increment();
}

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<prometheus::MetricFamily> state = state_->Collect();
  families.insert(families.end(), std::make_move_iterator(state.begin()),
                  std::make_move_iterator(state.end()));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace radixkv::daemon
