#!/usr/bin/env python3
"""Interleaved A/B of two builds of radixkv: the index in process, the
trace replay in process and through a daemon.

  bench/compare/ab_release.py BUILD_A BUILD_B [--rounds N]

BUILD_A and BUILD_B are build directories (for example a checkout of the
previous release built with `cmake --preset default` and this one), each
with bench/index/radix_bench, bench/replay/replay and daemon/radixkvd built.
Every round runs each measurement once per build, alternating which build
goes first, so a drift in the machine's load hits both alike; the report is
the median of each figure per build and the ratio B/A of the medians (for
times, below 1 means B is faster; for throughputs, above 1).

Measured:
  radix_bench   BM_HashAndMatch and BM_MatchOnly (a 128-block prompt),
                BM_AcquireReleaseCached, BM_EvictAt1M (ns per evicted
                block, 1 M cached), BM_AcquireEvictingAt1M
  replay        the conversation trace in process, capacity 3,000 pages
                (requests/s, acquire p50)
  daemon        the same replay against radixkvd over its Unix socket,
                2 clients (requests/s, acquire p50)
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_FILTER = ("BM_HashAndMatch$|BM_MatchOnly$|BM_AcquireReleaseCached$|"
                "BM_EvictAt1M/4096/64/1048576$|BM_AcquireEvictingAt1M$")


def radix_bench(build):
    out = subprocess.run(
        [os.path.join(build, "bench/index/radix_bench"),
         "--benchmark_filter=" + BENCH_FILTER, "--benchmark_format=json",
         "--benchmark_min_time=0.3"],
        check=True, capture_output=True, text=True).stdout
    figures = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        if "ns_per_block" in b:
            figures[f"{b['name']} (ns per evicted block)"] = b["ns_per_block"]
        else:
            figures[f"{b['name']} ({b['time_unit']})"] = b["real_time"]
    return figures


def replay(build, extra):
    out = subprocess.run(
        [os.path.join(build, "bench/replay/replay"), "--json",
         "--capacity=3000"] + extra,
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def replay_inproc(build):
    r = replay(build, ["--mode=inproc"])
    return {"replay inproc requests/s": r["requests_per_second"],
            "replay inproc acquire p50 (us)": r["acquire_p50_us"],
            "replay hit ratio": r["hit_ratio"]}


def replay_daemon(build):
    with tempfile.TemporaryDirectory(prefix="rkvab") as tmp:
        sock = os.path.join(tmp, "d.sock")
        d = subprocess.Popen(
            [os.path.join(build, "daemon/radixkvd"), f"--socket={sock}",
             "--metrics_listen=", "--pool=none,pages=3000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            r = replay(build, ["--mode=daemon", f"--endpoint=unix:{sock}",
                               "--clients=2"])
        finally:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=30)
    return {"replay daemon requests/s": r["requests_per_second"],
            "replay daemon acquire p50 (us)": r["acquire_p50_us"],
            "replay daemon hit ratio": r["hit_ratio"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_a")
    ap.add_argument("build_b")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    builds = {"A": args.build_a, "B": args.build_b}
    samples = {"A": {}, "B": {}}
    for rnd in range(args.rounds):
        order = ["A", "B"] if rnd % 2 == 0 else ["B", "A"]
        for measure in (radix_bench, replay_inproc, replay_daemon):
            for which in order:
                for k, v in measure(builds[which]).items():
                    samples[which].setdefault(k, []).append(v)
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    print(f"A = {args.build_a}\nB = {args.build_b}\n"
          f"{args.rounds} interleaved rounds; medians\n")
    print(f"| figure | A | B | B/A |\n|---|---|---|---|")
    for k in samples["A"]:
        a = statistics.median(samples["A"][k])
        b = statistics.median(samples["B"].get(k, [float("nan")]))
        ratio = b / a if a else float("nan")
        print(f"| {k} | {a:.4g} | {b:.4g} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
