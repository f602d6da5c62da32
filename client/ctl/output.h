// File: client/ctl/output.h
//
// Formatting helpers of radixkvctl: human units, aligned tables, JSON lines.
// stdout carries data only; everything here writes to a caller-given stream.
//
// Thread safety: functions are pure or write to the given stream; Table is a
// single-owner value.
#ifndef RADIXKV_CLIENT_CTL_OUTPUT_H_
#define RADIXKV_CLIENT_CTL_OUTPUT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace radixkv::ctl {

// 1536 -> "1.5 KiB", 201326592 -> "192 MiB" (binary units, at most one
// decimal, trailing ".0" dropped).
std::string HumanBytes(uint64_t bytes);
// 999 -> "999", 1234 -> "1.2k", 5600000 -> "5.6M".
std::string HumanCount(uint64_t n);
// Seconds -> "850ms", "12s", "3m4s", "2h5m", "3d4h".
std::string HumanDuration(double seconds);
// 0.8312 -> "83.1%"; "-" when the denominator is 0.
std::string Percent(uint64_t part, uint64_t whole);
// Lowercase hex of raw bytes; `max_chars` > 0 cuts it (for table columns).
std::string Hex(absl::string_view bytes, size_t max_chars = 0);

// The protobuf JSON form of `message` on one line: proto field names
// (snake_case, as in the .proto), every primitive field printed even when it
// is zero, enums by name, 64-bit integers as strings and bytes as base64
// (the protobuf JSON mapping).
std::string ToJsonLine(const google::protobuf::Message& message);

// A text table with aligned columns: left-aligned unless marked with
// AlignRight (numbers).
//
//   Table t({"KEY", "PAGES"});
//   t.AlignRight({1});
//   t.AddRow({"abc", "12"});
//   t.Print(std::cout);
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void AlignRight(std::vector<size_t> columns);
  void AddRow(std::vector<std::string> row);
  size_t rows() const { return rows_.size(); }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// "name:  value" lines with the values aligned.
class KeyValueList {
 public:
  void Add(std::string key, std::string value);
  void Print(std::ostream& out) const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

}  // namespace radixkv::ctl

#endif  // RADIXKV_CLIENT_CTL_OUTPUT_H_
