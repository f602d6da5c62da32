// File: daemon/fence_tracker.h
//
// FenceTracker: decides when the fenced pages of an ended session may be
// reused. A session's leases that were not committed or released when it
// ended (stream broken, keepalive timeout, daemon-side close) are fenced
// in the radix tree (RadixTreeOptions::fence_unended_leases): their pages
// are neither free nor evictable, because a process that mapped the pool
// may still be writing them. This tracker knows those processes, the
// session's *writers*: the process that opened it over the Unix socket and
// every process that attached to the pool with its id (both from
// SO_PEERCRED). It holds a pidfd for each and calls `release(owner)` as
// soon as
//   - every writer of the ended session has exited (the pidfd turns
//     readable), or
//   - the same peer acknowledges the loss (OpenSession.acknowledge_sessions),
//   - or at once, when the ended session has no writer alive (it never
//     mapped the pool: a TCP client, an index-only worker).
//
// Thread safety: thread-safe. `release` is called on the tracker's thread
// or the caller's, never with the tracker's mutex held; it must be
// thread-safe.
#ifndef RADIXKV_DAEMON_FENCE_TRACKER_H_
#define RADIXKV_DAEMON_FENCE_TRACKER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/peer_identity.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

class FenceTracker {
 public:
  using ReleaseFn = std::function<void(OwnerId owner)>;

  // Starts the thread that waits for writers to exit.
  explicit FenceTracker(ReleaseFn release);
  // Stops the thread; owners still waiting are not released.
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
    int pidfd = -1;
    absl::flat_hash_set<OwnerId> owners;
  };

  void Run();
  // Drops `owner` from the tables and closes pidfds nobody needs. Returns
  // whether it was there. REQUIRES: mu_ held.
  bool EraseOwnerLocked(OwnerId owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Process `pid` exited: the owners it was the last writer of (ended ones
  // only) go to *ready.
  void ExitedLocked(pid_t pid, std::vector<OwnerId>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReleaseFn release_;
  const int epoll_fd_;
  const int wake_fd_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<OwnerId, Owner> owners_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<pid_t, Process> processes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, OwnerId> ended_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_FENCE_TRACKER_H_
