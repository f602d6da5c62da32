// The eviction policies' names, and turn_duel's state apart from the tree
// (radix/eviction_policy.h, radix/turn_duel.h): the turn history, the
// shadow caches and the choice of theta.
#include "radix/eviction_policy.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "radix/radix_tree.h"
#include "radix/turn_duel.h"

namespace radixkv {
namespace {

using radix_internal::ListShadow;
using radix_internal::TurnDuel;
using radix_internal::TurnHistory;

TEST(EvictionPolicyNames, ParseEveryNameAndRefuseOthers) {
  EvictionPolicy p;
  ASSERT_TRUE(ParseEvictionPolicy("lru", &p));
  EXPECT_EQ(p, EvictionPolicy::kLru);
  ASSERT_TRUE(ParseEvictionPolicy("turn_duel", &p));
  EXPECT_EQ(p, EvictionPolicy::kTurnDuel);
  EXPECT_STREQ(EvictionPolicyName(EvictionPolicy::kTurnDuel), "turn_duel");
  EXPECT_FALSE(ParseEvictionPolicy("LRU", &p));
  EXPECT_FALSE(ParseEvictionPolicy("", &p));
  EXPECT_EQ(EvictionPolicyNames(), "lru, turn_duel");
}

TEST(TurnHistory, ContinuationsCountTurnsUpToThree) {
  TurnHistory h;
  std::vector<uint64_t> prompt = {1, 2};
  EXPECT_EQ(h.Next(prompt, 0), 0);  // a new conversation
  for (uint8_t want : {1, 2, 3, 3}) {
    prompt.push_back(prompt.back() + 1);  // the next turn extends it
    EXPECT_EQ(h.Next(prompt, prompt.size() - 1), want);
  }
  // Another conversation starts at turn 0.
  EXPECT_EQ(h.Next(std::vector<uint64_t>{100, 101}, 0), 0);
}

TEST(TurnHistory, ATailCountsOnceAndOnlyFromTheBlockBeforeTheLastMatch) {
  TurnHistory h;
  EXPECT_EQ(h.Next(std::vector<uint64_t>{1, 2}, 0), 0);  // tail 1
  // Two requests extend the same prompt: only the first continues it.
  EXPECT_EQ(h.Next(std::vector<uint64_t>{1, 2, 3}, 2), 1);
  EXPECT_EQ(h.Next(std::vector<uint64_t>{1, 5}, 1), 0);
  // The tail is the next-to-last block: a prompt that repeats all of an
  // earlier one, or all but its last block, continues it.
  EXPECT_EQ(h.Next(std::vector<uint64_t>{20, 21, 22}, 0), 0);  // tail 21
  EXPECT_EQ(h.Next(std::vector<uint64_t>{20, 21, 23, 24}, 2), 1);
  EXPECT_EQ(h.Next(std::vector<uint64_t>{30, 31, 32}, 0), 0);  // tail 31
  EXPECT_EQ(h.Next(std::vector<uint64_t>{30, 31, 32, 33}, 3), 1);
  // A remembered tail before the block before the last matched one is not
  // looked at.
  EXPECT_EQ(h.Next(std::vector<uint64_t>{7, 8, 9}, 0), 0);  // tail 8
  EXPECT_EQ(h.Next(std::vector<uint64_t>{7, 8, 9, 10, 11}, 5), 0);
}

TEST(TurnHistory, ForgetsTailsBeyondItsSize) {
  TurnHistory h(/*size=*/2);
  EXPECT_EQ(h.Next(std::vector<uint64_t>{1}, 0), 0);
  EXPECT_EQ(h.Next(std::vector<uint64_t>{2}, 0), 0);
  EXPECT_EQ(h.Next(std::vector<uint64_t>{3}, 0), 0);  // 1 is forgotten
  EXPECT_EQ(h.Next(std::vector<uint64_t>{1, 5}, 0), 0);
  EXPECT_EQ(h.Next(std::vector<uint64_t>{3, 6}, 0), 1);
}

TEST(ListShadow, AdmittingEverythingIsLeafLru) {
  ListShadow s(/*capacity=*/3);
  s.Serve(std::vector<uint64_t>{1, 2}, true);   // [2, 1] (deeper older)
  s.Serve(std::vector<uint64_t>{3}, true);      // [2, 1, 3]
  s.Serve(std::vector<uint64_t>{1, 4}, true);   // 1 hits; 2 goes: [3, 4, 1]
  EXPECT_EQ(s.hits(), 1u);
  s.Serve(std::vector<uint64_t>{2}, true);      // a miss; 3 goes
  s.Serve(std::vector<uint64_t>{1, 4}, true);   // both still held
  EXPECT_EQ(s.hits(), 3u);
  s.Serve(std::vector<uint64_t>{3}, true);
  EXPECT_EQ(s.hits(), 3u);
  EXPECT_EQ(s.size(), 3u);
}

TEST(ListShadow, ProbationBlocksGoFirstAndAHitSavesThem) {
  ListShadow s(/*capacity=*/3);
  s.Serve(std::vector<uint64_t>{1}, true);
  s.Serve(std::vector<uint64_t>{2, 3}, false);  // on the stack, 3 on top
  s.Serve(std::vector<uint64_t>{4}, true);      // 3 leaves, not 1
  s.Serve(std::vector<uint64_t>{1}, true);
  EXPECT_EQ(s.hits(), 1u);
  s.Serve(std::vector<uint64_t>{2}, true);      // 2 was kept: a hit
  EXPECT_EQ(s.hits(), 2u);
  s.Serve(std::vector<uint64_t>{3}, true);
  EXPECT_EQ(s.hits(), 2u);
  EXPECT_EQ(s.size(), 3u);
}

// Keys whose fingerprints are what the test asks for.
BlockKey KeyWithFingerprint(uint64_t fp) { return BlockKey{0, fp}; }

TEST(TurnDuel, StartsAtLruAndAdmitsEverythingThere) {
  TurnDuel d(/*capacity_pages=*/100, /*lower_blocks=*/0);
  std::vector<BlockKey> keys;
  for (uint64_t i = 1; i <= 4; ++i) keys.push_back(KeyWithFingerprint(i << 40));
  EXPECT_TRUE(d.Admit(keys, 0).admit);
  EXPECT_TRUE(d.Admit(keys, 0).demote);  // no tier duel: always
  EXPECT_EQ(d.theta(), 0);
  EXPECT_TRUE(d.Admit({}, 0).admit);
  EXPECT_EQ(d.admitted(), 2u);
}

// The scan workload, as turn_duel sees it: `rounds` times, four hot
// prompts of 8 blocks come back, then 8 one-shot prompts of 8 blocks
// pass. Returns the requests whose new blocks would be dropped rather
// than demoted.
uint64_t PlayScans(TurnDuel& d, int rounds) {
  uint64_t next = 1;
  auto fresh = [&](int blocks) {
    std::vector<BlockKey> k;
    for (int i = 0; i < blocks; ++i) {
      // Distinct fingerprints whose high bits vary, so that bimodal
      // admission takes a share of the scan's requests.
      k.push_back(KeyWithFingerprint((next * 0x9E3779B97F4A7C15ull) | 1));
      ++next;
    }
    return k;
  };
  std::vector<std::vector<BlockKey>> hot;
  for (int i = 0; i < 4; ++i) hot.push_back(fresh(8));
  uint64_t undemoted = 0;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& h : hot) undemoted += !d.Admit(h, 0).demote;
    for (int i = 0; i < 8; ++i) undemoted += !d.Admit(fresh(8), 0).demote;
  }
  return undemoted;
}

// A scan of one-shot prompts through a small cache, between which a few
// prompts come back: LRU loses them to the scan, so turn_duel moves to a
// theta that keeps the scan on probation, and then hits what returns.
TEST(TurnDuel, LeavesLruWhenAShadowDoesBetter) {
  TurnDuel d(/*capacity_pages=*/64, /*lower_blocks=*/0);
  PlayScans(d, 400);
  EXPECT_GT(d.theta(), 0);
  EXPECT_GE(d.switches(), 1u);
  EXPECT_GT(d.probationed(), 0u);
}

// The tier duel plays a cache of the pool and the tiers together: over a
// tier that adds one block it sides with the pool's duel and keeps some of
// the scan's probation blocks from the tier; over a tier that holds the
// whole scan it demotes every one; without a tier every one is demoted.
TEST(TurnDuel, TierDuelDecidesWhatProbationBlocksAreWorthDemoting) {
  TurnDuel small(/*capacity_pages=*/64, /*lower_blocks=*/1);
  EXPECT_GT(PlayScans(small, 400), 0u);
  EXPECT_GT(small.tier_theta(), 0);
  TurnDuel large(/*capacity_pages=*/64, /*lower_blocks=*/uint64_t{1} << 20);
  EXPECT_EQ(PlayScans(large, 400), 0u);
  EXPECT_EQ(large.tier_theta(), 0);
  TurnDuel none(/*capacity_pages=*/64, /*lower_blocks=*/0);
  EXPECT_EQ(PlayScans(none, 400), 0u);
  EXPECT_EQ(none.tier_theta(), 0);
}

// The same workload under each policy: four hot prompts of 8 blocks come
// back between scans of one-shot prompts that push them out of an LRU of
// 64 pages. turn_duel keeps them on the recency list and lets the scan
// churn the probation stack; the tree's invariants hold throughout.
struct ScanRun {
  uint64_t hot_hits = 0;  // matched blocks of the hot prompts
  uint64_t offered = 0;   // evicted blocks with EvictedBlock::demote
  uint64_t kept = 0;      // evicted blocks without it
};

ScanRun RunScans(EvictionPolicy policy, uint64_t lower_tier_blocks = 0) {
  constexpr uint32_t kPageSize = 4;
  ScanRun run;
  auto tree = RadixTree::Create({.capacity_pages = 64,
                                 .eviction_policy = policy,
                                 .lower_tier_blocks = lower_tier_blocks});
  EXPECT_TRUE(tree.ok()) << tree.status();
  if (!tree.ok()) return run;
  const NamespaceSpec spec{.model = "m", .num_layers = 1, .num_kv_heads = 1,
                           .head_dim = 4, .page_size = kPageSize,
                           .dtype = DType::kFloat32};
  const NamespaceId ns = (*tree)->RegisterNamespace(spec).value();
  uint32_t next = 1;
  auto prompt = [&](uint32_t blocks) {
    std::vector<uint32_t> t(blocks * kPageSize);
    for (uint32_t& x : t) x = next++;
    return t;
  };
  // One request: Acquire, commit every new block, release. Returns the
  // matched blocks.
  auto serve = [&](const std::vector<uint32_t>& tokens) -> uint32_t {
    const uint64_t probation_before = (*tree)->GetStats().probation_pages;
    const std::vector<BlockKey> keys =
        ComputeBlockKeys((*tree)->namespace_root(ns), kPageSize, tokens);
    absl::StatusOr<AcquireResult> r = (*tree)->Acquire(
        {.ns = ns, .keys = keys, .tokens = tokens, .allocate = true,
         .report_evictions = true});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    uint64_t kept_here = 0;
    for (const EvictedBlock& e : r->evicted) kept_here += !e.demote;
    run.offered += r->evicted.size() - kept_here;
    run.kept += kept_here;
    // Only probation blocks are ever kept from the tiers.
    EXPECT_LE(kept_here, probation_before);
    if (r->lease != 0) {
      EXPECT_TRUE((*tree)->Commit(r->lease, r->new_blocks, true).ok());
    }
    return r->matched_blocks;
  };
  std::vector<std::vector<uint32_t>> hot;
  for (int i = 0; i < 4; ++i) hot.push_back(prompt(8));
  for (int round = 0; round < 300; ++round) {
    for (const auto& h : hot) run.hot_hits += serve(h);
    for (int i = 0; i < 8; ++i) serve(prompt(8));
    if (round % 50 == 0) {
      EXPECT_TRUE((*tree)->CheckInvariants().ok())
          << (*tree)->CheckInvariants();
    }
  }
  EXPECT_TRUE((*tree)->CheckInvariants().ok()) << (*tree)->CheckInvariants();
  return run;
}

TEST(TreePolicy, TheTierDuelDecidesWhichEvictedBlocksAreDemoted) {
  // lru, and turn_duel without tiers or over tiers that hold the scan,
  // offer every evicted block.
  for (auto [policy, lower] :
       {std::pair{EvictionPolicy::kLru, uint64_t{0}},
        std::pair{EvictionPolicy::kLru, uint64_t{1}},
        std::pair{EvictionPolicy::kTurnDuel, uint64_t{0}},
        std::pair{EvictionPolicy::kTurnDuel, uint64_t{1} << 20}}) {
    const ScanRun run = RunScans(policy, lower);
    EXPECT_GT(run.offered, 0u) << EvictionPolicyName(policy) << " " << lower;
    EXPECT_EQ(run.kept, 0u) << EvictionPolicyName(policy) << " " << lower;
  }
  // Over a tier of one block, the scan is not worth the tier's writes.
  const ScanRun run = RunScans(EvictionPolicy::kTurnDuel, 1);
  EXPECT_GT(run.kept, run.offered) << run.offered;
}

TEST(TreePolicy, TurnDuelKeepsAHotSetThroughScansThatLruLoses) {
  const uint64_t lru = RunScans(EvictionPolicy::kLru).hot_hits;
  const uint64_t duel = RunScans(EvictionPolicy::kTurnDuel).hot_hits;
  EXPECT_EQ(lru, 0u);  // reuse distance 96 blocks over 64 pages
  EXPECT_GT(duel, 300u * 32 / 2) << "lru " << lru;
}

}  // namespace
}  // namespace radixkv
