#!/usr/bin/python3
"""Independent simulation of radixkv's two-tier policy: the page pool's
leaf-only LRU (bench/sim/leaf_lru_sim.py) with a tier below it that takes
every block the pool evicts (docs/TIERS.md).

Replays a Mooncake-format trace one request at a time, as one radixkv
client does (Acquire with allocation, then Commit of every new block with
release), and prints the hit ratio: blocks served from the pool or
promoted from the tier, over all blocks.

The policy, stated without reference to how radixkvd implements it:
  * The pool is leaf-LRU exactly as in leaf_lru_sim.py.
  * Acquire matches the longest prefix in the pool and pins it, then takes
    one page per remaining block, evicting the pool's least recently used
    unpinned leaf when full. Each evicted block goes to the tier, in
    eviction order; the tier holds `tier` blocks and, when full, forgets
    the block put (or refreshed) longest ago.
  * After those evictions, the request's next blocks that the tier holds,
    consecutively from the first unmatched one, are promoted: taken out of
    the tier and committed into their new pages. They count as hits.
  * Commit inserts the remaining granted blocks, and the tier forgets any
    of them it holds (the pool's new copy supersedes it: a block is in one
    place); release touches the path.

A block is named by its whole path (every id up to it), so equal ids
under different prefixes are different blocks, in both tiers.

Standard library only. Run with /usr/bin/python3.

  bench/sim/tiered_sim.py --capacity=3000 --tier=30000 [--json] [--trace=PATH]
  bench/sim/tiered_sim.py --self_test
"""

import argparse
import collections
import heapq
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from leaf_lru_sim import DEFAULT_TRACE, read_trace  # noqa: E402


class LruTier(collections.OrderedDict):
    """A node's own tier: `capacity` blocks (0: none), forgetting the block
    put longest ago; a promoted block leaves it, a block the pool caches
    again is forgotten (a block is in one place)."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity

    def put(self, pid):
        if not self.capacity:
            return
        self.pop(pid, None)
        if len(self) >= self.capacity:
            self.popitem(last=False)
        self[pid] = None

    def take(self, pid):
        if pid not in self:
            return False
        del self[pid]
        return True

    def forget(self, pid):
        return self.pop(pid, 0) is None

    def commit(self, pids):
        pass


def serve_new_blocks(tier, new_pids):
    """A request's new blocks (pool pages already granted, in prompt
    order) against the tier: the leading ones it holds are promoted; it
    forgets the others, which the pool caches anew, and commit sees them.
    Returns (promoted, superseded): how many were promoted, and how many of
    the others the tier had to forget."""
    promoted = 0
    while promoted < len(new_pids) and tier.take(new_pids[promoted]):
        promoted += 1
    rest = new_pids[promoted:]
    superseded = sum(1 for pid in rest if tier.forget(pid))
    tier.commit(rest)
    return promoted, superseded


class SharedStore(set):
    """A tier every node shares (radixkvd's remote tier), unbounded: it
    keeps what it is given; a promotion copies and leaves the block, and a
    node caching a block again forgets nothing. With write_all it also
    receives every block a node commits, not only those nodes evict."""

    def __init__(self, write_all=False):
        super().__init__()
        self.write_all = write_all
        self.puts = 0

    def put(self, pid):
        self.puts += 1
        self.add(pid)

    def take(self, pid):
        return pid in self

    def forget(self, pid):
        return False

    def commit(self, pids):
        if self.write_all:
            for pid in pids:
                self.put(pid)


class TwoTierCache:
    """`tier`: a capacity in blocks for a node's own tier, or a tier object
    (SharedStore) with `paths`, the path ids every node of a fleet shares."""

    def __init__(self, capacity, tier, paths=None):
        assert capacity > 0
        self.capacity = capacity
        self.path_ids = {} if paths is None else paths  # (parent, id) -> path id
        self.pool = {}          # path id -> [parent path id, time, children]
        self.heap = []          # (time, -depth, path id): leaf candidates
        self.depth = {0: 0}     # path id -> depth; 0 is the root
        if isinstance(tier, int):
            assert tier >= 0
            tier = LruTier(tier)
        self.tier = tier
        self.evicted = 0
        self.promoted = 0
        self.superseded = 0

    def _path_id(self, parent, block_id):
        key = (parent, block_id)
        pid = self.path_ids.get(key)
        if pid is None:
            pid = len(self.path_ids) + 1
            self.path_ids[key] = pid
        if pid not in self.depth:
            self.depth[pid] = self.depth[parent] + 1
        return pid

    def _push_if_leaf(self, pid):
        node = self.pool.get(pid)
        if node is not None and node[2] == 0:
            heapq.heappush(self.heap, (node[1], -self.depth[pid], pid))

    def _evict_one(self, pinned):
        held, victim = [], None
        while self.heap:
            entry = heapq.heappop(self.heap)
            t, _, pid = entry
            node = self.pool.get(pid)
            if node is None or node[2] != 0 or node[1] != t:
                continue
            if pid in pinned:
                held.append(entry)
                continue
            victim = pid
            break
        for entry in held:
            heapq.heappush(self.heap, entry)
        if victim is None:
            return False
        parent = self.pool.pop(victim)[0]
        if parent:
            self.pool[parent][2] -= 1
            self._push_if_leaf(parent)
        self.evicted += 1
        self.tier.put(victim)
        return True

    def request(self, hash_ids, now):
        pids, parent = [], 0
        for block_id in hash_ids:
            parent = self._path_id(parent, block_id)
            pids.append(parent)
        matched = 0
        while matched < len(pids) and pids[matched] in self.pool:
            matched += 1
        pinned = set(pids[:matched])
        want, granted = len(pids) - matched, 0
        while granted < want:
            if len(self.pool) + granted >= self.capacity:
                if not self._evict_one(pinned):
                    break
                continue
            granted += 1
        promoted, superseded = serve_new_blocks(
            self.tier, pids[matched:matched + granted])
        self.promoted += promoted
        self.superseded += superseded
        parent = pids[matched - 1] if matched else 0
        for pid in pids[matched:matched + granted]:
            self.pool[pid] = [parent, now, 0]
            if parent:
                self.pool[parent][2] += 1
            parent = pid
        for pid in pids[:matched + granted]:
            self.pool[pid][1] = now
        if matched + granted:
            self._push_if_leaf(pids[matched + granted - 1])
        return matched + promoted


def run(trace_path, capacity, tier):
    cache = TwoTierCache(capacity, tier)
    requests = blocks = matched = 0
    for hash_ids in read_trace(trace_path):
        requests += 1
        blocks += len(hash_ids)
        matched += cache.request(hash_ids, requests)
        assert len(cache.pool) <= capacity and len(cache.tier) <= tier
    return {"capacity": capacity, "tier": tier, "requests": requests,
            "blocks": blocks, "matched_blocks": matched,
            "promoted_blocks": cache.promoted, "evicted": cache.evicted,
            "superseded_blocks": cache.superseded,
            "hit_ratio": matched / blocks if blocks else 0.0}


def self_test():
    def play(capacity, tier, requests):
        c = TwoTierCache(capacity, tier)
        return [c.request(r, t + 1) for t, r in enumerate(requests)], c

    # Without a tier: the pool's leaf-LRU alone.
    got, _ = play(3, 0, [[1, 2, 3], [4], [1, 2, 3]])
    assert got == [0, 0, 2], got
    # [4] evicts leaf 3 into the tier; the next [1, 2, 3] matches 1, 2 in
    # the pool and promotes 3.
    got, c = play(3, 10, [[1, 2, 3], [4], [1, 2, 3]])
    assert got == [0, 0, 3] and c.promoted == 1, (got, c.promoted)
    # A whole prompt evicted to the tier comes back in one request.
    got, c = play(3, 10, [[1, 2, 3], [4, 5, 6], [1, 2, 3]])
    assert got == [0, 0, 3] and c.promoted == 3, (got, c.promoted)
    # A tier of one keeps only the last evicted block: 1 is gone, so
    # nothing after it is promoted either.
    got, c = play(3, 1, [[1, 2, 3], [4, 5, 6], [1, 2, 3]])
    assert got == [0, 0, 0], got
    # Promotion stops at the first block the tier lacks.
    got, c = play(2, 10, [[1, 2], [3, 4], [1, 2, 7]])
    assert got == [0, 0, 2], got
    # A block the tier holds behind one it lost is written again, and the
    # tier forgets its copy. (The policy never loses a parent before its
    # child; the daemon can, through a failed checksum or Clear.)
    got, c = play(2, 10, [[1, 2], [3, 4]])
    del c.tier[c._path_id(0, 1)]
    assert c.request([1, 2], 3) == 0 and c.superseded == 1, c.superseded
    assert c._path_id(c._path_id(0, 1), 2) not in c.tier


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--capacity", type=int, default=3000)
    parser.add_argument("--tier", type=int, default=30000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--self_test", action="store_true")
    args = parser.parse_args(argv)
    if args.self_test:
        self_test()
        print("self test: ok")
        return 0
    if args.capacity <= 0 or args.tier < 0:
        parser.error("--capacity must be > 0 and --tier >= 0")
    r = run(args.trace, args.capacity, args.tier)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print("capacity %d tier %d: requests %d blocks %d matched %d "
              "(promoted %d) hit_ratio %.6f" % (
                  r["capacity"], r["tier"], r["requests"], r["blocks"],
                  r["matched_blocks"], r["promoted_blocks"], r["hit_ratio"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
