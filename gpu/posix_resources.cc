// File: gpu/posix_resources.cc
#include "gpu/posix_resources.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace radixkv::gpu {

absl::Status ErrnoStatus(absl::string_view what, int err) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      return absl::UnavailableError(msg);
    case EAGAIN:
    case ETIMEDOUT:
      return absl::DeadlineExceededError(msg);
    default:
      return absl::InternalError(msg);
  }
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);
  fd_ = fd;
}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

absl::StatusOr<SharedMapping> SharedMapping::Map(int fd, uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("mmap: mapping size must be > 0");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return ErrnoStatus(absl::StrCat("mmap of ", bytes, " bytes (fd ", fd, ")"),
                       errno);
  }
  SharedMapping m;
  m.data_ = p;
  m.size_ = bytes;
  return m;
}

void SharedMapping::reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<UniqueFd> CreateMemfd(const char* name, uint64_t bytes) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(absl::StrCat("ftruncate of memfd to ", bytes, " bytes"),
                       errno);
  }
  return fd;
}

}  // namespace radixkv::gpu
