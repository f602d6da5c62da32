#include "radix/turn_duel.h"

#include <algorithm>
#include <cassert>

namespace radixkv {
namespace radix_internal {

uint8_t TurnHistory::Next(absl::Span<const uint64_t> fps, size_t matched) {
  assert(!fps.empty() && "TurnHistory::Next: empty prompt");
  uint8_t turn = 0;
  // From the last block up to the one before the last matched one: a tail
  // still cached is matched (it is the next-to-last block of a prompt that
  // this one may extend in full), an evicted one is not.
  const size_t stop = matched > 1 ? matched - 2 : 0;
  for (size_t i = fps.size(); i-- > stop;) {
    auto it = turn_.find(fps[i]);
    if (it != turn_.end()) {
      turn = static_cast<uint8_t>(std::min(3, it->second.turn + 1));
      turn_.erase(it);
      break;
    }
  }
  const uint64_t tail = fps.size() > 1 ? fps[fps.size() - 2] : fps[0];
  ++serial_;
  turn_[tail] = Entry{turn, serial_};
  ring_.emplace_back(tail, serial_);
  if (ring_.size() > size_) {
    const auto [old, serial] = ring_.front();
    ring_.pop_front();
    auto it = turn_.find(old);
    if (it != turn_.end() && it->second.serial == serial) turn_.erase(it);
  }
  return turn;
}

void ListShadow::Serve(absl::Span<const uint64_t> sampled, bool admit) {
  std::vector<uint64_t> hits, fresh;  // deepest first
  for (size_t i = sampled.size(); i-- > 0;) {
    const uint64_t q = sampled[i];
    if (auto it = main_.find(q); it != main_.end()) {
      main_order_.splice(main_order_.end(), main_order_, it->second);
      hits.push_back(q);
    } else if (prob_.erase(q) != 0) {
      main_[q] = main_order_.insert(main_order_.end(), q);
      hits.push_back(q);
    } else {
      fresh.push_back(q);
    }
  }
  hits_ += hits.size();
  score_ += static_cast<double>(hits.size());
  int64_t over = static_cast<int64_t>(main_.size() + prob_.size() +
                                      fresh.size()) -
                 static_cast<int64_t>(capacity_);
  while (over > 0 && (!prob_.empty() || main_.size() > hits.size())) {
    if (!prob_.empty()) {
      const uint64_t q = stack_.back();
      stack_.pop_back();
      if (prob_.erase(q) == 0) continue;  // it left the stack by a hit
    } else {
      main_.erase(main_order_.front());
      main_order_.pop_front();
    }
    --over;
  }
  size_t skip = 0;  // the deepest that do not fit
  if (over > 0) skip = std::min(fresh.size(), static_cast<size_t>(over));
  if (admit) {
    for (size_t i = skip; i < fresh.size(); ++i) {
      main_[fresh[i]] = main_order_.insert(main_order_.end(), fresh[i]);
    }
    for (uint64_t q : hits) {
      main_order_.splice(main_order_.end(), main_order_, main_[q]);
    }
  } else {
    for (size_t i = fresh.size(); i-- > skip;) {
      prob_.insert(fresh[i]);
      stack_.push_back(fresh[i]);
    }
  }
  // Ids that left the stack by a hit are skipped when popped; trim them
  // when they outnumber the live ones, so that the stack stays bounded.
  if (stack_.size() > 2 * prob_.size() + 64) {
    // An id pushed again after leaving keeps its latest place.
    std::vector<uint64_t> live;
    live.reserve(prob_.size());
    absl::flat_hash_set<uint64_t> seen;
    for (size_t i = stack_.size(); i-- > 0;) {
      const uint64_t q = stack_[i];
      if (prob_.contains(q) && seen.insert(q).second) live.push_back(q);
    }
    std::reverse(live.begin(), live.end());
    stack_ = std::move(live);
  }
}

ThetaDuel::ThetaDuel(uint64_t capacity) {
  capacity = std::max<uint64_t>(1, capacity);
  const uint64_t rate = std::max<uint64_t>(1, capacity / kShadowBlocks);
  sample_limit_ = (uint64_t{1} << 32) / rate;
  shadows_.reserve(kThetas);
  for (int i = 0; i < kThetas; ++i) shadows_.emplace_back(capacity / rate);
}

bool ThetaDuel::Admitted(int theta, uint8_t turn, uint64_t last) {
  const int shift = theta - kTurnStep * turn;
  if (shift <= 0) return true;
  return ((last >> 32) & ((uint64_t{1} << shift) - 1)) == 0;
}

void ThetaDuel::Serve(absl::Span<const uint64_t> fps, uint8_t turn,
                      std::vector<uint64_t>* scratch) {
  const uint64_t last = fps.back();
  scratch->clear();
  for (uint64_t fp : fps) {
    if (static_cast<uint32_t>(fp) < sample_limit_) scratch->push_back(fp);
  }
  if (!scratch->empty()) {
    for (int theta = 0; theta < kThetas; ++theta) {
      shadows_[theta].Serve(*scratch, Admitted(theta, turn, last));
    }
  }
  int best = 0;
  for (int i = 0; i < kThetas; ++i) {
    shadows_[i].Decay(1.0 - kDecay);
    if (shadows_[i].score() > shadows_[best].score()) best = i;
  }
  const double cur = shadows_[theta_].score();
  const double lead = shadows_[best].score() - cur;
  if (best != theta_ && lead > cur * kMargin &&
      lead * lead > kEvidence * (cur + lead)) {
    theta_ = best;
    ++switches_;
  }
}

TurnDuel::TurnDuel(uint64_t capacity_pages, uint64_t lower_blocks)
    : pool_(capacity_pages) {
  if (lower_blocks != 0) tier_.emplace(capacity_pages + lower_blocks);
}

TurnDuel::Admission TurnDuel::Admit(absl::Span<const BlockKey> keys,
                                    size_t matched) {
  Admission a;
  if (keys.empty()) return a;
  fps_.clear();
  for (const BlockKey& k : keys) fps_.push_back(Fingerprint(k));
  const uint8_t turn = history_.Next(fps_, matched);
  const uint64_t last = fps_.back();
  pool_.Serve(fps_, turn, &sampled_);
  a.admit = ThetaDuel::Admitted(pool_.theta(), turn, last);
  if (tier_) {
    tier_->Serve(fps_, turn, &sampled_);
    a.demote = ThetaDuel::Admitted(tier_->theta(), turn, last);
  }
  ++(a.admit ? admitted_ : probationed_);
  return a;
}

}  // namespace radix_internal
}  // namespace radixkv
