// File: radix/turn_duel.h (private to radix/)
//
// The turn_duel eviction policy's state apart from the tree
// (eviction_policy.h says what the policy does): the turn history, the
// shadow caches, one per strength theta, and the current theta. The tree
// calls TurnDuel::Admit once per Acquire, under its lock, and keeps the
// main list and the probation stack of the blocks themselves.
//
// Thread safety: not thread-safe; the tree's lock guards it.
#ifndef RADIXKV_RADIX_TURN_DUEL_H_
#define RADIXKV_RADIX_TURN_DUEL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "radix/block_key.h"

namespace radixkv {
namespace radix_internal {

// The 64 bits of a block key the policy hashes on.
inline uint64_t Fingerprint(const BlockKey& k) { return k.lo ^ k.hi; }

// Which requests continue an earlier one, and how many times over.
//
// Remembers the last `size` requests' tails: the next-to-last full block
// of each prompt (its only one for a one-block prompt), which the next
// turn of the conversation holds even when it does not repeat the last
// block (one that a worker padded out to a full block). A request
// continues an earlier one when its prompt holds a remembered tail at or
// after the block before its last matched one; its turn is then that
// request's turn + 1 (at most 3), else 0, and the tail found is forgotten
// (a prefix shared by many requests counts as continued once).
class TurnHistory {
 public:
  explicit TurnHistory(size_t size = 2048) : size_(size) {}

  // The turn of a request whose prompt's block fingerprints are `fps`,
  // `matched` of them cached; records the request's tail with it.
  // REQUIRES: !fps.empty().
  uint8_t Next(absl::Span<const uint64_t> fps, size_t matched);

 private:
  struct Entry {
    uint8_t turn;
    uint64_t serial;  // of the request that left it
  };
  const size_t size_;
  uint64_t serial_ = 0;
  absl::flat_hash_map<uint64_t, Entry> turn_;
  std::deque<std::pair<uint64_t, uint64_t>> ring_;  // (tail, serial), oldest first
};

// A metadata-only cache of sampled fingerprints that plays one insertion
// strength: a main list (oldest first) and a probation stack (latest on
// top). Serve(sampled, admit) replays one request's sampled blocks (prompt
// order): held ones are hits and go to the main list's newest end; to make
// room for the others the stack's top, or when it is empty the main list's
// oldest, is dropped; the others go to the main list's newest end when
// `admit`, else on the stack, root side first. With every block sampled
// and admit always true it is leaf LRU exactly.
class ListShadow {
 public:
  explicit ListShadow(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  void Serve(absl::Span<const uint64_t> sampled, bool admit);
  double score() const { return score_; }
  void Decay(double f) { score_ *= f; }
  uint64_t hits() const { return hits_; }
  size_t size() const { return main_.size() + prob_.size(); }

 private:
  const size_t capacity_;
  std::list<uint64_t> main_order_;  // oldest first
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> main_;
  absl::flat_hash_set<uint64_t> prob_;
  std::vector<uint64_t> stack_;  // may hold ids that left prob_ by a hit
  uint64_t hits_ = 0;
  double score_ = 0;
};

// One duel over the strengths theta = 0 .. kThetas-1 for a cache of
// `capacity` blocks: a ListShadow per theta over the sampled blocks, and
// the theta picked.
class ThetaDuel {
 public:
  static constexpr int kThetas = 10;     // theta = 0 .. 9
  static constexpr int kTurnStep = 2;    // each turn weakens theta by this
  static constexpr size_t kShadowBlocks = 512;
  static constexpr double kDecay = 1e-4;     // score decay per request
  static constexpr double kMargin = 0.02;    // relative lead to switch
  static constexpr double kEvidence = 4.0;   // lead^2 > kEvidence * score

  explicit ThetaDuel(uint64_t capacity);

  // Whether a request of turn `turn` whose last block has fingerprint
  // `last` is admitted under `theta`: the low max(0, theta - 2 turn) bits
  // of its hash are zero.
  static bool Admitted(int theta, uint8_t turn, uint64_t last);

  // One request with block fingerprints `fps` (prompt order, not empty)
  // of turn `turn`: every shadow plays it under its theta, then the
  // scores decay and theta moves to the best shadow's when that one leads
  // the current one's by kMargin and by two standard deviations of a
  // Poisson count. `scratch` is reused storage.
  void Serve(absl::Span<const uint64_t> fps, uint8_t turn,
             std::vector<uint64_t>* scratch);

  int theta() const { return theta_; }
  uint64_t switches() const { return switches_; }

 private:
  uint64_t sample_limit_;  // a block is sampled when its low 32 bits are below
  std::vector<ListShadow> shadows_;
  int theta_ = 0;
  uint64_t switches_ = 0;
};

// turn_duel's state: the turn history and two duels. The pool's duel
// (its capacity) decides where a request's new blocks go; with tiers of
// `lower_blocks` below the pool, a second duel for a cache of the pool
// and the tiers together decides whether those of them that wait on
// probation are worth a tier's write when evicted.
class TurnDuel {
 public:
  // What one Acquire's new blocks get.
  struct Admission {
    bool admit = true;   // the recency list (true) or the probation stack
    // Demoted to the tiers when evicted from probation (false: dropped).
    bool demote = true;
  };

  // lower_blocks: the tiers' blocks below the pool in all; 0: none, or of
  // unknown size (every victim is then demoted).
  TurnDuel(uint64_t capacity_pages, uint64_t lower_blocks);

  // One Acquire of a prompt whose full blocks have keys `keys`, `matched`
  // of them cached: updates the history and the duels. An empty prompt
  // is admitted and changes nothing.
  Admission Admit(absl::Span<const BlockKey> keys, size_t matched);

  int theta() const { return pool_.theta(); }
  uint64_t switches() const { return pool_.switches(); }
  // The tier duel's theta and changes; 0 without one.
  int tier_theta() const { return tier_ ? tier_->theta() : 0; }
  uint64_t tier_switches() const { return tier_ ? tier_->switches() : 0; }
  uint64_t admitted() const { return admitted_; }
  uint64_t probationed() const { return probationed_; }

 private:
  TurnHistory history_;
  ThetaDuel pool_;
  std::optional<ThetaDuel> tier_;
  uint64_t admitted_ = 0;
  uint64_t probationed_ = 0;
  std::vector<uint64_t> fps_;      // scratch
  std::vector<uint64_t> sampled_;  // scratch
};

}  // namespace radix_internal
}  // namespace radixkv

#endif  // RADIXKV_RADIX_TURN_DUEL_H_
