#!/usr/bin/env python3
"""Offline optimum of a prefix cache on a trace: the yardstick for eviction.

Replays a Mooncake-format trace (bench/data/README.md) in arrival order
with the same request model as bench/sim/leaf_lru_sim.py (match the longest
cached prefix, pin it, take one page per unmatched block, commit), but with
full knowledge of the future (Belady's rule, made tree-aware):

  * Every block's next use is known: the next request whose path holds it.
    A block's next use is never earlier than its parent's (every request
    that uses a block uses its parent), so a farthest-next-use block can
    always be found among the leaves: only leaves are evicted, and the
    cached set stays a tree of prefixes.
  * When a page is needed, the cached, unpinned leaf whose next use is
    farthest away is the victim (ties: the deeper one).
  * Bypass: a new block is cached only if it will be used again, and only
    if its next use is sooner than the victim's. A block that is not cached
    ends its request's commit, since no later block of the path can match
    without it.

It is the classical optimum of single-size caching (evict the farthest
next use, with bypass), applied under the tree's constraints; reported
hit ratios are "the offline optimum" in docs/BENCHMARKS.md and every
online policy is given as a fraction of it.

Standard library only.

  bench/sim/optimum_sim.py --capacity=3000 [--json] [--trace=PATH]
  bench/sim/optimum_sim.py --self_test

capacity 0 (the default) means unbounded: every repeated prefix hits.
"""

import argparse
import heapq
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from leaf_lru_sim import DEFAULT_TRACE, LeafLruCache, read_trace  # noqa: E402

NEVER = float("inf")


def build_paths(requests):
    """Names every block by its whole path (parent node, block id).

    Returns (paths, uses): paths[t] is request t's list of node ids, and
    uses[node] the increasing list of request indices whose path holds the
    node.
    """
    child = {}
    uses = [[]]  # node 0 is the root
    paths = []
    for t, hash_ids in enumerate(requests):
        node = 0
        path = []
        for block_id in hash_ids:
            key = (node, block_id)
            nxt = child.get(key)
            if nxt is None:
                nxt = len(uses)
                child[key] = nxt
                uses.append([])
            uses[nxt].append(t)
            path.append(nxt)
            node = nxt
        paths.append(path)
    return paths, uses


class OptimumCache:
    """The cache state under the offline rule; nodes come from build_paths."""

    def __init__(self, capacity, uses):
        self.capacity = capacity  # 0: unbounded
        self.uses = uses
        self.cursor = [0] * len(uses)     # index of the next use in uses[n]
        self.cached = bytearray(len(uses))
        self.children = [0] * len(uses)   # cached children per node
        self.parent = {}                  # cached node -> parent node
        self.depth = {}
        self.size = 0
        self.heap = []                    # (-next_use, -depth, node): leaves
        self.evicted = 0
        self.bypassed = 0

    def _next_use(self, node):
        c = self.cursor[node]
        u = self.uses[node]
        return u[c] if c < len(u) else NEVER

    def _advance(self, node, now):
        """Moves node's next use past request `now` (it is used now)."""
        u = self.uses[node]
        c = self.cursor[node]
        while c < len(u) and u[c] <= now:
            c += 1
        self.cursor[node] = c

    def _push_if_leaf(self, node):
        if node != 0 and self.cached[node] and self.children[node] == 0:
            heapq.heappush(self.heap,
                           (-self._next_use(node), -self.depth[node], node))

    def _pop_victim(self, pinned):
        """The unpinned leaf used farthest ahead, or None; not removed."""
        held = []
        victim = None
        while self.heap:
            entry = heapq.heappop(self.heap)
            negnext, _, node = entry
            if (not self.cached[node] or self.children[node] != 0
                    or -negnext != self._next_use(node)):
                continue  # stale entry
            if node in pinned:
                held.append(entry)
                continue
            victim = entry
            break
        for entry in held:
            heapq.heappush(self.heap, entry)
        return victim

    def _evict(self, node):
        self.cached[node] = 0
        parent = self.parent.pop(node)
        del self.depth[node]
        self.children[parent] -= 1
        self.size -= 1
        self.evicted += 1
        self._push_if_leaf(parent)

    def request(self, path, now):
        """One Acquire + Commit of the path at time `now`; returns matched."""
        matched = 0
        for node in path:
            if not self.cached[node]:
                break
            matched += 1
        pinned = set(path[:matched])
        for node in path:
            self._advance(node, now)
        for node in path[:matched]:
            self._push_if_leaf(node)  # its next use changed

        parent = path[matched - 1] if matched else 0
        for node in path[matched:]:
            nxt = self._next_use(node)
            if nxt == NEVER:
                self.bypassed += 1
                break
            if self.capacity and self.size >= self.capacity:
                victim = self._pop_victim(pinned)
                if victim is None or -victim[0] <= nxt:
                    if victim is not None:
                        heapq.heappush(self.heap, victim)
                    self.bypassed += 1
                    break
                self._evict(victim[2])
            self.cached[node] = 1
            self.parent[node] = parent
            self.depth[node] = (self.depth[parent] + 1) if parent else 1
            self.children[parent] += 1
            self.size += 1
            pinned.add(node)
            parent = node
        if parent:
            self._push_if_leaf(parent)
        return matched


def run_requests(requests, capacity):
    paths, uses = build_paths(requests)
    cache = OptimumCache(capacity, uses)
    blocks = matched = 0
    for t, path in enumerate(paths):
        blocks += len(path)
        matched += cache.request(path, t)
        if capacity:
            assert cache.size <= capacity, "cache over capacity"
    return {
        "capacity": capacity,
        "requests": len(paths),
        "blocks": blocks,
        "matched_blocks": matched,
        "hit_ratio": matched / blocks if blocks else 0.0,
        "evicted": cache.evicted,
        "bypassed": cache.bypassed,
        "cached_at_end": cache.size,
    }


def self_test():
    """Hand-checked scenarios; raises AssertionError on a wrong answer."""
    def hits(capacity, requests):
        paths, uses = build_paths(requests)
        cache = OptimumCache(capacity, uses)
        return [cache.request(p, t) for t, p in enumerate(paths)], cache

    # Unbounded: every repeated prefix hits; a block never used again is
    # not cached at all.
    got, c = hits(0, [[1, 2, 3], [1, 2, 4], [1, 2, 4, 5]])
    assert got == [0, 2, 3], got
    assert c.size == 3, c.size  # 1, 2, 4: 3 and 5 are never used again
    # LRU would keep [3] (newer) and lose [1]; the optimum keeps [1],
    # whose next use is sooner, and bypasses [3].
    got, _ = hits(1, [[1], [2], [3], [1], [2], [1]])
    assert got == [0, 0, 0, 1, 0, 1], got
    # Farthest next use goes first: with room for 2, [1] and [2] are kept,
    # [3] (used last) is bypassed until the end.
    got, _ = hits(2, [[1], [2], [3], [1], [2], [3], [1], [2]])
    assert got == [0, 0, 0, 1, 1, 0, 1, 1], got
    # Only leaves go: a shared system prompt [9] stays while its children
    # come and go.
    got, _ = hits(2, [[9, 1], [9, 2], [9, 1], [9, 2]])
    assert got == [0, 1, 2, 1], got
    # Equal ids under different parents are different blocks.
    got, _ = hits(0, [[1, 2], [3, 2], [3, 2]])
    assert got == [0, 0, 2], got
    # The optimum is never below leaf-LRU on random small traces.
    import random
    rng = random.Random(7)
    for _ in range(200):
        reqs = [[rng.randrange(3) for _ in range(rng.randrange(1, 5))]
                for _ in range(rng.randrange(1, 30))]
        cap = rng.randrange(1, 6)
        lru = LeafLruCache(cap)
        lru_hits = sum(lru.request(r, t + 1) for t, r in enumerate(reqs))
        opt = run_requests(reqs, cap)["matched_blocks"]
        assert opt >= lru_hits, (reqs, cap, opt, lru_hits)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--capacity", type=int, default=0,
                        help="pages in the pool; 0 = unbounded")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--self_test", action="store_true")
    args = parser.parse_args(argv)
    if args.self_test:
        self_test()
        print("self test: ok")
        return 0
    if args.capacity < 0:
        parser.error("--capacity must be >= 0, got %d" % args.capacity)
    result = run_requests(list(read_trace(args.trace)), args.capacity)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        cap = args.capacity if args.capacity else "unbounded"
        print("capacity %s: requests %d blocks %d matched %d hit_ratio %.6f "
              "evicted %d bypassed %d" % (
                  cap, result["requests"], result["blocks"],
                  result["matched_blocks"], result["hit_ratio"],
                  result["evicted"], result["bypassed"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
