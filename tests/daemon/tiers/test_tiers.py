"""The tiers below the page pool, end to end (docs/TIERS.md): real
radixkvd processes, the reference worker writing and reading real pages,
host tier memory and a real tier file.

A 16-page pool holds two of the four 8-block prompts, so a pass over all
four evicts the first ones to the tier; the next pass finds them there,
copied back up before the Acquire answers. Every answer is checked bit
for bit: the first token's logits of a promoted prompt equal those of a
full prefill (`--no-cache`), through a restart after SIGTERM and after a
SIGKILL in the middle of demotions.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from rkv_testutil import Daemon, executable  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_util import check_equal, run_worker  # noqa: E402
from radixkv import pb, pb_grpc  # noqa: E402

PAGE_BYTES = 8192   # one page of the reference worker's tiny model (its namespace)
POOL = f"host,bytes={16 * PAGE_BYTES},page_bytes={PAGE_BYTES}"
PROMPTS = 4
PROMPT_TOKENS = 128  # 8 blocks of 16


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


def start(tier_dir, *extra, tier_bytes="4MiB", spec=None):
    spec = spec or f"disk,path={tier_dir},bytes={tier_bytes}"
    d = Daemon(executable("RADIXKVD"), [f"--tier={spec}", *extra], POOL)
    d.start()
    return d


# The tier configurations every end-to-end case runs under: a disk tier, a
# host tier, and a small host tier (6 blocks) above a disk tier, so that
# blocks move on down from host memory to the file.
CHAINS = {
    "disk": "disk,path={dir},bytes=4MiB",
    "host": "host,bytes=1MiB",
    "host+disk": f"host,bytes={6 * PAGE_BYTES};disk,path={{dir}},bytes=4MiB",
}


def tiers_by_kind(stats):
    return {t.kind: t for t in stats.tiers}


@pytest.fixture
def reference(prompts):
    """Full prefills: what every cached answer must equal."""
    return run_worker(prompts)


@pytest.mark.parametrize("chain", list(CHAINS))
def test_evicted_blocks_come_back_from_the_tier(prompts, tier_dir, reference,
                                                chain):
    d = start(tier_dir, spec=CHAINS[chain].format(dir=tier_dir))
    try:
        first = run_worker(prompts, "unix:" + d.sock)
        assert all(r["matched_tokens"] == 0 for r in first), first
        s = d.stats()
        kinds = tiers_by_kind(s)
        assert list(kinds) == chain.split("+"), s.tiers
        assert s.tier == s.tiers[0]  # the top tier, for one-tier readers
        # 16 blocks left the pool, and every one is in a tier.
        assert sum(t.demoted_blocks for t in s.tiers) - \
            sum(t.forgotten_blocks for t in s.tiers[:-1]) >= 16, s.tiers
        assert all(t.dropped_full == 0 for t in s.tiers), s.tiers
        if chain == "host+disk":
            # The 6-block host tier holds the newest; older blocks went on
            # down, straight or after a while in host memory.
            assert kinds["host"].blocks == 6, kinds["host"]
            assert kinds["disk"].blocks >= 10, kinds["disk"]
        if "host" in kinds:
            assert not kinds["host"].pinned  # a host pool's tier: plain memory
        # Explain sees prompt 0 in the tiers, Match counts it there.
        ns = d.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces[0].namespace
        with open(prompts) as f:
            tokens = [int(t) for t in f.readline().split()]
        e = d.admin.Explain(pb.ExplainRequest(namespace=ns, tokens=tokens))
        assert e.matched_blocks == 0 and e.tier_blocks == 8, e
        assert all(b.state == pb.BLOCK_STATE_IN_TIER for b in e.blocks), e
        where = [b.tier for b in e.blocks]
        assert set(where) <= set(kinds) and all(where), where
        kv = pb_grpc.KvCacheStub(d._channel)
        m = kv.Match(pb.MatchRequest(namespace=ns, tokens=tokens))
        assert (m.matched_blocks, m.tier_matched_blocks) == (0, 8), m
        assert [c.kind for c in m.tier_matched] == list(kinds), m
        assert {c.kind: c.blocks for c in m.tier_matched} == \
            {k: where.count(k) for k in kinds}, (m, where)
        second = run_worker(prompts, "unix:" + d.sock)
        check_equal(second, reference)
        # Prompt 0 was evicted by prompts 2 and 3: all of it came back up.
        assert second[0]["matched_tokens"] >= PROMPT_TOKENS - 16, second[0]
        s = d.stats()
        assert sum(t.promoted_blocks for t in s.tiers) >= 7, s.tiers
        assert all(t.checksum_failures == 0 and t.copy_errors == 0
                   for t in s.tiers), s.tiers
        assert sum(sum(t.promotion_seconds_counts) for t in s.tiers) >= 1
        assert s.invariants_ok
    finally:
        d.stop()


def test_the_python_client_says_how_many_blocks_were_promoted(tier_dir):
    """The client libraries expose AcquireResponse.promoted_blocks: a prompt
    evicted to the host tier comes back promoted, and says so."""
    import radixkv
    # 2 (K and V) * 1 layer * 1 head * 64 * 16 tokens * 4 bytes = PAGE_BYTES.
    spec = radixkv.NamespaceSpec(model="promoted", num_layers=1,
                                 num_kv_heads=1, head_dim=64, page_size=16,
                                 dtype="fp32")
    d = start(tier_dir, spec=CHAINS["host"])
    try:
        with radixkv.Client(endpoint=d.sock, namespace=spec,
                            release_delay=0) as c:
            rows = [[(7 * i + 13 * j) % 500 + 1 for j in range(PROMPT_TOKENS)]
                    for i in range(PROMPTS)]
            for tokens in rows:  # 4 prompts of 8 blocks through 16 pages
                with c.acquire(tokens) as lease:
                    assert lease.promoted_blocks == 0
                    lease.commit()
            with c.acquire(rows[0]) as lease:
                assert lease.matched_blocks == 8, lease
                assert lease.promoted_blocks == 8, lease
            with c.acquire(rows[0]) as lease:  # in the pool now
                assert (lease.matched_blocks, lease.promoted_blocks) == (8, 0)
    finally:
        d.stop()


@pytest.mark.parametrize("chain", ["host", "disk"])
def test_a_block_written_again_leaves_the_tier(tier_dir, chain):
    """Promotion takes the run of blocks the tiers hold from the first new
    one; a block behind one no tier holds is written again, and its commit
    drops the tier's older copy: a block is in one place at a time."""
    import radixkv
    spec = radixkv.NamespaceSpec(model="again", num_layers=1, num_kv_heads=1,
                                 head_dim=64, page_size=16, dtype="fp32")
    d = start(tier_dir, spec=CHAINS[chain].format(dir=tier_dir))
    try:
        with radixkv.Client(endpoint=d.sock, namespace=spec,
                            release_delay=0) as c:
            rows = [[(7 * i + 13 * j) % 500 + 1 for j in range(PROMPT_TOKENS)]
                    for i in range(PROMPTS)]
            for tokens in rows:  # rows 0 and 1 go down to the tier
                with c.acquire(tokens) as lease:
                    lease.commit()
            # Block 0 of row 0 comes up alone, then the pool is cleared
            # (Clear does not demote): blocks 1..7 are in the tier only.
            with c.acquire(rows[0][:16]) as lease:
                assert lease.promoted_blocks == 1, lease
            d.admin.Clear(pb.ClearRequest())
            before = tiers_by_kind(d.stats())[chain]
            with c.acquire(rows[0]) as lease:
                assert (lease.matched_blocks, lease.promoted_blocks,
                        lease.new_blocks) == (0, 0, 8), lease
                lease.commit()
            after = tiers_by_kind(d.stats())[chain]
            assert after.superseded_blocks - before.superseded_blocks == 7, after
            assert before.blocks - after.blocks == 7, (before, after)
            ns = d.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces[0]
            e = d.admin.Explain(pb.ExplainRequest(namespace=ns.namespace,
                                                  tokens=rows[0]))
            assert [b.tier for b in e.blocks] == [""] * 8, e
            with c.acquire(rows[0]) as lease:
                assert (lease.matched_blocks, lease.promoted_blocks) == (8, 0)
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
            [executable("RADIXKV_WORKER"), "run", "--prompts", prompts, "--json",
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


def need_event_modules():
    """Skips the test without pyzmq and msgpack: call before any daemon
    starts."""
    pytest.importorskip("msgpack")
    pytest.importorskip("zmq")


def subscribe(endpoint):
    """A SUB socket on the daemon's KV-event endpoint, given time to join."""
    import zmq
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)
    return sub


def collect_events(sub):
    """Blocks per (event type, medium) received until the stream is quiet."""
    import msgpack
    counts = {}
    deadline = time.time() + 10
    while time.time() < deadline:
        if not sub.poll(500):
            break
        _, _, payload = sub.recv_multipart()
        for ev in msgpack.unpackb(payload, raw=False)[1]:
            key = (ev["type"], ev.get("medium"))
            counts[key] = counts.get(key, 0) + len(ev.get("block_hashes", []))
    return counts


# --kv_events_media: the host and disk tiers' media below a host pool
# (docs/EVENTS.md): vLLM's names (the default), or radixkv's own.
MEDIA = {"vllm": ("CPU_TIER1", "STORAGE"), "radixkv": ("CPU_TIER", "DISK")}


@pytest.mark.parametrize("media", sorted(MEDIA))
def test_host_and_disk_tier_moves_are_kv_events_with_their_media(
        prompts, tier_dir, tmp_path, media):
    need_event_modules()
    endpoint = f"ipc://{tmp_path}/events.ipc"
    d = start(tier_dir, f"--kv_events_endpoint={endpoint}",
              f"--kv_events_media={media}",
              spec=CHAINS["host+disk"].format(dir=tier_dir))
    sub = subscribe(endpoint)
    try:
        run_worker(prompts, "unix:" + d.sock)
        run_worker(prompts, "unix:" + d.sock)
        kinds = tiers_by_kind(d.stats())
        counts = collect_events(sub)
    finally:
        sub.close()
        d.stop()
    host, disk = kinds["host"], kinds["disk"]
    # A host tier below a host pool has a medium of its own, not the pool's
    # CPU. A block stored there was removed from it again when it was
    # promoted or moved down; a block moved down was stored on the disk's.
    host_medium, disk_medium = MEDIA[media]
    assert {m for _, m in counts} == {"CPU", host_medium, disk_medium}, counts
    assert counts.get(("BlockStored", host_medium), 0) == host.demoted_blocks, counts
    assert counts.get(("BlockRemoved", host_medium), 0) == host.promoted_blocks + \
        host.forgotten_blocks + host.superseded_blocks, (counts, host)
    assert counts.get(("BlockStored", disk_medium), 0) == disk.demoted_blocks, counts
    assert counts.get(("BlockRemoved", disk_medium), 0) == disk.promoted_blocks + \
        disk.forgotten_blocks + disk.superseded_blocks, (counts, disk)
    # The disk tier took what host memory passed down, and the blocks of
    # evictions larger than host memory straight from the pool.
    assert disk.demoted_blocks >= host.forgotten_blocks > 0, (host, disk)


def test_a_restart_keeps_the_disk_tier_not_the_host_tier(prompts, tier_dir,
                                                         reference):
    spec = CHAINS["host+disk"].format(dir=tier_dir)
    # No drain: the restart finds what the disk tier held before the stop
    # (the drain's own tests are below).
    d = start(tier_dir, "--drain_timeout=0", spec=spec)
    run_worker(prompts, "unix:" + d.sock)
    on_disk = tiers_by_kind(d.stats())["disk"].blocks
    d.stop()
    d = start(tier_dir, spec=spec)
    try:
        kinds = tiers_by_kind(d.stats())
        assert kinds["host"].blocks == 0, kinds["host"]
        assert kinds["disk"].reloaded_blocks == on_disk > 0, kinds["disk"]
        # What the disk tier reloaded is there again, block for block;
        # Explain finds none of it in the host tier.
        ns = None
        found = 0
        with open(prompts) as f:
            lines = [[int(t) for t in line.split()] for line in f]
        for tokens in lines:
            spaces = d.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces
            if not spaces:
                break
            ns = spaces[0].namespace
            e = d.admin.Explain(pb.ExplainRequest(namespace=ns, tokens=tokens))
            found += sum(b.tier == "disk" for b in e.blocks)
            assert all(b.tier != "host" for b in e.blocks), e
        again = run_worker(prompts, "unix:" + d.sock)
        check_equal(again, reference)
        assert ns is None or found == on_disk, (found, on_disk)
    finally:
        d.stop()


@pytest.mark.parametrize("tier_bytes", ["4MiB", str(SMALL_TIER_BYTES)])
def test_tier_moves_are_kv_events_with_their_medium(prompts, tier_dir, tmp_path,
                                                    tier_bytes):
    need_event_modules()
    endpoint = f"ipc://{tmp_path}/events.ipc"
    d = start(tier_dir, f"--kv_events_endpoint={endpoint}", tier_bytes=tier_bytes)
    sub = subscribe(endpoint)
    try:
        run_worker(prompts, "unix:" + d.sock)
        run_worker(prompts, "unix:" + d.sock)
        s = d.stats().tier
        counts = collect_events(sub)
    finally:
        sub.close()
        d.stop()
    # Every block that went down to the tier was published as stored on
    # STORAGE (vLLM's name; removed from the pool's CPU medium); every
    # promoted one, and every one the tier forgot to make room, as removed
    # from STORAGE.
    assert counts.get(("BlockStored", "STORAGE"), 0) == s.demoted_blocks, (counts, s)
    assert counts.get(("BlockRemoved", "STORAGE"), 0) == \
        s.promoted_blocks + s.forgotten_blocks + s.superseded_blocks, (counts, s)
    if tier_bytes != "4MiB":
        assert s.capacity_blocks == 10 and s.forgotten_blocks > 0, s
    assert counts.get(("BlockRemoved", "CPU"), 0) >= s.demoted_blocks, counts


def corrupt_one_stored_block(tier_dir):
    """Flips a data byte of the first slot with a valid-looking header in
    the tier file (docs/TIERS.md, layout); returns that slot."""
    import struct
    path = os.path.join(tier_dir, "radixkv-tier.dat")
    with open(path, "r+b") as f:
        sb = f.read(64)
        stride, slots, data_offset = struct.unpack_from("<QQQ", sb, 24)
        for i in range(slots):
            f.seek(4096 + 128 * i)
            if f.read(8) == b"RKVTSLOT":
                f.seek(data_offset + i * stride + 100)
                b = f.read(1)
                f.seek(data_offset + i * stride + 100)
                f.write(bytes([b[0] ^ 0x40]))
                return i
    raise AssertionError("no stored block in the tier file")


def cached_reference(tmp_path, tokens, cached):
    """The worker's answer for `tokens` when exactly their first `cached`
    tokens are cached (written by a prefill of those tokens alone, through
    a daemon without tiers). A partly cached prompt's logits are
    deterministic but not bit-identical to a full prefill's."""
    first = tmp_path / "cached_part.txt"
    whole = tmp_path / "whole.txt"
    first.write_text(" ".join(map(str, tokens[:cached])) + "\n")
    whole.write_text(" ".join(map(str, tokens)) + "\n")
    d = Daemon(executable("RADIXKVD"), [], POOL)
    d.start()
    try:
        run_worker(str(first), "unix:" + d.sock)
        got = run_worker(str(whole), "unix:" + d.sock)[0]
    finally:
        d.stop()
    assert got["matched_tokens"] == cached, got
    return got


def test_a_corrupt_block_is_a_miss_and_a_removal_event(prompts, tier_dir,
                                                       tmp_path, reference):
    need_event_modules()
    d = start(tier_dir)
    run_worker(prompts, "unix:" + d.sock)
    d.stop()
    corrupt_one_stored_block(tier_dir)
    endpoint = f"ipc://{tmp_path}/events.ipc"
    d = start(tier_dir, f"--kv_events_endpoint={endpoint}")
    sub = subscribe(endpoint)
    try:
        # Every block is asked for, so the corrupt one is read and fails.
        got = run_worker(prompts, "unix:" + d.sock)
        run_worker(prompts, "unix:" + d.sock)
        t = d.stats().tier
        counts = collect_events(sub)
    finally:
        sub.close()
        d.stop()
    assert t.checksum_failures == 1, t
    # The corrupt block and those after it were computed again: each answer
    # is the one its cached prefix (promoted, verified blocks only) gives.
    with open(prompts) as f:
        rows = [[int(x) for x in line.split()] for line in f]
    for g, r, tokens in zip(got, reference, rows):
        if g["matched_tokens"] in (0, PROMPT_TOKENS - 1):
            check_equal([g], [r])
        else:
            check_equal([g], [cached_reference(tmp_path, tokens,
                                               g["matched_tokens"])])
    assert counts.get(("BlockRemoved", "STORAGE"), 0) == t.promoted_blocks + \
        t.forgotten_blocks + t.checksum_failures + t.superseded_blocks, (counts, t)


@pytest.mark.parametrize("tier,pool,want", [
    ("disk,path=/nonexistent/dir,bytes=1MiB", POOL, "--tier=disk"),
    ("disk,path={file},bytes=1MiB", POOL, "--tier=disk"),
    ("disk,path={dir},bytes=100", POOL, "--tier=disk"),
    ("disk,path={dir}", POOL, "bytes= is required"),
    ("disk,path={dir},bytes=1MiB,speed=9", POOL, "unknown key 'speed'"),
    ("host,bytes=100", POOL, "--tier=host: bytes=100 holds no page"),
    ("host,bytes=1TiB", POOL, "--tier=host: host memory: 1 TiB asked for"),
    ("host,bytes=1MiB,path=/tmp", POOL, "host: unknown key 'path'"),
    ("host,bytes=1MiB;host,bytes=1MiB", POOL, "same kind of tier twice"),
    ("disk,path={dir},bytes=1MiB;host,bytes=1MiB", POOL, "host tier goes above"),
    ("host,bytes=1MiB", "host,bytes=64KiB", "page_bytes="),
    ("host,bytes=1MiB", "none,pages=16", "none pool"),
    ("tape,bytes=1MiB", POOL, "unknown tier kind 'tape'"),
    ("disk,path={dir},bytes=1MiB", "host,bytes=64KiB", "page_bytes="),
    ("disk,path={dir},bytes=1MiB", "none,pages=16", "none pool"),
    ("remote", POOL, "remote: addr=HOST:PORT is required"),
    ("remote,addr=127.0.0.1", POOL, "remote: addr=\"127.0.0.1\": expected HOST:PORT"),
    ("remote,addr=127.0.0.1:1,timeout=soon", POOL, "remote: timeout=soon"),
    ("remote,addr=127.0.0.1:1,write=never", POOL, "remote: write=never"),
    ("remote,addr=127.0.0.1:1,password_file={dir}/none", POOL,
     "password_file={dir}/none: No such file"),
    ("remote,addr=127.0.0.1:1,password_file={file}", POOL,
     "is open to other users"),
    ("remote,addr=127.0.0.1:1,tls_ca={dir}/none.crt", POOL,
     "--tier=remote: tls_ca={dir}/none.crt: not a readable PEM"),
    ("remote,addr=127.0.0.1:1;disk,path={dir},bytes=1MiB", POOL,
     "a disk tier goes above a remote tier"),
])
def test_bad_tier_flags_are_clear_startup_errors(tmp_path, tier, pool, want):
    if "host memory" in want and \
            os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >= 1 << 40:
        pytest.skip("this machine has 1 TiB of memory or more")
    f = tmp_path / "a-file"
    f.write_text("x")
    spec = tier.format(file=f, dir=tmp_path)
    r = subprocess.run([executable("RADIXKVD"), f"--socket={tmp_path}/s.sock",
                        "--metrics_listen=", f"--pool={pool}", f"--tier={spec}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode in (1, 2), (r.returncode, r.stderr)
    if spec.startswith("remote"):
        assert r.returncode == 2, (r.returncode, r.stderr)
    assert want.format(dir=tmp_path) in r.stderr, r.stderr


def test_a_disk_tier_larger_than_the_free_space_is_a_configuration_error(
        tmp_path):
    """Exit 2 (systemd's RestartPreventExitStatus: no restart loop), with
    the tier, its path and both sizes in units people read."""
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    ask_gib = free // (1 << 30) + 64
    r = subprocess.run([executable("RADIXKVD"), f"--socket={tmp_path}/s.sock",
                        "--metrics_listen=", f"--pool={POOL}",
                        f"--tier=disk,path={tmp_path},bytes={ask_gib}GiB"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"--tier=disk,path={tmp_path}: the tier file needs " in r.stderr, r.stderr
    assert " GiB (the bytes= option), the filesystem has " in r.stderr, r.stderr
    assert str(ask_gib << 30) not in r.stderr, r.stderr  # no raw byte counts
    # Nothing of the asked size was allocated.
    assert all(p.stat().st_size < 1 << 20
               for p in tmp_path.iterdir() if p.is_file()), list(tmp_path.iterdir())


def test_a_host_tier_beyond_the_machines_memory_is_a_configuration_error(
        tmp_path):
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    ask_gib = phys // (1 << 30) + 64
    r = subprocess.run([executable("RADIXKVD"), f"--socket={tmp_path}/s.sock",
                        "--metrics_listen=", f"--pool={POOL}",
                        f"--tier=host,bytes={ask_gib}GiB"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"host memory: {ask_gib} GiB asked for, the machine has " in r.stderr, \
        r.stderr


# ---- A graceful stop drains the pool and the host tier to the disk tier ----

def drain_namespace():
    import radixkv
    # 2 (K and V) * 1 layer * 1 head * 64 * 16 tokens * 4 bytes = PAGE_BYTES.
    return radixkv.NamespaceSpec(model="drain", num_layers=1, num_kv_heads=1,
                                 head_dim=64, page_size=16, dtype="fp32")


def drain_rows(n):
    return [[(11 * i + 17 * j) % 997 + 1 for j in range(PROMPT_TOKENS)]
            for i in range(n)]


def commit_rows(d, rows):
    import radixkv
    with radixkv.Client(endpoint=d.sock, namespace=drain_namespace(),
                        release_delay=0) as c:
        for tokens in rows:
            with c.acquire(tokens) as lease:
                lease.commit()


def hits_after_restart(d, rows):
    """Blocks of each row an Acquire finds (pool or promoted)."""
    import radixkv
    got = []
    with radixkv.Client(endpoint=d.sock, namespace=drain_namespace(),
                        release_delay=0) as c:
        for tokens in rows:
            with c.acquire(tokens) as lease:
                got.append(lease.matched_blocks)
    return got


def stop_timed(d):
    start_s = time.monotonic()
    d.stop()
    return d.proc.returncode, time.monotonic() - start_s


@pytest.mark.parametrize("chain", ["disk", "host+disk"])
def test_sigterm_drains_the_pool_and_host_tier_so_a_restart_hits_all(
        tier_dir, chain):
    """6 prompts of 8 blocks through a 16-page pool (and a 6-block host
    tier): the newest blocks are only in the pool and host memory until
    SIGTERM writes them down; the restarted daemon hits every prompt."""
    spec = CHAINS[chain].format(dir=tier_dir)
    rows = drain_rows(6)
    d = start(tier_dir, spec=spec)
    commit_rows(d, rows)
    rc, _ = stop_timed(d)
    assert rc == 0, d.log()
    assert "drain: " in d.log() and " 0 left behind" in d.log(), d.log()
    d = start(tier_dir, spec=spec)
    try:
        assert hits_after_restart(d, rows) == [8] * len(rows), d.log()
    finally:
        d.stop()


def test_drain_timeout_bounds_the_stop_and_zero_disables_it(tier_dir):
    spec = CHAINS["disk"].format(dir=tier_dir)
    rows = drain_rows(4)
    # A deadline already past when the drain starts: nothing is written,
    # every pool block is counted as left behind, and the stop is prompt.
    d = start(tier_dir, "--drain_timeout=1us", spec=spec)
    commit_rows(d, rows)
    rc, took = stop_timed(d)
    assert rc == 0, d.log()
    assert "drain: 0 blocks" in d.log(), d.log()
    assert " 16 left behind" in d.log(), d.log()
    assert took < 5, took
    # --drain_timeout=0: no drain at all; what only the pool held is lost.
    d = start(tier_dir, "--drain_timeout=0", spec=spec)
    commit_rows(d, drain_rows(8)[4:])
    rc, _ = stop_timed(d)
    assert rc == 0 and "drain: " not in d.log().split("radixkvd: ready")[-1]
    d = start(tier_dir, spec=spec)
    try:
        got = hits_after_restart(d, drain_rows(8)[4:])
        assert got[-2:] == [0, 0], got  # the two prompts the pool held
    finally:
        d.stop()


def test_sigterm_with_idle_client_connections_stops_promptly(tier_dir):
    """Connections that carry no call (a client's idle session, a client
    that connected and sent nothing) do not hold the stop for
    --shutdown_grace: it ends once no call is in flight."""
    import radixkv
    import socket
    d = start(tier_dir, "--shutdown_grace=20s")
    c = radixkv.Client(endpoint=d.sock, namespace=drain_namespace(),
                       release_delay=0)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with c.acquire(drain_rows(1)[0]) as lease:
            lease.commit()
        silent.connect(d.sock)
        time.sleep(0.2)
        rc, took = stop_timed(d)
        assert rc == 0, d.log()
        assert took < 3, (took, d.log())
    finally:
        silent.close()
        c.close()
