// File: radix/radix_tree_lease.cc
//
// RadixTree's lease operations: Acquire, Commit, Release and the ends of
// leases by owner and by expiry. A lease record (radix_tree_internal.h) is
// created only by AcquireLocked and forgotten only by EraseLease.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "radix/radix_tree.h"
#include "radix/radix_tree_internal.h"
#include "radix/refusal.h"
#include "base/status_macros.h"

namespace radixkv {

using radix_internal::Lease;
using radix_internal::Node;
using radix_internal::ResolvedPrompt;

void RadixTree::Impl::EndLease(Lease& lease) {
  const uint32_t now = NowSeconds();
  radix_internal::Account& account = AccountOf(lease.ns);
  for (PageId p : lease.writing) {
    if (nodes[p].state == PageState::kWriting) {
      assert(writing_count > 0 && account.writing > 0);
      --writing_count;
      --account.writing;
      PushFree(p);
    }
  }
  if (prio != nullptr) ApplyPriorities(lease, now);
  // Deepest first, so each node lands in the recency list after its
  // children, and on the probation stack below them.
  const PageId head = SentinelOf(lease.ns);
  PageId prob_at = ProbationSentinelOf(lease.ns);
  for (auto it = lease.path.rbegin(); it != lease.path.rend(); ++it) {
    Unpin(*it, now, head, &prob_at);
  }
}

void RadixTree::Impl::EraseLease(LeaseMap::iterator it) {
  Lease& lease = it->second;
  if (auto h = held.find(it->first); h != held.end()) {
    // A copy into or out of the new pages may still run: they stay
    // WRITING, counted against the account, until ReleaseHold.
    for (PageId p : lease.writing) {
      if (nodes[p].state == PageState::kWriting) h->second.pages.push_back(p);
    }
    lease.writing.clear();
  }
  EndLease(lease);
  if (lease.owner != kNoOwner) {
    auto o = owner_leases.find(lease.owner);
    assert(o != owner_leases.end() && o->second.leases > 0 &&
           o->second.pages >= lease.held &&
           "EraseLease: owner count out of step with the lease table");
    o->second.pages -= lease.held;
    if (--o->second.leases == 0) owner_leases.erase(o);
  }
  radix_internal::Account& account = AccountOf(lease.ns);
  assert(namespaces[lease.ns].leases > 0);
  if (lease.prefix_pin) {
    assert(account.pins > 0 && account.pin_pages >= lease.held);
    --account.pins;
    account.pin_pages -= lease.held;
  } else {
    assert(account.held >= lease.held);
    account.held -= lease.held;
  }
  --namespaces[lease.ns].leases;
  if (lease.fenced) {
    assert(fenced_leases > 0 && fenced_pages >= lease.held);
    --fenced_leases;
    fenced_pages -= lease.held;
  }
  leases.erase(it);
}

void RadixTree::Impl::FenceOrEraseLease(LeaseMap::iterator it) {
  Lease& lease = it->second;
  if (!fence) {
    EraseLease(it);
    return;
  }
  if (lease.fenced) return;
  lease.fenced = true;
  ++fenced_leases;
  fenced_pages += lease.held;
}

absl::StatusOr<RadixTree::Impl::LeaseMap::iterator> RadixTree::Impl::FindLease(
    LeaseId id, OwnerId owner, absl::Time now) {
  auto it = leases.find(id);
  if (it == leases.end() || it->second.owner != owner ||
      it->second.prefix_pin) {
    return Refuse(absl::StatusCode::kNotFound,
                  {.reason = Refusal::kLeaseUnknown, .lease = id},
                  absl::StrCat("unknown lease ", id,
                               " for this owner (ended, expired, or held by "
                               "another)"));
  }
  if (it->second.fenced || it->second.expires <= now) {
    // Its owner names it, so it no longer writes it: end it now.
    if (!it->second.fenced) ++stats.leases_expired;
    EraseLease(it);
    return Refuse(
        absl::StatusCode::kNotFound,
        {.reason = Refusal::kLeaseExpired, .lease = id},
        absl::StrCat("lease ", id, " expired; its pages were released"));
  }
  return it;
}

absl::Status RadixTree::Impl::CheckEndLeases(const AcquireRequest& req,
                                             absl::Time now) const {
  // Checked whole before anything changes; ending one twice would unpin
  // its pages twice.
  // Expired and fenced leases of the owner may be named: that ends them.
  absl::flat_hash_set<LeaseId> seen;
  uint64_t ending_pages = 0;
  for (size_t i = 0; i < req.end_leases.size(); ++i) {
    const LeaseId id = req.end_leases[i];
    auto it = leases.find(id);
    if (it == leases.end() || it->second.owner != req.owner) {
      return Refuse(
          absl::StatusCode::kNotFound,
          {.reason = Refusal::kEndLeaseUnknown, .index = i, .lease = id},
          absl::StrCat("end_leases[", i, "]: lease ", id,
                       " is unknown to this owner (ended, or held "
                       "by another)"));
    }
    if (req.end_leases.size() > 1 && !seen.insert(id).second) {
      return Refuse(
          absl::StatusCode::kInvalidArgument,
          {.reason = Refusal::kEndLeaseRepeated, .index = i, .lease = id},
          absl::StrCat("end_leases: lease ", id, " is listed twice"));
    }
    ending_pages += it->second.held;
  }
  if (req.owner == kNoOwner) return absl::OkStatus();
  auto o = owner_leases.find(req.owner);
  const OwnerCount held = o == owner_leases.end() ? OwnerCount{} : o->second;
  if (req.max_owner_leases != 0 &&
      held.leases - std::min<uint64_t>(held.leases, req.end_leases.size()) >=
          req.max_owner_leases) {
    return Refuse(
        absl::StatusCode::kResourceExhausted,
        {.reason = Refusal::kOwnerLeaseLimit,
         .held = held.leases,
         .limit = req.max_owner_leases},
        absl::StrCat("the owner holds ", held.leases, " leases, the limit is ",
                     req.max_owner_leases, "; commit or release some"));
  }
  if (req.max_owner_pages != 0 &&
      held.pages - ending_pages >= req.max_owner_pages) {
    return Refuse(
        absl::StatusCode::kResourceExhausted,
        {.reason = Refusal::kOwnerPageLimit,
         .held = held.pages - ending_pages,
         .limit = req.max_owner_pages},
        absl::StrCat("the owner's leases hold ", held.pages - ending_pages,
                     " pages, the limit is ", req.max_owner_pages,
                     "; commit or release some"));
  }
  return absl::OkStatus();
}

uint64_t RadixTree::Impl::AccountHeldAfterEnds(
    const AcquireRequest& req) const {
  const uint32_t account_id = namespaces[req.ns].account;
  uint64_t held = accounts[account_id].held;
  for (LeaseId id : req.end_leases) {
    const Lease& l = leases.find(id)->second;
    if (namespaces[l.ns].account == account_id) held -= l.held;
  }
  return held;
}

absl::Status RadixTree::Impl::CheckAccountPins(const AcquireRequest& req) {
  radix_internal::Account& account = AccountOf(req.ns);
  if (account.limits.max_pinned_pages != 0) {
    const uint64_t held = AccountHeldAfterEnds(req);
    if (held >= account.limits.max_pinned_pages) {
      ++account.limited;
      return Refuse(
          absl::StatusCode::kResourceExhausted,
          {.reason = Refusal::kAccountPinLimit,
           .held = held,
           .limit = account.limits.max_pinned_pages},
          absl::StrCat("the account's leases hold ", held,
                       " pages, its limit is ", account.limits.max_pinned_pages,
                       " (max_pinned_pages); commit or release some"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AcquireResult> RadixTree::Acquire(const AcquireRequest& req) {
  Impl& m = *impl_;
  if (req.keys.empty() && !req.tokens.empty()) {
    // Token mode: without allocation only the matched prefix matters, so
    // hashing stops at the first block the tree lacks.
    ASSIGN_OR_RETURN(ResolvedPrompt prompt,
                     m.ResolveTokens(req.ns, req.tokens,
                                     /*stop_at_missing=*/!req.allocate));
    return m.AcquireResolved(req, prompt);
  }
  ResolvedPrompt prompt;
  prompt.keys = req.keys;
  prompt.tokens = req.tokens;
  prompt.total_blocks = static_cast<uint32_t>(req.keys.size());
  return m.AcquireResolved(req, prompt);
}

absl::StatusOr<AcquireResult> RadixTree::TEST_AcquireWalked(
    const AcquireRequest& req, absl::Span<const PageId> known,
    uint64_t known_epoch) {
  ResolvedPrompt prompt;
  prompt.keys = req.keys;
  prompt.tokens = req.tokens;
  prompt.total_blocks = static_cast<uint32_t>(req.keys.size());
  prompt.known_pages = known;
  prompt.known_epoch = known_epoch;
  prompt.chain_keys = true;
  return impl_->AcquireResolved(req, prompt);
}

absl::StatusOr<AcquireResult> RadixTree::Impl::AcquireResolved(
    const AcquireRequest& req, const ResolvedPrompt& prompt) {
  if (req.owner == kPinOwner) {
    return absl::InvalidArgumentError(
        "Acquire: owner kPinOwner is reserved for prefix pins");
  }
  const absl::Time now = absl::Now();
  WriterMutexLock lock(&mu);
  RETURN_IF_ERROR(ValidateRequest("Acquire", req.ns, prompt.keys, prompt.tokens));
  RETURN_IF_ERROR(
      CheckPriorities("priorities", req.priorities, prompt.total_blocks));
  RETURN_IF_ERROR(CheckEndLeases(req, now));
  RETURN_IF_ERROR(CheckAccountPins(req));
  RETURN_IF_ERROR(EnablePriorities(req.priorities));
  return AcquireLocked(req, prompt);
}

AcquireResult RadixTree::Impl::AcquireLocked(const AcquireRequest& req,
                                             const ResolvedPrompt& prompt) {
  const uint32_t ps = namespaces[req.ns].spec.page_size;
  const uint32_t now = NowSeconds();
  DecayIfDue(now);
  AcquireResult r;
  r.total_blocks = prompt.total_blocks;
  r.pages.reserve(prompt.keys.size());
  MatchPath(req.ns, prompt.keys, prompt.tokens, prompt.known_pages,
            prompt.known_epoch, &r.pages, &r.collisions);
  // Pages this lease may hold (CheckEndLeases left at least one).
  uint64_t budget = UINT64_MAX;
  if (req.owner != kNoOwner && req.max_owner_pages != 0) {
    auto o = owner_leases.find(req.owner);
    uint64_t held = o == owner_leases.end() ? 0 : o->second.pages;
    for (LeaseId id : req.end_leases) held -= leases.find(id)->second.held;
    budget = req.max_owner_pages - held;
  }
  radix_internal::Account& account = AccountOf(req.ns);
  if (account.limits.max_pinned_pages != 0) {
    const uint64_t room =
        account.limits.max_pinned_pages - AccountHeldAfterEnds(req);
    if (room < budget) {
      budget = room;
      if (r.pages.size() > budget || (req.allocate && budget < r.total_blocks)) {
        r.account_limited = true;
      }
    }
  }
  if (r.pages.size() > budget) r.pages.resize(budget);
  r.matched_blocks = static_cast<uint32_t>(r.pages.size());

  stats.lookups++;
  stats.lookup_blocks += r.total_blocks;
  stats.hit_blocks += r.matched_blocks;
  stats.lookup_tokens += uint64_t{r.total_blocks} * ps;
  stats.hit_tokens += uint64_t{r.matched_blocks} * ps;
  stats.hash_collisions += r.collisions;
  if (prompt.chain_keys) {
    // Match adds to these under the shared lock; nothing else writes them
    // while this exclusive hold lasts, so a plain load and store suffice.
    const uint64_t hashed = prompt.keys.size() - prompt.walked_blocks;
    walked_blocks.store(
        walked_blocks.load(std::memory_order_relaxed) + prompt.walked_blocks,
        std::memory_order_relaxed);
    if (hashed != 0) {
      hashed_blocks.store(hashed_blocks.load(std::memory_order_relaxed) + hashed,
                          std::memory_order_relaxed);
    }
  }

  // Pin the matched path before evicting, so eviction cannot take it.
  PageId parent = kNoPage;
  for (PageId p : r.pages) {
    Pin(p, now);
    SetHotChild(req.ns, parent, p);
    parent = p;
  }
  // Then end the leases the caller is done with: pages this Acquire just
  // pinned only lose a reference; the rest become evictable (or free).
  if (!req.end_leases.empty()) {
    const absl::Time wall = absl::Now();
    for (LeaseId id : req.end_leases) {
      auto it = leases.find(id);
      // An expired lease ended here was not counted by a sweep yet.
      if (!it->second.fenced && it->second.expires <= wall) {
        ++stats.leases_expired;
      }
      EraseLease(it);
    }
  }

  uint32_t want = 0;
  if (req.allocate) {
    want = r.total_blocks - r.matched_blocks;
    if (req.max_new_blocks != 0) want = std::min(want, req.max_new_blocks);
    want = static_cast<uint32_t>(
        std::min<uint64_t>(want, budget - r.matched_blocks));
  }
  Lease lease;
  if (turn_duel != nullptr) {
    const radix_internal::TurnDuel::Admission a =
        turn_duel->Admit(prompt.keys, r.matched_blocks);
    lease.admit = a.admit;
    lease.demote = a.demote;
  }
  lease.owner = req.owner;
  lease.expires = req.expires;
  lease.ns = req.ns;
  lease.has_tokens = !prompt.tokens.empty();
  lease.chain_keyed = prompt.chain_keys;
  lease.total_blocks = prompt.total_blocks;
  if (!req.priorities.empty()) AddPriorities(lease, req.priorities, now);
  const uint32_t account_id = namespaces[req.ns].account;
  for (uint32_t k = 0; k < want; ++k) {
    const bool at_limit =
        account.limits.max_pages != 0 &&
        account.cached + account.writing >= account.limits.max_pages;
    EvictedBlock victim;
    EvictedBlock* const report = req.report_evictions ? &victim : nullptr;
    if (at_limit) {
      // Only the account's own pages make room for it.
      if (!EvictFrom(AccountVictimList(account_id), report)) {
        r.account_limited = true;
        break;
      }
      ++r.evicted_pages;
      if (report != nullptr) r.evicted.push_back(victim);
    } else if (free_head == kNoPage) {
      if (!EvictOne(report)) break;
      ++r.evicted_pages;
      if (report != nullptr) r.evicted.push_back(victim);
    }
    const PageId p = PopFree();
    assert(nodes[p].state == PageState::kFree);
    nodes[p].state = PageState::kWriting;
    ++writing_count;
    ++account.writing;
    const size_t block = size_t{r.matched_blocks} + k;
    if (lease.has_tokens) {
      std::memcpy(MutableTokensOf(p), prompt.tokens.data() + block * ps,
                  size_t{ps} * sizeof(uint32_t));
    }
    lease.writing.push_back(p);
    lease.keys.push_back(prompt.keys[block]);
    r.pages.push_back(p);
  }
  r.new_blocks = static_cast<uint32_t>(lease.writing.size());
  if (req.report_evictions) r.new_keys = lease.keys;
  if (!r.pages.empty()) {
    lease.path.assign(r.pages.begin(), r.pages.begin() + r.matched_blocks);
    lease.matched = r.matched_blocks;
    lease.held = r.pages.size();
    r.lease = next_lease++;
    if (lease.owner != kNoOwner) {
      OwnerCount& c = owner_leases[lease.owner];
      ++c.leases;
      c.pages += lease.held;
    }
    account.held += lease.held;
    ++namespaces[req.ns].leases;
    if (req.hold_new_pages && r.new_blocks != 0) {
      held.emplace(r.lease, HeldPages{.account = namespaces[req.ns].account});
    }
    leases.emplace(r.lease, std::move(lease));
  }
  if (r.account_limited) ++account.limited;
  FlushEvents();
  return r;
}

void RadixTree::Impl::InsertNode(Lease& lease, PageId w, const BlockKey& key,
                                 PageId parent, uint32_t depth, uint32_t now) {
  Node& n = nodes[w];
  assert(n.state == PageState::kWriting && "InsertNode: page is not WRITING");
  n.key = key;
  n.parent = parent;
  n.refs = 1;
  n.children = 0;
  n.last_used = now;
  n.ns = lease.ns;
  n.state = PageState::kCached;
  n.has_tokens = lease.has_tokens;
  n.chain_keyed = lease.chain_keyed;
  n.probation = !lease.admit;
  n.drop_below = !lease.demote;
  n.hot_child = kNoPage;
  if (prio != nullptr) {
    // No priority until its lease ends (ApplyPriorities gives it one).
    prio[w] = radix_internal::kBottomPriority.prio;
    prio_expires[w] = radix_internal::kBottomPriority.expires;
  }
  SetHotChild(lease.ns, parent, w);
  index.insert(w);
  if (parent != kNoPage) ++nodes[parent].children;
  ++namespaces[lease.ns].cached_blocks;
  radix_internal::Account& account = AccountOf(lease.ns);
  assert(writing_count > 0 && account.writing > 0);
  --writing_count;
  --account.writing;
  ++account.cached;
  ++cached_count;
  ++pinned_count;
  lease.path.push_back(w);
  if (listener != nullptr) {
    TreeEvent e;
    e.type = TreeEvent::Type::kStored;
    e.ns = lease.ns;
    e.root = namespaces[lease.ns].root;
    e.key = key;
    e.parent_key = ParentKey(n);
    e.page = w;
    e.depth = depth;
    e.block_size = arena_page_size;
    if (n.has_tokens) e.tokens = TokensOf(w);
    pending_events.push_back(e);
  }
}

absl::StatusOr<CommitResult> RadixTree::Commit(LeaseId lease_id,
                                               uint32_t blocks, bool release,
                                               OwnerId owner,
                                               bool report_inserted,
                                               absl::Span<const BlockPriority>
                                                   priorities) {
  Impl& m = *impl_;
  const absl::Time wall = absl::Now();
  WriterMutexLock lock(&m.mu);
  ASSIGN_OR_RETURN(Impl::LeaseMap::iterator it,
                   m.FindLease(lease_id, owner, wall));
  Lease& lease = it->second;
  const uint32_t uncommitted =
      static_cast<uint32_t>(lease.writing.size()) - lease.committed;
  if (blocks > uncommitted) {
    return Refuse(absl::StatusCode::kFailedPrecondition,
                  {.reason = Refusal::kCommitBeyondLease,
                   .lease = lease_id,
                   .held = blocks,
                   .limit = uncommitted},
                  absl::StrCat("blocks=", blocks, " exceeds the lease's ",
                               uncommitted, " uncommitted new pages"));
  }
  RETURN_IF_ERROR(m.CheckPriorities("priorities", priorities,
                                    lease.total_blocks));
  RETURN_IF_ERROR(m.EnablePriorities(priorities));
  const uint32_t now = m.NowSeconds();
  if (!priorities.empty()) m.AddPriorities(lease, priorities, now);
  const uint32_t ps = m.arena_page_size;
  CommitResult r;
  for (uint32_t j = lease.committed; j < lease.committed + blocks; ++j) {
    const PageId w = lease.writing[j];
    if (lease.broken) {
      ++r.collided;
      r.pages.push_back(w);
      continue;
    }
    const BlockKey& key = lease.keys[j];
    const PageId parent = lease.path.empty() ? kNoPage : lease.path.back();
    if (auto hit = m.index.find(key); hit != m.index.end()) {
      const PageId c = *hit;
      const Node& cn = m.nodes[c];
      const bool same =
          cn.ns == lease.ns && cn.parent == parent &&
          (!lease.has_tokens || !cn.has_tokens ||
           std::memcmp(m.TokensOf(c), m.TokensOf(w), ps * sizeof(uint32_t)) ==
               0);
      if (same) {
        m.Pin(c, now);
        m.SetHotChild(lease.ns, parent, c);
        lease.path.push_back(c);
        ++lease.held;  // w stays WRITING until the lease ends
        if (lease.owner != kNoOwner) ++m.owner_leases[lease.owner].pages;
        ++m.AccountOf(lease.ns).held;
        ++r.deduplicated;
        r.pages.push_back(c);
      } else {
        lease.broken = true;
        ++r.collided;
        ++m.stats.hash_collisions;
        r.pages.push_back(w);
      }
      continue;
    }
    m.InsertNode(lease, w, key, parent, lease.matched + j, now);
    ++r.inserted;
    if (report_inserted) {
      r.inserted_keys.push_back(key);
      r.inserted_pages.push_back(w);
    }
    r.pages.push_back(w);
  }
  lease.committed += blocks;
  m.stats.inserted_blocks += r.inserted;
  m.stats.deduplicated_blocks += r.deduplicated;
  if (release) {
    m.EraseLease(it);
    r.released = true;
  }
  m.FlushEvents();
  return r;
}

void RadixTree::ReleaseHold(LeaseId lease) {
  Impl& m = *impl_;
  WriterMutexLock lock(&m.mu);
  auto h = m.held.find(lease);
  if (h == m.held.end()) return;
  radix_internal::Account& account = m.accounts[h->second.account];
  for (PageId p : h->second.pages) {
    assert(m.nodes[p].state == PageState::kWriting &&
           m.writing_count > 0 && account.writing > 0);
    --m.writing_count;
    --account.writing;
    m.PushFree(p);
  }
  m.held.erase(h);
}

absl::Status RadixTree::Release(LeaseId lease_id, OwnerId owner) {
  Impl& m = *impl_;
  const absl::Time now = absl::Now();
  WriterMutexLock lock(&m.mu);
  ASSIGN_OR_RETURN(Impl::LeaseMap::iterator it,
                   m.FindLease(lease_id, owner, now));
  m.EraseLease(it);
  return absl::OkStatus();
}

std::vector<LeaseId> RadixTree::Impl::LeasesOf(OwnerId owner,
                                               OwnerLeases which) const {
  std::vector<LeaseId> ids;
  if (owner == kNoOwner || !owner_leases.contains(owner)) return ids;
  for (const auto& [id, lease] : leases) {
    if (lease.owner != owner) continue;
    if (which == OwnerLeases::kAll ||
        lease.fenced == (which == OwnerLeases::kFenced)) {
      ids.push_back(id);
    }
  }
  return ids;
}

uint64_t RadixTree::ReleaseOwner(OwnerId owner, bool fence) {
  Impl& m = *impl_;
  WriterMutexLock lock(&m.mu);
  // Fencing leaves fenced leases as they are; ending ends them all.
  const std::vector<LeaseId> ids = m.LeasesOf(
      owner, fence ? Impl::OwnerLeases::kUnfenced : Impl::OwnerLeases::kAll);
  for (LeaseId id : ids) {
    if (fence) {
      m.FenceOrEraseLease(m.leases.find(id));
    } else {
      m.EraseLease(m.leases.find(id));
    }
  }
  m.FlushEvents();
  return ids.size();
}

uint64_t RadixTree::ReleaseFenced(OwnerId owner) {
  Impl& m = *impl_;
  WriterMutexLock lock(&m.mu);
  uint64_t pages = 0;
  for (LeaseId id : m.LeasesOf(owner, Impl::OwnerLeases::kFenced)) {
    auto it = m.leases.find(id);
    pages += it->second.held;
    m.EraseLease(it);
  }
  m.FlushEvents();
  return pages;
}

uint64_t RadixTree::ReleaseExpired(absl::Time now) {
  Impl& m = *impl_;
  std::vector<LeaseId> ids;
  {
    // Most sweeps find nothing: look under the shared lock first.
    ReaderMutexLock lock(&m.mu);
    for (const auto& [id, lease] : m.leases) {
      if (lease.expires <= now && !lease.fenced && !lease.prefix_pin) {
        ids.push_back(id);
      }
    }
  }
  if (ids.empty()) return 0;
  WriterMutexLock lock(&m.mu);
  uint64_t ended = 0;
  for (LeaseId id : ids) {
    auto it = m.leases.find(id);
    // Ended meanwhile by its owner: nothing to do.
    if (it == m.leases.end() || it->second.expires > now ||
        it->second.fenced || it->second.prefix_pin) {
      continue;
    }
    m.FenceOrEraseLease(it);
    ++ended;
  }
  m.stats.leases_expired += ended;
  m.FlushEvents();
  return ended;
}

uint32_t RadixTree::owner_leases(OwnerId owner) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  auto it = m.owner_leases.find(owner);
  return it == m.owner_leases.end() ? 0 : it->second.leases;
}

uint64_t RadixTree::owner_pages(OwnerId owner) const {
  const Impl& m = *impl_;
  ReaderMutexLock lock(&m.mu);
  auto it = m.owner_leases.find(owner);
  return it == m.owner_leases.end() ? 0 : it->second.pages;
}

}  // namespace radixkv
