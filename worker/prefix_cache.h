// File: worker/prefix_cache.h
//
// PrefixCache: what the reference worker needs from a prefix cache, behind
// one small interface with three implementations:
//
//   NoPrefixCache       always a miss, no pages (full prefills; the "no
//                       cache" baseline).
//   LocalPrefixCache    in-process: a RadixTree over a page array in host
//                       memory, or device memory for a model on CUDA
//                       (benchmarks and tests with no daemon).
//   DaemonPrefixCache   radixkvd through radixkv::Client, pages in the
//                       mapped pool (host, or cuda for a model on CUDA);
//                       degrades to a miss while the daemon is away (the
//                       client's degraded leases).
//
// A CacheLease pins the matched prefix and owns the pages allocated for the
// next full blocks, exactly as a daemon lease does (docs/CONTRACTS.md §4,
// Acquire): pages [0, matched_blocks) hold cached K/V, pages
// [matched_blocks, matched_blocks + new_blocks) are for the worker to
// write, then Commit. A lease that is destroyed while held is released.
//
// Thread safety: a PrefixCache may be shared by threads (each
// implementation documents its locking); a CacheLease belongs to one
// request/thread.
#ifndef RADIXKV_CLIENT_WORKER_PREFIX_CACHE_H_
#define RADIXKV_CLIENT_WORKER_PREFIX_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "radix/block_key.h"

namespace radixkv {
class Client;
}  // namespace radixkv

namespace radixkv::worker {

class CacheLease {
 public:
  virtual ~CacheLease() = default;
  CacheLease(const CacheLease&) = delete;
  CacheLease& operator=(const CacheLease&) = delete;

  virtual uint32_t matched_blocks() const = 0;
  virtual uint32_t new_blocks() const = 0;
  // True when the cache could not be consulted (daemon away): a miss.
  virtual bool degraded() const { return false; }
  // Address of page i (matched pages first, then new ones); nullptr when i
  // is out of range. A host address, or a device address when
  // device_pages(). Valid while the lease lives.
  virtual void* page_address(size_t i) const = 0;
  // True when page_address() returns device pointers (a mapped cuda pool).
  virtual bool device_pages() const { return false; }
  // After reads of the matched pages have finished: OK when the lease still
  // held them throughout, so what was read is the cached K/V; otherwise
  // (expired, session lost) the reads must be discarded: a miss.
  virtual absl::Status ConfirmRead() const { return absl::OkStatus(); }
  // Commits the next `blocks` new pages (their K/V written) in block order;
  // with release, also ends the lease. FAILED_PRECONDITION when `blocks`
  // exceeds the uncommitted new pages or the lease is not held.
  virtual absl::Status Commit(uint32_t blocks, bool release) = 0;
  // Ends the lease; idempotent.
  virtual absl::Status Release() = 0;

 protected:
  CacheLease() = default;
};

class PrefixCache {
 public:
  virtual ~PrefixCache() = default;
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Pins the longest cached prefix of `tokens` (full blocks) and, with
  // `allocate`, takes pages for the following full blocks (possibly fewer).
  virtual absl::StatusOr<std::unique_ptr<CacheLease>> Acquire(
      absl::Span<const uint32_t> tokens, bool allocate) = 0;
  // "none", "local", "daemon <endpoint>" ...
  virtual std::string Describe() const = 0;

 protected:
  PrefixCache() = default;
};

// Always a miss.
std::unique_ptr<PrefixCache> NewNoPrefixCache();

// In-process cache of `capacity_pages` pages for namespace `ns` (page bytes
// from NamespacePageBytes(ns), the fp8/int8 scale area included). Thread-safe (the tree locks internally; page memory
// is handed out under the lease protocol). INVALID_ARGUMENT for an
// incomplete layout or zero capacity. With `device_pages` the pages are
// device memory (leases report device_pages(); for a Model on CUDA);
// FAILED_PRECONDITION when no CUDA device is usable.
absl::StatusOr<std::unique_ptr<PrefixCache>> NewLocalPrefixCache(
    const NamespaceSpec& ns, uint32_t capacity_pages, bool device_pages = false);

// Daemon-backed cache over a connected (or still connecting) client created
// with attach_pool = true and the model's namespace. The client is borrowed
// and must outlive the cache and its leases. Leases whose pages are not
// mapped in this process (no pool) are turned into misses; so are leases on
// a cuda pool unless `accept_device_pages` (the model runs on CUDA and can
// read and write device pages), and leases on a pool whose page_bytes is
// not NamespacePageBytes of the client's namespace.
std::unique_ptr<PrefixCache> NewDaemonPrefixCache(
    Client* client, bool accept_device_pages = false);

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_PREFIX_CACHE_H_
