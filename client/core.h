// File: client/core.h
//
// client_internal::Core: the connection state behind a radixkv::Client and
// its Leases (internal; not installed for consumers to call).
//
// It owns the gRPC channel and stubs and one background thread that keeps the
// KvCache.Session stream open:
//
//   connect: start the stream, send `open`, wait up to connect_timeout for
//            the SessionInfo; with attach_pool, map the pool (AttachPool)
//   serve:   publish the session (connected, new generation), send a
//            heartbeat every heartbeat_interval, send Release for dropped
//            leases that no Acquire carried within release_delay, and watch
//            for the stream's end or 3 missed heartbeat acks; when the
//            client closes, mark the session ended and release every lease
//            still held or queued before the stream ends (a daemon fences
//            the pages of leases a session ends with)
//   end:     unpublish (disconnected), mark the session ended (its leases
//            refuse page access), queue its id for acknowledgement, cancel
//            the stream, wait with exponential backoff + jitter, connect
//            again; the next `open` lists the queued ids in
//            acknowledge_sessions and a SessionInfo reply clears them. An
//            id whose leases still have writes running (SessionLife) waits,
//            and goes out with a later heartbeat once they have finished;
//            the heartbeat's ack clears it
//
// Connecting: the Session call waits for the channel (wait_for_ready) up to
// connect_timeout, and the channel's connection backoff is reset before each
// attempt, so gRPC's own backoff never adds to the session backoff.
//
// Each stream uses two threads: the session thread (waits, heartbeats) and a
// reader thread that starts the call, writes `open` and reads responses, so
// no blocking gRPC operation ever stops the session thread from enforcing
// connect_timeout or shutting down (it cancels the call instead).
//
// Thread safety: thread-safe. mu_ guards all mutable state; no lock is held
// across an RPC or an attach.
#ifndef RADIXKV_CLIENT_CORE_H_
#define RADIXKV_CLIENT_CORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "grpcpp/channel.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::client_internal {

// Shared by a session and its Leases: whether the session has ended (its
// stream ended, the daemon no longer knows it, or the client closed). Set
// once, before the session's id is queued for acknowledgement; Leases read
// it on every page access.
//
// Writes against acknowledgement. A Lease that hands out the address of a
// new page (to be written) counts itself in `writers` until its next Commit
// or Release (or its end), and checks `ended` after counting itself; the
// session's end sets `ended` and the session's id is acknowledged to the
// daemon only while `writers` is 0 after that. Both sides use sequentially
// consistent operations, so either the writer sees the end and writes
// nothing, or the end sees the writer and waits: no write of an
// acknowledged session can still be running when the daemon reuses its
// fenced pages.
struct SessionLife {
  std::atomic<bool> ended{false};
  mutable std::atomic<int> writers{0};
};

// A consistent view of the current session, taken under the lock.
struct SessionSnapshot {
  bool usable = false;  // open (and pool mapped when attach_pool is set)
  std::string session_id;
  uint64_t generation = 0;
  std::shared_ptr<gpu::MappedPool> pool;
  std::shared_ptr<const SessionLife> life;  // null when not usable
  // SessionInfo.lease_ttl_ms; zero when the daemon did not say.
  absl::Duration lease_ttl;
};

class Core {
 public:
  // `target` is a gRPC target (GrpcTargetForEndpoint). Does not connect yet.
  Core(const ClientOptions& options, const std::string& target);
  // Stops the session thread (closing the session) if still running.
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Starts the session thread. Call once.
  void Start();
  // Closes the session and joins the thread; idempotent.
  void Stop();

  v1::KvCache::Stub* stub() const { return stub_.get(); }
  const ClientOptions& options() const { return options_; }

  SessionSnapshot Current() const;
  // Whether the session `generation` is still the open one.
  bool IsCurrent(uint64_t generation) const;
  // Whether Stop() was called (the client is closed or closing).
  bool Stopped() const;
  // The daemon no longer knows session `generation` (NOT_FOUND): mark it
  // ended and drop the stream so that the session thread re-opens it. No-op
  // for an old generation.
  void ReportSessionLost(uint64_t generation);

  ClientState State() const;
  absl::Status WaitForSession(absl::Duration timeout) const;

  // The held leases of session `generation` (ended when the client closes).
  // No-ops for a session that is no longer the open one.
  void TrackLease(uint64_t generation, uint64_t lease_id);
  void UntrackLease(uint64_t generation, uint64_t lease_id);

  // Deferred releases (ClientOptions::release_delay).
  // Queues lease `lease_id` of session `generation`; dropped when that
  // session is no longer the open one (the daemon ended its leases).
  void DeferRelease(uint64_t generation, uint64_t lease_id);
  // Takes up to `max` queued ids of session `generation`, oldest first, for
  // an Acquire to carry in release_leases.
  std::vector<uint64_t> TakeDeferred(uint64_t generation, size_t max);
  // Puts back ids an Acquire took but the daemon did not release. With
  // release_now the session thread sends them as Release calls at once.
  void RequeueDeferred(uint64_t generation, const std::vector<uint64_t>& ids,
                       bool release_now);

 private:
  using Stream = grpc::ClientReaderWriter<v1::SessionRequest,
                                          v1::SessionResponse>;

  // What the serving session thread does after one wait (AwaitServeTick).
  struct ServeTick {
    absl::Status stop;  // not OK: end the session for this reason
    bool ended = false;  // the stream ended
    bool heartbeat_due = false;
    std::vector<uint64_t> releases;  // lease ids to send Release for first
  };

  void Loop();
  // One stream's life: connect, serve, end. Returns why it ended.
  absl::Status RunSession() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes `ctx` the live stream's context, resets the per-stream state and
  // builds the `open` request; false (nothing changed) when stopping.
  bool BeginStream(grpc::ClientContext* ctx, v1::SessionRequest* open)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the stream of `ctx`: ends the published session, cancels the call,
  // joins `reader` and returns the server's final status when it says more
  // than the cancellation, else `why`.
  absl::Status EndStream(grpc::ClientContext& ctx, std::thread& reader,
                         Stream& stream, absl::Status why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to connect_timeout for the SessionInfo; the error says why
  // none came (closing, stream ended, deadline).
  absl::StatusOr<v1::SessionInfo> AwaitOpen() ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the ended sessions `open` acknowledged (the daemon has them) and
  // resets the heartbeat acknowledgement count of the new stream.
  void ForgetAcknowledged(const v1::SessionRequest& open)
      ABSL_LOCKS_EXCLUDED(mu_);
  // With attach_pool and a pool that can be attached, maps it; else null.
  absl::StatusOr<std::shared_ptr<gpu::MappedPool>> MapPool(
      const v1::SessionInfo& info);
  // Publishes the opened session (a new generation, connected) with `pool`.
  void Publish(const v1::SessionInfo& info,
               std::shared_ptr<gpu::MappedPool> pool) ABSL_LOCKS_EXCLUDED(mu_);
  // Serves the published session until the stream ends, acks stop or the
  // client closes (releasing every lease first); returns why it stopped.
  absl::Status Serve(Stream* stream, const std::string& session_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps until `next_heartbeat`, a due release or a wake-up, and says
  // what to do next.
  ServeTick AwaitServeTick(absl::Time next_heartbeat) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes heartbeat `nonce` with the ready acknowledgements; false when the
  // stream is gone.
  bool SendHeartbeat(Stream* stream, uint64_t nonce) ABSL_LOCKS_EXCLUDED(mu_);
  // The `open` request, acknowledging the queued lost sessions.
  v1::SessionRequest OpenRequest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the published session (under mu_): unpublishes it, marks its
  // leases' SessionLife ended and, unless the client is closing, queues its
  // id for acknowledgement (the oldest dropped beyond
  // kMaxAcknowledgeSessions).
  void EndPublishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the ended sessions that are ready (no write running) and not yet
  // sent on this stream into heartbeat `nonce`; its ack clears them.
  void AddHeartbeatAcknowledgements(uint64_t nonce, v1::Heartbeat* hb)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ReadLoop(Stream* stream, const v1::SessionRequest& open);
  absl::Duration NextBackoff(absl::Duration base);

  bool OpenedOrEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || stream_opened_ || stream_ended_;
  }
  bool EndedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || stream_ended_;
  }
  // Whether session `generation` is the open one.
  bool IsCurrentLocked(uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return connected_ && generation_ == generation;
  }
  bool ServeWakeup() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || stream_ended_ || serve_wakeup_;
  }
  // Session-thread side of the deferred releases: the queued ids due by
  // `now` (all of them when a release was requested at once).
  std::vector<uint64_t> TakeDueReleases(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends Release for each id (the session thread, no lock held); stops at
  // the first call that does not reach the daemon. Also used when the
  // client closes, before the stream ends, so that the daemon does not
  // fence the queued leases' pages with the session.
  void SendReleases(const std::string& session_id,
                    const std::vector<uint64_t>& ids);

  const ClientOptions options_;
  const std::string target_;  // the gRPC target the channel dials
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  std::thread thread_;  // the session thread; joined by Stop()
  std::mt19937_64 rng_;  // session thread only

  mutable absl::Mutex mu_;
  // mu_ protects the following.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  v1::PoolInfo pool_info_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<gpu::MappedPool> pool_ ABSL_GUARDED_BY(mu_);
  absl::Duration lease_ttl_ ABSL_GUARDED_BY(mu_);
  // The open session's end flag; null while none is published.
  std::shared_ptr<SessionLife> life_ ABSL_GUARDED_BY(mu_);
  // Ended sessions not yet acknowledged by an OpenSession, oldest first.
  // One ended session to acknowledge: its id, its life (writers still
  // running hold the acknowledgement back) and the heartbeat nonce that
  // carried it last (0: none yet).
  struct Unacknowledged {
    std::string id;
    std::shared_ptr<const SessionLife> life;
    uint64_t sent_nonce = 0;
    bool Ready() const { return life == nullptr || life->writers.load() == 0; }
  };
  std::deque<Unacknowledged> unacknowledged_ ABSL_GUARDED_BY(mu_);
  // The highest heartbeat nonce the daemon has acknowledged on the current
  // stream.
  uint64_t acked_nonce_ ABSL_GUARDED_BY(mu_) = 0;
  // Why the last open attempt or stream failed; a target that cannot be
  // reached names the endpoint and the OS error (ConnectProblem).
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  // The live stream's context (owned by RunSession), for cancellation.
  grpc::ClientContext* stream_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Per-stream state, reset by RunSession; written by the reader thread.
  bool stream_opened_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;
  v1::SessionInfo stream_info_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ack_ ABSL_GUARDED_BY(mu_);
  // Deferred releases of the open session, oldest first.
  struct DeferredRelease {
    uint64_t lease_id;
    absl::Time since;
  };
  std::deque<DeferredRelease> deferred_ ABSL_GUARDED_BY(mu_);
  // Held leases of the open session that are not queued in deferred_.
  absl::flat_hash_set<uint64_t> live_leases_ ABSL_GUARDED_BY(mu_);
  bool release_now_ ABSL_GUARDED_BY(mu_) = false;
  // When the serving session thread wakes next, and whether something
  // changed that needs it sooner.
  absl::Time serve_wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool serve_wakeup_ ABSL_GUARDED_BY(mu_) = false;
  // The session thread ticks every release_delay until this time (releases
  // are flowing), so queuing one rarely needs to wake it.
  absl::Time release_ticking_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace radixkv::client_internal

#endif  // RADIXKV_CLIENT_CORE_H_
