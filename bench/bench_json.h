// JSON output of radixkv's benchmark tools (loadgen, replay, gpu_bench): one
// object per line, members in the order they were added, each number
// rounded to the precision the tool reports.
//
//   BenchJson j = {{"label", label}, {"p50_us", Rounded(p50_us, 1)}};
//   std::cout << JsonLine(j) << "\n";
#ifndef RADIXKV_BENCH_BENCH_JSON_H_
#define RADIXKV_BENCH_BENCH_JSON_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "nlohmann/json.hpp"

namespace radixkv::bench {

// An object whose members keep their insertion order.
using BenchJson = nlohmann::ordered_json;

// `v` rounded to `decimals` decimal places (0: a whole number): the double
// nearest to what printf's "%.*f" writes, so the JSON shows the same digits.
inline double Rounded(double v, int decimals) {
  char buf[400];
  const int n = std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return n > 0 && n < static_cast<int>(sizeof(buf)) ? std::strtod(buf, nullptr)
                                                      : v;
}

// `v` rounded to `digits` significant digits, as printf's "%.*g".
inline double Significant(double v, int digits) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return n > 0 && n < static_cast<int>(sizeof(buf)) ? std::strtod(buf, nullptr)
                                                      : v;
}

// The compact text of `j`, without a newline. Bytes of a string that are not
// UTF-8 (a peer's error message, say) become U+FFFD.
inline std::string JsonLine(const BenchJson& j) {
  return j.dump(-1, ' ', false, BenchJson::error_handler_t::replace);
}

}  // namespace radixkv::bench

#endif  // RADIXKV_BENCH_BENCH_JSON_H_
