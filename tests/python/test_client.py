"""radixkv.Client against real radixkvd child processes: leases, carried
releases, degrade-to-miss, reconnect, deadlines, typed errors, threads,
and that nothing leaks."""
import dataclasses
import json
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

import radixkv
from radixkv import errors, pb

from rkv_testutil import SMALL, assert_no_leaks


def prompt(seed, blocks, tail=0, page_size=SMALL.page_size):
    """A prompt of `blocks` full blocks (+ `tail` tokens) unique to seed."""
    n = blocks * page_size + tail
    return (np.arange(n, dtype=np.uint32) + seed * 100000 + 1).tolist()


def client(d, **kw):
    kw.setdefault("namespace", SMALL)
    kw.setdefault("initial_wait", 10.0)
    return radixkv.Client(d.sock, **kw)


def test_acquire_commit_hit(daemon):
    with client(daemon, client_name="py-hit") as c:
        assert c.connected
        st = c.state()
        assert st.namespace_id == c.namespace_root, "root differs from the daemon's"
        assert st.pool.backend == "host" and st.generation == 1
        tokens = prompt(1, 5, tail=3)
        with c.acquire(tokens) as lease:
            assert not lease.degraded and lease.held
            assert (lease.total_blocks, lease.matched_blocks, lease.new_blocks) == (5, 0, 5)
            assert len(lease.pages) == 5 and lease.new_pages == lease.pages
            r = lease.commit(2, release=False)
            assert r.inserted == 2 and lease.uncommitted_blocks == 3 and lease.held
            r = lease.commit()
            assert r.inserted == 3 and r.released and not lease.held
        with c.acquire(np.asarray(tokens, dtype=np.uint32)) as hit:
            assert (hit.matched_blocks, hit.matched_tokens, hit.new_blocks) == (5, 20, 0)
            assert hit.matched_pages == lease.pages
        m = c.match(tokens)
        assert (m.total_blocks, m.matched_blocks, m.matched_tokens) == (5, 5, 20)
        assert m.namespace_id == c.namespace_root
        ex = c.explain(tokens + prompt(2, 1))
        assert ex.matched_blocks == 5 and ex.total_blocks == 6
        assert ex.blocks[5].state == pb.BLOCK_STATE_NOT_PRESENT
        assert [b.key for b in ex.blocks] == c.compute_keys(tokens + prompt(2, 1))
        assert [s.client_name for s in daemon.sessions()] == ["py-hit"]
        assert c.stats().cached_pages == 5
        # `hit` was left: within release_delay the session thread ends it.
        assert daemon.wait_stats(lambda s: s.pinned_pages == 0).pinned_pages == 0
        assert c.evict(2) == 2
        assert c.match(tokens).matched_blocks == 3
    assert_no_leaks(daemon, sessions=0)


def test_with_exit_carries_the_lease(daemon):
    # A long release_delay: only the next Acquire can end the dropped lease.
    with client(daemon, release_delay=30.0) as c:
        tokens = prompt(3, 4)
        with c.acquire(tokens) as lease:
            lease.commit(release=False)
        assert not lease.held
        assert daemon.stats().leases == 1, "the lease ended before the next acquire"
        with c.acquire(tokens) as hit:
            assert hit.matched_blocks == 4
            s = daemon.stats()
            assert s.leases == 1 and s.pinned_pages == 4  # only `hit`'s
        dropped = c.acquire(tokens)
        del dropped  # dropping a held lease carries it too
        with c.acquire(prompt(4, 1)):
            pass
        assert daemon.stats().leases == 1
    assert_no_leaks(daemon, sessions=0)


def test_release_delay_fallback_and_sync_release(daemon):
    with client(daemon, release_delay=0.05) as c:
        with c.acquire(prompt(5, 2)):
            pass
        assert daemon.wait_stats(lambda s: s.leases == 0, timeout=3).leases == 0
    with client(daemon, release_delay=0) as c:
        with c.acquire(prompt(6, 2)):
            assert daemon.stats().leases == 1
        assert daemon.stats().leases == 0  # released before the with block ended
    assert_no_leaks(daemon, sessions=0)


def test_expired_carried_lease_is_retried_without(daemon_factory):
    d = daemon_factory("--lease_ttl=1s")
    with client(d, release_delay=30.0) as c:
        with c.acquire(prompt(7, 2)) as lease:
            lease.commit(release=False)
        time.sleep(1.6)  # the carried lease expires meanwhile
        with c.acquire(prompt(7, 2)) as hit:
            assert not hit.degraded and hit.matched_blocks == 2
        assert d.stats().lease_expired >= 1
    assert_no_leaks(d, sessions=0)


def test_degraded_without_daemon():
    t0 = time.monotonic()
    c = radixkv.Client("/tmp/rkpy-nothing-here.sock", namespace=SMALL, initial_wait=0.3)
    try:
        assert not c.connected and time.monotonic() - t0 < 5
        t1 = time.monotonic()
        lease = c.acquire(prompt(8, 3, tail=1))
        assert time.monotonic() - t1 < 0.1
        assert lease.degraded and not lease.held and lease.total_blocks == 3
        assert (lease.matched_blocks, lease.pages) == (0, [])
        lease.release()  # a no-op
        with pytest.raises(radixkv.FailedPrecondition):
            lease.commit()
        with pytest.raises(radixkv.Unavailable):
            c.match(prompt(8, 1))
        with pytest.raises(radixkv.InvalidArgument):
            c.acquire([])  # the caller's own mistakes still raise
        assert isinstance(c.state().last_error, radixkv.Error)
        assert not c.wait_for_session(0.05)
    finally:
        c.close()
    c.close()  # idempotent


def test_degraded_client_names_the_endpoint_and_the_os_error_and_warns_once(caplog):
    sock = "/tmp/rkpy-nobody-listens-here.sock"
    with caplog.at_level("WARNING", logger="radixkv"):
        c = radixkv.Client(sock, namespace=SMALL, initial_wait=0.3)
        try:
            why = c.state().last_error
            assert why.code == grpc.StatusCode.UNAVAILABLE
            assert f"unix:{sock}" in why.message, why
            assert "No such file or directory" in why.message, why
            deadline = time.monotonic() + 10
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # further failed attempts log nothing more
        finally:
            c.close()
    warnings = [r for r in caplog.records if r.name == "radixkv"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert f"unix:{sock}" in warnings[0].getMessage()


def test_reconnect_after_daemon_restart(daemon):
    with client(daemon, reconnect_max_backoff=0.5) as c:
        tokens = prompt(9, 3)
        old = c.acquire(tokens)
        assert old.held
        daemon.stop()
        deadline = time.time() + 10
        while c.connected and time.time() < deadline:
            time.sleep(0.02)
        assert not c.connected
        assert c.acquire(tokens).degraded
        daemon.start()
        assert c.wait_for_session(10), c.state()
        st = c.state()
        assert st.reconnects == 1 and st.generation == 2
        with pytest.raises(radixkv.LeaseLost):
            old.commit()  # its session ended with the old daemon
        old.release()  # a no-op, never raises
        with c.acquire(tokens) as lease:
            assert lease.matched_blocks == 0 and lease.new_blocks == 3  # cache lost
            lease.commit()
        assert c.acquire(tokens).matched_blocks == 3
    assert_no_leaks(daemon, sessions=0)


def test_deadlines_against_a_stopped_daemon(daemon):
    with client(daemon, call_timeout=0.3, heartbeat_interval=0.2, connect_timeout=0.5,
                reconnect_max_backoff=0.3) as c:
        tokens = prompt(10, 2)
        with c.acquire(tokens) as lease:
            lease.commit()
        daemon.pause()
        try:
            t0 = time.monotonic()
            lease = c.acquire(tokens)
            took = time.monotonic() - t0
            assert lease.degraded and took < 1.5, took
            t0 = time.monotonic()
            with pytest.raises(radixkv.DeadlineExceeded):
                c.match(tokens)
            assert time.monotonic() - t0 < 1.5
            # Missing heartbeat acks drop the session.
            deadline = time.time() + 5
            while c.connected and time.time() < deadline:
                time.sleep(0.02)
            assert not c.connected
            assert c.acquire(tokens).degraded
        finally:
            daemon.resume()
        assert c.wait_for_session(10), c.state()
        assert c.acquire(tokens).matched_blocks == 2
    assert_no_leaks(daemon, sessions=0)


def test_session_not_found_reopens(daemon):
    with client(daemon) as c:
        generation = c.state().generation
        core = c._core  # pylint: disable=protected-access
        with core._lock:  # the daemon forgets the session: simulate it
            core._session_id = "0" * 32
        lease = c.acquire(prompt(11, 1))
        assert lease.degraded
        deadline = time.time() + 10
        while c.state().generation == generation and time.time() < deadline:
            time.sleep(0.02)
        assert c.wait_for_session(10) and c.state().generation > generation
        assert isinstance(c.state().last_error, (type(None), radixkv.Error))
        assert not c.acquire(prompt(11, 1)).degraded
    assert_no_leaks(daemon, sessions=0)


def test_typed_errors_for_bad_input(daemon_factory):
    d = daemon_factory("--max_string_bytes=16", "--max_prompt_tokens=64")
    # Namespace fields the daemon refuses: the constructor raises them.
    with pytest.raises(radixkv.InvalidArgument) as e:
        client(d, namespace=dataclasses.replace(SMALL, model="m" * 17))
    assert e.value.field.endswith("namespace.model"), e.value
    with pytest.raises(radixkv.InvalidArgument) as e:
        client(d, namespace=dataclasses.replace(SMALL, page_size=4096))
    assert e.value.field.endswith("namespace.page_size"), e.value
    with client(d) as c:
        # Another layout than the pool's: page_bytes differs.
        with pytest.raises(radixkv.FailedPrecondition) as e:
            client(d, namespace=dataclasses.replace(SMALL, model="other", head_dim=16))
        assert e.value.field.endswith("namespace"), e.value
        # Tokens.
        with pytest.raises(radixkv.InvalidArgument) as e:
            c.acquire(list(range(65)))
        assert e.value.field == "tokens_le", e.value
        with pytest.raises(radixkv.InvalidArgument) as e:
            c.acquire([1, -2])
        assert e.value.field == "tokens"
        with pytest.raises(radixkv.InvalidArgument):
            c.match([])
        # Commit of more blocks than allocated: refused before sending...
        with c.acquire(prompt(12, 2)) as lease:
            with pytest.raises(radixkv.FailedPrecondition) as e:
                lease.commit(3)
            assert (e.value.field, e.value.reason) == ("blocks", errors.REASON_INVALID)
            # ...and by the daemon, with the same detail.
            with pytest.raises(grpc.RpcError) as raw:
                c._core.kv.Commit(pb.CommitRequest(  # pylint: disable=protected-access
                    session_id=c.state().session_id, lease_id=lease.lease_id, blocks=3))
            err = radixkv.from_rpc_error(raw.value)
            assert isinstance(err, radixkv.FailedPrecondition)
            assert (err.field, err.reason) == ("blocks", errors.REASON_INVALID)
        # A lease used after its with block: LeaseLost, nothing sent.
        with pytest.raises(radixkv.LeaseLost) as e:
            lease.commit()
        assert (e.value.field, e.value.reason) == ("lease_id", errors.REASON_LEASE_NOT_FOUND)
        with pytest.raises(radixkv.LeaseLost):
            lease.page_array(0)
        lease.release()  # idempotent
        # Key mode is off: the daemon's FAILED_PRECONDITION is raised.
        with pytest.raises(radixkv.FailedPrecondition) as e:
            c.acquire_keys(c.compute_keys(prompt(12, 2)))
        assert e.value.field == "block_keys_packed"
    assert_no_leaks(d, sessions=0)


def test_key_mode(daemon_factory):
    d = daemon_factory("--allow_key_mode")
    with client(d) as c:
        tokens = prompt(13, 4)
        with c.acquire(tokens) as lease:
            lease.commit()
        keys = c.compute_keys(tokens)
        with c.acquire_keys(keys) as hit:
            assert hit.matched_blocks == 4
        assert c.match_keys(b"".join(keys)).matched_blocks == 4
    assert_no_leaks(d, sessions=0)


def test_threads_share_one_client(daemon):
    failures = []
    with client(daemon) as c:
        def work(t):
            try:
                for i in range(40):
                    tokens = prompt(100 + (t + i) % 5, 1 + i % 6, tail=i % 3)
                    with c.acquire(tokens) as lease:
                        assert not lease.degraded
                        assert lease.matched_blocks + lease.new_blocks <= lease.total_blocks
                        if lease.new_blocks:
                            lease.commit()
                    c.match(tokens)
            except Exception as e:  # pylint: disable=broad-except
                failures.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        s = daemon.wait_stats(lambda s: s.leases == 0)
        assert s.leases == 0 and s.writing_pages == 0 and s.invariants_ok
        assert s.cached_pages == 5 * 6 and s.hit_tokens > 0
    assert_no_leaks(daemon, sessions=0)


def test_lease_outlives_client(daemon):
    c = client(daemon)
    lease = c.acquire(prompt(14, 2))
    c.close()
    assert_no_leaks(daemon, sessions=0)  # closing the session ended the lease
    with pytest.raises(radixkv.LeaseLost):
        lease.commit()
    lease.release()
    assert c.acquire(prompt(14, 2)).degraded
    with pytest.raises(radixkv.Unavailable):
        c.match(prompt(14, 2))


EXIT_WITHOUT_CLOSE = r"""
import json, sys
import radixkv
spec = radixkv.NamespaceSpec(**json.loads(sys.argv[2]))
c = radixkv.Client(sys.argv[1], namespace=spec, attach_pool=True, initial_wait=10)
held = c.acquire(list(range(1, 41)))
dropped = c.acquire(list(range(100, 140)))
dropped.drop()
view = held.page_array(0)
print(c.connected)
"""


def test_exit_without_close(daemon):
    # The session thread and gRPC's threads must not hold the interpreter's
    # exit; the daemon then ends the session and its leases.
    p = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, daemon.sock,
                        json.dumps(SMALL.to_dict())],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr
    assert_no_leaks(daemon, sessions=0)
