// File: daemon/log.h
//
// Minimal leveled logging to stderr for radixkvd (Debian 12's Abseil has no
// absl/log). One line per call, prefixed with the level and a UTC timestamp.
//
//   SetLogLevel(LogLevel::kInfo);
//   Log(LogLevel::kWarning, absl::StrCat("session ", id, " expired"));
//
// Thread safety: thread-safe; the level is an atomic and each line is written
// with a single fwrite.
#ifndef RADIXKV_DAEMON_LOG_H_
#define RADIXKV_DAEMON_LOG_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace radixkv::daemon {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Parses "debug", "info", "warning" (or "warn") and "error".
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void Log(LogLevel level, absl::string_view message);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_LOG_H_
