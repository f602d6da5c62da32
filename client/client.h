// File: client/client.h
//
// radixkv::Client: the library an inference worker links to use radixkvd's
// prefix cache. One Client is one worker's session in one namespace.
//
//   radixkv::ClientOptions options;
//   options.ns = my_namespace_spec;          // model, layout, page_size ...
//   options.client_name = "worker-0";
//   options.attach_pool = true;              // map the daemon's page pool
//   std::unique_ptr<radixkv::Client> client = *radixkv::Client::Create(options);
//
//   absl::StatusOr<radixkv::Lease> lease = client->Acquire(prompt_tokens);
//   if (!lease.ok()) return lease.status();  // only for malformed input
//   // lease->matched_tokens() tokens are cached in lease->pages()[0 ..
//   // matched_blocks()); prefill the rest, write the K/V of the next
//   // new_blocks() full blocks into new_pages(), then:
//   lease->Commit(lease->new_blocks(), /*release=*/true);
//
// Failure behaviour (what a worker can rely on)
// ---------------------------------------------
// * Create never fails because the daemon is down; only invalid options are
//   errors. A background thread keeps the Session stream open, sends
//   heartbeats, and when the stream ends (daemon restart, crash, hang
//   detected by missing heartbeat acks) marks the client disconnected and
//   re-opens the session with exponential backoff and jitter, re-attaching
//   the pool.
// * While no session is open, or when a call fails because the daemon is
//   unreachable or misses its deadline, Acquire returns quickly with an empty
//   *degraded* Lease: no match, no pages. The worker then prefills
//   everything; the cache never turns into a user-visible error. Acquire
//   returns an error only for input the daemon would reject anyway
//   (INVALID_ARGUMENT, FAILED_PRECONDITION).
// * Every RPC carries a deadline (call_timeout; release_timeout for the
//   best-effort release of a dropped Lease).
// * A Lease dropped while held is ended without a call of its own: its id
//   rides on the next Acquire (release_leases) or, after release_delay, the
//   session thread releases it.
// * A daemon restart loses the cache and every lease; a Lease from before the
//   restart answers Commit with UNAVAILABLE and Release with OK (the daemon
//   already dropped it). It hands out no page address any more (its mapping
//   stays alive, so a pointer taken before faults nothing).
// * Fail closed: a Lease hands out page addresses only while it is live:
//   held, its session open, and before its expiry less a safety margin
//   (Lease::time_left). A reader calls ConfirmRead after its reads finished
//   and treats the prompt as a miss unless that is OK. An Acquire answer
//   that arrives already past that point is a miss (a degraded Lease).
// * Lost sessions are acknowledged: once a session has ended without the
//   client closing it, its Leases refuse page access, and the next session
//   open lists its id in OpenSession.acknowledge_sessions (at most 64, the
//   oldest dropped), so the daemon may reuse the pages it fenced.
//
// Thread safety: Client is thread-safe; every public method may be called
// from any thread concurrently. A Lease is a single-owner value: do not use
// one Lease from two threads at once (different Leases are independent).
// Ownership: a Lease shares ownership of the client's internal connection
// state, so it may outlive the Client (its release then becomes a no-op).
#ifndef RADIXKV_CLIENT_CLIENT_H_
#define RADIXKV_CLIENT_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "radix/block_key.h"
#include "radixkv/namespace_spec.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv {

namespace gpu {
class MappedPool;  // gpu/mapped_pool.h
}  // namespace gpu

namespace client_internal {
class Core;
struct SessionLife;
struct SessionSnapshot;
}  // namespace client_internal

// OpenSession.acknowledge_sessions holds at most this many ids.
inline constexpr size_t kMaxAcknowledgeSessions = 64;

// Options of a Client. Every field has a working default except `ns`, whose
// layout (num_layers, num_kv_heads, head_dim, page_size, dtype) the worker
// must fill in.
struct ClientOptions {
  // Where radixkvd listens: "unix:/path", "/path" (a Unix socket) or
  // "host:port" (TCP). Empty: the daemon's default socket
  // (radixkv::DefaultSocketPath()).
  std::string endpoint;
  // Deadline of each unary call (Acquire, Commit, Release, Match).
  absl::Duration call_timeout = absl::Seconds(2);
  // How long one attempt to open the session (and attach the pool) may take.
  absl::Duration connect_timeout = absl::Seconds(2);
  // How long Create waits for the first session before returning a client
  // that is still connecting (degraded until then). Zero: do not wait.
  absl::Duration initial_wait = absl::Seconds(2);
  // Reconnect backoff: the first retry waits `reconnect_initial_backoff`,
  // each failure doubles it up to `reconnect_max_backoff`; every wait is
  // scaled by a random factor in [1 - jitter, 1 + jitter]. An attempt waits
  // up to connect_timeout for the connection (the channel's own connection
  // retries during it are at most min(reconnect_max_backoff, 1 s) apart), so
  // a session is open again at most reconnect_max_backoff * (1 + jitter)
  // after the daemon accepts connections, plus the open itself.
  absl::Duration reconnect_initial_backoff = absl::Milliseconds(100);
  absl::Duration reconnect_max_backoff = absl::Seconds(5);
  double reconnect_jitter = 0.2;
  // Heartbeat period on the session stream. A session with no heartbeat ack
  // for 3 periods is considered dead and re-opened.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // Deadline of a best-effort Release (a dropped Lease).
  absl::Duration release_timeout = absl::Milliseconds(500);
  // How a Lease that is dropped while still held (its destructor or a move
  // onto it) ends. Positive: the lease id is queued and rides on this
  // client's next Acquire (AcquireRequest.release_leases: one RPC per cached
  // request instead of two); ids still queued after release_delay are sent
  // as Release calls by the session thread, so the daemon hears of every
  // dropped lease within about release_delay while the session is open (the
  // pages stay pinned until then). Zero: the destructor sends the Release
  // itself and waits for it (up to release_timeout). Commit(release) and
  // Release() are never deferred.
  absl::Duration release_delay = absl::Milliseconds(5);
  // The namespace this worker's blocks live in.
  NamespaceSpec ns;
  // Shown by `radixkvctl sessions`.
  std::string client_name;
  // Device ordinal the worker runs on (informational for host pools).
  int device = 0;
  // Map the daemon's page pool through the attach socket after each session
  // open. With attach_pool, the client counts as connected only once the
  // pool is mapped (or the daemon's pool is "none").
  bool attach_pool = false;
  // Wire form of prompts and pages. false (default): tokens go as
  // `tokens_le` (raw little-endian u32, read in place by the daemon), keys
  // as `block_keys_packed`, and Acquire asks for its pages as `pages_le`.
  // true: `repeated uint32 tokens` / `repeated bytes block_keys` and
  // `repeated uint64 pages`, for a radixkvd that predates the packed fields.
  // Keys, matches and pages are the same either way.
  bool legacy_prompt_fields = false;
};

// The gRPC target for an endpoint as accepted by ClientOptions::endpoint and
// radixkvctl --endpoint. INVALID_ARGUMENT names the field for an endpoint that
// is neither a path, a "unix:" URI, another gRPC URI scheme nor host:port.
absl::StatusOr<std::string> GrpcTargetForEndpoint(absl::string_view endpoint);

// Checks what the daemon would check about a namespace's layout: the layout
// fields are nonzero, dtype is known, tp_rank < tp_size. INVALID_ARGUMENT
// names the field.
absl::Status ValidateNamespaceSpec(const NamespaceSpec& spec);

// A pin on the cached prefix of one prompt plus pages allocated for the next
// blocks; the result of Client::Acquire. Move-only. The destructor ends a
// lease that is still held, best effort (errors ignored, never throws, does
// not block with the default ClientOptions::release_delay: the release rides
// on the next Acquire or follows within release_delay; a lease of a lost
// session is left to the next open's acknowledgement; one that outlives its
// Client sends its Release). A default-constructed or degraded Lease holds
// nothing.
//
// Not thread-safe: one owner at a time.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  // True when this lease came back empty because the daemon was unreachable
  // (or no session was open): no match, no pages; prefill everything.
  bool degraded() const { return degraded_; }
  // True while the daemon holds pages for this lease (until Commit with
  // release, Release, or the end of the session).
  bool held() const { return lease_id_ != 0; }
  uint64_t id() const { return lease_id_; }

  // Full blocks in the prompt (also filled in for a degraded lease).
  uint32_t total_blocks() const { return total_blocks_; }
  // Leading blocks found in the cache, and their token count.
  uint32_t matched_blocks() const { return matched_blocks_; }
  uint64_t matched_tokens() const { return matched_tokens_; }
  // Of matched_blocks(), those the daemon copied up from a tier below its
  // pool (--tier) for this lease; they read like any other matched block.
  uint32_t promoted_blocks() const { return promoted_blocks_; }
  // Pages allocated for blocks matched_blocks() .. matched_blocks() +
  // new_blocks() - 1; fewer than asked when the pool is pinned full.
  uint32_t new_blocks() const { return new_blocks_; }
  // matched_blocks() cached pages in block order, then new_blocks() new ones.
  absl::Span<const uint64_t> pages() const { return pages_; }
  absl::Span<const uint64_t> matched_pages() const {
    return absl::MakeConstSpan(pages_).subspan(0, matched_blocks_);
  }
  absl::Span<const uint64_t> new_pages() const {
    return absl::MakeConstSpan(pages_).subspan(matched_blocks_);
  }
  // New pages not yet committed by this lease.
  uint32_t uncommitted_blocks() const { return new_blocks_ - committed_blocks_; }

  // The worker-side address of pages()[i] in the mapped pool: a CPU pointer
  // for a host pool, a device pointer for a cuda pool. nullptr when no pool
  // is mapped (attach_pool off, "none" pool, degraded), i is out of range,
  // or the lease is not live(): ended, its session lost, or expired. A
  // worker must not write a page after time_left() has run out, and must
  // check ConfirmRead() after reading cached pages. The address of a new
  // page may be written until this lease's next Commit or Release (or its
  // end), not after: until then, if the session is lost meanwhile, the
  // client holds back its acknowledgement, so the daemon does not reuse the
  // page while the write runs.
  void* page_address(size_t i) const;

  // Held, its session still open, and before its expiry less the safety
  // margin min(1 s, lease TTL / 10): the daemon still pins every page.
  bool live() const;
  // How long page access remains allowed (zero when not live()). The
  // expiry is the earlier of the daemon's AcquireResponse deadline and the
  // session's lease TTL counted from when the Acquire was sent, on the
  // monotonic clock.
  absl::Duration time_left() const;
  // Call after reads of this lease's pages have finished (kernels done):
  // OK when the lease was live at that point, so what was read is the
  // cached K/V. Otherwise discard what was read and treat the prompt as a
  // miss: DEADLINE_EXCEEDED (expired), UNAVAILABLE (session lost),
  // FAILED_PRECONDITION (degraded, or ended by Commit with release or
  // Release).
  absl::Status ConfirmRead() const;

  // Commits the next `blocks` uncommitted new pages, in block order, as the
  // blocks after the matched prefix; with release, also ends the lease.
  // REQUIRES: the K/V of those blocks has been written (kernels finished).
  // Errors: FAILED_PRECONDITION when the lease is not held or `blocks`
  // exceeds uncommitted_blocks() (nothing sent); UNAVAILABLE when the session
  // the lease belongs to has ended (daemon restart; the lease then ends
  // with a Release call instead); the daemon's error
  // otherwise. A NOT_FOUND answer (the lease expired or ended) ends the
  // lease here too: it refuses page access from then on. An expired lease
  // still sends its Commit: the daemon caches nothing for it, and the call
  // tells the daemon the lease's pages will not be written again.
  absl::StatusOr<v1::CommitResponse> Commit(uint32_t blocks, bool release);

  // Ends the lease without committing more, now (one Release call; not
  // deferred). OK when not held (idempotent) or when the session already
  // ended; the call goes out then too, telling a daemon that fenced the
  // lease's pages with the session that they will not be written again.
  absl::Status Release();

 private:
  friend class Client;

  void ReleaseBestEffort();
  // Ends this lease's write hold (SessionLife::writers), if it has one.
  void EndWrites() const;

  std::shared_ptr<client_internal::Core> core_;
  std::shared_ptr<gpu::MappedPool> pool_;
  // The session's shared end flag; null for a degraded lease.
  std::shared_ptr<const client_internal::SessionLife> life_;
  // Page access ends here (expiry less the safety margin).
  std::chrono::steady_clock::time_point usable_until_ =
      std::chrono::steady_clock::time_point::max();
  std::string session_id_;
  uint64_t session_generation_ = 0;
  uint64_t lease_id_ = 0;
  bool degraded_ = false;
  uint32_t total_blocks_ = 0;
  uint32_t matched_blocks_ = 0;
  uint64_t matched_tokens_ = 0;
  uint32_t promoted_blocks_ = 0;
  uint32_t new_blocks_ = 0;
  uint32_t committed_blocks_ = 0;
  std::vector<uint64_t> pages_;
  // page_address handed out a new page since the last Commit or Release:
  // this lease is counted in life_->writers.
  mutable bool writing_ = false;
};

struct AcquireOptions {
  // Allocate pages for the unmatched full blocks after the cached prefix.
  bool allocate = true;
  // With allocate: at most this many new pages (0: one per unmatched block).
  uint32_t max_new_blocks = 0;
};

// Connection state, for health reporting and tests.
struct ClientState {
  bool connected = false;  // a session is open (and the pool mapped, if asked)
  std::string session_id;
  uint64_t generation = 0;  // increments with every session (re-)open
  uint64_t reconnects = 0;  // sessions opened after the first
  v1::PoolInfo pool;        // from the current/last SessionInfo
  absl::Status last_error;  // why the last open attempt or stream failed
  // Ended sessions the next OpenSession acknowledges, oldest first.
  std::vector<std::string> unacknowledged_sessions;
};

class Client {
 public:
  using Options = ClientOptions;

  // Validates `options` (endpoint syntax, namespace layout) and starts the
  // session thread; waits up to options.initial_wait for the first session.
  // Does not fail when the daemon is down: the client starts degraded and
  // keeps trying. INVALID_ARGUMENT names the bad option; FAILED_PRECONDITION
  // when attach_pool is set but this build has no pool attach support.
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options);

  // Releases every lease of the session still held or queued (Leases that
  // outlive the Client hand out no page address any more), closes the
  // session and stops the thread.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Pins the longest cached prefix of `tokens` and (allocate) takes pages
  // for the following full blocks. Degrades to an empty Lease (degraded() ==
  // true) when no session is open or the daemon is unreachable/late; errors
  // only for input the daemon rejects (INVALID_ARGUMENT, e.g. too many
  // tokens; FAILED_PRECONDITION).
  absl::StatusOr<Lease> Acquire(absl::Span<const uint32_t> tokens,
                                const AcquireOptions& options = {});
  // Key mode: one 16-byte key per full block, computed by the worker (see
  // ComputeKeys); hits cannot be verified against tokens. The daemon must
  // run with --allow_key_mode.
  absl::StatusOr<Lease> AcquireKeys(absl::Span<const BlockKey> keys,
                                    const AcquireOptions& options = {});

  // Read-only lookup of the longest cached prefix in this client's
  // namespace; needs no session. Unlike Acquire this returns the error
  // (UNAVAILABLE, DEADLINE_EXCEEDED...) when the daemon does not answer.
  absl::StatusOr<v1::MatchResponse> Match(absl::Span<const uint32_t> tokens);
  absl::StatusOr<v1::MatchResponse> MatchKeys(absl::Span<const BlockKey> keys);

  // Block keys of the contract (radix/block_key.h) for this namespace.
  const BlockKey& namespace_root() const { return root_; }
  std::vector<BlockKey> ComputeKeys(absl::Span<const uint32_t> tokens) const;
  BlockHasher NewHasher() const { return BlockHasher(root_, options_.ns.page_size); }

  // The mapped pool of the current session, or nullptr (not attached, not
  // connected, "none" pool). Shared so that it stays mapped while in use
  // even across a reconnect.
  std::shared_ptr<gpu::MappedPool> pool() const;

  bool connected() const;
  ClientState state() const;
  // Blocks until a session is open (OK) or `timeout` passes
  // (DEADLINE_EXCEEDED with the last connection error).
  absl::Status WaitForSession(absl::Duration timeout) const;

  const ClientOptions& options() const { return options_; }

 private:
  Client(const ClientOptions& options, BlockKey root,
         std::shared_ptr<client_internal::Core> core);

  absl::StatusOr<Lease> AcquireImpl(v1::AcquireRequest request,
                                    uint32_t total_blocks);
  // The Lease an Acquire answered (sent at `sent`, in `session`): its
  // pages and expiry; a miss when it arrived too late to use.
  absl::StatusOr<Lease> LeaseFromResponse(
      const v1::AcquireResponse& resp, client_internal::SessionSnapshot session,
      std::chrono::steady_clock::time_point sent, Lease lease);

  const ClientOptions options_;
  const BlockKey root_;
  std::shared_ptr<client_internal::Core> core_;
};

}  // namespace radixkv

#endif  // RADIXKV_CLIENT_CLIENT_H_
