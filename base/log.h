// File: base/log.h
//
// Minimal leveled logging to stderr (Debian 12's Abseil has no absl/log).
// One line per call, prefixed with the level, a UTC timestamp and the
// program tag "radixkvd".
//
//   SetLogLevel(LogLevel::kInfo);
//   Log(LogLevel::kWarning, absl::StrCat("session ", id, " expired"));
//
// Thread safety: thread-safe; the level is an atomic and each line is
// written with a single fwrite.
#ifndef RADIXKV_BASE_LOG_H_
#define RADIXKV_BASE_LOG_H_

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace radixkv {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

namespace log_internal {
// The process's one level (an inline variable: one object in every
// translation unit that includes this header).
inline std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace log_internal

// Parses "debug", "info", "warning" (or "warn") and "error".
inline absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "debug") return LogLevel::kDebug;
  if (n == "info") return LogLevel::kInfo;
  if (n == "warning" || n == "warn") return LogLevel::kWarning;
  if (n == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(absl::StrCat(
      "--log_level: '", name, "' is not one of debug, info, warning, error"));
}

inline void SetLogLevel(LogLevel level) {
  log_internal::g_level.store(static_cast<int>(level),
                              std::memory_order_relaxed);
}

inline bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >=
         log_internal::g_level.load(std::memory_order_relaxed);
}

inline void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  static constexpr const char* kTags[] = {"D", "I", "W", "E"};
  const std::string line = absl::StrCat(
      kTags[static_cast<int>(level)], " ",
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(),
                       absl::UTCTimeZone()),
      "radixkvd: ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace radixkv

#endif  // RADIXKV_BASE_LOG_H_
