#!/usr/bin/python3
"""radixkvctl against a live radixkvd: every command, checked output, exit codes.

Run by ctest as:
  /usr/bin/python3 ctl_test.py --ctl=PATH --daemon=PATH --helper=PATH --vectors=PATH

One radixkvd child process serves the whole class (a short /tmp socket, no
metrics port, a small host pool). Prompts use distinct salts so that tests do
not depend on each other's cache contents. Output in -o json mode is parsed
with the json module and asserted field by field.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None
NS_FLAGS = ["--model=ctl-test", "--layers=2", "--kv-heads=2", "--head-dim=8",
            "--dtype=fp16", "--page-size=4"]
TIMEOUT = 120  # seconds per subprocess; generous for a loaded 2-core machine


def prompt(n, salt):
    return [salt * 1000 + i + 1 for i in range(n)]


HEX32 = r"^[0-9a-f]{32}$"


def vector_flags(ns):
    """The namespace flags of a contract vector's namespace (its eleven
    fields; a cross_layer layout is not among them)."""
    return ["--model=" + ns["model"], "--model-revision=" + ns["model_revision"],
            "--lora=" + ns["lora"], "--salt=" + ns["cache_salt"],
            "--layers=%d" % ns["num_layers"], "--kv-heads=%d" % ns["num_kv_heads"],
            "--head-dim=%d" % ns["head_dim"], "--page-size=%d" % ns["page_size"],
            "--dtype=%d" % ns["dtype"], "--tp-rank=%d" % ns["tp_rank"],
            "--tp-size=%d" % ns["tp_size"]]


def worker_path():
    """radixkv-worker: $RADIXKV_WORKER, else next to radixkvctl in its build
    tree (worker/); None when absent."""
    path = os.environ.get("RADIXKV_WORKER") or os.path.join(
        os.path.dirname(ARGS.ctl), "worker", "radixkv-worker")
    return path if os.access(path, os.X_OK) else None


def u64(v):
    """A 64-bit integer field: -o json prints it as a JSON number."""
    assert isinstance(v, int) and not isinstance(v, bool), repr(v)
    return v


class Ctl:
    @staticmethod
    def run(args, endpoint=None, env=None, stdin=subprocess.DEVNULL):
        cmd = [ARGS.ctl]
        if endpoint is not None:
            cmd.append("--endpoint=" + endpoint)
        cmd += args
        full_env = dict(os.environ)
        for k in list(full_env):
            if k.startswith("RADIXKVCTL_"):
                del full_env[k]
        full_env.update(env or {})
        p = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True,
                           timeout=TIMEOUT, env=full_env)
        return p.returncode, p.stdout, p.stderr


class CtlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sock = "/tmp/rkc_ctl_%d.sock" % os.getpid()
        cls.log = open(cls.sock + ".log", "w")
        cls.daemon = subprocess.Popen(
            [ARGS.daemon, "--socket=" + cls.sock, "--metrics_listen=",
             "--pool=host,bytes=8MiB", "--event_buffer=4096"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            rc, out, _ = Ctl.run(["health", "--timeout=1s"], cls.sock)
            if rc == 0:
                return
            if cls.daemon.poll() is not None:
                break
            time.sleep(0.2)
        cls.log.flush()
        with open(cls.sock + ".log") as f:
            log = f.read()
        cls.tearDownClass()
        raise RuntimeError("radixkvd did not become healthy:\n" + log)

    @classmethod
    def tearDownClass(cls):
        if cls.daemon.poll() is None:
            cls.daemon.send_signal(signal.SIGTERM)
            try:
                cls.daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                cls.daemon.kill()
                cls.daemon.wait()
        cls.log.close()
        for path in (cls.sock, cls.sock[:-len(".sock")] + ".attach.sock",
                     cls.sock + ".log"):
            if os.path.exists(path):
                os.unlink(path)

    # -- helpers ---------------------------------------------------------------

    def ctl(self, *args, expect=0, **kw):
        rc, out, err = Ctl.run(list(args), self.sock, **kw)
        self.assertEqual(rc, expect, "radixkvctl %s: rc=%d\nstdout=%s\nstderr=%s"
                         % (" ".join(args), rc, out, err))
        return out, err

    def json_of(self, *args):
        out, _ = self.ctl(*args, "-o", "json")
        lines = out.strip().splitlines()
        self.assertEqual(len(lines), 1, out)
        return json.loads(lines[0])

    def populate(self, n, salt):
        p = subprocess.run([ARGS.helper, "populate", self.sock, str(n), str(salt)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def hold(self, n, salt):
        h = subprocess.Popen([ARGS.helper, "hold", self.sock, str(n), str(salt)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = h.stdout.readline()
        self.assertTrue(line, "hold helper printed nothing")
        return h, json.loads(line)

    @staticmethod
    def release(h):
        h.stdin.close()
        h.wait(timeout=TIMEOUT)
        h.stdout.close()

    # -- health, stats, namespaces, sessions -------------------------------------

    def test_health(self):
        self.assertEqual(self.json_of("health"), {"status": "SERVING"})
        out, _ = self.ctl("health")
        self.assertTrue(out.startswith("SERVING"), out)

    def test_health_not_serving_exits_4(self):
        sock = "/tmp/rkc_unh_%d.sock" % os.getpid()
        h = subprocess.Popen([ARGS.helper, "unhealthy", sock], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        try:
            self.assertIn("ready", h.stdout.readline())
            rc, out, err = Ctl.run(["health", "-o", "json"], sock)
            self.assertEqual(rc, 4, err)
            self.assertEqual(json.loads(out)["status"], "NOT_SERVING")
            self.assertTrue(err.startswith("Error:"), err)
        finally:
            self.release(h)

    def test_stats(self):
        self.populate(16, 1)
        st = self.json_of("stats")["stats"]
        self.assertGreater(u64(st["capacity_pages"]), 0)
        self.assertGreaterEqual(u64(st["cached_pages"]), 4)
        self.assertEqual(u64(st["free_pages"]) + u64(st["writing_pages"]) +
                         u64(st["cached_pages"]), u64(st["capacity_pages"]))
        self.assertTrue(st["invariants_ok"])
        self.assertEqual(st["pool"]["backend"], "host")
        out, _ = self.ctl("stats")
        self.assertIn("hit ratio:", out)
        self.assertIn("invariants:  ok", out)
        self.assertRegex(out, r"block keys:  \d+ by token walk, \d+ hashed")
        self.assertRegex(out, r"fenced:  +\d+ pages.* quarantined \(0 leases\)")
        self.assertRegex(out, r"refused:  +0 calls")
        self.assertGreater(u64(st["hashed_blocks"]), 0)

    def test_namespaces(self):
        self.populate(8, 2)
        nss = self.json_of("namespaces")["namespaces"]
        mine = [n for n in nss if n["namespace"]["model"] == "ctl-test"]
        self.assertEqual(len(mine), 1, nss)
        self.assertEqual(mine[0]["namespace"]["num_layers"], 2)
        self.assertEqual(mine[0]["namespace"]["dtype"], "DTYPE_FLOAT16")
        self.assertGreaterEqual(u64(mine[0]["cached_blocks"]), 2)
        out, _ = self.ctl("namespaces")
        self.assertIn("ctl-test", out)
        self.assertIn("L2 H2 D8 fp16 p4", out)

    def test_sessions(self):
        h, _ = self.hold(8, 3)
        try:
            sessions = self.json_of("sessions")["sessions"]
            mine = [s for s in sessions if s["client_name"] == "ctl-helper-hold"]
            self.assertEqual(len(mine), 1, sessions)
            self.assertEqual(mine[0]["leases"], 1)
            out, _ = self.ctl("sessions")
            self.assertIn("ctl-helper-hold", out)
        finally:
            self.release(h)

    # -- tree, match, explain ---------------------------------------------------------

    def test_tree(self):
        self.populate(16, 5)
        t = self.json_of("tree", "--limit=2")
        self.assertEqual(len(t["nodes"]), 2)
        self.assertGreaterEqual(u64(t["total_nodes"]), 4)
        self.assertTrue(t["truncated"])
        t = self.json_of("tree", "--limit=1000", "--max-depth=0")
        self.assertTrue(t["nodes"])
        self.assertTrue(all(n.get("depth", 0) == 0 for n in t["nodes"]), t)
        out, _ = self.ctl("tree", "--limit=3")
        lines = out.strip().splitlines()
        self.assertEqual(lines[0].split(), ["KEY", "DEPTH", "PAGE", "REFS",
                                            "CHILDREN", "AGE", "NAMESPACE"])
        self.assertEqual(len(lines), 1 + 3 + 1)  # header, rows, footer
        self.assertIn("raise --limit", lines[-1])

    def test_match_and_explain(self):
        base = prompt(16, 6)
        self.populate(16, 6)
        probe = base[:8] + [999999] + base[9:] + [1, 2]  # block 2 differs; 18 tokens
        m = self.json_of("match", *NS_FLAGS, " ".join(map(str, probe)))
        self.assertEqual(m["total_blocks"], 4)
        self.assertEqual(m["matched_blocks"], 2)
        self.assertEqual(u64(m["matched_tokens"]), 8)
        out, _ = self.ctl("match", *NS_FLAGS, ",".join(map(str, probe)))
        self.assertIn("matched 2 of 4 blocks", out)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(",".join(map(str, probe[:9])) + "\n" + " ".join(map(str, probe[9:])))
            path = f.name
        try:
            m2 = self.json_of("match", *NS_FLAGS, "--file=" + path)
            self.assertEqual(m2["matched_blocks"], 2)
            e = self.json_of("explain", *NS_FLAGS, "--file", path)
        finally:
            os.unlink(path)
        self.assertTrue(e["namespace_known"])
        self.assertEqual(e["matched_blocks"], 2)
        states = [b["state"] for b in e["blocks"]]
        self.assertEqual(states, ["BLOCK_STATE_CACHED", "BLOCK_STATE_CACHED",
                                  "BLOCK_STATE_NOT_PRESENT",
                                  "BLOCK_STATE_PARENT_MISSING"])
        out, _ = self.ctl("explain", *NS_FLAGS, *map(str, probe))
        rows = out.strip().splitlines()
        self.assertIn("2 of 4 blocks cached", rows[0])
        self.assertEqual([r.split()[3] for r in rows[2:]],
                         ["cached", "cached", "not-present", "parent-missing"])

    def test_explain_other_namespace(self):
        self.populate(8, 11)
        other = [f if not f.startswith("--model=") else "--model=another"
                 for f in NS_FLAGS]
        e = self.json_of("explain", *other, *map(str, prompt(8, 11)))
        self.assertEqual(e["matched_blocks"], 0)
        self.assertEqual(e["blocks"][0]["state"], "BLOCK_STATE_WRONG_NAMESPACE")

    # -- hash (offline) -------------------------------------------------------------------

    def test_hash_matches_contract_vectors(self):
        with open(ARGS.vectors) as f:
            vectors = json.load(f)["vectors"]
        self.assertGreater(len(vectors), 0)
        for v in vectors:
            flags = vector_flags(v["namespace"])
            tokens = ",".join(map(str, v["tokens"]))
            args = ["hash", *flags, "-o", "json"] + ([tokens] if tokens else [])
            # No daemon needed: point at a socket nobody serves.
            rc, out, err = Ctl.run(args, "/tmp/rkc_no_daemon.sock")
            self.assertEqual(rc, 0, "%s: %s" % (v["name"], err))
            got = json.loads(out)
            self.assertEqual(got["namespace_id"], v["root"], v["name"])
            self.assertEqual(got["block_keys"], v["block_keys"], v["name"])
        # Text form: the root line and one key per block.
        v = next(x for x in vectors if len(x["block_keys"]) >= 2)
        ns = v["namespace"]
        rc, out, _ = Ctl.run(
            ["hash", "--model=" + ns["model"], "--model-revision=" + ns["model_revision"],
             "--lora=" + ns["lora"], "--salt=" + ns["cache_salt"],
             "--layers=%d" % ns["num_layers"], "--kv-heads=%d" % ns["num_kv_heads"],
             "--head-dim=%d" % ns["head_dim"], "--page-size=%d" % ns["page_size"],
             "--dtype=%d" % ns["dtype"], "--tp-rank=%d" % ns["tp_rank"],
             "--tp-size=%d" % ns["tp_size"]] + [str(t) for t in v["tokens"]])
        self.assertEqual(rc, 0)
        self.assertIn(v["root"], out.splitlines()[0])
        for k in v["block_keys"]:
            self.assertIn(k, out)

    # -- cross-layer KV layouts (--layout) ------------------------------------------------

    def test_hash_layout_matches_cross_layer_vectors(self):
        with open(ARGS.vectors) as f:
            cases = json.load(f)["cross_layer_vectors"]
        self.assertGreaterEqual(len(cases), 5)
        for v in cases:
            x = v["namespace"]["cross_layer"]
            layout = "xlayer:%d:%d" % (x["shared_from_layer"], x["local_window"])
            args = ["hash", *vector_flags(v["namespace"]), "-o", "json",
                    ",".join(map(str, v["tokens"]))]
            # `hash` takes the contract's values as given (xlayer:0:0 too).
            rc, out, err = Ctl.run(args + ["--layout=" + layout], "/tmp/rkc_no_daemon.sock")
            self.assertEqual(rc, 0, "%s: %s" % (v["name"], err))
            got = json.loads(out)
            self.assertEqual(got["namespace_id"], v["root"], v["name"])
            self.assertEqual(got["block_keys"], v["block_keys"], v["name"])
            for plain in ([], ["--layout=per-layer"]):
                rc, out, err = Ctl.run(args + plain, "/tmp/rkc_no_daemon.sock")
                self.assertEqual(rc, 0, err)
                self.assertEqual(json.loads(out)["namespace_id"], v["plain_root"],
                                 v["name"])
        # W omitted is no window.
        v = next(c for c in cases if c["name"] == "xlayer_40_layers_from_21_no_window")
        rc, out, err = Ctl.run(["hash", *vector_flags(v["namespace"]), "-o", "json",
                                "--layout=xlayer:21", *map(str, v["tokens"])])
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["namespace_id"], v["root"])

    def test_layout_bad_arguments_exit_3(self):
        # NS_FLAGS has 2 layers: S must be 1. The messages are `size --layout`'s.
        cases = [
            (["match", *NS_FLAGS, "--layout=xlayer:2", "1"], "1..1"),
            (["explain", *NS_FLAGS, "--layout=xlayer:0", "1"], "S (shared_from_layer)"),
            (["match", *NS_FLAGS, "--layout=xlayer:1:70000", "1"], "65536"),
            (["explain", *NS_FLAGS, "--layout=shared", "1"], "xlayer:S[:W]"),
            (["hash", *NS_FLAGS, "--layout=xlayer", "1"], "xlayer:S[:W]"),
            (["hash", *NS_FLAGS, "--layout=xlayer:1:2:3", "1"], "xlayer:S[:W]"),
            (["hash", *NS_FLAGS, "--layout=xlayer:-1", "1"], "xlayer:S[:W]"),
        ]
        for args, needle in cases:
            rc, out, err = Ctl.run(args, self.sock)
            self.assertEqual(rc, 3, "%s: rc=%d %s" % (args, rc, err))
            self.assertEqual(out, "", args)
            self.assertTrue(err.startswith("Error: --layout="), err)
            self.assertIn(needle, err, args)
        rc, size_out, size_err = Ctl.run(["size", "--layers=2", "--kv-heads=2",
                                          "--head-dim=8", "--dtype=fp16", "--tokens=4",
                                          "--layout=xlayer:2"])
        rc2, _, match_err = Ctl.run(["match", *NS_FLAGS, "--layout=xlayer:2", "1"])
        self.assertEqual((rc, rc2), (3, 3))
        self.assertEqual(size_err, match_err)

    def test_xlayer_namespace_listed_matched_and_explained(self):
        worker = worker_path()
        if worker is None:
            self.skipTest("radixkv-worker not built")
        # A cross-layer model whose pages (2 groups x 2 x 2 heads x 4 x 8 x
        # fp16 = 512 B) fit the pool NS_FLAGS' namespace uses.
        tokens = list(range(301, 315))  # 3 full blocks of 4, 2 left over
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(" ".join(map(str, tokens)) + "\n")
            path = f.name
        try:
            p = subprocess.run(
                [worker, "run", "--endpoint=" + self.sock, "--prompts=" + path,
                 "--decode=1", "--device=cpu", "--json", "--model=tiny", "--layers=3",
                 "--kv-heads=2", "--q-heads=4", "--head-dim=8", "--page-size=4",
                 "--kv-dtype=fp16", "--layout=xlayer", "--xlayer-from=1",
                 "--xlayer-window=4"],
                capture_output=True, text=True, timeout=TIMEOUT)
        finally:
            os.unlink(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["committed_blocks"], 3, p.stdout)
        nss = self.json_of("namespaces")["namespaces"]
        mine = [n for n in nss if n["namespace"].get("cross_layer")]
        self.assertEqual(len(mine), 1, nss)
        ns = mine[0]["namespace"]
        self.assertEqual(ns["cross_layer"], {"shared_from_layer": 1, "local_window": 4})
        out, _ = self.ctl("namespaces")
        self.assertIn("L3 H2 D8 fp16 p4 xlayer:1:4", out)
        flags = ["--model=" + ns["model"], "--model-revision=" + ns["model_revision"],
                 "--layers=3", "--kv-heads=2", "--head-dim=8", "--dtype=fp16",
                 "--page-size=4"]
        toks = ",".join(map(str, tokens))
        m = self.json_of("match", *flags, "--layout=xlayer:1:4", toks)
        self.assertEqual((m["matched_blocks"], u64(m["matched_tokens"])), (3, 12))
        self.assertEqual(m["namespace_id"], mine[0]["namespace_id"])
        h = self.json_of("hash", *flags, "--layout=xlayer:1:4", toks)
        self.assertEqual(h["namespace_id"], mine[0]["namespace_id"])
        e = self.json_of("explain", *flags, "--layout=xlayer:1:4", toks)
        self.assertTrue(e["namespace_known"])
        self.assertEqual([b["state"] for b in e["blocks"]], ["BLOCK_STATE_CACHED"] * 3)
        # The same model and tokens without the layout, or with another
        # window: another namespace, which never shares these blocks.
        for other in ([], ["--layout=per-layer"], ["--layout=xlayer:1"]):
            m = self.json_of("match", *flags, *other, toks)
            self.assertEqual(m["matched_blocks"], 0, other)
            e = self.json_of("explain", *flags, *other, toks)
            self.assertFalse(e["namespace_known"], other)
            self.assertEqual([b["state"] for b in e["blocks"]],
                             ["BLOCK_STATE_WRONG_NAMESPACE"] * 3, other)

    # -- evict, clear --------------------------------------------------------------------------

    def test_evict(self):
        self.populate(16, 8)
        before = u64(self.json_of("stats")["stats"]["evicted_pages"])
        r = self.json_of("evict", "--pages=2")
        self.assertEqual(u64(r["evicted"]), 2)
        after = u64(self.json_of("stats")["stats"]["evicted_pages"])
        self.assertEqual(after - before, 2)
        out, _ = self.ctl("evict", "--pages=1")
        self.assertIn("evicted 1 of 1", out)

    def test_clear(self):
        self.populate(16, 9)
        h, info = self.hold(16, 9)  # pins the 4 cached blocks
        try:
            self.assertEqual(info["matched_blocks"], 4)
            _, err = self.ctl("clear", expect=3)  # stdin is not a terminal
            self.assertIn("--yes", err)
            r = self.json_of("clear", "--yes")
            self.assertEqual(u64(r["pinned_remaining"]), 4)
            st = self.json_of("stats")["stats"]
            self.assertEqual(u64(st["cached_pages"]), 4)
        finally:
            self.release(h)
        out, _ = self.ctl("clear", "--yes")
        self.assertIn("removed", out)
        self.assertEqual(u64(self.json_of("stats")["stats"]["cached_pages"]), 0)

    # -- watch ----------------------------------------------------------------------------------

    def test_watch(self):
        self.populate(12, 10)
        out, _ = self.ctl("watch", "--from=1", "--count=3", "-o", "json")
        events = [json.loads(l) for l in out.strip().splitlines()]
        self.assertEqual(len(events), 3)
        seqs = [u64(e["sequence"]) for e in events]
        self.assertEqual(seqs, sorted(seqs))
        self.assertTrue(any("stored" in e or "gap" in e for e in events), events)
        # Until interrupted: SIGINT ends it with exit 0.
        w = subprocess.Popen([ARGS.ctl, "--endpoint=" + self.sock, "watch", "--from=1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = w.stdout.readline()
            self.assertRegex(first, r"^\d+ ")
            w.send_signal(signal.SIGINT)
            self.assertEqual(w.wait(timeout=TIMEOUT), 0)
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()
            w.stdout.close()
            w.stderr.close()

    # -- scripting: JSON values, output flag forms, --no-headers, completion ----------------

    def hash_json(self, tokens):
        rc, out, err = Ctl.run(["hash", *NS_FLAGS, "-o", "json", *map(str, tokens)],
                               "/tmp/rkc_no_daemon.sock")
        self.assertEqual(rc, 0, err)
        return json.loads(out)

    def test_json_numbers_and_hex_keys(self):
        base = prompt(16, 13)
        self.populate(16, 13)
        h = self.hash_json(base)
        root, keys = h["namespace_id"], h["block_keys"]
        self.assertEqual(len(keys), 4)
        # uint64 fields are JSON numbers; strings stay strings.
        st = self.json_of("stats")["stats"]
        for name in ("capacity_pages", "free_pages", "cached_pages", "lookup_tokens",
                     "hit_tokens", "evicted_pages", "tree_nodes", "hashed_blocks"):
            u64(st[name])
        self.assertEqual(st["pool"]["capacity_pages"], st["capacity_pages"])
        u64(st["pool"]["page_bytes"])
        self.assertIsInstance(st["version"], str)
        # Keys and namespace ids: 32 lowercase hex digits, equal to `hash`.
        m = self.json_of("match", *NS_FLAGS, *map(str, base))
        self.assertEqual(m["namespace_id"], root)
        self.assertEqual(m["matched_tokens"], 16)
        self.assertEqual(m["matched_blocks"], 4)
        e = self.json_of("explain", *NS_FLAGS, *map(str, base))
        self.assertEqual(e["namespace_id"], root)
        self.assertEqual([b["key"] for b in e["blocks"]], keys)
        self.assertEqual([b["state"] for b in e["blocks"]], ["BLOCK_STATE_CACHED"] * 4)
        self.assertTrue(all(isinstance(b["page"], int) for b in e["blocks"]), e)
        self.assertEqual(e["blocks"][0]["other_namespace_id"], "")
        nss = self.json_of("namespaces")["namespaces"]
        mine = [n for n in nss if n["namespace"]["model"] == "ctl-test"]
        self.assertEqual([n["namespace_id"] for n in mine], [root])
        self.assertGreaterEqual(u64(mine[0]["cached_blocks"]), 4)
        t = self.json_of("tree", "--limit=10000")
        u64(t["total_nodes"])
        by_key = {n["key"]: n for n in t["nodes"]}
        for n in t["nodes"]:
            self.assertRegex(n["key"], HEX32)
            self.assertRegex(n["namespace_id"], HEX32)
            u64(n["page"])
        self.assertEqual(by_key[keys[0]]["parent_key"], root)
        for parent, child in zip(keys, keys[1:]):
            self.assertEqual(by_key[child]["parent_key"], parent)
        self.assertEqual(by_key[keys[2]]["page"], e["blocks"][2]["page"])
        out, _ = self.ctl("watch", "--from=1", "--count=4", "-o", "json")
        events = [json.loads(l) for l in out.strip().splitlines()]
        self.assertEqual([u64(ev["sequence"]) for ev in events], [1, 2, 3, 4])
        for ev in events:
            if "stored" in ev:
                self.assertRegex(ev["stored"]["key"], HEX32)
                self.assertEqual(ev["stored"]["namespace_id"], root)
                u64(ev["stored"]["page"])
        self.assertIn("stored", events[0])
        # The text output shows the same keys (prefixes).
        out, _ = self.ctl("explain", *NS_FLAGS, *map(str, base))
        self.assertIn(root, out.splitlines()[0])
        self.assertEqual([r.split()[2] for r in out.strip().splitlines()[2:]],
                         [k[:16] + ".." for k in keys])

    def test_output_flag_forms(self):
        forms = [["-o", "json"], ["-o=json"], ["-ojson"], ["--output=json"],
                 ["--output", "json"]]
        for form in forms:
            for args in ([*form, "stats"], ["stats", *form]):
                out, _ = self.ctl(*args)
                self.assertIsInstance(json.loads(out)["stats"]["capacity_pages"], int, args)
        out, _ = self.ctl("-o=json", "stats", "-o=text")
        self.assertIn("capacity:", out)
        for bad in (["-o=yaml"], ["-o="], ["--output=yaml"]):
            rc, out, err = Ctl.run([*bad, "stats"], self.sock)
            self.assertEqual(rc, 3, bad)
            self.assertEqual(out, "", bad)
            self.assertIn("want text or json", err, bad)

    def test_no_headers(self):
        base = prompt(16, 14)
        self.populate(16, 14)
        keys = self.hash_json(base)["block_keys"]
        out, _ = self.ctl("tree", "--limit=3", "--no-headers")
        lines = out.strip().splitlines()
        self.assertEqual(len(lines), 3, out)  # rows only: no header, no footer
        for l in lines:
            self.assertRegex(l, r"^[0-9a-f]{16}\.\. +\d+ +\d+")
        out, _ = self.ctl("namespaces", "--no-headers")
        self.assertNotIn("NAMESPACE", out)
        self.assertRegex(out, r"(?m)^[0-9a-f]{12} +ctl-test ")
        out, _ = self.ctl("explain", *NS_FLAGS, "--no-headers", *map(str, base))
        rows = out.strip().splitlines()
        self.assertEqual([r.split()[2] for r in rows], [k[:16] + ".." for k in keys])
        self.assertEqual([r.split()[3] for r in rows], ["cached"] * 4)
        rc, out, err = Ctl.run(["hash", *NS_FLAGS, "--no-headers", *map(str, base), "1"],
                               "/tmp/rkc_no_daemon.sock")
        self.assertEqual(rc, 0, err)
        self.assertEqual([r.split() for r in out.strip().splitlines()],
                         [[str(i), "%d-%d" % (4 * i, 4 * i + 3), k]
                          for i, k in enumerate(keys)])
        h, _ = self.hold(8, 15)
        try:
            out, _ = self.ctl("sessions", "--no-headers")
            self.assertNotIn("SESSION", out)
            self.assertIn("ctl-helper-hold", out)
        finally:
            self.release(h)
        # JSON is the same with or without it.
        self.assertEqual(self.json_of("tree", "--limit=2", "--no-headers")["nodes"],
                         self.json_of("tree", "--limit=2")["nodes"])
        out, _ = self.ctl("tree", "--help")
        self.assertIn("--no-headers", out)
        # A flag of the commands that print a table, after the command.
        for args, needle in ((["stats", "--no-headers"], "unknown flag --no-headers"),
                             (["--no-headers", "tree"], "must follow the command")):
            rc, out, err = Ctl.run(args, self.sock)
            self.assertEqual(rc, 3, args)
            self.assertEqual(out, "", args)
            self.assertIn(needle, err, args)

    def complete_bash(self, *lines):
        """Each line is the words of a command line, the last one being
        completed; returns the sorted COMPREPLY of each."""
        script = ['source <("$CTL" completion bash) || exit 1', "complete -p radixkvctl",
                  't() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1));'
                  ' COMPREPLY=(); _radixkvctl; echo "${COMPREPLY[*]}"; }']
        for words in lines:
            script.append("t radixkvctl " + " ".join("'%s'" % w for w in words))
        p = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(script)],
                           capture_output=True, text=True, timeout=TIMEOUT,
                           env=dict(os.environ, CTL=ARGS.ctl))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        out = p.stdout.splitlines()
        self.assertEqual(out[0], "complete -F _radixkvctl radixkvctl")
        return [sorted(l.split()) for l in out[1:]]

    def test_completion_bash(self):
        got = self.complete_bash(
            ["sta"], [""], ["tree", "--li"], ["tree", "-"], ["-o", ""], ["--output", "=", "j"],
            ["match", "--dtype", "=", "b"], ["completion", ""], ["help", "tr"],
            ["--endpoint", "/tmp/x", "-o", "json", "ver"], ["stats", "--"])
        self.assertEqual(got[0], ["stats"])
        commands = ["health", "endpoint", "stats", "namespaces", "sessions", "tree", "match",
                    "explain", "hash", "evict", "clear", "watch", "size", "version",
                    "pin", "pins", "unpin", "completion", "help"]
        self.assertEqual(got[1], sorted(commands))
        self.assertEqual(got[2], ["--limit="])
        for flag in ("--limit=", "--max-depth=", "--no-headers", "--endpoint=", "-o",
                     "--output=", "--timeout=", "-h", "--help"):
            self.assertIn(flag, got[3])
        self.assertEqual(got[4], ["json", "text"])
        self.assertEqual(got[5], ["json"])
        self.assertEqual(got[6], ["bf16"])
        self.assertEqual(got[7], ["bash", "fish", "zsh"])
        self.assertEqual(got[8], ["tree"])
        self.assertEqual(got[9], ["version"])
        self.assertEqual(got[10], ["--endpoint=", "--help", "--output=", "--timeout=",
                                   "--version"])
        # Every command of the help listing is offered.
        _, out, _ = Ctl.run(["--help"])
        listed = re.findall(r"(?m)^  ([a-z]+) {2,}\S", out)
        self.assertIn("completion", listed)
        self.assertTrue(set(listed) <= set(commands), listed)

    def test_completion_zsh(self):
        rc, script, err = Ctl.run(["completion", "zsh"])
        self.assertEqual(rc, 0, err)
        self.assertTrue(script.startswith("#compdef radixkvctl\n"), script[:80])
        self.assertIn("compdef _radixkvctl radixkvctl", script)
        self.assertIn("'stats:Show pool occupancy, hit ratio, sessions and leases'", script)
        self.assertIn("'--no-headers[", script)
        self.assertIn(":value:(text json)'", script)
        self.assertIn(":value:(fp32 fp16 bf16 fp8_e4m3 fp8_e5m2 int8)'", script)
        # Unknown or missing shell: exit 3.
        for args in (["completion", "tcsh"], ["completion"], ["completion", "bash", "zsh"]):
            rc, out, err = Ctl.run(args)
            self.assertEqual(rc, 3, args)
            self.assertEqual(out, "", args)
            self.assertIn("bash, zsh or fish", err, args)
        rc, out, _ = Ctl.run(["help", "completion"])
        self.assertEqual(rc, 0)
        self.assertIn("Example:", out)
        if shutil.which("zsh") is None:
            return  # the zsh checks below need zsh
        with tempfile.NamedTemporaryFile("w", suffix=".zsh", delete=False) as f:
            f.write(script)
            path = f.name
        try:
            p = subprocess.run(["zsh", "-n", path], capture_output=True, text=True,
                               timeout=TIMEOUT)
            self.assertEqual(p.returncode, 0, p.stderr)
            p = subprocess.run(
                ["zsh", "-f", "-c", 'autoload -U compinit && compinit -u -D && '
                 'source "$1" && print -r -- $_comps[radixkvctl]', "zsh", path],
                capture_output=True, text=True, timeout=TIMEOUT)
            self.assertEqual(p.stdout.strip(), "_radixkvctl", p.stderr)
        finally:
            os.unlink(path)

    def complete_fish(self, *lines):
        """Each line is a command line up to the cursor; returns the sorted
        candidates fish's `complete -C` offers for each (without their
        descriptions)."""
        script = ['"$CTL" completion fish | source; or exit 1']
        for line in lines:
            script.append("complete -C %s; echo ---" % shlex.quote("radixkvctl " + line))
        p = subprocess.run(["fish", "--no-config", "-c", "\n".join(script)],
                           capture_output=True, text=True, timeout=TIMEOUT,
                           env=dict(os.environ, CTL=ARGS.ctl))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        got, current = [], []
        for line in p.stdout.splitlines():
            if line == "---":
                got.append(sorted(current))
                current = []
            else:
                current.append(line.split("\t")[0])
        self.assertEqual(len(got), len(lines), p.stdout)
        return got

    def test_completion_fish(self):
        rc, script, err = Ctl.run(["completion", "fish"])
        self.assertEqual(rc, 0, err)
        self.assertTrue(script.startswith("# fish completion for radixkvctl"), script[:80])
        self.assertIn("complete -c radixkvctl -n 'not __fish_seen_subcommand_from health ",
                      script)
        self.assertIn("-a 'stats' -d 'Show pool occupancy, hit ratio, sessions and leases'",
                      script)
        rc, out, _ = Ctl.run(["help", "completion"])
        self.assertEqual(rc, 0)
        self.assertIn("completion fish", out)
        if shutil.which("fish") is None:
            self.skipTest("fish is not installed (scripts/install_deps.sh installs it)")
        got = self.complete_fish("sta", "", "tree --li", "-o ", "--output=j",
                                 "match --dtype=b", "completion ", "help tr",
                                 "--endpoint /tmp/x -o json ver", "stats --")
        self.assertEqual(got[0], ["stats"])
        commands = ["health", "endpoint", "stats", "namespaces", "sessions", "tree", "match",
                    "explain", "hash", "evict", "clear", "watch", "size", "version",
                    "pin", "pins", "unpin", "completion", "help"]
        self.assertEqual(got[1], sorted(commands))
        self.assertEqual(got[2], ["--limit"])
        self.assertEqual(got[3], ["json", "text"])
        self.assertEqual(got[4], ["--output=json"])
        self.assertEqual(got[5], ["--dtype=bf16"])
        self.assertEqual(got[6], ["bash", "fish", "zsh"])
        self.assertEqual(got[7], ["tree"])
        self.assertEqual(got[8], ["version"])
        self.assertEqual(got[9], ["--endpoint", "--help", "--output", "--timeout",
                                  "--version"])

    # -- offline commands, help, errors, environment ----------------------------------------

    def test_size_textbook(self):
        flags = ["--layers=24", "--kv-heads=8", "--head-dim=64", "--dtype=fp16"]
        rc, out, _ = Ctl.run(["size", *flags, "--tokens=4096"], "/tmp/rkc_no_daemon.sock")
        self.assertEqual(rc, 0)
        self.assertIn("192 MiB", out.splitlines()[0])
        rc, out, _ = Ctl.run(["size", *flags, "--tokens=8192"], "/tmp/rkc_no_daemon.sock")
        self.assertIn("384 MiB", out.splitlines()[0])
        rc, out, _ = Ctl.run(["size", *flags, "--tokens=4096", "-o", "json"])
        j = json.loads(out)
        self.assertEqual(j["bytes"], 192 * 2**20)
        self.assertEqual(j["pages"], 256)
        self.assertEqual(j["page_bytes"], 24 * 2 * 8 * 64 * 2 * 16)
        rc, _, err = Ctl.run(["size", *flags])
        self.assertEqual(rc, 3)
        self.assertIn("--tokens", err)

    def test_version(self):
        j = self.json_of("version")
        self.assertTrue(j["version"])
        self.assertEqual(j["block_key_version"], 1)
        self.assertTrue(j["daemon_version"])
        # --version: the same version, offline, wherever it is given.
        for args in (["--version"], ["stats", "--version"]):
            rc, out, err = Ctl.run(args, "/tmp/rkc_no_daemon.sock")
            self.assertEqual((rc, out, err), (0, "radixkvctl %s\n" % j["version"], ""), args)

    def test_endpoint(self):
        # The default: the system socket when it exists, else the per-user
        # one under $XDG_RUNTIME_DIR, else /tmp/radixkv-<uid>.
        system = "/run/radixkv/radixkvd.sock"
        with tempfile.TemporaryDirectory() as runtime:
            for env, want in (
                    ({"XDG_RUNTIME_DIR": runtime}, runtime + "/radixkv/radixkvd.sock"),
                    ({"XDG_RUNTIME_DIR": ""}, "/tmp/radixkv-%d/radixkvd.sock" % os.getuid())):
                if os.path.exists(system):
                    want = system
                rc, out, err = Ctl.run(["endpoint"], env=env)
                self.assertEqual((rc, out, err), (0, "unix:" + want + "\n", ""), env)
        # --endpoint and RADIXKVCTL_ENDPOINT, as every other command takes them.
        for args, env, want in (
                (["--endpoint", "/tmp/a.sock", "endpoint"], None, "unix:/tmp/a.sock"),
                (["endpoint", "--endpoint=unix:/tmp/b.sock"], None, "unix:/tmp/b.sock"),
                (["endpoint"], {"RADIXKVCTL_ENDPOINT": "localhost:50051"}, "localhost:50051")):
            rc, out, err = Ctl.run(args, env=env)
            self.assertEqual((rc, out, err), (0, want + "\n", ""), args)
        rc, out, _ = Ctl.run(["endpoint", "-o", "json"], self.sock)
        self.assertEqual(json.loads(out), {"endpoint": self.sock, "target": "unix:" + self.sock})
        # The target it prints is the one the other commands reach.
        rc, out, _ = Ctl.run(["endpoint"], self.sock)
        rc, health, err = Ctl.run(["health"], out.strip())
        self.assertEqual(rc, 0, err)
        rc, out, err = Ctl.run(["endpoint"], "host:0")
        self.assertEqual(rc, 3)
        self.assertIn("--endpoint", err)

    def test_help(self):
        rc, out, _ = Ctl.run(["--help"])
        self.assertEqual(rc, 0)
        for c in ["health", "endpoint", "stats", "namespaces", "sessions", "tree", "match",
                  "explain", "hash", "evict", "clear", "watch", "size", "version"]:
            self.assertRegex(out, r"\n  %s +\S" % c)
            for form in (["help", c], [c, "--help"]):
                rc, text, _ = Ctl.run(form)
                self.assertEqual(rc, 0, form)
                self.assertIn("Example:", text)
                self.assertIn("radixkvctl", text)
        self.assertIn("Exit codes:", out)

    def test_unreachable_exits_2(self):
        for args in (["health"], ["stats"], ["namespaces"], ["sessions"], ["tree"],
                     ["evict", "--pages=1"], ["clear", "--yes"], ["watch"],
                     ["match", *NS_FLAGS, "1"], ["explain", *NS_FLAGS, "1"]):
            rc, out, err = Ctl.run(args + ["--timeout=2s"], "/tmp/rkc_no_daemon.sock")
            self.assertEqual(rc, 2, "%s: %s" % (args, err))
            self.assertEqual(out, "", args)
            self.assertTrue(err.startswith("Error:"), err)
            # The endpoint and the OS's reason, not only "unreachable".
            self.assertIn("unix:/tmp/rkc_no_daemon.sock", err, args)
            self.assertIn("No such file or directory", err, args)

    def test_bad_arguments_exit_3(self):
        cases = [
            (["nosuchcommand"], "nosuchcommand"),
            (["stats", "--bogus"], "--bogus"),
            (["--bogus", "stats"], "--bogus"),
            (["-o", "yaml", "stats"], "yaml"),
            (["--timeout=soon", "stats"], "--timeout"),
            (["evict"], "--pages"),
            (["evict", "--pages=zero"], "--pages"),
            (["match", *NS_FLAGS, "1", "abc"], "abc"),
            (["match", *NS_FLAGS], "no tokens"),
            (["match", "--layers=2", "1"], "--model"),
            (["match", *NS_FLAGS, "--dtype=fp12", "1"], "--dtype"),
            (["tree", "--limit=0"], "--limit"),
            ([], "no command"),
        ]
        for args, needle in cases:
            rc, out, err = Ctl.run(args, self.sock)
            self.assertEqual(rc, 3, "%s: rc=%d %s" % (args, rc, err))
            self.assertEqual(out, "", args)
            self.assertIn("Error:", err)
            self.assertIn(needle, err, args)

    def test_help_forms(self):
        # "help" alone is the main help; "--help" before the command is the
        # command's help.
        rc, out, _ = Ctl.run(["help"])
        self.assertEqual(rc, 0)
        self.assertIn("Exit codes:", out)
        self.assertRegex(out, r"\n  stats +\S")
        rc, out, _ = Ctl.run(["--help", "tree"])
        self.assertEqual(rc, 0)
        self.assertIn("--limit", out)
        self.assertIn("Example:", out)
        # Per-command help lists the global flags with their variables.
        rc, out, _ = Ctl.run(["match", "--help"])
        self.assertEqual(rc, 0)
        for needle in ("--model", "--file", "TOKENS", "RADIXKVCTL_ENDPOINT",
                       "RADIXKVCTL_TIMEOUT", "RADIXKVCTL_OUTPUT"):
            self.assertIn(needle, out)
        rc, out, err = Ctl.run(["help", "nosuchcommand"])
        self.assertEqual(rc, 3)
        self.assertEqual(out, "")
        self.assertIn("nosuchcommand", err)

    def test_flag_forms(self):
        self.populate(16, 12)
        # -ojson, "--flag value", global flags between command flags, and the
        # last of a repeated flag wins.
        out, _ = self.ctl("tree", "-ojson", "--limit", "1", "--timeout", "30s",
                          "--limit=2")
        self.assertEqual(len(json.loads(out)["nodes"]), 2)
        out, _ = self.ctl("-o", "json", "tree", "--output=text", "--limit=1")
        self.assertIn("KEY", out.splitlines()[0])
        # "--model=" names the empty model; it does not take the next argument.
        flags = ["--model=", "--layers=2", "--kv-heads=2", "--head-dim=8",
                 "--dtype=fp16", "--page-size=4"]
        rc, out, err = Ctl.run(["hash", *flags, "-o", "json", "1", "2", "3", "4"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["tokens"], 4)
        # Tokens after "--".
        rc, out, err = Ctl.run(["hash", *flags, "-o", "json", "--", "1", "2"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["tokens"], 2)
        # --yes=false is not --yes.
        _, err = self.ctl("clear", "--yes=false", expect=3)
        self.assertIn("--yes", err)

    def test_more_bad_arguments_exit_3(self):
        cases = [
            (["stats", "extra"], "extra"),
            (["tree", "--limit"], "--limit"),
            (["--output"], "--output"),
            (["nosuchcommand", "--bogus"], "nosuchcommand"),
            (["health", "--service"], "--service"),
            (["--endpoint=host:0", "stats"], "--endpoint"),
        ]
        for args, needle in cases:
            rc, out, err = Ctl.run(args, self.sock)
            self.assertEqual(rc, 3, "%s: rc=%d %s" % (args, rc, err))
            self.assertEqual(out, "", args)
            self.assertTrue(err.startswith("Error:"), err)
            self.assertIn(needle, err, args)

    def test_environment_variables(self):
        rc, out, _ = Ctl.run(["stats"], env={"RADIXKVCTL_ENDPOINT": self.sock,
                                             "RADIXKVCTL_OUTPUT": "json"})
        self.assertEqual(rc, 0)
        self.assertIn("stats", json.loads(out))
        # Flags override the environment.
        rc, out, _ = Ctl.run(["stats", "-o", "text", "--endpoint", self.sock],
                             env={"RADIXKVCTL_ENDPOINT": "/tmp/rkc_no_daemon.sock",
                                  "RADIXKVCTL_OUTPUT": "json"})
        self.assertEqual(rc, 0)
        self.assertIn("capacity:", out)
        rc, _, err = Ctl.run(["stats"], env={"RADIXKVCTL_ENDPOINT": self.sock,
                                             "RADIXKVCTL_TIMEOUT": "never"})
        self.assertEqual(rc, 3)
        self.assertIn("RADIXKVCTL_TIMEOUT", err)
        rc, _, _ = Ctl.run(["stats"], env={"RADIXKVCTL_ENDPOINT": "/tmp/rkc_no_daemon.sock",
                                           "RADIXKVCTL_TIMEOUT": "1s"})
        self.assertEqual(rc, 2)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--daemon", required=True)
    parser.add_argument("--helper", required=True)
    parser.add_argument("--vectors", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
