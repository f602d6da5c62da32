// File: radix/radix_tree.h
//
// RadixTree: the prefix index of radixkv. It maps chained block keys
// (block_key.h) to page ids of a fixed-capacity pool, does the pool's page
// accounting (FREE -> WRITING -> CACHED -> FREE), keeps the lease records
// (who pins what, until when) and evicts least-recently-used unpinned leaves
// when it needs room.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<RadixTree> tree,
//                    RadixTree::Create({.capacity_pages = 1 << 20}));
//   ASSIGN_OR_RETURN(NamespaceId ns, tree->RegisterNamespace(spec));
//   ASSIGN_OR_RETURN(AcquireResult a,
//                    tree->Acquire({.ns = ns, .tokens = prompt,
//                                   .allocate = true, .owner = session}));
//   ... write K/V of the new blocks into a.pages[a.matched_blocks...] ...
//   RETURN_IF_ERROR(tree->Commit(a.lease, a.new_blocks, /*release=*/true,
//                                session).status());
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
// Leases
// ------
// A lease is the one record of a request's hold on the tree: the pages it
// pins and owns, its owner and its expiry. Its owner ends it (Commit with
// release, Release, ReleaseOwner) or its expiry does (ReleaseExpired, or the
// first Commit/Release after it). An id that is not a live lease of the
// caller's owner reads as NOT_FOUND, so a foreign or stale id reveals
// nothing and changes nothing.
//
// Thread safety: thread-safe; one internal reader/writer mutex guards all
// state. Token-mode prompts are hashed with no lock held. The EventListener
// is called with that mutex held (see below).
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
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "radix/block_key.h"
#include "radix/eviction_policy.h"
#include "radix/refusal.h"

namespace radixkv {

using PageId = uint32_t;
using LeaseId = uint64_t;
using NamespaceId = uint32_t;

inline constexpr PageId kNoPage = 0xffffffffu;
// Most namespaces one tree holds.
inline constexpr uint32_t kMaxNamespaces = 0xffff;
// Blocks an admin eviction (Evict, Clear) removes per hold of the tree's
// lock, so that lookups and inserts go on between batches instead of
// waiting for a whole Clear.
inline constexpr uint64_t kAdminEvictionBatch = 1024;

enum class PageState : uint8_t { kFree = 0, kWriting = 1, kCached = 2 };

// A change to the set of cached blocks, as WatchEvents reports it.
struct TreeEvent {
  enum class Type : uint8_t { kStored, kRemoved, kCleared };
  Type type = Type::kStored;
  NamespaceId ns = 0;
  // kStored / kRemoved: the namespace's root key. Namespace ids are reused
  // once ForgetEmptyNamespaces has let one go; the root never is.
  BlockKey root;
  BlockKey key;         // kStored / kRemoved
  BlockKey parent_key;  // kStored: the parent's key (the namespace root for a first block)
  PageId page = kNoPage;
  uint32_t depth = 0;   // kStored: block index in its prompt (0 = first block)
  // kStored: the block's page_size and its block_size token ids, which the
  // tree stores for every block committed with tokens (null for a key-mode
  // block committed without). The ids point into the tree's own storage:
  // valid only during OnTreeEvents; a listener that keeps them copies them.
  uint32_t block_size = 0;
  const uint32_t* tokens = nullptr;
  // kCleared: cached blocks left after the Clear (pinned, or stored while
  // it ran); 0 when the tree is empty.
  uint64_t remaining = 0;
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
  // Pages in the pool; page ids are 0 .. capacity_pages-1. Must be > 0 and
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
  // Compare token blocks with AVX2 in the token walks (token-mode Match and
  // Acquire) where the CPU has it and a block is 64 or 128 bytes
  // (page_size 16 or 32). false: the portable walk everywhere. Same
  // results either way.
  bool vector_walk = true;
  // Fencing: a lease that expires (ReleaseExpired) or is ended for an owner
  // that went away (ReleaseOwner with fence) keeps its pages, pinned or
  // WRITING, until ReleaseFenced for its owner, or until the owner names it
  // in Commit, Release or end_leases (which acknowledges it). Its pages are
  // thus never handed to another writer while the old one may still write
  // them. false: such leases end at once, as if released.
  bool fence_unended_leases = false;
  // Accounts sharing the pool (radixkvd: one per tenant), 1 ..
  // kMaxAccounts. Each namespace belongs to one (RegisterNamespace).
  // Eviction is fair between them: see AccountLimits.
  uint32_t accounts = 1;
  // Which unpinned leaf goes first within an account (eviction_policy.h).
  // kLru is the order described above, exactly.
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  // Blocks the tiers below the pool hold in all, which the policy weighs
  // when it decides which evicted blocks are worth demoting
  // (EvictedBlock::demote); 0: no tiers, or tiers of unknown size, and
  // every evicted block is demoted.
  uint64_t lower_tier_blocks = 0;
};

inline constexpr uint32_t kMaxAccounts = 4096;

// What an account may hold (RadixTree::SetAccountLimits). Eviction is fair
// between accounts: a page needed by an account at its max_pages comes
// from that account's own least recently used leaf; otherwise, when no page
// is free, the victim is the least recently used unpinned leaf of the
// account whose cached pages per unit of weight are the most (ties: the
// lowest account). So one account's churn cannot push another below its
// weighted share of the pool, and with one account eviction is plain LRU.
struct AccountLimits {
  // Most pages the account's namespaces may hold cached or WRITING (0: no
  // limit). Allocation beyond it evicts the account's own leaves, and gets
  // fewer pages when none of them is evictable.
  uint64_t max_pages = 0;
  // Most pages the account's leases may hold at once (pinned path and
  // WRITING pages; 0: no limit). Acquire gets a shorter prefix and fewer
  // new pages to fit, and RESOURCE_EXHAUSTED when none fits.
  uint64_t max_pinned_pages = 0;
  // The account's share of the pool relative to the others' (>= 1).
  uint32_t weight = 1;
  // Most pages the account's prefix pins (RadixTree::PinPrefix) may hold
  // together (0: no limit of its own). Pins never exceed the account's
  // weighted share of the pool either, whatever this says.
  uint64_t max_pin_pages = 0;
};

// An account's pages now and its counters since the tree was created.
struct AccountStats {
  uint64_t cached_pages = 0;
  uint64_t writing_pages = 0;
  uint64_t held_pages = 0;      // held by its leases (pinned + WRITING)
  uint64_t namespaces = 0;
  uint64_t evicted_pages = 0;   // its cached pages evicted
  uint64_t limited_acquires = 0;  // Acquires cut short by its limits
  uint64_t pins = 0;            // its prefix pins
  uint64_t pin_pages = 0;       // pages they hold (a page per pin that holds it)
};

// Who holds a lease: an opaque id the caller chooses (radixkvd: one per
// session). kNoOwner is the owner of leases taken without one; such leases
// are ended the same way, with kNoOwner.
using OwnerId = uint64_t;
inline constexpr OwnerId kNoOwner = 0;
// The owner of prefix pins (PinPrefix); reserved: no caller may name it in
// Acquire, and an owner's calls never find a pin.
inline constexpr OwnerId kPinOwner = ~OwnerId{0};

// A prefix pin (PinPrefix): the cached leading blocks of a prompt, held in
// the pool with no owner and no expiry until Unpin. Its id is a lease id.
using PinId = LeaseId;

struct PinInfo {
  PinId id = 0;
  NamespaceId ns = 0;
  uint32_t account = 0;
  uint32_t total_blocks = 0;   // full blocks of the prompt pinned
  uint32_t pinned_blocks = 0;  // its leading blocks the pin holds
  BlockKey last_key;           // the last pinned block's key
  absl::Time created;
};

// Retention priorities (AcquireRequest::priorities, Commit). A block's
// priority orders eviction inside its account: an account's unpinned
// leaves of the lowest priority go first, and inside one priority the
// eviction policy's order applies. Accounts are chosen as before
// (AccountLimits), so no priority moves another account's pages.
inline constexpr uint32_t kDefaultPriority = 35;
inline constexpr uint32_t kMaxPriority = 100;
// Longest duration a priority may carry before it decays to the default.
inline constexpr absl::Duration kMaxPriorityDuration = absl::Hours(24 * 30);
// Most ranges one Acquire or Commit may carry.
inline constexpr size_t kMaxPriorityRanges = 64;

// Priority `priority` (0 .. kMaxPriority) for the prompt's blocks
// first_block .. first_block + blocks - 1 (block 0: the prompt's first
// block), for `duration` (rounded up to whole seconds; <= 0 or
// InfiniteDuration: until the block leaves the tree), after which it
// decays to kDefaultPriority. A lease's ranges apply when it ends, to the
// blocks its path then holds; every block of a lease's path not in a range
// gets kDefaultPriority. A block keeps the highest priority any lease gave
// it (a priority above the default until the latest of their expiries, one
// below it until the earliest), and a block's prefix keeps at least the
// priority of the blocks below it: a block cannot leave the tree before
// the blocks it is the prefix of.
struct BlockPriority {
  uint32_t first_block = 0;
  uint32_t blocks = 0;
  uint32_t priority = kDefaultPriority;
  absl::Duration duration = absl::InfiniteDuration();
};

struct AcquireRequest {
  NamespaceId ns = 0;
  // The prompt, in one of two forms:
  //  * Token mode: `tokens` alone (keys empty). The tree computes the block
  //    keys itself (contract v1, ComputeBlockKeys from the namespace root;
  //    the leading blocks it already holds are found by comparing tokens
  //    instead of hashing), verifies every hit, and a partial last block is
  //    ignored. Blocks committed from a token-mode lease can later be
  //    matched from tokens alone without hashing.
  //  * Key mode: `keys`, one per full block, in order, with `tokens` either
  //    empty (hits cannot be verified) or exactly keys.size() * page_size
  //    tokens (hits are verified against the stored tokens).
  absl::Span<const BlockKey> keys;
  absl::Span<const uint32_t> tokens;
  // Allocate pages for unmatched full blocks.
  bool allocate = false;
  // With allocate: at most this many new pages (0 = one per unmatched block).
  uint32_t max_new_blocks = 0;
  // The lease's owner and expiry: Commit and Release must name the same
  // owner, and from `expires` on the lease is ended by the next
  // ReleaseExpired or by the first Commit/Release that finds it expired.
  OwnerId owner = kNoOwner;
  absl::Time expires = absl::InfiniteFuture();
  // Most leases `owner` may hold at once, this one included (0: no limit;
  // ignored for kNoOwner). RESOURCE_EXHAUSTED beyond it, after end_leases
  // are counted as ended.
  uint32_t max_owner_leases = 0;
  // Most pages `owner`'s leases may hold at once, this one's included (0:
  // no limit; ignored for kNoOwner). A lease gets a shorter matched prefix
  // and fewer new pages to fit; RESOURCE_EXHAUSTED when none fits.
  uint64_t max_owner_pages = 0;
  // Leases of `owner` to end in the same step, as Release would: after the
  // matched prefix is pinned and before any page is allocated, so pages both
  // hold stay pinned throughout (no trip through the recency list) and pages
  // they free can be allocated. Every one must be live, unexpired, held by
  // `owner` (expired or fenced ones included: ending them acknowledges
  // them) and listed once, else NOT_FOUND (Refusal::kEndLeaseUnknown) /
  // INVALID_ARGUMENT (kEndLeaseRepeated) naming it as end_leases[i], with
  // i as RefusalDetail::index, and nothing changes.
  absl::Span<const LeaseId> end_leases;
  // Fill AcquireResult::evicted and new_keys (for a caller that keeps
  // evicted blocks' bytes elsewhere).
  bool report_evictions = false;
  // The caller copies bytes into or out of the new pages before it
  // answers: until ReleaseHold(lease), a new page that the
  // lease's end would free (Release, expiry, its owner's end) stays
  // WRITING, owned by no lease, so that no other writer is handed it while
  // the copy runs.
  bool hold_new_pages = false;
  // Retention priorities for ranges of the prompt's blocks (BlockPriority),
  // applied when the lease ends. INVALID_ARGUMENT (nothing changed) for a
  // priority above kMaxPriority, a duration above kMaxPriorityDuration or a
  // range not within the prompt's full blocks, naming priorities[i].
  absl::Span<const BlockPriority> priorities;
};

// A cached block an Acquire evicted to make room (report_evictions). Its
// page is one of that Acquire's new pages, so its bytes stay in place
// until the lease's owner writes them: the caller may copy them out first.
struct EvictedBlock {
  PageId page = kNoPage;
  BlockKey key;
  BlockKey parent_key;  // the namespace root for a first block
  BlockKey root;
  NamespaceId ns = 0;
  // The eviction policy's word on keeping the block in a tier below the
  // pool: false when it judged the block not worth a tier's write (lru:
  // never; turn_duel: the block is on probation, i.e. its request was not
  // admitted and no request has matched it since, and its request was not
  // admitted either by the duel for a cache of the pool and the tiers
  // together, RadixTreeOptions::lower_tier_blocks).
  bool demote = true;
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
  // The namespace's account limits (AccountLimits) cut this lease short:
  // fewer matched or new pages than the prompt and pool allowed.
  bool account_limited = false;
  // With report_evictions: the blocks evicted for the new pages, and the
  // keys of the new blocks (new_keys[i] is block matched_blocks + i).
  std::vector<EvictedBlock> evicted;
  std::vector<BlockKey> new_keys;
};

struct CommitResult {
  uint32_t inserted = 0;      // blocks that became new cached nodes
  uint32_t deduplicated = 0;  // blocks already cached: the existing page won
  uint32_t collided = 0;      // key taken by different tokens; not cached
  // The canonical page of each block committed by this call, in block order
  // (the existing page for a deduplicated block).
  std::vector<PageId> pages;
  bool released = false;
  // With Commit's report_inserted: the keys of the inserted blocks.
  std::vector<BlockKey> inserted_keys;
  // ... and their pages, index for index.
  std::vector<PageId> inserted_pages;
};

// Read-only lookup result (Match).
struct MatchResult {
  uint32_t total_blocks = 0;
  uint32_t matched_blocks = 0;
  uint32_t collisions = 0;
  // Token mode: blocks found by comparing tokens along the tree (no
  // hashing) and blocks whose key was hashed.
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
  std::vector<uint32_t> tokens;  // DumpTreePage with_tokens: the block's ids
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
  uint64_t leases_expired = 0;     // ended (or fenced) by their expiry
  // Leases fenced (RadixTreeOptions::fence_unended_leases) and the pages
  // they hold.
  uint64_t fenced_leases = 0;
  uint64_t fenced_pages = 0;
  // Token-mode prompts (Acquire, Match): blocks whose key was found by
  // comparing tokens along the tree, and blocks whose key was hashed.
  uint64_t walked_blocks = 0;
  uint64_t hashed_blocks = 0;
  // The eviction policy (RadixTreeOptions::eviction_policy) and its state:
  // unpinned cached pages on the probation stacks, turn_duel's current
  // strength theta (0: as lru), how often it changed, and the Acquires
  // whose new blocks joined the recency list or the probation stack.
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  uint64_t probation_pages = 0;
  uint32_t eviction_theta = 0;
  uint64_t eviction_switches = 0;
  // turn_duel with tiers below the pool (lower_tier_blocks): the strength
  // that decides which probation blocks are demoted, and how often it
  // changed.
  uint32_t eviction_tier_theta = 0;
  uint64_t eviction_tier_switches = 0;
  uint64_t admitted_requests = 0;
  uint64_t probation_requests = 0;
  // Prefix pins (PinPrefix) and the pages they hold (a page held by two
  // pins counts twice); those pages are also in pinned_pages.
  uint64_t pins = 0;
  uint64_t pin_pages = 0;
};

class RadixTree {
 public:
  // Creates an empty tree: every page FREE. INVALID_ARGUMENT names the
  // option when capacity_pages is 0 or not below kNoPage, or max_page_size
  // is 0; RESOURCE_EXHAUSTED when the index's arrays cannot be allocated.
  static absl::StatusOr<std::unique_ptr<RadixTree>> Create(
      const RadixTreeOptions& options);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  // --- Namespaces ---------------------------------------------------------
  // Returns the id of `spec`'s namespace, registering it on first use (an
  // equal spec always gets the same id). INVALID_ARGUMENT names the field
  // when page_size is 0 or above max_page_size; FAILED_PRECONDITION when
  // page_size differs from the one the tree's token storage was sized for;
  // RESOURCE_EXHAUSTED once kMaxNamespaces are registered. The namespace
  // belongs to `account` (INVALID_ARGUMENT when not below
  // RadixTreeOptions::accounts); an equal spec registered again keeps its
  // first account (FAILED_PRECONDITION if another is named).
  absl::StatusOr<NamespaceId> RegisterNamespace(const NamespaceSpec& spec,
                                                uint32_t account = 0);
  // Forgets each namespace of `candidates` that holds nothing (no cached
  // block, no lease, fenced ones included) and returns their ids, which a
  // later RegisterNamespace may give to another spec. Unknown and already
  // forgotten ids are skipped. The caller guarantees that nothing still
  // uses a returned id (radixkvd: no session is bound to it, and id lookups
  // exclude this call); registering the same spec again gets a fresh id,
  // under which nothing is cached.
  std::vector<NamespaceId> ForgetEmptyNamespaces(
      absl::Span<const NamespaceId> candidates);

  // --- Accounts -----------------------------------------------------------
  // Sets an account's limits (see AccountLimits); later allocations and
  // evictions follow them, pages already held stay. INVALID_ARGUMENT for an
  // account not below RadixTreeOptions::accounts or a weight of 0.
  absl::Status SetAccountLimits(uint32_t account, const AccountLimits& limits);
  // REQUIRES: account < RadixTreeOptions::accounts.
  AccountStats GetAccountStats(uint32_t account) const;
  // The namespace's root key. REQUIRES: ns was returned by RegisterNamespace.
  BlockKey namespace_root(NamespaceId ns) const;
  uint32_t page_size(NamespaceId ns) const;
  std::vector<NamespaceInfo> ListNamespaces() const;

  // --- Lookup and leases --------------------------------------------------
  // Longest cached prefix of the prompt (token mode: `keys` empty; key mode:
  // `keys` with optional verifying `tokens`; see AcquireRequest). Changes
  // nothing, not even recency. INVALID_ARGUMENT for an unknown ns or, in key
  // mode, a tokens size that is not keys.size() * page_size.
  absl::StatusOr<MatchResult> Match(NamespaceId ns,
                                    absl::Span<const BlockKey> keys,
                                    absl::Span<const uint32_t> tokens) const;

  // Pins the longest cached prefix and, with allocate, takes pages for the
  // following unmatched blocks (evicting LRU leaves as needed; fewer pages
  // than asked when everything else is pinned). The returned lease (if any)
  // belongs to req.owner, who must end it with Commit(release=true) or
  // Release, or let it expire. Errors (nothing changed): INVALID_ARGUMENT as
  // for Match and for a bad end_leases list; NOT_FOUND for an end_leases
  // entry that is not a live lease of req.owner; RESOURCE_EXHAUSTED at
  // max_owner_leases (Refusal::kOwnerLeaseLimit), max_owner_pages
  // (kOwnerPageLimit) or the account's max_pinned_pages (kAccountPinLimit).
  // Every NOT_FOUND and RESOURCE_EXHAUSTED carries its Refusal (refusal.h).
  absl::StatusOr<AcquireResult> Acquire(const AcquireRequest& req);

  // --- Prefix pins ---------------------------------------------------------
  // Pins the longest cached prefix of the prompt (token or key mode, as for
  // Match) until Unpin: its blocks are never evicted meanwhile. A pin is a
  // lease of kPinOwner without expiry; its pages count against the
  // namespace's account as pin_pages (AccountStats), not against the
  // account's max_pinned_pages. Errors (nothing changed): INVALID_ARGUMENT
  // as for Match; FAILED_PRECONDITION when not even the first block is
  // cached (Refusal::kPinNothingCached, `limit` the prompt's blocks);
  // RESOURCE_EXHAUSTED when the account's pins would hold more than its
  // max_pin_pages (kPinQuota) or its weighted share of the pool
  // (kPinFairShare: capacity * weight / the sum of all accounts' weights),
  // with `held` the pages they would hold.
  absl::StatusOr<PinInfo> PinPrefix(NamespaceId ns,
                                    absl::Span<const BlockKey> keys,
                                    absl::Span<const uint32_t> tokens);
  // Ends pin `id`: its blocks become evictable unless something else pins
  // them. NOT_FOUND (Refusal::kPinUnknown) for an id that names no pin.
  absl::Status Unpin(PinId id);
  // The pin `id`; false when there is none.
  bool GetPin(PinId id, PinInfo* out) const;
  // Every pin, oldest first.
  std::vector<PinInfo> ListPins() const;
  // The most pages account `a`'s pins may hold together: the smaller of
  // its max_pin_pages (when set) and its weighted share of the pool.
  // REQUIRES: a < RadixTreeOptions::accounts.
  uint64_t PinLimit(uint32_t account) const;

  // Ends the hold an Acquire with hold_new_pages put on `lease`'s new
  // pages: those its end left WRITING are freed now. No-op for a lease
  // without a hold (or one already released).
  void ReleaseHold(LeaseId lease);

  // Commits the next `blocks` uncommitted new pages of `lease` in block
  // order; with release, then ends the lease. Errors (nothing changed):
  // NOT_FOUND when `lease` is not a live lease of `owner` (unknown, ended,
  // another owner's, or expired or fenced: such a lease is ended now, its
  // owner having acknowledged it by naming it; Refusal::kLeaseUnknown or
  // kLeaseExpired); FAILED_PRECONDITION when `blocks` exceeds the lease's
  // uncommitted pages (kCommitBeyondLease; the message gives both numbers).
  // Messages do not name a field: the caller prefixes its own.
  // With report_inserted, CommitResult::inserted_keys lists the keys of
  // the blocks this call inserted.
  // `priorities` (BlockPriority; block numbers count from the prompt's
  // first block) join the lease's own and apply when it ends;
  // INVALID_ARGUMENT for one out of range, as for Acquire (the lease's
  // prompt bounds the blocks), and nothing changes.
  absl::StatusOr<CommitResult> Commit(
      LeaseId lease, uint32_t blocks, bool release, OwnerId owner = kNoOwner,
      bool report_inserted = false,
      absl::Span<const BlockPriority> priorities = {});

  // Ends `lease`: unpins its path, frees its uncommitted and duplicate pages.
  // NOT_FOUND as for Commit.
  absl::Status Release(LeaseId lease, OwnerId owner = kNoOwner);

  // Ends every lease of `owner` (kNoOwner: none), fenced ones included;
  // returns how many. With `fence` (and fence_unended_leases), fences the
  // unfenced ones instead: the owner went away without ending them and may
  // still write their pages.
  uint64_t ReleaseOwner(OwnerId owner, bool fence = false);
  // Ends every lease whose expiry is at or before `now` (fences it, with
  // fence_unended_leases); returns how many.
  uint64_t ReleaseExpired(absl::Time now);
  // Ends the fenced leases of `owner`: it can no longer write their pages
  // (it exited, or acknowledged). Returns the pages they held.
  uint64_t ReleaseFenced(OwnerId owner);
  // Leases held by `owner`, fenced ones included.
  uint32_t owner_leases(OwnerId owner) const;
  // Pages held by `owner`'s leases (the max_owner_pages count).
  uint64_t owner_pages(OwnerId owner) const;

  // --- Administration and inspection --------------------------------------
  // Per-block explanation of the prompt's cache state. Key mode only
  // (`keys`, with optional verifying `tokens`); errors as for Match.
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
  // One page of a walk over every cached node, in page-id order: the nodes
  // on pages start, start+1, ... with depth <= max_depth, at most `limit`
  // of them, examining at most kDumpScanPages pages (so one call holds the
  // shared lock for a bounded time however sparse the tree is). *next is
  // the page to continue from; capacity when the walk is complete. Each
  // call sees one consistent state; nodes stored or evicted between calls
  // may be seen in either state. with_tokens also copies each block's
  // stored token ids (none for a key-mode block committed without them).
  std::vector<NodeInfo> DumpTreePage(uint32_t max_depth, PageId start,
                                     uint32_t limit, bool with_tokens,
                                     PageId* next) const;
  // Pages one DumpTreePage call examines at most.
  static constexpr uint32_t kDumpScanPages = 1u << 18;
  // Pages in the pool (capacity_pages).
  uint32_t capacity() const;
  // Whether a cached block has this key (in any namespace, at any depth).
  bool ContainsKey(const BlockKey& key) const;

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

  // Test hooks.
  PageState TEST_page_state(PageId page) const;
  uint32_t TEST_refcount(PageId page) const;
  // The token walk on its own: appends to *keys the keys of the leading run
  // of `tokens`' full blocks it can vouch for without hashing (and their
  // pages to *pages, if not null); returns how many. 0 for an unknown ns.
  size_t TEST_WalkTokens(NamespaceId ns, absl::Span<const uint32_t> tokens,
                         std::vector<BlockKey>* keys,
                         std::vector<PageId>* pages = nullptr) const;
  // The keys Acquire uses for a token-mode prompt, into *keys (cleared):
  // all of them, or with stop_at_missing (a lookup that allocates nothing)
  // up to and including the first block no cached node has. Returns how
  // many came from the walk. REQUIRES: ns is registered.
  size_t TEST_TokenKeys(NamespaceId ns, absl::Span<const uint32_t> tokens,
                        bool stop_at_missing,
                        std::vector<BlockKey>* keys) const;
  // The retention priority page `page` holds now (kDefaultPriority for one
  // that has none, or whose priority expired).
  uint32_t TEST_priority(PageId page) const;
  // The eviction epoch: changes whenever a cached block leaves the tree.
  uint64_t TEST_eviction_epoch() const;
  // Acquire and Match of a token-mode prompt whose keys are `req.keys`
  // (the chain keys of `req.tokens`) with the walk's result supplied by the
  // caller: `known` pages for the keys' head, walked at `known_epoch`
  // (0: re-check each page). They must give the answer of a plain lookup
  // whatever `known` holds.
  absl::StatusOr<AcquireResult> TEST_AcquireWalked(
      const AcquireRequest& req, absl::Span<const PageId> known,
      uint64_t known_epoch);
  uint32_t TEST_MatchWalked(NamespaceId ns, absl::Span<const BlockKey> keys,
                            absl::Span<const uint32_t> tokens,
                            absl::Span<const PageId> known,
                            uint64_t known_epoch) const;

 private:
  // All state lives in Impl (radix_tree_internal.h), guarded by Impl::mu.
  struct Impl;
  explicit RadixTree(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace radixkv

#endif  // RADIXKV_RADIX_RADIX_TREE_H_
