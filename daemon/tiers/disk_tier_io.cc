// File: daemon/tiers/disk_tier_io.cc
#include "daemon/tiers/disk_tier_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/log.h"

namespace radixkv::daemon::disk_tier {
namespace {

constexpr uint64_t kSlotMagic = 0x544f4c5354564b52ull;   // "RKVTSLOT"
constexpr uint64_t kSuperMagic = 0x5250555354564b52ull;  // "RKVTSUPR"
constexpr size_t kSuperblockUsed = 64;
constexpr size_t kHashedHeaderBytes = kSlotHeaderBytes - 8;
constexpr size_t kScanChunkBytes = 4 << 20;

uint64_t RoundUp(uint64_t n, uint64_t align) {
  return (n + align - 1) / align * align;
}

void Put32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void Put64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
BlockKey GetKey(const char* p) {
  return BlockKey::FromCanonical(absl::string_view(p, BlockKey::kBytes));
}

uint64_t HeaderTableBytes(uint64_t slots) {
  return RoundUp(slots * kSlotHeaderBytes, kAlign);
}

// The superblock's 64 bytes: magic, version, header size, page_bytes,
// stride, slots, data_offset, XXH3-64 of the first 56 bytes.
void EncodeSuperblock(const Layout& l, char out[kSuperblockUsed]) {
  std::memset(out, 0, kSuperblockUsed);
  Put64(out, kSuperMagic);
  Put32(out + 8, kFormatVersion);
  Put32(out + 12, kSlotHeaderBytes);
  Put64(out + 16, l.page_bytes);
  Put64(out + 24, l.stride);
  Put64(out + 32, l.slots);
  Put64(out + 40, l.data_offset);
  Put64(out + 56, XXH3_64bits(out, 56));
}

// True when the superblock is valid; then fills *page_bytes and *slots and
// sets *matches when everything equals `l`.
bool DecodeSuperblock(const char in[kSuperblockUsed], const Layout& l,
                      uint64_t* page_bytes, uint64_t* slots, bool* matches) {
  if (Get64(in) != kSuperMagic || Get64(in + 56) != XXH3_64bits(in, 56)) {
    return false;
  }
  *page_bytes = Get64(in + 16);
  *slots = Get64(in + 32);
  *matches = Get32(in + 8) == kFormatVersion &&
             Get32(in + 12) == kSlotHeaderBytes && *page_bytes == l.page_bytes &&
             Get64(in + 24) == l.stride && *slots == l.slots &&
             Get64(in + 40) == l.data_offset;
  return true;
}

absl::Status Precondition(const std::string& what, int err) {
  return absl::FailedPreconditionError(
      absl::StrCat("--tier=disk: ", what, ": ", std::strerror(err)));
}

// Empties the file and allocates layout.file_bytes of zeros, after checking
// that the filesystem has room; then writes the superblock and syncs.
absl::Status ResetFile(const std::string& dir, const TierFile& f,
                       const Layout& layout) {
  if (ftruncate(f.meta_fd, 0) != 0) {
    return Precondition(absl::StrCat("cannot truncate ", f.file_path), errno);
  }
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) == 0) {
    uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < layout.file_bytes) {
      // A configuration error (radixkvd exits 2): a restart cannot fit it.
      return absl::InvalidArgumentError(absl::StrCat(
          "--tier=disk,path=", dir, ": the tier file needs ",
          HumanBytes(layout.file_bytes),
          " (the bytes= option), the filesystem has ", HumanBytes(avail),
          " free; lower bytes= or free space"));
    }
  }
  if (fallocate(f.meta_fd, 0, 0, static_cast<off_t>(layout.file_bytes)) != 0) {
    int err = errno;
    if (err == EOPNOTSUPP) {
      if (ftruncate(f.meta_fd, static_cast<off_t>(layout.file_bytes)) != 0) {
        return Precondition(absl::StrCat("cannot size ", f.file_path), errno);
      }
    } else if (err == ENOSPC) {
      (void)ftruncate(f.meta_fd, 0);  // give back what was allocated
      return absl::InvalidArgumentError(absl::StrCat(
          "--tier=disk,path=", dir, ": the filesystem cannot hold the tier "
          "file's ", HumanBytes(layout.file_bytes),
          " (the bytes= option); lower bytes= or free space"));
    } else {
      (void)ftruncate(f.meta_fd, 0);  // give back what was allocated
      return Precondition(
          absl::StrCat("the filesystem at ", dir, " cannot hold ",
                       layout.file_bytes, " bytes for ", f.file_path),
          err);
    }
  }
  char super[kSuperblockUsed];
  EncodeSuperblock(layout, super);
  int err = PwriteFull(f.meta_fd, super, sizeof(super), 0);
  if (err == 0 && fdatasync(f.meta_fd) != 0) err = errno;
  if (err != 0) {
    return Precondition(absl::StrCat("cannot write ", f.file_path), err);
  }
  return absl::OkStatus();
}

// True when the file's superblock and size match `layout`; logs why not
// when the file held something else.
bool FileMatches(const TierFile& f, const Layout& layout) {
  struct stat st;
  if (fstat(f.meta_fd, &st) != 0 || st.st_size == 0) return false;
  char super[kSuperblockUsed];
  uint64_t page_bytes = 0, slots = 0;
  bool matches = false;
  bool valid = PreadFull(f.meta_fd, super, sizeof(super), 0) == 0 &&
               DecodeSuperblock(super, layout, &page_bytes, &slots, &matches);
  if (valid && matches && static_cast<uint64_t>(st.st_size) == layout.file_bytes) {
    return true;
  }
  std::string was = valid ? absl::StrCat("was made for page_bytes=", page_bytes,
                                         " slots=", slots)
                          : std::string("has no valid superblock");
  Log(LogLevel::kWarning,
      absl::StrCat("disk tier: ", f.file_path, " ", was, " (", st.st_size,
                   " bytes); resetting it for page_bytes=", layout.page_bytes,
                   " slots=", layout.slots));
  return false;
}

// Opens the O_DIRECT data fd and proves that an aligned read works on this
// filesystem; buffered otherwise.
void OpenDataFd(const Layout& layout, bool direct_io, TierFile* f) {
  if (direct_io) {
    int fd = open(f->file_path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (fd >= 0) {
      AlignedBuffer probe = AllocateAligned(kAlign);
      if (PreadFull(fd, probe.get(), kAlign, layout.data_offset) == 0) {
        f->data_fd = fd;
        f->direct = true;
        return;
      }
      close(fd);
    }
    Log(LogLevel::kInfo, absl::StrCat("disk tier: O_DIRECT is not available "
                                      "for ", f->file_path,
                                      "; using buffered I/O"));
  }
  f->data_fd = open(f->file_path.c_str(), O_RDWR | O_CLOEXEC);
  f->direct = false;
}

}  // namespace

Layout ComputeLayout(uint64_t bytes, uint64_t page_bytes) {
  Layout l;
  l.page_bytes = page_bytes;
  l.stride = RoundUp(page_bytes, kAlign);
  uint64_t n = 0;
  if (bytes > kSuperblockBytes) {
    n = (bytes - kSuperblockBytes) / (l.stride + kSlotHeaderBytes);
  }
  n = std::min<uint64_t>(n, kNoSlot - 1);
  while (n > 0 && kSuperblockBytes + HeaderTableBytes(n) + n * l.stride > bytes) {
    --n;
  }
  l.slots = n;
  l.data_offset = kSuperblockBytes + HeaderTableBytes(n);
  l.file_bytes = l.data_offset + n * l.stride;
  return l;
}

uint64_t MinBytesForOneSlot(uint64_t page_bytes) {
  return kSuperblockBytes + HeaderTableBytes(1) + RoundUp(page_bytes, kAlign);
}

void EncodeSlotHeader(const SlotHeader& h, char out[kSlotHeaderBytes]) {
  std::memset(out, 0, kSlotHeaderBytes);
  Put64(out, kSlotMagic);
  Put32(out + 8, kFormatVersion);
  Put32(out + 12, h.depth);
  Put64(out + 16, h.page_bytes);
  h.key.ToCanonical(out + 24);
  h.parent_key.ToCanonical(out + 40);
  h.root.ToCanonical(out + 56);
  Put64(out + 72, h.data_checksum);
  Put64(out + 80, h.sequence);
  Put64(out + 88, h.slot);
  Put64(out + kHashedHeaderBytes, XXH3_64bits(out, kHashedHeaderBytes));
}

bool DecodeSlotHeader(const char in[kSlotHeaderBytes], SlotHeader* out) {
  if (Get64(in) != kSlotMagic || Get32(in + 8) != kFormatVersion ||
      Get64(in + kHashedHeaderBytes) != XXH3_64bits(in, kHashedHeaderBytes)) {
    return false;
  }
  out->depth = Get32(in + 12);
  out->page_bytes = Get64(in + 16);
  out->key = GetKey(in + 24);
  out->parent_key = GetKey(in + 40);
  out->root = GetKey(in + 56);
  out->data_checksum = Get64(in + 72);
  out->sequence = Get64(in + 80);
  out->slot = Get64(in + 88);
  return true;
}

void AlignedFree::operator()(char* p) const { std::free(p); }

AlignedBuffer AllocateAligned(size_t bytes) {
  void* p = std::aligned_alloc(kAlign, bytes);
  if (p == nullptr) std::abort();
  return AlignedBuffer(static_cast<char*>(p));
}

namespace {

// Calls io (pread or pwrite) until all n bytes at p moved, retrying EINTR
// and short transfers. 0, the errno, or EIO when the file ends first.
template <typename Char, typename Io>
int FullIo(Io io, int fd, Char* p, size_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t r = io(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return 0;
}

}  // namespace

int PreadFull(int fd, void* buf, size_t n, uint64_t offset) {
  return FullIo(pread, fd, static_cast<char*>(buf), n, offset);
}

int PwriteFull(int fd, const void* buf, size_t n, uint64_t offset) {
  return FullIo(pwrite, fd, static_cast<const char*>(buf), n, offset);
}

absl::StatusOr<TierFile> OpenTierFile(const std::string& dir,
                                      const Layout& layout, bool direct_io) {
  struct stat st;
  if (dir.empty() || stat(dir.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier=disk: path '", dir, "' does not exist",
        dir.empty() ? "" : absl::StrCat(" (", std::strerror(errno), ")")));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tier=disk: path '", dir, "' is not a directory"));
  }
  TierFile f;
  f.file_path = absl::StrCat(dir, dir.back() == '/' ? "" : "/", kFileName);
  f.meta_fd = open(f.file_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (f.meta_fd < 0) {
    return Precondition(absl::StrCat("directory '", dir,
                                     "' is not writable (cannot create ",
                                     f.file_path, ")"),
                        errno);
  }
  auto fail = [&f](absl::Status s) {
    close(f.meta_fd);
    return s;
  };
  if (flock(f.meta_fd, LOCK_EX | LOCK_NB) != 0) {
    return fail(Precondition(
        absl::StrCat(f.file_path, " is in use by another process"), errno));
  }
  if (!FileMatches(f, layout)) {
    absl::Status s = ResetFile(dir, f, layout);
    if (!s.ok()) return fail(s);
    f.fresh = true;
  }
  OpenDataFd(layout, direct_io, &f);
  if (f.data_fd < 0) {
    return fail(Precondition(absl::StrCat("cannot open ", f.file_path), errno));
  }
  return f;
}

int ScanSlotHeaders(int meta_fd, const Layout& layout,
                    absl::FunctionRef<void(uint32_t, const SlotHeader&)> fn) {
  std::vector<char> chunk;
  const uint64_t per_chunk = kScanChunkBytes / kSlotHeaderBytes;
  for (uint64_t first = 0; first < layout.slots; first += per_chunk) {
    uint64_t count = std::min(per_chunk, layout.slots - first);
    chunk.resize(count * kSlotHeaderBytes);
    int err = PreadFull(meta_fd, chunk.data(), chunk.size(),
                        layout.HeaderOffset(first));
    if (err != 0) return err;
    for (uint64_t i = 0; i < count; ++i) {
      SlotHeader h;
      if (!DecodeSlotHeader(chunk.data() + i * kSlotHeaderBytes, &h)) continue;
      if (h.page_bytes != layout.page_bytes || h.slot != first + i) continue;
      fn(static_cast<uint32_t>(first + i), h);
    }
  }
  return 0;
}

}  // namespace radixkv::daemon::disk_tier
