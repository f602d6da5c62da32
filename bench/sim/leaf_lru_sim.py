#!/usr/bin/python3
"""Independent simulation of radixkv's eviction policy (leaf-only LRU).

Replays a Mooncake-format trace (bench/data/README.md) one request at a
time, in arrival order, the way a single radixkv client does:

  Acquire(tokens, allocate=all)  -> Commit(all new blocks, release=true)

and prints the hit ratio sum(matched_blocks) / sum(total_blocks).

The policy, stated without reference to how radix/ implements it:
  * One cached node per full block; a request's path is its hash_ids, and a
    node is named by its whole path (parent node, id), so equal ids under
    different parents are different blocks.
  * Acquire matches the longest cached prefix and pins it (the lease).
    It then takes one page per unmatched block: a free page while there is
    one, otherwise it evicts the least recently used unpinned leaf (a leaf
    has no cached children); ties between equal times go to the deeper node.
    When only pinned nodes are left, fewer pages are taken and the request
    commits only the blocks it got pages for.
  * Commit inserts the new blocks; with release the whole path is unpinned
    and every node on it gets the request's logical time.

The simulation picks victims with a heap over (time, -depth) with lazy
invalidation: deliberately a different mechanism from radix/'s recency list,
so that agreement between the two is evidence, not an echo.

Standard library only. Run with /usr/bin/python3.

  bench/sim/leaf_lru_sim.py --capacity=3000 [--json] [--trace=PATH]
  bench/sim/leaf_lru_sim.py --self_test

capacity 0 (the default) means unbounded.
"""

import argparse
import heapq
import json
import os
import sys

# The build tree's copy of bench/data/conversation_trace.tar.xz.
DEFAULT_TRACE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "default",
    "data", "conversation_trace.jsonl")


class LeafLruCache:
    """The cache state: nodes keyed by (parent node, block id)."""

    def __init__(self, capacity):
        self.capacity = capacity  # 0: unbounded
        self.child = {}           # (parent_node, block_id) -> node
        self.parent = [None]      # node -> parent node; node 0 is the root
        self.key = [None]         # node -> (parent_node, block_id)
        self.depth = [0]          # node -> depth (1 = first block)
        self.time = [0]           # node -> last access time
        self.children = [0]       # node -> number of cached children
        self.alive = [True]
        self.size = 0             # cached nodes (the root is not a page)
        self.heap = []            # (time, -depth, node): candidate leaves
        self.evicted = 0

    def _push_if_leaf(self, node):
        if node != 0 and self.alive[node] and self.children[node] == 0:
            heapq.heappush(self.heap,
                           (self.time[node], -self.depth[node], node))

    def _new_node(self, parent, block_id, now):
        node = len(self.parent)
        self.parent.append(parent)
        self.key.append((parent, block_id))
        self.depth.append(self.depth[parent] + 1)
        self.time.append(now)
        self.children.append(0)
        self.alive.append(True)
        self.child[(parent, block_id)] = node
        self.children[parent] += 1
        self.size += 1
        return node

    def _evict_one(self, pinned):
        """Evicts the LRU unpinned leaf; False when there is none."""
        held = []
        victim = None
        while self.heap:
            entry = heapq.heappop(self.heap)
            t, negd, node = entry
            if (not self.alive[node] or self.children[node] != 0
                    or self.time[node] != t):
                continue  # stale entry
            if node in pinned:
                held.append(entry)
                continue
            victim = node
            break
        for entry in held:
            heapq.heappush(self.heap, entry)
        if victim is None:
            return False
        self.alive[victim] = False
        del self.child[self.key[victim]]
        parent = self.parent[victim]
        self.children[parent] -= 1
        self.size -= 1
        self.evicted += 1
        self._push_if_leaf(parent)
        return True

    def request(self, hash_ids, now):
        """One Acquire(allocate=all) + Commit(release); returns matched."""
        # Match: walk the longest cached prefix.
        path = []
        node = 0
        for block_id in hash_ids:
            nxt = self.child.get((node, block_id))
            if nxt is None:
                break
            path.append(nxt)
            node = nxt
        matched = len(path)
        pinned = set(path)

        # Allocate: one page per unmatched block, evicting when full.
        want = len(hash_ids) - matched
        granted = 0
        while granted < want:
            if self.capacity and self.size + granted >= self.capacity:
                if not self._evict_one(pinned):
                    break  # everything left is pinned: fewer pages
                continue
            granted += 1

        # Commit + release: insert the granted blocks, touch the whole path.
        for block_id in hash_ids[matched:matched + granted]:
            node = self._new_node(node, block_id, now)
            path.append(node)
        for n in path:
            self.time[n] = now
        if path:
            self._push_if_leaf(path[-1])
        return matched


def read_trace(trace_path):
    """Yields each request's hash_ids, in file order (blank lines skipped)."""
    with open(trace_path) as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)["hash_ids"]


def run(trace_path, capacity):
    cache = LeafLruCache(capacity)
    requests = 0
    blocks = 0
    matched = 0
    for hash_ids in read_trace(trace_path):
        requests += 1
        blocks += len(hash_ids)
        matched += cache.request(hash_ids, requests)
        if capacity:
            assert cache.size <= capacity, "cache over capacity"
    return {
        "capacity": capacity,
        "requests": requests,
        "blocks": blocks,
        "matched_blocks": matched,
        "hit_ratio": matched / blocks if blocks else 0.0,
        "evicted": cache.evicted,
        "cached_at_end": cache.size,
    }


def self_test():
    """Hand-checked scenarios; raises AssertionError on a wrong answer."""
    def play(capacity, requests):
        cache = LeafLruCache(capacity)
        return [cache.request(r, t + 1) for t, r in enumerate(requests)], cache

    # A full cache evicts the LRU leaf: 3 (the end of the older path).
    got, _ = play(3, [[1, 2, 3], [4], [1, 2, 3]])
    assert got == [0, 0, 2], got
    # Evicting a leaf makes its parent evictable (cascade up the old path).
    got, c = play(3, [[1, 2, 3], [4, 5, 6], [1]])
    assert got == [0, 0, 0] and c.evicted == 4, (got, c.evicted)
    # The request's own matched path is pinned: only 1 of 2 new pages fits,
    # so only block 3 is committed; block 4 is not cached.
    got, c = play(3, [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4]])
    assert got == [0, 2, 3] and c.size == 3, (got, c.size)
    # Recency, not insertion order: [1] is touched again, so [2] is the LRU.
    got, _ = play(2, [[1], [2], [1], [3], [1], [2]])
    assert got == [0, 0, 1, 0, 1, 0], got
    # Unbounded: every repeated prefix hits.
    got, _ = play(0, [[1, 2, 3], [1, 2, 4], [1, 2, 4, 5]])
    assert got == [0, 2, 3], got
    # Equal ids under different parents are different blocks.
    got, _ = play(0, [[1, 2], [3, 2], [3, 2]])
    assert got == [0, 0, 2], got


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--capacity", type=int, default=0,
                        help="pages in the pool; 0 = unbounded")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--self_test", action="store_true",
                        help="run the built-in scenarios and exit")
    args = parser.parse_args(argv)
    if args.self_test:
        self_test()
        print("self test: ok")
        return 0
    if args.capacity < 0:
        parser.error("--capacity must be >= 0, got %d" % args.capacity)
    result = run(args.trace, args.capacity)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        cap = args.capacity if args.capacity else "unbounded"
        print("capacity %s: requests %d blocks %d matched %d hit_ratio %.6f "
              "evicted %d" % (cap, result["requests"], result["blocks"],
                              result["matched_blocks"], result["hit_ratio"],
                              result["evicted"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
