"""The disk tier below the page pool, end to end (docs/TIERS.md): real
radixkvd processes, the reference worker writing and reading real pages,
a real tier file.

A 16-page pool holds two of the four 8-block prompts, so a pass over all
four evicts the first ones to the tier; the next pass finds them there,
copied back up before the Acquire answers. Every answer is checked bit
for bit: the first token's logits of a promoted prompt equal those of a
full prefill (`--no-cache`), through a restart after SIGTERM and after a
SIGKILL in the middle of demotions.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from rkv_testutil import Daemon  # noqa: E402
from radixkv import pb, pb_grpc  # noqa: E402

PAGE_BYTES = 8192   # one page of the reference worker's tiny model (its namespace)
POOL = f"host,bytes={16 * PAGE_BYTES},page_bytes={PAGE_BYTES}"
PROMPTS = 4
PROMPT_TOKENS = 128  # 8 blocks of 16


def binary(var):
    path = os.environ.get(var, "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"${var} does not name an executable (run through ctest)")
    return path


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("".join(
        " ".join(str((7 * i + 13 * j) % 500 + 1) for j in range(PROMPT_TOKENS)) + "\n"
        for i in range(PROMPTS)))
    return str(p)


@pytest.fixture
def tier_dir(tmp_path):
    d = tmp_path / "tier"
    d.mkdir()
    return str(d)


def start(tier_dir, *extra, tier_bytes="4MiB"):
    d = Daemon(binary("RADIXKVD"),
               [f"--tier=disk,path={tier_dir},bytes={tier_bytes}", *extra], POOL)
    d.start()
    return d


def run_worker(prompts, endpoint=None):
    args = [binary("RADIXKV_WORKER"), "run", "--prompts", prompts, "--json",
            "--decode", "4", "--device", "cpu"]
    args += ["--endpoint", endpoint] if endpoint else ["--no-cache"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture
def reference(prompts):
    """Full prefills: what every cached answer must equal."""
    return run_worker(prompts)


def check_equal(got, reference):
    for g, r in zip(got, reference):
        assert g["first_logits_xxh3"] == r["first_logits_xxh3"], (g, r)
        assert g["generated"] == r["generated"], (g, r)


def test_evicted_blocks_come_back_from_the_tier(prompts, tier_dir, reference):
    d = start(tier_dir)
    try:
        first = run_worker(prompts, "unix:" + d.sock)
        assert all(r["matched_tokens"] == 0 for r in first), first
        s = d.stats()
        assert s.tier.kind == "disk" and s.tier.demoted_blocks >= 16, s.tier
        # Explain sees prompt 0 in the tier, Match counts it there.
        ns = d.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces[0].namespace
        with open(prompts) as f:
            tokens = [int(t) for t in f.readline().split()]
        e = d.admin.Explain(pb.ExplainRequest(namespace=ns, tokens=tokens))
        assert e.matched_blocks == 0 and e.tier_blocks == 8, e
        assert all(b.state == pb.BLOCK_STATE_IN_TIER for b in e.blocks), e
        kv = pb_grpc.KvCacheStub(d._channel)
        m = kv.Match(pb.MatchRequest(namespace=ns, tokens=tokens))
        assert (m.matched_blocks, m.tier_matched_blocks) == (0, 8), m
        second = run_worker(prompts, "unix:" + d.sock)
        check_equal(second, reference)
        # Prompt 0 was evicted by prompts 2 and 3: all of it came back up.
        assert second[0]["matched_tokens"] >= PROMPT_TOKENS - 16, second[0]
        s = d.stats()
        assert s.tier.promoted_blocks >= 7, s.tier
        assert s.tier.checksum_failures == 0
        assert sum(s.tier.promotion_seconds_counts) >= 1
        assert s.invariants_ok
    finally:
        d.stop()


def test_a_restarted_daemon_serves_the_tier_again(prompts, tier_dir, reference):
    d = start(tier_dir)
    run_worker(prompts, "unix:" + d.sock)
    d.stop()  # SIGTERM: pending writes reach the file
    d = start(tier_dir)
    try:
        assert d.stats().tier.reloaded_blocks >= 16
        again = run_worker(prompts, "unix:" + d.sock)
        check_equal(again, reference)
        assert again[0]["matched_tokens"] >= PROMPT_TOKENS - 16, again[0]
        assert d.stats().tier.promoted_blocks >= 7
    finally:
        d.stop()


def test_sigkill_during_demotion_serves_no_wrong_bytes(prompts, tier_dir,
                                                       reference):
    for _ in range(3):
        d = start(tier_dir)
        worker = subprocess.Popen(
            [binary("RADIXKV_WORKER"), "run", "--prompts", prompts, "--json",
             "--decode", "1", "--device", "cpu", "--endpoint", "unix:" + d.sock],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.15)
        os.kill(d.proc.pid, signal.SIGKILL)
        worker.wait(timeout=60)
        d.proc.wait()
        d.cleanup()
    d = start(tier_dir)
    try:
        check_equal(run_worker(prompts, "unix:" + d.sock), reference)
        check_equal(run_worker(prompts, "unix:" + d.sock), reference)
        s = d.stats()
        assert s.invariants_ok and s.leases == 0 and s.writing_pages == 0
    finally:
        d.stop()


# A tier of exactly 10 slots: a 4 KiB superblock, one 4 KiB page of slot
# headers, 10 data slots.
SMALL_TIER_BYTES = 4096 + 4096 + 10 * PAGE_BYTES


@pytest.mark.parametrize("tier_bytes", ["4MiB", str(SMALL_TIER_BYTES)])
def test_tier_moves_are_kv_events_with_their_medium(prompts, tier_dir, tmp_path,
                                                    tier_bytes):
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgpack")
    endpoint = f"ipc://{tmp_path}/events.ipc"
    d = start(tier_dir, f"--kv_events_endpoint={endpoint}", tier_bytes=tier_bytes)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)
    try:
        run_worker(prompts, "unix:" + d.sock)
        run_worker(prompts, "unix:" + d.sock)
        s = d.stats().tier
        counts = {}
        deadline = time.time() + 10
        while time.time() < deadline:
            if not sub.poll(500):
                break
            _, _, payload = sub.recv_multipart()
            for ev in msgpack.unpackb(payload, raw=False)[1]:
                key = (ev["type"], ev.get("medium"))
                counts[key] = counts.get(key, 0) + len(ev.get("block_hashes", []))
    finally:
        sub.close()
        d.stop()
    # Every block that went down to the tier was published as stored on
    # DISK (and removed from the pool's CPU medium); every promoted one, and
    # every one the tier forgot to make room, as removed from DISK.
    assert counts.get(("BlockStored", "DISK"), 0) == s.demoted_blocks, (counts, s)
    assert counts.get(("BlockRemoved", "DISK"), 0) == \
        s.promoted_blocks + s.forgotten_blocks, (counts, s)
    if tier_bytes != "4MiB":
        assert s.capacity_blocks == 10 and s.forgotten_blocks > 0, s
    assert counts.get(("BlockRemoved", "CPU"), 0) >= s.demoted_blocks, counts


@pytest.mark.parametrize("tier,pool,want", [
    ("disk,path=/nonexistent/dir,bytes=1MiB", POOL, "--tier=disk"),
    ("disk,path={file},bytes=1MiB", POOL, "--tier=disk"),
    ("disk,path={dir},bytes=100", POOL, "--tier=disk"),
    ("disk,path={dir}", POOL, "bytes= is required"),
    ("disk,path={dir},bytes=1MiB,speed=9", POOL, "unknown key 'speed'"),
    ("host,bytes=1GiB", POOL, "not built yet"),
    ("disk,path={dir},bytes=1MiB", "host,bytes=64KiB", "page_bytes="),
    ("disk,path={dir},bytes=1MiB", "none,pages=16", "none pool"),
])
def test_bad_tier_flags_are_clear_startup_errors(tmp_path, tier, pool, want):
    f = tmp_path / "a-file"
    f.write_text("x")
    spec = tier.format(file=f, dir=tmp_path)
    r = subprocess.run([binary("RADIXKVD"), f"--socket={tmp_path}/s.sock",
                        "--metrics_listen=", f"--pool={pool}", f"--tier={spec}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode in (1, 2), (r.returncode, r.stderr)
    assert want in r.stderr, r.stderr
