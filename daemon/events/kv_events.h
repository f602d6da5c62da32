// File: daemon/events/kv_events.h
//
// KvEventPublisher: radixkvd's cache changes as KV events in vLLM's wire
// format, so that cluster routers built for vLLM (llm-d's kv-cache-manager,
// NVIDIA Dynamo's KV router) can index which blocks each radixkvd holds.
// docs/EVENTS.md is the reference: frames, payload, replay, flags.
//
//   ZMQ PUB, one message per batch: [topic, seq (u64 big-endian), payload]
//   payload: msgpack EventBatch [ts, [BlockStored|BlockRemoved|
//            AllBlocksCleared, ...], data_parallel_rank]  (kv_events_encode.h)
//   ZMQ ROUTER (optional): a request [empty, seq (8 bytes big-endian)] is
//            answered with every buffered batch numbered >= seq as
//            [empty, seq, payload], then the end marker [empty, -1 (8 bytes),
//            status], status empty when the replay is complete from seq.
//
// Sequence numbers start at 0 for each daemon life; batch 0 is one
// AllBlocksCleared, so a subscriber that sees the sequence restart knows
// the daemon's cache is empty again.
//
// Threads. The tree calls OnTreeEvents with its mutex held: it copies the
// events (and the stored blocks' token ids) into a pending queue under a
// small mutex of its own and returns; it never encodes, sends or waits for
// a subscriber, and while events flow it makes no system call either (the
// publisher thread polls the queue every millisecond and is woken only
// after it has parked in a quiet second). The publisher thread takes
// everything pending at once,
// groups it into events and batches (a burst of tree changes becomes one
// batch, never one message per block), encodes, sends on the PUB socket
// (which drops, per subscriber, what exceeds the high-water mark instead of
// blocking) and keeps the batch for replay. The replay thread owns the
// ROUTER socket. If the pending queue exceeds its byte bound (the publisher
// thread cannot keep up), the events that do not fit are dropped and one
// sequence number is skipped in their place, so every subscriber sees a gap
// and a replay across it reports one; such a subscriber resyncs from
// Admin.DumpTree.
//
// Thread safety: OnTreeEvents from the tree's threads; Stop and stats from
// any thread. Lock order: the tree's mutex before mu_; the publisher thread
// calls the LoRA resolver (which may take the tree's lock) with no lock of
// this class held.
#ifndef RADIXKV_DAEMON_EVENTS_KV_EVENTS_H_
#define RADIXKV_DAEMON_EVENTS_KV_EVENTS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/events/kv_events_encode.h"
#include "radix/radix_tree.h"

namespace radixkv::daemon {

struct KvEventsOptions {
  // PUB endpoint, tcp://HOST:PORT or ipc://PATH; empty: no events.
  std::string endpoint;
  // Connect the PUB socket to `endpoint` (a subscriber that binds) instead
  // of binding it.
  bool connect = false;
  // ROUTER endpoint answering replay requests; empty: no replay.
  std::string replay_endpoint;
  // First frame of every message.
  std::string topic;
  KvEncodeOptions encode;
  // Batches kept for replay: at most this many, and at most replay_bytes
  // of payload (the older ones go first).
  size_t replay_batches = 10000;
  size_t replay_bytes = size_t{256} << 20;
  // PUB high-water mark: messages queued per subscriber before the socket
  // drops that subscriber's new ones.
  int hwm = 1000;
  // Bytes of events waiting for the publisher thread before new ones are
  // dropped (and a sequence number skipped).
  size_t queue_bytes = size_t{256} << 20;
};

// Counters since start.
struct KvEventsStats {
  uint64_t batches = 0;         // batches published
  uint64_t events = 0;          // events in them (a run of blocks is one)
  uint64_t blocks = 0;          // block records in them
  uint64_t dropped_blocks = 0;  // block records dropped at the queue bound
  uint64_t skipped_seqs = 0;    // sequence numbers skipped for them
  uint64_t replay_requests = 0;
  uint64_t bad_replay_requests = 0;
};

class KvEventPublisher final : public EventListener,
                               public TierEventListener {
 public:
  // A namespace root's LoRA name ("" for none). Called on the publisher
  // thread, once per namespace, with no lock of the publisher held.
  using LoraResolver = std::function<std::string(const BlockKey& root)>;

  // Binds (or connects) the sockets and starts the threads, then queues the
  // AllBlocksCleared of batch 0. INVALID_ARGUMENT naming the flag for an
  // endpoint that is not tcp:// or ipc:// or that ZMQ rejects;
  // FAILED_PRECONDITION when it cannot be bound (address in use).
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(
      const KvEventsOptions& options, LoraResolver lora);

  // Stop(), then frees everything.
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // EventListener: copies and returns (see the file comment).
  void OnTreeEvents(absl::Span<const TreeEvent> events) override;
  // TierEventListener: the tiers' moves, as the same records with their
  // tier's medium (a removal that names no root takes `root`).
  void OnTierMoves(absl::Span<const TierMove> moves,
                   const BlockKey& root) override;

  // Publishes what is pending, stops both threads and closes the sockets.
  // Events arriving later are ignored. Idempotent.
  void Stop();

  KvEventsStats stats() const;
  // The sequence number the next batch will get.
  uint64_t next_seq() const { return next_seq_.load(std::memory_order_acquire); }

 private:
  struct Sockets;
  class PayloadPool;
  using Payload = std::shared_ptr<const KvPayload>;
  // A published batch kept for replay; null payload: a skipped number.
  struct Kept {
    uint64_t seq = 0;
    Payload payload;
  };

  KvEventPublisher(const KvEventsOptions& options, LoraResolver lora);
  void PublisherLoop();
  void ReplayLoop();
  // Publishes records[0..) of the taken queue in batches.
  void PublishRecords(absl::Span<const KvRecord> records,
                      absl::Span<const uint32_t> tokens);
  void Send(Payload payload);
  void SkipSeq();
  void Keep(uint64_t seq, Payload payload);
  const std::string* LoraOf(const BlockKey& root);
  // Answers one replay request (frames as received by the ROUTER).
  void AnswerReplay(std::vector<std::string>& frames);

  const KvEventsOptions options_;
  const LoraResolver lora_;
  // Payload buffers come from here and return when the last reference (the
  // replay buffer's, or ZMQ's once a message is sent or dropped) goes.
  const std::shared_ptr<PayloadPool> pool_;
  std::unique_ptr<Sockets> sockets_;

  // mu_ protects the pending queue, filled on the tree's threads.
  mutable absl::Mutex mu_;
  std::vector<KvRecord> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> pending_tokens_ ABSL_GUARDED_BY(mu_);
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Events were dropped after the pending ones: skip a number after them.
  bool pending_lost_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t dropped_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The publisher thread waits on wake_ (after a quiet second).
  bool parked_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar wake_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;

  // Publisher thread only.
  std::vector<KvRecord> work_;
  std::vector<uint32_t> work_tokens_;
  // By namespace root (ids are reused once a namespace is forgotten).
  absl::flat_hash_map<BlockKey, std::string> lora_names_;

  std::atomic<uint64_t> next_seq_{0};
  std::atomic<uint64_t> batches_{0}, events_{0}, blocks_{0}, skipped_{0};
  std::atomic<uint64_t> replays_{0}, bad_replays_{0};
  std::atomic<bool> replay_stop_{false};

  // replay_mu_ protects the kept batches (publisher thread appends, replay
  // thread reads).
  mutable absl::Mutex replay_mu_;
  std::deque<Kept> kept_ ABSL_GUARDED_BY(replay_mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(replay_mu_) = 0;

  std::thread publisher_;
  std::thread replayer_;
};

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_EVENTS_KV_EVENTS_H_
