#include "daemon/trust/fence_tracker.h"

#include <cassert>
#include <utility>
#include <vector>

namespace radixkv::daemon {

FenceTracker::FenceTracker(ReleaseFn release)
    : FenceTracker(std::move(release), NewPidfdWatcher()) {}

FenceTracker::FenceTracker(ReleaseFn release,
                           std::unique_ptr<ProcessWatcher> watcher)
    : release_(std::move(release)), watcher_(std::move(watcher)) {
  assert(watcher_ != nullptr);
  watcher_->Start([this](absl::Span<const pid_t> pids) { OnExited(pids); });
}

FenceTracker::~FenceTracker() {
  // Not under mu_: a callback in progress takes it.
  watcher_->Stop();
}

void FenceTracker::AddWriter(OwnerId owner, pid_t pid) {
  if (pid <= 0 || !watcher_->usable()) return;
  absl::MutexLock lock(&mu_);
  Owner& o = owners_[owner];
  if (o.ended || o.writers.contains(pid)) return;
  auto it = processes_.find(pid);
  if (it == processes_.end()) {
    if (watcher_->Watch(pid) != ProcessWatcher::Watched::kWatching) {
      // Gone already, it can write nothing; unwatchable, the owner's fenced
      // pages wait for an acknowledgement or another writer's exit.
      if (o.writers.empty() && !o.ended) owners_.erase(owner);
      return;
    }
    it = processes_.emplace(pid, Process{}).first;
  }
  it->second.owners.insert(owner);
  o.writers.insert(pid);
}

void FenceTracker::SessionEnded(absl::string_view session_id, OwnerId owner,
                                const PeerIdentity& peer, bool fenced) {
  bool release_now = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = owners_.find(owner);
    if (!fenced) {
      EraseOwnerLocked(owner);
      return;
    }
    if (it == owners_.end() || it->second.writers.empty()) {
      EraseOwnerLocked(owner);
      release_now = true;
    } else {
      assert(!it->second.ended);
      it->second.ended = true;
      it->second.session_id = std::string(session_id);
      it->second.peer = peer;
      const bool inserted = ended_.emplace(session_id, owner).second;
      // Session ids are unique: an id ends once.
      assert(inserted);
      if (!inserted) ended_[std::string(session_id)] = owner;
    }
  }
  if (release_now) release_(owner);
}

bool FenceTracker::Acknowledge(absl::string_view session_id,
                               const PeerIdentity& peer) {
  OwnerId owner = kNoOwner;
  {
    absl::MutexLock lock(&mu_);
    auto e = ended_.find(session_id);
    if (e == ended_.end()) return false;
    auto it = owners_.find(e->second);
    assert(it != owners_.end() && it->second.ended);
    if (it == owners_.end() || !peer.SameParty(it->second.peer)) return false;
    owner = e->second;
    EraseOwnerLocked(owner);
  }
  release_(owner);
  return true;
}

size_t FenceTracker::waiting() const {
  absl::MutexLock lock(&mu_);
  return ended_.size();
}

bool FenceTracker::EraseOwnerLocked(OwnerId owner) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return false;
  for (pid_t pid : it->second.writers) {
    auto p = processes_.find(pid);
    assert(p != processes_.end() && p->second.owners.contains(owner));
    if (p == processes_.end()) continue;
    p->second.owners.erase(owner);
    if (p->second.owners.empty()) {
      watcher_->Unwatch(pid);
      processes_.erase(p);
    }
  }
  if (it->second.ended) {
    const size_t erased = ended_.erase(it->second.session_id);
    assert(erased == 1);
    (void)erased;
  }
  owners_.erase(it);
  return true;
}

void FenceTracker::ExitedLocked(pid_t pid, std::vector<OwnerId>* ready) {
  // Watched by the tracker or not, an exited pid is watched no longer.
  watcher_->Unwatch(pid);
  auto p = processes_.find(pid);
  if (p == processes_.end()) return;
  const absl::flat_hash_set<OwnerId> owners = std::move(p->second.owners);
  processes_.erase(p);
  for (OwnerId owner : owners) {
    auto it = owners_.find(owner);
    assert(it != owners_.end() && it->second.writers.contains(pid));
    if (it == owners_.end()) continue;
    it->second.writers.erase(pid);
    if (it->second.writers.empty()) {
      if (it->second.ended) {
        ready->push_back(owner);
        ended_.erase(it->second.session_id);
      }
      owners_.erase(it);
    }
  }
}

void FenceTracker::OnExited(absl::Span<const pid_t> pids) {
  std::vector<OwnerId> ready;
  {
    absl::MutexLock lock(&mu_);
    for (pid_t pid : pids) ExitedLocked(pid, &ready);
  }
  for (OwnerId owner : ready) release_(owner);
}

}  // namespace radixkv::daemon
