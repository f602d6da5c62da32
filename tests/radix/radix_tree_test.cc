// Spec-like tests of RadixTree (radix/radix_tree.h), in the manner of
// leveldb's cache_test: a fixture with tiny helpers, one behaviour per test.
#include "radix/radix_tree.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "radix/block_key.h"

namespace radixkv {
namespace {

using Tokens = std::vector<uint32_t>;

// Records every event, in order.
class RecordingListener : public EventListener {
 public:
  void OnTreeEvents(absl::Span<const TreeEvent> events) override {
    events_.insert(events_.end(), events.begin(), events.end());
    ++flushes_;
  }
  std::vector<TreeEvent> events_;
  int flushes_ = 0;  // calls: one per hold of the tree's lock
};

class RadixTreeTest : public testing::Test {
 protected:
  static constexpr uint32_t kPageSize = 2;
  static constexpr uint32_t kCapacity = 8;

  RadixTreeTest()
      : tree_owner_(RadixTree::Create({.capacity_pages = kCapacity,
                                       .listener = &listener_})
                        .value()),
        tree_(*tree_owner_) {
    ns_ = Register(Spec());
  }
  ~RadixTreeTest() override {
    EXPECT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
  }

  static NamespaceSpec Spec() {
    return NamespaceSpec{.model = "m",
                         .num_layers = 1,
                         .num_kv_heads = 1,
                         .head_dim = 4,
                         .page_size = kPageSize,
                         .dtype = DType::kFloat32};
  }
  NamespaceId Register(const NamespaceSpec& s) {
    absl::StatusOr<NamespaceId> id = tree_.RegisterNamespace(s);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  std::vector<BlockKey> Keys(const Tokens& t, NamespaceId ns = 0) {
    return ComputeBlockKeys(tree_.namespace_root(ns), kPageSize, t);
  }
  // Full blocks of `t` only (the tree wants exactly keys * page_size tokens).
  static Tokens Full(Tokens t) {
    t.resize(t.size() / kPageSize * kPageSize);
    return t;
  }

  // Matched blocks of a read-only lookup.
  int Lookup(const Tokens& t, NamespaceId ns = 0) {
    const auto keys = Keys(t, ns);
    const Tokens full = Full(t);
    absl::StatusOr<MatchResult> r = tree_.Match(ns, keys, full);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? static_cast<int>(r->matched_blocks) : -1;
  }
  AcquireResult Acquire(const Tokens& t, bool allocate = true,
                        NamespaceId ns = 0) {
    const auto keys = Keys(t, ns);
    const Tokens full = Full(t);
    absl::StatusOr<AcquireResult> r = tree_.Acquire(
        {.ns = ns, .keys = keys, .tokens = full, .allocate = allocate});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.value_or(AcquireResult{});
  }
  // Acquire + commit everything allocated; ends the lease unless `hold`.
  // Returns the lease (0 once released).
  LeaseId Insert(const Tokens& t, bool hold = false, NamespaceId ns = 0) {
    AcquireResult a = Acquire(t, true, ns);
    if (a.lease == 0) return 0;
    absl::StatusOr<CommitResult> c = tree_.Commit(a.lease, a.new_blocks, !hold);
    EXPECT_TRUE(c.ok()) << c.status();
    return hold ? a.lease : 0;
  }
  // Insert in token mode: the tree derives the keys (the plain chain of the
  // tokens), so the blocks can later be found by comparing tokens.
  void InsertChain(const Tokens& t) {
    const Tokens full = Full(t);
    absl::StatusOr<AcquireResult> a =
        tree_.Acquire({.ns = ns_, .tokens = full, .allocate = true});
    ASSERT_TRUE(a.ok()) << a.status();
    if (a->lease == 0) return;
    ASSERT_TRUE(tree_.Commit(a->lease, a->new_blocks, true).ok());
  }
  // A token-mode lookup of `t` (no allocation) handing the tree a walk's
  // pages (and its epoch); ends the lease at once.
  AcquireResult AcquireKnown(const Tokens& t, absl::Span<const PageId> known,
                             uint64_t known_epoch = 0) {
    const auto k = Keys(t);
    AcquireResult r =
        tree_
            .TEST_AcquireWalked({.ns = ns_, .keys = k, .tokens = t}, known,
                                known_epoch)
            .value();
    if (r.lease != 0) {
      EXPECT_TRUE(tree_.Release(r.lease).ok());
    }
    return r;
  }
  uint32_t MatchKnown(const Tokens& t, absl::Span<const PageId> known,
                      uint64_t known_epoch = 0) {
    return tree_.TEST_MatchWalked(ns_, Keys(t), t, known, known_epoch);
  }
  // The token walk's keys for `t`; each must be the chain key.
  std::vector<BlockKey> WalkKeys(const Tokens& t) {
    std::vector<BlockKey> keys;
    const size_t n = tree_.TEST_WalkTokens(ns_, t, &keys);
    EXPECT_EQ(n, keys.size());
    const std::vector<BlockKey> want = Keys(t);
    EXPECT_LE(n, want.size());
    for (size_t i = 0; i < n && i < want.size(); ++i) {
      EXPECT_EQ(keys[i], want[i]) << "block " << i;
    }
    return keys;
  }

  PageId PageOf(const Tokens& t, size_t block) {
    auto e = tree_.Explain(ns_, Keys(t), Full(t));
    return e.ok() && block < e->size() ? (*e)[block].page : kNoPage;
  }
  std::vector<TreeEvent::Type> EventTypes() const {
    std::vector<TreeEvent::Type> out;
    for (const TreeEvent& e : listener_.events_) out.push_back(e.type);
    return out;
  }

  RecordingListener listener_;
  std::unique_ptr<RadixTree> tree_owner_;
  RadixTree& tree_;
  NamespaceId ns_ = 0;
};

TEST_F(RadixTreeTest, HitAndMiss) {
  EXPECT_EQ(Lookup({1, 2, 3, 4}), 0);
  Insert({1, 2, 3, 4});
  EXPECT_EQ(Lookup({1, 2, 3, 4}), 2);
  EXPECT_EQ(Lookup({1, 2, 3, 4, 5, 6}), 2);
  EXPECT_EQ(Lookup({1, 2, 9, 9}), 1);
  EXPECT_EQ(Lookup({9, 9, 3, 4}), 0);  // chained: block 1 alone is not a hit

  AcquireResult a = Acquire({1, 2, 3, 4, 5, 6}, /*allocate=*/false);
  EXPECT_EQ(a.total_blocks, 3u);
  EXPECT_EQ(a.matched_blocks, 2u);
  EXPECT_EQ(a.new_blocks, 0u);
  ASSERT_NE(a.lease, 0u);
  ASSERT_TRUE(tree_.Release(a.lease).ok());
  const TreeStats s = tree_.GetStats();
  EXPECT_EQ(s.lookups, 2u);
  EXPECT_EQ(s.lookup_blocks, 5u);
  EXPECT_EQ(s.hit_blocks, 2u);
  EXPECT_EQ(s.hit_tokens, 2u * kPageSize);
  EXPECT_EQ(s.matches, 5u);
}

TEST_F(RadixTreeTest, PartialTailIgnored) {
  Insert({1, 2, 3});
  EXPECT_EQ(tree_.GetStats().cached_pages, 1u);
  EXPECT_EQ(Lookup({1, 2, 3}), 1);
  EXPECT_EQ(Lookup({1, 2, 7}), 1);
  AcquireResult a = Acquire({5});
  EXPECT_EQ(a.total_blocks, 0u);
  EXPECT_EQ(a.lease, 0u);  // nothing pinned or allocated: no lease
  EXPECT_EQ(tree_.GetStats().leases, 0u);
}

TEST_F(RadixTreeTest, LeaseIdsStartAtOneAndIncrease) {
  AcquireResult a = Acquire({1, 2});
  AcquireResult b = Acquire({3, 4});
  EXPECT_EQ(a.lease, 1u);
  EXPECT_EQ(b.lease, 2u);
  EXPECT_TRUE(tree_.Release(a.lease).ok());
  EXPECT_TRUE(tree_.Release(b.lease).ok());
}

TEST_F(RadixTreeTest, PinnedPagesAreNeverEvicted) {
  const Tokens held = {1, 1, 2, 2, 3, 3, 4, 4};
  const LeaseId lease = Insert(held, /*hold=*/true);
  ASSERT_NE(lease, 0u);
  for (uint32_t i = 10; i < 30; ++i) Insert({i, i, i + 1, i + 1});
  EXPECT_EQ(Lookup(held), 4);
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_EQ(tree_.TEST_page_state(PageOf(held, b)), PageState::kCached);
    EXPECT_EQ(tree_.TEST_refcount(PageOf(held, b)), 1u);
  }
  // Only the 4 unpinned pages can be handed out.
  AcquireResult a = Acquire({50, 50, 51, 51, 52, 52, 53, 53, 54, 54, 55, 55});
  EXPECT_EQ(a.new_blocks, 4u);
  EXPECT_EQ(tree_.GetStats().pinned_pages, 4u);
  EXPECT_EQ(Lookup(held), 4);
  ASSERT_TRUE(tree_.Release(a.lease).ok());
  ASSERT_TRUE(tree_.Release(lease).ok());
  EXPECT_EQ(tree_.GetStats().pinned_pages, 0u);
}

TEST_F(RadixTreeTest, EvictionOrderIsLru) {
  for (uint32_t i = 0; i < kCapacity; ++i) Insert({i, i});
  // Use block {0,0} again: it becomes the most recent.
  ASSERT_TRUE(tree_.Release(Acquire({0, 0}, false).lease).ok());
  // A read-only Match does not refresh {1,1}.
  EXPECT_EQ(Lookup({1, 1}), 1);
  listener_.events_.clear();
  Insert({100, 100});
  Insert({101, 101});
  EXPECT_EQ(Lookup({1, 1}), 0);
  EXPECT_EQ(Lookup({2, 2}), 0);
  EXPECT_EQ(Lookup({0, 0}), 1);
  EXPECT_EQ(Lookup({3, 3}), 1);
  ASSERT_EQ(listener_.events_.size(), 4u);
  EXPECT_EQ(listener_.events_[0].type, TreeEvent::Type::kRemoved);
  EXPECT_EQ(listener_.events_[0].key, Keys({1, 1})[0]);
  EXPECT_EQ(listener_.events_[1].type, TreeEvent::Type::kStored);
  EXPECT_EQ(listener_.events_[2].key, Keys({2, 2})[0]);
  EXPECT_EQ(tree_.GetStats().evicted_pages, 2u);
}

TEST_F(RadixTreeTest, DeeperFirstOnTies) {
  Insert({1, 1, 2, 2, 3, 3});
  EXPECT_EQ(tree_.Evict(1), 1u);
  EXPECT_EQ(Lookup({1, 1, 2, 2, 3, 3}), 2);
  EXPECT_EQ(tree_.Evict(1), 1u);
  EXPECT_EQ(Lookup({1, 1, 2, 2, 3, 3}), 1);
  EXPECT_EQ(tree_.Evict(5), 1u);
  EXPECT_EQ(Lookup({1, 1}), 0);
  EXPECT_EQ(tree_.Evict(1), 0u);
}

TEST_F(RadixTreeTest, ParentEvictableAfterLastChildGoes) {
  Insert({1, 1, 2, 2});  // a -> b
  Insert({1, 1, 3, 3});  // a -> c; a used again, so it is newer than b and c
  const PageId a = PageOf({1, 1}, 0);
  EXPECT_EQ(tree_.Evict(1), 1u);  // b, the oldest leaf
  EXPECT_EQ(Lookup({1, 1, 2, 2}), 1);
  EXPECT_EQ(Lookup({1, 1, 3, 3}), 2);
  EXPECT_EQ(tree_.TEST_page_state(a), PageState::kCached);
  EXPECT_EQ(tree_.Evict(1), 1u);  // c
  EXPECT_EQ(Lookup({1, 1, 3, 3}), 1);
  EXPECT_EQ(tree_.Evict(1), 1u);  // now a is a leaf
  EXPECT_EQ(tree_.TEST_page_state(a), PageState::kFree);
  EXPECT_EQ(tree_.GetStats().cached_pages, 0u);
}

TEST_F(RadixTreeTest, DedupeOnCommit) {
  const Tokens t = {1, 1, 2, 2};
  AcquireResult a = Acquire(t);
  AcquireResult b = Acquire(t);
  ASSERT_EQ(a.new_blocks, 2u);
  ASSERT_EQ(b.new_blocks, 2u);
  EXPECT_NE(a.pages, b.pages);
  absl::StatusOr<CommitResult> ca = tree_.Commit(a.lease, 2, false);
  ASSERT_TRUE(ca.ok());
  EXPECT_EQ(ca->inserted, 2u);
  absl::StatusOr<CommitResult> cb = tree_.Commit(b.lease, 2, true);
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(cb->inserted, 0u);
  EXPECT_EQ(cb->deduplicated, 2u);
  EXPECT_EQ(cb->pages, a.pages);  // the canonical pages
  EXPECT_TRUE(cb->released);
  // b's own pages were freed when its lease ended; a still pins the blocks.
  for (PageId p : b.pages) EXPECT_EQ(tree_.TEST_page_state(p), PageState::kFree);
  for (PageId p : a.pages) EXPECT_EQ(tree_.TEST_refcount(p), 1u);
  ASSERT_TRUE(tree_.Release(a.lease).ok());
  const TreeStats s = tree_.GetStats();
  EXPECT_EQ(s.cached_pages, 2u);
  EXPECT_EQ(s.free_pages, kCapacity - 2);
  EXPECT_EQ(s.deduplicated_blocks, 2u);
  EXPECT_EQ(s.inserted_blocks, 2u);
}

TEST_F(RadixTreeTest, ForcedCollision) {
  // Two different token blocks that share one (hand-made) key.
  const std::vector<BlockKey> keys = {BlockKey{7, 7}, BlockKey{7, 8}};
  const Tokens first = {1, 1, 2, 2};
  const Tokens second = {3, 3, 2, 2};
  auto acquire = [&](const Tokens& t) {
    return tree_
        .Acquire({.ns = ns_, .keys = keys, .tokens = t, .allocate = true})
        .value();
  };
  AcquireResult a = acquire(first);
  ASSERT_TRUE(tree_.Commit(a.lease, 2, true).ok());
  EXPECT_EQ(tree_.Match(ns_, keys, first)->matched_blocks, 2u);

  // Verified hit: the stored tokens differ, so the key hit is a miss.
  absl::StatusOr<MatchResult> m = tree_.Match(ns_, keys, second);
  EXPECT_EQ(m->matched_blocks, 0u);
  EXPECT_EQ(m->collisions, 1u);
  AcquireResult b = acquire(second);
  EXPECT_EQ(b.matched_blocks, 0u);
  EXPECT_EQ(b.collisions, 1u);
  ASSERT_EQ(b.new_blocks, 2u);
  // Committing cannot take the key over; the rest of the chain stays out.
  absl::StatusOr<CommitResult> c = tree_.Commit(b.lease, 2, true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->inserted, 0u);
  EXPECT_EQ(c->collided, 2u);
  EXPECT_EQ(tree_.GetStats().hash_collisions, 2u);
  EXPECT_EQ(tree_.GetStats().cached_pages, 2u);
  EXPECT_EQ(tree_.Match(ns_, keys, first)->matched_blocks, 2u);
  auto e = tree_.Explain(ns_, keys, second);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)[0].status, BlockStatus::kTokenMismatch);
  // Key mode cannot verify: the hit stands.
  EXPECT_EQ(tree_.Match(ns_, keys, {})->matched_blocks, 2u);
}

TEST_F(RadixTreeTest, NamespaceIsolation) {
  const Tokens t = {1, 1, 2, 2};
  NamespaceSpec salted = Spec(), lora = Spec(), other = Spec();
  salted.cache_salt = "tenant-b";
  lora.lora = "adapter";
  other.model = "other-model";
  const NamespaceId ns_salt = Register(salted);
  const NamespaceId ns_lora = Register(lora);
  const NamespaceId ns_other = Register(other);
  EXPECT_EQ(Register(Spec()), ns_);  // equal spec, same id
  EXPECT_NE(ns_salt, ns_lora);
  Insert(t);
  EXPECT_EQ(Lookup(t, ns_), 2);
  EXPECT_EQ(Lookup(t, ns_salt), 0);
  EXPECT_EQ(Lookup(t, ns_lora), 0);
  EXPECT_EQ(Lookup(t, ns_other), 0);
  // Even ns_'s own keys do not hit from another namespace.
  EXPECT_EQ(tree_.Match(ns_salt, Keys(t, ns_), t)->matched_blocks, 0u);
  Insert(t, false, ns_salt);
  EXPECT_EQ(Lookup(t, ns_salt), 2);
  EXPECT_EQ(tree_.GetStats().cached_pages, 4u);
  const auto list = tree_.ListNamespaces();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[ns_].cached_blocks, 2u);
  EXPECT_EQ(list[ns_salt].cached_blocks, 2u);
  EXPECT_EQ(list[ns_lora].cached_blocks, 0u);
}

TEST_F(RadixTreeTest, BadInputChangesNothing) {
  Insert({1, 1});
  const TreeStats before = tree_.GetStats();
  const auto keys = Keys({1, 1, 2, 2});
  const Tokens three = {1, 1, 2};
  absl::StatusOr<AcquireResult> a = tree_.Acquire(
      {.ns = ns_, .keys = keys, .tokens = three, .allocate = true});
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("tokens.size()=3"), std::string::npos)
      << a.status();
  a = tree_.Acquire({.ns = 99, .keys = keys, .allocate = true});
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("namespace"), std::string::npos);
  EXPECT_EQ(tree_.Match(ns_, keys, three).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_.Explain(7, keys, {}).status().code(),
            absl::StatusCode::kInvalidArgument);

  NamespaceSpec bad = Spec();
  bad.page_size = 0;
  absl::StatusOr<NamespaceId> r = tree_.RegisterNamespace(bad);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("page_size"), std::string::npos);
  bad.page_size = 5000;
  EXPECT_EQ(tree_.RegisterNamespace(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.page_size = 16;
  r = tree_.RegisterNamespace(bad);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("16"), std::string::npos);
  EXPECT_NE(r.status().message().find("2"), std::string::npos);

  const TreeStats after = tree_.GetStats();
  EXPECT_EQ(after.lookups, before.lookups);
  EXPECT_EQ(after.cached_pages, before.cached_pages);
  EXPECT_EQ(after.free_pages, before.free_pages);
  EXPECT_EQ(after.leases, 0u);
  EXPECT_EQ(after.namespaces, 1u);
}

TEST_F(RadixTreeTest, CommitMoreThanAllocated) {
  AcquireResult a = Acquire({1, 1, 2, 2});
  ASSERT_EQ(a.new_blocks, 2u);
  absl::StatusOr<CommitResult> c = tree_.Commit(a.lease, 3, true);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("blocks=3"), std::string::npos);
  EXPECT_NE(c.status().message().find(" 2 "), std::string::npos) << c.status();
  EXPECT_EQ(tree_.GetStats().writing_pages, 2u);  // nothing changed
  EXPECT_EQ(tree_.GetStats().leases, 1u);
  // Chunked commit: one block, then the next.
  c = tree_.Commit(a.lease, 1, false);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->inserted, 1u);
  EXPECT_EQ(c->pages, std::vector<PageId>{a.pages[0]});
  EXPECT_EQ(tree_.Commit(a.lease, 2, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
  c = tree_.Commit(a.lease, 1, true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pages, std::vector<PageId>{a.pages[1]});
  EXPECT_EQ(Lookup({1, 1, 2, 2}), 2);
}

TEST_F(RadixTreeTest, ReleaseUnknownLease) {
  EXPECT_EQ(tree_.Release(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tree_.Commit(12345, 0, true).status().code(),
            absl::StatusCode::kNotFound);
  AcquireResult a = Acquire({1, 1});
  ASSERT_TRUE(tree_.Release(a.lease).ok());
  EXPECT_EQ(tree_.Release(a.lease).code(), absl::StatusCode::kNotFound);
  // The uncommitted page went back to the pool.
  EXPECT_EQ(tree_.TEST_page_state(a.pages[0]), PageState::kFree);
  EXPECT_EQ(tree_.GetStats().free_pages, kCapacity);
}

TEST_F(RadixTreeTest, ClearKeepsPinned) {
  const LeaseId held = Insert({1, 1, 2, 2}, /*hold=*/true);
  Insert({3, 3, 4, 4});
  Insert({1, 1, 5, 5});
  listener_.events_.clear();
  EXPECT_EQ(tree_.Clear(), 3u);  // {3,3} {4,4} {5,5}
  EXPECT_EQ(Lookup({1, 1, 2, 2}), 2);
  EXPECT_EQ(Lookup({3, 3}), 0);
  ASSERT_FALSE(listener_.events_.empty());
  EXPECT_EQ(listener_.events_.back().type, TreeEvent::Type::kCleared);
  EXPECT_EQ(listener_.events_.size(), 4u);
  ASSERT_TRUE(tree_.Release(held).ok());
  EXPECT_EQ(tree_.Clear(), 2u);
  EXPECT_EQ(tree_.GetStats().cached_pages, 0u);
}

// Large admin evictions give the lock up between batches: the listener
// (called once per hold) sees the blocks in kAdminEvictionBatch-sized
// flushes, in LRU order, with Cleared last.
TEST(RadixTreeAdminTest, EvictAndClearWorkInBatches) {
  RecordingListener listener;
  constexpr uint32_t kPage = 1;
  const uint64_t blocks = 3 * kAdminEvictionBatch + 5;
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = static_cast<uint32_t>(blocks + 1),
                  .listener = &listener}).value();
  RadixTree& tree = *tree_owner;
  const NamespaceId ns =
      tree.RegisterNamespace(NamespaceSpec{.model = "m", .page_size = kPage})
          .value();
  // One long chain of blocks plus a held one-block prompt.
  Tokens t(blocks);
  for (uint32_t i = 0; i < blocks; ++i) t[i] = i;
  const auto keys = ComputeBlockKeys(tree.namespace_root(ns), kPage, t);
  AcquireResult a =
      *tree.Acquire({.ns = ns, .keys = keys, .tokens = t, .allocate = true});
  ASSERT_EQ(a.new_blocks, blocks);
  ASSERT_TRUE(tree.Commit(a.lease, a.new_blocks, true).ok());
  const Tokens pinned = {99999};
  const auto pinned_keys =
      ComputeBlockKeys(tree.namespace_root(ns), kPage, pinned);
  AcquireResult p = *tree.Acquire(
      {.ns = ns, .keys = pinned_keys, .tokens = pinned, .allocate = true});
  ASSERT_TRUE(tree.Commit(p.lease, 1, /*release=*/false).ok());

  listener.events_.clear();
  listener.flushes_ = 0;
  EXPECT_EQ(tree.Evict(kAdminEvictionBatch + 3), kAdminEvictionBatch + 3);
  EXPECT_EQ(listener.flushes_, 2);
  ASSERT_EQ(listener.events_.size(), kAdminEvictionBatch + 3);
  EXPECT_EQ(listener.events_.front().key, keys.back());  // deepest first

  listener.events_.clear();
  listener.flushes_ = 0;
  const uint64_t left = blocks - kAdminEvictionBatch - 3;
  EXPECT_EQ(tree.Clear(), left);
  EXPECT_EQ(listener.flushes_, 3);  // 1024 + 1024 + 2 (+ Cleared)
  ASSERT_EQ(listener.events_.size(), left + 1);
  for (uint64_t i = 0; i < left; ++i) {
    ASSERT_EQ(listener.events_[i].type, TreeEvent::Type::kRemoved) << i;
    ASSERT_EQ(listener.events_[i].key, keys[left - 1 - i]) << i;
  }
  EXPECT_EQ(listener.events_.back().type, TreeEvent::Type::kCleared);
  EXPECT_EQ(tree.GetStats().cached_pages, 1u);  // the pinned block
  EXPECT_EQ(tree.Evict(10), 0u);
  ASSERT_TRUE(tree.Release(p.lease).ok());
  EXPECT_EQ(tree.Clear(), 1u);
  EXPECT_EQ(tree.Clear(), 0u);
  EXPECT_EQ(listener.events_.back().type, TreeEvent::Type::kCleared);
  EXPECT_TRUE(tree.CheckInvariants().ok());
}

TEST_F(RadixTreeTest, ExplainStates) {
  Insert({1, 1, 2, 2, 3, 3});
  tree_.Evict(1);  // {3,3}
  const Tokens asked = {1, 1, 2, 2, 3, 3, 4, 4};
  auto e = tree_.Explain(ns_, Keys(asked), asked);
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->size(), 4u);
  EXPECT_EQ((*e)[0].status, BlockStatus::kCached);
  EXPECT_EQ((*e)[0].page, PageOf(asked, 0));
  EXPECT_EQ((*e)[1].status, BlockStatus::kCached);
  EXPECT_EQ((*e)[2].status, BlockStatus::kEvicted);
  EXPECT_EQ((*e)[3].status, BlockStatus::kParentMissing);
  e = tree_.Explain(ns_, Keys({9, 9}), {9, 9});
  EXPECT_EQ((*e)[0].status, BlockStatus::kNotPresent);
  EXPECT_STREQ(BlockStatusName(BlockStatus::kEvicted), "evicted");
}

TEST_F(RadixTreeTest, EventsOrder) {
  const Tokens t = {1, 1, 2, 2};
  const auto keys = Keys(t);
  Insert(t);
  tree_.Evict(2);
  ASSERT_EQ(listener_.events_.size(), 4u);
  const auto& ev = listener_.events_;
  EXPECT_EQ(ev[0].type, TreeEvent::Type::kStored);
  EXPECT_EQ(ev[0].key, keys[0]);
  EXPECT_EQ(ev[0].parent_key, tree_.namespace_root(ns_));
  EXPECT_EQ(ev[0].depth, 0u);
  EXPECT_EQ(ev[1].type, TreeEvent::Type::kStored);
  EXPECT_EQ(ev[1].key, keys[1]);
  EXPECT_EQ(ev[1].parent_key, keys[0]);
  EXPECT_EQ(ev[1].depth, 1u);
  EXPECT_EQ(ev[2].type, TreeEvent::Type::kRemoved);
  EXPECT_EQ(ev[2].key, keys[1]);  // deepest first
  EXPECT_EQ(ev[3].key, keys[0]);
}

TEST_F(RadixTreeTest, KeyModeHitsWithoutTokens) {
  const auto keys = Keys({1, 1, 2, 2});
  AcquireResult a =
      tree_.Acquire({.ns = ns_, .keys = keys, .allocate = true}).value();
  ASSERT_TRUE(tree_.Commit(a.lease, a.new_blocks, true).ok());
  EXPECT_EQ(tree_.Match(ns_, keys, {})->matched_blocks, 2u);
  EXPECT_EQ(Lookup({1, 1, 2, 2}), 2);  // unverifiable, so accepted
}

TEST_F(RadixTreeTest, MaxNewBlocksLimitsAllocation) {
  const Tokens t = {1, 1, 2, 2, 3, 3};
  const auto keys = Keys(t);
  AcquireResult a = tree_
                        .Acquire({.ns = ns_,
                                  .keys = keys,
                                  .tokens = t,
                                  .allocate = true,
                                  .max_new_blocks = 2})
                        .value();
  EXPECT_EQ(a.new_blocks, 2u);
  EXPECT_EQ(a.pages.size(), 2u);
  ASSERT_TRUE(tree_.Commit(a.lease, 2, true).ok());
  EXPECT_EQ(Lookup(t), 2);
}

TEST_F(RadixTreeTest, DumpTreeShallowestFirst) {
  Insert({1, 1, 2, 2, 3, 3});
  Insert({4, 4});
  const auto all = tree_.DumpTree(100, 100);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].depth, 0u);
  EXPECT_EQ(all[1].depth, 0u);
  EXPECT_EQ(all[2].depth, 1u);
  EXPECT_EQ(all[3].depth, 2u);
  EXPECT_EQ(all[3].parent_key, all[2].key);
  EXPECT_EQ(tree_.DumpTree(0, 100).size(), 2u);
  EXPECT_EQ(tree_.DumpTree(100, 1).size(), 1u);
  EXPECT_GT(tree_.IndexMemoryBytes(), 0u);
}

TEST_F(RadixTreeTest, TokenWalkFollowsChainKeyedBlocks) {
  const Tokens a = {1, 2, 3, 4, 5, 6, 7};  // 3 full blocks
  EXPECT_TRUE(WalkKeys(a).empty());        // empty tree
  InsertChain(a);
  EXPECT_EQ(WalkKeys(a).size(), 3u);
  EXPECT_EQ(WalkKeys({1, 2, 3, 4}).size(), 2u);   // a prefix of a
  EXPECT_EQ(WalkKeys({1, 2, 9, 9, 5, 6}).size(), 1u);  // diverges at block 1
  EXPECT_TRUE(WalkKeys({9, 2, 3, 4}).empty());
  // A sibling becomes the hot child of block 0: the walk to a's block 1
  // stops there (the keys it gives are still right; callers hash the rest).
  InsertChain({1, 2, 8, 8});
  EXPECT_EQ(WalkKeys({1, 2, 8, 8}).size(), 2u);
  EXPECT_EQ(WalkKeys(a).size(), 1u);
  // Matching a again through Acquire makes its path hot again.
  AcquireResult r = Acquire(a, /*allocate=*/false);
  EXPECT_EQ(r.matched_blocks, 3u);
  ASSERT_TRUE(tree_.Release(r.lease).ok());
  EXPECT_EQ(WalkKeys(a).size(), 3u);
  // Evicted blocks are not vouched for, even if a hint still names them.
  tree_.Clear();
  EXPECT_TRUE(WalkKeys(a).empty());
}

TEST_F(RadixTreeTest, TokenWalkTrustsOnlyChainKeys) {
  const Tokens t = {1, 2, 3, 4};
  Insert(t);  // keys supplied without chain_keys
  EXPECT_EQ(Lookup(t), 2);
  EXPECT_TRUE(WalkKeys(t).empty());
  // Key mode stores no tokens: nothing to compare.
  const Tokens u = {5, 6, 7, 8};
  const auto keys = Keys(u);
  AcquireResult a =
      tree_.Acquire({.ns = ns_, .keys = keys, .allocate = true}).value();
  ASSERT_TRUE(tree_.Commit(a.lease, a.new_blocks, true).ok());
  EXPECT_TRUE(WalkKeys(u).empty());
  // Another namespace's blocks never answer for this one.
  NamespaceSpec other = Spec();
  other.model = "other";
  const NamespaceId ns2 = Register(other);
  const auto keys2 = Keys(t, ns2);
  AcquireResult b = tree_
                        .Acquire({.ns = ns2,
                                  .tokens = t,
                                  .allocate = true})
                        .value();
  ASSERT_TRUE(tree_.Commit(b.lease, b.new_blocks, true).ok());
  EXPECT_TRUE(WalkKeys(t).empty());
  std::vector<BlockKey> walked;
  EXPECT_EQ(tree_.TEST_WalkTokens(ns2, t, &walked), 2u);
  EXPECT_EQ(walked, keys2);
  EXPECT_EQ(tree_.TEST_WalkTokens(/*ns=*/99, t, &walked), 0u);
}

// Random prompts over a tiny alphabet (many shared prefixes and siblings),
// a small pool (constant eviction and page reuse): every key the walk
// vouches for is the chain key.
TEST_F(RadixTreeTest, TokenWalkIsAlwaysAChainPrefix) {
  uint64_t state = 12345;
  auto next = [&state](uint32_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>((state >> 33) % n);
  };
  size_t walked = 0;
  for (int round = 0; round < 2000; ++round) {
    Tokens t(kPageSize * (1 + next(5)));
    for (uint32_t& x : t) x = next(3);
    walked += WalkKeys(t).size();
    // The walk plus hashing gives exactly the chain keys; stopping at the
    // first missing block gives a prefix of them that ends with it.
    const std::vector<BlockKey> want = Keys(t);
    std::vector<BlockKey> resolved;
    std::vector<PageId> pages;
    tree_.TEST_TokenKeys(ns_, t, /*stop_at_missing=*/false, &resolved);
    EXPECT_EQ(resolved, want);
    tree_.TEST_TokenKeys(ns_, t, /*stop_at_missing=*/true, &resolved);
    ASSERT_LE(resolved.size(), want.size());
    EXPECT_TRUE(std::equal(resolved.begin(), resolved.end(), want.begin()));
    if (resolved.size() < want.size()) {
      EXPECT_FALSE(tree_.ContainsKey(resolved.back()));
    }
    if (next(2) == 0) {
      InsertChain(t);
    } else {
      AcquireResult r = Acquire(t, /*allocate=*/false);
      if (r.lease != 0) {
        ASSERT_TRUE(tree_.Release(r.lease).ok());
      }
    }
    if (next(50) == 0) tree_.Evict(1 + next(4));
  }
  EXPECT_GT(walked, 100u);  // the walk did vouch for blocks
}

// A token-mode Match answers exactly what Match does with the hashed chain
// keys, over a tree that mixes chain-keyed blocks (walked), blocks committed
// with tokens but without chain keys and key-mode blocks (both found by
// hashing),
// branches and evictions; it hashes only where the walk stops.
TEST_F(RadixTreeTest, TokenMatchEqualsMatchOfTheChainKeys) {
  uint64_t state = 777;
  auto next = [&state](uint32_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>((state >> 33) % n);
  };
  size_t walked = 0, hashed = 0, hits = 0;
  for (int round = 0; round < 3000; ++round) {
    Tokens t(kPageSize * next(6) + next(kPageSize));
    for (uint32_t& x : t) x = next(3);
    absl::StatusOr<MatchResult> got = tree_.Match(ns_, {}, t);
    ASSERT_TRUE(got.ok()) << got.status();
    absl::StatusOr<MatchResult> want = tree_.Match(ns_, Keys(t), Full(t));
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(got->total_blocks, want->total_blocks) << "round " << round;
    ASSERT_EQ(got->matched_blocks, want->matched_blocks) << "round " << round;
    ASSERT_EQ(got->collisions, want->collisions) << "round " << round;
    // One step per matched block, plus the hashed block that ended it.
    EXPECT_EQ(got->walked_blocks + got->hashed_blocks,
              got->matched_blocks +
                  (got->matched_blocks < got->total_blocks ? 1u : 0u));
    walked += got->walked_blocks;
    hashed += got->hashed_blocks;
    hits += got->matched_blocks;
    switch (next(4)) {
      case 0:
        InsertChain(t);
        break;
      case 1:
        Insert(t);  // tokens, no chain keys: never walked
        break;
      case 2: {     // key mode: no tokens stored, unverifiable
        const auto keys = Keys(t);
        absl::StatusOr<AcquireResult> a =
            tree_.Acquire({.ns = ns_, .keys = keys, .allocate = true});
        ASSERT_TRUE(a.ok()) << a.status();
        if (a->lease != 0) {
          ASSERT_TRUE(tree_.Commit(a->lease, a->new_blocks, true).ok());
        }
        break;
      }
      default:
        break;
    }
    if (next(40) == 0) tree_.Evict(1 + next(6));
  }
  // Both ways were taken: blocks walked, hits found by hashing.
  EXPECT_GT(walked, 50u);
  EXPECT_GT(hits, walked + 50u);
  EXPECT_GT(hashed, 0u);
}

TEST_F(RadixTreeTest, TokenMatchVerifiesHashedHits) {
  // A block stored under a's key with b's tokens (not chain-keyed): the
  // key hit is rejected as a collision, as Match rejects it.
  const Tokens a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  const auto keys = Keys(a);
  absl::StatusOr<AcquireResult> r = tree_.Acquire(
      {.ns = ns_, .keys = keys, .tokens = b, .allocate = true});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(tree_.Commit(r->lease, 1, true).ok());
  absl::StatusOr<MatchResult> m = tree_.Match(ns_, {}, a);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->matched_blocks, 0u);
  EXPECT_EQ(m->collisions, 1u);
  EXPECT_EQ(m->hashed_blocks, 1u);
  EXPECT_EQ(tree_.Match(ns_, keys, a)->collisions, 1u);

  absl::StatusOr<MatchResult> bad = tree_.Match(/*ns=*/99, {}, a);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown namespace id 99"),
            absl::string_view::npos)
      << bad.status();
  const uint64_t matches = tree_.GetStats().matches;
  EXPECT_EQ(tree_.Match(ns_, {}, {})->total_blocks, 0u);
  EXPECT_EQ(tree_.GetStats().matches, matches + 1);
}

TEST_F(RadixTreeTest, KnownPagesAreRecheckedNotTrusted) {
  const Tokens a = {1, 2, 3, 4, 5, 6};
  const Tokens b = {7, 8, 9, 10, 11, 12};
  InsertChain(a);
  std::vector<BlockKey> keys;
  std::vector<PageId> pages;
  ASSERT_EQ(tree_.TEST_WalkTokens(ns_, a, &keys, &pages), 3u);
  ASSERT_EQ(pages.size(), 3u);
  EXPECT_EQ(MatchKnown(a, pages), 3u);
  EXPECT_EQ(MatchKnown(b, pages), 0u);
  // Valid: the same answer as the lookup.
  AcquireResult hit = AcquireKnown(a, pages);
  EXPECT_EQ(hit.matched_blocks, 3u);
  EXPECT_EQ(hit.pages, pages);
  // Another prompt's pages, a page out of range, a shortened list: the
  // lookup decides.
  EXPECT_EQ(AcquireKnown(b, pages).matched_blocks, 0u);
  const std::vector<PageId> bogus = {kCapacity + 5, 0, 1};
  EXPECT_EQ(AcquireKnown(a, bogus).matched_blocks, 3u);
  EXPECT_EQ(AcquireKnown(a, absl::MakeConstSpan(pages).first(1)).matched_blocks,
            3u);
  // Stale: a is evicted and its pages reused by b.
  tree_.Clear();
  InsertChain(b);
  EXPECT_EQ(MatchKnown(a, pages), 0u);
  EXPECT_EQ(MatchKnown(b, pages), 3u);  // b's own blocks, found by lookup
  AcquireResult stale = AcquireKnown(a, pages);
  EXPECT_EQ(stale.matched_blocks, 0u);
  EXPECT_TRUE(stale.pages.empty());
}

TEST_F(RadixTreeTest, EndLeasesEndsThemBetweenPinAndAllocation) {
  const Tokens a = {1, 2, 3, 4, 5, 6};  // 3 blocks
  InsertChain(a);
  const AcquireResult held = AcquireKnown(a, {});  // released at once
  ASSERT_EQ(held.matched_blocks, 3u);
  // A lease on a's prefix, then the same prefix again ending it: the new
  // lease holds the same pages, and only it pins them.
  const auto keys = Keys(a);
  const LeaseId first =
      tree_.Acquire({.ns = ns_, .keys = keys, .tokens = a}).value().lease;
  ASSERT_NE(first, 0u);
  const LeaseId ends[] = {first};
  AcquireResult again = tree_
                            .Acquire({.ns = ns_,
                                      .keys = keys,
                                      .tokens = a,
                                      .end_leases = ends})
                            .value();
  EXPECT_EQ(again.pages, held.pages);
  EXPECT_EQ(tree_.GetStats().leases, 1u);
  EXPECT_EQ(tree_.GetStats().pinned_pages, 3u);
  EXPECT_TRUE(absl::IsNotFound(tree_.Release(first)));  // already ended
  // Pages a lease frees can be allocated by the Acquire that ends it:
  // the other 5 pages are all writing for `w`, a's 3 are pinned by `again`.
  const Tokens five = {9, 9, 8, 8, 7, 7, 6, 6, 5, 5};
  const AcquireResult w = Acquire(five);
  ASSERT_EQ(w.new_blocks, 5u);
  EXPECT_EQ(Acquire({40, 41}).new_blocks, 0u);  // nothing left to take
  const Tokens other = {20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
  const auto other_keys = Keys(other);
  const LeaseId w_only[] = {w.lease};
  AcquireResult reused = tree_
                             .Acquire({.ns = ns_,
                                       .keys = other_keys,
                                       .tokens = other,
                                       .allocate = true,
                                       .end_leases = w_only})
                             .value();
  EXPECT_EQ(reused.new_blocks, 5u);
  ASSERT_TRUE(tree_.Release(reused.lease).ok());
  ASSERT_TRUE(tree_.Release(again.lease).ok());
  EXPECT_EQ(tree_.GetStats().pinned_pages, 0u);
  EXPECT_EQ(tree_.GetStats().writing_pages, 0u);
  ASSERT_TRUE(tree_.CheckInvariants().ok()) << tree_.CheckInvariants();
}

TEST_F(RadixTreeTest, EndLeasesErrorsChangeNothing) {
  const Tokens a = {1, 2, 3, 4};
  InsertChain(a);
  const auto keys = Keys(a);
  const LeaseId held =
      tree_.Acquire({.ns = ns_, .keys = keys, .tokens = a}).value().lease;
  ASSERT_NE(held, 0u);
  const TreeStats before = tree_.GetStats();
  const LeaseId unknown[] = {held, held + 100};
  absl::StatusOr<AcquireResult> r = tree_.Acquire(
      {.ns = ns_, .keys = keys, .tokens = a, .end_leases = unknown});
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("end_leases[1]"), std::string::npos)
      << r.status();
  const LeaseId twice[] = {held, held};
  r = tree_.Acquire(
      {.ns = ns_, .keys = keys, .tokens = a, .end_leases = twice});
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("listed twice"), std::string::npos);
  const TreeStats after = tree_.GetStats();
  EXPECT_EQ(after.leases, before.leases);
  EXPECT_EQ(after.lookups, before.lookups);
  EXPECT_EQ(after.pinned_pages, before.pinned_pages);
  ASSERT_TRUE(tree_.Release(held).ok());  // still live
  ASSERT_TRUE(tree_.CheckInvariants().ok());
}

TEST_F(RadixTreeTest, KnownEpochHoldsUntilAnEviction) {
  const Tokens a = {1, 2, 3, 4, 5, 6};
  const Tokens c = {1, 2, 3, 4, 9, 9};  // shares a's first two blocks
  InsertChain(a);
  std::vector<BlockKey> keys;
  std::vector<PageId> pages;
  uint64_t epoch = 0;
  epoch = tree_.TEST_eviction_epoch();
  ASSERT_EQ(tree_.TEST_WalkTokens(ns_, a, &keys, &pages), 3u);
  EXPECT_NE(epoch, 0u);  // 0 is reserved for "not walked"
  // Matches, pins and releases change no epoch.
  EXPECT_EQ(AcquireKnown(a, pages, epoch).pages, pages);
  EXPECT_EQ(MatchKnown(a, pages, epoch), 3u);
  uint64_t again = 0;
  std::vector<BlockKey> keys2;
  again = tree_.TEST_eviction_epoch();
  EXPECT_EQ(again, epoch);
  // Pages of another prompt at the current epoch: the ends are re-checked
  // and the lookup decides.
  AcquireResult other = AcquireKnown(c, pages, epoch);
  EXPECT_EQ(other.matched_blocks, 2u);
  EXPECT_EQ(other.pages, std::vector<PageId>(pages.begin(), pages.begin() + 2));
  EXPECT_EQ(MatchKnown(c, pages, epoch), 2u);
  // A shorter list is taken, the rest looked up.
  EXPECT_EQ(AcquireKnown(a, absl::MakeConstSpan(pages).first(1), epoch).pages,
            pages);
  // An eviction moves the epoch; a's last page reused under the same parent
  // by c is caught by the per-page check.
  ASSERT_EQ(tree_.Evict(1), 1u);
  InsertChain(c);
  again = tree_.TEST_eviction_epoch();
  EXPECT_GT(again, epoch);
  AcquireResult stale = AcquireKnown(a, pages, epoch);
  EXPECT_EQ(stale.matched_blocks, 2u);
  EXPECT_EQ(MatchKnown(a, pages, epoch), 2u);
  for (PageId p : stale.pages) EXPECT_NE(p, pages[2]);
  ASSERT_TRUE(tree_.CheckInvariants().ok());
}

// A token-mode lookup (no allocation) hashes up to the first block the tree
// lacks and no further, yet counts every block of the prompt.
TEST_F(RadixTreeTest, LookupsHashUpToTheFirstMissingBlock) {
  const Tokens t = {1, 2, 3, 4};
  InsertChain(t);
  const Tokens longer = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 5 blocks
  const auto keys = Keys(longer);
  std::vector<BlockKey> resolved;
  EXPECT_EQ(tree_.TEST_TokenKeys(ns_, longer, /*stop_at_missing=*/true,
                                 &resolved),
            2u);
  EXPECT_EQ(resolved, std::vector<BlockKey>(keys.begin(), keys.begin() + 3));
  const TreeStats before = tree_.GetStats();
  AcquireResult r = tree_.Acquire({.ns = ns_, .tokens = longer}).value();
  EXPECT_EQ(r.total_blocks, 5u);
  EXPECT_EQ(r.matched_blocks, 2u);
  ASSERT_TRUE(tree_.Release(r.lease).ok());
  const TreeStats after = tree_.GetStats();
  EXPECT_EQ(after.lookup_blocks - before.lookup_blocks, 5u);
  EXPECT_EQ(after.walked_blocks - before.walked_blocks, 2u);
  EXPECT_EQ(after.hashed_blocks - before.hashed_blocks, 1u);
  EXPECT_TRUE(tree_.ContainsKey(keys[1]));
  EXPECT_FALSE(tree_.ContainsKey(keys[2]));
}

TEST(RadixTreeLimitsTest, NamespacesAreBounded) {
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = 4}).value();
  RadixTree& tree = *tree_owner;
  NamespaceSpec spec{.model = "m",
                     .num_layers = 1,
                     .num_kv_heads = 1,
                     .head_dim = 4,
                     .page_size = 2,
                     .dtype = DType::kFloat32};
  for (uint32_t i = 0; i < kMaxNamespaces; ++i) {
    spec.cache_salt = std::to_string(i);
    ASSERT_TRUE(tree.RegisterNamespace(spec).ok()) << i;
  }
  spec.cache_salt = "one more";
  EXPECT_EQ(tree.RegisterNamespace(spec).status().code(),
            absl::StatusCode::kResourceExhausted);
  spec.cache_salt = "7";  // already registered: still found
  EXPECT_EQ(tree.RegisterNamespace(spec).value(), 7u);
}

// A token arena over RadixTreeOptions::eager_token_arena_bytes is committed
// page by page instead of up front: the tree behaves the same, including at
// the arena's far end.
TEST(RadixTreeLimitsTest, LargeTokenArenaIsCommittedOnUse) {
  constexpr uint32_t kPage = 64;
  constexpr uint32_t capacity = 5000;  // 1.28 MB of tokens
  std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = capacity,
                  .max_page_size = kPage,
                  .eager_token_arena_bytes = 1 << 20}).value();
  RadixTree& tree = *tree_owner;
  const NamespaceId ns =
      tree.RegisterNamespace(NamespaceSpec{.model = "m", .page_size = kPage})
          .value();
  const BlockKey root = tree.namespace_root(ns);
  // Fill every page, so the last pages of the arena are written too.
  uint32_t next = 0;
  for (uint32_t done = 0; done < capacity;) {
    Tokens t(size_t{std::min(capacity - done, 512u)} * kPage);
    for (uint32_t& x : t) x = next++;
    const auto keys = ComputeBlockKeys(root, kPage, t);
    AcquireResult a =
        *tree.Acquire({.ns = ns, .tokens = t, .allocate = true});
    ASSERT_EQ(a.new_blocks, keys.size());
    ASSERT_TRUE(tree.Commit(a.lease, a.new_blocks, true).ok());
    done += a.new_blocks;
  }
  EXPECT_EQ(tree.GetStats().cached_pages, capacity);
  // The last prompt is matched by token comparison along its chain.
  Tokens last(size_t{capacity % 512 == 0 ? 512 : capacity % 512} * kPage);
  for (size_t i = 0; i < last.size(); ++i) {
    last[i] = next - static_cast<uint32_t>(last.size()) + static_cast<uint32_t>(i);
  }
  absl::StatusOr<MatchResult> m = tree.Match(ns, {}, last);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->matched_blocks, last.size() / kPage);
  EXPECT_TRUE(tree.CheckInvariants().ok());
}

// The token walks (token-mode Match, the walk of a token-mode Acquire)
// compare blocks with code of their own: 64-byte blocks (page_size 16)
// inline, and 64- and 128-byte blocks (16, 32) in 32-byte vector lanes where
// the CPU has AVX2 (RadixTreeOptions::vector_walk); other sizes with
// memcmp. With either walk, at each of these page sizes, changing any one
// bit of any token of block b stops both walks at block b, and an unchanged
// prompt walks to its end.
class RadixTreeTokenWalkTest : public testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(Walks, RadixTreeTokenWalkTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Vector" : "Portable";
                         });

TEST_P(RadixTreeTokenWalkTest, EveryTokenOfEveryBlockIsCompared) {
  constexpr uint32_t kBlocks = 6;
  for (const uint32_t ps : {2u, 15u, 16u, 24u, 32u, 64u}) {
    SCOPED_TRACE(testing::Message() << "page_size " << ps);
    std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = 64, .vector_walk = GetParam()}).value();
  RadixTree& tree = *tree_owner;
    if (!GetParam() || (ps != 16 && ps != 32)) {
      EXPECT_FALSE(tree.vector_walk(ps));
    }
#if defined(__x86_64__)
    if (GetParam() && (ps == 16 || ps == 32)) {
      // On a CPU with AVX2 the Vector variant really runs the AVX2 walk.
      EXPECT_EQ(tree.vector_walk(ps), __builtin_cpu_supports("avx2") != 0);
    }
#endif
    const NamespaceId ns =
        tree.RegisterNamespace(NamespaceSpec{.model = "m", .page_size = ps})
            .value();
    Tokens base(size_t{kBlocks} * ps);
    for (size_t i = 0; i < base.size(); ++i) {
      base[i] = static_cast<uint32_t>(1000 + 7 * i);
    }
    const auto keys = ComputeBlockKeys(tree.namespace_root(ns), ps, base);
    AcquireResult a = *tree.Acquire({.ns = ns, .tokens = base,
                                     .allocate = true});
    ASSERT_TRUE(tree.Commit(a.lease, a.new_blocks, true).ok());

    MatchResult whole = *tree.Match(ns, {}, base);
    EXPECT_EQ(whole.matched_blocks, kBlocks);
    EXPECT_EQ(whole.walked_blocks, kBlocks);
    std::vector<BlockKey> walked_keys;
    std::vector<PageId> pages;
    EXPECT_EQ(tree.TEST_WalkTokens(ns, base, &walked_keys, &pages),
              kBlocks);
    EXPECT_EQ(walked_keys, keys);

    for (uint32_t b = 0; b < kBlocks; ++b) {
      for (uint32_t j = 0; j < ps; ++j) {
        Tokens t = base;
        t[size_t{b} * ps + j] ^= 1u << ((j * 7 + b) % 32);
        MatchResult m = *tree.Match(ns, {}, t);
        ASSERT_EQ(m.matched_blocks, b) << "token " << j << " of block " << b;
        walked_keys.clear();
        pages.clear();
        ASSERT_EQ(tree.TEST_WalkTokens(ns, t, &walked_keys, &pages), b)
            << "token " << j << " of block " << b;
        ASSERT_EQ(walked_keys.size(), b);
        ASSERT_EQ(pages.size(), b);
      }
    }
    EXPECT_TRUE(tree.CheckInvariants().ok());
  }
}

// At the page sizes with walks of their own (16 and 32), under churn in a
// small pool (eviction, page reuse, branches, tokens that differ only in the
// last token of a block): a token-mode Match answers what Match of the
// hashed chain keys answers, and the walk vouches only for chain keys.
TEST_P(RadixTreeTokenWalkTest, AgreesWithTheChainKeysUnderChurn) {
  for (const uint32_t ps : {16u, 32u}) {
    SCOPED_TRACE(testing::Message() << "page_size " << ps);
    std::unique_ptr<RadixTree> tree_owner =
      RadixTree::Create({.capacity_pages = 12, .vector_walk = GetParam()}).value();
  RadixTree& tree = *tree_owner;
    const NamespaceId ns =
        tree.RegisterNamespace(NamespaceSpec{.model = "m", .page_size = ps})
            .value();
    const BlockKey root = tree.namespace_root(ns);
    uint64_t state = 4242 + ps;
    auto next = [&state](uint32_t n) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<uint32_t>((state >> 33) % n);
    };
    size_t walked = 0, hits = 0;
    for (int round = 0; round < 1500; ++round) {
      // Blocks are one of three patterns, so prompts share prefixes often;
      // pattern 2 differs from pattern 1 in its last token only.
      Tokens t;
      const uint32_t blocks = 1 + next(5);
      for (uint32_t b = 0; b < blocks; ++b) {
        const uint32_t pattern = next(3);
        for (uint32_t j = 0; j < ps; ++j) {
          t.push_back(j + 1 == ps && pattern == 2 ? 99 : pattern == 0 ? j : 7);
        }
      }
      const std::vector<BlockKey> keys = ComputeBlockKeys(root, ps, t);
      absl::StatusOr<MatchResult> got = tree.Match(ns, {}, t);
      absl::StatusOr<MatchResult> want = tree.Match(ns, keys, t);
      ASSERT_TRUE(got.ok() && want.ok());
      ASSERT_EQ(got->matched_blocks, want->matched_blocks) << "round " << round;
      std::vector<BlockKey> walked_keys;
      tree.TEST_WalkTokens(ns, t, &walked_keys);
      ASSERT_LE(walked_keys.size(), got->matched_blocks) << "round " << round;
      ASSERT_TRUE(std::equal(walked_keys.begin(), walked_keys.end(),
                             keys.begin()))
          << "round " << round;
      walked += got->walked_blocks;
      hits += got->matched_blocks;
      AcquireResult a = *tree.Acquire({.ns = ns, .tokens = t,
                                       .allocate = true});
      if (a.lease != 0) {
        ASSERT_TRUE(tree.Commit(a.lease, a.new_blocks, true).ok());
      }
    }
    EXPECT_GT(walked, 500u);  // the walk found hits
    EXPECT_GT(hits, walked);  // and hashing the branches it did not follow
    EXPECT_GT(tree.GetStats().evicted_pages, 100u);
    EXPECT_TRUE(tree.CheckInvariants().ok());
  }
}

TEST(BlockKeyAppendTest, ParentMayBeTheVectorsOwnBack) {
  const BlockKey root{1, 2};
  const Tokens t = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<BlockKey> want = ComputeBlockKeys(root, 2, t);
  std::vector<BlockKey> keys = {want[0]};
  keys.shrink_to_fit();  // the append must grow the vector under `parent`
  AppendBlockKeys(keys.back(), 2, absl::MakeConstSpan(t).subspan(2), &keys);
  EXPECT_EQ(keys, want);
  std::vector<BlockKey> none;
  AppendBlockKeys(root, 2, {1}, &none);  // no full block
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace radixkv
