"""Retention priorities end to end: a real radixkvd, AcquireRequest and
CommitRequest.priorities over gRPC (docs/API.md).

A 16-page pool holds two 8-block prompts. The older one, kept at priority
90, outlives a newer default one when a third prompt needs room (under
plain LRU the older would go); a prompt given priority 0 goes before an
older default one. Out-of-range priorities, durations and ranges are
refused naming the field and the limit, and change nothing.
"""
import os
import sys

import grpc
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from rkv_testutil import SMALL, Daemon, executable  # noqa: E402
import radixkv  # noqa: E402
from radixkv import pb, pb_grpc  # noqa: E402

PAGES = 16
BLOCKS = 8  # per prompt: half the pool


def prompt(i):
    return [1000 * (i + 1) + j for j in range(BLOCKS * SMALL.page_size)]


@pytest.fixture
def daemon():
    pool = f"host,bytes={PAGES * SMALL.page_bytes},page_bytes={SMALL.page_bytes}"
    d = Daemon(executable("RADIXKVD"), [], pool).start()
    try:
        yield d
    finally:
        d.stop()


class Raw:
    """A session of radixkv.Client, driven through the raw stubs."""

    def __init__(self, d):
        self.client = radixkv.Client(endpoint=d.sock, namespace=SMALL,
                                     release_delay=0)
        with self.client.acquire([1, 2, 3, 4], allocate=False) as lease:
            self.sid = lease.session_id  # the session the client opened
        self.kv = pb_grpc.KvCacheStub(grpc.insecure_channel("unix:" + d.sock))

    def store(self, tokens, acquire_priorities=(), commit_priorities=()):
        a = self.kv.Acquire(pb.AcquireRequest(
            session_id=self.sid, tokens=tokens, allocate=True,
            priorities=list(acquire_priorities)), timeout=10)
        self.kv.Commit(pb.CommitRequest(
            session_id=self.sid, lease_id=a.lease_id, blocks=a.new_blocks,
            release=True, priorities=list(commit_priorities)), timeout=10)
        return a

    def matched(self, tokens):
        a = self.kv.Acquire(pb.AcquireRequest(session_id=self.sid, tokens=tokens,
                                              allocate=False), timeout=10)
        if a.lease_id:
            self.kv.Release(pb.ReleaseRequest(session_id=self.sid,
                                              lease_id=a.lease_id), timeout=10)
        return a.matched_blocks

    def close(self):
        self.client.close()


def whole(priority, duration_ms=0):
    return pb.BlockPriority(first_block=0, blocks=BLOCKS, priority=priority,
                            duration_ms=duration_ms)


def test_a_high_priority_prompt_outlives_a_newer_default_one(daemon):
    r = Raw(daemon)
    try:
        r.store(prompt(0), acquire_priorities=[whole(90)])  # oldest, kept
        r.store(prompt(1))                                  # newer, default
        r.store(prompt(2))                                  # needs 8 pages
        assert r.matched(prompt(0)) == BLOCKS
        assert r.matched(prompt(1)) == 0
        assert r.matched(prompt(2)) == BLOCKS
    finally:
        r.close()


def test_a_low_priority_prompt_goes_before_an_older_default_one(daemon):
    r = Raw(daemon)
    try:
        r.store(prompt(0))                                      # oldest
        r.store(prompt(1), commit_priorities=[whole(0)])        # newer, low
        r.store(prompt(2))
        assert r.matched(prompt(0)) == BLOCKS
        assert r.matched(prompt(1)) == 0
    finally:
        r.close()


@pytest.mark.parametrize("rng,field,limit", [
    (pb.BlockPriority(first_block=0, blocks=1, priority=101),
     "priorities[0].priority", "limit of 100"),
    (pb.BlockPriority(first_block=0, blocks=1, priority=50,
                      duration_ms=(1 << 64) - 1),
     "priorities[0].duration_ms", "(30 days)"),
    (pb.BlockPriority(first_block=0, blocks=0, priority=50),
     "priorities[0].blocks", "at least 1"),
    (pb.BlockPriority(first_block=BLOCKS, blocks=1, priority=50),
     "priorities[0]", ""),
])
def test_bad_ranges_name_the_field_and_change_nothing(daemon, rng, field, limit):
    r = Raw(daemon)
    try:
        before = daemon.stats()
        with pytest.raises(grpc.RpcError) as e:
            r.kv.Acquire(pb.AcquireRequest(session_id=r.sid, tokens=prompt(3),
                                           allocate=True, priorities=[rng]),
                         timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in e.value.details() and limit in e.value.details(), \
            e.value.details()
        after = daemon.stats()
        assert after.leases == before.leases
        assert after.cached_pages == before.cached_pages
        assert after.writing_pages == before.writing_pages
    finally:
        r.close()


def test_too_many_ranges_are_refused(daemon):
    r = Raw(daemon)
    try:
        with pytest.raises(grpc.RpcError) as e:
            r.kv.Acquire(pb.AcquireRequest(
                session_id=r.sid, tokens=prompt(3), allocate=True,
                priorities=[pb.BlockPriority(first_block=0, blocks=1,
                                             priority=50)] * 65), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "priorities" in e.value.details() and "at most 64" in \
            e.value.details(), e.value.details()
    finally:
        r.close()


def test_the_python_client_carries_priorities(daemon):
    """radixkv.Client.acquire / Lease.commit take (first_block, blocks,
    priority[, seconds]) ranges."""
    c = radixkv.Client(endpoint=daemon.sock, namespace=SMALL, release_delay=0)
    try:
        with c.acquire(prompt(0), priorities=[(0, BLOCKS, 90)]) as lease:
            lease.commit()
        with c.acquire(prompt(1)) as lease:
            lease.commit(priorities=[(0, BLOCKS, 40, 3600)])
        with c.acquire(prompt(2)) as lease:
            lease.commit()
        # prompt 0 (90) outlives prompt 1 (40) and no default block was
        # lower than 40: prompt 1 went.
        with c.acquire(prompt(0), allocate=False) as lease:
            assert lease.matched_blocks == BLOCKS
        with c.acquire(prompt(1), allocate=False) as lease:
            assert lease.matched_blocks == 0
        with pytest.raises(radixkv.InvalidArgument) as e:
            c.acquire(prompt(3), priorities=[(0, 1, 101)])
        assert "priorities[0].priority" in str(e.value)
    finally:
        c.close()
