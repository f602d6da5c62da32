// File: tests/client/daemon_process.h
//
// DaemonProcess: a radixkvd child process on a short /tmp Unix socket, for
// tests that need a live daemon they can kill, restart, stop and continue.
// Readiness is "a gRPC channel to the socket connects", polled with a
// generous deadline (the test machine is a loaded 2-core box).
//
// Thread safety: not thread-safe; one test thread drives it.
#ifndef RADIXKV_TESTS_CLIENT_DAEMON_PROCESS_H_
#define RADIXKV_TESTS_CLIENT_DAEMON_PROCESS_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "radixkv/defaults.h"

namespace radixkv::testing {

// A socket path unique to this process and `tag`: /tmp/rkc_<pid>_<tag>.sock.
inline std::string TestSocketPath(const std::string& tag) {
  return absl::StrCat("/tmp/rkc_", getpid(), "_", tag, ".sock");
}

class DaemonProcess {
 public:
  DaemonProcess(std::string binary, std::string socket,
                std::string pool = "host,bytes=8MiB")
      : binary_(std::move(binary)),
        socket_(std::move(socket)),
        pool_(std::move(pool)) {}
  // Kills the daemon and removes its sockets and log (a killed daemon leaves
  // them behind).
  ~DaemonProcess() {
    Kill(SIGKILL);
    unlink(socket_.c_str());
    unlink(AttachSocketPathFor(socket_).c_str());
    unlink((socket_ + ".log").c_str());
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& socket() const { return socket_; }
  // Flags added to the command line of the next Start.
  void set_extra_flags(std::vector<std::string> flags) {
    extra_flags_ = std::move(flags);
  }
  pid_t pid() const { return pid_; }

  // Starts radixkvd and waits until its socket accepts gRPC connections.
  absl::Status Start(absl::Duration timeout = absl::Seconds(60)) {
    if (pid_ > 0) return absl::FailedPreconditionError("already running");
    const std::string log = socket_ + ".log";
    std::vector<std::string> args = {binary_,
                                     "--socket=" + socket_,
                                     "--metrics_listen=",
                                     "--pool=" + pool_,
                                     "--shutdown_grace=1s"};
    args.insert(args.end(), extra_flags_.begin(), extra_flags_.end());
    pid_ = fork();
    if (pid_ < 0) return absl::InternalError("fork failed");
    if (pid_ == 0) {
      FILE* f = freopen(log.c_str(), "a", stdout);
      (void)f;
      dup2(STDOUT_FILENO, STDERR_FILENO);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(
            absl::StrCat("radixkvd exited during start; see ", log));
      }
      auto channel = grpc::CreateChannel("unix:" + socket_,
                                         grpc::InsecureChannelCredentials());
      if (channel->WaitForConnected(
              absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)))) {
        return absl::OkStatus();
      }
    }
    Kill(SIGKILL);
    return absl::DeadlineExceededError(
        absl::StrCat("radixkvd did not listen on ", socket_, " within ",
                     absl::FormatDuration(timeout), "; see ", log));
  }

  // Sends `sig` and, for terminating signals, reaps the process. A stopped
  // daemon is continued first, except for SIGKILL, which ends it where it
  // stopped (no request in flight is answered).
  void Kill(int sig) {
    if (pid_ <= 0) return;
    if (stopped_ && sig != SIGKILL) ::kill(pid_, SIGCONT);
    stopped_ = false;
    ::kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // SIGSTOP, and returns only once the whole process has stopped (kill()
  // alone returns before the daemon's threads actually halt).
  void Stop() {
    if (pid_ <= 0 || ::kill(pid_, SIGSTOP) != 0) return;
    int status = 0;
    while (waitpid(pid_, &status, WUNTRACED) == pid_ && !WIFSTOPPED(status)) {
    }
    stopped_ = true;
  }
  void Continue() {
    if (pid_ > 0 && ::kill(pid_, SIGCONT) == 0) stopped_ = false;
  }

 private:
  std::string binary_;
  std::string socket_;
  std::string pool_;
  std::vector<std::string> extra_flags_;
  pid_t pid_ = -1;
  bool stopped_ = false;
};

}  // namespace radixkv::testing

#endif  // RADIXKV_TESTS_CLIENT_DAEMON_PROCESS_H_
