// File: daemon/tiers/disk_tier_io.h
//
// The disk tier's file format and its low-level I/O (docs/TIERS.md, "Disk
// tier file format and I/O"). DiskTier (disk_tier.h) owns the index and the
// threads; this file knows byte layouts, file creation and full-length
// pread/pwrite.
//
// The file `DIR/radixkv-tier.dat` is, in order:
//
//   [0, 4096)                     superblock: the layout the file was made for
//   [4096, data_offset)           header table: one 128-byte SlotHeader per slot
//   [data_offset, file_bytes)     data region: slot i at data_offset + i * stride
//
// stride is page_bytes rounded up to 4096 and data_offset is a multiple of
// 4096, so every slot's data can be read and written with O_DIRECT. All
// integers are little-endian; keys are in canonical (big-endian) form.
//
// Thread safety: pure functions, and I/O helpers that are safe from any
// thread on any fd.
#ifndef RADIXKV_DAEMON_TIERS_DISK_TIER_IO_H_
#define RADIXKV_DAEMON_TIERS_DISK_TIER_IO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "daemon/tiers/tier.h"
#include "radix/block_key.h"

namespace radixkv::daemon::disk_tier {

inline constexpr uint64_t kAlign = 4096;
inline constexpr uint64_t kSuperblockBytes = 4096;
inline constexpr size_t kSlotHeaderBytes = 128;
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr char kFileName[] = "radixkv-tier.dat";
// Slot numbers are stored in 32 bits in memory; kNoSlot is never a slot.
inline constexpr uint32_t kNoSlot = kNoTierSlot;

// Where everything lives in a file made for (bytes, page_bytes).
struct Layout {
  uint64_t page_bytes = 0;
  uint64_t stride = 0;       // page_bytes rounded up to kAlign
  uint64_t slots = 0;        // 0: the budget cannot hold one block
  uint64_t data_offset = 0;  // kSuperblockBytes + header table, kAlign-aligned
  uint64_t file_bytes = 0;   // data_offset + slots * stride <= bytes

  uint64_t HeaderOffset(uint64_t slot) const {
    return kSuperblockBytes + slot * kSlotHeaderBytes;
  }
  uint64_t DataOffset(uint64_t slot) const {
    return data_offset + slot * stride;
  }
};

// The largest layout whose file_bytes fits in `bytes`. REQUIRES: 0 <
// page_bytes <= kMaxPageBytes.
inline constexpr uint64_t kMaxPageBytes = uint64_t{1} << 36;
Layout ComputeLayout(uint64_t bytes, uint64_t page_bytes);

// The smallest budget that holds one block of `page_bytes`.
uint64_t MinBytesForOneSlot(uint64_t page_bytes);

// One slot's header: the identity of the block in the slot, the XXH3-64
// of its page_bytes of data, and a sequence number that grows with every
// write to the file (the newest of two headers with one key wins).
struct SlotHeader {
  BlockKey key;
  BlockKey parent_key;
  BlockKey root;
  uint32_t depth = 0;
  uint64_t page_bytes = 0;
  uint64_t data_checksum = 0;
  uint64_t sequence = 0;
  uint64_t slot = 0;
};

// Writes the 128-byte form, its last 8 bytes the XXH3-64 of the first 120.
void EncodeSlotHeader(const SlotHeader& h, char out[kSlotHeaderBytes]);
// False unless magic, version and header hash are right (a zeroed or torn
// header is invalid).
bool DecodeSlotHeader(const char in[kSlotHeaderBytes], SlotHeader* out);

// XXH3-64 of a block's data, as stored in its header (BlockChecksum).
inline uint64_t DataChecksum(const void* data, size_t n) {
  return BlockChecksum(data, n);
}

// A kAlign-aligned heap buffer (for O_DIRECT); freed on destruction.
struct AlignedFree {
  void operator()(char* p) const;
};
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;
// REQUIRES: bytes is a multiple of kAlign. Aborts when out of memory.
AlignedBuffer AllocateAligned(size_t bytes);

// Reads or writes exactly n bytes at `offset`, retrying on EINTR and short
// transfers. 0 on success, else an errno value (EIO for a read that ends
// early at end of file).
int PreadFull(int fd, void* buf, size_t n, uint64_t offset);
int PwriteFull(int fd, const void* buf, size_t n, uint64_t offset);

// The open tier file. `meta_fd` is buffered I/O (superblock, headers) and
// holds the file's exclusive flock; `data_fd` is O_DIRECT when `direct`.
// Both are owned by the caller, who closes them.
struct TierFile {
  std::string file_path;
  int meta_fd = -1;
  int data_fd = -1;
  bool direct = false;
  // The file was created or reset now: its header table is all zeros.
  bool fresh = false;
};

// Checks `dir`, opens or creates DIR/radixkv-tier.dat, takes its lock, and
// resets it (truncate, fallocate, new superblock, with a log line when it
// held a file of another layout) unless its superblock matches `layout`.
// Errors name "--tier=disk": INVALID_ARGUMENT for a missing path or one
// that is not a directory; FAILED_PRECONDITION when the directory is not
// writable, the file is locked by another process, or the filesystem cannot
// hold layout.file_bytes.
absl::StatusOr<TierFile> OpenTierFile(const std::string& dir,
                                      const Layout& layout, bool direct_io);

// Reads the header table in large chunks and calls `fn(slot, header)` for
// every header that decodes and matches the layout (page_bytes, slot
// number). An I/O error stops the scan and is returned as an errno value.
int ScanSlotHeaders(int meta_fd, const Layout& layout,
                    absl::FunctionRef<void(uint32_t, const SlotHeader&)> fn);

}  // namespace radixkv::daemon::disk_tier

#endif  // RADIXKV_DAEMON_TIERS_DISK_TIER_IO_H_
