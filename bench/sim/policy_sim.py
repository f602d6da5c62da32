#!/usr/bin/python3
"""Eviction policies for radixkv's prefix tree, compared by simulation.

Replays Mooncake-format traces (bench/data/README.md) with the request model
of bench/sim/leaf_lru_sim.py, one request at a time in file order:

  Acquire(all blocks) -> Commit(the new blocks it got pages for, release)

  * A node is one cached block, named by its whole path (its path id: the
    interned pair (parent path id, block id)), so equal ids under different
    parents are different blocks. Node 0 is the root and holds no page.
  * Acquire matches the longest cached prefix and pins it. It then asks the
    policy how many of the remaining blocks to admit (a policy may bypass a
    request's tail: the blocks it declines are not cached, and no later block
    of the path can be, since a node needs its parent). For each admitted
    block it takes a free page, or when the pool is full asks the policy for
    a victim, which must be an unpinned leaf; when the policy has none, the
    request commits only the blocks it got pages for.
  * Commit inserts the granted blocks under the matched prefix and releases
    the path; the policy then sees the whole path (matched and new).

The hit ratio is sum(matched blocks) / sum(blocks).

Policies (a Policy subclass each; POLICIES lists them by name) decide the
victim and admission and keep whatever state they need. The simulator, not
the policy, enforces the tree's rules: a victim that is pinned, not cached or
not a leaf fails an assertion. The policies are online: they see requests
only as they arrive, except continued_oracle, a bound rather than a policy
(see its docstring).

Standard library only. Run with /usr/bin/python3; --block_keys (hash on
the block keys radixkvd sees, so that turn_duel's figures equal the tree's
to the block) needs NumPy and xxhash: run it with the project's .venv.

  bench/sim/policy_sim.py --policy=lru --capacity=3000 [--trace=PATH]
  .venv/bin/python bench/sim/policy_sim.py --policy=turn_duel --block_keys=512
  bench/sim/policy_sim.py --matrix [--jobs=2] [--seed=1] [--policies=a,b]
      [--out=bench/sim/policy_results.md]

--matrix replays the conversation trace and bench/workloads/gen.py's four
shapes (defaults, --seed) at 1,000 / 3,000 / 9,000 pages under every policy
and the offline optimum (optimum_sim.py), and prints a Markdown table.
  bench/sim/policy_sim.py --self_test
"""

import argparse
import collections
import heapq
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from leaf_lru_sim import DEFAULT_TRACE, LeafLruCache, read_trace  # noqa: E402
import optimum_sim  # noqa: E402
import tiered_sim  # noqa: E402


# --------------------------------------------------------------------------
# The tree and the replay loop.

class Paths:
    """Interns paths: (parent path id, block id) -> path id; 0 is the root.

    Path ids are dense and stable for a whole run, so policies index plain
    lists by them. depth[p] is the number of blocks on p's path. Policies
    hash paths through two 32-bit values: hash[p] (sampling, bimodal
    insertion) and admit_hash[p] (turn_duel's admission), both
    stable_hash(p) by default; with a BlockKeyer, the two halves of the
    fingerprint that radixkvd's tree hashes on.
    """

    def __init__(self, keyer=None):
        self.ids = {}
        self.parent = [0]
        self.depth = [0]
        self.keyer = keyer
        if keyer is None:
            self.hash = [stable_hash(0)]
            self.admit_hash = self.hash
        else:
            self.key = [keyer.root]
            self.hash = [0]
            self.admit_hash = [0]

    def path_of(self, hash_ids):
        """The path ids of a prompt's blocks, in order."""
        out = []
        p = 0
        ids = self.ids
        for b in hash_ids:
            key = (p, b)
            q = ids.get(key)
            if q is None:
                q = len(self.parent)
                ids[key] = q
                self.parent.append(p)
                self.depth.append(self.depth[p] + 1)
                if self.keyer is None:
                    self.hash.append(stable_hash(q))
                else:
                    k = self.keyer.key(self.key[p], b)
                    self.key.append(k)
                    fp = BlockKeyer.fingerprint(k)
                    self.hash.append(fp & 0xFFFFFFFF)
                    self.admit_hash.append(fp >> 32)
            out.append(q)
            p = q
        return out


class BlockKeyer:
    """The block keys that bench/replay gives radixkvd for a trace: block
    id b is the tokens b * page_size .. b * page_size + page_size - 1, in
    the namespace replay registers (model "radixkv-replay", 32 layers, 8
    KV heads of 128, bfloat16), keyed by the block-key contract
    (python/radixkv/keys.py; it needs NumPy and xxhash, so run with the
    project's virtual environment). turn_duel in the tree hashes on a
    key's fingerprint, hi ^ lo: its low 32 bits sample the shadows, its
    high 32 bits decide bimodal admission."""

    def __init__(self, page_size=512, tiny=False):
        sys.path.insert(0, os.path.join(REPO, "python"))
        import numpy
        from radixkv import keys
        self.np = numpy
        self.keys = keys
        self.page_size = page_size
        if tiny:  # replay --tiny_layout: 1 layer, 1 KV head of 8
            spec = keys.NamespaceSpec(model="radixkv-replay-tiny",
                                      num_layers=1, num_kv_heads=1,
                                      head_dim=8, page_size=page_size,
                                      dtype="DTYPE_BFLOAT16")
        else:
            spec = keys.NamespaceSpec(model="radixkv-replay", num_layers=32,
                                      num_kv_heads=8, head_dim=128,
                                      page_size=page_size,
                                      dtype="DTYPE_BFLOAT16")
        self.root = keys.namespace_root(spec.normalized())

    def key(self, parent_key, block_id):
        n = self.page_size
        tokens = self.np.arange(block_id * n, (block_id + 1) * n,
                                dtype="<u4")
        return self.keys.chain_key(parent_key, tokens)

    @staticmethod
    def fingerprint(key):
        return (int.from_bytes(key[:8], "big") ^
                int.from_bytes(key[8:], "big"))


class Tree:
    """Which paths are cached; the structural facts a policy may rely on."""

    def __init__(self, paths, capacity):
        self.paths = paths
        self.capacity = capacity  # 0: unbounded
        self.cached = bytearray(1)
        self.cached[0] = 1        # the root is always there, holds no page
        self.children = [0]       # cached children per path id
        self.size = 0             # cached nodes (pages in use)
        self.pinned = frozenset()
        # Blocks in the tier below the pool; 0: none, or of unknown size
        # (as RadixTreeOptions::lower_tier_blocks).
        self.lower_blocks = 0

    def grow(self):
        n = len(self.paths.parent) - len(self.children)
        if n > 0:
            self.cached.extend(bytes(n))
            self.children.extend([0] * n)

    def is_leaf(self, p):
        """True when p is cached and has no cached child."""
        return self.cached[p] == 1 and self.children[p] == 0 and p != 0

    def evictable(self, p):
        return self.is_leaf(p) and p not in self.pinned


class Request:
    """What a policy learns about the request being served.

    now: its 1-based index; path: path ids of all its blocks; matched: the
    cached prefix length (pinned); want: blocks not cached; granted: blocks
    that got pages (set before on_commit); timestamp: the trace's field.
    """
    __slots__ = ("now", "path", "matched", "want", "granted", "timestamp")


class Policy:
    """The policy interface; the default hooks do nothing.

    Calls per request, in order: on_request (after the match; req.matched
    nodes are pinned), admit, then victim/demote/on_evict/on_leaf as pages
    are needed, then on_insert for each new node (root side first), then
    on_commit with the whole path released.
    """

    name = "base"

    def bind(self, tree):
        self.tree = tree
        self.paths = tree.paths

    def on_request(self, req):
        pass

    def admit(self, req):
        """How many of req.want new blocks to cache (a prefix of them)."""
        return req.want

    def victim(self, req):
        """An evictable leaf (Tree.evictable), or None when there is none."""
        raise NotImplementedError

    def demote(self, p):
        """Whether victim p goes to a tier below the pool (if any)."""
        return True

    def on_evict(self, p):
        pass

    def on_leaf(self, p):
        """p became a leaf: its last cached child was evicted."""
        pass

    def on_insert(self, p, req):
        pass

    def on_commit(self, req):
        pass

    def stats(self):
        return {}


class Sim:
    """A tree of `capacity` pages run by one policy.

    With a tier (put/take/forget/commit, as tiered_sim.LruTier) below the
    pool, as radixkvd runs one: each victim the policy demotes goes to the
    tier in eviction order (the others are dropped); after the evictions,
    the request's next blocks the tier holds are promoted into their new
    pages and count as matched; the tier forgets the other new blocks.
    Promoted blocks are the request's new blocks to the policy.
    """

    def __init__(self, policy, capacity, paths=None, tier=None):
        self.paths = paths if paths is not None else Paths()
        self.tree = Tree(self.paths, capacity)
        if tier is not None:
            self.tree.lower_blocks = getattr(tier, "capacity", 0)
        self.policy = policy
        policy.bind(self.tree)
        self.tier = tier
        self.now = 0
        self.blocks = 0
        self.matched = 0
        self.evicted = 0
        self.bypassed = 0
        self.demoted = 0
        self.declined = 0   # victims the policy kept from the tier
        self.promoted = 0

    def request(self, hash_ids, timestamp=0, path=None):
        """Serves one request; returns its matched block count."""
        tree = self.tree
        if path is None:
            path = self.paths.path_of(hash_ids)
        tree.grow()
        self.now += 1
        cached = tree.cached
        matched = 0
        for p in path:
            if not cached[p]:
                break
            matched += 1
        req = Request()
        req.now = self.now
        req.path = path
        req.matched = matched
        req.want = len(path) - matched
        req.granted = 0
        req.timestamp = timestamp
        tree.pinned = frozenset(path[:matched])
        pol = self.policy
        pol.on_request(req)
        admit = pol.admit(req) if req.want else 0
        assert 0 <= admit <= req.want
        self.bypassed += req.want - admit
        granted = 0
        cap = tree.capacity
        children = tree.children
        parent = self.paths.parent
        while granted < admit:
            if cap and tree.size + granted >= cap:
                v = pol.victim(req)
                if v is None:
                    break
                assert tree.evictable(v), ("bad victim", pol.name, v)
                if self.tier is not None:
                    if pol.demote(v):
                        self.tier.put(v)
                        self.demoted += 1
                    else:
                        self.declined += 1
                cached[v] = 0
                q = parent[v]
                children[q] -= 1
                tree.size -= 1
                self.evicted += 1
                pol.on_evict(v)
                if q and children[q] == 0:
                    pol.on_leaf(q)
                continue
            granted += 1
        req.granted = granted
        promoted = 0
        if self.tier is not None:
            promoted, _ = tiered_sim.serve_new_blocks(
                self.tier, path[matched:matched + granted])
            self.promoted += promoted
        for p in path[matched:matched + granted]:
            cached[p] = 1
            children[parent[p]] += 1
            tree.size += 1
            pol.on_insert(p, req)
        tree.pinned = frozenset()
        pol.on_commit(req)
        self.blocks += len(path)
        self.matched += matched + promoted
        if cap:
            assert tree.size <= cap
        return matched + promoted

    def hit_ratio(self):
        return self.matched / self.blocks if self.blocks else 0.0


# --------------------------------------------------------------------------
# Helpers shared by the policies.

class LeafHeap:
    """A lazy min-heap of (key, path id) over candidate leaves.

    An entry is live while its node is a cached leaf and `keyof(node)` still
    equals the entry's key; policies push a node again whenever its key
    changes or it becomes a leaf, and stale entries are dropped when popped.
    """

    def __init__(self):
        self.h = []

    def push(self, p, key):
        heapq.heappush(self.h, (key, p))

    def pop(self, tree, keyof):
        """Removes and returns the least live unpinned (key, p), or None."""
        held = []
        out = None
        h = self.h
        pinned = tree.pinned
        while h:
            e = heapq.heappop(h)
            key, p = e
            if not tree.is_leaf(p) or keyof(p) != key:
                continue
            if p in pinned:
                held.append(e)
                continue
            out = e
            break
        for e in held:
            heapq.heappush(h, e)
        return out

    def peek(self, tree, keyof):
        """The least live unpinned entry, left in the heap; or None."""
        e = self.pop(tree, keyof)
        if e is not None:
            heapq.heappush(self.h, e)
        return e

    def __len__(self):
        return len(self.h)


def stable_hash(x):
    """A 32-bit mix of an integer (splitmix-style), the same on every run."""
    x = (x * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 29
    return x & 0xFFFFFFFF


# --------------------------------------------------------------------------
# Policies.

# Depth never reaches this; keys are now * KEY_DEPTH - depth.
KEY_DEPTH = 1 << 20


def mru_key(now, depth):
    """The key of a node touched at `now`: ties go to the deeper node."""
    return now * KEY_DEPTH - depth


def probation_key(now, depth):
    """Below every mru_key; among themselves the latest inserted goes first."""
    return -now * KEY_DEPTH - depth


class KeyedPolicy(Policy):
    """The victim is the unpinned leaf with the least key; subclasses set
    keys in set_keys(req, path) for the released path (root side first)."""

    def bind(self, tree):
        super().bind(tree)
        self.key = {}
        self.heap = LeafHeap()

    def victim(self, req):
        e = self.heap.pop(self.tree, self.key.get)
        if e is None:
            return None
        self.evicted_key(e[0])
        return e[1]

    def evicted_key(self, key):
        pass

    def on_evict(self, p):
        del self.key[p]

    def on_leaf(self, p):
        self.heap.push(p, self.key[p])

    def on_commit(self, req):
        path = req.path[:req.matched + req.granted]
        if path:
            self.set_keys(req, path)
            self.heap.push(path[-1], self.key[path[-1]])

    def set_keys(self, req, path):
        raise NotImplementedError

    def insert_keys(self, req, path, mru):
        """Bimodal insertion of a released path: its matched blocks, and
        its new ones when `mru`, become most recently used; the other new
        blocks go in at the LRU end (probation_key)."""
        depth = self.paths.depth
        now = req.now
        for i, p in enumerate(path):
            if i < req.matched or mru:
                self.key[p] = mru_key(now, depth[p])
            else:
                self.key[p] = probation_key(now, depth[p])


class Lru(KeyedPolicy):
    """radixkv today: the least recently used unpinned leaf goes (ties: the
    deeper node), as in leaf_lru_sim.py."""

    name = "lru"

    def set_keys(self, req, path):
        depth = self.paths.depth
        key = self.key
        now = req.now
        for p in path:
            key[p] = mru_key(now, depth[p])


class DepthLru(KeyedPolicy):
    """LRU on (last use - penalty * depth): deep blocks go sooner."""

    name = "depth_lru"

    def __init__(self, penalty=20):
        self.penalty = penalty

    def set_keys(self, req, path):
        depth = self.paths.depth
        for p in path:
            d = depth[p]
            self.key[p] = (req.now - self.penalty * d, -d)


def bimodal_hash(h, shift):
    """True when the low `shift` bits of the hash h are zero."""
    return shift <= 0 or (h & ((1 << shift) - 1)) == 0


def bimodal(p, shift):
    """True for a 2**-shift share of path ids (by hash): the request's
    choice in bimodal insertion, the same in the cache and its shadows."""
    return bimodal_hash(stable_hash(p), shift)


class Bip(KeyedPolicy):
    """Bimodal insertion: matched blocks become most recently used; a
    request's new blocks do so for a 2**-shift share of requests and
    otherwise go in at the LRU end (probation_key: the next to go)."""

    name = "bip"

    def __init__(self, shift=2):
        self.shift = shift

    def set_keys(self, req, path):
        mru = bimodal(req.path[-1], self.shift)
        self.insert_keys(req, path, mru)


class Sampler:
    """Chooses the path ids that shadows see: a path id is sampled when its
    hash falls below 2**32 / rate (rate = 1: every one)."""

    def __init__(self, paths, rate):
        self.hash = paths.hash
        self.limit = (1 << 32) // max(1, rate)

    def sampled(self, path):
        lim = self.limit
        h = self.hash
        return [q for q in path if h[q] < lim]


class FlatShadow:
    """A metadata-only cache of sampled path ids, without the tree.

    It holds at most `capacity` ids. serve(items) replays one request's
    sampled blocks, items = [(q, hit_key, insert_key)] in path order, the
    way the tree does: held ids are hits and take hit_key; then the least
    keys are dropped to make room for the others, which go in with
    insert_key. For a policy whose keys never rank a child above its
    parent (every policy that a shadow stands for here), the least key is
    a leaf of the full tree, so a shadow of a 1/rate sample at
    capacity / rate estimates the tree's hits (exactly, for LRU at rate 1).
    `score` is the hit count, decayed by the owner.
    """

    __slots__ = ("capacity", "key", "heap", "hits", "score", "last_victim")

    def __init__(self, capacity):
        self.capacity = max(1, capacity)
        self.key = {}
        self.heap = []
        self.hits = 0
        self.score = 0.0
        self.last_victim = None

    def serve(self, items):
        key = self.key
        heap = self.heap
        new = []
        for q, hit_key, insert_key in items:
            if q in key:
                self.hits += 1
                self.score += 1.0
                key[q] = hit_key
                heapq.heappush(heap, (hit_key, q))
            else:
                new.append((q, insert_key))
        while new and len(key) + len(new) > self.capacity and heap:
            k, v = heapq.heappop(heap)
            if key.get(v) == k:
                del key[v]
                self.last_victim = k
        for q, insert_key in new[-self.capacity:]:
            key[q] = insert_key
            heapq.heappush(heap, (insert_key, q))


class ListShadow:
    """The flat shadow of a bimodal-insertion policy, kept as two lists.

    Like FlatShadow, but for keys that are only mru_key (the main list,
    oldest first) or probation_key (the probation stack, latest on top):
    serve(sampled, admit) replays one request's sampled path ids (path
    order). Held ids are hits and go to the main list's newest end (a
    probation id leaves the stack); to make room for the others the
    stack's top, or when it is empty the main list's oldest, is dropped;
    the others go to the newest end of the main list when `admit`, else
    on the stack, root side first. Within one request deeper ids are
    older, as the tree's ties go to the deeper node; with every id sampled
    and admit always true it is leaf-LRU exactly.
    """

    __slots__ = ("capacity", "main", "prob", "stack", "hits", "score")

    def __init__(self, capacity):
        self.capacity = max(1, capacity)
        self.main = collections.OrderedDict()
        self.prob = set()
        self.stack = []
        self.hits = 0
        self.score = 0.0

    def serve(self, sampled, admit):
        main = self.main
        prob = self.prob
        hits = []
        new = []
        for q in reversed(sampled):  # deepest first
            if q in main:
                hits.append(q)
                main.move_to_end(q)
            elif q in prob:
                prob.discard(q)
                hits.append(q)
                main[q] = None
            else:
                new.append(q)
        self.hits += len(hits)
        self.score += len(hits)
        over = len(main) + len(prob) + len(new) - self.capacity
        stack = self.stack
        while over > 0 and (prob or len(main) > len(hits)):
            if prob:
                q = stack.pop()
                if q not in prob:
                    continue  # left the stack by a hit
                prob.discard(q)
            else:
                main.popitem(last=False)
            over -= 1
        if over > 0:
            new = new[over:]  # the shallowest do not fit
        if admit:
            for q in new:
                main[q] = None
            for q in hits:
                main.move_to_end(q)
        else:
            for q in reversed(new):
                prob.add(q)
                stack.append(q)


class Dueling:
    """Picks one of n candidate policies by sampled flat shadows.

    Each candidate has a shadow (`shadow`: FlatShadow or ListShadow) of
    capacity / rate over the path ids that Sampler(rate) samples, rate =
    max(1, capacity // shadow_size). Scores decay by (1 - decay) per
    request. The choice moves to the best candidate only when its score
    beats the current one's by `margin` (relative) and by a lead L with
    L**2 > evidence * (the best's score), i.e. by sqrt(evidence) standard
    deviations of a Poisson count (2 by default), so that the few hits of
    the first requests cannot move it; candidate 0 is the starting
    choice.
    """

    def __init__(self, paths, n, capacity, shadow_size=512, decay=1e-4,
                 margin=0.02, shadow=FlatShadow, evidence=4.0):
        rate = max(1, capacity // shadow_size) if capacity else 1
        self.sampler = Sampler(paths, rate)
        self.shadows = [shadow(capacity // rate if capacity else 1 << 60)
                        for _ in range(n)]
        self.decay = decay
        self.margin = margin
        self.evidence = evidence
        self.choice = 0
        self.switches = 0

    def end_request(self):
        f = 1.0 - self.decay
        best = 0
        for i, s in enumerate(self.shadows):
            s.score *= f
            if s.score > self.shadows[best].score:
                best = i
        cur = self.shadows[self.choice].score
        lead = self.shadows[best].score - cur
        if best != self.choice and lead > cur * self.margin and (
                lead * lead > self.evidence * (cur + lead)):
            self.choice = best
            self.switches += 1


class Dip(KeyedPolicy):
    """DIP: set dueling between LRU and BIP (2**-shift) insertion, with
    sampled flat shadows of both instead of leader sets."""

    name = "dip"

    def __init__(self, shift=5):
        self.shift = shift

    def bind(self, tree):
        super().bind(tree)
        self.duel = Dueling(self.paths, 2, tree.capacity, shadow=ListShadow)

    def set_keys(self, req, path):
        mru_tail = bimodal(req.path[-1], self.shift)
        duel = self.duel
        sampled = duel.sampler.sampled(req.path)
        if sampled:
            duel.shadows[0].serve(sampled, True)
            duel.shadows[1].serve(sampled, mru_tail)
        duel.end_request()
        mru = duel.choice == 0 or mru_tail
        self.insert_keys(req, path, mru)

    def stats(self):
        return {"switches": self.duel.switches}


class Rrip(KeyedPolicy):
    """RRIP (Jaleel et al., ISCA 2010) on the tree, fully associative.

    A node's re-reference prediction v (0 near .. M distant) is set at a
    touch: hits get 0, insertions `insert` (SRRIP: M - 1; BRRIP: M, and
    M - 1 for a 2**-shift share). With a global ageing count A, a node's
    current prediction is min(M, v + A - A_touch); the victim is a leaf at
    M, the least recently touched among them, and when there is none A
    advances. Equivalently the key is (A_touch + M - v, touch, -depth) and
    A becomes the victim's first key field. Children never rank above
    parents, so the rule needs no tree-specific exception.
    """

    name = "srrip"

    def __init__(self, m=3, brrip_shift=None):
        self.m = m
        self.brrip_shift = brrip_shift
        if brrip_shift is not None:
            self.name = "brrip"

    def bind(self, tree):
        super().bind(tree)
        self.ageing = 0

    def evicted_key(self, key):
        self.ageing = max(self.ageing, key[0])

    def insert_v(self, req):
        if self.brrip_shift is None:
            return self.m - 1
        return self.m - 1 if bimodal(req.path[-1], self.brrip_shift) \
            else self.m

    def set_keys(self, req, path):
        depth = self.paths.depth
        now = req.now
        a = self.ageing
        v_new = self.insert_v(req)
        for i, p in enumerate(path):
            v = 0 if i < req.matched else v_new
            self.key[p] = (a + self.m - v, now, -depth[p])


class Drrip(Rrip):
    """DRRIP: SRRIP and BRRIP (2**-5 long insertions) dueling through
    sampled flat shadows, each shadow with its own ageing count."""

    name = "drrip"

    def __init__(self, m=3, shift=5):
        super().__init__(m)
        self.shift = shift

    def bind(self, tree):
        super().bind(tree)
        self.duel = Dueling(self.paths, 2, tree.capacity)

    def set_keys(self, req, path):
        depth = self.paths.depth
        now = req.now
        m = self.m
        long_tail = bimodal(req.path[-1], self.shift)
        duel = self.duel
        sampled = duel.sampler.sampled(req.path)
        for j, s in enumerate(duel.shadows):
            if not sampled:
                break
            a = s.last_victim[0] if s.last_victim else 0
            v_new = m - 1 if (j == 0 or long_tail) else m
            s.serve([(q, (a + m, now, -depth[q]),
                      (a + m - v_new, now, -depth[q])) for q in sampled])
        duel.end_request()
        a = self.ageing
        v_new = m - 1 if (duel.choice == 0 or long_tail) else m
        for i, p in enumerate(path):
            v = 0 if i < req.matched else v_new
            self.key[p] = (a + m - v, now, -depth[p])

    def stats(self):
        return {"switches": self.duel.switches}


class Gdsf(KeyedPolicy):
    """GreedyDual-Size-Frequency: key L + frequency * cost / size, where L
    is the key of the last victim (the inflation clock); size is one page.

    cost(depth) = 1 for `gdsf` (then it is LFU with dynamic ageing); the
    prefix-aware `pgdsf` (RAGCache's PGDSF adapted to one-page blocks)
    charges the recomputation of a block by its position: the linear
    layers cost the same for every block and attention grows with the
    prefix, about depth / 48 of the linear part at 512-token blocks and a
    4096-wide model, so cost = 1 + depth / 48.
    """

    name = "gdsf"

    def __init__(self, prefix_cost=False):
        self.prefix_cost = prefix_cost
        if prefix_cost:
            self.name = "pgdsf"

    def bind(self, tree):
        super().bind(tree)
        self.clock = 0.0
        self.freq = {}

    def evicted_key(self, key):
        self.clock = key[0]

    def on_evict(self, p):
        super().on_evict(p)
        del self.freq[p]

    def set_keys(self, req, path):
        depth = self.paths.depth
        freq = self.freq
        for i, p in enumerate(path):
            f = freq[p] + 1 if i < req.matched else 1
            freq[p] = f
            d = depth[p]
            cost = 1.0 + d / 48.0 if self.prefix_cost else 1.0
            self.key[p] = (self.clock + f * cost, req.now, -d)


class LfuAging(KeyedPolicy):
    """LFU with ageing: each touch adds one to a node's count, and every
    `period` requests all counts halve (lazily: a count stored at epoch e
    is worth count / 2**(E - e) at epoch E, so comparing count * 2**e
    compares current counts). Ties: least recently used, then deeper."""

    name = "lfu_aging"

    def __init__(self, period=2048):
        self.period = period

    def bind(self, tree):
        super().bind(tree)
        self.count = {}

    def on_evict(self, p):
        super().on_evict(p)
        del self.count[p]

    def set_keys(self, req, path):
        depth = self.paths.depth
        epoch = req.now // self.period
        for i, p in enumerate(path):
            c = 0.0
            if i < req.matched:
                c0, e0 = self.count[p]
                c = c0 / (1 << (epoch - e0))
            c += 1.0
            self.count[p] = (c, epoch)
            self.key[p] = (c * (1 << epoch), req.now, -depth[p])


class S3Fifo(Policy):
    """S3-FIFO (Yang et al., SOSP 2023) on the tree.

    A small FIFO S (10 % of the pages), a main FIFO M and a ghost FIFO G
    of path ids evicted from S (as many entries as M's share). New blocks
    enter M when G remembers them, else S. A match adds one to the node's
    count (at most 3). Making room: while S holds at least its share,
    S's oldest node moves to M when its count exceeds 1, is evicted to G
    when it is an unpinned leaf, and otherwise (a parent of cached nodes,
    or pinned) moves to M or S's back; else M's oldest node with a
    positive count loses one and goes to M's back, and one at zero is
    evicted when it is an unpinned leaf, or goes to M's back.
    """

    name = "s3fifo"

    def __init__(self, small=0.1, move_above=1):
        self.small = small
        self.move_above = move_above

    def bind(self, tree):
        super().bind(tree)
        cap = tree.capacity or 1
        self.small_cap = max(1, int(cap * self.small))
        self.ghost_cap = max(1, cap - self.small_cap)
        self.queue = {}     # p -> (0 for S or 1 for M, seq)
        self.freq = {}
        self.fifo = ([], [])
        self.size = [0, 0]
        self.seq = 0
        self.ghost = collections.OrderedDict()

    def _put(self, p, q):
        self.seq += 1
        self.queue[p] = (q, self.seq)
        heapq.heappush(self.fifo[q], (self.seq, p))

    def on_insert(self, p, req):
        if p in self.ghost:
            del self.ghost[p]
            q = 1
        else:
            q = 0
        self.freq[p] = 0
        self.size[q] += 1
        self._put(p, q)

    def on_commit(self, req):
        freq = self.freq
        for p in req.path[:req.matched]:
            freq[p] = min(3, freq[p] + 1)

    def _pop(self, q):
        h = self.fifo[q]
        while h:
            s, p = heapq.heappop(h)
            if self.queue.get(p) == (q, s):
                return p
        return None

    def _evict(self, p, q):
        del self.queue[p]
        del self.freq[p]
        self.size[q] -= 1
        if q == 0:
            self.ghost[p] = None
            while len(self.ghost) > self.ghost_cap:
                self.ghost.popitem(last=False)
        return p

    def victim(self, req):
        tree = self.tree
        budget = 4 * (self.size[0] + self.size[1]) + 8
        while budget > 0:
            budget -= 1
            use_s = self.size[0] > 0 and (self.size[0] >= self.small_cap
                                          or self.size[1] == 0)
            if use_s:
                p = self._pop(0)
                if p is None:
                    continue
                if self.freq[p] > self.move_above or (
                        not tree.evictable(p) and p not in tree.pinned):
                    self.size[0] -= 1
                    self.size[1] += 1
                    self._put(p, 1)
                elif tree.evictable(p):
                    return self._evict(p, 0)
                else:
                    self._put(p, 0)  # pinned: to S's back
            else:
                p = self._pop(1)
                if p is None:
                    if self.size[0] == 0:
                        return None
                    continue
                if self.freq[p] > 0:
                    self.freq[p] -= 1
                    self._put(p, 1)
                elif tree.evictable(p):
                    return self._evict(p, 1)
                else:
                    self._put(p, 1)
        return None


class Arc(Policy):
    """ARC (Megiddo and Modha, FAST 2003) on the tree.

    T1 holds blocks touched once since they were cached, T2 blocks matched
    again; ghosts B1 and B2 remember path ids evicted from each. A new
    block found in B1 grows T1's target p by max(1, |B2| / |B1|) and one
    found in B2 shrinks it by max(1, |B1| / |B2|); either goes to T2,
    others to T1. The victim is T1's least recently used leaf when
    |T1| > p (or |T1| = p and the request's first new block is in B2),
    else T2's; the other list's when that one has no unpinned leaf.
    Ghost sizes: |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
    """

    name = "arc"

    def bind(self, tree):
        super().bind(tree)
        self.c = tree.capacity or (1 << 60)
        self.where = {}
        self.time = {}
        self.heaps = {1: LeafHeap(), 2: LeafHeap()}
        self.n = {1: 0, 2: 0}
        self.b = {1: collections.OrderedDict(), 2: collections.OrderedDict()}
        self.p = 0.0
        self.first_new_in_b2 = False

    def _keyof(self, lst):
        where, time = self.where, self.time
        return lambda p: time[p] if where.get(p) == lst else None

    def on_request(self, req):
        self.first_new_in_b2 = (req.want > 0
                                and req.path[req.matched] in self.b[2])

    def victim(self, req):
        n1 = self.n[1]
        prefer = 1 if n1 > 0 and (n1 > self.p or (
            self.first_new_in_b2 and n1 >= self.p)) else 2
        for lst in (prefer, 3 - prefer):
            e = self.heaps[lst].pop(self.tree, self._keyof(lst))
            if e is not None:
                return e[1]
        return None

    def on_evict(self, p):
        lst = self.where.pop(p)
        del self.time[p]
        self.n[lst] -= 1
        self.b[lst][p] = None
        b1, b2 = self.b[1], self.b[2]
        while self.n[1] + len(b1) > self.c and b1:
            b1.popitem(last=False)
        while self.n[1] + self.n[2] + len(b1) + len(b2) > 2 * self.c:
            (b2 if b2 else b1).popitem(last=False)

    def on_leaf(self, p):
        lst = self.where[p]
        self.heaps[lst].push(p, self.time[p])

    def on_insert(self, p, req):
        b1, b2 = self.b[1], self.b[2]
        if p in b1:
            self.p = min(self.c, self.p + max(1.0, len(b2) / len(b1)))
            del b1[p]
            lst = 2
        elif p in b2:
            self.p = max(0.0, self.p - max(1.0, len(b1) / len(b2)))
            del b2[p]
            lst = 2
        else:
            lst = 1
        self.where[p] = lst
        self.n[lst] += 1

    def on_commit(self, req):
        depth = self.paths.depth
        path = req.path[:req.matched + req.granted]
        for i, p in enumerate(path):
            if i < req.matched and self.where[p] == 1:
                self.where[p] = 2
                self.n[1] -= 1
                self.n[2] += 1
            self.time[p] = mru_key(req.now, depth[p])
        if path:
            last = path[-1]
            self.heaps[self.where[last]].push(last, self.time[last])


class TurnHistory:
    """Which requests continue an earlier one, and how many times over.

    Remembers the last `size` requests' tails: a request's tail is the
    path id of its second-to-last block (its only block for a one-block
    prompt), the last block that a longer prompt extending it contains
    (the last block is usually partial). A request continues an earlier
    one when its path holds a remembered tail; its turn is then that
    request's turn + 1 (at most 3), else 0, and the tail found is
    forgotten (a prefix shared by many requests counts as continued once).
    The lookup scans the path from the deepest block up to the one before
    the deepest matched one (a prompt may repeat an earlier one in full,
    its tail then being the block before its last match): a tail still
    cached is matched, an evicted one is not.
    """

    def __init__(self, size=2048):
        self.size = size
        self.turn = {}   # tail -> (turn, serial of the request that left it)
        self.ring = collections.deque()  # (tail, serial), oldest first
        self.serial = 0

    def turn_of(self, path, matched):
        turn = self.turn
        for i in range(len(path) - 1, max(0, matched - 2) - 1, -1):
            e = turn.pop(path[i], None)
            if e is not None:
                return min(3, e[0] + 1)
        return 0

    @staticmethod
    def tail(path):
        """A request's tail: its second-to-last block (one-block: its only)."""
        return path[-2] if len(path) > 1 else path[-1]

    def record(self, path, t):
        tail = self.tail(path)
        self.serial += 1
        self.turn[tail] = (t, self.serial)
        self.ring.append((tail, self.serial))
        if len(self.ring) > self.size:
            old, serial = self.ring.popleft()
            e = self.turn.get(old)
            if e is not None and e[1] == serial:
                del self.turn[old]


class ReusePredictor(KeyedPolicy):
    """A SHiP-style reuse predictor (Wu et al., MICRO 2011) with
    per-conversation signatures learned online.

    Signature of a request's new blocks: its turn (TurnHistory) and its
    length class (< 4, < 32, more blocks), 12 in all, each with a
    saturating counter 0..7 (start 3). A new block that is matched later
    adds one to its signature's counter (once); one evicted without a
    match takes one off. New blocks become most recently used when their
    counter is above 0 or for a 2**-5 share of requests (so that a
    signature at 0 can recover), else they go in at the LRU end.
    """

    name = "reuse_pred"

    def bind(self, tree):
        super().bind(tree)
        self.history = TurnHistory()
        self.counter = [3] * 12
        self.sig = {}
        self.reused = {}
        self.req_sig = 0

    def on_request(self, req):
        t = self.history.turn_of(req.path, req.matched)
        self.history.record(req.path, t)
        n = len(req.path)
        self.req_sig = t * 3 + (0 if n < 4 else 1 if n < 32 else 2)

    def on_evict(self, p):
        super().on_evict(p)
        s = self.sig.pop(p)
        if not self.reused.pop(p):
            self.counter[s] = max(0, self.counter[s] - 1)

    def set_keys(self, req, path):
        depth = self.paths.depth
        now = req.now
        sig = self.req_sig
        mru = self.counter[sig] > 0 or bimodal(req.path[-1], 5)
        for i, p in enumerate(path):
            if i < req.matched:
                if not self.reused[p]:
                    self.reused[p] = True
                    s = self.sig[p]
                    self.counter[s] = min(7, self.counter[s] + 1)
                self.key[p] = mru_key(now, depth[p])
            else:
                self.sig[p] = sig
                self.reused[p] = False
                self.key[p] = (mru_key if mru else probation_key)(now,
                                                                  depth[p])


class TurnBip(KeyedPolicy):
    """Turn-aware bimodal insertion at one fixed theta (turn_duel without
    the shadows): new blocks of a turn-t request become most recently used
    for a 2**-max(0, theta - 2t) share of requests, else go in at the LRU
    end."""

    name = "turn_bip"

    def __init__(self, theta=5, history=2048):
        self.theta = theta
        self.history_size = history

    def bind(self, tree):
        super().bind(tree)
        self.history = TurnHistory(self.history_size)
        self.turn = 0

    def on_request(self, req):
        self.turn = self.history.turn_of(req.path, req.matched)
        self.history.record(req.path, self.turn)

    def set_keys(self, req, path):
        mru = bimodal(req.path[-1],
                      max(0, self.theta - TURN_STEP * self.turn))
        self.insert_keys(req, path, mru)


TURN_STEP = 2


class TurnDuel(KeyedPolicy):
    """turn_duel: turn-aware bimodal insertion, its strength picked by
    sampled shadows. The specification, for radixkv's tree:

    Per cached block: last_used (as today) and a probation bit.
    Global: the main recency list (as today: unpinned cached blocks, oldest
      first, each older than its parent); a probation stack of unpinned
      cached blocks (latest pushed on top); a TurnHistory of H = 2048
      entries (a ring of 8-byte block-key fingerprints with a 2-bit turn,
      and a hash index over it); K = 10 shadows, one per theta = 0 .. 9;
      the current theta (starts at 0).
    Acquire of n blocks matching m (0-based positions):
      1. Turn t: look up the prompt's block keys from position n-1 down to
         max(0, m-2) in the history; the first found gives t = min(3, its
         turn + 1) and is removed from the index; none found: t = 0. Then
         record the request's tail (position n-2, or 0 when n = 1) with t.
      2. Admission rule: with s(theta) = max(0, theta - 2t), a request's
         new blocks are admitted under theta when the low s bits of the
         hash of its last block's key are all zero (a 2**-s share of the
         requests of turn t; s = 0: always).
      3. Shadows (below) see the request; then theta becomes the best
         shadow's when that one's score S beats the current theta's by a
         lead L > 2 % of it with L**2 > 4 S (two standard deviations of a
         Poisson count: the first requests' few hits cannot move it).
      4. Pages: each new block needs one; when none is free the victim is
         the top of the probation stack, or when the stack is empty the
         head of the main list (both are unpinned leaves: a probation
         block's cached children were pushed after it, and a block gets a
         child in the main list only by being matched, which moves it
         there).
    Commit + release: matched blocks leave the probation stack if on it
      and go to the main list's newest end with last_used = now, as
      today; when the request is admitted under the current theta its new
      blocks join them there (every block older than its parent, as
      today); otherwise the new blocks are pushed on the probation stack
      root side first, so the deepest is on top.
    Shadows: a sampling rate r = max(1, floor(C / 512)) for a pool of C
      pages; a block is sampled when hash(key) < 2**32 / r. Shadow k holds
      at most floor(C / r) sampled fingerprints with the same two
      structures and plays theta = k on the sampled blocks of each
      request: held ones are hits (score += 1) and move to its main
      list's newest end; the others replace, one each, its probation top
      or else its main head, and go in as the cache's new blocks do,
      under theta = k. Every request all scores are multiplied by
      1 - 1e-4.
    Cost: O(1) per block for the history and each shadow, O(1) per
      eviction; 1 bit per block; about 10 x 512 x 24 bytes of shadows plus
      H x 16 bytes of history, whatever the pool's size.
    Tiers of T blocks below the pool (Tree.lower_blocks): a second set of K
      shadows, sampled at the rate for a cache of C + T pages, duels the
      same way on every request and picks theta_T. A request's new blocks
      that go on probation are marked for the tier when the request is
      admitted under theta_T. An evicted block goes to the tier unless it
      is on probation and unmarked: a block the pool judged not worth its
      room may still be worth the larger room of the pool and tier
      together. Without tiers, or with tiers of unknown size, every
      evicted block goes to the tier.
    theta = 0 is leaf-LRU exactly, and shadow 0 estimates leaf-LRU's hits
      on the same requests, so the cache leaves LRU only for a theta whose
      shadow has scored better.
    """

    name = "turn_duel"

    def __init__(self, thetas=tuple(range(10)), history=2048,
                 shadow_size=512, decay=1e-4, margin=0.02):
        self.thetas = thetas
        self.history_size = history
        self.shadow_size = shadow_size
        self.decay = decay
        self.margin = margin

    def bind(self, tree):
        super().bind(tree)
        self.history = TurnHistory(self.history_size)
        self.duel = Dueling(self.paths, len(self.thetas), tree.capacity,
                            self.shadow_size, self.decay, self.margin,
                            shadow=ListShadow)
        self.turn = 0
        self.theta_requests = collections.Counter()
        self.tier_duel = None
        self.tier_keep = {}
        self.tier_theta_requests = collections.Counter()
        if tree.lower_blocks and tree.capacity:
            self.tier_duel = Dueling(self.paths, len(self.thetas),
                                     tree.capacity + tree.lower_blocks,
                                     self.shadow_size, self.decay,
                                     self.margin, shadow=ListShadow)

    def on_request(self, req):
        self.turn = self.history.turn_of(req.path, req.matched)
        self.history.record(req.path, self.turn)

    def admitted(self, theta, last_hash):
        return bimodal_hash(last_hash, max(0, theta - TURN_STEP * self.turn))

    def play(self, duel, req, last_hash, counts):
        """Serves the request to `duel`'s shadows, then returns whether the
        request is admitted under the theta the duel picks."""
        sampled = duel.sampler.sampled(req.path)
        if sampled:
            for theta, s in zip(self.thetas, duel.shadows):
                s.serve(sampled, self.admitted(theta, last_hash))
        duel.end_request()
        theta = self.thetas[duel.choice]
        counts[theta] += 1
        return self.admitted(theta, last_hash)

    def set_keys(self, req, path):
        last_hash = self.paths.admit_hash[req.path[-1]]
        mru = self.play(self.duel, req, last_hash, self.theta_requests)
        keep = True
        if self.tier_duel is not None:
            keep = self.play(self.tier_duel, req, last_hash,
                             self.tier_theta_requests)
        self.insert_keys(req, path, mru)
        if not mru:
            for p in path[req.matched:]:
                self.tier_keep[p] = keep
                self.tier_keep[p] = keep

    def demote(self, p):
        """A block on probation (a key below every mru_key: its request was
        not admitted and no request has matched it since) is dropped, the
        others go to the tier."""
        return self.key[p] >= 0 or self.tier_keep.get(p, True)

    def on_evict(self, p):
        super().on_evict(p)
        self.tier_keep.pop(p, None)

    def stats(self):
        out = {"switches": self.duel.switches,
               "theta_requests": dict(sorted(self.theta_requests.items()))}
        if self.tier_duel is not None:
            out["tier_switches"] = self.tier_duel.switches
            out["tier_theta_requests"] = dict(sorted(
                self.tier_theta_requests.items()))
        return out


class ContinuedOracle(KeyedPolicy):
    """Not an online policy: the bound a perfect continuation predictor
    reaches in leaf-LRU order. It knows which requests a later request
    continues (holds the request's tail, as TurnHistory defines it, with
    unbounded memory); their new blocks become most recently used, the
    others go in at the LRU end, as turn_duel's unadmitted ones do.
    """

    name = "continued_oracle"
    continued = None

    def see_future(self, paths):
        """paths: every request's path ids, in the order served."""
        latest = {}  # tail -> index of the latest request leaving it
        self.continued = [False] * len(paths)
        for j, path in enumerate(paths):
            for p in reversed(path):
                i = latest.pop(p, None)
                if i is not None:
                    self.continued[i] = True
                    break
            if path:
                latest[TurnHistory.tail(path)] = j

    def set_keys(self, req, path):
        assert self.continued is not None, "run_policy calls see_future()"
        mru = self.continued[req.now - 1]
        self.insert_keys(req, path, mru)


# Every policy of the comparison, by name, with the parameters used for
# every workload and capacity.
POLICIES = collections.OrderedDict([
    ("lru", Lru),
    ("depth_lru", lambda: DepthLru(20)),
    ("bip", lambda: Bip(2)),
    ("dip", lambda: Dip(5)),
    ("srrip", lambda: Rrip(3)),
    ("drrip", lambda: Drrip(3, 5)),
    ("lfu_aging", lambda: LfuAging(2048)),
    ("gdsf", lambda: Gdsf(False)),
    ("pgdsf", lambda: Gdsf(True)),
    ("s3fifo", lambda: S3Fifo(0.1, 1)),
    ("arc", Arc),
    ("reuse_pred", ReusePredictor),
    ("turn_bip", lambda: TurnBip(5)),
    ("turn_duel", TurnDuel),
    ("continued_oracle", ContinuedOracle),
])


# --------------------------------------------------------------------------
# Runs, the comparison matrix and the self test.

WORKLOADS_DIR = os.path.join(HERE, "..", "workloads")
CAPACITIES = (1000, 3000, 9000)
SHAPES = ("agent", "rag", "oneshot", "chat")


def run_policy(name, requests, capacity, keyer=None, tier=0,
               demote_all=False):
    """Replays `requests` (lists of hash_ids) under POLICIES[name]; with a
    BlockKeyer, hashing on radixkvd's block keys. tier > 0: a tier of that
    many blocks below the pool (tiered_sim.LruTier), which receives the
    victims the policy demotes, or every victim with demote_all."""
    paths = Paths(keyer)
    policy = POLICIES[name]()
    if demote_all:
        policy.demote = lambda p: True
    lower = tiered_sim.LruTier(tier) if tier else None
    if hasattr(policy, "see_future"):
        policy.see_future([paths.path_of(h) for h in requests])
    sim = Sim(policy, capacity, paths, lower)
    for hash_ids in requests:
        sim.request(hash_ids)
    out = {
        "policy": name,
        "capacity": capacity,
        "requests": sim.now,
        "blocks": sim.blocks,
        "matched_blocks": sim.matched,
        "hit_ratio": sim.hit_ratio(),
        "evicted": sim.evicted,
        "stats": sim.policy.stats(),
    }
    if tier:
        out.update({"tier": tier, "demoted": sim.demoted,
                    "declined": sim.declined, "promoted": sim.promoted})
    return out


def load_workload(name, trace, seed):
    """The requests of a workload: "conversation" is the trace file, the
    others are bench/workloads/gen.py's shapes with their defaults."""
    if name == "conversation":
        return list(read_trace(trace))
    sys.path.insert(0, os.path.abspath(WORKLOADS_DIR))
    import gen
    parser = argparse.ArgumentParser()
    shape_parsers = gen.add_shape_args(parser.add_subparsers(dest="shape"))
    a = shape_parsers[name].parse_args(["--seed", str(seed)])
    records = gen.SHAPES[name](a, gen.random.Random(seed))
    return [r["hash_ids"] for r in records]


_LOADED = {}


def _cell(job):
    """One matrix cell in a worker: (policy or "optimum", workload, cap)."""
    name, workload, capacity, trace, seed = job
    if workload not in _LOADED:
        _LOADED.clear()
        _LOADED[workload] = load_workload(workload, trace, seed)
    requests = _LOADED[workload]
    start = time.time()
    if name == "optimum":
        r = optimum_sim.run_requests(requests, capacity)
        r["stats"] = {}
    else:
        r = run_policy(name, requests, capacity)
    r["seconds"] = time.time() - start
    return name, workload, capacity, r


def matrix(args):
    """Every policy and the optimum on every workload and capacity; returns
    the Markdown report."""
    import multiprocessing
    workloads = ["conversation"] + list(SHAPES)
    names = args.policies.split(",") if args.policies else list(POLICIES)
    if "lru" not in names:
        names.insert(0, "lru")
    jobs = [(n, w, c, args.trace, args.seed)
            for w in workloads for n in ["optimum"] + names
            for c in CAPACITIES]
    results = {}
    with multiprocessing.Pool(args.jobs) as pool:
        for name, w, c, r in pool.imap_unordered(_cell, jobs):
            results[(name, w, c)] = r
            print("%-10s %-12s %5d  hit %.4f  %.0fs" % (
                name, w, c, r["hit_ratio"], r["seconds"]),
                file=sys.stderr, flush=True)
    return report(results, names, workloads, args)


def report(results, names, workloads, args):
    cmd = "bench/sim/policy_sim.py --matrix --jobs=%d --seed=%d" % (
        args.jobs, args.seed)
    if args.policies:
        cmd += " --policies=" + args.policies
    cmd += " --out=" + os.path.relpath(args.out) if args.out else ""
    lines = [
        "# Eviction policies for the prefix tree, by simulation",
        "",
        "Generated file. Command: `%s` (conversation trace: "
        "build/default/data/conversation_trace.jsonl; the other workloads "
        "are `bench/workloads/gen.py SHAPE --seed=%d` with its defaults)."
        % (cmd, args.seed),
        "",
        "Each cell: hit ratio in % of blocks, and in parentheses the share "
        "of the offline optimum (bench/sim/optimum_sim.py) it reaches. "
        "Capacities in pages (one block each). The last column is the "
        "policy's worst difference from leaf-LRU over all 15 cells, in "
        "points of hit ratio. Policies: bench/sim/policy_sim.py "
        "(POLICIES); one parameter set for every workload.",
        "",
    ]
    head = "| policy |"
    rule = "|---|"
    for w in workloads:
        for c in CAPACITIES:
            head += " %s %dk |" % (w, c // 1000)
            rule += "---:|"
    head += " worst vs LRU |"
    rule += "---:|"
    lines += [head, rule]
    for name in ["optimum"] + names:
        row = "| %s |" % name
        worst = None
        for w in workloads:
            for c in CAPACITIES:
                h = results[(name, w, c)]["hit_ratio"]
                opt = results[("optimum", w, c)]["hit_ratio"]
                lru = results[("lru", w, c)]["hit_ratio"]
                frac = 100.0 * h / opt if opt else 0.0
                row += " %.2f (%.0f) |" % (100 * h, frac)
                d = 100 * (h - lru)
                worst = d if worst is None else min(worst, d)
        row += " %+.2f |" % worst if name != "optimum" else " |"
        lines.append(row)
    lines.append("")
    sel = [(w, c, results[("turn_duel", w, c)]["stats"])
           for w in workloads for c in CAPACITIES
           if ("turn_duel", w, c) in results]
    if sel:
        lines += ["turn_duel's theta (requests served at each) and "
                  "switches:", ""]
        for w, c, st in sel:
            lines.append("- %s %dk: %s, %d switches" % (
                w, c // 1000, st.get("theta_requests"), st.get("switches")))
        lines.append("")
    return "\n".join(lines)


def self_test(trace):
    """Raises AssertionError on a wrong answer."""
    import random

    # lru is leaf_lru_sim.py's policy exactly, on random small traces ...
    rng = random.Random(11)
    for _ in range(300):
        reqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 7))]
                for _ in range(rng.randrange(1, 40))]
        cap = rng.randrange(1, 8)
        ref = LeafLruCache(cap)
        want = [ref.request(r, t + 1) for t, r in enumerate(reqs)]
        sim = Sim(Lru(), cap)
        got = [sim.request(r) for r in reqs]
        assert got == want, (reqs, cap, got, want)

    # ... and on the conversation trace at the three capacities.
    requests = list(read_trace(trace))
    for cap in CAPACITIES:
        ref = LeafLruCache(cap)
        want = sum(ref.request(r, t + 1) for t, r in enumerate(requests))
        got = run_policy("lru", requests, cap)["matched_blocks"]
        assert got == want, ("lru differs from leaf_lru_sim", cap, got, want)

    # Every policy keeps the tree's rules (Sim asserts each victim is an
    # unpinned cached leaf and the size bound), is deterministic, equals
    # unbounded LRU without a bound and stays within the optimum.
    for _ in range(60):
        reqs = [[rng.randrange(3) for _ in range(rng.randrange(1, 8))]
                for _ in range(rng.randrange(1, 60))]
        cap = rng.randrange(1, 10)
        opt = optimum_sim.run_requests(reqs, cap)["matched_blocks"]
        unbounded = run_policy("lru", reqs, 0)["matched_blocks"]
        for name in POLICIES:
            a = run_policy(name, reqs, cap)["matched_blocks"]
            b = run_policy(name, reqs, cap)["matched_blocks"]
            assert a == b, (name, "not deterministic")
            assert a <= opt, (name, reqs, cap, a, opt)
            assert run_policy(name, reqs, 0)["matched_blocks"] == unbounded

    # turn_duel's shadow of theta = 0 at sampling rate 1 is leaf-LRU
    # exactly, and turn_duel restricted to theta = 0 is leaf-LRU.
    for _ in range(100):
        reqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 7))]
                for _ in range(rng.randrange(1, 50))]
        cap = rng.randrange(1, 8)
        lru = run_policy("lru", reqs, cap)["matched_blocks"]
        pol = TurnDuel()
        sim = Sim(pol, cap)
        for r in reqs:
            sim.request(r)
        assert pol.duel.shadows[0].hits == lru, (reqs, cap)
        sim = Sim(TurnDuel(thetas=(0,)), cap)
        assert sum(sim.request(r) for r in reqs) == lru

    # With a tier below the pool, lru is tiered_sim's two-tier cache
    # exactly and offers the tier every victim; turn_duel at theta = 0
    # admits every request, so it too demotes every victim.
    for _ in range(100):
        reqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 7))]
                for _ in range(rng.randrange(1, 50))]
        cap = rng.randrange(1, 8)
        tier = rng.randrange(1, 12)
        want = tiered_sim.TwoTierCache(cap, tier)
        want = sum(want.request(r, t + 1) for t, r in enumerate(reqs))
        got = run_policy("lru", reqs, cap, tier=tier)
        assert got["matched_blocks"] == want, (reqs, cap, tier)
        assert got["declined"] == 0 and got["demoted"] == got["evicted"]
        sim = Sim(TurnDuel(thetas=(0,)), cap, tier=tiered_sim.LruTier(tier))
        assert sum(sim.request(r) for r in reqs) == want
        assert sim.declined == 0
    # turn_duel drops only victims on probation, and only those its tier
    # duel would not admit: with both duels forced to theta = 9, most of a
    # one-shot stream's blocks wait on probation and never reach the tier;
    # over a tier of unknown size (a SharedStore has no capacity) or with
    # demote_all every victim does.
    stream = [[b, b + 1000] for b in range(200)]
    sim = Sim(TurnDuel(thetas=(9,)), 20, tier=tiered_sim.LruTier(50))
    for r in stream:
        sim.request(r)
    assert sim.evicted > 0 and sim.declined + sim.demoted == sim.evicted
    assert sim.declined > sim.demoted, (sim.declined, sim.demoted)
    everything = TurnDuel(thetas=(9,))
    everything.demote = lambda p: True
    for pol, lower in ((TurnDuel(thetas=(9,)), tiered_sim.SharedStore()),
                       (everything, tiered_sim.LruTier(50))):
        sim = Sim(pol, 20, tier=lower)
        for r in stream:
            sim.request(r)
        assert sim.declined == 0 and sim.demoted == sim.evicted

    # TurnHistory: a request extending an earlier one's second-to-last
    # block is its next turn; a tail continues once.
    paths = Paths()
    h = TurnHistory(4)
    turns = []
    for r in ([0, 1, 2], [0, 1, 5, 6], [0, 1, 5, 7, 8], [0, 1, 9],
              [0, 1, 5, 7, 8]):
        p = paths.path_of(r)
        t = h.turn_of(p, 0)
        h.record(p, t)
        turns.append(t)
    assert turns == [0, 1, 2, 0, 3], turns
    # A ring of 4 forgets the fifth request back.
    for r in ([1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [1, 2, 3]):
        p = paths.path_of(r)
        t = h.turn_of(p, 0)
        h.record(p, t)
    assert t == 0, t

    # Bimodal insertion keeps a share of a stream resident: a cyclic scan
    # one block longer than the pool gets no hits under LRU, some under
    # bip, and turn_duel leaves LRU for it.
    scan = [[b] for b in range(30)] * 40
    assert run_policy("lru", scan, 20)["matched_blocks"] == 0
    assert run_policy("bip", scan, 20)["matched_blocks"] > 0
    assert run_policy("turn_duel", scan, 20)["matched_blocks"] > 0

    # continued_oracle keeps the request that a later one continues: A is
    # continued by the last request, B and C are not; C's pages come from
    # A under LRU (the oldest), from B under the oracle.
    reqs = [[1, 2, 3], [5, 6, 7], [8, 9], [1, 2, 3, 4]]
    for name, want in (("lru", 1), ("continued_oracle", 3)):
        got = run_policy(name, reqs, 6)["matched_blocks"]
        assert got == want, (name, got)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--policy", default="lru", choices=list(POLICIES))
    parser.add_argument("--capacity", type=int, default=3000,
                        help="pages in the pool; 0 = unbounded")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--matrix", action="store_true",
                        help="every policy x workload x capacity, with the "
                        "optimum, as a Markdown table")
    parser.add_argument("--policies", default="",
                        help="--matrix: comma-separated subset (lru always)")
    parser.add_argument("--seed", type=int, default=1,
                        help="--matrix: gen.py seed of the generated shapes")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="",
                        help="--matrix: write the table here too")
    parser.add_argument("--self_test", action="store_true")
    parser.add_argument("--block_keys", type=int, default=0,
                        metavar="PAGE_SIZE",
                        help="hash on the block keys that bench/replay gives "
                        "radixkvd for the trace at this page size, as the "
                        "tree does (needs NumPy and xxhash: run with the "
                        "project's venv)")
    parser.add_argument("--tiny_layout", action="store_true",
                        help="--block_keys: the keys of replay "
                        "--tiny_layout's namespace")
    parser.add_argument("--tier", type=int, default=0,
                        help="blocks in a tier below the pool (0: none)")
    parser.add_argument("--demote_all", action="store_true",
                        help="--tier: every victim goes to the tier, "
                        "whatever the policy says")
    args = parser.parse_args(argv)
    if args.self_test:
        self_test(args.trace)
        print("self test: ok")
        return 0
    if args.matrix:
        text = matrix(args)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        return 0
    if args.capacity < 0:
        parser.error("--capacity must be >= 0, got %d" % args.capacity)
    if args.block_keys < 0 or args.block_keys > 65536:
        parser.error("--block_keys must be a page size in [1, 65536] (0: "
                     "off), got %d" % args.block_keys)
    if args.tier < 0:
        parser.error("--tier must be >= 0, got %d" % args.tier)
    if args.tier and not args.capacity:
        parser.error("--tier needs a bounded pool (--capacity > 0)")
    keyer = (BlockKeyer(args.block_keys, args.tiny_layout)
             if args.block_keys else None)
    r = run_policy(args.policy, list(read_trace(args.trace)), args.capacity,
                   keyer, args.tier, args.demote_all)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print("%s capacity %s: requests %d blocks %d matched %d hit_ratio "
              "%.6f evicted %d %s" % (
                  r["policy"], r["capacity"] or "unbounded", r["requests"],
                  r["blocks"], r["matched_blocks"], r["hit_ratio"],
                  r["evicted"], r["stats"] or ""))
        if args.tier:
            print("tier %d: demoted %d declined %d promoted %d" % (
                r["tier"], r["demoted"], r["declined"], r["promoted"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
