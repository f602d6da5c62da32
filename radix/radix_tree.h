// File: radix/radix_tree.h
//
// RadixTree: the prefix index of radixkv. It maps chained block keys
// (block_key.h) to page ids of a fixed-capacity pool, does the pool's page
// accounting (FREE -> WRITING -> CACHED -> FREE) and evicts least-recently-used
// unpinned leaves when it needs room.
//
//   RadixTree tree({.capacity_pages = 1 << 20});
//   NamespaceId ns = *tree.RegisterNamespace(spec);
//   auto keys = ComputeBlockKeys(tree.namespace_root(ns), spec.page_size, tokens);
//   AcquireResult a = *tree.Acquire({.ns = ns, .keys = keys, .tokens = tokens,
//                                    .allocate = true});
//   ... write K/V of the new blocks into a.pages[a.matched_blocks...] ...
//   tree.Commit(a.lease, a.new_blocks, /*release=*/true);
//
// Model
// -----
// * One node per cached block; a node owns exactly one page and node storage
//   is indexed by page id. Children are not stored: keys are chained, so a
//   key names its whole path and one hash map (key -> page) finds any block.
//   A node records its parent and a count of its children.
// * Match is read-only. Acquire pins the matched path (refcount += 1 on every
//   node) and moves free (or evicted) pages to WRITING for the next unmatched
//   full blocks. Commit turns WRITING pages into CACHED nodes in block order;
//   a block that is already cached (another lease committed it first) is
//   deduplicated: the existing page wins and the lease's duplicate page is
//   freed when the lease ends. Release unpins and frees unwritten pages.
// * Verified hits: the tree stores each block's tokens. When a request carries
//   tokens, a key hit whose stored tokens (or parent) differ is a miss and is
//   counted as a hash collision. Key mode (no tokens) cannot be verified.
//
// Eviction (exact leaf LRU in O(1))
// ---------------------------------
// Every unpinned cached node sits in one recency list. Leases pin whole
// root paths, and every operation that makes nodes unpinned re-inserts them
// deepest first, so a node is always older in the list than its parent. The
// oldest entry is therefore always an unpinned leaf; evicting it is O(1), and
// the order is least recently used first, deeper first on ties.
//
// Invariants (CheckInvariants): free + writing + cached == capacity;
// every pinned page is cached; every key in the map names a live node whose
// parent is live; child counts match; the recency list holds exactly the
// unpinned cached nodes, each older than its parent.
//
// Thread safety: thread-safe; one internal mutex guards all state. Hashing
// (ComputeBlockKeys) happens outside the lock, in the caller. The
// EventListener is called with that mutex held (see below).
#ifndef RADIXKV_RADIX_RADIX_TREE_H_
#define RADIXKV_RADIX_RADIX_TREE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "radix/block_key.h"

namespace radixkv {

using PageId = uint32_t;
using LeaseId = uint64_t;
using NamespaceId = uint32_t;

inline constexpr PageId kNoPage = 0xffffffffu;
// Most namespaces one tree holds.
inline constexpr uint32_t kMaxNamespaces = 0xffff;
// Blocks an admin eviction (Evict, Clear) removes per hold of the tree's
// lock: ~50 us at 1 M cached blocks, where one hold for all of them would
// stall every lookup for tens of milliseconds.
inline constexpr uint64_t kAdminEvictionBatch = 1024;

enum class PageState : uint8_t { kFree = 0, kWriting = 1, kCached = 2 };

// A change to the set of cached blocks, as WatchEvents reports it.
struct TreeEvent {
  enum class Type : uint8_t { kStored, kRemoved, kCleared };
  Type type = Type::kStored;
  NamespaceId ns = 0;
  BlockKey key;         // kStored / kRemoved
  BlockKey parent_key;  // kStored: the parent's key (the namespace root for a first block)
  PageId page = kNoPage;
  uint32_t depth = 0;   // kStored: block index in its prompt (0 = first block)
};

// Receives tree events. Called with the tree's mutex held, in tree order: an
// implementation must be quick, must not block and must never call back into
// the tree (append to a ring buffer and return).
class EventListener {
 public:
  virtual ~EventListener() = default;
  virtual void OnTreeEvents(absl::Span<const TreeEvent> events) = 0;
};

struct RadixTreeOptions {
  // Pages in the pool; page ids are 0 .. capacity_pages-1. REQUIRES: > 0 and
  // < kNoPage.
  uint32_t capacity_pages = 0;
  // Upper bound on a namespace's page_size (tokens per block). Token storage
  // is reserved per page for the first registered page_size.
  uint32_t max_page_size = 4096;
  // How many recently evicted keys Explain remembers (0: none).
  uint32_t remembered_evictions = 4096;
  // Not owned; may be null. Must outlive the tree.
  EventListener* listener = nullptr;
  // Token copies (capacity_pages x page_size x 4 bytes) up to this size are
  // made resident on huge pages when the first namespace registers, so that
  // no insert faults memory in under the lock; a larger arena is committed
  // by the OS 4 KiB at a time as blocks are first stored.
  size_t eager_token_arena_bytes = size_t{1} << 30;
  // Compare token blocks with AVX2 in the token walks (MatchTokens,
  // PrefixKeysByTokens) where the CPU has it and a block is 64 or 128 bytes
  // (page_size 16 or 32). false: the portable walk everywhere. Same
  // results either way.
  bool vector_walk = true;
};

struct AcquireRequest {
  NamespaceId ns = 0;
  // One key per full block, in order (ComputeBlockKeys).
  absl::Span<const BlockKey> keys;
  // Either empty (key mode: hits are not verified) or exactly
  // keys.size() * page_size tokens: the full blocks' tokens.
  absl::Span<const uint32_t> tokens;
  // Allocate pages for unmatched full blocks.
  bool allocate = false;
  // With allocate: at most this many new pages (0 = one per unmatched block).
  uint32_t max_new_blocks = 0;
  // The caller vouches that keys == ComputeBlockKeys(namespace root,
  // page_size, tokens) (the plain chain, no extras), as radixkvd does for
  // token prompts. Blocks committed from such a lease can later be matched
  // from tokens without hashing (PrefixKeysByTokens). REQUIRES tokens.
  bool chain_keys = false;
  // Optional: the pages PrefixKeysByTokens walked for keys[0 ..
  // known_pages.size()). Each is re-checked in O(1) (still cached, chain
  // keyed, same namespace, parent and key) instead of looked up and
  // token-compared again; the first that fails the check falls back to the
  // lookup.
  absl::Span<const PageId> known_pages;
  // The walk's eviction epoch (PrefixKeysByTokens' *epoch), when the caller
  // walked known_pages for these keys in this namespace: while no cached
  // page has left the tree since, known_pages are taken as they are (only
  // the first and last re-checked) instead of page by page. 0: re-check each.
  uint64_t known_epoch = 0;
  // Full blocks of the whole prompt when `keys` cover only its first blocks
  // (a caller that stops hashing at the first block the tree lacks; no
  // allocation then): counted in the lookup statistics and returned as
  // total_blocks. 0: keys.size().
  uint32_t prompt_blocks = 0;
  // Leases to end in the same step, as Release would: after the matched
  // prefix is pinned and before any page is allocated, so pages both hold
  // stay pinned throughout (no trip through the recency list) and pages they
  // free can be allocated. Every one must be live and listed once, else
  // NOT_FOUND / INVALID_ARGUMENT naming it, and nothing changes.
  absl::Span<const LeaseId> end_leases;
};

struct AcquireResult {
  LeaseId lease = 0;             // 0 when nothing was pinned or allocated
  uint32_t total_blocks = 0;
  uint32_t matched_blocks = 0;
  // The matched pages in block order, then the new_blocks allocated pages
  // (state WRITING) for blocks matched_blocks .. matched_blocks+new_blocks-1.
  // All of them are pinned by `lease`.
  std::vector<PageId> pages;
  uint32_t new_blocks = 0;
  uint32_t evicted_pages = 0;    // evicted to make room for the new pages
  uint32_t collisions = 0;       // key hits rejected by token verification
};

struct CommitResult {
  uint32_t inserted = 0;      // blocks that became new cached nodes
  uint32_t deduplicated = 0;  // blocks already cached: the existing page won
  uint32_t collided = 0;      // key taken by different tokens; not cached
  // The canonical page of each block committed by this call, in block order
  // (the existing page for a deduplicated block).
  std::vector<PageId> pages;
  bool released = false;
};

// Read-only lookup result (Match).
struct MatchResult {
  uint32_t total_blocks = 0;
  uint32_t matched_blocks = 0;
  uint32_t collisions = 0;
  // MatchTokens only: blocks found by following hot children (no hashing)
  // and blocks whose key was hashed.
  uint32_t walked_blocks = 0;
  uint32_t hashed_blocks = 0;
};

// Why a block is or is not cached (Explain).
enum class BlockStatus : uint8_t {
  kCached,          // hit
  kNotPresent,      // never seen, or forgotten
  kEvicted,         // was cached and evicted recently
  kTokenMismatch,   // key present but stored tokens differ (hash collision)
  kParentMissing,   // an earlier block of the prompt is not cached
};
const char* BlockStatusName(BlockStatus s);

struct BlockExplanation {
  BlockKey key;
  BlockStatus status = BlockStatus::kNotPresent;
  PageId page = kNoPage;     // kCached
  uint32_t refcount = 0;     // kCached: leases pinning it
  double age_seconds = 0;    // kCached: since last use
};

// A cached node, for DumpTree.
struct NodeInfo {
  BlockKey key;
  BlockKey parent_key;       // the namespace root for a first block
  NamespaceId ns = 0;
  PageId page = kNoPage;
  uint32_t depth = 0;        // 0 = first block
  uint32_t refcount = 0;
  uint32_t children = 0;
  double age_seconds = 0;    // since last use
};

struct NamespaceInfo {
  NamespaceId id = 0;
  NamespaceSpec spec;
  BlockKey root;
  uint64_t cached_blocks = 0;
};

struct TreeStats {
  uint64_t capacity_pages = 0;
  uint64_t free_pages = 0;
  uint64_t writing_pages = 0;
  uint64_t cached_pages = 0;
  uint64_t pinned_pages = 0;       // cached pages with refcount > 0
  uint64_t nodes = 0;              // == cached_pages
  uint64_t leases = 0;
  uint64_t namespaces = 0;
  uint64_t lookups = 0;            // Acquire calls
  uint64_t lookup_blocks = 0;      // full blocks asked for by Acquire
  uint64_t hit_blocks = 0;         // of which matched
  uint64_t lookup_tokens = 0;      // lookup_blocks * page_size
  uint64_t hit_tokens = 0;         // hit_blocks * page_size
  uint64_t matches = 0;            // read-only Match calls
  uint64_t inserted_blocks = 0;
  uint64_t deduplicated_blocks = 0;
  uint64_t evicted_pages = 0;
  uint64_t hash_collisions = 0;
};

class RadixTree {
 public:
  explicit RadixTree(const RadixTreeOptions& options);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  // Returns the id of `spec`'s namespace, registering it on first use (an
  // equal spec always gets the same id). INVALID_ARGUMENT names the field
  // when page_size is 0 or above max_page_size; FAILED_PRECONDITION when
  // page_size differs from the one the tree's token storage was sized for;
  // RESOURCE_EXHAUSTED once kMaxNamespaces are registered.
  absl::StatusOr<NamespaceId> RegisterNamespace(const NamespaceSpec& spec);
  // The namespace's root key. REQUIRES: ns was returned by RegisterNamespace.
  BlockKey namespace_root(NamespaceId ns) const;
  uint32_t page_size(NamespaceId ns) const;
  std::vector<NamespaceInfo> ListNamespaces() const;

  // Longest cached prefix of `req.keys`; changes nothing (not even recency).
  // INVALID_ARGUMENT for an unknown ns or a tokens size that is not
  // keys.size() * page_size. `known_pages`, `known_epoch`: as in
  // AcquireRequest.
  absl::StatusOr<MatchResult> Match(
      NamespaceId ns, absl::Span<const BlockKey> keys,
      absl::Span<const uint32_t> tokens,
      absl::Span<const PageId> known_pages = {},
      uint64_t known_epoch = 0) const;

  // Match for a tokens prompt without its keys, in one pass under the
  // reader lock: from the root, each step follows the child most recently
  // matched or inserted there while its stored tokens equal the block's
  // (as PrefixKeysByTokens); where that fails, it hashes that one block
  // (ChainBlockKey from the parent's key) and looks the key up, as Match
  // does. So only branch points and the block that ends the match are
  // hashed, and nothing is allocated on a walk. The same answer as
  // Match(ns, ComputeBlockKeys(namespace_root(ns), page_size, tokens),
  // tokens); a partial last block is ignored. Changes nothing.
  // INVALID_ARGUMENT for an unknown ns.
  absl::StatusOr<MatchResult> MatchTokens(
      NamespaceId ns, absl::Span<const uint32_t> tokens) const;

  // The keys of a leading run of `tokens`' full blocks, found without
  // hashing: from the root, each step follows the child most recently
  // matched or inserted there and accepts it when its stored tokens equal
  // the block's and it was committed with chain keys, so its key is the one
  // ChainBlockKey would compute. Appends those keys to *keys and returns how
  // many; the caller hashes the rest from keys->back() (ComputeBlockKeys
  // with AppendBlockKeys). A shorter run than the cached prefix is fine: the
  // hashed keys then find the rest. Changes nothing. 0 for an unknown ns.
  // With `pages`, also appends the pages walked (AcquireRequest::
  // known_pages); with `epoch`, sets it to the tree's eviction epoch at the
  // walk (AcquireRequest::known_epoch; never 0).
  size_t PrefixKeysByTokens(NamespaceId ns, absl::Span<const uint32_t> tokens,
                            std::vector<BlockKey>* keys,
                            std::vector<PageId>* pages = nullptr,
                            uint64_t* epoch = nullptr) const;

  // Whether a cached block has this key (in any namespace, at any depth).
  bool ContainsKey(const BlockKey& key) const;

  // The keys ComputeBlockKeys(namespace_root(ns), page_size, tokens) gives,
  // into *keys (cleared), found the cheap way: the leading blocks
  // PrefixKeysByTokens vouches for (their pages into *pages, cleared, for
  // known_pages), the rest hashed with no lock held. With stop_at_missing,
  // hashing ends after the first block no cached node has: enough for a
  // lookup (the match ends there), not for allocating pages. Returns how
  // many keys came from the walk; `epoch` as in PrefixKeysByTokens.
  // REQUIRES: ns was returned by RegisterNamespace.
  size_t ResolveTokenKeys(NamespaceId ns, absl::Span<const uint32_t> tokens,
                          bool stop_at_missing, std::vector<BlockKey>* keys,
                          std::vector<PageId>* pages,
                          uint64_t* epoch = nullptr) const;

  // Pins the longest cached prefix and, with allocate, takes pages for the
  // following unmatched blocks (evicting LRU leaves as needed; fewer pages
  // than asked when everything else is pinned). The caller owns the returned
  // lease and must end it with Commit(release=true) or Release.
  // Errors (nothing changed): INVALID_ARGUMENT as for Match.
  absl::StatusOr<AcquireResult> Acquire(const AcquireRequest& req);

  // Commits the next `blocks` uncommitted new pages of `lease` in block
  // order; with release, then ends the lease. Errors (nothing changed):
  // NOT_FOUND for an unknown lease; FAILED_PRECONDITION when `blocks` exceeds
  // the lease's uncommitted pages (the message gives both numbers).
  absl::StatusOr<CommitResult> Commit(LeaseId lease, uint32_t blocks,
                                      bool release);

  // Ends `lease`: unpins its path, frees its uncommitted and duplicate pages.
  // NOT_FOUND for an unknown lease.
  absl::Status Release(LeaseId lease);

  // Per-block explanation of the prompt's cache state.
  absl::StatusOr<std::vector<BlockExplanation>> Explain(
      NamespaceId ns, absl::Span<const BlockKey> keys,
      absl::Span<const uint32_t> tokens) const;

  // Evicts up to `max_pages` LRU unpinned leaves; returns how many. Takes
  // the lock for kAdminEvictionBatch blocks at a time, so lookups and
  // inserts go on between batches.
  uint64_t Evict(uint64_t max_pages);
  // Evicts every unpinned cached block (all of them, when none is pinned) and
  // emits kCleared after the last kRemoved; returns how many were removed.
  // Pinned paths stay. In batches like Evict, and bounded by the blocks
  // cached when it started: blocks inserted or unpinned meanwhile may stay.
  uint64_t Clear();

  // Up to `limit` cached nodes, shallowest first (then most recent first).
  std::vector<NodeInfo> DumpTree(uint32_t max_depth, uint32_t limit) const;

  TreeStats GetStats() const;
  // Full consistency check, O(capacity). OK or INTERNAL describing the first
  // violation found.
  absl::Status CheckInvariants() const;

  // Approximate bytes of index memory (nodes, hash map, free list, lease
  // table), excluding the token copies.
  size_t IndexMemoryBytes() const;
  // Whether the token walks over blocks of `page_size` tokens use their
  // AVX2 copy (RadixTreeOptions::vector_walk, the CPU has AVX2, and
  // page_size is 16 or 32).
  bool vector_walk(uint32_t page_size) const;
  PageState TEST_page_state(PageId page) const;
  uint32_t TEST_refcount(PageId page) const;

 private:
  // All state lives in Impl (radix_tree.cc), guarded by Impl::mu.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace radixkv

#endif  // RADIXKV_RADIX_RADIX_TREE_H_
