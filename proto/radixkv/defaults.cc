#include "radixkv/defaults.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace radixkv {

std::string UserSocketPath() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] != '\0') {
    return std::string(runtime) + "/radixkv/radixkvd.sock";
  }
  return "/tmp/radixkv-" + std::to_string(getuid()) + "/radixkvd.sock";
}

std::string DefaultSocketPath(const std::string& system_dir) {
  const std::string system = system_dir + "/radixkvd.sock";
  struct stat st;
  if (::stat(system.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return system;
  return UserSocketPath();
}

std::string DaemonDefaultSocketPath(const std::string& system_dir) {
  struct stat st;
  if (::stat(system_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
      ::access(system_dir.c_str(), W_OK | X_OK) == 0) {
    return system_dir + "/radixkvd.sock";
  }
  return UserSocketPath();
}

std::string ConnectProblem(const std::string& target, bool defaulted,
                           const std::string& system_dir) {
  static constexpr char kUnix[] = "unix:";
  if (target.compare(0, sizeof(kUnix) - 1, kUnix) != 0) return "";
  const std::string path = target.substr(sizeof(kUnix) - 1);
  std::string problem;
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    problem = "the path is longer than a Unix socket path may be (" +
              std::to_string(sizeof(addr.sun_path) - 1) + " bytes)";
  } else {
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      problem = std::strerror(errno);
    } else {
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr),
                    sizeof(addr)) != 0) {
        problem = std::strerror(errno);
      }
      ::close(fd);
    }
  }
  if (problem.empty()) return "";
  std::string out = "cannot connect to " + target + ": " + problem;
  const std::string system_socket = system_dir + "/radixkvd.sock";
  struct stat st;
  if (defaulted && path != system_socket &&
      ::stat(system_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
      ::access(system_dir.c_str(), X_OK) != 0) {
    out += "; the system daemon's directory " + system_dir +
           " exists but this user (uid " + std::to_string(getuid()) +
           ") cannot enter it, so its socket was not found: join the "
           "directory's group (e.g. radixkv) or give the endpoint";
  }
  return out;
}

std::string AttachSocketPathFor(const std::string& grpc_socket_path) {
  static constexpr char kSuffix[] = ".sock";
  const size_t n = sizeof(kSuffix) - 1;
  const size_t slash = grpc_socket_path.rfind('/');
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  if (grpc_socket_path.size() - name_start > n &&
      grpc_socket_path.compare(grpc_socket_path.size() - n, n, kSuffix) == 0) {
    return grpc_socket_path.substr(0, grpc_socket_path.size() - n) +
           ".attach.sock";
  }
  return grpc_socket_path + ".attach";
}

std::string UnixTarget(const std::string& socket_path) {
  return "unix:" + socket_path;
}

}  // namespace radixkv
