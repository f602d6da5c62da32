#!/usr/bin/python3
"""Cross-check of the tiered policy: radixkvd with tiers below its page
pool against the independent simulation (bench/sim/tiered_sim.py),
request for request on a Mooncake trace.

Starts radixkvd with a host pool of CAPACITY pages (the replay's tiny
layout: 512-byte pages at 16 tokens per block), a host tier of HOST blocks
(none with --host=0) and a disk tier in a temporary directory sized for
TIER blocks (none with --tier=0), replays the trace through the raw stub
with one client (Acquire with allocation, Commit of every new block), and
compares the hit ratio (matched + promoted blocks over all blocks) with
the simulation of the same pool and one lower tier of HOST + TIER blocks:
a host tier that passes its least recently stored blocks down to the disk
tier, and takes only the newest of an eviction larger than itself, keeps
one least-recently-demoted order across both. Exit 1 when they differ or
a tier dropped a block (staging full, write error).

The disk tier runs with the daemon's default settings (asynchronous
demotion: blocks are hits while their writes are queued) unless --demote
names drop or wait (write-through).

With --eviction_policy=turn_duel radixkvd runs that policy, which keeps
the victims on its probation stack from the tiers, and the simulation is
bench/sim/policy_sim.py's turn_duel over the same tier, hashing on the
replay's block keys (run with the project's venv: it needs NumPy and
xxhash). Besides the hit ratio, the blocks the tiers were offered and the
blocks the policy kept from them must equal the simulation's.

  bench/replay/check_tier_hit_ratio.py --build_dir=build/lead \
      [--capacity=3000] [--host=0] [--tier=30000] [--requests=0] \
      [--tier_dir=/tmp] [--demote=default|drop|wait] \
      [--eviction_policy=lru|turn_duel] [--trace=PATH]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench", "sim"))
sys.path.insert(0, os.path.join(REPO, "bench", "replay"))
import tiered_sim  # noqa: E402
from check_hit_ratio import wait_for_socket  # noqa: E402

PAGE_BYTES = 512    # replay --tiny_layout at 16 tokens per block
PAGE_SIZE = 16


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build_dir", required=True)
    p.add_argument("--capacity", type=int, default=3000)
    p.add_argument("--host", type=int, default=0,
                   help="host tier blocks above the disk tier (0: none)")
    p.add_argument("--tier", type=int, default=30000,
                   help="disk tier blocks (0: none)")
    p.add_argument("--trace", default=None,
                   help="a trace in the Mooncake format (default: the "
                        "build's conversation trace)")
    p.add_argument("--requests", type=int, default=0, help="0: the whole trace")
    p.add_argument("--tier_dir", default="/tmp")
    p.add_argument("--demote", choices=("default", "drop", "wait"),
                   default="default",
                   help="the disk tier's demote= (default: the daemon's own "
                        "default, no demote= key)")
    p.add_argument("--eviction_policy", choices=("lru", "turn_duel"),
                   default="lru")
    args = p.parse_args(argv)
    trace = args.trace or os.path.join(args.build_dir, "data",
                                       "conversation_trace.jsonl")
    if args.requests:
        fd, cut = tempfile.mkstemp(suffix=".jsonl")
        with os.fdopen(fd, "w") as out, open(trace) as f:
            for i, line in zip(range(args.requests), f):
                out.write(line)
        trace = cut
    work = tempfile.mkdtemp(prefix="rkvtier", dir=args.tier_dir)
    sock = os.path.join(work, "d.sock")
    log = open(os.path.join(work, "radixkvd.log"), "w")
    # Exactly TIER slots (docs/TIERS.md, layout): a 4 KiB superblock, a
    # 128-byte header per slot padded to 4 KiB, then 4 KiB data slots.
    tier_bytes = 4096 + -(-args.tier * 128 // 4096) * 4096 + args.tier * 4096
    tiers = []
    if args.host:
        tiers.append("host,bytes=%d" % (args.host * PAGE_BYTES))
    if args.tier:
        demote = "" if args.demote == "default" else ",demote=" + args.demote
        tiers.append("disk,path=%s,bytes=%d%s" % (work, tier_bytes, demote))
    if not tiers:
        p.error("--host=0 and --tier=0: no tier to check")
    daemon = subprocess.Popen(
        [os.path.join(args.build_dir, "daemon", "radixkvd"), "--socket=" + sock,
         "--metrics_listen=",
         "--pool=host,bytes=%d,page_bytes=%d" % (args.capacity * PAGE_BYTES,
                                                 PAGE_BYTES),
         "--tier=" + ";".join(tiers),
         "--eviction_policy=" + args.eviction_policy,
         "--max_pinned_pages_per_session=%d" % args.capacity,
         "--max_prompt_tokens=1048576"],
        stdout=log, stderr=log)
    try:
        wait_for_socket(sock, daemon)
        out = subprocess.run(
            [os.path.join(args.build_dir, "bench", "replay", "replay"),
             "--mode=daemon", "--via=stub", "--tiny_layout", "--clients=1",
             "--page_size=%d" % PAGE_SIZE, "--endpoint=unix:" + sock,
             "--trace=" + trace, "--json"],
            check=True, capture_output=True, text=True, timeout=3600)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        stats = subprocess.run(
            [os.path.join(args.build_dir, "client", "radixkvctl"),
             "--endpoint=unix:" + sock, "stats", "-o", "json"],
            check=True, capture_output=True, text=True, timeout=60)
        st = json.loads(stats.stdout)["stats"]
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()
    def field(t, name):
        camel = name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
        return int(t.get(camel, t.get(name, 0)))

    slots = dropped = written = 0
    tiers = st.get("tiers", [])
    for t in tiers:
        lost = field(t, "dropped_full") + field(t, "dropped_error")
        slots += field(t, "capacity_blocks")
        dropped += lost
        written += field(t, "bytes_written")
        print("radixkvd tier %s: %d blocks, %d demoted, %d promoted, "
              "%d forgotten or moved down, %d dropped (%d full, %d error), "
              "%d bytes written" % (
                  t.get("kind"), field(t, "capacity_blocks"),
                  field(t, "demoted_blocks"), field(t, "promoted_blocks"),
                  field(t, "forgotten_blocks"), lost,
                  field(t, "dropped_full"), field(t, "dropped_error"),
                  field(t, "bytes_written")))
    # The top tier is offered what the pool demotes; the policy's drops
    # are counted there.
    offered = field(tiers[0], "demoted_blocks") if tiers else 0
    declined = field(tiers[0], "dropped_policy") if tiers else 0
    if args.eviction_policy == "lru":
        sim = tiered_sim.run(trace, args.capacity, slots)
        sim["demoted"], sim["declined"] = sim["evicted"], 0
    else:
        import policy_sim
        from leaf_lru_sim import read_trace
        sim = policy_sim.run_policy(
            args.eviction_policy, list(read_trace(trace)), args.capacity,
            policy_sim.BlockKeyer(PAGE_SIZE, tiny=True), slots)
        sim["promoted_blocks"] = sim["promoted"]
    print("radixkvd: matched %d, hit_ratio %.6f (tiers of %d blocks in all); "
          "%d blocks offered to the tiers, %d kept from them by the policy, "
          "%d bytes written to the tiers" % (
              got["matched_blocks"], got["hit_ratio"], slots, offered,
              declined, written))
    print("simulation: matched %d, hit_ratio %.6f (%d promoted); %d offered, "
          "%d kept from the tiers" % (
              sim["matched_blocks"], sim["hit_ratio"], sim["promoted_blocks"],
              sim["demoted"], sim["declined"]))
    shutil.rmtree(work, ignore_errors=True)
    if dropped:
        print("FAIL: the tier dropped blocks; the comparison is void")
        return 1
    if got["matched_blocks"] != sim["matched_blocks"]:
        print("FAIL: radixkvd and the simulation differ")
        return 1
    if (offered, declined) != (sim["demoted"], sim["declined"]):
        print("FAIL: the blocks offered to or kept from the tiers differ")
        return 1
    print("OK: equal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
