#include "daemon/tiers/remote_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "daemon/tiers/page_mover.h"

namespace radixkv::daemon {
namespace {

constexpr char kMagic[4] = {'R', 'K', 'V', 'R'};
constexpr uint32_t kVersion = 1;
constexpr size_t kWriteBatch = 32;   // SETs per pipelined writer call
constexpr size_t kReadBatch = 64;    // keys per pipelined lookup

// Header layout (kRemoteHeaderBytes, little endian):
//   0 magic[4]  4 version u32  8 key[16]  24 parent[16]  40 root[16]
//   56 depth u32  60 block_size u32  64 data_bytes u64  72 data_xxh3 u64
//   80 reserved[8]  88 header_xxh3 u64 (of bytes 0..88)
constexpr size_t kHeaderCheckAt = 88;

void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

std::string RemoteTier::EncodeValue(const TierBlock& block, const void* data,
                                    uint64_t bytes) {
  std::string v(kRemoteHeaderBytes + bytes, '\0');
  char* h = v.data();
  std::memcpy(h, kMagic, 4);
  PutU32(h + 4, kVersion);
  block.key.ToCanonical(h + 8);
  block.parent_key.ToCanonical(h + 24);
  block.root.ToCanonical(h + 40);
  PutU32(h + 56, block.depth);
  PutU32(h + 60, block.block_size);
  PutU64(h + 64, bytes);
  PutU64(h + 72, BlockChecksum(data, bytes));
  PutU64(h + kHeaderCheckAt, BlockChecksum(h, kHeaderCheckAt));
  std::memcpy(h + kRemoteHeaderBytes, data, bytes);
  return v;
}

RemoteTier::Check RemoteTier::CheckValue(absl::string_view value,
                                         const BlockKey& root,
                                         const BlockKey& key,
                                         uint64_t page_bytes, TierBlock* block,
                                         absl::string_view* data) {
  if (value.size() < kRemoteHeaderBytes) return Check::kBadHeader;
  const char* h = value.data();
  if (std::memcmp(h, kMagic, 4) != 0 || GetU32(h + 4) != kVersion ||
      GetU64(h + 80) != 0 ||  // reserved
      GetU64(h + kHeaderCheckAt) != BlockChecksum(h, kHeaderCheckAt)) {
    return Check::kBadHeader;
  }
  TierBlock b;
  b.key = BlockKey::FromCanonical(absl::string_view(h + 8, BlockKey::kBytes));
  b.parent_key = BlockKey::FromCanonical(absl::string_view(h + 24, BlockKey::kBytes));
  b.root = BlockKey::FromCanonical(absl::string_view(h + 40, BlockKey::kBytes));
  b.depth = GetU32(h + 56);
  b.block_size = GetU32(h + 60);
  if (!(b.key == key) || !(b.root == root)) return Check::kWrongBlock;
  const uint64_t n = GetU64(h + 64);
  if (n != page_bytes || value.size() != kRemoteHeaderBytes + n) {
    return Check::kBadData;
  }
  const absl::string_view d = value.substr(kRemoteHeaderBytes);
  if (BlockChecksum(d.data(), d.size()) != GetU64(h + 72)) return Check::kBadData;
  *block = b;
  *data = d;
  return Check::kOk;
}

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(
    RemoteTierOptions o) {
  if (o.seeds.empty()) {
    return absl::InvalidArgumentError(
        "--tier=remote: needs addr=HOST:PORT (a node of the store)");
  }
  if (o.page_bytes == 0) {
    return absl::InvalidArgumentError("--tier=remote: page_bytes is 0");
  }
  std::unique_ptr<RemoteTier> t(new RemoteTier(std::move(o)));
  // One client checks the store now: credentials refused is a
  // configuration error; a store down is not.
  std::unique_ptr<RedisCluster> c = t->Borrow();
  absl::Status s = c->Connect(absl::Now() + std::max(t->options_.timeout,
                                                      absl::Seconds(2)));
  if (s.code() == absl::StatusCode::kPermissionDenied) {
    return absl::PermissionDeniedError(absl::StrCat("--tier=remote: ", s.message()));
  }
  if (!s.ok()) {
    Log(LogLevel::kWarning,
        absl::StrCat("tier remote: the store does not answer (", s.message(),
                     "); lookups are misses until it does"));
    t->Record(false);
  } else {
    Log(LogLevel::kInfo,
        absl::StrCat("tier remote: ", c->cluster_mode() ? "cluster of " : "server ",
                     c->node_count(), c->cluster_mode() ? " nodes" : "",
                     ", key prefix \"", t->options_.prefix, "\""));
    t->Return(std::move(c));
  }
  return t;
}

RemoteTier::RemoteTier(RemoteTierOptions options)
    : options_(std::move(options)) {
  const int n = std::clamp(options_.writers, 1, 16);
  for (int i = 0; i < n; ++i) writers_.emplace_back([this] { Writer(); });
}

RemoteTier::~RemoteTier() {
  Flush();
  {
    MutexLock l(&queue_mu_);
    stop_ = true;
  }
  for (std::thread& t : writers_) t.join();
}

std::string RemoteTier::StoreKey(const BlockKey& root,
                                 const BlockKey& key) const {
  return absl::StrCat(options_.prefix, ":", root.ToHex(), ":", key.ToHex());
}

std::unique_ptr<RedisCluster> RemoteTier::Borrow() const {
  {
    MutexLock l(&clients_mu_);
    if (!clients_.empty()) {
      std::unique_ptr<RedisCluster> c = std::move(clients_.back());
      clients_.pop_back();
      return c;
    }
  }
  return std::make_unique<RedisCluster>(
      RedisCluster::Options{.seeds = options_.seeds,
                            .auth = options_.auth,
                            .tls = options_.tls});
}

void RemoteTier::Return(std::unique_ptr<RedisCluster> c) const {
  MutexLock l(&clients_mu_);
  clients_.push_back(std::move(c));
}

bool RemoteTier::Admit() const {
  MutexLock l(&breaker_mu_);
  if (failures_ < options_.breaker_failures) return true;
  // Open: after the cooldown one caller at a time probes the store.
  if (absl::Now() < open_until_ || probing_) return false;
  probing_ = true;
  return true;
}

void RemoteTier::Record(bool ok) const {
  MutexLock l(&breaker_mu_);
  probing_ = false;
  if (ok) {
    if (failures_ >= options_.breaker_failures) {
      Log(LogLevel::kInfo, "tier remote: the store answers again");
    }
    failures_ = 0;
    return;
  }
  if (++failures_ == options_.breaker_failures) {
    breaker_trips_.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kWarning,
        absl::StrCat("tier remote: ", failures_,
                     " store calls failed in a row; lookups are misses for ",
                     absl::FormatDuration(options_.breaker_cooldown)));
  }
  if (failures_ >= options_.breaker_failures) {
    open_until_ = absl::Now() + options_.breaker_cooldown;
  }
}

bool RemoteTier::available() const {
  MutexLock l(&breaker_mu_);
  return failures_ < options_.breaker_failures;
}

void RemoteTier::Put(absl::Span<const TierPut> blocks, PageMover& mover,
                     TierSink& below, std::vector<TierMove>* moves) {
  (void)below, (void)moves;  // the bottom tier; shared: no events
  if (blocks.empty()) return;
  const uint64_t pb = options_.page_bytes;
  const uint64_t value_bytes = kRemoteHeaderBytes + pb;
  bool open;
  {
    MutexLock l(&breaker_mu_);
    open = failures_ >= options_.breaker_failures &&
           absl::Now() < open_until_;
  }
  if (open) {
    dropped_error_.fetch_add(blocks.size(), std::memory_order_relaxed);
    return;
  }
  // Room first (no copy for blocks that would not fit).
  size_t take = 0;
  {
    MutexLock l(&queue_mu_);
    while (take < blocks.size() &&
           queued_bytes_ + (take + 1) * value_bytes <= options_.queue_bytes) {
      ++take;
    }
    queued_bytes_ += take * value_bytes;
  }
  dropped_full_.fetch_add(blocks.size() - take, std::memory_order_relaxed);
  // Newest blocks last: keep the newest that fit.
  const absl::Span<const TierPut> kept = blocks.subspan(blocks.size() - take);
  std::vector<std::shared_ptr<const Staged>> staged;
  staged.reserve(kept.size());
  std::unique_ptr<gpu::HostMemory> buf;
  for (size_t at = 0; at < kept.size();) {
    const TierPut& p = kept[at];
    const void* src = p.bytes;
    if (src == nullptr) src = mover.host_address(p.page);
    if (src != nullptr) {
      auto s = std::make_shared<Staged>();
      s->block = p.block;
      s->key = StoreKey(p.block.root, p.block.key);
      s->value = EncodeValue(p.block, src, pb);
      staged.push_back(std::move(s));
      ++at;
      continue;
    }
    // Device pages: copied out through a staging buffer, a batch at a time.
    if (buf == nullptr) buf = mover.TakeStaging();
    size_t k = 0;
    std::vector<uint64_t> pages;
    std::vector<void*> dst;
    while (at + k < kept.size() && k < PageMover::kStagingBlocks &&
           kept[at + k].bytes == nullptr && buf != nullptr) {
      pages.push_back(kept[at + k].page);
      dst.push_back(buf->data() + k * pb);
      ++k;
    }
    if (k == 0 || !mover.CopyOut(pages, dst).ok()) {
      const size_t lost = std::max<size_t>(k, 1);
      dropped_error_.fetch_add(lost, std::memory_order_relaxed);
      MutexLock l(&queue_mu_);
      queued_bytes_ -= lost * value_bytes;
      at += lost;
      continue;
    }
    for (size_t i = 0; i < k; ++i) {
      auto s = std::make_shared<Staged>();
      s->block = kept[at + i].block;
      s->key = StoreKey(s->block.root, s->block.key);
      s->value = EncodeValue(s->block, dst[i], pb);
      staged.push_back(std::move(s));
    }
    at += k;
  }
  if (buf != nullptr) mover.ReturnStaging(std::move(buf));
  MutexLock l(&queue_mu_);
  for (std::shared_ptr<const Staged>& s : staged) {
    staged_[s->block.key] = s;
    queue_.push_back(std::move(s));
  }
}

void RemoteTier::Writer() {
  std::unique_ptr<RedisCluster> client;
  const std::string px = absl::StrCat(absl::ToInt64Milliseconds(options_.ttl));
  for (;;) {
    std::vector<std::shared_ptr<const Staged>> batch;
    {
      MutexLock l(&queue_mu_);
      queue_mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return stop_ || !queue_.empty();
      });
      if (queue_.empty()) return;  // stop_
      while (!queue_.empty() && batch.size() < kWriteBatch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      ++writing_;
    }
    std::vector<RedisCluster::Result> results;
    const bool admitted = Admit();
    if (admitted) {
      if (client == nullptr) client = Borrow();
      std::vector<RedisCluster::Command> cmds;
      cmds.reserve(batch.size());
      for (const auto& s : batch) {
        RedisCluster::Command c{.argv = {"SET", s->key, s->value}, .key = s->key};
        if (options_.ttl > absl::ZeroDuration()) {
          c.argv.push_back("PX");
          c.argv.push_back(px);
        }
        cmds.push_back(std::move(c));
      }
      client->Run(cmds, absl::Now() + options_.timeout, &results);
    }
    bool any_ok = false, any_failed = !admitted;
    for (size_t i = 0; i < batch.size(); ++i) {
      const bool ok = admitted && results[i].status.ok() &&
                      results[i].reply.type == RedisReply::Type::kStatus;
      if (ok) {
        any_ok = true;
        written_.fetch_add(1, std::memory_order_relaxed);
        bytes_written_.fetch_add(batch[i]->value.size(), std::memory_order_relaxed);
      } else {
        dropped_error_.fetch_add(1, std::memory_order_relaxed);
        if (admitted) {
          any_failed = true;
          write_errors_.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    if (admitted) Record(any_ok || !any_failed);
    MutexLock l(&queue_mu_);
    for (const auto& s : batch) {
      auto it = staged_.find(s->block.key);
      if (it != staged_.end() && it->second == s) staged_.erase(it);
      queued_bytes_ -= s->value.size();
    }
    --writing_;
  }
}

std::shared_ptr<const RemoteTier::Staged> RemoteTier::FindStaged(
    const BlockKey& key) const {
  MutexLock l(&queue_mu_);
  auto it = staged_.find(key);
  return it == staged_.end() ? nullptr : it->second;
}

size_t RemoteTier::CountPresentIn(const BlockKey& root,
                                  absl::Span<const BlockKey> keys) const {
  size_t n = 0;
  while (n < keys.size()) {
    std::shared_ptr<const Staged> s = FindStaged(keys[n]);
    if (s == nullptr) break;
    if (!(s->block.root == root)) return n;
    ++n;
  }
  if (n == keys.size() || !Admit()) return n;
  const size_t k = std::min(kReadBatch, keys.size() - n);
  std::vector<std::string> names;
  names.reserve(k);
  std::vector<RedisCluster::Command> cmds;
  cmds.reserve(k);
  for (size_t i = 0; i < k; ++i) names.push_back(StoreKey(root, keys[n + i]));
  for (const std::string& name : names) {
    cmds.push_back({.argv = {"EXISTS", name}, .key = name});
  }
  std::unique_ptr<RedisCluster> c = Borrow();
  std::vector<RedisCluster::Result> results;
  c->Run(cmds, absl::Now() + options_.timeout, &results);
  Return(std::move(c));
  bool failed = false;
  size_t found = 0;
  for (; found < k; ++found) {
    const RedisCluster::Result& r = results[found];
    if (!r.status.ok() || r.reply.type != RedisReply::Type::kInteger) {
      failed = true;
      break;
    }
    if (r.reply.integer != 1) break;
  }
  Record(!failed);
  if (failed) read_errors_.fetch_add(1, std::memory_order_relaxed);
  return n + found;
}

size_t RemoteTier::TakeIn(const BlockKey& root, absl::Span<const BlockKey> keys,
                          absl::Span<const uint64_t> pages, PageMover& mover,
                          std::vector<TierMove>* moves) {
  (void)moves;  // shared: the block stays, and no event is this node's
  const uint64_t pb = options_.page_bytes;
  const size_t want = std::min(keys.size(), kReadBatch);
  // Each block's bytes: a staged value's, or one fetched from the store.
  std::vector<std::shared_ptr<const Staged>> staged(want);
  size_t local = 0;
  for (; local < want; ++local) {
    staged[local] = FindStaged(keys[local]);
    if (staged[local] == nullptr || !(staged[local]->block.root == root)) break;
  }
  std::vector<RedisCluster::Result> results;
  std::vector<std::string> names;
  const bool asked = local < want && Admit();
  if (asked) {
    std::vector<RedisCluster::Command> cmds;
    for (size_t i = local; i < want; ++i) names.push_back(StoreKey(root, keys[i]));
    for (const std::string& name : names) {
      cmds.push_back({.argv = {"GET", name}, .key = name});
    }
    std::unique_ptr<RedisCluster> c = Borrow();
    c->Run(cmds, absl::Now() + options_.timeout, &results);
    Return(std::move(c));
  }
  std::vector<const void*> src;
  src.reserve(want);
  for (size_t i = 0; i < local; ++i) {
    src.push_back(staged[i]->value.data() + kRemoteHeaderBytes);
  }
  bool failed = false;
  for (size_t j = 0; j < results.size(); ++j) {
    const RedisCluster::Result& r = results[j];
    if (!r.status.ok()) {
      failed = true;
      read_errors_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    if (r.reply.type == RedisReply::Type::kNil) {
      misses_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    if (r.reply.type != RedisReply::Type::kString) {
      failed = true;
      read_errors_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    TierBlock b;
    absl::string_view data;
    const Check check = CheckValue(r.reply.str, root, keys[local + j], pb, &b, &data);
    if (check != Check::kOk) {
      checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      Log(LogLevel::kWarning,
          absl::StrCat("tier remote: ", names[j], " failed its check (",
                       check == Check::kBadHeader   ? "header"
                       : check == Check::kWrongBlock ? "another block's value"
                                                     : "data",
                       "); a miss"));
      break;
    }
    src.push_back(data.data());
  }
  if (asked) Record(!failed);
  const size_t n = src.size();
  if (n == 0) return 0;
  // Copies into the lease's new pages (owned by the caller).
  bool copied = true;
  std::vector<void*> direct(n);
  bool all_direct = true;
  for (size_t i = 0; i < n; ++i) {
    direct[i] = mover.host_address(pages[i]);
    if (direct[i] == nullptr) all_direct = false;
  }
  if (all_direct) {
    for (size_t i = 0; i < n; ++i) std::memcpy(direct[i], src[i], pb);
  } else {
    copied = mover.CopyIn(src, pages.first(n)).ok();
  }
  if (!copied) {
    dropped_error_.fetch_add(n, std::memory_order_relaxed);
    return 0;
  }
  promoted_.fetch_add(n, std::memory_order_relaxed);
  bytes_read_.fetch_add(n * pb, std::memory_order_relaxed);
  return n;
}

bool RemoteTier::Lookup(const BlockKey& key, TierBlock* out) const {
  std::shared_ptr<const Staged> s = FindStaged(key);
  if (s == nullptr) return false;
  *out = s->block;
  return true;
}

void RemoteTier::Flush() {
  MutexLock l(&queue_mu_);
  // Each staged batch gets its timeout; a store that takes longer loses
  // the rest when the process ends.
  const absl::Time deadline =
      absl::Now() + options_.timeout *
                        static_cast<double>(queue_.size() / kWriteBatch + 2);
  queue_mu_.AwaitWithDeadline(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return queue_.empty() && writing_ == 0;
      },
      deadline);
}

TierStats RemoteTier::stats() const {
  TierStats s;
  {
    MutexLock l(&queue_mu_);
    s.pending = staged_.size();
  }
  s.used = s.pending;
  s.demotions = written_.load(std::memory_order_relaxed);
  s.promotions = promoted_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.dropped_full = dropped_full_.load(std::memory_order_relaxed);
  s.dropped_error = dropped_error_.load(std::memory_order_relaxed);
  s.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.read_errors = read_errors_.load(std::memory_order_relaxed);
  s.write_errors = write_errors_.load(std::memory_order_relaxed);
  s.breaker_trips = breaker_trips_.load(std::memory_order_relaxed);
  s.unavailable = !available();
  return s;
}

}  // namespace radixkv::daemon
