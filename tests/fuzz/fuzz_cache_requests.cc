// Fuzzes daemon::Cache, radixkvd's core below gRPC, with sequences of
// serialized radixkv.v1 requests: every request passes request validation
// and then the sessions, leases and the radix tree, exactly as a gRPC call
// would, on a small pool so that eviction and a full pool are reached.
//
// Input (all of it arbitrary; a short or malformed tail ends the input):
//
//   byte 0          configuration bits (kConfig* below: pool, lease TTL,
//                   key mode, small limits, session/lease limits, caller)
//   then records:   op u8 | sel u8 | size u16 little-endian | size bytes
//
// `size bytes` is the request message of `op` in protobuf wire form (ops
// without a request ignore it). `sel` substitutes ids the fuzzer cannot
// guess: its low nibble picks one of the sessions opened so far (0xf: keep
// the message's own session_id), its high nibble one of the leases handed
// out so far (0xf: keep the message's lease id). For OpenSession its low
// bits replace the namespace by a valid one, or acknowledge the sessions
// opened so far, instead (kSel*).
//
// Checked after every request: CheckInvariants (the tree's full consistency
// check), the page accounting of GetStats, every page id an answer names is
// in the pool, and that a refused request changed no lease, session or page
// state. Checked at the end, after every session is closed: no lease and no
// page is left pinned or writing, other than fenced (quarantined) ones.
//
// RADIXKV_FUZZ_WRITE_SEEDS=DIR makes the harness write its seed corpus
// (corpus/fuzz_cache_requests/) to DIR and exit; RADIXKV_FUZZ_VERBOSE=1
// prints each request's outcome.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/core/cache.h"
#include "base/log.h"
#include "google/protobuf/stubs/logging.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::fuzz {
namespace {

namespace v1 = ::radixkv::v1;
using daemon::Cache;
using daemon::CacheOptions;
using daemon::LeaseHandle;

// Configuration byte.
constexpr uint8_t kConfigPoolMask = 0x03;     // kPools[bits]
constexpr uint8_t kConfigShortTtl = 0x04;     // leases expire at once
constexpr uint8_t kConfigKeyMode = 0x08;      // --allow_key_mode
constexpr uint8_t kConfigSmallLimits = 0x10;  // tight request limits
constexpr uint8_t kConfigFewLeases = 0x20;    // 2 sessions, 2 leases each
constexpr uint8_t kConfigUnixPeer = 0x40;     // calls come from this process
                                              // as a Unix-socket peer, so
                                              // ended leases are fenced

constexpr const char* kPools[] = {"none,pages=64", "none,pages=4",
                                  "host,bytes=64KiB", "none,pages=1"};

// OpenSession's sel bits: replace the namespace by one of these.
constexpr uint8_t kSelNamespaceA = 0x01;      // the valid layout, model "a"
constexpr uint8_t kSelNamespaceB = 0x02;      // same layout, model "b"
constexpr uint8_t kSelOtherPageSize = 0x04;   // another page_size
constexpr uint8_t kSelAcknowledge = 0x08;     // acknowledge every session
                                              // opened so far

enum Op : uint8_t {
  kOpOpenSession = 0,
  kOpCloseSession,
  kOpAcquire,
  kOpCommit,
  kOpRelease,
  kOpAbandonLease,
  kOpMatch,
  kOpExplain,
  kOpDumpTree,
  kOpEvict,
  kOpClear,
  kOpListings,
  kOpSweep,
  kOpPoolForSession,
  kOpCount,
};

constexpr size_t kMaxOps = 64;

#define FUZZ_CHECK(cond, ...)                                             \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: %s\n", #cond,          \
                   absl::StrCat(__VA_ARGS__).c_str());                    \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

v1::Namespace ValidNamespace(const std::string& model, uint32_t page_size) {
  v1::Namespace ns;
  ns.set_model(model);
  ns.set_num_layers(1);
  ns.set_num_kv_heads(1);
  ns.set_head_dim(8);
  ns.set_page_size(page_size);
  ns.set_dtype(v1::DTYPE_FLOAT16);
  ns.set_tp_size(1);
  return ns;
}

struct HeldLease {
  std::string session;
  LeaseHandle handle;
};

// The lease, session and page state a refused request must leave alone.
struct Footprint {
  uint64_t sessions, leases, writing, cached, pinned;
  friend bool operator==(const Footprint&, const Footprint&) = default;
};

class Driver {
 public:
  explicit Driver(uint8_t config) : config_(config) {
    CacheOptions o;
    o.pool = gpu::ParsePoolSpec(kPools[config & kConfigPoolMask]).value();
    o.sweep_interval = absl::Hours(1);  // swept only by kOpSweep
    o.event_buffer = 64;
    o.remembered_evictions = 16;
    o.allow_key_mode = (config & kConfigKeyMode) != 0;
    if (config & kConfigSmallLimits) {
      o.max_prompt_tokens = 64;
      o.max_string_bytes = 16;
      o.max_page_size = 32;
    }
    if (config & kConfigFewLeases) {
      o.sessions.max_sessions = 2;
      o.sessions.max_leases_per_session = 2;
    }
    if (config & kConfigShortTtl) o.sessions.lease_ttl = absl::Nanoseconds(1);
    if (config & kConfigUnixPeer) {
      caller_.peer.transport = daemon::PeerIdentity::Transport::kUnix;
      caller_.peer.pid = ::getpid();
      caller_.peer.uid = ::geteuid();
      caller_.peer.gid = ::getegid();
    }
    cache_ = std::make_unique<Cache>(o);
  }

  void Run(uint8_t op, uint8_t sel, const std::string& body) {
    const Footprint before = Snapshot();
    const absl::Status s = Dispatch(op, sel, body);
    if (verbose_) {
      v1::Stats st;
      cache_->GetStats(&st);
      std::fprintf(stderr,
                   "op %u sel %02x: %s [leases %llu writing %llu pinned %llu "
                   "quarantined %llu]\n",
                   op % kOpCount, sel, s.ToString().c_str(),
                   (unsigned long long)st.leases(),
                   (unsigned long long)st.writing_pages(),
                   (unsigned long long)st.pinned_pages(),
                   (unsigned long long)st.quarantined_pages());
    }
    CheckState();
    // A refused request changes nothing. With leases that expire at once a
    // Commit or Release ends the expired lease it names while refusing.
    if (!s.ok() && (config_ & kConfigShortTtl) == 0) {
      FUZZ_CHECK(Snapshot() == before, "op ", op, " refused (", s.ToString(),
                 ") but changed lease/session/page state");
    }
  }

  // Closes every session: nothing may stay pinned or writing except fenced
  // pages.
  void Finish() {
    for (const std::string& s : sessions_) cache_->CloseSession(s);
    CheckState();
    v1::Stats st;
    cache_->GetStats(&st);
    FUZZ_CHECK(st.sessions() == 0, "sessions left: ", st.sessions());
    FUZZ_CHECK(st.leases() <= st.quarantined_leases(), "leases left: ",
               st.leases());
    FUZZ_CHECK(st.writing_pages() + st.pinned_pages() ==
                   st.quarantined_pages(),
               "writing ", st.writing_pages(), " pinned ", st.pinned_pages(),
               " quarantined ", st.quarantined_pages());
  }

 private:
  Footprint Snapshot() const {
    v1::Stats st;
    cache_->GetStats(&st);
    return Footprint{st.sessions(), st.leases(), st.writing_pages(),
                     st.cached_pages(), st.pinned_pages()};
  }

  void CheckState() {
    const absl::Status inv = cache_->CheckInvariants();
    FUZZ_CHECK(inv.ok(), inv.ToString());
    v1::Stats st;
    cache_->GetStats(&st);
    FUZZ_CHECK(st.invariants_ok(), "GetStats.invariants_ok is false");
    FUZZ_CHECK(st.free_pages() + st.writing_pages() + st.cached_pages() ==
                   st.capacity_pages(),
               "free ", st.free_pages(), " writing ", st.writing_pages(),
               " cached ", st.cached_pages(), " capacity ",
               st.capacity_pages());
    FUZZ_CHECK(st.pinned_pages() <= st.cached_pages(), "pinned ",
               st.pinned_pages(), " > cached ", st.cached_pages());
    capacity_ = st.capacity_pages();
  }

  void CheckPage(uint64_t page, const char* what) const {
    FUZZ_CHECK(page < capacity_, what, " page ", page, " outside capacity ",
               capacity_);
  }

  // The session named by sel's low nibble, or `own`.
  std::string Session(uint8_t sel, const std::string& own) const {
    const uint8_t i = sel & 0x0f;
    if (i == 0x0f || sessions_.empty()) return own;
    return sessions_[i % sessions_.size()];
  }
  // The lease named by sel's high nibble, or nullptr.
  const HeldLease* Lease(uint8_t sel) const {
    const uint8_t i = sel >> 4;
    if (i == 0x0f || leases_.empty()) return nullptr;
    return &leases_[i % leases_.size()];
  }

  absl::Status Dispatch(uint8_t op, uint8_t sel, const std::string& body);
  absl::Status OpenSession(uint8_t sel, const std::string& body);
  absl::Status Acquire(uint8_t sel, const std::string& body);
  absl::Status Commit(uint8_t sel, const std::string& body);
  absl::Status Inspect(uint8_t op, const std::string& body);

  const uint8_t config_;
  const bool verbose_ = std::getenv("RADIXKV_FUZZ_VERBOSE") != nullptr;
  daemon::Caller caller_ = daemon::Caller::Daemon();
  std::unique_ptr<Cache> cache_;
  std::vector<std::string> sessions_;
  std::vector<HeldLease> leases_;
  uint64_t capacity_ = 0;
};

absl::Status Driver::OpenSession(uint8_t sel, const std::string& body) {
  v1::OpenSession open;
  if (!open.ParseFromString(body)) open.Clear();
  if (sel & kSelNamespaceA) *open.mutable_namespace_() = ValidNamespace("a", 4);
  if (sel & kSelNamespaceB) *open.mutable_namespace_() = ValidNamespace("b", 4);
  if (sel & kSelOtherPageSize) {
    *open.mutable_namespace_() = ValidNamespace("a", 8);
  }
  if (sel & kSelAcknowledge) {
    for (const std::string& id : sessions_) {
      if (open.acknowledge_sessions_size() < 64) open.add_acknowledge_sessions(id);
    }
  }
  v1::SessionInfo info;
  absl::Status s = cache_->OpenSession(open, caller_, &info);
  if (s.ok()) {
    FUZZ_CHECK(!info.session_id().empty(), "OpenSession: empty session id");
    FUZZ_CHECK(info.namespace_id().size() == 16, "namespace_id of ",
               info.namespace_id().size(), " bytes");
    sessions_.push_back(info.session_id());
  }
  return s;
}

absl::Status Driver::Acquire(uint8_t sel, const std::string& body) {
  v1::AcquireRequest req;
  if (!req.ParseFromString(body)) req.Clear();
  req.set_session_id(Session(sel, req.session_id()));
  if (const HeldLease* l = Lease(sel)) req.add_release_leases(l->handle.lease);
  v1::AcquireResponse resp;
  LeaseHandle handle;
  absl::Status s = cache_->Acquire(req, &resp, caller_, &handle);
  if (!s.ok()) return s;
  std::vector<uint64_t> pages(resp.pages().begin(), resp.pages().end());
  if (req.pages_le()) {
    FUZZ_CHECK(resp.pages_le().size() % 4 == 0, "pages_le of ",
               resp.pages_le().size(), " bytes");
    for (size_t i = 0; i + 4 <= resp.pages_le().size(); i += 4) {
      uint32_t p;
      std::memcpy(&p, resp.pages_le().data() + i, 4);
      pages.push_back(p);
    }
  }
  FUZZ_CHECK(pages.size() == uint64_t{resp.matched_blocks()} + resp.new_blocks(),
             "Acquire: ", pages.size(), " pages for ", resp.matched_blocks(),
             " matched + ", resp.new_blocks(), " new blocks");
  FUZZ_CHECK(resp.matched_blocks() + uint64_t{resp.new_blocks()} <=
                 resp.total_blocks(),
             "Acquire: more blocks than the prompt has");
  FUZZ_CHECK((resp.lease_id() == 0) == pages.empty(),
             "Acquire: lease ", resp.lease_id(), " with ", pages.size(),
             " pages");
  FUZZ_CHECK(handle.lease == resp.lease_id(), "handle names lease ",
             handle.lease, ", answer ", resp.lease_id());
  for (uint64_t p : pages) CheckPage(p, "Acquire");
  if (resp.lease_id() != 0 && leases_.size() < 15) {
    leases_.push_back(HeldLease{req.session_id(), handle});
  }
  return s;
}

absl::Status Driver::Commit(uint8_t sel, const std::string& body) {
  v1::CommitRequest req;
  if (!req.ParseFromString(body)) req.Clear();
  if (const HeldLease* l = Lease(sel)) {
    req.set_lease_id(l->handle.lease);
    req.set_session_id(l->session);
  }
  req.set_session_id(Session(sel, req.session_id()));
  v1::CommitResponse resp;
  absl::Status s = cache_->Commit(req, &resp, caller_);
  if (!s.ok()) return s;
  FUZZ_CHECK(resp.inserted() + uint64_t{resp.deduplicated()} <=
                 uint64_t{req.blocks()},
             "Commit: ", resp.inserted(), " inserted + ", resp.deduplicated(),
             " deduplicated of ", req.blocks(), " blocks");
  for (uint64_t p : resp.pages()) CheckPage(p, "Commit");
  return s;
}

absl::Status Driver::Inspect(uint8_t op, const std::string& body) {
  switch (op) {
    case kOpMatch: {
      v1::MatchRequest req;
      if (!req.ParseFromString(body)) req.Clear();
      v1::MatchResponse resp;
      absl::Status s = cache_->Match(req, &resp, caller_);
      if (s.ok()) {
        FUZZ_CHECK(resp.matched_blocks() <= resp.total_blocks(),
                   "Match: matched ", resp.matched_blocks(), " of ",
                   resp.total_blocks());
      }
      return s;
    }
    case kOpExplain: {
      v1::ExplainRequest req;
      if (!req.ParseFromString(body)) req.Clear();
      v1::ExplainResponse resp;
      absl::Status s = cache_->Explain(req, &resp, caller_);
      if (s.ok()) {
        FUZZ_CHECK(resp.matched_blocks() <= resp.total_blocks(),
                   "Explain: matched ", resp.matched_blocks(), " of ",
                   resp.total_blocks());
      }
      return s;
    }
    case kOpDumpTree: {
      v1::DumpTreeRequest req;
      if (!req.ParseFromString(body)) req.Clear();
      v1::DumpTreeResponse resp;
      absl::Status s = cache_->DumpTree(req, &resp, caller_);
      if (s.ok()) {
        for (const v1::TreeNode& n : resp.nodes()) CheckPage(n.page(), "DumpTree");
      }
      return s;
    }
    case kOpEvict: {
      v1::EvictRequest req;
      if (!req.ParseFromString(body)) req.Clear();
      v1::EvictResponse resp;
      cache_->Evict(req, &resp);
      FUZZ_CHECK(resp.evicted() <= req.pages(), "Evict: evicted ",
                 resp.evicted(), " of ", req.pages());
      return absl::OkStatus();
    }
    case kOpClear: {
      v1::ClearResponse resp;
      cache_->Clear(&resp);
      return absl::OkStatus();
    }
    default: {
      v1::Stats stats;
      cache_->GetStats(&stats);
      v1::ListNamespacesResponse ns;
      cache_->ListNamespaces(&ns, caller_);
      v1::ListSessionsResponse sessions;
      cache_->ListSessions(&sessions, caller_);
      FUZZ_CHECK(static_cast<uint64_t>(sessions.sessions_size()) ==
                     stats.sessions(),
                 "ListSessions lists ", sessions.sessions_size(),
                 ", GetStats counts ", stats.sessions());
      return absl::OkStatus();
    }
  }
}

absl::Status Driver::Dispatch(uint8_t op, uint8_t sel,
                              const std::string& body) {
  switch (op % kOpCount) {
    case kOpOpenSession:
      return OpenSession(sel, body);
    case kOpCloseSession:
      cache_->CloseSession(Session(sel, body));
      return absl::OkStatus();
    case kOpAcquire:
      return Acquire(sel, body);
    case kOpCommit:
      return Commit(sel, body);
    case kOpRelease: {
      v1::ReleaseRequest req;
      if (!req.ParseFromString(body)) req.Clear();
      if (const HeldLease* l = Lease(sel)) {
        req.set_lease_id(l->handle.lease);
        req.set_session_id(l->session);
      }
      req.set_session_id(Session(sel, req.session_id()));
      return cache_->Release(req, caller_);
    }
    case kOpAbandonLease:
      if (const HeldLease* l = Lease(sel)) cache_->AbandonLease(l->handle);
      return absl::OkStatus();
    case kOpSweep:
      cache_->SweepExpiredLeases();
      return absl::OkStatus();
    case kOpPoolForSession: {
      const gpu::PagePool* pool = cache_->PoolForSession(Session(sel, body));
      if (pool != nullptr) {
        FUZZ_CHECK(pool->capacity_pages() == capacity_, "pool of ",
                   pool->capacity_pages(), " pages, stats say ", capacity_);
      }
      return absl::OkStatus();
    }
    default:
      return Inspect(op % kOpCount, body);
  }
}

// --- Seeds (RADIXKV_FUZZ_WRITE_SEEDS=DIR) ---

void Record(std::string* out, uint8_t op, uint8_t sel,
            const google::protobuf::Message* msg) {
  std::string body;
  if (msg != nullptr) msg->SerializeToString(&body);
  out->push_back(static_cast<char>(op));
  out->push_back(static_cast<char>(sel));
  out->push_back(static_cast<char>(body.size() & 0xff));
  out->push_back(static_cast<char>(body.size() >> 8));
  out->append(body);
}

v1::AcquireRequest AcquireOf(std::vector<uint32_t> tokens, bool le,
                             uint32_t max_new = 0) {
  v1::AcquireRequest req;
  if (le) {
    req.set_tokens_le(reinterpret_cast<const char*>(tokens.data()),
                      tokens.size() * 4);
  } else {
    req.mutable_tokens()->Assign(tokens.begin(), tokens.end());
  }
  req.set_allocate(true);
  req.set_max_new_blocks(max_new);
  return req;
}

// The requests the seeds are made of.
struct SeedRequests {
  SeedRequests() {
    const std::vector<uint32_t> p16 = {1, 2, 3, 4, 5, 6, 7, 8,
                                       9, 10, 11, 12, 13, 14, 15, 16};
    std::vector<uint32_t> p16b = p16;
    p16b[9] = 99;  // shares two blocks with p16
    a = AcquireOf(p16, false);
    ale = AcquireOf(p16b, true);
    ale.set_pages_le(true);
    c4.set_blocks(4);
    c4.set_release(true);
    c2.set_blocks(2);
    *match.mutable_namespace_() = ValidNamespace("a", 4);
    match.mutable_tokens()->Assign(p16.begin(), p16.end());
    *explain.mutable_namespace_() = ValidNamespace("a", 4);
    explain.mutable_tokens()->Assign(p16b.begin(), p16b.end());
    dump.set_limit(10);
    evict.set_pages(2);
    for (int i = 0; i < 3; ++i) {
      keys.add_block_keys(std::string(16, static_cast<char>('k' + i)));
    }
    keys.set_allocate(true);
    *bad_open.mutable_namespace_() = ValidNamespace(std::string(40, 'm'), 4);
    bad_open.set_block_key_version(2);
    too_long = AcquireOf(std::vector<uint32_t>(80, 7), false);
  }
  v1::AcquireRequest a, ale, keys, too_long;
  v1::CommitRequest c4, c2;
  v1::MatchRequest match;
  v1::ExplainRequest explain;
  v1::DumpTreeRequest dump;
  v1::EvictRequest evict;
  v1::ReleaseRequest release;
  v1::OpenSession bad_open;
};

// Insert, hit, branch, inspect, evict.
std::string SeedInsertHitBranch(const SeedRequests& r) {
  std::string s(1, '\0');
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpAcquire, 0xf0, &r.a);    // lease 0: four new blocks
  Record(&s, kOpCommit, 0x00, &r.c4);
  Record(&s, kOpAcquire, 0xf0, &r.a);    // lease 1: a full hit
  Record(&s, kOpAcquire, 0x10, &r.ale);  // lease 2, ending lease 1
  Record(&s, kOpCommit, 0x20, &r.c2);
  Record(&s, kOpMatch, 0xff, &r.match);
  Record(&s, kOpExplain, 0xff, &r.explain);
  Record(&s, kOpDumpTree, 0xff, &r.dump);
  Record(&s, kOpEvict, 0xff, &r.evict);
  Record(&s, kOpListings, 0xff, nullptr);
  Record(&s, kOpRelease, 0x20, &r.release);
  return s;
}

// Two sessions on a 4-page pool: eviction, a full pool, foreign leases,
// abandoning and closing, another page size.
std::string SeedFullPool(const SeedRequests& r) {
  std::string s(1, '\x01');
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpOpenSession, kSelNamespaceB, nullptr);
  Record(&s, kOpAcquire, 0xf0, &r.a);
  Record(&s, kOpAcquire, 0xf1, &r.ale);
  Record(&s, kOpCommit, 0x01, &r.c4);  // lease 0 from the other session
  Record(&s, kOpCommit, 0x00, &r.c4);
  Record(&s, kOpAbandonLease, 0x1f, nullptr);
  Record(&s, kOpAcquire, 0xf1, &r.a);
  Record(&s, kOpCloseSession, 0x01, nullptr);
  Record(&s, kOpOpenSession, kSelOtherPageSize, nullptr);
  Record(&s, kOpClear, 0xff, nullptr);
  Record(&s, kOpListings, 0xff, nullptr);
  return s;
}

// Leases that expire at once, key mode, a host pool.
std::string SeedShortTtl(const SeedRequests& r) {
  std::string s(1, static_cast<char>(0x02 | kConfigShortTtl | kConfigKeyMode));
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpAcquire, 0xf0, &r.keys);
  Record(&s, kOpCommit, 0x00, &r.c2);
  Record(&s, kOpSweep, 0xff, nullptr);
  Record(&s, kOpAcquire, 0xf0, &r.a);
  Record(&s, kOpPoolForSession, 0x00, nullptr);
  Record(&s, kOpRelease, 0x00, &r.release);
  return s;
}

// Tight limits and few leases: the refusal paths.
std::string SeedLimits(const SeedRequests& r) {
  std::string s(1, static_cast<char>(kConfigSmallLimits | kConfigFewLeases));
  Record(&s, kOpOpenSession, 0, &r.bad_open);
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpAcquire, 0xf0, &r.too_long);
  Record(&s, kOpAcquire, 0xf0, &r.a);
  Record(&s, kOpAcquire, 0xf0, &r.ale);
  Record(&s, kOpAcquire, 0xf0, &r.a);
  Record(&s, kOpAcquire, 0x00, &r.a);
  Record(&s, kOpCommit, 0x00, &r.c4);
  return s;
}

// Leases expire and are swept (their pages may be fenced), a session ends
// holding one, a later session acknowledges both.
std::string SeedFenceAcknowledge(const SeedRequests& r) {
  std::string s(1, static_cast<char>(0x02 | kConfigShortTtl | kConfigUnixPeer));
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpAcquire, 0xf0, &r.a);
  Record(&s, kOpSweep, 0xff, nullptr);
  Record(&s, kOpOpenSession, kSelNamespaceA, nullptr);
  Record(&s, kOpAcquire, 0xf1, &r.ale);
  Record(&s, kOpCloseSession, 0x01, nullptr);
  Record(&s, kOpListings, 0xff, nullptr);
  Record(&s, kOpOpenSession, kSelNamespaceA | kSelAcknowledge, nullptr);
  Record(&s, kOpAcquire, 0xf1, &r.a);
  return s;
}

void WriteSeeds(const char* dir) {
  const SeedRequests r;
  const std::pair<const char*, std::string> seeds[] = {
      {"fence_then_acknowledge", SeedFenceAcknowledge(r)},
      {"insert_hit_branch", SeedInsertHitBranch(r)},
      {"evict_full_pool_two_sessions", SeedFullPool(r)},
      {"short_ttl_key_mode_host_pool", SeedShortTtl(r)},
      {"limits", SeedLimits(r)},
  };
  for (const auto& [name, bytes] : seeds) {
    const std::string path = absl::StrCat(dir, "/", name);
    FILE* f = std::fopen(path.c_str(), "wb");
    FUZZ_CHECK(f != nullptr, "cannot write ", path);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

}  // namespace
}  // namespace radixkv::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Parsing a non-UTF-8 string field logs an error each time; the request
  // is then refused like any other malformed one.
  google::protobuf::SetLogHandler(nullptr);
  // Every input creates a pool, which the daemon logs at info.
  radixkv::SetLogLevel(radixkv::LogLevel::kError);
  if (const char* dir = std::getenv("RADIXKV_FUZZ_WRITE_SEEDS")) {
    radixkv::fuzz::WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using radixkv::fuzz::Driver;
  if (size == 0) return 0;
  Driver driver(data[0]);
  size_t pos = 1;
  for (size_t ops = 0; ops < radixkv::fuzz::kMaxOps && pos + 4 <= size; ++ops) {
    const uint8_t op = data[pos];
    const uint8_t sel = data[pos + 1];
    const size_t len = data[pos + 2] | (size_t{data[pos + 3]} << 8);
    pos += 4;
    if (len > size - pos) break;
    driver.Run(op, sel,
               std::string(reinterpret_cast<const char*>(data) + pos, len));
    pos += len;
  }
  driver.Finish();
  return 0;
}
