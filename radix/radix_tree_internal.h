// File: radix/radix_tree_internal.h
//
// Private to radix_tree*.cc: the node layout, the key index, the lease record
// and RadixTree::Impl. Not part of the library's interface; include only from
// radix/radix_tree*.cc.
//
// Storage
//   nodes[p] describes page p whatever its state; for a CACHED page it is
//   the tree node of the block stored there (40 bytes). Slot `capacity` is
//   the sentinel of the recency list. The key index is a flat_hash_set of
//   page ids whose hasher and equality read nodes[p].key, so a lookup by
//   BlockKey is heterogeneous and the index costs ~5-10 bytes per block.
//   Token copies live in one arena of capacity * page_size uint32s, allocated
//   on the first RegisterNamespace: faulted in at once up to
//   RadixTreeOptions::eager_token_arena_bytes, else committed by the OS as
//   blocks are first stored (AllocArena).
//
// Lists threaded through links[p] (a dense 8-byte-per-page array apart from
// the nodes, so walking the recency list touches 8 MB at 1 M pages, not the
// 40 MB of nodes: eviction chases these links one dependent load at a time)
//   * the recency lists, one per account, each headed by its sentinel at
//     slot capacity + account: exactly the CACHED nodes with refs == 0 of
//     the account's namespaces, oldest first after the sentinel. Invariant:
//     a node is older than its parent (or its parent is pinned), so the
//     oldest entry is an unpinned leaf (parent and child always share a
//     namespace, hence an account).
//   * the free list: FREE pages, singly linked through links[p].next, LIFO.
//
// Leases
//   A lease pins one root path (matched nodes, then the canonical node of
//   each committed block) and owns its WRITING pages. Committed pages that
//   became nodes turn CACHED; duplicate and collided pages stay WRITING until
//   the lease ends and are then freed. Because every lease pins a whole root
//   path, refs(parent) >= refs(child) always holds.
//   The lease record is the only record of a lease: its owner and expiry
//   live on it, and owner_leases counts the live leases of each owner other
//   than kNoOwner (EraseLease keeps both in step).
//
// Token-mode prompts
//   Acquire and Match given tokens alone find their keys in two steps: a
//   walk under the shared lock follows each node's hot child (the child most
//   recently matched or inserted there) while its stored tokens equal the
//   next block and its key is a chain key, which yields keys without
//   hashing; the remaining blocks are hashed with no lock held. The walk's
//   pages and the eviction epoch at the walk are handed to the locked step,
//   which takes the pages as they are while no cached block has left the
//   tree since (eviction_epoch unchanged).
//
// Thread safety: every field of Impl except the constants is guarded by
// Impl::mu; helpers state their lock requirement.
#ifndef RADIXKV_RADIX_RADIX_TREE_INTERNAL_H_
#define RADIXKV_RADIX_RADIX_TREE_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "radix/radix_tree.h"
#include "radix/turn_duel.h"

namespace radixkv {
namespace radix_internal {

// One per page. Fields other than `state` are meaningful only for CACHED
// pages.
struct Node {
  BlockKey key;
  PageId parent = kNoPage;   // kNoPage: first block of its prompt
  uint32_t refs = 0;         // leases pinning this node
  uint32_t children = 0;     // cached nodes whose parent is this one
  uint32_t last_used = 0;    // seconds since the tree's epoch
  // The child most recently matched or inserted below this node: a hint
  // for the token walk, checked on every use (it may name a page that
  // has since been evicted or reused). kNoPage: none yet.
  PageId hot_child = kNoPage;
  uint16_t ns = 0;           // RadixTree::kMaxNamespaces bounds it
  PageState state = PageState::kFree;
  bool has_tokens : 1 = false;   // stored tokens valid (false: key mode)
  // key == ChainBlockKey(parent's key or the root, stored tokens): safe to
  // derive from a token comparison (committed from a token-mode lease).
  bool chain_keyed : 1 = false;
  // On its account's probation stack when unpinned, not its recency list
  // (turn_duel: inserted by a lease whose request was not admitted, and
  // not matched since).
  bool probation : 1 = false;
  // Evicted while on probation, it is dropped rather than offered to the
  // tiers below the pool (turn_duel's tier duel; EvictedBlock::demote).
  bool drop_below : 1 = false;
};
static_assert(sizeof(Node) <= 40, "keep the node within 40 bytes");

// x86-64 builds carry a second copy of the token walks compiled for AVX2
// and pick it at run time (RadixTreeOptions::vector_walk, Impl::wide_walk).
// Elsewhere wide_walk is always false.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RADIXKV_WIDE_WALK 1
#define RADIXKV_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define RADIXKV_WIDE_WALK 0
#define RADIXKV_TARGET_AVX2
#endif

// Whether two token blocks are equal. kBytes is the block size when known
// at compile time, 0 for `bytes` at run time. The token walks compare one
// block per cached block they pass, so this is their inner step.
//   kWide == false: for 64-byte blocks (page_size 16) the compiler compares
//     inline (eight 8-byte loads and XORs), and without a memcmp call in the
//     loop the walk keeps its state in registers. From 128 bytes on, libc's
//     memcmp is faster than the inline compare, so only kBytes 64 is
//     instantiated.
//   kWide == true: 32-byte vector lanes, XORed and ORed together, one test
//     per block. Written with GCC/Clang vector extensions, not intrinsics,
//     so it is correct wherever it is inlined and becomes AVX2 code inside
//     a RADIXKV_TARGET_AVX2 function (the wide walks).
template <size_t kBytes, bool kWide = false>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool SameBlock(const uint32_t* a,
                                                   const uint32_t* b,
                                                   size_t bytes) {
  if constexpr (kWide) {
#if RADIXKV_WIDE_WALK
    static_assert(kBytes > 0 && kBytes % 32 == 0 && kBytes <= 128,
                  "wide compare: 32, 64, 96 or 128-byte blocks");
    using Lane = uint64_t __attribute__((vector_size(32)));
    using Half = uint64_t __attribute__((vector_size(16)));
    const char* x = reinterpret_cast<const char*>(a);
    const char* y = reinterpret_cast<const char*>(b);
    Lane diff = {0, 0, 0, 0};
    for (size_t i = 0; i < kBytes; i += 32) {
      Lane u;
      Lane v;
      std::memcpy(&u, x + i, sizeof(u));
      std::memcpy(&v, y + i, sizeof(v));
      diff |= u ^ v;
    }
    const Half h = __builtin_shufflevector(diff, diff, 0, 1) |
                   __builtin_shufflevector(diff, diff, 2, 3);
    return (h[0] | h[1]) == 0;
#else
    static_assert(!kWide, "no wide walk on this target");
#endif
  } else if constexpr (kBytes == 0) {
    return std::memcmp(a, b, bytes) == 0;
  } else {
    static_assert(kBytes <= 64, "larger blocks compare faster with memcmp");
    return std::memcmp(a, b, kBytes) == 0;
  }
}

// Recency-list / free-list links of one page (see the file comment).
struct Link {
  PageId prev = kNoPage;
  PageId next = kNoPage;
};

// Memory for the index's big arrays (nodes, links, key index). Blocks of at
// least 2 MiB are 2 MiB-aligned and marked MADV_HUGEPAGE, so random accesses
// over ~60 MB of index at 1 M blocks do not also miss the TLB (this machine
// kind runs transparent huge pages in madvise mode), and faulted in before
// they are returned (see AllocLarge in radix_tree.cc). Returns nullptr when
// out of memory. Memory is not initialised; release with FreeLarge.
void* AllocLarge(size_t bytes);
// Memory for the token arena: AllocLarge's when it is at most `eager_bytes`
// (RadixTreeOptions::eager_token_arena_bytes), else page-aligned without a
// huge-page request and committed by the OS page by page as blocks are
// first stored. Release with FreeLarge.
void* AllocArena(size_t bytes, size_t eager_bytes);
void FreeLarge(void* p);

struct LargeDeleter {
  void operator()(void* p) const { FreeLarge(p); }
};

// std-style allocator over AllocLarge for the key index's backing array.
template <typename T>
struct LargeAllocator {
  using value_type = T;
  LargeAllocator() = default;
  template <typename U>
  LargeAllocator(const LargeAllocator<U>&) {}  // NOLINT: rebinding
  // Throws std::bad_alloc, as containers expect; the key index allocates
  // only in Impl::Init, which turns that into a Status.
  T* allocate(size_t n) {
    void* p = AllocLarge(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { FreeLarge(p); }
  template <typename U>
  bool operator==(const LargeAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const LargeAllocator<U>&) const { return false; }
};

// Mixes a key into a 64-bit hash. Keys are uniform already, but tests (and
// key-mode clients) may send low-entropy hand-made keys.
inline size_t MixKey(const BlockKey& k) {
  uint64_t h = k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull);
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return static_cast<size_t>(h);
}

// Transparent hasher / equality over page ids that read the node array.
struct PageHash {
  using is_transparent = void;
  const Node* nodes = nullptr;
  size_t operator()(PageId p) const { return MixKey(nodes[p].key); }
  size_t operator()(const BlockKey& k) const { return MixKey(k); }
};
struct PageEq {
  using is_transparent = void;
  const Node* nodes = nullptr;
  bool operator()(PageId a, PageId b) const { return a == b; }
  bool operator()(PageId a, const BlockKey& k) const {
    return nodes[a].key == k;
  }
  bool operator()(const BlockKey& k, PageId a) const {
    return nodes[a].key == k;
  }
};
using KeyIndex =
    absl::flat_hash_set<PageId, PageHash, PageEq, LargeAllocator<PageId>>;

// A block's retention priority as a function of time: `prio` until
// `expires` (seconds since the tree's epoch; kNever: no expiry), then
// kDefaultPriority. The default always has expires == kNever.
inline constexpr uint32_t kNever = 0xffffffffu;
struct Priority {
  uint8_t prio = kDefaultPriority;
  uint32_t expires = kNever;
};
// No requirement at all: below every priority, the identity of Combine.
inline constexpr Priority kBottomPriority{0, kNever};
// The least Priority that is at every time at least both a and b: exact
// unless both are above the default, when the higher priority is kept
// until the later expiry.
inline Priority CombinePriority(Priority a, Priority b) {
  const bool ha = a.prio >= kDefaultPriority, hb = b.prio >= kDefaultPriority;
  if (ha && hb) {
    if (a.prio == kDefaultPriority) return b;
    if (b.prio == kDefaultPriority) return a;
    return {std::max(a.prio, b.prio), std::max(a.expires, b.expires)};
  }
  if (ha) return a;
  if (hb) return b;
  return {std::max(a.prio, b.prio), std::min(a.expires, b.expires)};
}
// Its value at time t.
inline uint32_t PriorityAt(Priority v, uint32_t t) {
  return t < v.expires ? v.prio : kDefaultPriority;
}
// A lease's BlockPriority, its expiry resolved.
struct PriorityRange {
  uint32_t first = 0;
  uint32_t blocks = 0;
  Priority value;
};

struct Lease {
  OwnerId owner = kNoOwner;
  absl::Time expires = absl::InfiniteFuture();
  NamespaceId ns = 0;
  uint32_t matched = 0;         // matched blocks at Acquire
  bool has_tokens = false;
  bool chain_keyed = false;     // keys computed by the tree from the tokens
  bool broken = false;          // a commit collided; later blocks are orphans
  bool fenced = false;          // expired / owner gone; pages held (fence)
  // A prefix pin (PinPrefix): owner kPinOwner, no expiry, no WRITING
  // pages; its pages count as its account's pin_pages, not as held.
  bool prefix_pin = false;
  // Its new blocks join the recency list (true) or the probation stack
  // (the eviction policy's choice at Acquire).
  bool admit = true;
  // Those of them evicted from probation go to the tiers (true) or are
  // dropped (the eviction policy's choice at Acquire).
  bool demote = true;
  uint64_t held = 0;            // pages held: pinned path + WRITING pages
  uint32_t committed = 0;       // writing[0 .. committed) were committed
  std::vector<PageId> path;     // pinned nodes, root first
  std::vector<PageId> writing;  // allocated pages in block order
  std::vector<BlockKey> keys;   // keys of those blocks
  // Full blocks of the prompt (bounds Commit's priorities).
  uint32_t total_blocks = 0;
  // Retention priorities of its blocks (Acquire's and Commit's), applied
  // when it ends (Impl::ApplyPriorities).
  std::vector<PriorityRange> priorities;
  // Prefix pins: when PinPrefix made it, and the prompt's full blocks.
  absl::Time created;
  uint32_t pin_blocks = 0;
};

struct Namespace {
  NamespaceSpec spec;
  BlockKey root;
  uint64_t cached_blocks = 0;
  PageId hot_root = kNoPage;  // Node::hot_child for the first block
  uint32_t account = 0;
  uint32_t leases = 0;  // live and fenced leases in it
  // false once forgotten (ForgetEmptyNamespaces): the id is on
  // Impl::free_namespaces, and no node, lease or request refers to it.
  bool live = true;
};

// One account's limits and pages (AccountLimits, AccountStats).
struct Account {
  AccountLimits limits;
  uint64_t cached = 0;
  uint64_t writing = 0;
  uint64_t held = 0;  // pages its leases hold (Lease::held)
  uint64_t namespaces = 0;
  uint64_t evicted = 0;
  uint64_t limited = 0;
  uint64_t pins = 0;       // its prefix pins
  uint64_t pin_pages = 0;  // pages they hold (Lease::held of each)
  // Priority classes other than the default whose lists may hold nodes
  // (bit c: class c); a clear bit means an empty list.
  uint64_t class_bits[2] = {0, 0};
};

// A token-mode prompt's keys, found before the tree's exclusive lock is
// taken (Impl::ResolveTokens). The spans view this thread's scratch vectors
// and stay valid until the thread's next ResolveTokens.
struct ResolvedPrompt {
  absl::Span<const BlockKey> keys;
  absl::Span<const uint32_t> tokens;  // keys.size() * page_size tokens
  absl::Span<const PageId> known_pages;  // the walk's pages for keys' head
  uint64_t known_epoch = 0;          // eviction_epoch at the walk
  uint32_t total_blocks = 0;         // full blocks of the whole prompt
  uint32_t walked_blocks = 0;        // keys found by the walk
  // keys are the chain of `tokens` from the namespace root (token mode):
  // blocks committed from the lease can be walked later.
  bool chain_keys = false;
};

}  // namespace radix_internal

struct RadixTree::Impl {
  using Node = radix_internal::Node;
  using Lease = radix_internal::Lease;
  using Namespace = radix_internal::Namespace;
  using KeyIndex = radix_internal::KeyIndex;

  explicit Impl(const RadixTreeOptions& o);
  // Allocates the node, link and key-index storage and puts every page on
  // the free list. RESOURCE_EXHAUSTED when memory runs out. Called once, by
  // RadixTree::Create, before the tree is shared.
  absl::Status Init();

  // --- helpers; all REQUIRE mu held -------------------------------------
  uint32_t NowSeconds() const {
    return static_cast<uint32_t>(
        absl::ToInt64Seconds(absl::Now() - epoch));
  }
  double AgeSeconds(const Node& n) const {
    const uint32_t now = NowSeconds();
    return now >= n.last_used ? static_cast<double>(now - n.last_used) : 0.0;
  }
  const uint32_t* TokensOf(PageId p) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return token_arena.get() + size_t{p} * arena_page_size;
  }
  uint32_t* MutableTokensOf(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return token_arena.get() + size_t{p} * arena_page_size;
  }
  absl::Status ValidateRequest(const char* op, NamespaceId ns,
                               absl::Span<const BlockKey> keys,
                               absl::Span<const uint32_t> tokens) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Whether `n` is a cached, chain-keyed child of `parent` in `ns`: one whose
  // key follows from its parent's key and its stored tokens.
  static bool IsChainChild(const Node& n, NamespaceId ns, PageId parent) {
    return n.state == PageState::kCached && n.chain_keyed && n.ns == ns &&
           n.parent == parent;
  }
  // The token walk: from `*next` (a hot-child hint below `*parent`, or
  // kNoPage), follows hot children while each is the cached, chain-keyed
  // child of the one before holding exactly the next block of `tokens` (so
  // its key is the block's chain key and no hashing is needed), at most
  // max_blocks. Calls visit(page, node) for each block walked; leaves
  // *parent at the last page walked and *next at its hot child (or at the
  // hint that failed). Returns the number of blocks walked.
  // kBytes: the block size in bytes if known at compile time, else 0 (see
  // SameBlock). Apart from `visit`, nothing in the loop calls out of line.
  template <size_t kBytes, bool kWide, typename Visit>
  ABSL_ATTRIBUTE_ALWAYS_INLINE size_t WalkHot(NamespaceId ns,
                                              const uint32_t* tokens,
                                              size_t max_blocks,
                                              PageId* parent, PageId* next,
                                              Visit visit) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    const Node* const node = nodes.get();
    const uint32_t* const arena = token_arena.get();
    const size_t stride = arena_page_size;  // == page_size of every ns
    const size_t block_bytes = stride * sizeof(uint32_t);
    PageId up = *parent;
    PageId p = *next;
    size_t k = 0;
    for (; k < max_blocks && p != kNoPage; ++k, tokens += stride) {
      const Node& n = node[p];
      if (!IsChainChild(n, ns, up) ||
          !radix_internal::SameBlock<kBytes, kWide>(
              arena + size_t{p} * stride, tokens, block_bytes)) {
        break;
      }
      visit(p, n);
      up = p;
      p = n.hot_child;
    }
    *parent = up;
    *next = p;
    return k;
  }
  // Finds the keys of a token-mode prompt (see the file comment): the walk
  // under the shared lock, then hashing with no lock held; with
  // stop_at_missing, hashing ends after the first block no cached node has
  // (enough for a lookup, not for allocating). INVALID_ARGUMENT for an
  // unknown ns. REQUIRES: mu not held.
  absl::StatusOr<radix_internal::ResolvedPrompt> ResolveTokens(
      NamespaceId ns, absl::Span<const uint32_t> tokens,
      bool stop_at_missing) const ABSL_LOCKS_EXCLUDED(mu);
  // The token walk from the namespace root under the caller's lock: appends
  // the keys (and pages, if not null) of the leading blocks it vouches for;
  // returns how many. REQUIRES: ns is registered.
  size_t WalkTokens(NamespaceId ns, absl::Span<const uint32_t> tokens,
                    std::vector<BlockKey>* keys,
                    std::vector<PageId>* pages) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  template <size_t kBytes, bool kWide>
  ABSL_ATTRIBUTE_ALWAYS_INLINE size_t WalkTokensFor(
      NamespaceId ns, absl::Span<const uint32_t> tokens,
      std::vector<BlockKey>* keys, std::vector<PageId>* pages) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Token-mode Match under the caller's lock: the walk, hashing only the
  // blocks where it stops (branch points and the end of the match).
  // REQUIRES: ns is registered.
  MatchResult MatchTokensLocked(NamespaceId ns,
                                absl::Span<const uint32_t> tokens) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  template <size_t kBytes, bool kWide>
  ABSL_ATTRIBUTE_ALWAYS_INLINE MatchResult MatchTokensFor(
      NamespaceId ns, absl::Span<const uint32_t> tokens) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Whether the walks over blocks of `block_bytes` take their AVX2 copies:
  // wide_walk is set and the block is 64 or 128 bytes (page_size 16, 32).
  bool UsesWideWalk(size_t block_bytes) const {
    return wide_walk && (block_bytes == 64 || block_bytes == 128);
  }
  // The walks for 64- and 128-byte blocks compiled for AVX2; call only when
  // UsesWideWalk.
  template <size_t kBytes>
  RADIXKV_TARGET_AVX2 size_t WalkTokensWide(NamespaceId ns,
                                            absl::Span<const uint32_t> tokens,
                                            std::vector<BlockKey>* keys,
                                            std::vector<PageId>* pages) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  template <size_t kBytes>
  RADIXKV_TARGET_AVX2 MatchResult MatchTokensWide(
      NamespaceId ns, absl::Span<const uint32_t> tokens) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // How many of `known` (ResolvedPrompt::known_pages, walked at
  // `known_epoch`) still hold keys' leading blocks; appends them to *out (if
  // not null) and leaves *parent at the last.
  size_t KnownPrefix(NamespaceId ns, absl::Span<const BlockKey> keys,
                     absl::Span<const PageId> known, uint64_t known_epoch,
                     PageId* parent, std::vector<PageId>* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Walks keys from the root; returns how many match (verified), appending
  // their pages to *out (if not null) and counting a rejected hit in
  // *collisions. `known`, `known_epoch`: ResolvedPrompt's.
  size_t MatchPath(NamespaceId ns, absl::Span<const BlockKey> keys,
                 absl::Span<const uint32_t> tokens,
                 absl::Span<const PageId> known, uint64_t known_epoch,
                 std::vector<PageId>* out,
                 uint32_t* collisions) const ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Whether the cached node at `p` is block `i` of this request.
  bool Verifies(PageId p, NamespaceId ns, PageId parent,
                absl::Span<const uint32_t> block_tokens) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    const Node& n = nodes[p];
    if (n.ns != ns || n.parent != parent) return false;
    if (block_tokens.empty() || !n.has_tokens) return true;  // unverifiable
    return std::memcmp(TokensOf(p), block_tokens.data(),
                       block_tokens.size() * sizeof(uint32_t)) == 0;
  }

  void LruRemove(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    radix_internal::Link& l = links[p];
    assert(l.prev != kNoPage && l.next != kNoPage &&
           "LruRemove: page is not on the recency list");
    links[l.prev].next = l.next;
    links[l.next].prev = l.prev;
    l.prev = l.next = kNoPage;
  }
  // The sentinel of the recency list of `ns`'s account.
  PageId SentinelOf(NamespaceId ns) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return sentinel + namespaces[ns].account;
  }
  radix_internal::Account& AccountOf(NamespaceId ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return accounts[namespaces[ns].account];
  }
  // Appends `p` to the recency list headed by `head` (SentinelOf its ns).
  void LruAppend(PageId p, PageId head) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    radix_internal::Link& s = links[head];
    radix_internal::Link& l = links[p];
    assert(l.prev == kNoPage && l.next == kNoPage &&
           "LruAppend: page is already on a list");
    l.prev = s.prev;
    l.next = head;
    links[s.prev].next = p;
    s.prev = p;
  }
  // Pin and Unpin run once per block of every Acquire and lease end, and
  // GCC does not inline them on its own.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Pin(PageId p, uint32_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Node& n = nodes[p];
    assert(n.state == PageState::kCached && "Pin: page is not cached");
    if (n.refs++ == 0) {
      assert(links[p].prev != kNoPage && "Pin: unpinned node off the list");
      LruRemove(p);
      ++pinned_count;
      probation_count -= n.probation;
    }
    n.probation = false;  // matched: it goes to the recency list
    n.last_used = now;
  }
  // `head`: SentinelOf(p's namespace), which the caller computes once for
  // a lease's whole path. A probation node goes on its account's probation
  // stack right after *prob_at (which then names it): a lease's path is
  // unpinned deepest first and *prob_at starts at the stack's sentinel, so
  // the deepest lands on top and each node above its parent.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Unpin(PageId p, uint32_t now, PageId head,
                                          PageId* prob_at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Node& n = nodes[p];
    assert(n.state == PageState::kCached && n.refs > 0 &&
           "Unpin: page is not pinned");
    n.last_used = now;
    if (--n.refs == 0) {
      assert(pinned_count > 0);
      --pinned_count;
      if (ABSL_PREDICT_FALSE(prio != nullptr) && ListClassed(p, now)) return;
      if (n.probation) {
        LinkAfter(p, *prob_at);
        *prob_at = p;
        ++probation_count;
      } else {
        LruAppend(p, head);
      }
    }
  }
  // Links `p` into a list right after `at` (a sentinel or a listed node).
  void LinkAfter(PageId p, PageId at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    radix_internal::Link& a = links[at];
    radix_internal::Link& l = links[p];
    assert(l.prev == kNoPage && l.next == kNoPage &&
           "LinkAfter: page is already on a list");
    l.prev = at;
    l.next = a.next;
    links[a.next].prev = p;
    a.next = p;
  }
  // The sentinel of the probation stack of `ns`'s account.
  PageId ProbationSentinelOf(NamespaceId ns) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return probation_sentinel + namespaces[ns].account;
  }
  // The list account `a`'s next victim comes from: its probation stack
  // (top first) while that holds a node, else its recency list; either
  // may be empty.
  PageId AccountVictimList(uint32_t a) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    if (ABSL_PREDICT_FALSE(prio != nullptr)) return ClassedVictimList(a);
    const PageId prob = probation_sentinel + a;
    return links[prob].next != prob ? prob : sentinel + a;
  }
  // --- Retention priorities (radix_tree_priority.cc). The side arrays
  // prio / prio_expires exist from the first priority other than the
  // default on; until then none of these runs.
  // The head of class c's list of account a (c != kDefaultPriority).
  PageId ClassHead(uint32_t a, uint32_t c) const {
    return class_sentinel + a * (kMaxPriority + 1) + c;
  }
  radix_internal::Priority StoredPriority(PageId p) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return {prio[p], prio_expires[p]};
  }
  // Page p's priority now; an expired one is reset to the default first.
  // REQUIRES: p is pinned (not on a list) or its class does not change.
  radix_internal::Priority EvalPriority(PageId p, uint32_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Unpin's step for an unpinned node: onto its class's list when its
  // priority now is not the default (true), else false (the default lists).
  bool ListClassed(PageId p, uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // AccountVictimList with priorities: the account's lowest non-empty
  // class; the default class is its probation stack, then recency list.
  PageId ClassedVictimList(uint32_t a) const ABSL_SHARED_LOCKS_REQUIRED(mu);
  // INVALID_ARGUMENT naming `what`[i] for a range out of bounds.
  static absl::Status CheckPriorities(const char* what,
                                      absl::Span<const BlockPriority> ranges,
                                      uint32_t total_blocks);
  // Allocates the side arrays (every page at the default) when `ranges`
  // name a priority other than the default and they do not exist yet;
  // RESOURCE_EXHAUSTED when out of memory.
  absl::Status EnablePriorities(absl::Span<const BlockPriority> ranges)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Adds checked ranges to the lease. REQUIRES: EnablePriorities(ranges).
  void AddPriorities(Lease& lease, absl::Span<const BlockPriority> ranges,
                     uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // EndLease's step before unpinning: every node of the path takes the
  // combination of its priority, the lease's for its block (default when
  // none) and its child's on the path, so a parent's priority is never
  // below a child's at any time.
  void ApplyPriorities(const Lease& lease, uint32_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Moves the unpinned nodes whose priority expired by `now` to the
  // default recency list: those above the default at its newest end
  // (deepest first), those below at its oldest end (deepest last), so
  // each stays nearer the head than its parent. Run before eviction picks
  // a victim.
  void DecayExpired(uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void DecayIfDue(uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (ABSL_PREDICT_FALSE(prio != nullptr) && !expiry_heap.empty() &&
        expiry_heap.front().first <= now) {
      DecayExpired(now);
    }
  }
  absl::Status CheckPriorityLists(std::vector<uint32_t>& pos,
                                  std::vector<uint32_t>& list,
                                  uint32_t* rank) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);

  PageId PopFree() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void PushFree(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The sentinel of the recency list the next victim comes from when the
  // pool is full (AccountLimits has the rule: the account with the most
  // cached pages per unit of weight among those with an unpinned leaf), or
  // kNoPage when no list has one. An account at its own max_pages evicts
  // from its own list instead (AcquireLocked).
  PageId VictimList() const ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Evicts the first node of the list headed by `head` (a recency list's
  // oldest, a probation stack's top: an unpinned leaf either way); false
  // when the list is empty.
  // Describes the victim in *out when `out` is not null.
  bool EvictFrom(PageId head, EvictedBlock* out = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // EvictFrom's body. kPlainLru: `head` is the only recency list of a
  // one-account tree with neither priorities nor a probation stack (no
  // classes to clear, the account is accounts[0]).
  template <bool kPlainLru>
  bool EvictFromList(PageId head, EvictedBlock* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Evicts the oldest unpinned leaf of VictimList(); false when there is
  // none.
  bool EvictOne(EvictedBlock* out = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const PageId head = VictimList();
    return head != kNoPage && EvictFrom(head, out);
  }
  // Evicts up to `max` unpinned leaves (a batch, VictimList() for each);
  // returns how many.
  uint64_t EvictMany(uint64_t max) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RememberEviction(const BlockKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Whether `ns` names a registered namespace that was not forgotten.
  bool LiveNamespace(NamespaceId ns) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return ns < namespaces.size() && namespaces[ns].live;
  }
  BlockKey ParentKey(const Node& n) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return n.parent == kNoPage ? namespaces[n.ns].root : nodes[n.parent].key;
  }
  void EndLease(Lease& lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // PinLimit(account) under the caller's lock.
  uint64_t PinLimitLocked(uint32_t account) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // The PinInfo of the pin `id` (a prefix_pin lease).
  PinInfo PinInfoOf(LeaseId id, const Lease& lease) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  using LeaseMap = absl::flat_hash_map<LeaseId, Lease>;
  // The ids of `owner`'s leases (none for kNoOwner): all, or only the
  // unfenced or fenced ones.
  enum class OwnerLeases { kAll, kUnfenced, kFenced };
  std::vector<LeaseId> LeasesOf(OwnerId owner, OwnerLeases which) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Fences the lease at `it` (fence_unended_leases), else erases it.
  void FenceOrEraseLease(LeaseMap::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Ends the lease at `it` and forgets it (the owner's count included).
  void EraseLease(LeaseMap::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The live lease `id` of `owner`. NOT_FOUND (Refusal::kLeaseUnknown) when
  // there is none; an expired one is ended first (and counted) and reads as
  // NOT_FOUND too (kLeaseExpired).
  absl::StatusOr<LeaseMap::iterator> FindLease(LeaseId id, OwnerId owner,
                                               absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Checks AcquireRequest::end_leases, max_owner_leases and
  // max_owner_pages; changes nothing. Every refusal is typed (refusal.h).
  absl::Status CheckEndLeases(const AcquireRequest& req, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // The pages the leases of req.ns's account hold, those in req.end_leases
  // counted as ended. REQUIRES: req.end_leases checked (CheckEndLeases).
  uint64_t AccountHeldAfterEnds(const AcquireRequest& req) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Checks the pages the account of req.ns holds against its
  // max_pinned_pages (end_leases counted as ended); RESOURCE_EXHAUSTED
  // (Refusal::kAccountPinLimit), counted as a limited Acquire, when no page
  // fits.
  absl::Status CheckAccountPins(const AcquireRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Acquire given the prompt's keys: takes the lock, checks, then
  // AcquireLocked.
  absl::StatusOr<AcquireResult> AcquireResolved(
      const AcquireRequest& req, const radix_internal::ResolvedPrompt& prompt)
      ABSL_LOCKS_EXCLUDED(mu);
  // Acquire's locked step, given the prompt's keys.
  AcquireResult AcquireLocked(const AcquireRequest& req,
                              const radix_internal::ResolvedPrompt& prompt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Stores a committed block in the WRITING page `w` as a new cached node.
  void InsertNode(Lease& lease, PageId w, const BlockKey& key, PageId parent,
                  uint32_t depth, uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The cached node with `key`, trying the hot child of `parent` (kNoPage:
  // ns's root) before the key index: along a chain the hint is right and
  // costs one load instead of a hash-set probe. Keys are unique among
  // cached nodes, so a hinted node with this key is the index's answer.
  // kNoPage when no cached node has the key.
  // Always inlined: it runs once per block of every key lookup, and GCC
  // stops inlining it on its own once it has several callers.
  ABSL_ATTRIBUTE_ALWAYS_INLINE PageId FindByKey(NamespaceId ns, PageId parent,
                                                const BlockKey& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    const PageId hint =
        parent == kNoPage ? namespaces[ns].hot_root : nodes[parent].hot_child;
    if (hint != kNoPage && nodes[hint].state == PageState::kCached &&
        nodes[hint].key == key) {
      return hint;
    }
    auto it = index.find(key);
    return it == index.end() ? kNoPage : *it;
  }
  // Records `child` as the hot child of `parent` (kNoPage: of ns's root).
  void SetHotChild(NamespaceId ns, PageId parent, PageId child)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    (parent == kNoPage ? namespaces[ns].hot_root : nodes[parent].hot_child) =
        child;
  }
  void FlushEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // CheckInvariants under the caller's lock, in three parts: the nodes
  // (states, counters, key index, parents, child and namespace counts), the
  // free and recency lists, and the leases (pins, WRITING pages, owners).
  struct PageCounts {
    uint64_t free = 0, writing = 0, cached = 0, pinned = 0;
  };
  absl::Status CheckLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu);
  absl::Status CheckNodes(PageCounts* counts) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  absl::Status CheckLists(const PageCounts& counts) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  absl::Status CheckLeases(uint64_t writing_pages) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);

  const uint32_t capacity;
  const uint32_t max_page_size;
  const size_t eager_token_arena_bytes;
  const uint32_t remembered_evictions;
  // The token walks use their AVX2 copies (RadixTreeOptions::vector_walk
  // and the CPU has AVX2).
  const bool wide_walk;
  const bool fence;  // RadixTreeOptions::fence_unended_leases
  EventListener* const listener;
  const absl::Time epoch;
  const PageId sentinel;  // == capacity: account 0's list head
  const uint32_t num_accounts;  // RadixTreeOptions::accounts == accounts.size()
  // == capacity + num_accounts: account 0's probation stack head.
  const PageId probation_sentinel;
  // == capacity + 2 num_accounts: the heads of the priority classes' lists
  // (ClassHead), kMaxPriority + 1 per account (the default's unused).
  const PageId class_sentinel;

  mutable SharedMutex mu;
  // mu protects the following state.
  // capacity + 2 accounts.size() nodes (the last ones are the sentinels');
  // never reallocated, so the key index may hold a pointer to it.
  std::unique_ptr<Node[], radix_internal::LargeDeleter> nodes
      ABSL_GUARDED_BY(mu);
  // capacity + (2 + kMaxPriority + 1) accounts.size() links;
  // links[sentinel + a] heads account a's recency list,
  // links[probation_sentinel + a] its probation stack, links[ClassHead(a,
  // c)] its list of priority class c.
  std::unique_ptr<radix_internal::Link[], radix_internal::LargeDeleter> links
      ABSL_GUARDED_BY(mu);
  KeyIndex index ABSL_GUARDED_BY(mu);
  std::unique_ptr<uint32_t[], radix_internal::LargeDeleter> token_arena
      ABSL_GUARDED_BY(mu);
  uint32_t arena_page_size ABSL_GUARDED_BY(mu) = 0;  // 0: no arena yet
  PageId free_head ABSL_GUARDED_BY(mu) = kNoPage;
  uint64_t free_count ABSL_GUARDED_BY(mu) = 0;
  uint64_t writing_count ABSL_GUARDED_BY(mu) = 0;
  uint64_t cached_count ABSL_GUARDED_BY(mu) = 0;
  uint64_t pinned_count ABSL_GUARDED_BY(mu) = 0;
  uint64_t probation_count ABSL_GUARDED_BY(mu) = 0;  // on probation stacks
  // Bumped by every eviction, the only way a cached node leaves the tree or
  // changes key, parent, tokens or namespace. A token walk's pages are still
  // valid while it is unchanged (AcquireRequest::known_epoch). Starts at 1:
  // 0 means "not walked".
  uint64_t eviction_epoch ABSL_GUARDED_BY(mu) = 1;
  // Indexed by NamespaceId; forgotten entries stay (live == false) and
  // their ids wait on free_namespaces for reuse.
  std::vector<Namespace> namespaces ABSL_GUARDED_BY(mu);
  std::vector<NamespaceId> free_namespaces ABSL_GUARDED_BY(mu);
  // RadixTreeOptions::accounts entries; never resized.
  std::vector<radix_internal::Account> accounts ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<BlockKey, NamespaceId> ns_by_root ABSL_GUARDED_BY(mu);
  LeaseMap leases ABSL_GUARDED_BY(mu);
  // Leases (fenced included) and the pages they hold, per owner (kNoOwner
  // is not counted).
  struct OwnerCount {
    uint32_t leases = 0;
    uint64_t pages = 0;
  };
  absl::flat_hash_map<OwnerId, OwnerCount> owner_leases ABSL_GUARDED_BY(mu);
  uint64_t fenced_leases ABSL_GUARDED_BY(mu) = 0;
  uint64_t fenced_pages ABSL_GUARDED_BY(mu) = 0;
  LeaseId next_lease ABSL_GUARDED_BY(mu) = 1;
  // Leases whose new pages are held (AcquireRequest::hold_new_pages) until
  // ReleaseHold, and the pages their end left WRITING meanwhile, with the
  // account those count against.
  struct HeldPages {
    uint32_t account = 0;
    std::vector<PageId> pages;
  };
  absl::flat_hash_map<LeaseId, HeldPages> held ABSL_GUARDED_BY(mu);
  // The last `remembered_evictions` evicted keys, a ring overwritten at
  // evicted_next. Eviction only stores a key; Explain (rare) hashes the ring.
  std::vector<BlockKey> evicted_ring ABSL_GUARDED_BY(mu);
  size_t evicted_next ABSL_GUARDED_BY(mu) = 0;
  std::vector<TreeEvent> pending_events ABSL_GUARDED_BY(mu);
  // The turn_duel policy's state (null for lru: no probation stack is
  // ever used).
  std::unique_ptr<radix_internal::TurnDuel> turn_duel ABSL_GUARDED_BY(mu);
  // Retention priorities, per page (Priority): null until the first
  // priority other than the default. A cached node's class is prio[p];
  // unpinned, it is on ClassHead(account, prio[p])'s list, or on the
  // default lists for kDefaultPriority. Along every path a child's
  // Priority is at no time above its parent's.
  std::unique_ptr<uint8_t[]> prio ABSL_GUARDED_BY(mu);
  std::unique_ptr<uint32_t[]> prio_expires ABSL_GUARDED_BY(mu);
  // (expires, page) of the priorities set with an expiry, a min-heap; an
  // entry whose page no longer has that priority is stale and skipped.
  std::vector<std::pair<uint32_t, PageId>> expiry_heap ABSL_GUARDED_BY(mu);
  TreeStats stats ABSL_GUARDED_BY(mu);  // counters only; gauges computed
  // Match runs under a shared lock, so its counters are atomic.
  mutable std::atomic<uint64_t> matches{0};
  mutable std::atomic<uint64_t> walked_blocks{0};  // TreeStats::walked_blocks
  mutable std::atomic<uint64_t> hashed_blocks{0};  // TreeStats::hashed_blocks
};

}  // namespace radixkv

#endif  // RADIXKV_RADIX_RADIX_TREE_INTERNAL_H_
