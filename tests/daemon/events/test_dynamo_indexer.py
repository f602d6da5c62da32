"""NVIDIA Dynamo's standalone KV indexer (`python -m dynamo.indexer`, PyPI
ai-dynamo-runtime, pinned in requirements/dynamo.lock) as the router of
three radixkvd.

The indexer runs as it ships: its own process, its HTTP API, its ZMQ
listeners subscribed to each daemon's KV events (with the daemon's replay
socket for its gap recovery), no etcd or NATS. Each daemon is registered
as one worker. A slice of the conversation trace is replayed one request
at a time; before each request, the indexer's overlap for it
(`/query` with the request's token ids, which Dynamo hashes itself from
the events' token_ids and parent hashes) must equal, for every worker,
the longest prefix that daemon holds by its own Match RPC, in blocks. The
request then goes where the indexer's overlap is longest (fewest requests
so far on a tie, among daemons sent at most 1.25 times the mean: the
`prefix_bounded` policy of bench/sim/fleet_sim.py), and the
placement and matched blocks of the whole slice must equal the
simulation's. The pools are small, so the daemons evict all along and the
indexer must apply their removals too.

Skipped only when dynamo.indexer is not importable (scripts/install_deps.sh
installs it in the project's environment)."""
import os
import sys
import tarfile
import time

import pytest

from evtest_util import REPO, EventDaemon, radixkv
import dynamo_router  # bench/fleet, on sys.path by evtest_util

if not dynamo_router.available():
    pytest.skip("Dynamo's indexer is not installed (ai-dynamo-runtime; "
                "scripts/install_deps.sh installs it)", allow_module_level=True)

sys.path.insert(0, os.path.join(REPO, "bench", "sim"))
import fleet_sim  # noqa: E402

PAGE = 16            # tokens per block: one block per trace hash id
REQUESTS = 1000      # the trace slice: 27,305 blocks
CAPACITY = 3000      # pages of the three daemons together
MODEL = "radixkv-dynamo-test"
SPEC = radixkv.NamespaceSpec(model=MODEL, num_layers=1, num_kv_heads=1,
                             head_dim=8, page_size=PAGE, dtype="fp16")


def trace_slice(tmp_path, n):
    path = os.environ.get("RADIXKV_TRACE")
    if not path:
        with tarfile.open(os.path.join(REPO, "bench", "data",
                                       "conversation_trace.tar.xz")) as t:
            t.extractall(tmp_path)
        path = os.path.join(tmp_path, "conversation_trace.jsonl")
    return fleet_sim.load_trace(path, n)


def tokens_of(hash_ids):
    return [h * PAGE + j for h in hash_ids for j in range(PAGE)]


def test_dynamo_overlap_equals_each_daemons_match(tmp_path):
    trace = trace_slice(tmp_path, REQUESTS)
    pages = fleet_sim.split_capacity(CAPACITY, 3)
    idx = dynamo_router.Indexer(str(tmp_path / "indexer.log"), MODEL, PAGE)
    daemons = []
    clients = []
    try:
        for p in pages:
            daemons.append(EventDaemon(
                pages=p, flags=["--max_pinned_pages_per_session=%d" % p,
                                "--max_prompt_tokens=1048576"]).start())
        workers = idx.register([(d.pub, d.rep) for d in daemons])
        clients = [radixkv.Client(endpoint=d.sock, namespace=SPEC,
                                  release_delay=0, call_timeout=30,
                                  heartbeat_interval=10) for d in daemons]
        loads = [0] * len(daemons)
        placement, matched, waits = [], [], []
        deep = 0  # requests some daemon holds more than a first block of
        for i, hash_ids in enumerate(trace):
            tokens = tokens_of(hash_ids)
            want = [c.match(tokens).matched_blocks for c in clients]
            # The daemons are idle: the indexer has caught up once its
            # overlap equals their matches; it never may differ for good.
            t0 = time.time()
            got = idx.overlap(tokens, workers)
            while got != want and time.time() < t0 + 10:
                time.sleep(0.005)
                got = idx.overlap(tokens, workers)
            assert got == want, ("request %d: dynamo %s, daemons' Match %s"
                                 % (i, got, want))
            waits.append(time.time() - t0)
            deep += max(want) > 1
            k = fleet_sim.pick("prefix_bounded", got, loads, i)
            loads[k] += 1
            lease = clients[k].acquire(tokens)
            if lease.uncommitted_blocks:
                lease.commit()
            else:
                lease.release()
            placement.append(k)
            matched.append(lease.matched_blocks)
        evicted = sum(d.stats().evicted_pages for d in daemons)
    finally:
        for c in clients:
            c.close()
        for d in daemons:
            d.stop()
        idx.stop()
    sim = fleet_sim.simulate(trace, CAPACITY, len(pages), "prefix_bounded")
    assert (placement, matched) == (sim["placement"], sim["matched"])
    # The slice exercised what it should: hits, spread, evictions.
    assert sum(matched) > len(trace) and deep > 20, (sum(matched), deep)
    assert min(loads) > 0, loads
    assert evicted > 0
    print("dynamo overlap == Match for %d requests (%d deeper than a first "
          "block), %d blocks matched, %d pages evicted, loads %s, wait for "
          "the indexer: median %.1f ms"
          % (len(trace), deep, sum(matched), evicted, loads,
             1000 * sorted(waits)[len(waits) // 2]))
