// soak_worker: one worker process of the crash-and-stall soak
// (bench/soak/soak.py starts, signals, kills and restarts many of them).
//
// It uses radixkvd exactly as an inference worker does, through
// radixkv::Client with the pool mapped, over a fixed universe of prompts
// that share system-prompt prefixes:
//
//   writer  Acquire(allocate) -> check every hit page -> stamp every new
//           page (in chunks, pausing between them) -> Commit(release)
//   reader  Acquire(no allocate) -> check every hit page -> Release
//   verify  a reader that walks every prompt once, then exits
//
// A stamp fills the whole page with 64-byte cells, each naming the block
// key, the writer's owner id and generation, the page it was written into,
// its own index and a checksum.
// A hit page passes when every cell is intact and names the block key the
// page was matched for and the page's committer (soak_shared.h). The worker
// publishes its phase and counters in its slot of the shared file.
//
//   soak_worker --socket=PATH --shared=FILE --slot=N --owner=ID --role=writer
//               [--seed=S --systems=4 --users=32 --system_blocks=3
//                --user_blocks=3 --write_chunks=4 --write_pause_us=300
//                --lease_ttl_ms=5000 --think_us=0 --tiers=0]
#include <algorithm>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/soak/soak_shared.h"
#include "client/client.h"
#include "gpu/mapped_pool.h"

namespace radixkv::soak {
namespace {

// The namespace every soak worker shares: 8 KiB pages of 16 tokens.
constexpr uint32_t kPageSize = 16;

NamespaceSpec SoakNamespace() {
  NamespaceSpec ns;
  ns.model = "soak";
  ns.num_layers = 1;
  ns.num_kv_heads = 1;
  ns.head_dim = 64;
  ns.page_size = kPageSize;
  ns.dtype = DType::kFloat32;
  return ns;
}

struct Args {
  std::string socket, shared, role = "writer";
  uint64_t slot = 0, owner = 0, seed = 1;
  uint64_t systems = 4, users = 32, system_blocks = 3, user_blocks = 3;
  uint64_t write_chunks = 4, write_pause_us = 300, lease_ttl_ms = 5000;
  uint64_t think_us = 0;
  uint64_t tiers = 0;  // 1: the daemon has lower tiers (blocks move pages)
};

bool ParseArgs(int argc, char** argv, Args* a) {
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.substr(0, 2) != "--" || eq == absl::string_view::npos) {
      std::fprintf(stderr, "soak_worker: bad argument '%s'\n", argv[i]);
      return false;
    }
    kv[std::string(arg.substr(2, eq - 2))] = std::string(arg.substr(eq + 1));
  }
  auto take_str = [&](const char* name, std::string* out) {
    if (auto it = kv.find(name); it != kv.end()) *out = it->second, kv.erase(it);
  };
  bool ok = true;
  auto take_u64 = [&](const char* name, uint64_t* out) {
    if (auto it = kv.find(name); it != kv.end()) {
      ok = ok && absl::SimpleAtoi(it->second, out);
      kv.erase(it);
    }
  };
  take_str("socket", &a->socket);
  take_str("shared", &a->shared);
  take_str("role", &a->role);
  take_u64("slot", &a->slot);
  take_u64("owner", &a->owner);
  take_u64("seed", &a->seed);
  take_u64("systems", &a->systems);
  take_u64("users", &a->users);
  take_u64("system_blocks", &a->system_blocks);
  take_u64("user_blocks", &a->user_blocks);
  take_u64("write_chunks", &a->write_chunks);
  take_u64("write_pause_us", &a->write_pause_us);
  take_u64("lease_ttl_ms", &a->lease_ttl_ms);
  take_u64("think_us", &a->think_us);
  take_u64("tiers", &a->tiers);
  for (const auto& [k, v] : kv) {
    std::fprintf(stderr, "soak_worker: unknown flag --%s\n", k.c_str());
    ok = false;
  }
  if (a->socket.empty() || a->shared.empty() || a->write_chunks == 0 ||
      a->systems == 0 || a->users == 0) {
    ok = false;
  }
  return ok;
}

uint64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// --- Stamps ---

// `page` is the pool page the writer wrote (the page its commit record
// names); a block promoted from a lower tier arrives in another page with
// its cells unchanged.
struct Cell {
  uint64_t key_hi, key_lo, owner, generation;
  uint32_t index, magic;
  uint64_t check;
  uint64_t page;
  uint64_t pad;
};
static_assert(sizeof(Cell) == 64);
constexpr uint32_t kCellMagic = 0x5354414d;  // "MATS"

uint64_t CellCheck(const Cell& c) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ c.index;
  for (uint64_t v : {c.key_hi, c.key_lo, c.owner, c.generation, c.page}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  }
  return h;
}

struct Stamp {
  BlockKey key;
  uint64_t owner = 0, generation = 0;
  uint64_t page = 0;  // the page it was written into
};

// Writes the stamp's cells [begin, end) of a page.
void WriteCells(void* page, const Stamp& s, size_t begin, size_t end) {
  auto* cells = static_cast<volatile Cell*>(page);
  for (size_t i = begin; i < end; ++i) {
    Cell c{s.key.hi, s.key.lo, s.owner, s.generation, uint32_t(i), kCellMagic,
           0, s.page, 0};
    c.check = CellCheck(c);
    std::memcpy(const_cast<Cell*>(&cells[i]), &c, sizeof(c));
  }
}

// Reads a page's stamp into *out (its first cell); false when any cell is
// damaged or disagrees with the first (a torn or overwritten page), and
// then *other is the first such cell.
bool ReadStamp(const void* page, size_t cells, Stamp* out, Stamp* other) {
  const auto* cv = static_cast<const volatile Cell*>(page);
  Cell first{};
  for (size_t i = 0; i < cells; ++i) {
    Cell c;
    std::memcpy(&c, const_cast<const Cell*>(&cv[i]), sizeof(c));
    if (i == 0) {
      first = c;
      *out = Stamp{BlockKey{c.key_hi, c.key_lo}, c.owner, c.generation,
                   c.page};
    }
    if (c.magic != kCellMagic || c.index != i || c.check != CellCheck(c) ||
        c.key_hi != first.key_hi || c.key_lo != first.key_lo ||
        c.owner != first.owner || c.generation != first.generation ||
        c.page != first.page) {
      *other = Stamp{BlockKey{c.key_hi, c.key_lo}, c.owner, c.generation,
                     c.page};
      return false;
    }
  }
  return cells > 0;
}

// --- The shared file ---

class Shared {
 public:
  static std::unique_ptr<Shared> Open(const std::string& path, uint64_t slot) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return nullptr;
    uint32_t head[3];
    if (::pread(fd, head, sizeof(head), 0) != sizeof(head) ||
        head[0] != kMagic || slot >= head[1]) {
      ::close(fd);
      return nullptr;
    }
    const size_t bytes = FileBytes(head[1], head[2]);
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base == MAP_FAILED) return nullptr;
    return std::unique_ptr<Shared>(new Shared(base, head[1], head[2], slot));
  }

  SlotHeader& me() {
    return *reinterpret_cast<SlotHeader*>(base_ + kHeaderBytes +
                                          slot_ * sizeof(SlotHeader));
  }
  void Phase(Phase p) { me().phase.store(p, std::memory_order_relaxed); }
  void Count(std::atomic<uint64_t> SlotHeader::*field, uint64_t n = 1) {
    (me().*field).fetch_add(n, std::memory_order_relaxed);
  }

  // Publishes a kPending record for `page`; returns it for the outcome
  // (nullptr for a page outside the table).
  CommitRecord* Publish(uint64_t page, const Stamp& s, uint64_t start_ns) {
    PageRecords* t = table(page);
    if (t == nullptr) return nullptr;
    const uint64_t n = t->next.fetch_add(1, std::memory_order_relaxed);
    CommitRecord* r = &t->records[n % kRecordsPerPage];
    const uint64_t seq = r->seq.load(std::memory_order_relaxed);
    r->seq.store((seq | 1) + 2, std::memory_order_relaxed);  // odd: writing
    std::atomic_thread_fence(std::memory_order_release);
    r->page.store(page, std::memory_order_relaxed);
    r->key_hi.store(s.key.hi, std::memory_order_relaxed);
    r->key_lo.store(s.key.lo, std::memory_order_relaxed);
    r->owner.store(s.owner, std::memory_order_relaxed);
    r->generation.store(s.generation, std::memory_order_relaxed);
    r->start_ns.store(start_ns, std::memory_order_relaxed);
    r->state.store(kPending, std::memory_order_relaxed);
    r->seq.store((seq | 1) + 3, std::memory_order_release);  // even: done
    return r;
  }

  // Whether `page` has had more records than its table keeps.
  bool Wrapped(uint64_t page) const {
    const PageRecords* t = table(page);
    return t != nullptr &&
           t->next.load(std::memory_order_acquire) > kRecordsPerPage;
  }

  // True when a record that is not kFailed says `s` was committed (or is
  // being committed) as s.key into s.page.
  bool Recorded(const Stamp& s) const {
    const PageRecords* t = table(s.page);
    if (t == nullptr) return false;
    for (const CommitRecord& rec : t->records) {
      Record r;
      if (Read(rec, &r) && r.live() && r.stamp.page == s.page &&
          r.stamp.key == s.key && r.stamp.owner == s.owner &&
          r.stamp.generation == s.generation) {
        return true;
      }
    }
    return false;
  }

  // The committer of `key` in `page`: the newest record for it that is not
  // kFailed. False when no record names one.
  bool Committer(uint64_t page, const BlockKey& key, Stamp* out,
                 uint32_t* out_state = nullptr) const {
    const PageRecords* t = table(page);
    if (t == nullptr) return false;
    bool found = false;
    uint64_t best = 0;
    for (const CommitRecord& rec : t->records) {
      Record r;
      if (!Read(rec, &r) || !r.live() || r.stamp.page != page ||
          r.stamp.key != key) {
        continue;
      }
      if (!found || r.start_ns > best) {
        found = true;
        best = r.start_ns;
        *out = r.stamp;
        if (out_state != nullptr) *out_state = r.state;
      }
    }
    return found;
  }

 private:
  Shared(void* base, uint32_t slots, uint32_t pages, uint64_t slot)
      : base_(static_cast<char*>(base)), slots_(slots), pages_(pages), slot_(slot) {}
  // A consistent copy of one record.
  struct Record {
    Stamp stamp;
    uint64_t start_ns = 0;
    uint32_t state = kEmpty;
    bool live() const { return state != kFailed && state != kEmpty; }
  };
  // Copies `rec` into *out; false when it is empty, being written, or was
  // rewritten during the copy (its sequence word changed).
  static bool Read(const CommitRecord& rec, Record* out) {
    const uint64_t seq = rec.seq.load(std::memory_order_acquire);
    if (seq == 0 || (seq & 1)) return false;
    out->stamp = Stamp{BlockKey{rec.key_hi.load(std::memory_order_relaxed),
                                rec.key_lo.load(std::memory_order_relaxed)},
                       rec.owner.load(std::memory_order_relaxed),
                       rec.generation.load(std::memory_order_relaxed),
                       rec.page.load(std::memory_order_relaxed)};
    out->start_ns = rec.start_ns.load(std::memory_order_relaxed);
    out->state = rec.state.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    return rec.seq.load(std::memory_order_relaxed) == seq;
  }
  PageRecords* table(uint64_t page) const {
    if (page >= pages_) return nullptr;
    return reinterpret_cast<PageRecords*>(base_ + TableOffset(slots_)) + page;
  }

  char* base_;
  uint32_t slots_, pages_;
  uint64_t slot_;
};

// True when a failed Commit certainly changed nothing: the daemon answered
// with a refusal, or the client refused before sending. Any other error
// (deadline passed, connection lost, cancelled) may have come after the
// daemon applied it.
bool CommitWasRefused(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnauthenticated:
      return true;
    default:
      return false;
  }
}

// --- The worker ---

class Worker {
 public:
  Worker(const Args& args, Shared* shared, Client* client)
      : a_(args), shared_(shared), client_(client), rng_(args.seed) {}

  // Prompt p: its system prompt's blocks, then its own.
  std::vector<uint32_t> Prompt(uint64_t p) const {
    const uint64_t system = p / a_.users;
    std::vector<uint32_t> t;
    for (uint64_t i = 0; i < a_.system_blocks * kPageSize; ++i) {
      t.push_back(uint32_t(1 + system * 100000 + i));
    }
    for (uint64_t i = 0; i < a_.user_blocks * kPageSize; ++i) {
      t.push_back(uint32_t(10000000 + p * 1000 + i));
    }
    return t;
  }
  uint64_t prompts() const { return a_.systems * a_.users; }

  // One Acquire and what follows it. False when the Acquire failed.
  bool Step(uint64_t p, bool write) {
    const std::vector<uint32_t> tokens = Prompt(p);
    const std::vector<BlockKey> keys = client_->ComputeKeys(tokens);
    const uint64_t generation = ++generation_;
    const uint64_t t0 = NowNs();
    shared_->Phase(kAcquire);
    shared_->Count(&SlotHeader::ops);
    AcquireOptions opts;
    opts.allocate = write;
    absl::StatusOr<Lease> lease = client_->Acquire(tokens, opts);
    if (!lease.ok()) {
      shared_->Count(&SlotHeader::acquire_errors);
      shared_->Phase(kIdle);
      return false;
    }
    if (lease->degraded()) {
      shared_->Count(&SlotHeader::degraded);
      shared_->Phase(kIdle);
      ::usleep(2000);
      return true;
    }
    // Page addresses are taken once, as a worker hands them to its kernels
    // when the lease arrives; the kernels then run however long they take.
    std::vector<void*> addrs;
    for (size_t i = 0; i < lease->pages().size(); ++i) {
      addrs.push_back(lease->page_address(i));
      if (addrs.back() == nullptr) {
        shared_->Count(&SlotHeader::acquire_errors);
        shared_->Phase(kIdle);
        return false;
      }
    }
    shared_->Phase(kVerify);
    Verify(*lease, addrs, keys, t0);
    if (write && lease->new_blocks() > 0) {
      Write(*lease, addrs, keys, generation);
    } else if (lease->held()) {
      shared_->Phase(kRelease);
      (void)lease->Release();
    }
    shared_->Phase(kIdle);
    return true;
  }

  int Run() {
    std::uniform_int_distribution<uint64_t> pick(0, prompts() - 1);
    if (a_.role == "verify") {
      for (uint64_t p = 0; p < prompts(); ++p) Step(p, false);
      return 0;
    }
    const bool write = a_.role == "writer";
    while (true) {
      Step(pick(rng_), write);
      if (a_.think_us > 0) ::usleep(a_.think_us);
    }
  }

 private:
  void Verify(const Lease& lease, const std::vector<void*>& addrs,
              const std::vector<BlockKey>& keys, uint64_t t0) {
    const size_t cells = client_->pool()->page_bytes() / sizeof(Cell);
    shared_->Count(&SlotHeader::promoted, lease.promoted_blocks());
    for (uint32_t i = 0; i < lease.matched_blocks() && i < keys.size(); ++i) {
      const uint64_t page = lease.pages()[i];
      Stamp stamp, other, committer;
      uint32_t committer_state = kEmpty;
      const bool intact = ReadStamp(addrs[i], cells, &stamp, &other);
      // Without tiers no page's bytes move; with them a promoted block
      // keeps the page it was written into, and that page's records name
      // its committer.
      const bool moved = intact && stamp.page != page;
      const bool key_ok = intact && stamp.key == keys[i] && (a_.tiers || !moved);
      bool owner_ok = true;
      bool known =
          key_ok && shared_->Committer(stamp.page, keys[i], &committer,
                                       &committer_state);
      if (known) {
        owner_ok = committer.owner == stamp.owner &&
                   committer.generation == stamp.generation;
        // With tiers the newest record is not always the bytes' committer:
        // a worker may write a block again while a tier holds it (behind
        // a block no tier has), and the tier's copy is served again if
        // that write is never committed. Any recorded commit of these
        // bytes will do, and a page whose table has wrapped may have lost
        // that record: unknown. Torn pages and other blocks' bytes still
        // fail.
        if (!owner_ok && a_.tiers) {
          if (shared_->Recorded(stamp)) {
            owner_ok = true;
            shared_->Count(&SlotHeader::older_copy);
          } else if (shared_->Wrapped(stamp.page)) {
            owner_ok = true;
            known = false;
          }
        }
      }
      // A lease held longer than the TTL may have expired: what it reads
      // then is not the daemon's promise any more.
      const bool late = NowNs() - t0 >= a_.lease_ttl_ms * 1000000;
      shared_->Count(&SlotHeader::hits_verified);
      if (moved) shared_->Count(&SlotHeader::moved_verified);
      if (key_ok && owner_ok) {
        if (!known) shared_->Count(&SlotHeader::committer_unknown);
        continue;
      }
      if (late) {
        shared_->Count(&SlotHeader::late_mismatch);
      } else if (!key_ok) {
        shared_->Count(&SlotHeader::stale_key);
      } else {
        shared_->Count(&SlotHeader::foreign_owner);
      }
      const char* what = !intact                    ? "torn page"
                         : stamp.key != keys[i]     ? "another block's stamp"
                         : !key_ok                  ? "moved without a tier"
                                                    : "not its committer's stamp";
      std::fprintf(
          stderr,
          "soak_worker[%" PRIu64 "]: page %" PRIu64 " block %u: %s (stamp "
          "owner %" PRIu64 " gen %" PRIu64 " written into page %" PRIu64
          "; %s owner %" PRIu64 " gen %" PRIu64 " page %" PRIu64 "%s%s)\n",
          a_.owner, page, i, what, stamp.owner, stamp.generation, stamp.page,
          !intact ? "a later cell" : "committer",
          !intact ? other.owner : committer.owner,
          !intact ? other.generation : committer.generation,
          !intact ? other.page : committer.page,
          committer_state == kPending ? " (pending)" : "",
          late ? "; the reader's lease had expired" : "");
    }
  }

  void Write(Lease& lease, const std::vector<void*>& addrs,
             const std::vector<BlockKey>& keys, uint64_t generation) {
    const size_t cells = client_->pool()->page_bytes() / sizeof(Cell);
    const uint32_t m = lease.matched_blocks(), n = lease.new_blocks();
    shared_->Phase(kWrite);
    for (uint64_t c = 0; c < a_.write_chunks; ++c) {
      const size_t begin = cells * c / a_.write_chunks;
      const size_t end = cells * (c + 1) / a_.write_chunks;
      for (uint32_t j = 0; j < n; ++j) {
        WriteCells(addrs[m + j],
                   Stamp{keys[m + j], a_.owner, generation, lease.pages()[m + j]},
                   begin, end);
      }
      if (a_.write_pause_us > 0) ::usleep(a_.write_pause_us);
    }
    shared_->Count(&SlotHeader::pages_written, n);
    shared_->Phase(kCommit);
    const uint64_t start = NowNs();
    std::vector<CommitRecord*> records;
    for (uint32_t j = 0; j < n; ++j) {
      records.push_back(shared_->Publish(
          lease.pages()[m + j],
          Stamp{keys[m + j], a_.owner, generation, lease.pages()[m + j]},
          start));
    }
    std::vector<uint64_t> mine(lease.pages().begin() + m, lease.pages().end());
    absl::StatusOr<v1::CommitResponse> r = lease.Commit(n, /*release=*/true);
    if (!r.ok()) {
      const bool refused = CommitWasRefused(r.status());
      shared_->Count(refused ? &SlotHeader::commits_failed
                             : &SlotHeader::commits_unknown);
      if (!refused) {
        std::fprintf(stderr,
                     "soak_worker[%" PRIu64 "]: gen %" PRIu64
                     ": Commit outcome unknown, records stay pending: %s\n",
                     a_.owner, generation, r.status().ToString().c_str());
      }
      for (CommitRecord* rec : records) {
        if (rec != nullptr && refused) rec->state.store(kFailed);
      }
      return;
    }
    shared_->Count(&SlotHeader::commits_ok);
    shared_->Count(&SlotHeader::inserted, r->inserted());
    shared_->Count(&SlotHeader::deduplicated, r->deduplicated());
    // Collided blocks (a key already cached under other tokens or another
    // parent, and every block after it) are a suffix of the commit; they
    // answer with this lease's own page but are not cached.
    const uint32_t cached_upto = n - std::min<uint32_t>(n, r->collided());
    for (uint32_t j = 0; j < n; ++j) {
      const bool inserted = j < cached_upto && int(j) < r->pages_size() &&
                            r->pages(j) == mine[j];
      if (records[j] != nullptr) {
        records[j]->state.store(inserted ? kCommitted : kFailed);
      }
    }
  }

  const Args a_;
  Shared* shared_;
  Client* client_;
  std::mt19937_64 rng_;
  uint64_t generation_ = 0;
};

int Main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: soak_worker --socket=PATH --shared=FILE --slot=N "
                 "--owner=ID --role=writer|reader|verify [--seed=S ...]\n");
    return 2;
  }
  std::unique_ptr<Shared> shared = Shared::Open(args.shared, args.slot);
  if (shared == nullptr) {
    std::fprintf(stderr, "soak_worker: cannot map %s slot %" PRIu64 "\n",
                 args.shared.c_str(), args.slot);
    return 1;
  }
  shared->me().pid.store(uint32_t(::getpid()));
  shared->me().owner.store(args.owner);
  shared->Phase(kStarting);
  ClientOptions opts;
  opts.endpoint = args.socket;
  opts.ns = SoakNamespace();
  opts.client_name = "soak-" + args.role;
  opts.attach_pool = true;
  opts.initial_wait = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(opts);
  if (!client.ok() || !(*client)->WaitForSession(absl::Seconds(10)).ok() ||
      (*client)->pool() == nullptr) {
    std::fprintf(stderr, "soak_worker: no session: %s\n",
                 client.ok() ? (*client)->state().last_error.ToString().c_str()
                             : client.status().ToString().c_str());
    return 1;
  }
  shared->Phase(kIdle);
  Worker worker(args, shared.get(), client->get());
  return worker.Run();
}

}  // namespace
}  // namespace radixkv::soak

int main(int argc, char** argv) { return radixkv::soak::Main(argc, argv); }
