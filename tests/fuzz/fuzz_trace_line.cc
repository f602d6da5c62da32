// Fuzzes the replay trace parser (bench/replay/trace.h): ParseTraceLine on
// arbitrary lines, LoadTrace on arbitrary files, and FillTokens on what they
// accept.
//
// Checked: parsing never crashes or trips a sanitizer, whatever the bytes;
// an accepted line re-serialized by a second writer (plain text, below)
// parses to the same request; LoadTrace agrees with parsing line by line
// (request count, total and longest request, largest id, and its id limit
// at the page size); FillTokens writes id * page_size + j for each block.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "bench/replay/trace.h"

namespace {

#define FUZZ_CHECK(cond, ...)                                         \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: %s\n", #cond,      \
                   absl::StrCat(__VA_ARGS__).c_str());                \
      std::abort();                                                   \
    }                                                                 \
  } while (0)

using radixkv::bench::TraceRequest;

std::string Write(const TraceRequest& r) {
  std::string s = absl::StrCat("{\"timestamp\": ", r.timestamp_ms, ", \"hash_ids\": [");
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    absl::StrAppend(&s, i ? "," : "", r.hash_ids[i]);
  }
  s += "]}";
  return s;
}

// LoadTrace reads a path; a memfd gives the input one without touching disk.
class MemFile {
 public:
  explicit MemFile(const std::string& bytes)
      : fd_(memfd_create("trace", MFD_CLOEXEC)) {
    FUZZ_CHECK(fd_ >= 0, "memfd_create");
    FUZZ_CHECK(::write(fd_, bytes.data(), bytes.size()) ==
                   static_cast<ssize_t>(bytes.size()),
               "write");
  }
  ~MemFile() { ::close(fd_); }
  std::string path() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  int fd_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using radixkv::bench::FillTokens;
  using radixkv::bench::LoadTrace;
  using radixkv::bench::ParseTraceLine;
  if (size == 0) return 0;
  // Byte 0: page size 1..64; the rest is the trace text.
  const uint32_t page_size = (data[0] & 0x3f) + 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  // Line by line, as LoadTrace splits it.
  std::vector<TraceRequest> parsed;
  bool all_ok = true;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<TraceRequest> r = ParseTraceLine(line);
    if (!r.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(r.status()), r.status().ToString());
      all_ok = false;
      break;
    }
    absl::StatusOr<TraceRequest> again = ParseTraceLine(Write(*r));
    FUZZ_CHECK(again.ok(), "re-parse of ", Write(*r), ": ", again.status().ToString());
    FUZZ_CHECK(again->timestamp_ms == r->timestamp_ms &&
                   again->hash_ids == r->hash_ids,
               "re-parse of ", Write(*r), " differs");
    parsed.push_back(*std::move(r));
  }

  MemFile file(text);
  absl::StatusOr<radixkv::bench::Trace> trace = LoadTrace(file.path(), page_size);
  if (!all_ok) {
    FUZZ_CHECK(!trace.ok(), "LoadTrace accepted a line ParseTraceLine refused");
    return 0;
  }
  uint64_t total = 0;
  uint32_t longest = 0, max_id = 0;
  for (const TraceRequest& r : parsed) {
    total += r.hash_ids.size();
    longest = std::max<uint32_t>(longest, r.hash_ids.size());
    for (uint32_t id : r.hash_ids) max_id = std::max(max_id, id);
  }
  const bool fits = (uint64_t{max_id} + 1) * page_size - 1 <=
                    std::numeric_limits<uint32_t>::max();
  FUZZ_CHECK(trace.ok() == fits, "LoadTrace: ",
             trace.ok() ? "accepted" : trace.status().ToString());
  if (!trace.ok()) return 0;
  FUZZ_CHECK(trace->requests.size() == parsed.size() &&
                 trace->total_blocks == total && trace->max_blocks == longest &&
                 trace->max_hash_id == max_id &&
                 trace->distinct_blocks <= total,
             "LoadTrace summary");

  std::vector<uint32_t> buf;
  for (const TraceRequest& r : trace->requests) {
    absl::Span<const uint32_t> tokens = FillTokens(r.hash_ids, page_size, &buf);
    FUZZ_CHECK(tokens.size() == r.hash_ids.size() * page_size, "FillTokens size");
    for (size_t i = 0; i < tokens.size(); ++i) {
      FUZZ_CHECK(tokens[i] == r.hash_ids[i / page_size] * page_size + i % page_size,
                 "FillTokens token ", i);
    }
  }
  return 0;
}
