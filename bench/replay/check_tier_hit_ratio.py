#!/usr/bin/python3
"""Cross-check of the two-tier policy: radixkvd with a disk tier below its
page pool against the independent simulation (bench/sim/tiered_sim.py),
request for request on a Mooncake trace.

Starts radixkvd with a host pool of CAPACITY pages (the replay's tiny
layout: 512-byte pages at 16 tokens per block) and a disk tier in a
temporary directory sized for TIER blocks, replays the trace through the
raw stub with one client (Acquire with allocation, Commit of every new
block), and compares the hit ratio (matched + promoted blocks over all
blocks) with the simulation of the same pool and tier. Exit 1 when they
differ or the tier dropped a block (staging full, write error).

  bench/replay/check_tier_hit_ratio.py --build_dir=build/lead \
      [--capacity=3000] [--tier=30000] [--requests=0] [--tier_dir=/tmp]
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
    p.add_argument("--tier", type=int, default=30000)
    p.add_argument("--requests", type=int, default=0, help="0: the whole trace")
    p.add_argument("--tier_dir", default="/tmp")
    args = p.parse_args(argv)
    trace = os.path.join(args.build_dir, "data", "conversation_trace.jsonl")
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
    daemon = subprocess.Popen(
        [os.path.join(args.build_dir, "daemon", "radixkvd"), "--socket=" + sock,
         "--metrics_listen=",
         "--pool=host,bytes=%d,page_bytes=%d" % (args.capacity * PAGE_BYTES,
                                                 PAGE_BYTES),
         "--tier=disk,path=%s,bytes=%d,demote=wait" % (work, tier_bytes),
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
    tier = st.get("tier", {})
    slots = int(tier.get("capacityBlocks", tier.get("capacity_blocks", 0)))
    sim = tiered_sim.run(trace, args.capacity, slots)
    dropped = int(tier.get("droppedFull", tier.get("dropped_full", 0))) + \
        int(tier.get("droppedError", tier.get("dropped_error", 0)))
    print("radixkvd: matched %d, hit_ratio %.6f (tier of %d blocks: %s "
          "demoted, %s promoted, %d dropped)" % (got["matched_blocks"],
                                                 got["hit_ratio"], slots,
                                     tier.get("demoted_blocks", "?"),
                                     tier.get("promoted_blocks", "?"), dropped))
    print("simulation: matched %d, hit_ratio %.6f (%d promoted)" % (
        sim["matched_blocks"], sim["hit_ratio"], sim["promoted_blocks"]))
    print("tier stats: " + json.dumps(tier, sort_keys=True))
    shutil.rmtree(work, ignore_errors=True)
    if dropped:
        print("FAIL: the tier dropped blocks; the comparison is void")
        return 1
    if got["matched_blocks"] != sim["matched_blocks"]:
        print("FAIL: radixkvd and the simulation differ")
        return 1
    print("OK: equal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
