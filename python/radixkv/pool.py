"""The worker side of the attach protocol (docs/CONTRACTS.md §3) and
zero-copy views of pages in the namespace layout (§2).

    pool = attach(info.pool.attach_socket, info.session_id, timeout=5.0)
    kv = pool.page_array(page, spec)      # numpy, shape (L, 2, H, P, D)
    kv[layer, 0, head, slot, :] = k       # K; [layer, 1, ...] is V
    t = pool.page_tensor(page, spec)      # the same bytes as a torch tensor
    views = pool.page_arrays(pages, spec) # many pages' views at once
    x = pool.gather_tensor(pages, spec)   # their bytes copied into one tensor

A `host` pool's chunks are sealed memfds mapped MAP_SHARED read-write:
every process that maps them sees the same bytes. Views share the
mapping; nothing is copied. A `cuda` pool is GPU memory shared through
CUDA VMM handles: attach() imports and maps them with the CUDA driver
(radixkv._cuda, libcuda.so.1 opened then, never at import) and returns a
CudaPool whose pages are device pointers (page_address), CudaArray
objects with __cuda_array_interface__ v3 (page, page_array) and CUDA
torch tensors (page_tensor). Without a usable driver or device, attach()
raises AttachError("cuda pool: ...") saying what is missing.

Ownership: a Pool owns its mappings; a view (memoryview, ndarray, tensor)
keeps its chunk mapped while it lives, so close() unmaps only chunks no
view uses and the rest go with their last view. A CudaPool's mapping
likewise stays while a CudaArray (or a torch tensor made from one) lives;
a bare page_address is valid only while the pool is open or such a view
lives. Mappings stay valid after the session ends and after the daemon
exits.

Thread safety: attach() may run concurrently; a Pool or CudaPool is
read-only after attach (a Pool's cache of chunk views fills idempotently)
and may be shared between threads (what the pages hold is the
lease holders' business, docs/CONTRACTS.md §2 "Who may touch a page").
"""
import errno
import mmap
import os
import socket
from typing import List, Sequence, Tuple

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from radixkv import _cuda
from radixkv.errors import AttachError
from radixkv.keys import NamespaceSpec

__all__ = ["attach", "Pool", "CudaPool", "CudaArray", "numpy_dtype",
           "torch_dtype"]

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


# gather(): with up to this many runs of consecutive pages, each run is one
# copy; with more, the pages of each chunk are one numpy.take.
_MAX_COPY_RUNS = 8
_BYTES = np.dtype(np.uint8)


def _runs(pages, capacity: int, per_chunk: int):
    """Splits page numbers into runs of consecutive pages of one chunk:
    [(start, stop, chunk, first)], pages[start:stop] being pages first ..
    of chunk `chunk`. IndexError for a page outside the pool."""
    if isinstance(pages, list) and pages:
        # One run of a list (a lease's pages, often): checked without NumPy.
        n, lo, hi = len(pages), int(pages[0]), int(pages[-1])
        if (hi - lo == n - 1 and 0 <= lo and hi < capacity and
                lo // per_chunk == hi // per_chunk and pages == list(range(lo, hi + 1))):
            return [(0, n, lo // per_chunk, lo % per_chunk)]
    pages = np.asarray(pages, dtype=np.int64).reshape(-1)
    n = pages.size
    if n == 0:
        return []
    lo, hi = int(pages.min()), int(pages.max())
    if lo < 0 or hi >= capacity:
        bad = lo if lo < 0 else hi
        raise IndexError(f"page {bad} is outside 0 .. {capacity - 1}")
    chunks, index = np.divmod(pages, per_chunk)
    breaks = np.flatnonzero((np.diff(pages) != 1) | (np.diff(chunks) != 0)) + 1
    starts = [0] + breaks.tolist()
    stops = breaks.tolist() + [len(pages)]
    return [(a, b, int(chunks[a]), int(index[a])) for a, b in zip(starts, stops)]


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
        # (chunk, dtype) -> the chunk's pages as a (pages, elements) array;
        # dropped by close().
        self._chunk_arrays = {}

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

    def _chunk_array(self, chunk: int, dt: np.dtype) -> np.ndarray:
        key = (chunk, dt.str)
        arr = self._chunk_arrays.get(key)
        if arr is None:
            if self._views is None:
                raise ValueError("pool is closed")
            pages = min(self.pages_per_chunk,
                        self.capacity_pages - chunk * self.pages_per_chunk)
            arr = np.frombuffer(self._views[chunk], dtype=dt,
                                count=pages * self.page_bytes // dt.itemsize)
            arr = self._chunk_arrays.setdefault(key, arr.reshape(pages, -1))
        return arr

    def page_arrays(self, pages: Sequence[int], spec: NamespaceSpec) -> List[np.ndarray]:
        """page_array(p, spec) for every p in `pages`, in order, built per
        run of consecutive pages (much cheaper than one call per page)."""
        self._check_spec(spec)
        dt = numpy_dtype(spec.dtype)
        shape = (-1,) + spec.page_shape
        out = []
        for start, stop, chunk, first in _runs(pages, self.capacity_pages,
                                               self.pages_per_chunk):
            run = self._chunk_array(chunk, dt)[first:first + stop - start]
            out.extend(run.reshape(shape))
        return out

    def gather(self, pages: Sequence[int], spec: NamespaceSpec,
               out: np.ndarray = None) -> np.ndarray:
        """Copies `pages`, in order, into one C-contiguous array of shape
        (len(pages),) + spec.page_shape in the namespace's element type
        (into `out` when given; it must have that shape and type). A few
        runs of consecutive pages are copied one memcpy each; many (a
        fragmented pool) with one gather (numpy.take) per chunk."""
        self._check_spec(spec)
        dt = numpy_dtype(spec.dtype)
        runs = _runs(pages, self.capacity_pages, self.pages_per_chunk)
        shape = (runs[-1][1] if runs else 0,) + spec.page_shape
        if out is None:
            out = np.empty(shape, dtype=dt)
        elif out.shape != shape or out.dtype != dt or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {dt} array of shape "
                             f"{shape} (it is {out.dtype} {out.shape})")
        self._copy_runs(pages, runs, out.reshape(-1).view(np.uint8))
        return out

    def gather_tensor(self, pages: Sequence[int], spec: NamespaceSpec, out=None):
        """gather() into a CPU torch tensor of the namespace's dtype
        (torch.bfloat16 for bf16), shape (len(pages),) + spec.page_shape;
        into `out` when given (contiguous, that shape and dtype).
        ImportError without torch."""
        import torch  # pylint: disable=import-outside-toplevel
        self._check_spec(spec)
        runs = _runs(pages, self.capacity_pages, self.pages_per_chunk)
        tdt = torch_dtype(spec.dtype)
        shape = (runs[-1][1] if runs else 0,) + spec.page_shape
        if out is None:
            out = torch.empty(shape, dtype=tdt)
        elif (tuple(out.shape) != shape or out.dtype != tdt or
              out.device.type != "cpu" or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous CPU {tdt} tensor of "
                             f"shape {shape}")
        self._copy_runs(pages, runs, out.view(torch.uint8).numpy().reshape(-1))
        return out

    def _copy_runs(self, pages, runs, dst: np.ndarray) -> None:
        """Copies the pages of `runs` (_runs of `pages`) into the bytes
        `dst`, page after page."""
        rows = dst.reshape(-1, self.page_bytes)
        if len(runs) <= _MAX_COPY_RUNS:
            for start, stop, chunk, first in runs:
                src = self._chunk_array(chunk, _BYTES)[first:first + stop - start]
                np.copyto(rows[start:stop], src)
            return
        chunks, index = np.divmod(np.asarray(pages, dtype=np.int64).reshape(-1),
                                  self.pages_per_chunk)
        cuts = (np.flatnonzero(np.diff(chunks)) + 1).tolist()
        for start, stop in zip([0] + cuts, cuts + [len(rows)]):
            # mode="clip": the indexes are checked; "raise" would buffer out.
            np.take(self._chunk_array(int(chunks[start]), _BYTES), index[start:stop],
                    axis=0, out=rows[start:stop], mode="clip")

    def close(self) -> None:
        """Unmaps the chunks no view uses; the others stay mapped until
        their last view is gone."""
        self._chunk_arrays = {}
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


class CudaArray:
    """A C-contiguous array in a cuda pool's device memory, described by
    __cuda_array_interface__ (version 3): torch.as_tensor(a, device="cuda"),
    cupy.asarray(a) and numba.cuda.as_cuda_array(a) view it without a copy.
    No stream is named: the lease protocol orders writes before commits and
    reads (docs/CONTRACTS.md §2). Keeps its pool's mapping alive."""

    __slots__ = ("ptr", "shape", "dtype", "device", "_mapping")

    def __init__(self, ptr: int, shape: Tuple[int, ...], dtype, device: int,
                 mapping):
        self.ptr = ptr
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self._mapping = mapping

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (self.ptr, False), "strides": None, "version": 3}

    def __repr__(self) -> str:
        return (f"CudaArray(ptr=0x{self.ptr:x}, shape={self.shape}, "
                f"dtype={self.dtype}, device={self.device})")


class CudaPool:
    """A mapped cuda pool: all chunks in one reserved device address range,
    chunk c at chunk_bases[c] (chunks may be longer than their pages, so
    the chunks are not spaced by pages_per_chunk * page_bytes). Page p is
    at chunk_bases[p // pages_per_chunk] + (p % pages_per_chunk) *
    page_bytes. `mapping` is a radixkv._cuda.Mapping (or any object with
    the attribute chunk_bases)."""

    backend = "cuda"

    def __init__(self, page_bytes: int, pages_per_chunk: int,
                 capacity_pages: int, device: int, chunk_bytes: Sequence[int],
                 mapping):
        self.page_bytes = page_bytes
        self.pages_per_chunk = pages_per_chunk
        self.capacity_pages = capacity_pages
        self.device = device
        self._chunk_bytes = tuple(chunk_bytes)
        self._bases = tuple(mapping.chunk_bases)
        self._mapping = mapping

    @property
    def chunk_bytes(self) -> Sequence[int]:
        return self._chunk_bytes

    def page_address(self, p: int) -> int:
        """Page p's device pointer (an int): valid while the pool is open
        or a CudaArray of it lives."""
        p = int(p)
        if not 0 <= p < self.capacity_pages:
            raise IndexError(f"page {p} is outside 0 .. {self.capacity_pages - 1}")
        if self._mapping is None:
            raise ValueError("pool is closed")
        chunk, index = divmod(p, self.pages_per_chunk)
        return self._bases[chunk] + index * self.page_bytes

    def page(self, p: int) -> CudaArray:
        """Page p's bytes: a uint8 CudaArray of shape (page_bytes,)."""
        return CudaArray(self.page_address(p), (self.page_bytes,), np.uint8,
                         self.device, self._mapping)

    def page_array(self, p: int, spec: NamespaceSpec) -> CudaArray:
        """Page p as a CudaArray of shape spec.page_shape in the namespace's
        element type, as Pool.page_array (bf16 as uint16 bits, fp8 as
        uint8)."""
        if spec.page_bytes != self.page_bytes:
            raise ValueError(
                f"namespace page_bytes {spec.page_bytes} differs from the "
                f"pool's page_bytes {self.page_bytes}")
        return CudaArray(self.page_address(p), spec.page_shape,
                         numpy_dtype(spec.dtype), self.device, self._mapping)

    def page_tensor(self, p: int, spec: NamespaceSpec):
        """Page p as a torch tensor on cuda:<device> of shape
        spec.page_shape in the namespace's dtype (torch.bfloat16 for bf16;
        float8 types where torch has them), sharing the pool's memory
        (torch.as_tensor of the page's CudaArray). ImportError without
        torch; torch's error where it has no CUDA."""
        import torch  # pylint: disable=import-outside-toplevel
        self.page_array(p, spec)  # checks p and the namespace
        raw = torch.as_tensor(self.page(p), device=f"cuda:{self.device}")
        return raw.view(torch_dtype(spec.dtype)).view(spec.page_shape)

    def close(self) -> None:
        """Drops the pool's hold on the mapping: it is unmapped now unless
        a CudaArray (or a tensor made from one) still uses it, and then
        with the last of those."""
        self._mapping = None

    def __enter__(self) -> "CudaPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CudaPool(device={self.device}, page_bytes={self.page_bytes}, "
                f"capacity_pages={self.capacity_pages}, "
                f"chunks={len(self._chunk_bytes)})")


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


def _map_cuda(reply, fds: List[int]) -> CudaPool:
    if reply.device < 0:
        raise AttachError(f"attach: a cuda pool with device {reply.device}",
                          code=grpc.StatusCode.INVALID_ARGUMENT)
    chunk_bytes = [chunk.bytes for chunk in reply.chunks]
    mapping = _cuda.map_chunks(reply.device, chunk_bytes, fds)
    return CudaPool(reply.page_bytes, reply.pages_per_chunk,
                    reply.capacity_pages, reply.device, chunk_bytes, mapping)


def attach(attach_socket: str, session_id: str, timeout: float = 5.0):
    """Maps the pool of session `session_id` (SessionInfo.session_id)
    through the daemon's attach socket (SessionInfo.pool.attach_socket):
    a Pool for a host pool, a CudaPool for a cuda pool.

    Raises AttachError with code UNAVAILABLE (no daemon there),
    PERMISSION_DENIED ("attach refused": unknown or ended session, untrusted
    peer), DEADLINE_EXCEEDED (no reply within `timeout` seconds),
    INVALID_ARGUMENT (bad session id or a reply that is no mappable pool),
    INTERNAL (mmap failed). For a cuda pool, returns a CudaPool; its
    errors start with "cuda pool: ": FAILED_PRECONDITION when libcuda.so.1,
    an entry point, the device or its VMM support is missing,
    RESOURCE_EXHAUSTED when the driver is out of memory, INTERNAL when a
    driver call fails otherwise. Every received descriptor is closed before
    attach() returns or raises."""
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
        if reply.backend not in ("host", "cuda"):
            raise AttachError(f"attach: reply backend {reply.backend!r} cannot "
                              "be mapped (want host or cuda)",
                              code=grpc.StatusCode.INVALID_ARGUMENT)
        _check_layout(reply, len(fds))
        if reply.backend == "cuda":
            return _map_cuda(reply, fds)
        return _map_host(reply, fds)
    finally:
        for fd in fds:
            os.close(fd)  # mmap keeps its own descriptor; CUDA its handle
