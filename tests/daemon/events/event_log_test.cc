// Unit tests of the event ring (daemon/events/event_log.h).
#include <cstring>
#include <string>
#include <vector>

#include "daemon/events/event_log.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

TreeEvent Stored(uint32_t page) {
  TreeEvent e;
  e.type = TreeEvent::Type::kStored;
  e.key = BlockKey{1, page};
  e.page = page;
  return e;
}

TEST(EventLogTest, ReadsInOrderThenWaits) {
  EventLog log(8);
  EXPECT_EQ(log.next_sequence(), 1u);
  std::vector<TreeEvent> events = {Stored(1), Stored(2), Stored(3)};
  log.OnTreeEvents(events);
  uint64_t next = 1;
  v1::Event e;
  for (uint32_t i = 1; i <= 3; ++i) {
    ASSERT_TRUE(log.Read(&next, &e));
    EXPECT_EQ(e.sequence(), i);
    EXPECT_EQ(e.stored().page(), i);
  }
  EXPECT_FALSE(log.Read(&next, &e));
  EXPECT_EQ(next, 4u);
}

TEST(EventLogTest, SlowReaderGetsAGapThenTheOldestHeld) {
  EventLog log(4);
  std::vector<TreeEvent> events;
  for (uint32_t i = 1; i <= 10; ++i) events.push_back(Stored(i));
  log.OnTreeEvents(events);  // holds 7..10
  uint64_t next = 2;
  v1::Event e;
  ASSERT_TRUE(log.Read(&next, &e));
  ASSERT_TRUE(e.has_gap());
  EXPECT_EQ(e.gap().first_missing(), 2u);
  EXPECT_EQ(e.gap().next_sequence(), 7u);
  EXPECT_EQ(next, 7u);
  ASSERT_TRUE(log.Read(&next, &e));
  EXPECT_EQ(e.sequence(), 7u);
  EXPECT_EQ(e.stored().page(), 7u);
}

class CountingWatcher : public EventLog::Watcher {
 public:
  void OnEventsAvailable() override {
    absl::MutexLock lock(&mu);
    ++woken;
  }
  void OnShutdown() override {
    absl::MutexLock lock(&mu);
    shut = true;
  }
  absl::Mutex mu;
  int woken ABSL_GUARDED_BY(mu) = 0;
  bool shut ABSL_GUARDED_BY(mu) = false;
};

TEST(EventLogTest, WatchersAreWokenAndShutDown) {
  EventLog log(8);
  CountingWatcher w;
  log.Subscribe(&w);
  std::vector<TreeEvent> events = {Stored(1)};
  log.OnTreeEvents(events);
  {
    absl::MutexLock lock(&w.mu);
    auto woken = [&w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) { return w.woken > 0; };
    EXPECT_TRUE(w.mu.AwaitWithTimeout(absl::Condition(&woken), absl::Seconds(30)));
  }
  log.Shutdown();
  {
    absl::MutexLock lock(&w.mu);
    EXPECT_TRUE(w.shut);
  }
  log.Unsubscribe(&w);
}

}  // namespace
}  // namespace radixkv::daemon
