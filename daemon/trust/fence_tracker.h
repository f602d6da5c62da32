// File: daemon/trust/fence_tracker.h
//
// FenceTracker: decides when the fenced pages of an ended session may be
// reused. A session's leases that were not committed or released when it
// ended (stream broken, keepalive timeout, daemon-side close) are fenced
// in the radix tree (RadixTreeOptions::fence_unended_leases): their pages
// are neither free nor evictable, because a process that mapped the pool
// may still be writing them. This tracker knows those processes, the
// session's *writers*: the process that opened it over the Unix socket and
// every process that attached to the pool with its id (both from
// SO_PEERCRED). It watches each through a ProcessWatcher (process_watcher.h;
// the kernel's pidfds unless a test passes its own) and calls
// `release(owner)` as soon as
//   - every writer of the ended session has exited, or
//   - the same peer acknowledges the loss (OpenSession.acknowledge_sessions),
//   - or at once, when the ended session has no writer alive (it never
//     mapped the pool: a TCP client, an index-only worker).
//
// Invariants (under the mutex): a pid is in processes_ exactly while the
// watcher watches it for the tracker, and exactly while some owner lists it
// among its writers, each of those owners being in its Process::owners; an
// owner is in ended_ (under its session id) exactly while it is ended and
// waiting; every owner in owners_ has at least one writer.
//
// Thread safety: thread-safe. `release` is called on the watcher's thread
// or the caller's, never with the tracker's mutex held; it must be
// thread-safe.
#ifndef RADIXKV_DAEMON_TRUST_FENCE_TRACKER_H_
#define RADIXKV_DAEMON_TRUST_FENCE_TRACKER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/trust/peer_identity.h"
#include "daemon/trust/process_watcher.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

class FenceTracker {
 public:
  using ReleaseFn = std::function<void(OwnerId owner)>;

  // Watches writers with the kernel's pidfds (NewPidfdWatcher).
  explicit FenceTracker(ReleaseFn release);
  // Watches writers with `watcher` (not null), which it starts and owns.
  FenceTracker(ReleaseFn release, std::unique_ptr<ProcessWatcher> watcher);
  // Stops the watcher; owners still waiting are not released.
  ~FenceTracker();
  FenceTracker(const FenceTracker&) = delete;
  FenceTracker& operator=(const FenceTracker&) = delete;

  // Process `pid` may write the pages of `owner`'s leases. Ignored for a
  // pid that is already gone (nothing to wait for) or for an owner whose
  // session already ended.
  void AddWriter(OwnerId owner, pid_t pid);

  // The session `session_id` of `owner`, opened by `peer`, ended; with
  // `fenced`, some of its leases were fenced, and they are released now
  // when no writer is alive, else later. Without, it is forgotten.
  void SessionEnded(absl::string_view session_id, OwnerId owner,
                    const PeerIdentity& peer, bool fenced);

  // `peer` acknowledges the loss of its ended session: releases its fenced
  // pages. false (nothing changes) for an unknown session or another peer.
  bool Acknowledge(absl::string_view session_id, const PeerIdentity& peer);

  // Ended sessions still waiting for a writer to exit or an acknowledgement.
  size_t waiting() const;

 private:
  struct Owner {
    absl::flat_hash_set<pid_t> writers;
    bool ended = false;
    std::string session_id;
    PeerIdentity peer;
  };
  struct Process {
    absl::flat_hash_set<OwnerId> owners;
  };

  // The watcher's callback: releases the owners whose last writer exited.
  void OnExited(absl::Span<const pid_t> pids);
  // Drops `owner` from the tables and stops watching processes nobody
  // needs. Returns whether it was there. REQUIRES: mu_ held.
  bool EraseOwnerLocked(OwnerId owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Process `pid` exited: the owners it was the last writer of (ended ones
  // only) go to *ready.
  void ExitedLocked(pid_t pid, std::vector<OwnerId>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReleaseFn release_;
  // Lock order: mu_, then the watcher's own lock (Watch and Unwatch are
  // called under mu_; the watcher calls OnExited holding none of its own).
  const std::unique_ptr<ProcessWatcher> watcher_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<OwnerId, Owner> owners_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<pid_t, Process> processes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, OwnerId> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TRUST_FENCE_TRACKER_H_
