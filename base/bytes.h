#ifndef RADIXKV_BASE_BYTES_H_
#define RADIXKV_BASE_BYTES_H_

// Byte counts in the units people read, for messages and the CLI.

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace radixkv {

// "512 B", "1.5 KiB", "64 GiB", "12.3 GiB": binary units, one decimal,
// a trailing ".0" dropped.
inline std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B",   "KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  std::string s = absl::StrFormat("%.1f", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) {
    s.resize(s.size() - 2);
  }
  return absl::StrCat(s, " ", kUnits[unit]);
}

}  // namespace radixkv

#endif  // RADIXKV_BASE_BYTES_H_
