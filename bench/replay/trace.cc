// File: bench/replay/trace.cc
#include "bench/replay/trace.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace radixkv::bench {
namespace {

// Position just after `"field":` (and any spaces) or npos.
size_t FindValue(absl::string_view line, absl::string_view field) {
  const std::string quoted = absl::StrCat("\"", field, "\"");
  size_t pos = line.find(quoted);
  if (pos == absl::string_view::npos) return pos;
  pos += quoted.size();
  while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
  if (pos >= line.size() || line[pos] != ':') return absl::string_view::npos;
  ++pos;
  while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
  return pos;
}

}  // namespace

absl::StatusOr<TraceRequest> ParseTraceLine(absl::string_view line) {
  TraceRequest req;
  size_t ts = FindValue(line, "timestamp");
  if (ts != absl::string_view::npos) {
    size_t end = ts;
    while (end < line.size() &&
           (absl::ascii_isdigit(line[end]) || line[end] == '-' || line[end] == '.')) {
      ++end;
    }
    double v = 0;
    if (!absl::SimpleAtod(line.substr(ts, end - ts), &v)) {
      return absl::InvalidArgumentError("field 'timestamp' is not a number");
    }
    req.timestamp_ms = static_cast<int64_t>(v);
  }
  size_t pos = FindValue(line, "hash_ids");
  if (pos == absl::string_view::npos || line[pos] != '[') {
    return absl::InvalidArgumentError("field 'hash_ids' (a JSON array) is missing");
  }
  size_t close = line.find(']', pos);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("field 'hash_ids' has no closing ']'");
  }
  absl::string_view body = line.substr(pos + 1, close - pos - 1);
  while (!body.empty()) {
    size_t comma = body.find(',');
    absl::string_view item = absl::StripAsciiWhitespace(body.substr(0, comma));
    uint64_t id = 0;
    if (!item.empty() || comma != absl::string_view::npos) {
      if (!absl::SimpleAtoi(item, &id) ||
          id > std::numeric_limits<uint32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat("field 'hash_ids' holds '", item,
                         "', not an integer in [0, 2^32)"));
      }
      req.hash_ids.push_back(static_cast<uint32_t>(id));
    }
    if (comma == absl::string_view::npos) break;
    body.remove_prefix(comma + 1);
  }
  return req;
}

absl::StatusOr<Trace> LoadTrace(const std::string& path, uint32_t page_size,
                                uint64_t limit) {
  if (page_size == 0) {
    return absl::InvalidArgumentError("page_size must be > 0");
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace ", path));
  Trace trace;
  // A block is named by its whole path: (index of the parent path, id).
  absl::flat_hash_set<std::pair<uint64_t, uint32_t>> seen;
  std::string line;
  uint64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<TraceRequest> req = ParseTraceLine(line);
    if (!req.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": ", req.status().message()));
    }
    uint64_t parent = 0;
    for (uint32_t id : req->hash_ids) {
      // Path identity: hash of (parent path, id); collisions here would only
      // undercount distinct blocks, which is used for sizing, never results.
      uint64_t node = absl::HashOf(parent, id) | 1;
      seen.insert({parent, id});
      parent = node;
      trace.max_hash_id = std::max(trace.max_hash_id, id);
    }
    trace.total_blocks += req->hash_ids.size();
    trace.max_blocks = std::max<uint32_t>(trace.max_blocks, req->hash_ids.size());
    trace.requests.push_back(*std::move(req));
    if (limit > 0 && trace.requests.size() >= limit) break;
  }
  trace.distinct_blocks = seen.size();
  const uint64_t max_token =
      (static_cast<uint64_t>(trace.max_hash_id) + 1) * page_size - 1;
  if (max_token > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": hash id ", trace.max_hash_id, " times page_size ", page_size,
        " does not fit a 32-bit token (limit ",
        std::numeric_limits<uint32_t>::max() / page_size, " ids)"));
  }
  return trace;
}

absl::Span<const uint32_t> FillTokens(absl::Span<const uint32_t> hash_ids,
                                      uint32_t page_size,
                                      std::vector<uint32_t>* buf) {
  const size_t n = hash_ids.size() * static_cast<size_t>(page_size);
  if (buf->size() < n) buf->resize(std::max(n, 2 * buf->size()));
  uint32_t* p = buf->data();
  for (uint32_t id : hash_ids) {
    const uint32_t base = id * page_size;
    for (uint32_t j = 0; j < page_size; ++j) p[j] = base + j;
    p += page_size;
  }
  return absl::MakeConstSpan(buf->data(), n);
}

}  // namespace radixkv::bench
