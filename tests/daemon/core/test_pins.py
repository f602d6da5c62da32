"""Prefix pins end to end: a real radixkvd with a tenants file, workers
through radixkv.Client, and radixkvctl pin / pins / unpin.

A pinned system prompt stays cached while other prompts churn through a
small pool and through Clear; stats, the tenant table and the
radixkv_pinned_pages metric report it; the tenant's max_pin_pages refuses
a pin that would exceed it with an error naming the limit, and changes
nothing; unpin makes the prompt evictable again.
"""
import json
import os
import re
import socket
import subprocess
import sys
import urllib.request

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from rkv_testutil import SMALL, Daemon, assert_no_leaks, executable  # noqa: E402
import radixkv  # noqa: E402
from radixkv import pb  # noqa: E402

PAGES = 32


def ns_flags():
    return ["--model=py-test", "--layers=2", "--kv-heads=2", "--head-dim=8",
            "--page-size=4", "--dtype=fp16"]


def ctl(d, *args):
    return subprocess.run([executable("RADIXKVCTL"), "--endpoint=unix:" + d.sock,
                           *args], capture_output=True, text=True, timeout=30)


def start(tmp_path, max_pin_pages):
    cfg = tmp_path / "tenants.json"
    cfg.write_text(json.dumps({"tenants": [
        {"name": "alpha", "uids": [os.geteuid()],
         "max_pin_pages": max_pin_pages}]}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pool = f"host,bytes={PAGES * SMALL.page_bytes},page_bytes={SMALL.page_bytes}"
    d = Daemon(executable("RADIXKVD"), [f"--tenants={cfg}"], pool)
    d.argv[d.argv.index("--metrics_listen=")] = f"--metrics_listen=127.0.0.1:{port}"
    return d.start(), port


def store(c, tokens):
    with c.acquire(tokens) as lease:
        if lease.new_blocks:
            lease.commit()


def test_a_pinned_system_prompt_survives_churn_and_clear(tmp_path):
    d, port = start(tmp_path, max_pin_pages=8)
    try:
        system = list(range(1, 6 * 4 + 2))  # 6 blocks and one more token
        with radixkv.Client(d.sock, namespace=SMALL, release_delay=0,
                            initial_wait=10.0) as c:
            store(c, system)
            r = ctl(d, "pin", *ns_flags(), ",".join(map(str, system)))
            assert r.returncode == 0, r.stderr
            m = re.match(r"pin (\d+): 6 of 6 blocks \(24 tokens\) pinned", r.stdout)
            assert m, r.stdout
            pin_id = m.group(1)
            # Churn: 20 prompts of 4 blocks through a 32-page pool.
            for i in range(20):
                base = 10000 + 100 * i
                store(c, list(range(base, base + 17)))
            assert c.match(system).matched_blocks == 6
        cleared = d.admin.Clear(pb.ClearRequest(), timeout=5)
        assert cleared.pinned_remaining == 6, cleared
        s = d.stats()
        assert (s.pins, s.pin_pages, s.pinned_pages) == (1, 6, 6), s
        assert [(t.name, t.pin_pages, t.pin_limit_pages) for t in s.tenants] \
            == [("alpha", 6, 8)], s.tenants
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert re.search(r"^radixkv_pinned_pages 6$", metrics, re.M), metrics
        assert 'radixkv_requests_total{' in metrics and 'method="Pin"' in metrics

        r = ctl(d, "pins", "-o", "json")
        assert r.returncode == 0, r.stderr
        pins = json.loads(r.stdout)["pins"]
        assert [(p["pin_id"], p["tenant"], p["pinned_blocks"]) for p in pins] \
            == [(int(pin_id), "alpha", 6)], pins

        r = ctl(d, "unpin", pin_id)
        assert r.returncode == 0 and "unpinned pin " + pin_id in r.stdout, r
        assert d.stats().pins == 0
        assert d.admin.Clear(pb.ClearRequest(), timeout=5).removed == 6
        assert_no_leaks(d, sessions=0)
    finally:
        d.stop()


def test_a_pin_over_the_tenants_quota_is_refused_and_changes_nothing(tmp_path):
    d, _ = start(tmp_path, max_pin_pages=3)
    try:
        prompt = list(range(1, 4 * 4 + 1))  # 4 blocks
        with radixkv.Client(d.sock, namespace=SMALL, release_delay=0,
                            initial_wait=10.0) as c:
            store(c, prompt)
        before = d.stats()
        r = ctl(d, "pin", *ns_flags(), ",".join(map(str, prompt)))
        assert r.returncode != 0, r.stdout
        assert ("pins: tenant alpha: its pins would hold 4 pages, its limit "
                "is 3 (max_pin_pages, --tenants)") in r.stderr, r.stderr
        after = d.stats()
        assert (after.pins, after.pinned_pages, after.cached_pages) == \
            (before.pins, before.pinned_pages, before.cached_pages)
        # Unknown ids and a prompt nothing of which is cached.
        r = ctl(d, "unpin", "999")
        assert r.returncode != 0 and "pin_id: no pin 999" in r.stderr, r.stderr
        r = ctl(d, "pin", *ns_flags(), "900,901,902,903")
        assert r.returncode != 0 and "nothing to pin" in r.stderr, r.stderr
        r = ctl(d, "unpin")
        assert r.returncode == 3, r
        # Within the quota: three blocks pin.
        r = ctl(d, "pin", *ns_flags(), ",".join(map(str, prompt[:12])))
        assert r.returncode == 0, r.stderr
        assert d.stats().pin_pages == 3
    finally:
        d.stop()


def test_a_bad_tenants_key_names_it(tmp_path):
    cfg = tmp_path / "tenants.json"
    cfg.write_text(json.dumps({"tenants": [
        {"name": "alpha", "uids": [os.geteuid()], "max_pin_pages": -1}]}))
    r = subprocess.run([executable("RADIXKVD"), f"--tenants={cfg}",
                        "--metrics_listen=",
                        f"--socket={tmp_path}/s.sock"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r
    assert "$.tenants[0].max_pin_pages" in r.stderr, r.stderr
