#!/usr/bin/python3
"""Simulation of a fleet of radixkv daemons behind a router.

Replays a Mooncake-format trace (bench/data/README.md) in arrival order over
N independent leaf-LRU caches (bench/sim/leaf_lru_sim.py's LeafLruCache,
each of capacity/N pages) and prints the fleet hit ratio
sum(matched_blocks) / sum(total_blocks) for a placement policy:

  rr      request i goes to cache i mod N (round-robin)
  prefix  each request goes to the cache that holds the longest prefix of
          it; ties go to the cache that has been sent the fewest requests
          so far, then to the lowest index
  prefix_bounded  the same among the caches sent at most 1.25 times the
          mean number of requests so far (a bounded-load variant: pure
          longest-prefix routing sends every request of a trace whose
          prompts share a first block to one cache)

The prefix policy is what a KV-event router does (bench/fleet/fleet_bench.py):
its index of each daemon is built from that daemon's events, so when the
events are exact it sees exactly the state this simulation keeps, and the
two must agree request by request.

Standard library only. Run with /usr/bin/python3.

  bench/sim/fleet_sim.py --capacity=9000 --daemons=3 --policy=prefix \\
      [--shared=none|evicted|all] [--json]
  bench/sim/fleet_sim.py --self_test
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from leaf_lru_sim import DEFAULT_TRACE, LeafLruCache, read_trace  # noqa: E402


def match_len(cache, hash_ids):
    """Longest cached prefix of hash_ids in `cache`, changing nothing."""
    node = 0
    n = 0
    for block_id in hash_ids:
        node = cache.child.get((node, block_id))
        if node is None:
            break
        n += 1
    return n


POLICIES = ("rr", "prefix", "prefix_bounded")
# prefix_bounded: only daemons sent at most this factor times the mean
# number of requests so far are candidates.
BOUND = 1.25


def pick(policy, prefix_lens, loads, i):
    """The daemon request i goes to, given the longest prefix of it each
    daemon holds (prefix_lens) and the requests each was sent (loads)."""
    n = len(loads)
    if policy == "rr":
        return i % n
    limit = BOUND * (sum(loads) + 1) / n
    best = None
    for k in range(n):
        if policy == "prefix_bounded" and loads[k] > limit:
            continue
        rank = (prefix_lens[k], -loads[k], -k)
        if best is None or rank > best[0]:
            best = (rank, k)
    return best[1]


def choose(policy, caches, loads, hash_ids, i):
    """The cache index request i goes to."""
    lens = [0] * len(caches) if policy == "rr" else \
        [match_len(c, hash_ids) for c in caches]
    return pick(policy, lens, loads, i)


def split_capacity(capacity, daemons):
    """Per-cache capacities: equal shares of `capacity` (0: unbounded)."""
    if capacity == 0:
        return [0] * daemons
    return [capacity // daemons] * daemons


def pool_match_len(cache, hash_ids):
    """Longest prefix of hash_ids in a TwoTierCache's pool (what a router
    learns from a daemon's events: the shared tier publishes none)."""
    parent, n = 0, 0
    for block_id in hash_ids:
        pid = cache.path_ids.get((parent, block_id))
        if pid is None or pid not in cache.pool:
            break
        parent, n = pid, n + 1
    return n


SHARED = (None, "evicted", "all")


def simulate(requests, capacity, daemons, policy, shared=None):
    """requests: lists of hash ids. Returns the result dict, with the
    per-request placement and matched counts. shared: None, or a tier
    every daemon shares (tiered_sim.SharedStore, unbounded) that receives
    the blocks daemons evict ("evicted") or also every block they commit
    ("all"), and serves any daemon's next blocks after its own pool's."""
    store = None
    if shared is None:
        caches = [LeafLruCache(c) for c in split_capacity(capacity, daemons)]
    else:
        from tiered_sim import SharedStore, TwoTierCache
        assert capacity > 0, "a shared tier needs bounded pools"
        store = SharedStore(write_all=shared == "all")
        paths = {}
        caches = [TwoTierCache(c, store, paths)
                  for c in split_capacity(capacity, daemons)]
    loads = [0] * daemons
    placement, matched = [], []
    blocks = 0
    for i, hash_ids in enumerate(requests):
        if store is None:
            k = choose(policy, caches, loads, hash_ids, i)
        else:
            lens = [0] * daemons if policy == "rr" else \
                [pool_match_len(c, hash_ids) for c in caches]
            k = pick(policy, lens, loads, i)
        loads[k] += 1
        m = caches[k].request(hash_ids, i + 1)
        placement.append(k)
        matched.append(m)
        blocks += len(hash_ids)
    total = sum(matched)
    out = {
        "policy": policy, "daemons": daemons, "capacity": capacity,
        "requests": len(requests), "blocks": blocks, "matched_blocks": total,
        "hit_ratio": total / blocks if blocks else 0.0,
        "per_daemon_requests": loads,
        "placement": placement, "matched": matched,
    }
    if store is not None:
        out["shared"] = shared
        out["shared_puts"] = store.puts
        out["shared_blocks"] = len(store)
        out["promoted_blocks"] = sum(c.promoted for c in caches)
    return out


def load_trace(path, limit=0):
    out = []
    for hash_ids in read_trace(path):
        out.append(hash_ids)
        if limit and len(out) >= limit:
            break
    return out


def self_test():
    # Two caches, prefix routing keeps a conversation on one cache.
    reqs = [[1, 2], [1, 2, 3], [7], [1, 2, 3, 4], [7, 8]]
    r = simulate(reqs, 0, 2, "prefix")
    assert r["placement"] == [0, 0, 1, 0, 1], r["placement"]
    assert r["matched"] == [0, 2, 0, 3, 1], r["matched"]
    r = simulate(reqs, 0, 2, "rr")
    assert r["placement"] == [0, 1, 0, 1, 0] and r["matched"] == [0, 0, 0, 3, 1]
    # Ties go to the least loaded, then the lowest index.
    r = simulate([[1], [2], [3]], 0, 3, "prefix")
    assert r["placement"] == [0, 1, 2], r["placement"]
    # Capacity is split: 4 pages over 2 caches hold 2 each.
    r = simulate([[1, 2, 3]], 4, 2, "rr")
    assert r["matched"] == [0]
    # A shared tier: what cache 0 evicts, cache 1 is served.
    reqs = [[1, 2], [5, 6], [9], [1, 2]]
    r = simulate(reqs, 4, 2, "rr")
    assert r["matched"] == [0, 0, 0, 0], r["matched"]
    r = simulate(reqs, 4, 2, "rr", shared="evicted")
    # [1, 2] on 0, [5, 6] on 1, [9] on 0 evicts 2, [1, 2] on 1 evicts
    # 6 and 5 and finds 1 not shared (0 still caches it): no hit.
    assert r["matched"] == [0, 0, 0, 0], r["matched"]
    r = simulate(reqs, 4, 2, "rr", shared="all")
    # Every commit is shared: [1, 2] comes to cache 1 from the store.
    assert r["matched"] == [0, 0, 0, 2] and r["promoted_blocks"] == 2, r
    assert r["shared_blocks"] == 5, r


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--capacity", type=int, default=0,
                        help="total pages of the fleet; 0 = unbounded")
    parser.add_argument("--daemons", type=int, default=3)
    parser.add_argument("--policy", choices=POLICIES, default="prefix")
    parser.add_argument("--shared", choices=("none", "evicted", "all"),
                        default="none",
                        help="a tier the daemons share: none, fed by their "
                        "evictions, or by every commit too")
    parser.add_argument("--requests", type=int, default=0,
                        help="replay only the first N requests (0: all)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--self_test", action="store_true")
    args = parser.parse_args(argv)
    if args.self_test:
        self_test()
        print("self test: ok")
        return 0
    if args.capacity < 0 or args.daemons < 1:
        parser.error("--capacity must be >= 0 and --daemons >= 1")
    shared = None if args.shared == "none" else args.shared
    if shared and args.capacity == 0:
        parser.error("--shared needs a bounded --capacity")
    r = simulate(load_trace(args.trace, args.requests), args.capacity,
                 args.daemons, args.policy, shared)
    del r["placement"], r["matched"]
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print("%s over %d daemons, capacity %d: hit_ratio %.6f (%d of %d "
              "blocks)" % (r["policy"], r["daemons"], r["capacity"],
                           r["hit_ratio"], r["matched_blocks"], r["blocks"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
