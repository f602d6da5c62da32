#!/usr/bin/python3
"""The Python client (radixkv) against the C++ client library, side by side.

One radixkvd child (--pool=none: an index without memory) serves both.
Each round runs, one after the other, from one process and one thread each:

  C++     bench/replay/replay --mode=daemon --via=client: radixkv::Client
          replaying a trace whose every request is the same 128-block
          prompt (page_size 16: 2,048 tokens, block h holding tokens
          16h .. 16h+15); a held lease is dropped, so its release rides on
          the next Acquire (release_leases)
  Python  radixkv.Client.acquire of the same prompt (a NumPy uint32 array,
          and once more as a Python list), the lease left as a `with`
          block leaves it: the same calls on the wire
  stub    the same Acquire calls through the bare generated grpcio stub
          (the previous lease in release_leases): gRPC's own cost in Python

Both use the replay namespace (model "radixkv-replay", 32 layers, 8 KV
heads of 128, bf16, page_size 16), so after the first request every
Acquire is a full hit. The ratio is Python requests/s over C++
requests/s of the same round. Then it times radixkv.keys.compute_block_keys
on 2k-token prompts of page_size 16 (tokens/s, NumPy and list input).

  /usr/bin/python3 bench/python/client_bench.py --build_dir=build/default
  (PYTHONPATH defaults to <build_dir>/python)

Prints a table, or one JSON object with --json.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_daemon import start_daemon

PAGE_SIZE = 16
BLOCKS = 128


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build_dir", default="build/default",
                   help="CMake build tree with radixkvd, replay and python/")
    p.add_argument("--requests", type=int, default=20000,
                   help="Acquire requests per client per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    p.add_argument("--hash_seconds", type=float, default=2.0,
                   help="seconds per key-hashing measurement")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args()


def run_cpp(replay, sock, trace):
    out = subprocess.run([replay, "--mode=daemon", "--via=client",
                          "--endpoint=unix:" + sock, f"--page_size={PAGE_SIZE}",
                          "--trace=" + trace, "--json"],
                         capture_output=True, text=True, timeout=600, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"requests_per_second": r["requests_per_second"],
            "acquire_p50_us": r["acquire_p50_us"], "acquire_p99_us": r["acquire_p99_us"],
            "hit_ratio": r["hit_ratio"]}


def run_python(client, tokens, requests):
    """acquire (+ commit on a miss), the lease left as `with` leaves it."""
    lat = []
    matched = 0
    t0 = time.perf_counter()
    for _ in range(requests):
        a = time.perf_counter()
        with client.acquire(tokens) as lease:
            lat.append(time.perf_counter() - a)
            if lease.degraded:
                raise RuntimeError(f"degraded lease: {client.state().last_error}")
            matched += lease.matched_blocks
            if lease.new_blocks:
                lease.commit()
    seconds = time.perf_counter() - t0
    lat.sort()
    return {"requests_per_second": round(requests / seconds, 1),
            "acquire_p50_us": round(lat[len(lat) // 2] * 1e6, 1),
            "acquire_p99_us": round(lat[int(len(lat) * 0.99)] * 1e6, 1),
            "hit_ratio": round(matched / (requests * BLOCKS), 6)}


def run_stub(radixkv, sock, session_id, tokens, requests):
    """The same Acquire calls through the bare generated stub (grpcio, no
    library): what the Python client costs above gRPC itself."""
    import grpc  # pylint: disable=import-outside-toplevel
    pb = radixkv.pb
    prompt = tokens.tobytes()
    with grpc.insecure_channel("unix:" + sock) as channel:
        kv = radixkv.pb_grpc.KvCacheStub(channel)
        previous = []
        t0 = time.perf_counter()
        for _ in range(requests):
            r = kv.Acquire(pb.AcquireRequest(
                session_id=session_id, tokens_le=prompt, allocate=True, pages_le=True,
                release_leases=previous), timeout=2)
            previous = [r.lease_id]
        seconds = time.perf_counter() - t0
        kv.Release(pb.ReleaseRequest(session_id=session_id, lease_id=previous[0]))
    return {"requests_per_second": round(requests / seconds, 1)}


def time_hashing(radixkv, spec, tokens, seconds):
    root = radixkv.namespace_root(spec)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        radixkv.compute_block_keys(root, PAGE_SIZE, tokens)
        n += 1
    return round(n * len(tokens) / (time.perf_counter() - t0))


def run_rounds(args, build, tmp, radixkv, spec, tokens, token_list):
    """Starts radixkvd in `tmp`, then alternates the C++ and Python clients."""
    sock = os.path.join(tmp, "d.sock")
    trace = os.path.join(tmp, "trace.jsonl")
    with open(trace, "w") as f:
        line = json.dumps({"timestamp": 0, "hash_ids": list(range(BLOCKS))})
        f.write((line + "\n") * args.requests)
    proc, log = start_daemon(os.path.join(build, "daemon", "radixkvd"), sock,
                              "none,pages=100000")
    rounds = []
    client = None
    try:
        client = radixkv.Client(sock, namespace=spec, client_name="client_bench",
                                initial_wait=10)
        run_python(client, tokens, 100)  # caches the prompt; warms up
        for _ in range(args.rounds):
            cpp = run_cpp(os.path.join(build, "bench", "replay", "replay"), sock, trace)
            py = run_python(client, tokens, args.requests)
            py_list = run_python(client, token_list, args.requests // 4)
            stub = run_stub(radixkv, sock, client.state().session_id, tokens,
                            args.requests // 4)
            rounds.append({"cpp": cpp, "python": py, "python_list": py_list,
                           "python_stub": stub,
                           "ratio": round(py["requests_per_second"] /
                                          cpp["requests_per_second"], 3)})
    finally:
        if client is not None:
            client.close()
        proc.terminate()
        proc.wait()
        log.close()
    return rounds


def main():
    args = parse_args()
    build = os.path.abspath(args.build_dir)
    sys.path.insert(0, os.path.join(build, "python"))
    import numpy as np  # pylint: disable=import-outside-toplevel
    import radixkv  # pylint: disable=import-outside-toplevel

    tokens = np.arange(BLOCKS * PAGE_SIZE, dtype=np.uint32)
    token_list = tokens.tolist()
    spec = radixkv.NamespaceSpec(model="radixkv-replay", num_layers=32, num_kv_heads=8,
                                 head_dim=128, page_size=PAGE_SIZE, dtype="bf16")
    tmp = tempfile.mkdtemp(prefix="rkv-pybench-")
    try:
        rounds = run_rounds(args, build, tmp, radixkv, spec, tokens, token_list)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    hashing = {"numpy_tokens_per_second": time_hashing(radixkv, spec, tokens, args.hash_seconds),
               "list_tokens_per_second": time_hashing(radixkv, spec, token_list, args.hash_seconds)}
    result = {"prompt_tokens": BLOCKS * PAGE_SIZE, "page_size": PAGE_SIZE,
              "requests": args.requests, "rounds": rounds,
              "median_ratio": statistics.median(r["ratio"] for r in rounds),
              "key_hashing": hashing}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'round':>5} {'C++ req/s':>10} {'Py req/s':>10} {'Py list':>10} "
          f"{'Py stub':>10} {'ratio':>6} {'C++ p50':>8} {'Py p50':>8} {'Py p99':>8}")
    for i, r in enumerate(rounds):
        print(f"{i:>5} {r['cpp']['requests_per_second']:>10.0f} "
              f"{r['python']['requests_per_second']:>10.0f} "
              f"{r['python_list']['requests_per_second']:>10.0f} "
              f"{r['python_stub']['requests_per_second']:>10.0f} {r['ratio']:>6.2f} "
              f"{r['cpp']['acquire_p50_us']:>7.1f}u {r['python']['acquire_p50_us']:>7.1f}u "
              f"{r['python']['acquire_p99_us']:>7.1f}u")
    print(f"median ratio (Python / C++ requests/s): {result['median_ratio']:.2f}")
    print(f"key hashing, page_size 16, 2,048-token prompts: "
          f"{hashing['numpy_tokens_per_second'] / 1e6:.1f} M tokens/s (NumPy uint32), "
          f"{hashing['list_tokens_per_second'] / 1e6:.1f} M tokens/s (list)")


if __name__ == "__main__":
    main()
