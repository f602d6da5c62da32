// File: client/ctl/output.h
//
// Formatting helpers of radixkvctl: human units, aligned tables, JSON lines,
// shell completion scripts.
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

// The JSON form of `message` on one line, for scripts: protobuf's JSON
// printer (proto field names, snake_case as in the .proto; every primitive
// and repeated field printed even when zero or empty; enums by name), then
// rewritten by the message's descriptor so that 64-bit integers are JSON
// numbers (exact decimal digits) and bytes fields (keys, namespace ids) are
// lowercase hex, as the text output and `hash` print them. Messages of the
// google.protobuf package keep their protobuf JSON form.
std::string ToJsonLine(const google::protobuf::Message& message);

// Whether tables written to `out` print their header row and the summary
// lines around them: on unless turned off (--no-headers). The setting lives
// in the stream's state (std::ios_base::iword), as std::boolalpha does.
void SetHeaders(std::ostream& out, bool on);
bool Headers(std::ostream& out);

// A text table with aligned columns: left-aligned unless marked with
// AlignRight (numbers). The header row is left out where Headers(out) is
// false.
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

// ---- shell completion ----------------------------------------------------
//
// The command line as completion scripts see it; main builds it from the
// CLI11 app, so that the scripts offer exactly what the parser accepts.

// A flag or a positional argument.
struct CompletionItem {
  std::vector<std::string> names;   // "-o", "--output"; positional: its name
  bool takes_value = false;         // flags only
  std::string help;                 // one line
  std::vector<std::string> values;  // the words offered for its value
  bool paths = false;               // file names are offered instead
};

struct CompletionCommand {
  std::string name;
  std::string summary;
  std::vector<CompletionItem> flags;
  std::vector<CompletionItem> positionals;
};

struct CompletionModel {
  std::vector<CompletionItem> globals;  // flags valid before or after a command
  std::vector<CompletionCommand> commands;
};

// A bash script that defines _radixkvctl and registers it with `complete`.
std::string BashCompletion(const CompletionModel& model);
// A zsh script (#compdef radixkvctl): sourced after compinit, or autoloaded
// from $fpath as _radixkvctl.
std::string ZshCompletion(const CompletionModel& model);
// A fish script of `complete -c radixkvctl` lines: sourced, or saved as
// radixkvctl.fish in a directory of $fish_complete_path.
std::string FishCompletion(const CompletionModel& model);

}  // namespace radixkv::ctl

#endif  // RADIXKV_CLIENT_CTL_OUTPUT_H_
