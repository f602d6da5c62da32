// File: daemon/events/event_log.h
//
// EventLog: the bounded history behind Admin.WatchEvents. The radix tree
// reports every change (block stored, block removed, cleared) through the
// EventListener interface; EventLog gives each event the next sequence number
// (1, 2, 3, ...) and keeps the newest `capacity` of them in a ring. Readers
// pull events by sequence number; a reader whose next wanted event has
// already been overwritten gets one EventGap{first_missing, next_sequence}
// and continues from the oldest event still held, so a slow consumer always
// knows what it missed.
//
// Waking readers: OnTreeEvents runs under the tree's mutex, so it only
// appends and signals. A notifier thread owned by the log then calls
// Watcher::OnEventsAvailable() on every subscribed watcher, outside the log's
// and the tree's locks. Watchers (WatchEvents reactors) pull with Read().
//
// Thread safety: thread-safe. Lock order: the tree's mutex may be held when
// OnTreeEvents takes mu_; nothing here ever calls the tree.
#ifndef RADIXKV_DAEMON_EVENTS_EVENT_LOG_H_
#define RADIXKV_DAEMON_EVENTS_EVENT_LOG_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/tiers/tier.h"
#include "radix/radix_tree.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::daemon {

class EventLog final : public EventListener, public TierEventListener {
 public:
  // A consumer woken when new events (or shutdown) arrive.
  class Watcher {
   public:
    virtual ~Watcher() = default;
    // New events may be readable. Called on the notifier thread with no
    // EventLog or tree lock held; must be quick and must not block.
    virtual void OnEventsAvailable() = 0;
    // The log is shutting down: finish the stream. Same calling rules.
    virtual void OnShutdown() = 0;
  };

  // REQUIRES: capacity > 0.
  explicit EventLog(size_t capacity);
  // Stops the notifier thread. REQUIRES: no watcher is subscribed any more.
  ~EventLog() override;
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // EventListener: appends, never blocks on anything but mu_. Hands the
  // same events to the forward listener first, if one is set.
  void OnTreeEvents(absl::Span<const TreeEvent> events) override;

  // TierEventListener: hands the moves to the tier forward listener, if
  // one is set; WatchEvents reports the pool only, so none is kept.
  void OnTierMoves(absl::Span<const TierMove> moves,
                   const BlockKey& root) override;

  // Also hands every batch of tree events to `next` (not owned; null: none),
  // on the tree's thread with the tree's mutex held, under EventListener's
  // rules. Set it before the first namespace binds so that `next` sees
  // every event; `next` must outlive the tree.
  void SetForward(EventListener* next) {
    forward_.store(next, std::memory_order_release);
  }
  // Also hands every batch of tier moves to `next` (not owned; null:
  // none), under TierEventListener's rules; set and kept like SetForward.
  void SetTierForward(TierEventListener* next) {
    tier_forward_.store(next, std::memory_order_release);
  }

  // The sequence number the next event will get (1 before any event).
  uint64_t next_sequence() const;

  // Reads the event numbered *next into *out and advances *next. When *next
  // is older than the ring holds, fills an EventGap (sequence 0) and moves
  // *next to the oldest held event. Returns false, touching nothing, when
  // event *next does not exist yet.
  bool Read(uint64_t* next, v1::Event* out) const;

  // Subscribes a watcher (not owned; must stay alive until Unsubscribe
  // returns). After Shutdown, calls watcher->OnShutdown() right away.
  void Subscribe(Watcher* watcher);
  // After this returns, `watcher` is never called again. REQUIRES: the caller
  // holds no lock that its own OnEventsAvailable takes.
  void Unsubscribe(Watcher* watcher);

  // Tells every watcher to finish and stops waking them. Idempotent.
  void Shutdown();

 private:
  struct Entry {
    TreeEvent event;
    double unix_seconds = 0;
  };
  void NotifierLoop();

  const size_t capacity_;
  std::atomic<EventListener*> forward_{nullptr};
  std::atomic<TierEventListener*> tier_forward_{nullptr};

  mutable absl::Mutex mu_;
  // mu_ protects the following.
  std::vector<Entry> ring_ ABSL_GUARDED_BY(mu_);  // seq s at (s-1) % capacity_
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t notified_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // watchers_mu_ protects the watcher set; it is held while watchers are
  // called, so Unsubscribe waits for a call in progress. Order: watchers_mu_
  // before mu_.
  absl::Mutex watchers_mu_;
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(watchers_mu_);
  bool shut_down_ ABSL_GUARDED_BY(watchers_mu_) = false;

  std::thread notifier_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_EVENTS_EVENT_LOG_H_
