#!/usr/bin/python3
"""Crash-and-stall soak of radixkvd with real worker processes.

Starts radixkvd with a small host pool (eviction all the time) and a short
--lease_ttl, runs writer and reader soak_worker processes against it, and
sends them random SIGKILLs and SIGSTOP ... SIGCONT pauses, aimed at workers
that are mid-Acquire, mid-write or mid-Commit (each worker publishes its
phase in a shared file, bench/soak/soak_shared.h). Killed workers are
restarted under a new owner id.

Writers stamp every page they write with (block key, owner id, generation);
every worker checks every page it hits: the stamp must be intact, name the
block key the page was matched for, and name the page's committer.

Afterwards, with every worker gone: one verifier worker checks every cached
prompt once, then the daemon must hold no session, no lease, no writing or
pinned page, pass its page-accounting invariant, and free every page on
Clear (nothing leaked), and must exit 0 on SIGTERM.

Modes:
  kill   SIGKILLs and short pauses (well below the lease TTL)
  stall  pauses longer than the lease TTL (plus the 1 s sweep), aimed at
         writers mid-write and mid-Commit: a daemon that frees a stalled
         writer's pages lets it overwrite pages another writer now owns

With --host_tier_pages and/or --disk_tier_pages the daemon gets tiers below
the pool (blocks demoted and promoted all the time); a promoted block's
stamp names the page it was written into, whose records name its
committer.

Exit status: 0 when every check passed, 1 when one failed (stale reads,
leaked pages or leases, a failed invariant, a daemon crash), 2 for bad
arguments or when the soak could not run.

  soak.py --build_dir=build/soak --mode=kill --events=1000
  soak.py --build_dir=build/soak --mode=stall --seconds=25 --json=out.json
"""

import argparse
import heapq
import json
import mmap
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

MAGIC = 0x534B5652
HEADER_BYTES = 64
SLOT_BYTES = 256
PAGE_RECORDS_BYTES = 512
# SlotHeader: phase u32, pid u32, owner u64, unused u64, then counters.
COUNTERS = [
    "ops", "degraded", "acquire_errors", "pages_written", "commits_ok",
    "commits_failed", "inserted", "deduplicated", "hits_verified",
    "stale_key", "foreign_owner", "committer_unknown", "late_mismatch",
    "commits_unknown", "promoted", "moved_verified", "older_copy",
]
PHASES = ["idle", "starting", "acquire", "verify", "write", "commit",
          "release"]
PAGE_BYTES = 8192  # the soak namespace: 1 layer x 2 x 1 head x 16 x 64 x fp32


class SharedFile:
    """The soak's shared file (soak_shared.h), mapped read-write."""

    def __init__(self, path, slots, pages):
        self.slots = slots
        size = HEADER_BYTES + slots * SLOT_BYTES + pages * PAGE_RECORDS_BYTES
        with open(path, "wb") as f:
            f.write(struct.pack("<III", MAGIC, slots, pages))
            f.truncate(size)
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, size)

    def _base(self, slot):
        return HEADER_BYTES + slot * SLOT_BYTES

    def phase(self, slot):
        return struct.unpack_from("<I", self.map, self._base(slot))[0]

    def set_phase(self, slot, phase):
        struct.pack_into("<I", self.map, self._base(slot), phase)

    def counters(self, slot):
        vals = struct.unpack_from("<%dQ" % len(COUNTERS), self.map,
                                  self._base(slot) + 24)
        return dict(zip(COUNTERS, vals))

    def totals(self):
        out = dict.fromkeys(COUNTERS, 0)
        for s in range(self.slots):
            for k, v in self.counters(s).items():
                out[k] += v
        return out


class Ctl:
    def __init__(self, path, socket):
        self.cmd = [path, "--endpoint=unix:" + socket]

    def stats(self):
        out = subprocess.run(self.cmd + ["stats", "-o", "json"], check=True,
                             capture_output=True, text=True, timeout=30)
        st = json.loads(out.stdout)["stats"]
        return {k: (int(v) if isinstance(v, str) and v.isdigit() else v)
                for k, v in st.items()}

    def clear(self):
        subprocess.run(self.cmd + ["clear", "--yes"], check=True,
                       capture_output=True, timeout=30)


def find_binary(build_dir, rel, override):
    path = override or os.path.join(build_dir, rel)
    if not os.access(path, os.X_OK):
        sys.exit("soak.py: %s is not an executable (build it, or pass "
                 "--build_dir)" % path)
    return path


class Soak:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.dir = tempfile.mkdtemp(prefix="rkv-soak-")
        self.socket = os.path.join(self.dir, "rkv.sock")
        self.slots = args.writers + args.readers + 1  # + the verifier
        self.shared = SharedFile(os.path.join(self.dir, "shared"), self.slots,
                                 args.pool_pages)
        self.ctl = Ctl(args.radixkvctl, self.socket)
        self.workers = {}    # slot -> Popen
        self.stopped = {}    # slot -> SIGCONT due (monotonic)
        self.cont_heap = []  # (due, slot, pid)
        self.next_owner = 1
        self.events = {"kill": 0, "stall": 0}
        self.by_phase = {}
        self.restarts = 0
        self.unexpected_exits = 0
        self.max_stopped = 0
        self.daemon = None
        self.failures = []

    # --- processes ---

    def start_daemon(self):
        log = open(os.path.join(self.dir, "radixkvd.log"), "w")
        self.daemon = subprocess.Popen(
            [self.a.radixkvd, "--socket=" + self.socket, "--metrics_listen=",
             "--pool=host,bytes=%d%s" % (
                 self.a.pool_pages * PAGE_BYTES,
                 ",page_bytes=%d" % PAGE_BYTES if self.tier_flags() else ""),
             "--lease_ttl=%dms" % self.a.lease_ttl_ms, "--log_level=warning"]
            + self.tier_flags(),
            stdout=subprocess.PIPE, stderr=log, text=True)
        deadline = time.monotonic() + 30
        for line in self.daemon.stdout:
            if "ready" in line:
                break
            if time.monotonic() > deadline:
                break
        if self.daemon.poll() is not None or not os.path.exists(self.socket):
            sys.exit("soak.py: radixkvd did not start; see %s" % log.name)

    def tier_flags(self):
        tiers = []
        if self.a.host_tier_pages:
            tiers.append("host,bytes=%d" % (self.a.host_tier_pages * PAGE_BYTES))
        if self.a.disk_tier_pages:
            os.makedirs(os.path.join(self.dir, "tier"), exist_ok=True)
            tiers.append("disk,path=%s,bytes=%d" % (
                os.path.join(self.dir, "tier"),
                self.a.disk_tier_pages * PAGE_BYTES))
        return ["--tier=" + ";".join(tiers)] if tiers else []

    def spawn(self, slot, role=None):
        if role is None:
            role = "writer" if slot < self.a.writers else "reader"
        owner = self.next_owner
        self.next_owner += 1
        self.shared.set_phase(slot, 1)
        err = open(os.path.join(self.dir, "worker-%d.log" % slot), "a")
        self.workers[slot] = subprocess.Popen(
            [self.a.soak_worker, "--socket=" + self.socket,
             "--shared=" + self.shared_path(), "--slot=%d" % slot,
             "--owner=%d" % owner, "--role=" + role,
             "--seed=%d" % self.rng.getrandbits(48),
             "--systems=%d" % self.a.systems, "--users=%d" % self.a.users,
             "--write_pause_us=%d" % self.a.write_pause_us,
             "--lease_ttl_ms=%d" % self.a.lease_ttl_ms,
             "--tiers=%d" % bool(self.tier_flags())],
            stdout=subprocess.DEVNULL, stderr=err)
        err.close()
        return self.workers[slot]

    def shared_path(self):
        return os.path.join(self.dir, "shared")

    def reap(self):
        for slot, p in list(self.workers.items()):
            rc = p.poll()
            if rc is None:
                continue
            if rc != -signal.SIGKILL:
                self.unexpected_exits += 1
                self.failures.append("worker in slot %d exited with %s" %
                                     (slot, rc))
            self.stopped.pop(slot, None)
            self.restarts += 1
            self.spawn(slot)

    def resume_due(self, now):
        while self.cont_heap and self.cont_heap[0][0] <= now:
            _, slot, pid = heapq.heappop(self.cont_heap)
            p = self.workers.get(slot)
            if p is not None and p.pid == pid and slot in self.stopped:
                os.kill(pid, signal.SIGCONT)
                del self.stopped[slot]

    # --- signals ---

    def pick(self, phases, roles, wait_s):
        """A running worker in one of `phases`, polling up to wait_s."""
        cands = [s for s in range(self.a.writers + self.a.readers)
                 if s not in self.stopped and
                 ("writer" if s < self.a.writers else "reader") in roles]
        deadline = time.monotonic() + wait_s
        while True:
            self.rng.shuffle(cands)
            for s in cands:
                ph = self.shared.phase(s)
                if ph in phases and self.workers[s].poll() is None:
                    return s, ph
            if time.monotonic() >= deadline:
                return None, None
            time.sleep(0.0002)

    def one_event(self):
        a = self.a
        if a.mode == "kill":
            kill = self.rng.random() < a.kill_fraction
            target = self.rng.choice(["acquire", "write", "commit", "any"])
            roles = ("writer", "reader")
        else:
            kill = False
            target = self.rng.choice(["write", "write", "commit"])
            roles = ("writer",)
            if len(self.stopped) >= a.max_stalled:
                return False
        phases = ({2, 3, 4, 5, 6} if target == "any" else
                  {PHASES.index(target)})
        slot, ph = self.pick(phases, roles, 0.05)
        if slot is None:
            slot, ph = self.pick({2, 3, 4, 5, 6, 0}, roles, 0.0)
        if slot is None:
            return False
        pid = self.workers[slot].pid
        name = PHASES[ph]
        if kill:
            os.kill(pid, signal.SIGKILL)
            self.events["kill"] += 1
            key = "kill@" + name
        else:
            os.kill(pid, signal.SIGSTOP)
            if a.mode == "kill":
                ms = self.rng.uniform(1, a.short_stall_ms)
            else:
                ms = self.rng.uniform(a.lease_ttl_ms + 1500,
                                      a.lease_ttl_ms + 2500)
            due = time.monotonic() + ms / 1000.0
            self.stopped[slot] = due
            heapq.heappush(self.cont_heap, (due, slot, pid))
            self.max_stopped = max(self.max_stopped, len(self.stopped))
            self.events["stall"] += 1
            key = "stall@" + name
        self.by_phase[key] = self.by_phase.get(key, 0) + 1
        return True

    # --- the run ---

    def run(self):
        a = self.a
        self.start_daemon()
        for s in range(a.writers + a.readers):
            self.spawn(s)
        t0 = time.monotonic()
        time.sleep(a.warmup_s)
        interval = a.seconds / max(1, a.events) if a.events else 0
        next_at = time.monotonic()
        while True:
            now = time.monotonic()
            elapsed = now - t0
            total = self.events["kill"] + self.events["stall"]
            if a.events and total >= a.events and elapsed >= a.seconds * 0.5:
                break
            if elapsed >= a.seconds + (a.grace_s if a.events else 0):
                break
            self.resume_due(now)
            self.reap()
            if self.daemon.poll() is not None:
                self.failures.append("radixkvd exited with %s during the soak"
                                     % self.daemon.returncode)
                break
            if now >= next_at:
                if self.one_event():
                    next_at = now + (interval * self.rng.uniform(0.2, 1.8)
                                     if interval else 0.05)
            else:
                time.sleep(min(0.002, next_at - now))
        self.chaos_s = time.monotonic() - t0
        self.quiesce()

    def quiesce(self):
        # Stalls must end (a stopped writer may still overwrite); then
        # every worker dies.
        for slot in list(self.stopped):
            os.kill(self.workers[slot].pid, signal.SIGCONT)
        self.stopped.clear()
        time.sleep(0.3)
        for p in self.workers.values():
            if p.poll() is None:
                p.kill()
        for p in self.workers.values():
            p.wait()
        if self.daemon.poll() is not None:
            self.failures.append("radixkvd exited with %s"
                                 % self.daemon.returncode)
            return
        self.wait_idle("after the workers died")
        # One pass over every prompt by a fresh reader.
        verifier = self.spawn(self.slots - 1, role="verify")
        try:
            rc = verifier.wait(timeout=120)
        except subprocess.TimeoutExpired:
            verifier.kill()
            rc = "timeout"
        if rc != 0:
            self.failures.append("verifier exited with %s" % rc)
        self.final = self.wait_idle("after the verifier")
        st = self.final
        if st is not None:
            if not st.get("invariants_ok", False):
                self.failures.append("GetStats.invariants_ok is false")
            if (st.get("free_pages", 0) + st.get("writing_pages", 0) +
                    st.get("cached_pages", 0) != st.get("capacity_pages")):
                self.failures.append("free + writing + cached != capacity")
            self.ctl.clear()
            after = self.ctl.stats()
            self.after_clear = after
            if after.get("free_pages", 0) != after.get("capacity_pages"):
                self.failures.append(
                    "after Clear %s of %s pages are free (leaked pages)" %
                    (after.get("free_pages", 0), after.get("capacity_pages")))
        self.daemon.send_signal(signal.SIGTERM)
        try:
            rc = self.daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            rc = "timeout"
        if rc != 0:
            self.failures.append("radixkvd exited with %s on SIGTERM" % rc)

    def wait_idle(self, when):
        """Polls GetStats until no session, lease, writing or pinned page is
        left; records a failure naming what is left after --idle_timeout."""
        deadline = time.monotonic() + self.a.idle_timeout_s
        st = None
        keys = ("sessions", "leases", "writing_pages", "pinned_pages",
                "quarantined_pages")
        while time.monotonic() < deadline:
            st = self.ctl.stats()
            if all(st.get(k, 0) == 0 for k in keys):
                return st
            time.sleep(0.2)
        left = ", ".join("%s=%s" % (k, st.get(k, 0)) for k in keys)
        self.failures.append("%s the daemon still holds: %s" % (when, left))
        return st

    def report(self):
        t = self.shared.totals()
        stale = t["stale_key"] + t["foreign_owner"] + t["late_mismatch"]
        if stale:
            self.failures.append(
                "%d stale reads (%d another block's, torn or moved, %d not the "
                "committer's, %d after the reader's lease expired)" %
                (stale, t["stale_key"], t["foreign_owner"],
                 t["late_mismatch"]))
        total = self.events["kill"] + self.events["stall"]
        if self.a.events and total < self.a.events:
            self.failures.append("only %d of %d signals sent in %.0f s" %
                                 (total, self.a.events, self.chaos_s))
        final = getattr(self, "final", None) or {}
        out = {
            "mode": self.a.mode,
            "chaos_seconds": round(self.chaos_s, 1),
            "signals": total,
            "kills": self.events["kill"],
            "stalls": self.events["stall"],
            "by_phase": dict(sorted(self.by_phase.items())),
            "max_stalled_at_once": self.max_stopped,
            "restarts": self.restarts,
            "pool_pages": self.a.pool_pages,
            "lease_ttl_ms": self.a.lease_ttl_ms,
            "workers": {"writers": self.a.writers, "readers": self.a.readers},
            "counters": t,
            "stale_reads": stale,
            "daemon_after": {k: final.get(k) for k in (
                "capacity_pages", "free_pages", "cached_pages",
                "writing_pages", "pinned_pages", "sessions", "leases",
                "evicted_pages", "lease_expired", "lease_abandoned",
                "quarantined_pages", "invariants_ok")},
            "free_after_clear": getattr(self, "after_clear", {}).get(
                "free_pages"),
            "failures": self.failures,
            "ok": not self.failures,
        }
        return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build_dir", default="build/soak")
    p.add_argument("--radixkvd")
    p.add_argument("--radixkvctl")
    p.add_argument("--soak_worker")
    p.add_argument("--mode", choices=["kill", "stall"], default="kill")
    p.add_argument("--events", type=int, default=1000,
                   help="signals to send (kill mode); 0: run --seconds")
    p.add_argument("--seconds", type=float, default=40,
                   help="chaos time (with --events: the pace; the run "
                        "ends at --events, or --grace_s later)")
    p.add_argument("--grace_s", type=float, default=10)
    p.add_argument("--warmup_s", type=float, default=1.0)
    p.add_argument("--writers", type=int, default=6)
    p.add_argument("--readers", type=int, default=3)
    p.add_argument("--pool_pages", type=int, default=128)
    p.add_argument("--lease_ttl_ms", type=int, default=5000)
    p.add_argument("--host_tier_pages", type=int, default=0,
                   help="a host tier below the pool, this many pages")
    p.add_argument("--disk_tier_pages", type=int, default=0,
                   help="a disk tier (in the run directory), this many "
                        "pages")
    p.add_argument("--systems", type=int, default=4)
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--write_pause_us", type=int, default=300)
    p.add_argument("--kill_fraction", type=float, default=0.5)
    p.add_argument("--short_stall_ms", type=float, default=200)
    p.add_argument("--max_stalled", type=int, default=3)
    p.add_argument("--idle_timeout_s", type=float, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the report here")
    p.add_argument("--keep", action="store_true",
                   help="keep the run directory (logs)")
    a = p.parse_args()
    if a.mode == "kill" and a.short_stall_ms * 4 > a.lease_ttl_ms:
        sys.exit("soak.py: kill mode keeps pauses below a quarter of the "
                 "lease TTL")
    a.radixkvd = find_binary(a.build_dir, "daemon/radixkvd", a.radixkvd)
    a.radixkvctl = find_binary(a.build_dir, "client/radixkvctl", a.radixkvctl)
    a.soak_worker = find_binary(a.build_dir, "bench/soak/soak_worker",
                                a.soak_worker)
    soak = Soak(a)
    try:
        soak.run()
    finally:
        for p in soak.workers.values():
            if p.poll() is None:
                p.kill()
        if soak.daemon is not None and soak.daemon.poll() is None:
            soak.daemon.kill()
    out = soak.report()
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    if a.keep or not out["ok"]:
        print("soak.py: logs in %s" % soak.dir, file=sys.stderr)
    else:
        shutil.rmtree(soak.dir, ignore_errors=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
