// Tests of FenceTracker (daemon/trust/fence_tracker.h) through a ProcessWatcher
// the test drives: when an ended session's fenced pages are released (its
// writers' exits, an acknowledgement by the same peer, at once without a
// live writer), and that processes are watched exactly while needed. One
// test uses the kernel's watcher with a real child process.
#include "daemon/trust/fence_tracker.h"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/trust/process_watcher.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

// A watcher whose processes live until the test says they exit.
class TestWatcher final : public ProcessWatcher {
 public:
  struct State {
    std::set<pid_t> alive;    // pids Watch reports as alive
    std::set<pid_t> watched;  // pids watched now
    bool usable = true;
    bool stopped = false;
    int started = 0;
    ExitFn on_exit;
  };
  explicit TestWatcher(State* state) : s_(state) {}

  bool usable() const override { return s_->usable; }
  void Start(ExitFn on_exit) override {
    ++s_->started;
    s_->on_exit = std::move(on_exit);
  }
  Watched Watch(pid_t pid) override {
    EXPECT_GT(pid, 0);
    EXPECT_FALSE(s_->watched.contains(pid)) << "watched twice: " << pid;
    if (!s_->alive.contains(pid)) return Watched::kGone;
    s_->watched.insert(pid);
    return Watched::kWatching;
  }
  void Unwatch(pid_t pid) override { s_->watched.erase(pid); }
  void Stop() override { s_->stopped = true; }

 private:
  State* const s_;
};

PeerIdentity UnixPeer(uid_t uid, pid_t pid) {
  PeerIdentity p;
  p.transport = PeerIdentity::Transport::kUnix;
  p.uid = uid;
  p.gid = uid;
  p.pid = pid;
  return p;
}

class FenceTrackerTest : public testing::Test {
 protected:
  FenceTrackerTest()
      : tracker_(
            [this](OwnerId owner) {
              absl::MutexLock lock(&mu_);
              released_.push_back(owner);
            },
            std::make_unique<TestWatcher>(&w_)) {}

  // The watcher reports `pids` as exited, from its own thread as the
  // kernel's watcher does.
  void Exit(std::vector<pid_t> pids) {
    for (pid_t p : pids) w_.alive.erase(p);
    std::thread([&] { w_.on_exit(pids); }).join();
  }
  std::vector<OwnerId> Released() {
    absl::MutexLock lock(&mu_);
    return released_;
  }

  TestWatcher::State w_;
  absl::Mutex mu_;
  std::vector<OwnerId> released_;
  FenceTracker tracker_;
};

TEST_F(FenceTrackerTest, StartsItsWatcherOnce) {
  EXPECT_EQ(w_.started, 1);
  EXPECT_TRUE(static_cast<bool>(w_.on_exit));
}

TEST_F(FenceTrackerTest, ReleasedWhenTheLastWriterExits) {
  w_.alive = {100, 101};
  tracker_.AddWriter(7, 100);
  tracker_.AddWriter(7, 101);
  tracker_.AddWriter(7, 101);  // again: nothing new
  EXPECT_EQ(w_.watched, (std::set<pid_t>{100, 101}));
  tracker_.SessionEnded("s7", 7, UnixPeer(1000, 100), /*fenced=*/true);
  EXPECT_EQ(tracker_.waiting(), 1u);
  EXPECT_TRUE(Released().empty());
  Exit({100});
  EXPECT_TRUE(Released().empty()) << "101 may still write";
  EXPECT_EQ(w_.watched, (std::set<pid_t>{101}));
  Exit({101});
  EXPECT_EQ(Released(), (std::vector<OwnerId>{7}));
  EXPECT_EQ(tracker_.waiting(), 0u);
  EXPECT_TRUE(w_.watched.empty());
  // An exit seen again changes nothing.
  Exit({101});
  EXPECT_EQ(Released().size(), 1u);
}

TEST_F(FenceTrackerTest, OneProcessWritingForTwoOwners) {
  w_.alive = {200};
  tracker_.AddWriter(1, 200);
  tracker_.AddWriter(2, 200);
  EXPECT_EQ(w_.watched.size(), 1u);
  tracker_.SessionEnded("a", 1, UnixPeer(1, 200), true);
  tracker_.SessionEnded("b", 2, UnixPeer(1, 200), false);  // nothing fenced
  EXPECT_EQ(tracker_.waiting(), 1u);
  EXPECT_EQ(w_.watched.size(), 1u);  // still needed for owner 1
  Exit({200});
  EXPECT_EQ(Released(), (std::vector<OwnerId>{1}));
  EXPECT_TRUE(w_.watched.empty());
}

TEST_F(FenceTrackerTest, WithoutALiveWriterReleasedAtOnce) {
  // Never had a writer (a TCP client).
  tracker_.SessionEnded("t", 3, PeerIdentity::InProcess(), true);
  EXPECT_EQ(Released(), (std::vector<OwnerId>{3}));
  // Its only writer had exited before it was added.
  tracker_.AddWriter(4, 300);  // 300 is not alive
  EXPECT_TRUE(w_.watched.empty());
  tracker_.SessionEnded("u", 4, UnixPeer(1, 300), true);
  EXPECT_EQ(Released(), (std::vector<OwnerId>{3, 4}));
  EXPECT_EQ(tracker_.waiting(), 0u);
}

TEST_F(FenceTrackerTest, NotFencedMeansForgotten) {
  w_.alive = {400};
  tracker_.AddWriter(5, 400);
  tracker_.SessionEnded("v", 5, UnixPeer(1, 400), false);
  EXPECT_TRUE(w_.watched.empty());
  EXPECT_EQ(tracker_.waiting(), 0u);
  Exit({400});
  EXPECT_TRUE(Released().empty());
}

TEST_F(FenceTrackerTest, AcknowledgedOnlyByTheSameParty) {
  w_.alive = {500};
  tracker_.AddWriter(6, 500);
  const PeerIdentity opener = UnixPeer(1000, 500);
  tracker_.SessionEnded("w", 6, opener, true);
  EXPECT_FALSE(tracker_.Acknowledge("w", UnixPeer(1001, 500)));  // other uid
  EXPECT_FALSE(tracker_.Acknowledge("w", UnixPeer(1000, 501)));  // other pid
  EXPECT_FALSE(tracker_.Acknowledge("nope", opener));
  EXPECT_TRUE(Released().empty());
  EXPECT_TRUE(tracker_.Acknowledge("w", opener));
  EXPECT_EQ(Released(), (std::vector<OwnerId>{6}));
  EXPECT_TRUE(w_.watched.empty());
  EXPECT_FALSE(tracker_.Acknowledge("w", opener));  // once
  Exit({500});
  EXPECT_EQ(Released().size(), 1u);
}

TEST_F(FenceTrackerTest, WritersOfAnEndedSessionAreNotAdded) {
  w_.alive = {600, 601};
  tracker_.AddWriter(8, 600);
  tracker_.SessionEnded("x", 8, UnixPeer(1, 600), true);
  tracker_.AddWriter(8, 601);  // attached too late: not a writer
  EXPECT_EQ(w_.watched, (std::set<pid_t>{600}));
  Exit({600});
  EXPECT_EQ(Released(), (std::vector<OwnerId>{8}));
}

TEST_F(FenceTrackerTest, BadPidsAreIgnored) {
  tracker_.AddWriter(9, 0);
  tracker_.AddWriter(9, -5);
  EXPECT_TRUE(w_.watched.empty());
  tracker_.SessionEnded("y", 9, UnixPeer(1, 1), true);
  EXPECT_EQ(Released(), (std::vector<OwnerId>{9}));
}

TEST(FenceTrackerUnusableWatcherTest, EndedSessionsReleasedAtOnce) {
  TestWatcher::State w;
  w.usable = false;
  w.alive = {700};
  std::vector<OwnerId> released;
  {
    FenceTracker tracker([&](OwnerId o) { released.push_back(o); },
                         std::make_unique<TestWatcher>(&w));
    tracker.AddWriter(1, 700);
    EXPECT_TRUE(w.watched.empty());
    tracker.SessionEnded("z", 1, UnixPeer(1, 700), true);
    EXPECT_EQ(released, (std::vector<OwnerId>{1}));
  }
  EXPECT_TRUE(w.stopped);
}

// The kernel's watcher: a real child's exit releases its session.
TEST(FenceTrackerPidfdTest, AChildsExitReleasesItsSession) {
  std::unique_ptr<ProcessWatcher> probe = NewPidfdWatcher();
  if (!probe->usable()) GTEST_SKIP() << "epoll/eventfd unavailable";
  probe.reset();
  absl::Mutex mu;
  std::vector<OwnerId> released;
  FenceTracker tracker([&](OwnerId o) {
    absl::MutexLock lock(&mu);
    released.push_back(o);
  });
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    close(go[1]);
    (void)!read(go[0], &c, 1);  // until the parent closes its end
    _exit(0);
  }
  close(go[0]);
  tracker.AddWriter(42, child);
  tracker.SessionEnded("real", 42, UnixPeer(getuid(), getpid()), true);
  EXPECT_EQ(tracker.waiting(), 1u);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(released.empty());
  }
  close(go[1]);  // the child exits
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(mu.AwaitWithTimeout(
      absl::Condition(
          +[](std::vector<OwnerId>* r) { return !r->empty(); }, &released),
      absl::Seconds(10)));
  EXPECT_EQ(released, (std::vector<OwnerId>{42}));
}

// A process already gone when added is not waited for.
TEST(FenceTrackerPidfdTest, AReapedChildIsNoWriter) {
  std::vector<OwnerId> released;
  FenceTracker tracker([&](OwnerId o) { released.push_back(o); });
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  tracker.AddWriter(43, child);
  tracker.SessionEnded("gone", 43, UnixPeer(getuid(), getpid()), true);
  EXPECT_EQ(released, (std::vector<OwnerId>{43}));
}

}  // namespace
}  // namespace radixkv::daemon
