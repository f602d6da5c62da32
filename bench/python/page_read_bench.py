#!/usr/bin/python3
"""Reading a cached prompt's pages from a host pool in Python, against one
memcpy of the same bytes.

One radixkvd child (--pool=host) and one radixkv.Client (attach_pool=True)
in this process. A prompt is 2,048 tokens, page_size 16: 128 pages of a
small fp16 layout (4 layers x {K, V} x 4 KV heads x 16 slots x 64 dims =
64 KiB a page, 8 MiB in all), written once and committed; a lease on each
cached prompt is held while the cases run. Each round runs every case's
--reps calls in a row, in two modes: warm (every call reads the same
prompt: its 8 MiB stay in the caches) and cold (the calls take --prompts
cached prompts in turn, 96 MiB by default, several times a last-level
cache: the pages come from memory, as for a prompt read once, while the
code stays hot). A case's figure is the median of its per-round medians:

  views, per page       [lease.page_array(i) for i in range(128)]
  views, batched        pool.page_arrays(pages, spec)
  torch, per page       out[i].copy_(lease.page_tensor(i)) for each page
                        into a preallocated tensor (what a loop does)
  torch.stack           torch.stack of the 128 page tensors (allocates)
  gather_tensor         pool.gather_tensor(pages, spec, out=out): one copy
                        per run of consecutive pages, preallocated out
  gather_tensor, alloc  the same, allocating its result
  ..., shuffled         the gathers with the page list in a random order
                        (every page its own run: a fragmented pool)
  memcpy                np.copyto of one 8 MiB array into another
                        (preallocated; private anonymous memory)
  memcpy, alloc         ndarray.copy() of the 8 MiB (allocates)
  memcpy from the pool  the same two with the 8 MiB read from the pool's
                        shared memory (the prompt's pages when they are
                        one run): the reference

Ratios: each way of reading the pages into a torch tensor over the memcpy
of as many bytes from the pool, preallocated against preallocated and
allocating against allocating. The target: reading the prompt's pages into
a torch tensor costs no more than one memcpy of its bytes (ratio <= 1).

  /usr/bin/python3 bench/python/page_read_bench.py --build_dir=build/default
  (PYTHONPATH defaults to <build_dir>/python; the torch cases need torch)

Prints a table, or one JSON object with --json.
"""
import argparse
import itertools
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
TOKENS = 2048


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build_dir", default="build/default",
                   help="CMake build tree with radixkvd and python/")
    p.add_argument("--reps", type=int, default=200, help="timed runs per case per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds")
    p.add_argument("--prompts", type=int, default=12,
                   help="cached prompts the cold mode takes in turn (8 MiB each)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args()


def time_rounds(cases, reps, rounds):
    """name -> [median µs of each round]. Each round runs every case's
    `reps` calls in a row."""
    for fn in cases.values():
        fn()  # warm: first-touch faults
    result = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times = []
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                fn()
                times.append(time.perf_counter_ns() - t0)
            result[name].append(statistics.median(times) / 1e3)
    return result


class Prompt:
    """One cached prompt: its lease (held), its pages in order and
    shuffled, and as many bytes of the pool from its first page on (its
    pages when they are one run) and of private memory."""

    def __init__(self, np, pool, lease, spec, seed):
        self.lease = lease
        self.pages = list(lease.pages)
        self.shuffled = list(np.random.default_rng(seed).permutation(self.pages))
        nbytes = len(self.pages) * spec.page_bytes
        chunk = pool.page(self.pages[0]).obj
        offset = (self.pages[0] % pool.pages_per_chunk) * spec.page_bytes
        offset = offset if offset + nbytes <= len(chunk) else 0
        self.in_pool = np.frombuffer(chunk, dtype=np.uint8, count=nbytes, offset=offset)
        self.private = np.full(nbytes, seed, dtype=np.uint8)


def make_cases(np, torch, pool, prompts, spec):
    """name -> callable, each call on the next of `prompts` in turn. The
    torch cases are left out without torch."""
    n = len(prompts[0].pages)
    dst = np.zeros(n * spec.page_bytes, dtype=np.uint8)

    def each(fn):
        it = itertools.cycle(prompts)
        return lambda: fn(next(it))

    cases = {
        "views, per page": each(lambda q: [q.lease.page_array(i) for i in range(n)]),
        "views, batched": each(lambda q: pool.page_arrays(q.pages, spec)),
        "memcpy": each(lambda q: np.copyto(dst, q.private)),
        "memcpy, alloc": each(lambda q: q.private.copy()),
        "memcpy from the pool": each(lambda q: np.copyto(dst, q.in_pool)),
        "memcpy from the pool, alloc": each(lambda q: q.in_pool.copy()),
    }
    if torch is None:
        return cases
    out = torch.zeros((n,) + spec.page_shape, dtype=torch.float16)

    def per_page(q):
        for i in range(n):
            out[i].copy_(q.lease.page_tensor(i))

    cases.update({
        "torch, per page": each(per_page),
        "torch.stack": each(lambda q: torch.stack([q.lease.page_tensor(i) for i in range(n)])),
        "gather_tensor": each(lambda q: pool.gather_tensor(q.pages, spec, out=out)),
        "gather_tensor, alloc": each(lambda q: pool.gather_tensor(q.pages, spec)),
        "gather_tensor, shuffled": each(lambda q: pool.gather_tensor(q.shuffled, spec, out=out)),
        "gather_tensor, shuffled, alloc": each(lambda q: pool.gather_tensor(q.shuffled, spec)),
    })
    return cases


def check(np, torch, pool, lease, spec):
    """The copies hold the pages' bytes."""
    want = np.stack([lease.page_array(i) for i in range(len(lease.pages))])
    assert (pool.gather(lease.pages, spec) == want).all()
    if torch is not None:
        assert (pool.gather_tensor(lease.pages, spec).numpy() == want).all()
        stacked = torch.stack([lease.page_tensor(i) for i in range(len(lease.pages))])
        assert (stacked.numpy() == want).all()


def cache_prompts(np, client, count):
    """`count` distinct 2,048-token prompts, written and committed; returns
    a held lease on each, all blocks matched."""
    leases = []
    for k in range(count):
        tokens = np.arange(1, TOKENS + 1, dtype=np.uint32) + np.uint32(k * 100_000)
        with client.acquire(tokens) as lease:
            for j in range(lease.new_blocks):
                lease.page_array(j)[:] = k + j
            lease.commit(release=False)
        lease = client.acquire(tokens)
        assert lease.matched_blocks == TOKENS // PAGE_SIZE, lease
        leases.append(lease)
    return leases


def run(args, radixkvd, tmp, np, torch, radixkv):
    spec = radixkv.NamespaceSpec(model="page-read-bench", num_layers=4, num_kv_heads=4,
                                 head_dim=64, page_size=PAGE_SIZE, dtype="fp16")
    sock = os.path.join(tmp, "radixkvd.sock")
    proc, log = start_daemon(radixkvd, sock, "host,bytes=256MiB")
    try:
        with radixkv.Client(sock, namespace=spec, attach_pool=True, initial_wait=10) as c:
            pool = c.pool
            leases = cache_prompts(np, c, args.prompts)
            check(np, torch, pool, leases[0], spec)
            prompts = [Prompt(np, pool, lease, spec, k) for k, lease in enumerate(leases)]
            rounds = {"warm": time_rounds(make_cases(np, torch, pool, prompts[:1], spec),
                                          args.reps, args.rounds),
                      "cold": time_rounds(make_cases(np, torch, pool, prompts, spec),
                                          args.reps, args.rounds)}
            runs = len(radixkv.pool._runs(prompts[0].pages, pool.capacity_pages,  # pylint: disable=protected-access
                                          pool.pages_per_chunk))
            info = {"pages": len(prompts[0].pages), "page_bytes": spec.page_bytes,
                    "bytes": len(prompts[0].pages) * spec.page_bytes, "runs": runs,
                    "prompts": args.prompts}
            for lease in leases:
                lease.release()
    finally:
        proc.terminate()
        proc.wait()
        log.close()
    return info, rounds


def main():
    args = parse_args()
    build = os.path.abspath(args.build_dir)
    sys.path.insert(0, os.path.join(build, "python"))
    import numpy as np  # pylint: disable=import-outside-toplevel
    import radixkv  # pylint: disable=import-outside-toplevel
    import radixkv.pool  # pylint: disable=import-outside-toplevel
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        torch = None
    radixkvd = os.path.join(build, "daemon", "radixkvd")
    tmp = tempfile.mkdtemp(prefix="rkv-pagebench-")
    try:
        info, rounds = run(args, radixkvd, tmp, np, torch, radixkv)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    modes = {mode: summarize(by_case, torch is not None) for mode, by_case in rounds.items()}
    result = dict(info, reps=args.reps, rounds=args.rounds, modes=modes,
                  torch=None if torch is None else torch.__version__, numpy=np.__version__)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{info['pages']} pages of {info['page_bytes']} B ({info['bytes'] / 2**20:.0f} MiB), "
          f"{info['runs']} run(s) of consecutive pages; per case the median of "
          f"{args.rounds} rounds' medians of {args.reps} calls; cold: "
          f"{info['prompts']} prompts in turn")
    for mode, summary in modes.items():
        print(f"{mode}:")
        for name, value in summary["median_us"].items():
            spread = f"{min(summary['rounds_us'][name]):.1f} .. {max(summary['rounds_us'][name]):.1f}"
            print(f"  {name:<34} {value:>9.1f} us   (rounds {spread})")
        for name, value in summary["ratios"].items():
            print(f"  ratio {name:<52} {value:.2f}")


def summarize(by_case, with_torch):
    us = {name: statistics.median(v) for name, v in by_case.items()}
    ratios = {}
    if with_torch:
        pool_copy, pool_alloc = us["memcpy from the pool"], us["memcpy from the pool, alloc"]
        ratios = {"gather_tensor / memcpy": us["gather_tensor"] / us["memcpy"],
                  "gather_tensor / memcpy from the pool": us["gather_tensor"] / pool_copy,
                  "gather_tensor, alloc / memcpy from the pool, alloc":
                      us["gather_tensor, alloc"] / pool_alloc,
                  "gather_tensor, shuffled / memcpy from the pool":
                      us["gather_tensor, shuffled"] / pool_copy,
                  "torch, per page / memcpy from the pool": us["torch, per page"] / pool_copy,
                  "torch.stack / memcpy from the pool, alloc": us["torch.stack"] / pool_alloc}
    return {"median_us": us, "rounds_us": by_case, "ratios": ratios}


if __name__ == "__main__":
    main()
