#include "radixkv/defaults.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
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
