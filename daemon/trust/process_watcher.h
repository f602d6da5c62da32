// File: daemon/trust/process_watcher.h
//
// ProcessWatcher: tells its user when a watched process exits. The fence
// tracker (fence_tracker.h) learns through it whether a writer is alive
// when it is added and when it exits. NewPidfdWatcher is the kernel's
// (a pidfd per process, one epoll thread); tests give the tracker their
// own watcher to decide exits themselves.
//
//   std::unique_ptr<ProcessWatcher> w = NewPidfdWatcher();
//   w->Start([](absl::Span<const pid_t> exited) { ... });
//   if (w->Watch(pid) == ProcessWatcher::Watched::kGone) ...  // already gone
//   ...
//   w->Unwatch(pid);   // no longer interested (or after its exit)
//   w->Stop();         // no callback runs after Stop returns
//
// Contract:
//   - Start is called once, before Watch; `on_exit` runs on the watcher's
//     own thread (never inside Watch or Unwatch), with the pids seen to
//     exit since the last call, each watched at the time the exit was
//     seen. A pid whose exit was delivered stays watched until Unwatch.
//   - Watch, Unwatch and usable() may be called from any thread, also
//     while a callback runs (the watcher holds no lock of its own across
//     `on_exit`).
//   - Stop waits for a callback in progress; afterwards none runs.
//
// Thread safety: as in the contract.
#ifndef RADIXKV_DAEMON_TRUST_PROCESS_WATCHER_H_
#define RADIXKV_DAEMON_TRUST_PROCESS_WATCHER_H_

#include <sys/types.h>

#include <functional>
#include <memory>

#include "absl/types/span.h"

namespace radixkv::daemon {

class ProcessWatcher {
 public:
  using ExitFn = std::function<void(absl::Span<const pid_t> exited)>;
  enum class Watched {
    kWatching,     // alive; its exit will be delivered
    kGone,         // it had exited already: nothing to wait for
    kUnwatchable,  // its exit cannot be seen (reason logged)
  };

  virtual ~ProcessWatcher() = default;

  // Whether any exit can be seen at all; false: every Watch is
  // kUnwatchable.
  virtual bool usable() const = 0;
  virtual void Start(ExitFn on_exit) = 0;
  // REQUIRES: pid > 0 and not watched now.
  virtual Watched Watch(pid_t pid) = 0;
  // Stops watching `pid`; no-op for a pid not watched.
  virtual void Unwatch(pid_t pid) = 0;
  virtual void Stop() = 0;
};

// The kernel's watcher: pidfd_open(2) per process, polled by one epoll
// thread. Not usable (logged once) when epoll or eventfd cannot be
// created.
std::unique_ptr<ProcessWatcher> NewPidfdWatcher();

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TRUST_PROCESS_WATCHER_H_
