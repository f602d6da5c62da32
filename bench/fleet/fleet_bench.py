#!/usr/bin/python3
"""Fleet benchmark: N radixkvd daemons on loopback, a router that knows them
only through their KV events (vLLM's wire format), and the Mooncake
conversation trace replayed across them.

Each daemon gets --capacity/N pages (a none pool, page_size 512: one trace
block id is one page) and publishes KV events on loopback; one subscriber
per daemon (bench/fleet/kv_subscriber.py, written from vLLM's event
definitions alone) keeps the set of block hashes that daemon holds. The
trace is replayed one request at a time, in arrival order (Acquire then
Commit with release, as bench/replay does), under a placement policy:

  rr      request i goes to daemon i mod N
  prefix  the daemon whose event-built index holds the longest prefix of
          the request's block hashes; ties go to the daemon sent the fewest
          requests so far, then to the lowest index
  prefix_bounded  the same among daemons sent at most 1.25 times the mean
          number of requests so far

After each request the router waits until that daemon's events of the
request (the blocks it stored or promoted into the pool) have arrived, so
every decision sees the fleet's exact state.

The fleet hit ratio is sum(matched_blocks) / sum(total_blocks) as the daemons
answered. The same placement is simulated by bench/sim/fleet_sim.py; the
two must agree exactly (placement and matched blocks, request by request),
and at the end every subscriber's index must equal its daemon's
Admin.DumpTree listing.

--router picks the index the prefix policies read: `events` (the default)
the subscribers' own; `dynamo` NVIDIA Dynamo's standalone KV indexer
(bench/fleet/dynamo_router.py: `python -m dynamo.indexer` of the same
interpreter, logging to /tmp/rkfleet<pid>_<policy>.dynamo.log),
subscribed to every daemon and asked /query for each request's overlap
per worker. After each request the router also waits until Dynamo's
overlap for that request on its daemon equals the subscriber's prefix
(the request's events are applied there too). The subscribers still run:
`router_disagreements` counts the requests where Dynamo's overlaps
differ from theirs, and the final DumpTree check is theirs. rr reads no
index and starts no indexer.

  bench/fleet/fleet_bench.py --build_dir=build/events --capacity=9000 \\
      [--policies=rr,prefix] [--requests=0] [--shared=none|evicted|all] \\
      [--router=events|dynamo] [--json]

Exit status: 0 measured == simulated and indexes exact; 1 otherwise;
3 bad arguments (or --router=dynamo without dynamo.indexer). Needs a
Python with pyzmq, msgpack, grpcio and the radixkv package of the build
(<build>/python), and for --router=dynamo ai-dynamo-runtime (the project
venv has them all).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "bench", "sim"))

import dynamo_router  # noqa: E402
import kv_subscriber  # noqa: E402
import fleet_sim  # noqa: E402

PAGE_SIZE = 512
PAGE_BYTES = 4096  # the bench namespace's page: fp16 K and V, one 2-wide head


class FleetDaemon:
    def __init__(self, radixkvd, k, pages, tier=None):
        import grpc
        from radixkv import pb_grpc
        self.sock = "/tmp/rkfleet%d_%d.sock" % (os.getpid(), k)
        # ipc:// paths of this daemon's own: no other process can take
        # them between choosing and binding, as a loopback port could be.
        self.pub = "ipc://%s.pub" % self.sock
        self.rep = "ipc://%s.rep" % self.sock
        self.log = open(self.sock + ".log", "w")
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = subprocess.Popen(
            [radixkvd, "--socket=" + self.sock, "--metrics_listen=",
             ("--pool=none,pages=%d" % pages if tier is None else
              "--pool=host,bytes=%d,page_bytes=%d" % (pages * PAGE_BYTES,
                                                      PAGE_BYTES)),
             "--max_prompt_tokens=1048576"] + \
            ([] if tier is None else ["--tier=" + tier]) + [
             # as in the simulation: one session may pin the whole pool
             "--max_pinned_pages_per_session=%d" % pages,
             "--shutdown_grace=1s", "--kv_events_endpoint=" + self.pub,
             "--kv_events_hash=int64",
             "--kv_events_replay_endpoint=" + self.rep],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("radixkvd %d did not start (%s)"
                                   % (k, self.sock + ".log"))
            time.sleep(0.02)
        self.channel = grpc.insecure_channel("unix:" + self.sock)
        self.admin = pb_grpc.AdminStub(self.channel)

    def dump(self):
        from radixkv import pb
        return kv_subscriber.dump_hashes(self.admin, pb, "int64")

    def stop(self):
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def remote_stats(d):
    from radixkv import pb
    for t in d.admin.GetStats(pb.GetStatsRequest(), timeout=10).stats.tiers:
        if t.kind == "remote":
            return t
    return None


def wait_written(d, timeout=10.0):
    """Until daemon d's staged writes are in the shared store (the
    simulation's store is written at once)."""
    deadline = time.time() + timeout
    while remote_stats(d).pending_blocks:
        if time.time() > deadline:
            raise RuntimeError("the shared tier's writes did not finish")
        time.sleep(0.0005)


def wait_for(index, key_hash, timeout=10.0):
    """Until `index` holds key_hash (the request's last block); after a
    quiet second, asks the replay socket for what the stream did not
    deliver."""
    start = time.time()
    probed = False
    while key_hash not in index.index:
        if time.time() > start + timeout:
            raise kv_subscriber.ProtocolError("event for a commit never came")
        if index.poll(0.01) == 0 and not probed and time.time() > start + 1:
            probed = True
            index.probe()


def wait_dynamo(router, workers, tokens, k, want, i, timeout=10.0):
    """Until Dynamo's overlap of `tokens` on daemon k is `want` blocks (the
    subscriber's, once the request's events are in): its events of
    request i are applied."""
    deadline = time.time() + timeout
    while True:
        got = router.overlap(tokens, workers[k:k + 1])[0]
        if got == want:
            return
        if time.time() > deadline:
            raise dynamo_router.IndexerError(
                "request %d on daemon %d: Dynamo's overlap %d blocks, the "
                "events' %d, after %.0f s" % (i, k, got, want, timeout))
        time.sleep(0.001)


def prefix_len(index, keys):
    n = 0
    while n < len(keys) and keys[n] in index.index:
        n += 1
    return n


def run_policy(args, policy, trace, store=None):
    import radixkv
    spec = radixkv.NamespaceSpec(model="fleet", num_layers=1, num_kv_heads=1,
                                 head_dim=2, page_size=PAGE_SIZE, dtype="fp16")
    assert spec.page_bytes == PAGE_BYTES
    pages = fleet_sim.split_capacity(args.capacity, args.daemons)
    tier = None
    if store is not None:
        # Each policy starts from an empty store of its own.
        tier = "remote,addr=%s,prefix=%s-%s,timeout=2s,queue=256MiB,write=%s" % (
            store.addrs[0], "fleet%d" % os.getpid(), policy, args.shared)
    daemons = [FleetDaemon(args.radixkvd, k, p or (1 << 21), tier)
               for k, p in enumerate(pages)]
    router = None
    try:
        if args.router == "dynamo" and policy != "rr":
            router = dynamo_router.Indexer(
                "/tmp/rkfleet%d_%s.dynamo.log" % (os.getpid(), policy),
                spec.model, PAGE_SIZE)
            workers = router.register([(d.pub, d.rep) for d in daemons])
        disagreements = 0
        indexes = []
        for d in daemons:
            idx = kv_subscriber.KvIndex(d.pub, d.rep, resync=d.dump)
            idx.join()
            indexes.append(idx)
        clients = [radixkv.Client(endpoint=d.sock, namespace=spec,
                                  release_delay=0, call_timeout=30,
                                  heartbeat_interval=10)
                   for d in daemons]
        root = clients[0].namespace_root
        loads = [0] * args.daemons
        placement, matched = [], []
        blocks = 0
        t0 = time.time()
        for i, hash_ids in enumerate(trace):
            tokens = [h * PAGE_SIZE + j for h in hash_ids for j in range(PAGE_SIZE)]
            keys = [kv_subscriber.to_hash(k, "int64") for k in
                    radixkv.compute_block_keys(root, PAGE_SIZE, tokens)]
            lens = [prefix_len(idx, keys) for idx in indexes]
            if router is not None:
                theirs = router.overlap(tokens, workers)
                disagreements += theirs != lens
                lens = theirs
            k = fleet_sim.pick(policy, lens, loads, i)
            loads[k] += 1
            lease = clients[k].acquire(tokens)
            m = lease.matched_blocks
            got = lease.new_blocks
            if lease.uncommitted_blocks:
                lease.commit()
            else:
                lease.release()
            if got or lease.promoted_blocks:
                # the last block the request stored or promoted to the pool
                wait_for(indexes[k], keys[m + got - 1])
            if router is not None:
                wait_dynamo(router, workers, tokens, k,
                            prefix_len(indexes[k], keys), i)
            if store is not None:
                wait_written(daemons[k])
            placement.append(k)
            matched.append(m)
            blocks += len(hash_ids)
        elapsed = time.time() - t0
        exact = True
        for d, idx in zip(daemons, indexes):
            idx.drain()
            exact = exact and idx.index == d.dump()
        for c in clients:
            c.close()
        for idx in indexes:
            idx.close()
        moved = {}
        if store is not None:
            rs = [remote_stats(d) for d in daemons]
            moved = {"shared": args.shared,
                     "promoted_blocks": sum(r.promoted_blocks for r in rs),
                     "shared_bytes_read": sum(r.bytes_read for r in rs),
                     "shared_bytes_written": sum(r.bytes_written for r in rs),
                     "shared_errors": sum(r.read_errors + r.write_errors +
                                          r.checksum_failures + r.dropped_full +
                                          r.dropped_error for r in rs)}
            hits = sum(matched)
            moved["bytes_moved_per_hit"] = round(
                (moved["shared_bytes_read"] + moved["shared_bytes_written"]) /
                hits, 1) if hits else 0.0
        return dict({"policy": policy, "daemons": args.daemons,
                "capacity": args.capacity, "requests": len(trace),
                "blocks": blocks, "matched_blocks": sum(matched),
                "hit_ratio": sum(matched) / blocks if blocks else 0.0,
                "per_daemon_requests": loads, "indexes_exact": exact,
                "router": args.router,
                "gaps": sum(x.gaps for x in indexes),
                "resyncs": sum(x.resyncs for x in indexes),
                "elapsed_s": round(elapsed, 1)}, **moved,
                **({} if router is None else
                   {"router_disagreements": disagreements})), \
            placement, matched
    finally:
        if router is not None:
            router.stop()
        for d in daemons:
            d.stop()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build_dir", default=os.path.join(REPO, "build", "default"))
    p.add_argument("--trace", default=None)
    p.add_argument("--capacity", type=int, default=9000,
                   help="total pages of the fleet (0: unbounded)")
    p.add_argument("--daemons", type=int, default=3)
    p.add_argument("--policies", default="rr,prefix,prefix_bounded")
    p.add_argument("--requests", type=int, default=0,
                   help="replay only the first N requests (0: all)")
    p.add_argument("--shared", choices=("none", "evicted", "all"),
                   default="none",
                   help="a remote tier the daemons share, in a three-shard "
                   "Redis Cluster started here: fed by evictions, or by "
                   "every commit too")
    p.add_argument("--router", choices=("events", "dynamo"), default="events",
                   help="the index the prefix policies read: the bench's "
                   "own subscribers', or NVIDIA Dynamo's KV indexer "
                   "(python -m dynamo.indexer) subscribed to the daemons")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    policies = args.policies.split(",")
    if args.capacity < 0 or args.daemons < 1 or \
            any(x not in fleet_sim.POLICIES for x in policies):
        p.print_usage(sys.stderr)
        return 3
    if args.router == "dynamo" and not dynamo_router.available():
        print("--router=dynamo: dynamo.indexer is not importable by %s "
              "(ai-dynamo-runtime; scripts/install_deps.sh installs it)"
              % sys.executable, file=sys.stderr)
        return 3
    args.radixkvd = os.environ.get(
        "RADIXKVD", os.path.join(args.build_dir, "daemon", "radixkvd"))
    sys.path.insert(0, os.path.join(args.build_dir, "python"))
    trace = fleet_sim.load_trace(
        args.trace or os.path.join(args.build_dir, "data",
                                   "conversation_trace.jsonl"), args.requests)
    store = None
    if args.shared != "none":
        if args.capacity == 0:
            p.print_usage(sys.stderr)
            return 3
        sys.path.insert(0, os.path.join(REPO, "tests", "daemon", "tiers"))
        import redis_store
        import tempfile
        store = redis_store.RedisStore(tempfile.mkdtemp(prefix="rkfleet"),
                                       shards=3, maxmemory="2gb").start()
    ok = True
    try:
        for policy in policies:
            ok = run_one(args, policy, trace, store) and ok
    finally:
        if store is not None:
            store.stop()
    return 0 if ok else 1


def run_one(args, policy, trace, store):
    if True:
        measured, placement, matched = run_policy(args, policy, trace, store)
        sim = fleet_sim.simulate(
            trace, args.capacity, args.daemons, policy,
            None if args.shared == "none" else args.shared)
        same = sim["placement"] == placement and sim["matched"] == matched
        if not same:
            measured["first_difference"] = next(
                i for i in range(len(trace))
                if (sim["placement"][i], sim["matched"][i]) !=
                (placement[i], matched[i]))
        measured["simulated_hit_ratio"] = sim["hit_ratio"]
        measured["simulated_matched_blocks"] = sim["matched_blocks"]
        measured["matches_simulation"] = same
        ok = same and measured["indexes_exact"]
        if store is not None:
            measured["simulated_promoted_blocks"] = sim["promoted_blocks"]
            ok = ok and measured["shared_errors"] == 0
        if args.json:
            print(json.dumps(measured, sort_keys=True))
        else:
            print("%-14s %d daemons, %d pages in all: hit ratio %.4f "
                  "(simulated %.4f, %s), requests per daemon %s, indexes %s, "
                  "%.0f s" % (policy, args.daemons, args.capacity,
                              measured["hit_ratio"], sim["hit_ratio"],
                              "equal" if same else "DIFFERENT",
                              measured["per_daemon_requests"],
                              "exact" if measured["indexes_exact"] else "WRONG",
                              measured["elapsed_s"]))
        sys.stdout.flush()
    return ok


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
