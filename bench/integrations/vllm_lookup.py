#!/usr/bin/env python3
"""Scheduler-side lookup cost of radixkv.integrations.vllm.RadixKVConnector.

One radixkvd child (host pool) and the connector created by vLLM's own
KVConnectorFactory (role SCHEDULER) from a VllmConfig of a tiny
random-weight Llama (2 layers, 2 KV heads of 32, fp32, block size 16).
Each sample is what vLLM's scheduler does for a new request:

  get_num_new_matched_tokens(request, 0)   Acquire of the prompt's full blocks
                                           (token mode), lease kept
  request_finished(request, [])            the lease released

timed separately, for a prompt of --tokens tokens (default 2,048 = 128
blocks), in two cases: "hit" (the prompt's blocks are committed beforehand,
the connector reports tokens - 16) and "miss" (a prompt never cached: the
Acquire allocates 128 new pages, released again). Every sample uses a new
vLLM Request object.

  PYTHONPATH=build/default/python .venv/bin/python bench/integrations/vllm_lookup.py \\
      --radixkvd=build/default/daemon/radixkvd [--samples=300] [--tokens=2048]

Prints one JSON object: per case p50/p99/mean in microseconds.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integrations"))

from bench_daemon import start_daemon  # noqa: E402


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100.0 * (len(values) - 1))))]


def summary(samples):
    us = [s * 1e6 for s in samples]
    return {"p50_us": round(percentile(us, 50), 1), "p99_us": round(percentile(us, 99), 1),
            "mean_us": round(statistics.fmean(us), 1), "samples": len(us)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--radixkvd", default=os.environ.get("RADIXKVD", "build/default/daemon/radixkvd"))
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()

    import _vllm_util as U  # vLLM's config, Request and factory
    import radixkv
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole

    tmp = tempfile.mkdtemp(prefix="rkv-vllm-bench-")
    sock = os.path.join(tmp, "radixkvd.sock")
    proc, log = start_daemon(args.radixkvd, sock, "host,bytes=256MiB")
    try:
        model = U.make_model(os.path.join(tmp, "tiny-llama"))
        vc = U.vllm_config(model, {"endpoint": sock})
        conn = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER,
                                                   U.kv_cache_config(vc))
        assert conn.client.wait_for_session(10), "no session"
        hit_prompt = [(i * 7 + 1) % 256 for i in range(args.tokens)]
        with radixkv.Client(endpoint=sock, namespace=conn.namespace) as c:
            with c.acquire(hit_prompt) as lease:
                lease.commit(lease.new_blocks)
            cached = c.match(hit_prompt).matched_blocks
        expect = min(cached, (args.tokens - 1) // 16) * 16

        results = {}
        for case in ("hit", "miss"):
            lookups, releases = [], []
            for i in range(args.samples + 10):
                tokens = hit_prompt if case == "hit" else \
                    [256 + i] + [(j * 7) % 256 for j in range(args.tokens - 1)]
                req = U.request(f"{case}-{i}", tokens)
                t0 = time.perf_counter()
                n, _ = conn.get_num_new_matched_tokens(req, 0)
                t1 = time.perf_counter()
                conn.request_finished(req, [])
                t2 = time.perf_counter()
                assert n == (expect if case == "hit" else 0), (case, n)
                if i >= 10:                       # warm-up samples dropped
                    lookups.append(t1 - t0)
                    releases.append(t2 - t1)
            results[case] = {"lookup": summary(lookups), "release": summary(releases)}
        conn.shutdown()
        print(json.dumps({
            "bench": "vllm_lookup", "prompt_tokens": args.tokens, "block_size": 16,
            "cached_blocks": cached, "reported_tokens_on_hit": expect,
            "daemon_pool": "host,bytes=256MiB", **results}))
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


if __name__ == "__main__":
    main()
