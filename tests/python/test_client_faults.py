"""radixkv.Client when radixkvd dies: the reconnect bound after a short
outage, a daemon killed (SIGKILL) at each step of a request (open, acquire,
attach, page write, commit), leases that refuse page access once expired,
and the acknowledgement of lost sessions (OpenSession.acknowledge_sessions,
seen by an in-process stand-in for the KvCache service)."""
import concurrent.futures
import os
import socket
import threading
import time

import grpc
import numpy as np
import pytest

import radixkv
from radixkv import errors, pb, pb_grpc

from rkv_testutil import SMALL


def prompt(seed, blocks, page_size=SMALL.page_size):
    n = blocks * page_size
    return (np.arange(n, dtype=np.uint32) + seed * 100000 + 1).tolist()


def client(d, **kw):
    kw.setdefault("namespace", SMALL)
    kw.setdefault("initial_wait", 10.0)
    kw.setdefault("connect_timeout", 10.0)
    kw.setdefault("call_timeout", 10.0)
    kw.setdefault("heartbeat_interval", 0.5)
    kw.setdefault("reconnect_initial_backoff", 0.05)
    kw.setdefault("reconnect_max_backoff", 0.5)
    return radixkv.Client(d.sock, **kw)


def kill9(d):
    """SIGKILL, even while stopped: no request in flight is answered."""
    if d._channel is not None:  # pylint: disable=protected-access
        d._channel.close()  # pylint: disable=protected-access
        d._channel = None  # pylint: disable=protected-access
    d.proc.kill()
    d.proc.wait()


def wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def new_session(c, generation, timeout=60.0):
    return wait_until(lambda: c.connected and c.state().generation > generation,
                      timeout)


def expect_hits_resume(c, tokens, blocks):
    """After a restart: a miss that commits, then a hit of all blocks."""
    with c.acquire(tokens) as miss:
        assert not miss.degraded
        assert (miss.matched_blocks, miss.new_blocks) == (0, blocks)
        miss.commit()
    with c.acquire(tokens) as hit:
        assert not hit.degraded and hit.matched_blocks == blocks


def test_reconnects_within_max_backoff_after_short_outage(daemon):
    # Default backoff (0.1 s doubling to 5 s, jitter 0.2). A session attempt
    # waits up to connect_timeout for the connection, so a daemon back
    # within it is reached within the channel's retry interval (1 s, jitter
    # 0.2): the typical (median) reconnect; in any case within
    # reconnect_max_backoff * (1 + jitter) plus that interval. Margins for
    # a loaded machine: 1.3 s on the median, 2 s on the worst.
    with radixkv.Client(daemon.sock, namespace=SMALL, initial_wait=10.0) as c:
        assert c.connected
        took = []
        for outage in (1.0, 1.25, 1.5, 1.75, 2.0, 2.0):
            generation = c.state().generation
            kill9(daemon)
            time.sleep(outage)
            daemon.start()
            back = time.monotonic()
            assert new_session(c, generation), c.state()
            took.append(time.monotonic() - back)
            print(f"outage {outage} s: session again {took[-1]:.3f} s after the restart")
            assert not c.acquire(prompt(1, 2)).degraded
        took.sort()
        median = (took[2] + took[3]) / 2
        assert median <= 1.2 + 1.3, took
        assert took[-1] <= 5.0 * 1.2 + 1.2 + 2.0, took


def test_killed_during_open(daemon):
    daemon.pause()  # the open reaches the socket but is never answered
    c = client(daemon, initial_wait=0.3)
    try:
        assert not c.connected
        kill9(daemon)
        tokens = prompt(2, 4)
        lease = c.acquire(tokens)
        assert lease.degraded and lease.matched_blocks == 0
        daemon.start()
        assert c.wait_for_session(60), c.state()
        expect_hits_resume(c, tokens, 4)
    finally:
        c.close()


def test_killed_during_acquire(daemon):
    with client(daemon) as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        tokens = prompt(3, 4)
        generation = c.state().generation
        daemon.pause()
        future = pool.submit(c.acquire, tokens)
        time.sleep(0.3)
        assert not future.done()
        killed = time.monotonic()
        kill9(daemon)
        lease = future.result(timeout=30)
        assert time.monotonic() - killed < 5  # not the 10 s deadline
        assert lease.degraded and lease.pages == []
        daemon.start()
        assert new_session(c, generation), c.state()
        expect_hits_resume(c, tokens, 4)


def test_killed_during_attach(daemon):
    # A stand-in on the attach socket accepts and never answers.
    os.unlink(daemon.attach_sock)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(daemon.attach_sock)
    listener.listen(4)
    listener.settimeout(30)
    c = client(daemon, attach_pool=True, initial_wait=0, connect_timeout=3.0)
    try:
        conn, _ = listener.accept()  # the client is attaching
        kill9(daemon)
        tokens = prompt(4, 2)
        t0 = time.monotonic()
        lease = c.acquire(tokens)
        assert lease.degraded and time.monotonic() - t0 < 1
        conn.close()
        listener.close()
        os.unlink(daemon.attach_sock)
        daemon.start()
        assert c.wait_for_session(60), c.state()
        assert c.pool is not None
        expect_hits_resume(c, tokens, 2)
    finally:
        c.close()


def test_killed_during_page_write_stops_the_writer(daemon):
    with client(daemon, attach_pool=True) as c:
        lost, generation = c.state().session_id, c.state().generation
        tokens = prompt(5, 2)
        lease = c.acquire(tokens)
        assert lease.live and lease.new_blocks == 2
        view = lease.page_array(0)
        view[...] = 1
        kill9(daemon)
        view[...] = 2  # still mapped: no fault
        assert wait_until(lambda: not c.connected)
        assert not lease.live and lease.time_left == 0.0
        assert not lease.confirm_read()
        with pytest.raises(radixkv.LeaseLost):
            lease.page_array(1)
        with pytest.raises(radixkv.LeaseLost):
            lease.commit()
        lease.release()
        assert c.state().unacknowledged_sessions == (lost,)
        daemon.start()
        assert new_session(c, generation), c.state()
        assert c.state().unacknowledged_sessions == ()
        expect_hits_resume(c, tokens, 2)


def test_lost_session_is_acknowledged_only_after_its_writes_end(daemon):
    """A session lost while a view of a new page is being written: the
    client may acknowledge it (and the daemon reuse the fenced pages) only
    once the lease's commit or release has ended that write; then a
    heartbeat of the new session carries the acknowledgement."""
    with client(daemon, attach_pool=True, heartbeat_interval=0.1) as c:
        lost, generation = c.state().session_id, c.state().generation
        lease = c.acquire(prompt(9, 2))
        assert lease.new_blocks == 2
        view = lease.page_array(0)  # a write runs from here on
        daemon.pause()  # heartbeats go unanswered: the client ends the session
        time.sleep(0.8)
        daemon.resume()
        assert new_session(c, generation), c.state()
        time.sleep(0.5)  # several heartbeats
        assert c.state().unacknowledged_sessions == (lost,)
        assert daemon.stats().quarantined_pages == 2
        view[...] = 3  # the write ends...
        with pytest.raises(radixkv.LeaseLost):
            lease.commit()  # ...and the lease with it
        assert wait_until(lambda: c.state().unacknowledged_sessions == () and
                          daemon.stats().quarantined_pages == 0), c.state()


def test_killed_during_commit(daemon):
    with client(daemon) as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        tokens = prompt(6, 4)
        generation = c.state().generation
        lease = c.acquire(tokens)
        assert lease.new_blocks == 4
        daemon.pause()
        future = pool.submit(lease.commit)
        time.sleep(0.3)
        assert not future.done()
        kill9(daemon)
        with pytest.raises(radixkv.Unavailable):
            future.result(timeout=30)
        assert wait_until(lambda: not c.connected)
        assert not lease.live
        lease.release()
        daemon.start()
        assert new_session(c, generation), c.state()
        expect_hits_resume(c, tokens, 4)


# -- expiry (--lease_ttl=1s: a 100 ms safety margin) -------------------------

def test_expired_lease_refuses_page_access(daemon_factory):
    d = daemon_factory("--lease_ttl=1s")
    with client(d, attach_pool=True) as c:
        tokens = prompt(7, 2)
        lease = c.acquire(tokens)
        assert lease.live and 0 < lease.time_left <= 0.9
        lease.page_array(0)[...] = 3
        time.sleep(1.3)  # past the daemon's expiry too
        assert lease.held and not lease.live and lease.time_left == 0.0
        assert not lease.confirm_read()
        with pytest.raises(radixkv.LeaseLost):
            lease.page_array(0)
        # The commit still goes out (the pages stay unwritten); the daemon
        # no longer has the lease.
        with pytest.raises(radixkv.LeaseLost):
            lease.commit()
        assert not lease.held
        assert c.connected
        expect_hits_resume(c, tokens, 2)


def test_reader_discards_a_read_that_outlived_the_lease(daemon_factory):
    d = daemon_factory("--lease_ttl=1s")
    with client(d, attach_pool=True) as c:
        tokens = prompt(8, 2)
        with c.acquire(tokens) as writer:
            writer.page_array(0)[...] = 4
            writer.page_array(1)[...] = 5
            writer.commit()
        reader = c.acquire(tokens)
        assert reader.matched_blocks == 2
        first = np.array(reader.page_array(0))
        assert first.flat[0] == 4 and reader.confirm_read()
        kept = reader.page_array(1)
        time.sleep(1.0)  # a read that takes too long
        np.array(kept)
        assert not reader.confirm_read()


def test_acquire_answered_too_late_is_a_miss(daemon_factory):
    d = daemon_factory("--lease_ttl=1s")
    with client(d, heartbeat_interval=5.0) as c, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        tokens = prompt(9, 2)
        d.pause()
        future = pool.submit(c.acquire, tokens)
        time.sleep(1.2)
        d.resume()
        lease = future.result(timeout=30)
        assert lease.degraded and not lease.held and lease.pages == []
        assert c.connected
        expect_hits_resume(c, tokens, 2)


# -- acknowledgements, seen by a stand-in KvCache service --------------------

def _detail_trailer(code, field, reason, message):
    detail = pb.ErrorDetail(field=field, reason=reason)
    status = pb.RpcStatus(code=code.value[0], message=message)
    status.details.add().Pack(detail)
    return (("grpc-status-details-bin", status.SerializeToString()),)


class FakeKvCache(pb_grpc.KvCacheServicer):
    """Session n (1-based) is "s<n>"; it stays open until end_session(n)
    or the client cancels it. Heartbeats are not read."""

    def __init__(self):
        self.cond = threading.Condition()
        self.opens = []
        self.ended = 0
        self.session_not_found = False
        self.commits = 0
        self.releases = 0
        self.leases = 0

    def Session(self, request_iterator, context):
        first = next(request_iterator)
        with self.cond:
            self.opens.append(first.open)
            n = len(self.opens)
            self.cond.notify_all()
        yield pb.SessionResponse(session=pb.SessionInfo(
            session_id=f"s{n}", pool=pb.PoolInfo(backend="none"), lease_ttl_ms=60000))
        with self.cond:
            while self.ended < n and context.is_active():
                self.cond.wait(0.01)
        context.set_code(grpc.StatusCode.UNAVAILABLE)
        context.set_details("session ended")

    def Acquire(self, request, context):
        with self.cond:
            if self.session_not_found:
                context.set_trailing_metadata(_detail_trailer(
                    grpc.StatusCode.NOT_FOUND, "session_id",
                    pb.ERROR_REASON_SESSION_NOT_FOUND, "unknown session"))
                context.abort(grpc.StatusCode.NOT_FOUND, "session_id: unknown session")
            self.leases += 1
            return pb.AcquireResponse(
                lease_id=self.leases, total_blocks=1, new_blocks=1,
                pages=[self.leases],
                lease_expires_unix_ms=int((time.time() + 60) * 1000))

    def Commit(self, request, context):
        with self.cond:
            self.commits += 1
        context.set_trailing_metadata(_detail_trailer(
            grpc.StatusCode.NOT_FOUND, "lease_id", pb.ERROR_REASON_LEASE_NOT_FOUND,
            "no live lease"))
        context.abort(grpc.StatusCode.NOT_FOUND, "lease_id: no live lease")

    def Release(self, request, context):
        with self.cond:
            self.releases += 1
        return pb.ReleaseResponse()

    def end_session(self, n):
        with self.cond:
            self.ended = max(self.ended, n)
            self.cond.notify_all()

    def wait_for_opens(self, n, timeout=30.0):
        with self.cond:
            self.cond.wait_for(lambda: len(self.opens) >= n, timeout)
            return list(self.opens)


@pytest.fixture
def fake():
    service = FakeKvCache()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(16))
    pb_grpc.add_KvCacheServicer_to_server(service, server)
    sock = f"/tmp/rkpyack{os.getpid()}_{id(service)}.sock"
    server.add_insecure_port("unix:" + sock)
    server.start()
    service.sock = sock
    yield service
    service.end_session(1 << 30)
    server.stop(grace=1).wait()
    if os.path.exists(sock):
        os.unlink(sock)


def fake_client(service):
    return radixkv.Client(service.sock, namespace=SMALL, initial_wait=10.0,
                          heartbeat_interval=60.0, reconnect_initial_backoff=0.01,
                          reconnect_max_backoff=0.1)


def test_lost_session_is_acknowledged_by_the_next_open(fake):
    with fake_client(fake) as c:
        lease = c.acquire(prompt(10, 1))
        assert lease.held and lease.live and lease.confirm_read()
        fake.end_session(1)  # the stream breaks without commit or release
        opens = fake.wait_for_opens(2)
        assert list(opens[0].acknowledge_sessions) == []
        assert list(opens[1].acknowledge_sessions) == ["s1"]
        # The lease of the lost session was stopped before that open.
        assert not lease.live and not lease.confirm_read()
        with pytest.raises(radixkv.LeaseLost):
            lease.commit()
        assert fake.commits == 0  # refused without a call
        assert c.wait_for_session(30)
        assert c.state().unacknowledged_sessions == ()
        fake.end_session(2)
        opens = fake.wait_for_opens(3)
        assert list(opens[2].acknowledge_sessions) == ["s2"]  # s1 was taken


def test_session_not_found_is_acknowledged_by_the_next_open(fake):
    with fake_client(fake) as c:
        fake.session_not_found = True
        assert c.acquire(prompt(11, 1)).degraded
        opens = fake.wait_for_opens(2)
        assert list(opens[1].acknowledge_sessions) == ["s1"]


def test_commit_answered_lease_not_found_ends_the_lease(fake):
    with fake_client(fake) as c:
        lease = c.acquire(prompt(12, 1))
        assert lease.live
        with pytest.raises(radixkv.LeaseLost) as e:
            lease.commit(release=False)
        assert e.value.reason == errors.REASON_LEASE_NOT_FOUND
        assert not lease.held and not lease.live
        with pytest.raises(radixkv.LeaseLost):
            lease.commit()
        lease.release()
        assert (fake.commits, fake.releases) == (1, 0)  # the commit was the ack
        assert c.connected and c.state().generation == 1


def test_closing_releases_held_leases_first(fake):
    # A session that ends with leases open has their pages fenced: close()
    # releases every lease first, including one that outlives the client.
    c = fake_client(fake)
    lease = c.acquire(prompt(13, 1))
    assert lease.live
    c.close()
    assert fake.releases == 1
    assert not lease.live and not lease.confirm_read()
