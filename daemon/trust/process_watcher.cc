#include "daemon/trust/process_watcher.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"

namespace radixkv::daemon {
namespace {

int PidfdOpen(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

// The epoll data of the wake eventfd; pids are positive, so never this.
constexpr uint64_t kWakeData = UINT64_MAX;

class PidfdWatcher final : public ProcessWatcher {
 public:
  PidfdWatcher()
      : epoll_fd_(epoll_create1(EPOLL_CLOEXEC)),
        wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!usable()) {
      // Without them no exit can be seen: ended sessions then wait for an
      // acknowledgement (never released early, which is the safe side).
      Log(LogLevel::kError,
          "fence tracker: cannot create epoll/eventfd; "
          "fenced pages wait for acknowledgements only");
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeData;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  }

  ~PidfdWatcher() override {
    Stop();
    absl::MutexLock lock(&mu_);
    for (auto& [pid, fd] : pidfds_) close(fd);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  bool usable() const override { return epoll_fd_ >= 0 && wake_fd_ >= 0; }

  void Start(ExitFn on_exit) override {
    assert(!thread_.joinable());
    if (!usable()) return;
    on_exit_ = std::move(on_exit);
    thread_ = std::thread([this] { Run(); });
  }

  Watched Watch(pid_t pid) override {
    assert(pid > 0);
    if (!usable()) return Watched::kUnwatchable;
    const int fd = PidfdOpen(pid);
    if (fd < 0) {
      // ESRCH: it is gone already and can write nothing. Anything else
      // (pidfd_open unsupported, out of fds): its exit cannot be seen.
      if (errno == ESRCH) return Watched::kGone;
      Log(LogLevel::kWarning,
          absl::StrCat("fence tracker: pidfd_open(", pid, ") failed (errno ",
                       errno, "); its exit cannot be seen"));
      return Watched::kUnwatchable;
    }
    absl::MutexLock lock(&mu_);
    const bool inserted = pidfds_.emplace(pid, fd).second;
    assert(inserted);
    (void)inserted;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = static_cast<uint64_t>(pid);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    return Watched::kWatching;
  }

  void Unwatch(pid_t pid) override {
    absl::MutexLock lock(&mu_);
    auto it = pidfds_.find(pid);
    if (it == pidfds_.end()) return;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second, nullptr);
    close(it->second);
    pidfds_.erase(it);
  }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (wake_fd_ >= 0) {
      const uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    epoll_event events[32];
    std::vector<pid_t> exited;
    while (true) {
      const int n = epoll_wait(epoll_fd_, events, 32, -1);
      if (n < 0 && errno != EINTR) {
        Log(LogLevel::kError,
            "fence tracker: epoll_wait failed; exits are "
            "no longer seen");
        return;
      }
      exited.clear();
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        for (int i = 0; i < n; ++i) {
          if (events[i].data.u64 == kWakeData) continue;
          const auto pid = static_cast<pid_t>(events[i].data.u64);
          if (pidfds_.contains(pid)) exited.push_back(pid);
        }
      }
      // A readable pidfd stays readable: the user's Unwatch (normally from
      // the callback) removes it, else it is reported again.
      if (!exited.empty()) on_exit_(exited);
    }
  }

  const int epoll_fd_;
  const int wake_fd_;
  ExitFn on_exit_;
  absl::Mutex mu_;
  absl::flat_hash_map<pid_t, int> pidfds_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<ProcessWatcher> NewPidfdWatcher() {
  return std::make_unique<PidfdWatcher>();
}

}  // namespace radixkv::daemon
