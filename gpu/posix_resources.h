// File: gpu/posix_resources.h
//
// Move-only RAII owners for the POSIX resources the pools are built from:
//
//   UniqueFd       owns one file descriptor; closes it on destruction.
//   SharedMapping  owns one mmap(MAP_SHARED) of a file descriptor; unmaps it
//                  on destruction.
//
//   ASSIGN_OR_RETURN-style use:
//     absl::StatusOr<SharedMapping> m = SharedMapping::Map(fd.get(), bytes);
//     if (!m.ok()) return m.status();
//     memset(m->data(), 0, m->size());
//
// Thread safety: instances are not synchronised; a const instance may be read
// from any thread. Destructors never throw and ignore close/munmap errors.
#ifndef RADIXKV_GPU_POSIX_RESOURCES_H_
#define RADIXKV_GPU_POSIX_RESOURCES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace radixkv::gpu {

// An INTERNAL (or errno-specific) status "<what>: <strerror(err)>".
absl::Status ErrnoStatus(absl::string_view what, int err);

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership; the caller must close the returned fd.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes the owned fd (if any) and takes ownership of `fd`.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

class SharedMapping {
 public:
  SharedMapping() = default;
  ~SharedMapping() { reset(); }
  SharedMapping(SharedMapping&& other) noexcept
      : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  // Maps `bytes` bytes of `fd` from offset 0, PROT_READ|PROT_WRITE,
  // MAP_SHARED. The mapping does not keep `fd` open. Errors: INVALID_ARGUMENT
  // for bytes == 0; INTERNAL with errno text when mmap fails.
  static absl::StatusOr<SharedMapping> Map(int fd, uint64_t bytes);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  void reset();

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Creates an anonymous memory file (memfd_create, MFD_CLOEXEC) named `name`
// of exactly `bytes` bytes (ftruncate). INTERNAL with errno text on failure.
absl::StatusOr<UniqueFd> CreateMemfd(const char* name, uint64_t bytes);

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_POSIX_RESOURCES_H_
