#include "daemon/tier_chain.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/log.h"

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

TierChain::TierChain(std::unique_ptr<HostTier> host,
                     std::unique_ptr<DiskTier> disk)
    : host_(std::move(host)), disk_(std::move(disk)) {}

TierChain::~TierChain() = default;

absl::Status TierChain::AttachPool(const gpu::PagePool* pool) {
  const uint64_t want =
      host_ != nullptr ? host_->page_bytes() : disk_->page_bytes();
  if (pool->page_bytes() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier: the tiers hold pages of ", want, " bytes, the pool's are ",
        pool->page_bytes()));
  }
  absl::StatusOr<std::unique_ptr<gpu::PageCopier>> copier =
      gpu::CreatePageCopier(*pool);
  if (!copier.ok()) {
    return absl::Status(copier.status().code(),
                        absl::StrCat("--tier: ", copier.status().message()));
  }
  copier_ = *std::move(copier);
  pool_ = pool;
  direct_ = pool->host_page_address(0) != nullptr;
  return absl::OkStatus();
}

void TierChain::CopyFailed(const absl::Status& s) {
  copy_errors_.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kWarning,
      absl::StrCat("tier: a page copy failed, its blocks are dropped: ",
                   s.ToString()));
}

std::unique_ptr<gpu::HostMemory> TierChain::TakeBounce() {
  {
    WriterMutexLock l(&bounce_mu_);
    if (!bounce_.empty()) {
      std::unique_ptr<gpu::HostMemory> b = std::move(bounce_.back());
      bounce_.pop_back();
      return b;
    }
  }
  absl::StatusOr<std::unique_ptr<gpu::HostMemory>> b =
      copier_->AllocateHost(kBounceBlocks * pool_->page_bytes());
  if (!b.ok()) {
    CopyFailed(b.status());
    return nullptr;
  }
  return *std::move(b);
}

void TierChain::ReturnBounce(std::unique_ptr<gpu::HostMemory> b) {
  if (b == nullptr) return;
  WriterMutexLock l(&bounce_mu_);
  bounce_.push_back(std::move(b));
}

// ---- Down ------------------------------------------------------------------

void TierChain::Demote(absl::Span<const EvictedPage> evicted,
                       std::vector<TierMove>* moves) {
  if (evicted.empty()) return;
  if (host_ != nullptr) {
    DemoteToHost(evicted, moves);
  } else {
    DemoteToDisk(evicted, moves);
  }
}

void TierChain::PutOnDisk(const TierBlock& block, const void* bytes,
                          NamespaceId ns, std::vector<TierMove>* moves) {
  std::vector<TierBlock> forgotten;
  if (!disk_->Put(block, bytes, &forgotten)) return;
  for (const TierBlock& f : forgotten) {
    moves->push_back({.stored = false, .medium = kMediumDiskTier, .block = f});
  }
  moves->push_back(
      {.stored = true, .medium = kMediumDiskTier, .block = block, .ns = ns});
}

void TierChain::Spill(const TierBlock& victim, const void* bytes,
                      std::vector<TierMove>* moves) {
  moves->push_back({.stored = false, .medium = kMediumHostTier, .block = victim});
  if (disk_ != nullptr) PutOnDisk(victim, bytes, 0, moves);
}

// The blocks arrive oldest first. The host tier takes the newest that fit
// in it; the older ones, and the host tier's own least recently stored
// blocks that make room, go on down to the disk tier (if any) oldest first,
// so the two tiers together keep one least-recently-demoted order.
void TierChain::DemoteToHost(absl::Span<const EvictedPage> evicted,
                             std::vector<TierMove>* moves) {
  const size_t skip =
      evicted.size() > host_->capacity_blocks()
          ? evicted.size() - static_cast<size_t>(host_->capacity_blocks())
          : 0;
  const absl::Span<const EvictedPage> head = evicted.first(skip);
  const absl::Span<const EvictedPage> tail = evicted.subspan(skip);
  std::vector<TierBlock> blocks;
  blocks.reserve(tail.size());
  for (const EvictedPage& e : tail) blocks.push_back(e.block);
  std::vector<HostTier::Reservation> res;
  const size_t n = host_->Reserve(blocks, &res);
  // A victim's bytes leave its slot before the new block's bytes land.
  for (const HostTier::Reservation& r : res) {
    if (r.has_victim) Spill(r.victim, r.dst, moves);
  }
  // Blocks the host tier cannot hold (more than it has, or no slot free of
  // copies in flight) go straight to the disk tier.
  std::vector<EvictedPage> straight(head.begin(), head.end());
  straight.insert(straight.end(), tail.begin() + n, tail.end());
  if (disk_ != nullptr) {
    if (!straight.empty()) DemoteToDisk(straight, moves);
  } else {
    host_->CountDropped(head.size());  // Reserve counted the rest
  }
  std::vector<uint64_t> pages(n);
  std::vector<void*> dst(n);
  for (size_t i = 0; i < n; ++i) {
    pages[i] = tail[i].page;
    dst[i] = res[i].dst;
  }
  std::unique_ptr<gpu::PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyOut(pages, dst);
  const absl::Status s = batch->Wait();
  if (!s.ok()) CopyFailed(s);
  host_->Publish(res, s.ok());
  if (!s.ok()) return;
  for (size_t i = 0; i < n; ++i) {
    moves->push_back({.stored = true,
                      .medium = kMediumHostTier,
                      .block = tail[i].block,
                      .ns = tail[i].ns});
  }
}

void TierChain::DemoteToDisk(absl::Span<const EvictedPage> evicted,
                             std::vector<TierMove>* moves) {
  if (direct_) {
    for (const EvictedPage& e : evicted) {
      PutOnDisk(e.block, pool_->host_page_address(e.page), e.ns, moves);
    }
    return;
  }
  std::unique_ptr<gpu::HostMemory> bounce = TakeBounce();
  if (bounce == nullptr) return;
  const uint64_t pb = pool_->page_bytes();
  std::unique_ptr<gpu::PageCopier::Batch> batch = copier_->NewBatch();
  for (size_t at = 0; at < evicted.size(); at += kBounceBlocks) {
    const size_t n = std::min(kBounceBlocks, evicted.size() - at);
    std::vector<uint64_t> pages(n);
    std::vector<void*> dst(n);
    for (size_t i = 0; i < n; ++i) {
      pages[i] = evicted[at + i].page;
      dst[i] = bounce->data() + i * pb;
    }
    batch->CopyOut(pages, dst);
    if (absl::Status s = batch->Wait(); !s.ok()) {
      CopyFailed(s);
      break;
    }
    for (size_t i = 0; i < n; ++i) {
      PutOnDisk(evicted[at + i].block, dst[i], evicted[at + i].ns, moves);
    }
  }
  ReturnBounce(std::move(bounce));
}

// ---- Up --------------------------------------------------------------------

size_t TierChain::Promote(absl::Span<const BlockKey> keys,
                          absl::Span<const uint64_t> pages,
                          std::vector<TierMove>* moves) {
  size_t done = 0;
  while (done < keys.size()) {
    size_t n = 0;
    if (host_ != nullptr) {
      n = PromoteFromHost(keys.subspan(done), pages.subspan(done), moves);
    }
    if (n == 0 && disk_ != nullptr) {
      n = PromoteFromDisk(keys.subspan(done), pages.subspan(done), moves);
    }
    if (n == 0) break;
    done += n;
  }
  return done;
}

size_t TierChain::PromoteFromHost(absl::Span<const BlockKey> keys,
                                  absl::Span<const uint64_t> pages,
                                  std::vector<TierMove>* moves) {
  std::vector<uint32_t> slots;
  std::vector<const void*> src;
  const absl::Time start = absl::Now();
  const size_t n = host_->Claim(keys, &slots, &src);
  if (n == 0) return 0;
  std::unique_ptr<gpu::PageCopier::Batch> batch = copier_->NewBatch();
  batch->CopyIn(src, pages.first(n));
  const absl::Status s = batch->Wait();
  if (!s.ok()) CopyFailed(s);
  host_->Finish(slots, s.ok());
  if (!s.ok()) return 0;
  host_latency_.Add(absl::Now() - start);
  for (size_t i = 0; i < n; ++i) {
    moves->push_back({.stored = false,
                      .medium = kMediumHostTier,
                      .block = {.key = keys[i]}});
  }
  return n;
}

size_t TierChain::PromoteFromDisk(absl::Span<const BlockKey> keys,
                                  absl::Span<const uint64_t> pages,
                                  std::vector<TierMove>* moves) {
  const absl::Time start = absl::Now();
  size_t got = 0;
  // Blocks that failed their checksum (or read) left the tier: published
  // as removed like any other departure.
  std::vector<BlockKey> dropped;
  if (direct_) {
    std::vector<void*> dst(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      dst[i] = pool_->host_page_address(pages[i]);
    }
    got = disk_->Take(keys, dst, &dropped);
  } else {
    std::unique_ptr<gpu::HostMemory> bounce = TakeBounce();
    if (bounce == nullptr) return 0;
    const uint64_t pb = pool_->page_bytes();
    std::unique_ptr<gpu::PageCopier::Batch> batch = copier_->NewBatch();
    while (got < keys.size()) {
      const size_t want = std::min(kBounceBlocks, keys.size() - got);
      std::vector<void*> dst(want);
      for (size_t i = 0; i < want; ++i) dst[i] = bounce->data() + i * pb;
      const size_t n = disk_->Take(keys.subspan(got, want), dst, &dropped);
      if (n == 0) break;
      batch->CopyIn(absl::MakeConstSpan(
                        reinterpret_cast<const void* const*>(dst.data()), n),
                    pages.subspan(got, n));
      if (absl::Status s = batch->Wait(); !s.ok()) {
        // The blocks left the disk tier with Take: they are lost.
        CopyFailed(s);
        break;
      }
      got += n;
      if (n < want) break;
    }
    ReturnBounce(std::move(bounce));
  }
  if (got != 0) disk_latency_.Add(absl::Now() - start);
  for (size_t i = 0; i < got; ++i) {
    moves->push_back({.stored = false,
                      .medium = kMediumDiskTier,
                      .block = {.key = keys[i]}});
  }
  for (const BlockKey& k : dropped) {
    moves->push_back(
        {.stored = false, .medium = kMediumDiskTier, .block = {.key = k}});
  }
  return got;
}

size_t TierChain::Forget(absl::Span<const BlockKey> keys,
                         std::vector<TierMove>* moves) {
  std::vector<TierBlock> dropped;
  size_t n = 0;
  const auto forget = [&](auto* tier, uint8_t medium) {
    if (tier == nullptr) return;
    dropped.clear();
    n += tier->Forget(keys, &dropped);
    for (const TierBlock& b : dropped) {
      moves->push_back({.stored = false, .medium = medium, .block = b});
    }
  };
  forget(host_.get(), kMediumHostTier);
  forget(disk_.get(), kMediumDiskTier);
  return n;
}

// ---- Lookups ---------------------------------------------------------------

size_t TierChain::CountPresent(absl::Span<const BlockKey> keys,
                               std::array<size_t, 3>* by_medium) const {
  size_t n = 0;
  while (n < keys.size()) {
    uint8_t medium = kMediumHostTier;
    size_t m = host_ != nullptr ? host_->CountPresent(keys.subspan(n)) : 0;
    if (m == 0 && disk_ != nullptr) {
      medium = kMediumDiskTier;
      m = disk_->CountPresent(keys.subspan(n));
    }
    if (m == 0) break;
    if (by_medium != nullptr) (*by_medium)[medium] += m;
    n += m;
  }
  return n;
}

uint8_t TierChain::Locate(const BlockKey& key, TierBlock* out) const {
  if (host_ != nullptr && host_->Lookup(key, out)) return kMediumHostTier;
  if (disk_ != nullptr && disk_->Lookup(key, out)) return kMediumDiskTier;
  return 0;
}

void TierChain::Flush() {
  if (disk_ != nullptr) disk_->Flush();
}

}  // namespace radixkv::daemon
