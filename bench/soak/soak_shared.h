// File: bench/soak/soak_shared.h
//
// The soak's shared state: one file (on tmpfs) that every soak_worker and
// the driver (bench/soak/soak.py, which reads the same layout with Python's
// struct module) map. It holds one slot per worker position: the phase the
// worker is in right now (so the driver can signal it mid-Acquire,
// mid-write or mid-Commit) and counters that survive the worker being
// killed and restarted in the slot; then a table of commit records per
// page of the pool.
//
// A commit record says "owner O, generation G wrote block key K into page P
// and is committing it" (state kPending, written before the Commit call),
// then whether the Commit inserted that page (kCommitted) or not (kFailed:
// refused, expired or deduplicated). A Commit whose answer never arrived
// (its deadline passed while the worker was stopped, say) may have been
// applied: its records stay kPending, which names that writer as a
// possible committer. That is safe: a page is handed to a writer only once
// the previous holder can no longer write it, so a newer writer of the page
// publishes a newer record. Each page keeps its last
// kRecordsPerPage records, appended through a per-page counter. Readers
// use them to name the committer of a block they hit: the newest record for
// (P, K) that is not kFailed, where P is the page the block's bytes were
// written into (its stamp names it; a block promoted from a lower tier
// comes back in another page). A block's bytes exist in one place only, and
// only while its key is cached, so a newer record for (P, K) means the
// bytes read are not the committer's. A page holds no record newer than its
// current content's until that content is evicted (only the holder of a
// WRITING page records), and Commit start times are CLOCK_MONOTONIC, which
// every process shares. Records are published with a sequence word (odd
// while being written), so a reader skips one a killed writer left half
// written.
//
// Layout (all integers little-endian, offsets in bytes):
//   header          kHeaderBytes: u32 magic, u32 slots, u32 pages
//   slot s          at kHeaderBytes + s * sizeof(SlotHeader)
//   page p's table  at TableOffset(slots) + p * sizeof(PageRecords)
//
// Thread safety: fields are read and written with atomics from many
// processes; counters only grow.
#ifndef RADIXKV_BENCH_SOAK_SOAK_SHARED_H_
#define RADIXKV_BENCH_SOAK_SOAK_SHARED_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace radixkv::soak {

inline constexpr uint32_t kMagic = 0x534b5652;  // "RVKS"
inline constexpr size_t kHeaderBytes = 64;

// Where a worker is; the driver aims its signals by these.
enum Phase : uint32_t {
  kIdle = 0,
  kStarting = 1,  // Client::Create, session open, pool attach
  kAcquire = 2,   // in Client::Acquire
  kVerify = 3,    // reading and checking hit pages
  kWrite = 4,     // writing stamps into new pages
  kCommit = 5,    // in Lease::Commit
  kRelease = 6,   // in Lease::Release
};

// One slot's header; 256 bytes. Counter order is the driver's too.
struct SlotHeader {
  std::atomic<uint32_t> phase;
  std::atomic<uint32_t> pid;
  std::atomic<uint64_t> owner;
  std::atomic<uint64_t> unused;
  // Counters (kCounterNames in soak.py, same order).
  std::atomic<uint64_t> ops;              // Acquire calls made
  std::atomic<uint64_t> degraded;         // Acquires answered degraded
  std::atomic<uint64_t> acquire_errors;   // Acquires answered with an error
  std::atomic<uint64_t> pages_written;    // new pages stamped
  std::atomic<uint64_t> commits_ok;       // Commits answered OK
  std::atomic<uint64_t> commits_failed;   // Commits refused by the daemon
  std::atomic<uint64_t> inserted;         // pages a Commit inserted
  std::atomic<uint64_t> deduplicated;     // blocks a Commit deduplicated
  std::atomic<uint64_t> hits_verified;    // hit pages checked
  std::atomic<uint64_t> stale_key;        // hit page stamped for another
                                          // block, or torn
  std::atomic<uint64_t> foreign_owner;    // hit page stamped by someone
                                          // other than its committer
  std::atomic<uint64_t> committer_unknown;  // no record names the committer
  std::atomic<uint64_t> late_mismatch;    // a mismatch seen after the
                                          // reader's own lease had expired
  std::atomic<uint64_t> commits_unknown;  // Commits answered with an error
                                          // that leaves their outcome open
  std::atomic<uint64_t> promoted;         // blocks Acquire promoted
  std::atomic<uint64_t> moved_verified;   // hit pages stamped in another
                                          // page (promoted from a tier)
  std::atomic<uint64_t> older_copy;       // with tiers: hit bytes of an
                                          // earlier commit of the block
                                          // than its page's newest record
  std::atomic<uint64_t> reserved[12];
};
static_assert(sizeof(SlotHeader) == 256);

enum RecordState : uint32_t {
  kEmpty = 0,
  kPending = 1,
  kCommitted = 2,
  kFailed = 3,
};

struct CommitRecord {
  std::atomic<uint64_t> seq;  // odd while being written
  std::atomic<uint64_t> page;
  std::atomic<uint64_t> key_hi;
  std::atomic<uint64_t> key_lo;
  std::atomic<uint64_t> owner;
  std::atomic<uint64_t> generation;
  std::atomic<uint64_t> start_ns;  // CLOCK_MONOTONIC before the Commit call
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> pad;
};
static_assert(sizeof(CommitRecord) == 64);

inline constexpr uint32_t kRecordsPerPage = 7;

struct PageRecords {
  std::atomic<uint64_t> next;  // records appended so far
  std::atomic<uint64_t> pad[7];
  CommitRecord records[kRecordsPerPage];
};
static_assert(sizeof(PageRecords) == 512);

inline size_t TableOffset(uint32_t slots) {
  return kHeaderBytes + size_t{slots} * sizeof(SlotHeader);
}
inline size_t FileBytes(uint32_t slots, uint32_t pages) {
  return TableOffset(slots) + size_t{pages} * sizeof(PageRecords);
}

}  // namespace radixkv::soak

#endif  // RADIXKV_BENCH_SOAK_SOAK_SHARED_H_
