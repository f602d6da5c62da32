// File: bench/replay/trace.cc
#include "bench/replay/trace.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace radixkv::bench {
namespace {

using Json = nlohmann::json;

// The reason from a parse_error's text ("[json.exception.parse_error.101]
// parse error at line 1, column 7: <reason>"), or the whole text.
std::string ParseErrorReason(const Json::parse_error& e) {
  const std::string what = e.what();
  const size_t column = what.find("column ");
  const size_t colon =
      column == std::string::npos ? column : what.find(": ", column);
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

absl::Status ParseTimestamp(const Json& v, TraceRequest* req) {
  // A number outside int64_t's range (casting such a double is undefined).
  const auto out_of_range = [&v] {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'timestamp' is ", v.dump(), ", outside the 64-bit range"));
  };
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
      return out_of_range();
    }
    req->timestamp_ms = v.get<int64_t>();
  } else if (v.is_number_integer()) {
    req->timestamp_ms = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double ms = v.get<double>();
    if (!(ms > -0x1p63 && ms < 0x1p63)) return out_of_range();
    req->timestamp_ms = static_cast<int64_t>(ms);
  } else {
    return absl::InvalidArgumentError("field 'timestamp' is not a number");
  }
  return absl::OkStatus();
}

absl::Status ParseHashIds(const Json& v, TraceRequest* req) {
  if (!v.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'hash_ids' is a JSON ", v.type_name(), ", not an array"));
  }
  req->hash_ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& id = v[i];
    // Non-negative integers parse as number_unsigned; negative ones as
    // number_integer, fractions as number_float.
    if (!id.is_number_unsigned() ||
        id.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'hash_ids' holds '", id.dump(), "' at index ", i,
          ", not an integer in [0, 2^32)"));
    }
    req->hash_ids.push_back(static_cast<uint32_t>(id.get<uint64_t>()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TraceRequest> ParseTraceLine(absl::string_view line) {
  Json j;
  try {
    j = Json::parse(line.begin(), line.end());
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not valid JSON at column ", e.byte, ": ", ParseErrorReason(e)));
  } catch (const Json::out_of_range& e) {
    // A number beyond a double's range, such as 1e999.
    return absl::InvalidArgumentError(
        absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the line is a JSON ", j.type_name(), ", not an object"));
  }
  TraceRequest req;
  if (const auto ts = j.find("timestamp"); ts != j.end()) {
    if (absl::Status s = ParseTimestamp(*ts, &req); !s.ok()) return s;
  }
  const auto ids = j.find("hash_ids");
  if (ids == j.end()) {
    return absl::InvalidArgumentError(
        "field 'hash_ids' (a JSON array) is missing");
  }
  if (absl::Status s = ParseHashIds(*ids, &req); !s.ok()) return s;
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
