#include "client/ctl/output.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace radixkv::ctl {
namespace {

// One decimal, dropping a trailing ".0".
std::string OneDecimal(double v) {
  std::string s = absl::StrFormat("%.1f", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB",
                                           "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  return absl::StrCat(OneDecimal(v), " ", kUnits[unit]);
}

std::string HumanCount(uint64_t n) {
  if (n < 1000) return absl::StrCat(n);
  static constexpr const char* kUnits[] = {"", "k", "M", "G", "T", "P"};
  double v = static_cast<double>(n);
  int unit = 0;
  while (v >= 1000 && unit < 5) {
    v /= 1000;
    ++unit;
  }
  return absl::StrCat(OneDecimal(v), kUnits[unit]);
}

std::string HumanDuration(double seconds) {
  if (!(seconds >= 0)) return "-";
  if (seconds < 1) return absl::StrCat(static_cast<int64_t>(seconds * 1000), "ms");
  const auto s = static_cast<int64_t>(seconds);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m", s % 60, "s");
  if (s < 86400) return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
  return absl::StrCat(s / 86400, "d", (s % 86400) / 3600, "h");
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) /
                                       static_cast<double>(whole));
}

std::string Hex(absl::string_view bytes, size_t max_chars) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  if (max_chars > 0 && out.size() > max_chars) out.resize(max_chars);
  return out;
}

std::string ToJsonLine(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    nlohmann::ordered_json error;
    error["error"] =
        absl::StrCat("cannot print ", message.GetTypeName(), " as JSON");
    return error.dump();
  }
  return out;
}

Table::Table(std::vector<std::string> header)
    : header_(std::move(header)), right_(header_.size(), false) {}

void Table::AlignRight(std::vector<size_t> columns) {
  for (size_t c : columns) {
    if (c < right_.size()) right_[c] = true;
  }
}

void Table::AddRow(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = width[c] - row[c].size();
      const bool last = c + 1 == row.size();
      if (right_[c]) {
        line.append(pad, ' ');
        line += row[c];
      } else {
        line += row[c];
        if (!last) line.append(pad, ' ');
      }
      if (!last) line += "  ";
    }
    out << line << "\n";
  };
  print_row(header_);
  for (const auto& row : rows_) print_row(row);
}

void KeyValueList::Add(std::string key, std::string value) {
  items_.emplace_back(std::move(key), std::move(value));
}

void KeyValueList::Print(std::ostream& out) const {
  size_t width = 0;
  for (const auto& [k, v] : items_) width = std::max(width, k.size());
  for (const auto& [k, v] : items_) {
    out << k << ":" << std::string(width - k.size() + 2, ' ') << v << "\n";
  }
}

}  // namespace radixkv::ctl
