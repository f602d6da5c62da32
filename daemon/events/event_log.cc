#include "daemon/events/event_log.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace radixkv::daemon {

EventLog::EventLog(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {
  ring_.reserve(std::min<size_t>(capacity_, 4096));
  notifier_ = std::thread([this] { NotifierLoop(); });
}

EventLog::~EventLog() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  notifier_.join();
}

void EventLog::OnTreeEvents(absl::Span<const TreeEvent> events) {
  if (events.empty()) return;
  if (EventListener* f = forward_.load(std::memory_order_acquire)) {
    f->OnTreeEvents(events);
  }
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  absl::MutexLock lock(&mu_);
  for (const TreeEvent& e : events) {
    Entry entry{e, now};
    const size_t slot = (next_seq_ - 1) % capacity_;
    if (slot < ring_.size()) {
      ring_[slot] = entry;
    } else {
      ring_.push_back(entry);
    }
    ++next_seq_;
  }
}

void EventLog::OnTierMoves(absl::Span<const TierMove> moves,
                           const BlockKey& root) {
  if (moves.empty()) return;
  if (TierEventListener* f = tier_forward_.load(std::memory_order_acquire)) {
    f->OnTierMoves(moves, root);
  }
}

uint64_t EventLog::next_sequence() const {
  absl::MutexLock lock(&mu_);
  return next_seq_;
}

bool EventLog::Read(uint64_t* next, v1::Event* out) const {
  absl::MutexLock lock(&mu_);
  const uint64_t held = std::min<uint64_t>(next_seq_ - 1, capacity_);
  const uint64_t oldest = next_seq_ - held;
  if (*next < oldest) {
    out->Clear();
    out->set_sequence(0);
    out->set_unix_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    out->mutable_gap()->set_first_missing(*next);
    out->mutable_gap()->set_next_sequence(oldest);
    *next = oldest;
    return true;
  }
  if (*next >= next_seq_) return false;
  const Entry& entry = ring_[(*next - 1) % capacity_];
  out->Clear();
  out->set_sequence(*next);
  out->set_unix_seconds(entry.unix_seconds);
  const TreeEvent& e = entry.event;
  const std::string ns_id = e.root.ToCanonical();
  switch (e.type) {
    case TreeEvent::Type::kStored: {
      v1::BlockStored* s = out->mutable_stored();
      s->set_key(e.key.ToCanonical());
      s->set_parent_key(e.parent_key.ToCanonical());
      s->set_namespace_id(ns_id);
      s->set_page(e.page);
      s->set_depth(e.depth);
      break;
    }
    case TreeEvent::Type::kRemoved: {
      v1::BlockRemoved* r = out->mutable_removed();
      r->set_key(e.key.ToCanonical());
      r->set_namespace_id(ns_id);
      r->set_page(e.page);
      break;
    }
    case TreeEvent::Type::kCleared:
      out->mutable_cleared();
      break;
  }
  ++*next;
  return true;
}

void EventLog::Subscribe(Watcher* watcher) {
  absl::MutexLock lock(&watchers_mu_);
  if (shut_down_) {
    watcher->OnShutdown();
    return;
  }
  watchers_.insert(watcher);
}

void EventLog::Unsubscribe(Watcher* watcher) {
  absl::MutexLock lock(&watchers_mu_);
  watchers_.erase(watcher);
}

void EventLog::Shutdown() {
  absl::MutexLock lock(&watchers_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (Watcher* w : watchers_) w->OnShutdown();
}

void EventLog::NotifierLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || notified_seq_ != next_seq_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      notified_seq_ = next_seq_;
    }
    absl::MutexLock lock(&watchers_mu_);
    if (shut_down_) continue;
    for (Watcher* w : watchers_) w->OnEventsAvailable();
  }
}

}  // namespace radixkv::daemon
