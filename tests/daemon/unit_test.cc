// Unit tests of daemon pieces without a server: the status mapping, the
// event ring and the session/lease books.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cache.h"
#include "daemon/event_log.h"
#include "daemon/session_manager.h"
#include "daemon/status_util.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

// tokens_le: read in place when aligned, copied (same values) when not.
TEST(TokensLeViewTest, InPlaceWhenAlignedCopiedWhenNot) {
  const std::vector<uint32_t> ids = {1, 0x01020304u, 0xfffffffeu, 70000};
  std::string wire;
  for (uint32_t t : ids) {
    for (int i = 0; i < 4; ++i) wire.push_back(static_cast<char>(t >> (8 * i)));
  }
  // One spare byte in front, so both an aligned and a misaligned start exist.
  alignas(8) char buffer[1 + 16 + 8];
  for (int offset : {0, 1}) {
    SCOPED_TRACE(offset);
    std::memcpy(buffer + offset, wire.data(), wire.size());
    std::vector<uint32_t> copy;
    const absl::Span<const uint32_t> view =
        daemon::TokensLeView(absl::string_view(buffer + offset, wire.size()), &copy);
    EXPECT_EQ(std::vector<uint32_t>(view.begin(), view.end()), ids);
    if (offset == 0) {
      EXPECT_EQ(static_cast<const void*>(view.data()), buffer);  // no copy
      EXPECT_TRUE(copy.empty());
    } else {
      EXPECT_EQ(view.data(), copy.data());
    }
  }
  std::vector<uint32_t> copy;
  EXPECT_TRUE(daemon::TokensLeView(absl::string_view(buffer + 1, 0), &copy).empty());
}

TEST(StatusUtilTest, EveryCodeIsCastAndOkHasNoMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::OkStatus()).error_message(), "");
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), absl::StrCat("m", code));
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), absl::StrCat("m", code));
  }
}

TEST(StatusUtilTest, LongMessagesAreTruncated) {
  const grpc::Status g =
      ToGrpcStatus(absl::InvalidArgumentError(std::string(5000, 'x')));
  EXPECT_EQ(g.error_message().size(), kMaxGrpcStatusMessageBytes);
}

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

TEST(SessionManagerTest, LeasesBelongToOneSessionAndExpire) {
  SessionManager m({.max_sessions = 2, .max_leases_per_session = 2,
                    .lease_ttl = absl::Seconds(10)});
  auto a = m.Create({}, "a", "peer", 0);
  auto b = m.Create({}, "b", "peer", 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(m.Create({}, "c", "peer", 0).status().code(),
            absl::StatusCode::kResourceExhausted);

  const absl::Time now = absl::Now();
  ASSERT_TRUE(m.AddLease(*a, 7, now).ok());
  bool expired = false;
  EXPECT_TRUE(m.CheckOwner(*a, 7, now, &expired).ok());
  EXPECT_EQ(m.CheckOwner(*b, 7, now, &expired).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(expired);
  ASSERT_TRUE(m.AddLease(*a, 8, now).ok());
  EXPECT_EQ(m.Lookup(*a, /*need_lease_slot=*/true).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m.AddLease(*a, 9, now).status().code(),
            absl::StatusCode::kResourceExhausted);

  // Lease 7 expires; a check after the TTL reports it and forgets it.
  const absl::Time later = now + absl::Seconds(11);
  EXPECT_EQ(m.CheckOwner(*a, 7, later, &expired).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(expired);
  EXPECT_EQ(m.TakeExpired(later), std::vector<LeaseId>{8});
  EXPECT_EQ(m.lease_count(), 0u);

  ASSERT_TRUE(m.AddLease(*b, 10, now).ok());
  EXPECT_EQ(m.Remove(*b), std::vector<LeaseId>{10});
  EXPECT_EQ(m.Lookup(*b, false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.Lookup("", false).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace radixkv::daemon
