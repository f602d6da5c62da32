#include "daemon/fence_tracker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/log.h"

namespace radixkv::daemon {
namespace {

int PidfdOpen(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

}  // namespace

FenceTracker::FenceTracker(ReleaseFn release)
    : release_(std::move(release)),
      epoll_fd_(epoll_create1(EPOLL_CLOEXEC)),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    // Without them no exit can be seen: ended sessions then wait for an
    // acknowledgement (never released early, which is the safe side).
    Log(LogLevel::kError, "fence tracker: cannot create epoll/eventfd; fenced "
                          "pages wait for acknowledgements only");
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = UINT64_MAX;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Run(); });
}

FenceTracker::~FenceTracker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [pid, p] : processes_) close(p.pidfd);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void FenceTracker::AddWriter(OwnerId owner, pid_t pid) {
  if (pid <= 0 || epoll_fd_ < 0) return;
  absl::MutexLock lock(&mu_);
  Owner& o = owners_[owner];
  if (o.ended || o.writers.contains(pid)) return;
  auto it = processes_.find(pid);
  if (it == processes_.end()) {
    const int fd = PidfdOpen(pid);
    if (fd < 0) {
      // ESRCH: it is gone already and can write nothing. Anything else
      // (pidfd_open unsupported, out of fds): note it; the owner's fenced
      // pages then wait for an acknowledgement or another writer's exit.
      if (errno != ESRCH) {
        Log(LogLevel::kWarning,
            absl::StrCat("fence tracker: pidfd_open(", pid, ") failed (errno ",
                         errno, "); its exit cannot be seen"));
      }
      if (o.writers.empty() && !o.ended) owners_.erase(owner);
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = static_cast<uint64_t>(pid);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    it = processes_.emplace(pid, Process{fd, {}}).first;
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
      it->second.ended = true;
      it->second.session_id = std::string(session_id);
      it->second.peer = peer;
      ended_[std::string(session_id)] = owner;
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
    if (p == processes_.end()) continue;
    p->second.owners.erase(owner);
    if (p->second.owners.empty()) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p->second.pidfd, nullptr);
      close(p->second.pidfd);
      processes_.erase(p);
    }
  }
  if (it->second.ended) ended_.erase(it->second.session_id);
  owners_.erase(it);
  return true;
}

void FenceTracker::ExitedLocked(pid_t pid, std::vector<OwnerId>* ready) {
  auto p = processes_.find(pid);
  if (p == processes_.end()) return;
  const absl::flat_hash_set<OwnerId> owners = std::move(p->second.owners);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p->second.pidfd, nullptr);
  close(p->second.pidfd);
  processes_.erase(p);
  for (OwnerId owner : owners) {
    auto it = owners_.find(owner);
    if (it == owners_.end()) continue;
    it->second.writers.erase(pid);
    if (it->second.writers.empty()) {
      if (it->second.ended) ready->push_back(owner);
      if (it->second.ended) ended_.erase(it->second.session_id);
      owners_.erase(it);
    }
  }
}

void FenceTracker::Run() {
  epoll_event events[32];
  while (true) {
    const int n = epoll_wait(epoll_fd_, events, 32, -1);
    if (n < 0 && errno != EINTR) {
      Log(LogLevel::kError, "fence tracker: epoll_wait failed; exits are no "
                            "longer seen");
      return;
    }
    std::vector<OwnerId> ready;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == UINT64_MAX) continue;
        ExitedLocked(static_cast<pid_t>(events[i].data.u64), &ready);
      }
    }
    for (OwnerId owner : ready) release_(owner);
  }
}

}  // namespace radixkv::daemon
