// File: daemon/tiers/remote_tier.h
//
// RemoteTier: the tier that every node of a fleet shares (--tier=...;remote),
// kept in a Redis Cluster (or one Redis server) through RedisCluster. It
// sits at the bottom of the chain: blocks the tiers above do not keep (or,
// with no other tier, the pool's evictions) are written to the store, and
// a block no local tier holds is looked up there before it is a miss, so a
// prefix one node computed is a hit on every other.
//
// Keys. A block is stored under PREFIX:ROOT:KEY (hex). ROOT, the
// namespace root, is a hash over the model, revision, adapter and the
// effective cache salt, which carries the tenant (tenants never share a
// root), so one tenant's lookups never reach another's blocks, on any
// node. Each value carries a header (magic, version, key, parent, root,
// depth, data length, XXH3-64 of the data, XXH3-64 of the header) that a
// read verifies against what it asked for; a value that fails is a miss,
// never bytes in a page.
//
// What is written: with write=evicted (the default) the blocks the node
// evicts; with write=all also every block as it is committed
// (TierChain::WriteThrough), so the fleet sees a prefix at once.
//
// Writes are asynchronous: Put copies each block out of its page into a
// staged value (bounded by queue_bytes; beyond it, blocks are dropped) and
// writer threads pipeline SETs to the store. A staged block is a hit from
// Put on. Reads (CountPresentIn, TakeIn) run on the caller's thread, each
// bounded by the timeout.
//
// A store that is slow or down costs hits, never requests: after
// breaker_failures consecutive failed calls the circuit opens, and for
// breaker_cooldown every lookup is a miss and every block is dropped; then
// one call probes the store, and a success closes the circuit.
//
// The store is shared: Take leaves the block there, Forget keeps it, and
// the tier publishes no KV events (its blocks are no single node's).
// What the store evicts (its maxmemory policy) simply stops being found.
//
// Thread safety: thread-safe.
#ifndef RADIXKV_DAEMON_TIERS_REMOTE_TIER_H_
#define RADIXKV_DAEMON_TIERS_REMOTE_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "daemon/tiers/redis_cluster.h"
#include "daemon/tiers/tier.h"

namespace radixkv::daemon {

struct RemoteTierOptions {
  std::vector<RedisEndpoint> seeds;  // at least one node of the store
  RedisAuth auth;
  RedisTls tls;                      // ctx null: plain TCP
  std::string prefix = "rkv";      // key prefix: one fleet's blocks
  uint64_t page_bytes = 0;
  absl::Duration timeout = absl::Milliseconds(100);  // per store call
  absl::Duration ttl = absl::ZeroDuration();  // 0: the store's own policy
  uint64_t queue_bytes = 64ull << 20;         // staged writes, at most
  int writers = 2;                            // writer threads, 1..16
  int breaker_failures = 5;
  absl::Duration breaker_cooldown = absl::Seconds(5);
  // write=all: every committed block is written as it is committed, not
  // only the blocks the node evicts (write=evicted).
  bool write_all = false;
};

// The value's header; its layout is the stored format (little endian).
inline constexpr size_t kRemoteHeaderBytes = 96;

class RemoteTier final : public Tier {
 public:
  // Connects once to check the store: PERMISSION_DENIED when it refuses
  // the credentials, INVALID_ARGUMENT for bad options. A store that does
  // not answer is not an error: the tier starts with its circuit open.
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Open(
      RemoteTierOptions options);
  ~RemoteTier() override;
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  TierKind kind() const override { return TierKind::kRemote; }
  uint64_t page_bytes() const override { return options_.page_bytes; }
  // The store sizes itself: 0.
  uint64_t capacity_blocks() const override { return 0; }
  bool shared() const override { return true; }
  bool writes_through() const override { return options_.write_all; }

  void Put(absl::Span<const TierPut> blocks, PageMover& mover, TierSink& below,
           std::vector<TierMove>* moves) override;
  // Unscoped lookups find nothing: the store is keyed by namespace.
  size_t Take(absl::Span<const BlockKey>, absl::Span<const uint64_t>,
              PageMover&, std::vector<TierMove>*) override {
    return 0;
  }
  size_t CountPresent(absl::Span<const BlockKey>) const override { return 0; }
  size_t CountPresentIn(const BlockKey& root,
                        absl::Span<const BlockKey> keys) const override;
  size_t TakeIn(const BlockKey& root, absl::Span<const BlockKey> keys,
                absl::Span<const uint64_t> pages, PageMover& mover,
                std::vector<TierMove>* moves) override;
  size_t Forget(absl::Span<const BlockKey>, std::vector<TierBlock>*) override {
    return 0;
  }
  // Staged blocks only (a lookup in the store needs the namespace).
  bool Lookup(const BlockKey& key, TierBlock* out) const override;
  TierStats stats() const override;
  // Waits (up to the timeout per staged batch) for staged writes.
  void Flush() override;

  // The store key of `key` in namespace `root`.
  std::string StoreKey(const BlockKey& root, const BlockKey& key) const;
  // Encodes a value / checks one against what was asked for (and fills
  // *block and *data on success). Exposed for tests.
  static std::string EncodeValue(const TierBlock& block, const void* data,
                                 uint64_t bytes);
  enum class Check : uint8_t { kOk, kBadHeader, kWrongBlock, kBadData };
  static Check CheckValue(absl::string_view value, const BlockKey& root,
                          const BlockKey& key, uint64_t page_bytes,
                          TierBlock* block, absl::string_view* data);

  // Whether lookups currently go to the store (the circuit is closed or
  // half open).
  bool available() const;

 private:
  struct Staged {
    TierBlock block;
    std::string key;
    std::string value;  // header + data
  };
  explicit RemoteTier(RemoteTierOptions options);

  // One client per calling thread at a time.
  std::unique_ptr<RedisCluster> Borrow() const;
  void Return(std::unique_ptr<RedisCluster> c) const;
  // The circuit: whether a call may go to the store now, and its outcome.
  bool Admit() const;
  void Record(bool ok) const;
  void Writer();
  std::shared_ptr<const Staged> FindStaged(const BlockKey& key) const;

  const RemoteTierOptions options_;

  mutable Mutex clients_mu_;
  mutable std::vector<std::unique_ptr<RedisCluster>> clients_
      ABSL_GUARDED_BY(clients_mu_);

  mutable Mutex breaker_mu_;
  mutable int failures_ ABSL_GUARDED_BY(breaker_mu_) = 0;
  mutable absl::Time open_until_ ABSL_GUARDED_BY(breaker_mu_) =
      absl::InfinitePast();
  mutable bool probing_ ABSL_GUARDED_BY(breaker_mu_) = false;

  mutable Mutex queue_mu_;
  std::deque<std::shared_ptr<const Staged>> queue_ ABSL_GUARDED_BY(queue_mu_);
  // Staged and being written, by block key.
  absl::flat_hash_map<BlockKey, std::shared_ptr<const Staged>> staged_
      ABSL_GUARDED_BY(queue_mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(queue_mu_) = 0;
  int writing_ ABSL_GUARDED_BY(queue_mu_) = 0;  // batches in flight
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::vector<std::thread> writers_;

  mutable std::atomic<uint64_t> written_{0}, promoted_{0}, misses_{0},
      dropped_full_{0}, dropped_error_{0}, checksum_failures_{0},
      bytes_written_{0}, bytes_read_{0}, read_errors_{0}, write_errors_{0},
      breaker_trips_{0};
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_TIERS_REMOTE_TIER_H_
