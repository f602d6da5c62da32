"""radixkvd's trust model against real processes: sessions bound to the peer
that opened them, the administrator role, tenants, fencing of a stalled or
vanished writer's pages, TLS, and the per-client limits. Every peer here is
a real process with its own pid (and, where it matters, its own uid), so the
kernel's credentials are what the daemon sees.

Run through ctest (tests/security/CMakeLists.txt sets PYTHONPATH and
$RADIXKVD); root is needed for the other-uid cases, which skip otherwise.
"""
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from rkv_testutil import Daemon, executable  # noqa: E402
from radixkv import pb, pb_grpc  # noqa: E402

NOBODY = 65534
PAGE_TOKENS = 4


def radixkvd():
    return executable("RADIXKVD")


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to run peers under another uid")


@pytest.fixture
def daemons():
    started = []

    def make(*flags, pool="host,bytes=8KiB", public=False):
        d = Daemon(radixkvd(), list(flags), pool)
        started.append(d)
        d.start()
        if public:
            os.chmod(d.sock, 0o666)  # let other uids connect (test only)
        return d

    yield make
    for d in started:
        d.cleanup()


def namespace(salt=""):
    # page_bytes = 1 layer * 2 * 1 head * 4 tokens * 16 dims * 4 bytes = 512
    return pb.Namespace(model="trust-test", num_layers=1, num_kv_heads=1,
                        head_dim=16, page_size=PAGE_TOKENS,
                        dtype=pb.DTYPE_FLOAT32, cache_salt=salt)


class Session:
    """A Session stream of this process: opened on construction, kept open
    until close()."""

    def __init__(self, sock, ns=None, acknowledge=()):
        self.channel = grpc.insecure_channel("unix:" + sock)
        self.kv = pb_grpc.KvCacheStub(self.channel)
        self._q = queue.Queue()
        self._q.put(pb.SessionRequest(open=pb.OpenSession(
            namespace=ns or namespace(), client_name="trust-test",
            acknowledge_sessions=list(acknowledge))))
        self._call = self.kv.Session(iter(self._q.get, None))
        self.info = next(self._call).session
        self.id = self.info.session_id

    def acquire(self, tokens, allocate=True):
        return self.kv.Acquire(pb.AcquireRequest(
            session_id=self.id, tokens=tokens, allocate=allocate), timeout=5)

    def close(self):
        self._q.put(None)
        self._call.cancel()
        self.channel.close()


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def run_as(uid, script, *args, timeout=30):
    """Runs a Python snippet as `uid` (root: this process's uid); returns
    its stdout. The snippet gets SOCK (argv[1]) and the stubs."""
    prologue = textwrap.dedent("""
        import sys, grpc
        from radixkv import pb, pb_grpc
        SOCK = sys.argv[1]
        ch = grpc.insecure_channel("unix:" + SOCK)
        kv = pb_grpc.KvCacheStub(ch)
        admin = pb_grpc.AdminStub(ch)
        def code(fn):
            try:
                fn()
                return "OK"
            except grpc.RpcError as e:
                return e.code().name
    """)

    # Another uid through setpriv(1), so that this process only ever
    # vfork()s and execs. subprocess's own user/group arguments make it
    # fork() instead, and a fork of a process with live gRPC threads runs
    # their atfork handlers in a child that can crash before exec.
    argv = [sys.executable, "-c", prologue + textwrap.dedent(script), *args]
    if uid != os.geteuid():
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                *argv]
    out = subprocess.run(argv, capture_output=True, text=True,
                         timeout=timeout, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    return out.stdout


# A writer in its own process: opens a session, takes `blocks` new pages,
# says "acquired <session> <lease>", then waits for a line on stdin:
# "commit" (Commit and print the status code), "reopen <id>" (a new session
# acknowledging <id>), "drop" (end the stream, stay alive), "exit".
WRITER = textwrap.dedent("""
    import queue, sys, grpc
    from radixkv import pb, pb_grpc
    sock, blocks = sys.argv[1], int(sys.argv[2])
    ch = grpc.insecure_channel("unix:" + sock)
    kv = pb_grpc.KvCacheStub(ch)
    ns = pb.Namespace(model="trust-test", num_layers=1, num_kv_heads=1,
                      head_dim=16, page_size=4, dtype=pb.DTYPE_FLOAT32)
    def open_session(ack=()):
        q = queue.Queue()
        q.put(pb.SessionRequest(open=pb.OpenSession(
            namespace=ns, acknowledge_sessions=list(ack))))
        call = kv.Session(iter(q.get, None))
        return q, call, next(call).session.session_id
    q, call, sid = open_session()
    r = kv.Acquire(pb.AcquireRequest(session_id=sid,
                   tokens=list(range(1000, 1000 + 4 * blocks)), allocate=True))
    print("acquired", sid, r.lease_id, r.new_blocks, flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "commit":
            try:
                kv.Commit(pb.CommitRequest(session_id=sid, lease_id=r.lease_id,
                                           blocks=r.new_blocks, release=True))
                print("OK", flush=True)
            except grpc.RpcError as e:
                print(e.code().name, flush=True)
        elif cmd[0] == "drop":
            q.put(None)
            call.cancel()
            print("dropped", flush=True)
        elif cmd[0] == "reopen":
            q, call, sid = open_session(cmd[1:])
            print("reopened", sid, flush=True)
        elif cmd[0] == "exit":
            break
""")


class Writer:
    def __init__(self, sock, blocks):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, sock, str(blocks)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        words = self.proc.stdout.readline().split()
        assert words and words[0] == "acquired", words
        self.session, self.lease, self.new_blocks = words[1], int(words[2]), int(words[3])

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def wait_stats(d, predicate, timeout=10.0):
    deadline = time.time() + timeout
    while True:
        s = d.stats()
        if predicate(s) or time.time() > deadline:
            return s
        time.sleep(0.02)


# --- Sessions bound to their peer ------------------------------------------

def test_another_process_cannot_use_a_session(daemons):
    d = daemons()
    w = Writer(d.sock, 2)
    try:
        before = d.stats()
        out = run_as(os.geteuid(), """
            sid, lease = sys.argv[2], int(sys.argv[3])
            print(code(lambda: kv.Acquire(pb.AcquireRequest(
                session_id=sid, tokens=[1, 2, 3, 4], allocate=True))))
            print(code(lambda: kv.Release(pb.ReleaseRequest(
                session_id=sid, lease_id=lease))))
            print(code(lambda: kv.Commit(pb.CommitRequest(
                session_id=sid, lease_id=lease, blocks=1))))
            try:
                kv.Acquire(pb.AcquireRequest(session_id=sid, tokens=[1, 2, 3, 4]))
            except grpc.RpcError as e:
                print(e.details())
        """, d.sock, w.session, str(w.lease))
        lines = out.splitlines()
        assert lines[:3] == ["PERMISSION_DENIED"] * 3, out
        assert "belongs to another peer" in lines[3], out
        after = d.stats()
        # Nothing changed: the lease is still the writer's, no lookup ran.
        assert after.leases == before.leases == 1
        assert after.writing_pages == before.writing_pages == 2
        assert after.lookups == before.lookups
        assert after.permission_denied >= 4
        assert w.send("commit") == "OK"  # the owner still can
    finally:
        w.kill()


def test_session_ids_are_shown_to_administrators_and_their_owner_only(daemons):
    need_root()
    d = daemons(public=True)
    w = Writer(d.sock, 1)
    try:
        ids = [s.session_id for s in d.sessions()]
        assert ids == [w.session]  # root is an administrator
        out = run_as(NOBODY, """
            r = admin.ListSessions(pb.ListSessionsRequest())
            print(len(r.sessions), [s.session_id for s in r.sessions])
        """, d.sock)
        assert out.strip() == "1 ['']", out
    finally:
        w.kill()


# --- Administrator role -----------------------------------------------------

ADMIN_PROBE = """
    print(code(lambda: admin.GetStats(pb.GetStatsRequest())))
    print(code(lambda: admin.Clear(pb.ClearRequest())))
    print(code(lambda: admin.Evict(pb.EvictRequest(pages=1))))
    print(code(lambda: next(admin.WatchEvents(pb.WatchEventsRequest()))))
"""


def test_admin_calls_need_the_admin_role(daemons):
    need_root()
    d = daemons(public=True)
    out = run_as(NOBODY, ADMIN_PROBE, d.sock).split()
    assert out == ["OK", "PERMISSION_DENIED", "PERMISSION_DENIED",
                   "PERMISSION_DENIED"], out
    log = d.log()
    assert f"audit: refused Clear from uid={NOBODY}" in log, log
    assert f"audit: refused Evict from uid={NOBODY}" in log, log
    assert d.stats().permission_denied == 3
    # Root is an administrator.
    assert code_of(lambda: d.admin.Clear(pb.ClearRequest(), timeout=5))[0] == \
        grpc.StatusCode.OK


def test_admin_gids_make_administrators(daemons):
    need_root()
    d = daemons(f"--admin_gids={NOBODY}", public=True)
    out = run_as(NOBODY, """
        print(code(lambda: admin.Clear(pb.ClearRequest())))
        print(code(lambda: admin.Evict(pb.EvictRequest(pages=1))))
    """, d.sock).split()
    assert out == ["OK", "OK"], out


# --- Tenants ----------------------------------------------------------------

def tenants_file(tmp_path, **extra):
    cfg = {"tenants": [{"name": "alpha", "uids": [0]},
                       {"name": "beta", "uids": [NOBODY], "max_sessions": 1,
                        "max_namespaces": 1}],
           "unmatched": "refuse"}
    cfg.update(extra)
    p = tmp_path / "tenants.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_tenants_never_share_blocks_or_see_each_other(daemons, tmp_path):
    need_root()
    d = daemons(f"--tenants={tenants_file(tmp_path)}", public=True)
    tokens = list(range(100, 100 + 4 * PAGE_TOKENS))
    alpha = Session(d.sock, namespace("shared-salt"))
    assert alpha.info.tenant == "alpha"
    r = alpha.acquire(tokens)
    alpha.kv.Commit(pb.CommitRequest(session_id=alpha.id, lease_id=r.lease_id,
                                     blocks=r.new_blocks, release=True), timeout=5)
    assert alpha.kv.Match(pb.MatchRequest(namespace=namespace("shared-salt"),
                                          tokens=tokens)).matched_blocks == 4
    out = run_as(NOBODY, """
        import queue
        tokens = list(range(100, 116))
        ns = pb.Namespace(model="trust-test", num_layers=1, num_kv_heads=1,
                          head_dim=16, page_size=4, dtype=pb.DTYPE_FLOAT32,
                          cache_salt="shared-salt")
        print(kv.Match(pb.MatchRequest(namespace=ns, tokens=tokens)).matched_blocks)
        q = queue.Queue()
        q.put(pb.SessionRequest(open=pb.OpenSession(namespace=ns)))
        call = kv.Session(iter(q.get, None))
        info = next(call).session
        print(info.tenant)
        r = kv.Acquire(pb.AcquireRequest(session_id=info.session_id, tokens=tokens))
        print(r.matched_blocks)
        print(len(admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces))
        e = admin.Explain(pb.ExplainRequest(namespace=ns, tokens=tokens))
        print(sorted(set(pb.BlockState.Name(b.state) for b in e.blocks)))
        print(len(admin.DumpTree(pb.DumpTreeRequest(limit=100)).nodes))
        # Its quota: one session.
        q2 = queue.Queue()
        q2.put(pb.SessionRequest(open=pb.OpenSession(namespace=ns)))
        try:
            next(kv.Session(iter(q2.get, None)))
            print("OK")
        except grpc.RpcError as e:
            print(e.code().name, "max_sessions=1" in e.details())
    """, d.sock).splitlines()
    assert out[0] == "0", out           # alpha's blocks are not beta's
    assert out[1] == "beta", out
    assert out[2] == "0", out
    assert out[3] == "1", out           # its own namespace only
    assert "BLOCK_STATE_WRONG_NAMESPACE" not in out[4], out
    assert out[5] == "0", out           # none of alpha's nodes
    assert out[6] == "RESOURCE_EXHAUSTED True", out
    # An administrator sees both namespaces, with their effective salts.
    salts = sorted(n.namespace.cache_salt for n in
                   d.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces)
    assert salts == ["tenant/alpha/shared-salt", "tenant/beta/shared-salt"]
    alpha.close()


def test_a_peer_of_no_tenant_is_refused(daemons, tmp_path):
    need_root()
    d = daemons(f"--tenants={tenants_file(tmp_path)}", public=True)
    out = run_as(1, """
        print(code(lambda: admin.GetStats(pb.GetStatsRequest())))
    """, d.sock)  # uid 1 (daemon) is in no tenant
    assert out.strip() == "PERMISSION_DENIED"
    assert "belongs to no tenant" in d.log()


def store(session, tokens):
    r = session.acquire(tokens)
    session.kv.Commit(pb.CommitRequest(session_id=session.id, lease_id=r.lease_id,
                                       blocks=r.new_blocks, release=True), timeout=5)
    return r


def test_a_busy_tenant_cannot_flush_a_quiet_one(daemons, tmp_path):
    need_root()
    # 16 pages of 512 bytes. beta stores 4 blocks first (the oldest in the
    # pool), then alpha churns through 24: plain LRU would evict beta's.
    cfg = tenants_file(tmp_path, tenants=[
        {"name": "alpha", "uids": [0], "max_cached_pages": 10},
        {"name": "beta", "uids": [NOBODY], "max_pinned_pages": 2}])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = daemons(f"--tenants={cfg}", f"--metrics_listen=127.0.0.1:{port}",
                public=True)
    out = run_as(NOBODY, """
        import queue
        ns = pb.Namespace(model="trust-test", num_layers=1, num_kv_heads=1,
                          head_dim=16, page_size=4, dtype=pb.DTYPE_FLOAT32)
        q = queue.Queue()
        q.put(pb.SessionRequest(open=pb.OpenSession(namespace=ns)))
        call = kv.Session(iter(q.get, None))
        sid = next(call).session.session_id
        def store(first):
            r = kv.Acquire(pb.AcquireRequest(session_id=sid, allocate=True,
                                             tokens=list(range(first, first + 8))))
            kv.Commit(pb.CommitRequest(session_id=sid, lease_id=r.lease_id,
                                       blocks=r.new_blocks, release=True))
            return r.new_blocks
        print(store(500), store(600))
        # Its pin limit: two pages at once.
        r = kv.Acquire(pb.AcquireRequest(session_id=sid, allocate=True,
                                         tokens=list(range(700, 716))))
        print(r.new_blocks)
        try:
            kv.Acquire(pb.AcquireRequest(session_id=sid, allocate=True,
                                         tokens=list(range(800, 804))))
            print("OK")
        except grpc.RpcError as e:
            print(e.code().name, "tenant beta" in e.details(),
                  "max_pinned_pages" in e.details())
        kv.Release(pb.ReleaseRequest(session_id=sid, lease_id=r.lease_id))
        st = admin.GetStats(pb.GetStatsRequest()).stats
        print([t.name for t in st.tenants])
    """, d.sock).splitlines()
    assert out[0] == "2 2", out
    assert out[1] == "2", out
    assert out[2] == "RESOURCE_EXHAUSTED True True", out
    assert out[3] == "['beta']", out  # a tenant sees its own share only
    alpha = Session(d.sock)
    for i in range(6):
        store(alpha, list(range(1000 * (i + 1), 1000 * (i + 1) + 4 * PAGE_TOKENS)))
    tenants = {t.name: t for t in d.stats().tenants}
    assert tenants["alpha"].cached_pages <= 10, tenants
    assert tenants["alpha"].max_cached_pages == 10
    assert tenants["beta"].cached_pages == 4, tenants
    assert tenants["beta"].evicted_pages == 0, tenants
    assert tenants["alpha"].evicted_pages >= 14, tenants
    blocks = {n.namespace.cache_salt: n.cached_blocks for n in
              d.admin.ListNamespaces(pb.ListNamespacesRequest()).namespaces}
    assert blocks["tenant/beta"] == 4, blocks
    assert d.stats().free_pages >= 2
    alpha.close()
    # The same figures reach Prometheus.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'radixkv_tenant_pages{tenant="beta",state="cached"} 4' in metrics, metrics
    assert 'radixkv_tenant_limited_acquires_total{tenant="beta"} 2' in metrics


def test_bad_tenants_files_are_refused_at_start(tmp_path):
    binary = radixkvd()
    cases = {
        '{"tenants": []}': "$.tenants: must be a non-empty array",
        '{"tenants": [{"name": "a", "uid": [1]}]}': "$.tenants[0].uid: unknown key",
        '{"tenants": [{"name": "a"}, {"name": "a"}]}': "listed twice",
        '{"tenants": [{"name": "a b"}]}': "$.tenants[0].name",
        '{"tenants": [{"name": "a", "uids": [-1]}]}': "$.tenants[0].uids[0]",
        '{"tenants": [{"name": "a"}], "unmatched": "b"}': "$.unmatched",
        '{"tenants": [{"name": "a", "weight": 0}]}': "$.tenants[0].weight",
        '{"tenants": [{"name": "a", "max_cached_pages": -1}]}':
            "$.tenants[0].max_cached_pages",
        'not json': "not valid JSON",
    }
    for text, want in cases.items():
        p = tmp_path / "t.json"
        p.write_text(text)
        r = subprocess.run([binary, f"--socket={tmp_path}/s.sock", "--metrics_listen=",
                            f"--tenants={p}"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 2, (text, r.stderr)
        assert want in r.stderr and "--tenants=" in r.stderr, (text, r.stderr)


# --- Fencing ----------------------------------------------------------------

FENCE_FLAGS = ("--lease_ttl=1s", "--max_pinned_pages_per_session=16")


def test_a_stalled_writers_pages_go_to_no_one_until_it_acknowledges(daemons):
    d = daemons(*FENCE_FLAGS)  # 16 pages of 512 bytes
    w = Writer(d.sock, 16)
    assert w.new_blocks == 16
    w.stop()  # a stall past the lease TTL (a GC pause, SIGSTOP)
    try:
        s = wait_stats(d, lambda s: s.quarantined_pages == 16)
        assert (s.quarantined_pages, s.quarantined_leases, s.free_pages) == (16, 1, 0), s
        assert s.lease_expired == 1
        # Another writer gets none of them.
        b = Session(d.sock)
        r = b.acquire(list(range(5000, 5016)))
        assert r.new_blocks == 0 and r.lease_id == 0, r
        # The stalled writer resumes; its Commit fails and acknowledges.
        w.cont()
        assert w.send("commit") == "NOT_FOUND"
        s = wait_stats(d, lambda s: s.quarantined_pages == 0)
        assert (s.quarantined_pages, s.free_pages, s.cached_pages) == (0, 16, 0), s
        r = b.acquire(list(range(5000, 5016)))
        assert r.new_blocks == 4
        b.close()
    finally:
        w.cont()
        w.kill()


def test_a_stalled_writers_pages_return_when_it_exits(daemons):
    d = daemons(*FENCE_FLAGS)
    w = Writer(d.sock, 8)
    w.stop()
    s = wait_stats(d, lambda s: s.quarantined_pages == 8)
    assert s.quarantined_pages == 8, s
    w.kill()  # SIGKILL while stopped: the pidfd turns readable
    s = wait_stats(d, lambda s: s.quarantined_pages == 0 and s.sessions == 0)
    assert (s.quarantined_pages, s.leases, s.free_pages) == (0, 0, 16), s


def test_a_lost_session_is_fenced_until_its_process_acknowledges(daemons):
    d = daemons(*FENCE_FLAGS)
    w = Writer(d.sock, 4)
    try:
        assert w.send("drop") == "dropped"  # the stream ends, the process lives
        s = wait_stats(d, lambda s: s.sessions == 0)
        assert (s.sessions, s.quarantined_pages, s.quarantined_leases) == (0, 4, 1), s
        # Another process cannot acknowledge it.
        Session(d.sock, acknowledge=[w.session]).close()
        assert d.stats().quarantined_pages == 4
        # The writer itself can.
        assert w.send(f"reopen {w.session}").startswith("reopened")
        s = wait_stats(d, lambda s: s.quarantined_pages == 0)
        assert (s.quarantined_pages, s.free_pages) == (0, 16), s
    finally:
        w.kill()


def test_a_session_that_ends_with_nothing_open_fences_nothing(daemons):
    d = daemons(*FENCE_FLAGS)
    w = Writer(d.sock, 4)
    try:
        assert w.send("commit") == "OK"
        assert w.send("drop") == "dropped"
        s = wait_stats(d, lambda s: s.sessions == 0)
        assert (s.quarantined_pages, s.leases) == (0, 0), s
    finally:
        w.kill()


# --- TLS --------------------------------------------------------------------

def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki():
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl is not installed")
    d = tempfile.mkdtemp(prefix="rkv-pki-")
    p = lambda n: os.path.join(d, n)  # noqa: E731
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=radixkv-test-ca", "-keyout", p("ca.key"), "-out", p("ca.pem"))
    ext = p("san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, cn, extfile in (("server", "localhost", ext), ("worker", "worker-a", None),
                              ("ops", "ops", None)):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                "-keyout", p(name + ".key"), "-out", p(name + ".csr"))
        sign = ["x509", "-req", "-in", p(name + ".csr"), "-CA", p("ca.pem"),
                "-CAkey", p("ca.key"), "-CAcreateserial", "-days", "2",
                "-out", p(name + ".pem")]
        if extfile:
            sign += ["-extfile", extfile]
        openssl(*sign)
    return p


def tcp_port(d):
    m = re.search(r"radixkvd: gRPC on 127\.0\.0\.1:(\d+)", d.log())
    assert m, d.log()
    return int(m.group(1))


def tls_channel(pki, port, who=None):
    read = lambda n: open(pki(n), "rb").read()  # noqa: E731
    creds = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"),
        private_key=read(who + ".key") if who else None,
        certificate_chain=read(who + ".pem") if who else None)
    # A subchannel pool of its own: each channel is its own connection.
    return grpc.secure_channel(f"127.0.0.1:{port}", creds,
                               options=[("grpc.ssl_target_name_override", "localhost"),
                                        ("grpc.use_local_subchannel_pool", 1)])


def test_mtls_identifies_clients_by_certificate(daemons, pki):
    d = daemons("--listen_tcp=127.0.0.1:0", f"--tls_cert={pki('server.pem')}",
                f"--tls_key={pki('server.key')}", f"--tls_client_ca={pki('ca.pem')}",
                "--admin_subjects=ops")
    port = tcp_port(d)
    worker = pb_grpc.AdminStub(tls_channel(pki, port, "worker"))
    assert worker.GetStats(pb.GetStatsRequest(), timeout=10).stats.version
    assert code_of(lambda: worker.Clear(pb.ClearRequest(), timeout=10))[0] == \
        grpc.StatusCode.PERMISSION_DENIED
    ops = pb_grpc.AdminStub(tls_channel(pki, port, "ops"))
    assert code_of(lambda: ops.Clear(pb.ClearRequest(), timeout=10))[0] == grpc.StatusCode.OK
    assert "audit: refused Clear from tls:worker-a" in d.log()
    # No client certificate, or no TLS at all: no connection.
    anon = pb_grpc.AdminStub(tls_channel(pki, port))
    assert code_of(lambda: anon.GetStats(pb.GetStatsRequest(), timeout=5))[0] == \
        grpc.StatusCode.UNAVAILABLE
    plain = pb_grpc.AdminStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    assert code_of(lambda: plain.GetStats(pb.GetStatsRequest(), timeout=5))[0] == \
        grpc.StatusCode.UNAVAILABLE


def test_a_session_opened_over_tls_is_bound_to_its_certificate(daemons, pki):
    d = daemons("--listen_tcp=127.0.0.1:0", f"--tls_cert={pki('server.pem')}",
                f"--tls_key={pki('server.key')}", f"--tls_client_ca={pki('ca.pem')}")
    port = tcp_port(d)
    kv_a = pb_grpc.KvCacheStub(tls_channel(pki, port, "worker"))
    q = queue.Queue()
    q.put(pb.SessionRequest(open=pb.OpenSession(namespace=namespace())))
    call = kv_a.Session(iter(q.get, None))
    sid = next(call).session.session_id
    kv_b = pb_grpc.KvCacheStub(tls_channel(pki, port, "ops"))
    assert code_of(lambda: kv_b.Acquire(pb.AcquireRequest(
        session_id=sid, tokens=[1, 2, 3, 4]), timeout=10))[0] == \
        grpc.StatusCode.PERMISSION_DENIED
    assert kv_a.Acquire(pb.AcquireRequest(session_id=sid, tokens=[1, 2, 3, 4]),
                        timeout=10).total_blocks == 1
    q.put(None)
    call.cancel()


def test_tls_without_client_certificates_binds_sessions_to_the_connection(
        daemons, pki):
    d = daemons("--listen_tcp=127.0.0.1:0", f"--tls_cert={pki('server.pem')}",
                f"--tls_key={pki('server.key')}")
    port = tcp_port(d)
    kv_a = pb_grpc.KvCacheStub(tls_channel(pki, port))
    q = queue.Queue()
    q.put(pb.SessionRequest(open=pb.OpenSession(namespace=namespace())))
    call = kv_a.Session(iter(q.get, None))
    sid = next(call).session.session_id
    assert kv_a.Acquire(pb.AcquireRequest(session_id=sid, tokens=[1, 2, 3, 4]),
                        timeout=10).total_blocks == 1
    kv_b = pb_grpc.KvCacheStub(tls_channel(pki, port))  # another connection
    assert code_of(lambda: kv_b.Acquire(pb.AcquireRequest(
        session_id=sid, tokens=[1, 2, 3, 4]), timeout=10))[0] == \
        grpc.StatusCode.PERMISSION_DENIED
    admin = pb_grpc.AdminStub(tls_channel(pki, port))
    assert code_of(lambda: admin.Clear(pb.ClearRequest(), timeout=10))[0] == \
        grpc.StatusCode.PERMISSION_DENIED
    q.put(None)
    call.cancel()


def test_plaintext_tcp_needs_insecure_tcp_and_is_never_admin(daemons, tmp_path):
    r = subprocess.run([radixkvd(), f"--socket={tmp_path}/s.sock", "--metrics_listen=",
                        "--listen_tcp=127.0.0.1:0"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2, r.stderr
    assert "--insecure_tcp" in r.stderr and "--tls_cert" in r.stderr, r.stderr
    d = daemons("--listen_tcp=127.0.0.1:0", "--insecure_tcp")
    assert "--insecure_tcp: 127.0.0.1:0 serves plaintext gRPC without " \
           "authentication" in d.log()
    admin = pb_grpc.AdminStub(grpc.insecure_channel(f"127.0.0.1:{tcp_port(d)}"))
    assert admin.GetStats(pb.GetStatsRequest(), timeout=10).stats.version
    assert code_of(lambda: admin.Clear(pb.ClearRequest(), timeout=10))[0] == \
        grpc.StatusCode.PERMISSION_DENIED


# --- Limits -----------------------------------------------------------------

def test_sessions_per_peer_are_limited(daemons):
    d = daemons("--max_sessions_per_peer=2")
    a, b = Session(d.sock), Session(d.sock)
    with pytest.raises(grpc.RpcError) as e:
        Session(d.sock)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max_sessions_per_peer=2" in e.value.details()
    a.close()
    wait_stats(d, lambda s: s.sessions == 1)
    Session(d.sock).close()
    b.close()


def test_pinned_pages_per_session_are_limited(daemons):
    d = daemons("--max_pinned_pages_per_session=4")
    s = Session(d.sock)
    r = s.acquire(list(range(64)))  # 16 blocks wanted
    assert (r.new_blocks, d.stats().writing_pages) == (4, 4), r
    code, details = code_of(lambda: s.acquire(list(range(1000, 1008))))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max_pinned_pages_per_session=4" in details, details
    s.close()


def test_watch_streams_are_limited(daemons):
    d = daemons("--max_watch_streams=1")
    first = d.admin.WatchEvents(pb.WatchEventsRequest())
    time.sleep(0.3)
    second = d.admin.WatchEvents(pb.WatchEventsRequest())
    with pytest.raises(grpc.RpcError) as e:
        next(second)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max_watch_streams=1" in e.value.details()
    first.cancel()
    time.sleep(0.3)
    # A slot is free again: the stream is accepted and waits for events
    # until its deadline.
    third = d.admin.WatchEvents(pb.WatchEventsRequest(), timeout=1)
    with pytest.raises(grpc.RpcError) as e:
        next(third)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_pending_attach_connections_are_limited_per_uid(daemons):
    d = daemons("--attach_max_pending_per_uid=3")
    Session(d.sock)  # creates the pool, so the attach socket answers
    held = []
    for _ in range(3):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.connect(d.attach_sock)
        held.append(c)
    time.sleep(0.2)
    extra = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    extra.connect(d.attach_sock)
    extra.settimeout(5)
    assert extra.recv(64) == b""  # closed without an answer: refused
    assert "--attach_max_pending_per_uid=3" in d.log()
    for c in held + [extra]:
        c.close()


def test_unread_heartbeat_acks_end_the_stream(daemons):
    d = daemons()
    channel = grpc.insecure_channel("unix:" + d.sock, options=[
        ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)])
    kv = pb_grpc.KvCacheStub(channel)

    def requests():
        yield pb.SessionRequest(open=pb.OpenSession(namespace=namespace()))
        for n in range(400000):
            yield pb.SessionRequest(heartbeat=pb.Heartbeat(nonce=n))

    call = kv.Session(requests())
    time.sleep(3)  # the daemon queues acks this client never reads
    with pytest.raises(grpc.RpcError) as e:
        for _ in call:
            pass
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
    assert "heartbeat acks are unread" in e.value.details()
    channel.close()
