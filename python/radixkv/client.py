"""radixkv.Client: an inference worker's session in one namespace of radixkvd.

    spec = NamespaceSpec(model="m", num_layers=32, num_kv_heads=8,
                         head_dim=128, page_size=16, dtype="bf16")
    with Client(namespace=spec, client_name="worker-0", attach_pool=True) as c:
        with c.acquire(prompt_tokens) as lease:
            # lease.matched_tokens tokens are cached in lease.pages[:matched];
            # write the K/V of the next lease.new_blocks blocks into
            # lease.page_array(lease.matched_blocks + j), then:
            lease.commit(lease.new_blocks)

It behaves as the C++ radixkv::Client (docs/CLIENT.md):

* The constructor does not fail because the daemon is down; a background
  thread keeps the Session stream open (heartbeats; reconnect with
  exponential backoff and jitter; re-attach the pool).
* acquire() never raises because the daemon is away: with no session open,
  or a call that fails or misses its deadline, it returns a degraded Lease
  (no match, no pages). It raises only for the caller's own mistakes
  (InvalidArgument, FailedPrecondition).
* Every call has a deadline (call_timeout; release_timeout for releases).
* A Lease left (its `with` block, or dropped) while held costs no call of
  its own: its id rides on the next acquire (release_leases); ids no
  acquire picked up within release_delay are released by the session thread.
  release_delay=0: leaving sends the Release and waits for it.
* When the daemon refuses the carried ids because one of them expired
  (NOT_FOUND, ErrorDetail field release_leases, reason LEASE_NOT_FOUND), the
  ids are released one by one and the acquire is sent again without them.
  An ErrorDetail with reason SESSION_NOT_FOUND drops the session (it is
  re-opened) and that acquire degrades.
* Fail closed: a Lease gives page views only while it is `live` (held, its
  session open, before its expiry less a safety margin of min(1 s, TTL /
  10)); a reader calls confirm_read() after its reads and treats the prompt
  as a miss unless it returns True. An acquire answered too late to use is
  a miss (a degraded Lease).
* A session that ended without close() is acknowledged in the next
  OpenSession (acknowledge_sessions, at most 64) once its leases refuse
  page access; a commit answered NOT_FOUND ends the lease for good.

Thread safety: Client is thread-safe. A Lease belongs to one thread at a
time; different Leases are independent. A Lease may outlive its Client
(ending it is then a no-op: closing the client ended the session).
"""
import os
import stat
import time
from typing import List, Optional, Sequence, Union

import grpc
import numpy as np

from radixkv import errors, pb
from radixkv._session import ClientState, Core, Options
from radixkv.errors import FailedPrecondition, InvalidArgument, LeaseLost
from radixkv.keys import (BlockHasher, NamespaceSpec, as_token_array,
                          compute_block_keys, namespace_root)

__all__ = ["Client", "Lease", "ClientState", "grpc_target", "default_socket_path",
           "user_socket_path",
           "validate_namespace"]

# AcquireRequest.release_leases holds at most this many ids.
MAX_RELEASE_LEASES = 64
_U4 = np.dtype("<u4")


SYSTEM_RUNTIME_DIR = "/run/radixkv"


def user_socket_path() -> str:
    """The per-user socket: $XDG_RUNTIME_DIR/radixkv/radixkvd.sock, else
    /tmp/radixkv-<uid>/radixkvd.sock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return runtime + "/radixkv/radixkvd.sock"
    return f"/tmp/radixkv-{os.getuid()}/radixkvd.sock"


def default_socket_path(system_dir: str = SYSTEM_RUNTIME_DIR) -> str:
    """Where the daemon is looked for when no endpoint is given, as the C++
    client, radixkvctl and radixkv-worker choose it: the system daemon's
    socket <system_dir>/radixkvd.sock when it exists, else the per-user
    socket."""
    system = system_dir + "/radixkvd.sock"
    try:
        if stat.S_ISSOCK(os.stat(system).st_mode):
            return system
    except OSError:
        pass
    return user_socket_path()


def grpc_target(endpoint: Optional[str] = None) -> str:
    """The gRPC target for an endpoint as radixkvctl --endpoint reads it:
    None takes $RADIXKVCTL_ENDPOINT; empty is the daemon's default socket;
    /path (./, ../) and unix:/path are Unix sockets; other gRPC URI schemes
    pass through; else host:port. InvalidArgument (field "endpoint")
    otherwise."""
    if endpoint is None:
        endpoint = os.environ.get("RADIXKVCTL_ENDPOINT", "")
    if not endpoint:
        return "unix:" + default_socket_path()
    if endpoint.startswith(("/", "./", "../")):
        return "unix:" + endpoint
    if endpoint.startswith("unix:"):
        if endpoint == "unix:":
            raise InvalidArgument('endpoint: "unix:" needs a socket path, e.g. '
                                  "unix:/tmp/r.sock", field="endpoint",
                                  reason=errors.REASON_INVALID)
        return endpoint
    if endpoint.startswith(("dns:", "ipv4:", "ipv6:", "unix-abstract:", "vsock:")):
        return endpoint
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise InvalidArgument(
            f'endpoint: "{endpoint}" is not a socket path (/path, unix:/path) '
            "or host:port with a port in 1..65535", field="endpoint",
            reason=errors.REASON_INVALID)
    return endpoint


def validate_namespace(spec: NamespaceSpec) -> None:
    """What the daemon checks of a worker's layout: num_layers,
    num_kv_heads, head_dim and page_size nonzero, a known dtype, tp_rank <
    tp_size (0 read as 1). InvalidArgument naming the field otherwise."""
    for name in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
        if getattr(spec, name) == 0:
            raise InvalidArgument(f"namespace.{name} must be at least 1, got 0",
                                  field=f"namespace.{name}",
                                  reason=errors.REASON_INVALID)
    if spec.elem_bytes == 0:
        raise InvalidArgument(
            f"namespace.dtype: unknown or unspecified dtype value {spec.dtype}",
            field="namespace.dtype", reason=errors.REASON_INVALID)
    tp_size = spec.tp_size or 1
    if spec.tp_rank >= tp_size:
        raise InvalidArgument(
            f"namespace.tp_rank ({spec.tp_rank}) must be below "
            f"namespace.tp_size ({tp_size})", field="namespace.tp_rank",
            reason=errors.REASON_INVALID)


_INFINITY = float("inf")


def _usable_until(sent: float, ttl: float, expires_unix_ms: int) -> float:
    """The time.monotonic() until which a lease acquired by a call sent at
    `sent` may give page access: its expiry (the earlier of the daemon's
    deadline, read against this host's clock, and sent + the session's
    lease TTL) less the safety margin min(1 s, TTL / 10). Infinity when the
    daemon names neither."""
    deadline = _INFINITY
    if expires_unix_ms > 0:
        deadline = time.monotonic() + (expires_unix_ms / 1000.0 - time.time())
    if ttl > 0:
        deadline = min(deadline, sent + ttl)
    if deadline == _INFINITY:
        return deadline
    span = ttl if ttl > 0 else deadline - sent
    return deadline - max(0.0, min(1.0, span / 10))


def priority_ranges(priorities):
    """pb.BlockPriority messages of `priorities`: each a pb.BlockPriority or
    (first_block, blocks, priority[, seconds]); seconds None or 0: no
    expiry. The daemon checks the limits (docs/API.md)."""
    out = []
    for p in priorities:
        if isinstance(p, pb.BlockPriority):
            out.append(p)
            continue
        first, blocks, priority, *rest = p
        seconds = rest[0] if rest else None
        out.append(pb.BlockPriority(
            first_block=first, blocks=blocks, priority=priority,
            duration_ms=0 if not seconds else max(1, int(seconds * 1000))))
    return out


def _closed() -> errors.Unavailable:
    return errors.Unavailable("the client is closed", code=grpc.StatusCode.CANCELLED)


def _lease_lost(message: str) -> LeaseLost:
    return LeaseLost(message, field="lease_id", reason=errors.REASON_LEASE_NOT_FOUND)


class Lease:
    """A pin on the cached prefix of one prompt plus pages allocated for the
    next blocks; the result of Client.acquire. A context manager: leaving
    the `with` block ends a lease that is still held (see Client).

    pages lists matched_blocks cached pages in block order (read-only,
    shared), then new_blocks new pages (the worker's to write, block
    matched_blocks + j into pages[matched_blocks + j]). A degraded lease
    (daemon away) has no match and no pages. Page views are given only
    while the lease is `live` (LeaseLost otherwise); a reader checks
    confirm_read() after its reads."""

    __slots__ = ("_core", "_pool", "_spec", "_session_id", "_generation",
                 "lease_id", "degraded", "total_blocks", "matched_blocks",
                 "matched_tokens", "promoted_blocks", "new_blocks",
                 "committed_blocks", "pages",
                 "expires_unix_ms", "_ended", "_life", "_usable_until",
                 "_writing")

    def __init__(self, core: Core, spec: NamespaceSpec, total_blocks: int,
                 degraded: bool):
        self._core = core
        self._pool = None
        self._spec = spec
        self._session_id = ""
        self._generation = 0
        self._ended = False
        self.lease_id = 0
        self.degraded = degraded
        self.total_blocks = total_blocks
        self.matched_blocks = 0
        self.matched_tokens = 0
        # Of matched_blocks, those the daemon copied up from a tier below
        # its pool (--tier) for this lease; they read like the others.
        self.promoted_blocks = 0
        self.new_blocks = 0
        self.committed_blocks = 0
        self.pages: List[int] = []
        self.expires_unix_ms = 0
        self._life = None
        self._usable_until = _INFINITY   # time.monotonic() deadline
        # A view of a new page was handed out since the last commit or
        # release: this lease is counted in _life.writers (SessionLife).
        self._writing = False

    @property
    def held(self) -> bool:
        """True while the daemon holds pages for this lease."""
        return self.lease_id != 0

    @property
    def live(self) -> bool:
        """Held, its session still open, and before its expiry less the
        safety margin min(1 s, lease TTL / 10): the daemon still pins every
        page. Page views are given only while live."""
        return (self.lease_id != 0 and self._life is not None and
                not self._life.ended and time.monotonic() < self._usable_until)

    @property
    def time_left(self) -> float:
        """Seconds of page access left (0.0 when not live). The expiry is the
        earlier of the daemon's lease_expires_unix_ms and the session's lease
        TTL counted from when the Acquire was sent (monotonic clock)."""
        if not self.live:
            return 0.0
        return self._usable_until - time.monotonic()

    def confirm_read(self) -> bool:
        """Call after reads of this lease's pages finished: True when the
        lease was live at that point, so what was read is the cached K/V.
        False: discard what was read and treat the prompt as a miss."""
        return self.live

    @property
    def session_id(self) -> str:
        """The id of the session that made the lease. A worker process that
        writes this lease's new pages maps the pool with it
        (radixkv.attach(attach_socket, session_id)), so that the daemon
        counts that process as a writer of the session's pages."""
        return self._session_id

    def begin_external_write(self) -> bool:
        """Counts this lease as a writer of its session until its next
        commit or release, as handing out a view of a new page does: use it
        when another process writes the new pages. While counted, a lost
        session is not acknowledged to the daemon, so the pages are never
        reused by anyone while that write may still run. Returns False (and
        counts nothing) when the lease is not live or its session ended."""
        if self._writing:
            return True
        if not self.held or self._life is None or not self._life.begin_write():
            return False
        self._writing = True
        return True

    @property
    def matched_pages(self) -> List[int]:
        return self.pages[:self.matched_blocks]

    @property
    def new_pages(self) -> List[int]:
        return self.pages[self.matched_blocks:]

    @property
    def uncommitted_blocks(self) -> int:
        return self.new_blocks - self.committed_blocks

    def _require_held(self, what: str) -> None:
        if self.lease_id != 0:
            return
        if self.degraded:
            raise FailedPrecondition(f"{what}: degraded lease holds no pages",
                                     field="lease_id", reason=errors.REASON_INVALID)
        if self._ended:
            raise _lease_lost(f"{what}: the lease has ended (released, "
                              "committed with release, or its with block exited)")
        raise FailedPrecondition(f"{what}: the lease holds nothing (no match, "
                                 "no pages allocated)", field="lease_id",
                                 reason=errors.REASON_INVALID)

    def _end_writes(self) -> None:
        if self._writing:
            self._writing = False
            self._life.end_write()

    def _end(self) -> int:
        self._end_writes()
        lease_id, self.lease_id = self.lease_id, 0
        self._ended = self._ended or lease_id != 0
        if lease_id != 0:
            self._core.untrack_lease(self._generation, lease_id)
        return lease_id

    def commit(self, blocks: Optional[int] = None, release: bool = True,
               keep_writing: bool = False, priorities=()):
        """Commits the next `blocks` (default: all) uncommitted new pages, in
        block order, as the blocks after the matched prefix; with release
        also ends the lease. REQUIRES: their K/V is written (kernels
        finished). Returns the radixkv.v1.CommitResponse.

        priorities: retention priorities, as for Client.acquire.

        keep_writing (with release=False): later new pages are still being
        written (begin_external_write); the lease stays counted as a writer
        of its session through the commit, with no moment without it.

        Raises FailedPrecondition (field "blocks") when blocks exceeds
        uncommitted_blocks (nothing sent) or the lease is degraded;
        LeaseLost when the lease has ended, expired or its session ended
        (daemon restart: the pages were not cached); Unavailable /
        DeadlineExceeded when the daemon does not answer. A NOT_FOUND answer
        ends the lease here too (no page views, nothing sent for it again).
        A lease past its expiry still sends its commit: the daemon caches
        nothing for it, and the call tells it the pages stay unwritten."""
        extra = (keep_writing and not release and self._life is not None
                 and self.lease_id != 0 and self._life.begin_write())
        try:
            return self._commit(blocks, release, priorities)
        finally:
            if extra:
                if self.held and not self._writing:
                    self._writing = True
                else:
                    self._life.end_write()

    def _commit(self, blocks: Optional[int], release: bool, priorities=()):
        self._end_writes()  # the writes of the blocks to commit have finished
        self._require_held("commit")
        if blocks is None:
            blocks = self.uncommitted_blocks
        if not 0 <= blocks <= self.uncommitted_blocks:
            raise FailedPrecondition(
                f"blocks: commit of {blocks} blocks exceeds the lease's "
                f"{self.uncommitted_blocks} uncommitted new pages",
                field="blocks", reason=errors.REASON_INVALID)
        if not self._core.is_current(self._generation):
            # The daemon ended it with the session (its pages fenced if the
            # daemon still runs): say they will not be written, cache nothing.
            self.release()
            raise _lease_lost("commit: the session of this lease ended (daemon "
                              "restart or client closed); the pages were not cached")
        request = pb.CommitRequest(session_id=self._session_id, lease_id=self.lease_id,
                                   blocks=blocks, release=release,
                                   priorities=priority_ranges(priorities))
        try:
            response = self._core.kv.Commit(request,
                                            timeout=self._core.options.call_timeout)
        except grpc.RpcError as e:
            err = errors.from_rpc_error(e)
            if err.code == grpc.StatusCode.NOT_FOUND:
                self._end()
            raise err from None
        self.committed_blocks += blocks
        if release or response.released:
            self._end()
        return response

    def release(self) -> None:
        """Ends the lease now with one Release call (never deferred).
        Idempotent; a lease the daemon no longer has (expired, session
        ended) counts as released. Never raises because the daemon is away:
        the lease then ends with the session or at its TTL."""
        lease_id = self._end()
        if lease_id == 0:
            return
        # Sent even when the session has ended: for a daemon that fenced the
        # lease's pages with the session, it says they will not be written.
        current = self._core.is_current(self._generation)
        try:
            self._core.kv.Release(
                pb.ReleaseRequest(session_id=self._session_id, lease_id=lease_id),
                timeout=self._core.options.release_timeout)
        except grpc.RpcError as e:
            err = errors.from_rpc_error(e)
            if current and errors.is_caller_error(err):
                raise err from None
        except ValueError:  # the client is closed: its channel too
            pass

    def drop(self) -> None:
        """Ends a held lease the way leaving the `with` block does: its id
        rides on the next acquire (or is released within release_delay);
        with release_delay 0, release() now."""
        if self.lease_id == 0:
            return
        current = self._core.is_current(self._generation)
        if not current and not self._core.stopped():
            self._end()  # a lost session: the next open acknowledges it
        elif current and self._core.options.release_delay > 0:
            self._core.defer_release(self._generation, self._end())
        else:
            self.release()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.drop()

    def __del__(self):
        try:
            self.drop()
        except Exception:  # pylint: disable=broad-except
            pass  # the daemon also ends it with the session or at its TTL

    # -- page views (attach_pool) ----------------------------------------------

    def _page(self, i: int) -> int:
        self._require_held("page view")
        if not self.live:
            raise _lease_lost("page view: the lease is no longer live (expired, "
                              "or its session ended); treat the prompt as a miss")
        if self._pool is None:
            raise FailedPrecondition(
                "page view: no pool is mapped (attach_pool=False, or a none pool)",
                field="pool", reason=errors.REASON_INVALID)
        if not 0 <= i < len(self.pages):
            raise IndexError(f"page index {i} is outside 0 .. {len(self.pages) - 1}")
        if i >= self.matched_blocks and not self._writing:
            # A new page's view may be written until the next commit or
            # release: count this lease as a writer of its session.
            if not self._life.begin_write():
                raise _lease_lost("page view: the session of this lease ended; "
                                  "treat the prompt as a miss")
            self._writing = True
        return self.pages[i]

    def page(self, i: int):
        """pages[i] in the mapped pool, without a copy: a memoryview of its
        bytes for a host pool, a radixkv.pool.CudaArray for a cuda pool. A
        view of a new page may be written until this lease's next commit or
        release (or its end), not after: until then a lost session is not
        acknowledged, so the daemon does not reuse the page while the write
        runs."""
        page = self._page(i)
        return self._pool.page(page)

    def page_array(self, i: int):
        """pages[i] shaped (num_layers, 2, num_kv_heads, page_size, head_dim)
        in the namespace's dtype, sharing the pool's memory: a NumPy array
        for a host pool (radixkv.pool.Pool.page_array), a CudaArray
        (__cuda_array_interface__) for a cuda pool. Valid while the lease
        is."""
        page = self._page(i)
        return self._pool.page_array(page, self._spec)

    def page_tensor(self, i: int):
        """pages[i] as a torch tensor of the same shape, sharing the pool's
        memory: a CPU tensor for a host pool, a CUDA tensor for a cuda
        pool."""
        page = self._page(i)
        return self._pool.page_tensor(page, self._spec)

    def __repr__(self) -> str:
        return (f"Lease(lease_id={self.lease_id}, degraded={self.degraded}, "
                f"total_blocks={self.total_blocks}, matched_blocks="
                f"{self.matched_blocks}, new_blocks={self.new_blocks})")


class Client:
    """One worker's session in one namespace; see the module docstring.

    endpoint: /path, unix:/path or host:port; None: $RADIXKVCTL_ENDPOINT,
      else the daemon's default socket (as radixkvctl). namespace: the
      NamespaceSpec (layout fields required). Durations are seconds.
      initial_wait: how long the constructor waits for the first session.

    Raises InvalidArgument for a bad endpoint or namespace layout, and for a
    namespace the daemon refuses while the constructor waits (e.g. a
    string over --max_string_bytes, FailedPrecondition for other
    page_bytes than the pool's); ValueError for a bad duration."""

    def __init__(self, endpoint: Optional[str] = None, namespace: NamespaceSpec = None,
                 client_name: str = "python", attach_pool: bool = False,
                 call_timeout: float = 2.0, heartbeat_interval: float = 1.0,
                 reconnect_max_backoff: float = 5.0, release_delay: float = 0.005,
                 *, connect_timeout: float = 2.0, initial_wait: float = 2.0,
                 reconnect_initial_backoff: float = 0.1, reconnect_jitter: float = 0.2,
                 release_timeout: float = 0.5, device: int = 0):
        if not isinstance(namespace, NamespaceSpec):
            raise TypeError("namespace: a radixkv.NamespaceSpec is required")
        validate_namespace(namespace)
        for name, value in (("call_timeout", call_timeout),
                            ("connect_timeout", connect_timeout),
                            ("heartbeat_interval", heartbeat_interval),
                            ("release_timeout", release_timeout),
                            ("reconnect_initial_backoff", reconnect_initial_backoff)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if reconnect_max_backoff < reconnect_initial_backoff:
            raise ValueError("reconnect_max_backoff must be at least "
                             "reconnect_initial_backoff")
        if release_delay < 0 or initial_wait < 0:
            raise ValueError("release_delay and initial_wait must not be negative")
        self.namespace = namespace
        self.options = Options(
            target=grpc_target(endpoint), namespace=namespace,
            client_name=client_name, device=device, attach_pool=attach_pool,
            call_timeout=call_timeout, connect_timeout=connect_timeout,
            heartbeat_interval=heartbeat_interval,
            reconnect_initial_backoff=reconnect_initial_backoff,
            reconnect_max_backoff=reconnect_max_backoff,
            reconnect_jitter=reconnect_jitter, release_delay=release_delay,
            release_timeout=release_timeout)
        # The daemon hashes tp_size 0 as 1; so does this root.
        self.namespace_root = namespace_root(namespace.normalized())
        self._page_size = namespace.page_size
        self._core = Core(self.options)
        self._core.start()
        if initial_wait > 0:
            refusal = self._core.wait_for_open_or_refusal(initial_wait)
            if refusal is not None:
                self._core.stop()
                raise refusal

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Releases every lease still held or queued (a lease that outlives
        the client gives no page view any more), closes the session and
        stops the session thread. Idempotent."""
        self._core.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        core = getattr(self, "_core", None)
        if core is not None:
            try:
                core.stop()
            except Exception:  # pylint: disable=broad-except
                pass

    @property
    def connected(self) -> bool:
        return self._core.current().usable

    def state(self) -> ClientState:
        return self._core.state()

    def wait_for_session(self, timeout: float) -> bool:
        """Blocks until a session is open (True) or `timeout` seconds pass
        (False; state().last_error says why)."""
        return self._core.wait_for_session(timeout)

    @property
    def pool(self):
        """The mapped radixkv.pool.Pool of the current session, or None."""
        return self._core.current().pool

    # -- keys ------------------------------------------------------------------

    def compute_keys(self, tokens) -> List[bytes]:
        """Block keys of `tokens` in this namespace (contract v1)."""
        return compute_block_keys(self.namespace_root, self._page_size, tokens)

    def new_hasher(self) -> BlockHasher:
        return BlockHasher(self.namespace_root, self._page_size)

    # -- worker calls ----------------------------------------------------------

    def _prompt_bytes(self, tokens) -> bytes:
        try:
            arr = as_token_array(tokens)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(str(e), field="tokens",
                                  reason=errors.REASON_INVALID) from None
        if arr.size == 0:
            raise InvalidArgument("tokens: must hold at least 1 token",
                                  field="tokens", reason=errors.REASON_INVALID)
        return arr.tobytes()

    @staticmethod
    def _packed_keys(keys: Union[bytes, Sequence[bytes]]) -> bytes:
        packed = keys if isinstance(keys, (bytes, bytearray, memoryview)) \
            else b"".join(keys)
        packed = bytes(packed)
        if not packed or len(packed) % 16:
            raise InvalidArgument(
                f"block_keys_packed: {len(packed)} bytes; want 16 per block, "
                "at least one", field="block_keys_packed",
                reason=errors.REASON_INVALID)
        return packed

    def acquire(self, tokens, allocate: bool = True, max_new_blocks: int = 0,
                priorities=()) -> Lease:
        """Pins the longest cached prefix of `tokens` (list of ints or a
        NumPy integer array) and, with allocate, takes pages for the next
        full blocks (at most max_new_blocks; 0: all). Returns a Lease,
        degraded when the daemon is away or late. Raises InvalidArgument /
        FailedPrecondition for input the daemon refuses.

        priorities: retention priorities for ranges of the prompt's full
        blocks (docs/API.md), each (first_block, blocks, priority[,
        seconds]) or a pb.BlockPriority: priority 0..100 (default 35), for
        `seconds` (None or 0: while cached), lower evicted first."""
        prompt = self._prompt_bytes(tokens)
        request = pb.AcquireRequest(tokens_le=prompt, allocate=allocate,
                                    max_new_blocks=max_new_blocks, pages_le=True,
                                    priorities=priority_ranges(priorities))
        return self._acquire(request, len(prompt) // 4 // self._page_size)

    def acquire_keys(self, keys, allocate: bool = True,
                     max_new_blocks: int = 0, priorities=()) -> Lease:
        """Key mode: one 16-byte key per full block (compute_keys), sent as
        block_keys_packed; the daemon must run with --allow_key_mode."""
        packed = self._packed_keys(keys)
        request = pb.AcquireRequest(block_keys_packed=packed, allocate=allocate,
                                    max_new_blocks=max_new_blocks, pages_le=True,
                                    priorities=priority_ranges(priorities))
        return self._acquire(request, len(packed) // 16)

    def _call_acquire(self, request):
        """(response, error, when it was sent on the monotonic clock)."""
        sent = time.monotonic()
        try:
            return (self._core.kv.Acquire(request, timeout=self.options.call_timeout),
                    None, sent)
        except grpc.RpcError as e:
            return None, errors.from_rpc_error(e), sent
        except ValueError:  # the channel was closed meanwhile
            return None, _closed(), sent

    def _acquire(self, request, total_blocks: int) -> Lease:
        core = self._core
        lease = Lease(core, self.namespace, total_blocks, degraded=True)
        session = core.current()
        if not session.usable:
            return lease
        request.session_id = session.session_id
        # Leases dropped since the last call end with this one.
        carried = core.take_deferred(session.generation, MAX_RELEASE_LEASES)
        if carried:
            request.release_leases.extend(carried)
        response, err, sent = self._call_acquire(request)
        if err is not None and carried:
            # The daemon released none of them (all or nothing). When one of
            # them is the reason (it expired meanwhile), release them one by
            # one and send the Acquire on its own.
            their_fault = (err.reason == errors.REASON_LEASE_NOT_FOUND and
                           err.field.split("[", 1)[0] == "release_leases")
            core.requeue_deferred(session.generation, carried, release_now=their_fault)
            if their_fault:
                del request.release_leases[:]
                response, err, sent = self._call_acquire(request)
        if err is not None:
            if errors.is_caller_error(err):
                raise err
            if err.reason == errors.REASON_SESSION_NOT_FOUND:
                core.report_session_lost(session.generation)
            return lease
        return self._fill_lease(lease, response, session, sent)

    def _fill_lease(self, lease: Lease, response, session, sent: float) -> Lease:
        lease.degraded = False
        lease._session_id = session.session_id  # pylint: disable=protected-access
        lease._generation = session.generation  # pylint: disable=protected-access
        lease._pool = session.pool  # pylint: disable=protected-access
        lease.lease_id = response.lease_id
        lease.total_blocks = response.total_blocks
        lease.matched_blocks = response.matched_blocks
        lease.matched_tokens = response.matched_tokens
        lease.promoted_blocks = response.promoted_blocks
        lease.new_blocks = response.new_blocks
        lease.expires_unix_ms = response.lease_expires_unix_ms
        lease._life = session.life  # pylint: disable=protected-access
        if lease.lease_id:
            self._core.track_lease(session.generation, lease.lease_id)
        lease._usable_until = _usable_until(  # pylint: disable=protected-access
            sent, session.lease_ttl, response.lease_expires_unix_ms)
        if response.pages_le:
            if len(response.pages_le) % 4:
                lease.release()
                raise errors.Error(f"Acquire: daemon returned {len(response.pages_le)} "
                                   "bytes of pages_le, not a multiple of 4",
                                   code=grpc.StatusCode.INTERNAL)
            lease.pages = np.frombuffer(response.pages_le, dtype=_U4).tolist()
        else:
            lease.pages = list(response.pages)
        if len(lease.pages) != lease.matched_blocks + lease.new_blocks:
            # A daemon bug; do not hand out pages that cannot be accounted for.
            lease.release()
            raise errors.Error(
                f"Acquire: daemon returned {len(lease.pages)} pages for "
                f"{lease.matched_blocks} matched + {lease.new_blocks} new blocks",
                code=grpc.StatusCode.INTERNAL)
        if lease.held and not lease.live:
            # Too late to use (a slow answer): end it now and serve a miss.
            lease.release()
            return Lease(self._core, self.namespace, lease.total_blocks, degraded=True)
        return lease

    # -- lookups and admin (errors raised, never degraded) -----------------------

    def _unary(self, method, request):
        try:
            return method(request, timeout=self.options.call_timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        except ValueError:  # gRPC refuses calls on a closed channel
            raise _closed() from None

    def match(self, tokens):
        """Read-only lookup of the longest cached prefix (no session needed);
        the radixkv.v1.MatchResponse. Raises the error (Unavailable,
        DeadlineExceeded, ...) when the daemon does not answer."""
        request = pb.MatchRequest(namespace=self._core.namespace_pb,
                                  tokens_le=self._prompt_bytes(tokens))
        return self._unary(self._core.kv.Match, request)

    def match_keys(self, keys):
        request = pb.MatchRequest(namespace=self._core.namespace_pb,
                                  block_keys_packed=self._packed_keys(keys))
        return self._unary(self._core.kv.Match, request)

    def explain(self, tokens):
        """Admin.Explain: per block, cached or why not (ExplainResponse)."""
        request = pb.ExplainRequest(namespace=self._core.namespace_pb,
                                    tokens_le=self._prompt_bytes(tokens))
        return self._unary(self._core.admin.Explain, request)

    def stats(self):
        """Admin.GetStats: the daemon's radixkv.v1.Stats."""
        return self._unary(self._core.admin.GetStats, pb.GetStatsRequest()).stats

    def evict(self, pages: int) -> int:
        """Admin.Evict: evicts up to `pages` unpinned LRU blocks; the count."""
        return self._unary(self._core.admin.Evict, pb.EvictRequest(pages=pages)).evicted
