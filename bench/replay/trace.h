// File: bench/replay/trace.h
//
// Mooncake-format request traces (bench/data/README.md): one JSON object
// per line with `timestamp` (ms) and `hash_ids` (the prompt as a sequence of
// prefix-chained block ids). Replay gives block id h the tokens
// h * page_size + j for j in [0, page_size), so every id is one full block.
//
// Thread safety: LoadTrace and the helpers are pure functions; a loaded
// Trace is immutable and may be read from any number of threads.
#ifndef RADIXKV_BENCH_REPLAY_TRACE_H_
#define RADIXKV_BENCH_REPLAY_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace radixkv::bench {

struct TraceRequest {
  int64_t timestamp_ms = 0;
  std::vector<uint32_t> hash_ids;
};

struct Trace {
  std::vector<TraceRequest> requests;  // in arrival (file) order
  uint64_t total_blocks = 0;           // sum of hash_ids sizes
  uint64_t distinct_blocks = 0;        // distinct (prefix, id) paths
  uint32_t max_blocks = 0;             // longest request, in blocks
  uint32_t max_hash_id = 0;
};

// Parses one trace line. INVALID_ARGUMENT when the line is not one JSON
// object (the message gives the column), or naming the field when
// `timestamp` is not a number, `hash_ids` is missing or not an array, or an
// id is not an integer in [0, 2^32) (the message gives its index).
absl::StatusOr<TraceRequest> ParseTraceLine(absl::string_view line);

// Reads a whole trace; `limit` > 0 keeps only the first `limit` requests.
// Errors name the file and the 1-based line number. Also rejects a trace
// whose ids would overflow 32-bit tokens at `page_size` (the message gives
// the largest id and the limit).
absl::StatusOr<Trace> LoadTrace(const std::string& path, uint32_t page_size,
                                uint64_t limit = 0);

// Writes the tokens of `hash_ids` (id h -> h * page_size + j) to the front
// of `buf` and returns them. `buf` is scratch space reused between calls: it
// only grows (never shrinks, so steady state neither allocates nor
// zero-fills), and its contents past the returned span are unspecified.
absl::Span<const uint32_t> FillTokens(absl::Span<const uint32_t> hash_ids,
                                      uint32_t page_size,
                                      std::vector<uint32_t>* buf);

}  // namespace radixkv::bench

#endif  // RADIXKV_BENCH_REPLAY_TRACE_H_
