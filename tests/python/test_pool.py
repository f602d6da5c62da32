"""radixkv.pool against real radixkvd child processes: the attach protocol,
zero-copy page views, bytes shared with a second process, and the errors
of a refused or missing pool and of a cuda pool without the NVIDIA driver
(the cuda backend itself: test_pool_cuda.py)."""
import ctypes
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

import radixkv
from radixkv import _cuda as radixkv_cuda
from radixkv import pb

from rkv_testutil import SMALL, assert_no_leaks

# A second process: its own Client and session, the same prompt; it reads
# the pages the first process wrote and, with `write`, writes its new ones.
PEER = r"""
import json, sys
import numpy as np
import radixkv
sock, tokens, write = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
spec = radixkv.NamespaceSpec(**json.loads(sys.argv[4]))
with radixkv.Client(sock, namespace=spec, attach_pool=True, initial_wait=10) as c:
    with c.acquire(tokens) as lease:
        out = {"matched": lease.matched_blocks, "pages": lease.pages,
               "values": [lease.page_array(i).astype(np.float64).ravel()[::7].tolist()
                          for i in range(lease.matched_blocks)]}
        if write:
            for j in range(lease.new_blocks):
                lease.page_array(lease.matched_blocks + j)[:] = 1000 + j
            lease.commit()
print(json.dumps(out))
"""


def run_peer(d, tokens, write=False, spec=SMALL):
    p = subprocess.run(
        [sys.executable, "-c", PEER, d.sock, json.dumps(tokens), "1" if write else "0",
         json.dumps(spec.to_dict())],
        capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def fill(arr, seed):
    arr[:] = (np.arange(arr.size, dtype=np.float64).reshape(arr.shape) * 0.5 + seed) % 2000


def test_pages_are_shared_with_a_second_process(daemon):
    tokens = list(range(1, 4 * 6 + 1))
    with radixkv.Client(daemon.sock, namespace=SMALL, attach_pool=True,
                        initial_wait=10) as c:
        pool = c.pool
        assert pool is not None and pool.backend == "host"
        assert pool.page_bytes == SMALL.page_bytes == 512
        with c.acquire(tokens, max_new_blocks=4) as lease:
            assert lease.new_blocks == 4
            for j in range(4):
                a = lease.page_array(j)
                assert a.shape == SMALL.page_shape and a.dtype == np.float16
                assert a.flags.writeable and a.base is not None  # a view, no copy
                fill(a, seed=j)
            assert bytes(lease.page(0)) == lease.page_array(0).tobytes()
            lease.commit()
        want = [lease_values.astype(np.float64).ravel()[::7].tolist()
                for lease_values in (pool.page_array(p, SMALL) for p in lease.pages)]
        # The peer sees our 4 blocks and writes the 2 after them.
        peer = run_peer(daemon, tokens, write=True)
        assert peer["matched"] == 4 and peer["pages"][:4] == lease.pages
        assert peer["values"] == want
        with c.acquire(tokens) as hit:
            assert hit.matched_blocks == 6
            for j in (4, 5):
                assert (hit.page_array(j) == 1000 + (j - 4)).all()
    assert_no_leaks(daemon, sessions=0)


def test_many_chunks(daemon_factory):
    d = daemon_factory(pool="host,bytes=1MiB,chunk_bytes=64KiB")
    with radixkv.Client(d.sock, namespace=SMALL, attach_pool=True, initial_wait=10) as c:
        pool = c.pool
        assert pool.pages_per_chunk == 128 and pool.capacity_pages == 2048
        assert len(pool.chunk_bytes) == 16
        # Fill the pool past the first chunks: pages come from several chunks.
        tokens = list(range(1, 4 * 300 + 1))
        with c.acquire(tokens) as lease:
            assert lease.new_blocks == 300
            for j in range(300):
                lease.page_array(j)[:] = j % 1000
            lease.commit()
        chunks = {p // pool.pages_per_chunk for p in lease.pages}
        assert len(chunks) >= 3, chunks
        peer = run_peer(d, tokens)
        assert peer["matched"] == 300
        assert [v[0] for v in peer["values"]] == [float(j % 1000) for j in range(300)]
        with pytest.raises(IndexError):
            pool.page(pool.capacity_pages)
    assert_no_leaks(d, sessions=0)


def test_gather_and_batched_views(daemon_factory):
    # 64 KiB chunks of 128 pages: a 300-block prompt spans 3+ chunks.
    d = daemon_factory(pool="host,bytes=1MiB,chunk_bytes=64KiB")
    with radixkv.Client(d.sock, namespace=SMALL, attach_pool=True, initial_wait=10) as c:
        pool = c.pool
        with c.acquire(list(range(1, 4 * 300 + 1))) as lease:
            for j in range(300):
                fill(lease.page_array(j), seed=j)
            lease.commit(release=False)
            rng = np.random.default_rng(7)
            for pages in (lease.pages, lease.pages[::-1], list(rng.permutation(lease.pages)),
                          lease.pages[5:6], []):
                want = np.stack([pool.page_array(p, SMALL) for p in pages]) if pages else \
                    np.empty((0,) + SMALL.page_shape, np.float16)
                got = pool.gather(pages, SMALL)
                assert got.shape == want.shape and got.dtype == np.float16
                assert got.flags.c_contiguous and got.base is None  # a copy
                assert (got == want).all()
                views = pool.page_arrays(pages, SMALL)
                assert len(views) == len(pages)
                for v, p in zip(views, pages):
                    assert v.shape == SMALL.page_shape and v.flags.writeable
                    assert v.__array_interface__["data"][0] == \
                        pool.page_array(p, SMALL).__array_interface__["data"][0]  # no copy
            out = np.zeros((300,) + SMALL.page_shape, np.float16)
            assert pool.gather(lease.pages, SMALL, out=out) is out
            assert (out == np.stack(pool.page_arrays(lease.pages, SMALL))).all()
            with pytest.raises(ValueError):
                pool.gather(lease.pages, SMALL, out=out[:10])
            with pytest.raises(IndexError):
                pool.gather([0, pool.capacity_pages], SMALL)
            torch = pytest.importorskip("torch")
            t = pool.gather_tensor(lease.pages, SMALL)
            assert t.dtype == torch.float16 and tuple(t.shape) == (300,) + SMALL.page_shape
            assert (t.numpy() == out).all()
            bf16 = dataclasses.replace(SMALL, dtype="bf16")
            tb = pool.gather_tensor(lease.pages[:3], bf16)
            assert tb.dtype == torch.bfloat16
            assert (tb.view(torch.int16).numpy().view(np.uint16) ==
                    pool.gather(lease.pages[:3], bf16)).all()
            with pytest.raises(ValueError):
                pool.gather_tensor(lease.pages, SMALL, out=torch.empty(3))
    assert_no_leaks(d, sessions=0)


def test_dtype_views_and_torch(daemon_factory):
    spec = dataclasses.replace(SMALL, model="bf16", dtype="bf16")
    d = daemon_factory()
    with radixkv.Client(d.sock, namespace=spec, attach_pool=True, initial_wait=10) as c:
        with c.acquire(list(range(8))) as lease:
            a = lease.page_array(0)
            assert a.dtype == np.uint16 and a.shape == spec.page_shape  # bf16 bits
            a[:] = 0x3F80  # 1.0 in bfloat16
            with pytest.raises(ValueError):
                c.pool.page_array(lease.pages[0], dataclasses.replace(spec, head_dim=16))
            torch = pytest.importorskip("torch")
            t = lease.page_tensor(0)
            assert t.dtype == torch.bfloat16 and tuple(t.shape) == spec.page_shape
            assert float(t[1, 1, 1, 3, 7]) == 1.0
            t[0, 0, 0, 0, 0] = 2.0  # the same memory
            assert a[0, 0, 0, 0, 0] == 0x4000
            lease.commit()
    assert_no_leaks(d, sessions=0)


def test_none_pool_has_no_pages(daemon_factory):
    d = daemon_factory(pool="none,pages=1000")
    with radixkv.Client(d.sock, namespace=SMALL, attach_pool=True, initial_wait=10) as c:
        assert c.connected and c.pool is None
        assert c.state().pool.attach_socket == ""
        with c.acquire(list(range(8))) as lease:
            assert lease.new_blocks == 2
            with pytest.raises(radixkv.FailedPrecondition):
                lease.page_array(0)
            lease.commit()
    assert_no_leaks(d, sessions=0)


def test_attach_errors(daemon):
    with pytest.raises(radixkv.AttachError) as e:
        radixkv.attach(daemon.attach_sock, "0" * 32, timeout=5)
    assert e.value.code.name == "PERMISSION_DENIED" and "refused" in e.value.message
    with pytest.raises(radixkv.AttachError) as e:
        radixkv.attach("/tmp/rkpy-no-such.attach.sock", "x", timeout=1)
    assert e.value.code.name == "UNAVAILABLE"
    with pytest.raises(radixkv.AttachError) as e:
        radixkv.attach(daemon.attach_sock, "", timeout=1)
    assert e.value.code.name == "INVALID_ARGUMENT"
    with pytest.raises(radixkv.AttachError) as e:
        radixkv.attach(daemon.sock, "x", timeout=1)  # the gRPC socket: a stream socket
    assert e.value.code.name in ("FAILED_PRECONDITION", "UNAVAILABLE")
    # A session of a Client attaches by hand too, and the mapping outlives it.
    with radixkv.Client(daemon.sock, namespace=SMALL, initial_wait=10) as c:
        with radixkv.attach(c.state().pool.attach_socket, c.state().session_id) as pool:
            with c.acquire([1, 2, 3, 4]) as lease:
                pool.page_array(lease.pages[0], SMALL)[:] = 3
                lease.commit()
            view = pool.page_array(lease.pages[0], SMALL)
        assert (view == 3).all()  # close() leaves a chunk with live views mapped
    daemon.stop()
    assert (view == 3).all()  # and the daemon's exit does not unmap it


class FakeAttachServer:
    """An attach socket that answers every connection with `reply` (bytes)
    and `fds`, or closes without a word when reply is None."""

    def __init__(self, path, reply, fds=()):
        self.path, self.reply, self.fds = path, reply, list(fds)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(path)
        self.sock.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(512)
            if self.reply is not None:
                socket.send_fds(conn, [self.reply], self.fds)

    def close(self):
        self.thread.join(5)
        self.sock.close()
        os.unlink(self.path)


def memfds_named(name):
    """How many of this process's descriptors are memfds named `name`."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name} ")
        except OSError:
            pass  # closed meanwhile (listdir's own descriptor, say)
    return n


def test_cuda_pool_is_a_clear_error(tmp_path, monkeypatch):
    # Without the NVIDIA driver's libcuda.so.1 (as on a machine with no GPU;
    # where it is installed, a path that does not exist stands in for it).
    try:
        ctypes.CDLL(radixkv_cuda.LIBCUDA)
        monkeypatch.setattr(radixkv_cuda, "LIBCUDA", str(tmp_path / "absent" / "libcuda.so.1"))
    except OSError:
        pass
    reply = pb.AttachResponse(backend="cuda", page_bytes=512, pages_per_chunk=8,
                              capacity_pages=8, device=0,
                              chunks=[pb.AttachChunk(bytes=4096)]).SerializeToString()
    for _ in range(3):
        fd = os.memfd_create("rkpy-fake-cuda-reply")
        os.ftruncate(fd, 4096)
        server = FakeAttachServer(str(tmp_path / "cuda.attach.sock"), reply, [fd])
        try:
            with pytest.raises(radixkv.AttachError) as e:
                radixkv.attach(server.path, "s", timeout=5)
            assert e.value.message.startswith("cuda pool: ")
            assert e.value.code.name == "FAILED_PRECONDITION"
            assert "libcuda.so.1" in e.value.message and "NVIDIA driver" in e.value.message
            assert "cannot be loaded" in e.value.message, e.value
        finally:
            server.close()
        # Only our own descriptor is left: the received one was closed.
        assert memfds_named("rkpy-fake-cuda-reply") == 1
        os.close(fd)


def test_fake_host_pool_and_bad_replies(tmp_path):
    fd = os.memfd_create("rkpy-fake-chunk")
    os.ftruncate(fd, 4096)
    os.pwrite(fd, b"\x07" * 512, 512)
    good = pb.AttachResponse(backend="host", page_bytes=512, pages_per_chunk=8,
                             capacity_pages=8, device=-1,
                             chunks=[pb.AttachChunk(bytes=4096)])
    short = pb.AttachResponse()
    short.CopyFrom(good)
    short.chunks[0].bytes = 1024
    try:
        server = FakeAttachServer(str(tmp_path / "a.sock"), good.SerializeToString(), [fd])
        with radixkv.attach(server.path, "s", timeout=5) as pool:
            assert bytes(pool.page(1)) == b"\x07" * 512
        server.close()
        for reply, fds in ((short.SerializeToString(), [fd]), (good.SerializeToString(), []),
                           (b"\xff\xff", [fd]), (None, [])):
            server = FakeAttachServer(str(tmp_path / "b.sock"), reply, fds)
            with pytest.raises(radixkv.AttachError) as e:
                radixkv.attach(server.path, "s", timeout=5)
            want = "PERMISSION_DENIED" if reply is None else "INVALID_ARGUMENT"
            assert e.value.code.name == want, e.value
            server.close()
    finally:
        os.close(fd)
