#include "daemon/tiers/tier_chain.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace radixkv::daemon {

void TierLatency::Add(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(d)),
                    std::memory_order_relaxed);
}

std::array<uint64_t, TierLatency::kBounds.size() + 1> TierLatency::counts()
    const {
  std::array<uint64_t, kBounds.size() + 1> out;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = counts_[i].load(std::memory_order_relaxed);
  }
  return out;
}

double TierLatency::sum_seconds() const {
  return static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
}

// The tiers below tier `from - 1`: tier `from` first, then on down.
class TierChain::Below final : public TierSink {
 public:
  Below(const TierChain& chain, size_t from) : chain_(chain), from_(from) {}
  bool empty() const override { return from_ >= chain_.tiers_.size(); }
  void Put(absl::Span<const TierPut> blocks,
           std::vector<TierMove>* moves) override {
    if (empty() || blocks.empty()) return;
    Below next(chain_, from_ + 1);
    chain_.tiers_[from_]->Put(blocks, *chain_.mover_, next, moves);
  }

 private:
  const TierChain& chain_;
  const size_t from_;
};

namespace {

bool AnyWritesThrough(const std::vector<std::unique_ptr<Tier>>& tiers) {
  for (const std::unique_ptr<Tier>& t : tiers) {
    if (t->writes_through()) return true;
  }
  return false;
}

// Where a write-through put's leftovers go: nowhere (a copy of a block the
// pool still caches).
class NoSink final : public TierSink {
 public:
  bool empty() const override { return true; }
  void Put(absl::Span<const TierPut>, std::vector<TierMove>*) override {}
};

}  // namespace

TierChain::TierChain(std::vector<std::unique_ptr<Tier>> tiers)
    : tiers_(std::move(tiers)),
      writes_through_(AnyWritesThrough(tiers_)),
      latency_(std::make_unique<TierLatency[]>(tiers_.size())) {
  assert(!tiers_.empty());
}

TierChain::~TierChain() = default;

absl::Status TierChain::AttachPool(const gpu::PagePool* pool) {
  const uint64_t want = tiers_.front()->page_bytes();
  if (pool->page_bytes() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier: the tiers hold pages of ", want, " bytes, the pool's are ",
        pool->page_bytes()));
  }
  absl::StatusOr<std::unique_ptr<PageMover>> mover = PageMover::Create(pool);
  if (!mover.ok()) {
    return absl::Status(mover.status().code(),
                        absl::StrCat("--tier: ", mover.status().message()));
  }
  mover_ = *std::move(mover);
  return absl::OkStatus();
}

uint64_t TierChain::capacity_blocks() const {
  uint64_t total = 0;
  for (const std::unique_ptr<Tier>& t : tiers_) {
    if (t->capacity_blocks() == 0) return 0;
    total += t->capacity_blocks();
  }
  return total;
}

void TierChain::Demote(absl::Span<const EvictedPage> evicted,
                       std::vector<TierMove>* moves) {
  if (evicted.empty()) return;
  std::vector<TierPut> blocks;
  blocks.reserve(evicted.size());
  {
    MutexLock l(&flight_mu_);
    for (const EvictedPage& e : evicted) {
      blocks.push_back({.block = e.block, .ns = e.ns, .page = e.page});
      ++in_flight_[e.block.key];
    }
  }
  if (demote_hook_) demote_hook_();
  Below(*this, 0).Put(blocks, moves);
  MutexLock l(&flight_mu_);
  for (const EvictedPage& e : evicted) {
    auto it = in_flight_.find(e.block.key);
    if (--it->second == 0) in_flight_.erase(it);
  }
}

size_t TierChain::Promote(absl::Span<const BlockKey> keys,
                          absl::Span<const uint64_t> pages,
                          std::vector<TierMove>* moves, const BlockKey* root) {
  size_t done = 0;
  while (done < keys.size()) {
    size_t n = 0;
    for (size_t i = 0; i < tiers_.size() && n == 0; ++i) {
      const absl::Time start = absl::Now();
      n = root == nullptr
              ? tiers_[i]->Take(keys.subspan(done), pages.subspan(done),
                                *mover_, moves)
              : tiers_[i]->TakeIn(*root, keys.subspan(done),
                                  pages.subspan(done), *mover_, moves);
      if (n != 0) latency_[i].Add(absl::Now() - start);
    }
    if (n == 0) break;
    done += n;
  }
  return done;
}

size_t TierChain::Forget(absl::Span<const BlockKey> keys,
                         std::vector<TierMove>* moves) {
  std::vector<TierBlock> dropped;
  size_t n = 0;
  for (const std::unique_ptr<Tier>& t : tiers_) {
    dropped.clear();
    n += t->Forget(keys, &dropped);
    for (const TierBlock& b : dropped) {
      moves->push_back({.stored = false, .medium = t->medium(), .block = b});
    }
  }
  return n;
}

size_t TierChain::CountPresent(absl::Span<const BlockKey> keys,
                               std::array<size_t, kMediumCount>* by_medium,
                               const BlockKey* root) const {
  {
    // Blocks on their way down land in a tier (or are dropped) first.
    MutexLock l(&flight_mu_);
    flight_mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flight_mu_) {
      if (in_flight_.empty()) return true;
      for (const BlockKey& k : keys) {
        if (in_flight_.contains(k)) return false;
      }
      return true;
    });
  }
  size_t n = 0;
  while (n < keys.size()) {
    size_t m = 0;
    for (const std::unique_ptr<Tier>& t : tiers_) {
      m = root == nullptr ? t->CountPresent(keys.subspan(n))
                          : t->CountPresentIn(*root, keys.subspan(n));
      if (m == 0) continue;
      if (by_medium != nullptr) (*by_medium)[t->medium()] += m;
      break;
    }
    if (m == 0) break;
    n += m;
  }
  return n;
}

uint8_t TierChain::Locate(const BlockKey& key, TierBlock* out) const {
  for (const std::unique_ptr<Tier>& t : tiers_) {
    if (t->Lookup(key, out)) return t->medium();
  }
  return kMediumPool;
}

size_t TierChain::WriteThrough(absl::Span<const EvictedPage> blocks,
                               absl::FunctionRef<bool()> still_held) {
  if (!writes_through_ || mover_ == nullptr || blocks.empty()) return 0;
  const uint64_t pb = mover_->page_bytes();
  std::vector<char> copy(blocks.size() * pb);
  std::vector<uint64_t> pages;
  std::vector<void*> dst;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const void* direct = mover_->host_address(blocks[i].page);
    if (direct != nullptr) {
      std::memcpy(copy.data() + i * pb, direct, pb);
    } else {
      pages.push_back(blocks[i].page);
      dst.push_back(copy.data() + i * pb);
    }
  }
  if (!pages.empty() && !mover_->CopyOut(pages, dst).ok()) return 0;
  if (!still_held()) return 0;
  std::vector<TierPut> puts;
  puts.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    puts.push_back({.block = blocks[i].block,
                    .ns = blocks[i].ns,
                    .bytes = copy.data() + i * pb});
  }
  std::vector<TierMove> moves;  // write-through tiers are shared: none
  NoSink none;
  for (const std::unique_ptr<Tier>& t : tiers_) {
    if (t->writes_through()) t->Put(puts, *mover_, none, &moves);
  }
  return puts.size();
}

void TierChain::Flush() {
  for (const std::unique_ptr<Tier>& t : tiers_) t->Flush();
}

TierChain::DrainResult TierChain::Drain(absl::Span<const EvictedPage> pool,
                                        absl::Time deadline) {
  // The lowest tier that outlives the process receives; the tiers above
  // it lend what they hold.
  Tier* target = nullptr;
  size_t target_at = tiers_.size();  // none: every tier's blocks are left
  for (size_t i = tiers_.size(); i-- > 0;) {
    if (tiers_[i]->durable()) {
      target = tiers_[i].get();
      target_at = i;
      break;
    }
  }
  uint64_t total = pool.size();
  for (size_t i = 0; i < target_at; ++i) total += tiers_[i]->stats().used;
  DrainResult r;
  if (target == nullptr || mover_ == nullptr) {
    r.left = total;
    return r;
  }
  const uint64_t n = std::min<uint64_t>(total, target->capacity_blocks());
  const uint64_t first = target->ReserveSequences(n);
  uint64_t put = 0;  // blocks handed to the target, hottest first
  auto one = [&](const TierBlock& b, const void* bytes) {
    if (put >= n ||
        !target->PutForDrain(b, bytes, first + n - 1 - put, deadline)) {
      return false;
    }
    ++put;
    return true;
  };
  // The pool's blocks: a host pool's pages as they are, device pages
  // copied out in batches.
  std::unique_ptr<gpu::HostMemory> staging;
  const uint64_t pb = mover_->page_bytes();
  bool going = true;
  for (size_t at = 0; going && at < pool.size() && put < n;) {
    const void* direct = mover_->host_address(pool[at].page);
    if (direct != nullptr) {
      going = one(pool[at].block, direct);
      ++at;
      continue;
    }
    if (staging == nullptr) staging = mover_->TakeStaging();
    if (staging == nullptr) break;
    const size_t k = std::min(PageMover::kStagingBlocks, pool.size() - at);
    std::vector<uint64_t> pages(k);
    std::vector<void*> dst(k);
    for (size_t i = 0; i < k; ++i) {
      pages[i] = pool[at + i].page;
      dst[i] = staging->data() + i * pb;
    }
    if (!mover_->CopyOut(pages, dst).ok()) break;
    for (size_t i = 0; going && i < k; ++i) going = one(pool[at + i].block, dst[i]);
    at += k;
  }
  if (staging != nullptr) mover_->ReturnStaging(std::move(staging));
  for (size_t i = 0; going && i < target_at && put < n; ++i) {
    tiers_[i]->LendForDrain([&](const TierBlock& b, const void* bytes) {
      going = one(b, bytes);
      return going && put < n;
    });
  }
  const uint64_t cancelled = target->FinishDrain(deadline);
  r.drained = put - std::min<uint64_t>(put, cancelled);
  r.left = total - std::min(total, r.drained);
  return r;
}

Tier* TierChain::Find(TierKind kind) const {
  for (const std::unique_ptr<Tier>& t : tiers_) {
    if (t->kind() == kind) return t.get();
  }
  return nullptr;
}

}  // namespace radixkv::daemon
