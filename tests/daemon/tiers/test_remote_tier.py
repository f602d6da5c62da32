"""The shared tier across hosts (docs/TIERS.md, remote): three radixkvd as
three hosts, each in a network namespace of its own joined by veth pairs
to a bridge in a fourth, where a real three-shard Redis Cluster runs.

Each host's 16-page pool holds two of the four 8-block prompts, so a pass
over all four on host A evicts the first two into the shared store; host
B, which never saw them, is then served them from the store, and every
answer equals a full prefill's, bit for bit (the first token's logits and
the generated tokens), which it cannot unless the bytes are A's. Cutting a
host's link or killing a shard costs hits, never an answer: the requests
succeed, equal to full prefills, nothing stays leased, and the circuit
breaker reports the store. Needs root (ip netns); skips otherwise.
"""
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from rkv_testutil import Daemon, executable  # noqa: E402
from radixkv import pb  # noqa: E402
import redis_store  # noqa: E402
from worker_util import check_equal, run_worker  # noqa: E402

PAGE_BYTES = 8192
POOL = f"host,bytes={16 * PAGE_BYTES},page_bytes={PAGE_BYTES}"
PROMPTS = 4
PROMPT_TOKENS = 128  # 8 blocks of 16
PASSWORD = "fleet-secret"
HOSTS = ("a", "b", "c")
PORTS = (7001, 7002, 7003)

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="network namespaces need root")


def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(args), r.stderr))
    return r


class Fleet:
    """Namespaces rk<pid><x> per host and rk<pid>s for the store."""

    def __init__(self, tmp):
        tag = "rk%d" % (os.getpid() % 100000)
        self.tmp = tmp
        self.store_ns = tag + "s"
        self.ns = {h: tag + h for h in HOSTS}
        self.net = "10.%d.%d" % (200 + os.getpid() % 50, os.getpid() % 250)
        self.store_ip = self.net + ".100"
        self.veth = {h: ("%sv%s" % (tag, h), "%sp%s" % (tag, h)) for h in HOSTS}
        self.daemons = {}
        self.store = None

    def in_ns(self, ns):
        return ["ip", "netns", "exec", ns]

    def up(self):
        sh("ip", "netns", "add", self.store_ns)
        ex = self.in_ns(self.store_ns)
        sh(*ex, "ip", "link", "set", "lo", "up")
        sh(*ex, "ip", "link", "add", "br0", "type", "bridge")
        sh(*ex, "ip", "addr", "add", self.store_ip + "/24", "dev", "br0")
        sh(*ex, "ip", "link", "set", "br0", "up")
        for i, h in enumerate(HOSTS):
            ns = self.ns[h]
            host_if, store_if = self.veth[h]
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", host_if, "type", "veth", "peer", "name",
               store_if)
            sh("ip", "link", "set", host_if, "netns", ns)
            sh("ip", "link", "set", store_if, "netns", self.store_ns)
            sh(*ex, "ip", "link", "set", store_if, "master", "br0")
            sh(*ex, "ip", "link", "set", store_if, "up")
            hx = self.in_ns(ns)
            sh(*hx, "ip", "link", "set", "lo", "up")
            sh(*hx, "ip", "addr", "add", "%s.%d/24" % (self.net, i + 1), "dev",
               host_if)
            sh(*hx, "ip", "link", "set", host_if, "up")
        self.store = redis_store.RedisStore(
            os.path.join(self.tmp, "store"), shards=3, password=PASSWORD,
            host=self.store_ip, prefix=self.in_ns(self.store_ns),
            ports=list(PORTS))
        self.store.start()
        self.password_file = os.path.join(self.tmp, "store.pw")
        with open(self.password_file, "w") as f:
            f.write(PASSWORD + "\n")
        os.chmod(self.password_file, 0o600)

    def tier_spec(self, write="evicted"):
        return ("remote,addr=%s:%d,password_file=%s,timeout=300ms,"
                "breaker_failures=3,breaker_cooldown=1s,write=%s" %
                (self.store_ip, PORTS[0], self.password_file, write))

    def start_daemon(self, h, write="evicted"):
        d = Daemon(executable("RADIXKVD"), ["--tier=" + self.tier_spec(write)],
                   POOL)
        # The daemon runs in its host's network namespace; its Unix socket
        # is a file, so the test reaches it from here.
        d.argv = self.in_ns(self.ns[h]) + d.argv
        d.start()
        self.daemons[h] = d
        return d

    def link(self, h, up):
        sh(*self.in_ns(self.store_ns), "ip", "link", "set", self.veth[h][1],
           "up" if up else "down")

    def down(self):
        for d in self.daemons.values():
            d.stop()
        if self.store is not None:
            self.store.stop()
        for ns in list(self.ns.values()) + [self.store_ns]:
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(str(tmp_path_factory.mktemp("fleet")))
    try:
        f.up()
        for h in HOSTS:
            f.start_daemon(h)
        yield f
    finally:
        f.down()


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    p = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    p.write_text("".join(
        " ".join(str((7 * i + 13 * j) % 500 + 1) for j in range(PROMPT_TOKENS))
        + "\n" for i in range(PROMPTS)))
    return str(p)


@pytest.fixture(scope="module")
def reference(prompts):
    return run_worker(prompts)


def check_partial(got, prompts, reference, tmp, full_matches=True):
    """Answers that reused m cached tokens equal those of a daemon with no
    tier that caches exactly those m tokens (the worker's prefill splits at
    the cached length, so its floating-point sums follow the split): the
    bytes that came from the store were the right ones."""
    with open(prompts) as f:
        lines = f.read().splitlines()
    for g, r, line in zip(got, reference, lines):
        m = g["matched_tokens"]
        if m == 0 or (full_matches and m >= PROMPT_TOKENS - 1):
            check_equal([g], [r])
            continue
        tokens = line.split()
        p = os.path.join(tmp, "partial.txt")
        with open(p, "w") as f:
            f.write(" ".join(tokens[:m + 1]) + "\n" + line + "\n")
        d = Daemon(executable("RADIXKVD"), [], POOL).start()
        try:
            control = run_worker(p, "unix:" + d.sock)[1]
        finally:
            d.stop()
        assert control["matched_tokens"] == m, control
        assert g["first_logits_xxh3"] == control["first_logits_xxh3"], (g, control)
        assert g["generated"] == control["generated"], (g, control)


def remote(d):
    return {t.kind: t for t in d.stats().tiers}["remote"]


def wait_written(d, blocks, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = remote(d)
        if r.pending_blocks == 0 and r.demoted_blocks >= blocks:
            return r
        time.sleep(0.05)
    raise AssertionError(remote(d))


def restart(fleet, h, write="evicted"):
    fleet.daemons[h].stop()
    return fleet.start_daemon(h, write)


def test_a_prompt_committed_on_one_host_is_served_on_another(fleet, prompts,
                                                             reference):
    a, b = fleet.daemons["a"], fleet.daemons["b"]
    first = run_worker(prompts, "unix:" + a.sock)
    check_equal(first, reference)
    assert all(r["matched_tokens"] == 0 for r in first), first
    # Two prompts' 16 blocks left A's pool for the shared store.
    ra = wait_written(a, 16)
    assert ra.write_errors == 0 and ra.dropped_full == 0, ra
    keys = fleet.store.keys("rkv:*")
    assert len(keys) >= 16, keys
    # Keys are scoped by namespace root: one root, the worker's namespace.
    roots = {k.split(":")[1] for k in keys}
    assert len(roots) == 1, roots
    ns = a.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces[0]
    assert ns.namespace_id.hex() in roots

    # B has never seen these prompts: the first two come from the store.
    got = run_worker(prompts, "unix:" + b.sock)
    check_equal(got, reference)
    assert got[0]["matched_tokens"] >= PROMPT_TOKENS - 16, got[0]
    assert got[1]["matched_tokens"] >= PROMPT_TOKENS - 16, got[1]
    rb = remote(b)
    assert rb.promoted_blocks >= 14, rb
    assert rb.checksum_failures == 0 and rb.read_errors == 0, rb
    s = b.stats()
    assert s.hit_tokens >= 2 * (PROMPT_TOKENS - 16), s
    assert s.leases == 0 and s.writing_pages == 0, s


def test_write_all_shares_a_prompt_before_any_eviction(fleet, tmp_path):
    """write=all: a prompt that fits in A's pool is in the store as soon as
    A commits it, and C is served it from there."""
    a = restart(fleet, "a", write="all")
    c = restart(fleet, "c")
    p = str(tmp_path / "one.txt")
    with open(p, "w") as f:
        f.write(" ".join(str((3 * j + 101) % 500 + 1)
                         for j in range(PROMPT_TOKENS)) + "\n")
    reference = run_worker(p)
    first = run_worker(p, "unix:" + a.sock)
    check_equal(first, reference)
    sa = a.stats()
    assert sa.evicted_pages == 0, sa
    ra = wait_written(a, 8)
    assert ra.write_errors == 0, ra
    assert sa.leases == 0 and sa.writing_pages == 0, sa
    got = run_worker(p, "unix:" + c.sock)
    assert got[0]["matched_tokens"] >= PROMPT_TOKENS - 16, got
    check_partial(got, p, reference, str(tmp_path), full_matches=False)
    assert remote(c).promoted_blocks >= 7, remote(c)
    restart(fleet, "a")


def test_another_namespace_never_reads_the_fleets_blocks(fleet, prompts):
    """The same tokens under another cache_salt (another tenant's salt is
    another root) find nothing in the store."""
    from radixkv import pb_grpc
    import grpc
    c = fleet.daemons["c"]
    with open(prompts) as f:
        tokens = [int(t) for t in f.readline().split()]
    # The worker's namespace, from a host that has served it.
    ns = next(e.namespace for d in fleet.daemons.values()
              for e in d.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces
              if e.cached_blocks > 0)
    other = pb.Namespace()
    other.CopyFrom(ns)
    other.cache_salt = "another-tenant"
    kv = pb_grpc.KvCacheStub(grpc.insecure_channel("unix:" + c.sock))
    same = kv.Match(pb.MatchRequest(namespace=ns, tokens=tokens), timeout=5)
    assert same.tier_matched_blocks == 8, same
    foreign = kv.Match(pb.MatchRequest(namespace=other, tokens=tokens), timeout=5)
    assert foreign.tier_matched_blocks == 0, foreign


def test_a_cut_link_costs_hits_not_answers(fleet, prompts, reference):
    c = restart(fleet, "c")  # an empty pool: everything would come remote
    fleet.link("c", up=False)
    try:
        got = run_worker(prompts, "unix:" + c.sock)
        check_equal(got, reference)
        rc = remote(c)
        assert rc.promoted_blocks == 0, rc
        assert rc.read_errors >= 1, rc
        assert rc.unavailable and rc.breaker_trips >= 1, rc
        ctl = subprocess.run([executable("RADIXKVCTL"), "--endpoint",
                              "unix:" + c.sock, "stats"],
                             capture_output=True, text=True, timeout=30)
        assert ctl.returncode == 0, ctl.stderr
        assert "tier remote:" in ctl.stdout and \
            "UNAVAILABLE (circuit open)" in ctl.stdout, ctl.stdout
        s = c.stats()
        assert s.leases == 0 and s.writing_pages == 0, s
    finally:
        fleet.link("c", up=True)
    # The link is back: once the cooldown has passed, a probe closes the
    # circuit and the store serves again.
    c = restart(fleet, "c")
    time.sleep(1.2)
    got = run_worker(prompts, "unix:" + c.sock)
    check_equal(got, reference)
    rc = remote(c)
    assert not rc.unavailable, rc
    assert rc.promoted_blocks >= 14, rc


def test_a_killed_shard_costs_hits_not_answers(fleet, prompts, reference,
                                              tmp_path):
    fleet.store.kill(2)
    b = restart(fleet, "b")
    got = run_worker(prompts, "unix:" + b.sock)
    # Blocks up to the first one in the dead shard's slots are hits.
    check_partial(got, prompts, reference, str(tmp_path))
    rb = remote(b)
    # Blocks in the dead shard's slots are errors, never wrong bytes.
    assert rb.read_errors + rb.write_errors >= 1, rb
    assert rb.checksum_failures == 0, rb
    s = b.stats()
    assert s.leases == 0 and s.writing_pages == 0, s
    assert b.proc.poll() is None


def test_credentials_the_store_refuses_are_a_configuration_error(fleet, tmp_path):
    bad = tmp_path / "wrong.pw"
    bad.write_text("not-the-password\n")
    os.chmod(bad, 0o600)
    spec = fleet.tier_spec().replace(fleet.password_file, str(bad))
    r = subprocess.run(
        fleet.in_ns(fleet.ns["a"]) +
        [executable("RADIXKVD"), "--socket=%s/s.sock" % tmp_path,
         "--metrics_listen=", "--pool=" + POOL, "--tier=" + spec],
        capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--tier=remote: %s:%d refused AUTH" % (fleet.store_ip, PORTS[0]) \
        in r.stderr, r.stderr
