#!/usr/bin/python3
"""Cross-checks radixkv's eviction against an independent simulation.

First replays a few small hand-made corner-case traces (SCENARIOS). Then,
for each capacity (3000, 10000 and unbounded by default), runs
  1. bench/sim/leaf_lru_sim.py            (leaf-only LRU, docs/ARCHITECTURE.md),
  2. replay --mode=inproc                 (RadixTree in process),
  3. replay --mode=daemon                 (a radixkvd started here with
                                           --pool=none,pages=N on a /tmp socket)
with one client, in arrival order, and asserts that all three report the
same matched block count (hence the same hit ratio). The daemon's own
hit_tokens / lookup_tokens counters are checked too.

With --eviction_policy=turn_duel the tree and the daemon run that policy
and the simulation is bench/sim/policy_sim.py's turn_duel hashing on the
block keys replay gives the daemon (--block_keys; it needs NumPy and
xxhash, so run this script with the project's virtual environment); all
three must agree. The hand-made scenarios are lru's.

  bench/replay/check_hit_ratio.py --build_dir=build-bench [--capacities=3000,0]
  bench/replay/check_hit_ratio.py --build_dir=build-bench --eviction_policy=turn_duel

Exit status: 0 all equal, 1 a mismatch or a failed run, 3 bad arguments.
Without a radixkvd binary the daemon column is reported as skipped (and
--require_daemon turns that into a failure).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TRACE = None  # <build_dir>/data/conversation_trace.jsonl


def run_json(cmd):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for_socket(path, proc, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("radixkvd exited with %s before listening"
                               % proc.returncode)
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.1)
    raise RuntimeError("radixkvd did not listen on %s within %d s"
                       % (path, timeout_s))


class Daemon:
    """A radixkvd child process with an index-only pool of `pages` pages."""

    def __init__(self, binary, pages, page_size, extra_flags):
        self.dir = tempfile.mkdtemp(prefix="rkvb", dir="/tmp")
        self.sock = os.path.join(self.dir, "d.sock")
        self.log = open(os.path.join(self.dir, "radixkvd.log"), "w")
        # One replay session may pin the whole pool, as the simulation's
        # single cache does (the daemon's default is half of it).
        cmd = [binary, "--socket=" + self.sock, "--metrics_listen=",
               "--pool=none,pages=%d" % pages,
               "--max_pinned_pages_per_session=%d" % pages] + extra_flags
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        try:
            wait_for_socket(self.sock, self.proc)
        except Exception:
            self.stop()
            raise

    def endpoint(self):
        return "unix:" + self.sock

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# Small hand-made traces (capacity, requests) that reach the corners of the
# policy: LRU leaf choice, eviction cascades, a request's own pinned path
# leaving no room (fewer pages than asked), recency refresh, equal ids under
# different parents. The expected matched counts are checked in
# bench/sim/leaf_lru_sim.py --self_test.
SCENARIOS = [
    (3, [[1, 2, 3], [4], [1, 2, 3]]),
    (3, [[1, 2, 3], [4, 5, 6], [1]]),
    (3, [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4]]),
    (2, [[1], [2], [1], [3], [1], [2]]),
    (0, [[1, 2, 3], [1, 2, 4], [1, 2, 4, 5]]),
    (0, [[1, 2], [3, 2], [3, 2]]),
    (2, [[1, 2, 3, 4], [1, 2, 3, 4]]),
]


def check_scenarios(replay, radixkvd, sim, daemon_flags):
    """Returns True when sim, inproc and daemon agree on every scenario."""
    ok = True
    page_size = 4
    for i, (cap, requests) in enumerate(SCENARIOS):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", dir="/tmp",
                                         delete=False) as f:
            for r in requests:
                f.write(json.dumps({"timestamp": 0, "hash_ids": r}) + "\n")
            trace = f.name
        try:
            s = run_json(["/usr/bin/python3", sim, "--trace=" + trace,
                          "--capacity=%d" % cap, "--json"])
            common = ["--trace=" + trace, "--page_size=%d" % page_size,
                      "--clients=1", "--json"]
            r = run_json([replay, "--mode=inproc", "--capacity=%d" % cap] + common)
            d = None
            if radixkvd:
                daemon = Daemon(radixkvd, cap if cap else 64, page_size, daemon_flags)
                try:
                    d = run_json([replay, "--mode=daemon",
                                  "--endpoint=" + daemon.endpoint()] + common)
                finally:
                    daemon.stop()
        finally:
            os.unlink(trace)
        same = (s["matched_blocks"] == r["matched_blocks"]
                and r.get("invariants") == "ok"
                and (d is None or d["matched_blocks"] == s["matched_blocks"]))
        ok = ok and same
        print("scenario %d capacity %d %s: matched sim %d inproc %d daemon %s  %s"
              % (i, cap, requests, s["matched_blocks"], r["matched_blocks"],
                 d["matched_blocks"] if d else "skipped",
                 "EQUAL" if same else "MISMATCH"), flush=True)
    return ok


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    p.add_argument("--trace", default=DEFAULT_TRACE)
    p.add_argument("--capacities", default="3000,10000,0",
                   help="comma-separated pages; 0 = unbounded")
    p.add_argument("--page_size", type=int, default=512)
    p.add_argument("--require_daemon", action="store_true")
    p.add_argument("--daemon_flags", default="",
                   help="extra radixkvd flags, space-separated")
    p.add_argument("--skip_scenarios", action="store_true",
                   help="skip the small hand-made corner-case traces")
    p.add_argument("--eviction_policy", choices=("lru", "turn_duel"),
                   default="lru")
    args = p.parse_args(argv)
    lru = args.eviction_policy == "lru"
    if not lru:
        args.skip_scenarios = True
    args.daemon_flags += " --eviction_policy=" + args.eviction_policy
    try:
        capacities = [int(c) for c in args.capacities.split(",") if c]
    except ValueError:
        p.error("--capacities must be integers, got %r" % args.capacities)
    if any(c < 0 for c in capacities):
        p.error("--capacities must be >= 0")

    if args.trace is None:
        args.trace = os.path.join(args.build_dir,
                                  "data/conversation_trace.jsonl")
    replay = os.path.join(args.build_dir, "bench/replay/replay")
    radixkvd = os.path.join(args.build_dir, "daemon/radixkvd")
    sim = os.path.join(REPO, "bench/sim/leaf_lru_sim.py")
    policy_sim = os.path.join(REPO, "bench/sim/policy_sim.py")
    if not os.access(replay, os.X_OK):
        print("Error: %s not built (cmake --build %s --target replay)"
              % (replay, args.build_dir), file=sys.stderr)
        return 3
    have_daemon = os.access(radixkvd, os.X_OK)
    if args.require_daemon and not have_daemon:
        print("Error: %s not built" % radixkvd, file=sys.stderr)
        return 1

    ok = True
    if not args.skip_scenarios:
        ok = check_scenarios(replay, radixkvd if have_daemon else None, sim,
                             args.daemon_flags.split())
    rows = []
    for cap in capacities:
        if lru:
            s = run_json(["/usr/bin/python3", sim, "--trace=" + args.trace,
                          "--capacity=%d" % cap, "--json"])
        else:
            s = run_json([sys.executable, policy_sim, "--trace=" + args.trace,
                          "--policy=" + args.eviction_policy,
                          "--block_keys=%d" % args.page_size,
                          "--capacity=%d" % cap, "--json"])
        common = ["--trace=" + args.trace, "--page_size=%d" % args.page_size,
                  "--clients=1", "--json"]
        r = run_json([replay, "--mode=inproc", "--capacity=%d" % cap,
                      "--eviction_policy=" + args.eviction_policy] + common)
        d = None
        if have_daemon:
            # Unbounded: a pool with room for every block the trace has.
            pages = cap if cap else s["blocks"] + 1
            daemon = Daemon(radixkvd, pages, args.page_size,
                            args.daemon_flags.split())
            try:
                d = run_json([replay, "--mode=daemon",
                              "--endpoint=" + daemon.endpoint()] + common)
            finally:
                daemon.stop()
        label = str(cap) if cap else "unbounded"
        row = {"capacity": label, "sim": s["matched_blocks"],
               "inproc": r["matched_blocks"],
               "daemon": d["matched_blocks"] if d else None,
               "blocks": s["blocks"], "hit_ratio": s["hit_ratio"],
               "inproc_rps": r["requests_per_second"],
               "daemon_rps": d["requests_per_second"] if d else None,
               "inproc_invariants": r.get("invariants")}
        want = row["sim"]
        equal = row["inproc"] == want and (d is None or row["daemon"] == want)
        if r.get("invariants") not in (None, "ok"):
            equal = False
        if d is not None:
            lookup = d.get("daemon_lookup_tokens")
            hit = d.get("daemon_hit_tokens")
            if lookup is not None and hit is not None:
                row["daemon_counter_ratio"] = hit / lookup if lookup else 0.0
                if hit != d["matched_blocks"] * args.page_size:
                    equal = False
                    row["note"] = "daemon hit_tokens disagrees with replies"
        row["equal"] = equal
        ok = ok and equal
        rows.append(row)
        print("capacity %-9s blocks %d  matched: sim %d  inproc %d  daemon %s"
              "  hit ratio %.4f %%  %s"
              % (label, row["blocks"], row["sim"],
                 row["inproc"], row["daemon"] if d else "skipped",
                 100 * row["hit_ratio"],
                 "EQUAL" if equal else "MISMATCH"), flush=True)
    print(json.dumps(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
