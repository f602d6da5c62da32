"""The connection state behind a radixkv.Client and its Leases (internal).

It owns the gRPC channel and stubs and one background thread, the session
thread, that keeps the KvCache.Session stream open:

  connect: start the stream, send `open`, wait up to connect_timeout for
           SessionInfo; with attach_pool, map the pool (radixkv.pool)
  serve:   publish the session (connected, new generation), send a
           heartbeat every heartbeat_interval, send Release for dropped
           leases no Acquire carried within release_delay, and watch for
           the stream's end or 3 missed heartbeat acks
  end:     unpublish (disconnected), mark the session ended (its leases
           refuse page access), queue its id for acknowledgement, cancel
           the stream, wait with exponential backoff and jitter, connect
           again; the next `open` lists the queued ids in
           acknowledge_sessions and a SessionInfo reply clears them

Connecting: the Session call waits for the channel (wait_for_ready) up to
connect_timeout, and the channel's own connection retries are at most
min(reconnect_max_backoff, 1 s) apart, so a daemon that comes back while an
attempt waits is reached within that interval.

Each stream has a reader thread that iterates the responses, so no
blocking gRPC operation keeps the session thread from enforcing
connect_timeout or from stopping (it cancels the call instead).

Thread safety: thread-safe. `_lock` (reentrant, so a Lease finalized by the
garbage collector on any thread can queue its release) guards all mutable
state; no lock is held across an RPC or an attach.
"""
import atexit
import collections
import dataclasses
import errno
import logging
import os
import queue
import random
import socket
import sys
import threading
import time
import weakref
from typing import List, Optional

import grpc

from radixkv import errors, pb, pb_grpc
from radixkv.errors import Error
from radixkv.keys import BLOCK_KEY_VERSION, NamespaceSpec
from radixkv.pool import Pool, attach

_INFINITY = float("inf")

# OpenSession.acknowledge_sessions holds at most this many ids.
MAX_ACKNOWLEDGE_SESSIONS = 64
# Longest wait between the channel's own connection retries, in seconds.
MAX_CHANNEL_BACKOFF = 1.0

# Cores whose session thread runs. They are stopped at exit, while threads
# still run: stopping one during interpreter finalization would wait for
# gRPC threads that no longer get to run.
_live = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for core in list(_live):
        core.stop()


_log = logging.getLogger("radixkv")


def connect_problem(target: str, system_dir: str = "/run/radixkv") -> str:
    """Why a Unix-socket target cannot be reached, in words, or "" when a
    connect() to it works (and for other targets): "cannot connect to
    unix:PATH: <the OS error>", adding that <system_dir> exists but cannot be
    entered when that is why the system daemon's socket was not used."""
    if not target.startswith("unix:"):
        return ""
    path = target[len("unix:"):]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return ""
    except OSError as e:
        problem = e.strerror or os.strerror(e.errno or errno.EIO)
    finally:
        sock.close()
    out = f"cannot connect to {target}: {problem}"
    if (path != system_dir + "/radixkvd.sock" and os.path.isdir(system_dir)
            and not os.access(system_dir, os.X_OK)):
        out += (f"; the system daemon's directory {system_dir} exists but this "
                f"user (uid {os.getuid()}) cannot enter it, so its socket was "
                "not found: join the directory's group (e.g. radixkv) or give "
                "the endpoint")
    return out


@dataclasses.dataclass(frozen=True)
class Options:
    """Client options, validated by radixkv.Client. Durations in seconds."""
    target: str
    namespace: NamespaceSpec
    client_name: str
    device: int
    attach_pool: bool
    call_timeout: float
    connect_timeout: float
    heartbeat_interval: float
    reconnect_initial_backoff: float
    reconnect_max_backoff: float
    reconnect_jitter: float
    release_delay: float
    release_timeout: float
    max_receive_message_bytes: int = 64 << 20


class SessionLife:
    """Shared by a session and its Leases: `ended` turns True once (stream
    ended, the daemon no longer knows the session, or the client closed),
    before the session's id is queued for acknowledgement.

    `writers` counts the leases with a view of a new page handed out since
    their last commit or release (or end): both change under `lock`, so a
    lease either sees the end and gets no view, or counts itself first; the
    session's id is acknowledged to the daemon only while `writers` is 0
    after the end, so no write of an acknowledged session is still running
    when the daemon reuses its fenced pages."""
    __slots__ = ("ended", "writers", "lock")

    def __init__(self):
        self.ended = False
        self.writers = 0
        self.lock = threading.Lock()

    def end(self) -> None:
        with self.lock:
            self.ended = True

    def begin_write(self) -> bool:
        """Counts one more writer; False (nothing counted) once ended."""
        with self.lock:
            if self.ended:
                return False
            self.writers += 1
            return True

    def end_write(self) -> None:
        with self.lock:
            self.writers -= 1

    def quiet(self) -> bool:
        """No write running (after the end: it may be acknowledged)."""
        with self.lock:
            return self.writers == 0


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A consistent view of the current session, taken under the lock."""
    usable: bool
    session_id: str
    generation: int
    pool: Optional[Pool]
    life: Optional[SessionLife] = None  # None when not usable
    lease_ttl: float = 0.0              # SessionInfo.lease_ttl_ms in s; 0: unknown


@dataclasses.dataclass(frozen=True)
class ClientState:
    """Connection state, for health reporting and tests."""
    connected: bool            # a session is open (and the pool mapped, if asked)
    session_id: str
    generation: int            # increments with every session (re-)open
    reconnects: int            # sessions opened after the first
    pool: Optional[object]     # radixkv.v1.PoolInfo of the current/last session
    last_error: Optional[Error]  # why the last open attempt or stream failed
    namespace_id: bytes        # SessionInfo.namespace_id of the current/last session
    # Ended sessions the next OpenSession acknowledges, oldest first.
    unacknowledged_sessions: tuple = ()


def channel_options(o: Options):
    """The channel arguments of the C++ client (radixkv::ClientChannelArguments
    plus its reconnect and keepalive settings)."""
    def ms(seconds):
        return max(1, int(seconds * 1000))
    # The session backoff decides when to reconnect; the channel retries the
    # connection only while a session attempt waits for it (wait_for_ready),
    # at most MAX_CHANNEL_BACKOFF apart.
    channel_max = min(o.reconnect_max_backoff, MAX_CHANNEL_BACKOFF)
    return [
        ("grpc.enable_retries", 0),
        ("grpc.minimal_stack", 1),
        ("grpc.enable_deadline_checking", 1),
        ("grpc.max_receive_message_length", o.max_receive_message_bytes),
        ("grpc.initial_reconnect_backoff_ms",
         ms(min(o.reconnect_initial_backoff, channel_max))),
        ("grpc.max_reconnect_backoff_ms", ms(channel_max)),
        # gRPC reads this one as the minimum time one connection attempt may take.
        ("grpc.min_reconnect_backoff_ms", ms(o.connect_timeout)),
        ("grpc.keepalive_time_ms", 20000),
        ("grpc.keepalive_timeout_ms", 10000),
        # Each client its own connection: one Client's calls never queue
        # behind another's in the same process.
        ("grpc.use_local_subchannel_pool", 1),
    ]


class Core:
    """See the module docstring."""

    def __init__(self, options: Options):
        self.options = options
        self.channel = grpc.insecure_channel(options.target,
                                             options=channel_options(options))
        self.kv = pb_grpc.KvCacheStub(self.channel)
        self.admin = pb_grpc.AdminStub(self.channel)
        self.namespace_pb = options.namespace.to_proto()
        self._rng = random.Random()
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._loop, name="radixkv-session",
                                        daemon=True)
        # Guarded by _lock.
        self._stopping = False
        self._connected = False
        self._session_id = ""
        self._generation = 0
        self._reconnects = 0
        self._pool_info = None
        self._namespace_id = b""
        self._pool: Optional[Pool] = None
        self._lease_ttl = 0.0
        self._life: Optional[SessionLife] = None   # of the open session
        # Ended sessions not yet acknowledged by an OpenSession, oldest first.
        self._unacknowledged = collections.deque(maxlen=MAX_ACKNOWLEDGE_SESSIONS)
        # Known before the first attempt ends, so that a caller who stops
        # waiting early learns why.
        self._last_error: Optional[Error] = errors.Unavailable(
            connect_problem(options.target) or "session not opened yet")
        self._warned = False  # the first degrade is logged once
        self._call = None          # the live Session call, for cancellation
        self._stream_opened = False
        self._stream_ended = False
        self._stream_error: Optional[Error] = None
        self._stream_info = None
        self._last_ack = 0.0
        self._deferred = collections.deque()   # (lease_id, since), oldest first
        # Held leases of the open session not queued in _deferred.
        self._live_leases = set()
        self._release_now = False
        self._serve_wake_at = _INFINITY
        self._serve_wakeup = False
        # The session thread ticks every release_delay until then (releases
        # are flowing), so queuing one rarely needs to wake it.
        self._ticking_until = 0.0

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        _live.add(self)
        self._thread.start()

    def stop(self) -> None:
        """Releases every lease still held or queued, closes the session and
        joins the session thread; idempotent. A no-op during interpreter finalization
        (the exit hook stopped every core before)."""
        if sys.is_finalizing():
            return
        _live.discard(self)
        with self._lock:
            self._stopping = True
            # A serving session thread first releases the queued leases (a
            # session that ends with leases open has their pages fenced),
            # then cancels the call.
            call = None if self._connected else self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        self.channel.close()

    # -- queries -------------------------------------------------------------

    def current(self) -> Snapshot:
        with self._lock:
            return Snapshot(self._connected, self._session_id, self._generation,
                            self._pool, self._life if self._connected else None,
                            self._lease_ttl)

    def stopped(self) -> bool:
        """Whether stop() was called (the client is closed or closing)."""
        with self._lock:
            return self._stopping

    def is_current(self, generation: int) -> bool:
        with self._lock:
            return self._connected and self._generation == generation

    def state(self) -> ClientState:
        with self._lock:
            return ClientState(self._connected, self._session_id, self._generation,
                               self._reconnects, self._pool_info, self._last_error,
                               self._namespace_id,
                               tuple(u[0] for u in self._unacknowledged))

    def wait_for_session(self, timeout: float) -> bool:
        with self._lock:
            return self._cond.wait_for(lambda: self._connected or self._stopping,
                                       timeout) and self._connected

    def wait_for_open_or_refusal(self, timeout: float) -> Optional[Error]:
        """Waits up to `timeout` for a session, or for the daemon to refuse
        this client's `open` as the caller's mistake (a namespace it does not
        accept). Returns that refusal, else None."""
        def refused():
            return (self._last_error is not None and
                    errors.is_caller_error(self._last_error))
        with self._lock:
            self._cond.wait_for(
                lambda: self._connected or self._stopping or refused(), timeout)
            return None if self._connected or not refused() else self._last_error

    def report_session_lost(self, generation: int) -> None:
        """The daemon no longer knows session `generation`: drop the stream
        so that the session thread opens a new one."""
        with self._lock:
            if not (self._connected and self._generation == generation):
                return
            self._last_error = errors.NotFound(
                "the daemon no longer knows the session",
                field="session_id", reason=errors.REASON_SESSION_NOT_FOUND)
            # Its leases refuse page access from now on; the session thread
            # queues the id for acknowledgement when it ends the stream.
            if self._life is not None:
                self._life.end()
            call = self._call
        if call is not None:
            call.cancel()

    # -- held leases, ended when the client closes -----------------------------

    def track_lease(self, generation: int, lease_id: int) -> None:
        with self._lock:
            if self._connected and self._generation == generation:
                self._live_leases.add(lease_id)

    def untrack_lease(self, generation: int, lease_id: int) -> None:
        with self._lock:
            if self._connected and self._generation == generation:
                self._live_leases.discard(lease_id)

    # -- deferred releases (release_delay) -------------------------------------

    def defer_release(self, generation: int, lease_id: int) -> None:
        """Queues lease `lease_id` of session `generation` to ride on the
        next Acquire; dropped when that session is no longer open."""
        with self._lock:
            if not (self._connected and self._generation == generation):
                return  # the daemon ended it with the session
            now = time.monotonic()
            self._deferred.append((lease_id, now))
            self._ticking_until = now + 1.0
            if self._serve_wake_at > now + self.options.release_delay:
                self._serve_wakeup = True
                self._cond.notify_all()

    def take_deferred(self, generation: int, most: int) -> List[int]:
        """Up to `most` queued ids of session `generation`, oldest first,
        for an Acquire to carry in release_leases."""
        with self._lock:
            if not self._deferred or not (self._connected and
                                          self._generation == generation):
                return []
            ids = []
            while self._deferred and len(ids) < most:
                ids.append(self._deferred.popleft()[0])
            return ids

    def requeue_deferred(self, generation: int, ids: List[int],
                         release_now: bool) -> None:
        """Puts back ids an Acquire took but the daemon did not release;
        with release_now the session thread sends them as Release calls."""
        if not ids:
            return
        with self._lock:
            if not (self._connected and self._generation == generation):
                return
            now = time.monotonic()
            self._deferred.extendleft((i, now) for i in reversed(ids))
            if release_now:
                self._release_now = True
            self._serve_wakeup = True
            self._cond.notify_all()

    def _take_due_releases(self, now: float) -> List[int]:
        ids = []
        while self._deferred and (
                self._release_now or
                self._deferred[0][1] + self.options.release_delay <= now):
            ids.append(self._deferred.popleft()[0])
        self._release_now = False
        return ids

    def _send_releases(self, session_id: str, ids: List[int]) -> None:
        """Release calls from the session thread; stops at the first that
        does not reach the daemon (the rest end with the session or at their
        TTL). Also used when the client closes, before the stream ends, so
        that the daemon does not fence the queued leases' pages."""
        for lease_id in ids:
            try:
                self.kv.Release(pb.ReleaseRequest(session_id=session_id,
                                                  lease_id=lease_id),
                                timeout=self.options.release_timeout)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    return
            except ValueError:  # the channel was closed
                return

    # -- the session thread ----------------------------------------------------

    def _loop(self) -> None:
        o = self.options
        backoff = o.reconnect_initial_backoff
        while True:
            with self._lock:
                if self._stopping:
                    return
                generation_before = self._generation
            why = self._run_session()
            if why.code in (grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED):
                problem = connect_problem(o.target)
                if problem:
                    why = errors.Unavailable(f"{problem} ({why.message})")
            with self._lock:
                if self._stopping:
                    return
                self._last_error = why
                warn = not self._warned
                self._warned = True
                self._cond.notify_all()
                opened = self._generation != generation_before
            if warn:
                _log.warning("radixkv: no session with the daemon, serving "
                             "every lookup as a miss until it is back: %s", why)
            if opened:
                backoff = o.reconnect_initial_backoff  # it worked for a while
            jitter = min(max(o.reconnect_jitter, 0.0), 1.0)
            wait = backoff * self._rng.uniform(1.0 - jitter, 1.0 + jitter)
            backoff = min(backoff * 2, o.reconnect_max_backoff)
            with self._lock:
                self._cond.wait_for(lambda: self._stopping, wait)

    def _read_loop(self, call) -> None:
        error = None
        try:
            for response in call:
                with self._lock:
                    self._last_ack = time.monotonic()
                    if response.HasField("heartbeat"):
                        # The daemon took what that heartbeat acknowledged.
                        nonce = response.heartbeat.nonce
                        kept = [u for u in self._unacknowledged
                                if not 0 < u[2] <= nonce]
                        self._unacknowledged.clear()
                        self._unacknowledged.extend(kept)
                    if response.HasField("session") and not self._stream_opened:
                        self._stream_info = response.session
                        self._stream_opened = True
                        self._cond.notify_all()
        except grpc.RpcError as e:
            error = errors.from_rpc_error(e)
        with self._lock:
            self._stream_ended = True
            self._stream_error = error
            self._cond.notify_all()

    def _open_request(self):
        """The `open` request, acknowledging the queued lost sessions (lock
        held)."""
        o = self.options
        return pb.SessionRequest(open=pb.OpenSession(
            namespace=self.namespace_pb, device=o.device,
            client_name=o.client_name, block_key_version=BLOCK_KEY_VERSION,
            acknowledge_sessions=[u[0] for u in self._unacknowledged
                                  if u[1] is None or u[1].quiet()]))

    def _end_published(self) -> None:
        """Ends the published session (lock held): first stops its leases'
        page access, then, unless the client is closing, queues its id for
        the next open to acknowledge (the oldest dropped beyond
        MAX_ACKNOWLEDGE_SESSIONS)."""
        life = self._life
        if life is not None:
            life.end()
        self._life = None
        if (not self._stopping and self._session_id and
                all(u[0] != self._session_id for u in self._unacknowledged)):
            # [id, life, nonce of the heartbeat that carried it (0: none)]
            self._unacknowledged.append([self._session_id, life, 0])

    def _run_session(self) -> Error:
        """One stream's life: connect, serve, end. Returns why it ended."""
        outbox = queue.SimpleQueue()
        with self._lock:
            if self._stopping:
                return errors.Unavailable("client closing", code=grpc.StatusCode.CANCELLED)
            self._stream_opened = False
            self._stream_ended = False
            self._stream_error = None
            self._stream_info = None
            open_request = self._open_request()
        outbox.put(open_request)
        # Waits for the connection (until _await_open gives up and cancels)
        # instead of failing while the channel backs off.
        call = self.kv.Session(iter(outbox.get, None), wait_for_ready=True)
        with self._lock:
            self._call = call
            stopping = self._stopping
        if stopping:
            call.cancel()
        reader = threading.Thread(target=self._read_loop, args=(call,),
                                  name="radixkv-session-reader", daemon=True)
        reader.start()

        def finish(why: Error) -> Error:
            with self._lock:
                if self._connected:
                    self._end_published()
                self._connected = False
                self._pool = None
                self._deferred.clear()  # the daemon ends the session's leases
                self._live_leases.clear()
                self._release_now = False
            outbox.put(None)  # lets gRPC's request-sending thread finish
            call.cancel()
            reader.join()
            with self._lock:
                self._call = None
                # The daemon's own status explains more than our cancellation.
                final = self._stream_error
            if final is not None and final.code != grpc.StatusCode.CANCELLED:
                return final
            return why

        info, error = self._await_open()
        if error is not None:
            return finish(error)
        with self._lock:
            # The daemon has taken the acknowledgements with the open.
            sent = set(open_request.open.acknowledge_sessions)
            kept = [u for u in self._unacknowledged if u[0] not in sent]
            self._unacknowledged.clear()
            self._unacknowledged.extend(kept)
        pool = None
        if (self.options.attach_pool and info.pool.backend != "none" and
                info.pool.attach_socket):
            try:
                pool = attach(info.pool.attach_socket, info.session_id,
                              self.options.connect_timeout)
            except errors.AttachError as e:
                return finish(errors.AttachError(f"attach pool: {e.message}",
                                                 code=e.code))
        with self._lock:
            if self._generation > 0:
                self._reconnects += 1
            self._generation += 1
            self._session_id = info.session_id
            self._pool_info = info.pool
            self._namespace_id = info.namespace_id
            self._pool = pool
            self._lease_ttl = info.lease_ttl_ms / 1000.0
            self._life = SessionLife()
            self._connected = True
            self._last_error = None
            self._last_ack = time.monotonic()
            self._cond.notify_all()
        return finish(self._serve(info.session_id, outbox))

    def _await_open(self):
        """(SessionInfo, None) once the daemon answered `open`, else
        (None, why not)."""
        with self._lock:
            self._cond.wait_for(
                lambda: self._stopping or self._stream_opened or self._stream_ended,
                self.options.connect_timeout)
            if self._stopping:
                return None, errors.Unavailable("client closing",
                                                code=grpc.StatusCode.CANCELLED)
            if self._stream_opened:
                return self._stream_info, None
            if self._stream_ended:
                return None, errors.Unavailable("session stream ended before open")
            return None, errors.DeadlineExceeded(
                f"no session reply within {self.options.connect_timeout} s")

    def _serve_wait(self, next_heartbeat: float) -> None:
        """Sleeps (lock held) until the next heartbeat, a due release, or
        something that needs the session thread."""
        now = time.monotonic()
        wake = next_heartbeat
        if self._release_now:
            wake = now
        elif self._deferred:
            wake = min(wake, self._deferred[0][1] + self.options.release_delay)
        elif now < self._ticking_until:
            wake = min(wake, now + self.options.release_delay)
        self._serve_wake_at = wake
        while not (self._stopping or self._stream_ended or self._serve_wakeup):
            left = wake - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        self._serve_wakeup = False
        self._serve_wake_at = _INFINITY

    def _serve(self, session_id: str, outbox: queue.SimpleQueue) -> Error:
        """Heartbeats and due releases until the stream ends, acks stop, or
        the client stops. Returns why serving ended."""
        interval = self.options.heartbeat_interval
        nonce = 0
        next_heartbeat = time.monotonic() + interval
        while True:
            with self._lock:
                self._serve_wait(next_heartbeat)
                woke = time.monotonic()
                stopping, ended = self._stopping, self._stream_ended
                if stopping and not ended:
                    # No lease of this session writes from now on; all end.
                    if self._life is not None:
                        self._life.end()
                    releases = self._take_due_releases(_INFINITY)
                    releases.extend(self._live_leases)
                    self._live_leases.clear()
            if stopping:
                if not ended and releases:
                    # Closing: the queued leases end now, not fenced with
                    # the session.
                    self._send_releases(session_id, releases)
                return errors.Unavailable("client closing",
                                          code=grpc.StatusCode.CANCELLED)
            if ended:
                return errors.Unavailable("session stream ended")
            with self._lock:
                if woke - self._last_ack > 3 * interval:
                    return errors.DeadlineExceeded(
                        "session heartbeat not acknowledged for 3 intervals")
                releases = self._take_due_releases(woke)
                heartbeat_due = woke >= next_heartbeat
            if releases:
                self._send_releases(session_id, releases)
            if heartbeat_due:
                next_heartbeat = time.monotonic() + interval
                nonce += 1
                with self._lock:
                    # Lost sessions whose writes ended after this stream's
                    # open go out with a heartbeat; its ack clears them.
                    acks = []
                    for u in self._unacknowledged:
                        if u[2] == 0 and (u[1] is None or u[1].quiet()):
                            u[2] = nonce
                            acks.append(u[0])
                outbox.put(pb.SessionRequest(heartbeat=pb.Heartbeat(
                    nonce=nonce, acknowledge_sessions=acks)))
