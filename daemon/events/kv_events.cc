#include "daemon/events/kv_events.h"

#include <errno.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "msgpack.hpp"
#include "zmq.hpp"

namespace radixkv::daemon {
namespace {

// A batch holds at most this many block records and token ids, so that a
// large burst (a Clear, a long prompt's commit) becomes a few messages of
// bounded size rather than one huge one: at most about 5 bytes per token
// id plus 64 per block, 600 KiB. A subscriber that stops reading holds at
// most --kv_events_hwm of them.
constexpr size_t kMaxBatchBlocks = 4096;
constexpr size_t kMaxBatchTokens = size_t{1} << 16;
// How long one replay answer may wait for a slow requester in all.
constexpr absl::Duration kReplaySendTimeout = absl::Seconds(10);
// The publisher thread looks for events this often while they flow, and
// parks after this many empty looks (a second).
constexpr absl::Duration kPollInterval = absl::Milliseconds(1);
constexpr int kPollsBeforePark = 1000;

std::string BigEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return out;
}

uint64_t FromBigEndian64(const std::string& s) {
  uint64_t v = 0;
  for (unsigned char c : s) v = (v << 8) | c;
  return v;
}

// The replay end marker's sequence frame: -1 as a signed 64-bit integer.
const std::string& EndSeq() {
  static const std::string* const kEnd =
      new std::string(8, static_cast<char>(0xff));
  return *kEnd;
}

bool ValidEndpoint(const std::string& e) {
  return absl::StartsWith(e, "tcp://") || absl::StartsWith(e, "ipc://");
}

// A replay answer's status (the end marker's payload): a msgpack map.
std::string ReplayStatus(absl::string_view status, absl::string_view error,
                         bool with_seqs, uint64_t requested,
                         uint64_t first_available, uint64_t next_seq) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(with_seqs ? 4 : 3);
  auto str = [&](absl::string_view s) {
    pk.pack_str(static_cast<uint32_t>(s.size()));
    pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  };
  str("status");
  str(status);
  if (with_seqs) {
    str("requested");
    pk.pack_uint64(requested);
    str("first_available");
    pk.pack_uint64(first_available);
  } else {
    str("error");
    str(error);
  }
  str("next_seq");
  pk.pack_uint64(next_seq);
  return std::string(buf.data(), buf.size());
}

}  // namespace

// Recycled payload buffers. Thread safety: Take on the publisher thread,
// Return from whichever thread drops a payload's last reference (ZMQ's I/O
// thread, the publisher or replay thread).
class KvEventPublisher::PayloadPool {
 public:
  // At most this many idle buffers, each at most kMaxIdleBytes, are kept.
  static constexpr size_t kMaxIdle = 32;
  static constexpr size_t kMaxIdleBytes = size_t{8} << 20;

  // A payload whose buffer goes back to `pool` when its last reference does.
  static Payload Share(const std::shared_ptr<PayloadPool>& pool,
                       std::unique_ptr<KvPayload> buffer) {
    return Payload(buffer.release(), [pool](const KvPayload* p) {
      pool->Return(std::unique_ptr<KvPayload>(const_cast<KvPayload*>(p)));
    });
  }

  std::unique_ptr<KvPayload> Take() {
    absl::MutexLock lock(&mu_);
    if (idle_.empty()) return std::make_unique<KvPayload>();
    std::unique_ptr<KvPayload> b = std::move(idle_.back());
    idle_.pop_back();
    return b;
  }

  void Return(std::unique_ptr<KvPayload> b) {
    if (b->capacity() > kMaxIdleBytes) return;
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(b));
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<KvPayload>> idle_ ABSL_GUARDED_BY(mu_);
};

struct KvEventPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  zmq::socket_t router;  // valid only with a replay endpoint
};

KvEventPublisher::KvEventPublisher(const KvEventsOptions& options,
                                   LoraResolver lora)
    : options_(options), lora_(std::move(lora)),
      pool_(std::make_shared<PayloadPool>()),
      sockets_(std::make_unique<Sockets>()) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(
    const KvEventsOptions& options, LoraResolver lora) {
  for (const auto& [flag, value] :
       {std::pair<const char*, std::string>{"kv_events_endpoint",
                                            options.endpoint},
        {"kv_events_replay_endpoint", options.replay_endpoint}}) {
    if (!value.empty() && !ValidEndpoint(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, "=", value, ": must be tcp://HOST:PORT or ipc://PATH"));
    }
  }
  std::unique_ptr<KvEventPublisher> p(
      new KvEventPublisher(options, std::move(lora)));
  Sockets& s = *p->sockets_;
  const char* flag = "kv_events_endpoint";
  std::string value = options.endpoint;
  try {
    s.pub.set(zmq::sockopt::sndhwm, options.hwm);
    s.pub.set(zmq::sockopt::linger, 0);
    if (options.connect) {
      s.pub.connect(options.endpoint);
    } else {
      s.pub.bind(options.endpoint);
    }
    if (!options.replay_endpoint.empty()) {
      flag = "kv_events_replay_endpoint";
      value = options.replay_endpoint;
      s.router = zmq::socket_t(s.ctx, zmq::socket_type::router);
      s.router.set(zmq::sockopt::linger, 0);
      // A full answer is sent whole: at the requester's high-water mark
      // the replay thread waits (up to kReplaySendTimeout) instead of
      // dropping, and a requester that is gone ends the answer.
      s.router.set(zmq::sockopt::router_mandatory, 1);
      s.router.bind(options.replay_endpoint);
    }
  } catch (const zmq::error_t& e) {
    const std::string msg =
        absl::StrCat("--", flag, "=", value, ": ", e.what());
    return e.num() == EADDRINUSE || e.num() == EACCES
               ? absl::FailedPreconditionError(msg)
               : absl::InvalidArgumentError(msg);
  }
  Log(LogLevel::kInfo,
      absl::StrCat("kv events: PUB ", options.connect ? "connected to " : "on ",
                   s.pub.get(zmq::sockopt::last_endpoint), ", replay ",
                   options.replay_endpoint.empty()
                       ? std::string("(off)")
                       : s.router.get(zmq::sockopt::last_endpoint)));
  // Batch 0: the cache of this daemon life starts empty.
  TreeEvent cleared;
  cleared.type = TreeEvent::Type::kCleared;
  p->OnTreeEvents({&cleared, 1});
  p->publisher_ = std::thread([q = p.get()] { q->PublisherLoop(); });
  if (!options.replay_endpoint.empty()) {
    p->replayer_ = std::thread([q = p.get()] { q->ReplayLoop(); });
  }
  return p;
}

KvEventPublisher::~KvEventPublisher() { Stop(); }

void KvEventPublisher::OnTreeEvents(absl::Span<const TreeEvent> events) {
  size_t bytes = 0;
  for (const TreeEvent& e : events) {
    bytes += sizeof(KvRecord);
    if (e.tokens != nullptr) bytes += e.block_size * sizeof(uint32_t);
  }
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  if (pending_lost_ || pending_bytes_ + bytes > options_.queue_bytes) {
    // Everything from here until the publisher takes the queue is dropped,
    // so the skipped number marks one contiguous loss.
    pending_lost_ = true;
    dropped_blocks_ += events.size();
    return;
  }
  pending_bytes_ += bytes;
  for (const TreeEvent& e : events) {
    KvRecord r;
    switch (e.type) {
      case TreeEvent::Type::kStored:
        r.kind = KvRecord::Kind::kStored;
        r.depth = e.depth;
        r.block_size = e.block_size;
        r.parent_key = e.parent_key;
        if (e.tokens != nullptr) {
          r.token_offset = pending_tokens_.size();
          r.token_count = e.block_size;
          pending_tokens_.insert(pending_tokens_.end(), e.tokens,
                                 e.tokens + e.block_size);
        }
        break;
      case TreeEvent::Type::kRemoved:
        r.kind = KvRecord::Kind::kRemoved;
        break;
      case TreeEvent::Type::kCleared:
        // AllBlocksCleared says the whole cache is gone; when pinned blocks
        // survive a Clear, its BlockRemoved events already said what went.
        if (e.remaining != 0) continue;
        r.kind = KvRecord::Kind::kCleared;
        break;
    }
    r.ns = e.ns;
    r.root = e.root;
    r.key = e.key;
    pending_.push_back(r);
  }
  if (parked_) wake_.Signal();
}

void KvEventPublisher::OnTierMoves(absl::Span<const TierMove> moves,
                                   const BlockKey& root) {
  const size_t bytes = moves.size() * sizeof(KvRecord);
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  if (pending_lost_ || pending_bytes_ + bytes > options_.queue_bytes) {
    pending_lost_ = true;
    dropped_blocks_ += moves.size();
    return;
  }
  pending_bytes_ += bytes;
  for (const TierMove& m : moves) {
    KvRecord r;
    r.ns = m.ns;
    r.root = m.block.root == BlockKey{} ? root : m.block.root;
    r.key = m.block.key;
    r.medium = m.medium;
    if (m.stored) {
      r.kind = KvRecord::Kind::kStored;
      r.parent_key = m.block.parent_key;
      // Only "first block or not" matters.
      r.depth = m.block.parent_key == r.root ? 0 : 1;
      r.block_size = m.block.block_size;
    } else {
      r.kind = KvRecord::Kind::kRemoved;
    }
    pending_.push_back(r);
  }
  if (parked_) wake_.Signal();
}

void KvEventPublisher::PublisherLoop() {
  pthread_setname_np(pthread_self(), "kv-events-pub");
  int idle_polls = 0;
  while (true) {
    bool lost = false;
    bool stop = false;
    mu_.Lock();
    // The tree's threads never wake this thread while it is busy: it polls
    // every kPollInterval, so appending an event costs the tree's thread an
    // uncontended lock and no system call. After kPollsBeforePark empty
    // polls it parks, and the next event wakes it (once).
    while (!stop_ && pending_.empty() && !pending_lost_) {
      if (idle_polls < kPollsBeforePark) {
        ++idle_polls;
        mu_.Unlock();
        absl::SleepFor(kPollInterval);
        mu_.Lock();
      } else {
        parked_ = true;
        wake_.Wait(&mu_);
        parked_ = false;
      }
    }
    idle_polls = 0;
    work_.swap(pending_);
    work_tokens_.swap(pending_tokens_);
    pending_bytes_ = 0;
    lost = pending_lost_;
    pending_lost_ = false;
    stop = stop_;
    mu_.Unlock();
    const bool idle = work_.empty() && !lost;
    PublishRecords(work_, work_tokens_);
    if (lost) SkipSeq();
    work_.clear();
    work_tokens_.clear();
    if (stop && idle) return;
  }
}

void KvEventPublisher::PublishRecords(absl::Span<const KvRecord> records,
                                      absl::Span<const uint32_t> tokens) {
  // Learn each namespace's LoRA name from its root, once.
  for (const KvRecord& r : records) {
    if (r.kind == KvRecord::Kind::kStored && !lora_names_.contains(r.root)) {
      lora_names_[r.root] = lora_ ? lora_(r.root) : std::string();
    }
  }
  auto lora = [this](const BlockKey& root) { return LoraOf(root); };
  size_t begin = 0;
  while (begin < records.size()) {
    size_t end = begin;
    size_t n_tokens = 0;
    while (end < records.size() && end - begin < kMaxBatchBlocks &&
           n_tokens < kMaxBatchTokens) {
      n_tokens += records[end].token_count;
      ++end;
    }
    const absl::Span<const KvRecord> batch = records.subspan(begin, end - begin);
    const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    std::unique_ptr<KvPayload> buffer = pool_->Take();
    EncodeKvEventBatch(options_.encode, ts, batch, tokens, lora, buffer.get());
    Send(PayloadPool::Share(pool_, std::move(buffer)));
    events_.fetch_add(CountKvEvents(batch), std::memory_order_relaxed);
    blocks_.fetch_add(batch.size(), std::memory_order_relaxed);
    begin = end;
  }
}

const std::string* KvEventPublisher::LoraOf(const BlockKey& root) {
  auto it = lora_names_.find(root);
  return it == lora_names_.end() ? nullptr : &it->second;
}

void KvEventPublisher::Send(Payload payload) {
  const uint64_t seq = next_seq_.load(std::memory_order_relaxed);
  // Kept (and numbered) before it is sent, so that a subscriber that has
  // received batch seq can always replay it.
  Keep(seq, payload);
  batches_.fetch_add(1, std::memory_order_relaxed);
  next_seq_.store(seq + 1, std::memory_order_release);
  zmq::socket_t& pub = sockets_->pub;
  const std::string seq_bytes = BigEndian64(seq);
  // A PUB socket never blocks: at a subscriber's high-water mark it drops
  // that subscriber's copy, which the subscriber sees as a sequence gap.
  try {
    pub.send(zmq::buffer(options_.topic),
             zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    pub.send(zmq::buffer(seq_bytes),
             zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    // The payload itself goes out (no copy); the message holds a reference
    // until ZMQ has sent or dropped it.
    const KvPayload& body = *payload;
    auto* ref = new Payload(std::move(payload));
    zmq::message_t msg(
        const_cast<char*>(body.data()), body.size(),
        [](void*, void* hint) { delete static_cast<Payload*>(hint); }, ref);
    pub.send(msg, zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    Log(LogLevel::kWarning, absl::StrCat("kv events: send: ", e.what()));
  }
}

void KvEventPublisher::SkipSeq() {
  const uint64_t seq = next_seq_.load(std::memory_order_relaxed);
  Keep(seq, nullptr);
  skipped_.fetch_add(1, std::memory_order_relaxed);
  next_seq_.store(seq + 1, std::memory_order_release);
  Log(LogLevel::kWarning,
      absl::StrCat("kv events: the publisher fell behind by more than "
                   "--kv_events_queue_bytes; events dropped, sequence number ",
                   seq, " skipped (subscribers resync)"));
}

void KvEventPublisher::Keep(uint64_t seq, Payload payload) {
  // Without a replay socket nobody reads the kept batches.
  if (options_.replay_endpoint.empty()) return;
  absl::MutexLock lock(&replay_mu_);
  kept_bytes_ += payload == nullptr ? 0 : payload->size();
  kept_.push_back(Kept{seq, std::move(payload)});
  while (kept_.size() > 1 && (kept_.size() > options_.replay_batches ||
                              kept_bytes_ > options_.replay_bytes)) {
    if (kept_.front().payload != nullptr) {
      kept_bytes_ -= kept_.front().payload->size();
    }
    kept_.pop_front();
  }
}

void KvEventPublisher::ReplayLoop() {
  pthread_setname_np(pthread_self(), "kv-events-rep");
  zmq::socket_t& router = sockets_->router;
  while (!replay_stop_.load(std::memory_order_acquire)) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<std::string> frames;
      while (true) {
        zmq::message_t m;
        if (!router.recv(m, zmq::recv_flags::dontwait)) break;
        frames.push_back(m.to_string());
        if (!m.more()) break;
      }
      if (!frames.empty()) AnswerReplay(frames);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      Log(LogLevel::kWarning, absl::StrCat("kv events: replay: ", e.what()));
    }
  }
}

void KvEventPublisher::AnswerReplay(std::vector<std::string>& frames) {
  zmq::socket_t& router = sockets_->router;
  const std::string& id = frames[0];
  // Replies go to the requester only. While its queue is full the replay
  // thread waits, up to kReplaySendTimeout for the whole answer; a
  // requester that is gone (or too slow) ends the answer there.
  const absl::Time deadline = absl::Now() + kReplaySendTimeout;
  auto reply = [&](const std::string& seq, absl::string_view payload) {
    try {
      while (!router.send(zmq::buffer(id), zmq::send_flags::sndmore |
                                               zmq::send_flags::dontwait)) {
        if (absl::Now() > deadline ||
            replay_stop_.load(std::memory_order_acquire)) {
          return false;
        }
        zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLOUT, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(10));
      }
      router.send(zmq::buffer(std::string()), zmq::send_flags::sndmore);
      router.send(zmq::buffer(seq), zmq::send_flags::sndmore);
      router.send(zmq::buffer(payload.data(), payload.size()),
                  zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return false;  // the requester left
      throw;
    }
    return true;
  };
  replays_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t next = next_seq();
  if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) {
    bad_replays_.fetch_add(1, std::memory_order_relaxed);
    reply(EndSeq(),
          ReplayStatus("bad_request",
                       absl::StrCat("expected an empty delimiter frame and "
                                    "an 8-byte big-endian sequence number; "
                                    "got ", frames.size() - 1, " frame(s)"),
                       false, 0, 0, next));
    return;
  }
  const uint64_t from = FromBigEndian64(frames[2]);
  std::vector<Kept> out;
  uint64_t oldest;
  {
    absl::MutexLock lock(&replay_mu_);
    oldest = kept_.empty() ? next : kept_.front().seq;
    for (auto it = kept_.rbegin(); it != kept_.rend() && it->seq >= from; ++it) {
      out.push_back(*it);
    }
  }
  std::reverse(out.begin(), out.end());
  bool gap = from < oldest;
  for (const Kept& k : out) {
    if (k.payload == nullptr) {
      gap = true;
      continue;
    }
    if (!reply(BigEndian64(k.seq), k.payload->view())) return;
  }
  std::string status;
  if (gap) {
    status = ReplayStatus("gap", "", true, from, oldest, next);
  } else if (from > next) {
    status = ReplayStatus("future", "", true, from, oldest, next);
  }
  reply(EndSeq(), status);
}

void KvEventPublisher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_ = true;
    wake_.Signal();
  }
  if (publisher_.joinable()) publisher_.join();
  replay_stop_.store(true, std::memory_order_release);
  if (replayer_.joinable()) replayer_.join();
  sockets_->router.close();
  sockets_->pub.close();
}

KvEventsStats KvEventPublisher::stats() const {
  KvEventsStats s;
  s.batches = batches_.load(std::memory_order_relaxed);
  s.events = events_.load(std::memory_order_relaxed);
  s.blocks = blocks_.load(std::memory_order_relaxed);
  s.skipped_seqs = skipped_.load(std::memory_order_relaxed);
  s.replay_requests = replays_.load(std::memory_order_relaxed);
  s.bad_replay_requests = bad_replays_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  s.dropped_blocks = dropped_blocks_;
  return s;
}

}  // namespace radixkv::daemon
