#include "daemon/rpc/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace radixkv::daemon {
namespace {

prometheus::MetricFamily Gauge(const char* name, const char* help,
                               prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
  return f;
}

// Fields 14 (utime), 15 (stime) and 22 (starttime) of /proc/self/stat, in
// clock ticks. The second field (comm) may hold spaces: parse after ')'.
bool ReadStat(double* cpu_ticks, double* start_ticks) {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
    if (i == 22) {
      *start_ticks = std::stod(field);
      *cpu_ticks = utime + stime;
      return true;
    }
  }
  return false;
}

// The boot time in seconds since the epoch (btime of /proc/stat).
bool BootTime(double* seconds) {
  std::ifstream in("/proc/stat");
  std::string key;
  while (in >> key) {
    if (key == "btime") return static_cast<bool>(in >> *seconds);
    in.ignore(1 << 20, '\n');
  }
  return false;
}

int OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory stream's own descriptor
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessFamilies() {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  double cpu = 0, start = 0, boot = 0;
  if (ticks > 0 && ReadStat(&cpu, &start)) {
    out.push_back(Gauge("process_cpu_seconds_total",
                        "Total user and system CPU time spent in seconds.",
                        MetricType::Counter, cpu / ticks));
    if (BootTime(&boot)) {
      out.push_back(Gauge("process_start_time_seconds",
                          "Start time of the process since unix epoch in "
                          "seconds.",
                          MetricType::Gauge, boot + start / ticks));
    }
  }
  long pages_virtual = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages_virtual, &pages_resident) == 2) {
      const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
      out.push_back(Gauge("process_virtual_memory_bytes",
                          "Virtual memory size in bytes.", MetricType::Gauge,
                          pages_virtual * page));
      out.push_back(Gauge("process_resident_memory_bytes",
                          "Resident memory size in bytes.", MetricType::Gauge,
                          pages_resident * page));
    }
    std::fclose(f);
  }
  if (const int fds = OpenFds(); fds >= 0) {
    out.push_back(Gauge("process_open_fds", "Number of open file descriptors.",
                        MetricType::Gauge, fds));
  }
  struct rlimit lim = {};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    out.push_back(Gauge("process_max_fds",
                        "Maximum number of open file descriptors.",
                        MetricType::Gauge, static_cast<double>(lim.rlim_cur)));
  }
  return out;
}

prometheus::MetricFamily BuildInfoFamily() {
  prometheus::MetricFamily f =
      Gauge("radixkv_build_info",
            "1, labelled with the radixkvd release and source commit.",
            prometheus::MetricType::Gauge, 1);
  f.metric.front().label = {{"version", RADIXKV_VERSION_STRING},
                            {"commit", RADIXKV_GIT_COMMIT}};
  return f;
}

}  // namespace radixkv::daemon
