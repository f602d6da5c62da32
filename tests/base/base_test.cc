// Unit tests of the header-only base library: status macros, leveled
// logging, the annotated mutexes and byte counts for people.
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "gtest/gtest.h"

namespace radixkv {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(h, Half(h));
  return h;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnTheFirstErrorAndAssignOtherwise) {
  EXPECT_EQ(Quarter(8).value(), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(5).status().message(), "odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(3).code(), absl::StatusCode::kInvalidArgument);
}

TEST(HumanBytesTest, BinaryUnitsOneDecimalNoTrailingZero) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{64} << 30), "64 GiB");
  EXPECT_EQ(HumanBytes((uint64_t{123} << 30) / 10), "12.3 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{1} << 62), "4 EiB");
  EXPECT_EQ(HumanBytes(~uint64_t{0}), "16 EiB");
}

TEST(MutexTest, AwaitReturnsOnceAnotherHolderMadeTheConditionTrue) {
  Mutex mu;
  int stage = 0;  // guarded by mu
  std::thread other([&] {
    MutexLock l(&mu);
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stage == 1; });
    stage = 2;
  });
  {
    MutexLock l(&mu);
    stage = 1;
  }
  {
    MutexLock l(&mu);
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stage == 2; });
    EXPECT_EQ(stage, 2);
  }
  other.join();
}

TEST(LogTest, ParsesLevelsAndNamesTheFlagOnError) {
  EXPECT_EQ(ParseLogLevel("debug").value(), LogLevel::kDebug);
  EXPECT_EQ(ParseLogLevel("INFO").value(), LogLevel::kInfo);
  EXPECT_EQ(ParseLogLevel("warn").value(), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("warning").value(), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("error").value(), LogLevel::kError);
  const absl::Status bad = ParseLogLevel("loud").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--log_level"), absl::string_view::npos);
  EXPECT_NE(bad.message().find("loud"), absl::string_view::npos);
}

TEST(LogTest, LevelFiltersLinesAndEachLineIsTagged) {
  SetLogLevel(LogLevel::kWarning);
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kWarning));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  testing::internal::CaptureStderr();
  Log(LogLevel::kInfo, "hidden");
  Log(LogLevel::kError, "shown");
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.find("hidden"), std::string::npos);
  ASSERT_EQ(out.rfind("E ", 0), 0u) << out;
  EXPECT_NE(out.find("radixkvd: shown\n"), std::string::npos) << out;
  SetLogLevel(LogLevel::kInfo);
}

TEST(SharedMutexTest, WritersExcludeEachOtherAndReaders) {
  SharedMutex mu;
  int64_t value = 0;
  std::atomic<bool> torn{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        WriterMutexLock l(&mu);
        // Odd only inside the critical section.
        value += 1;
        std::atomic_signal_fence(std::memory_order_seq_cst);
        value += 1;
      }
    });
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        ReaderMutexLock l(&mu);
        if (value % 2 != 0) torn = true;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(value, 4 * 20000 * 2);
  EXPECT_FALSE(torn.load());
}

}  // namespace
}  // namespace radixkv
