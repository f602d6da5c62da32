// Randomized differential test: RadixTree against a deliberately simple
// reference model (std::map of keys, O(n) scans for the LRU leaf), over
// thousands of random Acquire / Commit / Release / Evict steps per seed.
// After every step the results, the page counts, the cached key set with
// refcounts and CheckInvariants must agree.
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"

namespace radixkv {
namespace {

using Tokens = std::vector<uint32_t>;
using Key = std::pair<uint64_t, uint64_t>;

Key K(const BlockKey& k) { return {k.hi, k.lo}; }

// The reference: every rule spelled out plainly, nothing clever.
class Model {
 public:
  explicit Model(uint32_t capacity) : free_(capacity) {}

  struct Node {
    NamespaceId ns;
    std::optional<Key> parent;
    Tokens tokens;  // empty: key mode
    uint32_t refs = 0;
    uint64_t stamp = 0;  // when it last became unpinned
  };
  struct Lease {
    NamespaceId ns;
    bool has_tokens;
    bool broken = false;
    uint32_t committed = 0;
    uint32_t inserted = 0;  // new pages that became nodes
    std::vector<Key> path;
    std::vector<Key> new_keys;
    std::vector<Tokens> new_tokens;
  };

  AcquireResult Acquire(NamespaceId ns, const std::vector<BlockKey>& keys,
                        const Tokens& tokens, bool allocate, uint32_t ps) {
    AcquireResult r;
    r.total_blocks = static_cast<uint32_t>(keys.size());
    std::optional<Key> parent;
    std::vector<Key> path;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = nodes_.find(K(keys[i]));
      if (it == nodes_.end()) break;
      const Tokens block = Block(tokens, i, ps);
      if (!Same(it->second, ns, parent, block)) {
        ++r.collisions;
        break;
      }
      path.push_back(K(keys[i]));
      parent = K(keys[i]);
    }
    r.matched_blocks = static_cast<uint32_t>(path.size());
    for (const Key& k : path) ++nodes_[k].refs;
    Lease lease{ns, !tokens.empty()};
    lease.path = path;
    if (allocate) {
      for (size_t i = path.size(); i < keys.size(); ++i) {
        if (free_ == 0) {
          if (!EvictOne()) break;
          ++r.evicted_pages;
        }
        --free_;
        ++writing_;
        lease.new_keys.push_back(K(keys[i]));
        lease.new_tokens.push_back(Block(tokens, i, ps));
      }
    }
    r.new_blocks = static_cast<uint32_t>(lease.new_keys.size());
    if (r.matched_blocks + r.new_blocks > 0) {
      r.lease = next_lease_++;
      leases_.emplace(r.lease, std::move(lease));
    }
    return r;
  }

  // nullopt: NOT_FOUND or FAILED_PRECONDITION (no change).
  std::optional<CommitResult> Commit(LeaseId id, uint32_t blocks,
                                     bool release) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return std::nullopt;
    Lease& l = it->second;
    if (blocks > l.new_keys.size() - l.committed) return std::nullopt;
    CommitResult r;
    for (uint32_t j = l.committed; j < l.committed + blocks; ++j) {
      if (l.broken) {
        ++r.collided;
        continue;
      }
      const Key& k = l.new_keys[j];
      std::optional<Key> parent;
      if (!l.path.empty()) parent = l.path.back();
      auto hit = nodes_.find(k);
      if (hit != nodes_.end()) {
        if (Same(hit->second, l.ns, parent, l.new_tokens[j])) {
          ++hit->second.refs;
          l.path.push_back(k);
          ++r.deduplicated;
        } else {
          l.broken = true;
          ++r.collided;
        }
        continue;
      }
      nodes_[k] = Node{l.ns, parent, l.new_tokens[j], 1, 0};
      --writing_;
      l.path.push_back(k);
      ++l.inserted;
      ++r.inserted;
    }
    l.committed += blocks;
    if (release) {
      End(l);
      leases_.erase(it);
      r.released = true;
    }
    return r;
  }

  bool Release(LeaseId id) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return false;
    End(it->second);
    leases_.erase(it);
    return true;
  }

  uint64_t Evict(uint64_t n) {
    uint64_t done = 0;
    while (done < n && EvictOne()) ++done;
    return done;
  }

  // Key -> refcount of every cached block.
  std::map<Key, uint32_t> Cached() const {
    std::map<Key, uint32_t> out;
    for (const auto& [k, n] : nodes_) out[k] = n.refs;
    return out;
  }
  uint64_t free_pages() const { return free_; }
  uint64_t writing_pages() const { return writing_; }
  uint64_t cached_pages() const { return nodes_.size(); }
  const std::map<LeaseId, Lease>& leases() const { return leases_; }

 private:
  static Tokens Block(const Tokens& t, size_t i, uint32_t ps) {
    if (t.empty()) return {};
    return Tokens(t.begin() + i * ps, t.begin() + (i + 1) * ps);
  }
  static bool Same(const Node& n, NamespaceId ns, const std::optional<Key>& p,
                   const Tokens& block) {
    if (n.ns != ns || n.parent != p) return false;
    return block.empty() || n.tokens.empty() || n.tokens == block;
  }
  // The least recently unpinned leaf; ties cannot happen (stamps are unique,
  // and a path is unpinned deepest first).
  bool EvictOne() {
    std::optional<Key> victim;
    uint64_t best = 0;
    for (const auto& [k, n] : nodes_) {
      if (n.refs != 0 || HasChild(k)) continue;
      if (!victim || n.stamp < best) {
        victim = k;
        best = n.stamp;
      }
    }
    if (!victim) return false;
    nodes_.erase(*victim);
    ++free_;
    return true;
  }
  bool HasChild(const Key& k) const {
    for (const auto& [c, n] : nodes_) {
      if (n.parent == k) return true;
    }
    return false;
  }
  // Pages that did not become nodes (uncommitted, duplicate, collided) go
  // back to the pool; the path is unpinned deepest first.
  void End(Lease& l) {
    const uint64_t owned = l.new_keys.size() - l.inserted;
    writing_ -= owned;
    free_ += owned;
    for (auto it = l.path.rbegin(); it != l.path.rend(); ++it) {
      Node& n = nodes_[*it];
      if (--n.refs == 0) n.stamp = ++clock_;
    }
  }

  std::map<Key, Node> nodes_;
  std::map<LeaseId, Lease> leases_;
  uint64_t free_;
  uint64_t writing_ = 0;
  uint64_t clock_ = 0;
  LeaseId next_lease_ = 1;
};

std::map<Key, uint32_t> TreeCached(const RadixTree& tree) {
  std::map<Key, uint32_t> out;
  for (const NodeInfo& n : tree.DumpTree(0xffffffffu, 0xffffffffu)) {
    out[K(n.key)] = n.refcount;
  }
  return out;
}

void RunDifferential(uint32_t seed, int steps) {
  constexpr uint32_t kCapacity = 24;
  constexpr uint32_t kPageSize = 2;
  std::mt19937 rng(seed);
  auto rand = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };

  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = kCapacity}).value();
  RadixTree& tree = *tree_owner;
  Model model(kCapacity);
  NamespaceSpec spec{.model = "m", .page_size = kPageSize};
  const NamespaceId ns0 = tree.RegisterNamespace(spec).value();
  spec.cache_salt = "other";
  const NamespaceId ns1 = tree.RegisterNamespace(spec).value();
  std::vector<LeaseId> live;

  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
    const uint32_t op = rand(100);
    if (op < 45 || live.empty()) {
      // Prompts over a tiny vocabulary, so prefixes are shared often.
      const NamespaceId ns = rand(5) == 0 ? ns1 : ns0;
      Tokens t(kPageSize * (1 + rand(7)));
      for (uint32_t& x : t) x = rand(3);
      std::vector<BlockKey> keys =
          ComputeBlockKeys(tree.namespace_root(ns), kPageSize, t);
      const uint32_t mode = rand(20);
      if (mode == 0) {
        t.clear();  // key mode
      } else if (mode == 1) {
        t[rand(static_cast<uint32_t>(t.size()))] += 7;  // forced collision
      }
      const bool allocate = rand(4) != 0;
      absl::StatusOr<AcquireResult> got = tree.Acquire(
          {.ns = ns, .keys = keys, .tokens = t, .allocate = allocate});
      ASSERT_TRUE(got.ok()) << got.status();
      const AcquireResult want =
          model.Acquire(ns, keys, t, allocate, kPageSize);
      ASSERT_EQ(got->lease, want.lease);
      ASSERT_EQ(got->matched_blocks, want.matched_blocks);
      ASSERT_EQ(got->new_blocks, want.new_blocks);
      ASSERT_EQ(got->evicted_pages, want.evicted_pages);
      ASSERT_EQ(got->collisions, want.collisions);
      ASSERT_EQ(got->pages.size(), got->matched_blocks + got->new_blocks);
      if (got->lease != 0) live.push_back(got->lease);
    } else if (op < 75) {
      const size_t i = rand(static_cast<uint32_t>(live.size()));
      const LeaseId id = live[i];
      const auto& ml = model.leases().at(id);
      const uint32_t left =
          static_cast<uint32_t>(ml.new_keys.size()) - ml.committed;
      const uint32_t blocks = rand(8) == 0 ? left + 1 : rand(left + 1);
      const bool release = rand(3) != 0;
      absl::StatusOr<CommitResult> got = tree.Commit(id, blocks, release);
      std::optional<CommitResult> want = model.Commit(id, blocks, release);
      ASSERT_EQ(got.ok(), want.has_value()) << got.status();
      if (!want) {
        ASSERT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
        continue;
      }
      ASSERT_EQ(got->inserted, want->inserted);
      ASSERT_EQ(got->deduplicated, want->deduplicated);
      ASSERT_EQ(got->collided, want->collided);
      ASSERT_EQ(got->pages.size(), blocks);
      ASSERT_EQ(got->released, release);
      if (release) live.erase(live.begin() + i);
    } else if (op < 92) {
      const size_t i = rand(static_cast<uint32_t>(live.size()));
      ASSERT_TRUE(tree.Release(live[i]).ok());
      ASSERT_TRUE(model.Release(live[i]));
      live.erase(live.begin() + i);
    } else if (op < 97) {
      const uint64_t n = rand(4);
      ASSERT_EQ(tree.Evict(n), model.Evict(n));
    } else {
      const LeaseId bogus = 1000000 + rand(1000);
      ASSERT_EQ(tree.Release(bogus).code(), absl::StatusCode::kNotFound);
      ASSERT_EQ(tree.Commit(bogus, 0, false).status().code(),
                absl::StatusCode::kNotFound);
    }
    // Keep some room: too many live leases pin everything.
    while (live.size() > 6) {
      ASSERT_TRUE(tree.Release(live.front()).ok());
      ASSERT_TRUE(model.Release(live.front()));
      live.erase(live.begin());
    }
    ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants();
    const TreeStats s = tree.GetStats();
    ASSERT_EQ(s.free_pages, model.free_pages());
    ASSERT_EQ(s.writing_pages, model.writing_pages());
    ASSERT_EQ(s.cached_pages, model.cached_pages());
    ASSERT_EQ(s.leases, live.size());
    ASSERT_EQ(TreeCached(tree), model.Cached());
  }
  for (LeaseId id : live) ASSERT_TRUE(tree.Release(id).ok());
  const TreeStats s = tree.GetStats();
  EXPECT_EQ(s.writing_pages, 0u);
  EXPECT_EQ(s.pinned_pages, 0u);
  EXPECT_GT(s.evicted_pages, 0u);
  EXPECT_GT(s.deduplicated_blocks + s.hit_blocks, 0u);
  EXPECT_TRUE(tree.CheckInvariants().ok());
}

class RadixModelTest : public testing::TestWithParam<uint32_t> {};

TEST_P(RadixModelTest, MatchesReferenceModel) { RunDifferential(GetParam(), 4000); }

INSTANTIATE_TEST_SUITE_P(Seeds, RadixModelTest,
                         testing::Values(1u, 2u, 3u, 17u, 2026u));

}  // namespace
}  // namespace radixkv
