"""The worker side of the attach protocol (docs/CONTRACTS.md §3) and
zero-copy views of pages in the namespace layout (§2).

    pool = attach(info.pool.attach_socket, info.session_id, timeout=5.0)
    kv = pool.page_array(page, spec)      # numpy, shape (L, 2, H, P, D)
    kv[layer, 0, head, slot, :] = k       # K; [layer, 1, ...] is V
    t = pool.page_tensor(page, spec)      # the same bytes as a torch tensor

A `host` pool's chunks are sealed memfds mapped MAP_SHARED read-write:
every process that maps them sees the same bytes. Views share the
mapping; nothing is copied. A `cuda` pool is GPU memory shared through
CUDA VMM handles; this package does not map it and attach() raises
AttachError("cuda pool: ...") (docs/PYTHON.md).

Ownership: a Pool owns its mappings; a view (memoryview, ndarray, tensor)
keeps its chunk mapped while it lives, so close() unmaps only chunks no
view uses and the rest go with their last view. Mappings stay valid after
the session ends and after the daemon exits.

Thread safety: attach() may run concurrently; a Pool is read-only after
attach and may be shared between threads (what the pages hold is the
lease holders' business, docs/CONTRACTS.md §2 "Who may touch a page").
"""
import errno
import mmap
import os
import socket
from typing import List, Sequence

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from radixkv.errors import AttachError
from radixkv.keys import NamespaceSpec

__all__ = ["attach", "Pool", "numpy_dtype", "torch_dtype"]

# Session ids are 1 .. 256 bytes (docs/CONTRACTS.md §3).
_MAX_SESSION_ID_BYTES = 256
# One message's descriptor limit (SCM_RIGHTS).
_MAX_CHUNKS = 253
_MAX_REPLY_BYTES = 64 * 1024

# Element type of a page view per radixkv.v1.DType. bf16 has no NumPy type:
# its bits are viewed as uint16; fp8 as uint8.
_NUMPY_DTYPES = {1: "<f4", 2: "<f2", 3: "<u2", 4: "u1", 5: "u1", 6: "i1"}
_TORCH_DTYPES = {1: "float32", 2: "float16", 3: "bfloat16",
                 4: "float8_e4m3fn", 5: "float8_e5m2", 6: "int8"}


def numpy_dtype(dtype: int) -> np.dtype:
    """The NumPy element type of a page view of radixkv.v1.DType `dtype`
    (bf16 as uint16 bits, fp8 as uint8)."""
    if dtype not in _NUMPY_DTYPES:
        raise ValueError(f"dtype {dtype}: no element type (unspecified or unknown)")
    return np.dtype(_NUMPY_DTYPES[dtype])


def torch_dtype(dtype: int):
    """The torch element type of a page view (fp8 as uint8 where this torch
    has no float8 types). ImportError without torch."""
    import torch  # pylint: disable=import-outside-toplevel
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"dtype {dtype}: no element type (unspecified or unknown)")
    return getattr(torch, _TORCH_DTYPES[dtype], torch.uint8)


def _check_layout(reply, fd_count: int) -> None:
    """What gpu::ValidatePoolLayout checks: a mappable, consistent layout."""
    if reply.page_bytes == 0 or reply.pages_per_chunk == 0 or reply.capacity_pages == 0:
        raise AttachError(
            f"attach: page_bytes ({reply.page_bytes}), pages_per_chunk "
            f"({reply.pages_per_chunk}) and capacity_pages "
            f"({reply.capacity_pages}) must all be > 0",
            code=grpc.StatusCode.INVALID_ARGUMENT)
    want = -(-reply.capacity_pages // reply.pages_per_chunk)
    if len(reply.chunks) != want or want > _MAX_CHUNKS:
        raise AttachError(
            f"attach: chunks has {len(reply.chunks)} entries; capacity_pages="
            f"{reply.capacity_pages} / pages_per_chunk={reply.pages_per_chunk} "
            f"needs {want} (at most {_MAX_CHUNKS})",
            code=grpc.StatusCode.INVALID_ARGUMENT)
    if fd_count != want:
        raise AttachError(
            f"attach: got {fd_count} fds for {want} chunks (want one per chunk)",
            code=grpc.StatusCode.INVALID_ARGUMENT)
    for c, chunk in enumerate(reply.chunks):
        pages = min(reply.pages_per_chunk,
                    reply.capacity_pages - c * reply.pages_per_chunk)
        if chunk.bytes < pages * reply.page_bytes:
            raise AttachError(
                f"attach: chunks[{c}].bytes={chunk.bytes} is smaller than its "
                f"{pages} pages of {reply.page_bytes} bytes",
                code=grpc.StatusCode.INVALID_ARGUMENT)


class Pool:
    """A mapped host pool. Page p lives in chunk p // pages_per_chunk at
    byte offset (p % pages_per_chunk) * page_bytes."""

    def __init__(self, backend: str, page_bytes: int, pages_per_chunk: int,
                 capacity_pages: int, device: int, maps: List[mmap.mmap]):
        self.backend = backend
        self.page_bytes = page_bytes
        self.pages_per_chunk = pages_per_chunk
        self.capacity_pages = capacity_pages
        self.device = device
        self._maps = maps
        self._views = [memoryview(m) for m in maps]

    @property
    def chunk_bytes(self) -> Sequence[int]:
        return tuple(len(m) for m in self._maps)

    def _locate(self, p: int):
        p = int(p)
        if not 0 <= p < self.capacity_pages:
            raise IndexError(f"page {p} is outside 0 .. {self.capacity_pages - 1}")
        if self._views is None:
            raise ValueError("pool is closed")
        chunk, index = divmod(p, self.pages_per_chunk)
        return self._views[chunk], index * self.page_bytes

    def page(self, p: int) -> memoryview:
        """Page p's bytes, writable, no copy."""
        view, off = self._locate(p)
        return view[off:off + self.page_bytes]

    def _check_spec(self, spec: NamespaceSpec) -> None:
        if spec.page_bytes != self.page_bytes:
            raise ValueError(
                f"namespace page_bytes {spec.page_bytes} differs from the "
                f"pool's page_bytes {self.page_bytes}")

    def page_array(self, p: int, spec: NamespaceSpec) -> np.ndarray:
        """Page p as a writable NumPy array of shape spec.page_shape =
        (num_layers, 2, num_kv_heads, page_size, head_dim) in the
        namespace's dtype (float32, float16; bf16 as uint16 bits; fp8 as
        uint8; int8), sharing the pool's memory."""
        self._check_spec(spec)
        view, off = self._locate(p)
        dt = numpy_dtype(spec.dtype)
        arr = np.frombuffer(view, dtype=dt, count=self.page_bytes // dt.itemsize,
                            offset=off)
        return arr.reshape(spec.page_shape)

    def page_tensor(self, p: int, spec: NamespaceSpec):
        """Page p as a CPU torch tensor of shape spec.page_shape in the
        namespace's dtype (torch.bfloat16 for bf16), sharing the pool's
        memory (torch.frombuffer). ImportError without torch."""
        import torch  # pylint: disable=import-outside-toplevel
        self._check_spec(spec)
        view, off = self._locate(p)
        dt = torch_dtype(spec.dtype)
        elem = torch.empty((), dtype=dt).element_size()
        t = torch.frombuffer(view, dtype=dt, count=self.page_bytes // elem,
                             offset=off)
        return t.view(spec.page_shape)

    def close(self) -> None:
        """Unmaps the chunks no view uses; the others stay mapped until
        their last view is gone."""
        views, self._views = self._views, None
        for v in views or ():
            v.release()
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass  # a page view still uses it

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Pool(backend={self.backend!r}, page_bytes={self.page_bytes}, "
                f"capacity_pages={self.capacity_pages}, "
                f"chunks={len(self._maps)})")


def _connect(attach_socket: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(attach_socket)
    except socket.timeout:
        sock.close()
        raise AttachError(f"attach: connect to {attach_socket}: timed out",
                          code=grpc.StatusCode.DEADLINE_EXCEEDED) from None
    except OSError as e:
        sock.close()
        what = f"attach: connect to {attach_socket}: {os.strerror(e.errno or 0)}"
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
            raise AttachError(what + " (is radixkvd running?)",
                              code=grpc.StatusCode.UNAVAILABLE) from None
        if e.errno == errno.EPROTOTYPE:
            raise AttachError(what + " (not a SOCK_SEQPACKET attach socket)",
                              code=grpc.StatusCode.FAILED_PRECONDITION) from None
        raise AttachError(what, code=grpc.StatusCode.UNAVAILABLE) from None
    return sock


_REFUSED = ("attach refused: unknown session or untrusted peer (the daemon "
            "closed the connection{}; see its log)")


def _exchange(sock: socket.socket, attach_socket: str, session_id: bytes,
              timeout: float):
    """Sends the session id; returns (reply bytes, fds)."""
    try:
        sock.send(session_id)
    except (BrokenPipeError, ConnectionResetError):
        raise AttachError(_REFUSED.format(""),
                          code=grpc.StatusCode.PERMISSION_DENIED) from None
    try:
        data, fds, flags, _ = socket.recv_fds(
            sock, _MAX_REPLY_BYTES, _MAX_CHUNKS, socket.MSG_CMSG_CLOEXEC)
    except socket.timeout:
        raise AttachError(
            f"attach: no reply from {attach_socket} within {timeout} s",
            code=grpc.StatusCode.DEADLINE_EXCEEDED) from None
    except ConnectionResetError:
        raise AttachError(_REFUSED.format(" without a reply"),
                          code=grpc.StatusCode.PERMISSION_DENIED) from None
    if not data and not fds:
        raise AttachError(_REFUSED.format(" without a reply"),
                          code=grpc.StatusCode.PERMISSION_DENIED)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise AttachError("attach: the reply or its descriptors were truncated",
                          code=grpc.StatusCode.INVALID_ARGUMENT)
    return data, fds


def _map_host(reply, fds: List[int]) -> Pool:
    maps = []
    try:
        for chunk, fd in zip(reply.chunks, fds):
            maps.append(mmap.mmap(fd, chunk.bytes, flags=mmap.MAP_SHARED,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE))
    except (OSError, ValueError) as e:
        for m in maps:
            m.close()
        raise AttachError(f"attach: mmap of chunk {len(maps)}: {e}",
                          code=grpc.StatusCode.INTERNAL) from None
    return Pool(reply.backend, reply.page_bytes, reply.pages_per_chunk,
                reply.capacity_pages, reply.device, maps)


def attach(attach_socket: str, session_id: str, timeout: float = 5.0) -> Pool:
    """Maps the pool of session `session_id` (SessionInfo.session_id)
    through the daemon's attach socket (SessionInfo.pool.attach_socket).

    Raises AttachError with code UNAVAILABLE (no daemon there),
    PERMISSION_DENIED ("attach refused": unknown or ended session, untrusted
    peer), DEADLINE_EXCEEDED (no reply within `timeout` seconds),
    INVALID_ARGUMENT (bad session id or a reply that is no mappable pool),
    FAILED_PRECONDITION ("cuda pool: ...") or INTERNAL (mmap failed)."""
    from radixkv import pb  # pylint: disable=import-outside-toplevel
    sid = session_id.encode("utf-8") if isinstance(session_id, str) else bytes(session_id)
    if not 0 < len(sid) <= _MAX_SESSION_ID_BYTES:
        raise AttachError(
            f"attach: session_id must be 1..{_MAX_SESSION_ID_BYTES} bytes "
            f"(it is {len(sid)})", code=grpc.StatusCode.INVALID_ARGUMENT)
    if not attach_socket:
        raise AttachError("attach: no attach socket (a none pool, or a daemon "
                          "without a Unix socket)",
                          code=grpc.StatusCode.INVALID_ARGUMENT)
    with _connect(attach_socket, timeout) as sock:
        data, fds = _exchange(sock, attach_socket, sid, timeout)
    try:
        try:
            reply = pb.AttachResponse.FromString(data)
        except DecodeError:
            raise AttachError("attach: the reply is not a radixkv.v1.AttachResponse",
                              code=grpc.StatusCode.INVALID_ARGUMENT) from None
        if reply.backend == "cuda":
            raise AttachError(
                f"cuda pool: device {reply.device} memory is shared as CUDA VMM "
                "handles, which this package does not import; a worker that "
                "needs a cuda pool's pages uses the C++ client "
                "(radixkv::Client with attach_pool) (docs/PYTHON.md)",
                code=grpc.StatusCode.FAILED_PRECONDITION)
        if reply.backend != "host":
            raise AttachError(f"attach: reply backend {reply.backend!r} cannot "
                              "be mapped (want host or cuda)",
                              code=grpc.StatusCode.INVALID_ARGUMENT)
        _check_layout(reply, len(fds))
        return _map_host(reply, fds)
    finally:
        for fd in fds:
            os.close(fd)  # mmap keeps its own descriptor
